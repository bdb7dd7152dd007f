/* sink.c - the sink stage (sink.h): the sink thread takes what the
 * executors and the intake finished, produces each job's record (the
 * result, or the original record as a dead letter) and writes the
 * batch's results to Redis in one pipelined round trip; the producer's
 * delivery reports and Redis's answers are the two acknowledgements, and
 * a job with both goes to the done queue.
 *
 * Threads: the sink thread owns the retry and stranded lists and the Redis
 * writer; the delivery report callback runs on it too (rd_kafka_poll), or
 * on the lifecycle's thread in sink_flush once the sink thread has
 * stopped, never on both at once. Ownership: a job in flight is the
 * producer's opaque until its report; the sink keeps nothing else. */
#include "sink.h"

#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "../batching/batcher.h"
#include "../kafka/kq.h"
#include "../base/log.h"
#include "rsink.h"

struct sink {
    struct kq_ctx kq;            /* first: the producer's opaque (kq.h) */
    struct sink_conf c;
    rd_kafka_t *producer;
    struct rsink *rsink;
    size_t max_record_bytes;
    struct job *retry;           /* deliveries to try again */
    int64_t retry_at_us;
    struct job *stranded;        /* Redis gave up at stop: freed after the producer,
                                    which may still hold them */
    pthread_t thr;
    int started;
    atomic_int stop;
    int kafka_failing;           /* the last delivery failed (sink thread, or the
                                    lifecycle's thread after it stopped) */
};

/* Tells the stats whether deliveries to Kafka fail, on a change only:
 * readiness then reflects a sink that cannot deliver, with the error. */
static void kafka_state(struct sink *s, rd_kafka_resp_err_t err)
{
    if (!err && !s->kafka_failing) return;
    s->kafka_failing = err != 0;
    stats_sink_failing(s->c.stats, STATS_SINK_KAFKA, err ? rd_kafka_err2str(err) : NULL);
}

/* One acknowledgement arrived; the last one makes the job done. */
static void ack(struct sink *s, struct job *j)
{
    if (--j->acks_pending == 0) {
        j->next = NULL;
        job_report(j, s->c.stats, clock_wall_ms());
        jobq_push(s->c.done, j);
    }
}

/* The records a job publishes (job.h, `owed`): a result to the reply
 * topic, the original record to the dead-letter topic, or both for a
 * record that is no job but whose key names one (docs/protocol.md,
 * "Records that are not jobs"). */
enum { REC_REPLY = 1, REC_DLQ = 2 };

static unsigned records_of(const struct job *j)
{
    return j->kind == JOB_RESULT ? REC_REPLY : j->body ? REC_REPLY | REC_DLQ : REC_DLQ;
}

/* Puts j on the retry list once, however many of its records failed. */
static void retry_later(struct sink *s, struct job *j)
{
    if (j->on_retry) return;
    j->on_retry = 1;
    j->next = s->retry;
    s->retry = j;
}

/* Delivery report, served by rd_kafka_poll on the sink thread (or by the
 * final flush after the sink thread has stopped). */
static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    struct sink *s = opaque;
    struct job *j = m->_private;
    if (j->stranded) return; /* owned by the stranded list now */
    unsigned rec = REC_REPLY;
    if ((j->owed & REC_DLQ) &&
        (!(j->owed & REC_REPLY) ||
         strcmp(rd_kafka_topic_name(m->rkt), s->c.cfg->kafka.dlq_topic) == 0))
        rec = REC_DLQ;
    j->sent &= ~rec;
    kafka_state(s, m->err);
    if (m->err) {
        stats_produce_error(s->c.stats);
        LOG_W("produce_failed", "id=%s error=\"%s\" attempt=%d", j->req.id,
              rd_kafka_err2str(m->err), j->produce_attempts);
        retry_later(s, j);
        return;
    }
    j->owed &= ~rec;
    ack(s, j);
}

/* Produces one record of a job: its result to the reply topic, or the
 * original record to the dead-letter topic. The job's bytes stay alive
 * until its delivery report, so nothing is copied. */
static rd_kafka_resp_err_t produce_one(struct sink *s, struct job *j, unsigned rec)
{
    if (rec == REC_REPLY) {
        const char *ct = codec_content_type(j->req.enc);
        return rd_kafka_producev(
            s->producer, RD_KAFKA_V_TOPIC(s->c.reply_topic),
            RD_KAFKA_V_KEY(j->req.id, strlen(j->req.id)),
            RD_KAFKA_V_VALUE(j->body, j->body_len),
            RD_KAFKA_V_HEADER("content-type", ct, (ssize_t)strlen(ct)),
            RD_KAFKA_V_OPAQUE(j), RD_KAFKA_V_END);
    }
    char part[16], off[24];
    snprintf(part, sizeof(part), "%" PRId32, j->partition);
    snprintf(off, sizeof(off), "%" PRId64, j->offset);
    rd_kafka_headers_t *h = rd_kafka_headers_new(5);
    rd_kafka_header_add(h, "x-error-code", -1, proto_err_name(j->err), -1);
    rd_kafka_header_add(h, "x-error", -1, j->errmsg, -1);
    rd_kafka_header_add(h, "x-source-topic", -1, j->topic, -1);
    rd_kafka_header_add(h, "x-source-partition", -1, part, -1);
    rd_kafka_header_add(h, "x-source-offset", -1, off, -1);
    if (j->truncated_from) {
        char orig[24];
        snprintf(orig, sizeof(orig), "%zu", j->truncated_from);
        rd_kafka_header_add(h, "x-truncated-from", -1, orig, -1);
    }
    rd_kafka_resp_err_t err = rd_kafka_producev(
        s->producer, RD_KAFKA_V_TOPIC(s->c.cfg->kafka.dlq_topic),
        RD_KAFKA_V_KEY(j->raw_key, j->raw_key_len),
        RD_KAFKA_V_VALUE(j->raw_value, j->raw_value_len), RD_KAFKA_V_HEADERS(h),
        RD_KAFKA_V_OPAQUE(j), RD_KAFKA_V_END);
    if (err) rd_kafka_headers_destroy(h); /* not taken on failure */
    return err;
}

/* Produces every record of j still owed and not yet in the producer's
 * hands, serving delivery reports while librdkafka's queue is full; on a
 * hard error the job goes to the retry list, and only what failed is
 * produced again. j may be complete (and gone) once this returns. */
static void produce_or_retry(struct sink *s, struct job *j)
{
    j->produce_attempts++;
    unsigned todo = j->owed & ~j->sent;
    const unsigned order[] = {REC_DLQ, REC_REPLY};
    for (size_t i = 0; i < 2; i++) {
        unsigned rec = order[i];
        if (!(todo & rec)) continue;
        for (;;) {
            rd_kafka_resp_err_t err = produce_one(s, j, rec);
            if (!err) {
                j->sent |= rec;
                break;
            }
            if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && !atomic_load(&s->stop)) {
                rd_kafka_poll(s->producer, 10);
                continue;
            }
            stats_produce_error(s->c.stats);
            kafka_state(s, err);
            LOG_W("produce_failed", "id=%s error=\"%s\"", j->req.id, rd_kafka_err2str(err));
            retry_later(s, j);
            break;
        }
    }
}

/* rsink's hook while it retries Redis: the sink thread is waiting on an
 * outage, not hung (an outage shows on /readyz, not /healthz). */
static void sink_alive(void *ctx)
{
    struct sink *s = ctx;
    stats_alive(s->c.stats, STATS_LOOP_SINK);
}

/* rsink's hook when a write fails (why) or succeeds again (NULL). */
static void redis_state(void *ctx, const char *why)
{
    struct sink *s = ctx;
    stats_sink_failing(s->c.stats, STATS_SINK_REDIS, why);
}

/* One round: take everything queued, produce each record, write the
 * results to Redis in one round trip, acknowledge, serve delivery reports
 * and retry failed deliveries after a pause. */
static void *sink_main(void *arg)
{
    struct sink *s = arg;
    size_t cap = 0;
    struct job **results = NULL;
    while (!atomic_load(&s->stop)) {
        stats_alive(s->c.stats, STATS_LOOP_SINK);
        /* While deliveries are owed, their reports are served every
         * millisecond rather than after a 5 ms wait for new jobs: a job is
         * finished (and its rows free for the intake) only once its report
         * is in, which matters most when few jobs may be in flight. */
        struct job *list = jobq_take(s->c.in, rd_kafka_outq_len(s->producer) > 0 ? 1 : 5);
        size_t n = 0;
        for (struct job *j = list; j; j = j->next) n++;
        if (n > cap) {
            struct job **r = realloc(results, n * sizeof(*r));
            if (!r) {
                LOG_E("out_of_memory", "where=sink");
                atomic_store(s->c.fatal, 1);
                jobq_push(s->c.in, list);
                break;
            }
            results = r;
            cap = n;
        }
        size_t nr = 0;
        unsigned batch_ends = 0;
        for (struct job *j = list, *next; j; j = next) {
            next = j->next;
            j->next = NULL;
            j->owed = records_of(j);
            j->sent = 0;
            j->on_retry = 0;
            int to_redis = (j->owed & REC_REPLY) && s->c.redis != WORKER_REDIS_OFF;
            j->acks_pending = to_redis + (j->owed & REC_REPLY ? 1 : 0) +
                              (j->owed & REC_DLQ ? 1 : 0);
            if (to_redis) results[nr++] = j;
            batch_ends += (unsigned)j->batch_last;
            produce_or_retry(s, j); /* may complete j: not touched after */
        }
        /* One pipelined round trip for the whole batch. */
        int rrc = nr ? rsink_set_batch(s->rsink, results, nr, &s->stop) : 0;
        if (rrc == -2) {
            LOG_E("out_of_memory", "where=redis_sink");
            atomic_store(s->c.fatal, 1);
        }
        /* The batches are written out (delivery reports may still be on
         * their way): their in-flight slots free up. */
        jobq_written(s->c.in, batch_ends);
        if (nr && rrc == 0) {
            for (size_t i = 0; i < nr; i++) ack(s, results[i]);
        } else if (nr) {
            /* Stopping with Redis unreachable: these stay uncommitted. The
             * delivery report may still arrive, so the job stays alive
             * until the producer is gone and is never counted done. */
            for (size_t i = 0; i < nr; i++) {
                results[i]->stranded = 1;
                results[i]->stranded_next = s->stranded;
                s->stranded = results[i];
            }
        }
        rd_kafka_poll(s->producer, 0);
        /* Deliveries that failed (after librdkafka's own retries) go again
         * after a pause: their offsets stay uncommitted meanwhile. */
        int64_t now = clock_mono_us();
        if (s->retry && now >= s->retry_at_us) {
            struct job *r = s->retry;
            s->retry = NULL;
            s->retry_at_us = now + 500000;
            while (r) {
                struct job *next = r->next;
                r->on_retry = 0;
                produce_or_retry(s, r);
                r = next;
            }
        }
    }
    stats_loop_stop(s->c.stats, STATS_LOOP_SINK);
    free(results);
    return NULL;
}

/* What the producer refuses can never be published: results and dead
 * letters are kept below its message.max.bytes, less room for key,
 * headers and framing. */
static size_t max_record_bytes(rd_kafka_t *producer)
{
    char mmb[32];
    size_t mmb_len = sizeof(mmb), max = 1000000;
    if (rd_kafka_conf_get(rd_kafka_conf(producer), "message.max.bytes", mmb, &mmb_len) ==
        RD_KAFKA_CONF_OK)
        max = (size_t)strtoull(mmb, NULL, 10);
    return max > 8192 ? max - 4096 : 4096;
}

struct sink *sink_new(const struct sink_conf *c, char *errstr, size_t errstr_size)
{
    struct sink *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    s->c = *c;
    s->kq.stats = c->stats;
    s->kq.fatal = c->fatal;
    const struct kcfg *k = c->cfg;
    struct rsink_conf rc = {.host = k->redis.host, .port = k->redis.port,
                            .password = k->redis.password, .db = k->redis.db,
                            .key_prefix = k->redis.key_prefix, .ttl_ms = k->redis.ttl_ms,
                            .timeout_ms = k->redis.timeout_ms,
                            .publish_channel = k->redis.publish_channel,
                            .if_absent = c->redis == WORKER_REDIS_IF_ABSENT,
                            .alive = sink_alive, .failing = redis_state, .alive_ctx = s,
                            .attempt_prefix = k->worker.max_attempts > 0
                                                  ? k->worker.attempt_prefix : NULL};
    if (!(s->rsink = rsink_new(&rc))) {
        snprintf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    struct kq_hooks h = {.opaque = s, .dr_msg_cb = dr_cb};
    if (!(s->producer = kq_client_new(k, KQ_PRODUCER, &h, errstr, errstr_size))) goto fail;
    s->max_record_bytes = max_record_bytes(s->producer);
    return s;
fail:
    sink_destroy(s);
    return NULL;
}

size_t sink_max_record_bytes(const struct sink *s)
{
    return s->max_record_bytes;
}

int sink_redis_ping(struct sink *s)
{
    return rsink_ping(s->rsink);
}

/* Cluster metadata (its controller's id) comes only from a broker's
 * answer, so once the producer holds it, it has reached one: known within
 * milliseconds of start, where its first statistics take
 * statistics.interval.ms. */
int sink_broker_reached(struct sink *s)
{
    return rd_kafka_controllerid(s->producer, 0) >= 0;
}

uint64_t sink_redis_errors(const struct sink *s)
{
    return rsink_errors(s->rsink);
}

int sink_start(struct sink *s)
{
    if (pthread_create(&s->thr, NULL, sink_main, s) != 0) return -1;
    s->started = 1;
    return 0;
}

void sink_cut(struct sink *s)
{
    rsink_cancel(s->rsink);
}

void sink_stop(struct sink *s)
{
    atomic_store(&s->stop, 1);
    if (s->started) pthread_join(s->thr, NULL);
    s->started = 0;
    jobq_close(s->c.in);
}

void sink_flush(struct sink *s, int timeout_ms)
{
    rd_kafka_flush(s->producer, timeout_ms);
}

/* Purged deliveries land on the retry list; a stranded job may be on it
 * too, so it is freed once, from the stranded list. */
void sink_destroy(struct sink *s)
{
    if (!s) return;
    if (s->started) sink_stop(s);
    if (s->producer) {
        rd_kafka_purge(s->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(s->producer, 0);
        rd_kafka_destroy(s->producer);
    }
    for (struct job *j = s->retry, *next; j; j = next) {
        next = j->next;
        if (!j->stranded) job_free(j);
    }
    for (struct job *j = s->stranded, *next; j; j = next) {
        next = j->stranded_next;
        job_free(j);
    }
    rsink_destroy(s->rsink);
    free(s);
}

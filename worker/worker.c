/* worker.c - the pipeline that moves a job from Kafka to its results.
 *
 *   poll thread (worker_run's caller)       executor thread       sink thread
 *   rd_kafka_consumer_poll -> decode  --->  batcher_next     ---> produce reply/DLQ
 *     early errors / DLQ ------------------------------------->  pipelined Redis SET
 *   offsets: contiguous watermark   <------------------------  done (both acks)
 *
 * Ownership of a job moves poll thread -> batcher -> executor -> sink ->
 * done queue -> poll thread, which stores its offset and frees it. Only the
 * poll thread touches the consumer and the offset tracker, so the rebalance
 * callback (which runs inside rd_kafka_consumer_poll) sees a consistent
 * view. The poll thread never waits on the model or the sinks: overload
 * pauses the assigned partitions while polling continues (docs/reliability.md,
 * rule 4); what it has taken in is bounded by batching.max_queued_rows.
 *
 * Threads: as above. Cross-thread hand-offs are the batcher (locked), the
 * sink queue and the done queue (each a mutex-protected list). */
#include "worker.h"

#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../batching/batcher.h"
#include "../batching/flow.h"
#include "../codecs/codec.h"
#include "../gpu/model.h"
#include "kq.h"
#include "log.h"
#include "offtrack.h"
#include "rsink.h"
#include "../telemetry/heartbeat.h"
#include "../telemetry/metrics.h"
#include "../telemetry/stats.h"

/* A mutex-protected FIFO of jobs linked through ->next. */
struct jq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *head, *tail;
};

/* Assign mode: a range's state, poll thread only. */
struct range_state {
    int64_t done;        /* jobs finished in range */
    int reached_end;     /* consumed (or positioned) up to range end */
};

struct worker {
    const struct kcfg *cfg;
    struct worker_opts opts;      /* zeroed: the plain worker */
    const char *reply_topic;
    int model_override;           /* model index for every job, -1 = none */
    struct range_state *rs;       /* per opts.ranges */
    int64_t *range_done;          /* per opts.ranges: the progress callback's copy */
    double tokens;                /* rate cap: jobs that may be taken now */
    int64_t tokens_at_us;
    volatile sig_atomic_t *stop;
    rd_kafka_t *consumer, *producer;
    struct model_runtime *rt;
    struct model **models;
    size_t n_models;
    int default_model;
    struct batcher *batcher;
    struct offtrack *ot;
    struct rsink *rsink;
    struct codec_limits lim;
    size_t max_job_rows;
    size_t max_record_bytes; /* largest record the producer can publish, less framing */
    size_t row_bytes;        /* bytes of one input row of the widest model */

    struct jq sinkq; /* executor/poll thread -> sink thread */
    struct jq doneq; /* sink thread -> poll thread */
    struct job *retry; /* sink thread only: deliveries to try again */
    struct job *stranded; /* sink thread only: Redis gave up at stop; freed
                             after the producer, which may still hold them */
    int64_t retry_at_us;

    pthread_t *exec_thr, sink_thr;
    size_t n_exec;
    atomic_int inflight_batches; /* taken by an executor, not yet written out */
    atomic_uint_fast64_t pushed_batches, written_batches; /* executor -> sink, monotonic */
    atomic_int exec_stop, sink_stop;
    atomic_int fatal;  /* a thread hit an error the process must exit on */

    /* Poll thread only. */
    size_t inflight_rows; /* taken from Kafka, not yet done */
    int64_t last_deadline_us; /* deadline of the job take_record just queued */
    int paused;
    int paused_partitions;
    int draining;
    int pipeline_stopped; /* executors and sink joined: nothing more completes */

    struct stats *stats;     /* any thread; outlives the clients (stats_cb) */
    struct metrics *metrics; /* HTTP endpoints; NULL in assign mode */
    struct hb *hb;           /* Redis heartbeat; NULL in assign mode */
    atomic_int exec_ids;     /* hands each executor its watchdog slot */
    int n_assigned;          /* poll thread: partitions assigned */

    /* Counters for the stats line (and the metrics endpoint later). */
    atomic_uint_fast64_t n_consumed, n_ok, n_failed, n_dead, n_batches,
        n_batch_rows, n_produce_errors;
};

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ---- job queues ------------------------------------------------------ */

static void jq_init(struct jq *q)
{
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->head = q->tail = NULL;
}

static void jq_fini(struct jq *q)
{
    job_free_list(q->head);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

/* Appends a list (linked through ->next) and wakes the consumer. */
static void jq_push_list(struct jq *q, struct job *list)
{
    if (!list) return;
    struct job *last = list;
    while (last->next) last = last->next;
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = list;
    else q->head = list;
    q->tail = last;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Takes everything queued, waiting up to wait_ms for something to come. */
static struct job *jq_take_all(struct jq *q, int wait_ms)
{
    pthread_mutex_lock(&q->mu);
    if (!q->head && wait_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    }
    struct job *list = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    return list;
}

/* ---- poll thread: decoding and routing -------------------------------- */

static size_t job_weight(const struct job *j)
{
    return j->weight ? j->weight : 1;
}

/* Finishes a job that will not run: encodes its error result and hands it
 * to the sink. */
static void answer_now(struct worker *w, struct job *j)
{
    if (!j->weight) j->weight = 1;
    w->inflight_rows += j->weight;
    if (job_encode(j, wall_ms()) < 0) {
        /* Out of memory: stop (the supervisor restarts us; the job is not
         * committed, so it runs again) rather than publish nothing. */
        LOG_E("out_of_memory", "where=encode id=%s", j->req.id);
        atomic_store(&w->fatal, 1);
    }
    jq_push_list(&w->sinkq, j);
}

/* Copies what a dead letter needs from the record and queues it. */
static void dead_letter(struct worker *w, struct job *j,
                        const rd_kafka_message_t *m, const char *why)
{
    j->kind = JOB_DEAD;
    j->err = PROTO_ERR_INVALID_INPUT;
    snprintf(j->errmsg, sizeof(j->errmsg), "%s", why);
    /* The record is copied, up to what the producer can publish: the
     * original stays in its topic at the offset the headers name. */
    size_t klen = m->key_len < 16384 ? m->key_len : 16384;
    size_t vlen = m->len < w->max_record_bytes ? m->len : w->max_record_bytes;
    j->truncated_from = vlen < m->len ? m->len : 0;
    if (klen) {
        j->raw_key = malloc(klen);
        if (j->raw_key) memcpy(j->raw_key, m->key, klen);
        j->raw_key_len = j->raw_key ? klen : 0;
    }
    if (vlen) {
        j->raw_value = malloc(vlen);
        if (j->raw_value) memcpy(j->raw_value, m->payload, vlen);
        j->raw_value_len = j->raw_value ? vlen : 0;
    }
    /* Held bytes count against the in-flight bound like rows of input. */
    j->weight = 1 + (klen + vlen) / w->row_bytes;
    w->inflight_rows += j->weight;
    atomic_fetch_add(&w->n_dead, 1);
    LOG_W("dead_letter", "topic=%s partition=%" PRId32 " offset=%" PRId64
          " error=\"%s\"", j->topic, j->partition, j->offset, why);
    jq_push_list(&w->sinkq, j);
}

/* The record's content-type header, NUL-terminated into buf, or NULL. */
static const char *content_type(const rd_kafka_message_t *m, char *buf,
                                size_t cap)
{
    rd_kafka_headers_t *hdrs = NULL;
    const void *val;
    size_t size;
    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return NULL;
    if (rd_kafka_header_get_last(hdrs, "content-type", &val, &size) !=
            RD_KAFKA_RESP_ERR_NO_ERROR || !val)
        return NULL;
    if (size >= cap) size = cap - 1;
    memcpy(buf, val, size);
    buf[size] = '\0';
    return buf;
}

/* Takes one consumed record in: decode, route, queue. Every record becomes
 * exactly one job that is tracked until both its acknowledgements. */
static void take_record(struct worker *w, const rd_kafka_message_t *m)
{
    w->last_deadline_us = 0;
    struct job *j = job_new();
    if (!j) {
        LOG_E("out_of_memory", "where=take_record");
        atomic_store(&w->fatal, 1);
        return;
    }
    const char *topic = rd_kafka_topic_name(m->rkt);
    snprintf(j->topic, sizeof(j->topic), "%s", topic);
    j->partition = m->partition;
    j->offset = m->offset;
    rd_kafka_timestamp_type_t tstype;
    j->record_ts_ms = rd_kafka_message_timestamp(m, &tstype);
    if (j->record_ts_ms < 0) j->record_ts_ms = wall_ms();
    j->arrived_us = batcher_now_us();
    if (offtrack_add(w->ot, j->topic, j->partition, j->offset) < 0) {
        LOG_E("out_of_memory", "where=offtrack");
        job_free(j);
        atomic_store(&w->fatal, 1);
        return;
    }
    atomic_fetch_add(&w->n_consumed, 1);
    stats_consumed(w->stats);

    char ctbuf[64], why[256];
    const char *ct = content_type(m, ctbuf, sizeof(ctbuf));
    enum codec_rc rc = codec_decode_job(m->payload, m->len, m->key, m->key_len,
                                        ct, j->record_ts_ms, &w->lim, &j->req, why,
                                        sizeof(why));
    if (rc == CODEC_DEAD) {
        dead_letter(w, j, m, why);
        return;
    }
    if (j->req.err != PROTO_OK) {
        job_fail(j, j->req.err, "%s", j->req.errmsg);
        answer_now(w, j);
        return;
    }
    int idx = w->model_override >= 0 ? w->model_override
              : j->req.model[0]     ? -1
                                    : w->default_model;
    for (size_t i = 0; idx < 0 && i < w->n_models; i++)
        if (strcmp(model_name(w->models[i]), j->req.model) == 0) idx = (int)i;
    if (idx < 0) {
        job_fail(j, PROTO_ERR_UNKNOWN_MODEL, "no model named '%s' on this worker",
                 j->req.model);
        answer_now(w, j);
        return;
    }
    j->model_idx = idx;
    j->model_name = model_name(w->models[idx]);
    size_t width = model_input_width(w->models[idx]);
    if (j->req.n_input % width != 0) {
        job_fail(j, PROTO_ERR_INVALID_INPUT,
                 "field input: %zu values is not a multiple of the model's "
                 "input width %zu", j->req.n_input, width);
        answer_now(w, j);
        return;
    }
    size_t rows = j->req.n_input / width;
    if (rows > w->max_job_rows) {
        job_fail(j, PROTO_ERR_INVALID_INPUT,
                 "field input: %zu rows exceeds batching.max_job_rows %zu", rows,
                 w->max_job_rows);
        answer_now(w, j);
        return;
    }
    /* The configured default timeout bounds every job; a job's own
     * deadline may only make it earlier. */
    int64_t now_ms = wall_ms();
    j->deadline_ms = w->opts.ignore_deadlines ? 0 : j->req.deadline_ms;
    if (w->cfg->batching.default_timeout_ms > 0 && !w->opts.ignore_deadlines) {
        int64_t d = j->record_ts_ms + w->cfg->batching.default_timeout_ms;
        if (!j->deadline_ms || d < j->deadline_ms) j->deadline_ms = d;
    }
    if (j->deadline_ms && j->deadline_ms <= now_ms) {
        job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED, "deadline passed before the job was queued");
        answer_now(w, j);
        return;
    }
    if (j->deadline_ms) j->deadline_us = j->arrived_us + (j->deadline_ms - now_ms) * 1000;
    j->rows = rows;
    j->weight = rows;
    w->inflight_rows += rows;
    j->priority = w->opts.priority >= 0 ? w->opts.priority : j->req.priority;
    if (j->priority < 0) j->priority = cfg_topic_priority(w->cfg, j->topic);
    w->last_deadline_us = j->deadline_us;
    batcher_push(w->batcher, j);
}

/* The expiry timer: answers deadline_exceeded for every queued job whose
 * deadline has passed (they never run) and sets *next to the earliest
 * deadline still queued. */
static void expire(struct worker *w, int64_t now, int64_t *next)
{
    struct job *j = batcher_expire(w->batcher, now, next);
    while (j) {
        struct job *following = j->next;
        j->next = NULL;
        j->queued_ms = (double)(now - j->arrived_us) / 1000.0;
        job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED, "deadline passed after %.1f ms in the queue",
                 j->queued_ms);
        answer_now(w, j);
        j = following;
    }
}

/* ---- poll thread: offsets ---------------------------------------------- */

/* Stores the watermark of every partition that advanced, in one call. */
static void store_offsets(struct worker *w, rd_kafka_topic_partition_list_t *l)
{
    if (!l || l->cnt == 0) return;
    rd_kafka_resp_err_t err = rd_kafka_offsets_store(w->consumer, l);
    if (err) {
        /* A partition revoked meanwhile reports _STATE: nothing to do. */
        LOG_D("offsets_store", "error=\"%s\"", rd_kafka_err2str(err));
    }
}

/* Assign mode: the index of topic/partition's range, or -1 (also when
 * not in assign mode). Linear: a replay covers tens of partitions. */
static int range_of(const struct worker *w, const char *topic, int32_t partition)
{
    for (size_t i = 0; i < w->opts.n_ranges; i++)
        if (w->opts.ranges[i].partition == partition &&
            strcmp(w->opts.ranges[i].topic, topic) == 0)
            return (int)i;
    return -1;
}

/* Takes finished jobs back from the sink: advances each partition's
 * watermark, stores the offsets that moved, frees the jobs. */
static void drain_done(struct worker *w)
{
    struct job *j = jq_take_all(&w->doneq, 0);
    if (!j) return;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(8);
    while (j) {
        struct job *next = j->next;
        int64_t off;
        if (offtrack_done(w->ot, j->topic, j->partition, j->offset, &off) == 1) {
            rd_kafka_topic_partition_t *p =
                rd_kafka_topic_partition_list_find(l, j->topic, j->partition);
            if (!p) p = rd_kafka_topic_partition_list_add(l, j->topic, j->partition);
            p->offset = off;
        }
        size_t wgt = job_weight(j);
        w->inflight_rows -= wgt < w->inflight_rows ? wgt : w->inflight_rows;
        int r = range_of(w, j->topic, j->partition);
        if (r >= 0) w->rs[r].done++;
        job_free(j);
        j = next;
    }
    store_offsets(w, l);
    rd_kafka_topic_partition_list_destroy(l);
}

/* batching.executors, with 0 resolved to one per online CPU (within the
 * watchdog's slots). */
static size_t executor_count(const struct kcfg *c)
{
    long n = c->batching.executors;
    if (n == 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > STATS_MAX_EXECUTORS) n = STATS_MAX_EXECUTORS;
    return (size_t)n;
}

/* librdkafka 2.0.2 wakes no fetcher when a partition is resumed: it starts
 * fetching on its broker thread's next wake-up, up to a second later, and
 * the worker idles meanwhile (docs/batching.md, "The cost of a pause"). A
 * seek wakes it at once. Each resumed partition is sought to the offset
 * after the last record taken from it, which is where the resume would
 * fetch from anyway, so nothing is skipped or read twice.
 *
 * Only partitions that delivered a record since they were assigned are
 * sought: their fetcher has started, and the offset is theirs (the tracker
 * forgets a partition on revoke). A seek librdkafka refuses would still
 * have raised the partition's version barrier and left every record it
 * fetches afterwards discarded as outdated, so a refused or unanswered
 * seek is followed by a pause and a resume of the same partitions, which
 * bring the barrier and the fetcher back in step. */
enum { RESUME_SEEK_TIMEOUT_MS = 1000 };

static void restart_fetch(struct worker *w, const rd_kafka_topic_partition_list_t *a)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(a->cnt);
    for (int i = 0; i < a->cnt; i++) {
        int64_t next = offtrack_next(w->ot, a->elems[i].topic, a->elems[i].partition);
        if (next >= 0)
            rd_kafka_topic_partition_list_add(l, a->elems[i].topic,
                                              a->elems[i].partition)->offset = next;
    }
    if (l->cnt > 0) {
        /* Synchronous: librdkafka's own thread handles the seek, no broker
         * round trip is involved. */
        rd_kafka_error_t *e = rd_kafka_seek_partitions(w->consumer, l, RESUME_SEEK_TIMEOUT_MS);
        rd_kafka_topic_partition_list_t *bad = rd_kafka_topic_partition_list_new(l->cnt);
        const char *why = e ? rd_kafka_error_string(e) : NULL;
        for (int i = 0; i < l->cnt; i++) {
            if (!e && !l->elems[i].err) continue;
            rd_kafka_topic_partition_list_add(bad, l->elems[i].topic, l->elems[i].partition);
            if (!why) why = rd_kafka_err2str(l->elems[i].err);
        }
        if (bad->cnt > 0) {
            LOG_W("resume_seek_failed", "partitions=%d first=%s[%d] error=\"%s\" note=\"paused "
                  "and resumed again\"", bad->cnt, bad->elems[0].topic, bad->elems[0].partition,
                  why);
            rd_kafka_pause_partitions(w->consumer, bad);
            rd_kafka_resume_partitions(w->consumer, bad);
        }
        if (e) rd_kafka_error_destroy(e);
        rd_kafka_topic_partition_list_destroy(bad);
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* Pauses or resumes every assigned partition around the high and low
 * marks, so the backlog stays in Kafka and memory stays bounded. */
static void backpressure(struct worker *w)
{
    /* High marks: the queue holds max_queued_rows, or everything taken in
     * (queued, running, being written) reaches that plus a full batch per
     * in-flight slot. */
    const struct kcfg *c = w->cfg;
    struct flow_marks marks = {
        .queued_high = (size_t)c->batching.max_queued_rows,
        .taken_high = (size_t)c->batching.max_queued_rows +
                      (size_t)c->batching.max_inflight_batches *
                          (size_t)c->batching.max_batch_rows};
    size_t queued = batcher_queued_rows(w->batcher);
    int want = w->draining || flow_should_pause(&marks, w->paused, queued, w->inflight_rows);
    if (want == w->paused) return;
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(w->consumer, &a) != RD_KAFKA_RESP_ERR_NO_ERROR) return;
    /* Ranges that reached their end stay paused for good. */
    for (int i = a->cnt - 1; w->rs && i >= 0; i--) {
        int r = range_of(w, a->elems[i].topic, a->elems[i].partition);
        if (r >= 0 && w->rs[r].reached_end)
            rd_kafka_topic_partition_list_del_by_idx(a, i);
    }
    if (want) rd_kafka_pause_partitions(w->consumer, a);
    else {
        rd_kafka_resume_partitions(w->consumer, a);
        if (w->cfg->kafka.resume_seek) restart_fetch(w, a);
    }
    LOG_D(want ? "paused" : "resumed", "partitions=%d queued_rows=%zu inflight_rows=%zu",
          a->cnt, queued, w->inflight_rows);
    w->paused_partitions = want ? a->cnt : 0;
    rd_kafka_topic_partition_list_destroy(a);
    w->paused = want;
}

/* ---- poll thread: rebalance --------------------------------------------- */

/* Partitions are being taken away. Queued jobs of theirs are dropped (the
 * next owner reads them again from the committed offset); jobs already
 * running get revoke_timeout_ms to finish; then the offsets are committed
 * synchronously (docs/reliability.md, rule 5). On a lost assignment nothing is
 * committed: another member may own the partitions already. */
static void on_revoke(struct worker *w, rd_kafka_topic_partition_list_t *parts,
                      int lost)
{
    size_t *purged = calloc((size_t)parts->cnt + 1, sizeof(size_t));
    for (int i = 0; i < parts->cnt; i++) {
        struct job *j = batcher_purge(w->batcher, parts->elems[i].topic,
                                      parts->elems[i].partition);
        while (j) {
            struct job *next = j->next;
            if (purged) purged[i]++;
            size_t wgt = job_weight(j);
            w->inflight_rows -= wgt < w->inflight_rows ? wgt : w->inflight_rows;
            job_free(j);
            j = next;
        }
    }
    if (!lost) {
        /* Once the executors and sink have stopped (the close at the end of
         * a drain) nothing more can finish: don't wait for it. */
        int64_t budget_ms = w->pipeline_stopped ? 0 : w->cfg->kafka.revoke_timeout_ms;
        int64_t give_up = batcher_now_us() + budget_ms * 1000;
        for (;;) {
            drain_done(w);
            int busy = 0;
            for (int i = 0; i < parts->cnt && !busy; i++)
                busy = offtrack_pending(w->ot, parts->elems[i].topic,
                                        parts->elems[i].partition) >
                       (purged ? purged[i] : 0);
            if (!busy) break;
            if (batcher_now_us() >= give_up) {
                if (budget_ms)
                    LOG_W("revoke_timeout", "partitions=%d timeout_ms=%d", parts->cnt,
                          w->cfg->kafka.revoke_timeout_ms);
                break;
            }
            stats_alive(w->stats, STATS_LOOP_POLL);
            sleep_ms(2);
        }
        rd_kafka_resp_err_t err = rd_kafka_commit(w->consumer, NULL, 0);
        if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
            LOG_W("commit_failed", "when=revoke error=\"%s\"", rd_kafka_err2str(err));
    }
    for (int i = 0; i < parts->cnt; i++)
        offtrack_drop(w->ot, parts->elems[i].topic, parts->elems[i].partition);
    free(purged);
    LOG_I(lost ? "partitions_lost" : "partitions_revoked", "count=%d", parts->cnt);
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    struct worker *w = opaque;
    int coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        rd_kafka_error_t *e = NULL;
        if (coop) e = rd_kafka_incremental_assign(rk, parts);
        else rd_kafka_assign(rk, parts);
        if (e) {
            LOG_E("assign_failed", "error=\"%s\"", rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
        /* librdkafka keeps a partition's application pause through revoke
         * and re-assign: a partition paused by backpressure before a
         * rebalance would stay paused for good unless resumed here. */
        if (w->paused) rd_kafka_pause_partitions(rk, parts);
        else rd_kafka_resume_partitions(rk, parts);
        LOG_I("partitions_assigned", "count=%d protocol=%s", parts->cnt,
              coop ? "cooperative" : "eager");
    } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        on_revoke(w, parts, rd_kafka_assignment_lost(rk));
        if (coop) {
            rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
            if (e) rd_kafka_error_destroy(e);
        } else {
            rd_kafka_assign(rk, NULL);
        }
    } else {
        /* Treated as a lost assignment: commit nothing, let everything go. */
        LOG_E("rebalance_error", "error=\"%s\"", rd_kafka_err2str(err));
        on_revoke(w, parts, 1);
        if (coop) {
            rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
            if (e) rd_kafka_error_destroy(e);
        } else {
            rd_kafka_assign(rk, NULL);
        }
    }
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(rk, &a) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        w->n_assigned = a->cnt;
        rd_kafka_topic_partition_list_destroy(a);
    }
}

/* librdkafka's error events: transient ones are logged (the client
 * retries), a fatal one stops the worker so its supervisor restarts it. */
static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    struct worker *w = opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char buf[512];
        rd_kafka_fatal_error(rk, buf, sizeof(buf));
        LOG_E("kafka_fatal", "client=%s error=\"%s\"", rd_kafka_name(rk), buf);
        atomic_store(&w->fatal, 1);
        return;
    }
    LOG_W("kafka_error", "client=%s error=\"%s\" reason=\"%s\"", rd_kafka_name(rk),
          rd_kafka_err2str(err), reason);
}

/* stats_batch takes the batcher's reasons as they are. */
_Static_assert((int)BATCH_SIZE == (int)STATS_BATCH_SIZE &&
                   (int)BATCH_DEADLINE == (int)STATS_BATCH_DEADLINE &&
                   (int)BATCH_WAIT == (int)STATS_BATCH_WAIT &&
                   (int)BATCH_DRAIN == (int)STATS_BATCH_DRAIN,
               "enum stats_batch_reason mirrors enum batcher_reason");

/* ---- executor thread ------------------------------------------------------ */

/* Runs n jobs of model m as one forward pass: packs their rows into the
 * workspace's input buffer, runs the model once, gives each job its rows
 * of the output. Returns MODEL_EFATAL when the backend failed for good:
 * the jobs are then left unanswered (the caller drops the batch and the
 * worker exits, so they stay uncommitted and run again after a restart);
 * 0 otherwise, failed jobs answered inference_failed. */
static int run_group(struct worker *w, int model_idx, struct model_ws *ws,
                     struct job **jobs, size_t n)
{
    const struct model *m = w->models[model_idx];
    size_t in_w = model_input_width(m), out_w = model_output_width(m);
    size_t rows = 0;
    float *staging = model_ws_input(ws);
    for (size_t i = 0; i < n; i++) {
        memcpy(staging + rows * in_w, jobs[i]->req.input, jobs[i]->rows * in_w * sizeof(float));
        rows += jobs[i]->rows;
    }
    if (!rows) return 0;
    int64_t start_us = batcher_now_us();
    const float *out = NULL;
    int rc = model_forward(m, ws, staging, rows, &out);
    if (rc == MODEL_EFATAL) {
        LOG_E("model_failed", "model=%s rows=%zu error=\"%s\" note=\"exiting: the batch is "
              "uncommitted and runs again after the restart\"", model_name(m), rows,
              model_ws_error(ws));
        atomic_store(&w->fatal, 1);
        return MODEL_EFATAL;
    }
    double infer_ms = (double)(batcher_now_us() - start_us) / 1000.0;
    if (rc == 0) batcher_record(w->batcher, model_idx, rows, infer_ms / 1000.0);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        struct job *j = jobs[i];
        j->infer_ms = infer_ms;
        j->batch_rows = rows;
        if (rc < 0) {
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "model %s failed on a batch of %zu rows",
                     model_name(m), rows);
            continue;
        }
        const float *mine = out + at * out_w;
        at += j->rows;
        j->output = malloc(j->rows * out_w * sizeof(float));
        if (!j->output) {
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for the output");
            continue;
        }
        memcpy(j->output, mine, j->rows * out_w * sizeof(float));
        j->out_rows = j->rows;
        j->out_width = out_w;
    }
    atomic_fetch_add(&w->n_batch_rows, rows);
    return 0;
}

/* The fault-injection points of the debug section, just before job j
 * runs: a crash (abort) or a hang (forever). Empty settings never match. */
static void failpoints(const struct worker *w, const struct job *j)
{
    const char *crash = w->cfg->debug.crash_id, *hang = w->cfg->debug.hang_id;
    if (crash[0] && strcmp(j->req.id, crash) == 0) {
        LOG_E("debug_crash", "id=%s note=\"debug.crash_id: aborting on purpose\"", j->req.id);
        abort();
    }
    if (hang[0] && strcmp(j->req.id, hang) == 0) {
        LOG_E("debug_hang", "id=%s note=\"debug.hang_id: hanging on purpose\"", j->req.id);
        for (;;) sleep_ms(1000);
    }
}

/* Counts an attempt for every job of the batch before it runs (reliability
 * rule 10). A job counted before was in a batch when the worker died: it
 * is a suspect (suspect[i] = 1) and runs alone, after everything else is
 * written out. If Redis does not answer, the batch runs uncounted:
 * nothing is lost; only crash-loop protection is missing while Redis is
 * away. */
static void count_attempts(struct worker *w, struct rsink *rs, struct job **jobs, size_t n,
                           long long *counts, int *suspect)
{
    for (size_t i = 0; i < n; i++) suspect[i] = 0;
    if (w->cfg->worker.max_attempts <= 0 || !rs || rsink_incr_attempts(rs, jobs, n, counts, 0) < 0)
        return;
    for (size_t i = 0; i < n; i++) suspect[i] = counts[i] > 1;
}

/* Before a suspect runs alone: counts that solo run. Only a job that
 * kills the worker while running alone collects solo runs, so one counted
 * more than worker.max_attempts times is the culprit: it is answered
 * inference_failed and never run again (its partition moves on). Returns
 * 1 if it may run. */
static int solo_allowed(struct worker *w, struct rsink *rs, struct job *j)
{
    long long solo = 0;
    int max = w->cfg->worker.max_attempts;
    if (!rs || rsink_incr_attempts(rs, &j, 1, &solo, 1) < 0 || solo <= max) return 1;
    LOG_E("poison_job", "id=%s topic=%s partition=%" PRId32 " offset=%" PRId64
          " solo_attempts=%lld", j->req.id, j->topic, j->partition, j->offset, solo);
    job_fail(j, PROTO_ERR_INFERENCE_FAILED,
             "not run: the worker stopped while running this job alone %lld times "
             "(worker.max_attempts %d)", solo - 1, max);
    return 0;
}

/* Encodes every job of a batch (already run) and hands the batch to the
 * sink; its last job marks the end of an in-flight batch. */
static void finish_batch(struct worker *w, struct job *batch, enum batcher_reason why,
                         size_t rows)
{
    int64_t enc_ms = wall_ms();
    for (struct job *j = batch; j; j = j->next) {
        free(j->req.input); /* not needed any more: keep the sink's memory small */
        j->req.input = NULL;
        if (job_encode(j, enc_ms) == 0 && j->body_len > w->max_record_bytes) {
            /* The producer could never publish it: answer with an error
             * that fits instead of retrying forever. */
            size_t big = j->body_len;
            free(j->output);
            j->output = NULL;
            j->out_rows = j->out_width = 0;
            job_fail(j, PROTO_ERR_INFERENCE_FAILED,
                     "result of %zu bytes exceeds the producer's message.max.bytes "
                     "(%zu usable): send fewer rows per job", big, w->max_record_bytes);
            job_encode(j, enc_ms);
        }
        if (!j->body) {
            LOG_E("out_of_memory", "where=encode id=%s", j->req.id);
            atomic_store(&w->fatal, 1);
        }
        j->batch_last = j->next == NULL;
    }
    atomic_fetch_add(&w->n_batches, 1);
    atomic_fetch_add(&w->pushed_batches, 1);
    jq_push_list(&w->sinkq, batch);
    stats_batch(w->stats, (enum stats_batch_reason)why, rows);
}

/* Waits until the sink has written out every batch pushed so far (or the
 * worker is stopping): the suspect path only, where a crash must not find
 * innocent results still unwritten. */
static void wait_written(struct worker *w)
{
    uint_fast64_t target = atomic_load(&w->pushed_batches);
    while (atomic_load(&w->written_batches) < target && !atomic_load(&w->exec_stop) &&
           !atomic_load(&w->sink_stop))
        sleep_ms(1);
}

/* Runs batches through their model: checks deadlines and attempt counts,
 * runs the jobs in one forward pass (suspects alone), encodes the results
 * and hands the batch to the sink. Buffers are made once at start; per
 * batch it allocates only each job's output and body. */
static void *exec_main(void *arg)
{
    struct worker *w = arg;
    size_t cap = (size_t)w->cfg->batching.max_batch_rows;
    if (w->max_job_rows > cap) cap = w->max_job_rows;
    struct rsink *rs = NULL;
    struct model_ws **ws = calloc(w->n_models, sizeof(*ws));
    struct job **jobs = calloc(cap + 1, sizeof(*jobs)), **group = calloc(cap + 1, sizeof(*group));
    long long *counts = calloc(cap + 1, sizeof(*counts));
    int *suspect = calloc(cap + 1, sizeof(*suspect));
    int me = STATS_LOOP_EXEC + atomic_fetch_add(&w->exec_ids, 1);
    char err[256] = "out of memory";
    if (!ws || !jobs || !group || !counts || !suspect) goto oom;
    for (size_t i = 0; i < w->n_models; i++) {
        ws[i] = model_ws_new(w->models[i], (unsigned)(me - STATS_LOOP_EXEC), cap, err,
                             sizeof(err));
        if (!ws[i]) goto oom;
    }
    if (w->cfg->worker.max_attempts > 0 && w->opts.redis != WORKER_REDIS_OFF) {
        /* Its own connection: the counters go up before the batch runs. */
        const struct kcfg *c = w->cfg;
        struct rsink_conf rc_ = {.host = c->redis.host, .port = c->redis.port,
                                 .password = c->redis.password, .db = c->redis.db,
                                 .key_prefix = c->redis.key_prefix, .ttl_ms = c->redis.ttl_ms,
                                 .timeout_ms = c->redis.timeout_ms,
                                 .attempt_prefix = c->worker.attempt_prefix};
        rs = rsink_new(&rc_);
    }

    int max_inflight = w->cfg->batching.max_inflight_batches;
    while (!atomic_load(&w->exec_stop) && !atomic_load(&w->fatal)) {
        stats_alive(w->stats, me);
        /* A closed batch is only taken while fewer than max_inflight_batches
         * are running or being written out; meanwhile jobs keep queueing
         * (and the queue's high mark pauses fetching). */
        if (atomic_load(&w->inflight_batches) >= max_inflight) {
            sleep_ms(1);
            continue;
        }
        size_t rows;
        enum batcher_reason why = BATCH_SIZE;
        struct job *batch = batcher_next(w->batcher, 100, &rows, &why);
        if (!batch) continue;
        atomic_fetch_add(&w->inflight_batches, 1);
        if (w->cfg->debug.batch_sleep_ms > 0) sleep_ms(w->cfg->debug.batch_sleep_ms);
        int64_t start_us = batcher_now_us(), now_ms = wall_ms();
        size_t n = 0;
        for (struct job *j = batch; j; j = j->next) {
            j->queued_ms = (double)(start_us - j->arrived_us) / 1000.0;
            if (j->deadline_ms && j->deadline_ms <= now_ms) {
                job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED,
                         "deadline passed after %.1f ms in the queue", j->queued_ms);
                continue;
            }
            jobs[n++] = j;
        }
        count_attempts(w, rs, jobs, n, counts, suspect);
        int any_suspect = 0;
        for (size_t i = 0; i < n; i++) any_suspect |= suspect[i] && jobs[i]->err == PROTO_OK;
        if (!any_suspect) {
            size_t g = 0;
            for (size_t i = 0; i < n; i++)
                if (jobs[i]->err == PROTO_OK) {
                    failpoints(w, jobs[i]);
                    group[g++] = jobs[i];
                }
            if (run_group(w, batch->model_idx, ws[batch->model_idx], group, g) ==
                MODEL_EFATAL) {
                job_free_list(batch);
                break;
            }
            finish_batch(w, batch, why, rows);
            continue;
        }
        /* A batch with suspects (jobs that were running when the worker
         * died): everyone else runs first and is written out, and only
         * then does each suspect run alone and get written out in turn, so
         * a crash can only ever be counted against the job that caused it. */
        struct job *rest = NULL, **rest_tail = &rest, *alone = NULL, **alone_tail = &alone;
        size_t g = 0;
        for (struct job *j = batch, *next; j; j = next) {
            next = j->next;
            j->next = NULL;
            int sus = 0;
            for (size_t i = 0; i < n; i++)
                if (jobs[i] == j) sus = suspect[i] && j->err == PROTO_OK;
            if (sus) {
                *alone_tail = j;
                alone_tail = &j->next;
            } else {
                if (j->err == PROTO_OK) {
                    failpoints(w, j);
                    group[g++] = j;
                }
                *rest_tail = j;
                rest_tail = &j->next;
            }
        }
        if (run_group(w, batch->model_idx, ws[batch->model_idx], group, g) == MODEL_EFATAL) {
            job_free_list(rest);
            job_free_list(alone);
            break;
        }
        if (rest) {
            finish_batch(w, rest, why, rows);
            wait_written(w);
        } else {
            atomic_fetch_sub(&w->inflight_batches, 1); /* each suspect counts its own */
        }
        for (struct job *j = alone, *next; j; j = next) {
            next = j->next;
            j->next = NULL;
            if (solo_allowed(w, rs, j)) {
                failpoints(w, j);
                if (run_group(w, j->model_idx, ws[j->model_idx], &j, 1) == MODEL_EFATAL) {
                    j->next = next;
                    job_free_list(j); /* unanswered: they run again after the restart */
                    break;
                }
            }
            atomic_fetch_add(&w->inflight_batches, 1);
            finish_batch(w, j, why, j->rows);
            wait_written(w);
        }
    }
    stats_loop_stop(w->stats, me);
    goto done;
oom:
    LOG_E("executor_failed", "where=executor_buffers rows=%zu error=\"%s\"", cap, err);
    atomic_store(&w->fatal, 1);
done:
    rsink_destroy(rs);
    for (size_t i = 0; ws && i < w->n_models; i++) model_ws_destroy(ws[i]);
    free(ws);
    free(jobs);
    free(group);
    free(counts);
    free(suspect);
    return NULL;
}

/* ---- sink thread ---------------------------------------------------------- */

/* One acknowledgement arrived; the last one makes the job done. */
static void ack(struct worker *w, struct job *j)
{
    if (--j->acks_pending == 0) {
        j->next = NULL;
        stats_job_done(w->stats, j, wall_ms());
        if (j->kind == JOB_DEAD) {
            /* counted when dead-lettered */
        } else if (j->err == PROTO_OK) {
            atomic_fetch_add(&w->n_ok, 1);
        } else {
            atomic_fetch_add(&w->n_failed, 1);
        }
        jq_push_list(&w->doneq, j);
    }
}

/* Delivery report, served by rd_kafka_poll on the sink thread (or by the
 * final flush on the poll thread after the sink thread has stopped). */
static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    struct worker *w = opaque;
    struct job *j = m->_private;
    if (j->stranded) return; /* owned by the stranded list now */
    if (m->err) {
        atomic_fetch_add(&w->n_produce_errors, 1);
        stats_produce_error(w->stats);
        LOG_W("produce_failed", "id=%s error=\"%s\" attempt=%d", j->req.id,
              rd_kafka_err2str(m->err), j->produce_attempts);
        j->next = w->retry;
        w->retry = j;
        return;
    }
    ack(w, j);
}

/* Produces one job's record: the result to the reply topic, or the original
 * record to the dead-letter topic. The job's bytes stay alive until its
 * delivery report, so nothing is copied. */
static rd_kafka_resp_err_t produce(struct worker *w, struct job *j)
{
    j->produce_attempts++;
    if (j->kind == JOB_RESULT) {
        const char *ct = codec_content_type(j->req.enc);
        return rd_kafka_producev(
            w->producer, RD_KAFKA_V_TOPIC(w->reply_topic),
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
        w->producer, RD_KAFKA_V_TOPIC(w->cfg->kafka.dlq_topic),
        RD_KAFKA_V_KEY(j->raw_key, j->raw_key_len),
        RD_KAFKA_V_VALUE(j->raw_value, j->raw_value_len), RD_KAFKA_V_HEADERS(h),
        RD_KAFKA_V_OPAQUE(j), RD_KAFKA_V_END);
    if (err) rd_kafka_headers_destroy(h); /* not taken on failure */
    return err;
}

/* Produces until librdkafka takes the record, serving delivery reports
 * while its queue is full; on a hard error the job goes to the retry list. */
static void produce_or_retry(struct worker *w, struct job *j)
{
    for (;;) {
        rd_kafka_resp_err_t err = produce(w, j);
        if (!err) return;
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && !atomic_load(&w->sink_stop)) {
            rd_kafka_poll(w->producer, 10);
            continue;
        }
        atomic_fetch_add(&w->n_produce_errors, 1);
        stats_produce_error(w->stats);
        LOG_W("produce_failed", "id=%s error=\"%s\"", j->req.id, rd_kafka_err2str(err));
        j->next = w->retry;
        w->retry = j;
        return;
    }
}

/* rsink's hook while it retries Redis: the sink thread is waiting on an
 * outage, not hung (an outage shows on /readyz, not /healthz). */
static void sink_alive(void *ctx)
{
    struct worker *w = ctx;
    stats_alive(w->stats, STATS_LOOP_SINK);
}

static void *sink_main(void *arg)
{
    struct worker *w = arg;
    size_t cap = 0;
    struct job **results = NULL;
    while (!atomic_load(&w->sink_stop)) {
        stats_alive(w->stats, STATS_LOOP_SINK);
        struct job *list = jq_take_all(&w->sinkq, 5);
        size_t n = 0;
        for (struct job *j = list; j; j = j->next) n++;
        if (n > cap) {
            struct job **r = realloc(results, n * sizeof(*r));
            if (!r) {
                LOG_E("out_of_memory", "where=sink");
                atomic_store(&w->fatal, 1);
                jq_push_list(&w->sinkq, list);
                break;
            }
            results = r;
            cap = n;
        }
        size_t nr = 0;
        int batch_ends = 0;
        for (struct job *j = list, *next; j; j = next) {
            next = j->next;
            j->next = NULL;
            int to_redis = j->kind == JOB_RESULT && w->opts.redis != WORKER_REDIS_OFF;
            j->acks_pending = to_redis ? 2 : 1;
            if (to_redis) results[nr++] = j;
            batch_ends += j->batch_last;
            produce_or_retry(w, j); /* may complete j: not touched after */
        }
        /* One pipelined round trip for the whole batch. */
        int rrc = nr ? rsink_set_batch(w->rsink, results, nr, &w->sink_stop) : 0;
        if (rrc == -2) {
            LOG_E("out_of_memory", "where=redis_sink");
            atomic_store(&w->fatal, 1);
        }
        int redis_ok = rrc == 0;
        /* The batches are written out (delivery reports may still be on
         * their way): their in-flight slots free up. */
        atomic_fetch_sub(&w->inflight_batches, batch_ends);
        atomic_fetch_add(&w->written_batches, (uint_fast64_t)batch_ends);
        if (nr && redis_ok) {
            for (size_t i = 0; i < nr; i++) ack(w, results[i]);
        } else if (nr) {
            /* Stopping with Redis unreachable: these stay uncommitted. The
             * delivery report may still arrive, so the job stays alive
             * until the producer is gone and is never counted done. */
            for (size_t i = 0; i < nr; i++) {
                results[i]->stranded = 1;
                results[i]->stranded_next = w->stranded;
                w->stranded = results[i];
            }
        }
        rd_kafka_poll(w->producer, 0);
        /* Deliveries that failed (after librdkafka's own retries) go again
         * after a pause: their offsets stay uncommitted meanwhile. */
        int64_t now = batcher_now_us();
        if (w->retry && now >= w->retry_at_us) {
            struct job *r = w->retry;
            w->retry = NULL;
            w->retry_at_us = now + 500000;
            while (r) {
                struct job *next = r->next;
                produce_or_retry(w, r);
                r = next;
            }
        }
    }
    stats_loop_stop(w->stats, STATS_LOOP_SINK);
    free(results);
    return NULL;
}

/* ---- setup and the poll loop ---------------------------------------------- */

static int load_models(struct worker *w)
{
    const struct kcfg *c = w->cfg;
    char err[512];
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = c->worker.backend;
    rc.cpu_threads = c->worker.blas_threads;
    if (!(w->rt = model_runtime_new(&rc, err, sizeof(err)))) {
        LOG_E("backend_failed", "backend=%s error=\"%s\"", c->worker.backend, err);
        return -1;
    }
    LOG_I("backend_selected", "backend=%s setting=%s detail=\"%s\"",
          model_runtime_backend(w->rt), c->worker.backend, model_runtime_describe(w->rt));
    w->models = calloc(c->n_models, sizeof(*w->models));
    if (!w->models) return -1;
    for (size_t i = 0; i < c->n_models; i++) {
        w->models[i] = model_load(w->rt, &c->models[i], err, sizeof(err));
        if (!w->models[i]) {
            LOG_E("model_load_failed", "model=%s error=\"%s\"", c->models[i].name, err);
            return -1;
        }
        w->n_models++;
        LOG_I("model_loaded", "model=%s path=%s input_width=%zu output_width=%zu "
              "params=%zu backend=%s", model_name(w->models[i]), c->models[i].path,
              model_input_width(w->models[i]), model_output_width(w->models[i]),
              model_param_count(w->models[i]), model_runtime_backend(w->rt));
    }
    w->default_model = cfg_model_index(c, c->default_model);
    return w->default_model < 0 ? -1 : 0;
}

/* librdkafka's statistics (every statistics.interval.ms), served on the
 * thread that polls the client: lag, group state, broker connections. */
static int stats_cb(rd_kafka_t *rk, char *json, size_t len, void *opaque)
{
    (void)rk;
    struct worker *w = opaque;
    stats_rdkafka_json(w->stats, json, len);
    return 0; /* librdkafka frees json */
}

static rd_kafka_t *make_client(struct worker *w, enum kq_role role)
{
    char err[512];
    rd_kafka_conf_t *conf = kq_conf_new(w->cfg, role, err, sizeof(err));
    if (!conf) {
        LOG_E("kafka_config", "error=\"%s\"", err);
        return NULL;
    }
    if (role == KQ_CONSUMER && w->opts.group &&
        kq_set(conf, "group.id", w->opts.group, err, sizeof(err)) < 0) {
        LOG_E("kafka_config", "error=\"%s\"", err);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set_opaque(conf, w);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    rd_kafka_conf_set_stats_cb(conf, stats_cb);
    if (role == KQ_CONSUMER) rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    else rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_t *rk = rd_kafka_new(role == KQ_CONSUMER ? RD_KAFKA_CONSUMER
                                                      : RD_KAFKA_PRODUCER,
                                  conf, err, sizeof(err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        LOG_E("kafka_client", "error=\"%s\"", err);
    }
    return rk;
}

static void log_stats(struct worker *w)
{
    struct batcher_stats bs;
    batcher_get_stats(w->batcher, batcher_now_us(), &bs);
    uint64_t b = atomic_load(&w->n_batches);
    LOG_I("stats", "consumed=%" PRIu64 " ok=%" PRIu64 " failed=%" PRIu64
          " dead_lettered=%" PRIu64 " batches=%" PRIu64 " mean_batch_rows=%.1f"
          " closed_size=%" PRIu64 " closed_deadline=%" PRIu64 " closed_wait=%" PRIu64
          " closed_drain=%" PRIu64 " expired=%" PRIu64 " queued_rows=%zu queued_jobs=%zu"
          " oldest_queued_ms=%.1f inflight_batches=%d inflight_rows=%zu"
          " paused_partitions=%d produce_errors=%" PRIu64 " redis_errors=%" PRIu64,
          atomic_load(&w->n_consumed), atomic_load(&w->n_ok),
          atomic_load(&w->n_failed), atomic_load(&w->n_dead), b,
          b ? (double)atomic_load(&w->n_batch_rows) / (double)b : 0.0,
          bs.closed[BATCH_SIZE], bs.closed[BATCH_DEADLINE], bs.closed[BATCH_WAIT],
          bs.closed[BATCH_DRAIN], bs.expired, bs.queued_rows, bs.queued_jobs,
          (double)bs.oldest_age_us / 1000.0, atomic_load(&w->inflight_batches),
          w->inflight_rows, w->paused_partitions, atomic_load(&w->n_produce_errors),
          rsink_errors(w->rsink));
}

/* Assign mode: whether m is inside its range. A record at or past the
 * end marks the range as reached and pauses its partition (the records
 * after it are someone else's business). */
static int in_range(struct worker *w, const rd_kafka_message_t *m)
{
    int r = range_of(w, rd_kafka_topic_name(m->rkt), m->partition);
    if (r < 0) return 0;
    const struct worker_range *g = &w->opts.ranges[r];
    if (m->offset >= g->end - 1) {
        if (!w->rs[r].reached_end) {
            w->rs[r].reached_end = 1;
            rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(l, g->topic, g->partition);
            rd_kafka_pause_partitions(w->consumer, l);
            rd_kafka_topic_partition_list_destroy(l);
        }
        return m->offset < g->end;
    }
    return m->offset >= g->start;
}

/* Assign mode: every range consumed to its end (by record, or by the
 * consumer's position when the last offsets hold no record, e.g. control
 * records) and every job of it finished. */
static int ranges_finished(struct worker *w)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    for (size_t i = 0; i < w->opts.n_ranges; i++) {
        if (w->rs[i].reached_end) continue;
        if (!l) l = rd_kafka_topic_partition_list_new((int)w->opts.n_ranges);
        rd_kafka_topic_partition_list_add(l, w->opts.ranges[i].topic,
                                          w->opts.ranges[i].partition);
    }
    if (l) {
        rd_kafka_position(w->consumer, l);
        for (int k = 0; k < l->cnt; k++) {
            int r = range_of(w, l->elems[k].topic, l->elems[k].partition);
            if (l->elems[k].offset >= w->opts.ranges[r].end) w->rs[r].reached_end = 1;
        }
        rd_kafka_topic_partition_list_destroy(l);
    }
    for (size_t i = 0; i < w->opts.n_ranges; i++)
        if (!w->rs[i].reached_end ||
            offtrack_pending(w->ot, w->opts.ranges[i].topic, w->opts.ranges[i].partition))
            return 0;
    return 1;
}

/* The rate cap: a token bucket holding at most a second's worth. Returns 1
 * if a record may be taken now. */
static int take_allowed(struct worker *w, int64_t now)
{
    if (w->opts.rate <= 0) return 1;
    w->tokens += (double)(now - w->tokens_at_us) / 1e6 * w->opts.rate;
    w->tokens_at_us = now;
    if (w->tokens > w->opts.rate) w->tokens = w->opts.rate;
    if (w->tokens < -1) w->tokens = -1;
    return w->tokens >= 1;
}

/* Hands the assign-mode counters to the progress callback. */
static void report_progress(struct worker *w, int64_t started_us, int finished)
{
    for (size_t i = 0; i < w->opts.n_ranges; i++) w->range_done[i] = w->rs[i].done;
    struct worker_progress p = {.ranges = w->opts.ranges, .done = w->range_done,
                                .n_ranges = w->opts.n_ranges,
                                .ok = atomic_load(&w->n_ok), .failed = atomic_load(&w->n_failed),
                                .dead_lettered = atomic_load(&w->n_dead),
                                .elapsed_s = (double)(batcher_now_us() - started_us) / 1e6,
                                .finished = finished};
    w->opts.progress(w->opts.progress_ctx, &p);
}

/* After a stop request: no new records are taken; everything taken in gets
 * drain_timeout_ms to finish. Returns the number of jobs left unfinished
 * (their offsets stay uncommitted: the next owner runs them). */
static size_t drain(struct worker *w)
{
    w->draining = 1;
    backpressure(w);
    batcher_close(w->batcher);
    int64_t give_up = batcher_now_us() + (int64_t)w->cfg->worker.drain_timeout_ms * 1000;
    size_t left;
    while ((left = offtrack_pending_total(w->ot)) > 0 && batcher_now_us() < give_up &&
           !atomic_load(&w->fatal)) {
        /* Keep serving the group (and rebalances) while draining; records
         * still buffered for paused partitions are not taken. */
        stats_alive(w->stats, STATS_LOOP_POLL);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(w->consumer, 5);
        if (m) rd_kafka_message_destroy(m);
        drain_done(w);
    }
    return left;
}

/* The poll thread's gauges for /metrics and the heartbeat. */
/* Reliability rule 7: a hung loop (an executor stuck in the model, say)
 * trips the watchdog after metrics.watchdog_ms, and the process must end
 * so its supervisor restarts it. The hung thread can never be joined and
 * the others still use what an orderly shutdown would free, so this is
 * the one place that exits on its own, with _exit: nothing is lost, as
 * no offset past unfinished work was ever stored. */
static void watchdog_check(struct worker *w)
{
    struct stats_snapshot snap;
    memset(&snap, 0, sizeof(snap));
    if (stats_snapshot(w->stats, stats_now_us(), &snap) == 0 && !snap.healthy) {
        LOG_E("watchdog_exit", "reason=\"%s\" watchdog_ms=%d note=\"exiting: unfinished "
              "jobs are uncommitted and run again after the restart\"", snap.unhealthy_why,
              w->cfg->metrics.watchdog_ms);
        fflush(stderr);
        _exit(WORKER_EXIT_FATAL);
    }
    stats_snapshot_fini(&snap);
}

static void publish_gauges(struct worker *w, int64_t now)
{
    struct batcher_stats bs;
    batcher_get_stats(w->batcher, now, &bs);
    stats_set_queue(w->stats, bs.queued_rows, bs.queued_jobs, (double)bs.oldest_age_us / 1e6,
                    w->inflight_rows, atomic_load(&w->inflight_batches));
    stats_set_partitions(w->stats, w->n_assigned, w->paused ? w->n_assigned : 0);
    stats_set_redis_errors(w->stats, rsink_errors(w->rsink));
}

enum worker_exit worker_run(const struct kcfg *c, const struct worker_opts *opts,
                            volatile sig_atomic_t *stop)
{
    struct worker *w = calloc(1, sizeof(*w));
    enum worker_exit rc = WORKER_EXIT_STARTUP;
    if (!w) return rc;
    w->cfg = c;
    w->stop = stop;
    if (opts) w->opts = *opts;
    else w->opts.priority = -1;
    w->reply_topic = w->opts.reply_topic ? w->opts.reply_topic : c->kafka.reply_topic;
    w->model_override = -1;
    if (w->opts.n_ranges) {
        w->rs = calloc(w->opts.n_ranges, sizeof(*w->rs));
        w->range_done = calloc(w->opts.n_ranges, sizeof(*w->range_done));
        if (!w->rs || !w->range_done) goto out;
        for (size_t i = 0; i < w->opts.n_ranges; i++)
            w->rs[i].reached_end = w->opts.ranges[i].start >= w->opts.ranges[i].end;
    }
    w->max_job_rows = (size_t)c->batching.max_job_rows;
    jq_init(&w->sinkq);
    jq_init(&w->doneq);
    char serr[512];
    if (!(w->stats = stats_new())) goto out;
    /* The endpoints and the heartbeat belong to a group member, not to a
     * bounded assign-mode run (replay), which may run beside one. */
    if (!w->opts.ranges && !(w->metrics = metrics_start(c, w->stats, serr, sizeof(serr)))) {
        LOG_E("metrics_failed", "error=\"%s\"", serr);
        goto out;
    }
    if (load_models(w) < 0) goto out;
    stats_set_backend(w->stats, model_runtime_backend(w->rt));
    stats_set_cond(w->stats, STATS_COND_MODEL, 1);
    if (w->opts.model && (w->model_override = cfg_model_index(c, w->opts.model)) < 0) {
        LOG_E("unknown_model", "model=%s note=\"not one of this config's models\"",
              w->opts.model);
        goto out;
    }
    size_t max_in = 0;
    for (size_t i = 0; i < w->n_models; i++)
        if (model_input_width(w->models[i]) > max_in) max_in = model_input_width(w->models[i]);
    w->lim.max_payload_bytes = (size_t)c->worker.max_payload_bytes;
    w->lim.max_input_floats = w->max_job_rows * max_in;
    w->lim.max_depth = 32;
    w->row_bytes = max_in * sizeof(float);

    struct batcher_conf bc = {.n_models = w->n_models,
                              .max_batch_rows = (size_t)c->batching.max_batch_rows,
                              .max_wait_ms = c->batching.max_wait_ms,
                              .aging_ms = c->batching.aging_ms,
                              .n_preferred = c->batching.n_preferred_sizes};
    memcpy(bc.preferred, c->batching.preferred_sizes,
           c->batching.n_preferred_sizes * sizeof(size_t));
    w->batcher = batcher_new(&bc);
    w->ot = offtrack_new();
    struct rsink_conf rc_ = {.host = c->redis.host, .port = c->redis.port,
                             .password = c->redis.password, .db = c->redis.db,
                             .key_prefix = c->redis.key_prefix, .ttl_ms = c->redis.ttl_ms,
                             .timeout_ms = c->redis.timeout_ms,
                             .publish_channel = c->redis.publish_channel,
                             .if_absent = w->opts.redis == WORKER_REDIS_IF_ABSENT,
                             .alive = sink_alive, .alive_ctx = w,
                             .attempt_prefix = c->worker.max_attempts > 0
                                                   ? c->worker.attempt_prefix : NULL};
    w->rsink = rsink_new(&rc_);
    if (!w->batcher || !w->ot || !w->rsink) goto out;
    if (!w->opts.ranges && !(w->hb = hb_start(c, w->stats, serr, sizeof(serr)))) {
        LOG_E("heartbeat_failed", "error=\"%s\"", serr);
        goto out;
    }
    if (w->opts.redis != WORKER_REDIS_OFF && rsink_ping(w->rsink) < 0)
        LOG_W("redis_unreachable", "host=%s port=%d note=\"results wait until it answers\"",
              c->redis.host, c->redis.port);

    w->producer = make_client(w, KQ_PRODUCER);
    w->consumer = w->producer ? make_client(w, KQ_CONSUMER) : NULL;
    if (!w->consumer) goto out;
    /* What the producer refuses can never be published: results and dead
     * letters are kept below it (less room for key, headers, framing). */
    char mmb[32];
    size_t mmb_len = sizeof(mmb);
    w->max_record_bytes = 1000000;
    if (rd_kafka_conf_get(rd_kafka_conf(w->producer), "message.max.bytes", mmb, &mmb_len) ==
        RD_KAFKA_CONF_OK)
        w->max_record_bytes = (size_t)strtoull(mmb, NULL, 10);
    w->max_record_bytes = w->max_record_bytes > 8192 ? w->max_record_bytes - 4096 : 4096;
    rd_kafka_poll_set_consumer(w->consumer);
    rd_kafka_resp_err_t err;
    if (w->opts.ranges) {
        /* Assign mode: the ranges directly, no group membership, so no
         * live group is joined or rebalanced. Finished ranges stay out. */
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new((int)w->opts.n_ranges);
        for (size_t i = 0; i < w->opts.n_ranges; i++)
            if (!w->rs[i].reached_end)
                rd_kafka_topic_partition_list_add(l, w->opts.ranges[i].topic,
                                                  w->opts.ranges[i].partition)->offset =
                    w->opts.ranges[i].start;
        err = rd_kafka_assign(w->consumer, l);
        rd_kafka_topic_partition_list_destroy(l);
    } else {
        rd_kafka_topic_partition_list_t *topics =
            rd_kafka_topic_partition_list_new((int)c->kafka.n_topics);
        for (size_t i = 0; i < c->kafka.n_topics; i++)
            rd_kafka_topic_partition_list_add(topics, c->kafka.topics[i], RD_KAFKA_PARTITION_UA);
        err = rd_kafka_subscribe(w->consumer, topics);
        rd_kafka_topic_partition_list_destroy(topics);
    }
    if (err) {
        LOG_E(w->opts.ranges ? "assign_failed" : "subscribe_failed", "error=\"%s\"",
              rd_kafka_err2str(err));
        goto out;
    }
    size_t n_exec = executor_count(c);
    w->exec_thr = calloc(n_exec, sizeof(pthread_t));
    if (!w->exec_thr) goto out;
    for (w->n_exec = 0; w->n_exec < n_exec; w->n_exec++)
        if (pthread_create(&w->exec_thr[w->n_exec], NULL, exec_main, w) != 0) break;
    if (w->n_exec < n_exec ||
        pthread_create(&w->sink_thr, NULL, sink_main, w) != 0) {
        atomic_store(&w->exec_stop, 1);
        batcher_stop(w->batcher);
        for (size_t i = 0; i < w->n_exec; i++) pthread_join(w->exec_thr[i], NULL);
        goto out;
    }
    LOG_I("worker_started", "brokers=%s group=%s topics=%zu reply_topic=%s redis=%s:%d "
          "max_batch_rows=%d max_wait_ms=%d executors=%zu ranges=%zu", c->kafka.brokers,
          w->opts.group ? w->opts.group : c->kafka.group, c->kafka.n_topics, w->reply_topic,
          c->redis.host, c->redis.port, c->batching.max_batch_rows, c->batching.max_wait_ms,
          w->n_exec, w->opts.n_ranges);
    int64_t started_us = batcher_now_us(), next_progress = started_us;
    w->tokens_at_us = started_us;

    int64_t next_stats = batcher_now_us() + 10 * 1000000;
    int64_t next_deadline = INT64_MAX, next_gauges = 0, next_watchdog = 0;
    while (!*stop && !atomic_load(&w->fatal)) {
        drain_done(w);
        int64_t now = batcher_now_us();
        stats_alive(w->stats, STATS_LOOP_POLL);
        if (now >= next_gauges) {
            publish_gauges(w, now);
            next_gauges = now + 100000; /* gauges: 10 a second is plenty */
            if (now >= next_watchdog) {
                watchdog_check(w);
                next_watchdog = now + 1000000;
            }
        }
        if (next_deadline <= now) expire(w, now, &next_deadline);
        backpressure(w);
        if (w->opts.ranges) {
            if (w->opts.progress && now >= next_progress) {
                report_progress(w, started_us, 0);
                next_progress = now + (int64_t)(w->opts.progress_ms > 0 ? w->opts.progress_ms
                                                                        : 1000) * 1000;
            }
            if (ranges_finished(w)) break;
        }
        if (!take_allowed(w, now)) {
            sleep_ms(1);
            continue;
        }
        /* Poll no longer than until the next queued deadline: the expiry
         * timer of jobs waiting in the queue, executors busy or not. */
        int64_t wait_us = next_deadline - now;
        int wait_ms = wait_us >= 20000 ? 20 : wait_us <= 0 ? 0 : (int)((wait_us + 999) / 1000);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(w->consumer, wait_ms);
        if (m) {
            if (m->err) {
                if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                    LOG_W("consume_error", "error=\"%s\"", rd_kafka_message_errstr(m));
            } else if (!w->opts.ranges || in_range(w, m)) {
                take_record(w, m);
                w->tokens -= 1;
                if (w->last_deadline_us && w->last_deadline_us < next_deadline)
                    next_deadline = w->last_deadline_us;
            }
            rd_kafka_message_destroy(m);
        }
        if (batcher_now_us() >= next_stats) {
            log_stats(w);
            next_stats = batcher_now_us() + 10 * 1000000;
        }
    }
    int fatal = atomic_load(&w->fatal);
    stats_set_draining(w->stats);
    LOG_I("draining", "reason=%s inflight_rows=%zu",
          fatal ? "fatal_error" : *stop ? "signal" : "ranges_done", w->inflight_rows);
    size_t left = fatal ? offtrack_pending_total(w->ot) : drain(w);
    stats_loop_stop(w->stats, STATS_LOOP_POLL);

    atomic_store(&w->exec_stop, 1);
    batcher_stop(w->batcher);
    for (size_t i = 0; i < w->n_exec; i++) pthread_join(w->exec_thr[i], NULL);
    atomic_store(&w->sink_stop, 1);
    pthread_join(w->sink_thr, NULL);
    w->pipeline_stopped = 1;
    /* Deliveries still owed are served here; their jobs complete into the
     * done queue and their offsets are stored below. */
    rd_kafka_flush(w->producer, 5000);
    drain_done(w);
    left = offtrack_pending_total(w->ot);
    err = rd_kafka_commit(w->consumer, NULL, 0);
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        LOG_W("commit_failed", "when=shutdown error=\"%s\"", rd_kafka_err2str(err));
    rd_kafka_consumer_close(w->consumer);
    if (w->opts.ranges && w->opts.progress) report_progress(w, started_us, 1);
    log_stats(w);
    LOG_I("stopped", "unfinished=%zu note=\"unfinished jobs stay uncommitted and run again\"",
          left);
    rc = fatal || atomic_load(&w->fatal) ? WORKER_EXIT_FATAL : WORKER_EXIT_OK;
out:
    if (w->consumer) rd_kafka_destroy(w->consumer);
    if (w->producer) {
        rd_kafka_purge(w->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(w->producer, 0); /* purged deliveries land on the retry list */
        rd_kafka_destroy(w->producer);
    }
    free(w->exec_thr);
    free(w->rs);
    free(w->range_done);
    /* A stranded job may also sit on the retry list: free it once, from
     * the stranded list. */
    for (struct job *j = w->retry, *next; j; j = next) {
        next = j->next;
        if (!j->stranded) job_free(j);
    }
    for (struct job *j = w->stranded, *next; j; j = next) {
        next = j->stranded_next;
        job_free(j);
    }
    jq_fini(&w->sinkq);
    jq_fini(&w->doneq);
    batcher_destroy(w->batcher);
    offtrack_destroy(w->ot);
    rsink_destroy(w->rsink);
    for (size_t i = 0; i < w->n_models; i++) model_destroy(w->models[i]);
    free(w->models);
    model_runtime_destroy(w->rt);
    hb_stop(w->hb);
    metrics_stop(w->metrics);
    stats_destroy(w->stats); /* after the clients: their stats_cb uses it */
    free(w);
    return rc;
}

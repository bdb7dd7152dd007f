/* bench_floors.c - the network floors of `kinfer bench`: what the same
 * libraries do with the same bytes and nothing of kinfer's in between:
 * librdkafka produce and consume (floor-kafka), pipelined Redis SETs
 * (floor-redis), and a passthrough that consumes, produces and SETs
 * without decoding.
 *
 * Threads: main thread only. Ownership: every client and buffer is made
 * and freed by the subcommand that uses it. */
#include "bench.h"
#include "bench_shared.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "textgen.h"
#include "../config/config.h"
#include "../kafka/kq.h"
#include "../base/log.h"

/* ---- floors ------------------------------------------------------------------ */

/* BENCH_FLOOR_POOL encoded job bodies with their ids as keys: the floors send the
 * same bytes the load does, without paying for encoding while timed. */
struct bodies {
    unsigned char *body[BENCH_FLOOR_POOL];
    size_t len[BENCH_FLOOR_POOL];
    char id[BENCH_FLOOR_POOL][96];
    size_t bytes;    /* sum of len over the pool */
};

/* Encodes the pool; returns 0 or -1. Free with bodies_fini even on error. */
static int bodies_init(struct bodies *b, const struct kcfg *c, const struct bench_opts *o)
{
    memset(b, 0, sizeof(*b));
    struct bench_jobgen g;
    size_t width = bench_job_width(c, o);
    if (!width || bench_jobgen_init(&g, o->run, width, o->rows) < 0) return -1;
    int rc = 0;
    int64_t now = clock_wall_us();
    for (size_t i = 0; i < BENCH_FLOOR_POOL && rc == 0; i++) {
        rc = bench_jobgen_encode(&g, i, now, b->id[i], sizeof(b->id[i]), &b->body[i], &b->len[i]);
        b->bytes += b->len[i];
    }
    bench_jobgen_fini(&g);
    return rc;
}

/* Frees every body encoded so far (unused slots are NULL). */
static void bodies_fini(struct bodies *b)
{
    for (size_t i = 0; i < BENCH_FLOOR_POOL; i++) free(b->body[i]);
}

/* `bench floor-kafka`: produces --jobs job records to the first input
 * topic as fast as librdkafka takes them (worker's producer settings, no
 * copy, timed to the last acknowledgement), then reads them back with a
 * consumer on the worker's settings (timed from the first record to the
 * last, so start-up is left out). */
int bench_floor_kafka(const struct kcfg *c, const struct bench_opts *o)
{
    struct bodies *b = malloc(sizeof(*b));
    struct bench_dr_count dc = {0};
    rd_kafka_t *p = NULL, *k = NULL;
    int rc = 1;
    if (!b || bodies_init(b, c, o) < 0) goto out;
    const char *topic = c->kafka.topics[0];
    if (!(p = bench_producer(c, &dc))) goto out;
    double t0 = bench_mono_s();
    for (size_t i = 0; i < o->jobs; i++) {
        size_t j = i % BENCH_FLOOR_POOL;
        if (bench_produce_one(p, topic, b->id[j], strlen(b->id[j]), b->body[j], b->len[j], 0, 0) < 0)
            goto out;
        if ((i & 63) == 0) rd_kafka_poll(p, 0);
    }
    rd_kafka_flush(p, 60000);
    double prod_s = bench_mono_s() - t0;
    if (dc.ok != o->jobs) {
        fprintf(stderr, "kinfer bench: floor-kafka: %" PRIu64 " of %zu delivered (%s)\n",
                dc.ok, o->jobs, rd_kafka_err2str(dc.first_err));
        goto out;
    }
    char group[128];
    snprintf(group, sizeof(group), "kinfer-bench-floor-%d", (int)getpid());
    if (!(k = bench_consumer(c, group)) || bench_assign_topic(k, topic, 0) < 0) goto out;
    size_t got = 0;
    double first = 0, last = 0, give_up = bench_mono_s() + o->timeout_s;
    while (got < o->jobs && bench_mono_s() < give_up) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(k, 100);
        if (!m) continue;
        if (!m->err) {
            last = bench_mono_s();
            if (!got++) first = last;
        }
        rd_kafka_message_destroy(m);
    }
    if (got < o->jobs) {
        fprintf(stderr, "kinfer bench: floor-kafka: read %zu of %zu back\n", got, o->jobs);
        goto out;
    }
    printf("floor-kafka: topic=%s messages=%zu mean_bytes=%.0f produce_per_s=%.0f "
           "consume_per_s=%.0f\n", topic, o->jobs, (double)b->bytes / BENCH_FLOOR_POOL,
           (double)o->jobs / prod_s, last > first ? (double)(got - 1) / (last - first) : 0.0);
    rc = 0;
out:
    if (k) {
        rd_kafka_consumer_close(k);
        rd_kafka_destroy(k);
    }
    if (p) rd_kafka_destroy(p); /* before the bodies it may still point at */
    if (b) bodies_fini(b);
    free(b);
    return rc;
}

/* `bench floor-redis`: SETs --jobs job bodies as the sink does (key prefix,
 * PX ttl), --pipeline commands per round trip, one connection. */
int bench_floor_redis(const struct kcfg *c, const struct bench_opts *o)
{
    struct bodies *b = malloc(sizeof(*b));
    redisContext *rc = NULL;
    int rcode = 1;
    if (!b || bodies_init(b, c, o) < 0 || !(rc = bench_redis(c))) goto out;
    size_t pipe = o->pipeline ? o->pipeline : (size_t)c->batching.max_batch_rows;
    char ttl[32], key[128];
    snprintf(ttl, sizeof(ttl), "%" PRId64, c->redis.ttl_ms);
    double t0 = bench_mono_s();
    for (size_t i = 0; i < o->jobs;) {
        size_t n = o->jobs - i < pipe ? o->jobs - i : pipe;
        for (size_t k = 0; k < n; k++, i++) {
            int kl = snprintf(key, sizeof(key), "%s.%zu.0", o->run, i);
            bench_append_set(rc, c, ttl, key, (size_t)kl, b->body[i % BENCH_FLOOR_POOL],
                       b->len[i % BENCH_FLOOR_POOL]);
        }
        if (bench_read_replies(rc, n) < 0) goto out;
    }
    double secs = bench_mono_s() - t0;
    printf("floor-redis: sets=%zu mean_bytes=%.0f pipeline=%zu sets_per_s=%.0f\n", o->jobs,
           (double)b->bytes / BENCH_FLOOR_POOL, pipe, (double)o->jobs / secs);
    rcode = 0;
out:
    if (rc) redisFree(rc);
    if (b) bodies_fini(b);
    free(b);
    return rcode;
}

/* A Redis connection that never blocks the passthrough's one thread:
 * commands are appended and written as the socket takes them, replies are
 * read as they arrive. Returns a connected context (AUTH and SELECT done)
 * or NULL after printing why. */
static redisContext *nb_connect(const struct kcfg *c)
{
    redisContext *rc = redisConnectNonBlock(c->redis.host, c->redis.port);
    if (!rc || rc->err) {
        fprintf(stderr, "kinfer bench: redis %s:%d: %s\n", c->redis.host, c->redis.port,
                rc ? rc->errstr : "out of memory");
        if (rc) redisFree(rc);
        return NULL;
    }
    struct pollfd p = {.fd = rc->fd, .events = POLLOUT};
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    if (poll(&p, 1, c->redis.timeout_ms) != 1 ||
        getsockopt(rc->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
        fprintf(stderr, "kinfer bench: redis %s:%d: %s\n", c->redis.host, c->redis.port,
                soerr ? strerror(soerr) : "connect timed out");
        redisFree(rc);
        return NULL;
    }
    return rc;
}

/* With write set, writes what the socket takes now of the commands
 * appended; then reads the replies that have arrived, waiting up to wait_ms
 * for the socket. Each reply lowers *unanswered (commands appended and not
 * yet answered). Returns 0, or -1 on a connection or reply error
 * (printed). */
static int nb_pump(redisContext *rc, size_t *unanswered, int write, int wait_ms)
{
    int done = 1;
    if (write && redisBufferWrite(rc, &done) != REDIS_OK) {
        fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
        return -1;
    }
    struct pollfd p = {.fd = rc->fd, .events = POLLIN | (done ? 0 : POLLOUT)};
    if (poll(&p, 1, wait_ms) > 0 && (p.revents & (POLLIN | POLLERR | POLLHUP)) &&
        redisBufferRead(rc) != REDIS_OK) {
        fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
        return -1;
    }
    for (;;) {
        void *v = NULL;
        if (redisGetReplyFromReader(rc, &v) != REDIS_OK) {
            fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
            return -1;
        }
        if (!v) return 0;
        redisReply *r = v;
        int bad = r->type == REDIS_REPLY_ERROR;
        if (bad) fprintf(stderr, "kinfer bench: redis: %s\n", r->str);
        freeReplyObject(r);
        if (bad) return -1;
        (*unanswered)--;
    }
}

/* Waits until every command sent has its reply. */
static int nb_settle(redisContext *rc, size_t *unanswered, double timeout_s)
{
    double give_up = bench_mono_s() + timeout_s;
    while (*unanswered) {
        if (nb_pump(rc, unanswered, 1, 50) < 0) return -1;
        if (bench_mono_s() > give_up) {
            fprintf(stderr, "kinfer bench: redis: %zu replies missing\n", *unanswered);
            return -1;
        }
    }
    return 0;
}

/* `bench passthrough`: the least a worker with kinfer's libraries and
 * delivery path must do per job: consume a record (the worker's consumer
 * settings and group), produce its value to the reply topic (the worker's
 * producer settings, key and content-type header as the worker writes
 * them) and SET it in Redis as the sink does, on one thread. No decode,
 * batching, model or offset bookkeeping. SETs go out --pipeline at a time
 * (default max_batch_rows, the sink's batch) without waiting for earlier
 * replies, up to batching.max_queued_rows unanswered: the most the worker
 * may hold in flight. Stops after --jobs records, or --timeout seconds
 * without one. */
int bench_passthrough(const struct kcfg *c, const struct bench_opts *o)
{
    struct bench_dr_count dc = {0};
    rd_kafka_t *k = bench_consumer(c, NULL), *p = NULL;
    redisContext *rc = NULL;
    int rcode = 1;
    if (!k || !(p = bench_producer(c, &dc)) || !(rc = nb_connect(c))) goto out;
    size_t unanswered = 0, appended = 0;
    char db[16];
    snprintf(db, sizeof(db), "%d", c->redis.db);
    if (c->redis.password[0]) {
        const char *argv[] = {"AUTH", c->redis.password};
        redisAppendCommandArgv(rc, 2, argv, NULL);
        unanswered++;
    }
    if (c->redis.db) {
        const char *argv[] = {"SELECT", db};
        redisAppendCommandArgv(rc, 2, argv, NULL);
        unanswered++;
    }
    if (nb_settle(rc, &unanswered, 5) < 0) goto out;
    rd_kafka_topic_partition_list_t *t = rd_kafka_topic_partition_list_new((int)c->kafka.n_topics);
    for (size_t i = 0; i < c->kafka.n_topics; i++)
        rd_kafka_topic_partition_list_add(t, c->kafka.topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(k, t);
    rd_kafka_topic_partition_list_destroy(t);
    if (e) {
        fprintf(stderr, "kinfer bench: subscribe: %s\n", rd_kafka_err2str(e));
        goto out;
    }
    size_t pipe = o->pipeline ? o->pipeline : (size_t)c->batching.max_batch_rows;
    size_t window = (size_t)c->batching.max_queued_rows;
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%" PRId64, c->redis.ttl_ms);
    size_t handled = 0;
    int assigned = 0;
    double first = 0, idle_since = bench_mono_s();
    while (handled < o->jobs) {
        rd_kafka_message_t *m =
            unanswered >= window ? NULL : rd_kafka_consumer_poll(k, unanswered ? 0 : 20);
        if (!assigned) {
            /* Tell a script measuring latency that load may start now. */
            rd_kafka_topic_partition_list_t *a = NULL;
            if (rd_kafka_assignment(k, &a) == RD_KAFKA_RESP_ERR_NO_ERROR && a->cnt > 0) {
                assigned = 1;
                printf("passthrough: ready\n");
                fflush(stdout);
            }
            if (a) rd_kafka_topic_partition_list_destroy(a);
        }
        if (m && !m->err) {
            if (!handled) first = bench_mono_s();
            char key[64];
            const void *kp = m->key;
            size_t kl = m->key_len;
            if (!kl) {
                kl = (size_t)snprintf(key, sizeof(key), "p%" PRId32 ".%" PRId64, m->partition,
                                      m->offset);
                kp = key;
            }
            rd_kafka_resp_err_t pe;
            while ((pe = rd_kafka_producev(
                        p, RD_KAFKA_V_TOPIC(c->kafka.reply_topic), RD_KAFKA_V_KEY(kp, kl),
                        RD_KAFKA_V_VALUE(m->payload, m->len),
                        RD_KAFKA_V_HEADER("content-type", "application/msgpack", -1),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
                   RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(p, 5);
            if (pe) {
                fprintf(stderr, "kinfer bench: produce: %s\n", rd_kafka_err2str(pe));
                rd_kafka_message_destroy(m);
                goto out;
            }
            bench_append_set(rc, c, ttl, kp, kl, m->payload, m->len);
            appended++;
            unanswered++;
            handled++;
            idle_since = bench_mono_s();
        } else if (m && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            fprintf(stderr, "kinfer bench: consume: %s\n", rd_kafka_message_errstr(m));
        }
        if (m) rd_kafka_message_destroy(m);
        /* A full group of SETs (or what there is at an idle moment) goes
         * out; replies are taken as they come, waiting only when the
         * window is full. */
        int full = unanswered >= window;
        int send = appended >= pipe || (appended && (!m || full));
        if (send) appended = 0;
        if (nb_pump(rc, &unanswered, send || full, full ? 10 : 0) < 0) goto out;
        rd_kafka_poll(p, 0);
        if (!m && !full && bench_mono_s() - idle_since > o->timeout_s) break;
    }
    if (nb_settle(rc, &unanswered, 30) < 0) goto out;
    rd_kafka_flush(p, 60000);
    double secs = bench_mono_s() - first;
    printf("passthrough: messages=%zu per_s=%.0f delivered=%" PRIu64 " failed=%" PRIu64 "\n",
           handled, handled && secs > 0 ? (double)handled / secs : 0.0, dc.ok, dc.failed);
    rcode = handled == o->jobs && dc.failed == 0 ? 0 : 1;
out:
    if (k) {
        rd_kafka_consumer_close(k);
        rd_kafka_destroy(k);
    }
    if (p) rd_kafka_destroy(p);
    if (rc) redisFree(rc);
    return rcode;
}

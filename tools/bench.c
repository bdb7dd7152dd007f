/* bench.c - `kinfer bench`: load tools and floors for `make bench`. This
 * file holds what they share (bench_shared.h); the measurements are in
 * bench_load.c (produce, collect), bench_floors.c (floor-kafka,
 * floor-redis, passthrough) and bench_model.c (gemm, encode).
 *
 * The load tools measure kinfer from the outside, as a client sees it:
 * `produce` offers jobs at a fixed rate (open loop: the schedule never
 * waits for the system, and each record's timestamp is its scheduled send
 * time, so queueing anywhere shows up as latency instead of a lower
 * offered rate); `collect` notes when each job's result appears and
 * reports latency from record timestamp to result. A job's id carries
 * its send time ("<run>.<seq>.<send_us>"), so the collector needs no side
 * channel to the producer.
 *
 * The floors measure what the same libraries can do with the same bytes
 * and nothing of kinfer's in between: librdkafka produce and consume,
 * pipelined Redis SETs, a passthrough that consumes, produces and SETs
 * without decoding, and the model's forward pass alone.
 *
 * Threads: main thread only; librdkafka's delivery reports and log
 * callbacks run on it inside rd_kafka_poll / rd_kafka_flush.
 * Ownership: every client, buffer and model is made and freed by the
 * subcommand that uses it; job bodies handed to librdkafka with
 * RD_KAFKA_MSG_F_FREE belong to librdkafka from then on. */
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

/* ---- small helpers ------------------------------------------------------- */

/* Monotonic seconds, for durations measured inside one process (record
 * timestamps and result arrivals, compared across processes, are on the
 * wall clock: clock_wall_us). */
double bench_mono_s(void)
{
    return (double)clock_mono_us() / 1e6;
}

/* Sleeps until the wall clock reads us: the open-loop schedule is kept on
 * the same clock the record timestamps are written in. */
void bench_sleep_until_wall_us(int64_t us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* qsort order for doubles, for percentiles. */
int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of n sorted values (q in 0..1): the smallest
 * value with at least q of the samples at or below it, so p99 of 100
 * samples is the 99th, not an interpolation nobody observed. */
double bench_quantile(const double *sorted, size_t n, double q)
{
    if (n == 0) return NAN;
    size_t k = (size_t)ceil(q * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return sorted[k - 1];
}

/* Prints v with a fixed precision, or "-" when it is not a number, so the
 * script reading the line always finds a token after key=. */
void bench_put_num(const char *key, double v, int prec)
{
    if (isnan(v)) printf(" %s=-", key);
    else printf(" %s=%.*f", key, prec, v);
}

/* Parses a comma-separated list of positive sizes ("1,32,128") into out
 * (at most cap); returns how many, or -1 on a bad token. */
int bench_parse_size_list(const char *s, size_t *out, int cap)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v == 0 || v > 65536 || n == cap || (*end && *end != ',')) return -1;
        out[n++] = (size_t)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

/* ---- job bodies and ids --------------------------------------------------- */

/* Fills the pool from a seeded generator (uniform in [-1, 1)). Returns 0,
 * or -1 when out of memory. Borrows run. */
int bench_jobgen_init(struct bench_jobgen *g, const char *run, size_t width, size_t rows)
{
    g->text = NULL;
    g->run = run;
    g->width = width;
    g->rows = rows;
    size_t n = (BENCH_POOL_ROWS + rows) * width;
    g->pool = malloc(n * sizeof(float));
    if (!g->pool) return -1;
    uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)width;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        g->pool[i] = (float)((s * 0x2545F4914F6CDD1Dull) >> 40) / 8388608.0f - 1.0f;
    }
    return 0;
}

/* Frees the pool (the generator can be initialised again). */
void bench_jobgen_fini(struct bench_jobgen *g)
{
    free(g->pool);
    g->pool = NULL;
}

/* Encodes job seq (MessagePack, input as bin) with the id
 * "<run>.<seq>.<send_us>" written into id. *body is new (malloc'd: it may
 * be handed to librdkafka with RD_KAFKA_MSG_F_FREE). Returns 0 or -1. */
int bench_jobgen_encode(const struct bench_jobgen *g, size_t seq, int64_t send_us, char *id,
                         size_t id_cap, unsigned char **body, size_t *len)
{
    snprintf(id, id_cap, "%s.%zu.%" PRId64, g->run, seq, send_us);
    struct wire_job wj = {.id = id, .timeout_ms = -1, .priority = -1};
    const char *text;
    if (g->text) {
        text = textgen_text(g->text, seq);
        wj.text = &text;
        wj.n_text = 1;
    } else {
        wj.input = g->pool + (seq * 7 % BENCH_POOL_ROWS) * g->width;
        wj.n_input = g->rows * g->width;
    }
    return wire_encode_job(&wj, PROTO_ENC_MSGPACK, body, len);
}

/* Reads back an id jobgen made. Returns 0 and fills *seq and *send_us when
 * id (len bytes, not NUL-terminated) belongs to run, else -1. */
int bench_parse_id(const char *id, size_t len, const char *run, size_t *seq, int64_t *send_us)
{
    size_t rl = strlen(run);
    if (len <= rl + 1 || memcmp(id, run, rl) != 0 || id[rl] != '.') return -1;
    char buf[64];
    size_t rest = len - rl - 1;
    if (rest >= sizeof(buf)) return -1;
    memcpy(buf, id + rl + 1, rest);
    buf[rest] = '\0';
    char *dot, *end;
    unsigned long long s = strtoull(buf, &dot, 10);
    if (dot == buf || *dot != '.') return -1;
    long long t = strtoll(dot + 1, &end, 10);
    if (end == dot + 1 || *end) return -1;
    *seq = (size_t)s;
    *send_us = (int64_t)t;
    return 0;
}

/* A run name becomes the front of every id: letters, digits, _ and - only
 * (no dot, which separates the id's fields). */
int bench_run_valid(const char *run)
{
    size_t n = strlen(run);
    if (n == 0 || n > BENCH_RUN_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = run[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* ---- Kafka clients -------------------------------------------------------- */

/* Counts one delivery report; runs inside rd_kafka_poll/flush. */
void bench_count_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    struct bench_dr_count *dc = opaque;
    if (m->err) {
        if (!dc->failed) dc->first_err = m->err;
        dc->failed++;
    } else {
        dc->ok++;
    }
}

/* A producer with the worker's own producer settings (kq_conf_new:
 * idempotent, acks=all, linger.ms=5, plus the config's properties), so the
 * floors and the load see the client the worker uses. Borrows dc, which
 * must outlive the producer. Returns NULL after printing why. */
rd_kafka_t *bench_producer(const struct kcfg *c, struct bench_dr_count *dc)
{
    char err[512];
    rd_kafka_conf_t *conf = kq_conf_new(c, KQ_PRODUCER, err, sizeof(err));
    if (!conf) {
        fprintf(stderr, "kinfer bench: %s\n", err);
        return NULL;
    }
    rd_kafka_conf_set_opaque(conf, dc);
    rd_kafka_conf_set_dr_msg_cb(conf, bench_count_dr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "kinfer bench: producer: %s\n", err);
    }
    return rk;
}

/* A consumer with the worker's consumer settings. With group NULL it joins
 * kafka.group like the worker (passthrough); otherwise it uses group, a
 * throwaway name, and never commits: readers that assign partitions
 * themselves must not move any real group's offsets. Returns NULL after
 * printing why. */
rd_kafka_t *bench_consumer(const struct kcfg *c, const char *group)
{
    char err[512];
    rd_kafka_conf_t *conf = kq_conf_new(c, KQ_CONSUMER, err, sizeof(err));
    if (!conf) {
        fprintf(stderr, "kinfer bench: %s\n", err);
        return NULL;
    }
    if (group && (kq_set(conf, "group.id", group, err, sizeof(err)) < 0 ||
                  kq_set(conf, "enable.auto.commit", "false", err, sizeof(err)) < 0)) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "kinfer bench: %s\n", err);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "kinfer bench: consumer: %s\n", err);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk);
    return rk;
}

/* Assigns every partition of topic to rk without a group join (seconds
 * saved per measurement), from the beginning or, with at_end, from each
 * partition's current end (so a collector sees only what comes after it
 * said ready). Returns 0, or -1 after printing why. */
int bench_assign_topic(rd_kafka_t *rk, const char *topic, int at_end)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rkt ? rd_kafka_metadata(rk, 0, rkt, &md, 10000)
                                  : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    if (rkt) rd_kafka_topic_destroy(rkt);
    if (!err && (md->topic_cnt != 1 || md->topics[0].err)) err = md->topic_cnt == 1
        ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    if (err) {
        fprintf(stderr, "kinfer bench: metadata of %s: %s\n", topic, rd_kafka_err2str(err));
        if (md) rd_kafka_metadata_destroy(md);
        return -1;
    }
    int n = md->topics[0].partition_cnt;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int32_t p = md->topics[0].partitions[i].id;
        int64_t lo = 0, hi = RD_KAFKA_OFFSET_BEGINNING;
        if (at_end && (err = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000))) {
            fprintf(stderr, "kinfer bench: end of %s [%" PRId32 "]: %s\n", topic, p,
                    rd_kafka_err2str(err));
            rc = -1;
        }
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = hi;
    }
    rd_kafka_metadata_destroy(md);
    if (rc == 0 && (err = rd_kafka_assign(rk, l))) {
        fprintf(stderr, "kinfer bench: assign %s: %s\n", topic, rd_kafka_err2str(err));
        rc = -1;
    }
    rd_kafka_topic_partition_list_destroy(l);
    return rc;
}

/* Produces one record, serving delivery reports while librdkafka's queue is
 * full (the producer is never the one to drop work). flags as for
 * rd_kafka_producev; with RD_KAFKA_MSG_F_FREE, val belongs to librdkafka
 * once this returns 0. ts_ms 0 lets librdkafka stamp the record. */
int bench_produce_one(rd_kafka_t *rk, const char *topic, const void *key, size_t key_len,
                       void *val, size_t len, int64_t ts_ms, int flags)
{
    rd_kafka_resp_err_t e;
    while ((e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                                  RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE(val, len),
                                  RD_KAFKA_V_TIMESTAMP(ts_ms), RD_KAFKA_V_MSGFLAGS(flags),
                                  RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
        rd_kafka_poll(rk, 5);
    if (e) {
        fprintf(stderr, "kinfer bench: produce to %s: %s\n", topic, rd_kafka_err2str(e));
        return -1;
    }
    return 0;
}

/* ---- Redis ---------------------------------------------------------------- */

/* Connects to the worker's Redis (redis.* settings: AUTH and SELECT when
 * configured, the command timeout applied). Returns a new context or NULL
 * after printing why; a context that saw an error is thrown away, never
 * reused (hiredis 0.14). */
redisContext *bench_redis(const struct kcfg *c)
{
    int ms = c->redis.timeout_ms > 0 ? c->redis.timeout_ms : 2000;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    redisContext *rc = redisConnectWithTimeout(c->redis.host, c->redis.port, tv);
    if (!rc || rc->err) {
        fprintf(stderr, "kinfer bench: redis %s:%d: %s\n", c->redis.host, c->redis.port,
                rc ? rc->errstr : "out of memory");
        if (rc) redisFree(rc);
        return NULL;
    }
    redisSetTimeout(rc, tv);
    char db[16];
    snprintf(db, sizeof(db), "%d", c->redis.db);
    const char *auth[] = {"AUTH", c->redis.password}, *sel[] = {"SELECT", db};
    for (int k = 0; k < 2; k++) {
        if (k == 0 && !c->redis.password[0]) continue;
        if (k == 1 && c->redis.db == 0) continue;
        redisReply *r = redisCommandArgv(rc, 2, k ? sel : auth, NULL);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        if (bad)
            fprintf(stderr, "kinfer bench: redis %s: %s\n", k ? "SELECT" : "AUTH",
                    r ? r->str : rc->errstr);
        if (r) freeReplyObject(r);
        if (bad) {
            redisFree(rc);
            return NULL;
        }
    }
    return rc;
}

/* Reads n pipelined replies; returns 0 when none was an error. */
int bench_read_replies(redisContext *rc, size_t n)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        void *v = NULL;
        if (redisGetReply(rc, &v) != REDIS_OK) {
            fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
            return -1;
        }
        redisReply *r = v;
        if (r->type == REDIS_REPLY_ERROR) {
            if (ok) fprintf(stderr, "kinfer bench: redis: %s\n", r->str);
            ok = 0;
        }
        freeReplyObject(r);
    }
    return ok ? 0 : -1;
}

/* Appends SET <prefix><key> <body> PX <ttl_ms>: the command the worker's
 * sink sends for every result. */
void bench_append_set(redisContext *rc, const struct kcfg *c, const char *ttl,
                       const void *key, size_t key_len, const void *body, size_t len)
{
    char k[512];
    size_t pl = strlen(c->redis.key_prefix);
    if (pl + key_len > sizeof(k)) key_len = sizeof(k) - pl;
    memcpy(k, c->redis.key_prefix, pl);
    memcpy(k + pl, key, key_len);
    const char *argv[] = {"SET", k, body, "PX", ttl};
    size_t lens[] = {3, pl + key_len, len, 2, strlen(ttl)};
    redisAppendCommandArgv(rc, 5, argv, lens);
}

/* ---- produce --------------------------------------------------------------- */

/* The default model, on the configured runtime with `threads` OpenBLAS
 * threads, or (cpu set) on the CPU with the defaults: what the load tools
 * read of it (its width, an encoder's tokenizer). Returns it with *rt
 * set, or NULL with the reason printed. */
struct model *bench_load_default_model(const struct kcfg *c, int cpu, int threads,
                                        struct model_runtime **rt)
{
    char err[512];
    struct model_runtime_conf rconf;
    const struct model_spec *spec = &c->models[cfg_model_index(c, c->default_model)];
    if (cpu) {
        model_runtime_conf_defaults(&rconf);
        rconf.backend = "cpu";
    } else {
        cfg_model_runtime(c, &rconf);
        rconf.cpu_threads = threads;
        rconf.specs = spec; /* gpu.precision "auto": the format of the model measured */
        rconf.n_specs = 1;
    }
    *rt = model_runtime_new(&rconf, err, sizeof(err));
    struct model *m = *rt ? model_load(*rt, spec, err, sizeof(err)) : NULL;
    if (!m) {
        fprintf(stderr, "kinfer bench: %s\n", err);
        model_runtime_destroy(*rt);
        *rt = NULL;
    }
    return m;
}

/* The width jobs are made with: --width, else the default model's input
 * width (read by loading it, as the worker will). Returns 0 on failure. */
size_t bench_job_width(const struct kcfg *c, const struct bench_opts *o)
{
    if (o->width) return o->width;
    struct model_runtime *rt;
    struct model *m = bench_load_default_model(c, 1, 0, &rt);
    size_t w = m ? model_input_width(m) : 0;
    model_destroy(m);
    model_runtime_destroy(rt);
    return w;
}

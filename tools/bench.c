/* bench.c - `kinfer bench`: load tools and floors for `make bench`.
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
#include "../text/wordpiece.h"
#include "textgen.h"
#include "../config/config.h"
#include "../worker/kq.h"
#include "../base/log.h"

#define POOL_ROWS 64          /* distinct random input rows jobs are cut from */
#define FLOOR_POOL 1024       /* distinct bodies the floors cycle through */

/* ---- small helpers ------------------------------------------------------- */

/* Monotonic seconds, for durations measured inside one process (record
 * timestamps and result arrivals, compared across processes, are on the
 * wall clock: clock_wall_us). */
static double bench_mono_s(void)
{
    return (double)clock_mono_us() / 1e6;
}

/* Sleeps until the wall clock reads us: the open-loop schedule is kept on
 * the same clock the record timestamps are written in. */
static void sleep_until_wall_us(int64_t us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* qsort order for doubles, for percentiles. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of n sorted values (q in 0..1): the smallest
 * value with at least q of the samples at or below it, so p99 of 100
 * samples is the 99th, not an interpolation nobody observed. */
static double quantile(const double *sorted, size_t n, double q)
{
    if (n == 0) return NAN;
    size_t k = (size_t)ceil(q * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return sorted[k - 1];
}

/* Prints v with a fixed precision, or "-" when it is not a number, so the
 * script reading the line always finds a token after key=. */
static void put_num(const char *key, double v, int prec)
{
    if (isnan(v)) printf(" %s=-", key);
    else printf(" %s=%.*f", key, prec, v);
}

/* Parses a comma-separated list of positive sizes ("1,32,128") into out
 * (at most cap); returns how many, or -1 on a bad token. */
static int parse_size_list(const char *s, size_t *out, int cap)
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

/* What produce and the floors encode: random input rows, cut from a pool
 * so encoding a job costs one copy, not a random draw per float. */
struct jobgen {
    const char *run;
    size_t width, rows;
    float *pool;         /* (POOL_ROWS + rows) x width */
    struct textgen *text; /* an encoder's: text jobs instead (borrowed) */
};

/* Fills the pool from a seeded generator (uniform in [-1, 1)). Returns 0,
 * or -1 when out of memory. Borrows run. */
static int jobgen_init(struct jobgen *g, const char *run, size_t width, size_t rows)
{
    g->text = NULL;
    g->run = run;
    g->width = width;
    g->rows = rows;
    size_t n = (POOL_ROWS + rows) * width;
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
static void jobgen_fini(struct jobgen *g)
{
    free(g->pool);
    g->pool = NULL;
}

/* Encodes job seq (MessagePack, input as bin) with the id
 * "<run>.<seq>.<send_us>" written into id. *body is new (malloc'd: it may
 * be handed to librdkafka with RD_KAFKA_MSG_F_FREE). Returns 0 or -1. */
static int jobgen_encode(const struct jobgen *g, size_t seq, int64_t send_us, char *id,
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
        wj.input = g->pool + (seq * 7 % POOL_ROWS) * g->width;
        wj.n_input = g->rows * g->width;
    }
    return wire_encode_job(&wj, PROTO_ENC_MSGPACK, body, len);
}

/* Reads back an id jobgen made. Returns 0 and fills *seq and *send_us when
 * id (len bytes, not NUL-terminated) belongs to run, else -1. */
static int parse_id(const char *id, size_t len, const char *run, size_t *seq, int64_t *send_us)
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

/* Delivery outcomes, counted by the report callback. */
struct dr_count {
    uint64_t ok, failed;
    rd_kafka_resp_err_t first_err;
};

/* Counts one delivery report; runs inside rd_kafka_poll/flush. */
static void count_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    struct dr_count *dc = opaque;
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
static rd_kafka_t *bench_producer(const struct kcfg *c, struct dr_count *dc)
{
    char err[512];
    rd_kafka_conf_t *conf = kq_conf_new(c, KQ_PRODUCER, err, sizeof(err));
    if (!conf) {
        fprintf(stderr, "kinfer bench: %s\n", err);
        return NULL;
    }
    rd_kafka_conf_set_opaque(conf, dc);
    rd_kafka_conf_set_dr_msg_cb(conf, count_dr);
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
static rd_kafka_t *bench_consumer(const struct kcfg *c, const char *group)
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
static int assign_topic(rd_kafka_t *rk, const char *topic, int at_end)
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
static int produce_one(rd_kafka_t *rk, const char *topic, const void *key, size_t key_len,
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
static redisContext *bench_redis(const struct kcfg *c)
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
static int read_replies(redisContext *rc, size_t n)
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
static void append_set(redisContext *rc, const struct kcfg *c, const char *ttl,
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
static struct model *load_default_model(const struct kcfg *c, int cpu, int threads,
                                        struct model_runtime **rt)
{
    char err[512];
    struct model_runtime_conf rconf;
    if (cpu) {
        model_runtime_conf_defaults(&rconf);
        rconf.backend = "cpu";
    } else {
        cfg_model_runtime(c, &rconf);
        rconf.cpu_threads = threads;
    }
    *rt = model_runtime_new(&rconf, err, sizeof(err));
    struct model *m =
        *rt ? model_load(*rt, &c->models[cfg_model_index(c, c->default_model)], err, sizeof(err))
            : NULL;
    if (!m) {
        fprintf(stderr, "kinfer bench: %s\n", err);
        model_runtime_destroy(*rt);
        *rt = NULL;
    }
    return m;
}

/* The width jobs are made with: --width, else the default model's input
 * width (read by loading it, as the worker will). Returns 0 on failure. */
static size_t job_width(const struct kcfg *c, const struct bench_opts *o)
{
    if (o->width) return o->width;
    struct model_runtime *rt;
    struct model *m = load_default_model(c, 1, 0, &rt);
    size_t w = m ? model_input_width(m) : 0;
    model_destroy(m);
    model_runtime_destroy(rt);
    return w;
}

/* Sends one job of a run of its own ("<run>-warmup") and waits for its
 * acknowledgement, so the schedule starts with a connected producer that
 * has its idempotence id: otherwise the first second of a measurement
 * would time the producer's start-up, not the system under test. */
static int produce_warmup(rd_kafka_t *rk, const struct jobgen *g, const char *topic)
{
    char run[BENCH_RUN_MAX + 16], id[128];
    snprintf(run, sizeof(run), "%s-warmup", g->run);
    struct jobgen w = *g;
    w.run = run;
    unsigned char *body;
    size_t len;
    int64_t now = clock_wall_us();
    if (jobgen_encode(&w, 0, now, id, sizeof(id), &body, &len) < 0) return -1;
    if (produce_one(rk, topic, id, strlen(id), body, len, now / 1000, RD_KAFKA_MSG_F_FREE) < 0) {
        free(body);
        return -1;
    }
    if (rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kinfer bench: the warm-up job was not acknowledged in 30 s\n");
        return -1;
    }
    return 0;
}

/* `bench produce`: sends --jobs jobs to the first input topic at --rate
 * jobs/s on a fixed schedule (job i is due at start + i/rate whatever
 * happened before), record key = id, record timestamp = the due time. A
 * producer running late sends at once with the due timestamp, so its own
 * lag counts as latency and is reported as max_lag_ms. */
int bench_produce(const struct kcfg *c, const struct bench_opts *o)
{
    struct dr_count dc = {0};
    struct jobgen g = {0};
    struct textgen tg = {0};
    struct model_runtime *mrt = NULL;
    struct model *dm = o->width ? NULL : load_default_model(c, 1, 0, &mrt);
    const struct model_encoder_info *enc = dm ? model_encoder(dm) : NULL;
    size_t width = o->width ? o->width : dm ? model_input_width(dm) : 0;
    int ok = enc ? textgen_init(&tg, enc) == 0 && jobgen_init(&g, o->run, 1, 1) == 0
                 : width && jobgen_init(&g, o->run, width, o->rows) == 0;
    if (enc) g.text = &tg;
    if (!ok) {
        textgen_fini(&tg);
        jobgen_fini(&g);
        model_destroy(dm);
        model_runtime_destroy(mrt);
        return 1;
    }
    rd_kafka_t *rk = bench_producer(c, &dc);
    int rc = 1;
    if (!rk) goto out;
    const char *topic = c->kafka.topics[0];
    size_t bytes = 0;
    if (o->rate > 0) {
        if (produce_warmup(rk, &g, topic) < 0) goto out;
        dc.ok = 0; /* count the run's own jobs only */
    }
    int64_t max_lag = 0, start = clock_wall_us() + 2000;
    double t0 = bench_mono_s();
    for (size_t i = 0; i < o->jobs; i++) {
        int64_t due = clock_wall_us();
        if (o->rate > 0) {
            due = start + (int64_t)((double)i * 1e6 / o->rate);
            int64_t now = clock_wall_us();
            if (due > now) sleep_until_wall_us(due);
            else if (now - due > max_lag) max_lag = now - due;
        }
        char id[128];
        unsigned char *body;
        size_t len;
        if (jobgen_encode(&g, i, due, id, sizeof(id), &body, &len) < 0) {
            fprintf(stderr, "kinfer bench: cannot encode a job\n");
            goto out;
        }
        bytes += len;
        if (produce_one(rk, topic, id, strlen(id), body, len, due / 1000,
                        RD_KAFKA_MSG_F_FREE) < 0) {
            free(body);
            goto out;
        }
        rd_kafka_poll(rk, 0);
    }
    double sent_s = bench_mono_s() - t0;
    rd_kafka_flush(rk, 60000);
    double acked_s = bench_mono_s() - t0;
    printf("produce: run=%s topic=%s jobs=%zu rows=%zu width=%zu mean_bytes=%.0f", o->run,
           topic, o->jobs, o->rows, width, o->jobs ? (double)bytes / (double)o->jobs : 0.0);
    put_num("offered_per_s", o->rate > 0 ? o->rate : NAN, 0);
    printf(" sent_per_s=%.0f acked_per_s=%.0f max_lag_ms=%.1f delivered=%" PRIu64
           " failed=%" PRIu64 "\n", (double)o->jobs / sent_s, (double)o->jobs / acked_s,
           (double)max_lag / 1000.0, dc.ok, dc.failed);
    if (dc.failed)
        fprintf(stderr, "kinfer bench: %" PRIu64 " deliveries failed, first: %s\n", dc.failed,
                rd_kafka_err2str(dc.first_err));
    rc = dc.failed || dc.ok != o->jobs ? 1 : 0;
out:
    if (rk) rd_kafka_destroy(rk);
    jobgen_fini(&g);
    textgen_fini(&tg);
    model_destroy(dm);
    model_runtime_destroy(mrt);
    return rc;
}

/* ---- collect ---------------------------------------------------------------- */

/* What the results of a run say about batching, summed as they are read. A
 * job's result carries its batch's rows and run time; a batch of B rows is
 * seen once per job in it, so each sighting weighs rows/B of a batch. */
struct rstats {
    size_t ok, errors;
    char first_error[64];
    double batches, rows, full_batches, infer_ms, queued_ms, total_ms;
    int64_t max_batch_rows;
};

/* Adds one decoded result. max_rows is batching.max_batch_rows: a batch
 * that reached it closed on size; with one-row jobs any smaller batch
 * closed on time (wait or deadline) or at drain. */
static void rstats_add(struct rstats *s, const struct wire_result *r, size_t max_rows)
{
    if (!r->ok) {
        if (!s->errors) snprintf(s->first_error, sizeof(s->first_error), "%s", r->code);
        s->errors++;
        return;
    }
    s->ok++;
    if (r->batch_rows <= 0) return;
    double w = (double)r->rows / (double)r->batch_rows;
    s->batches += w;
    s->rows += (double)r->rows;
    if ((size_t)r->batch_rows >= max_rows) s->full_batches += w;
    s->infer_ms += w * r->infer_ms;
    s->queued_ms += r->queued_ms;
    s->total_ms += r->total_ms;
    if (r->batch_rows > s->max_batch_rows) s->max_batch_rows = r->batch_rows;
}

/* One run's arrivals: per sequence number its send and arrival time (0 =
 * not arrived), plus what its result bodies said. */
struct collect {
    const struct kcfg *cfg;
    const struct bench_opts *o;
    size_t n, got;
    int64_t *send_us, *arr_us;
    unsigned char *fetched;   /* body read and counted */
    struct rstats st;
};

/* Notes that the result of id arrived at now_us; duplicates and ids of
 * other runs are ignored. Returns the sequence number when new, else -1. */
static long collect_note(struct collect *s, const char *id, size_t len, int64_t now_us)
{
    size_t seq;
    int64_t send;
    if (parse_id(id, len, s->o->run, &seq, &send) < 0 || seq >= s->n || s->arr_us[seq])
        return -1;
    s->send_us[seq] = send;
    s->arr_us[seq] = now_us > 0 ? now_us : 1;
    s->got++;
    return (long)seq;
}

/* Decodes a result body and counts it once per sequence number. */
static void collect_body(struct collect *s, size_t seq, const void *body, size_t len)
{
    if (seq >= s->n || s->fetched[seq]) return;
    struct wire_result r;
    char err[256];
    if (wire_decode_result(body, len, &r, err, sizeof(err)) < 0) {
        if (!s->st.errors) snprintf(s->st.first_error, sizeof(s->st.first_error), "undecodable");
        s->st.errors++;
    } else {
        rstats_add(&s->st, &r, (size_t)s->cfg->batching.max_batch_rows);
        wire_result_fini(&r);
    }
    s->fetched[seq] = 1;
}

/* Tells the script this collector is listening: nothing sent before this
 * line can be missed. */
static void say_ready(void)
{
    printf("collect: ready\n");
    fflush(stdout);
}

/* Handles one pub/sub push: ["message", channel, key] for each SET. */
static void on_keyevent(struct collect *s, redisReply *r, size_t plen, int64_t now_us)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *k = r->element[2];
    if ((size_t)k->len <= plen || memcmp(k->str, s->cfg->redis.key_prefix, plen) != 0) return;
    collect_note(s, k->str + plen, (size_t)k->len - plen, now_us);
}

/* Waits for results by Redis keyspace events: every SET publishes its key
 * on __keyevent@<db>__:set when the server has notify-keyspace-events with
 * E and $ (or A), so each result is seen the moment it is in Redis without
 * polling. The server must have that setting (bench/run.sh turns it on);
 * this refuses to run without it rather than wait for nothing. */
static int collect_keyevents(struct collect *s)
{
    const struct kcfg *c = s->cfg;
    redisContext *rc = bench_redis(c);
    if (!rc) return -1;
    int rcode = -1;
    redisReply *r = redisCommand(rc, "CONFIG GET notify-keyspace-events");
    const char *ev = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                             r->element[1]->type == REDIS_REPLY_STRING
                         ? r->element[1]->str : "";
    if (!strchr(ev, 'E') || !(strchr(ev, '$') || strchr(ev, 'A'))) {
        fprintf(stderr, "kinfer bench: redis %s:%d has notify-keyspace-events=\"%s\": "
                "collect --from redis needs E$ (redis-cli CONFIG SET notify-keyspace-events E$)"
                " or use --from topic\n", c->redis.host, c->redis.port, ev);
        if (r) freeReplyObject(r);
        goto out;
    }
    freeReplyObject(r);
    char ch[64];
    snprintf(ch, sizeof(ch), "__keyevent@%d__:set", c->redis.db);
    r = redisCommand(rc, "SUBSCRIBE %s", ch);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "kinfer bench: SUBSCRIBE %s: %s\n", ch, r ? r->str : rc->errstr);
        if (r) freeReplyObject(r);
        goto out;
    }
    freeReplyObject(r);
    say_ready();
    size_t plen = strlen(c->redis.key_prefix);
    double give_up = bench_mono_s() + s->o->timeout_s;
    int64_t now = clock_wall_us();
    while (s->got < s->n && bench_mono_s() < give_up) {
        void *v = NULL;
        if (redisGetReplyFromReader(rc, &v) != REDIS_OK) {
            fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
            goto out;
        }
        if (v) {
            on_keyevent(s, v, plen, now);
            freeReplyObject(v);
            continue;
        }
        /* Nothing buffered: wait for the socket. The arrival time of what
         * comes is the moment it became readable. */
        struct pollfd p = {.fd = rc->fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) {
            now = clock_wall_us();
            if (redisBufferRead(rc) != REDIS_OK) {
                fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
                goto out;
            }
        }
    }
    rcode = 0;
out:
    redisFree(rc);
    return rcode;
}

/* Waits for results by reading the reply topic from its current end, with
 * partitions assigned directly (no group join to wait for); decodes each
 * body as it comes. The arrival time includes the consumer's fetch wait,
 * which the embedded broker always serves in full. */
static int collect_topic(struct collect *s)
{
    const struct kcfg *c = s->cfg;
    char group[128];
    snprintf(group, sizeof(group), "kinfer-bench-collect-%d", (int)getpid());
    rd_kafka_t *rk = bench_consumer(c, group);
    if (!rk) return -1;
    int rcode = -1;
    if (assign_topic(rk, c->kafka.reply_topic, 1) < 0) goto out;
    /* librdkafka starts fetching newly assigned partitions at its broker
     * thread's next wake-up, up to about a second later: results produced
     * before that would be timed late. Poll through it first. */
    for (double settle = bench_mono_s() + 1.5; bench_mono_s() < settle;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (m) rd_kafka_message_destroy(m);
    }
    say_ready();
    double give_up = bench_mono_s() + s->o->timeout_s;
    while (s->got < s->n && bench_mono_s() < give_up) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        int64_t now = clock_wall_us();
        if (!m->err && m->key) {
            long seq = collect_note(s, m->key, m->key_len, now);
            if (seq >= 0) collect_body(s, (size_t)seq, m->payload, m->len);
        }
        rd_kafka_message_destroy(m);
    }
    rcode = 0;
out:
    rd_kafka_destroy(rk);
    return rcode;
}

/* Waits for results by counting keys (DBSIZE above its value at start,
 * every 5 ms): no per-result work at all, for measuring saturation without
 * the collector competing for the CPU. Arrival times are the poll at which
 * the count passed each sequence number, in order: good for throughput,
 * meaningless for latency (which is then not reported). Anything else
 * writing keys meanwhile is counted too: use a database of its own. */
static int collect_dbsize(struct collect *s)
{
    redisContext *rc = bench_redis(s->cfg);
    if (!rc) return -1;
    int rcode = -1;
    long long base = -1;
    double give_up = bench_mono_s() + s->o->timeout_s;
    size_t seen = 0;
    while (seen < s->n && bench_mono_s() < give_up) {
        redisReply *r = redisCommand(rc, "DBSIZE");
        int64_t now = clock_wall_us();
        if (!r || r->type != REDIS_REPLY_INTEGER) {
            fprintf(stderr, "kinfer bench: DBSIZE: %s\n", r ? r->str : rc->errstr);
            if (r) freeReplyObject(r);
            goto out;
        }
        if (base < 0) {
            base = r->integer; /* counted from here: ready only now */
            say_ready();
        }
        long long cnt = r->integer - base;
        freeReplyObject(r);
        while (cnt > 0 && seen < (size_t)cnt && seen < s->n) s->arr_us[seen++] = now;
        if (seen < s->n) usleep(5000);
    }
    s->got = seen;
    rcode = 0;
out:
    redisFree(rc);
    return rcode;
}

/* One SCAN pass over the run's keys with pipelined GETs of those not read
 * yet; *fetched counts the bodies read so far. Returns 0 or -1. */
static int fetch_pass(struct collect *s, redisContext *rc, size_t *fetched)
{
    const struct kcfg *c = s->cfg;
    char pattern[600], cursor[32] = "0";
    snprintf(pattern, sizeof(pattern), "%s%s.*", c->redis.key_prefix, s->o->run);
    size_t plen = strlen(c->redis.key_prefix);
    do {
        redisReply *r = redisCommand(rc, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            fprintf(stderr, "kinfer bench: SCAN: %s\n", r ? "unexpected reply" : rc->errstr);
            if (r) freeReplyObject(r);
            return -1;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        size_t *seqs = malloc((keys->elements + 1) * sizeof(size_t));
        if (!seqs) {
            freeReplyObject(r);
            return -1;
        }
        size_t asked = 0;
        for (size_t i = 0; i < keys->elements; i++) {
            const redisReply *k = keys->element[i];
            size_t seq;
            int64_t send;
            if ((size_t)k->len <= plen ||
                parse_id(k->str + plen, (size_t)k->len - plen, s->o->run, &seq, &send) < 0 ||
                seq >= s->n || s->fetched[seq])
                continue;
            const char *argv[] = {"GET", k->str};
            size_t lens[] = {3, (size_t)k->len};
            redisAppendCommandArgv(rc, 2, argv, lens);
            seqs[asked++] = seq;
        }
        freeReplyObject(r);
        for (size_t i = 0; i < asked; i++) {
            void *v = NULL;
            if (redisGetReply(rc, &v) != REDIS_OK) {
                fprintf(stderr, "kinfer bench: GET: %s\n", rc->errstr);
                free(seqs);
                return -1;
            }
            redisReply *b = v;
            if (b->type == REDIS_REPLY_STRING && !s->fetched[seqs[i]]) {
                collect_body(s, seqs[i], b->str, (size_t)b->len);
                (*fetched)++;
            }
            freeReplyObject(b);
        }
        free(seqs);
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

/* Reads the run's result bodies from Redis after the fact, for the
 * batching figures, on a connection of its own (a subscriber's cannot send
 * commands). A key count can run ahead of the results (the worker writes
 * other keys too, such as its heartbeat), so passes repeat until every
 * result is read or the timeout; got becomes the number read. */
static int collect_fetch(struct collect *s)
{
    redisContext *rc = bench_redis(s->cfg);
    if (!rc) return -1;
    size_t fetched = 0;
    int rcode = 0;
    double give_up = bench_mono_s() + s->o->timeout_s;
    while ((rcode = fetch_pass(s, rc, &fetched)) == 0 && fetched < s->n &&
           bench_mono_s() < give_up)
        usleep(20000);
    redisFree(rc);
    s->got = fetched;
    return rcode;
}

/* Writes one line per result, "seq send_us arrival_us latency_ms", for
 * looking at a run's latency over time (which jobs were slow, and when).
 * Returns 0, or -1 when the file cannot be written. */
static int collect_dump(const struct collect *s, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kinfer bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    for (size_t i = 0; i < s->n; i++)
        if (s->arr_us[i])
            fprintf(f, "%zu %" PRId64 " %" PRId64 " %.3f\n", i, s->send_us[i], s->arr_us[i],
                    (double)(s->arr_us[i] - s->send_us[i]) / 1000.0);
    return fclose(f) == 0 ? 0 : -1;
}

/* Prints the collect line: counts, throughput between the 10th and 90th
 * percentile arrivals (start-up and tail left out), latency percentiles
 * from record timestamp to result, and what the bodies said. */
static void collect_report(const struct collect *s, int have_latency)
{
    double *lat = malloc((s->got + 1) * sizeof(double));
    double *arr = malloc((s->got + 1) * sizeof(double));
    size_t k = 0;
    for (size_t i = 0; lat && arr && i < s->n; i++) {
        if (!s->arr_us[i]) continue;
        arr[k] = (double)s->arr_us[i] / 1e6;
        lat[k++] = (double)(s->arr_us[i] - s->send_us[i]) / 1000.0;
    }
    qsort(lat, k, sizeof(double), cmp_double);
    qsort(arr, k, sizeof(double), cmp_double);
    double rate = NAN;
    if (k >= 10) {
        size_t a = k / 10, b = k - 1 - k / 10;
        if (arr[b] > arr[a]) rate = (double)(b - a) / (arr[b] - arr[a]);
    }
    const struct rstats *st = &s->st;
    printf("collect: run=%s from=%s expected=%zu got=%zu missing=%zu", s->o->run, s->o->from,
           s->n, s->got, s->n - s->got);
    put_num("per_s", rate, 0);
    put_num("span_s", k > 1 ? arr[k - 1] - arr[0] : NAN, 2);
    put_num("p50_ms", have_latency ? quantile(lat, k, 0.50) : NAN, 2);
    put_num("p90_ms", have_latency ? quantile(lat, k, 0.90) : NAN, 2);
    put_num("p99_ms", have_latency ? quantile(lat, k, 0.99) : NAN, 2);
    put_num("max_ms", have_latency ? quantile(lat, k, 1.0) : NAN, 2);
    printf(" ok=%zu errors=%zu first_error=%s", st->ok, st->errors,
           st->first_error[0] ? st->first_error : "-");
    int hb = st->batches > 0;
    put_num("batches", hb ? st->batches : NAN, 0);
    put_num("mean_batch_rows", hb ? st->rows / st->batches : NAN, 2);
    printf(" max_batch_rows=%" PRId64, st->max_batch_rows);
    put_num("full_batch_pct", hb ? 100.0 * st->full_batches / st->batches : NAN, 1);
    put_num("batch_infer_ms", hb ? st->infer_ms / st->batches : NAN, 3);
    put_num("queued_ms", st->ok ? st->queued_ms / (double)st->ok : NAN, 2);
    put_num("worker_total_ms", st->ok ? st->total_ms / (double)st->ok : NAN, 2);
    printf("\n");
    fflush(stdout);
    free(lat);
    free(arr);
}

/* `bench collect`: waits for the --jobs results of --run, then reports.
 * Exits 0 only when every result arrived (and, when bodies were read,
 * none was an error). */
int bench_collect(const struct kcfg *c, const struct bench_opts *o)
{
    struct collect s = {.cfg = c, .o = o, .n = o->jobs};
    s.send_us = calloc(s.n, sizeof(int64_t));
    s.arr_us = calloc(s.n, sizeof(int64_t));
    s.fetched = calloc(s.n, 1);
    int rc = 1, r;
    if (!s.send_us || !s.arr_us || !s.fetched) goto out;
    int from_topic = strcmp(o->from, "topic") == 0, by_count = strcmp(o->from, "dbsize") == 0;
    if (from_topic) r = collect_topic(&s);
    else if (by_count) r = collect_dbsize(&s);
    else if (strcmp(o->from, "redis") == 0) r = collect_keyevents(&s);
    else {
        fprintf(stderr, "kinfer bench collect: --from must be redis, topic or dbsize\n");
        goto out;
    }
    if (r < 0) goto out;
    if (!from_topic && !o->no_fetch && collect_fetch(&s) < 0) goto out;
    collect_report(&s, !by_count);
    if (o->dump && collect_dump(&s, o->dump) < 0) goto out;
    rc = s.got == s.n && s.st.errors == 0 ? 0 : 1;
out:
    free(s.send_us);
    free(s.arr_us);
    free(s.fetched);
    return rc;
}

/* ---- floors ------------------------------------------------------------------ */

/* FLOOR_POOL encoded job bodies with their ids as keys: the floors send the
 * same bytes the load does, without paying for encoding while timed. */
struct bodies {
    unsigned char *body[FLOOR_POOL];
    size_t len[FLOOR_POOL];
    char id[FLOOR_POOL][96];
    size_t bytes;    /* sum of len over the pool */
};

/* Encodes the pool; returns 0 or -1. Free with bodies_fini even on error. */
static int bodies_init(struct bodies *b, const struct kcfg *c, const struct bench_opts *o)
{
    memset(b, 0, sizeof(*b));
    struct jobgen g;
    size_t width = job_width(c, o);
    if (!width || jobgen_init(&g, o->run, width, o->rows) < 0) return -1;
    int rc = 0;
    int64_t now = clock_wall_us();
    for (size_t i = 0; i < FLOOR_POOL && rc == 0; i++) {
        rc = jobgen_encode(&g, i, now, b->id[i], sizeof(b->id[i]), &b->body[i], &b->len[i]);
        b->bytes += b->len[i];
    }
    jobgen_fini(&g);
    return rc;
}

/* Frees every body encoded so far (unused slots are NULL). */
static void bodies_fini(struct bodies *b)
{
    for (size_t i = 0; i < FLOOR_POOL; i++) free(b->body[i]);
}

/* `bench floor-kafka`: produces --jobs job records to the first input
 * topic as fast as librdkafka takes them (worker's producer settings, no
 * copy, timed to the last acknowledgement), then reads them back with a
 * consumer on the worker's settings (timed from the first record to the
 * last, so start-up is left out). */
int bench_floor_kafka(const struct kcfg *c, const struct bench_opts *o)
{
    struct bodies *b = malloc(sizeof(*b));
    struct dr_count dc = {0};
    rd_kafka_t *p = NULL, *k = NULL;
    int rc = 1;
    if (!b || bodies_init(b, c, o) < 0) goto out;
    const char *topic = c->kafka.topics[0];
    if (!(p = bench_producer(c, &dc))) goto out;
    double t0 = bench_mono_s();
    for (size_t i = 0; i < o->jobs; i++) {
        size_t j = i % FLOOR_POOL;
        if (produce_one(p, topic, b->id[j], strlen(b->id[j]), b->body[j], b->len[j], 0, 0) < 0)
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
    if (!(k = bench_consumer(c, group)) || assign_topic(k, topic, 0) < 0) goto out;
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
           "consume_per_s=%.0f\n", topic, o->jobs, (double)b->bytes / FLOOR_POOL,
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
            append_set(rc, c, ttl, key, (size_t)kl, b->body[i % FLOOR_POOL],
                       b->len[i % FLOOR_POOL]);
        }
        if (read_replies(rc, n) < 0) goto out;
    }
    double secs = bench_mono_s() - t0;
    printf("floor-redis: sets=%zu mean_bytes=%.0f pipeline=%zu sets_per_s=%.0f\n", o->jobs,
           (double)b->bytes / FLOOR_POOL, pipe, (double)o->jobs / secs);
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
    struct dr_count dc = {0};
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
            append_set(rc, c, ttl, kp, kl, m->payload, m->len);
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

/* `bench gemm`: the default model's forward pass alone (model_forward, the
 * code the executor runs, so bias and activation are in), for each batch
 * size in --batch, --seconds each after a warm-up, on --threads OpenBLAS
 * threads, in --parallel threads at once (each with its own buffers, as
 * the worker's executors): the compute floor a worker can at best reach
 * with that layout. */
struct gemm_run {
    struct model *m;
    unsigned slot;          /* the workspace's executor number */
    size_t batch;
    double seconds;
    pthread_barrier_t *start;
    size_t calls;
    double elapsed_s;
    int rc;
};

static void *gemm_thread(void *arg)
{
    struct gemm_run *g = arg;
    size_t in_w = model_input_width(g->m);
    char err[256];
    struct model_ws *ws = model_ws_new(g->m, g->slot, g->batch, err, sizeof(err));
    if (!ws) fprintf(stderr, "kinfer bench gemm: %s\n", err);
    float *in = malloc(g->batch * in_w * sizeof(float));
    const float *out;
    g->rc = ws && in ? 0 : -1;
    for (size_t k = 0; in && k < g->batch * in_w; k++)
        in[k] = (float)((k * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (int w = 0; g->rc == 0 && w < 3; w++)
        if (model_forward(g->m, ws, in, g->batch, &out) < 0) g->rc = -1;
    pthread_barrier_wait(g->start);
    double t0 = bench_mono_s(), t = t0;
    while (g->rc == 0 && (t - t0 < g->seconds || g->calls < 3)) {
        if (model_forward(g->m, ws, in, g->batch, &out) < 0) g->rc = -1;
        g->calls++;
        t = bench_mono_s();
    }
    g->elapsed_s = t - t0;
    free(in);
    model_ws_destroy(ws);
    return NULL;
}

int bench_gemm(const struct kcfg *c, const struct bench_opts *o)
{
    size_t sizes[16];
    int n = parse_size_list(o->batches, sizes, 16);
    if (n <= 0) {
        fprintf(stderr, "kinfer bench gemm: --batch wants sizes like 1,32,128\n");
        return 1;
    }
    struct model_runtime *rt;
    struct model *m = load_default_model(c, 0, o->threads, &rt);
    if (!m) return 1;
    int rc = 0;
    size_t par = o->parallel;
    struct gemm_run *runs = calloc(par, sizeof(*runs));
    pthread_t *thr = calloc(par, sizeof(*thr));
    if (!runs || !thr) rc = 1;
    for (int i = 0; i < n && rc == 0; i++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)par);
        size_t started = 0;
        for (; started < par; started++) {
            runs[started] = (struct gemm_run){.m = m, .slot = (unsigned)started,
                                              .batch = sizes[i], .seconds = o->seconds,
                                              .start = &start};
            if (pthread_create(&thr[started], NULL, gemm_thread, &runs[started]) != 0) break;
        }
        if (started < par) {
            /* Threads already started wait at the barrier for ever: give up. */
            fprintf(stderr, "kinfer bench gemm: cannot start %zu threads\n", par);
            exit(1);
        }
        double rows_per_s = 0, ms = 0;
        for (size_t k = 0; k < par; k++) {
            pthread_join(thr[k], NULL);
            if (runs[k].rc) rc = 1;
            rows_per_s += (double)(runs[k].calls * sizes[i]) / runs[k].elapsed_s;
            ms += runs[k].elapsed_s * 1000.0 / (double)runs[k].calls / (double)par;
        }
        pthread_barrier_destroy(&start);
        if (rc == 0)
            printf("gemm: model=%s backend=%s precision=%s threads=%d parallel=%zu batch=%zu "
                   "rows_per_s=%.0f batch_ms=%.3f tflops=%.4f\n", model_name(m),
                   model_runtime_backend(rt), model_runtime_precision(rt), o->threads, par,
                   sizes[i], rows_per_s, ms, rows_per_s * model_flops_per_row(m) / 1e12);
    }
    if (rc) fprintf(stderr, "kinfer bench gemm: forward pass failed\n");
    free(runs);
    free(thr);
    model_destroy(m);
    model_runtime_destroy(rt);
    return rc;
}

/* ---- encode ------------------------------------------------------------------ */

/* `bench encode`: an encoder's forward pass alone on the configured
 * backend. --jobs texts of produce's length mix are tokenized and cut into
 * batches as the worker's batcher does at saturation with group_by_length
 * (by length, then at max_batch_rows rows or max_batch_tokens padded
 * tokens); --parallel threads each run every batch, back to back, for
 * --seconds (whole passes), with --threads OpenBLAS threads per pass.
 * Prints sequences/s, tokens/s and the batches' padding. --dump FILE
 * writes the batches' ids, one JSON array of arrays per line, so PyTorch
 * can run the very same batches (bench/torch_encoder_bench.py). */

/* The batches, shared read-only by the threads. */
struct enc_set {
    const struct model *m;
    const int32_t *ids;     /* every sequence's ids */
    const size_t *off;      /* sequence s is ids[off[s] .. off[s + 1]) */
    const size_t *order;    /* [length, sequence] pairs, by length */
    const size_t *bstart;   /* batch b is order[bstart[b] .. bstart[b + 1]) */
    size_t nb, max_rows, max_tok;
    double seconds;
    pthread_barrier_t *start;
};

/* One thread's run over the set. */
struct enc_run {
    const struct enc_set *set;
    unsigned slot;
    FILE *dump;             /* slot 0 only: where the warm-up pass writes the batches */
    size_t seqs, toks, passes;
    double elapsed_s;
    int rc;
};

static int len_cmp(const void *a, const void *b)
{
    const size_t *x = a, *y = b; /* [length, sequence] pairs */
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* One untimed pass over every batch (the dump), then whole passes until
 * the set's seconds have gone by. */
static void *enc_thread(void *arg)
{
    struct enc_run *r = arg;
    const struct enc_set *st = r->set;
    char err[256];
    struct model_ws *ws = model_ws_new_tokens(st->m, r->slot, st->max_rows, st->max_tok, err,
                                              sizeof(err));
    int32_t *bids = malloc(st->max_tok * sizeof(int32_t));
    uint32_t *boff = malloc((st->max_rows + 1) * sizeof(uint32_t));
    r->rc = ws && bids && boff ? 0 : -1;
    if (!ws) fprintf(stderr, "kinfer bench encode: %s\n", err);
    double t0 = 0;
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) {
            pthread_barrier_wait(st->start);
            t0 = bench_mono_s();
        }
        for (size_t b = 0; r->rc == 0; b = (b + 1) % st->nb) {
            size_t at = 0, rows = st->bstart[b + 1] - st->bstart[b];
            FILE *dump = phase == 0 ? r->dump : NULL;
            if (dump) fputc('[', dump);
            for (size_t k = 0; k < rows; k++) {
                size_t s = st->order[2 * (st->bstart[b] + k) + 1];
                size_t len = st->off[s + 1] - st->off[s];
                boff[k] = (uint32_t)at;
                memcpy(bids + at, st->ids + st->off[s], len * sizeof(int32_t));
                if (dump) {
                    fputs(k ? ",[" : "[", dump);
                    for (size_t t = 0; t < len; t++)
                        fprintf(dump, "%s%" PRId32, t ? "," : "", bids[at + t]);
                    fputc(']', dump);
                }
                at += len;
            }
            if (dump) fputs("]\n", dump);
            boff[rows] = (uint32_t)at;
            struct model_seqs q = {bids, NULL, boff, rows};
            const float *out;
            if (model_encode(st->m, ws, &q, &out) != MODEL_OK) {
                fprintf(stderr, "kinfer bench encode: forward pass failed: %s\n",
                        model_ws_error(ws));
                r->rc = -1;
            }
            if (phase == 1) {
                r->seqs += rows;
                r->toks += at;
                r->passes += b + 1 == st->nb;
                r->elapsed_s = bench_mono_s() - t0;
            }
            if (b + 1 == st->nb && (phase == 0 || r->elapsed_s >= st->seconds)) break;
        }
        if (phase == 0 && r->rc) pthread_barrier_wait(st->start); /* the others wait there */
        if (phase == 0 && r->rc) break;
    }
    free(bids);
    free(boff);
    model_ws_destroy(ws);
    return NULL;
}

int bench_encode(const struct kcfg *c, const struct bench_opts *o)
{
    char err[512];
    struct model_runtime *rt;
    struct model *m = load_default_model(c, 0, o->threads, &rt);
    const struct model_encoder_info *e = m ? model_encoder(m) : NULL;
    if (!e) {
        if (m) fprintf(stderr, "kinfer bench encode: the default model is not an encoder\n");
        model_destroy(m);
        model_runtime_destroy(rt);
        return 1;
    }
    size_t n = o->jobs, max_rows = (size_t)c->batching.max_batch_rows;
    size_t max_tok = (size_t)c->batching.max_batch_tokens, cap = n * e->max_tokens;
    size_t par = o->parallel;
    struct textgen tg;
    struct wp_scratch *sc = wp_scratch_new(4096);
    int32_t *ids = malloc(cap * sizeof(int32_t));
    size_t *off = malloc((n + 1) * sizeof(size_t)), *order = malloc(2 * n * sizeof(size_t));
    size_t *bstart = malloc((n + 1) * sizeof(size_t));
    struct enc_run *runs = calloc(par, sizeof(*runs));
    pthread_t *thr = calloc(par, sizeof(*thr));
    FILE *dump = NULL;
    int rc = 1;
    if (textgen_init(&tg, e) < 0 || !sc || !ids || !off || !order || !bstart || !runs || !thr)
        goto out;
    off[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t = o->length ? textgen_fixed(&tg, i, o->length - 2) : textgen_text(&tg, i);
        int k = wp_encode(e->tokenizer, sc, t, strlen(t), NULL, 0, e->max_tokens, 1,
                          ids + off[i], NULL, cap - off[i], NULL, err, sizeof(err));
        if (k < 0) {
            fprintf(stderr, "kinfer bench encode: tokenizer: %s\n", err);
            goto out;
        }
        off[i + 1] = off[i] + (size_t)k;
        order[2 * i] = (size_t)k;
        order[2 * i + 1] = i;
    }
    qsort(order, n, 2 * sizeof(size_t), len_cmp);
    size_t nb = 0, padded = 0;
    double flops = 0; /* one pass: projections, feed-forward, attention */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && j - i < max_rows && (j - i + 1) * order[2 * j] <= max_tok) j++;
        if (j == i) j++;
        bstart[nb++] = i;
        padded += (j - i) * order[2 * (j - 1)];
        i = j;
    }
    bstart[nb] = n;
    for (size_t i = 0; i < n; i++) {
        double len = (double)order[2 * i];
        flops += len * model_flops_per_row(m) +
                 4.0 * (double)e->layers * len * len * (double)e->hidden;
    }
    if (o->dump && !(dump = fopen(o->dump, "w"))) {
        fprintf(stderr, "kinfer bench encode: %s: %s\n", o->dump, strerror(errno));
        goto out;
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)par);
    struct enc_set set = {m, ids, off, order, bstart, nb, max_rows, max_tok, o->seconds, &start};
    size_t started = 0;
    for (; started < par; started++) {
        runs[started] = (struct enc_run){.set = &set, .slot = (unsigned)started,
                                         .dump = started ? NULL : dump};
        if (pthread_create(&thr[started], NULL, enc_thread, &runs[started]) != 0) break;
    }
    if (started < par) {
        fprintf(stderr, "kinfer bench encode: cannot start %zu threads\n", par);
        exit(1); /* the started ones wait at the barrier for ever */
    }
    double seqs_s = 0, toks_s = 0, passes_s = 0;
    rc = 0;
    for (size_t k = 0; k < par; k++) {
        pthread_join(thr[k], NULL);
        if (runs[k].rc || runs[k].elapsed_s <= 0) {
            rc = 1;
            continue;
        }
        seqs_s += (double)runs[k].seqs / runs[k].elapsed_s;
        toks_s += (double)runs[k].toks / runs[k].elapsed_s;
        passes_s += (double)runs[k].passes / runs[k].elapsed_s;
    }
    pthread_barrier_destroy(&start);
    if (rc == 0)
        printf("encode: model=%s backend=%s precision=%s threads=%d parallel=%zu layers=%zu "
               "hidden=%zu seqs=%zu batches=%zu mean_batch_rows=%.1f mean_tokens=%.1f "
               "padded_ratio=%.3f seqs_per_s=%.1f tokens_per_s=%.0f gflops=%.2f\n",
               model_name(m), model_runtime_backend(rt), model_runtime_precision(rt), o->threads,
               par, e->layers, e->hidden, n, nb, (double)n / (double)nb,
               (double)off[n] / (double)n, 1.0 - (double)off[n] / (double)padded, seqs_s,
               toks_s, flops * passes_s / 1e9);
out:
    if (dump) fclose(dump);
    textgen_fini(&tg);
    wp_scratch_destroy(sc);
    free(ids);
    free(off);
    free(order);
    free(bstart);
    free(runs);
    free(thr);
    model_destroy(m);
    model_runtime_destroy(rt);
    return rc;
}

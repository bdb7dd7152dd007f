/* stats.c - the worker's counters, gauges and histograms, its liveness and
 * readiness inputs, and the per-partition lag read from librdkafka's
 * statistics JSON.
 *
 * Threads: the poll, executor and sink threads and librdkafka's callbacks
 * update; the HTTP thread (metrics.c) and the heartbeat thread read with
 * stats_snapshot. Counters, gauges and histogram buckets are C11 atomics
 * with relaxed ordering: each number is exact, but a snapshot is not one
 * instant across numbers, which Prometheus tolerates. What has to change
 * together (the lag table, the smoothed rates, the watchdog latch, the
 * backend name) sits behind one mutex, held only to copy or swap.
 *
 * Ownership: stats_new returns the struct; stats_destroy frees it. A
 * snapshot owns its copy of the lag table (stats_snapshot_fini). The JSON
 * given to stats_rdkafka_json is borrowed. */
#include "stats.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"

#define N_CODES PROTO_N_ERRS

/* Bucket bounds. Rows double up to the largest max_batch_rows allowed;
 * times span a fast GPU batch (0.5 ms) to a minute in the queue. */
static const double rows_bounds[] = {1,   2,   4,    8,    16,   32,    64,
                                     128, 256, 512,  1024, 4096, 16384, 65536};
static const double secs_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                     5,      10,    30,     60};

/* Sums are kept as integers in these units so they stay lock-free:
 * nanoseconds for the time histograms, rows for the rows one. */
#define NS_PER_S 1e9

struct hist {
    atomic_uint_fast64_t buckets[STATS_HIST_MAX_BOUNDS + 1];
    atomic_uint_fast64_t sum_units;
};

static const struct hist_def {
    const double *bounds;
    size_t n;
    double units; /* sum units per 1 of the observed value */
} hist_defs[STATS_N_HIST] = {
    [STATS_HIST_BATCH_ROWS] = {rows_bounds, sizeof(rows_bounds) / sizeof(rows_bounds[0]), 1},
    [STATS_HIST_QUEUE_S] = {secs_bounds, sizeof(secs_bounds) / sizeof(secs_bounds[0]), NS_PER_S},
    [STATS_HIST_INFER_S] = {secs_bounds, sizeof(secs_bounds) / sizeof(secs_bounds[0]), NS_PER_S},
    [STATS_HIST_E2E_S] = {secs_bounds, sizeof(secs_bounds) / sizeof(secs_bounds[0]), NS_PER_S},
    [STATS_HIST_TTFT_S] = {secs_bounds, sizeof(secs_bounds) / sizeof(secs_bounds[0]), NS_PER_S},
    [STATS_HIST_TPOT_S] = {secs_bounds, sizeof(secs_bounds) / sizeof(secs_bounds[0]), NS_PER_S},
};

struct stats {
    /* counters */
    atomic_uint_fast64_t consumed;
    atomic_uint_fast64_t jobs[STATS_N_STATUS][N_CODES];
    atomic_uint_fast64_t batches[STATS_N_BATCH_REASONS];
    atomic_uint_fast64_t dead_letters, produce_errors, redis_errors, heartbeat_errors;
    atomic_uint_fast64_t offset_resets;
    atomic_uint_fast64_t rows_run, jobs_done; /* feed the smoothed rates */
    atomic_uint_fast64_t tokens_run, padded_run; /* encoders' tokens, and padded */
    atomic_uint_fast64_t gen_prompt, gen_out, gen_pre, gen_shared; /* generation (stats_gen_*) */
    atomic_int_fast64_t gen_g[4];                 /* running, waiting, blocks used, total */
    atomic_int gen_models;
    /* gauges */
    atomic_int_fast64_t queue_rows, queue_jobs, inflight_rows, inflight_batches;
    atomic_int_fast64_t oldest_us;
    atomic_int assigned, paused;
    atomic_int brokers_up_consumer, brokers_up_producer, group_joined;
    struct hist hist[STATS_N_HIST];
    /* liveness and readiness */
    atomic_int_fast64_t loop_last_us[STATS_N_LOOPS]; /* 0 = not watched */
    atomic_int cond[STATS_N_COND];
    atomic_int early[STATS_N_COND];
    atomic_int draining;
    atomic_int watchdog_ms;
    double start_time_s; /* written once by stats_new */

    pthread_mutex_t mu; /* guards everything below */
    char backend[16], precision[16], device[128], models[512];
    struct stats_device devices[MODEL_MAX_DEVICES];
    size_t n_devices;
    struct stats_part *parts;
    size_t n_parts;
    struct stats_skip *skips; /* STATS_MAX_SKIP_PARTS rows, made on first use */
    size_t n_skips;
    int lag_known;
    int rate_primed, rate_have;
    int64_t rate_last_us;
    uint64_t rate_last_rows, rate_last_jobs, rate_last_tokens, rate_last_padded;
    double rows_ps, jobs_ps, tokens_ps, padded_ps;
    int tripped;
    char tripped_why[160];
    char cond_why[STATS_N_COND][160];
    int64_t sink_since_us[STATS_N_SINK]; /* first failure since the last success; 0 = none */
    char sink_why[STATS_N_SINK][160];
    stats_queue_fn queue_fn;
    void *queue_ctx;
};

/* Zeroed atomics are valid atomics (C11 7.17.2.1 allows static-style
 * zero initialisation of lock-free types), so calloc is enough except for
 * the few that start elsewhere than 0. */
struct stats *stats_new(void)
{
    struct stats *st = calloc(1, sizeof(*st));
    if (!st) return NULL;
    if (pthread_mutex_init(&st->mu, NULL) != 0) {
        free(st);
        return NULL;
    }
    atomic_init(&st->brokers_up_consumer, -1);
    atomic_init(&st->brokers_up_producer, -1);
    atomic_init(&st->watchdog_ms, 60000);
    snprintf(st->backend, sizeof(st->backend), "cpu");
    snprintf(st->device, sizeof(st->device), "cpu");
    snprintf(st->precision, sizeof(st->precision), "fp32");
    st->start_time_s = (double)clock_wall_us() / 1e6;
    return st;
}

/* Frees the struct and the lag table; the caller has stopped every thread
 * that could still touch it. */
void stats_destroy(struct stats *st)
{
    if (!st) return;
    free(st->parts);
    free(st->skips);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* Relaxed ordering throughout (add, set64, get_u, get64): these are
 * statistics, and no other memory is published through them. */
static void add(atomic_uint_fast64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* A gauge store (one writer each). */
static void set64(atomic_int_fast64_t *g, int64_t v)
{
    atomic_store_explicit(g, v, memory_order_relaxed);
}

/* A counter read for a snapshot. */
static uint64_t get_u(atomic_uint_fast64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

/* A gauge read for a snapshot. */
static int64_t get64(atomic_int_fast64_t *g)
{
    return atomic_load_explicit(g, memory_order_relaxed);
}

/* The name goes into kinfer_build_info; kept under the mutex because the
 * HTTP thread may already be reading when the backend is decided. */
void stats_set_backend(struct stats *st, const char *name)
{
    pthread_mutex_lock(&st->mu);
    snprintf(st->backend, sizeof(st->backend), "%s", name ? name : "");
    pthread_mutex_unlock(&st->mu);
}

/* The bound is configuration (metrics.watchdog_ms) but lives here so that
 * every reader evaluates liveness the same way. */
void stats_set_watchdog(struct stats *st, int ms)
{
    atomic_store(&st->watchdog_ms, ms > 0 ? ms : 1);
}

/* Counted before decoding, so records that never become results (dead
 * letters) are seen entering too: consumed - finished is what is inside. */
void stats_consumed(struct stats *st)
{
    add(&st->consumed, 1);
}

/* Gauges of the poll thread, which owns the batcher's depth and the
 * in-flight bound: one writer, so plain stores suffice. */
void stats_set_queue(struct stats *st, size_t rows, size_t jobs, double oldest_s,
                     size_t inflight_rows, int inflight_batches)
{
    set64(&st->queue_rows, (int64_t)rows);
    set64(&st->queue_jobs, (int64_t)jobs);
    set64(&st->oldest_us, oldest_s > 0 ? (int64_t)(oldest_s * 1e6) : 0);
    set64(&st->inflight_rows, (int64_t)inflight_rows);
    set64(&st->inflight_batches, inflight_batches > 0 ? inflight_batches : 0);
}

void stats_set_queue_source(struct stats *st, stats_queue_fn fn, void *ctx)
{
    pthread_mutex_lock(&st->mu);
    st->queue_fn = fn;
    st->queue_ctx = ctx;
    pthread_mutex_unlock(&st->mu);
}

/* The queue's depth now, from its source when one is registered (the
 * gauges are brought up to date with it). */
static void queue_now(struct stats *st, int64_t now_us, struct stats_snapshot *out)
{
    pthread_mutex_lock(&st->mu);
    if (st->queue_fn) {
        size_t rows = 0, jobs = 0;
        double oldest = 0;
        st->queue_fn(st->queue_ctx, now_us, &rows, &jobs, &oldest);
        set64(&st->queue_rows, (int64_t)rows);
        set64(&st->queue_jobs, (int64_t)jobs);
        set64(&st->oldest_us, oldest > 0 ? (int64_t)(oldest * 1e6) : 0);
    }
    pthread_mutex_unlock(&st->mu);
    out->queue_rows = get64(&st->queue_rows);
    out->queue_jobs = get64(&st->queue_jobs);
    out->oldest_queued_s = (double)get64(&st->oldest_us) / 1e6;
}

/* The poll thread knows the assignment (it runs the rebalance callback)
 * and whether backpressure paused it. */
void stats_set_partitions(struct stats *st, int assigned, int paused)
{
    atomic_store_explicit(&st->assigned, assigned, memory_order_relaxed);
    atomic_store_explicit(&st->paused, paused, memory_order_relaxed);
}

/* rsink keeps its own error total; mirroring it keeps rsink free of any
 * dependency on stats. Never goes backwards, as a counter must not. */
void stats_set_redis_errors(struct stats *st, uint64_t total)
{
    uint64_t cur = get_u(&st->redis_errors);
    while (total > cur &&
           !atomic_compare_exchange_weak_explicit(&st->redis_errors, &cur, total,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

/* Linear search: at most 20 bounds, and it runs a few times per job. */
size_t stats_hist_bucket(enum stats_hist h, double v)
{
    const struct hist_def *d = &hist_defs[h];
    size_t i = 0;
    while (i < d->n && v > d->bounds[i]) i++;
    return i;
}

/* Renderers need the bounds to write le labels; the table stays here so
 * bucketing and rendering cannot disagree. */
const double *stats_hist_bounds(enum stats_hist h, size_t *n)
{
    *n = hist_defs[h].n;
    return hist_defs[h].bounds;
}

/* One observation: a bucket and the sum, both atomic adds. NaN and
 * negative values (clock steps) are not observed. */
static void observe(struct stats *st, enum stats_hist h, double v)
{
    if (!(v >= 0)) return;
    struct hist *hs = &st->hist[h];
    add(&hs->buckets[stats_hist_bucket(h, v)], 1);
    add(&hs->sum_units, (uint64_t)llround(v * hist_defs[h].units));
}

/* The executor reports after the batch is handed on, so a batch is
 * counted once whatever happens to its jobs later. */
void stats_batch(struct stats *st, enum stats_batch_reason reason, size_t rows)
{
    if ((unsigned)reason >= STATS_N_BATCH_REASONS) reason = STATS_BATCH_SIZE;
    add(&st->batches[reason], 1);
    if (rows > 0) {
        observe(st, STATS_HIST_BATCH_ROWS, (double)rows);
        add(&st->rows_run, rows);
    }
}

void stats_tokens(struct stats *st, size_t tokens, size_t padded)
{
    add(&st->tokens_run, tokens);
    add(&st->padded_run, padded);
}

void stats_gen_done(struct stats *st, size_t prompt, size_t generated, double ttft_s,
                    double tpot_s)
{
    add(&st->gen_prompt, prompt);
    add(&st->gen_out, generated);
    if (ttft_s >= 0) observe(st, STATS_HIST_TTFT_S, ttft_s);
    if (tpot_s >= 0) observe(st, STATS_HIST_TPOT_S, tpot_s);
}

void stats_gen_gauges(struct stats *st, int models, size_t running, size_t waiting,
                      size_t blocks_used, size_t blocks_total, uint64_t preemptions,
                      uint64_t shared_tokens)
{
    atomic_store(&st->gen_models, models);
    atomic_store(&st->gen_g[0], (int64_t)running);
    atomic_store(&st->gen_g[1], (int64_t)waiting);
    atomic_store(&st->gen_g[2], (int64_t)blocks_used);
    atomic_store(&st->gen_g[3], (int64_t)blocks_total);
    atomic_store(&st->gen_pre, preemptions);
    atomic_store(&st->gen_shared, shared_tokens);
}

/* Counted when both acknowledgements are in, so kinfer_jobs_total is what
 * the outside world can see: a result in Redis and on the reply topic (or
 * a record on the dead-letter topic). */
void stats_job(struct stats *st, enum stats_status status, enum proto_err code, double queue_s,
               double infer_s, double e2e_s)
{
    if ((unsigned)status >= STATS_N_STATUS) status = STATS_STATUS_ERROR;
    if ((unsigned)code >= N_CODES) code = PROTO_ERR_INFERENCE_FAILED;
    add(&st->jobs[status][code], 1);
    add(&st->jobs_done, 1);
    if (status == STATS_STATUS_DEAD_LETTER) {
        add(&st->dead_letters, 1);
        return;
    }
    if (queue_s >= 0) observe(st, STATS_HIST_QUEUE_S, queue_s);
    if (infer_s >= 0) observe(st, STATS_HIST_INFER_S, infer_s);
    if (e2e_s >= 0) observe(st, STATS_HIST_E2E_S, e2e_s);
}

/* Each failed attempt counts, retried or not: a rising rate is the signal,
 * not the total. */
void stats_produce_error(struct stats *st)
{
    add(&st->produce_errors, 1);
}

/* Counted apart from the result sink's errors: the heartbeat failing alone
 * points at Redis reachability, not at result writes. */
void stats_heartbeat_error(struct stats *st)
{
    add(&st->heartbeat_errors, 1);
}

/* A loop's heartbeat is its last time round; 0 is reserved for "not
 * watched", so a clock that reads 0 is nudged to 1. */
void stats_alive(struct stats *st, int loop)
{
    if (loop < 0 || loop >= STATS_N_LOOPS) return;
    int64_t now = clock_mono_us();
    set64(&st->loop_last_us[loop], now > 0 ? now : 1);
}

/* A loop that ended because the worker is stopping must not trip the
 * watchdog while the rest shuts down. */
void stats_loop_stop(struct stats *st, int loop)
{
    if (loop < 0 || loop >= STATS_N_LOOPS) return;
    set64(&st->loop_last_us[loop], 0);
}

/* A row per partition, found by a scan (skips are rare events); past
 * STATS_MAX_SKIP_PARTS partitions the last row takes the rest. */
void stats_skipped(struct stats *st, const char *topic, int32_t partition, int64_t from,
                   int64_t to)
{
    if (to < from) return;
    pthread_mutex_lock(&st->mu);
    if (!st->skips) st->skips = calloc(STATS_MAX_SKIP_PARTS, sizeof(*st->skips));
    if (st->skips) {
        size_t i = 0;
        while (i < st->n_skips && (st->skips[i].partition != partition ||
                                   strcmp(st->skips[i].topic, topic) != 0))
            i++;
        if (i == st->n_skips) {
            if (i == STATS_MAX_SKIP_PARTS) i--;
            else st->n_skips++;
            if (!st->skips[i].records) {
                snprintf(st->skips[i].topic, sizeof(st->skips[i].topic), "%s", topic);
                st->skips[i].partition = partition;
            }
        }
        st->skips[i].records += (uint64_t)(to - from + 1);
        st->skips[i].last_from = from;
        st->skips[i].last_to = to;
    }
    pthread_mutex_unlock(&st->mu);
}

void stats_offset_reset(struct stats *st)
{
    add(&st->offset_resets, 1);
}

/* Conditions are set by whoever observes them (the model loader, the
 * statistics callback, the heartbeat); readiness combines them at read
 * time so no writer needs to know about the others. */
void stats_set_cond(struct stats *st, enum stats_cond cond, int ok)
{
    if ((unsigned)cond >= STATS_N_COND) return;
    atomic_store(&st->cond[cond], ok ? 1 : 0);
}

/* The reason is kept beside the flag, under the mutex (it is text); the
 * flag stays an atomic so readers of it alone never wait. */
void stats_set_cond_why(struct stats *st, enum stats_cond cond, int ok, const char *why)
{
    if ((unsigned)cond >= STATS_N_COND) return;
    pthread_mutex_lock(&st->mu);
    snprintf(st->cond_why[cond], sizeof(st->cond_why[cond]), "%s", ok || !why ? "" : why);
    pthread_mutex_unlock(&st->mu);
    stats_set_cond(st, cond, ok);
}

/* Only the start of a failure and the text of the latest one are kept:
 * readiness asks how long the path has been failing, not how often. */
void stats_sink_failing(struct stats *st, enum stats_sink path, const char *why)
{
    if ((unsigned)path >= STATS_N_SINK) return;
    pthread_mutex_lock(&st->mu);
    if (!why) {
        st->sink_since_us[path] = 0;
    } else {
        if (!st->sink_since_us[path]) st->sink_since_us[path] = clock_mono_us();
        snprintf(st->sink_why[path], sizeof(st->sink_why[path]), "%s", why);
    }
    pthread_mutex_unlock(&st->mu);
}

/* The first statistics come statistics.interval.ms after a client starts,
 * but a producer that holds metadata has reached a broker well before, and
 * a consumer with a member id has joined: readiness need not wait. */
void stats_set_early(struct stats *st, enum stats_cond cond, int ok)
{
    if ((unsigned)cond >= STATS_N_COND) return;
    atomic_store(&st->early[cond], ok ? 1 : 0);
}

/* One-way: a draining worker never becomes ready again. */
void stats_set_draining(struct stats *st)
{
    atomic_store(&st->draining, 1);
}

void stats_set_device_name(struct stats *st, const char *name)
{
    pthread_mutex_lock(&st->mu);
    snprintf(st->device, sizeof(st->device), "%s", name ? name : "");
    pthread_mutex_unlock(&st->mu);
}

void stats_set_models(struct stats *st, const char *desc)
{
    pthread_mutex_lock(&st->mu);
    snprintf(st->models, sizeof(st->models), "%s", desc ? desc : "");
    pthread_mutex_unlock(&st->mu);
}

void stats_set_precision(struct stats *st, const char *precision)
{
    pthread_mutex_lock(&st->mu);
    snprintf(st->precision, sizeof(st->precision), "%s", precision ? precision : "");
    pthread_mutex_unlock(&st->mu);
}

/* A handful of devices at most, written about once a second: the mutex
 * costs nothing here and keeps a device's fields together. */
void stats_set_device(struct stats *st, size_t slot, const struct stats_device *d)
{
    if (slot >= MODEL_MAX_DEVICES) return;
    pthread_mutex_lock(&st->mu);
    st->devices[slot] = *d;
    if (!(d->busy_ratio >= 0)) st->devices[slot].busy_ratio = 0;
    if (d->busy_ratio > 1) st->devices[slot].busy_ratio = 1;
    if (slot >= st->n_devices) st->n_devices = slot + 1;
    pthread_mutex_unlock(&st->mu);
}

/* ---- librdkafka statistics --------------------------------------------- */

/* An integer field of o, or def when absent or not an integer. */
static int64_t jint(const json_t *o, const char *key, int64_t def)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

/* A string field of o, or "" when absent. */
static const char *jstr(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* Broker connections that are up. The logical "GroupCoordinator" entry
 * and internal ones mirror a real connection, so only real brokers count
 * (bootstrap entries included: they are real connections too). */
static int brokers_up(const json_t *brokers)
{
    const char *name;
    json_t *b;
    int up = 0;
    if (!json_is_object(brokers)) return 0;
    json_object_foreach((json_t *)brokers, name, b) {
        const char *src = jstr(b, "source");
        if (strcmp(src, "logical") == 0 || strcmp(src, "internal") == 0) continue;
        const char *state = jstr(b, "state");
        if (strcmp(state, "UP") == 0 || strcmp(state, "UPDATE") == 0) up++;
    }
    return up;
}

/* The lag of one partition entry, -1 when it cannot be known. Preferred:
 * consumer_lag_stored (end offset - the offset the worker stored as
 * processed), which moves as soon as results are acknowledged; then
 * consumer_lag (end - committed); then, for a partition nothing was ever
 * stored or committed for, the whole log (auto.offset.reset=earliest
 * makes the worker read all of it). */
static int64_t partition_lag(const json_t *p)
{
    int64_t v = jint(p, "consumer_lag_stored", -1);
    if (v >= 0) return v;
    v = jint(p, "consumer_lag", -1);
    if (v >= 0) return v;
    int64_t committed = jint(p, "committed_offset", -1001);
    int64_t stored = jint(p, "stored_offset", -1001);
    int64_t end = jint(p, "ls_offset", -1);
    if (end < 0) end = jint(p, "hi_offset", -1);
    int64_t lo = jint(p, "lo_offset", -1);
    if (committed < 0 && stored < 0 && end >= 0 && lo >= 0 && end >= lo) return end - lo;
    return -1;
}

/* Topic, then partition: the order the endpoint lists them in. */
static int part_cmp(const void *a, const void *b)
{
    const struct stats_part *x = a, *y = b;
    int c = strcmp(x->topic, y->topic);
    if (c) return c;
    return (x->partition > y->partition) - (x->partition < y->partition);
}

/* Collects the consumer's assigned partitions ("desired": the application
 * asked for them; -1 is librdkafka's internal unassigned partition) into
 * a new array. Returns 0, or -1 when out of memory. */
static int collect_parts(const json_t *topics, struct stats_part **out, size_t *n_out)
{
    size_t n = 0, cap = 0;
    struct stats_part *parts = NULL;
    const char *tname, *pkey;
    json_t *t, *p;
    *out = NULL;
    *n_out = 0;
    if (!json_is_object(topics)) return 0;
    json_object_foreach((json_t *)topics, tname, t) {
        json_t *ps = json_object_get(t, "partitions");
        if (!json_is_object(ps)) continue;
        json_object_foreach(ps, pkey, p) {
            int64_t id = jint(p, "partition", -1);
            if (id < 0 || id > INT32_MAX) continue;
            if (!json_is_true(json_object_get(p, "desired"))) continue;
            if (json_is_true(json_object_get(p, "unknown"))) continue;
            int64_t lag = partition_lag(p);
            if (lag < 0) continue;
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 16;
                struct stats_part *np = realloc(parts, ncap * sizeof(*np));
                if (!np) {
                    free(parts);
                    return -1;
                }
                parts = np;
                cap = ncap;
            }
            const char *topic = jstr(t, "topic");
            snprintf(parts[n].topic, sizeof(parts[n].topic), "%s", *topic ? topic : tname);
            parts[n].partition = (int32_t)id;
            parts[n].lag = lag;
            n++;
        }
    }
    if (n) qsort(parts, n, sizeof(*parts), part_cmp);
    *out = parts;
    *n_out = n;
    return 0;
}

/* Parsing happens outside the mutex; only the swap of the lag table is
 * inside, so the HTTP thread never waits on jansson. */
int stats_rdkafka_json(struct stats *st, const char *json, size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!json_is_object(root)) {
        json_decref(root);
        return -1;
    }
    const char *type = jstr(root, "type");
    int rc = 0;
    if (strcmp(type, "producer") == 0) {
        int up = brokers_up(json_object_get(root, "brokers"));
        atomic_store(&st->brokers_up_producer, up);
        stats_set_cond(st, STATS_COND_PRODUCER, up > 0);
    } else if (strcmp(type, "consumer") == 0) {
        atomic_store(&st->brokers_up_consumer, brokers_up(json_object_get(root, "brokers")));
        const json_t *cg = json_object_get(root, "cgrp");
        int joined = strcmp(jstr(cg, "state"), "up") == 0 &&
                     strcmp(jstr(cg, "join_state"), "steady") == 0;
        atomic_store(&st->group_joined, joined);
        stats_set_cond(st, STATS_COND_CONSUMER, joined);
        struct stats_part *parts;
        size_t n;
        if (collect_parts(json_object_get(root, "topics"), &parts, &n) < 0) {
            rc = -1;
        } else {
            pthread_mutex_lock(&st->mu);
            free(st->parts);
            st->parts = parts;
            st->n_parts = n;
            st->lag_known = 1;
            pthread_mutex_unlock(&st->mu);
        }
    } else {
        rc = -1;
    }
    json_decref(root);
    return rc;
}

/* ---- readers ------------------------------------------------------------- */

/* Exponentially weighted rates over irregular sampling: the weight of the
 * new interval is 1 - exp(-dt/tau), so two readers sampling at different
 * paces smooth the same way. The first interval seeds the rate. Called
 * with st->mu held. */
static void update_rates(struct stats *st, int64_t now_us)
{
    uint64_t rows = get_u(&st->rows_run), jobs = get_u(&st->jobs_done);
    uint64_t tok = get_u(&st->tokens_run), pad = get_u(&st->padded_run);
    if (!st->rate_primed) {
        st->rate_primed = 1;
        st->rate_last_us = now_us;
        st->rate_last_rows = rows;
        st->rate_last_jobs = jobs;
        st->rate_last_tokens = tok;
        st->rate_last_padded = pad;
        return;
    }
    if (now_us - st->rate_last_us < 1000000) return;
    double dt = (double)(now_us - st->rate_last_us) / 1e6;
    double r = (double)(rows - st->rate_last_rows) / dt;
    double j = (double)(jobs - st->rate_last_jobs) / dt;
    double t = (double)(tok - st->rate_last_tokens) / dt;
    double p = (double)(pad - st->rate_last_padded) / dt;
    if (!st->rate_have) {
        st->rows_ps = r;
        st->jobs_ps = j;
        st->tokens_ps = t;
        st->padded_ps = p;
        st->rate_have = 1;
    } else {
        double a = 1.0 - exp(-dt / STATS_RATE_TAU_S);
        st->rows_ps += a * (r - st->rows_ps);
        st->jobs_ps += a * (j - st->jobs_ps);
        st->tokens_ps += a * (t - st->tokens_ps);
        st->padded_ps += a * (p - st->padded_ps);
    }
    st->rate_last_us = now_us;
    st->rate_last_rows = rows;
    st->rate_last_jobs = jobs;
    st->rate_last_tokens = tok;
    st->rate_last_padded = pad;
}

/* Latches the watchdog when a watched loop has been silent longer than
 * the bound; once tripped it stays so, because a loop that stalled that
 * long means the process can no longer be trusted to make progress.
 * Called with st->mu held. */
static void check_loops(struct stats *st, int64_t now_us, struct stats_snapshot *out)
{
    int bound = atomic_load(&st->watchdog_ms);
    for (int l = 0; l < STATS_N_LOOPS; l++) {
        int64_t last = get64(&st->loop_last_us[l]);
        if (last == 0) {
            out->loop_silence_s[l] = -1;
            continue;
        }
        double silent = now_us > last ? (double)(now_us - last) / 1e6 : 0;
        out->loop_silence_s[l] = silent;
        if (!st->tripped && silent * 1000.0 > bound) {
            char name[32];
            st->tripped = 1;
            snprintf(st->tripped_why, sizeof(st->tripped_why),
                     "loop %s silent for %.1f s (metrics.watchdog_ms = %d)",
                     stats_loop_name(l, name, sizeof(name)), silent, bound);
        }
    }
    out->healthy = !st->tripped;
    snprintf(out->unhealthy_why, sizeof(out->unhealthy_why), "%s", st->tripped_why);
    out->watchdog_ms = bound;
}

/* One copy for one reader: renderers then work on plain data without
 * touching atomics or the mutex again, and rates and the watchdog advance
 * only when someone looks. */
int stats_snapshot(struct stats *st, int64_t now_us, struct stats_snapshot *out)
{
    memset(out, 0, sizeof(*out));
    int rc = 0;
    out->consumed = get_u(&st->consumed);
    for (int s = 0; s < STATS_N_STATUS; s++)
        for (int c = 0; c < N_CODES; c++) out->jobs[s][c] = get_u(&st->jobs[s][c]);
    for (int r = 0; r < STATS_N_BATCH_REASONS; r++) out->batches[r] = get_u(&st->batches[r]);
    out->dead_letters = get_u(&st->dead_letters);
    out->offset_resets = get_u(&st->offset_resets);
    out->produce_errors = get_u(&st->produce_errors);
    out->redis_errors = get_u(&st->redis_errors);
    out->heartbeat_errors = get_u(&st->heartbeat_errors);
    queue_now(st, now_us, out);
    out->inflight_rows = get64(&st->inflight_rows);
    out->inflight_batches = get64(&st->inflight_batches);
    out->assigned = atomic_load_explicit(&st->assigned, memory_order_relaxed);
    out->paused = atomic_load_explicit(&st->paused, memory_order_relaxed);
    for (int h = 0; h < STATS_N_HIST; h++) {
        struct stats_hist_snap *hs = &out->hist[h];
        for (size_t b = 0; b <= hist_defs[h].n; b++) {
            hs->buckets[b] = get_u(&st->hist[h].buckets[b]);
            hs->count += hs->buckets[b];
        }
        hs->sum = (double)get_u(&st->hist[h].sum_units) / hist_defs[h].units;
    }
    out->brokers_up_consumer = atomic_load(&st->brokers_up_consumer);
    out->brokers_up_producer = atomic_load(&st->brokers_up_producer);
    out->group_joined = atomic_load(&st->group_joined);
    for (int c = 0; c < STATS_N_COND; c++) {
        out->cond[c] = atomic_load(&st->cond[c]);
        out->early[c] = atomic_load(&st->early[c]);
    }
    out->draining = atomic_load(&st->draining);
    out->start_time_s = st->start_time_s;

    pthread_mutex_lock(&st->mu);
    snprintf(out->backend, sizeof(out->backend), "%s", st->backend);
    snprintf(out->precision, sizeof(out->precision), "%s", st->precision);
    snprintf(out->device, sizeof(out->device), "%s", st->device);
    snprintf(out->models, sizeof(out->models), "%s", st->models);
    memcpy(out->devices, st->devices, sizeof(out->devices));
    out->n_devices = st->n_devices;
    update_rates(st, now_us);
    out->rows_per_s = st->rows_ps;
    out->jobs_per_s = st->jobs_ps;
    out->tokens_per_s = st->tokens_ps;
    out->tokens = get_u(&st->tokens_run);
    out->padded_tokens = get_u(&st->padded_run);
    out->gen_prompt_tokens = get_u(&st->gen_prompt);
    out->gen_tokens = get_u(&st->gen_out);
    out->gen_preemptions = get_u(&st->gen_pre);
    out->gen_shared_tokens = get_u(&st->gen_shared);
    out->gen_running = atomic_load(&st->gen_g[0]);
    out->gen_waiting = atomic_load(&st->gen_g[1]);
    out->gen_blocks_used = atomic_load(&st->gen_g[2]);
    out->gen_blocks_total = atomic_load(&st->gen_g[3]);
    out->gen_models = atomic_load(&st->gen_models);
    /* Over the smoothed window when there is traffic, else since start. */
    if (st->padded_ps > 0) out->padding_ratio = 1.0 - st->tokens_ps / st->padded_ps;
    else if (out->padded_tokens)
        out->padding_ratio = 1.0 - (double)out->tokens / (double)out->padded_tokens;
    else out->padding_ratio = 0;
    if (out->padding_ratio < 0) out->padding_ratio = 0;
    check_loops(st, now_us, out);
    for (int c = 0; c < STATS_N_COND; c++)
        if (st->cond_why[c][0])
            snprintf(out->cond_reason[c], sizeof(out->cond_reason[c]), "%s", st->cond_why[c]);
    static const char *const sink_names[STATS_N_SINK] = {"kafka", "redis"};
    for (int p = 0; p < STATS_N_SINK; p++) {
        out->sink_failing_s[p] = -1;
        if (!st->sink_since_us[p]) continue;
        out->sink_failing_s[p] = (double)(now_us - st->sink_since_us[p]) / 1e6;
        snprintf(out->sink_reason[p], sizeof(out->sink_reason[p]), "sink: %s: %s",
                 sink_names[p], st->sink_why[p]);
    }
    out->lag_known = st->lag_known;
    if (st->n_parts) {
        out->parts = malloc(st->n_parts * sizeof(*out->parts));
        if (out->parts) {
            memcpy(out->parts, st->parts, st->n_parts * sizeof(*out->parts));
            out->n_parts = st->n_parts;
        } else {
            rc = -1;
        }
    }
    if (st->n_skips) {
        out->skips = malloc(st->n_skips * sizeof(*out->skips));
        if (out->skips) {
            memcpy(out->skips, st->skips, st->n_skips * sizeof(*out->skips));
            out->n_skips = st->n_skips;
        } else {
            rc = -1;
        }
    }
    pthread_mutex_unlock(&st->mu);

    for (size_t i = 0; i < out->n_parts; i++) out->lag_total += out->parts[i].lag;
    /* Time to drain this worker's lag at its recent pace. With lag but no
     * recent progress the estimate is unknown (not infinite): a worker
     * that just started would otherwise read as hopelessly behind. */
    if (out->lag_total == 0) {
        out->drain_known = 1;
        out->drain_s = 0;
    } else if (out->jobs_per_s > 1e-9) {
        out->drain_known = 1;
        out->drain_s = (double)out->lag_total / out->jobs_per_s;
    }
    return rc;
}

/* The lag and skip tables are what a snapshot owns. */
void stats_snapshot_fini(struct stats_snapshot *s)
{
    free(s->parts);
    s->parts = NULL;
    s->n_parts = 0;
    free(s->skips);
    s->skips = NULL;
    s->n_skips = 0;
}

/* Readiness is "this worker can take and finish jobs now". Reasons are
 * short and stable so probes and people can read them. */
int stats_ready(const struct stats_snapshot *s, const char **reasons, size_t max,
                size_t *n_reasons)
{
    const char *why[8 + STATS_N_SINK];
    size_t n = 0;
    if (s->draining) why[n++] = "worker: draining, stopping";
    if (!s->healthy) why[n++] = "worker: watchdog tripped (see /healthz)";
    if (!s->cond[STATS_COND_MODEL]) why[n++] = "model: not loaded";
    /* Before a client's first statistics, what its own calls show. */
    int consumer_ok = s->cond[STATS_COND_CONSUMER] || s->assigned > 0 ||
                      (s->brokers_up_consumer < 0 && s->early[STATS_COND_CONSUMER]);
    int producer_ok = s->cond[STATS_COND_PRODUCER] ||
                      (s->brokers_up_producer < 0 && s->early[STATS_COND_PRODUCER]);
    if (!consumer_ok) why[n++] = "consumer: not joined to the group";
    if (!producer_ok)
        why[n++] = s->brokers_up_producer < 0 ? "producer: no Kafka broker reached yet"
                                              : "producer: no connection to any Kafka broker";
    if (!s->cond[STATS_COND_REDIS])
        why[n++] = s->cond_reason[STATS_COND_REDIS][0] ? s->cond_reason[STATS_COND_REDIS]
                                                       : "redis: not reachable";
    for (int p = 0; p < STATS_N_SINK; p++)
        if (s->sink_failing_s[p] >= STATS_SINK_FAILING_S) why[n++] = s->sink_reason[p];
    for (size_t i = 0; i < n && i < max; i++) reasons[i] = why[i];
    if (n_reasons) *n_reasons = n;
    return n == 0;
}

/* Loop names as they appear in /healthz, labels and watchdog messages;
 * executors and generator lanes are numbered because several may run. */
const char *stats_loop_name(int loop, char *buf, size_t n)
{
    switch (loop) {
    case STATS_LOOP_POLL: snprintf(buf, n, "poll"); break;
    case STATS_LOOP_SINK: snprintf(buf, n, "sink"); break;
    case STATS_LOOP_HEARTBEAT: snprintf(buf, n, "heartbeat"); break;
    default: {
        int gen = loop >= STATS_LOOP_GEN;
        snprintf(buf, n, "%s-%d", gen ? "generator" : "executor",
                 loop - (gen ? STATS_LOOP_GEN : STATS_LOOP_EXEC));
    }
    }
    return buf;
}

/* The status label values of kinfer_jobs_total. */
const char *stats_status_name(enum stats_status s)
{
    switch (s) {
    case STATS_STATUS_OK: return "ok";
    case STATS_STATUS_ERROR: return "error";
    case STATS_STATUS_DEAD_LETTER: return "dead_letter";
    case STATS_N_STATUS: break;
    }
    return "error";
}

/* The reason label values, the batcher's own names. */
const char *stats_batch_reason_name(enum stats_batch_reason r)
{
    switch (r) {
    case STATS_BATCH_SIZE: return "size";
    case STATS_BATCH_DEADLINE: return "deadline";
    case STATS_BATCH_WAIT: return "wait";
    case STATS_BATCH_DRAIN: return "drain";
    case STATS_N_BATCH_REASONS: break;
    }
    return "size";
}

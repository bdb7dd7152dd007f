/* heartbeat.c - writes this worker's heartbeat hash to Redis from a thread
 * of its own; cmd/status.c reads everyone's back for `kinfer
 * status`, typing the fields by this file's table.
 *
 * The writer has its own hiredis connection (the result sink's belongs to
 * the sink thread). Each beat is one pipelined round trip, HSET of every
 * field then PEXPIRE; any error throws the context away (hiredis: a
 * context that saw an error is not reused) and the next beat reconnects,
 * re-applying the command timeout. The beat's outcome is the Redis
 * readiness condition.
 *
 * Threads: hb_start/hb_stop on the main thread, the beats on the heartbeat
 * thread; the readers' helpers on any thread. Ownership:
 * struct hb copies every string it needs from the config; the stats are
 * borrowed. */
#include "heartbeat.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../base/log.h"
#include "../base/rconn.h"

#ifndef KINFER_VERSION
#define KINFER_VERSION "dev"
#endif

/* The hash's fields and how `kinfer status --json` types them. The writer
 * fills them by index; the reader keeps unknown fields as strings so an
 * older status still shows a newer worker's hash. */
enum hb_field_idx {
    F_ID, F_HOST, F_PID, F_GROUP, F_VERSION, F_BACKEND, F_DEVICE, F_MODELS,
    F_ASSIGNED, F_PAUSED, F_PARTITIONS,
    F_QUEUE_ROWS, F_QUEUE_JOBS, F_INFLIGHT_ROWS, F_INFLIGHT_BATCHES, F_LAG, F_ROWS_PS,
    F_JOBS_PS, F_JOBS_DONE, F_READY, F_HEALTHY, F_STARTED, F_UPDATED, N_FIELDS
};
static const struct hb_field {
    const char *name;
    enum hb_type type;
} hb_fields[N_FIELDS] = {
    [F_ID] = {"id", HB_STR},
    [F_HOST] = {"host", HB_STR},
    [F_PID] = {"pid", HB_INT},
    [F_GROUP] = {"group", HB_STR},
    [F_VERSION] = {"version", HB_STR},
    [F_BACKEND] = {"backend", HB_STR},
    [F_DEVICE] = {"device", HB_STR},
    [F_MODELS] = {"models", HB_STR},
    [F_ASSIGNED] = {"assigned", HB_INT},
    [F_PAUSED] = {"paused", HB_INT},
    [F_PARTITIONS] = {"partitions", HB_LIST},
    [F_QUEUE_ROWS] = {"queue_rows", HB_INT},
    [F_QUEUE_JOBS] = {"queue_jobs", HB_INT},
    [F_INFLIGHT_ROWS] = {"inflight_rows", HB_INT},
    [F_INFLIGHT_BATCHES] = {"inflight_batches", HB_INT},
    [F_LAG] = {"lag", HB_INT},
    [F_ROWS_PS] = {"rows_per_second", HB_NUM},
    [F_JOBS_PS] = {"jobs_per_second", HB_NUM},
    [F_JOBS_DONE] = {"jobs_done", HB_INT},
    [F_READY] = {"ready", HB_BOOL},
    [F_HEALTHY] = {"healthy", HB_BOOL},
    [F_STARTED] = {"started_at_ms", HB_INT},
    [F_UPDATED] = {"updated_at_ms", HB_INT},
};

#define HB_PARTS_MAX 8192 /* "topic:partition,..." text; longer lists end in "..." */

struct hb {
    struct stats *st;
    char *host, *password, *key, *id, *hostname, *group;
    int port, db, timeout_ms, interval_ms;
    long pid;
    int64_t started_at_ms;
    redisContext *rc;  /* heartbeat thread only */
    struct rconn_guard guard; /* hb_stop cuts a beat that Redis does not answer */
    int guard_ok;
    int failing;       /* heartbeat thread only: the last beat failed */
    char parts[HB_PARTS_MAX]; /* heartbeat thread only */

    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    int stop;          /* under mu */
    int64_t stop_deadline_us; /* under mu: the final DEL must end by then; 0 = none */
};

/* In Kubernetes the hostname is the pod name, so hostname-pid is unique
 * and recognisable without any configuration. */
const char *hb_worker_id(const struct kcfg *c, char *buf, size_t cap)
{
    if (c->metrics.worker_id && *c->metrics.worker_id) {
        snprintf(buf, cap, "%s", c->metrics.worker_id);
        return buf;
    }
    char host[256];
    if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "unknown");
    host[sizeof(host) - 1] = '\0';
    snprintf(buf, cap, "%s-%ld", host, (long)getpid());
    return buf;
}

/* Connects, applies the timeout to every command, authenticates and
 * selects the database, as every Redis client of kinfer does
 * (base/rconn.c). Returns a usable context or NULL with err filled. */
redisContext *hb_redis_open(const char *host, int port, const char *password, int db,
                            int timeout_ms, char *err, size_t cap)
{
    struct rconn_conf rc = {.host = host, .port = port, .password = password, .db = db,
                            .timeout_ms = timeout_ms};
    return rconn_open(&rc, NULL, err, cap);
}

/* "topic:partition,..." of the assigned partitions the consumer reported. */
static void partitions_text(const struct stats_snapshot *s, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < s->n_parts && used < cap; i++) {
        int n = snprintf(buf + used, cap - used, "%s%s:%" PRId32, i ? "," : "",
                         s->parts[i].topic, s->parts[i].partition);
        if (n < 0) break;
        used += (size_t)n;
    }
    if (used >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
}

/* Writes one beat (or PINGs when no hash is wanted). Returns 0 when Redis
 * acknowledged it, else -1 with err filled. */
static int beat_once(struct hb *h, char *err, size_t cap)
{
    if (!h->rc) {
        struct rconn_conf rc = {.host = h->host, .port = h->port, .password = h->password,
                                .db = h->db, .timeout_ms = h->timeout_ms};
        h->rc = rconn_open(&rc, &h->guard, err, cap);
        if (!h->rc) return -1;
    }
    int want = 1;
    if (!h->key) {
        const char *argv[] = {"PING"};
        redisAppendCommandArgv(h->rc, 1, argv, NULL);
    } else {
        struct stats_snapshot s;
        stats_snapshot(h->st, clock_mono_us(), &s);
        const char *reasons[1];
        int ready = stats_ready(&s, reasons, 1, NULL);
        uint64_t done = 0;
        for (int a = 0; a < STATS_N_STATUS; a++)
            for (int b = 0; b <= PROTO_ERR_SHUTTING_DOWN; b++) done += s.jobs[a][b];
        partitions_text(&s, h->parts, sizeof(h->parts));
        char v[N_FIELDS][64];
        const char *val[N_FIELDS];
        for (int i = 0; i < N_FIELDS; i++) {
            v[i][0] = '\0';
            val[i] = v[i];
        }
        val[F_ID] = h->id;
        val[F_HOST] = h->hostname;
        val[F_GROUP] = h->group;
        val[F_VERSION] = KINFER_VERSION;
        val[F_PARTITIONS] = h->parts;
        snprintf(v[F_PID], 64, "%ld", h->pid);
        snprintf(v[F_BACKEND], 64, "%s", s.backend);
        val[F_DEVICE] = s.device;
        val[F_MODELS] = s.models;
        snprintf(v[F_ASSIGNED], 64, "%" PRId64, s.assigned);
        snprintf(v[F_PAUSED], 64, "%" PRId64, s.paused);
        snprintf(v[F_QUEUE_ROWS], 64, "%" PRId64, s.queue_rows);
        snprintf(v[F_QUEUE_JOBS], 64, "%" PRId64, s.queue_jobs);
        snprintf(v[F_INFLIGHT_ROWS], 64, "%" PRId64, s.inflight_rows);
        snprintf(v[F_INFLIGHT_BATCHES], 64, "%" PRId64, s.inflight_batches);
        snprintf(v[F_LAG], 64, "%" PRId64, s.lag_total);
        snprintf(v[F_ROWS_PS], 64, "%.3f", s.rows_per_s);
        snprintf(v[F_JOBS_PS], 64, "%.3f", s.jobs_per_s);
        snprintf(v[F_JOBS_DONE], 64, "%" PRIu64, done);
        snprintf(v[F_READY], 64, "%d", ready);
        snprintf(v[F_HEALTHY], 64, "%d", s.healthy);
        snprintf(v[F_STARTED], 64, "%" PRId64, h->started_at_ms);
        /* The wall clock: `kinfer status` compares updated_at_ms across
         * machines, so it cannot be a monotonic reading. */
        snprintf(v[F_UPDATED], 64, "%" PRId64, clock_wall_ms());
        stats_snapshot_fini(&s);

        const char *argv[2 + 2 * N_FIELDS];
        argv[0] = "HSET";
        argv[1] = h->key;
        for (int i = 0; i < N_FIELDS; i++) {
            argv[2 + 2 * i] = hb_fields[i].name;
            argv[3 + 2 * i] = val[i];
        }
        redisAppendCommandArgv(h->rc, (int)(2 + 2 * N_FIELDS), argv, NULL);
        char ttl[32];
        snprintf(ttl, sizeof(ttl), "%lld", 3LL * h->interval_ms);
        const char *ex[] = {"PEXPIRE", h->key, ttl};
        redisAppendCommandArgv(h->rc, 3, ex, NULL);
        want = 2;
    }
    int rc = 0;
    for (int i = 0; i < want; i++) {
        void *rp = NULL;
        if (redisGetReply(h->rc, &rp) != REDIS_OK || !rp) {
            snprintf(err, cap, "no answer from %s:%d: %s", h->host, h->port,
                     h->rc->errstr[0] ? h->rc->errstr : "no reply");
            rc = -1;
            break;
        }
        redisReply *r = rp;
        if (r->type == REDIS_REPLY_ERROR) {
            snprintf(err, cap, "%s", r->str); /* what Redis said: OOM, WRONGPASS, ... */
            rc = -1;
        }
        freeReplyObject(r);
    }
    if (rc < 0) {
        rconn_close(h->rc, &h->guard);
        h->rc = NULL;
    }
    return rc;
}

/* One beat with its consequences: the readiness condition, the error
 * counter, and one log line when Redis goes away or comes back. */
static void beat(struct hb *h)
{
    char err[256], why[300];
    int ok = beat_once(h, err, sizeof(err)) == 0;
    if (!ok && strcmp(err, "cancelled") == 0) return; /* hb_stop cut it: not Redis's doing */
    snprintf(why, sizeof(why), "redis: %s", ok ? "" : err);
    stats_set_cond_why(h->st, STATS_COND_REDIS, ok, why);
    if (!ok) stats_heartbeat_error(h->st);
    if (!ok && !h->failing) LOG_W("heartbeat_failed", "error=\"%s\"", err);
    if (ok && h->failing) LOG_I("heartbeat_ok", "key=%s", h->key ? h->key : "(ping only)");
    h->failing = !ok;
}

/* The thread: beat, then sleep an interval on the condition variable so
 * hb_stop wakes it at once; on the way out delete the hash so `kinfer
 * status` stops listing a worker that stopped cleanly. */
static void *hb_main(void *arg)
{
    struct hb *h = arg;
    for (;;) {
        stats_alive(h->st, STATS_LOOP_HEARTBEAT);
        beat(h);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += h->interval_ms / 1000;
        until.tv_nsec += (long)(h->interval_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&h->mu);
        while (!h->stop) {
            /* Waking before the interval is up is only for stop. The
             * watchdog hears from this loop at least once an interval. */
            if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT) break;
        }
        int stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (stop) break;
    }
    stats_loop_stop(h->st, STATS_LOOP_HEARTBEAT);
    rconn_close(h->rc, &h->guard);
    h->rc = NULL;
    /* The DEL, on a connection of its own (hb_stop may have cut the last
     * one), gets whatever is left before the stop deadline: a Redis that
     * does not answer costs that, not another redis.timeout_ms. */
    pthread_mutex_lock(&h->mu);
    int64_t deadline = h->stop_deadline_us;
    pthread_mutex_unlock(&h->mu);
    int64_t left_ms = deadline ? (deadline - clock_mono_us()) / 1000 : h->timeout_ms;
    if (left_ms > h->timeout_ms) left_ms = h->timeout_ms;
    if (h->key && left_ms >= 10) {
        char err[256];
        struct rconn_conf rc = {.host = h->host, .port = h->port, .password = h->password,
                                .db = h->db, .timeout_ms = (int)left_ms};
        redisContext *c = rconn_open(&rc, NULL, err, sizeof(err));
        if (c) {
            const char *argv[] = {"DEL", h->key};
            redisReply *r = redisCommandArgv(c, 2, argv, NULL);
            if (r) freeReplyObject(r);
        }
        rconn_close(c, NULL);
    }
    return NULL;
}

/* Frees the copies; the thread is not running. */
static void hb_free(struct hb *h)
{
    rconn_close(h->rc, h->guard_ok ? &h->guard : NULL);
    if (h->guard_ok) rconn_guard_fini(&h->guard);
    free(h->host);
    free(h->password);
    free(h->key);
    free(h->id);
    free(h->hostname);
    free(h->group);
    free(h);
}

/* Copies what the thread needs so the config may go away; the thread
 * starts beating at once. */
struct hb *hb_start(const struct kcfg *c, struct stats *st, char *errstr, size_t errstr_size)
{
    struct hb *h = calloc(1, sizeof(*h));
    int mu_ok = 0, cv_ok = 0;
    pthread_condattr_t ca;
    if (!h) goto oom;
    h->st = st;
    h->port = c->redis.port;
    h->db = c->redis.db;
    h->timeout_ms = c->redis.timeout_ms;
    h->interval_ms = c->metrics.heartbeat_interval_ms > 0 ? c->metrics.heartbeat_interval_ms : 5000;
    h->pid = (long)getpid();
    h->started_at_ms = clock_wall_ms();
    char id[256], hostname[256];
    hb_worker_id(c, id, sizeof(id));
    if (gethostname(hostname, sizeof(hostname)) != 0) snprintf(hostname, sizeof(hostname), "unknown");
    hostname[sizeof(hostname) - 1] = '\0';
    h->host = strdup(c->redis.host);
    h->password = strdup(c->redis.password ? c->redis.password : "");
    h->id = strdup(id);
    h->hostname = strdup(hostname);
    h->group = strdup(c->kafka.group);
    if (!h->host || !h->password || !h->id || !h->hostname || !h->group) goto oom;
    const char *prefix = c->metrics.heartbeat_prefix ? c->metrics.heartbeat_prefix : "";
    if (*prefix) {
        size_t n = strlen(prefix) + strlen(c->kafka.group) + strlen(id) + 2;
        if (!(h->key = malloc(n))) goto oom;
        snprintf(h->key, n, "%s%s:%s", prefix, c->kafka.group, id);
    }
    if (rconn_guard_init(&h->guard) < 0) goto oom;
    h->guard_ok = 1;
    if (pthread_mutex_init(&h->mu, NULL) != 0) goto oom;
    mu_ok = 1;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    cv_ok = pthread_cond_init(&h->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!cv_ok) goto oom;
    if (pthread_create(&h->thr, NULL, hb_main, h) != 0) {
        snprintf(errstr, errstr_size, "heartbeat: cannot start a thread");
        goto fail;
    }
    LOG_I("heartbeat_started", "key=%s interval_ms=%d", h->key ? h->key : "(ping only)",
          h->interval_ms);
    return h;
oom:
    snprintf(errstr, errstr_size, "heartbeat: out of memory");
fail:
    if (h) {
        if (cv_ok) pthread_cond_destroy(&h->cv);
        if (mu_ok) pthread_mutex_destroy(&h->mu);
        hb_free(h);
    }
    return NULL;
}

/* Wakes the thread out of its interval wait, cutting short a beat that
 * Redis does not answer; it deletes the hash on its way out, so a clean
 * stop disappears from `kinfer status` at once. */
void hb_stop(struct hb *h, int64_t deadline_us)
{
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    h->stop_deadline_us = deadline_us;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    rconn_cancel(&h->guard);
    pthread_join(h->thr, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    hb_free(h);
}

/* Readers type fields by the table the writer fills; a field this version
 * does not know stays a string. */
enum hb_type hb_field_type(const char *name)
{
    for (int f = 0; f < N_FIELDS; f++)
        if (strcmp(hb_fields[f].name, name) == 0) return hb_fields[f].type;
    return HB_STR;
}

/* A key pattern for SCAN MATCH that matches the prefix literally: glob
 * characters in the prefix or the group are escaped. */
void hb_key_pattern(const char *prefix, const char *group, char *out, size_t cap)
{
    size_t n = 0;
    const char *parts[] = {prefix, group, ":*"};
    for (int p = 0; p < 3; p++) {
        for (const char *s = parts[p]; *s && n + 3 < cap; s++) {
            if (p < 2 && strchr("*?[]\\", *s)) out[n++] = '\\';
            out[n++] = *s;
        }
    }
    out[n] = '\0';
}

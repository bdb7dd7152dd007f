/* rsink.c - pipelined, timeout-bounded Redis writer over hiredis 0.14.
 *
 * hiredis 0.14 loses the command timeout when a context reconnects, so this
 * module never reconnects a context: it frees it and makes a new one
 * (rconn_open, which applies the timeout), and rsink_cancel can cut the
 * call in progress short from another thread (rconn.h).
 *
 * Threads: the sink thread owns the struct; `errors` is atomic for readers;
 * rsink_cancel from any thread. */
#include "rsink.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/log.h"
#include "../base/rconn.h"

struct rsink {
    char *host, *password, *prefix, *channel, *attempt_prefix;
    int port, db, timeout_ms, if_absent;
    void (*alive)(void *ctx);
    void (*failing)(void *ctx, const char *why);
    void *alive_ctx;
    int failed;                /* the last attempt failed (failing was told) */
    char ttl[32];
    redisContext *ctx;
    struct rconn_guard guard;  /* rsink_cancel cuts ctx's calls short */
    int guard_ok;
    int backoff_ms;            /* next wait after a failure, capped */
    unsigned char *acked;      /* scratch: one flag per job of a batch */
    size_t acked_cap;
    atomic_uint_fast64_t errors;
};

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

struct rsink *rsink_new(const struct rsink_conf *c)
{
    struct rsink *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->host = dup_or_empty(c->host);
    r->password = dup_or_empty(c->password);
    r->prefix = dup_or_empty(c->key_prefix);
    r->channel = dup_or_empty(c->publish_channel);
    r->attempt_prefix = dup_or_empty(c->attempt_prefix);
    if (!r->host || !r->password || !r->prefix || !r->channel || !r->attempt_prefix) {
        rsink_destroy(r);
        return NULL;
    }
    r->port = c->port;
    r->if_absent = c->if_absent;
    r->failing = c->failing;
    r->alive = c->alive;
    r->alive_ctx = c->alive_ctx;
    r->db = c->db;
    r->timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : 2000;
    snprintf(r->ttl, sizeof(r->ttl), "%" PRId64, c->ttl_ms);
    r->backoff_ms = BACKOFF_MIN_MS;
    atomic_init(&r->errors, 0);
    if (rconn_guard_init(&r->guard) < 0) {
        rsink_destroy(r);
        return NULL;
    }
    r->guard_ok = 1;
    return r;
}

void rsink_destroy(struct rsink *r)
{
    if (!r) return;
    rconn_close(r->ctx, r->guard_ok ? &r->guard : NULL);
    if (r->guard_ok) rconn_guard_fini(&r->guard);
    free(r->host);
    free(r->password);
    free(r->prefix);
    free(r->channel);
    free(r->attempt_prefix);
    free(r->acked);
    free(r);
}

uint64_t rsink_errors(const struct rsink *r)
{
    return atomic_load(&r->errors);
}

/* A write failed: what Redis said, or why it could not be reached, goes to
 * the failing hook (readiness names it). */
static void note_failure(struct rsink *r, const char *why)
{
    atomic_fetch_add(&r->errors, 1);
    r->failed = 1;
    if (r->failing) r->failing(r->alive_ctx, why);
}

static void drop(struct rsink *r, const char *why)
{
    note_failure(r, why);
    LOG_W("redis_error", "host=%s port=%d error=\"%s\"", r->host, r->port, why);
    rconn_close(r->ctx, &r->guard);
    r->ctx = NULL;
}

void rsink_cancel(struct rsink *r)
{
    rconn_cancel(&r->guard);
}

/* Runs one command and checks its reply is not an error. */
static int simple_cmd(struct rsink *r, const char *what, int argc,
                      const char **argv)
{
    redisReply *rep = redisCommandArgv(r->ctx, argc, argv, NULL);
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        char msg[300];
        snprintf(msg, sizeof(msg), "%s: %s", what,
                 rep ? rep->str : r->ctx->errstr);
        if (rep) freeReplyObject(rep);
        drop(r, msg);
        return -1;
    }
    freeReplyObject(rep);
    return 0;
}

/* Makes a fresh context with the timeout applied, authenticated and on the
 * right database (rconn_open). Returns 0, or -1 with no context. */
static int connect_fresh(struct rsink *r)
{
    char err[300];
    struct rconn_conf rc = {.host = r->host, .port = r->port, .password = r->password,
                            .db = r->db, .timeout_ms = r->timeout_ms};
    r->ctx = rconn_open(&rc, &r->guard, err, sizeof(err));
    if (!r->ctx) {
        drop(r, err);
        return -1;
    }
    LOG_I("redis_connected", "host=%s port=%d", r->host, r->port);
    return 0;
}

/* Sleeps the current backoff in slices so a stop request is seen within
 * ~10 ms, then doubles it up to the cap. */
static void backoff(struct rsink *r, const atomic_int *stop)
{
    for (int slept = 0; slept < r->backoff_ms && !atomic_load(stop); slept += 10) {
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
        if (r->alive) r->alive(r->alive_ctx);
    }
    r->backoff_ms = r->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                       : r->backoff_ms * 2;
}

/* An attempt counter's key of a job: prefix [solo:] topic:partition:offset. */
static size_t attempt_key(const struct rsink *r, const struct job *j, int solo, char *buf,
                          size_t cap)
{
    int n = snprintf(buf, cap, "%s%s%s:%" PRId32 ":%" PRId64, r->attempt_prefix,
                     solo ? "solo:" : "", j->topic, j->partition, j->offset);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* One pipelined attempt: append every unacknowledged SET (and PUBLISH),
 * then read every reply. Returns 0 when all were acknowledged. */
static int attempt(struct rsink *r, struct job *const *jobs, size_t n)
{
    size_t plen = strlen(r->prefix);
    char key[4096 + PROTO_ID_MAX + 1];
    int publish = r->channel[0] != 0;
    int track = r->attempt_prefix[0] != 0;
    /* A SET refused last round (2) is owed again, even when the connection
     * dropped before that round's bookkeeping finished. */
    for (size_t i = 0; i < n; i++)
        if (r->acked[i] == 2) r->acked[i] = 0;
    for (size_t i = 0; i < n; i++) {
        if (r->acked[i]) continue;
        const struct job *j = jobs[i];
        size_t idlen = strlen(j->req.id); /* prefix <= 1024 (config), id <= 200 */
        memcpy(key, r->prefix, plen);
        memcpy(key + plen, j->req.id, idlen);
        /* With NX, a key that exists is left alone and the reply is nil:
         * that is an acknowledgement too (the result is there). */
        const char *argv[] = {"SET", key, (const char *)j->body, "PX", r->ttl, "NX"};
        size_t lens[] = {3, plen + idlen, j->body_len, 2, strlen(r->ttl), 2};
        redisAppendCommandArgv(r->ctx, r->if_absent ? 6 : 5, argv, lens);
        if (publish) {
            const char *pargv[] = {"PUBLISH", r->channel, j->req.id};
            size_t plens[] = {7, strlen(r->channel), idlen};
            redisAppendCommandArgv(r->ctx, 3, pargv, plens);
        }
        if (track) {
            char akey[1400], skey[1400];
            size_t alen = attempt_key(r, j, 0, akey, sizeof(akey));
            size_t slen = attempt_key(r, j, 1, skey, sizeof(skey));
            const char *dargv[] = {"DEL", akey, skey};
            size_t dlens[] = {3, alen, slen};
            redisAppendCommandArgv(r->ctx, 3, dargv, dlens);
        }
    }
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        if (r->acked[i]) continue;
        for (int k = 0; k < 1 + publish + track; k++) {
            void *v = NULL;
            if (redisGetReply(r->ctx, &v) != REDIS_OK) {
                drop(r, r->ctx->errstr[0] ? r->ctx->errstr : "read failed");
                return -1;
            }
            redisReply *rep = v;
            if (rep->type == REDIS_REPLY_ERROR) {
                /* The connection is still in sync; retry this one later. */
                note_failure(r, rep->str);
                LOG_W("redis_reply_error", "id=%s error=\"%s\"", jobs[i]->req.id, rep->str);
                if (k == 0) {
                    ok = 0;
                    r->acked[i] = 2; /* 2: failed this round, send again */
                }
            }
            freeReplyObject(rep);
        }
        if (r->acked[i] == 0) {
            r->acked[i] = 1;
        } else if (r->acked[i] == 2) {
            r->acked[i] = 0;
        }
    }
    return ok ? 0 : -1;
}

int rsink_set_batch(struct rsink *r, struct job *const *jobs, size_t n,
                    const atomic_int *stop)
{
    if (n > r->acked_cap) {
        unsigned char *a = realloc(r->acked, n);
        if (!a) return -2; /* out of memory: the caller must not carry on */
        r->acked = a;
        r->acked_cap = n;
    }
    memset(r->acked, 0, n);
    for (;;) {
        if (r->ctx || connect_fresh(r) == 0) {
            if (attempt(r, jobs, n) == 0) {
                r->backoff_ms = BACKOFF_MIN_MS;
                if (r->failed && r->failing) r->failing(r->alive_ctx, NULL);
                r->failed = 0;
                return 0;
            }
        }
        if (atomic_load(stop)) return -1;
        backoff(r, stop);
        if (atomic_load(stop)) return -1;
    }
}

int rsink_incr_attempts(struct rsink *r, struct job *const *jobs, size_t n, long long *counts,
                        int solo)
{
    if (!r->ctx && connect_fresh(r) < 0) return -1;
    for (size_t i = 0; i < n; i++) {
        char key[1400];
        size_t klen = attempt_key(r, jobs[i], solo, key, sizeof(key));
        const char *iargv[] = {"INCR", key};
        size_t ilens[] = {4, klen};
        redisAppendCommandArgv(r->ctx, 2, iargv, ilens);
        const char *eargv[] = {"PEXPIRE", key, "3600000"};
        size_t elens[] = {7, klen, 7};
        redisAppendCommandArgv(r->ctx, 3, eargv, elens);
    }
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            void *v = NULL;
            if (redisGetReply(r->ctx, &v) != REDIS_OK) {
                drop(r, r->ctx->errstr[0] ? r->ctx->errstr : "read failed");
                return -1;
            }
            redisReply *rep = v;
            if (k == 0 && rep->type == REDIS_REPLY_INTEGER) counts[i] = rep->integer;
            else if (k == 0) ok = 0;
            freeReplyObject(rep);
        }
    }
    return ok ? 0 : -1;
}

int rsink_xadd(struct rsink *r, const char *key, size_t klen, const char *const *fields,
               const char *const *values, const size_t *vlens, size_t n, int64_t ttl_ms)
{
    if (n > 4 || (!r->ctx && connect_fresh(r) < 0)) return -1;
    const char *argv[3 + 8] = {"XADD", key, "*"};
    size_t lens[3 + 8] = {4, klen, 1};
    for (size_t i = 0; i < n; i++) {
        argv[3 + 2 * i] = fields[i];
        lens[3 + 2 * i] = strlen(fields[i]);
        argv[4 + 2 * i] = values[i];
        lens[4 + 2 * i] = vlens[i];
    }
    redisAppendCommandArgv(r->ctx, (int)(3 + 2 * n), argv, lens);
    char ttl[24];
    int tl = snprintf(ttl, sizeof(ttl), "%" PRId64, ttl_ms);
    const char *eargv[] = {"PEXPIRE", key, ttl};
    size_t elens[] = {7, klen, (size_t)tl};
    redisAppendCommandArgv(r->ctx, 3, eargv, elens);
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        void *v = NULL;
        if (redisGetReply(r->ctx, &v) != REDIS_OK) {
            drop(r, r->ctx->errstr[0] ? r->ctx->errstr : "read failed");
            return -1;
        }
        redisReply *rep = v;
        if (rep->type == REDIS_REPLY_ERROR) ok = 0;
        freeReplyObject(rep);
    }
    return ok ? 0 : -1;
}

int rsink_ping(struct rsink *r)
{
    if (!r->ctx && connect_fresh(r) < 0) return -1;
    const char *argv[] = {"PING"};
    return simple_cmd(r, "PING", 1, argv);
}

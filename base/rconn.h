/* rconn.h - the one way kinfer opens a Redis connection (the result sink,
 * the executors' attempt counters, the heartbeat, `kinfer status`), and a
 * guard that lets another thread cut a connection's calls short.
 *
 * hiredis 0.14 blocks in connect, write and read up to its timeout. A
 * frozen Redis (SIGSTOP, a network blackhole) therefore held every thread
 * that talked to it for redis.timeout_ms after a stop was asked for, and
 * a worker told to stop within worker.drain_timeout_ms took that long and
 * more. rconn_cancel ends a blocked call at once (it shuts the socket
 * down, so the read or write in progress returns) and makes every later
 * rconn_open on the same guard fail at once; a connect in progress sees it
 * within RCONN_SLICE_MS.
 *
 * Threads: a guard belongs to the thread that opens and closes its
 * connections; rconn_cancel may be called from any thread, any number of
 * times. Ownership: rconn_open returns a new context attached to the
 * guard; give it back with rconn_close (never redisFree: the guard must
 * let go of its socket first). */
#ifndef KINFER_RCONN_H
#define KINFER_RCONN_H

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stddef.h>

#define RCONN_SLICE_MS 20 /* a cancelled connect gives up within this */

struct rconn_guard {
    pthread_mutex_t mu;
    int fd;        /* the attached connection's socket, -1 = none */
    int cancelled;
};

/* What to connect to; strings borrowed for the call. */
struct rconn_conf {
    const char *host;
    int port;
    const char *password; /* "" or NULL: no AUTH */
    int db;
    int timeout_ms;       /* connect and every command */
};

/* Makes g open and not cancelled. Returns 0 or -1. */
int rconn_guard_init(struct rconn_guard *g);
void rconn_guard_fini(struct rconn_guard *g);

/* Cuts g's connection short: a call blocked on it returns an error now,
 * later rconn_open calls on g fail. Any thread; idempotent. */
void rconn_cancel(struct rconn_guard *g);

/* Connects (the timeout bounds the connect and is applied to every
 * command), authenticates and selects the database. g may be NULL (no one
 * will cancel). Returns a new context attached to g, or NULL with err
 * filled: "connect HOST:PORT: why", or Redis's own reply to AUTH or
 * SELECT ("WRONGPASS ..."), or "cancelled". Host names are resolved with
 * getaddrinfo, which the timeout does not bound. */
redisContext *rconn_open(const struct rconn_conf *c, struct rconn_guard *g, char *err,
                         size_t cap);

/* Detaches ctx from g (may be NULL) and frees it. Accepts a NULL ctx. */
void rconn_close(redisContext *ctx, struct rconn_guard *g);

#endif

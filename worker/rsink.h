/* rsink.h - results to Redis: `SET <prefix><id> <body> PX <ttl>` for a
 * batch of jobs in one pipelined round trip (plus `PUBLISH <channel> <id>`
 * when a channel is configured). Any error or timeout drops the connection
 * (a hiredis context that saw an error is never reused); the next attempt
 * reconnects with capped backoff, re-applies the command timeout, and
 * re-sends every SET whose reply was not read (docs/reliability.md, rule 8).
 *
 * Threads: one sink thread owns an rsink; rsink_errors may be read by any
 * thread. */
#ifndef KINFER_RSINK_H
#define KINFER_RSINK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../batching/job.h"

struct rsink_conf {
    const char *host;
    int port;
    const char *password;        /* "" or NULL: no AUTH */
    int db;
    const char *key_prefix;
    int64_t ttl_ms;
    int timeout_ms;              /* connect and per-command timeout */
    const char *publish_channel; /* "" or NULL: no PUBLISH */
    int if_absent;               /* SET ... NX: never overwrite an existing key */
    /* Called while retrying (every backoff slice), so a caller's watchdog
     * sees a thread that waits on Redis as alive, not hung. May be NULL. */
    void (*alive)(void *ctx);
    /* Called (with alive_ctx) when a write fails, with what Redis said or
     * why it could not be reached, and with NULL when a write succeeds
     * after one failed: readiness names a sink that cannot deliver. May
     * be NULL. */
    void (*failing)(void *ctx, const char *why);
    void *alive_ctx;
    /* Attempt counters (worker.attempt_prefix); NULL = none. When set,
     * rsink_set_batch also deletes each job's counter in the same round
     * trip: the job is finished. */
    const char *attempt_prefix;
};

struct rsink;

/* Returns a new sink (not yet connected) or NULL. Copies conf. */
struct rsink *rsink_new(const struct rsink_conf *conf);
void rsink_destroy(struct rsink *r);

/* Writes the body of each of the n jobs. Retries until every SET is
 * acknowledged (returns 0) or *stop becomes nonzero (returns -1: some SETs
 * may be unacknowledged, so the caller counts none of the n done); -2 when
 * out of memory. Borrows jobs. The timeout bounds each connect, write and
 * read; host name resolution is not bounded by it (use an address or a
 * local resolver cache where that matters). */
int rsink_set_batch(struct rsink *r, struct job *const *jobs, size_t n,
                    const atomic_int *stop);

/* Increments each job's attempt counter (INCR + PEXPIRE 1 h, one
 * pipelined round trip, one try) and stores the new counts in counts[].
 * solo selects the second counter, of runs alone. Returns 0, or -1 when
 * Redis did not answer (counts untouched). */
int rsink_incr_attempts(struct rsink *r, struct job *const *jobs, size_t n, long long *counts,
                        int solo);

/* Cuts the call in progress short (it fails at once) and makes every later
 * one fail at once: for stopping within a deadline while Redis does not
 * answer. Any thread. */
void rsink_cancel(struct rsink *r);

/* Appends one entry to the stream key (klen bytes): XADD key * with the
 * n field / value pairs (value lengths in vlens), then PEXPIRE key
 * ttl_ms, in one round trip, one try. Returns 0, or -1 when Redis did
 * not take it. */
int rsink_xadd(struct rsink *r, const char *key, size_t klen, const char *const *fields,
               const char *const *values, const size_t *vlens, size_t n, int64_t ttl_ms);

/* One PING round trip: 0 if Redis answered within the timeout, else -1. */
int rsink_ping(struct rsink *r);

/* Failed attempts (connection errors, timeouts, error replies) so far. */
uint64_t rsink_errors(const struct rsink *r);

#endif

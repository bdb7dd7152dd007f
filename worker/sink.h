/* sink.h - the pipeline's last stage: publishes every finished job, the
 * result to the reply topic and Redis (one pipelined round trip per
 * batch), a dead letter to the dead-letter topic, and hands a job to the
 * done queue once both acknowledgements are in (docs/reliability.md, rule
 * 1). Failed deliveries are produced again after a pause; their offsets
 * stay uncommitted meanwhile.
 *
 * Threads: sink_new, sink_stop, sink_flush and sink_destroy on the
 * lifecycle's thread; the sink thread (sink_start) consumes its input
 * queue and serves the producer's delivery reports. Ownership: jobs come
 * in through the input queue and leave through the done queue; jobs given
 * up at a stop with Redis unreachable stay with the sink (never done, so
 * never committed) until sink_destroy. */
#ifndef KINFER_SINK_H
#define KINFER_SINK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../telemetry/stats.h"
#include "../config/config.h"
#include "jobq.h"
#include "worker.h"

struct sink_conf {
    const struct kcfg *cfg;       /* borrowed; outlives the sink */
    const char *reply_topic;      /* borrowed */
    enum worker_redis_mode redis; /* results to Redis: SET, SET NX, or not at all */
    struct jobq *in;              /* finished jobs (executors, intake) */
    struct jobq *done;            /* acknowledged jobs (to the offsets) */
    struct stats *stats;
    atomic_int *fatal;            /* set when the process must stop */
};

struct sink;

/* Makes the producer and the Redis writer (not yet connected). Returns a
 * new sink, or NULL with errstr filled. Borrows c; what it points at must
 * outlive the sink. */
struct sink *sink_new(const struct sink_conf *c, char *errstr, size_t errstr_size);

/* The largest record the producer can publish, less room for key,
 * headers and framing: results and dead letters are kept below it. */
size_t sink_max_record_bytes(const struct sink *s);

/* One PING round trip to Redis: 0 if it answered within the timeout. */
int sink_redis_ping(struct sink *s);

/* Failed Redis attempts so far (any thread). */
uint64_t sink_redis_errors(const struct sink *s);
/* 1 once the producer has had an answer from a broker (it holds cluster
 * metadata); never blocks. */
int sink_broker_reached(struct sink *s);

/* Starts the sink thread. Returns 0, or -1 when it cannot start. */
int sink_start(struct sink *s);

/* Cuts short the Redis write in progress and every later one (they fail
 * at once; their jobs stay uncommitted): when a stop must keep its
 * deadline with Redis not answering. Any thread; before sink_stop. */
void sink_cut(struct sink *s);

/* Stops the sink thread after its current round (a Redis retry gives up)
 * and closes the input queue's batch accounting. */
void sink_stop(struct sink *s);

/* Serves the producer until every delivery is reported or timeout_ms
 * passes: the jobs that complete go to the done queue. After sink_stop. */
void sink_flush(struct sink *s, int timeout_ms);

/* Purges what the producer still holds and frees everything. Accepts
 * NULL. */
void sink_destroy(struct sink *s);

#endif

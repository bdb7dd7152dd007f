/* worker.h - the kinfer worker: Kafka -> batcher -> model -> reply topic +
 * Redis, at least once.
 *
 * Threads: worker_run runs the poll loop on the calling thread and starts
 * one executor thread and one sink thread of its own. */
#ifndef KINFER_WORKER_H
#define KINFER_WORKER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "../codecs/protocol.h"
#include "../config/config.h"

/* Exit statuses of worker_run, for main to return. */
enum worker_exit {
    WORKER_EXIT_OK = 0,       /* drained and committed after a stop request */
    WORKER_EXIT_STARTUP = 1,  /* could not start: bad model, bad Kafka config */
    WORKER_EXIT_FATAL = 2,    /* a fatal runtime error: restart me */
};

/* How results are written to Redis. */
enum worker_redis_mode {
    WORKER_REDIS_SET = 0,  /* SET key body PX ttl: always (the worker's mode) */
    WORKER_REDIS_OFF,      /* no Redis at all: the reply topic only */
    WORKER_REDIS_IF_ABSENT /* SET ... NX: never overwrite an existing result */
};

/* One partition's bounded range, for assign mode: records at offsets
 * start <= offset < end are processed, then the partition is done. */
struct worker_range {
    char topic[PROTO_TOPIC_MAX + 1];
    int32_t partition;
    int64_t start;   /* first offset to process */
    int64_t end;     /* one past the last; start >= end: nothing to do */
};

/* What a bounded run has done so far, handed to the progress callback. */
struct worker_progress {
    const struct worker_range *ranges; /* borrowed from the opts */
    const int64_t *done;               /* per range: jobs finished (both acks) */
    size_t n_ranges;
    uint64_t ok, failed, dead_lettered;
    double elapsed_s;
    int finished;                      /* 1 on the last call */
};

/* Options for runs other than the plain worker (replay). Zeroed means the
 * worker as configured, except priority: set it to -1 to keep the jobs'. */
struct worker_opts {
    const char *group;            /* consumer group for commits; NULL = kafka.group */
    const char *reply_topic;      /* NULL = kafka.reply_topic */
    enum worker_redis_mode redis;
    const char *model;            /* run every job on this model; NULL = as asked */
    int priority;                 /* 0..9 for every job; -1 = as given */
    double rate;                  /* jobs per second cap; 0 = none */
    int ignore_deadlines;         /* run jobs whatever their deadline_ms / timeout_ms
                                     (history: those instants have passed) */
    /* Assign mode: these partitions and ranges, no group subscription (so
     * no live group is joined or rebalanced); the run ends, exit 0, when
     * every range is done. NULL = subscribe to kafka.topics. */
    const struct worker_range *ranges;
    size_t n_ranges;
    /* Called on the poll thread about every progress_ms, and once at the
     * end with finished = 1. May be NULL. */
    void (*progress)(void *ctx, const struct worker_progress *p);
    void *progress_ctx;
    int progress_ms;
};

/* Runs the worker on c until *stop becomes nonzero (set by a signal
 * handler), then drains: stops fetching, finishes in-flight jobs within
 * worker.drain_timeout_ms, flushes, commits and closes. With opts (may be
 * NULL) it runs bounded ranges instead (see struct worker_opts). Borrows
 * c and opts. */
enum worker_exit worker_run(const struct kcfg *c, const struct worker_opts *opts,
                            volatile sig_atomic_t *stop);

#endif

/* exec.h - the executor stage: threads that take closed batches from the
 * batcher, run each through its model in one forward pass, encode every
 * job's result and push the batch to the sink's queue. Before a batch
 * runs, each job's attempt counter goes up in Redis, so a job that
 * crashes the worker is found and answered instead of run forever
 * (docs/reliability.md, rule 10).
 *
 * At most batching.max_inflight_batches closed batches are running or
 * waiting to be written out at once; more wait in the batcher, whose depth
 * pauses fetching.
 *
 * Threads: exec_start and exec_stop on the lifecycle's thread; the
 * executor threads; exec_inflight_batches from any thread. Ownership: a
 * batch is the executor's from the batcher until it is pushed to the sink;
 * a batch whose forward pass failed for good (MODEL_EFATAL) is dropped
 * unanswered, and the worker stops. */
#ifndef KINFER_EXEC_H
#define KINFER_EXEC_H

#include <stdatomic.h>
#include <stddef.h>

#include "../batching/batcher.h"
#include "../gpu/model.h"
#include "../telemetry/stats.h"
#include "../config/config.h"
#include "jobq.h"

struct exec_conf {
    const struct kcfg *cfg;       /* borrowed; outlives the stage */
    size_t n_threads;             /* executors to start, >= 1 */
    struct model *const *models;  /* by model index, borrowed */
    size_t n_models;
    struct batcher *batcher;      /* where closed batches come from */
    struct jobq *out;             /* the sink's queue */
    struct stats *stats;
    atomic_int *fatal;            /* set when the process must stop */
    size_t max_record_bytes;      /* a result larger than this is answered an error */
    int count_attempts;           /* attempt counters in Redis (rule 10) */
    /* A job that ran keeps only its result (its input is freed), so from
     * then on it counts against the in-flight bound by the result's size
     * in input rows: its weight drops, and the rows it shed are added
     * here for the intake to take off its count (intake_conf). */
    atomic_size_t *lightened;
};

struct exec;

/* Starts c->n_threads executors, each with its own workspaces made on
 * its own slot (which picks its device on a GPU). Returns the stage, or NULL
 * with errstr filled when a thread cannot start. */
struct exec *exec_start(const struct exec_conf *c, char *errstr, size_t errstr_size);

/* Threads running. */
size_t exec_threads(const struct exec *ex);

/* Batches taken by an executor and not yet written out by the sink. */
int exec_inflight_batches(const struct exec *ex);

/* Cuts short the Redis calls of the executors (their attempt counters),
 * in progress and to come: when a stop must keep its deadline with Redis
 * not answering. Any thread; before exec_stop. Accepts NULL. */
void exec_cut(struct exec *ex);

/* Stops the batcher and the threads (each finishes its batch) and frees
 * ex. Accepts NULL. */
void exec_stop(struct exec *ex);

#endif

/* batcher.h - groups queued jobs into batches per model. A batch closes
 * when its rows reach max_batch_rows or when its oldest job has waited
 * max_wait_ms (the timer starts at that job's arrival, not at the last
 * flush). A job larger than max_batch_rows runs alone. A batch never mixes
 * models.
 *
 * Threads: the poll thread pushes; executor threads take batches; any
 * thread may read the counters. Internally locked. */
#ifndef KINFER_BATCHER_H
#define KINFER_BATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "../codecs/job.h"

struct batcher_conf {
    size_t n_models;       /* queues: one per model index */
    size_t max_batch_rows;
    int max_wait_ms;
};

struct batcher;

/* Returns a new batcher or NULL. Borrows conf. */
struct batcher *batcher_new(const struct batcher_conf *conf);

/* Frees the batcher and every job still queued in it. Accepts NULL. */
void batcher_destroy(struct batcher *b);

/* Queues job (takes ownership). job->model_idx (< n_models), job->rows (>=
 * 1) and job->arrived_us (monotonic) must be set. Never blocks on a batch
 * being formed: the caller bounds how much it queues. */
void batcher_push(struct batcher *b, struct job *job);

/* Waits up to timeout_ms for a closed batch. Returns its jobs in arrival
 * order linked through ->next (caller takes ownership) and their row count
 * in *rows, or NULL when nothing closed in time or the batcher is stopped
 * and empty. After batcher_close, everything queued is returned at once
 * without waiting (drain). */
struct job *batcher_next(struct batcher *b, int timeout_ms, size_t *rows);

/* Removes every queued job of topic/partition (revoked: they must not run
 * here any more) and returns them linked through ->next (caller owns). */
struct job *batcher_purge(struct batcher *b, const char *topic,
                          int32_t partition);

/* Drain mode: queued jobs close at once; waiters wake. */
void batcher_close(struct batcher *b);

/* Stop: batcher_next returns NULL from now on, even if jobs remain. */
void batcher_stop(struct batcher *b);

/* Queue depth. */
size_t batcher_queued_rows(struct batcher *b);
size_t batcher_queued_jobs(struct batcher *b);

/* Monotonic clock in microseconds (the batcher's time base). */
int64_t batcher_now_us(void);

#endif

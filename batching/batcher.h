/* batcher.h - groups queued jobs into batches, one queue per model (a batch
 * never mixes models). A model's queued jobs close into a batch when any of
 * these holds, checked in this order:
 *   size      its rows reach max_batch_rows (rows, not jobs, count);
 *   deadline  waiting longer would miss the earliest deadline queued, given
 *             the model's measured time for a batch of that size;
 *   wait      its oldest job has waited max_wait_ms (the timer starts at
 *             that job's arrival, not at the last flush);
 *   drain     the batcher is closing (shutdown).
 * Within a model, jobs are taken by effective priority: the job's priority
 * (0..9, higher first) plus one level per aging_ms it has waited, so low
 * priority work still progresses under sustained high priority load; equal
 * effective priority goes oldest first. A job larger than max_batch_rows
 * runs alone. A batch closed by time (wait or deadline) with preferred
 * sizes configured is cut to the largest preferred size its rows can fill;
 * the rest stays queued with its original arrival time.
 *
 * Jobs whose deadline passes while queued are taken out by batcher_expire
 * (the caller answers them deadline_exceeded); they never run.
 *
 * Time is the monotonic clock in microseconds, injectable for tests.
 *
 * Threads: the poll thread pushes, purges and expires; executor threads
 * take batches; any thread may read the stats. Internally locked. */
#ifndef KINFER_BATCHER_H
#define KINFER_BATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "job.h"

#define BATCHER_PRIORITIES 10
#define BATCHER_PREFERRED_MAX 16

enum batcher_reason {
    BATCH_SIZE = 0,
    BATCH_DEADLINE,
    BATCH_WAIT,
    BATCH_DRAIN,
    BATCH_REASONS
};

struct batcher_conf {
    size_t n_models;              /* queues: one per model index, >= 1 */
    size_t max_batch_rows;        /* >= 1 */
    int max_wait_ms;
    int aging_ms;                 /* one priority level per aging_ms waited; 0 = none */
    size_t preferred[BATCHER_PREFERRED_MAX]; /* increasing; cut sizes for time closes */
    size_t n_preferred;
    size_t max_batch_tokens;      /* encoder batches: rows x longest row; 0 = no limit */
    int group_by_length;          /* encoder batches: by length bucket (above) */
    int64_t (*clock)(void *ctx);  /* monotonic microseconds; NULL = clock_mono_us */
    void *clock_ctx;
};

/* A snapshot for metrics and logs. */
struct batcher_stats {
    uint64_t closed[BATCH_REASONS]; /* batches closed, by reason */
    uint64_t expired;               /* jobs taken out by batcher_expire */
    size_t queued_rows, queued_jobs;
    size_t queued_tokens;           /* encoder jobs' padded tokens queued */
    int64_t oldest_age_us;          /* oldest queued job's wait; 0 if none */
};

struct batcher;

/* Returns a new batcher or NULL. Copies conf. */
struct batcher *batcher_new(const struct batcher_conf *conf);

/* Frees the batcher and every job still queued in it. Accepts NULL. */
void batcher_destroy(struct batcher *b);

/* Queues job (takes ownership). Requires job->model_idx < n_models, rows >=
 * 1, priority 0..9 and arrived_us set; deadline_us is 0 or a monotonic
 * deadline. Never blocks on a batch: the caller bounds what it queues. */
void batcher_push(struct batcher *b, struct job *job);

/* The non-blocking core: the batch that is closed at time now, or NULL.
 * A batch comes back linked through ->next (caller owns it), its rows in
 * *rows and why it closed in *why (either may be NULL). When NULL, *wake_us
 * (if not NULL) is the earliest time something may close (INT64_MAX when
 * nothing is queued). */
struct job *batcher_take(struct batcher *b, int64_t now_us, size_t *rows,
                         enum batcher_reason *why, int64_t *wake_us);

/* Waits up to timeout_ms (on the batcher's clock, sleeping on a condition
 * variable) for batcher_take to give a batch. Returns NULL on timeout or
 * once stopped. After batcher_close everything queued closes at once. */
struct job *batcher_next(struct batcher *b, int timeout_ms, size_t *rows,
                         enum batcher_reason *why);

/* Takes out every queued job whose deadline is at or before now and
 * returns them linked through ->next (caller owns them). *next_deadline_us
 * (if not NULL) gets the earliest deadline still queued, INT64_MAX if none. */
struct job *batcher_expire(struct batcher *b, int64_t now_us,
                           int64_t *next_deadline_us);

/* Removes every queued job of topic/partition (revoked: they must not run
 * here any more) and returns them linked through ->next (caller owns). */
struct job *batcher_purge(struct batcher *b, const char *topic,
                          int32_t partition);

/* Feeds the per-model, per-size estimate of a batch's run time that the
 * deadline rule uses: seconds a batch of `units` took on model_idx, its
 * rows (a layer model's) or its padded tokens (an encoder's). */
void batcher_record(struct batcher *b, int model_idx, size_t units, double seconds);

/* The current estimate in seconds for a batch of units on model_idx (0
 * when nothing has been measured). */
double batcher_estimate(struct batcher *b, int model_idx, size_t units);

/* The length bucket group_by_length groups a row of len tokens in: 0 up
 * to 16 tokens, then four per power of two (17-20, 21-24, 25-28, 29-32,
 * 33-40, ..., 113-128, ...): rows of one bucket differ by less than a
 * fifth of its longest. */
int batcher_len_bucket(size_t len);

/* The padded tokens of a batch (linked through ->next): its rows times
 * its longest row; 0 for a layer model's batch. */
size_t batcher_padded_tokens(const struct job *batch);

/* Drain mode: queued jobs close at once; waiters wake. */
void batcher_close(struct batcher *b);

/* Stop: batcher_next returns NULL from now on, even if jobs remain. */
void batcher_stop(struct batcher *b);

/* Fills *out with the counters and the queue depth at now_us. */
void batcher_get_stats(struct batcher *b, int64_t now_us, struct batcher_stats *out);

/* Queue depth. */
size_t batcher_queued_rows(struct batcher *b);
size_t batcher_queued_jobs(struct batcher *b);

/* The batcher's clock: its conf clock, or the monotonic one. */
int64_t batcher_clock(const struct batcher *b);

/* "size", "deadline", "wait", "drain". */
const char *batcher_reason_name(enum batcher_reason r);

#endif

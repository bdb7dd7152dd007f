/* jobq.h - a queue of jobs between two pipeline stages: intake and
 * executors push finished work to the sink through one, the sink hands
 * acknowledged jobs back through another (docs/architecture.md). A mutex
 * protected FIFO of lists linked through job->next, with a condition
 * variable for the consumer to wait on.
 *
 * It also counts batches: a list pushed with jobs marked batch_last adds
 * that many to `pushed`, and the consumer reports how many it has written
 * out. The difference is how many closed batches the queue's consumer
 * still holds, which the executors count against
 * batching.max_inflight_batches.
 *
 * Threads: any number of producers and one consumer; every call is
 * thread-safe. Ownership: jobq_push takes the jobs, jobq_take hands them
 * over. */
#ifndef KINFER_JOBQ_H
#define KINFER_JOBQ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../batching/job.h"

struct jobq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *head, *tail;
    atomic_uint_fast64_t pushed;  /* batches pushed (batch_last marks) */
    atomic_uint_fast64_t written; /* batches the consumer has written out */
    atomic_int closed;            /* the consumer is gone: waiters stop waiting */
};

/* Makes q empty and open. */
void jobq_init(struct jobq *q);
/* Frees every job still queued and q's locks. */
void jobq_fini(struct jobq *q);

/* Appends list (linked through ->next, may be NULL) and wakes the consumer;
 * counts its batch_last marks as pushed batches. Takes ownership. */
void jobq_push(struct jobq *q, struct job *list);

/* Takes everything queued, waiting up to wait_ms for something to come
 * (0: don't wait). Returns the list, or NULL. */
struct job *jobq_take(struct jobq *q, int wait_ms);

/* The consumer has written out n batches. */
void jobq_written(struct jobq *q, unsigned n);
/* Batches pushed and not yet written out. */
uint64_t jobq_unwritten(struct jobq *q);
/* Batches pushed so far (a mark for jobq_wait_written). */
uint64_t jobq_pushed(struct jobq *q);

/* Waits until `target` batches have been written out, q is closed, or
 * *stop becomes nonzero (stop may be NULL). Polls every millisecond: it
 * serves the rare path of a suspect job, not the hot one. */
void jobq_wait_written(struct jobq *q, uint64_t target, const atomic_int *stop);

/* The consumer stops: jobq_wait_written returns from now on. */
void jobq_close(struct jobq *q);

#endif

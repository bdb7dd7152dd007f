/* jobq.c - the queues between pipeline stages (jobq.h).
 *
 * Threads: any; the list is under the mutex, the batch counters are
 * atomics. */
#include "jobq.h"

#include <time.h>

void jobq_init(struct jobq *q)
{
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->head = q->tail = NULL;
    atomic_init(&q->pushed, 0);
    atomic_init(&q->written, 0);
    atomic_init(&q->closed, 0);
}

void jobq_fini(struct jobq *q)
{
    job_free_list(q->head);
    q->head = q->tail = NULL;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

/* The list is walked outside the lock: it is the caller's until pushed. */
void jobq_push(struct jobq *q, struct job *list)
{
    if (!list) return;
    struct job *last = list;
    unsigned batches = list->batch_last;
    while (last->next) {
        last = last->next;
        batches += last->batch_last;
    }
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = list;
    else q->head = list;
    q->tail = last;
    if (batches) atomic_fetch_add(&q->pushed, batches);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

struct job *jobq_take(struct jobq *q, int wait_ms)
{
    pthread_mutex_lock(&q->mu);
    if (!q->head && wait_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    }
    struct job *list = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    return list;
}

void jobq_written(struct jobq *q, unsigned n)
{
    if (n) atomic_fetch_add(&q->written, n);
}

uint64_t jobq_unwritten(struct jobq *q)
{
    uint64_t w = atomic_load(&q->written), p = atomic_load(&q->pushed);
    return p > w ? p - w : 0;
}

uint64_t jobq_pushed(struct jobq *q)
{
    return atomic_load(&q->pushed);
}

void jobq_wait_written(struct jobq *q, uint64_t target, const atomic_int *stop)
{
    struct timespec ms = {0, 1000000};
    while (atomic_load(&q->written) < target && !atomic_load(&q->closed) &&
           !(stop && atomic_load(stop)))
        nanosleep(&ms, NULL);
}

void jobq_close(struct jobq *q)
{
    atomic_store(&q->closed, 1);
}

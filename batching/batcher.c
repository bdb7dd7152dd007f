/* batcher.c - one FIFO queue per model under one mutex. The poll thread
 * pushes and signals; executor threads wait on the condition variable with
 * a deadline equal to the earliest "oldest job + max_wait" among queues, so
 * a batch closes on time even when no new job arrives.
 *
 * Threads: poll thread (push, purge, close), executors (next). */
#include "batcher.h"

#include <string.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct bqueue {
    struct job *head, *tail;
    size_t rows, jobs;
};

struct batcher {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct bqueue *q;
    size_t n_models;
    size_t max_rows;
    int64_t max_wait_us;
    size_t rows, jobs;
    int closing, stopped;
};

int64_t batcher_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

struct batcher *batcher_new(const struct batcher_conf *conf)
{
    struct batcher *b = calloc(1, sizeof(*b));
    if (!b) return NULL;
    b->q = calloc(conf->n_models ? conf->n_models : 1, sizeof(*b->q));
    if (!b->q) {
        free(b);
        return NULL;
    }
    b->n_models = conf->n_models;
    b->max_rows = conf->max_batch_rows ? conf->max_batch_rows : 1;
    b->max_wait_us = (int64_t)conf->max_wait_ms * 1000;
    pthread_mutex_init(&b->mu, NULL);
    /* Timed waits use the monotonic clock so wall-clock jumps don't stall
     * or rush a batch. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    return b;
}

static void free_list(struct job *j)
{
    while (j) {
        struct job *next = j->next;
        job_free(j);
        j = next;
    }
}

void batcher_destroy(struct batcher *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->n_models; i++) free_list(b->q[i].head);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b->q);
    free(b);
}

void batcher_push(struct batcher *b, struct job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&b->mu);
    struct bqueue *q = &b->q[job->model_idx];
    if (q->tail) q->tail->next = job;
    else q->head = job;
    q->tail = job;
    q->rows += job->rows;
    q->jobs++;
    b->rows += job->rows;
    b->jobs++;
    /* Wake a waiter: either this push filled a batch or the waiter must
     * recompute its deadline from a queue that was empty. */
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Cuts the first batch off q: jobs in order while they fit in max_rows; a
 * first job larger than max_rows goes alone. Caller holds the lock. */
static struct job *cut(struct batcher *b, struct bqueue *q, size_t *rows)
{
    struct job *first = q->head, *last = first;
    size_t n = first->rows, cnt = 1;
    while (last->next && n + last->next->rows <= b->max_rows) {
        last = last->next;
        n += last->rows;
        cnt++;
    }
    q->head = last->next;
    if (!q->head) q->tail = NULL;
    last->next = NULL;
    q->rows -= n;
    q->jobs -= cnt;
    b->rows -= n;
    b->jobs -= cnt;
    *rows = n;
    return first;
}

struct job *batcher_next(struct batcher *b, int timeout_ms, size_t *rows)
{
    int64_t give_up = batcher_now_us() + (int64_t)timeout_ms * 1000;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (b->stopped) break;
        int64_t now = batcher_now_us();
        int64_t wake = give_up;
        struct bqueue *pick = NULL;
        int64_t pick_age = -1;
        for (size_t i = 0; i < b->n_models; i++) {
            struct bqueue *q = &b->q[i];
            if (!q->head) continue;
            int64_t due = q->head->arrived_us + b->max_wait_us;
            int ready = b->closing || q->rows >= b->max_rows || due <= now;
            if (ready) {
                /* Among ready queues, serve the one whose oldest job has
                 * waited longest, so no model starves another. */
                int64_t age = now - q->head->arrived_us;
                if (age > pick_age) {
                    pick = q;
                    pick_age = age;
                }
            } else if (due < wake) {
                wake = due;
            }
        }
        if (pick) {
            struct job *batch = cut(b, pick, rows);
            if (b->jobs) pthread_cond_signal(&b->cv); /* more may be ready */
            pthread_mutex_unlock(&b->mu);
            return batch;
        }
        if (now >= give_up) break;
        struct timespec ts = {.tv_sec = wake / 1000000,
                              .tv_nsec = (wake % 1000000) * 1000};
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    pthread_mutex_unlock(&b->mu);
    *rows = 0;
    return NULL;
}

struct job *batcher_purge(struct batcher *b, const char *topic,
                          int32_t partition)
{
    struct job *out = NULL, **out_tail = &out;
    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < b->n_models; i++) {
        struct bqueue *q = &b->q[i];
        struct job **pp = &q->head, *prev = NULL;
        while (*pp) {
            struct job *j = *pp;
            if (j->partition == partition && strcmp(j->topic, topic) == 0) {
                *pp = j->next;
                q->rows -= j->rows;
                q->jobs--;
                b->rows -= j->rows;
                b->jobs--;
                j->next = NULL;
                *out_tail = j;
                out_tail = &j->next;
            } else {
                prev = j;
                pp = &j->next;
            }
        }
        q->tail = prev;
    }
    pthread_mutex_unlock(&b->mu);
    return out;
}

void batcher_close(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    b->closing = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void batcher_stop(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    b->stopped = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

size_t batcher_queued_rows(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    size_t n = b->rows;
    pthread_mutex_unlock(&b->mu);
    return n;
}

size_t batcher_queued_jobs(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    size_t n = b->jobs;
    pthread_mutex_unlock(&b->mu);
    return n;
}

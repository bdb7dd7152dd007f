/* test_jobq.c - worker/jobq: the queues between pipeline stages. Order is
 * kept across pushes, batch_last marks count as pushed batches, what the
 * consumer reports written leaves the unwritten count, a waiter returns
 * once its target is written or the queue is closed or stopped, and
 * several producer threads lose nothing.
 *
 * Threads: the last test runs four producers against one consumer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../worker/jobq.h"
#include "testutil.h"

/* A list of n jobs with offsets from..from+n-1; the last one ends a batch
 * when batch is set. */
static struct job *make_list(int64_t from, size_t n, int batch)
{
    struct job *head = NULL, **tail = &head;
    for (size_t i = 0; i < n; i++) {
        struct job *j = job_new();
        assert_non_null(j);
        j->offset = from + (int64_t)i;
        j->batch_last = batch && i + 1 == n;
        *tail = j;
        tail = &j->next;
    }
    return head;
}

/* Lists come out in the order they went in, joined into one. */
static void test_order_and_counts(void **state)
{
    (void)state;
    struct jobq q;
    jobq_init(&q);
    assert_null(jobq_take(&q, 0));
    size_t sizes[3] = {1 + tu_rand64() % 5, 1 + tu_rand64() % 5, 1 + tu_rand64() % 5};
    int64_t at = 0;
    for (int i = 0; i < 3; i++) {
        jobq_push(&q, make_list(at, sizes[i], i != 1)); /* the middle one: answers, no batch */
        at += (int64_t)sizes[i];
    }
    jobq_push(&q, NULL); /* nothing: no change */
    assert_int_equal(jobq_pushed(&q), 2);
    assert_int_equal(jobq_unwritten(&q), 2);
    struct job *l = jobq_take(&q, 0);
    int64_t want = 0;
    for (struct job *j = l; j; j = j->next) assert_int_equal(j->offset, want++);
    assert_int_equal(want, at);
    job_free_list(l);
    assert_null(jobq_take(&q, 1)); /* empty: waits a little, then nothing */
    jobq_written(&q, 1);
    assert_int_equal(jobq_unwritten(&q), 1);
    jobq_written(&q, 1);
    assert_int_equal(jobq_unwritten(&q), 0);
    jobq_push(&q, make_list(0, 3, 1)); /* left queued: jobq_fini frees it */
    jobq_fini(&q);
}

struct writer {
    struct jobq *q;
    unsigned n;
};

/* Reports n batches written, one at a time, a millisecond apart. */
static void *write_later(void *arg)
{
    struct writer *w = arg;
    for (unsigned i = 0; i < w->n; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        jobq_written(w->q, 1);
    }
    return NULL;
}

/* jobq_wait_written returns once the target is written out; on a closed
 * queue or a raised stop flag it returns at once. */
static void test_wait_written(void **state)
{
    (void)state;
    struct jobq q;
    jobq_init(&q);
    unsigned n = 1 + (unsigned)(tu_rand64() % 8);
    for (unsigned i = 0; i < n; i++) jobq_push(&q, make_list(i, 1, 1));
    job_free_list(jobq_take(&q, 0));
    struct writer w = {&q, n};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, write_later, &w), 0);
    jobq_wait_written(&q, jobq_pushed(&q), NULL);
    assert_int_equal(jobq_unwritten(&q), 0);
    pthread_join(t, NULL);

    jobq_push(&q, make_list(0, 1, 1));
    atomic_int stop = 1;
    jobq_wait_written(&q, jobq_pushed(&q), &stop); /* returns: stopped */
    assert_int_equal(jobq_unwritten(&q), 1);
    jobq_close(&q);
    jobq_wait_written(&q, jobq_pushed(&q), NULL); /* returns: closed */
    jobq_fini(&q);
}

struct producer {
    struct jobq *q;
    int id;
    size_t lists;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (size_t i = 0; i < p->lists; i++) {
        struct job *l = make_list((int64_t)i * 3, 3, 1);
        for (struct job *j = l; j; j = j->next) j->partition = p->id;
        jobq_push(p->q, l);
    }
    return NULL;
}

/* Four producers, one consumer: every job arrives exactly once, each
 * producer's in its own order. */
static void test_threads(void **state)
{
    (void)state;
    struct jobq q;
    jobq_init(&q);
    enum { P = 4 };
    struct producer ps[P];
    pthread_t t[P];
    size_t lists = 200 + tu_rand64() % 200;
    for (int i = 0; i < P; i++) {
        ps[i] = (struct producer){&q, i, lists};
        assert_int_equal(pthread_create(&t[i], NULL, produce, &ps[i]), 0);
    }
    int64_t next[P] = {0};
    size_t got = 0;
    while (got < P * lists * 3) {
        struct job *l = jobq_take(&q, 50);
        for (struct job *j = l; j; j = j->next) {
            assert_int_equal(j->offset, next[j->partition]++);
            got++;
        }
        job_free_list(l);
    }
    for (int i = 0; i < P; i++) pthread_join(t[i], NULL);
    assert_null(jobq_take(&q, 0));
    assert_int_equal(jobq_pushed(&q), P * lists);
    jobq_fini(&q);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_counts),
        cmocka_unit_test(test_wait_written),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

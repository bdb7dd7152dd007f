/* test_batcher.c - batching/batcher.c: jobs come out in batches that follow
 * the rules of batcher.h, each job exactly once, in arrival order.
 *
 * Proves: a batch closes when its rows (not its jobs) reach max_batch_rows
 * and never exceeds it, except a single larger job that runs alone (table of
 * row sequences); a batch closes when its oldest job has waited max_wait_ms,
 * counted from that job's arrival, and not before (timeout 0 sees nothing,
 * a longer timeout wakes on the deadline, also for a waiter that was
 * already asleep when the job came); models never mix and keep their order;
 * among ready queues the oldest head goes first (table); batcher_close
 * drains everything without waiting; batcher_stop makes next return NULL
 * and wakes waiters; purge takes exactly one topic/partition and leaves the
 * rest in order with a usable tail (table of layouts); the counters follow
 * push/next/purge; and two executor threads taking batches while the main
 * thread pushes get every job exactly once within the limit, counters ending
 * at 0.
 *
 * Time: size-rule cases use max_wait_ms = 60000 so time never closes a
 * batch; wait-rule cases use 20-50 ms and backdate arrived_us, with only
 * generous upper bounds on elapsed time. Every job taken is freed; jobs left
 * queued are freed by batcher_destroy (checked under ASan). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../batching/batcher.h"
#include "../base/clock.h"
#include "../batching/job.h"
#include "testutil.h"

#define LONG_WAIT_MS 60000 /* time never closes a batch in size cases */
#define MAX_LIST 64

/* A job with the fields the batcher reads, plus an id and offset to follow
 * it through. */
static struct job *mkjob(int model, size_t rows, const char *topic, int32_t part,
                         int64_t offset, int64_t arrived_us)
{
    struct job *j = job_new();
    assert_non_null(j);
    j->model_idx = model;
    j->rows = rows;
    snprintf(j->topic, sizeof(j->topic), "%s", topic);
    j->partition = part;
    j->offset = offset;
    j->arrived_us = arrived_us;
    snprintf(j->req.id, sizeof(j->req.id), "%s-%d-%lld", topic, (int)part, (long long)offset);
    return j;
}

static void free_list(struct job *j)
{
    while (j) {
        struct job *next = j->next;
        job_free(j);
        j = next;
    }
}

/* Copies the list into arr (at most cap entries); returns its length and
 * its row total in *rows. */
static size_t list_to_array(struct job *j, struct job **arr, size_t cap, size_t *rows)
{
    size_t n = 0, r = 0;
    for (; j; j = j->next) {
        assert_true(n < cap);
        arr[n++] = j;
        r += j->rows;
    }
    *rows = r;
    return n;
}

/* Checks what every batch must satisfy: non-empty, *rows is its row total,
 * one model, arrival order, and at most max rows unless a single job. */
static void check_batch(struct job *batch, size_t rows, size_t max_rows)
{
    assert_non_null(batch);
    size_t n = 0, sum = 0;
    for (struct job *j = batch; j; j = j->next) {
        assert_int_equal(j->model_idx, batch->model_idx);
        if (j->next) assert_true(j->offset < j->next->offset);
        sum += j->rows;
        n++;
    }
    assert_int_equal(sum, rows);
    if (n > 1) assert_true(rows <= max_rows);
}

static struct batcher *mkbatcher(size_t n_models, size_t max_rows, int max_wait_ms)
{
    struct batcher_conf conf = {.n_models = n_models, .max_batch_rows = max_rows,
                                .max_wait_ms = max_wait_ms};
    struct batcher *b = batcher_new(&conf);
    assert_non_null(b);
    return b;
}

static double ms_since(int64_t t0_us)
{
    return (double)(clock_mono_us() - t0_us) / 1000.0;
}

/* ---- size rule: one table, one cmocka test per row --------------------- */

struct size_case {
    const char *name;
    size_t max_rows;
    size_t rows[16];     /* job rows pushed to model 0, in order; 0 ends */
    size_t ready[8][10]; /* batches next(b, 0) must return before close, as
                          * row lists (0 ends a batch; an empty one ends) */
    size_t rest[8][10];  /* batches the drain returns after batcher_close */
};

static const struct size_case size_cases[] = {
    {"eight_single_rows_fill", 8, {1, 1, 1, 1, 1, 1, 1, 1},
     {{1, 1, 1, 1, 1, 1, 1, 1}}, {{0}}},
    {"rows_not_jobs_3x3", 9, {3, 3, 3}, {{3, 3, 3}}, {{0}}},
    {"below_max_stays", 10, {3, 3, 3}, {{0}}, {{3, 3, 3}}},
    {"overflow_cut_before", 8, {3, 3, 3}, {{3, 3}}, {{3}}},
    {"exact_two_batches", 4, {2, 2, 2, 2, 1}, {{2, 2}, {2, 2}}, {{1}}},
    {"max_one", 1, {1, 1, 1}, {{1}, {1}, {1}}, {{0}}},
    {"oversize_alone", 4, {10}, {{10}}, {{0}}},
    {"oversize_between", 4, {1, 10, 1}, {{1}, {10}}, {{1}}},
    {"oversize_after_full", 4, {2, 2, 9, 3}, {{2, 2}, {9}}, {{3}}},
    {"next_does_not_fit", 5, {4, 2}, {{4}}, {{2}}},
    {"mixed_sizes", 6, {5, 1, 7, 6, 2}, {{5, 1}, {7}, {6}}, {{2}}},
    {"big_rows_pairs", 100, {60, 40, 50, 50, 99}, {{60, 40}, {50, 50}}, {{99}}},
};

#define N_SIZE_CASES (sizeof(size_cases) / sizeof(size_cases[0]))

/* Takes the next batch with timeout 0 and checks it has exactly the row
 * list want (want[0] == 0: expects NULL). Returns the queued job/row counts
 * it removed through *jobs and *rows. */
static void expect_batch(struct batcher *b, const size_t *want, size_t max_rows,
                         int64_t *next_offset, size_t *jobs_out, size_t *rows_out)
{
    size_t rows = 999;
    struct job *batch = batcher_next(b, 0, &rows, NULL);
    if (want[0] == 0) {
        if (batch) fail_msg("unexpected batch of %zu rows", rows);
        assert_int_equal(rows, 0);
        return;
    }
    if (!batch) fail_msg("no batch, want one starting with %zu rows", want[0]);
    check_batch(batch, rows, max_rows);
    size_t i = 0;
    for (struct job *j = batch; j; j = j->next, i++) {
        if (want[i] == 0) fail_msg("batch longer than expected (%zu jobs+)", i + 1);
        assert_int_equal(j->rows, want[i]);
        assert_int_equal(j->offset, *next_offset); /* arrival order, no gaps */
        (*next_offset)++;
    }
    if (want[i] != 0) fail_msg("batch has %zu jobs, want more", i);
    *jobs_out = i;
    *rows_out = rows;
    free_list(batch);
}

static void test_size_case(void **state)
{
    const struct size_case *c = *state;
    struct batcher *b = mkbatcher(1, c->max_rows, LONG_WAIT_MS);
    size_t jobs = 0, rows = 0;
    for (size_t i = 0; c->rows[i]; i++) {
        batcher_push(b, mkjob(0, c->rows[i], "t", 0, (int64_t)i, clock_mono_us()));
        jobs++;
        rows += c->rows[i];
        assert_int_equal(batcher_queued_jobs(b), jobs);
        assert_int_equal(batcher_queued_rows(b), rows);
    }
    int64_t next_offset = 0;
    for (int phase = 0; phase < 2; phase++) {
        const size_t(*list)[10] = phase == 0 ? c->ready : c->rest;
        if (phase == 1) batcher_close(b);
        for (size_t k = 0;; k++) {
            size_t nj = 0, nr = 0;
            expect_batch(b, list[k], c->max_rows, &next_offset, &nj, &nr);
            if (list[k][0] == 0) break;
            jobs -= nj;
            rows -= nr;
            assert_int_equal(batcher_queued_jobs(b), jobs);
            assert_int_equal(batcher_queued_rows(b), rows);
        }
    }
    assert_int_equal(jobs, 0);
    assert_int_equal(batcher_queued_jobs(b), 0);
    assert_int_equal(batcher_queued_rows(b), 0);
    batcher_destroy(b);
}

/* ---- wait rule ---------------------------------------------------------- */

/* A lone job that arrived max_wait ago is due now: timeout 0 returns it. */
static void test_wait_aged_job_at_once(void **state)
{
    (void)state;
    const int wait_ms = 50;
    struct batcher *b = mkbatcher(2, 64, wait_ms);
    batcher_push(b, mkjob(1, 1, "t", 0, 7, clock_mono_us() - wait_ms * 1000));
    size_t rows = 0;
    struct job *j = batcher_next(b, 0, &rows, NULL);
    assert_non_null(j);
    assert_int_equal(j->offset, 7);
    assert_int_equal(rows, 1);
    assert_null(j->next);
    job_free(j);
    assert_int_equal(batcher_queued_jobs(b), 0);
    batcher_destroy(b);
}

/* A fresh job is not returned with timeout 0, stays queued, and is returned
 * by a timeout well above max_wait once it has waited max_wait (measured on
 * the batcher's own clock), well before the timeout. */
static void test_wait_fresh_job(void **state)
{
    (void)state;
    const int wait_ms = 30;
    struct batcher *b = mkbatcher(1, 64, wait_ms);
    int64_t arrived = clock_mono_us();
    batcher_push(b, mkjob(0, 2, "t", 0, 1, arrived));
    size_t rows = 99;
    assert_null(batcher_next(b, 0, &rows, NULL));
    assert_int_equal(rows, 0);
    assert_int_equal(batcher_queued_jobs(b), 1);
    assert_int_equal(batcher_queued_rows(b), 2);

    struct job *j = batcher_next(b, 5000, &rows, NULL);
    int64_t got = clock_mono_us();
    assert_non_null(j);
    assert_int_equal(rows, 2);
    /* Not before its deadline... */
    assert_true(got - arrived >= (int64_t)wait_ms * 1000);
    /* ...and woken by it, not by the 5 s timeout (generous bound). */
    assert_true(got - arrived < 4000 * 1000);
    job_free(j);
    batcher_destroy(b);
}

/* The timer runs from the oldest job's arrival: once the head has waited
 * max_wait the whole queue closes, even though a fresh job joined it (a
 * timer taken from the newest job would return nothing here). */
static void test_wait_counts_from_oldest(void **state)
{
    (void)state;
    const int wait_ms = 50;
    struct batcher *b = mkbatcher(1, 64, wait_ms);
    int64_t now = clock_mono_us();
    batcher_push(b, mkjob(0, 1, "t", 0, 1, now - wait_ms * 1000));
    batcher_push(b, mkjob(0, 2, "t", 0, 2, clock_mono_us()));
    size_t rows = 0;
    struct job *batch = batcher_next(b, 0, &rows, NULL);
    assert_non_null(batch);
    check_batch(batch, rows, 64);
    assert_int_equal(rows, 3); /* the whole queue closes together */
    assert_int_equal(batch->offset, 1);
    free_list(batch);
    assert_int_equal(batcher_queued_jobs(b), 0);
    batcher_destroy(b);
}

/* The same with time passing inside batcher_next: a head most of its wait
 * old closes when that wait ends (not max_wait after the newer job), and
 * not before. */
static void test_wait_deadline_of_oldest_in_next(void **state)
{
    (void)state;
    const int wait_ms = 50;
    struct batcher *b = mkbatcher(1, 64, wait_ms);
    int64_t old = clock_mono_us() - (wait_ms - 10) * 1000;
    batcher_push(b, mkjob(0, 1, "t", 0, 1, old));
    batcher_push(b, mkjob(0, 1, "t", 0, 2, clock_mono_us()));
    size_t rows = 0;
    struct job *batch = batcher_next(b, 5000, &rows, NULL);
    int64_t got = clock_mono_us();
    assert_non_null(batch);
    check_batch(batch, rows, 64);
    assert_int_equal(rows, 2);
    assert_true(got - old >= (int64_t)wait_ms * 1000);
    assert_true(got - old < 4000 * 1000);
    free_list(batch);
    batcher_destroy(b);
}

struct waiter {
    struct batcher *b;
    int timeout_ms;
    struct job *got;
    size_t rows;
    int64_t returned_us;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->got = batcher_next(w->b, w->timeout_ms, &w->rows, NULL);
    w->returned_us = clock_mono_us();
    return NULL;
}

/* An executor already asleep on an empty batcher (its deadline: its own
 * timeout) must pick up the deadline of a job pushed after it slept. */
static void test_wait_sleeping_waiter_takes_new_deadline(void **state)
{
    (void)state;
    const int wait_ms = 20;
    struct batcher *b = mkbatcher(1, 64, wait_ms);
    struct waiter w = {b, 8000, NULL, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    /* Let it reach the wait (if it has not, it simply sees the job). */
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int64_t arrived = clock_mono_us();
    batcher_push(b, mkjob(0, 1, "t", 0, 3, arrived));
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_non_null(w.got);
    assert_int_equal(w.got->offset, 3);
    assert_true(w.returned_us - arrived >= (int64_t)wait_ms * 1000);
    assert_true(w.returned_us - arrived < 6000 * 1000); /* not its 8 s timeout */
    job_free(w.got);
    batcher_destroy(b);
}

/* With one model due and another fresh, timeout 0 returns only the due one. */
static void test_wait_only_due_model(void **state)
{
    (void)state;
    const int wait_ms = 40;
    struct batcher *b = mkbatcher(2, 64, wait_ms);
    int64_t now = clock_mono_us();
    batcher_push(b, mkjob(0, 1, "t", 0, 1, now));
    batcher_push(b, mkjob(1, 1, "t", 0, 2, now - 2 * wait_ms * 1000));
    size_t rows = 0;
    struct job *j = batcher_next(b, 0, &rows, NULL);
    assert_non_null(j);
    assert_int_equal(j->model_idx, 1);
    job_free(j);
    assert_null(batcher_next(b, 0, &rows, NULL));
    assert_int_equal(batcher_queued_jobs(b), 1);
    batcher_destroy(b); /* frees the one still queued */
}

/* ---- models ------------------------------------------------------------- */

/* Random jobs across three models: each batch is one model, and each
 * model's jobs come out in push order, every job once. */
static void test_models_never_mix(void **state)
{
    (void)state;
    enum { N = 600, NM = 3 };
    const size_t max_rows = 8;
    struct batcher *b = mkbatcher(NM, max_rows, LONG_WAIT_MS);
    unsigned char seen[N] = {0};
    int model_of[N];
    for (int i = 0; i < N; i++) {
        model_of[i] = (int)(tu_rand64() % NM);
        size_t rows = 1 + (size_t)(tu_rand64() % 4);
        if (tu_rand64() % 40 == 0) rows = max_rows + 3; /* runs alone */
        batcher_push(b, mkjob(model_of[i], rows, "t", 0, i, clock_mono_us()));
    }
    int64_t last[NM] = {-1, -1, -1};
    size_t taken = 0;
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) batcher_close(b);
        size_t rows;
        struct job *batch;
        while ((batch = batcher_next(b, 0, &rows, NULL))) {
            check_batch(batch, rows, max_rows);
            for (struct job *j = batch; j; j = j->next) {
                int64_t o = j->offset;
                assert_true(o >= 0 && o < N);
                assert_int_equal(seen[o], 0);
                seen[o] = 1;
                assert_int_equal(model_of[o], j->model_idx);
                assert_true(o > last[j->model_idx]);
                last[j->model_idx] = o;
                taken++;
            }
            free_list(batch);
        }
    }
    assert_int_equal(taken, N);
    assert_int_equal(batcher_queued_jobs(b), 0);
    assert_int_equal(batcher_queued_rows(b), 0);
    batcher_destroy(b);
}

struct age_case {
    const char *name;
    int by_wait;          /* 1: ready by age (short max_wait), 0: by size */
    int64_t age_us[4];    /* age of each model's head; 0 = empty queue */
    int order[4];         /* expected model order of the batches; -1 ends */
};

static const struct age_case age_cases[] = {
    {"size_older_model0", 0, {5000, 1000}, {0, 1, -1}},
    {"size_older_model1", 0, {1000, 5000}, {1, 0, -1}},
    {"size_three", 0, {3000, 9000, 6000}, {1, 2, 0, -1}},
    {"size_gap_queue", 0, {2000, 0, 0, 7000}, {3, 0, -1}},
    {"wait_older_model1", 1, {100000, 300000}, {1, 0, -1}},
    {"wait_three", 1, {200000, 100000, 400000}, {2, 0, 1, -1}},
};

#define N_AGE_CASES (sizeof(age_cases) / sizeof(age_cases[0]))

/* Every listed queue is ready (2 rows at max 2, or older than max_wait);
 * batches must come out oldest head first. */
static void test_age_case(void **state)
{
    const struct age_case *c = *state;
    struct batcher *b = mkbatcher(4, 2, c->by_wait ? 50 : LONG_WAIT_MS);
    int64_t now = clock_mono_us();
    size_t pushed = 0;
    for (int m = 0; m < 4; m++) {
        if (!c->age_us[m]) continue;
        size_t rows = c->by_wait ? 1 : 2;
        batcher_push(b, mkjob(m, rows, "t", m, 1, now - c->age_us[m]));
        pushed++;
    }
    for (int k = 0; c->order[k] >= 0; k++) {
        size_t rows = 0;
        struct job *j = batcher_next(b, 0, &rows, NULL);
        if (!j) fail_msg("batch %d: none, want model %d", k, c->order[k]);
        if (j->model_idx != c->order[k])
            fail_msg("batch %d: model %d, want %d", k, j->model_idx, c->order[k]);
        job_free(j);
        pushed--;
    }
    assert_int_equal(pushed, 0);
    assert_int_equal(batcher_queued_jobs(b), 0);
    batcher_destroy(b);
}

/* ---- close and stop ----------------------------------------------------- */

/* After close, queued jobs that no rule would close come out at once
 * (bounded by max rows still), older head first; then NULL. */
static void test_close_drains(void **state)
{
    (void)state;
    struct batcher *b = mkbatcher(2, 4, LONG_WAIT_MS);
    int64_t t0 = clock_mono_us();
    for (int i = 0; i < 10; i++) batcher_push(b, mkjob(0, 1, "t", 0, i, t0));
    for (int i = 0; i < 3; i++) batcher_push(b, mkjob(1, 1, "t", 1, i, t0 - 1000));
    size_t rows;
    struct job *batch;
    /* Model 0 has two full batches; the rest waits for 60 s. */
    for (int k = 0; k < 2; k++) {
        batch = batcher_next(b, 0, &rows, NULL);
        assert_non_null(batch);
        assert_int_equal(batch->model_idx, 0);
        assert_int_equal(rows, 4);
        free_list(batch);
    }
    assert_null(batcher_next(b, 0, &rows, NULL));
    assert_int_equal(batcher_queued_jobs(b), 5);

    batcher_close(b);
    int64_t start = clock_mono_us();
    batch = batcher_next(b, LONG_WAIT_MS, &rows, NULL); /* must not wait */
    assert_non_null(batch);
    assert_int_equal(batch->model_idx, 1); /* older head */
    assert_int_equal(rows, 3);
    check_batch(batch, rows, 4);
    free_list(batch);
    batch = batcher_next(b, LONG_WAIT_MS, &rows, NULL);
    assert_non_null(batch);
    assert_int_equal(batch->model_idx, 0);
    assert_int_equal(rows, 2);
    assert_int_equal(batch->offset, 8);
    free_list(batch);
    assert_true(ms_since(start) < 10000); /* far below max_wait */
    assert_null(batcher_next(b, 0, &rows, NULL));
    assert_int_equal(batcher_queued_jobs(b), 0);
    assert_int_equal(batcher_queued_rows(b), 0);

    /* Still closing: a job pushed now comes out at once too. */
    batcher_push(b, mkjob(0, 1, "t", 0, 100, clock_mono_us()));
    batch = batcher_next(b, 0, &rows, NULL);
    assert_non_null(batch);
    assert_int_equal(batch->offset, 100);
    free_list(batch);
    batcher_destroy(b);
}

/* batcher_close wakes an executor waiting on a job that is not due. */
static void test_close_wakes_waiter(void **state)
{
    (void)state;
    struct batcher *b = mkbatcher(1, 64, LONG_WAIT_MS);
    batcher_push(b, mkjob(0, 1, "t", 0, 1, clock_mono_us()));
    struct waiter w = {b, 30000, NULL, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int64_t closed = clock_mono_us();
    batcher_close(b);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_non_null(w.got);
    assert_int_equal(w.rows, 1);
    assert_true(w.returned_us - closed < 10000 * 1000);
    job_free(w.got);
    batcher_destroy(b);
}

/* After stop, next returns NULL at once even with ready jobs queued; they
 * stay counted and batcher_destroy frees them. */
static void test_stop(void **state)
{
    (void)state;
    struct batcher *b = mkbatcher(2, 2, LONG_WAIT_MS);
    int64_t now = clock_mono_us();
    batcher_push(b, mkjob(0, 2, "t", 0, 1, now));             /* ready by size */
    batcher_push(b, mkjob(1, 1, "t", 0, 2, now - 100000000)); /* long due */
    batcher_stop(b);
    size_t rows = 5;
    assert_null(batcher_next(b, 0, &rows, NULL));
    assert_int_equal(rows, 0);
    int64_t start = clock_mono_us();
    assert_null(batcher_next(b, 30000, &rows, NULL));
    assert_true(ms_since(start) < 10000);
    batcher_close(b); /* close after stop: still stopped */
    assert_null(batcher_next(b, 0, &rows, NULL));
    assert_int_equal(batcher_queued_jobs(b), 2);
    assert_int_equal(batcher_queued_rows(b), 3);
    batcher_destroy(b);
}

/* batcher_stop wakes an executor blocked on an empty batcher. */
static void test_stop_wakes_waiter(void **state)
{
    (void)state;
    struct batcher *b = mkbatcher(1, 64, LONG_WAIT_MS);
    struct waiter w = {b, 30000, NULL, 7, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int64_t stopped = clock_mono_us();
    batcher_stop(b);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_null(w.got);
    assert_int_equal(w.rows, 0);
    assert_true(w.returned_us - stopped < 10000 * 1000);
    batcher_destroy(b);
}

/* One push can make two batches ready ([1,1,1] + 10 at max 4: the three
 * small jobs, then the big one alone). Two executors asleep with long
 * timeouts must both wake: the push wakes one, and the one that takes a
 * batch must pass the wakeup on while jobs remain. */
static void test_one_push_two_batches_wakes_both(void **state)
{
    (void)state;
    struct batcher *b = mkbatcher(1, 4, LONG_WAIT_MS);
    int64_t now = clock_mono_us();
    for (int i = 0; i < 3; i++) batcher_push(b, mkjob(0, 1, "t", 0, i, now));
    struct waiter w[2] = {{b, 8000, NULL, 0, 0}, {b, 8000, NULL, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, waiter_main, &w[i]), 0);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int64_t pushed = clock_mono_us();
    batcher_push(b, mkjob(0, 10, "t", 0, 3, pushed));
    size_t rows = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_non_null(w[i].got);
        check_batch(w[i].got, w[i].rows, 4);
        rows += w[i].rows;
        /* Woken by the push chain, not by the 8 s timeout. */
        assert_true(w[i].returned_us - pushed < 4000 * 1000);
        free_list(w[i].got);
    }
    assert_int_equal(rows, 13);
    assert_int_equal(batcher_queued_jobs(b), 0);
    batcher_destroy(b);
}

static void test_destroy_null_and_full(void **state)
{
    (void)state;
    batcher_destroy(NULL);
    struct batcher *b = mkbatcher(3, 4, LONG_WAIT_MS);
    for (int i = 0; i < 30; i++)
        batcher_push(b, mkjob(i % 3, 1 + (size_t)(i % 5), "t", 0, i, clock_mono_us()));
    assert_int_equal(batcher_queued_jobs(b), 30);
    batcher_destroy(b); /* LeakSanitizer proves these are freed */
}

/* ---- purge: one table of queue layouts --------------------------------- */

/* Layout letters: 'x' = the purged partition (topic "t", partition 1);
 * 'a' = same topic, partition 2; 'b' = topic "u", partition 1 (same number,
 * other topic); 'c' = topic "t1", partition 1 (topic sharing a prefix). */
struct purge_case {
    const char *name;
    const char *queue[2]; /* model 0 and model 1 layouts */
};

static const struct purge_case purge_cases[] = {
    {"none_match", {"aab", "bc"}},
    {"empty_queues", {"", ""}},
    {"head", {"xaa", "xb"}},
    {"tail", {"aax", "bcx"}},
    {"middle", {"axa", "bxxc"}},
    {"all", {"xxx", "x"}},
    {"all_one_model", {"xxxx", "abc"}},
    {"alternating", {"xaxbxcx", "axaxa"}},
    {"single_kept", {"x", "a"}},
    {"runs", {"xxaaxxbbxx", "ccxxcc"}},
};

#define N_PURGE_CASES (sizeof(purge_cases) / sizeof(purge_cases[0]))

static void letter_source(char c, const char **topic, int32_t *part)
{
    switch (c) {
    case 'x': *topic = "t"; *part = 1; return;
    case 'a': *topic = "t"; *part = 2; return;
    case 'b': *topic = "u"; *part = 1; return;
    default: *topic = "t1"; *part = 1; return;
    }
}

static void test_purge_case(void **state)
{
    const struct purge_case *c = *state;
    struct batcher *b = mkbatcher(2, 1000, LONG_WAIT_MS);
    int64_t offset = 0;
    size_t kept_jobs = 0, kept_rows = 0, gone_jobs = 0, gone_rows = 0;
    int64_t kept[2][MAX_LIST], gone[MAX_LIST];
    size_t n_kept[2] = {0, 0}, n_gone = 0;
    for (int m = 0; m < 2; m++) {
        for (const char *p = c->queue[m]; *p; p++) {
            const char *topic;
            int32_t part;
            letter_source(*p, &topic, &part);
            size_t rows = 1 + (size_t)(tu_rand64() % 3);
            batcher_push(b, mkjob(m, rows, topic, part, offset, clock_mono_us()));
            if (*p == 'x') {
                gone[n_gone++] = offset;
                gone_jobs++;
                gone_rows += rows;
            } else {
                kept[m][n_kept[m]++] = offset;
                kept_jobs++;
                kept_rows += rows;
            }
            offset++;
        }
    }
    assert_int_equal(batcher_queued_jobs(b), kept_jobs + gone_jobs);
    assert_int_equal(batcher_queued_rows(b), kept_rows + gone_rows);

    struct job *arr[MAX_LIST];
    size_t rows;
    size_t n = list_to_array(batcher_purge(b, "t", 1), arr, MAX_LIST, &rows);
    assert_int_equal(n, n_gone);
    assert_int_equal(rows, gone_rows);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(arr[i]->offset, gone[i]); /* model order, then arrival */
        assert_string_equal(arr[i]->topic, "t");
        assert_int_equal(arr[i]->partition, 1);
    }
    if (n) free_list(arr[0]);
    assert_int_equal(batcher_queued_jobs(b), kept_jobs);
    assert_int_equal(batcher_queued_rows(b), kept_rows);

    /* Purging again finds nothing. */
    assert_null(batcher_purge(b, "t", 1));

    /* The tails still work: a push after the purge lands at the end. */
    for (int m = 0; m < 2; m++) {
        batcher_push(b, mkjob(m, 1, "t", 2, offset, clock_mono_us()));
        kept[m][n_kept[m]++] = offset++;
    }
    assert_int_equal(batcher_queued_jobs(b), kept_jobs + 2);

    batcher_close(b);
    size_t got[2] = {0, 0};
    struct job *batch;
    while ((batch = batcher_next(b, 0, &rows, NULL))) {
        check_batch(batch, rows, 1000);
        int m = batch->model_idx;
        for (struct job *j = batch; j; j = j->next) {
            assert_true(got[m] < n_kept[m]);
            assert_int_equal(j->offset, kept[m][got[m]]);
            assert_false(j->partition == 1 && strcmp(j->topic, "t") == 0);
            got[m]++;
        }
        free_list(batch);
    }
    assert_int_equal(got[0], n_kept[0]);
    assert_int_equal(got[1], n_kept[1]);
    assert_int_equal(batcher_queued_jobs(b), 0);
    assert_int_equal(batcher_queued_rows(b), 0);
    batcher_destroy(b);
}

/* ---- threads ------------------------------------------------------------ */

enum { MT_JOBS = 20000, MT_MODELS = 3, MT_EXECUTORS = 2 };
#define MT_MAX_ROWS 16

struct executor {
    pthread_t th;
    struct batcher *b;
    atomic_int *finish;
    unsigned *seen;      /* per offset: times this executor got it */
    size_t jobs, rows, batches;
    size_t bad_rows;     /* batches over the limit with more than one job */
    size_t bad_sum;      /* *rows disagreeing with the jobs */
    size_t bad_mixed;    /* more than one model in a batch */
    size_t bad_order;    /* offsets not increasing inside a batch */
    size_t bad_offset;   /* offset out of range */
};

/* Cmocka asserts must stay on the main thread: executors count violations
 * and the main thread checks the counts after joining. */
static void *executor_main(void *arg)
{
    struct executor *e = arg;
    for (;;) {
        size_t rows = 0;
        struct job *batch = batcher_next(e->b, 20, &rows, NULL);
        if (!batch) {
            if (atomic_load(e->finish)) break;
            continue;
        }
        size_t n = 0, sum = 0;
        for (struct job *j = batch; j; j = j->next) {
            if (j->model_idx != batch->model_idx) e->bad_mixed++;
            if (j->next && j->next->offset <= j->offset) e->bad_order++;
            if (j->offset < 0 || j->offset >= MT_JOBS) e->bad_offset++;
            else e->seen[j->offset]++;
            sum += j->rows;
            n++;
        }
        if (sum != rows) e->bad_sum++;
        if (n > 1 && rows > MT_MAX_ROWS) e->bad_rows++;
        e->jobs += n;
        e->rows += sum;
        e->batches++;
        free_list(batch);
    }
    return NULL;
}

static void test_threads_every_job_once(void **state)
{
    (void)state;
    struct batcher *b = mkbatcher(MT_MODELS, MT_MAX_ROWS, 2);
    atomic_int finish = 0;
    struct executor ex[MT_EXECUTORS];
    memset(ex, 0, sizeof(ex));
    for (int i = 0; i < MT_EXECUTORS; i++) {
        ex[i].b = b;
        ex[i].finish = &finish;
        ex[i].seen = calloc(MT_JOBS, sizeof(unsigned));
        assert_non_null(ex[i].seen);
        assert_int_equal(pthread_create(&ex[i].th, NULL, executor_main, &ex[i]), 0);
    }
    size_t pushed_rows = 0;
    for (int i = 0; i < MT_JOBS; i++) {
        size_t rows = 1 + (size_t)(tu_rand64() % 6);
        if (tu_rand64() % 100 == 0) rows = MT_MAX_ROWS + 1 + (size_t)(tu_rand64() % 8);
        pushed_rows += rows;
        batcher_push(b, mkjob((int)(tu_rand64() % MT_MODELS), rows, "t",
                              (int32_t)(i % 4), i, clock_mono_us()));
        if (i % 512 == 0) {
            /* Let executors sometimes catch up and wait on an empty
             * batcher, so the wait path runs too. */
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    /* Jobs left below a full batch close by max_wait (2 ms); wait for the
     * executors to take everything, with a generous bound. */
    int64_t start = clock_mono_us();
    while (batcher_queued_jobs(b) > 0 && ms_since(start) < 60000) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(batcher_queued_jobs(b), 0);
    atomic_store(&finish, 1);
    batcher_stop(b);
    size_t jobs = 0, rows = 0, batches = 0;
    for (int i = 0; i < MT_EXECUTORS; i++) {
        assert_int_equal(pthread_join(ex[i].th, NULL), 0);
        assert_int_equal(ex[i].bad_rows, 0);
        assert_int_equal(ex[i].bad_sum, 0);
        assert_int_equal(ex[i].bad_mixed, 0);
        assert_int_equal(ex[i].bad_order, 0);
        assert_int_equal(ex[i].bad_offset, 0);
        jobs += ex[i].jobs;
        rows += ex[i].rows;
        batches += ex[i].batches;
    }
    for (int o = 0; o < MT_JOBS; o++) {
        unsigned n = 0;
        for (int i = 0; i < MT_EXECUTORS; i++) n += ex[i].seen[o];
        if (n != 1) fail_msg("offset %d came out %u times", o, n);
    }
    assert_int_equal(jobs, MT_JOBS);
    assert_int_equal(rows, pushed_rows);
    assert_true(batches > 0 && batches <= MT_JOBS);
    assert_int_equal(batcher_queued_jobs(b), 0);
    assert_int_equal(batcher_queued_rows(b), 0);
    for (int i = 0; i < MT_EXECUTORS; i++) free(ex[i].seen);
    batcher_destroy(b);
}

/* Table tests get their row through the state pointer, like test_config. */
static struct CMUnitTest table_test(const char *name, CMUnitTestFunction fn,
                                    const void *row)
{
    struct CMUnitTest t = {name, fn, NULL, NULL, (void *)row};
    return t;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    static struct CMUnitTest size[N_SIZE_CASES], age[N_AGE_CASES], purge[N_PURGE_CASES];
    for (size_t i = 0; i < N_SIZE_CASES; i++)
        size[i] = table_test(size_cases[i].name, test_size_case, &size_cases[i]);
    for (size_t i = 0; i < N_AGE_CASES; i++)
        age[i] = table_test(age_cases[i].name, test_age_case, &age_cases[i]);
    for (size_t i = 0; i < N_PURGE_CASES; i++)
        purge[i] = table_test(purge_cases[i].name, test_purge_case, &purge_cases[i]);
    const struct CMUnitTest other[] = {
        cmocka_unit_test(test_wait_aged_job_at_once),
        cmocka_unit_test(test_wait_fresh_job),
        cmocka_unit_test(test_wait_counts_from_oldest),
        cmocka_unit_test(test_wait_deadline_of_oldest_in_next),
        cmocka_unit_test(test_wait_sleeping_waiter_takes_new_deadline),
        cmocka_unit_test(test_wait_only_due_model),
        cmocka_unit_test(test_models_never_mix),
        cmocka_unit_test(test_close_drains),
        cmocka_unit_test(test_close_wakes_waiter),
        cmocka_unit_test(test_stop),
        cmocka_unit_test(test_stop_wakes_waiter),
        cmocka_unit_test(test_one_push_two_batches_wakes_both),
        cmocka_unit_test(test_destroy_null_and_full),
        cmocka_unit_test(test_threads_every_job_once),
    };
    int failed = _cmocka_run_group_tests("batcher_size_rule", size, N_SIZE_CASES, NULL, NULL);
    failed += _cmocka_run_group_tests("batcher_oldest_first", age, N_AGE_CASES, NULL, NULL);
    failed += _cmocka_run_group_tests("batcher_purge", purge, N_PURGE_CASES, NULL, NULL);
    failed += cmocka_run_group_tests_name("batcher_rules", other, NULL, NULL);
    return failed ? 1 : 0;
}

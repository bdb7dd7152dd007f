/* test_batch_policy.c - the batching policy, driven by an injected clock so
 * no test sleeps or depends on timing: each close rule (size, wait from the
 * oldest job, estimated deadline, drain), expiry of queued jobs while no
 * executor takes anything, priority order and aging, per-model separation,
 * preferred-size cuts that keep the rest queued with its arrival time, the
 * per-size time estimate, the stats snapshot, and the backpressure marks. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "../batching/batcher.h"
#include "../batching/flow.h"
#include "testutil.h"

#define MS 1000 /* microseconds */

static int64_t fake_now;
static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static struct batcher *mk(size_t models, size_t max_rows, int max_wait_ms, int aging_ms,
                          const size_t *pref, size_t n_pref)
{
    struct batcher_conf c = {.n_models = models, .max_batch_rows = max_rows,
                             .max_wait_ms = max_wait_ms, .aging_ms = aging_ms,
                             .n_preferred = n_pref, .clock = fake_clock};
    for (size_t i = 0; i < n_pref; i++) c.preferred[i] = pref[i];
    struct batcher *b = batcher_new(&c);
    assert_non_null(b);
    return b;
}

/* Queues a job of rows rows on model at the fake now; its offset is id. */
static struct job *push(struct batcher *b, int model, size_t rows, int prio, int64_t id,
                        int64_t deadline_us)
{
    struct job *j = job_new();
    assert_non_null(j);
    snprintf(j->topic, sizeof(j->topic), "t");
    j->offset = id;
    j->model_idx = model;
    j->rows = rows;
    j->priority = prio;
    j->arrived_us = fake_now;
    j->deadline_us = deadline_us;
    batcher_push(b, j);
    return j;
}

static size_t count(const struct job *j)
{
    size_t n = 0;
    for (; j; j = j->next) n++;
    return n;
}

static void free_all(struct job *j)
{
    while (j) {
        struct job *n = j->next;
        job_free(j);
        j = n;
    }
}

static void test_size_closes_at_max_rows(void **state)
{
    (void)state;
    fake_now = 1000 * MS;
    struct batcher *b = mk(1, 8, 1000, 0, NULL, 0);
    for (int i = 0; i < 3; i++) push(b, 0, 2, 5, i, 0); /* 6 rows: not yet */
    int64_t wake;
    size_t rows;
    enum batcher_reason why;
    assert_null(batcher_take(b, fake_now, &rows, &why, &wake));
    assert_int_equal(wake, fake_now + 1000 * MS);
    push(b, 0, 3, 5, 3, 0); /* 9 rows: closes, cut at 8 keeps the 3-row job out */
    struct job *batch = batcher_take(b, fake_now, &rows, &why, &wake);
    assert_non_null(batch);
    assert_int_equal(why, BATCH_SIZE);
    assert_int_equal(rows, 6);
    assert_int_equal(count(batch), 3);
    assert_int_equal(batcher_queued_rows(b), 3);
    free_all(batch);
    batcher_destroy(b);
}

static void test_wait_counts_from_the_oldest_job(void **state)
{
    (void)state;
    fake_now = 5000 * MS;
    struct batcher *b = mk(1, 32, 5, 0, NULL, 0);
    push(b, 0, 1, 5, 0, 0);
    int64_t t0 = fake_now, wake;
    size_t rows;
    enum batcher_reason why;
    fake_now = t0 + 4 * MS;
    push(b, 0, 1, 5, 1, 0); /* a later arrival does not restart the timer */
    assert_null(batcher_take(b, fake_now, &rows, &why, &wake));
    assert_int_equal(wake, t0 + 5 * MS);
    fake_now = t0 + 5 * MS;
    struct job *batch = batcher_take(b, fake_now, &rows, &why, &wake);
    assert_non_null(batch);
    assert_int_equal(why, BATCH_WAIT);
    assert_int_equal(rows, 2);
    free_all(batch);
    /* After a flush, the next job's own arrival starts its timer. */
    fake_now += 1 * MS;
    push(b, 0, 1, 5, 2, 0);
    assert_null(batcher_take(b, fake_now + 4 * MS, &rows, &why, &wake));
    batch = batcher_take(b, fake_now + 5 * MS, &rows, &why, &wake);
    assert_non_null(batch);
    free_all(batch);
    batcher_destroy(b);
}

static void test_deadline_closes_early_by_the_estimate(void **state)
{
    (void)state;
    fake_now = 100 * MS;
    struct batcher *b = mk(1, 32, 1000, 0, NULL, 0);
    batcher_record(b, 0, 1, 0.010); /* a batch of 1 row takes 10 ms */
    push(b, 0, 1, 5, 0, fake_now + 50 * MS);
    size_t rows;
    enum batcher_reason why;
    int64_t wake;
    /* Close when waiting longer would miss the deadline: 50 - 10 - 1 ms. */
    assert_null(batcher_take(b, fake_now + 38 * MS, &rows, &why, &wake));
    assert_int_equal(wake, fake_now + 39 * MS);
    struct job *batch = batcher_take(b, fake_now + 39 * MS, &rows, &why, &wake);
    assert_non_null(batch);
    assert_int_equal(why, BATCH_DEADLINE);
    free_all(batch);
    /* Without an estimate the lead is only the 1 ms margin. */
    struct batcher *b2 = mk(1, 32, 1000, 0, NULL, 0);
    push(b2, 0, 1, 5, 0, fake_now + 50 * MS);
    assert_null(batcher_take(b2, fake_now + 48 * MS, &rows, &why, &wake));
    batch = batcher_take(b2, fake_now + 49 * MS, &rows, &why, &wake);
    assert_non_null(batch);
    assert_int_equal(why, BATCH_DEADLINE);
    free_all(batch);
    batcher_destroy(b2);
    batcher_destroy(b);
}

static void test_expiry_while_nothing_is_taken(void **state)
{
    (void)state;
    /* Executors all busy: nobody calls take. The timer still answers. */
    fake_now = 0;
    struct batcher *b = mk(2, 32, 60000, 0, NULL, 0);
    push(b, 0, 1, 5, 0, 20 * MS);
    push(b, 1, 1, 5, 1, 30 * MS);
    push(b, 0, 1, 5, 2, 0); /* no deadline: never expires */
    int64_t next;
    assert_null(batcher_expire(b, 19 * MS, &next));
    assert_int_equal(next, 20 * MS);
    struct job *ex = batcher_expire(b, 20 * MS, &next);
    assert_non_null(ex);
    assert_int_equal(count(ex), 1);
    assert_int_equal(ex->offset, 0);
    assert_int_equal(next, 30 * MS);
    free_all(ex);
    ex = batcher_expire(b, 45 * MS, &next);
    assert_int_equal(count(ex), 1);
    assert_int_equal(ex->offset, 1);
    assert_int_equal(next, INT64_MAX);
    free_all(ex);
    assert_int_equal(batcher_queued_jobs(b), 1);
    struct batcher_stats st;
    batcher_get_stats(b, 45 * MS, &st);
    assert_int_equal(st.expired, 2);
    assert_int_equal(st.oldest_age_us, 45 * MS);
    batcher_destroy(b);
}

static void test_priority_order(void **state)
{
    (void)state;
    fake_now = 0;
    struct batcher *b = mk(1, 1, 0, 0, NULL, 0); /* one row per batch: order visible */
    const int prios[] = {1, 9, 5, 9, 0, 5};
    for (int i = 0; i < 6; i++) push(b, 0, 1, prios[i], i, 0);
    const int64_t want[] = {1, 3, 2, 5, 0, 4}; /* higher first, FIFO within a level */
    for (int i = 0; i < 6; i++) {
        size_t rows;
        struct job *j = batcher_take(b, fake_now, &rows, NULL, NULL);
        assert_non_null(j);
        assert_int_equal(j->offset, want[i]);
        free_all(j);
    }
    batcher_destroy(b);
}

static void test_aging_lifts_low_priority(void **state)
{
    (void)state;
    /* aging 100 ms per level: a priority-0 job queued 1 s ago outranks a
     * fresh priority-9 one (0 + 10 > 9), but not one 500 ms younger. */
    fake_now = 0;
    struct batcher *b = mk(1, 1, 0, 100, NULL, 0);
    push(b, 0, 1, 0, 100, 0);
    fake_now = 500 * MS;
    push(b, 0, 1, 9, 200, 0);
    struct job *j = batcher_take(b, fake_now, NULL, NULL, NULL);
    assert_int_equal(j->offset, 200); /* 0 + 5 < 9 */
    free_all(j);
    fake_now = 1000 * MS;
    push(b, 0, 1, 9, 300, 0);
    j = batcher_take(b, fake_now, NULL, NULL, NULL);
    assert_int_equal(j->offset, 100); /* 0 + 10 > 9 */
    free_all(j);
    j = batcher_take(b, fake_now, NULL, NULL, NULL);
    assert_int_equal(j->offset, 300);
    free_all(j);
    /* Without aging, sustained high priority would hold it back forever. */
    struct batcher *b2 = mk(1, 1, 0, 0, NULL, 0);
    fake_now = 0;
    push(b2, 0, 1, 0, 1, 0);
    for (int i = 0; i < 50; i++) {
        fake_now += 1000 * MS;
        push(b2, 0, 1, 9, 1000 + i, 0);
        j = batcher_take(b2, fake_now, NULL, NULL, NULL);
        assert_int_not_equal(j->offset, 1);
        free_all(j);
    }
    free_all(batcher_take(b2, fake_now, NULL, NULL, NULL));
    batcher_destroy(b2);
    batcher_destroy(b);
}

static void test_models_never_mix(void **state)
{
    (void)state;
    fake_now = 0;
    struct batcher *b = mk(3, 4, 5, 0, NULL, 0);
    for (int i = 0; i < 60; i++) push(b, (int)(tu_rand64() % 3), 1, 5, i, 0);
    batcher_close(b);
    size_t seen = 0, rows;
    struct job *batch;
    while ((batch = batcher_take(b, fake_now, &rows, NULL, NULL))) {
        for (const struct job *j = batch; j; j = j->next) {
            assert_int_equal(j->model_idx, batch->model_idx);
            seen++;
        }
        assert_true(rows <= 4);
        free_all(batch);
    }
    assert_int_equal(seen, 60);
    batcher_destroy(b);
}

static void test_preferred_sizes_cut_time_closes(void **state)
{
    (void)state;
    const size_t pref[] = {4, 8};
    fake_now = 0;
    struct batcher *b = mk(1, 16, 5, 0, pref, 2);
    for (int i = 0; i < 13; i++) push(b, 0, 1, 5, i, 0);
    fake_now = 5 * MS;
    size_t rows;
    enum batcher_reason why;
    struct job *batch = batcher_take(b, fake_now, &rows, &why, NULL);
    assert_int_equal(why, BATCH_WAIT);
    assert_int_equal(rows, 8); /* the largest preferred size 13 rows fill */
    free_all(batch);
    /* The rest kept its arrival time, so it is due at once: 5 rows -> 4. */
    batch = batcher_take(b, fake_now, &rows, &why, NULL);
    assert_int_equal(rows, 4);
    assert_int_equal(batch->arrived_us, 0);
    free_all(batch);
    batch = batcher_take(b, fake_now, &rows, &why, NULL);
    assert_int_equal(rows, 1); /* fills no preferred size: goes as it is */
    free_all(batch);
    /* A close by size is not cut. */
    for (int i = 0; i < 16; i++) push(b, 0, 1, 5, 100 + i, 0);
    batch = batcher_take(b, fake_now, &rows, &why, NULL);
    assert_int_equal(why, BATCH_SIZE);
    assert_int_equal(rows, 16);
    free_all(batch);
    batcher_destroy(b);
}

static void test_big_job_runs_alone(void **state)
{
    (void)state;
    fake_now = 0;
    struct batcher *b = mk(1, 8, 5, 0, NULL, 0);
    push(b, 0, 20, 5, 0, 0);
    push(b, 0, 1, 5, 1, 0);
    size_t rows;
    struct job *batch = batcher_take(b, fake_now, &rows, NULL, NULL);
    assert_int_equal(rows, 20);
    assert_int_equal(count(batch), 1);
    free_all(batch);
    free_all(batcher_take(b, 5 * MS, &rows, NULL, NULL));
    batcher_destroy(b);
}

static void test_estimates_by_size_bucket(void **state)
{
    (void)state;
    struct batcher *b = mk(2, 64, 5, 0, NULL, 0);
    assert_true(batcher_estimate(b, 0, 8) == 0);
    batcher_record(b, 0, 32, 0.010);
    assert_true(batcher_estimate(b, 0, 20) == 0.010); /* same bucket (17..32) */
    assert_true(batcher_estimate(b, 0, 3) == 0.010);  /* nearest larger bucket */
    assert_true(batcher_estimate(b, 0, 64) == 0.010); /* else nearest smaller */
    assert_true(batcher_estimate(b, 1, 32) == 0);     /* per model */
    batcher_record(b, 0, 32, 0.020);
    double e = batcher_estimate(b, 0, 32);
    assert_true(e > 0.0119 && e < 0.0121); /* EWMA: 0.8 * 10 + 0.2 * 20 ms */
    batcher_destroy(b);
}

static void test_stats_count_reasons(void **state)
{
    (void)state;
    fake_now = 0;
    struct batcher *b = mk(1, 2, 5, 0, NULL, 0);
    push(b, 0, 2, 5, 0, 0);
    free_all(batcher_take(b, 0, NULL, NULL, NULL)); /* size */
    push(b, 0, 1, 5, 1, 0);
    free_all(batcher_take(b, 5 * MS, NULL, NULL, NULL)); /* wait */
    push(b, 0, 1, 5, 2, 6 * MS);
    free_all(batcher_take(b, 5 * MS, NULL, NULL, NULL)); /* deadline */
    push(b, 0, 1, 5, 3, 0);
    batcher_close(b);
    free_all(batcher_take(b, 0, NULL, NULL, NULL)); /* drain */
    struct batcher_stats st;
    batcher_get_stats(b, 0, &st);
    assert_int_equal(st.closed[BATCH_SIZE], 1);
    assert_int_equal(st.closed[BATCH_WAIT], 1);
    assert_int_equal(st.closed[BATCH_DEADLINE], 1);
    assert_int_equal(st.closed[BATCH_DRAIN], 1);
    assert_int_equal(st.queued_rows, 0);
    assert_string_equal(batcher_reason_name(BATCH_DEADLINE), "deadline");
    batcher_destroy(b);
}

/* Pause at a high mark, stay paused until both counts are at half. */
static void test_flow_marks(void **state)
{
    (void)state;
    const struct flow_marks m = {.queued_high = 100, .taken_high = 228};
    static const struct {
        int paused;
        size_t queued, taken;
        int want;
    } rows[] = {
        {0, 99, 99, 0},   {0, 100, 100, 1}, {0, 10, 228, 1}, {1, 51, 51, 1},
        {1, 50, 115, 1},  {1, 50, 114, 0},  {1, 0, 0, 0},    {0, 60, 200, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (flow_should_pause(&m, rows[i].paused, rows[i].queued, rows[i].taken) != rows[i].want)
            fail_msg("row %zu: paused=%d queued=%zu taken=%zu: want %d", i, rows[i].paused,
                     rows[i].queued, rows[i].taken, rows[i].want);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_closes_at_max_rows),
        cmocka_unit_test(test_wait_counts_from_the_oldest_job),
        cmocka_unit_test(test_deadline_closes_early_by_the_estimate),
        cmocka_unit_test(test_expiry_while_nothing_is_taken),
        cmocka_unit_test(test_priority_order),
        cmocka_unit_test(test_aging_lifts_low_priority),
        cmocka_unit_test(test_models_never_mix),
        cmocka_unit_test(test_preferred_sizes_cut_time_closes),
        cmocka_unit_test(test_big_job_runs_alone),
        cmocka_unit_test(test_estimates_by_size_bucket),
        cmocka_unit_test(test_stats_count_reasons),
        cmocka_unit_test(test_flow_marks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

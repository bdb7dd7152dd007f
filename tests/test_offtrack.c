/* test_offtrack.c - worker/offtrack.c: the offset it hands back to store is
 * always the contiguous low watermark of finished work (docs/reliability.md,
 * rules 1-2), whatever order offsets finish in, so a crash after a store
 * never skips an unfinished job.
 *
 * Proves, as scripted scenarios (one table row each): in-order completion
 * stores last + 1; out-of-order completion holds the watermark below an
 * unfinished offset and jumps when the gap fills; offset gaps (10, 11, 15,
 * 20) store last contiguous done + 1; partitions and topics are independent;
 * unknown partitions/offsets answer -1; duplicate completions change
 * nothing; pending counts per partition and in total; drop forgets one
 * partition; a seek back forgets only offsets at or above the seek point;
 * offtrack_next follows the last offset added. Then the ring: growth past 64 entries while
 * wrapped, and a long sliding window. Last, a randomized property test
 * against a model kept by the test: the stored watermark equals last
 * contiguous done + 1 (last added + 1 when nothing is pending), never passes
 * the smallest unfinished offset, and never decreases.
 *
 * Single-threaded, like the module (poll thread only). Random inputs come
 * from testutil's seeded generator (KINFER_TEST_SEED replays a run). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../worker/offtrack.h"
#include "testutil.h"

/* store_offset is preset to this before each offtrack_done so a call that
 * must not touch it can be checked. */
#define UNTOUCHED INT64_C(-777)

/* ---- scripted scenarios: one table, one cmocka test per row ------------ */

enum op {
    END = 0,
    ADD,   /* offtrack_add(topic, part, off) == 0 */
    DONE,  /* offtrack_done(topic, part, off) == rc; store == want if rc 1 */
    PEND,  /* offtrack_pending(topic, part) == n */
    TOTAL, /* offtrack_pending_total() == n */
    DROP,  /* offtrack_drop(topic, part) */
};

struct step {
    enum op op;
    const char *topic;
    int32_t part;
    int64_t off;
    int rc;       /* DONE: expected return */
    int64_t want; /* DONE with rc 1: expected store offset */
    size_t n;     /* PEND/TOTAL: expected count */
};

#define S_ADD(t, p, o) {ADD, t, p, o, 0, 0, 0}
#define S_DONE(t, p, o, r, w) {DONE, t, p, o, r, w, 0}
#define S_PEND(t, p, c) {PEND, t, p, 0, 0, 0, c}
#define S_TOTAL(c) {TOTAL, NULL, 0, 0, 0, 0, c}
#define S_DROP(t, p) {DROP, t, p, 0, 0, 0, 0}
#define S_END {END, NULL, 0, 0, 0, 0, 0}

struct scenario {
    const char *name;
    struct step steps[40];
};

static const struct scenario scenarios[] = {
    {"in_order_stores_last_plus_one", {
        S_ADD("t", 0, 0), S_ADD("t", 0, 1), S_ADD("t", 0, 2), S_ADD("t", 0, 3),
        S_PEND("t", 0, 4),
        S_DONE("t", 0, 0, 1, 1), S_DONE("t", 0, 1, 1, 2),
        S_DONE("t", 0, 2, 1, 3), S_DONE("t", 0, 3, 1, 4),
        S_PEND("t", 0, 0), S_TOTAL(0),
        /* Consumption goes on after everything finished. */
        S_ADD("t", 0, 4), S_PEND("t", 0, 1), S_DONE("t", 0, 4, 1, 5),
        S_END}},
    {"out_of_order_holds_then_jumps", {
        S_ADD("t", 0, 100), S_ADD("t", 0, 101), S_ADD("t", 0, 102),
        S_ADD("t", 0, 103), S_ADD("t", 0, 104),
        S_DONE("t", 0, 102, 0, 0), S_DONE("t", 0, 104, 0, 0),
        S_DONE("t", 0, 101, 0, 0), S_PEND("t", 0, 2),
        S_DONE("t", 0, 100, 1, 103), /* jumps over 101-102, stops at 103 */
        S_PEND("t", 0, 1),
        S_DONE("t", 0, 103, 1, 105), S_PEND("t", 0, 0),
        S_END}},
    {"last_batch_first_never_skips", {
        /* Two batches: the later one finishes first. */
        S_ADD("t", 3, 7), S_ADD("t", 3, 8), S_ADD("t", 3, 9), S_ADD("t", 3, 10),
        S_DONE("t", 3, 9, 0, 0), S_DONE("t", 3, 10, 0, 0),
        S_DONE("t", 3, 7, 1, 8), S_DONE("t", 3, 8, 1, 11),
        S_END}},
    {"gaps_head_first", {
        S_ADD("t", 0, 10), S_ADD("t", 0, 11), S_ADD("t", 0, 15), S_ADD("t", 0, 20),
        S_DONE("t", 0, 10, 1, 11), S_DONE("t", 0, 11, 1, 12),
        S_DONE("t", 0, 15, 1, 16), S_DONE("t", 0, 20, 1, 21),
        S_END}},
    {"gaps_out_of_order", {
        S_ADD("t", 0, 10), S_ADD("t", 0, 11), S_ADD("t", 0, 15), S_ADD("t", 0, 20),
        S_DONE("t", 0, 15, 0, 0), S_DONE("t", 0, 20, 0, 0),
        S_DONE("t", 0, 11, 0, 0), S_PEND("t", 0, 1),
        S_DONE("t", 0, 10, 1, 21), S_PEND("t", 0, 0),
        S_END}},
    {"gaps_middle_hole", {
        S_ADD("t", 0, 10), S_ADD("t", 0, 11), S_ADD("t", 0, 15), S_ADD("t", 0, 20),
        S_DONE("t", 0, 10, 1, 11), S_DONE("t", 0, 20, 0, 0),
        S_DONE("t", 0, 11, 1, 12), /* 15 still running: last done 11 */
        S_DONE("t", 0, 15, 1, 21),
        S_END}},
    {"large_offsets", {
        S_ADD("t", 0, INT64_C(1) << 40), S_ADD("t", 0, (INT64_C(1) << 40) + 1),
        S_DONE("t", 0, (INT64_C(1) << 40) + 1, 0, 0),
        S_DONE("t", 0, INT64_C(1) << 40, 1, (INT64_C(1) << 40) + 2),
        S_END}},
    {"partitions_and_topics_independent", {
        S_ADD("a", 0, 5), S_ADD("a", 0, 6),
        S_ADD("a", 1, 5), S_ADD("a", 1, 6),
        S_ADD("b", 0, 5), S_ADD("b", 0, 6),
        S_ADD("ab", 0, 5), /* names that share a prefix stay apart */
        S_PEND("a", 0, 2), S_PEND("a", 1, 2), S_PEND("b", 0, 2),
        S_PEND("ab", 0, 1), S_TOTAL(7),
        S_DONE("a", 1, 5, 1, 6),
        S_PEND("a", 0, 2), S_PEND("a", 1, 1), S_PEND("b", 0, 2),
        S_DONE("b", 0, 6, 0, 0),
        S_DONE("a", 0, 5, 1, 6), S_DONE("a", 0, 6, 1, 7),
        S_DONE("b", 0, 5, 1, 7), /* b/0 had 6 done already */
        S_DONE("a", 1, 6, 1, 7), S_DONE("ab", 0, 5, 1, 6),
        S_TOTAL(0),
        S_END}},
    {"unknown_answers_minus_one", {
        S_DONE("t", 0, 0, -1, 0), /* nothing tracked at all */
        S_ADD("t", 0, 10), S_ADD("t", 0, 11), S_ADD("t", 0, 15),
        S_DONE("u", 0, 10, -1, 0),  /* unknown topic */
        S_DONE("t", 1, 10, -1, 0),  /* unknown partition */
        S_DONE("t", 0, 9, -1, 0),   /* below everything recorded */
        S_DONE("t", 0, 12, -1, 0),  /* inside a gap */
        S_DONE("t", 0, 16, -1, 0),  /* above the last recorded */
        S_PEND("t", 0, 3), S_PEND("u", 0, 0), S_PEND("t", 1, 0),
        S_DONE("t", 0, 10, 1, 11),
        S_DONE("t", 0, 10, -1, 0),  /* already stored past */
        S_DONE("t", 0, 11, 1, 12), S_DONE("t", 0, 15, 1, 16),
        S_DONE("t", 0, 15, -1, 0),  /* partition idle: nothing outstanding */
        S_TOTAL(0),
        S_END}},
    {"duplicate_done_harmless", {
        S_ADD("t", 0, 0), S_ADD("t", 0, 1), S_ADD("t", 0, 2),
        S_DONE("t", 0, 1, 0, 0), S_DONE("t", 0, 1, 0, 0), S_DONE("t", 0, 1, 0, 0),
        S_PEND("t", 0, 2),
        S_DONE("t", 0, 0, 1, 2),
        S_DONE("t", 0, 0, -1, 0), S_DONE("t", 0, 1, -1, 0),
        S_PEND("t", 0, 1),
        S_DONE("t", 0, 2, 1, 3),
        S_DONE("t", 0, 2, -1, 0),
        S_END}},
    {"pending_counts", {
        S_TOTAL(0), S_PEND("t", 0, 0),
        S_ADD("t", 0, 0), S_ADD("t", 0, 1), S_ADD("t", 0, 2),
        S_ADD("t", 1, 0), S_ADD("u", 7, 40),
        S_PEND("t", 0, 3), S_PEND("t", 1, 1), S_PEND("u", 7, 1), S_TOTAL(5),
        S_DONE("t", 0, 2, 0, 0), /* done out of order still counts as done */
        S_PEND("t", 0, 2), S_TOTAL(4),
        S_DONE("u", 7, 40, 1, 41), S_PEND("u", 7, 0), S_TOTAL(3),
        S_DONE("t", 0, 0, 1, 1), S_DONE("t", 0, 1, 1, 3), S_DONE("t", 1, 0, 1, 1),
        S_TOTAL(0),
        S_END}},
    {"drop_forgets_one_partition", {
        S_ADD("t", 0, 0), S_ADD("t", 0, 1),
        S_ADD("t", 1, 0), S_ADD("t", 2, 0), S_ADD("t", 2, 1),
        S_DROP("t", 0), /* the first slot: another moves into it */
        S_PEND("t", 0, 0), S_TOTAL(3),
        S_DONE("t", 0, 0, -1, 0),
        S_DONE("t", 2, 0, 1, 1), S_DONE("t", 1, 0, 1, 1),
        S_DROP("t", 9), S_DROP("x", 1), /* unknown: no-op */
        S_TOTAL(1),
        S_DROP("t", 2), S_DONE("t", 2, 1, -1, 0), S_TOTAL(0),
        /* Reassigned later: starts fresh at whatever it is fed. */
        S_ADD("t", 0, 500), S_DONE("t", 0, 500, 1, 501),
        S_ADD("t", 2, 0), S_PEND("t", 2, 1), S_DONE("t", 2, 0, 1, 1),
        S_END}},
    {"drop_every_partition_then_reuse", {
        S_ADD("a", 0, 1), S_ADD("b", 0, 1), S_ADD("c", 0, 1),
        S_DROP("c", 0), S_DROP("a", 0), S_DROP("b", 0), S_TOTAL(0),
        S_DONE("a", 0, 1, -1, 0), S_DONE("b", 0, 1, -1, 0),
        S_ADD("b", 0, 3), S_DONE("b", 0, 3, 1, 4),
        S_END}},
    {"seek_back_resets", {
        S_ADD("t", 0, 10), S_ADD("t", 0, 11), S_ADD("t", 0, 12),
        S_DONE("t", 0, 10, 1, 11),
        S_ADD("t", 0, 11), /* re-fetch from 11: 11 and 12 come again */
        S_PEND("t", 0, 1),
        S_DONE("t", 0, 12, -1, 0), /* forgotten until it is added again */
        S_ADD("t", 0, 12),
        S_DONE("t", 0, 12, 0, 0), S_DONE("t", 0, 11, 1, 13),
        S_END}},
    {"seek_to_same_offset_keeps_earlier", {
        S_ADD("t", 0, 5), S_ADD("t", 0, 6),
        S_ADD("t", 0, 6), S_PEND("t", 0, 2), /* 5 still in flight, 6 again */
        S_DONE("t", 0, 5, 1, 6), S_DONE("t", 0, 6, 1, 7),
        S_END}},
    {"seek_back_never_skips_unfinished_below", {
        /* 5..8 in flight, 8 finishes, then a re-fetch from 7: 5 and 6 must
         * still hold the watermark back until they finish. */
        S_ADD("t", 0, 5), S_ADD("t", 0, 6), S_ADD("t", 0, 7), S_ADD("t", 0, 8),
        S_DONE("t", 0, 8, 0, 0),
        S_ADD("t", 0, 7), S_PEND("t", 0, 3),
        S_DONE("t", 0, 7, 0, 0), S_DONE("t", 0, 5, 1, 6), S_DONE("t", 0, 6, 1, 8),
        S_END}},
    {"seek_back_after_all_done", {
        S_ADD("t", 0, 0), S_ADD("t", 0, 1),
        S_DONE("t", 0, 0, 1, 1), S_DONE("t", 0, 1, 1, 2),
        S_ADD("t", 0, 0), S_PEND("t", 0, 1),
        S_DONE("t", 0, 0, 1, 1), /* a seek may move the watermark back */
        S_END}},
    {"seek_back_one_partition_only", {
        S_ADD("t", 0, 10), S_ADD("t", 0, 11), S_ADD("t", 1, 10), S_ADD("t", 1, 11),
        S_ADD("t", 0, 3), S_PEND("t", 0, 1), S_PEND("t", 1, 2),
        S_DONE("t", 1, 10, 1, 11), S_DONE("t", 0, 3, 1, 4),
        S_END}},
};

#define N_SCENARIOS (sizeof(scenarios) / sizeof(scenarios[0]))

/* Runs one scenario row step by step; a failure names the step. */
static void test_scenario(void **state)
{
    const struct scenario *sc = *state;
    struct offtrack *t = offtrack_new();
    assert_non_null(t);
    for (size_t i = 0; sc->steps[i].op != END; i++) {
        const struct step *s = &sc->steps[i];
        switch (s->op) {
        case ADD:
            if (offtrack_add(t, s->topic, s->part, s->off) != 0)
                fail_msg("%s step %zu: add failed", sc->name, i);
            break;
        case DONE: {
            int64_t store = UNTOUCHED;
            int rc = offtrack_done(t, s->topic, s->part, s->off, &store);
            if (rc != s->rc)
                fail_msg("%s step %zu: done(%s/%d@%lld) = %d, want %d", sc->name,
                         i, s->topic, (int)s->part, (long long)s->off, rc, s->rc);
            if (rc == 1 && store != s->want)
                fail_msg("%s step %zu: store %lld, want %lld", sc->name, i,
                         (long long)store, (long long)s->want);
            if (rc != 1 && store != UNTOUCHED)
                fail_msg("%s step %zu: rc %d but store_offset written (%lld)",
                         sc->name, i, rc, (long long)store);
            break;
        }
        case PEND: {
            size_t n = offtrack_pending(t, s->topic, s->part);
            if (n != s->n)
                fail_msg("%s step %zu: pending(%s/%d) = %zu, want %zu", sc->name,
                         i, s->topic, (int)s->part, n, s->n);
            break;
        }
        case TOTAL: {
            size_t n = offtrack_pending_total(t);
            if (n != s->n)
                fail_msg("%s step %zu: pending_total = %zu, want %zu", sc->name,
                         i, n, s->n);
            break;
        }
        case DROP:
            offtrack_drop(t, s->topic, s->part);
            break;
        case END:
            break;
        }
    }
    offtrack_destroy(t);
}

/* ---- ring: growth and wrap-around --------------------------------------- */

/* Completes offset off and checks rc/store against want (rc 1 when want >=
 * 0, else rc 0). */
static void done_expect(struct offtrack *t, const char *topic, int32_t part,
                        int64_t off, int64_t want)
{
    int64_t store = UNTOUCHED;
    int rc = offtrack_done(t, topic, part, off, &store);
    if (want >= 0) {
        if (rc != 1 || store != want)
            fail_msg("done(%lld): rc %d store %lld, want rc 1 store %lld",
                     (long long)off, rc, (long long)store, (long long)want);
    } else if (rc != 0) {
        fail_msg("done(%lld): rc %d, want 0", (long long)off, rc);
    }
}

/* Far more than 64 outstanding, completed newest first: nothing advances
 * until the oldest finishes, then the watermark jumps to the end. */
static void test_ring_growth_reverse(void **state)
{
    (void)state;
    struct offtrack *t = offtrack_new();
    assert_non_null(t);
    const int64_t n = 1000, base = 3000;
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(offtrack_add(t, "t", 0, base + 2 * i), 0);
    assert_int_equal(offtrack_pending(t, "t", 0), (size_t)n);
    for (int64_t i = n - 1; i >= 1; i--) done_expect(t, "t", 0, base + 2 * i, -1);
    assert_int_equal(offtrack_pending(t, "t", 0), 1);
    done_expect(t, "t", 0, base, base + 2 * (n - 1) + 1);
    assert_int_equal(offtrack_pending_total(t), 0);
    offtrack_destroy(t);
}

/* A window of outstanding offsets slides far past the ring's capacity, so
 * the head wraps many times; then the window widens to 4x the capacity
 * while the head sits mid-ring (growth must unwrap in order), and the whole
 * window finishes in a shuffled order. */
static void test_ring_wrap_and_grow(void **state)
{
    (void)state;
    struct offtrack *t = offtrack_new();
    assert_non_null(t);
    const int64_t window = 60, slide = 5000;
    int64_t lo = 0; /* model: the first offset not stored past */
    for (int64_t i = 0; i < slide; i++) {
        assert_int_equal(offtrack_add(t, "w", 1, i), 0);
        int64_t oldest = i - (window - 1);
        /* Every other step, finish the oldest but one and then the oldest:
         * out of order inside the wrapped ring. */
        if (oldest >= 0 && oldest % 2 == 0) {
            done_expect(t, "w", 1, oldest + 1, -1);
            done_expect(t, "w", 1, oldest, oldest + 2);
            lo = oldest + 2;
        }
        size_t want = (size_t)(i + 1 - lo);
        if (offtrack_pending(t, "w", 1) != want)
            fail_msg("slide %lld: pending %zu, want %zu", (long long)i,
                     offtrack_pending(t, "w", 1), want);
    }
    /* Outstanding now: the tail of the window. Widen it past 256. */
    int64_t first = lo;
    int64_t last = slide + 250;
    for (int64_t i = slide; i <= last; i++)
        assert_int_equal(offtrack_add(t, "w", 1, i), 0);
    size_t n = (size_t)(last - first + 1);
    assert_int_equal(offtrack_pending(t, "w", 1), n);

    int64_t *order = malloc(n * sizeof(*order));
    unsigned char *done = calloc(n, 1);
    assert_non_null(order);
    assert_non_null(done);
    for (size_t i = 0; i < n; i++) order[i] = first + (int64_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t k = (size_t)(tu_rand64() % (i + 1));
        int64_t x = order[i];
        order[i] = order[k];
        order[k] = x;
    }
    size_t prefix = 0; /* model: offsets first..first+prefix-1 are stored past */
    for (size_t i = 0; i < n; i++) {
        size_t idx = (size_t)(order[i] - first);
        done[idx] = 1;
        size_t np = prefix;
        while (np < n && done[np]) np++;
        done_expect(t, "w", 1, order[i], np > prefix ? first + (int64_t)np : -1);
        prefix = np;
        assert_int_equal(offtrack_pending(t, "w", 1), n - i - 1);
    }
    free(order);
    free(done);
    offtrack_destroy(t);
}

/* Many partitions: the table of partitions itself grows past its first
 * allocation, and each keeps its own ring. */
static void test_many_partitions(void **state)
{
    (void)state;
    struct offtrack *t = offtrack_new();
    assert_non_null(t);
    const int32_t np = 50;
    for (int64_t off = 0; off < 3; off++)
        for (int32_t p = 0; p < np; p++)
            assert_int_equal(offtrack_add(t, p % 2 ? "odd" : "even", p, off * 10 + p), 0);
    assert_int_equal(offtrack_pending_total(t), (size_t)(3 * np));
    for (int32_t p = 0; p < np; p += 3) offtrack_drop(t, p % 2 ? "odd" : "even", p);
    size_t dropped = (size_t)((np + 2) / 3);
    assert_int_equal(offtrack_pending_total(t), (size_t)(3 * np) - 3 * dropped);
    for (int32_t p = 0; p < np; p++) {
        const char *topic = p % 2 ? "odd" : "even";
        int64_t store = UNTOUCHED;
        int rc = offtrack_done(t, topic, p, 10 + p, &store);
        if (p % 3 == 0) {
            assert_int_equal(rc, -1);
            continue;
        }
        assert_int_equal(rc, 0);
        done_expect(t, topic, p, p, 10 + p + 1);
        assert_int_equal(offtrack_pending(t, topic, p), 1);
        /* The same partition number under the other topic is unknown. */
        assert_int_equal(offtrack_pending(t, p % 2 ? "even" : "odd", p), 0);
    }
    assert_int_equal(offtrack_pending_total(t), (size_t)np - dropped);
    offtrack_destroy(t);
}

static void test_destroy_null(void **state)
{
    (void)state;
    offtrack_destroy(NULL);
    struct offtrack *t = offtrack_new();
    assert_non_null(t);
    assert_int_equal(offtrack_pending_total(t), 0);
    offtrack_drop(t, "t", 0); /* nothing tracked: no-op */
    offtrack_destroy(t);      /* empty: nothing to free but itself */
}

/* offtrack_next: where fetching stands, the offset after the last one
 * added, kept when work finishes, moved back by a seek back, and forgotten
 * with the partition (the worker seeks a resumed partition there). */
static void test_next(void **state)
{
    (void)state;
    struct offtrack *t = offtrack_new();
    assert_int_equal(offtrack_next(t, "t", 0), -1);
    assert_int_equal(offtrack_add(t, "t", 0, 40), 0);
    assert_int_equal(offtrack_add(t, "t", 0, 41), 0);
    assert_int_equal(offtrack_add(t, "t", 0, 45), 0); /* a gap */
    assert_int_equal(offtrack_next(t, "t", 0), 46);
    assert_int_equal(offtrack_next(t, "t", 1), -1); /* other partitions apart */
    assert_int_equal(offtrack_next(t, "u", 0), -1);
    int64_t st = UNTOUCHED;
    for (int64_t o = 40; o <= 41; o++) offtrack_done(t, "t", 0, o, &st);
    assert_int_equal(offtrack_done(t, "t", 0, 45, &st), 1);
    assert_int_equal(offtrack_next(t, "t", 0), 46); /* all done: still 46 */
    assert_int_equal(offtrack_add(t, "t", 0, 41), 0); /* a seek back */
    assert_int_equal(offtrack_next(t, "t", 0), 42);
    offtrack_drop(t, "t", 0);
    assert_int_equal(offtrack_next(t, "t", 0), -1);
    assert_int_equal(offtrack_add(t, "t", 0, 7), 0); /* assigned again */
    assert_int_equal(offtrack_next(t, "t", 0), 8);
    offtrack_destroy(t);
}

/* ---- randomized property test ------------------------------------------ */

/* The test's own model of one partition: every offset added, in order, with
 * its done flag; prefix = how many from the front are done. */
struct mpart {
    const char *topic;
    int32_t part;
    int64_t *off;
    unsigned char *done;
    size_t n, cap, prefix;
    int64_t next;   /* next offset to add */
    int64_t stored; /* last store offset returned, -1 none */
};

static void mpart_add(struct mpart *m, int64_t off)
{
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 64;
        m->off = realloc(m->off, m->cap * sizeof(*m->off));
        m->done = realloc(m->done, m->cap);
        assert_non_null(m->off);
        assert_non_null(m->done);
    }
    m->off[m->n] = off;
    m->done[m->n] = 0;
    m->n++;
}

/* Expected watermark: last contiguous done + 1, which is last added + 1
 * when nothing is pending (offtrack.h; docs/reliability.md, rule 2). */
static int64_t mpart_want(const struct mpart *m)
{
    return m->prefix ? m->off[m->prefix - 1] + 1 : -1;
}

/* Smallest offset added and not done, or INT64_MAX. */
static int64_t mpart_min_unfinished(const struct mpart *m)
{
    for (size_t i = m->prefix; i < m->n; i++)
        if (!m->done[i]) return m->off[i];
    return INT64_MAX;
}

/* Random gap: mostly 1 (dense), sometimes small, rarely a large jump
 * (compaction, transaction markers). */
static int64_t rand_gap(void)
{
    uint64_t r = tu_rand64() % 100;
    if (r < 70) return 1;
    if (r < 95) return 2 + (int64_t)(tu_rand64() % 5);
    return 10 + (int64_t)(tu_rand64() % 100000);
}

/* Checks offtrack against the model for one completion of m->off[k]. */
static void property_done(struct offtrack *t, struct mpart *m, size_t k)
{
    int already = m->done[k];
    m->done[k] = 1;
    size_t old_prefix = m->prefix;
    while (m->prefix < m->n && m->done[m->prefix]) m->prefix++;

    int64_t store = UNTOUCHED;
    int rc = offtrack_done(t, m->topic, m->part, m->off[k], &store);
    int want_rc = already ? (k < old_prefix ? -1 : 0) : (m->prefix > old_prefix);
    if (rc != want_rc)
        fail_msg("%s/%d done(%lld)%s: rc %d, want %d", m->topic, (int)m->part,
                 (long long)m->off[k], already ? " again" : "", rc, want_rc);
    if (rc != 1) {
        if (store != UNTOUCHED) fail_msg("rc %d but store written", rc);
        return;
    }
    int64_t want = mpart_want(m);
    if (store != want)
        fail_msg("%s/%d done(%lld): store %lld, want %lld", m->topic, (int)m->part,
                 (long long)m->off[k], (long long)store, (long long)want);
    /* Safety, stated apart from the model: never past unfinished work,
     * never backwards, and exactly last added + 1 once idle. */
    if (store > mpart_min_unfinished(m))
        fail_msg("store %lld passes unfinished %lld", (long long)store,
                 (long long)mpart_min_unfinished(m));
    if (store <= m->stored)
        fail_msg("store %lld after %lld: did not advance", (long long)store,
                 (long long)m->stored);
    if (m->prefix == m->n && store != m->off[m->n - 1] + 1)
        fail_msg("idle partition stores %lld, want last added + 1 = %lld",
                 (long long)store, (long long)(m->off[m->n - 1] + 1));
    m->stored = store;
}

/* Random interleaving of adds (per partition in increasing order with
 * random gaps) and completions (any outstanding offset of any partition,
 * plus duplicates and offsets never added), checked against the model after
 * every call. */
static void test_property_random(void **state)
{
    (void)state;
    static const char *const topics[] = {"jobs", "jobs-hi"};
    enum { NP = 6, ROUNDS = 30, OPS = 3000 };
    for (int round = 0; round < ROUNDS; round++) {
        struct offtrack *t = offtrack_new();
        assert_non_null(t);
        struct mpart parts[NP];
        memset(parts, 0, sizeof(parts));
        for (int p = 0; p < NP; p++) {
            parts[p].topic = topics[p % 2];
            parts[p].part = p / 2;
            parts[p].next = (int64_t)(tu_rand64() % 2 ? tu_rand64() % 1000
                                                      : tu_rand64() % (UINT64_C(1) << 50));
            parts[p].stored = -1;
        }
        /* Bias toward adds early so windows get wide (past the 64 ring),
         * toward completions late so partitions drain. */
        for (int op = 0; op < OPS; op++) {
            struct mpart *m = &parts[tu_rand64() % NP];
            unsigned add_pct = op < OPS / 2 ? 60 : 35;
            unsigned r = (unsigned)(tu_rand64() % 100);
            if (r < add_pct || m->n == 0) {
                int64_t off = m->next;
                mpart_add(m, off);
                m->next = off + rand_gap();
                assert_int_equal(offtrack_add(t, m->topic, m->part, off), 0);
            } else if (r < 95) {
                /* An outstanding offset, else any recorded one (duplicate). */
                size_t left = m->n - m->prefix;
                size_t k = left ? m->prefix + (size_t)(tu_rand64() % left)
                                : (size_t)(tu_rand64() % m->n);
                property_done(t, m, k);
            } else {
                /* An offset never added: inside a gap or past the end. */
                int64_t off = m->off[m->n - 1] + 1;
                if (off == m->next) off = m->next + 1000;
                int64_t store = UNTOUCHED;
                int rc = offtrack_done(t, m->topic, m->part, off, &store);
                assert_int_equal(rc, -1);
                assert_int_equal(store, UNTOUCHED);
            }
            size_t pend = 0, total = 0;
            for (int p = 0; p < NP; p++) {
                pend = 0;
                for (size_t i = parts[p].prefix; i < parts[p].n; i++)
                    pend += !parts[p].done[i];
                total += pend;
                if (offtrack_pending(t, parts[p].topic, parts[p].part) != pend)
                    fail_msg("round %d op %d: pending %s/%d = %zu, want %zu", round,
                             op, parts[p].topic, (int)parts[p].part,
                             offtrack_pending(t, parts[p].topic, parts[p].part), pend);
            }
            assert_int_equal(offtrack_pending_total(t), total);
        }
        /* Finish everything, in random order, still checking each step. */
        for (int p = 0; p < NP; p++) {
            struct mpart *m = &parts[p];
            while (m->prefix < m->n) {
                size_t left = m->n - m->prefix;
                size_t k = m->prefix + (size_t)(tu_rand64() % left);
                if (!m->done[k]) property_done(t, m, k);
            }
            if (m->n) assert_int_equal(m->stored, m->off[m->n - 1] + 1);
            assert_int_equal(offtrack_pending(t, m->topic, m->part), 0);
            free(m->off);
            free(m->done);
        }
        assert_int_equal(offtrack_pending_total(t), 0);
        offtrack_destroy(t);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    static struct CMUnitTest sc[N_SCENARIOS];
    for (size_t i = 0; i < N_SCENARIOS; i++) {
        sc[i].name = scenarios[i].name;
        sc[i].test_func = test_scenario;
        sc[i].initial_state = (void *)&scenarios[i];
    }
    const struct CMUnitTest other[] = {
        cmocka_unit_test(test_ring_growth_reverse),
        cmocka_unit_test(test_ring_wrap_and_grow),
        cmocka_unit_test(test_many_partitions),
        cmocka_unit_test(test_destroy_null),
        cmocka_unit_test(test_next),
        cmocka_unit_test(test_property_random),
    };
    int failed = _cmocka_run_group_tests("offtrack_scenarios", sc, N_SCENARIOS, NULL, NULL);
    failed += cmocka_run_group_tests_name("offtrack_ring_and_property", other, NULL, NULL);
    return failed ? 1 : 0;
}

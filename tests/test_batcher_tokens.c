/* test_batcher_tokens.c - batching/batcher.c with encoder jobs (seq_len > 0):
 * the token budget, closing by tokens, grouping by length, and the token
 * accounting, driven by an injected clock (no test sleeps or measures
 * time).
 *
 * Proves: every batch keeps rows x its longest row within max_batch_tokens
 * (a single job alone excepted) and its rows within max_batch_rows; a
 * queue closes by size exactly when its jobs' rows x seq_len reach the
 * budget (table); with group_by_length a batch never holds a job of a
 * longer length bucket than its first job (bucket edges table), fills
 * from the first job's bucket before shorter ones (nearest first), each in effective
 * priority order, and leaves nothing behind that would still have fit;
 * without it a batch is the longest fitting prefix in priority order; the
 * first job of every batch is the best head (priority, aging, age); a long
 * job among continuous short traffic runs within a bounded number of
 * batches, and within max_wait when traffic is light; the padded tokens
 * (rows x longest) summed over a random mixed-length stream are lower
 * with grouping than without on the same stream; purge and expire keep
 * queued_tokens equal to what is queued, back to 0; deadline estimates are
 * looked up by an encoder queue's tokens, not its rows;
 * batcher_padded_tokens. The random cases check every batch against a
 * shadow copy of the queue kept by the test.
 *
 * Deterministic given the printed KINFER_TEST_SEED. Every job taken is
 * freed; jobs left queued are freed by batcher_destroy (ASan checks). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../batching/batcher.h"
#include "../batching/job.h"
#include "testutil.h"

#define MS 1000 /* microseconds */
#define MAX_JOBS 8192

static int64_t fake_now;
static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static size_t rnd(size_t n)
{
    return (size_t)(tu_rand64() % n);
}

struct bconf {
    size_t max_rows, budget;
    int group, max_wait_ms, aging_ms;
};

static struct batcher *mk(const struct bconf *c)
{
    struct batcher_conf conf = {.n_models = 1, .max_batch_rows = c->max_rows,
                                .max_wait_ms = c->max_wait_ms, .aging_ms = c->aging_ms,
                                .max_batch_tokens = c->budget, .group_by_length = c->group,
                                .clock = fake_clock};
    struct batcher *b = batcher_new(&conf);
    assert_non_null(b);
    return b;
}

/* What the test knows of a job it pushed. */
struct rec {
    size_t rows, len;
    int prio;
    int64_t arrived, deadline;
    char topic[8];
    int32_t partition;
    int queued;
    int64_t taken_at; /* -1 until taken */
};

/* The test's copy of a batcher's queue (one model). */
struct shadow {
    struct rec r[MAX_JOBS];
    size_t n; /* pushed so far; ids are indexes */
};

static struct shadow *shadow_new(void)
{
    struct shadow *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    return s;
}

/* Pushes an encoder job of rows x len (seq_len len) at fake_now; its
 * offset is its index in the shadow. */
static int64_t push(struct batcher *b, struct shadow *s, size_t rows, size_t len, int prio,
                    int64_t deadline_us, const char *topic, int32_t partition)
{
    assert_true(s->n < MAX_JOBS);
    int64_t id = (int64_t)s->n++;
    struct rec *r = &s->r[id];
    *r = (struct rec){.rows = rows, .len = len, .prio = prio, .arrived = fake_now,
                      .deadline = deadline_us, .partition = partition, .queued = 1,
                      .taken_at = -1};
    snprintf(r->topic, sizeof(r->topic), "%s", topic ? topic : "t");
    struct job *j = job_new();
    assert_non_null(j);
    snprintf(j->topic, sizeof(j->topic), "%s", r->topic);
    j->partition = partition;
    j->offset = id;
    j->model_idx = 0;
    j->rows = rows;
    j->seq_len = len;
    j->n_tokens = rows * len;
    j->priority = prio;
    j->arrived_us = fake_now;
    j->deadline_us = deadline_us;
    batcher_push(b, j);
    return id;
}

static void free_all(struct job *j)
{
    while (j) {
        struct job *n = j->next;
        job_free(j);
        j = n;
    }
}

static size_t count(const struct job *j)
{
    size_t n = 0;
    for (; j; j = j->next) n++;
    return n;
}

/* The length bucket of a row of len tokens, as batcher.h documents it:
 * up to 16 tokens, then four per power of two (17-20, 21-24, 25-28, 29-32,
 * 33-40, ...): counted here from the bucket edges, not by the batcher's
 * arithmetic. */
static int bucket(size_t len)
{
    if (len <= 16) return 0;
    int k = 1;
    for (size_t lo = 16; lo < ((size_t)1 << 40); lo *= 2) {
        size_t width = lo / 4;
        for (size_t hi = lo + width; hi <= 2 * lo; hi += width, k++)
            if (len <= hi) return k;
    }
    return k;
}

/* A job's effective priority at now (batcher.h: its level plus one per
 * aging_ms waited), computed the way the header states it. */
static double eff(const struct rec *r, int64_t now, int aging_ms)
{
    double e = r->prio;
    if (aging_ms > 0 && now > r->arrived) e += (double)(now - r->arrived) / (aging_ms * 1000.0);
    return e;
}

/* 1 when a goes before c: higher effective priority, then older. */
static int before(const struct rec *a, const struct rec *c, int64_t now, int aging_ms)
{
    double ea = eff(a, now, aging_ms), ec = eff(c, now, aging_ms);
    if (ea != ec) return ea > ec;
    return a->arrived < c->arrived;
}

/* The queued job that should head the next batch at now. */
static int64_t best_queued(const struct shadow *s, int64_t now, int aging_ms)
{
    int64_t best = -1;
    for (size_t i = 0; i < s->n; i++)
        if (s->r[i].queued && (best < 0 || before(&s->r[i], &s->r[best], now, aging_ms)))
            best = (int64_t)i;
    return best;
}

/* Whether a job of rows x len still fits a batch of n rows whose longest
 * row is longest. */
static int fits(const struct bconf *c, size_t n, size_t longest, size_t rows, size_t len)
{
    size_t l = len > longest ? len : longest;
    return n + rows <= c->max_rows && (!c->budget || (n + rows) * l <= c->budget);
}

struct totals {
    size_t rows, jobs, tokens; /* tokens: rows x seq_len, what the batcher counts */
    int64_t oldest;
};

static struct totals shadow_totals(const struct shadow *s)
{
    struct totals t = {0, 0, 0, INT64_MAX};
    for (size_t i = 0; i < s->n; i++) {
        if (!s->r[i].queued) continue;
        t.rows += s->r[i].rows;
        t.jobs++;
        t.tokens += s->r[i].rows * s->r[i].len;
        if (s->r[i].arrived < t.oldest) t.oldest = s->r[i].arrived;
    }
    return t;
}

/* The batcher's counters agree with the shadow. */
static void check_counts(struct batcher *b, const struct shadow *s)
{
    struct totals t = shadow_totals(s);
    struct batcher_stats st;
    batcher_get_stats(b, fake_now, &st);
    assert_int_equal(st.queued_tokens, t.tokens);
    assert_int_equal(st.queued_rows, t.rows);
    assert_int_equal(st.queued_jobs, t.jobs);
    assert_int_equal(batcher_queued_rows(b), t.rows);
    assert_int_equal(batcher_queued_jobs(b), t.jobs);
}

/* What a batch added up to. */
struct bsum {
    size_t rows, longest, tokens, jobs;
};

/* Checks one batch taken at now against the shadow (which still holds
 * its jobs as queued), then takes them out of the shadow. The checks are
 * the rules of batcher.h: see the top of this file. */
static struct bsum check_batch(const struct bconf *c, struct shadow *s, const struct job *batch,
                               size_t rows, int64_t now)
{
    struct bsum sum = {0, 0, 0, 0};
    assert_non_null(batch);
    int64_t best = best_queued(s, now, c->aging_ms);
    if (batch->offset != best)
        fail_msg("batch starts with job %lld, the best head is %lld", (long long)batch->offset,
                 (long long)best);
    const struct rec *first = &s->r[batch->offset];
    int fb = bucket(first->len);
    size_t same_rows = 0, same_longest = 0;
    const struct rec *prev = NULL;
    for (const struct job *j = batch; j; j = j->next) {
        assert_true(j->offset >= 0 && (size_t)j->offset < s->n);
        const struct rec *r = &s->r[j->offset];
        if (!r->queued) fail_msg("job %lld taken twice", (long long)j->offset);
        assert_int_equal(j->rows, r->rows);
        assert_int_equal(j->seq_len, r->len);
        sum.rows += r->rows;
        sum.tokens += r->rows * r->len;
        sum.jobs++;
        if (r->len > sum.longest) sum.longest = r->len;
        if (c->group) {
            int k = bucket(r->len);
            if (k > fb)
                fail_msg("job %lld of %zu tokens (bucket %d) in a batch whose first job has %zu "
                         "(bucket %d)", (long long)j->offset, r->len, k, first->len, fb);
            /* after the first: its bucket, then the shorter ones nearest
             * first, so buckets never rise along the batch */
            if (prev && j != batch->next && k > bucket(prev->len))
                fail_msg("job %lld (bucket %d) after job %lld (bucket %d)", (long long)j->offset,
                         k, (long long)(prev - s->r), bucket(prev->len));
            if (k == fb) {
                same_rows += r->rows;
                if (r->len > same_longest) same_longest = r->len;
            }
            /* after the first, each bucket in effective-priority order */
            if (prev && j != batch->next && bucket(prev->len) == k &&
                before(r, prev, now, c->aging_ms))
                fail_msg("job %lld goes before job %lld in priority but came after it",
                         (long long)j->offset, (long long)(prev - s->r));
        }
        if (!c->group && prev && before(r, prev, now, c->aging_ms))
            fail_msg("job %lld goes before job %lld in priority but came after it",
                     (long long)j->offset, (long long)(prev - s->r));
        prev = r;
    }
    assert_int_equal(sum.rows, rows);
    assert_int_equal(batcher_padded_tokens(batch), sum.rows * sum.longest);
    if (sum.jobs > 1) {
        if (sum.rows > c->max_rows) fail_msg("%zu rows over max %zu", sum.rows, c->max_rows);
        if (c->budget && sum.rows * sum.longest > c->budget)
            fail_msg("%zu rows x %zu tokens over the budget %zu", sum.rows, sum.longest,
                     c->budget);
    }
    /* take the batch out of the shadow, then look at what stayed */
    for (const struct job *j = batch; j; j = j->next) s->r[j->offset].queued = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct rec *r = &s->r[i];
        if (!r->queued) continue;
        if (c->group) {
            int k = bucket(r->len);
            /* nothing of the first job's bucket that still fits beside the
             * same-bucket part was left out, nor anything shorter that fits
             * the whole batch */
            if (k == fb && fits(c, same_rows, same_longest, r->rows, r->len))
                fail_msg("job %zu (%zu x %zu, first's bucket) left out though it fits", i,
                         r->rows, r->len);
            if (k < fb && fits(c, sum.rows, sum.longest, r->rows, r->len))
                fail_msg("job %zu (%zu x %zu, shorter bucket) left out though it fits", i,
                         r->rows, r->len);
        } else if (before(r, first, now, c->aging_ms)) {
            fail_msg("job %zu goes before the batch's first job", i);
        }
    }
    if (!c->group) {
        /* the batch is a prefix of the priority order: everything left
         * goes after its last job, and the next one does not fit */
        const struct rec *last = prev, *next = NULL;
        for (size_t i = 0; i < s->n; i++) {
            const struct rec *r = &s->r[i];
            if (!r->queued) continue;
            if (before(r, last, now, c->aging_ms))
                fail_msg("job %zu goes before the batch's last job but was left", i);
            if (!next || before(r, next, now, c->aging_ms)) next = r;
        }
        if (next && fits(c, sum.rows, sum.longest, next->rows, next->len))
            fail_msg("the next job in order (%zu x %zu) fits but was left", next->rows, next->len);
    }
    for (const struct job *j = batch; j; j = j->next) s->r[j->offset].taken_at = now;
    return sum;
}

/* Takes every batch ready at fake_now, checking each and why it closed
 * against the shadow; checks that nothing more is ready when take says
 * so. Returns the padded and real tokens of what came out. */
static void take_ready(struct batcher *b, const struct bconf *c, struct shadow *s, int closing,
                       size_t *padded, size_t *tokens)
{
    for (;;) {
        struct totals t = shadow_totals(s);
        size_t rows;
        enum batcher_reason why;
        int64_t wake;
        struct job *batch = batcher_take(b, fake_now, &rows, &why, &wake);
        int size = t.jobs && (t.rows >= c->max_rows || (c->budget && t.tokens >= c->budget));
        int waited = t.jobs && fake_now - t.oldest >= (int64_t)c->max_wait_ms * MS;
        if (!batch) {
            if (closing && t.jobs) fail_msg("%zu jobs left after close", t.jobs);
            if (size) fail_msg("%zu rows, %zu tokens queued: should close by size", t.rows, t.tokens);
            if (waited) fail_msg("the oldest job waited its max_wait: should close");
            break;
        }
        enum batcher_reason want = closing ? BATCH_DRAIN
                                   : size  ? BATCH_SIZE
                                           : BATCH_WAIT;
        if (!closing && !size && !waited) fail_msg("a batch closed (%s) with no rule met",
                                                   batcher_reason_name(why));
        assert_int_equal(why, want);
        struct bsum sum = check_batch(c, s, batch, rows, fake_now);
        if (padded) *padded += sum.rows * sum.longest;
        if (tokens) *tokens += sum.tokens;
        free_all(batch);
        check_counts(b, s);
    }
}

/* A random row length: mostly short, some medium, a few long. */
static size_t rand_len(size_t max_len)
{
    size_t k = rnd(10), len;
    if (k < 6) len = 1 + rnd(32);
    else if (k < 9) len = 33 + rnd(96);
    else len = 129 + rnd(384);
    return len > max_len ? max_len : len;
}

/* ---- helpers ------------------------------------------------------------ */

/* batcher_padded_tokens: rows x longest over a list; 0 for nothing and for
 * a layer model's jobs (seq_len 0). */
static void test_padded_tokens(void **state)
{
    (void)state;
    static const struct {
        size_t n;
        size_t rows[4], len[4];
        size_t want;
    } cases[] = {
        {0, {0}, {0}, 0},
        {1, {3}, {0}, 0},
        {2, {3, 5}, {0, 0}, 0},
        {1, {1}, {7}, 7},
        {1, {4}, {10}, 40},
        {2, {1, 1}, {10, 30}, 60},
        {3, {2, 1, 3}, {5, 17, 3}, 102},
        {4, {1, 1, 1, 1}, {512, 1, 1, 1}, 2048},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct job *head = NULL, **tail = &head;
        for (size_t k = 0; k < cases[i].n; k++) {
            struct job *j = job_new();
            assert_non_null(j);
            j->rows = cases[i].rows[k];
            j->seq_len = cases[i].len[k];
            *tail = j;
            tail = &j->next;
        }
        assert_int_equal(batcher_padded_tokens(head), cases[i].want);
        free_all(head);
    }
}

/* ---- closing by tokens ---------------------------------------------------- */

/* Jobs pushed one by one (rows x len): after each, either nothing is
 * ready, or a batch closes by size with the given jobs and the given
 * tokens stay queued. Budget 100 tokens, max 6 rows unless said. */
static void test_closes_by_tokens_table(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        size_t max_rows;
        size_t n;
        size_t rows[6], len[6];
        int closes_at;        /* index of the push after which it closes; -1 never */
        size_t batch_jobs;    /* jobs in that batch */
        size_t left_tokens;   /* queued_tokens after it */
    } cases[] = {
        {"reaches_100", 64, 3, {1, 2, 1}, {25, 25, 25}, 2, 3, 0},
        {"stays_at_99", 64, 3, {1, 2, 1}, {30, 20, 29}, -1, 0, 0},
        {"single_over_budget", 64, 1, {1}, {150}, 0, 1, 0},
        {"multi_row_over_budget", 64, 1, {3}, {40}, 0, 1, 0},
        {"over_budget_after_small", 64, 2, {1, 1}, {10, 120}, 1, 1, 120},
        {"exact_fit", 64, 2, {2, 2}, {25, 25}, 1, 2, 0},
        {"padding_breaks_fit", 64, 2, {3, 1}, {10, 70}, 1, 1, 70},
        {"rows_rule_first", 4, 4, {1, 1, 1, 1}, {2, 2, 2, 2}, 3, 4, 0},
        /* 60 then 1: padded to 60, two rows are over 100 already */
        {"long_head_goes_alone", 64, 3, {1, 1, 1}, {60, 1, 60}, 2, 1, 61},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int group = 0; group < 2; group++) {
            struct bconf c = {.max_rows = cases[i].max_rows, .budget = 100, .group = group,
                              .max_wait_ms = 60000};
            fake_now = 1000 * MS;
            struct batcher *b = mk(&c);
            struct shadow *s = shadow_new();
            for (size_t k = 0; k < cases[i].n; k++) {
                fake_now += 1;
                push(b, s, cases[i].rows[k], cases[i].len[k], 5, 0, NULL, 0);
                size_t rows;
                enum batcher_reason why;
                int64_t wake;
                struct job *batch = batcher_take(b, fake_now, &rows, &why, &wake);
                if ((int)k != cases[i].closes_at) {
                    if (batch) fail_msg("%s: closed after push %zu", cases[i].name, k);
                    assert_int_equal(wake, s->r[0].arrived + 60000 * MS);
                    continue;
                }
                if (!batch) fail_msg("%s: did not close after push %zu", cases[i].name, k);
                assert_int_equal(why, BATCH_SIZE);
                assert_int_equal(count(batch), cases[i].batch_jobs);
                check_batch(&c, s, batch, rows, fake_now);
                free_all(batch);
                struct batcher_stats st;
                batcher_get_stats(b, fake_now, &st);
                assert_int_equal(st.queued_tokens, cases[i].left_tokens);
                assert_int_equal(st.closed[BATCH_SIZE], 1);
                check_counts(b, s);
            }
            batcher_destroy(b);
            free(s);
        }
    }
}

/* A budget of 0 means no token limit: only rows count. And a layer
 * model's jobs (seq_len 0) never count tokens, whatever the budget. */
static void test_no_budget_and_layer_jobs(void **state)
{
    (void)state;
    struct bconf c = {.max_rows = 4, .budget = 0, .group = 1, .max_wait_ms = 60000};
    fake_now = 0;
    struct batcher *b = mk(&c);
    struct shadow *s = shadow_new();
    push(b, s, 1, 100000, 5, 0, NULL, 0);
    push(b, s, 2, 3, 5, 0, NULL, 0);
    assert_null(batcher_take(b, fake_now, NULL, NULL, NULL));
    push(b, s, 1, 9, 5, 0, NULL, 0);
    size_t rows;
    enum batcher_reason why;
    struct job *batch = batcher_take(b, fake_now, &rows, &why, NULL);
    assert_non_null(batch);
    assert_int_equal(why, BATCH_SIZE);
    assert_int_equal(rows, 4);
    free_all(batch);
    batcher_destroy(b);
    free(s);

    /* layer jobs under a tiny budget: rows alone decide */
    struct batcher_conf lc = {.n_models = 1, .max_batch_rows = 8, .max_wait_ms = 60000,
                              .max_batch_tokens = 1, .group_by_length = 1, .clock = fake_clock};
    b = batcher_new(&lc);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) {
        struct job *j = job_new();
        assert_non_null(j);
        j->model_idx = 0;
        j->rows = 1;
        j->priority = 5;
        j->offset = i;
        j->arrived_us = fake_now;
        batcher_push(b, j);
        struct batcher_stats st;
        batcher_get_stats(b, fake_now, &st);
        assert_int_equal(st.queued_tokens, 0);
        if (i < 7) assert_null(batcher_take(b, fake_now, NULL, NULL, NULL));
    }
    batch = batcher_take(b, fake_now, &rows, &why, NULL);
    assert_non_null(batch);
    assert_int_equal(rows, 8);
    assert_int_equal(count(batch), 8);
    assert_int_equal(batcher_padded_tokens(batch), 0);
    free_all(batch);
    batcher_destroy(b);
}

/* ---- grouping by length --------------------------------------------------- */

/* The bucket edges: a first job of len F is pushed first (oldest, so it
 * heads the batch), then jobs of the other lengths; the drained batch
 * holds exactly those of F's bucket or shorter. Without grouping, all. */
static void test_bucket_edges(void **state)
{
    (void)state;
    static const struct {
        size_t first;
        size_t others[6]; /* 0 ends */
        int in[6];        /* grouped: joins the first job's batch */
    } cases[] = {
        {16, {1, 16, 17, 32, 0}, {1, 1, 0, 0}},
        {1, {2, 16, 17, 0}, {1, 1, 0}},
        {17, {16, 17, 20, 21, 32, 0}, {1, 1, 1, 0, 0}},
        {20, {21, 17, 16, 0}, {0, 1, 1}},
        {32, {33, 64, 1, 29, 28, 0}, {0, 0, 1, 1, 1}},
        {33, {40, 41, 32, 128, 0}, {1, 0, 1, 0}},
        {64, {65, 57, 56, 16, 0}, {0, 1, 1, 1}},
        {128, {113, 112, 129, 0}, {1, 1, 0}},
        {512, {257, 513, 1024, 2, 256, 0}, {1, 0, 0, 1, 1}},
        {1024, {513, 1025, 2048, 0}, {1, 0, 0}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int group = 0; group < 2; group++) {
            struct bconf c = {.max_rows = 64, .budget = 1 << 20, .group = group,
                              .max_wait_ms = 60000};
            fake_now = 0;
            struct batcher *b = mk(&c);
            struct shadow *s = shadow_new();
            push(b, s, 1, cases[i].first, 5, 0, NULL, 0);
            size_t n = 0;
            for (; cases[i].others[n]; n++) {
                fake_now += 1;
                push(b, s, 1, cases[i].others[n], 5, 0, NULL, 0);
            }
            batcher_close(b);
            size_t rows;
            struct job *batch = batcher_take(b, fake_now, &rows, NULL, NULL);
            assert_non_null(batch);
            assert_int_equal(batch->offset, 0);
            int in[8] = {0};
            for (const struct job *j = batch; j; j = j->next) in[j->offset] = 1;
            for (size_t k = 0; k < n; k++) {
                int want = !group || cases[i].in[k];
                if (in[k + 1] != want)
                    fail_msg("first %zu, other %zu: %s the batch (group %d)", cases[i].first,
                             cases[i].others[k], in[k + 1] ? "in" : "not in", group);
            }
            check_batch(&c, s, batch, rows, fake_now);
            free_all(batch);
            batcher_destroy(b);
            free(s);
        }
    }
}

/* Which jobs join a grouped batch, case by case: its first job is the
 * best head; then the first job's bucket (in effective priority order),
 * then the shorter buckets nearest first, while rows and tokens fit;
 * never longer ones. */
static void test_group_preference_table(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        size_t max_rows, budget;
        size_t n;
        size_t rows[8], len[8];
        int prio[8];
        int64_t want[8]; /* the batch, in order, -1 ends */
    } cases[] = {
        /* same bucket (33-40) preferred to shorter ones of higher priority */
        {"same_bucket_first", 3, 100000, 5, {1, 1, 1, 1, 1}, {40, 5, 10, 38, 33},
         {9, 8, 8, 1, 0}, {0, 3, 4, -1}},
        /* one same-bucket job, then the best shorter one (older of equals) */
        {"then_shorter", 3, 100000, 4, {1, 1, 1, 1}, {40, 5, 10, 38}, {9, 8, 8, 1},
         {0, 3, 1, -1}},
        /* the nearest shorter bucket before farther ones of higher priority */
        {"nearest_shorter_first", 3, 100000, 4, {1, 1, 1, 1}, {40, 5, 30, 50}, {9, 8, 1, 9},
         {0, 2, 1, -1}},
        /* a longer bucket never joins, whatever its priority */
        {"never_longer", 4, 100000, 3, {1, 1, 1}, {40, 41, 64}, {9, 9, 9}, {0, -1}},
        /* a same-bucket job that does not fit the budget is passed over;
         * shorter ones fill: 3 x 40 = 120 */
        {"skip_unfit_same", 10, 120, 4, {1, 3, 1, 1}, {40, 39, 10, 10}, {9, 5, 5, 5},
         {0, 2, 3, -1}},
        /* within the bucket by priority, not age */
        {"priority_within_bucket", 3, 100000, 4, {1, 1, 1, 1}, {40, 38, 36, 34}, {9, 1, 3, 2},
         {0, 2, 3, -1}},
        /* the best head may be short: then nothing longer joins */
        {"short_head", 8, 100000, 4, {1, 1, 1, 1}, {8, 300, 100, 12}, {9, 9, 9, 1},
         {0, 3, -1}},
        /* the best head is the long job of highest priority; the nearest
         * shorter bucket (100: 97-112) before the shortest (8, 12) */
        {"long_head", 8, 100000, 4, {1, 1, 1, 1}, {8, 12, 300, 100}, {5, 5, 9, 1},
         {2, 3, 0, 1, -1}},
        /* a longer job inside the first's bucket raises the padding:
         * 17 then 20: 3 x 20 = 60 fits, a 4th row would not */
        {"longest_in_bucket", 8, 60, 4, {1, 1, 1, 1}, {17, 20, 19, 3}, {9, 8, 7, 6},
         {0, 1, 2, -1}},
        /* rows limit: a 2-row job passed over for a 1-row one */
        {"rows_skip", 2, 100000, 4, {1, 2, 1, 1}, {40, 40, 40, 40}, {9, 8, 7, 6},
         {0, 2, -1}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct bconf c = {.max_rows = cases[i].max_rows, .budget = cases[i].budget, .group = 1,
                          .max_wait_ms = 60000};
        fake_now = 0;
        struct batcher *b = mk(&c);
        struct shadow *s = shadow_new();
        for (size_t k = 0; k < cases[i].n; k++) {
            fake_now += 1;
            push(b, s, cases[i].rows[k], cases[i].len[k], cases[i].prio[k], 0, NULL, 0);
        }
        batcher_close(b);
        size_t rows;
        struct job *batch = batcher_take(b, fake_now, &rows, NULL, NULL);
        assert_non_null(batch);
        size_t k = 0;
        for (const struct job *j = batch; j; j = j->next, k++)
            if (cases[i].want[k] != j->offset)
                fail_msg("%s: batch position %zu is job %lld, expected %lld", cases[i].name, k,
                         (long long)j->offset, (long long)cases[i].want[k]);
        if (cases[i].want[k] != -1)
            fail_msg("%s: batch ends after %zu jobs, expected more", cases[i].name, k);
        check_batch(&c, s, batch, rows, fake_now);
        free_all(batch);
        batcher_destroy(b);
        free(s);
    }
}

/* Random streams, with and without grouping, aging on and off: every
 * batch is checked against the shadow (budget, rows, first job = best
 * head, buckets, order, nothing left that fits, close reasons), the
 * counters after each take, every job out exactly once after the drain. */
static void test_random_streams(void **state)
{
    (void)state;
    for (int run = 0; run < 24; run++) {
        struct bconf c = {.max_rows = run % 3 == 0 ? 8 : 32,
                          .budget = run % 4 == 0 ? 512 : 2048,
                          .group = run & 1,
                          .max_wait_ms = 5 + (int)rnd(20),
                          .aging_ms = run % 6 < 3 ? 0 : 2 + (int)rnd(10)};
        fake_now = 1000 * MS;
        struct batcher *b = mk(&c);
        struct shadow *s = shadow_new();
        size_t n_jobs = 600 + rnd(600);
        while (s->n < n_jobs) {
            size_t k = rnd(6);
            for (size_t i = 0; i < k && s->n < n_jobs; i++) {
                fake_now += 1 + (int64_t)rnd(50);
                size_t rows = rnd(8) ? 1 + rnd(3) : 1 + rnd(12);
                push(b, s, rows, rand_len(700), (int)rnd(10), 0, NULL, 0);
            }
            check_counts(b, s);
            take_ready(b, &c, s, 0, NULL, NULL);
            fake_now += MS - (fake_now % MS);
        }
        batcher_close(b);
        take_ready(b, &c, s, 1, NULL, NULL);
        for (size_t i = 0; i < s->n; i++) assert_int_equal(s->r[i].queued, 0);
        struct batcher_stats st;
        batcher_get_stats(b, fake_now, &st);
        assert_int_equal(st.queued_tokens, 0);
        assert_int_equal(st.queued_jobs, 0);
        batcher_destroy(b);
        free(s);
    }
}

/* With one priority and no aging, grouping keeps max_wait: with a take at
 * every millisecond, no job waits longer than max_wait plus that
 * millisecond, whatever its length. */
static void test_group_keeps_max_wait(void **state)
{
    (void)state;
    for (int run = 0; run < 8; run++) {
        struct bconf c = {.max_rows = 16, .budget = 4096, .group = 1, .max_wait_ms = 10};
        fake_now = 0;
        struct batcher *b = mk(&c);
        struct shadow *s = shadow_new();
        while (s->n < 2000) {
            size_t k = rnd(3); /* light traffic: most batches close by time */
            for (size_t i = 0; i < k; i++) {
                fake_now += 1 + (int64_t)rnd(300);
                push(b, s, 1 + rnd(2), rand_len(512), 5, 0, NULL, 0);
            }
            fake_now += MS - (fake_now % MS);
            take_ready(b, &c, s, 0, NULL, NULL);
        }
        batcher_close(b);
        take_ready(b, &c, s, 1, NULL, NULL);
        for (size_t i = 0; i < s->n; i++) {
            int64_t waited = s->r[i].taken_at - s->r[i].arrived;
            if (s->r[i].taken_at >= 0 && waited > (c.max_wait_ms + 1) * MS &&
                s->r[i].taken_at != fake_now)
                fail_msg("job %zu (%zu tokens) waited %lld us", i, s->r[i].len,
                         (long long)waited);
        }
        batcher_destroy(b);
        free(s);
    }
}

/* A long job among continuous short traffic (every tick fills a batch by
 * size) is not starved by grouping: at one priority it heads a batch once
 * the jobs older than it are gone, which takes at most ceil(older /
 * max_rows) + 1 batches; at a lower priority, aging lifts it within the
 * levels between times aging_ms. */
static void test_long_job_not_starved(void **state)
{
    (void)state;
    for (int aged = 0; aged < 2; aged++) {
        struct bconf c = {.max_rows = 8, .budget = 8192, .group = 1, .max_wait_ms = 1000,
                          .aging_ms = aged ? 10 : 0};
        fake_now = 0;
        struct batcher *b = mk(&c);
        struct shadow *s = shadow_new();
        size_t older = 20 + rnd(20);
        for (size_t i = 0; i < older; i++) {
            fake_now += 1;
            push(b, s, 1, 1 + rnd(16), 5, 0, NULL, 0);
        }
        fake_now += 1;
        int64_t long_id = push(b, s, 1, 300, aged ? 2 : 5, 0, NULL, 0);
        int64_t long_at = fake_now;
        size_t batches = 0;
        while (s->r[long_id].queued) {
            assert_true(batches < 10000);
            for (int i = 0; i < 8; i++) {
                fake_now += 1;
                push(b, s, 1, 1 + rnd(16), 5, 0, NULL, 0);
            }
            size_t rows;
            enum batcher_reason why;
            struct job *batch = batcher_take(b, fake_now, &rows, &why, NULL);
            assert_non_null(batch);
            assert_int_equal(why, BATCH_SIZE);
            check_batch(&c, s, batch, rows, fake_now);
            free_all(batch);
            batches++;
            fake_now += MS - (fake_now % MS);
        }
        if (!aged) {
            size_t bound = (older + c.max_rows - 1) / c.max_rows + 1;
            if (batches > bound)
                fail_msg("the long job ran in batch %zu, bound %zu", batches, bound);
        } else {
            /* 3 levels x aging_ms, plus the age of the short heads it must
             * outrank (the queue holds about `older` of them, 8 taken a
             * tick), plus a tick */
            int64_t waited = s->r[long_id].taken_at - long_at;
            int64_t bound = (3 * c.aging_ms + (int64_t)(older + 7) / 8 + 2) * MS;
            if (waited > bound)
                fail_msg("the aged long job waited %lld us", (long long)waited);
        }
        batcher_destroy(b);
        free(s);
    }
}

/* The point of grouping: on the same random mixed-length stream, fed to
 * two batchers identically, the padded tokens (each batch's rows x its
 * longest row) summed over all batches are fewer with grouping than
 * without, while the real tokens are the same. */
static void test_grouping_pads_less(void **state)
{
    (void)state;
    enum { N = 3000 };
    struct spec {
        size_t rows, len;
        int prio;
        int64_t at;
    } *st = malloc(N * sizeof(*st));
    assert_non_null(st);
    int64_t t = 1000 * MS;
    for (size_t i = 0; i < N; i++) {
        t += 1 + (int64_t)rnd(400);
        st[i] = (struct spec){1 + rnd(4), rand_len(512), (int)rnd(10), t};
    }
    size_t padded[2] = {0, 0}, tokens[2] = {0, 0};
    for (int group = 0; group < 2; group++) {
        struct bconf c = {.max_rows = 32, .budget = 4096, .group = group, .max_wait_ms = 20,
                          .aging_ms = 50};
        fake_now = 1000 * MS;
        struct batcher *b = mk(&c);
        struct shadow *s = shadow_new();
        size_t i = 0;
        while (i < N) {
            fake_now += MS;
            while (i < N && st[i].at <= fake_now) {
                int64_t now = fake_now;
                fake_now = st[i].at;
                push(b, s, st[i].rows, st[i].len, st[i].prio, 0, NULL, 0);
                fake_now = now;
                i++;
            }
            take_ready(b, &c, s, 0, &padded[group], &tokens[group]);
        }
        batcher_close(b);
        take_ready(b, &c, s, 1, &padded[group], &tokens[group]);
        batcher_destroy(b);
        free(s);
    }
    free(st);
    print_message("padded tokens: %zu without grouping, %zu with (real %zu): ratio %.3f vs %.3f\n",
                  padded[0], padded[1], tokens[0], (double)padded[0] / (double)tokens[0],
                  (double)padded[1] / (double)tokens[1]);
    assert_int_equal(tokens[0], tokens[1]);
    assert_true(padded[1] < padded[0]);
}

/* ---- accounting ---------------------------------------------------------- */

/* Pushes k random encoder jobs at fake_now (+1 us each): topics a/b,
 * partitions 0..2, a third with a deadline 1..40 ms away. */
static void push_some(struct batcher *b, struct shadow *s, int k)
{
    static const char *const topics[] = {"a", "b"};
    for (int i = 0; i < k; i++) {
        fake_now += 1;
        int64_t dl = rnd(3) == 0 ? fake_now + (int64_t)(1 + rnd(40)) * MS : 0;
        push(b, s, 1 + rnd(4), rand_len(600), (int)rnd(10), dl, topics[rnd(2)],
             (int32_t)rnd(3));
    }
}

/* purge and expire take out exactly the jobs they should, and the token
 * count follows (queued_tokens equal to the rows x seq_len still queued
 * after every step, 0 at the end); the queues they cut keep working:
 * jobs pushed right after (onto the tails they left) come out, each
 * once. */
static void test_purge_expire_tokens(void **state)
{
    (void)state;
    for (int group = 0; group < 2; group++) {
        struct bconf c = {.max_rows = 24, .budget = 1 << 24, .group = group,
                          .max_wait_ms = 1000000};
        fake_now = 1000 * MS;
        struct batcher *b = mk(&c);
        struct shadow *s = shadow_new();
        for (int round = 0; round < 12; round++) {
            push_some(b, s, 40);
            check_counts(b, s);
            /* expire at a random point */
            fake_now += (int64_t)rnd(30) * MS;
            int64_t next;
            struct job *ex = batcher_expire(b, fake_now, &next);
            int64_t want_next = INT64_MAX;
            for (size_t i = 0; i < s->n; i++) {
                struct rec *r = &s->r[i];
                if (!r->queued || !r->deadline) continue;
                int is_out = 0;
                for (const struct job *j = ex; j; j = j->next) is_out |= j->offset == (int64_t)i;
                if (is_out != (r->deadline <= fake_now))
                    fail_msg("job %zu (deadline %lld, now %lld) %s", i, (long long)r->deadline,
                             (long long)fake_now, is_out ? "expired early" : "not expired");
                if (!is_out && r->deadline < want_next) want_next = r->deadline;
            }
            assert_int_equal(next, want_next);
            for (const struct job *j = ex; j; j = j->next) s->r[j->offset].queued = 0;
            free_all(ex);
            check_counts(b, s);
            push_some(b, s, 20); /* onto whatever tails expire left */
            check_counts(b, s);
            /* purge one partition of one topic */
            const char *topic = rnd(2) ? "a" : "b";
            int32_t part = (int32_t)rnd(3);
            struct job *pu = batcher_purge(b, topic, part);
            for (const struct job *j = pu; j; j = j->next) {
                struct rec *r = &s->r[j->offset];
                assert_true(r->queued);
                assert_string_equal(r->topic, topic);
                assert_int_equal(r->partition, part);
                r->queued = 0;
            }
            free_all(pu);
            for (size_t i = 0; i < s->n; i++)
                if (s->r[i].queued && s->r[i].partition == part &&
                    strcmp(s->r[i].topic, topic) == 0)
                    fail_msg("job %zu of %s/%d not purged", i, topic, (int)part);
            check_counts(b, s);
            push_some(b, s, 20); /* onto whatever tails purge left */
            check_counts(b, s);
            /* one batch the usual way (by size: 24 rows), the rest stays */
            if (shadow_totals(s).rows >= c.max_rows) {
                size_t rows;
                enum batcher_reason why;
                struct job *batch = batcher_take(b, fake_now, &rows, &why, NULL);
                assert_non_null(batch);
                check_batch(&c, s, batch, rows, fake_now);
                free_all(batch);
                check_counts(b, s);
            }
        }
        /* everything out, each job once: the counters are back to 0 */
        batcher_close(b);
        take_ready(b, &c, s, 1, NULL, NULL);
        for (size_t i = 0; i < s->n; i++) assert_int_equal(s->r[i].queued, 0);
        struct batcher_stats st;
        batcher_get_stats(b, fake_now, &st);
        assert_int_equal(st.queued_tokens, 0);
        assert_int_equal(st.queued_rows, 0);
        assert_int_equal(st.queued_jobs, 0);
        assert_int_equal(st.oldest_age_us, 0);
        batcher_destroy(b);
        free(s);
    }
}

/* batcher_destroy frees encoder jobs still queued (ASan would see a leak),
 * and queued_tokens counts each job as rows x seq_len. */
static void test_destroy_with_queued(void **state)
{
    (void)state;
    struct bconf c = {.max_rows = 64, .budget = 1 << 20, .group = 1, .max_wait_ms = 60000};
    fake_now = 0;
    struct batcher *b = mk(&c);
    struct shadow *s = shadow_new();
    push(b, s, 3, 7, 5, 0, NULL, 0);
    push(b, s, 2, 100, 1, 0, NULL, 0);
    push(b, s, 1, 16, 9, 0, NULL, 0);
    struct batcher_stats st;
    batcher_get_stats(b, fake_now, &st);
    assert_int_equal(st.queued_tokens, 3 * 7 + 2 * 100 + 16);
    batcher_destroy(b);
    free(s);
}

/* ---- deadlines ------------------------------------------------------------ */

/* An encoder queue's deadline lead is looked up by its tokens: measured,
 * 4 units take 1 ms and 1024 take 300 ms. Four rows of 250 tokens (1000
 * tokens) with a deadline 200 ms away must close now (300 ms needed); had
 * the rows (4) been used, it would wait. */
static void test_deadline_by_tokens(void **state)
{
    (void)state;
    for (int group = 0; group < 2; group++) {
        struct bconf c = {.max_rows = 64, .budget = 4096, .group = group,
                          .max_wait_ms = 60000};
        fake_now = 1000 * MS;
        struct batcher *b = mk(&c);
        struct shadow *s = shadow_new();
        batcher_record(b, 0, 4, 0.001);
        batcher_record(b, 0, 1024, 0.300);
        assert_true(batcher_estimate(b, 0, 1000) == 0.300);
        assert_true(batcher_estimate(b, 0, 4) == 0.001);
        push(b, s, 4, 250, 5, fake_now + 200 * MS, NULL, 0);
        size_t rows;
        enum batcher_reason why;
        int64_t wake;
        struct job *batch = batcher_take(b, fake_now, &rows, &why, &wake);
        assert_non_null(batch);
        assert_int_equal(why, BATCH_DEADLINE);
        check_batch(&c, s, batch, rows, fake_now);
        free_all(batch);
        /* a small encoder job: its own (1 ms) lead, woken exactly then */
        push(b, s, 2, 2, 5, fake_now + 200 * MS, NULL, 0);
        assert_null(batcher_take(b, fake_now, &rows, &why, &wake));
        assert_int_equal(wake, fake_now + 200 * MS - 1 * MS - 1000);
        batch = batcher_take(b, wake, &rows, &why, &wake);
        assert_non_null(batch);
        assert_int_equal(why, BATCH_DEADLINE);
        check_batch(&c, s, batch, rows, fake_now);
        free_all(batch);
        batcher_destroy(b);
        free(s);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_padded_tokens),
        cmocka_unit_test(test_closes_by_tokens_table),
        cmocka_unit_test(test_no_budget_and_layer_jobs),
        cmocka_unit_test(test_bucket_edges),
        cmocka_unit_test(test_group_preference_table),
        cmocka_unit_test(test_random_streams),
        cmocka_unit_test(test_group_keeps_max_wait),
        cmocka_unit_test(test_long_job_not_starved),
        cmocka_unit_test(test_grouping_pads_less),
        cmocka_unit_test(test_purge_expire_tokens),
        cmocka_unit_test(test_destroy_with_queued),
        cmocka_unit_test(test_deadline_by_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

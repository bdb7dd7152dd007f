/* test_cuda_sample.c - the CUDA backend's sampler (backend.h's sample,
 * gpu/cuda_sample.cu) against the host's (gen/sample.h's gen_sample) on
 * fresh random logits and parameters: greedy, temperature, top-k (k
 * from 1 to past the vocabulary), top-p, min-p and their combinations,
 * over vocabularies of 1 to 50000 ids and up to 200 rows a call, in fp32,
 * fp16 and bf16 activations (the logits rounded to the type first, so
 * both samplers see the same values), and in each precision a call of
 * rows whose top-k (above the kernel's 4096 candidates) or top-p alone
 * over flat logits keeps more than the kernel's candidates, so its
 * whole-row path runs too, and a call of the kernel's edges (edge_row).
 * Rows hold plain random logits,
 * logits from a handful of values (many ties, -0 next to +0), NaN and
 * infinities among them, or nothing finite at all; a few rows of each
 * call ask for nothing (their neighbours must still be right).
 *
 * The rule. Each row's draw u comes from a job-like stream (gen_rng):
 * the device gets u, the host's gen_sample draws the same u from a copy
 * of the stream. A greedy row's id must be identical, and a row with no
 * finite logit must answer -1 (NaN log-probability) on both. A sampled
 * row's id must be identical unless the host's own numbers put the row
 * within BORDER (1e-9) of a boundary where a float64 sum taken in
 * another order may fall either way: u within BORDER of a kept token's
 * cumulative share, a prefix of top-k's survivors (most likely first)
 * whose mass is within BORDER of top_p, or a token whose probability over
 * the most likely one's is within BORDER of min_p. Such rows are counted
 * (and printed); they must stay rare (at most 1 in 50). Log-probabilities
 * agree within LPTOL (1e-5) x max(1, |ref|): both are float64 sums
 * rounded to float.
 *
 * On a machine without a usable CUDA device, or a build without CUDA, it
 * prints "skipped: no CUDA device" and exits 77.
 *
 * Single-threaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gen/sample.h"
#include "../gpu/backend.h"
#include "testutil.h"

#define BORDER 1e-9
#define LPTOL 1e-5
#define HOST_BYTES (24u << 20)
/* The kernel's candidates (gpu/cuda_sample.cu's kCand): rows whose top-k
 * or top-p keeps more take its whole-row path, and a call of such rows
 * runs in each precision. */
#define WIDE_K 4096

static const struct backend_ops *const B = &backend_cuda;
static int have_device;

struct env {
    enum model_precision prec;
    void *be, *c;
    unsigned char *host;
    size_t rows_checked, sampled, borderline, failed_rows;
};

static struct env *env_new(enum model_precision p)
{
    struct env *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    struct model_runtime_conf conf;
    memset(&conf, 0, sizeof(conf));
    conf.backend = "cuda";
    conf.precision = p;
    conf.executors_per_device = 1;
    conf.workspace_mb = 32;
    char desc[512], err[512];
    e->prec = p;
    e->be = B->open(&conf, desc, sizeof(desc), err, sizeof(err));
    if (!e->be) fail_msg("open: %s", err);
    e->c = B->ctx_new(e->be, 0, err, sizeof(err));
    if (!e->c) fail_msg("ctx_new: %s", err);
    e->host = B->ctx_alloc(e->c, HOST_BYTES, 1);
    assert_non_null(e->host);
    return e;
}

static void env_free(struct env *e)
{
    printf("  %s: %zu rows (%zu sampled), %zu at a boundary, %zu without a finite logit\n",
           model_precision_name(e->prec), e->rows_checked, e->sampled, e->borderline,
           e->failed_rows);
    B->ctx_free(e->c);
    B->close(e->be);
    free(e);
}

static float q(const struct env *e, float x)
{
    if (!isfinite(x)) return x;
    if (e->prec == MODEL_FP16) return st_f16_to_f32(st_f32_to_f16(x));
    if (e->prec == MODEL_BF16) return st_bf16_to_f32(st_f32_to_bf16(x));
    return x;
}

static size_t rnd(size_t lo, size_t hi)
{
    return lo + (size_t)(tu_rand64() % (hi - lo + 1));
}

enum kind { PLAIN, TIES, HOLES, DOMINANT, NONE_FINITE, N_KINDS };

static void fill_row(const struct env *e, float *x, size_t n, enum kind k, int wide)
{
    static const float vals[] = {-1.0f, -0.0f, 0.0f, 1.0f, 2.0f, 2.0f};
    float spread = wide ? tu_randf(0.1f, 1.0f) : tu_randf(0.5f, 12.0f);
    for (size_t i = 0; i < n; i++) {
        switch (k) {
        case TIES: x[i] = vals[tu_rand64() % 6]; break;
        case NONE_FINITE: {
            uint64_t r = tu_rand64() % 3;
            x[i] = r == 0 ? NAN : r == 1 ? -INFINITY : INFINITY;
            break;
        }
        default: x[i] = q(e, tu_randf(-spread, spread)); break;
        }
        if (k == HOLES && tu_rand64() % 5 == 0) {
            uint64_t r = tu_rand64() % 3;
            x[i] = r == 0 ? NAN : r == 1 ? -INFINITY : INFINITY;
        }
    }
    if (k == DOMINANT) x[rnd(0, n - 1)] = q(e, 40.0f);
}

static void random_params(struct gen_sampling *sp, size_t n, int wide)
{
    gen_sampling_defaults(sp);
    if (wide) {
        /* past the kernel's candidates: a top-k above WIDE_K, or top-p
         * alone over flat logits (its nucleus thousands of tokens) */
        sp->temperature = tu_randf(0.5f, 2.0f);
        if (tu_rand64() % 2)
            sp->top_k = (uint32_t)rnd(WIDE_K + 1, n);
        else
            sp->top_p = tu_randf(0.7f, 0.999f);
        if (tu_rand64() % 3 == 0) sp->min_p = tu_randf(0.0f, 0.6f);
        return;
    }
    if (tu_rand64() % 4 == 0) return; /* greedy */
    sp->temperature = tu_randf(0.2f, 2.0f);
    if (tu_rand64() % 2) sp->top_k = (uint32_t)rnd(1, n + 5);
    if (tu_rand64() % 2) sp->top_p = tu_randf(0.05f, 1.0f);
    if (tu_rand64() % 3 == 0) sp->min_p = tu_randf(0.0f, 0.6f);
}

/* The kernel's edges, one per `which`: top-k at the candidates' count
 * and one past it; an all-equal row whose top-p keeps fewer or more
 * tokens than the candidates hold; few distinct values with top-p near 1 (the cut
 * among ties at the last candidate's key); a row masked with -inf whose
 * top-k lies between its finite count and its width (top-k off). */
static void edge_row(const struct env *e, float *x, size_t n, struct gen_sampling *sp,
                     unsigned which)
{
    gen_sampling_defaults(sp);
    sp->temperature = tu_randf(0.5f, 2.0f);
    if (which == 2) {
        for (size_t i = 0; i < n; i++) x[i] = q(e, 0.25f);
        sp->top_p = tu_rand64() % 2 ? 0.5f : 0.99f; /* within the candidates, or past them */
        return;
    }
    fill_row(e, x, n, which == 3 ? TIES : PLAIN, which == 3);
    if (which == 0) sp->top_k = WIDE_K;
    if (which == 1) sp->top_k = WIDE_K + 1;
    if (which == 3) sp->top_p = tu_randf(0.95f, 0.999f);
    if (which == 4) {
        size_t finite = n / 3;
        for (size_t i = finite; i < n; i++) x[rnd(0, n - 1)] = -INFINITY;
        sp->top_k = (uint32_t)(n - 1);
        sp->top_p = tu_randf(0.5f, 0.99f);
    }
}

/* 1 when the host's numbers put the row within BORDER of a boundary a
 * sum in another order may cross (the rule above). */
static int borderline(const float *x, size_t n, const struct gen_sampling *sp, double u,
                      struct gen_scratch *s)
{
    size_t m = gen_filter(x, n, sp, s);
    const uint32_t *ids = gen_scratch_ids(s);
    double acc = 0.0;
    for (size_t i = 0; i < m; i++) {
        acc += gen_scratch_prob(s, ids[i]);
        if (fabs(u - acc) < BORDER) return 1;
    }
    /* top-k's survivors and their probabilities (most likely first) */
    struct gen_sampling k_only = *sp;
    k_only.top_p = 1.0f;
    k_only.min_p = 0.0f;
    m = gen_filter(x, n, &k_only, s);
    double *p = malloc((m ? m : 1) * sizeof(double)), most = 0.0;
    assert_non_null(p);
    for (size_t i = 0; i < m; i++) {
        p[i] = gen_scratch_prob(s, ids[i]);
        if (p[i] > most) most = p[i];
    }
    int near = 0;
    for (size_t i = 0; i < m && !near; i++)
        if (sp->min_p > 0.0f && fabs(p[i] / most - (double)sp->min_p) < BORDER) near = 1;
    /* sorted, most likely first (insertion sort: m is small enough here
     * or the row is rare) */
    for (size_t i = 1; i < m; i++) {
        double v = p[i];
        size_t j = i;
        while (j > 0 && p[j - 1] < v) {
            p[j] = p[j - 1];
            j--;
        }
        p[j] = v;
    }
    acc = 0.0;
    for (size_t i = 0; i < m && !near && sp->top_p < 1.0f; i++) {
        acc += p[i];
        if (fabs(acc - (double)sp->top_p) < BORDER) near = 1;
    }
    free(p);
    return near;
}

/* One call of rows rows of n logits (ld apart), against gen_sample:
 * wide 0 the usual mix, 1 rows past the kernel's candidates, 2 its edges. */
static void one_call(struct env *e, size_t n, size_t rows, int pad, int wide)
{
    size_t ld = n + (pad ? rnd(0, 9) : 0);
    float *x = calloc(rows * ld, sizeof(float));
    struct gen_sampling *sp = calloc(rows, sizeof(*sp));
    enum kind *kinds = calloc(rows, sizeof(*kinds));
    assert_true(x && sp && kinds);
    size_t lbytes = (rows * ld * sizeof(float) + 255) / 256 * 256;
    size_t pbytes = (rows * sizeof(struct bk_sample_row) + 255) / 256 * 256;
    assert_true(lbytes + pbytes + rows * sizeof(struct bk_sample_out) <= HOST_BYTES);
    float *hx = (float *)e->host;
    struct bk_sample_row *par = (struct bk_sample_row *)(e->host + lbytes);
    struct bk_sample_out *out = (struct bk_sample_out *)(e->host + lbytes + pbytes);
    struct gen_rng *rng = calloc(rows, sizeof(*rng));
    assert_non_null(rng);
    for (size_t r = 0; r < rows; r++) {
        kinds[r] = tu_rand64() % 40 == 0 ? NONE_FINITE : (enum kind)(tu_rand64() % NONE_FINITE);
        if (wide == 2) {
            kinds[r] = PLAIN;
            edge_row(e, x + r * ld, n, &sp[r], (unsigned)(r % 5));
        } else {
            fill_row(e, x + r * ld, n, kinds[r], wide);
            random_params(&sp[r], n, wide);
        }
        gen_rng_seed(&rng[r], tu_rand64());
        struct gen_rng copy = rng[r];
        par[r] = (struct bk_sample_row){
            .temperature = sp[r].temperature, .top_k = sp[r].top_k, .top_p = sp[r].top_p,
            .min_p = sp[r].min_p, .u = gen_rng_uniform(&copy),
            .flags = BK_SAMPLE_ON | (tu_rand64() % 2 ? BK_SAMPLE_LOGPROB : 0)};
        if (tu_rand64() % 16 == 0) par[r].flags = 0; /* a row that picks nothing */
        out[r] = (struct bk_sample_out){-7, -7.0f};
    }
    memcpy(hx, x, rows * ld * sizeof(float));
    void *dx = B->ctx_alloc(e->c, rows * ld * 4, 0);
    void *scratch = B->ctx_alloc(e->c, B->sample_scratch(e->be, rows), 0);
    assert_true(dx && scratch);
    assert_int_equal(B->pass_begin(e->c), 0);
    assert_int_equal(B->load_f32(e->c, dx, hx, rows * ld), 0);
    struct bk_sample a = {.logits = dx, .rows = rows, .vocab = n, .ld = ld, .params = par,
                          .out = out, .scratch = scratch};
    int rc = B->sample(e->c, &a);
    if (rc != 0) fail_msg("sample: %d: %s", rc, B->ctx_error(e->c));
    rc = B->pass_end(e->c);
    if (rc != 0) fail_msg("pass_end: %d: %s", rc, B->ctx_error(e->c));

    struct gen_scratch *s = gen_scratch_new(n);
    assert_non_null(s);
    for (size_t r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        float lp = NAN;
        struct gen_rng *g = sp[r].temperature > 0 ? &rng[r] : NULL;
        int32_t want = gen_sample(row, n, &sp[r], g, s, &lp);
        const struct bk_sample_out *got = &out[r];
        if (!(par[r].flags & BK_SAMPLE_ON)) continue; /* its result is not defined */
        e->rows_checked++;
        if (want < 0) {
            e->failed_rows++;
            if (got->id != -1 || !isnan(got->logprob))
                fail_msg("row %zu of %zu (n %zu): no finite logit, got id %d logprob %g", r,
                         rows, n, got->id, (double)got->logprob);
            continue;
        }
        if (sp[r].temperature > 0) e->sampled++;
        if (got->id != want) {
            if (sp[r].temperature == 0 ||
                !borderline(row, n, &sp[r], par[r].u, s))
                fail_msg("row %zu of %zu (n %zu, kind %d, %s): T %g k %u p %g min_p %g u %.17g: "
                         "device %d, host %d", r, rows, n, (int)kinds[r],
                         model_precision_name(e->prec), (double)sp[r].temperature,
                         sp[r].top_k, (double)sp[r].top_p, (double)sp[r].min_p, par[r].u,
                         got->id, want);
            e->borderline++;
            printf("  row at a boundary (n %zu, u %.17g): device %d, host %d\n", n, par[r].u,
                   got->id, want);
            continue;
        }
        if (par[r].flags & BK_SAMPLE_LOGPROB) {
            double d = fabs((double)got->logprob - (double)lp);
            if (!(d <= LPTOL * fmax(1.0, fabs((double)lp))))
                fail_msg("row %zu (n %zu): logprob %.9g, host %.9g", r, n,
                         (double)got->logprob, (double)lp);
        }
    }
    gen_scratch_destroy(s);
    free(x), free(sp), free(kinds), free(rng);
}

static void test_sample(void **state)
{
    (void)state;
    if (!have_device) skip();
    static const enum model_precision precs[] = {MODEL_FP32, MODEL_FP16, MODEL_BF16};
    for (size_t pi = 0; pi < 3; pi++) {
        struct env *e = env_new(precs[pi]);
        static const size_t sizes[] = {1, 2, 3, 7, 31, 100, 257, 1000, 4099};
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
            one_call(e, sizes[i], sizes[i] < 300 ? 200 : 24, (int)(i % 2), 0);
        for (int k = 0; k < 4; k++) one_call(e, rnd(1, 2000), rnd(1, 40), k % 2, 0);
        one_call(e, rnd(WIDE_K + 2, 3 * WIDE_K), 16, (int)pi % 2, 1);
        one_call(e, rnd(WIDE_K + 2, WIDE_K + 300), 20, (int)pi % 2, 2);
        if (pi == 0) one_call(e, 50000, 6, 1, 0);
        /* boundaries must stay rare (BORDER is tight) */
        assert_true(e->borderline * 50 <= e->sampled + 50);
        assert_true(e->sampled > 0 && e->failed_rows > 0);
        env_free(e);
    }
}

/* Refusals: a missing buffer or a row count of 0 is MODEL_EINVAL and
 * fails only its pass. */
static void test_refusals(void **state)
{
    (void)state;
    if (!have_device) skip();
    struct env *e = env_new(MODEL_FP32);
    void *dx = B->ctx_alloc(e->c, 64 * 4, 0), *scr = B->ctx_alloc(e->c, B->sample_scratch(e->be, 2), 0);
    struct bk_sample_row *par = (struct bk_sample_row *)e->host;
    struct bk_sample_out *out = (struct bk_sample_out *)(e->host + 256);
    struct bk_sample a = {.logits = dx, .rows = 0, .vocab = 64, .ld = 64, .params = par,
                          .out = out, .scratch = scr};
    assert_int_equal(B->pass_begin(e->c), 0);
    assert_int_equal(B->sample(e->c, &a), MODEL_EINVAL);
    assert_int_equal(B->pass_end(e->c), MODEL_EINVAL);
    a.rows = 2;
    a.ld = 10;
    assert_int_equal(B->pass_begin(e->c), 0);
    assert_int_equal(B->sample(e->c, &a), MODEL_EINVAL);
    assert_int_equal(B->pass_end(e->c), MODEL_EINVAL);
    /* and the context goes on */
    memset(par, 0, 2 * sizeof(*par));
    par[0].flags = par[1].flags = BK_SAMPLE_ON;
    a.ld = 32;
    a.vocab = 32;
    float *hx = (float *)(e->host + 512);
    for (int i = 0; i < 64; i++) hx[i] = (float)(i % 32 == 5 || i % 32 == 9 ? 3 : 0);
    assert_int_equal(B->pass_begin(e->c), 0);
    assert_int_equal(B->load_f32(e->c, dx, hx, 64), 0);
    assert_int_equal(B->sample(e->c, &a), 0);
    assert_int_equal(B->pass_end(e->c), 0);
    assert_int_equal(out[0].id, 5); /* greedy: the lowest id among equals */
    assert_int_equal(out[1].id, 5);
    env_free(e);
}

int main(int argc, char **argv)
{
    (void)argc;
    char what[256];
    if (!B->compiled_in || B->probe(what, sizeof(what)) <= 0)
        return tu_no_gpu("test_cuda_sample", B->compiled_in ? what : "not built with CUDA");
    have_device = 1;
    fprintf(stderr, "test_cuda_sample: %s\n", what);
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

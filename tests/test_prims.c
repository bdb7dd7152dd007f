/* test_prims.c - every primitive of the backend seam (gpu/backend.h), on
 * its own, against a float64 reference written here, on fresh random
 * shapes and values each run (the seed is printed; KINFER_TEST_SEED
 * replays it), with the edges always included: one row, width one, a
 * sequence of one token, the longest sequence.
 *
 * Proves, for the CPU backend (tests/test_cuda_prims.c holds the same
 * checks, primitive for primitive, for the CUDA backend in every
 * precision, with its graphs and refusals):
 * - gemm: weights (nn.Linear layout) with and without bias and with each
 *   epilogue activation; activations with B transposed or not, padded
 *   leading dimensions, strided batches, alpha;
 * - layernorm and rmsnorm: in place and out of place, with and without
 *   the residual (which the input keeps), without gamma/beta;
 * - embed: word + position (with a base) + type, with and without
 *   LayerNorm, without the position or type table;
 * - attention over packed sequences of different lengths: multi-head and
 *   grouped-query, bidirectional and causal, with a relative-position
 *   bias table, strided q/k/v columns and output;
 * - rope, every activation, softmax, l2norm (a zero row too), and pooling
 *   by first, mean, max and last token.
 * Each case prints its worst error over its tolerance. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/backend.h"
#include "../gpu/cpu_mm.h"
#include "testutil.h"

/* A backend under test, with the tolerance of its precision (relative to
 * the output's largest magnitude, at least 1). */
struct dev {
    const struct backend_ops *o;
    void *be;
    const char *label;
    double tol;
    void *c;          /* the current case's context */
    double worst;     /* worst err/tol of the current case */
};

static int irand(int lo, int hi)
{
    return lo + (int)(tu_rand64() % (uint64_t)(hi - lo + 1));
}

static float *rnd(size_t n, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = tu_randf(lo, hi);
    return p;
}

static void case_begin(struct dev *d)
{
    char err[256];
    d->c = d->o->ctx_new(d->be, 0, err, sizeof(err));
    if (!d->c) fail_msg("%s: ctx_new: %s", d->label, err);
    d->worst = 0;
}

/* Device activations holding h (n floats). */
static void *dev_act(struct dev *d, const float *h, size_t n)
{
    void *p = d->o->ctx_alloc(d->c, (n ? n : 1) * d->o->act_size(d->be), 0);
    assert_non_null(p);
    if (h) {
        assert_int_equal(d->o->pass_begin(d->c), 0);
        assert_int_equal(d->o->load_f32(d->c, p, h, n), 0);
        assert_int_equal(d->o->pass_end(d->c), 0);
    }
    return p;
}

/* Device memory holding n uint32 values. */
static void *dev_u32(struct dev *d, const uint32_t *h, size_t n)
{
    void *p = d->o->ctx_alloc(d->c, (n ? n : 1) * sizeof(uint32_t), 0);
    assert_non_null(p);
    assert_int_equal(d->o->pass_begin(d->c), 0);
    assert_int_equal(d->o->upload(d->c, p, h, n * sizeof(uint32_t)), 0);
    assert_int_equal(d->o->pass_end(d->c), 0);
    return p;
}

static struct bk_weight *dev_w(struct dev *d, enum bk_wtype t, const float *h, size_t n)
{
    char err[256];
    struct bk_wsrc s = {.f = h, .n = n};
    struct bk_weight *w = d->o->weight_new(d->be, 0, t, &s, 1, err, sizeof(err));
    if (!w) fail_msg("%s: weight_new: %s", d->label, err);
    return w;
}

/* Runs rc (a primitive's return) to completion and fetches n floats. */
static float *fetch(struct dev *d, const void *p, size_t n)
{
    float *h = d->o->ctx_alloc(d->c, (n ? n : 1) * sizeof(float), 1);
    assert_non_null(h);
    assert_int_equal(d->o->pass_begin(d->c), 0);
    assert_int_equal(d->o->store_f32(d->c, h, p, n), 0);
    assert_int_equal(d->o->pass_end(d->c), 0);
    return h;
}

/* Compares n values with the reference; fails the test past tol. */
static void check(struct dev *d, const char *what, const float *got, const double *ref, size_t n)
{
    double scale = 1.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (d->tol * scale);
        if (!(e <= worst)) { /* NaN counts as worst */
            worst = isnan(e) ? INFINITY : e;
            at = i;
        }
    }
    if (worst > d->worst) d->worst = worst;
    if (worst > 1.0)
        fail_msg("%s: %s: element %zu is %.9g, reference %.9g (err/tol %.3f)", d->label, what,
                 at, (double)got[at], ref[at], worst);
}

static void case_end(struct dev *d, const char *what)
{
    printf("  %-6s %-58s worst err/tol %.3f\n", d->label, what, d->worst);
    d->o->ctx_free(d->c);
    d->c = NULL;
}

/* ---- float64 references ------------------------------------------------- */

static double ref_act(double x, enum bk_act a)
{
    switch (a) {
    case BK_ACT_RELU: return x < 0 ? 0 : x;
    case BK_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case BK_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case BK_ACT_TANH: return tanh(x);
    case BK_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case BK_ACT_SILU: return x / (1.0 + exp(-x));
    default: return x;
    }
}

static void ref_layernorm(const double *x, const float *g, const float *b, double eps, size_t w,
                          double *y)
{
    double mean = 0, var = 0;
    for (size_t i = 0; i < w; i++) mean += x[i];
    mean /= (double)w;
    for (size_t i = 0; i < w; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (double)w;
    for (size_t i = 0; i < w; i++)
        y[i] = (x[i] - mean) / sqrt(var + eps) * (g ? g[i] : 1.0) + (b ? b[i] : 0.0);
}

/* ---- the cases ----------------------------------------------------------- */

static const char *const act_names[BK_N_ACTS] = {"none", "relu",    "gelu",   "gelu_tanh",
                                                 "tanh", "sigmoid", "silu"};

static void gemm_weight_case(struct dev *d, size_t m, size_t n, size_t k, int bias,
                             enum bk_act act)
{
    case_begin(d);
    float *x = rnd(m * k, -1, 1), *w = rnd(n * k, -1, 1), *b = rnd(n, -1, 1);
    void *dx = dev_act(d, x, m * k), *dy = dev_act(d, NULL, m * n);
    struct bk_weight *dw = dev_w(d, BK_W_ACT, w, n * k), *db = bias ? dev_w(d, BK_W_ACT, b, n) : NULL;
    struct bk_gemm g = {.m = m, .n = n, .k = k, .a = dx, .w = dw, .bias = db, .act = act, .c = dy};
    assert_int_equal(d->o->pass_begin(d->c), 0);
    assert_int_equal(d->o->gemm(d->c, &g), 0);
    assert_int_equal(d->o->pass_end(d->c), 0);
    float *got = fetch(d, dy, m * n);
    double *ref = malloc(m * n * sizeof(double));
    for (size_t r = 0; r < m; r++)
        for (size_t c = 0; c < n; c++) {
            double s = bias ? b[c] : 0;
            for (size_t i = 0; i < k; i++) s += (double)x[r * k + i] * w[c * k + i];
            ref[r * n + c] = ref_act(s, act);
        }
    char what[128];
    snprintf(what, sizeof(what), "gemm weight %zux%zux%zu bias %d act %s", m, n, k, bias,
             act_names[act]);
    check(d, what, got, ref, m * n);
    d->o->weight_free(d->be, dw);
    if (db) d->o->weight_free(d->be, db);
    free(x), free(w), free(b), free(ref);
    case_end(d, what);
}

static void test_gemm_weights(struct dev *d)
{
    gemm_weight_case(d, 1, 1, 1, 1, BK_ACT_NONE);
    gemm_weight_case(d, 1, 37, 5, 0, BK_ACT_NONE);
    for (int a = 0; a < BK_N_ACTS; a++)
        gemm_weight_case(d, (size_t)irand(1, 40), (size_t)irand(1, 70), (size_t)irand(1, 90),
                         irand(0, 1), (enum bk_act)a);
}

/* C[i] = alpha A[i] B[i]' over a strided batch with padded rows. */
static void gemm_act_case(struct dev *d, size_t m, size_t n, size_t k, int trans_b, size_t batch)
{
    case_begin(d);
    size_t lda = k + (size_t)irand(0, 3), ldb = (trans_b ? k : n) + (size_t)irand(0, 3),
           ldc = n + (size_t)irand(0, 3);
    size_t brow = trans_b ? n : k;
    size_t sa = m * lda + (size_t)irand(0, 5), sb = brow * ldb + (size_t)irand(0, 5),
           sc = m * ldc + (size_t)irand(0, 5);
    float alpha = tu_randf(0.1f, 2.0f);
    float *a = rnd(sa * batch, -1, 1), *b = rnd(sb * batch, -1, 1), *c0 = rnd(sc * batch, -1, 1);
    void *da = dev_act(d, a, sa * batch), *db = dev_act(d, b, sb * batch),
         *dc = dev_act(d, c0, sc * batch);
    struct bk_gemm g = {.m = m, .n = n, .k = k, .batch = batch, .alpha = alpha, .a = da,
                        .lda = lda, .stride_a = sa, .b = db, .trans_b = trans_b, .ldb = ldb,
                        .stride_b = sb, .c = dc, .ldc = ldc, .stride_c = sc};
    assert_int_equal(d->o->pass_begin(d->c), 0);
    assert_int_equal(d->o->gemm(d->c, &g), 0);
    assert_int_equal(d->o->pass_end(d->c), 0);
    float *got = fetch(d, dc, sc * batch);
    size_t nn = 0;
    float *gg = malloc(m * n * batch * sizeof(float));
    double *ref = malloc(m * n * batch * sizeof(double));
    for (size_t i = 0; i < batch; i++)
        for (size_t r = 0; r < m; r++)
            for (size_t col = 0; col < n; col++) {
                double s = 0;
                for (size_t t = 0; t < k; t++) {
                    double bv = trans_b ? b[i * sb + col * ldb + t] : b[i * sb + t * ldb + col];
                    s += (double)a[i * sa + r * lda + t] * bv;
                }
                ref[nn] = alpha * s;
                gg[nn++] = got[i * sc + r * ldc + col];
            }
    char what[128];
    snprintf(what, sizeof(what), "gemm act %zux%zux%zu trans_b %d batch %zu", m, n, k, trans_b,
             batch);
    check(d, what, gg, ref, nn);
    free(a), free(b), free(c0), free(gg), free(ref);
    case_end(d, what);
}

static void test_gemm_acts(struct dev *d)
{
    gemm_act_case(d, 1, 1, 1, 1, 1);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 2; i++)
            gemm_act_case(d, (size_t)irand(1, 30), (size_t)irand(1, 30), (size_t)irand(1, 40), t,
                          (size_t)irand(1, 4));
}

static void norm_case(struct dev *d, int rms, size_t rows, size_t w, int with_res, int affine,
                      int in_place)
{
    case_begin(d);
    float *x = rnd(rows * w, -3, 3), *res = rnd(rows * w, -1, 1);
    float *g = rnd(w, 0.5f, 1.5f), *b = rnd(w, -0.5f, 0.5f);
    double eps = rms ? 1e-6 : 1e-5;
    void *dx = dev_act(d, x, rows * w), *dr = with_res ? dev_act(d, res, rows * w) : NULL;
    void *dy = in_place ? dx : dev_act(d, NULL, rows * w);
    struct bk_weight *dg = affine ? dev_w(d, BK_W_F32, g, w) : NULL;
    struct bk_weight *dbb = affine && !rms ? dev_w(d, BK_W_F32, b, w) : NULL;
    assert_int_equal(d->o->pass_begin(d->c), 0);
    if (rms) assert_int_equal(d->o->rmsnorm(d->c, dy, dx, dr, dg, (float)eps, rows, w), 0);
    else assert_int_equal(d->o->layernorm(d->c, dy, dx, dr, dg, dbb, (float)eps, rows, w), 0);
    assert_int_equal(d->o->pass_end(d->c), 0);
    float *got = fetch(d, dy, rows * w);
    double *sum = malloc(rows * w * sizeof(double)), *ref = malloc(rows * w * sizeof(double));
    for (size_t i = 0; i < rows * w; i++) sum[i] = (double)x[i] + (with_res ? res[i] : 0.0);
    for (size_t r = 0; r < rows; r++) {
        const double *sx = sum + r * w;
        double *y = ref + r * w;
        if (rms) {
            double ss = 0;
            for (size_t i = 0; i < w; i++) ss += sx[i] * sx[i];
            for (size_t i = 0; i < w; i++) y[i] = sx[i] / sqrt(ss / (double)w + eps) * (affine ? g[i] : 1.0);
        } else {
            ref_layernorm(sx, affine ? g : NULL, affine ? b : NULL, eps, w, y);
        }
    }
    char what[128];
    snprintf(what, sizeof(what), "%s %zux%zu res %d affine %d in place %d",
             rms ? "rmsnorm" : "layernorm", rows, w, with_res, affine, in_place);
    check(d, what, got, ref, rows * w);
    if (with_res && !in_place) {
        /* The input keeps the residual sum. */
        float *kept = fetch(d, dx, rows * w);
        check(d, "the input keeps x + res", kept, sum, rows * w);
    }
    if (dg) d->o->weight_free(d->be, dg);
    if (dbb) d->o->weight_free(d->be, dbb);
    free(x), free(res), free(g), free(b), free(sum), free(ref);
    case_end(d, what);
}

static void test_norms(struct dev *d)
{
    for (int rms = 0; rms < 2; rms++) {
        norm_case(d, rms, 1, 1, 0, 1, 1);
        norm_case(d, rms, 3, 1, 1, 1, 0);
        norm_case(d, rms, 1, 300, 1, 0, 0);
        norm_case(d, rms, (size_t)irand(1, 9), (size_t)irand(2, 200), 1, 1, 0);
        norm_case(d, rms, (size_t)irand(1, 9), (size_t)irand(2, 200), 0, 1, 1);
        if (d->o == &backend_cpu) { /* enough rows for the CPU's pool, on two threads */
            cpu_mm_threads(2);
            norm_case(d, rms, (size_t)irand(30, 60), (size_t)irand(300, 700), 1, 1, 0);
            norm_case(d, rms, (size_t)irand(30, 60), (size_t)irand(300, 700), 0, 1, 1);
            cpu_mm_threads(1);
        }
    }
}

/* n random sequence lengths (the first longest, one of length one when n
 * > 1) into host offsets/seq/pos; returns the tokens. */
static size_t make_seqs(size_t n, size_t maxlen, uint32_t *off, uint32_t **seq, uint32_t **pos,
                        size_t *longest)
{
    off[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = i == 0 ? maxlen : i == 1 ? 1 : (size_t)irand(1, (int)maxlen);
        off[i + 1] = off[i] + (uint32_t)len;
    }
    size_t T = off[n];
    *seq = malloc(T * sizeof(uint32_t));
    *pos = malloc(T * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = off[i]; t < off[i + 1]; t++) {
            (*seq)[t] = (uint32_t)i;
            (*pos)[t] = t - off[i];
        }
    *longest = maxlen;
    return T;
}

static void embed_case(struct dev *d, size_t n, size_t maxlen, size_t w, int with_pos,
                       int with_type, int ln)
{
    case_begin(d);
    size_t V = 50, P = maxlen + 5, TV = 3, base = with_pos ? (size_t)irand(0, 4) : 0, longest;
    uint32_t off[17], *seq, *pos;
    size_t T = make_seqs(n, maxlen, off, &seq, &pos, &longest);
    uint32_t *ids = malloc(T * 4), *types = malloc(T * 4);
    for (size_t t = 0; t < T; t++) {
        ids[t] = (uint32_t)irand(0, (int)V - 1);
        types[t] = (uint32_t)irand(0, (int)TV - 1);
    }
    float *word = rnd(V * w, -1, 1), *pt = rnd(P * w, -1, 1), *tt = rnd(TV * w, -1, 1);
    float *g = rnd(w, 0.5f, 1.5f), *b = rnd(w, -0.5f, 0.5f);
    struct bk_weight *dw = dev_w(d, BK_W_ACT, word, V * w), *dp = dev_w(d, BK_W_ACT, pt, P * w),
                     *dt = dev_w(d, BK_W_ACT, tt, TV * w), *dg = dev_w(d, BK_W_F32, g, w),
                     *db = dev_w(d, BK_W_F32, b, w);
    struct bk_seqs s = {.n = n, .tokens = T, .longest = longest,
                        .offsets = dev_u32(d, off, n + 1), .seq = dev_u32(d, seq, T),
                        .pos = dev_u32(d, pos, T), .ids = dev_u32(d, ids, T),
                        .types = dev_u32(d, types, T)};
    void *dx = dev_act(d, NULL, T * w);
    assert_int_equal(d->o->pass_begin(d->c), 0);
    assert_int_equal(d->o->embed(d->c, dx, &s, dw, with_pos ? dp : NULL, base,
                                 with_type ? dt : NULL, ln, dg, db, 1e-12f, w), 0);
    assert_int_equal(d->o->pass_end(d->c), 0);
    float *got = fetch(d, dx, T * w);
    double *ref = malloc(T * w * sizeof(double)), *row = malloc(w * sizeof(double));
    for (size_t t = 0; t < T; t++) {
        for (size_t k = 0; k < w; k++)
            row[k] = (double)word[ids[t] * w + k] + (with_pos ? pt[(base + pos[t]) * w + k] : 0) +
                     (with_type ? tt[types[t] * w + k] : 0);
        if (ln) ref_layernorm(row, g, b, 1e-12, w, ref + t * w);
        else memcpy(ref + t * w, row, w * sizeof(double));
    }
    char what[128];
    snprintf(what, sizeof(what), "embed %zu seqs %zu tokens w %zu pos %d type %d ln %d", n, T, w,
             with_pos, with_type, ln);
    check(d, what, got, ref, T * w);
    struct bk_weight *all[] = {dw, dp, dt, dg, db};
    for (size_t i = 0; i < 5; i++) d->o->weight_free(d->be, all[i]);
    free(seq), free(pos), free(ids), free(types), free(word), free(pt), free(tt), free(g),
        free(b), free(ref), free(row);
    case_end(d, what);
}

static void test_embed(struct dev *d)
{
    embed_case(d, 1, 1, 1, 1, 1, 1);
    embed_case(d, 3, 7, 16, 1, 1, 1);
    embed_case(d, (size_t)irand(1, 16), (size_t)irand(1, 20), (size_t)irand(2, 64), 1, 0, 0);
    embed_case(d, (size_t)irand(1, 16), (size_t)irand(1, 20), (size_t)irand(2, 64), 0, 1, 1);
}

static void attention_case(struct dev *d, size_t n, size_t maxlen, size_t heads,
                           size_t kv_heads, size_t dh, int causal, int bias)
{
    case_begin(d);
    size_t longest;
    uint32_t off[17], *seq, *pos;
    size_t T = make_seqs(n, maxlen, off, &seq, &pos, &longest);
    /* Rows hold q (heads x dh), then k and v (kv_heads x dh each), then
     * some unused columns; out has a padded row too. */
    size_t qw = heads * dh, kw = kv_heads * dh, pad = (size_t)irand(0, 5);
    size_t ld = qw + 2 * kw + pad, ldo = qw + (size_t)irand(0, 5);
    size_t span = (size_t)irand(1, (int)maxlen + 2), bw = 2 * span - 1;
    float *qkv = rnd(T * ld, -1, 1), *rb = rnd(heads * bw, -2, 2);
    float scale = 1.0f / sqrtf((float)dh);
    struct bk_seqs s = {.n = n, .tokens = T, .longest = longest,
                        .offsets = dev_u32(d, off, n + 1), .seq = dev_u32(d, seq, T),
                        .pos = dev_u32(d, pos, T)};
    void *dq = dev_act(d, qkv, T * ld), *dout = dev_act(d, NULL, T * ldo);
    struct bk_weight *drb = bias ? dev_w(d, BK_W_F32, rb, heads * bw) : NULL;
    size_t sbytes = d->o->attention_scratch(d->be, n, T, maxlen, heads, dh);
    void *scratch = d->o->ctx_alloc(d->c, sbytes ? sbytes : 1, 0);
    assert_non_null(scratch);
    struct bk_attention a = {.qkv = dq, .ld = ld, .q_col = 0, .k_col = qw, .v_col = qw + kw,
                             .heads = heads, .kv_heads = kv_heads, .dh = dh, .scale = scale,
                             .causal = causal, .rel_bias = drb, .rel_span = bias ? span : 0,
                             .s = &s, .out = dout, .ldo = ldo, .scratch = scratch};
    assert_int_equal(d->o->pass_begin(d->c), 0);
    assert_int_equal(d->o->attention(d->c, &a), 0);
    assert_int_equal(d->o->pass_end(d->c), 0);
    float *got = fetch(d, dout, T * ldo);
    float *gg = malloc(T * qw * sizeof(float));
    double *ref = malloc(T * qw * sizeof(double)), *p = malloc(maxlen * sizeof(double));
    size_t group = heads / kv_heads;
    for (size_t i = 0; i < n; i++) {
        size_t o = off[i], L = off[i + 1] - o;
        for (size_t h = 0; h < heads; h++)
            for (size_t r = 0; r < L; r++) {
                const float *q = qkv + (o + r) * ld + h * dh;
                double mx = -INFINITY, sum = 0;
                size_t last = causal ? r + 1 : L;
                for (size_t c = 0; c < last; c++) {
                    const float *k = qkv + (o + c) * ld + qw + (h / group) * dh;
                    double sc = 0;
                    for (size_t e = 0; e < dh; e++) sc += (double)q[e] * k[e];
                    sc *= scale;
                    if (bias) {
                        long dist = (long)c - (long)r;
                        if (dist > (long)span - 1) dist = (long)span - 1;
                        if (dist < 1 - (long)span) dist = 1 - (long)span;
                        sc += rb[h * bw + (size_t)(dist + (long)span - 1)];
                    }
                    p[c] = sc;
                    if (sc > mx) mx = sc;
                }
                for (size_t c = 0; c < last; c++) sum += (p[c] = exp(p[c] - mx));
                for (size_t e = 0; e < dh; e++) {
                    double v = 0;
                    for (size_t c = 0; c < last; c++)
                        v += p[c] / sum * qkv[(o + c) * ld + qw + kw + (h / group) * dh + e];
                    ref[(o + r) * qw + h * dh + e] = v;
                    gg[(o + r) * qw + h * dh + e] = got[(o + r) * ldo + h * dh + e];
                }
            }
    }
    char what[128];
    snprintf(what, sizeof(what), "attention %zu seqs %zu tok heads %zu/%zu dh %zu causal %d bias %d",
             n, T, heads, kv_heads, dh, causal, bias);
    check(d, what, gg, ref, T * qw);
    if (drb) d->o->weight_free(d->be, drb);
    free(seq), free(pos), free(qkv), free(rb), free(gg), free(ref), free(p);
    case_end(d, what);
}

static void test_attention(struct dev *d)
{
    attention_case(d, 1, 1, 1, 1, 1, 0, 0);
    attention_case(d, 1, 1, 2, 1, 8, 1, 1);
    attention_case(d, 4, 33, 4, 4, 8, 0, 0);
    attention_case(d, 4, 17, 8, 2, 8, 1, 0);
    attention_case(d, 3, 12, 4, 1, 16, 0, 1);
    attention_case(d, (size_t)irand(1, 16), (size_t)irand(1, 40), 6, 3, (size_t)irand(1, 4) * 4,
                   irand(0, 1), irand(0, 1));
}

static void test_rope(struct dev *d)
{
    size_t shapes[][3] = {{1, 1, 2}, {5, 3, 8}, {(size_t)irand(1, 30), (size_t)irand(1, 4), 2 * (size_t)irand(1, 16)}};
    for (size_t si = 0; si < 3; si++) {
        case_begin(d);
        size_t rows = shapes[si][0], heads = shapes[si][1], dh = shapes[si][2];
        size_t col = (size_t)irand(0, 3), ld = col + heads * dh + (size_t)irand(0, 3);
        float *x = rnd(rows * ld, -1, 1), *inv = malloc(dh / 2 * sizeof(float));
        for (size_t i = 0; i < dh / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * (double)i / (double)dh);
        uint32_t *pos = malloc(rows * 4);
        for (size_t r = 0; r < rows; r++) pos[r] = (uint32_t)irand(0, 4000);
        void *dx = dev_act(d, x, rows * ld);
        const uint32_t *dpos = dev_u32(d, pos, rows);
        struct bk_weight *dinv = dev_w(d, BK_W_F32, inv, dh / 2);
        assert_int_equal(d->o->pass_begin(d->c), 0);
        assert_int_equal(d->o->rope(d->c, dx, rows, ld, col, heads, dh, dpos, dinv), 0);
        assert_int_equal(d->o->pass_end(d->c), 0);
        float *got = fetch(d, dx, rows * ld);
        double *ref = malloc(rows * ld * sizeof(double));
        for (size_t i = 0; i < rows * ld; i++) ref[i] = x[i];
        for (size_t r = 0; r < rows; r++)
            for (size_t h = 0; h < heads; h++)
                for (size_t i = 0; i < dh / 2; i++) {
                    size_t at = r * ld + col + h * dh + i;
                    double ang = (double)pos[r] * (double)inv[i], a = x[at], b = x[at + dh / 2];
                    ref[at] = a * cos(ang) - b * sin(ang);
                    ref[at + dh / 2] = b * cos(ang) + a * sin(ang);
                }
        char what[128];
        snprintf(what, sizeof(what), "rope %zu rows %zu heads dh %zu", rows, heads, dh);
        check(d, what, got, ref, rows * ld);
        d->o->weight_free(d->be, dinv);
        free(x), free(inv), free(pos), free(ref);
        case_end(d, what);
    }
}

static void test_rowwise(struct dev *d)
{
    for (int a = 1; a < BK_N_ACTS; a++) {
        case_begin(d);
        size_t n = (size_t)irand(1, 500);
        float *x = rnd(n, -8, 8);
        x[0] = 30.0f; /* saturating ends */
        if (n > 1) x[1] = -30.0f;
        void *dx = dev_act(d, x, n);
        assert_int_equal(d->o->pass_begin(d->c), 0);
        assert_int_equal(d->o->act(d->c, dx, n, (enum bk_act)a), 0);
        assert_int_equal(d->o->pass_end(d->c), 0);
        float *got = fetch(d, dx, n);
        double *ref = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) ref[i] = ref_act(x[i], (enum bk_act)a);
        char what[64];
        snprintf(what, sizeof(what), "act %s over %zu", act_names[a], n);
        check(d, what, got, ref, n);
        free(x), free(ref);
        case_end(d, what);
    }
    for (int l2 = 0; l2 < 2; l2++) {
        case_begin(d);
        size_t rows = (size_t)irand(1, 9), w = l2 ? (size_t)irand(1, 300) : 1;
        if (!l2 && irand(0, 1)) w = (size_t)irand(2, 300);
        float *x = rnd(rows * w, -20, 20);
        if (l2) memset(x, 0, w * sizeof(float)); /* a zero row stays zero */
        void *dx = dev_act(d, x, rows * w);
        assert_int_equal(d->o->pass_begin(d->c), 0);
        if (l2) assert_int_equal(d->o->l2norm(d->c, dx, rows, w), 0);
        else assert_int_equal(d->o->softmax(d->c, dx, rows, w), 0);
        assert_int_equal(d->o->pass_end(d->c), 0);
        float *got = fetch(d, dx, rows * w);
        double *ref = malloc(rows * w * sizeof(double));
        for (size_t r = 0; r < rows; r++) {
            const float *xr = x + r * w;
            double acc = 0, mx = -INFINITY;
            for (size_t i = 0; i < w; i++) mx = xr[i] > mx ? xr[i] : mx;
            for (size_t i = 0; i < w; i++) acc += l2 ? (double)xr[i] * xr[i] : exp(xr[i] - mx);
            double nrm = sqrt(acc) > 1e-12 ? sqrt(acc) : 1e-12;
            for (size_t i = 0; i < w; i++)
                ref[r * w + i] = l2 ? xr[i] / nrm : exp(xr[i] - mx) / acc;
        }
        char what[64];
        snprintf(what, sizeof(what), "%s %zux%zu", l2 ? "l2norm" : "softmax", rows, w);
        check(d, what, got, ref, rows * w);
        free(x), free(ref);
        case_end(d, what);
    }
}

static void test_pool(struct dev *d)
{
    static const char *const names[BK_N_POOLS] = {"first", "mean", "max", "last"};
    for (int mode = 0; mode < BK_N_POOLS; mode++) {
        case_begin(d);
        size_t n = (size_t)irand(1, 16), w = mode == 0 ? 1 : (size_t)irand(1, 64), longest;
        uint32_t off[17], *seq, *pos;
        size_t T = make_seqs(n, (size_t)irand(1, 30), off, &seq, &pos, &longest);
        float *x = rnd(T * w, -2, 2);
        struct bk_seqs s = {.n = n, .tokens = T, .longest = longest,
                            .offsets = dev_u32(d, off, n + 1), .seq = dev_u32(d, seq, T),
                            .pos = dev_u32(d, pos, T)};
        void *dx = dev_act(d, x, T * w), *dy = dev_act(d, NULL, n * w);
        assert_int_equal(d->o->pass_begin(d->c), 0);
        assert_int_equal(d->o->pool(d->c, dy, dx, &s, (enum bk_pool)mode, w), 0);
        assert_int_equal(d->o->pass_end(d->c), 0);
        float *got = fetch(d, dy, n * w);
        double *ref = malloc(n * w * sizeof(double));
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < w; k++) {
                size_t o = off[i], L = off[i + 1] - o;
                double v = mode == 3 ? x[(o + L - 1) * w + k] : x[o * w + k];
                if (mode == 1) {
                    v = 0;
                    for (size_t t = 0; t < L; t++) v += x[(o + t) * w + k];
                    v /= (double)L;
                } else if (mode == 2) {
                    for (size_t t = 1; t < L; t++) v = x[(o + t) * w + k] > v ? x[(o + t) * w + k] : v;
                }
                ref[i * w + k] = v;
            }
        char what[64];
        snprintf(what, sizeof(what), "pool %s %zu seqs w %zu", names[mode], n, w);
        check(d, what, got, ref, n * w);
        free(seq), free(pos), free(x), free(ref);
        case_end(d, what);
    }
}

/* ---- the backends ---------------------------------------------------------- */

static void run_all(struct dev *d)
{
    test_gemm_weights(d);
    test_gemm_acts(d);
    test_norms(d);
    test_embed(d);
    test_attention(d);
    test_rope(d);
    test_rowwise(d);
    test_pool(d);
}

static void *open_backend(const struct backend_ops *o, enum model_precision p)
{
    struct model_runtime_conf c;
    model_runtime_conf_defaults(&c);
    c.precision = p;
    char desc[400], err[300];
    void *be = o->open(&c, desc, sizeof(desc), err, sizeof(err));
    if (!be) fail_msg("%s: open: %s", o->name, err);
    return be;
}

static void test_cpu(void **state)
{
    (void)state;
    struct dev d = {.o = &backend_cpu, .label = "cpu", .tol = 2e-5};
    d.be = open_backend(&backend_cpu, MODEL_FP32);
    run_all(&d);
    backend_cpu.close(d.be);
}

int main(void)
{
    tu_seed("test_prims");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_cuda_prims.c - the CUDA backend's primitives (gpu/backend_cuda.c,
 * gpu/cuda_lt.c, gpu/cuda_prims.c, gpu/cuda_kernels.cu) one by one,
 * through the backend_ops table, against float64 references written
 * here, on fresh random sizes and values, in fp32, tf32, fp16 and bf16:
 * the GEMM (weights with bias and every activation, activations with and
 * without trans_b, strided batches, padded leading dimensions), and the
 * same on the backend's own GEMM kernel where the emulated cuBLASLt is
 * told to have no algorithm (sizes of 1, or every shape), layernorm
 * and rmsnorm with a residual (x keeps the sum; y may be x), embeddings
 * with and without their LayerNorm, attention over a strided qkv (causal
 * or not, grouped-query, a relative-position bias), rope, swiglu, the
 * paged key/value cache (kv_store, the keys rotated on the way in half
 * the rounds; paged_attention over scattered blocks, grouped-query at 1
 * to 4 and 8 query heads a cache head, contexts of one token, of whole
 * blocks, of the longest allowed and of several tiles, split over blocks
 * for few rows or not for many, NaN for a missing block; prefill steps
 * of several sequences' chunks packed together, which the CUDA backend
 * answers with its tiled prefill kernel, with a hole in a table and a
 * max_ctx below some positions: NaN for exactly the rows they reach;
 * mixed steps of decode tokens packed before prompt chunks, which it
 * splits between its two kernels, the same bits as either alone), the
 * activations, softmax, l2norm, the four poolings, float32 loads and
 * stores; graphs (eager, captured, replayed, with new inputs each time);
 * the refusals (a bad leading dimension fails its pass only; ctx_alloc
 * during a pass); and last an injected fault answered MODEL_EFATAL for
 * good. Inputs are rounded to the activation type first, so the
 * references see what the device sees.
 *
 * On a machine without a usable CUDA device, or a build without CUDA, it
 * prints "skipped: no CUDA device" and exits 77 (tests/run.sh counts it as
 * skipped); with KINFER_REQUIRE_GPU=1 that is a failure.
 *
 * Tolerance |got - ref| <= tol * max(1, |ref|): fp32 1e-4, tf32 and fp16
 * 2e-2, bf16 8e-2 (estimates written before a run on a device; the worst
 * ratio each case saw is printed).
 *
 * Single-threaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../emu/emu_lt.h"
#include "../gpu/backend.h"
#include "../gpu/kvcache.h"
#include "../gpu/plan.h"
#include "testutil.h"

static const struct backend_ops *const B = &backend_cuda;

#define HOST_BYTES (32u << 20) /* the largest cache test_paged reads back: 10 MB */

/* One opened backend and context in one precision. */
struct env {
    enum model_precision prec;
    void *be, *c;
    size_t es;
    double tol, worst;
    unsigned char *host; /* pinned, HOST_BYTES */
    size_t host_used;    /* bump allocation, reset after each pass */
};

static struct env *env_new(enum model_precision p, int graphs)
{
    struct env *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    struct model_runtime_conf conf;
    memset(&conf, 0, sizeof(conf));
    conf.backend = "cuda";
    conf.precision = p;
    conf.graphs = graphs;
    conf.executors_per_device = 1;
    conf.workspace_mb = 32;
    char desc[512], err[512];
    e->prec = p;
    e->be = B->open(&conf, desc, sizeof(desc), err, sizeof(err));
    if (!e->be) fail_msg("open: %s", err);
    e->c = B->ctx_new(e->be, 0, err, sizeof(err));
    if (!e->c) fail_msg("ctx_new: %s", err);
    e->es = B->act_size(e->be);
    e->tol = p == MODEL_FP32 ? 1e-4 : p == MODEL_BF16 ? 8e-2 : 2e-2;
    e->host = B->ctx_alloc(e->c, HOST_BYTES, 1);
    assert_non_null(e->host);
    return e;
}

static void env_free(struct env *e)
{
    printf("  %s: worst error / tolerance %.3f\n", model_precision_name(e->prec), e->worst);
    B->ctx_free(e->c);
    B->close(e->be);
    free(e);
}

/* x rounded to the activation type, as the device stores it. */
static float q(const struct env *e, float x)
{
    if (e->prec == MODEL_FP16) return st_f16_to_f32(st_f32_to_f16(x));
    if (e->prec == MODEL_BF16) return st_bf16_to_f32(st_f32_to_bf16(x));
    return x;
}

static float *randv(const struct env *e, size_t n, float lo, float hi)
{
    float *v = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = q(e, tu_randf(lo, hi));
    return v;
}

static void *dev(struct env *e, size_t bytes)
{
    void *p = B->ctx_alloc(e->c, bytes, 0);
    assert_non_null(p);
    return p;
}

static void *hput(struct env *e, const void *src, size_t bytes)
{
    assert_true(e->host_used + bytes <= HOST_BYTES);
    void *p = e->host + e->host_used;
    e->host_used += (bytes + 255) / 256 * 256;
    if (src) memcpy(p, src, bytes);
    return p;
}

static void begin(struct env *e)
{
    assert_int_equal(B->pass_begin(e->c), 0);
}

static void end(struct env *e)
{
    int rc = B->pass_end(e->c);
    if (rc != 0) fail_msg("pass_end: %d: %s", rc, B->ctx_error(e->c));
    e->host_used = 0;
}

/* Activations from host floats (in a pass of their own). */
static void load(struct env *e, void *d, const float *v, size_t n)
{
    begin(e);
    assert_int_equal(B->load_f32(e->c, d, hput(e, v, n * sizeof(float)), n), 0);
    end(e);
}

static void upload(struct env *e, void *d, const void *v, size_t bytes)
{
    begin(e);
    assert_int_equal(B->upload(e->c, d, hput(e, v, bytes), bytes), 0);
    end(e);
}

/* n activations back as floats (malloc'ed). */
static float *fetch(struct env *e, const void *d, size_t n)
{
    begin(e);
    float *h = hput(e, NULL, n * sizeof(float));
    assert_int_equal(B->store_f32(e->c, h, d, n), 0);
    end(e);
    float *out = malloc(n * sizeof(float));
    memcpy(out, h, n * sizeof(float));
    return out;
}

static struct bk_weight *weight(struct env *e, enum bk_wtype t, const float *v, size_t n)
{
    char err[256];
    struct bk_wsrc s = {.t = NULL, .f = v, .n = n};
    struct bk_weight *w = B->weight_new(e->be, 0, t, &s, 1, err, sizeof(err));
    if (!w) fail_msg("weight_new: %s", err);
    return w;
}

static void check(struct env *e, const char *what, const float *got, const double *ref, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double tol = e->tol * fmax(1.0, fabs(ref[i])), d = fabs((double)got[i] - ref[i]);
        if (!(d <= tol))
            fail_msg("%s (%s): element %zu: got %.7g, want %.7g", what,
                     model_precision_name(e->prec), i, got[i], ref[i]);
        if (d / tol > e->worst) e->worst = d / tol;
    }
}

static double act_ref(double x, enum bk_act a)
{
    switch (a) {
    case BK_ACT_RELU: return x < 0 ? 0 : x;
    case BK_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case BK_ACT_GELU_TANH:
        return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case BK_ACT_TANH: return tanh(x);
    case BK_ACT_SIGMOID: return 1 / (1 + exp(-x));
    case BK_ACT_SILU: return x / (1 + exp(-x));
    default: return x;
    }
}

static size_t rnd(size_t lo, size_t hi)
{
    return lo + (size_t)(tu_rand64() % (hi - lo + 1));
}

static const enum model_precision precs[] = {MODEL_FP32, MODEL_TF32, MODEL_FP16, MODEL_BF16};
#define N_PRECS (sizeof(precs) / sizeof(precs[0]))

static int have_device;

/* The emulated cuBLASLt's hooks (emu/emu_lt.h), found at run time: absent
 * from a real device's build. */
static void (*lt_refuse)(int which);
static unsigned long (*lt_count)(void);

static unsigned long lt_matmuls(void)
{
    return lt_count ? lt_count() : 0;
}

/* ---- gemm --------------------------------------------------------------- */

/* One GEMM of m x n x k against the float64 reference; returns how many
 * cuBLASLt matmuls it took on the emulated device (0 elsewhere). */
static unsigned long gemm_shape(struct env *e, size_t m, size_t n, size_t k, int use_w,
                                int trans_b, size_t batch, enum bk_act act, int bias)
{
    size_t lda = k + (tu_rand64() % 2) * 8, ldc = n + (tu_rand64() % 2) * 8;
    size_t ldb = (use_w || trans_b ? k : n) + (use_w ? 0 : (tu_rand64() % 2) * 8);
    size_t brows = use_w || trans_b ? n : k, nb = batch ? batch : 1;
    size_t sa = m * lda, sb = use_w ? 0 : brows * ldb, sc = m * ldc;
    float *A = randv(e, nb * sa, -1, 1), *Bm = randv(e, use_w ? n * k : nb * sb, -1, 1);
    float *bv = randv(e, n, -1, 1), *C0 = randv(e, nb * sc, -1, 1);
    void *dA = dev(e, nb * sa * e->es), *dB = use_w ? NULL : dev(e, nb * sb * e->es);
    void *dC = dev(e, nb * sc * e->es);
    struct bk_weight *w = use_w ? weight(e, BK_W_ACT, Bm, n * k) : NULL;
    struct bk_weight *bw = bias ? weight(e, BK_W_ACT, bv, n) : NULL;
    load(e, dA, A, nb * sa);
    if (!use_w) load(e, dB, Bm, nb * sb);
    load(e, dC, C0, nb * sc);
    float alpha = tu_rand64() % 2 ? 0.0f : 0.5f;
    struct bk_gemm g = {.m = m, .n = n, .k = k, .batch = batch, .alpha = alpha,
                        .a = dA, .lda = lda, .stride_a = sa, .w = w, .b = dB,
                        .trans_b = trans_b, .ldb = ldb, .stride_b = sb, .bias = bw, .act = act,
                        .c = dC, .ldc = ldc, .stride_c = sc};
    unsigned long lt0 = lt_matmuls();
    begin(e);
    int rc = B->gemm(e->c, &g);
    if (rc != 0) fail_msg("gemm: %d: %s", rc, B->ctx_error(e->c));
    end(e);
    unsigned long lt = lt_matmuls() - lt0;
    float *got = fetch(e, dC, nb * sc);
    double *ref = malloc(nb * sc * sizeof(double));
    for (size_t b = 0; b < nb; b++)
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < ldc; j++) {
                size_t o = b * sc + i * ldc + j;
                if (j >= n) { /* padding columns are left alone */
                    ref[o] = C0[o];
                    continue;
                }
                double s = 0;
                for (size_t kk = 0; kk < k; kk++) {
                    double bval = use_w ? Bm[j * k + kk]
                                  : trans_b ? Bm[b * sb + j * ldb + kk]
                                            : Bm[b * sb + kk * ldb + j];
                    s += (double)A[b * sa + i * lda + kk] * bval;
                }
                s = s * (alpha ? alpha : 1.0) + (bias ? bv[j] : 0.0);
                ref[o] = act_ref(s, act);
            }
    char what[128];
    snprintf(what, sizeof(what), "gemm %zux%zux%zu w=%d tb=%d batch=%zu act=%d bias=%d", m, n, k,
             use_w, trans_b, batch, (int)act, bias);
    check(e, what, got, ref, nb * sc);
    B->weight_free(e->be, w);
    B->weight_free(e->be, bw);
    free(A), free(Bm), free(bv), free(C0), free(got), free(ref);
    return lt;
}

static void gemm_case(struct env *e, int use_w, int trans_b, size_t batch, enum bk_act act,
                      int bias)
{
    gemm_shape(e, rnd(1, 40), rnd(1, 48), rnd(1, 64), use_w, trans_b, batch, act, bias);
}

static void test_gemm(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        for (int a = 0; a < BK_N_ACTS; a++) gemm_case(e, 1, 1, 0, (enum bk_act)a, a % 2);
        gemm_case(e, 1, 1, 0, BK_ACT_RELU, 1);
        gemm_case(e, 1, 1, 0, BK_ACT_GELU_TANH, 1);
        gemm_case(e, 0, 1, 0, BK_ACT_NONE, 0);
        gemm_case(e, 0, 0, 0, BK_ACT_NONE, 0);
        gemm_case(e, 0, 1, 3, BK_ACT_NONE, 0);
        gemm_case(e, 0, 0, 4, BK_ACT_TANH, 0);
        gemm_case(e, 1, 1, 2, BK_ACT_NONE, 1);
        env_free(e);
    }
}

/* Shapes cuBLASLt has no algorithm for run on the backend's own kernel:
 * the emulated heuristic refuses first every shape with a size of 1, then
 * every shape; each GEMM must match the reference, without a cuBLASLt
 * matmul where it was refused (and with one where it was not). Every
 * operand form, activation, bias, batch and padded leading dimension, in
 * every precision. On the emulated device only (a real cuBLASLt cannot
 * be told to refuse). */
static void test_gemm_fallback(void **state)
{
    (void)state;
    if (!have_device || !lt_refuse) skip();
    for (int mode = EMU_LT_REFUSE_ONES; mode <= EMU_LT_REFUSE_ALL; mode++) {
        lt_refuse(mode);
        for (size_t p = 0; p < N_PRECS; p++) {
            struct env *e = env_new(precs[p], 0);
            for (int i = 0; i < 24; i++) {
                /* i % 8: which of m, n, k are 1 (bit 0, 1, 2); the rest
                 * random, over a tile of the kernel now and then. */
                size_t m = i & 1 ? 1 : rnd(2, 40), n = i & 2 ? 1 : rnd(2, 48),
                       k = i & 4 ? 1 : rnd(2, 70);
                int use_w = i % 3 == 0, trans_b = use_w || i % 3 == 1;
                size_t batch = i % 4 == 3 ? rnd(2, 3) : 0;
                enum bk_act act = (enum bk_act)(i % BK_N_ACTS);
                unsigned long lt = gemm_shape(e, m, n, k, use_w, trans_b, batch, act, i % 2);
                /* a shared weight over a contiguous batch is m x batch rows */
                int refused = mode == EMU_LT_REFUSE_ALL || n == 1 || k == 1 ||
                              (m == 1 && !(use_w && batch > 1));
                if (refused && lt != 0)
                    fail_msg("%zux%zux%zu: cuBLASLt ran %lu matmul(s) it had refused", m, n, k,
                             lt);
                if (!refused && lt == 0)
                    fail_msg("%zux%zux%zu: no cuBLASLt matmul for a shape it takes", m, n, k);
            }
            env_free(e);
        }
    }
    lt_refuse(EMU_LT_REFUSE_NONE);
}

/* ---- norms ---------------------------------------------------------------- */

static void norm_case(struct env *e, int rms, int with_res, int in_place, int affine)
{
    size_t rows = rnd(1, 20), w = rnd(1, 700);
    float *x = randv(e, rows * w, -2, 2), *r = randv(e, rows * w, -1, 1);
    float *g = randv(e, w, 0.5, 1.5), *b = randv(e, w, -0.5, 0.5);
    void *dx = dev(e, rows * w * e->es), *dr = dev(e, rows * w * e->es);
    void *dy = in_place ? dx : dev(e, rows * w * e->es);
    struct bk_weight *gw = affine ? weight(e, BK_W_F32, g, w) : NULL;
    struct bk_weight *bw = affine ? weight(e, BK_W_F32, b, w) : NULL;
    load(e, dx, x, rows * w);
    load(e, dr, r, rows * w);
    float eps = 1e-5f;
    begin(e);
    int rc = rms ? B->rmsnorm(e->c, dy, dx, with_res ? dr : NULL, gw, eps, rows, w)
                 : B->layernorm(e->c, dy, dx, with_res ? dr : NULL, gw, bw, eps, rows, w);
    assert_int_equal(rc, 0);
    end(e);
    float *gy = fetch(e, dy, rows * w), *gx = fetch(e, dx, rows * w);
    double *ry = malloc(rows * w * sizeof(double)), *rx = malloc(rows * w * sizeof(double));
    for (size_t i = 0; i < rows; i++) {
        double mean = 0, var = 0, ms = 0;
        for (size_t j = 0; j < w; j++) {
            double v = x[i * w + j] + (with_res ? r[i * w + j] : 0.0);
            rx[i * w + j] = q(e, (float)v);
            mean += v;
            ms += v * v;
        }
        mean /= (double)w;
        ms /= (double)w;
        for (size_t j = 0; j < w; j++) {
            double d = x[i * w + j] + (with_res ? r[i * w + j] : 0.0) - mean;
            var += d * d;
        }
        var /= (double)w;
        for (size_t j = 0; j < w; j++) {
            double v = x[i * w + j] + (with_res ? r[i * w + j] : 0.0);
            double y = rms ? v / sqrt(ms + eps) : (v - mean) / sqrt(var + eps);
            if (affine) y = y * g[j] + (rms ? 0.0 : b[j]);
            ry[i * w + j] = y;
        }
    }
    check(e, rms ? "rmsnorm y" : "layernorm y", gy, ry, rows * w);
    if (with_res && !in_place) check(e, rms ? "rmsnorm x" : "layernorm x", gx, rx, rows * w);
    B->weight_free(e->be, gw);
    B->weight_free(e->be, bw);
    free(x), free(r), free(g), free(b), free(gy), free(gx), free(ry), free(rx);
}

static void test_norms(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        for (int k = 0; k < 16; k++) norm_case(e, k & 1, k >> 1 & 1, k >> 2 & 1, k >> 3 & 1);
        env_free(e);
    }
}

/* ---- sequences -------------------------------------------------------------- */

/* n random sequences (lengths 1..maxlen) as bk_seqs on the device; the
 * host's copies in *offs, *seq, *pos. */
struct hseqs {
    size_t n, T, longest;
    uint32_t *offs, *seq, *pos;
    int32_t *ids, *types;
    struct bk_seqs s;
};

static void seqs_make(struct env *e, struct hseqs *h, size_t n, size_t maxlen, size_t vocab,
                      size_t ntypes)
{
    h->n = n;
    h->offs = malloc((n + 1) * sizeof(uint32_t));
    h->offs[0] = 0;
    h->longest = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = rnd(1, maxlen);
        if (len > h->longest) h->longest = len;
        h->offs[i + 1] = h->offs[i] + (uint32_t)len;
    }
    h->T = h->offs[n];
    h->seq = malloc(h->T * sizeof(uint32_t));
    h->pos = malloc(h->T * sizeof(uint32_t));
    h->ids = malloc(h->T * sizeof(int32_t));
    h->types = malloc(h->T * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = h->offs[i]; t < h->offs[i + 1]; t++) {
            h->seq[t] = (uint32_t)i;
            h->pos[t] = t - h->offs[i];
            h->ids[t] = (int32_t)(tu_rand64() % vocab);
            h->types[t] = (int32_t)(tu_rand64() % ntypes);
        }
    void *d_offs = dev(e, (n + 1) * 4), *d_seq = dev(e, h->T * 4), *d_pos = dev(e, h->T * 4);
    void *d_ids = dev(e, h->T * 4), *d_types = dev(e, h->T * 4);
    upload(e, d_offs, h->offs, (n + 1) * 4);
    upload(e, d_seq, h->seq, h->T * 4);
    upload(e, d_pos, h->pos, h->T * 4);
    upload(e, d_ids, h->ids, h->T * 4);
    upload(e, d_types, h->types, h->T * 4);
    h->s = (struct bk_seqs){n, h->T, h->longest, 0, d_offs, d_seq, d_pos, d_ids, d_types};
}

static void seqs_free(struct hseqs *h)
{
    free(h->offs), free(h->seq), free(h->pos), free(h->ids), free(h->types);
}

static void embed_case(struct env *e, int ln, int with_pos, int with_type)
{
    struct hseqs h;
    size_t w = rnd(8, 300), vocab = 50, maxpos = 40, ntypes = 3, base = rnd(0, 2);
    seqs_make(e, &h, rnd(1, 6), 30, vocab, ntypes);
    float *word = randv(e, vocab * w, -1, 1), *pos = randv(e, maxpos * w, -1, 1);
    float *type = randv(e, ntypes * w, -1, 1), *g = randv(e, w, 0.5, 1.5),
          *b = randv(e, w, -0.5, 0.5);
    struct bk_weight *ww = weight(e, BK_W_ACT, word, vocab * w);
    struct bk_weight *pw = with_pos ? weight(e, BK_W_ACT, pos, maxpos * w) : NULL;
    struct bk_weight *tw = with_type ? weight(e, BK_W_ACT, type, ntypes * w) : NULL;
    struct bk_weight *gw = weight(e, BK_W_F32, g, w), *bw = weight(e, BK_W_F32, b, w);
    void *dx = dev(e, h.T * w * e->es);
    begin(e);
    assert_int_equal(B->embed(e->c, dx, &h.s, ww, pw, base, tw, ln, gw, bw, 1e-5f, w), 0);
    end(e);
    float *got = fetch(e, dx, h.T * w);
    double *ref = malloc(h.T * w * sizeof(double));
    for (size_t t = 0; t < h.T; t++) {
        double mean = 0, var = 0;
        for (size_t j = 0; j < w; j++) {
            double v = word[(size_t)h.ids[t] * w + j];
            if (with_pos) v += pos[(base + h.pos[t]) * w + j];
            if (with_type) v += type[(size_t)h.types[t] * w + j];
            ref[t * w + j] = v;
            mean += v;
        }
        mean /= (double)w;
        for (size_t j = 0; j < w; j++) var += (ref[t * w + j] - mean) * (ref[t * w + j] - mean);
        var /= (double)w;
        if (ln)
            for (size_t j = 0; j < w; j++)
                ref[t * w + j] = (ref[t * w + j] - mean) / sqrt(var + 1e-5) * g[j] + b[j];
    }
    check(e, "embed", got, ref, h.T * w);
    B->weight_free(e->be, ww), B->weight_free(e->be, pw), B->weight_free(e->be, tw);
    B->weight_free(e->be, gw), B->weight_free(e->be, bw);
    free(word), free(pos), free(type), free(g), free(b), free(got), free(ref);
    seqs_free(&h);
}

static void test_embed(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        for (int k = 0; k < 8; k++) embed_case(e, k & 1, k >> 1 & 1, k >> 2 & 1);
        env_free(e);
    }
}

static void attention_case(struct env *e, int causal, size_t kv_div, int rel)
{
    struct hseqs h;
    size_t heads = 4, kv = heads / kv_div, dh = 8 * rnd(1, 3), span = rnd(1, 6);
    seqs_make(e, &h, rnd(1, 5), 21, 1, 1);
    size_t qc = 3, kc = qc + heads * dh + 1, vc = kc + kv * dh + 2, ld = vc + kv * dh + 5;
    size_t ldo = heads * dh + 4;
    float *qkv = randv(e, h.T * ld, -1, 1), *rb = randv(e, heads * (2 * span - 1), -1, 1);
    float *o0 = randv(e, h.T * ldo, -1, 1);
    void *dqkv = dev(e, h.T * ld * e->es), *dout = dev(e, h.T * ldo * e->es);
    size_t sb = B->attention_scratch(e->be, h.n, h.n * h.longest, h.longest, heads, dh);
    void *scratch = dev(e, sb);
    struct bk_weight *rw = rel ? weight(e, BK_W_F32, rb, heads * (2 * span - 1)) : NULL;
    load(e, dqkv, qkv, h.T * ld);
    load(e, dout, o0, h.T * ldo);
    float scale = 1.0f / sqrtf((float)dh);
    struct bk_attention a = {.qkv = dqkv, .ld = ld, .q_col = qc, .k_col = kc, .v_col = vc,
                             .heads = heads, .kv_heads = kv, .dh = dh, .scale = scale,
                             .causal = causal, .rel_bias = rw, .rel_span = span, .s = &h.s,
                             .out = dout, .ldo = ldo, .scratch = scratch};
    begin(e);
    int rc = B->attention(e->c, &a);
    if (rc != 0) fail_msg("attention: %d: %s", rc, B->ctx_error(e->c));
    end(e);
    float *got = fetch(e, dout, h.T * ldo);
    double *ref = malloc(h.T * ldo * sizeof(double)), p[32];
    for (size_t i = 0; i < h.T * ldo; i++) ref[i] = o0[i];
    for (size_t i = 0; i < h.n; i++)
        for (size_t hh = 0; hh < heads; hh++) {
            size_t g = hh / (heads / kv), o = h.offs[i], len = h.offs[i + 1] - o;
            for (size_t a_ = 0; a_ < len; a_++) {
                size_t end_ = causal ? a_ + 1 : len;
                double m = -INFINITY, sum = 0;
                for (size_t b_ = 0; b_ < end_; b_++) {
                    double s = 0;
                    for (size_t d = 0; d < dh; d++)
                        s += (double)qkv[(o + a_) * ld + qc + hh * dh + d] *
                             qkv[(o + b_) * ld + kc + g * dh + d];
                    s *= scale;
                    if (rel) {
                        long dist = (long)b_ - (long)a_, lim = (long)span - 1;
                        dist = dist < -lim ? -lim : dist > lim ? lim : dist;
                        s += rb[hh * (2 * span - 1) + (size_t)(dist + lim)];
                    }
                    p[b_] = s;
                    if (s > m) m = s;
                }
                for (size_t b_ = 0; b_ < end_; b_++) sum += p[b_] = exp(p[b_] - m);
                for (size_t d = 0; d < dh; d++) {
                    double v = 0;
                    for (size_t b_ = 0; b_ < end_; b_++)
                        v += p[b_] / sum * qkv[(o + b_) * ld + vc + g * dh + d];
                    ref[(o + a_) * ldo + hh * dh + d] = v;
                }
            }
        }
    check(e, "attention", got, ref, h.T * ldo);
    B->weight_free(e->be, rw);
    free(qkv), free(rb), free(o0), free(got), free(ref);
    seqs_free(&h);
}

static void test_attention(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        for (int k = 0; k < 12; k++) attention_case(e, k & 1, k >> 1 & 1 ? 2 : 1, k >> 2 & 1);
        attention_case(e, 1, 4, 1);
        env_free(e);
    }
}

/* ---- rope, activations, softmax, l2norm, pool ---------------------------------------- */

static void test_rope(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        size_t rows = rnd(1, 30), heads = rnd(1, 4), dh = 2 * rnd(1, 16), col = rnd(0, 5);
        size_t ld = col + heads * dh + rnd(0, 3);
        float *x = randv(e, rows * ld, -1, 1), *f = malloc(dh / 2 * sizeof(float));
        uint32_t *pos = malloc(rows * sizeof(uint32_t));
        for (size_t i = 0; i < dh / 2; i++) f[i] = powf(10000.0f, -2.0f * (float)i / (float)dh);
        for (size_t r = 0; r < rows; r++) pos[r] = (uint32_t)rnd(0, 2000);
        void *dx = dev(e, rows * ld * e->es), *dpos = dev(e, rows * 4);
        struct bk_weight *fw = weight(e, BK_W_F32, f, dh / 2);
        load(e, dx, x, rows * ld);
        upload(e, dpos, pos, rows * 4);
        begin(e);
        assert_int_equal(B->rope(e->c, dx, rows, ld, col, heads, dh, dpos, fw), 0);
        end(e);
        float *got = fetch(e, dx, rows * ld);
        double *ref = malloc(rows * ld * sizeof(double));
        for (size_t i = 0; i < rows * ld; i++) ref[i] = x[i];
        for (size_t r = 0; r < rows; r++)
            for (size_t hh = 0; hh < heads; hh++)
                for (size_t i = 0; i < dh / 2; i++) {
                    size_t o = r * ld + col + hh * dh;
                    double th = (double)pos[r] * f[i], a = x[o + i], b = x[o + i + dh / 2];
                    ref[o + i] = a * cos(th) - b * sin(th);
                    ref[o + i + dh / 2] = b * cos(th) + a * sin(th);
                }
        check(e, "rope", got, ref, rows * ld);
        B->weight_free(e->be, fw);
        free(x), free(f), free(pos), free(got), free(ref);
        env_free(e);
    }
}

static void test_swiglu(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        size_t rows = rnd(1, 20), w = rnd(1, 700);
        float *x = randv(e, rows * 2 * w, -6, 6);
        void *dx = dev(e, rows * 2 * w * e->es), *dy = dev(e, rows * w * e->es);
        load(e, dx, x, rows * 2 * w);
        begin(e);
        assert_int_equal(B->swiglu(e->c, dy, dx, rows, w), 0);
        end(e);
        float *got = fetch(e, dy, rows * w);
        double *ref = malloc(rows * w * sizeof(double));
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < w; j++) {
                double g = x[r * 2 * w + j], u = x[r * 2 * w + w + j];
                ref[r * w + j] = g / (1.0 + exp(-g)) * u;
            }
        check(e, "swiglu", got, ref, rows * w);
        free(x), free(got), free(ref);
        env_free(e);
    }
}

/* ---- the paged key/value cache ------------------------------------------------------ */

/* A case of the paged cache: n sequences (at most PMAX), each with
 * past[i] cached positions and k[i] new tokens (a prefill chunk or one
 * decode token), packed in sequence order; kvh cache heads of dh values,
 * group query heads each; blocks of bt tokens; a workspace context of
 * max_ctx; rope: the keys rotated as they are stored; lone: the step
 * says that its first lone sequences read one token each (bk_seqs.lone,
 * as the decoder counts them), 0: it does not say. */
#define PMAX 8
struct pspec {
    size_t n, kvh, group, dh, bt, max_ctx, lone;
    size_t past[PMAX], k[PMAX];
    int rope;
};

/* Runs sp on e: blocks of the pool handed out by gpu/kvcache.c to
 * interleaved sequences; the past is stored in one kv_store, then the new
 * tokens, which attend; every output against the float64 reference. For
 * prefill steps: every token again alone, its output the same to
 * the bit, and with sp->lone, the step again with lone 0, the same bits
 * too; then a block of sequence 0 taken out of its table (its rows
 * from that block's first position on are NaN, every other row as
 * before) and max_ctx lowered below the last sequence's last position
 * (its rows at or past it are NaN). Last a position past the table (one
 * token): NaN. */
static void paged_run(struct env *e, const struct pspec *sp, const char *label, int prefill)
{
    char err[256];
    size_t n = sp->n, kvh = sp->kvh, group = sp->group, heads = kvh * group, dh = sp->dh;
    size_t bt = sp->bt, max_ctx = sp->max_ctx, total_new = 0, total_past = 0;
    const size_t *past = sp->past, *k = sp->k;
    for (size_t i = 0; i < n; i++) {
        assert_true(k[i] >= 1 && past[i] + k[i] <= max_ctx && (i >= sp->lone || k[i] == 1));
        total_new += k[i];
        total_past += past[i];
    }
    size_t width = (max_ctx + bt - 1) / bt, blocks = n * width + rnd(0, 3);
    struct kvcache *kv = kvcache_new(blocks, bt, n, max_ctx, err, sizeof(err));
    assert_non_null(kv);
    int ids[PMAX];
    for (size_t i = 0; i < n; i++) ids[i] = kvcache_seq_new(kv);
    for (size_t step = 0; step < max_ctx; step++)
        for (size_t i = 0; i < n; i++)
            if (step < past[i] + k[i]) assert_int_equal(kvcache_extend(kv, ids[i], 1), 0);
    uint32_t *tables = malloc(n * width * sizeof(uint32_t));
    assert_non_null(tables);
    for (size_t i = 0; i < n; i++)
        memcpy(tables + i * width, kvcache_table(kv, ids[i]), width * sizeof(uint32_t));
    size_t row = kvh * dh, ldx = 2 * row + rnd(0, 3); /* [K | V | junk] rows */
    float *Kd[PMAX], *Vd[PMAX];
    for (size_t i = 0; i < n; i++) {
        Kd[i] = randv(e, (past[i] + k[i]) * row, -1, 1);
        Vd[i] = randv(e, (past[i] + k[i]) * row, -1, 1);
    }
    /* with rope, Kr: the keys the cache must hold */
    int use_rope = sp->rope;
    double *Kr[PMAX];
    float *f = malloc(dh / 2 * sizeof(float));
    assert_non_null(f);
    for (size_t i = 0; i < dh / 2; i++) f[i] = powf(10000.0f, -2.0f * (float)i / (float)dh);
    struct bk_weight *fw = use_rope ? weight(e, BK_W_F32, f, dh / 2) : NULL;
    for (size_t i = 0; i < n; i++) {
        Kr[i] = tu_cached_keys(Kd[i], past[i] + k[i], row, kvh, dh, use_rope ? f : NULL);
        assert_non_null(Kr[i]);
    }
    size_t cache_floats = blocks * bt * row;
    /* the cache in the backend's cache type: the activations' */
    assert_int_equal(B->kv_size(e->be), e->es);
    struct bk_kv cache = {.k = dev(e, cache_floats * e->es), .v = dev(e, cache_floats * e->es),
                          .blocks = blocks, .block_tokens = bt, .kv_heads = kvh, .dh = dh,
                          .table_w = width};
    void *dtab = dev(e, n * width * 4);
    upload(e, dtab, tables, n * width * 4);
    cache.tables = dtab;
    for (int phase = 0; phase < 2; phase++) {
        size_t T = phase ? total_new : total_past, t = 0;
        if (!T) continue;
        uint32_t *seq = malloc(T * 4), *pos = malloc(T * 4);
        float *x = malloc(T * ldx * sizeof(float));
        assert_true(seq && pos && x);
        for (size_t i = 0; i < n; i++) {
            size_t p0 = phase ? past[i] : 0, p1 = phase ? past[i] + k[i] : past[i];
            for (size_t p = p0; p < p1; p++, t++) {
                seq[t] = (uint32_t)i;
                pos[t] = (uint32_t)p;
                for (size_t c = 0; c < ldx; c++) x[t * ldx + c] = q(e, tu_randf(-1, 1));
                memcpy(x + t * ldx, Kd[i] + p * row, row * 4);
                memcpy(x + t * ldx + row, Vd[i] + p * row, row * 4);
            }
        }
        void *dseq = dev(e, T * 4), *dpos = dev(e, T * 4), *dx = dev(e, T * ldx * e->es);
        upload(e, dseq, seq, T * 4);
        upload(e, dpos, pos, T * 4);
        load(e, dx, x, T * ldx);
        struct bk_seqs s = {.n = n, .tokens = T, .seq = dseq, .pos = dpos};
        begin(e);
        assert_int_equal(B->kv_store(e->c, &cache, dx, ldx, (char *)dx + row * e->es, ldx, &s, fw),
                         0);
        end(e);
        free(seq), free(pos), free(x);
    }
    { /* the cache, read back (values the type holds exactly come back as they went) */
        float *Kc = fetch(e, cache.k, cache_floats), *Vc = fetch(e, cache.v, cache_floats);
        for (size_t i = 0; i < n; i++)
            for (size_t p = 0; p < past[i] + k[i]; p++) {
                size_t slot = (size_t)tables[i * width + p / bt] * bt + p % bt;
                if (use_rope)
                    check(e, "kv_store with rope", Kc + slot * row, Kr[i] + p * row, row);
                else
                    assert_memory_equal(Kc + slot * row, Kd[i] + p * row, row * 4);
                assert_memory_equal(Vc + slot * row, Vd[i] + p * row, row * 4);
            }
        free(Kc), free(Vc);
    }
    size_t ldq = heads * dh + rnd(0, 3), ldo = heads * dh + rnd(0, 3), T = total_new;
    float *qv = randv(e, T * ldq, -1, 1);
    uint32_t *seq = malloc(T * 4), *pos = malloc(T * 4);
    double *ref = calloc(T * ldo, sizeof(double)), *sc = malloc(max_ctx * sizeof(double));
    assert_true(seq && pos && ref && sc);
    size_t t = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t p = past[i]; p < past[i] + k[i]; p++, t++) {
            seq[t] = (uint32_t)i;
            pos[t] = (uint32_t)p;
            for (size_t h = 0; h < heads; h++) {
                size_t g = h / group;
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j <= p; j++) {
                    double dot = 0;
                    for (size_t c = 0; c < dh; c++)
                        dot += (double)qv[t * ldq + h * dh + c] * Kr[i][j * row + g * dh + c];
                    sc[j] = dot / sqrt((double)dh);
                    mx = fmax(mx, sc[j]);
                }
                for (size_t j = 0; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (size_t c = 0; c < dh; c++) {
                    double o = 0;
                    for (size_t j = 0; j <= p; j++) o += sc[j] / sum * Vd[i][j * row + g * dh + c];
                    ref[t * ldo + h * dh + c] = o;
                }
            }
        }
    void *dseq = dev(e, T * 4), *dpos = dev(e, T * 4);
    void *dq = dev(e, T * ldq * e->es), *dout = dev(e, T * ldo * e->es);
    upload(e, dseq, seq, T * 4);
    upload(e, dpos, pos, T * 4);
    load(e, dq, qv, T * ldq);
    struct bk_seqs s = {.n = n, .tokens = T, .lone = sp->lone, .seq = dseq, .pos = dpos};
    struct bk_paged_attention pa = {
        .q = dq, .ldq = ldq, .heads = heads, .scale = (float)(1.0 / sqrt((double)dh)),
        .kv = &cache, .s = &s, .max_ctx = max_ctx, .out = dout, .ldo = ldo,
        .scratch = dev(e, B->paged_attention_scratch(e->be, T, max_ctx, heads))};
    begin(e);
    assert_int_equal(B->paged_attention(e->c, &pa), 0);
    end(e);
    float *got = fetch(e, dout, T * ldo);
    for (size_t r = 0; r < T; r++) /* the padding columns are not compared */
        for (size_t c = heads * dh; c < ldo; c++) got[r * ldo + c] = (float)ref[r * ldo + c];
    char what[200];
    snprintf(what, sizeof(what), "paged attention %s: %zu seqs, %zu tokens, %zu/%zu heads, dh "
             "%zu, block %zu, context %zu", label, n, T, heads, kvh, dh, bt, max_ctx);
    check(e, what, got, ref, T * ldo);
    if (prefill) {
        /* each token alone (no scratch: never split), which the CUDA
         * backend answers with its one-row walk: the same bits, since a
         * token's output must not depend on the step around it */
        void *dout1 = dev(e, T * ldo * e->es);
        struct bk_seqs one = {.n = n, .tokens = 1};
        struct bk_paged_attention pa1 = pa;
        pa1.s = &one;
        pa1.scratch = NULL;
        begin(e);
        for (size_t r = 0; r < T; r++) {
            one.seq = (const uint32_t *)dseq + r;
            one.pos = (const uint32_t *)dpos + r;
            pa1.q = (const char *)dq + r * ldq * e->es;
            pa1.out = (char *)dout1 + r * ldo * e->es;
            assert_int_equal(B->paged_attention(e->c, &pa1), 0);
        }
        end(e);
        float *alone = fetch(e, dout1, T * ldo);
        /* a lone token of a mixed step may be walked split into parts (few
         * rows over a long context: gpu/plan.h), as one alone with scratch
         * is: its row must be one of the two walks' to the bit */
        float *split1 = NULL;
        if (sp->lone) {
            pa1.scratch = pa.scratch;
            begin(e);
            for (size_t r = 0; r < sp->lone; r++) {
                one.seq = (const uint32_t *)dseq + r;
                one.pos = (const uint32_t *)dpos + r;
                pa1.q = (const char *)dq + r * ldq * e->es;
                pa1.out = (char *)dout1 + r * ldo * e->es;
                assert_int_equal(B->paged_attention(e->c, &pa1), 0);
            }
            end(e);
            split1 = fetch(e, dout1, sp->lone * ldo);
        }
        for (size_t r = 0; r < T; r++)
            if (memcmp(alone + r * ldo, got + r * ldo, heads * dh * sizeof(float)) &&
                (r >= sp->lone ||
                 memcmp(split1 + r * ldo, got + r * ldo, heads * dh * sizeof(float))))
                fail_msg("%s (%s): token %zu alone differs from its step's answer", what,
                         model_precision_name(e->prec), r);
        free(alone);
        if (sp->lone) {
            /* the step not told of its lone tokens: the rule on the whole
             * step (the tiled kernel over every token when it is met) */
            void *dout2 = dev(e, T * ldo * e->es);
            struct bk_paged_attention pa2 = pa;
            pa2.out = dout2;
            s.lone = 0;
            begin(e);
            assert_int_equal(B->paged_attention(e->c, &pa2), 0);
            end(e);
            float *whole = fetch(e, dout2, T * ldo);
            for (size_t r = 0; r < T; r++)
                if (memcmp(whole + r * ldo, got + r * ldo, heads * dh * sizeof(float)) &&
                    (r >= sp->lone ||
                     memcmp(split1 + r * ldo, got + r * ldo, heads * dh * sizeof(float))))
                    fail_msg("%s (%s): token %zu differs between the step told of its %zu "
                             "lone tokens and not", what, model_precision_name(e->prec), r,
                             sp->lone);
            free(whole);
            s.lone = sp->lone;
        }
        free(split1);
        /* sequence 0 loses the block of a random position p0 of its
         * context; max_ctx drops to a new position of the last sequence
         * (when that leaves some of sequence 0's rows to the hole) */
        size_t p0 = rnd(0, past[0] + k[0] - 1), cut = past[n - 1] + rnd(0, k[n - 1] - 1);
        if (cut <= p0 / bt * bt) cut = max_ctx;
        uint32_t hole = (uint32_t)blocks, saved = tables[p0 / bt];
        upload(e, (char *)dtab + p0 / bt * 4, &hole, 4);
        pa.max_ctx = cut;
        begin(e);
        assert_int_equal(B->paged_attention(e->c, &pa), 0);
        end(e);
        float *got2 = fetch(e, dout, T * ldo);
        for (size_t r = 0; r < T; r++) {
            int nan_row = (seq[r] == 0 && pos[r] >= p0 / bt * bt) || pos[r] >= cut;
            for (size_t c = 0; c < heads * dh && nan_row; c++) {
                float v = got2[r * ldo + c];
                if (!isnan(v))
                    fail_msg("%s: token %zu (sequence %u, position %u) with block %zu "
                             "missing, context %zu: got %g, want NaN",
                             what, r, seq[r], pos[r], p0 / bt, cut, v);
            }
            if (!nan_row) /* the others as before */
                check(e, "paged attention with a hole, the other rows", got2 + r * ldo,
                      ref + r * ldo, heads * dh);
        }
        free(got2);
        upload(e, (char *)dtab + p0 / bt * 4, &saved, 4);
        pa.max_ctx = max_ctx;
    }
    /* A position the table does not hold: the token's rows are NaN (the
     * table lives on the device; the host cannot refuse it). */
    uint32_t bad = (uint32_t)(width * bt);
    upload(e, dpos, &bad, 4);
    s.tokens = 1;
    s.lone = 0;
    pa.max_ctx = bad + 1;
    begin(e);
    assert_int_equal(B->paged_attention(e->c, &pa), 0);
    end(e);
    float *nan_row = fetch(e, dout, heads * dh);
    for (size_t c = 0; c < heads * dh; c++)
        if (!isnan(nan_row[c])) fail_msg("%s: a position past the table gave %g", what, nan_row[c]);
    if (sp->lone) { /* more lone tokens than the step holds: refused, its pass fails */
        s.lone = s.tokens + 1;
        begin(e);
        assert_int_equal(B->paged_attention(e->c, &pa), MODEL_EINVAL);
        assert_non_null(strstr(B->ctx_error(e->c), "lone"));
        assert_int_equal(B->pass_end(e->c), MODEL_EINVAL);
        e->host_used = 0;
        s.lone = sp->lone;
    }
    for (size_t i = 0; i < n; i++) free(Kd[i]), free(Vd[i]), free(Kr[i]);
    if (fw) B->weight_free(e->be, fw);
    free(f);
    free(tables), free(qv), free(seq), free(pos), free(ref), free(sc), free(got), free(nan_row);
    kvcache_destroy(kv);
}

/* One random case: longctx 1: decode tokens over a context of several of
 * the kernel's tiles of positions (on CUDA each split over blocks, then
 * combined); 2: the same with a prefill chunk of 60 or more tokens in 9
 * heads (too many rows to split). */
static void paged_case(struct env *e, int round, int longctx)
{
    static const size_t ratios[] = {1, 2, 3, 4, 8}; /* query heads per cache head */
    struct pspec sp = {.n = rnd(1, 4), .kvh = longctx == 2 ? 3 : rnd(1, 3), .rope = round % 2};
    sp.group = longctx == 2 ? 3 : ratios[rnd(0, 4)];
    sp.dh = longctx ? 2 * rnd(1, 64) : 2 * rnd(1, 8), sp.bt = rnd(1, 6);
    size_t max_ctx = longctx == 1 ? rnd(260, 1500) : longctx ? rnd(260, 400) : rnd(1, 40);
    sp.max_ctx = max_ctx;
    for (size_t i = 0; i < sp.n; i++) {
        /* the edges: the longest context, a context of one token, one of
         * whole blocks (its last position at a block's end) */
        size_t len = rnd(longctx == 2 && i == 0 ? 100 : 1, max_ctx);
        if (i == 0 && round % 3 == 0) len = max_ctx;
        if (i == 1 && round % 3 == 1) len = 1;
        if (i == 2 && max_ctx >= sp.bt) len = sp.bt * rnd(1, max_ctx / sp.bt);
        sp.k[i] = (i == 0 || tu_rand64() % 2) && !longctx ? rnd(1, len) : 1;
        if (longctx == 2 && i == 0) sp.k[i] = rnd(60, 100);
        sp.past[i] = len - sp.k[i];
    }
    char label[16];
    snprintf(label, sizeof(label), "#%d", round);
    paged_run(e, &sp, label, 0);
}

static void test_paged(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        for (int round = 0; round < 9; round++) paged_case(e, round, round < 6 ? 0 : round < 8 ? 1 : 2);
        env_free(e);
    }
}

/* Mixed steps as the generation engine packs them: 3 to 5 lone decode
 * tokens first (contexts of 250 to 700 positions: several of the
 * kernels' softmax steps), then two prompt chunks (one after a cached
 * prefix, one from position 0), the step told how many lone tokens lead
 * it (bk_seqs.lone). With chunks of 70 to 120 tokens both the tokens
 * after the lone ones and the whole step make the tiled kernel's
 * threshold: the CUDA backend answers the lone tokens with its one-row
 * walk and the chunks with the prefill kernel, and the step not told of
 * its lone tokens with the prefill kernel alone (at 20 query heads a
 * cache head, a tile of one token, both with the prefill kernel alone).
 * In the last case the chunks are short (8 to 12 tokens at 16 cache
 * heads of one query head: under a tile's worth a sequence, over the
 * rows a step is split at) and every token takes the one-row walk.
 * Checked as test_paged_prefill checks (the float64 reference, each
 * token alone, a hole and a lowered max_ctx), and every output the same
 * to the bit as the step's without lone. */
static void test_paged_mixed(void **state)
{
    (void)state;
    if (!have_device) skip();
    static const size_t shapes[][3] = {/* group, cache heads, dh */
                                       {1, 2, 64}, {4, 2, 128}, {8, 1, 80}, {20, 1, 64},
                                       {1, 16, 32}};
    size_t ns = sizeof(shapes) / sizeof(shapes[0]);
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        for (size_t c = 0; c < ns; c++) {
            int few = c == ns - 1; /* short chunks: under the threshold */
            struct pspec sp = {.group = shapes[c][0], .kvh = shapes[c][1], .dh = shapes[c][2],
                               .bt = rnd(1, 16), .rope = (int)(c % 2), .lone = rnd(3, 5)};
            sp.n = sp.lone + 2;
            size_t longest = 0;
            for (size_t i = 0; i < sp.n; i++) {
                sp.k[i] = i < sp.lone ? 1 : few ? rnd(8, 12) : rnd(70, 120);
                sp.past[i] = i < sp.lone ? rnd(250, 700) : i == sp.lone ? rnd(1, 300) : 0;
                if (sp.past[i] + sp.k[i] > longest) longest = sp.past[i] + sp.k[i];
            }
            sp.max_ctx = longest + rnd(0, 20);
            char label[32];
            snprintf(label, sizeof(label), "mixed #%zu", c);
            paged_run(e, &sp, label, 1);
        }
        env_free(e);
    }
}

/* Prefill steps as the engine packs them: several sequences' chunks one
 * after another, long ones with one-token ones (decode tokens) between
 * them, chunks that continue a cached prefix (of 200 to 500 positions:
 * contexts over several of the kernel's softmax steps) and chunks from
 * position 0, lengths that are not multiples of any tile; grouped-query
 * at 1, 3, 4, 8 and 20 query heads a cache head (20: more than a block
 * takes), heads of 64, 80, 96, 128 and 256 values; keys rotated in every other case. Enough tokens and
 * rows that the CUDA backend takes its prefill kernel (gpu/cuda_attn.cu:
 * tiles of up to 16 query rows, never split). Checked: every output
 * against the float64 reference within the file's tolerance (fp32 1e-4,
 * tf32 and fp16 2e-2, bf16 8e-2, times max(1, |ref|)); each token alone
 * (the one-row walk) gives the same bits; then a hole in the first
 * sequence's table and a max_ctx below the last positions: NaN exactly
 * for the rows they reach, the other rows still within tolerance. */
static void test_paged_prefill(void **state)
{
    (void)state;
    if (!have_device) skip();
    static const size_t shapes[][3] = {/* group, cache heads, dh */
                                       {1, 2, 64}, {4, 2, 128}, {8, 1, 80}, {1, 1, 256},
                                       {4, 1, 64}, {8, 2, 128}, {3, 2, 96},
                                       {20, 1, 64}}; /* 20: two blocks a cache head */
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        for (size_t c = 0; c < sizeof(shapes) / sizeof(shapes[0]); c++) {
            struct pspec sp = {.n = 6, .group = shapes[c][0], .kvh = shapes[c][1],
                               .dh = shapes[c][2], .bt = rnd(1, 16), .rope = (int)(c % 2)};
            /* long after a long prefix (contexts over several of the
             * kernel's softmax steps of 256 positions), 1 token, long
             * from 0, 1 token, 1 token, medium */
            static const size_t kmin[PMAX] = {17, 1, 33, 1, 1, 5};
            static const size_t kmax[PMAX] = {70, 1, 90, 1, 1, 40};
            static const size_t pmin[PMAX] = {200, 0, 0, 0, 0, 0};
            static const size_t pmax[PMAX] = {500, 60, 0, 300, 60, 300};
            size_t longest = 0, T = 0;
            for (size_t i = 0; i < sp.n; i++) {
                sp.k[i] = rnd(kmin[i], kmax[i]);
                sp.past[i] = rnd(pmin[i], pmax[i]);
                T += sp.k[i];
            }
            /* more rows than a decode step that the backend splits */
            if (T * sp.group * sp.kvh <= 256) sp.k[2] += 257 / (sp.group * sp.kvh) - T + 1;
            for (size_t i = 0; i < sp.n; i++)
                if (sp.past[i] + sp.k[i] > longest) longest = sp.past[i] + sp.k[i];
            sp.max_ctx = longest + rnd(0, 20);
            char label[32];
            snprintf(label, sizeof(label), "prefill #%zu", c);
            paged_run(e, &sp, label, 1);
        }
        env_free(e);
    }
}

static void test_rowwise(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        size_t rows = rnd(1, 20), w = rnd(1, 1000), n = rows * w;
        float *x = randv(e, n, -4, 4);
        double *ref = malloc(n * sizeof(double));
        void *dx = dev(e, n * e->es);
        for (int a = 0; a < BK_N_ACTS + 2; a++) {
            load(e, dx, x, n);
            begin(e);
            if (a < BK_N_ACTS) assert_int_equal(B->act(e->c, dx, n, (enum bk_act)a), 0);
            else if (a == BK_N_ACTS) assert_int_equal(B->softmax(e->c, dx, rows, w), 0);
            else assert_int_equal(B->l2norm(e->c, dx, rows, w), 0);
            end(e);
            for (size_t r = 0; r < rows; r++) {
                double m = -INFINITY, s = 0, q2 = 0;
                for (size_t j = 0; j < w; j++) {
                    double v = x[r * w + j];
                    m = fmax(m, v);
                    q2 += v * v;
                }
                for (size_t j = 0; j < w; j++) s += exp(x[r * w + j] - m);
                for (size_t j = 0; j < w; j++) {
                    double v = x[r * w + j];
                    ref[r * w + j] = a < BK_N_ACTS    ? act_ref(v, (enum bk_act)a)
                                     : a == BK_N_ACTS ? exp(v - m) / s
                                                      : v / fmax(sqrt(q2), 1e-12);
                }
            }
            float *got = fetch(e, dx, n);
            check(e, a < BK_N_ACTS ? "act" : a == BK_N_ACTS ? "softmax" : "l2norm", got, ref, n);
            free(got);
        }
        free(x), free(ref);
        env_free(e);
    }
}

static void test_pool(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 0);
        struct hseqs h;
        size_t w = rnd(1, 600);
        seqs_make(e, &h, rnd(1, 8), 20, 1, 1);
        float *x = randv(e, h.T * w, -2, 2);
        void *dx = dev(e, h.T * w * e->es), *dy = dev(e, h.n * w * e->es);
        load(e, dx, x, h.T * w);
        double *ref = malloc(h.n * w * sizeof(double));
        for (int mode = 0; mode < BK_N_POOLS; mode++) {
            begin(e);
            assert_int_equal(B->pool(e->c, dy, dx, &h.s, (enum bk_pool)mode, w), 0);
            end(e);
            for (size_t i = 0; i < h.n; i++)
                for (size_t j = 0; j < w; j++) {
                    size_t o = h.offs[i], len = h.offs[i + 1] - o;
                    double v = mode == BK_POOL_LAST ? x[(o + len - 1) * w + j] : x[o * w + j];
                    for (size_t t = 1; t < len; t++) {
                        if (mode == BK_POOL_MAX) v = fmax(v, x[(o + t) * w + j]);
                        if (mode == BK_POOL_MEAN) v += x[(o + t) * w + j];
                    }
                    ref[i * w + j] = mode == BK_POOL_MEAN ? v / (double)len : v;
                }
            float *got = fetch(e, dy, h.n * w);
            check(e, "pool", got, ref, h.n * w);
            free(got);
        }
        free(x), free(ref);
        seqs_free(&h);
        env_free(e);
    }
}

/* ---- graphs, refusals, fault ------------------------------------------------------------ */

/* A pass of a dense layer and a GELU under a graph key: the first run is
 * eager, the second captured, the third and later replayed; each time on
 * new inputs, loaded before graph_begin into the same buffers. */
static void test_graphs(void **state)
{
    (void)state;
    if (!have_device) skip();
    for (size_t p = 0; p < N_PRECS; p++) {
        struct env *e = env_new(precs[p], 1);
        size_t m = 24, n = 40, k = 32;
        float *W = randv(e, n * k, -1, 1), *bv = randv(e, n, -1, 1);
        struct bk_weight *w = weight(e, BK_W_ACT, W, n * k), *bw = weight(e, BK_W_ACT, bv, n);
        void *dA = dev(e, m * k * e->es), *dC = dev(e, m * n * e->es);
        float *hin = B->ctx_alloc(e->c, m * k * sizeof(float), 1);
        float *hout = B->ctx_alloc(e->c, m * n * sizeof(float), 1);
        assert_non_null(hin);
        assert_non_null(hout);
        double *ref = malloc(m * n * sizeof(double));
        const uint64_t key[2] = {m, 7};
        for (int it = 0; it < 5; it++) {
            float *A = randv(e, m * k, -1, 1);
            memcpy(hin, A, m * k * sizeof(float));
            begin(e);
            assert_int_equal(B->load_f32(e->c, dA, hin, m * k), 0);
            int g = B->graph_begin(e->c, key, sizeof(key));
            assert_int_equal(g, it >= 2 ? BK_GRAPH_REPLAYED : BK_GRAPH_RUN);
            if (g == BK_GRAPH_RUN) {
                struct bk_gemm gm = {.m = m, .n = n, .k = k, .a = dA, .w = w, .bias = bw,
                                     .act = BK_ACT_GELU, .c = dC};
                assert_int_equal(B->gemm(e->c, &gm), 0);
                assert_int_equal(B->graph_end(e->c), 0);
            }
            assert_int_equal(B->store_f32(e->c, hout, dC, m * n), 0);
            end(e);
            for (size_t i = 0; i < m; i++)
                for (size_t j = 0; j < n; j++) {
                    double s = bv[j];
                    for (size_t kk = 0; kk < k; kk++) s += (double)A[i * k + kk] * W[j * k + kk];
                    ref[i * n + j] = act_ref(s, BK_ACT_GELU);
                }
            check(e, "graph pass", hout, ref, m * n);
            free(A);
        }
        /* A key too long is refused, and fails its pass only. */
        unsigned char big[PLAN_KEY_MAX + 1] = {0};
        begin(e);
        assert_int_equal(B->graph_begin(e->c, big, sizeof(big)), MODEL_EINVAL);
        assert_int_equal(B->pass_end(e->c), MODEL_EINVAL);
        e->host_used = 0;
        B->weight_free(e->be, w);
        B->weight_free(e->be, bw);
        free(W), free(bv), free(ref);
        env_free(e);
    }
}

/* The environment test_refusals_and_fault leaves dead, kept reachable. */
struct env *volatile dead_env;

/* A refused call fails its pass only; ctx_alloc is refused during a pass;
 * an injected fault is MODEL_EFATAL, for good (last: it poisons the
 * process's CUDA context). */
static void test_refusals_and_fault(void **state)
{
    (void)state;
    if (!have_device) skip();
    struct env *e = env_new(MODEL_FP32, 0);
    void *d = dev(e, 64 * sizeof(float));
    struct bk_gemm bad = {.m = 4, .n = 4, .k = 4, .a = d, .b = d, .trans_b = 1, .c = d,
                          .ldc = 2};
    begin(e);
    assert_null(B->ctx_alloc(e->c, 16, 0));
    assert_int_equal(B->gemm(e->c, &bad), MODEL_EINVAL);
    assert_int_equal(B->pass_end(e->c), MODEL_EINVAL);
    assert_true(strlen(B->ctx_error(e->c)) > 0);
    begin(e);
    assert_int_equal(B->softmax(e->c, d, 4, 16), 0);
    end(e);
    /* passes in flight: two at most; one that fails at its submit is
     * waited for and returns its failure, the one before it staying in
     * flight and waited for on its own; a wait with none is refused */
    float h[64], back[64];
    for (int i = 0; i < 64; i++) h[i] = (float)i;
    begin(e);
    assert_int_equal(B->load_f32(e->c, d, h, 64), 0);
    assert_int_equal(B->softmax(e->c, d, 4, 16), 0);
    assert_int_equal(B->pass_submit(e->c), 0);
    begin(e);
    assert_int_equal(B->gemm(e->c, &bad), MODEL_EINVAL);
    assert_int_equal(B->pass_submit(e->c), MODEL_EINVAL);
    begin(e);
    assert_int_equal(B->store_f32(e->c, back, d, 64), 0);
    assert_int_equal(B->pass_submit(e->c), 0);
    assert_int_equal(B->pass_begin(e->c), MODEL_EINVAL); /* a third */
    assert_int_equal(B->pass_wait(e->c), 0);
    assert_int_equal(B->pass_wait(e->c), 0);
    assert_int_equal(B->pass_wait(e->c), MODEL_EINVAL);
    for (int r = 0; r < 4; r++) { /* the first pass's softmax, read by the third */
        double s = 0;
        for (int i = 0; i < 16; i++) s += back[r * 16 + i];
        assert_true(fabs(s - 1) < 1e-5 && back[r * 16 + 15] > back[r * 16]);
    }
    B->inject_fault(e->c);
    begin(e);
    assert_int_equal(B->softmax(e->c, d, 4, 16), 0);
    assert_int_equal(B->pass_end(e->c), MODEL_EFATAL);
    printf("  fault: %s\n", B->ctx_error(e->c));
    assert_int_equal(B->pass_begin(e->c), MODEL_EFATAL);
    assert_int_equal(B->softmax(e->c, d, 4, 16), MODEL_EFATAL);
    /* no env_free: the context is dead; the process exits next, and the
     * environment stays reachable (no leak for LeakSanitizer to report) */
    dead_env = e;
}

int main(int argc, char **argv)
{
    (void)argc;
    char what[256];
    if (!B->compiled_in || B->probe(what, sizeof(what)) <= 0)
        return tu_no_gpu("test_cuda_prims", B->compiled_in ? what : "not built with CUDA");
    have_device = 1;
    *(void **)&lt_refuse = dlsym(RTLD_DEFAULT, "emu_lt_refuse");
    *(void **)&lt_count = dlsym(RTLD_DEFAULT, "emu_lt_matmuls");
    fprintf(stderr, "test_cuda_prims: %s\n", what); /* the device (or "emulated") */
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),      cmocka_unit_test(test_gemm_fallback),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_embed),     cmocka_unit_test(test_attention),
        cmocka_unit_test(test_rope),      cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_paged),     cmocka_unit_test(test_paged_prefill),
        cmocka_unit_test(test_paged_mixed),
        cmocka_unit_test(test_rowwise),
        cmocka_unit_test(test_pool),      cmocka_unit_test(test_graphs),
        cmocka_unit_test(test_refusals_and_fault),
    };
    /* $KINFER_TEST_FILTER: only the cases whose names match (cmocka's
     * pattern, e.g. test_gemm), as tests/emu_bugs.sh runs them. */
    const char *only = getenv("KINFER_TEST_FILTER");
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

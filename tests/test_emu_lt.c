/* test_emu_lt.c - the emulated cuBLASLt (emu/emu_lt.c) on its own: every
 * GEMM shape kinfer's CUDA backend asks for (gpu/cuda_lt.c: TRANSA N or T,
 * TRANSB N, padded leading dimensions, strided batches, every epilogue it
 * uses, R_32F/R_16F/R_16BF with float32 compute, and TF32), called the way
 * cuda_lt.c calls it (descriptor, layouts, preference alignments,
 * heuristic, matmul); fp32 results checked against OpenBLAS's
 * cblas_sgemm (column-major, the same BLAS semantics), epilogues and
 * 16-bit types against a float64 reference; then a table of calls the
 * library documents as refused, each with its status code.
 *
 * Inputs are multiples of 1/64 in [-2, 2], exact in fp16, bf16 and TF32,
 * so the references see what the emulated device sees; TF32's rounding is
 * checked by a case of its own. Tolerance |got - ref| <= tol * max(1,
 * |ref|): fp32 1e-4, fp16 2e-3, bf16 1e-2 (the output's rounding).
 *
 * Built only where CUDA's headers are (make test links emu/emu_lt.o into
 * it, never into kinfer). Single-threaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../emu/emu_lt.h"
#include "testutil.h"

/* ---- data ----------------------------------------------------------------- */

static size_t rnd(size_t lo, size_t hi)
{
    return lo + (size_t)(tu_rand64() % (hi - lo + 1));
}

static size_t esize(cudaDataType_t t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

/* Exact for the inputs used (normal, at most 8 significant bits). */
static uint16_t enc16(cudaDataType_t t, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if (t == CUDA_R_16BF) return (uint16_t)(u >> 16);
    if ((u & 0x7fffffffu) == 0) return (uint16_t)(u >> 16);
    return (uint16_t)(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112u) << 10) |
                      ((u >> 13) & 0x3ffu));
}

static double dec(cudaDataType_t t, const void *p, size_t i)
{
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (t == CUDA_R_16BF) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
    }
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return (h & 0x8000) ? -v : v;
}

/* n values (float, for the references) and the same in t's storage,
 * 256-byte aligned (what cuBLASLt assumes unless told). */
static float *randv(size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) f[i] = (float)((int)rnd(0, 256) - 128) / 64.0f;
    return f;
}

static void *store(cudaDataType_t t, const float *f, size_t n)
{
    size_t bytes = ((n ? n : 1) * esize(t) + 255) / 256 * 256;
    void *p = aligned_alloc(256, bytes);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        if (t == CUDA_R_32F)
            ((float *)p)[i] = f[i];
        else
            ((uint16_t *)p)[i] = enc16(t, f[i]);
    }
    return p;
}

/* ---- one GEMM as gpu/cuda_lt.c sets it up ------------------------------------ */

struct gcase {
    cudaDataType_t t;
    int tf32;
    int ta, tb;            /* TRANSA, TRANSB: 1 = T */
    int pad;               /* leading dimensions padded */
    int32_t batch;
    uint32_t epi;
    float alpha, beta;
};

static double act(uint32_t epi, double v)
{
    if (epi & CUBLASLT_EPILOGUE_RELU) return v > 0 ? v : 0;
    if (epi & CUBLASLT_EPILOGUE_GELU)
        return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    return v;
}

static cublasLtMatrixLayout_t mklayout(cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                                       int32_t batch, int64_t stride)
{
    cublasLtMatrixLayout_t l;
    assert_int_equal(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
    if (batch > 1) {
        assert_int_equal(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                          &batch, sizeof(batch)), 0);
        assert_int_equal(cublasLtMatrixLayoutSetAttribute(
                             l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                             sizeof(stride)), 0);
    }
    return l;
}

static double worst[3];

static void gemm_case(cublasLtHandle_t h, const struct gcase *gc)
{
    size_t m = rnd(1, 40), n = rnd(1, 40), k = rnd(1, 70);
    if (rnd(0, 5) == 0) m = 1; /* the one-row bucket */
    size_t ar = gc->ta ? k : m, ac = gc->ta ? m : k, br = gc->tb ? n : k, bc = gc->tb ? k : n;
    size_t lda = ar + (gc->pad ? rnd(0, 5) : 0), ldb = br + (gc->pad ? rnd(0, 5) : 0),
           ldc = m + (gc->pad ? rnd(0, 5) : 0);
    int32_t batch = gc->batch;
    size_t sa = lda * ac + (gc->pad ? rnd(0, 7) : 0), sb = ldb * bc + (gc->pad ? rnd(0, 7) : 0),
           sc = ldc * n + (gc->pad ? rnd(0, 7) : 0), sbias = batch > 1 && rnd(0, 1) ? m : 0;
    float *fa = randv(sa * (size_t)batch), *fb = randv(sb * (size_t)batch);
    float *fc = randv(sc * (size_t)batch), *fbias = randv(m * (size_t)batch);
    void *A = store(gc->t, fa, sa * (size_t)batch), *B = store(gc->t, fb, sb * (size_t)batch);
    void *C = store(gc->t, fc, sc * (size_t)batch), *bias = store(gc->t, fbias, m * (size_t)batch);

    cublasLtMatmulDesc_t d;
    cublasComputeType_t ct = gc->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    assert_int_equal(cublasLtMatmulDescCreate(&d, ct, CUDA_R_32F), 0);
    cublasOperation_t ta = gc->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = gc->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    assert_int_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), 0);
    assert_int_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), 0);
    cublasLtEpilogue_t epi = gc->epi;
    assert_int_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof(epi)), 0);
    if (epi & CUBLASLT_EPILOGUE_BIAS) {
        assert_int_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof(bias)), 0);
        int64_t s = (int64_t)sbias;
        assert_int_equal(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                        &s, sizeof(s)), 0);
    }
    cublasLtMatrixLayout_t la = mklayout(gc->t, ar, ac, (int64_t)lda, batch, (int64_t)sa);
    cublasLtMatrixLayout_t lb = mklayout(gc->t, br, bc, (int64_t)ldb, batch, (int64_t)sb);
    cublasLtMatrixLayout_t lc = mklayout(gc->t, m, n, (int64_t)ldc, batch, (int64_t)sc);
    cublasLtMatmulPreference_t pref;
    assert_int_equal(cublasLtMatmulPreferenceCreate(&pref), 0);
    size_t ws_bytes = 1 << 20;
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                         sizeof(ws_bytes)), 0);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    assert_int_equal(cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 1, &r, &found), 0);
    assert_int_equal(found, 1);
    assert_int_equal(r.state, CUBLAS_STATUS_SUCCESS);
    void *ws = malloc(ws_bytes);
    /* D in place of C, as kinfer calls it (beta 0) or with beta: C kept. */
    void *D = gc->beta != 0.0f ? store(gc->t, fc, sc * (size_t)batch) : C;
    assert_int_equal(cublasLtMatmul(h, d, &gc->alpha, A, la, B, lb, &gc->beta, C, lc, D, lc,
                                    &r.algo, ws, ws_bytes, NULL), CUBLAS_STATUS_SUCCESS);

    /* OpenBLAS for the plain fp32 product, float64 otherwise. */
    float *blas = NULL;
    if (gc->t == CUDA_R_32F && !gc->tf32 && gc->epi == CUBLASLT_EPILOGUE_DEFAULT) {
        blas = malloc(sc * (size_t)batch * sizeof(float));
        memcpy(blas, fc, sc * (size_t)batch * sizeof(float));
        for (int32_t b = 0; b < batch; b++)
            cblas_sgemm(CblasColMajor, gc->ta ? CblasTrans : CblasNoTrans,
                        gc->tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, gc->alpha,
                        fa + (size_t)b * sa, (int)lda, fb + (size_t)b * sb, (int)ldb, gc->beta,
                        blas + (size_t)b * sc, (int)ldc);
    }
    double tol = gc->t == CUDA_R_32F ? 1e-4 : gc->t == CUDA_R_16F ? 2e-3 : 1e-2;
    int ti = gc->t == CUDA_R_32F ? 0 : gc->t == CUDA_R_16F ? 1 : 2;
    for (int32_t b = 0; b < batch; b++)
        for (size_t j = 0; j < n; j++)
            for (size_t i = 0; i < m; i++) {
                size_t o = (size_t)b * sc + i + j * ldc;
                double ref;
                if (blas) {
                    ref = blas[o];
                } else {
                    double s = 0;
                    for (size_t l = 0; l < k; l++) {
                        double x = fa[(size_t)b * sa + (gc->ta ? l + i * lda : i + l * lda)];
                        double y = fb[(size_t)b * sb + (gc->tb ? j + l * ldb : l + j * ldb)];
                        s += x * y;
                    }
                    ref = gc->alpha * s + gc->beta * fc[o];
                    if (gc->epi & CUBLASLT_EPILOGUE_BIAS) ref += fbias[(size_t)b * sbias + i];
                    ref = act(gc->epi, ref);
                }
                double got = dec(gc->t, D, o), err = fabs(got - ref) / fmax(1.0, fabs(ref));
                if (err > worst[ti]) worst[ti] = err;
                if (err > tol)
                    fail_msg("type %d tf32 %d ta %d tb %d epi %u batch %d: %zux%zux%zu "
                             "[%d](%zu,%zu) got %g want %g", (int)gc->t, gc->tf32, gc->ta, gc->tb,
                             gc->epi, batch, m, n, k, b, i, j, got, ref);
            }
    /* The padding between columns and matrices is left as it was. */
    for (int32_t b = 0; b < batch; b++)
        for (size_t rel = 0; rel < sc; rel++)
            if (rel % ldc >= m || rel / ldc >= n) {
                size_t o = (size_t)b * sc + rel;
                assert_true(dec(gc->t, D, o) == (double)fc[o]);
            }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
    if (D != C) free(D);
    free(ws);
    free(blas);
    free(A);
    free(B);
    free(C);
    free(bias);
    free(fa);
    free(fb);
    free(fc);
    free(fbias);
}

static const uint32_t epis[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_RELU,
                                CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS,
                                CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS};

static void test_gemm(void **state)
{
    (void)state;
    cublasLtHandle_t h;
    assert_int_equal(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    const cudaDataType_t types[] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
    unsigned long before = emu_lt_matmuls(), cases = 0;
    for (size_t t = 0; t < 3; t++)
        for (int tf32 = 0; tf32 <= (types[t] == CUDA_R_32F); tf32++)
            for (int ta = 0; ta <= 1; ta++)
                for (int tb = 0; tb <= 1; tb++)
                    for (int pad = 0; pad <= 1; pad++)
                        for (int32_t batch = 1; batch <= 3; batch += 2)
                            for (size_t e = 0; e < sizeof(epis) / sizeof(epis[0]); e++)
                                for (int beta = 0; beta <= 1; beta++) {
                                    struct gcase gc = {types[t], tf32, ta, tb, pad, batch,
                                                       epis[e], beta ? 0.5f : 1.0f,
                                                       beta ? -1.5f : 0.0f};
                                    gemm_case(h, &gc);
                                    cases++;
                                }
    assert_int_equal(emu_lt_matmuls() - before, cases);
    fprintf(stderr, "test_emu_lt: %lu GEMMs, worst error / tolerance: fp32 %.3g, fp16 %.3g, "
            "bf16 %.3g\n", cases, worst[0] / 1e-4, worst[1] / 2e-3, worst[2] / 1e-2);
    assert_int_equal(cublasLtDestroy(h), CUBLAS_STATUS_SUCCESS);
}

/* TF32 keeps 10 mantissa bits: 1 + 2^-12 times 1 is 1 there, not in fp32. */
static void test_tf32(void **state)
{
    (void)state;
    cublasLtHandle_t h;
    assert_int_equal(cublasLtCreate(&h), 0);
    for (int tf32 = 0; tf32 <= 1; tf32++) {
        float *a = aligned_alloc(256, 256), *b = aligned_alloc(256, 256), *c = aligned_alloc(256, 256);
        a[0] = 1.0f + ldexpf(1.0f, -12);
        b[0] = 1.0f;
        cublasLtMatmulDesc_t d;
        assert_int_equal(cublasLtMatmulDescCreate(&d, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                           : CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
        cublasLtMatrixLayout_t l = mklayout(CUDA_R_32F, 1, 1, 1, 1, 0);
        float one = 1.0f, zero = 0.0f;
        assert_int_equal(cublasLtMatmul(h, d, &one, a, l, b, l, &zero, c, l, c, l, NULL, NULL, 0,
                                        NULL), 0);
        assert_true(c[0] == (tf32 ? 1.0f : a[0]));
        cublasLtMatrixLayoutDestroy(l);
        cublasLtMatmulDescDestroy(d);
        free(a);
        free(b);
        free(c);
    }
    cublasLtDestroy(h);
}

/* ---- refusals ----------------------------------------------------------------- */

/* A valid 8 x 4 x 6 fp32 set-up (D = op(A) B, A 6 x 8 with TRANSA T, as
 * kinfer's weights), which each refusal then breaks in one way. */
struct setup {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    float *a, *b, *c, *bias;
};

static void setup_make(struct setup *s, uint32_t epi)
{
    memset(s, 0, sizeof(*s));
    assert_int_equal(cublasLtCreate(&s->h), 0);
    assert_int_equal(cublasLtMatmulDescCreate(&s->d, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    cublasOperation_t t = CUBLAS_OP_T;
    assert_int_equal(cublasLtMatmulDescSetAttribute(s->d, CUBLASLT_MATMUL_DESC_TRANSA, &t,
                                                    sizeof(t)), 0);
    assert_int_equal(cublasLtMatmulDescSetAttribute(s->d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof(epi)), 0);
    s->a = aligned_alloc(256, 1024);
    s->b = aligned_alloc(256, 1024);
    s->c = aligned_alloc(256, 1024);
    s->bias = aligned_alloc(256, 256);
    for (int i = 0; i < 256; i++) s->a[i] = s->b[i] = s->c[i] = 0.25f;
    for (int i = 0; i < 64; i++) s->bias[i] = 1.0f;
    if (epi & CUBLASLT_EPILOGUE_BIAS)
        assert_int_equal(cublasLtMatmulDescSetAttribute(s->d, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &s->bias, sizeof(s->bias)), 0);
    s->la = mklayout(CUDA_R_32F, 6, 8, 6, 1, 0);
    s->lb = mklayout(CUDA_R_32F, 6, 4, 6, 1, 0);
    s->lc = mklayout(CUDA_R_32F, 8, 4, 8, 1, 0);
    assert_int_equal(cublasLtMatmulPreferenceCreate(&s->pref), 0);
}

static void setup_free(struct setup *s)
{
    cublasLtMatmulPreferenceDestroy(s->pref);
    cublasLtMatrixLayoutDestroy(s->la);
    cublasLtMatrixLayoutDestroy(s->lb);
    cublasLtMatrixLayoutDestroy(s->lc);
    cublasLtMatmulDescDestroy(s->d);
    cublasLtDestroy(s->h);
    free(s->a);
    free(s->b);
    free(s->c);
    free(s->bias);
}

static cublasStatus_t heur(struct setup *s, cublasLtMatmulHeuristicResult_t *r)
{
    int n = 0;
    return cublasLtMatmulAlgoGetHeuristic(s->h, s->d, s->la, s->lb, s->lc, s->lc, s->pref, 1, r, &n);
}

static cublasStatus_t run(struct setup *s, const cublasLtMatmulAlgo_t *algo, const void *a,
                          void *c)
{
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(s->h, s->d, &one, a, s->la, s->b, s->lb, &zero, c, s->lc, c, s->lc,
                          algo, NULL, 0, NULL);
}

/* Each row breaks the set-up one way; heuristic and matmul then answer. */
enum breakage {
    BR_NONE, BR_LD_A, BR_LD_C, BR_SHAPE, BR_BATCH, BR_EPI_AUX, BR_TF32_F16, BR_BIAS_TYPE,
    BR_TRANSC, BR_ORDER, BR_ALIGN_PREF, BR_MISALIGNED, BR_ODD_PTR, BR_ALGO_EPI, BR_BIAS_NULL,
    BR_N
};

static const struct {
    enum breakage br;
    const char *what;
    cublasStatus_t heur, mm;
} refusals[] = {
    {BR_NONE, "a valid call", CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_SUCCESS},
    {BR_LD_A, "A's ld under its rows", CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_INVALID_VALUE},
    {BR_LD_C, "C's ld under its rows", CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_INVALID_VALUE},
    {BR_SHAPE, "k of A and B differ", CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_INVALID_VALUE},
    {BR_BATCH, "batch counts differ", CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_INVALID_VALUE},
    {BR_EPI_AUX, "an epilogue not emulated", CUBLAS_STATUS_NOT_SUPPORTED,
     CUBLAS_STATUS_NOT_SUPPORTED},
    {BR_TF32_F16, "TF32 compute on fp16", CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_NOT_SUPPORTED},
    {BR_BIAS_TYPE, "a bias type not D's", CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_NOT_SUPPORTED},
    {BR_TRANSC, "TRANSC T", CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_NOT_SUPPORTED},
    {BR_ORDER, "a row-major layout", CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_NOT_SUPPORTED},
    {BR_ALIGN_PREF, "a preferred alignment under the element", CUBLAS_STATUS_NOT_SUPPORTED,
     CUBLAS_STATUS_SUCCESS},
    {BR_MISALIGNED, "A less aligned than the algorithm assumes", CUBLAS_STATUS_SUCCESS,
     CUBLAS_STATUS_INVALID_VALUE},
    {BR_ODD_PTR, "C not element aligned", CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_INVALID_VALUE},
    {BR_ALGO_EPI, "an algorithm chosen for another epilogue", CUBLAS_STATUS_SUCCESS,
     CUBLAS_STATUS_INVALID_VALUE},
    {BR_BIAS_NULL, "a bias epilogue without a bias", CUBLAS_STATUS_SUCCESS,
     CUBLAS_STATUS_INVALID_VALUE},
};

static void test_refusals(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        struct setup s;
        enum breakage br = refusals[i].br;
        setup_make(&s, br == BR_BIAS_TYPE || br == BR_BIAS_NULL ? CUBLASLT_EPILOGUE_BIAS
                                                                : CUBLASLT_EPILOGUE_DEFAULT);
        const float *a = s.a;
        float *c = s.c;
        int64_t v64;
        int32_t v32;
        uint32_t u32;
        switch (br) {
        case BR_LD_A: v64 = 5; cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_LD, &v64, 8); break;
        case BR_LD_C: v64 = 7; cublasLtMatrixLayoutSetAttribute(s.lc, CUBLASLT_MATRIX_LAYOUT_LD, &v64, 8); break;
        case BR_SHAPE: {
            uint64_t rows = 5;
            cublasLtMatrixLayoutSetAttribute(s.lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, 8);
            break;
        }
        case BR_BATCH: v32 = 2; cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &v32, 4); break;
        case BR_EPI_AUX: u32 = CUBLASLT_EPILOGUE_RELU_AUX; cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &u32, 4); break;
        case BR_TF32_F16:
            v32 = CUBLAS_COMPUTE_32F_FAST_TF32;
            cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &v32, 4);
            u32 = CUDA_R_16F;
            cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_TYPE, &u32, 4);
            cublasLtMatrixLayoutSetAttribute(s.lb, CUBLASLT_MATRIX_LAYOUT_TYPE, &u32, 4);
            cublasLtMatrixLayoutSetAttribute(s.lc, CUBLASLT_MATRIX_LAYOUT_TYPE, &u32, 4);
            break;
        case BR_BIAS_TYPE: v32 = CUDA_R_16F; cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &v32, 4); break;
        case BR_TRANSC: v32 = CUBLAS_OP_T; cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_TRANSC, &v32, 4); break;
        case BR_ORDER: v32 = CUBLASLT_ORDER_ROW; cublasLtMatrixLayoutSetAttribute(s.lc, CUBLASLT_MATRIX_LAYOUT_ORDER, &v32, 4); break;
        case BR_ALIGN_PREF: u32 = 2; cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &u32, 4); break;
        case BR_MISALIGNED: a = s.a + 4; break;
        case BR_ODD_PTR: c = (float *)(void *)((char *)s.c + 2); break;
        case BR_BIAS_NULL: break;
        default: break;
        }
        cublasLtMatmulHeuristicResult_t r;
        memset(&r, 0, sizeof(r));
        cublasStatus_t hs = heur(&s, &r);
        if (hs != refusals[i].heur)
            fail_msg("%s: heuristic %s, want %s", refusals[i].what, cublasLtGetStatusName(hs),
                     cublasLtGetStatusName(refusals[i].heur));
        const cublasLtMatmulAlgo_t *algo = hs == CUBLAS_STATUS_SUCCESS ? &r.algo : NULL;
        if (br == BR_ALGO_EPI) {
            u32 = CUBLASLT_EPILOGUE_RELU;
            cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &u32, 4);
        }
        if (br == BR_BIAS_NULL) {
            const void *none = NULL;
            cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &none,
                                           sizeof(none));
        }
        cublasStatus_t ms = run(&s, algo, a, c);
        if (ms != refusals[i].mm)
            fail_msg("%s: matmul %s, want %s", refusals[i].what, cublasLtGetStatusName(ms),
                     cublasLtGetStatusName(refusals[i].mm));
        if (br == BR_NONE)
            for (int j = 0; j < 32; j++) assert_true(s.c[j] == 6 * 0.0625f);
        setup_free(&s);
    }
}

/* Attribute setters: NULL buffers and wrong sizes, as documented. */
static void test_attributes(void **state)
{
    (void)state;
    struct setup s;
    setup_make(&s, CUBLASLT_EPILOGUE_DEFAULT);
    int32_t v = 0;
    int64_t w = 0;
    assert_int_equal(cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 4),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatmulDescSetAttribute(s.d, CUBLASLT_MATMUL_DESC_TRANSA, &w, 8),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &w, 8), CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatrixLayoutSetAttribute(s.la, CUBLASLT_MATRIX_LAYOUT_LD, &v, 4),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &v, 4),
                     CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulHeuristicResult_t r;
    int n = 7;
    assert_int_equal(cublasLtMatmulAlgoGetHeuristic(s.h, s.d, s.la, s.lb, s.lc, s.lc, s.pref, 0,
                                                    &r, &n), CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatmulAlgoGetHeuristic(NULL, s.d, s.la, s.lb, s.lc, s.lc, s.pref, 1,
                                                    &r, &n), CUBLAS_STATUS_NOT_INITIALIZED);
    assert_string_equal(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED),
                        "CUBLAS_STATUS_NOT_SUPPORTED");
    assert_true(cublasLtGetVersion() / 10000 == CUBLAS_VER_MAJOR);
    setup_free(&s);
}

int main(void)
{
    tu_seed("test_emu_lt");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_tf32),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_attributes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_cpu_amx.c - the CPU backend's bfloat16 products on AMX tiles
 * (gpu/cpu_amx.c) and its "bf16" precision, against float64 references
 * written here, on fresh random shapes and values each run (the seed is
 * printed; KINFER_TEST_SEED replays it).
 *
 * Proves:
 * - packing: every element of a matrix packed in pieces (float32,
 *   bfloat16 and float16 rows, any row split, rows and columns off the
 *   16 x 32 blocks) reads back through cpu_amx_row as its value rounded
 *   to bfloat16 (to nearest even), exactly;
 * - cpu_amx_mm (where the CPU has the tiles; else said and skipped):
 *   C = bf16(A) W^T + bias for m, n, k from 1 (every tail of the 16-row
 *   blocks, the 2 x 2 tile blocks, the 32-column steps and the 256-row
 *   chunks of A), strided A and C (the columns past n left alone), no
 *   bias, an epilogue run once on every value, one and two threads; one
 *   row of A (its loop without the tiles) on every tail the same way.
 *   Tolerance: |got - ref| <= (k + 20) 2^-24 (sum_k |a w| + |bias|), the
 *   bound of float32 sums of exact products (ref: the float64 sum of the
 *   rounded values);
 * - the backend in bf16: a weight stacked from two tensors (float32,
 *   bfloat16, float16) gives C = A W^T + bias, ReLU or the erf GELU
 *   applied, alpha scaling, for few and many rows, on the tiles (A
 *   rounded) and with the tiles turned off (the bfloat16 weight widened,
 *   A exact); the same tolerance against the matching reference (GELU's:
 *   1.13 times it, its largest slope, plus 6e-7 of the value). */
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
#include "../gpu/cpu_amx.h"
#include "../gpu/safetensors.h"
#include "testutil.h"

static size_t irand(size_t lo, size_t hi)
{
    return lo + (size_t)(tu_rand64() % (uint64_t)(hi - lo + 1));
}

static double bf16_of(float f)
{
    return st_bf16_to_f32(st_f32_to_bf16(f));
}

/* n words of kind holding values in [-1, 1]; their float32 values into f. */
static void *make_raw(enum cpu_wkind kind, size_t n, float *f)
{
    void *raw = malloc(n * 4 + 4);
    assert_non_null(raw);
    for (size_t i = 0; i < n; i++) {
        float v = tu_randf(-1.0f, 1.0f);
        if (kind == CPU_W_F32) {
            ((float *)raw)[i] = v;
        } else if (kind == CPU_W_BF16) {
            ((uint16_t *)raw)[i] = st_f32_to_bf16(v);
            v = st_bf16_to_f32(((uint16_t *)raw)[i]);
        } else {
            ((uint16_t *)raw)[i] = st_f32_to_f16(v);
            v = st_f16_to_f32(((uint16_t *)raw)[i]);
        }
        f[i] = v;
    }
    return raw;
}

static void test_pack(void **state)
{
    (void)state;
    for (int round = 0; round < 30; round++) {
        enum cpu_wkind kind = (enum cpu_wkind)(round % 3);
        size_t rows = irand(1, 70), cols = irand(1, 150);
        float *f = malloc(rows * cols * sizeof(float));
        assert_non_null(f);
        void *raw = make_raw(kind, rows * cols, f);
        uint16_t *p = calloc(cpu_amx_packed_elems(rows, cols), sizeof(uint16_t));
        assert_non_null(p);
        size_t split = irand(0, rows), esz = kind == CPU_W_F32 ? 4 : 2;
        cpu_amx_pack(p, rows, cols, 0, split, raw, kind);
        cpu_amx_pack(p, rows, cols, split, rows - split, (char *)raw + split * cols * esz, kind);
        float *row = malloc(cols * sizeof(float));
        assert_non_null(row);
        for (size_t r = 0; r < rows; r++) {
            cpu_amx_row(row, p, rows, cols, r);
            for (size_t c = 0; c < cols; c++)
                if ((double)row[c] != bf16_of(f[r * cols + c]))
                    fail_msg("kind %d %zux%zu: element (%zu, %zu) reads %.9g, want %.9g",
                             (int)kind, rows, cols, r, c, (double)row[c],
                             bf16_of(f[r * cols + c]));
        }
        /* The padding is zero: as many nonzero words as nonzero elements. */
        size_t nz = 0, want = 0;
        for (size_t i = 0; i < cpu_amx_packed_elems(rows, cols); i++) nz += p[i] != 0;
        for (size_t i = 0; i < rows * cols; i++) want += st_f32_to_bf16(f[i]) != 0;
        assert_int_equal(nz, want);
        free(row);
        free(p);
        free(raw);
        free(f);
    }
}

/* The test's epilogue: x -> 2x + 1, and a count of the values it saw. */
static void twice_plus_one(float *x, size_t n, const void *arg)
{
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * x[i] + 1.0f;
    __atomic_add_fetch((size_t *)(uintptr_t)arg, n, __ATOMIC_RELAXED);
}

/* One product of the given shape against the float64 reference; with_epi
 * runs twice_plus_one on every value, once. */
static void check_mm(size_t m, size_t n, size_t k, int with_bias, int with_epi)
{
    size_t lda = k + irand(0, 3), ldc = n + irand(0, 3);
    float *wf = malloc(n * k * sizeof(float)), *a = malloc(m * lda * sizeof(float));
    float *c = malloc(m * ldc * sizeof(float)), *bias = malloc(n * sizeof(float));
    assert_true(wf && a && c && bias);
    void *raw = make_raw(CPU_W_F32, n * k, wf);
    uint16_t *p = calloc(cpu_amx_packed_elems(n, k), sizeof(uint16_t));
    void *scratch = aligned_alloc(64, (cpu_amx_scratch_size(m, k) + 63) / 64 * 64);
    assert_true(p && scratch);
    cpu_amx_pack(p, n, k, 0, n, raw, CPU_W_F32);
    for (size_t i = 0; i < m * lda; i++) a[i] = tu_randf(-1.0f, 1.0f);
    for (size_t j = 0; j < n; j++) bias[j] = tu_randf(-1.0f, 1.0f);
    for (size_t i = 0; i < m * ldc; i++) c[i] = 12345.0f;
    size_t seen = 0;
    struct cpu_amx_epi epi = {twice_plus_one, &seen};
    cpu_amx_mm(m, n, k, a, lda, p, n, with_bias ? bias : NULL, with_epi ? &epi : NULL, c, ldc,
               scratch);
    assert_int_equal(seen, with_epi ? m * n : 0);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            double ref = with_bias ? bias[j] : 0, mag = fabs(ref);
            for (size_t e = 0; e < k; e++) {
                double t = bf16_of(a[i * lda + e]) * bf16_of(wf[j * k + e]);
                ref += t;
                mag += fabs(t);
            }
            double tol = ((double)k + 20.0) * ldexp(1.0, -24) * mag + 1e-30;
            if (with_epi) {
                ref = 2.0 * ref + 1.0;
                tol = 2.0 * tol + ldexp(1.0, -23) * fabs(ref);
            }
            if (!(fabs((double)c[i * ldc + j] - ref) <= tol))
                fail_msg("%zux%zux%zu bias %d epi %d: C[%zu,%zu] = %.9g, reference %.9g", m, n,
                         k, with_bias, with_epi, i, j, (double)c[i * ldc + j], ref);
        }
        for (size_t j = n; j < ldc; j++) assert_true(c[i * ldc + j] == 12345.0f);
    }
    free(scratch);
    free(p);
    free(raw);
    free(wf);
    free(a);
    free(c);
    free(bias);
}

static void test_mm(void **state)
{
    (void)state;
    if (!cpu_amx_ready()) {
        printf("  cpu_amx_mm: skipped, this CPU has no AMX tiles the process may use\n");
        skip();
    }
    for (int threads = 1; threads <= 2; threads++) {
        cpu_mm_threads(threads);
        for (int round = 0; round < 40; round++) {
            check_mm(irand(1, 70), irand(1, 100), irand(1, 200), round % 4 != 0, round % 3 == 0);
            check_mm(1, irand(1, 100), irand(1, 200), round % 2, round % 3 == 0); /* no tiles */
        }
        check_mm(irand(257, 600), irand(33, 200), irand(200, 700), 1, 1); /* chunks, the pool */
        check_mm(1, irand(600, 1200), irand(300, 700), 1, 0);             /* a decode row */
    }
    cpu_mm_threads(1);
}

/* The backend with worker.cpu_precision "bf16": a two-piece weight. */
static void backend_round(const struct backend_ops *o, void *be, void *c, int amx)
{
    enum cpu_wkind kind = (enum cpu_wkind)irand(0, 2);
    size_t m = irand(0, 1) ? irand(1, 8) : irand(65, 300), n1 = irand(1, 60),
           n2 = irand(1, 60), n = n1 + n2, k = irand(1, 200);
    float *wf = malloc(n * k * sizeof(float)), *bias_h = malloc(n * sizeof(float));
    assert_true(wf && bias_h);
    void *raw = make_raw(kind, n * k, wf);
    enum st_dtype dt = kind == CPU_W_F32 ? ST_F32 : kind == CPU_W_BF16 ? ST_BF16 : ST_F16;
    size_t esz = kind == CPU_W_F32 ? 4 : 2;
    struct st_tensor t[2] = {
        {.name = "w1", .dtype = dt, .ndim = 2, .shape = {n1, k}, .numel = n1 * k, .data = raw,
         .nbytes = n1 * k * esz},
        {.name = "w2", .dtype = dt, .ndim = 2, .shape = {n2, k}, .numel = n2 * k,
         .data = (const unsigned char *)raw + n1 * k * esz, .nbytes = n2 * k * esz}};
    struct bk_wsrc src[2] = {{.t = &t[0]}, {.t = &t[1]}};
    for (size_t j = 0; j < n; j++) bias_h[j] = tu_randf(-1.0f, 1.0f);
    struct bk_wsrc bsrc = {.f = bias_h, .n = n};
    char err[256];
    struct bk_weight *w = o->weight_new(be, 0, BK_W_ACT, src, 2, err, sizeof(err));
    struct bk_weight *b = o->weight_new(be, 0, BK_W_ACT, &bsrc, 1, err, sizeof(err));
    assert_true(w && b);
    float *a = o->ctx_alloc(c, m * k * sizeof(float), 0);
    float *out = o->ctx_alloc(c, m * n * sizeof(float), 0);
    assert_true(a && out);
    for (size_t i = 0; i < m * k; i++) a[i] = tu_randf(-1.0f, 1.0f);
    float alpha = irand(0, 1) ? 1.0f : 0.5f;
    enum bk_act act = irand(0, 1) ? BK_ACT_RELU : BK_ACT_GELU;
    struct bk_gemm g = {.m = m, .n = n, .k = k, .a = a, .w = w, .bias = b, .alpha = alpha,
                        .act = act, .c = out};
    assert_int_equal(o->pass_begin(c), 0);
    assert_int_equal(o->gemm(c, &g), 0);
    assert_int_equal(o->pass_end(c), 0);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (size_t e = 0; e < k; e++) {
                double x = amx ? bf16_of(a[i * k + e]) : (double)a[i * k + e];
                double tt = x * bf16_of(wf[j * k + e]);
                ref += tt;
                mag += fabs(tt);
            }
            ref = alpha * ref + bias_h[j];
            mag = alpha * mag + fabs(bias_h[j]);
            double tol = ((double)k + 20.0) * ldexp(1.0, -24) * mag + 1e-30;
            if (act == BK_ACT_RELU) {
                ref = ref > 0 ? ref : 0;
            } else { /* the erf GELU: slope at most 1.13, within 6e-7 of itself */
                ref = 0.5 * ref * erfc(-ref / sqrt(2.0));
                tol = 1.13 * tol + 6e-7 * fabs(ref) + 1e-30;
            }
            if (!(fabs((double)out[i * n + j] - ref) <= tol))
                fail_msg("bf16 gemm (tiles %d) kind %d %zux%zux%zu alpha %g: C[%zu,%zu] = %.9g, "
                         "reference %.9g", amx, (int)kind, m, n, k, (double)alpha, i, j,
                         (double)out[i * n + j], ref);
        }
    o->weight_free(be, w);
    o->weight_free(be, b);
    free(raw);
    free(wf);
    free(bias_h);
}

static void test_backend_bf16(void **state)
{
    (void)state;
    const struct backend_ops *o = &backend_cpu;
    int has = cpu_amx_ready();
    for (int amx = has; amx >= 0; amx--) {
        cpu_amx_allow(amx);
        struct model_runtime_conf rc;
        model_runtime_conf_defaults(&rc);
        rc.backend = "cpu";
        rc.cpu_threads = 2;
        rc.cpu_precision = MODEL_BF16;
        char desc[256], err[256];
        void *be = o->open(&rc, desc, sizeof(desc), err, sizeof(err));
        assert_non_null(be);
        printf("  %s\n", desc);
        assert_string_equal(o->precision(be), "bf16");
        assert_true((strstr(desc, "AMX tiles") != NULL) == (amx == 1) ||
                    strstr(desc, "no AMX") != NULL);
        void *c = o->ctx_new(be, 0, err, sizeof(err));
        assert_non_null(c);
        for (int round = 0; round < 12; round++) backend_round(o, be, c, amx);
        o->ctx_free(c);
        o->close(be);
    }
    cpu_amx_allow(1);
    /* A precision the CPU does not run is refused at open, saying so. */
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.cpu_precision = MODEL_FP16;
    char desc[256], err[256] = "";
    assert_null(o->open(&rc, desc, sizeof(desc), err, sizeof(err)));
    assert_non_null(strstr(err, "fp32 or bf16"));
}

int main(void)
{
    tu_seed("test_cpu_amx");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_mm),
        cmocka_unit_test(test_backend_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_cpu_mm.c - the CPU backend's products of few rows (gpu/cpu_mm.c)
 * and its 16-bit weights, against float64 references written here, on
 * fresh random shapes and values each run (the seed is printed;
 * KINFER_TEST_SEED replays it), for every copy the machine runs (the
 * AVX-512 one and the plain one).
 *
 * Proves:
 * - cpu_mm: C = A W^T + bias for W in float32, bfloat16 and float16,
 *   m, n, k from 1 (every tail of the 4-row tiles and 16-lane chunks),
 *   strided A and C, with the pool split over 1..3 threads; the padding
 *   columns of C are left alone;
 *   Tolerance: |got - ref| <= (k / 16 + 20) 2^-24 (sum_k |a w| + |bias|),
 *   the bound of float32 sums in 16 lanes (ref from the widened weights);
 * - cpu_mm_widen is exact for both 16-bit kinds, every bit pattern (a
 *   NaN stays a NaN, maybe quieted);
 * - cpu_par runs each part exactly once, no more parts than asked;
 * - the backend's GEMM against a BF16 or F16 weight (kept in 16 bits)
 *   equals the float64 product both ways it takes: few rows (cpu_mm)
 *   and many (rows widened, then the BLAS), with bias and activation;
 *   Tolerance: (k + 20) 2^-24 (sum_k |a w| + |bias|) (the BLAS sums
 *   in its own order). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/backend.h"
#include "../gpu/cpu_mm.h"
#include "../gpu/safetensors.h"
#include "testutil.h"

static size_t irand(size_t lo, size_t hi)
{
    return lo + (size_t)(tu_rand64() % (uint64_t)(hi - lo + 1));
}

/* n weights of kind drawn in [-1, 1]: the stored words into *raw (f32
 * or 16-bit), their exact values into wd. */
static void *make_w(enum cpu_wkind kind, size_t n, double *wd)
{
    void *raw = malloc(n * (kind == CPU_W_F32 ? 4 : 2) + 4);
    assert_non_null(raw);
    for (size_t i = 0; i < n; i++) {
        float f = tu_randf(-1.0f, 1.0f);
        if (kind == CPU_W_F32) {
            ((float *)raw)[i] = f;
            wd[i] = f;
        } else if (kind == CPU_W_BF16) {
            uint16_t h = st_f32_to_bf16(f);
            ((uint16_t *)raw)[i] = h;
            wd[i] = st_bf16_to_f32(h);
        } else {
            uint16_t h = st_f32_to_f16(f);
            ((uint16_t *)raw)[i] = h;
            wd[i] = st_f16_to_f32(h);
        }
    }
    return raw;
}

/* One random product of m in [mmin, mmax], at most nmax x kmax, checked. */
static double one_mm_m(size_t mmin, size_t mmax, size_t nmax, size_t kmax,
                       enum cpu_wkind kind)
{
    size_t m = irand(mmin, mmax), n = irand(1, nmax), k = irand(1, kmax);
    size_t lda = k + irand(0, 3), ldc = n + irand(0, 3);
    float *a = malloc(m * lda * sizeof(float)), *c = malloc(m * ldc * sizeof(float));
    float *bias = irand(0, 1) ? malloc(n * sizeof(float)) : NULL;
    double *wd = malloc(n * k * sizeof(double));
    assert_true(a && c && wd);
    for (size_t i = 0; i < m * lda; i++) a[i] = tu_randf(-1.0f, 1.0f);
    for (size_t i = 0; i < m * ldc; i++) c[i] = 12345.0f;
    for (size_t j = 0; bias && j < n; j++) bias[j] = tu_randf(-1.0f, 1.0f);
    void *w = make_w(kind, n * k, wd);
    cpu_mm(m, n, k, a, lda, w, kind, bias, c, ldc);
    double worst = 0;
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            double ref = bias ? bias[j] : 0.0, mag = bias ? fabs(bias[j]) : 0.0;
            for (size_t e = 0; e < k; e++) {
                ref += (double)a[i * lda + e] * wd[j * k + e];
                mag += fabs((double)a[i * lda + e] * wd[j * k + e]);
            }
            double tol = ((double)k / 16.0 + 20.0) * ldexp(1.0, -24) * mag + 1e-30;
            double err = fabs((double)c[i * ldc + j] - ref) / tol;
            if (!(err <= 1.0))
                fail_msg("cpu_mm kind %d, %zux%zux%zu: C[%zu,%zu] = %.9g, reference %.9g "
                         "(err/tol %.3f)", (int)kind, m, n, k, i, j, (double)c[i * ldc + j], ref,
                         err);
            if (err > worst) worst = err;
        }
        for (size_t j = n; j < ldc; j++) assert_true(c[i * ldc + j] == 12345.0f);
    }
    free(a);
    free(c);
    free(bias);
    free(wd);
    free(w);
    return worst;
}

static double one_mm(size_t mmax, size_t nmax, size_t kmax, enum cpu_wkind kind)
{
    return one_mm_m(1, mmax, nmax, kmax, kind);
}

/* One row of A (a decode step): BF16 takes its own loops there, over A
 * split per 32-element chunk (whole chunks two rows of W at a time, a
 * tail, an odd last row; past 16384 columns the general loop). */
static void test_mm_one_row(void **state)
{
    (void)state;
    int best = cpu_mm_level(-1);
    for (int lvl = best; lvl >= 0; lvl--) {
        assert_int_equal(cpu_mm_level(lvl), lvl);
        for (int threads = 1; threads <= 2; threads++) {
            cpu_mm_threads(threads);
            double worst = 0, e;
            for (int kind = 0; kind < 3; kind++) {
                for (int r = 0; r < 40; r++)
                    if ((e = one_mm_m(1, 1, 9, 200, (enum cpu_wkind)kind)) > worst) worst = e;
                for (int r = 0; r < 4; r++) /* whole chunks, the pool */
                    if ((e = one_mm_m(1, 1, 301, 64 * irand(1, 12), (enum cpu_wkind)kind)) >
                        worst)
                        worst = e;
                if ((e = one_mm_m(1, 1, 7, 17000, (enum cpu_wkind)kind)) > worst) worst = e;
            }
            printf("  level %d, %d threads, one row: worst err/tol %.3f\n", lvl, threads, worst);
        }
    }
    cpu_mm_level(-1);
    for (size_t bytes = 0; bytes < 300; bytes += 7) { /* the weights' storage */
        unsigned char *p = cpu_mm_alloc(bytes, 1);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        for (size_t i = 0; i < bytes; i++) assert_int_equal(p[i], 0);
        free(p);
    }
}

static void test_mm(void **state)
{
    (void)state;
    int best = cpu_mm_level(-1);
    for (int lvl = best; lvl >= 0; lvl--) {
        assert_int_equal(cpu_mm_level(lvl), lvl);
        for (int threads = 1; threads <= 3; threads++) {
            cpu_mm_threads(threads);
            double worst = 0, e;
            for (int kind = 0; kind < 3; kind++) {
                for (int r = 0; r < 30; r++)
                    if ((e = one_mm(9, 11, 70, (enum cpu_wkind)kind)) > worst) worst = e;
                for (int r = 0; r < 3; r++) /* big enough for the pool */
                    if ((e = one_mm(40, 300, 700, (enum cpu_wkind)kind)) > worst) worst = e;
            }
            printf("  level %d, %d threads: worst err/tol %.3f\n", lvl, threads, worst);
        }
    }
    cpu_mm_level(-1);
}

static void test_widen(void **state)
{
    (void)state;
    uint16_t *src = malloc(65536 * sizeof(uint16_t));
    float *dst = malloc(65536 * sizeof(float));
    assert_true(src && dst);
    for (size_t i = 0; i < 65536; i++) src[i] = (uint16_t)i;
    for (int lvl = cpu_mm_level(-1); lvl >= 0; lvl--) {
        cpu_mm_level(lvl);
        for (int kind = CPU_W_BF16; kind <= CPU_W_F16; kind++) {
            size_t n = 65536 - irand(0, 15); /* a tail too */
            cpu_mm_widen(dst, src, n, (enum cpu_wkind)kind);
            for (size_t i = 0; i < n; i++) {
                float want = kind == CPU_W_BF16 ? st_bf16_to_f32(src[i]) : st_f16_to_f32(src[i]);
                if (isnan(want) ? !isnan(dst[i]) : memcmp(&want, &dst[i], sizeof(float)) != 0)
                    fail_msg("widen kind %d level %d: 0x%04zx -> %.9g, want %.9g", kind, lvl, i,
                             (double)dst[i], (double)want);
            }
        }
    }
    cpu_mm_level(-1);
    free(src);
    free(dst);
}

struct par_count {
    atomic_int hits[16];
    atomic_int parts_seen;
    atomic_int bad;          /* a part out of range (checked on the main thread) */
};

static void par_fn(void *arg, size_t part, size_t parts)
{
    struct par_count *p = arg;
    if (!(part < parts && parts <= 16)) {
        atomic_store(&p->bad, 1);
        return;
    }
    atomic_fetch_add(&p->hits[part], 1);
    atomic_store(&p->parts_seen, (int)parts);
}

static void test_par(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 4; threads++) {
        cpu_mm_threads(threads);
        for (size_t max = 1; max <= 5; max++)
            for (int rep = 0; rep < 50; rep++) {
                struct par_count p;
                memset(&p, 0, sizeof(p));
                cpu_par(par_fn, &p, max);
                assert_int_equal(atomic_load(&p.bad), 0);
                int parts = atomic_load(&p.parts_seen);
                assert_true(parts >= 1 && (size_t)parts <= max && parts <= threads);
                for (int i = 0; i < 16; i++)
                    assert_int_equal(atomic_load(&p.hits[i]), i < parts ? 1 : 0);
            }
    }
}

/* The backend's GEMM against a 16-bit weight made from a tensor as a
 * file would hold it. */
static void test_backend16(void **state)
{
    (void)state;
    const struct backend_ops *o = &backend_cpu;
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cpu";
    rc.cpu_threads = 2;
    char desc[256], err[256];
    void *be = o->open(&rc, desc, sizeof(desc), err, sizeof(err));
    assert_non_null(be);
    void *c = o->ctx_new(be, 0, err, sizeof(err));
    assert_non_null(c);
    for (int round = 0; round < 8; round++) {
        enum cpu_wkind kind = round % 2 ? CPU_W_F16 : CPU_W_BF16;
        size_t m = round < 4 ? irand(1, 8) : irand(70, 300), n = irand(1, 300);
        size_t k = irand(1, 200);
        double *wd = malloc(n * k * sizeof(double));
        assert_non_null(wd);
        void *raw = make_w(kind, n * k, wd);
        struct st_tensor t = {.name = "w", .dtype = kind == CPU_W_BF16 ? ST_BF16 : ST_F16,
                              .ndim = 2, .shape = {n, k}, .numel = n * k, .data = raw,
                              .nbytes = n * k * 2};
        struct bk_wsrc src = {.t = &t};
        float *bias_h = malloc(n * sizeof(float));
        assert_non_null(bias_h);
        for (size_t j = 0; j < n; j++) bias_h[j] = tu_randf(-1.0f, 1.0f);
        struct bk_wsrc bsrc = {.f = bias_h, .n = n};
        struct bk_weight *w = o->weight_new(be, 0, BK_W_ACT, &src, 1, err, sizeof(err));
        struct bk_weight *b = o->weight_new(be, 0, BK_W_ACT, &bsrc, 1, err, sizeof(err));
        assert_true(w && b);
        float *a = o->ctx_alloc(c, m * k * sizeof(float), 0);
        float *out = o->ctx_alloc(c, m * n * sizeof(float), 0);
        assert_true(a && out);
        for (size_t i = 0; i < m * k; i++) a[i] = tu_randf(-1.0f, 1.0f);
        struct bk_gemm g = {.m = m, .n = n, .k = k, .a = a, .w = w, .bias = b,
                            .act = BK_ACT_RELU, .c = out};
        assert_int_equal(o->pass_begin(c), 0);
        assert_int_equal(o->gemm(c, &g), 0);
        assert_int_equal(o->pass_end(c), 0);
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++) {
                double ref = bias_h[j], mag = fabs(bias_h[j]);
                for (size_t e = 0; e < k; e++) {
                    ref += (double)a[i * k + e] * wd[j * k + e];
                    mag += fabs((double)a[i * k + e] * wd[j * k + e]);
                }
                ref = ref > 0 ? ref : 0;
                double tol = ((double)k + 20.0) * ldexp(1.0, -24) * mag + 1e-30;
                if (!(fabs((double)out[i * n + j] - ref) <= tol))
                    fail_msg("gemm kind %d %zux%zux%zu: C[%zu,%zu] = %.9g, reference %.9g",
                             (int)kind, m, n, k, i, j, (double)out[i * n + j], ref);
            }
        o->weight_free(be, w);
        o->weight_free(be, b);
        free(raw);
        free(wd);
        free(bias_h);
    }
    o->ctx_free(c);
    o->close(be);
}

int main(void)
{
    tu_seed("test_cpu_mm");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mm),
        cmocka_unit_test(test_mm_one_row),
        cmocka_unit_test(test_widen),
        cmocka_unit_test(test_par),
        cmocka_unit_test(test_backend16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

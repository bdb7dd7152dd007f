/* test_cpu_vec.c - the CPU backend's SIMD row loops (gpu/cpu_vec.c) over
 * the float range, against float64 references written here, for every
 * instruction-set copy the machine runs (AVX-512F, AVX2, plain x86-64).
 *
 * Proves:
 * - cpuv_exp: within 3e-7 relative of exp wherever exp(x) is a normal
 *   float, 0 (or a denormal) below FLT_MIN, inf above FLT_MAX, NaN kept;
 *   every 511th float bit pattern from -104 to 89 checked;
 * - GELU (cpuv_bias_gelu, the erf form 0.5 x erfc(-x/sqrt 2)): within
 *   GELU_TOL relative of the float64 reference wherever the result is a
 *   normal float, within FLT_MIN absolute below; +inf gives +inf and NaN
 *   NaN. Every 4093rd bit pattern of all 2^32 is checked (every exponent,
 *   both signs), plus a dense sweep of [-16, 16], with and without a
 *   bias, tails of every length 1..17;
 * - softmax rows of every tail length and a row of -inf;
 * - layernorm of rows whose mean dwarfs their spread (1e4 vs 1): x - mean
 *   keeps its precision (2e-6 relative to the spread). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/cpu_vec.h"
#include "testutil.h"

#define GELU_TOL 6e-7
#define EXP_TOL 3e-7

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static double ref_gelu(double x)
{
    return 0.5 * x * erfc(-x / sqrt(2.0));
}

/* Relative error of got against ref, or absolute below FLT_MIN; worst
 * kept in *worst (err / tol). */
static void check_val(const char *what, float x, float got, double ref, double tol,
                      double *worst)
{
    if (isnan(ref)) {
        if (!isnan(got)) fail_msg("%s(%.9g) = %.9g, want NaN", what, (double)x, (double)got);
        return;
    }
    if (isinf(ref) || fabs(ref) > FLT_MAX) {
        if (!(got == (float)ref || (isinf(got) && (got > 0) == (ref > 0))))
            fail_msg("%s(%.9g) = %.9g, want %g", what, (double)x, (double)got, ref);
        return;
    }
    double e = fabs(ref) >= FLT_MIN ? fabs((double)got - ref) / (tol * fabs(ref))
                                    : fabs((double)got - ref) / FLT_MIN;
    if (!(e <= 1.0))
        fail_msg("%s(%.9g) = %.9g, reference %.9g (err/tol %.3f)", what, (double)x, (double)got,
                 ref, e);
    if (e > *worst) *worst = e;
}

static void test_exp(void **state)
{
    (void)state;
    for (int cap = 2; cap >= 0; cap--) {
        int l = cpuv_level(cap);
        if (l != cap) continue;
        enum { N = 1 << 14 };
        static float x[N], y[N];
        double worst = 0;
        size_t n = 0;
        /* exp's domain: negative bit patterns down to -104, positive up to 89. */
        uint64_t starts[2][2] = {{0x80000000u, 0xc2d00000u}, {0x00000000u, 0x42b20000u}};
        for (int part = 0; part < 2; part++)
            for (uint64_t u = starts[part][0]; u <= starts[part][1];) {
                size_t k = 0;
                for (; k < N && u <= starts[part][1]; k++, u += 511) x[k] = from_bits((uint32_t)u);
                cpuv_exp(y, x, k);
                for (size_t i = 0; i < k; i++) {
                    double ref = exp((double)x[i]);
                    if (ref < FLT_MIN) {
                        if (!(y[i] >= 0 && y[i] < FLT_MIN))
                            fail_msg("exp(%.9g) = %.9g, want below FLT_MIN", (double)x[i],
                                     (double)y[i]);
                        continue;
                    }
                    check_val("exp", x[i], y[i], ref, EXP_TOL, &worst);
                }
                n += k;
            }
        float sp[4] = {INFINITY, -INFINITY, NAN, 100.0f}, so[4];
        cpuv_exp(so, sp, 4);
        assert_true(isinf(so[0]) && so[0] > 0);
        assert_true(so[1] == 0.0f);
        assert_true(isnan(so[2]));
        assert_true(isinf(so[3]));
        printf("  level %d exp: %zu values, worst err/tol %.3f\n", l, n, worst);
    }
    cpuv_level(-1);
}

static void test_gelu(void **state)
{
    (void)state;
    for (int cap = 2; cap >= 0; cap--) {
        int l = cpuv_level(cap);
        if (l != cap) continue;
        enum { N = 1 << 14 };
        static float x[N], y[N], bias[N];
        double worst = 0;
        size_t n = 0;
        for (uint64_t u = 0; u < (1ull << 32);) {
            size_t k = 0;
            for (; k < N && u < (1ull << 32); k++, u += 4093) x[k] = from_bits((uint32_t)u);
            memcpy(y, x, k * sizeof(float));
            cpuv_bias_gelu(y, NULL, k);
            for (size_t i = 0; i < k; i++)
                check_val("gelu", x[i], y[i], ref_gelu((double)x[i]), GELU_TOL, &worst);
            n += k;
        }
        /* Dense over [-16, 16], with a bias. */
        for (int rep = 0; rep < 64; rep++) {
            for (size_t i = 0; i < N; i++) {
                x[i] = (float)(tu_rand64() % 32000001) * 1e-6f - 16.0f;
                bias[i] = (float)(tu_rand64() % 2001) * 1e-3f - 1.0f;
            }
            memcpy(y, x, sizeof(y));
            size_t k = N - (size_t)rep % 17; /* tails of every length */
            cpuv_bias_gelu(y, bias, k);
            for (size_t i = 0; i < k; i++) {
                float v = x[i] + bias[i];
                check_val("gelu", v, y[i], ref_gelu((double)v), GELU_TOL, &worst);
            }
            n += k;
        }
        float sp[3] = {INFINITY, NAN, -0.0f};
        cpuv_bias_gelu(sp, NULL, 3);
        assert_true(isinf(sp[0]) && sp[0] > 0);
        assert_true(isnan(sp[1]));
        assert_true(sp[2] == 0.0f);
        printf("  level %d gelu: %zu values, worst err/tol %.3f (tol %g)\n", l, n, worst,
               GELU_TOL);
    }
    cpuv_level(-1);
}

static void test_rows(void **state)
{
    (void)state;
    for (int cap = 2; cap >= 0; cap--) {
        int l = cpuv_level(cap);
        if (l != cap) continue;
        double worst = 0;
        for (size_t w = 1; w <= 70; w++) {
            float x[70], y[70], g[70], b[70];
            for (size_t i = 0; i < w; i++) {
                x[i] = (float)(tu_rand64() % 40001) * 1e-3f - 20.0f;
                g[i] = (float)(tu_rand64() % 2001) * 1e-3f - 1.0f;
                b[i] = (float)(tu_rand64() % 2001) * 1e-3f - 1.0f;
            }
            /* softmax */
            memcpy(y, x, w * sizeof(float));
            cpuv_softmax_row(y, w);
            double mx = -INFINITY, sum = 0;
            for (size_t i = 0; i < w; i++) mx = x[i] > mx ? x[i] : mx;
            for (size_t i = 0; i < w; i++) sum += exp(x[i] - mx);
            for (size_t i = 0; i < w; i++) {
                double ref = exp(x[i] - mx) / sum, e = fabs(y[i] - ref) / 1e-6;
                if (!(e <= 1.0))
                    fail_msg("softmax w %zu [%zu] %.9g vs %.9g", w, i, (double)y[i], ref);
                if (e > worst) worst = e;
            }
            /* layernorm of a row around 1e4 with a spread of about 1 */
            for (size_t i = 0; i < w; i++) x[i] = 1e4f + x[i] * 0.05f;
            float xx[70];
            memcpy(xx, x, w * sizeof(float));
            cpuv_layernorm_row(g, b, 1e-5f, xx, NULL, y, w);
            double mean = 0, var = 0;
            for (size_t i = 0; i < w; i++) mean += x[i];
            mean /= (double)w;
            for (size_t i = 0; i < w; i++) var += (x[i] - mean) * (x[i] - mean);
            var /= (double)w;
            for (size_t i = 0; i < w; i++) {
                double ref = (x[i] - mean) / sqrt(var + 1e-5) * g[i] + b[i];
                double e = fabs(y[i] - ref) / 2e-6 / (fabs(ref) > 1 ? fabs(ref) : 1);
                if (!(e <= 1.0))
                    fail_msg("layernorm w %zu [%zu] %.9g vs %.9g", w, i, (double)y[i], ref);
                if (e > worst) worst = e;
            }
        }
        float inf[19];
        for (int i = 0; i < 19; i++) inf[i] = -INFINITY;
        cpuv_softmax_row(inf, 19);
        for (int i = 0; i < 19; i++) assert_true(inf[i] == 0.0f);
        printf("  level %d softmax and layernorm rows 1..70: worst err/tol %.3f\n", l, worst);
    }
    cpuv_level(-1);
}

int main(void)
{
    tu_seed("test_cpu_vec");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

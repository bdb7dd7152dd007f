/* cpu_vec.h - the CPU backend's row loops written for SIMD: GCC vector
 * types of 16 floats, each function built for AVX-512, AVX2 and plain
 * x86-64 (or once, on other machines), the best one picked at load time
 * (function multiversioning). Used by backend_cpu.c only.
 *
 * Precision: float32 arithmetic throughout, row sums of layernorm in
 * double lanes; cpuv_exp is within 1e-7 relative of exp on normal
 * results (denormals below, 0 under 2^-150); the GELU is within 6e-7
 * relative (measured 4.6e-7, about 4 ulp) of the exact erf GELU
 * wherever the result is a normal float (tests/test_cpu_vec.c checks
 * both over the float range, for every copy). */
#ifndef KINFER_CPU_VEC_H
#define KINFER_CPU_VEC_H

#include <stddef.h>

/* The copy in use: 2 AVX-512F, 1 AVX2, 0 plain (the best the CPU runs,
 * at most cap; cap < 0: the best). For tests, which check every copy;
 * call it before any thread uses these functions. */
int cpuv_level(int cap);

/* y[i] = exp(x[i]), n values (y may equal x). */
void cpuv_exp(float *y, const float *x, size_t n);

/* x[i] = gelu(x[i] + bias[i]) (bias may be NULL), the erf form
 * 0.5 x erfc(-x / sqrt 2), n values in place. */
void cpuv_bias_gelu(float *x, const float *bias, size_t n);

/* x[i] += bias[i], n values; relu after when relu is set (NaN kept). */
void cpuv_bias_relu(float *x, const float *bias, size_t n, int relu);

/* Softmax of one row of w >= 1 values in place, shifted by its max;
 * a row of nothing but -inf becomes all 0. */
void cpuv_softmax_row(float *x, size_t w);

/* x += res (res may be NULL), then y = (x - mean) / sqrt(var + eps) * g +
 * b over one row of w values (biased variance; g, b may be NULL: ones,
 * zeros; y may equal x). */
void cpuv_layernorm_row(const float *g, const float *b, float eps, float *x, const float *res,
                        float *y, size_t w);

#endif

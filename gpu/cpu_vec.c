/* cpu_vec.c - the CPU backend's row loops for SIMD (see cpu_vec.h).
 *
 * Everything is written on GCC vector types of 16 floats, which the
 * compiler maps onto whatever registers the target has: one AVX-512
 * register, two AVX2 ones, four SSE ones. On x86-64 the bodies
 * (cpu_vec_body.h) are compiled three times, for AVX-512F, AVX2 and
 * plain x86-64, and each entry point calls the best copy the CPU runs
 * (a whole function per instruction set, helpers included, so that no
 * vector operation is lowered for a smaller target than its caller's).
 * A row's tail (fewer than 16 values) goes through the same code in a
 * padded block, so every element is computed the same way. (Other
 * compilers and machines get the plain copy alone.)
 *
 * exp: n = round(s log2 e), r = s - n ln2 in two pieces (Cody-Waite),
 * exp(r) by its Taylor series to r^7 (|r| <= 0.35: truncation 5e-9
 * relative), 2^n put in the exponent bits in two halves (so that
 * denormal results round once).
 *
 * GELU: 0.5 x erfc(-x / sqrt 2), with erfc(z) for z >= 0 as
 * t exp(-z^2 + q(t)), t = 1 / (1 + z/2) and q the degree-9 Chebyshev fit
 * of the classic "erfcc" formula (relative error under 1.2e-7 for every
 * z >= 0). -z^2 = -x^2/2 is kept exact as a sum of two floats (x split
 * into its top 12 bits and the rest), so the error of z^2's rounding
 * (a few 1e-6 relative near the underflow) does not reach the result;
 * erfc/2 is carried scaled by 2^24, so it stays normal wherever the
 * GELU is. Measured: within 4.6e-7 relative over the float range, the
 * fit's 1.2e-7 plus float rounding in q. */
#include "cpu_vec.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define VL 16
typedef float vf __attribute__((vector_size(4 * VL)));
typedef int32_t vi __attribute__((vector_size(4 * VL)));
typedef float vf8 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));

/* The helpers take and return vectors but are always inlined, so no call
 * passes one: GCC's note on the ABI of 64-byte vectors does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
#define INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KI_X86 1
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
#pragma GCC optimize("fp-contract=fast")
#define SUF(n) n##_avx512
#include "cpu_vec_body.h"
#undef SUF
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("fp-contract=fast")
#define SUF(n) n##_avx2
#include "cpu_vec_body.h"
#undef SUF
#pragma GCC pop_options
#endif
#define SUF(n) n##_base
#include "cpu_vec_body.h"
#undef SUF

/* The widest instruction set the CPU has: 2 AVX-512F, 1 AVX2 (each with
 * FMA, which those copies contract a * b + c into), 0 neither. */
#ifdef KI_X86
static int cpu_level(void)
{
    __builtin_cpu_init();
    int fma = __builtin_cpu_supports("fma");
    return fma && __builtin_cpu_supports("avx512f") ? 2
           : fma && __builtin_cpu_supports("avx2") ? 1
                                                  : 0;
}

/* -1 until the first call; every thread computes the same answer. */
static atomic_int level = -1;

static int isa(void)
{
    int l = atomic_load_explicit(&level, memory_order_relaxed);
    if (l < 0) {
        l = cpu_level();
        atomic_store_explicit(&level, l, memory_order_relaxed);
    }
    return l;
}

int cpuv_level(int cap)
{
    int l = cpu_level();
    l = cap >= 0 && cap < l ? cap : l;
    atomic_store(&level, l);
    return l;
}
#define DISPATCH(fn, ...)                  \
    do {                                   \
        int l_ = isa();                    \
        if (l_ == 2) fn##_avx512(__VA_ARGS__); \
        else if (l_ == 1) fn##_avx2(__VA_ARGS__); \
        else fn##_base(__VA_ARGS__);       \
    } while (0)
#else
#define DISPATCH(fn, ...) fn##_base(__VA_ARGS__)
int cpuv_level(int cap)
{
    (void)cap;
    return 0;
}
#endif

void cpuv_exp(float *y, const float *x, size_t n)
{
    DISPATCH(cpuv_exp, y, x, n);
}

void cpuv_bias_gelu(float *x, const float *bias, size_t n)
{
    DISPATCH(cpuv_bias_gelu, x, bias, n);
}

void cpuv_bias_relu(float *x, const float *bias, size_t n, int relu)
{
    DISPATCH(cpuv_bias_relu, x, bias, n, relu);
}

void cpuv_softmax_row(float *x, size_t w)
{
    DISPATCH(cpuv_softmax_row, x, w);
}

void cpuv_layernorm_row(const float *g, const float *b, float eps, float *x, const float *res,
                        float *y, size_t w)
{
    DISPATCH(cpuv_layernorm_row, g, b, eps, x, res, y, w);
}

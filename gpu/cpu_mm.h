/* cpu_mm.h - the CPU backend's own matrix products for few rows (the
 * decode shapes: one token per sequence), where a BLAS GEMM would pack
 * the whole weight on every call: C[m,n] = A[m,k] W[n,k]^T (+ bias[n]),
 * W in float32, bfloat16 or float16, the 16-bit ones widened to float32
 * in registers (so a weight is read from memory once per call, at its
 * stored size, for all m rows together). Each W row's dot products are
 * float32 sums of k products in 16 lanes (fused multiply-adds where the
 * CPU has them), the lanes added at the end: within a few k x 2^-24 of
 * the exact product of the widened values, relative to sum |a w|.
 *
 * The work is split over the rows of W between the calling thread and a
 * process-wide pool of helper threads (cpu_mm_threads); a call made while
 * another thread holds the pool runs on its caller alone. x86-64 with
 * AVX-512F (and BW, for the 16-bit loads) takes a vector copy, chosen at
 * run time; any other CPU a plain one.
 *
 * Also the widening of 16-bit rows (cpu_mm_widen), for the GEMMs of
 * many rows, which convert a block of W and hand it to the BLAS, and the
 * pool itself for other row loops (cpu_par).
 *
 * Threads: cpu_mm_threads on the main thread (backend open); the rest on
 * any thread. The pool's threads live until the process ends. */
#ifndef KINFER_CPU_MM_H
#define KINFER_CPU_MM_H

#include <stddef.h>
#include <stdint.h>

/* How a weight's elements are stored. */
enum cpu_wkind { CPU_W_F32 = 0, CPU_W_BF16, CPU_W_F16 };

/* Threads one product may use, the caller included (>= 1; the pool's
 * helpers start on first use). */
void cpu_mm_threads(int n);

/* The copy in use: 1 the AVX-512 one, 0 the plain one (the best the CPU
 * runs, at most cap; cap < 0: the best). For tests, which check both;
 * call it before any thread multiplies. */
int cpu_mm_level(int cap);

/* C[i, j] = sum_k A[i, k] W[j, k] (+ bias[j]) for i < m, j < n: A with
 * leading dimension lda (floats), W dense [n, k] of kind, C with ldc;
 * bias NULL or n floats. m, n, k >= 1. */
void cpu_mm(size_t m, size_t n, size_t k, const float *a, size_t lda, const void *w,
            enum cpu_wkind kind, const float *bias, float *c, size_t ldc);

/* Runs fn(arg, p, parts) for p = 0 .. parts - 1, parts <= max_parts and
 * the threads cpu_mm_threads allows, part 0 on the calling thread, the
 * rest on the pool's helpers at once; returns when all have. parts is 1
 * (fn on the caller alone) while another thread holds the pool. */
void cpu_par(void (*fn)(void *arg, size_t part, size_t parts), void *arg, size_t max_parts);

/* Storage for a W of bytes: 64-byte aligned, so that the products'
 * loads never straddle two cache lines; zeroed when zero. Freed with
 * free(). NULL when out of memory. */
void *cpu_mm_alloc(size_t bytes, int zero);

/* fn(arg, r0, r1) over rows [0, rows) in parts of at least min_rows
 * rows (>= 1), split as cpu_par splits (the caller alone when that makes
 * one part): for row loops whose rows are independent, so the result
 * does not depend on the split. */
void cpu_par_rows(void (*fn)(void *arg, size_t r0, size_t r1), void *arg, size_t rows,
                  size_t min_rows);

/* dst[i] = the float32 value of 16-bit element src[i] of kind (BF16 or
 * F16; exact, but a signalling F16 NaN may come out quieted), n
 * elements. */
void cpu_mm_widen(float *dst, const uint16_t *src, size_t n, enum cpu_wkind kind);

#endif

/* cpu_amx.h - matrix products in bfloat16 on the AMX tiles of x86-64
 * CPUs that have them (Intel Xeon from Sapphire Rapids on): C[m,n] =
 * A[m,k] W[n,k]^T (+ bias[n]) with A rounded to bfloat16 (to nearest,
 * ties to even) and W held in bfloat16, every product exact and summed in
 * float32 by the tiles (denormal inputs read as zero). The CPU backend's
 * "bf16" precision runs its GEMMs against weights here.
 *
 * W is packed once, when the model loads, into the tiles' layout: blocks
 * of 16 rows x 32 columns (1 KiB), pairs of a row's neighbouring columns
 * side by side, the blocks of a 16-row band in column order; rows are
 * padded to a multiple of 16 and columns to a multiple of 32 with zeros.
 * The packed copy replaces the weight (no second copy is kept):
 * cpu_amx_row reads a row back, for embedding tables that are also GEMM
 * weights (tied output embeddings).
 *
 * A product converts A into a caller's scratch (cpu_amx_scratch_size),
 * then splits W's bands over cpu_mm.h's pool of threads; each thread
 * configures its tiles, walks its bands against A in blocks of 2 x 2
 * tiles and releases the tiles when done. A product of one row (a
 * decode step, bound by reading W) runs on AVX-512 instead, the same
 * exact products summed in float32, without the tiles' setup.
 *
 * Threads: cpu_amx_ready on any thread (it asks the kernel once for the
 * tile state); the rest on any thread with its own scratch. */
#ifndef KINFER_CPU_AMX_H
#define KINFER_CPU_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_mm.h"

/* 1 when this CPU has AMX-BF16 and AVX512-BF16 and the kernel lets the
 * process use the tiles (asked once, process-wide); 0 otherwise. */
int cpu_amx_ready(void);

/* For tests: allow 0 makes cpu_amx_ready say 0 from now on (backends
 * opened after take the fallback), 1 lets it say what the CPU has.
 * Returns cpu_amx_ready(). */
int cpu_amx_allow(int allow);

/* uint16_t elements of W packed: rows and cols rounded up to 16 and 32. */
size_t cpu_amx_packed_elems(size_t rows, size_t cols);

/* Writes rows r0 .. r0 + nr - 1 of a rows x cols matrix, given row-major
 * in src (nr x cols elements of kind, float32 ones rounded to bfloat16
 * to nearest even, float16 ones rounded from their exact value), into
 * their places in dst, which holds cpu_amx_packed_elems(rows, cols)
 * elements and was zeroed first (the padding stays zero). */
void cpu_amx_pack(uint16_t *dst, size_t rows, size_t cols, size_t r0, size_t nr,
                  const void *src, enum cpu_wkind kind);

/* Row r of a packed rows x cols matrix, widened to float32 (cols floats). */
void cpu_amx_row(float *dst, const uint16_t *w, size_t rows, size_t cols, size_t r);

/* Bytes of scratch a product of m rows over k columns needs. */
size_t cpu_amx_scratch_size(size_t m, size_t k);

/* An elementwise function of C's values run where they are stored (an
 * activation), on n consecutive values of a row at a time, by whichever
 * thread stored them. */
struct cpu_amx_epi {
    void (*fn)(float *x, size_t n, const void *arg);
    const void *arg;
};

/* C[i, j] = sum_k bf16(A[i, k]) W[j, k] (+ bias[j]) for i < m, j < n,
 * then epi (NULL: none): A with leading dimension lda (floats), W packed
 * as rows x k (n <= rows), C with ldc; bias NULL or n floats; scratch of
 * cpu_amx_scratch_size(m, k) bytes, 64-byte aligned. Only when
 * cpu_amx_ready() said 1. */
void cpu_amx_mm(size_t m, size_t n, size_t k, const float *a, size_t lda, const uint16_t *w,
                size_t rows, const float *bias, const struct cpu_amx_epi *epi, float *c,
                size_t ldc, void *scratch);

#endif

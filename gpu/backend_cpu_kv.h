/* backend_cpu_kv.h - what the CPU backend's two files share: its
 * context, and the decoding primitives of backend_cpu_kv.c for
 * backend_cpu.c's table. Internal to them. */
#ifndef KINFER_BACKEND_CPU_KV_H
#define KINFER_BACKEND_CPU_KV_H

#include "backend.h"

/* Row loops (rmsnorm, swiglu) go over cpu_mm.h's pool in parts of at
 * least this many elements: a decode step of one sequence stays on the
 * calling thread, one of 32 (or a prefill) is split. */
#define CPU_ROWS_MIN 8192

/* An executor context of the CPU backend. */
struct cpu_ctx {
    void **bufs;     /* every ctx_alloc, freed with the context */
    size_t n_bufs, cap_bufs;
    int fault;       /* armed by inject_fault: the next pass fails */
    float *conv;     /* 16-bit weight rows widened for a BLAS GEMM (grown on
                        first need, freed with the context) */
    size_t conv_n;   /* floats at conv */
    void *amx;       /* bfloat16 rows of A for cpu_amx_mm (64-byte aligned, grown
                        on first need, freed with the context) */
    size_t amx_n;    /* bytes at amx */
    int kv16;        /* the key/value cache in bfloat16 (worker.cpu_precision
                        "bf16"), else float32 */
    float *kvrow;    /* kv_store's key row before it is rounded (grown on first
                        need, freed with the context) */
    size_t kvrow_n;  /* floats at kvrow */
    char err[256];
};

/* rmsnorm (backend.h) with g's float32 values (or NULL: no scale). */
void cpu_rmsnorm_rows(float *y, float *x, const float *res, const float *g, float eps,
                      size_t rows, size_t w);
int cpu_swiglu(void *c, void *y, const void *x, size_t rows, size_t w);
/* rope's rotation of rows x heads heads of dh at x + r ld + col, row r at
 * position pos[r], by the float32 inverse frequencies inv_freq[dh / 2]. */
void cpu_rope_rows(float *x, size_t rows, size_t ld, size_t col, size_t heads, size_t dh,
                   const uint32_t *pos, const float *inv_freq);
/* kv_store, the rotation's frequencies (rope_n of them, or rope NULL)
 * taken out of their weight by backend_cpu.c. */
int cpu_kv_store(void *c, const struct bk_kv *kv, const void *k, size_t ldk, const void *v,
                 size_t ldv, const struct bk_seqs *s, const float *rope, size_t rope_n);
size_t cpu_paged_attention_scratch(void *be, size_t max_tokens, size_t max_ctx, size_t heads);
int cpu_paged_attention(void *c, const struct bk_paged_attention *a);

#endif

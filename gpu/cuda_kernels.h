/* cuda_kernels.h - the CUDA backend's own kernels, behind C launchers that
 * gpu/cuda_prims.c, gpu/cuda_lt.c and gpu/backend_cuda.c call: everything
 * but the GEMMs (cuBLASLt does those, gpu/cuda_lt.c, with a bias and some
 * activations fused in its epilogue; kc_gemm where it has no algorithm). Each launcher checks its sizes (returning
 * cudaErrorInvalidValue for ones it cannot launch), computes its grid,
 * launches on the given stream and returns cudaGetLastError(), so a bad
 * launch is reported where it happened. Only files in gpu/ include this
 * header (it includes CUDA's).
 *
 * Activations are float32, half or bfloat16 (enum kc_type); every kernel
 * computes in float32 and keeps row statistics (norms, softmax) in
 * float32, with PyTorch's semantics, as gpu/backend_cpu.c does. Rows are
 * row-major and dense (w elements apart) unless a leading dimension is
 * given.
 *
 * Threads: any host thread, on a stream it owns; no state. */
#ifndef KINFER_CUDA_KERNELS_H
#define KINFER_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

enum kc_type { KC_F32 = 0, KC_F16, KC_BF16 };

/* Elementwise activations: relu keeps NaN, gelu is the erf form,
 * gelu_tanh the tanh approximation (hidden_act "gelu_new"), silu x
 * sigmoid(x). */
enum kc_act { KC_NONE = 0, KC_RELU, KC_GELU, KC_TANH, KC_SIGMOID, KC_GELU_TANH, KC_SILU };

/* How pool reduces a sequence's tokens to one row. */
enum kc_pool { KC_POOL_FIRST = 0, KC_POOL_MEAN, KC_POOL_MAX, KC_POOL_LAST };

#ifdef __cplusplus
extern "C" {
#endif

/* y = x converted: float32 to type t (kc_from_f32) or back (kc_to_f32),
 * n elements; x and y do not overlap. */
cudaError_t kc_from_f32(cudaStream_t s, enum kc_type t, const float *x, void *y, size_t n);
cudaError_t kc_to_f32(cudaStream_t s, enum kc_type t, const void *x, float *y, size_t n);

/* x = act(x + bias) over rows x w elements of type t, rows ld elements
 * apart (ld >= w); bias (w elements of type t) may be NULL. */
cudaError_t kc_bias_act(cudaStream_t s, enum kc_type t, void *x, size_t ld, const void *bias,
                        size_t rows, size_t w, enum kc_act act);

/* y = LayerNorm(x) of each row (biased variance, two-pass float32
 * statistics); with res (rows x w of type t), x += res first and x keeps
 * the sum (rounded to t) while y is normalized from the float32 sum.
 * gamma and beta are float32 (w each) or NULL for ones and zeros. y may
 * be x (then x ends normalized). */
cudaError_t kc_layernorm(cudaStream_t s, enum kc_type t, void *y, void *x, const void *res,
                         const float *gamma, const float *beta, float eps, size_t rows,
                         size_t w);

/* y = x / sqrt(mean(x^2) + eps) * gamma of each row; res, gamma (NULL:
 * ones) and aliasing as kc_layernorm. */
cudaError_t kc_rmsnorm(cudaStream_t s, enum kc_type t, void *y, void *x, const void *res,
                       const float *gamma, float eps, size_t rows, size_t w);

/* Softmax of each row, shifted by its max. */
cudaError_t kc_softmax(cudaStream_t s, enum kc_type t, void *x, size_t rows, size_t w);

/* x / max(||x||_2, 1e-12) of each row, as F.normalize. */
cudaError_t kc_l2norm(cudaStream_t s, enum kc_type t, void *x, size_t rows, size_t w);

/* Rotary embedding in place: for each of rows rows of x (ld elements
 * apart), heads heads of dh values starting at column col, the pairs (i,
 * i + dh/2), i < dh/2, rotate by the angle pos[row] x inv_freq[i]
 * (float32, dh/2 values): Llama's rotate_half. dh must be even. */
cudaError_t kc_rope(cudaStream_t s, enum kc_type t, void *x, size_t rows, size_t ld, size_t col,
                    size_t heads, size_t dh, const uint32_t *pos, const float *inv_freq);

/* y = silu(gate) * up for each of rows rows: row r of x holds 2 w values,
 * [gate (w) | up (w)] (one GEMM of the stacked projections), row r of y
 * its w products. y must not overlap x. */
cudaError_t kc_swiglu(cudaStream_t s, enum kc_type t, void *y, const void *x, size_t rows,
                      size_t w);

/* ---- packed sequences ------------------------------------------------
 * A batch of n sequences is packed: T tokens in all, sequence i being
 * tokens offsets[i] .. offsets[i+1]-1 (offsets: n + 1 entries, device
 * memory), seq[t] the sequence token t belongs to and pos[t] its position
 * in it. Token rows are row-major. Attention runs padded: L is at least
 * the batch's longest sequence (the backend rounds it up for alignment),
 * and a padded tensor is [n, heads, L, dh], sequence-major then
 * head-major, its rows past a sequence's length zero. Every index was
 * checked on the host: ids below the vocabulary, type ids below the type
 * vocabulary, lengths 1..L, positions inside the position table. */

/* x[t] = word[ids[t]] + pos[pos_base + posv[t]] + type[types[t]] for every
 * token (pos or type NULL: left out; types NULL: type 0), then, when ln,
 * LayerNorm with gamma and beta (float32, or NULL), the sum kept in
 * float32 until normalized. Tables [*, w] of type t. */
cudaError_t kc_embed(cudaStream_t s, enum kc_type t, void *x, const void *word, const void *pos,
                     size_t pos_base, const void *type, int ln, const float *gamma,
                     const float *beta, float eps, const int32_t *ids, const int32_t *types,
                     const uint32_t *posv, size_t tokens, size_t w);

/* Packed rows of qkv (ld elements apart; query head h at column q_col + h
 * dh, key and value head g at k_col + g dh and v_col + g dh) into the
 * padded q, k and v, each [n, heads, L, dh]: the key and value of query
 * head h are those of head h / (heads / kv_heads) (grouped-query
 * attention). Padding rows are written as zeros. */
cudaError_t kc_attn_gather(cudaStream_t s, enum kc_type t, const void *qkv, size_t ld,
                           size_t q_col, size_t k_col, size_t v_col, const uint32_t *offsets,
                           size_t n, size_t heads, size_t kv_heads, size_t L, size_t dh,
                           void *q, void *k, void *v);

/* Softmax of each row of the scores [n, heads, L, L] (query-major) over
 * the keys of its own sequence (and, when causal, only those at or
 * before the query's position); rel, when not NULL, is a float32 table
 * [heads, 2 rel_span - 1] whose entry (j - i) + rel_span - 1 (the
 * distance clamped to +-(rel_span - 1)) is added to the score of query i
 * and key j first. Keys left out get probability 0; rows of padding
 * queries are all 0. Float32 statistics, shifted by the row's max; one
 * warp per row. */
cudaError_t kc_attn_softmax(cudaStream_t s, enum kc_type t, void *scores,
                            const uint32_t *offsets, size_t n, size_t heads, size_t L,
                            int causal, const float *rel, size_t rel_span);

/* The padded context ctxp [n, heads, L, dh] back into packed rows of out
 * (ldo elements apart, heads x dh columns): token t of sequence seq[t] at
 * position pos[t]. */
cudaError_t kc_attn_scatter(cudaStream_t s, enum kc_type t, const void *ctxp,
                            const uint32_t *seq, const uint32_t *pos, size_t tokens,
                            size_t heads, size_t L, size_t dh, void *out, size_t ldo);

/* One row per sequence from its own tokens of x [T, w]: the first, the
 * mean, the elementwise max or the last, into y [n, w], float32 when
 * y_f32, else of type t. Sums in float32. */
cudaError_t kc_pool(cudaStream_t s, enum kc_type t, const void *x, const uint32_t *offsets,
                    size_t n, size_t w, enum kc_pool mode, void *y, int y_f32);

/* ---- the paged key/value cache ----------------------------------------
 * The cache is of the activations' type t: K and V each hold `blocks`
 * blocks of block_tokens rows of row (kv_heads x dh) values; tables
 * (device memory) gives each
 * sequence's table_w block ids, sequence i's row at i x table_w. A token
 * t of a packed step (seq[t], pos[t]: device memory) lives in block
 * tables[seq[t] table_w + pos[t] / block_tokens], row pos[t] %
 * block_tokens. */

/* Stores each of tokens tokens' key and value rows (k + t ldk, v + t ldv,
 * row values of the activations' type) in its slot of K and V; with
 * inv_freq (dh / 2 floats, device memory) each key head of dh is rotated
 * to its position as kc_rope rotates, in float32, then rounded to the
 * type once. A token whose position falls outside its table or whose
 * block id is not below blocks is not stored (the attention then answers
 * NaN for it). */
cudaError_t kc_kv_store(cudaStream_t s, enum kc_type t, void *K, void *V, const void *k,
                        size_t ldk, const void *v, size_t ldv, const uint32_t *seq,
                        const uint32_t *pos, size_t tokens, const uint32_t *tables,
                        size_t table_w, size_t block_tokens, size_t blocks, size_t row,
                        size_t dh, const float *inv_freq);

/* Attention of each new token's query heads (q + t ldq + h dh) over its
 * sequence's cached positions 0 .. pos[t]: softmax(scale q k^T) v into
 * out + t ldo + h dh, head h reading cache head h / group. An online
 * softmax over tiles of positions, any context length: one block per
 * (token, head), or, unless the context is split (below, first), with
 * at least two tiles' worth of tokens (kc_paged_prefill_tokens) and a
 * tile's worth per sequence on average (seqs: the step's sequences; 0:
 * not known), the tiled prefill kernel of gpu/cuda_attn.cu
 * (kc_paged_prefill), whose blocks share each key and value they load
 * among a tile of tokens and the query heads of one cache head. The
 * first lone tokens (at most tokens and seqs; 0: not known) are each a
 * sequence of their own: when the tokens and sequences after them meet
 * that rule (and a tile is more than one token), those take the tiled
 * kernel and the lone tokens the one-row walk (split as below when they
 * are few); else the rule is judged on the whole step. gpu/plan.h's
 * plan_paged_attention makes these choices. dh is at most
 * KC_PAGED_MAX_DH. A position at or past max_ctx, or one whose block the
 * table does not hold, gives NaN rows (the runtime never passes one).
 *
 * Few (token, head) rows (at most KC_SPLIT_ROWS: a decode step of few
 * sequences, which would leave most of the device idle) over a max_ctx
 * longer than KC_SPLIT_CHUNK split each row's context into parts of at
 * least that many positions (at most KC_SPLIT_MAX parts), one block
 * each, their partial sums in scratch (kc_paged_attention_scratch bytes
 * for the max_tokens the caller passes at most), then a second kernel
 * rescales and combines them. scratch NULL: never split. */
#define KC_PAGED_MAX_DH 256
#define KC_SPLIT_ROWS 256
#define KC_SPLIT_MAX 32
#define KC_SPLIT_CHUNK 256
size_t kc_paged_attention_scratch(size_t max_tokens, size_t heads);
cudaError_t kc_paged_attention(cudaStream_t s, enum kc_type t, const void *q, size_t ldq,
                               size_t tokens, size_t heads, size_t group, float scale,
                               const void *K, const void *V, const uint32_t *seq,
                               const uint32_t *pos, const uint32_t *tables, size_t table_w,
                               size_t block_tokens, size_t blocks, size_t kv_heads, size_t dh,
                               size_t max_ctx, void *out, size_t ldo, float *scratch,
                               size_t seqs, size_t lone);

/* ---- sampling (gpu/cuda_sample.cu) --------------------------------------
 * One row's parameters and result, laid out as backend.h's bk_sample_row
 * and bk_sample_out (gpu/cuda_prims.c checks that they match). */
#define KC_SAMPLE_ON 1u      /* the row picks a token (else it is skipped) */
#define KC_SAMPLE_LOGPROB 2u /* and its raw log-probability */
struct kc_sample_row {
    float temperature;       /* 0: greedy */
    uint32_t top_k;          /* 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    double u;                /* the row's uniform draw in [0, 1) */
    uint32_t flags;
    uint32_t pad;
};
struct kc_sample_out {
    int32_t id;              /* -1: no finite logit */
    float logprob;           /* NaN with id -1; 0 unless asked */
};

/* The next token of each of rows rows of logits (vocab values of type t,
 * ld apart): gen/sample.h's choice (greedy, temperature, top-k, top-p,
 * min-p, the draw u walking the kept tokens in id order) made on the
 * device, one block per row. p and out are device memory, rows entries;
 * ids (device memory, rows entries) may be NULL, else each picking row's
 * id goes there too (0 for -1): the token ids of a step to follow. */
cudaError_t kc_sample(cudaStream_t s, enum kc_type t, const void *logits, size_t ld, size_t rows,
                      size_t vocab, const struct kc_sample_row *p, struct kc_sample_out *out,
                      int32_t *ids);

/* A GEMM in the activation type, for the shapes cuBLASLt has no
 * algorithm for (gpu/cuda_lt.c): for each of batch matrices z,
 * C_z = act(alpha A_z op(B_z) + bias), row-major: A_z [m,k] at a + z sa
 * (rows lda apart), B_z at b + z sb (sb 0: one B for the batch) either
 * [n,k] (trans_b: a weight as nn.Linear keeps it, or activations) or
 * [k,n], rows ldb apart, C_z [m,n] at c + z sc (rows ldc apart, columns
 * past n untouched), bias n values or NULL. Products summed in float32;
 * the bias and activation applied to the float32 sum before the one
 * rounding to the type. C overlaps neither A nor B. A plain kernel (a
 * 16 x 16 tile per block through shared memory), not a fast one. */
struct kc_gemm_op {
    size_t m, n, k, batch;
    float alpha;
    const void *a;
    size_t lda, sa;
    const void *b;
    int trans_b;
    size_t ldb, sb;
    const void *bias;
    enum kc_act act;
    void *c;
    size_t ldc, sc;
};
cudaError_t kc_gemm(cudaStream_t s, enum kc_type t, const struct kc_gemm_op *g);

/* Writes through an address no allocation owns: an illegal-address
 * fault, sticky for the process's context. The fault tests' kernel. */
cudaError_t kc_fault(cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

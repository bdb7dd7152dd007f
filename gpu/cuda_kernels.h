/* cuda_kernels.h - the CUDA backend's own kernels, behind C launchers that
 * gpu/backend_cuda.c calls: everything but the GEMMs (cuBLASLt does those,
 * with the bias and a following ReLU, or an encoder's tanh GELU, fused in
 * its epilogue). Each launcher
 * computes its grid, launches on the given stream and returns
 * cudaGetLastError(), so a bad launch is reported where it happened.
 * Only files in gpu/ include this header (it includes CUDA's).
 *
 * Activations are float32, half or bfloat16 (enum kc_type); every kernel
 * computes in float32 and keeps row statistics (layernorm, softmax,
 * l2norm) in float32, with PyTorch's semantics, as gpu/backend_cpu.c does.
 * Every op works in place on rows x w elements, row-major.
 *
 * Threads: any host thread, on a stream it owns. */
#ifndef KINFER_CUDA_KERNELS_H
#define KINFER_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

enum kc_type { KC_F32 = 0, KC_F16, KC_BF16 };

/* Elementwise activations: relu keeps NaN, gelu is the erf form,
 * gelu_tanh the tanh approximation (hidden_act "gelu_new"). */
enum kc_act { KC_NONE = 0, KC_RELU, KC_GELU, KC_TANH, KC_SIGMOID, KC_GELU_TANH };

/* How an encoder's pooling reduces a sequence's tokens. */
enum kc_pool { KC_POOL_CLS = 0, KC_POOL_MEAN, KC_POOL_MAX };

#ifdef __cplusplus
extern "C" {
#endif

/* y = x converted: float32 to type t (kc_from_f32) or back (kc_to_f32),
 * n elements; x and y do not overlap. */
cudaError_t kc_from_f32(cudaStream_t s, enum kc_type t, const float *x, void *y, size_t n);
cudaError_t kc_to_f32(cudaStream_t s, enum kc_type t, const void *x, float *y, size_t n);

/* x = act(x + bias) over rows x w elements of type t; bias (w elements of
 * type t) may be NULL. */
cudaError_t kc_bias_act(cudaStream_t s, enum kc_type t, void *x, const void *bias, size_t rows,
                        size_t w, enum kc_act act);

/* Layernorm of each row (biased variance, float32 statistics); gamma and
 * beta are float32 (w each) or NULL for ones and zeros. */
cudaError_t kc_layernorm(cudaStream_t s, enum kc_type t, void *x, const float *gamma,
                         const float *beta, float eps, size_t rows, size_t w);

/* Softmax of each row, shifted by its max. */
cudaError_t kc_softmax(cudaStream_t s, enum kc_type t, void *x, size_t rows, size_t w);

/* x / max(||x||_2, 1e-12) of each row, as F.normalize. */
cudaError_t kc_l2norm(cudaStream_t s, enum kc_type t, void *x, size_t rows, size_t w);

/* ---- text encoders ----------------------------------------------------
 * A batch of n sequences is packed: T tokens in all, sequence i being
 * tokens offsets[i] .. offsets[i+1] (offsets: n + 1 entries, device
 * memory), and seq[t] the sequence token t belongs to. Token rows are
 * row-major [T, w]. Attention runs padded: L is at least the batch's
 * longest sequence (the backend rounds it up for alignment), and a padded
 * tensor is [n, heads, L, dh] (dh = w / heads), sequence-major then
 * head-major, its rows past a sequence's length zero.
 * Every index was checked on the host (gpu/model.c): ids below the
 * vocabulary, type ids below the type vocabulary, lengths 1..L. */

/* x[t] = LayerNorm(word[ids[t]] + pos[t - offsets[seq[t]]] + type[types[t]])
 * for every token (positions restart at 0 per sequence); the tables are
 * [*, w] of type t, gamma and beta float32 (or NULL). The sum is kept in
 * float32 for the statistics, never rounded before them. */
cudaError_t kc_embed(cudaStream_t s, enum kc_type t, void *x, const void *word, const void *pos,
                     const void *type, const float *gamma, const float *beta, float eps,
                     const uint32_t *ids, const uint32_t *types, const uint32_t *seq,
                     const uint32_t *offsets, size_t tokens, size_t w);

/* x = LayerNorm(x + y) of each row, in place: the residual sum in float32,
 * as kc_layernorm's statistics. */
cudaError_t kc_add_layernorm(cudaStream_t s, enum kc_type t, void *x, const void *y,
                             const float *gamma, const float *beta, float eps, size_t rows,
                             size_t w);

/* Packed projections qkv [T, 3w] (query, key, value side by side, as the
 * stacked [3w, w] weight makes them) into the padded q, k and v, each
 * [n, heads, L, dh]; padding rows are written as zeros. */
cudaError_t kc_attn_gather(cudaStream_t s, enum kc_type t, const void *qkv,
                           const uint32_t *offsets, size_t n, size_t heads, size_t L, size_t dh,
                           void *q, void *k, void *v);

/* Softmax of each row of the scores [n, heads, L, L] (query-major) over
 * the keys of its own sequence: keys past the sequence's length get
 * probability 0, and the rows of padding queries are all 0. Float32
 * statistics, shifted by the row's max; one warp per row. */
cudaError_t kc_attn_softmax(cudaStream_t s, enum kc_type t, void *scores,
                            const uint32_t *offsets, size_t n, size_t heads, size_t L);

/* The padded context ctxp [n, heads, L, dh] back into packed rows ctx
 * [T, heads x dh] (token t of sequence seq[t] at position
 * t - offsets[seq[t]]). */
cudaError_t kc_attn_scatter(cudaStream_t s, enum kc_type t, const void *ctxp,
                            const uint32_t *seq, const uint32_t *offsets, size_t tokens,
                            size_t heads, size_t L, size_t dh, void *ctx);

/* One row per sequence from its own tokens of x [T, w]: the first (cls),
 * the mean or the elementwise max, into y [n, w], float32 when y_f32, else
 * of type t. Sums in float32. */
cudaError_t kc_pool(cudaStream_t s, enum kc_type t, const void *x, const uint32_t *offsets,
                    size_t n, size_t w, enum kc_pool mode, void *y, int y_f32);

/* Writes through an address no allocation owns: an illegal-address
 * fault, sticky for the process's context. The fault tests' kernel. */
cudaError_t kc_fault(cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

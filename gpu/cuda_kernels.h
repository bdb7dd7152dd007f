/* cuda_kernels.h - the CUDA backend's own kernels, behind C launchers that
 * gpu/backend_cuda.c calls: everything but the GEMMs (cuBLASLt does those,
 * with the bias and a following ReLU fused in its epilogue). Each launcher
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

enum kc_type { KC_F32 = 0, KC_F16, KC_BF16 };

/* Elementwise activations: relu keeps NaN, gelu is the erf form. */
enum kc_act { KC_NONE = 0, KC_RELU, KC_GELU, KC_TANH, KC_SIGMOID };

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

/* Writes through an address no allocation owns: an illegal-address
 * fault, sticky for the process's context. The fault tests' kernel. */
cudaError_t kc_fault(cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

// cuda_common.cuh - what the CUDA backend's kernel files share
// (gpu/cuda_kernels.cu, gpu/cuda_attn.cu): the block size, loads and
// stores through float32 whatever the activations' type, the
// launchers' dispatch on that type, and the launchers one file calls in
// another.
// Included by .cu files only (nvcc, or the host's C++ compiler over
// emu/emu_kernel.h for the emulated device).
#ifndef KINFER_CUDA_COMMON_CUH
#define KINFER_CUDA_COMMON_CUH

#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

namespace {

constexpr int kThreads = 256;   // threads per block
constexpr int kWarps = kThreads / 32;

// Loads and stores through float32, whatever the storage type.
__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// A product and a fused multiply-add as written, never contracted or
// split by the compiler: paged attention's two kernels (the one-row walk
// in cuda_kernels.cu, the prefill tiles in cuda_attn.cu) take a row's
// sums with them in the same order, so a row comes out the same to the
// bit from either. The emulated device has no such intrinsics: there
// they are the host's product and fmaf.
// The warp's sum (op 0) or max (op 1) of v, returned to every lane: the
// butterfly block_reduce (gpu/cuda_kernels.cu) also takes, so the paged
// attention kernels of both files sum the same values to the same bits.
__device__ __forceinline__ float warp_reduce(float v, int op)
{
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = op ? fmaxf(v, u) : v + u;
    }
    return v;
}

#ifdef KINFER_EMU_KERNEL_H
__device__ __forceinline__ float __fmul_rn(float a, float b) { return a * b; }
__device__ __forceinline__ float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
#endif

// Calls f with a null pointer of the storage type t names, so a launcher
// writes its launch once for the three types; then reports the launch.
template <typename F>
cudaError_t with_type(enum kc_type t, F f)
{
    switch (t) {
    case KC_F32: f((float *)nullptr); break;
    case KC_F16: f((__half *)nullptr); break;
    case KC_BF16: f((__nv_bfloat16 *)nullptr); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

}  // namespace

// The storage type of with_type's argument.
#define KC_T(p) std::remove_pointer_t<decltype(p)>

// ---- gpu/cuda_attn.cu: paged attention for prefill chunks ----------------
// kc_paged_attention's contract (cuda_kernels.h), one block per tile of
// kc_paged_prefill_tokens(group) consecutive tokens and the query heads
// of a cache head, reading each tile of keys and values once for all of
// them. Any packing of seq and pos is answered correctly; it pays when
// the tiles' tokens are mostly of one sequence (prefill chunks).
size_t kc_paged_prefill_tokens(size_t group);
cudaError_t kc_paged_prefill(cudaStream_t s, enum kc_type t, const void *q, size_t ldq,
                             size_t tokens, size_t heads, size_t group, float scale,
                             const void *K, const void *V, const uint32_t *seq,
                             const uint32_t *pos, const uint32_t *tables, size_t table_w,
                             size_t block_tokens, size_t blocks, size_t kv_heads, size_t dh,
                             size_t max_ctx, void *out, size_t ldo);

#endif

// cuda_common.cuh - what the CUDA backend's kernel files share
// (gpu/cuda_kernels.cu): the block size, loads and
// stores through float32 whatever the activations' type, and the
// launchers' dispatch on that type.
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

#endif

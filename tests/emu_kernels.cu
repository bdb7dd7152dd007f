// emu_kernels.cu - CUDA kernels for tests/test_emu_kernel.c, compiled
// by the host compiler over emu/emu_kernel.h (never by nvcc): correct
// ones, and ones with the bugs the emulated device must catch (a missing
// __syncthreads() before a shared-memory read, a shuffle whose mask names
// a lane that left). Launches are CUDA's own; the build rewrites them
// to EMU_LAUNCH (emu/emu_kernel.h) as it does gpu/cuda_kernels.cu's.
#include <stddef.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename T>
__global__ void scale_kernel(const T *x, T *y, size_t n, float a, float b)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = (T)(a * (float)x[i] + b);
}

// One block per row: warp sums by shuffles, then the warps' sums through
// shared memory; sync 0 leaves out the barrier before the read.
__global__ void row_sum_kernel(const float *x, size_t w, float *out, int sync)
{
    __shared__ float part[kWarps];
    const float *row = x + blockIdx.x * w;
    float v = 0.0f;
    for (size_t i = threadIdx.x; i < w; i += blockDim.x) v += row[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    if (sync) __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int k = 0; k < kWarps; k++) s += part[k];
        out[blockIdx.x] = s;
    }
}

// Lanes 0-15 of one warp sum their values with a half-warp mask; with
// leave, lanes 16-31 return first and 0-15 name all 32 lanes: a hang.
__global__ void half_warp_kernel(const int *x, int *out, int leave)
{
    int lane = threadIdx.x;
    if (lane >= 16) return;
    unsigned mask = leave ? 0xffffffffu : 0x0000ffffu;
    int v = x[lane];
    for (int o = 8; o > 0; o >>= 1) v += __shfl_down_sync(mask, v, o, 16);
    if (lane == 0) *out = v;
}

// A histogram of x's values (0..bins-1) through shared-memory atomic
// adds, many threads of several blocks adding to one bin between
// barriers, then every block's counts added to out's.
__global__ void histogram_kernel(const unsigned *x, size_t n, unsigned *out, unsigned bins)
{
    __shared__ unsigned h[64];
    for (unsigned b = threadIdx.x; b < bins; b += blockDim.x) h[b] = 0;
    __syncthreads();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&h[x[i]], 1u);
    __syncthreads();
    for (unsigned b = threadIdx.x; b < bins; b += blockDim.x) atomicAdd(&out[b], h[b]);
}

}  // namespace

extern "C" cudaError_t emu_test_scale(cudaStream_t s, const float *x, float *y, size_t n)
{
    unsigned blocks = (unsigned)((n + kThreads - 1) / kThreads);
    scale_kernel<<<blocks ? blocks : 1, kThreads, 0, s>>>(x, y, n, 2.0f, 1.0f);
    return cudaGetLastError();
}

extern "C" cudaError_t emu_test_row_sum(cudaStream_t s, const float *x, size_t rows, size_t w,
                                        float *out, int sync)
{
    row_sum_kernel<<<(unsigned)rows, kThreads, 0, s>>>(x, w, out, sync);
    return cudaGetLastError();
}

extern "C" cudaError_t emu_test_half_warp(cudaStream_t s, const int *x, int *out, int leave)
{
    half_warp_kernel<<<1, 32, 0, s>>>(x, out, leave);
    return cudaGetLastError();
}

extern "C" cudaError_t emu_test_bad_config(cudaStream_t s, float *y)
{
    scale_kernel<<<1, 1025, 0, s>>>((const float *)y, y, (size_t)1, 1.0f, 0.0f);
    return cudaGetLastError();
}

extern "C" cudaError_t emu_test_histogram(cudaStream_t s, const unsigned *x, size_t n,
                                          unsigned *out, unsigned bins)
{
    if (bins > 64) return cudaErrorInvalidValue;
    histogram_kernel<<<4, kThreads, 0, s>>>(x, n, out, bins);
    return cudaGetLastError();
}

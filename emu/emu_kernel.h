/* emu_kernel.h - the CUDA execution model on the host, for CUDA sources
 * compiled by the host's C++ compiler (g++ -x c++ -include
 * emu/emu_kernel.h FILE.cu) to run on the emulated device (emu_rt.h).
 *
 * __global__ and __device__ functions become plain functions; a launch,
 * written EMU_LAUNCH(kernel, grid, block, shared, stream)(args...) where
 * the device build writes kernel<<<grid, block, shared, stream>>>(args...),
 * checks its configuration as the device does and enqueues the grid on
 * the stream (so it is captured into graphs like any work). The grid's
 * blocks run one after another in a shuffled order; a block's threads
 * are cooperative contexts (stacks of their own, switched by hand on
 * x86-64, by ucontext elsewhere) on the running host thread, run in
 * a shuffled order (seeded, reproducible) between the points where they
 * wait for each other: __syncthreads() and the warp shuffles, whose mask
 * is honoured (every lane it names must reach the same shuffle, or the
 * launch fails as a hung kernel would: cudaErrorLaunchFailure, sticky).
 * __shared__ variables are per host thread, so one block's threads share
 * them. Half and bfloat16 are cuda_fp16.h's and cuda_bf16.h's host types.
 *
 * What it cannot tell: speed, real concurrency between blocks (they run
 * one at a time), and memory-model subtleties within a block (a context
 * switch happens only at a barrier or shuffle, so a race between two
 * plain accesses of different threads with no barrier between them is
 * caught only where the shuffled order changes the result). */
#ifndef KINFER_EMU_KERNEL_H
#define KINFER_EMU_KERNEL_H

#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <utility>

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
#undef __shared__
#define __shared__ static thread_local
#undef __launch_bounds__
#define __launch_bounds__(...)

/* The running thread's coordinates, set by the scheduler at each switch. */
extern thread_local uint3 emu_threadIdx, emu_blockIdx;
extern thread_local dim3 emu_blockDim, emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

extern "C" {
/* Waits for the block's other threads (emu_kernel.cc). */
void emu_syncthreads(void);
/* Posts bits for the warp's lanes in mask, waits for all of them, and
 * returns the bits lane src posted (the caller's own when src is outside
 * the mask or the warp). */
uint64_t emu_shfl(unsigned mask, uint64_t bits, int src);
/* The running thread's lane in its warp. */
int emu_lane(void);

/* Launches a grid: checks the configuration, then enqueues fn(arg) for
 * every thread of every block on stream. Returns the cudaError_t, also
 * the thread's last error. */
cudaError_t emu_launch(cudaStream_t stream, dim3 grid, dim3 block, size_t shared,
                       void (*fn)(void *arg), const void *arg, size_t arg_size);

/* Seeds the shuffled orders of the launches that follow on this host
 * thread (tests replay an order with it). */
void emu_kernel_seed(uint64_t seed);
}

#define __syncthreads() emu_syncthreads()

static inline float rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}

template <typename T>
static inline T emu_shfl_t(unsigned mask, T v, int src, int width)
{
    static_assert(sizeof(T) <= 8, "a shuffled value fits 64 bits");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    int lane = emu_lane(), base = lane & ~(width - 1);
    b = emu_shfl(mask, b, base + (src & (width - 1)));
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return emu_shfl_t(mask, v, src, width);
}

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return emu_shfl_t(mask, v, emu_lane() ^ lane_mask, width);
}

template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = emu_lane(), in = lane & (width - 1);
    int src = in + (int)delta < width ? lane + (int)delta : lane;
    return emu_shfl_t(mask, v, src, 64);
}

template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = emu_lane(), in = lane & (width - 1);
    int src = in >= (int)delta ? lane - (int)delta : lane;
    return emu_shfl_t(mask, v, src, 64);
}

/* atomicAdd: a block's threads switch only at barriers and shuffles, and
 * blocks run one at a time, so a plain read-modify-write is atomic here.
 * The order of a block's adds is its threads' shuffled order, so a float
 * sum taken this way differs between runs as it does on a device. */
template <typename T, typename V>
static inline T atomicAdd(T *p, V v)
{
    T old = *p;
    *p = (T)(old + (T)v);
    return old;
}

/* The warp's lanes in mask whose pred is set, one bit each (every lane
 * of mask must call it, as with the shuffles it is made of). */
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    unsigned v = pred ? 1u << (emu_lane() & 31) : 0u;
    for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(mask, v, o);
    return v & mask;
}

static inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}

namespace emu {

/* A launch's configuration, then its kernel (a lambda that calls it with
 * deduced template arguments), then its arguments. */
struct launcher {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
    launcher(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0)
        : grid(g), block(b), shared(s), stream(st) {}
};

template <typename F, typename... A>
struct job {
    F f;
    std::tuple<A...> args;
    static void run(void *self)
    {
        job *j = static_cast<job *>(self);
        std::apply(j->f, j->args);
    }
};

template <typename F>
struct bound {
    launcher l;
    F f;
    template <typename... A>
    void operator()(A... a) const
    {
        job<F, A...> j{f, std::tuple<A...>(a...)};
        (void)emu_launch(l.stream, l.grid, l.block, l.shared, &job<F, A...>::run, &j, sizeof(j));
    }
};

template <typename F>
bound<F> operator%(launcher l, F f)
{
    return bound<F>{l, f};
}

}  // namespace emu

#define EMU_LAUNCH(kernel, ...) \
    (::emu::launcher(__VA_ARGS__) % [](auto... emu_a) { kernel(emu_a...); })

#endif

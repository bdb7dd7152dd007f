/* emu_rt.h - the emulated CUDA runtime's own additions. The runtime calls
 * it emulates are declared by CUDA's <cuda_runtime_api.h>, which
 * emu/emu_rt.c includes so that every signature (and every renaming macro
 * of the header) is the real one: code built for the emulated device
 * includes the real header and links emu/emu_rt.o where libcudart was.
 *
 * The emulated device: an H100 (sm_90, 132 SMs, 80 GB) named "emulated
 * NVIDIA H100 80GB HBM3"; device memory from the host's heap, exactly as
 * large as asked (so AddressSanitizer sees an access past its end);
 * every stream runs its work in order, at once, on the calling thread;
 * a capturing stream records its work into the graph instead, and a
 * graph's launch runs the records again. What a real capture forbids
 * (allocating, freeing, synchronising, a blocking copy, work on the legacy
 * stream) fails and invalidates the capture. A sticky error (an illegal
 * address, a launch failure) raised by work stops the device at once (no
 * later work runs) and, from the next synchronisation on (a stream, event
 * or device synchronise, a blocking copy or memset), makes every call on
 * its device fail with it, as a lost context does.
 *
 * Never linked into the normal build. Plain C. */
#ifndef KINFER_EMU_RT_H
#define KINFER_EMU_RT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues fn(arg) on stream (a cudaStream_t; NULL is the legacy stream):
 * runs it now, or records it while the stream captures. arg (arg_size
 * bytes) is copied; the copy lives as long as a graph holding it. Returns
 * 0 or a cudaError_t (the device's sticky error, a capture violation),
 * also kept as the thread's last error. What emulated kernels' launches
 * and the emulated cuBLASLt's matmuls go through. */
int emu_rt_enqueue(void *stream, void (*fn)(void *arg), const void *arg, size_t arg_size);

/* Called by work while it runs (a kernel that read out of bounds, say):
 * records e (a cudaError_t) on the device the work runs on; a sticky one
 * makes that device unusable until emu_rt_reset (reported from the next
 * synchronisation on). Outside work: a sticky e is reported at once, any
 * other becomes the thread's last error (a bad launch configuration). */
void emu_rt_device_error(int e);

/* Emulates n devices (1 to 16; 1 at start, or the environment's
 * KINFER_EMU_DEVICES, read at the first cudaGetDeviceCount), each with
 * mem_bytes of memory (0: an H100's 80 GB). Only before the first
 * allocation or after a reset; returns 0 or -1. */
int emu_rt_configure(int n, size_t mem_bytes);

/* Forgets everything (allocations are freed, errors cleared): for tests
 * that go on after a sticky error. No stream, event or graph made before
 * may be used after it. */
void emu_rt_reset(void);

/* The bytes of device memory allocated now on device dev. */
size_t emu_rt_used(int dev);

#ifdef __cplusplus
}
#endif

#endif

/* cuda.h - what the rest of kinfer may ask of CUDA, in plain C: no CUDA
 * header leaks out of gpu/. The functions exist when the build found nvcc
 * (it then defines KINFER_HAVE_CUDA for every C file and links
 * gpu/cuda_probe.cu, which nvcc compiles with __CUDACC__); without it the inline stand-ins below report no
 * devices, so callers need no #ifdef.
 *
 * Threads: any thread; in practice main at startup. */
#ifndef KINFER_CUDA_H
#define KINFER_CUDA_H

#include <stddef.h>
#include <stdio.h>

#if defined(KINFER_HAVE_CUDA) || defined(__CUDACC__)

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices this process can use. 0 when there is none or no
 * driver (not an error: the CPU path serves). Any other CUDA error returns
 * -1 with errstr filled as "FILE:LINE: cudaGetDeviceCount: MESSAGE". */
int gpu_device_count(char *errstr, size_t errstr_size);

/* Writes device dev's name into name (n bytes, caller's). Returns 0, or -1
 * with name holding "FILE:LINE: CALL: MESSAGE" instead. */
int gpu_device_name(int dev, char *name, size_t n);

#ifdef __cplusplus
}
#endif

#else

/* Built without nvcc: no devices, never an error. */
static inline int gpu_device_count(char *errstr, size_t errstr_size)
{
    if (errstr && errstr_size) errstr[0] = '\0';
    return 0;
}

/* Built without nvcc: there is no device to name. */
static inline int gpu_device_name(int dev, char *name, size_t n)
{
    if (name && n) snprintf(name, n, "device %d: built without CUDA", dev);
    return -1;
}

#endif

#endif

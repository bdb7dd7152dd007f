/* cuda_probe.cu - finds out whether CUDA devices are usable and names
 * them, for startup logging and backend choice. The CUDA model backend
 * will live beside it in gpu/ (a later issue); this file is the first to
 * include CUDA headers and sets the error-checking convention for them.
 *
 * Threads: any thread (the CUDA runtime is thread-safe); in practice the
 * main thread at startup. Ownership: callers own every buffer passed in;
 * nothing is kept. */
#include "cuda.h"

#include <cuda_runtime.h>

#include <stdio.h>

/* Formats a failed CUDA call as "FILE:LINE: CALL: MESSAGE" and returns
 * -1, so call sites stay one line and every message names where it came
 * from. */
static int gpu_fail(cudaError_t e, const char *call, const char *file, int line,
                    char *errstr, size_t errstr_size)
{
    if (errstr && errstr_size)
        snprintf(errstr, errstr_size, "%s:%d: %s: %s", file, line, call,
                 cudaGetErrorString(e));
    return -1;
}

/* GPU_CALL(rc, errstr, n, fn, args...): calls fn(args...), keeps its
 * status in rc (for callers that tolerate some codes) and evaluates to 0,
 * or to -1 with errstr filled naming fn, this file and the line. */
#define GPU_CALL(rc, errstr, n, fn, ...)                                         \
    (((rc) = fn(__VA_ARGS__)) == cudaSuccess                                     \
         ? 0                                                                     \
         : gpu_fail((rc), #fn, __FILE__, __LINE__, (errstr), (n)))

/* "No device" and "no (or too old a) driver" mean a CPU-only machine, not
 * a broken one: report 0 devices. The runtime records the failure as the
 * last error, so it is cleared here lest a later check trip on it. */
extern "C" int gpu_device_count(char *errstr, size_t errstr_size)
{
    int count = 0;
    cudaError_t rc;
    if (errstr && errstr_size) errstr[0] = '\0';
    if (GPU_CALL(rc, errstr, errstr_size, cudaGetDeviceCount, &count) != 0) {
        if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
            (void)cudaGetLastError();
            if (errstr && errstr_size) errstr[0] = '\0';
            return 0;
        }
        return -1;
    }
    return count;
}

/* Names come from the device properties; the error text goes into name
 * itself since callers only print it. */
extern "C" int gpu_device_name(int dev, char *name, size_t n)
{
    cudaDeviceProp prop;
    cudaError_t rc;
    if (GPU_CALL(rc, name, n, cudaGetDeviceProperties, &prop, dev) != 0) return -1;
    if (name && n) snprintf(name, n, "%s", prop.name);
    return 0;
}

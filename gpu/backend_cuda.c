/* backend_cuda.c - the CUDA backend of backend.h. For now it only probes:
 * it counts and names the usable devices (for `worker.backend = "auto"`,
 * `kinfer --version` and the log) and refuses to open, so the CPU runs
 * the models. Compiled, with the CUDA headers, only when the build has
 * CUDA; cuda_stub.c stands in otherwise. Only files in gpu/ include CUDA
 * headers, and this one uses the runtime's C API.
 *
 * Threads: any (the CUDA runtime is thread-safe); no state. */
#include "backend.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

/* "No device" and "no (or too old a) driver" mean a machine without a
 * GPU, not a broken one: 0 devices, with the reason. The runtime records
 * the failure as the last error; it is cleared lest a later check trip on
 * it. */
static int cuda_probe(char *what, size_t what_size)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        if (what && what_size)
            snprintf(what, what_size, "%s",
                     rc == cudaErrorNoDevice            ? "no CUDA device"
                     : rc == cudaErrorInsufficientDriver ? "no CUDA driver, or one too old"
                                                         : cudaGetErrorString(rc));
        return 0;
    }
    struct cudaDeviceProp prop;
    if (what && what_size) {
        if (count > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            snprintf(what, what_size, "%d x %s", count, prop.name);
        else
            snprintf(what, what_size, "%d device(s)", count);
    }
    return count;
}

static void *cuda_open(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                       char *errstr, size_t errstr_size)
{
    (void)c;
    (void)desc;
    (void)desc_size;
    snprintf(errstr, errstr_size, "the CUDA backend cannot run models yet");
    return NULL;
}

static void cuda_close(void *be)
{
    (void)be;
}

static void *cuda_model_new(void *be, const struct backend_plan *p, char *errstr,
                            size_t errstr_size)
{
    (void)be;
    snprintf(errstr, errstr_size, "model %s: the CUDA backend cannot run models yet", p->name);
    return NULL;
}

static void cuda_model_free(void *be, void *bm)
{
    (void)be;
    (void)bm;
}

static void *cuda_ws_new(void *be, void *bm, const struct backend_plan *p, unsigned slot,
                         size_t max_rows, char *errstr, size_t errstr_size)
{
    (void)be;
    (void)bm;
    (void)slot;
    (void)max_rows;
    snprintf(errstr, errstr_size, "model %s: the CUDA backend cannot run models yet", p->name);
    return NULL;
}

static void cuda_ws_free(void *ws)
{
    (void)ws;
}

static float *cuda_ws_input(void *ws)
{
    (void)ws;
    return NULL;
}

static int cuda_forward(void *ws, const float *in, size_t rows, const float **out,
                        char *errstr, size_t errstr_size)
{
    (void)ws;
    (void)in;
    (void)rows;
    (void)out;
    snprintf(errstr, errstr_size, "the CUDA backend cannot run models yet");
    return MODEL_EINVAL;
}

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .compiled_in = 1,
    .probe = cuda_probe,
    .open = cuda_open,
    .close = cuda_close,
    .model_new = cuda_model_new,
    .model_free = cuda_model_free,
    .ws_new = cuda_ws_new,
    .ws_free = cuda_ws_free,
    .ws_input = cuda_ws_input,
    .forward = cuda_forward,
};

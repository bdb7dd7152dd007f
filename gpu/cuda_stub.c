/* cuda_stub.c - the CUDA backend of a build without CUDA (no nvcc or no
 * CUDA runtime at build time; the Makefile compiles this file instead of
 * backend_cuda.c and its kernels). It finds no device and refuses to open,
 * saying why, so `worker.backend = "auto"` falls back to the CPU and
 * "cuda" fails with a clear message; callers need no #ifdef.
 *
 * Threads: any; no state. */
#include "backend.h"

#include <stdio.h>

#define NOT_BUILT "not built with CUDA (no nvcc or CUDA runtime when kinfer was compiled)"

static int stub_probe(char *what, size_t what_size)
{
    if (what && what_size) snprintf(what, what_size, "%s", NOT_BUILT);
    return 0;
}

static void *stub_open(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                       char *errstr, size_t errstr_size)
{
    (void)c;
    (void)desc;
    (void)desc_size;
    snprintf(errstr, errstr_size, "%s", NOT_BUILT);
    return NULL;
}

/* Never reached (open fails), but a table with holes would be a trap. */
static void stub_close(void *be)
{
    (void)be;
}

static void *stub_model_new(void *be, const struct backend_plan *p, char *errstr,
                            size_t errstr_size)
{
    (void)be;
    snprintf(errstr, errstr_size, "model %s: %s", p->name, NOT_BUILT);
    return NULL;
}

static void stub_model_free(void *be, void *bm)
{
    (void)be;
    (void)bm;
}

static void *stub_ws_new(void *be, void *bm, const struct backend_plan *p, unsigned slot,
                         size_t max_rows, size_t max_tokens, char *errstr,
                         size_t errstr_size)
{
    (void)max_tokens;
    (void)be;
    (void)bm;
    (void)slot;
    (void)max_rows;
    snprintf(errstr, errstr_size, "model %s: %s", p->name, NOT_BUILT);
    return NULL;
}

static void stub_ws_free(void *ws)
{
    (void)ws;
}

static float *stub_ws_input(void *ws)
{
    (void)ws;
    return NULL;
}

static int stub_forward(void *ws, const float *in, size_t rows, const float **out,
                        char *errstr, size_t errstr_size)
{
    (void)ws;
    (void)in;
    (void)rows;
    (void)out;
    snprintf(errstr, errstr_size, "%s", NOT_BUILT);
    return MODEL_EINVAL;
}

static void stub_inject_fault(void *ws)
{
    (void)ws;
}

static size_t stub_executors(void *be)
{
    (void)be;
    return 1;
}

static const char *stub_precision(void *be)
{
    (void)be;
    return "none";
}

static size_t stub_devices(void *be)
{
    (void)be;
    return 0;
}

static int stub_device_stats(void *be, size_t dev, struct model_device_stats *out)
{
    (void)be;
    (void)dev;
    (void)out;
    return -1;
}

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .compiled_in = 0,
    .probe = stub_probe,
    .open = stub_open,
    .close = stub_close,
    .model_new = stub_model_new,
    .model_free = stub_model_free,
    .ws_new = stub_ws_new,
    .ws_free = stub_ws_free,
    .ws_input = stub_ws_input,
    .forward = stub_forward,
    .inject_fault = stub_inject_fault,
    .executors = stub_executors,
    .precision = stub_precision,
    .devices = stub_devices,
    .device_stats = stub_device_stats,
};

/* cuda_stub.c - the CUDA backend of a build without CUDA (no nvcc or no
 * CUDA runtime at build time; the Makefile compiles this file instead of
 * gpu/backend_cuda.c, gpu/cuda_lt.c, gpu/cuda_prims.c and the kernels). It
 * finds no device and refuses to open, saying why, so `worker.backend =
 * "auto"` falls back to the CPU and "cuda" fails with a clear message;
 * callers need no #ifdef. Every other entry needs an open backend, so it
 * is left NULL: nothing can reach it.
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
    if (desc && desc_size) desc[0] = '\0';
    snprintf(errstr, errstr_size, "%s", NOT_BUILT);
    return NULL;
}

/* Never reached (open fails); there so a caller's cleanup path may call it. */
static void stub_close(void *be)
{
    (void)be;
}

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .compiled_in = 0,
    .probe = stub_probe,
    .open = stub_open,
    .close = stub_close,
};

/* cuda_stub.c - the CUDA backend of a build without CUDA (no nvcc or no
 * CUDA runtime at build time; the Makefile compiles this file instead of
 * backend_cuda.c and its kernels). It finds no device and refuses to open,
 * saying why, so `worker.backend = "auto"` falls back to the CPU and
 * "cuda" fails with a clear message; callers need no #ifdef. Since open
 * never succeeds, nothing else of the table is ever called: those entries
 * are NULL.
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

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .compiled_in = 0,
    .probe = stub_probe,
    .open = stub_open,
};

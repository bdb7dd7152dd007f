/* emu_rt.c - the CUDA runtime calls kinfer's CUDA backend makes
 * (gpu/backend_cuda.c, gpu/cuda_lt.c, gpu/cuda_prims.c and the kernels'
 * launchers), emulated on the host with the real header's types: devices
 * and their properties, memory, copies and memsets, streams, events,
 * graph capture and replay, and the error model (a thread's last error, a
 * device's sticky error). emu_rt.h says what the emulated device is.
 *
 * State: the runtime's is process-wide, as the real driver's is (a table
 * of devices, the allocations, the capturing streams), behind one mutex;
 * a thread's current device and last error are thread-local, as in CUDA.
 * Work runs on the thread that enqueues it (or launches its graph).
 *
 * Never linked into the normal build. */
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu_rt.h"

#define EMU_MAX_DEVICES 16
#define H100_MEM 85520809984ull /* an H100 SXM's 80 GB HBM3, as it reports them */

/* ---- state ----------------------------------------------------------------- */

struct alloc {
    char *p;
    size_t n;
    int dev, host;
};

struct work {
    void (*fn)(void *arg);
    void *arg;
    size_t size;
};

struct CUgraph_st {
    struct work *w;
    size_t n, cap;
};

struct CUgraphExec_st {
    struct CUgraph_st g;
    int dev;
};

struct CUstream_st {
    int dev;
    unsigned flags;
    /* capture */
    int capturing, invalidated;
    enum cudaStreamCaptureMode mode;
    pthread_t owner;
    struct CUgraph_st *graph;
};

struct CUevent_st {
    int dev;
    unsigned flags;
    int recorded;
    uint64_t ns;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int n_dev = 1;
static size_t dev_mem = H100_MEM;
static size_t used[EMU_MAX_DEVICES];
static atomic_int sticky[EMU_MAX_DEVICES];  /* reported by every call */
static atomic_int pending[EMU_MAX_DEVICES]; /* raised by work, not yet synchronised */
static struct alloc *allocs;
static size_t n_allocs, cap_allocs;
static struct CUstream_st *capturing[64]; /* streams capturing now */
static _Thread_local int cur_dev;
static _Thread_local cudaError_t last_err;
static _Thread_local int exec_dev = -1; /* the device whose work runs now */

static int is_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorInvalidAddressSpace:
        return 1;
    default:
        return 0;
    }
}

/* Every call's answer: a failure is kept as the thread's last error. */
static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess) last_err = e;
    return e;
}

/* The device's sticky error, or cudaSuccess. */
static cudaError_t dead(int dev)
{
    return (cudaError_t)atomic_load(&sticky[dev]);
}

/* A sticky error that work raised stops the device at once (no later
 * work runs) but, as on a device, calls report it only from the next
 * synchronisation on: then it is the device's sticky error. */
static int stopped(int dev)
{
    return atomic_load(&sticky[dev]) || atomic_load(&pending[dev]);
}

static cudaError_t surface(int dev)
{
    int p = atomic_load(&pending[dev]), none = cudaSuccess;
    if (p) atomic_compare_exchange_strong(&sticky[dev], &none, p);
    return dead(dev);
}

/* ---- capture rules -------------------------------------------------------- */

/* A call a real capture forbids (allocate, free, synchronise, copy
 * synchronously) from this thread: it invalidates every capture it would
 * break (all in global mode, this thread's in thread-local mode) and
 * answers cudaErrorStreamCaptureUnsupported. Caller holds mu. */
static cudaError_t unsafe_locked(void)
{
    int hit = 0;
    for (size_t i = 0; i < sizeof(capturing) / sizeof(capturing[0]); i++) {
        struct CUstream_st *s = capturing[i];
        if (!s) continue;
        if (s->mode == cudaStreamCaptureModeGlobal ||
            (s->mode == cudaStreamCaptureModeThreadLocal && pthread_equal(s->owner, pthread_self()))) {
            s->invalidated = 1;
            hit = 1;
        }
    }
    return hit ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

static cudaError_t unsafe(void)
{
    pthread_mutex_lock(&mu);
    cudaError_t e = unsafe_locked();
    pthread_mutex_unlock(&mu);
    return e;
}

/* Work on the legacy stream while a capture runs in global mode (or in
 * this thread) would join the capture implicitly. */
static cudaError_t legacy_during_capture(void)
{
    cudaError_t e = unsafe();
    return e == cudaSuccess ? e : cudaErrorStreamCaptureImplicit;
}

/* ---- work ------------------------------------------------------------------- */

static int graph_add(struct CUgraph_st *g, void (*fn)(void *), const void *arg, size_t size)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        struct work *w = realloc(g->w, cap * sizeof(*w));
        if (!w) return -1;
        g->w = w;
        g->cap = cap;
    }
    void *copy = malloc(size ? size : 1);
    if (!copy) return -1;
    if (size) memcpy(copy, arg, size);
    g->w[g->n].fn = fn;
    g->w[g->n].arg = copy;
    g->w[g->n].size = size;
    g->n++;
    return 0;
}

static void graph_clear(struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++) free(g->w[i].arg);
    free(g->w);
    memset(g, 0, sizeof(*g));
}

/* Runs fn(arg) as the device dev's work; a sticky error it raises stops
 * nothing already done but everything after. */
static void run_on(int dev, void (*fn)(void *), void *arg)
{
    int prev = exec_dev;
    exec_dev = dev;
    fn(arg);
    exec_dev = prev;
}

static cudaError_t enqueue(cudaStream_t s, void (*fn)(void *), const void *arg, size_t size)
{
    int dev = s ? s->dev : cur_dev;
    cudaError_t e = dead(dev);
    if (e != cudaSuccess) return ret(e);
    if (!s && (e = legacy_during_capture()) != cudaSuccess) return ret(e);
    if (s && s->capturing) {
        if (s->invalidated) return ret(cudaErrorStreamCaptureInvalidated);
        if (s->mode != cudaStreamCaptureModeRelaxed && s->mode != cudaStreamCaptureModeGlobal &&
            !pthread_equal(s->owner, pthread_self()))
            return ret(cudaErrorStreamCaptureWrongThread);
        if (graph_add(s->graph, fn, arg, size) < 0) return ret(cudaErrorMemoryAllocation);
        return cudaSuccess;
    }
    if (stopped(dev)) return cudaSuccess; /* the device stopped: nothing runs */
    /* Run at once; the copy keeps the arguments as they were at the call. */
    void *copy = malloc(size ? size : 1);
    if (!copy) return ret(cudaErrorMemoryAllocation);
    if (size) memcpy(copy, arg, size);
    run_on(dev, fn, copy);
    free(copy);
    return cudaSuccess;
}

int emu_rt_enqueue(void *stream, void (*fn)(void *arg), const void *arg, size_t arg_size)
{
    cudaStream_t s = stream;
    if (s && s->dev != cur_dev) return ret(cudaErrorInvalidResourceHandle);
    return enqueue(s, fn, arg, arg_size);
}

void emu_rt_device_error(int e)
{
    int dev = exec_dev >= 0 ? exec_dev : cur_dev;
    if (is_sticky((cudaError_t)e)) {
        int none = cudaSuccess;
        atomic_compare_exchange_strong(exec_dev >= 0 ? &pending[dev] : &sticky[dev], &none, e);
        return;
    }
    last_err = (cudaError_t)e;
}

/* ---- devices ------------------------------------------------------------------ */

int emu_rt_configure(int n, size_t mem_bytes)
{
    if (n < 1 || n > EMU_MAX_DEVICES) return -1;
    pthread_mutex_lock(&mu);
    int busy = n_allocs != 0;
    if (!busy) {
        n_dev = n;
        dev_mem = mem_bytes ? mem_bytes : H100_MEM;
    }
    pthread_mutex_unlock(&mu);
    return busy ? -1 : 0;
}

void emu_rt_reset(void)
{
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_allocs; i++) free(allocs[i].p);
    free(allocs);
    allocs = NULL;
    n_allocs = cap_allocs = 0;
    memset(used, 0, sizeof(used));
    memset(capturing, 0, sizeof(capturing));
    for (int i = 0; i < EMU_MAX_DEVICES; i++) {
        atomic_store(&sticky[i], 0);
        atomic_store(&pending[i], 0);
    }
    pthread_mutex_unlock(&mu);
    cur_dev = 0;
    last_err = cudaSuccess;
}

size_t emu_rt_used(int dev)
{
    pthread_mutex_lock(&mu);
    size_t u = dev >= 0 && dev < EMU_MAX_DEVICES ? used[dev] : 0;
    pthread_mutex_unlock(&mu);
    return u;
}

/* KINFER_EMU_DEVICES (1 to 16), read once before the first count: a
 * process emulating several devices without calling emu_rt_configure
 * (the worker end to end). */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static void env_devices(void)
{
    const char *e = getenv("KINFER_EMU_DEVICES");
    char *end;
    long n = e ? strtol(e, &end, 10) : 0;
    if (e && *e && !*end && n >= 1 && n <= EMU_MAX_DEVICES) emu_rt_configure((int)n, 0);
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return ret(cudaErrorInvalidValue);
    pthread_once(&env_once, env_devices);
    *count = n_dev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= n_dev) return ret(cudaErrorInvalidDevice);
    cur_dev = device;
    return ret(dead(device));
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return ret(cudaErrorInvalidValue);
    *device = cur_dev;
    return cudaSuccess;
}

/* The attributes the backend asks for: the H100 SXM5's memory clock
 * (2619 MHz: with the 5120-bit bus, the 3.35 TB/s NVIDIA states). */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value) return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= n_dev) return ret(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMemoryClockRate: *value = 2619000; return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; return cudaSuccess;
    default: return ret(cudaErrorInvalidValue);
    }
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop) return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= n_dev) return ret(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "emulated NVIDIA H100 80GB HBM3");
    prop->totalGlobalMem = dev_mem;
    prop->sharedMemPerBlock = 48 << 10;
    prop->sharedMemPerBlockOptin = 227 << 10;
    prop->sharedMemPerMultiprocessor = 228 << 10;
    prop->reservedSharedMemPerBlock = 1 << 10;
    prop->regsPerBlock = prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = SIZE_MAX / 2;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 64 << 10;
    prop->major = 9;
    prop->minor = 0;
    prop->memoryBusWidth = 5120; /* H100 SXM5's HBM3 */
    prop->textureAlignment = 512;
    prop->multiProcessorCount = 132;
    prop->concurrentKernels = 1;
    prop->ECCEnabled = 1;
    prop->pciBusID = 0x18 + device;
    prop->asyncEngineCount = 3;
    prop->unifiedAddressing = 1;
    prop->memoryBusWidth = 5120;
    prop->l2CacheSize = 50 << 20;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->managedMemory = 1;
    prop->computePreemptionSupported = 1;
    prop->cooperativeLaunch = 1;
    prop->clusterLaunch = 1;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion) return ret(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion) return ret(cudaErrorInvalidValue);
    *driverVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t s = dead(cur_dev);
    if (s != cudaSuccess) return s;
    cudaError_t e = last_err;
    last_err = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t s = dead(cur_dev);
    return s != cudaSuccess ? s : last_err;
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = surface(cur_dev);
    if (e == cudaSuccess) e = unsafe();
    return ret(e);
}

/* ---- memory ---------------------------------------------------------------------- */

static cudaError_t alloc_add(void **out, size_t size, int host)
{
    if (!out) return cudaErrorInvalidValue;
    *out = NULL;
    cudaError_t e = dead(cur_dev);
    if (e != cudaSuccess) return e;
    pthread_mutex_lock(&mu);
    if ((e = unsafe_locked()) != cudaSuccess) goto done;
    if (!host && size > dev_mem - used[cur_dev]) {
        e = cudaErrorMemoryAllocation;
        goto done;
    }
    if (n_allocs == cap_allocs) {
        size_t cap = cap_allocs ? 2 * cap_allocs : 64;
        struct alloc *a = realloc(allocs, cap * sizeof(*a));
        if (!a) {
            e = cudaErrorMemoryAllocation;
            goto done;
        }
        allocs = a;
        cap_allocs = cap;
    }
    void *p = NULL;
    /* 256-byte aligned as cudaMalloc's, and exactly size bytes long. */
    if (posix_memalign(&p, 256, size ? size : 1) != 0) {
        e = cudaErrorMemoryAllocation;
        goto done;
    }
    allocs[n_allocs++] = (struct alloc){p, size, cur_dev, host};
    if (!host) used[cur_dev] += size;
    *out = p;
done:
    pthread_mutex_unlock(&mu);
    return e;
}

static cudaError_t alloc_free(void *p, int host)
{
    if (!p) return cudaSuccess;
    cudaError_t e = cudaErrorInvalidValue;
    pthread_mutex_lock(&mu);
    cudaError_t u = unsafe_locked();
    if (u != cudaSuccess) {
        pthread_mutex_unlock(&mu);
        return u;
    }
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].p == p && allocs[i].host == host) {
            if (!host) used[allocs[i].dev] -= allocs[i].n;
            free(p);
            allocs[i] = allocs[--n_allocs];
            e = cudaSuccess;
            break;
        }
    pthread_mutex_unlock(&mu);
    return e;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    return ret(alloc_add(devPtr, size, 0));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    return ret(alloc_add(pHost, size, 1));
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return ret(alloc_add(ptr, size, 1));
}

/* cudaFree(NULL) initialises the context: it answers the sticky error. */
cudaError_t cudaFree(void *devPtr)
{
    cudaError_t e = dead(cur_dev);
    if (e != cudaSuccess) return ret(e);
    return ret(alloc_free(devPtr, 0));
}

cudaError_t cudaFreeHost(void *ptr)
{
    return ret(alloc_free(ptr, 1));
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    if (!free_b || !total) return ret(cudaErrorInvalidValue);
    cudaError_t e = dead(cur_dev);
    if (e != cudaSuccess) return ret(e);
    pthread_mutex_lock(&mu);
    *total = dev_mem;
    *free_b = dev_mem - used[cur_dev];
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

/* Whether [p, p + n) lies inside one device allocation. */
static int in_device(const void *p, size_t n)
{
    const char *c = p;
    int ok = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_allocs && !ok; i++)
        ok = !allocs[i].host && c >= allocs[i].p && n <= allocs[i].n &&
             (size_t)(c - allocs[i].p) <= allocs[i].n - n;
    pthread_mutex_unlock(&mu);
    return ok;
}

struct copy_arg {
    void *dst;
    const void *src;
    size_t n;
};

static void copy_run(void *a)
{
    const struct copy_arg *c = a;
    memmove(c->dst, c->src, c->n);
}

struct set_arg {
    void *dst;
    int value;
    size_t n;
};

static void set_run(void *a)
{
    const struct set_arg *c = a;
    memset(c->dst, c->value, c->n);
}

static cudaError_t copy_check(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if (!count) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    switch (kind) {
    case cudaMemcpyHostToHost: return cudaSuccess;
    case cudaMemcpyHostToDevice: return in_device(dst, count) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return in_device(src, count) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
        return in_device(dst, count) && in_device(src, count) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    cudaError_t e = copy_check(dst, src, count, kind);
    if (e != cudaSuccess) return ret(e);
    struct copy_arg a = {dst, src, count};
    return count ? enqueue(stream, copy_run, &a, sizeof(a)) : ret(dead(cur_dev));
}

/* A blocking copy: forbidden while a capture runs. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    cudaError_t e = surface(cur_dev);
    if (e == cudaSuccess) e = unsafe();
    if (e == cudaSuccess) e = copy_check(dst, src, count, kind);
    if (e != cudaSuccess) return ret(e);
    struct copy_arg a = {dst, src, count};
    if (count) run_on(cur_dev, copy_run, &a);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    if (count && (!devPtr || !in_device(devPtr, count))) return ret(cudaErrorInvalidValue);
    struct set_arg a = {devPtr, value, count};
    return count ? enqueue(stream, set_run, &a, sizeof(a)) : ret(dead(cur_dev));
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    cudaError_t e = surface(cur_dev);
    if (e == cudaSuccess) e = unsafe();
    if (e == cudaSuccess && count && (!devPtr || !in_device(devPtr, count)))
        e = cudaErrorInvalidValue;
    if (e != cudaSuccess) return ret(e);
    memset(devPtr, value, count);
    return cudaSuccess;
}

/* ---- streams and capture -------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    if (!pStream) return ret(cudaErrorInvalidValue);
    cudaError_t e = dead(cur_dev);
    if (e != cudaSuccess) return ret(e);
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s) return ret(cudaErrorMemoryAllocation);
    s->dev = cur_dev;
    s->flags = flags;
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, 0);
}

static void capture_forget(struct CUstream_st *s)
{
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < sizeof(capturing) / sizeof(capturing[0]); i++)
        if (capturing[i] == s) capturing[i] = NULL;
    pthread_mutex_unlock(&mu);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream) return ret(cudaErrorInvalidResourceHandle);
    if (stream->capturing) {
        capture_forget(stream);
        graph_clear(stream->graph);
        free(stream->graph);
    }
    free(stream);
    return cudaSuccess;
}

/* Work has run when it was enqueued: synchronising only answers errors,
 * and is forbidden on (or, in global mode, during) a capture. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    int dev = stream ? stream->dev : cur_dev;
    cudaError_t e = surface(dev);
    if (e != cudaSuccess) return ret(e);
    if (stream && stream->capturing) {
        stream->invalidated = 1;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    return ret(unsafe());
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    if (!stream) return ret(cudaErrorStreamCaptureUnsupported); /* the legacy stream */
    cudaError_t e = dead(stream->dev);
    if (e != cudaSuccess) return ret(e);
    if (stream->capturing) return ret(cudaErrorIllegalState);
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return ret(cudaErrorInvalidValue);
    struct CUgraph_st *g = calloc(1, sizeof(*g));
    if (!g) return ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&mu);
    size_t i = 0;
    while (i < sizeof(capturing) / sizeof(capturing[0]) && capturing[i]) i++;
    if (i == sizeof(capturing) / sizeof(capturing[0])) {
        pthread_mutex_unlock(&mu);
        free(g);
        return ret(cudaErrorMemoryAllocation);
    }
    capturing[i] = stream;
    stream->capturing = 1;
    stream->invalidated = 0;
    stream->mode = mode;
    stream->owner = pthread_self();
    stream->graph = g;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    if (!pGraph) return ret(cudaErrorInvalidValue);
    *pGraph = NULL;
    if (!stream || !stream->capturing) return ret(cudaErrorIllegalState);
    if (stream->mode == cudaStreamCaptureModeThreadLocal &&
        !pthread_equal(stream->owner, pthread_self()))
        return ret(cudaErrorStreamCaptureWrongThread);
    capture_forget(stream);
    stream->capturing = 0;
    struct CUgraph_st *g = stream->graph;
    stream->graph = NULL;
    if (stream->invalidated) {
        graph_clear(g);
        free(g);
        return ret(cudaErrorStreamCaptureInvalidated);
    }
    *pGraph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pStatus)
{
    if (!pStatus) return ret(cudaErrorInvalidValue);
    *pStatus = stream && stream->capturing
                   ? (stream->invalidated ? cudaStreamCaptureStatusInvalidated
                                          : cudaStreamCaptureStatusActive)
                   : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

/* ---- graphs ------------------------------------------------------------------------ */

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags)
{
    (void)flags;
    if (!pGraphExec || !graph) return ret(cudaErrorInvalidValue);
    cudaError_t e = dead(cur_dev);
    if (e != cudaSuccess) return ret(e);
    struct CUgraphExec_st *x = calloc(1, sizeof(*x));
    if (!x) return ret(cudaErrorMemoryAllocation);
    x->dev = cur_dev;
    /* The exec has records of its own: the graph may go at once. */
    for (size_t i = 0; i < graph->n; i++)
        if (graph_add(&x->g, graph->w[i].fn, graph->w[i].arg, graph->w[i].size) < 0) {
            graph_clear(&x->g);
            free(x);
            return ret(cudaErrorMemoryAllocation);
        }
    *pGraphExec = x;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    if (!graph) return ret(cudaErrorInvalidValue);
    graph_clear(graph);
    free(graph);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    if (!graphExec) return ret(cudaErrorInvalidValue);
    graph_clear(&graphExec->g);
    free(graphExec);
    return cudaSuccess;
}

/* Replays the records in order (into a capture, they are recorded). */
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    if (!graphExec) return ret(cudaErrorInvalidValue);
    int dev = stream ? stream->dev : cur_dev;
    cudaError_t e = dead(dev);
    if (e != cudaSuccess) return ret(e);
    if (graphExec->dev != dev) return ret(cudaErrorInvalidValue);
    for (size_t i = 0; i < graphExec->g.n; i++) {
        if (stopped(dev)) return cudaSuccess;
        if (stream && stream->capturing) {
            e = enqueue(stream, graphExec->g.w[i].fn, graphExec->g.w[i].arg,
                        graphExec->g.w[i].size);
            if (e != cudaSuccess) return e;
        } else {
            run_on(dev, graphExec->g.w[i].fn, graphExec->g.w[i].arg);
        }
    }
    return cudaSuccess;
}

/* ---- events ------------------------------------------------------------------------ */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event) return ret(cudaErrorInvalidValue);
    cudaError_t e = dead(cur_dev);
    if (e != cudaSuccess) return ret(e);
    struct CUevent_st *ev = calloc(1, sizeof(*ev));
    if (!ev) return ret(cudaErrorMemoryAllocation);
    ev->dev = cur_dev;
    ev->flags = flags;
    *event = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!event) return ret(cudaErrorInvalidResourceHandle);
    free(event);
    return cudaSuccess;
}

static void event_run(void *a)
{
    struct CUevent_st *ev = *(struct CUevent_st **)a;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ev->ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    ev->recorded = 1;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!event) return ret(cudaErrorInvalidResourceHandle);
    return enqueue(stream, event_run, &event, sizeof(event));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (!event) return ret(cudaErrorInvalidResourceHandle);
    cudaError_t e = surface(event->dev);
    if (e == cudaSuccess) e = unsafe();
    return ret(e);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms) return ret(cudaErrorInvalidValue);
    if (!start || !end) return ret(cudaErrorInvalidResourceHandle);
    cudaError_t e = dead(start->dev);
    if (e != cudaSuccess) return ret(e);
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return ret(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return ret(cudaErrorInvalidResourceHandle);
    *ms = (float)((double)((int64_t)(end->ns - start->ns)) / 1e6);
    return cudaSuccess;
}

/* ---- error names --------------------------------------------------------------------- */

static const struct {
    cudaError_t e;
    const char *name, *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation is not permitted in the current state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "an illegal instruction was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace", "operation not supported on global/shared address space"},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid program counter"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
};

const char *cudaGetErrorName(cudaError_t error)
{
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].e == error) return errors[i].name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
        if (errors[i].e == error) return errors[i].text;
    return "unknown error";
}

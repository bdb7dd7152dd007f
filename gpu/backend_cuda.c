/* backend_cuda.c - the CUDA backend of backend.h: devices, weights,
 * executor contexts, copies, passes and graphs, and the ops table. The
 * GEMM is gpu/cuda_lt.c's (cuBLASLt), the other primitives
 * gpu/cuda_prims.c's (over gpu/cuda_kernels.cu). Knows no model: the
 * architectures call the primitives. Compiled, with the CUDA headers,
 * only when the build has CUDA; gpu/cuda_stub.c stands in otherwise.
 *
 * Weights go to a device once, converted on the host to the activation
 * type (F16/BF16 tensors copied as they are when the precision matches)
 * or float32. A context lives on one device (executor slots round robin)
 * with its own non-blocking stream, cuBLASLt handle and workspace, the
 * events that time its passes, and the memory ctx_alloc gives it; nothing
 * is allocated during a pass.
 *
 * Graphs (gpu.graphs): graph_begin looks the pass's key up in the
 * context's last PLAN_SHAPE_SLOTS keys (gpu/plan.c): a key seen once runs
 * eagerly, the second time its calls are captured (stream capture,
 * thread-local mode) up to graph_end, which instantiates and launches
 * the graph; later passes of the key replay it. A capture that fails
 * fails its pass with MODEL_EINVAL and the key runs eagerly from then on.
 *
 * Errors: every CUDA and cuBLASLt call is checked with its file and line
 * (CU/LT at set-up, CX/CXLT in a context). A sticky error (illegal
 * address, launch failure, ECC...) or any error not known to be harmless
 * is MODEL_EFATAL and marks the context dead: every later call answers
 * MODEL_EFATAL and the worker must stop. A refused call (bad sizes, no
 * cuBLASLt algorithm, a failed capture) is MODEL_EINVAL: its pass fails,
 * the process goes on. pass_end waits for the stream and reports the
 * pass's first failure; pass_submit leaves a pass in flight (its events
 * in one of two slots) for pass_wait, so the host may prepare and submit
 * the next while the device runs it.
 *
 * Threads: probe, device_stats on any thread (the counters are atomics);
 * open, close, weight_new and weight_free on the main thread; a context
 * and its calls on the executor thread that made it (ctx_new and
 * pass_begin make its device current on that thread). */
#include "cuda_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks ------------------------------------------------------------ */

int cuda_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
        return 1;
    default:
        return 0;
    }
}

/* Formats a failed CUDA call as "FILE:LINE: CALL: NAME: MESSAGE". */
static void cuda_format(cudaError_t e, const char *call, const char *file, int line, char *buf,
                        size_t n)
{
    if (buf && n)
        snprintf(buf, n, "%s:%d: %s: %s: %s%s", file, line, call, cudaGetErrorName(e),
                 cudaGetErrorString(e),
                 cuda_sticky(e) ? " (sticky: the device context is lost)" : "");
}

int cuda_check(cudaError_t e, const char *call, const char *file, int line, char *errstr,
               size_t errstr_size)
{
    if (e == cudaSuccess) return 0;
    cuda_format(e, call, file, line, errstr, errstr_size);
    return -1;
}

/* What a failed call means for the pass: the launchers' own refusals and
 * a broken capture are the pass's; anything else is the device's. */
static int cuda_rc_of(const struct cuda_ctx *c, cudaError_t e)
{
    if (cuda_sticky(e)) return MODEL_EFATAL;
    switch (e) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
        return MODEL_EINVAL;
    default:
        return c->capturing ? MODEL_EINVAL : MODEL_EFATAL;
    }
}

/* Keeps the pass's first failure (a fatal one overrides a refusal). */
int cx_record(struct cuda_ctx *c, int rc, const char *msg)
{
    if (c->pass_rc == 0 || (rc == MODEL_EFATAL && c->pass_rc != MODEL_EFATAL)) {
        snprintf(c->err, sizeof(c->err), "%s", msg);
        c->pass_rc = rc;
    }
    if (rc == MODEL_EFATAL) c->fatal = 1;
    return rc;
}

int cx_cuda(struct cuda_ctx *c, cudaError_t e, const char *call, const char *file, int line)
{
    if (e == cudaSuccess) return 0;
    char msg[512];
    cuda_format(e, call, file, line, msg, sizeof(msg));
    return cx_record(c, cuda_rc_of(c, e), msg);
}

int cx_refuse(struct cuda_ctx *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return cx_record(c, MODEL_EINVAL, msg);
}

int cx_live(const struct cuda_ctx *c)
{
    return c->fatal ? MODEL_EFATAL : 0;
}

/* ---- probe, open, close --------------------------------------------------- */

/* "No device" and "no (or too old a) driver" mean a machine without a
 * GPU, not a broken one: 0 devices, with the reason. The failure is
 * cleared lest a later check trip on it. */
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
            snprintf(what, what_size, "no CUDA device");
    }
    return count;
}

static void cuda_close(void *bep)
{
    struct cuda_be *be = bep;
    if (!be) return;
    lt_unload(&be->cl);
    free(be);
}

/* Checks the devices gpu.devices names, makes a context on each (so a
 * broken one fails here, not at the first pass), and describes them. */
static void *cuda_open(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                       char *errstr, size_t errstr_size)
{
    struct cuda_be *be = calloc(1, sizeof(*be));
    if (!be) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    be->prec = c->precision;
    char fallback[200] = ""; /* gpu.precision "auto" on a device without bf16 */
    be->graphs = c->graphs;
    be->per_device = c->executors_per_device > 0 ? c->executors_per_device : 1;
    be->lt_ws_bytes = (size_t)(c->workspace_mb > 0 ? c->workspace_mb : 32) << 20;
    int count = 0, ids[MODEL_MAX_DEVICES];
    if (CU(cudaGetDeviceCount(&count)) < 0 || lt_load(&be->cl, errstr, errstr_size) < 0)
        goto fail;
    int n = plan_devices(c->devices, c->n_devices, count, ids, errstr, errstr_size);
    if (n < 0) goto fail;
    int k0 = snprintf(desc, desc_size, "cuda: ");
    size_t used = k0 > 0 && (size_t)k0 < desc_size ? (size_t)k0 : 0;
    for (int i = 0; i < n; i++) {
        struct cuda_dev *d = &be->dev[be->n_dev];
        struct cudaDeviceProp prop;
        if (CU(cudaGetDeviceProperties(&prop, ids[i])) < 0) goto fail;
        d->index = ids[i];
        snprintf(d->name, sizeof(d->name), "%.95s", prop.name);
        d->major = prop.major;
        d->minor = prop.minor;
        d->total_mem = prop.totalGlobalMem;
        int khz = 0; /* the peak memory clock; CUDA 13's properties no longer carry it */
        if (CU(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, ids[i])) < 0) goto fail;
        d->mem_gbs = 2.0 * (double)khz * 1e3 * (double)prop.memoryBusWidth / 8.0 / 1e9;
        atomic_init(&d->busy_ns, 0);
        atomic_init(&d->batches, 0);
        if (d->major * 10 + d->minor < 75) {
            /* CUDA 13 builds nothing older than Turing: its kernels would
             * not load, so say why here rather than at the first batch. */
            snprintf(errstr, errstr_size, "device %d (%s) is compute capability %d.%d; kinfer "
                     "needs 7.5 or newer", d->index, d->name, d->major, d->minor);
            goto fail;
        }
        int runs = model_precision_on_device(be->prec, c->precision_auto, d->major);
        if (runs < 0) {
            snprintf(errstr, errstr_size, "gpu.precision %s needs compute capability 8.0 or "
                     "newer; device %d (%s) is %d.%d", model_precision_name(be->prec),
                     d->index, d->name, d->major, d->minor);
            goto fail;
        }
        if (runs != (int)be->prec) { /* "auto"'s bf16: fp32 on this device and all */
            snprintf(fallback, sizeof(fallback), "; device %d is compute capability %d.%d, "
                     "without bf16: fp32", d->index, d->major, d->minor);
            be->prec = (enum model_precision)runs;
        }
        if (CU(cudaSetDevice(d->index)) < 0 || CU(cudaFree(NULL)) < 0) goto fail;
        be->n_dev++;
        int k = snprintf(desc + used, desc_size - used, "%s%d: %s (sm_%d%d, %.1f GiB)",
                         i ? "; " : "", d->index, d->name, d->major, d->minor,
                         (double)d->total_mem / (1 << 30));
        if (k > 0 && (size_t)k < desc_size - used) used += (size_t)k;
    }
    be->kt = be->prec == MODEL_FP16 ? KC_F16 : be->prec == MODEL_BF16 ? KC_BF16 : KC_F32;
    be->dt = be->prec == MODEL_FP16   ? CUDA_R_16F
             : be->prec == MODEL_BF16 ? CUDA_R_16BF
                                      : CUDA_R_32F;
    be->es = plan_elem_size(be->prec);
    int rt = 0, drv = 0;
    if (CU(cudaRuntimeGetVersion(&rt)) < 0 || CU(cudaDriverGetVersion(&drv)) < 0) goto fail;
    snprintf(desc + used, desc_size - used,
             "; precision %s%s%s%s%s, graphs %s, %d executor%s per device, CUDA %d.%d, "
             "driver %d.%d",
             model_precision_name(be->prec), c->precision_auto ? " (auto: " : "",
             c->precision_auto && c->precision_why ? c->precision_why : "", fallback,
             c->precision_auto ? ")" : "", be->graphs ? "on" : "off", be->per_device,
             be->per_device == 1 ? "" : "s", rt / 1000, rt % 1000 / 10, drv / 1000,
             drv % 1000 / 10);
    return be;
fail:
    cuda_close(be);
    return NULL;
}

/* ---- what the runtime reports ---------------------------------------------- */

static size_t cuda_executors(void *bep)
{
    struct cuda_be *be = bep;
    return be->n_dev * (size_t)be->per_device;
}

static const char *cuda_precision(void *bep)
{
    return model_precision_name(((struct cuda_be *)bep)->prec);
}

static size_t cuda_devices(void *bep)
{
    return ((struct cuda_be *)bep)->n_dev;
}

/* Memory in use is the device's (every process's), from the driver. The
 * calling thread's current device is put back (it may be an executor's). */
static int cuda_device_stats(void *bep, size_t dev, struct model_device_stats *out)
{
    struct cuda_be *be = bep;
    if (dev >= be->n_dev) return -1;
    const struct cuda_dev *d = &be->dev[dev];
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", d->name);
    out->index = d->index;
    out->busy_s = (double)atomic_load(&d->busy_ns) / 1e9;
    out->batches = atomic_load(&d->batches);
    out->mem_gbs = d->mem_gbs;
    size_t free_b = 0, total_b = 0;
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(d->index) == cudaSuccess &&
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        out->mem_total = total_b;
        out->mem_used = total_b - free_b;
    } else {
        (void)cudaGetLastError();
    }
    if (prev >= 0 && prev != d->index) cudaSetDevice(prev);
    return 0;
}

/* One copy of the weights per device. */
static size_t cuda_weight_copies(void *bep)
{
    return ((struct cuda_be *)bep)->n_dev;
}

static size_t cuda_act_size(void *bep)
{
    return ((struct cuda_be *)bep)->es;
}

/* ---- weights ----------------------------------------------------------------- */

/* Converts piece s into dst (its elements in type's format). Returns 0,
 * or -1 with errstr filled. */
static int piece_convert(const struct cuda_be *be, enum bk_wtype type, const struct bk_wsrc *s,
                         unsigned char *dst, char *errstr, size_t errstr_size)
{
    if (s->t) {
        int rc = type == BK_W_F32 ? plan_convert_f32(s->t, (float *)dst)
                                  : plan_convert(s->t, be->prec, dst);
        if (rc < 0) snprintf(errstr, errstr_size, "tensor %s: dtype not loadable", s->t->name);
        return rc;
    }
    if (!s->f) {
        snprintf(errstr, errstr_size, "a weight piece with neither tensor nor floats");
        return -1;
    }
    if (type == BK_W_F32 || be->es == sizeof(float)) {
        memcpy(dst, s->f, s->n * sizeof(float));
        return 0;
    }
    uint16_t *h = (uint16_t *)dst;
    for (size_t i = 0; i < s->n; i++)
        h[i] = be->prec == MODEL_FP16 ? st_f32_to_f16(s->f[i]) : st_f32_to_bf16(s->f[i]);
    return 0;
}

/* Converts the pieces on the host and uploads them in one allocation,
 * after checking the device has the memory (a clear message naming the
 * sizes otherwise). */
static struct bk_weight *cuda_weight_new(void *bep, size_t dev, enum bk_wtype type,
                                         const struct bk_wsrc *src, size_t n, char *errstr,
                                         size_t errstr_size)
{
    struct cuda_be *be = bep;
    if (dev >= be->n_dev) {
        snprintf(errstr, errstr_size, "weight copy %zu: the backend has %zu devices", dev,
                 be->n_dev);
        return NULL;
    }
    const struct cuda_dev *d = &be->dev[dev];
    size_t es = type == BK_W_F32 ? sizeof(float) : be->es, count = 0;
    for (size_t i = 0; i < n; i++) count += src[i].t ? (size_t)src[i].t->numel : src[i].n;
    if (count == 0) {
        snprintf(errstr, errstr_size, "an empty weight");
        return NULL;
    }
    struct bk_weight *w = calloc(1, sizeof(*w));
    unsigned char *host = malloc(count * es);
    if (!w || !host) {
        snprintf(errstr, errstr_size, "out of host memory converting a weight of %zu values",
                 count);
        goto fail;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (piece_convert(be, type, &src[i], host + off * es, errstr, errstr_size) < 0) goto fail;
        off += src[i].t ? (size_t)src[i].t->numel : src[i].n;
    }
    size_t bytes = count * es, free_b = 0, total_b = 0;
    if (CU(cudaSetDevice(d->index)) < 0 || CU(cudaMemGetInfo(&free_b, &total_b)) < 0) goto fail;
    if (bytes > free_b) {
        snprintf(errstr, errstr_size, "a weight of %.1f MiB in %s does not fit device %d (%s), "
                 "which has %.1f MiB free of %.1f MiB", (double)bytes / (1 << 20),
                 type == BK_W_F32 ? "fp32" : model_precision_name(be->prec), d->index, d->name,
                 (double)free_b / (1 << 20), (double)total_b / (1 << 20));
        goto fail;
    }
    if (CU(cudaMalloc(&w->p, bytes)) < 0 ||
        CU(cudaMemcpy(w->p, host, bytes, cudaMemcpyHostToDevice)) < 0)
        goto fail;
    free(host);
    w->n = count;
    w->copy = dev;
    w->type = type;
    return w;
fail:
    (void)cudaGetLastError();
    if (w && w->p) cudaFree(w->p);
    free(w);
    free(host);
    return NULL;
}

static void cuda_weight_free(void *bep, struct bk_weight *w)
{
    struct cuda_be *be = bep;
    if (!w) return;
    if (w->copy < be->n_dev) cudaSetDevice(be->dev[w->copy].index);
    cudaFree(w->p);
    free(w);
}

/* ---- contexts ------------------------------------------------------------------ */

static void cuda_ctx_free(void *cp)
{
    struct cuda_ctx *c = cp;
    if (!c) return;
    const struct lt_api *cl = &c->be->cl;
    cudaSetDevice(c->dev->index);
    if (c->capturing) {
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    }
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < PLAN_SHAPE_SLOTS; i++)
        if (c->graph[i]) cudaGraphExecDestroy(c->graph[i]);
    lt_plans_free(c);
    for (size_t i = 0; i < c->n_mem; i++) {
        if (c->mem[i].host) cudaFreeHost(c->mem[i].p);
        else cudaFree(c->mem[i].p);
    }
    free(c->mem);
    cudaFree(c->stage);
    cudaFree(c->lt_ws);
    for (int i = 0; i < 2; i++) {
        if (c->ev_start[i]) cudaEventDestroy(c->ev_start[i]);
        if (c->ev_stop[i]) cudaEventDestroy(c->ev_stop[i]);
    }
    if (c->pref) cl->MatmulPreferenceDestroy(c->pref);
    if (c->lt) cl->Destroy(c->lt);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
}

/* An executor's context on the device its slot maps to: a non-blocking
 * stream, a cuBLASLt handle, workspace and heuristic preference, and the
 * events that time its passes. */
static void *cuda_ctx_new(void *bep, unsigned slot, char *errstr, size_t errstr_size)
{
    struct cuda_be *be = bep;
    const struct lt_api *cl = &be->cl;
    struct cuda_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    c->be = be;
    c->copy = plan_slot_device(slot, be->n_dev);
    c->dev = &be->dev[c->copy];
    if (CU(cudaSetDevice(c->dev->index)) < 0 ||
        CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) < 0 ||
        LT(cl->Create(&c->lt)) < 0 || CU(cudaMalloc(&c->lt_ws, be->lt_ws_bytes)) < 0 ||
        LT(cl->MatmulPreferenceCreate(&c->pref)) < 0 ||
        LT(cl->MatmulPreferenceSetAttribute(c->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &be->lt_ws_bytes, sizeof(be->lt_ws_bytes))) < 0 ||
        CU(cudaEventCreate(&c->ev_start[0])) < 0 || CU(cudaEventCreate(&c->ev_stop[0])) < 0 ||
        CU(cudaEventCreate(&c->ev_start[1])) < 0 || CU(cudaEventCreate(&c->ev_stop[1])) < 0) {
        size_t k = strlen(errstr);
        snprintf(errstr + k, errstr_size - k, " (executor %u on device %d, %s)", slot,
                 c->dev->index, c->dev->name);
        cuda_ctx_free(c);
        return NULL;
    }
    return c;
}

static size_t cuda_ctx_copy(void *cp)
{
    return ((struct cuda_ctx *)cp)->copy;
}

/* Device or pinned host memory, owned by the context. A host buffer may
 * receive store_f32's results, or hold load_f32's input, so in 16-bit
 * precisions the float32 staging those convert through grows to the
 * largest host buffer. Never during a pass (nor, so, a capture). */
static void *cuda_ctx_alloc(void *cp, size_t bytes, int host)
{
    struct cuda_ctx *c = cp;
    char *errstr = c->err;
    size_t errstr_size = sizeof(c->err);
    if (c->fatal) return NULL;
    if (c->in_pass) {
        snprintf(c->err, sizeof(c->err), "ctx_alloc of %zu bytes during a pass", bytes);
        return NULL;
    }
    if (c->n_mem == c->cap_mem) {
        size_t cap = c->cap_mem ? 2 * c->cap_mem : 16;
        struct cuda_mem *m = realloc(c->mem, cap * sizeof(*m));
        if (!m) {
            snprintf(c->err, sizeof(c->err), "out of host memory");
            return NULL;
        }
        c->mem = m;
        c->cap_mem = cap;
    }
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    if (CU(cudaSetDevice(c->dev->index)) < 0 ||
        (host ? CU(cudaHostAlloc(&p, n, cudaHostAllocPortable))
              : CU(cudaMalloc(&p, n))) < 0)
        goto fail;
    if (host && c->be->kt != KC_F32 && n > c->stage_bytes) {
        cudaFree(c->stage);
        c->stage = NULL;
        c->stage_bytes = 0;
        if (CU(cudaMalloc((void **)&c->stage, n)) < 0) goto fail;
        c->stage_bytes = n;
    }
    c->mem[c->n_mem++] = (struct cuda_mem){p, host};
    return p;
fail:
    (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
    if (p) {
        if (host) cudaFreeHost(p);
        else cudaFree(p);
    }
    return NULL;
}

static const char *cuda_ctx_error(void *cp)
{
    return ((struct cuda_ctx *)cp)->err;
}

static void cuda_inject_fault(void *cp)
{
    ((struct cuda_ctx *)cp)->fault = 1;
}

/* ---- a pass ------------------------------------------------------------------------ */

/* The device made current, the injected fault when armed (a kernel
 * writing to an illegal address, so the pass fails as on a dead device),
 * the start event. */
static int cuda_pass_begin(void *cp)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (c->in_pass) return cx_refuse(c, "pass_begin inside a pass");
    if (c->q_len == 2) return cx_refuse(c, "pass_begin with two passes in flight");
    c->pass_rc = 0;
    c->err[0] = '\0';
    if ((rc = CX(c, cudaSetDevice(c->dev->index))) < 0) return rc;
    c->in_pass = 1;
    if (c->fault) {
        c->fault = 0;
        if ((rc = CX(c, kc_fault(c->stream))) < 0) return rc;
    }
    return CX(c, cudaEventRecord(c->ev_start[(c->q_first + c->q_len) % 2], c->stream));
}

/* Ends a capture the caller left open (it failed half way): the graph is
 * dropped and its key runs eagerly from then on. */
static void capture_abandon(struct cuda_ctx *c)
{
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) (void)cudaGetLastError();
    c->capturing = 0;
    plan_shape_refuse(&c->shapes, c->cap_slot);
}

/* Waits for the oldest pass in flight: the device's busy time (its
 * events' interval) and pass count. 0, or MODEL_EFATAL when the device
 * failed meanwhile. */
static int pass_wait_oldest(struct cuda_ctx *c)
{
    unsigned slot = c->q_first;
    c->q_first = (c->q_first + 1) % 2;
    c->q_len--;
    float ms = 0;
    int rc = CX(c, cudaEventSynchronize(c->ev_stop[slot]));
    if (rc == 0) rc = CX(c, cudaEventElapsedTime(&ms, c->ev_start[slot], c->ev_stop[slot]));
    if (rc < 0) return c->fatal ? MODEL_EFATAL : rc;
    atomic_fetch_add(&c->dev->busy_ns, (uint_fast64_t)((double)ms * 1e6));
    if (c->q_ok[slot]) atomic_fetch_add(&c->dev->batches, 1);
    return 0;
}

/* The stop event; the pass stays in flight (pass_wait) unless it failed
 * already: then it is waited for (and with it whatever ran before it on
 * the stream) and its first failure returned, the passes submitted
 * before it staying in flight for their own pass_wait. */
static int cuda_pass_submit(void *cp)
{
    struct cuda_ctx *c = cp;
    if (!c->in_pass) return c->fatal ? MODEL_EFATAL : cx_refuse(c, "pass end outside a pass");
    if (c->capturing) {
        capture_abandon(c);
        cx_refuse(c, "the pass ended inside graph_begin .. graph_end");
    }
    c->in_pass = 0;
    if (c->fatal) return MODEL_EFATAL;
    unsigned slot = (c->q_first + c->q_len) % 2;
    int rc = CX(c, cudaEventRecord(c->ev_stop[slot], c->stream));
    if (rc < 0) return rc; /* not in flight: its stop was never recorded */
    if (c->pass_rc == 0) {
        c->q_ok[slot] = 1;
        c->q_len++;
        return 0;
    }
    rc = c->pass_rc;
    float ms = 0;
    if (CX(c, cudaEventSynchronize(c->ev_stop[slot])) == 0 &&
        CX(c, cudaEventElapsedTime(&ms, c->ev_start[slot], c->ev_stop[slot])) == 0)
        atomic_fetch_add(&c->dev->busy_ns, (uint_fast64_t)((double)ms * 1e6));
    return c->fatal ? MODEL_EFATAL : rc;
}

static int cuda_pass_wait(void *cp)
{
    struct cuda_ctx *c = cp;
    if (c->fatal) return MODEL_EFATAL;
    if (c->in_pass || c->q_len == 0)
        return cx_refuse(c, "pass_wait %s",
                         c->in_pass ? "inside a pass" : "with no pass in flight");
    return pass_wait_oldest(c);
}

/* pass_submit, then the wait for everything in flight. */
static int cuda_pass_end(void *cp)
{
    struct cuda_ctx *c = cp;
    int rc = cuda_pass_submit(c);
    while (rc == 0 && c->q_len) rc = pass_wait_oldest(c);
    return rc;
}

/* See the top of the file. A key must be 1..PLAN_KEY_MAX bytes. */
static int cuda_graph_begin(void *cp, const void *key, size_t key_len)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!c->in_pass || c->capturing)
        return cx_refuse(c, "graph_begin %s", c->capturing ? "inside graph_begin .. graph_end"
                                                           : "outside a pass");
    if (!c->be->graphs) return BK_GRAPH_RUN;
    if (!key || key_len == 0 || key_len > PLAN_KEY_MAX)
        return cx_refuse(c, "graph_begin: a key of %zu bytes (1 to %d)", key_len, PLAN_KEY_MAX);
    size_t slot;
    int evict;
    enum plan_shape_action act = plan_shape_use(&c->shapes, key, key_len, &slot, &evict);
    if (evict && c->graph[slot]) {
        rc = CX(c, cudaGraphExecDestroy(c->graph[slot]));
        c->graph[slot] = NULL;
        if (rc < 0) return rc;
    }
    switch (act) {
    case PLAN_SHAPE_GRAPH:
        rc = CX(c, cudaGraphLaunch(c->graph[slot], c->stream));
        return rc < 0 ? rc : BK_GRAPH_REPLAYED;
    case PLAN_SHAPE_CAPTURE:
        c->capturing = 1; /* so a failure to begin is the pass's, not the device's */
        rc = CX(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
        c->capturing = rc == 0;
        if (rc < 0) {
            plan_shape_refuse(&c->shapes, slot);
            return rc;
        }
        c->cap_slot = slot;
        return BK_GRAPH_RUN;
    default:
        return BK_GRAPH_RUN;
    }
}

/* After a capture: the graph instantiated, kept for its key and launched.
 * Nothing to do after an eager run or a replay. */
static int cuda_graph_end(void *cp)
{
    struct cuda_ctx *c = cp;
    if (!c->capturing) return cx_live(c);
    cudaGraph_t g = NULL;
    size_t slot = c->cap_slot;
    int rc = CX(c, cudaStreamEndCapture(c->stream, &g));
    if (rc == 0 && c->pass_rc < 0) rc = c->pass_rc; /* a call failed during the capture */
    if (rc == 0) rc = CX(c, cudaGraphInstantiate(&c->graph[slot], g, 0));
    c->capturing = 0;
    if (g) cudaGraphDestroy(g);
    if (rc < 0) {
        if (c->graph[slot]) cudaGraphExecDestroy(c->graph[slot]);
        c->graph[slot] = NULL;
        plan_shape_refuse(&c->shapes, slot);
        if (rc != MODEL_EFATAL) {
            char msg[sizeof(c->err)];
            snprintf(msg, sizeof(msg), "%s", c->err);
            snprintf(c->err, sizeof(c->err), "graph capture failed (the key runs eagerly from "
                     "now on): %.400s", msg);
        }
        return rc;
    }
    c->shapes.slot[slot].graph = 1;
    return CX(c, cudaGraphLaunch(c->graph[slot], c->stream));
}

/* ---- copies ---------------------------------------------------------------------- */

static int cuda_upload(void *cp, void *dst, const void *src, size_t bytes)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0 || bytes == 0) return rc;
    return CX(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}

/* float32 activations are copied as they are; 16-bit ones go through the
 * context's float32 staging (sized by its largest host buffer). */
static int cuda_load_f32(void *cp, void *dst, const float *src, size_t n)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0 || n == 0) return rc;
    if (c->be->kt == KC_F32)
        return CX(c, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice,
                                     c->stream));
    if (n * sizeof(float) > c->stage_bytes)
        return cx_refuse(c, "load_f32 of %zu floats: more than the context's largest host "
                         "buffer (%zu bytes)", n, c->stage_bytes);
    if ((rc = CX(c, cudaMemcpyAsync(c->stage, src, n * sizeof(float), cudaMemcpyHostToDevice,
                                    c->stream))) < 0)
        return rc;
    return CX(c, kc_from_f32(c->stream, c->be->kt, c->stage, dst, n));
}

static int cuda_store_f32(void *cp, float *dst, const void *src, size_t n)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0 || n == 0) return rc;
    if (c->be->kt == KC_F32)
        return CX(c, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost,
                                     c->stream));
    if (n * sizeof(float) > c->stage_bytes)
        return cx_refuse(c, "store_f32 of %zu floats: more than the context's largest host "
                         "buffer (%zu bytes)", n, c->stage_bytes);
    if ((rc = CX(c, kc_to_f32(c->stream, c->be->kt, src, c->stage, n))) < 0) return rc;
    return CX(c, cudaMemcpyAsync(dst, c->stage, n * sizeof(float), cudaMemcpyDeviceToHost,
                                 c->stream));
}

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .compiled_in = 1,
    .attention_pads = 1, /* attention runs padded to the batch's longest sequence */
    .probe = cuda_probe,
    .open = cuda_open,
    .close = cuda_close,
    .executors = cuda_executors,
    .precision = cuda_precision,
    .devices = cuda_devices,
    .device_stats = cuda_device_stats,
    .weight_copies = cuda_weight_copies,
    .act_size = cuda_act_size,
    .kv_size = cuda_act_size,  /* the cache is in the activation type */
    .weight_new = cuda_weight_new,
    .weight_free = cuda_weight_free,
    .ctx_new = cuda_ctx_new,
    .ctx_free = cuda_ctx_free,
    .ctx_copy = cuda_ctx_copy,
    .ctx_alloc = cuda_ctx_alloc,
    .ctx_error = cuda_ctx_error,
    .inject_fault = cuda_inject_fault,
    .pass_begin = cuda_pass_begin,
    .pass_end = cuda_pass_end,
    .pass_submit = cuda_pass_submit,
    .pass_wait = cuda_pass_wait,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .upload = cuda_upload,
    .load_f32 = cuda_load_f32,
    .store_f32 = cuda_store_f32,
    .gemm = cuda_gemm,
    .layernorm = cuda_layernorm,
    .rmsnorm = cuda_rmsnorm,
    .embed = cuda_embed,
    .attention_scratch = cuda_attention_scratch,
    .attention = cuda_attention,
    .rope = cuda_rope,
    .act = cuda_act,
    .softmax = cuda_softmax,
    .l2norm = cuda_l2norm,
    .pool = cuda_pool,
    .swiglu = cuda_swiglu,
    .kv_store = cuda_kv_store,
    .paged_attention_scratch = cuda_paged_attention_scratch,
    .paged_attention = cuda_paged_attention,
    .sample_scratch = cuda_sample_scratch,
    .sample = cuda_sample,
};

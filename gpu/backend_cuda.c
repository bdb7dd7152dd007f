/* backend_cuda.c - the CUDA backend of backend.h: cuBLASLt for the dense
 * layers (the bias, and a ReLU that follows, fused in the GEMM's
 * epilogue), gpu/cuda_kernels.cu for the other ops. Compiled, with the
 * CUDA headers, only when the build has CUDA; gpu/cuda_stub.c stands in
 * otherwise. Only files in gpu/ include CUDA headers.
 *
 * Weights go to every device once, at load, in the chosen precision
 * (gpu/plan.c converts them on the host; F16/BF16 weights are copied as
 * they are when the precision matches). Each executor's workspace lives on
 * one device (slot round robin) with its own stream, cuBLASLt handle and
 * workspace, device activation buffers for its rows, and pinned host
 * buffers for input and output, so a batch is one host-to-device copy,
 * the layers, and one copy back. A batch is padded up to its bucket (the
 * preferred sizes, or powers of two) and runs as that bucket's CUDA graph,
 * captured at start-up, or, with gpu.graphs off, as the same calls issued
 * one by one; the padding rows' results are dropped.
 *
 * Row-major PyTorch weights W [out,in] and activations X [rows,in] map to
 * cuBLAS's column-major view as Y^T [out,rows] = op_T(W^T [in,out]) *
 * X^T [in,rows]: A is W with TRANSA = T, B is X, lda = ldb = in, ldc = out.
 *
 * Errors: every CUDA and cuBLASLt call is checked and reported with its
 * file and line. Any failure in a forward pass is fatal (MODEL_EFATAL):
 * all memory is allocated at start-up, so a failure there means the device
 * or its context is broken (an illegal address, a launch failure, an ECC
 * error are sticky and poison the context); the worker stops and its
 * supervisor restarts it. Nothing keeps serving on a dead context.
 *
 * Threads: open/close/model_new/model_free on the main thread; each
 * workspace on the executor thread that made it (which sets its device
 * before every call, the current device being per thread); probe and
 * device_stats on any thread. The per-device counters are atomics. */
#include "backend.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "plan.h"

/* ---- error checks ------------------------------------------------------ */

/* The errors after which the context is unusable for good. */
static int cuda_sticky(cudaError_t e)
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

/* Formats a failed CUDA call as "FILE:LINE: CALL: NAME: MESSAGE" into
 * errstr and returns -1, so call sites stay one line. */
static int cuda_fail(cudaError_t e, const char *call, const char *file, int line, char *errstr,
                     size_t errstr_size)
{
    if (errstr && errstr_size)
        snprintf(errstr, errstr_size, "%s:%d: %s: %s: %s%s", file, line, call,
                 cudaGetErrorName(e), cudaGetErrorString(e),
                 cuda_sticky(e) ? " (sticky: the device context is lost)" : "");
    return -1;
}

/* cuBLASLt, loaded when the backend opens (lt_load): a machine that runs
 * the CPU backend never needs the library, nor pays for loading it. The
 * pointers have the headers' own types. */
struct lt_api {
    void *so;
#define LT_FN(name) __typeof__(cublasLt##name) *name;
    LT_FN(Create) LT_FN(Destroy) LT_FN(MatmulDescCreate) LT_FN(MatmulDescDestroy)
    LT_FN(MatmulDescSetAttribute) LT_FN(MatrixLayoutCreate) LT_FN(MatrixLayoutDestroy)
    LT_FN(MatmulPreferenceCreate) LT_FN(MatmulPreferenceDestroy)
    LT_FN(MatmulPreferenceSetAttribute) LT_FN(MatmulAlgoGetHeuristic) LT_FN(Matmul)
    LT_FN(GetStatusName) LT_FN(GetStatusString) LT_FN(GetVersion)
#undef LT_FN
};

static int lt_fail(const struct lt_api *cl, cublasStatus_t st, const char *call,
                   const char *file, int line, char *errstr, size_t errstr_size)
{
    if (errstr && errstr_size)
        snprintf(errstr, errstr_size, "%s:%d: %s: %s: %s", file, line, call,
                 cl->GetStatusName(st), cl->GetStatusString(st));
    return -1;
}

/* CU(call) and LT(call) evaluate to 0, or to -1 with errstr (which must be
 * in scope, with errstr_size) naming the call, the file and the line. */
static int cuda_check(cudaError_t e, const char *call, const char *file, int line,
                      char *errstr, size_t errstr_size)
{
    return e == cudaSuccess ? 0 : cuda_fail(e, call, file, line, errstr, errstr_size);
}

static int lt_check(const struct lt_api *cl, cublasStatus_t st, const char *call,
                    const char *file, int line, char *errstr, size_t errstr_size)
{
    return st == CUBLAS_STATUS_SUCCESS ? 0
                                       : lt_fail(cl, st, call, file, line, errstr, errstr_size);
}

#define CU(call) cuda_check((call), #call, __FILE__, __LINE__, errstr, errstr_size)
#define LT(call) lt_check(cl, (call), #call, __FILE__, __LINE__, errstr, errstr_size)

/* Loads cuBLASLt of the major version the backend was built against, by
 * name (the loader's search path, then the binary's run path: the CUDA
 * library directory it was linked with). Returns 0, or -1 with why. */
static int lt_load(struct lt_api *cl, char *errstr, size_t errstr_size)
{
    char name[64];
    snprintf(name, sizeof(name), "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    if (!(cl->so = dlopen(name, RTLD_NOW | RTLD_LOCAL))) {
        snprintf(errstr, errstr_size, "cannot load %s: %s", name, dlerror());
        return -1;
    }
#define LT_SYM(fn)                                                                       \
    if (!(*(void **)&cl->fn = dlsym(cl->so, "cublasLt" #fn))) {                           \
        snprintf(errstr, errstr_size, "%s has no cublasLt" #fn, name);                    \
        dlclose(cl->so);                                                                 \
        cl->so = NULL;                                                                   \
        return -1;                                                                       \
    }
    LT_SYM(Create) LT_SYM(Destroy) LT_SYM(MatmulDescCreate) LT_SYM(MatmulDescDestroy)
    LT_SYM(MatmulDescSetAttribute) LT_SYM(MatrixLayoutCreate) LT_SYM(MatrixLayoutDestroy)
    LT_SYM(MatmulPreferenceCreate) LT_SYM(MatmulPreferenceDestroy)
    LT_SYM(MatmulPreferenceSetAttribute) LT_SYM(MatmulAlgoGetHeuristic) LT_SYM(Matmul)
    LT_SYM(GetStatusName) LT_SYM(GetStatusString) LT_SYM(GetVersion)
#undef LT_SYM
    return 0;
}

/* ---- state --------------------------------------------------------------- */

struct cuda_dev {
    int index;                     /* CUDA device index */
    char name[96];
    int major, minor;
    size_t total_mem;
    atomic_uint_fast64_t busy_ns;  /* GPU time of kinfer's work (events) */
    atomic_uint_fast64_t batches;
};

struct cuda_be {
    struct lt_api cl;              /* cuBLASLt */
    enum model_precision prec;
    int graphs;
    int per_device;                /* executors per device */
    size_t lt_ws_bytes;            /* cuBLASLt workspace per executor */
    size_t buckets_cfg[PLAN_MAX_BUCKETS];
    size_t n_buckets_cfg;
    size_t n_dev;
    struct cuda_dev dev[PLAN_MAX_DEVICES];
};

/* One layer on one device. */
struct cuda_layer {
    enum model_op op;
    size_t in, out;
    void *w;            /* dense: [out,in] in the activation type */
    void *b;            /* dense: [out] in the activation type, or NULL */
    float *ln_w, *ln_b; /* layernorm: float32 [in], or NULL */
    float eps;
    int fuse_relu;      /* dense followed by relu: fused, the relu is skipped */
    int skip;           /* a relu fused into the dense before it */
};

/* A model's copy on one device. */
struct cuda_dmodel {
    struct cuda_layer *layers;
    size_t bytes;       /* device memory its weights take */
};

struct cuda_model {
    const char *name;   /* the model's, borrowed (outlives this) */
    size_t n_layers, in_w, out_w, max_w;
    struct cuda_dmodel per_dev[PLAN_MAX_DEVICES];
};

/* One dense layer's cuBLASLt set-up in a workspace, per bucket. */
struct cuda_gemm {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a;                        /* W */
    cublasLtMatrixLayout_t b[PLAN_MAX_BUCKETS];      /* X, bucket rows */
    cublasLtMatrixLayout_t c[PLAN_MAX_BUCKETS];      /* Y, bucket rows */
    cublasLtMatmulAlgo_t algo[PLAN_MAX_BUCKETS];
};

struct cuda_ws {
    struct cuda_be *be;
    struct cuda_model *m;
    struct cuda_dev *dev;
    struct cuda_dmodel *dm;
    size_t max_rows;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    float *h_in, *h_out;        /* pinned: max_rows x in_w, max_rows x out_w */
    float *d_in;                /* max_rows x in_w, float32 */
    void *d_act[2];             /* max_rows x max_w each, activation type */
    float *d_out;               /* max_rows x out_w, float32 (16-bit precisions) */
    struct cuda_gemm *gemm;     /* per layer (dense layers only used) */
    size_t buckets[PLAN_MAX_BUCKETS];
    size_t n_buckets;
    cudaGraphExec_t graph[PLAN_MAX_BUCKETS];
    cudaEvent_t ev_start, ev_stop;
    int fault;                  /* inject_fault armed */
};

static enum kc_type kc_type_of(enum model_precision p)
{
    return p == MODEL_FP16 ? KC_F16 : p == MODEL_BF16 ? KC_BF16 : KC_F32;
}

static cudaDataType_t data_type_of(enum model_precision p)
{
    return p == MODEL_FP16 ? CUDA_R_16F : p == MODEL_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* ---- probe, open, close ---------------------------------------------------- */

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
            snprintf(what, what_size, "no CUDA device");
    }
    return count;
}

static void cuda_close(void *bep)
{
    struct cuda_be *be = bep;
    if (!be) return;
    if (be->cl.so) dlclose(be->cl.so);
    free(be);
}

/* Checks the devices gpu.devices names, makes a context on each (so a
 * broken one fails here, not at the first batch), and describes them. */
static void *cuda_open(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                       char *errstr, size_t errstr_size)
{
    struct cuda_be *be = calloc(1, sizeof(*be));
    if (!be) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    be->prec = c->precision;
    be->graphs = c->graphs;
    be->per_device = c->executors_per_device > 0 ? c->executors_per_device : 1;
    be->lt_ws_bytes = (size_t)(c->workspace_mb > 0 ? c->workspace_mb : 32) << 20;
    for (size_t i = 0; c->buckets && i < c->n_buckets && i < PLAN_MAX_BUCKETS; i++)
        be->buckets_cfg[be->n_buckets_cfg++] = c->buckets[i];
    int count = 0, ids[PLAN_MAX_DEVICES];
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
        atomic_init(&d->busy_ns, 0);
        atomic_init(&d->batches, 0);
        if ((be->prec == MODEL_BF16 || be->prec == MODEL_TF32) && d->major < 8) {
            snprintf(errstr, errstr_size, "gpu.precision %s needs compute capability 8.0 or "
                     "newer; device %d (%s) is %d.%d", model_precision_name(be->prec),
                     d->index, d->name, d->major, d->minor);
            goto fail;
        }
        if (CU(cudaSetDevice(d->index)) < 0 || CU(cudaFree(NULL)) < 0) goto fail;
        be->n_dev++;
        int k = snprintf(desc + used, desc_size - used, "%s%d: %s (sm_%d%d, %.1f GiB)",
                         i ? "; " : "", d->index, d->name, d->major, d->minor,
                         (double)d->total_mem / (1 << 30));
        if (k > 0 && (size_t)k < desc_size - used) used += (size_t)k;
    }
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    snprintf(desc + used, desc_size - used,
             "; precision %s, graphs %s, %d executor%s per device, CUDA %d.%d, driver %d.%d",
             model_precision_name(be->prec), be->graphs ? "on" : "off", be->per_device,
             be->per_device == 1 ? "" : "s", rt / 1000, rt % 1000 / 10, drv / 1000,
             drv % 1000 / 10);
    return be;
fail:
    cuda_close(be);
    return NULL;
}

/* ---- models ---------------------------------------------------------------- */

static void cuda_dmodel_free(struct cuda_dmodel *dm, size_t n_layers)
{
    for (size_t i = 0; dm->layers && i < n_layers; i++) {
        cudaFree(dm->layers[i].w);
        cudaFree(dm->layers[i].b);
        cudaFree(dm->layers[i].ln_w);
        cudaFree(dm->layers[i].ln_b);
    }
    free(dm->layers);
    dm->layers = NULL;
}

static void cuda_model_free(void *bep, void *bmp)
{
    struct cuda_be *be = bep;
    struct cuda_model *m = bmp;
    if (!m) return;
    for (size_t d = 0; d < be->n_dev; d++) {
        if (!m->per_dev[d].layers) continue;
        cudaSetDevice(be->dev[d].index);
        cuda_dmodel_free(&m->per_dev[d], m->n_layers);
    }
    free(m);
}

/* Converts t on the host (float32 when f32, else the activation type)
 * and copies it to a new device allocation *dst, adding its size to
 * *bytes. Returns 0, or -1 with errstr filled. */
static int upload(const struct cuda_be *be, const struct st_tensor *t, int f32, void **dst,
                  size_t *bytes, char *errstr, size_t errstr_size)
{
    size_t es = f32 ? sizeof(float) : plan_elem_size(be->prec);
    size_t n = (size_t)t->numel * es;
    void *host = malloc(n ? n : 1);
    if (!host) {
        snprintf(errstr, errstr_size, "out of host memory converting tensor %s", t->name);
        return -1;
    }
    int rc = f32 ? plan_convert_f32(t, host) : plan_convert(t, be->prec, host);
    if (rc == 0) rc = CU(cudaMalloc(dst, n));
    if (rc == 0) rc = CU(cudaMemcpy(*dst, host, n, cudaMemcpyHostToDevice));
    free(host);
    if (rc == 0) *bytes += n;
    return rc;
}

/* The device memory p's weights take in be's precision. */
static size_t weight_bytes(const struct cuda_be *be, const struct backend_plan *p)
{
    size_t total = 0;
    for (size_t i = 0; i < p->n_layers; i++) {
        const struct backend_layer *L = &p->layers[i];
        size_t es = L->op == MODEL_OP_DENSE ? plan_elem_size(be->prec) : sizeof(float);
        if (L->w) total += (size_t)L->w->numel * es;
        if (L->b) total += (size_t)L->b->numel * es;
    }
    return total;
}

/* Uploads the model to every device, after checking it fits: a model
 * larger than a device's free memory is a clear start-up error naming the
 * sizes. Dense weights and biases take the activation type (cuBLASLt's
 * bias matches the output's type); layernorm's stay float32. */
static void *cuda_model_new(void *bep, const struct backend_plan *p, char *errstr,
                            size_t errstr_size)
{
    struct cuda_be *be = bep;
    struct cuda_model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(errstr, errstr_size, "model %s: out of memory", p->name);
        return NULL;
    }
    m->name = p->name;
    m->n_layers = p->n_layers;
    m->in_w = p->in_w;
    m->out_w = p->out_w;
    m->max_w = p->max_w;
    size_t need = weight_bytes(be, p);
    char err[512];
    for (size_t d = 0; d < be->n_dev; d++) {
        struct cuda_dev *dev = &be->dev[d];
        struct cuda_dmodel *dm = &m->per_dev[d];
        size_t free_b = 0, total_b = 0;
        if (CU(cudaSetDevice(dev->index)) < 0 || CU(cudaMemGetInfo(&free_b, &total_b)) < 0)
            goto fail;
        if (need > free_b) {
            snprintf(errstr, errstr_size, "model %s: its weights need %.1f MiB in %s on device "
                     "%d (%s), which has %.1f MiB free of %.1f MiB", p->name,
                     (double)need / (1 << 20), model_precision_name(be->prec), dev->index,
                     dev->name, (double)free_b / (1 << 20), (double)total_b / (1 << 20));
            goto fail;
        }
        if (!(dm->layers = calloc(p->n_layers, sizeof(*dm->layers)))) {
            snprintf(errstr, errstr_size, "model %s: out of memory", p->name);
            goto fail;
        }
        for (size_t i = 0; i < p->n_layers; i++) {
            const struct backend_layer *s = &p->layers[i];
            struct cuda_layer *L = &dm->layers[i];
            L->op = s->op;
            L->in = s->in;
            L->out = s->out;
            L->eps = s->eps;
            int rc = 0;
            if (s->op == MODEL_OP_DENSE) {
                rc = upload(be, s->w, 0, &L->w, &dm->bytes, err, sizeof(err));
                if (rc == 0 && s->b) rc = upload(be, s->b, 0, &L->b, &dm->bytes, err, sizeof(err));
                L->fuse_relu = i + 1 < p->n_layers && p->layers[i + 1].op == MODEL_OP_RELU;
            } else if (s->op == MODEL_OP_LAYERNORM) {
                if (s->w) rc = upload(be, s->w, 1, (void **)&L->ln_w, &dm->bytes, err, sizeof(err));
                if (rc == 0 && s->b)
                    rc = upload(be, s->b, 1, (void **)&L->ln_b, &dm->bytes, err, sizeof(err));
            } else if (s->op == MODEL_OP_RELU && i > 0 && p->layers[i - 1].op == MODEL_OP_DENSE) {
                L->skip = 1;
            }
            if (rc < 0) {
                snprintf(errstr, errstr_size, "model %s: device %d (%s): %s", p->name,
                         dev->index, dev->name, err);
                goto fail;
            }
        }
    }
    return m;
fail:
    cuda_model_free(be, m);
    return NULL;
}

/* ---- workspaces -------------------------------------------------------------- */

static void cuda_ws_free(void *wsp)
{
    struct cuda_ws *ws = wsp;
    if (!ws) return;
    const struct lt_api *cl = &ws->be->cl;
    if (ws->dev) cudaSetDevice(ws->dev->index);
    for (size_t b = 0; b < ws->n_buckets; b++)
        if (ws->graph[b]) cudaGraphExecDestroy(ws->graph[b]);
    for (size_t i = 0; ws->gemm && i < ws->m->n_layers; i++) {
        struct cuda_gemm *g = &ws->gemm[i];
        if (g->op) cl->MatmulDescDestroy(g->op);
        if (g->a) cl->MatrixLayoutDestroy(g->a);
        for (size_t b = 0; b < ws->n_buckets; b++) {
            if (g->b[b]) cl->MatrixLayoutDestroy(g->b[b]);
            if (g->c[b]) cl->MatrixLayoutDestroy(g->c[b]);
        }
    }
    free(ws->gemm);
    if (ws->ev_start) cudaEventDestroy(ws->ev_start);
    if (ws->ev_stop) cudaEventDestroy(ws->ev_stop);
    cudaFree(ws->d_in);
    cudaFree(ws->d_act[0]);
    cudaFree(ws->d_act[1]);
    cudaFree(ws->d_out);
    cudaFree(ws->lt_ws);
    cudaFreeHost(ws->h_in);
    cudaFreeHost(ws->h_out);
    if (ws->lt) cl->Destroy(ws->lt);
    if (ws->stream) cudaStreamDestroy(ws->stream);
    free(ws);
}

/* One dense layer's descriptors for every bucket, and the algorithm
 * cuBLASLt's heuristic ranks first for each shape. */
static int gemm_setup(struct cuda_ws *ws, size_t li, char *errstr, size_t errstr_size)
{
    const struct cuda_be *be = ws->be;
    const struct lt_api *cl = &be->cl;
    const struct cuda_layer *L = &ws->dm->layers[li];
    struct cuda_gemm *g = &ws->gemm[li];
    cudaDataType_t dt = data_type_of(be->prec);
    cublasComputeType_t ct = be->prec == MODEL_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                    : CUBLAS_COMPUTE_32F;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = L->b ? (L->fuse_relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                  : CUBLASLT_EPILOGUE_BIAS)
                                  : (L->fuse_relu ? CUBLASLT_EPILOGUE_RELU
                                                  : CUBLASLT_EPILOGUE_DEFAULT);
    if (LT(cl->MatmulDescCreate(&g->op, ct, CUDA_R_32F)) < 0 ||
        LT(cl->MatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) < 0 ||
        LT(cl->MatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))) < 0 ||
        LT(cl->MatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi))) < 0)
        return -1;
    if (L->b && LT(cl->MatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &L->b, sizeof(L->b))) < 0)
        return -1;
    if (LT(cl->MatrixLayoutCreate(&g->a, dt, L->in, L->out, (int64_t)L->in)) < 0) return -1;
    cublasLtMatmulPreference_t pref = NULL;
    if (LT(cl->MatmulPreferenceCreate(&pref)) < 0) return -1;
    int rc = LT(cl->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &be->lt_ws_bytes, sizeof(be->lt_ws_bytes)));
    for (size_t b = 0; rc == 0 && b < ws->n_buckets; b++) {
        uint64_t n = ws->buckets[b];
        cublasLtMatmulHeuristicResult_t h;
        int found = 0;
        rc = LT(cl->MatrixLayoutCreate(&g->b[b], dt, L->in, n, (int64_t)L->in));
        if (rc == 0) rc = LT(cl->MatrixLayoutCreate(&g->c[b], dt, L->out, n, (int64_t)L->out));
        if (rc == 0)
            rc = LT(cl->MatmulAlgoGetHeuristic(ws->lt, g->op, g->a, g->b[b], g->c[b], g->c[b],
                                                    pref, 1, &h, &found));
        if (rc == 0 && (found < 1 || h.state != CUBLAS_STATUS_SUCCESS)) {
            snprintf(errstr, errstr_size, "cuBLASLt has no algorithm for layer %zu (%zu -> %zu) "
                     "at %llu rows in %s", li, L->in, L->out, (unsigned long long)n,
                     model_precision_name(be->prec));
            rc = -1;
        }
        if (rc == 0) g->algo[b] = h.algo;
    }
    cl->MatmulPreferenceDestroy(pref);
    return rc;
}

/* Issues bucket bi's work on the stream: the input copy, the layers, the
 * output copy. The same calls are captured into the bucket's graph or
 * issued directly (gpu.graphs off). Returns 0, or -1 with errstr. */
static int enqueue(struct cuda_ws *ws, size_t bi, char *errstr, size_t errstr_size)
{
    const struct cuda_model *m = ws->m;
    const struct cuda_be *be = ws->be;
    const struct lt_api *cl = &be->cl;
    enum kc_type kt = kc_type_of(be->prec);
    size_t rows = ws->buckets[bi];
    cudaStream_t s = ws->stream;
    if (CU(cudaMemcpyAsync(ws->d_in, ws->h_in, rows * m->in_w * sizeof(float),
                           cudaMemcpyHostToDevice, s)) < 0)
        return -1;
    void *cur = ws->d_in;
    if (kt != KC_F32) {
        if (CU(kc_from_f32(s, kt, ws->d_in, ws->d_act[0], rows * m->in_w)) < 0) return -1;
        cur = ws->d_act[0];
    }
    const float one = 1.0f, zero = 0.0f;
    for (size_t i = 0; i < m->n_layers; i++) {
        const struct cuda_layer *L = &ws->dm->layers[i];
        if (L->skip) continue;
        int rc = 0;
        switch (L->op) {
        case MODEL_OP_DENSE: {
            const struct cuda_gemm *g = &ws->gemm[i];
            void *dst = cur == ws->d_act[0] ? ws->d_act[1] : ws->d_act[0];
            rc = LT(cl->Matmul(ws->lt, g->op, &one, L->w, g->a, cur, g->b[bi], &zero, dst,
                                   g->c[bi], dst, g->c[bi], &g->algo[bi], ws->lt_ws,
                                   be->lt_ws_bytes, s));
            cur = dst;
            break;
        }
        case MODEL_OP_RELU: rc = CU(kc_bias_act(s, kt, cur, NULL, rows, L->in, KC_RELU)); break;
        case MODEL_OP_GELU: rc = CU(kc_bias_act(s, kt, cur, NULL, rows, L->in, KC_GELU)); break;
        case MODEL_OP_TANH: rc = CU(kc_bias_act(s, kt, cur, NULL, rows, L->in, KC_TANH)); break;
        case MODEL_OP_SIGMOID:
            rc = CU(kc_bias_act(s, kt, cur, NULL, rows, L->in, KC_SIGMOID));
            break;
        case MODEL_OP_LAYERNORM:
            rc = CU(kc_layernorm(s, kt, cur, L->ln_w, L->ln_b, L->eps, rows, L->in));
            break;
        case MODEL_OP_SOFTMAX: rc = CU(kc_softmax(s, kt, cur, rows, L->in)); break;
        case MODEL_OP_L2NORM: rc = CU(kc_l2norm(s, kt, cur, rows, L->in)); break;
        default:
            snprintf(errstr, errstr_size, "layer %zu: op %d has no CUDA kernel", i, (int)L->op);
            rc = -1;
        }
        if (rc < 0) return -1;
    }
    const float *res = cur;
    if (kt != KC_F32) {
        if (CU(kc_to_f32(s, kt, cur, ws->d_out, rows * m->out_w)) < 0) return -1;
        res = ws->d_out;
    }
    return CU(cudaMemcpyAsync(ws->h_out, res, rows * m->out_w * sizeof(float),
                              cudaMemcpyDeviceToHost, s));
}

/* Captures bucket bi's work into a graph and instantiates it. */
static int capture(struct cuda_ws *ws, size_t bi, char *errstr, size_t errstr_size)
{
    cudaGraph_t g = NULL;
    if (CU(cudaStreamBeginCapture(ws->stream, cudaStreamCaptureModeThreadLocal)) < 0) return -1;
    int rc = enqueue(ws, bi, errstr, errstr_size);
    /* End the capture whatever happened, so the stream is usable again. */
    cudaError_t e = cudaStreamEndCapture(ws->stream, &g);
    if (rc == 0 && e != cudaSuccess)
        rc = cuda_fail(e, "cudaStreamEndCapture", __FILE__, __LINE__, errstr, errstr_size);
    if (rc == 0) rc = CU(cudaGraphInstantiate(&ws->graph[bi], g, 0));
    if (g) cudaGraphDestroy(g);
    return rc;
}

/* Allocates and sets up everything of ws (its fields naming the model,
 * device and buckets are set). Returns 0, or -1 with errstr filled. */
static int ws_build(struct cuda_ws *ws, char *errstr, size_t errstr_size)
{
    const struct cuda_be *be = ws->be;
    const struct lt_api *cl = &be->cl;
    const struct cuda_model *m = ws->m;
    size_t max_rows = ws->max_rows, es = plan_elem_size(be->prec);
    if (CU(cudaSetDevice(ws->dev->index)) < 0 ||
        CU(cudaStreamCreateWithFlags(&ws->stream, cudaStreamNonBlocking)) < 0 ||
        LT(cl->Create(&ws->lt)) < 0 ||
        CU(cudaMalloc(&ws->lt_ws, be->lt_ws_bytes)) < 0 ||
        CU(cudaHostAlloc((void **)&ws->h_in, max_rows * m->in_w * sizeof(float),
                         cudaHostAllocPortable)) < 0 ||
        CU(cudaHostAlloc((void **)&ws->h_out, max_rows * m->out_w * sizeof(float),
                         cudaHostAllocPortable)) < 0 ||
        CU(cudaMalloc((void **)&ws->d_in, max_rows * m->in_w * sizeof(float))) < 0 ||
        CU(cudaMalloc(&ws->d_act[0], max_rows * m->max_w * es)) < 0 ||
        CU(cudaMalloc(&ws->d_act[1], max_rows * m->max_w * es)) < 0 ||
        (es != sizeof(float) &&
         CU(cudaMalloc((void **)&ws->d_out, max_rows * m->out_w * sizeof(float))) < 0) ||
        CU(cudaEventCreate(&ws->ev_start)) < 0 || CU(cudaEventCreate(&ws->ev_stop)) < 0)
        return -1;
    memset(ws->h_in, 0, max_rows * m->in_w * sizeof(float));
    if (!(ws->gemm = calloc(m->n_layers, sizeof(*ws->gemm)))) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < m->n_layers; i++)
        if (ws->dm->layers[i].op == MODEL_OP_DENSE && gemm_setup(ws, i, errstr, errstr_size) < 0)
            return -1;
    for (size_t b = 0; be->graphs && b < ws->n_buckets; b++)
        if (capture(ws, b, errstr, errstr_size) < 0) return -1;
    return CU(cudaStreamSynchronize(ws->stream));
}

/* Everything one executor needs, on the device its slot maps to: stream,
 * cuBLASLt handle and workspace, pinned host buffers, device buffers for
 * max_rows rows, per-bucket GEMM descriptors and, with graphs on, one
 * captured graph per bucket. Nothing is allocated per batch after this. */
static void *cuda_ws_new(void *bep, void *bmp, const struct backend_plan *p, unsigned slot,
                         size_t max_rows, size_t max_tokens, char *errstr,
                         size_t errstr_size)
{
    (void)max_tokens;
    struct cuda_be *be = bep;
    struct cuda_model *m = bmp;
    struct cuda_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    size_t d = plan_slot_device(slot, be->n_dev);
    ws->be = be;
    ws->m = m;
    ws->dev = &be->dev[d];
    ws->dm = &m->per_dev[d];
    ws->max_rows = max_rows;
    ws->n_buckets = plan_buckets(max_rows, be->n_buckets_cfg ? be->buckets_cfg : NULL,
                                 be->n_buckets_cfg, ws->buckets, PLAN_MAX_BUCKETS);
    char err[512];
    if (ws_build(ws, err, sizeof(err)) < 0) {
        snprintf(errstr, errstr_size, "model %s: executor %u on device %d (%s), workspace of "
                 "%zu rows: %s", p->name, slot, ws->dev->index, ws->dev->name, max_rows, err);
        cuda_ws_free(ws);
        return NULL;
    }
    return ws;
}

static float *cuda_ws_input(void *wsp)
{
    return ((struct cuda_ws *)wsp)->h_in;
}

/* Packs (when in is not the pinned buffer) and zero-pads the input to the
 * batch's bucket, runs the bucket's graph (or its calls one by one), and
 * waits: events around the work measure the device's busy time. Any
 * failure is fatal. */
static int cuda_forward(void *wsp, const float *in, size_t rows, const float **out,
                        char *errstr, size_t errstr_size)
{
    struct cuda_ws *ws = wsp;
    const struct cuda_model *m = ws->m;
    size_t bi = plan_bucket_for(ws->buckets, ws->n_buckets, rows);
    if (bi == ws->n_buckets) {
        snprintf(errstr, errstr_size, "%zu rows exceed the workspace's %zu", rows, ws->max_rows);
        return MODEL_EINVAL;
    }
    size_t b = ws->buckets[bi];
    if (in != ws->h_in) memcpy(ws->h_in, in, rows * m->in_w * sizeof(float));
    if (b > rows) memset(ws->h_in + rows * m->in_w, 0, (b - rows) * m->in_w * sizeof(float));
    if (CU(cudaSetDevice(ws->dev->index)) < 0) return MODEL_EFATAL;
    if (ws->fault) {
        ws->fault = 0;
        if (CU(kc_fault(ws->stream)) < 0) return MODEL_EFATAL;
    }
    if (CU(cudaEventRecord(ws->ev_start, ws->stream)) < 0) return MODEL_EFATAL;
    int rc = ws->be->graphs ? CU(cudaGraphLaunch(ws->graph[bi], ws->stream))
                            : enqueue(ws, bi, errstr, errstr_size);
    if (rc < 0 || CU(cudaEventRecord(ws->ev_stop, ws->stream)) < 0 ||
        CU(cudaStreamSynchronize(ws->stream)) < 0)
        return MODEL_EFATAL;
    float ms = 0;
    if (CU(cudaEventElapsedTime(&ms, ws->ev_start, ws->ev_stop)) < 0) return MODEL_EFATAL;
    atomic_fetch_add(&ws->dev->busy_ns, (uint_fast64_t)((double)ms * 1e6));
    atomic_fetch_add(&ws->dev->batches, 1);
    *out = ws->h_out;
    return MODEL_OK;
}

static void cuda_inject_fault(void *wsp)
{
    ((struct cuda_ws *)wsp)->fault = 1;
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

/* Memory in use is the device's (every process's), from the driver. */
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
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(d->index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        out->mem_total = total_b;
        out->mem_used = total_b - free_b;
    } else {
        (void)cudaGetLastError();
    }
    return 0;
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
    .inject_fault = cuda_inject_fault,
    .executors = cuda_executors,
    .precision = cuda_precision,
    .devices = cuda_devices,
    .device_stats = cuda_device_stats,
};

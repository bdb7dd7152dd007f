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
 * Text encoders (BERT) run on packed sequences: every GEMM and LayerNorm
 * over the batch's tokens only, attention padded to the batch's longest
 * sequence as two strided-batched GEMMs; the "encoders" section below
 * says how, and why no graphs yet.
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
#include <math.h>
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
    LT_FN(MatrixLayoutSetAttribute) LT_FN(MatmulPreferenceCreate) LT_FN(MatmulPreferenceDestroy)
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
    LT_SYM(MatrixLayoutSetAttribute) LT_SYM(MatmulPreferenceCreate) LT_SYM(MatmulPreferenceDestroy)
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

/* An encoder's sizes and head, from the validated plan. */
struct cuda_bert_cfg {
    size_t hidden, heads, inter, max_pos, n_layers, n_labels;
    float eps;
    int gelu_tanh, normalize, sigmoid;
    enum model_pooling pooling;
    enum model_head head;
};

/* One encoder layer on one device: Q, K and V stacked into one [3H,H]
 * weight and [3H] bias, so one GEMM projects all three; dense weights and
 * biases in the activation type (cuBLASLt's bias has the output's type),
 * LayerNorm's in float32 as the kernels take them. */
struct cuda_bert_layer {
    void *qkv_w, *qkv_b, *ao_w, *ao_b, *i_w, *i_b, *o_w, *o_b;
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
};

/* An encoder on one device. The embedding tables are in the activation
 * type too (half the memory in 16 bits); kc_embed sums them in float32. */
struct cuda_bert {
    size_t n_layers;
    void *word, *pos, *type;
    float *emb_ln_w, *emb_ln_b;
    struct cuda_bert_layer *layers;
    void *pool_w, *pool_b, *cls_w, *cls_b; /* the classifier head, else NULL */
};

/* A model's copy on one device: a layer list's, or an encoder's. */
struct cuda_dmodel {
    struct cuda_layer *layers;
    struct cuda_bert *bert;
    size_t bytes;       /* device memory its weights take */
};

struct cuda_model {
    const char *name;   /* the model's, borrowed (outlives this) */
    size_t n_layers, in_w, out_w, max_w;
    int is_encoder;
    struct cuda_bert_cfg enc; /* an encoder's (then no layers) */
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

/* Attention pads each sequence to the batch's longest rounded up to this
 * many tokens: every leading dimension and batch stride of its GEMMs is
 * then a multiple of 16 bytes in 16-bit types (8 elements, dh being a
 * multiple of 8 in BERT's sizes), as the tensor cores' vector loads want,
 * for at most 7 rows of padding per sequence. */
#define ENC_ALIGN 8

/* The GEMMs of an encoder, one of each kind per workspace, shared by
 * every layer (the shapes are the same; the bias pointer is set per
 * call). */
enum { EG_QKV = 0, EG_AO, EG_FFN1, EG_FFN2, EG_QK, EG_PV, EG_POOL, EG_CLS, EG_N };

/* One matrix as cuBLASLt sees it (column-major): rows, columns, leading
 * dimension, and the stride between the matrices of a batch. */
struct eg_dims {
    uint64_t rows, cols;
    int64_t ld, stride;
};

/* An encoder GEMM, whose shape follows the batch's tokens (the linear
 * layers) or its sequences and longest length (attention): its layouts
 * are set, and cuBLASLt's heuristic asked for an algorithm, only when the
 * shape differs from the previous batch's. */
struct enc_gemm {
    const char *what;                 /* for messages */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lay[3];    /* A, B, C (C is also D) */
    struct eg_dims dims[3];           /* what lay holds; batch 0: nothing yet */
    int32_t batch;
    cublasLtMatmulAlgo_t algo;
    int fused_gelu;                   /* FFN1: the tanh GELU is in the epilogue */
    int gelu_kernel;                  /* FFN1: GELU runs as a kernel after the GEMM */
};

/* An encoder workspace's buffers, for max_tokens tokens in all (T) and
 * max_rows sequences (R) of at most max_len tokens each; attention pads
 * them to Lp, the batch's longest rounded up to ENC_ALIGN (so n x Lp <=
 * T + (ENC_ALIGN - 1) R = P). Activation type unless said. */
struct cuda_enc_ws {
    size_t max_tokens, max_len, max_padded; /* T, the longest sequence, P */
    uint32_t *h_tok, *d_tok; /* pinned and device: ids, type ids, each token's
                                sequence [T each], offsets [R + 1] */
    void *x;                 /* [T,H] hidden states */
    void *qkv;               /* [T,3H] projections; then the attention output */
    void *ctx;               /* [T,H] attention context; then the feed-forward's output */
    void *inter;             /* [T,I] feed-forward intermediate */
    void *q, *k, *v;         /* [n,heads,Lp,dh] padded: P x H; q then holds the context */
    void *scores;            /* [n,heads,Lp,Lp]: heads x P x Lp at most */
    void *cls, *pooled, *logits; /* classifier: [R,H], [R,H], [R,labels] */
    float *res;              /* float32 result on the device (unless x or logits are) */
    float *h_res;            /* pinned: the result */
    struct enc_gemm g[EG_N];
    /* With gpu.graphs: the batch shapes seen lately, and a captured graph
     * for those that came back (gpu/plan.h's plan_shape_use). */
    struct plan_shapes shapes;
    cudaGraphExec_t graph[PLAN_SHAPE_SLOTS];
};

struct cuda_ws {
    struct cuda_be *be;
    struct cuda_model *m;
    struct cuda_dev *dev;
    struct cuda_dmodel *dm;
    size_t max_rows;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasLtMatmulPreference_t pref; /* the heuristic's: the workspace's size */
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
    struct cuda_enc_ws *enc;    /* an encoder's (then no layers, buckets or graphs) */
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

static void cuda_bert_free(struct cuda_bert *b)
{
    if (!b) return;
    for (size_t i = 0; b->layers && i < b->n_layers; i++) {
        struct cuda_bert_layer *L = &b->layers[i];
        void *all[] = {L->qkv_w, L->qkv_b, L->ao_w,  L->ao_b,  L->i_w,   L->i_b,
                       L->o_w,   L->o_b,   L->ln1_w, L->ln1_b, L->ln2_w, L->ln2_b};
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) cudaFree(all[k]);
    }
    free(b->layers);
    void *all[] = {b->word,   b->pos,    b->type,  b->emb_ln_w, b->emb_ln_b,
                   b->pool_w, b->pool_b, b->cls_w, b->cls_b};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) cudaFree(all[k]);
    free(b);
}

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
    cuda_bert_free(dm->bert);
    dm->bert = NULL;
}

static void cuda_model_free(void *bep, void *bmp)
{
    struct cuda_be *be = bep;
    struct cuda_model *m = bmp;
    if (!m) return;
    for (size_t d = 0; d < be->n_dev; d++) {
        if (!m->per_dev[d].layers && !m->per_dev[d].bert) continue;
        cudaSetDevice(be->dev[d].index);
        cuda_dmodel_free(&m->per_dev[d], m->n_layers);
    }
    free(m);
}

/* One device allocation of weights: up to three tensors of the same
 * shape stacked (an encoder's query, key and value), in float32 or the
 * activation type. dst is where the allocation goes (NULL when only its
 * size is wanted). */
struct weight_part {
    void **dst;
    const struct st_tensor *t[3];
    int f32;
};

/* The bytes part takes on the device in be's precision. */
static size_t part_bytes(const struct cuda_be *be, const struct weight_part *part)
{
    size_t es = part->f32 ? sizeof(float) : plan_elem_size(be->prec), n = 0;
    for (size_t k = 0; k < 3 && part->t[k]; k++) n += (size_t)part->t[k]->numel * es;
    return n;
}

/* Converts part's tensors on the host, one after the other, and copies
 * them to a new device allocation *part->dst, adding its size to *bytes.
 * Returns 0, or -1 with errstr filled. */
static int upload_part(const struct cuda_be *be, const struct weight_part *part, size_t *bytes,
                       char *errstr, size_t errstr_size)
{
    size_t n = part_bytes(be, part), off = 0;
    char *host = malloc(n ? n : 1);
    if (!host) {
        snprintf(errstr, errstr_size, "out of host memory converting tensor %s", part->t[0]->name);
        return -1;
    }
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < 3 && part->t[k]; k++) {
        const struct st_tensor *t = part->t[k];
        rc = part->f32 ? plan_convert_f32(t, (float *)(host + off))
                       : plan_convert(t, be->prec, host + off);
        if (rc < 0) snprintf(errstr, errstr_size, "tensor %s: dtype not loadable", t->name);
        off += (size_t)t->numel * (part->f32 ? sizeof(float) : plan_elem_size(be->prec));
    }
    if (rc == 0) rc = CU(cudaMalloc(part->dst, n));
    if (rc == 0) rc = CU(cudaMemcpy(*part->dst, host, n, cudaMemcpyHostToDevice));
    free(host);
    if (rc == 0) *bytes += n;
    return rc;
}

/* Converts t (float32 when f32, else the activation type) and copies it
 * to a new device allocation *dst, adding its size to *bytes. */
static int upload(const struct cuda_be *be, const struct st_tensor *t, int f32, void **dst,
                  size_t *bytes, char *errstr, size_t errstr_size)
{
    const struct weight_part part = {dst, {t, NULL, NULL}, f32};
    return upload_part(be, &part, bytes, errstr, errstr_size);
}

/* How many allocations encoder b takes on a device, as bert_parts makes
 * them: 5 for the embeddings, 12 per layer, 4 for a classifier head. */
static size_t bert_n_parts(const struct backend_bert *b)
{
    return 5 + 12 * b->n_layers + 4;
}

/* Encoder b's allocations (bert_n_parts of them at most) into out, with
 * their destinations in db, or NULL ones when db is NULL (for the sizes).
 * Returns how many. */
static size_t bert_parts(const struct backend_bert *b, struct cuda_bert *db,
                         struct weight_part *out)
{
    size_t k = 0;
#define PART(field, f32, ...) \
    out[k++] = (struct weight_part){db ? (void **)&db->field : NULL, {__VA_ARGS__}, (f32)}
    PART(word, 0, b->word);
    PART(pos, 0, b->pos);
    PART(type, 0, b->type);
    PART(emb_ln_w, 1, b->emb_ln_w);
    PART(emb_ln_b, 1, b->emb_ln_b);
    for (size_t i = 0; i < b->n_layers; i++) {
        const struct backend_bert_layer *S = &b->layers[i];
        PART(layers[i].qkv_w, 0, S->q_w, S->k_w, S->v_w);
        PART(layers[i].qkv_b, 0, S->q_b, S->k_b, S->v_b);
        PART(layers[i].ao_w, 0, S->ao_w);
        PART(layers[i].ao_b, 0, S->ao_b);
        PART(layers[i].ln1_w, 1, S->ln1_w);
        PART(layers[i].ln1_b, 1, S->ln1_b);
        PART(layers[i].i_w, 0, S->i_w);
        PART(layers[i].i_b, 0, S->i_b);
        PART(layers[i].o_w, 0, S->o_w);
        PART(layers[i].o_b, 0, S->o_b);
        PART(layers[i].ln2_w, 1, S->ln2_w);
        PART(layers[i].ln2_b, 1, S->ln2_b);
    }
    if (b->head == MODEL_HEAD_CLASSIFIER) {
        PART(pool_w, 0, b->pool_w);
        PART(pool_b, 0, b->pool_b);
        PART(cls_w, 0, b->cls_w);
        PART(cls_b, 0, b->cls_b);
    }
#undef PART
    return k;
}

/* Uploads encoder b to the device that is current into dm. Returns 0, or
 * -1 with errstr filled. */
static int bert_upload(const struct cuda_be *be, const struct backend_bert *b,
                       struct cuda_dmodel *dm, char *errstr, size_t errstr_size)
{
    struct weight_part *parts = malloc(bert_n_parts(b) * sizeof(*parts));
    if (!parts || !(dm->bert = calloc(1, sizeof(*dm->bert))) ||
        !(dm->bert->layers = calloc(b->n_layers, sizeof(*dm->bert->layers)))) {
        free(parts);
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    dm->bert->n_layers = b->n_layers;
    size_t n = bert_parts(b, dm->bert, parts);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = upload_part(be, &parts[i], &dm->bytes, errstr, errstr_size);
    free(parts);
    return rc;
}

/* The device memory p's weights take in be's precision; 0 when the host
 * is out of memory to work it out (the upload then says so). */
static size_t weight_bytes(const struct cuda_be *be, const struct backend_plan *p)
{
    size_t total = 0;
    if (p->bert) {
        struct weight_part *parts = malloc(bert_n_parts(p->bert) * sizeof(*parts));
        if (!parts) return 0;
        size_t n = bert_parts(p->bert, NULL, parts);
        for (size_t i = 0; i < n; i++) total += part_bytes(be, &parts[i]);
        free(parts);
        return total;
    }
    for (size_t i = 0; i < p->n_layers; i++) {
        const struct backend_layer *L = &p->layers[i];
        size_t es = L->op == MODEL_OP_DENSE ? plan_elem_size(be->prec) : sizeof(float);
        if (L->w) total += (size_t)L->w->numel * es;
        if (L->b) total += (size_t)L->b->numel * es;
    }
    return total;
}

/* The encoder's sizes and head, kept with the model. */
static void bert_cfg_of(const struct backend_bert *b, struct cuda_bert_cfg *c)
{
    *c = (struct cuda_bert_cfg){
        .hidden = b->hidden,
        .heads = b->heads,
        .inter = b->intermediate,
        .max_pos = b->max_pos,
        .n_layers = b->n_layers,
        .n_labels = b->head == MODEL_HEAD_CLASSIFIER ? b->n_labels : 0,
        .eps = b->ln_eps,
        .gelu_tanh = b->gelu_tanh,
        .normalize = b->normalize,
        .sigmoid = b->sigmoid,
        .pooling = b->pooling,
        .head = b->head,
    };
}

/* Uploads the model to every device, after checking it fits: a model
 * larger than a device's free memory is a clear start-up error naming the
 * sizes. Dense weights and biases take the activation type (cuBLASLt's
 * bias matches the output's type); layernorm's stay float32. An encoder's
 * Q, K and V are stacked on the way (bert_parts). */
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
    if (p->bert) {
        m->is_encoder = 1;
        bert_cfg_of(p->bert, &m->enc);
    }
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
        if (p->bert) {
            if (bert_upload(be, p->bert, dm, err, sizeof(err)) < 0) {
                snprintf(errstr, errstr_size, "model %s: device %d (%s): %s", p->name,
                         dev->index, dev->name, err);
                goto fail;
            }
            continue;
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

static void enc_ws_free(const struct lt_api *cl, struct cuda_enc_ws *e)
{
    if (!e) return;
    for (size_t i = 0; i < PLAN_SHAPE_SLOTS; i++)
        if (e->graph[i]) cudaGraphExecDestroy(e->graph[i]);
    for (size_t i = 0; i < EG_N; i++) {
        struct enc_gemm *g = &e->g[i];
        if (g->op) cl->MatmulDescDestroy(g->op);
        for (int k = 0; k < 3; k++)
            if (g->lay[k]) cl->MatrixLayoutDestroy(g->lay[k]);
    }
    void *dev[] = {e->d_tok, e->x,      e->qkv,    e->ctx,    e->inter, e->q,  e->k,
                   e->v,     e->scores, e->cls,    e->pooled, e->logits, e->res};
    for (size_t k = 0; k < sizeof(dev) / sizeof(dev[0]); k++) cudaFree(dev[k]);
    cudaFreeHost(e->h_tok);
    cudaFreeHost(e->h_res);
    free(e);
}

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
    enc_ws_free(cl, ws->enc);
    if (ws->ev_start) cudaEventDestroy(ws->ev_start);
    if (ws->ev_stop) cudaEventDestroy(ws->ev_stop);
    cudaFree(ws->d_in);
    cudaFree(ws->d_act[0]);
    cudaFree(ws->d_act[1]);
    cudaFree(ws->d_out);
    cudaFree(ws->lt_ws);
    cudaFreeHost(ws->h_in);
    cudaFreeHost(ws->h_out);
    if (ws->pref) cl->MatmulPreferenceDestroy(ws->pref);
    if (ws->lt) cl->Destroy(ws->lt);
    if (ws->stream) cudaStreamDestroy(ws->stream);
    free(ws);
}

/* A matmul descriptor in be's precision for op(A) x B, op(A) being A^T
 * when ta is CUBLAS_OP_T: float32 scale and accumulation (TF32 inputs
 * with gpu.precision tf32), epilogue epi and, when not NULL, its bias
 * (cuBLASLt's heuristic reads the pointer for its alignment). */
static int lt_desc(const struct cuda_be *be, cublasLtMatmulDesc_t *op, cublasOperation_t ta,
                   cublasLtEpilogue_t epi, const void *bias, char *errstr, size_t errstr_size)
{
    const struct lt_api *cl = &be->cl;
    cublasComputeType_t ct = be->prec == MODEL_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                    : CUBLAS_COMPUTE_32F;
    cublasOperation_t tb = CUBLAS_OP_N;
    if (LT(cl->MatmulDescCreate(op, ct, CUDA_R_32F)) < 0 ||
        LT(cl->MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) < 0 ||
        LT(cl->MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))) < 0 ||
        LT(cl->MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi))) < 0)
        return -1;
    if (bias && LT(cl->MatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                  sizeof(bias))) < 0)
        return -1;
    return 0;
}

/* The algorithm cuBLASLt's heuristic ranks first for op on layouts a, b
 * and c (also d), within ws's cuBLASLt workspace; *found is 0 when it has
 * none (CUBLAS_STATUS_NOT_SUPPORTED says the same). */
static int lt_best(const struct cuda_ws *ws, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                   cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatmulAlgo_t *algo,
                   int *found, char *errstr, size_t errstr_size)
{
    const struct lt_api *cl = &ws->be->cl;
    cublasLtMatmulHeuristicResult_t h;
    int n = 0;
    cublasStatus_t st = cl->MatmulAlgoGetHeuristic(ws->lt, op, a, b, c, c, ws->pref, 1, &h, &n);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED &&
        lt_check(cl, st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__, errstr,
                 errstr_size) < 0)
        return -1;
    *found = st == CUBLAS_STATUS_SUCCESS && n >= 1 && h.state == CUBLAS_STATUS_SUCCESS;
    if (*found) *algo = h.algo;
    return 0;
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
    cublasLtEpilogue_t epi = L->b ? (L->fuse_relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                  : CUBLASLT_EPILOGUE_BIAS)
                                  : (L->fuse_relu ? CUBLASLT_EPILOGUE_RELU
                                                  : CUBLASLT_EPILOGUE_DEFAULT);
    if (lt_desc(be, &g->op, CUBLAS_OP_T, epi, L->b, errstr, errstr_size) < 0 ||
        LT(cl->MatrixLayoutCreate(&g->a, dt, L->in, L->out, (int64_t)L->in)) < 0)
        return -1;
    for (size_t b = 0; b < ws->n_buckets; b++) {
        uint64_t n = ws->buckets[b];
        int found = 0;
        if (LT(cl->MatrixLayoutCreate(&g->b[b], dt, L->in, n, (int64_t)L->in)) < 0 ||
            LT(cl->MatrixLayoutCreate(&g->c[b], dt, L->out, n, (int64_t)L->out)) < 0 ||
            lt_best(ws, g->op, g->a, g->b[b], g->c[b], &g->algo[b], &found, errstr,
                    errstr_size) < 0)
            return -1;
        if (!found) {
            snprintf(errstr, errstr_size, "cuBLASLt has no algorithm for layer %zu (%zu -> %zu) "
                     "at %llu rows in %s", li, L->in, L->out, (unsigned long long)n,
                     model_precision_name(be->prec));
            return -1;
        }
    }
    return 0;
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

/* What every workspace has, on its device: a non-blocking stream, a
 * cuBLASLt handle, workspace and heuristic preference, and the events
 * that time its batches. Returns 0, or -1 with errstr filled. */
static int ws_common(struct cuda_ws *ws, char *errstr, size_t errstr_size)
{
    const struct cuda_be *be = ws->be;
    const struct lt_api *cl = &be->cl;
    if (CU(cudaSetDevice(ws->dev->index)) < 0 ||
        CU(cudaStreamCreateWithFlags(&ws->stream, cudaStreamNonBlocking)) < 0 ||
        LT(cl->Create(&ws->lt)) < 0 ||
        CU(cudaMalloc(&ws->lt_ws, be->lt_ws_bytes)) < 0 ||
        LT(cl->MatmulPreferenceCreate(&ws->pref)) < 0 ||
        LT(cl->MatmulPreferenceSetAttribute(ws->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &be->lt_ws_bytes, sizeof(be->lt_ws_bytes))) < 0 ||
        CU(cudaEventCreate(&ws->ev_start)) < 0 || CU(cudaEventCreate(&ws->ev_stop)) < 0)
        return -1;
    return 0;
}

/* Allocates and sets up everything of a layer model's ws (its fields
 * naming the model, device and buckets are set). Returns 0, or -1 with
 * errstr filled. */
static int ws_build(struct cuda_ws *ws, char *errstr, size_t errstr_size)
{
    const struct cuda_be *be = ws->be;
    const struct cuda_model *m = ws->m;
    size_t max_rows = ws->max_rows, es = plan_elem_size(be->prec);
    if (ws_common(ws, errstr, errstr_size) < 0 ||
        CU(cudaHostAlloc((void **)&ws->h_in, max_rows * m->in_w * sizeof(float),
                         cudaHostAllocPortable)) < 0 ||
        CU(cudaHostAlloc((void **)&ws->h_out, max_rows * m->out_w * sizeof(float),
                         cudaHostAllocPortable)) < 0 ||
        CU(cudaMalloc((void **)&ws->d_in, max_rows * m->in_w * sizeof(float))) < 0 ||
        CU(cudaMalloc(&ws->d_act[0], max_rows * m->max_w * es)) < 0 ||
        CU(cudaMalloc(&ws->d_act[1], max_rows * m->max_w * es)) < 0 ||
        (es != sizeof(float) &&
         CU(cudaMalloc((void **)&ws->d_out, max_rows * m->out_w * sizeof(float))) < 0))
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

/* ---- encoders ------------------------------------------------------------------
 *
 * A batch of packed sequences runs as follows (gpu/backend_cpu.c's
 * cpu_encode is the same math on the CPU):
 *   - one upload of the tokens (ids, type ids, each token's sequence,
 *     offsets), packed by the host into a pinned buffer;
 *   - kc_embed: word + position + token type embeddings and their
 *     LayerNorm, one block per token;
 *   - per layer, on the packed tokens (T rows, no padding): the QKV GEMM
 *     with its bias in the epilogue; attention (below); the output
 *     projection, bias in the epilogue; kc_add_layernorm (residual +
 *     LayerNorm, float32 statistics); the feed-forward's first GEMM with
 *     its bias, and hidden_act "gelu_new"'s tanh GELU, in the epilogue
 *     (CUBLASLT_EPILOGUE_GELU_BIAS is that approximation; hidden_act
 *     "gelu" is the erf form, which no epilogue computes, so it runs as a
 *     kernel after a bias epilogue); the second GEMM, and the residual +
 *     LayerNorm again;
 *   - the head: pooling (cls, mean or max over each sequence's own
 *     tokens, or every token) and the L2 norm in float32, or the
 *     classifier (tanh pooler on [CLS], classifier, softmax or sigmoid
 *     over float32 logits); one copy of the float32 result back.
 *
 * Attention pads: the batch's sequences are gathered, per head, into
 * [n, heads, Lp, dh] (Lp the batch's longest rounded up to ENC_ALIGN,
 * padding rows zero), so the
 * scores Q K^T and the context P V are each one strided-batched cuBLASLt
 * GEMM of n x heads matrices on the tensor cores; a masked softmax kernel
 * (scale already in the GEMM's alpha) gives padding keys probability 0,
 * and the context is scattered back to packed rows. Only attention sees
 * padding: the GEMMs and LayerNorms, nearly all of the work at BERT's
 * sizes (attention's own GEMMs are L / (6 H) of the rest: 3% at L = 128,
 * H = 768), cost the tokens, so the backend reports encoder_pads = 0. A
 * fused kernel (scores in shared memory or registers, online softmax)
 * would save the gather, scatter and scores' round trip through memory;
 * it is the next step once a device can measure both.
 *
 * The GEMMs' shapes change with every batch, so their layouts are set per
 * batch (cuBLASLt layouts are host-side descriptors) and the heuristic
 * asked again only when a shape differs from the previous batch's: a few
 * host calls per batch, none per layer.
 *
 * Graphs (gpu.graphs): a graph fixes every shape, so it serves one
 * (sequences, tokens, padded length) exactly; nothing is padded to make
 * shapes meet. Each workspace remembers its last PLAN_SHAPE_SLOTS shapes
 * (gpu/plan.c): a shape seen a second time is captured, later ones replay
 * it, the least recently used gives its slot up. Traffic of fixed lengths
 * (a benchmark, clients that pad, one text per job of similar size) then
 * runs on graphs; a shape seen once runs eagerly, as before. One graph is
 * captured at start-up, so a backend that cannot capture fails there. */

/* Sets g's layouts to d (A, B, C) with batch matrices each, and picks its
 * algorithm, unless the previous batch had the same shape. FFN1's fused
 * tanh GELU falls back to a bias epilogue and a kernel when cuBLASLt has
 * no algorithm with it for a shape, from then on. */
static int eg_shape(struct cuda_ws *ws, struct enc_gemm *g, const struct eg_dims d[3],
                    int32_t batch, char *errstr, size_t errstr_size)
{
    const struct lt_api *cl = &ws->be->cl;
    if (g->batch == batch && memcmp(g->dims, d, sizeof(g->dims)) == 0) return 0;
    g->batch = 0; /* nothing holds until an algorithm is found */
    for (int k = 0; k < 3; k++) {
        cublasLtMatrixLayout_t l = g->lay[k];
        if (LT(cl->MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &d[k].rows,
                                            sizeof(d[k].rows))) < 0 ||
            LT(cl->MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &d[k].cols,
                                            sizeof(d[k].cols))) < 0 ||
            LT(cl->MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &d[k].ld,
                                            sizeof(d[k].ld))) < 0 ||
            LT(cl->MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                            sizeof(batch))) < 0 ||
            LT(cl->MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &d[k].stride, sizeof(d[k].stride))) < 0)
            return -1;
    }
    int found = 0;
    if (lt_best(ws, g->op, g->lay[0], g->lay[1], g->lay[2], &g->algo, &found, errstr,
                errstr_size) < 0)
        return -1;
    if (!found && g->fused_gelu) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        if (LT(cl->MatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                          sizeof(epi))) < 0)
            return -1;
        g->fused_gelu = 0;
        g->gelu_kernel = 1;
        if (lt_best(ws, g->op, g->lay[0], g->lay[1], g->lay[2], &g->algo, &found, errstr,
                    errstr_size) < 0)
            return -1;
    }
    if (!found) {
        snprintf(errstr, errstr_size, "cuBLASLt has no algorithm for the %s (%llu x %llu, "
                 "batch %d) in %s", g->what, (unsigned long long)d[2].rows,
                 (unsigned long long)d[2].cols, (int)batch, model_precision_name(ws->be->prec));
        return -1;
    }
    memcpy(g->dims, d, sizeof(g->dims));
    g->batch = batch;
    return 0;
}

/* A linear layer y [rows,out] = x [rows,in] W^T in cuBLASLt's view (the
 * mapping at the top of this file): A = W (in x out, transposed), B = x
 * (in x rows), C = y (out x rows). */
static void eg_linear(struct eg_dims d[3], size_t in, size_t out, size_t rows)
{
    d[0] = (struct eg_dims){in, out, (int64_t)in, 0};
    d[1] = (struct eg_dims){in, rows, (int64_t)in, 0};
    d[2] = (struct eg_dims){out, rows, (int64_t)out, 0};
}

/* Every GEMM's shape for a batch of n sequences, T tokens, padded to L
 * for attention. */
static int enc_shapes(struct cuda_ws *ws, size_t n, size_t T, size_t L, char *errstr,
                      size_t errstr_size)
{
    const struct cuda_bert_cfg *c = &ws->m->enc;
    struct enc_gemm *g = ws->enc->g;
    size_t H = c->hidden, dh = H / c->heads;
    int32_t nb = (int32_t)(n * c->heads);
    int64_t sq = (int64_t)(L * dh), ss = (int64_t)(L * L);
    struct eg_dims d[3];
    eg_linear(d, H, 3 * H, T);
    if (eg_shape(ws, &g[EG_QKV], d, 1, errstr, errstr_size) < 0) return -1;
    eg_linear(d, H, H, T);
    if (eg_shape(ws, &g[EG_AO], d, 1, errstr, errstr_size) < 0) return -1;
    eg_linear(d, H, c->inter, T);
    if (eg_shape(ws, &g[EG_FFN1], d, 1, errstr, errstr_size) < 0) return -1;
    eg_linear(d, c->inter, H, T);
    if (eg_shape(ws, &g[EG_FFN2], d, 1, errstr, errstr_size) < 0) return -1;
    /* Per (sequence, head), row-major: S [L,L] = Q [L,dh] K^T, i.e. in
     * cuBLASLt's view S^T (L x L) = op_T(K^T (dh x L)) x Q^T (dh x L): the
     * keys play a linear layer's weight, the queries its input. */
    d[0] = (struct eg_dims){dh, L, (int64_t)dh, sq};
    d[1] = (struct eg_dims){dh, L, (int64_t)dh, sq};
    d[2] = (struct eg_dims){L, L, (int64_t)L, ss};
    if (eg_shape(ws, &g[EG_QK], d, nb, errstr, errstr_size) < 0) return -1;
    /* C [L,dh] = P [L,L] V, i.e. C^T (dh x L) = V^T (dh x L) x P^T (L x L). */
    d[0] = (struct eg_dims){dh, L, (int64_t)dh, sq};
    d[1] = (struct eg_dims){L, L, (int64_t)L, ss};
    d[2] = (struct eg_dims){dh, L, (int64_t)dh, sq};
    if (eg_shape(ws, &g[EG_PV], d, nb, errstr, errstr_size) < 0) return -1;
    if (c->head != MODEL_HEAD_CLASSIFIER) return 0;
    eg_linear(d, H, H, n);
    if (eg_shape(ws, &g[EG_POOL], d, 1, errstr, errstr_size) < 0) return -1;
    eg_linear(d, H, c->n_labels, n);
    return eg_shape(ws, &g[EG_CLS], d, 1, errstr, errstr_size);
}

/* c = alpha op(a) b, plus bias (this layer's; NULL when g has none) and
 * whatever g's epilogue fuses, at the shape enc_shapes set. */
static int eg_run(const struct cuda_ws *ws, const struct enc_gemm *g, float alpha, const void *a,
                  const void *b, void *c, const void *bias, char *errstr, size_t errstr_size)
{
    const struct lt_api *cl = &ws->be->cl;
    const float zero = 0.0f;
    if ((bias && LT(cl->MatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias))) < 0) ||
        LT(cl->Matmul(ws->lt, g->op, &alpha, a, g->lay[0], b, g->lay[1], &zero, c, g->lay[2], c,
                      g->lay[2], &g->algo, ws->lt_ws, ws->be->lt_ws_bytes, ws->stream)) < 0) {
        size_t k = strlen(errstr);
        snprintf(errstr + k, errstr_size - k, " (the %s)", g->what);
        return -1;
    }
    return 0;
}

/* g's descriptor and placeholder layouts (enc_shapes sets them per
 * batch); bias is the first layer's, for the heuristic. */
static int enc_gemm_new(struct cuda_ws *ws, struct enc_gemm *g, const char *what,
                        cublasOperation_t ta, cublasLtEpilogue_t epi, const void *bias,
                        char *errstr, size_t errstr_size)
{
    const struct lt_api *cl = &ws->be->cl;
    cudaDataType_t dt = data_type_of(ws->be->prec);
    g->what = what;
    if (lt_desc(ws->be, &g->op, ta, epi, bias, errstr, errstr_size) < 0) return -1;
    for (int k = 0; k < 3; k++)
        if (LT(cl->MatrixLayoutCreate(&g->lay[k], dt, 1, 1, 1)) < 0) return -1;
    return 0;
}

static int enc_capture(struct cuda_ws *ws, size_t slot, size_t n, size_t T, size_t L,
                       char *errstr, size_t errstr_size);

/* An encoder's workspace: device buffers for max_tokens tokens (T) and
 * max_rows sequences (R), after checking they fit the device's free
 * memory, pinned buffers for the tokens and the result, and one GEMM of
 * each kind, tried once at start-up on one sequence of the longest
 * length so a missing algorithm fails here rather than at the first
 * batch. Attention's scores take about heads x T x min(T, max_position)
 * values, the largest buffer for long sequences (BERT-base, 16384 tokens
 * of up to 512: 201 MB in 16 bits). */
static int ws_build_enc(struct cuda_ws *ws, size_t max_tokens, char *errstr, size_t errstr_size)
{
    const struct cuda_be *be = ws->be;
    const struct cuda_bert_cfg *c = &ws->m->enc;
    const struct cuda_bert *w = ws->dm->bert;
    size_t es = plan_elem_size(be->prec), R = ws->max_rows, T = max_tokens;
    size_t H = c->hidden, L = T < c->max_pos ? T : c->max_pos;
    size_t Lp = (L + ENC_ALIGN - 1) / ENC_ALIGN * ENC_ALIGN, P = T + (ENC_ALIGN - 1) * R;
    int f32 = kc_type_of(be->prec) == KC_F32, cls = c->head == MODEL_HEAD_CLASSIFIER;
    int all_tokens = !cls && c->pooling == MODEL_POOL_NONE;
    size_t res_n = cls ? R * c->n_labels : all_tokens ? T * H : R * H;
    size_t tok_n = 3 * T + R + 1;
    struct cuda_enc_ws *e = calloc(1, sizeof(*e));
    if (!(ws->enc = e)) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    e->max_tokens = T;
    e->max_len = L;
    e->max_padded = P;
    if (c->heads > INT32_MAX / R) {
        snprintf(errstr, errstr_size, "%zu sequences x %zu heads: more matrices than a batched "
                 "GEMM takes", R, c->heads);
        return -1;
    }
    const struct {
        void **p;
        size_t bytes;
        const char *what;
    } bufs[] = {
        {(void **)&e->d_tok, tok_n * sizeof(uint32_t), "cudaMalloc(tokens)"},
        {&e->x, T * H * es, "cudaMalloc(hidden states)"},
        {&e->qkv, 3 * T * H * es, "cudaMalloc(qkv)"},
        {&e->ctx, T * H * es, "cudaMalloc(context)"},
        {&e->inter, T * c->inter * es, "cudaMalloc(intermediate)"},
        {&e->q, P * H * es, "cudaMalloc(q)"},
        {&e->k, P * H * es, "cudaMalloc(k)"},
        {&e->v, P * H * es, "cudaMalloc(v)"},
        {&e->scores, c->heads * P * Lp * es, "cudaMalloc(scores)"},
        {&e->cls, cls ? R * H * es : 0, "cudaMalloc(cls)"},
        {&e->pooled, cls ? R * H * es : 0, "cudaMalloc(pooled)"},
        {&e->logits, cls && !f32 ? R * c->n_labels * es : 0, "cudaMalloc(logits)"},
        {(void **)&e->res, all_tokens && f32 ? 0 : res_n * sizeof(float), "cudaMalloc(result)"},
    };
    size_t need = 0, free_b = 0, total_b = 0;
    for (size_t k = 0; k < sizeof(bufs) / sizeof(bufs[0]); k++) need += bufs[k].bytes;
    if (ws_common(ws, errstr, errstr_size) < 0 || CU(cudaMemGetInfo(&free_b, &total_b)) < 0)
        return -1;
    if (need > free_b) {
        snprintf(errstr, errstr_size, "its buffers need %.1f MiB in %s; the device has %.1f MiB "
                 "free of %.1f MiB", (double)need / (1 << 20), model_precision_name(be->prec),
                 (double)free_b / (1 << 20), (double)total_b / (1 << 20));
        return -1;
    }
    for (size_t k = 0; k < sizeof(bufs) / sizeof(bufs[0]); k++)
        if (bufs[k].bytes && cuda_check(cudaMalloc(bufs[k].p, bufs[k].bytes), bufs[k].what,
                                         __FILE__, __LINE__, errstr, errstr_size) < 0)
            return -1;
    if (CU(cudaHostAlloc((void **)&e->h_tok, tok_n * sizeof(uint32_t),
                         cudaHostAllocPortable)) < 0 ||
        CU(cudaHostAlloc((void **)&e->h_res, res_n * sizeof(float), cudaHostAllocPortable)) < 0)
        return -1;
    const struct cuda_bert_layer *l0 = &w->layers[0];
    struct enc_gemm *g = e->g;
    g[EG_FFN1].fused_gelu = c->gelu_tanh;
    g[EG_FFN1].gelu_kernel = !c->gelu_tanh;
    if (enc_gemm_new(ws, &g[EG_QKV], "QKV projection", CUBLAS_OP_T, CUBLASLT_EPILOGUE_BIAS,
                     l0->qkv_b, errstr, errstr_size) < 0 ||
        enc_gemm_new(ws, &g[EG_AO], "attention output", CUBLAS_OP_T, CUBLASLT_EPILOGUE_BIAS,
                     l0->ao_b, errstr, errstr_size) < 0 ||
        enc_gemm_new(ws, &g[EG_FFN1], "feed-forward in", CUBLAS_OP_T,
                     c->gelu_tanh ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS,
                     l0->i_b, errstr, errstr_size) < 0 ||
        enc_gemm_new(ws, &g[EG_FFN2], "feed-forward out", CUBLAS_OP_T, CUBLASLT_EPILOGUE_BIAS,
                     l0->o_b, errstr, errstr_size) < 0 ||
        enc_gemm_new(ws, &g[EG_QK], "attention scores", CUBLAS_OP_T, CUBLASLT_EPILOGUE_DEFAULT,
                     NULL, errstr, errstr_size) < 0 ||
        enc_gemm_new(ws, &g[EG_PV], "attention context", CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT,
                     NULL, errstr, errstr_size) < 0)
        return -1;
    if (cls && (enc_gemm_new(ws, &g[EG_POOL], "pooler", CUBLAS_OP_T, CUBLASLT_EPILOGUE_BIAS,
                             w->pool_b, errstr, errstr_size) < 0 ||
                enc_gemm_new(ws, &g[EG_CLS], "classifier", CUBLAS_OP_T, CUBLASLT_EPILOGUE_BIAS,
                             w->cls_b, errstr, errstr_size) < 0))
        return -1;
    if (enc_shapes(ws, 1, L, Lp, errstr, errstr_size) < 0) return -1;
    if (!be->graphs) return 0;
    /* With graphs on, one is captured here, for one sequence of the
     * longest length, so a batch's work that cannot be captured fails
     * at start-up (set gpu.graphs = false then), not at a later batch. */
    size_t slot;
    int evict;
    plan_shape_use(&e->shapes, (struct plan_shape){1, L, Lp}, &slot, &evict);
    if (enc_capture(ws, slot, 1, L, Lp, errstr, errstr_size) < 0) return -1;
    e->shapes.slot[slot].seen = 2;
    e->shapes.slot[slot].graph = 1;
    return 0;
}

/* The head, from the final hidden states x: the classifier's scores,
 * every token's vector, or one pooled vector per sequence, L2-normalized
 * when asked. *res is the float32 result on the device, *count its
 * floats. */
static int enc_head(struct cuda_ws *ws, size_t n, size_t T, const uint32_t *offs,
                    const float **res, size_t *count, char *errstr, size_t errstr_size)
{
    const struct cuda_bert_cfg *c = &ws->m->enc;
    const struct cuda_bert *w = ws->dm->bert;
    struct cuda_enc_ws *e = ws->enc;
    enum kc_type kt = kc_type_of(ws->be->prec);
    cudaStream_t s = ws->stream;
    size_t H = c->hidden;
    if (c->head == MODEL_HEAD_CLASSIFIER) {
        /* BertForSequenceClassification: tanh(pooler([CLS])), the
         * classifier, then softmax or sigmoid over the logits in float32. */
        size_t nl = c->n_labels;
        void *logits = kt == KC_F32 ? (void *)e->res : e->logits;
        if (CU(kc_pool(s, kt, e->x, offs, n, H, KC_POOL_CLS, e->cls, 0)) < 0 ||
            eg_run(ws, &e->g[EG_POOL], 1.0f, w->pool_w, e->cls, e->pooled, w->pool_b, errstr,
                   errstr_size) < 0 ||
            CU(kc_bias_act(s, kt, e->pooled, NULL, n, H, KC_TANH)) < 0 ||
            eg_run(ws, &e->g[EG_CLS], 1.0f, w->cls_w, e->pooled, logits, w->cls_b, errstr,
                   errstr_size) < 0 ||
            (kt != KC_F32 && CU(kc_to_f32(s, kt, logits, e->res, n * nl)) < 0) ||
            (c->sigmoid ? CU(kc_bias_act(s, KC_F32, e->res, NULL, n, nl, KC_SIGMOID))
                        : CU(kc_softmax(s, KC_F32, e->res, n, nl))) < 0)
            return -1;
        *res = e->res;
        *count = n * nl;
        return 0;
    }
    if (c->pooling == MODEL_POOL_NONE) {
        float *all = kt == KC_F32 ? (float *)e->x : e->res;
        if ((kt != KC_F32 && CU(kc_to_f32(s, kt, e->x, all, T * H)) < 0) ||
            (c->normalize && CU(kc_l2norm(s, KC_F32, all, T, H)) < 0))
            return -1;
        *res = all;
        *count = T * H;
        return 0;
    }
    enum kc_pool mode = c->pooling == MODEL_POOL_MEAN  ? KC_POOL_MEAN
                        : c->pooling == MODEL_POOL_MAX ? KC_POOL_MAX
                                                       : KC_POOL_CLS;
    if (CU(kc_pool(s, kt, e->x, offs, n, H, mode, e->res, 1)) < 0 ||
        (c->normalize && CU(kc_l2norm(s, KC_F32, e->res, n, H)) < 0))
        return -1;
    *res = e->res;
    *count = n * H;
    return 0;
}

/* Issues a batch's work on the stream (its tokens packed in h_tok, its
 * shapes set by enc_shapes): n sequences, T tokens, attention padded to
 * L. Returns 0, or -1 with errstr. */
static int enc_enqueue(struct cuda_ws *ws, size_t n, size_t T, size_t L, char *errstr,
                       size_t errstr_size)
{
    const struct cuda_bert_cfg *c = &ws->m->enc;
    const struct cuda_bert *w = ws->dm->bert;
    struct cuda_enc_ws *e = ws->enc;
    const struct enc_gemm *g = e->g;
    enum kc_type kt = kc_type_of(ws->be->prec);
    cudaStream_t s = ws->stream;
    size_t H = c->hidden, nh = c->heads, dh = H / nh;
    const uint32_t *ids = e->d_tok, *types = ids + T, *seq = types + T, *offs = seq + T;
    float scale = 1.0f / sqrtf((float)dh);
    if (CU(cudaMemcpyAsync(e->d_tok, e->h_tok, (3 * T + n + 1) * sizeof(uint32_t),
                           cudaMemcpyHostToDevice, s)) < 0 ||
        CU(kc_embed(s, kt, e->x, w->word, w->pos, w->type, w->emb_ln_w, w->emb_ln_b, c->eps, ids,
                    types, seq, offs, T, H)) < 0)
        return -1;
    for (size_t l = 0; l < c->n_layers; l++) {
        const struct cuda_bert_layer *lw = &w->layers[l];
        /* Attention; the padded context lands in q's buffer (q is spent
         * once the scores are), the output projection in qkv's. */
        if (eg_run(ws, &g[EG_QKV], 1.0f, lw->qkv_w, e->x, e->qkv, lw->qkv_b, errstr,
                   errstr_size) < 0 ||
            CU(kc_attn_gather(s, kt, e->qkv, offs, n, nh, L, dh, e->q, e->k, e->v)) < 0 ||
            eg_run(ws, &g[EG_QK], scale, e->k, e->q, e->scores, NULL, errstr, errstr_size) < 0 ||
            CU(kc_attn_softmax(s, kt, e->scores, offs, n, nh, L)) < 0 ||
            eg_run(ws, &g[EG_PV], 1.0f, e->v, e->scores, e->q, NULL, errstr, errstr_size) < 0 ||
            CU(kc_attn_scatter(s, kt, e->q, seq, offs, T, nh, L, dh, e->ctx)) < 0 ||
            eg_run(ws, &g[EG_AO], 1.0f, lw->ao_w, e->ctx, e->qkv, lw->ao_b, errstr,
                   errstr_size) < 0 ||
            CU(kc_add_layernorm(s, kt, e->x, e->qkv, lw->ln1_w, lw->ln1_b, c->eps, T, H)) < 0)
            return -1;
        /* The feed-forward; its output lands in ctx's buffer. */
        if (eg_run(ws, &g[EG_FFN1], 1.0f, lw->i_w, e->x, e->inter, lw->i_b, errstr,
                   errstr_size) < 0 ||
            (g[EG_FFN1].gelu_kernel &&
             CU(kc_bias_act(s, kt, e->inter, NULL, T, c->inter,
                            c->gelu_tanh ? KC_GELU_TANH : KC_GELU)) < 0) ||
            eg_run(ws, &g[EG_FFN2], 1.0f, lw->o_w, e->inter, e->ctx, lw->o_b, errstr,
                   errstr_size) < 0 ||
            CU(kc_add_layernorm(s, kt, e->x, e->ctx, lw->ln2_w, lw->ln2_b, c->eps, T, H)) < 0)
            return -1;
    }
    const float *res;
    size_t count;
    if (enc_head(ws, n, T, offs, &res, &count, errstr, errstr_size) < 0) return -1;
    return CU(cudaMemcpyAsync(e->h_res, res, count * sizeof(float), cudaMemcpyDeviceToHost, s));
}

/* Captures a batch's work (its shapes already set) into e->graph[slot].
 * The memcpy of the tokens is part of the graph: it reads the pinned
 * buffer when the graph is launched. */
static int enc_capture(struct cuda_ws *ws, size_t slot, size_t n, size_t T, size_t L,
                       char *errstr, size_t errstr_size)
{
    struct cuda_enc_ws *e = ws->enc;
    cudaGraph_t g = NULL;
    if (CU(cudaStreamBeginCapture(ws->stream, cudaStreamCaptureModeThreadLocal)) < 0) return -1;
    int rc = enc_enqueue(ws, n, T, L, errstr, errstr_size);
    /* End the capture whatever happened, so the stream is usable again. */
    cudaError_t end = cudaStreamEndCapture(ws->stream, &g);
    if (rc == 0 && end != cudaSuccess)
        rc = cuda_fail(end, "cudaStreamEndCapture", __FILE__, __LINE__, errstr, errstr_size);
    if (rc == 0) rc = CU(cudaGraphInstantiate(&e->graph[slot], g, 0));
    if (g) cudaGraphDestroy(g);
    return rc;
}

/* ---- both kinds ------------------------------------------------------------------ */

/* Everything one executor needs, on the device its slot maps to: stream,
 * cuBLASLt handle and workspace, pinned host buffers and device buffers
 * for max_rows rows (an encoder's: max_rows sequences of max_tokens tokens
 * in all), GEMM descriptors and, for a layer model with graphs on, one
 * captured graph per bucket. Nothing is allocated per batch after this. */
static void *cuda_ws_new(void *bep, void *bmp, const struct backend_plan *p, unsigned slot,
                         size_t max_rows, size_t max_tokens, char *errstr,
                         size_t errstr_size)
{
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
    char err[512], size[96];
    int rc;
    if (m->is_encoder) {
        snprintf(size, sizeof(size), "%zu sequences and %zu tokens", max_rows, max_tokens);
        rc = ws_build_enc(ws, max_tokens, err, sizeof(err));
    } else {
        snprintf(size, sizeof(size), "%zu rows", max_rows);
        ws->n_buckets = plan_buckets(max_rows, be->n_buckets_cfg ? be->buckets_cfg : NULL,
                                     be->n_buckets_cfg, ws->buckets, PLAN_MAX_BUCKETS);
        rc = ws_build(ws, err, sizeof(err));
    }
    if (rc < 0) {
        snprintf(errstr, errstr_size, "model %s: executor %u on device %d (%s), workspace of "
                 "%s: %s", p->name, slot, ws->dev->index, ws->dev->name, size, err);
        cuda_ws_free(ws);
        return NULL;
    }
    return ws;
}

static float *cuda_ws_input(void *wsp)
{
    return ((struct cuda_ws *)wsp)->h_in;
}

/* Starts a batch's work on ws's stream: the device made current, the
 * injected fault when armed (a kernel writing to an illegal address, so
 * the batch fails as on a dead device), the start event. */
static int batch_begin(struct cuda_ws *ws, char *errstr, size_t errstr_size)
{
    if (CU(cudaSetDevice(ws->dev->index)) < 0) return -1;
    if (ws->fault) {
        ws->fault = 0;
        if (CU(kc_fault(ws->stream)) < 0) return -1;
    }
    return CU(cudaEventRecord(ws->ev_start, ws->stream));
}

/* Ends it: the stop event, the wait, and the device's busy time (the
 * events' interval) and batch count. */
static int batch_end(struct cuda_ws *ws, char *errstr, size_t errstr_size)
{
    float ms = 0;
    if (CU(cudaEventRecord(ws->ev_stop, ws->stream)) < 0 ||
        CU(cudaStreamSynchronize(ws->stream)) < 0 ||
        CU(cudaEventElapsedTime(&ms, ws->ev_start, ws->ev_stop)) < 0)
        return -1;
    atomic_fetch_add(&ws->dev->busy_ns, (uint_fast64_t)((double)ms * 1e6));
    atomic_fetch_add(&ws->dev->batches, 1);
    return 0;
}

/* Packs (when in is not the pinned buffer) and zero-pads the input to the
 * batch's bucket, runs the bucket's graph (or its calls one by one), and
 * waits. Any failure is fatal. */
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
    if (batch_begin(ws, errstr, errstr_size) < 0) return MODEL_EFATAL;
    int rc = ws->be->graphs ? CU(cudaGraphLaunch(ws->graph[bi], ws->stream))
                            : enqueue(ws, bi, errstr, errstr_size);
    if (rc < 0 || batch_end(ws, errstr, errstr_size) < 0) return MODEL_EFATAL;
    *out = ws->h_out;
    return MODEL_OK;
}

/* Packs the batch's tokens into the pinned buffer (ids, type ids, each
 * token's sequence, offsets: one upload), sets the GEMMs' shapes (host
 * work, before the start event so it is not counted as the device's),
 * runs the encoder and waits. Any failure is fatal. */
static int cuda_encode(void *wsp, const struct model_seqs *s, const float **out, char *errstr,
                       size_t errstr_size)
{
    struct cuda_ws *ws = wsp;
    struct cuda_enc_ws *e = ws->enc;
    size_t n = s->n, T = n ? s->offsets[n] : 0, L = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = s->offsets[i + 1] - s->offsets[i];
        if (len > L) L = len;
    }
    /* gpu/model.c checked all this; the buffers are sized by it. */
    size_t Lp = (L + ENC_ALIGN - 1) / ENC_ALIGN * ENC_ALIGN;
    if (!e || n == 0 || n > ws->max_rows || L == 0 || L > e->max_len || n * L > e->max_tokens ||
        n * Lp > e->max_padded) {
        snprintf(errstr, errstr_size, "%zu sequences, the longest of %zu tokens, do not fit the "
                 "workspace's %zu sequences and %zu tokens", n, L, ws->max_rows,
                 e ? e->max_tokens : 0);
        return MODEL_EINVAL;
    }
    uint32_t *ids = e->h_tok, *types = ids + T, *seq = types + T;
    memcpy(ids, s->ids, T * sizeof(uint32_t));
    if (s->type_ids) memcpy(types, s->type_ids, T * sizeof(uint32_t));
    else memset(types, 0, T * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        for (size_t t = s->offsets[i]; t < s->offsets[i + 1]; t++) seq[t] = (uint32_t)i;
    memcpy(seq + T, s->offsets, (n + 1) * sizeof(uint32_t));
    /* With graphs, a shape that came back replays (or is captured now):
     * the shapes and capture are host work before the start event. */
    size_t slot = 0;
    int evict = 0;
    enum plan_shape_action act = PLAN_SHAPE_EAGER;
    if (ws->be->graphs) act = plan_shape_use(&e->shapes, (struct plan_shape){n, T, Lp}, &slot, &evict);
    if (CU(cudaSetDevice(ws->dev->index)) < 0) return MODEL_EFATAL;
    if (evict && e->graph[slot]) {
        if (CU(cudaGraphExecDestroy(e->graph[slot])) < 0) return MODEL_EFATAL;
        e->graph[slot] = NULL;
    }
    if (act != PLAN_SHAPE_GRAPH && enc_shapes(ws, n, T, Lp, errstr, errstr_size) < 0)
        return MODEL_EFATAL;
    if (act == PLAN_SHAPE_CAPTURE) {
        if (enc_capture(ws, slot, n, T, Lp, errstr, errstr_size) < 0) return MODEL_EFATAL;
        e->shapes.slot[slot].graph = 1;
        act = PLAN_SHAPE_GRAPH;
    }
    int rc = batch_begin(ws, errstr, errstr_size);
    if (rc == 0)
        rc = act == PLAN_SHAPE_GRAPH ? CU(cudaGraphLaunch(e->graph[slot], ws->stream))
                                     : enc_enqueue(ws, n, T, Lp, errstr, errstr_size);
    if (rc < 0 || batch_end(ws, errstr, errstr_size) < 0) return MODEL_EFATAL;
    *out = e->h_res;
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
    .encoder_pads = 0, /* attention alone pads; the GEMMs and LayerNorms pack */
    .probe = cuda_probe,
    .open = cuda_open,
    .close = cuda_close,
    .model_new = cuda_model_new,
    .model_free = cuda_model_free,
    .ws_new = cuda_ws_new,
    .ws_free = cuda_ws_free,
    .ws_input = cuda_ws_input,
    .forward = cuda_forward,
    .encode = cuda_encode,
    .inject_fault = cuda_inject_fault,
    .executors = cuda_executors,
    .precision = cuda_precision,
    .devices = cuda_devices,
    .device_stats = cuda_device_stats,
};

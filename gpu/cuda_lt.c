/* cuda_lt.c - the CUDA backend's GEMM primitive on cuBLASLt, and the
 * library's loader. cuBLASLt is opened with dlopen when the backend opens,
 * so a CPU-only run never loads it.
 *
 * Row-major C [m,n] = A [m,k] op(B) maps to cuBLASLt's column-major view
 * as C^T (n x m, ld ldc) = op(B)^T A^T: cuBLASLt's A is our B (a weight
 * [n,k] as nn.Linear keeps it, or activations [n,k] with trans_b: both
 * read as a k x n matrix, TRANSA = T; activations [k,n] otherwise: n x k,
 * TRANSA = N), its B is our A (k x m, ld lda), its C is ours (n x m).
 * Float32 scale and accumulation (TF32 inputs with gpu.precision tf32);
 * A, B, C and the bias in the activation type (cuBLASLt's bias has C's
 * type). The bias, and a ReLU or the tanh GELU after it, run in the
 * epilogue; other activations (and those two where no algorithm fuses
 * them for a shape) as kc_bias_act after the GEMM.
 *
 * Each context caches LT_PLANS GEMM set-ups (descriptor, layouts and the
 * heuristic's algorithm) keyed by everything the heuristic looks at: the
 * sizes, leading dimensions, batch and strides, transposition, bias,
 * activation, type, and each pointer's alignment (cuBLASLt assumes 256
 * bytes unless told). The heuristic is asked once per key; the least
 * recently used plan gives its slot up. A key with no algorithm is cached
 * too: its GEMMs run on the backend's own kernel (kc_gemm, float32
 * accumulation, the bias and activation fused), since cuBLASLt may have
 * nothing for a shape with a size of 1 (the one-row bucket, a one-label
 * head) or an odd alignment.
 *
 * Threads: lt_load at open (main thread); cuda_gemm on the context's
 * executor thread. */
#include "cuda_internal.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int lt_check(const struct lt_api *cl, cublasStatus_t st, const char *call, const char *file,
             int line, char *errstr, size_t errstr_size)
{
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    if (errstr && errstr_size)
        snprintf(errstr, errstr_size, "%s:%d: %s: %s: %s", file, line, call,
                 cl->GetStatusName(st), cl->GetStatusString(st));
    return -1;
}

/* A cuBLASLt refusal of its arguments (or of a capture) fails the pass
 * only; anything else (an execution failure) is taken as the device's,
 * unless the stream is capturing, where nothing ran. */
int cx_lt(struct cuda_ctx *c, cublasStatus_t st, const char *call, const char *file, int line)
{
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    const struct lt_api *cl = &c->be->cl;
    int rc = st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
                     st == CUBLAS_STATUS_ARCH_MISMATCH || st == CUBLAS_STATUS_ALLOC_FAILED ||
                     c->capturing
                 ? MODEL_EINVAL
                 : MODEL_EFATAL;
    char msg[512];
    snprintf(msg, sizeof(msg), "%s:%d: %s: %s: %s", file, line, call, cl->GetStatusName(st),
             cl->GetStatusString(st));
    return cx_record(c, rc, msg);
}

int lt_load(struct lt_api *cl, char *errstr, size_t errstr_size)
{
    char name[64];
    snprintf(name, sizeof(name), "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    if (!(cl->so = dlopen(LT_SO_NAME(name), RTLD_NOW | RTLD_LOCAL))) {
        snprintf(errstr, errstr_size, "cannot load %s: %s", name, dlerror());
        return -1;
    }
#define LT_SYM(fn)                                                                       \
    if (!(*(void **)&cl->fn = dlsym(cl->so, "cublasLt" #fn))) {                           \
        snprintf(errstr, errstr_size, "%s has no cublasLt" #fn, name);                    \
        lt_unload(cl);                                                                   \
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

void lt_unload(struct lt_api *cl)
{
    if (cl->so) dlclose(cl->so);
    memset(cl, 0, sizeof(*cl));
}

/* ---- plans ---------------------------------------------------------------- */

static void plan_release(const struct lt_api *cl, struct lt_plan *p)
{
    if (p->desc) cl->MatmulDescDestroy(p->desc);
    for (int i = 0; i < 3; i++)
        if (p->lay[i]) cl->MatrixLayoutDestroy(p->lay[i]);
    memset(p, 0, sizeof(*p));
}

void lt_plans_free(struct cuda_ctx *c)
{
    for (size_t i = 0; i < LT_PLANS; i++)
        if (c->plans[i].last) plan_release(&c->be->cl, &c->plans[i]);
}

/* log2 of the alignment of p, at most 256 bytes (what cuBLASLt assumes). */
static uint8_t align_log2(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint8_t k = 0;
    while (k < 8 && !(u & ((uintptr_t)1 << k))) k++;
    return k;
}

/* One layout: rows x cols (column-major), ld, and batch matrices stride
 * apart. Returns 0 or a model_rc. */
static int layout(struct cuda_ctx *c, cublasLtMatrixLayout_t *l, uint64_t rows, uint64_t cols,
                  int64_t ld, int32_t batch, int64_t stride)
{
    const struct lt_api *cl = &c->be->cl;
    int rc = CXLT(c, cl->MatrixLayoutCreate(l, c->be->dt, rows, cols, ld));
    if (rc == 0 && batch > 1)
        rc = CXLT(c, cl->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                  sizeof(batch)));
    if (rc == 0 && batch > 1)
        rc = CXLT(c, cl->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)));
    return rc;
}

/* The heuristic's first algorithm for p with epilogue epi (and bias, for
 * its alignment); *found 0 when it has none. Returns 0 or a model_rc. */
static int plan_query(struct cuda_ctx *c, struct lt_plan *p, cublasLtEpilogue_t epi,
                      const void *bias, int *found)
{
    const struct lt_api *cl = &c->be->cl;
    int rc = CXLT(c, cl->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                sizeof(epi)));
    if (rc == 0 && bias)
        rc = CXLT(c, cl->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
    if (rc < 0) return rc;
    cublasLtMatmulHeuristicResult_t h;
    int n = 0;
    cublasStatus_t st = cl->MatmulAlgoGetHeuristic(c->lt, p->desc, p->lay[0], p->lay[1],
                                                   p->lay[2], p->lay[2], c->pref, 1, &h, &n);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED &&
        (rc = cx_lt(c, st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__)) < 0)
        return rc;
    *found = st == CUBLAS_STATUS_SUCCESS && n >= 1 && h.state == CUBLAS_STATUS_SUCCESS;
    if (*found) p->algo = h.algo;
    return 0;
}

/* Sets p up for its key: descriptor, layouts, and the algorithm, with the
 * activation fused when an algorithm allows it. Returns 0 or a model_rc
 * (p->found 0 when cuBLASLt has nothing for it). */
static int plan_build(struct cuda_ctx *c, struct lt_plan *p, const void *bias)
{
    const struct cuda_be *be = c->be;
    const struct lt_api *cl = &be->cl;
    const struct lt_key *k = &p->key;
    cublasComputeType_t ct = be->prec == MODEL_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                    : CUBLAS_COMPUTE_32F;
    cublasOperation_t ta = k->op_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int32_t batch = k->batch;
    int rc;
    if ((rc = CXLT(c, cl->MatmulDescCreate(&p->desc, ct, CUDA_R_32F))) < 0 ||
        (rc = CXLT(c, cl->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                 sizeof(ta)))) < 0 ||
        (rc = CXLT(c, cl->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                 sizeof(tb)))) < 0 ||
        (rc = layout(c, &p->lay[0], k->op_b ? k->k : k->n, k->op_b ? k->n : k->k,
                     (int64_t)k->ldb, batch, k->sb)) < 0 ||
        (rc = layout(c, &p->lay[1], k->k, k->m, (int64_t)k->lda, batch, k->sa)) < 0 ||
        (rc = layout(c, &p->lay[2], k->n, k->m, (int64_t)k->ldc, batch, k->sc)) < 0)
        return rc;
    /* Preferences: the workspace, and the pointers' alignments. */
    uint32_t al[4] = {1u << k->align[1], 1u << k->align[0], 1u << k->align[2], 1u << k->align[2]};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        if ((rc = CXLT(c, cl->MatmulPreferenceSetAttribute(c->pref, which[i], &al[i],
                                                          sizeof(al[i])))) < 0)
            return rc;
    enum bk_act act = (enum bk_act)k->act;
    cublasLtEpilogue_t plain = k->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtEpilogue_t fused = plain;
    if (act == BK_ACT_RELU)
        fused = k->bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (act == BK_ACT_GELU_TANH)
        fused = k->bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    int found = 0;
    p->after = fused != plain ? KC_NONE : cuda_kc_act(act);
    if ((rc = plan_query(c, p, fused, bias, &found)) < 0) return rc;
    if (!found && fused != plain) {
        p->after = cuda_kc_act(act);
        if ((rc = plan_query(c, p, plain, bias, &found)) < 0) return rc;
    }
    p->found = found;
    return 0;
}

/* The plan for key: cached, or built in the least recently used slot.
 * Returns 0 with *out set, or a model_rc. */
static int plan_get(struct cuda_ctx *c, const struct lt_key *key, const void *bias,
                    struct lt_plan **out)
{
    size_t victim = 0;
    c->plan_tick++;
    for (size_t i = 0; i < LT_PLANS; i++) {
        struct lt_plan *p = &c->plans[i];
        if (p->last && memcmp(&p->key, key, sizeof(*key)) == 0) {
            p->last = c->plan_tick;
            *out = p;
            return 0;
        }
        if (p->last < c->plans[victim].last) victim = i;
    }
    struct lt_plan *p = &c->plans[victim];
    plan_release(&c->be->cl, p);
    p->key = *key;
    int rc = plan_build(c, p, bias);
    if (rc < 0) {
        plan_release(&c->be->cl, p);
        return rc;
    }
    p->last = c->plan_tick;
    *out = p;
    return 0;
}

/* ---- the primitive ---------------------------------------------------------- */

int cuda_gemm(void *cp, const struct bk_gemm *g)
{
    struct cuda_ctx *c = cp;
    const struct cuda_be *be = c->be;
    const struct lt_api *cl = &be->cl;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    const void *B = g->w ? g->w->p : g->b;
    int tb = g->w ? 1 : g->trans_b != 0;
    size_t batch = g->batch ? g->batch : 1;
    size_t lda = g->lda ? g->lda : g->k, ldb = g->ldb ? g->ldb : tb ? g->k : g->n,
           ldc = g->ldc ? g->ldc : g->n;
    if (!g->a || !B || !g->c || !g->m || !g->n || !g->k || batch > INT32_MAX ||
        (unsigned)g->act >= BK_N_ACTS)
        return cx_refuse(c, "gemm: %zu x %zu x %zu, batch %zu: missing operand or bad size",
                         g->m, g->n, g->k, batch);
    if (lda < g->k || ldb < (tb ? g->k : g->n) || ldc < g->n)
        return cx_refuse(c, "gemm: leading dimensions %zu, %zu, %zu under the rows' %zu, %zu, %zu",
                         lda, ldb, ldc, g->k, tb ? g->k : g->n, g->n);
    if (g->w && (g->w->type != BK_W_ACT || g->w->copy != c->copy || g->w->n < g->n * g->k))
        return cx_refuse(c, "gemm: the weight is not [%zu,%zu] in the activation type on this "
                         "context's device", g->n, g->k);
    if (g->bias && (g->bias->type != BK_W_ACT || g->bias->copy != c->copy || g->bias->n < g->n))
        return cx_refuse(c, "gemm: the bias is not [%zu] in the activation type on this "
                         "context's device", g->n);
    if (g->w && batch > 1) {
        /* A weight shared by a batch: one GEMM of batch x m rows when the
         * batch's matrices follow each other, else one GEMM per matrix
         * (rather than a batch stride of 0, which not every cuBLASLt
         * algorithm takes). */
        struct bk_gemm one = *g;
        one.batch = 1;
        if (g->stride_a == g->m * lda && g->stride_c == g->m * ldc) {
            one.m = g->m * batch;
            return cuda_gemm(c, &one);
        }
        for (size_t i = 0; i < batch; i++) {
            one.a = (const char *)g->a + i * g->stride_a * be->es;
            one.c = (char *)g->c + i * g->stride_c * be->es;
            if ((rc = cuda_gemm(c, &one)) < 0) return rc;
        }
        return 0;
    }
    const void *bias = g->bias ? g->bias->p : NULL;
    struct lt_key key;
    memset(&key, 0, sizeof(key));
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.batch = (int32_t)batch;
    if (batch > 1) {
        key.sa = (int64_t)g->stride_a;
        key.sb = g->w ? 0 : (int64_t)g->stride_b;
        key.sc = (int64_t)g->stride_c;
    }
    key.dt = (int32_t)be->dt;
    key.op_b = (uint8_t)tb;
    key.bias = bias != NULL;
    key.act = (uint8_t)g->act;
    key.align[0] = align_log2(g->a);
    key.align[1] = align_log2(B);
    key.align[2] = align_log2(g->c);
    key.align[3] = bias ? align_log2(bias) : 0;
    struct lt_plan *p;
    if ((rc = plan_get(c, &key, bias, &p)) < 0) return rc;
    const float alpha = g->alpha != 0.0f ? g->alpha : 1.0f, beta = 0.0f;
    if (!p->found) {
        /* No algorithm for the shape (cuBLASLt may have none where a size
         * is 1): the backend's own kernel, bias and activation included. */
        struct kc_gemm_op op = {.m = g->m, .n = g->n, .k = g->k, .batch = batch,
                                .alpha = alpha, .a = g->a, .lda = lda, .sa = (size_t)key.sa,
                                .b = B, .trans_b = tb, .ldb = ldb, .sb = (size_t)key.sb,
                                .bias = bias, .act = cuda_kc_act((enum bk_act)g->act),
                                .c = g->c, .ldc = ldc, .sc = (size_t)key.sc};
        return CX(c, kc_gemm(c->stream, be->kt, &op));
    }
    if (bias && (rc = CXLT(c, cl->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof(bias)))) < 0)
        return rc;
    if ((rc = CXLT(c, cl->Matmul(c->lt, p->desc, &alpha, B, p->lay[0], g->a, p->lay[1], &beta,
                                 g->c, p->lay[2], g->c, p->lay[2], &p->algo, c->lt_ws,
                                 be->lt_ws_bytes, c->stream))) < 0)
        return rc;
    if (p->after == KC_NONE) return 0;
    /* The activation cuBLASLt did not fuse: over the batch's m rows of n
     * (ldc apart), as one launch when the matrices follow each other. */
    if (batch == 1 || g->stride_c == g->m * ldc)
        return CX(c, kc_bias_act(c->stream, be->kt, g->c, ldc, NULL, batch * g->m, g->n,
                                 p->after));
    for (size_t i = 0; i < batch; i++)
        if ((rc = CX(c, kc_bias_act(c->stream, be->kt, (char *)g->c + i * g->stride_c * be->es,
                                    ldc, NULL, g->m, g->n, p->after))) < 0)
            return rc;
    return 0;
}

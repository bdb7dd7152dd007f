/* emu_lt.c - cuBLASLt emulated on the host, for the functions kinfer's
 * CUDA backend looks up (gpu/cuda_lt.c, LT_SYM): cublasLtCreate/Destroy,
 * MatmulDesc{Create,Destroy,SetAttribute}, MatrixLayout{Create,Destroy,
 * SetAttribute}, MatmulPreference{Create,Destroy,SetAttribute},
 * MatmulAlgoGetHeuristic, Matmul, GetStatusName/String and GetVersion.
 * Written from NVIDIA's documentation (the comments of <cublasLt.h> and
 * the cuBLASLt chapter of the cuBLAS guide), with the real header's types.
 *
 * cublasLtMatmul computes D = alpha op(A) op(B) + beta C, then the
 * epilogue (bias added per row of D, then ReLU or the tanh GELU), in
 * column-major storage, for A, B, C and D all R_32F, R_16F or R_16BF, with
 * float32 scale and accumulation; CUBLAS_COMPUTE_32F_FAST_TF32 rounds the
 * inputs to TF32 (10 mantissa bits) first. Memory is host memory (the
 * emulated runtime's device memory is malloc'd).
 *
 * It refuses what the library documents it refuses, with the library's
 * status codes: an attribute of the wrong size or a NULL buffer, a leading
 * dimension under the rows, shapes that do not chain, batch counts that
 * differ (INVALID_VALUE); types, orders, compute types and epilogues it has
 * no kernel for (NOT_SUPPORTED). The heuristic also answers NOT_SUPPORTED
 * (no algorithm) for the shapes emu_lt_refuse names, as the library may
 * for any shape (those with a size of 1 among them); the caller must then
 * do without it. The heuristic's algorithm assumes the
 * alignments its preference allows (256 bytes unless told) and the bias
 * pointer's; a cublasLtMatmul whose pointers break the algorithm's
 * assumptions is answered INVALID_VALUE (a real kernel would read
 * misaligned vectors), as is a descriptor that differs from the one the
 * algorithm was chosen for.
 *
 * Threads: handles and descriptors belong to their caller, as in the
 * library; the matmul counter is atomic. Never part of the normal build. */
#include <cublasLt.h>

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "emu_lt.h"

#define MAGIC_HANDLE 0x4c74484eu
#define MAGIC_DESC   0x4c744465u
#define MAGIC_LAYOUT 0x4c744c61u
#define MAGIC_PREF   0x4c745072u
#define MAGIC_ALGO   0x4c74416cu

struct cublasLtContext {
    uint32_t magic;
};

struct emu_desc {
    uint32_t magic;
    int32_t compute, scale, pmode, transa, transb, transc, fill;
    uint32_t epi;
    const void *bias;
    int32_t bias_type;
    int64_t bias_stride;
};

struct emu_layout {
    uint32_t magic;
    uint32_t type;
    int32_t order;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};

struct emu_pref {
    uint32_t magic;
    uint32_t search, reduction;
    uint64_t ws;
    uint32_t align[4];
    float waves;
    uint64_t impl;
};

/* What cublasLtMatmulAlgo_t's 64 bytes hold: the problem it was chosen
 * for and what it assumes of the pointers. */
struct emu_algo {
    uint32_t magic;
    uint32_t epi;
    uint32_t type;
    int32_t compute;
    uint32_t align[5]; /* A, B, C, D, bias: bytes the algorithm assumes */
};
_Static_assert(sizeof(struct emu_algo) <= sizeof(cublasLtMatmulAlgo_t), "algo fits");

/* One GEMM, every value copied: what runs, now or from a stream. */
struct emu_gemm {
    uint64_t m, n, k;
    const void *a, *b, *c;
    void *d;
    int64_t lda, ldb, ldc, ldd, sa, sb, sc, sd, sbias;
    int32_t batch;
    int ta, tb, tf32;
    uint32_t type, epi;
    float alpha, beta;
    const void *bias;
};

static atomic_ulong n_matmuls;

unsigned long emu_lt_matmuls(void)
{
    return atomic_load(&n_matmuls);
}

/* Which shapes the heuristic has no algorithm for: an enum
 * emu_lt_refusal, or -1 until set (then $KINFER_EMU_LT_REFUSE decides). */
static atomic_int refusal = -1;

void emu_lt_refuse(int which)
{
    atomic_store(&refusal, which);
}

static int refusal_now(void)
{
    int r = atomic_load(&refusal);
    if (r >= 0) return r;
    const char *v = getenv("KINFER_EMU_LT_REFUSE");
    r = !v ? EMU_LT_REFUSE_NONE
        : !strcmp(v, "ones") ? EMU_LT_REFUSE_ONES
        : !strcmp(v, "all")  ? EMU_LT_REFUSE_ALL
                             : EMU_LT_REFUSE_NONE;
    int unset = -1;
    atomic_compare_exchange_strong(&refusal, &unset, r);
    return atomic_load(&refusal);
}

/* The emulated runtime defines this; without it, work runs at once. */
int emu_rt_enqueue(void *stream, void (*fn)(void *arg), const void *arg, size_t arg_size)
    __attribute__((weak));

/* ---- numbers ------------------------------------------------------------- */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(s | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    return bits_f32(s | ((e + 112u) << 23) | (m << 13));
}

/* Round to nearest even, as the device's conversions do. */
static uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f), s = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(s | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u); /* rounds past 65504 */
    if (a < 0x38800000u) {                                  /* subnormal or zero */
        float v = bits_f32(a) * 16777216.0f;                /* in units of 2^-24 */
        return (uint16_t)(s | (uint32_t)nearbyintf(v));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(s | ((r - 0x38000000u) >> 13));
}

static float bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* TF32: float32 with its mantissa rounded to 10 bits (nearest even). */
static float to_tf32(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    return bits_f32(u);
}

static size_t type_size(uint32_t t)
{
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16F || t == CUDA_R_16BF ? 2 : 0;
}

static float load(uint32_t t, const void *p, int64_t i)
{
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16F ? f16_to_f32(h) : bf16_to_f32(h);
}

static void store(uint32_t t, void *p, int64_t i, float v)
{
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = t == CUDA_R_16F ? f32_to_f16(v) : f32_to_bf16(v);
}

/* ---- the computation ------------------------------------------------------ */

/* The inputs of one GEMM widened to float32 (and rounded to TF32 when
 * asked), each row of op(A) and column of op(B) contiguous: a[i*k + l] =
 * op(A)[i][l], b[j*k + l] = op(B)[l][j]. */
static void widen(uint32_t t, const void *p, int64_t ld, int trans, uint64_t rows, uint64_t k,
                  int tf32, float *out)
{
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t l = 0; l < k; l++) {
            int64_t at = trans ? (int64_t)(l + r * ld) : (int64_t)(r + l * ld);
            float x = load(t, p, at);
            out[r * k + l] = tf32 ? to_tf32(x) : x;
        }
}

/* The float32 sum of x[l] * y[l]: eight running sums (the order a
 * device's blocked kernel would also change), added pairwise at the end. */
static float dot(const float *x, const float *y, uint64_t k)
{
    float s[8] = {0};
    uint64_t l = 0;
    for (; l + 8 <= k; l += 8)
        for (int u = 0; u < 8; u++) s[u] += x[l + u] * y[l + u];
    for (int u = 0; l < k; l++, u++) s[u] += x[l] * y[l];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static void gemm_run(void *arg)
{
    const struct emu_gemm *g = arg;
    size_t es = type_size(g->type);
    uint64_t m = g->m, n = g->n, k = g->k;
    float *a = malloc((size_t)((m + n) * k + 1) * sizeof(float));
    for (int32_t b = 0; b < g->batch; b++) {
        const char *A = (const char *)g->a + (size_t)(b * g->sa) * es;
        const char *B = (const char *)g->b + (size_t)(b * g->sb) * es;
        const char *C = g->c ? (const char *)g->c + (size_t)(b * g->sc) * es : NULL;
        char *D = (char *)g->d + (size_t)(b * g->sd) * es;
        const char *bias = g->bias ? (const char *)g->bias + (size_t)(b * g->sbias) * es : NULL;
        if (a) {
            widen(g->type, A, g->lda, g->ta, m, k, g->tf32, a);
            widen(g->type, B, g->ldb, !g->tb, n, k, g->tf32, a + m * k);
        }
        for (uint64_t j = 0; j < g->n; j++)
            for (uint64_t i = 0; i < g->m; i++) {
                float acc = 0.0f;
                if (a) {
                    acc = dot(a + i * k, a + (m + j) * k, k);
                } else {
                    /* No memory for the widened copies: element by element. */
                    for (uint64_t l = 0; l < g->k; l++) {
                        int64_t ia = g->ta ? (int64_t)(l + i * g->lda) : (int64_t)(i + l * g->lda);
                        int64_t ib = g->tb ? (int64_t)(j + l * g->ldb) : (int64_t)(l + j * g->ldb);
                        float x = load(g->type, A, ia), y = load(g->type, B, ib);
                        if (g->tf32) {
                            x = to_tf32(x);
                            y = to_tf32(y);
                        }
                        acc = fmaf(x, y, acc);
                    }
                }
                float v = g->alpha * acc;
                if (g->beta != 0.0f) v += g->beta * load(g->type, C, (int64_t)(i + j * g->ldc));
                if (g->epi & CUBLASLT_EPILOGUE_BIAS) v += load(g->type, bias, (int64_t)i);
                if ((g->epi & CUBLASLT_EPILOGUE_RELU) && !(v > 0.0f)) v = 0.0f;
                if (g->epi & CUBLASLT_EPILOGUE_GELU)
                    v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
                store(g->type, D, (int64_t)(i + j * g->ldd), v);
            }
    }
    free(a);
}

/* ---- handles and descriptors ---------------------------------------------- */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasLtContext *h = calloc(1, sizeof(*h));
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = MAGIC_HANDLE;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!lightHandle || lightHandle->magic != MAGIC_HANDLE) return CUBLAS_STATUS_NOT_INITIALIZED;
    lightHandle->magic = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown error";
}

size_t cublasLtGetVersion(void)
{
    return CUBLAS_VERSION;
}

/* The attribute setters' common rule (documented for all three): a NULL
 * buffer, or a size other than the attribute's, is INVALID_VALUE. */
static cublasStatus_t set(void *field, size_t field_size, const void *buf, size_t size)
{
    if (!buf || size != field_size) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

static struct emu_desc *desc_of(cublasLtMatmulDesc_t d)
{
    struct emu_desc *e = (struct emu_desc *)(void *)d;
    return e && e->magic == MAGIC_DESC ? e : NULL;
}

static struct emu_layout *layout_of(cublasLtMatrixLayout_t l)
{
    struct emu_layout *e = (struct emu_layout *)(void *)l;
    return e && e->magic == MAGIC_LAYOUT ? e : NULL;
}

static struct emu_pref *pref_of(cublasLtMatmulPreference_t p)
{
    struct emu_pref *e = (struct emu_pref *)(void *)p;
    return e && e->magic == MAGIC_PREF ? e : NULL;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    struct emu_desc *d = calloc(1, sizeof(*d));
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    d->magic = MAGIC_DESC;
    d->compute = (int32_t)computeType;
    d->scale = (int32_t)scaleType;
    d->pmode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->fill = CUBLAS_FILL_MODE_FULL;
    d->epi = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = -1;
    *matmulDesc = (cublasLtMatmulDesc_t)(void *)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    struct emu_desc *d = desc_of(matmulDesc);
    if (!d) return matmulDesc ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
    d->magic = 0;
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    struct emu_desc *d = desc_of(matmulDesc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set(&d->compute, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set(&d->scale, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set(&d->pmode, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(&d->transa, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(&d->transb, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSC: return set(&d->transc, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_FILL_MODE: return set(&d->fill, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(&d->epi, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(&d->bias, sizeof(void *), buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return set(&d->bias_stride, 8, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(&d->bias_type, 4, buf, sizeInBytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED; /* not emulated */
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    struct emu_layout *l = calloc(1, sizeof(*l));
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    l->magic = MAGIC_LAYOUT;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    l->batch = 1;
    *matLayout = (cublasLtMatrixLayout_t)(void *)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    struct emu_layout *l = layout_of(matLayout);
    if (!l) return matLayout ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
    l->magic = 0;
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    struct emu_layout *l = layout_of(matLayout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set(&l->type, 4, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set(&l->order, 4, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set(&l->rows, 8, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set(&l->cols, 8, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_LD: return set(&l->ld, 8, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set(&l->batch, 4, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set(&l->stride, 8, buf, sizeInBytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED; /* not emulated */
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    struct emu_pref *p = calloc(1, sizeof(*p));
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = MAGIC_PREF;
    p->reduction = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (int i = 0; i < 4; i++) p->align[i] = 256;
    p->impl = UINT64_MAX;
    *pref = (cublasLtMatmulPreference_t)(void *)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    struct emu_pref *p = pref_of(pref);
    if (!p) return pref ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    struct emu_pref *p = pref_of(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return set(&p->search, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(&p->ws, 8, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return set(&p->reduction, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set(&p->align[0], 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set(&p->align[1], 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set(&p->align[2], 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set(&p->align[3], 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return set(&p->waves, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: return set(&p->impl, 8, buf, sizeInBytes);
    default: return CUBLAS_STATUS_NOT_SUPPORTED; /* not emulated */
    }
}

/* ---- the problem ------------------------------------------------------------ */

/* The shapes of a call, once checked. */
struct problem {
    uint64_t m, n, k;
    int ta, tb, tf32;
    uint32_t type, epi;
};

static int op_t(int32_t op)
{
    return op == CUBLAS_OP_T || op == CUBLAS_OP_C; /* C is T for real types */
}

static int epi_supported(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_RELU ||
           e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS;
}

/* What both the heuristic and cublasLtMatmul check of the descriptors. */
static cublasStatus_t problem_check(const struct emu_desc *d, struct emu_layout *const l[4],
                                    struct problem *p)
{
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 4; i++)
        if (!l[i]) return CUBLAS_STATUS_INVALID_VALUE;
    uint32_t t = l[3]->type;
    if (!type_size(t)) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < 4; i++) {
        if (l[i]->type != t || l[i]->order != CUBLASLT_ORDER_COL) return CUBLAS_STATUS_NOT_SUPPORTED;
        /* "greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS" (ORDER_COL) */
        if (l[i]->ld < 1 || (uint64_t)l[i]->ld < l[i]->rows) return CUBLAS_STATUS_INVALID_VALUE;
        if (l[i]->rows > INT32_MAX || l[i]->cols > INT32_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (l[i]->batch < 1 || l[i]->batch != l[3]->batch || l[i]->stride < 0)
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (d->scale != CUDA_R_32F || d->pmode != CUBLASLT_POINTER_MODE_HOST ||
        d->transc != CUBLAS_OP_N || d->fill != CUBLAS_FILL_MODE_FULL)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
        if (t != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else if (d->compute != CUBLAS_COMPUTE_32F) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!epi_supported(d->epi)) return CUBLAS_STATUS_NOT_SUPPORTED;
    /* The bias has D's type (bias data type -1 means just that). */
    if ((d->epi & CUBLASLT_EPILOGUE_BIAS) && d->bias_type != -1 && (uint32_t)d->bias_type != t)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p->ta = op_t(d->transa);
    p->tb = op_t(d->transb);
    if ((d->transa != CUBLAS_OP_N && !p->ta) || (d->transb != CUBLAS_OP_N && !p->tb))
        return CUBLAS_STATUS_INVALID_VALUE;
    p->m = l[3]->rows;
    p->n = l[3]->cols;
    p->k = p->ta ? l[0]->rows : l[0]->cols;
    uint64_t am = p->ta ? l[0]->cols : l[0]->rows;
    uint64_t bk = p->tb ? l[1]->cols : l[1]->rows, bn = p->tb ? l[1]->rows : l[1]->cols;
    if (am != p->m || bk != p->k || bn != p->n || l[2]->rows != p->m || l[2]->cols != p->n)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* Matrices of a batch that overlap in D would race on a device. */
    if (l[3]->batch > 1 && (uint64_t)l[3]->stride < (uint64_t)l[3]->ld * (p->n - 1) + p->m)
        return CUBLAS_STATUS_INVALID_VALUE;
    p->type = t;
    p->epi = d->epi;
    p->tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    return CUBLAS_STATUS_SUCCESS;
}

/* The largest power of two up to 256 that divides p (256 for NULL). */
static uint32_t align_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 1;
    while (a < 256 && !(u & a)) a <<= 1;
    return u ? a : 256;
}

static int pow2(uint32_t a)
{
    return a && !(a & (a - 1));
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                              cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference,
                                              int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount)
{
    if (!lightHandle || lightHandle->magic != MAGIC_HANDLE) return CUBLAS_STATUS_NOT_INITIALIZED;
    const struct emu_pref *pf = pref_of(preference);
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount || !pf)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    const struct emu_desc *d = desc_of(operationDesc);
    struct emu_layout *const l[4] = {layout_of(Adesc), layout_of(Bdesc), layout_of(Cdesc),
                                     layout_of(Ddesc)};
    struct problem p;
    cublasStatus_t st = problem_check(d, l, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    /* An algorithm needs at least element alignment of every matrix. */
    size_t es = type_size(p.type);
    for (int i = 0; i < 4; i++)
        if (!pow2(pf->align[i]) || pf->align[i] < es) return CUBLAS_STATUS_NOT_SUPPORTED;
    struct emu_algo a;
    memset(&a, 0, sizeof(a));
    a.magic = MAGIC_ALGO;
    a.epi = p.epi;
    a.type = p.type;
    a.compute = d->compute;
    for (int i = 0; i < 4; i++) a.align[i] = pf->align[i] > 256 ? 256 : pf->align[i];
    a.align[4] = (p.epi & CUBLASLT_EPILOGUE_BIAS) ? align_of(d->bias) : (uint32_t)es;
    if (a.align[4] < es) return CUBLAS_STATUS_NOT_SUPPORTED;
    /* No algorithm, as the library answers when it has none: the test
     * hook's shapes. */
    int refuse = refusal_now();
    if (refuse == EMU_LT_REFUSE_ALL ||
        (refuse == EMU_LT_REFUSE_ONES && (p.m == 1 || p.n == 1 || p.k == 1)))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof(*r));
    memcpy(&r->algo, &a, sizeof(a));
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static int aligned(const void *p, uint32_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    if (!lightHandle || lightHandle->magic != MAGIC_HANDLE) return CUBLAS_STATUS_NOT_INITIALIZED;
    const struct emu_desc *d = desc_of(computeDesc);
    struct emu_layout *const l[4] = {layout_of(Adesc), layout_of(Bdesc), layout_of(Cdesc),
                                     layout_of(Ddesc)};
    struct problem p;
    cublasStatus_t st = problem_check(d, l, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (!alpha || !beta || (p.m && p.n && (!D || (p.k && (!A || !B)))))
        return CUBLAS_STATUS_INVALID_VALUE;
    float fa, fb;
    memcpy(&fa, alpha, sizeof(fa));
    memcpy(&fb, beta, sizeof(fb));
    if (fb != 0.0f && !C) return CUBLAS_STATUS_INVALID_VALUE;
    if ((p.epi & CUBLASLT_EPILOGUE_BIAS) && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
    if (workspaceSizeInBytes && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
    /* In place (C == D) only over the same layout. */
    if (C == D && (l[2]->ld != l[3]->ld || l[2]->stride != l[3]->stride))
        return CUBLAS_STATUS_INVALID_VALUE;
    const void *ptr[5] = {A, B, C, D, d->bias};
    size_t es = type_size(p.type);
    for (int i = 0; i < 5; i++)
        if (ptr[i] && !aligned(ptr[i], (uint32_t)es)) return CUBLAS_STATUS_INVALID_VALUE;
    if (algo) {
        struct emu_algo a;
        memcpy(&a, algo, sizeof(a));
        if (a.magic != MAGIC_ALGO || a.epi != p.epi || a.type != p.type || a.compute != d->compute)
            return CUBLAS_STATUS_INVALID_VALUE;
        for (int i = 0; i < 5; i++)
            if (ptr[i] && (i < 4 || (p.epi & CUBLASLT_EPILOGUE_BIAS)) && !aligned(ptr[i], a.align[i]))
                return CUBLAS_STATUS_INVALID_VALUE;
    }
    struct emu_gemm g = {
        .m = p.m, .n = p.n, .k = p.k, .a = A, .b = B, .c = fb != 0.0f ? C : NULL, .d = D,
        .lda = l[0]->ld, .ldb = l[1]->ld, .ldc = l[2]->ld, .ldd = l[3]->ld,
        .sa = l[0]->stride, .sb = l[1]->stride, .sc = l[2]->stride, .sd = l[3]->stride,
        .sbias = d->bias_stride, .batch = l[3]->batch, .ta = p.ta, .tb = p.tb, .tf32 = p.tf32,
        .type = p.type, .epi = p.epi, .alpha = fa, .beta = fb,
        .bias = (p.epi & CUBLASLT_EPILOGUE_BIAS) ? d->bias : NULL,
    };
    atomic_fetch_add(&n_matmuls, 1);
    if (!p.m || !p.n) return CUBLAS_STATUS_SUCCESS;
    if (emu_rt_enqueue) {
        if (emu_rt_enqueue((void *)stream, gemm_run, &g, sizeof(g)) != 0)
            return CUBLAS_STATUS_EXECUTION_FAILED;
        return CUBLAS_STATUS_SUCCESS;
    }
    gemm_run(&g);
    return CUBLAS_STATUS_SUCCESS;
}

/* backend_cpu.c - the CPU backend of backend.h: its primitives in float32
 * on host memory, OpenBLAS for the GEMMs of many rows (one cblas_sgemm
 * per matrix of a batch), cpu_mm.h's products for those of few rows
 * against a weight (decoding), and plain loops for the rest, with
 * PyTorch's semantics. The only file in kinfer that includes OpenBLAS.
 *
 * Weights: GEMM matrices and embedding tables (activation-type weights
 * of two dimensions) that the file holds in BF16 or F16 stay in 16 bits
 * and are widened where they are read: in registers by cpu_mm, a block
 * of rows at a time into the context's buffer before a BLAS GEMM, a row
 * at a time by embed. Everything else is float32.
 *
 * "Device" memory is host memory here, so uploads are copies, a context is
 * a list of the buffers it handed out, and nothing is asynchronous: every
 * primitive has finished when it returns. There is one weight copy, shared
 * by every executor (never written after weight_new).
 *
 * Threads: open/close/weight_new/weight_free on the main thread;
 * OpenBLAS's thread count is process-wide (the last open sets it). A
 * context and its primitives belong to one executor thread.
 *
 * Ownership: a weight owns its float32 array; a context owns every buffer
 * ctx_alloc returned and its attention scratch is the caller's. */
#include "backend.h"
#include "backend_cpu_kv.h"
#include "cpu_amx.h"
#include "cpu_mm.h"
#include "cpu_vec.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

/* d (float32) or h (16-bit, kind BF16 or F16): n elements; rows x
 * cols for a 16-bit one, packed for the AMX tiles (cpu_amx.h) when
 * packed is 1 (kind BF16, h of cpu_amx_packed_elems(rows, cols)). */
struct bk_weight {
    float *d;
    uint16_t *h;
    enum cpu_wkind kind;
    size_t n, rows, cols;
    int packed;
};

/* The backend's handle: its number format (worker.cpu_precision). */
struct cpu_be {
    int bf16; /* GEMM weights in bfloat16, their products in bfloat16 */
    int amx;  /* ... on the AMX tiles (bf16 and the CPU has them) */
};

/* GEMMs against a weight with at most this many rows of A go to cpu_mm. */
#define CPU_MM_MAX_M 64
/* 16-bit weight rows widened per BLAS call in a GEMM of more rows. */
#define CPU_CONV_ROWS 256


/* The CPU is always there: one device. */
static int cpu_probe(char *what, size_t what_size)
{
    if (what && what_size) snprintf(what, what_size, "the CPU (OpenBLAS)");
    return 1;
}

/* OpenBLAS's pool is process-wide; 0 keeps its default (all cores or
 * OPENBLAS_NUM_THREADS). There is no per-backend state beyond that, so
 * the handle is a marker. */
static void *cpu_open(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                      char *errstr, size_t errstr_size)
{
    if (c->cpu_precision != MODEL_FP32 && c->cpu_precision != MODEL_BF16) {
        snprintf(errstr, errstr_size, "the CPU backend runs fp32 or bf16, not %s",
                 model_precision_name(c->cpu_precision));
        return NULL;
    }
    struct cpu_be *be = calloc(1, sizeof(*be));
    if (!be) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    be->bf16 = c->cpu_precision == MODEL_BF16;
    be->amx = be->bf16 && cpu_amx_ready();
    if (c->cpu_threads > 0) openblas_set_num_threads(c->cpu_threads);
    int n = openblas_get_num_threads();
    cpu_mm_threads(n);
    snprintf(desc, desc_size, "cpu: OpenBLAS (%s), %d thread%s per pass, %s", openblas_get_config(),
             n, n == 1 ? "" : "s",
             !be->bf16 ? "fp32"
             : be->amx ? "bf16 on AMX tiles"
                       : "bf16 weights widened in registers (no AMX tiles on this CPU)");
    return be;
}

static void cpu_close(void *be)
{
    free(be);
}

/* One executor per online CPU: with one OpenBLAS thread each, that keeps
 * every core busy on compute-bound models. */
static size_t cpu_executors(void *be)
{
    (void)be;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (size_t)n;
}

static const char *cpu_precision(void *be)
{
    return ((struct cpu_be *)be)->bf16 ? "bf16" : "fp32";
}

static size_t cpu_devices(void *be)
{
    (void)be;
    return 0;
}

static int cpu_device_stats(void *be, size_t dev, struct model_device_stats *out)
{
    (void)be;
    (void)dev;
    (void)out;
    return -1;
}

static size_t cpu_one(void *be)
{
    (void)be;
    return 1;
}

static size_t cpu_act_size(void *be)
{
    (void)be;
    return sizeof(float);
}

/* The cache in bfloat16 under worker.cpu_precision "bf16" (as the
 * weights), else float32. */
static size_t cpu_kv_size(void *be)
{
    return ((struct cpu_be *)be)->bf16 ? sizeof(uint16_t) : sizeof(float);
}

/* ---- weights ------------------------------------------------------------- */

/* 1 when every piece of an activation-type weight is a matrix of the
 * file in float32, bfloat16 or float16, all of one width (into *cols)
 * and, with same_dtype, of one dtype. */
static int cpu_wsrc_matrix(enum bk_wtype type, const struct bk_wsrc *src, size_t n,
                           int same_dtype, size_t *cols)
{
    if (type != BK_W_ACT || !n || !src[0].t || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
        return 0;
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = src[i].t;
        if (!t || t->ndim != 2 || t->shape[1] != src[0].t->shape[1] || !t->shape[1] ||
            (same_dtype && t->dtype != src[0].t->dtype) ||
            (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16))
            return 0;
    }
    *cols = (size_t)src[0].t->shape[1];
    return 1;
}

static enum cpu_wkind cpu_kind_of(enum st_dtype dt)
{
    return dt == ST_BF16 ? CPU_W_BF16 : dt == ST_F16 ? CPU_W_F16 : CPU_W_F32;
}

/* The matrices of src in bfloat16 (worker.cpu_precision "bf16"): packed
 * for the AMX tiles when amx, else row-major; a row at a time through
 * an aligned copy (the file's data may be unaligned), float32 and
 * float16 rows rounded to nearest even. */
static struct bk_weight *cpu_weight_bf16(const struct bk_wsrc *src, size_t n, size_t cols,
                                         int amx, char *errstr, size_t errstr_size)
{
    size_t rows = 0;
    for (size_t i = 0; i < n; i++) rows += (size_t)src[i].t->shape[0];
    size_t elems = amx ? cpu_amx_packed_elems(rows, cols) : rows * cols;
    struct bk_weight *w = calloc(1, sizeof(*w));
    float *row = malloc(cols * sizeof(float));
    if (w) w->h = cpu_mm_alloc(elems * sizeof(uint16_t), amx);
    if (!w || !w->h || !row) {
        snprintf(errstr, errstr_size, "out of memory for a weight of %zu x %zu", rows, cols);
        if (w) free(w->h);
        free(w);
        free(row);
        return NULL;
    }
    w->kind = CPU_W_BF16;
    w->n = rows * cols;
    w->rows = rows;
    w->cols = cols;
    w->packed = amx;
    size_t r0 = 0;
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = src[i].t;
        enum cpu_wkind kind = cpu_kind_of(t->dtype);
        size_t esz = kind == CPU_W_F32 ? sizeof(float) : sizeof(uint16_t);
        for (size_t r = 0; r < (size_t)t->shape[0]; r++, r0++) {
            memcpy(row, (const unsigned char *)t->data + r * cols * esz, cols * esz);
            if (amx) {
                cpu_amx_pack(w->h, rows, cols, r0, 1, row, kind);
            } else {
                uint16_t *out = w->h + r0 * cols;
                if (kind == CPU_W_F16) { /* out holds the words until they are widened */
                    memcpy(out, row, cols * sizeof(uint16_t));
                    cpu_mm_widen(row, out, cols, kind);
                }
                if (kind == CPU_W_BF16)
                    memcpy(out, row, cols * sizeof(uint16_t));
                else
                    for (size_t c = 0; c < cols; c++) out[c] = st_f32_to_bf16(row[c]);
            }
        }
    }
    free(row);
    return w;
}

/* The pieces one after the other. In bf16, matrices as cpu_weight_bf16
 * makes them; in fp32, 16-bit matrices as the file has them; everything
 * else converted to float32 (the loader checked the dtypes). */
static struct bk_weight *cpu_weight_new(void *bep, size_t dev, enum bk_wtype type,
                                        const struct bk_wsrc *src, size_t n, char *errstr,
                                        size_t errstr_size)
{
    const struct cpu_be *be = bep;
    (void)dev;
    size_t total = 0, cols = 0;
    for (size_t i = 0; i < n; i++) total += src[i].t ? (size_t)src[i].t->numel : src[i].n;
    if (be->bf16 && cpu_wsrc_matrix(type, src, n, 0, &cols))
        return cpu_weight_bf16(src, n, cols, be->amx, errstr, errstr_size);
    if (cpu_wsrc_matrix(type, src, n, 1, &cols) && src[0].t->dtype != ST_F32) {
        struct bk_weight *w = calloc(1, sizeof(*w));
        if (w) w->h = cpu_mm_alloc(total * sizeof(uint16_t), 0);
        if (!w || !w->h) {
            snprintf(errstr, errstr_size, "out of memory for a weight of %zu elements", total);
            free(w);
            return NULL;
        }
        w->kind = cpu_kind_of(src[0].t->dtype);
        w->n = total;
        w->cols = cols;
        w->rows = total / cols;
        uint16_t *p = w->h;
        for (size_t i = 0; i < n; i++) {
            memcpy(p, src[i].t->data, (size_t)src[i].t->numel * sizeof(uint16_t));
            p += src[i].t->numel;
        }
        return w;
    }
    struct bk_weight *w = calloc(1, sizeof(*w));
    if (w) w->d = cpu_mm_alloc(total * sizeof(float), 0);
    if (!w || !w->d) {
        snprintf(errstr, errstr_size, "out of memory for a weight of %zu floats", total);
        if (w) free(w);
        return NULL;
    }
    w->n = total;
    float *p = w->d;
    for (size_t i = 0; i < n; i++) {
        if (src[i].t) {
            st_to_f32(src[i].t, p);
            p += src[i].t->numel;
        } else {
            memcpy(p, src[i].f, src[i].n * sizeof(float));
            p += src[i].n;
        }
    }
    return w;
}

static void cpu_weight_free(void *be, struct bk_weight *w)
{
    (void)be;
    if (!w) return;
    free(w->d);
    free(w->h);
    free(w);
}

static const float *W(const struct bk_weight *w)
{
    return w ? w->d : NULL;
}

/* ---- contexts ------------------------------------------------------------ */

static void *cpu_ctx_new(void *be, unsigned slot, char *errstr, size_t errstr_size)
{
    (void)slot;
    struct cpu_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        snprintf(errstr, errstr_size, "out of memory");
    else
        c->kv16 = ((struct cpu_be *)be)->bf16;
    return c;
}

static void cpu_ctx_free(void *cp)
{
    struct cpu_ctx *c = cp;
    if (!c) return;
    for (size_t i = 0; i < c->n_bufs; i++) free(c->bufs[i]);
    free(c->bufs);
    free(c->conv);
    free(c->amx);
    free(c->kvrow);
    free(c);
}

static size_t cpu_ctx_copy(void *cp)
{
    (void)cp;
    return 0;
}

/* Zeroed, so a buffer read before it is written reads zeros. */
static void *cpu_ctx_alloc(void *cp, size_t bytes, int host)
{
    (void)host;
    struct cpu_ctx *c = cp;
    if (c->n_bufs == c->cap_bufs) {
        size_t cap = c->cap_bufs ? 2 * c->cap_bufs : 16;
        void **b = realloc(c->bufs, cap * sizeof(*b));
        if (!b) return NULL;
        c->bufs = b;
        c->cap_bufs = cap;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        snprintf(c->err, sizeof(c->err), "out of memory for a buffer of %zu bytes", bytes);
        return NULL;
    }
    c->bufs[c->n_bufs++] = p;
    return p;
}

static const char *cpu_ctx_error(void *cp)
{
    return ((struct cpu_ctx *)cp)->err;
}

static void cpu_inject_fault(void *cp)
{
    ((struct cpu_ctx *)cp)->fault = 1;
}

/* The fault tests' stand-in for a dead device: what the worker does next
 * (drop the batch, exit 2) is the same. */
static int cpu_pass_begin(void *cp)
{
    struct cpu_ctx *c = cp;
    c->err[0] = '\0';
    if (c->fault) {
        c->fault = 0;
        snprintf(c->err, sizeof(c->err), "injected device fault (debug.device_fault_id)");
        return MODEL_EFATAL;
    }
    return 0;
}

static int cpu_pass_end(void *cp)
{
    (void)cp;
    return 0;
}

static int cpu_upload(void *cp, void *dst, const void *src, size_t bytes)
{
    (void)cp;
    if (dst != src) memcpy(dst, src, bytes);
    return 0;
}

static int cpu_copy_f32(void *cp, void *dst, const void *src, size_t n)
{
    return cpu_upload(cp, dst, src, n * sizeof(float));
}

static int cpu_load_f32(void *cp, void *dst, const float *src, size_t n)
{
    return cpu_copy_f32(cp, dst, src, n);
}

static int cpu_store_f32(void *cp, float *dst, const void *src, size_t n)
{
    return cpu_copy_f32(cp, dst, src, n);
}

/* ---- elementwise and row-wise ------------------------------------------- */

/* act over n values in place. relu keeps NaN as PyTorch does. gelu uses
 * erfc(-x/sqrt 2), equal to 1 + erf(x/sqrt 2) but without its
 * cancellation for negative x (cpu_vec.c, vectorized, as relu). sigmoid
 * takes the branch whose exp cannot overflow. */
static void cpu_act_run(float *x, size_t n, enum bk_act act)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    switch (act) {
    case BK_ACT_RELU:
        cpuv_bias_relu(x, NULL, n, 1);
        break;
    case BK_ACT_GELU:
        cpuv_bias_gelu(x, NULL, n);
        break;
    case BK_ACT_GELU_TANH:
        for (size_t i = 0; i < n; i++) {
            float v = x[i];
            x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
        }
        break;
    case BK_ACT_TANH:
        for (size_t i = 0; i < n; i++) x[i] = tanhf(x[i]);
        break;
    case BK_ACT_SIGMOID:
    case BK_ACT_SILU:
        for (size_t i = 0; i < n; i++) {
            float v = x[i], s;
            if (v >= 0.0f) {
                s = 1.0f / (1.0f + expf(-v));
            } else {
                float e = expf(v);
                s = e / (1.0f + e);
            }
            x[i] = act == BK_ACT_SILU ? v * s : s;
        }
        break;
    default:
        break;
    }
}

static int cpu_act(void *cp, void *x, size_t n, enum bk_act act)
{
    (void)cp;
    if ((unsigned)act >= BK_N_ACTS) return MODEL_EINVAL;
    cpu_act_run(x, n, act);
    return 0;
}

static int cpu_layernorm(void *cp, void *yp, void *xp, const void *resp,
                         const struct bk_weight *g, const struct bk_weight *b, float eps,
                         size_t rows, size_t w)
{
    (void)cp;
    float *x = xp, *y = yp;
    const float *res = resp;
    for (size_t r = 0; r < rows; r++)
        cpuv_layernorm_row(W(g), W(b), eps, x + r * w, res ? res + r * w : NULL, y + r * w, w);
    return 0;
}

/* RMSNorm as Llama's: the mean of squares in double, then x * rsqrt * g. */
static int cpu_rmsnorm(void *cp, void *yp, void *xp, const void *resp, const struct bk_weight *g,
                       float eps, size_t rows, size_t w)
{
    (void)cp;
    cpu_rmsnorm_rows(yp, xp, resp, W(g), eps, rows, w);
    return 0;
}

static int cpu_softmax(void *cp, void *xp, size_t rows, size_t w)
{
    (void)cp;
    float *x = xp;
    for (size_t r = 0; r < rows; r++) cpuv_softmax_row(x + r * w, w);
    return 0;
}

/* x / max(||x||_2, 1e-12) of each row, as F.normalize. */
static int cpu_l2norm(void *cp, void *xp, size_t rows, size_t w)
{
    (void)cp;
    float *x = xp;
    for (size_t r = 0; r < rows; r++) {
        float *row = x + r * w;
        double ss = 0.0;
        for (size_t i = 0; i < w; i++) ss += (double)row[i] * row[i];
        double norm = sqrt(ss);
        double inv = 1.0 / (norm > 1e-12 ? norm : 1e-12);
        for (size_t i = 0; i < w; i++) row[i] = (float)(row[i] * inv);
    }
    return 0;
}

/* ---- GEMM ------------------------------------------------------------------ */

/* model_cpu_gemm_profile: nanoseconds spent in cblas_sgemm, cpu_mm and on
 * the AMX tiles while on. */
static atomic_int gemm_prof;
static atomic_ullong gemm_ns;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* cblas_sgemm, row-major, timed when profiling is on. */
static void sgemm(int tb, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc)
{
    int prof = atomic_load_explicit(&gemm_prof, memory_order_relaxed);
    uint64_t t0 = prof ? mono_ns() : 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                lda, b, ldb, beta, c, ldc);
    if (prof) atomic_fetch_add_explicit(&gemm_ns, mono_ns() - t0, memory_order_relaxed);
}

void model_cpu_gemm_profile(int on)
{
    atomic_store(&gemm_prof, on);
}

double model_cpu_gemm_seconds(void)
{
    return (double)atomic_load(&gemm_ns) / 1e9;
}

double model_cpu_sgemm_peak(size_t n, double seconds)
{
    if (!n || n > 8192) return 0;
    float *a = malloc(n * n * sizeof(float)), *b = malloc(n * n * sizeof(float));
    float *c = malloc(n * n * sizeof(float));
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < n * n; i++) {
            a[i] = (float)(i % 7) * 0.25f - 0.75f;
            b[i] = (float)(i % 5) * 0.5f - 1.0f;
        }
        uint64_t start = mono_ns();
        for (int rep = 0; rep < 3 || (double)(mono_ns() - start) < seconds * 1e9; rep++) {
            uint64_t t0 = mono_ns();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)n, 1.0f, a,
                        (int)n, b, (int)n, 0.0f, c, (int)n);
            double s = (double)(mono_ns() - t0) / 1e9;
            double gf = 2.0 * (double)n * (double)n * (double)n / s / 1e9;
            if (s > 0 && gf > best) best = gf;
        }
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* A weight's C = A W^T of many rows when W is 16-bit: CPU_CONV_ROWS rows
 * of W at a time widened into the context's buffer, then one
 * cblas_sgemm into those columns of C (beta as the caller's). */
static int cpu_gemm_conv(struct cpu_ctx *c, const struct bk_weight *w, size_t m, size_t n,
                         size_t k, float alpha, const float *a, size_t lda, float beta,
                         float *out, size_t ldc)
{
    size_t rows = n < CPU_CONV_ROWS ? n : CPU_CONV_ROWS;
    if (c->conv_n < rows * k) {
        float *p = realloc(c->conv, rows * k * sizeof(float));
        if (!p) {
            snprintf(c->err, sizeof(c->err), "out of memory widening a weight of %zu x %zu",
                     n, k);
            return MODEL_EINVAL;
        }
        c->conv = p;
        c->conv_n = rows * k;
    }
    for (size_t j = 0; j < n; j += rows) {
        size_t nb = n - j < rows ? n - j : rows;
        cpu_mm_widen(c->conv, w->h + j * k, nb * k, w->kind);
        sgemm(1, (int)m, (int)nb, (int)k, alpha, a, (int)lda, c->conv, (int)k, beta, out + j,
              (int)ldc);
    }
    return 0;
}

static void cpu_act_epi(float *x, size_t n, const void *arg)
{
    cpu_act_run(x, n, *(const enum bk_act *)arg);
}

/* C = act(alpha A W^T (+ bias)) on the AMX tiles, W packed: A converted
 * in the context's scratch; alpha other than 1 scales C before the bias;
 * the activation runs on each tile as the tiles' threads store it. */
static int cpu_gemm_amx(struct cpu_ctx *c, const struct bk_weight *w, size_t m, size_t n,
                        size_t k, float alpha, const float *a, size_t lda, const float *bias,
                        enum bk_act act, float *out, size_t ldc)
{
    size_t need = (cpu_amx_scratch_size(m, k) + 63) / 64 * 64;
    if (c->amx_n < need) {
        free(c->amx);
        c->amx = aligned_alloc(64, need);
        c->amx_n = c->amx ? need : 0;
        if (!c->amx) {
            snprintf(c->err, sizeof(c->err), "out of memory for a product of %zu x %zu", m, k);
            return MODEL_EINVAL;
        }
    }
    int prof = atomic_load_explicit(&gemm_prof, memory_order_relaxed);
    uint64_t t0 = prof ? mono_ns() : 0;
    struct cpu_amx_epi epi = {cpu_act_epi, &act};
    int fused = alpha == 1.0f;
    cpu_amx_mm(m, n, k, a, lda, w->h, w->rows, fused ? bias : NULL,
               fused && act != BK_ACT_NONE ? &epi : NULL, out, ldc, c->amx);
    if (prof) atomic_fetch_add_explicit(&gemm_ns, mono_ns() - t0, memory_order_relaxed);
    if (!fused)
        for (size_t r = 0; r < m; r++) {
            for (size_t j = 0; j < n; j++)
                out[r * ldc + j] = alpha * out[r * ldc + j] + (bias ? bias[j] : 0.0f);
            if (act != BK_ACT_NONE) cpu_act_run(out + r * ldc, n, act);
        }
    return 0;
}

/* One product per matrix of the batch (row-major; a weight is [n,k],
 * hence Trans). Against a weight, with few rows (decoding) and alpha 1:
 * cpu_mm, bias included. Otherwise cblas_sgemm: the bias is copied into
 * C first and added through beta = 1 (OpenBLAS clears C for beta = 0, so
 * the copy costs nothing more); a 16-bit weight through cpu_gemm_conv.
 * A weight packed for the AMX tiles (bf16) goes to cpu_gemm_amx whatever
 * the rows.
 * The activation is applied to C's rows afterwards, while they are in
 * cache. */
static size_t batch_of(const struct bk_gemm *g)
{
    return g->batch ? g->batch : 1;
}

static int cpu_gemm(void *cp, const struct bk_gemm *g)
{
    if (!g->m || !g->n || !g->k || (!g->w == !g->b) || g->m > INT_MAX || g->n > INT_MAX ||
        g->k > INT_MAX)
        return MODEL_EINVAL;
    int trans = g->w ? 1 : g->trans_b;
    size_t lda = g->lda ? g->lda : g->k;
    size_t ldb = g->w ? g->k : g->ldb ? g->ldb : trans ? g->k : g->n;
    size_t ldc = g->ldc ? g->ldc : g->n;
    if (lda < g->k || ldb < (trans ? g->k : g->n) || ldc < g->n) return MODEL_EINVAL;
    if (g->w && (g->w->n < g->n * g->k || (g->w->h && g->w->cols != g->k)))
        return MODEL_EINVAL;
    if (g->w && g->w->packed) {
        for (size_t i = 0; i < batch_of(g); i++) {
            float *c = (float *)g->c + i * g->stride_c;
            int rc = cpu_gemm_amx(cp, g->w, g->m, g->n, g->k, g->alpha != 0.0f ? g->alpha : 1.0f,
                                  (const float *)g->a + i * g->stride_a, lda, W(g->bias), g->act,
                                  c, ldc);
            if (rc) return rc;
        }
        return 0;
    }
    size_t batch = batch_of(g);
    float alpha = g->alpha != 0.0f ? g->alpha : 1.0f;
    const float *bias = W(g->bias);
    int small = g->w && g->m <= CPU_MM_MAX_M && alpha == 1.0f;
    for (size_t i = 0; i < batch; i++) {
        const float *a = (const float *)g->a + i * g->stride_a;
        float *c = (float *)g->c + i * g->stride_c;
        if (small) {
            int prof = atomic_load_explicit(&gemm_prof, memory_order_relaxed);
            uint64_t t0 = prof ? mono_ns() : 0;
            cpu_mm(g->m, g->n, g->k, a, lda, g->w->h ? (const void *)g->w->h : g->w->d,
                   g->w->kind, bias, c, ldc);
            if (prof) atomic_fetch_add_explicit(&gemm_ns, mono_ns() - t0, memory_order_relaxed);
        } else {
            float beta = 0.0f;
            if (bias) {
                for (size_t r = 0; r < g->m; r++) memcpy(c + r * ldc, bias, g->n * sizeof(float));
                beta = 1.0f;
            }
            if (g->w && g->w->h) {
                int rc = cpu_gemm_conv(cp, g->w, g->m, g->n, g->k, alpha, a, lda, beta, c, ldc);
                if (rc) return rc;
            } else {
                const float *b = g->w ? g->w->d : (const float *)g->b + i * g->stride_b;
                sgemm(trans, (int)g->m, (int)g->n, (int)g->k, alpha, a, (int)lda, b, (int)ldb,
                      beta, c, (int)ldc);
            }
        }
        if (g->act != BK_ACT_NONE)
            for (size_t r = 0; r < g->m; r++) cpu_act_run(c + r * ldc, g->n, g->act);
    }
    return 0;
}

/* ---- embeddings, attention, rotary, pooling -------------------------------- */

/* Row r (w wide) of table tab: in place when float32, else widened into
 * buf (w floats), which is then returned. */
static const float *cpu_row(const struct bk_weight *tab, size_t r, size_t w, float *buf)
{
    if (!tab->h) return tab->d + r * w;
    if (tab->packed)
        cpu_amx_row(buf, tab->h, tab->rows, w, r);
    else
        cpu_mm_widen(buf, tab->h + r * w, w, tab->kind);
    return buf;
}

static int cpu_embed(void *cp, void *xp, const struct bk_seqs *s, const struct bk_weight *word,
                     const struct bk_weight *pos, size_t pos_base, const struct bk_weight *type,
                     int ln, const struct bk_weight *g, const struct bk_weight *b, float eps,
                     size_t w)
{
    struct cpu_ctx *c = cp;
    float *x = xp;
    const struct bk_weight *tabs[2] = {pos, type};
    for (size_t i = 0; i < 2; i++)
        if (tabs[i] && tabs[i]->h && c->conv_n < w) {
            float *p = realloc(c->conv, w * sizeof(float));
            if (!p) {
                snprintf(c->err, sizeof(c->err), "out of memory widening an embedding row");
                return MODEL_EINVAL;
            }
            c->conv = p;
            c->conv_n = w;
        }
    for (size_t t = 0; t < s->tokens; t++) {
        float *row = x + t * w;
        const float *wr = cpu_row(word, (size_t)s->ids[t], w, row);
        if (wr != row) memcpy(row, wr, w * sizeof(float));
        if (pos) {
            const float *p = cpu_row(pos, pos_base + s->pos[t], w, c->conv);
            for (size_t k = 0; k < w; k++) row[k] += p[k];
        }
        if (type) {
            const float *ty = cpu_row(type, s->types ? (size_t)s->types[t] : 0, w, c->conv);
            for (size_t k = 0; k < w; k++) row[k] += ty[k];
        }
        if (ln) cpuv_layernorm_row(W(g), W(b), eps, row, NULL, row, w);
    }
    return 0;
}

/* One [L,L] score matrix at a time. */
static size_t cpu_attention_scratch(void *be, size_t max_rows, size_t max_tokens,
                                    size_t max_len, size_t heads, size_t dh)
{
    (void)be;
    (void)max_rows;
    (void)max_tokens;
    (void)heads;
    (void)dh;
    return max_len * max_len * sizeof(float);
}

/* Per sequence and head: scores = scale q k^T (one GEMM) plus the
 * relative bias, the causal mask as -inf, a softmax per query, then
 * P v (one GEMM) into the head's columns of out. A sequence sees only its
 * own tokens: what a padded batch with its padding masked computes,
 * without the padding's cost. Offsets are host memory here. */
static int cpu_attention(void *cp, const struct bk_attention *a)
{
    (void)cp;
    const struct bk_seqs *s = a->s;
    if (!a->heads || !a->kv_heads || a->heads % a->kv_heads || !a->dh) return MODEL_EINVAL;
    size_t group = a->heads / a->kv_heads;
    float *scores = a->scratch;
    const float *bias = W(a->rel_bias);
    size_t span = a->rel_span, bw = span ? 2 * span - 1 : 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t o = s->offsets[i], L = s->offsets[i + 1] - o;
        for (size_t h = 0; h < a->heads; h++) {
            const float *base = (const float *)a->qkv + o * a->ld;
            const float *q = base + a->q_col + h * a->dh;
            const float *k = base + a->k_col + (h / group) * a->dh;
            const float *v = base + a->v_col + (h / group) * a->dh;
            sgemm(1, (int)L, (int)L, (int)a->dh, a->scale, q, (int)a->ld, k, (int)a->ld, 0.0f,
                  scores, (int)L);
            for (size_t r = 0; r < L; r++) {
                float *row = scores + r * L;
                if (bias)
                    for (size_t c = 0; c < L; c++) {
                        long d = (long)c - (long)r;
                        if (d > (long)span - 1) d = (long)span - 1;
                        if (d < 1 - (long)span) d = 1 - (long)span;
                        row[c] += bias[h * bw + (size_t)(d + (long)span - 1)];
                    }
                if (a->causal)
                    for (size_t c = r + 1; c < L; c++) row[c] = -INFINITY;
                cpuv_softmax_row(row, L);
            }
            sgemm(0, (int)L, (int)a->dh, (int)L, 1.0f, scores, (int)L, v, (int)a->ld, 0.0f,
                  (float *)a->out + o * a->ldo + h * a->dh, (int)a->ldo);
        }
    }
    return 0;
}

/* rotate_half: (x_i, x_{i+dh/2}) turn by pos x inv_freq[i]; the angle in
 * double, as the float64 reference computes it. */
static int cpu_rope(void *cp, void *xp, size_t rows, size_t ld, size_t col, size_t heads,
                    size_t dh, const uint32_t *pos, const struct bk_weight *inv_freq)
{
    (void)cp;
    if (dh % 2 || !inv_freq || inv_freq->n < dh / 2) return MODEL_EINVAL;
    cpu_rope_rows(xp, rows, ld, col, heads, dh, pos, inv_freq->d);
    return 0;
}

static int cpu_kv_store_w(void *c, const struct bk_kv *kv, const void *k, size_t ldk,
                          const void *v, size_t ldv, const struct bk_seqs *s,
                          const struct bk_weight *rope)
{
    return cpu_kv_store(c, kv, k, ldk, v, ldv, s, rope ? rope->d : NULL, rope ? rope->n : 0);
}

/* Offsets are host memory here, so the reduction reads them directly. */
static int cpu_pool(void *cp, void *yp, const void *xp, const struct bk_seqs *s,
                    enum bk_pool mode, size_t w)
{
    (void)cp;
    const float *x = xp;
    float *y = yp;
    if ((unsigned)mode >= BK_N_POOLS) return MODEL_EINVAL;
    for (size_t i = 0; i < s->n; i++) {
        size_t o = s->offsets[i], L = s->offsets[i + 1] - o;
        const float *first = x + o * w;
        float *out = y + i * w;
        if (mode == BK_POOL_FIRST) {
            memcpy(out, first, w * sizeof(float));
        } else if (mode == BK_POOL_LAST) {
            memcpy(out, first + (L - 1) * w, w * sizeof(float));
        } else if (mode == BK_POOL_MAX) {
            memcpy(out, first, w * sizeof(float));
            for (size_t t = 1; t < L; t++)
                for (size_t k = 0; k < w; k++)
                    if (first[t * w + k] > out[k]) out[k] = first[t * w + k];
        } else {
            for (size_t k = 0; k < w; k++) {
                double sum = 0.0;
                for (size_t t = 0; t < L; t++) sum += first[t * w + k];
                out[k] = (float)(sum / (double)L);
            }
        }
    }
    return 0;
}

const struct backend_ops backend_cpu = {
    .name = "cpu",
    .compiled_in = 1,
    .attention_pads = 0,
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .executors = cpu_executors,
    .precision = cpu_precision,
    .devices = cpu_devices,
    .device_stats = cpu_device_stats,
    .weight_copies = cpu_one,
    .act_size = cpu_act_size,
    .kv_size = cpu_kv_size,
    .weight_new = cpu_weight_new,
    .weight_free = cpu_weight_free,
    .ctx_new = cpu_ctx_new,
    .ctx_free = cpu_ctx_free,
    .ctx_copy = cpu_ctx_copy,
    .ctx_alloc = cpu_ctx_alloc,
    .ctx_error = cpu_ctx_error,
    .inject_fault = cpu_inject_fault,
    .pass_begin = cpu_pass_begin,
    .pass_end = cpu_pass_end,
    .graph_begin = NULL,
    .graph_end = NULL,
    .upload = cpu_upload,
    .load_f32 = cpu_load_f32,
    .store_f32 = cpu_store_f32,
    .gemm = cpu_gemm,
    .layernorm = cpu_layernorm,
    .rmsnorm = cpu_rmsnorm,
    .embed = cpu_embed,
    .attention_scratch = cpu_attention_scratch,
    .attention = cpu_attention,
    .rope = cpu_rope,
    .act = cpu_act,
    .softmax = cpu_softmax,
    .l2norm = cpu_l2norm,
    .pool = cpu_pool,
    .swiglu = cpu_swiglu,
    .kv_store = cpu_kv_store_w,
    .paged_attention_scratch = cpu_paged_attention_scratch,
    .paged_attention = cpu_paged_attention,
};

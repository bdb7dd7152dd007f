/* cuda_internal.h - what the files of the CUDA backend share, and nothing
 * outside them sees: the backend's and a context's state, the cuBLASLt
 * loader (gpu/cuda_lt.c), the checks that turn a failed CUDA or cuBLASLt
 * call into a message with its file and line and a model_rc, and the
 * primitives each file defines for the ops table (gpu/backend_cuda.c).
 * Includes CUDA's headers: only gpu/backend_cuda.c, gpu/cuda_lt.c and
 * gpu/cuda_prims.c include it.
 *
 * Threads: a struct cuda_be is written at open (main thread) and read-only
 * after, but for its devices' counters (atomics); a struct cuda_ctx
 * belongs to the one executor thread that made it. */
#ifndef KINFER_CUDA_INTERNAL_H
#define KINFER_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cuda_kernels.h"
#include "plan.h"

/* ---- cuBLASLt, loaded when the backend opens --------------------------- */

/* A machine that runs the CPU backend never needs the library, nor pays
 * for loading it. The pointers have the headers' own types. */
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

/* Loads cuBLASLt of the major version the backend was built against.
 * Returns 0, or -1 with errstr filled. */
int lt_load(struct lt_api *cl, char *errstr, size_t errstr_size);
void lt_unload(struct lt_api *cl);

/* ---- state ------------------------------------------------------------ */

struct cuda_dev {
    int index;                     /* CUDA device index */
    char name[96];
    int major, minor;
    size_t total_mem;
    double mem_gbs;                /* peak memory bandwidth (model_device_stats) */
    atomic_uint_fast64_t busy_ns;  /* GPU time of kinfer's passes (events) */
    atomic_uint_fast64_t batches;
};

struct cuda_be {
    struct lt_api cl;
    enum model_precision prec;
    enum kc_type kt;               /* activations' type */
    cudaDataType_t dt;             /* the same, as cuBLASLt names it */
    size_t es;                     /* bytes per activation */
    int graphs;
    int per_device;                /* executors per device */
    size_t lt_ws_bytes;            /* cuBLASLt workspace per context */
    size_t n_dev;
    struct cuda_dev dev[MODEL_MAX_DEVICES];
};

/* A weight on one device. */
struct bk_weight {
    void *p;
    size_t n;                      /* elements */
    size_t copy;                   /* which device (index into be->dev) */
    enum bk_wtype type;
};

/* One GEMM's cuBLASLt set-up, kept in a context's cache (cuda_lt.c). The
 * key is plain bytes, zeroed before it is filled, so memcmp compares it. */
struct lt_key {
    uint64_t m, n, k, lda, ldb, ldc;
    int64_t sa, sb, sc;
    int32_t batch;
    int32_t dt;                    /* cudaDataType_t of A, B and C */
    uint8_t op_b;                  /* cuBLAS's TRANSA for B: 1 = T */
    uint8_t bias, act;             /* has a bias; enum bk_act asked for */
    uint8_t align[4];              /* log2 of the alignment of a, b, c, bias (<= 8) */
    uint8_t pad;
};

struct lt_plan {
    struct lt_key key;
    uint64_t last;                 /* tick of its last use; 0 = free */
    int found;                     /* the heuristic gave an algorithm */
    enum kc_act after;             /* activation run as a kernel after the GEMM */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lay[3]; /* cuBLASLt's A (our B or w), B (our a), C */
    cublasLtMatmulAlgo_t algo;
};

#define LT_PLANS 64 /* GEMM shapes a context remembers */

/* A context: one executor's stream and library handles on its device,
 * its memory, GEMM plans and graphs, and its pass's state. */
struct cuda_ctx {
    struct cuda_be *be;
    struct cuda_dev *dev;
    size_t copy;                   /* index of dev in be->dev: the weights it reads */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasLtMatmulPreference_t pref;
    void *lt_ws;
    /* passes: each slot's events time one; a pass submitted and not yet
     * waited for holds its slot (q_len of them from q_first) */
    cudaEvent_t ev_start[2], ev_stop[2];
    int q_ok[2];                   /* the submitted pass had no failure */
    unsigned q_first, q_len;
    /* memory of ctx_alloc, freed by ctx_free */
    struct cuda_mem { void *p; int host; } *mem;
    size_t n_mem, cap_mem;
    float *stage;                  /* 16-bit types: float32 staging for load/store_f32 */
    size_t stage_bytes;
    /* GEMM plans */
    struct lt_plan plans[LT_PLANS];
    uint64_t plan_tick;
    /* graphs */
    struct plan_shapes shapes;
    cudaGraphExec_t graph[PLAN_SHAPE_SLOTS];
    size_t cap_slot;               /* the slot being captured */
    /* state */
    int in_pass, capturing, fault;
    int fatal;                     /* a fatal error seen: every call answers MODEL_EFATAL */
    int pass_rc;                   /* the pass's first failure (0 or enum model_rc) */
    char err[512];
};

/* ---- checks ----------------------------------------------------------- */

/* The errors after which the device's context is unusable for good. */
int cuda_sticky(cudaError_t e);

/* Format a failed call as "FILE:LINE: CALL: NAME: MESSAGE" into errstr
 * and return -1; 0 when the call succeeded. CU and LT use the errstr and
 * errstr_size in scope (LT a struct lt_api *cl too): set-up code. */
int cuda_check(cudaError_t e, const char *call, const char *file, int line, char *errstr,
               size_t errstr_size);
int lt_check(const struct lt_api *cl, cublasStatus_t st, const char *call, const char *file,
             int line, char *errstr, size_t errstr_size);
#define CU(call) cuda_check((call), #call, __FILE__, __LINE__, errstr, errstr_size)
#define LT(call) lt_check(cl, (call), #call, __FILE__, __LINE__, errstr, errstr_size)

/* In a context: 0, or the model_rc a failed call means (MODEL_EFATAL for a
 * sticky error, or any not known to be harmless; MODEL_EINVAL for a
 * refused argument or a failed capture), recorded as the pass's failure
 * with its message in c->err (the first failure's message is kept). A
 * fatal one marks the context dead. */
int cx_cuda(struct cuda_ctx *c, cudaError_t e, const char *call, const char *file, int line);
int cx_lt(struct cuda_ctx *c, cublasStatus_t st, const char *call, const char *file, int line);
#define CX(c, call) cx_cuda((c), (call), #call, __FILE__, __LINE__)
#define CXLT(c, call) cx_lt((c), (call), #call, __FILE__, __LINE__)
/* Records rc (a negative model_rc) with msg as the pass's failure, unless
 * it had one already (a fatal one overrides a refusal); returns rc. */
int cx_record(struct cuda_ctx *c, int rc, const char *msg);
/* Records a refusal (MODEL_EINVAL) with a message; returns MODEL_EINVAL. */
int cx_refuse(struct cuda_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* What every primitive checks first: MODEL_EFATAL on a dead context, else
 * 0. */
int cx_live(const struct cuda_ctx *c);

/* ---- cuda_lt.c ---------------------------------------------------------- */

int cuda_gemm(void *c, const struct bk_gemm *g);
/* Frees every cached plan of c (ctx_free). */
void lt_plans_free(struct cuda_ctx *c);

/* ---- cuda_prims.c --------------------------------------------------------- */

enum kc_act cuda_kc_act(enum bk_act a);
int cuda_layernorm(void *c, void *y, void *x, const void *res, const struct bk_weight *g,
                   const struct bk_weight *b, float eps, size_t rows, size_t w);
int cuda_rmsnorm(void *c, void *y, void *x, const void *res, const struct bk_weight *g, float eps,
                 size_t rows, size_t w);
int cuda_embed(void *c, void *x, const struct bk_seqs *s, const struct bk_weight *word,
               const struct bk_weight *pos, size_t pos_base, const struct bk_weight *type, int ln,
               const struct bk_weight *g, const struct bk_weight *b, float eps, size_t w);
size_t cuda_attention_scratch(void *be, size_t max_rows, size_t max_tokens, size_t max_len,
                              size_t heads, size_t dh);
int cuda_attention(void *c, const struct bk_attention *a);
int cuda_rope(void *c, void *x, size_t rows, size_t ld, size_t col, size_t heads, size_t dh,
              const uint32_t *pos, const struct bk_weight *inv_freq);
int cuda_act(void *c, void *x, size_t n, enum bk_act act);
int cuda_softmax(void *c, void *x, size_t rows, size_t w);
int cuda_l2norm(void *c, void *x, size_t rows, size_t w);
int cuda_pool(void *c, void *y, const void *x, const struct bk_seqs *s, enum bk_pool mode,
              size_t w);
int cuda_swiglu(void *c, void *y, const void *x, size_t rows, size_t w);
int cuda_kv_store(void *c, const struct bk_kv *kv, const void *k, size_t ldk, const void *v,
                  size_t ldv, const struct bk_seqs *s, const struct bk_weight *rope);
size_t cuda_paged_attention_scratch(void *be, size_t max_tokens, size_t max_ctx, size_t heads);
int cuda_paged_attention(void *c, const struct bk_paged_attention *a);
size_t cuda_sample_scratch(void *be, size_t max_rows);
int cuda_sample(void *c, const struct bk_sample *a);

/* The emulated build (make emu, emu/) links its cuBLASLt into the
 * program, where lt_load finds it (dlopen(NULL)); the others load the
 * library by name. */
#ifdef KINFER_EMU
#define LT_SO_NAME(name) ((void)(name), (const char *)0)
#else
#define LT_SO_NAME(name) (name)
#endif

#endif

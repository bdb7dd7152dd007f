/* backend.h - the seam a backend fills: a small table of tensor
 * primitives, never models. The architectures (gpu/arch_*.c, listed in
 * gpu/arch.c) are written once against these primitives; gpu/model.c is
 * the runtime that loads them and runs their passes. Each backend is a
 * file (or a few) of its own: backend_cpu.c (OpenBLAS and loops),
 * backend_cuda.c, cuda_lt.c and cuda_prims.c with their kernels
 * (cuBLASLt), or cuda_stub.c in a build without CUDA. Nothing outside gpu/ includes this header.
 *
 * Memory. A backend owns three kinds of memory, all behind its handles:
 *  - weights, uploaded once per device (weight_new), read-only after;
 *  - buffers of an executor context (ctx_alloc), on its device, made
 *    before the first pass and never during one;
 *  - pinned host buffers of a context (ctx_alloc with host = 1), where
 *    the runtime stages a batch's inputs and receives its outputs.
 * On the CPU backend "device" memory is host memory. Activations are in
 * the backend's activation type (float32, half or bfloat16: act_size
 * bytes each); every primitive computes in float32 and keeps row
 * statistics in float32. Token ids, positions and offsets are uint32 /
 * int32 in device memory. Matrices are row-major; a pointer plus a
 * leading dimension (in elements) addresses a strided view.
 *
 * Errors. A primitive returns 0 or a negative enum model_rc: MODEL_EINVAL
 * for a call the backend refuses (nothing ran; the pass fails, the
 * process goes on), MODEL_EFATAL when the device failed for good (a
 * sticky CUDA error: the worker must stop). ctx_error says what happened.
 * Primitives may run asynchronously on the context's stream; sync (or
 * pass_end) reports what failed since.
 *
 * Threads: probe on any thread; open, close, weight_new and weight_free on
 * the main thread at startup and shutdown; a context and every primitive
 * called with it belong to the one executor thread that made it. */
#ifndef KINFER_BACKEND_H
#define KINFER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "safetensors.h"

/* A weight on one device: defined by each backend in its own file. */
struct bk_weight;

/* How a weight is stored: in the activation type (GEMM operands, their
 * biases, embedding tables), or float32 whatever the precision
 * (normalization parameters, bias tables, rotary frequencies). */
enum bk_wtype { BK_W_ACT = 0, BK_W_F32 };

/* One piece of a weight: a tensor of the model's file, or floats the
 * architecture computed. A weight is its pieces concatenated in order
 * (so Q, K and V stack into one [3H,H] matrix). */
struct bk_wsrc {
    const struct st_tensor *t;   /* or NULL, and then: */
    const float *f;
    size_t n;                    /* floats at f */
};

/* Elementwise activations (epilogues too). gelu is the erf form, gelu_tanh
 * the tanh approximation; relu keeps NaN; silu is x * sigmoid(x). */
enum bk_act {
    BK_ACT_NONE = 0,
    BK_ACT_RELU,
    BK_ACT_GELU,
    BK_ACT_GELU_TANH,
    BK_ACT_TANH,
    BK_ACT_SIGMOID,
    BK_ACT_SILU,
    BK_N_ACTS
};

/* How pool reduces a sequence's tokens to one row. */
enum bk_pool { BK_POOL_FIRST = 0, BK_POOL_MEAN, BK_POOL_MAX, BK_POOL_LAST, BK_N_POOLS };

/* A batch of n token sequences packed without padding, as the primitives
 * read it (device memory): sequence i is tokens offsets[i] ..
 * offsets[i+1]-1; seq[t] is the sequence token t belongs to, pos[t] its
 * position in it (from 0). tokens and longest are the host's copy of
 * offsets[n] and the longest sequence; lone (host, at most n and tokens)
 * the number of leading sequences of exactly one token, so that tokens
 * 0 .. lone-1 are each a sequence of their own (0: not known). ids and
 * types (types may be NULL: all 0) were checked against the tables by
 * the runtime. */
struct bk_seqs {
    size_t n, tokens, longest, lone;
    const uint32_t *offsets;
    const uint32_t *seq;
    const uint32_t *pos;
    const int32_t *ids;
    const int32_t *types;
};

/* C = act(alpha A B' + bias), batch times: row-major A [m,k]; B either a
 * weight w stored [n,k] as nn.Linear keeps it, or activations b, [n,k]
 * when trans_b (C = A B^T) else [k,n]; bias [n] or NULL; C [m,n]. Leading
 * dimensions of 0 mean dense rows (k, k or n, n); strides (elements
 * between the matrices of a batch) are for a, b and c; a weight is
 * shared by the batch. */
struct bk_gemm {
    size_t m, n, k;
    size_t batch;                    /* 0 or 1: one GEMM */
    float alpha;                     /* 0 means 1 */
    const void *a;
    size_t lda, stride_a;
    const struct bk_weight *w;       /* either w ... */
    const void *b;                   /* ... or b */
    int trans_b;
    size_t ldb, stride_b;
    const struct bk_weight *bias;    /* [n] in the activation type, or NULL */
    enum bk_act act;
    void *c;
    size_t ldc, stride_c;
};

/* Scaled dot-product attention of every sequence and head over the
 * packed rows of qkv: query head h of token t at row t, columns q_col +
 * h dh; key and value head g at k_col + g dh and v_col + g dh, where g =
 * h / (heads / kv_heads) (grouped-query attention; kv_heads = heads for
 * multi-head). Each sequence attends to its own tokens only, causal: to
 * those at or before its own position. rel_bias, when set, is a float32
 * table [heads, 2 rel_span - 1] added to the score of query i and key j
 * (positions in the sequence) at column (j - i) + rel_span - 1, the
 * distance clamped to +-(rel_span - 1). The context goes to out, row t,
 * columns h dh .. (h+1) dh - 1. scratch is attention_scratch bytes of
 * context memory. */
struct bk_attention {
    const void *qkv;
    size_t ld, q_col, k_col, v_col;
    size_t heads, kv_heads, dh;
    float scale;
    int causal;
    const struct bk_weight *rel_bias;
    size_t rel_span;
    const struct bk_seqs *s;
    void *out;
    size_t ldo;
    void *scratch;
};

/* The paged key/value cache of one layer (device memory). Cached keys and
 * values are elements of the backend's cache type, kv_size bytes each:
 * on the CPU float32, or bfloat16 under worker.cpu_precision "bf16" (as
 * its weights); on CUDA the activation type (half or bfloat16 in
 * fp16 and bf16, float32 in fp32 and tf32), as the activations were
 * before they were stored, so the cache costs no more than they do. k
 * and v are each [blocks, block_tokens, kv_heads, dh], so position slot
 * s of block b, head g starts at element ((b block_tokens + s) kv_heads
 * + g) dh. Sequence i's block table is row i of tables (table_w uint32
 * block ids, device memory): its position p lives in block tables[i
 * table_w + p / block_tokens], slot p % block_tokens. The runtime
 * (gpu/kvcache.c) hands each block to one sequence at a time. */
struct bk_kv {
    void *k, *v;
    size_t blocks, block_tokens, kv_heads, dh;
    const uint32_t *tables;
    size_t table_w;
};

/* Attention of new tokens over the cache: query head h of token t at
 * q + t ldq + h dh (activations); token t belongs to sequence s->seq[t]
 * (its table row) at absolute position s->pos[t], and attends to its
 * sequence's cached positions 0 .. pos[t] (kv_store must have stored this
 * step's tokens first): causal by position, so a prefill chunk of k
 * tokens and a single decode token are the same call. Head h reads
 * cache head h / (heads / kv->kv_heads). softmax(scale q k^T) v goes to
 * out, row t, columns h dh .. (h+1) dh - 1 (activations, leading
 * dimension ldo). Only s->tokens, s->seq and s->pos are read, and s->n
 * (the step's sequences, 0 if not known) and s->lone as hints of how
 * many tokens a sequence brings, which may choose other kernels (the
 * outputs are the same). No pos[t] may reach max_ctx; scratch is
 * paged_attention_scratch(max_tokens, max_ctx, heads) bytes of context
 * memory. */
struct bk_paged_attention {
    const void *q;
    size_t ldq, heads;
    float scale;
    const struct bk_kv *kv;
    const struct bk_seqs *s;
    size_t max_ctx;
    void *out;
    size_t ldo;
    void *scratch;
};

/* Choosing the next token on the device (sample): one row of parameters
 * per logits row, as gen/sample.h's struct gen_sampling, with the row's
 * uniform draw taken by the caller from the job's own stream. */
#define BK_SAMPLE_ON 1u      /* the row picks a token; else it is skipped */
#define BK_SAMPLE_LOGPROB 2u /* and reports its raw log-probability */
struct bk_sample_row {
    float temperature;       /* 0: greedy (u unused) */
    uint32_t top_k;          /* 0: off */
    float top_p;             /* (0, 1]; 1: off */
    float min_p;             /* [0, 1); 0: off */
    double u;                /* [0, 1) */
    uint32_t flags;          /* BK_SAMPLE_* */
    uint32_t pad;
};
struct bk_sample_out {
    int32_t id;              /* -1: no finite logit in the row */
    float logprob;           /* with BK_SAMPLE_LOGPROB; NaN with id -1 */
};

/* rows rows of vocab logits (activations, ld elements apart, device
 * memory); params and out are rows entries of the context's host memory
 * (ctx_alloc with host = 1): params is read by the work, out is complete
 * after pass_end. scratch is sample_scratch(rows) bytes of context
 * memory. ids, when set, is rows int32 of device memory where each
 * picking row's id goes too (0 for a row with no finite logit), for a
 * later pass to read as its token ids without a trip through the host. */
struct bk_sample {
    const void *logits;
    size_t rows, vocab, ld;
    const struct bk_sample_row *params;
    struct bk_sample_out *out;
    void *scratch;
    int32_t *ids;
};

/* What graph_begin asks of the caller. */
enum bk_graph { BK_GRAPH_RUN = 0, BK_GRAPH_REPLAYED };

struct backend_ops {
    const char *name;            /* "cpu", "cuda" */
    int compiled_in;             /* 0 for the stub of a build without it */
    int attention_pads;          /* attention costs rows x longest (padded), not tokens */

    /* ---- the backend -------------------------------------------------- */

    /* How many devices this backend could use now (the CPU counts as
     * one), with a line saying what they are or why there are none. */
    int (*probe)(char *what, size_t what_size);
    /* Process-wide set-up (thread pools, devices). Returns the backend's
     * state, or NULL with errstr filled; desc gets a line saying what was
     * set up. Borrows c. */
    void *(*open)(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                  char *errstr, size_t errstr_size);
    void (*close)(void *be);
    /* Executors when batching.executors is 0; "fp32"...; devices (0 on
     * the CPU) and their counters (-1 for one that does not exist). */
    size_t (*executors)(void *be);
    const char *(*precision)(void *be);
    size_t (*devices)(void *be);
    int (*device_stats)(void *be, size_t dev, struct model_device_stats *out);
    /* How many copies of the weights a model needs (one per device; the
     * CPU's 1), bytes per activation element, and bytes per element of
     * the key/value cache (bk_kv). */
    size_t (*weight_copies)(void *be);
    size_t (*act_size)(void *be);
    size_t (*kv_size)(void *be);

    /* ---- weights ------------------------------------------------------ */

    /* Uploads the concatenation of n pieces to copy dev (0 ..
     * weight_copies - 1), converted to type. Returns NULL with errstr
     * filled (naming the sizes when memory runs out). */
    struct bk_weight *(*weight_new)(void *be, size_t dev, enum bk_wtype type,
                                    const struct bk_wsrc *src, size_t n, char *errstr,
                                    size_t errstr_size);
    void (*weight_free)(void *be, struct bk_weight *w);

    /* ---- executor contexts ------------------------------------------- */

    /* A context for executor slot (its stream and library handles, on the
     * device the slot maps to). NULL with errstr filled. */
    void *(*ctx_new)(void *be, unsigned slot, char *errstr, size_t errstr_size);
    void (*ctx_free)(void *c);
    /* Which weight copy the context's device reads. */
    size_t (*ctx_copy)(void *c);
    /* bytes of device memory (host = 0) or pinned host memory (host = 1),
     * owned by the context until ctx_free; NULL when out of memory. Never
     * during a pass. */
    void *(*ctx_alloc)(void *c, size_t bytes, int host);
    /* The last failure on the context, "" if none. */
    const char *(*ctx_error)(void *c);
    /* Arms the context so the next pass fails as a dead device would (on
     * a GPU: a kernel writing to an illegal address). */
    void (*inject_fault)(void *c);

    /* ---- a pass ------------------------------------------------------- */

    /* Brackets one forward pass: pass_end waits for its work and reports
     * what failed; the device's busy time and pass count are taken here. */
    int (*pass_begin)(void *c);
    int (*pass_end)(void *c);
    /* Overlap (NULL: pass_end only). pass_submit ends a pass without
     * waiting for it: 0 with its work in flight, or (a call of the pass
     * failed) its first failure, the pass waited for and not in flight
     * (passes submitted before it stay in flight). pass_wait
     * waits for the oldest pass in flight: 0, or MODEL_EFATAL when the
     * device failed meanwhile (the only failure left to report). At
     * most two passes are in flight: pass_begin refuses a third, and
     * pass_end waits for every one. Host buffers a pass in flight reads
     * or writes are the caller's to leave alone until its wait. */
    int (*pass_submit)(void *c);
    int (*pass_wait)(void *c);
    /* A pass whose calls depend only on the shape key (its bytes) may be
     * recorded once and replayed: BK_GRAPH_REPLAYED when the work for key
     * was enqueued from a recording (skip to the downloads), BK_GRAPH_RUN
     * when the caller must issue the calls and then graph_end (which may
     * record and launch them). NULL: no graphs. */
    int (*graph_begin)(void *c, const void *key, size_t key_len);
    int (*graph_end)(void *c);

    /* Copies: raw bytes host to device; host float32 to activations;
     * activations to host float32 (complete after pass_end). */
    int (*upload)(void *c, void *dst, const void *src, size_t bytes);
    int (*load_f32)(void *c, void *dst, const float *src, size_t n);
    int (*store_f32)(void *c, float *dst, const void *src, size_t n);

    /* ---- primitives ---------------------------------------------------- */

    int (*gemm)(void *c, const struct bk_gemm *g);
    /* y = LayerNorm(x) of rows x w (biased variance, PyTorch's); with res,
     * x += res first (x keeps the sum). g and b (float32 weights) may be
     * NULL: ones, zeros. y may be x. */
    int (*layernorm)(void *c, void *y, void *x, const void *res, const struct bk_weight *g,
                     const struct bk_weight *b, float eps, size_t rows, size_t w);
    /* y = x / sqrt(mean(x^2) + eps) * g, rows x w; res as layernorm. */
    int (*rmsnorm)(void *c, void *y, void *x, const void *res, const struct bk_weight *g,
                   float eps, size_t rows, size_t w);
    /* x[t] = word[ids[t]] + pos[pos_base + s->pos[t]] + type[types[t]]
     * (pos and type may be NULL), then LayerNorm with g, b, eps when ln;
     * the sum is kept in float32 until normalized. Tables [*, w]. */
    int (*embed)(void *c, void *x, const struct bk_seqs *s, const struct bk_weight *word,
                 const struct bk_weight *pos, size_t pos_base, const struct bk_weight *type,
                 int ln, const struct bk_weight *g, const struct bk_weight *b, float eps,
                 size_t w);
    /* Bytes of scratch attention needs for up to max_rows sequences, none
     * longer than max_len, in batches whose sequences times the longest
     * are at most max_tokens (model_encode refuses other batches, so a
     * backend that pads to the longest never holds more than that). */
    size_t (*attention_scratch)(void *be, size_t max_rows, size_t max_tokens, size_t max_len,
                                size_t heads, size_t dh);
    int (*attention)(void *c, const struct bk_attention *a);
    /* Rotary embedding of rows x heads x dh values at column col of rows
     * of x (leading dimension ld), in place, each row at position
     * pos[row]: the pairs (i, i + dh/2) rotate by pos x inv_freq[i]
     * (float32, dh/2 values), as Llama's rotate_half. */
    int (*rope)(void *c, void *x, size_t rows, size_t ld, size_t col, size_t heads, size_t dh,
                const uint32_t *pos, const struct bk_weight *inv_freq);
    /* x = act(x), n elements. */
    int (*act)(void *c, void *x, size_t n, enum bk_act act);
    /* Row-wise in place over rows x w: softmax (shifted by the row's
     * max), x / max(||x||_2, 1e-12) (F.normalize). */
    int (*softmax)(void *c, void *x, size_t rows, size_t w);
    int (*l2norm)(void *c, void *x, size_t rows, size_t w);
    /* y[i] = the first, mean, max or last of sequence i's rows of x
     * [tokens, w] (only its own tokens count). */
    int (*pool)(void *c, void *y, const void *x, const struct bk_seqs *s, enum bk_pool mode,
                size_t w);

    /* ---- decoding (gpu/decoder.c) ------------------------------------ */

    /* y = silu(gate) * up over rows: x row r is [gate (w) | up (w)] (one
     * GEMM of the stacked projections), y row r has w values; y must not
     * overlap x. */
    int (*swiglu)(void *c, void *y, const void *x, size_t rows, size_t w);
    /* Stores token t's key and value heads (activations at k + t ldk and
     * v + t ldv, kv->kv_heads x kv->dh each) in the slot of its position
     * s->pos[t] in sequence s->seq[t]'s blocks, converted to float32
     * (bk_kv); with rope (kv->dh / 2 float32 inverse frequencies, as rope
     * takes them) each key head is rotated to its position on the way, as
     * rope would rotate it in place (k itself is left as it was). Only
     * s->tokens, s->seq and s->pos are read. A token whose position falls
     * outside its table or whose block id is not below kv->blocks is
     * refused (MODEL_EINVAL) where the backend can check it cheaply; the
     * runtime never passes one. */
    int (*kv_store)(void *c, const struct bk_kv *kv, const void *k, size_t ldk, const void *v,
                    size_t ldv, const struct bk_seqs *s, const struct bk_weight *rope);
    /* Bytes of scratch paged_attention needs for up to max_tokens new
     * tokens of sequences no longer than max_ctx, with heads query heads. */
    size_t (*paged_attention_scratch)(void *be, size_t max_tokens, size_t max_ctx, size_t heads);
    int (*paged_attention)(void *c, const struct bk_paged_attention *a);

    /* ---- sampling (gpu/decoder.c) ------------------------------------ */

    /* The next token of each row whose flags have BK_SAMPLE_ON, chosen
     * as gen/sample.h's gen_sample chooses it from the same logits and
     * draw (the same filters in the same order, ties broken the same way;
     * masses summed in another order, so a draw within a few float64
     * roundings of a boundary may fall to the other side); only the ids
     * and log-probabilities come back. NULL (the CPU backend): the caller
     * fetches the logits and samples on the host. */
    size_t (*sample_scratch)(void *be, size_t max_rows);
    int (*sample)(void *c, const struct bk_sample *a);
};

/* The backends of this build. backend_cuda is the stub of cuda_stub.c
 * when the build has no CUDA: its probe finds nothing and its open says
 * why. */
extern const struct backend_ops backend_cpu;
extern const struct backend_ops backend_cuda;

#endif

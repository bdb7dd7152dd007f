/* cuda_prims.c - the CUDA backend's primitives other than the GEMM and the
 * copies: norms, embeddings, attention, rotary embedding, activations,
 * softmax, L2 norm, pooling and sampling, each a check of its arguments (a refusal
 * is MODEL_EINVAL: nothing ran) and one or a few launches of
 * gpu/cuda_kernels.cu on the context's stream.
 *
 * Attention runs padded: the batch's sequences are gathered, per head,
 * into [n, heads, Lp, dh] (Lp the batch's longest rounded up to
 * ATTN_ALIGN, padding rows zero), so the scores Q K^T and the context P V
 * are each one strided-batched GEMM of n x heads matrices (cuda_gemm, the
 * scale in the first one's alpha); a masked softmax kernel adds the
 * relative-position bias, gives padding keys (and, causal, later ones)
 * probability 0, and the context is scattered back to packed rows. Only
 * attention pads: its cost is rows x longest (backend_cuda's
 * attention_pads). Grouped-query attention gathers each query head's key
 * and value head, so k and v take as much scratch as q.
 *
 * Threads: the context's executor thread. Borrows every pointer for the
 * call (the work reads them until pass_end). */
#include "cuda_internal.h"

#include <stdio.h>
#include <string.h>

/* Attention pads each sequence to the batch's longest rounded up to this
 * many tokens: every leading dimension and batch stride of its GEMMs is
 * then a multiple of 16 bytes in 16-bit types (8 elements, dh being a
 * multiple of 8 at the usual sizes), as the tensor cores' vector loads
 * want, for at most 7 rows of padding per sequence. */
#define ATTN_ALIGN 8

enum kc_act cuda_kc_act(enum bk_act a)
{
    switch (a) {
    case BK_ACT_RELU: return KC_RELU;
    case BK_ACT_GELU: return KC_GELU;
    case BK_ACT_GELU_TANH: return KC_GELU_TANH;
    case BK_ACT_TANH: return KC_TANH;
    case BK_ACT_SIGMOID: return KC_SIGMOID;
    case BK_ACT_SILU: return KC_SILU;
    default: return KC_NONE;
    }
}

/* 0 when w is NULL or a weight of at least n values of type on c's
 * device; else a refusal naming what. */
static int weight_ok(struct cuda_ctx *c, const struct bk_weight *w, enum bk_wtype type, size_t n,
                     const char *what)
{
    if (!w || (w->type == type && w->copy == c->copy && w->n >= n)) return 0;
    return cx_refuse(c, "%s: not %zu values in %s on this context's device (%zu in %s, copy %zu)",
                     what, n, type == BK_W_F32 ? "float32" : "the activation type", w->n,
                     w->type == BK_W_F32 ? "float32" : "the activation type", w->copy);
}

static const float *f32_of(const struct bk_weight *w)
{
    return w ? (const float *)w->p : NULL;
}

static const void *act_of(const struct bk_weight *w)
{
    return w ? w->p : NULL;
}

/* 0, or a refusal for a batch of sequences that cannot be launched. */
static int seqs_ok(struct cuda_ctx *c, const struct bk_seqs *s, const char *what)
{
    if (s && s->n && s->tokens && s->longest && s->offsets && s->seq && s->pos &&
        s->n <= 0x7fffffffu && s->tokens <= 0x7fffffffu)
        return 0;
    return cx_refuse(c, "%s: an empty or incomplete batch of sequences", what);
}

int cuda_layernorm(void *cp, void *y, void *x, const void *res, const struct bk_weight *g,
                   const struct bk_weight *b, float eps, size_t rows, size_t w)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!y || !x || !rows || !w) return cx_refuse(c, "layernorm: %zu x %zu", rows, w);
    if ((rc = weight_ok(c, g, BK_W_F32, w, "layernorm weight")) < 0 ||
        (rc = weight_ok(c, b, BK_W_F32, w, "layernorm bias")) < 0)
        return rc;
    return CX(c, kc_layernorm(c->stream, c->be->kt, y, x, res, f32_of(g), f32_of(b), eps, rows,
                              w));
}

int cuda_rmsnorm(void *cp, void *y, void *x, const void *res, const struct bk_weight *g,
                 float eps, size_t rows, size_t w)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!y || !x || !rows || !w) return cx_refuse(c, "rmsnorm: %zu x %zu", rows, w);
    if ((rc = weight_ok(c, g, BK_W_F32, w, "rmsnorm weight")) < 0) return rc;
    return CX(c, kc_rmsnorm(c->stream, c->be->kt, y, x, res, f32_of(g), eps, rows, w));
}

/* The position table must hold pos_base + the longest sequence's rows
 * (the one index the host can check; ids and types the runtime checked). */
int cuda_embed(void *cp, void *x, const struct bk_seqs *s, const struct bk_weight *word,
               const struct bk_weight *pos, size_t pos_base, const struct bk_weight *type, int ln,
               const struct bk_weight *g, const struct bk_weight *b, float eps, size_t w)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if ((rc = seqs_ok(c, s, "embed")) < 0) return rc;
    if (!x || !word || !w || !s->ids) return cx_refuse(c, "embed: no output, table or ids");
    if ((rc = weight_ok(c, word, BK_W_ACT, w, "word embeddings")) < 0 ||
        (rc = weight_ok(c, pos, BK_W_ACT, (pos_base + s->longest) * w,
                        "position embeddings")) < 0 ||
        (rc = weight_ok(c, type, BK_W_ACT, w, "type embeddings")) < 0 ||
        (ln && (rc = weight_ok(c, g, BK_W_F32, w, "embeddings' layernorm weight")) < 0) ||
        (ln && (rc = weight_ok(c, b, BK_W_F32, w, "embeddings' layernorm bias")) < 0))
        return rc;
    return CX(c, kc_embed(c->stream, c->be->kt, x, word->p, act_of(pos), pos_base, act_of(type),
                          ln, ln ? f32_of(g) : NULL, ln ? f32_of(b) : NULL, eps, s->ids,
                          s->types, s->pos, s->tokens, w));
}

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* Bytes of attention's scratch for n sequences padded to Lp: q, k and v
 * [n, heads, Lp, dh] and the scores [n, heads, Lp, Lp], each on a 256-byte
 * boundary. */
static size_t attn_bytes(size_t es, size_t n, size_t Lp, size_t heads, size_t dh)
{
    size_t qkv = round_up(n * heads * Lp * dh * es, 256);
    return 3 * qkv + round_up(n * heads * Lp * Lp * es, 256);
}

/* The largest attn_bytes over the batches the runtime admits: n
 * sequences (up to max_rows) padded to the longest, which model_encode
 * keeps at max_tokens / n tokens at most (and max_len). */
size_t cuda_attention_scratch(void *bep, size_t max_rows, size_t max_tokens, size_t max_len,
                              size_t heads, size_t dh)
{
    const struct cuda_be *be = bep;
    size_t most = 0, nmax = max_rows < max_tokens ? max_rows : max_tokens;
    for (size_t n = 1; n <= nmax; n++) {
        size_t longest = max_tokens / n; /* the runtime keeps n x longest <= max_tokens */
        if (longest > max_len) longest = max_len;
        if (longest == 0) break;
        size_t b = attn_bytes(be->es, n, round_up(longest, ATTN_ALIGN), heads, dh);
        if (b > most) most = b;
    }
    return most;
}

int cuda_attention(void *cp, const struct bk_attention *a)
{
    struct cuda_ctx *c = cp;
    const struct cuda_be *be = c->be;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if ((rc = seqs_ok(c, a->s, "attention")) < 0) return rc;
    const struct bk_seqs *s = a->s;
    size_t n = s->n, Lp = round_up(s->longest, ATTN_ALIGN), H = a->heads * a->dh;
    size_t ldo = a->ldo ? a->ldo : H;
    if (!a->qkv || !a->out || !a->scratch || !a->heads || !a->dh || !a->kv_heads ||
        a->heads % a->kv_heads || n * a->heads > 0x7fffffffu || ldo < H)
        return cx_refuse(c, "attention: %zu heads of %zu over %zu key/value heads, %zu "
                         "sequences: bad sizes or a missing buffer", a->heads, a->dh, a->kv_heads,
                         n);
    size_t kvw = a->kv_heads * a->dh;
    if (a->ld < a->q_col + H || a->ld < a->k_col + kvw || a->ld < a->v_col + kvw)
        return cx_refuse(c, "attention: columns q %zu, k %zu, v %zu past the rows' %zu",
                         a->q_col, a->k_col, a->v_col, a->ld);
    if (a->rel_bias && (!a->rel_span || (rc = weight_ok(c, a->rel_bias, BK_W_F32,
                                                        a->heads * (2 * a->rel_span - 1),
                                                        "relative-position bias")) < 0))
        return rc < 0 ? rc : cx_refuse(c, "attention: a relative-position bias of span 0");
    size_t qb = round_up(n * a->heads * Lp * a->dh * be->es, 256);
    char *q = a->scratch, *k = q + qb, *v = k + qb, *scores = v + qb;
    int32_t nb = (int32_t)(n * a->heads);
    if ((rc = CX(c, kc_attn_gather(c->stream, be->kt, a->qkv, a->ld, a->q_col, a->k_col,
                                   a->v_col, s->offsets, n, a->heads, a->kv_heads, Lp, a->dh, q,
                                   k, v))) < 0)
        return rc;
    /* Per (sequence, head): S [Lp,Lp] = scale Q K^T. */
    const struct bk_gemm qk = {
        .m = Lp, .n = Lp, .k = a->dh, .batch = (size_t)nb, .alpha = a->scale,
        .a = q, .lda = a->dh, .stride_a = Lp * a->dh,
        .b = k, .trans_b = 1, .ldb = a->dh, .stride_b = Lp * a->dh,
        .c = scores, .ldc = Lp, .stride_c = Lp * Lp,
    };
    if ((rc = cuda_gemm(c, &qk)) < 0 ||
        (rc = CX(c, kc_attn_softmax(c->stream, be->kt, scores, s->offsets, n, a->heads, Lp,
                                    a->causal, f32_of(a->rel_bias), a->rel_span))) < 0)
        return rc;
    /* C [Lp,dh] = P V, into q's buffer (q is spent once the scores are). */
    const struct bk_gemm pv = {
        .m = Lp, .n = a->dh, .k = Lp, .batch = (size_t)nb,
        .a = scores, .lda = Lp, .stride_a = Lp * Lp,
        .b = v, .ldb = a->dh, .stride_b = Lp * a->dh,
        .c = q, .ldc = a->dh, .stride_c = Lp * a->dh,
    };
    if ((rc = cuda_gemm(c, &pv)) < 0) return rc;
    return CX(c, kc_attn_scatter(c->stream, be->kt, q, s->seq, s->pos, s->tokens, a->heads, Lp,
                                 a->dh, a->out, ldo));
}

int cuda_rope(void *cp, void *x, size_t rows, size_t ld, size_t col, size_t heads, size_t dh,
              const uint32_t *pos, const struct bk_weight *inv_freq)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!x || !pos || !inv_freq || !rows || !heads || !dh || dh % 2 || ld < col + heads * dh)
        return cx_refuse(c, "rope: %zu rows of %zu heads of %zu at column %zu of %zu", rows,
                         heads, dh, col, ld);
    if ((rc = weight_ok(c, inv_freq, BK_W_F32, dh / 2, "rope frequencies")) < 0) return rc;
    return CX(c, kc_rope(c->stream, c->be->kt, x, rows, ld, col, heads, dh, pos,
                         f32_of(inv_freq)));
}

int cuda_act(void *cp, void *x, size_t n, enum bk_act act)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if ((unsigned)act >= BK_N_ACTS) return cx_refuse(c, "act: activation %d", (int)act);
    if (act == BK_ACT_NONE || n == 0) return 0;
    if (!x) return cx_refuse(c, "act: no buffer");
    return CX(c, kc_bias_act(c->stream, c->be->kt, x, n, NULL, 1, n, cuda_kc_act(act)));
}

int cuda_softmax(void *cp, void *x, size_t rows, size_t w)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!x || !rows || !w) return cx_refuse(c, "softmax: %zu x %zu", rows, w);
    return CX(c, kc_softmax(c->stream, c->be->kt, x, rows, w));
}

int cuda_l2norm(void *cp, void *x, size_t rows, size_t w)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!x || !rows || !w) return cx_refuse(c, "l2norm: %zu x %zu", rows, w);
    return CX(c, kc_l2norm(c->stream, c->be->kt, x, rows, w));
}

int cuda_pool(void *cp, void *y, const void *x, const struct bk_seqs *s, enum bk_pool mode,
              size_t w)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if ((rc = seqs_ok(c, s, "pool")) < 0) return rc;
    if (!y || !x || !w || (unsigned)mode >= BK_N_POOLS)
        return cx_refuse(c, "pool: mode %d over %zu columns", (int)mode, w);
    static const enum kc_pool kp[BK_N_POOLS] = {
        [BK_POOL_FIRST] = KC_POOL_FIRST, [BK_POOL_MEAN] = KC_POOL_MEAN,
        [BK_POOL_MAX] = KC_POOL_MAX, [BK_POOL_LAST] = KC_POOL_LAST};
    return CX(c, kc_pool(c->stream, c->be->kt, x, s->offsets, s->n, w, kp[mode], y, 0));
}

/* ---- decoding ---------------------------------------------------------------- */

int cuda_swiglu(void *cp, void *y, const void *x, size_t rows, size_t w)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!y || !x || !rows || !w) return cx_refuse(c, "swiglu: %zu rows of %zu", rows, w);
    return CX(c, kc_swiglu(c->stream, c->be->kt, y, x, rows, w));
}

/* The paged cache (the activation type, in blocks; backend.h's bk_kv): the token's
 * slot is found on the device from its table, so what the host can check
 * is the shapes; a slot the table does not hold shows as NaN in the
 * attention's output (cuda_kernels.h). */
static int kv_ok(struct cuda_ctx *c, const struct bk_kv *kv, const struct bk_seqs *s,
                 const char *what)
{
    if (!kv || !kv->k || !kv->v || !kv->tables || !kv->block_tokens || !kv->kv_heads ||
        !kv->dh || !kv->table_w || !kv->blocks)
        return cx_refuse(c, "%s: no cache", what);
    if (!s || !s->tokens || !s->seq || !s->pos || s->tokens > 0x7fffffffu)
        return cx_refuse(c, "%s: an empty or incomplete batch of tokens", what);
    return 0;
}

int cuda_kv_store(void *cp, const struct bk_kv *kv, const void *k, size_t ldk, const void *v,
                  size_t ldv, const struct bk_seqs *s, const struct bk_weight *rope)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if ((rc = kv_ok(c, kv, s, "kv_store")) < 0) return rc;
    size_t row = kv->kv_heads * kv->dh;
    if (!k || !v || ldk < row || ldv < row)
        return cx_refuse(c, "kv_store: rows of %zu with leading dimensions %zu and %zu", row,
                         ldk, ldv);
    if (rope && (kv->dh % 2 ||
                 (rc = weight_ok(c, rope, BK_W_F32, kv->dh / 2, "kv_store's rope")) < 0))
        return rc < 0 ? rc : cx_refuse(c, "kv_store: rope over heads of %zu", kv->dh);
    return CX(c, kc_kv_store(c->stream, c->be->kt, kv->k, kv->v, k, ldk, v, ldv, s->seq, s->pos,
                             s->tokens, kv->tables, kv->table_w, kv->block_tokens, kv->blocks,
                             row, kv->dh, rope ? f32_of(rope) : NULL));
}

/* The kernel keeps its scores in shared memory a tile at a time; the
 * scratch holds the parts of a context split over blocks (few rows). */
size_t cuda_paged_attention_scratch(void *be, size_t max_tokens, size_t max_ctx, size_t heads)
{
    (void)be;
    (void)max_ctx;
    return kc_paged_attention_scratch(max_tokens, heads);
}

int cuda_paged_attention(void *cp, const struct bk_paged_attention *a)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!a) return cx_refuse(c, "paged attention: no arguments");
    if ((rc = kv_ok(c, a->kv, a->s, "paged attention")) < 0) return rc;
    const struct bk_kv *kv = a->kv;
    if (!a->q || !a->out || !a->heads || a->heads % kv->kv_heads || kv->dh > KC_PAGED_MAX_DH ||
        a->ldq < a->heads * kv->dh || a->ldo < a->heads * kv->dh || !a->max_ctx)
        return cx_refuse(c, "paged attention: %zu heads of %zu over %zu cache heads (at most "
                         "%d values a head)", a->heads, kv->dh, kv->kv_heads, KC_PAGED_MAX_DH);
    if (a->s->lone > a->s->tokens || (a->s->n && a->s->lone > a->s->n))
        return cx_refuse(c, "paged attention: %zu lone tokens of %zu in %zu sequences",
                         a->s->lone, a->s->tokens, a->s->n);
    return CX(c, kc_paged_attention(c->stream, c->be->kt, a->q, a->ldq, a->s->tokens, a->heads,
                                    a->heads / kv->kv_heads, a->scale, kv->k, kv->v, a->s->seq,
                                    a->s->pos, kv->tables, kv->table_w, kv->block_tokens,
                                    kv->blocks, kv->kv_heads, kv->dh, a->max_ctx, a->out,
                                    a->ldo, a->scratch, a->s->n, a->s->lone));
}

/* ---- sampling ------------------------------------------------------------------ */

/* The kernel reads backend.h's rows and writes its results as they are. */
#define SAME_FIELD(f) offsetof(struct bk_sample_row, f) == offsetof(struct kc_sample_row, f)
_Static_assert(sizeof(struct bk_sample_row) == sizeof(struct kc_sample_row) &&
               SAME_FIELD(temperature) && SAME_FIELD(top_k) && SAME_FIELD(top_p) &&
               SAME_FIELD(min_p) && SAME_FIELD(u) && SAME_FIELD(flags) &&
               BK_SAMPLE_ON == KC_SAMPLE_ON && BK_SAMPLE_LOGPROB == KC_SAMPLE_LOGPROB,
               "bk_sample_row and kc_sample_row differ");
_Static_assert(sizeof(struct bk_sample_out) == sizeof(struct kc_sample_out) &&
               offsetof(struct bk_sample_out, logprob) == offsetof(struct kc_sample_out, logprob),
               "bk_sample_out and kc_sample_out differ");
#undef SAME_FIELD

/* The rows' parameters, then their results, on a 256-byte boundary. */
static size_t sample_out_at(size_t rows)
{
    return round_up(rows * sizeof(struct kc_sample_row), 256);
}

size_t cuda_sample_scratch(void *be, size_t max_rows)
{
    (void)be;
    return sample_out_at(max_rows) + round_up(max_rows * sizeof(struct kc_sample_out), 256);
}

/* The parameters go up, the kernel chooses, the results come down: three
 * calls on the stream, the host buffers read and written in its order. */
int cuda_sample(void *cp, const struct bk_sample *a)
{
    struct cuda_ctx *c = cp;
    int rc = cx_live(c);
    if (rc < 0) return rc;
    if (!a || !a->logits || !a->params || !a->out || !a->scratch || !a->rows || !a->vocab ||
        a->ld < a->vocab || a->rows > 0x7fffffffu || a->vocab > 0x7fffffffu)
        return cx_refuse(c, "sample: %zu rows of %zu logits: bad sizes or a missing buffer",
                         a ? a->rows : 0, a ? a->vocab : 0);
    struct kc_sample_row *dp = a->scratch;
    struct kc_sample_out *dout = (void *)((char *)a->scratch + sample_out_at(a->rows));
    if ((rc = CX(c, cudaMemcpyAsync(dp, a->params, a->rows * sizeof(*dp),
                                    cudaMemcpyHostToDevice, c->stream))) < 0 ||
        (rc = CX(c, kc_sample(c->stream, c->be->kt, a->logits, a->ld, a->rows, a->vocab, dp,
                              dout, a->ids))) < 0)
        return rc;
    return CX(c, cudaMemcpyAsync(a->out, dout, a->rows * sizeof(*dout), cudaMemcpyDeviceToHost,
                                 c->stream));
}

/* backend_cpu.c - the CPU backend of backend.h: OpenBLAS for the dense
 * layers (one cblas_sgemm per layer for the whole batch) and plain loops
 * for the rest, with PyTorch's semantics. Encoders run on packed
 * sequences: every projection and the feed-forward is one GEMM over all
 * the batch's tokens, attention one pair of GEMMs per sequence and head,
 * so padding costs nothing. The only file in kinfer that includes
 * OpenBLAS.
 *
 * Threads: open/close/model_new/model_free on the main thread; a model's
 * float32 weights are never written after model_new, so every executor
 * shares them, each with its own workspace. OpenBLAS's thread count is
 * process-wide: the last open sets it.
 *
 * Ownership: a cpu_model owns its float32 copy of every weight (converted
 * from F32/F16/BF16 once, at load; an encoder's Q, K and V stacked); a
 * cpu_ws owns its input buffer and its two ping-pong activation buffers
 * (an encoder's: its token buffers); the output pointer forward and
 * encode hand back points into them. */
#include "backend.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One layer with its weights as float32. */
struct cpu_layer {
    enum model_op op;
    size_t in, out;
    float *w;   /* dense [out,in]; layernorm [in] or NULL (= ones) */
    float *b;   /* dense [out] or NULL; layernorm [in] or NULL (= zeros) */
    float eps;
};

/* One encoder layer with its weights as float32; query, key and value
 * are stacked into one [3H,H] matrix so a single GEMM projects all three. */
struct cpu_bert_layer {
    float *qkv_w, *qkv_b;             /* [3H,H], [3H] */
    float *ao_w, *ao_b;               /* attention output [H,H], [H] */
    float *ln1_w, *ln1_b;
    float *i_w, *i_b;                 /* feed-forward in [I,H], [I] */
    float *o_w, *o_b;                 /* feed-forward out [H,I], [H] */
    float *ln2_w, *ln2_b;
};

/* A BERT encoder with its weights as float32. */
struct cpu_bert {
    size_t vocab, hidden, heads, inter, max_pos, type_vocab, n_layers, n_labels;
    float eps;
    int gelu_tanh, normalize, sigmoid;
    enum model_pooling pooling;
    enum model_head head;
    float *word, *pos, *type, *emb_ln_w, *emb_ln_b;
    struct cpu_bert_layer *layers;
    float *pool_w, *pool_b, *cls_w, *cls_b; /* classifier head */
};

struct cpu_model {
    size_t n_layers;
    struct cpu_layer *layers;
    size_t in_w, max_w;
    struct cpu_bert *bert;  /* an encoder (then no layers) */
};

/* The encoder's feed-forward runs this many tokens at a time, so its
 * [tokens, I] intermediate stays small whatever the batch. */
#define CPU_FFN_CHUNK 1024

struct cpu_ws {
    const struct cpu_model *m;
    size_t max_rows;
    int fault;      /* armed by inject_fault: the next forward fails */
    float *input;   /* max_rows * in_w: where callers may pack a batch */
    float *buf[2];  /* max_rows * max_w each */
    /* An encoder's, for max_tokens tokens in all: */
    size_t max_tokens;
    float *x;       /* [T,H] hidden states */
    float *qkv;     /* [T,3H] projections; then [T,H] of attention output */
    float *ctx;     /* [T,H] attention context; then the feed-forward's output */
    float *inter;   /* [CPU_FFN_CHUNK, I] */
    float *scores;  /* [L,L] for the longest sequence */
    float *pooled;  /* [max_rows, max(H, labels)] the result */
};

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
    (void)errstr;
    (void)errstr_size;
    static int marker;
    if (c->cpu_threads > 0) openblas_set_num_threads(c->cpu_threads);
    int n = openblas_get_num_threads();
    snprintf(desc, desc_size, "cpu: OpenBLAS (%s), %d thread%s per pass",
             openblas_get_config(), n, n == 1 ? "" : "s");
    return &marker;
}

static void cpu_close(void *be)
{
    (void)be;
}

/* A new float32 array holding t's values, or NULL when out of memory. */
static float *cpu_convert(const struct st_tensor *t)
{
    float *p = malloc((size_t)t->numel * sizeof(float));
    if (p) st_to_f32(t, p); /* the loader checked the dtype is loadable */
    return p;
}

static void cpu_bert_free(struct cpu_bert *b)
{
    if (!b) return;
    for (size_t i = 0; b->layers && i < b->n_layers; i++) {
        struct cpu_bert_layer *L = &b->layers[i];
        float *all[] = {L->qkv_w, L->qkv_b, L->ao_w, L->ao_b, L->ln1_w, L->ln1_b,
                        L->i_w,   L->i_b,   L->o_w,  L->o_b,  L->ln2_w, L->ln2_b};
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) free(all[k]);
    }
    free(b->layers);
    float *all[] = {b->word,   b->pos,    b->type,  b->emb_ln_w, b->emb_ln_b,
                    b->pool_w, b->pool_b, b->cls_w, b->cls_b};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) free(all[k]);
    free(b);
}

/* Three [H,H] (or [H]) tensors stacked into one new array. */
static float *cpu_stack3(const struct st_tensor *a, const struct st_tensor *b,
                         const struct st_tensor *c)
{
    size_t n = (size_t)a->numel;
    float *p = malloc(3 * n * sizeof(float));
    if (!p) return NULL;
    st_to_f32(a, p);
    st_to_f32(b, p + n);
    st_to_f32(c, p + 2 * n);
    return p;
}

/* Converts the validated encoder (gpu/bert.c checked every shape). */
static struct cpu_bert *cpu_bert_new(const struct backend_bert *s)
{
    struct cpu_bert *b = calloc(1, sizeof(*b));
    if (!b) return NULL;
    b->vocab = s->vocab;
    b->hidden = s->hidden;
    b->heads = s->heads;
    b->inter = s->intermediate;
    b->max_pos = s->max_pos;
    b->type_vocab = s->type_vocab;
    b->n_layers = s->n_layers;
    b->n_labels = s->n_labels;
    b->eps = s->ln_eps;
    b->gelu_tanh = s->gelu_tanh;
    b->normalize = s->normalize;
    b->sigmoid = s->sigmoid;
    b->pooling = s->pooling;
    b->head = s->head;
    if (!(b->word = cpu_convert(s->word)) || !(b->pos = cpu_convert(s->pos)) ||
        !(b->type = cpu_convert(s->type)) || !(b->emb_ln_w = cpu_convert(s->emb_ln_w)) ||
        !(b->emb_ln_b = cpu_convert(s->emb_ln_b)) ||
        !(b->layers = calloc(s->n_layers, sizeof(*b->layers))))
        goto oom;
    for (size_t i = 0; i < s->n_layers; i++) {
        const struct backend_bert_layer *S = &s->layers[i];
        struct cpu_bert_layer *L = &b->layers[i];
        if (!(L->qkv_w = cpu_stack3(S->q_w, S->k_w, S->v_w)) ||
            !(L->qkv_b = cpu_stack3(S->q_b, S->k_b, S->v_b)) ||
            !(L->ao_w = cpu_convert(S->ao_w)) || !(L->ao_b = cpu_convert(S->ao_b)) ||
            !(L->ln1_w = cpu_convert(S->ln1_w)) || !(L->ln1_b = cpu_convert(S->ln1_b)) ||
            !(L->i_w = cpu_convert(S->i_w)) || !(L->i_b = cpu_convert(S->i_b)) ||
            !(L->o_w = cpu_convert(S->o_w)) || !(L->o_b = cpu_convert(S->o_b)) ||
            !(L->ln2_w = cpu_convert(S->ln2_w)) || !(L->ln2_b = cpu_convert(S->ln2_b)))
            goto oom;
    }
    if (s->head == MODEL_HEAD_CLASSIFIER &&
        (!(b->pool_w = cpu_convert(s->pool_w)) || !(b->pool_b = cpu_convert(s->pool_b)) ||
         !(b->cls_w = cpu_convert(s->cls_w)) || !(b->cls_b = cpu_convert(s->cls_b))))
        goto oom;
    return b;
oom:
    cpu_bert_free(b);
    return NULL;
}

static void cpu_model_free(void *be, void *bm)
{
    (void)be;
    struct cpu_model *m = bm;
    if (!m) return;
    cpu_bert_free(m->bert);
    for (size_t i = 0; m->layers && i < m->n_layers; i++) {
        free(m->layers[i].w);
        free(m->layers[i].b);
    }
    free(m->layers);
    free(m);
}

/* Converts every weight to float32 once, so the forward pass reads them
 * as they are. */
static void *cpu_model_new(void *be, const struct backend_plan *p, char *errstr,
                           size_t errstr_size)
{
    struct cpu_model *m = calloc(1, sizeof(*m));
    if (!m) goto oom;
    if (p->bert) {
        if (!(m->bert = cpu_bert_new(p->bert))) goto oom;
        return m;
    }
    if (!(m->layers = calloc(p->n_layers, sizeof(*m->layers)))) goto oom;
    m->n_layers = p->n_layers;
    m->in_w = p->in_w;
    m->max_w = p->max_w;
    for (size_t i = 0; i < p->n_layers; i++) {
        const struct backend_layer *s = &p->layers[i];
        struct cpu_layer *L = &m->layers[i];
        L->op = s->op;
        L->in = s->in;
        L->out = s->out;
        L->eps = s->eps;
        if ((s->w && !(L->w = cpu_convert(s->w))) || (s->b && !(L->b = cpu_convert(s->b))))
            goto oom;
    }
    return m;
oom:
    snprintf(errstr, errstr_size, "model %s: out of memory converting its weights", p->name);
    cpu_model_free(be, m);
    return NULL;
}

static void cpu_ws_free(void *wsp)
{
    struct cpu_ws *ws = wsp;
    if (!ws) return;
    free(ws->input);
    free(ws->buf[0]);
    free(ws->buf[1]);
    free(ws->x);
    free(ws->qkv);
    free(ws->ctx);
    free(ws->inter);
    free(ws->scores);
    free(ws->pooled);
    free(ws);
}

/* Both activation buffers hold the widest activation of any layer for
 * max_rows rows: dense reads one and writes the other, every other op
 * works in place. The slot does not matter on the CPU. */
static void *cpu_ws_new(void *be, void *bm, const struct backend_plan *p, unsigned slot,
                        size_t max_rows, size_t max_tokens, char *errstr, size_t errstr_size)
{
    (void)be;
    (void)slot;
    struct cpu_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) goto oom;
    ws->m = bm;
    ws->max_rows = max_rows;
    const struct cpu_bert *b = ws->m->bert;
    if (b) {
        /* model.c checked max_tokens x the widest activation fits. */
        size_t H = b->hidden, T = max_tokens;
        size_t longest = T < b->max_pos ? T : b->max_pos;
        size_t chunk = T < CPU_FFN_CHUNK ? T : CPU_FFN_CHUNK;
        size_t out_w = b->n_labels > H ? b->n_labels : H;
        ws->max_tokens = T;
        ws->x = malloc(T * H * sizeof(float));
        ws->qkv = malloc(T * 3 * H * sizeof(float));
        ws->ctx = malloc(T * H * sizeof(float));
        ws->inter = malloc(chunk * b->inter * sizeof(float));
        ws->scores = malloc(longest * longest * sizeof(float));
        ws->pooled = malloc(max_rows * out_w * sizeof(float));
        if (!ws->x || !ws->qkv || !ws->ctx || !ws->inter || !ws->scores || !ws->pooled)
            goto oom;
        return ws;
    }
    ws->input = calloc(max_rows * p->in_w, sizeof(float));
    ws->buf[0] = calloc(max_rows * p->max_w, sizeof(float));
    ws->buf[1] = calloc(max_rows * p->max_w, sizeof(float));
    if (!ws->input || !ws->buf[0] || !ws->buf[1]) goto oom;
    return ws;
oom:
    snprintf(errstr, errstr_size, "model %s: out of memory for a workspace of %zu rows%s",
             p->name, max_rows, p->bert ? " and its tokens" : "");
    cpu_ws_free(ws);
    return NULL;
}

static float *cpu_ws_input(void *wsp)
{
    return ((struct cpu_ws *)wsp)->input;
}

/* y = x W^T + b for the whole batch in one GEMM (row-major, W stored as
 * nn.Linear's [out,in], hence Trans): the bias is copied into y first and
 * added through beta = 1. b may be NULL. */
static void cpu_linear(const float *x, size_t rows, size_t in, const float *w, const float *b,
                       size_t out, float *y)
{
    float beta = 0.0f;
    if (b) {
        for (size_t r = 0; r < rows; r++) memcpy(y + r * out, b, out * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)out, (int)in, 1.0f, x,
                (int)in, w, (int)in, beta, y, (int)out);
}

static void cpu_dense(const struct cpu_layer *L, const float *x, float *y, size_t rows)
{
    cpu_linear(x, rows, L->in, L->w, L->b, L->out, y);
}

/* Elementwise ops over n values; y may equal x. relu keeps NaN as
 * PyTorch does. gelu uses erfc(-x/sqrt 2), equal to 1 + erf(x/sqrt 2) but
 * without its cancellation for negative x. sigmoid takes the branch whose
 * exp cannot overflow. */
static void cpu_pointwise(enum model_op op, const float *x, float *y, size_t n)
{
    switch (op) {
    case MODEL_OP_RELU:
        for (size_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
        break;
    case MODEL_OP_GELU:
        for (size_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * erfcf(-x[i] * 0.70710678118654752f);
        break;
    case MODEL_OP_TANH:
        for (size_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
        break;
    case MODEL_OP_SIGMOID:
        for (size_t i = 0; i < n; i++) {
            if (x[i] >= 0.0f) {
                y[i] = 1.0f / (1.0f + expf(-x[i]));
            } else {
                float e = expf(x[i]);
                y[i] = e / (1.0f + e);
            }
        }
        break;
    default:
        break;
    }
}

/* Layernorm of one row of w values (biased variance, as PyTorch); sums in
 * double so wide rows lose no precision. g and b may be NULL (ones and
 * zeros). y may equal x. */
static void cpu_layernorm_row(const float *g, const float *b, float eps, const float *x,
                              float *y, size_t w)
{
    double mean = 0.0, var = 0.0;
    for (size_t i = 0; i < w; i++) mean += x[i];
    mean /= (double)w;
    for (size_t i = 0; i < w; i++) {
        double d = x[i] - mean;
        var += d * d;
    }
    var /= (double)w;
    double inv = 1.0 / sqrt(var + (double)eps);
    for (size_t i = 0; i < w; i++) {
        double v = (x[i] - mean) * inv;
        if (g) v *= g[i];
        if (b) v += b[i];
        y[i] = (float)v;
    }
}

/* Softmax of one row, shifted by its max so exp cannot overflow. y may
 * equal x. */
static void cpu_softmax_row(const float *x, float *y, size_t w)
{
    float mx = x[0];
    for (size_t i = 1; i < w; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (size_t i = 0; i < w; i++) {
        y[i] = expf(x[i] - mx);
        sum += y[i];
    }
    double inv = 1.0 / sum;
    for (size_t i = 0; i < w; i++) y[i] = (float)(y[i] * inv);
}

/* x / max(||x||_2, 1e-12) of one row, as F.normalize. y may equal x. */
static void cpu_l2norm_row(const float *x, float *y, size_t w)
{
    double ss = 0.0;
    for (size_t i = 0; i < w; i++) ss += (double)x[i] * x[i];
    double norm = sqrt(ss);
    double inv = 1.0 / (norm > 1e-12 ? norm : 1e-12);
    for (size_t i = 0; i < w; i++) y[i] = (float)(x[i] * inv);
}

/* Ping-pongs between the two workspace buffers: dense writes the buffer
 * it does not read, the other ops rewrite in place; the caller's input is
 * never written. Nothing here can fail: the caller checked the rows. */
static int cpu_forward(void *wsp, const float *in, size_t rows, const float **out,
                       char *errstr, size_t errstr_size)
{
    struct cpu_ws *ws = wsp;
    if (ws->fault) {
        /* The fault tests' stand-in for a dead device: what the worker
         * does next (drop the batch, exit 2) is the same. */
        ws->fault = 0;
        snprintf(errstr, errstr_size, "injected device fault (debug.device_fault_id)");
        return MODEL_EFATAL;
    }
    const struct cpu_model *m = ws->m;
    float *cur = NULL; /* buffer holding the activations; NULL = still `in` */
    size_t w = m->in_w;
    for (size_t li = 0; li < m->n_layers; li++) {
        const struct cpu_layer *L = &m->layers[li];
        const float *src = cur ? cur : in;
        if (L->op == MODEL_OP_DENSE) {
            float *dst = cur == ws->buf[0] ? ws->buf[1] : ws->buf[0];
            cpu_dense(L, src, dst, rows);
            cur = dst;
            w = L->out;
            continue;
        }
        float *dst = cur ? cur : ws->buf[0];
        switch (L->op) {
        case MODEL_OP_LAYERNORM:
            for (size_t r = 0; r < rows; r++)
                cpu_layernorm_row(L->w, L->b, L->eps, src + r * w, dst + r * w, w);
            break;
        case MODEL_OP_SOFTMAX:
            for (size_t r = 0; r < rows; r++) cpu_softmax_row(src + r * w, dst + r * w, w);
            break;
        case MODEL_OP_L2NORM:
            for (size_t r = 0; r < rows; r++) cpu_l2norm_row(src + r * w, dst + r * w, w);
            break;
        default:
            cpu_pointwise(L->op, src, dst, rows * w);
            break;
        }
        cur = dst;
    }
    *out = cur;
    return MODEL_OK;
}

/* ---- encoders ------------------------------------------------------------ */

/* gelu in place: erf (hidden_act "gelu"), or the tanh approximation. */
static void cpu_gelu(float *x, size_t n, int tanh_approx)
{
    if (!tanh_approx) {
        cpu_pointwise(MODEL_OP_GELU, x, x, n);
        return;
    }
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
}

/* Word + position + token type embeddings, then their LayerNorm, into
 * ws->x; positions restart at 0 for every sequence. */
static void cpu_bert_embed(const struct cpu_bert *b, const struct model_seqs *s, float *x)
{
    size_t H = b->hidden;
    for (size_t i = 0; i < s->n; i++) {
        for (size_t t = s->offsets[i]; t < s->offsets[i + 1]; t++) {
            const float *w = b->word + (size_t)s->ids[t] * H;
            const float *p = b->pos + (t - s->offsets[i]) * H;
            const float *ty = b->type + (s->type_ids ? (size_t)s->type_ids[t] : 0) * H;
            float *row = x + t * H;
            for (size_t k = 0; k < H; k++) row[k] = w[k] + p[k] + ty[k];
            cpu_layernorm_row(b->emb_ln_w, b->emb_ln_b, b->eps, row, row, H);
        }
    }
}

/* Scaled dot-product attention of every sequence and head, from the
 * packed [T,3H] projections into ctx [T,H]. A sequence sees only its own
 * tokens, which is what a padded batch with its padding masked computes,
 * without the padding's cost. */
static void cpu_bert_attention(const struct cpu_bert *b, const struct model_seqs *s,
                               const float *qkv, float *ctx, float *scores)
{
    size_t H = b->hidden, dh = H / b->heads, ld = 3 * H;
    float scale = 1.0f / sqrtf((float)dh);
    for (size_t i = 0; i < s->n; i++) {
        size_t o = s->offsets[i], L = s->offsets[i + 1] - o;
        for (size_t h = 0; h < b->heads; h++) {
            const float *q = qkv + o * ld + h * dh;
            const float *k = q + H, *v = q + 2 * H;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)L, (int)L, (int)dh, scale,
                        q, (int)ld, k, (int)ld, 0.0f, scores, (int)L);
            for (size_t r = 0; r < L; r++) cpu_softmax_row(scores + r * L, scores + r * L, L);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)L, (int)dh, (int)L, 1.0f,
                        scores, (int)L, v, (int)ld, 0.0f, ctx + o * H + h * dh, (int)H);
        }
    }
}

/* x = LayerNorm(x + y), row by row. */
static void cpu_add_layernorm(float *x, const float *y, const float *g, const float *bias,
                              float eps, size_t rows, size_t w)
{
    for (size_t r = 0; r < rows; r++) {
        float *row = x + r * w;
        const float *add = y + r * w;
        for (size_t k = 0; k < w; k++) row[k] += add[k];
        cpu_layernorm_row(g, bias, eps, row, row, w);
    }
}

/* One post-LayerNorm encoder layer over all T packed tokens. */
static void cpu_bert_layer(const struct cpu_bert *b, const struct cpu_bert_layer *L,
                           const struct model_seqs *s, struct cpu_ws *ws, size_t T)
{
    size_t H = b->hidden, inter = b->inter;
    cpu_linear(ws->x, T, H, L->qkv_w, L->qkv_b, 3 * H, ws->qkv);
    cpu_bert_attention(b, s, ws->qkv, ws->ctx, ws->scores);
    float *attn = ws->qkv; /* the projections are spent */
    cpu_linear(ws->ctx, T, H, L->ao_w, L->ao_b, H, attn);
    cpu_add_layernorm(ws->x, attn, L->ln1_w, L->ln1_b, b->eps, T, H);
    for (size_t c = 0; c < T; c += CPU_FFN_CHUNK) {
        size_t rows = T - c < CPU_FFN_CHUNK ? T - c : CPU_FFN_CHUNK;
        cpu_linear(ws->x + c * H, rows, H, L->i_w, L->i_b, inter, ws->inter);
        cpu_gelu(ws->inter, rows * inter, b->gelu_tanh);
        cpu_linear(ws->inter, rows, inter, L->o_w, L->o_b, H, ws->ctx + c * H);
    }
    cpu_add_layernorm(ws->x, ws->ctx, L->ln2_w, L->ln2_b, b->eps, T, H);
}

/* Sequence i's tokens pooled into one row of H values (cls, masked mean,
 * max: only the sequence's own tokens ever count). */
static void cpu_bert_pool(const struct cpu_bert *b, const struct model_seqs *s, size_t i,
                          const float *x, float *out)
{
    size_t H = b->hidden, o = s->offsets[i], L = s->offsets[i + 1] - o;
    const float *first = x + o * H;
    if (b->pooling == MODEL_POOL_CLS) {
        memcpy(out, first, H * sizeof(float));
    } else if (b->pooling == MODEL_POOL_MAX) {
        memcpy(out, first, H * sizeof(float));
        for (size_t t = 1; t < L; t++)
            for (size_t k = 0; k < H; k++)
                if (first[t * H + k] > out[k]) out[k] = first[t * H + k];
    } else {
        for (size_t k = 0; k < H; k++) {
            double sum = 0.0;
            for (size_t t = 0; t < L; t++) sum += first[t * H + k];
            out[k] = (float)(sum / (double)L);
        }
    }
}

/* Embeddings, the layers, then the head: pooled (and normalized)
 * embeddings, every token's vector, or the classifier's scores. */
static int cpu_encode(void *wsp, const struct model_seqs *s, const float **out, char *errstr,
                      size_t errstr_size)
{
    struct cpu_ws *ws = wsp;
    if (ws->fault) {
        ws->fault = 0;
        snprintf(errstr, errstr_size, "injected device fault (debug.device_fault_id)");
        return MODEL_EFATAL;
    }
    const struct cpu_bert *b = ws->m->bert;
    size_t H = b->hidden, T = s->offsets[s->n];
    cpu_bert_embed(b, s, ws->x);
    for (size_t l = 0; l < b->n_layers; l++) cpu_bert_layer(b, &b->layers[l], s, ws, T);
    if (b->head == MODEL_HEAD_CLASSIFIER) {
        /* The pooler reads [CLS]: tanh(W x + b); then the classifier. */
        float *cls = ws->ctx, *pooled = ws->qkv;
        for (size_t i = 0; i < s->n; i++)
            memcpy(cls + i * H, ws->x + (size_t)s->offsets[i] * H, H * sizeof(float));
        cpu_linear(cls, s->n, H, b->pool_w, b->pool_b, H, pooled);
        cpu_pointwise(MODEL_OP_TANH, pooled, pooled, s->n * H);
        cpu_linear(pooled, s->n, H, b->cls_w, b->cls_b, b->n_labels, ws->pooled);
        size_t nl = b->n_labels;
        for (size_t i = 0; i < s->n; i++) {
            float *row = ws->pooled + i * nl;
            if (b->sigmoid) cpu_pointwise(MODEL_OP_SIGMOID, row, row, nl);
            else cpu_softmax_row(row, row, nl);
        }
        *out = ws->pooled;
        return MODEL_OK;
    }
    if (b->pooling == MODEL_POOL_NONE) {
        if (b->normalize)
            for (size_t t = 0; t < T; t++) cpu_l2norm_row(ws->x + t * H, ws->x + t * H, H);
        *out = ws->x;
        return MODEL_OK;
    }
    for (size_t i = 0; i < s->n; i++) {
        cpu_bert_pool(b, s, i, ws->x, ws->pooled + i * H);
        if (b->normalize) cpu_l2norm_row(ws->pooled + i * H, ws->pooled + i * H, H);
    }
    *out = ws->pooled;
    return MODEL_OK;
}

static void cpu_inject_fault(void *wsp)
{
    ((struct cpu_ws *)wsp)->fault = 1;
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
    (void)be;
    return "fp32";
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

const struct backend_ops backend_cpu = {
    .name = "cpu",
    .compiled_in = 1,
    .encoder_pads = 0,
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .model_new = cpu_model_new,
    .model_free = cpu_model_free,
    .ws_new = cpu_ws_new,
    .ws_free = cpu_ws_free,
    .ws_input = cpu_ws_input,
    .forward = cpu_forward,
    .encode = cpu_encode,
    .inject_fault = cpu_inject_fault,
    .executors = cpu_executors,
    .precision = cpu_precision,
    .devices = cpu_devices,
    .device_stats = cpu_device_stats,
};

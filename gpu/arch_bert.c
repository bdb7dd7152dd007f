/* arch_bert.c - BERT encoders (config.json model_type "bert"), as
 * Hugging Face's BertModel defines them: word + absolute position +
 * token type embeddings and their LayerNorm, then post-LayerNorm layers
 * of self-attention and a GELU feed-forward; the runtime's head at the
 * end (pooling, or BertForSequenceClassification's pooler and classifier).
 *
 * Tensors by their BertModel names, with or without the "bert." prefix
 * (LayerNorm's old gamma/beta names too); query, key and value are
 * stacked into one [3H,H] weight so one GEMM projects all three.
 *
 * Threads and ownership: as arch.h says; a bert_model owns every copy of
 * its weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"

/* One layer's tensors, as the file names them under encoder.layer.i. */
struct bert_tensors {
    const struct st_tensor *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *ao_w, *ao_b, *ln1_w, *ln1_b,
        *i_w, *i_b, *o_w, *o_b, *ln2_w, *ln2_b;
};

/* One layer on one device. */
struct bert_layer {
    struct bk_weight *qkv_w, *qkv_b, *ao_w, *ao_b, *ln1_w, *ln1_b, *i_w, *i_b, *o_w, *o_b,
        *ln2_w, *ln2_b;
};

/* The model on one device. */
struct bert_copy {
    struct bk_weight *word, *pos, *type, *emb_ln_w, *emb_ln_b;
    struct bert_layer *layers;
    struct head_weights head;
};

struct bert_model {
    size_t vocab, hidden, heads, inter, max_pos, type_vocab, n_layers, n_labels, copies;
    float eps;
    enum bk_act act;
    struct head_conf head;
    struct bert_copy copy[MODEL_MAX_DEVICES];
};

/* The feed-forward runs this many tokens at a time, so its [tokens, I]
 * intermediate stays small whatever the batch. */
#define BERT_FFN_CHUNK 1024

struct bert_ws {
    size_t chunk;
    void *x;        /* [T,H] hidden states */
    void *qkv;      /* [T,3H] projections; then [T,H] of attention output */
    void *ctx;      /* [T,H] attention context; then the feed-forward's output */
    void *inter;    /* [chunk, I] */
    void *scratch;  /* attention's */
    struct head_ws head;
};

static const char *const bert_prefixes[] = {"bert.", NULL};

static void bert_unload(const struct arch_rt *rt, void *am)
{
    struct bert_model *m = am;
    if (!m) return;
    for (size_t d = 0; d < m->copies; d++) {
        struct bert_copy *cp = &m->copy[d];
        struct bk_weight *all[] = {cp->word, cp->pos, cp->type, cp->emb_ln_w, cp->emb_ln_b};
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) arch_weight_free(rt, all[k]);
        for (size_t i = 0; cp->layers && i < m->n_layers; i++) {
            struct bert_layer *L = &cp->layers[i];
            struct bk_weight *lw[] = {L->qkv_w, L->qkv_b, L->ao_w, L->ao_b, L->ln1_w, L->ln1_b,
                                      L->i_w,   L->i_b,   L->o_w,  L->o_b,  L->ln2_w, L->ln2_b};
            for (size_t k = 0; k < sizeof(lw) / sizeof(lw[0]); k++) arch_weight_free(rt, lw[k]);
        }
        free(cp->layers);
        head_free(rt, &cp->head);
    }
    free(m);
}

/* Sizes and settings from config.json. */
static int bert_config(struct arch_load *ld, struct bert_model *m)
{
    const char *pe = json_string_value(json_object_get(ld->config, "position_embedding_type"));
    if (pe && strcmp(pe, "absolute") != 0)
        return arch_fail(ld, "config.json: position_embedding_type \"%s\": only absolute "
                         "positions", pe);
    if (arch_cfg_size(ld, "vocab_size", 0, 1 << 24, &m->vocab) < 0 ||
        arch_cfg_size(ld, "hidden_size", 0, 1 << 16, &m->hidden) < 0 ||
        arch_cfg_size(ld, "num_hidden_layers", 0, 256, &m->n_layers) < 0 ||
        arch_cfg_size(ld, "num_attention_heads", 0, 1024, &m->heads) < 0 ||
        arch_cfg_size(ld, "intermediate_size", 0, 1 << 18, &m->inter) < 0 ||
        arch_cfg_size(ld, "max_position_embeddings", 512, 1 << 16, &m->max_pos) < 0 ||
        arch_cfg_size(ld, "type_vocab_size", 2, 1024, &m->type_vocab) < 0)
        return -1;
    if (m->hidden % m->heads)
        return arch_fail(ld, "config.json: hidden_size %zu is not a multiple of "
                         "num_attention_heads %zu", m->hidden, m->heads);
    if (arch_cfg_eps(ld, "layer_norm_eps", 1e-12, &m->eps) < 0) return -1;
    if (arch_cfg_act(ld, "hidden_act", BK_ACT_GELU, &m->act) < 0) return -1;
    if (m->act != BK_ACT_GELU && m->act != BK_ACT_GELU_TANH)
        return arch_fail(ld, "config.json: hidden_act \"%s\" is not supported (gelu, gelu_new)",
                         json_string_value(json_object_get(ld->config, "hidden_act")));
    return 0;
}

/* Layer i's tensors under encoder.layer.i. */
static int bert_read_layer(struct arch_load *ld, const struct bert_model *m, size_t i,
                           struct bert_tensors *L)
{
    size_t H = m->hidden, I = m->inter;
    char n[160];
#define T(field, suffix, d0, d1)                                                   \
    do {                                                                           \
        snprintf(n, sizeof(n), "encoder.layer.%zu.%s", i, suffix);                 \
        if (!(L->field = arch_tensor(ld, bert_prefixes, n, d0, d1))) return -1;    \
    } while (0)
    T(q_w, "attention.self.query.weight", H, H);
    T(q_b, "attention.self.query.bias", H, 0);
    T(k_w, "attention.self.key.weight", H, H);
    T(k_b, "attention.self.key.bias", H, 0);
    T(v_w, "attention.self.value.weight", H, H);
    T(v_b, "attention.self.value.bias", H, 0);
    T(ao_w, "attention.output.dense.weight", H, H);
    T(ao_b, "attention.output.dense.bias", H, 0);
    T(ln1_w, "attention.output.LayerNorm.weight", H, 0);
    T(ln1_b, "attention.output.LayerNorm.bias", H, 0);
    T(i_w, "intermediate.dense.weight", I, H);
    T(i_b, "intermediate.dense.bias", I, 0);
    T(o_w, "output.dense.weight", H, I);
    T(o_b, "output.dense.bias", H, 0);
    T(ln2_w, "output.LayerNorm.weight", H, 0);
    T(ln2_b, "output.LayerNorm.bias", H, 0);
#undef T
    return 0;
}

/* One layer's weights on copy d. */
static int bert_upload_layer(struct arch_load *ld, size_t d, const struct bert_tensors *S,
                             struct bert_layer *L)
{
    struct bk_wsrc qkv_w[3] = {{.t = S->q_w}, {.t = S->k_w}, {.t = S->v_w}};
    struct bk_wsrc qkv_b[3] = {{.t = S->q_b}, {.t = S->k_b}, {.t = S->v_b}};
    if (!(L->qkv_w = arch_weight(ld, d, BK_W_ACT, qkv_w, 3)) ||
        !(L->qkv_b = arch_weight(ld, d, BK_W_ACT, qkv_b, 3)) ||
        !(L->ao_w = arch_weight1(ld, d, BK_W_ACT, S->ao_w)) ||
        !(L->ao_b = arch_weight1(ld, d, BK_W_ACT, S->ao_b)) ||
        !(L->ln1_w = arch_weight1(ld, d, BK_W_F32, S->ln1_w)) ||
        !(L->ln1_b = arch_weight1(ld, d, BK_W_F32, S->ln1_b)) ||
        !(L->i_w = arch_weight1(ld, d, BK_W_ACT, S->i_w)) ||
        !(L->i_b = arch_weight1(ld, d, BK_W_ACT, S->i_b)) ||
        !(L->o_w = arch_weight1(ld, d, BK_W_ACT, S->o_w)) ||
        !(L->o_b = arch_weight1(ld, d, BK_W_ACT, S->o_b)) ||
        !(L->ln2_w = arch_weight1(ld, d, BK_W_F32, S->ln2_w)) ||
        !(L->ln2_b = arch_weight1(ld, d, BK_W_F32, S->ln2_b)))
        return -1;
    return 0;
}

static void *bert_load(struct arch_load *ld, struct arch_info *info)
{
    struct bert_model *m = calloc(1, sizeof(*m));
    struct bert_tensors *lt = NULL;
    if (!m) {
        arch_fail(ld, "out of memory");
        return NULL;
    }
    m->head = *ld->head;
    if (bert_config(ld, m) < 0) goto fail;
    size_t H = m->hidden;
    const struct st_tensor *word, *pos, *type, *eln_w, *eln_b;
    if (!(word = arch_tensor(ld, bert_prefixes, "embeddings.word_embeddings.weight", m->vocab, H)) ||
        !(pos = arch_tensor(ld, bert_prefixes, "embeddings.position_embeddings.weight",
                            m->max_pos, H)) ||
        !(type = arch_tensor(ld, bert_prefixes, "embeddings.token_type_embeddings.weight",
                             m->type_vocab, H)) ||
        !(eln_w = arch_tensor(ld, bert_prefixes, "embeddings.LayerNorm.weight", H, 0)) ||
        !(eln_b = arch_tensor(ld, bert_prefixes, "embeddings.LayerNorm.bias", H, 0)))
        goto fail;
    if (!(lt = calloc(m->n_layers, sizeof(*lt)))) {
        arch_fail(ld, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < m->n_layers; i++)
        if (bert_read_layer(ld, m, i, &lt[i]) < 0) goto fail;
    struct head_tensors ht = {0};
    if (m->head.head == MODEL_HEAD_CLASSIFIER &&
        head_classifier_read(ld, bert_prefixes, "pooler.dense.weight", "pooler.dense.bias",
                             "classifier.weight", "classifier.bias", H, &ht) < 0)
        goto fail;
    m->n_labels = ht.n_labels;
    m->copies = ld->rt.ops->weight_copies(ld->rt.be);
    for (size_t d = 0; d < m->copies; d++) {
        struct bert_copy *cp = &m->copy[d];
        if (!(cp->word = arch_weight1(ld, d, BK_W_ACT, word)) ||
            !(cp->pos = arch_weight1(ld, d, BK_W_ACT, pos)) ||
            !(cp->type = arch_weight1(ld, d, BK_W_ACT, type)) ||
            !(cp->emb_ln_w = arch_weight1(ld, d, BK_W_F32, eln_w)) ||
            !(cp->emb_ln_b = arch_weight1(ld, d, BK_W_F32, eln_b)))
            goto fail;
        if (!(cp->layers = calloc(m->n_layers, sizeof(*cp->layers)))) {
            arch_fail(ld, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < m->n_layers; i++)
            if (bert_upload_layer(ld, d, &lt[i], &cp->layers[i]) < 0) goto fail;
        if (head_upload(ld, d, &ht, &cp->head) < 0) goto fail;
    }
    free(lt);
    double h = (double)H, im = (double)m->inter;
    *info = (struct arch_info){
        .out_w = head_out_w(&m->head, H, m->n_labels),
        /* Per token: Q, K, V and the attention output (4 H x H) and the
         * feed-forward (2 H x I) per layer; attention's own T x T work
         * depends on the length and is left out. */
        .flops_per_row = 2.0 * (double)m->n_layers * (4.0 * h * h + 2.0 * h * im),
        .vocab = m->vocab,
        .type_vocab = m->type_vocab,
        .max_pos = m->max_pos,
        .hidden = H,
        .layers = m->n_layers,
        .heads = m->heads,
        .intermediate = m->inter,
        .pos_limit = m->max_pos,
        .n_labels = m->n_labels,
    };
    return m;
fail:
    free(lt);
    bert_unload(&ld->rt, m);
    return NULL;
}

static void *bert_ws_new(const struct arch_rt *rt, const void *am, void *c,
                         const struct arch_sizes *sz, char *errstr, size_t errstr_size)
{
    const struct bert_model *m = am;
    const struct backend_ops *o = rt->ops;
    size_t H = m->hidden, T = sz->max_tokens;
    struct bert_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) goto oom;
    ws->chunk = T < BERT_FFN_CHUNK ? T : BERT_FFN_CHUNK;
    size_t scratch = o->attention_scratch(rt->be, sz->max_rows, T, sz->max_len, m->heads,
                                          H / m->heads);
    if (!(ws->x = o->ctx_alloc(c, arch_act_bytes(rt, T * H), 0)) ||
        !(ws->qkv = o->ctx_alloc(c, arch_act_bytes(rt, T * 3 * H), 0)) ||
        !(ws->ctx = o->ctx_alloc(c, arch_act_bytes(rt, T * H), 0)) ||
        !(ws->inter = o->ctx_alloc(c, arch_act_bytes(rt, ws->chunk * m->inter), 0)) ||
        !(ws->scratch = o->ctx_alloc(c, scratch, 0)) ||
        head_ws_new(rt, c, &m->head, sz->max_rows, H, m->n_labels, &ws->head) < 0)
        goto oom;
    return ws;
oom:
    snprintf(errstr, errstr_size, "out of memory for a workspace of %zu rows and %zu tokens",
             sz->max_rows, T);
    free(ws);
    return NULL;
}

static void bert_ws_free(void *aws)
{
    free(aws);
}

#define TRY(call)                    \
    do {                             \
        if ((rc = (call)) < 0) return rc; \
    } while (0)

/* One post-LayerNorm layer over all T packed tokens. */
static int bert_layer_run(const struct arch_rt *rt, const struct bert_model *m,
                          const struct bert_layer *L, struct bert_ws *ws, void *c,
                          const struct bk_seqs *s)
{
    const struct backend_ops *o = rt->ops;
    size_t H = m->hidden, T = s->tokens, dh = H / m->heads;
    int rc;
    struct bk_gemm qkv = {.m = T, .n = 3 * H, .k = H, .a = ws->x, .w = L->qkv_w,
                          .bias = L->qkv_b, .c = ws->qkv};
    TRY(o->gemm(c, &qkv));
    struct bk_attention at = {.qkv = ws->qkv, .ld = 3 * H, .q_col = 0, .k_col = H,
                              .v_col = 2 * H, .heads = m->heads, .kv_heads = m->heads,
                              .dh = dh, .scale = 1.0f / sqrtf((float)dh), .s = s,
                              .out = ws->ctx, .ldo = H, .scratch = ws->scratch};
    TRY(o->attention(c, &at));
    void *attn = ws->qkv; /* the projections are spent */
    struct bk_gemm ao = {.m = T, .n = H, .k = H, .a = ws->ctx, .w = L->ao_w, .bias = L->ao_b,
                         .c = attn};
    TRY(o->gemm(c, &ao));
    TRY(o->layernorm(c, ws->x, ws->x, attn, L->ln1_w, L->ln1_b, m->eps, T, H));
    for (size_t at0 = 0; at0 < T; at0 += ws->chunk) {
        size_t rows = T - at0 < ws->chunk ? T - at0 : ws->chunk;
        struct bk_gemm f1 = {.m = rows, .n = m->inter, .k = H,
                             .a = arch_act_at(rt, ws->x, at0 * H), .w = L->i_w,
                             .bias = L->i_b, .act = m->act, .c = ws->inter};
        struct bk_gemm f2 = {.m = rows, .n = H, .k = m->inter, .a = ws->inter, .w = L->o_w,
                             .bias = L->o_b, .c = arch_act_at(rt, ws->ctx, at0 * H)};
        TRY(o->gemm(c, &f1));
        TRY(o->gemm(c, &f2));
    }
    TRY(o->layernorm(c, ws->x, ws->x, ws->ctx, L->ln2_w, L->ln2_b, m->eps, T, H));
    return 0;
}

/* Embeddings, the layers, then the head. */
static int bert_forward(const struct arch_rt *rt, const void *am, void *aws, void *c,
                        const struct arch_batch *b, const void **out)
{
    const struct bert_model *m = am;
    struct bert_ws *ws = aws;
    const struct bert_copy *cp = &m->copy[rt->ops->ctx_copy(c)];
    int rc;
    TRY(rt->ops->embed(c, ws->x, b->s, cp->word, cp->pos, 0, cp->type, 1, cp->emb_ln_w,
                       cp->emb_ln_b, m->eps, m->hidden));
    for (size_t l = 0; l < m->n_layers; l++)
        TRY(bert_layer_run(rt, m, &cp->layers[l], ws, c, b->s));
    return head_run(rt, c, &m->head, &cp->head, m->n_labels, &ws->head, ws->x, b->s, m->hidden,
                    out);
}

static const char *const bert_types[] = {"bert", NULL};

const struct arch arch_bert = {
    .name = "bert",
    .model_types = bert_types,
    .load = bert_load,
    .unload = bert_unload,
    .ws_new = bert_ws_new,
    .ws_free = bert_ws_free,
    .forward = bert_forward,
};

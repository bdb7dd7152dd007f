/* bert_encoder.c - the BERT family's shared model (bert_encoder.h):
 * reading config.json's BertConfig keys, finding and checking the tensors
 * under a family's names, uploading them, and the forward pass over the
 * backend's primitives: embed, then each post-LayerNorm layer (one GEMM
 * for Q, K and V, attention, the output projection, Add & LayerNorm, the
 * feed-forward in chunks of tokens, Add & LayerNorm), then the head.
 *
 * Threads and ownership: as bert_encoder.h says. */
#include "bert_encoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The feed-forward runs this many tokens at a time, so its [tokens, I]
 * intermediate stays small whatever the batch. */
#define BERT_FFN_CHUNK 1024

/* One layer's tensors, as the file has them. */
struct bert_layer_src {
    const struct st_tensor *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *ao_w, *ao_b, *ln1_w, *ln1_b,
        *i_w, *i_b, *o_w, *o_b, *ln2_w, *ln2_b;
};

/* One layer on one device. */
struct bert_layer {
    struct bk_weight *qkv_w, *qkv_b, *ao_w, *ao_b, *ln1_w, *ln1_b, *i_w, *i_b, *o_w, *o_b,
        *ln2_w, *ln2_b;
};

/* Layer i's tensors: module's weight [d0,d1] (d1 0: a LayerNorm's [d0])
 * and bias [d0]. */
static int bert_layer_read(struct arch_load *ld, const char *const *prefixes,
                           const struct bert_layer_names *nm, size_t i, size_t H, size_t I,
                           struct bert_layer_src *S)
{
    char pre[128], n[256];
    snprintf(pre, sizeof(pre), "%s%zu.", nm->layer, i);
#define T(wf, bf, module, d0, d1)                                                  \
    do {                                                                           \
        snprintf(n, sizeof(n), "%s%s.weight", pre, (module));                      \
        if (!(S->wf = arch_tensor(ld, prefixes, n, d0, d1))) return -1;            \
        snprintf(n, sizeof(n), "%s%s.bias", pre, (module));                        \
        if (!(S->bf = arch_tensor(ld, prefixes, n, d0, 0))) return -1;             \
    } while (0)
    T(q_w, q_b, nm->q, H, H);
    T(k_w, k_b, nm->k, H, H);
    T(v_w, v_b, nm->v, H, H);
    T(ao_w, ao_b, nm->attn_out, H, H);
    T(ln1_w, ln1_b, nm->attn_ln, H, 0);
    T(i_w, i_b, nm->ffn_in, I, H);
    T(o_w, o_b, nm->ffn_out, H, I);
    T(ln2_w, ln2_b, nm->ffn_ln, H, 0);
#undef T
    return 0;
}

/* One layer's weights on copy d. */
static int bert_layer_upload(struct arch_load *ld, size_t d, const struct bert_layer_src *S,
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

/* A layer's weights (NULL fine). */
static void bert_layer_free(const struct arch_rt *rt, struct bert_layer *Y)
{
    struct bk_weight *lw[] = {Y->qkv_w, Y->qkv_b, Y->ao_w, Y->ao_b, Y->ln1_w, Y->ln1_b,
                              Y->i_w,   Y->i_b,   Y->o_w,  Y->o_b,  Y->ln2_w, Y->ln2_b};
    for (size_t k = 0; k < sizeof(lw) / sizeof(lw[0]); k++) arch_weight_free(rt, lw[k]);
}

/* ---- the model ------------------------------------------------------------ */

/* The model on one device. */
struct bert_copy {
    struct bk_weight *word, *pos, *type, *emb_ln_w, *emb_ln_b, *rel_bias;
    struct bert_layer *layers;
    struct head_weights head;
};

struct bert_model {
    struct bert_encoder_conf cf;  /* its borrowed tables cleared */
    size_t n_labels, copies;
    struct head_conf head;
    struct bert_copy copy[MODEL_MAX_DEVICES];
};

struct bert_ws {
    size_t chunk;
    void *x;        /* [T,H] hidden states */
    void *qkv;      /* [T,3H] projections; then [T,H] of attention output */
    void *ctx;      /* [T,H] attention context; then the feed-forward's output */
    void *inter;    /* [chunk, I] */
    void *scratch;  /* attention's */
    struct head_ws head;
};

int bert_encoder_config(struct arch_load *ld, size_t type_def, struct bert_encoder_conf *cf)
{
    memset(cf, 0, sizeof(*cf));
    const char *pe = json_string_value(json_object_get(ld->config, "position_embedding_type"));
    if (pe && strcmp(pe, "absolute") != 0)
        return arch_fail(ld, "config.json: position_embedding_type \"%s\": only absolute "
                         "positions", pe);
    if (arch_cfg_size(ld, "vocab_size", 0, 1 << 24, &cf->vocab) < 0 ||
        arch_cfg_size(ld, "hidden_size", 0, 1 << 16, &cf->hidden) < 0 ||
        arch_cfg_size(ld, "num_hidden_layers", 0, 256, &cf->n_layers) < 0 ||
        arch_cfg_size(ld, "num_attention_heads", 0, 1024, &cf->heads) < 0 ||
        arch_cfg_size(ld, "intermediate_size", 0, 1 << 18, &cf->inter) < 0 ||
        arch_cfg_size(ld, "max_position_embeddings", 512, 1 << 16, &cf->max_pos) < 0 ||
        arch_cfg_size(ld, "type_vocab_size", type_def, 1024, &cf->type_vocab) < 0)
        return -1;
    if (cf->hidden % cf->heads)
        return arch_fail(ld, "config.json: hidden_size %zu is not a multiple of "
                         "num_attention_heads %zu", cf->hidden, cf->heads);
    if (arch_cfg_eps(ld, "layer_norm_eps", 1e-12, &cf->eps) < 0) return -1;
    if (arch_cfg_act(ld, "hidden_act", BK_ACT_GELU, &cf->act) < 0) return -1;
    if (cf->act != BK_ACT_GELU && cf->act != BK_ACT_GELU_TANH)
        return arch_fail(ld, "config.json: hidden_act \"%s\" is not supported (gelu, gelu_new)",
                         json_string_value(json_object_get(ld->config, "hidden_act")));
    return 0;
}

void bert_encoder_unload(const struct arch_rt *rt, void *am)
{
    struct bert_model *m = am;
    if (!m) return;
    for (size_t d = 0; d < m->copies; d++) {
        struct bert_copy *cp = &m->copy[d];
        struct bk_weight *all[] = {cp->word, cp->pos, cp->type, cp->emb_ln_w, cp->emb_ln_b,
                                   cp->rel_bias};
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) arch_weight_free(rt, all[k]);
        for (size_t i = 0; cp->layers && i < m->cf.n_layers; i++)
            bert_layer_free(rt, &cp->layers[i]);
        free(cp->layers);
        head_free(rt, &cp->head);
    }
    free(m);
}

/* A module's weight and bias ("embeddings.LayerNorm" + .weight/.bias). */
static int bert_module(struct arch_load *ld, const char *const *prefixes, const char *module,
                       size_t d0, size_t d1, const struct st_tensor **w,
                       const struct st_tensor **b)
{
    char n[256];
    snprintf(n, sizeof(n), "%s.weight", module);
    if (!(*w = arch_tensor(ld, prefixes, n, d0, d1))) return -1;
    snprintf(n, sizeof(n), "%s.bias", module);
    return (*b = arch_tensor(ld, prefixes, n, d0, 0)) ? 0 : -1;
}

/* Every tensor is found and checked before anything is uploaded, so a
 * bad file costs no device memory and names the first tensor amiss. */
void *bert_encoder_load(struct arch_load *ld, const struct bert_encoder_names *nm,
                        const struct bert_encoder_conf *cf, struct arch_info *info)
{
    struct bert_model *m = calloc(1, sizeof(*m));
    struct bert_layer_src *lt = NULL;
    if (!m) {
        arch_fail(ld, "out of memory");
        return NULL;
    }
    m->cf = *cf;
    m->cf.pos_table = m->cf.rel_bias = NULL;
    m->head = *ld->head;
    const char *const *px = nm->prefixes;
    size_t H = cf->hidden;
    if (cf->pos_base >= cf->max_pos) {
        arch_fail(ld, "config.json: max_position_embeddings %zu leaves no position after the "
                  "first %zu", cf->max_pos, cf->pos_base);
        goto fail;
    }
    const struct st_tensor *word, *pos = NULL, *type = NULL, *eln_w, *eln_b;
    if (!(word = arch_tensor(ld, px, nm->word, cf->vocab, H)) ||
        (!cf->pos_table && !(pos = arch_tensor(ld, px, nm->pos, cf->max_pos, H))) ||
        (nm->type && !(type = arch_tensor(ld, px, nm->type, cf->type_vocab, H))) ||
        bert_module(ld, px, nm->emb_ln, H, 0, &eln_w, &eln_b) < 0)
        goto fail;
    if (!(lt = calloc(cf->n_layers, sizeof(*lt)))) {
        arch_fail(ld, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < cf->n_layers; i++)
        if (bert_layer_read(ld, px, &nm->layer, i, H, cf->inter, &lt[i]) < 0) goto fail;
    struct head_tensors ht = {0};
    if (m->head.head == MODEL_HEAD_CLASSIFIER) {
        char pw[160], pb[160], ow[160], ob[160];
        snprintf(pw, sizeof(pw), "%s.weight", nm->cls_pre ? nm->cls_pre : "");
        snprintf(pb, sizeof(pb), "%s.bias", nm->cls_pre ? nm->cls_pre : "");
        snprintf(ow, sizeof(ow), "%s.weight", nm->cls_out);
        snprintf(ob, sizeof(ob), "%s.bias", nm->cls_out);
        if (head_classifier_read(ld, px, nm->cls_pre ? pw : NULL, pb, ow, ob, H, &ht) < 0)
            goto fail;
        ht.pre_act = nm->cls_pre_act;
    }
    m->n_labels = ht.n_labels;
    size_t bw = 2 * cf->rel_span - 1;
    struct bk_wsrc pos_src = {.f = cf->pos_table, .n = cf->max_pos * H};
    struct bk_wsrc rel_src = {.f = cf->rel_bias, .n = cf->heads * bw};
    m->copies = ld->rt.ops->weight_copies(ld->rt.be);
    for (size_t d = 0; d < m->copies; d++) {
        struct bert_copy *cp = &m->copy[d];
        if (!(cp->word = arch_weight1(ld, d, BK_W_ACT, word)) ||
            !(cp->pos = pos ? arch_weight1(ld, d, BK_W_ACT, pos)
                            : arch_weight(ld, d, BK_W_ACT, &pos_src, 1)) ||
            (type && !(cp->type = arch_weight1(ld, d, BK_W_ACT, type))) ||
            (cf->rel_bias && !(cp->rel_bias = arch_weight(ld, d, BK_W_F32, &rel_src, 1))) ||
            !(cp->emb_ln_w = arch_weight1(ld, d, BK_W_F32, eln_w)) ||
            !(cp->emb_ln_b = arch_weight1(ld, d, BK_W_F32, eln_b)))
            goto fail;
        if (!(cp->layers = calloc(cf->n_layers, sizeof(*cp->layers)))) {
            arch_fail(ld, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < cf->n_layers; i++)
            if (bert_layer_upload(ld, d, &lt[i], &cp->layers[i]) < 0) goto fail;
        if (head_upload(ld, d, &ht, &cp->head) < 0) goto fail;
    }
    free(lt);
    double h = (double)H, im = (double)cf->inter;
    *info = (struct arch_info){
        .out_w = head_out_w(&m->head, H, m->n_labels),
        /* Per token: Q, K, V and the attention output (4 H x H) and the
         * feed-forward (2 H x I) per layer; attention's own T x T work
         * depends on the length and is left out. */
        .flops_per_row = 2.0 * (double)cf->n_layers * (4.0 * h * h + 2.0 * h * im),
        .vocab = cf->vocab,
        .type_vocab = type ? cf->type_vocab : 1,
        .max_pos = cf->max_pos,
        .hidden = H,
        .layers = cf->n_layers,
        .heads = cf->heads,
        .intermediate = cf->inter,
        .pos_limit = cf->max_pos - cf->pos_base,
        .n_labels = m->n_labels,
    };
    return m;
fail:
    free(lt);
    bert_encoder_unload(&ld->rt, m);
    return NULL;
}

void *bert_encoder_ws_new(const struct arch_rt *rt, const void *am, void *c,
                          const struct arch_sizes *sz, char *errstr, size_t errstr_size)
{
    const struct bert_model *m = am;
    const struct backend_ops *o = rt->ops;
    size_t H = m->cf.hidden, T = sz->max_tokens;
    struct bert_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) goto oom;
    ws->chunk = T < BERT_FFN_CHUNK ? T : BERT_FFN_CHUNK;
    size_t scratch = o->attention_scratch(rt->be, sz->max_rows, T, sz->max_len, m->cf.heads,
                                          H / m->cf.heads);
    if (!(ws->x = o->ctx_alloc(c, arch_act_bytes(rt, T * H), 0)) ||
        !(ws->qkv = o->ctx_alloc(c, arch_act_bytes(rt, T * 3 * H), 0)) ||
        !(ws->ctx = o->ctx_alloc(c, arch_act_bytes(rt, T * H), 0)) ||
        !(ws->inter = o->ctx_alloc(c, arch_act_bytes(rt, ws->chunk * m->cf.inter), 0)) ||
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

void bert_encoder_ws_free(void *aws)
{
    free(aws);
}

/* One post-LayerNorm layer over all T packed tokens: x = LN(x + attn(x));
 * x = LN(x + ffn(x)). */
static int bert_layer_run(const struct arch_rt *rt, const struct bert_model *m,
                          const struct bert_layer *L, const struct bk_weight *rel_bias,
                          struct bert_ws *ws, void *c, const struct bk_seqs *s)
{
    const struct backend_ops *o = rt->ops;
    const struct bert_encoder_conf *cf = &m->cf;
    size_t H = cf->hidden, T = s->tokens, dh = H / cf->heads;
    struct bk_gemm qkv = {.m = T, .n = 3 * H, .k = H, .a = ws->x, .w = L->qkv_w,
                          .bias = L->qkv_b, .c = ws->qkv};
    ARCH_TRY(o->gemm(c, &qkv));
    struct bk_attention at = {.qkv = ws->qkv, .ld = 3 * H, .q_col = 0, .k_col = H,
                              .v_col = 2 * H, .heads = cf->heads, .kv_heads = cf->heads,
                              .dh = dh, .scale = 1.0f / sqrtf((float)dh),
                              .rel_bias = rel_bias, .rel_span = rel_bias ? cf->rel_span : 0,
                              .s = s, .out = ws->ctx, .ldo = H, .scratch = ws->scratch};
    ARCH_TRY(o->attention(c, &at));
    void *attn = ws->qkv; /* the projections are spent */
    struct bk_gemm ao = {.m = T, .n = H, .k = H, .a = ws->ctx, .w = L->ao_w, .bias = L->ao_b,
                         .c = attn};
    ARCH_TRY(o->gemm(c, &ao));
    ARCH_TRY(o->layernorm(c, ws->x, ws->x, attn, L->ln1_w, L->ln1_b, cf->eps, T, H));
    for (size_t at0 = 0; at0 < T; at0 += ws->chunk) {
        size_t rows = T - at0 < ws->chunk ? T - at0 : ws->chunk;
        struct bk_gemm f1 = {.m = rows, .n = cf->inter, .k = H,
                             .a = arch_act_at(rt, ws->x, at0 * H), .w = L->i_w,
                             .bias = L->i_b, .act = cf->act, .c = ws->inter};
        struct bk_gemm f2 = {.m = rows, .n = H, .k = cf->inter, .a = ws->inter, .w = L->o_w,
                             .bias = L->o_b, .c = arch_act_at(rt, ws->ctx, at0 * H)};
        ARCH_TRY(o->gemm(c, &f1));
        ARCH_TRY(o->gemm(c, &f2));
    }
    ARCH_TRY(o->layernorm(c, ws->x, ws->x, ws->ctx, L->ln2_w, L->ln2_b, cf->eps, T, H));
    return 0;
}

/* Embeddings, the layers, then the head. */
int bert_encoder_forward(const struct arch_rt *rt, const void *am, void *aws, void *c,
                         const struct arch_batch *b, const void **out)
{
    const struct bert_model *m = am;
    struct bert_ws *ws = aws;
    const struct bert_copy *cp = &m->copy[rt->ops->ctx_copy(c)];
    ARCH_TRY(rt->ops->embed(c, ws->x, b->s, cp->word, cp->pos, m->cf.pos_base, cp->type, 1,
                       cp->emb_ln_w, cp->emb_ln_b, m->cf.eps, m->cf.hidden));
    for (size_t l = 0; l < m->cf.n_layers; l++)
        ARCH_TRY(bert_layer_run(rt, m, &cp->layers[l], cp->rel_bias, ws, c, b->s));
    return head_run(rt, c, &m->head, &cp->head, m->n_labels, &ws->head, ws->x, b->s,
                    m->cf.hidden, out);
}

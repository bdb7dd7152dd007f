/* arch_nomic.c - NomicBERT encoders (config.json model_type "nomic_bert",
 * NomicBertModel: nomic-embed-text and its kin), as the model's own
 * modeling code defines them:
 *   - embeddings: word + token type (no position table), then LayerNorm
 *     (emb_ln);
 *   - post-LayerNorm layers: one fused projection Wqkv [3H, H] (q, k, v
 *     one after another), rotary embeddings on q and k over the whole
 *     head (rotate_half pairs (i, i + dh/2), frequencies base^(-2i/dh)
 *     with base rotary_emb_base, positions 0.. within each sequence),
 *     bidirectional attention scaled by 1/sqrt(dh), out_proj, then
 *     x = norm1(x + attn); a gated feed-forward
 *     fc2(fc11(x) * silu(fc12(x))), then x = norm2(x + ffn);
 *   - then the runtime's head (embeddings only: sentence-transformers'
 *     pooling and normalization as the folder says).
 * Biases are present or not as qkv_proj_bias (Wqkv and out_proj),
 * mlp_fc1_bias (fc11, fc12) and mlp_fc2_bias (fc2) say.
 *
 * Sizes come from n_embd, n_head, n_layer, n_inner (or hidden_size,
 * num_attention_heads, num_hidden_layers, intermediate_size), vocab_size,
 * type_vocab_size, layer_norm_epsilon and n_positions (the longest
 * sequence, 2048 when absent). What this file does not run is refused at
 * load with the key that asks for it: another activation than swiglu,
 * prenorm, a causal or parallel block, RMSNorm, partial or interleaved
 * rotary, rotary scaling (dynamic NTK) or xPos, mixture-of-experts
 * layers, a classifier head.
 *
 * The gate and up projections are uploaded stacked, [fc12; fc11], so the
 * feed-forward's first half is one GEMM whose rows the swiglu primitive
 * reads as [gate | up].
 *
 * Tensors by their NomicBertModel names, bare or under "bert." (the
 * pre-training checkpoint's prefix).
 *
 * Threads and ownership: as arch.h says. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"

/* The feed-forward runs this many tokens at a time, so its [tokens, 2I]
 * intermediate stays small whatever the batch. */
#define NOMIC_FFN_CHUNK 512

static const char *const nomic_prefixes[] = {"bert.", NULL};

struct nomic_conf {
    size_t vocab, hidden, n_layers, heads, inter, type_vocab, n_pos;
    float eps;
    double base;
    int qkv_bias, fc1_bias, fc2_bias;
};

/* One layer's tensors, as the file has them (biases NULL when absent). */
struct nomic_layer_src {
    const struct st_tensor *qkv_w, *qkv_b, *o_w, *o_b, *n1_w, *n1_b, *fc11_w, *fc11_b,
        *fc12_w, *fc12_b, *fc2_w, *fc2_b, *n2_w, *n2_b;
};

/* One layer on one device; gu_w/gu_b are [fc12; fc11]. */
struct nomic_layer {
    struct bk_weight *qkv_w, *qkv_b, *o_w, *o_b, *n1_w, *n1_b, *gu_w, *gu_b, *fc2_w, *fc2_b,
        *n2_w, *n2_b;
};

struct nomic_copy {
    struct bk_weight *word, *type, *eln_w, *eln_b, *inv_freq;
    struct nomic_layer *layers;
    struct head_weights head;
};

struct nomic_model {
    struct nomic_conf cf;
    size_t copies;
    struct head_conf head;
    struct nomic_copy copy[MODEL_MAX_DEVICES];
};

struct nomic_ws {
    size_t chunk;
    void *x;       /* [T,H] hidden states */
    void *qkv;     /* [T,3H] projections; then [T,H] of attention output */
    void *ctx;     /* [T,H] attention context; then the feed-forward's output */
    void *gu;      /* [chunk, 2I] gate and up */
    void *inter;   /* [chunk, I] */
    void *scratch; /* attention's */
    struct head_ws head;
};

/* ---- config.json ---------------------------------------------------------- */

/* A size under NomicBertConfig's key, else its Hugging Face alias. */
static int nomic_size(struct arch_load *ld, const char *key, const char *alias, size_t def,
                      size_t max, size_t *out)
{
    if (!json_object_get(ld->config, key) && json_object_get(ld->config, alias))
        key = alias;
    return arch_cfg_size(ld, key, def, max, out);
}

/* A boolean key; def when absent or null. */
static int nomic_bool(struct arch_load *ld, const char *key, int def, int *out)
{
    const json_t *v = json_object_get(ld->config, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return arch_fail(ld, "config.json: %s must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* A key that must be absent, null, or the value this file runs. */
static int nomic_refuse_bool(struct arch_load *ld, const char *key, int want)
{
    int v;
    if (nomic_bool(ld, key, want, &v) < 0) return -1;
    if (v != want)
        return arch_fail(ld, "config.json: %s %s is not supported", key, v ? "true" : "false");
    return 0;
}

static int nomic_config(struct arch_load *ld, struct nomic_conf *cf)
{
    const json_t *c = ld->config;
    memset(cf, 0, sizeof(*cf));
    if (nomic_size(ld, "vocab_size", "vocab_size", 0, 1 << 24, &cf->vocab) < 0 ||
        nomic_size(ld, "n_embd", "hidden_size", 0, 1 << 16, &cf->hidden) < 0 ||
        nomic_size(ld, "n_layer", "num_hidden_layers", 0, 256, &cf->n_layers) < 0 ||
        nomic_size(ld, "n_head", "num_attention_heads", 0, 1024, &cf->heads) < 0 ||
        nomic_size(ld, "type_vocab_size", "type_vocab_size", 2, 1024, &cf->type_vocab) < 0 ||
        nomic_size(ld, "n_positions", "max_position_embeddings", 2048, 1 << 16, &cf->n_pos) < 0)
        return -1;
    if (cf->hidden % cf->heads || (cf->hidden / cf->heads) % 2)
        return arch_fail(ld, "config.json: n_embd %zu is not n_head %zu heads of an even size",
                         cf->hidden, cf->heads);
    /* n_inner null means 4 n_embd, as GPT-2's config has it. */
    if (nomic_size(ld, "n_inner", "intermediate_size", 4 * cf->hidden, 1 << 18, &cf->inter) < 0)
        return -1;
    const char *epskey = json_object_get(c, "layer_norm_epsilon") ? "layer_norm_epsilon"
                                                                   : "layer_norm_eps";
    if (arch_cfg_eps(ld, epskey, 1e-12, &cf->eps) < 0) return -1;
    const char *act = json_string_value(json_object_get(c, "activation_function"));
    if (act && strcmp(act, "swiglu") != 0)
        return arch_fail(ld, "config.json: activation_function \"%s\" is not supported (swiglu)",
                         act);
    const json_t *b = json_object_get(c, "rotary_emb_base");
    cf->base = b && !json_is_null(b) ? json_number_value(b) : 10000.0;
    if (!(cf->base > 1.0 && cf->base < 1e12))
        return arch_fail(ld, "config.json: rotary_emb_base must be a number above 1");
    const json_t *fr = json_object_get(c, "rotary_emb_fraction");
    if (fr && !json_is_null(fr) && json_number_value(fr) != 1.0)
        return arch_fail(ld, "config.json: rotary_emb_fraction %g is not supported (1.0)",
                         json_number_value(fr));
    static const char *const unset[] = {"rotary_scaling_factor", "rotary_emb_scale_base"};
    for (size_t i = 0; i < sizeof(unset) / sizeof(unset[0]); i++) {
        const json_t *v = json_object_get(c, unset[i]);
        if (v && !json_is_null(v))
            return arch_fail(ld, "config.json: %s is set: not supported", unset[i]);
    }
    const json_t *moe = json_object_get(c, "moe_every_n_layers");
    if (moe && json_is_integer(moe) && json_integer_value(moe) > 0)
        return arch_fail(ld, "config.json: moe_every_n_layers %lld: mixture-of-experts layers "
                         "are not supported", (long long)json_integer_value(moe));
    if (nomic_refuse_bool(ld, "rotary_emb_interleaved", 0) < 0 ||
        nomic_refuse_bool(ld, "prenorm", 0) < 0 || nomic_refuse_bool(ld, "causal", 0) < 0 ||
        nomic_refuse_bool(ld, "parallel_block", 0) < 0 ||
        nomic_refuse_bool(ld, "use_rms_norm", 0) < 0 ||
        nomic_bool(ld, "qkv_proj_bias", 1, &cf->qkv_bias) < 0 ||
        nomic_bool(ld, "mlp_fc1_bias", 1, &cf->fc1_bias) < 0 ||
        nomic_bool(ld, "mlp_fc2_bias", 1, &cf->fc2_bias) < 0)
        return -1;
    return 0;
}

/* ---- tensors -------------------------------------------------------------- */

/* module.weight [d0,d1] (d1 0: [d0]) and, when bias, module.bias [d0]. */
static int nomic_module(struct arch_load *ld, const char *module, size_t d0, size_t d1,
                        int bias, const struct st_tensor **w, const struct st_tensor **b)
{
    char n[256];
    snprintf(n, sizeof(n), "%s.weight", module);
    if (!(*w = arch_tensor(ld, nomic_prefixes, n, d0, d1))) return -1;
    *b = NULL;
    if (!bias) return 0;
    snprintf(n, sizeof(n), "%s.bias", module);
    return (*b = arch_tensor(ld, nomic_prefixes, n, d0, 0)) ? 0 : -1;
}

static int nomic_layer_read(struct arch_load *ld, const struct nomic_conf *cf, size_t i,
                            struct nomic_layer_src *S)
{
    size_t H = cf->hidden, I = cf->inter;
    char m[128];
#define MOD(name, d0, d1, bias, w, b)                                      \
    do {                                                                   \
        snprintf(m, sizeof(m), "encoder.layers.%zu.%s", i, (name));        \
        if (nomic_module(ld, m, d0, d1, bias, &S->w, &S->b) < 0) return -1; \
    } while (0)
    MOD("attn.Wqkv", 3 * H, H, cf->qkv_bias, qkv_w, qkv_b);
    MOD("attn.out_proj", H, H, cf->qkv_bias, o_w, o_b);
    MOD("norm1", H, 0, 1, n1_w, n1_b);
    MOD("mlp.fc11", I, H, cf->fc1_bias, fc11_w, fc11_b);
    MOD("mlp.fc12", I, H, cf->fc1_bias, fc12_w, fc12_b);
    MOD("mlp.fc2", H, I, cf->fc2_bias, fc2_w, fc2_b);
    MOD("norm2", H, 0, 1, n2_w, n2_b);
#undef MOD
    return 0;
}

static int nomic_layer_upload(struct arch_load *ld, size_t d, const struct nomic_layer_src *S,
                              struct nomic_layer *L)
{
    struct bk_wsrc gu_w[2] = {{.t = S->fc12_w}, {.t = S->fc11_w}};
    struct bk_wsrc gu_b[2] = {{.t = S->fc12_b}, {.t = S->fc11_b}};
    if (!(L->qkv_w = arch_weight1(ld, d, BK_W_ACT, S->qkv_w)) ||
        (S->qkv_b && !(L->qkv_b = arch_weight1(ld, d, BK_W_ACT, S->qkv_b))) ||
        !(L->o_w = arch_weight1(ld, d, BK_W_ACT, S->o_w)) ||
        (S->o_b && !(L->o_b = arch_weight1(ld, d, BK_W_ACT, S->o_b))) ||
        !(L->n1_w = arch_weight1(ld, d, BK_W_F32, S->n1_w)) ||
        !(L->n1_b = arch_weight1(ld, d, BK_W_F32, S->n1_b)) ||
        !(L->gu_w = arch_weight(ld, d, BK_W_ACT, gu_w, 2)) ||
        (S->fc11_b && !(L->gu_b = arch_weight(ld, d, BK_W_ACT, gu_b, 2))) ||
        !(L->fc2_w = arch_weight1(ld, d, BK_W_ACT, S->fc2_w)) ||
        (S->fc2_b && !(L->fc2_b = arch_weight1(ld, d, BK_W_ACT, S->fc2_b))) ||
        !(L->n2_w = arch_weight1(ld, d, BK_W_F32, S->n2_w)) ||
        !(L->n2_b = arch_weight1(ld, d, BK_W_F32, S->n2_b)))
        return -1;
    return 0;
}

static void nomic_layer_free(const struct arch_rt *rt, struct nomic_layer *L)
{
    struct bk_weight *w[] = {L->qkv_w, L->qkv_b, L->o_w,  L->o_b,   L->n1_w, L->n1_b,
                             L->gu_w,  L->gu_b,  L->fc2_w, L->fc2_b, L->n2_w, L->n2_b};
    for (size_t k = 0; k < sizeof(w) / sizeof(w[0]); k++) arch_weight_free(rt, w[k]);
}

static void nomic_unload(const struct arch_rt *rt, void *am)
{
    struct nomic_model *m = am;
    if (!m) return;
    for (size_t d = 0; d < m->copies; d++) {
        struct nomic_copy *cp = &m->copy[d];
        struct bk_weight *w[] = {cp->word, cp->type, cp->eln_w, cp->eln_b, cp->inv_freq};
        for (size_t k = 0; k < sizeof(w) / sizeof(w[0]); k++) arch_weight_free(rt, w[k]);
        for (size_t i = 0; cp->layers && i < m->cf.n_layers; i++)
            nomic_layer_free(rt, &cp->layers[i]);
        free(cp->layers);
        head_free(rt, &cp->head);
    }
    free(m);
}

/* Every tensor is found and checked before anything is uploaded. */
static void *nomic_load(struct arch_load *ld, struct arch_info *info)
{
    struct nomic_model *m = calloc(1, sizeof(*m));
    struct nomic_layer_src *lt = NULL;
    float *inv = NULL;
    if (!m) {
        arch_fail(ld, "out of memory");
        return NULL;
    }
    m->head = *ld->head;
    struct nomic_conf *cf = &m->cf;
    if (nomic_config(ld, cf) < 0) goto fail;
    if (m->head.head == MODEL_HEAD_CLASSIFIER) {
        arch_fail(ld, "a NomicBERT classifier head is not supported (embeddings only)");
        goto fail;
    }
    size_t H = cf->hidden, dh = H / cf->heads;
    const struct st_tensor *word, *type, *eln_w, *eln_b;
    if (!(word = arch_tensor(ld, nomic_prefixes, "embeddings.word_embeddings.weight",
                             cf->vocab, H)) ||
        !(type = arch_tensor(ld, nomic_prefixes, "embeddings.token_type_embeddings.weight",
                             cf->type_vocab, H)) ||
        nomic_module(ld, "emb_ln", H, 0, 1, &eln_w, &eln_b) < 0)
        goto fail;
    if (!(lt = calloc(cf->n_layers, sizeof(*lt))) || !(inv = malloc(dh / 2 * sizeof(float)))) {
        arch_fail(ld, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < cf->n_layers; i++)
        if (nomic_layer_read(ld, cf, i, &lt[i]) < 0) goto fail;
    /* In float32, as the model's code computes them: 1 / base^(2i / dh). */
    for (size_t i = 0; i < dh / 2; i++)
        inv[i] = 1.0f / powf((float)cf->base, (float)(2 * i) / (float)dh);
    struct bk_wsrc inv_src = {.f = inv, .n = dh / 2};
    struct head_tensors ht = {0};
    m->copies = ld->rt.ops->weight_copies(ld->rt.be);
    for (size_t d = 0; d < m->copies; d++) {
        struct nomic_copy *cp = &m->copy[d];
        if (!(cp->word = arch_weight1(ld, d, BK_W_ACT, word)) ||
            !(cp->type = arch_weight1(ld, d, BK_W_ACT, type)) ||
            !(cp->eln_w = arch_weight1(ld, d, BK_W_F32, eln_w)) ||
            !(cp->eln_b = arch_weight1(ld, d, BK_W_F32, eln_b)) ||
            !(cp->inv_freq = arch_weight(ld, d, BK_W_F32, &inv_src, 1)))
            goto fail;
        if (!(cp->layers = calloc(cf->n_layers, sizeof(*cp->layers)))) {
            arch_fail(ld, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < cf->n_layers; i++)
            if (nomic_layer_upload(ld, d, &lt[i], &cp->layers[i]) < 0) goto fail;
        if (head_upload(ld, d, &ht, &cp->head) < 0) goto fail;
    }
    free(lt);
    free(inv);
    double h = (double)H, im = (double)cf->inter;
    *info = (struct arch_info){
        .out_w = head_out_w(&m->head, H, 0),
        /* Per token and layer: Wqkv and out_proj (4 H x H), fc11, fc12
         * and fc2 (3 H x I); attention's own work is left out. */
        .flops_per_row = 2.0 * (double)cf->n_layers * (4.0 * h * h + 3.0 * h * im),
        .vocab = cf->vocab,
        .type_vocab = cf->type_vocab,
        .max_pos = cf->n_pos,
        .hidden = H,
        .layers = cf->n_layers,
        .heads = cf->heads,
        .intermediate = cf->inter,
        .pos_limit = cf->n_pos,
    };
    return m;
fail:
    free(lt);
    free(inv);
    nomic_unload(&ld->rt, m);
    return NULL;
}

/* ---- workspace and forward pass ------------------------------------------- */

static void *nomic_ws_new(const struct arch_rt *rt, const void *am, void *c,
                          const struct arch_sizes *sz, char *errstr, size_t errstr_size)
{
    const struct nomic_model *m = am;
    const struct backend_ops *o = rt->ops;
    size_t H = m->cf.hidden, I = m->cf.inter, T = sz->max_tokens;
    struct nomic_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) goto oom;
    ws->chunk = T < NOMIC_FFN_CHUNK ? T : NOMIC_FFN_CHUNK;
    size_t scratch = o->attention_scratch(rt->be, sz->max_rows, T, sz->max_len, m->cf.heads,
                                          H / m->cf.heads);
    if (!(ws->x = o->ctx_alloc(c, arch_act_bytes(rt, T * H), 0)) ||
        !(ws->qkv = o->ctx_alloc(c, arch_act_bytes(rt, T * 3 * H), 0)) ||
        !(ws->ctx = o->ctx_alloc(c, arch_act_bytes(rt, T * H), 0)) ||
        !(ws->gu = o->ctx_alloc(c, arch_act_bytes(rt, ws->chunk * 2 * I), 0)) ||
        !(ws->inter = o->ctx_alloc(c, arch_act_bytes(rt, ws->chunk * I), 0)) ||
        !(ws->scratch = o->ctx_alloc(c, scratch, 0)) ||
        head_ws_new(rt, c, &m->head, sz->max_rows, H, 0, &ws->head) < 0)
        goto oom;
    return ws;
oom:
    snprintf(errstr, errstr_size, "out of memory for a workspace of %zu rows and %zu tokens",
             sz->max_rows, T);
    free(ws);
    return NULL;
}

static void nomic_ws_free(void *aws)
{
    free(aws);
}

/* One post-LayerNorm layer over all T packed tokens. */
static int nomic_layer_run(const struct arch_rt *rt, const struct nomic_model *m,
                           const struct nomic_layer *L, const struct bk_weight *inv_freq,
                           struct nomic_ws *ws, void *c, const struct bk_seqs *s)
{
    const struct backend_ops *o = rt->ops;
    const struct nomic_conf *cf = &m->cf;
    size_t H = cf->hidden, I = cf->inter, T = s->tokens, dh = H / cf->heads;
    struct bk_gemm qkv = {.m = T, .n = 3 * H, .k = H, .a = ws->x, .w = L->qkv_w,
                          .bias = L->qkv_b, .c = ws->qkv};
    ARCH_TRY(o->gemm(c, &qkv));
    ARCH_TRY(o->rope(c, ws->qkv, T, 3 * H, 0, cf->heads, dh, s->pos, inv_freq));
    ARCH_TRY(o->rope(c, ws->qkv, T, 3 * H, H, cf->heads, dh, s->pos, inv_freq));
    struct bk_attention at = {.qkv = ws->qkv, .ld = 3 * H, .q_col = 0, .k_col = H,
                              .v_col = 2 * H, .heads = cf->heads, .kv_heads = cf->heads,
                              .dh = dh, .scale = 1.0f / sqrtf((float)dh), .s = s,
                              .out = ws->ctx, .ldo = H, .scratch = ws->scratch};
    ARCH_TRY(o->attention(c, &at));
    void *attn = ws->qkv; /* the projections are spent */
    struct bk_gemm ao = {.m = T, .n = H, .k = H, .a = ws->ctx, .w = L->o_w, .bias = L->o_b,
                         .c = attn};
    ARCH_TRY(o->gemm(c, &ao));
    ARCH_TRY(o->layernorm(c, ws->x, ws->x, attn, L->n1_w, L->n1_b, cf->eps, T, H));
    for (size_t at0 = 0; at0 < T; at0 += ws->chunk) {
        size_t rows = T - at0 < ws->chunk ? T - at0 : ws->chunk;
        struct bk_gemm gu = {.m = rows, .n = 2 * I, .k = H,
                             .a = arch_act_at(rt, ws->x, at0 * H), .w = L->gu_w,
                             .bias = L->gu_b, .c = ws->gu};
        struct bk_gemm f2 = {.m = rows, .n = H, .k = I, .a = ws->inter, .w = L->fc2_w,
                             .bias = L->fc2_b, .c = arch_act_at(rt, ws->ctx, at0 * H)};
        ARCH_TRY(o->gemm(c, &gu));
        ARCH_TRY(o->swiglu(c, ws->inter, ws->gu, rows, I));
        ARCH_TRY(o->gemm(c, &f2));
    }
    ARCH_TRY(o->layernorm(c, ws->x, ws->x, ws->ctx, L->n2_w, L->n2_b, cf->eps, T, H));
    return 0;
}

static int nomic_forward(const struct arch_rt *rt, const void *am, void *aws, void *c,
                         const struct arch_batch *b, const void **out)
{
    const struct nomic_model *m = am;
    struct nomic_ws *ws = aws;
    const struct nomic_copy *cp = &m->copy[rt->ops->ctx_copy(c)];
    ARCH_TRY(rt->ops->embed(c, ws->x, b->s, cp->word, NULL, 0, cp->type, 1, cp->eln_w, cp->eln_b,
                       m->cf.eps, m->cf.hidden));
    for (size_t l = 0; l < m->cf.n_layers; l++)
        ARCH_TRY(nomic_layer_run(rt, m, &cp->layers[l], cp->inv_freq, ws, c, b->s));
    return head_run(rt, c, &m->head, &cp->head, 0, &ws->head, ws->x, b->s, m->cf.hidden,
                    out);
}

static const char *const nomic_types[] = {"nomic_bert", NULL};

const struct arch arch_nomic = {
    .name = "nomic_bert",
    .model_types = nomic_types,
    .load = nomic_load,
    .unload = nomic_unload,
    .ws_new = nomic_ws_new,
    .ws_free = nomic_ws_free,
    .forward = nomic_forward,
};

/* arch_llama.c - the Llama family of decoders from a Hugging Face folder
 * (model_type llama, mistral, qwen2, qwen3): token embeddings; per layer
 * a pre-RMSNorm self-attention (Q, K, V projections, with biases where
 * the family has them; Qwen3's per-head RMSNorm of queries and keys
 * before the rotary embedding; rotary positions; grouped-query attention
 * over the paged cache; the output projection) and a pre-RMSNorm SwiGLU
 * feed-forward (down(silu(gate(x)) * up(x))), each added to the
 * residual; the final RMSNorm and the language-model head (lm_head, or
 * the embedding table when tie_word_embeddings).
 *
 * The rotary frequencies are computed here as transformers does for
 * rope_scaling absent, "default", "linear" (divided by factor) and
 * "llama3" (long wavelengths divided by factor, short ones kept, a smooth
 * blend between); other scalings are refused.
 *
 * Threads and ownership: as arch.h says; the model owns every copy of its
 * weights (a tied head shares the embedding table's). */
#include "arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The feed-forward runs this many tokens at a time. */
#define LLAMA_FFN_CHUNK 512

struct llama_conf {
    size_t vocab, hidden, n_layers, heads, kv_heads, head_dim, inter, context;
    float eps;
    int qkv_bias, o_bias, mlp_bias, qk_norm, tied;
    float *inv_freq;            /* head_dim / 2, owned until upload */
};

struct llama_layer_src {
    const struct st_tensor *ln1, *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b, *q_norm,
        *k_norm, *ln2, *gate_w, *gate_b, *up_w, *up_b, *down_w, *down_b;
};

/* The Q, K and V projections are one stacked weight (qkv_w: one GEMM, q,
 * k and v strided views of its rows) except under Qwen3's head norms,
 * which want each of q and k whole (q_w, k_w, v_w apart). */
struct llama_layer {
    struct bk_weight *ln1, *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *qkv_w, *qkv_b, *o_w, *o_b,
        *q_norm, *k_norm, *ln2, *gu_w, *gu_b, *down_w, *down_b;
};

struct llama_copy {
    struct bk_weight *embed, *norm, *head, *inv_freq;
    struct llama_layer *layers;
};

struct llama_model {
    struct llama_conf cf;
    size_t copies;
    struct llama_copy copy[MODEL_MAX_DEVICES];
};

struct llama_ws {
    size_t chunk;
    void *x;        /* [T,H] the residual stream */
    void *h;        /* [T,H] normalized */
    void *q, *k, *v;/* [T, heads dh], [T, kv_heads dh] x2; q holds [T, q | k | v]
                     * when the projections are stacked */
    void *ctx;      /* [T, heads dh] attention context */
    void *r;        /* [T,H] a block's output, added to x by the next norm */
    void *gu;       /* [chunk, 2I] */
    void *act;      /* [chunk, I] */
    void *last;     /* [max_seqs, H] each sequence's last token */
    void *logits;   /* [max_seqs or T, vocab] */
    void *scratch;  /* paged attention's */
};

static const char *const llama_types[] = {"llama", "mistral", "qwen2", "qwen3", NULL};
static const char *const llama_prefixes[] = {"model.", NULL};

/* ---- config ---------------------------------------------------------------- */

/* A boolean of config.json, def when absent or null. */
static int llama_cfg_bool(struct arch_load *ld, const char *key, int def, int *out)
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

/* A positive number of object o, def when absent. */
static int llama_num(struct arch_load *ld, const json_t *o, const char *key, double def,
                     double *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def <= 0) return arch_fail(ld, "config.json: rope_scaling.%s is missing", key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return arch_fail(ld, "config.json: %s must be a positive number", key);
    *out = json_number_value(v);
    return 0;
}

/* inv_freq[i] = theta^(-2i/dh), then rope_scaling's adjustment. */
static int llama_rope(struct arch_load *ld, struct llama_conf *cf)
{
    double theta;
    if (llama_num(ld, ld->config, "rope_theta", 10000.0, &theta) < 0) return -1;
    const json_t *prf = json_object_get(ld->config, "partial_rotary_factor");
    if (prf && !json_is_null(prf) && json_number_value(prf) != 1.0)
        return arch_fail(ld, "config.json: partial_rotary_factor must be 1");
    size_t half = cf->head_dim / 2;
    if (!(cf->inv_freq = malloc(half * sizeof(float)))) return arch_fail(ld, "out of memory");
    double *f = malloc(half * sizeof(double));
    if (!f) return arch_fail(ld, "out of memory");
    for (size_t i = 0; i < half; i++)
        f[i] = 1.0 / pow(theta, (double)(2 * i) / (double)cf->head_dim);
    const json_t *rs = json_object_get(ld->config, "rope_scaling");
    int rc = 0;
    if (rs && !json_is_null(rs)) {
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rs, "type"));
        double factor = 1, lo = 1, hi = 4, old = 8192;
        if (!json_is_object(rs) || !type) {
            rc = arch_fail(ld, "config.json: rope_scaling must be an object with a rope_type");
        } else if (!strcmp(type, "default")) {
        } else if (!strcmp(type, "linear")) {
            if ((rc = llama_num(ld, rs, "factor", 0, &factor)) == 0)
                for (size_t i = 0; i < half; i++) f[i] /= factor;
        } else if (!strcmp(type, "llama3")) {
            if ((rc = llama_num(ld, rs, "factor", 0, &factor)) == 0 &&
                (rc = llama_num(ld, rs, "low_freq_factor", 0, &lo)) == 0 &&
                (rc = llama_num(ld, rs, "high_freq_factor", 0, &hi)) == 0 &&
                (rc = llama_num(ld, rs, "original_max_position_embeddings", 0, &old)) == 0 &&
                hi <= lo)
                rc = arch_fail(ld, "config.json: rope_scaling: high_freq_factor must exceed "
                               "low_freq_factor");
            double lo_wave = old / lo, hi_wave = old / hi;
            for (size_t i = 0; rc == 0 && i < half; i++) {
                double wave = 2.0 * M_PI / f[i];
                if (wave > lo_wave) {
                    f[i] /= factor;
                } else if (wave >= hi_wave) {
                    double sm = (old / wave - lo) / (hi - lo);
                    f[i] = (1.0 - sm) * f[i] / factor + sm * f[i];
                }
            }
        } else {
            rc = arch_fail(ld, "config.json: rope_scaling type \"%s\" is not supported "
                           "(default, linear, llama3)", type);
        }
    }
    for (size_t i = 0; i < half; i++) cf->inv_freq[i] = (float)f[i];
    free(f);
    return rc;
}

static int llama_config(struct arch_load *ld, struct llama_conf *cf)
{
    memset(cf, 0, sizeof(*cf));
    const char *mt = json_string_value(json_object_get(ld->config, "model_type"));
    int qwen2 = mt && !strcmp(mt, "qwen2"), qwen3 = mt && !strcmp(mt, "qwen3");
    if (arch_cfg_size(ld, "vocab_size", 0, 1 << 24, &cf->vocab) < 0 ||
        arch_cfg_size(ld, "hidden_size", 0, 1 << 16, &cf->hidden) < 0 ||
        arch_cfg_size(ld, "num_hidden_layers", 0, 512, &cf->n_layers) < 0 ||
        arch_cfg_size(ld, "num_attention_heads", 0, 1024, &cf->heads) < 0 ||
        arch_cfg_size(ld, "num_key_value_heads", cf->heads, 1024, &cf->kv_heads) < 0 ||
        arch_cfg_size(ld, "intermediate_size", 0, 1 << 18, &cf->inter) < 0 ||
        arch_cfg_size(ld, "max_position_embeddings", 2048, 1 << 24, &cf->context) < 0)
        return -1;
    if (cf->heads % cf->kv_heads)
        return arch_fail(ld, "config.json: num_attention_heads %zu is not a multiple of "
                         "num_key_value_heads %zu", cf->heads, cf->kv_heads);
    size_t hd_def = cf->hidden / cf->heads;
    if (arch_cfg_size(ld, "head_dim", hd_def ? hd_def : 1, 4096, &cf->head_dim) < 0) return -1;
    if (cf->head_dim % 2)
        return arch_fail(ld, "config.json: head_dim %zu must be even", cf->head_dim);
    if (arch_cfg_eps(ld, "rms_norm_eps", 1e-6, &cf->eps) < 0) return -1;
    enum bk_act act;
    if (arch_cfg_act(ld, "hidden_act", BK_ACT_SILU, &act) < 0) return -1;
    if (act != BK_ACT_SILU) return arch_fail(ld, "config.json: hidden_act must be silu");
    int attn_bias, sw = 0;
    if (llama_cfg_bool(ld, "attention_bias", 0, &attn_bias) < 0 ||
        llama_cfg_bool(ld, "mlp_bias", 0, &cf->mlp_bias) < 0 ||
        llama_cfg_bool(ld, "tie_word_embeddings", 0, &cf->tied) < 0 ||
        llama_cfg_bool(ld, "use_sliding_window", !qwen2 && !qwen3, &sw) < 0)
        return -1;
    cf->qkv_bias = qwen2 || attn_bias;
    cf->o_bias = !qwen2 && attn_bias;
    cf->qk_norm = qwen3;
    /* Positions past a sliding window would attend differently: the
     * context stops there. */
    const json_t *win = json_object_get(ld->config, "sliding_window");
    if (sw && json_is_integer(win) && json_integer_value(win) > 0 &&
        (size_t)json_integer_value(win) < cf->context)
        cf->context = (size_t)json_integer_value(win);
    return llama_rope(ld, cf);
}

/* ---- tensors --------------------------------------------------------------- */

static const struct st_tensor *llama_t(struct arch_load *ld, size_t i, const char *name,
                                       size_t d0, size_t d1)
{
    char n[256];
    snprintf(n, sizeof(n), "layers.%zu.%s", i, name);
    return arch_tensor(ld, llama_prefixes, n, d0, d1);
}

static int llama_layer_read(struct arch_load *ld, const struct llama_conf *cf, size_t i,
                            struct llama_layer_src *S)
{
    size_t H = cf->hidden, Q = cf->heads * cf->head_dim, K = cf->kv_heads * cf->head_dim;
    size_t I = cf->inter, dh = cf->head_dim;
    if (!(S->ln1 = llama_t(ld, i, "input_layernorm.weight", H, 0)) ||
        !(S->q_w = llama_t(ld, i, "self_attn.q_proj.weight", Q, H)) ||
        !(S->k_w = llama_t(ld, i, "self_attn.k_proj.weight", K, H)) ||
        !(S->v_w = llama_t(ld, i, "self_attn.v_proj.weight", K, H)) ||
        !(S->o_w = llama_t(ld, i, "self_attn.o_proj.weight", H, Q)) ||
        !(S->ln2 = llama_t(ld, i, "post_attention_layernorm.weight", H, 0)) ||
        !(S->gate_w = llama_t(ld, i, "mlp.gate_proj.weight", I, H)) ||
        !(S->up_w = llama_t(ld, i, "mlp.up_proj.weight", I, H)) ||
        !(S->down_w = llama_t(ld, i, "mlp.down_proj.weight", H, I)))
        return -1;
    if (cf->qkv_bias && (!(S->q_b = llama_t(ld, i, "self_attn.q_proj.bias", Q, 0)) ||
                         !(S->k_b = llama_t(ld, i, "self_attn.k_proj.bias", K, 0)) ||
                         !(S->v_b = llama_t(ld, i, "self_attn.v_proj.bias", K, 0))))
        return -1;
    if (cf->o_bias && !(S->o_b = llama_t(ld, i, "self_attn.o_proj.bias", H, 0))) return -1;
    if (cf->qk_norm && (!(S->q_norm = llama_t(ld, i, "self_attn.q_norm.weight", dh, 0)) ||
                        !(S->k_norm = llama_t(ld, i, "self_attn.k_norm.weight", dh, 0))))
        return -1;
    if (cf->mlp_bias && (!(S->gate_b = llama_t(ld, i, "mlp.gate_proj.bias", I, 0)) ||
                         !(S->up_b = llama_t(ld, i, "mlp.up_proj.bias", I, 0)) ||
                         !(S->down_b = llama_t(ld, i, "mlp.down_proj.bias", H, 0))))
        return -1;
    return 0;
}

static int llama_layer_upload(struct arch_load *ld, size_t d, const struct llama_layer_src *S,
                              struct llama_layer *L)
{
    struct bk_wsrc gu_w[2] = {{.t = S->gate_w}, {.t = S->up_w}};
    struct bk_wsrc gu_b[2] = {{.t = S->gate_b}, {.t = S->up_b}};
    struct bk_wsrc qkv_w[3] = {{.t = S->q_w}, {.t = S->k_w}, {.t = S->v_w}};
    struct bk_wsrc qkv_b[3] = {{.t = S->q_b}, {.t = S->k_b}, {.t = S->v_b}};
    int apart = S->q_norm != NULL; /* llama_layer */
#define UP(field, type, src) ((src) && !(L->field = arch_weight1(ld, d, type, src)))
    if (UP(ln1, BK_W_F32, S->ln1) || UP(o_w, BK_W_ACT, S->o_w) || UP(o_b, BK_W_ACT, S->o_b) ||
        UP(q_norm, BK_W_F32, S->q_norm) || UP(k_norm, BK_W_F32, S->k_norm) ||
        UP(ln2, BK_W_F32, S->ln2) || UP(down_w, BK_W_ACT, S->down_w) ||
        UP(down_b, BK_W_ACT, S->down_b))
        return -1;
    if (apart && (UP(q_w, BK_W_ACT, S->q_w) || UP(q_b, BK_W_ACT, S->q_b) ||
                  UP(k_w, BK_W_ACT, S->k_w) || UP(k_b, BK_W_ACT, S->k_b) ||
                  UP(v_w, BK_W_ACT, S->v_w) || UP(v_b, BK_W_ACT, S->v_b)))
        return -1;
#undef UP
    if (!apart && !(L->qkv_w = arch_weight(ld, d, BK_W_ACT, qkv_w, 3))) return -1;
    if (!apart && S->q_b && !(L->qkv_b = arch_weight(ld, d, BK_W_ACT, qkv_b, 3))) return -1;
    if (!(L->gu_w = arch_weight(ld, d, BK_W_ACT, gu_w, 2))) return -1;
    if (S->gate_b && !(L->gu_b = arch_weight(ld, d, BK_W_ACT, gu_b, 2))) return -1;
    return 0;
}

static void llama_unload(const struct arch_rt *rt, void *am)
{
    struct llama_model *m = am;
    if (!m) return;
    for (size_t d = 0; d < m->copies; d++) {
        struct llama_copy *cp = &m->copy[d];
        if (cp->head != cp->embed) arch_weight_free(rt, cp->head);
        arch_weight_free(rt, cp->embed);
        arch_weight_free(rt, cp->norm);
        arch_weight_free(rt, cp->inv_freq);
        for (size_t i = 0; cp->layers && i < m->cf.n_layers; i++) {
            struct llama_layer *L = &cp->layers[i];
            struct bk_weight *all[] = {L->ln1,    L->q_w,    L->q_b,  L->k_w,    L->k_b,
                                       L->v_w,    L->v_b,    L->qkv_w, L->qkv_b, L->o_w,
                                       L->o_b,    L->q_norm, L->k_norm, L->ln2,  L->gu_w,
                                       L->gu_b,   L->down_w, L->down_b};
            for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) arch_weight_free(rt, all[k]);
        }
        free(cp->layers);
    }
    free(m->cf.inv_freq);
    free(m);
}

/* Every tensor is found and checked before anything is uploaded. */
static void *llama_load(struct arch_load *ld, struct arch_dec_info *info)
{
    struct llama_model *m = calloc(1, sizeof(*m));
    struct llama_layer_src *lt = NULL;
    if (!m) {
        arch_fail(ld, "out of memory");
        return NULL;
    }
    struct llama_conf *cf = &m->cf;
    if (llama_config(ld, cf) < 0) goto fail;
    size_t H = cf->hidden;
    const struct st_tensor *embed, *norm, *head = NULL;
    if (!(embed = arch_tensor(ld, llama_prefixes, "embed_tokens.weight", cf->vocab, H)) ||
        !(norm = arch_tensor(ld, llama_prefixes, "norm.weight", H, 0)))
        goto fail;
    int has_head = st_find(ld->file, "lm_head.weight") != NULL;
    for (size_t i = 0; i < ld->n_shards; i++)
        has_head |= st_find(ld->shards[i], "lm_head.weight") != NULL;
    if (!cf->tied || has_head) {
        if (!(head = arch_tensor(ld, NULL, "lm_head.weight", cf->vocab, H))) goto fail;
    }
    if (!(lt = calloc(cf->n_layers, sizeof(*lt)))) {
        arch_fail(ld, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < cf->n_layers; i++)
        if (llama_layer_read(ld, cf, i, &lt[i]) < 0) goto fail;
    struct bk_wsrc fsrc = {.f = cf->inv_freq, .n = cf->head_dim / 2};
    m->copies = ld->rt.ops->weight_copies(ld->rt.be);
    for (size_t d = 0; d < m->copies; d++) {
        struct llama_copy *cp = &m->copy[d];
        if (!(cp->embed = arch_weight1(ld, d, BK_W_ACT, embed)) ||
            !(cp->norm = arch_weight1(ld, d, BK_W_F32, norm)) ||
            !(cp->inv_freq = arch_weight(ld, d, BK_W_F32, &fsrc, 1)))
            goto fail;
        cp->head = head ? arch_weight1(ld, d, BK_W_ACT, head) : cp->embed;
        if (!cp->head) goto fail;
        if (!(cp->layers = calloc(cf->n_layers, sizeof(*cp->layers)))) {
            arch_fail(ld, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < cf->n_layers; i++)
            if (llama_layer_upload(ld, d, &lt[i], &cp->layers[i]) < 0) goto fail;
    }
    free(lt);
    double h = (double)H, q = (double)(cf->heads * cf->head_dim),
           kv = (double)(cf->kv_heads * cf->head_dim);
    *info = (struct arch_dec_info){
        .vocab = cf->vocab, .hidden = H, .layers = cf->n_layers, .heads = cf->heads,
        .kv_heads = cf->kv_heads, .head_dim = cf->head_dim, .intermediate = cf->inter,
        .context = cf->context,
        .flops_per_token = 2.0 * ((double)cf->n_layers *
                                  (2.0 * h * q + 2.0 * h * kv + 3.0 * h * (double)cf->inter) +
                                  h * (double)cf->vocab),
    };
    return m;
fail:
    free(lt);
    llama_unload(&ld->rt, m);
    return NULL;
}

/* ---- workspace and step ------------------------------------------------------ */

static void *llama_ws_new(const struct arch_rt *rt, const void *am, void *c,
                          const struct arch_dec_sizes *sz, char *errstr, size_t errstr_size)
{
    const struct llama_model *m = am;
    const struct llama_conf *cf = &m->cf;
    const struct backend_ops *o = rt->ops;
    size_t T = sz->max_tokens, H = cf->hidden, Q = cf->heads * cf->head_dim;
    size_t K = cf->kv_heads * cf->head_dim;
    struct llama_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) goto oom;
    ws->chunk = T < LLAMA_FFN_CHUNK ? T : LLAMA_FFN_CHUNK;
    size_t lrows = sz->all_logits ? T : sz->max_seqs;
    size_t scratch = o->paged_attention_scratch(rt->be, T, sz->max_ctx, cf->heads);
#define A(field, n) (ws->field = o->ctx_alloc(c, arch_act_bytes(rt, n), 0))
    if (!A(x, T * H) || !A(h, T * H) || !A(q, T * (Q + 2 * K)) || !A(k, T * K) || !A(v, T * K) ||
        !A(ctx, T * Q) || !A(r, T * H) || !A(gu, ws->chunk * 2 * cf->inter) ||
        !A(act, ws->chunk * cf->inter) || !A(last, sz->max_seqs * H) ||
        !A(logits, lrows * cf->vocab) || !(ws->scratch = o->ctx_alloc(c, scratch, 0)))
        goto oom;
#undef A
    return ws;
oom:
    snprintf(errstr, errstr_size,
             "out of memory for a decoder workspace of %zu sequences and %zu tokens",
             sz->max_seqs, T);
    free(ws);
    return NULL;
}

static void llama_ws_free(void *aws)
{
    free(aws);
}

/* Attention block of layer l: h = norm(x += res); q, k, v; Qwen3's head
 * norms; rotary; into the cache; attention; r = o_proj(ctx). */
static int llama_attn(const struct arch_rt *rt, const struct llama_model *m,
                      const struct llama_copy *cp, size_t l, struct llama_ws *ws, void *c,
                      const struct arch_dec_batch *b, const void *res)
{
    const struct backend_ops *o = rt->ops;
    const struct llama_conf *cf = &m->cf;
    const struct llama_layer *L = &cp->layers[l];
    const struct bk_seqs *s = b->s;
    size_t T = s->tokens, H = cf->hidden, dh = cf->head_dim, Q = cf->heads * dh;
    size_t K = cf->kv_heads * dh;
    ARCH_TRY(o->rmsnorm(c, ws->h, ws->x, res, L->ln1, cf->eps, T, H));
    void *q = ws->q, *k = ws->k, *v = ws->v;
    size_t ldq = Q, ldk = K;
    if (L->qkv_w) { /* one GEMM; q, k and v are column ranges of its rows */
        struct bk_gemm g = {.m = T, .n = Q + 2 * K, .k = H, .a = ws->h, .w = L->qkv_w,
                            .bias = L->qkv_b, .c = ws->q};
        ARCH_TRY(o->gemm(c, &g));
        ldq = ldk = Q + 2 * K;
        k = arch_act_at(rt, ws->q, Q);
        v = arch_act_at(rt, ws->q, Q + K);
    } else {
        struct bk_gemm gq = {.m = T, .n = Q, .k = H, .a = ws->h, .w = L->q_w, .bias = L->q_b,
                             .c = q};
        struct bk_gemm gk = {.m = T, .n = K, .k = H, .a = ws->h, .w = L->k_w, .bias = L->k_b,
                             .c = k};
        struct bk_gemm gv = {.m = T, .n = K, .k = H, .a = ws->h, .w = L->v_w, .bias = L->v_b,
                             .c = v};
        ARCH_TRY(o->gemm(c, &gq));
        ARCH_TRY(o->gemm(c, &gk));
        ARCH_TRY(o->gemm(c, &gv));
        if (cf->qk_norm) {
            ARCH_TRY(o->rmsnorm(c, q, q, NULL, L->q_norm, cf->eps, T * cf->heads, dh));
            ARCH_TRY(o->rmsnorm(c, k, k, NULL, L->k_norm, cf->eps, T * cf->kv_heads, dh));
        }
    }
    ARCH_TRY(o->rope(c, q, T, ldq, 0, cf->heads, dh, s->pos, cp->inv_freq));
    struct bk_kv kv = b->kv;
    kv.k = (char *)kv.k + l * b->layer_bytes;
    kv.v = (char *)kv.v + l * b->layer_bytes;
    ARCH_TRY(o->kv_store(c, &kv, k, ldk, v, ldk, s, cp->inv_freq)); /* keys rotated there */
    struct bk_paged_attention pa = {.q = q, .ldq = ldq, .heads = cf->heads,
                                    .scale = (float)(1.0 / sqrt((double)dh)), .kv = &kv, .s = s,
                                    .max_ctx = b->max_ctx, .out = ws->ctx, .ldo = Q,
                                    .scratch = ws->scratch};
    ARCH_TRY(o->paged_attention(c, &pa));
    struct bk_gemm go = {.m = T, .n = H, .k = Q, .a = ws->ctx, .w = L->o_w, .bias = L->o_b,
                         .c = ws->r};
    return o->gemm(c, &go);
}

/* Feed-forward block: h = norm(x += r); r = down(silu(gate h) * up h). */
static int llama_mlp(const struct arch_rt *rt, const struct llama_model *m,
                     const struct llama_layer *L, struct llama_ws *ws, void *c, size_t T)
{
    const struct backend_ops *o = rt->ops;
    const struct llama_conf *cf = &m->cf;
    size_t H = cf->hidden, I = cf->inter;
    ARCH_TRY(o->rmsnorm(c, ws->h, ws->x, ws->r, L->ln2, cf->eps, T, H));
    for (size_t at = 0; at < T; at += ws->chunk) {
        size_t rows = T - at < ws->chunk ? T - at : ws->chunk;
        struct bk_gemm gu = {.m = rows, .n = 2 * I, .k = H, .a = arch_act_at(rt, ws->h, at * H),
                             .w = L->gu_w, .bias = L->gu_b, .c = ws->gu};
        struct bk_gemm dn = {.m = rows, .n = H, .k = I, .a = ws->act, .w = L->down_w,
                             .bias = L->down_b, .c = arch_act_at(rt, ws->r, at * H)};
        ARCH_TRY(o->gemm(c, &gu));
        ARCH_TRY(o->swiglu(c, ws->act, ws->gu, rows, I));
        ARCH_TRY(o->gemm(c, &dn));
    }
    return 0;
}

static int llama_step(const struct arch_rt *rt, const void *am, void *aws, void *c,
                      const struct arch_dec_batch *b, const void **out)
{
    const struct llama_model *m = am;
    const struct llama_conf *cf = &m->cf;
    struct llama_ws *ws = aws;
    const struct backend_ops *o = rt->ops;
    const struct llama_copy *cp = &m->copy[o->ctx_copy(c)];
    const struct bk_seqs *s = b->s;
    size_t T = s->tokens, H = cf->hidden;
    ARCH_TRY(o->embed(c, ws->x, s, cp->embed, NULL, 0, NULL, 0, NULL, NULL, 0.0f, H));
    for (size_t l = 0; l < cf->n_layers; l++) {
        ARCH_TRY(llama_attn(rt, m, cp, l, ws, c, b, l ? ws->r : NULL));
        ARCH_TRY(llama_mlp(rt, m, &cp->layers[l], ws, c, T));
    }
    ARCH_TRY(o->rmsnorm(c, ws->h, ws->x, ws->r, cp->norm, cf->eps, T, H));
    const void *rows = ws->h;
    size_t n = T;
    if (!b->all_logits) {
        ARCH_TRY(o->pool(c, ws->last, ws->h, s, BK_POOL_LAST, H));
        rows = ws->last;
        n = s->n;
    }
    struct bk_gemm lm = {.m = n, .n = cf->vocab, .k = H, .a = rows, .w = cp->head,
                         .c = ws->logits};
    ARCH_TRY(o->gemm(c, &lm));
    *out = ws->logits;
    return 0;
}

const struct arch_decoder arch_llama = {
    .name = "llama",
    .model_types = llama_types,
    .load = llama_load,
    .unload = llama_unload,
    .ws_new = llama_ws_new,
    .ws_free = llama_ws_free,
    .step = llama_step,
};

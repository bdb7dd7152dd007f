/* test_decoder.c - the decoder runtime (gpu/decoder.h) with the Llama
 * family (gpu/arch_llama.c) on the CPU backend, against a float64
 * reference decoder written here, over small random models of each
 * variant written as Hugging Face folders:
 *   llama   grouped-query attention, untied head, F32
 *   qwen2   q/k/v biases, one key/value head, tied embeddings
 *   qwen3   per-head q/k RMSNorm, head_dim not hidden/heads, BF16 weights
 *   llama3  rope_scaling llama3 (all three wavelength bands in use),
 *           attention and MLP biases, sharded (model.safetensors.index.json)
 *   mistral rope_scaling linear, F16 weights
 * For each, the logits of every position of a random prompt are computed
 * (a) in one prefill, (b) token by token through the KV cache, (c) in
 * batches mixing the prompt with other sequences, in chunks of random
 * sizes, and (d) with block sizes of 1 to 3 tokens, so steps cross block
 * boundaries - and all agree with the reference within 2e-5 of the
 * largest logit's magnitude (at least 1). A malformed step or one that
 * does not fit the cache is refused with nothing changed.
 * Then the same variants against PyTorch (tests/torch_decoder.py, the
 * model written by hand in torch as Hugging Face's modeling files define
 * it): kinfer within 2e-5 of it, and it within 1e-5 of the reference
 * here (it computes the rotary frequencies in float32, as Hugging Face
 * does). Runs from the repository root; the PyTorch check needs
 * /usr/bin/python3 with torch (make deps); KINFER_TEST_NO_TORCH=1 skips it
 * with a printed line.
 * test_cpu_bf16 runs every variant on the CPU backend in bf16
 * (worker.cpu_precision; the AMX tiles where the CPU has them, and with
 * them off) within 4e-2 of the largest logit.
 * test_cuda runs every variant on the CUDA backend in every precision,
 * the token-by-token steps replayed from recorded graphs after their
 * first two (counted: some are, not all) against the same reference (the
 * program built over the emulated device, build/emu/tests/, runs only
 * that test). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../gen/sample.h"
#include "../gpu/cpu_amx.h"
#include "../gpu/decoder.h"
#include "../gpu/safetensors.h"
#include "../text/tokenizer.h"
#include "testutil.h"

#include <jansson.h>

#define TORCH_PY "tests/torch_decoder.py"

#define TOL 2e-5
#define MAXT 64

/* A variant's shape and switches. */
struct variant {
    const char *name, *model_type;
    size_t vocab, hidden, layers, heads, kv_heads, head_dim, inter;
    int qkv_bias, o_bias, mlp_bias, qk_norm, tied, explicit_hd, sharded;
    enum st_dtype dtype;
    const char *scaling;        /* NULL, "linear", "llama3" */
    double theta, factor;
};

static const struct variant variants[] = {
    {"llama", "llama", 61, 32, 2, 4, 2, 8, 48, 0, 0, 0, 0, 0, 0, 0, ST_F32, NULL, 10000, 1},
    {"qwen2", "qwen2", 53, 24, 2, 3, 1, 8, 40, 1, 0, 0, 0, 1, 0, 0, ST_F32, NULL, 1e6, 1},
    {"qwen3", "qwen3", 47, 32, 2, 4, 2, 12, 40, 0, 0, 0, 1, 1, 1, 0, ST_BF16, NULL, 1e6, 1},
    {"llama3", "llama", 59, 32, 2, 2, 1, 16, 44, 1, 1, 1, 0, 0, 0, 1, ST_F32, "llama3", 1e4, 4},
    {"mistral", "mistral", 50, 32, 2, 4, 4, 8, 36, 0, 0, 0, 0, 0, 0, 0, ST_F16, "linear", 1e4, 2},
};

/* The model's weights as the file holds them (after rounding to dtype). */
struct lw {
    double *ln1, *q, *qb, *k, *kb, *v, *vb, *o, *ob, *qn, *kn, *ln2, *g, *gb, *u, *ub, *d, *db;
};
struct ref {
    const struct variant *V;
    double *embed, *norm, *head;
    struct lw L[4];
    double inv_freq[64];
};

/* Up to 80 tensors to write. */
struct wlist {
    struct st_write_tensor t[96];
    char names[96][96];
    uint64_t shapes[96][2];
    void *bufs[96];
    size_t n;
};

static double *tensor(struct wlist *w, const struct variant *V, const char *name, size_t d0,
                      size_t d1, double lo, double hi)
{
    size_t n = d0 * (d1 ? d1 : 1), k = w->n++;
    assert_true(k < 96);
    double *ref = malloc(n * sizeof(double));
    void *raw = malloc(n * 4);
    assert_true(ref && raw);
    for (size_t i = 0; i < n; i++) {
        float f = tu_randf((float)lo, (float)hi);
        if (V->dtype == ST_BF16) {
            uint16_t b = st_f32_to_bf16(f);
            ((uint16_t *)raw)[i] = b;
            ref[i] = st_bf16_to_f32(b);
        } else if (V->dtype == ST_F16) {
            uint16_t b = st_f32_to_f16(f);
            ((uint16_t *)raw)[i] = b;
            ref[i] = st_f16_to_f32(b);
        } else {
            ((float *)raw)[i] = f;
            ref[i] = f;
        }
    }
    snprintf(w->names[k], sizeof(w->names[k]), "%s", name);
    w->shapes[k][0] = d0;
    w->shapes[k][1] = d1;
    w->bufs[k] = raw;
    w->t[k] = (struct st_write_tensor){w->names[k], V->dtype, d1 ? 2 : 1, w->shapes[k], raw};
    return ref;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Writes variant V's random folder to dir and fills r. */
static void make_model(const struct variant *V, const char *dir, struct ref *r)
{
    memset(r, 0, sizeof(*r));
    r->V = V;
    mkdir(dir, 0755);
    struct wlist *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    size_t H = V->hidden, Q = V->heads * V->head_dim, K = V->kv_heads * V->head_dim;
    size_t I = V->inter, dh = V->head_dim;
    double sH = 1.0 / sqrt((double)H), sQ = 1.0 / sqrt((double)Q), sI = 1.0 / sqrt((double)I);
    r->embed = tensor(w, V, "model.embed_tokens.weight", V->vocab, H, -1, 1);
    char n[96];
    for (size_t l = 0; l < V->layers; l++) {
        struct lw *L = &r->L[l];
#define T(field, nm, d0, d1, lo, hi)                                 \
    do {                                                             \
        snprintf(n, sizeof(n), "model.layers.%zu.%s", l, nm);        \
        L->field = tensor(w, V, n, d0, d1, lo, hi);                  \
    } while (0)
        T(ln1, "input_layernorm.weight", H, 0, 0.8, 1.2);
        T(q, "self_attn.q_proj.weight", Q, H, -2 * sH, 2 * sH);
        T(k, "self_attn.k_proj.weight", K, H, -2 * sH, 2 * sH);
        T(v, "self_attn.v_proj.weight", K, H, -sH, sH);
        T(o, "self_attn.o_proj.weight", H, Q, -sQ, sQ);
        if (V->qkv_bias) {
            T(qb, "self_attn.q_proj.bias", Q, 0, -0.5, 0.5);
            T(kb, "self_attn.k_proj.bias", K, 0, -0.5, 0.5);
            T(vb, "self_attn.v_proj.bias", K, 0, -0.5, 0.5);
        }
        if (V->o_bias) T(ob, "self_attn.o_proj.bias", H, 0, -0.3, 0.3);
        if (V->qk_norm) {
            T(qn, "self_attn.q_norm.weight", dh, 0, 0.5, 1.5);
            T(kn, "self_attn.k_norm.weight", dh, 0, 0.5, 1.5);
        }
        T(ln2, "post_attention_layernorm.weight", H, 0, 0.8, 1.2);
        T(g, "mlp.gate_proj.weight", I, H, -2 * sH, 2 * sH);
        T(u, "mlp.up_proj.weight", I, H, -2 * sH, 2 * sH);
        T(d, "mlp.down_proj.weight", H, I, -sI, sI);
        if (V->mlp_bias) {
            T(gb, "mlp.gate_proj.bias", I, 0, -0.3, 0.3);
            T(ub, "mlp.up_proj.bias", I, 0, -0.3, 0.3);
            T(db, "mlp.down_proj.bias", H, 0, -0.3, 0.3);
        }
#undef T
    }
    r->norm = tensor(w, V, "model.norm.weight", H, 0, 0.8, 1.2);
    r->head = V->tied ? r->embed : tensor(w, V, "lm_head.weight", V->vocab, H, -sH, sH);
    char path[512], err[512];
    if (V->sharded) {
        size_t half = w->n / 2;
        snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", dir);
        assert_int_equal(st_write(path, w->t, half, err, sizeof(err)), 0);
        snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
        assert_int_equal(st_write(path, w->t + half, w->n - half, err, sizeof(err)), 0);
        char *idx = malloc(96 * 200), *at = idx;
        at += sprintf(at, "{\"metadata\": {}, \"weight_map\": {");
        for (size_t i = 0; i < w->n; i++)
            at += sprintf(at, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                          w->names[i], i < half ? 1 : 2);
        sprintf(at, "}}\n");
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
        write_file(path, idx);
        free(idx);
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        if (st_write(path, w->t, w->n, err, sizeof(err)) != 0) fail_msg("%s", err);
    }
    for (size_t i = 0; i < w->n; i++) free(w->bufs[i]);
    free(w);
    char cfg[2048], scal[300] = "null", hd[64] = "";
    if (V->scaling && !strcmp(V->scaling, "linear"))
        snprintf(scal, sizeof(scal), "{\"type\": \"linear\", \"factor\": %g}", V->factor);
    else if (V->scaling)
        snprintf(scal, sizeof(scal),
                 "{\"rope_type\": \"llama3\", \"factor\": %g, \"low_freq_factor\": 1.0, "
                 "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}",
                 V->factor);
    if (V->explicit_hd) snprintf(hd, sizeof(hd), "\"head_dim\": %zu, ", V->head_dim);
    snprintf(cfg, sizeof(cfg),
             "{\"model_type\": \"%s\", \"architectures\": [\"X\"], \"vocab_size\": %zu, "
             "\"hidden_size\": %zu, \"num_hidden_layers\": %zu, \"num_attention_heads\": %zu, "
             "\"num_key_value_heads\": %zu, %s\"intermediate_size\": %zu, "
             "\"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-6, \"rope_theta\": %g, "
             "\"rope_scaling\": %s, \"hidden_act\": \"silu\", \"tie_word_embeddings\": %s, "
             "\"attention_bias\": %s, \"mlp_bias\": %s, \"sliding_window\": null}\n",
             V->model_type, V->vocab, H, V->layers, V->heads, V->kv_heads, hd, I, V->theta, scal,
             V->tied ? "true" : "false", V->o_bias ? "true" : "false",
             V->mlp_bias ? "true" : "false");
    snprintf(path, sizeof(path), "%s/config.json", dir);
    write_file(path, cfg);
    /* the reference's frequencies, as transformers computes them */
    for (size_t i = 0; i < dh / 2; i++) {
        double f = 1.0 / pow(V->theta, (double)(2 * i) / (double)dh);
        if (V->scaling && !strcmp(V->scaling, "linear")) f /= V->factor;
        if (V->scaling && !strcmp(V->scaling, "llama3")) {
            double wave = 2 * M_PI / f, lo_w = 64.0, hi_w = 16.0;
            double smooth = (64.0 / wave - 1.0) / 3.0;
            if (wave > lo_w) f = f / V->factor;
            else if (wave >= hi_w) f = (1 - smooth) * f / V->factor + smooth * f;
        }
        r->inv_freq[i] = f;
    }
}

static void ref_free(struct ref *r)
{
    free(r->embed);
    free(r->norm);
    if (!r->V->tied) free(r->head);
    for (size_t l = 0; l < r->V->layers; l++) {
        struct lw *L = &r->L[l];
        double *all[] = {L->ln1, L->q, L->qb, L->k, L->kb, L->v, L->vb, L->o, L->ob,
                         L->qn, L->kn, L->ln2, L->g, L->gb, L->u, L->ub, L->d, L->db};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
    }
}

static void rms(double *y, const double *x, const double *g, size_t w)
{
    double ss = 0;
    for (size_t i = 0; i < w; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / (double)w + 1e-6);
    for (size_t i = 0; i < w; i++) y[i] = x[i] * inv * g[i];
}

/* y[n] = W[n,k] x + b */
static void lin(double *y, const double *W, const double *b, const double *x, size_t n, size_t k)
{
    for (size_t i = 0; i < n; i++) {
        double s = b ? b[i] : 0;
        for (size_t j = 0; j < k; j++) s += W[i * k + j] * x[j];
        y[i] = s;
    }
}

static void rope(double *x, size_t heads, size_t dh, size_t pos, const double *inv)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < dh / 2; i++) {
            double a = x[h * dh + i], b = x[h * dh + i + dh / 2], ang = (double)pos * inv[i];
            x[h * dh + i] = a * cos(ang) - b * sin(ang);
            x[h * dh + i + dh / 2] = b * cos(ang) + a * sin(ang);
        }
}

/* logits [L, vocab] of every position of ids. */
static double *ref_forward(const struct ref *r, const int32_t *ids, size_t Ln)
{
    const struct variant *V = r->V;
    size_t H = V->hidden, dh = V->head_dim, Q = V->heads * dh, K = V->kv_heads * dh, I = V->inter;
    size_t grp = V->heads / V->kv_heads;
    double *x = calloc(Ln * H, 8), *h = calloc(H, 8), *q = calloc(Ln * Q, 8);
    double *k = calloc(Ln * K, 8);
    double *v = calloc(Ln * K, 8), *ctx = calloc(Q, 8), *tmp = calloc(H > I ? H : I, 8);
    double *gg = calloc(I, 8), *uu = calloc(I, 8), *sc = calloc(Ln, 8);
    double *out = calloc(Ln * V->vocab, 8);
    assert_true(x && h && q && k && v && ctx && tmp && gg && uu && sc && out);
    for (size_t t = 0; t < Ln; t++) memcpy(x + t * H, r->embed + (size_t)ids[t] * H, H * 8);
    for (size_t l = 0; l < V->layers; l++) {
        const struct lw *L = &r->L[l];
        for (size_t t = 0; t < Ln; t++) {
            rms(h, x + t * H, L->ln1, H);
            lin(q + t * Q, L->q, L->qb, h, Q, H);
            lin(k + t * K, L->k, L->kb, h, K, H);
            lin(v + t * K, L->v, L->vb, h, K, H);
            if (V->qk_norm) {
                for (size_t a = 0; a < V->heads; a++)
                    rms(q + t * Q + a * dh, q + t * Q + a * dh, L->qn, dh);
                for (size_t a = 0; a < V->kv_heads; a++)
                    rms(k + t * K + a * dh, k + t * K + a * dh, L->kn, dh);
            }
            rope(q + t * Q, V->heads, dh, t, r->inv_freq);
            rope(k + t * K, V->kv_heads, dh, t, r->inv_freq);
        }
        for (size_t t = 0; t < Ln; t++) {
            for (size_t a = 0; a < V->heads; a++) {
                size_t g = a / grp;
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j <= t; j++) {
                    double d = 0;
                    for (size_t e = 0; e < dh; e++)
                        d += q[t * Q + a * dh + e] * k[j * K + g * dh + e];
                    sc[j] = d / sqrt((double)dh);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (size_t j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (size_t e = 0; e < dh; e++) {
                    double o = 0;
                    for (size_t j = 0; j <= t; j++) o += sc[j] / sum * v[j * K + g * dh + e];
                    ctx[a * dh + e] = o;
                }
            }
            lin(tmp, L->o, L->ob, ctx, H, Q);
            for (size_t i = 0; i < H; i++) x[t * H + i] += tmp[i];
            rms(h, x + t * H, L->ln2, H);
            lin(gg, L->g, L->gb, h, I, H);
            lin(uu, L->u, L->ub, h, I, H);
            for (size_t i = 0; i < I; i++) gg[i] = gg[i] / (1 + exp(-gg[i])) * uu[i];
            lin(tmp, L->d, L->db, gg, H, I);
            for (size_t i = 0; i < H; i++) x[t * H + i] += tmp[i];
        }
    }
    for (size_t t = 0; t < Ln; t++) {
        rms(h, x + t * H, r->norm, H);
        lin(out + t * V->vocab, r->head, NULL, h, V->vocab, H);
    }
    free(x), free(h), free(q), free(k), free(v), free(ctx), free(tmp), free(gg), free(uu),
        free(sc);
    return out;
}

static double worst_seen;
/* The runtime run_variant loads on, and its tolerance (test_cuda changes
 * them). */
static const char *rt_backend = "cpu";
static enum model_precision rt_prec = MODEL_FP32;
static enum model_precision rt_cpu_prec = MODEL_FP32;
static double tol = TOL;

static void check_row(const char *what, const float *got, const double *ref, size_t n)
{
    double scale = 1;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (tol * scale);
        if (!(e <= 1.0))
            fail_msg("%s: logit %zu is %.9g, reference %.9g (err/tol %.2f)", what, i,
                     (double)got[i], ref[i], e);
        if (e > worst_seen) worst_seen = e;
    }
}

static struct model_runtime *runtime(void)
{
    struct model_runtime_conf c;
    model_runtime_conf_defaults(&c);
    c.backend = rt_backend;
    c.precision = rt_prec;
    c.cpu_precision = rt_cpu_prec;
    char err[256];
    struct model_runtime *rt = model_runtime_new(&c, err, sizeof(err));
    if (!rt) fail_msg("runtime: %s", err);
    return rt;
}

static struct decoder_ws *ws_make(const struct decoder *d, size_t seqs, size_t tokens,
                                  size_t bt, int all)
{
    char err[256];
    const struct decoder_info *in = decoder_info(d);
    struct decoder_ws_conf c = {.max_seqs = seqs, .max_tokens = tokens, .max_ctx = MAXT,
                                .block_tokens = bt, .all_logits = all};
    /* a block: every layer's keys and values of bt tokens, each value of
     * the backend's cache type: bfloat16 on the CPU under bf16, on CUDA
     * the activation type (2 bytes under fp16 and bf16), else float32 */
    int cuda = strcmp(rt_backend, "cuda") == 0;
    size_t es = (cuda ? rt_prec == MODEL_FP16 || rt_prec == MODEL_BF16
                      : rt_cpu_prec == MODEL_BF16) ? 2 : 4;
    size_t block = in->layers * 2 * bt * in->kv_heads * in->head_dim * es;
    assert_int_equal(block, decoder_kv_block_bytes(d, bt));
    size_t nblocks = seqs * ((MAXT + bt - 1) / bt) + 1;
    c.kv_bytes = block * nblocks;
    struct decoder_ws *ws = decoder_ws_new(d, 0, &c, err, sizeof(err));
    if (!ws) fail_msg("ws: %s", err);
    assert_int_equal(kvcache_total_blocks(decoder_ws_cache(ws)), nblocks);
    return ws;
}

struct seqref {
    int32_t ids[MAXT];
    size_t len, done;
    double *ref;
    int id;
};

static void seq_init(struct seqref *s, const struct ref *r, size_t lo, size_t hi)
{
    s->len = lo + tu_rand64() % (hi - lo + 1);
    for (size_t i = 0; i < s->len; i++) s->ids[i] = (int32_t)(tu_rand64() % r->V->vocab);
    s->ref = ref_forward(r, s->ids, s->len);
    s->done = 0;
}

/* Steps the sequences in random chunks, a random subset each step, until
 * every one is done; every returned row is checked. */
static void run_mixed(const struct decoder *d, struct decoder_ws *ws, struct seqref *S,
                      size_t n, size_t max_chunk, int all, const char *what)
{
    struct kvcache *kv = decoder_ws_cache(ws);
    size_t vocab = decoder_info(d)->vocab;
    for (size_t i = 0; i < n; i++) {
        S[i].done = 0;
        S[i].id = kvcache_seq_new(kv);
        assert_true(S[i].id >= 0);
    }
    for (;;) {
        int seqs[8];
        int32_t ids[MAXT * 4];
        uint32_t off[9] = {0};
        size_t which[8], m = 0;
        for (size_t i = 0; i < n; i++) {
            if (S[i].done == S[i].len || (m && tu_rand64() % 3 == 0)) continue;
            size_t k = 1 + tu_rand64() % max_chunk;
            if (k > S[i].len - S[i].done) k = S[i].len - S[i].done;
            assert_true(kvcache_fits(kv, S[i].id, k));
            memcpy(ids + off[m], S[i].ids + S[i].done, k * sizeof(int32_t));
            seqs[m] = S[i].id;
            which[m] = i;
            off[m + 1] = off[m] + (uint32_t)k;
            m++;
        }
        if (!m) break;
        struct decoder_batch b = {.n = m, .seqs = seqs, .ids = ids, .offsets = off};
        const float *lg;
        int rc = decoder_step(d, ws, &b, &lg);
        if (rc) fail_msg("%s: step: %d %s", what, rc, decoder_ws_error(ws));
        for (size_t j = 0; j < m; j++) {
            struct seqref *s = &S[which[j]];
            size_t k = off[j + 1] - off[j];
            char w[160];
            snprintf(w, sizeof(w), "%s: sequence %zu positions %zu..%zu", what, which[j],
                     s->done, s->done + k - 1);
            if (all)
                for (size_t t = 0; t < k; t++)
                    check_row(w, lg + (off[j] + t) * vocab, s->ref + (s->done + t) * vocab,
                              vocab);
            else
                check_row(w, lg + j * vocab, s->ref + (s->done + k - 1) * vocab, vocab);
            s->done += k;
            assert_int_equal(kvcache_seq_len(kv, s->id), s->done);
        }
    }
    for (size_t i = 0; i < n; i++) kvcache_seq_free(kv, S[i].id);
    assert_int_equal(kvcache_free_blocks(kv), kvcache_total_blocks(kv));
}

/* Refusals: nothing changes. With inject, a dead device last (not on a
 * real CUDA device: its sticky error would end the program's use of it). */
static void check_refusals(const struct decoder *d, struct decoder_ws *ws, int inject)
{
    struct kvcache *kv = decoder_ws_cache(ws);
    int id = kvcache_seq_new(kv);
    int32_t ids[MAXT + 1] = {0};
    uint32_t off[2] = {0, 3};
    struct decoder_batch b = {.n = 1, .seqs = &id, .ids = ids, .offsets = off};
    const float *lg;
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_OK);
    size_t free_before = kvcache_free_blocks(kv);
    ids[1] = (int32_t)decoder_info(d)->vocab; /* out of the vocabulary */
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_EINVAL);
    assert_non_null(strstr(decoder_ws_error(ws), "vocabulary"));
    ids[1] = -1;
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_EINVAL);
    ids[1] = 0;
    off[1] = MAXT - 2; /* 3 + 62 > MAXT */
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_EINVAL);
    off[1] = 3;
    int two[2] = {id, id};
    uint32_t off2[3] = {0, 1, 2};
    struct decoder_batch b2 = {.n = 2, .seqs = two, .ids = ids, .offsets = off2};
    assert_int_equal(decoder_step(d, ws, &b2, &lg), MODEL_EINVAL); /* twice */
    int dead = id + 1;
    b.seqs = &dead;
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_EINVAL); /* not live */
    assert_int_equal(kvcache_seq_len(kv, id), 3);
    assert_int_equal(kvcache_free_blocks(kv), free_before);
    if (!inject) {
        kvcache_seq_free(kv, id);
        return;
    }
    /* a dead device: the sequence keeps its length and blocks */
    b.seqs = &id;
    off[1] = 20;
    decoder_ws_inject_fault(ws);
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_EFATAL);
    assert_non_null(strstr(decoder_ws_error(ws), "fault"));
    assert_int_equal(kvcache_seq_len(kv, id), 3);
    assert_int_equal(kvcache_free_blocks(kv), free_before);
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_OK);
    assert_int_equal(kvcache_seq_len(kv, id), 23);
    kvcache_seq_free(kv, id);
}

/* Picks on the device (decoder_step_sample) against gen_sample on the
 * logits decoder_step gives for a twin sequence (the same tokens, alone
 * in its step, so the same logits bit for bit): ids identical for greedy,
 * and for a draw unless it lies within 1e-9 of a boundary of the host's
 * walk (counted; test_cuda_sample.c states the rule); log-probabilities
 * within 1e-5. A backend without a sampler refuses the call. */
static void check_device_sample(const struct decoder *d, struct decoder_ws *ws)
{
    struct kvcache *kv = decoder_ws_cache(ws);
    size_t vocab = decoder_info(d)->vocab;
    int a = kvcache_seq_new(kv), b = kvcache_seq_new(kv);
    assert_true(a >= 0 && b >= 0);
    int32_t ids[4];
    uint32_t off[2] = {0, 4};
    for (int i = 0; i < 4; i++) ids[i] = (int32_t)(tu_rand64() % vocab);
    struct decoder_batch ba = {.n = 1, .seqs = &a, .ids = ids, .offsets = off};
    struct decoder_batch bb = {.n = 1, .seqs = &b, .ids = ids, .offsets = off};
    struct decoder_sample row;
    struct decoder_pick pick;
    if (!decoder_ws_samples(ws)) {
        memset(&row, 0, sizeof(row));
        assert_int_equal(decoder_step_sample(d, ws, &bb, &row, &pick), MODEL_EINVAL);
        kvcache_seq_free(kv, a);
        kvcache_seq_free(kv, b);
        return;
    }
    struct decoder_ws_counters c0, c1;
    decoder_ws_counters(ws, &c0);
    float *lg = malloc(vocab * sizeof(float));
    struct gen_scratch *sc = gen_scratch_new(vocab);
    assert_true(lg && sc);
    size_t near = 0;
    for (int step = 0; step < 12; step++) {
        const float *out;
        int rc = decoder_step(d, ws, &ba, &out);
        if (rc) fail_msg("device sample: step: %d %s", rc, decoder_ws_error(ws));
        memcpy(lg, out, vocab * sizeof(float));
        struct gen_sampling sp;
        gen_sampling_defaults(&sp);
        if (step % 4) sp.temperature = tu_randf(0.3f, 1.5f);
        if (step % 4 == 2) sp.top_k = (uint32_t)(1 + tu_rand64() % vocab);
        if (step % 4 == 3) sp.top_p = tu_randf(0.1f, 1.0f), sp.min_p = tu_randf(0.0f, 0.3f);
        struct gen_rng rng, copy;
        gen_rng_seed(&rng, tu_rand64());
        copy = rng;
        row = (struct decoder_sample){.temperature = sp.temperature, .top_k = sp.top_k,
                                      .top_p = sp.top_p, .min_p = sp.min_p,
                                      .u = gen_rng_uniform(&copy), .on = 1, .logprob = 1};
        rc = decoder_step_sample(d, ws, &bb, &row, &pick);
        if (rc) fail_msg("device sample: %d %s", rc, decoder_ws_error(ws));
        float lp;
        int32_t want = gen_sample(lg, vocab, &sp, sp.temperature > 0 ? &rng : NULL, sc, &lp);
        assert_true(want >= 0);
        if (pick.id != want) {
            size_t m = gen_filter(lg, vocab, &sp, sc);
            double acc = 0;
            int at = 0;
            for (size_t i = 0; i < m; i++) {
                acc += gen_scratch_prob(sc, gen_scratch_ids(sc)[i]);
                at |= fabs(acc - row.u) < 1e-9;
            }
            if (sp.temperature == 0 || !at)
                fail_msg("device sample, step %d: device %d, host %d (T %g)", step, pick.id,
                         want, (double)sp.temperature);
            near++;
        } else if (!(fabs((double)pick.logprob - (double)lp) <= 1e-5 * fmax(1, fabs(lp)))) {
            fail_msg("device sample, step %d: logprob %.9g, host %.9g", step,
                     (double)pick.logprob, (double)lp);
        }
        /* both go on with the host's token */
        ids[0] = want;
        off[1] = 1;
    }
    decoder_ws_counters(ws, &c1);
    assert_true(c1.device_picks == c0.device_picks + 12);
    assert_true(c1.logits_bytes == c0.logits_bytes + 12 * vocab * sizeof(float));
    assert_true(near <= 1);
    free(lg);
    gen_scratch_destroy(sc);
    kvcache_seq_free(kv, a);
    kvcache_seq_free(kv, b);
}

/* Overlap (decoder_step_submit, decoder_step_collect): two sequences
 * read a prompt each and go on greedily for 8 steps, first step by step
 * with their picks fed back as ids (decoder_step_sample), then submitted
 * with each step after the first chained to the one before (ids from
 * its picks on the device) before that one is collected. The picks and
 * their log-probabilities are the same bit for bit (the same rows in the
 * same shapes). What the calls refuse changes nothing: a chain after a
 * step with a row not picking or with other sequences, a third step in
 * flight, decoder_step while one is, a collect with none. On the CPU
 * backend (no sampler) there is no overlap and submit refuses. */
static void check_chained(const struct decoder *d, struct decoder_ws *ws)
{
    struct kvcache *kv = decoder_ws_cache(ws);
    size_t vocab = decoder_info(d)->vocab;
    enum { STEPS = 8 };
    int32_t prompt[6], ids[6];
    for (int i = 0; i < 6; i++) prompt[i] = (int32_t)(tu_rand64() % vocab);
    uint32_t off[3] = {0, 4, 6}, one[3] = {0, 1, 2};
    struct decoder_sample rows[2] = {{.on = 1, .logprob = 1}, {.on = 1, .logprob = 1}};
    struct decoder_pick want[STEPS][2], got[STEPS][2];
    int s[2];
    if (!decoder_ws_overlaps(ws)) {
        assert_int_equal(decoder_ws_samples(ws), 0);
        s[0] = kvcache_seq_new(kv);
        struct decoder_batch b = {.n = 1, .seqs = s, .ids = prompt, .offsets = off};
        assert_int_equal(decoder_step_submit(d, ws, &b, rows, 0), MODEL_EINVAL);
        assert_int_equal(kvcache_seq_len(kv, s[0]), 0);
        kvcache_seq_free(kv, s[0]);
        return;
    }
    /* step by step */
    s[0] = kvcache_seq_new(kv);
    s[1] = kvcache_seq_new(kv);
    struct decoder_batch b = {.n = 2, .seqs = s, .ids = prompt, .offsets = off};
    for (int t = 0; t < STEPS; t++) {
        int rc = decoder_step_sample(d, ws, &b, rows, want[t]);
        if (rc) fail_msg("chained: step %d: %d %s", t, rc, decoder_ws_error(ws));
        ids[0] = want[t][0].id;
        ids[1] = want[t][1].id;
        b.ids = ids;
        b.offsets = one;
    }
    kvcache_seq_free(kv, s[0]);
    kvcache_seq_free(kv, s[1]);
    /* chained */
    s[0] = kvcache_seq_new(kv);
    s[1] = kvcache_seq_new(kv);
    struct decoder_ws_counters c0, c1;
    decoder_ws_counters(ws, &c0);
    b = (struct decoder_batch){.n = 2, .seqs = s, .ids = prompt, .offsets = off};
    assert_int_equal(decoder_step_submit(d, ws, &b, rows, 0), MODEL_OK);
    assert_int_equal(decoder_ws_in_flight(ws), 1);
    const float *lg;
    assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_EINVAL); /* one is in flight */
    struct decoder_batch c = {.n = 2, .seqs = s, .ids = NULL, .offsets = one};
    for (int t = 1; t < STEPS; t++) {
        int rc = decoder_step_submit(d, ws, &c, rows, 1);
        if (rc) fail_msg("chained: submit %d: %d %s", t, rc, decoder_ws_error(ws));
        assert_int_equal(decoder_ws_in_flight(ws), 2);
        size_t len = kvcache_seq_len(kv, s[0]);
        assert_int_equal(decoder_step_submit(d, ws, &c, rows, 1), MODEL_EINVAL); /* a third */
        assert_int_equal(kvcache_seq_len(kv, s[0]), len);
        assert_int_equal(decoder_step_collect(d, ws, got[t - 1]), MODEL_OK);
    }
    assert_int_equal(decoder_step_collect(d, ws, got[STEPS - 1]), MODEL_OK);
    assert_int_equal(decoder_ws_in_flight(ws), 0);
    assert_int_equal(decoder_step_collect(d, ws, got[0]), MODEL_EINVAL); /* none in flight */
    decoder_ws_counters(ws, &c1);
    assert_true(c1.steps == c0.steps + STEPS && c1.device_picks == c0.device_picks + 2 * STEPS);
    for (int t = 0; t < STEPS; t++)
        for (int i = 0; i < 2; i++) {
            assert_int_equal(got[t][i].id, want[t][i].id);
            assert_memory_equal(&got[t][i].logprob, &want[t][i].logprob, sizeof(float));
        }
    /* refused chains: other sequences (swapped), or after a row that did not pick */
    size_t len0 = kvcache_seq_len(kv, s[0]);
    int swapped[2] = {s[1], s[0]};
    c.seqs = swapped;
    assert_int_equal(decoder_step_submit(d, ws, &c, rows, 1), MODEL_EINVAL);
    c.seqs = s;
    ids[0] = got[STEPS - 1][0].id;
    ids[1] = got[STEPS - 1][1].id;
    b = (struct decoder_batch){.n = 2, .seqs = s, .ids = ids, .offsets = one};
    struct decoder_sample half[2] = {{.on = 1}, {.on = 0}};
    struct decoder_pick p[2];
    assert_int_equal(decoder_step_sample(d, ws, &b, half, p), MODEL_OK);
    assert_int_equal(decoder_step_submit(d, ws, &c, rows, 1), MODEL_EINVAL);
    assert_int_equal(kvcache_seq_len(kv, s[0]), len0 + 1);
    assert_int_equal(decoder_ws_in_flight(ws), 0);
    kvcache_seq_free(kv, s[0]);
    kvcache_seq_free(kv, s[1]);
}

static void run_variant(const struct variant *V)
{
    char dir[] = "/tmp/kinfer_test_decoder_XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct ref r;
    make_model(V, dir, &r);
    struct model_runtime *rt = runtime();
    struct model_spec spec = {0};
    snprintf(spec.name, sizeof(spec.name), "%s", V->name);
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    char err[512];
    struct decoder *d = decoder_load(rt, &spec, err, sizeof(err));
    if (!d) fail_msg("%s: load: %s", V->name, err);
    const struct decoder_info *in = decoder_info(d);
    assert_int_equal(in->vocab, V->vocab);
    assert_int_equal(in->head_dim, V->head_dim);
    assert_int_equal(in->kv_heads, V->kv_heads);
    assert_int_equal(in->context, 128);
    assert_int_equal(in->bos_id, -1); /* the test's config.json names none */
    assert_int_equal(in->n_eos, 0);
    worst_seen = 0;
    struct seqref S[3];
    seq_init(&S[0], &r, 5, 40);
    seq_init(&S[1], &r, 1, 30);
    seq_init(&S[2], &r, 2, 50);
    char what[128];
    /* (a) one prefill, every position */
    struct decoder_ws *ws = ws_make(d, 3, MAXT, 16, 1);
    snprintf(what, sizeof(what), "%s prefill", V->name);
    run_mixed(d, ws, S, 1, MAXT, 1, what);
    check_refusals(d, ws, !strcmp(rt_backend, "cpu"));
    assert_int_equal(decoder_ws_samples(ws), 0); /* all_logits: the caller samples */
    /* (c) mixed batches in random chunks, every position */
    snprintf(what, sizeof(what), "%s mixed", V->name);
    run_mixed(d, ws, S, 3, 7, 1, what);
    decoder_ws_destroy(ws);
    /* (b), (d) token by token and tiny blocks, last logits only */
    for (size_t bt = 1; bt <= 3; bt++) {
        ws = ws_make(d, 3, 3 * 4, bt, 0);
        snprintf(what, sizeof(what), "%s one by one, block %zu", V->name, bt);
        run_mixed(d, ws, S, 1, 1, 0, what);
        snprintf(what, sizeof(what), "%s mixed, block %zu", V->name, bt);
        run_mixed(d, ws, S, 3, 4, 0, what);
        assert_int_equal(decoder_ws_samples(ws), strcmp(rt_backend, "cpu") != 0);
        /* on CUDA (graphs on by default) the decode steps replayed */
        struct decoder_ws_counters cnt;
        decoder_ws_counters(ws, &cnt);
        if (strcmp(rt_backend, "cpu"))
            assert_true(cnt.graph_steps > 0 && cnt.graph_steps < cnt.steps);
        else
            assert_true(cnt.graph_steps == 0);
        check_device_sample(d, ws);
        check_chained(d, ws);
        decoder_ws_destroy(ws);
    }
    printf("  %-8s worst err/tol %.3f (%s %s)\n", V->name, worst_seen, rt_backend,
           model_precision_name(strcmp(rt_backend, "cpu") ? rt_prec : rt_cpu_prec));
    for (int i = 0; i < 3; i++) free(S[i].ref);
    decoder_destroy(d);
    model_runtime_destroy(rt);
    ref_free(&r);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_variants(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) run_variant(&variants[i]);
}

/* A folder the loader refuses names what is wrong. */
static void test_refused_folders(void **state)
{
    (void)state;
    char dir[] = "/tmp/kinfer_test_decoder_XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct ref r;
    make_model(&variants[0], dir, &r);
    ref_free(&r);
    struct model_runtime *rt = runtime();
    struct model_spec spec = {0};
    snprintf(spec.name, sizeof(spec.name), "bad");
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    char err[512], path[600];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    static const struct {
        const char *cfg, *says;
    } cases[] = {
        {"{\"model_type\": \"gpt2\"}", "not a decoder"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 61, \"hidden_size\": 32, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 3, "
         "\"intermediate_size\": 48}", "multiple"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 61, \"hidden_size\": 32, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
         "\"intermediate_size\": 48, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2}}",
         "yarn"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 61, \"hidden_size\": 32, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
         "\"intermediate_size\": 50}", "gate_proj"},
        {"{\"model_type\": \"qwen2\", \"vocab_size\": 61, \"hidden_size\": 32, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
         "\"intermediate_size\": 48}", "q_proj.bias"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 61, \"hidden_size\": 32, "
         "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
         "\"intermediate_size\": 48}", "layers.2"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_file(path, cases[i].cfg);
        assert_null(decoder_load(rt, &spec, err, sizeof(err)));
        if (!strstr(err, cases[i].says)) fail_msg("case %zu: %s", i, err);
        assert_non_null(strstr(err, "model bad"));
    }
    model_runtime_destroy(rt);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The demo folder loads as a decoder, its tokenizer reads a ChatML
 * prompt with the specials as single tokens, and greedy decoding runs;
 * the same seed writes the same weights. */
static void test_demo(void **state)
{
    (void)state;
    char dir[] = "/tmp/kinfer_test_decoder_XXXXXX", err[512], sub[600];
    assert_non_null(mkdtemp(dir));
    snprintf(sub, sizeof(sub), "%s/demo", dir);
    assert_int_equal(decoder_write_demo(sub, 2, 32, 4, 2, 64, 7, err, sizeof(err)), 0);
    assert_int_equal(decoder_write_demo(sub, 2, 30, 4, 2, 64, 7, err, sizeof(err)), -1);
    struct model_runtime *rt = runtime();
    struct model_spec spec = {0};
    snprintf(spec.name, sizeof(spec.name), "demo");
    snprintf(spec.path, sizeof(spec.path), "%s", sub);
    struct decoder *d = decoder_load(rt, &spec, err, sizeof(err));
    if (!d) fail_msg("demo: %s", err);
    struct tokenizer *tok = tokenizer_load(sub, NULL, err, sizeof(err));
    if (!tok) fail_msg("demo tokenizer: %s", err);
    assert_int_equal(tokenizer_vocab_size(tok), decoder_info(d)->vocab);
    assert_int_equal(decoder_info(d)->bos_id, 0); /* generation_config.json's */
    assert_int_equal(decoder_info(d)->n_eos, 2);
    assert_int_equal(decoder_info(d)->eos_ids[0], 2);
    assert_int_equal(decoder_info(d)->eos_ids[1], 0);
    assert_int_equal(tokenizer_token_id(tok, "<|im_start|>"), 1);
    assert_int_equal(tokenizer_token_id(tok, "<|im_end|>"), 2);
    struct tokenizer_scratch *sc = tokenizer_scratch_new(0);
    static const char prompt[] = "<|im_start|>user\nthe movie was great<|im_end|>\n"
                                 "<|im_start|>assistant\n";
    int32_t ids[MAXT];
    int n = tokenizer_encode(tok, sc, prompt, strlen(prompt), NULL, 0, 0, 0, ids, NULL, MAXT,
                             NULL, err, sizeof(err));
    if (n <= 0) fail_msg("encode: %s", err);
    assert_int_equal(ids[0], 1);
    struct decoder_ws *ws = ws_make(d, 1, MAXT, 16, 0);
    int id = kvcache_seq_new(decoder_ws_cache(ws));
    uint32_t off[2] = {0, (uint32_t)n};
    struct decoder_batch b = {.n = 1, .seqs = &id, .ids = ids, .offsets = off};
    const float *lg;
    for (int step = 0; step < 8; step++) {
        assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_OK);
        int32_t best = 0;
        for (size_t v = 1; v < decoder_info(d)->vocab; v++)
            if (lg[v] > lg[best]) best = (int32_t)v;
        ids[0] = best;
        off[1] = 1;
    }
    assert_int_equal(kvcache_seq_len(decoder_ws_cache(ws), id), (size_t)n + 7);
    decoder_ws_destroy(ws);
    tokenizer_scratch_destroy(sc);
    tokenizer_destroy(tok);
    decoder_destroy(d);
    model_runtime_destroy(rt);
    /* the same seed, the same bytes */
    char a[700], b2[700], cmd[1600];
    snprintf(a, sizeof(a), "%s/model.safetensors", sub);
    snprintf(b2, sizeof(b2), "%s/again", dir);
    assert_int_equal(decoder_write_demo(b2, 2, 32, 4, 2, 64, 7, err, sizeof(err)), 0);
    snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s/model.safetensors'", a, b2);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Every variant through tests/torch_decoder.py (one start of python). */
static void test_torch(void **state)
{
    (void)state;
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        const char *no = getenv("KINFER_TEST_NO_TORCH");
        if (no && !strcmp(no, "1")) {
            printf("test_torch: skipped: /usr/bin/python3 cannot import torch "
                   "(KINFER_TEST_NO_TORCH=1)\n");
            skip();
        }
        fail_msg("python3-torch missing: make deps (KINFER_TEST_NO_TORCH=1 skips this check)");
    }
    if (access(TORCH_PY, R_OK) != 0)
        fail_msg("%s not found: run from the repository root", TORCH_PY);
    enum { NV = sizeof(variants) / sizeof(variants[0]) };
    char root[] = "/tmp/kinfer_test_decoder_XXXXXX", dir[NV][600], req[NV][600], err[512];
    assert_non_null(mkdtemp(root));
    static struct ref r[NV];
    struct seqref S[NV];
    float *got[NV];
    size_t cmdcap = 8192, cmdlen;
    char *cmd = malloc(cmdcap);
    assert_non_null(cmd);
    cmdlen = (size_t)snprintf(cmd, cmdcap, "/usr/bin/python3 %s", TORCH_PY);
    struct model_runtime *rt = runtime();
    for (size_t v = 0; v < NV; v++) {
        snprintf(dir[v], sizeof(dir[v]), "%s/%s", root, variants[v].name);
        make_model(&variants[v], dir[v], &r[v]);
        seq_init(&S[v], &r[v], 8, 40);
        struct model_spec spec = {0};
        snprintf(spec.name, sizeof(spec.name), "%s", variants[v].name);
        snprintf(spec.path, sizeof(spec.path), "%s", dir[v]);
        struct decoder *d = decoder_load(rt, &spec, err, sizeof(err));
        if (!d) fail_msg("%s", err);
        struct decoder_ws *ws = ws_make(d, 1, MAXT, 16, 1);
        int id = kvcache_seq_new(decoder_ws_cache(ws));
        uint32_t off[2] = {0, (uint32_t)S[v].len};
        struct decoder_batch b = {.n = 1, .seqs = &id, .ids = S[v].ids, .offsets = off};
        const float *lg;
        assert_int_equal(decoder_step(d, ws, &b, &lg), MODEL_OK);
        size_t n = S[v].len * variants[v].vocab;
        got[v] = malloc(n * sizeof(float));
        assert_non_null(got[v]);
        memcpy(got[v], lg, n * sizeof(float));
        decoder_ws_destroy(ws);
        decoder_destroy(d);
        json_t *ids = json_array();
        for (size_t t = 0; t < S[v].len; t++) json_array_append_new(ids, json_integer(S[v].ids[t]));
        json_t *j = json_pack("{s:o}", "ids", ids);
        snprintf(req[v], sizeof(req[v]), "%s/req_%s.json", root, variants[v].name);
        assert_int_equal(json_dump_file(j, req[v], 0), 0);
        json_decref(j);
        cmdlen += (size_t)snprintf(cmd + cmdlen, cmdcap - cmdlen, " '%s' '%s'", dir[v], req[v]);
        assert_true(cmdlen < cmdcap);
    }
    model_runtime_destroy(rt);
    char outp[700], errp[700];
    snprintf(outp, sizeof(outp), "%s/torch_out.json", root);
    snprintf(errp, sizeof(errp), "%s/torch_err.txt", root);
    snprintf(cmd + cmdlen, cmdcap - cmdlen, " >'%s' 2>'%s'", outp, errp);
    int rc = system(cmd);
    if (rc != 0) {
        char msg[2048] = "";
        FILE *f = fopen(errp, "r");
        if (f) {
            size_t k = fread(msg, 1, sizeof(msg) - 1, f);
            msg[k] = '\0';
            fclose(f);
        }
        fail_msg("%s failed (status %d): %s", TORCH_PY, rc, msg);
    }
    json_error_t je;
    json_t *res = json_load_file(outp, 0, &je);
    if (!res || json_array_size(res) != NV) fail_msg("%s: not %d results", outp, (int)NV);
    for (size_t v = 0; v < NV; v++) {
        size_t V = variants[v].vocab, n = S[v].len * V, k = 0, i, c;
        double *pt = malloc(n * sizeof(double)), scale = 1, worst64 = 0;
        assert_non_null(pt);
        json_t *rows = json_object_get(json_array_get(res, v), "logits"), *row, *x;
        json_array_foreach(rows, i, row) json_array_foreach(row, c, x) {
            if (k >= n || !json_is_number(x)) fail_msg("%s: PyTorch's output is not %zu numbers",
                                                       variants[v].name, n);
            pt[k++] = json_number_value(x);
        }
        if (k != n) fail_msg("%s: PyTorch gave %zu values, kinfer %zu", variants[v].name, k, n);
        for (k = 0; k < n; k++) scale = fmax(scale, fabs(S[v].ref[k]));
        for (k = 0; k < n; k++) {
            double e = fabs(pt[k] - S[v].ref[k]);
            if (!(e <= 1e-5 * scale))
                fail_msg("%s: [%zu] PyTorch %.17g, reference %.17g", variants[v].name, k, pt[k],
                         S[v].ref[k]);
            worst64 = fmax(worst64, e / scale);
        }
        worst_seen = 0;
        char what[160];
        snprintf(what, sizeof(what), "%s (kinfer vs PyTorch)", variants[v].name);
        for (size_t t = 0; t < S[v].len; t++) check_row(what, got[v] + t * V, pt + t * V, V);
        printf("  %-30s kinfer err/tol %.3f, |torch - ref| / scale %.2g\n", what, worst_seen,
               worst64);
        free(pt);
        free(got[v]);
        free(S[v].ref);
        ref_free(&r[v]);
    }
    json_decref(res);
    snprintf(cmd, cmdcap, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
    free(cmd);
}

/* Every variant on the CPU backend in bf16 (worker.cpu_precision), on the
 * AMX tiles where the CPU has them and with the bfloat16 weights widened
 * in registers, against the same reference within 4e-2 of the largest
 * logit (an estimate written before a run: inputs rounded to 8 bits of
 * mantissa, sums in float32, activations kept in float32 between the
 * products, so tighter than the CUDA backend's bf16). */
static void test_cpu_bf16(void **state)
{
    (void)state;
    int amx = cpu_amx_ready();
    rt_cpu_prec = MODEL_BF16;
    tol = 4e-2;
    for (int on = amx; on >= 0; on--) {
        cpu_amx_allow(on);
        printf("  CPU bf16, %s:\n", on ? "AMX tiles" : "weights widened");
        double before = worst_seen;
        worst_seen = 0;
        for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++)
            run_variant(&variants[i]);
        printf("  CPU bf16 (%s): worst err/tol %.3f (tol %g)\n", on ? "AMX" : "widened",
               worst_seen, tol);
        worst_seen = before;
    }
    cpu_amx_allow(1);
    rt_cpu_prec = MODEL_FP32;
    tol = TOL;
}

/* Every variant on the CUDA backend in every precision, against the same
 * reference: within 1e-4 of the largest logit in fp32, 1e-2 in tf32, 2e-2
 * in fp16 and 8e-2 in bf16 (test_cuda_prims.c's per-primitive bounds,
 * estimates written before a run). On the emulated device in the
 * build/emu/ program; without a usable device it prints why and passes
 * (test_gpu answers for the device's presence). */
static void test_cuda(void **state)
{
    (void)state;
    char cuda[512];
    model_cuda_describe(cuda, sizeof(cuda));
    if (!model_cuda_built() || strstr(cuda, " 0 usable devices")) {
        printf("  CUDA: skipped, no CUDA device (%s)\n", cuda);
        return;
    }
    static const double tols[MODEL_N_PRECISIONS] = {
        [MODEL_FP32] = 1e-4, [MODEL_TF32] = 1e-2, [MODEL_FP16] = 2e-2, [MODEL_BF16] = 8e-2};
    rt_backend = "cuda";
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        rt_prec = (enum model_precision)p;
        tol = tols[p];
        for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++)
            run_variant(&variants[i]);
    }
    rt_backend = "cpu";
    rt_prec = MODEL_FP32;
    tol = TOL;
}

int main(void)
{
    tu_seed("test_decoder");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_refused_folders),
        cmocka_unit_test(test_demo),
        cmocka_unit_test(test_torch),
        cmocka_unit_test(test_cpu_bf16),
        cmocka_unit_test(test_cuda), /* stays last */
    };
    size_t n = sizeof(tests) / sizeof(tests[0]), first = 0;
#ifdef KINFER_EMU
    first = n - 1; /* the CUDA backend on the emulated device only */
#endif
    return _cmocka_run_group_tests("test_decoder", tests + first, n - first, NULL, NULL);
}

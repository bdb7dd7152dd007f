/* test_arch_nomic.c - NomicBERT encoders (gpu/arch_nomic.c) on the CPU and
 * CUDA backends, through the public API (model_load, model_ws_new_tokens,
 * model_encode), against a float64 reference written here from the
 * model's definition, and against PyTorch (tests/torch_nomic.py, the
 * same model written by hand in torch):
 *   - small random folders with NomicBertModel's tensor names and
 *     NomicBertConfig's keys (n_embd, n_head, ...; also the Hugging Face
 *     aliases hidden_size, ...), F32/F16/BF16, with and without the
 *     biases qkv_proj_bias, mlp_fc1_bias and mlp_fc2_bias switch on, bare
 *     and under "bert.", with one and two token types, rotary bases 1000
 *     and 10000, cls, mean and max pooling (modules.json), normalized or
 *     not, per-token output;
 *   - one sequence of the longest allowed length in every batch, so every
 *     rotary position takes part, and two of them differing only in order
 *     give different vectors (positions matter);
 *   - what model_encoder() reports and the parameter count;
 *   - load errors: a missing tensor named, a wrong shape, each config key
 *     this build does not run (another activation, prenorm, interleaved
 *     or partial rotary, rotary scaling, mixture of experts, RMSNorm) named.
 *
 * The reference reads nothing back: the writer keeps each tensor's double
 * twin rounded through the file's dtype, so only kinfer's arithmetic is
 * measured; rotary frequencies are rounded to float32 as the model's own
 * code computes them. Each sequence runs alone, in double.
 *
 * Tolerance: each output within 2e-5 * max(1, |ref|) of the reference on
 * the CPU (float32 GEMMs over hidden sizes of 32 to 64; test_encoder.c's
 * reasoning); PyTorch (float64) within 1e-9 of it; on CUDA test_gpu.c's
 * encoder tolerances per precision.
 *
 * The program built over the emulated device (build/emu/tests/, make
 * test) runs only test_cuda. Runs from the repository root; folders
 * under a temporary directory removed at the end. The PyTorch check needs
 * /usr/bin/python3 with torch (make deps); KINFER_TEST_NO_TORCH=1 skips it
 * with a printed line. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../gpu/model.h"
#include "../gpu/safetensors.h"
#include "refencoder.h"
#include "testutil.h"

#define TOL 2e-5
#define TOL_F64 1e-9
#define TORCH_PY "tests/torch_nomic.py"
#define MAXT 128      /* tensors in a folder */
#define MAXTOK 512    /* tokens in a test batch */

/* ---- a test folder, as a table row ------------------------------------- */

struct desc {
    const char *what;
    const char *dtype;            /* NULL: F32 */
    size_t layers, hidden, heads, inter, n_pos, type_vocab; /* 2, 32, 4, 48, 24, 2 */
    int qkv_bias, fc1_bias, fc2_bias;
    int prefix;                   /* tensors under "bert." */
    int hf_keys;                  /* hidden_size ... instead of n_embd ... */
    double base;                  /* rotary_emb_base; 0: 1000 */
    int st;                       /* modules.json with st_pool (else cls) */
    enum model_pooling st_pool;
    int st_normalize;
    const char *pooling;          /* the entry's override */
    /* error rows: */
    const char *omit, *misshape;  /* a tensor left out, or one row longer */
    const char *cfg_key, *cfg_json; /* set config.json key to this JSON */
    const char *want;             /* the load error must say this */
};

static void defaults(struct desc *d)
{
    if (!d->layers) d->layers = 2;
    if (!d->hidden) d->hidden = 32;
    if (!d->heads) d->heads = 4;
    if (!d->inter) d->inter = 48;
    if (!d->n_pos) d->n_pos = 24;
    if (!d->type_vocab) d->type_vocab = 2;
    if (!d->dtype) d->dtype = "F32";
    if (!d->base) d->base = 1000;
}

/* ---- the folder and its float64 twin ----------------------------------- */

struct ref {
    struct desc d;
    size_t vocab;
    char names[MAXT][96];   /* bare names */
    double *t[MAXT];
    size_t n, n_params;
};

static double *ref_t(const struct ref *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->names[i], name)) return r->t[i];
    return NULL;
}

static void ref_free(struct ref *r)
{
    for (size_t i = 0; i < r->n; i++) free(r->t[i]);
    r->n = 0;
}

struct writer {
    struct ref *r;
    enum st_dtype dt;
    struct st_write_tensor t[MAXT];
    char names[MAXT][128];
    uint64_t shapes[MAXT][2];
    void *raw[MAXT];
    size_t n;
};

/* A random tensor [d0] or [d0,d1] in [lo,hi), rounded through the dtype;
 * its twin kept under its bare name. */
static void wt(struct writer *w, const char *name, size_t d0, size_t d1, float lo, float hi)
{
    struct ref *r = w->r;
    size_t numel = d0 * (d1 ? d1 : 1);
    assert_true(w->n < MAXT && r->n < MAXT);
    double *twin = malloc(numel * sizeof(double));
    assert_non_null(twin);
    size_t stored = r->d.misshape && !strcmp(r->d.misshape, name) ? d0 + 1 : d0;
    size_t snumel = stored * (d1 ? d1 : 1);
    void *raw = malloc(snumel * 4);
    double *vals = malloc(snumel * sizeof(double));
    assert_true(raw && vals);
    fill_weights(w->dt, snumel, lo, hi, raw, vals);
    memcpy(twin, vals, numel * sizeof(double));
    free(vals);
    snprintf(r->names[r->n], sizeof(r->names[r->n]), "%s", name);
    r->t[r->n++] = twin;
    if (r->d.omit && !strcmp(r->d.omit, name)) {
        free(raw);
        return;
    }
    r->n_params += numel;
    snprintf(w->names[w->n], sizeof(w->names[w->n]), "%s%s", r->d.prefix ? "bert." : "", name);
    w->shapes[w->n][0] = stored;
    w->shapes[w->n][1] = d1;
    w->raw[w->n] = raw;
    w->t[w->n] = (struct st_write_tensor){w->names[w->n], w->dt, d1 ? 2 : 1, w->shapes[w->n],
                                         raw};
    w->n++;
}

/* A linear module's weight [out,in] and, when bias, its bias. */
static void wlin(struct writer *w, const char *module, size_t out, size_t in, int bias)
{
    char n[128];
    float s = 1.5f / sqrtf((float)in);
    snprintf(n, sizeof(n), "%s.weight", module);
    wt(w, n, out, in, -s, s);
    if (!bias) return;
    snprintf(n, sizeof(n), "%s.bias", module);
    wt(w, n, out, 0, -0.2f, 0.2f);
}

static void wln(struct writer *w, const char *module, size_t H)
{
    char n[128];
    snprintf(n, sizeof(n), "%s.weight", module);
    wt(w, n, H, 0, 0.5f, 1.5f);
    snprintf(n, sizeof(n), "%s.bias", module);
    wt(w, n, H, 0, -0.5f, 0.5f);
}

/* Writes the folder of din into dir (vocab.txt of refencoder.h's words,
 * config.json, modules.json when asked, model.safetensors) and fills r. */
static void write_folder(const struct desc *din, const char *dir, struct ref *r)
{
    memset(r, 0, sizeof(*r));
    r->d = *din;
    defaults(&r->d);
    const struct desc *d = &r->d;
    if (mkdir(dir, 0755) != 0 && access(dir, F_OK) != 0) fail_msg("mkdir %s", dir);
    size_t cap = 16 * RE_N_WORDS, off = 0;
    char *v = malloc(cap), buf[1024];
    assert_non_null(v);
    for (size_t i = 0; i < RE_N_WORDS; i++)
        off += (size_t)snprintf(v + off, cap - off, "%s\n", re_words[i]);
    re_write_text(dir, "vocab.txt", v);
    free(v);
    re_write_text(dir, "tokenizer_config.json", "{\"do_lower_case\": true}\n");
    r->vocab = RE_N_WORDS + 6; /* padded, as NomicBERT pads its vocabulary */
    json_t *cfg = json_pack("{s:s, s:[s], s:I, s:s, s:f, s:f, s:b, s:b, s:b, s:b, s:n}",
                            "model_type", "nomic_bert", "architectures", "NomicBertModel",
                            "vocab_size", (json_int_t)r->vocab, "activation_function", "swiglu",
                            "rotary_emb_base", d->base, "rotary_emb_fraction", 1.0,
                            "rotary_emb_interleaved", 0, "prenorm", 0, "causal", 0,
                            "use_rms_norm", 0, "rotary_scaling_factor");
    assert_non_null(cfg);
#define SET(k, x) json_object_set_new(cfg, (k), (x))
    SET(d->hf_keys ? "hidden_size" : "n_embd", json_integer((json_int_t)d->hidden));
    SET(d->hf_keys ? "num_hidden_layers" : "n_layer", json_integer((json_int_t)d->layers));
    SET(d->hf_keys ? "num_attention_heads" : "n_head", json_integer((json_int_t)d->heads));
    SET(d->hf_keys ? "intermediate_size" : "n_inner", json_integer((json_int_t)d->inter));
    SET(d->hf_keys ? "max_position_embeddings" : "n_positions",
        json_integer((json_int_t)d->n_pos));
    SET("type_vocab_size", json_integer((json_int_t)d->type_vocab));
    SET("layer_norm_epsilon", json_real(1e-5));
    SET("qkv_proj_bias", json_boolean(d->qkv_bias));
    SET("mlp_fc1_bias", json_boolean(d->fc1_bias));
    SET("mlp_fc2_bias", json_boolean(d->fc2_bias));
    if (d->cfg_key) {
        json_error_t je;
        json_t *x = json_loads(d->cfg_json, JSON_DECODE_ANY, &je);
        assert_non_null(x);
        SET(d->cfg_key, x);
    }
#undef SET
    snprintf(buf, sizeof(buf), "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, buf, JSON_INDENT(2)), 0);
    json_decref(cfg);
    if (d->st) {
        snprintf(buf, sizeof(buf),
                 "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
                 "\"sentence_transformers.models.Transformer\"},\n"
                 " {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": "
                 "\"sentence_transformers.models.Pooling\"}%s]\n",
                 d->st_normalize ? ",\n {\"idx\": 2, \"name\": \"2\", \"path\": "
                                   "\"2_Normalize\", \"type\": "
                                   "\"sentence_transformers.models.Normalize\"}"
                                 : "");
        re_write_text(dir, "modules.json", buf);
        char sub[300];
        snprintf(sub, sizeof(sub), "%s/1_Pooling", dir);
        mkdir(sub, 0755);
        snprintf(buf, sizeof(buf),
                 "{\"pooling_mode_cls_token\": %s, \"pooling_mode_mean_tokens\": %s, "
                 "\"pooling_mode_max_tokens\": %s}\n",
                 d->st_pool == MODEL_POOL_CLS ? "true" : "false",
                 d->st_pool == MODEL_POOL_MEAN ? "true" : "false",
                 d->st_pool == MODEL_POOL_MAX ? "true" : "false");
        re_write_text(sub, "config.json", buf);
    }
    struct writer *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    w->r = r;
    if (st_dtype_parse(d->dtype, &w->dt) != 0) fail_msg("dtype %s", d->dtype);
    size_t H = d->hidden, I = d->inter;
    wt(w, "embeddings.word_embeddings.weight", r->vocab, H, -1, 1);
    wt(w, "embeddings.token_type_embeddings.weight", d->type_vocab, H, -1, 1);
    wln(w, "emb_ln", H);
    for (size_t l = 0; l < d->layers; l++) {
        char m[96];
#define L(name) (snprintf(m, sizeof(m), "encoder.layers.%zu.%s", l, (name)), m)
        wlin(w, L("attn.Wqkv"), 3 * H, H, d->qkv_bias);
        wlin(w, L("attn.out_proj"), H, H, d->qkv_bias);
        wln(w, L("norm1"), H);
        wlin(w, L("mlp.fc11"), I, H, d->fc1_bias);
        wlin(w, L("mlp.fc12"), I, H, d->fc1_bias);
        wlin(w, L("mlp.fc2"), H, I, d->fc2_bias);
        wln(w, L("norm2"), H);
#undef L
    }
    char err[512] = "";
    snprintf(buf, sizeof(buf), "%s/model.safetensors", dir);
    if (st_write(buf, w->t, w->n, err, sizeof(err)) != 0) fail_msg("st_write: %s", err);
    for (size_t i = 0; i < w->n; i++) free(w->raw[i]);
    free(w);
}

/* ---- the reference ----------------------------------------------------- */

/* y[n,out] = x[n,in] W^T + b (b may be NULL). */
static void ref_linear(const double *x, size_t n, size_t in, const double *W, const double *b,
                       size_t out, double *y)
{
    for (size_t t = 0; t < n; t++)
        for (size_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (size_t k = 0; k < in; k++) s += x[t * in + k] * W[o * in + k];
            y[t * out + o] = s;
        }
}

/* x = LayerNorm(x + add) row by row (add may be NULL). */
static void ref_ln(double *x, const double *add, size_t n, size_t H, const double *g,
                   const double *b, double eps)
{
    for (size_t t = 0; t < n; t++) {
        double *row = x + t * H, mu = 0, var = 0;
        for (size_t k = 0; k < H; k++) row[k] += add ? add[t * H + k] : 0, mu += row[k];
        mu /= (double)H;
        for (size_t k = 0; k < H; k++) var += (row[k] - mu) * (row[k] - mu);
        var /= (double)H;
        for (size_t k = 0; k < H; k++) row[k] = (row[k] - mu) / sqrt(var + eps) * g[k] + b[k];
    }
}

static const double *lp(const struct ref *r, size_t l, const char *name)
{
    char n[128];
    snprintf(n, sizeof(n), "encoder.layers.%zu.%s", l, name);
    return ref_t(r, n);
}

/* One sequence of len tokens, alone: its hidden states [len, H] in out. */
static void ref_sequence(const struct ref *r, const int32_t *ids, const int32_t *types,
                         size_t len, double *x)
{
    const struct desc *d = &r->d;
    size_t H = d->hidden, I = d->inter, nh = d->heads, dh = H / nh;
    double eps = (double)1e-5f; /* kept as a float, as kinfer does */
    const double *word = ref_t(r, "embeddings.word_embeddings.weight");
    const double *type = ref_t(r, "embeddings.token_type_embeddings.weight");
    for (size_t t = 0; t < len; t++)
        for (size_t k = 0; k < H; k++)
            x[t * H + k] = word[(size_t)ids[t] * H + k] + type[(size_t)(types ? types[t] : 0) * H + k];
    ref_ln(x, NULL, len, H, ref_t(r, "emb_ln.weight"), ref_t(r, "emb_ln.bias"), eps);
    double *qkv = malloc(len * 3 * H * sizeof(double)), *ctx = malloc(len * H * sizeof(double));
    double *tmp = malloc(len * H * sizeof(double)), *p = malloc(len * sizeof(double));
    double *u = malloc(len * I * sizeof(double)), *g = malloc(len * I * sizeof(double));
    double *inv = malloc(dh / 2 * sizeof(double));
    assert_true(qkv && ctx && tmp && p && u && g && inv);
    for (size_t i = 0; i < dh / 2; i++) /* float32, as the model computes them */
        inv[i] = (double)(1.0f / powf((float)d->base, (float)(2 * i) / (float)dh));
    for (size_t l = 0; l < d->layers; l++) {
        ref_linear(x, len, H, lp(r, l, "attn.Wqkv.weight"), lp(r, l, "attn.Wqkv.bias"), 3 * H,
                   qkv);
        for (size_t t = 0; t < len; t++)
            for (size_t part = 0; part < 2; part++) /* q, then k */
                for (size_t h = 0; h < nh; h++) {
                    double *v = qkv + t * 3 * H + part * H + h * dh;
                    for (size_t i = 0; i < dh / 2; i++) {
                        double th = (double)t * inv[i], a = v[i], b = v[i + dh / 2];
                        v[i] = a * cos(th) - b * sin(th);
                        v[i + dh / 2] = b * cos(th) + a * sin(th);
                    }
                }
        for (size_t h = 0; h < nh; h++)
            for (size_t t = 0; t < len; t++) {
                double m = -INFINITY, s = 0;
                for (size_t j = 0; j < len; j++) {
                    double dot = 0;
                    for (size_t k = 0; k < dh; k++)
                        dot += qkv[t * 3 * H + h * dh + k] * qkv[j * 3 * H + H + h * dh + k];
                    p[j] = dot / sqrt((double)dh);
                    m = fmax(m, p[j]);
                }
                for (size_t j = 0; j < len; j++) s += (p[j] = exp(p[j] - m));
                for (size_t k = 0; k < dh; k++) {
                    double c = 0;
                    for (size_t j = 0; j < len; j++) c += p[j] / s * qkv[j * 3 * H + 2 * H + h * dh + k];
                    ctx[t * H + h * dh + k] = c;
                }
            }
        ref_linear(ctx, len, H, lp(r, l, "attn.out_proj.weight"), lp(r, l, "attn.out_proj.bias"),
                   H, tmp);
        ref_ln(x, tmp, len, H, lp(r, l, "norm1.weight"), lp(r, l, "norm1.bias"), eps);
        ref_linear(x, len, H, lp(r, l, "mlp.fc11.weight"), lp(r, l, "mlp.fc11.bias"), I, u);
        ref_linear(x, len, H, lp(r, l, "mlp.fc12.weight"), lp(r, l, "mlp.fc12.bias"), I, g);
        for (size_t k = 0; k < len * I; k++) u[k] *= g[k] / (1.0 + exp(-g[k]));
        ref_linear(u, len, I, lp(r, l, "mlp.fc2.weight"), lp(r, l, "mlp.fc2.bias"), H, tmp);
        ref_ln(x, tmp, len, H, lp(r, l, "norm2.weight"), lp(r, l, "norm2.bias"), eps);
    }
    free(qkv), free(ctx), free(tmp), free(p), free(u), free(g), free(inv);
}

/* The batch through the reference and the head: a row per sequence, or
 * per token for pooling none; *count values. */
static double *ref_encode(const struct ref *r, enum model_pooling pool, int normalize,
                          const struct model_seqs *s, size_t *count)
{
    size_t H = r->d.hidden, total = s->offsets[s->n];
    size_t rows = pool == MODEL_POOL_NONE ? total : s->n;
    double *out = calloc(rows * H, sizeof(double)), *x = malloc(MAXTOK * H * sizeof(double));
    assert_true(out && x);
    size_t row = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t o = s->offsets[i], len = s->offsets[i + 1] - o;
        ref_sequence(r, s->ids + o, s->type_ids ? s->type_ids + o : NULL, len, x);
        size_t nrow = pool == MODEL_POOL_NONE ? len : 1;
        for (size_t q = 0; q < nrow; q++, row++) {
            double *y = out + row * H;
            for (size_t k = 0; k < H; k++) {
                double v = pool == MODEL_POOL_MAX ? -INFINITY : 0;
                for (size_t t = 0; t < len; t++) {
                    double e = x[t * H + k];
                    if (pool == MODEL_POOL_MAX) v = fmax(v, e);
                    else if (pool == MODEL_POOL_MEAN) v += e / (double)len;
                }
                y[k] = pool == MODEL_POOL_CLS ? x[k]
                       : pool == MODEL_POOL_NONE ? x[q * H + k] : v;
            }
            if (normalize) {
                double n2 = 0;
                for (size_t k = 0; k < H; k++) n2 += y[k] * y[k];
                for (size_t k = 0; k < H; k++) y[k] /= fmax(sqrt(n2), 1e-12);
            }
        }
    }
    free(x);
    *count = rows * H;
    return out;
}

/* ---- batches and helpers ----------------------------------------------------- */

struct batch {
    int32_t ids[MAXTOK], types[MAXTOK];
    uint32_t offsets[9];
    size_t n;
    struct model_seqs s;
};

/* n sequences ([CLS] ... [SEP]), one of length max; types 0 then 1 from
 * a random point when the model has two. */
static void batch_make(struct batch *b, const struct ref *r, size_t n, size_t max)
{
    memset(b, 0, sizeof(*b));
    size_t o = 0, longest = rand_between(0, n - 1);
    for (size_t i = 0; i < n; i++) {
        size_t len = i == longest ? max : rand_between(1, max), split = rand_between(1, len);
        assert_true(o + len <= MAXTOK && n < 9);
        b->offsets[i] = (uint32_t)o;
        for (size_t t = 0; t < len; t++) {
            b->ids[o + t] = t == 0 ? RE_CLS : t + 1 == len ? RE_SEP
                                             : (int32_t)rand_between(0, r->vocab - 1);
            b->types[o + t] = r->d.type_vocab > 1 && t >= split ? 1 : 0;
        }
        o += len;
    }
    b->offsets[n] = (uint32_t)o;
    b->n = n;
    b->s = (struct model_seqs){b->ids, r->d.type_vocab > 1 ? b->types : NULL, b->offsets, n};
}

static struct model_runtime *cpu_rt;
static char tmp_root[64];
static double run_worst;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void dir_for(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", tmp_root, name);
    nftw(out, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static struct model *try_load(struct model_runtime *rt, const struct desc *d, const char *dir,
                              char *err, size_t err_size)
{
    struct model_spec spec;
    memset(&spec, 0, sizeof(spec));
    snprintf(spec.name, sizeof(spec.name), "nomic");
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    model_encoder_spec_defaults(&spec.enc);
    if (d->pooling) {
        enum model_pooling p;
        assert_int_equal(model_pooling_parse(d->pooling, &p), 0);
        spec.enc.pooling = (int)p;
    }
    return model_load(rt, &spec, err, err_size);
}

/* The pooling and normalization the folder and the entry ask for. */
static enum model_pooling want_pool(const struct desc *d, int *normalize)
{
    enum model_pooling p = d->st ? d->st_pool : MODEL_POOL_CLS;
    *normalize = d->st && d->st_normalize;
    if (d->pooling) assert_int_equal(model_pooling_parse(d->pooling, &p), 0);
    return p;
}

static const struct desc models[] = {
    {.what = "n_embd keys, no biases, mean + normalize (nomic-embed's shape), F32", .st = 1,
     .st_pool = MODEL_POOL_MEAN, .st_normalize = 1},
    {.what = "hidden_size keys, every bias, \"bert.\", cls, base 10000, F32", .hf_keys = 1,
     .qkv_bias = 1, .fc1_bias = 1, .fc2_bias = 1, .prefix = 1, .base = 10000},
    {.what = "one token type, max pooling, 3 layers, 2 heads of 32, F32", .type_vocab = 1,
     .layers = 3, .hidden = 64, .heads = 2, .inter = 80, .st = 1, .st_pool = MODEL_POOL_MAX},
    {.what = "per-token output, fc biases only, F16", .pooling = "none", .fc1_bias = 1,
     .fc2_bias = 1, .dtype = "F16"},
    {.what = "mean + normalize, qkv biases, BF16", .dtype = "BF16", .qkv_bias = 1, .st = 1,
     .st_pool = MODEL_POOL_MEAN, .st_normalize = 1},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

/* CUDA's tolerance per precision (test_gpu.c's encoder tolerances). */
static const double cuda_tol[MODEL_N_PRECISIONS] = {
    [MODEL_FP32] = 1e-4, [MODEL_TF32] = 6e-3, [MODEL_FP16] = 1e-2, [MODEL_BF16] = 8e-2};

/* Every model on rt: what model_encoder() says, two random batches
 * against the reference within tol, the same batch twice giving the same
 * bits. Returns the worst err/tol. */
static double reference_on(struct model_runtime *rt, double tol, const char *label)
{
    double all_worst = 0;
    for (size_t v = 0; v < N_MODELS; v++) {
        const struct desc *D = &models[v];
        char dir[128], err[512] = "";
        dir_for("ref", dir, sizeof(dir));
        struct ref r;
        write_folder(D, dir, &r);
        struct model *m = try_load(rt, D, dir, err, sizeof(err));
        if (!m) fail_msg("%s: model_load: %s", D->what, err);
        const struct model_encoder_info *e = model_encoder(m);
        assert_non_null(e);
        const struct desc *d = &r.d;
        if (e->max_tokens != d->n_pos || e->hidden != d->hidden || e->layers != d->layers ||
            e->heads != d->heads || e->intermediate != d->inter || e->vocab != r.vocab ||
            e->type_vocab != d->type_vocab)
            fail_msg("%s: model_encoder says max_tokens %zu hidden %zu layers %zu heads %zu "
                     "inter %zu vocab %zu types %zu", D->what, e->max_tokens, e->hidden,
                     e->layers, e->heads, e->intermediate, e->vocab, e->type_vocab);
        assert_string_equal(model_arch_name(m), "nomic_bert");
        assert_int_equal(model_param_count(m), r.n_params);
        int normalize;
        enum model_pooling pool = want_pool(D, &normalize);
        assert_int_equal((int)e->pooling, (int)pool);
        assert_int_equal(e->normalize, normalize);
        struct model_ws *ws = model_ws_new_tokens(m, 0, 6, 6 * d->n_pos, err, sizeof(err));
        if (!ws) fail_msg("%s: %s", D->what, err);
        double worst = 0;
        for (int rep = 0; rep < 2; rep++) {
            struct batch b;
            batch_make(&b, &r, rep ? 1 : 6, rep ? rand_between(1, d->n_pos) : d->n_pos);
            const float *out;
            int rc = model_encode(m, ws, &b.s, &out);
            if (rc != MODEL_OK) fail_msg("%s: model_encode %d (%s)", D->what, rc, model_ws_error(ws));
            size_t count;
            double *ref = ref_encode(&r, pool, normalize, &b.s, &count);
            char what[200];
            snprintf(what, sizeof(what), "%s%s", D->what, label);
            double w = check_close_tol(out, ref, count, tol, what);
            worst = fmax(worst, w);
            float *first = malloc(count * sizeof(float));
            assert_non_null(first);
            memcpy(first, out, count * sizeof(float));
            assert_int_equal(model_encode(m, ws, &b.s, &out), MODEL_OK);
            assert_memory_equal(first, out, count * sizeof(float));
            free(first);
            free(ref);
        }
        printf("  %-72s err/tol %.3f%s\n", D->what, worst, label);
        all_worst = fmax(all_worst, worst);
        model_ws_destroy(ws);
        model_destroy(m);
        ref_free(&r);
    }
    return all_worst;
}

static void test_reference(void **state)
{
    (void)state;
    run_worst = fmax(run_worst, reference_on(cpu_rt, TOL, ""));
}

/* Rotary positions matter: the same tokens in another order give
 * another mean-pooled vector (without positions, mean pooling of a
 * bidirectional encoder would not see the order at all). */
static void test_positions_matter(void **state)
{
    (void)state;
    char dir[128], err[512];
    struct ref r;
    dir_for("pos", dir, sizeof(dir));
    write_folder(&models[0], dir, &r);
    struct model *m = try_load(cpu_rt, &models[0], dir, err, sizeof(err));
    if (!m) fail_msg("model_load: %s", err);
    struct model_ws *ws = model_ws_new_tokens(m, 0, 2, 16, err, sizeof(err));
    assert_non_null(ws);
    int32_t ids[8] = {RE_CLS, 80, 81, 82, 82, 81, 80, RE_SEP};
    int32_t rev[8] = {RE_CLS, 82, 81, 80, 80, 81, 82, RE_SEP};
    uint32_t offs[2] = {0, 8};
    struct model_seqs a = {ids, NULL, offs, 1}, b = {rev, NULL, offs, 1};
    const float *out;
    float first[64];
    size_t H = r.d.hidden;
    assert_int_equal(model_encode(m, ws, &a, &out), MODEL_OK);
    memcpy(first, out, H * sizeof(float));
    assert_int_equal(model_encode(m, ws, &b, &out), MODEL_OK);
    double diff = 0;
    for (size_t k = 0; k < H; k++) diff = fmax(diff, fabs(first[k] - out[k]));
    if (!(diff > 1e-3)) fail_msg("reordered tokens give the same vector (max diff %g)", diff);
    model_ws_destroy(ws);
    model_destroy(m);
    ref_free(&r);
}

static const struct desc bad[] = {
    {.what = "missing tensor", .omit = "encoder.layers.1.mlp.fc12.weight",
     .want = "encoder.layers.1.mlp.fc12.weight"},
    {.what = "wrong shape", .misshape = "encoder.layers.0.attn.Wqkv.weight",
     .want = "encoder.layers.0.attn.Wqkv.weight"},
    {.what = "bias said, none written", .cfg_key = "mlp_fc2_bias", .cfg_json = "true",
     .want = "encoder.layers.0.mlp.fc2.bias"},
    {.what = "geglu", .cfg_key = "activation_function", .cfg_json = "\"geglu\"",
     .want = "activation_function"},
    {.what = "prenorm", .cfg_key = "prenorm", .cfg_json = "true", .want = "prenorm"},
    {.what = "interleaved rotary", .cfg_key = "rotary_emb_interleaved", .cfg_json = "true",
     .want = "rotary_emb_interleaved"},
    {.what = "partial rotary", .cfg_key = "rotary_emb_fraction", .cfg_json = "0.5",
     .want = "rotary_emb_fraction"},
    {.what = "dynamic NTK", .cfg_key = "rotary_scaling_factor", .cfg_json = "2.0",
     .want = "rotary_scaling_factor"},
    {.what = "mixture of experts", .cfg_key = "moe_every_n_layers", .cfg_json = "2",
     .want = "moe_every_n_layers"},
    {.what = "RMSNorm", .cfg_key = "use_rms_norm", .cfg_json = "true", .want = "use_rms_norm"},
    {.what = "classifier", .cfg_key = "architectures",
     .cfg_json = "[\"NomicBertForSequenceClassification\"]", .want = "classifier"},
};

static void test_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char dir[128], err[512] = "";
        struct ref r;
        dir_for("bad", dir, sizeof(dir));
        write_folder(&bad[i], dir, &r);
        struct model *m = try_load(cpu_rt, &bad[i], dir, err, sizeof(err));
        if (m) fail_msg("%s: loaded", bad[i].what);
        if (!strstr(err, bad[i].want))
            fail_msg("%s: the error does not name %s: %s", bad[i].what, bad[i].want, err);
        printf("  %-20s %s\n", bad[i].what, err);
        ref_free(&r);
    }
}

/* Every model through tests/torch_nomic.py, against kinfer and the
 * reference on the same batch. */
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
    for (size_t v = 0; v < N_MODELS; v++) {
        const struct desc *D = &models[v];
        char dir[128], req[160], outp[160], cmd[600], err[512];
        struct ref r;
        dir_for("torch", dir, sizeof(dir));
        write_folder(D, dir, &r);
        struct model *m = try_load(cpu_rt, D, dir, err, sizeof(err));
        if (!m) fail_msg("%s: %s", D->what, err);
        struct model_ws *ws = model_ws_new_tokens(m, 0, 5, 5 * r.d.n_pos, err, sizeof(err));
        assert_non_null(ws);
        struct batch b;
        batch_make(&b, &r, 5, r.d.n_pos);
        const float *out;
        assert_int_equal(model_encode(m, ws, &b.s, &out), MODEL_OK);
        int normalize;
        enum model_pooling pool = want_pool(D, &normalize);
        size_t count;
        double *ref = ref_encode(&r, pool, normalize, &b.s, &count);
        json_t *rows = json_array(), *types = b.s.type_ids ? json_array() : json_null();
        for (size_t i = 0; i < b.n; i++) {
            json_t *row = json_array(), *t = json_array();
            for (uint32_t k = b.offsets[i]; k < b.offsets[i + 1]; k++) {
                json_array_append_new(row, json_integer(b.ids[k]));
                json_array_append_new(t, json_integer(b.types[k]));
            }
            json_array_append_new(rows, row);
            if (b.s.type_ids) json_array_append_new(types, t);
            else json_decref(t);
        }
        json_t *j = json_pack("{s:o, s:o, s:s, s:b}", "rows", rows, "type_ids", types,
                              "pooling", model_pooling_name(pool), "normalize", normalize);
        snprintf(req, sizeof(req), "%s/req.json", tmp_root);
        snprintf(outp, sizeof(outp), "%s/out.json", tmp_root);
        assert_int_equal(json_dump_file(j, req, 0), 0);
        json_decref(j);
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s '%s' '%s' >'%s'", TORCH_PY, dir, req,
                 outp);
        if (system(cmd) != 0) fail_msg("%s failed", cmd);
        json_error_t je;
        json_t *res = json_load_file(outp, 0, &je), *row, *x;
        assert_non_null(res);
        double *pt = malloc(count * sizeof(double)), worst64 = 0;
        assert_non_null(pt);
        size_t n = 0, i, k;
        json_array_foreach(json_object_get(res, "output"), i, row) json_array_foreach(row, k, x)
        {
            if (n >= count) fail_msg("%s: PyTorch gave more than %zu values", D->what, count);
            pt[n++] = json_number_value(x);
        }
        if (n != count) fail_msg("%s: PyTorch gave %zu values, kinfer %zu", D->what, n, count);
        for (k = 0; k < count; k++) {
            double e = fabs(pt[k] - ref[k]);
            if (!(e <= TOL_F64 * fmax(1.0, fabs(ref[k]))))
                fail_msg("%s: [%zu] PyTorch %.17g, reference %.17g", D->what, k, pt[k], ref[k]);
            worst64 = fmax(worst64, e);
        }
        double q = check_close_tol(out, pt, count, TOL, D->what);
        printf("  %-72s kinfer vs torch err/tol %.3f, |torch - ref| %.2g\n", D->what, q, worst64);
        json_decref(res);
        free(pt), free(ref);
        model_ws_destroy(ws);
        model_destroy(m);
        ref_free(&r);
    }
}

/* Every model on the CUDA backend in every precision, graphs on, against
 * the same reference within cuda_tol; the emulated device in the
 * build/emu/ program. Without a usable device it prints why and passes
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
    printf("  CUDA: %s\n", cuda);
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        struct model_runtime_conf rc;
        model_runtime_conf_defaults(&rc);
        rc.backend = "cuda";
        rc.precision = (enum model_precision)p;
        rc.graphs = 1;
        char err[512], label[64];
        struct model_runtime *rt = model_runtime_new(&rc, err, sizeof(err));
        if (!rt) fail_msg("model_runtime_new(cuda, %s): %s", model_precision_name(rc.precision), err);
        snprintf(label, sizeof(label), " (cuda %s)", model_precision_name(rc.precision));
        double w = reference_on(rt, cuda_tol[p], label);
        printf("  CUDA %s: worst err/tol %.3f (tol %g)\n", model_precision_name(rc.precision), w,
               cuda_tol[p]);
        model_runtime_destroy(rt);
    }
}

static int setup(void **state)
{
    (void)state;
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cpu";
    char err[256];
    if (!(cpu_rt = model_runtime_new(&rc, err, sizeof(err)))) {
        fprintf(stderr, "model_runtime_new: %s\n", err);
        return -1;
    }
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/kinfer_nomic_XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    model_runtime_destroy(cpu_rt);
#ifndef KINFER_EMU
    fprintf(stderr, "test_arch_nomic: worst err/tol %.3g (tol %g)\n", run_worst, TOL);
#endif
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference), cmocka_unit_test(test_positions_matter),
        cmocka_unit_test(test_errors),    cmocka_unit_test(test_torch),
        cmocka_unit_test(test_cuda), /* stays last */
    };
    size_t n = sizeof(tests) / sizeof(tests[0]), first = 0;
#ifdef KINFER_EMU
    first = n - 1; /* the CUDA backend on the emulated device only */
#endif
    return _cmocka_run_group_tests("test_arch_nomic", tests + first, n - first, setup, teardown);
}

/* test_arch_encoders.c - the RoBERTa (XLM-R, CamemBERT), MPNet and
 * DistilBERT architectures (gpu/arch_roberta.c, arch_mpnet.c,
 * arch_distilbert.c over gpu/bert_encoder.c) on the CPU and CUDA
 * backends, through the public API (model_load, model_ws_new_tokens,
 * model_encode), against a float64 reference written here from each
 * family's Hugging Face definition, and against PyTorch
 * (tests/torch_encoders.py, the same models written by hand in torch):
 *   - every family with an embedding head (cls, mean, max, none, with and
 *     without normalization) and its classifier head (RoBERTa's and
 *     MPNet's dense + tanh + out_proj, DistilBERT's pre_classifier + ReLU
 *     + classifier; softmax and sigmoid; a one-label cross-encoder's
 *     sigmoid by default, or the activation_fn its folder names:
 *     Sigmoid, or Identity for the logits), F32/F16/BF16, with and without
 *     the family's prefix, on random models with the family's real tensor
 *     names and config keys; one sequence of the longest allowed length
 *     in every batch, so the last position row and (MPNet) every bucket
 *     of the relative bias, the clamped ones included, take part;
 *   - positions from padding_idx + 1 (RoBERTa: config.pad_token_id, also
 *     0; MPNet: 1 whatever the config says), DistilBERT's sinusoidal table
 *     when the file has none, RoBERTa with and without token types;
 *   - what model_encoder() reports (max_tokens = max_position_embeddings -
 *     padding_idx - 1 for RoBERTa and MPNet) and the parameter count;
 *   - the demo folders of each family (model_write_demo_encoder) through
 *     their own tokenizer;
 *   - load errors: a missing tensor named, a wrong shape, a bad config key
 *     naming config.json, an unknown model_type listing the types this
 *     build runs.
 *
 * The reference (ref_* below) reads a folder back (config.json by the
 * family's keys, model.safetensors by the family's names, so F16/BF16
 * weights are already rounded and only kinfer's arithmetic is measured)
 * and runs each sequence alone in double: embeddings, attention with
 * MPNet's bucketed bias (relative_position_bucket restated from
 * modeling_mpnet.py in double; over every distance to +-140 it gives the
 * buckets PyTorch's float32 version gives), post-LN layers, the heads.
 *
 * Tolerance: as test_encoder.c (whose header gives the reasoning): each
 * output within 2e-5 * max(1, |ref|) of the reference (the worst seen over
 * a few seeds: 0.04 of it); PyTorch (float64) within 1e-9 relative of
 * the reference (1e-13 seen where layer_norm_eps is 1e-5: the reference
 * keeps eps as a float, as kinfer does; 1e-15 elsewhere), and kinfer
 * within 2e-5 of PyTorch. The random ids avoid the padding id of RoBERTa and MPNet:
 * Hugging Face gives a token equal to it the padding position (tokenizers
 * never put one inside a sequence, and kinfer numbers every token).
 *
 * On the CPU backend in bf16 (test_cpu_bf16: worker.cpu_precision, on the
 * AMX tiles where the CPU has them, and with them off), every model of
 * test_reference within 4e-2 of the same reference.
 *
 * On the CUDA backend (test_cuda), every model of test_reference in every
 * precision against the same reference, within test_gpu.c's encoder
 * tolerances; skipped with a printed line where there is no device. The
 * program built over the emulated device (build/emu/tests/, make test)
 * runs only that test, on the emulated device.
 *
 * Runs from the repository root, single-threaded; folders under a
 * temporary directory removed at the end. The PyTorch check needs
 * /usr/bin/python3 with torch (make deps); KINFER_TEST_NO_TORCH=1 skips
 * it with a printed line. */
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

#include "../gpu/cpu_amx.h"
#include "../gpu/model.h"
#include "../gpu/safetensors.h"
#include "../text/tokenizer.h"
#include "refencoder.h"
#include "testutil.h"

#define TOL 2e-5
#define TOL_F64 1e-9
#define TORCH_PY "tests/torch_encoders.py"
#define MAXL 4
#define NB 32 /* MPNet's buckets */

/* ---- the families, as Hugging Face defines them ------------------------ */

enum fam_kind { F_ROBERTA, F_MPNET, F_DISTILBERT };

struct fam {
    enum fam_kind kind;
    const char *model_type, *embedder, *classifier, *prefix, *layer;
    const char *mod[8]; /* q, k, v, attention out, its LayerNorm, ffn in, ffn out, LayerNorm */
    const char *cls_pre, *cls_out;
};

static const struct fam fams[] = {
    [F_ROBERTA] = {F_ROBERTA, "roberta", "RobertaModel", "RobertaForSequenceClassification",
                   "roberta.", "encoder.layer.",
                   {"attention.self.query", "attention.self.key", "attention.self.value",
                    "attention.output.dense", "attention.output.LayerNorm",
                    "intermediate.dense", "output.dense", "output.LayerNorm"},
                   "classifier.dense", "classifier.out_proj"},
    [F_MPNET] = {F_MPNET, "mpnet", "MPNetModel", "MPNetForSequenceClassification", "mpnet.",
                 "encoder.layer.",
                 {"attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                  "attention.LayerNorm", "intermediate.dense", "output.dense",
                  "output.LayerNorm"},
                 "classifier.dense", "classifier.out_proj"},
    [F_DISTILBERT] = {F_DISTILBERT, "distilbert", "DistilBertModel",
                      "DistilBertForSequenceClassification", "distilbert.",
                      "transformer.layer.",
                      {"attention.q_lin", "attention.k_lin", "attention.v_lin",
                       "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2",
                       "output_layer_norm"},
                      "pre_classifier", "classifier"},
};

/* ---- a test folder, as a table row ------------------------------------- */

struct desc {
    const char *what;
    enum fam_kind kind;
    const char *model_type;     /* NULL: the family's ("xlm-roberta", "camembert") */
    size_t layers, hidden, heads, inter, max_pos; /* 2, 32, 4, 64, 40 */
    size_t n_labels;
    const char *dtype;          /* NULL: F32 */
    int prefix;                 /* encoder tensors under the family's prefix */
    int pad;                    /* RoBERTa's pad_token_id + 1 (0: left out, 1) */
    int mpnet_pad;              /* MPNet: pad_token_id written as this - 1 (ignored) */
    size_t type_vocab;          /* RoBERTa: 1 or 2 (0: 1) */
    const char *act;            /* hidden_act / activation; NULL gelu */
    double eps;                 /* layer_norm_eps; 0: 1e-5 (DistilBERT: fixed) */
    int sinusoidal;             /* DistilBERT: sinusoidal_pos_embds, no table in the file */
    int multi_label;
    const char *ce_act;         /* a cross-encoder's activation_fn (torch class name) */
    int ce_old_key;             /* ... as sbert_ce_default_activation_function */
    int st;                     /* modules.json with pooling st_pool ... */
    enum model_pooling st_pool;
    int st_normalize;
    const char *pooling;        /* the entry's override */
    /* for the error rows: */
    const char *omit, *misshape;
    const char *cfg_key, *cfg_json; /* config.json key set (cfg_json NULL: removed) */
    size_t max_tokens;              /* the entry's encoder.max_tokens */
};

static void defaults(struct desc *d)
{
    if (!d->layers) d->layers = 2;
    if (!d->hidden) d->hidden = 32;
    if (!d->heads) d->heads = 4;
    if (!d->inter) d->inter = 2 * d->hidden;
    if (!d->max_pos) d->max_pos = 40;
    if (!d->dtype) d->dtype = "F32";
    if (!d->act) d->act = "gelu";
    if (!d->type_vocab) d->type_vocab = 1;
}

/* The float64 model of a folder. */
struct ref {
    const struct fam *f;
    size_t vocab, H, layers, heads, I, max_pos, pos_base, type_vocab, n_labels;
    double eps;
    int act;                    /* 0 gelu, 1 gelu tanh, 2 relu */
    double *word, *pos, *type, *eln_w, *eln_b, *rel;
    double *w[MAXL][8], *b[MAXL][8];
    double *pre_w, *pre_b, *out_w, *out_b;
    size_t n_params, head_params;
    double *all[16 * MAXL + 16];
    size_t n_all;
};

static struct model_runtime *cpu_rt;
static double run_worst;
static char tmp_root[64];

/* ---- writing a folder ---------------------------------------------------- */

struct writer {
    enum st_dtype dt;
    const struct desc *d;
    struct st_write_tensor t[16 * MAXL + 16];
    char names[16 * MAXL + 16][160];
    uint64_t shapes[16 * MAXL + 16][2];
    void *raw[16 * MAXL + 16];
    size_t n;
};

/* A random tensor [d0] or [d0,d1] in [lo,hi) called pfx + name (unless
 * the row omits it, or writes it one row longer). */
static void wtensor(struct writer *w, const char *pfx, const char *name, size_t d0, size_t d1,
                    float lo, float hi)
{
    if (w->d->omit && !strcmp(w->d->omit, name)) return;
    if (w->d->misshape && !strcmp(w->d->misshape, name)) d0++;
    size_t numel = d0 * (d1 ? d1 : 1);
    void *raw = malloc(numel * 4);
    double *tmp = malloc(numel * sizeof(double));
    assert_true(raw && tmp && w->n < sizeof(w->t) / sizeof(w->t[0]));
    fill_weights(w->dt, numel, lo, hi, raw, tmp);
    free(tmp);
    snprintf(w->names[w->n], sizeof(w->names[w->n]), "%s%s", pfx, name);
    w->shapes[w->n][0] = d0;
    w->shapes[w->n][1] = d1;
    w->raw[w->n] = raw;
    w->t[w->n] = (struct st_write_tensor){w->names[w->n], w->dt, d1 ? 2 : 1, w->shapes[w->n],
                                         raw};
    w->n++;
}

/* Writes d's folder into dir: vocab.txt (refencoder.h's words), tokenizer
 * settings, config.json with the family's keys, modules.json when asked,
 * and model.safetensors with spreads that keep every stage in its
 * interesting range (as refencoder.h draws BERT's). */
static void write_folder(const struct desc *din, const char *dir)
{
    struct desc d = *din;
    defaults(&d);
    const struct fam *f = &fams[d.kind];
    if (mkdir(dir, 0755) != 0 && access(dir, F_OK) != 0) fail_msg("mkdir %s", dir);
    char buf[1024];
    size_t cap = 16 * RE_N_WORDS, off = 0;
    char *v = malloc(cap);
    assert_non_null(v);
    for (size_t i = 0; i < RE_N_WORDS; i++)
        off += (size_t)snprintf(v + off, cap - off, "%s\n", re_words[i]);
    re_write_text(dir, "vocab.txt", v);
    free(v);
    re_write_text(dir, "tokenizer_config.json", "{\"do_lower_case\": true}\n");
    size_t vocab = RE_N_WORDS + 3;
    json_t *cfg = json_pack("{s:s, s:[s], s:I}", "model_type",
                            d.model_type ? d.model_type : f->model_type, "architectures",
                            d.n_labels ? f->classifier : f->embedder, "vocab_size",
                            (json_int_t)vocab);
    assert_non_null(cfg);
#define SET(k, v) json_object_set_new(cfg, (k), (v))
    if (d.kind == F_DISTILBERT) {
        SET("dim", json_integer((json_int_t)d.hidden));
        SET("n_layers", json_integer((json_int_t)d.layers));
        SET("n_heads", json_integer((json_int_t)d.heads));
        SET("hidden_dim", json_integer((json_int_t)d.inter));
        SET("activation", json_string(d.act));
        SET("sinusoidal_pos_embds", json_boolean(d.sinusoidal));
        SET("pad_token_id", json_integer(0));
    } else {
        SET("hidden_size", json_integer((json_int_t)d.hidden));
        SET("num_hidden_layers", json_integer((json_int_t)d.layers));
        SET("num_attention_heads", json_integer((json_int_t)d.heads));
        SET("intermediate_size", json_integer((json_int_t)d.inter));
        SET("hidden_act", json_string(d.act));
        SET("layer_norm_eps", json_real(d.eps ? d.eps : 1e-5));
        if (d.kind == F_ROBERTA) {
            SET("type_vocab_size", json_integer((json_int_t)d.type_vocab));
            if (d.pad) SET("pad_token_id", json_integer(d.pad - 1));
        } else {
            SET("relative_attention_num_buckets", json_integer(NB));
            if (d.mpnet_pad) SET("pad_token_id", json_integer(d.mpnet_pad - 1));
        }
    }
    SET("max_position_embeddings", json_integer((json_int_t)d.max_pos));
    if (d.n_labels) {
        json_t *id2 = json_object();
        for (size_t i = 0; i < d.n_labels; i++) {
            char k[32], name[32];
            snprintf(k, sizeof(k), "%zu", i);
            snprintf(name, sizeof(name), "class_%zu", i);
            json_object_set_new(id2, k, json_string(name));
        }
        SET("id2label", id2);
        if (d.multi_label) SET("problem_type", json_string("multi_label_classification"));
        if (d.ce_act && d.ce_old_key)
            SET("sbert_ce_default_activation_function", json_string(d.ce_act));
        else if (d.ce_act)
            SET("sentence_transformers", json_pack("{s:s, s:s}", "activation_fn", d.ce_act,
                                                   "version", "4.1.0"));
    }
    if (d.cfg_key) {
        if (d.cfg_json) {
            json_error_t je;
            json_t *x = json_loads(d.cfg_json, JSON_DECODE_ANY, &je);
            assert_non_null(x);
            SET(d.cfg_key, x);
        } else {
            json_object_del(cfg, d.cfg_key);
        }
    }
#undef SET
    snprintf(buf, sizeof(buf), "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, buf, JSON_INDENT(2)), 0);
    json_decref(cfg);
    if (d.st) {
        snprintf(buf, sizeof(buf),
                 "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
                 "\"sentence_transformers.models.Transformer\"},\n"
                 " {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": "
                 "\"sentence_transformers.models.Pooling\"}%s]\n",
                 d.st_normalize ? ",\n {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", "
                                  "\"type\": \"sentence_transformers.models.Normalize\"}"
                                : "");
        re_write_text(dir, "modules.json", buf);
        char sub[300];
        snprintf(sub, sizeof(sub), "%s/1_Pooling", dir);
        mkdir(sub, 0755);
        snprintf(buf, sizeof(buf),
                 "{\"pooling_mode_cls_token\": %s, \"pooling_mode_mean_tokens\": %s, "
                 "\"pooling_mode_max_tokens\": %s}\n",
                 d.st_pool == MODEL_POOL_CLS ? "true" : "false",
                 d.st_pool == MODEL_POOL_MEAN ? "true" : "false",
                 d.st_pool == MODEL_POOL_MAX ? "true" : "false");
        re_write_text(sub, "config.json", buf);
    }

    struct writer *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    w->d = &d;
    if (st_dtype_parse(d.dtype, &w->dt) != 0) fail_msg("dtype %s", d.dtype);
    const char *px = d.prefix ? f->prefix : "";
    size_t H = d.hidden, I = d.inter;
    float qk = 2.0f / sqrtf((float)H), lin = 1.0f / sqrtf((float)H), lin_i = 1.0f / sqrtf((float)I);
    wtensor(w, px, "embeddings.word_embeddings.weight", vocab, H, -1, 1);
    if (!d.sinusoidal) wtensor(w, px, "embeddings.position_embeddings.weight", d.max_pos, H, -1, 1);
    if (d.kind == F_ROBERTA)
        wtensor(w, px, "embeddings.token_type_embeddings.weight", d.type_vocab, H, -1, 1);
    wtensor(w, px, "embeddings.LayerNorm.weight", H, 0, 0.5f, 1.5f);
    wtensor(w, px, "embeddings.LayerNorm.bias", H, 0, -0.5f, 0.5f);
    for (size_t l = 0; l < d.layers; l++)
        for (int k = 0; k < 8; k++) {
            char n[160];
            int ln = k == 4 || k == 7;
            size_t d0 = k == 5 ? I : H, d1 = ln ? 0 : k == 6 ? I : H;
            float s = k < 2 || k == 5 ? qk : k == 6 ? lin_i : lin;
            snprintf(n, sizeof(n), "%s%zu.%s.weight", f->layer, l, f->mod[k]);
            if (ln) wtensor(w, px, n, d0, 0, 0.5f, 1.5f);
            else wtensor(w, px, n, d0, d1, -s, s);
            snprintf(n, sizeof(n), "%s%zu.%s.bias", f->layer, l, f->mod[k]);
            wtensor(w, px, n, d0, 0, ln ? -0.5f : -0.2f, ln ? 0.5f : 0.2f);
        }
    if (d.kind == F_MPNET) /* of the scores' order, so the bias shows */
        wtensor(w, px, "encoder.relative_attention_bias.weight", NB, d.heads, -1, 1);
    if (d.n_labels) {
        char n[160];
        snprintf(n, sizeof(n), "%s.weight", f->cls_pre);
        wtensor(w, "", n, H, H, -qk, qk);
        snprintf(n, sizeof(n), "%s.bias", f->cls_pre);
        wtensor(w, "", n, H, 0, -0.2f, 0.2f);
        snprintf(n, sizeof(n), "%s.weight", f->cls_out);
        wtensor(w, "", n, d.n_labels, H, -qk, qk);
        snprintf(n, sizeof(n), "%s.bias", f->cls_out);
        wtensor(w, "", n, d.n_labels, 0, -0.5f, 0.5f);
    }
    char err[512] = "";
    snprintf(buf, sizeof(buf), "%s/model.safetensors", dir);
    if (st_write(buf, w->t, w->n, err, sizeof(err)) != 0) fail_msg("st_write: %s", err);
    for (size_t i = 0; i < w->n; i++) free(w->raw[i]);
    free(w);
}

/* ---- the reference: a folder read back ----------------------------------- */

static size_t cfg_int(const json_t *cfg, const char *key, size_t def)
{
    const json_t *v = json_object_get(cfg, key);
    return v ? (size_t)json_integer_value(v) : def;
}

/* A tensor as new doubles: pfx + name, else name. */
static double *ref_get(struct ref *r, const struct st_file *sf, const char *pfx,
                       const char *name, size_t numel, int head)
{
    char n[200];
    snprintf(n, sizeof(n), "%s%s", pfx, name);
    const struct st_tensor *t = st_find(sf, n);
    if (!t) t = st_find(sf, name);
    if (!t) fail_msg("no tensor %s", name);
    assert_int_equal(t->numel, numel);
    float *tmp = malloc(numel * sizeof(float));
    double *out = malloc(numel * sizeof(double));
    assert_true(tmp && out && r->n_all < sizeof(r->all) / sizeof(r->all[0]));
    assert_int_equal(st_to_f32(t, tmp), 0);
    for (size_t i = 0; i < numel; i++) out[i] = tmp[i];
    free(tmp);
    r->all[r->n_all++] = out;
    if (head) r->head_params += numel;
    else r->n_params += numel;
    return out;
}

/* Reads dir's folder as family f defines it. */
static void ref_read(const char *dir, enum fam_kind kind, struct ref *r)
{
    memset(r, 0, sizeof(*r));
    const struct fam *f = r->f = &fams[kind];
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) fail_msg("%s: %s", path, je.text);
    const char *act;
    r->vocab = cfg_int(cfg, "vocab_size", 0);
    r->max_pos = cfg_int(cfg, "max_position_embeddings", 512);
    if (kind == F_DISTILBERT) {
        r->H = cfg_int(cfg, "dim", 0);
        r->layers = cfg_int(cfg, "n_layers", 0);
        r->heads = cfg_int(cfg, "n_heads", 0);
        r->I = cfg_int(cfg, "hidden_dim", 0);
        act = json_string_value(json_object_get(cfg, "activation"));
        r->eps = 1e-12; /* DistilBERT's LayerNorms */
        r->pos_base = 0;
    } else {
        r->H = cfg_int(cfg, "hidden_size", 0);
        r->layers = cfg_int(cfg, "num_hidden_layers", 0);
        r->heads = cfg_int(cfg, "num_attention_heads", 0);
        r->I = cfg_int(cfg, "intermediate_size", 0);
        act = json_string_value(json_object_get(cfg, "hidden_act"));
        const json_t *e = json_object_get(cfg, "layer_norm_eps");
        r->eps = e ? json_number_value(e) : 1e-12;
        /* RobertaEmbeddings: padding_idx = config.pad_token_id;
         * MPNetEmbeddings: padding_idx = 1. Positions padding_idx + 1 on. */
        r->pos_base = kind == F_ROBERTA ? cfg_int(cfg, "pad_token_id", 1) + 1 : 2;
        if (kind == F_ROBERTA) r->type_vocab = cfg_int(cfg, "type_vocab_size", 2);
    }
    r->eps = (double)(float)r->eps; /* as a backend keeps it */
    r->act = !act || !strcmp(act, "gelu") ? 0 : !strcmp(act, "relu") ? 2 : 1;
    int sinusoidal = json_is_true(json_object_get(cfg, "sinusoidal_pos_embds"));
    r->n_labels = json_object_size(json_object_get(cfg, "id2label"));
    json_decref(cfg);
    assert_true(r->H && r->layers && r->layers <= MAXL && r->heads && r->I && r->vocab);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct st_file *sf = st_open(path, err, sizeof(err));
    if (!sf) fail_msg("%s", err);
    size_t H = r->H, I = r->I;
    const char *px = f->prefix;
    r->word = ref_get(r, sf, px, "embeddings.word_embeddings.weight", r->vocab * H, 0);
    if (sinusoidal && !st_find(sf, "embeddings.position_embeddings.weight") &&
        !st_find(sf, "distilbert.embeddings.position_embeddings.weight")) {
        /* create_sinusoidal_embeddings: sin at even columns, cos at odd,
         * of pos / 10000^(2 floor(j/2) / dim) */
        r->pos = malloc(r->max_pos * H * sizeof(double));
        assert_non_null(r->pos);
        r->all[r->n_all++] = r->pos;
        for (size_t p = 0; p < r->max_pos; p++)
            for (size_t j = 0; j < H; j++) {
                double a = (double)p / pow(10000.0, 2.0 * (double)(j / 2) / (double)H);
                r->pos[p * H + j] = j % 2 ? cos(a) : sin(a);
            }
    } else {
        r->pos = ref_get(r, sf, px, "embeddings.position_embeddings.weight", r->max_pos * H, 0);
    }
    if (r->type_vocab)
        r->type = ref_get(r, sf, px, "embeddings.token_type_embeddings.weight",
                          r->type_vocab * H, 0);
    r->eln_w = ref_get(r, sf, px, "embeddings.LayerNorm.weight", H, 0);
    r->eln_b = ref_get(r, sf, px, "embeddings.LayerNorm.bias", H, 0);
    for (size_t l = 0; l < r->layers; l++)
        for (int k = 0; k < 8; k++) {
            char n[160];
            int ln = k == 4 || k == 7;
            size_t d0 = k == 5 ? I : H, d1 = ln ? 1 : k == 6 ? I : H;
            snprintf(n, sizeof(n), "%s%zu.%s.weight", f->layer, l, f->mod[k]);
            r->w[l][k] = ref_get(r, sf, px, n, d0 * d1, 0);
            snprintf(n, sizeof(n), "%s%zu.%s.bias", f->layer, l, f->mod[k]);
            r->b[l][k] = ref_get(r, sf, px, n, d0, 0);
        }
    if (kind == F_MPNET)
        r->rel = ref_get(r, sf, px, "encoder.relative_attention_bias.weight", NB * r->heads, 0);
    if (r->n_labels) {
        char n[160];
        snprintf(n, sizeof(n), "%s.weight", f->cls_pre);
        r->pre_w = ref_get(r, sf, "", n, H * H, 1);
        snprintf(n, sizeof(n), "%s.bias", f->cls_pre);
        r->pre_b = ref_get(r, sf, "", n, H, 1);
        snprintf(n, sizeof(n), "%s.weight", f->cls_out);
        r->out_w = ref_get(r, sf, "", n, r->n_labels * H, 1);
        snprintf(n, sizeof(n), "%s.bias", f->cls_out);
        r->out_b = ref_get(r, sf, "", n, r->n_labels, 1);
    }
    st_close(sf);
}

static void ref_free(struct ref *r)
{
    for (size_t i = 0; i < r->n_all; i++) free(r->all[i]);
    r->n_all = 0;
}

/* MPNetEncoder.relative_position_bucket(relative_position, 32, 128):
 * rel = key position - query position. */
static size_t mpnet_bucket(long rel)
{
    long num_buckets = NB / 2, ret = 0, n = -rel;
    if (n < 0) ret += num_buckets;
    n = labs(n);
    long max_exact = num_buckets / 2;
    if (n < max_exact) return (size_t)(ret + n);
    long v = max_exact + (long)(log((double)n / (double)max_exact) /
                                log(128.0 / (double)max_exact) *
                                (double)(num_buckets - max_exact));
    if (v > num_buckets - 1) v = num_buckets - 1;
    return (size_t)(ret + v);
}

static double act_fn(int act, double x)
{
    if (act == 2) return x > 0 ? x : 0;
    return re_gelu(x, act == 1);
}

/* One sequence alone: its last hidden states into x [len,H]. */
static void ref_sequence(const struct ref *r, const int32_t *ids, const int32_t *types,
                         size_t len, double *x)
{
    size_t H = r->H, I = r->I, nh = r->heads, dh = H / nh;
    for (size_t t = 0; t < len; t++)
        for (size_t k = 0; k < H; k++)
            x[t * H + k] = r->word[(size_t)ids[t] * H + k] + r->pos[(r->pos_base + t) * H + k] +
                           (r->type ? r->type[(size_t)(types ? types[t] : 0) * H + k] : 0.0);
    re_layernorm(x, len, H, r->eln_w, r->eln_b, r->eps);
    double *q = malloc(len * H * sizeof(double)), *k = malloc(len * H * sizeof(double));
    double *v = malloc(len * H * sizeof(double)), *ctx = malloc(len * H * sizeof(double));
    double *a = malloc(len * H * sizeof(double)), *p = malloc(len * sizeof(double));
    double *mid = malloc(len * I * sizeof(double));
    assert_true(q && k && v && ctx && a && p && mid);
    for (size_t l = 0; l < r->layers; l++) {
        double *const *W = r->w[l], *const *B = r->b[l];
        re_linear(x, len, H, W[0], B[0], H, q);
        re_linear(x, len, H, W[1], B[1], H, k);
        re_linear(x, len, H, W[2], B[2], H, v);
        for (size_t h = 0; h < nh; h++)
            for (size_t i = 0; i < len; i++) {
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j < len; j++) {
                    double s = 0;
                    for (size_t e = 0; e < dh; e++)
                        s += q[i * H + h * dh + e] * k[j * H + h * dh + e];
                    p[j] = s / sqrt((double)dh);
                    if (r->rel) p[j] += r->rel[mpnet_bucket((long)j - (long)i) * nh + h];
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (size_t j = 0; j < len; j++) sum += (p[j] = exp(p[j] - mx));
                for (size_t e = 0; e < dh; e++) {
                    double c = 0;
                    for (size_t j = 0; j < len; j++) c += p[j] / sum * v[j * H + h * dh + e];
                    ctx[i * H + h * dh + e] = c;
                }
            }
        re_linear(ctx, len, H, W[3], B[3], H, a);
        for (size_t i = 0; i < len * H; i++) x[i] += a[i];
        re_layernorm(x, len, H, W[4], B[4], r->eps);
        re_linear(x, len, H, W[5], B[5], I, mid);
        for (size_t i = 0; i < len * I; i++) mid[i] = act_fn(r->act, mid[i]);
        re_linear(mid, len, I, W[6], B[6], H, a);
        for (size_t i = 0; i < len * H; i++) x[i] += a[i];
        re_layernorm(x, len, H, W[7], B[7], r->eps);
    }
    free(q), free(k), free(v), free(ctx), free(a), free(p), free(mid);
}

/* model_encode's output for s with head h, as new doubles. */
static double *ref_encode(const struct ref *r, const struct re_head *h,
                          const struct model_seqs *s, size_t *count)
{
    size_t H = r->H, total = s->offsets[s->n];
    int cls = h->head == MODEL_HEAD_CLASSIFIER, all = !cls && h->pooling == MODEL_POOL_NONE;
    size_t wdt = cls ? r->n_labels : H;
    *count = all ? total * H : s->n * wdt;
    double *out = malloc(*count * sizeof(double)), *x = malloc(total * H * sizeof(double));
    double *pre = malloc(H * sizeof(double));
    assert_true(out && x && pre);
    for (size_t i = 0; i < s->n; i++) {
        size_t o = s->offsets[i], len = s->offsets[i + 1] - o;
        double *xs = x + o * H, *row = out + i * wdt;
        ref_sequence(r, s->ids + o, s->type_ids ? s->type_ids + o : NULL, len, xs);
        if (cls) {
            /* the first token; dense, then tanh (RoBERTa, MPNet) or ReLU
             * (DistilBERT); the labels' layer; softmax or sigmoid */
            re_linear(xs, 1, H, r->pre_w, r->pre_b, H, pre);
            for (size_t k = 0; k < H; k++)
                pre[k] = r->f->kind == F_DISTILBERT ? (pre[k] > 0 ? pre[k] : 0) : tanh(pre[k]);
            re_linear(pre, 1, H, r->out_w, r->out_b, wdt, row);
            if (h->sigmoid == MODEL_SCORES_SIGMOID) {
                for (size_t k = 0; k < wdt; k++) row[k] = 1.0 / (1.0 + exp(-row[k]));
            } else if (h->sigmoid == MODEL_SCORES_SOFTMAX) {
                double mx = row[0], sum = 0;
                for (size_t k = 1; k < wdt; k++) mx = row[k] > mx ? row[k] : mx;
                for (size_t k = 0; k < wdt; k++) sum += (row[k] = exp(row[k] - mx));
                for (size_t k = 0; k < wdt; k++) row[k] /= sum;
            }
            continue;
        }
        if (all) continue;
        for (size_t k = 0; k < H; k++) {
            double acc = h->pooling == MODEL_POOL_MAX ? -INFINITY : 0;
            for (size_t t = 0; t < (h->pooling == MODEL_POOL_CLS ? 1 : len); t++) {
                double e = xs[t * H + k];
                acc = h->pooling == MODEL_POOL_MAX ? (e > acc ? e : acc) : acc + e;
            }
            row[k] = h->pooling == MODEL_POOL_MEAN ? acc / (double)len : acc;
        }
        if (h->normalize) re_l2norm(row, H);
    }
    if (all) {
        memcpy(out, x, total * H * sizeof(double));
        if (h->normalize)
            for (size_t t = 0; t < total; t++) re_l2norm(out + t * H, H);
    }
    free(x);
    free(pre);
    return out;
}

/* ---- batches ------------------------------------------------------------- */

struct batch {
    struct model_seqs s;
    int32_t ids[1024], types[1024];
    uint32_t offsets[17];
    size_t n;
};

/* n sequences, one of length max, the others random: a first token cls,
 * a last sep, random ids between (never pad: see the header); types 0 then
 * 1 from a random point when the model has two. */
static void batch_make(struct batch *b, const struct ref *r, size_t n, size_t max, int32_t cls,
                       int32_t sep, int32_t pad)
{
    memset(b, 0, sizeof(*b));
    size_t o = 0, longest = rand_between(0, n - 1);
    for (size_t i = 0; i < n; i++) {
        size_t len = i == longest ? max : rand_between(1, max);
        size_t split = rand_between(1, len);
        assert_true(o + len <= 1024);
        b->offsets[i] = (uint32_t)o;
        for (size_t t = 0; t < len; t++) {
            int32_t id;
            do id = (int32_t)rand_between(0, r->vocab - 1);
            while (id == pad);
            b->ids[o + t] = t == 0 ? cls : t + 1 == len ? sep : id;
            b->types[o + t] = r->type_vocab > 1 && t >= split ? 1 : 0;
        }
        o += len;
    }
    b->offsets[n] = (uint32_t)o;
    b->n = n;
    b->s = (struct model_seqs){b->ids, r->type_vocab > 1 ? b->types : NULL, b->offsets, n};
}

/* ---- helpers -------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_rf(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void dir_for(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", tmp_root, name);
    rm_rf(out);
}

static struct model *load_on(struct model_runtime *rt, const char *dir,
                              const struct model_encoder_spec *o, const char *what)
{
    struct model_spec spec;
    memset(&spec, 0, sizeof(spec));
    snprintf(spec.name, sizeof(spec.name), "t");
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    model_encoder_spec_defaults(&spec.enc);
    if (o) spec.enc = *o;
    char err[512] = "";
    struct model *m = model_load(rt, &spec, err, sizeof(err));
    if (!m) fail_msg("%s: model_load: %s", what, err);
    return m;
}

static struct model *load_dir(const char *dir, const struct model_encoder_spec *o,
                              const char *what)
{
    return load_on(cpu_rt, dir, o, what);
}

/* The head the folder and override ask for, as Hugging Face and
 * sentence-transformers read them. */
static struct re_head expect(const struct desc *d, const struct model_encoder_spec *o)
{
    /* scores: the folder's activation_fn, else sigmoid for multi-label or
     * one label (sentence-transformers' CrossEncoder), else softmax */
    int scores = d->multi_label || d->n_labels == 1 ? MODEL_SCORES_SIGMOID : MODEL_SCORES_SOFTMAX;
    if (d->ce_act)
        scores = strstr(d->ce_act, "Identity") ? MODEL_SCORES_NONE : MODEL_SCORES_SIGMOID;
    struct re_head h = {d->n_labels ? MODEL_HEAD_CLASSIFIER : MODEL_HEAD_EMBEDDING,
                        d->st ? d->st_pool : MODEL_POOL_CLS, d->st && d->st_normalize, scores};
    if (o->pooling >= 0) h.pooling = (enum model_pooling)o->pooling;
    if (h.head == MODEL_HEAD_CLASSIFIER) h.pooling = MODEL_POOL_CLS, h.normalize = 0;
    return h;
}

static struct model_encoder_spec overrides(const struct desc *d)
{
    struct model_encoder_spec o;
    model_encoder_spec_defaults(&o);
    if (d->pooling) {
        enum model_pooling p;
        assert_int_equal(model_pooling_parse(d->pooling, &p), 0);
        o.pooling = (int)p;
    }
    return o;
}

static double check(const float *got, const double *ref, size_t n, const char *what)
{
    double r = check_close_tol(got, ref, n, TOL, what);
    if (r > run_worst) run_worst = r;
    return r;
}

/* The CUDA backend's tolerance per precision, against the same float64
 * reference: test_gpu.c's for its encoders (whose header gives the
 * reasoning; it measures against the CPU backend, 2e-5 from this
 * reference, which these bounds dwarf). */
static const double cuda_tol[MODEL_N_PRECISIONS] = {
    [MODEL_FP32] = 1e-4, [MODEL_TF32] = 6e-3, [MODEL_FP16] = 1e-2, [MODEL_BF16] = 8e-2};

/* ---- the models ------------------------------------------------------------ */

static const struct desc models[] = {
    {.what = "roberta: cls, F32", .kind = F_ROBERTA},
    {.what = "roberta: mean + normalize, roberta. prefix, type_vocab 2 (types used)",
     .kind = F_ROBERTA, .prefix = 1, .type_vocab = 2, .st = 1, .st_pool = MODEL_POOL_MEAN,
     .st_normalize = 1},
    {.what = "roberta: pad_token_id 0 (positions from 1), max, BF16", .kind = F_ROBERTA,
     .pad = 1, .st = 1, .st_pool = MODEL_POOL_MAX, .dtype = "BF16"},
    {.what = "roberta: classifier (dense, tanh, out_proj), softmax, 3 labels", .kind = F_ROBERTA,
     .n_labels = 3, .prefix = 1},
    {.what = "xlm-roberta: classifier, sigmoid (multi_label), F16", .kind = F_ROBERTA,
     .model_type = "xlm-roberta", .n_labels = 4, .multi_label = 1, .prefix = 1, .dtype = "F16"},
    {.what = "camembert: none (override), gelu_new", .kind = F_ROBERTA,
     .model_type = "camembert", .pooling = "none", .act = "gelu_new"},
    {.what = "roberta: one-label classifier (cross-encoder), sigmoid by default",
     .kind = F_ROBERTA, .n_labels = 1, .prefix = 1},
    {.what = "roberta: cross-encoder, activation_fn Identity (the logits)", .kind = F_ROBERTA,
     .n_labels = 1, .prefix = 1, .ce_act = "torch.nn.modules.linear.Identity"},
    {.what = "xlm-roberta: cross-encoder, sbert_ce_default_activation_function Sigmoid, BF16",
     .kind = F_ROBERTA, .model_type = "xlm-roberta", .n_labels = 1, .prefix = 1,
     .ce_act = "torch.nn.modules.activation.Sigmoid", .ce_old_key = 1, .dtype = "BF16"},
    {.what = "roberta: embedder, an activation_fn it has no use for (Tanh): loads",
     .kind = F_ROBERTA, .ce_act = "torch.nn.modules.activation.Tanh"},
    {.what = "mpnet: mean + normalize, 150 positions (every bucket)", .kind = F_MPNET,
     .max_pos = 150, .st = 1, .st_pool = MODEL_POOL_MEAN, .st_normalize = 1},
    {.what = "mpnet: cls, mpnet. prefix, F16, pad_token_id 0 (ignored: MPNet's is 1)",
     .kind = F_MPNET, .prefix = 1, .dtype = "F16", .mpnet_pad = 1},
    {.what = "mpnet: classifier (dense, tanh, out_proj), 2 labels, BF16", .kind = F_MPNET,
     .n_labels = 2, .prefix = 1, .dtype = "BF16"},
    {.what = "mpnet: 2 labels, old-key Identity (the logits)", .kind = F_MPNET, .n_labels = 2,
     .prefix = 1, .ce_act = "torch.nn.modules.linear.Identity", .ce_old_key = 1},
    {.what = "mpnet: 3 layers, hidden 24, 3 heads, none + normalize", .kind = F_MPNET,
     .layers = 3, .hidden = 24, .heads = 3, .inter = 40, .pooling = "none", .st = 1,
     .st_pool = MODEL_POOL_CLS, .st_normalize = 1},
    {.what = "distilbert: cls, F32", .kind = F_DISTILBERT},
    {.what = "distilbert: mean, distilbert. prefix, relu, BF16", .kind = F_DISTILBERT,
     .prefix = 1, .act = "relu", .st = 1, .st_pool = MODEL_POOL_MEAN, .dtype = "BF16"},
    {.what = "distilbert: sinusoidal positions (no table in the file), max", .kind = F_DISTILBERT,
     .sinusoidal = 1, .st = 1, .st_pool = MODEL_POOL_MAX},
    {.what = "distilbert: classifier (pre_classifier, ReLU, classifier), 3 labels",
     .kind = F_DISTILBERT, .n_labels = 3, .prefix = 1},
    {.what = "distilbert: classifier, sigmoid, F16, 3 layers hidden 48 heads 6", .kind = F_DISTILBERT,
     .n_labels = 5, .multi_label = 1, .dtype = "F16", .layers = 3, .hidden = 48, .heads = 6,
     .inter = 96},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

/* The special ids of refencoder.h's vocabulary: [PAD] 0, [UNK] 1, [CLS]
 * 2, [SEP] 3. The padding id RoBERTa and MPNet count positions from
 * stands for a padding token whatever its string. */
static int32_t pad_id(const struct ref *r)
{
    return r->f->kind == F_DISTILBERT ? -1 : (int32_t)r->pos_base - 1;
}

/* Every model on rt: load, what model_encoder() says, two random batches
 * against the reference within tol (the same batch twice giving the same
 * bits); prints each model's worst err/tol after label. Returns the worst. */
static double reference_on(struct model_runtime *rt, double tol, const char *label)
{
    double all_worst = 0;
    for (size_t v = 0; v < N_MODELS; v++) {
        const struct desc *D = &models[v];
        char dir[128];
        dir_for("ref", dir, sizeof(dir));
        write_folder(D, dir);
        struct ref r;
        ref_read(dir, D->kind, &r);
        struct model_encoder_spec o = overrides(D);
        struct re_head h = expect(D, &o);
        struct model *m = load_on(rt, dir, &o, D->what);
        const struct model_encoder_info *e = model_encoder(m);
        assert_non_null(e);
        size_t max = r.max_pos - r.pos_base;
        if (e->max_tokens != max || e->hidden != r.H || e->layers != r.layers ||
            e->heads != r.heads || e->intermediate != r.I || e->vocab != r.vocab ||
            e->type_vocab != (r.type_vocab ? r.type_vocab : 1) || (int)e->head != (int)h.head)
            fail_msg("%s: model_encoder says max_tokens %zu hidden %zu layers %zu heads %zu "
                     "inter %zu vocab %zu types %zu head %d", D->what, e->max_tokens, e->hidden,
                     e->layers, e->heads, e->intermediate, e->vocab, e->type_vocab, e->head);
        if (h.head == MODEL_HEAD_CLASSIFIER && e->sigmoid != h.sigmoid)
            fail_msg("%s: scores %d (enum model_scores), expected %d", D->what, e->sigmoid,
                     h.sigmoid);
        assert_string_equal(model_arch_name(m), fams[D->kind].model_type);
        size_t params = r.n_params + (h.head == MODEL_HEAD_CLASSIFIER ? r.head_params : 0);
        assert_int_equal(model_param_count(m), params);
        assert_int_equal(model_output_width(m), h.head == MODEL_HEAD_CLASSIFIER ? r.n_labels : r.H);
        struct model_ws *ws;
        char err[256];
        if (!(ws = model_ws_new_tokens(m, 0, 6, 6 * max, err, sizeof(err))))
            fail_msg("%s: %s", D->what, err);
        double worst = 0;
        for (int rep = 0; rep < 2; rep++) {
            struct batch b;
            batch_make(&b, &r, rep ? 1 : 6, rep ? rand_between(1, max) : max, RE_CLS, RE_SEP,
                       pad_id(&r));
            const float *out;
            int rc = model_encode(m, ws, &b.s, &out);
            if (rc != MODEL_OK) fail_msg("%s: model_encode %d (%s)", D->what, rc, model_ws_error(ws));
            size_t count;
            double *ref = ref_encode(&r, &h, &b.s, &count);
            char what[160];
            snprintf(what, sizeof(what), "%s%s", D->what, label);
            double w = check_close_tol(out, ref, count, tol, what);
            worst = w > worst ? w : worst;
            float *first = malloc(count * sizeof(float));
            assert_non_null(first);
            memcpy(first, out, count * sizeof(float));
            assert_int_equal(model_encode(m, ws, &b.s, &out), MODEL_OK);
            assert_memory_equal(first, out, count * sizeof(float));
            free(first);
            free(ref);
        }
        printf("  %-75s err/tol %.3f%s\n", D->what, worst, label);
        all_worst = worst > all_worst ? worst : all_worst;
        model_ws_destroy(ws);
        model_destroy(m);
        ref_free(&r);
    }
    return all_worst;
}

static void test_reference(void **state)
{
    (void)state;
    double w = reference_on(cpu_rt, TOL, "");
    if (w > run_worst) run_worst = w;
}

/* Every model of test_reference on the CPU backend in bf16
 * (worker.cpu_precision), on the AMX tiles where the CPU has them and
 * with the bfloat16 weights widened in registers, within 4e-2 (an
 * estimate written before a run: inputs rounded to 8 bits of mantissa,
 * float32 sums and activations, so tighter than the CUDA backend's
 * bf16). */
static void test_cpu_bf16(void **state)
{
    (void)state;
    for (int on = cpu_amx_ready(); on >= 0; on--) {
        cpu_amx_allow(on);
        struct model_runtime_conf rc;
        model_runtime_conf_defaults(&rc);
        rc.backend = "cpu";
        rc.cpu_precision = MODEL_BF16;
        char err[512];
        struct model_runtime *rt = model_runtime_new(&rc, err, sizeof(err));
        if (!rt) fail_msg("model_runtime_new(cpu, bf16): %s", err);
        assert_string_equal(model_runtime_precision(rt), "bf16");
        double w = reference_on(rt, 4e-2, on ? " (cpu bf16, AMX)" : " (cpu bf16, widened)");
        printf("  CPU bf16 (%s): worst err/tol %.3f (tol 4e-2)\n", on ? "AMX" : "widened", w);
        model_runtime_destroy(rt);
    }
    cpu_amx_allow(1);
}

/* Every model of test_reference on the CUDA backend in every precision,
 * graphs on (each shape eager, then captured), against the float64
 * reference within cuda_tol: the families' kernels (RoBERTa's positions
 * and token types, MPNet's relative bias buckets, DistilBERT's sinusoidal
 * table, the heads) on the device, or on the emulated device in the
 * build/emu/ program. Without a usable device it prints why and passes:
 * test_gpu answers for the device's presence. */
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
        assert_string_equal(model_runtime_backend(rt), "cuda");
        snprintf(label, sizeof(label), " (cuda %s)", model_precision_name(rc.precision));
        double w = reference_on(rt, cuda_tol[p], label);
        printf("  CUDA %s: worst err/tol %.3f (tol %g)\n", model_precision_name(rc.precision), w,
               cuda_tol[p]);
        model_runtime_destroy(rt);
    }
}

/* The relative bias matters (MPNet with its table zeroed is another
 * model) and so does the position offset (RoBERTa read from 0 is
 * another): guards against a reference and a kinfer that both drop them. */
static void test_offsets_matter(void **state)
{
    (void)state;
    static const struct desc dm = {.what = "mpnet", .kind = F_MPNET, .max_pos = 60};
    static const struct desc dr = {.what = "roberta", .kind = F_ROBERTA};
    const struct desc *ds[] = {&dm, &dr};
    for (size_t i = 0; i < 2; i++) {
        char dir[128];
        dir_for("matter", dir, sizeof(dir));
        write_folder(ds[i], dir);
        struct ref r;
        ref_read(dir, ds[i]->kind, &r);
        struct model *m = load_dir(dir, NULL, ds[i]->what);
        struct model_ws *ws = model_ws_new_tokens(m, 0, 4, 4 * 40, NULL, 0);
        assert_non_null(ws);
        struct batch b;
        batch_make(&b, &r, 4, 30, RE_CLS, RE_SEP, pad_id(&r));
        const float *out;
        assert_int_equal(model_encode(m, ws, &b.s, &out), MODEL_OK);
        struct re_head h = {MODEL_HEAD_EMBEDDING, MODEL_POOL_CLS, 0, 0};
        if (r.rel) memset(r.rel, 0, NB * r.heads * sizeof(double));
        else r.pos_base = 0;
        size_t count;
        double *ref = ref_encode(&r, &h, &b.s, &count), worst = 0;
        for (size_t k = 0; k < count; k++) worst = fmax(worst, fabs(out[k] - ref[k]));
        if (worst < 1e-2) fail_msg("%s: the %s changes outputs by only %g", ds[i]->what,
                                   r.rel ? "relative bias" : "position offset", worst);
        free(ref);
        model_ws_destroy(ws);
        model_destroy(m);
        ref_free(&r);
    }
}

/* ---- the demo folders ---------------------------------------------------------- */

/* model_write_demo_encoder's folders of each family load and match the
 * reference on text through their own tokenizer (<s> ... </s> for
 * RoBERTa and MPNet, whose padding id is 1). */
static void test_demo(void **state)
{
    (void)state;
    static const struct {
        const char *kind;
        enum fam_kind fam;
    } kinds[] = {{"roberta", F_ROBERTA},
                 {"xlm-roberta", F_ROBERTA},
                 {"mpnet", F_MPNET},
                 {"distilbert", F_DISTILBERT}};
    static const char *const texts[] = {"The movie was really great!", "Kafka and Redis.",
                                        "I hate slow service", "ok"};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        for (size_t labels = 0; labels <= 2; labels++) { /* 1: a cross-encoder, sigmoid */
            char dir[128], err[512], what[64];
            snprintf(what, sizeof(what), "demo %s, %zu labels", kinds[k].kind, labels);
            dir_for("demo", dir, sizeof(dir));
            if (model_write_demo_encoder(dir, kinds[k].kind, 2, 32, 4, 64, labels, tu_rand64(),
                                         err, sizeof(err)) != 0)
                fail_msg("%s: %s", what, err);
            struct ref r;
            ref_read(dir, kinds[k].fam, &r);
            struct model *m = load_dir(dir, NULL, what);
            const struct model_encoder_info *e = model_encoder(m);
            assert_int_equal(e->max_tokens, 128);
            assert_int_equal(e->n_labels, labels);
            struct re_head h = {labels ? MODEL_HEAD_CLASSIFIER : MODEL_HEAD_EMBEDDING,
                                labels ? MODEL_POOL_CLS : MODEL_POOL_MEAN, !labels,
                                labels == 1 ? MODEL_SCORES_SIGMOID : MODEL_SCORES_SOFTMAX};
            assert_int_equal(e->sigmoid, h.sigmoid);
            struct tokenizer_scratch *sc = tokenizer_scratch_new(0);
            int32_t ids[256];
            uint32_t off[5] = {0};
            for (size_t i = 0; i < 4; i++) {
                int n = tokenizer_encode(e->tokenizer, sc, texts[i], strlen(texts[i]), NULL, 0,
                                  e->max_tokens, 1, ids + off[i], NULL, 256 - off[i], NULL, err,
                                  sizeof(err));
                assert_true(n >= 3);
                if (kinds[k].fam != F_DISTILBERT) { /* <s> 0 ... </s> 2, never <pad> 1 */
                    assert_int_equal(ids[off[i]], 0);
                    assert_int_equal(ids[off[i] + (uint32_t)n - 1], 2);
                }
                for (int t = 0; t < n; t++) assert_int_not_equal(ids[off[i] + (uint32_t)t], 1);
                off[i + 1] = off[i] + (uint32_t)n;
            }
            if (k == 1) { /* XLM-R's Unigram: whole words after U+2581, the rest in letters */
                static const char *const want[] = {"<s>", "\xe2\x96\x81the", "\xe2\x96\x81movie",
                                                   "\xe2\x96\x81was", "\xe2\x96\x81great", "!",
                                                   "</s>"};
                int32_t w[16];
                const char *t = "the movie was great!";
                assert_int_equal(tokenizer_encode(e->tokenizer, sc, t, strlen(t), NULL, 0, 0, 1, w,
                                                  NULL, 16, NULL, err, sizeof(err)),
                                 7);
                for (size_t q = 0; q < 7; q++)
                    assert_string_equal(tokenizer_id_token(e->tokenizer, w[q]), want[q]);
            }
            struct model_ws *ws = model_ws_new_tokens(m, 0, 4, 4 * 16, err, sizeof(err));
            assert_non_null(ws);
            struct model_seqs s = {ids, NULL, off, 4};
            const float *out;
            assert_int_equal(model_encode(m, ws, &s, &out), MODEL_OK);
            size_t count;
            double *ref = ref_encode(&r, &h, &s, &count);
            printf("  %-40s err/tol %.3f\n", what, check(out, ref, count, what));
            free(ref);
            tokenizer_scratch_destroy(sc);
            model_ws_destroy(ws);
            model_destroy(m);
            ref_free(&r);
        }
}

/* ---- load errors ---------------------------------------------------------------- */

static const struct {
    struct desc d;
    const char *want[2];
} bad[] = {
    {{.what = "mpnet without its relative bias", .kind = F_MPNET,
      .omit = "encoder.relative_attention_bias.weight"},
     {"tensor encoder.relative_attention_bias.weight not found in model.safetensors (nor "
      "mpnet.encoder.relative_attention_bias.weight)"}},
    {{.what = "mpnet: an attention matrix missing", .kind = F_MPNET, .prefix = 1,
      .omit = "encoder.layer.1.attention.attn.o.weight"},
     {"tensor encoder.layer.1.attention.attn.o.weight not found"}},
    {{.what = "mpnet: relative_attention_num_buckets 64", .kind = F_MPNET,
      .cfg_key = "relative_attention_num_buckets", .cfg_json = "64"},
     {"config.json: relative_attention_num_buckets 64"}},
    {{.what = "distilbert: ffn.lin1 of the wrong shape", .kind = F_DISTILBERT,
      .misshape = "transformer.layer.0.ffn.lin1.weight"},
     {"tensor transformer.layer.0.ffn.lin1.weight has shape [65,32], expected [64,32]"}},
    {{.what = "distilbert: dim missing", .kind = F_DISTILBERT, .cfg_key = "dim"},
     {"config.json: dim is missing"}},
    {{.what = "distilbert: activation silu", .kind = F_DISTILBERT, .act = "silu"},
     {"config.json: activation \"silu\" is not supported (gelu, relu)"}},
    {{.what = "distilbert: cross-encoder activation_fn Tanh", .kind = F_DISTILBERT,
      .n_labels = 1, .ce_act = "torch.nn.modules.activation.Tanh"},
     {"config.json: sentence_transformers.activation_fn \"torch.nn.modules.activation.Tanh\" "
      "is not supported"}},
    {{.what = "distilbert: classifier without pre_classifier", .kind = F_DISTILBERT,
      .n_labels = 2, .omit = "pre_classifier.bias"},
     {"tensor pre_classifier.bias not found"}},
    {{.what = "roberta: classifier without out_proj", .kind = F_ROBERTA, .n_labels = 2,
      .omit = "classifier.out_proj.weight"},
     {"a classifier needs tensor classifier.out_proj.weight [labels,32]"}},
    {{.what = "roberta: token types missing", .kind = F_ROBERTA,
      .omit = "embeddings.token_type_embeddings.weight"},
     {"tensor embeddings.token_type_embeddings.weight not found"}},
    {{.what = "roberta: pad_token_id \"x\"", .kind = F_ROBERTA, .cfg_key = "pad_token_id",
      .cfg_json = "\"x\""},
     {"config.json: pad_token_id must be an integer"}},
    {{.what = "roberta: hidden_size missing", .kind = F_ROBERTA, .cfg_key = "hidden_size"},
     {"config.json: hidden_size is missing"}},
    {{.what = "roberta: position table of 2 rows", .kind = F_ROBERTA, .max_pos = 2},
     {"max_position_embeddings 2 leaves no position"}},
    {{.what = "roberta: max_tokens over its 38 positions", .kind = F_ROBERTA,
      .max_tokens = 39},
     {"encoder.max_tokens 39 is more than the 38 tokens max_position_embeddings 40 allows"}},
    {{.what = "model_type gpt2", .kind = F_ROBERTA, .cfg_key = "model_type",
      .cfg_json = "\"gpt2\""},
     {"config.json: model_type \"gpt2\" is not one this build runs (bert, roberta, "
      "xlm-roberta, camembert, mpnet, distilbert, nomic_bert)"}},
};

/* Each bad folder is refused naming the model and the tensor or key. */
static void test_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char dir[128], err[1024] = "";
        dir_for("bad", dir, sizeof(dir));
        write_folder(&bad[i].d, dir);
        struct model_spec spec;
        memset(&spec, 0, sizeof(spec));
        snprintf(spec.name, sizeof(spec.name), "t");
        snprintf(spec.path, sizeof(spec.path), "%s", dir);
        model_encoder_spec_defaults(&spec.enc);
        spec.enc.max_tokens = bad[i].d.max_tokens;
        struct model *m = model_load(cpu_rt, &spec, err, sizeof(err));
        if (m) fail_msg("%s: loaded", bad[i].d.what);
        if (strncmp(err, "model t: ", 9) != 0)
            fail_msg("%s: message does not name the model: %s", bad[i].d.what, err);
        for (int k = 0; k < 2 && bad[i].want[k]; k++)
            if (!strstr(err, bad[i].want[k]))
                fail_msg("%s: \"%s\" lacks \"%s\"", bad[i].d.what, err, bad[i].want[k]);
        printf("  %-50s %s\n", bad[i].d.what, err + 9);
    }
}

/* ---- PyTorch ------------------------------------------------------------------- */

static json_t *torch_request(const struct batch *b, const struct re_head *h)
{
    json_t *rows = json_array(), *types = b->s.type_ids ? json_array() : json_null();
    for (size_t i = 0; i < b->n; i++) {
        json_t *r = json_array(), *t = json_array();
        for (uint32_t k = b->offsets[i]; k < b->offsets[i + 1]; k++) {
            json_array_append_new(r, json_integer(b->ids[k]));
            json_array_append_new(t, json_integer(b->types[k]));
        }
        json_array_append_new(rows, r);
        if (b->s.type_ids) json_array_append_new(types, t);
        else json_decref(t);
    }
    return json_pack("{s:o, s:o, s:s, s:b, s:s, s:s}", "rows", rows, "type_ids", types,
                     "pooling", model_pooling_name(h->pooling), "normalize", h->normalize,
                     "head", h->head == MODEL_HEAD_CLASSIFIER ? "classifier" : "embedding",
                     "scores", h->sigmoid == MODEL_SCORES_SIGMOID ? "sigmoid"
                               : h->sigmoid == MODEL_SCORES_NONE  ? "none"
                                                                  : "softmax");
}

/* Every model of the table through tests/torch_encoders.py (one start of
 * python), against kinfer and the reference on the same batch. */
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
    if (access(TORCH_PY, R_OK) != 0) fail_msg("%s not found: run from the repository root", TORCH_PY);
    static struct ref r[N_MODELS];
    static struct batch b[N_MODELS];
    static struct re_head h[N_MODELS];
    float *got[N_MODELS];
    size_t count[N_MODELS];
    size_t cmdcap = 16384, cmdlen;
    char *cmd = malloc(cmdcap);
    assert_non_null(cmd);
    cmdlen = (size_t)snprintf(cmd, cmdcap, "/usr/bin/python3 %s", TORCH_PY);
    for (size_t v = 0; v < N_MODELS; v++) {
        const struct desc *D = &models[v];
        char dir[128], req[160], name[32];
        snprintf(name, sizeof(name), "torch%zu", v);
        dir_for(name, dir, sizeof(dir));
        write_folder(D, dir);
        ref_read(dir, D->kind, &r[v]);
        struct model_encoder_spec o = overrides(D);
        h[v] = expect(D, &o);
        struct model *m = load_dir(dir, &o, D->what);
        size_t max = r[v].max_pos - r[v].pos_base;
        struct model_ws *ws = model_ws_new_tokens(m, 0, 5, 5 * max, NULL, 0);
        assert_non_null(ws);
        batch_make(&b[v], &r[v], 5, max, RE_CLS, RE_SEP, pad_id(&r[v]));
        const float *out;
        if (model_encode(m, ws, &b[v].s, &out) != MODEL_OK) fail_msg("%s: model_encode", D->what);
        count[v] = (h[v].head == MODEL_HEAD_CLASSIFIER ? r[v].n_labels : r[v].H) *
                   (h[v].pooling == MODEL_POOL_NONE && h[v].head == MODEL_HEAD_EMBEDDING
                        ? b[v].offsets[b[v].n] : b[v].n);
        got[v] = malloc(count[v] * sizeof(float));
        assert_non_null(got[v]);
        memcpy(got[v], out, count[v] * sizeof(float));
        model_ws_destroy(ws);
        model_destroy(m);
        snprintf(req, sizeof(req), "%s/req%zu.json", tmp_root, v);
        json_t *j = torch_request(&b[v], &h[v]);
        assert_int_equal(json_dump_file(j, req, 0), 0);
        json_decref(j);
        cmdlen += (size_t)snprintf(cmd + cmdlen, cmdcap - cmdlen, " '%s' '%s'", dir, req);
        assert_true(cmdlen < cmdcap);
    }
    char outp[160], errp[160];
    snprintf(outp, sizeof(outp), "%s/torch_out.json", tmp_root);
    snprintf(errp, sizeof(errp), "%s/torch_err.txt", tmp_root);
    snprintf(cmd + cmdlen, cmdcap - cmdlen, " >'%s' 2>'%s'", outp, errp);
    int rc = system(cmd);
    free(cmd);
    if (rc != 0) {
        char msg[2048] = "";
        FILE *f = fopen(errp, "r");
        if (f) {
            size_t n = fread(msg, 1, sizeof(msg) - 1, f);
            msg[n] = '\0';
            fclose(f);
        }
        fail_msg("%s failed (status %d): %s", TORCH_PY, rc, msg);
    }
    json_error_t je;
    json_t *res = json_load_file(outp, 0, &je);
    if (!res || json_array_size(res) != N_MODELS) fail_msg("%s: not %zu results", outp, N_MODELS);
    for (size_t v = 0; v < N_MODELS; v++) {
        const char *what = models[v].what;
        json_t *rows = json_object_get(json_array_get(res, v), "output"), *row, *x;
        double *pt = malloc(count[v] * sizeof(double));
        assert_non_null(pt);
        size_t n = 0, i, k;
        json_array_foreach(rows, i, row) json_array_foreach(row, k, x) {
            if (n >= count[v] || !json_is_number(x))
                fail_msg("%s: PyTorch's output is not %zu numbers", what, count[v]);
            pt[n++] = json_number_value(x);
        }
        if (n != count[v]) fail_msg("%s: PyTorch gave %zu values, kinfer %zu", what, n, count[v]);
        size_t cnt;
        double *ref = ref_encode(&r[v], &h[v], &b[v].s, &cnt), worst64 = 0;
        assert_int_equal(cnt, count[v]);
        for (k = 0; k < cnt; k++) {
            double e = fabs(pt[k] - ref[k]);
            if (!(e <= TOL_F64 * fmax(1.0, fabs(ref[k]))))
                fail_msg("%s: [%zu] PyTorch %.17g, reference %.17g", what, k, pt[k], ref[k]);
            worst64 = fmax(worst64, e);
        }
        char label[160];
        snprintf(label, sizeof(label), "%s (kinfer vs PyTorch)", what);
        double q = check(got[v], pt, count[v], label);
        printf("  %-75s kinfer err/tol %.3f, |torch - ref| %.2g\n", what, q, worst64);
        free(ref);
        free(pt);
        free(got[v]);
        ref_free(&r[v]);
    }
    json_decref(res);
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
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/kinfer_arch_XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(tmp_root);
    model_runtime_destroy(cpu_rt);
#ifndef KINFER_EMU /* the CPU's (test_cuda prints its own) */
    fprintf(stderr, "test_arch_encoders: worst err/tol %.3g (tol %g)\n", run_worst, TOL);
#endif
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference), cmocka_unit_test(test_offsets_matter),
        cmocka_unit_test(test_demo),      cmocka_unit_test(test_errors),
        cmocka_unit_test(test_torch),     cmocka_unit_test(test_cpu_bf16),
        cmocka_unit_test(test_cuda), /* stays last */
    };
    size_t n = sizeof(tests) / sizeof(tests[0]), first = 0;
#ifdef KINFER_EMU
    /* build/emu/tests/test_arch_encoders: the CUDA backend on the
     * emulated device; the CPU tests run in build/tests/. */
    first = n - 1;
#endif
    return _cmocka_run_group_tests("test_arch_encoders", tests + first, n - first, setup,
                                   teardown);
}

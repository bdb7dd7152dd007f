/* refencoder.h - the float64 reference of kinfer's BERT encoders, for the
 * test programs that check a backend against it (test_encoder.c for the
 * CPU backend): a model described as a table row (struct re_desc) is
 * written as a Hugging Face folder with random weights in F32, F16 or
 * BF16 (config.json, vocab.txt, tokenizer_config.json, model.safetensors,
 * optionally the sentence-transformers files and a classifier head), with
 * a double-precision twin of every tensor (already rounded to the file's
 * dtype, so only a backend's own arithmetic is measured), which runs token
 * sequences through BertModel's semantics in double: embeddings and their
 * LayerNorm, per-sequence attention (a sequence sees only itself), post-LN
 * layers with gelu (erf or tanh), then pooling cls / mean / max / none,
 * L2 normalization, or the pooler (tanh) and classifier with softmax or
 * sigmoid.
 *
 * Everything is written here from the Hugging Face model's definition,
 * not from kinfer's code: what a folder means (which files decide the
 * head, the pooling, the limits) is restated in re_expect.
 *
 * Header-only; a test program includes it once, after cmocka.h. */
#ifndef KINFER_REFENCODER_H
#define KINFER_REFENCODER_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../gpu/model.h"
#include "../gpu/safetensors.h"
#include "refmodel.h"
#include "testutil.h"

#define RE_MAX_LAYERS 4
#define RE_MAX_TENSORS (8 + 16 * RE_MAX_LAYERS)

/* ---- the vocabulary --------------------------------------------------- */

/* vocab.txt: the specials ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK]
 * 4), letters, continuations, digits, punctuation and a few words, all
 * lower case. */
static const char *const re_words[] = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m",
    "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z",
    "##a", "##b", "##c", "##d", "##e", "##f", "##g", "##h", "##i", "##j", "##k", "##l", "##m",
    "##n", "##o", "##p", "##q", "##r", "##s", "##t", "##u", "##v", "##w", "##x", "##y", "##z",
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ".", ",", "!", "?", "'",
    "the", "cat", "sat", "on", "mat", "dog", "ran", "fast", "kafka", "redis", "batch",
    "token", "query", "hello", "world", "and", "is", "not", "##ing", "##ed",
};
#define RE_N_WORDS (sizeof(re_words) / sizeof(re_words[0]))
#define RE_CLS 2
#define RE_SEP 3

/* ---- a test model, as a table row ------------------------------------- */

/* How a folder is made (plain data). Zero fields take the defaults the
 * comments give: the tiny model, 2 layers, hidden 32, 4 heads. */
struct re_desc {
    const char *what;
    size_t layers, hidden, heads, inter; /* 2, 32, 4, 64 */
    size_t max_pos;                      /* max_position_embeddings: 40 */
    size_t type_vocab;                   /* 2 */
    size_t n_labels;                     /* > 0: BertForSequenceClassification */
    size_t vocab;                        /* vocab_size (>= the vocab.txt's); 0 = a
                                            few rows more than vocab.txt */
    const char *dtype;                   /* "F32" (NULL), "F16", "BF16" */
    int prefix;                          /* BertModel names under "bert." */
    int old_ln;                          /* LayerNorm weight/bias as gamma/beta */
    const char *act;                     /* hidden_act; NULL = "gelu" */
    int multi_label;                     /* problem_type multi_label_classification */
    int st;                              /* sentence-transformers modules.json ... */
    enum model_pooling st_pool;          /* ... with this pooling mode */
    int st_normalize;                    /* ... and a Normalize module */
    size_t st_max_seq;                   /* sentence_bert_config.json max_seq_length */
    size_t tok_max;                      /* tokenizer_config.json model_max_length */
    double eps;                          /* layer_norm_eps; 0 = left out (1e-12) */
    const char *omit;                    /* a tensor (BertModel name) not written */
    const char *misshape;                /* a tensor written one wider */
    const char *as_i32;                  /* a tensor written as I32 */
};

/* One layer's weights in double ([out,in] as nn.Linear). */
struct re_layer {
    double *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *ao_w, *ao_b, *ln1_w, *ln1_b;
    double *i_w, *i_b, *o_w, *o_b, *ln2_w, *ln2_b;
};

/* A written folder and its float64 twin. */
struct re_model {
    struct re_desc d;      /* with the defaults filled in */
    char dir[256];
    size_t vocab;          /* vocab_size: the tokens of vocab.txt and a few more rows */
    double eps;            /* layer_norm_eps as a backend keeps it (a float) */
    int gelu_tanh;
    double *word, *pos, *type, *eln_w, *eln_b;
    struct re_layer L[RE_MAX_LAYERS];
    double *pool_w, *pool_b, *cls_w, *cls_b;
    size_t n_params;
    struct model_spec spec; /* name "t", path dir, no overrides */
    double *all[RE_MAX_TENSORS]; /* every array above, to free */
    size_t n_all;
};

/* What the output is (the folder's say, then the model entry's). */
struct re_head {
    enum model_head head;
    enum model_pooling pooling;
    int normalize, sigmoid;
};

/* ---- writing the folder ------------------------------------------------ */

RM_FN void re_write_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) fail_msg("%s: cannot write", path);
    fputs(text, f);
    if (fclose(f) != 0) fail_msg("%s: cannot write", path);
}

/* Replaces (or with value NULL removes) one key of dir's config.json. */
RM_FN void re_config_set(const char *dir, const char *key, const char *value_json)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) fail_msg("%s: %s", path, je.text);
    if (value_json) {
        json_t *v = json_loads(value_json, JSON_DECODE_ANY, &je);
        if (!v) fail_msg("bad JSON in a test table: %s", value_json);
        json_object_set_new(cfg, key, v);
    } else {
        json_object_del(cfg, key);
    }
    if (json_dump_file(cfg, path, JSON_INDENT(2)) != 0) fail_msg("%s: cannot write", path);
    json_decref(cfg);
}

/* Collects the tensors of one safetensors file and their twins. */
struct re_writer {
    struct re_model *rm;
    enum st_dtype dt;
    struct st_write_tensor t[RE_MAX_TENSORS];
    char names[RE_MAX_TENSORS][160];
    uint64_t shapes[RE_MAX_TENSORS][2];
    void *raw[RE_MAX_TENSORS];
    size_t n;
};

/* A new tensor called name (BertModel's name; written with the "bert."
 * prefix and old LayerNorm names as the description says), [d0] when d1
 * is 0, else [d0,d1], uniform in [lo,hi) and rounded through the dtype.
 * Returns its double twin. */
RM_FN double *re_tensor(struct re_writer *w, const char *name, size_t d0, size_t d1, float lo,
                        float hi)
{
    const struct re_desc *d = &w->rm->d;
    size_t numel = d0 * (d1 ? d1 : 1);
    double *twin = malloc(numel * sizeof(double));
    assert_non_null(twin);
    assert_true(w->n < RE_MAX_TENSORS && w->rm->n_all < RE_MAX_TENSORS);
    w->rm->all[w->rm->n_all++] = twin;
    int omit = d->omit && !strcmp(d->omit, name);
    int wide = d->misshape && !strcmp(d->misshape, name);
    int i32 = d->as_i32 && !strcmp(d->as_i32, name);
    size_t stored = wide ? (d1 ? d0 * (d1 + 1) : d0 + 1) : numel;
    void *raw = malloc(stored * 4);
    double *vals = malloc(stored * sizeof(double));
    assert_true(raw && vals);
    fill_weights(w->dt, stored, lo, hi, raw, vals); /* a wide one's extras: anything */
    memcpy(twin, vals, numel * sizeof(double));
    free(vals);
    if (i32)
        for (size_t i = 0; i < numel; i++) {
            int32_t v = (int32_t)i;
            memcpy((char *)raw + 4 * i, &v, 4);
        }
    if (omit) {
        free(raw);
        return twin;
    }
    w->rm->n_params += numel;
    char *nm = w->names[w->n];
    const char *pfx = d->prefix && strncmp(name, "classifier.", 11) != 0 ? "bert." : "";
    size_t len = strlen(name);
    if (d->old_ln && strstr(name, "LayerNorm") && len > 7 && !strcmp(name + len - 7, ".weight"))
        snprintf(nm, 160, "%s%.*s.gamma", pfx, (int)(len - 7), name);
    else if (d->old_ln && strstr(name, "LayerNorm") && len > 5 && !strcmp(name + len - 5, ".bias"))
        snprintf(nm, 160, "%s%.*s.beta", pfx, (int)(len - 5), name);
    else
        snprintf(nm, 160, "%s%s", pfx, name);
    w->shapes[w->n][0] = d0;
    w->shapes[w->n][1] = d1 ? (wide ? d1 + 1 : d1) : 0;
    if (!d1 && wide) w->shapes[w->n][0] = d0 + 1;
    w->raw[w->n] = raw;
    w->t[w->n] = (struct st_write_tensor){nm, i32 ? ST_I32 : w->dt, d1 ? 2 : 1, w->shapes[w->n],
                                         raw};
    w->n++;
    return twin;
}

/* Fills the description's defaults. */
RM_FN void re_defaults(struct re_desc *d)
{
    if (!d->layers) d->layers = 2;
    if (!d->hidden) d->hidden = 32;
    if (!d->heads) d->heads = 4;
    if (!d->inter) d->inter = 2 * d->hidden;
    if (!d->max_pos) d->max_pos = 40;
    if (!d->type_vocab) d->type_vocab = 2;
    if (!d->dtype) d->dtype = "F32";
    if (!d->act) d->act = "gelu";
}

/* Writes the folder described by desc into dir (created if missing) and
 * fills rm with its twin. The weights are drawn from the test generator
 * with spreads that keep every stage in its interesting range: embeddings
 * and LayerNorm outputs of order 1, attention scores with a standard
 * deviation near 1 (so softmax is neither flat nor one-hot), gelu inputs
 * of order 1 (its curved part), biases that matter. */
RM_FN void re_build(const struct re_desc *desc, const char *dir, struct re_model *rm)
{
    memset(rm, 0, sizeof(*rm));
    rm->d = *desc;
    struct re_desc *d = &rm->d;
    re_defaults(d);
    assert_true(d->layers <= RE_MAX_LAYERS);
    snprintf(rm->dir, sizeof(rm->dir), "%s", dir);
    if (mkdir(dir, 0755) != 0 && access(dir, F_OK) != 0) fail_msg("mkdir %s", dir);
    rm->vocab = d->vocab ? d->vocab : RE_N_WORDS + rand_between(0, 7);
    rm->eps = (double)(float)(d->eps ? d->eps : 1e-12);
    rm->gelu_tanh = strcmp(d->act, "gelu") != 0;

    /* vocab.txt and the tokenizer's settings */
    size_t cap = 16 * RE_N_WORDS, off = 0;
    char *v = malloc(cap);
    assert_non_null(v);
    for (size_t i = 0; i < RE_N_WORDS; i++)
        off += (size_t)snprintf(v + off, cap - off, "%s\n", re_words[i]);
    re_write_text(dir, "vocab.txt", v);
    free(v);
    char buf[1024];
    if (d->tok_max)
        snprintf(buf, sizeof(buf), "{\"do_lower_case\": true, \"model_max_length\": %zu}\n",
                 d->tok_max);
    else
        snprintf(buf, sizeof(buf), "{\"do_lower_case\": true}\n");
    re_write_text(dir, "tokenizer_config.json", buf);

    /* config.json */
    json_t *cfg = json_pack(
        "{s:s, s:[s], s:I, s:I, s:I, s:I, s:I, s:s, s:I, s:I, s:s}", "model_type", "bert",
        "architectures", d->n_labels ? "BertForSequenceClassification" : "BertModel",
        "vocab_size", (json_int_t)rm->vocab, "hidden_size", (json_int_t)d->hidden,
        "num_hidden_layers", (json_int_t)d->layers, "num_attention_heads", (json_int_t)d->heads,
        "intermediate_size", (json_int_t)d->inter, "hidden_act", d->act,
        "max_position_embeddings", (json_int_t)d->max_pos, "type_vocab_size",
        (json_int_t)d->type_vocab, "position_embedding_type", "absolute");
    assert_non_null(cfg);
    if (d->eps) json_object_set_new(cfg, "layer_norm_eps", json_real(d->eps));
    if (d->n_labels) {
        json_t *id2 = json_object(), *l2id = json_object();
        for (size_t i = 0; i < d->n_labels; i++) {
            char k[32], name[32];
            snprintf(k, sizeof(k), "%zu", i);
            snprintf(name, sizeof(name), "class_%zu", i);
            json_object_set_new(id2, k, json_string(name));
            json_object_set_new(l2id, name, json_integer((json_int_t)i));
        }
        json_object_set_new(cfg, "id2label", id2);
        json_object_set_new(cfg, "label2id", l2id);
        if (d->multi_label)
            json_object_set_new(cfg, "problem_type", json_string("multi_label_classification"));
    }
    snprintf(buf, sizeof(buf), "%s/config.json", dir);
    if (json_dump_file(cfg, buf, JSON_INDENT(2)) != 0) fail_msg("%s: cannot write", buf);
    json_decref(cfg);

    /* the sentence-transformers files */
    if (d->st) {
        snprintf(buf, sizeof(buf),
                 "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
                 "\"sentence_transformers.models.Transformer\"},\n"
                 " {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": "
                 "\"sentence_transformers.models.Pooling\"}%s]\n",
                 d->st_normalize ? ",\n {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", "
                                   "\"type\": \"sentence_transformers.models.Normalize\"}"
                                 : "");
        re_write_text(dir, "modules.json", buf);
        char sub[300];
        snprintf(sub, sizeof(sub), "%s/1_Pooling", dir);
        mkdir(sub, 0755);
        snprintf(buf, sizeof(buf),
                 "{\"word_embedding_dimension\": %zu, \"pooling_mode_cls_token\": %s, "
                 "\"pooling_mode_mean_tokens\": %s, \"pooling_mode_max_tokens\": %s, "
                 "\"pooling_mode_mean_sqrt_len_tokens\": false}\n",
                 d->hidden, d->st_pool == MODEL_POOL_CLS ? "true" : "false",
                 d->st_pool == MODEL_POOL_MEAN ? "true" : "false",
                 d->st_pool == MODEL_POOL_MAX ? "true" : "false");
        re_write_text(sub, "config.json", buf);
        if (d->st_normalize) {
            snprintf(sub, sizeof(sub), "%s/2_Normalize", dir);
            mkdir(sub, 0755);
        }
    }
    if (d->st_max_seq) {
        snprintf(buf, sizeof(buf), "{\"max_seq_length\": %zu, \"do_lower_case\": false}\n",
                 d->st_max_seq);
        re_write_text(dir, "sentence_bert_config.json", buf);
    }

    /* model.safetensors */
    struct re_writer *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    w->rm = rm;
    if (st_dtype_parse(d->dtype, &w->dt) != 0) fail_msg("dtype %s", d->dtype);
    size_t H = d->hidden, I = d->inter;
    float qk = 2.0f / sqrtf((float)H), lin = 1.0f / sqrtf((float)H), lin_i = 1.0f / sqrtf((float)I);
    rm->word = re_tensor(w, "embeddings.word_embeddings.weight", rm->vocab, H, -1, 1);
    rm->pos = re_tensor(w, "embeddings.position_embeddings.weight", d->max_pos, H, -1, 1);
    rm->type = re_tensor(w, "embeddings.token_type_embeddings.weight", d->type_vocab, H, -1, 1);
    rm->eln_w = re_tensor(w, "embeddings.LayerNorm.weight", H, 0, 0.5f, 1.5f);
    rm->eln_b = re_tensor(w, "embeddings.LayerNorm.bias", H, 0, -0.5f, 0.5f);
    for (size_t l = 0; l < d->layers; l++) {
        struct re_layer *L = &rm->L[l];
        char n[160];
#define RE_T(field, suffix, d0, d1, lo, hi)                                              \
    do {                                                                                 \
        snprintf(n, sizeof(n), "encoder.layer.%zu.%s", l, (suffix));                     \
        L->field = re_tensor(w, n, (d0), (d1), (lo), (hi));                              \
    } while (0)
        RE_T(q_w, "attention.self.query.weight", H, H, -qk, qk);
        RE_T(q_b, "attention.self.query.bias", H, 0, -0.2f, 0.2f);
        RE_T(k_w, "attention.self.key.weight", H, H, -qk, qk);
        RE_T(k_b, "attention.self.key.bias", H, 0, -0.2f, 0.2f);
        RE_T(v_w, "attention.self.value.weight", H, H, -lin, lin);
        RE_T(v_b, "attention.self.value.bias", H, 0, -0.2f, 0.2f);
        RE_T(ao_w, "attention.output.dense.weight", H, H, -lin, lin);
        RE_T(ao_b, "attention.output.dense.bias", H, 0, -0.2f, 0.2f);
        RE_T(ln1_w, "attention.output.LayerNorm.weight", H, 0, 0.5f, 1.5f);
        RE_T(ln1_b, "attention.output.LayerNorm.bias", H, 0, -0.5f, 0.5f);
        RE_T(i_w, "intermediate.dense.weight", I, H, -qk, qk);
        RE_T(i_b, "intermediate.dense.bias", I, 0, -0.5f, 0.5f);
        RE_T(o_w, "output.dense.weight", H, I, -lin_i, lin_i);
        RE_T(o_b, "output.dense.bias", H, 0, -0.2f, 0.2f);
        RE_T(ln2_w, "output.LayerNorm.weight", H, 0, 0.5f, 1.5f);
        RE_T(ln2_b, "output.LayerNorm.bias", H, 0, -0.5f, 0.5f);
#undef RE_T
    }
    if (d->n_labels) {
        rm->pool_w = re_tensor(w, "pooler.dense.weight", H, H, -qk, qk);
        rm->pool_b = re_tensor(w, "pooler.dense.bias", H, 0, -0.2f, 0.2f);
        rm->cls_w = re_tensor(w, "classifier.weight", d->n_labels, H, -qk, qk);
        rm->cls_b = re_tensor(w, "classifier.bias", d->n_labels, 0, -0.5f, 0.5f);
    }
    char err[512] = "";
    snprintf(buf, sizeof(buf), "%s/model.safetensors", dir);
    if (st_write(buf, w->t, w->n, err, sizeof(err)) != 0) fail_msg("st_write: %s", err);
    for (size_t i = 0; i < w->n; i++) free(w->raw[i]);
    free(w);

    snprintf(rm->spec.name, sizeof(rm->spec.name), "t");
    snprintf(rm->spec.path, sizeof(rm->spec.path), "%s", dir);
    model_encoder_spec_defaults(&rm->spec.enc);
}

/* Frees the twin (the folder stays: the caller removes it). */
RM_FN void re_free(struct re_model *rm)
{
    for (size_t i = 0; i < rm->n_all; i++) free(rm->all[i]);
    rm->n_all = 0;
}

/* What the model's output is: the folder's word (a classifier if it is
 * BertForSequenceClassification, sigmoid for multi-label problems and for
 * one label (a cross-encoder, as sentence-transformers scores it), the
 * pooling and normalization of modules.json, else cls and none), then the
 * entry's overrides; a classifier always reads [CLS] through the pooler
 * and is never normalized. */
RM_FN struct re_head re_expect(const struct re_model *rm, const struct model_encoder_spec *o)
{
    struct re_head h = {rm->d.n_labels ? MODEL_HEAD_CLASSIFIER : MODEL_HEAD_EMBEDDING,
                        rm->d.st ? rm->d.st_pool : MODEL_POOL_CLS, rm->d.st && rm->d.st_normalize,
                        rm->d.multi_label || rm->d.n_labels == 1 ? MODEL_SCORES_SIGMOID
                                                                 : MODEL_SCORES_SOFTMAX};
    if (o->head >= 0) h.head = (enum model_head)o->head;
    if (o->pooling >= 0) h.pooling = (enum model_pooling)o->pooling;
    if (o->normalize >= 0) h.normalize = o->normalize;
    if (o->sigmoid >= 0) h.sigmoid = o->sigmoid;
    if (h.head == MODEL_HEAD_CLASSIFIER) {
        h.pooling = MODEL_POOL_CLS;
        h.normalize = 0;
    }
    return h;
}

/* Tokens per row the model should allow: max_position_embeddings, capped
 * by the tokenizer's model_max_length and sentence-transformers'
 * max_seq_length; the entry's max_tokens replaces them all. */
RM_FN size_t re_max_tokens(const struct re_model *rm, size_t override)
{
    if (override) return override;
    size_t m = rm->d.max_pos;
    if (rm->d.tok_max && rm->d.tok_max < m) m = rm->d.tok_max;
    if (rm->d.st_max_seq && rm->d.st_max_seq < m) m = rm->d.st_max_seq;
    return m;
}

/* ---- the float64 forward pass ----------------------------------------- */

/* y[rows,out] = x[rows,in] W^T + b, W [out,in] as nn.Linear. */
RM_FN void re_linear(const double *x, size_t rows, size_t in, const double *W, const double *b,
                     size_t out, double *y)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < out; j++) {
            double s = b ? b[j] : 0.0;
            for (size_t k = 0; k < in; k++) s += x[r * in + k] * W[j * in + k];
            y[r * out + j] = s;
        }
}

/* nn.LayerNorm over each row of w values, in place (biased variance). */
RM_FN void re_layernorm(double *x, size_t rows, size_t w, const double *g, const double *b,
                        double eps)
{
    for (size_t r = 0; r < rows; r++) {
        double *row = x + r * w, mean = 0, var = 0;
        for (size_t i = 0; i < w; i++) mean += row[i];
        mean /= (double)w;
        for (size_t i = 0; i < w; i++) var += (row[i] - mean) * (row[i] - mean);
        var /= (double)w;
        for (size_t i = 0; i < w; i++) row[i] = (row[i] - mean) / sqrt(var + eps) * g[i] + b[i];
    }
}

/* gelu (erf, hidden_act "gelu") or its tanh approximation (gelu_new). */
RM_FN double re_gelu(double x, int tanh_form)
{
    if (tanh_form)
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

/* The last hidden states of one sequence of len tokens (types may be
 * NULL: all 0) into x [len,H]. The sequence is alone: nothing of any
 * other sequence takes part, which is what an attention mask over padding
 * achieves in a padded batch. */
RM_FN void re_sequence(const struct re_model *rm, const int32_t *ids, const int32_t *types,
                       size_t len, double *x)
{
    size_t H = rm->d.hidden, I = rm->d.inter, nh = rm->d.heads, dh = H / nh;
    for (size_t t = 0; t < len; t++)
        for (size_t k = 0; k < H; k++)
            x[t * H + k] = rm->word[(size_t)ids[t] * H + k] + rm->pos[t * H + k] +
                           rm->type[(size_t)(types ? types[t] : 0) * H + k];
    re_layernorm(x, len, H, rm->eln_w, rm->eln_b, rm->eps);
    double *q = malloc(len * H * sizeof(double)), *k = malloc(len * H * sizeof(double));
    double *v = malloc(len * H * sizeof(double)), *ctx = malloc(len * H * sizeof(double));
    double *a = malloc(len * H * sizeof(double)), *p = malloc(len * sizeof(double));
    double *mid = malloc(len * I * sizeof(double));
    assert_true(q && k && v && ctx && a && p && mid);
    for (size_t l = 0; l < rm->d.layers; l++) {
        const struct re_layer *L = &rm->L[l];
        re_linear(x, len, H, L->q_w, L->q_b, H, q);
        re_linear(x, len, H, L->k_w, L->k_b, H, k);
        re_linear(x, len, H, L->v_w, L->v_b, H, v);
        for (size_t h = 0; h < nh; h++)
            for (size_t i = 0; i < len; i++) {
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j < len; j++) {
                    double s = 0;
                    for (size_t e = 0; e < dh; e++)
                        s += q[i * H + h * dh + e] * k[j * H + h * dh + e];
                    p[j] = s / sqrt((double)dh);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (size_t j = 0; j < len; j++) sum += (p[j] = exp(p[j] - mx));
                for (size_t e = 0; e < dh; e++) {
                    double c = 0;
                    for (size_t j = 0; j < len; j++) c += p[j] / sum * v[j * H + h * dh + e];
                    ctx[i * H + h * dh + e] = c;
                }
            }
        re_linear(ctx, len, H, L->ao_w, L->ao_b, H, a);
        for (size_t i = 0; i < len * H; i++) x[i] += a[i];
        re_layernorm(x, len, H, L->ln1_w, L->ln1_b, rm->eps);
        re_linear(x, len, H, L->i_w, L->i_b, I, mid);
        for (size_t i = 0; i < len * I; i++) mid[i] = re_gelu(mid[i], rm->gelu_tanh);
        re_linear(mid, len, I, L->o_w, L->o_b, H, a);
        for (size_t i = 0; i < len * H; i++) x[i] += a[i];
        re_layernorm(x, len, H, L->ln2_w, L->ln2_b, rm->eps);
    }
    free(q), free(k), free(v), free(ctx), free(a), free(p), free(mid);
}

/* F.normalize: x / max(||x||, 1e-12). */
RM_FN void re_l2norm(double *x, size_t w)
{
    double s = 0;
    for (size_t i = 0; i < w; i++) s += x[i] * x[i];
    double n = sqrt(s) > 1e-12 ? sqrt(s) : 1e-12;
    for (size_t i = 0; i < w; i++) x[i] /= n;
}

/* Floats the head gives per sequence (pooling none: per token). */
RM_FN size_t re_width(const struct re_model *rm, const struct re_head *h)
{
    return h->head == MODEL_HEAD_CLASSIFIER ? rm->d.n_labels : rm->d.hidden;
}

/* Runs the packed sequences of s through the model and the head h;
 * returns new doubles laid out as model_encode's output (n x width, or
 * total tokens x hidden for pooling none), their count in *count. */
RM_FN double *re_encode(const struct re_model *rm, const struct re_head *h,
                        const struct model_seqs *s, size_t *count)
{
    size_t H = rm->d.hidden, total = s->offsets[s->n], wdt = re_width(rm, h);
    int all_tokens = h->head == MODEL_HEAD_EMBEDDING && h->pooling == MODEL_POOL_NONE;
    *count = all_tokens ? total * H : s->n * wdt;
    double *out = malloc(*count * sizeof(double)), *x = malloc(total * H * sizeof(double));
    double *pooled = malloc(H * sizeof(double));
    assert_true(out && x && pooled);
    for (size_t i = 0; i < s->n; i++) {
        size_t o = s->offsets[i], len = s->offsets[i + 1] - o;
        double *xs = x + o * H;
        re_sequence(rm, s->ids + o, s->type_ids ? s->type_ids + o : NULL, len, xs);
        double *row = out + i * wdt;
        if (h->head == MODEL_HEAD_CLASSIFIER) {
            re_linear(xs, 1, H, rm->pool_w, rm->pool_b, H, pooled);
            for (size_t k = 0; k < H; k++) pooled[k] = tanh(pooled[k]);
            re_linear(pooled, 1, H, rm->cls_w, rm->cls_b, wdt, row);
            if (h->sigmoid == MODEL_SCORES_SIGMOID) {
                for (size_t k = 0; k < wdt; k++) row[k] = 1.0 / (1.0 + exp(-row[k]));
            } else {
                double mx = row[0], sum = 0;
                for (size_t k = 1; k < wdt; k++) mx = row[k] > mx ? row[k] : mx;
                for (size_t k = 0; k < wdt; k++) sum += (row[k] = exp(row[k] - mx));
                for (size_t k = 0; k < wdt; k++) row[k] /= sum;
            }
            continue;
        }
        switch (h->pooling) {
        case MODEL_POOL_CLS:
            memcpy(row, xs, H * sizeof(double));
            break;
        case MODEL_POOL_MEAN:
            for (size_t k = 0; k < H; k++) {
                double sum = 0;
                for (size_t t = 0; t < len; t++) sum += xs[t * H + k];
                row[k] = sum / (double)len;
            }
            break;
        case MODEL_POOL_MAX:
            for (size_t k = 0; k < H; k++) {
                double mx = xs[k];
                for (size_t t = 1; t < len; t++) mx = xs[t * H + k] > mx ? xs[t * H + k] : mx;
                row[k] = mx;
            }
            break;
        case MODEL_POOL_NONE:
            break;
        }
        if (h->normalize && !all_tokens) re_l2norm(row, H);
    }
    if (all_tokens) {
        memcpy(out, x, total * H * sizeof(double));
        if (h->normalize)
            for (size_t t = 0; t < total; t++) re_l2norm(out + t * H, H);
    }
    free(x);
    free(pooled);
    return out;
}

/* ---- reading a folder back (for folders written by others) ------------ */

/* A tensor of f as new doubles, checked to hold numel values. */
RM_FN double *re_get(struct re_model *rm, const struct st_file *f, const char *name,
                     size_t numel)
{
    const struct st_tensor *t = st_find(f, name);
    if (!t) fail_msg("%s: no tensor %s", rm->dir, name);
    assert_int_equal(t->numel, numel);
    float *tmp = malloc(numel * sizeof(float));
    double *twin = malloc(numel * sizeof(double));
    assert_true(tmp && twin && rm->n_all < RE_MAX_TENSORS);
    assert_int_equal(st_to_f32(t, tmp), 0);
    for (size_t i = 0; i < numel; i++) twin[i] = tmp[i];
    free(tmp);
    rm->all[rm->n_all++] = twin;
    rm->n_params += numel;
    return twin;
}

/* The twin of a folder another writer made (plain BertModel names, no
 * prefix), such as model_write_demo_bert's: sizes, hidden_act and
 * layer_norm_eps from config.json, a classifier when it has id2label,
 * every tensor from model.safetensors. rm->d.st and friends stay 0: the
 * caller says what head to expect. */
RM_FN void re_read(const char *dir, struct re_model *rm)
{
    memset(rm, 0, sizeof(*rm));
    snprintf(rm->dir, sizeof(rm->dir), "%s", dir);
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) fail_msg("%s: %s", path, je.text);
    struct re_desc *d = &rm->d;
    d->hidden = (size_t)json_integer_value(json_object_get(cfg, "hidden_size"));
    d->layers = (size_t)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    d->heads = (size_t)json_integer_value(json_object_get(cfg, "num_attention_heads"));
    d->inter = (size_t)json_integer_value(json_object_get(cfg, "intermediate_size"));
    d->max_pos = (size_t)json_integer_value(json_object_get(cfg, "max_position_embeddings"));
    d->type_vocab = (size_t)json_integer_value(json_object_get(cfg, "type_vocab_size"));
    d->n_labels = json_object_size(json_object_get(cfg, "id2label"));
    rm->vocab = (size_t)json_integer_value(json_object_get(cfg, "vocab_size"));
    const json_t *eps = json_object_get(cfg, "layer_norm_eps");
    rm->eps = (double)(float)(eps ? json_number_value(eps) : 1e-12);
    const char *act = json_string_value(json_object_get(cfg, "hidden_act"));
    rm->gelu_tanh = act && strcmp(act, "gelu") != 0;
    json_decref(cfg);
    assert_true(d->hidden && d->layers && d->layers <= RE_MAX_LAYERS && d->heads && d->inter &&
                d->max_pos && d->type_vocab && rm->vocab);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct st_file *f = st_open(path, err, sizeof(err));
    if (!f) fail_msg("%s", err);
    size_t H = d->hidden, I = d->inter;
    rm->word = re_get(rm, f, "embeddings.word_embeddings.weight", rm->vocab * H);
    rm->pos = re_get(rm, f, "embeddings.position_embeddings.weight", d->max_pos * H);
    rm->type = re_get(rm, f, "embeddings.token_type_embeddings.weight", d->type_vocab * H);
    rm->eln_w = re_get(rm, f, "embeddings.LayerNorm.weight", H);
    rm->eln_b = re_get(rm, f, "embeddings.LayerNorm.bias", H);
    for (size_t l = 0; l < d->layers; l++) {
        struct re_layer *L = &rm->L[l];
        char n[160];
#define RE_G(field, suffix, numel)                                                       \
    do {                                                                                 \
        snprintf(n, sizeof(n), "encoder.layer.%zu.%s", l, (suffix));                     \
        L->field = re_get(rm, f, n, (numel));                                            \
    } while (0)
        RE_G(q_w, "attention.self.query.weight", H * H);
        RE_G(q_b, "attention.self.query.bias", H);
        RE_G(k_w, "attention.self.key.weight", H * H);
        RE_G(k_b, "attention.self.key.bias", H);
        RE_G(v_w, "attention.self.value.weight", H * H);
        RE_G(v_b, "attention.self.value.bias", H);
        RE_G(ao_w, "attention.output.dense.weight", H * H);
        RE_G(ao_b, "attention.output.dense.bias", H);
        RE_G(ln1_w, "attention.output.LayerNorm.weight", H);
        RE_G(ln1_b, "attention.output.LayerNorm.bias", H);
        RE_G(i_w, "intermediate.dense.weight", I * H);
        RE_G(i_b, "intermediate.dense.bias", I);
        RE_G(o_w, "output.dense.weight", H * I);
        RE_G(o_b, "output.dense.bias", H);
        RE_G(ln2_w, "output.LayerNorm.weight", H);
        RE_G(ln2_b, "output.LayerNorm.bias", H);
#undef RE_G
    }
    if (d->n_labels) {
        rm->pool_w = re_get(rm, f, "pooler.dense.weight", H * H);
        rm->pool_b = re_get(rm, f, "pooler.dense.bias", H);
        rm->cls_w = re_get(rm, f, "classifier.weight", d->n_labels * H);
        rm->cls_b = re_get(rm, f, "classifier.bias", d->n_labels);
    }
    st_close(f);
    snprintf(rm->spec.name, sizeof(rm->spec.name), "t");
    snprintf(rm->spec.path, sizeof(rm->spec.path), "%s", dir);
    model_encoder_spec_defaults(&rm->spec.enc);
}

/* ---- batches ---------------------------------------------------------- */

/* A packed batch the test owns (model_seqs points into it). */
struct re_batch {
    struct model_seqs s;
    int32_t *ids, *types;
    uint32_t *offsets;
    size_t n, total;
};

/* n sequences with the given lengths (lens[i] >= 1): [CLS], random ids
 * over the whole vocab_size (rows past vocab.txt too), [SEP] last when
 * there is room; a second segment of type id 1 from a random point on
 * (types 0 throughout when with_types is 0, and type_ids then NULL). */
RM_FN void re_batch_make(struct re_batch *b, const struct re_model *rm, const size_t *lens,
                         size_t n, int with_types)
{
    memset(b, 0, sizeof(*b));
    for (size_t i = 0; i < n; i++) b->total += lens[i];
    b->n = n;
    b->ids = malloc(b->total * sizeof(int32_t));
    b->types = malloc(b->total * sizeof(int32_t));
    b->offsets = malloc((n + 1) * sizeof(uint32_t));
    assert_true(b->ids && b->types && b->offsets);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        b->offsets[i] = (uint32_t)o;
        size_t split = rand_between(1, lens[i]);
        for (size_t t = 0; t < lens[i]; t++) {
            int32_t id = (int32_t)rand_between(0, rm->vocab - 1);
            if (t == 0) id = RE_CLS;
            else if (t + 1 == lens[i]) id = RE_SEP;
            b->ids[o + t] = id;
            b->types[o + t] = with_types && t >= split ? (int32_t)(rm->d.type_vocab - 1) : 0;
        }
        o += lens[i];
    }
    b->offsets[n] = (uint32_t)o;
    b->s = (struct model_seqs){b->ids, with_types ? b->types : NULL, b->offsets, n};
}

/* n random lengths in 1..max, one of them max itself. */
RM_FN void re_batch_random(struct re_batch *b, const struct re_model *rm, size_t n, size_t max,
                           int with_types)
{
    size_t lens[64];
    assert_true(n >= 1 && n <= 64);
    for (size_t i = 0; i < n; i++) lens[i] = rand_between(1, max);
    lens[rand_between(0, n - 1)] = max;
    re_batch_make(b, rm, lens, n, with_types);
}

RM_FN void re_batch_free(struct re_batch *b)
{
    free(b->ids);
    free(b->types);
    free(b->offsets);
    memset(b, 0, sizeof(*b));
}

#endif

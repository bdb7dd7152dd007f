/* bert.c - reads Hugging Face BERT folders (bert.h); gpu/demo.c writes
 * the demo one.
 *
 * What is read, and where from:
 *   config.json           the architecture (model_type "bert", absolute
 *                         positions), sizes, hidden_act, layer_norm_eps,
 *                         architectures (BertForSequenceClassification
 *                         means a classifier head), id2label, problem_type
 *   model.safetensors     every tensor, BertModel names with or without
 *                         the "bert." prefix, LayerNorm's old gamma/beta
 *                         names too; classifier.* for the head
 *   tokenizer.json        the tokenizer (text/wordpiece), else vocab.txt
 *                         with tokenizer_config.json
 *   modules.json          sentence-transformers: its Pooling module's
 *                         config.json (one mode of cls, mean, max) and a
 *                         Normalize module
 *   sentence_bert_config.json  max_seq_length
 * The model entry's encoder = { ... } settings override each of these.
 *
 * Threads: the main thread at start-up. Ownership: as bert.h says. */
#include "bert.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../text/tokenizer.h"

/* One read's context, so every message starts "model NAME: ". */
struct rd {
    const struct model_spec *spec;
    struct bert_folder *bf;
    char *err;
    size_t err_size;
};

__attribute__((format(printf, 2, 3)))
static int fail(struct rd *r, const char *fmt, ...)
{
    if (!r->err || !r->err_size) return -1;
    int n = snprintf(r->err, r->err_size, "model %s: ", r->spec->name);
    if (n >= 0 && (size_t)n < r->err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err + n, r->err_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* dir/name into buf; 0, or -1 when it does not fit. */
static int path_in(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A JSON file of the folder; NULL with the error set (absent: *absent = 1
 * and no error when absent is not NULL). */
static json_t *load_json(struct rd *r, const char *name, int *absent)
{
    char path[4200];
    if (path_in(path, sizeof(path), r->spec->path, name) < 0) {
        fail(r, "%s/%s: path too long", r->spec->path, name);
        return NULL;
    }
    if (!exists(path)) {
        if (absent) {
            *absent = 1;
            return NULL;
        }
        fail(r, "%s: no such file", path);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) fail(r, "%s:%d: %s", path, je.line, je.text);
    else if (!json_is_object(j)) {
        fail(r, "%s: not a JSON object", path);
        json_decref(j);
        j = NULL;
    }
    if (absent) *absent = 0;
    return j;
}

/* A positive integer field of config.json (def when absent, 0 = required). */
static int cfg_size(struct rd *r, const json_t *cfg, const char *key, size_t def, size_t max,
                    size_t *out)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v) {
        if (!def) return fail(r, "config.json: %s is missing", key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || (size_t)json_integer_value(v) > max)
        return fail(r, "config.json: %s must be an integer in 1..%zu", key, max);
    *out = (size_t)json_integer_value(v);
    return 0;
}

/* ---- tensors ------------------------------------------------------------ */

/* The tensor called name, with or without the "bert." prefix; a
 * LayerNorm's weight/bias also by its old name gamma/beta. Checks its
 * dtype and shape ([d0] when d1 == 0, else [d0,d1]). */
static const struct st_tensor *tensor(struct rd *r, const char *name, size_t d0, size_t d1)
{
    const struct st_file *f = r->bf->file;
    char alt[320], old[300];
    const struct st_tensor *t = st_find(f, name);
    snprintf(alt, sizeof(alt), "bert.%s", name);
    if (!t) t = st_find(f, alt);
    if (!t) {
        size_t n = strlen(name);
        const char *rep = n > 7 && !strcmp(name + n - 7, ".weight") ? "gamma"
                          : n > 5 && !strcmp(name + n - 5, ".bias")  ? "beta"
                                                                     : NULL;
        if (rep && strstr(name, "LayerNorm")) {
            snprintf(old, sizeof(old), "%.*s.%s", (int)(n - (rep[0] == 'g' ? 7 : 5)), name, rep);
            t = st_find(f, old);
            snprintf(alt, sizeof(alt), "bert.%s", old);
            if (!t) t = st_find(f, alt);
        }
    }
    if (!t) {
        fail(r, "tensor %s not found in model.safetensors (nor bert.%s)", name, name);
        return NULL;
    }
    if (!st_dtype_loadable(t->dtype)) {
        fail(r, "tensor %s has dtype %s, expected F32, F16 or BF16", t->name,
             st_dtype_name(t->dtype));
        return NULL;
    }
    int ok = d1 ? t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1
                : t->ndim == 1 && t->shape[0] == d0;
    if (!ok) {
        char got[128];
        st_tensor_shape_str(t, got, sizeof(got));
        if (d1) fail(r, "tensor %s has shape %s, expected [%zu,%zu]", t->name, got, d0, d1);
        else fail(r, "tensor %s has shape %s, expected [%zu]", t->name, got, d0);
        return NULL;
    }
    r->bf->n_params += (size_t)t->numel;
    return t;
}

/* Layer i's tensors under encoder.layer.i. */
static int read_layer(struct rd *r, size_t i, struct backend_bert_layer *L)
{
    const struct backend_bert *p = &r->bf->plan;
    size_t H = p->hidden, I = p->intermediate;
    char n[160];
#define T(field, suffix, d0, d1)                                                   \
    do {                                                                           \
        snprintf(n, sizeof(n), "encoder.layer.%zu.%s", i, suffix);                 \
        if (!(L->field = tensor(r, n, d0, d1))) return -1;                          \
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

/* ---- config.json ----------------------------------------------------------- */

/* Architecture and sizes; the head from architectures. */
static int read_config(struct rd *r, const json_t *cfg)
{
    struct backend_bert *p = &r->bf->plan;
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (mt && strcmp(mt, "bert") != 0)
        return fail(r, "config.json: model_type \"%s\" is not bert (BERT-family encoders only)",
                    mt);
    const char *pe = json_string_value(json_object_get(cfg, "position_embedding_type"));
    if (pe && strcmp(pe, "absolute") != 0)
        return fail(r, "config.json: position_embedding_type \"%s\": only absolute positions", pe);
    if (cfg_size(r, cfg, "vocab_size", 0, 1 << 24, &p->vocab) < 0 ||
        cfg_size(r, cfg, "hidden_size", 0, 1 << 16, &p->hidden) < 0 ||
        cfg_size(r, cfg, "num_hidden_layers", 0, 256, &p->n_layers) < 0 ||
        cfg_size(r, cfg, "num_attention_heads", 0, 1024, &p->heads) < 0 ||
        cfg_size(r, cfg, "intermediate_size", 0, 1 << 18, &p->intermediate) < 0 ||
        cfg_size(r, cfg, "max_position_embeddings", 512, 1 << 16, &p->max_pos) < 0 ||
        cfg_size(r, cfg, "type_vocab_size", 2, 1024, &p->type_vocab) < 0)
        return -1;
    if (p->hidden % p->heads)
        return fail(r, "config.json: hidden_size %zu is not a multiple of num_attention_heads %zu",
                    p->hidden, p->heads);
    const json_t *eps = json_object_get(cfg, "layer_norm_eps");
    double e = eps ? json_number_value(eps) : 1e-12;
    if (!(e > 0 && e < 1)) return fail(r, "config.json: layer_norm_eps must be > 0 and < 1");
    p->ln_eps = (float)e;
    const char *act = json_string_value(json_object_get(cfg, "hidden_act"));
    if (!act || !strcmp(act, "gelu")) p->gelu_tanh = 0;
    else if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh") ||
             !strcmp(act, "gelu_fast"))
        p->gelu_tanh = 1;
    else
        return fail(r, "config.json: hidden_act \"%s\" is not supported (gelu, gelu_new)", act);
    p->head = MODEL_HEAD_EMBEDDING;
    const json_t *arch = json_object_get(cfg, "architectures");
    size_t i;
    json_t *a;
    json_array_foreach(arch, i, a) {
        const char *s = json_string_value(a);
        if (s && !strcmp(s, "BertForSequenceClassification")) p->head = MODEL_HEAD_CLASSIFIER;
    }
    const char *pt = json_string_value(json_object_get(cfg, "problem_type"));
    p->sigmoid = pt && !strcmp(pt, "multi_label_classification");
    return 0;
}

/* id2label ({"0": "NEGATIVE", ...}) into the labels; n from num_labels,
 * id2label or the classifier's rows. */
static int read_labels(struct rd *r, const json_t *cfg, size_t rows)
{
    struct bert_folder *bf = r->bf;
    const json_t *map = json_object_get(cfg, "id2label");
    size_t n = rows;
    if (map && json_object_size(map) != n)
        return fail(r, "config.json: id2label has %zu labels, the classifier %zu",
                    json_object_size(map), n);
    if (!(bf->labels = calloc(n, sizeof(char *)))) return fail(r, "out of memory");
    bf->plan.n_labels = n;
    for (size_t i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof(key), "%zu", i);
        const char *v = map ? json_string_value(json_object_get(map, key)) : NULL;
        if (map && !v) return fail(r, "config.json: id2label has no label %zu", i);
        char dflt[32];
        snprintf(dflt, sizeof(dflt), "LABEL_%zu", i);
        if (!(bf->labels[i] = strdup(v ? v : dflt))) return fail(r, "out of memory");
    }
    return 0;
}

/* ---- sentence-transformers -------------------------------------------------- */

/* modules.json: the Pooling module's mode and a Normalize module. A folder
 * without it keeps the defaults (cls, not normalized). */
static int read_modules(struct rd *r)
{
    struct backend_bert *p = &r->bf->plan;
    int absent = 0;
    json_t *mods = NULL;
    char mpath[4200];
    if (path_in(mpath, sizeof(mpath), r->spec->path, "modules.json") < 0)
        return fail(r, "path too long");
    if (!exists(mpath)) return 0;
    json_error_t je;
    mods = json_load_file(mpath, JSON_REJECT_DUPLICATES, &je);
    if (!mods || !json_is_array(mods)) {
        json_decref(mods);
        return fail(r, "modules.json: not a JSON array");
    }
    int rc = 0;
    size_t i;
    json_t *m;
    json_array_foreach(mods, i, m) {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *sub = json_string_value(json_object_get(m, "path"));
        if (!type) continue;
        if (!strcmp(type, "sentence_transformers.models.Normalize")) {
            p->normalize = 1;
        } else if (!strcmp(type, "sentence_transformers.models.Pooling")) {
            char name[300];
            snprintf(name, sizeof(name), "%s/config.json", sub ? sub : "1_Pooling");
            json_t *pc = load_json(r, name, &absent);
            if (!pc) {
                if (absent) rc = fail(r, "%s: no such file", name);
                else rc = -1;
                break;
            }
            static const struct {
                const char *key;
                int pooling;
            } modes[] = {{"pooling_mode_cls_token", MODEL_POOL_CLS},
                         {"pooling_mode_mean_tokens", MODEL_POOL_MEAN},
                         {"pooling_mode_max_tokens", MODEL_POOL_MAX},
                         {"pooling_mode_mean_sqrt_len_tokens", -1},
                         {"pooling_mode_weightedmean_tokens", -1},
                         {"pooling_mode_lasttoken", -1}};
            const char *found = NULL; /* the mode set, once one is */
            for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]) && rc == 0; k++) {
                if (!json_is_true(json_object_get(pc, modes[k].key))) continue;
                if (modes[k].pooling < 0) {
                    rc = fail(r, "%s: %s is not supported (one of cls, mean, max)", name,
                              modes[k].key);
                } else if (found) { /* sentence-transformers would concatenate them */
                    rc = fail(r, "%s: %s and %s are both set: only one pooling mode is "
                              "supported", name, found, modes[k].key);
                } else {
                    found = modes[k].key;
                    p->pooling = (enum model_pooling)modes[k].pooling;
                }
            }
            if (rc == 0 && !found) rc = fail(r, "%s: no pooling mode is set", name);
            json_decref(pc);
        } else if (strcmp(type, "sentence_transformers.models.Transformer") != 0) {
            rc = fail(r, "modules.json: module %s is not supported (Transformer, Pooling, "
                      "Normalize)", type);
        }
        if (rc) break;
    }
    json_decref(mods);
    return rc;
}

/* ---- the tokenizer ----------------------------------------------------------- */

/* The folder's tokenizer as text/tokenizer.h reads it, with the entry's
 * lowercase override. *model_max gets the tokenizer's model_max_length
 * (0: none). */
static int read_tokenizer(struct rd *r, size_t *model_max)
{
    char why[512];
    struct tokenizer_opts o;
    tokenizer_opts_init(&o);
    o.lowercase = r->spec->enc.lowercase;
    if (!(r->bf->tok = tokenizer_load(r->spec->path, &o, why, sizeof(why))))
        return fail(r, "%s", why);
    *model_max = tokenizer_max_tokens(r->bf->tok);
    return 0;
}

/* ---- the folder ------------------------------------------------------------------ */

int bert_folder_read(const struct model_spec *spec, struct bert_folder *bf, char *errstr,
                     size_t errstr_size)
{
    memset(bf, 0, sizeof(*bf));
    struct rd r = {spec, bf, errstr, errstr_size};
    struct backend_bert *p = &bf->plan;
    json_t *cfg = load_json(&r, "config.json", NULL);
    if (!cfg || read_config(&r, cfg) < 0) goto fail;
    p->pooling = MODEL_POOL_CLS;
    if (read_modules(&r) < 0) goto fail;
    size_t tok_max = 0, st_max = 0;
    if (read_tokenizer(&r, &tok_max) < 0) goto fail;
    if (tokenizer_vocab_size(bf->tok) > p->vocab) {
        fail(&r, "the tokenizer has %zu tokens, the model's vocab_size is %zu",
             tokenizer_vocab_size(bf->tok), p->vocab);
        goto fail;
    }
    int absent = 0;
    json_t *sb = load_json(&r, "sentence_bert_config.json", &absent);
    if (sb) {
        const json_t *v = json_object_get(sb, "max_seq_length");
        if (json_is_integer(v) && json_integer_value(v) > 0) st_max = (size_t)json_integer_value(v);
        json_decref(sb);
    } else if (!absent) {
        goto fail;
    }

    /* The entry's overrides, then the limits that follow. */
    const struct model_encoder_spec *o = &spec->enc;
    if (o->head >= 0) p->head = (enum model_head)o->head;
    if (o->pooling >= 0) p->pooling = (enum model_pooling)o->pooling;
    if (o->normalize >= 0) p->normalize = o->normalize;
    if (o->sigmoid >= 0) p->sigmoid = o->sigmoid;
    bf->max_tokens = p->max_pos;
    if (tok_max && tok_max < bf->max_tokens) bf->max_tokens = tok_max;
    if (st_max && st_max < bf->max_tokens) bf->max_tokens = st_max;
    if (o->max_tokens) {
        if (o->max_tokens > p->max_pos) {
            fail(&r, "encoder.max_tokens %zu is more than max_position_embeddings %zu",
                 o->max_tokens, p->max_pos);
            goto fail;
        }
        bf->max_tokens = o->max_tokens;
    }
    if (bf->max_tokens < 3) {
        fail(&r, "at most %zu tokens per row: too few for [CLS] text [SEP]", bf->max_tokens);
        goto fail;
    }

    char path[4200], sterr[512];
    if (path_in(path, sizeof(path), spec->path, "model.safetensors") < 0) {
        fail(&r, "path too long");
        goto fail;
    }
    if (!exists(path)) {
        fail(&r, "%s: no such file (only safetensors weights are read)", path);
        goto fail;
    }
    if (!(bf->file = st_open(path, sterr, sizeof(sterr)))) {
        fail(&r, "%s", sterr);
        goto fail;
    }
    size_t H = p->hidden;
    if (!(p->word = tensor(&r, "embeddings.word_embeddings.weight", p->vocab, H)) ||
        !(p->pos = tensor(&r, "embeddings.position_embeddings.weight", p->max_pos, H)) ||
        !(p->type = tensor(&r, "embeddings.token_type_embeddings.weight", p->type_vocab, H)) ||
        !(p->emb_ln_w = tensor(&r, "embeddings.LayerNorm.weight", H, 0)) ||
        !(p->emb_ln_b = tensor(&r, "embeddings.LayerNorm.bias", H, 0)))
        goto fail;
    if (!(bf->layers = calloc(p->n_layers, sizeof(*bf->layers)))) {
        fail(&r, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < p->n_layers; i++)
        if (read_layer(&r, i, &bf->layers[i]) < 0) goto fail;
    p->layers = bf->layers;
    if (p->head == MODEL_HEAD_CLASSIFIER) {
        const struct st_tensor *cw = st_find(bf->file, "classifier.weight");
        if (!cw || cw->ndim != 2 || cw->shape[1] != H || cw->shape[0] < 1 ||
            cw->shape[0] > 65536) {
            fail(&r, "a classifier needs tensor classifier.weight [labels,%zu]", H);
            goto fail;
        }
        size_t nl = (size_t)cw->shape[0];
        if (!(p->pool_w = tensor(&r, "pooler.dense.weight", H, H)) ||
            !(p->pool_b = tensor(&r, "pooler.dense.bias", H, 0)) ||
            !(p->cls_w = tensor(&r, "classifier.weight", nl, H)) ||
            !(p->cls_b = tensor(&r, "classifier.bias", nl, 0)) || read_labels(&r, cfg, nl) < 0)
            goto fail;
        p->pooling = MODEL_POOL_CLS; /* the pooler reads [CLS] */
        p->normalize = 0;
    }
    json_decref(cfg);
    return 0;
fail:
    json_decref(cfg);
    bert_folder_fini(bf);
    return -1;
}

void bert_folder_close_file(struct bert_folder *bf)
{
    st_close(bf->file);
    bf->file = NULL;
}

void bert_folder_fini(struct bert_folder *bf)
{
    bert_folder_close_file(bf);
    free(bf->layers);
    bf->layers = NULL;
    tokenizer_destroy(bf->tok);
    bf->tok = NULL;
    for (size_t i = 0; bf->labels && i < bf->plan.n_labels; i++) free(bf->labels[i]);
    free(bf->labels);
    bf->labels = NULL;
}

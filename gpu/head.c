/* head.c - the runtime's heads (head.h): reading a folder's head, the
 * classifier's weights, and running a head over an encoder's hidden
 * states with the backend's primitives.
 *
 * Threads and ownership: as head.h says; a head_weights owns its weights,
 * a head_ws's buffers belong to the context they were allocated in. */
#include "head.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arch.h"

/* ---- reading ------------------------------------------------------------- */

/* modules.json: the Pooling module's mode and a Normalize module. A folder
 * without it keeps the defaults (cls, not normalized). */
static int head_read_modules(const char *dir, struct head_conf *h, char *why, size_t n)
{
    char path[4200];
    struct stat st;
    snprintf(path, sizeof(path), "%s/modules.json", dir);
    if (stat(path, &st) != 0) return 0;
    json_error_t je;
    json_t *mods = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!mods || !json_is_array(mods)) {
        json_decref(mods);
        snprintf(why, n, "modules.json: not a JSON array");
        return -1;
    }
    int rc = 0;
    size_t i;
    json_t *m;
    json_array_foreach(mods, i, m) {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *sub = json_string_value(json_object_get(m, "path"));
        if (!type) continue;
        if (!strcmp(type, "sentence_transformers.models.Normalize")) {
            h->normalize = 1;
        } else if (!strcmp(type, "sentence_transformers.models.Pooling")) {
            char name[300], pp[4600];
            snprintf(name, sizeof(name), "%s/config.json", sub ? sub : "1_Pooling");
            snprintf(pp, sizeof(pp), "%s/%s", dir, name);
            if (stat(pp, &st) != 0) {
                snprintf(why, n, "%s: no such file", name);
                rc = -1;
                break;
            }
            json_t *pc = json_load_file(pp, JSON_REJECT_DUPLICATES, &je);
            if (!pc || !json_is_object(pc)) {
                snprintf(why, n, "%s:%d: %s", pp, je.line, pc ? "not a JSON object" : je.text);
                json_decref(pc);
                rc = -1;
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
                    snprintf(why, n, "%s: %s is not supported (one of cls, mean, max)", name,
                             modes[k].key);
                    rc = -1;
                } else if (found) { /* sentence-transformers would concatenate them */
                    snprintf(why, n, "%s: %s and %s are both set: only one pooling mode is "
                             "supported", name, found, modes[k].key);
                    rc = -1;
                } else {
                    found = modes[k].key;
                    h->pooling = (enum model_pooling)modes[k].pooling;
                }
            }
            if (rc == 0 && !found) {
                snprintf(why, n, "%s: no pooling mode is set", name);
                rc = -1;
            }
            json_decref(pc);
        } else if (strcmp(type, "sentence_transformers.models.Transformer") != 0) {
            snprintf(why, n, "modules.json: module %s is not supported (Transformer, Pooling, "
                     "Normalize)", type);
            rc = -1;
        }
        if (rc) break;
    }
    json_decref(mods);
    return rc;
}

/* A cross-encoder's activation as sentence-transformers saves it in
 * config.json: sentence_transformers.activation_fn, or the older
 * sbert_ce_default_activation_function; a torch module's qualified name.
 * *scores is set (enum model_scores) when the folder names one; 0, or -1
 * with why filled for a module the runtime does not run. */
static int head_read_activation(const json_t *cfg, int *scores, char *why, size_t n)
{
    const char *key = "sentence_transformers.activation_fn";
    const json_t *v = json_object_get(json_object_get(cfg, "sentence_transformers"),
                                      "activation_fn");
    if (!v || json_is_null(v)) {
        key = "sbert_ce_default_activation_function";
        v = json_object_get(cfg, key);
    }
    if (!v || json_is_null(v)) return 0;
    const char *name = json_string_value(v);
    if (name && (!strcmp(name, "torch.nn.modules.activation.Sigmoid") ||
                 !strcmp(name, "torch.nn.Sigmoid"))) {
        *scores = MODEL_SCORES_SIGMOID;
        return 0;
    }
    if (name && (!strcmp(name, "torch.nn.modules.linear.Identity") ||
                 !strcmp(name, "torch.nn.Identity"))) {
        *scores = MODEL_SCORES_NONE;
        return 0;
    }
    /* the name, at most 120 bytes cut at a character's start (jansson's
     * strings are valid UTF-8, so the cut one is too) */
    char shown[128];
    size_t len = name ? strlen(name) : 0;
    if (len > 120)
        for (len = 120; ((unsigned char)name[len] & 0xC0) == 0x80; len--) {}
    snprintf(shown, sizeof(shown), "%.*s", (int)len, name ? name : "");
    snprintf(why, n, "config.json: %s %s%s%s is not supported "
             "(torch.nn.modules.activation.Sigmoid, torch.nn.modules.linear.Identity)", key,
             name ? "\"" : "", name ? shown : "is not a string", name ? "\"" : "");
    return -1;
}

/* The labels config.json gives a classifier, as Hugging Face counts them:
 * id2label's, else num_labels, else 2. */
static size_t head_config_labels(const json_t *cfg)
{
    const json_t *map = json_object_get(cfg, "id2label");
    if (json_is_object(map) && json_object_size(map)) return json_object_size(map);
    const json_t *n = json_object_get(cfg, "num_labels");
    if (json_is_integer(n) && json_integer_value(n) > 0) return (size_t)json_integer_value(n);
    return 2;
}

/* A classifier is named by its architecture ("...ForSequenceClassification");
 * its scores by the folder's cross-encoder activation, else problem_type
 * (multi_label_classification: sigmoid), else the label count (one label,
 * a cross-encoder's relevance: sigmoid, as sentence-transformers'
 * CrossEncoder defaults; more: softmax). */
int head_conf_read(const char *dir, const json_t *cfg, const struct model_encoder_spec *o,
                   struct head_conf *h, char *why, size_t why_size)
{
    memset(h, 0, sizeof(*h));
    h->head = MODEL_HEAD_EMBEDDING;
    h->pooling = MODEL_POOL_CLS;
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(cfg, "architectures"), i, a) {
        const char *s = json_string_value(a);
        size_t n = s ? strlen(s) : 0, k = strlen("ForSequenceClassification");
        if (n > k && !strcmp(s + n - k, "ForSequenceClassification"))
            h->head = MODEL_HEAD_CLASSIFIER;
    }
    const char *pt = json_string_value(json_object_get(cfg, "problem_type"));
    h->sigmoid = pt && !strcmp(pt, "multi_label_classification") ? MODEL_SCORES_SIGMOID
                 : head_config_labels(cfg) == 1                  ? MODEL_SCORES_SIGMOID
                                                                 : MODEL_SCORES_SOFTMAX;
    if (head_read_modules(dir, h, why, why_size) < 0) return -1;
    if (o->head >= 0) h->head = (enum model_head)o->head;
    if (o->pooling >= 0) h->pooling = (enum model_pooling)o->pooling;
    if (o->normalize >= 0) h->normalize = o->normalize;
    /* the folder's activation only where it is used: a classifier whose
     * entry does not name one */
    if (h->head == MODEL_HEAD_CLASSIFIER && o->sigmoid < 0 &&
        head_read_activation(cfg, &h->sigmoid, why, why_size) < 0)
        return -1;
    if (o->sigmoid >= 0) h->sigmoid = o->sigmoid;
    if (h->head == MODEL_HEAD_CLASSIFIER) {
        h->pooling = MODEL_POOL_CLS; /* the classifier reads the first token */
        h->normalize = 0;
    }
    return 0;
}

char **head_labels_read(const json_t *cfg, size_t n, char *why, size_t why_size)
{
    const json_t *map = json_object_get(cfg, "id2label");
    if (map && json_object_size(map) != n) {
        snprintf(why, why_size, "config.json: id2label has %zu labels, the classifier %zu",
                 json_object_size(map), n);
        return NULL;
    }
    char **labels = calloc(n, sizeof(char *));
    if (!labels) goto oom;
    for (size_t i = 0; i < n; i++) {
        char key[32], dflt[32];
        snprintf(key, sizeof(key), "%zu", i);
        const char *v = map ? json_string_value(json_object_get(map, key)) : NULL;
        if (map && !v) {
            snprintf(why, why_size, "config.json: id2label has no label %zu", i);
            goto fail;
        }
        snprintf(dflt, sizeof(dflt), "LABEL_%zu", i);
        if (!(labels[i] = strdup(v ? v : dflt))) goto oom;
    }
    return labels;
oom:
    snprintf(why, why_size, "out of memory");
fail:
    for (size_t i = 0; labels && i < n; i++) free(labels[i]);
    free(labels);
    return NULL;
}

/* ---- weights --------------------------------------------------------------- */

int head_classifier_read(struct arch_load *ld, const char *const *prefixes, const char *pre_w,
                         const char *pre_b, const char *out_w, const char *out_b, size_t hidden,
                         struct head_tensors *t)
{
    memset(t, 0, sizeof(*t));
    t->pre_act = BK_ACT_TANH;
    const struct st_tensor *cw = st_find(ld->file, out_w);
    for (size_t i = 0; !cw && prefixes && prefixes[i]; i++) {
        char alt[320];
        snprintf(alt, sizeof(alt), "%s%s", prefixes[i], out_w);
        cw = st_find(ld->file, alt);
    }
    if (!cw || cw->ndim != 2 || cw->shape[1] != hidden || cw->shape[0] < 1 ||
        cw->shape[0] > 65536)
        return arch_fail(ld, "a classifier needs tensor %s [labels,%zu]", out_w, hidden);
    t->n_labels = (size_t)cw->shape[0];
    if (pre_w && (!(t->pre_w = arch_tensor(ld, prefixes, pre_w, hidden, hidden)) ||
                  !(t->pre_b = arch_tensor(ld, prefixes, pre_b, hidden, 0))))
        return -1;
    if (!(t->out_w = arch_tensor(ld, prefixes, out_w, t->n_labels, hidden)) ||
        !(t->out_b = arch_tensor(ld, prefixes, out_b, t->n_labels, 0)))
        return -1;
    return 0;
}

int head_upload(struct arch_load *ld, size_t dev, const struct head_tensors *t,
                struct head_weights *w)
{
    memset(w, 0, sizeof(*w));
    w->pre_act = t->pre_act;
    if (!t->out_w) return 0;
    if ((t->pre_w && (!(w->pre_w = arch_weight1(ld, dev, BK_W_ACT, t->pre_w)) ||
                      !(w->pre_b = arch_weight1(ld, dev, BK_W_ACT, t->pre_b)))) ||
        !(w->out_w = arch_weight1(ld, dev, BK_W_ACT, t->out_w)) ||
        !(w->out_b = arch_weight1(ld, dev, BK_W_ACT, t->out_b)))
        return -1;
    return 0;
}

void head_free(const struct arch_rt *rt, struct head_weights *w)
{
    arch_weight_free(rt, w->pre_w);
    arch_weight_free(rt, w->pre_b);
    arch_weight_free(rt, w->out_w);
    arch_weight_free(rt, w->out_b);
    memset(w, 0, sizeof(*w));
}

/* ---- running ---------------------------------------------------------------- */

size_t head_out_w(const struct head_conf *h, size_t hidden, size_t n_labels)
{
    return h->head == MODEL_HEAD_CLASSIFIER ? n_labels : hidden;
}

int head_ws_new(const struct arch_rt *rt, void *c, const struct head_conf *h, size_t max_rows,
                size_t hidden, size_t n_labels, struct head_ws *ws)
{
    memset(ws, 0, sizeof(*ws));
    if (h->head == MODEL_HEAD_EMBEDDING && h->pooling == MODEL_POOL_NONE) return 0;
    if (!(ws->pooled = rt->ops->ctx_alloc(c, arch_act_bytes(rt, max_rows * hidden), 0)))
        return -1;
    if (h->head != MODEL_HEAD_CLASSIFIER) return 0;
    if (!(ws->tmp = rt->ops->ctx_alloc(c, arch_act_bytes(rt, max_rows * hidden), 0)) ||
        !(ws->logits = rt->ops->ctx_alloc(c, arch_act_bytes(rt, max_rows * n_labels), 0)))
        return -1;
    return 0;
}

static enum bk_pool head_pool_mode(enum model_pooling p)
{
    switch (p) {
    case MODEL_POOL_MEAN: return BK_POOL_MEAN;
    case MODEL_POOL_MAX: return BK_POOL_MAX;
    default: return BK_POOL_FIRST;
    }
}

int head_run(const struct arch_rt *rt, void *c, const struct head_conf *h,
             const struct head_weights *w, size_t n_labels, struct head_ws *ws, void *x,
             const struct bk_seqs *s, size_t hidden, const void **out)
{
    const struct backend_ops *o = rt->ops;
    if (h->head == MODEL_HEAD_EMBEDDING && h->pooling == MODEL_POOL_NONE) {
        if (h->normalize) ARCH_TRY(o->l2norm(c, x, s->tokens, hidden));
        *out = x;
        return 0;
    }
    ARCH_TRY(o->pool(c, ws->pooled, x, s, head_pool_mode(h->pooling), hidden));
    if (h->head == MODEL_HEAD_EMBEDDING) {
        if (h->normalize) ARCH_TRY(o->l2norm(c, ws->pooled, s->n, hidden));
        *out = ws->pooled;
        return 0;
    }
    const void *in = ws->pooled;
    if (w->pre_w) {
        struct bk_gemm g = {.m = s->n, .n = hidden, .k = hidden, .a = in, .w = w->pre_w,
                            .bias = w->pre_b, .act = w->pre_act, .c = ws->tmp};
        ARCH_TRY(o->gemm(c, &g));
        in = ws->tmp;
    }
    struct bk_gemm g = {.m = s->n, .n = n_labels, .k = hidden, .a = in, .w = w->out_w,
                        .bias = w->out_b, .c = ws->logits};
    ARCH_TRY(o->gemm(c, &g));
    if (h->sigmoid == MODEL_SCORES_SIGMOID)
        ARCH_TRY(o->act(c, ws->logits, s->n * n_labels, BK_ACT_SIGMOID));
    else if (h->sigmoid == MODEL_SCORES_SOFTMAX)
        ARCH_TRY(o->softmax(c, ws->logits, s->n, n_labels));
    *out = ws->logits;
    return 0;
}

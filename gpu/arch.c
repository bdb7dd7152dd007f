/* arch.c - the registry of architectures and the helpers their files
 * share (arch.h): finding and checking tensors by name, reading
 * config.json's sizes, uploading weights.
 *
 * Threads: the main thread at load (the registry is constant data). */
#include "arch.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Every architecture of this build: a new one is a file and a row. */
const struct arch *const arch_registry[] = {
    &arch_mlp,
    &arch_bert,
    &arch_roberta,
    &arch_mpnet,
    &arch_distilbert,
    &arch_nomic,
};
const size_t arch_registry_len = sizeof(arch_registry) / sizeof(arch_registry[0]);

const struct arch *arch_for_model_type(const char *model_type)
{
    for (size_t i = 0; model_type && i < arch_registry_len; i++)
        for (const char *const *t = arch_registry[i]->model_types; t && *t; t++)
            if (!strcmp(*t, model_type)) return arch_registry[i];
    return NULL;
}

/* The decoder architectures of this build. */
static const struct arch_decoder *const arch_decoders[] = {
    &arch_llama,
};

const struct arch_decoder *arch_decoder_for_model_type(const char *model_type)
{
    for (size_t i = 0; model_type && i < sizeof(arch_decoders) / sizeof(arch_decoders[0]); i++)
        for (const char *const *t = arch_decoders[i]->model_types; t && *t; t++)
            if (!strcmp(*t, model_type)) return arch_decoders[i];
    return NULL;
}

const struct arch *arch_layer_list(void)
{
    for (size_t i = 0; i < arch_registry_len; i++)
        if (!arch_registry[i]->model_types) return arch_registry[i];
    return NULL;
}

void arch_model_types(char *buf, size_t n)
{
    size_t at = 0;
    if (n) buf[0] = '\0';
    for (size_t i = 0; i < arch_registry_len; i++)
        for (const char *const *t = arch_registry[i]->model_types; t && *t; t++) {
            int k = snprintf(buf + at, n - at, "%s%s", at ? ", " : "", *t);
            if (k < 0 || (size_t)k >= n - at) return;
            at += (size_t)k;
        }
}

int arch_fail(struct arch_load *ld, const char *fmt, ...)
{
    if (!ld->errstr || !ld->errstr_size) return -1;
    int n = snprintf(ld->errstr, ld->errstr_size, "model %s: ", ld->spec->name);
    if (n >= 0 && (size_t)n < ld->errstr_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ld->errstr + n, ld->errstr_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* name, else each prefix + name; for a LayerNorm's weight/bias also the
 * old gamma/beta names. */
static const struct st_tensor *arch_find(const struct st_file *f, const char *const *prefixes,
                                         const char *name)
{
    const struct st_tensor *t = st_find(f, name);
    char alt[400];
    for (size_t i = 0; !t && prefixes && prefixes[i]; i++) {
        snprintf(alt, sizeof(alt), "%s%s", prefixes[i], name);
        t = st_find(f, alt);
    }
    if (t) return t;
    size_t n = strlen(name);
    const char *rep = n > 7 && !strcmp(name + n - 7, ".weight") ? "gamma"
                      : n > 5 && !strcmp(name + n - 5, ".bias") ? "beta"
                                                                 : NULL;
    if (!rep || !strstr(name, "LayerNorm")) return NULL;
    char old[300];
    snprintf(old, sizeof(old), "%.*s.%s", (int)(n - (rep[0] == 'g' ? 7 : 5)), name, rep);
    return arch_find(f, prefixes, old);
}

const struct st_tensor *arch_tensor(struct arch_load *ld, const char *const *prefixes,
                                    const char *name, size_t d0, size_t d1)
{
    const struct st_tensor *t = arch_find(ld->file, prefixes, name);
    for (size_t i = 0; !t && i < ld->n_shards; i++) t = arch_find(ld->shards[i], prefixes, name);
    if (!t) {
        if (prefixes && prefixes[0])
            arch_fail(ld, "tensor %s not found in model.safetensors (nor %s%s)", name,
                      prefixes[0], name);
        else
            arch_fail(ld, "tensor %s not found in model.safetensors", name);
        return NULL;
    }
    if (!st_dtype_loadable(t->dtype)) {
        arch_fail(ld, "tensor %s has dtype %s, expected F32, F16 or BF16", t->name,
                  st_dtype_name(t->dtype));
        return NULL;
    }
    int ok = d1 ? t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1
                : t->ndim == 1 && t->shape[0] == d0;
    if (!ok) {
        char got[128];
        st_tensor_shape_str(t, got, sizeof(got));
        if (d1) arch_fail(ld, "tensor %s has shape %s, expected [%zu,%zu]", t->name, got, d0, d1);
        else arch_fail(ld, "tensor %s has shape %s, expected [%zu]", t->name, got, d0);
        return NULL;
    }
    ld->n_params += (size_t)t->numel;
    return t;
}

int arch_cfg_size(struct arch_load *ld, const char *key, size_t def, size_t max, size_t *out)
{
    const json_t *v = json_object_get(ld->config, key);
    if (!v || json_is_null(v)) {
        if (!def) return arch_fail(ld, "config.json: %s is missing", key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || (size_t)json_integer_value(v) > max)
        return arch_fail(ld, "config.json: %s must be an integer in 1..%zu", key, max);
    *out = (size_t)json_integer_value(v);
    return 0;
}

int arch_cfg_eps(struct arch_load *ld, const char *key, double def, float *out)
{
    const json_t *v = json_object_get(ld->config, key);
    double e = v ? json_number_value(v) : def;
    if (!(e > 0 && e < 1)) return arch_fail(ld, "config.json: %s must be > 0 and < 1", key);
    *out = (float)e;
    return 0;
}

int arch_cfg_act(struct arch_load *ld, const char *key, enum bk_act def, enum bk_act *out)
{
    static const struct {
        const char *name;
        enum bk_act act;
    } acts[] = {{"gelu", BK_ACT_GELU},           {"gelu_new", BK_ACT_GELU_TANH},
                {"gelu_pytorch_tanh", BK_ACT_GELU_TANH}, {"gelu_fast", BK_ACT_GELU_TANH},
                {"relu", BK_ACT_RELU},           {"silu", BK_ACT_SILU},
                {"swish", BK_ACT_SILU}};
    const char *s = json_string_value(json_object_get(ld->config, key));
    if (!s) {
        *out = def;
        return 0;
    }
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++)
        if (!strcmp(s, acts[i].name)) {
            *out = acts[i].act;
            return 0;
        }
    return arch_fail(ld, "config.json: %s \"%s\" is not supported (gelu, gelu_new, relu, silu)",
                     key, s);
}

struct bk_weight *arch_weight(struct arch_load *ld, size_t dev, enum bk_wtype type,
                              const struct bk_wsrc *src, size_t n)
{
    char err[256];
    struct bk_weight *w = ld->rt.ops->weight_new(ld->rt.be, dev, type, src, n, err, sizeof(err));
    if (!w) arch_fail(ld, "%s", err);
    return w;
}

struct bk_weight *arch_weight1(struct arch_load *ld, size_t dev, enum bk_wtype type,
                               const struct st_tensor *t)
{
    if (!t) return NULL;
    struct bk_wsrc s = {.t = t};
    return arch_weight(ld, dev, type, &s, 1);
}

void arch_weight_free(const struct arch_rt *rt, struct bk_weight *w)
{
    if (w) rt->ops->weight_free(rt->be, w);
}

size_t arch_act_bytes(const struct arch_rt *rt, size_t n)
{
    return n * rt->ops->act_size(rt->be);
}

void *arch_act_at(const struct arch_rt *rt, const void *p, size_t n)
{
    return (char *)p + arch_act_bytes(rt, n);
}

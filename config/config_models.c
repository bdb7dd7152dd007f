/* config_models.c - reads the model list: each entry's name, path
 * (resolved against the directory of the file that names it), input
 * width, and either a layer list (op, weight, bias, eps, checked against
 * the model runtime's op table) or, without layers, a Hugging Face model
 * folder with its encoder settings.
 *
 * Threads: main thread, inside cfg_load. Ownership: every string and
 * array read is copied into the struct kcfg being built. */
#include "config_read.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define INPUT_WIDTH_MAX 16777216 /* 2^24 floats per row */

/* Copies a tensor name into a layer spec's fixed buffer, refusing what
 * does not fit rather than truncating it into another tensor's name. */
static int read_tensor_name(struct loader *ld, const config_setting_t *s, const char *what,
                            char *dst, size_t cap)
{
    if (config_setting_type(s) != CONFIG_TYPE_STRING)
        return cfg_fail_at(ld, s, "%s: expected a string, got %s", what,
                       cfg_type_words(config_setting_type(s)));
    const char *v = config_setting_get_string(s);
    if (!*v) return cfg_fail_at(ld, s, "%s: must not be empty", what);
    if (strlen(v) >= cap)
        return cfg_fail_at(ld, s, "%s: tensor name longer than %zu characters", what, cap - 1);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

/* One layer group { op = "..."; weight = "..."; bias = "..."; eps = ...; }.
 * Keys may come in any order, so they are gathered first and judged once
 * the op is known. */
static int read_layer(struct loader *ld, const config_setting_t *s, size_t mi, size_t li,
                      struct model_layer_spec *l)
{
    char where[64];
    snprintf(where, sizeof(where), "models[%zu].layers[%zu]", mi, li);
    if (!config_setting_is_group(s))
        return cfg_fail_at(ld, s, "%s: expected a group { op = \"...\"; ... }, got %s", where,
                       cfg_type_words(config_setting_type(s)));
    const config_setting_t *op = NULL, *weight = NULL, *bias = NULL, *eps = NULL;
    int n = config_setting_length(s);
    for (int i = 0; i < n; i++) {
        const config_setting_t *m = config_setting_get_elem(s, (unsigned)i);
        const char *k = config_setting_name(m);
        if (strcmp(k, "op") == 0) op = m;
        else if (strcmp(k, "weight") == 0) weight = m;
        else if (strcmp(k, "bias") == 0) bias = m;
        else if (strcmp(k, "eps") == 0) eps = m;
        else return cfg_fail_at(ld, m, "unknown setting '%s.%s'", where, k);
    }
    if (!op) return cfg_fail_at(ld, s, "%s: missing 'op'", where);
    if (config_setting_type(op) != CONFIG_TYPE_STRING)
        return cfg_fail_at(ld, op, "%s.op: expected a string, got %s", where,
                       cfg_type_words(config_setting_type(op)));
    const char *opname = config_setting_get_string(op);
    if (model_op_parse(opname, &l->op) < 0) {
        char known[256] = "";
        size_t used = 0;
        for (int o = 0; o < MODEL_N_OPS && used < sizeof(known); o++) {
            int k = snprintf(known + used, sizeof(known) - used, "%s%s", o ? ", " : "",
                             model_op_name((enum model_op)o));
            if (k < 0) break;
            used += (size_t)k;
        }
        return cfg_fail_at(ld, op, "%s.op: unknown op '%s' (known: %s)", where, opname, known);
    }
    /* The op table says which keys the op gives meaning to and which it
     * needs; a stray key is an error with its line number rather than
     * something the loader would refuse later without one. */
    const struct model_op_desc *d = model_op_desc(l->op);
    const struct {
        const config_setting_t *s;
        unsigned key;
        const char *name;
    } keys[] = {{weight, MODEL_KEY_WEIGHT, "weight"}, {bias, MODEL_KEY_BIAS, "bias"},
                {eps, MODEL_KEY_EPS, "eps"}};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (keys[i].s && !(d->keys & keys[i].key))
            return cfg_fail_at(ld, keys[i].s, "%s: '%s' does not apply to op %s", where,
                           keys[i].name, opname);
        if (!keys[i].s && (d->required & keys[i].key))
            return cfg_fail_at(ld, s, "%s: op %s needs '%s'%s", where, opname, keys[i].name,
                           keys[i].key == MODEL_KEY_EPS ? "" : " (a tensor name)");
    }
    char what[96];
    if (weight) {
        snprintf(what, sizeof(what), "%s.weight", where);
        if (read_tensor_name(ld, weight, what, l->weight, sizeof(l->weight)) < 0) return -1;
    }
    if (bias) {
        snprintf(what, sizeof(what), "%s.bias", where);
        if (read_tensor_name(ld, bias, what, l->bias, sizeof(l->bias)) < 0) return -1;
    }
    l->eps = MODEL_EPS_DEFAULT;
    if (eps) {
        int t = config_setting_type(eps);
        if (t == CONFIG_TYPE_FLOAT) l->eps = config_setting_get_float(eps);
        else if (t == CONFIG_TYPE_INT) l->eps = config_setting_get_int(eps);
        else if (t == CONFIG_TYPE_INT64) l->eps = (double)config_setting_get_int64(eps);
        else
            return cfg_fail_at(ld, eps, "%s.eps: expected a number, got %s", where, cfg_type_words(t));
        char why[128];
        if (model_eps_check(l->eps, why, sizeof(why)) < 0)
            return cfg_fail_at(ld, eps, "%s.eps: %s", where, why);
    }
    return 0;
}

/* Model names show up in jobs, log fields and metric labels, so they are
 * kept to characters that need no quoting anywhere. */
static bool model_name_ok(const char *s)
{
    for (; *s; s++) {
        char ch = *s;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '.' || ch == '_' || ch == '-' || ch == ':' || ch == '/';
        if (!ok) return false;
    }
    return true;
}

/* Resolves a model path against the directory of the file that names it:
 * "models/demo.safetensors" in /etc/kinfer/worker.cfg means
 * /etc/kinfer/models/demo.safetensors whatever the worker's cwd. */
static int resolve_model_path(struct loader *ld, const config_setting_t *s, const char *what,
                              char *dst, size_t cap)
{
    const char *p = config_setting_get_string(s);
    char file[4200];
    cfg_display_path(ld, config_setting_source_file(s), file, sizeof(file));
    const char *slash = strrchr(file, '/');
    int n;
    if (p[0] == '/' || !slash)
        n = snprintf(dst, cap, "%s", p);
    else
        n = snprintf(dst, cap, "%.*s/%s", (int)(slash - file), file, p);
    if (n < 0 || (size_t)n >= cap)
        return cfg_fail_at(ld, s, "%s: path longer than %zu characters once resolved", what,
                       cap - 1);
    return 0;
}

/* encoder = { pooling; normalize; head; activation; lowercase; max_tokens }:
 * a model folder's overrides, each optional. */
static int read_encoder(struct loader *ld, const config_setting_t *s, const char *where,
                        struct model_encoder_spec *e)
{
    if (!config_setting_is_group(s))
        return cfg_fail_at(ld, s, "%s.encoder: expected a group { pooling = \"mean\"; ... }, got %s",
                       where, cfg_type_words(config_setting_type(s)));
    static const char *const heads[] = {"embedding", "classifier", NULL};
    /* in enum model_scores order */
    static const char *const acts[] = {"softmax", "sigmoid", "none", NULL};
    int n = config_setting_length(s);
    for (int i = 0; i < n; i++) {
        const config_setting_t *v = config_setting_get_elem(s, (unsigned)i);
        const char *k = config_setting_name(v);
        int t = config_setting_type(v);
        if (!strcmp(k, "normalize") || !strcmp(k, "lowercase")) {
            if (t != CONFIG_TYPE_BOOL)
                return cfg_fail_at(ld, v, "%s.encoder.%s: expected true or false, got %s", where, k,
                               cfg_type_words(t));
            *(!strcmp(k, "normalize") ? &e->normalize : &e->lowercase) =
                config_setting_get_bool(v);
        } else if (!strcmp(k, "max_tokens")) {
            if (t != CONFIG_TYPE_INT || config_setting_get_int(v) < 3 ||
                config_setting_get_int(v) > 65536)
                return cfg_fail_at(ld, v, "%s.encoder.max_tokens: expected an integer in 3..65536",
                               where);
            e->max_tokens = (size_t)config_setting_get_int(v);
        } else if (!strcmp(k, "pooling") || !strcmp(k, "head") || !strcmp(k, "activation")) {
            if (t != CONFIG_TYPE_STRING)
                return cfg_fail_at(ld, v, "%s.encoder.%s: expected a string, got %s", where, k,
                               cfg_type_words(t));
            const char *val = config_setting_get_string(v);
            enum model_pooling pool;
            if (!strcmp(k, "pooling")) {
                if (model_pooling_parse(val, &pool) < 0)
                    return cfg_fail_at(ld, v, "%s.encoder.pooling: '%s' is not one of cls, mean, "
                                   "max, none", where, val);
                e->pooling = (int)pool;
                continue;
            }
            const char *const *names = !strcmp(k, "head") ? heads : acts;
            int found = -1;
            for (int c = 0; names[c]; c++)
                if (!strcmp(val, names[c])) found = c;
            if (found < 0)
                return cfg_fail_at(ld, v, "%s.encoder.%s: '%s' is not one of %s, %s%s%s", where, k,
                               val, names[0], names[1], names[2] ? ", " : "",
                               names[2] ? names[2] : "");
            if (!strcmp(k, "head")) e->head = found; /* enum model_head order */
            else e->sigmoid = found;                 /* enum model_scores order */
        } else {
            return cfg_fail_at(ld, v, "unknown setting '%s.encoder.%s' (pooling, normalize, head, "
                           "activation, lowercase, max_tokens)", where, k);
        }
    }
    return 0;
}

/* One model group { name; path; input_width; layers } for a safetensors
 * file, or { name; path; encoder } (no layers) for a Hugging Face model
 * folder. Earlier
 * models are already in ld->c->models[0..mi), which is how duplicates are
 * found. */
static int read_model(struct loader *ld, const config_setting_t *s, size_t mi)
{
    struct model_spec *m = &ld->c->models[mi];
    char where[32], what[64];
    snprintf(where, sizeof(where), "models[%zu]", mi);
    if (!config_setting_is_group(s))
        return cfg_fail_at(ld, s, "%s: expected a group { name = ...; path = ...; layers = ...; }, "
                       "got %s", where, cfg_type_words(config_setting_type(s)));
    const config_setting_t *name = NULL, *path = NULL, *width = NULL, *layers = NULL,
                           *enc = NULL;
    model_encoder_spec_defaults(&m->enc);
    int n = config_setting_length(s);
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        const char *k = config_setting_name(e);
        if (strcmp(k, "name") == 0) name = e;
        else if (strcmp(k, "path") == 0) path = e;
        else if (strcmp(k, "input_width") == 0) width = e;
        else if (strcmp(k, "layers") == 0) layers = e;
        else if (strcmp(k, "encoder") == 0) enc = e;
        else return cfg_fail_at(ld, e, "unknown setting '%s.%s'", where, k);
    }
    if (!name) return cfg_fail_at(ld, s, "%s: missing 'name'", where);
    if (!path) return cfg_fail_at(ld, s, "%s: missing 'path'", where);

    const config_setting_t *str[] = {name, path};
    for (size_t i = 0; i < 2; i++) {
        if (config_setting_type(str[i]) != CONFIG_TYPE_STRING)
            return cfg_fail_at(ld, str[i], "%s.%s: expected a string, got %s", where,
                           config_setting_name(str[i]), cfg_type_words(config_setting_type(str[i])));
        if (!*config_setting_get_string(str[i]))
            return cfg_fail_at(ld, str[i], "%s.%s: must not be empty", where,
                           config_setting_name(str[i]));
    }
    const char *nm = config_setting_get_string(name);
    if (strlen(nm) >= sizeof(m->name))
        return cfg_fail_at(ld, name, "%s.name: '%s' is longer than %zu characters", where, nm,
                       sizeof(m->name) - 1);
    if (!model_name_ok(nm))
        return cfg_fail_at(ld, name, "%s.name: '%s' may hold only letters, digits and . _ - : /",
                       where, nm);
    for (size_t i = 0; i < mi; i++)
        if (strcmp(ld->c->models[i].name, nm) == 0)
            return cfg_fail_at(ld, name, "%s.name: model '%s' is defined twice", where, nm);
    memcpy(m->name, nm, strlen(nm) + 1);

    snprintf(what, sizeof(what), "%s.path", where);
    if (resolve_model_path(ld, path, what, m->path, sizeof(m->path)) < 0) return -1;

    /* Without layers the path names a Hugging Face model folder: its files
     * say what the model is, and encoder = { } may override them (whether
     * the folder exists is the loader's to say, as for a file). */
    if (!layers) {
        if (width)
            return cfg_fail_at(ld, width, "%s.input_width: a model folder (an entry without "
                           "layers) takes text: its config.json gives the sizes", where);
        return enc ? read_encoder(ld, enc, where, &m->enc) : 0;
    }
    if (enc)
        return cfg_fail_at(ld, enc, "%s.encoder: only for a model folder, an entry without layers",
                       where);

    if (width) {
        int t = config_setting_type(width);
        long long w;
        if (t == CONFIG_TYPE_INT) w = config_setting_get_int(width);
        else if (t == CONFIG_TYPE_INT64) w = config_setting_get_int64(width);
        else
            return cfg_fail_at(ld, width, "%s.input_width: expected an integer, got %s", where,
                           cfg_type_words(t));
        if (w < 0 || w > INPUT_WIDTH_MAX)
            return cfg_fail_at(ld, width, "%s.input_width: %lld is out of range 0..%d", where, w,
                           INPUT_WIDTH_MAX);
        m->input_width = (size_t)w;
    }

    if (!config_setting_is_list(layers) &&
        !(config_setting_is_array(layers) && config_setting_length(layers) == 0))
        return cfg_fail_at(ld, layers, "%s.layers: expected a list of groups ( { op = ...; }, ... ), "
                       "got %s", where, cfg_type_words(config_setting_type(layers)));
    int nl = config_setting_length(layers);
    if (nl == 0) return cfg_fail_at(ld, layers, "%s.layers: must list at least one layer", where);
    m->layers = calloc((size_t)nl, sizeof(*m->layers));
    if (!m->layers) return cfg_fail_plain(ld, "out of memory");
    m->n_layers = (size_t)nl;
    for (int i = 0; i < nl; i++)
        if (read_layer(ld, config_setting_get_elem(layers, (unsigned)i), mi, (size_t)i,
                       &m->layers[i]) < 0)
            return -1;
    return 0;
}

/* models = ( { ... }, ... ): at least one. n_models is set before the
 * entries are read so cfg_destroy frees partly read ones too. */
int cfg_read_models(struct loader *ld, const config_setting_t *s)
{
    if (!config_setting_is_list(s))
        return cfg_fail_at(ld, s, "models: expected a list of groups ( { name = ...; }, ... ), got %s",
                       cfg_type_words(config_setting_type(s)));
    int n = config_setting_length(s);
    if (n == 0) return cfg_fail_at(ld, s, "models: must list at least one model");
    ld->c->models = calloc((size_t)n, sizeof(*ld->c->models));
    if (!ld->c->models) return cfg_fail_plain(ld, "out of memory");
    ld->c->n_models = (size_t)n;
    for (int i = 0; i < n; i++)
        if (read_model(ld, config_setting_get_elem(s, (unsigned)i), (size_t)i) < 0) return -1;
    return 0;
}

/* genmodel.c - genmodel.h: a generating model's folder loaded for the
 * worker, and prompts made from a job's `prompt` or `messages`.
 *
 * Threads and ownership: as genmodel.h says. */
#include "genmodel.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/utf8.h"
#include "../text/jinja.h"

#define GM_MAX_FILE ((size_t)16 << 20) /* chat_template.jinja, and the JSON files */

static void gm_err(char *errstr, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void gm_err(char *errstr, size_t size, const char *fmt, ...)
{
    if (!errstr || !size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, size, fmt, ap);
    va_end(ap);
    utf8_repair_str(errstr, size);
}

/* dir/name parsed as JSON, or NULL (missing or not JSON: *bad says which). */
static json_t *gm_json(const char *dir, const char *name, int *bad)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    struct stat st;
    *bad = 0;
    if (stat(path, &st) != 0) return NULL;
    json_error_t e;
    json_t *j = (size_t)st.st_size <= GM_MAX_FILE ? json_load_file(path, 0, &e) : NULL;
    if (!j) *bad = 1;
    return j;
}

int genmodel_is_decoder_folder(const char *dir)
{
    int bad;
    json_t *cfg = gm_json(dir, "config.json", &bad);
    const char *mt = cfg ? json_string_value(json_object_get(cfg, "model_type")) : NULL;
    int yes = mt && decoder_model_type_known(mt);
    json_decref(cfg);
    return yes;
}

/* A special token's text: a string, or an object with a string content;
 * "" otherwise. */
static char *gm_token_str(const json_t *v)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    const char *s = json_string_value(v);
    return strdup(s ? s : "");
}

/* The template's source (new, NUL-terminated), NULL with *none set when
 * the folder has none, NULL with errstr filled on an error. */
static char *gm_template_src(const char *dir, const json_t *tc, int *none, char *errstr,
                             size_t errstr_size)
{
    *none = 0;
    const json_t *t = tc ? json_object_get(tc, "chat_template") : NULL;
    if (json_is_string(t)) return strdup(json_string_value(t));
    if (json_is_array(t)) {
        size_t i;
        const json_t *e;
        json_array_foreach(t, i, e) {
            const char *n = json_string_value(json_object_get(e, "name"));
            const char *s = json_string_value(json_object_get(e, "template"));
            if (n && s && strcmp(n, "default") == 0) return strdup(s);
        }
        gm_err(errstr, errstr_size, "%s/tokenizer_config.json: chat_template is a list "
               "without a template named \"default\"", dir);
        return NULL;
    }
    if (t && !json_is_null(t)) {
        gm_err(errstr, errstr_size, "%s/tokenizer_config.json: chat_template is neither a "
               "string nor a list of {name, template}", dir);
        return NULL;
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        *none = 1;
        return NULL;
    }
    char *buf = malloc(GM_MAX_FILE + 1);
    size_t n = buf ? fread(buf, 1, GM_MAX_FILE + 1, f) : 0;
    fclose(f);
    if (!buf || n > GM_MAX_FILE) {
        free(buf);
        gm_err(errstr, errstr_size, "%s: %s", path, buf ? "over 16 MiB" : "out of memory");
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* Which ids the tokenizer's post-processor adds around a text: "" gives
 * them all, "a" splits them into before and after. */
static int gm_affixes(struct genmodel *g, char *errstr, size_t errstr_size)
{
    struct tokenizer_scratch *s = tokenizer_scratch_new(64);
    int32_t e[2 * GENMODEL_MAX_AFFIX + 8], a[2 * GENMODEL_MAX_AFFIX + 8];
    int ne = s ? tokenizer_encode(g->tok, s, "", 0, NULL, 0, 0, 0, e, NULL, 16, NULL, NULL, 0)
               : -1;
    int na = s ? tokenizer_encode(g->tok, s, "a", 1, NULL, 0, 0, 0, a, NULL, 16, NULL, NULL, 0)
               : -1;
    tokenizer_scratch_destroy(s);
    if (ne < 0 || na <= ne || ne > 2 * GENMODEL_MAX_AFFIX) {
        gm_err(errstr, errstr_size, "model %s: cannot tell the special tokens its tokenizer "
               "adds", g->name);
        return -1;
    }
    for (int i = ne; i >= 0; i--) { /* the longest prefix that fits both */
        if (i > GENMODEL_MAX_AFFIX || ne - i > GENMODEL_MAX_AFFIX) continue;
        if (memcmp(e, a, (size_t)i * sizeof(*e)) != 0) continue;
        if (memcmp(e + i, a + na - (ne - i), (size_t)(ne - i) * sizeof(*e)) != 0) continue;
        g->n_prefix = (size_t)i;
        g->n_suffix = (size_t)(ne - i);
        return 0;
    }
    gm_err(errstr, errstr_size, "model %s: cannot tell the special tokens its tokenizer adds",
           g->name);
    return -1;
}

/* The sample conversation every template must render at load. */
static int gm_check_template(struct genmodel *g, char *errstr, size_t errstr_size)
{
    static const struct genmodel_msg sample[] = {
        {"system", "You are a helpful assistant.", 28},
        {"user", "Hello!", 6},
        {"assistant", "Hi. How can I help?", 19},
        {"user", "Say something.", 14},
    };
    struct tokenizer_scratch *s = tokenizer_scratch_new(256);
    int32_t *ids = NULL;
    size_t n = 0;
    char why[512];
    int rc = s ? genmodel_encode_messages(g, s, sample, 4, 1 << 20, &ids, &n, why, sizeof(why))
               : -2;
    tokenizer_scratch_destroy(s);
    free(ids);
    if (rc == 0) return 0;
    gm_err(errstr, errstr_size, "model %s: the chat template cannot render a sample "
           "conversation: %s", g->name, rc == -2 ? "out of memory" : why);
    return -1;
}

struct genmodel *genmodel_load(struct model_runtime *rt, const struct model_spec *spec,
                               char *errstr, size_t errstr_size)
{
    struct genmodel *g = calloc(1, sizeof(*g));
    if (!g) {
        gm_err(errstr, errstr_size, "model %s: out of memory", spec->name);
        return NULL;
    }
    snprintf(g->name, sizeof(g->name), "%s", spec->name);
    char err[1024];
    json_t *tc = NULL, *gc = NULL;
    char *src = NULL;
    if (!(g->dec = decoder_load(rt, spec, errstr, errstr_size))) goto fail;
    if (!(g->tok = tokenizer_load(spec->path, NULL, err, sizeof(err)))) {
        gm_err(errstr, errstr_size, "model %s: %s", spec->name, err);
        goto fail;
    }
    if (tokenizer_vocab_size(g->tok) > decoder_info(g->dec)->vocab) {
        gm_err(errstr, errstr_size, "model %s: the tokenizer has %zu ids, the model %zu",
               spec->name, tokenizer_vocab_size(g->tok), decoder_info(g->dec)->vocab);
        goto fail;
    }
    for (size_t i = 0, n = tokenizer_vocab_size(g->tok); i < n; i++) {
        const char *t = tokenizer_id_token(g->tok, (int32_t)i);
        size_t len = t ? strlen(t) : 0;
        if (len > g->longest_token) g->longest_token = len;
    }
    int bad;
    tc = gm_json(spec->path, "tokenizer_config.json", &bad);
    if (bad) {
        gm_err(errstr, errstr_size, "model %s: %s/tokenizer_config.json is not JSON",
               spec->name, spec->path);
        goto fail;
    }
    g->bos_token = gm_token_str(tc ? json_object_get(tc, "bos_token") : NULL);
    g->eos_token = gm_token_str(tc ? json_object_get(tc, "eos_token") : NULL);
    if (!g->bos_token || !g->eos_token) goto oom;
    gc = gm_json(spec->path, "generation_config.json", &bad);
    g->default_temperature = 1.0f;
    const json_t *tv = gc ? json_object_get(gc, "temperature") : NULL;
    if (json_is_number(tv) && json_number_value(tv) >= 0 && isfinite(json_number_value(tv)))
        g->default_temperature = (float)json_number_value(tv);
    if (gc && json_is_false(json_object_get(gc, "do_sample"))) g->default_temperature = 0.0f;
    if (gm_affixes(g, errstr, errstr_size) < 0) goto fail;
    int none = 0;
    src = gm_template_src(spec->path, tc, &none, errstr, errstr_size);
    if (!src && !none) goto fail;
    if (src) {
        if (!(g->tmpl = jinja_parse(src, strlen(src), err, sizeof(err)))) {
            gm_err(errstr, errstr_size, "model %s: the chat template does not parse: %s",
                   spec->name, err);
            goto fail;
        }
        if (gm_check_template(g, errstr, errstr_size) < 0) goto fail;
    }
    free(src);
    json_decref(tc);
    json_decref(gc);
    return g;
oom:
    gm_err(errstr, errstr_size, "model %s: out of memory", spec->name);
fail:
    free(src);
    json_decref(tc);
    json_decref(gc);
    genmodel_destroy(g);
    return NULL;
}

void genmodel_destroy(struct genmodel *g)
{
    if (!g) return;
    jinja_destroy(g->tmpl);
    tokenizer_destroy(g->tok);
    decoder_destroy(g->dec);
    free(g->bos_token);
    free(g->eos_token);
    free(g);
}

/* Encodes text with the specials, then takes off strip_pre / strip_suf
 * ids (the post-processor's), into a new array. */
static int gm_encode(const struct genmodel *g, struct tokenizer_scratch *s, const char *text,
                     size_t len, size_t strip_pre, size_t strip_suf, size_t cap, int32_t **ids,
                     size_t *n_ids, char *why, size_t why_size)
{
    size_t room = cap + strip_pre + strip_suf + 1;
    int32_t *buf = malloc(room * sizeof(*buf));
    if (!buf) return -2;
    char err[256];
    int n = tokenizer_encode(g->tok, s, text, len, NULL, 0, 0, 0, buf, NULL, room, NULL, err,
                             sizeof(err));
    if (n == TOKENIZER_ERR_NOMEM) {
        free(buf);
        return -2;
    }
    if (n == TOKENIZER_ERR_CAP || (n >= 0 && (size_t)n - strip_pre - strip_suf > cap)) {
        free(buf);
        gm_err(why, why_size, "the prompt is over %zu tokens", cap);
        return -1;
    }
    if (n < 0) {
        free(buf);
        gm_err(why, why_size, "%s", n == TOKENIZER_ERR_UTF8 ? "the text is not valid UTF-8" : err);
        return -1;
    }
    size_t m = (size_t)n >= strip_pre + strip_suf ? (size_t)n - strip_pre - strip_suf : 0;
    if (m == 0) {
        free(buf);
        gm_err(why, why_size, "the prompt has no tokens");
        return -1;
    }
    memmove(buf, buf + strip_pre, m * sizeof(*buf));
    *ids = buf;
    *n_ids = m;
    return 0;
}

int genmodel_encode_prompt(const struct genmodel *g, struct tokenizer_scratch *s, const char *text,
                           size_t len, size_t cap, int32_t **ids, size_t *n_ids, char *why,
                           size_t why_size)
{
    return gm_encode(g, s, text, len, 0, 0, cap, ids, n_ids, why, why_size);
}

int genmodel_encode_messages(const struct genmodel *g, struct tokenizer_scratch *s,
                             const struct genmodel_msg *msgs, size_t n, size_t cap,
                             int32_t **ids, size_t *n_ids, char *why, size_t why_size)
{
    if (!g->tmpl) {
        gm_err(why, why_size, "model %s has no chat template: send `prompt` instead of "
               "`messages`", g->name);
        return -1;
    }
    json_t *arr = json_array(), *ctx = json_object();
    int bad = !arr || !ctx;
    for (size_t i = 0; i < n && !bad; i++) {
        json_t *c = json_stringn_nocheck(msgs[i].content, msgs[i].content_len);
        bad = !c || json_array_append_new(arr, json_pack("{s:s, s:o}", "role", msgs[i].role,
                                                         "content", c)) != 0;
    }
    if (!bad)
        bad = json_object_set_new(ctx, "messages", arr) != 0 ||
              json_object_set_new(ctx, "add_generation_prompt", json_true()) != 0 ||
              json_object_set_new(ctx, "bos_token", json_string(g->bos_token)) != 0 ||
              json_object_set_new(ctx, "eos_token", json_string(g->eos_token)) != 0;
    else json_decref(arr);
    if (bad) {
        json_decref(ctx);
        return -2;
    }
    struct jinja_limits lim;
    jinja_limits_init(&lim);
    /* A rendered prompt past 16 bytes a token could never fit. */
    if (cap < lim.max_output / 16) lim.max_output = 16 * cap + 4096;
    char *text = NULL, err[512];
    size_t len = 0;
    int rc = jinja_render(g->tmpl, ctx, &lim, &text, &len, err, sizeof(err));
    json_decref(ctx);
    if (rc == JINJA_ERR_NOMEM) return -2;
    if (rc != 0) {
        gm_err(why, why_size, "the chat template %s: %s",
               rc == JINJA_ERR_RAISED ? "refused the messages" : "failed", err);
        return -1;
    }
    rc = gm_encode(g, s, text, len, g->n_prefix, g->n_suffix, cap, ids, n_ids, why, why_size);
    free(text);
    return rc;
}

/* folder.c - reads a Hugging Face model folder's files other than the
 * tensors (folder.h); gpu/demo.c writes the demo ones.
 *
 * Threads: the main thread at start-up. Ownership: as folder.h says. */
#include "folder.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../text/tokenizer.h"

__attribute__((format(printf, 4, 5)))
static int folder_fail(const struct model_spec *spec, char *err, size_t n, const char *fmt, ...)
{
    if (!err || !n) return -1;
    int k = snprintf(err, n, "model %s: ", spec->name);
    if (k >= 0 && (size_t)k < n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + k, n - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int folder_path(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static int folder_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A JSON object file of the folder: NULL and *absent = 1 when there is
 * none (if absent is NULL, that is an error too); NULL with the error set
 * when it does not parse. */
static json_t *folder_json(const struct model_spec *spec, const char *name, int *absent,
                           char *err, size_t n)
{
    char path[4200];
    if (absent) *absent = 0;
    if (folder_path(path, sizeof(path), spec->path, name) < 0) {
        folder_fail(spec, err, n, "%s/%s: path too long", spec->path, name);
        return NULL;
    }
    if (!folder_exists(path)) {
        if (absent) *absent = 1;
        else folder_fail(spec, err, n, "%s: no such file", path);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) folder_fail(spec, err, n, "%s:%d: %s", path, je.line, je.text);
    else if (!json_is_object(j)) {
        folder_fail(spec, err, n, "%s: not a JSON object", path);
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* The folder's tokenizer as text/tokenizer.h reads it, with the entry's
 * lowercase override. */
static int folder_tokenizer(const struct model_spec *spec, struct folder *f, char *err,
                            size_t n)
{
    char why[512];
    struct tokenizer_opts o;
    tokenizer_opts_init(&o);
    o.lowercase = spec->enc.lowercase;
    if (!(f->tok = tokenizer_load(spec->path, &o, why, sizeof(why))))
        return folder_fail(spec, err, n, "%s", why);
    f->tok_max = tokenizer_max_tokens(f->tok);
    f->tok_vocab = tokenizer_vocab_size(f->tok);
    return 0;
}

int folder_open(const struct model_spec *spec, struct folder *f, char *errstr,
                size_t errstr_size)
{
    memset(f, 0, sizeof(*f));
    char why[512];
    if (!(f->config = folder_json(spec, "config.json", NULL, errstr, errstr_size))) goto fail;
    f->model_type = json_string_value(json_object_get(f->config, "model_type"));
    if (!f->model_type) f->model_type = "";
    if (head_conf_read(spec->path, f->config, &spec->enc, &f->head, why, sizeof(why)) < 0) {
        folder_fail(spec, errstr, errstr_size, "%s", why);
        goto fail;
    }
    if (folder_tokenizer(spec, f, errstr, errstr_size) < 0) goto fail;
    int absent = 0;
    json_t *sb = folder_json(spec, "sentence_bert_config.json", &absent, errstr, errstr_size);
    if (sb) {
        const json_t *v = json_object_get(sb, "max_seq_length");
        if (json_is_integer(v) && json_integer_value(v) > 0)
            f->st_max = (size_t)json_integer_value(v);
        json_decref(sb);
    } else if (!absent) {
        goto fail;
    }
    char path[4200], sterr[512];
    if (folder_path(path, sizeof(path), spec->path, "model.safetensors") < 0) {
        folder_fail(spec, errstr, errstr_size, "path too long");
        goto fail;
    }
    if (!folder_exists(path)) {
        folder_fail(spec, errstr, errstr_size,
                    "%s: no such file (only safetensors weights are read)", path);
        goto fail;
    }
    if (!(f->file = st_open(path, sterr, sizeof(sterr)))) {
        folder_fail(spec, errstr, errstr_size, "%s", sterr);
        goto fail;
    }
    return 0;
fail:
    folder_close(f);
    return -1;
}

void folder_close(struct folder *f)
{
    st_close(f->file);
    f->file = NULL;
    tokenizer_destroy(f->tok);
    f->tok = NULL;
    json_decref(f->config);
    f->config = NULL;
}

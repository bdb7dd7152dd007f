/* tokenizer.c - the tokenizer interface (tokenizer.h): reads a folder,
 * picks the implementation from tokenizer.json's model.type (or the plain
 * file a folder without one has), and calls through that
 * implementation's table (tokenizer_impl.h).
 *
 * Threads: tokenizer_load on whichever thread calls it; the rest as
 * tokenizer.h says. Ownership: a tokenizer owns its implementation's
 * model; a scratch owns one work area per implementation. */
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer_impl.h"
#include "unicode.h"

/* Every implementation, in the order a plain-file folder is tried. */
static const struct tokenizer_impl *const tok_impls[] = {
    &wp_tokenizer_impl,
    &bpe_tokenizer_impl,
    &ug_tokenizer_impl,
};
#define TOK_N_IMPLS (sizeof(tok_impls) / sizeof(tok_impls[0]))

struct tokenizer {
    const struct tokenizer_impl *impl;
    size_t which;       /* impl's index in tok_impls: its scratch's slot */
    void *model;        /* the implementation's, owned */
    size_t max_tokens;  /* the override, else the folder's model_max_length */
};

struct tokenizer_scratch {
    void *s[TOK_N_IMPLS]; /* each implementation's work area */
};

/* Formats into the caller's error buffer (NULL or 0: nothing). */
static void tok_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tok_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || errstr_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* See tokenizer_impl.h: one reader, so every implementation refuses the
 * same files the same way. */
char *tokenizer_read_file(const char *path, size_t *len, char *errstr, size_t errstr_size)
{
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tok_seterr(errstr, errstr_size, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        tok_seterr(errstr, errstr_size, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        tok_seterr(errstr, errstr_size, "%s: not a regular file", path);
        goto fail;
    }
    if ((unsigned long long)st.st_size > TOKENIZER_MAX_FILE_BYTES) {
        tok_seterr(errstr, errstr_size, "%s: file is %lld bytes, over the %zu-byte limit", path,
                  (long long)st.st_size, TOKENIZER_MAX_FILE_BYTES);
        goto fail;
    }
    size_t size = (size_t)st.st_size, got = 0;
    buf = malloc(size + 1);
    if (!buf) {
        tok_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            tok_seterr(errstr, errstr_size, "%s: %s", path,
                      r < 0 ? strerror(errno) : "file shrank while being read");
            goto fail;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[size] = '\0';
    *len = size;
    return buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

int tokenizer_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

void tokenizer_opts_init(struct tokenizer_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->lowercase = -1;
}

/* The implementation tokenizer.json names, or an error naming the type
 * when none reads it. */
static const struct tokenizer_impl *tok_by_type(const json_t *root, const char *path,
                                                size_t *which, char *errstr,
                                                size_t errstr_size)
{
    const json_t *model = json_object_get(root, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type) {
        tok_seterr(errstr, errstr_size, "%s: model.type is missing", path);
        return NULL;
    }
    for (size_t i = 0; i < TOK_N_IMPLS; i++) {
        if (strcmp(tok_impls[i]->name, type) == 0) {
            *which = i;
            return tok_impls[i];
        }
    }
    char names[256] = "";
    for (size_t i = 0, o = 0; i < TOK_N_IMPLS && o < sizeof(names); i++) {
        int k = snprintf(names + o, sizeof(names) - o, "%s%s", i ? ", " : "", tok_impls[i]->name);
        if (k < 0) break;
        o += (size_t)k;
    }
    tok_seterr(errstr, errstr_size, "%s: model type \"%.64s\" is not supported (supported: %s)",
               path, type, names);
    return NULL;
}

/* tokenizer.json first; without it, the first implementation whose plain
 * file the folder has. */
struct tokenizer *tokenizer_load(const char *dir, const struct tokenizer_opts *o, char *errstr,
                                 size_t errstr_size)
{
    struct tokenizer_opts opts;
    tokenizer_opts_init(&opts);
    if (o) opts = *o;
    struct tokenizer *t = NULL;
    json_t *root = NULL;
    char *buf = NULL;
    char path[4200];
    if (snprintf(path, sizeof(path), "%s/tokenizer.json", dir) >= (int)sizeof(path)) {
        tok_seterr(errstr, errstr_size, "%s: path too long", dir);
        return NULL;
    }
    const struct tokenizer_impl *impl = NULL;
    size_t which = 0;
    if (tokenizer_file_exists(path)) {
        size_t len;
        if (!(buf = tokenizer_read_file(path, &len, errstr, errstr_size))) goto fail;
        json_error_t jerr;
        root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!root) {
            tok_seterr(errstr, errstr_size, "%s: line %d column %d: %s", path, jerr.line,
                       jerr.column, jerr.text);
            goto fail;
        }
        if (!json_is_object(root)) {
            tok_seterr(errstr, errstr_size, "%s: not a JSON object", path);
            goto fail;
        }
        if (!(impl = tok_by_type(root, path, &which, errstr, errstr_size))) goto fail;
    } else {
        char plain[4200];
        for (size_t i = 0; i < TOK_N_IMPLS && !impl; i++) {
            if (!tok_impls[i]->plain_file) continue;
            snprintf(plain, sizeof(plain), "%s/%s", dir, tok_impls[i]->plain_file);
            if (tokenizer_file_exists(plain)) {
                impl = tok_impls[i];
                which = i;
            }
        }
        if (!impl) {
            char names[256] = "";
            for (size_t i = 0, at = 0; i < TOK_N_IMPLS && at < sizeof(names); i++) {
                if (!tok_impls[i]->plain_file) continue;
                int k = snprintf(names + at, sizeof(names) - at, "%s%s", at ? ", " : "",
                                 tok_impls[i]->plain_file);
                if (k < 0) break;
                at += (size_t)k;
            }
            tok_seterr(errstr, errstr_size, "%s: no tokenizer.json in the folder (nor %s)", dir,
                       names);
            goto fail;
        }
    }
    if (!(t = calloc(1, sizeof(*t)))) {
        tok_seterr(errstr, errstr_size, "%s: out of memory", dir);
        goto fail;
    }
    t->impl = impl;
    t->which = which;
    struct tokenizer_src src = {.dir = dir, .json = root, .json_path = root ? path : NULL,
                                .opts = &opts};
    size_t folder_max = 0;
    if (!(t->model = impl->load(&src, &folder_max, errstr, errstr_size))) goto fail;
    t->max_tokens = opts.max_tokens ? opts.max_tokens : folder_max;
    json_decref(root);
    free(buf);
    return t;
fail:
    tokenizer_destroy(t);
    json_decref(root);
    free(buf);
    return NULL;
}

void tokenizer_destroy(struct tokenizer *t)
{
    if (!t) return;
    if (t->model) t->impl->destroy(t->model);
    free(t);
}

const char *tokenizer_kind_name(const struct tokenizer *t)
{
    return t->impl->name;
}

size_t tokenizer_vocab_size(const struct tokenizer *t)
{
    return t->impl->vocab_size(t->model);
}

size_t tokenizer_max_tokens(const struct tokenizer *t)
{
    return t->max_tokens;
}

const char *tokenizer_id_token(const struct tokenizer *t, int32_t id)
{
    return t->impl->id_token(t->model, id);
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *token)
{
    return t->impl->token_id(t->model, token);
}

int32_t tokenizer_special_id(const struct tokenizer *t, enum tokenizer_special which)
{
    if ((int)which < 0 || which >= TOKENIZER_N_SPECIAL) return -1;
    return t->impl->special_id(t->model, which);
}

/* Every implementation's work area up front, so the scratch serves any
 * tokenizer and the first encode allocates nothing. */
struct tokenizer_scratch *tokenizer_scratch_new(size_t expect_len)
{
    struct tokenizer_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    for (size_t i = 0; i < TOK_N_IMPLS; i++) {
        if (!(s->s[i] = tok_impls[i]->scratch_new(expect_len))) {
            tokenizer_scratch_destroy(s);
            return NULL;
        }
    }
    return s;
}

void tokenizer_scratch_destroy(struct tokenizer_scratch *s)
{
    if (!s) return;
    for (size_t i = 0; i < TOK_N_IMPLS; i++) tok_impls[i]->scratch_destroy(s->s[i]);
    free(s);
}

size_t tokenizer_scratch_bytes(const struct tokenizer_scratch *s)
{
    size_t n = 0;
    for (size_t i = 0; i < TOK_N_IMPLS; i++) n += tok_impls[i]->scratch_bytes(s->s[i]);
    return n;
}

int tokenizer_encode(const struct tokenizer *t, struct tokenizer_scratch *s, const char *text,
                     size_t len, const char *pair, size_t pair_len, size_t max_tokens,
                     int truncate, int32_t *ids, int32_t *type_ids, size_t cap, size_t *full_len,
                     char *errstr, size_t errstr_size)
{
    return t->impl->encode(t->model, s->s[t->which], text, len, pair, pair_len, max_tokens,
                           truncate, ids, type_ids, cap, full_len, errstr, errstr_size);
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, char *buf,
                     size_t cap)
{
    if ((!ids && n) || (!buf && cap)) return TOKENIZER_ERR_ARG;
    return t->impl->decode(t->model, ids, n, buf, cap);
}

int tokenizer_text_blank(const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = uni_utf8_decode(p + i, len - i, &cp);
        if (!k || !uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp))) return 0;
        i += k;
    }
    return 1;
}

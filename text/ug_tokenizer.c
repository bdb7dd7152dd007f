/* ug_tokenizer.c - the Unigram tokenizer behind the tokenizer interface:
 * fills tokenizer_impl.h's table with unigram.h's functions. A folder is
 * read from tokenizer.json (a Unigram has no plain-file form), with
 * tokenizer_config.json's model_max_length when the folder has one; the
 * lowercase override (WordPiece's) is refused rather than ignored.
 *
 * Threads and ownership: as tokenizer.h and unigram.h say. */
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer_impl.h"
#include "unigram.h"

_Static_assert((int)TOKENIZER_ERR_UTF8 == (int)UG_ERR_UTF8 &&
                   (int)TOKENIZER_ERR_TOO_LONG == (int)UG_ERR_TOO_LONG &&
                   (int)TOKENIZER_ERR_ARG == (int)UG_ERR_ARG &&
                   (int)TOKENIZER_ERR_CAP == (int)UG_ERR_CAP &&
                   (int)TOKENIZER_ERR_NOMEM == (int)UG_ERR_NOMEM,
               "ug_err and tokenizer_err must agree: ug_encode's answers pass through");

/* tokenizer_config.json's model_max_length: 0 when absent or the "no
 * limit" placeholder (2^53 or more). Returns 0, or -1 with errstr filled. */
static int ugt_max_len(const char *path, size_t *out, char *errstr, size_t errstr_size)
{
    size_t len;
    char *buf = tokenizer_read_file(path, &len, errstr, errstr_size);
    if (!buf) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    free(buf);
    if (!root) {
        snprintf(errstr, errstr_size, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                 jerr.text);
        return -1;
    }
    const json_t *v = json_object_get(root, "model_max_length");
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v) : 0.0;
    *out = d >= 1.0 && d < 9007199254740992.0 ? (size_t)d : 0;
    json_decref(root);
    return 0;
}

/* The folder rules above. */
static void *ugt_load(const struct tokenizer_src *src, size_t *max_tokens, char *errstr,
                      size_t errstr_size)
{
    char tc[4200];
    *max_tokens = 0;
    if (!src->json) {
        snprintf(errstr, errstr_size, "%s: a Unigram tokenizer needs tokenizer.json", src->dir);
        return NULL;
    }
    if (snprintf(tc, sizeof(tc), "%s/tokenizer_config.json", src->dir) >= (int)sizeof(tc)) {
        snprintf(errstr, errstr_size, "%s: path too long", src->dir);
        return NULL;
    }
    if (src->opts->lowercase >= 0) {
        snprintf(errstr, errstr_size, "%s: the lowercase override is WordPiece's; this folder's "
                 "tokenizer is Unigram (its normalizer decides case)", src->dir);
        return NULL;
    }
    if (tokenizer_file_exists(tc) && ugt_max_len(tc, max_tokens, errstr, errstr_size)) return NULL;
    return ug_from_json(src->json, src->json_path, errstr, errstr_size);
}

static void ugt_destroy(void *model)
{
    ug_destroy(model);
}

static void *ugt_scratch_new(size_t expect_len)
{
    return ug_scratch_new(expect_len);
}

static void ugt_scratch_destroy(void *scratch)
{
    ug_scratch_destroy(scratch);
}

static int ugt_encode(const void *model, void *scratch, const char *text, size_t len,
                      const char *pair, size_t pair_len, size_t max_tokens, int truncate,
                      int32_t *ids, int32_t *type_ids, size_t cap, size_t *full_len, char *errstr,
                      size_t errstr_size)
{
    return ug_encode(model, scratch, text, len, pair, pair_len, max_tokens, truncate, ids,
                     type_ids, cap, full_len, errstr, errstr_size);
}

static int ugt_decode(const void *model, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    return ug_decode(model, ids, n, buf, cap);
}

static size_t ugt_vocab_size(const void *model)
{
    return ug_vocab_size(model);
}

static const char *ugt_id_token(const void *model, int32_t id)
{
    return ug_id_token(model, id);
}

static int32_t ugt_token_id(const void *model, const char *token)
{
    return ug_token_id(model, token);
}

/* XLM-R's specials: <s> opens a sequence (cls/bos), </s> closes it. */
static int32_t ugt_special_id(const void *model, enum tokenizer_special which)
{
    switch (which) {
    case TOKENIZER_CLS: return ug_cls_id(model);
    case TOKENIZER_SEP: return ug_sep_id(model);
    case TOKENIZER_PAD: return ug_pad_id(model);
    case TOKENIZER_UNK: return ug_unk_id(model);
    case TOKENIZER_MASK: return ug_mask_id(model);
    default: return -1;
    }
}

static size_t ugt_scratch_bytes(const void *scratch)
{
    return ug_scratch_bytes(scratch);
}

const struct tokenizer_impl ug_tokenizer_impl = {
    .name = "Unigram",
    .plain_file = NULL,
    .load = ugt_load,
    .destroy = ugt_destroy,
    .scratch_new = ugt_scratch_new,
    .scratch_destroy = ugt_scratch_destroy,
    .scratch_bytes = ugt_scratch_bytes,
    .encode = ugt_encode,
    .decode = ugt_decode,
    .vocab_size = ugt_vocab_size,
    .id_token = ugt_id_token,
    .token_id = ugt_token_id,
    .special_id = ugt_special_id,
};

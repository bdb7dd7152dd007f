/* wp_tokenizer.c - WordPiece behind the tokenizer interface: fills
 * tokenizer_impl.h's table with wordpiece.h's functions, and reads a
 * folder the way kinfer always has: tokenizer.json unless a lowercase
 * override asks for vocab.txt, which is read with tokenizer_config.json's
 * settings; tokenizer_config.json's model_max_length either way.
 *
 * Threads and ownership: as tokenizer.h and wordpiece.h say. */
#include <stdio.h>

#include "tokenizer_impl.h"
#include "wp_impl.h"

_Static_assert((int)TOKENIZER_ERR_UTF8 == (int)WP_ERR_UTF8 &&
                   (int)TOKENIZER_ERR_TOO_LONG == (int)WP_ERR_TOO_LONG &&
                   (int)TOKENIZER_ERR_ARG == (int)WP_ERR_ARG &&
                   (int)TOKENIZER_ERR_CAP == (int)WP_ERR_CAP &&
                   (int)TOKENIZER_ERR_NOMEM == (int)WP_ERR_NOMEM,
               "wp_err and tokenizer_err must agree: wp_encode's answers pass through");

/* The folder rules above. */
static void *wpt_load(const struct tokenizer_src *src, size_t *max_tokens, char *errstr,
                      size_t errstr_size)
{
    char vt[4200], tc[4200];
    if (snprintf(vt, sizeof(vt), "%s/vocab.txt", src->dir) >= (int)sizeof(vt) ||
        snprintf(tc, sizeof(tc), "%s/tokenizer_config.json", src->dir) >= (int)sizeof(tc)) {
        wp_seterr(errstr, errstr_size, "%s: path too long", src->dir);
        return NULL;
    }
    struct wp_conf conf;
    wp_conf_defaults(&conf);
    *max_tokens = 0;
    if (tokenizer_file_exists(tc) &&
        wp_read_config_json(tc, &conf, max_tokens, errstr, errstr_size) < 0)
        return NULL;
    int lc = src->opts->lowercase;
    if (src->json && lc < 0) return wp_from_json(src->json, src->json_path, errstr, errstr_size);
    if (!tokenizer_file_exists(vt)) {
        wp_seterr(errstr, errstr_size, "%s: %s", src->dir,
                  src->json ? "the lowercase override needs vocab.txt in the folder"
                            : "no vocab.txt in the folder");
        return NULL;
    }
    if (lc >= 0) {
        conf.lowercase = lc;
        conf.strip_accents = -1;
    }
    return wp_load_vocab(vt, &conf, errstr, errstr_size);
}

static void wpt_destroy(void *model)
{
    wp_destroy(model);
}

static void *wpt_scratch_new(size_t expect_len)
{
    return wp_scratch_new(expect_len);
}

static void wpt_scratch_destroy(void *scratch)
{
    wp_scratch_destroy(scratch);
}

static size_t wpt_scratch_bytes(const void *scratch)
{
    return wp_scratch_bytes(scratch);
}

static int wpt_encode(const void *model, void *scratch, const char *text, size_t len,
                      const char *pair, size_t pair_len, size_t max_tokens, int truncate,
                      int32_t *ids, int32_t *type_ids, size_t cap, size_t *full_len, char *errstr,
                      size_t errstr_size)
{
    return wp_encode(model, scratch, text, len, pair, pair_len, max_tokens, truncate, ids,
                     type_ids, cap, full_len, errstr, errstr_size);
}

static int wpt_decode(const void *model, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    return wp_decode(model, ids, n, buf, cap);
}

static size_t wpt_vocab_size(const void *model)
{
    return wp_vocab_size(model);
}

static const char *wpt_id_token(const void *model, int32_t id)
{
    return wp_id_token(model, id);
}

static int32_t wpt_token_id(const void *model, const char *token)
{
    return wp_token_id(model, token);
}

/* BERT's specials: [CLS] opens a sequence, [SEP] closes it. */
static int32_t wpt_special_id(const void *model, enum tokenizer_special which)
{
    const struct wp_tokenizer *t = model;
    switch (which) {
    case TOKENIZER_CLS: return t->cls;
    case TOKENIZER_SEP: return t->sep;
    case TOKENIZER_PAD: return t->pad;
    case TOKENIZER_UNK: return t->unk;
    case TOKENIZER_MASK: return t->mask;
    default: return -1;
    }
}

const struct tokenizer_impl wp_tokenizer_impl = {
    .name = "WordPiece",
    .plain_file = "vocab.txt",
    .load = wpt_load,
    .destroy = wpt_destroy,
    .scratch_new = wpt_scratch_new,
    .scratch_destroy = wpt_scratch_destroy,
    .scratch_bytes = wpt_scratch_bytes,
    .encode = wpt_encode,
    .decode = wpt_decode,
    .vocab_size = wpt_vocab_size,
    .id_token = wpt_id_token,
    .token_id = wpt_token_id,
    .special_id = wpt_special_id,
};

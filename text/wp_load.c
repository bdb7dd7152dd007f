/* wp_load.c - the WordPiece loaders (wordpiece.h): vocab.txt,
 * tokenizer.json and tokenizer_config.json, and the tables and
 * special-token trie they build (wp_impl.h). Every component of a file is
 * checked to be BERT's before anything is built, so a file of another kind
 * is refused with a message naming what it has.
 *
 * Threads: whichever thread calls a loader; nothing here is shared.
 * Ownership: a loaded wp_tokenizer owns its token pool, tables and trie;
 * files are read into buffers freed before the loader returns. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"
#include "wp_impl.h"

#define WP_MAX_TOKENS ((size_t)1 << 24) /* ids beyond this: refused */

/* ---- special-token trie ----------------------------------------------------- */

/* Orders ids by their token bytes (a prefix before its extensions), so the
 * trie builder sees each node's tokens as one contiguous range; ctx is the
 * tokenizer (qsort_r, so concurrent loads share nothing). */
static int wp_cmp_tok(const void *x, const void *y, void *ctx)
{
    const struct wp_tokenizer *t = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    size_t la = t->tok_len[a], lb = t->tok_len[b];
    int c = memcmp(t->pool + t->tok_off[a], t->pool + t->tok_off[b], la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb;
}

/* Builds the trie node for the ids in sorted[lo..hi), which share their
 * first depth bytes; returns the node's index. Nodes and edges were sized
 * beforehand (at most one per token byte), so nothing moves while the
 * recursion runs; depth is bounded by WP_SPECIAL_MAX_BYTES. */
static uint32_t wp_trie_build(struct wp_tokenizer *t, const int32_t *sorted, size_t lo, size_t hi,
                              size_t depth, uint32_t *n_nodes, uint32_t *n_edges)
{
    uint32_t me = (*n_nodes)++;
    t->tn[me].id = -1;
    if (lo < hi && t->tok_len[sorted[lo]] == depth) t->tn[me].id = sorted[lo++];
    uint32_t groups = 0;
    for (size_t i = lo; i < hi;) {
        unsigned char b = (unsigned char)t->pool[t->tok_off[sorted[i]] + depth];
        while (i < hi && (unsigned char)t->pool[t->tok_off[sorted[i]] + depth] == b) i++;
        groups++;
    }
    uint32_t edge0 = *n_edges;
    *n_edges += groups;
    t->tn[me].edge0 = edge0;
    t->tn[me].n_edges = groups;
    uint32_t k = 0;
    for (size_t i = lo; i < hi;) {
        size_t j = i;
        unsigned char b = (unsigned char)t->pool[t->tok_off[sorted[i]] + depth];
        while (j < hi && (unsigned char)t->pool[t->tok_off[sorted[j]] + depth] == b) j++;
        uint32_t child = wp_trie_build(t, sorted, i, j, depth + 1, n_nodes, n_edges);
        t->te[edge0 + k].child = child;
        t->te[edge0 + k].byte = b;
        k++;
        i = j;
    }
    return me;
}

/* ---- construction ------------------------------------------------------------ */

/* One token as a loader found it: bytes borrowed from the loader's buffer. */
struct wp_src {
    const char *s;
    size_t n;
};

/* Allocates a tokenizer holding n tokens (src[id], copied) and its lookup
 * table. Returns it, or NULL: *dup_a and *dup_b are then the ids of two equal
 * tokens, or both -1 if memory ran out. */
static struct wp_tokenizer *wp_build(const struct wp_src *src, size_t n, int32_t *dup_a,
                                     int32_t *dup_b)
{
    *dup_a = *dup_b = -1;
    struct wp_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    size_t pool = 0;
    for (size_t i = 0; i < n; i++) pool += src[i].n + 1;
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    t->pool = malloc(pool ? pool : 1);
    t->tok_off = malloc((n ? n : 1) * sizeof(*t->tok_off));
    t->tok_len = malloc((n ? n : 1) * sizeof(*t->tok_len));
    t->slots = malloc(slots * sizeof(*t->slots));
    t->slot_hash = malloc(slots * sizeof(*t->slot_hash));
    t->special = calloc(n ? n : 1, 1);
    if (!t->pool || !t->tok_off || !t->tok_len || !t->slots || !t->slot_hash || !t->special)
        goto fail;
    t->n_ids = n;
    t->slot_mask = slots - 1;
    memset(t->slots, 0xff, slots * sizeof(*t->slots));
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(t->pool + off, src[i].s, src[i].n);
        t->pool[off + src[i].n] = '\0';
        t->tok_off[i] = off;
        t->tok_len[i] = (uint32_t)src[i].n;
        off += src[i].n + 1;
        uint64_t h = wp_hash(src[i].s, src[i].n, WP_FNV_OFFSET);
        int32_t other = wp_lookup(t, h, src[i].s, src[i].n, "", 0);
        if (other >= 0) {
            *dup_a = other;
            *dup_b = (int32_t)i;
            goto fail;
        }
        size_t k = wp_slot(t, h);
        while (t->slots[k] >= 0) k = (k + 1) & t->slot_mask;
        t->slots[k] = (int32_t)i;
        t->slot_hash[k] = h;
        if (src[i].n > t->max_start) t->max_start = src[i].n;
    }
    t->unk = t->cls = t->sep = t->pad = t->mask = -1;
    return t;
fail:
    wp_destroy(t);
    return NULL;
}

/* Settles what depends on the settings: the prefix's hash and the longest
 * prefixed token, used to bound WordPiece's candidate pieces. */
static void wp_set_prefix(struct wp_tokenizer *t)
{
    const char *p = t->conf.prefix;
    t->prefix_len = strlen(p);
    t->prefix_hash = wp_hash(p, t->prefix_len, WP_FNV_OFFSET);
    t->max_cont = 0;
    for (size_t i = 0; i < t->n_ids; i++) {
        size_t n = t->tok_len[i];
        if (n >= t->prefix_len && memcmp(t->pool + t->tok_off[i], p, t->prefix_len) == 0 &&
            n - t->prefix_len > t->max_cont)
            t->max_cont = n - t->prefix_len;
    }
    t->strip = t->conf.strip_accents < 0 ? t->conf.lowercase != 0 : t->conf.strip_accents != 0;
}

/* Builds the special-token trie over ids[0..n) (duplicates allowed, empty
 * tokens skipped). Returns 0, or -1 with errstr filled. */
static int wp_set_specials(struct wp_tokenizer *t, const int32_t *ids, size_t n, const char *path,
                           char *errstr, size_t errstr_size)
{
    int32_t *sorted = malloc((n ? n : 1) * sizeof(*sorted));
    if (!sorted) {
        wp_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    size_t m = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = t->tok_len[ids[i]];
        if (len == 0) continue;
        if (len > WP_SPECIAL_MAX_BYTES) {
            wp_seterr(errstr, errstr_size, "%s: special token of %zu bytes, at most %d supported",
                      path, len, WP_SPECIAL_MAX_BYTES);
            goto fail;
        }
        sorted[m++] = ids[i];
    }
    qsort_r(sorted, m, sizeof(*sorted), wp_cmp_tok, t);
    size_t u = 0;
    for (size_t i = 0; i < m; i++)
        if (u == 0 || sorted[u - 1] != sorted[i]) sorted[u++] = sorted[i];
    if (u > 0) {
        for (size_t i = 0; i < u; i++) {
            unsigned char b0 = (unsigned char)t->pool[t->tok_off[sorted[i]]];
            bytes += t->tok_len[sorted[i]];
            t->first[b0 >> 3] |= (unsigned char)(1u << (b0 & 7));
        }
        t->tn = malloc((bytes + 1) * sizeof(*t->tn));
        t->te = malloc((bytes + 1) * sizeof(*t->te));
        if (!t->tn || !t->te) {
            wp_seterr(errstr, errstr_size, "%s: out of memory", path);
            goto fail;
        }
        uint32_t n_nodes = 0, n_edges = 0;
        wp_trie_build(t, sorted, 0, u, 0, &n_nodes, &n_edges);
    }
    free(sorted);
    return 0;
fail:
    free(sorted);
    return -1;
}

/* Renders a token for an error message: at most 64 bytes of it. */
static int wp_show_len(size_t n)
{
    return n > 64 ? 64 : (int)n;
}

/* Copies a token string into a conf field, refusing one that does not fit. */
static int wp_set_tokstr(char *dst, const char *src, size_t n)
{
    if (n >= WP_TOKEN_MAX) return -1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

/* ---- public: settings and vocab.txt --------------------------------------- */

/* bert-base-uncased's settings: the common case needs no config file. */
void wp_conf_defaults(struct wp_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->lowercase = 1;
    c->strip_accents = -1;
    c->chinese_chars = 1;
    c->clean_text = 1;
    c->max_word_chars = 100;
    strcpy(c->unk_token, "[UNK]");
    strcpy(c->cls_token, "[CLS]");
    strcpy(c->sep_token, "[SEP]");
    strcpy(c->pad_token, "[PAD]");
    strcpy(c->mask_token, "[MASK]");
    strcpy(c->prefix, "##");
}

/* Trailing whitespace of a line is not part of the token (the reference
 * trims each line's end), so this returns where the token ends: after the
 * last non-whitespace character. The line must be valid UTF-8. */
static size_t wp_trim_end(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, end = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = uni_utf8_decode(p + i, n - i, &cp);
        if (!uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp))) end = i + k;
        i += k;
    }
    return end;
}

/* Resolves a conf token string to an id, or fails with a message; an
 * empty string is allowed (id -1) only where optional. */
static int wp_special_id(const struct wp_tokenizer *t, const char *path, const char *what,
                         const char *tok, int optional, int32_t *id, char *errstr,
                         size_t errstr_size)
{
    *id = -1;
    if (!tok[0]) {
        if (optional) return 0;
        wp_seterr(errstr, errstr_size, "%s: no %s given", path, what);
        return -1;
    }
    *id = wp_find(t, tok);
    if (*id < 0) {
        wp_seterr(errstr, errstr_size, "%s: the vocabulary has no %s \"%s\"", path, what, tok);
        return -1;
    }
    return 0;
}

/* vocab.txt: lines are split on '\n' (a final line without one counts, an
 * empty remainder after the last does not), each validated and trimmed,
 * and the line number is the id. */
struct wp_tokenizer *wp_load_vocab(const char *vocab_txt, const struct wp_conf *c, char *errstr,
                                   size_t errstr_size)
{
    size_t len;
    struct wp_src *src = NULL;
    struct wp_tokenizer *t = NULL;
    char *buf = tokenizer_read_file(vocab_txt, &len, errstr, errstr_size);
    if (!buf) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += buf[i] == '\n';
    if (len && buf[len - 1] != '\n') n++;
    if (n == 0) {
        wp_seterr(errstr, errstr_size, "%s: empty vocabulary", vocab_txt);
        goto fail;
    }
    if (n > WP_MAX_TOKENS) {
        wp_seterr(errstr, errstr_size, "%s: %zu tokens, at most %zu supported", vocab_txt, n,
                  WP_MAX_TOKENS);
        goto fail;
    }
    src = malloc(n * sizeof(*src));
    if (!src) {
        wp_seterr(errstr, errstr_size, "%s: out of memory", vocab_txt);
        goto fail;
    }
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        size_t bad = uni_utf8_check(buf + pos, end - pos);
        if (bad != end - pos) {
            wp_seterr(errstr, errstr_size, "%s: line %zu: invalid UTF-8 at byte %zu", vocab_txt,
                      i + 1, bad + 1);
            goto fail;
        }
        if (memchr(buf + pos, '\0', end - pos)) {
            wp_seterr(errstr, errstr_size, "%s: line %zu: token holds a NUL byte", vocab_txt, i + 1);
            goto fail;
        }
        src[i].s = buf + pos;
        src[i].n = wp_trim_end(buf + pos, end - pos);
        pos = end + 1;
    }
    int32_t da, db;
    t = wp_build(src, n, &da, &db);
    if (!t) {
        if (da >= 0)
            wp_seterr(errstr, errstr_size, "%s: line %d: token \"%.*s\" repeats line %d", vocab_txt,
                      db + 1, wp_show_len(src[db].n), src[db].s, da + 1);
        else
            wp_seterr(errstr, errstr_size, "%s: out of memory", vocab_txt);
        goto fail;
    }
    t->conf = *c;
    t->conf.unk_token[WP_TOKEN_MAX - 1] = t->conf.cls_token[WP_TOKEN_MAX - 1] = '\0';
    t->conf.sep_token[WP_TOKEN_MAX - 1] = t->conf.pad_token[WP_TOKEN_MAX - 1] = '\0';
    t->conf.mask_token[WP_TOKEN_MAX - 1] = t->conf.prefix[WP_TOKEN_MAX - 1] = '\0';
    if (wp_special_id(t, vocab_txt, "unk token", t->conf.unk_token, 0, &t->unk, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "cls token", t->conf.cls_token, 0, &t->cls, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "sep token", t->conf.sep_token, 0, &t->sep, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "pad token", t->conf.pad_token, 1, &t->pad, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "mask token", t->conf.mask_token, 1, &t->mask, errstr,
                      errstr_size))
        goto fail;
    wp_set_prefix(t);
    int32_t sp[5] = {t->unk, t->cls, t->sep, t->pad, t->mask};
    int32_t spv[5];
    size_t nsp = 0;
    for (int i = 0; i < 5; i++)
        if (sp[i] >= 0) spv[nsp++] = sp[i];
    if (wp_set_specials(t, spv, nsp, vocab_txt, errstr, errstr_size) != 0) goto fail;
    /* decoded as transformers' BertTokenizerFast decodes: WordPiece with
     * the prefix and cleanup, its five specials left out */
    for (size_t i = 0; i < nsp; i++) t->special[spv[i]] = 1;
    snprintf(t->dec_prefix, sizeof(t->dec_prefix), "%s", t->conf.prefix);
    t->dec_cleanup = 1;
    free(src);
    free(buf);
    return t;
fail:
    wp_destroy(t);
    free(src);
    free(buf);
    return NULL;
}

/* ---- tokenizer.json ------------------------------------------------------------ */

/* Reads an optional bool member: absent leaves *out, anything but a bool
 * fails with a message naming where. */
static int wp_json_bool(const json_t *obj, const char *key, int *out, const char *path,
                        const char *where, char *errstr, size_t errstr_size)
{
    const json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) {
        wp_seterr(errstr, errstr_size, "%s: %s.%s is not true or false", path, where, key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* The "type" string of a component object, or NULL. */
static const char *wp_json_type(const json_t *obj)
{
    return json_string_value(json_object_get(obj, "type"));
}

/* Checks one step of a TemplateProcessing template: {"SpecialToken":
 * {"id": X, "type_id": T}} or {"Sequence": {"id": "A"|"B", "type_id": T}};
 * for a special token, *tok gets its string. */
static int wp_tmpl_item(const json_t *item, const char *kind, const char *seq, json_int_t type_id,
                        const char **tok)
{
    const json_t *o = json_object_get(item, kind);
    if (!json_is_object(o) || json_object_size(item) != 1) return -1;
    const json_t *id = json_object_get(o, "id");
    const json_t *ty = json_object_get(o, "type_id");
    if (!json_is_string(id) || !json_is_integer(ty) || json_integer_value(ty) != type_id) return -1;
    if (seq && strcmp(json_string_value(id), seq) != 0) return -1;
    if (tok) *tok = json_string_value(id);
    return 0;
}

/* Accepts only the BERT template: single [CLS]:0 A:0 [SEP]:0 and pair
 * [CLS]:0 A:0 [SEP]:0 B:1 [SEP]:1, with one id per special token.
 * Returns 0 with the two strings and ids, or -1. */
static int wp_tmpl_bert(const json_t *pp, const char **cls, const char **sep, json_int_t *cls_id,
                        json_int_t *sep_id)
{
    const json_t *single = json_object_get(pp, "single");
    const json_t *pair = json_object_get(pp, "pair");
    const json_t *sp = json_object_get(pp, "special_tokens");
    if (!json_is_array(single) || json_array_size(single) != 3 || !json_is_array(pair) ||
        json_array_size(pair) != 5 || !json_is_object(sp))
        return -1;
    const char *c2, *s2, *s3;
    if (wp_tmpl_item(json_array_get(single, 0), "SpecialToken", NULL, 0, cls) ||
        wp_tmpl_item(json_array_get(single, 1), "Sequence", "A", 0, NULL) ||
        wp_tmpl_item(json_array_get(single, 2), "SpecialToken", NULL, 0, sep) ||
        wp_tmpl_item(json_array_get(pair, 0), "SpecialToken", NULL, 0, &c2) ||
        wp_tmpl_item(json_array_get(pair, 1), "Sequence", "A", 0, NULL) ||
        wp_tmpl_item(json_array_get(pair, 2), "SpecialToken", NULL, 0, &s2) ||
        wp_tmpl_item(json_array_get(pair, 3), "Sequence", "B", 1, NULL) ||
        wp_tmpl_item(json_array_get(pair, 4), "SpecialToken", NULL, 1, &s3))
        return -1;
    if (strcmp(c2, *cls) != 0 || strcmp(s2, *sep) != 0 || strcmp(s3, *sep) != 0) return -1;
    const char *names[2] = {*cls, *sep};
    json_int_t *ids[2] = {cls_id, sep_id};
    for (int i = 0; i < 2; i++) {
        const json_t *e = json_object_get(sp, names[i]);
        const json_t *eid = json_object_get(e, "ids");
        if (!json_is_array(eid) || json_array_size(eid) != 1 ||
            !json_is_integer(json_array_get(eid, 0)))
            return -1;
        *ids[i] = json_integer_value(json_array_get(eid, 0));
    }
    return 0;
}

/* Reads the post-processor's [CLS]/[SEP] strings and ids: BertProcessing's
 * ["[SEP]", 102] pairs, or the BERT-shaped TemplateProcessing. */
static int wp_json_post(const json_t *pp, const char *path, const char **cls, const char **sep,
                        json_int_t *cls_id, json_int_t *sep_id, char *errstr, size_t errstr_size)
{
    const char *type = wp_json_type(pp);
    if (!json_is_object(pp) || !type) {
        wp_seterr(errstr, errstr_size, "%s: post_processor is missing: not a BERT tokenizer", path);
        return -1;
    }
    if (strcmp(type, "BertProcessing") == 0) {
        const char *keys[2] = {"cls", "sep"};
        const char **strs[2] = {cls, sep};
        json_int_t *ids[2] = {cls_id, sep_id};
        for (int i = 0; i < 2; i++) {
            const json_t *a = json_object_get(pp, keys[i]);
            if (!json_is_array(a) || json_array_size(a) != 2 ||
                !json_is_string(json_array_get(a, 0)) || !json_is_integer(json_array_get(a, 1))) {
                wp_seterr(errstr, errstr_size, "%s: post_processor.%s is not [token, id]", path,
                          keys[i]);
                return -1;
            }
            *strs[i] = json_string_value(json_array_get(a, 0));
            *ids[i] = json_integer_value(json_array_get(a, 1));
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        if (wp_tmpl_bert(pp, cls, sep, cls_id, sep_id) != 0) {
            wp_seterr(errstr, errstr_size,
                      "%s: post_processor template is not BERT's "
                      "([CLS]:0 A:0 [SEP]:0, pair ... B:1 [SEP]:1)",
                      path);
            return -1;
        }
        return 0;
    }
    wp_seterr(errstr, errstr_size, "%s: post_processor type \"%s\" is not BERT's", path, type);
    return -1;
}

/* Reads the normalizer into c: only a BertNormalizer, fields defaulting
 * as the reference's do when absent. */
static int wp_json_normalizer(const json_t *nm, const char *path, struct wp_conf *c, char *errstr,
                              size_t errstr_size)
{
    const char *type = wp_json_type(nm);
    if (!json_is_object(nm) || !type || strcmp(type, "BertNormalizer") != 0) {
        wp_seterr(errstr, errstr_size, "%s: normalizer is \"%s\", not BertNormalizer", path,
                  type ? type : "null");
        return -1;
    }
    if (wp_json_bool(nm, "clean_text", &c->clean_text, path, "normalizer", errstr, errstr_size) ||
        wp_json_bool(nm, "handle_chinese_chars", &c->chinese_chars, path, "normalizer", errstr,
                     errstr_size) ||
        wp_json_bool(nm, "lowercase", &c->lowercase, path, "normalizer", errstr, errstr_size))
        return -1;
    const json_t *sa = json_object_get(nm, "strip_accents");
    if (!sa || json_is_null(sa)) {
        c->strip_accents = -1;
    } else if (json_is_boolean(sa)) {
        c->strip_accents = json_is_true(sa);
    } else {
        wp_seterr(errstr, errstr_size, "%s: normalizer.strip_accents is not null, true or false",
                  path);
        return -1;
    }
    return 0;
}

/* Reads model: a WordPiece with its unk token, prefix, word limit and
 * vocab map; fills src[0..n) by id (src sized by the caller to the vocab's
 * member count) and refuses ids outside 0..n-1 or shared. */
static int wp_json_model(const json_t *model, const char *path, struct wp_conf *c,
                         struct wp_src *src, size_t n, char *errstr, size_t errstr_size)
{
    const json_t *v = json_object_get(model, "unk_token");
    if (!json_is_string(v) || wp_set_tokstr(c->unk_token, json_string_value(v),
                                            json_string_length(v)) != 0) {
        wp_seterr(errstr, errstr_size, "%s: model.unk_token is not a string of under %d bytes",
                  path, WP_TOKEN_MAX);
        return -1;
    }
    v = json_object_get(model, "continuing_subword_prefix");
    if (v && (!json_is_string(v) ||
              wp_set_tokstr(c->prefix, json_string_value(v), json_string_length(v)) != 0)) {
        wp_seterr(errstr, errstr_size,
                  "%s: model.continuing_subword_prefix is not a string of under %d bytes", path,
                  WP_TOKEN_MAX);
        return -1;
    }
    v = json_object_get(model, "max_input_chars_per_word");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            wp_seterr(errstr, errstr_size,
                      "%s: model.max_input_chars_per_word is not a non-negative integer", path);
            return -1;
        }
        c->max_word_chars = (size_t)json_integer_value(v);
    }
    const json_t *vocab = json_object_get(model, "vocab");
    const char *key;
    json_t *val;
    for (size_t i = 0; i < n; i++) src[i].s = NULL;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            (unsigned long long)json_integer_value(val) >= n) {
            wp_seterr(errstr, errstr_size,
                      "%s: model.vocab: id of \"%.*s\" is not in 0..%zu (ids must be dense)", path,
                      wp_show_len(strlen(key)), key, n - 1);
            return -1;
        }
        size_t id = (size_t)json_integer_value(val);
        if (src[id].s) {
            wp_seterr(errstr, errstr_size, "%s: model.vocab: \"%.*s\" and \"%.*s\" share id %zu",
                      path, wp_show_len(src[id].n), src[id].s, wp_show_len(strlen(key)), key, id);
            return -1;
        }
        src[id].s = key;
        src[id].n = strlen(key);
    }
    return 0;
}

/* The decoder tokenizer_decode follows: WordPiece's (prefix, cleanup),
 * or none (tokens joined by spaces, as the reference does without one). */
static int wp_json_decoder(const json_t *dec, const char *path, struct wp_tokenizer *t,
                           char *errstr, size_t errstr_size)
{
    t->dec_cleanup = 1;
    snprintf(t->dec_prefix, sizeof(t->dec_prefix), "%s", t->conf.prefix);
    if (!dec || json_is_null(dec)) {
        t->dec_none = 1;
        return 0;
    }
    const char *type = wp_json_type(dec);
    if (!json_is_object(dec) || !type || strcmp(type, "WordPiece") != 0) {
        wp_seterr(errstr, errstr_size, "%s: decoder is \"%s\", not WordPiece", path,
                  type ? type : "not an object");
        return -1;
    }
    const json_t *v = json_object_get(dec, "prefix");
    if (v && (!json_is_string(v) ||
              wp_set_tokstr(t->dec_prefix, json_string_value(v), json_string_length(v)) != 0)) {
        wp_seterr(errstr, errstr_size, "%s: decoder.prefix is not a string of under %d bytes",
                  path, WP_TOKEN_MAX);
        return -1;
    }
    return wp_json_bool(dec, "cleanup", &t->dec_cleanup, path, "decoder", errstr, errstr_size);
}

/* A HF tokenizer.json, read and parsed, then built by wp_from_json. */
struct wp_tokenizer *wp_load_json(const char *tokenizer_json, char *errstr, size_t errstr_size)
{
    size_t len;
    struct wp_tokenizer *t = NULL;
    char *buf = tokenizer_read_file(tokenizer_json, &len, errstr, errstr_size);
    if (!buf) return NULL;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        wp_seterr(errstr, errstr_size, "%s: line %d column %d: %s", tokenizer_json, jerr.line,
                  jerr.column, jerr.text);
    else if (!json_is_object(root))
        wp_seterr(errstr, errstr_size, "%s: not a JSON object", tokenizer_json);
    else
        t = wp_from_json(root, tokenizer_json, errstr, errstr_size);
    json_decref(root);
    free(buf);
    return t;
}

/* Each component is checked to be BERT's before anything is built, so a
 * BPE or SentencePiece file is refused by name. */
struct wp_tokenizer *wp_from_json(const json_t *root, const char *path, char *errstr,
                                  size_t errstr_size)
{
    struct wp_src *src = NULL;
    int32_t *spids = NULL;
    unsigned char *spflag = NULL;
    struct wp_tokenizer *t = NULL;
    struct wp_conf c;
    wp_conf_defaults(&c);
    c.pad_token[0] = c.mask_token[0] = '\0';

    const json_t *model = json_object_get(root, "model");
    const char *mtype = wp_json_type(model);
    if (!json_is_object(model) || !mtype || strcmp(mtype, "WordPiece") != 0) {
        wp_seterr(errstr, errstr_size, "%s: model type is \"%s\", not WordPiece", path,
                  mtype ? mtype : "missing");
        goto fail;
    }
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
        wp_seterr(errstr, errstr_size, "%s: model.vocab is not a non-empty object", path);
        goto fail;
    }
    if (wp_json_normalizer(json_object_get(root, "normalizer"), path, &c, errstr, errstr_size))
        goto fail;
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *ptype = wp_json_type(pre);
    if (!ptype || strcmp(ptype, "BertPreTokenizer") != 0) {
        wp_seterr(errstr, errstr_size, "%s: pre_tokenizer is \"%s\", not BertPreTokenizer", path,
                  ptype ? ptype : "null");
        goto fail;
    }
    const char *cls_s, *sep_s;
    json_int_t cls_id, sep_id;
    if (wp_json_post(json_object_get(root, "post_processor"), path, &cls_s, &sep_s, &cls_id,
                     &sep_id, errstr, errstr_size))
        goto fail;
    if (wp_set_tokstr(c.cls_token, cls_s, strlen(cls_s)) ||
        wp_set_tokstr(c.sep_token, sep_s, strlen(sep_s))) {
        wp_seterr(errstr, errstr_size, "%s: post_processor token of %d bytes or more", path,
                  WP_TOKEN_MAX);
        goto fail;
    }

    /* added tokens: those already in the vocab keep their ids, the others
     * extend the id space densely */
    size_t nv = json_object_size(vocab);
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) {
        wp_seterr(errstr, errstr_size, "%s: added_tokens is not an array", path);
        goto fail;
    }
    size_t na = json_is_array(added) ? json_array_size(added) : 0;
    if (nv + na > WP_MAX_TOKENS) {
        wp_seterr(errstr, errstr_size, "%s: %zu tokens, at most %zu supported", path, nv + na,
                  WP_MAX_TOKENS);
        goto fail;
    }
    src = malloc((nv + na) * sizeof(*src));
    spids = malloc((na + 1) * sizeof(*spids));
    spflag = calloc(na + 1, 1);
    if (!src || !spids || !spflag) {
        wp_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    if (wp_json_model(model, path, &c, src, nv, errstr, errstr_size)) goto fail;
    size_t n = nv;
    for (size_t i = 0; i < na; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *cont = json_object_get(a, "content");
        const json_t *aid = json_object_get(a, "id");
        if (!json_is_object(a) || !json_is_string(cont) || !json_is_integer(aid)) {
            wp_seterr(errstr, errstr_size, "%s: added_tokens[%zu] lacks a string content or an id",
                      path, i);
            goto fail;
        }
        const char *flags[4] = {"normalized", "lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 4; f++) {
            int on = 0;
            if (wp_json_bool(a, flags[f], &on, path, "added_tokens[]", errstr, errstr_size))
                goto fail;
            if (on) {
                wp_seterr(errstr, errstr_size, "%s: added token \"%.*s\": %s=true is not supported",
                          path, wp_show_len(json_string_length(cont)), json_string_value(cont),
                          flags[f]);
                goto fail;
            }
        }
        /* matched as raw text, so it must not be empty or hold a NUL */
        if (json_string_length(cont) == 0 ||
            strlen(json_string_value(cont)) != json_string_length(cont)) {
            wp_seterr(errstr, errstr_size, "%s: added_tokens[%zu]: empty content", path, i);
            goto fail;
        }
        json_int_t id = json_integer_value(aid);
        const char *s = json_string_value(cont);
        size_t sl = json_string_length(cont);
        /* is it a vocab token? (a linear probe of src would be quadratic;
         * the vocab object itself is a hash table) */
        const json_t *vid = json_object_get(vocab, s);
        if (vid) {
            if (json_integer_value(vid) != id) {
                wp_seterr(errstr, errstr_size,
                          "%s: added token \"%.*s\" has id %lld, the vocab says %lld", path,
                          wp_show_len(sl), s, (long long)id, (long long)json_integer_value(vid));
                goto fail;
            }
        } else {
            if (id != (json_int_t)n) {
                wp_seterr(errstr, errstr_size,
                          "%s: added token \"%.*s\" has id %lld, expected %zu (ids must be dense)",
                          path, wp_show_len(sl), s, (long long)id, n);
                goto fail;
            }
            src[n].s = s;
            src[n].n = sl;
            n++;
        }
        spids[i] = (int32_t)id;
        int special = 0;
        if (wp_json_bool(a, "special", &special, path, "added_tokens[]", errstr, errstr_size))
            goto fail;
        spflag[i] = (unsigned char)special;
    }
    int32_t da, db;
    t = wp_build(src, n, &da, &db);
    if (!t) {
        if (da >= 0)
            wp_seterr(errstr, errstr_size, "%s: token \"%.*s\" appears twice (ids %d and %d)", path,
                      wp_show_len(src[db].n), src[db].s, da, db);
        else
            wp_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    t->unk = wp_find(t, c.unk_token);
    if (t->unk < 0 || (size_t)t->unk >= nv) {
        wp_seterr(errstr, errstr_size, "%s: model.vocab has no unk token \"%s\"", path, c.unk_token);
        goto fail;
    }
    t->cls = wp_find(t, c.cls_token);
    t->sep = wp_find(t, c.sep_token);
    if (t->cls < 0 || t->cls != cls_id || t->sep < 0 || t->sep != sep_id) {
        wp_seterr(errstr, errstr_size,
                  "%s: post_processor says %s=%lld and %s=%lld, the vocabulary %d and %d", path,
                  c.cls_token, (long long)cls_id, c.sep_token, (long long)sep_id, t->cls, t->sep);
        goto fail;
    }
    const json_t *padding = json_object_get(root, "padding");
    const json_t *pad_id = json_object_get(padding, "pad_id");
    if (json_is_integer(pad_id)) {
        if (json_integer_value(pad_id) < 0 || (size_t)json_integer_value(pad_id) >= n) {
            wp_seterr(errstr, errstr_size, "%s: padding.pad_id %lld is out of range", path,
                      (long long)json_integer_value(pad_id));
            goto fail;
        }
        t->pad = (int32_t)json_integer_value(pad_id);
    } else {
        t->pad = wp_find(t, "[PAD]");
    }
    t->mask = wp_find(t, "[MASK]");
    if (t->pad >= 0) wp_set_tokstr(c.pad_token, wp_id_token(t, t->pad), t->tok_len[t->pad]);
    if (t->mask >= 0) wp_set_tokstr(c.mask_token, "[MASK]", 6);
    t->conf = c;
    wp_set_prefix(t);
    if (wp_set_specials(t, spids, na, path, errstr, errstr_size) != 0 ||
        wp_json_decoder(json_object_get(root, "decoder"), path, t, errstr, errstr_size) != 0)
        goto fail;
    /* what the reference's decode leaves out: the added tokens marked
     * special */
    for (size_t i = 0; i < na; i++)
        if (spflag[i]) t->special[spids[i]] = 1;
    free(spflag);
    free(spids);
    free(src);
    return t;
fail:
    wp_destroy(t);
    free(spflag);
    free(spids);
    free(src);
    return NULL;
}

/* ---- tokenizer_config.json ---------------------------------------------------- */

/* A special-token entry of tokenizer_config.json: a string, an AddedToken
 * object {"content": ...}, or null (no such token). */
static int wp_cfg_token(const json_t *root, const char *key, char *dst, const char *path,
                        char *errstr, size_t errstr_size)
{
    const json_t *v = json_object_get(root, key);
    if (!v) return 0;
    if (json_is_null(v)) {
        dst[0] = '\0';
        return 0;
    }
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
        wp_set_tokstr(dst, json_string_value(v), json_string_length(v)) != 0) {
        wp_seterr(errstr, errstr_size, "%s: %s is not a token string of under %d bytes", path, key,
                  WP_TOKEN_MAX);
        return -1;
    }
    return 0;
}

/* The settings a folder with vocab.txt and tokenizer_config.json implies,
 * read the way transformers reads them for BertTokenizer(Fast). */
int wp_read_config_json(const char *tokenizer_config_json, struct wp_conf *c,
                        size_t *model_max_length, char *errstr, size_t errstr_size)
{
    const char *path = tokenizer_config_json;
    size_t len;
    int rc = -1;
    json_t *root = NULL;
    char *buf = tokenizer_read_file(path, &len, errstr, errstr_size);
    if (!buf) return -1;
    json_error_t jerr;
    /* integers as reals: transformers writes int(1e30), past any json_int_t */
    root = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) {
        wp_seterr(errstr, errstr_size, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                  jerr.text);
        goto out;
    }
    if (!json_is_object(root)) {
        wp_seterr(errstr, errstr_size, "%s: not a JSON object", path);
        goto out;
    }
    struct wp_conf n = *c;
    if (wp_json_bool(root, "do_lower_case", &n.lowercase, path, "config", errstr, errstr_size) ||
        wp_json_bool(root, "tokenize_chinese_chars", &n.chinese_chars, path, "config", errstr,
                     errstr_size))
        goto out;
    const json_t *sa = json_object_get(root, "strip_accents");
    if (sa) {
        if (json_is_null(sa)) {
            n.strip_accents = -1;
        } else if (json_is_boolean(sa)) {
            n.strip_accents = json_is_true(sa);
        } else {
            wp_seterr(errstr, errstr_size, "%s: strip_accents is not null, true or false", path);
            goto out;
        }
    }
    if (wp_cfg_token(root, "unk_token", n.unk_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "cls_token", n.cls_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "sep_token", n.sep_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "pad_token", n.pad_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "mask_token", n.mask_token, path, errstr, errstr_size))
        goto out;
    size_t mml = 0;
    const json_t *m = json_object_get(root, "model_max_length");
    if (m && !json_is_null(m)) {
        /* transformers writes int(1e30) for "no limit"; anything past
         * 2^53 is that placeholder, not a length */
        double d = json_is_integer(m) ? (double)json_integer_value(m)
                                      : json_is_real(m) ? json_real_value(m) : -1.0;
        if (!json_is_number(m) || d < 0 || (d < 9007199254740992.0 && d != (double)(size_t)d)) {
            wp_seterr(errstr, errstr_size, "%s: model_max_length is not a non-negative integer",
                      path);
            goto out;
        }
        mml = d >= 9007199254740992.0 ? 0 : (size_t)d;
    }
    *c = n;
    if (model_max_length) *model_max_length = mml;
    rc = 0;
out:
    json_decref(root);
    free(buf);
    return rc;
}

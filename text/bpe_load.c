/* bpe_load.c - the BPE loaders (bpe_impl.h): a tokenizer.json
 * whose model.type is "BPE", or, without one, RoBERTa's slow files
 * (vocab.json + merges.txt, with tokenizer_config.json's specials and
 * add_prefix_space). Every component is checked to be one bpe.c runs
 * before anything is built, so anything else (BPE dropout, a
 * continuing_subword_prefix, a BertProcessing) is refused with a message
 * naming it.
 *
 * The normalizer, pre-tokenizer and decoder are read by bpe_comp.c, the
 * added tokens' tries and the templates built by bpe_post.c.
 *
 * Threads: whichever thread calls a loader; nothing here is shared.
 * Ownership: a bpe_tok owns everything it points to; files are read into
 * buffers freed before the loader returns. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"
#include "tokenizer_impl.h"
#include "unicode.h"

#define BPE_MAX_TOKENS ((size_t)1 << 24)

void bpe_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || errstr_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

static int bpe_show(size_t n)
{
    return n > 64 ? 64 : (int)n;
}

void bpe_destroy(struct bpe_tok *t)
{
    if (!t) return;
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->slots);
    free(t->slot_hash);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    for (size_t i = 0; i < t->n_split; i++) pcre2_code_free(t->split[i].re);
    pcre2_code_free(t->bl_re);
    free(t->raw.tn);
    free(t->raw.te);
    free(t->norm.tn);
    free(t->norm.te);
    free(t->aflags);
    free(t->tids);
    bpe_steps_free(t->nstep, t->n_nstep);
    bpe_steps_free(t->dstep, t->n_dstep);
    free(t);
}

/* ---- vocabulary and merges ------------------------------------------------------ */

struct bpe_src {
    const char *s;
    size_t n;
};

/* The token table over src[0..n) (copied). Returns 0, or -1 with errstr
 * filled (a repeated token, out of memory). */
static int bpe_build_vocab(struct bpe_tok *t, const struct bpe_src *src, size_t n,
                           const char *path, char *errstr, size_t errstr_size)
{
    size_t pool = 0, slots = 16;
    for (size_t i = 0; i < n; i++) pool += src[i].n + 1;
    while (slots < 2 * n) slots *= 2;
    t->pool = malloc(pool ? pool : 1);
    t->tok_off = malloc((n ? n : 1) * sizeof(*t->tok_off));
    t->tok_len = malloc((n ? n : 1) * sizeof(*t->tok_len));
    t->slots = malloc(slots * sizeof(*t->slots));
    t->slot_hash = malloc(slots * sizeof(*t->slot_hash));
    t->aflags = calloc(n ? n : 1, 1);
    if (!t->pool || !t->tok_off || !t->tok_len || !t->slots || !t->slot_hash || !t->aflags) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    t->slot_mask = slots - 1;
    memset(t->slots, 0xff, slots * sizeof(*t->slots));
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(t->pool + off, src[i].s, src[i].n);
        t->pool[off + src[i].n] = '\0';
        t->tok_off[i] = off;
        t->tok_len[i] = (uint32_t)src[i].n;
        off += src[i].n + 1;
        t->n_ids = i;
        int32_t other = bpe_find(t, src[i].s, src[i].n);
        if (other >= 0) {
            bpe_seterr(errstr, errstr_size, "%s: token \"%.*s\" appears twice (ids %d and %zu)",
                       path, bpe_show(src[i].n), src[i].s, other, i);
            return -1;
        }
        uint64_t h = bpe_hash(src[i].s, src[i].n, BPE_FNV_OFFSET);
        size_t k = bpe_slot(h, t->slot_mask);
        while (t->slots[k] >= 0) k = (k + 1) & t->slot_mask;
        t->slots[k] = (int32_t)i;
        t->slot_hash[k] = h;
    }
    t->n_ids = n;
    return 0;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes are themselves, the
 * other 68 take U+0100 on, in byte order. */
static void bpe_byte_maps(struct bpe_tok *t)
{
    for (int i = 0; i < 512; i++) t->cp_byte[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        uint32_t cp = keep ? (uint32_t)b : 256u + (uint32_t)k++;
        char u[4];
        size_t n = uni_utf8_encode(cp, u);
        memcpy(t->byte_utf8[b], u, n);
        t->byte_utf8_len[b] = (unsigned char)n;
        t->cp_byte[cp] = (int16_t)b;
        t->byte_id[b] = bpe_find(t, u, n);
    }
}

/* Adds merge number rank: left + right (each n bytes) -> their
 * concatenation, all three in the vocabulary. */
static int bpe_add_merge(struct bpe_tok *t, size_t rank, const char *l, size_t ln, const char *r,
                         size_t rn, char *tmp, const char *path, char *errstr, size_t errstr_size)
{
    int32_t a = bpe_find(t, l, ln), b = bpe_find(t, r, rn);
    memcpy(tmp, l, ln);
    memcpy(tmp + ln, r, rn);
    int32_t c = bpe_find(t, tmp, ln + rn);
    if (a < 0 || b < 0 || c < 0) {
        bpe_seterr(errstr, errstr_size, "%s: merge %zu (\"%.*s\" \"%.*s\"): %s is not in the "
                   "vocabulary", path, rank, bpe_show(ln), l, bpe_show(rn), r,
                   a < 0 ? "the left token" : b < 0 ? "the right token" : "the merged token");
        return -1;
    }
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t i = bpe_slot(h, t->m_mask);
    while (t->mnew[i] >= 0) {
        if (t->mkey[i] == k) return 0; /* a repeat keeps its first (lowest) rank */
        i = (i + 1) & t->m_mask;
    }
    t->mkey[i] = k;
    t->mrank[i] = (uint32_t)rank;
    t->mnew[i] = c;
    t->n_merges++;
    return 0;
}

static int bpe_alloc_merges(struct bpe_tok *t, size_t n, const char *path, char *errstr,
                            size_t errstr_size)
{
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    t->mkey = malloc(slots * sizeof(*t->mkey));
    t->mrank = malloc(slots * sizeof(*t->mrank));
    t->mnew = malloc(slots * sizeof(*t->mnew));
    if (!t->mkey || !t->mrank || !t->mnew) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    memset(t->mnew, 0xff, slots * sizeof(*t->mnew));
    t->m_mask = slots - 1;
    return 0;
}

/* The longest token, for the scratch of bpe_add_merge. */
static size_t bpe_longest(const struct bpe_tok *t)
{
    size_t m = 0;
    for (size_t i = 0; i < t->n_ids; i++)
        if (t->tok_len[i] > m) m = t->tok_len[i];
    return m;
}

/* model options other than vocab and merges. */
static int bpe_json_model_opts(struct bpe_tok *t, const json_t *m, const char *path,
                               char *errstr, size_t errstr_size)
{
    const json_t *dr = json_object_get(m, "dropout");
    if (dr && !json_is_null(dr) && !(json_is_number(dr) && json_number_value(dr) == 0.0)) {
        bpe_seterr(errstr, errstr_size, "%s: model.dropout is set: BPE dropout is not supported",
                   path);
        return -1;
    }
    static const char *const empty[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(m, empty[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
            bpe_seterr(errstr, errstr_size, "%s: model.%s is set: not supported", path, empty[i]);
            return -1;
        }
    }
    if (bpe_json_bool(m, "fuse_unk", &t->fuse_unk, path, "model", errstr, errstr_size) ||
        bpe_json_bool(m, "byte_fallback", &t->byte_fallback, path, "model", errstr,
                      errstr_size) ||
        bpe_json_bool(m, "ignore_merges", &t->ignore_merges, path, "model", errstr, errstr_size))
        return -1;
    const json_t *unk = json_object_get(m, "unk_token");
    t->model_unk = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk) ||
            (t->model_unk = bpe_find(t, json_string_value(unk), json_string_length(unk))) < 0) {
            bpe_seterr(errstr, errstr_size, "%s: model.unk_token is not a token of the vocabulary",
                       path);
            return -1;
        }
    }
    return 0;
}

/* ---- tokenizer_config.json ---------------------------------------------------------- */

/* What bpe reads of tokenizer_config.json: model_max_length, and for the
 * slow files add_prefix_space and the special tokens. */
struct bpe_cfg {
    size_t max_len;
    int add_prefix_space;
    char tok[7][BPE_ADDED_MAX_BYTES + 1]; /* bos eos unk sep pad cls mask; "" none */
    int mask_lstrip;
};

static const char *const bpe_cfg_keys[7] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};

/* dir/name parsed into *root (new; NULL when the folder has no such
 * file), path filled. 0, or -1 with errstr filled. */
static int bpe_cfg_file(const char *dir, const char *name, json_t **root, char *path,
                        size_t path_cap, char *errstr, size_t errstr_size)
{
    *root = NULL;
    if (snprintf(path, path_cap, "%s/%s", dir, name) >= (int)path_cap) {
        bpe_seterr(errstr, errstr_size, "%s: path too long", dir);
        return -1;
    }
    if (!tokenizer_file_exists(path)) return 0;
    size_t len;
    char *buf = tokenizer_read_file(path, &len, errstr, errstr_size);
    if (!buf) return -1;
    json_error_t jerr;
    /* integers as reals: transformers writes int(1e30) for "no limit" */
    *root = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, &jerr);
    free(buf);
    if (!*root || !json_is_object(*root)) {
        bpe_seterr(errstr, errstr_size, "%s: %s", path, *root ? "not a JSON object" : jerr.text);
        json_decref(*root);
        *root = NULL;
        return -1;
    }
    return 0;
}

/* The special tokens root names (a string or {"content": ...}) that c
 * does not have yet. */
static int bpe_cfg_tokens(const json_t *root, const char *path, struct bpe_cfg *c, char *errstr,
                          size_t errstr_size)
{
    for (int i = 0; i < 7; i++) {
        const json_t *v = json_object_get(root, bpe_cfg_keys[i]);
        if (c->tok[i][0] || !v || json_is_null(v)) continue;
        if (json_is_object(v)) {
            if (i == 6) {
                int ls = 0;
                if (bpe_json_bool(v, "lstrip", &ls, path, bpe_cfg_keys[i], errstr, errstr_size))
                    return -1;
                c->mask_lstrip = ls;
            }
            v = json_object_get(v, "content");
        } else if (i == 6) {
            c->mask_lstrip = 1; /* RobertaTokenizer makes <mask> lstrip */
        }
        if (!json_is_string(v) || json_string_length(v) > BPE_ADDED_MAX_BYTES ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            bpe_seterr(errstr, errstr_size, "%s: %s is not a token string of at most %d bytes", path,
                       bpe_cfg_keys[i], BPE_ADDED_MAX_BYTES);
            return -1;
        }
        memcpy(c->tok[i], json_string_value(v), json_string_length(v) + 1);
    }
    return 0;
}

/* Reads dir/tokenizer_config.json into c when the folder has one; with
 * want_tokens, also add_prefix_space and the special tokens, those it
 * lacks from special_tokens_map.json. */
static int bpe_read_cfg(const char *dir, struct bpe_cfg *c, int want_tokens, char *errstr,
                        size_t errstr_size)
{
    memset(c, 0, sizeof(*c));
    char path[4200];
    json_t *root = NULL;
    int rc = -1;
    if (bpe_cfg_file(dir, "tokenizer_config.json", &root, path, sizeof(path), errstr,
                     errstr_size))
        return -1;
    if (root) {
        const json_t *m = json_object_get(root, "model_max_length");
        if (m && !json_is_null(m)) {
            double d = json_is_number(m) ? json_number_value(m) : -1.0;
            if (d < 0 || (d < 9007199254740992.0 && d != (double)(size_t)d)) {
                bpe_seterr(errstr, errstr_size,
                           "%s: model_max_length is not a non-negative integer", path);
                goto out;
            }
            c->max_len = d >= 9007199254740992.0 ? 0 : (size_t)d;
        }
        if (want_tokens &&
            (bpe_json_bool(root, "add_prefix_space", &c->add_prefix_space, path, "config",
                           errstr, errstr_size) ||
             bpe_cfg_tokens(root, path, c, errstr, errstr_size)))
            goto out;
    }
    if (want_tokens) {
        json_decref(root);
        if (bpe_cfg_file(dir, "special_tokens_map.json", &root, path, sizeof(path), errstr,
                         errstr_size) ||
            (root && bpe_cfg_tokens(root, path, c, errstr, errstr_size)))
            goto out;
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* pad and mask by the usual names when nothing says otherwise. */
static void bpe_pad_mask(struct bpe_tok *t, const json_t *root)
{
    const json_t *pid = json_object_get(json_object_get(root, "padding"), "pad_id");
    t->pad = json_is_integer(pid) && json_integer_value(pid) >= 0 &&
                     (size_t)json_integer_value(pid) < t->n_ids
                 ? (int32_t)json_integer_value(pid)
                 : bpe_find(t, "<pad>", 5);
    t->mask = bpe_find(t, "<mask>", 6);
    t->unk = t->model_unk >= 0 ? t->model_unk : bpe_find(t, "<unk>", 5);
}

/* ---- tokenizer.json ---------------------------------------------------------------- */

static struct bpe_tok *bpe_new(void)
{
    struct bpe_tok *t = calloc(1, sizeof(*t));
    if (t) t->model_unk = t->unk = t->cls = t->sep = t->pad = t->mask = -1;
    return t;
}

struct bpe_tok *bpe_from_json(const char *dir, const json_t *root, const char *path,
                              size_t *max_tokens, char *errstr, size_t errstr_size)
{
    struct bpe_src *src = NULL;
    struct bpe_added *ad = NULL;
    char *tmp = NULL;
    struct bpe_tok *t = bpe_new();
    if (!t) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        return NULL;
    }
    struct bpe_cfg cfg;
    if (bpe_read_cfg(dir, &cfg, 0, errstr, errstr_size)) goto fail;
    *max_tokens = cfg.max_len;
    const json_t *model = json_object_get(root, "model");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0 ||
        (merges && !json_is_array(merges))) {
        bpe_seterr(errstr, errstr_size, "%s: model.vocab is not a non-empty object, or "
                   "model.merges not an array", path);
        goto fail;
    }
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) {
        bpe_seterr(errstr, errstr_size, "%s: added_tokens is not an array", path);
        goto fail;
    }
    size_t nv = json_object_size(vocab), na = json_array_size(added);
    if (nv + na > BPE_MAX_TOKENS) {
        bpe_seterr(errstr, errstr_size, "%s: %zu tokens, at most %zu supported", path, nv + na,
                   BPE_MAX_TOKENS);
        goto fail;
    }
    src = calloc(nv + na, sizeof(*src));
    ad = calloc(na + 1, sizeof(*ad));
    if (!src || !ad) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            (size_t)json_integer_value(val) >= nv) {
            bpe_seterr(errstr, errstr_size, "%s: model.vocab: id of \"%.*s\" is not in 0..%zu "
                       "(ids must be dense)", path, bpe_show(strlen(key)), key, nv - 1);
            goto fail;
        }
        size_t id = (size_t)json_integer_value(val);
        if (src[id].s) {
            bpe_seterr(errstr, errstr_size, "%s: model.vocab: \"%.*s\" and \"%.*s\" share id %zu",
                       path, bpe_show(src[id].n), src[id].s, bpe_show(strlen(key)), key, id);
            goto fail;
        }
        src[id].s = key;
        src[id].n = strlen(key);
    }
    /* added tokens: those in the vocab keep their ids, the others extend
     * the id space densely */
    size_t n = nv;
    for (size_t i = 0; i < na; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *cont = json_object_get(a, "content"), *aid = json_object_get(a, "id");
        if (!json_is_object(a) || !json_is_string(cont) || !json_is_integer(aid) ||
            json_string_length(cont) == 0 ||
            strlen(json_string_value(cont)) != json_string_length(cont)) {
            bpe_seterr(errstr, errstr_size, "%s: added_tokens[%zu] lacks a non-empty content or "
                       "an id", path, i);
            goto fail;
        }
        struct bpe_added *x = &ad[i];
        x->s = json_string_value(cont);
        x->n = json_string_length(cont);
        json_int_t id = json_integer_value(aid);
        int sw = 0;
        if (bpe_json_bool(a, "special", &x->special, path, "added_tokens[]", errstr, errstr_size))
            goto fail;
        x->normalized = !x->special; /* the reference's default when the file says nothing */
        if (bpe_json_bool(a, "lstrip", &x->lstrip, path, "added_tokens[]", errstr, errstr_size) ||
            bpe_json_bool(a, "rstrip", &x->rstrip, path, "added_tokens[]", errstr, errstr_size) ||
            bpe_json_bool(a, "normalized", &x->normalized, path, "added_tokens[]", errstr,
                          errstr_size) ||
            bpe_json_bool(a, "single_word", &sw, path, "added_tokens[]", errstr, errstr_size))
            goto fail;
        if (sw) {
            bpe_seterr(errstr, errstr_size, "%s: added token \"%.*s\": single_word=true is not "
                       "supported", path, bpe_show(x->n), x->s);
            goto fail;
        }
        const json_t *vid = json_object_get(vocab, x->s);
        if (vid) {
            if (json_integer_value(vid) != id) {
                bpe_seterr(errstr, errstr_size, "%s: added token \"%.*s\" has id %lld, the vocab "
                           "says %lld", path, bpe_show(x->n), x->s, (long long)id,
                           (long long)json_integer_value(vid));
                goto fail;
            }
        } else if (id >= 0 && (size_t)id < n && src[id].s && src[id].n == x->n &&
                   !memcmp(src[id].s, x->s, x->n)) {
            /* listed twice: the same token again */
        } else {
            if (id != (json_int_t)n) {
                bpe_seterr(errstr, errstr_size, "%s: added token \"%.*s\" has id %lld, expected "
                           "%zu (ids must be dense)", path, bpe_show(x->n), x->s, (long long)id, n);
                goto fail;
            }
            src[n].s = x->s;
            src[n].n = x->n;
            n++;
        }
        x->id = (int32_t)id;
    }
    if (bpe_build_vocab(t, src, n, path, errstr, errstr_size)) goto fail;
    t->n_model = nv;
    bpe_byte_maps(t);
    size_t nm = json_array_size(merges);
    if (bpe_alloc_merges(t, nm, path, errstr, errstr_size)) goto fail;
    if (!(tmp = malloc(2 * bpe_longest(t) + 2))) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    for (size_t r = 0; r < nm; r++) {
        const json_t *m = json_array_get(merges, r);
        const char *l, *rt;
        size_t ln, rn;
        if (json_is_string(m)) {
            l = json_string_value(m);
            const char *sp = strchr(l, ' ');
            if (!sp || strchr(sp + 1, ' ')) goto badmerge;
            ln = (size_t)(sp - l);
            rt = sp + 1;
            rn = strlen(rt);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            l = json_string_value(json_array_get(m, 0));
            ln = json_string_length(json_array_get(m, 0));
            rt = json_string_value(json_array_get(m, 1));
            rn = json_string_length(json_array_get(m, 1));
        } else {
            goto badmerge;
        }
        if (ln + rn > 2 * bpe_longest(t)) goto badmerge;
        if (bpe_add_merge(t, r, l, ln, rt, rn, tmp, path, errstr, errstr_size)) goto fail;
        continue;
    badmerge:
        bpe_seterr(errstr, errstr_size, "%s: model.merges[%zu] is not \"a b\" nor [a, b]", path, r);
        goto fail;
    }
    if (bpe_json_model_opts(t, model, path, errstr, errstr_size) ||
        bpe_json_components(t, root, path, errstr, errstr_size) ||
        bpe_json_post(t, json_object_get(root, "post_processor"), path, errstr, errstr_size) ||
        bpe_set_added(t, ad, na, path, errstr, errstr_size))
        goto fail;
    bpe_cls_sep(t);
    bpe_pad_mask(t, root);
    free(tmp);
    free(src);
    free(ad);
    return t;
fail:
    free(tmp);
    free(src);
    free(ad);
    bpe_destroy(t);
    return NULL;
}

/* ---- vocab.json + merges.txt ------------------------------------------------------- */

/* RoBERTa's (and GPT-2's) slow tokenizer files: vocab.json, merges.txt
 * ("#version" first line optional, "a b" per line), ByteLevel with the
 * GPT-2 regex and tokenizer_config.json's add_prefix_space (default
 * false), the special tokens tokenizer_config.json or
 * special_tokens_map.json names (else RoBERTa's or GPT-2's defaults, by
 * what the vocabulary holds) as special added tokens (mask_token lstrip
 * as RobertaTokenizer makes it), and RobertaProcessing when cls and sep
 * are both named (GPT-2's files name neither: no specials added). */
struct bpe_tok *bpe_from_files(const char *dir, size_t *max_tokens, char *errstr,
                               size_t errstr_size)
{
    char vp[4200], mp[4200];
    char *vbuf = NULL, *mbuf = NULL, *tmp = NULL;
    json_t *vocab = NULL;
    struct bpe_src *src = NULL;
    struct bpe_tok *t = bpe_new();
    if (!t) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", dir);
        return NULL;
    }
    if (snprintf(vp, sizeof(vp), "%s/vocab.json", dir) >= (int)sizeof(vp) ||
        snprintf(mp, sizeof(mp), "%s/merges.txt", dir) >= (int)sizeof(mp)) {
        bpe_seterr(errstr, errstr_size, "%s: path too long", dir);
        goto fail;
    }
    if (!tokenizer_file_exists(vp)) {
        bpe_seterr(errstr, errstr_size, "%s: merges.txt without vocab.json (a BPE folder needs "
                   "tokenizer.json, or vocab.json and merges.txt)", dir);
        goto fail;
    }
    struct bpe_cfg cfg;
    if (bpe_read_cfg(dir, &cfg, 1, errstr, errstr_size)) goto fail;
    *max_tokens = cfg.max_len;
    size_t vlen, mlen;
    if (!(vbuf = tokenizer_read_file(vp, &vlen, errstr, errstr_size)) ||
        !(mbuf = tokenizer_read_file(mp, &mlen, errstr, errstr_size)))
        goto fail;
    json_error_t jerr;
    vocab = json_loadb(vbuf, vlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(vocab) || json_object_size(vocab) == 0 ||
        json_object_size(vocab) > BPE_MAX_TOKENS) {
        bpe_seterr(errstr, errstr_size, "%s: %s", vp,
                   vocab ? "not a non-empty object of at most 2^24 tokens" : jerr.text);
        goto fail;
    }
    size_t nv = json_object_size(vocab);
    if (!(src = calloc(nv + 7, sizeof(*src)))) goto oom;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            (size_t)json_integer_value(val) >= nv || src[json_integer_value(val)].s) {
            bpe_seterr(errstr, errstr_size, "%s: id of \"%.*s\" is not in 0..%zu or repeats "
                       "(ids must be dense)", vp, bpe_show(strlen(key)), key, nv - 1);
            goto fail;
        }
        src[json_integer_value(val)].s = key;
        src[json_integer_value(val)].n = strlen(key);
    }
    /* no file names the specials: RoBERTa's when the vocabulary has <s>
     * and </s>, GPT-2's <|endoftext|> when it has that, as the slow
     * tokenizers' defaults are */
    int named = 0;
    for (int i = 0; i < 7; i++) named |= cfg.tok[i][0] != 0;
    if (!named && json_object_get(vocab, "<s>") && json_object_get(vocab, "</s>")) {
        static const char *const rob[7] = {"<s>", "</s>", "<unk>", "</s>", "<pad>", "<s>",
                                           "<mask>"};
        for (int i = 0; i < 7; i++) snprintf(cfg.tok[i], sizeof(cfg.tok[i]), "%s", rob[i]);
        cfg.mask_lstrip = 1;
    } else if (!named && json_object_get(vocab, "<|endoftext|>")) {
        for (int i = 0; i < 3; i++) snprintf(cfg.tok[i], sizeof(cfg.tok[i]), "<|endoftext|>");
    }
    /* specials missing from vocab.json are added after it, as transformers
     * does */
    size_t n = nv;
    for (int i = 0; i < 7; i++) {
        const char *s = cfg.tok[i];
        size_t sl = strlen(s);
        if (!sl || json_object_get(vocab, s)) continue;
        int dup = 0;
        for (size_t k = nv; k < n; k++) dup |= src[k].n == sl && !memcmp(src[k].s, s, sl);
        if (dup) continue;
        src[n].s = s;
        src[n].n = sl;
        n++;
    }
    if (bpe_build_vocab(t, src, n, vp, errstr, errstr_size)) goto fail;
    t->n_model = nv;
    bpe_byte_maps(t);
    size_t lines = 0;
    for (size_t i = 0; i < mlen; i++) lines += mbuf[i] == '\n';
    if (bpe_alloc_merges(t, lines + 1, mp, errstr, errstr_size)) goto fail;
    if (!(tmp = malloc(mlen + 1))) goto oom;
    size_t pos = 0, rank = 0, line = 0;
    while (pos < mlen) {
        const char *nl = memchr(mbuf + pos, '\n', mlen - pos);
        size_t end = nl ? (size_t)(nl - mbuf) : mlen, e = end;
        line++;
        if (e > pos && mbuf[e - 1] == '\r') e--;
        const char *l = mbuf + pos;
        size_t ll = e - pos;
        pos = end + 1;
        if (ll == 0 || (line == 1 && ll >= 8 && !memcmp(l, "#version", 8))) continue;
        const char *sp = memchr(l, ' ', ll);
        if (!sp || memchr(sp + 1, ' ', ll - (size_t)(sp + 1 - l))) {
            bpe_seterr(errstr, errstr_size, "%s: line %zu is not \"a b\"", mp, line);
            goto fail;
        }
        if (bpe_add_merge(t, rank++, l, (size_t)(sp - l), sp + 1, ll - (size_t)(sp + 1 - l), tmp,
                          mp, errstr, errstr_size))
            goto fail;
    }
    t->add_prefix_space = cfg.add_prefix_space;
    if (bpe_bytelevel_gpt2(t, dir, errstr, errstr_size)) goto fail;
    t->dec_bytelevel = 1;
    struct bpe_added ad[7];
    size_t na = 0;
    for (int i = 0; i < 7; i++) {
        if (!cfg.tok[i][0]) continue;
        ad[na] = (struct bpe_added){.s = cfg.tok[i], .n = strlen(cfg.tok[i]), .special = 1,
                                    .lstrip = i == 6 && cfg.mask_lstrip};
        ad[na].id = bpe_find(t, ad[na].s, ad[na].n);
        na++;
    }
    int32_t cls = cfg.tok[5][0] ? bpe_find(t, cfg.tok[5], strlen(cfg.tok[5])) : -1;
    int32_t sep = cfg.tok[3][0] ? bpe_find(t, cfg.tok[3], strlen(cfg.tok[3])) : -1;
    if ((cls >= 0 && sep >= 0 ? bpe_tmpl_roberta(t, cls, sep) : bpe_tmpl_default(t)) ||
        bpe_set_added(t, ad, na, dir, errstr, errstr_size))
        goto fail;
    bpe_cls_sep(t);
    bpe_pad_mask(t, NULL);
    if (cfg.tok[4][0]) t->pad = bpe_find(t, cfg.tok[4], strlen(cfg.tok[4]));
    if (cfg.tok[6][0]) t->mask = bpe_find(t, cfg.tok[6], strlen(cfg.tok[6]));
    if (cfg.tok[2][0]) t->unk = bpe_find(t, cfg.tok[2], strlen(cfg.tok[2]));
    free(tmp);
    free(src);
    json_decref(vocab);
    free(vbuf);
    free(mbuf);
    return t;
oom:
    bpe_seterr(errstr, errstr_size, "%s: out of memory", dir);
fail:
    free(tmp);
    free(src);
    json_decref(vocab);
    free(vbuf);
    free(mbuf);
    bpe_destroy(t);
    return NULL;
}

/* bpe_post.c - the byte-level BPE tokenizer's added tokens (their tries,
 * matched before the model) and post-processor templates
 * (RobertaProcessing, TemplateProcessing, the default), as bpe_load.c's
 * loaders set them up (bpe_impl.h).
 *
 * Threads: the loading thread. Ownership: what is built belongs to the
 * bpe_tok it is built into. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"
#include "tokenizer_impl.h"
#include "unicode.h"

/* ---- added tokens ---------------------------------------------------------------- */

static int bpe_cmp_tok(const void *x, const void *y, void *ctx)
{
    const struct bpe_tok *t = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    size_t la = t->tok_len[a], lb = t->tok_len[b];
    int c = memcmp(t->pool + t->tok_off[a], t->pool + t->tok_off[b], la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb;
}

static uint32_t bpe_trie_node(const struct bpe_tok *t, struct bpe_trie *tr, const int32_t *s,
                              size_t lo, size_t hi, size_t depth, uint32_t *nn, uint32_t *ne)
{
    uint32_t me = (*nn)++;
    tr->tn[me].id = -1;
    if (lo < hi && t->tok_len[s[lo]] == depth) tr->tn[me].id = s[lo++];
    uint32_t groups = 0;
    for (size_t i = lo; i < hi;) {
        unsigned char b = (unsigned char)t->pool[t->tok_off[s[i]] + depth];
        while (i < hi && (unsigned char)t->pool[t->tok_off[s[i]] + depth] == b) i++;
        groups++;
    }
    uint32_t e0 = *ne;
    *ne += groups;
    tr->tn[me].edge0 = e0;
    tr->tn[me].n_edges = groups;
    uint32_t k = 0;
    for (size_t i = lo; i < hi;) {
        size_t j = i;
        unsigned char b = (unsigned char)t->pool[t->tok_off[s[i]] + depth];
        while (j < hi && (unsigned char)t->pool[t->tok_off[s[j]] + depth] == b) j++;
        uint32_t child = bpe_trie_node(t, tr, s, i, j, depth + 1, nn, ne);
        tr->te[e0 + k].child = child;
        tr->te[e0 + k].byte = b;
        k++;
        i = j;
    }
    return me;
}

/* The trie over ids[0..n) (empty tokens skipped, repeats allowed). */
static int bpe_build_trie(const struct bpe_tok *t, struct bpe_trie *tr, int32_t *ids, size_t n,
                          const char *path, char *errstr, size_t errstr_size)
{
    size_t m = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = t->tok_len[ids[i]];
        if (len == 0) continue;
        if (len > BPE_ADDED_MAX_BYTES) {
            bpe_seterr(errstr, errstr_size, "%s: added token of %zu bytes, at most %d supported",
                       path, len, BPE_ADDED_MAX_BYTES);
            return -1;
        }
        ids[m++] = ids[i];
    }
    if (!m) return 0;
    qsort_r(ids, m, sizeof(*ids), bpe_cmp_tok, (void *)t);
    size_t u = 0;
    for (size_t i = 0; i < m; i++)
        if (u == 0 || ids[u - 1] != ids[i]) ids[u++] = ids[i];
    for (size_t i = 0; i < u; i++) {
        unsigned char b0 = (unsigned char)t->pool[t->tok_off[ids[i]]];
        bytes += t->tok_len[ids[i]];
        tr->first[b0 >> 3] |= (unsigned char)(1u << (b0 & 7));
    }
    tr->tn = malloc((bytes + 1) * sizeof(*tr->tn));
    tr->te = malloc((bytes + 1) * sizeof(*tr->te));
    if (!tr->tn || !tr->te) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    uint32_t nn = 0, ne = 0;
    bpe_trie_node(t, tr, ids, 0, u, 0, &nn, &ne);
    return 0;
}


/* The tries and flags of the added tokens a[0..n). */
int bpe_set_added(struct bpe_tok *t, const struct bpe_added *a, size_t n, const char *path,
                         char *errstr, size_t errstr_size)
{
    int32_t *raw = malloc((n + 1) * sizeof(*raw)), *norm = malloc((n + 1) * sizeof(*norm));
    int rc = -1;
    if (!raw || !norm) {
        bpe_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto out;
    }
    size_t nr = 0, nn = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char f = BPE_A_ADDED;
        if (a[i].special) f |= BPE_A_SPECIAL;
        if (a[i].lstrip) f |= BPE_A_LSTRIP;
        if (a[i].rstrip) f |= BPE_A_RSTRIP;
        t->aflags[a[i].id] = f;
        if (a[i].normalized) norm[nn++] = a[i].id;
        else raw[nr++] = a[i].id;
    }
    if (bpe_build_trie(t, &t->raw, raw, nr, path, errstr, errstr_size) ||
        bpe_build_trie(t, &t->norm, norm, nn, path, errstr, errstr_size))
        goto out;
    rc = 0;
out:
    free(raw);
    free(norm);
    return rc;
}

/* ---- templates ------------------------------------------------------------------ */

/* Appends to tp a sequence item, or a special's ids (ids copied into
 * t->tids). */
static int bpe_tmpl_add(struct bpe_tok *t, struct bpe_template *tp, int seq, const int32_t *ids,
                        size_t n, int32_t type_id)
{
    if (tp->n == BPE_TMPL_MAX) return -1;
    struct bpe_titem *it = &tp->it[tp->n++];
    it->seq = seq;
    it->type_id = type_id;
    it->id0 = (uint32_t)t->n_tids;
    it->n_ids = (uint32_t)n;
    if (n) {
        int32_t *p = realloc(t->tids, (t->n_tids + n) * sizeof(*p));
        if (!p) return -1;
        t->tids = p;
        memcpy(t->tids + t->n_tids, ids, n * sizeof(*ids));
        t->n_tids += n;
        tp->n_special += n;
    }
    return 0;
}

/* RobertaProcessing's layout: <s> A </s>, <s> A </s></s> B </s>, all
 * type id 0 (as the reference gives). */
int bpe_tmpl_roberta(struct bpe_tok *t, int32_t cls, int32_t sep)
{
    return bpe_tmpl_add(t, &t->single, -1, &cls, 1, 0) || bpe_tmpl_add(t, &t->single, 0, NULL, 0, 0) ||
           bpe_tmpl_add(t, &t->single, -1, &sep, 1, 0) ||
           bpe_tmpl_add(t, &t->pair, -1, &cls, 1, 0) || bpe_tmpl_add(t, &t->pair, 0, NULL, 0, 0) ||
           bpe_tmpl_add(t, &t->pair, -1, &sep, 1, 0) || bpe_tmpl_add(t, &t->pair, -1, &sep, 1, 0) ||
           bpe_tmpl_add(t, &t->pair, 1, NULL, 0, 0) || bpe_tmpl_add(t, &t->pair, -1, &sep, 1, 0);
}

/* No post-processor (or ByteLevel's alone): A, and A B with B's type id
 * 1, as the reference's default does. */
int bpe_tmpl_default(struct bpe_tok *t)
{
    return bpe_tmpl_add(t, &t->single, 0, NULL, 0, 0) ||
           bpe_tmpl_add(t, &t->pair, 0, NULL, 0, 0) || bpe_tmpl_add(t, &t->pair, 1, NULL, 0, 1);
}

/* A ["token", id] pair of RobertaProcessing, checked against the
 * vocabulary. */
static int bpe_pp_tok(const struct bpe_tok *t, const json_t *v, int32_t *id, const char *path,
                      const char *key, char *errstr, size_t errstr_size)
{
    const json_t *s = json_array_get(v, 0), *i = json_array_get(v, 1);
    if (!json_is_array(v) || !json_is_string(s) || !json_is_integer(i) ||
        bpe_find(t, json_string_value(s), json_string_length(s)) != json_integer_value(i)) {
        bpe_seterr(errstr, errstr_size, "%s: post_processor.%s is not a [token, id] pair of the "
                   "vocabulary", path, key);
        return -1;
    }
    *id = (int32_t)json_integer_value(i);
    return 0;
}

/* One of TemplateProcessing's single or pair lists. */
static int bpe_tmpl_json(struct bpe_tok *t, struct bpe_template *tp, const json_t *list,
                         const json_t *specials, const char *path, const char *key, char *errstr,
                         size_t errstr_size)
{
    if (!json_is_array(list) || json_array_size(list) > BPE_TMPL_MAX) goto bad;
    size_t i;
    const json_t *item;
    json_array_foreach(list, i, item) {
        const json_t *sq = json_object_get(item, "Sequence");
        const json_t *sp = json_object_get(item, "SpecialToken");
        const json_t *o = sq ? sq : sp;
        const json_t *ty = json_object_get(o, "type_id");
        const char *name = json_string_value(json_object_get(o, "id"));
        if (!json_is_object(o) || !name || !json_is_integer(ty) || json_integer_value(ty) < 0 ||
            json_integer_value(ty) > 255)
            goto bad;
        int32_t type_id = (int32_t)json_integer_value(ty);
        if (sq) {
            int seq = !strcmp(name, "A") ? 0 : !strcmp(name, "B") ? 1 : -1;
            if (seq < 0 || bpe_tmpl_add(t, tp, seq, NULL, 0, type_id)) goto bad;
            continue;
        }
        const json_t *ids = json_object_get(json_object_get(specials, name), "ids");
        size_t n = json_array_size(ids);
        if (!json_is_array(ids) || n == 0 || n > 8) {
            bpe_seterr(errstr, errstr_size, "%s: post_processor.%s: special \"%.64s\" has no ids "
                       "in special_tokens", path, key, name);
            return -1;
        }
        int32_t v[8];
        for (size_t k = 0; k < n; k++) {
            const json_t *x = json_array_get(ids, k);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                (size_t)json_integer_value(x) >= t->n_ids) {
                bpe_seterr(errstr, errstr_size, "%s: post_processor.%s: special \"%.64s\" has an "
                           "id out of range", path, key, name);
                return -1;
            }
            v[k] = (int32_t)json_integer_value(x);
        }
        if (bpe_tmpl_add(t, tp, -1, v, n, type_id)) goto bad;
    }
    return 0;
bad:
    bpe_seterr(errstr, errstr_size, "%s: post_processor.%s is not a template this build reads "
               "(at most %d items of Sequence A/B or SpecialToken)", path, key, BPE_TMPL_MAX);
    return -1;
}

const char *bpe_type(const json_t *o)
{
    return json_string_value(json_object_get(o, "type"));
}

/* The post-processor: RobertaProcessing, TemplateProcessing, ByteLevel,
 * none, or a Sequence of ByteLevel and one of the others. */
int bpe_json_post(struct bpe_tok *t, const json_t *pp, const char *path, char *errstr,
                         size_t errstr_size)
{
    if (!pp || json_is_null(pp)) return bpe_tmpl_default(t);
    const char *type = bpe_type(pp);
    if (type && !strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(pp, "processors"), *x, *main = NULL;
        size_t i;
        if (!json_is_array(list)) goto bad;
        json_array_foreach(list, i, x) {
            const char *ty = bpe_type(x);
            if (ty && !strcmp(ty, "ByteLevel")) continue;
            if (main) goto bad;
            main = x;
        }
        return bpe_json_post(t, main, path, errstr, errstr_size);
    }
    if (type && !strcmp(type, "ByteLevel")) return bpe_tmpl_default(t);
    if (type && !strcmp(type, "RobertaProcessing")) {
        int32_t cls, sep;
        if (bpe_pp_tok(t, json_object_get(pp, "cls"), &cls, path, "cls", errstr, errstr_size) ||
            bpe_pp_tok(t, json_object_get(pp, "sep"), &sep, path, "sep", errstr, errstr_size))
            return -1;
        if (bpe_tmpl_roberta(t, cls, sep)) goto bad;
        return 0;
    }
    if (type && !strcmp(type, "TemplateProcessing")) {
        const json_t *sp = json_object_get(pp, "special_tokens");
        if (bpe_tmpl_json(t, &t->single, json_object_get(pp, "single"), sp, path, "single", errstr,
                          errstr_size) ||
            bpe_tmpl_json(t, &t->pair, json_object_get(pp, "pair"), sp, path, "pair", errstr,
                          errstr_size))
            return -1;
        return 0;
    }
bad:
    bpe_seterr(errstr, errstr_size, "%s: post_processor \"%s\" is not supported (RobertaProcessing, "
               "TemplateProcessing, ByteLevel, a Sequence of those, or none)", path,
               type ? type : "?");
    return -1;
}

/* The interface's cls and sep: the specials around $A in the single
 * template (RoBERTa: <s> and </s>; Llama: its BOS, no sep). */
void bpe_cls_sep(struct bpe_tok *t)
{
    t->cls = t->sep = -1;
    const struct bpe_template *tp = &t->single;
    for (size_t i = 0; i < tp->n; i++) {
        if (tp->it[i].seq != 0) continue;
        if (i > 0 && tp->it[i - 1].seq < 0) t->cls = t->tids[tp->it[i - 1].id0];
        if (i + 1 < tp->n && tp->it[i + 1].seq < 0) t->sep = t->tids[tp->it[i + 1].id0];
    }
}

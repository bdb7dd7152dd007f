/* ug_load.c - reads a Hugging Face tokenizer.json with a Unigram model into
 * a ug_tokenizer (ug_impl.h): the pieces and their scores into a byte trie,
 * the added tokens into a second one, the Precompiled charsmap decoded and
 * checked, and the normalizer, pre-tokenizer, post-processor and decoder
 * into step tables. Anything unigram.h does not list is refused with a
 * message naming the file and the key.
 *
 * Threads: whichever thread loads. Ownership: the tokenizer owns all it
 * builds; the JSON is borrowed for the call. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ug_impl.h"
#include "unicode.h"

/* See ug_impl.h. */
void ug_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || errstr_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* ---- tries ------------------------------------------------------------------ */

/* An entry of a trie under construction. */
struct ug_ent {
    const char *s;
    size_t n;
    int32_t id;
};

/* Byte order, a prefix before its extensions: the trie's build order. */
static int ug_ent_cmp(const void *a, const void *b)
{
    const struct ug_ent *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, m);
    if (c) return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* A span of sorted entries that share their first depth bytes: one node. */
struct ug_qitem {
    size_t lo, hi, depth;
    uint32_t node;
};

/* Makes room for one more node (and its queue entry): the arrays grow by
 * doubling, so a large vocabulary's trie costs what its nodes need. */
static int ug_trie_room(struct ug_trie *trie, struct ug_qitem **q, size_t *cap)
{
    if (trie->nn < *cap) return 0;
    if (*cap > UINT32_MAX / 2) return -1;
    size_t nc = *cap * 2;
    void *a = realloc(trie->n, nc * sizeof(*trie->n));
    if (!a) return -1;
    trie->n = a;
    void *b = realloc(trie->e, nc * sizeof(*trie->e));
    if (!b) return -1;
    trie->e = b;
    void *c = realloc(*q, nc * sizeof(**q));
    if (!c) return -1;
    *q = c;
    *cap = nc;
    return 0;
}

/* Builds trie from ent (n entries, sorted here) breadth first, without
 * recursion, so a hostile piece of any length cannot exhaust the stack.
 * A node's queue entry has the node's index. Returns 0, -1 when out of
 * memory, or -2 with *dup set for an entry that repeats. */
static int ug_trie_build(struct ug_trie *trie, struct ug_ent *ent, size_t n, size_t *dup)
{
    qsort(ent, n, sizeof(*ent), ug_ent_cmp);
    size_t cap = 1024;
    struct ug_qitem *q = malloc(cap * sizeof(*q));
    trie->n = malloc(cap * sizeof(*trie->n));
    trie->e = malloc(cap * sizeof(*trie->e));
    if (!q || !trie->n || !trie->e) {
        free(q);
        return -1;
    }
    size_t qi = 0;
    trie->nn = 1;
    trie->ne = 0;
    q[0] = (struct ug_qitem){0, n, 0, 0};
    while (qi < trie->nn) {
        struct ug_qitem it = q[qi++];
        trie->n[it.node].id = -1;
        size_t lo = it.lo;
        if (lo < it.hi && ent[lo].n == it.depth) {
            trie->n[it.node].id = ent[lo].id;
            lo++;
            if (lo < it.hi && ent[lo].n == it.depth) {
                *dup = lo;
                free(q);
                return -2;
            }
        }
        trie->n[it.node].edge0 = (uint32_t)trie->ne;
        trie->n[it.node].n_edges = 0;
        for (size_t i = lo; i < it.hi;) {
            unsigned char b = (unsigned char)ent[i].s[it.depth];
            size_t j = i + 1;
            while (j < it.hi && (unsigned char)ent[j].s[it.depth] == b) j++;
            if (ug_trie_room(trie, &q, &cap)) {
                free(q);
                return -1;
            }
            uint32_t child = (uint32_t)trie->nn++;
            trie->e[trie->ne].byte = b;
            trie->e[trie->ne].child = child;
            trie->ne++;
            trie->n[it.node].n_edges++;
            q[child] = (struct ug_qitem){i, j, it.depth + 1, child};
            i = j;
        }
    }
    free(q);
    void *p = realloc(trie->n, trie->nn * sizeof(*trie->n));
    if (p) trie->n = p;
    if (trie->ne) {
        p = realloc(trie->e, trie->ne * sizeof(*trie->e));
        if (p) trie->e = p;
    }
    return 0;
}

/* See ug_impl.h. */
int32_t ug_trie_find(const struct ug_trie *trie, const char *s, size_t n)
{
    if (!trie->nn) return -1;
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c = ug_trie_step(trie, node, (unsigned char)s[i]);
        if (c < 0) return -1;
        node = (uint32_t)c;
    }
    return trie->n[node].id;
}

/* ---- small readers ------------------------------------------------------------ */

static const char *ug_type(const json_t *o)
{
    return json_string_value(json_object_get(o, "type"));
}

/* A boolean member, or dflt when absent; -1 for another type. */
static int ug_bool(const json_t *o, const char *key, int dflt)
{
    const json_t *v = json_object_get(o, key);
    if (!v) return dflt;
    if (!json_is_boolean(v)) return -1;
    return json_is_true(v);
}

/* A string member copied (owned), or NULL. */
static char *ug_strdup(const json_t *v, size_t *len)
{
    if (!json_is_string(v)) return NULL;
    size_t n = json_string_length(v);
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, json_string_value(v), n);
    p[n] = '\0';
    *len = n;
    return p;
}

/* The single character of a one-character string member, or UINT32_MAX. */
static uint32_t ug_char(const json_t *v)
{
    const char *s = json_string_value(v);
    if (!s) return UINT32_MAX;
    size_t n = json_string_length(v);
    uint32_t cp;
    if (n == 0 || uni_utf8_decode((const unsigned char *)s, n, &cp) != n) return UINT32_MAX;
    return cp;
}

/* Replace's pattern: {"String": s} or {"Regex": " {2,}"} (the one regex
 * SentencePiece conversions write). Returns the kind, or -1. */
static int ug_pattern(const json_t *pat, struct ug_step *st)
{
    const json_t *s = json_object_get(pat, "String");
    if (s) {
        if (!(st->from = ug_strdup(s, &st->from_len)) || st->from_len == 0) return -1;
        return UG_N_REPLACE;
    }
    const json_t *r = json_object_get(pat, "Regex");
    if (r && json_is_string(r) && strcmp(json_string_value(r), " {2,}") == 0)
        return UG_N_SPACES;
    return -1;
}

/* ---- the pipeline's parts ---------------------------------------------------- */

/* base64 (standard alphabet, padding optional) into a new buffer. */
static unsigned char *ug_b64(const char *s, size_t n, size_t *out_n)
{
    unsigned char *out = malloc(n / 4 * 3 + 3);
    if (!out) return NULL;
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i], v;
        if (c >= 'A' && c <= 'Z') v = c - 'A';
        else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
        else if (c >= '0' && c <= '9') v = c - '0' + 52;
        else if (c == '+') v = 62;
        else if (c == '/') v = 63;
        else if (c == '=') break;
        else {
            free(out);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    *out_n = o;
    return out;
}

/* precompiled_charsmap: a little-endian u32 trie size in bytes, the
 * darts-clone units, then the replacement strings. */
static int ug_precompiled(struct ug_tokenizer *t, const json_t *v, const char *path,
                          char *errstr, size_t errstr_size)
{
    if (t->pc_units) {
        ug_seterr(errstr, errstr_size, "%s: more than one Precompiled normalizer", path);
        return -1;
    }
    const char *s = json_string_value(v);
    size_t n = 0;
    unsigned char *b = s ? ug_b64(s, json_string_length(v), &n) : NULL;
    if (!b || n < 4) {
        free(b);
        ug_seterr(errstr, errstr_size, "%s: precompiled_charsmap is not base64 of a charsmap",
                  path);
        return -1;
    }
    size_t ts = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
    if (ts % 4 || ts == 0 || ts > n - 4) {
        free(b);
        ug_seterr(errstr, errstr_size, "%s: precompiled_charsmap's trie size %zu does not fit %zu bytes",
                  path, ts, n);
        return -1;
    }
    t->pc_n = ts / 4;
    t->pc_units = malloc(ts);
    t->pc_norm_len = n - 4 - ts;
    t->pc_norm = malloc(t->pc_norm_len + 1);
    if (!t->pc_units || !t->pc_norm) {
        free(b);
        ug_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < t->pc_n; i++) {
        const unsigned char *u = b + 4 + 4 * i;
        t->pc_units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 |
                         (uint32_t)u[3] << 24;
    }
    memcpy(t->pc_norm, b + 4 + ts, t->pc_norm_len);
    t->pc_norm[t->pc_norm_len] = '\0';
    free(b);
    return 0;
}

/* One normalizer (not a Sequence) into st. */
static int ug_norm_one(struct ug_tokenizer *t, const json_t *o, struct ug_step *st,
                       const char *path, char *errstr, size_t errstr_size)
{
    const char *type = ug_type(o);
    memset(st, 0, sizeof(*st));
    if (!type) type = "(none)";
    if (strcmp(type, "Precompiled") == 0) {
        st->kind = UG_N_PRECOMPILED;
        return ug_precompiled(t, json_object_get(o, "precompiled_charsmap"), path, errstr,
                              errstr_size);
    }
    if (strcmp(type, "NFKC") == 0) {
        st->kind = UG_N_NFKC;
        return 0;
    }
    if (strcmp(type, "Strip") == 0) {
        st->kind = UG_N_STRIP;
        st->left = ug_bool(o, "strip_left", 1);
        st->right = ug_bool(o, "strip_right", 1);
        if (st->left >= 0 && st->right >= 0) return 0;
    } else if (strcmp(type, "Replace") == 0) {
        int k = ug_pattern(json_object_get(o, "pattern"), st);
        if (k >= 0 && (st->to = ug_strdup(json_object_get(o, "content"), &st->to_len))) {
            st->kind = k;
            return 0;
        }
    } else {
        ug_seterr(errstr, errstr_size,
                  "%s: normalizer \"%.64s\" is not supported (supported: Precompiled, NFKC, "
                  "Replace, Strip, Sequence)", path, type);
        return -1;
    }
    ug_seterr(errstr, errstr_size, "%s: normalizer %s has settings kinfer cannot follow (Replace: "
              "a string or the regex \" {2,}\")", path, type);
    return -1;
}

/* A step list: one object, or a Sequence of them under key. */
static int ug_steps(struct ug_tokenizer *t, const json_t *o, const char *key,
                    struct ug_step *steps, size_t *n, const char *what,
                    int (*one)(struct ug_tokenizer *, const json_t *, struct ug_step *,
                               const char *, char *, size_t),
                    const char *path, char *errstr, size_t errstr_size)
{
    *n = 0;
    if (!o || json_is_null(o)) return 0;
    const char *type = ug_type(o);
    if (type && strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(o, key);
        if (!json_is_array(arr) || json_array_size(arr) > UG_MAX_STEPS) {
            ug_seterr(errstr, errstr_size, "%s: %s Sequence needs %s, at most %d", path, what, key,
                      UG_MAX_STEPS);
            return -1;
        }
        for (size_t i = 0; i < json_array_size(arr); i++) {
            const json_t *e = json_array_get(arr, i);
            if (ug_type(e) && strcmp(ug_type(e), "Sequence") == 0) {
                ug_seterr(errstr, errstr_size, "%s: nested %s Sequence", path, what);
                return -1;
            }
            if (one(t, e, &steps[(*n)++], path, errstr, errstr_size)) return -1;
        }
        return 0;
    }
    return one(t, o, &steps[(*n)++], path, errstr, errstr_size);
}

/* Metaspace's settings (pre-tokenizer and decoder share them). */
static int ug_metaspace(const json_t *o, struct ug_step *st)
{
    st->cp = ug_char(json_object_get(o, "replacement"));
    if (st->cp == UINT32_MAX) return -1;
    const char *ps = json_string_value(json_object_get(o, "prepend_scheme"));
    if (ps) {
        if (strcmp(ps, "always") == 0) st->prepend = UG_PREPEND_ALWAYS;
        else if (strcmp(ps, "first") == 0) st->prepend = UG_PREPEND_FIRST;
        else if (strcmp(ps, "never") == 0) st->prepend = UG_PREPEND_NEVER;
        else return -1;
    } else {
        int ap = ug_bool(o, "add_prefix_space", 1); /* files before prepend_scheme */
        if (ap < 0) return -1;
        st->prepend = ap ? UG_PREPEND_ALWAYS : UG_PREPEND_NEVER;
    }
    st->split = ug_bool(o, "split", 1);
    return st->split < 0 ? -1 : 0;
}

/* One pre-tokenizer (not a Sequence) into st. */
static int ug_pre_one(struct ug_tokenizer *t, const json_t *o, struct ug_step *st,
                      const char *path, char *errstr, size_t errstr_size)
{
    (void)t;
    const char *type = ug_type(o);
    memset(st, 0, sizeof(*st));
    if (!type) type = "(none)";
    if (strcmp(type, "WhitespaceSplit") == 0) {
        st->kind = UG_P_WSSPLIT;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        st->kind = UG_P_METASPACE;
        if (ug_metaspace(o, st) == 0) return 0;
        ug_seterr(errstr, errstr_size, "%s: pre-tokenizer Metaspace: bad settings", path);
        return -1;
    }
    ug_seterr(errstr, errstr_size, "%s: pre-tokenizer \"%.64s\" is not supported (supported: "
              "Metaspace, WhitespaceSplit, Sequence)", path, type);
    return -1;
}

/* One decoder (not a Sequence) into st. */
static int ug_dec_one(struct ug_tokenizer *t, const json_t *o, struct ug_step *st,
                      const char *path, char *errstr, size_t errstr_size)
{
    (void)t;
    const char *type = ug_type(o);
    memset(st, 0, sizeof(*st));
    if (!type) type = "(none)";
    if (strcmp(type, "Metaspace") == 0) {
        st->kind = UG_D_METASPACE;
        if (ug_metaspace(o, st) == 0) return 0;
    } else if (strcmp(type, "ByteFallback") == 0) {
        st->kind = UG_D_BYTEFALLBACK;
        return 0;
    } else if (strcmp(type, "Fuse") == 0) {
        st->kind = UG_D_FUSE;
        return 0;
    } else if (strcmp(type, "Replace") == 0) {
        st->kind = UG_D_REPLACE;
        if (ug_pattern(json_object_get(o, "pattern"), st) == UG_N_REPLACE &&
            (st->to = ug_strdup(json_object_get(o, "content"), &st->to_len)))
            return 0;
    } else if (strcmp(type, "Strip") == 0) {
        st->kind = UG_D_STRIP;
        st->cp = ug_char(json_object_get(o, "content"));
        const json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        if (st->cp != UINT32_MAX && json_is_integer(a) && json_is_integer(b) &&
            json_integer_value(a) >= 0 && json_integer_value(b) >= 0 &&
            json_integer_value(a) < 1 << 20 && json_integer_value(b) < 1 << 20) {
            st->left = (int)json_integer_value(a);
            st->right = (int)json_integer_value(b);
            return 0;
        }
    } else {
        ug_seterr(errstr, errstr_size, "%s: decoder \"%.64s\" is not supported (supported: "
                  "Metaspace, ByteFallback, Fuse, Replace, Strip, Sequence)", path, type);
        return -1;
    }
    ug_seterr(errstr, errstr_size, "%s: decoder %s: bad settings", path, type);
    return -1;
}

/* One template (single or pair) of TemplateProcessing. */
static int ug_template(const json_t *arr, const json_t *sp, struct ug_tmpl *out, size_t *n,
                       size_t n_ids)
{
    *n = 0;
    if (!json_is_array(arr)) return -1;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *it = json_array_get(arr, i);
        const json_t *seq = json_object_get(it, "Sequence");
        const json_t *spt = json_object_get(it, "SpecialToken");
        const json_t *o = seq ? seq : spt;
        const json_t *ty = json_object_get(o, "type_id");
        const char *id = json_string_value(json_object_get(o, "id"));
        if (!o || !id || !json_is_integer(ty) || json_integer_value(ty) < 0 ||
            json_integer_value(ty) > INT32_MAX)
            return -1;
        int32_t type_id = (int32_t)json_integer_value(ty);
        if (seq) {
            if (*n >= UG_MAX_TMPL) return -1;
            if (strcmp(id, "A") == 0) out[(*n)++] = (struct ug_tmpl){-1, type_id};
            else if (strcmp(id, "B") == 0) out[(*n)++] = (struct ug_tmpl){-2, type_id};
            else return -1;
            continue;
        }
        const json_t *ids = json_object_get(json_object_get(sp, id), "ids");
        if (!json_is_array(ids)) return -1;
        for (size_t k = 0; k < json_array_size(ids); k++) {
            const json_t *v = json_array_get(ids, k);
            if (*n >= UG_MAX_TMPL || !json_is_integer(v) || json_integer_value(v) < 0 ||
                (size_t)json_integer_value(v) >= n_ids)
                return -1;
            out[(*n)++] = (struct ug_tmpl){(int32_t)json_integer_value(v), type_id};
        }
    }
    return 0;
}

/* [token, id] of RobertaProcessing. */
static int32_t ug_pair_id(const json_t *v, size_t n_ids)
{
    const json_t *id = json_array_get(v, 1);
    if (!json_is_integer(id) || json_integer_value(id) < 0 ||
        (size_t)json_integer_value(id) >= n_ids)
        return -1;
    return (int32_t)json_integer_value(id);
}

/* The post-processor as single and pair templates (none: A, and A B
 * with type ids 0 and 1, as the reference lays a pair out). */
static int ug_post(struct ug_tokenizer *t, const json_t *pp, const char *path, char *errstr,
                   size_t errstr_size)
{
    if (!pp || json_is_null(pp)) { /* the reference's default: A (0), B (1) */
        t->single[0] = (struct ug_tmpl){-1, 0};
        t->n_single = 1;
        t->pair[0] = (struct ug_tmpl){-1, 0};
        t->pair[1] = (struct ug_tmpl){-2, 1};
        t->n_pair = 2;
        return 0;
    }
    const char *type = ug_type(pp);
    if (type && strcmp(type, "TemplateProcessing") == 0) {
        const json_t *sp = json_object_get(pp, "special_tokens");
        if (ug_template(json_object_get(pp, "single"), sp, t->single, &t->n_single, t->n_ids) ||
            ug_template(json_object_get(pp, "pair"), sp, t->pair, &t->n_pair, t->n_ids)) {
            ug_seterr(errstr, errstr_size, "%s: post_processor TemplateProcessing: a template "
                      "kinfer cannot read (or over %d entries, or an id out of range)", path,
                      UG_MAX_TMPL);
            return -1;
        }
        size_t a = 0, b = 0;
        for (size_t i = 0; i < t->n_single; i++) a += t->single[i].id == -1;
        for (size_t i = 0; i < t->n_single; i++) b += t->single[i].id == -2;
        if (a != 1 || b != 0) {
            ug_seterr(errstr, errstr_size, "%s: the single template needs $A once", path);
            return -1;
        }
        a = b = 0;
        for (size_t i = 0; i < t->n_pair; i++) a += t->pair[i].id == -1;
        for (size_t i = 0; i < t->n_pair; i++) b += t->pair[i].id == -2;
        if (a != 1 || b != 1) {
            ug_seterr(errstr, errstr_size, "%s: the pair template needs $A and $B once", path);
            return -1;
        }
        return 0;
    }
    if (type && strcmp(type, "RobertaProcessing") == 0) {
        int32_t cls = ug_pair_id(json_object_get(pp, "cls"), t->n_ids);
        int32_t sep = ug_pair_id(json_object_get(pp, "sep"), t->n_ids);
        if (cls < 0 || sep < 0) {
            ug_seterr(errstr, errstr_size, "%s: post_processor RobertaProcessing: bad cls/sep",
                      path);
            return -1;
        }
        struct ug_tmpl s[] = {{cls, 0}, {-1, 0}, {sep, 0}};
        struct ug_tmpl p[] = {{cls, 0}, {-1, 0}, {sep, 0}, {sep, 0}, {-2, 0}, {sep, 0}};
        memcpy(t->single, s, sizeof(s));
        t->n_single = 3;
        memcpy(t->pair, p, sizeof(p));
        t->n_pair = 6;
        return 0;
    }
    ug_seterr(errstr, errstr_size, "%s: post_processor \"%.64s\" is not supported (supported: "
              "TemplateProcessing, RobertaProcessing, null)", path, type ? type : "(none)");
    return -1;
}

/* ---- the model and the added tokens ----------------------------------------- */

/* The vocabulary into the pool, scores, the piece trie and the byte ids;
 * added tokens past the vocabulary are appended by the caller. */
static int ug_model(struct ug_tokenizer *t, const json_t *model, const json_t *added,
                    const char *path, char *errstr, size_t errstr_size)
{
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *unk = json_object_get(model, "unk_id");
    int bf = ug_bool(model, "byte_fallback", 0);
    if (!json_is_array(vocab) || json_array_size(vocab) == 0 ||
        json_array_size(vocab) > INT32_MAX / 2) {
        ug_seterr(errstr, errstr_size, "%s: model.vocab must be a non-empty array", path);
        return -1;
    }
    if (bf < 0) {
        ug_seterr(errstr, errstr_size, "%s: model.byte_fallback must be a boolean", path);
        return -1;
    }
    t->byte_fallback = bf;
    t->n_pieces = json_array_size(vocab);
    if (!json_is_integer(unk) || json_integer_value(unk) < 0 ||
        (size_t)json_integer_value(unk) >= t->n_pieces) {
        ug_seterr(errstr, errstr_size, "%s: model.unk_id must be an id of the vocabulary "
                  "(a null unk_id is not supported)", path);
        return -1;
    }
    t->unk = (int32_t)json_integer_value(unk);
    /* ids: the vocabulary, then added tokens past it (contiguous) */
    size_t n_ids = t->n_pieces;
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *id = json_object_get(json_array_get(added, i), "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) > INT32_MAX / 2) {
            ug_seterr(errstr, errstr_size, "%s: added_tokens[%zu].id is not an id", path, i);
            return -1;
        }
        if ((size_t)json_integer_value(id) >= n_ids) n_ids = (size_t)json_integer_value(id) + 1;
    }
    if (n_ids - t->n_pieces > json_array_size(added)) {
        ug_seterr(errstr, errstr_size, "%s: added_tokens leave ids past the vocabulary unused",
                  path);
        return -1;
    }
    t->n_ids = n_ids;
    size_t bytes = 0;
    for (size_t i = 0; i < t->n_pieces; i++) {
        const json_t *e = json_array_get(vocab, i);
        const json_t *p = json_array_get(e, 0), *sc = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(p) ||
            !json_is_number(sc) || json_string_length(p) == 0) {
            ug_seterr(errstr, errstr_size, "%s: model.vocab[%zu] is not [piece, score]", path, i);
            return -1;
        }
        bytes += json_string_length(p) + 1;
    }
    for (size_t i = 0; i < json_array_size(added); i++)
        bytes += json_string_length(json_object_get(json_array_get(added, i), "content")) + 1;
    t->pool = malloc(bytes);
    t->tok_off = calloc(n_ids, sizeof(*t->tok_off));
    t->tok_len = calloc(n_ids, sizeof(*t->tok_len));
    t->score = malloc(t->n_pieces * sizeof(*t->score));
    t->special = calloc(n_ids, 1);
    t->astrip = calloc(n_ids, 1);
    struct ug_ent *ent = malloc(t->n_pieces * sizeof(*ent));
    if (!t->pool || !t->tok_off || !t->tok_len || !t->score || !t->special || !t->astrip ||
        !ent) {
        free(ent);
        ug_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    size_t o = 0;
    double min_score = 1.0 / 0.0;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    for (size_t i = 0; i < t->n_pieces; i++) {
        const json_t *e = json_array_get(vocab, i);
        const json_t *p = json_array_get(e, 0);
        size_t n = json_string_length(p);
        t->tok_off[i] = o;
        t->tok_len[i] = (uint32_t)n;
        memcpy(t->pool + o, json_string_value(p), n + 1);
        t->score[i] = json_number_value(json_array_get(e, 1));
        if (t->score[i] < min_score) min_score = t->score[i];
        ent[i] = (struct ug_ent){t->pool + o, n, (int32_t)i};
        o += n + 1;
        const char *s = t->pool + t->tok_off[i];
        static const char hex[] = "0123456789ABCDEF";
        if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && strchr(hex, s[3]) &&
            strchr(hex, s[4]))
            t->byte_id[(strchr(hex, s[3]) - hex) * 16 + (strchr(hex, s[4]) - hex)] = (int32_t)i;
    }
    t->unk_score = min_score - UG_K_UNK_PENALTY;
    size_t dup = 0;
    int rc = ug_trie_build(&t->pieces, ent, t->n_pieces, &dup);
    if (rc == -2)
        ug_seterr(errstr, errstr_size, "%s: model.vocab repeats the piece \"%.64s\"", path,
                  ent[dup].s);
    else if (rc)
        ug_seterr(errstr, errstr_size, "%s: out of memory", path);
    free(ent);
    if (rc) return -1;
    /* ids past the vocabulary take their added token's content */
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        size_t id = (size_t)json_integer_value(json_object_get(a, "id"));
        const json_t *c = json_object_get(a, "content");
        if (id < t->n_pieces || !json_is_string(c)) continue;
        size_t n = json_string_length(c);
        t->tok_off[id] = o;
        t->tok_len[id] = (uint32_t)n;
        memcpy(t->pool + o, json_string_value(c), n + 1);
        o += n + 1;
    }
    for (size_t id = t->n_pieces; id < n_ids; id++) {
        if (t->tok_len[id] == 0) {
            ug_seterr(errstr, errstr_size, "%s: no added token has id %zu, past the vocabulary",
                      path, id);
            return -1;
        }
    }
    return 0;
}

/* added_tokens: all matched on the raw text; their trie, strip flags and
 * special marks. */
static int ug_added(struct ug_tokenizer *t, const json_t *added, const char *path, char *errstr,
                    size_t errstr_size)
{
    size_t n = json_array_size(added);
    if (!n) return 0;
    struct ug_ent *ent = malloc(n * sizeof(*ent));
    if (!ent) {
        ug_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(added, i);
        size_t id = (size_t)json_integer_value(json_object_get(a, "id"));
        const json_t *c = json_object_get(a, "content");
        int sw = ug_bool(a, "single_word", 0), ls = ug_bool(a, "lstrip", 0);
        int rs = ug_bool(a, "rstrip", 0), nz = ug_bool(a, "normalized", 0);
        int sp = ug_bool(a, "special", 0);
        if (!json_is_string(c) || json_string_length(c) == 0 || sw < 0 || ls < 0 || rs < 0 ||
            nz < 0 || sp < 0) {
            ug_seterr(errstr, errstr_size, "%s: added_tokens[%zu] is malformed", path, i);
            free(ent);
            return -1;
        }
        if (sw || nz) {
            ug_seterr(errstr, errstr_size, "%s: added token \"%.64s\": %s is not supported", path,
                      json_string_value(c), sw ? "single_word" : "normalized true");
            free(ent);
            return -1;
        }
        if (t->tok_len[id] != json_string_length(c) ||
            memcmp(t->pool + t->tok_off[id], json_string_value(c), t->tok_len[id]) != 0) {
            ug_seterr(errstr, errstr_size, "%s: added token \"%.64s\" has id %zu, which is \"%.64s\" "
                      "in the vocabulary", path, json_string_value(c), id,
                      t->pool + t->tok_off[id]);
            free(ent);
            return -1;
        }
        t->special[id] = (unsigned char)sp;
        t->astrip[id] = (unsigned char)(ls | rs << 1);
        ent[i] = (struct ug_ent){t->pool + t->tok_off[id], t->tok_len[id], (int32_t)id};
    }
    size_t dup = 0;
    int rc = ug_trie_build(&t->added, ent, n, &dup);
    if (rc == -2)
        ug_seterr(errstr, errstr_size, "%s: added_tokens repeat \"%.64s\"", path, ent[dup].s);
    else if (rc)
        ug_seterr(errstr, errstr_size, "%s: out of memory", path);
    free(ent);
    return rc ? -1 : 0;
}

/* See unigram.h. */
struct ug_tokenizer *ug_from_json(const json_t *root, const char *path, char *errstr,
                                  size_t errstr_size)
{
    struct ug_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) {
        ug_seterr(errstr, errstr_size, "%s: out of memory", path);
        return NULL;
    }
    const json_t *model = json_object_get(root, "model");
    const json_t *added = json_object_get(root, "added_tokens");
    const char *mt = ug_type(model);
    if (!mt || strcmp(mt, "Unigram") != 0) {
        ug_seterr(errstr, errstr_size, "%s: model.type is not Unigram", path);
        goto fail;
    }
    if (added && !json_is_array(added) && !json_is_null(added)) {
        ug_seterr(errstr, errstr_size, "%s: added_tokens must be an array", path);
        goto fail;
    }
    if (!json_is_array(added)) added = NULL;
    if (ug_model(t, model, added, path, errstr, errstr_size) ||
        ug_added(t, added, path, errstr, errstr_size) ||
        ug_steps(t, json_object_get(root, "normalizer"), "normalizers", t->norm, &t->n_norm,
                 "normalizer", ug_norm_one, path, errstr, errstr_size) ||
        ug_steps(t, json_object_get(root, "pre_tokenizer"), "pretokenizers", t->pre, &t->n_pre,
                 "pre_tokenizer", ug_pre_one, path, errstr, errstr_size) ||
        ug_steps(t, json_object_get(root, "decoder"), "decoders", t->dec, &t->n_dec, "decoder",
                 ug_dec_one, path, errstr, errstr_size) ||
        ug_post(t, json_object_get(root, "post_processor"), path, errstr, errstr_size))
        goto fail;
    const json_t *dec = json_object_get(root, "decoder");
    t->has_decoder = dec && !json_is_null(dec);
    t->cls = t->n_single > 1 && t->single[0].id >= 0 ? t->single[0].id : -1;
    t->sep = t->n_single > 1 && t->single[t->n_single - 1].id >= 0
                 ? t->single[t->n_single - 1].id : -1;
    t->pad = ug_token_id(t, "<pad>");
    const json_t *pad = json_object_get(json_object_get(root, "padding"), "pad_id");
    if (json_is_integer(pad) && json_integer_value(pad) >= 0 &&
        (size_t)json_integer_value(pad) < t->n_ids)
        t->pad = (int32_t)json_integer_value(pad);
    t->mask = ug_token_id(t, "<mask>");
    return t;
fail:
    ug_destroy(t);
    return NULL;
}

/* See unigram.h. */
void ug_destroy(struct ug_tokenizer *t)
{
    if (!t) return;
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->score);
    free(t->special);
    free(t->astrip);
    free(t->pieces.n);
    free(t->pieces.e);
    free(t->added.n);
    free(t->added.e);
    free(t->pc_units);
    free(t->pc_norm);
    struct ug_step *all[] = {t->norm, t->pre, t->dec};
    size_t ns[] = {t->n_norm, t->n_pre, t->n_dec};
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < ns[k]; i++) {
            free(all[k][i].from);
            free(all[k][i].to);
        }
    }
    free(t);
}

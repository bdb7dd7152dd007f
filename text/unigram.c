/* unigram.c - the Unigram tokenizer's encoding, matching
 * Hugging Face's `tokenizers` id for id (unigram.h has the rules), and the
 * accessors of a loaded tokenizer; ug_load.c reads tokenizer.json, and
 * ug_decode.c decodes.
 *
 * Encoding works a segment at a time (the text between added tokens): the
 * normalizer steps run one after another between two buffers, the
 * pre-tokenizer steps turn the result into words (ranges of a buffer), and
 * each word goes through the Viterbi search, whose lattice (one entry per
 * byte of the word) is the only part that a single long word makes large:
 * ug_encode gives it back when it grew past UG_LATTICE_KEEP entries.
 *
 * Threads: a loaded tokenizer is read-only, so ug_encode may run on many
 * threads at once, each with its own scratch. Nothing here is global.
 *
 * Ownership: a ug_tokenizer owns everything it points to, and the strings
 * it hands out are borrowed from it. A ug_scratch owns its buffers;
 * ug_normalize's result is borrowed from the scratch. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "ug_impl.h"
#include "truncate.h"
#include "unicode.h"

/* ---- accessors ------------------------------------------------------------- */

/* Pieces and added tokens past them: the embedding table's rows. */
size_t ug_vocab_size(const struct ug_tokenizer *t)
{
    return t->n_ids;
}

/* Reverse lookup, for logs, tests and decoding. */
const char *ug_id_token(const struct ug_tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_ids) return NULL;
    return t->pool + t->tok_off[id];
}

/* Added tokens first (they are what the text's literal forms become), then
 * the model's pieces. */
int32_t ug_token_id(const struct ug_tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    int32_t id = ug_trie_find(&t->added, token, n);
    return id >= 0 ? id : ug_trie_find(&t->pieces, token, n);
}

/* The special ids a caller needs to lay out its own batches. */
int32_t ug_cls_id(const struct ug_tokenizer *t) { return t->cls; }
int32_t ug_sep_id(const struct ug_tokenizer *t) { return t->sep; }
int32_t ug_pad_id(const struct ug_tokenizer *t) { return t->pad; }
int32_t ug_unk_id(const struct ug_tokenizer *t) { return t->unk; }
int32_t ug_mask_id(const struct ug_tokenizer *t) { return t->mask; }

/* ---- scratch ------------------------------------------------------------------ */

/* A word: bytes [off, off + len) of a pre-tokenizer buffer; first: it
 * starts where its sequence's raw text starts (Metaspace's "first"). */
struct ug_range {
    size_t off, len;
    int first;
};

/* Ids of one sequence. limit (0: none): the pair truncation's threshold;
 * judged: the count at the first word end where n reached it (see
 * ug_encode). */
struct ug_ivec {
    int32_t *v;
    size_t n, cap;
    size_t limit, judged;
};

/* A word ended: the reference stops tokenizing a sequence there once it
 * holds limit tokens (added tokens count, but it does not stop at them). */
static inline void ug_word_end(struct ug_ivec *v)
{
    if (v->limit && !v->judged && v->n >= v->limit) v->judged = v->n;
}

/* The best path that ends at a byte offset of the word: its score, where
 * its last piece starts (-1: no path yet) and that piece's id. */
struct ug_node {
    double score;
    int32_t start;
    int32_t id;
};

struct ug_scratch {
    struct ug_ivec a, b;       /* ids of the first and second sequence */
    struct ug_buf nb[2];       /* normalizer steps, ping-pong */
    struct ug_buf pb[2];       /* pre-tokenizer steps' text */
    struct ug_range *wr[2];    /* their words */
    size_t wn[2], wcap[2];
    struct ug_node *lat;       /* the Viterbi lattice */
    size_t lat_cap;
    uint32_t *sp;              /* the best path, as (start, id) pairs */
    size_t sp_cap;
    int32_t *u32;              /* NFKC's code points */
    size_t u32_cap;
};

/* Grows an array to hold need elements of elem bytes (doubling); returns
 * the new pointer, or NULL with p and *cap untouched. */
void *ug_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 4 / elem) return NULL;
        nc *= 2;
    }
    void *q = realloc(p, nc * elem);
    if (!q) return NULL;
    *cap = nc;
    return q;
}

/* Room for need more bytes in b; 0 or -1. */
static int ug_reserve(struct ug_buf *b, size_t more)
{
    if (more > SIZE_MAX - b->n) return -1;
    void *p = ug_grow(b->p, &b->cap, b->n + more + 1, 1);
    if (!p) return -1;
    b->p = p;
    return 0;
}

/* Appends n bytes; 0 or -1 (out of memory). */
int ug_put(struct ug_buf *b, const char *s, size_t n)
{
    if (ug_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* A scratch sized for expect_len bytes of input, so the first call
 * already runs without allocating (but for a long word's lattice). */
struct ug_scratch *ug_scratch_new(size_t expect_len)
{
    struct ug_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    void *p;
    if (!(p = ug_grow(NULL, &s->a.cap, expect_len + 8, sizeof(int32_t)))) goto fail;
    s->a.v = p;
    if (!(p = ug_grow(NULL, &s->b.cap, 16, sizeof(int32_t)))) goto fail;
    s->b.v = p;
    for (int i = 0; i < 2; i++) {
        if (!(p = ug_grow(NULL, &s->nb[i].cap, expect_len + 64, 1))) goto fail;
        s->nb[i].p = p;
        if (!(p = ug_grow(NULL, &s->pb[i].cap, expect_len + 64, 1))) goto fail;
        s->pb[i].p = p;
        if (!(p = ug_grow(NULL, &s->wcap[i], expect_len / 2 + 16, sizeof(struct ug_range))))
            goto fail;
        s->wr[i] = p;
    }
    if (!(p = ug_grow(NULL, &s->lat_cap, 256, sizeof(*s->lat)))) goto fail;
    s->lat = p;
    if (!(p = ug_grow(NULL, &s->sp_cap, 512, sizeof(*s->sp)))) goto fail;
    s->sp = p;
    return s;
fail:
    ug_scratch_destroy(s);
    return NULL;
}

/* Frees everything s owns. */
void ug_scratch_destroy(struct ug_scratch *s)
{
    if (!s) return;
    free(s->a.v);
    free(s->b.v);
    for (int i = 0; i < 2; i++) {
        free(s->nb[i].p);
        free(s->pb[i].p);
        free(s->wr[i]);
    }
    free(s->lat);
    free(s->sp);
    free(s->u32);
    free(s);
}

/* See unigram.h: lets tests see that a long word's lattice went back. */
size_t ug_scratch_bytes(const struct ug_scratch *s)
{
    if (!s) return 0;
    size_t n = (s->a.cap + s->b.cap + s->u32_cap) * sizeof(int32_t) +
               s->lat_cap * sizeof(*s->lat) + s->sp_cap * sizeof(*s->sp);
    for (int i = 0; i < 2; i++)
        n += s->nb[i].cap + s->pb[i].cap + s->wcap[i] * sizeof(*s->wr[i]);
    return n;
}

size_t ug_scratch_lattice(const struct ug_scratch *s)
{
    return s->lat_cap;
}

/* ---- normalizer ------------------------------------------------------------------ */

/* The replacement of the shortest key of the charsmap that is a prefix of
 * key (n bytes; a NUL byte ends the key, as in the reference), or NULL.
 * Every index is checked against the array, so a corrupt charsmap reads
 * nothing outside it. */
static const char *ug_pc_match(const struct ug_tokenizer *t, const unsigned char *key, size_t n,
                               size_t *out_len)
{
    const uint32_t *a = t->pc_units;
    size_t pos = 0;
    uint32_t unit = a[0];
#define UG_OFFSET(u) (((u) >> 10) << (((u) & (1u << 9)) >> 6))
    pos ^= UG_OFFSET(unit);
    for (size_t i = 0; i < n && key[i]; i++) {
        pos ^= key[i];
        if (pos >= t->pc_n) return NULL;
        unit = a[pos];
        if ((unit & (0x80000000u | 0xFFu)) != key[i]) return NULL;
        pos ^= UG_OFFSET(unit);
        if (unit >> 8 & 1) {
            if (pos >= t->pc_n) return NULL;
            size_t v = a[pos] & 0x7FFFFFFFu;
            if (v >= t->pc_norm_len) return NULL;
            size_t l = strlen(t->pc_norm + v);
            if (uni_utf8_check(t->pc_norm + v, l) != l) return NULL;
            *out_len = l;
            return t->pc_norm + v;
        }
    }
#undef UG_OFFSET
    return NULL;
}

/* One grapheme through the charsmap, as the reference's Precompiled does:
 * a grapheme under 6 bytes whose prefix is a key becomes that key's
 * replacement whole; otherwise each character is looked up alone. */
static int ug_pc_grapheme(const struct ug_tokenizer *t, const char *g, size_t n,
                          struct ug_buf *out)
{
    size_t rl;
    const char *r;
    if (n < 6 && (r = ug_pc_match(t, (const unsigned char *)g, n, &rl))) return ug_put(out, r, rl);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = uni_utf8_decode((const unsigned char *)g + i, n - i, &cp);
        if ((r = ug_pc_match(t, (const unsigned char *)g + i, k, &rl))) {
            if (ug_put(out, r, rl)) return -1;
        } else if (ug_put(out, g + i, k)) {
            return -1;
        }
        i += k;
    }
    return 0;
}

/* Precompiled over in: extended grapheme clusters (utf8proc's rules). */
static int ug_norm_pc(const struct ug_tokenizer *t, const char *in, size_t n, struct ug_buf *out)
{
    size_t g0 = 0, i = 0;
    utf8proc_int32_t state = 0;
    uint32_t prev = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = uni_utf8_decode((const unsigned char *)in + i, n - i, &cp);
        if (i > g0 && utf8proc_grapheme_break_stateful((utf8proc_int32_t)prev,
                                                       (utf8proc_int32_t)cp, &state)) {
            if (ug_pc_grapheme(t, in + g0, i - g0, out)) return -1;
            g0 = i;
        }
        prev = cp;
        i += k;
    }
    if (i > g0 && ug_pc_grapheme(t, in + g0, i - g0, out)) return -1;
    return 0;
}

/* Puts each run of nonstarters of u (n code points) in canonical order:
 * stable by combining class. Short runs (all real text) by insertion, long
 * ones (only hostile input makes them) by counting sort, so that a
 * megabyte of alternating marks stays linear where utf8proc's own
 * ordering would be quadratic. tmp has room for n. */
static void ug_canon_order(int32_t *u, size_t n, int32_t *tmp)
{
    for (size_t i = 0; i < n;) {
        if (utf8proc_get_property(u[i])->combining_class == 0) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && utf8proc_get_property(u[j])->combining_class != 0) j++;
        size_t m = j - i;
        int32_t *r = u + i;
        if (m <= 32) {
            for (size_t a = 1; a < m; a++) {
                int32_t x = r[a];
                int cx = utf8proc_get_property(x)->combining_class;
                size_t b = a;
                while (b > 0 && utf8proc_get_property(r[b - 1])->combining_class > cx) {
                    r[b] = r[b - 1];
                    b--;
                }
                r[b] = x;
            }
        } else {
            size_t count[257] = {0};
            for (size_t a = 0; a < m; a++) count[utf8proc_get_property(r[a])->combining_class + 1]++;
            for (size_t c = 1; c < 257; c++) count[c] += count[c - 1];
            for (size_t a = 0; a < m; a++)
                tmp[count[utf8proc_get_property(r[a])->combining_class]++] = r[a];
            memcpy(r, tmp, m * sizeof(int32_t));
        }
        i = j;
    }
}

/* Compatibility mappings libutf8proc 2.8 (Unicode 15) has and the
 * reference's NFKC does not (they came with Unicode 12.1 to 14): the
 * reference leaves these characters as they are, and so does kinfer.
 * tests/test_unigram.c checks every code point (nfkc.tsv). */
static const uint32_t ug_nfkc_keep[][2] = {
    {0x32FF, 0x32FF},   {0xA7F2, 0xA7F4},   {0xAB69, 0xAB69},
    {0x10781, 0x10785}, {0x10787, 0x107B0}, {0x107B2, 0x107BA},
    {0x1E030, 0x1E06D}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9},
};

/* 1 if cp is in ug_nfkc_keep. */
static int ug_nfkc_kept(uint32_t cp)
{
    if (cp < 0x32FF) return 0;
    for (size_t i = 0; i < sizeof(ug_nfkc_keep) / sizeof(ug_nfkc_keep[0]); i++)
        if (cp >= ug_nfkc_keep[i][0] && cp <= ug_nfkc_keep[i][1]) return 1;
    return 0;
}

/* NFKC: compatibility decomposition character by character (utf8proc),
 * canonical ordering (ug_canon_order), then utf8proc's composition, in
 * the scratch's code point buffer (twice the room: the second half is the
 * ordering's). */
static int ug_norm_nfkc(struct ug_scratch *s, const char *in, size_t n, struct ug_buf *out)
{
    const int dopt = UTF8PROC_STABLE | UTF8PROC_COMPAT | UTF8PROC_DECOMPOSE;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = uni_utf8_decode((const unsigned char *)in + i, n - i, &cp);
        if (s->u32_cap < 2 * (k + UNI_DECOMP_MAX) + 2) {
            void *p = ug_grow(s->u32, &s->u32_cap, 2 * (k + UNI_DECOMP_MAX) + 2, sizeof(int32_t));
            if (!p) return -1;
            s->u32 = p;
        }
        int boundclass = 0;
        utf8proc_ssize_t r = 1;
        if (ug_nfkc_kept(cp)) s->u32[k] = (int32_t)cp;
        else r = utf8proc_decompose_char((utf8proc_int32_t)cp, s->u32 + k, UNI_DECOMP_MAX, dopt,
                                         &boundclass);
        if (r < 0 || r > UNI_DECOMP_MAX) return -1;
        k += (size_t)r;
        i += l;
    }
    if (k == 0) return 0;
    if (k > (size_t)INT32_MAX / 4) return -1;
    ug_canon_order(s->u32, k, s->u32 + s->u32_cap / 2);
    utf8proc_ssize_t r = utf8proc_reencode(s->u32, (utf8proc_ssize_t)k,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return -1;
    return ug_put(out, (const char *)s->u32, (size_t)r);
}

/* One normalizer step from in to out (out emptied first). *anchored stays
 * 1 while the output's first character still maps to the input's first
 * byte, as the reference's alignments track it (what Metaspace's "first"
 * scheme looks at): Strip that removes leading whitespace, and a Replace
 * at the start that removes more than one character (its new characters
 * count as inserted after them), move it. */
static int ug_norm_step(const struct ug_tokenizer *t, struct ug_scratch *s,
                        const struct ug_step *st, const char *in, size_t n, struct ug_buf *out,
                        int *anchored)
{
    out->n = 0;
    if (ug_reserve(out, n)) return -1;
    switch (st->kind) {
    case UG_N_PRECOMPILED: return ug_norm_pc(t, in, n, out);
    case UG_N_NFKC: return ug_norm_nfkc(s, in, n, out);
    case UG_N_REPLACE:
        for (size_t i = 0; i < n;) {
            if (n - i >= st->from_len && memcmp(in + i, st->from, st->from_len) == 0) {
                if (ug_put(out, st->to, st->to_len)) return -1;
                if (i == 0) {
                    uint32_t cp;
                    size_t k = uni_utf8_decode((const unsigned char *)in, n, &cp);
                    if (k != st->from_len || st->to_len == 0) *anchored = 0;
                }
                i += st->from_len;
            } else {
                if (ug_put(out, in + i, 1)) return -1;
                i++;
            }
        }
        return 0;
    case UG_N_SPACES:
        for (size_t i = 0; i < n;) {
            size_t j = i;
            while (j < n && in[j] == ' ') j++;
            if (j - i >= 2) {
                if (ug_put(out, st->to, st->to_len)) return -1;
                if (i == 0) *anchored = 0;
                i = j;
            } else {
                if (ug_put(out, in + i, 1)) return -1;
                i++;
            }
        }
        return 0;
    case UG_N_STRIP: {
        size_t a = 0, b = n;
        while (st->left && a < b) {
            uint32_t cp;
            size_t k = uni_utf8_decode((const unsigned char *)in + a, b - a, &cp);
            if (!uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp))) break;
            a += k;
        }
        while (st->right && b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)in[k] & 0xC0) == 0x80) k--;
            uint32_t cp;
            uni_utf8_decode((const unsigned char *)in + k, b - k, &cp);
            if (!uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp))) break;
            b = k;
        }
        if (a > 0) *anchored = 0;
        return ug_put(out, in + a, b - a);
    }
    default: return -1;
    }
}

/* The whole normalizer over in; the result is in one of s->nb (returned),
 * or in itself when there are no steps (*res set either way). */
static int ug_normalize_into(const struct ug_tokenizer *t, struct ug_scratch *s, const char *in,
                             size_t n, const char **res, size_t *res_n, int *anchored)
{
    const char *cur = in;
    size_t cur_n = n;
    for (size_t i = 0; i < t->n_norm; i++) {
        struct ug_buf *out = &s->nb[i & 1];
        if (ug_norm_step(t, s, &t->norm[i], cur, cur_n, out, anchored)) return -1;
        cur = out->p;
        cur_n = out->n;
    }
    *res = cur;
    *res_n = cur_n;
    return 0;
}

/* The normalizer alone over the whole text, copied into the scratch and
 * NUL-terminated. */
const char *ug_normalize(const struct ug_tokenizer *t, struct ug_scratch *s, const char *text,
                         size_t len, size_t *out_len, char *errstr, size_t errstr_size)
{
    if (!text && len) {
        ug_seterr(errstr, errstr_size, "ug_normalize: NULL text with a non-zero length");
        return NULL;
    }
    size_t bad = uni_utf8_check(text ? text : "", len);
    if (bad != len) {
        ug_seterr(errstr, errstr_size, "text is not valid UTF-8 at byte %zu", bad);
        return NULL;
    }
    const char *r;
    size_t rn;
    int anchored = 1;
    if (ug_normalize_into(t, s, text ? text : "", len, &r, &rn, &anchored)) {
        ug_seterr(errstr, errstr_size, "out of memory normalizing %zu bytes", len);
        return NULL;
    }
    /* a copy the scratch owns, NUL-terminated */
    struct ug_buf *o = &s->pb[0];
    o->n = 0;
    if (ug_put(o, r, rn)) {
        ug_seterr(errstr, errstr_size, "out of memory");
        return NULL;
    }
    o->p[o->n] = '\0';
    *out_len = o->n;
    return o->p;
}

/* ---- pre-tokenizer ------------------------------------------------------------------ */

static int ug_word(struct ug_scratch *s, int k, size_t off, size_t len, int first)
{
    void *p = ug_grow(s->wr[k], &s->wcap[k], s->wn[k] + 1, sizeof(struct ug_range));
    if (!p) return -1;
    s->wr[k] = p;
    s->wr[k][s->wn[k]++] = (struct ug_range){off, len, first};
    return 0;
}

/* WhitespaceSplit: words are the runs between whitespace. */
static int ug_pre_ws(struct ug_scratch *s, int from, int to)
{
    struct ug_buf *ib = &s->pb[from], *ob = &s->pb[to];
    for (size_t w = 0; w < s->wn[from]; w++) {
        const struct ug_range r = s->wr[from][w];
        const char *p = ib->p + r.off;
        size_t i = 0, start = SIZE_MAX;
        while (i <= r.len) {
            uint32_t cp = ' ';
            size_t k = 1;
            if (i < r.len) k = uni_utf8_decode((const unsigned char *)p + i, r.len - i, &cp);
            int ws = i == r.len || uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp));
            if (ws && start != SIZE_MAX) {
                size_t off = ob->n;
                if (ug_put(ob, p + start, i - start) ||
                    ug_word(s, to, off, i - start, r.first && start == 0))
                    return -1;
                start = SIZE_MAX;
            } else if (!ws && start == SIZE_MAX) {
                start = i;
            }
            i += k;
        }
    }
    return 0;
}

/* Metaspace: ' ' becomes the replacement, which is prepended as the
 * scheme says, and (split) each replacement starts a new word. */
static int ug_pre_meta(const struct ug_step *st, struct ug_scratch *s, int from, int to)
{
    struct ug_buf *ib = &s->pb[from], *ob = &s->pb[to];
    char rep[4];
    size_t rl = uni_utf8_encode(st->cp, rep);
    for (size_t w = 0; w < s->wn[from]; w++) {
        const struct ug_range r = s->wr[from][w];
        if (r.len == 0) continue;
        const char *p = ib->p + r.off;
        size_t off = ob->n;
        int starts = p[0] == ' ' || (r.len >= rl && memcmp(p, rep, rl) == 0);
        int pre = !starts && (st->prepend == UG_PREPEND_ALWAYS ||
                              (st->prepend == UG_PREPEND_FIRST && r.first));
        if (pre && ug_put(ob, rep, rl)) return -1;
        for (size_t i = 0; i < r.len; i++) {
            if (p[i] == ' ' ? ug_put(ob, rep, rl) : ug_put(ob, p + i, 1)) return -1;
        }
        size_t end = ob->n;
        if (!st->split) {
            if (ug_word(s, to, off, end - off, r.first)) return -1;
            continue;
        }
        size_t ws = off;
        for (size_t i = off; i < end;) {
            if (i > ws && end - i >= rl && memcmp(ob->p + i, rep, rl) == 0) {
                if (ug_word(s, to, ws, i - ws, r.first && ws == off)) return -1;
                ws = i;
            }
            i++;
        }
        if (end > ws && ug_word(s, to, ws, end - ws, r.first && ws == off)) return -1;
    }
    return 0;
}

/* ---- the model ------------------------------------------------------------------ */

static int ug_push(struct ug_ivec *v, int32_t id)
{
    if (v->n == v->cap) {
        void *p = ug_grow(v->v, &v->cap, v->n + 1, sizeof(int32_t));
        if (!p) return -1;
        v->v = p;
    }
    v->v[v->n++] = id;
    return 0;
}

/* Bytes of the UTF-8 sequence a lead byte starts. */
static size_t ug_mblen(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* An unknown run [a, b) of the word (fused, as the reference fuses
 * neighbouring unknowns): the piece it spells if there is one, else its
 * bytes' pieces with byte_fallback, else the unk token. */
static int ug_emit_unk(const struct ug_tokenizer *t, const char *w, size_t a, size_t b,
                       struct ug_ivec *out)
{
    int32_t id = ug_trie_find(&t->pieces, w + a, b - a);
    if (id >= 0) return ug_push(out, id);
    if (t->byte_fallback) {
        size_t i;
        for (i = a; i < b && t->byte_id[(unsigned char)w[i]] >= 0; i++) {}
        if (i == b) {
            for (i = a; i < b; i++)
                if (ug_push(out, t->byte_id[(unsigned char)w[i]])) return -1;
            return 0;
        }
    }
    return ug_push(out, t->unk);
}

/* The best segmentation of a word, as the reference's encode_optimized:
 * positions in order, pieces from each in order of length, a later
 * candidate winning only with a strictly higher score; a character with no
 * piece of its own length gets an unk edge scored unk_score. */
static int ug_viterbi(const struct ug_tokenizer *t, struct ug_scratch *s, const char *w,
                      size_t n, struct ug_ivec *out)
{
    if (n == 0) return 0;
    if (n >= INT32_MAX) return -1;
    void *p = ug_grow(s->lat, &s->lat_cap, n + 1, sizeof(*s->lat));
    if (!p) return -1;
    s->lat = p;
    struct ug_node *lat = s->lat;
    for (size_t i = 0; i <= n; i++) lat[i].start = -1;
    lat[0].score = 0.0;
    const struct ug_trie *tr = &t->pieces;
    for (size_t st = 0; st < n;) {
        size_t mb = ug_mblen((unsigned char)w[st]);
        double base = lat[st].score;
        int single = 0;
        uint32_t node = 0;
        for (size_t k = st; k < n; k++) {
            int64_t c = ug_trie_step(tr, node, (unsigned char)w[k]);
            if (c < 0) break;
            node = (uint32_t)c;
            int32_t id = tr->n[node].id;
            if (id < 0) continue;
            size_t end = k + 1;
            double cand = t->score[id] + base;
            if (lat[end].start < 0 || cand > lat[end].score) {
                lat[end].score = cand;
                lat[end].start = (int32_t)st;
                lat[end].id = id;
            }
            if (end - st == mb) single = 1;
        }
        if (!single) {
            size_t end = st + mb;
            double cand = t->unk_score + base;
            if (lat[end].start < 0 || cand > lat[end].score) {
                lat[end].score = cand;
                lat[end].start = (int32_t)st;
                lat[end].id = t->unk;
            }
        }
        st += mb;
    }
    /* the path, back to front, as (start, id) pairs */
    size_t np = 0;
    for (size_t e = n; e > 0; e = (size_t)lat[e].start) {
        p = ug_grow(s->sp, &s->sp_cap, 2 * np + 2, sizeof(*s->sp));
        if (!p) return -1;
        s->sp = p;
        s->sp[2 * np] = (uint32_t)lat[e].start;
        s->sp[2 * np + 1] = (uint32_t)lat[e].id;
        np++;
    }
    /* front to back; a run of unk pieces is one token */
    size_t i = np;
    while (i > 0) {
        i--;
        size_t a = s->sp[2 * i];
        int32_t id = (int32_t)s->sp[2 * i + 1];
        size_t b = i ? s->sp[2 * (i - 1)] : n;
        if (id != t->unk) {
            if (ug_push(out, id)) return -1;
            continue;
        }
        while (i > 0 && (int32_t)s->sp[2 * (i - 1) + 1] == t->unk) {
            i--;
            b = i ? s->sp[2 * (i - 1)] : n;
        }
        if (ug_emit_unk(t, w, a, b, out)) return -1;
    }
    return 0;
}

/* One segment (text between added tokens): normalizer, pre-tokenizer,
 * model. first: the segment starts its sequence. */
static int ug_segment(const struct ug_tokenizer *t, struct ug_scratch *s, const char *seg,
                      size_t n, int first, struct ug_ivec *out)
{
    if (n == 0) return 0;
    const char *norm;
    size_t nn;
    int anchored = 1;
    if (ug_normalize_into(t, s, seg, n, &norm, &nn, &anchored)) return -1;
    first = first && anchored;
    if (nn == 0) return 0;
    int cur = 0;
    s->pb[0].n = 0;
    s->wn[0] = 0;
    if (ug_put(&s->pb[0], norm, nn) || ug_word(s, 0, 0, nn, first)) return -1;
    for (size_t i = 0; i < t->n_pre; i++) {
        int nx = cur ^ 1;
        s->pb[nx].n = 0;
        s->wn[nx] = 0;
        int rc = t->pre[i].kind == UG_P_WSSPLIT ? ug_pre_ws(s, cur, nx)
                                                : ug_pre_meta(&t->pre[i], s, cur, nx);
        if (rc) return -1;
        cur = nx;
    }
    for (size_t w = 0; w < s->wn[cur]; w++) {
        const struct ug_range r = s->wr[cur][w];
        if (ug_viterbi(t, s, s->pb[cur].p + r.off, r.len, out)) return -1;
        ug_word_end(out);
    }
    return 0;
}

/* One sequence into out: added tokens found leftmost-longest on the raw
 * text (lstrip/rstrip taking the whitespace beside them), the segments
 * between them through ug_segment. Returns 0 or an enum ug_err. */
static int ug_run(const struct ug_tokenizer *t, struct ug_scratch *s, const char *text,
                  size_t len, struct ug_ivec *out, const char *which, char *errstr,
                  size_t errstr_size)
{
    out->n = 0;
    out->judged = 0;
    size_t bad = uni_utf8_check(text, len);
    if (bad != len) {
        ug_seterr(errstr, errstr_size, "%s is not valid UTF-8 at byte %zu (0x%02x)", which, bad,
                  (unsigned char)text[bad]);
        return UG_ERR_UTF8;
    }
    const unsigned char *p = (const unsigned char *)text;
    size_t seg = 0;
    for (size_t i = 0; i < len && t->added.nn;) {
        uint32_t node = 0;
        int32_t id = -1;
        size_t ml = 0;
        for (size_t k = i; k < len; k++) {
            int64_t c = ug_trie_step(&t->added, node, p[k]);
            if (c < 0) break;
            node = (uint32_t)c;
            if (t->added.n[node].id >= 0) {
                id = t->added.n[node].id;
                ml = k + 1 - i;
            }
        }
        if (id < 0) {
            i++;
            continue;
        }
        size_t start = i, stop = i + ml;
        if (t->astrip[id] & 1) {
            while (start > seg) {
                size_t k = start - 1;
                while (k > seg && (p[k] & 0xC0) == 0x80) k--;
                uint32_t cp;
                uni_utf8_decode(p + k, start - k, &cp);
                if (!uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp))) break;
                start = k;
            }
        }
        if (t->astrip[id] & 2) {
            while (stop < len) {
                uint32_t cp;
                size_t k = uni_utf8_decode(p + stop, len - stop, &cp);
                if (!uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp))) break;
                stop += k;
            }
        }
        /* an added token counts, but is not where the reference stops */
        if (ug_segment(t, s, text + seg, start - seg, seg == 0, out) || ug_push(out, id))
            goto oom;
        seg = i = stop;
    }
    if (ug_segment(t, s, text + seg, len - seg, seg == 0, out)) goto oom;
    if (!out->judged) out->judged = out->n;
    return 0;
oom:
    ug_seterr(errstr, errstr_size, "out of memory encoding %zu bytes of %s", len, which);
    return UG_ERR_NOMEM;
}

/* Gives back a lattice that one long word grew. */
static void ug_trim(struct ug_scratch *s)
{
    if (s->lat_cap > UG_LATTICE_KEEP) {
        free(s->lat);
        s->lat = NULL;
        s->lat_cap = 0;
    }
    if (s->sp_cap > 2 * UG_LATTICE_KEEP) {
        free(s->sp);
        s->sp = NULL;
        s->sp_cap = 0;
    }
}

/* Encodes text (and pair), truncates as the reference does and lays the
 * template out; see unigram.h. */
int ug_encode(const struct ug_tokenizer *t, struct ug_scratch *s, const char *text, size_t len,
              const char *pair, size_t pair_len, size_t max_len, int truncate, int32_t *ids,
              int32_t *type_ids, size_t cap, size_t *full_len, char *errstr, size_t errstr_size)
{
    if ((!text && len) || (!pair && pair_len) || (!ids && cap)) {
        ug_seterr(errstr, errstr_size, "ug_encode: NULL buffer with a non-zero length");
        return UG_ERR_ARG;
    }
    s->a.limit = s->b.limit = pair && max_len && truncate ? max_len : 0;
    int rc = ug_run(t, s, text ? text : "", len, &s->a, "text", errstr, errstr_size);
    s->b.n = 0;
    if (!rc && pair) rc = ug_run(t, s, pair, pair_len, &s->b, "pair", errstr, errstr_size);
    ug_trim(s);
    if (rc) return rc;
    const struct ug_tmpl *tm = pair ? t->pair : t->single;
    size_t ntm = pair ? t->n_pair : t->n_single, nspec = 0;
    for (size_t i = 0; i < ntm; i++) nspec += tm[i].id >= 0;
    size_t na = s->a.n, nb = s->b.n;
    size_t full = na + nb + nspec;
    if (full_len) *full_len = full;
    if (max_len && full > max_len) {
        if (!truncate) {
            ug_seterr(errstr, errstr_size, "input is %zu tokens, over the limit of %zu", full,
                      max_len);
            return UG_ERR_TOO_LONG;
        }
        if (max_len < nspec) {
            ug_seterr(errstr, errstr_size,
                      "max_len %zu cannot hold the %zu special tokens of a %s", max_len, nspec,
                      pair ? "pair" : "sequence");
            return UG_ERR_ARG;
        }
        if (pair) trunc_longest_first(&na, &nb, s->a.judged, s->b.judged, max_len - nspec);
        else na = max_len - nspec;
    }
    size_t need = na + nb + nspec;
    if (need > INT_MAX || need > cap) {
        ug_seterr(errstr, errstr_size, "the encoding needs %zu entries, the buffer holds %zu",
                  need, cap);
        return UG_ERR_CAP;
    }
    size_t o = 0;
    for (size_t i = 0; i < ntm; i++) {
        const int32_t *src = tm[i].id == -1 ? s->a.v : tm[i].id == -2 ? s->b.v : &tm[i].id;
        size_t m = tm[i].id == -1 ? na : tm[i].id == -2 ? nb : 1;
        memcpy(ids + o, src, m * sizeof(int32_t));
        if (type_ids)
            for (size_t k = 0; k < m; k++) type_ids[o + k] = tm[i].type_id;
        o += m;
    }
    return (int)o;
}

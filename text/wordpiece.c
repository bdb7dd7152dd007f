/* wordpiece.c - BERT WordPiece tokenizer: encoding, matching Hugging
 * Face's fast tokenizer id for id (see wordpiece.h for the rules), and the
 * accessors of a loaded tokenizer. The loaders are in wp_load.c, the
 * Unicode rules in unicode.c.
 *
 * Encoding is one streaming pass over the input: each character is decoded,
 * checked against the special-token trie, and pushed through the normalizer
 * stages (clean -> chinese -> strip -> lowercase) into the pre-tokenizer,
 * which collects a word and hands it to the WordPiece matcher when a space
 * or punctuation ends it. Only the current word (capped at max_word_chars
 * characters), a run of combining characters awaiting canonical ordering,
 * and the ids of each sequence are kept, all in the caller's wp_scratch.
 *
 * Threads: a loaded tokenizer is read-only, so wp_encode/wp_normalize may run on many
 * threads at once, each with its own scratch. Nothing here is global.
 *
 * Ownership: a wp_tokenizer owns its token pool, tables and trie; the
 * strings it hands out are borrowed from it. A wp_scratch owns its
 * buffers; wp_normalize's result is borrowed from the scratch. Inputs are
 * borrowed for the duration of a call. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "unicode.h"
#include "truncate.h"
#include "wp_impl.h"

/* A growable array of ids (one per sequence in the scratch). */
struct wp_ivec {
    int32_t *v;
    size_t n, cap;
};

/* A character held back for canonical ordering, with its combining class. */
struct wp_runc {
    uint32_t cp;
    uint32_t ccc;
};

struct wp_scratch {
    struct wp_ivec a, b;      /* ids of the first and second sequence */
    char *word;               /* the current word, UTF-8 */
    size_t word_n, word_cap;
    size_t word_chars;        /* characters seen, also those past the cap */
    uint64_t *hs;             /* running hashes of a word suffix */
    size_t hs_cap;
    struct wp_runc *run;      /* nonstarters awaiting canonical ordering */
    struct wp_runc *run_tmp;  /* counting-sort output, same capacity */
    size_t run_n, run_cap;
    char *norm;               /* wp_normalize's output */
    size_t norm_n, norm_cap;
};

/* See wp_impl.h. */
void wp_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || errstr_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* The longest special token that starts at p (n bytes available): its id
 * with *mlen set, or -1. Walks the trie until a byte has no edge, so the
 * cost is bounded by the longest special token, whatever the input. */
static int32_t wp_trie_match(const struct wp_tokenizer *t, const unsigned char *p, size_t n,
                             size_t *mlen)
{
    const struct wp_tnode *node = &t->tn[0];
    int32_t best = -1;
    for (size_t i = 0;; i++) {
        if (node->id >= 0) {
            best = node->id;
            *mlen = i;
        }
        if (i == n || node->n_edges == 0) break;
        const struct wp_tedge *e = t->te + node->edge0;
        size_t lo = 0, hi = node->n_edges;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (e[mid].byte < p[i]) lo = mid + 1;
            else hi = mid;
        }
        if (lo == node->n_edges || e[lo].byte != p[i]) break;
        node = &t->tn[e[lo].child];
    }
    return best;
}

/* ---- accessors -------------------------------------------------------------- */

/* Frees everything t owns. */
void wp_destroy(struct wp_tokenizer *t)
{
    if (!t) return;
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->slots);
    free(t->slot_hash);
    free(t->tn);
    free(t->te);
    free(t->special);
    free(t);
}

/* Lets callers log and check the settings a file implied. */
const struct wp_conf *wp_get_conf(const struct wp_tokenizer *t)
{
    return &t->conf;
}

/* Size of the id space, for checking ids against an embedding table. */
size_t wp_vocab_size(const struct wp_tokenizer *t)
{
    return t->n_ids;
}

/* Public lookup of a whole token. */
int32_t wp_token_id(const struct wp_tokenizer *t, const char *token)
{
    return wp_find(t, token);
}

/* Reverse lookup, for logs and tests. */
const char *wp_id_token(const struct wp_tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_ids) return NULL;
    return t->pool + t->tok_off[id];
}

/* The special ids a caller needs to build its own batches. */
int32_t wp_unk_id(const struct wp_tokenizer *t) { return t->unk; }
/* See wp_unk_id. */
int32_t wp_cls_id(const struct wp_tokenizer *t) { return t->cls; }
/* See wp_unk_id. */
int32_t wp_sep_id(const struct wp_tokenizer *t) { return t->sep; }
/* See wp_unk_id; -1 if the vocabulary has no pad token. */
int32_t wp_pad_id(const struct wp_tokenizer *t) { return t->pad; }
/* See wp_unk_id; -1 if the vocabulary has no mask token. */
int32_t wp_mask_id(const struct wp_tokenizer *t) { return t->mask; }

/* ---- scratch ------------------------------------------------------------------ */

/* Grows an array to hold need elements of elem bytes (doubling, so
 * appends are amortised O(1)); returns the new pointer, or NULL with p and
 * *cap untouched. */
static void *wp_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return NULL;
        nc *= 2;
    }
    void *q = realloc(p, nc * elem);
    if (!q) return NULL;
    *cap = nc;
    return q;
}

/* A scratch sized for expect_len bytes of input, so that the first call
 * already runs without allocating. */
struct wp_scratch *wp_scratch_new(size_t expect_len)
{
    struct wp_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    void *p;
    if (!(p = wp_grow(s->a.v, &s->a.cap, expect_len + 3, sizeof(int32_t)))) goto fail;
    s->a.v = p;
    if (!(p = wp_grow(s->b.v, &s->b.cap, 16, sizeof(int32_t)))) goto fail;
    s->b.v = p;
    if (!(p = wp_grow(s->word, &s->word_cap, 512, 1))) goto fail;
    s->word = p;
    if (!(p = wp_grow(s->hs, &s->hs_cap, 512, sizeof(uint64_t)))) goto fail;
    s->hs = p;
    return s;
fail:
    wp_scratch_destroy(s);
    return NULL;
}

/* Shrinks an array of *cap elements of elem bytes to WP_SCRATCH_KEEP bytes
 * when it holds more. A failed shrink keeps the block, which is as large;
 * *cap says the smaller count either way, which is always safe. */
static void *wp_shrink(void *p, size_t *cap, size_t elem)
{
    if (!p || *cap * elem <= WP_SCRATCH_KEEP) return p;
    size_t nc = WP_SCRATCH_KEEP / elem;
    void *q = realloc(p, nc * elem);
    *cap = nc;
    return q ? q : p;
}

/* Gives back what a call on a huge input grew (one 1M-character
 * row left 20 MB behind): the id arrays, the canonical-ordering run and
 * the normalizer's output. The word buffer and its hashes are bounded by
 * max_word_chars already. */
static void wp_scratch_trim(struct wp_scratch *s)
{
    s->a.v = wp_shrink(s->a.v, &s->a.cap, sizeof(int32_t));
    if (s->a.n > s->a.cap) s->a.n = 0;
    s->b.v = wp_shrink(s->b.v, &s->b.cap, sizeof(int32_t));
    if (s->b.n > s->b.cap) s->b.n = 0;
    if (s->run_cap * sizeof(*s->run) > WP_SCRATCH_KEEP) {
        size_t c1 = s->run_cap, c2 = s->run_cap;
        s->run = wp_shrink(s->run, &c1, sizeof(*s->run));
        s->run_tmp = wp_shrink(s->run_tmp, &c2, sizeof(*s->run_tmp));
        s->run_cap = c1 < c2 ? c1 : c2;
        s->run_n = 0;
    }
    s->norm = wp_shrink(s->norm, &s->norm_cap, 1);
    if (s->norm_n > s->norm_cap) s->norm_n = 0;
}

size_t wp_scratch_bytes(const struct wp_scratch *s)
{
    return (s->a.cap + s->b.cap) * sizeof(int32_t) + s->word_cap + s->hs_cap * sizeof(uint64_t) +
           s->run_cap * (sizeof(*s->run) + sizeof(*s->run_tmp)) + s->norm_cap;
}

/* Frees everything s owns. */
void wp_scratch_destroy(struct wp_scratch *s)
{
    if (!s) return;
    free(s->a.v);
    free(s->b.v);
    free(s->word);
    free(s->hs);
    free(s->run);
    free(s->run_tmp);
    free(s->norm);
    free(s);
}

/* ---- the pipeline ---------------------------------------------------------------- */

/* One call's state: where characters go (ids of one sequence, or the
 * normalized text for wp_normalize) and a sticky out-of-memory flag, so
 * the per-character stages need no error plumbing. */
struct wp_enc {
    const struct wp_tokenizer *t;
    struct wp_scratch *s;
    struct wp_ivec *out;
    int normalize_only;
    int oom;
};

/* Appends one id to the current sequence. */
static void wp_push(struct wp_enc *e, int32_t id)
{
    struct wp_ivec *v = e->out;
    if (v->n == v->cap) {
        void *p = wp_grow(v->v, &v->cap, v->n + 1, sizeof(int32_t));
        if (!p) {
            e->oom = 1;
            return;
        }
        v->v = p;
    }
    v->v[v->n++] = id;
}

/* WordPiece over the finished word: at each position the longest
 * vocabulary entry (prefixed after the first piece) wins; no match at some
 * position, or too many characters, makes the whole word the unk token.
 * Candidate ends are tried from the longest a vocabulary entry can be,
 * with every candidate's hash taken from one forward pass, so a word costs
 * O(length x longest token). */
static void wp_wordpiece(struct wp_enc *e)
{
    const struct wp_tokenizer *t = e->t;
    struct wp_scratch *s = e->s;
    if (s->word_chars > t->conf.max_word_chars) {
        wp_push(e, t->unk);
        return;
    }
    const char *w = s->word;
    size_t n = s->word_n;
    size_t mark = e->out->n;
    size_t st = 0;
    while (st < n) {
        uint64_t h = st == 0 ? WP_FNV_OFFSET : t->prefix_hash;
        size_t maxl = st == 0 ? t->max_start : t->max_cont;
        size_t lim = n - st < maxl ? n : st + maxl;
        for (size_t k = st; k < lim; k++) {
            h = wp_fnv(h, (unsigned char)w[k]);
            s->hs[k - st] = h;
        }
        int32_t id = -1;
        size_t end;
        for (end = lim; end > st; end--) {
            if (end < n && ((unsigned char)w[end] & 0xC0) == 0x80) continue;
            id = wp_lookup(t, s->hs[end - st - 1], t->conf.prefix, st ? t->prefix_len : 0, w + st,
                           end - st);
            if (id >= 0) break;
        }
        if (id < 0) {
            e->out->n = mark;
            wp_push(e, t->unk);
            return;
        }
        wp_push(e, id);
        st = end;
    }
}

/* Ends the current word, if any, and tokenizes it. */
static void wp_end_word(struct wp_enc *e)
{
    struct wp_scratch *s = e->s;
    if (s->word_chars == 0) return;
    wp_wordpiece(e);
    s->word_n = 0;
    s->word_chars = 0;
}

/* Adds a character to the current word. Only the first max_word_chars are
 * stored (a longer word is the unk token whatever it holds), so the word
 * buffer stays small however long the input's words are. */
static void wp_word_add(struct wp_enc *e, uint32_t cp)
{
    struct wp_scratch *s = e->s;
    s->word_chars++;
    if (s->word_chars > e->t->conf.max_word_chars) return;
    if (s->word_n + 4 > s->word_cap) {
        void *p = wp_grow(s->word, &s->word_cap, s->word_n + 4, 1);
        if (!p) {
            e->oom = 1;
            return;
        }
        s->word = p;
    }
    if (s->word_cap > s->hs_cap) {
        void *p = wp_grow(s->hs, &s->hs_cap, s->word_cap, sizeof(uint64_t));
        if (!p) {
            e->oom = 1;
            return;
        }
        s->hs = p;
    }
    s->word_n += uni_utf8_encode(cp, s->word + s->word_n);
}

/* Appends a character to wp_normalize's output. */
static void wp_norm_add(struct wp_enc *e, uint32_t cp)
{
    struct wp_scratch *s = e->s;
    if (s->norm_n + 4 > s->norm_cap) {
        void *p = wp_grow(s->norm, &s->norm_cap, s->norm_n + 4, 1);
        if (!p) {
            e->oom = 1;
            return;
        }
        s->norm = p;
    }
    s->norm_n += uni_utf8_encode(cp, s->norm + s->norm_n);
}

/* Pre-tokenizer: whitespace ends a word; punctuation ends it and is a word
 * of its own; anything else extends it. */
static void wp_stage_pre(struct wp_enc *e, uint32_t cp)
{
    if (e->normalize_only) {
        wp_norm_add(e, cp);
        return;
    }
    int cat = cp < 0x80 ? 0 : uni_category(cp);
    if (uni_is_ws(cp, cat)) {
        wp_end_word(e);
    } else if (uni_is_punct(cp, cat)) {
        wp_end_word(e);
        wp_word_add(e, cp);
        wp_end_word(e);
    } else {
        wp_word_add(e, cp);
    }
}

/* Normalizer, last step: lowercase, character by character, as Rust's
 * char::to_lowercase (context-free: a final sigma stays σ). */
static void wp_stage_lower(struct wp_enc *e, uint32_t cp)
{
    if (!e->t->conf.lowercase) {
        wp_stage_pre(e, cp);
    } else if (cp < 0x80) {
        wp_stage_pre(e, cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    } else if (cp == 0x130) {
        wp_stage_pre(e, 'i');
        wp_stage_pre(e, 0x307);
    } else {
        wp_stage_pre(e, uni_lower(cp));
    }
}

/* Releases the held run of nonstarters in canonical order: stable by
 * combining class. Short runs (all real text) use insertion sort; long
 * ones, which only hostile input makes, a counting sort, so a megabyte of
 * combining marks stays linear. */
static void wp_flush_run(struct wp_enc *e)
{
    struct wp_scratch *s = e->s;
    size_t n = s->run_n;
    if (n == 0) return;
    struct wp_runc *r = s->run;
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            struct wp_runc x = r[i];
            size_t j = i;
            while (j > 0 && r[j - 1].ccc > x.ccc) {
                r[j] = r[j - 1];
                j--;
            }
            r[j] = x;
        }
    } else {
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[r[i].ccc + 1]++;
        for (size_t c = 1; c < 257; c++) count[c] += count[c - 1];
        for (size_t i = 0; i < n; i++) s->run_tmp[count[r[i].ccc]++] = r[i];
        r = s->run_tmp;
    }
    s->run_n = 0;
    for (size_t i = 0; i < n; i++) wp_stage_lower(e, r[i].cp);
}

/* Holds a nonstarter back until the run it belongs to ends. */
static void wp_run_add(struct wp_enc *e, uint32_t cp, uint32_t ccc)
{
    struct wp_scratch *s = e->s;
    if (s->run_n == s->run_cap) {
        size_t cap = s->run_cap, cap2 = s->run_cap;
        void *p = wp_grow(s->run, &cap, s->run_n + 1, sizeof(*s->run));
        if (!p) {
            e->oom = 1;
            return;
        }
        s->run = p;
        void *q = wp_grow(s->run_tmp, &cap2, cap, sizeof(*s->run_tmp));
        if (!q) {
            e->oom = 1;
            return;
        }
        s->run_tmp = q;
        s->run_cap = cap < cap2 ? cap : cap2;
    }
    s->run[s->run_n].cp = cp;
    s->run[s->run_n].ccc = ccc;
    s->run_n++;
}

/* Normalizer, strip_accents: canonical decomposition (NFD: full
 * decomposition, then each run of nonstarters put in combining-class
 * order), dropping the nonspacing marks. A mark that is dropped still
 * counts for where runs begin and end, as NFD runs before the filter. */
static void wp_stage_strip(struct wp_enc *e, uint32_t cp)
{
    if (!e->t->strip) {
        wp_stage_lower(e, cp);
        return;
    }
    if (cp < 0x80) {
        wp_flush_run(e);
        wp_stage_lower(e, cp);
        return;
    }
    int32_t d[UNI_DECOMP_MAX];
    int nd = uni_decompose(cp, d, UNI_DECOMP_MAX);
    for (int i = 0; i < nd; i++) {
        uint32_t c = (uint32_t)d[i];
        const utf8proc_property_t *p = utf8proc_get_property(d[i]);
        int mn = uni_is_mn(c, p->category);
        if (p->combining_class == 0) {
            wp_flush_run(e);
            if (!mn) wp_stage_lower(e, c);
        } else if (!mn) {
            wp_run_add(e, c, p->combining_class);
        }
    }
}

/* Normalizer, first steps: clean_text then handle_chinese_chars, for one
 * input character. */
static void wp_feed(struct wp_enc *e, uint32_t cp)
{
    const struct wp_conf *c = &e->t->conf;
    int cat = cp < 0x80 ? 0 : uni_category(cp);
    if (c->clean_text) {
        if (cp == 0 || cp == 0xFFFD || uni_is_control(cp, cat)) return;
        if (uni_is_ws(cp, cat)) cp = ' ';
    }
    if (c->chinese_chars && cp >= 0x3400 && uni_is_cjk(cp)) {
        wp_stage_strip(e, ' ');
        wp_stage_strip(e, cp);
        wp_stage_strip(e, ' ');
    } else {
        wp_stage_strip(e, cp);
    }
}

/* Ends a stretch of normal text (at a special token or the end): releases
 * held characters and the last word. */
static void wp_end_segment(struct wp_enc *e)
{
    wp_flush_run(e);
    if (!e->normalize_only) wp_end_word(e);
}

/* Runs one sequence through the whole pipeline into out. Returns 0, or an
 * enum wp_err with errstr filled (which names the sequence). */
static int wp_run(struct wp_enc *e, const char *text, size_t len, struct wp_ivec *out,
                  const char *which, char *errstr, size_t errstr_size)
{
    const struct wp_tokenizer *t = e->t;
    struct wp_scratch *s = e->s;
    const unsigned char *p = (const unsigned char *)text;
    e->out = out;
    out->n = 0;
    s->word_n = s->word_chars = s->run_n = 0;
    size_t i = 0;
    while (i < len) {
        if (!e->normalize_only && t->tn && (t->first[p[i] >> 3] >> (p[i] & 7) & 1)) {
            size_t ml = 0;
            int32_t id = wp_trie_match(t, p + i, len - i, &ml);
            if (id >= 0) {
                wp_end_segment(e);
                wp_push(e, id);
                i += ml;
                continue;
            }
        }
        uint32_t cp;
        size_t k = uni_utf8_decode(p + i, len - i, &cp);
        if (!k) {
            wp_seterr(errstr, errstr_size, "%s is not valid UTF-8 at byte %zu (0x%02x)", which, i,
                      p[i]);
            return WP_ERR_UTF8;
        }
        wp_feed(e, cp);
        i += k;
    }
    wp_end_segment(e);
    if (e->oom) {
        wp_seterr(errstr, errstr_size, "out of memory encoding %zu bytes of %s", len, which);
        return WP_ERR_NOMEM;
    }
    return 0;
}

/* Encodes text (and pair) and lays out [CLS] A [SEP] (B [SEP]), truncated
 * as asked; see wordpiece.h. */
static int wp_encode_in(const struct wp_tokenizer *t, struct wp_scratch *s, const char *text,
                        size_t len, const char *pair, size_t pair_len, size_t max_len,
                        int truncate, int32_t *ids, int32_t *type_ids, size_t cap,
                        size_t *full_len, char *errstr, size_t errstr_size)
{
    if ((!text && len) || (!pair && pair_len) || (!ids && cap)) {
        wp_seterr(errstr, errstr_size, "wp_encode: NULL buffer with a non-zero length");
        return WP_ERR_ARG;
    }
    struct wp_enc e = {.t = t, .s = s};
    int rc = wp_run(&e, text ? text : "", len, &s->a, "text", errstr, errstr_size);
    if (rc) return rc;
    s->b.n = 0;
    if (pair && (rc = wp_run(&e, pair, pair_len, &s->b, "pair", errstr, errstr_size))) return rc;
    size_t nspec = pair ? 3 : 2;
    size_t na = s->a.n, nb = s->b.n;
    size_t full = na + nb + nspec;
    if (full_len) *full_len = full;
    if (max_len && full > max_len) {
        if (!truncate) {
            wp_seterr(errstr, errstr_size, "input is %zu tokens, over the limit of %zu", full,
                      max_len);
            return WP_ERR_TOO_LONG;
        }
        if (max_len < nspec) {
            wp_seterr(errstr, errstr_size,
                      "max_len %zu cannot hold the %zu special tokens of a %s", max_len, nspec,
                      pair ? "pair" : "sequence");
            return WP_ERR_ARG;
        }
        if (pair) /* the reference cuts each side to max_len before the pair rule */
            trunc_longest_first(&na, &nb, na < max_len ? na : max_len,
                                nb < max_len ? nb : max_len, max_len - nspec);
        else na = max_len - nspec;
    }
    size_t need = na + nb + nspec;
    if (need > INT_MAX) {
        wp_seterr(errstr, errstr_size, "the encoding needs %zu entries, more than an int counts",
                  need);
        return WP_ERR_CAP;
    }
    if (need > cap) {
        wp_seterr(errstr, errstr_size, "the encoding needs %zu entries, the buffer holds %zu", need,
                  cap);
        return WP_ERR_CAP;
    }
    size_t o = 0;
    ids[o++] = t->cls;
    memcpy(ids + o, s->a.v, na * sizeof(int32_t));
    o += na;
    ids[o++] = t->sep;
    if (pair) {
        memcpy(ids + o, s->b.v, nb * sizeof(int32_t));
        o += nb;
        ids[o++] = t->sep;
    }
    if (type_ids) {
        size_t first = na + 2;
        for (size_t i = 0; i < o; i++) type_ids[i] = i < first ? 0 : 1;
    }
    return (int)o;
}

/* wp_encode_in, then what the call grew past WP_SCRATCH_KEEP is given
 * back: the ids are in the caller's buffers by now. */
int wp_encode(const struct wp_tokenizer *t, struct wp_scratch *s, const char *text, size_t len,
              const char *pair, size_t pair_len, size_t max_len, int truncate, int32_t *ids,
              int32_t *type_ids, size_t cap, size_t *full_len, char *errstr, size_t errstr_size)
{
    int rc = wp_encode_in(t, s, text, len, pair, pair_len, max_len, truncate, ids, type_ids,
                          cap, full_len, errstr, errstr_size);
    wp_scratch_trim(s);
    return rc;
}

/* The normalizer alone, into the scratch's text buffer (what the last
 * call grew is given back first: its result was borrowed until now). */
const char *wp_normalize(const struct wp_tokenizer *t, struct wp_scratch *s, const char *text,
                         size_t len, size_t *out_len, char *errstr, size_t errstr_size)
{
    if (!text && len) {
        wp_seterr(errstr, errstr_size, "wp_normalize: NULL text with a non-zero length");
        return NULL;
    }
    struct wp_enc e = {.t = t, .s = s, .normalize_only = 1};
    wp_scratch_trim(s);
    s->norm_n = 0;
    if (wp_run(&e, text ? text : "", len, &s->a, "text", errstr, errstr_size) != 0) return NULL;
    if (!s->norm) {
        void *p = wp_grow(s->norm, &s->norm_cap, 1, 1);
        if (!p) {
            wp_seterr(errstr, errstr_size, "out of memory");
            return NULL;
        }
        s->norm = p;
    }
    *out_len = s->norm_n;
    return s->norm;
}

/* ---- decoding ------------------------------------------------------------------ */

/* The reference decoder's cleanup, one replacement after another, each
 * over the whole piece left to right; every one shortens or keeps the
 * length, so it runs in place. Returns the new length. */
static size_t wp_cleanup(char *p, size_t n)
{
    static const struct {
        const char *from, *to;
    } rep[] = {
        {" .", "."},       {" ?", "?"},   {" !", "!"},   {" ,", ","},
        {" ' ", "'"},      {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"},
        {" 's", "'s"},     {" 've", "'ve"}, {" 're", "'re"},
    };
    for (size_t k = 0; k < sizeof(rep) / sizeof(rep[0]); k++) {
        size_t fl = strlen(rep[k].from), tl = strlen(rep[k].to), r = 0, w = 0;
        while (r < n) {
            if (n - r >= fl && memcmp(p + r, rep[k].from, fl) == 0) {
                memmove(p + w, rep[k].to, tl);
                w += tl;
                r += fl;
            } else {
                p[w++] = p[r++];
            }
        }
        n = w;
    }
    return n;
}

/* The reference's decode with skip_special_tokens, then its WordPiece
 * decoder, piece by piece (each token is one piece: the cleanup applies
 * within a piece, as the reference's does). */
int wp_decode(const struct wp_tokenizer *t, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    if ((!ids && n) || (!buf && cap)) return WP_ERR_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids) return WP_ERR_ARG;
    char *piece = malloc(t->max_start + 2);
    if (!piece) return WP_ERR_NOMEM;
    size_t plen_prefix = strlen(t->dec_prefix), total = 0;
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        if (t->special[ids[i]]) continue;
        const char *tok = t->pool + t->tok_off[ids[i]];
        size_t tl = t->tok_len[ids[i]], m = 0;
        if (first) {
            memcpy(piece, tok, tl);
            m = tl;
        } else if (!t->dec_none && tl >= plen_prefix &&
                   memcmp(tok, t->dec_prefix, plen_prefix) == 0) {
            memcpy(piece, tok + plen_prefix, tl - plen_prefix);
            m = tl - plen_prefix;
        } else {
            piece[0] = ' ';
            memcpy(piece + 1, tok, tl);
            m = tl + 1;
        }
        if (!t->dec_none && t->dec_cleanup) m = wp_cleanup(piece, m);
        if (cap && total < cap - 1) {
            size_t room = cap - 1 - total;
            memcpy(buf + total, piece, m < room ? m : room);
        }
        total += m;
        first = 0;
    }
    free(piece);
    if (cap) buf[total < cap - 1 ? total : cap - 1] = '\0';
    if (total > INT_MAX) return WP_ERR_CAP;
    return (int)total;
}

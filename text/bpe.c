/* bpe.c - BPE behind the tokenizer interface (tokenizer_impl.h's table,
 * model.type "BPE"), byte-level or SentencePiece-style: encoding and
 * decoding as bpe_impl.h describes, the loaders being in bpe_load.c and
 * the SentencePiece-style steps in bpe_sp.c.
 *
 * Encoding keeps only the current sequence's ids and the current piece's
 * symbols and merge queue, all in the caller's scratch; nothing is cached
 * between calls (the reference caches words; a cache here would grow with
 * the input). A scratch that grew past BPE_SCRATCH_KEEP for a hostile
 * input gives the memory back when the call ends.
 *
 * Threads: a loaded tokenizer is read-only; any number of threads encode
 * at once, each with its own scratch. Ownership: as tokenizer.h says. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "bpe_impl.h"
#include "tokenizer_impl.h"
#include "truncate.h"
#include "unicode.h"

/* Bytes (or entries) a scratch buffer keeps between calls; more is freed
 * at the end of the call that needed it. */
#define BPE_SCRATCH_KEEP ((size_t)1 << 16)

struct bpe_ivec {
    int32_t *v;
    size_t n, cap;
};

/* One symbol of the word being merged: a token id and its neighbours. */
struct bpe_sym {
    int32_t id;
    int32_t prev, next;
    int alive;
};

/* A candidate merge: lowest rank first, then leftmost, as the reference's
 * queue orders them. */
struct bpe_cand {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
};

struct bpe_scratch {
    struct bpe_ivec a, b;        /* ids of each sequence */
    char *norm;                  /* NFC's output */
    size_t norm_cap;
    int32_t *u32;                /* utf8proc's work area */
    size_t u32_cap;
    char *pre;                   /* a piece with its prefix space */
    size_t pre_cap;
    char *word;                  /* a piece as byte characters (ignore_merges) */
    size_t word_cap;
    struct bpe_sym *sym;
    size_t sym_cap;
    struct bpe_cand *heap;
    size_t heap_cap, heap_n;
    pcre2_match_data *md;
    struct bpe_buf nb[2];        /* the Prepend/Replace normalizer's output */
    struct bpe_buf mb;           /* Metaspace's output */
    int32_t *init;               /* a word's first symbols (SentencePiece-style) */
    size_t init_cap;
};

/* ---- scratch ----------------------------------------------------------------------- */

/* See bpe_impl.h. */
int bpe_grow(void *pp, size_t *cap, size_t need, size_t elem)
{
    void **p = pp;
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 4 / elem) return -1;
        nc *= 2;
    }
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* Frees a buffer that grew past the keep size, so one hostile input does
 * not pin its memory for the scratch's life. */
static void bpe_trim(void *pp, size_t *cap, size_t elem)
{
    void **p = pp;
    if (*cap * elem <= BPE_SCRATCH_KEEP * sizeof(int32_t)) return;
    free(*p);
    *p = NULL;
    *cap = 0;
}

static void *bpe_scratch_new(size_t expect_len)
{
    struct bpe_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    size_t n = expect_len + 8;
    if (n > BPE_SCRATCH_KEEP) n = BPE_SCRATCH_KEEP;
    if (bpe_grow(&s->a.v, &s->a.cap, n, sizeof(int32_t)) ||
        bpe_grow(&s->b.v, &s->b.cap, 64, sizeof(int32_t)) ||
        bpe_grow(&s->sym, &s->sym_cap, 256, sizeof(*s->sym)) ||
        bpe_grow(&s->heap, &s->heap_cap, 512, sizeof(*s->heap)) ||
        bpe_grow(&s->pre, &s->pre_cap, 256, 1) || bpe_grow(&s->word, &s->word_cap, 512, 1) ||
        !(s->md = pcre2_match_data_create(4, NULL))) {
        free(s->a.v);
        free(s->b.v);
        free(s->sym);
        free(s->heap);
        free(s->pre);
        free(s->word);
        free(s);
        return NULL;
    }
    return s;
}

static void bpe_scratch_destroy(void *p)
{
    struct bpe_scratch *s = p;
    if (!s) return;
    free(s->a.v);
    free(s->b.v);
    free(s->norm);
    free(s->u32);
    free(s->pre);
    free(s->word);
    free(s->sym);
    free(s->heap);
    pcre2_match_data_free(s->md);
    free(s->nb[0].p);
    free(s->nb[1].p);
    free(s->mb.p);
    free(s->init);
    free(s);
}

/* ---- one call's state ------------------------------------------------------------- */

struct bpe_enc {
    const struct bpe_tok *t;
    struct bpe_scratch *s;
    struct bpe_ivec *out;
    int err;                     /* sticky: a tokenizer_err */
    int rx_rc;                   /* PCRE2's code when a match failed */
    void (*piece_fn)(void *ctx, const char *piece, size_t n); /* bpe_pre_tokenize's */
    void *piece_ctx;
    const char *text0;           /* the sequence's raw text */
    const char *norm0;           /* the normalized segment being split */
    int seg0;                    /* it starts at the raw text's start */
};

static void bpe_push(struct bpe_enc *e, int32_t id)
{
    struct bpe_ivec *v = e->out;
    if (v->n == v->cap && bpe_grow(&v->v, &v->cap, v->n + 1, sizeof(int32_t))) {
        e->err = TOKENIZER_ERR_NOMEM;
        return;
    }
    v->v[v->n++] = id;
}

/* ---- BPE over one piece ---------------------------------------------------------- */

static void bpe_heap_push(struct bpe_scratch *s, struct bpe_cand c)
{
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        struct bpe_cand *q = &s->heap[p];
        if (q->rank < c.rank || (q->rank == c.rank && q->pos < c.pos)) break;
        s->heap[i] = *q;
        i = p;
    }
    s->heap[i] = c;
}

static struct bpe_cand bpe_heap_pop(struct bpe_scratch *s)
{
    struct bpe_cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const struct bpe_cand *best = &last;
        if (l < n && (s->heap[l].rank < best->rank ||
                      (s->heap[l].rank == best->rank && s->heap[l].pos < best->pos))) {
            m = l;
            best = &s->heap[l];
        }
        if (l + 1 < n && (s->heap[l + 1].rank < best->rank ||
                          (s->heap[l + 1].rank == best->rank && s->heap[l + 1].pos < best->pos)))
            m = l + 1;
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Queues the merge of symbol pos with its next, if the vocabulary has one. */
static void bpe_cand_at(const struct bpe_tok *t, struct bpe_scratch *s, int32_t pos)
{
    int32_t nx = s->sym[pos].next, nid;
    if (nx < 0) return;
    uint32_t rank = bpe_merge(t, s->sym[pos].id, s->sym[nx].id, &nid);
    if (rank != UINT32_MAX) bpe_heap_push(s, (struct bpe_cand){rank, (uint32_t)pos, nid});
}

/* The piece's bytes w[0..n) as tokens: one symbol per byte character
 * (one without a token becomes the model's unk, fused if asked, or is
 * dropped), then merges by rank until none applies. */
static void bpe_word(struct bpe_enc *e, const unsigned char *w, size_t n)
{
    const struct bpe_tok *t = e->t;
    struct bpe_scratch *s = e->s;
    if (n == 0) return;
    if (e->piece_fn) {
        e->piece_fn(e->piece_ctx, (const char *)w, n);
        return;
    }
    if (t->ignore_merges && !t->sp) {
        if (bpe_grow(&s->word, &s->word_cap, 2 * n, 1)) {
            e->err = TOKENIZER_ERR_NOMEM;
            return;
        }
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(s->word + m, t->byte_utf8[w[i]], t->byte_utf8_len[w[i]]);
            m += t->byte_utf8_len[w[i]];
        }
        int32_t id = bpe_find(t, s->word, m);
        if (id >= 0) {
            bpe_push(e, id);
            return;
        }
    }
    if (t->sp && t->ignore_merges) {
        int32_t id = bpe_find_model(t, (const char *)w, n);
        if (id >= 0) {
            bpe_push(e, id);
            return;
        }
    }
    if (n == 1 && !t->sp) {
        int32_t id = t->byte_id[w[0]] >= 0 ? t->byte_id[w[0]] : t->model_unk;
        if (id >= 0) bpe_push(e, id);
        return;
    }
    if (n > INT32_MAX / 2 || bpe_grow(&s->sym, &s->sym_cap, n, sizeof(*s->sym)) ||
        bpe_grow(&s->heap, &s->heap_cap, 2 * n, sizeof(*s->heap)) ||
        (t->sp && bpe_grow(&s->init, &s->init_cap, n, sizeof(int32_t)))) {
        e->err = TOKENIZER_ERR_NOMEM;
        return;
    }
    int32_t ns = 0;
    if (t->sp) {
        size_t k = bpe_sp_symbols(t, w, n, s->init);
        for (size_t i = 0; i < k; i++) {
            s->sym[ns] = (struct bpe_sym){s->init[i], ns - 1, -1, 1};
            if (ns > 0) s->sym[ns - 1].next = ns;
            ns++;
        }
    }
    for (size_t i = 0; i < n && !t->sp; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0) {
            if (t->model_unk < 0) continue;
            if (t->fuse_unk && ns > 0 && s->sym[ns - 1].id == t->model_unk) continue;
            id = t->model_unk;
        }
        s->sym[ns] = (struct bpe_sym){id, ns - 1, -1, 1};
        if (ns > 0) s->sym[ns - 1].next = ns;
        ns++;
    }
    s->heap_n = 0;
    for (int32_t i = 0; i + 1 < ns; i++) bpe_cand_at(t, s, i);
    while (s->heap_n) {
        struct bpe_cand c = bpe_heap_pop(s);
        struct bpe_sym *a = &s->sym[c.pos];
        if (!a->alive || a->next < 0) continue;
        struct bpe_sym *b = &s->sym[a->next];
        int32_t nid;
        if (bpe_merge(t, a->id, b->id, &nid) == UINT32_MAX || nid != c.new_id) continue;
        a->id = nid;
        b->alive = 0;
        a->next = b->next;
        if (b->next >= 0) s->sym[b->next].prev = (int32_t)c.pos;
        if (a->prev >= 0) bpe_cand_at(t, s, a->prev);
        bpe_cand_at(t, s, (int32_t)c.pos);
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = s->sym[i].next) bpe_push(e, s->sym[i].id);
}

/* ---- pre-tokenizer ------------------------------------------------------------------- */

/* Calls fn(e, level, piece) for the pieces re makes of p[0..n): each
 * match, and the text between matches unless removed (Isolated or
 * Removed); empty pieces are skipped, as the reference drops them. An
 * empty match right after a match is ignored and otherwise only ends the
 * text before it, as Oniguruma's iterator gives them. */
static void bpe_split_by(struct bpe_enc *e, const pcre2_code *re, int removed, size_t level,
                         const unsigned char *p, size_t n,
                         void (*fn)(struct bpe_enc *, size_t, const unsigned char *, size_t))
{
    size_t off = 0, prev = 0, last_end = (size_t)-1;
    while (off <= n && !e->err) {
        int rc = pcre2_match(re, p, n, off, PCRE2_NO_UTF_CHECK, e->s->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            e->err = TOKENIZER_ERR_NOMEM;
            e->rx_rc = rc;
            return;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->s->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me) {
            if (ms != last_end) {
                if (ms > prev) fn(e, level, p + prev, ms - prev);
                prev = ms;
            }
            if (ms >= n) break;
            off = ms + 1;
            while (off < n && (p[off] & 0xC0) == 0x80) off++;
            continue;
        }
        if (ms > prev) fn(e, level, p + prev, ms - prev);
        if (!removed) fn(e, level, p + ms, me - ms);
        prev = off = last_end = me;
    }
    if (n > prev && !e->err) fn(e, level, p + prev, n - prev);
}

static void bpe_word_cb(struct bpe_enc *e, size_t level, const unsigned char *p, size_t n)
{
    (void)level;
    bpe_word(e, p, n);
}

/* ByteLevel over one piece: a space before it if asked and it lacks one,
 * then GPT-2's regex (or the piece whole), each word to BPE. */
static void bpe_bytelevel(struct bpe_enc *e, const unsigned char *p, size_t n)
{
    const struct bpe_tok *t = e->t;
    struct bpe_scratch *s = e->s;
    if (t->add_prefix_space && p[0] != ' ') {
        if (bpe_grow(&s->pre, &s->pre_cap, n + 1, 1)) {
            e->err = TOKENIZER_ERR_NOMEM;
            return;
        }
        s->pre[0] = ' ';
        memcpy(s->pre + 1, p, n);
        p = (const unsigned char *)s->pre;
        n++;
    }
    if (t->bl_re) bpe_split_by(e, t->bl_re, 0, 0, p, n, bpe_word_cb);
    else bpe_word(e, p, n);
}

static void bpe_word_ctx(void *ctx, const unsigned char *w, size_t n)
{
    bpe_word(ctx, w, n);
}

/* The SentencePiece-style pre-tokenizer: Metaspace, or the piece whole.
 * For prepend_scheme "first", a piece starts the original text when it
 * starts a normalized segment that starts the raw text. */
static void bpe_sp_pre(struct bpe_enc *e, const unsigned char *p, size_t n)
{
    const struct bpe_tok *t = e->t;
    if (!t->meta) {
        bpe_word(e, p, n);
        return;
    }
    int at0 = e->seg0 && (const char *)p == e->norm0;
    if (bpe_sp_metaspace(t, (const char *)p, n, at0, &e->s->mb, bpe_word_ctx, e))
        e->err = TOKENIZER_ERR_NOMEM;
}

/* The pre-tokenizer's Split steps from level on, then ByteLevel (or the
 * SentencePiece-style pre-tokenizer). */
static void bpe_pre(struct bpe_enc *e, size_t level, const unsigned char *p, size_t n)
{
    const struct bpe_tok *t = e->t;
    if (level == t->n_split) {
        if (t->sp) bpe_sp_pre(e, p, n);
        else bpe_bytelevel(e, p, n);
        return;
    }
    bpe_split_by(e, t->split[level].re, t->split[level].removed, level + 1, p, n, bpe_pre);
}

/* ---- added tokens --------------------------------------------------------------------- */

/* The longest added token of tr starting at p (n bytes): its id, *len
 * set; -1 if none. */
static int32_t bpe_trie_match(const struct bpe_trie *tr, const unsigned char *p, size_t n,
                              size_t *len)
{
    const struct bpe_tnode *node = &tr->tn[0];
    int32_t best = -1;
    for (size_t i = 0;; i++) {
        if (node->id >= 0) {
            best = node->id;
            *len = i;
        }
        if (i == n || node->n_edges == 0) break;
        const struct bpe_tedge *ed = tr->te + node->edge0;
        size_t lo = 0, hi = node->n_edges;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (ed[mid].byte < p[i]) lo = mid + 1;
            else hi = mid;
        }
        if (lo == node->n_edges || ed[lo].byte != p[i]) break;
        node = &tr->tn[ed[lo].child];
    }
    return best;
}

/* Start of the character that ends at p + i (i > 0). */
static size_t bpe_char_back(const unsigned char *p, size_t i)
{
    do i--;
    while (i > 0 && (p[i] & 0xC0) == 0x80);
    return i;
}

static int bpe_is_ws_at(const unsigned char *p, size_t n, size_t *len)
{
    uint32_t cp;
    size_t k = uni_utf8_decode(p, n, &cp);
    *len = k ? k : 1;
    return k && uni_is_ws(cp, cp < 0x80 ? 0 : uni_category(cp));
}

/* Splits p[0..n) at the added tokens of tr (leftmost, longest; lstrip and
 * rstrip take the whitespace beside a match), pushing each match's id and
 * handing the text between to fn. */
static void bpe_added_split(struct bpe_enc *e, const struct bpe_trie *tr, const unsigned char *p,
                            size_t n, void (*fn)(struct bpe_enc *, const unsigned char *, size_t))
{
    size_t pos = 0, i = 0;
    if (tr->tn) {
        while (i < n && !e->err) {
            size_t ml = 0;
            int32_t id = -1;
            if (tr->first[p[i] >> 3] >> (p[i] & 7) & 1) id = bpe_trie_match(tr, p + i, n - i, &ml);
            if (id < 0) {
                i++;
                continue;
            }
            size_t start = i, stop = i + ml, k;
            unsigned char f = e->t->aflags[id];
            if (f & BPE_A_LSTRIP)
                while (start > pos) {
                    size_t b = bpe_char_back(p, start);
                    if (b < pos || !bpe_is_ws_at(p + b, n - b, &k)) break;
                    start = b;
                }
            if (f & BPE_A_RSTRIP)
                while (stop < n && bpe_is_ws_at(p + stop, n - stop, &k)) stop += k;
            if (start > pos) fn(e, p + pos, start - pos);
            bpe_push(e, id);
            pos = i = stop;
        }
    }
    if (n > pos && !e->err) fn(e, p + pos, n - pos);
}

static void bpe_pre0(struct bpe_enc *e, const unsigned char *p, size_t n)
{
    bpe_pre(e, 0, p, n);
}

/* Text between raw added tokens: normalized, then split at the
 * normalized added tokens, then pre-tokenized. */
static void bpe_plain(struct bpe_enc *e, const unsigned char *p, size_t n)
{
    const struct bpe_tok *t = e->t;
    struct bpe_scratch *s = e->s;
    e->seg0 = (const char *)p == e->text0;
    if (t->nfc) {
        size_t ascii = 0;
        while (ascii < n && p[ascii] < 0x80) ascii++;
        if (ascii < n) {
            /* utf8proc decomposes into s->u32, composes in place and
             * re-encodes into the same buffer; then copied out */
            utf8proc_ssize_t need = utf8proc_decompose(p, (utf8proc_ssize_t)n, s->u32,
                                                       (utf8proc_ssize_t)s->u32_cap,
                                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (need >= 0 && (size_t)need > s->u32_cap) {
                if (bpe_grow(&s->u32, &s->u32_cap, (size_t)need + 1, sizeof(int32_t))) {
                    e->err = TOKENIZER_ERR_NOMEM;
                    return;
                }
                need = utf8proc_decompose(p, (utf8proc_ssize_t)n, s->u32,
                                          (utf8proc_ssize_t)s->u32_cap,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            }
            utf8proc_ssize_t m = need < 0 ? need
                                          : utf8proc_reencode(s->u32, need,
                                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (m < 0) {
                e->err = TOKENIZER_ERR_NOMEM;
                return;
            }
            if (bpe_grow(&s->norm, &s->norm_cap, (size_t)m + 1, 1)) {
                e->err = TOKENIZER_ERR_NOMEM;
                return;
            }
            memcpy(s->norm, s->u32, (size_t)m);
            p = (const unsigned char *)s->norm;
            n = (size_t)m;
        }
    }
    if (t->n_nstep) {
        const char *q;
        if (bpe_sp_normalize(t, (const char *)p, n, s->nb, &q, &n)) {
            e->err = TOKENIZER_ERR_NOMEM;
            return;
        }
        p = (const unsigned char *)q;
    }
    e->norm0 = (const char *)p;
    bpe_added_split(e, &t->norm, p, n, bpe_pre0);
}

/* One sequence into out. 0, or a tokenizer_err with errstr filled. */
static int bpe_run(struct bpe_enc *e, const char *text, size_t len, struct bpe_ivec *out,
                   const char *which, char *errstr, size_t errstr_size)
{
    size_t bad = uni_utf8_check(text, len);
    if (bad != len) {
        bpe_seterr(errstr, errstr_size, "%s is not valid UTF-8 at byte %zu (0x%02x)", which, bad,
                   (unsigned char)text[bad]);
        return TOKENIZER_ERR_UTF8;
    }
    e->out = out;
    e->text0 = text;
    out->n = 0;
    bpe_added_split(e, &e->t->raw, (const unsigned char *)text, len, bpe_plain);
    if (e->err) {
        if (e->rx_rc) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(e->rx_rc, msg, sizeof(msg));
            bpe_seterr(errstr, errstr_size, "the pre-tokenizer's regex failed on %zu bytes of %s: "
                       "%s", len, which, (const char *)msg);
        } else {
            bpe_seterr(errstr, errstr_size, "out of memory encoding %zu bytes of %s", len, which);
        }
        return e->err;
    }
    return 0;
}

/* See bpe_impl.h: the pre-tokenizer alone, as the reference's
 * pre_tokenize_str. */
int bpe_pre_tokenize(const struct bpe_tok *t, void *scratch, const char *text, size_t len,
                     void (*fn)(void *ctx, const char *piece, size_t n), void *ctx)
{
    if (uni_utf8_check(text, len) != len) return TOKENIZER_ERR_UTF8;
    struct bpe_enc e = {.t = t, .s = scratch, .piece_fn = fn, .piece_ctx = ctx, .seg0 = 1,
                        .norm0 = text};
    if (len) bpe_pre(&e, 0, (const unsigned char *)text, len);
    return e.err;
}

/* ---- layout --------------------------------------------------------------------------- */

static void bpe_give_back(struct bpe_scratch *s)
{
    bpe_trim(&s->a.v, &s->a.cap, sizeof(int32_t));
    bpe_trim(&s->b.v, &s->b.cap, sizeof(int32_t));
    bpe_trim(&s->norm, &s->norm_cap, 1);
    bpe_trim(&s->u32, &s->u32_cap, sizeof(int32_t));
    bpe_trim(&s->pre, &s->pre_cap, 1);
    bpe_trim(&s->word, &s->word_cap, 1);
    bpe_trim(&s->sym, &s->sym_cap, sizeof(*s->sym));
    bpe_trim(&s->heap, &s->heap_cap, sizeof(*s->heap));
    bpe_trim(&s->nb[0].p, &s->nb[0].cap, 1);
    bpe_trim(&s->nb[1].p, &s->nb[1].cap, 1);
    bpe_trim(&s->mb.p, &s->mb.cap, 1);
    bpe_trim(&s->init, &s->init_cap, sizeof(int32_t));
    s->a.n = s->b.n = 0;
}

static int bpe_encode_in(const struct bpe_tok *t, struct bpe_scratch *s, const char *text,
                         size_t len, const char *pair, size_t pair_len, size_t max_len,
                         int truncate, int32_t *ids, int32_t *type_ids, size_t cap,
                         size_t *full_len, char *errstr, size_t errstr_size)
{
    if ((!text && len) || (!pair && pair_len) || (!ids && cap)) {
        bpe_seterr(errstr, errstr_size, "tokenizer_encode: NULL buffer with a non-zero length");
        return TOKENIZER_ERR_ARG;
    }
    struct bpe_enc e = {.t = t, .s = s};
    int rc = bpe_run(&e, text ? text : "", len, &s->a, "text", errstr, errstr_size);
    if (rc) return rc;
    s->b.n = 0;
    if (pair && (rc = bpe_run(&e, pair, pair_len, &s->b, "pair", errstr, errstr_size))) return rc;
    const struct bpe_template *tp = pair ? &t->pair : &t->single;
    size_t nspec = tp->n_special, na = s->a.n, nb = s->b.n;
    size_t full = na + nb + nspec;
    if (full_len) *full_len = full;
    if (max_len && full > max_len) {
        if (!truncate) {
            bpe_seterr(errstr, errstr_size, "input is %zu tokens, over the limit of %zu", full,
                       max_len);
            return TOKENIZER_ERR_TOO_LONG;
        }
        if (max_len < nspec) {
            bpe_seterr(errstr, errstr_size, "max_len %zu cannot hold the %zu special tokens of a "
                       "%s", max_len, nspec, pair ? "pair" : "sequence");
            return TOKENIZER_ERR_ARG;
        }
        if (pair)
            trunc_longest_first(&na, &nb, na < max_len ? na : max_len,
                                nb < max_len ? nb : max_len, max_len - nspec);
        else na = max_len - nspec;
    }
    size_t need = na + nb + nspec;
    if (need > INT_MAX || need > cap) {
        bpe_seterr(errstr, errstr_size, "the encoding needs %zu entries, the buffer holds %zu",
                   need, cap);
        return TOKENIZER_ERR_CAP;
    }
    size_t o = 0;
    for (size_t i = 0; i < tp->n; i++) {
        const struct bpe_titem *it = &tp->it[i];
        const int32_t *src = it->seq < 0 ? t->tids + it->id0 : it->seq ? s->b.v : s->a.v;
        size_t k = it->seq < 0 ? it->n_ids : it->seq ? nb : na;
        if (k) memcpy(ids + o, src, k * sizeof(int32_t));
        if (type_ids)
            for (size_t j = 0; j < k; j++) type_ids[o + j] = it->type_id;
        o += k;
    }
    return (int)o;
}

static int bpe_encode(const void *model, void *scratch, const char *text, size_t len,
                      const char *pair, size_t pair_len, size_t max_len, int truncate,
                      int32_t *ids, int32_t *type_ids, size_t cap, size_t *full_len, char *errstr,
                      size_t errstr_size)
{
    int rc = bpe_encode_in(model, scratch, text, len, pair, pair_len, max_len, truncate, ids,
                           type_ids, cap, full_len, errstr, errstr_size);
    bpe_give_back(scratch);
    return rc;
}

/* ---- decoding ------------------------------------------------------------------------- */

/* Length of the valid UTF-8 character at p (n bytes), or 0 with *bad set
 * to the bytes one U+FFFD replaces: the lead and the continuation bytes
 * that were still possible, as Rust's from_utf8_lossy counts them. */
static size_t bpe_utf8_lossy(const unsigned char *p, size_t n, size_t *bad)
{
    unsigned char b = p[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n || p[i] < lo || p[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* Appends m bytes to buf (cap) at *total, writing only what fits. */
static void bpe_emit(char *buf, size_t cap, size_t *total, const void *src, size_t m)
{
    if (cap && *total < cap - 1) {
        size_t room = cap - 1 - *total;
        memcpy(buf + *total, src, m < room ? m : room);
    }
    *total += m;
}

/* The reference's decode with skip_special_tokens: specials left out;
 * the ByteLevel decoder turns each token's characters back into bytes (a
 * token with a character that is not a byte character gives its own
 * UTF-8) and the whole into text with U+FFFD for every invalid or
 * incomplete sequence (from_utf8_lossy); without a decoder, tokens joined
 * by spaces. The output never ends in half a character: a cut copy stops
 * at a character boundary. */
static int bpe_decode(const void *model, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    const struct bpe_tok *t = model;
    if (t->n_dstep) return bpe_sp_decode(t, ids, n, buf, cap);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids) return TOKENIZER_ERR_ARG;
    size_t raw = 0, kept = 0;
    for (size_t i = 0; i < n; i++)
        if (!(t->aflags[ids[i]] & BPE_A_SPECIAL)) raw += t->tok_len[ids[i]] + 1;
    unsigned char *bytes = malloc(raw + 1);
    if (!bytes) return TOKENIZER_ERR_NOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (t->aflags[id] & BPE_A_SPECIAL) continue;
        const unsigned char *tok = (const unsigned char *)t->pool + t->tok_off[id];
        size_t tl = t->tok_len[id], start = m;
        if (!t->dec_bytelevel) {
            if (kept++) bytes[m++] = ' ';
            memcpy(bytes + m, tok, tl);
            m += tl;
            continue;
        }
        int all = 1;
        for (size_t k = 0; k < tl && all;) {
            uint32_t cp;
            size_t cl = uni_utf8_decode(tok + k, tl - k, &cp);
            if (!cl || cp >= 512 || t->cp_byte[cp] < 0) {
                all = 0;
                break;
            }
            bytes[m++] = (unsigned char)t->cp_byte[cp];
            k += cl;
        }
        if (!all) {
            m = start;
            memcpy(bytes + m, tok, tl);
            m += tl;
        }
    }
    size_t total = 0, i = 0;
    int whole = 1; /* every character so far fitted */
    while (i < m) {
        size_t bad = 0, k = bpe_utf8_lossy(bytes + i, m - i, &bad);
        const void *src = k ? (const void *)(bytes + i) : "\xEF\xBF\xBD";
        size_t sl = k ? k : 3;
        if (whole && cap && total + sl > cap - 1) {
            whole = 0;
            buf[total] = '\0';
            cap = 0; /* nothing more is written: the copy ends at a boundary */
        }
        bpe_emit(buf, cap, &total, src, sl);
        i += k ? k : bad;
    }
    free(bytes);
    if (whole && cap) buf[total] = '\0';
    if (total > INT_MAX) return TOKENIZER_ERR_CAP;
    return (int)total;
}

/* ---- the interface ------------------------------------------------------------------- */

static void *bpe_load(const struct tokenizer_src *src, size_t *max_tokens, char *errstr,
                      size_t errstr_size)
{
    if (src->opts->lowercase >= 0) {
        bpe_seterr(errstr, errstr_size, "%s: a lowercase override is not supported for a BPE "
                   "tokenizer", src->dir);
        return NULL;
    }
    if (src->json)
        return bpe_from_json(src->dir, src->json, src->json_path, max_tokens, errstr, errstr_size);
    return bpe_from_files(src->dir, max_tokens, errstr, errstr_size);
}

static void bpe_destroy_model(void *model)
{
    bpe_destroy(model);
}

static size_t bpe_vocab_size(const void *model)
{
    return ((const struct bpe_tok *)model)->n_ids;
}

static const char *bpe_id_token(const void *model, int32_t id)
{
    const struct bpe_tok *t = model;
    if (id < 0 || (size_t)id >= t->n_ids) return NULL;
    return t->pool + t->tok_off[id];
}

static int32_t bpe_token_id(const void *model, const char *token)
{
    return bpe_find(model, token, strlen(token));
}

static int32_t bpe_special_id(const void *model, enum tokenizer_special which)
{
    const struct bpe_tok *t = model;
    switch (which) {
    case TOKENIZER_CLS: return t->cls;
    case TOKENIZER_SEP: return t->sep;
    case TOKENIZER_PAD: return t->pad;
    case TOKENIZER_UNK: return t->unk;
    case TOKENIZER_MASK: return t->mask;
    default: return -1;
    }
}

/* What the scratch holds now (tokenizer_scratch_bytes); pcre2's match
 * data is fixed-size and not counted. */
static size_t bpe_scratch_bytes(const void *scratch)
{
    const struct bpe_scratch *s = scratch;
    if (!s) return 0;
    return (s->a.cap + s->b.cap + s->u32_cap) * sizeof(int32_t) + s->norm_cap + s->pre_cap +
           s->word_cap + s->sym_cap * sizeof(*s->sym) + s->heap_cap * sizeof(*s->heap) +
           s->nb[0].cap + s->nb[1].cap + s->mb.cap + s->init_cap * sizeof(int32_t);
}

const struct tokenizer_impl bpe_tokenizer_impl = {
    .name = "BPE",
    .plain_file = "merges.txt",
    .load = bpe_load,
    .destroy = bpe_destroy_model,
    .scratch_new = bpe_scratch_new,
    .scratch_destroy = bpe_scratch_destroy,
    .scratch_bytes = bpe_scratch_bytes,
    .encode = bpe_encode,
    .decode = bpe_decode,
    .vocab_size = bpe_vocab_size,
    .id_token = bpe_id_token,
    .token_id = bpe_token_id,
    .special_id = bpe_special_id,
};

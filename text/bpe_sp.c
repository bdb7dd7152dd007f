/* bpe_sp.c - the SentencePiece-style BPE's own steps (bpe_impl.h): the
 * Prepend and Replace normalizers, the Metaspace pre-tokenizer, a word's
 * first symbols with byte fallback, and decoding through the decoder's
 * steps (Replace, ByteFallback, Fuse, Strip, Metaspace) as Hugging Face's
 * `tokenizers` runs them. bpe.c calls these; the merges are its own.
 *
 * Decoding never writes half a character: a run of <0xNN> tokens that is
 * not whole UTF-8 becomes one U+FFFD per token (as the reference's
 * ByteFallback does), and a cut copy stops at a character boundary, so
 * an incremental decoder (gen/stop.c) that holds text ending in U+FFFD
 * back releases a character only once all its bytes came.
 *
 * Threads: any; a loaded tokenizer is read-only and the buffers are the
 * caller's scratch. Ownership: decoding frees what it allocates before it
 * returns. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"
#include "unicode.h"

/* Appends n bytes to b. 0, or -1 (out of memory). */
static int bpe_put(struct bpe_buf *b, const void *s, size_t n)
{
    if (bpe_grow(&b->p, &b->cap, b->n + n + 1, 1)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* ---- normalizer and pre-tokenizer -------------------------------------------------- */

/* p[0..n) with every from replaced by to, appended to out. */
static int bpe_replace(const char *p, size_t n, const char *from, size_t fl, const char *to,
                       size_t tl, struct bpe_buf *out)
{
    size_t i = 0, keep = 0;
    while (i + fl <= n) {
        if (memcmp(p + i, from, fl) == 0) {
            if (bpe_put(out, p + keep, i - keep) || bpe_put(out, to, tl)) return -1;
            i += fl;
            keep = i;
        } else {
            i++;
        }
    }
    return bpe_put(out, p + keep, n - keep);
}

int bpe_sp_normalize(const struct bpe_tok *t, const char *p, size_t n, struct bpe_buf b[2],
                     const char **out, size_t *out_n)
{
    int cur = 0;
    for (size_t k = 0; k < t->n_nstep; k++) {
        const struct bpe_step *st = &t->nstep[k];
        struct bpe_buf *o = &b[cur];
        o->n = 0;
        if (st->kind == BPE_N_PREPEND) {
            /* the reference prepends to a non-empty text only */
            if (n && (bpe_put(o, st->to, st->to_len) || bpe_put(o, p, n))) return -1;
        } else if (bpe_replace(p, n, st->from, st->from_len, st->to, st->to_len, o)) {
            return -1;
        }
        p = o->p ? o->p : "";
        n = o->n;
        cur ^= 1;
    }
    *out = p;
    *out_n = n;
    return 0;
}

int bpe_sp_metaspace(const struct bpe_tok *t, const char *p, size_t n, int at0, struct bpe_buf *mb,
                     void (*fn)(void *ctx, const unsigned char *w, size_t n), void *ctx)
{
    const char *rep = t->meta_rep;
    size_t rl = t->meta_rep_len;
    mb->n = 0;
    if (n == 0) return 0;
    /* the scheme is checked after the spaces are replaced: a text that
     * starts with a space gets no second one */
    int starts = (p[0] == ' ') || (n >= rl && memcmp(p, rep, rl) == 0);
    if (!starts && (t->meta_prepend == BPE_PREPEND_ALWAYS ||
                    (t->meta_prepend == BPE_PREPEND_FIRST && at0)) &&
        bpe_put(mb, rep, rl))
        return -1;
    if (bpe_replace(p, n, " ", 1, rep, rl, mb)) return -1;
    const unsigned char *w = (const unsigned char *)mb->p;
    size_t m = mb->n;
    if (!t->meta_split) {
        fn(ctx, w, m);
        return 0;
    }
    /* split before each replacement, which stays with what follows it */
    size_t start = 0;
    for (size_t i = 1; i + rl <= m; i++) {
        if (memcmp(w + i, rep, rl) == 0) {
            fn(ctx, w + start, i - start);
            start = i;
            i += rl - 1;
        }
    }
    fn(ctx, w + start, m - start);
    return 0;
}

/* ---- a word's first symbols --------------------------------------------------------- */

size_t bpe_sp_symbols(const struct bpe_tok *t, const unsigned char *w, size_t n, int32_t *ids)
{
    size_t ns = 0;
    int pending = 0; /* an unk waits to be written */
    for (size_t i = 0; i < n;) {
        size_t cl = 1;
        while (i + cl < n && (w[i + cl] & 0xC0) == 0x80) cl++;
        int32_t id = bpe_find(t, (const char *)w + i, cl);
        if (id >= 0) {
            if (pending) ids[ns++] = t->model_unk;
            pending = 0;
            ids[ns++] = id;
        } else {
            int all = t->byte_fallback;
            for (size_t k = 0; k < cl && all; k++) all = t->bf_id[w[i + k]] >= 0;
            if (all) {
                for (size_t k = 0; k < cl; k++) ids[ns++] = t->bf_id[w[i + k]];
            } else if (t->model_unk >= 0) {
                if (pending && !t->fuse_unk) ids[ns++] = t->model_unk;
                pending = 1;
            }
        }
        i += cl;
    }
    if (pending) ids[ns++] = t->model_unk;
    return ns;
}

/* ---- decoding ------------------------------------------------------------------------- */

/* A list of strings: bytes in b, string i at off[i], len[i]. */
struct bpe_list {
    struct bpe_buf b;
    size_t *off, *len;
    size_t n, cap;
};

/* Starts a new, empty string at the end of l. */
static int bpe_list_new(struct bpe_list *l)
{
    size_t c = l->cap;
    if (bpe_grow(&l->off, &c, l->n + 1, sizeof(size_t))) return -1;
    if (c != l->cap) {
        size_t *q = realloc(l->len, c * sizeof(size_t));
        if (!q) return -1;
        l->len = q;
        l->cap = c;
    }
    l->off[l->n] = l->b.n;
    l->len[l->n++] = 0;
    return 0;
}

/* Appends to the last string. */
static int bpe_list_put(struct bpe_list *l, const void *s, size_t n)
{
    if (bpe_put(&l->b, s, n)) return -1;
    l->len[l->n - 1] += n;
    return 0;
}

static int bpe_list_add(struct bpe_list *l, const void *s, size_t n)
{
    return bpe_list_new(l) || bpe_list_put(l, s, n) ? -1 : 0;
}

/* The byte a "<0xNN>" token stands for (two hex digits, or "+" and one,
 * as the reference's radix parse takes), or -1. */
static int bpe_byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        int c = (unsigned char)s[i], d;
        if (i == 3 && c == '+') continue;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ByteFallback: each run of byte tokens becomes its text when it is
 * valid UTF-8, else one U+FFFD per token; other tokens pass. */
static int bpe_dec_bytes(const struct bpe_list *in, struct bpe_list *out, struct bpe_buf *run)
{
    size_t nb = 0;
    run->n = 0;
    for (size_t i = 0; i <= in->n; i++) {
        const char *s = i < in->n ? in->b.p + in->off[i] : NULL;
        int v = s ? bpe_byte_token(s, in->len[i]) : -1;
        if (v >= 0) {
            unsigned char c = (unsigned char)v;
            if (bpe_put(run, &c, 1)) return -1;
            nb++;
            continue;
        }
        if (nb) {
            if (uni_utf8_check(run->p, run->n) == run->n) {
                if (bpe_list_add(out, run->p, run->n)) return -1;
            } else {
                for (size_t k = 0; k < nb; k++)
                    if (bpe_list_add(out, "\xEF\xBF\xBD", 3)) return -1;
            }
            nb = 0;
            run->n = 0;
        }
        if (s && bpe_list_add(out, s, in->len[i])) return -1;
    }
    return 0;
}

/* One decoder step from in to out. */
static int bpe_dec_step(const struct bpe_step *st, const struct bpe_list *in,
                        struct bpe_list *out, struct bpe_buf *run)
{
    if (st->kind == BPE_D_BYTEFALLBACK) return bpe_dec_bytes(in, out, run);
    if (st->kind == BPE_D_FUSE) {
        if (bpe_list_new(out)) return -1;
        for (size_t i = 0; i < in->n; i++)
            if (bpe_list_put(out, in->b.p + in->off[i], in->len[i])) return -1;
        return 0;
    }
    for (size_t i = 0; i < in->n; i++) {
        const char *p = in->b.p + in->off[i];
        size_t n = in->len[i];
        if (st->kind == BPE_D_REPLACE) {
            if (bpe_list_new(out)) return -1;
            size_t before = out->b.n;
            if (bpe_replace(p, n, st->from, st->from_len, st->to, st->to_len, &out->b)) return -1;
            out->len[out->n - 1] = out->b.n - before;
        } else if (st->kind == BPE_D_METASPACE) {
            /* the first token loses its replacements when a space was
             * put in front on encoding; elsewhere each is a space */
            int drop = i == 0 && st->prepend != BPE_PREPEND_NEVER;
            if (bpe_list_new(out)) return -1;
            size_t before = out->b.n;
            if (bpe_replace(p, n, st->from, st->from_len, " ", drop ? 0 : 1, &out->b)) return -1;
            out->len[out->n - 1] = out->b.n - before;
        } else { /* BPE_D_STRIP */
            size_t a = 0, b = n, cl = st->from_len;
            for (int k = 0; k < st->left && b - a >= cl && !memcmp(p + a, st->from, cl); k++)
                a += cl;
            for (int k = 0; k < st->right && b - a >= cl && !memcmp(p + b - cl, st->from, cl); k++)
                b -= cl;
            if (bpe_list_add(out, p + a, b - a)) return -1;
        }
    }
    return 0;
}

int bpe_sp_decode(const struct bpe_tok *t, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    if ((!ids && n) || (!buf && cap)) return TOKENIZER_ERR_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids) return TOKENIZER_ERR_ARG;
    struct bpe_list l[2];
    struct bpe_buf run = {0};
    memset(l, 0, sizeof(l));
    int rc = TOKENIZER_ERR_NOMEM, cur = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->aflags[ids[i]] & BPE_A_SPECIAL) continue;
        if (bpe_list_add(&l[0], t->pool + t->tok_off[ids[i]], t->tok_len[ids[i]])) goto out;
    }
    for (size_t k = 0; k < t->n_dstep; k++) {
        int nx = cur ^ 1;
        l[nx].n = 0;
        l[nx].b.n = 0;
        if (bpe_dec_step(&t->dstep[k], &l[cur], &l[nx], &run)) goto out;
        cur = nx;
    }
    /* joined; a copy that does not fit stops at the last whole character */
    size_t total = 0, room = cap ? cap - 1 : 0, wrote = 0;
    int whole = cap > 0; /* still copying */
    for (size_t i = 0; i < l[cur].n; i++) {
        const unsigned char *p = (const unsigned char *)l[cur].b.p + l[cur].off[i];
        size_t m = l[cur].len[i];
        if (whole && total + m <= room) {
            memcpy(buf + total, p, m);
            wrote = total + m;
        } else if (whole) {
            size_t k = 0;
            while (k < m && total + k < room) {
                size_t cl = 1;
                while (k + cl < m && (p[k + cl] & 0xC0) == 0x80) cl++;
                if (total + k + cl > room) break;
                k += cl;
            }
            memcpy(buf + total, p, k);
            wrote = total + k;
            whole = 0;
        }
        total += m;
    }
    if (cap) buf[wrote] = '\0';
    rc = total > INT_MAX ? TOKENIZER_ERR_CAP : (int)total;
out:
    for (int k = 0; k < 2; k++) {
        free(l[k].b.p);
        free(l[k].off);
        free(l[k].len);
    }
    free(run.p);
    return rc;
}

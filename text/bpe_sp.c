/* bpe_sp.c - the SentencePiece-style BPE's own steps (bpe_impl.h): the
 * Prepend and Replace normalizers, the Metaspace pre-tokenizer, a word's
 * first symbols with byte fallback, and decoding through the decoder's
 * steps (Replace, ByteFallback, Fuse, Strip, Metaspace), which tokdec.c
 * runs as Hugging Face's `tokenizers` does (never half a character).
 * bpe.c calls these; the merges are its own.
 *
 * Threads: any; a loaded tokenizer is read-only and the buffers are the
 * caller's scratch. Ownership: decoding frees what it allocates before it
 * returns. */
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"
#include "tokdec.h"

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
        int32_t id = bpe_find_model(t, (const char *)w + i, cl);
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

int bpe_sp_decode(const struct bpe_tok *t, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    if ((!ids && n) || (!buf && cap)) return TOKENIZER_ERR_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids) return TOKENIZER_ERR_ARG;
    static const int kind[] = {
        [BPE_D_REPLACE] = TOKDEC_REPLACE, [BPE_D_BYTEFALLBACK] = TOKDEC_BYTEFALLBACK,
        [BPE_D_FUSE] = TOKDEC_FUSE,       [BPE_D_STRIP] = TOKDEC_STRIP,
        [BPE_D_METASPACE] = TOKDEC_METASPACE,
    };
    struct tokdec_step st[BPE_MAX_STEPS];
    for (size_t k = 0; k < t->n_dstep; k++) {
        const struct bpe_step *b = &t->dstep[k];
        st[k] = (struct tokdec_step){kind[b->kind], b->from, b->from_len, b->to, b->to_len,
                                     b->left, b->right, b->prepend != BPE_PREPEND_NEVER};
    }
    const char **tok = malloc((n ? n : 1) * sizeof(*tok));
    size_t *len = malloc((n ? n : 1) * sizeof(*len)), m = 0;
    int rc = TOKENIZER_ERR_NOMEM;
    if (tok && len) {
        for (size_t i = 0; i < n; i++) {
            if (t->aflags[ids[i]] & BPE_A_SPECIAL) continue;
            tok[m] = t->pool + t->tok_off[ids[i]];
            len[m++] = t->tok_len[ids[i]];
        }
        rc = tokdec_run(st, t->n_dstep, tok, len, m, 0, buf, cap);
    }
    free(tok);
    free(len);
    return rc;
}

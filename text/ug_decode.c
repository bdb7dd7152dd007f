/* ug_decode.c - the Unigram tokenizer's decoding (unigram.h): ids back to
 * pieces, then the folder's decoder steps (Metaspace, ByteFallback, Fuse,
 * Replace, Strip) as Hugging Face's `tokenizers` runs them; invalid byte
 * runs become U+FFFD, never half a character.
 *
 * Threads: any; a loaded tokenizer is read-only. Ownership: the caller's
 * buffer receives the text; everything else is freed before returning. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ug_impl.h"
#include "unicode.h"

/* ---- decoding ------------------------------------------------------------------ */

/* A list of token strings: bytes in buf, token i at off[i], len[i]. */
struct ug_toks {
    struct ug_buf b;
    size_t *off, *len;
    size_t n, cap;
};

/* Starts a new, empty token at the end of l. */
static int ug_tok_new(struct ug_toks *l)
{
    void *p = ug_grow(l->off, &l->cap, l->n + 1, sizeof(size_t));
    if (!p) return -1;
    l->off = p;
    p = realloc(l->len, l->cap * sizeof(size_t));
    if (!p) return -1;
    l->len = p;
    l->off[l->n] = l->b.n;
    l->len[l->n] = 0;
    l->n++;
    return 0;
}

/* Appends to the last token. */
static int ug_tok_put(struct ug_toks *l, const char *s, size_t n)
{
    if (ug_put(&l->b, s, n)) return -1;
    l->len[l->n - 1] += n;
    return 0;
}

/* Frees what l owns. */
static void ug_tok_free(struct ug_toks *l)
{
    free(l->b.p);
    free(l->off);
    free(l->len);
}

/* The byte a "<0xNN>" token stands for (the reference parses NN with
 * u8::from_str_radix, which also takes "+N"), or -1. */
static int ug_byte_token(const char *s, size_t n)
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

/* One decoder step from in to out. */
static int ug_dec_step(const struct ug_step *st, const struct ug_toks *in, struct ug_toks *out)
{
    char rep[4];
    size_t rl = st->kind == UG_D_METASPACE ? uni_utf8_encode(st->cp, rep) : 0;
    if (st->kind == UG_D_FUSE) {
        if (ug_tok_new(out)) return -1;
        for (size_t i = 0; i < in->n; i++)
            if (ug_tok_put(out, in->b.p + in->off[i], in->len[i])) return -1;
        return 0;
    }
    if (st->kind == UG_D_BYTEFALLBACK) {
        unsigned char bytes[64];
        size_t nb = 0;
        struct ug_buf run = {0};
        int rc = -1;
        for (size_t i = 0; i <= in->n; i++) {
            int v = i < in->n ? ug_byte_token(in->b.p + in->off[i], in->len[i]) : -1;
            if (v >= 0) {
                unsigned char c = (unsigned char)v;
                if (nb < sizeof(bytes)) bytes[nb] = c;
                if (ug_put(&run, (const char *)&c, 1)) goto bf_out;
                nb++;
                continue;
            }
            if (nb) {
                if (uni_utf8_check(run.p, run.n) == run.n) {
                    if (ug_tok_new(out) || ug_tok_put(out, run.p, run.n)) goto bf_out;
                } else {
                    for (size_t k = 0; k < nb; k++)
                        if (ug_tok_new(out) || ug_tok_put(out, "\xEF\xBF\xBD", 3)) goto bf_out;
                }
                nb = 0;
                run.n = 0;
            }
            if (i < in->n &&
                (ug_tok_new(out) || ug_tok_put(out, in->b.p + in->off[i], in->len[i])))
                goto bf_out;
        }
        rc = 0;
    bf_out:
        free(run.p);
        return rc;
    }
    for (size_t i = 0; i < in->n; i++) {
        const char *p = in->b.p + in->off[i];
        size_t n = in->len[i];
        if (ug_tok_new(out)) return -1;
        if (st->kind == UG_D_METASPACE) {
            for (size_t k = 0; k < n;) {
                if (n - k >= rl && memcmp(p + k, rep, rl) == 0) {
                    if (!(i == 0 && st->prepend != UG_PREPEND_NEVER) && ug_tok_put(out, " ", 1))
                        return -1;
                    k += rl;
                } else {
                    if (ug_tok_put(out, p + k, 1)) return -1;
                    k++;
                }
            }
        } else if (st->kind == UG_D_REPLACE) {
            for (size_t k = 0; k < n;) {
                if (n - k >= st->from_len && memcmp(p + k, st->from, st->from_len) == 0) {
                    if (ug_tok_put(out, st->to, st->to_len)) return -1;
                    k += st->from_len;
                } else {
                    if (ug_tok_put(out, p + k, 1)) return -1;
                    k++;
                }
            }
        } else { /* UG_D_STRIP: up to left leading and right trailing cp */
            char c[4];
            size_t cl = uni_utf8_encode(st->cp, c);
            size_t a = 0, b = n;
            for (int k = 0; k < st->left && b - a >= cl && memcmp(p + a, c, cl) == 0; k++)
                a += cl;
            for (int k = 0; k < st->right && b - a >= cl && memcmp(p + b - cl, c, cl) == 0; k++)
                b -= cl;
            if (ug_tok_put(out, p + a, b - a)) return -1;
        }
    }
    return 0;
}

/* The reference's decode with skip_special_tokens: the tokens' strings
 * through the decoder steps, then joined (spaces between them when the
 * file has no decoder), written like snprintf. */
int ug_decode(const struct ug_tokenizer *t, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    if ((!ids && n) || (!buf && cap)) return UG_ERR_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids) return UG_ERR_ARG;
    struct ug_toks l[2];
    memset(l, 0, sizeof(l));
    int rc = UG_ERR_NOMEM, cur = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->special[ids[i]]) continue;
        if (ug_tok_new(&l[0]) ||
            ug_tok_put(&l[0], t->pool + t->tok_off[ids[i]], t->tok_len[ids[i]]))
            goto out;
    }
    for (size_t k = 0; k < t->n_dec; k++) {
        int nx = cur ^ 1;
        l[nx].n = 0;
        l[nx].b.n = 0;
        if (ug_dec_step(&t->dec[k], &l[cur], &l[nx])) goto out;
        cur = nx;
    }
    size_t total = 0;
    for (size_t i = 0; i < l[cur].n; i++) {
        const char *p = l[cur].b.p + l[cur].off[i];
        size_t m = l[cur].len[i];
        int sp = !t->has_decoder && i > 0;
        if (sp) {
            if (cap && total < cap - 1) buf[total] = ' ';
            total++;
        }
        if (cap && total < cap - 1 && m) {
            size_t room = cap - 1 - total;
            memcpy(buf + total, p, m < room ? m : room);
        }
        total += m;
    }
    if (cap) buf[total < cap - 1 ? total : cap - 1] = '\0';
    rc = total > INT_MAX ? UG_ERR_CAP : (int)total;
out:
    ug_tok_free(&l[0]);
    ug_tok_free(&l[1]);
    return rc;
}

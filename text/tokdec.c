/* tokdec.c - the SentencePiece-style decoder steps (tokdec.h): a list of
 * strings passed from step to step (two lists, ping-ponging), then
 * joined into the caller's buffer.
 *
 * Threads: any. Ownership: as tokdec.h says. */
#include "tokdec.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"

/* A list of strings: bytes in b, string i at off[i], len[i]. */
struct tokdec_list {
    char *b;
    size_t bn, bcap;
    size_t *off, *len;
    size_t n, cap;
};

/* Appends n bytes to the last string. 0, or -1 (out of memory). */
static int tokdec_put(struct tokdec_list *l, const void *s, size_t n)
{
    if (l->bn + n + 1 > l->bcap) {
        size_t c = l->bcap ? l->bcap : 256;
        while (c < l->bn + n + 1) {
            if (c > SIZE_MAX / 2) return -1;
            c *= 2;
        }
        char *q = realloc(l->b, c);
        if (!q) return -1;
        l->b = q;
        l->bcap = c;
    }
    if (n) memcpy(l->b + l->bn, s, n);
    l->bn += n;
    l->len[l->n - 1] += n;
    return 0;
}

/* Starts a new string holding s (n bytes). */
static int tokdec_add(struct tokdec_list *l, const void *s, size_t n)
{
    if (l->n == l->cap) {
        size_t c = l->cap ? 2 * l->cap : 64;
        size_t *o = realloc(l->off, c * sizeof(*o));
        if (!o) return -1;
        l->off = o;
        size_t *q = realloc(l->len, c * sizeof(*q));
        if (!q) return -1;
        l->len = q;
        l->cap = c;
    }
    l->off[l->n] = l->bn;
    l->len[l->n++] = 0;
    return tokdec_put(l, s, n);
}

/* Appends p[0..n) with every from replaced by to to the last string. */
static int tokdec_replace(struct tokdec_list *l, const char *p, size_t n, const char *from,
                          size_t fl, const char *to, size_t tl)
{
    size_t i = 0, keep = 0;
    while (fl && i + fl <= n) {
        if (memcmp(p + i, from, fl) == 0) {
            if (tokdec_put(l, p + keep, i - keep) || tokdec_put(l, to, tl)) return -1;
            i += fl;
            keep = i;
        } else {
            i++;
        }
    }
    return tokdec_put(l, p + keep, n - keep);
}

/* The byte a "<0xNN>" token stands for (two hex digits, or "+" and one,
 * as the reference's radix parse takes), or -1. */
static int tokdec_byte(const char *s, size_t n)
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
 * valid UTF-8, else one U+FFFD per token; other tokens pass. run holds
 * the run's bytes. */
static int tokdec_bytes(const struct tokdec_list *in, struct tokdec_list *out,
                        struct tokdec_list *run)
{
    size_t nb = 0;
    for (size_t i = 0; i <= in->n; i++) {
        const char *s = i < in->n ? in->b + in->off[i] : NULL;
        int v = s ? tokdec_byte(s, in->len[i]) : -1;
        if (v >= 0) {
            unsigned char c = (unsigned char)v;
            if ((nb == 0 && tokdec_add(run, "", 0)) || tokdec_put(run, &c, 1)) return -1;
            nb++;
            continue;
        }
        if (nb) {
            const char *r = run->b + run->off[run->n - 1];
            size_t rl = run->len[run->n - 1];
            if (uni_utf8_check(r, rl) == rl) {
                if (tokdec_add(out, r, rl)) return -1;
            } else {
                for (size_t k = 0; k < nb; k++)
                    if (tokdec_add(out, "\xEF\xBF\xBD", 3)) return -1;
            }
            nb = 0;
            run->n = run->bn = 0;
        }
        if (s && tokdec_add(out, s, in->len[i])) return -1;
    }
    return 0;
}

/* One step from in to out. */
static int tokdec_step(const struct tokdec_step *st, const struct tokdec_list *in,
                       struct tokdec_list *out, struct tokdec_list *run)
{
    if (st->kind == TOKDEC_BYTEFALLBACK) return tokdec_bytes(in, out, run);
    if (st->kind == TOKDEC_FUSE) {
        if (tokdec_add(out, "", 0)) return -1;
        for (size_t i = 0; i < in->n; i++)
            if (tokdec_put(out, in->b + in->off[i], in->len[i])) return -1;
        return 0;
    }
    for (size_t i = 0; i < in->n; i++) {
        const char *p = in->b + in->off[i];
        size_t n = in->len[i];
        if (st->kind == TOKDEC_REPLACE) {
            if (tokdec_add(out, "", 0) ||
                tokdec_replace(out, p, n, st->from, st->from_len, st->to, st->to_len))
                return -1;
        } else if (st->kind == TOKDEC_METASPACE) {
            int drop = i == 0 && st->drop_first;
            if (tokdec_add(out, "", 0) ||
                tokdec_replace(out, p, n, st->from, st->from_len, " ", drop ? 0 : 1))
                return -1;
        } else { /* TOKDEC_STRIP */
            size_t a = 0, b = n, cl = st->from_len;
            for (int k = 0; k < st->left && b - a >= cl && !memcmp(p + a, st->from, cl); k++)
                a += cl;
            for (int k = 0; k < st->right && b - a >= cl && !memcmp(p + b - cl, st->from, cl);
                 k++)
                b -= cl;
            if (tokdec_add(out, p + a, b - a)) return -1;
        }
    }
    return 0;
}

/* Appends p[0..m) to buf at *total while whole characters fit in room;
 * once one does not, *whole is cleared and nothing more is written. */
static void tokdec_emit(char *buf, size_t room, size_t *total, size_t *wrote, int *whole,
                        const char *p, size_t m)
{
    if (*whole && *total + m <= room) {
        memcpy(buf + *total, p, m);
        *wrote = *total + m;
    } else if (*whole) {
        size_t k = 0;
        while (k < m) {
            size_t cl = 1;
            while (k + cl < m && ((unsigned char)p[k + cl] & 0xC0) == 0x80) cl++;
            if (*total + k + cl > room) break;
            k += cl;
        }
        memcpy(buf + *total, p, k);
        *wrote = *total + k;
        *whole = 0;
    }
    *total += m;
}

int tokdec_run(const struct tokdec_step *steps, size_t n_steps, const char *const *tok,
               const size_t *len, size_t n, int join_spaces, char *buf, size_t cap)
{
    struct tokdec_list l[2], run;
    memset(l, 0, sizeof(l));
    memset(&run, 0, sizeof(run));
    int rc = TOKENIZER_ERR_NOMEM, cur = 0;
    for (size_t i = 0; i < n; i++)
        if (tokdec_add(&l[0], tok[i], len[i])) goto out;
    for (size_t k = 0; k < n_steps; k++) {
        int nx = cur ^ 1;
        l[nx].n = l[nx].bn = 0;
        if (tokdec_step(&steps[k], &l[cur], &l[nx], &run)) goto out;
        cur = nx;
    }
    size_t total = 0, wrote = 0, room = cap ? cap - 1 : 0;
    int whole = cap > 0; /* still copying */
    for (size_t i = 0; i < l[cur].n; i++) {
        if (join_spaces && i > 0) tokdec_emit(buf, room, &total, &wrote, &whole, " ", 1);
        tokdec_emit(buf, room, &total, &wrote, &whole, l[cur].b + l[cur].off[i], l[cur].len[i]);
    }
    if (cap) buf[wrote] = '\0';
    rc = total > INT_MAX ? TOKENIZER_ERR_CAP : (int)total;
out:
    for (int k = 0; k < 2; k++) {
        free(l[k].b);
        free(l[k].off);
        free(l[k].len);
    }
    free(run.b);
    free(run.off);
    free(run.len);
    return rc;
}

/* stop.c - stop strings and incremental decoding (stop.h). */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

int gen_stops_add(struct gen_stops *st, const char *s, size_t len)
{
    if (st->n >= GEN_MAX_STOPS || len == 0) return -1;
    st->s[st->n] = s;
    st->len[st->n] = len;
    st->n++;
    if (len > st->longest) st->longest = len;
    return 0;
}

long gen_stops_find(const struct gen_stops *st, const char *text, size_t len, size_t seen)
{
    long best = -1;
    for (size_t i = 0; i < st->n; i++) {
        size_t l = st->len[i];
        if (l > len) continue;
        /* Occurrences ending after seen start after seen - l. */
        size_t from = seen >= l ? seen - l + 1 : 0;
        for (size_t at = from; at + l <= len; at++) {
            if (best >= 0 && (long)at >= best) break;
            if (text[at] == st->s[i][0] && memcmp(text + at, st->s[i], l) == 0) {
                best = (long)at;
                break;
            }
        }
    }
    return best;
}

size_t gen_stops_settled(const struct gen_stops *st, const char *text, size_t len)
{
    size_t hold = st->longest ? st->longest - 1 : 0;
    if (hold > len) hold = len;
    for (; hold > 0; hold--)
        for (size_t i = 0; i < st->n; i++)
            if (st->len[i] > hold && memcmp(text + len - hold, st->s[i], hold) == 0)
                return len - hold;
    return len;
}

void gen_detok_init(struct gen_detok *d, size_t context)
{
    memset(d, 0, sizeof(*d));
    d->read = context;
}

void gen_detok_free(struct gen_detok *d)
{
    free(d->buf);
    d->buf = NULL;
    d->cap = 0;
}

/* Decodes ids[from..to) into d->buf; returns its length or an error. */
static long decode_window(struct gen_detok *d, const struct tokenizer *t, const int32_t *ids,
                          size_t from, size_t to)
{
    for (;;) {
        int r = tokenizer_decode(t, ids + from, to - from, d->buf, d->cap);
        if (r < 0) return r;
        if ((size_t)r < d->cap) return r;
        size_t cap = (size_t)r + 64;
        char *nb = realloc(d->buf, cap);
        if (!nb) return TOKENIZER_ERR_NOMEM;
        d->buf = nb;
        d->cap = cap;
    }
}

static int append(char **out, size_t *out_len, size_t *out_cap, const char *p, size_t n)
{
    if (*out_len + n + 1 > *out_cap) {
        size_t cap = *out_cap ? *out_cap : 64;
        while (cap < *out_len + n + 1) cap *= 2;
        char *nb = realloc(*out, cap);
        if (!nb) return -1;
        *out = nb;
        *out_cap = cap;
    }
    memcpy(*out + *out_len, p, n);
    *out_len += n;
    (*out)[*out_len] = '\0';
    return 0;
}

static int ends_incomplete(const char *s, size_t n)
{
    return n >= 3 && (unsigned char)s[n - 3] == 0xEF && (unsigned char)s[n - 2] == 0xBF &&
           (unsigned char)s[n - 1] == 0xBD;
}

static long step(struct gen_detok *d, const struct tokenizer *t, const int32_t *ids, size_t n,
                 char **out, size_t *out_len, size_t *out_cap, int flush)
{
    if (n <= d->read) return 0;
    long a = decode_window(d, t, ids, d->prefix, d->read);
    if (a < 0) return a;
    long b = decode_window(d, t, ids, d->prefix, n);
    if (b < 0) return b;
    if (b <= a || (!flush && ends_incomplete(d->buf, (size_t)b))) return 0;
    /* The window's earlier text reads the same in the longer decoding,
     * except where a byte-fallback run the new token joins stops being
     * UTF-8 (its bytes then all read U+FFFD, as Hugging Face's ByteFallback
     * decodes): what was released stays, and the new piece starts at the
     * next character so it is valid UTF-8 whatever came before. */
    while (a < b && ((unsigned char)d->buf[a] & 0xC0) == 0x80) a++;
    if (a == b) return 0;
    if (append(out, out_len, out_cap, d->buf + a, (size_t)(b - a)) != 0)
        return TOKENIZER_ERR_NOMEM;
    d->prefix = d->read;
    d->read = n;
    return b - a;
}

long gen_detok_step(struct gen_detok *d, const struct tokenizer *t, const int32_t *ids, size_t n,
                    char **out, size_t *out_len, size_t *out_cap)
{
    return step(d, t, ids, n, out, out_len, out_cap, 0);
}

long gen_detok_flush(struct gen_detok *d, const struct tokenizer *t, const int32_t *ids, size_t n,
                     char **out, size_t *out_len, size_t *out_cap)
{
    return step(d, t, ids, n, out, out_len, out_cap, 1);
}

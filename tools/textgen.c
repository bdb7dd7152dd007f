/* textgen.c - mixed-length texts from a model's vocabulary (textgen.h).
 *
 * Threads: as textgen.h says. */
#include "textgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../text/tokenizer.h"

/* splitmix64's finalizer: every text and word choice is a hash of the
 * text's number, so no state carries from one text to the next. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Words in text seq. */
static size_t text_words(const struct textgen *t, uint64_t seq)
{
    uint64_t u = mix64(seq * 0x9E3779B97F4A7C15ull + 1), v = mix64(u);
    unsigned r = (unsigned)(u % 100);
    size_t lo = 3, hi = 14;
    if (r >= 80) lo = 63, hi = 125;
    else if (r >= 45) lo = 15, hi = 62;
    if (hi > t->max_words) hi = t->max_words;
    if (lo > hi) lo = hi;
    return lo + (size_t)(v % (hi - lo + 1));
}

int textgen_init(struct textgen *t, const struct model_encoder_info *e)
{
    memset(t, 0, sizeof(*t));
    size_t v = tokenizer_vocab_size(e->tokenizer);
    if (!(t->words = malloc(v * sizeof(*t->words)))) {
        fprintf(stderr, "textgen: out of memory\n");
        return -1;
    }
    for (size_t i = 0; i < v; i++) {
        const char *w = tokenizer_id_token(e->tokenizer, (int32_t)i);
        size_t n = w ? strlen(w) : 0, k = 0;
        while (k < n && w[k] >= 'a' && w[k] <= 'z') k++;
        if (n >= 2 && k == n) t->words[t->n_words++] = w;
    }
    if (!t->n_words) {
        fprintf(stderr, "textgen: the vocabulary has no whole lower-case words\n");
        return -1;
    }
    t->max_words = e->max_tokens > 1024 ? 1022 : e->max_tokens - 2;
    t->cap = (t->max_words + 1) * 64 + 1; /* words of up to 63 bytes and their spaces */
    if (!(t->buf = malloc(t->cap))) {
        fprintf(stderr, "textgen: out of memory\n");
        return -1;
    }
    return 0;
}

void textgen_fini(struct textgen *t)
{
    free(t->words);
    free(t->buf);
    memset(t, 0, sizeof(*t));
}

const char *textgen_text(struct textgen *t, uint64_t seq)
{
    return textgen_fixed(t, seq, text_words(t, seq));
}

const char *textgen_fixed(struct textgen *t, uint64_t seq, size_t n)
{
    size_t at = 0;
    if (n > t->max_words) n = t->max_words;
    for (size_t k = 0; k < n; k++) {
        uint64_t pick = mix64((seq << 8) ^ (k * 0x2545F4914F6CDD1Dull) ^ 0x51ED);
        const char *w = t->words[pick % t->n_words];
        size_t len = strlen(w);
        if (at + len + 2 > t->cap) break;
        if (k) t->buf[at++] = ' ';
        memcpy(t->buf + at, w, len);
        at += len;
    }
    t->buf[at] = '\0';
    return t->buf;
}

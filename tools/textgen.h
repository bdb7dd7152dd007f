/* textgen.h - texts of mixed lengths for a text encoder, made from the
 * model's own vocabulary, for the tools that load one (`kinfer bench
 * produce` and `bench encode`, `kinfer smoke`): whole words (lower-case
 * letters, two or more, no ## pieces) joined by spaces, so a text of w
 * words tokenizes to w + 2 tokens. Lengths follow one fixed mix, text by
 * text from its number: 45% short (3-14 words), 35% medium (15-62), 20%
 * long (63 up to what the model takes, at most 125): a mean near 36 words,
 * tokens from 5 to 127. The same number always gives the same text.
 *
 * Threads: a textgen is one thread's. */
#ifndef KINFER_TEXTGEN_H
#define KINFER_TEXTGEN_H

#include <stddef.h>
#include <stdint.h>

#include "../gpu/model.h"

struct textgen {
    const char **words;  /* borrowed from the tokenizer */
    size_t n_words;
    size_t max_words;
    char *buf;           /* the last text made */
    size_t cap;
};

/* Collects e's whole words. Returns 0, or -1 (printed) when out of memory
 * or the vocabulary has none. Borrows e's tokenizer until textgen_fini. */
int textgen_init(struct textgen *t, const struct model_encoder_info *e);
/* Frees what t holds; accepts a zeroed or failed one. */
void textgen_fini(struct textgen *t);
/* Text number seq (NUL-terminated, owned by t, valid until the next call). */
const char *textgen_text(struct textgen *t, uint64_t seq);
/* Text number seq with exactly `words` words (at most what the model
 * takes, and 1022): `words` + 2 tokens. */
const char *textgen_fixed(struct textgen *t, uint64_t seq, size_t words);

#endif

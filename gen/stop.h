/* stop.h - a generation's text as it grows: the job's stop strings found
 * across token boundaries, what may be released to a stream, and the
 * incremental decoding of generated ids into valid UTF-8.
 *
 * Stop strings. Generation ends before the first occurrence of any of the
 * job's stop strings; the stop string is not part of the text. The text is
 * searched again after each token, only where a new occurrence can end (in
 * the bytes the token added), so a long generation costs its length times
 * the stop strings' lengths, not its length squared. Text that could still
 * turn out to begin a stop string is held back from a stream until the
 * next tokens settle it.
 *
 * Decoding. A generated token may end inside a UTF-8 character (byte-level
 * BPE splits characters into bytes) or change how the token before it
 * reads (a SentencePiece space). Each new token's text is the difference
 * between the decoding of a short window ending with it and of the same
 * window without it, the window starting a few tokens back (the prompt's
 * last tokens give the first generated ones their context); while that
 * decoding ends in U+FFFD (a character not yet complete) nothing is
 * released. The pieces joined are the decoding of the whole generation,
 * but for one case: bytes a model emits that are not UTF-8 as a run
 * (byte-fallback tokens) read U+FFFD, each of them, once the run is
 * known, while a valid first part of the run may have been released
 * already. Every piece is valid UTF-8. */
#ifndef KINFER_GEN_STOP_H
#define KINFER_GEN_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "../text/tokenizer.h"

#define GEN_MAX_STOPS 8 /* the contract's limit */

/* A job's stop strings (borrowed: they live with the job). */
struct gen_stops {
    size_t n;
    const char *s[GEN_MAX_STOPS];
    size_t len[GEN_MAX_STOPS];
    size_t longest;
};

/* Adds stop string s of len bytes (not empty). Returns 0, or -1 when
 * there are already GEN_MAX_STOPS or len is 0. */
int gen_stops_add(struct gen_stops *st, const char *s, size_t len);

/* The start of the earliest occurrence of any stop string in text[0..len)
 * that ends after byte `seen` (the text's length when last searched:
 * occurrences ending within it were looked for then), or -1 for none. */
long gen_stops_find(const struct gen_stops *st, const char *text, size_t len, size_t seen);

/* How many of text's len bytes are settled: the rest is the longest
 * suffix that is a proper prefix of some stop string (more text may
 * complete it). Always a UTF-8 boundary when text and the stop strings
 * are valid UTF-8. */
size_t gen_stops_settled(const struct gen_stops *st, const char *text, size_t len);

/* Incremental decoding of one sequence's ids. */
struct gen_detok {
    size_t prefix; /* the window's start in the caller's ids */
    size_t read;   /* ids before this were released as text */
    char *buf;     /* decode buffer, grown as needed */
    size_t cap;
};

/* Starts decoding after `context` ids already in the caller's array (the
 * prompt's last few, at most GEN_DETOK_CONTEXT; 0 is fine): their text
 * is not released, only how the generated ids read after them. */
#define GEN_DETOK_CONTEXT 6
void gen_detok_init(struct gen_detok *d, size_t context);
void gen_detok_free(struct gen_detok *d);

/* ids[0..n) are the context and every id generated so far, the newest
 * last. Appends the text the newest ids settle to *out (a malloc'd
 * buffer of *out_len bytes with room *out_cap, grown as needed, NUL
 * terminated) and returns the bytes appended (0 while a character is
 * incomplete), or a negative enum tokenizer_err. */
long gen_detok_step(struct gen_detok *d, const struct tokenizer *t, const int32_t *ids, size_t n,
                    char **out, size_t *out_len, size_t *out_cap);
/* As gen_detok_step, releasing everything, an incomplete character too
 * (as U+FFFD): when the generation ends. */
long gen_detok_flush(struct gen_detok *d, const struct tokenizer *t, const int32_t *ids, size_t n,
                     char **out, size_t *out_len, size_t *out_cap);

#endif

/* tokdec.h - the decoder steps of Hugging Face's `tokenizers` that the
 * SentencePiece-style tokenizers use (Metaspace, ByteFallback, Fuse,
 * Replace, Strip), run over a list of token strings as the reference
 * runs them: shared by the Unigram (text/ug_decode.c) and the BPE
 * (text/bpe_sp.c) tokenizers, whose loaders fill the steps.
 *
 * The result is always valid UTF-8 when the tokens are: a run of <0xNN>
 * tokens that is not whole UTF-8 becomes one U+FFFD per token (as the
 * reference's ByteFallback does), and a copy cut short stops at a
 * character boundary, so an incremental decoder (gen/stop.c) that holds
 * text ending in U+FFFD back releases a character only once all its
 * bytes came.
 *
 * Threads: any; nothing is shared. Ownership: steps and tokens are
 * borrowed for the call; what the run allocates is freed before it
 * returns. */
#ifndef KINFER_TOKDEC_H
#define KINFER_TOKDEC_H

#include <stddef.h>

enum tokdec_kind { TOKDEC_METASPACE, TOKDEC_BYTEFALLBACK, TOKDEC_FUSE, TOKDEC_REPLACE, TOKDEC_STRIP };

/* One step (plain data; the strings borrowed from the loader's). */
struct tokdec_step {
    int kind;                 /* enum tokdec_kind */
    const char *from;         /* Replace: the pattern; Metaspace, Strip: the character */
    size_t from_len;
    const char *to;           /* Replace: the content */
    size_t to_len;
    int left, right;          /* Strip: characters taken at the start, at the end */
    int drop_first;           /* Metaspace: the first token loses its replacements
                                 (a space was put in front on encoding) */
};

/* The n tokens (tok[i], len[i] bytes) through steps[0..n_steps), joined
 * (a space between tokens when join_spaces: a file without a decoder),
 * written into buf (the caller's, cap bytes; cap 0: nothing) like
 * snprintf, but a copy cut short ends on a character boundary. Returns
 * the whole length, TOKENIZER_ERR_NOMEM or TOKENIZER_ERR_CAP (over
 * INT_MAX). */
int tokdec_run(const struct tokdec_step *steps, size_t n_steps, const char *const *tok,
               const size_t *len, size_t n, int join_spaces, char *buf, size_t cap);

#endif

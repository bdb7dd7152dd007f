/* truncate.h - the pair truncation rule every tokenizer shares: Hugging
 * Face's longest_first, which cuts two sequences to fit max tokens
 * together. Plain C, no state.
 *
 * Threads: any. */
#ifndef KINFER_TRUNCATE_H
#define KINFER_TRUNCATE_H

#include <stddef.h>

/* Cuts *na and *nb (the sequences' token counts) so they fit max tokens
 * together: the shorter side stays whole if the longer still gets at
 * least as many, else max is split evenly, the odd token going to the side
 * that was longer (ties: the second). Which side is longer is judged on ja
 * and jb, as each tokenizer's reference judges it (WordPiece and BPE: the
 * counts cut to max_len first; Unigram: where each side's words end). A
 * count only ever shrinks. */
void trunc_longest_first(size_t *na, size_t *nb, size_t ja, size_t jb, size_t max);

#endif

/* unigram.h - the SentencePiece Unigram tokenizer as Hugging Face's
 * tokenizer.json describes it (XLM-RoBERTa, multilingual-e5, bge-m3,
 * CamemBERT, ...), id for id what the Rust `tokenizers` library produces
 * (callers outside text/ use it through tokenizer.h; ug_tokenizer.c fills
 * that interface's table):
 *
 *   1. added tokens that match on the raw text (normalized false: all of
 *      XLM-R's) are found leftmost-longest and become single tokens; lstrip
 *      and rstrip take the whitespace beside them; the text between them is
 *      a segment of its own for 2-4;
 *   2. normalizer: Precompiled (SentencePiece's precompiled_charsmap: a
 *      darts-clone double-array trie plus a blob of replacement strings,
 *      applied per grapheme as the reference does), NFKC, Replace (a string,
 *      or the regex " {2,}"), Strip, or a Sequence of these;
 *   3. pre-tokenizer: Metaspace (' ' -> U+2581, prepend_scheme always /
 *      first / never, split before each U+2581), WhitespaceSplit, or a
 *      Sequence of these;
 *   4. Unigram: per word, the segmentation with the highest total score
 *      (Viterbi over every vocabulary piece that matches; a character no
 *      piece covers is the unk token with score min_score - 10, and
 *      neighbouring unknowns are fused into one); with byte_fallback, an
 *      unknown run becomes its bytes' <0xNN> pieces;
 *   5. post-processor: TemplateProcessing, RobertaProcessing or none (XLM-R:
 *      <s> A </s></s> B </s>, all type id 0); optional truncation to a
 *      maximum length, specials included, longest_first for a pair, where
 *      which side counts as longer is judged as the reference does: on
 *      each side's token count at its first word end past max_len (the
 *      reference stops tokenizing there), not on the whole lengths.
 * Decoding: special added tokens are left out; the decoder (Metaspace,
 * ByteFallback, Fuse, Replace, Strip, or a Sequence) joins the rest.
 *
 * Where kinfer knowingly differs: Unicode comes from libutf8proc 2.8
 * (Unicode 15: graphemes for Precompiled, NFKC, whitespace), the reference
 * from its own tables (its NFKC lacks the compatibility mappings of
 * Unicode 12.1-14, which unigram.c leaves out too; every single code point
 * is checked, sequences only as the goldens reach them); Metaspace's "first" scheme tracks only whether the
 * normalizer moved the start (Strip, a leading Replace), not the
 * reference's full alignments; max_len below the specials is an error
 * (UG_ERR_ARG) where the reference truncates anyway.
 *
 * Hostile input: text must be valid UTF-8 (UG_ERR_UTF8 with the byte offset
 * otherwise). Work is linear in the input times the longest piece; memory
 * is linear in the input, and the Viterbi lattice of a long word is given
 * back to the allocator once the call ends (UG_LATTICE_KEEP).
 *
 * Threads: a loaded ug_tokenizer is never modified and may be used from any
 * number of threads at once, each with its own ug_scratch.
 *
 * Ownership, for every function below: a tokenizer passed as const is
 * borrowed for the call; JSON, paths and input text are borrowed for the
 * call; (errstr, errstr_size) is the caller's buffer for a message on
 * failure (NULL or 0: no message); what a function returns is either new
 * (free with the matching _destroy) or borrowed, as said. */
#ifndef KINFER_UNIGRAM_H
#define KINFER_UNIGRAM_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Lattice entries (16 bytes each) a scratch keeps after a call; a longer
 * word's lattice is freed when the call ends. */
#define UG_LATTICE_KEEP ((size_t)1 << 16)

/* The same values as tokenizer.h's enum tokenizer_err. */
enum ug_err {
    UG_ERR_UTF8 = -1,
    UG_ERR_TOO_LONG = -2,
    UG_ERR_ARG = -3,
    UG_ERR_CAP = -4,
    UG_ERR_NOMEM = -5,
};

struct ug_tokenizer;
struct ug_scratch;

/* Reads a parsed tokenizer.json (root, borrowed; path for messages) whose
 * model.type is "Unigram". Anything outside what unigram.h lists (another
 * normalizer or pre-tokenizer, added tokens matched after normalization or
 * as single words, a null unk_id, repeated pieces, ids that disagree) is
 * refused with a message naming it. Returns a new tokenizer (free with
 * ug_destroy), or NULL with errstr filled. */
struct ug_tokenizer *ug_from_json(const json_t *root, const char *path, char *errstr,
                                  size_t errstr_size);
/* Frees t. Accepts NULL. */
void ug_destroy(struct ug_tokenizer *t);

/* Number of ids (the model's pieces and the added tokens beyond them). */
size_t ug_vocab_size(const struct ug_tokenizer *t);
/* The token string of id (borrowed from t), or NULL if out of range. */
const char *ug_id_token(const struct ug_tokenizer *t, int32_t id);
/* The id of token (NUL-terminated), or -1. Added tokens first. */
int32_t ug_token_id(const struct ug_tokenizer *t, const char *token);
/* Special ids: the template's leading (cls/bos) and trailing (sep/eos)
 * special token of a single sequence, "<pad>", the unk id, "<mask>"; -1
 * when the tokenizer has none. */
int32_t ug_cls_id(const struct ug_tokenizer *t);
int32_t ug_sep_id(const struct ug_tokenizer *t);
int32_t ug_pad_id(const struct ug_tokenizer *t);
int32_t ug_unk_id(const struct ug_tokenizer *t);
int32_t ug_mask_id(const struct ug_tokenizer *t);

/* A per-thread work area; grows to the largest input seen (but for the
 * lattice, see UG_LATTICE_KEEP). Returns a new scratch (free with
 * ug_scratch_destroy), or NULL if out of memory. */
struct ug_scratch *ug_scratch_new(size_t expect_len);
/* Frees s. Accepts NULL. */
void ug_scratch_destroy(struct ug_scratch *s);
/* Entries the lattice holds between calls (at most UG_LATTICE_KEEP): for
 * tests and logs. */
size_t ug_scratch_lattice(const struct ug_scratch *s);
/* Bytes the scratch holds now (tokenizer_scratch_bytes). */
size_t ug_scratch_bytes(const struct ug_scratch *s);

/* tokenizer.h's tokenizer_encode for a Unigram tokenizer (same arguments,
 * same answers, enum ug_err for the errors). */
int ug_encode(const struct ug_tokenizer *t, struct ug_scratch *s, const char *text, size_t len,
              const char *pair, size_t pair_len, size_t max_len, int truncate, int32_t *ids,
              int32_t *type_ids, size_t cap, size_t *full_len, char *errstr, size_t errstr_size);

/* tokenizer.h's tokenizer_decode: special added tokens left out, the rest
 * through the file's decoder (none: joined by spaces). */
int ug_decode(const struct ug_tokenizer *t, const int32_t *ids, size_t n, char *buf, size_t cap);

/* Runs only the normalizer over the whole of text (no added-token split),
 * as the reference's normalizer.normalizeString does: for logs and tests.
 * Returns the normalized UTF-8 (*out_len bytes, owned by s, valid until its
 * next use), or NULL with errstr filled. */
const char *ug_normalize(const struct ug_tokenizer *t, struct ug_scratch *s, const char *text,
                         size_t len, size_t *out_len, char *errstr, size_t errstr_size);

#endif

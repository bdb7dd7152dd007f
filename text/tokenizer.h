/* tokenizer.h - one interface over every tokenizer kinfer can run: load
 * from a model folder, encode (pairs, truncation), decode, special
 * tokens. Callers never see which implementation answers; each one is a
 * file of its own that fills the table in tokenizer_impl.h (WordPiece,
 * text/wp_tokenizer.c; BPE, byte-level or SentencePiece-style with byte
 * fallback, text/bpe.c; Unigram, text/ug_tokenizer.c), and
 * tokenizer_kind_name says which one runs.
 *
 * A folder is read as Hugging Face's save_pretrained writes it: when it
 * has tokenizer.json, that file's model.type picks the implementation
 * ("WordPiece", "BPE", "Unigram"; any other type is refused with a
 * message naming it); without one, vocab.txt means WordPiece (with
 * tokenizer_config.json's settings when present), and merges.txt with
 * vocab.json byte-level BPE (RoBERTa's or GPT-2's slow files, with
 * tokenizer_config.json's special tokens and add_prefix_space).
 *
 * Threads: a loaded tokenizer is never modified and may be used from any
 * number of threads at once; each thread brings its own scratch, where
 * encoding keeps what it needs between calls, so a warm scratch makes
 * tokenizer_encode allocation-free. A scratch serves every tokenizer, of
 * any kind (one per thread is enough, however many models it encodes for).
 *
 * Ownership, for every function below: a tokenizer passed as const is
 * borrowed for the call; paths, options, input text and ids are borrowed
 * for the call; (errstr, errstr_size) is the caller's buffer for a message
 * on failure (NULL or 0: no message); what a function returns is either
 * new (the caller frees it with the matching _destroy) or borrowed from
 * the tokenizer, as said. */
#ifndef KINFER_TOKENIZER_H
#define KINFER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* What tokenizer_encode and tokenizer_decode can answer besides a count.
 * The first two are the caller's input (a worker answers invalid_input);
 * the others are the caller's own arguments or the machine. */
enum tokenizer_err {
    TOKENIZER_ERR_UTF8 = -1,     /* text or pair is not valid UTF-8 */
    TOKENIZER_ERR_TOO_LONG = -2, /* over max_tokens and truncate == 0 */
    TOKENIZER_ERR_ARG = -3,      /* max_tokens too small for the specials, NULL buffers,
                                    an id out of range (decode) */
    TOKENIZER_ERR_CAP = -4,      /* the result needs more than cap entries */
    TOKENIZER_ERR_NOMEM = -5,    /* growing the scratch failed */
};

/* The special tokens a caller may need; an implementation without one
 * answers -1. CLS is also a sequence's first token for models that call
 * it bos, SEP its last (eos). */
enum tokenizer_special {
    TOKENIZER_CLS,
    TOKENIZER_SEP,
    TOKENIZER_PAD,
    TOKENIZER_UNK,
    TOKENIZER_MASK,
    TOKENIZER_N_SPECIAL
};

/* Overrides of what the folder says (plain data; tokenizer_opts_init
 * gives "none"). */
struct tokenizer_opts {
    int lowercase;     /* 1 or 0: lowercase the input or not; -1: as the folder says.
                          WordPiece reads vocab.txt for an override; BPE
                          refuses one (its vocabulary is cased). */
    size_t max_tokens; /* what tokenizer_max_tokens answers; 0: the folder's
                          model_max_length */
};

struct tokenizer;
struct tokenizer_scratch;

/* Fills o with no overrides: lowercase -1, max_tokens 0. */
void tokenizer_opts_init(struct tokenizer_opts *o);

/* Reads the tokenizer of the folder dir (see above) with the overrides o
 * (NULL: none). Every problem is an error naming the file ("DIR/
 * tokenizer.json: model type \"WordLevel\" is not supported (supported:
 * WordPiece, BPE, Unigram)", "DIR: no tokenizer.json in the folder (nor
 * vocab.txt, merges.txt)").
 * Returns a new tokenizer (free with tokenizer_destroy), or NULL with
 * errstr filled. */
struct tokenizer *tokenizer_load(const char *dir, const struct tokenizer_opts *o, char *errstr,
                                 size_t errstr_size);

/* Frees t. Accepts NULL. No thread may still be using t. */
void tokenizer_destroy(struct tokenizer *t);

/* The implementation's name, as tokenizer.json's model.type spells it
 * ("WordPiece"); static storage. */
const char *tokenizer_kind_name(const struct tokenizer *t);

/* Number of ids: every id is in 0..tokenizer_vocab_size-1. */
size_t tokenizer_vocab_size(const struct tokenizer *t);
/* The longest input the model takes, specials included: the override, or
 * tokenizer_config.json's model_max_length; 0 when neither says. */
size_t tokenizer_max_tokens(const struct tokenizer *t);
/* The token string of id (borrowed from t), or NULL if out of range. */
const char *tokenizer_id_token(const struct tokenizer *t, int32_t id);
/* The id of token (NUL-terminated, borrowed), or -1 if absent. */
int32_t tokenizer_token_id(const struct tokenizer *t, const char *token);
/* The id of a special token, or -1 if t has none (or which is out of
 * range). */
int32_t tokenizer_special_id(const struct tokenizer *t, enum tokenizer_special which);

/* A per-thread work area for tokenizer_encode, for tokenizers of every
 * kind; it grows to the input at hand and keeps a bounded size between
 * calls (wordpiece.h, WP_SCRATCH_KEEP per buffer), so one huge row does
 * not pin its peak.
 * expect_len (bytes of text + pair) sizes it up front; 0 lets it grow on
 * first use. Returns a new scratch (free with tokenizer_scratch_destroy),
 * or NULL if out of memory. */
struct tokenizer_scratch *tokenizer_scratch_new(size_t expect_len);
/* Frees s. Accepts NULL. */
void tokenizer_scratch_destroy(struct tokenizer_scratch *s);
/* Bytes s holds now, every implementation's work area together (tests
 * check that a huge row's buffers are given back). */
size_t tokenizer_scratch_bytes(const struct tokenizer_scratch *s);

/* Encodes text (len bytes, borrowed; need not be NUL-terminated) and, if
 * pair is not NULL, pair (pair_len bytes; "" is an empty second sequence)
 * into ids and type_ids (the caller's, cap entries each; type_ids may be
 * NULL), the model's special tokens included (BERT: [CLS] A [SEP] with
 * type ids 0, then B [SEP] with type ids 1).
 * max_tokens 0 means no limit. Otherwise, when the result would be longer:
 * with truncate set the sequences are cut to fit (longest_first for a
 * pair, as Hugging Face's tokenizers do); without it,
 * TOKENIZER_ERR_TOO_LONG ("input is 512 tokens, over the limit of 128").
 * *full_len (may be NULL) gets the untruncated length, specials included,
 * whenever the text was valid UTF-8. s (the caller's) is used for all
 * work. Returns the number of entries written, or an enum tokenizer_err
 * with errstr filled. */
int tokenizer_encode(const struct tokenizer *t, struct tokenizer_scratch *s, const char *text,
                     size_t len, const char *pair, size_t pair_len, size_t max_tokens,
                     int truncate, int32_t *ids, int32_t *type_ids, size_t cap, size_t *full_len,
                     char *errstr, size_t errstr_size);

/* 1 when text (len bytes, borrowed) is empty or only White_Space (as
 * uni_is_ws: spaces, tabs, line breaks, U+00A0, U+3000 and the like), so
 * a tokenizer would give it no token of its own; 0 otherwise, invalid
 * UTF-8 included (tokenizer_encode reports that). */
int tokenizer_text_blank(const char *text, size_t len);

/* Turns n ids (borrowed) back into text as Hugging Face's tokenizers
 * decode with skip_special_tokens: special tokens are left out and the
 * rest joined by the model's decoder (WordPiece: a continuation's "##"
 * dropped, a space before every other token, " ." and the like tightened;
 * SentencePiece-style BPE: "▁" a space, a run of <0xNN> tokens its bytes
 * when they are whole UTF-8 and one U+FFFD per token otherwise).
 * Writes at most cap - 1 bytes and a NUL into buf (the caller's; cap 0:
 * nothing), like snprintf. Returns the whole text's length in bytes (so a
 * result >= cap means buf holds a cut copy), or TOKENIZER_ERR_ARG for an
 * id out of range, TOKENIZER_ERR_CAP for text over INT_MAX bytes,
 * TOKENIZER_ERR_NOMEM. */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, char *buf,
                     size_t cap);

#endif

/* wordpiece.h - the BERT WordPiece tokenizer, id for id what Hugging Face's
 * fast BertTokenizerFast (the Rust `tokenizers` library) produces (callers
 * outside text/ use it through tokenizer.h; wp_tokenizer.c fills that
 * interface's table):
 *
 *   1. special tokens written literally in the text ("[CLS]", "[MASK]",
 *      ...) are matched first, on the raw bytes, leftmost-longest, and
 *      become single tokens; the text between them goes through 2-4;
 *   2. normalizer: clean_text (drop U+0000, U+FFFD and control/format/
 *      private-use characters; every whitespace character becomes ' '),
 *      chinese_chars (spaces around CJK ideographs), strip_accents (NFD,
 *      then drop nonspacing marks), lowercase (per character, U+0130 gives
 *      "i" + U+0307), in that order;
 *   3. pre-tokenizer: split on whitespace; each punctuation character
 *      (ASCII punctuation or a Unicode P* category) is a word of its own;
 *   4. WordPiece: greedy longest-match-first over the vocabulary, pieces
 *      after the first carry the continuation prefix ("##"); a word longer
 *      than max_word_chars characters, or with a piece that matches
 *      nothing, becomes the unk token;
 *   5. [CLS] A [SEP] (type ids 0), or [CLS] A [SEP] B [SEP] with B and its
 *      [SEP] of type id 1; optional truncation to a maximum length,
 *      specials included, longest_first between the two sequences.
 *
 * Unicode: categories, canonical decomposition and lowercasing come from
 * libutf8proc. The reference classifies characters with older tables
 * (categories as of Unicode 8) and lowercases with newer ones (Unicode 16),
 * so a short table in unicode.c records the code points where the two
 * disagree; tests/test_wordpiece.c checks every code point against the
 * reference's own answers (tests/data/wordpiece/unicode.tsv).
 *
 * Hostile input: text must be valid UTF-8 (no overlong forms, surrogates,
 * truncated sequences or bytes past U+10FFFF); anything else is refused
 * with WP_ERR_UTF8 and the byte offset, never read past len. NUL bytes
 * inside len are U+0000, which clean_text removes. Work and memory are
 * linear in the input length.
 *
 * Threads: a loaded wp_tokenizer is never modified and may be used from
 * any number of threads at once; each thread brings its own wp_scratch,
 * where encoding keeps everything it needs between calls, so a warm
 * scratch makes wp_encode allocation-free.
 *
 * Ownership, for every function below: a tokenizer passed as const is
 * borrowed for the call; paths, settings and input text are borrowed for
 * the call; (errstr, errstr_size) is the caller's buffer for a message on
 * failure (NULL or 0: no message); what a function returns is either new
 * (the caller frees it with the matching _destroy) or borrowed, as said. */
#ifndef KINFER_WORDPIECE_H
#define KINFER_WORDPIECE_H

#include <stddef.h>
#include <stdint.h>

#define WP_TOKEN_MAX 128                  /* bytes of a token string in wp_conf, NUL included */
#define WP_MAX_FILE_BYTES ((size_t)64 << 20) /* vocab.txt / tokenizer*.json larger than this:
                                                refused (TOKENIZER_MAX_FILE_BYTES) */

/* Settings (plain data). wp_conf_defaults gives bert-base-uncased's. The
 * token strings are the vocabulary entries used as specials; pad_token and
 * mask_token may be "" for a vocabulary without them, the others may not. */
struct wp_conf {
    int lowercase;           /* 1: lowercase every character */
    int strip_accents;       /* 1, 0, or -1: follow lowercase */
    int chinese_chars;       /* 1: CJK ideographs become words of their own */
    int clean_text;          /* 1: drop controls, NUL, U+FFFD; whitespace -> ' ' */
    size_t max_word_chars;   /* words longer than this (in characters) -> unk; 100 */
    char unk_token[WP_TOKEN_MAX];
    char cls_token[WP_TOKEN_MAX];
    char sep_token[WP_TOKEN_MAX];
    char pad_token[WP_TOKEN_MAX];
    char mask_token[WP_TOKEN_MAX];
    char prefix[WP_TOKEN_MAX]; /* continuing_subword_prefix, "##" */
};

/* What wp_encode can answer besides a token count. The first two are the
 * caller's input (answer invalid_input); the others are the caller's own
 * arguments or the machine. */
enum wp_err {
    WP_ERR_UTF8 = -1,     /* text or pair is not valid UTF-8 */
    WP_ERR_TOO_LONG = -2, /* over max_len and truncate == 0 */
    WP_ERR_ARG = -3,      /* max_len too small to hold the specials, NULL ids */
    WP_ERR_CAP = -4,      /* the result needs more than cap entries */
    WP_ERR_NOMEM = -5,    /* growing the scratch failed */
};

struct wp_tokenizer;
struct wp_scratch;

/* Fills c with bert-base-uncased's settings: lowercase, strip_accents -1,
 * chinese_chars and clean_text on, 100 characters per word, "[UNK]",
 * "[CLS]", "[SEP]", "[PAD]", "[MASK]", "##". c is the caller's. */
void wp_conf_defaults(struct wp_conf *c);

/* Reads vocab_txt (one token per line, id = line number; a trailing "\r"
 * and other trailing whitespace are trimmed from each line, as the
 * reference reads it) with the settings c (borrowed for the call).
 * Refuses invalid UTF-8, repeated tokens, a missing unk/cls/sep token (or
 * a named pad/mask token that is absent) and files over
 * WP_MAX_FILE_BYTES. Returns a new tokenizer (free with wp_destroy), or
 * NULL with errstr filled ("PATH: line 7: token \"a\" repeats line 3"). */
struct wp_tokenizer *wp_load_vocab(const char *vocab_txt, const struct wp_conf *c,
                                   char *errstr, size_t errstr_size);

/* Reads a Hugging Face tokenizer.json that describes a BERT WordPiece
 * tokenizer: a BertNormalizer, a BertPreTokenizer, a WordPiece model, a
 * BertProcessing or BERT-shaped TemplateProcessing post-processor, a
 * WordPiece decoder or none, and added_tokens matched on the raw text
 * (normalized, lstrip, rstrip and single_word all false; "special" marks
 * the ones wp_decode leaves out). Anything else (a BPE model, another normalizer,
 * repeated tokens or ids, ids outside 0..N-1, an added token or
 * post-processor id that disagrees with the vocabulary, a file over
 * WP_MAX_FILE_BYTES) is refused with a message naming it. The pad id is
 * padding.pad_id when the file sets one, else that of "[PAD]" if present;
 * the mask id that of "[MASK]" if present. Returns a new tokenizer, or
 * NULL with errstr filled. */
struct wp_tokenizer *wp_load_json(const char *tokenizer_json, char *errstr, size_t errstr_size);

/* Reads a Hugging Face tokenizer_config.json into c (the caller's, which
 * should hold wp_conf_defaults first: keys the file lacks leave c as it
 * is): do_lower_case, strip_accents (null or bool), tokenize_chinese_chars,
 * and unk/cls/sep/pad/mask_token (a string or {"content": ...}). Stores
 * model_max_length in *model_max_length (may be NULL): 0 when the file has
 * none or the "no limit" placeholder (anything of 2^53 or more). Returns
 * 0, or -1 with errstr filled (bad JSON, a key of the wrong type, a token
 * string of WP_TOKEN_MAX bytes or more). */
int wp_read_config_json(const char *tokenizer_config_json, struct wp_conf *c,
                        size_t *model_max_length, char *errstr, size_t errstr_size);

/* Frees t. Accepts NULL. No thread may still be using t. */
void wp_destroy(struct wp_tokenizer *t);

/* The settings t runs with (borrowed from t; strip_accents as written,
 * possibly -1). For wp_load_json, what the file said. */
const struct wp_conf *wp_get_conf(const struct wp_tokenizer *t);

/* Number of ids: every id is in 0..wp_vocab_size-1. */
size_t wp_vocab_size(const struct wp_tokenizer *t);
/* The id of token (NUL-terminated, borrowed), or -1 if absent. */
int32_t wp_token_id(const struct wp_tokenizer *t, const char *token);
/* The token string of id (borrowed from t), or NULL if out of range. */
const char *wp_id_token(const struct wp_tokenizer *t, int32_t id);
/* The special tokens' ids; pad and mask are -1 when the vocabulary has
 * none. */
int32_t wp_unk_id(const struct wp_tokenizer *t);
int32_t wp_cls_id(const struct wp_tokenizer *t);
int32_t wp_sep_id(const struct wp_tokenizer *t);
int32_t wp_pad_id(const struct wp_tokenizer *t);
int32_t wp_mask_id(const struct wp_tokenizer *t);

/* A per-thread work area for wp_encode and wp_normalize; it grows to the
 * input at hand and keeps up to WP_SCRATCH_KEEP bytes per buffer between
 * calls, so reusing one per thread makes later calls of ordinary rows
 * allocation-free while one huge row does not pin its peak. expect_len (bytes of text + pair) sizes it
 * up front; 0 lets it grow on first use. Returns a new scratch (free with
 * wp_scratch_destroy), or NULL if out of memory. */
struct wp_scratch *wp_scratch_new(size_t expect_len);
/* Frees s. Accepts NULL. */
void wp_scratch_destroy(struct wp_scratch *s);
/* Bytes a buffer of the scratch keeps between calls; a buffer a call grew
 * past this is given back (shrunk to it) when the call ends (wp_encode)
 * or when the next call starts (wp_normalize, whose result lives there). */
#define WP_SCRATCH_KEEP ((size_t)64 * 1024)
/* Bytes s holds now (its buffers' capacities): for tests and metrics. */
size_t wp_scratch_bytes(const struct wp_scratch *s);

/* Encodes text (len bytes, borrowed; need not be NUL-terminated) and, if
 * pair is not NULL, pair (pair_len bytes, borrowed; "" is an empty second
 * sequence) into ids and type_ids (the caller's, cap entries each;
 * type_ids may be NULL), [CLS] and [SEP] included.
 * max_len 0 means no limit. Otherwise, when the result would be longer
 * than max_len: with truncate set, the sequences are cut to fit
 * (longest_first for a pair: both cut towards an even share, the longer
 * one first, as the reference does); without it, WP_ERR_TOO_LONG ("input
 * is 512 tokens, over the limit of 128"). max_len below 2 (3 for a pair)
 * with truncate set is WP_ERR_ARG.
 * *full_len (may be NULL) gets the untruncated length, specials included,
 * whenever the text was valid UTF-8 (also with WP_ERR_TOO_LONG and
 * WP_ERR_CAP). s (the caller's) is used for all work. Returns the number
 * of entries written, or an enum wp_err with errstr filled. */
int wp_encode(const struct wp_tokenizer *t, struct wp_scratch *s, const char *text, size_t len,
              const char *pair, size_t pair_len, size_t max_len, int truncate, int32_t *ids,
              int32_t *type_ids, size_t cap, size_t *full_len, char *errstr, size_t errstr_size);

/* Decodes n ids (borrowed) as the reference's decode with
 * skip_special_tokens: special tokens (the added tokens tokenizer.json
 * marks special; for vocab.txt, unk/cls/sep/pad/mask) are left out, and
 * the rest go through the file's decoder (WordPiece: from the second
 * token on, one starting with the prefix loses it and any other gets a
 * space before it; with cleanup, " ." " ?" " !" " ," and the like are
 * tightened within each token; no decoder: joined by spaces). Writes at
 * most cap - 1 bytes and a NUL into buf, like snprintf. Returns the whole
 * text's length, or WP_ERR_ARG (an id out of range, NULL buffers),
 * WP_ERR_CAP (over INT_MAX bytes), WP_ERR_NOMEM. */
int wp_decode(const struct wp_tokenizer *t, const int32_t *ids, size_t n, char *buf, size_t cap);

/* Runs only the normalizer (step 2; no special-token matching) over text
 * (len bytes, borrowed), as the reference's normalizer.normalize_str does:
 * for logs and tests. Returns the normalized UTF-8, *out_len bytes, owned
 * by s and valid until its next use, or NULL with errstr filled (invalid
 * UTF-8, out of memory). */
const char *wp_normalize(const struct wp_tokenizer *t, struct wp_scratch *s, const char *text,
                         size_t len, size_t *out_len, char *errstr, size_t errstr_size);

#endif

/* bpe_impl.h - BPE as Hugging Face's `tokenizers` runs it, id for id
 * (tests/test_bpe.c and tests/test_bpe_sp.c check that against goldens
 * from the library itself), in two flavours: byte-level (GPT-2, RoBERTa,
 * Llama 3, Qwen) and SentencePiece-style (Llama 2, Mistral, TinyLlama:
 * characters, "▁" for the space, byte fallback). What text/bpe.c
 * (encoding, decoding, the interface's table), text/bpe_load.c
 * (tokenizer.json's model, or vocab.json + merges.txt), text/bpe_comp.c
 * (tokenizer.json's normalizer, pre-tokenizer and decoder), text/bpe_post.c
 * (added tokens, templates) and text/bpe_sp.c (the SentencePiece-style
 * steps) share. Private to those files; callers use tokenizer.h.
 *
 * Encoding, as the reference does it:
 *   1. added tokens whose "normalized" is false are found in the raw text
 *      (leftmost-longest; lstrip/rstrip take the whitespace beside them);
 *   2. the text between them is normalized (none, or NFC);
 *   3. added tokens whose "normalized" is true are found in that;
 *   4. the pre-tokenizer splits what is left: zero or more Split steps
 *      (the folder's regex, Isolated or Removed), then ByteLevel
 *      (add_prefix_space puts a space before a piece that lacks one;
 *      use_regex splits with GPT-2's regex); every byte becomes its
 *      GPT-2 byte character;
 *   5. BPE: each piece's bytes merged by rank, lowest rank first and
 *      leftmost among equals, as the reference's priority queue does;
 *      ignore_merges takes a piece that is a whole token as it is;
 *   6. the post-processor lays out the specials and type ids (held as a
 *      template: RobertaProcessing, TemplateProcessing, ByteLevel and none
 *      all become one), after truncation (longest_first) when asked.
 * SentencePiece-style (no ByteLevel anywhere; bpe_sp.c): step 2 may also
 * Prepend and Replace (Llama 2's first form: "▁" before the text, every
 * space "▁"); step 4 is Metaspace (spaces become "▁", one is put in front
 * as prepend_scheme says, split before each "▁" if asked) or nothing;
 * step 5 starts from the piece's characters, and a character without a
 * token becomes its bytes' <0xNN> tokens (byte_fallback, when all are in
 * the vocabulary) or the unk token (runs fused with fuse_unk); decoding
 * runs the decoder's steps (Replace, ByteFallback, Fuse, Strip, Metaspace)
 * over the tokens' strings.
 *
 * Regexes run on PCRE2 (UTF, UCP, JIT); the reference runs Oniguruma,
 * whose \s is Unicode's White_Space: PCRE2's lacks U+0085, so \s and \S
 * are rewritten to include it (bpe_load.c).
 *
 * Threads and ownership: a loaded bpe_tok is read-only and shared by any
 * number of threads; each brings its own bpe_scratch. A bpe_tok owns its
 * pools, tables and compiled regexes. */
#ifndef KINFER_BPE_IMPL_H
#define KINFER_BPE_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer.h"

#define BPE_MAX_SPLITS 4          /* Split steps before ByteLevel */
#define BPE_TMPL_MAX 16           /* items of a post-processing template */
#define BPE_ADDED_MAX_BYTES 256   /* longest added token matched in text */
#define BPE_MAX_STEPS 8           /* normalizer or decoder steps */
#define BPE_FNV_OFFSET 0xcbf29ce484222325ull
#define BPE_FNV_PRIME 0x100000001b3ull

/* One node of an added-token trie (as wp_impl.h's): the id ending here
 * or -1, and its edges sorted by byte. */
struct bpe_tnode {
    int32_t id;
    uint32_t edge0, n_edges;
};

struct bpe_tedge {
    uint32_t child;
    unsigned char byte;
};

/* The added tokens matched in one pass (raw text, or normalized). */
struct bpe_trie {
    struct bpe_tnode *tn;     /* NULL: none; root is tn[0] */
    struct bpe_tedge *te;
    unsigned char first[32];  /* bitmap of first bytes */
};

/* One step of a template: a sequence (A = 0, B = 1) or a special
 * token's ids (ids[id0 .. id0 + n_ids) of the template pool). */
struct bpe_titem {
    int seq;                  /* 0, 1: a sequence; -1: specials */
    uint32_t id0, n_ids;
    int32_t type_id;
};

struct bpe_template {
    struct bpe_titem it[BPE_TMPL_MAX];
    size_t n;
    size_t n_special;         /* ids the specials add */
};

/* A Split step: its compiled pattern, and whether matches are kept as
 * pieces (Isolated) or dropped (Removed). */
struct bpe_split {
    pcre2_code *re;
    int removed;
};

/* A normalizer or decoder step of the SentencePiece-style flavour
 * (bpe_comp.c reads them, bpe_sp.c runs them). from, to: Replace's
 * pattern and content, Prepend's text (to), Strip's and Metaspace's
 * character (from); owned. */
enum bpe_step_kind {
    BPE_N_PREPEND,
    BPE_N_REPLACE,
    BPE_D_REPLACE,
    BPE_D_BYTEFALLBACK,
    BPE_D_FUSE,
    BPE_D_STRIP,
    BPE_D_METASPACE,
};

enum bpe_prepend { BPE_PREPEND_NEVER, BPE_PREPEND_ALWAYS, BPE_PREPEND_FIRST };

struct bpe_step {
    int kind;
    char *from, *to;
    size_t from_len, to_len;
    int left, right;          /* Strip: characters taken at the start, at the end */
    int prepend;              /* Metaspace decoder: enum bpe_prepend */
};

/* A growable byte buffer (a scratch's). */
struct bpe_buf {
    char *p;
    size_t n, cap;
};

struct bpe_tok {
    /* vocabulary: id -> token, and an open-addressing table back */
    char *pool;
    size_t *tok_off;
    uint32_t *tok_len;
    size_t n_ids;
    int32_t *slots;
    uint64_t *slot_hash;
    size_t slot_mask;
    /* merges: (left << 32 | right) -> rank and the merged id */
    uint64_t *mkey;
    uint32_t *mrank;
    int32_t *mnew;
    size_t m_mask;
    size_t n_merges;
    /* GPT-2's byte characters: byte -> its token id (-1: absent) and its
     * UTF-8; code point (< 512) -> byte (-1: not a byte character) */
    int32_t byte_id[256];
    char byte_utf8[256][2];
    unsigned char byte_utf8_len[256];
    int16_t cp_byte[512];
    /* model options */
    int32_t model_unk;        /* model.unk_token's id, -1: none (a character without
                                 a token is then dropped, as the reference does) */
    int fuse_unk;
    int ignore_merges;
    /* normalizer: 1 for NFC */
    int nfc;
    /* pre-tokenizer */
    struct bpe_split split[BPE_MAX_SPLITS];
    size_t n_split;
    int add_prefix_space;
    pcre2_code *bl_re;        /* ByteLevel's GPT-2 regex; NULL: use_regex false */
    /* added tokens */
    struct bpe_trie raw, norm;
    unsigned char *aflags;    /* id -> BPE_A_* */
    /* post-processor */
    struct bpe_template single, pair;
    int32_t *tids;            /* the templates' special ids */
    size_t n_tids;
    /* decoder: 1 ByteLevel, 0 none (tokens joined by spaces, unless
     * n_dstep says otherwise) */
    int dec_bytelevel;
    /* the SentencePiece-style flavour (sp 1): normalizer steps after NFC,
     * Metaspace (meta 1: its replacement character, prepend scheme,
     * split), byte fallback's <0xNN> ids (-1: absent), decoder steps */
    int sp;
    size_t n_model;           /* ids below are model.vocab's (the rest: added tokens,
                                 which the model itself never looks up) */
    int byte_fallback;
    int32_t bf_id[256];
    struct bpe_step nstep[BPE_MAX_STEPS];
    size_t n_nstep;
    int meta;
    char meta_rep[4];
    size_t meta_rep_len;
    int meta_prepend;         /* enum bpe_prepend */
    int meta_split;
    struct bpe_step dstep[BPE_MAX_STEPS];
    size_t n_dstep;
    int32_t cls, sep, pad, unk, mask; /* the interface's specials */
};

enum {
    BPE_A_ADDED = 1,          /* an added token */
    BPE_A_SPECIAL = 2,        /* special: decoding leaves it out */
    BPE_A_LSTRIP = 4,
    BPE_A_RSTRIP = 8,
};

/* Formats into the caller's error buffer (NULL or 0: nothing). */
void bpe_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The loaders (bpe_load.c): tokenizer.json parsed (root borrowed, path for
 * messages), or the folder's vocab.json + merges.txt with
 * tokenizer_config.json. *max_tokens gets tokenizer_config.json's
 * model_max_length (0: none). New bpe_tok, or NULL with errstr filled. */
struct bpe_tok *bpe_from_json(const char *dir, const json_t *root, const char *path,
                              size_t *max_tokens, char *errstr, size_t errstr_size);
struct bpe_tok *bpe_from_files(const char *dir, size_t *max_tokens, char *errstr,
                               size_t errstr_size);
void bpe_destroy(struct bpe_tok *t);

/* The pre-tokenizer alone (no added tokens, no normalizer), as the
 * reference's pre_tokenize_str: fn(ctx, piece, n) gets each piece BPE
 * would see, as UTF-8 (before the byte characters), in order. scratch is
 * the implementation's (bpe_tokenizer_impl.scratch_new's). For tests and
 * logs. Returns 0, or a tokenizer_err. */
int bpe_pre_tokenize(const struct bpe_tok *t, void *scratch, const char *text, size_t len,
                     void (*fn)(void *ctx, const char *piece, size_t n), void *ctx);

/* Grows *pp to hold need elements of elem bytes (doubling); 0, or -1
 * with *pp and *cap untouched (bpe.c). */
int bpe_grow(void *pp, size_t *cap, size_t need, size_t elem);

/* ---- bpe_comp.c: tokenizer.json's components, for the loaders ---- */

/* key of o as a boolean into *out (absent or null: untouched). 0, or -1
 * with errstr filled. */
int bpe_json_bool(const json_t *o, const char *key, int *out, const char *path,
                  const char *where, char *errstr, size_t errstr_size);
/* root's normalizer, pre_tokenizer and decoder into t (whose model,
 * byte_fallback included, is read): byte-level when the pre-tokenizer
 * holds ByteLevel, SentencePiece-style when it is Metaspace or none. 0,
 * or -1 with errstr filled naming what is not supported. */
int bpe_json_components(struct bpe_tok *t, const json_t *root, const char *path, char *errstr,
                        size_t errstr_size);
/* ByteLevel with GPT-2's regex, as the slow files have it. */
int bpe_bytelevel_gpt2(struct bpe_tok *t, const char *path, char *errstr, size_t errstr_size);
/* Frees the steps' strings. */
void bpe_steps_free(struct bpe_step *st, size_t n);

/* ---- bpe_sp.c: the SentencePiece-style steps, for bpe.c ---- */

/* p[0..n) through the normalizer steps (t->n_nstep > 0), ping-ponging
 * between b[0] and b[1]; *out points into one of them. 0, or -1 (out of
 * memory). */
int bpe_sp_normalize(const struct bpe_tok *t, const char *p, size_t n, struct bpe_buf b[2],
                     const char **out, size_t *out_n);
/* Metaspace over one piece p[0..n) (at0: it starts the original text,
 * for prepend_scheme "first"): spaces to the replacement, one put in
 * front as the scheme says, then split before each replacement if asked;
 * fn(ctx, word, len) for each word, in order, from mb. 0, or -1 (out of
 * memory). */
int bpe_sp_metaspace(const struct bpe_tok *t, const char *p, size_t n, int at0, struct bpe_buf *mb,
                     void (*fn)(void *ctx, const unsigned char *w, size_t n), void *ctx);
/* The first symbols of the word w[0..n) (valid UTF-8) as the reference
 * makes them: each character's token; else its bytes' <0xNN> tokens if
 * byte_fallback and all exist; else the unk token (consecutive ones
 * fused with fuse_unk; a pending unk is written when the next character
 * with a token comes, or at the end, after any byte tokens between), or
 * nothing without one. ids has room for n. Returns the count. */
size_t bpe_sp_symbols(const struct bpe_tok *t, const unsigned char *w, size_t n, int32_t *ids);
/* tokenizer_decode for a tokenizer with decoder steps: the non-special
 * tokens' strings through t->dstep, joined, written like snprintf but
 * never ending in half a character. Length, or a tokenizer_err. */
int bpe_sp_decode(const struct bpe_tok *t, const int32_t *ids, size_t n, char *buf, size_t cap);

/* FNV-1a over n bytes from h. */
static inline uint64_t bpe_hash(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * BPE_FNV_PRIME;
    return h;
}

static inline size_t bpe_slot(uint64_t h, size_t mask)
{
    return (size_t)(h ^ (h >> 31) ^ (h >> 47)) & mask;
}

/* The id of the token s (n bytes), or -1. */
static inline int32_t bpe_find(const struct bpe_tok *t, const char *s, size_t n)
{
    uint64_t h = bpe_hash(s, n, BPE_FNV_OFFSET);
    for (size_t i = bpe_slot(h, t->slot_mask);; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (t->slot_hash[i] == h && t->tok_len[id] == n &&
            memcmp(t->pool + t->tok_off[id], s, n) == 0)
            return id;
    }
}

/* The id of the model's token s (n bytes), or -1: bpe_find without the
 * added tokens outside model.vocab, as the reference's model sees its
 * vocabulary. */
static inline int32_t bpe_find_model(const struct bpe_tok *t, const char *s, size_t n)
{
    int32_t id = bpe_find(t, s, n);
    return id >= 0 && (size_t)id < t->n_model ? id : -1;
}

/* The merge of (a, b): its rank with *new_id set, or UINT32_MAX. */
static inline uint32_t bpe_merge(const struct bpe_tok *t, int32_t a, int32_t b, int32_t *new_id)
{
    if (!t->n_merges) return UINT32_MAX;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    for (size_t i = bpe_slot(h, t->m_mask);; i = (i + 1) & t->m_mask) {
        if (t->mnew[i] < 0) return UINT32_MAX;
        if (t->mkey[i] == k) {
            *new_id = t->mnew[i];
            return t->mrank[i];
        }
    }
}

/* ---- bpe_post.c: added tokens and templates, for the loaders ---- */

/* One added token as a loader found it. */
struct bpe_added {
    const char *s;
    size_t n;
    int32_t id;
    int special, lstrip, rstrip, normalized;
};

/* No post-processor: A, and A B with B's type id 1. */
int bpe_tmpl_default(struct bpe_tok *t);
/* A JSON component's "type". */
const char *bpe_type(const json_t *o);
/* RobertaProcessing's layout: <s> A </s>, <s> A </s></s> B </s>. */
int bpe_tmpl_roberta(struct bpe_tok *t, int32_t cls, int32_t sep);
/* The post-processor of tokenizer.json. */
int bpe_json_post(struct bpe_tok *t, const json_t *pp, const char *path, char *errstr,
                  size_t errstr_size);
/* The interface's cls and sep, from the single template. */
void bpe_cls_sep(struct bpe_tok *t);
/* The tries and flags of the added tokens a[0..n). */
int bpe_set_added(struct bpe_tok *t, const struct bpe_added *a, size_t n, const char *path,
                  char *errstr, size_t errstr_size);

#endif

/* wp_impl.h - what the WordPiece files share and nobody else sees: the
 * loaded tokenizer's layout (wp_load.c builds it, wordpiece.c reads it)
 * and the vocabulary lookup both need. Private to text/wordpiece.c and
 * text/wp_load.c; the public API is wordpiece.h.
 *
 * Threads and ownership: as wordpiece.h says. */
#ifndef KINFER_WP_IMPL_H
#define KINFER_WP_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <string.h>

#include "wordpiece.h"

#define WP_SPECIAL_MAX_BYTES 256      /* longest special/added token accepted */
#define WP_FNV_OFFSET 0xcbf29ce484222325ull
#define WP_FNV_PRIME 0x100000001b3ull

/* One node of the special-token trie: the id of the token that ends here
 * (or -1) and its outgoing edges, sorted by byte, in the edge array. */
struct wp_tnode {
    int32_t id;
    uint32_t edge0;
    uint32_t n_edges;
};

struct wp_tedge {
    uint32_t child;
    unsigned char byte;
};

struct wp_tokenizer {
    struct wp_conf conf;      /* as given or as the file said */
    int strip;                /* strip_accents resolved against lowercase */
    char *pool;               /* every token, NUL-terminated, by id */
    size_t *tok_off;          /* id -> offset in pool */
    uint32_t *tok_len;        /* id -> bytes */
    size_t n_ids;
    int32_t *slots;           /* open-addressing table of ids, -1 = empty */
    uint64_t *slot_hash;      /* FNV-1a of each slot's token */
    size_t slot_mask;
    size_t max_start;         /* longest token, bytes */
    size_t max_cont;          /* longest token after the prefix, among prefixed ones */
    size_t prefix_len;
    uint64_t prefix_hash;     /* FNV-1a state after the prefix */
    int32_t unk, cls, sep, pad, mask;
    struct wp_tnode *tn;      /* special-token trie, NULL if none; root is tn[0] */
    struct wp_tedge *te;
    unsigned char first[32];  /* bitmap of the specials' first bytes */
    unsigned char *special;   /* id -> 1: a special token, which decoding leaves out */
    char dec_prefix[WP_TOKEN_MAX]; /* the decoder's continuation prefix */
    int dec_cleanup;          /* the decoder tightens " ." and the like */
    int dec_none;             /* no decoder: tokens joined by spaces, as they are */
};

/* Formats into the caller's error buffer; every failure path goes through
 * here so a NULL or zero-sized buffer is handled once. */
void wp_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* wp_load_json's work on a parsed file (root borrowed, path for messages):
 * tokenizer.c parses tokenizer.json once and hands it here. */
struct wp_tokenizer *wp_from_json(const json_t *root, const char *path, char *errstr,
                                  size_t errstr_size);

/* ---- vocabulary table ------------------------------------------------------ */

/* FNV-1a, fed a byte at a time so a word's candidate pieces are hashed in
 * one forward pass. */
static inline uint64_t wp_fnv(uint64_t h, unsigned char b)
{
    return (h ^ b) * WP_FNV_PRIME;
}

/* Hash of a whole byte string from the FNV offset basis. */
static inline uint64_t wp_hash(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) h = wp_fnv(h, (unsigned char)s[i]);
    return h;
}

/* Slot index for a hash: FNV's high bits mixed down, since its low bits
 * alone cluster. */
static inline size_t wp_slot(const struct wp_tokenizer *t, uint64_t h)
{
    return (size_t)(h ^ (h >> 31) ^ (h >> 47)) & t->slot_mask;
}

/* Finds the id of the token a+b (the prefix, or nothing, then a piece of
 * a word) given its hash h; -1 if it is not in the vocabulary. Splitting
 * the key in two spares building "##piece" strings in the hot loop. */
static inline int32_t wp_lookup(const struct wp_tokenizer *t, uint64_t h, const char *a,
                                size_t alen, const char *b, size_t blen)
{
    size_t i = wp_slot(t, h);
    for (;;) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (t->slot_hash[i] == h && t->tok_len[id] == alen + blen) {
            const char *tok = t->pool + t->tok_off[id];
            if (memcmp(tok, a, alen) == 0 && memcmp(tok + alen, b, blen) == 0) return id;
        }
        i = (i + 1) & t->slot_mask;
    }
}

/* Looks up a NUL-terminated token. */
static inline int32_t wp_find(const struct wp_tokenizer *t, const char *tok)
{
    size_t n = strlen(tok);
    return wp_lookup(t, wp_hash(tok, n, WP_FNV_OFFSET), tok, n, "", 0);
}

#endif

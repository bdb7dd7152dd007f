/* ug_impl.h - what the Unigram files share and nobody else sees: the
 * loaded tokenizer's layout (ug_load.c builds it, unigram.c reads it).
 * Private to text/unigram.c and text/ug_load.c; the public API is
 * unigram.h.
 *
 * Threads and ownership: as unigram.h says. */
#ifndef KINFER_UG_IMPL_H
#define KINFER_UG_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "unigram.h"

#define UG_MAX_STEPS 8        /* normalizers, pre-tokenizers, decoders in a Sequence */
#define UG_MAX_TMPL 16        /* ids in a post-processor template */
#define UG_K_UNK_PENALTY 10.0 /* the reference's: unk scores min_score - 10 */

/* A byte trie: node 0 is the root; a node's edges are contiguous in the
 * edge array, sorted by byte. id is the entry that ends at the node, or -1. */
struct ug_tnode {
    int32_t id;
    uint32_t edge0;
    uint32_t n_edges;
};

struct ug_tedge {
    uint32_t child;
    unsigned char byte;
};

struct ug_trie {
    struct ug_tnode *n;
    struct ug_tedge *e;
    size_t nn, ne;
};

enum ug_norm_kind { UG_N_PRECOMPILED, UG_N_NFKC, UG_N_REPLACE, UG_N_SPACES, UG_N_STRIP };
enum ug_pre_kind { UG_P_METASPACE, UG_P_WSSPLIT };
enum ug_dec_kind { UG_D_METASPACE, UG_D_BYTEFALLBACK, UG_D_FUSE, UG_D_REPLACE, UG_D_STRIP };
enum ug_prepend { UG_PREPEND_NEVER, UG_PREPEND_ALWAYS, UG_PREPEND_FIRST };

/* One step of the normalizer, pre-tokenizer or decoder. from/to: Replace's
 * strings (owned), or the content UG_N_SPACES puts for a run of spaces;
 * cp: Metaspace's replacement or Strip's character. */
struct ug_step {
    int kind;
    char *from, *to;
    size_t from_len, to_len;
    uint32_t cp;
    int left, right;  /* Strip: normalizer flags, or decoder counts */
    int prepend;      /* enum ug_prepend */
    int split;
};

/* A post-processor template entry: a special id, or sequence A (-1) / B
 * (-2), with its type id. */
struct ug_tmpl {
    int32_t id;
    int32_t type_id;
};

struct ug_tokenizer {
    char *pool;              /* every token, NUL-terminated, by id */
    size_t *tok_off;         /* id -> offset in pool */
    uint32_t *tok_len;       /* id -> bytes */
    double *score;           /* piece id -> score (ids < n_pieces) */
    size_t n_pieces, n_ids;
    unsigned char *special;  /* id -> 1: a special added token (decode leaves it out) */
    unsigned char *astrip;   /* id -> bit 0 lstrip, bit 1 rstrip (added tokens) */
    int32_t unk;
    int byte_fallback;
    int32_t byte_id[256];    /* <0xNN> piece ids, -1 where absent */
    double unk_score;
    struct ug_trie pieces;   /* the model's pieces */
    struct ug_trie added;    /* added tokens matched on the raw text; nn 0: none */

    uint32_t *pc_units;      /* Precompiled: the double array (host order) */
    size_t pc_n;
    char *pc_norm;           /* its replacement strings, NUL-separated */
    size_t pc_norm_len;

    struct ug_step norm[UG_MAX_STEPS], pre[UG_MAX_STEPS], dec[UG_MAX_STEPS];
    size_t n_norm, n_pre, n_dec;
    int has_decoder;
    struct ug_tmpl single[UG_MAX_TMPL], pair[UG_MAX_TMPL];
    size_t n_single, n_pair;
    int32_t cls, sep, pad, mask;
};

/* Formats into the caller's error buffer (NULL or 0: nothing). */
void ug_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The id of the entry s (n bytes) in trie, or -1. */
int32_t ug_trie_find(const struct ug_trie *trie, const char *s, size_t n);

/* The child of node for byte b, or -1. */
static inline int64_t ug_trie_step(const struct ug_trie *trie, uint32_t node, unsigned char b)
{
    const struct ug_tnode *nd = &trie->n[node];
    const struct ug_tedge *e = trie->e + nd->edge0;
    size_t lo = 0, hi = nd->n_edges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e[mid].byte < b) lo = mid + 1;
        else hi = mid;
    }
    if (lo == nd->n_edges || e[lo].byte != b) return -1;
    return e[lo].child;
}

/* A growable byte buffer of unigram.c. */
struct ug_buf {
    char *p;
    size_t n, cap;
};

/* Grows an array to hold need elements of elem bytes (doubling); returns
 * the new pointer, or NULL with p and *cap untouched. */
void *ug_grow(void *p, size_t *cap, size_t need, size_t elem);
/* Appends n bytes to b; 0 or -1 (out of memory). */
int ug_put(struct ug_buf *b, const char *s, size_t n);

#endif

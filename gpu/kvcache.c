/* kvcache.c - the block pool and block tables of kvcache.h: a stack of
 * free block ids, one fixed-width table row per sequence slot, and each
 * slot's length. Every operation is O(blocks it moves).
 *
 * Shared prefixes: a block published under a key has a reference count
 * (the tables holding it) and an entry in an open-addressing table (linear
 * probing, at least twice as many slots as blocks, deletion by shifting
 * back) with its tokens for checking. When its count falls to 0 it is
 * idle: kept, at the newest end of a list, still findable, and counted as
 * free; a block taken when the free stack is empty is the oldest idle
 * one, which then loses its entry.
 *
 * Threads and ownership: as kvcache.h says. */
#include "kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvcache {
    size_t n_blocks, block_tokens, max_seqs, max_seq_tokens, width;
    uint32_t *free_ids;   /* stack of free block ids */
    size_t n_free;
    uint32_t *tables;     /* [max_seqs, width] */
    size_t *len;          /* tokens per sequence slot */
    unsigned char *live;  /* per slot */
    /* shared prefixes, per block: */
    uint32_t *refs;       /* tables holding it */
    uint64_t *key;        /* its key when published */
    unsigned char *keyed;
    int32_t *toks;        /* [n_blocks, block_tokens]: a published block's tokens */
    uint32_t *prev, *next; /* the idle list (KV_NONE ends it) */
    uint32_t idle_head, idle_tail; /* oldest, newest */
    size_t n_idle;
    uint32_t *slots;      /* the key table: block ids, KV_NONE empty */
    size_t n_slots;       /* a power of 2 */
};

#define KV_NONE UINT32_MAX

size_t kvcache_blocks_for_budget(size_t budget_bytes, size_t block_bytes)
{
    if (!budget_bytes || !block_bytes) return 0;
    size_t n = budget_bytes / block_bytes;
    return n > (size_t)UINT32_MAX - 1 ? (size_t)UINT32_MAX - 1 : n;
}

/* Blocks that hold len tokens. */
static size_t kv_blocks_of(const struct kvcache *kv, size_t len)
{
    return (len + kv->block_tokens - 1) / kv->block_tokens;
}

struct kvcache *kvcache_new(size_t n_blocks, size_t block_tokens, size_t max_seqs,
                            size_t max_seq_tokens, char *errstr, size_t errstr_size)
{
    if (!n_blocks || !block_tokens || !max_seqs || !max_seq_tokens ||
        n_blocks > (size_t)UINT32_MAX - 1 || block_tokens > (1u << 20) ||
        max_seqs > (1u << 20) || max_seq_tokens > (1u << 30)) {
        snprintf(errstr, errstr_size,
                 "kv cache: %zu blocks of %zu tokens for %zu sequences of %zu tokens is not "
                 "possible", n_blocks, block_tokens, max_seqs, max_seq_tokens);
        return NULL;
    }
    struct kvcache *kv = calloc(1, sizeof(*kv));
    if (!kv) goto oom;
    kv->n_blocks = n_blocks;
    kv->block_tokens = block_tokens;
    kv->max_seqs = max_seqs;
    kv->max_seq_tokens = max_seq_tokens;
    kv->width = kv_blocks_of(kv, max_seq_tokens);
    if (kv->width > SIZE_MAX / sizeof(uint32_t) / max_seqs) goto oom;
    if (!(kv->free_ids = malloc(n_blocks * sizeof(uint32_t))) ||
        !(kv->tables = calloc(max_seqs * kv->width, sizeof(uint32_t))) ||
        !(kv->len = calloc(max_seqs, sizeof(size_t))) || !(kv->live = calloc(max_seqs, 1)))
        goto oom;
    kv->n_slots = 2;
    while (kv->n_slots < 2 * n_blocks) kv->n_slots *= 2;
    if (block_tokens > SIZE_MAX / sizeof(int32_t) / n_blocks ||
        !(kv->refs = calloc(n_blocks, sizeof(uint32_t))) ||
        !(kv->key = calloc(n_blocks, sizeof(uint64_t))) || !(kv->keyed = calloc(n_blocks, 1)) ||
        !(kv->toks = malloc(n_blocks * block_tokens * sizeof(int32_t))) ||
        !(kv->prev = malloc(n_blocks * sizeof(uint32_t))) ||
        !(kv->next = malloc(n_blocks * sizeof(uint32_t))) ||
        !(kv->slots = malloc(kv->n_slots * sizeof(uint32_t))))
        goto oom;
    memset(kv->slots, 0xff, kv->n_slots * sizeof(uint32_t));
    kv->idle_head = kv->idle_tail = KV_NONE;
    /* Lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
    for (size_t i = 0; i < n_blocks; i++) kv->free_ids[i] = (uint32_t)(n_blocks - 1 - i);
    kv->n_free = n_blocks;
    return kv;
oom:
    snprintf(errstr, errstr_size, "kv cache: out of memory for %zu blocks and %zu sequences",
             n_blocks, max_seqs);
    kvcache_destroy(kv);
    return NULL;
}

void kvcache_destroy(struct kvcache *kv)
{
    if (!kv) return;
    free(kv->free_ids);
    free(kv->tables);
    free(kv->len);
    free(kv->live);
    free(kv->refs);
    free(kv->key);
    free(kv->keyed);
    free(kv->toks);
    free(kv->prev);
    free(kv->next);
    free(kv->slots);
    free(kv);
}

size_t kvcache_block_tokens(const struct kvcache *kv)
{
    return kv->block_tokens;
}

size_t kvcache_total_blocks(const struct kvcache *kv)
{
    return kv->n_blocks;
}

size_t kvcache_free_blocks(const struct kvcache *kv)
{
    return kv->n_free + kv->n_idle;
}

size_t kvcache_idle_blocks(const struct kvcache *kv)
{
    return kv->n_idle;
}

/* ---- shared prefixes ------------------------------------------------------ */

uint64_t kvcache_key(uint64_t prev, const int32_t *tokens, size_t n)
{
    uint64_t h = prev ^ 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    h ^= h >> 31; /* splitmix64's finish */
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static size_t kv_slot_of(const struct kvcache *kv, uint64_t key)
{
    return (size_t)(key * 0x9e3779b97f4a7c15ull >> 17) & (kv->n_slots - 1);
}

static void kv_idle_unlink(struct kvcache *kv, uint32_t b)
{
    if (kv->prev[b] != KV_NONE) kv->next[kv->prev[b]] = kv->next[b];
    else kv->idle_head = kv->next[b];
    if (kv->next[b] != KV_NONE) kv->prev[kv->next[b]] = kv->prev[b];
    else kv->idle_tail = kv->prev[b];
    kv->n_idle--;
}

/* Removes b's entry from the key table (shifting later entries of its
 * run back into the hole) and forgets its key. */
static void kv_unpublish(struct kvcache *kv, uint32_t b)
{
    size_t mask = kv->n_slots - 1, i = kv_slot_of(kv, kv->key[b]);
    while (kv->slots[i] != b) i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; kv->slots[j] != KV_NONE; j = (j + 1) & mask) {
        size_t home = kv_slot_of(kv, kv->key[kv->slots[j]]);
        /* the entry at j may fill the hole at i when its home is not in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            kv->slots[i] = kv->slots[j];
            i = j;
        }
    }
    kv->slots[i] = KV_NONE;
    kv->keyed[b] = 0;
}

/* A block for a table: from the free stack, else the oldest idle one. */
static uint32_t kv_take(struct kvcache *kv)
{
    if (kv->n_free) return kv->free_ids[--kv->n_free];
    uint32_t b = kv->idle_head;
    kv_idle_unlink(kv, b);
    kv_unpublish(kv, b);
    return b;
}

/* A table lets go of b: free, or idle when it is published. */
static void kv_release(struct kvcache *kv, uint32_t b)
{
    if (--kv->refs[b]) return;
    if (!kv->keyed[b]) {
        kv->free_ids[kv->n_free++] = b;
        return;
    }
    kv->prev[b] = kv->idle_tail;
    kv->next[b] = KV_NONE;
    if (kv->idle_tail != KV_NONE) kv->next[kv->idle_tail] = b;
    else kv->idle_head = b;
    kv->idle_tail = b;
    kv->n_idle++;
}

long kvcache_find(const struct kvcache *kv, uint64_t key, const int32_t *tokens)
{
    size_t mask = kv->n_slots - 1;
    for (size_t i = kv_slot_of(kv, key); kv->slots[i] != KV_NONE; i = (i + 1) & mask) {
        uint32_t b = kv->slots[i];
        if (kv->key[b] == key &&
            memcmp(kv->toks + (size_t)b * kv->block_tokens, tokens,
                   kv->block_tokens * sizeof(int32_t)) == 0)
            return (long)b;
    }
    return -1;
}

int kvcache_block_idle(const struct kvcache *kv, uint32_t block)
{
    return block < kv->n_blocks && kv->keyed[block] && kv->refs[block] == 0;
}

int kvcache_share(struct kvcache *kv, int id, uint32_t block)
{
    if (!kvcache_seq_live(kv, id) || block >= kv->n_blocks || !kv->keyed[block] ||
        kv->len[id] % kv->block_tokens || kv->len[id] + kv->block_tokens > kv->max_seq_tokens)
        return -1;
    if (kv->refs[block]++ == 0) kv_idle_unlink(kv, block);
    kv->tables[(size_t)id * kv->width + kv->len[id] / kv->block_tokens] = block;
    kv->len[id] += kv->block_tokens;
    return 0;
}

void kvcache_publish(struct kvcache *kv, int id, size_t index, uint64_t key,
                     const int32_t *tokens)
{
    if (!kvcache_seq_live(kv, id) || (index + 1) * kv->block_tokens > kv->len[id]) return;
    uint32_t b = kv->tables[(size_t)id * kv->width + index];
    if (kv->keyed[b] || kvcache_find(kv, key, tokens) >= 0) return;
    size_t mask = kv->n_slots - 1, i = kv_slot_of(kv, key);
    while (kv->slots[i] != KV_NONE) i = (i + 1) & mask;
    kv->slots[i] = b;
    kv->key[b] = key;
    kv->keyed[b] = 1;
    memcpy(kv->toks + (size_t)b * kv->block_tokens, tokens, kv->block_tokens * sizeof(int32_t));
}

size_t kvcache_max_seqs(const struct kvcache *kv)
{
    return kv->max_seqs;
}

size_t kvcache_max_seq_tokens(const struct kvcache *kv)
{
    return kv->max_seq_tokens;
}

size_t kvcache_table_width(const struct kvcache *kv)
{
    return kv->width;
}

int kvcache_seq_live(const struct kvcache *kv, int id)
{
    return id >= 0 && (size_t)id < kv->max_seqs && kv->live[id];
}

int kvcache_seq_new(struct kvcache *kv)
{
    for (size_t i = 0; i < kv->max_seqs; i++)
        if (!kv->live[i]) {
            kv->live[i] = 1;
            kv->len[i] = 0;
            memset(kv->tables + i * kv->width, 0, kv->width * sizeof(uint32_t));
            return (int)i;
        }
    return -1;
}

void kvcache_seq_free(struct kvcache *kv, int id)
{
    if (!kvcache_seq_live(kv, id)) return;
    kvcache_truncate(kv, id, 0);
    kv->live[id] = 0;
}

size_t kvcache_seq_len(const struct kvcache *kv, int id)
{
    return kvcache_seq_live(kv, id) ? kv->len[id] : 0;
}

size_t kvcache_blocks_needed(const struct kvcache *kv, int id, size_t n)
{
    if (!kvcache_seq_live(kv, id)) return SIZE_MAX;
    size_t len = kv->len[id];
    if (n > kv->max_seq_tokens - len) return SIZE_MAX;
    return kv_blocks_of(kv, len + n) - kv_blocks_of(kv, len);
}

int kvcache_fits(const struct kvcache *kv, int id, size_t n)
{
    size_t need = kvcache_blocks_needed(kv, id, n);
    return need != SIZE_MAX && need <= kv->n_free + kv->n_idle;
}

int kvcache_extend(struct kvcache *kv, int id, size_t n)
{
    if (!kvcache_fits(kv, id, n)) return -1;
    uint32_t *row = kv->tables + (size_t)id * kv->width;
    size_t have = kv_blocks_of(kv, kv->len[id]), want = kv_blocks_of(kv, kv->len[id] + n);
    for (size_t b = have; b < want; b++) {
        row[b] = kv_take(kv);
        kv->refs[row[b]] = 1;
    }
    kv->len[id] += n;
    return 0;
}

void kvcache_truncate(struct kvcache *kv, int id, size_t len)
{
    if (!kvcache_seq_live(kv, id) || len >= kv->len[id]) return;
    uint32_t *row = kv->tables + (size_t)id * kv->width;
    size_t keep = kv_blocks_of(kv, len), have = kv_blocks_of(kv, kv->len[id]);
    if (len % kv->block_tokens && kv->keyed[row[keep - 1]]) {
        /* the new end falls inside a published block, which must never
         * be written: this table's alone, it is forgotten; shared, it
         * leaves the table */
        if (kv->refs[row[keep - 1]] == 1) {
            kv_unpublish(kv, row[keep - 1]);
        } else {
            len -= len % kv->block_tokens;
            keep--;
        }
    }
    for (size_t b = have; b-- > keep;) {
        kv_release(kv, row[b]);
        row[b] = 0;
    }
    kv->len[id] = len;
}

const uint32_t *kvcache_table(const struct kvcache *kv, int id)
{
    return kvcache_seq_live(kv, id) ? kv->tables + (size_t)id * kv->width : NULL;
}

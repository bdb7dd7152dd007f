/* kvcache.c - the block pool and block tables of kvcache.h: a stack of
 * free block ids, one fixed-width table row per sequence slot, and each
 * slot's length. Every operation is O(blocks it moves).
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
};

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
    return kv->n_free;
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
    return need != SIZE_MAX && need <= kv->n_free;
}

int kvcache_extend(struct kvcache *kv, int id, size_t n)
{
    if (!kvcache_fits(kv, id, n)) return -1;
    uint32_t *row = kv->tables + (size_t)id * kv->width;
    size_t have = kv_blocks_of(kv, kv->len[id]), want = kv_blocks_of(kv, kv->len[id] + n);
    for (size_t b = have; b < want; b++) row[b] = kv->free_ids[--kv->n_free];
    kv->len[id] += n;
    return 0;
}

void kvcache_truncate(struct kvcache *kv, int id, size_t len)
{
    if (!kvcache_seq_live(kv, id) || len >= kv->len[id]) return;
    uint32_t *row = kv->tables + (size_t)id * kv->width;
    size_t keep = kv_blocks_of(kv, len), have = kv_blocks_of(kv, kv->len[id]);
    for (size_t b = have; b-- > keep;) {
        kv->free_ids[kv->n_free++] = row[b];
        row[b] = 0;
    }
    kv->len[id] = len;
}

const uint32_t *kvcache_table(const struct kvcache *kv, int id)
{
    return kvcache_seq_live(kv, id) ? kv->tables + (size_t)id * kv->width : NULL;
}

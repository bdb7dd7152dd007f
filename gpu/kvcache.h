/* kvcache.h - the host-side bookkeeping of a paged key/value cache: a
 * pool of fixed-size blocks (block_tokens token slots each) and, per
 * sequence, a block table mapping its positions to blocks (position p
 * lives in block table[p / block_tokens], slot p % block_tokens). The
 * cache memory itself is the backend's (backend.h, kv_store and
 * paged_attention); this module only decides which block holds what.
 *
 * Everything is bounded at kvcache_new: the number of blocks, of
 * sequences and of tokens per sequence; nothing allocates afterwards.
 * A sequence id is a small integer 0 .. max_seqs - 1, reused after
 * kvcache_seq_free.
 *
 * Threads: a cache belongs to the one executor that owns the workspace
 * it describes. Ownership: the cache owns its tables; kvcache_table
 * hands out a borrowed row. */
#ifndef KINFER_KVCACHE_H
#define KINFER_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

struct kvcache;

/* Blocks a budget of bytes holds at block_bytes each (0 when either is
 * 0), capped at UINT32_MAX - 1 (block ids are uint32). */
size_t kvcache_blocks_for_budget(size_t budget_bytes, size_t block_bytes);

/* A pool of n_blocks blocks of block_tokens slots, for up to max_seqs
 * sequences of at most max_seq_tokens tokens each. NULL with errstr
 * filled for a zero or oversized count, or out of memory. */
struct kvcache *kvcache_new(size_t n_blocks, size_t block_tokens, size_t max_seqs,
                            size_t max_seq_tokens, char *errstr, size_t errstr_size);
void kvcache_destroy(struct kvcache *kv);

size_t kvcache_block_tokens(const struct kvcache *kv);
size_t kvcache_total_blocks(const struct kvcache *kv);
/* Blocks a table may take now: the free ones and the idle ones (below). */
size_t kvcache_free_blocks(const struct kvcache *kv);
/* Of those, the idle ones: published, held by no table. */
size_t kvcache_idle_blocks(const struct kvcache *kv);
size_t kvcache_max_seqs(const struct kvcache *kv);
size_t kvcache_max_seq_tokens(const struct kvcache *kv);
/* Entries per block table row: ceil(max_seq_tokens / block_tokens). */
size_t kvcache_table_width(const struct kvcache *kv);

/* A new empty sequence: its id, or -1 when max_seqs are live. */
int kvcache_seq_new(struct kvcache *kv);
/* Gives the sequence's blocks back and its id up for reuse; an id not
 * live is ignored. */
void kvcache_seq_free(struct kvcache *kv, int id);
/* 1 when id names a live sequence. */
int kvcache_seq_live(const struct kvcache *kv, int id);
/* Tokens the sequence holds (0 for an id not live). */
size_t kvcache_seq_len(const struct kvcache *kv, int id);

/* Blocks the sequence would take from the pool to grow by n tokens, or
 * SIZE_MAX when it would pass max_seq_tokens (or id is not live). */
size_t kvcache_blocks_needed(const struct kvcache *kv, int id, size_t n);
/* 1 when the sequence can grow by n more tokens now (free blocks and
 * its length limit allow it), else 0. */
int kvcache_fits(const struct kvcache *kv, int id, size_t n);
/* Grows the sequence by n tokens, taking blocks as needed. 0, or -1 with
 * nothing changed when it does not fit. */
int kvcache_extend(struct kvcache *kv, int id, size_t n);
/* Shrinks the sequence to len tokens (len >= its length: nothing),
 * giving back the blocks it no longer needs. A len inside a published
 * block (below) unpublishes it when no other table holds it, else is
 * rounded down to that block's start. */
void kvcache_truncate(struct kvcache *kv, int id, size_t len);

/* Shared prefixes. A full block whose contents are a function of the
 * tokens up to its end alone (a decoder's keys and values at positions
 * from 0) can be published under a key that chains those tokens: key_i =
 * kvcache_key(key_{i-1}, the block's tokens, block_tokens), key_{-1} = 0.
 * Another sequence starting with the same tokens then finds the block
 * (kvcache_find: the key, and the block's own tokens compared) and puts it
 * in its table (kvcache_share) instead of computing it again. Nothing
 * ever writes a block that has a key: a sequence writes only past its
 * length, and a shared block lies before it. A published block no table
 * holds stays findable, idle and counted as free, until a table needs a
 * block and none is free: then the least recently idle one is taken and
 * forgotten. */
uint64_t kvcache_key(uint64_t prev, const int32_t *tokens, size_t n);
/* The published block of key whose block_tokens tokens are tokens, or -1. */
long kvcache_find(const struct kvcache *kv, uint64_t key, const int32_t *tokens);
/* 1 when block is published and held by no table (taking it into a table
 * takes one from kvcache_free_blocks). */
int kvcache_block_idle(const struct kvcache *kv, uint32_t block);
/* Appends published block to the sequence's table; its length must be a
 * multiple of block_tokens and grows by block_tokens. 0, or -1 with
 * nothing changed. */
int kvcache_share(struct kvcache *kv, int id, uint32_t block);
/* Publishes the sequence's block index (wholly within its length) under
 * key, its tokens those given (block_tokens of them, copied); nothing
 * when the block has a key already or another block has this one. */
void kvcache_publish(struct kvcache *kv, int id, size_t index, uint64_t key,
                     const int32_t *tokens);

/* The sequence's block table: kvcache_table_width entries, the first
 * ceil(len / block_tokens) meaningful (the rest 0). Borrowed; NULL for an
 * id not live. */
const uint32_t *kvcache_table(const struct kvcache *kv, int id);

#endif

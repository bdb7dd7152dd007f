/* test_kvcache.c - the paged KV cache's bookkeeping (gpu/kvcache.h):
 * sizing from a byte budget, refusing impossible pools, sequences taking
 * and giving back blocks, the length limit, kvcache_fits agreeing with
 * kvcache_extend, truncation across block boundaries, and a random walk
 * of many sequences checked against a model kept here: no block is ever
 * held by two sequences, every block is either free or held, and each
 * table covers its sequence's length.
 * Shared prefixes (test_shared_walk): sequences whose tokens start with
 * one of a few common prefixes find the published blocks, by chained key,
 * and share them; checked against a model of what each block holds: a
 * block found holds exactly the tokens asked for, a shared block lies
 * wholly before each holder's length, every block is held, idle or free
 * (idle ones findable, counted free, held by none), idle blocks are taken
 * only when no free one is left, and a taken one is never found again
 * under its old key. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../gpu/kvcache.h"
#include "testutil.h"

static void test_budget(void **state)
{
    (void)state;
    assert_int_equal(kvcache_blocks_for_budget(1000, 100), 10);
    assert_int_equal(kvcache_blocks_for_budget(999, 100), 9);
    assert_int_equal(kvcache_blocks_for_budget(99, 100), 0);
    assert_int_equal(kvcache_blocks_for_budget(0, 100), 0);
    assert_int_equal(kvcache_blocks_for_budget(100, 0), 0);
    assert_int_equal(kvcache_blocks_for_budget(SIZE_MAX, 1), (size_t)UINT32_MAX - 1);
}

static void test_refused(void **state)
{
    (void)state;
    char err[256];
    assert_null(kvcache_new(0, 16, 4, 64, err, sizeof(err)));
    assert_non_null(strstr(err, "kv cache"));
    assert_null(kvcache_new(4, 0, 4, 64, err, sizeof(err)));
    assert_null(kvcache_new(4, 16, 0, 64, err, sizeof(err)));
    assert_null(kvcache_new(4, 16, 4, 0, err, sizeof(err)));
}

static void test_basic(void **state)
{
    (void)state;
    char err[256];
    struct kvcache *kv = kvcache_new(5, 4, 2, 10, err, sizeof(err));
    assert_non_null(kv);
    assert_int_equal(kvcache_table_width(kv), 3);
    assert_int_equal(kvcache_free_blocks(kv), 5);
    int a = kvcache_seq_new(kv), b = kvcache_seq_new(kv);
    assert_true(a >= 0 && b >= 0 && a != b);
    assert_int_equal(kvcache_seq_new(kv), -1); /* two live at most */
    assert_int_equal(kvcache_blocks_needed(kv, a, 0), 0);
    assert_int_equal(kvcache_blocks_needed(kv, a, 1), 1);
    assert_int_equal(kvcache_blocks_needed(kv, a, 4), 1);
    assert_int_equal(kvcache_blocks_needed(kv, a, 5), 2);
    assert_int_equal(kvcache_blocks_needed(kv, a, 11), SIZE_MAX); /* past the limit */
    assert_int_equal(kvcache_extend(kv, a, 3), 0);
    assert_int_equal(kvcache_seq_len(kv, a), 3);
    assert_int_equal(kvcache_free_blocks(kv), 4);
    assert_int_equal(kvcache_blocks_needed(kv, a, 1), 0); /* slot 3 of block 0 */
    assert_int_equal(kvcache_extend(kv, a, 2), 0);       /* crosses into block 1 */
    assert_int_equal(kvcache_free_blocks(kv), 3);
    assert_int_equal(kvcache_extend(kv, b, 10), 0);      /* 3 blocks: the pool is empty */
    assert_int_equal(kvcache_free_blocks(kv), 0);
    assert_false(kvcache_fits(kv, b, 1));                /* its limit */
    assert_true(kvcache_fits(kv, a, 3));                 /* block 1 still has room */
    assert_false(kvcache_fits(kv, a, 4));                /* a new block: none free */
    assert_int_equal(kvcache_extend(kv, a, 4), -1);
    assert_int_equal(kvcache_seq_len(kv, a), 5);         /* unchanged */
    const uint32_t *ta = kvcache_table(kv, a), *tb = kvcache_table(kv, b);
    uint32_t seen = 0;
    for (int i = 0; i < 2; i++) seen |= 1u << ta[i];
    for (int i = 0; i < 3; i++) seen |= 1u << tb[i];
    assert_int_equal(seen, 0x1f);                        /* five distinct blocks */
    kvcache_truncate(kv, b, 5);                          /* back to 2 blocks */
    assert_int_equal(kvcache_free_blocks(kv), 1);
    assert_int_equal(kvcache_seq_len(kv, b), 5);
    kvcache_truncate(kv, b, 9);                          /* longer: nothing */
    assert_int_equal(kvcache_seq_len(kv, b), 5);
    kvcache_seq_free(kv, a);
    assert_false(kvcache_seq_live(kv, a));
    assert_null(kvcache_table(kv, a));
    assert_int_equal(kvcache_free_blocks(kv), 3);
    kvcache_seq_free(kv, a);                             /* twice: ignored */
    kvcache_seq_free(kv, 99);
    assert_int_equal(kvcache_free_blocks(kv), 3);
    int c = kvcache_seq_new(kv);
    assert_int_equal(c, a);                              /* the id is reused */
    assert_int_equal(kvcache_seq_len(kv, c), 0);
    kvcache_destroy(kv);
    kvcache_destroy(NULL);
}

/* Many sequences growing, shrinking and ending at random; after each step
 * the tables and the free list account for every block exactly once. */
static void test_random_walk(void **state)
{
    (void)state;
    char err[256];
    for (int round = 0; round < 20; round++) {
        size_t blocks = 1 + tu_rand64() % 40, bt = 1 + tu_rand64() % 8;
        size_t seqs = 1 + tu_rand64() % 6, maxlen = 1 + tu_rand64() % 60;
        struct kvcache *kv = kvcache_new(blocks, bt, seqs, maxlen, err, sizeof(err));
        assert_non_null(kv);
        size_t width = kvcache_table_width(kv);
        assert_int_equal(width, (maxlen + bt - 1) / bt);
        int *owner = malloc(blocks * sizeof(int));
        assert_non_null(owner);
        for (int step = 0; step < 300; step++) {
            int id = (int)(tu_rand64() % seqs);
            int op = (int)(tu_rand64() % 4);
            if (!kvcache_seq_live(kv, id)) {
                int got = kvcache_seq_new(kv);
                assert_true(got >= 0);
                continue;
            }
            size_t len = kvcache_seq_len(kv, id);
            if (op <= 1) {
                size_t n = tu_rand64() % (2 * bt + 2);
                int fits = kvcache_fits(kv, id, n);
                size_t need = kvcache_blocks_needed(kv, id, n), before = kvcache_free_blocks(kv);
                int rc = kvcache_extend(kv, id, n);
                assert_int_equal(rc == 0, fits);
                if (rc == 0) {
                    assert_int_equal(kvcache_seq_len(kv, id), len + n);
                    assert_int_equal(kvcache_free_blocks(kv), before - need);
                } else {
                    assert_int_equal(kvcache_seq_len(kv, id), len);
                    assert_true(need == SIZE_MAX || need > before);
                }
            } else if (op == 2) {
                kvcache_truncate(kv, id, len ? tu_rand64() % (len + 1) : 0);
            } else {
                kvcache_seq_free(kv, id);
            }
            /* every block once */
            for (size_t b = 0; b < blocks; b++) owner[b] = -1;
            size_t held = 0;
            for (size_t s = 0; s < seqs; s++) {
                if (!kvcache_seq_live(kv, (int)s)) continue;
                size_t l = kvcache_seq_len(kv, (int)s), nb = (l + bt - 1) / bt;
                assert_true(l <= maxlen);
                const uint32_t *t = kvcache_table(kv, (int)s);
                for (size_t k = 0; k < nb; k++) {
                    assert_true(t[k] < blocks);
                    assert_int_equal(owner[t[k]], -1);
                    owner[t[k]] = (int)s;
                    held++;
                }
            }
            assert_int_equal(held + kvcache_free_blocks(kv), blocks);
        }
        free(owner);
        kvcache_destroy(kv);
    }
}

/* A sequence of the model: its tokens (what its table's blocks hold). */
struct wseq {
    int32_t tok[64];
    size_t n;
};

static void test_shared_walk(void **state)
{
    (void)state;
    char err[256];
    size_t shared_found = 0;
    for (int round = 0; round < 30; round++) {
        size_t blocks = 4 + tu_rand64() % 30, bt = 1 + tu_rand64() % 4;
        size_t seqs = 1 + tu_rand64() % 6, maxlen = 8 + tu_rand64() % 40;
        struct kvcache *kv = kvcache_new(blocks, bt, seqs, maxlen, err, sizeof(err));
        assert_non_null(kv);
        struct wseq *ws = calloc(seqs, sizeof(*ws));
        int32_t *content = malloc(blocks * bt * sizeof(int32_t)); /* what each block holds */
        int *holders = malloc(blocks * sizeof(int));
        int32_t prefixes[3][64];
        assert_true(ws && content && holders);
        for (int p = 0; p < 3; p++)
            for (int i = 0; i < 64; i++) prefixes[p][i] = (int32_t)(tu_rand64() % 3);
        for (int step = 0; step < 400; step++) {
            int id = (int)(tu_rand64() % seqs);
            if (!kvcache_seq_live(kv, id)) {
                /* a new sequence: a common prefix, then its own tokens */
                if (kvcache_seq_new(kv) != id) {
                    /* another slot came first: free it again */
                    continue;
                }
                struct wseq *w = &ws[id];
                w->n = tu_rand64() % (maxlen + 1);
                const int32_t *pre = prefixes[tu_rand64() % 3];
                size_t keep = tu_rand64() % (w->n + 1);
                for (size_t i = 0; i < w->n; i++)
                    w->tok[i] = i < keep ? pre[i] : (int32_t)(3 + tu_rand64() % 1000);
                uint64_t key = 0;
                for (size_t k = 0; (k + 1) * bt <= w->n; k++) {
                    key = kvcache_key(key, w->tok + k * bt, bt);
                    long b = kvcache_find(kv, key, w->tok + k * bt);
                    if (b < 0) break;
                    assert_memory_equal(content + b * bt, w->tok + k * bt, bt * sizeof(int32_t));
                    size_t before = kvcache_free_blocks(kv);
                    int idle = kvcache_block_idle(kv, (uint32_t)b);
                    assert_int_equal(kvcache_share(kv, id, (uint32_t)b), 0);
                    assert_int_equal(kvcache_free_blocks(kv), before - (idle ? 1 : 0));
                    shared_found++;
                }
                continue;
            }
            struct wseq *w = &ws[id];
            size_t len = kvcache_seq_len(kv, id);
            int op = (int)(tu_rand64() % 5);
            if (op <= 2 && len < w->n) {
                size_t n = 1 + tu_rand64() % (w->n - len);
                size_t idle = kvcache_idle_blocks(kv);
                size_t need = kvcache_blocks_needed(kv, id, n), freeb = kvcache_free_blocks(kv);
                if (kvcache_extend(kv, id, n) == 0) {
                    /* idle blocks go only once the free stack is empty */
                    size_t from_idle = idle - kvcache_idle_blocks(kv);
                    assert_true(from_idle <= need);
                    if (from_idle) assert_true(need - from_idle == freeb - idle);
                    /* the new part written, then its full blocks published */
                    const uint32_t *t = kvcache_table(kv, id);
                    for (size_t p = len; p < len + n; p++)
                        content[t[p / bt] * bt + p % bt] = w->tok[p];
                    uint64_t key = 0;
                    for (size_t k = 0; (k + 1) * bt <= len + n; k++) {
                        key = kvcache_key(key, w->tok + k * bt, bt);
                        kvcache_publish(kv, id, k, key, w->tok + k * bt);
                    }
                } else {
                    assert_true(need == SIZE_MAX || need > freeb);
                }
            } else if (op == 3) {
                kvcache_truncate(kv, id, len ? tu_rand64() % (len + 1) : 0);
            } else {
                kvcache_seq_free(kv, id);
            }
            /* every held block: within its holders' lengths when shared;
             * held + free = all; idle ones are held by none */
            for (size_t b = 0; b < blocks; b++) holders[b] = 0;
            size_t held = 0;
            for (size_t q = 0; q < seqs; q++) {
                if (!kvcache_seq_live(kv, (int)q)) continue;
                size_t l = kvcache_seq_len(kv, (int)q), nb = (l + bt - 1) / bt;
                const uint32_t *t = kvcache_table(kv, (int)q);
                for (size_t k = 0; k < nb; k++) {
                    assert_true(t[k] < blocks);
                    if (holders[t[k]]++ == 0) held++;
                    /* the block holds this sequence's tokens */
                    size_t upto = (k + 1) * bt < l ? (k + 1) * bt : l;
                    for (size_t p = k * bt; p < upto; p++)
                        assert_int_equal(content[t[k] * bt + p % bt], ws[q].tok[p]);
                }
            }
            for (size_t q = 0; q < seqs; q++) {
                if (!kvcache_seq_live(kv, (int)q)) continue;
                size_t l = kvcache_seq_len(kv, (int)q), nb = (l + bt - 1) / bt;
                const uint32_t *t = kvcache_table(kv, (int)q);
                for (size_t k = 0; k < nb; k++)
                    if (holders[t[k]] > 1) assert_true((k + 1) * bt <= l);
            }
            size_t idle = 0;
            for (size_t b = 0; b < blocks; b++)
                if (kvcache_block_idle(kv, (uint32_t)b)) {
                    assert_int_equal(holders[b], 0);
                    idle++;
                }
            assert_int_equal(idle, kvcache_idle_blocks(kv));
            assert_int_equal(held + kvcache_free_blocks(kv), blocks);
        }
        free(ws);
        free(content);
        free(holders);
        kvcache_destroy(kv);
    }
    assert_true(shared_found > 100); /* the walk did share */
}

int main(void)
{
    tu_seed("test_kvcache");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_random_walk),
        cmocka_unit_test(test_shared_walk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

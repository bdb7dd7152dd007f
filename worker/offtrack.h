/* offtrack.h - per-partition contiguous low watermark of finished offsets
 * (docs/reliability.md, rules 1-2). The poll thread records every offset it
 * consumes, in order, and marks offsets done as their results are
 * acknowledged; the offset it may store is the first one not yet done, so
 * a crash never skips unfinished work even when batches finish out of
 * order.
 *
 * Threads: owned by the poll thread; not thread-safe. */
#ifndef KINFER_OFFTRACK_H
#define KINFER_OFFTRACK_H

#include <stddef.h>
#include <stdint.h>

struct offtrack;

struct offtrack *offtrack_new(void);
void offtrack_destroy(struct offtrack *t);

/* Records that offset was consumed from topic/partition. Offsets of one
 * partition come in increasing order (gaps allowed); an offset not above
 * the last one recorded is a seek back: entries at or above it are
 * forgotten (they will be consumed again), entries below it are kept, so
 * unfinished work there still holds the watermark. Returns 0, or -1 on
 * allocation failure. Borrows topic. */
int offtrack_add(struct offtrack *t, const char *topic, int32_t partition,
                 int64_t offset);

/* Marks offset done. Returns 1 and sets *store_offset to the offset to
 * store (last contiguous done + 1) when the watermark advanced, 0 when it
 * did not, -1 when the partition or offset is not tracked (revoked since:
 * ignore it). */
int offtrack_done(struct offtrack *t, const char *topic, int32_t partition,
                  int64_t offset, int64_t *store_offset);

/* The offset after the last one recorded for topic/partition since it was
 * first seen or last dropped (where its fetching stands), or -1 when none
 * was recorded. */
int64_t offtrack_next(const struct offtrack *t, const char *topic,
                      int32_t partition);

/* Offsets recorded but not yet done, for one partition / all of them. */
size_t offtrack_pending(const struct offtrack *t, const char *topic,
                        int32_t partition);
size_t offtrack_pending_total(const struct offtrack *t);

/* Forgets a partition (revoked or lost). */
void offtrack_drop(struct offtrack *t, const char *topic, int32_t partition);

#endif

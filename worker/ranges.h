/* ranges.h - bounded ranges of history, for `kinfer replay`: the
 * partitions are assigned directly (no group membership), each from its
 * start offset, and each stops at its end. The intake consults this
 * module at the few points where a bounded run differs from the live
 * worker: what to assign, whether a record is in range, which partitions
 * never resume, and whether the run is over.
 *
 * Threads: the poll thread only. Ownership: the ranges are copied. */
#ifndef KINFER_RANGES_H
#define KINFER_RANGES_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#include "offsets.h"
#include "worker.h"

struct ranges;

/* Copies the n ranges (n may be 0: nothing to do). Returns NULL when out
 * of memory. */
struct ranges *ranges_new(const struct worker_range *r, size_t n);
void ranges_destroy(struct ranges *rs);

/* The partitions to assign, each at its start offset, leaving out ranges
 * that are empty (start >= end). Caller destroys the list. */
rd_kafka_topic_partition_list_t *ranges_assignment(const struct ranges *rs);

/* Whether record m is to be run: 1 when it is inside its range. A record
 * at or past the end marks the range as reached and pauses its partition
 * on rk (what follows is someone else's business). */
int ranges_admit(struct ranges *rs, rd_kafka_t *rk, const rd_kafka_message_t *m);

/* Removes from l the partitions whose range reached its end: they stay
 * paused for good when backpressure resumes the rest. */
void ranges_keep_unfinished(const struct ranges *rs, rd_kafka_topic_partition_list_t *l);

/* A job of topic/partition finished (both acknowledgements). */
void ranges_job_done(struct ranges *rs, const char *topic, int32_t partition);

/* Every range consumed to its end (by record, or by the consumer's
 * position on rk when the last offsets hold no record, e.g. control
 * records) and every job of it finished (o). */
int ranges_finished(struct ranges *rs, rd_kafka_t *rk, const struct offsets *o);

/* Fills p's ranges, done and n_ranges (valid until the next call). */
void ranges_progress(struct ranges *rs, struct worker_progress *p);

#endif

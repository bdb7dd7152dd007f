/* offsets.h - the offsets stage: where a job's life ends. Every record the
 * intake takes is tracked here; jobs the sink finished come back through
 * the done queue, advance their partition's contiguous watermark
 * (offtrack.h) and the offsets that moved are stored on the consumer, for
 * librdkafka's auto-commit (docs/reliability.md, rules 1 and 2).
 *
 * Threads: the poll thread only (the intake's), which also runs the
 * rebalance callback; not thread-safe. Ownership: offsets_collect hands
 * the finished jobs back to its caller. */
#ifndef KINFER_OFFSETS_H
#define KINFER_OFFSETS_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#include "jobq.h"

struct offsets;

/* done is the queue the sink hands acknowledged jobs back through
 * (borrowed; outlives the stage). Returns NULL when out of memory. */
struct offsets *offsets_new(struct jobq *done);
void offsets_destroy(struct offsets *o);

/* A record was taken from topic/partition at offset. Returns 0, or -1
 * when out of memory. */
int offsets_track(struct offsets *o, const char *topic, int32_t partition, int64_t offset);

/* Takes every finished job from the done queue, advances the watermarks
 * and stores, in one call on rk, the offsets that moved. Returns the
 * finished jobs linked through ->next; the caller accounts for and frees
 * them. */
struct job *offsets_collect(struct offsets *o, rd_kafka_t *rk);

/* Records taken and not finished: of one partition, of all. */
size_t offsets_pending(const struct offsets *o, const char *topic, int32_t partition);
size_t offsets_pending_total(const struct offsets *o);

/* Where fetching of topic/partition stands: the offset after the last
 * record taken since it was assigned, -1 when none was. */
int64_t offsets_next(const struct offsets *o, const char *topic, int32_t partition);

/* Forgets a partition (revoked or lost). */
void offsets_drop(struct offsets *o, const char *topic, int32_t partition);

/* Commits the stored offsets synchronously; a failure other than "nothing
 * to commit" is logged with when ("revoke", "shutdown"). */
void offsets_commit(rd_kafka_t *rk, const char *when);

/* Seeks each partition of a (just resumed) that delivered a record since
 * it was assigned to the offset after its last one, so its fetcher starts
 * at once rather than on librdkafka's next wake-up (offsets.c says why);
 * a refused seek is followed by a pause and resume. Borrows a. */
void offsets_restart_fetch(struct offsets *o, rd_kafka_t *consumer,
                           const rd_kafka_topic_partition_list_t *a);

/* The same, waiting for the coordinator's answer only until deadline_us
 * (clock_mono_us): a coordinator that does not answer (down, overloaded,
 * slow) holds a synchronous commit for librdkafka's socket.timeout.ms
 * (60 s) and more. Past the deadline the commit is left in flight and
 * logged; what it carried stays uncommitted and runs again (rule 2).
 * Returns 0 once committed (or nothing to commit), -1 otherwise. */
int offsets_commit_by(rd_kafka_t *rk, const char *when, int64_t deadline_us);

#endif

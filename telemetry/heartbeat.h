/* heartbeat.h - each worker's heartbeat in Redis, and `kinfer status`,
 * which lists the live workers from them.
 *
 * Every metrics.heartbeat_interval_ms a thread of its own, with a Redis
 * connection of its own, writes one hash per worker,
 *   <metrics.heartbeat_prefix><kafka.group>:<worker id>
 * holding id, host, pid, group, version, assigned partitions (count and
 * list), queue depth, in-flight rows and batches, lag, smoothed rates,
 * ready/healthy, started_at_ms and updated_at_ms, with a TTL of three
 * intervals so a dead worker's hash disappears by itself; a clean stop
 * deletes it. The same round trip tells /readyz whether Redis answers
 * (an empty prefix writes no hash and only PINGs).
 *
 * Threads: hb_start/hb_stop on the main thread; the heartbeat thread only
 * reads the stats and sets STATS_COND_REDIS. status_main is a command of
 * its own (main thread). */
#ifndef KINFER_HEARTBEAT_H
#define KINFER_HEARTBEAT_H

#include <stddef.h>

#include "../worker/config.h"
#include "stats.h"

struct hb;

/* Starts the heartbeat thread. Copies what it needs from c; borrows st,
 * which must outlive hb_stop. The first beat happens at once, so /readyz
 * learns about Redis without waiting an interval. Returns NULL with
 * errstr filled when the thread cannot start (Redis being down is not an
 * error: the thread keeps trying). */
struct hb *hb_start(const struct kcfg *c, struct stats *st, char *errstr, size_t errstr_size);

/* Stops the thread, deletes this worker's hash (best effort: a failure
 * leaves it to expire), frees h. Accepts NULL. */
void hb_stop(struct hb *h);

/* The worker id a config gives: metrics.worker_id, else
 * "<hostname>-<pid>". Writes into buf (cap bytes) and returns buf. */
const char *hb_worker_id(const struct kcfg *c, char *buf, size_t cap);

/* `kinfer status -c FILE [--set K=V]... [--json]`: lists the live workers
 * of kafka.group from their heartbeats. argv[0] is "status". Returns the
 * exit status: 0 (also when none is live), 1 on a usage, config or Redis
 * error. */
int status_main(int argc, char **argv);

#endif

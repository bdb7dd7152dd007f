/* heartbeat.h - each worker's heartbeat in Redis, which `kinfer status`
 * (cmd/status.c) lists the live workers from.
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
 * reads the stats and sets STATS_COND_REDIS. The readers' helpers: any
 * thread. */
#ifndef KINFER_HEARTBEAT_H
#define KINFER_HEARTBEAT_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/config.h"
#include "stats.h"

struct hb;

/* Starts the heartbeat thread. Copies what it needs from c; borrows st,
 * which must outlive hb_stop. The first beat happens at once, so /readyz
 * learns about Redis without waiting an interval. Returns NULL with
 * errstr filled when the thread cannot start (Redis being down is not an
 * error: the thread keeps trying). */
struct hb *hb_start(const struct kcfg *c, struct stats *st, char *errstr, size_t errstr_size);

/* Stops the thread (a beat in progress is cut short: rconn_cancel),
 * deletes this worker's hash (best effort: a failure leaves it to expire),
 * frees h. The DEL gets until deadline_us (clock_mono_us's clock; 0 = no
 * deadline, redis.timeout_ms): with Redis frozen, hb_stop returns by then.
 * Accepts NULL. */
void hb_stop(struct hb *h, int64_t deadline_us);

/* The worker id a config gives: metrics.worker_id, else
 * "<hostname>-<pid>". Writes into buf (cap bytes) and returns buf. */
const char *hb_worker_id(const struct kcfg *c, char *buf, size_t cap);

/* ---- for readers of the hashes (kinfer status) ---- */

/* How a field of the hash is typed (the hash holds strings). */
enum hb_type { HB_STR, HB_INT, HB_NUM, HB_BOOL, HB_LIST };

/* The type of the field called name; HB_STR for one this version does
 * not know, so an older reader still shows a newer worker's hash. */
enum hb_type hb_field_type(const char *name);

/* The SCAN MATCH pattern of every heartbeat key of group under prefix,
 * both matched literally. Writes into out (cap bytes). */
void hb_key_pattern(const char *prefix, const char *group, char *out, size_t cap);

/* Connects to Redis the way the heartbeat does: the timeout applied to
 * every command, AUTH when a password is given, SELECT db. Returns a new
 * context (the caller frees it with redisFree) or NULL with err filled. */
redisContext *hb_redis_open(const char *host, int port, const char *password, int db,
                            int timeout_ms, char *err, size_t cap);

#endif

/* replay_plan.h - private to `kinfer replay` (cmd/replay*.c): the parsed
 * command line, its range bounds and the plan's partitions, shared by the
 * bound parser (replay_bounds.c), the planner (replay_plan.c) and the
 * command (replay.c).
 *
 * Threads: main thread. Ownership: as each function says; a struct bound
 * owns its offs, a struct replay_args its topics. */
#ifndef KINFER_REPLAY_PLAN_H
#define KINFER_REPLAY_PLAN_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/config.h"
#include "../worker/worker.h"
#include "replay.h"

#define REPLAY_TIMEOUT_MS 10000   /* each metadata, watermark, time or commit query */
#define REPLAY_SCAN_STALL_MS 30000 /* a timestamp scan that reads nothing this long fails */
#define REPLAY_PROGRESS_TTY_MS 250
#define REPLAY_PROGRESS_LINE_MS 5000
#define REPLAY_TOPICS_MAX 256

/* One end of the range as given on the command line. */
enum bound_kind { BOUND_EARLIEST, BOUND_NOW, BOUND_TIME, BOUND_OFFSETS };

struct bound_off {
    char topic[PROTO_TOPIC_MAX + 1]; /* "" = this partition of every replayed topic */
    int32_t partition;
    int64_t offset;
};

struct bound {
    const char *text;          /* as given, for messages */
    enum bound_kind kind;
    int64_t time_ms;           /* BOUND_TIME */
    struct bound_off *offs;    /* BOUND_OFFSETS, owned */
    size_t n_offs;
};

struct replay_args {
    const char *cfg_path;
    const char **sets;         /* borrowed from argv, plus replay's own */
    size_t n_sets;
    struct bound from, to;
    char *topics[REPLAY_TOPICS_MAX]; /* owned copies */
    size_t n_topics;
    const char *reply_topic;   /* NULL = replay.reply_topic */
    enum worker_redis_mode redis;
    const char *model;
    double rate;
    int priority;
    int dry_run, resume, restart;
    int progress_ms;           /* 0 = the default for the kind of stderr */
};

/* A partition being resolved into a range. */
struct part {
    char topic[PROTO_TOPIC_MAX + 1];
    int32_t partition;
    int64_t lo, hi;            /* watermarks when the run was planned */
    int64_t start, end;        /* the range; -1 while unresolved */
    int64_t committed;         /* the replay group's checkpoint; -1 = none */
};

/* ---- replay_bounds.c ---- */

/* A whole number in lo..hi, the whole string. */
int replay_parse_int(const char *s, long long lo, long long hi, long long *out);

/* One bound: a keyword, a point in time or an offset list. */
int replay_parse_bound(const char *s, struct bound *b, char *why, size_t why_size);

/* The bounds as a pair, when that can be told before asking Kafka: a
 * start after the end is a typo, not an empty replay. */
int replay_check_bound_order(const struct bound *from, const struct bound *to, char *why,
                             size_t why_size);

/* Adds the comma-separated topics in s to a, skipping repeats. */
int replay_add_topics(struct replay_args *a, const char *s, char *why, size_t why_size);

/* ---- replay_plan.c ---- */

/* The replay's own consumer group: derived from the live group, the
 * topics, the bounds as given (canonical), the model and the reply topic,
 * so running the same replay again finds its checkpoint and a different
 * one never does. The bounds are hashed as given rather than resolved:
 * "now" and "earliest" move, and a resume must still find its group. */
void replay_group_id(const struct kcfg *c, struct replay_args *a, const char *reply_topic,
                     char *out, size_t cap);

/* A consumer handle for planning: it carries the replay group (never the
 * live one), commits nothing by itself, and reports partition ends so a
 * timestamp scan knows when a partition is exhausted. Returns NULL with
 * why filled. */
rd_kafka_t *replay_planner_new(const struct kcfg *c, const char *group, char *why,
                               size_t why_size);

/* Reads the replay group's checkpoint into every part's committed. */
int replay_read_checkpoint(rd_kafka_t *rk, struct part *parts, size_t n, char *why,
                           size_t why_size);

/* --restart: sets the checkpoint back to every range's start, so a later
 * --resume cannot pick up a partition's offset from the earlier run. */
int replay_reset_checkpoint(rd_kafka_t *rk, const struct part *parts, size_t n, char *why,
                            size_t why_size);

/* Plans the replay: partitions, both bounds, sanity of each range and the
 * checkpoint. */
int replay_plan(rd_kafka_t *rk, struct replay_args *a, struct part **out, size_t *n_out,
                char *why, size_t why_size);

#endif

/* stats.h - the worker's numbers, in one place: counters, gauges and
 * fixed-bucket histograms that the pipeline's threads update, readiness
 * and liveness inputs, and the consumer lag that librdkafka reports in its
 * statistics JSON. The HTTP endpoints (metrics.h) and the Redis heartbeat
 * (heartbeat.h) read it through stats_snapshot.
 *
 * Threads: every update function may be called from any thread at any
 * time (counters and gauges are atomics; the lag table and the rate
 * smoothing are behind a mutex held only for a copy). Each gauge has one
 * writer, named at its setter. stats_snapshot may be called from several
 * reader threads at once. */
#ifndef KINFER_STATS_H
#define KINFER_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "../codecs/protocol.h"
#include "../gpu/model.h"

struct stats;

/* The loops the watchdog watches. Each calls stats_alive() every time it
 * goes round (and while it waits on something slow but expected).
 * Executor i (0-based) is loop STATS_LOOP_EXEC + i and generator lane i
 * (worker/genexec.c) loop STATS_LOOP_GEN + i, so one stuck thread is not
 * hidden by the others. */
#define STATS_MAX_EXECUTORS 64
#define STATS_MAX_GENERATORS 16
enum stats_loop {
    STATS_LOOP_POLL = 0,  /* the Kafka poll loop (worker_run's thread) */
    STATS_LOOP_SINK,      /* the sink */
    STATS_LOOP_HEARTBEAT, /* the heartbeat thread (heartbeat.c) */
    STATS_LOOP_EXEC,      /* executor 0; executor i is STATS_LOOP_EXEC + i */
    STATS_LOOP_GEN = STATS_LOOP_EXEC + STATS_MAX_EXECUTORS, /* generator lane 0 */
    STATS_N_LOOPS = STATS_LOOP_GEN + STATS_MAX_GENERATORS
};

/* How a job ended, the status label of kinfer_jobs_total. */
enum stats_status {
    STATS_STATUS_OK = 0,      /* result published, status "ok" */
    STATS_STATUS_ERROR,       /* error result published (code says which) */
    STATS_STATUS_DEAD_LETTER, /* the record went to the dead-letter topic */
    STATS_N_STATUS
};

/* Why a batch closed, the reason label of kinfer_batches_total. Same
 * order and names as the batcher's enum batcher_reason, so a value of
 * that converts directly (the worker asserts they stay in step). */
enum stats_batch_reason {
    STATS_BATCH_SIZE = 0, /* reached batching.max_batch_rows (or one big job) */
    STATS_BATCH_DEADLINE, /* waiting longer would miss a queued deadline */
    STATS_BATCH_WAIT,     /* its oldest job waited batching.max_wait_ms */
    STATS_BATCH_DRAIN,    /* flushed at shutdown */
    STATS_N_BATCH_REASONS
};

/* The readiness conditions that are set from outside; /readyz answers 200
 * only when all hold (and the worker is not draining). */
enum stats_cond {
    STATS_COND_MODEL = 0, /* every model loaded */
    STATS_COND_CONSUMER,  /* the consumer joined its group (or has partitions) */
    STATS_COND_PRODUCER,  /* the producer has a connection to a broker */
    STATS_COND_REDIS,     /* Redis answered the last check */
    STATS_N_COND
};

/* The two ways the sink delivers a result; either failing persistently
 * makes the worker not ready, with what the failure said. */
enum stats_sink {
    STATS_SINK_KAFKA = 0, /* the reply and dead-letter topics */
    STATS_SINK_REDIS,     /* the result SETs */
    STATS_N_SINK
};
/* How long a sink path must have failed, without a success since, before
 * readiness reflects it: one failed attempt that the next retry mends is
 * not an outage. */
#define STATS_SINK_FAILING_S 1.0

/* The histograms, each with its own fixed buckets (stats_hist_bounds). */
enum stats_hist {
    STATS_HIST_BATCH_ROWS = 0, /* rows in one forward pass */
    STATS_HIST_QUEUE_S,        /* arrival to batch start, seconds */
    STATS_HIST_INFER_S,        /* the batch's forward pass, seconds */
    STATS_HIST_E2E_S,          /* record timestamp to result acknowledged, seconds */
    STATS_HIST_TTFT_S,         /* generation: record timestamp to first token, seconds */
    STATS_HIST_TPOT_S,         /* generation: time per output token after the first, seconds */
    STATS_N_HIST
};

#define STATS_HIST_MAX_BOUNDS 20    /* finite bucket bounds per histogram, at most */
#define STATS_TOPIC_MAX 249         /* Kafka's own limit on topic names */
#define STATS_RATE_TAU_S 15.0       /* time constant of the smoothed rates */

/* One assigned partition's lag, from librdkafka's statistics. */
struct stats_part {
    char topic[STATS_TOPIC_MAX + 1];
    int32_t partition;
    int64_t lag; /* messages not yet stored as processed */
};

/* Records of one partition the worker never read: offsets skipped over
 * between two records it took (an offset reset past records the broker
 * deleted, docs/reliability.md "When the broker deletes unread records"). */
struct stats_skip {
    char topic[STATS_TOPIC_MAX + 1];
    int32_t partition;
    uint64_t records;        /* offsets skipped since start */
    int64_t last_from;       /* the latest range skipped, inclusive */
    int64_t last_to;
};
#define STATS_MAX_SKIP_PARTS 256 /* partitions counted apart; more share the last row */

/* A histogram as copied out: per-bucket counts (not cumulative), the last
 * one being the +Inf bucket; sum in the histogram's unit. */
struct stats_hist_snap {
    uint64_t buckets[STATS_HIST_MAX_BOUNDS + 1];
    double sum;
    uint64_t count; /* the buckets added up, so _count always equals +Inf */
};

/* One GPU device, as the lifecycle publishes it from the model runtime. */
struct stats_device {
    int index;           /* CUDA device index */
    double busy_ratio;   /* GPU time of kinfer's work / wall time, last interval */
    double busy_s;       /* GPU time of kinfer's work since start */
    uint64_t mem_used, mem_total; /* bytes */
    uint64_t batches;    /* forward passes run on it, since start */
};

/* Everything at one instant, as plain data for renderers. parts is owned
 * by the snapshot: release it with stats_snapshot_fini. */
struct stats_snapshot {
    /* counters */
    uint64_t consumed;
    uint64_t jobs[STATS_N_STATUS][PROTO_N_ERRS];
    uint64_t batches[STATS_N_BATCH_REASONS];
    uint64_t dead_letters, produce_errors, redis_errors, heartbeat_errors;
    /* gauges */
    int64_t queue_rows, queue_jobs, inflight_rows, inflight_batches;
    int64_t assigned, paused;
    double oldest_queued_s;
    struct stats_hist_snap hist[STATS_N_HIST];
    /* smoothed rates and what follows from them */
    double rows_per_s, jobs_per_s;
    /* encoders: tokens run, their batches' padded shape (rows x longest
     * row), the smoothed token rate, and the fraction of the padded
     * tokens that were padding (smoothed like the rates; since start
     * when idle) */
    uint64_t tokens, padded_tokens;
    double tokens_per_s, padding_ratio;
    /* generation: prompt and generated tokens of finished jobs; the
     * generator's sequences running and waiting, KV cache blocks used
     * and total, preemptions, prompt tokens found in the cache
     * (stats_gen_gauges) */
    uint64_t gen_prompt_tokens, gen_tokens, gen_preemptions, gen_shared_tokens;
    int64_t gen_running, gen_waiting, gen_blocks_used, gen_blocks_total;
    int gen_models;   /* generating models loaded (0: none; the families are left out) */
    int drain_known;  /* 0: lag > 0 but nothing finished lately */
    double drain_s;   /* lag_total / jobs_per_s */
    /* lag of the assigned partitions, from the consumer's statistics */
    struct stats_part *parts;
    size_t n_parts;
    int64_t lag_total;
    int lag_known;    /* the consumer has reported statistics at least once */
    /* records skipped by offset resets, per partition (owned, like parts),
     * and the resets librdkafka reported */
    struct stats_skip *skips;
    size_t n_skips;
    uint64_t offset_resets;
    /* Kafka connections, from each client's statistics; -1 = no report yet */
    int brokers_up_consumer, brokers_up_producer;
    int group_joined;
    /* GPU devices (the CUDA backend); n_devices 0 on the CPU */
    struct stats_device devices[MODEL_MAX_DEVICES];
    size_t n_devices;
    /* liveness: seconds since each loop last reported, -1 = not running */
    double loop_silence_s[STATS_N_LOOPS];
    int healthy;      /* 0 once the watchdog tripped (it stays tripped) */
    char unhealthy_why[160];
    int watchdog_ms;
    /* readiness inputs */
    int cond[STATS_N_COND];
    int early[STATS_N_COND]; /* stats_set_early: before a client's first statistics */
    char cond_reason[STATS_N_COND][200]; /* "redis: <what Redis said>"; "" = the default */
    double sink_failing_s[STATS_N_SINK];  /* failing for this long; -1 = delivering */
    char sink_reason[STATS_N_SINK][200];  /* "sink: redis: <why>" while failing */
    int draining;
    /* identity */
    double start_time_s; /* Unix time the stats were made */
    char backend[16];    /* "cpu", "cuda" */
    char precision[16];  /* "fp32", ... */
    char device[128];    /* "cpu", or the CUDA devices' names ("emulated ..." on the emulation) */
    char models[512];    /* "name=kind,..." (kind: generator, encoder, mlp); "" = not set */
};

/* Returns a new, zeroed stats struct (backend and device "cpu", watchdog 60 s), or
 * NULL when out of memory. */
struct stats *stats_new(void);
/* Frees st; accepts NULL. No thread may use st any more. */
void stats_destroy(struct stats *st);

/* ---- configuration (main thread, before the loops start) ---- */

/* Names the backend for kinfer_build_info, kinfer_backend_info, /readyz
 * and the heartbeat; borrows name (copied). */
void stats_set_backend(struct stats *st, const char *name);
/* Which device runs the models, in words (model_runtime_device_name), for
 * kinfer_backend_info, /readyz and the heartbeat; borrows name (copied). */
void stats_set_device_name(struct stats *st, const char *name);
/* The models and their kinds ("llm=generator,emb=encoder,mlp=mlp"), for
 * /readyz and the heartbeat; borrows desc (copied, cut at 511 bytes). */
void stats_set_models(struct stats *st, const char *desc);
/* The runtime's precision and device count, for kinfer_backend_info. */
void stats_set_precision(struct stats *st, const char *precision);
/* Sets the watchdog bound: a registered loop silent longer trips it. */
void stats_set_watchdog(struct stats *st, int ms);

/* ---- poll thread ---- */

/* One record taken from Kafka (before it is decoded). */
void stats_consumed(struct stats *st);
/* Offsets from..to (inclusive) of topic/partition were never read: the
 * consumer jumped over them (borrows topic). */
void stats_skipped(struct stats *st, const char *topic, int32_t partition, int64_t from,
                   int64_t to);
/* librdkafka reset a partition's fetch offset (from its log: any thread). */
void stats_offset_reset(struct stats *st);
/* The batcher's depth, the age of its oldest queued job in seconds (0 if
 * empty), the rows taken from Kafka but not yet finished, and the batches
 * taken by an executor but not yet written out. Poll thread only. */
void stats_set_queue(struct stats *st, size_t rows, size_t jobs, double oldest_s,
                     size_t inflight_rows, int inflight_batches);
/* Where the queue's depth is read at the moment of a snapshot, so that
 * /metrics and the heartbeat never show a queue that emptied since the
 * poll thread's last stats_set_queue (a tenth of a second may be many
 * batches): fn fills rows, jobs and the oldest job's age in seconds. Any
 * thread may call fn; NULL unregisters it, returning once no snapshot is
 * using it (call before what ctx points to goes away). */
typedef void (*stats_queue_fn)(void *ctx, int64_t now_us, size_t *rows, size_t *jobs,
                               double *oldest_s);
void stats_set_queue_source(struct stats *st, stats_queue_fn fn, void *ctx);
/* Partitions assigned to this consumer and how many of them are paused.
 * Poll thread only. */
void stats_set_partitions(struct stats *st, int assigned, int paused);
/* The result sink's error total (rsink_errors): a counter owned elsewhere,
 * mirrored here. Poll thread (any one thread) only. */
void stats_set_redis_errors(struct stats *st, uint64_t total);

/* ---- executor thread ---- */

/* A batch ran and was handed to the sink: counts it by reason and
 * observes its rows (the rows run through the model; a batch whose jobs
 * all expired runs 0 rows, which is counted but not observed). */
void stats_batch(struct stats *st, enum stats_batch_reason reason, size_t rows);
/* An encoder's batch ran: its tokens, and its padded shape (rows x its
 * longest row). */
void stats_tokens(struct stats *st, size_t tokens, size_t padded);
/* A generation job finished: its prompt and generated tokens, its time
 * to first token and per output token (seconds; < 0: none). */
void stats_gen_done(struct stats *st, size_t prompt, size_t generated, double ttft_s,
                    double tpot_s);
/* The generator's gauges (worker tick), and how many generating models run. */
void stats_gen_gauges(struct stats *st, int models, size_t running, size_t waiting,
                      size_t blocks_used, size_t blocks_total, uint64_t preemptions,
                      uint64_t shared_tokens);

/* ---- sink thread ---- */

/* A job finished (both acknowledgements in). Counts it by status and
 * code; observes queue_s and infer_s when >= 0 (the job ran), e2e_s when
 * >= 0 and the job was not dead-lettered. A dead letter also counts in
 * kinfer_dead_letters_total. Every finished job feeds the jobs rate. */
void stats_job(struct stats *st, enum stats_status status, enum proto_err code, double queue_s,
               double infer_s, double e2e_s);
/* A produce attempt failed (refused at once, or its delivery failed). */
void stats_produce_error(struct stats *st);

/* ---- any thread ---- */

/* Loop `loop` (an enum stats_loop, or STATS_LOOP_EXEC + i) is alive:
 * registers it with the watchdog the first time. */
void stats_alive(struct stats *st, int loop);
/* Loop `loop` ended on purpose: the watchdog stops watching it. */
void stats_loop_stop(struct stats *st, int loop);
/* Sets one readiness condition (nonzero = holds). */
void stats_set_cond(struct stats *st, enum stats_cond cond, int ok);
/* The same, and while it does not hold, why (copied; NULL or "" = the
 * condition's default reason): /readyz then says what the dependency said
 * ("redis: WRONGPASS ..."), not only that something is wrong. */
void stats_set_cond_why(struct stats *st, enum stats_cond cond, int ok, const char *why);
/* A sink path failed (why: the error, copied) or delivered again (why
 * NULL). From STATS_SINK_FAILING_S of failing without a success, /readyz
 * answers 503 with "sink: <path>: <why>". Sink thread. */
void stats_sink_failing(struct stats *st, enum stats_sink path, const char *why);
/* What a client's own calls show before its first statistics arrive
 * (statistics.interval.ms after it starts, 5 s by default): for
 * STATS_COND_PRODUCER that the producer has reached a broker (it holds
 * cluster metadata), for STATS_COND_CONSUMER that the consumer has a group
 * member id. Until that client's first statistics, its condition holds
 * when this does; from then on the statistics alone decide. Poll thread. */
void stats_set_early(struct stats *st, enum stats_cond cond, int ok);
/* The worker is stopping: /readyz answers 503 from now on. */
void stats_set_draining(struct stats *st);
/* A heartbeat write or Redis check failed (heartbeat thread). */
void stats_heartbeat_error(struct stats *st);
/* Device slot (0..MODEL_MAX_DEVICES-1) of the runtime: its gauges and
 * batch count. The kinfer_gpu_* families are exported only for slots set
 * (CUDA backend). One writer (the poll thread). */
void stats_set_device(struct stats *st, size_t slot, const struct stats_device *d);

/* Reads one librdkafka statistics JSON document (the stats_cb argument;
 * borrowed, not freed here). From a consumer's: the lag of each assigned
 * partition (consumer_lag_stored, else consumer_lag, else hi - lo for a
 * partition nothing was ever committed for), whether the group is joined
 * (sets STATS_COND_CONSUMER), and its broker connections. From a
 * producer's: its broker connections (sets STATS_COND_PRODUCER: at least
 * one up). Returns 0, or -1 if json is not a statistics document (nothing
 * changes). Called on whichever thread serves the client's callbacks. */
int stats_rdkafka_json(struct stats *st, const char *json, size_t len);

/* ---- readers ---- */

/* Copies everything into *out as of now_us (clock_mono_us()): updates the
 * smoothed rates (at most once a second, whoever calls) and evaluates the
 * watchdog (tripping it when a loop has been silent too long). Returns 0,
 * or -1 when out of memory (then *out holds no parts). */
int stats_snapshot(struct stats *st, int64_t now_us, struct stats_snapshot *out);
/* Frees what a snapshot owns; accepts a zeroed one. */
void stats_snapshot_fini(struct stats_snapshot *s);

/* Whether s is ready; each unmet condition adds a short reason to reasons
 * (up to max of them; *n_reasons counts all): static text, or text held
 * in s (what Redis said, a failing sink path), valid as long as s. Returns
 * 1 or 0. */
int stats_ready(const struct stats_snapshot *s, const char **reasons, size_t max,
                size_t *n_reasons);

/* The finite upper bounds of histogram h (ascending, static storage);
 * *n receives their number. The last bucket of a snapshot is +Inf. */
const double *stats_hist_bounds(enum stats_hist h, size_t *n);
/* Index of the bucket value v falls in for histogram h (upper bound
 * inclusive, as Prometheus's le); n_bounds for +Inf. */
size_t stats_hist_bucket(enum stats_hist h, double v);

/* Label values, for renderers. stats_loop_name writes "poll", "sink",
 * "heartbeat" or "executor-<i>" into buf and returns buf. */
const char *stats_loop_name(int loop, char *buf, size_t n);
const char *stats_status_name(enum stats_status s);
const char *stats_batch_reason_name(enum stats_batch_reason r);

#endif

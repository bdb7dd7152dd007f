/* config.h - the worker's settings, read once from a libconfig file (plus
 * --set overrides), validated, and passed down as plain data. Nothing
 * else in kinfer reads the file or the environment.
 *
 * Threads: main thread at startup only. */
#ifndef KINFER_CONFIG_H
#define KINFER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "../base/cfgtab.h"
#include "../gpu/model.h"

struct cfg_kv {
    char *key;
    char *value;
};

struct cfg_topic_prio {
    char *topic;
    int priority;
};

struct kcfg {
    struct {
        char *brokers;          /* "127.0.0.1:9092" */
        char *group;            /* "kinfer" */
        char **topics;          /* [ "jobs" ] */
        size_t n_topics;
        char *reply_topic;      /* "results" */
        char *dlq_topic;        /* "jobs.dlq" */
        struct cfg_kv *properties; /* librdkafka properties, passed through */
        size_t n_properties;
        int revoke_timeout_ms;  /* 10000: in-flight budget on partition revoke */
        int resume_seek;        /* 1: seek resumed partitions to restart fetching */
        int static_membership;  /* 1: metrics.worker_id, when set, is group.instance.id */
    } kafka;
    struct {
        char *host;             /* "127.0.0.1" */
        int port;               /* 6379 */
        char *password;         /* "" = no AUTH */
        int db;                 /* 0 */
        char *key_prefix;       /* "kinfer:result:" */
        int64_t ttl_ms;         /* 3600000 */
        int timeout_ms;         /* 2000: connect and command timeout */
        char *publish_channel;  /* "" = no PUBLISH */
        char *stream_prefix;    /* "kinfer:stream:": streamed generation, key = prefix + id */
    } redis;
    struct {                    /* generation jobs (text-generating models) */
        int kv_cache_mb;        /* 256: the key/value cache of each generating model */
        int block_tokens;       /* 16: tokens per cache block */
        int prefix_sharing;     /* 1: shared prompt prefixes reuse cached blocks */
        int overlap;            /* 1: chained decode steps on CUDA (gen/engine.h) */
        int max_seqs;           /* 16: sequences generating at once per model */
        int max_tokens;         /* 256: a job's max_tokens when it gives none */
    } generation;
    struct {
        int max_batch_rows;     /* 32 */
        int max_wait_ms;        /* 5 */
        int max_job_rows;       /* 1024 */
        int max_queued_rows;    /* 4096: poll thread pauses fetching above */
        int max_inflight_batches; /* 4: closed batches running or being written */
        int executors;          /* 1: batches run in parallel on this many threads */
        int default_timeout_ms; /* 0 = none; a job may only shorten it */
        int default_priority;   /* 5: for jobs that give none, unless their topic has one */
        int aging_ms;           /* 1000: a waiting job gains one priority level per aging_ms */
        int max_batch_tokens;   /* 16384: an encoder batch's rows x its longest row */
        int group_by_length;    /* 1: an encoder batch takes jobs of its first job's
                                   length bucket first, and none longer */
        int pause_after_ms;     /* 500: full this long (not taking records) before pausing */
        size_t preferred_sizes[16]; /* increasing; empty = none */
        size_t n_preferred_sizes;
        struct cfg_topic_prio *topic_priorities; /* default priority per input topic */
        size_t n_topic_priorities;
    } batching;
    struct model_spec *models;  /* at least one */
    size_t n_models;
    char *default_model;        /* name of one of models; default: the first */
    struct {
        char *listen;           /* "127.0.0.1:9464"; "" = no HTTP server */
        int watchdog_ms;        /* 60000: a loop silent this long fails /healthz */
        int heartbeat_interval_ms; /* 5000: Redis heartbeat and Redis check period */
        char *heartbeat_prefix; /* "kinfer:worker:"; "" = no heartbeat hash */
        char *worker_id;        /* "" = <hostname>-<pid> */
    } metrics;
    struct {
        int drain_timeout_ms;   /* 15000: SIGTERM drain budget */
        int max_payload_bytes;  /* 1048576: larger records are rejected unread */
        int max_text_chars;     /* 65536: characters per text row, before tokenizing */
        char *backend;          /* "auto" | "cpu" | "cuda" */
        int blas_threads;       /* 0 = OpenBLAS default */
        char *cpu_precision;    /* "fp32" | "bf16": the CPU backend's number format */
        int max_attempts;       /* 3: a job running when the worker died this many
                                   times is answered inference_failed, not run again */
        char *attempt_prefix;   /* "kinfer:attempt:": Redis keys of those counters */
    } worker;
    struct {
        char *precision;        /* "auto" | "fp32" | "tf32" | "fp16" | "bf16" */
        int graphs;             /* 1: a captured CUDA graph per batch-size bucket */
        int devices[MODEL_MAX_DEVICES]; /* device indices; empty = every usable one */
        size_t n_devices;
        int executors_per_device; /* 2: executors when batching.executors is 0 */
        int workspace_mb;       /* 32: cuBLASLt workspace per executor */
    } gpu;
    struct {                    /* fault injection for the fault tests; empty = off */
        char *crash_id;         /* abort() when about to run the job with this id */
        char *hang_id;          /* block forever when about to run this job */
        int batch_sleep_ms;     /* sleep this long before every batch */
        char *device_fault_id;  /* fail the device (a sticky error) running this job */
    } debug;
    struct {
        char *reply_topic;      /* "results.replay": `kinfer replay` results */
    } replay;
    struct {
        char *level;            /* "info" */
        char *format;           /* "text" | "json" */
    } log;
};

/* The scalar settings table (config/config.c): one row per setting that
 * holds a single value, in base/cfgtab.h's row format, with offsets into
 * struct kcfg. It drives defaults, reading the file, --set, validation;
 * worker.cfg documents the same rows and tests/test_config.c checks that
 * the two agree. */
/* Returns the table (static storage) and stores its length in *n. */
const struct cfgtab_row *cfg_options(size_t *n);

/* Reads path, applies each "section.key=value" override in sets (n_sets of
 * them) and validates everything. Returns a new config, or NULL with errstr
 * filled as "FILE:LINE: message" (or "--set X: message"). Borrows path and
 * sets. Any scalar of the table may be set, top-level ones too
 * ("default_model=x"), and so may a librdkafka property
 * ("kafka.properties.linger.ms=5", replacing one the file gives). A
 * relative model path is resolved against the directory of the file that
 * names it, so the config and its models can move together. */
struct kcfg *cfg_load(const char *path, const char *const *sets, size_t n_sets,
                      char *errstr, size_t errstr_size);
/* Frees c and everything it owns; accepts NULL. */
void cfg_destroy(struct kcfg *c);

/* The default priority of jobs from topic: its batching.topic_priorities
 * entry, else batching.default_priority. */
int cfg_topic_priority(const struct kcfg *c, const char *topic);

/* The model runtime's settings from c: worker.backend, worker.blas_threads
 * and gpu.*, with batching.preferred_sizes as the graph buckets, and c's
 * models as the ones gpu.precision "auto" reads (rc->specs). rc borrows
 * from c. */
void cfg_model_runtime(const struct kcfg *c, struct model_runtime_conf *rc);

/* Index of the model named name in c->models, or -1. */
int cfg_model_index(const struct kcfg *c, const char *name);

#endif

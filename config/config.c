/* config.c - reads the worker's libconfig file once at startup, applies
 * --set overrides, validates everything and hands back a plain struct kcfg.
 *
 * Every setting that holds a single value is a row of options[] below:
 * dotted name, type, bounds, default, place in struct kcfg and one line of
 * documentation (rows in base/cfgtab.h's format; that engine does the
 * defaults, the checked stores and the freeing). That table drives the
 * defaults, the reading of the file,
 * --set, validation and cfg_destroy; worker.cfg at the
 * repo root documents the same rows and tests/test_config.c checks that
 * they agree. The settings that are not scalars have readers of their
 * own, listed in aggregates[] so the walker knows them: kafka.topics and
 * kafka.properties in config_kafka.c, models in config_models.c, the
 * small arrays (preferred sizes, topic priorities, devices) here.
 *
 * The first problem found stops loading, reported as "FILE:LINE: what"
 * (or "--set ARG: what"); main decides to exit.
 *
 * Threads: main thread, at startup only. Ownership: cfg_load returns a new
 * struct kcfg that owns every string and array in it; nothing in it points
 * into libconfig's tree, which is destroyed before cfg_load returns. */
#include "config.h"
#include "config_read.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define STR_MAX 4095                     /* longest ordinary string setting */
#define TTL_MAX 3153600000000LL          /* 100 years in ms */

static const char *const log_levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const log_formats[] = {"text", "json", NULL};
static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
static const char *const cpu_precisions[] = {"fp32", "bf16", NULL};
static const char *const precisions[] = {"auto", "fp32", "tf32", "fp16", "bf16", NULL};

static int check_listen(const char *value, char *why, size_t why_size);

#define F(field) offsetof(struct kcfg, field)
#define INT_OPT(n, lo, hi, def, field, d) \
    {n, CFGTAB_INT, lo, hi, def, NULL, NULL, NULL, F(field), d}
#define I64_OPT(n, lo, hi, def, field, d) \
    {n, CFGTAB_INT64, lo, hi, def, NULL, NULL, NULL, F(field), d}
#define STR_OPT(n, lo, hi, def, choices, check, field, d) \
    {n, CFGTAB_STRING, lo, hi, 0, def, choices, check, F(field), d}
#define BOOL_OPT(n, def, field, d) {n, CFGTAB_BOOL, 0, 1, def, NULL, NULL, NULL, F(field), d}

/* The table. Keep worker.cfg in step: tests/test_config.c fails when a
 * row is missing there or shows another default. */
static const struct cfgtab_row options[] = {
    STR_OPT("kafka.brokers", 1, STR_MAX, "127.0.0.1:9092", NULL, NULL, kafka.brokers,
            "bootstrap brokers, comma-separated host:port (librdkafka bootstrap.servers)"),
    STR_OPT("kafka.group", 1, 255, "kinfer", NULL, NULL, kafka.group,
            "consumer group id (librdkafka group.id); workers of one deployment share it"),
    STR_OPT("kafka.reply_topic", 1, 249, "results", NULL, NULL, kafka.reply_topic,
            "topic results are produced to; must not be one of kafka.topics"),
    STR_OPT("kafka.dlq_topic", 1, 249, "jobs.dlq", NULL, NULL, kafka.dlq_topic,
            "topic jobs that cannot be decoded or run go to; must not be one of kafka.topics"),
    INT_OPT("kafka.revoke_timeout_ms", 0, 600000, 10000, kafka.revoke_timeout_ms,
            "when a partition is revoked, how long its in-flight jobs may take to finish, ms"),
    INT_OPT("kafka.resume_seek", 0, 1, 1, kafka.resume_seek,
            "1 = after backpressure resumes fetching, seek each partition to where it stands "
            "so its fetcher starts at once; 0 = plain resume"),
    INT_OPT("kafka.static_membership", 0, 1, 1, kafka.static_membership,
            "1 = a worker whose metrics.worker_id is set joins its group as that static "
            "member (librdkafka group.instance.id); 0 = never"),
    STR_OPT("redis.host", 1, STR_MAX, "127.0.0.1", NULL, NULL, redis.host,
            "Redis server host"),
    INT_OPT("redis.port", 1, 65535, 6379, redis.port, "Redis server port"),
    STR_OPT("redis.password", 0, STR_MAX, "", NULL, NULL, redis.password,
            "password sent with AUTH after connecting; empty = no AUTH"),
    INT_OPT("redis.db", 0, 65535, 0, redis.db, "database SELECTed after connecting"),
    STR_OPT("redis.key_prefix", 0, 1024, "kinfer:result:", NULL, NULL, redis.key_prefix,
            "prefix of every result key"),
    I64_OPT("redis.ttl_ms", 1, TTL_MAX, 3600000, redis.ttl_ms,
            "how long a stored result lives, ms (SET ... PX)"),
    INT_OPT("redis.timeout_ms", 1, 600000, 2000, redis.timeout_ms,
            "connect and command timeout, ms"),
    STR_OPT("redis.publish_channel", 0, 1024, "", NULL, NULL, redis.publish_channel,
            "channel each result is also PUBLISHed to; empty = no PUBLISH"),
    STR_OPT("redis.stream_prefix", 1, 1024, "kinfer:stream:", NULL, NULL, redis.stream_prefix,
            "generation jobs with stream: true append their text to the Redis stream "
            "prefix + id"),
    INT_OPT("generation.kv_cache_mb", 1, 1048576, 256, generation.kv_cache_mb,
            "generating models: the key/value cache of each model, MiB"),
    INT_OPT("generation.block_tokens", 1, 4096, 16, generation.block_tokens,
            "generating models: tokens per key/value cache block"),
    BOOL_OPT("generation.prefix_sharing", 1, generation.prefix_sharing,
             "generating models: reuse cached blocks of a prompt's leading tokens"),
    BOOL_OPT("generation.overlap", 1, generation.overlap,
             "generating models: on CUDA, chain decode steps so the host's work "
             "overlaps the device's"),
    INT_OPT("generation.max_seqs", 1, 4096, 16, generation.max_seqs,
            "generating models: sequences generating at once per model; at most "
            "batching.max_batch_tokens"),
    INT_OPT("generation.max_tokens", 1, 1048576, 256, generation.max_tokens,
            "generating models: a job's max_tokens when it gives none (capped by the context)"),
    INT_OPT("batching.max_batch_rows", 1, 65536, 32, batching.max_batch_rows,
            "rows in one forward pass; a batch closes when it is this full"),
    INT_OPT("batching.max_wait_ms", 0, 60000, 5, batching.max_wait_ms,
            "longest a partly full batch waits for more rows, ms"),
    INT_OPT("batching.max_job_rows", 1, 1048576, 1024, batching.max_job_rows,
            "largest job accepted, rows; a job above max_batch_rows runs alone"),
    INT_OPT("batching.max_queued_rows", 1, 16777216, 4096, batching.max_queued_rows,
            "rows waiting to run before the consumer stops taking records; >= max_batch_rows, "
            "2 x max_job_rows"),
    INT_OPT("batching.max_inflight_batches", 1, 1024, 4, batching.max_inflight_batches,
            "closed batches running or being written out at once; more wait in the queue"),
    INT_OPT("batching.executors", 0, 64, 0, batching.executors,
            "executor threads, each running its own batches; 0 = one per online CPU (at most 64)"),
    INT_OPT("batching.default_timeout_ms", 0, 86400000, 0, batching.default_timeout_ms,
            "deadline after the record's timestamp for every job, ms; 0 = none; jobs may only shorten it"),
    INT_OPT("batching.default_priority", 0, 9, 5, batching.default_priority,
            "priority of jobs that give none and whose topic has no entry in topic_priorities"),
    INT_OPT("batching.aging_ms", 0, 3600000, 1000, batching.aging_ms,
            "a queued job gains one priority level per aging_ms waited; 0 = no aging"),
    INT_OPT("batching.max_batch_tokens", 1, 1048576, 16384, batching.max_batch_tokens,
            "encoders: padded tokens (rows x the longest row) in one forward pass; "
            "also the largest job"),
    BOOL_OPT("batching.group_by_length", 1, batching.group_by_length,
             "encoders: a batch takes jobs of its first job's length bucket first and none "
             "longer, so padding stays low"),
    INT_OPT("batching.pause_after_ms", 0, 60000, 500, batching.pause_after_ms,
            "full this long (taking no records, keeping librdkafka's prefetch) before the "
            "partitions are paused, ms; 0 = pause at once"),
    STR_OPT("default_model", 1, MODEL_NAME_MAX - 1, NULL, NULL, NULL, default_model,
            "model for jobs that name none; must be one of models; default: the first"),
    STR_OPT("metrics.listen", 0, 255, "127.0.0.1:9464", NULL, check_listen, metrics.listen,
            "host:port of /metrics, /healthz, /readyz ([::1]:9464 for IPv6); empty = none"),
    INT_OPT("metrics.watchdog_ms", 100, 3600000, 60000, metrics.watchdog_ms,
            "a worker loop silent this long trips the watchdog: /healthz answers 503, ms"),
    INT_OPT("metrics.heartbeat_interval_ms", 100, 3600000, 5000, metrics.heartbeat_interval_ms,
            "how often the Redis heartbeat is written and Redis checked for /readyz, ms"),
    STR_OPT("metrics.heartbeat_prefix", 0, 1024, "kinfer:worker:", NULL, NULL,
            metrics.heartbeat_prefix,
            "heartbeat hash key prefix; key = prefix + group + ':' + id; empty = no heartbeat"),
    STR_OPT("metrics.worker_id", 0, 200, "", NULL, NULL, metrics.worker_id,
            "this worker's id in heartbeats; empty = <hostname>-<pid>"),
    INT_OPT("worker.drain_timeout_ms", 0, 600000, 15000, worker.drain_timeout_ms,
            "on SIGTERM, how long in-flight jobs may take to finish before exit, ms"),
    INT_OPT("worker.max_payload_bytes", 1, 1073741824, 1048576, worker.max_payload_bytes,
            "Kafka records larger than this are rejected without being decoded"),
    INT_OPT("worker.max_text_chars", 1, 16777216, 65536, worker.max_text_chars,
            "encoders: characters in one text row (before tokenizing); longer is invalid_input"),
    STR_OPT("worker.backend", 1, 4, "auto", backends, NULL, worker.backend,
            "what runs the models: auto (CUDA when a device is usable, else the CPU), cpu or cuda"),
    INT_OPT("worker.blas_threads", 0, 1024, 1, worker.blas_threads,
            "OpenBLAS threads per forward pass; 0 = OpenBLAS's own default (one per core)"),
    STR_OPT("worker.cpu_precision", 4, 4, "fp32", cpu_precisions, NULL, worker.cpu_precision,
            "CPU backend number format: fp32, or bf16 (bfloat16 weights and GEMM inputs, float32 sums; AMX tiles where the CPU has them)"),
    INT_OPT("worker.max_attempts", 0, 1000, 3, worker.max_attempts,
            "a job running when the worker died this many times is answered, not run; 0 = off"),
    STR_OPT("worker.attempt_prefix", 1, 1024, "kinfer:attempt:", NULL, NULL,
            worker.attempt_prefix, "Redis key prefix of the per-job attempt counters"),
    STR_OPT("gpu.precision", 4, 4, "auto", precisions, NULL, gpu.precision,
            "CUDA backend number format: auto (the models' weights' own: bf16 or fp16 when "
            "every model's are mainly BF16 or F16, else fp32), fp32, tf32, fp16 or bf16 "
            "(16-bit: float32 accumulation)"),
    BOOL_OPT("gpu.graphs", 1, gpu.graphs,
             "true = a batch shape seen twice is captured as a CUDA graph and replayed; false = eager launches"),
    INT_OPT("gpu.executors_per_device", 1, 16, 2, gpu.executors_per_device,
            "executors per device when batching.executors is 0, each with its own stream"),
    INT_OPT("gpu.workspace_mb", 1, 4096, 32, gpu.workspace_mb,
            "cuBLASLt workspace per executor, MiB"),
    STR_OPT("debug.crash_id", 0, 200, "", NULL, NULL, debug.crash_id,
            "fault tests only: abort the process when about to run the job with this id"),
    STR_OPT("debug.hang_id", 0, 200, "", NULL, NULL, debug.hang_id,
            "fault tests only: hang the executor when about to run the job with this id"),
    INT_OPT("debug.batch_sleep_ms", 0, 3600000, 0, debug.batch_sleep_ms,
            "fault tests only: sleep this long before every batch and generation step "
            "(a slow executor)"),
    STR_OPT("debug.device_fault_id", 0, 200, "", NULL, NULL, debug.device_fault_id,
            "fault tests only: fail the device (a sticky error) when running the job with this id"),
    STR_OPT("replay.reply_topic", 1, 249, "results.replay", NULL, NULL, replay.reply_topic,
            "topic kinfer replay publishes results to without --reply-topic; not in kafka.topics"),
    STR_OPT("log.level", 1, 5, "info", log_levels, NULL, log.level,
            "least severe level logged: error, warn, info or debug"),
    STR_OPT("log.format", 1, 4, "text", log_formats, NULL, log.format,
            "text (key=value) or json, one line per event"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

#undef F
#undef INT_OPT
#undef I64_OPT
#undef STR_OPT
#undef BOOL_OPT

static int read_preferred_sizes(struct loader *ld, const config_setting_t *s);
static int read_topic_priorities(struct loader *ld, const config_setting_t *s);
static int read_devices(struct loader *ld, const config_setting_t *s);

/* Settings that hold more than one value: the walker hands them to their
 * readers, and so does --set (set_aggregate). */
static const struct aggregate {
    const char *name;
    const char *shape;
    int (*read)(struct loader *ld, const config_setting_t *s);
    char plain; /* --set NAME=a,b: 's' strings, 'i' integers; 0: libconfig syntax only */
} aggregates[] = {
    {"kafka.topics", "a list of strings", cfg_read_topics, 's'},
    {"kafka.properties", "a list of ( \"name\", \"value\" ) pairs", cfg_read_properties, 0},
    {"models", "a list of groups", cfg_read_models, 0},
    {"batching.preferred_sizes", "an array of integers [ 8, 16, 32 ]", read_preferred_sizes, 'i'},
    {"batching.topic_priorities", "a list of ( \"topic\", priority ) pairs", read_topic_priorities,
     0},
    {"gpu.devices", "an array of device indices [ 0, 1 ]", read_devices, 'i'},
};
#define N_AGGREGATES (sizeof(aggregates) / sizeof(aggregates[0]))

/* Gives the table to callers that document or check it (tests, --help). */
const struct cfgtab_row *cfg_options(size_t *n)
{
    *n = N_OPTIONS;
    return options;
}

/* Finds a row by its dotted name; the walker, --set and validate use it. */
static const struct cfgtab_row *option_find(const char *name)
{
    return cfgtab_find(options, N_OPTIONS, name);
}

/* Finds an aggregate (a setting with its own reader) by dotted name. */
static const struct aggregate *aggregate_find(const char *name)
{
    for (size_t i = 0; i < N_AGGREGATES; i++)
        if (strcmp(aggregates[i].name, name) == 0) return &aggregates[i];
    return NULL;
}

/* True if name is a section: some known setting's name starts with
 * "name.". Sections are then never declared anywhere but in the names. */
static bool is_section(const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strncmp(options[i].name, name, n) == 0 && options[i].name[n] == '.') return true;
    for (size_t i = 0; i < N_AGGREGATES; i++)
        if (strncmp(aggregates[i].name, name, n) == 0 && aggregates[i].name[n] == '.') return true;
    return false;
}

/* libconfig's type codes in words, for "expected X, got Y" messages. */
const char *cfg_type_words(int type)
{
    switch (type) {
    case CONFIG_TYPE_GROUP: return "a group";
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: return "an integer";
    case CONFIG_TYPE_FLOAT: return "a float";
    case CONFIG_TYPE_STRING: return "a string";
    case CONFIG_TYPE_BOOL: return "a boolean";
    case CONFIG_TYPE_ARRAY: return "an array";
    case CONFIG_TYPE_LIST: return "a list";
    default: return "nothing";
    }
}

/* libconfig names a setting's file as it was written: the path cfg_load
 * was given for the main file, the bare @include name (resolved against
 * the main file's directory, see cfg_load) for an included one. This
 * turns either into a path that works from the cwd, for messages and for
 * resolving model paths. */
void cfg_display_path(const struct loader *ld, const char *file, char *buf, size_t cap)
{
    const char *slash = strrchr(ld->path, '/');
    if (!file || strcmp(file, ld->path) == 0 || file[0] == '/' || !slash)
        snprintf(buf, cap, "%s", file ? file : ld->path);
    else
        snprintf(buf, cap, "%.*s/%s", (int)(slash - ld->path), ld->path, file);
}

/* Records the first error as "FILE:LINE: message" at setting s; returns -1
 * so callers can `return cfg_fail_at(...)`. */
/* Writes the message after the n-byte "where" prefix already in ld->err
 * (n as snprintf returned it). The error formatters below share it. */
__attribute__((format(printf, 3, 0)))
static void append_message(struct loader *ld, int n, const char *fmt, va_list ap)
{
    if (n >= 0 && (size_t)n < ld->err_size)
        vsnprintf(ld->err + n, ld->err_size - (size_t)n, fmt, ap);
}

__attribute__((format(printf, 3, 4)))
int cfg_fail_at(struct loader *ld, const config_setting_t *s, const char *fmt, ...)
{
    char file[4200];
    cfg_display_path(ld, config_setting_source_file(s), file, sizeof(file));
    int n = ld->set_arg
                ? snprintf(ld->err, ld->err_size, "--set %s: ", ld->set_arg)
                : snprintf(ld->err, ld->err_size, "%s:%u: ", file, config_setting_source_line(s));
    va_list ap;
    va_start(ap, fmt);
    append_message(ld, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Records an error about the setting called name, at wherever its value
 * came from: "FILE:LINE: name: message", "--set ARG: message", or
 * "FILE: name: message" for a default. Returns -1. */
__attribute__((format(printf, 4, 5)))
int cfg_fail_origin(struct loader *ld, const struct origin *o, const char *name,
                       const char *fmt, ...)
{
    int n;
    char file[4200];
    if (o && o->set) {
        n = snprintf(ld->err, ld->err_size, "--set %s: ", o->set);
    } else if (o && o->file) {
        cfg_display_path(ld, o->file, file, sizeof(file));
        n = snprintf(ld->err, ld->err_size, "%s:%u: %s: ", file, o->line, name);
    } else
        n = snprintf(ld->err, ld->err_size, "%s: %s: ", ld->path, name);
    va_list ap;
    va_start(ap, fmt);
    append_message(ld, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Records an error with no setting to point at (out of memory, no file).
 * Returns -1. */
__attribute__((format(printf, 2, 3)))
int cfg_fail_plain(struct loader *ld, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->err, ld->err_size, fmt, ap);
    va_end(ap);
    return -1;
}

/* metrics.listen must be host:port, so the metrics server fails here with
 * a line number rather than later with a bind error. IPv6 hosts go in
 * brackets so the port stays unambiguous. Empty means no HTTP server at
 * all, for deployments that scrape nothing. */
static int check_listen(const char *value, char *why, size_t why_size)
{
    if (!*value) return 0; /* no HTTP server */
    const char *colon = strrchr(value, ':');
    if (!colon || colon == value) {
        snprintf(why, why_size, "'%s' is not host:port", value);
        return -1;
    }
    size_t host_len = (size_t)(colon - value);
    if (value[0] == '[') {
        if (host_len < 3 || value[host_len - 1] != ']') {
            snprintf(why, why_size, "'%s': an IPv6 host must be [addr]:port", value);
            return -1;
        }
    } else if (memchr(value, ':', host_len)) {
        snprintf(why, why_size, "'%s': write an IPv6 host in brackets, [addr]:port", value);
        return -1;
    }
    const char *p = colon + 1;
    long port = 0;
    if (!*p) port = -1;
    for (; *p && port >= 0; p++) {
        if (*p < '0' || *p > '9' || port > 65535) port = -1;
        else port = port * 10 + (*p - '0');
    }
    if (port < 0 || port > 65535) {
        snprintf(why, why_size, "'%s': the port must be a number in 0..65535 (0: any free port)",
                 value);
        return -1;
    }
    return 0;
}

/* The engine's reasons are written here before they get their place
 * ("FILE:LINE: name: ..."); errstr buffers are smaller. */
#define WHY_MAX 8192

/* Stores an integer into row o (bounds checked by the table engine) and
 * notes where it came from. */
static int option_set_int(struct loader *ld, const struct cfgtab_row *o,
                          const struct origin *org, long long v)
{
    char why[WHY_MAX];
    if (cfgtab_set_int(o, ld->c, v, why, sizeof(why)) < 0)
        return cfg_fail_origin(ld, org, o->name, "%s", why);
    ld->orig[o - options] = *org;
    return 0;
}

/* Stores a copy of a string into row o after the table engine's length,
 * choice and extra checks, and notes where it came from. */
static int option_set_str(struct loader *ld, const struct cfgtab_row *o,
                          const struct origin *org, const char *v)
{
    char why[WHY_MAX];
    int rc = cfgtab_set_str(o, ld->c, v, why, sizeof(why));
    if (rc == CFGTAB_ENOMEM) return cfg_fail_plain(ld, "out of memory");
    if (rc < 0) return cfg_fail_origin(ld, org, o->name, "%s", why);
    ld->orig[o - options] = *org;
    return 0;
}

/* Reads one scalar of the table from the file. libconfig 1.5 types a
 * number by its literal (an L suffix makes it 64-bit), so either integer
 * type is taken for either int field, as long as it is in range. */
static int read_option(struct loader *ld, const struct cfgtab_row *o, const config_setting_t *s)
{
    struct origin org = {config_setting_source_file(s), config_setting_source_line(s), NULL};
    int t = config_setting_type(s);
    switch (o->type) {
    case CFGTAB_INT:
    case CFGTAB_INT64:
        if (t == CONFIG_TYPE_INT)
            return option_set_int(ld, o, &org, config_setting_get_int(s));
        if (t == CONFIG_TYPE_INT64)
            return option_set_int(ld, o, &org, config_setting_get_int64(s));
        return cfg_fail_at(ld, s, "%s: expected an integer, got %s", o->name, cfg_type_words(t));
    case CFGTAB_STRING:
        if (t != CONFIG_TYPE_STRING)
            return cfg_fail_at(ld, s, "%s: expected a string, got %s", o->name, cfg_type_words(t));
        return option_set_str(ld, o, &org, config_setting_get_string(s));
    case CFGTAB_BOOL:
        if (t != CONFIG_TYPE_BOOL)
            return cfg_fail_at(ld, s, "%s: expected true or false, got %s", o->name, cfg_type_words(t));
        return option_set_int(ld, o, &org, config_setting_get_bool(s));
    }
    return cfg_fail_at(ld, s, "%s: bad table row", o->name);
}

/* Visits every member of group g (named prefix, NULL for the root): table
 * rows, aggregates and sub-sections are read; anything else is an unknown
 * setting, which is how a typo like kafka.brokerz gets caught. */
static int walk_group(struct loader *ld, const config_setting_t *g, const char *prefix)
{
    int n = config_setting_length(g);
    for (int i = 0; i < n; i++) {
        const config_setting_t *m = config_setting_get_elem(g, (unsigned)i);
        char name[256];
        int len = prefix ? snprintf(name, sizeof(name), "%s.%s", prefix, config_setting_name(m))
                         : snprintf(name, sizeof(name), "%s", config_setting_name(m));
        if (len < 0 || (size_t)len >= sizeof(name))
            return cfg_fail_at(ld, m, "unknown setting '%s'", config_setting_name(m));
        const struct cfgtab_row *o = option_find(name);
        const struct aggregate *a = o ? NULL : aggregate_find(name);
        int rc;
        if (o) {
            rc = read_option(ld, o, m);
        } else if (a) {
            rc = a->read(ld, m);
        } else if (is_section(name)) {
            if (!config_setting_is_group(m))
                return cfg_fail_at(ld, m, "%s: expected a group { ... }, got %s", name,
                               cfg_type_words(config_setting_type(m)));
            rc = walk_group(ld, m, name);
        } else {
            return cfg_fail_at(ld, m, "unknown setting '%s'", name);
        }
        if (rc < 0) return rc;
    }
    return 0;
}

/* batching.preferred_sizes = [ 8, 16, 32 ]: the batch sizes a batch closed
 * by time is cut to. Strictly increasing so "the largest that fits" is
 * unambiguous; checked against max_batch_rows in validate(). */
static int read_preferred_sizes(struct loader *ld, const config_setting_t *s)
{
    struct kcfg *c = ld->c;
    if (!config_setting_is_array(s) && !config_setting_is_list(s))
        return cfg_fail_at(ld, s, "batching.preferred_sizes: expected an array of integers "
                       "[ 8, 16, 32 ], got %s", cfg_type_words(config_setting_type(s)));
    int n = config_setting_length(s);
    size_t cap = sizeof(c->batching.preferred_sizes) / sizeof(c->batching.preferred_sizes[0]);
    if ((size_t)n > cap)
        return cfg_fail_at(ld, s, "batching.preferred_sizes: at most %zu sizes, got %d", cap, n);
    c->batching.n_preferred_sizes = 0;
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        int t = config_setting_type(e);
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
            return cfg_fail_at(ld, e, "batching.preferred_sizes[%d]: expected an integer, got %s",
                           i, cfg_type_words(t));
        long long v = config_setting_get_int64(e);
        if (v < 1 || v > 65536)
            return cfg_fail_at(ld, e, "batching.preferred_sizes[%d]: %lld is out of range 1..65536",
                           i, v);
        if (i > 0 && (size_t)v <= c->batching.preferred_sizes[i - 1])
            return cfg_fail_at(ld, e, "batching.preferred_sizes: sizes must be strictly increasing "
                           "(%lld after %zu)", v, c->batching.preferred_sizes[i - 1]);
        c->batching.preferred_sizes[c->batching.n_preferred_sizes++] = (size_t)v;
    }
    return 0;
}

/* batching.topic_priorities = ( ( "backfill", 2 ) ): the priority of jobs
 * from a topic that give none, e.g. a backfill topic below live traffic.
 * The topics must be input topics; validate() checks that. */
static int read_topic_priorities(struct loader *ld, const config_setting_t *s)
{
    struct kcfg *c = ld->c;
    if (!config_setting_is_list(s) && !(config_setting_is_array(s) && config_setting_length(s) == 0))
        return cfg_fail_at(ld, s, "batching.topic_priorities: expected a list of pairs "
                       "( ( \"topic\", priority ), ... ), got %s",
                       cfg_type_words(config_setting_type(s)));
    int n = config_setting_length(s);
    c->batching.topic_priorities = calloc((size_t)n + 1, sizeof(struct cfg_topic_prio));
    if (!c->batching.topic_priorities) return cfg_fail_plain(ld, "out of memory");
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        const config_setting_t *t = config_setting_is_list(e) && config_setting_length(e) == 2
                                        ? config_setting_get_elem(e, 0) : NULL;
        const config_setting_t *p = t ? config_setting_get_elem(e, 1) : NULL;
        if (!t || config_setting_type(t) != CONFIG_TYPE_STRING ||
            (config_setting_type(p) != CONFIG_TYPE_INT && config_setting_type(p) != CONFIG_TYPE_INT64))
            return cfg_fail_at(ld, e, "batching.topic_priorities[%d]: expected ( \"topic\", priority )",
                           i);
        long long v = config_setting_get_int64(p);
        if (v < 0 || v > 9)
            return cfg_fail_at(ld, e, "batching.topic_priorities[%d]: priority %lld is out of range 0..9",
                           i, v);
        const char *topic = config_setting_get_string(t);
        for (size_t k = 0; k < c->batching.n_topic_priorities; k++)
            if (strcmp(c->batching.topic_priorities[k].topic, topic) == 0)
                return cfg_fail_at(ld, e, "batching.topic_priorities: '%s' is given twice", topic);
        struct cfg_topic_prio *tp = &c->batching.topic_priorities[c->batching.n_topic_priorities];
        if (!(tp->topic = strdup(topic))) return cfg_fail_plain(ld, "out of memory");
        tp->priority = (int)v;
        c->batching.n_topic_priorities++;
    }
    return 0;
}

/* gpu.devices = [ 0, 1 ]: CUDA device indices, distinct, at most MODEL_MAX_DEVICES; empty
 * means every usable device. Whether they exist is the CUDA backend's to
 * say at start-up (the machine decides, not the file). */
static int read_devices(struct loader *ld, const config_setting_t *s)
{
    struct kcfg *c = ld->c;
    if (!config_setting_is_array(s) && !config_setting_is_list(s))
        return cfg_fail_at(ld, s, "gpu.devices: expected an array of device indices [ 0, 1 ], got %s",
                       cfg_type_words(config_setting_type(s)));
    int n = config_setting_length(s);
    size_t cap = sizeof(c->gpu.devices) / sizeof(c->gpu.devices[0]);
    if ((size_t)n > cap)
        return cfg_fail_at(ld, s, "gpu.devices: at most %zu devices, got %d", cap, n);
    c->gpu.n_devices = 0;
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        int t = config_setting_type(e);
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
            return cfg_fail_at(ld, e, "gpu.devices[%d]: expected an integer, got %s", i,
                           cfg_type_words(t));
        long long v = config_setting_get_int64(e);
        if (v < 0 || v > 1023)
            return cfg_fail_at(ld, e, "gpu.devices[%d]: %lld is out of range 0..1023", i, v);
        for (size_t k = 0; k < c->gpu.n_devices; k++)
            if (c->gpu.devices[k] == v)
                return cfg_fail_at(ld, e, "gpu.devices: device %lld is listed twice", v);
        c->gpu.devices[c->gpu.n_devices++] = (int)v;
    }
    return 0;
}

/* --set of a setting with more than one value: the value in the file's
 * syntax ("[ \"a\", \"b\" ]", "( ( \"t\", 3 ) )"), or, for a list of strings
 * or integers, the items with commas between them (a,b), read by the
 * setting's own reader, whose errors then name the --set. Replaces what
 * the file gave. */
static int set_aggregate(struct loader *ld, const struct aggregate *a, const char *arg,
                         const char *value)
{
    struct origin org = {NULL, 0, arg};
    const char *v = value;
    while (isspace((unsigned char)*v)) v++;
    size_t cap = strlen(value) * 4 + 32;
    char *text = malloc(cap);
    if (!text) return cfg_fail_plain(ld, "out of memory");
    size_t n = (size_t)snprintf(text, cap, "v = ");
    if (*v == '[' || *v == '(' || !a->plain) {
        n += (size_t)snprintf(text + n, cap - n, "%s", value);
    } else {
        /* a,b,c: each item trimmed, quoted for a list of strings */
        text[n++] = '[';
        for (const char *p = v;;) {
            const char *end = strchr(p, ',');
            if (!end) end = p + strlen(p);
            const char *b = p, *e = end;
            while (b < e && isspace((unsigned char)*b)) b++;
            while (e > b && isspace((unsigned char)e[-1])) e--;
            if (p != v) text[n++] = ',';
            if (a->plain == 's') text[n++] = '"';
            for (const char *q = b; q < e; q++) {
                if (a->plain == 's' && (*q == '"' || *q == '\\')) text[n++] = '\\';
                text[n++] = *q;
            }
            if (a->plain == 's') text[n++] = '"';
            if (!*end) break;
            p = end + 1;
        }
        text[n++] = ']';
    }
    snprintf(text + n, cap - n, ";");
    config_t lc;
    config_init(&lc);
    int rc;
    if (!config_read_string(&lc, text)) {
        rc = cfg_fail_origin(ld, &org, NULL, "expected %s (%s)", a->shape,
                             config_error_text(&lc));
    } else {
        ld->set_arg = arg;
        rc = a->read(ld, config_lookup(&lc, "v"));
        ld->set_arg = NULL;
    }
    config_destroy(&lc);
    free(text);
    return rc;
}

/* Applies one --set "name=value": a table row parsed by its type, or a
 * librdkafka property as kafka.properties.<name>=value. The file has been
 * read already, so this wins over it. */
static int apply_set(struct loader *ld, const char *arg)
{
    const char *eq = strchr(arg, '=');
    struct origin org = {NULL, 0, arg};
    if (!eq || eq == arg) return cfg_fail_origin(ld, &org, NULL, "expected section.key=value");
    char name[256];
    size_t nlen = (size_t)(eq - arg);
    if (nlen >= sizeof(name)) return cfg_fail_origin(ld, &org, NULL, "unknown setting");
    memcpy(name, arg, nlen);
    name[nlen] = '\0';
    const char *value = eq + 1;

    static const char props[] = "kafka.properties.";
    if (strncmp(name, props, sizeof(props) - 1) == 0) {
        const char *key = name + sizeof(props) - 1;
        if (!*key) return cfg_fail_origin(ld, &org, NULL, "empty property name");
        const char *why = cfg_property_refusal(key, value);
        if (why) return cfg_fail_origin(ld, &org, NULL, "'%s' %s", key, why);
        return cfg_property_put(ld, key, value);
    }
    const struct cfgtab_row *o = option_find(name);
    if (!o) {
        const struct aggregate *a = aggregate_find(name);
        if (a) return set_aggregate(ld, a, arg, value);
        return cfg_fail_origin(ld, &org, NULL, "unknown setting");
    }
    if (o->type == CFGTAB_STRING) return option_set_str(ld, o, &org, value);
    if (o->type == CFGTAB_BOOL) {
        /* libconfig's own spelling, and 1/0 as the other settings write it. */
        int is_true = !strcasecmp(value, "true") || !strcmp(value, "1");
        if (!is_true && strcasecmp(value, "false") != 0 && strcmp(value, "0") != 0)
            return cfg_fail_origin(ld, &org, NULL, "expected true or false");
        return option_set_int(ld, o, &org, is_true);
    }
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (!*value || *end || errno == ERANGE || isspace((unsigned char)value[0]))
        return cfg_fail_origin(ld, &org, NULL, "expected an integer");
    return option_set_int(ld, o, &org, v);
}

/* The checks that involve more than one setting, run once the file and
 * every --set are in, pointing at whichever setting was given explicitly. */
static int validate(struct loader *ld)
{
    struct kcfg *c = ld->c;
#define ORIG(name) (&ld->orig[option_find(name) - options])
    const struct origin *q = ORIG("batching.max_queued_rows");
    const struct origin *b = ORIG("batching.max_batch_rows");
    const struct origin *j = ORIG("batching.max_job_rows");
    if (c->batching.max_queued_rows < c->batching.max_batch_rows)
        return cfg_fail_origin(ld, (q->file || q->set) ? q : b,
                           (q->file || q->set) ? "batching.max_queued_rows"
                                               : "batching.max_batch_rows",
                           "max_queued_rows (%d) must be >= max_batch_rows (%d): the queue "
                           "could never hold a full batch",
                           c->batching.max_queued_rows, c->batching.max_batch_rows);
    /* A queue that holds fewer than two of the largest jobs stops taking
     * records after every job, and each stop costs a fetch restart per
     * job (docs/batching.md, "A small queue and big jobs"). */
    if ((long long)c->batching.max_queued_rows < 2LL * c->batching.max_job_rows)
        return cfg_fail_origin(ld, (q->file || q->set) ? q : j,
                           (q->file || q->set) ? "batching.max_queued_rows"
                                               : "batching.max_job_rows",
                           "max_queued_rows (%d) must be >= 2 x max_job_rows (%d): the queue "
                           "must hold two of the largest jobs, or it fills and stops fetching "
                           "after every job; lower max_job_rows to %d or raise max_queued_rows "
                           "to %lld",
                           c->batching.max_queued_rows, c->batching.max_job_rows,
                           c->batching.max_queued_rows / 2, 2LL * c->batching.max_job_rows);

    if (c->metrics.watchdog_ms < 2 * c->metrics.heartbeat_interval_ms)
        return cfg_fail_origin(ld, ORIG("metrics.watchdog_ms"), "metrics.watchdog_ms",
                           "watchdog_ms (%d) must be at least twice heartbeat_interval_ms (%d): "
                           "the heartbeat loop reports once per interval, so a shorter watchdog "
                           "would stop a healthy worker", c->metrics.watchdog_ms,
                           c->metrics.heartbeat_interval_ms);
    for (size_t i = 0; i < c->batching.n_preferred_sizes; i++)
        if (c->batching.preferred_sizes[i] > (size_t)c->batching.max_batch_rows)
            return cfg_fail_plain(ld, "%s: batching.preferred_sizes: %zu is larger than "
                              "max_batch_rows (%d)", ld->path, c->batching.preferred_sizes[i],
                              c->batching.max_batch_rows);
    for (size_t i = 0; i < c->batching.n_topic_priorities; i++) {
        const char *t = c->batching.topic_priorities[i].topic;
        size_t k = 0;
        while (k < c->kafka.n_topics && strcmp(c->kafka.topics[k], t) != 0) k++;
        if (k == c->kafka.n_topics)
            return cfg_fail_plain(ld, "%s: batching.topic_priorities: '%s' is not one of "
                              "kafka.topics", ld->path, t);
    }

    const char *out[] = {"kafka.reply_topic", "kafka.dlq_topic", "replay.reply_topic"};
    for (size_t i = 0; i < sizeof(out) / sizeof(out[0]); i++) {
        const struct cfgtab_row *o = option_find(out[i]);
        const char *t = *(char **)cfgtab_field(o, c);
        for (size_t k = 0; k < c->kafka.n_topics; k++)
            if (strcmp(c->kafka.topics[k], t) == 0)
                return cfg_fail_origin(ld, &ld->orig[o - options], o->name,
                                   "'%s' is also in kafka.topics: the worker would consume its "
                                   "own output as jobs", t);
    }

    if (c->n_models == 0)
        return cfg_fail_plain(ld, "%s: no models: add models = ( { name = \"...\"; path = \"...\"; "
                          "layers = ( ... ); } );", ld->path);
    if (!c->default_model) {
        if (!(c->default_model = strdup(c->models[0].name))) return cfg_fail_plain(ld, "out of memory");
    } else if (cfg_model_index(c, c->default_model) < 0) {
        return cfg_fail_origin(ld, ORIG("default_model"), "default_model",
                           "'%s' is not one of the models", c->default_model);
    }
#undef ORIG
    return 0;
}

/* Fills every table row and aggregate with its default before the file
 * is read, so an absent section or key simply keeps it. */
static int set_defaults(struct loader *ld)
{
    struct kcfg *c = ld->c;
    if (cfgtab_defaults(options, N_OPTIONS, c) < 0) return cfg_fail_plain(ld, "out of memory");
    c->kafka.topics = calloc(1, sizeof(char *));
    if (!c->kafka.topics || !(c->kafka.topics[0] = strdup("jobs")))
        return cfg_fail_plain(ld, "out of memory");
    c->kafka.n_topics = 1;
    return 0;
}

/* Defaults, then the file, then --set, then the cross-field checks: each
 * later step sees the result of the earlier ones, and the first error
 * stops everything with one message. */
struct kcfg *cfg_load(const char *path, const char *const *sets, size_t n_sets, char *errstr,
                      size_t errstr_size)
{
    struct loader *ld = calloc(1, sizeof(*ld));
    struct kcfg *c = calloc(1, sizeof(*c));
    config_t lc;
    bool lc_live = false;
    if (ld) ld->orig = calloc(N_OPTIONS, sizeof(*ld->orig));
    if (!ld || !ld->orig || !c) {
        snprintf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    ld->c = c;
    ld->path = path ? path : "(null)";
    ld->err = errstr;
    ld->err_size = errstr_size;
    if (errstr_size) errstr[0] = '\0';

    if (set_defaults(ld) < 0) goto fail;
    if (!path) {
        cfg_fail_plain(ld, "no config file given");
        goto fail;
    }
    /* libconfig reports a missing file, or a directory, as a bare "file
     * I/O error"; looking first gives the reason. */
    FILE *f = fopen(path, "r");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0 || S_ISDIR(st.st_mode)) {
        cfg_fail_plain(ld, "%s: %s", path, !f ? strerror(errno) : "is a directory");
        if (f) fclose(f);
        goto fail;
    }
    fclose(f);

    config_init(&lc);
    lc_live = true;
    /* @include "x.cfg" is found next to the main file. */
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (slash && (size_t)(slash - path) < sizeof(dir)) {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
        config_set_include_dir(&lc, slash == path ? "/" : dir);
    }
    if (!config_read_file(&lc, path)) {
        char file[4200];
        cfg_display_path(ld, config_error_file(&lc), file, sizeof(file));
        if (config_error_type(&lc) == CONFIG_ERR_FILE_IO)
            cfg_fail_plain(ld, "%s: %s", file, config_error_text(&lc));
        else
            cfg_fail_plain(ld, "%s:%d: %s", file, config_error_line(&lc), config_error_text(&lc));
        goto fail;
    }
    if (walk_group(ld, config_root_setting(&lc), NULL) < 0) goto fail;
    for (size_t i = 0; i < n_sets; i++)
        if (apply_set(ld, sets[i]) < 0) goto fail;
    if (validate(ld) < 0) goto fail;

    config_destroy(&lc);
    free(ld->orig);
    free(ld);
    return c;

fail:
    if (lc_live) config_destroy(&lc);
    if (ld) free(ld->orig);
    free(ld);
    cfg_destroy(c);
    return NULL;
}

/* Table-driven like the rest: every string row is freed by its offset, so
 * a new string setting needs no code here. */
void cfg_destroy(struct kcfg *c)
{
    if (!c) return;
    cfgtab_free(options, N_OPTIONS, c);
    for (size_t i = 0; i < c->kafka.n_topics; i++) free(c->kafka.topics[i]);
    free(c->kafka.topics);
    for (size_t i = 0; i < c->kafka.n_properties; i++) {
        free(c->kafka.properties[i].key);
        free(c->kafka.properties[i].value);
    }
    free(c->kafka.properties);
    for (size_t i = 0; i < c->batching.n_topic_priorities; i++)
        free(c->batching.topic_priorities[i].topic);
    free(c->batching.topic_priorities);
    for (size_t i = 0; i < c->n_models; i++) free(c->models[i].layers);
    free(c->models);
    free(c);
}

/* Linear: a handful of input topics at most. */
int cfg_topic_priority(const struct kcfg *c, const char *topic)
{
    for (size_t i = 0; i < c->batching.n_topic_priorities; i++)
        if (strcmp(c->batching.topic_priorities[i].topic, topic) == 0)
            return c->batching.topic_priorities[i].priority;
    return c->batching.default_priority;
}

/* One place turns the settings into the runtime's, so the worker, the
 * benchmarks and the tools run models the same way. */
void cfg_model_runtime(const struct kcfg *c, struct model_runtime_conf *rc)
{
    model_runtime_conf_defaults(rc);
    rc->backend = c->worker.backend;
    rc->cpu_threads = c->worker.blas_threads;
    /* validated: "auto" or a precision; "auto" is resolved from the models'
     * weights when the runtime opens (model_runtime_new) */
    rc->precision_auto = strcmp(c->gpu.precision, "auto") == 0;
    if (!rc->precision_auto) model_precision_parse(c->gpu.precision, &rc->precision);
    rc->specs = c->models;
    rc->n_specs = c->n_models;
    model_precision_parse(c->worker.cpu_precision, &rc->cpu_precision);
    rc->graphs = c->gpu.graphs;
    rc->n_devices = c->gpu.n_devices;
    for (size_t i = 0; i < c->gpu.n_devices && i < MODEL_MAX_DEVICES; i++)
        rc->devices[i] = c->gpu.devices[i];
    rc->executors_per_device = c->gpu.executors_per_device;
    rc->workspace_mb = c->gpu.workspace_mb;
}

/* Linear: a worker serves a handful of models, and this runs per job only
 * when a job names its model. */
int cfg_model_index(const struct kcfg *c, const char *name)
{
    for (size_t i = 0; i < c->n_models; i++)
        if (strcmp(c->models[i].name, name) == 0) return (int)i;
    return -1;
}

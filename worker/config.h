/* config.h - the worker's settings, read once from a libconfig file (plus
 * --set overrides), validated, and passed down as plain data. Nothing
 * else in kinfer reads the file or the environment.
 *
 * Threads: main thread at startup only. */
#ifndef KINFER_CONFIG_H
#define KINFER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "../gpu/model.h"

struct cfg_kv {
    char *key;
    char *value;
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
    } redis;
    struct {
        int max_batch_rows;     /* 32 */
        int max_wait_ms;        /* 5 */
        int max_job_rows;       /* 1024 */
        int max_queued_rows;    /* 4096: poll thread pauses fetching above */
    } batching;
    struct model_spec *models;  /* at least one */
    size_t n_models;
    char *default_model;        /* name of one of models; default: the first */
    struct {
        char *listen;           /* "127.0.0.1:9464" */
    } metrics;
    struct {
        int drain_timeout_ms;   /* 15000: SIGTERM drain budget */
        int max_payload_bytes;  /* 1048576: larger records are rejected unread */
        int blas_threads;       /* 0 = OpenBLAS default */
    } worker;
    struct {
        char *level;            /* "info" */
        char *format;           /* "text" | "json" */
    } log;
};

/* Reads path, applies each "section.key=value" override in sets (n_sets of
 * them) and validates everything. Returns a new config, or NULL with errstr
 * filled as "FILE:LINE: message" (or "--set X: message"). */
struct kcfg *cfg_load(const char *path, const char *const *sets, size_t n_sets,
                      char *errstr, size_t errstr_size);
void cfg_destroy(struct kcfg *c);

/* Index of the model named name in c->models, or -1. */
int cfg_model_index(const struct kcfg *c, const char *name);

#endif

/* bench_shared.h - private to tools/bench*.c: what the load tools
 * (bench_load.c), the network floors (bench_floors.c) and the model
 * measurements (bench_model.c) share, from bench.c: small helpers, job
 * bodies and ids, the Kafka and Redis clients made like the worker's.
 *
 * Threads: main thread (bench_model.c's helpers run where it says).
 * Ownership: as each function says; clients and buffers are made and freed
 * by the subcommand that uses them. */
#ifndef KINFER_BENCH_SHARED_H
#define KINFER_BENCH_SHARED_H

#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/config.h"
#include "../gpu/model.h"
#include "bench.h"

#define BENCH_POOL_ROWS 64    /* distinct random input rows jobs are cut from */
#define BENCH_FLOOR_POOL 1024 /* distinct bodies the floors cycle through */

/* What produce and the floors encode: random input rows, cut from a pool
 * so encoding a job costs one copy, not a random draw per float. */
struct bench_jobgen {
    const char *run;
    size_t width, rows;
    float *pool;         /* (BENCH_POOL_ROWS + rows) x width */
    struct textgen *text; /* an encoder's: text jobs instead (borrowed) */
};

/* Delivery outcomes, counted by the report callback. */
struct bench_dr_count {
    uint64_t ok, failed;
    rd_kafka_resp_err_t first_err;
};

/* Monotonic seconds, for durations measured inside one process (record
 * timestamps and result arrivals, compared across processes, are on the
 * wall clock: clock_wall_us). */
double bench_mono_s(void);

/* Sleeps until the wall clock reads us: the open-loop schedule is kept on
 * the same clock the record timestamps are written in. */
void bench_sleep_until_wall_us(int64_t us);

/* qsort order for doubles, for percentiles. */
int bench_cmp_double(const void *a, const void *b);

/* Nearest-rank percentile of n sorted values (q in 0..1): the smallest
 * value with at least q of the samples at or below it, so p99 of 100
 * samples is the 99th, not an interpolation nobody observed. */
double bench_quantile(const double *sorted, size_t n, double q);

/* Prints v with a fixed precision, or "-" when it is not a number, so the
 * script reading the line always finds a token after key=. */
void bench_put_num(const char *key, double v, int prec);

/* Parses a comma-separated list of positive sizes ("1,32,128") into out
 * (at most cap); returns how many, or -1 on a bad token. */
int bench_parse_size_list(const char *s, size_t *out, int cap);

/* Fills the pool from a seeded generator (uniform in [-1, 1)). Returns 0,
 * or -1 when out of memory. Borrows run. */
int bench_jobgen_init(struct bench_jobgen *g, const char *run, size_t width, size_t rows);

/* Frees the pool (the generator can be initialised again). */
void bench_jobgen_fini(struct bench_jobgen *g);

/* Encodes job seq (MessagePack, input as bin) with the id
 * "<run>.<seq>.<send_us>" written into id. *body is new (malloc'd: it may
 * be handed to librdkafka with RD_KAFKA_MSG_F_FREE). Returns 0 or -1. */
int bench_jobgen_encode(const struct bench_jobgen *g, size_t seq, int64_t send_us, char *id,
                         size_t id_cap, unsigned char **body, size_t *len);

/* Reads back an id jobgen made. Returns 0 and fills *seq and *send_us when
 * id (len bytes, not NUL-terminated) belongs to run, else -1. */
int bench_parse_id(const char *id, size_t len, const char *run, size_t *seq, int64_t *send_us);

/* Counts one delivery report; runs inside rd_kafka_poll/flush. */
void bench_count_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque);

/* A producer with the worker's own producer settings (kq_conf_new:
 * idempotent, acks=all, linger.ms=5, plus the config's properties), so the
 * floors and the load see the client the worker uses. Borrows dc, which
 * must outlive the producer. Returns NULL after printing why. */
rd_kafka_t *bench_producer(const struct kcfg *c, struct bench_dr_count *dc);

/* A consumer with the worker's consumer settings. With group NULL it joins
 * kafka.group like the worker (passthrough); otherwise it uses group, a
 * throwaway name, and never commits: readers that assign partitions
 * themselves must not move any real group's offsets. Returns NULL after
 * printing why. */
rd_kafka_t *bench_consumer(const struct kcfg *c, const char *group);

/* Assigns every partition of topic to rk without a group join (seconds
 * saved per measurement), from the beginning or, with at_end, from each
 * partition's current end (so a collector sees only what comes after it
 * said ready). Returns 0, or -1 after printing why. */
int bench_assign_topic(rd_kafka_t *rk, const char *topic, int at_end);

/* Produces one record, serving delivery reports while librdkafka's queue is
 * full (the producer is never the one to drop work). flags as for
 * rd_kafka_producev; with RD_KAFKA_MSG_F_FREE, val belongs to librdkafka
 * once this returns 0. ts_ms 0 lets librdkafka stamp the record. */
int bench_produce_one(rd_kafka_t *rk, const char *topic, const void *key, size_t key_len,
                       void *val, size_t len, int64_t ts_ms, int flags);

/* Connects to the worker's Redis (redis.* settings: AUTH and SELECT when
 * configured, the command timeout applied). Returns a new context or NULL
 * after printing why; a context that saw an error is thrown away, never
 * reused (hiredis 0.14). */
redisContext *bench_redis(const struct kcfg *c);

/* Reads n pipelined replies; returns 0 when none was an error. */
int bench_read_replies(redisContext *rc, size_t n);

/* Appends SET <prefix><key> <body> PX <ttl_ms>: the command the worker's
 * sink sends for every result. */
void bench_append_set(redisContext *rc, const struct kcfg *c, const char *ttl,
                       const void *key, size_t key_len, const void *body, size_t len);

/* The default model, on the configured runtime with `threads` OpenBLAS
 * threads, or (cpu set) on the CPU with the defaults: what the load tools
 * read of it (its width, an encoder's tokenizer). Returns it with *rt
 * set, or NULL with the reason printed. */
struct model *bench_load_default_model(const struct kcfg *c, int cpu, int threads,
                                        struct model_runtime **rt);

/* The width jobs are made with: --width, else the default model's input
 * width (read by loading it, as the worker will). Returns 0 on failure. */
size_t bench_job_width(const struct kcfg *c, const struct bench_opts *o);

#endif

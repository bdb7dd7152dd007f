/* bench.h - `kinfer bench`: the load tools and the floors behind `make
 * bench` (bench/run.sh drives them). Each subcommand does one measurement
 * and prints one `name: key=value ...` line on stdout for the script:
 *
 *   produce       open-loop job producer: a fixed offered rate, each
 *                 record's timestamp (and the id) set to its scheduled
 *                 send time, so a slow system cannot slow the load down
 *   collect       waits for a run's results (Redis keyspace events, the
 *                 reply topic, or a key count) and reports latency from
 *                 record timestamp to result, throughput and batching
 *   floor-kafka   raw librdkafka produce, then consume, of the same job
 *                 records, with the worker's client settings
 *   floor-redis   pipelined SET of the same bodies on one connection
 *   passthrough   consume -> produce + pipelined SET, no decode, batch or
 *                 model: the floor kinfer's infrastructure is measured by
 *   gemm          the default model's forward pass alone, rows/s per
 *                 batch size
 *   generate      a decoder folder's prefill and decode alone, tokens/s,
 *                 against the machine's memory-bandwidth bound
 *
 * Every subcommand reads the worker's configuration (-c FILE, --set K=V),
 * so the tools see the same brokers, topics, Redis and model as the
 * worker under test.
 *
 * Threads: main thread. */
#ifndef KINFER_BENCH_H
#define KINFER_BENCH_H

#include <stddef.h>

#include "../config/config.h"

#define BENCH_RUN_MAX 64 /* longest run name */

/* Options of every subcommand; each takes the subset its usage lists. */
struct bench_opts {
    double rate;           /* produce: jobs/s, 0 = as fast as possible */
    size_t jobs;           /* how many jobs / messages */
    size_t rows;           /* rows per job */
    size_t width;          /* floats per row; 0 = the default model's */
    const char *run;       /* run name: the id prefix */
    const char *from;      /* collect: redis | topic | dbsize */
    double timeout_s;
    int no_fetch;          /* collect: don't read result bodies afterwards */
    const char *batches;   /* gemm: comma-separated batch sizes */
    int threads;           /* gemm: OpenBLAS threads, 0 = its default */
    double seconds;        /* gemm: time per batch size */
    size_t parallel;       /* gemm: forward passes run at once, one per thread */
    size_t pipeline;       /* floor-redis, passthrough: SETs per round trip */
    const char *dump;      /* collect: file for one line per job, or NULL */
    size_t length;         /* encode: every text this many tokens; 0 = the mix;
                              generate: prompt tokens (0 = 128) */
    const char *model;     /* generate: the decoder folder */
    size_t steps;          /* generate: decode steps per run (0 = 64) */
    const char *sampling;  /* generate: "T,K,P" (temperature, top-k, top-p) or NULL: greedy */
};

/* 1 if run can start every id of a run: 1..BENCH_RUN_MAX letters, digits,
 * '_' and '-' (no dot, which separates the id's fields), else 0. */
int bench_run_valid(const char *run);

/* The subcommands, each one measurement: returns the process exit status
 * (0 ok, 1 failure) and prints its one line. Borrow c and o. */
int bench_produce(const struct kcfg *c, const struct bench_opts *o);
int bench_collect(const struct kcfg *c, const struct bench_opts *o);
int bench_floor_kafka(const struct kcfg *c, const struct bench_opts *o);
int bench_floor_redis(const struct kcfg *c, const struct bench_opts *o);
int bench_passthrough(const struct kcfg *c, const struct bench_opts *o);
int bench_gemm(const struct kcfg *c, const struct bench_opts *o);
int bench_encode(const struct kcfg *c, const struct bench_opts *o);
int bench_generate(const struct kcfg *c, const struct bench_opts *o);

#endif

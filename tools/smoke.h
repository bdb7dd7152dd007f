/* smoke.h - `kinfer smoke`: an end-to-end check of a running worker, from
 * the outside, as a client would use it. Produces jobs to the first input
 * topic (float rows, or texts for a text encoder), waits for every result
 * in Redis, checks each output against the model run locally, and prints
 * a summary (jobs, batches, mean batch rows, p50/p99 latency). For a
 * generating model it sends generation jobs and checks them against the
 * contract instead (smoke_gen.h). `make demo` runs it.
 *
 * Threads: main thread. */
#ifndef KINFER_SMOKE_H
#define KINFER_SMOKE_H

#include <signal.h>
#include <stddef.h>

#include "../config/config.h"

struct smoke_opts {
    size_t jobs;      /* how many jobs to send */
    size_t rows;      /* rows per job */
    int json_every;   /* every Nth job is JSON (0: all MessagePack) */
    int timeout_s;    /* how long to wait for all results */
    int rate;         /* jobs per second, 0 = as fast as possible */
    const char *model;/* the model the jobs name; NULL = the default model */
};

/* Returns 0 when every job got a correct result in time, else 1. Borrows
 * c. A model whose folder generates text gets generation jobs instead
 * (smoke_gen.h). */
int smoke_run(const struct kcfg *c, const struct smoke_opts *o,
              volatile sig_atomic_t *stop);

/* Shared with smoke_gen.c. The producer smoke sends with (delivery
 * failures counted in *failed, which must outlive it; the first input
 * topic's leaders already known), or NULL, said on stderr. */
struct rd_kafka_s *smoke_producer(const struct kcfg *c, int *failed);

/* "backend=... device=..." from the worker's /readyz at metrics.listen,
 * or why it cannot tell, into buf. */
void smoke_worker_device(const struct kcfg *c, char *buf, size_t cap);

#endif

/* smoke.h - `kinfer smoke`: an end-to-end check of a running worker, from
 * the outside, as a client would use it. Produces jobs to the first input
 * topic (float rows, or texts for a text encoder), waits for every result
 * in Redis, checks each output against the model run locally, and prints
 * a summary (jobs, batches, mean batch rows, p50/p99 latency). `make demo`
 * runs it.
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

/* Returns 0 when every job got a correct result in time, else 1. Borrows c. */
int smoke_run(const struct kcfg *c, const struct smoke_opts *o,
              volatile sig_atomic_t *stop);

#endif

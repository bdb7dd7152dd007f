/* worker.h - the kinfer worker: Kafka -> batcher -> model -> reply topic +
 * Redis, at least once.
 *
 * Threads: worker_run runs the poll loop on the calling thread and starts
 * one executor thread and one sink thread of its own. */
#ifndef KINFER_WORKER_H
#define KINFER_WORKER_H

#include <signal.h>

#include "config.h"

/* Exit statuses of worker_run, for main to return. */
enum worker_exit {
    WORKER_EXIT_OK = 0,       /* drained and committed after a stop request */
    WORKER_EXIT_STARTUP = 1,  /* could not start: bad model, bad Kafka config */
    WORKER_EXIT_FATAL = 2,    /* a fatal runtime error: restart me */
};

/* Runs the worker on c until *stop becomes nonzero (set by a signal
 * handler), then drains: stops fetching, finishes in-flight jobs within
 * worker.drain_timeout_ms, flushes, commits and closes. Borrows c. */
enum worker_exit worker_run(const struct kcfg *c, volatile sig_atomic_t *stop);

#endif

/* flow.h - when the poll thread pauses fetching and when it resumes: the
 * high and low marks of backpressure, as one pure decision so it can be
 * tested on its own.
 *
 * Threads: the poll thread. */
#ifndef KINFER_FLOW_H
#define KINFER_FLOW_H

#include <stddef.h>

struct flow_marks {
    size_t queued_high; /* rows waiting in the batcher (max_queued_rows) */
    size_t taken_high;  /* rows taken in and not yet finished: queued +
                           running + being written (queued_high plus a full
                           batch per in-flight slot) */
};

/* Returns 1 if fetching should be paused, 0 if it should run. Pauses when
 * either count reaches its high mark; once paused, resumes only when both
 * are at or below half of their marks, so it does not flap around one
 * mark. */
int flow_should_pause(const struct flow_marks *m, int paused, size_t queued_rows,
                      size_t taken_rows);

#endif

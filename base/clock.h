/* clock.h - kinfer's two clocks. The wall clock (CLOCK_REALTIME) is for
 * what is compared across processes and machines: record timestamps,
 * deadlines a client set, heartbeats' updated_at_ms, log lines. The
 * monotonic clock (CLOCK_MONOTONIC) is for everything measured inside
 * one process: waits, timeouts, rates, "silent for". Nothing else in
 * kinfer reads a clock for those.
 *
 * Threads: any; no state. */
#ifndef KINFER_CLOCK_H
#define KINFER_CLOCK_H

#include <stdint.h>

/* The wall clock: Unix time in milliseconds / microseconds. */
int64_t clock_wall_ms(void);
int64_t clock_wall_us(void);

/* The monotonic clock, in microseconds / milliseconds since an
 * unspecified start (the same start for both). */
int64_t clock_mono_us(void);
int64_t clock_mono_ms(void);

#endif

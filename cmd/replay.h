/* replay.h - `kinfer replay`: recomputes a bounded range of history (by
 * time or by offset) through the real worker pipeline, next to live
 * traffic, with its own checkpoint so an interrupted run resumes. See
 * docs/replay.md.
 *
 * Threads: main thread. */
#ifndef KINFER_REPLAY_H
#define KINFER_REPLAY_H

#include <stddef.h>
#include <stdint.h>

/* Exit statuses of replay_main. */
enum replay_exit {
    REPLAY_EXIT_DONE = 0,        /* every range ran to its end */
    REPLAY_EXIT_STARTUP = 1,     /* bad arguments, config, bounds or checkpoint */
    REPLAY_EXIT_FATAL = 2,       /* the worker hit a fatal runtime error */
    REPLAY_EXIT_INTERRUPTED = 3, /* stopped by a signal; --resume continues */
};

/* The `kinfer replay` command: argv[0] is "replay", the options follow.
 * Returns an enum replay_exit for main to exit with. Borrows argv. */
int replay_main(int argc, char **argv);

/* Parses a time bound that is a point in time: an RFC 3339 date-time
 * ("2024-05-01T10:00:00Z", "2024-05-01T12:00:00.250+02:00"; 't', 'z' and a
 * space instead of 'T' are accepted too) or Unix milliseconds ("1714557600000").
 * Sub-millisecond fractions round up, so a record stamped at the instant's
 * millisecond or later is at or after it. Returns 0 with *out_ms set, or -1
 * with why filled. Borrows s. */
int replay_parse_time(const char *s, int64_t *out_ms, char *why, size_t why_size);

#endif

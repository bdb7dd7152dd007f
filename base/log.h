/* log.h - one line per event, key=value fields, level checked before the
 * arguments are evaluated. Thread-safe: each line is written with a single
 * fprintf to stderr. */
#ifndef KINFER_LOG_H
#define KINFER_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };
enum log_format { LOG_TEXT = 0, LOG_JSON = 1 };

/* The process-wide threshold and format. Written once at startup by main
 * (before any thread starts), read by every thread afterwards. */
extern enum log_level log_threshold;
extern enum log_format log_fmt;

/* Parses "error", "warn", "info", "debug"; returns 0 or -1 if unknown. */
int log_level_parse(const char *s, enum log_level *out);

/* Writes one event: `event` is a short snake_case name, fmt gives the
 * key=value fields that follow it (may be NULL). */
void log_emit(enum log_level lvl, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes, for each event whose warnings or errors the rate limit dropped
 * and whose next line has not said so yet, `event=NAME suppressed=N`:
 * all of them (all != 0; at exit, this runs by itself), or only those
 * whose window has reopened (a tick; any line does this at most once a
 * second). */
void log_flush_suppressed(int all);

#define LOG(lvl, event, ...)                                             \
    do {                                                                 \
        if ((lvl) <= log_threshold) log_emit((lvl), (event), __VA_ARGS__); \
    } while (0)
#define LOG_E(event, ...) LOG(LOG_ERROR, event, __VA_ARGS__)
#define LOG_W(event, ...) LOG(LOG_WARN, event, __VA_ARGS__)
#define LOG_I(event, ...) LOG(LOG_INFO, event, __VA_ARGS__)
#define LOG_D(event, ...) LOG(LOG_DEBUG, event, __VA_ARGS__)

#endif

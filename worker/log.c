/* log.c - the single logger. Any thread may call log_emit; a line is built
 * in a stack buffer and written with one fputs so lines never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum log_level log_threshold = LOG_INFO;
enum log_format log_fmt = LOG_TEXT;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int log_level_parse(const char *s, enum log_level *out)
{
    for (int i = 0; i <= LOG_DEBUG; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -1;
}

/* Appends fields to a JSON line: "k=v k2=v2" becomes ,"k":"v","k2":"v2".
 * Values may be quoted with "..." in text form; quotes are kept as the
 * value's delimiters, never copied into it. */
static size_t fields_to_json(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    const char *p = src;
#define PUT(c) do { if (n + 1 < cap) dst[n++] = (c); } while (0)
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        PUT(','); PUT('"');
        while (*p && *p != '=' && *p != ' ') { if (*p == '"' || *p == '\\') PUT('\\'); PUT(*p); p++; }
        PUT('"'); PUT(':'); PUT('"');
        if (*p == '=') {
            p++;
            if (*p == '"') {
                p++;
                while (*p && *p != '"') {
                    if (*p == '\\' && p[1]) { PUT('\\'); PUT(p[1]); p += 2; continue; }
                    PUT(*p); p++;
                }
                if (*p == '"') p++;
            } else {
                while (*p && *p != ' ') { if (*p == '\\') PUT('\\'); PUT(*p); p++; }
            }
        }
        PUT('"');
    }
#undef PUT
    dst[n] = '\0';
    return n;
}

void log_emit(enum log_level lvl, const char *event, const char *fmt, ...)
{
    char fields[2048] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(fields, sizeof(fields), fmt, ap);
        va_end(ap);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[96];
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    char line[4096];
    if (log_fmt == LOG_JSON) {
        char json[3072];
        fields_to_json(json, sizeof(json), fields);
        snprintf(line, sizeof(line),
                 "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":\"%s\"%s}\n", when,
                 level_names[lvl], event, json);
    } else {
        snprintf(line, sizeof(line), "ts=%s level=%s event=%s%s%s\n", when,
                 level_names[lvl], event, fields[0] ? " " : "", fields);
    }
    fputs(line, stderr);
}

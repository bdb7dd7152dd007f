/* log.c - the single logger. Any thread may call log_emit; a line is built
 * in a stack buffer and written with one fputs so lines never interleave.
 *
 * Values are escaped, never trusted: many quote what a record brought in
 * (a parser's error text, a model name), and one that could close its
 * quotes, start a new field or carry raw control bytes would let a record
 * forge log lines (`event=pwn`, a second "event" in a JSON line, terminal
 * escapes). So the format string is walked here rather than handed to
 * vsnprintf whole: every %s argument is written as a well-formed value of
 * the text format (quoted and escaped whenever it needs to be, always when
 * the format quotes it), with ill-formed UTF-8 replaced (base/utf8.h).
 * The escapes are JSON's, so the JSON format reuses them as they are.
 *
 * Warnings and errors are rate-limited per event name: a burst of
 * LIMIT_BURST lines, then LIMIT_PER_S a second; the next line of an event
 * after a suppression says how many of its lines were dropped
 * (`suppressed=N`). When no such line comes (the burst is over), the count
 * still gets out on a line of its own (`event=NAME suppressed=N`, the
 * event's level): once its window has reopened, at the next line of any
 * event or log_flush_suppressed tick, and at exit. A persistent fault (a produce error repeated for every
 * job, every retry) then costs a few lines a second, not a full disk.
 * The limiter's table is the logger's own state, like the threshold:
 * process-wide because stderr is. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "clock.h"
#include "utf8.h"

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

/* ---- building a line ------------------------------------------------------ */

#define FIELDS_MAX 4096
#define VALUE_RESERVE 128 /* kept free after a value for the rest of the format */

struct lbuf {
    char *p;
    size_t len, cap; /* len < cap always: p is NUL-terminated */
};

static void put(struct lbuf *b, const char *s, size_t n)
{
    if (n > b->cap - 1 - b->len) n = b->cap - 1 - b->len;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* A byte a bare (unquoted) value may hold: printable ASCII that does not
 * end the value or start a quote or escape. Bytes above 0x7f are judged
 * as UTF-8 by the caller. */
static int bare_ok(unsigned char c)
{
    return c > 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '=';
}

/* Writes the n bytes of s as a value: bare when every byte may stand
 * unquoted (and quoted says the format did not quote it already), else
 * escaped, with quotes added unless the format has them. At most `room`
 * bytes are written, never cutting an escape or a character. */
static void put_value(struct lbuf *b, const char *s, size_t n, int quoted)
{
    size_t room = b->cap - 1 - b->len;
    room = room > VALUE_RESERVE ? room - VALUE_RESERVE : 0;
    const unsigned char *u = (const unsigned char *)s;
    int bare = !quoted && n > 0;
    for (size_t i = 0; i < n && bare;) {
        if (u[i] >= 0x80) {
            size_t len = utf8_char_len(u + i, n - i, NULL);
            if (!len) bare = 0;
            i += len ? len : 1;
        } else {
            bare = bare_ok(u[i]);
            i++;
        }
    }
    if (bare) {
        put(b, s, n < room ? n : room);
        return;
    }
    size_t start = b->len;
    if (!quoted) put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        char esc[8];
        const char *out = esc;
        size_t len = 1, adv = 1;
        unsigned char c = u[i];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, len = 2;
        } else if (c == '\n') {
            memcpy(esc, "\\n", 2), len = 2;
        } else if (c == '\t') {
            memcpy(esc, "\\t", 2), len = 2;
        } else if (c == '\r') {
            memcpy(esc, "\\r", 2), len = 2;
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", c), len = 6;
        } else if (c >= 0x80) {
            size_t skip = 1;
            len = utf8_char_len(u + i, n - i, &skip);
            if (len) {
                out = s + i;
                adv = len;
            } else {
                out = "\xef\xbf\xbd"; /* U+FFFD */
                len = 3;
                adv = skip;
            }
        } else {
            out = s + i;
        }
        if (b->len - start + len > room) break;
        put(b, out, len);
        i += adv;
    }
    if (!quoted) put(b, "\"", 1);
}

/* The printf subset kinfer's log calls use (flags, width, precision, the
 * length modifiers and d i u o x X c s p f F e E g G a A %), with every %s
 * written by put_value: quoted when the format wrote `key="%s"`, bare or
 * quoted as needed after `key=%s`. Numbers are formatted by snprintf one
 * conversion at a time. */
static void format_fields(struct lbuf *b, const char *fmt, va_list ap)
{
    const char *f = fmt;
    while (*f) {
        if (*f != '%') {
            const char *next = strchr(f, '%');
            size_t n = next ? (size_t)(next - f) : strlen(f);
            put(b, f, n);
            f += n;
            continue;
        }
        const char *spec = f++;
        if (*f == '%') {
            put(b, "%", 1);
            f++;
            continue;
        }
        char conv[32] = "%";
        size_t cl = 1;
        while (*f && strchr("-+ #0", *f) && cl < 8) conv[cl++] = *f++;
        int width = -1, prec = -1;
        if (*f == '*') {
            width = va_arg(ap, int);
            f++;
        } else {
            for (width = 0; *f >= '0' && *f <= '9'; f++) width = width * 10 + (*f - '0');
            if (f == spec + cl) width = -1;
        }
        if (*f == '.') {
            f++;
            if (*f == '*') {
                prec = va_arg(ap, int);
                f++;
            } else {
                for (prec = 0; *f >= '0' && *f <= '9'; f++) prec = prec * 10 + (*f - '0');
            }
        }
        char lenmod[3] = "";
        if ((f[0] == 'h' && f[1] == 'h') || (f[0] == 'l' && f[1] == 'l')) {
            lenmod[0] = f[0], lenmod[1] = f[1];
            f += 2;
        } else if (*f && strchr("hlzjtL", *f)) {
            lenmod[0] = *f++;
        }
        char c = *f ? *f++ : 's';
        if (width >= 0) cl += (size_t)snprintf(conv + cl, sizeof(conv) - cl, "%d", width);
        if (prec >= 0) cl += (size_t)snprintf(conv + cl, sizeof(conv) - cl, ".%d", prec);
        cl += (size_t)snprintf(conv + cl, sizeof(conv) - cl, "%s%c", lenmod, c);
        char num[128];
        int n = 0;
        /* conv is built here from a vetted set of characters, one
         * conversion whose argument is fetched with its own type below. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        switch (c) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s) s = "(null)";
            size_t len = prec >= 0 ? strnlen(s, (size_t)prec) : strlen(s);
            int quoted = spec >= fmt + 2 && spec[-1] == '"' && spec[-2] == '=';
            put_value(b, s, len, quoted);
            continue;
        }
        case 'd':
        case 'i':
            if (!strcmp(lenmod, "l")) n = snprintf(num, sizeof(num), conv, va_arg(ap, long));
            else if (!strcmp(lenmod, "ll")) n = snprintf(num, sizeof(num), conv, va_arg(ap, long long));
            else if (!strcmp(lenmod, "z")) n = snprintf(num, sizeof(num), conv, va_arg(ap, ssize_t));
            else if (!strcmp(lenmod, "j")) n = snprintf(num, sizeof(num), conv, va_arg(ap, intmax_t));
            else if (!strcmp(lenmod, "t")) n = snprintf(num, sizeof(num), conv, va_arg(ap, ptrdiff_t));
            else n = snprintf(num, sizeof(num), conv, va_arg(ap, int));
            break;
        case 'u':
        case 'o':
        case 'x':
        case 'X':
            if (!strcmp(lenmod, "l")) n = snprintf(num, sizeof(num), conv, va_arg(ap, unsigned long));
            else if (!strcmp(lenmod, "ll"))
                n = snprintf(num, sizeof(num), conv, va_arg(ap, unsigned long long));
            else if (!strcmp(lenmod, "z")) n = snprintf(num, sizeof(num), conv, va_arg(ap, size_t));
            else if (!strcmp(lenmod, "j")) n = snprintf(num, sizeof(num), conv, va_arg(ap, uintmax_t));
            else if (!strcmp(lenmod, "t")) n = snprintf(num, sizeof(num), conv, va_arg(ap, ptrdiff_t));
            else n = snprintf(num, sizeof(num), conv, va_arg(ap, unsigned));
            break;
        case 'c': {
            char ch = (char)va_arg(ap, int);
            put_value(b, &ch, 1, spec >= fmt + 2 && spec[-1] == '"' && spec[-2] == '=');
            continue;
        }
        case 'p': n = snprintf(num, sizeof(num), conv, va_arg(ap, void *)); break;
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case 'a': case 'A':
            if (!strcmp(lenmod, "L")) n = snprintf(num, sizeof(num), conv, va_arg(ap, long double));
            else n = snprintf(num, sizeof(num), conv, va_arg(ap, double));
            break;
        default:
            /* Not a conversion kinfer uses: shown, not interpreted. */
            n = snprintf(num, sizeof(num), "%%%c", c);
            break;
        }
#pragma GCC diagnostic pop
        if (n > 0) put(b, num, (size_t)n < sizeof(num) ? (size_t)n : sizeof(num) - 1);
    }
}

/* Appends fields to a JSON line: "k=v k2=v2" becomes ,"k":"v","k2":"v2".
 * format_fields wrote every value bare (no space, quote or backslash) or
 * quoted with JSON's escapes, so a quoted value is copied as it is. */
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
                while (*p && *p != ' ') { if (*p == '\\' || *p == '"') PUT('\\'); PUT(*p); p++; }
            }
        }
        PUT('"');
    }
#undef PUT
    dst[n] = '\0';
    return n;
}

/* ---- the rate limit ------------------------------------------------------- */

static void write_line(enum log_level lvl, const char *event, const char *fmt_fields,
                       unsigned long dropped);


#define LIMIT_SLOTS 64
#define LIMIT_BURST 10.0
#define LIMIT_PER_S 1.0

struct limit_slot {
    char event[48];
    double tokens;
    int64_t at_us;           /* last refill; 0 = slot unused */
    unsigned long suppressed;
    enum log_level lvl;      /* of its last suppressed line */
};

static struct limit_slot limit_slots[LIMIT_SLOTS];
static pthread_mutex_t limit_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t limit_swept_us;
static pthread_once_t limit_atexit = PTHREAD_ONCE_INIT;

static void flush_at_exit(void)
{
    log_flush_suppressed(1);
}

static void register_atexit(void)
{
    atexit(flush_at_exit);
}

/* Refills s's tokens up to now. */
static void refill(struct limit_slot *s, int64_t now)
{
    s->tokens += (double)(now - s->at_us) / 1e6 * LIMIT_PER_S;
    if (s->tokens > LIMIT_BURST) s->tokens = LIMIT_BURST;
    s->at_us = now > 0 ? now : 1;
}

/* Whether a line of event may be written now; *dropped receives how many
 * of its lines were suppressed since its last written one. A new event
 * takes a free slot or the one idle longest (its count, if any, written
 * first). */
static int limit_allow(enum log_level lvl, const char *event, unsigned long *dropped)
{
    int64_t now = clock_mono_us();
    *dropped = 0;
    pthread_mutex_lock(&limit_mu);
    struct limit_slot *s = NULL, *oldest = &limit_slots[0];
    for (int i = 0; i < LIMIT_SLOTS && !s; i++) {
        struct limit_slot *t = &limit_slots[i];
        if (t->at_us && strncmp(t->event, event, sizeof(t->event) - 1) == 0) s = t;
        else if (t->at_us < oldest->at_us) oldest = t;
    }
    struct limit_slot evicted = {.suppressed = 0};
    if (!s) {
        s = oldest;
        evicted = *s;
        snprintf(s->event, sizeof(s->event), "%s", event);
        s->tokens = LIMIT_BURST;
        s->at_us = now;
        s->suppressed = 0;
    }
    refill(s, now);
    int ok = s->tokens >= 1.0;
    if (ok) {
        s->tokens -= 1.0;
        *dropped = s->suppressed;
        s->suppressed = 0;
    } else {
        s->suppressed++;
        s->lvl = lvl;
    }
    pthread_mutex_unlock(&limit_mu);
    if (!ok) pthread_once(&limit_atexit, register_atexit);
    if (evicted.suppressed) write_line(evicted.lvl, evicted.event, "", evicted.suppressed);
    return ok;
}

/* See log.h. Counts are taken under the lock, written after it. */
void log_flush_suppressed(int all)
{
    struct {
        char event[48];
        enum log_level lvl;
        unsigned long n;
    } out[LIMIT_SLOTS];
    size_t n = 0;
    int64_t now = clock_mono_us();
    pthread_mutex_lock(&limit_mu);
    limit_swept_us = now;
    for (int i = 0; i < LIMIT_SLOTS; i++) {
        struct limit_slot *s = &limit_slots[i];
        if (!s->at_us || !s->suppressed) continue;
        refill(s, now);
        if (!all && s->tokens < 1.0) continue; /* still suppressing */
        if (!all) s->tokens -= 1.0;
        memcpy(out[n].event, s->event, sizeof(out[n].event));
        out[n].lvl = s->lvl;
        out[n].n = s->suppressed;
        s->suppressed = 0;
        n++;
    }
    pthread_mutex_unlock(&limit_mu);
    for (size_t i = 0; i < n; i++) write_line(out[i].lvl, out[i].event, "", out[i].n);
}

/* At most once a second, from any line: counts whose window reopened. */
static void maybe_sweep(void)
{
    int64_t now = clock_mono_us();
    pthread_mutex_lock(&limit_mu);
    int due = now - limit_swept_us >= 1000000;
    pthread_mutex_unlock(&limit_mu);
    if (due) log_flush_suppressed(0);
}

/* ---- the line ------------------------------------------------------------ */

/* Writes one line: fields (already formatted) and, when dropped, the
 * count of lines suppressed before it. */
static void write_line(enum log_level lvl, const char *event, const char *fmt_fields,
                       unsigned long dropped)
{
    char fields[FIELDS_MAX];
    struct lbuf b = {fields, 0, sizeof(fields)};
    fields[0] = '\0';
    put(&b, fmt_fields, strlen(fmt_fields));
    if (dropped) {
        char more[40];
        int n = snprintf(more, sizeof(more), "%ssuppressed=%lu", b.len ? " " : "", dropped);
        put(&b, more, (size_t)n);
    }
    int64_t now_ms = clock_wall_ms();
    time_t now_s = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&now_s, &tm);
    char when[96];
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (long)(now_ms % 1000));
    char line[FIELDS_MAX * 2 + 256];
    if (log_fmt == LOG_JSON) {
        char json[FIELDS_MAX * 2];
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

void log_emit(enum log_level lvl, const char *event, const char *fmt, ...)
{
    maybe_sweep();
    unsigned long dropped = 0;
    if (lvl <= LOG_WARN && !limit_allow(lvl, event, &dropped)) return;
    char fields[FIELDS_MAX] = "";
    struct lbuf b = {fields, 0, sizeof(fields)};
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        format_fields(&b, fmt, ap);
        va_end(ap);
    }
    write_line(lvl, event, fields, dropped);
}

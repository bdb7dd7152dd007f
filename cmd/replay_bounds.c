/* replay_bounds.c - `kinfer replay`'s range bounds as the command line
 * gives them: RFC 3339 times or Unix milliseconds (replay_parse_time),
 * "earliest", "now", or per-partition offsets; their order; the topic
 * list.
 *
 * Threads: main thread; no state. Ownership: a parsed bound owns its
 * offsets (freed by the command); strings are borrowed from argv. */
#include "replay_plan.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../config/config.h"
#include "../kafka/kq.h"
#include "../base/log.h"
#include "../worker/worker.h"
#include "cli.h"

/* ---- parsing bounds ------------------------------------------------------ */

/* Reads exactly n decimal digits at *p into *out and advances; the fixed
 * width keeps "2024-5-1" from passing as RFC 3339. */
static int take_digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)(*p)[i])) return -1;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    *out = v;
    return 0;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar,
 * computed without the C library so the TZ environment never matters. The
 * year is shifted to start in March, which puts the leap day last. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t mp = m > 2 ? m - 3 : m + 9;
    int64_t doy = (153 * mp + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* Days in month m of year y: RFC 3339 dates are checked, not normalized,
 * so 2024-02-30 is an error rather than March 1st. */
static int month_days(int y, int m)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* Written by hand rather than with strptime: strptime has no portable way
 * to read a numeric UTC offset or a fraction, and timegm is not C11. */
int replay_parse_time(const char *s, int64_t *out_ms, char *why, size_t why_size)
{
    const char *p = s;
    if (!*s) {
        snprintf(why, why_size, "empty time");
        return -1;
    }
    /* Unix milliseconds: digits only. */
    size_t nd = strspn(s, "0123456789");
    if (s[nd] == '\0') {
        errno = 0;
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno == ERANGE || nd > 15 || v > 253402300799999ULL) {
            snprintf(why, why_size, "'%s': Unix milliseconds out of range", s);
            return -1;
        }
        *out_ms = (int64_t)v;
        return 0;
    }
    int Y, M, D, h, mi, sec;
    if (take_digits(&p, 4, &Y) < 0 || *p++ != '-' || take_digits(&p, 2, &M) < 0 ||
        *p++ != '-' || take_digits(&p, 2, &D) < 0)
        goto bad;
    if (*p != 'T' && *p != 't' && *p != ' ') goto bad;
    p++;
    if (take_digits(&p, 2, &h) < 0 || *p++ != ':' || take_digits(&p, 2, &mi) < 0 ||
        *p++ != ':' || take_digits(&p, 2, &sec) < 0)
        goto bad;
    if (M < 1 || M > 12 || D < 1 || D > month_days(Y, M) || h > 23 || mi > 59 || sec > 60) {
        snprintf(why, why_size, "'%s': no such date or time of day", s);
        return -1;
    }
    int64_t frac_ms = 0;
    if (*p == '.') {
        p++;
        int digits = 0, round_up = 0;
        while (isdigit((unsigned char)*p)) {
            if (digits < 3) frac_ms = frac_ms * 10 + (*p - '0');
            else if (*p != '0') round_up = 1;
            digits++;
            p++;
        }
        if (!digits) goto bad;
        for (int k = digits; k < 3; k++) frac_ms *= 10;
        frac_ms += round_up;
    }
    int64_t offset_min = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1, oh, om;
        if (take_digits(&p, 2, &oh) < 0 || *p++ != ':' || take_digits(&p, 2, &om) < 0 ||
            oh > 23 || om > 59)
            goto bad;
        offset_min = sign * (oh * 60 + om);
    } else {
        snprintf(why, why_size, "'%s': an RFC 3339 time needs its offset: Z or +HH:MM", s);
        return -1;
    }
    if (*p) goto bad;
    int64_t secs = days_from_civil(Y, M, D) * 86400 + h * 3600 + mi * 60 + sec -
                   offset_min * 60;
    if (secs < 0) {
        snprintf(why, why_size, "'%s' is before 1970", s);
        return -1;
    }
    *out_ms = secs * 1000 + frac_ms;
    return 0;
bad:
    snprintf(why, why_size,
             "'%s' is not a time: expected RFC 3339 (2024-05-01T10:00:00Z), Unix "
             "milliseconds, earliest, now, or offsets P:OFF[,P:OFF...]", s);
    return -1;
}

/* A whole number in lo..hi, the whole string. */
int replay_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno == ERANGE || v < lo || v > hi || isspace((unsigned char)*s))
        return -1;
    *out = v;
    return 0;
}

/* Parses "P:OFF[,P:OFF...]" or "TOPIC:P:OFF[,...]" (topic names cannot
 * hold ':', so the field count tells the forms apart). Fills b's list. */
static int parse_offsets(const char *s, struct bound *b, char *why, size_t why_size)
{
    size_t cap = 1;
    for (const char *q = s; *q; q++) cap += *q == ',';
    b->offs = calloc(cap, sizeof(*b->offs));
    if (!b->offs) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    char *copy = strdup(s), *save = NULL;
    if (!copy) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    int rc = 0;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *f[4] = {0};
        int nf = 0;
        for (char *q = item; nf < 4;) {
            f[nf++] = q;
            q = strchr(q, ':');
            if (!q) break;
            *q++ = '\0';
        }
        struct bound_off *o = &b->offs[b->n_offs];
        const char *ps = nf == 3 ? f[1] : f[0], *os = nf == 3 ? f[2] : f[1];
        long long pv, ov;
        if ((nf != 2 && nf != 3) || (nf == 3 && (!*f[0] || strlen(f[0]) > PROTO_TOPIC_MAX)) ||
            replay_parse_int(ps, 0, INT32_MAX, &pv) < 0 || replay_parse_int(os, 0, INT64_MAX, &ov) < 0) {
            snprintf(why, why_size,
                     "'%s' is not a time or an offset list: expected P:OFF or TOPIC:P:OFF "
                     "items, comma-separated", s);
            rc = -1;
            break;
        }
        if (nf == 3) snprintf(o->topic, sizeof(o->topic), "%s", f[0]);
        o->partition = (int32_t)pv;
        o->offset = ov;
        for (size_t k = 0; k < b->n_offs && rc == 0; k++)
            if (b->offs[k].partition == o->partition && strcmp(b->offs[k].topic, o->topic) == 0) {
                snprintf(why, why_size, "'%s' gives partition %s%s%d twice", s, o->topic,
                         *o->topic ? ":" : "", (int)o->partition);
                rc = -1;
            }
        if (rc) break;
        b->n_offs++;
    }
    free(copy);
    if (rc == 0 && b->n_offs == 0) {
        snprintf(why, why_size, "'%s': empty offset list", s);
        rc = -1;
    }
    return rc;
}

/* One bound: a keyword, a point in time or an offset list. */
int replay_parse_bound(const char *s, struct bound *b, char *why, size_t why_size)
{
    b->text = s;
    if (strcmp(s, "earliest") == 0) {
        b->kind = BOUND_EARLIEST;
        return 0;
    }
    if (strcmp(s, "now") == 0) {
        b->kind = BOUND_NOW;
        return 0;
    }
    /* An RFC 3339 time starts with a four-digit year and a dash; digits
     * alone are milliseconds; anything else with a colon is an offset list. */
    int is_time = strspn(s, "0123456789") == strlen(s) ||
                  (strspn(s, "0123456789") == 4 && s[4] == '-');
    if (is_time) {
        b->kind = BOUND_TIME;
        return replay_parse_time(s, &b->time_ms, why, why_size);
    }
    if (strchr(s, ':')) {
        b->kind = BOUND_OFFSETS;
        return parse_offsets(s, b, why, why_size);
    }
    snprintf(why, why_size,
             "'%s' is not a bound: expected an RFC 3339 time, Unix milliseconds, earliest, "
             "now, or offsets P:OFF[,P:OFF...]", s);
    return -1;
}

/* The bounds as a pair, when that can be told before asking Kafka: a
 * start after the end is a typo, not an empty replay. */
int replay_check_bound_order(const struct bound *from, const struct bound *to, char *why,
                             size_t why_size)
{
    int bad = (from->kind == BOUND_NOW && to->kind != BOUND_NOW) ||
              (to->kind == BOUND_EARLIEST && from->kind != BOUND_EARLIEST) ||
              (from->kind == BOUND_TIME && to->kind == BOUND_TIME &&
               from->time_ms > to->time_ms);
    if (bad) {
        snprintf(why, why_size, "--from %s is after --to %s", from->text, to->text);
        return -1;
    }
    return 0;
}

/* Adds the comma-separated topics in s to a, skipping repeats. */
int replay_add_topics(struct replay_args *a, const char *s, char *why, size_t why_size)
{
    char *copy = strdup(s), *save = NULL;
    if (!copy) return -1;
    int rc = 0;
    for (char *t = strtok_r(copy, ",", &save); t && rc == 0; t = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < a->n_topics && strcmp(a->topics[k], t) != 0) k++;
        if (k < a->n_topics) continue;
        if (strlen(t) > PROTO_TOPIC_MAX || a->n_topics == REPLAY_TOPICS_MAX) {
            snprintf(why, why_size, "--topic %s: too long, or more than %d topics", t,
                     REPLAY_TOPICS_MAX);
            rc = -1;
        } else if (!(a->topics[a->n_topics] = strdup(t))) {
            rc = -1;
        } else {
            a->n_topics++;
        }
    }
    free(copy);
    return rc;
}

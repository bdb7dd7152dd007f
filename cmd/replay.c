/* replay.c - `kinfer replay`: recomputes a bounded range of history through
 * the worker pipeline (batcher, model, reply topic, Redis) next to live
 * traffic.
 *
 *   command line -> bounds (time, Unix ms, earliest, now, offsets)
 *   -> per-partition offset ranges: watermarks, offsets-for-times (and a
 *      scan of record timestamps where the broker has no time index)
 *   -> checkpoint: a consumer group of the replay's own, named after what
 *      is replayed; refused, resumed (--resume) or reset (--restart)
 *   -> worker_run in assign mode over exactly those ranges
 *   -> progress on stderr, summary on stdout.
 *
 * The live consumer group is never joined and never committed to: every
 * librdkafka handle made here and in worker_run carries the replay group.
 *
 * Threads: main thread; the progress callback runs on it too (it is
 * worker_run's poll loop). The signal handlers only set the stop flag,
 * this file's one global. Ownership: replay_main owns the config, the
 * parsed arguments, the plan and every librdkafka handle made here;
 * worker_run borrows the config and the ranges. */
#include "replay.h"

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
#include "../worker/kq.h"
#include "../base/log.h"
#include "../worker/worker.h"
#include "cli.h"

#define REPLAY_TIMEOUT_MS 10000   /* each metadata, watermark, time or commit query */
#define REPLAY_SCAN_STALL_MS 30000 /* a timestamp scan that reads nothing this long fails */
#define REPLAY_PROGRESS_TTY_MS 250
#define REPLAY_PROGRESS_LINE_MS 5000
#define REPLAY_TOPICS_MAX 256

/* The stop flag: set by SIGINT/SIGTERM, read by the scan and worker_run. */

/* One end of the range as given on the command line. */
enum bound_kind { BOUND_EARLIEST, BOUND_NOW, BOUND_TIME, BOUND_OFFSETS };

struct bound_off {
    char topic[PROTO_TOPIC_MAX + 1]; /* "" = this partition of every replayed topic */
    int32_t partition;
    int64_t offset;
};

struct bound {
    const char *text;          /* as given, for messages */
    enum bound_kind kind;
    int64_t time_ms;           /* BOUND_TIME */
    struct bound_off *offs;    /* BOUND_OFFSETS, owned */
    size_t n_offs;
};

struct replay_args {
    const char *cfg_path;
    const char **sets;         /* borrowed from argv, plus replay's own */
    size_t n_sets;
    struct bound from, to;
    char *topics[REPLAY_TOPICS_MAX]; /* owned copies */
    size_t n_topics;
    const char *reply_topic;   /* NULL = replay.reply_topic */
    enum worker_redis_mode redis;
    const char *model;
    double rate;
    int priority;
    int dry_run, resume, restart;
    int progress_ms;           /* 0 = the default for the kind of stderr */
};

/* A partition being resolved into a range. */
struct part {
    char topic[PROTO_TOPIC_MAX + 1];
    int32_t partition;
    int64_t lo, hi;            /* watermarks when the run was planned */
    int64_t start, end;        /* the range; -1 while unresolved */
    int64_t committed;         /* the replay group's checkpoint; -1 = none */
};

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
static int parse_int(const char *s, long long lo, long long hi, long long *out)
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
            parse_int(ps, 0, INT32_MAX, &pv) < 0 || parse_int(os, 0, INT64_MAX, &ov) < 0) {
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
static int parse_bound(const char *s, struct bound *b, char *why, size_t why_size)
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
static int check_bound_order(const struct bound *from, const struct bound *to, char *why,
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
static int add_topics(struct replay_args *a, const char *s, char *why, size_t why_size)
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

/* ---- the replay group ----------------------------------------------------- */

/* FNV-1a, 64 bits: stable across builds and machines, which is all the
 * group name needs (it is not a security boundary). */
static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Hashes a string with a terminator, so "ab"+"c" and "a"+"bc" differ. */
static uint64_t fnv_str(uint64_t h, const char *s)
{
    return fnv(h, s, strlen(s) + 1);
}

/* qsort order for topic names, so the group does not depend on the order
 * --topic gave them in. */
static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* qsort order for offset list entries: by topic, then partition. */
static int cmp_off(const void *x, const void *y)
{
    const struct bound_off *a = x, *b = y;
    int c = strcmp(a->topic, b->topic);
    return c ? c : (a->partition > b->partition) - (a->partition < b->partition);
}

/* A bound in canonical form: the same instant written two ways (RFC 3339
 * or milliseconds, any offset list order) names the same replay. */
static uint64_t hash_bound(uint64_t h, struct bound *b)
{
    char buf[64];
    switch (b->kind) {
    case BOUND_EARLIEST: return fnv_str(h, "earliest");
    case BOUND_NOW: return fnv_str(h, "now");
    case BOUND_TIME:
        snprintf(buf, sizeof(buf), "t%" PRId64, b->time_ms);
        return fnv_str(h, buf);
    case BOUND_OFFSETS:
        qsort(b->offs, b->n_offs, sizeof(*b->offs), cmp_off);
        h = fnv_str(h, "offsets");
        for (size_t i = 0; i < b->n_offs; i++) {
            snprintf(buf, sizeof(buf), "%" PRId32 ":%" PRId64, b->offs[i].partition,
                     b->offs[i].offset);
            h = fnv_str(fnv_str(h, b->offs[i].topic), buf);
        }
        return h;
    }
    return h;
}

/* The replay's own consumer group: derived from the live group, the
 * topics, the bounds as given (canonical), the model and the reply topic,
 * so running the same replay again finds its checkpoint and a different
 * one never does. The bounds are hashed as given rather than resolved:
 * "now" and "earliest" move, and a resume must still find its group. */
static void group_id(const struct kcfg *c, struct replay_args *a, const char *reply_topic,
                     char *out, size_t cap)
{
    char *sorted[REPLAY_TOPICS_MAX];
    memcpy(sorted, a->topics, a->n_topics * sizeof(char *));
    qsort(sorted, a->n_topics, sizeof(char *), cmp_str);
    uint64_t h = fnv_str(0xcbf29ce484222325ULL, "kinfer-replay-v1");
    h = fnv_str(h, c->kafka.group);
    for (size_t i = 0; i < a->n_topics; i++) h = fnv_str(h, sorted[i]);
    h = fnv_str(h, "|");
    h = hash_bound(h, &a->from);
    h = hash_bound(h, &a->to);
    h = fnv_str(h, a->model ? a->model : "");
    h = fnv_str(h, reply_topic);
    snprintf(out, cap, "kinfer-replay-%016" PRIx64, h);
}

/* ---- Kafka: partitions, offsets, timestamps ------------------------------- */

/* A consumer handle for planning: it carries the replay group (never the
 * live one), commits nothing by itself, and reports partition ends so a
 * timestamp scan knows when a partition is exhausted. Returns NULL with
 * why filled. */
static rd_kafka_t *planner_new(const struct kcfg *c, const char *group, char *why,
                               size_t why_size)
{
    rd_kafka_conf_t *conf = kq_conf_new(c, KQ_CONSUMER, why, why_size);
    if (!conf) return NULL;
    if (kq_set(conf, "group.id", group, why, why_size) < 0 ||
        kq_set(conf, "enable.auto.commit", "false", why, why_size) < 0 ||
        kq_set(conf, "enable.partition.eof", "true", why, why_size) < 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, why_size);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk);
    return rk;
}

/* Whether the bound names (topic, partition) in its offset list. */
static const struct bound_off *bound_find(const struct bound *b, const char *topic,
                                          int32_t partition)
{
    const struct bound_off *any = NULL;
    if (b->kind != BOUND_OFFSETS) return NULL;
    for (size_t i = 0; i < b->n_offs; i++) {
        if (b->offs[i].partition != partition) continue;
        if (strcmp(b->offs[i].topic, topic) == 0) return &b->offs[i];
        if (!b->offs[i].topic[0]) any = &b->offs[i];
    }
    return any;
}

/* Lists the partitions to replay, with their watermarks: every partition
 * of every topic, or, when a bound is an offset list, the partitions the
 * lists name. Every entry of a list must match a partition that exists.
 * The topics are looked up in a listing of all topics, which never
 * creates one (a request naming a topic may, on a broker that
 * auto-creates topics). */
static int list_parts(rd_kafka_t *rk, const struct replay_args *a, struct part **out,
                      size_t *n_out, char *why, size_t why_size)
{
    struct part *parts = NULL;
    size_t n = 0, cap = 0;
    int lists = a->from.kind == BOUND_OFFSETS || a->to.kind == BOUND_OFFSETS;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, REPLAY_TIMEOUT_MS);
    if (err) {
        snprintf(why, why_size, "listing topics: %s", rd_kafka_err2str(err));
        return -1;
    }
    for (size_t t = 0; t < a->n_topics; t++) {
        const struct rd_kafka_metadata_topic *mt = NULL;
        for (int i = 0; i < md->topic_cnt && !mt; i++)
            if (strcmp(md->topics[i].topic, a->topics[t]) == 0) mt = &md->topics[i];
        if (!mt || mt->err || mt->partition_cnt == 0) {
            snprintf(why, why_size, "topic %s: %s", a->topics[t],
                     mt && mt->err ? rd_kafka_err2str(mt->err) : "no such topic");
            goto fail;
        }
        for (int i = 0; i < mt->partition_cnt; i++) {
            int32_t p = mt->partitions[i].id;
            if (lists && !bound_find(&a->from, a->topics[t], p) &&
                !bound_find(&a->to, a->topics[t], p))
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                struct part *np = realloc(parts, cap * sizeof(*parts));
                if (!np) {
                    snprintf(why, why_size, "out of memory");
                    goto fail;
                }
                parts = np;
            }
            struct part *x = &parts[n++];
            memset(x, 0, sizeof(*x));
            snprintf(x->topic, sizeof(x->topic), "%s", a->topics[t]);
            x->partition = p;
            x->start = x->end = x->committed = -1;
        }
    }
    rd_kafka_metadata_destroy(md);
    md = NULL;
    /* Every listed partition must exist in a replayed topic. */
    const struct bound *bs[] = {&a->from, &a->to};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < bs[k]->n_offs; i++) {
            const struct bound_off *o = &bs[k]->offs[i];
            int found = 0;
            for (size_t j = 0; j < n && !found; j++)
                found = parts[j].partition == o->partition &&
                        (!o->topic[0] || strcmp(parts[j].topic, o->topic) == 0);
            if (!found) {
                if (o->topic[0])
                    snprintf(why, why_size, "--%s: %s:%d is not a partition of a replayed topic",
                             k ? "to" : "from", o->topic, (int)o->partition);
                else
                    snprintf(why, why_size, "--%s: no replayed topic has partition %d",
                             k ? "to" : "from", (int)o->partition);
                goto fail;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        err = rd_kafka_query_watermark_offsets(
            rk, parts[i].topic, parts[i].partition, &parts[i].lo, &parts[i].hi,
            REPLAY_TIMEOUT_MS);
        if (err) {
            snprintf(why, why_size, "%s:%d: watermarks: %s", parts[i].topic,
                     (int)parts[i].partition, rd_kafka_err2str(err));
            goto fail;
        }
    }
    *out = parts;
    *n_out = n;
    return 0;
fail:
    if (md) rd_kafka_metadata_destroy(md);
    free(parts);
    return -1;
}

/* One partition of a timestamp scan: read offsets from..to-1 and find the
 * first record stamped at or after threshold. */
struct scan_item {
    struct part *part;
    int64_t from, to;
    int64_t threshold;
    int64_t found;   /* -1 until found */
    int done;
};

/* Reads the records of every item until each is found or exhausted. Used
 * where offsets-for-times said "no record at or after T": a real broker
 * means it, and reading the partition's last record confirms that cheaply;
 * a broker without a time index (librdkafka's mock cluster) says it for
 * every T, and then the partition is scanned from its start. */
static int scan(rd_kafka_t *rk, struct scan_item *items, size_t n, char *why, size_t why_size)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++) {
        items[i].found = -1;
        items[i].done = items[i].from >= items[i].to;
        if (!items[i].done)
            rd_kafka_topic_partition_list_add(l, items[i].part->topic,
                                              items[i].part->partition)->offset = items[i].from;
    }
    int rc = 0;
    if (l->cnt && rd_kafka_assign(rk, l) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(why, why_size, "could not assign partitions to read timestamps");
        rc = -1;
    }
    rd_kafka_topic_partition_list_destroy(l);
    int64_t last_progress_ms = clock_mono_ms();
    for (;;) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++) left += !items[i].done;
        if (!left || rc || cli_stop) break;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        int64_t now_ms = clock_mono_ms();
        if (!m) {
            if (now_ms - last_progress_ms > REPLAY_SCAN_STALL_MS) {
                snprintf(why, why_size, "reading record timestamps: nothing for %d s",
                         REPLAY_SCAN_STALL_MS / 1000);
                rc = -1;
            }
            continue;
        }
        last_progress_ms = now_ms;
        if (m->err && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            snprintf(why, why_size, "reading record timestamps: %s", rd_kafka_message_errstr(m));
            rc = -1;
            rd_kafka_message_destroy(m);
            break;
        }
        const char *topic = m->rkt ? rd_kafka_topic_name(m->rkt) : "";
        for (size_t i = 0; i < n; i++) {
            struct scan_item *it = &items[i];
            if (it->done || it->part->partition != m->partition ||
                strcmp(it->part->topic, topic) != 0)
                continue;
            if (m->err) { /* end of partition */
                it->done = 1;
            } else {
                rd_kafka_timestamp_type_t tt;
                int64_t ts_ms = rd_kafka_message_timestamp(m, &tt);
                if (m->offset < it->to && ts_ms >= it->threshold) it->found = m->offset;
                it->done = it->found >= 0 || m->offset >= it->to - 1;
            }
            break;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_assign(rk, NULL);
    if (!rc && cli_stop) {
        snprintf(why, why_size, "interrupted");
        rc = -1;
    }
    return rc;
}

/* The part of a list entry, looked up rather than assumed to sit at the
 * same index as in the list handed to librdkafka. */
static struct part *part_of(struct part *parts, size_t n, const rd_kafka_topic_partition_t *e)
{
    for (size_t i = 0; i < n; i++)
        if (parts[i].partition == e->partition && strcmp(parts[i].topic, e->topic) == 0)
            return &parts[i];
    return NULL;
}

/* Clamps an offset into the partition's watermarks, saying so: a bound
 * beyond the log end would wait for live traffic, one below the log start
 * names records retention has removed. */
static int64_t clamp(const struct part *x, int64_t off, const char *which)
{
    int64_t v = off < x->lo ? x->lo : off > x->hi ? x->hi : off;
    if (v != off)
        LOG_W("replay_bound_clamped", "topic=%s partition=%" PRId32 " bound=%s offset=%" PRId64
              " used=%" PRId64 " low=%" PRId64 " high=%" PRId64, x->topic, x->partition, which,
              off, v, x->lo, x->hi);
    return v;
}

/* Resolves one bound on every partition, into start (is_end = 0) or end. A
 * time is the first offset whose record timestamp is at or after it; none
 * such means the log end. */
static int resolve_bound(rd_kafka_t *rk, const struct bound *b, int is_end, struct part *parts,
                         size_t n, char *why, size_t why_size)
{
    const char *which = is_end ? "to" : "from";
    for (size_t i = 0; i < n; i++) {
        int64_t *dst = is_end ? &parts[i].end : &parts[i].start;
        if (b->kind == BOUND_EARLIEST) *dst = parts[i].lo;
        else if (b->kind == BOUND_NOW) *dst = parts[i].hi;
        else if (b->kind == BOUND_OFFSETS) {
            const struct bound_off *o = bound_find(b, parts[i].topic, parts[i].partition);
            /* A partition only the other list names runs from the start or
             * to the end of its log. */
            *dst = o ? clamp(&parts[i], o->offset, which) : is_end ? parts[i].hi : parts[i].lo;
        }
    }
    if (b->kind != BOUND_TIME || n == 0) return 0;

    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, parts[i].topic, parts[i].partition)->offset =
            b->time_ms;
    rd_kafka_resp_err_t err = rd_kafka_offsets_for_times(rk, l, REPLAY_TIMEOUT_MS);
    if (err) {
        snprintf(why, why_size, "--%s %s: offsets for times: %s", which, b->text,
                 rd_kafka_err2str(err));
        rd_kafka_topic_partition_list_destroy(l);
        return -1;
    }
    struct scan_item *items = calloc(n, sizeof(*items));
    size_t n_items = 0;
    int rc = items ? 0 : -1;
    if (!items) snprintf(why, why_size, "out of memory");
    for (int k = 0; k < l->cnt && rc == 0; k++) {
        struct part *x = part_of(parts, n, &l->elems[k]);
        if (!x) continue;
        int64_t *dst = is_end ? &x->end : &x->start;
        if (l->elems[k].err) {
            snprintf(why, why_size, "--%s %s: %s:%d: %s", which, b->text, x->topic,
                     (int)x->partition, rd_kafka_err2str(l->elems[k].err));
            rc = -1;
        } else if (l->elems[k].offset >= 0) {
            *dst = clamp(x, l->elems[k].offset, which);
        } else {
            /* "No record at or after T": check the last record. */
            *dst = x->hi;
            if (x->lo < x->hi)
                items[n_items++] = (struct scan_item){.part = x, .from = x->hi - 1, .to = x->hi,
                                                      .threshold = b->time_ms};
        }
    }
    rd_kafka_topic_partition_list_destroy(l);
    if (rc == 0 && n_items) rc = scan(rk, items, n_items, why, why_size);
    /* The last record is at or after T after all: no time index. */
    size_t n_full = 0;
    for (size_t i = 0; rc == 0 && i < n_items; i++)
        if (items[i].found >= 0)
            items[n_full++] = (struct scan_item){.part = items[i].part, .from = items[i].part->lo,
                                                 .to = items[i].part->hi,
                                                 .threshold = b->time_ms};
    if (rc == 0 && n_full) {
        LOG_W("replay_time_scan", "bound=%s partitions=%zu note=\"the broker found no offset "
              "for a time its records reach (no time index, e.g. kinfer broker): reading "
              "record timestamps instead\"", which, n_full);
        rc = scan(rk, items, n_full, why, why_size);
        for (size_t i = 0; rc == 0 && i < n_full; i++) {
            int64_t *dst = is_end ? &items[i].part->end : &items[i].part->start;
            *dst = items[i].found >= 0 ? items[i].found : items[i].part->hi;
        }
    }
    if (rc && why[0] == '\0') snprintf(why, why_size, "--%s %s: could not resolve", which,
                                       b->text);
    free(items);
    return rc;
}

/* Reads the replay group's checkpoint into every part's committed. */
static int read_checkpoint(rd_kafka_t *rk, struct part *parts, size_t n, char *why,
                           size_t why_size)
{
    if (!n) return 0;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, parts[i].topic, parts[i].partition);
    rd_kafka_resp_err_t err = rd_kafka_committed(rk, l, REPLAY_TIMEOUT_MS);
    for (size_t i = 0; i < n; i++) parts[i].committed = -1;
    for (int k = 0; !err && k < l->cnt; k++) {
        struct part *x = part_of(parts, n, &l->elems[k]);
        if (x) x->committed = !l->elems[k].err && l->elems[k].offset >= 0 ? l->elems[k].offset : -1;
    }
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        snprintf(why, why_size, "reading the replay's checkpoint: %s", rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

/* --restart: sets the checkpoint back to every range's start, so a later
 * --resume cannot pick up a partition's offset from the earlier run. */
static int reset_checkpoint(rd_kafka_t *rk, const struct part *parts, size_t n, char *why,
                            size_t why_size)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        if (parts[i].committed >= 0)
            rd_kafka_topic_partition_list_add(l, parts[i].topic, parts[i].partition)->offset =
                parts[i].start;
    rd_kafka_resp_err_t err = l->cnt ? rd_kafka_commit(rk, l, 0) : RD_KAFKA_RESP_ERR_NO_ERROR;
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        snprintf(why, why_size, "resetting the replay's checkpoint: %s", rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

/* Plans the replay: partitions, both bounds, sanity of each range and the
 * checkpoint. */
static int plan(rd_kafka_t *rk, struct replay_args *a, struct part **out, size_t *n_out,
                char *why, size_t why_size)
{
    struct part *parts = NULL;
    size_t n = 0;
    if (list_parts(rk, a, &parts, &n, why, why_size) < 0) return -1;
    if (resolve_bound(rk, &a->from, 0, parts, n, why, why_size) < 0 ||
        resolve_bound(rk, &a->to, 1, parts, n, why, why_size) < 0)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        struct part *x = &parts[i];
        if (x->start <= x->end) continue;
        if (a->from.kind == BOUND_OFFSETS && a->to.kind == BOUND_OFFSETS &&
            bound_find(&a->from, x->topic, x->partition) &&
            bound_find(&a->to, x->topic, x->partition)) {
            snprintf(why, why_size,
                     "%s:%d: --from offset %" PRId64 " is after --to offset %" PRId64,
                     x->topic, (int)x->partition, x->start, x->end);
            goto fail;
        }
        /* Timestamps out of order (producer clocks) can put a time's
         * offset before an earlier time's: nothing between them. */
        LOG_W("replay_empty_range", "topic=%s partition=%" PRId32 " start=%" PRId64
              " end=%" PRId64 " note=\"the end bound resolves before the start\"", x->topic,
              x->partition, x->start, x->end);
        x->end = x->start;
    }
    if (read_checkpoint(rk, parts, n, why, why_size) < 0) goto fail;
    *out = parts;
    *n_out = n;
    return 0;
fail:
    free(parts);
    return -1;
}

/* ---- progress ------------------------------------------------------------- */

struct progress {
    const struct replay_args *a;
    int tty;
    int64_t total[REPLAY_TOPICS_MAX], done[REPLAY_TOPICS_MAX];
    /* The last report, for the summary. */
    int64_t jobs;
    uint64_t ok, failed, dead;
    double elapsed_s;
    int reported;
};

/* h:mm:ss or m:ss, for an ETA a person reads at a glance. */
static void fmt_duration(double s, char *buf, size_t cap)
{
    if (s < 0 || s > 1e8) {
        snprintf(buf, cap, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* The terminal's width, so a bar line never wraps (a wrapped line would
 * break the cursor arithmetic of the redraw). */
static int term_width(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
    return 80;
}

/* One bar per topic on a terminal. Each line is cut to the terminal's
 * width (a wrapped line would break the cursor arithmetic), and the cursor
 * goes back to the first bar afterwards, so the next redraw writes over
 * them and a warning printed meanwhile pushes them down instead of being
 * overwritten. The final draw leaves the cursor below the bars. */
static void draw_bars(struct progress *pr, double elapsed, int final)
{
    int width = term_width();
    for (size_t t = 0; t < pr->a->n_topics; t++) {
        int64_t total = pr->total[t], done = pr->done[t];
        double frac = total > 0 ? (double)done / (double)total : 1.0;
        if (frac > 1) frac = 1;
        double rate = elapsed > 0 ? (double)done / elapsed : 0;
        char when[32], tail[160], bar[41], line[512];
        fmt_duration(final ? elapsed : rate > 0 ? (double)(total - done) / rate : -1, when,
                     sizeof(when));
        int tl = snprintf(tail, sizeof(tail), " %" PRId64 "/%" PRId64 " %5.1f%% %.0f jobs/s %s %s",
                          done, total, frac * 100, rate, final ? "in" : "ETA", when);
        if (tl < 0 || tl >= (int)sizeof(tail)) tl = (int)sizeof(tail) - 1;
        int bar_w = width - 1 - 20 - 3 - tl; /* the name, " [" and "]" */
        if (bar_w > 40) bar_w = 40;
        if (bar_w < 10) bar_w = 10;
        int filled = (int)(frac * bar_w);
        for (int k = 0; k < bar_w; k++) bar[k] = k < filled ? '#' : '.';
        bar[bar_w] = '\0';
        snprintf(line, sizeof(line), "%-20.20s [%s]%s", pr->a->topics[t], bar, tail);
        fprintf(stderr, "\r\033[K%.*s\n", width - 1, line);
    }
    if (!final) fprintf(stderr, "\033[%zuA", pr->a->n_topics);
    fflush(stderr);
}

/* worker_run's progress callback (poll thread = main thread): totals per
 * topic, then a bar redraw on a terminal or one log line per topic. */
static void on_progress(void *ctx, const struct worker_progress *p)
{
    struct progress *pr = ctx;
    memset(pr->total, 0, sizeof(pr->total));
    memset(pr->done, 0, sizeof(pr->done));
    int64_t jobs = 0;
    for (size_t i = 0; i < p->n_ranges; i++) {
        size_t t = 0;
        while (t < pr->a->n_topics && strcmp(pr->a->topics[t], p->ranges[i].topic) != 0) t++;
        if (t == pr->a->n_topics) continue;
        int64_t span = p->ranges[i].end - p->ranges[i].start;
        pr->total[t] += span > 0 ? span : 0;
        pr->done[t] += p->done[i];
        jobs += p->done[i];
    }
    pr->jobs = jobs;
    pr->ok = p->ok;
    pr->failed = p->failed;
    pr->dead = p->dead_lettered;
    pr->elapsed_s = p->elapsed_s;
    pr->reported = 1;
    if (pr->tty) {
        draw_bars(pr, p->elapsed_s, p->finished);
        return;
    }
    for (size_t t = 0; t < pr->a->n_topics; t++) {
        double rate = p->elapsed_s > 0 ? (double)pr->done[t] / p->elapsed_s : 0;
        double eta = rate > 0 ? (double)(pr->total[t] - pr->done[t]) / rate : -1;
        /* Emitted whatever log.level says: progress is what was asked for. */
        log_emit(LOG_INFO, p->finished ? "replay_progress_final" : "replay_progress",
                 "topic=%s done=%" PRId64 " total=%" PRId64 " pct=%.1f rate=%.1f eta_s=%.0f"
                 " ok=%" PRIu64 " errors=%" PRIu64 " dead_lettered=%" PRIu64,
                 pr->a->topics[t], pr->done[t], pr->total[t],
                 pr->total[t] ? 100.0 * (double)pr->done[t] / (double)pr->total[t] : 100.0,
                 rate, eta, p->ok, p->failed, p->dead_lettered);
    }
}

/* ---- the command ------------------------------------------------------------ */

static const char usage[] =
    "usage: kinfer replay -c FILE --from T --to T [options]\n"
    "\n"
    "Runs the jobs of a range of history again through the worker pipeline, next\n"
    "to live traffic: partitions are assigned directly (the live consumer group is\n"
    "never joined or committed to), every partition stops exactly at --to, and a\n"
    "summary is printed. Progress is checkpointed under a group of the replay's\n"
    "own, so an interrupted replay continues with --resume.\n"
    "\n"
    "T is one of:\n"
    "  2024-05-01T10:00:00Z       an RFC 3339 time (fraction and +HH:MM allowed)\n"
    "  1714557600000              Unix milliseconds\n"
    "  earliest, now              the log start, the log end (when planned)\n"
    "  P:OFF[,P:OFF...]           offsets of partitions, for every replayed topic\n"
    "  TOPIC:P:OFF[,...]          offsets of one topic's partitions\n"
    "A time resolves, per partition, to the first record stamped at or after it.\n"
    "--from is inclusive, --to exclusive. With an offset list, only the partitions\n"
    "it names are replayed (one named by one list only runs from the log start or\n"
    "to the log end).\n"
    "\n"
    "  -c, --config FILE       configuration file (see worker.cfg)\n"
    "  -s, --set K=V           override one setting, as for kinfer worker\n"
    "  -f, --from T            first record to run\n"
    "  -t, --to T              where to stop (not run)\n"
    "  -T, --topic A[,B]       topics to replay (repeatable; default kafka.topics)\n"
    "  -r, --reply-topic NAME  where results go (default replay.reply_topic)\n"
    "  -R, --redis MODE        if-absent (default: SET NX, never overwrite a result),\n"
    "                          on (SET, overwrite), off (reply topic only)\n"
    "  -m, --model NAME        run every job on this model (one of the config's)\n"
    "      --rate N            at most N jobs per second (default: no cap)\n"
    "      --priority P        priority 0..9 for every job\n"
    "  -n, --dry-run           print what would run, per partition; run nothing\n"
    "      --resume            continue this replay from its checkpoint\n"
    "      --restart           run this replay again from its start\n"
    "      --progress-ms MS    progress line period when stderr is not a terminal\n"
    "                          (default 5000; a terminal gets a bar per topic)\n"
    "\n"
    "exit status: 0 every range done, 1 could not start (bad arguments, config,\n"
    "bounds, or a checkpoint that needs --resume or --restart), 2 fatal runtime\n"
    "error, 3 interrupted by SIGINT/SIGTERM (run again with --resume).\n";

/* Parses argv into a. Returns 0, 1 when --help was answered, -1 on error
 * (message printed). */
static int parse_args(int argc, char **argv, struct replay_args *a)
{
    enum { O_RATE = 256, O_PRIORITY, O_RESUME, O_RESTART, O_PROGRESS };
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},  {"set", required_argument, 0, 's'},
        {"from", required_argument, 0, 'f'},    {"to", required_argument, 0, 't'},
        {"topic", required_argument, 0, 'T'},   {"reply-topic", required_argument, 0, 'r'},
        {"redis", required_argument, 0, 'R'},   {"model", required_argument, 0, 'm'},
        {"rate", required_argument, 0, O_RATE}, {"priority", required_argument, 0, O_PRIORITY},
        {"dry-run", no_argument, 0, 'n'},       {"resume", no_argument, 0, O_RESUME},
        {"restart", no_argument, 0, O_RESTART}, {"progress-ms", required_argument, 0, O_PROGRESS},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    const char *from = NULL, *to = NULL;
    char why[512] = "";
    long long v;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:s:f:t:T:r:R:m:nh", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': a->cfg_path = optarg; break;
        case 's': a->sets[a->n_sets++] = optarg; break;
        case 'f': from = optarg; break;
        case 't': to = optarg; break;
        case 'T':
            if (add_topics(a, optarg, why, sizeof(why)) < 0) goto bad;
            break;
        case 'r': a->reply_topic = optarg; break;
        case 'R':
            if (strcmp(optarg, "on") == 0) a->redis = WORKER_REDIS_SET;
            else if (strcmp(optarg, "off") == 0) a->redis = WORKER_REDIS_OFF;
            else if (strcmp(optarg, "if-absent") == 0) a->redis = WORKER_REDIS_IF_ABSENT;
            else {
                snprintf(why, sizeof(why), "--redis: '%s' is not on, off or if-absent", optarg);
                goto bad;
            }
            break;
        case 'm': a->model = optarg; break;
        case O_RATE: {
            char *end;
            errno = 0;
            a->rate = strtod(optarg, &end);
            if (!*optarg || *end || errno || !(a->rate > 0) || a->rate > 1e9) {
                snprintf(why, sizeof(why), "--rate: '%s' is not a number of jobs per second",
                         optarg);
                goto bad;
            }
            break;
        }
        case O_PRIORITY:
            if (parse_int(optarg, 0, 9, &v) < 0) {
                snprintf(why, sizeof(why), "--priority: '%s' is not in 0..9", optarg);
                goto bad;
            }
            a->priority = (int)v;
            break;
        case 'n': a->dry_run = 1; break;
        case O_RESUME: a->resume = 1; break;
        case O_RESTART: a->restart = 1; break;
        case O_PROGRESS:
            if (parse_int(optarg, 10, 3600000, &v) < 0) {
                snprintf(why, sizeof(why), "--progress-ms: '%s' is not in 10..3600000", optarg);
                goto bad;
            }
            a->progress_ms = (int)v;
            break;
        case 'h': fputs(usage, stdout); return 1;
        default: fputs(usage, stderr); return -1;
        }
    }
    if (optind < argc) {
        snprintf(why, sizeof(why), "unexpected argument '%s'", argv[optind]);
        goto bad;
    }
    if (!a->cfg_path || !from || !to) {
        snprintf(why, sizeof(why), "-c FILE, --from and --to are required (--help shows them)");
        goto bad;
    }
    if (a->resume && a->restart) {
        snprintf(why, sizeof(why), "--resume and --restart exclude each other");
        goto bad;
    }
    if (parse_bound(from, &a->from, why, sizeof(why)) < 0 ||
        parse_bound(to, &a->to, why, sizeof(why)) < 0 ||
        check_bound_order(&a->from, &a->to, why, sizeof(why)) < 0)
        goto bad;
    return 0;
bad:
    fprintf(stderr, "kinfer replay: %s\n", why);
    return -1;
}

/* Whether the settings table has a row of this name: replay turns off the
 * worker's HTTP endpoint and heartbeat (a live worker on the same host owns
 * the port, and a replay is not a member of the live group) only where
 * this build has them. */
static int has_option(const char *name)
{
    size_t n;
    const struct cfg_option *o = cfg_options(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(o[i].name, name) == 0) return 1;
    return 0;
}

/* Loads the config with replay's own defaults first (so the user's --set
 * still wins), then the settings a replay of history needs. */
static struct kcfg *load_config(struct replay_args *a, const char **user_sets, size_t n_user)
{
    static const char *const mine[] = {"metrics.listen=", "metrics.heartbeat_prefix="};
    a->n_sets = 0;
    for (size_t i = 0; i < sizeof(mine) / sizeof(mine[0]); i++) {
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)(strchr(mine[i], '=') - mine[i]), mine[i]);
        if (has_option(name)) a->sets[a->n_sets++] = mine[i];
    }
    for (size_t i = 0; i < n_user; i++) a->sets[a->n_sets++] = user_sets[i];
    struct cli_config cc = {.path = a->cfg_path, .sets = a->sets, .n_sets = a->n_sets,
                            .cap = a->n_sets};
    struct kcfg *c = cli_config_load("replay", &cc);
    if (!c) return NULL;
    /* The records are history: a deadline counted from their timestamps
     * has passed for all of them. */
    c->batching.default_timeout_ms = 0;
    return c;
}

/* Checks what only the loaded config can tell: the topics, the reply
 * topic and the model. */
static int check_against_config(const struct kcfg *c, struct replay_args *a,
                                const char *reply_topic)
{
    if (a->n_topics == 0)
        for (size_t i = 0; i < c->kafka.n_topics; i++)
            if (add_topics(a, c->kafka.topics[i], NULL, 0) < 0) return -1;
    for (size_t i = 0; i < a->n_topics; i++)
        if (strcmp(a->topics[i], reply_topic) == 0) {
            fprintf(stderr, "kinfer replay: the reply topic %s is also a replayed topic\n",
                    reply_topic);
            return -1;
        }
    if (a->model && cfg_model_index(c, a->model) < 0) {
        fprintf(stderr, "kinfer replay: --model %s is not one of the config's models\n",
                a->model);
        return -1;
    }
    return 0;
}

/* Prints the plan, one line per partition, and the totals (stdout). */
static void print_plan(const struct part *parts, size_t n, const struct replay_args *a,
                       const char *group, const char *reply_topic)
{
    int64_t jobs = 0, left = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t span = parts[i].end - parts[i].start;
        int64_t from = parts[i].start;
        if (parts[i].committed > from) from = parts[i].committed < parts[i].end
                                                  ? parts[i].committed : parts[i].end;
        printf("kinfer replay: topic=%s partition=%" PRId32 " from=%" PRId64 " to=%" PRId64
               " jobs=%" PRId64 " checkpoint=%" PRId64 " left=%" PRId64 "\n",
               parts[i].topic, parts[i].partition, parts[i].start, parts[i].end, span,
               parts[i].committed, parts[i].end - from);
        jobs += span;
        left += parts[i].end - from;
    }
    printf("kinfer replay: dry run: jobs=%" PRId64 " left_after_checkpoint=%" PRId64
           " partitions=%zu topics=%zu group=%s reply_topic=%s redis=%s model=%s\n",
           jobs, left, n, a->n_topics, group, reply_topic,
           a->redis == WORKER_REDIS_SET ? "on" : a->redis == WORKER_REDIS_OFF ? "off" : "if-absent",
           a->model ? a->model : "(as asked)");
}

/* Whether every non-empty range's checkpoint has reached its end. */
static int checkpoint_complete(const struct part *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (parts[i].end > parts[i].start && parts[i].committed < parts[i].end) return 0;
    return 1;
}

/* Parse, load, plan, check the checkpoint, run, summarize: each step can
 * refuse before anything is consumed or written, and only the run itself
 * produces results. */
int replay_main(int argc, char **argv)
{
    struct replay_args a;
    memset(&a, 0, sizeof(a));
    a.priority = -1;
    a.redis = WORKER_REDIS_IF_ABSENT;
    int rc = REPLAY_EXIT_STARTUP;
    struct kcfg *c = NULL;
    rd_kafka_t *rk = NULL;
    struct part *parts = NULL;
    struct worker_range *ranges = NULL;
    size_t n_parts = 0;
    const char **user_sets = calloc((size_t)argc + 1, sizeof(char *));
    a.sets = calloc((size_t)argc + 4, sizeof(char *));
    if (!user_sets || !a.sets) goto out;
    int parsed = parse_args(argc, argv, &a);
    if (parsed != 0) {
        rc = parsed > 0 ? REPLAY_EXIT_DONE : REPLAY_EXIT_STARTUP;
        goto out;
    }
    /* parse_args gathered the user's --set in a.sets; replay's own go first. */
    size_t n_user = a.n_sets;
    memcpy(user_sets, a.sets, n_user * sizeof(char *));
    if (!(c = load_config(&a, user_sets, n_user))) goto out;
    const char *reply_topic = a.reply_topic ? a.reply_topic : c->replay.reply_topic;
    if (check_against_config(c, &a, reply_topic) < 0) goto out;
    cli_install_signals();

    char group[64], why[1024] = "";
    group_id(c, &a, reply_topic, group, sizeof(group));
    if (!(rk = planner_new(c, group, why, sizeof(why)))) {
        fprintf(stderr, "kinfer replay: %s\n", why);
        goto out;
    }
    if (plan(rk, &a, &parts, &n_parts, why, sizeof(why)) < 0) {
        fprintf(stderr, "kinfer replay: %s\n", why);
        if (cli_stop) rc = REPLAY_EXIT_INTERRUPTED;
        goto out;
    }
    if (a.dry_run) {
        print_plan(parts, n_parts, &a, group, reply_topic);
        rc = REPLAY_EXIT_DONE;
        goto out;
    }

    /* The checkpoint: a fresh run never silently skips what an earlier run
     * of the same replay did, nor silently redoes it. */
    int64_t total = 0, done_before = 0;
    int has_checkpoint = 0;
    for (size_t i = 0; i < n_parts; i++) {
        int64_t span = parts[i].end - parts[i].start;
        total += span;
        if (parts[i].committed < 0) continue;
        has_checkpoint = 1;
        int64_t cp = parts[i].committed;
        done_before += cp <= parts[i].start ? 0 : cp >= parts[i].end ? span : cp - parts[i].start;
    }
    if (has_checkpoint && !a.resume && !a.restart) {
        if (checkpoint_complete(parts, n_parts))
            fprintf(stderr, "kinfer replay: this replay already ran to its end (group %s); "
                    "--restart runs it again\n", group);
        else
            fprintf(stderr, "kinfer replay: this replay has a checkpoint (group %s, %" PRId64
                    " of %" PRId64 " jobs done): --resume continues it, --restart starts over\n",
                    group, done_before, total);
        goto out;
    }
    if (a.restart && has_checkpoint && reset_checkpoint(rk, parts, n_parts, why, sizeof(why)) < 0) {
        fprintf(stderr, "kinfer replay: %s\n", why);
        goto out;
    }
    ranges = calloc(n_parts ? n_parts : 1, sizeof(*ranges));
    if (!ranges) goto out;
    int64_t to_run = 0;
    for (size_t i = 0; i < n_parts; i++) {
        struct worker_range *r = &ranges[i];
        snprintf(r->topic, sizeof(r->topic), "%s", parts[i].topic);
        r->partition = parts[i].partition;
        r->start = parts[i].start;
        r->end = parts[i].end;
        if (a.resume && parts[i].committed > r->start)
            r->start = parts[i].committed < r->end ? parts[i].committed : r->end;
        to_run += r->end - r->start;
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    rk = NULL;

    LOG_I("replay_plan", "group=%s topics=%zu partitions=%zu jobs=%" PRId64 " resumed_from=%" PRId64
          " from=\"%s\" to=\"%s\" reply_topic=%s redis=%s model=%s rate=%.0f",
          group, a.n_topics, n_parts, to_run, a.resume ? done_before : 0, a.from.text, a.to.text,
          reply_topic,
          a.redis == WORKER_REDIS_SET ? "on" : a.redis == WORKER_REDIS_OFF ? "off" : "if-absent",
          a.model ? a.model : "(as asked)", a.rate);
    struct progress pr;
    memset(&pr, 0, sizeof(pr));
    pr.a = &a;
    /* A bar on a terminal, unless debug logging is asked for: info lines
     * would scroll the bars away, so they are held back while it shows. */
    pr.tty = isatty(STDERR_FILENO) && log_threshold < LOG_DEBUG && a.progress_ms == 0;
    enum log_level saved_threshold = log_threshold;
    if (pr.tty && log_threshold > LOG_WARN) log_threshold = LOG_WARN;
    struct worker_opts wo = {
        .group = group, .reply_topic = reply_topic, .redis = a.redis, .model = a.model,
        .priority = a.priority, .rate = a.rate, .ranges = ranges, .n_ranges = n_parts,
        .ignore_deadlines = 1, /* history: every deadline has passed */
        .progress = on_progress, .progress_ctx = &pr,
        .progress_ms = pr.tty ? REPLAY_PROGRESS_TTY_MS
                              : a.progress_ms ? a.progress_ms : REPLAY_PROGRESS_LINE_MS};
    enum worker_exit wrc = worker_run(c, &wo, &cli_stop);
    log_threshold = saved_threshold;
    if (wrc == WORKER_EXIT_STARTUP) goto out;

    /* Done means every range reached its end. A stop request that came
     * after the last job still counts as done: ask the checkpoint. */
    int complete = wrc == WORKER_EXIT_OK && !cli_stop;
    if (wrc == WORKER_EXIT_OK && cli_stop && (rk = planner_new(c, group, why, sizeof(why))) &&
        read_checkpoint(rk, parts, n_parts, why, sizeof(why)) == 0)
        complete = checkpoint_complete(parts, n_parts);
    rc = wrc == WORKER_EXIT_FATAL ? REPLAY_EXIT_FATAL
         : complete              ? REPLAY_EXIT_DONE
                                 : REPLAY_EXIT_INTERRUPTED;
    double rate = pr.elapsed_s > 0 ? (double)pr.jobs / pr.elapsed_s : 0;
    printf("kinfer replay: %s jobs=%" PRId64 " ok=%" PRIu64 " errors=%" PRIu64
           " dead_lettered=%" PRIu64 " duration_s=%.1f rate=%.1f group=%s\n",
           rc == REPLAY_EXIT_DONE ? "done" : rc == REPLAY_EXIT_FATAL ? "failed" : "interrupted",
           pr.jobs, pr.ok, pr.failed, pr.dead, pr.elapsed_s, rate, group);
    if (rc == REPLAY_EXIT_INTERRUPTED)
        printf("kinfer replay: run the same command with --resume to continue\n");
    fflush(stdout);
out:
    if (rk) {
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
    }
    free(ranges);
    free(parts);
    free(a.from.offs);
    free(a.to.offs);
    for (size_t i = 0; i < a.n_topics; i++) free(a.topics[i]);
    free(a.sets);
    free(user_sets);
    cfg_destroy(c);
    return rc;
}

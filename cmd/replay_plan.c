/* replay_plan.c - turns `kinfer replay`'s bounds into per-partition
 * offset ranges: the partitions and their watermarks, offsets-for-times
 * (and a scan of record timestamps where the broker has no time index),
 * and the checkpoint, kept as the committed offsets of a consumer group
 * of the replay's own, named after what is replayed. The live group is
 * never joined and never committed to.
 *
 * Threads: main thread; a timestamp scan stops early when cli_stop is
 * set. Ownership: the caller owns the librdkafka handle replay_planner_new
 * makes and the parts array replay_plan returns. */
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
void replay_group_id(const struct kcfg *c, struct replay_args *a, const char *reply_topic,
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
rd_kafka_t *replay_planner_new(const struct kcfg *c, const char *group, char *why,
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
int replay_read_checkpoint(rd_kafka_t *rk, struct part *parts, size_t n, char *why,
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
int replay_reset_checkpoint(rd_kafka_t *rk, const struct part *parts, size_t n, char *why,
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
int replay_plan(rd_kafka_t *rk, struct replay_args *a, struct part **out, size_t *n_out,
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
    if (replay_read_checkpoint(rk, parts, n, why, why_size) < 0) goto fail;
    *out = parts;
    *n_out = n;
    return 0;
fail:
    free(parts);
    return -1;
}

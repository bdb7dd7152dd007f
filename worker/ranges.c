/* ranges.c - bounded ranges for replay (ranges.h).
 *
 * Threads: the poll thread only. */
#include "ranges.h"

#include <stdlib.h>
#include <string.h>

struct ranges {
    struct worker_range *r;
    size_t n;
    int64_t *done;     /* per range: jobs finished */
    int *reached_end;  /* per range: consumed (or positioned) up to its end */
};

struct ranges *ranges_new(const struct worker_range *r, size_t n)
{
    struct ranges *rs = calloc(1, sizeof(*rs));
    if (!rs) return NULL;
    size_t k = n ? n : 1;
    rs->r = calloc(k, sizeof(*rs->r));
    rs->done = calloc(k, sizeof(*rs->done));
    rs->reached_end = calloc(k, sizeof(*rs->reached_end));
    if (!rs->r || !rs->done || !rs->reached_end) {
        ranges_destroy(rs);
        return NULL;
    }
    if (n) memcpy(rs->r, r, n * sizeof(*r));
    rs->n = n;
    for (size_t i = 0; i < n; i++) rs->reached_end[i] = r[i].start >= r[i].end;
    return rs;
}

void ranges_destroy(struct ranges *rs)
{
    if (!rs) return;
    free(rs->r);
    free(rs->done);
    free(rs->reached_end);
    free(rs);
}

/* Linear: a replay covers tens of partitions. */
static int range_of(const struct ranges *rs, const char *topic, int32_t partition)
{
    for (size_t i = 0; i < rs->n; i++)
        if (rs->r[i].partition == partition && strcmp(rs->r[i].topic, topic) == 0)
            return (int)i;
    return -1;
}

rd_kafka_topic_partition_list_t *ranges_assignment(const struct ranges *rs)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)rs->n);
    for (size_t i = 0; i < rs->n; i++)
        if (!rs->reached_end[i])
            rd_kafka_topic_partition_list_add(l, rs->r[i].topic, rs->r[i].partition)->offset =
                rs->r[i].start;
    return l;
}

int ranges_admit(struct ranges *rs, rd_kafka_t *rk, const rd_kafka_message_t *m)
{
    int r = range_of(rs, rd_kafka_topic_name(m->rkt), m->partition);
    if (r < 0) return 0;
    const struct worker_range *g = &rs->r[r];
    if (m->offset >= g->end - 1) {
        if (!rs->reached_end[r]) {
            rs->reached_end[r] = 1;
            rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(l, g->topic, g->partition);
            rd_kafka_pause_partitions(rk, l);
            rd_kafka_topic_partition_list_destroy(l);
        }
        return m->offset < g->end;
    }
    return m->offset >= g->start;
}

void ranges_keep_unfinished(const struct ranges *rs, rd_kafka_topic_partition_list_t *l)
{
    for (int i = l->cnt - 1; i >= 0; i--) {
        int r = range_of(rs, l->elems[i].topic, l->elems[i].partition);
        if (r >= 0 && rs->reached_end[r]) rd_kafka_topic_partition_list_del_by_idx(l, i);
    }
}

void ranges_job_done(struct ranges *rs, const char *topic, int32_t partition)
{
    int r = range_of(rs, topic, partition);
    if (r >= 0) rs->done[r]++;
}

int ranges_finished(struct ranges *rs, rd_kafka_t *rk, const struct offsets *o)
{
    rd_kafka_topic_partition_list_t *l = NULL;
    for (size_t i = 0; i < rs->n; i++) {
        if (rs->reached_end[i]) continue;
        if (!l) l = rd_kafka_topic_partition_list_new((int)rs->n);
        rd_kafka_topic_partition_list_add(l, rs->r[i].topic, rs->r[i].partition);
    }
    if (l) {
        rd_kafka_position(rk, l);
        for (int k = 0; k < l->cnt; k++) {
            int r = range_of(rs, l->elems[k].topic, l->elems[k].partition);
            if (l->elems[k].offset >= rs->r[r].end) rs->reached_end[r] = 1;
        }
        rd_kafka_topic_partition_list_destroy(l);
    }
    for (size_t i = 0; i < rs->n; i++)
        if (!rs->reached_end[i] || offsets_pending(o, rs->r[i].topic, rs->r[i].partition))
            return 0;
    return 1;
}

void ranges_progress(struct ranges *rs, struct worker_progress *p)
{
    p->ranges = rs->r;
    p->done = rs->done;
    p->n_ranges = rs->n;
}

/* offsets.c - the offsets stage (offsets.h): a thin layer over the
 * watermark tracker that talks to the consumer.
 *
 * Threads: the poll thread only. */
#include "offsets.h"

#include <stdlib.h>

#include "../base/clock.h"
#include "../base/log.h"
#include "offtrack.h"

struct offsets {
    struct offtrack *ot;
    struct jobq *done;
};

struct offsets *offsets_new(struct jobq *done)
{
    struct offsets *o = calloc(1, sizeof(*o));
    if (!o) return NULL;
    o->done = done;
    if (!(o->ot = offtrack_new())) {
        free(o);
        return NULL;
    }
    return o;
}

void offsets_destroy(struct offsets *o)
{
    if (!o) return;
    offtrack_destroy(o->ot);
    free(o);
}

int offsets_track(struct offsets *o, const char *topic, int32_t partition, int64_t offset)
{
    return offtrack_add(o->ot, topic, partition, offset);
}

/* A partition revoked meanwhile refuses its store with _STATE: nothing to
 * do about it, the next owner reads from the committed offset. */
static void store(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *l)
{
    if (l->cnt == 0) return;
    rd_kafka_resp_err_t err = rd_kafka_offsets_store(rk, l);
    if (err) LOG_D("offsets_store", "error=\"%s\"", rd_kafka_err2str(err));
}

struct job *offsets_collect(struct offsets *o, rd_kafka_t *rk)
{
    struct job *list = jobq_take(o->done, 0);
    if (!list) return NULL;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(8);
    for (struct job *j = list; j; j = j->next) {
        int64_t off;
        if (offtrack_done(o->ot, j->topic, j->partition, j->offset, &off) != 1) continue;
        rd_kafka_topic_partition_t *p = rd_kafka_topic_partition_list_find(l, j->topic, j->partition);
        if (!p) p = rd_kafka_topic_partition_list_add(l, j->topic, j->partition);
        p->offset = off;
    }
    store(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    return list;
}

size_t offsets_pending(const struct offsets *o, const char *topic, int32_t partition)
{
    return offtrack_pending(o->ot, topic, partition);
}

size_t offsets_pending_total(const struct offsets *o)
{
    return offtrack_pending_total(o->ot);
}

int64_t offsets_next(const struct offsets *o, const char *topic, int32_t partition)
{
    return offtrack_next(o->ot, topic, partition);
}

void offsets_drop(struct offsets *o, const char *topic, int32_t partition)
{
    offtrack_drop(o->ot, topic, partition);
}

/* librdkafka 2.0.2 wakes no fetcher when a partition is resumed: it starts
 * fetching on its broker thread's next wake-up, up to a second later, and
 * the worker idles meanwhile (docs/batching.md, "The cost of a pause"). A
 * seek wakes it at once. Each resumed partition is sought to the offset
 * after the last record taken from it, which is where the resume would
 * fetch from anyway, so nothing is skipped or read twice.
 *
 * Only partitions that delivered a record since they were assigned are
 * sought: their fetcher has started, and the offset is theirs (the tracker
 * forgets a partition on revoke). A seek librdkafka refuses would still
 * have raised the partition's version barrier and left every record it
 * fetches afterwards discarded as outdated, so a refused or unanswered
 * seek is followed by a pause and a resume of the same partitions, which
 * bring the barrier and the fetcher back in step. */
enum { RESUME_SEEK_TIMEOUT_MS = 1000 };

void offsets_restart_fetch(struct offsets *o, rd_kafka_t *consumer,
                           const rd_kafka_topic_partition_list_t *a)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(a->cnt);
    for (int i = 0; i < a->cnt; i++) {
        int64_t next = offsets_next(o, a->elems[i].topic, a->elems[i].partition);
        if (next >= 0)
            rd_kafka_topic_partition_list_add(l, a->elems[i].topic, a->elems[i].partition)
                ->offset = next;
    }
    if (l->cnt > 0) {
        /* Synchronous: librdkafka's own thread handles the seek, no broker
         * round trip is involved. */
        rd_kafka_error_t *e = rd_kafka_seek_partitions(consumer, l, RESUME_SEEK_TIMEOUT_MS);
        rd_kafka_topic_partition_list_t *bad = rd_kafka_topic_partition_list_new(l->cnt);
        const char *why = e ? rd_kafka_error_string(e) : NULL;
        for (int i = 0; i < l->cnt; i++) {
            if (!e && !l->elems[i].err) continue;
            rd_kafka_topic_partition_list_add(bad, l->elems[i].topic, l->elems[i].partition);
            if (!why) why = rd_kafka_err2str(l->elems[i].err);
        }
        if (bad->cnt > 0) {
            LOG_W("resume_seek_failed", "partitions=%d first=%s[%d] error=\"%s\" note=\"paused "
                  "and resumed again\"", bad->cnt, bad->elems[0].topic, bad->elems[0].partition,
                  why);
            rd_kafka_pause_partitions(consumer, bad);
            rd_kafka_resume_partitions(consumer, bad);
        }
        if (e) rd_kafka_error_destroy(e);
        rd_kafka_topic_partition_list_destroy(bad);
    }
    rd_kafka_topic_partition_list_destroy(l);
}

void offsets_commit(rd_kafka_t *rk, const char *when)
{
    rd_kafka_resp_err_t err = rd_kafka_commit(rk, NULL, 0);
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        LOG_W("commit_failed", "when=%s error=\"%s\"", when, rd_kafka_err2str(err));
}

int offsets_commit_by(rd_kafka_t *rk, const char *when, int64_t deadline_us)
{
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    if (!q) return -1;
    rd_kafka_resp_err_t err = rd_kafka_commit_queue(rk, NULL, q, NULL, NULL);
    int answered = err != RD_KAFKA_RESP_ERR_NO_ERROR;
    while (!answered) {
        int64_t left_us = deadline_us - clock_mono_us();
        if (left_us <= 0) break;
        int wait_ms = left_us > 100000 ? 100 : (int)((left_us + 999) / 1000);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, wait_ms);
        if (!ev) continue;
        if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_OFFSET_COMMIT) {
            err = rd_kafka_event_error(ev);
            answered = 1;
        }
        rd_kafka_event_destroy(ev);
    }
    /* Destroying the queue with the commit still in flight is safe: its
     * answer is dropped when it comes. */
    rd_kafka_queue_destroy(q);
    if (!answered) {
        LOG_W("commit_timeout", "when=%s note=\"the group coordinator did not answer in time; "
              "what was not committed runs again\"", when);
        return -1;
    }
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
        LOG_W("commit_failed", "when=%s error=\"%s\"", when, rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

/* offtrack.c - contiguous low watermark per partition. Each partition keeps
 * a ring of the offsets still outstanding, in consumption order, with a done
 * flag; done entries are popped from the front and the watermark is the last
 * popped offset + 1. The ring holds only outstanding work, which the poll
 * thread's backpressure bounds.
 *
 * Threads: poll thread only. */
#include "offtrack.h"

#include <stdlib.h>
#include <string.h>

struct ot_entry {
    int64_t offset;
    int done;
};

struct ot_part {
    char *topic;
    int32_t partition;
    struct ot_entry *ring; /* capacity cap, count entries from head */
    size_t cap, head, count;
    int64_t last_added;    /* -1 before the first */
};

struct offtrack {
    struct ot_part *parts;
    size_t n, cap;
};

struct offtrack *offtrack_new(void)
{
    return calloc(1, sizeof(struct offtrack));
}

void offtrack_destroy(struct offtrack *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->parts[i].topic);
        free(t->parts[i].ring);
    }
    free(t->parts);
    free(t);
}

/* Linear search: a worker owns tens of partitions, not thousands. */
static struct ot_part *find(const struct offtrack *t, const char *topic,
                            int32_t partition)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->parts[i].partition == partition &&
            strcmp(t->parts[i].topic, topic) == 0)
            return &t->parts[i];
    return NULL;
}

static struct ot_entry *at(struct ot_part *p, size_t i)
{
    return &p->ring[(p->head + i) % p->cap];
}

int offtrack_add(struct offtrack *t, const char *topic, int32_t partition,
                 int64_t offset)
{
    struct ot_part *p = find(t, topic, partition);
    if (!p) {
        if (t->n == t->cap) {
            size_t ncap = t->cap ? t->cap * 2 : 8;
            struct ot_part *np = realloc(t->parts, ncap * sizeof(*np));
            if (!np) return -1;
            t->parts = np;
            t->cap = ncap;
        }
        p = &t->parts[t->n];
        memset(p, 0, sizeof(*p));
        p->topic = strdup(topic);
        if (!p->topic) return -1;
        p->partition = partition;
        p->last_added = -1;
        t->n++;
    }
    if (offset <= p->last_added) {
        /* A seek back: offsets from here on will be consumed again, so
         * their entries go; entries below stay, done or not, so the
         * watermark can never pass work still in flight there. */
        while (p->count > 0 && at(p, p->count - 1)->offset >= offset) p->count--;
    }
    if (p->count == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 64;
        struct ot_entry *nr = malloc(ncap * sizeof(*nr));
        if (!nr) return -1;
        for (size_t i = 0; i < p->count; i++) nr[i] = *at(p, i);
        free(p->ring);
        p->ring = nr;
        p->cap = ncap;
        p->head = 0;
    }
    p->ring[(p->head + p->count) % p->cap] = (struct ot_entry){offset, 0};
    p->count++;
    p->last_added = offset;
    return 0;
}

int offtrack_done(struct offtrack *t, const char *topic, int32_t partition,
                  int64_t offset, int64_t *store_offset)
{
    struct ot_part *p = find(t, topic, partition);
    if (!p || p->count == 0) return -1;
    /* Offsets in the ring increase from head: binary search. */
    size_t lo = 0, hi = p->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (at(p, mid)->offset < offset) lo = mid + 1;
        else hi = mid;
    }
    if (lo == p->count || at(p, lo)->offset != offset) return -1;
    at(p, lo)->done = 1;
    if (lo != 0) return 0;
    int64_t last = offset;
    while (p->count > 0 && at(p, 0)->done) {
        last = at(p, 0)->offset;
        p->head = (p->head + 1) % p->cap;
        p->count--;
    }
    *store_offset = last + 1;
    return 1;
}

size_t offtrack_pending(const struct offtrack *t, const char *topic,
                        int32_t partition)
{
    struct ot_part *p = find(t, topic, partition);
    if (!p) return 0;
    size_t n = 0;
    for (size_t i = 0; i < p->count; i++) n += !at(p, i)->done;
    return n;
}

int64_t offtrack_next(const struct offtrack *t, const char *topic,
                      int32_t partition)
{
    const struct ot_part *p = find(t, topic, partition);
    return p && p->last_added >= 0 ? p->last_added + 1 : -1;
}

size_t offtrack_pending_total(const struct offtrack *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        n += offtrack_pending(t, t->parts[i].topic, t->parts[i].partition);
    return n;
}

void offtrack_drop(struct offtrack *t, const char *topic, int32_t partition)
{
    struct ot_part *p = find(t, topic, partition);
    if (!p) return;
    free(p->topic);
    free(p->ring);
    *p = t->parts[t->n - 1];
    t->n--;
}

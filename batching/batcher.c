/* batcher.c - per-model queues under one mutex. Each model keeps one FIFO
 * list per priority level, so the oldest job of each level is its list's
 * head and picking the next job is a scan of ten heads. The rules live in
 * batcher_take, which is pure given the clock; batcher_next only adds the
 * waiting (a condition variable on the monotonic clock, woken by pushes and
 * by the earliest time a rule can fire).
 *
 * Threads: poll thread (push, expire, purge, close), executors (next,
 * record), any (stats). */
#include "batcher.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"

#define N_BUCKETS 21 /* batch sizes 1, 2, 4, ... 2^20 rows or tokens */
#define DEADLINE_MARGIN_US 1000 /* close this much before the estimate says */

struct plist {
    struct job *head, *tail;
};

struct bqueue {
    struct plist prio[BATCHER_PRIORITIES];
    size_t rows, jobs;
    size_t padded;           /* encoder jobs: sum of rows x seq_len */
    double est_s[N_BUCKETS]; /* measured batch time by size bucket, EWMA */
};

struct batcher {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct batcher_conf conf;
    struct bqueue *q;
    size_t rows, jobs;
    uint64_t closed[BATCH_REASONS], expired;
    int closing, stopped;
};

int64_t batcher_clock(const struct batcher *b)
{
    return b->conf.clock ? b->conf.clock(b->conf.clock_ctx) : clock_mono_us();
}

const char *batcher_reason_name(enum batcher_reason r)
{
    static const char *const names[] = {"size", "deadline", "wait", "drain"};
    return r < BATCH_REASONS ? names[r] : "unknown";
}

struct batcher *batcher_new(const struct batcher_conf *conf)
{
    struct batcher *b = calloc(1, sizeof(*b));
    if (!b) return NULL;
    b->conf = *conf;
    if (b->conf.n_models == 0) b->conf.n_models = 1;
    if (b->conf.max_batch_rows == 0) b->conf.max_batch_rows = 1;
    if (b->conf.n_preferred > BATCHER_PREFERRED_MAX) b->conf.n_preferred = BATCHER_PREFERRED_MAX;
    b->q = calloc(b->conf.n_models, sizeof(*b->q));
    if (!b->q) {
        free(b);
        return NULL;
    }
    pthread_mutex_init(&b->mu, NULL);
    /* Timed waits use the monotonic clock so wall-clock jumps neither stall
     * nor rush a batch. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    return b;
}

static void free_list(struct job *j)
{
    while (j) {
        struct job *next = j->next;
        job_free(j);
        j = next;
    }
}

void batcher_destroy(struct batcher *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->conf.n_models; i++)
        for (int p = 0; p < BATCHER_PRIORITIES; p++) free_list(b->q[i].prio[p].head);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b->q);
    free(b);
}

static int clamp_prio(int p)
{
    return p < 0 ? 0 : p >= BATCHER_PRIORITIES ? BATCHER_PRIORITIES - 1 : p;
}

void batcher_push(struct batcher *b, struct job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&b->mu);
    struct bqueue *q = &b->q[job->model_idx];
    struct plist *l = &q->prio[clamp_prio(job->priority)];
    if (l->tail) l->tail->next = job;
    else l->head = job;
    l->tail = job;
    q->rows += job->rows;
    q->jobs++;
    q->padded += job->rows * job->seq_len;
    b->rows += job->rows;
    b->jobs++;
    /* Wake a waiter: this push may fill a batch, or bring the earliest
     * time a rule fires forward. */
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* ---- estimates ------------------------------------------------------- */

static int bucket_of(size_t rows)
{
    int k = 0;
    while (k < N_BUCKETS - 1 && ((size_t)1 << k) < rows) k++;
    return k;
}

/* The estimate for rows: its bucket's, else the nearest larger measured
 * bucket's (a bigger batch is slower: erring long closes early, which is
 * the safe side for a deadline), else the nearest smaller one's. */
static double estimate_locked(const struct bqueue *q, size_t rows)
{
    int k = bucket_of(rows);
    for (int i = k; i < N_BUCKETS; i++)
        if (q->est_s[i] > 0) return q->est_s[i];
    for (int i = k - 1; i >= 0; i--)
        if (q->est_s[i] > 0) return q->est_s[i];
    return 0;
}

void batcher_record(struct batcher *b, int model_idx, size_t units, double seconds)
{
    if (model_idx < 0 || (size_t)model_idx >= b->conf.n_models || seconds < 0) return;
    pthread_mutex_lock(&b->mu);
    double *e = &b->q[model_idx].est_s[bucket_of(units)];
    *e = *e > 0 ? 0.8 * *e + 0.2 * seconds : seconds;
    pthread_mutex_unlock(&b->mu);
}

double batcher_estimate(struct batcher *b, int model_idx, size_t units)
{
    if (model_idx < 0 || (size_t)model_idx >= b->conf.n_models) return 0;
    pthread_mutex_lock(&b->mu);
    double e = estimate_locked(&b->q[model_idx], units);
    pthread_mutex_unlock(&b->mu);
    return e;
}

/* ---- the rules ------------------------------------------------------- */

/* Oldest arrival among a queue's heads (each level's head is its oldest). */
static int64_t oldest_arrival(const struct bqueue *q)
{
    int64_t t = INT64_MAX;
    for (int p = 0; p < BATCHER_PRIORITIES; p++)
        if (q->prio[p].head && q->prio[p].head->arrived_us < t) t = q->prio[p].head->arrived_us;
    return t;
}

/* Earliest deadline queued for a model (a scan: queues are bounded by the
 * worker's max_queued_rows, and this runs only when a waiter wakes). */
static int64_t earliest_deadline(const struct bqueue *q)
{
    int64_t t = INT64_MAX;
    for (int p = 0; p < BATCHER_PRIORITIES; p++)
        for (const struct job *j = q->prio[p].head; j; j = j->next)
            if (j->deadline_us && j->deadline_us < t) t = j->deadline_us;
    return t;
}

/* Decides whether model queue q closes at now. Returns 1 with *why set, or
 * 0 with *wake set to when it may. */
static int ready(const struct batcher *b, const struct bqueue *q, int64_t now,
                 enum batcher_reason *why, int64_t *wake)
{
    *wake = INT64_MAX;
    if (q->jobs == 0) return 0;
    if (b->closing) return *why = BATCH_DRAIN, 1;
    if (q->rows >= b->conf.max_batch_rows) return *why = BATCH_SIZE, 1;
    size_t max_tok = b->conf.max_batch_tokens;
    if (max_tok && q->padded >= max_tok) return *why = BATCH_SIZE, 1;
    int64_t dl = earliest_deadline(q);
    if (dl != INT64_MAX) {
        /* The batch that would run: its rows, or an encoder's tokens. */
        size_t units = q->rows < b->conf.max_batch_rows ? q->rows : b->conf.max_batch_rows;
        if (q->padded) units = max_tok && q->padded > max_tok ? max_tok : q->padded;
        int64_t lead = (int64_t)(estimate_locked(q, units) * 1e6) + DEADLINE_MARGIN_US;
        if (dl - lead <= now) return *why = BATCH_DEADLINE, 1;
        *wake = dl - lead;
    }
    int64_t due = oldest_arrival(q) + (int64_t)b->conf.max_wait_ms * 1000;
    if (due <= now) return *why = BATCH_WAIT, 1;
    if (due < *wake) *wake = due;
    return 0;
}

/* A job's effective priority at now: its level plus one per aging_ms
 * waited. */
static double effective(const struct job *j, int level, int64_t now, int aging_ms)
{
    double eff = level;
    if (aging_ms > 0 && now > j->arrived_us)
        eff += (double)(now - j->arrived_us) / (aging_ms * 1000.0);
    return eff;
}

/* The level whose head has the highest effective priority at now; ties go
 * to the older head. */
static struct plist *best_head(struct bqueue *q, int64_t now, int aging_ms)
{
    struct plist *best = NULL;
    double best_eff = -1;
    int64_t best_arr = INT64_MAX;
    for (int p = 0; p < BATCHER_PRIORITIES; p++) {
        const struct job *h = q->prio[p].head;
        if (!h) continue;
        double eff = effective(h, p, now, aging_ms);
        if (eff > best_eff || (eff == best_eff && h->arrived_us < best_arr)) {
            best = &q->prio[p];
            best_eff = eff;
            best_arr = h->arrived_us;
        }
    }
    return best;
}

/* The row target of a batch closing for why: max_batch_rows, or for a
 * close by time the largest preferred size the queued rows can fill (all
 * of them when they fill none). */
static size_t target_rows(const struct batcher *b, const struct bqueue *q,
                          enum batcher_reason why)
{
    size_t target = b->conf.max_batch_rows;
    if (why != BATCH_WAIT || b->conf.n_preferred == 0 || q->rows >= target) return target;
    /* Deadline closes are not cut: the job with the deadline must go now. */
    size_t fill = 0;
    for (size_t i = 0; i < b->conf.n_preferred; i++)
        if (b->conf.preferred[i] <= q->rows && b->conf.preferred[i] > fill)
            fill = b->conf.preferred[i];
    return fill ? fill : target;
}

/* Takes a job just unlinked from q off the queue's and the batcher's
 * counts. Lock held. */
static void count_out(struct batcher *b, struct bqueue *q, const struct job *j)
{
    q->rows -= j->rows;
    q->jobs--;
    q->padded -= j->rows * j->seq_len;
    b->rows -= j->rows;
    b->jobs--;
}

/* Unlinks j, the head of l, from q. Lock held. */
static void pop_head(struct batcher *b, struct bqueue *q, struct plist *l)
{
    struct job *j = l->head;
    l->head = j->next;
    if (!l->head) l->tail = NULL;
    j->next = NULL;
    count_out(b, q, j);
}

/* Whether a batch of rows whose longest row is len stays within the token
 * budget (always, for a layer model: len 0). */
static int tokens_fit(const struct batcher *b, size_t rows, size_t len)
{
    return !b->conf.max_batch_tokens || rows * len <= b->conf.max_batch_tokens;
}

/* The length bucket of a row of len tokens: 0 up to 16 tokens, then four
 * per power of two (17-20, 21-24, 25-28, 29-32, 33-40, ... 113-128, 129-160,
 * ...), so a bucket's rows differ by at most a fifth of its longest and
 * padding within one stays under 20%. */
int batcher_len_bucket(size_t len)
{
    if (len <= 16) return 0;
    int k = 4; /* 2^k < len <= 2^(k+1) */
    while (k < 40 && len > ((size_t)2 << k)) k++;
    size_t base = (size_t)1 << k, width = base / 4;
    return 1 + (k - 4) * 4 + (int)((len - base - 1) / width);
}

/* A queued job that may join a grouped batch, with what orders it. */
struct cand {
    struct job *j;
    int dist;          /* buckets below the first job's: 0 = the same one */
    double eff;
};

static int cand_cmp(const void *pa, const void *pb)
{
    const struct cand *a = pa, *c = pb;
    if (a->dist != c->dist) return a->dist - c->dist;
    if (a->eff != c->eff) return a->eff > c->eff ? -1 : 1;
    return a->j->arrived_us < c->j->arrived_us ? -1 : a->j->arrived_us > c->j->arrived_us;
}

/* The rest of a grouped batch after its first job (already unlinked, n
 * rows of longest len): jobs of first's bucket, then of the shorter
 * buckets nearest first, each bucket in effective-priority order, while
 * rows and tokens fit; they are
 * marked, then unlinked in one sweep and appended in the order chosen.
 * Returns 0, or -1 when out of memory (nothing taken: the caller fills
 * the batch the plain way). Lock held. */
static int fill_grouped(struct batcher *b, struct bqueue *q, int64_t now, size_t target,
                        struct job *first, size_t *n, struct job ***tail)
{
    int bucket = batcher_len_bucket(first->seq_len);
    struct cand *c = malloc(q->jobs * sizeof(*c));
    if (!c) return -1;
    size_t nc = 0, len = first->seq_len;
    for (int p = 0; p < BATCHER_PRIORITIES; p++)
        for (struct job *j = q->prio[p].head; j; j = j->next) {
            int k = batcher_len_bucket(j->seq_len);
            if (k > bucket) continue;
            c[nc++] = (struct cand){j, bucket - k, effective(j, p, now, b->conf.aging_ms)};
        }
    qsort(c, nc, sizeof(*c), cand_cmp);
    size_t picked = 0;
    for (size_t i = 0; i < nc && *n < target; i++) {
        struct job *j = c[i].j;
        size_t l = j->seq_len > len ? j->seq_len : len;
        if (*n + j->rows > target || !tokens_fit(b, *n + j->rows, l)) continue;
        j->picked = 1;
        c[picked++].j = j; /* reuse the array: the chosen, in order */
        *n += j->rows;
        len = l;
    }
    for (int p = 0; p < BATCHER_PRIORITIES && picked; p++) {
        struct plist *l = &q->prio[p];
        struct job **pp = &l->head, *prev = NULL;
        while (*pp) {
            struct job *j = *pp;
            if (!j->picked) {
                prev = j;
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            count_out(b, q, j);
        }
        l->tail = prev;
    }
    for (size_t i = 0; i < picked; i++) {
        struct job *j = c[i].j;
        j->picked = 0;
        j->next = NULL;
        **tail = j;
        *tail = &j->next;
    }
    free(c);
    return 0;
}

/* Cuts a batch off q in effective-priority order while the rows (and an
 * encoder's padded tokens) fit the target; a first job larger than the
 * target goes alone. An encoder's batch with group_by_length takes the
 * rest by length (fill_grouped). Lock held. */
static struct job *cut(struct batcher *b, struct bqueue *q, int64_t now, size_t target,
                       size_t *rows)
{
    struct job *first = NULL, **tail = &first;
    size_t n = 0, len = 0;
    for (;;) {
        struct plist *l = best_head(q, now, b->conf.aging_ms);
        if (!l) break;
        struct job *j = l->head;
        size_t longer = j->seq_len > len ? j->seq_len : len;
        if (first && (n + j->rows > target || !tokens_fit(b, n + j->rows, longer))) break;
        pop_head(b, q, l);
        *tail = j;
        tail = &j->next;
        n += j->rows;
        len = longer;
        if (n >= target || !tokens_fit(b, n + 1, len)) break;
        if (first == j && j->seq_len && b->conf.group_by_length &&
            fill_grouped(b, q, now, target, j, &n, &tail) == 0)
            break;
    }
    *rows = n;
    return first;
}

/* batcher_take with the lock held. */
static struct job *take_locked(struct batcher *b, int64_t now, size_t *rows,
                               enum batcher_reason *why, int64_t *wake_us)
{
    int64_t wake = INT64_MAX;
    struct bqueue *pick = NULL;
    enum batcher_reason pick_why = BATCH_WAIT;
    int64_t pick_arr = INT64_MAX;
    for (size_t i = 0; i < b->conf.n_models; i++) {
        struct bqueue *q = &b->q[i];
        enum batcher_reason r;
        int64_t w;
        if (ready(b, q, now, &r, &w)) {
            /* Among ready models, the one whose oldest job has waited
             * longest goes first, so no model starves another. */
            int64_t arr = oldest_arrival(q);
            if (arr < pick_arr) {
                pick = q;
                pick_arr = arr;
                pick_why = r;
            }
        } else if (w < wake) {
            wake = w;
        }
    }
    if (wake_us) *wake_us = wake;
    size_t n = 0;
    struct job *batch = NULL;
    if (pick) {
        batch = cut(b, pick, now, target_rows(b, pick, pick_why), &n);
        b->closed[pick_why]++;
        if (why) *why = pick_why;
    }
    if (rows) *rows = n;
    return batch;
}

struct job *batcher_take(struct batcher *b, int64_t now_us, size_t *rows,
                         enum batcher_reason *why, int64_t *wake_us)
{
    pthread_mutex_lock(&b->mu);
    struct job *batch = take_locked(b, now_us, rows, why, wake_us);
    pthread_mutex_unlock(&b->mu);
    return batch;
}

struct job *batcher_next(struct batcher *b, int timeout_ms, size_t *rows,
                         enum batcher_reason *why)
{
    pthread_mutex_lock(&b->mu);
    int64_t give_up = batcher_clock(b) + (int64_t)timeout_ms * 1000;
    struct job *batch = NULL;
    while (!b->stopped) {
        int64_t now = batcher_clock(b), wake;
        batch = take_locked(b, now, rows, why, &wake);
        if (batch) {
            if (b->jobs) pthread_cond_signal(&b->cv); /* another may be ready */
            break;
        }
        if (now >= give_up) break;
        if (wake > give_up) wake = give_up;
        /* The condition variable runs on the real monotonic clock; with an
         * injected clock, re-check at least every millisecond. */
        int64_t until = b->conf.clock ? clock_mono_us() + 1000
                                      : wake;
        struct timespec ts = {.tv_sec = until / 1000000,
                              .tv_nsec = (until % 1000000) * 1000};
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    pthread_mutex_unlock(&b->mu);
    if (!batch && rows) *rows = 0;
    return batch;
}

/* Unlinks from every level the jobs for which match() holds, appending
 * them to *out. Lock held. Returns how many. */
static size_t take_matching(struct batcher *b, int (*match)(const struct job *, const void *),
                            const void *arg, struct job ***out_tail)
{
    size_t n = 0;
    for (size_t i = 0; i < b->conf.n_models; i++) {
        struct bqueue *q = &b->q[i];
        for (int p = 0; p < BATCHER_PRIORITIES; p++) {
            struct plist *l = &q->prio[p];
            struct job **pp = &l->head, *prev = NULL;
            while (*pp) {
                struct job *j = *pp;
                if (match(j, arg)) {
                    *pp = j->next;
                    count_out(b, q, j);
                    j->next = NULL;
                    **out_tail = j;
                    *out_tail = &j->next;
                    n++;
                } else {
                    prev = j;
                    pp = &j->next;
                }
            }
            l->tail = prev;
        }
    }
    return n;
}

static int is_expired(const struct job *j, const void *now)
{
    return j->deadline_us && j->deadline_us <= *(const int64_t *)now;
}

struct job *batcher_expire(struct batcher *b, int64_t now_us, int64_t *next_deadline_us)
{
    struct job *out = NULL, **tail = &out;
    pthread_mutex_lock(&b->mu);
    b->expired += take_matching(b, is_expired, &now_us, &tail);
    if (next_deadline_us) {
        int64_t t = INT64_MAX;
        for (size_t i = 0; i < b->conf.n_models; i++) {
            int64_t d = earliest_deadline(&b->q[i]);
            if (d < t) t = d;
        }
        *next_deadline_us = t;
    }
    pthread_mutex_unlock(&b->mu);
    return out;
}

struct part_key {
    const char *topic;
    int32_t partition;
};

static int is_partition(const struct job *j, const void *arg)
{
    const struct part_key *k = arg;
    return j->partition == k->partition && strcmp(j->topic, k->topic) == 0;
}

struct job *batcher_purge(struct batcher *b, const char *topic, int32_t partition)
{
    struct part_key k = {topic, partition};
    struct job *out = NULL, **tail = &out;
    pthread_mutex_lock(&b->mu);
    take_matching(b, is_partition, &k, &tail);
    pthread_mutex_unlock(&b->mu);
    return out;
}

void batcher_close(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    b->closing = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void batcher_stop(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    b->stopped = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void batcher_get_stats(struct batcher *b, int64_t now_us, struct batcher_stats *out)
{
    pthread_mutex_lock(&b->mu);
    memcpy(out->closed, b->closed, sizeof(out->closed));
    out->expired = b->expired;
    out->queued_rows = b->rows;
    out->queued_jobs = b->jobs;
    out->queued_tokens = 0;
    for (size_t i = 0; i < b->conf.n_models; i++) out->queued_tokens += b->q[i].padded;
    int64_t oldest = INT64_MAX;
    for (size_t i = 0; i < b->conf.n_models; i++) {
        int64_t t = oldest_arrival(&b->q[i]);
        if (t < oldest) oldest = t;
    }
    out->oldest_age_us = oldest == INT64_MAX || oldest > now_us ? 0 : now_us - oldest;
    pthread_mutex_unlock(&b->mu);
}

size_t batcher_padded_tokens(const struct job *batch)
{
    size_t rows = 0, len = 0;
    for (const struct job *j = batch; j; j = j->next) {
        rows += j->rows;
        if (j->seq_len > len) len = j->seq_len;
    }
    return rows * len;
}

size_t batcher_queued_rows(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    size_t n = b->rows;
    pthread_mutex_unlock(&b->mu);
    return n;
}

size_t batcher_queued_jobs(struct batcher *b)
{
    pthread_mutex_lock(&b->mu);
    size_t n = b->jobs;
    pthread_mutex_unlock(&b->mu);
    return n;
}

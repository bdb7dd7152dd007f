/* bench_load.c - `kinfer bench produce` and `collect`: the load tools
 * that measure kinfer from the outside, as a client sees it. produce
 * offers jobs at a fixed rate (open loop: each record's timestamp is its
 * scheduled send time, so queueing anywhere shows up as latency); collect
 * notes when each job's result appears and reports latency from record
 * timestamp to result, throughput and batching.
 *
 * Threads: main thread only; librdkafka's callbacks run on it inside
 * rd_kafka_poll / rd_kafka_flush. Ownership: job bodies handed to
 * librdkafka with RD_KAFKA_MSG_F_FREE are librdkafka's from then on. */
#include "bench.h"
#include "bench_shared.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "textgen.h"
#include "../config/config.h"
#include "../kafka/kq.h"
#include "../base/log.h"

/* Sends one job of a run of its own ("<run>-warmup") and waits for its
 * acknowledgement, so the schedule starts with a connected producer that
 * has its idempotence id: otherwise the first second of a measurement
 * would time the producer's start-up, not the system under test. */
static int produce_warmup(rd_kafka_t *rk, const struct bench_jobgen *g, const char *topic)
{
    char run[BENCH_RUN_MAX + 16], id[128];
    snprintf(run, sizeof(run), "%s-warmup", g->run);
    struct bench_jobgen w = *g;
    w.run = run;
    unsigned char *body;
    size_t len;
    int64_t now = clock_wall_us();
    if (bench_jobgen_encode(&w, 0, now, id, sizeof(id), &body, &len) < 0) return -1;
    if (bench_produce_one(rk, topic, id, strlen(id), body, len, now / 1000, RD_KAFKA_MSG_F_FREE) < 0) {
        free(body);
        return -1;
    }
    if (rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kinfer bench: the warm-up job was not acknowledged in 30 s\n");
        return -1;
    }
    return 0;
}

/* `bench produce`: sends --jobs jobs to the first input topic at --rate
 * jobs/s on a fixed schedule (job i is due at start + i/rate whatever
 * happened before), record key = id, record timestamp = the due time. A
 * producer running late sends at once with the due timestamp, so its own
 * lag counts as latency and is reported as max_lag_ms. */
int bench_produce(const struct kcfg *c, const struct bench_opts *o)
{
    struct bench_dr_count dc = {0};
    struct bench_jobgen g = {0};
    struct textgen tg = {0};
    struct model_runtime *mrt = NULL;
    struct model *dm = o->width ? NULL : bench_load_default_model(c, 1, 0, &mrt);
    const struct model_encoder_info *enc = dm ? model_encoder(dm) : NULL;
    size_t width = o->width ? o->width : dm ? model_input_width(dm) : 0;
    int ok = enc ? textgen_init(&tg, enc) == 0 && bench_jobgen_init(&g, o->run, 1, 1) == 0
                 : width && bench_jobgen_init(&g, o->run, width, o->rows) == 0;
    if (enc) g.text = &tg;
    if (!ok) {
        textgen_fini(&tg);
        bench_jobgen_fini(&g);
        model_destroy(dm);
        model_runtime_destroy(mrt);
        return 1;
    }
    rd_kafka_t *rk = bench_producer(c, &dc);
    int rc = 1;
    if (!rk) goto out;
    const char *topic = c->kafka.topics[0];
    size_t bytes = 0;
    if (o->rate > 0) {
        if (produce_warmup(rk, &g, topic) < 0) goto out;
        dc.ok = 0; /* count the run's own jobs only */
    }
    int64_t max_lag = 0, start = clock_wall_us() + 2000;
    double t0 = bench_mono_s();
    for (size_t i = 0; i < o->jobs; i++) {
        int64_t due = clock_wall_us();
        if (o->rate > 0) {
            due = start + (int64_t)((double)i * 1e6 / o->rate);
            int64_t now = clock_wall_us();
            if (due > now) bench_sleep_until_wall_us(due);
            else if (now - due > max_lag) max_lag = now - due;
        }
        char id[128];
        unsigned char *body;
        size_t len;
        if (bench_jobgen_encode(&g, i, due, id, sizeof(id), &body, &len) < 0) {
            fprintf(stderr, "kinfer bench: cannot encode a job\n");
            goto out;
        }
        bytes += len;
        if (bench_produce_one(rk, topic, id, strlen(id), body, len, due / 1000,
                        RD_KAFKA_MSG_F_FREE) < 0) {
            free(body);
            goto out;
        }
        rd_kafka_poll(rk, 0);
    }
    double sent_s = bench_mono_s() - t0;
    rd_kafka_flush(rk, 60000);
    double acked_s = bench_mono_s() - t0;
    printf("produce: run=%s topic=%s jobs=%zu rows=%zu width=%zu mean_bytes=%.0f", o->run,
           topic, o->jobs, o->rows, width, o->jobs ? (double)bytes / (double)o->jobs : 0.0);
    bench_put_num("offered_per_s", o->rate > 0 ? o->rate : NAN, 0);
    printf(" sent_per_s=%.0f acked_per_s=%.0f max_lag_ms=%.1f delivered=%" PRIu64
           " failed=%" PRIu64 "\n", (double)o->jobs / sent_s, (double)o->jobs / acked_s,
           (double)max_lag / 1000.0, dc.ok, dc.failed);
    if (dc.failed)
        fprintf(stderr, "kinfer bench: %" PRIu64 " deliveries failed, first: %s\n", dc.failed,
                rd_kafka_err2str(dc.first_err));
    rc = dc.failed || dc.ok != o->jobs ? 1 : 0;
out:
    if (rk) rd_kafka_destroy(rk);
    bench_jobgen_fini(&g);
    textgen_fini(&tg);
    model_destroy(dm);
    model_runtime_destroy(mrt);
    return rc;
}

/* ---- collect ---------------------------------------------------------------- */

/* What the results of a run say about batching, summed as they are read. A
 * job's result carries its batch's rows and run time; a batch of B rows is
 * seen once per job in it, so each sighting weighs rows/B of a batch. */
struct rstats {
    size_t ok, errors;
    char first_error[64];
    double batches, rows, full_batches, infer_ms, queued_ms, total_ms;
    int64_t max_batch_rows;
};

/* Adds one decoded result. max_rows is batching.max_batch_rows: a batch
 * that reached it closed on size; with one-row jobs any smaller batch
 * closed on time (wait or deadline) or at drain. */
static void rstats_add(struct rstats *s, const struct wire_result *r, size_t max_rows)
{
    if (!r->ok) {
        if (!s->errors) snprintf(s->first_error, sizeof(s->first_error), "%s", r->code);
        s->errors++;
        return;
    }
    s->ok++;
    if (r->batch_rows <= 0) return;
    double w = (double)r->rows / (double)r->batch_rows;
    s->batches += w;
    s->rows += (double)r->rows;
    if ((size_t)r->batch_rows >= max_rows) s->full_batches += w;
    s->infer_ms += w * r->infer_ms;
    s->queued_ms += r->queued_ms;
    s->total_ms += r->total_ms;
    if (r->batch_rows > s->max_batch_rows) s->max_batch_rows = r->batch_rows;
}

/* One run's arrivals: per sequence number its send and arrival time (0 =
 * not arrived), plus what its result bodies said. */
struct collect {
    const struct kcfg *cfg;
    const struct bench_opts *o;
    size_t n, got;
    int64_t *send_us, *arr_us;
    unsigned char *fetched;   /* body read and counted */
    struct rstats st;
};

/* Notes that the result of id arrived at now_us; duplicates and ids of
 * other runs are ignored. Returns the sequence number when new, else -1. */
static long collect_note(struct collect *s, const char *id, size_t len, int64_t now_us)
{
    size_t seq;
    int64_t send;
    if (bench_parse_id(id, len, s->o->run, &seq, &send) < 0 || seq >= s->n || s->arr_us[seq])
        return -1;
    s->send_us[seq] = send;
    s->arr_us[seq] = now_us > 0 ? now_us : 1;
    s->got++;
    return (long)seq;
}

/* Decodes a result body and counts it once per sequence number. */
static void collect_body(struct collect *s, size_t seq, const void *body, size_t len)
{
    if (seq >= s->n || s->fetched[seq]) return;
    struct wire_result r;
    char err[256];
    if (wire_decode_result(body, len, &r, err, sizeof(err)) < 0) {
        if (!s->st.errors) snprintf(s->st.first_error, sizeof(s->st.first_error), "undecodable");
        s->st.errors++;
    } else {
        rstats_add(&s->st, &r, (size_t)s->cfg->batching.max_batch_rows);
        wire_result_fini(&r);
    }
    s->fetched[seq] = 1;
}

/* Tells the script this collector is listening: nothing sent before this
 * line can be missed. */
static void say_ready(void)
{
    printf("collect: ready\n");
    fflush(stdout);
}

/* Handles one pub/sub push: ["message", channel, key] for each SET. */
static void on_keyevent(struct collect *s, redisReply *r, size_t plen, int64_t now_us)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *k = r->element[2];
    if ((size_t)k->len <= plen || memcmp(k->str, s->cfg->redis.key_prefix, plen) != 0) return;
    collect_note(s, k->str + plen, (size_t)k->len - plen, now_us);
}

/* Waits for results by Redis keyspace events: every SET publishes its key
 * on __keyevent@<db>__:set when the server has notify-keyspace-events with
 * E and $ (or A), so each result is seen the moment it is in Redis without
 * polling. The server must have that setting (bench/run.sh turns it on);
 * this refuses to run without it rather than wait for nothing. */
static int collect_keyevents(struct collect *s)
{
    const struct kcfg *c = s->cfg;
    redisContext *rc = bench_redis(c);
    if (!rc) return -1;
    int rcode = -1;
    redisReply *r = redisCommand(rc, "CONFIG GET notify-keyspace-events");
    const char *ev = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                             r->element[1]->type == REDIS_REPLY_STRING
                         ? r->element[1]->str : "";
    if (!strchr(ev, 'E') || !(strchr(ev, '$') || strchr(ev, 'A'))) {
        fprintf(stderr, "kinfer bench: redis %s:%d has notify-keyspace-events=\"%s\": "
                "collect --from redis needs E$ (redis-cli CONFIG SET notify-keyspace-events E$)"
                " or use --from topic\n", c->redis.host, c->redis.port, ev);
        if (r) freeReplyObject(r);
        goto out;
    }
    freeReplyObject(r);
    char ch[64];
    snprintf(ch, sizeof(ch), "__keyevent@%d__:set", c->redis.db);
    r = redisCommand(rc, "SUBSCRIBE %s", ch);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "kinfer bench: SUBSCRIBE %s: %s\n", ch, r ? r->str : rc->errstr);
        if (r) freeReplyObject(r);
        goto out;
    }
    freeReplyObject(r);
    say_ready();
    size_t plen = strlen(c->redis.key_prefix);
    double give_up = bench_mono_s() + s->o->timeout_s;
    int64_t now = clock_wall_us();
    while (s->got < s->n && bench_mono_s() < give_up) {
        void *v = NULL;
        if (redisGetReplyFromReader(rc, &v) != REDIS_OK) {
            fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
            goto out;
        }
        if (v) {
            on_keyevent(s, v, plen, now);
            freeReplyObject(v);
            continue;
        }
        /* Nothing buffered: wait for the socket. The arrival time of what
         * comes is the moment it became readable. */
        struct pollfd p = {.fd = rc->fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) {
            now = clock_wall_us();
            if (redisBufferRead(rc) != REDIS_OK) {
                fprintf(stderr, "kinfer bench: redis: %s\n", rc->errstr);
                goto out;
            }
        }
    }
    rcode = 0;
out:
    redisFree(rc);
    return rcode;
}

/* Waits for results by reading the reply topic from its current end, with
 * partitions assigned directly (no group join to wait for); decodes each
 * body as it comes. The arrival time includes the consumer's fetch wait,
 * which the embedded broker always serves in full. */
static int collect_topic(struct collect *s)
{
    const struct kcfg *c = s->cfg;
    char group[128];
    snprintf(group, sizeof(group), "kinfer-bench-collect-%d", (int)getpid());
    rd_kafka_t *rk = bench_consumer(c, group);
    if (!rk) return -1;
    int rcode = -1;
    if (bench_assign_topic(rk, c->kafka.reply_topic, 1) < 0) goto out;
    /* librdkafka starts fetching newly assigned partitions at its broker
     * thread's next wake-up, up to about a second later: results produced
     * before that would be timed late. Poll through it first. */
    for (double settle = bench_mono_s() + 1.5; bench_mono_s() < settle;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (m) rd_kafka_message_destroy(m);
    }
    say_ready();
    double give_up = bench_mono_s() + s->o->timeout_s;
    while (s->got < s->n && bench_mono_s() < give_up) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        int64_t now = clock_wall_us();
        if (!m->err && m->key) {
            long seq = collect_note(s, m->key, m->key_len, now);
            if (seq >= 0) collect_body(s, (size_t)seq, m->payload, m->len);
        }
        rd_kafka_message_destroy(m);
    }
    rcode = 0;
out:
    rd_kafka_destroy(rk);
    return rcode;
}

/* Waits for results by counting keys (DBSIZE above its value at start,
 * every 5 ms): no per-result work at all, for measuring saturation without
 * the collector competing for the CPU. Arrival times are the poll at which
 * the count passed each sequence number, in order: good for throughput,
 * meaningless for latency (which is then not reported). Anything else
 * writing keys meanwhile is counted too: use a database of its own. */
static int collect_dbsize(struct collect *s)
{
    redisContext *rc = bench_redis(s->cfg);
    if (!rc) return -1;
    int rcode = -1;
    long long base = -1;
    double give_up = bench_mono_s() + s->o->timeout_s;
    size_t seen = 0;
    while (seen < s->n && bench_mono_s() < give_up) {
        redisReply *r = redisCommand(rc, "DBSIZE");
        int64_t now = clock_wall_us();
        if (!r || r->type != REDIS_REPLY_INTEGER) {
            fprintf(stderr, "kinfer bench: DBSIZE: %s\n", r ? r->str : rc->errstr);
            if (r) freeReplyObject(r);
            goto out;
        }
        if (base < 0) {
            base = r->integer; /* counted from here: ready only now */
            say_ready();
        }
        long long cnt = r->integer - base;
        freeReplyObject(r);
        while (cnt > 0 && seen < (size_t)cnt && seen < s->n) s->arr_us[seen++] = now;
        if (seen < s->n) usleep(5000);
    }
    s->got = seen;
    rcode = 0;
out:
    redisFree(rc);
    return rcode;
}

/* One SCAN pass over the run's keys with pipelined GETs of those not read
 * yet; *fetched counts the bodies read so far. Returns 0 or -1. */
static int fetch_pass(struct collect *s, redisContext *rc, size_t *fetched)
{
    const struct kcfg *c = s->cfg;
    char pattern[600], cursor[32] = "0";
    snprintf(pattern, sizeof(pattern), "%s%s.*", c->redis.key_prefix, s->o->run);
    size_t plen = strlen(c->redis.key_prefix);
    do {
        redisReply *r = redisCommand(rc, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            fprintf(stderr, "kinfer bench: SCAN: %s\n", r ? "unexpected reply" : rc->errstr);
            if (r) freeReplyObject(r);
            return -1;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        size_t *seqs = malloc((keys->elements + 1) * sizeof(size_t));
        if (!seqs) {
            freeReplyObject(r);
            return -1;
        }
        size_t asked = 0;
        for (size_t i = 0; i < keys->elements; i++) {
            const redisReply *k = keys->element[i];
            size_t seq;
            int64_t send;
            if ((size_t)k->len <= plen ||
                bench_parse_id(k->str + plen, (size_t)k->len - plen, s->o->run, &seq, &send) < 0 ||
                seq >= s->n || s->fetched[seq])
                continue;
            const char *argv[] = {"GET", k->str};
            size_t lens[] = {3, (size_t)k->len};
            redisAppendCommandArgv(rc, 2, argv, lens);
            seqs[asked++] = seq;
        }
        freeReplyObject(r);
        for (size_t i = 0; i < asked; i++) {
            void *v = NULL;
            if (redisGetReply(rc, &v) != REDIS_OK) {
                fprintf(stderr, "kinfer bench: GET: %s\n", rc->errstr);
                free(seqs);
                return -1;
            }
            redisReply *b = v;
            if (b->type == REDIS_REPLY_STRING && !s->fetched[seqs[i]]) {
                collect_body(s, seqs[i], b->str, (size_t)b->len);
                (*fetched)++;
            }
            freeReplyObject(b);
        }
        free(seqs);
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

/* Reads the run's result bodies from Redis after the fact, for the
 * batching figures, on a connection of its own (a subscriber's cannot send
 * commands). A key count can run ahead of the results (the worker writes
 * other keys too, such as its heartbeat), so passes repeat until every
 * result is read or the timeout; got becomes the number read. */
static int collect_fetch(struct collect *s)
{
    redisContext *rc = bench_redis(s->cfg);
    if (!rc) return -1;
    size_t fetched = 0;
    int rcode = 0;
    double give_up = bench_mono_s() + s->o->timeout_s;
    while ((rcode = fetch_pass(s, rc, &fetched)) == 0 && fetched < s->n &&
           bench_mono_s() < give_up)
        usleep(20000);
    redisFree(rc);
    s->got = fetched;
    return rcode;
}

/* Writes one line per result, "seq send_us arrival_us latency_ms", for
 * looking at a run's latency over time (which jobs were slow, and when).
 * Returns 0, or -1 when the file cannot be written. */
static int collect_dump(const struct collect *s, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kinfer bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    for (size_t i = 0; i < s->n; i++)
        if (s->arr_us[i])
            fprintf(f, "%zu %" PRId64 " %" PRId64 " %.3f\n", i, s->send_us[i], s->arr_us[i],
                    (double)(s->arr_us[i] - s->send_us[i]) / 1000.0);
    return fclose(f) == 0 ? 0 : -1;
}

/* Prints the collect line: counts, throughput between the 10th and 90th
 * percentile arrivals (start-up and tail left out), latency percentiles
 * from record timestamp to result, and what the bodies said. */
static void collect_report(const struct collect *s, int have_latency)
{
    double *lat = malloc((s->got + 1) * sizeof(double));
    double *arr = malloc((s->got + 1) * sizeof(double));
    size_t k = 0;
    for (size_t i = 0; lat && arr && i < s->n; i++) {
        if (!s->arr_us[i]) continue;
        arr[k] = (double)s->arr_us[i] / 1e6;
        lat[k++] = (double)(s->arr_us[i] - s->send_us[i]) / 1000.0;
    }
    qsort(lat, k, sizeof(double), bench_cmp_double);
    qsort(arr, k, sizeof(double), bench_cmp_double);
    double rate = NAN;
    if (k >= 10) {
        size_t a = k / 10, b = k - 1 - k / 10;
        if (arr[b] > arr[a]) rate = (double)(b - a) / (arr[b] - arr[a]);
    }
    const struct rstats *st = &s->st;
    printf("collect: run=%s from=%s expected=%zu got=%zu missing=%zu", s->o->run, s->o->from,
           s->n, s->got, s->n - s->got);
    bench_put_num("per_s", rate, 0);
    bench_put_num("span_s", k > 1 ? arr[k - 1] - arr[0] : NAN, 2);
    bench_put_num("p50_ms", have_latency ? bench_quantile(lat, k, 0.50) : NAN, 2);
    bench_put_num("p90_ms", have_latency ? bench_quantile(lat, k, 0.90) : NAN, 2);
    bench_put_num("p99_ms", have_latency ? bench_quantile(lat, k, 0.99) : NAN, 2);
    bench_put_num("max_ms", have_latency ? bench_quantile(lat, k, 1.0) : NAN, 2);
    printf(" ok=%zu errors=%zu first_error=%s", st->ok, st->errors,
           st->first_error[0] ? st->first_error : "-");
    int hb = st->batches > 0;
    bench_put_num("batches", hb ? st->batches : NAN, 0);
    bench_put_num("mean_batch_rows", hb ? st->rows / st->batches : NAN, 2);
    printf(" max_batch_rows=%" PRId64, st->max_batch_rows);
    bench_put_num("full_batch_pct", hb ? 100.0 * st->full_batches / st->batches : NAN, 1);
    bench_put_num("batch_infer_ms", hb ? st->infer_ms / st->batches : NAN, 3);
    bench_put_num("queued_ms", st->ok ? st->queued_ms / (double)st->ok : NAN, 2);
    bench_put_num("worker_total_ms", st->ok ? st->total_ms / (double)st->ok : NAN, 2);
    printf("\n");
    fflush(stdout);
    free(lat);
    free(arr);
}

/* `bench collect`: waits for the --jobs results of --run, then reports.
 * Exits 0 only when every result arrived (and, when bodies were read,
 * none was an error). */
int bench_collect(const struct kcfg *c, const struct bench_opts *o)
{
    struct collect s = {.cfg = c, .o = o, .n = o->jobs};
    s.send_us = calloc(s.n, sizeof(int64_t));
    s.arr_us = calloc(s.n, sizeof(int64_t));
    s.fetched = calloc(s.n, 1);
    int rc = 1, r;
    if (!s.send_us || !s.arr_us || !s.fetched) goto out;
    int from_topic = strcmp(o->from, "topic") == 0, by_count = strcmp(o->from, "dbsize") == 0;
    if (from_topic) r = collect_topic(&s);
    else if (by_count) r = collect_dbsize(&s);
    else if (strcmp(o->from, "redis") == 0) r = collect_keyevents(&s);
    else {
        fprintf(stderr, "kinfer bench collect: --from must be redis, topic or dbsize\n");
        goto out;
    }
    if (r < 0) goto out;
    if (!from_topic && !o->no_fetch && collect_fetch(&s) < 0) goto out;
    collect_report(&s, !by_count);
    if (o->dump && collect_dump(&s, o->dump) < 0) goto out;
    rc = s.got == s.n && s.st.errors == 0 ? 0 : 1;
out:
    free(s.send_us);
    free(s.arr_us);
    free(s.fetched);
    return rc;
}

/* smoke_gen.c - smoke_gen_run (smoke_gen.h): sends generation jobs to the
 * first input topic with librdkafka (every --json-every'th as JSON, the
 * rest MessagePack), polls Redis for every result with pipelined GETs,
 * reads the stream of each streamed job (XRANGE), checks each answer
 * with smoke_gen_check as it arrives, compares the tokens of jobs sent
 * twice with the same seed, and prints the summary.
 *
 * Memory: a run keeps a few dozen bytes per job (a hash of its tokens,
 * its latencies); jobs are rebuilt from the run's seed when needed and
 * each answer is let go once checked.
 *
 * Threads: main thread. */
#include "smoke_gen.h"

#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../base/utf8.h"

/* What a run keeps of each job. */
struct gjob {
    uint64_t tok_hash;       /* FNV-1a of the token ids */
    double lat_ms, ttft_ms;  /* timing.total_ms and timing.ttft_ms */
    uint32_t n_tokens;
    uint8_t got, ok;
    const char *fin;         /* static: "eos", "stop" or "length" when ok */
};

static double now_s(void)
{
    return (double)clock_mono_us() / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void job_id(char *buf, size_t cap, unsigned seed, size_t i)
{
    snprintf(buf, cap, "smoke-gen-%u-%zu", seed, i);
}

/* Prints a run's failure for job id on stderr: why is valid UTF-8 (it is
 * made of parsed JSON strings); control characters become spaces so
 * that a message stays on its line. */
static void say_wrong(const char *id, const char *why)
{
    char line[600];
    size_t n = 0;
    for (; why[n] && n < sizeof(line) - 1; n++)
        line[n] = (unsigned char)why[n] < 0x20 || why[n] == 0x7f ? ' ' : why[n];
    /* Never cut a character in two: when the first byte left out
     * continues one, leave out its start too. */
    while (n > 0 && why[n] && ((unsigned char)why[n] & 0xc0) == 0x80) n--;
    line[n] = '\0';
    fprintf(stderr, "kinfer smoke: wrong result for %s: %s\n", id, line);
}

/* The entries of the Redis stream key, each as an array of its field and
 * value strings; NULL with why filled when it cannot be read or holds
 * bytes that are not UTF-8. */
static json_t *read_stream(redisContext *r, const char *key, char *why, size_t cap)
{
    const char *argv[] = {"XRANGE", key, "-", "+"};
    redisReply *rep = redisCommandArgv(r, 4, argv, NULL);
    if (!rep) {
        snprintf(why, cap, "stream: redis: %s", r->errstr);
        return NULL;
    }
    json_t *out = rep->type == REDIS_REPLY_ARRAY ? json_array() : NULL;
    if (!out) snprintf(why, cap, "stream: XRANGE did not answer an array");
    for (size_t i = 0; out && i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        const redisReply *f = e->type == REDIS_REPLY_ARRAY && e->elements == 2 ? e->element[1]
                                                                              : NULL;
        json_t *a = f && f->type == REDIS_REPLY_ARRAY ? json_array() : NULL;
        for (size_t k = 0; a && k < f->elements; k++) {
            const redisReply *s = f->element[k];
            json_t *v = s->type == REDIS_REPLY_STRING ? json_stringn(s->str, s->len) : NULL;
            if (!v || json_array_append_new(a, v) < 0) {
                json_decref(a);
                a = NULL;
            }
        }
        if (!a || json_array_append_new(out, a) < 0) {
            snprintf(why, cap, "stream: entry %zu is not field/value strings of UTF-8", i);
            json_decref(out);
            out = NULL;
        }
    }
    freeReplyObject(rep);
    return out;
}

/* The stream of a streamed job, read again (for up to 2 s) until its
 * last entry is done: the worker appends done as the job ends, the
 * result may come just before. */
static json_t *read_done_stream(redisContext *r, const struct kcfg *c, const char *id, char *why,
                                size_t cap)
{
    char key[512];
    snprintf(key, sizeof(key), "%s%s", c->redis.stream_prefix, id);
    for (int tries = 0;; tries++) {
        json_t *s = read_stream(r, key, why, cap);
        const json_t *last = json_array_get(s, json_array_size(s) - 1);
        const char *f = json_string_value(json_array_get(last, 0));
        if (!s || (f && strcmp(f, "done") == 0) || tries >= 40) return s;
        json_decref(s);
        usleep(50000);
    }
}

/* The start of a result's text (valid UTF-8) as a JSON string literal,
 * escapes and all, into buf: what the summary shows of the text. */
static void sample_text(char *buf, size_t cap, const json_t *text)
{
    const char *t = json_string_value(text);
    size_t n = json_string_length(text), keep = 0;
    while (keep < n && keep < 80) {
        size_t l = utf8_char_len((const unsigned char *)t + keep, n - keep, NULL);
        if (!l) break;
        keep += l;
    }
    json_t *v = json_stringn(t, keep);
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
    snprintf(buf, cap, "%s%s", s ? s : "", s && keep < n ? "..." : "");
    free(s);
    json_decref(v);
}

/* Takes a result body for job i: decodes and checks it, records what the
 * summary needs. Returns 1 when correct, 0 when not (said on stderr,
 * the first few times), -1 when Redis failed. */
static int take_result(const struct kcfg *c, redisContext *r, const struct smoke_opts *o,
                       const struct smoke_gen_model *m, unsigned seed, size_t i, const char *body,
                       size_t len, struct gjob *g, size_t *wrong, char *sample, size_t sample_cap)
{
    char id[64], why[512] = "";
    job_id(id, sizeof(id), seed, i);
    json_t *job = smoke_gen_job(seed, i, id, o->model);
    json_t *res = job ? smoke_gen_decode(body, len, why, sizeof(why)) : NULL;
    json_t *stream = NULL;
    int ok = 0;
    if (!job) snprintf(why, sizeof(why), "out of memory");
    const char *status = json_string_value(json_object_get(res, "status"));
    if (json_is_true(json_object_get(job, "stream")) && status && strcmp(status, "ok") == 0) {
        stream = read_done_stream(r, c, id, why, sizeof(why));
        if (!stream && r->err) {
            json_decref(res);
            json_decref(job);
            fprintf(stderr, "kinfer smoke: redis: %s\n", r->errstr);
            return -1;
        }
    }
    const json_t *timing = json_object_get(res, "timing");
    g->lat_ms = json_number_value(json_object_get(timing, "total_ms"));
    g->ttft_ms = json_number_value(json_object_get(timing, "ttft_ms"));
    if (res && (!json_is_true(json_object_get(job, "stream")) || stream || !why[0]))
        ok = smoke_gen_check(job, res, stream, m, why, sizeof(why)) == 0;
    if (ok) {
        static const char *const fins[] = {"eos", "stop", "length"};
        const char *fin = json_string_value(json_object_get(res, "finish_reason"));
        const json_t *toks = json_object_get(res, "tokens");
        uint64_t h = 1469598103934665603ull;
        for (size_t k = 0; k < json_array_size(toks); k++) {
            h ^= (uint64_t)json_integer_value(json_array_get(toks, k));
            h *= 1099511628211ull;
        }
        g->tok_hash = h;
        g->n_tokens = (uint32_t)json_array_size(toks);
        for (size_t k = 0; k < 3; k++)
            if (strcmp(fin, fins[k]) == 0) g->fin = fins[k];
        if (!sample[0] && json_string_length(json_object_get(res, "text")) > 0)
            sample_text(sample, sample_cap, json_object_get(res, "text"));
    } else if ((*wrong)++ < 5) {
        say_wrong(id, why[0] ? why : "no reason");
    }
    g->got = 1;
    g->ok = (uint8_t)ok;
    json_decref(stream);
    json_decref(res);
    json_decref(job);
    return ok;
}

/* Sends every job; returns 0, or -1 (said on stderr). */
static int send_jobs(const struct kcfg *c, rd_kafka_t *rk, const struct smoke_opts *o,
                     unsigned seed, size_t *streamed, volatile sig_atomic_t *stop)
{
    double t0 = now_s();
    for (size_t i = 0; i < o->jobs && !*stop; i++) {
        char id[64];
        job_id(id, sizeof(id), seed, i);
        json_t *job = smoke_gen_job(seed, i, id, o->model);
        enum proto_enc enc = o->json_every && i % (size_t)o->json_every == 0 ? PROTO_ENC_JSON
                                                                             : PROTO_ENC_MSGPACK;
        unsigned char *body = NULL;
        size_t len = 0;
        if (json_is_true(json_object_get(job, "stream"))) (*streamed)++;
        int rc = job ? smoke_gen_encode(job, enc, &body, &len) : -1;
        json_decref(job);
        if (rc < 0) {
            fprintf(stderr, "kinfer smoke: out of memory\n");
            return -1;
        }
        rd_kafka_resp_err_t e;
        while ((e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(c->kafka.topics[0]),
                                      RD_KAFKA_V_KEY(id, strlen(id)), RD_KAFKA_V_VALUE(body, len),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(rk, 10);
        free(body);
        if (e) {
            fprintf(stderr, "kinfer smoke: produce: %s\n", rd_kafka_err2str(e));
            return -1;
        }
        rd_kafka_poll(rk, 0);
        if (o->rate > 0) {
            double due = t0 + (double)(i + 1) / o->rate;
            while (now_s() < due) usleep(200);
        }
    }
    rd_kafka_flush(rk, 10000);
    return 0;
}

/* The summary lines (stdout). */
static void summary(const struct kcfg *c, const struct smoke_opts *o, const struct gjob *g,
                    size_t got, size_t ok, size_t wrong, size_t streamed, size_t twins,
                    size_t twins_same, double secs)
{
    size_t fin[3] = {0, 0, 0}, tokens = 0, n = 0;
    double *lat = malloc((got + 1) * sizeof(double)), *ttft = malloc((got + 1) * sizeof(double));
    for (size_t i = 0; i < o->jobs; i++) {
        if (!g[i].ok) continue;
        tokens += g[i].n_tokens;
        fin[0] += g[i].fin && !strcmp(g[i].fin, "eos");
        fin[1] += g[i].fin && !strcmp(g[i].fin, "stop");
        fin[2] += g[i].fin && !strcmp(g[i].fin, "length");
        if (lat && ttft) lat[n] = g[i].lat_ms, ttft[n] = g[i].ttft_ms;
        n++;
    }
    printf("kinfer smoke: jobs=%zu results=%zu ok=%zu wrong=%zu missing=%zu (generation: "
           "%zu streamed)\n", o->jobs, got, ok, wrong, o->jobs - got, streamed);
    printf("kinfer smoke: finish_reason eos=%zu stop=%zu length=%zu; same seed, same tokens: "
           "%zu of %zu pairs\n", fin[0], fin[1], fin[2], twins_same, twins);
    if (n && lat && ttft) {
        qsort(lat, n, sizeof(double), cmp_double);
        qsort(ttft, n, sizeof(double), cmp_double);
        size_t p50 = (n - 1) / 2, p99 = (size_t)((double)(n - 1) * 0.99);
        printf("kinfer smoke: latency_ms p50=%.1f p99=%.1f max=%.1f (record timestamp to "
               "result); ttft_ms p50=%.1f p99=%.1f\n", lat[p50], lat[p99], lat[n - 1], ttft[p50],
               ttft[p99]);
        printf("kinfer smoke: %zu tokens generated, %.1f tokens/s and %.1f jobs/s end to end\n",
               tokens, (double)tokens / secs, (double)got / secs);
    }
    free(lat);
    free(ttft);
    char dev[300];
    smoke_worker_device(c, dev, sizeof(dev));
    printf("kinfer smoke: the worker ran them on %s\n", dev);
}

int smoke_gen_run(const struct kcfg *c, int di, const struct smoke_opts *o,
                  volatile sig_atomic_t *stop)
{
    char why[512];
    struct smoke_gen_model m;
    if (smoke_gen_model_read(c->models[di].path, &m, why, sizeof(why)) < 0) {
        fprintf(stderr, "kinfer smoke: %s\n", why);
        return 1;
    }
    int rc = 1, produce_failed = 0;
    size_t streamed = 0;
    struct gjob *g = calloc(o->jobs, sizeof(*g));
    rd_kafka_t *rk = g ? smoke_producer(c, &produce_failed) : NULL;
    struct timeval tv = {2, 0};
    redisContext *r = rk ? redisConnectWithTimeout(c->redis.host, c->redis.port, tv) : NULL;
    if (!g) fprintf(stderr, "kinfer smoke: out of memory\n");
    if (rk && (!r || r->err))
        fprintf(stderr, "kinfer smoke: redis %s:%d: %s\n", c->redis.host, c->redis.port,
                r ? r->errstr : "out of memory");
    if (!g || !rk || !r || r->err) goto out;
    redisSetTimeout(r, tv);

    /* Ids are unique per run so old results in Redis never count. */
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    double t0 = now_s();
    if (send_jobs(c, rk, o, seed, &streamed, stop) < 0 || produce_failed) goto out;
    fprintf(stderr, "kinfer smoke: sent %zu generation jobs to %s in %.2f s; waiting for "
            "results in Redis\n", o->jobs, c->kafka.topics[0], now_s() - t0);

    /* Collect: pipelined GET of every missing id, every 50 ms. */
    size_t got = 0, ok = 0, wrong = 0, plen = strlen(c->redis.key_prefix);
    char sample[256] = "";
    double deadline = now_s() + o->timeout_s;
    while (got < o->jobs && now_s() < deadline && !*stop) {
        size_t asked = 0;
        for (size_t i = 0; i < o->jobs; i++) {
            if (g[i].got) continue;
            char id[64], key[512];
            job_id(id, sizeof(id), seed, i);
            snprintf(key, sizeof(key), "%s%s", c->redis.key_prefix, id);
            const char *argv[] = {"GET", key};
            size_t lens[] = {3, plen + strlen(id)};
            redisAppendCommandArgv(r, 2, argv, lens);
            asked++;
        }
        /* Every reply is read before a stream is: XRANGE must not land
         * in the middle of the pipeline. */
        redisReply **reps = calloc(asked + 1, sizeof(*reps));
        size_t *which = calloc(asked + 1, sizeof(*which));
        size_t n_reps = 0;
        int failed = !reps || !which;
        for (size_t i = 0; i < o->jobs && n_reps < asked && !failed; i++) {
            if (g[i].got) continue;
            void *v;
            if (redisGetReply(r, &v) != REDIS_OK) {
                fprintf(stderr, "kinfer smoke: redis: %s\n", r->errstr);
                failed = 1;
                break;
            }
            which[n_reps] = i;
            reps[n_reps++] = v;
        }
        for (size_t k = 0; k < n_reps; k++) {
            redisReply *rep = reps[k];
            if (!failed && rep->type == REDIS_REPLY_STRING) {
                int t = take_result(c, r, o, &m, seed, which[k], rep->str, rep->len,
                                    &g[which[k]], &wrong, sample, sizeof(sample));
                if (t < 0) failed = 1;
                got += t >= 0;
                ok += t > 0;
            }
            freeReplyObject(rep);
        }
        free(reps);
        free(which);
        if (failed) goto out;
        if (got < o->jobs) usleep(50000);
    }
    double secs = now_s() - t0;
    size_t twins = 0, twins_same = 0;
    for (size_t i = 1; i < o->jobs; i++) {
        if (!smoke_gen_twin(i) || !g[i].ok || !g[i - 1].ok) continue;
        twins++;
        if (g[i].tok_hash == g[i - 1].tok_hash && g[i].n_tokens == g[i - 1].n_tokens) {
            twins_same++;
        } else {
            char id[64];
            job_id(id, sizeof(id), seed, i);
            if (wrong++ < 5) say_wrong(id, "other tokens than the same job with the same seed");
            g[i].ok = 0;
            ok--;
        }
    }
    summary(c, o, g, got, ok, wrong, streamed, twins, twins_same, secs);
    if (sample[0]) printf("kinfer smoke: a text it generated: %s\n", sample);
    rc = ok == o->jobs ? 0 : 1;
out:
    if (rk) rd_kafka_destroy(rk);
    if (r) redisFree(r);
    free(g);
    return rc;
}

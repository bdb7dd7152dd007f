/* test_faults.c - the fault suite of reliability.md, against real parts:
 * `kinfer broker` (its own process, so killing the worker leaves the
 * cluster up), a real redis-server (with an append-only file, so a Redis
 * restart keeps what it acknowledged), and the worker binary. Each test
 * produces jobs whose correct outputs the test computes in float64,
 * injects its fault, lets the worker drain, then runs one checker that
 * counts per job id:
 *   lost       no correct result in Redis, none on the reply topic, and
 *              not dead-lettered;
 *   wrong      any result, in Redis or on the reply topic, with values off
 *              the reference;
 *   duplicates reply-topic records beyond the first for an id;
 *   rewinds    a partition's committed offset moving backwards (sampled by
 *              a thread every 100 ms for the whole test).
 * The figures go to stderr (lines starting FIGURES) for
 * docs/reliability.md. `make test-faults` runs it (minutes); `make test`
 * does not. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "harness.h"
#include "refmlp.h"
#include "testutil.h"

#define IN_W 8
#define HID_W 16
#define OUT_W 4
#define PARTS 8

static char brokers[512];
static int redis_port;
static pid_t redis_pid;
static char model_path[300];
static struct ref_mlp reference_model; /* the demo model, in float64 */

static const char *kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}

/* ---- reference model ------------------------------------------------------ */

/* Writes the demo model with known random weights and keeps them here in
 * float64 (the file stores float32: the same rounded values are used). */
static void make_model(void)
{
    snprintf(model_path, sizeof(model_path), "%s/model.safetensors", h_dir());
    char err[256];
    uint64_t seed = tu_rand64();
    assert_int_equal(model_write_demo(model_path, IN_W, HID_W, OUT_W, seed, err, sizeof(err)), 0);
    ref_mlp_load(&reference_model, model_path);
}

static void reference(const float *in, double *out)
{
    ref_mlp_forward(&reference_model, in, 1, out);
}

/* ---- a run: jobs, worker, checker ---------------------------------------- */

struct run {
    const char *name;
    char topic[64], reply[64], dlq[64], group[64], prefix[64], cfg[300];
    size_t n;
    char (*ids)[32];
    float (*in)[IN_W];
    pid_t worker;
    const char *poison_id; /* this id is answered inference_failed, on purpose */
    /* committed-offset sampler */
    pthread_t sampler;
    atomic_int sampling;
    long long last_committed[PARTS];
    atomic_int rewinds;
};

static void run_init(struct run *r, const char *name, size_t n, const char *extra_cfg)
{
    memset(r, 0, sizeof(*r));
    r->name = name;
    snprintf(r->topic, sizeof(r->topic), "%s.jobs", name);
    snprintf(r->reply, sizeof(r->reply), "%s.results", name);
    snprintf(r->dlq, sizeof(r->dlq), "%s.dlq", name);
    snprintf(r->group, sizeof(r->group), "g-%s", name);
    snprintf(r->prefix, sizeof(r->prefix), "%s:", name);
    r->n = n;
    r->ids = calloc(n, sizeof(*r->ids));
    r->in = calloc(n, sizeof(*r->in));
    for (size_t i = 0; i < n; i++) {
        snprintf(r->ids[i], sizeof(r->ids[i]), "%s-%zu", name, i);
        for (int k = 0; k < IN_W; k++) r->in[i][k] = tu_randf(-2, 2);
    }
    for (int p = 0; p < PARTS; p++) r->last_committed[p] = -1;
    snprintf(r->cfg, sizeof(r->cfg), "%s/%s.cfg", h_dir(), name);
    FILE *f = fopen(r->cfg, "w");
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"%s\"; topics = [ \"%s\" ];\n"
            "  reply_topic = \"%s\"; dlq_topic = \"%s\";\n"
            "  properties = ( ( \"auto.commit.interval.ms\", \"100\" ),\n"
            "                 ( \"fetch.wait.max.ms\", \"10\" ),\n"
            "                 ( \"session.timeout.ms\", \"6000\" ),\n"
            "                 ( \"heartbeat.interval.ms\", \"500\" ) ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"%s\"; timeout_ms = 500; };\n"
            "batching = { max_batch_rows = 16; max_wait_ms = 5; max_queued_rows = 256; max_job_rows = 64; };\n"
            "worker = { drain_timeout_ms = 5000; };\n"
            "metrics = { listen = \"\"; heartbeat_prefix = \"\"; };\n"
            "models = ( { name = \"demo\"; path = \"%s\";\n"
            "  layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
            "             { op = \"relu\"; },\n"
            "             { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); } );\n"
            "%s\n",
            brokers, r->group, r->topic, r->reply, r->dlq, redis_port, r->prefix, model_path,
            extra_cfg ? extra_cfg : "");
    fclose(f);
}

static void run_fini(struct run *r)
{
    free(r->ids);
    free(r->in);
}

static void produce_jobs(struct run *r)
{
    rd_kafka_t *p = h_producer(brokers);
    for (size_t i = 0; i < r->n; i++) {
        struct wire_job j = {.id = r->ids[i], .input = r->in[i], .n_input = IN_W,
                             .timeout_ms = -1, .priority = -1};
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, JOB_ENC_MSGPACK, &body, &len), 0);
        assert_int_equal(h_produce(p, r->topic, r->ids[i], strlen(r->ids[i]), body, len, NULL), 0);
        free(body);
    }
    assert_int_equal(rd_kafka_flush(p, 30000), 0);
    rd_kafka_destroy(p);
}

/* Starts the worker with up to four --set overrides (NULL-terminated). */
static pid_t start_worker_with(struct run *r, const char *const *sets)
{
    char log[300];
    snprintf(log, sizeof(log), "%s/%s.worker.log", h_dir(), r->name);
    char *argv[16] = {(char *)kinfer_bin(), "worker", "-c", r->cfg};
    int n = 4;
    for (int i = 0; sets && sets[i] && n < 14; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n] = NULL;
    r->worker = h_spawn(argv, NULL, log);
    return r->worker;
}

static pid_t start_worker(struct run *r)
{
    return start_worker_with(r, NULL);
}

/* Samples the group's committed offsets; any decrease is a rewind. */
static void *sampler_main(void *arg)
{
    struct run *r = arg;
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", r->group, err, sizeof(err));
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    while (atomic_load(&r->sampling)) {
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(PARTS);
        for (int p = 0; p < PARTS; p++) rd_kafka_topic_partition_list_add(l, r->topic, p);
        if (rd_kafka_committed(c, l, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            for (int p = 0; p < PARTS; p++) {
                long long off = l->elems[p].offset;
                if (off >= 0 && off < r->last_committed[p]) {
                    fprintf(stderr, "%s: partition %d committed offset went back %lld -> %lld\n",
                            r->name, p, r->last_committed[p], off);
                    atomic_fetch_add(&r->rewinds, 1);
                }
                if (off >= 0) r->last_committed[p] = off;
            }
        }
        rd_kafka_topic_partition_list_destroy(l);
        h_sleep_ms(100);
    }
    rd_kafka_destroy(c);
    return NULL;
}

static void start_sampler(struct run *r)
{
    atomic_store(&r->sampling, 1);
    pthread_create(&r->sampler, NULL, sampler_main, r);
}

static void stop_sampler(struct run *r)
{
    atomic_store(&r->sampling, 0);
    pthread_join(r->sampler, NULL);
}

/* Result values against the reference: 1e-5 * max(1, |ref|), as in the
 * integration test (float32 through two small GEMMs). The run's poison
 * job is right when answered inference_failed instead. */
static int result_ok(const struct run *r, size_t i, const struct wire_result *res);
static int values_ok(const struct wire_result *res, const float *in)
{
    if (!res->ok || res->rows != 1 || res->width != OUT_W || !res->output) return 0;
    double ref[OUT_W];
    reference(in, ref);
    for (int k = 0; k < OUT_W; k++)
        if (fabs((double)res->output[k] - ref[k]) > 1e-5 * fmax(1.0, fabs(ref[k]))) return 0;
    return 1;
}

static int result_ok(const struct run *r, size_t i, const struct wire_result *res)
{
    if (r->poison_id && strcmp(r->ids[i], r->poison_id) == 0)
        return !res->ok && strcmp(res->code, "inference_failed") == 0;
    return values_ok(res, r->in[i]);
}

/* Waits up to timeout_s until Redis holds a result for every id (the
 * cheap signal that the run is over). Returns how many it holds. */
static size_t wait_all(struct run *r, double timeout_s)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    size_t have = 0;
    double until = h_now() + timeout_s;
    const char **argv = calloc(r->n + 1, sizeof(char *));
    char (*keys)[64] = calloc(r->n, sizeof(*keys));
    argv[0] = "EXISTS";
    for (size_t i = 0; i < r->n; i++) {
        snprintf(keys[i], sizeof(keys[i]), "%s%s", r->prefix, r->ids[i]);
        argv[i + 1] = keys[i];
    }
    do {
        redisReply *rep = c && !c->err ? redisCommandArgv(c, (int)r->n + 1, argv, NULL) : NULL;
        if (rep) {
            have = (size_t)rep->integer;
            freeReplyObject(rep);
        } else {
            if (c) redisFree(c);
            c = redisConnect("127.0.0.1", redis_port);
        }
        if (have >= r->n || h_now() >= until) break;
        h_sleep_ms(200);
    } while (1);
    free(argv);
    free(keys);
    if (c) redisFree(c);
    return have;
}

struct verdict {
    size_t lost, wrong, dup_total, dup_max, dead, in_redis, on_topic;
};

/* The checker: Redis, the whole reply topic and the DLQ against the ids. */
static struct verdict check(struct run *r)
{
    struct verdict v = {0};
    size_t n = r->n;
    int *redis_ok = calloc(n, sizeof(int)), *topic_ok = calloc(n, sizeof(int));
    int *topic_cnt = calloc(n, sizeof(int)), *dead = calloc(n, sizeof(int));
    /* Redis, pipelined GETs. */
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    assert_true(c && !c->err);
    for (size_t i = 0; i < n; i++) redisAppendCommand(c, "GET %s%s", r->prefix, r->ids[i]);
    for (size_t i = 0; i < n; i++) {
        void *rv;
        assert_int_equal(redisGetReply(c, &rv), REDIS_OK);
        redisReply *rep = rv;
        if (rep->type == REDIS_REPLY_STRING) {
            struct wire_result res;
            char err[256];
            if (wire_decode_result(rep->str, rep->len, &res, err, sizeof(err)) == 0) {
                if (result_ok(r, i, &res)) redis_ok[i] = 1;
                else v.wrong++;
                wire_result_fini(&res);
            }
            v.in_redis++;
        }
        freeReplyObject(rep);
    }
    redisFree(c);
    /* The reply topic and the DLQ, read to their ends. */
    const char *topics[2] = {r->reply, r->dlq};
    for (int t = 0; t < 2; t++) {
        rd_kafka_t *rd = h_reader(brokers, topics[t]);
        double quiet_until = h_now() + 8;
        while (h_now() < quiet_until) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rd, 200);
            if (!m) continue;
            if (!m->err && m->key) {
                quiet_until = h_now() + 3;
                /* ids are NAME-<i> */
                char key[64];
                snprintf(key, sizeof(key), "%.*s", (int)m->key_len, (const char *)m->key);
                const char *dash = strrchr(key, '-');
                size_t i = dash ? strtoul(dash + 1, NULL, 10) : n;
                if (i < n && strcmp(key, r->ids[i]) == 0) {
                    if (t == 1) {
                        dead[i] = 1;
                    } else {
                        topic_cnt[i]++;
                        struct wire_result res;
                        char err[256];
                        if (wire_decode_result(m->payload, m->len, &res, err, sizeof(err)) == 0) {
                            if (result_ok(r, i, &res)) topic_ok[i] = 1;
                            else v.wrong++;
                            wire_result_fini(&res);
                        }
                    }
                }
            }
            rd_kafka_message_destroy(m);
        }
        rd_kafka_consumer_close(rd);
        rd_kafka_destroy(rd);
    }
    for (size_t i = 0; i < n; i++) {
        if (!redis_ok[i] && !topic_ok[i] && !dead[i]) {
            if (v.lost < 5) fprintf(stderr, "%s: lost %s\n", r->name, r->ids[i]);
            v.lost++;
        }
        if (topic_cnt[i] > 1) {
            v.dup_total += (size_t)topic_cnt[i] - 1;
            if ((size_t)topic_cnt[i] - 1 > v.dup_max) v.dup_max = (size_t)topic_cnt[i] - 1;
        }
        v.on_topic += topic_cnt[i] > 0;
        v.dead += dead[i];
    }
    free(redis_ok);
    free(topic_ok);
    free(topic_cnt);
    free(dead);
    fprintf(stderr,
            "FIGURES %s: jobs=%zu lost=%zu wrong=%zu duplicates_total=%zu duplicates_max=%zu "
            "rewinds=%d in_redis=%zu on_reply_topic=%zu dead_lettered=%zu\n",
            r->name, n, v.lost, v.wrong, v.dup_total, v.dup_max, atomic_load(&r->rewinds),
            v.in_redis, v.on_topic, v.dead);
    return v;
}

/* ---- Redis that survives a restart ------------------------------------------ */

static pid_t start_redis_on(int port)
{
    char p[16], log[300], dir[300];
    snprintf(p, sizeof(p), "%d", port);
    snprintf(log, sizeof(log), "%s/redis.log", h_dir());
    snprintf(dir, sizeof(dir), "%s", h_dir());
    /* appendfsync always: what Redis acknowledged survives its restart. */
    char *argv[] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "yes", "--appendfsync", "always", "--dir", dir, NULL};
    pid_t pid = h_spawn(argv, NULL, log);
    for (int i = 0; i < 400; i++) {
        redisContext *c = redisConnect("127.0.0.1", port);
        int ok = 0;
        if (c && !c->err) {
            redisReply *rep = redisCommand(c, "PING");
            ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep) freeReplyObject(rep);
        }
        if (c) redisFree(c);
        if (ok) return pid;
        h_sleep_ms(25);
    }
    return -1;
}

/* ---- the tests -------------------------------------------------------------- */

/* How many of the run's ids have a result in Redis now. */
static size_t results_now(struct run *r)
{
    return wait_all(r, 0);
}

/* kill -9 mid-batch, repeatedly, restarting each time: each kill comes
 * once the new worker has made progress (so it is mid-load, not mid-join). */
static void test_crash_kill9_repeatedly(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "crash", 5000, NULL);
    produce_jobs(&r);
    start_sampler(&r);
    start_worker(&r);
    int kills = 0;
    for (int k = 0; k < 6; k++) {
        size_t before = results_now(&r);
        double until = h_now() + 60;
        size_t step = 150 + tu_rand64() % 300;
        while (h_now() < until && results_now(&r) < before + step && results_now(&r) < r.n)
            h_sleep_ms(20);
        if (results_now(&r) >= r.n) break;
        h_stop(r.worker, SIGKILL, 5);
        kills++;
        start_worker(&r);
    }
    size_t have = wait_all(&r, 180);
    fprintf(stderr, "crash: %d kill -9 cycles, %zu of %zu results in Redis\n", kills, have, r.n);
    assert_true(kills >= 3);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* Redis stopped for 10 s mid-load, then restarted (with what it had
 * acknowledged): nothing lost, committed offsets never rewind. */
static void test_redis_outage(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "rdown", 3000, NULL);
    produce_jobs(&r);
    start_sampler(&r);
    start_worker(&r);
    h_sleep_ms(1500);
    assert_int_equal(h_stop(redis_pid, SIGTERM, 10), 0);
    double t0 = h_now();
    h_sleep_ms(10000);
    redis_pid = start_redis_on(redis_port);
    assert_true(redis_pid > 0);
    fprintf(stderr, "rdown: Redis down for %.1f s\n", h_now() - t0);
    size_t have = wait_all(&r, 120);
    assert_int_equal(have, r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* Redis stops answering (SIGSTOP): the worker must not hang. A SIGTERM
 * during the blackhole still ends it within its drain bound, and what it
 * could not write is run again after Redis comes back. */
static void test_redis_blackhole(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "rhole", 2000, NULL);
    produce_jobs(&r);
    start_sampler(&r);
    start_worker(&r);
    h_sleep_ms(1500);
    kill(redis_pid, SIGSTOP);
    h_sleep_ms(3000);
    double t0 = h_now();
    int st = h_stop(r.worker, SIGTERM, 30);
    double took = h_now() - t0;
    fprintf(stderr, "rhole: SIGTERM during the blackhole: exit %d after %.1f s "
            "(drain_timeout_ms 5000, Redis timeout 500 ms)\n", st, took);
    assert_int_equal(st, 0);
    assert_true(took < 20);
    kill(redis_pid, SIGCONT);
    start_worker(&r);
    assert_int_equal(wait_all(&r, 120), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* SIGTERM mid-load: jobs finished before the signal are not run again. */
static void test_sigterm_no_duplicates(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "term", 4000, NULL);
    produce_jobs(&r);
    start_sampler(&r);
    start_worker(&r);
    h_sleep_ms(2500);
    double t0 = h_now();
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    fprintf(stderr, "term: SIGTERM exit after %.2f s\n", h_now() - t0);
    start_worker(&r);
    assert_int_equal(wait_all(&r, 120), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(v.dup_total, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* A job that kills the worker every time (debug.crash_id): its attempt
 * counter makes it a suspect after the first crash (it runs alone, so its
 * batch-mates finish) and it is answered inference_failed once counted
 * more than worker.max_attempts (3) times; the partition moves on. */
static void test_poison_crash_loop(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "poison", 400, NULL);
    r.poison_id = r.ids[150];
    char set[64];
    snprintf(set, sizeof(set), "debug.crash_id=%s", r.poison_id);
    const char *sets[] = {set, NULL};
    produce_jobs(&r);
    start_sampler(&r);
    start_worker_with(&r, sets);
    int crashes = 0, st;
    double until = h_now() + 150;
    while (h_now() < until && results_now(&r) < r.n) {
        if (h_exited(r.worker, &st)) {
            crashes++;
            fprintf(stderr, "poison: worker exited %d (crash %d); restarting\n", st, crashes);
            assert_true(crashes <= 6);
            start_worker_with(&r, sets);
        }
        h_sleep_ms(50);
    }
    assert_int_equal(results_now(&r), r.n);
    fprintf(stderr, "poison: %d crashes before the job was answered\n", crashes);
    assert_true(crashes >= 1 && crashes <= 4); /* max_attempts = 3 */
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* An executor that never returns (debug.hang_id): the watchdog ends the
 * process within its bound; the restart loses nothing. */
static void test_hung_executor_watchdog(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "hang", 600, NULL);
    char set[64];
    snprintf(set, sizeof(set), "debug.hang_id=%s", r.ids[300]);
    const char *sets[] = {set, "metrics.watchdog_ms=2000", "metrics.heartbeat_interval_ms=500",
                          NULL};
    produce_jobs(&r);
    start_sampler(&r);
    start_worker_with(&r, sets);
    int st = -1;
    double t0 = h_now(), exited_at = 0;
    while (h_now() < t0 + 90) {
        if (h_exited(r.worker, &st)) {
            exited_at = h_now();
            break;
        }
        h_sleep_ms(50);
    }
    assert_true(exited_at > 0);
    assert_int_equal(st, 2);
    char log[300], line[512];
    snprintf(log, sizeof(log), "%s/hang.worker.log", h_dir());
    FILE *f = fopen(log, "r");
    double hung = 0;
    int saw_exit = 0;
    while (f && fgets(line, sizeof(line), f)) {
        if (strstr(line, "event=debug_hang")) hung = 1;
        if (strstr(line, "event=watchdog_exit")) saw_exit = 1;
    }
    if (f) fclose(f);
    assert_true(hung && saw_exit);
    fprintf(stderr, "hang: worker exited %d, %.1f s after start (watchdog_ms 2000)\n", st,
            exited_at - t0);
    start_worker(&r); /* without the failpoint */
    assert_int_equal(wait_all(&r, 120), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* Each batch takes twice max.poll.interval.ms: the poll thread keeps
 * polling, so the worker is never evicted from its group. */
static void test_slow_executor_no_eviction(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "slow", 48, NULL);
    const char *sets[] = {"debug.batch_sleep_ms=12000", "kafka.properties.max.poll.interval.ms=6000",
                          NULL};
    produce_jobs(&r);
    start_sampler(&r);
    start_worker_with(&r, sets);
    assert_int_equal(wait_all(&r, 240), r.n);
    assert_int_equal(h_stop(r.worker, SIGTERM, 60), 0);
    stop_sampler(&r);
    char log[300], line[1024];
    snprintf(log, sizeof(log), "%s/slow.worker.log", h_dir());
    FILE *f = fopen(log, "r");
    int assigned = 0, lost_or_revoked = 0, poll_exceeded = 0;
    while (f && fgets(line, sizeof(line), f)) {
        if (strstr(line, "event=partitions_assigned")) assigned++;
        if (strstr(line, "event=partitions_lost")) lost_or_revoked++;
        if (strstr(line, "MAXPOLL") || strstr(line, "max.poll.interval.ms")) poll_exceeded++;
    }
    if (f) fclose(f);
    fprintf(stderr, "slow: assignments=%d lost=%d max.poll.interval warnings=%d\n", assigned,
            lost_or_revoked, poll_exceeded);
    assert_int_equal(assigned, 1);
    assert_int_equal(lost_or_revoked, 0);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    run_fini(&r);
}

/* Hostile records among good jobs: each is dead-lettered or answered
 * invalid_input, the worker does not crash, and the good jobs are right. */
static void test_hostile_input(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "hostile", 200, NULL);
    const char *sets[] = {"worker.max_payload_bytes=65536", NULL};
    start_sampler(&r);
    rd_kafka_t *p = h_producer(brokers);
    static unsigned char big[100000];
    memset(big, 0x41, sizeof(big));
    unsigned char deep[64] = {0x81, 0xa4, 'm', 'e', 't', 'a'};
    for (int i = 6; i < 46; i++) deep[i] = 0x91;
    deep[46] = 0xc0;
    unsigned char chain[96];
    for (int i = 0; i < 32; i++) memcpy(chain + 3 * i, "\xdc\xff\xff", 3);
    char longid[10300];
    int n = snprintf(longid, sizeof(longid), "{\"id\":\"");
    memset(longid + n, 'x', 10000);
    n += 10000;
    n += snprintf(longid + n, sizeof(longid) - (size_t)n, "\",\"input\":[1,2,3,4,5,6,7,8]}");
    const char *nan_json = "{\"id\":\"hostile-nan\",\"input\":[1,2,3,NaN,5,6,7,8]}";
    struct {
        const void *p;
        size_t len;
    } bad[] = {
        {"\xdf\x10\x00\x00\x00", 5}, {chain, sizeof(chain)},  {deep, 47},
        {longid, (size_t)n},         {"\x81\xa2id", 4},       {big, sizeof(big)},
        {nan_json, strlen(nan_json)}, {"{\"id\":7,\"input\":\"x\"}", 21},
    };
    size_t nb = sizeof(bad) / sizeof(bad[0]);
    for (size_t i = 0; i < r.n; i++) {
        if (i % 25 == 0 && i / 25 < nb)
            assert_int_equal(h_produce(p, r.topic, NULL, 0, bad[i / 25].p, bad[i / 25].len, NULL), 0);
        struct wire_job j = {.id = r.ids[i], .input = r.in[i], .n_input = IN_W,
                             .timeout_ms = -1, .priority = -1};
        if (i == 199) j.n_input = IN_W - 3; /* wrong width: answered invalid_input */
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, JOB_ENC_MSGPACK, &body, &len), 0);
        assert_int_equal(h_produce(p, r.topic, r.ids[i], strlen(r.ids[i]), body, len, NULL), 0);
        free(body);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);
    start_worker_with(&r, sets);
    assert_int_equal(wait_all(&r, 60), r.n);
    h_sleep_ms(500);
    int st;
    assert_false(h_exited(r.worker, &st)); /* still alive */
    char status[64];
    snprintf(status, sizeof(status), "/proc/%d/status", (int)r.worker);
    FILE *f = fopen(status, "r");
    char line[256];
    long hwm = 0;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6)) hwm = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    /* The last job had the wrong width: check it is invalid_input, then
     * judge the others with the checker. */
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    redisReply *rep = redisCommand(c, "GET %s%s", r.prefix, r.ids[199]);
    struct wire_result res;
    char err[256];
    assert_int_equal(wire_decode_result(rep->str, rep->len, &res, err, sizeof(err)), 0);
    assert_string_equal(res.code, "invalid_input");
    wire_result_fini(&res);
    freeReplyObject(rep);
    redisFree(c);
    r.n = 199;
    struct verdict v = check(&r);
    /* Dead letters carry no id of ours: count them on the DLQ directly. */
    rd_kafka_t *rd = h_reader(brokers, r.dlq);
    size_t dead = 0;
    double quiet = h_now() + 6;
    while (h_now() < quiet) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rd, 200);
        if (!m) continue;
        if (!m->err) dead++, quiet = h_now() + 2;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rd);
    rd_kafka_destroy(rd);
    fprintf(stderr, "FIGURES hostile-extra: hostile=%zu dead_lettered=%zu peak_rss_kb=%ld\n", nb,
            dead, hwm);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    /* Records with no usable id are dead-lettered; the NaN one has an id
     * and is answered invalid_input instead. */
    assert_true(dead >= nb - 1);
    run_fini(&r);
}

/* Soak: sustained load for 40 s; after a 10 s warm-up the worker's RSS and
 * open file descriptors stay flat. */
static void test_soak_flat(void **state)
{
    (void)state;
    struct run r;
    run_init(&r, "soak", 24000, NULL);
    start_sampler(&r);
    start_worker(&r);
    rd_kafka_t *p = h_producer(brokers);
    double t0 = h_now();
    long rss_warm = 0, fds_warm = 0, rss_end = 0, fds_end = 0;
    char path[64];
    for (size_t i = 0; i < r.n; i++) {
        struct wire_job j = {.id = r.ids[i], .input = r.in[i], .n_input = IN_W,
                             .timeout_ms = -1, .priority = -1};
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, JOB_ENC_MSGPACK, &body, &len), 0);
        assert_int_equal(h_produce(p, r.topic, r.ids[i], strlen(r.ids[i]), body, len, NULL), 0);
        free(body);
        /* 600 jobs/s for 40 s */
        double due = t0 + (double)(i + 1) / 600.0;
        while (h_now() < due) h_sleep_ms(1);
        if (!rss_warm && h_now() > t0 + 10) {
            snprintf(path, sizeof(path), "/proc/%d/status", (int)r.worker);
            FILE *f = fopen(path, "r");
            char line[256];
            while (f && fgets(line, sizeof(line), f))
                if (!strncmp(line, "VmRSS:", 6)) rss_warm = strtol(line + 6, NULL, 10);
            if (f) fclose(f);
            char cmd[64];
            snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)r.worker);
            FILE *pp = popen(cmd, "r");
            if (pp && fscanf(pp, "%ld", &fds_warm) != 1) fds_warm = -1;
            if (pp) pclose(pp);
        }
    }
    rd_kafka_flush(p, 10000);
    rd_kafka_destroy(p);
    assert_int_equal(wait_all(&r, 120), r.n);
    snprintf(path, sizeof(path), "/proc/%d/status", (int)r.worker);
    FILE *f = fopen(path, "r");
    char line[256];
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmRSS:", 6)) rss_end = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)r.worker);
    FILE *pp = popen(cmd, "r");
    if (pp && fscanf(pp, "%ld", &fds_end) != 1) fds_end = -1;
    if (pp) pclose(pp);
    fprintf(stderr, "FIGURES soak-extra: seconds=%.0f rss_kb_warm=%ld rss_kb_end=%ld fds_warm=%ld "
            "fds_end=%ld\n", h_now() - t0, rss_warm, rss_end, fds_warm, fds_end);
    assert_int_equal(h_stop(r.worker, SIGTERM, 30), 0);
    stop_sampler(&r);
    struct verdict v = check(&r);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_true(rss_warm > 0 && rss_end <= rss_warm + rss_warm / 4 + 8192);
    assert_true(fds_end <= fds_warm + 4);
    run_fini(&r);
}

static int setup(void **state)
{
    (void)state;
    make_model();
    char topics[2048] = "";
    const char *names[] = {"crash", "rdown", "rhole", "term", "hostile", "poison", "hang",
                           "slow", "soak"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char t[200];
        snprintf(t, sizeof(t), "%s%s.jobs,%s.results,%s.dlq", i ? "," : "", names[i], names[i],
                 names[i]);
        strcat(topics, t);
    }
    if (h_start_broker(kinfer_bin(), topics, PARTS, brokers, sizeof(brokers)) < 0) return -1;
    redis_port = h_free_port();
    redis_pid = start_redis_on(redis_port);
    if (redis_pid < 0) return -1;
    fprintf(stderr, "test_faults: broker %s, redis port %d, logs in %s\n", brokers, redis_port,
            h_dir());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kill(redis_pid, SIGCONT);
    h_kill_all();
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crash_kill9_repeatedly),
        cmocka_unit_test(test_redis_outage),
        cmocka_unit_test(test_redis_blackhole),
        cmocka_unit_test(test_sigterm_no_duplicates),
        cmocka_unit_test(test_poison_crash_loop),
        cmocka_unit_test(test_hung_executor_watchdog),
        cmocka_unit_test(test_slow_executor_no_eviction),
        cmocka_unit_test(test_hostile_input),
        cmocka_unit_test(test_soak_flat),
    };
    /* KINFER_TEST_FILTER=test_poison* runs only the matching tests. */
    const char *filter = getenv("KINFER_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}

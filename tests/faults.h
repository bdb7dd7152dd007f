/* faults.h - what the fault programs (faults_suite.c, faults_broker.c)
 * share: a run (one row's jobs with inputs whose correct outputs the test
 * knows, its topics, worker config and workers), a paced producer, a
 * sampler thread that counts committed-offset rewinds, and the checker that
 * counts per job id:
 *   lost       no correct result in Redis, none on the reply topic, and
 *              not dead-lettered;
 *   wrong      any result, in Redis or on the reply topic, with values off
 *              the float64 reference;
 *   duplicates reply-topic records beyond the first for an id;
 *   rewinds    a partition's committed offset moving backwards.
 * Header-only, static functions, on top of harness.h; each fault program
 * includes it once. The program's setup() fills f_brokers and f_redis_port
 * (its cluster and Redis are its own) and calls f_make_model; the f_
 * settings below say how its runs differ. Helpers assert with cmocka, so
 * they belong to the test thread, except the two thread bodies. */
#ifndef KINFER_FAULTS_H
#define KINFER_FAULTS_H

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

/* Every helper is static and may go unused by a given fault program. */
#define F_FN static __attribute__((unused))

#define F_IN_W 8
#define F_HID_W 16
#define F_OUT_W 4
#define F_PARTS 8

static char f_brokers[512];  /* the cluster's bootstrap list */
static int f_redis_port;
static char f_model_path[300];
static struct ref_mlp f_model; /* the demo model, in float64 */

/* How a program's runs differ, set by its setup() before the first run. */
/* The body of the worker config's `worker` group. */
static const char *f_worker_settings = "drain_timeout_ms = 5000;";
/* The group-membership properties of the workers' consumers: a short
 * session timeout so a dead member leaves the group in seconds. "" leaves
 * kinfer's own defaults (the crash-recovery row measures those). */
static const char *f_session_props =
    "( \"session.timeout.ms\", \"6000\" ), ( \"heartbeat.interval.ms\", \"500\" )";
/* The checker names the first few duplicated ids on stderr. */
static int f_list_duplicates;
/* The sampler's own librdkafka logs are off (its connection errors are
 * expected while brokers are down: stderr is kept for the figures). */
static int f_quiet_sampler;

/* The worker binary under test: $KINFER_BIN (make passes the instrumented
 * one), else the plain build. */
F_FN const char *f_kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}

/* KINFER_TEST_FILTER=test_poison* runs only the matching rows (a cmocka
 * glob); call before cmocka_run_group_tests. */
F_FN void f_filter_tests(void)
{
    const char *filter = getenv("KINFER_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
}

/* Writes "NAME.jobs,NAME.results,NAME.dlq" for each row name into buf, the
 * --topics list the cluster is started with. */
F_FN void f_topics(char *buf, size_t cap, const char *const *names, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s.jobs,%s.results,%s.dlq", i ? "," : "",
                         names[i], names[i], names[i]);
        if (w > 0) len += (size_t)w;
    }
}

/* ---- reference model ------------------------------------------------------ */

/* Writes the demo model with known random weights and keeps them here in
 * float64 (the file stores float32: the same rounded values are used), so
 * the checker can tell a right result from a wrong one. */
F_FN void f_make_model(void)
{
    snprintf(f_model_path, sizeof(f_model_path), "%s/model.safetensors", h_dir());
    char err[256];
    uint64_t seed = tu_rand64();
    assert_int_equal(
        model_write_demo(f_model_path, F_IN_W, F_HID_W, F_OUT_W, seed, err, sizeof(err)), 0);
    ref_mlp_load(&f_model, f_model_path);
}

/* ---- a run: jobs, workers, checker ---------------------------------------- */

/* One row's jobs, config, workers and measurements. */
struct f_run {
    const char *name;
    char topic[64], reply[64], dlq[64], group[64], prefix[64], cfg[300];
    size_t n;
    char (*ids)[32];
    float (*in)[F_IN_W];
    pid_t worker;
    const char *poison_id; /* this id is answered inference_failed, on purpose */
    /* committed-offset sampler */
    pthread_t sampler;
    atomic_int sampling;
    long long last_committed[F_PARTS];
    atomic_int rewinds;
    /* paced producer (f_produce_paced) */
    pthread_t producer;
    double rate;
    size_t burst;
    atomic_size_t produced;
};

/* Makes the run's ids and inputs and writes its worker config: topics of
 * its own, f_session_props (a short session timeout so a dead member
 * leaves the group in seconds), and no metrics port or heartbeat, so several workers can run
 * side by side. extra_cfg (may be NULL) is appended to the config. */
F_FN void f_run_init(struct f_run *r, const char *name, size_t n, const char *extra_cfg)
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
        for (int k = 0; k < F_IN_W; k++) r->in[i][k] = tu_randf(-2, 2);
    }
    for (int p = 0; p < F_PARTS; p++) r->last_committed[p] = -1;
    snprintf(r->cfg, sizeof(r->cfg), "%s/%s.cfg", h_dir(), name);
    FILE *f = fopen(r->cfg, "w");
    assert_non_null(f);
    /* KINFER_TEST_RDKAFKA_DEBUG=topic,fetch (say) gives the workers
     * librdkafka's debug logging, for a row that fails. */
    const char *dbg = getenv("KINFER_TEST_RDKAFKA_DEBUG");
    char dbg_prop[256] = "";
    if (dbg && *dbg && !strpbrk(dbg, "\"\\\n"))
        snprintf(dbg_prop, sizeof(dbg_prop), "( \"debug\", \"%s\" ),\n                 ", dbg);
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"%s\"; topics = [ \"%s\" ];\n"
            "  reply_topic = \"%s\"; dlq_topic = \"%s\";\n"
            "  properties = ( %s( \"auto.commit.interval.ms\", \"100\" ),\n"
            "                 ( \"fetch.wait.max.ms\", \"10\" )%s%s ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"%s\"; timeout_ms = 500; };\n"
            "batching = { max_batch_rows = 16; max_wait_ms = 5; max_queued_rows = 256; max_job_rows = 64; };\n"
            "worker = { %s };\n"
            "metrics = { listen = \"\"; heartbeat_prefix = \"\"; };\n"
            "log = { level = \"%s\"; };\n"
            "models = ( { name = \"demo\"; path = \"%s\";\n"
            "  layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
            "             { op = \"relu\"; },\n"
            "             { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); } );\n"
            "%s\n",
            f_brokers, r->group, r->topic, r->reply, r->dlq, dbg_prop,
            *f_session_props ? ",\n                 " : "", f_session_props, f_redis_port, r->prefix,
            f_worker_settings, *dbg_prop ? "debug" : "info", f_model_path,
            extra_cfg ? extra_cfg : "");
    fclose(f);
}

/* Frees what f_run_init allocated. */
F_FN void f_run_fini(struct f_run *r)
{
    free(r->ids);
    free(r->in);
}

/* Produces job i of the run (MessagePack, keyed by its id) on p (borrowed). */
F_FN void f_produce_one(struct f_run *r, rd_kafka_t *p, size_t i)
{
    struct wire_job j = {.id = r->ids[i], .input = r->in[i], .n_input = F_IN_W,
                         .timeout_ms = -1, .priority = -1};
    unsigned char *body;
    size_t len;
    assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
    assert_int_equal(h_produce(p, r->topic, r->ids[i], strlen(r->ids[i]), body, len, NULL), 0);
    free(body);
}

/* Produces every job up front and waits for the acknowledgements (before
 * any transport fault: the test's own producer retrying across one would,
 * the mock not deduping, write some jobs twice). */
static atomic_int f_produce_failures;

/* Counts the test producer's failed deliveries: a job the broker never
 * took would otherwise read as lost by the worker. */
F_FN void f_count_failed_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (m->err) atomic_fetch_add(&f_produce_failures, 1);
}

F_FN void f_produce_jobs(struct f_run *r)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", f_brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err));
    rd_kafka_conf_set(conf, "linger.ms", "2", err, sizeof(err));
    rd_kafka_conf_set_dr_msg_cb(conf, f_count_failed_delivery);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    assert_non_null(p);
    atomic_store(&f_produce_failures, 0);
    for (size_t i = 0; i < r->n; i++) f_produce_one(r, p, i);
    assert_int_equal(rd_kafka_flush(p, 30000), 0);
    assert_int_equal(atomic_load(&f_produce_failures), 0);
    atomic_store(&r->produced, r->n);
    rd_kafka_destroy(p);
}

/* The paced producer's thread: r->burst jobs at once (a backlog, so the
 * worker runs at its high mark with its partitions paused), then r->rate
 * jobs a second until all are sent, so jobs keep arriving while members
 * come and go. It does not assert (cmocka's assertions belong to the test
 * thread): a failure stops it short, and the test sees fewer than r->n
 * produced. */
F_FN void *f_producer_main(void *arg)
{
    struct f_run *r = arg;
    rd_kafka_t *p = h_producer(f_brokers);
    if (!p) return NULL;
    double t0 = h_now();
    for (size_t i = 0; i < r->n; i++) {
        double due = i < r->burst ? t0 : t0 + (double)(i - r->burst) / r->rate;
        double now = h_now();
        if (due > now) h_sleep_ms((int)((due - now) * 1000));
        struct wire_job j = {.id = r->ids[i], .input = r->in[i], .n_input = F_IN_W,
                             .timeout_ms = -1, .priority = -1};
        unsigned char *body;
        size_t len;
        if (wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len) != 0) break;
        int rc = h_produce(p, r->topic, r->ids[i], strlen(r->ids[i]), body, len, NULL);
        free(body);
        if (rc != 0) break;
        atomic_fetch_add(&r->produced, 1);
    }
    if (rd_kafka_flush(p, 60000) != 0) fprintf(stderr, "%s: producer flush timed out\n", r->name);
    rd_kafka_destroy(p);
    return NULL;
}

/* Starts producing the run's jobs in the background: burst at once, the
 * rest at rate a second. Join r->producer before checking r->produced. */
F_FN void f_produce_paced(struct f_run *r, size_t burst, double rate)
{
    r->burst = burst;
    r->rate = rate;
    atomic_store(&r->produced, 0);
    assert_int_equal(pthread_create(&r->producer, NULL, f_producer_main, r), 0);
}

/* Starts one worker on the run's config with up to five --set overrides
 * (sets is NULL-terminated, or NULL); tag names its log file
 * (NAME.TAG.log), so each member of a group keeps its own. */
F_FN pid_t f_spawn_worker(struct f_run *r, const char *tag, const char *const *sets)
{
    char log[300];
    snprintf(log, sizeof(log), "%s/%s.%s.log", h_dir(), r->name, tag);
    char *argv[16] = {(char *)f_kinfer_bin(), "worker", "-c", r->cfg};
    int n = 4;
    for (int i = 0; sets && sets[i] && n < 14; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n] = NULL;
    pid_t pid = h_spawn(argv, NULL, log);
    assert_true(pid > 0);
    return pid;
}

/* Starts the run's single worker (log NAME.worker.log) with overrides. */
F_FN pid_t f_start_worker_with(struct f_run *r, const char *const *sets)
{
    r->worker = f_spawn_worker(r, "worker", sets);
    return r->worker;
}

/* Starts the run's single worker. */
F_FN pid_t f_start_worker(struct f_run *r)
{
    return f_start_worker_with(r, NULL);
}

/* A client that reads the run's group's committed offsets (it joins
 * nothing). Destroy with rd_kafka_destroy. */
F_FN rd_kafka_t *f_offsets_reader(const struct f_run *r)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", f_brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", r->group, err, sizeof(err));
    if (f_quiet_sampler) rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    return rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
}

/* The group's committed offset of each partition of the run's topic (-1
 * for none yet). Returns 0, or -1 when the broker did not answer. */
F_FN int f_committed(const struct f_run *r, rd_kafka_t *c, long long off[F_PARTS])
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(F_PARTS);
    for (int p = 0; p < F_PARTS; p++) rd_kafka_topic_partition_list_add(l, r->topic, p);
    int rc = rd_kafka_committed(c, l, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR ? 0 : -1;
    for (int p = 0; p < F_PARTS; p++) off[p] = rc == 0 ? l->elems[p].offset : -1;
    rd_kafka_topic_partition_list_destroy(l);
    return rc;
}

/* Samples the group's committed offsets every 100 ms; any decrease is a
 * rewind. */
F_FN void *f_sampler_main(void *arg)
{
    struct f_run *r = arg;
    rd_kafka_t *c = f_offsets_reader(r);
    while (atomic_load(&r->sampling)) {
        long long now[F_PARTS];
        if (c && f_committed(r, c, now) == 0) {
            for (int p = 0; p < F_PARTS; p++) {
                long long off = now[p];
                if (off >= 0 && off < r->last_committed[p]) {
                    fprintf(stderr, "%s: partition %d committed offset went back %lld -> %lld\n",
                            r->name, p, r->last_committed[p], off);
                    atomic_fetch_add(&r->rewinds, 1);
                }
                if (off >= 0) r->last_committed[p] = off;
            }
        }
        h_sleep_ms(100);
    }
    if (c) rd_kafka_destroy(c);
    return NULL;
}

/* Starts sampling committed offsets. */
F_FN void f_start_sampler(struct f_run *r)
{
    atomic_store(&r->sampling, 1);
    assert_int_equal(pthread_create(&r->sampler, NULL, f_sampler_main, r), 0);
}

/* Stops the sampler (after the last worker is gone, so the final commit
 * is sampled too). */
F_FN void f_stop_sampler(struct f_run *r)
{
    atomic_store(&r->sampling, 0);
    pthread_join(r->sampler, NULL);
}

/* Result values against the reference: 1e-5 * max(1, |ref|), as in the
 * integration test (float32 through two small GEMMs). */
F_FN int f_values_ok(const struct wire_result *res, const float *in)
{
    if (!res->ok || res->rows != 1 || res->width != F_OUT_W || !res->output) return 0;
    double ref[F_OUT_W];
    ref_mlp_forward(&f_model, in, 1, ref);
    for (int k = 0; k < F_OUT_W; k++)
        if (fabs((double)res->output[k] - ref[k]) > 1e-5 * fmax(1.0, fabs(ref[k]))) return 0;
    return 1;
}

/* Whether res is right for job i: its values, or for the run's poison job
 * an inference_failed answer. */
F_FN int f_result_ok(const struct f_run *r, size_t i, const struct wire_result *res)
{
    if (r->poison_id && strcmp(r->ids[i], r->poison_id) == 0)
        return !res->ok && strcmp(res->code, "inference_failed") == 0;
    return f_values_ok(res, r->in[i]);
}

/* Waits up to timeout_s until Redis holds a result for every id (the
 * cheap signal that the run is over). Returns how many it holds. */
F_FN size_t f_wait_all(struct f_run *r, double timeout_s)
{
    redisContext *c = redisConnect("127.0.0.1", f_redis_port);
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
            c = redisConnect("127.0.0.1", f_redis_port);
        }
        if (have >= r->n || h_now() >= until) break;
        h_sleep_ms(200);
    } while (1);
    free(argv);
    free(keys);
    if (c) redisFree(c);
    return have;
}

/* How many of the run's ids have a result in Redis now. */
F_FN size_t f_results_now(struct f_run *r)
{
    return f_wait_all(r, 0);
}

/* Waits until at least want results are in Redis (so a fault lands
 * mid-load, not before the worker joined), up to timeout_s. Returns how
 * many there are. */
F_FN size_t f_wait_results(struct f_run *r, size_t want, double timeout_s)
{
    double until = h_now() + timeout_s;
    size_t have;
    while ((have = f_results_now(r)) < want && h_now() < until) h_sleep_ms(50);
    return have;
}

/* What the checker counted for a row. */
struct f_verdict {
    size_t lost, wrong, dup_total, dup_max, dead, in_redis, on_topic;
};

/* The checker: Redis, the whole reply topic and the DLQ against the ids.
 * Prints the row's FIGURES line on stderr; extra (may be NULL) is appended
 * to it (the row's own measurements). */
F_FN struct f_verdict f_check(struct f_run *r, const char *extra)
{
    struct f_verdict v = {0};
    size_t n = r->n;
    int *redis_ok = calloc(n, sizeof(int)), *topic_ok = calloc(n, sizeof(int));
    int *topic_cnt = calloc(n, sizeof(int)), *dead = calloc(n, sizeof(int));
    /* Redis, pipelined GETs. */
    redisContext *c = redisConnect("127.0.0.1", f_redis_port);
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
                if (f_result_ok(r, i, &res)) redis_ok[i] = 1;
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
        rd_kafka_t *rd = h_reader(f_brokers, topics[t]);
        assert_non_null(rd);
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
                            if (f_result_ok(r, i, &res)) topic_ok[i] = 1;
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
            if (f_list_duplicates && v.dup_total < 5)
                fprintf(stderr, "%s: %s on the reply topic %d times\n", r->name, r->ids[i],
                        topic_cnt[i]);
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
            "rewinds=%d in_redis=%zu on_reply_topic=%zu dead_lettered=%zu%s%s\n",
            r->name, n, v.lost, v.wrong, v.dup_total, v.dup_max, atomic_load(&r->rewinds),
            v.in_redis, v.on_topic, v.dead, extra && *extra ? " " : "", extra ? extra : "");
    return v;
}

/* Ends a row that must have lost nothing, got nothing wrong and never
 * rewound an offset: stops the sampler, runs the checker (its FIGURES
 * line), asserts those three, frees the run. */
F_FN void f_finish_clean(struct f_run *r)
{
    f_stop_sampler(r);
    struct f_verdict v = f_check(r, NULL);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r->rewinds), 0);
    f_run_fini(r);
}

#endif

/* faults_broker.c - the Kafka-side rows of reliability.md's fault table,
 * against real parts: a three-broker `kinfer broker` whose control channel
 * (its stdin/stdout) this program drives to break the cluster under a
 * running worker, a real redis-server, and the worker binary. It proves:
 *   broker outage   every broker down 12 s mid-load (the results' leader
 *                   first down and first up): nothing lost, the worker's
 *                   peak RSS bounded, and after the heal the committed
 *                   offsets reach the produced count (lag back to 0);
 *   produce errors  NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT and
 *                   NETWORK_EXCEPTION injected on Produce, and reply-topic
 *                   partition leaders moved, while jobs flow: nothing lost,
 *                   no duplicate replies (no worker restarts in this row);
 *   commit errors   REBALANCE_IN_PROGRESS and REQUEST_TIMED_OUT injected on
 *                   OffsetCommit: nothing lost, no committed offset rewinds;
 *   rebalance       up to three workers in one group joining, leaving
 *                   (SIGTERM) and dying (SIGKILL) under load: nothing lost,
 *                   no rewinds, no revoke past its budget; duplicates shown;
 *   slow broker     300 ms on every broker's responses for 10 s: nothing
 *                   lost.
 * Each row runs the same checker as faults_suite.c (lost, wrong,
 * duplicates, rewinds) and prints a FIGURES line on stderr. The outage
 * and rebalance rows also catch a worker that stops fetching after its
 * assignment changed while backpressure had it paused: librdkafka keeps
 * a partition's pause across revoke and assign, so its jobs would sit in
 * Kafka, uncommitted, for as long as that worker lives (lost here means
 * "no result by the end of the row").
 *
 * What the mock cluster (librdkafka 2.0.2) cannot show: it dedupes
 * producer retries only for transactional producers, so a retry of a
 * Produce that had landed shows up twice on the reply topic where a real
 * broker would drop it; injected request errors never land, so the
 * produce-errors row proves the worker and librdkafka never publish twice
 * on their own, not that a real broker's dedupe works. The same gap is why
 * jobs are produced before any transport fault (a test producer's retry
 * across an outage would duplicate jobs). `make test-faults` runs it
 * (minutes); `make test` does not. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <poll.h>
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
#define N_BROKERS 3

static char brokers[512];
static int redis_port;
static char model_path[300];
static struct ref_mlp reference_model; /* the demo model, in float64 */
/* The broker's control channel: we write its stdin, read its stdout. */
static int ctl_wfd = -1, ctl_rfd = -1;

/* The worker binary under test: $KINFER_BIN (make passes the instrumented
 * one), else the plain build. */
static const char *kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}

/* ---- the broker and its control channel --------------------------------- */

/* Reads one line from fd into buf, waiting at most timeout_ms in all, so
 * a broker that stopped answering fails the test instead of hanging it.
 * Returns its length, or -1 on timeout or end of file. */
static int read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t n = 0;
    double until = h_now() + timeout_ms / 1000.0;
    while (n + 1 < cap) {
        int left = (int)((until - h_now()) * 1000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        char c;
        if (read(fd, &c, 1) != 1) break;
        if (c == '\n') {
            buf[n] = '\0';
            return (int)n;
        }
        buf[n++] = c;
    }
    buf[n] = '\0';
    return -1;
}

/* Starts `kinfer broker` with three brokers and pipes on its stdin and
 * stdout (h_start_broker hands out neither, and the control channel needs
 * both). The pid goes into h_children so h_kill_all ends it with the rest.
 * Fills brokers[] from the first line. Returns the pid or -1. */
static pid_t start_broker_ctl(const char *topics)
{
    int in[2], out[2];
    /* Close-on-exec: workers started later must not inherit our ends. */
    if (pipe2(in, O_CLOEXEC) < 0) return -1;
    if (pipe2(out, O_CLOEXEC) < 0) return -1;
    char log[300], nb[16], np[16];
    snprintf(log, sizeof(log), "%s/broker.log", h_dir());
    snprintf(nb, sizeof(nb), "%d", N_BROKERS);
    snprintf(np, sizeof(np), "%d", PARTS);
    char *argv[] = {(char *)kinfer_bin(), "broker", "--brokers", nb, "--partitions", np,
                    "--topics", (char *)topics, NULL};
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) dup2(fd, 2);
        dup2(in[0], 0);
        dup2(out[1], 1);
        execvp(argv[0], argv);
        perror(argv[0]);
        _exit(127);
    }
    setpgid(pid, pid);
    close(in[0]);
    close(out[1]);
    ctl_wfd = in[1];
    ctl_rfd = out[0];
    for (int i = 0; i < H_MAX_CHILDREN; i++)
        if (h_children[i] == 0) {
            h_children[i] = pid;
            break;
        }
    if (read_line(ctl_rfd, brokers, sizeof(brokers), 15000) <= 0) return -1;
    return pid;
}

/* Sends one control command and waits for its answer line. Returns 0 on
 * "ok"; anything else is printed and returns -1, so each fault a test
 * relies on is known to have been applied. */
__attribute__((format(printf, 1, 2))) static int ctl(const char *fmt, ...)
{
    char line[512], answer[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line) - 1) return -1;
    line[n++] = '\n';
    if (write(ctl_wfd, line, (size_t)n) != n) return -1;
    if (read_line(ctl_rfd, answer, sizeof(answer), 10000) < 0) {
        fprintf(stderr, "broker control: no answer to %.*s\n", n - 1, line);
        return -1;
    }
    if (strcmp(answer, "ok") != 0) {
        fprintf(stderr, "broker control: %.*s -> %s\n", n - 1, line, answer);
        return -1;
    }
    return 0;
}

/* ---- reference model ------------------------------------------------------ */

/* Writes the demo model with known random weights and keeps them here in
 * float64 (the file stores float32: the same rounded values are used), so
 * the checker can tell a right result from a wrong one. */
static void make_model(void)
{
    snprintf(model_path, sizeof(model_path), "%s/model.safetensors", h_dir());
    char err[256];
    uint64_t seed = tu_rand64();
    assert_int_equal(model_write_demo(model_path, IN_W, HID_W, OUT_W, seed, err, sizeof(err)), 0);
    ref_mlp_load(&reference_model, model_path);
}

/* The model in float64: dense -> relu -> dense. */
static void reference(const float *in, double *out)
{
    ref_mlp_forward(&reference_model, in, 1, out);
}

/* ---- a run: jobs, workers, checker ---------------------------------------- */

/* One row's jobs, config, workers and measurements. */
struct run {
    const char *name;
    char topic[64], reply[64], dlq[64], group[64], prefix[64], cfg[300];
    size_t n;
    char (*ids)[32];
    float (*in)[IN_W];
    pid_t worker;
    /* committed-offset sampler */
    pthread_t sampler;
    atomic_int sampling;
    long long last_committed[PARTS];
    atomic_int rewinds;
    /* paced producer (produce_paced) */
    pthread_t producer;
    double rate;
    size_t burst;
    atomic_size_t produced;
};

/* Makes the run's ids and inputs and writes its worker config: topics of
 * its own, a short session timeout so a dead member leaves the group in
 * seconds, and no metrics port or heartbeat, so several workers can run
 * side by side. */
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
    assert_non_null(f);
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"%s\"; topics = [ \"%s\" ];\n"
            "  reply_topic = \"%s\"; dlq_topic = \"%s\";\n"
            "  properties = ( ( \"auto.commit.interval.ms\", \"100\" ),\n"
            "                 ( \"fetch.wait.max.ms\", \"10\" ),\n"
            "                 ( \"session.timeout.ms\", \"6000\" ),\n"
            "                 ( \"heartbeat.interval.ms\", \"500\" ) ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"%s\"; timeout_ms = 500; };\n"
            "batching = { max_batch_rows = 16; max_wait_ms = 5; max_queued_rows = 256; max_job_rows = 64; };\n"
            "worker = { drain_timeout_ms = 5000; blas_threads = 1; };\n"
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

/* Frees what run_init allocated. */
static void run_fini(struct run *r)
{
    free(r->ids);
    free(r->in);
}

/* Produces job i of the run (MessagePack, keyed by its id). */
static void produce_one(struct run *r, rd_kafka_t *p, size_t i)
{
    struct wire_job j = {.id = r->ids[i], .input = r->in[i], .n_input = IN_W,
                         .timeout_ms = -1, .priority = -1};
    unsigned char *body;
    size_t len;
    assert_int_equal(wire_encode_job(&j, JOB_ENC_MSGPACK, &body, &len), 0);
    assert_int_equal(h_produce(p, r->topic, r->ids[i], strlen(r->ids[i]), body, len, NULL), 0);
    free(body);
}

/* Produces every job up front and waits for the acknowledgements: used
 * before transport faults, which would make the test's own producer
 * retry and (the mock not deduping) write some jobs twice. */
static void produce_jobs(struct run *r)
{
    rd_kafka_t *p = h_producer(brokers);
    assert_non_null(p);
    for (size_t i = 0; i < r->n; i++) produce_one(r, p, i);
    assert_int_equal(rd_kafka_flush(p, 30000), 0);
    atomic_store(&r->produced, r->n);
    rd_kafka_destroy(p);
}

/* The paced producer's thread: r->burst jobs at once (a backlog, so the
 * worker runs at its high mark with its partitions paused), then r->rate
 * jobs a second until all are sent, so jobs keep arriving while members
 * come and go. It does not assert (cmocka's assertions belong to the test
 * thread): a failure stops it short, and the test sees fewer than r->n
 * produced. */
static void *producer_main(void *arg)
{
    struct run *r = arg;
    rd_kafka_t *p = h_producer(brokers);
    if (!p) return NULL;
    double t0 = h_now();
    for (size_t i = 0; i < r->n; i++) {
        double due = i < r->burst ? t0 : t0 + (double)(i - r->burst) / r->rate;
        double now = h_now();
        if (due > now) h_sleep_ms((int)((due - now) * 1000));
        struct wire_job j = {.id = r->ids[i], .input = r->in[i], .n_input = IN_W,
                             .timeout_ms = -1, .priority = -1};
        unsigned char *body;
        size_t len;
        if (wire_encode_job(&j, JOB_ENC_MSGPACK, &body, &len) != 0) break;
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
 * rest at rate a second. */
static void produce_paced(struct run *r, size_t burst, double rate)
{
    r->burst = burst;
    r->rate = rate;
    atomic_store(&r->produced, 0);
    assert_int_equal(pthread_create(&r->producer, NULL, producer_main, r), 0);
}

/* Starts one worker on the run's config; tag names its log file, so each
 * member of a group keeps its own. */
static pid_t spawn_worker(struct run *r, const char *tag)
{
    char log[300];
    snprintf(log, sizeof(log), "%s/%s.%s.log", h_dir(), r->name, tag);
    char *argv[] = {(char *)kinfer_bin(), "worker", "-c", r->cfg, NULL};
    pid_t pid = h_spawn(argv, NULL, log);
    assert_true(pid > 0);
    return pid;
}

/* Starts the run's single worker. */
static pid_t start_worker(struct run *r)
{
    r->worker = spawn_worker(r, "worker");
    return r->worker;
}

/* Samples the group's committed offsets; any decrease is a rewind. */
static void *sampler_main(void *arg)
{
    struct run *r = arg;
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", r->group, err, sizeof(err));
    /* Its connection errors during an outage are expected: keep stderr for
     * the figures. */
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
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

/* Starts sampling committed offsets every 100 ms. */
static void start_sampler(struct run *r)
{
    atomic_store(&r->sampling, 1);
    assert_int_equal(pthread_create(&r->sampler, NULL, sampler_main, r), 0);
}

/* Stops the sampler (after the last worker is gone, so the final commit
 * is sampled too). */
static void stop_sampler(struct run *r)
{
    atomic_store(&r->sampling, 0);
    pthread_join(r->sampler, NULL);
}

/* Result values against the reference: 1e-5 * max(1, |ref|), as in the
 * integration test (float32 through two small GEMMs). */
static int values_ok(const struct wire_result *res, const float *in)
{
    if (!res->ok || res->rows != 1 || res->width != OUT_W || !res->output) return 0;
    double ref[OUT_W];
    reference(in, ref);
    for (int k = 0; k < OUT_W; k++)
        if (fabs((double)res->output[k] - ref[k]) > 1e-5 * fmax(1.0, fabs(ref[k]))) return 0;
    return 1;
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

/* How many of the run's ids have a result in Redis now. */
static size_t results_now(struct run *r)
{
    return wait_all(r, 0);
}

/* Waits until at least want results are in Redis (so a fault lands
 * mid-load, not before the worker joined), up to timeout_s. Returns how
 * many there are. */
static size_t wait_results(struct run *r, size_t want, double timeout_s)
{
    double until = h_now() + timeout_s;
    size_t have;
    while ((have = results_now(r)) < want && h_now() < until) h_sleep_ms(50);
    return have;
}

/* What the checker counted for a row. */
struct verdict {
    size_t lost, wrong, dup_total, dup_max, dead, in_redis, on_topic;
};

/* The checker: Redis, the whole reply topic and the DLQ against the ids.
 * extra is appended to the FIGURES line (the row's own measurements). */
static struct verdict check(struct run *r, const char *extra)
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
                if (values_ok(&res, r->in[i])) redis_ok[i] = 1;
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
                            if (values_ok(&res, r->in[i])) topic_ok[i] = 1;
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
            if (v.dup_total < 5)
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

/* ---- process and log measurements ----------------------------------------- */

/* A "Name:   N kB" field of /proc/<pid>/status in kB, or -1: VmHWM is the
 * peak resident set, the bound the outage row asserts. */
static long proc_status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kb = -1;
    size_t flen = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
            kb = strtol(line + flen + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

/* How many lines of the run's worker logs (every member's) contain needle:
 * the rows report revokes, lost assignments and produce failures this way
 * instead of guessing them from timings. */
static int log_count(struct run *r, const char *needle)
{
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "cat %s/%s.*.log 2>/dev/null | grep -c -- '%s'", h_dir(), r->name,
             needle);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int n = -1;
    if (fscanf(p, "%d", &n) != 1) n = -1;
    pclose(p);
    return n;
}

/* SIGTERM to a worker; asserts it stopped cleanly (exit 0) within 30 s
 * and returns how long it took. */
static double stop_worker(pid_t pid)
{
    double t0 = h_now();
    assert_int_equal(h_stop(pid, SIGTERM, 30), 0);
    return h_now() - t0;
}

/* Records on the run's reply topic (the sum of its partitions' high
 * watermarks), or -1 when the cluster does not answer: tells the outage
 * row when the worker's in-flight results have been delivered. */
static long long reply_count(struct run *r)
{
    rd_kafka_t *p = h_producer(brokers);
    if (!p) return -1;
    long long sum = 0;
    for (int i = 0; i < PARTS && sum >= 0; i++) {
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(p, r->reply, i, &lo, &hi, 2000) != 0) sum = -1;
        else sum += hi;
    }
    rd_kafka_destroy(p);
    return sum;
}

/* Prints each partition whose committed offset (the sampler's last
 * reading) is short of its end: where work stopped when a row fails. */
static void report_lag(struct run *r)
{
    rd_kafka_t *p = h_producer(brokers);
    if (!p) return;
    for (int i = 0; i < PARTS; i++) {
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(p, r->topic, i, &lo, &hi, 5000) != 0) continue;
        if (r->last_committed[i] < hi)
            fprintf(stderr, "%s: partition %d committed %lld of %lld\n", r->name, i,
                    r->last_committed[i], (long long)hi);
    }
    rd_kafka_destroy(p);
}

/* ---- the tests -------------------------------------------------------------- */

/* Every broker down for 12 s mid-load, then up, as brokers fail and come
 * back one by one: the results' broker goes down 1.5 s before the others
 * and comes back first. The outage is longer than session.timeout.ms, so
 * the worker loses its assignment; it finishes its in-flight work while
 * it has none, then rejoins. Nothing may be lost, its peak RSS must stay
 * bounded while it cannot deliver, and after the heal the committed
 * offsets must reach what was produced (lag back to zero). */
static void test_broker_outage(void **state)
{
    (void)state;
    static struct run r; /* static: a failed assertion leaves its threads running */
    run_init(&r, "outage", 4000, NULL);
    /* Jobs led by broker 1, results by broker 2, the group by broker 3, so
     * the outage can start with the results' broker: deliveries stop
     * while fetching goes on, the worker fills up to its high mark and
     * pauses, and the full outage then finds it paused (the state a real
     * outage usually finds a loaded worker in). */
    for (int p = 0; p < PARTS; p++) {
        assert_int_equal(ctl("leader %s %d 1", r.topic, p), 0);
        assert_int_equal(ctl("leader %s %d 2", r.reply, p), 0);
    }
    assert_int_equal(ctl("coordinator %s 3", r.group), 0);
    produce_jobs(&r);
    start_sampler(&r);
    start_worker(&r);
    size_t before = wait_results(&r, 300, 60);
    assert_true(before >= 300);
    assert_int_equal(ctl("down 2"), 0);
    h_sleep_ms(1500);
    assert_int_equal(ctl("down all"), 0);
    double t0 = h_now();
    long rss_max = 0;
    while (h_now() - t0 < 12) {
        long rss = proc_status_kb(r.worker, "VmRSS");
        if (rss > rss_max) rss_max = rss;
        h_sleep_ms(250);
    }
    size_t during = results_now(&r);
    /* The heal in the same order: the results' broker first, until every
     * result in Redis is also on the reply topic (the worker's in-flight
     * work is done while it has no assignment), then the rest, and the
     * worker rejoins. */
    assert_int_equal(ctl("up 2"), 0);
    double down_s = h_now() - t0;
    double t_up = h_now();
    while (reply_count(&r) < (long long)results_now(&r) && h_now() - t_up < 20) h_sleep_ms(200);
    double partial_s = h_now() - t_up;
    h_sleep_ms(1000);
    assert_int_equal(ctl("up all"), 0);
    size_t have = wait_all(&r, 75);
    double heal_s = h_now() - t_up;
    int st;
    assert_false(h_exited(r.worker, &st)); /* it rode the outage out */
    long hwm = proc_status_kb(r.worker, "VmHWM");
    fprintf(stderr, "outage: all brokers down %.1f s, the results' broker alone up %.1f s; "
            "results %zu before, %zu at the end of it, %zu of %zu %.1f s after; VmRSS max "
            "during %ld kB, VmHWM %ld kB\n", down_s, partial_s, before, during, have, r.n, heal_s,
            rss_max, hwm);
    /* Stop and check before asserting on have, so a stall still prints
     * its figures and the partitions it left behind. */
    double term_s = stop_worker(r.worker);
    stop_sampler(&r);
    if (have < r.n) report_lag(&r);
    long long committed = h_committed_sum(brokers, r.group, r.topic, PARTS);
    char extra[256];
    snprintf(extra, sizeof(extra),
             "down_s=%.1f all_results_after_heal_s=%.1f vmhwm_kb=%ld committed=%lld "
             "produced=%zu sigterm_exit_s=%.2f assignments_lost=%d",
             down_s, heal_s, hwm, committed, r.n, term_s, log_count(&r, "partitions_lost"));
    struct verdict v = check(&r, extra);
    assert_int_equal(have, r.n);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    assert_true(hwm > 0 && hwm < 512 * 1024);
    assert_int_equal(committed, (long long)r.n);
    run_fini(&r);
}

/* Produce requests fail while jobs flow: NOT_LEADER_OR_FOLLOWER,
 * REQUEST_TIMED_OUT and NETWORK_EXCEPTION injected in rounds, and the
 * reply topic's partition leaders moved between brokers. librdkafka's
 * idempotent producer retries them; the worker must neither lose a result
 * nor publish one twice (no worker restart here, so any duplicate is a
 * retry gone wrong). The mock never appends a request it fails, so this
 * cannot show a real broker's dedupe of a retry that had landed. */
static void test_produce_errors(void **state)
{
    (void)state;
    static struct run r; /* static: a failed assertion leaves its threads running */
    run_init(&r, "perr", 3000, NULL);
    produce_jobs(&r);
    start_sampler(&r);
    start_worker(&r);
    size_t before = wait_results(&r, 100, 60);
    assert_true(before >= 100);
    /* NOT_LEADER_OR_FOLLOWER is code 6, which librdkafka 2.0.2 (and so the
     * control channel) names NOT_LEADER_FOR_PARTITION. */
    static const char *const codes[] = {"NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT",
                                        "NETWORK_EXCEPTION"};
    /* One error every 600 ms for about 8 s, a leader move every third
     * round. The worker is the only producer and sends a few requests a
     * second (one per leader, batched), so denser rounds fail every
     * request and nothing moves until they stop; this density lets jobs
     * flow between the errors. */
    int rounds = 0, injected = 0, moves = 0;
    double t0 = h_now(), ctl_max = 0;
    while (h_now() - t0 < 8) {
        const char *code = codes[rounds % 3];
        int count = 1;
        double c0 = h_now();
        assert_int_equal(ctl("error Produce %d %s", count, code), 0);
        injected += count;
        if (rounds % 3 == 2) {
            int part = rounds % PARTS;
            assert_int_equal(ctl("leader %s %d %d", r.reply, part, 1 + (rounds / 3) % N_BROKERS),
                             0);
            moves++;
        }
        if (h_now() - c0 > ctl_max) ctl_max = h_now() - c0;
        rounds++;
        h_sleep_ms(600);
    }
    double inject_s = h_now() - t0;
    size_t at_end = results_now(&r);
    size_t have = wait_all(&r, 120);
    fprintf(stderr, "perr: %d produce errors injected in %d rounds, %d leader moves over "
            "%.1f s (slowest control command %.2f s); results %zu when they started, %zu when "
            "they stopped\n", injected, rounds, moves, inject_s, ctl_max, before, at_end);
    assert_int_equal(have, r.n);
    double term_s = stop_worker(r.worker);
    stop_sampler(&r);
    char extra[256];
    snprintf(extra, sizeof(extra),
             "produce_errors_injected=%d leader_moves=%d worker_reproduced=%d "
             "sigterm_exit_s=%.2f",
             injected, moves, log_count(&r, "produce_failed"), term_s);
    struct verdict v = check(&r, extra);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(v.dup_total, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* OffsetCommit fails with REBALANCE_IN_PROGRESS and REQUEST_TIMED_OUT, in
 * rounds, while jobs flow. A failed commit leaves the stored offsets to
 * the next one; the committed offsets must never move back and nothing
 * may be lost. Once the errors stop the offsets must catch up. */
static void test_commit_errors(void **state)
{
    (void)state;
    static struct run r; /* static: a failed assertion leaves its threads running */
    run_init(&r, "cerr", 3000, NULL);
    produce_jobs(&r);
    start_sampler(&r);
    start_worker(&r);
    size_t before = wait_results(&r, 100, 60);
    assert_true(before >= 100);
    int injected = 0, rounds = 0;
    double t0 = h_now();
    while (h_now() - t0 < 8) {
        const char *code = rounds % 2 ? "REQUEST_TIMED_OUT" : "REBALANCE_IN_PROGRESS";
        assert_int_equal(ctl("error OffsetCommit 3 %s", code), 0);
        injected += 3;
        rounds++;
        h_sleep_ms(200);
    }
    size_t at_end = results_now(&r);
    size_t have = wait_all(&r, 120);
    fprintf(stderr, "cerr: %d commit errors injected in %d rounds over 8 s (%zu results "
            "when they stopped)\n", injected, rounds, at_end);
    assert_int_equal(have, r.n);
    /* Let the auto-commit (100 ms) use up any error still queued before
     * the shutdown commit. */
    h_sleep_ms(1500);
    double term_s = stop_worker(r.worker);
    stop_sampler(&r);
    long long committed = h_committed_sum(brokers, r.group, r.topic, PARTS);
    char extra[256];
    snprintf(extra, sizeof(extra),
             "commit_errors_injected=%d committed=%lld produced=%zu rebalances=%d "
             "sigterm_exit_s=%.2f",
             injected, committed, r.n, log_count(&r, "partitions_revoked"), term_s);
    struct verdict v = check(&r, extra);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    assert_int_equal(committed, (long long)r.n);
    run_fini(&r);
}

/* Group membership churn under load: a backlog (so the first worker runs
 * paused at its high mark), then a steady stream; a second and a third
 * worker join, one leaves with SIGTERM, one is killed with SIGKILL (its
 * partitions come back after session.timeout.ms), a fourth joins. Every
 * job must get its result before the row ends, committed offsets never
 * rewind, every revoke finishes within its budget (no revoke_timeout
 * logged). Duplicates are reported, not bounded here: the killed
 * member's uncommitted work, and, on the mock only, the work since the
 * last auto-commit at each rebalance (the mock answers OffsetCommit with
 * REBALANCE_IN_PROGRESS while the group is joining, where a real broker
 * takes a current-generation commit during PreparingRebalance, so the
 * worker's revoke-time commit fails there). */
static void test_rebalance(void **state)
{
    (void)state;
    static struct run r; /* static: a failed assertion leaves its threads running */
    run_init(&r, "rebal", 3600, NULL);
    start_sampler(&r);
    produce_paced(&r, 800, 120);
    pid_t a = spawn_worker(&r, "a");
    assert_true(wait_results(&r, 200, 60) >= 200);
    pid_t b = spawn_worker(&r, "b");
    h_sleep_ms(4000);
    pid_t c = spawn_worker(&r, "c");
    h_sleep_ms(5000);
    size_t at_leave = results_now(&r);
    double leave_s = stop_worker(b);
    h_sleep_ms(3000);
    size_t at_kill = results_now(&r);
    assert_int_equal(h_stop(c, SIGKILL, 5), 128 + SIGKILL);
    h_sleep_ms(7000);
    pid_t d = spawn_worker(&r, "d");
    pthread_join(r.producer, NULL);
    assert_int_equal(atomic_load(&r.produced), r.n);
    size_t have = wait_all(&r, 45);
    fprintf(stderr, "rebal: b left (SIGTERM, %.2f s) at %zu results, c killed at %zu; "
            "%zu of %zu at the end\n", leave_s, at_leave, at_kill, have, r.n);
    /* Stop and check before asserting on have, so a stall still prints
     * its figures and the partitions it left behind. */
    double term_a = stop_worker(a), term_d = stop_worker(d);
    stop_sampler(&r);
    if (have < r.n) report_lag(&r);
    int revoke_timeouts = log_count(&r, "revoke_timeout");
    char extra[320];
    snprintf(extra, sizeof(extra),
             "members_max=3 assigned_events=%d revoked_events=%d lost_events=%d "
             "revoke_timeouts=%d sigterm_exit_s=%.2f,%.2f,%.2f",
             log_count(&r, "partitions_assigned"), log_count(&r, "partitions_revoked"),
             log_count(&r, "partitions_lost"), revoke_timeouts, leave_s, term_a, term_d);
    struct verdict v = check(&r, extra);
    assert_int_equal(have, r.n);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    assert_int_equal(revoke_timeouts, 0);
    run_fini(&r);
}

/* Every broker answers 300 ms late for 10 s while jobs stream in: the
 * worker slows down but loses nothing (a cheap row; no timing bound). */
static void test_slow_broker(void **state)
{
    (void)state;
    static struct run r; /* static: a failed assertion leaves its threads running */
    run_init(&r, "slow", 2000, NULL);
    start_sampler(&r);
    produce_paced(&r, 0, 200);
    start_worker(&r);
    assert_true(wait_results(&r, 200, 60) >= 200);
    assert_int_equal(ctl("rtt all 300"), 0);
    size_t at_slow = results_now(&r);
    h_sleep_ms(10000);
    size_t at_fast = results_now(&r);
    assert_int_equal(ctl("rtt all 0"), 0);
    pthread_join(r.producer, NULL);
    assert_int_equal(atomic_load(&r.produced), r.n);
    size_t have = wait_all(&r, 120);
    fprintf(stderr, "slow: %zu results in 10 s at 300 ms RTT (from %zu to %zu); %zu of %zu at "
            "the end\n", at_fast - at_slow, at_slow, at_fast, have, r.n);
    assert_int_equal(have, r.n);
    double term_s = stop_worker(r.worker);
    stop_sampler(&r);
    char extra[256];
    snprintf(extra, sizeof(extra), "rtt_ms=300 slow_s=10 results_while_slow=%zu "
             "rebalances=%d sigterm_exit_s=%.2f", at_fast - at_slow,
             log_count(&r, "partitions_revoked"), term_s);
    struct verdict v = check(&r, extra);
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.wrong, 0);
    assert_int_equal(atomic_load(&r.rewinds), 0);
    run_fini(&r);
}

/* Starts the three-broker cluster with every row's topics, and Redis. */
static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN); /* a dead broker fails ctl(), not the program */
    make_model();
    char topics[1024] = "";
    const char *names[] = {"outage", "perr", "cerr", "rebal", "slow"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char t[200];
        snprintf(t, sizeof(t), "%s%s.jobs,%s.results,%s.dlq", i ? "," : "", names[i], names[i],
                 names[i]);
        strcat(topics, t);
    }
    if (start_broker_ctl(topics) < 0) return -1;
    if (ctl("ping") < 0) return -1;
    if (h_start_redis(&redis_port) < 0) return -1;
    fprintf(stderr, "faults_broker: brokers %s, redis port %d, logs in %s\n", brokers,
            redis_port, h_dir());
    return 0;
}

/* Ends every child (broker, Redis, workers left by a failed assertion). */
static int teardown(void **state)
{
    (void)state;
    h_kill_all();
    return 0;
}

/* Runs the rows in order against one cluster and one Redis; each row
 * has topics and a group of its own. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_broker_outage),
        cmocka_unit_test(test_produce_errors),
        cmocka_unit_test(test_commit_errors),
        cmocka_unit_test(test_rebalance),
        cmocka_unit_test(test_slow_broker),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

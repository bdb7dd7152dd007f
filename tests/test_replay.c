/* test_replay.c - `kinfer replay` end to end, with real parts: `kinfer
 * broker` (librdkafka's mock cluster in its own process), a real
 * redis-server, a live worker in its own consumer group, and the replay
 * binary as a child process. Jobs are produced at known record timestamps
 * across partitions; replays of a time range and of an offset range must
 * answer exactly that set on their reply topic; if-absent must leave
 * existing Redis keys alone where on overwrites them; --model must switch
 * models (told apart by the result's model field and its values against a
 * float64 reference); a replay interrupted by SIGINT and resumed must answer
 * every job, repeating at most the in-flight window; and the live group's
 * committed offsets and membership must not move throughout.
 *
 * The first case is a table of time strings for replay_parse_time. The
 * others share one broker, one Redis and one set of jobs, and run in order.
 * Single-threaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "../cmd/replay.h"
#include "harness.h"
#include "refmlp.h"
#include "testutil.h"

#define IN_W 8
#define HID_W 16
#define OUT_W 4
#define PARTS 4
#define PER_PART 50           /* jobs per partition of rp.jobs */
#define N_JOBS (PARTS * PER_PART)
#define BASE_MS 1700000000000LL /* 2023-11-14T22:13:20Z: the first job's timestamp */
#define RS_PER_PART 500       /* jobs per partition of rs.jobs (the resume case) */
#define RS_JOBS (PARTS * RS_PER_PART)
/* What the worker may hold taken in, in the test config (one row per job):
 * 2 * (max_queued_rows + max_inflight_batches * max_batch_rows), the bound
 * of `backpressure` in worker/intake.c (half of it for results awaiting
 * their acknowledgements).
 * The queue is not smaller because librdkafka 2.0.2 fetches a resumed
 * partition only on its broker thread's next wakeup (up to 1 s): a queue
 * that pauses every few dozen jobs would make the test crawl. */
#define INFLIGHT_WINDOW (2 * (256 + 2 * 8))

/* The binary under test: $KINFER_BIN (make test sets it), else build/kinfer. */
static const char *kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}
#define KINFER kinfer_bin()

static char brokers[512];
static int redis_port;
static char cfg_path[300];
static pid_t live_worker;
static long long live_committed;

/* Two demo models, "a" (the default) and "b", with their weights read back
 * for a float64 reference. */
struct ref_model {
    char path[300];
    struct ref_mlp mlp;
};
static struct ref_model model_a, model_b;

/* The input of job k of partition p: a fixed function, so any result can
 * be checked without remembering what was sent. */
static void job_input(int p, int k, float *in)
{
    for (int i = 0; i < IN_W; i++) in[i] = (float)sin(0.37 * (p * 1000 + k) + 0.91 * i);
}

/* The timestamp of job k of partition p: one second apart, and the
 * partitions 10 ms apart so no two records share a time. */
static int64_t job_ts(int p, int k)
{
    return BASE_MS + (int64_t)k * 1000 + p * 10;
}

/* Reads a demo model's tensors back through its safetensors header. */
static void load_reference(struct ref_model *m)
{
    ref_mlp_load(&m->mlp, m->path);
}

/* Fails unless r is an ok result of model m (by name and by value) for
 * job (p, k). */
static void check_result(const struct wire_result *r, const char *name,
                         const struct ref_model *m, int p, int k)
{
    float in[IN_W];
    job_input(p, k, in);
    assert_true(r->ok);
    assert_string_equal(r->model, name);
    assert_int_equal(r->rows, 1);
    assert_int_equal(r->width, OUT_W);
    double want[OUT_W];
    ref_mlp_forward(&m->mlp, in, 1, want);
    for (int o = 0; o < OUT_W; o++)
        if (fabs((double)r->output[o] - want[o]) > 1e-5 * fmax(1.0, fabs(want[o])))
            fail_msg("%s: output[%d] = %.9g, model %s gives %.9g", r->id, o, r->output[o],
                     name, want[o]);
}

/* Parses an id "T-P-K" into p and k. */
static void id_pk(const char *id, int *p, int *k)
{
    const char *d = strchr(id, '-');
    assert_non_null(d);
    assert_int_equal(sscanf(d + 1, "%d-%d", p, k), 2);
}

/* Produces n_per_part jobs to each partition of topic, id "<tag>-P-K",
 * with explicit record timestamps when stamp is set. */
static void produce_jobs(const char *topic, const char *tag, int n_per_part, int stamp)
{
    rd_kafka_t *pr = h_producer(brokers);
    assert_non_null(pr);
    for (int k = 0; k < n_per_part; k++) {
        for (int p = 0; p < PARTS; p++) {
            char id[64];
            float in[IN_W];
            snprintf(id, sizeof(id), "%s-%d-%d", tag, p, k);
            job_input(p, k, in);
            struct wire_job j = {.id = id, .input = in, .n_input = IN_W, .timeout_ms = -1,
                                 .priority = -1};
            unsigned char *body;
            size_t len;
            assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
            rd_kafka_resp_err_t e;
            do {
                e = rd_kafka_producev(pr, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(p),
                                      RD_KAFKA_V_KEY(id, strlen(id)), RD_KAFKA_V_VALUE(body, len),
                                      RD_KAFKA_V_TIMESTAMP(stamp ? job_ts(p, k) : 0),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
                if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) rd_kafka_poll(pr, 10);
            } while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
            assert_int_equal(e, 0);
            free(body);
        }
    }
    assert_int_equal(rd_kafka_flush(pr, 10000), 0);
    rd_kafka_destroy(pr);
}

/* One record read back from a reply topic. */
struct rec {
    char key[64];
    struct wire_result r;
};

/* Reads every record of topic, from the log start to the end it has now,
 * by assigning its partitions directly (no group to join). Returns how
 * many were stored in out (at most max). */
static size_t read_all(const char *topic, struct rec *out, size_t max)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", "test-replay-reader", err, sizeof(err));
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err));
    rd_kafka_conf_set(conf, "fetch.wait.max.ms", "10", err, sizeof(err));
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    assert_non_null(c);
    rd_kafka_poll_set_consumer(c);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(PARTS);
    int64_t hi[PARTS], want = 0;
    for (int p = 0; p < PARTS; p++) {
        int64_t lo;
        assert_int_equal(rd_kafka_query_watermark_offsets(c, topic, p, &lo, &hi[p], 10000), 0);
        want += hi[p] - lo;
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = lo;
    }
    assert_int_equal(rd_kafka_assign(c, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    size_t n = 0;
    int64_t got = 0;
    double until = h_now() + 30;
    while (got < want && h_now() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        if (!m->err && m->offset < hi[m->partition]) {
            got++;
            if (n < max) {
                struct rec *r = &out[n++];
                memset(r, 0, sizeof(*r));
                snprintf(r->key, sizeof(r->key), "%.*s", (int)m->key_len, (const char *)m->key);
                char why[256];
                if (wire_decode_result(m->payload, m->len, &r->r, why, sizeof(why)) < 0)
                    fail_msg("%s: undecodable result: %s", topic, why);
            }
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_destroy(c);
    if (got < want)
        fail_msg("%s: read %lld of %lld records", topic, (long long)got, (long long)want);
    return n;
}

/* Frees what read_all decoded. */
static void free_recs(struct rec *r, size_t n)
{
    for (size_t i = 0; i < n; i++) wire_result_fini(&r[i].r);
}

/* Runs `kinfer replay -c cfg ARGS...` to the end. Returns its exit status;
 * its stdout goes to out, its stderr to <dir>/<name>.log. */
static int replay(const char *name, char *out, size_t cap, const char *const *args)
{
    char *argv[32] = {(char *)KINFER, "replay", "-c", cfg_path};
    int n = 4;
    for (int i = 0; args[i] && n < 31; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    char log[300];
    snprintf(log, sizeof(log), "%s/%s.log", h_dir(), name);
    int fd;
    pid_t pid = h_spawn(argv, &fd, log);
    assert_true(pid > 0);
    size_t used = 0;
    ssize_t r;
    while (used + 1 < cap && (r = read(fd, out + used, cap - 1 - used)) > 0) used += (size_t)r;
    out[used] = '\0';
    close(fd);
    int st = h_stop(pid, 0, 120); /* signal 0: just wait */
    fprintf(stderr, "test_replay: %s: exit %d: %s", name, st, out);
    return st;
}

/* The value of the last " key=" in the output (the summary line comes
 * last), or -1. */
static long long field(const char *out, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), " %s=", key);
    const char *last = NULL;
    for (const char *p = strstr(out, pat); p; p = strstr(p + 1, pat)) last = p;
    return last ? strtoll(last + strlen(pat), NULL, 10) : -1;
}

/* Whether the file at <dir>/<name>.log contains s. */
static int log_has(const char *name, const char *s)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/%s.log", h_dir(), name);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) found = strstr(line, s) != NULL;
    fclose(f);
    return found;
}

/* How many lines of <dir>/<name>.log contain s. */
static int log_count(const char *name, const char *s)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/%s.log", h_dir(), name);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof(line), f)) n += strstr(line, s) != NULL;
    fclose(f);
    return n;
}

/* Checks that the records are exactly the jobs of rp.jobs with
 * k_lo[p] <= k < k_hi[p], each once, from model name. */
static void check_exact_set(struct rec *recs, size_t n, const int *k_lo, const int *k_hi,
                            const char *name, const struct ref_model *m)
{
    static int seen[PARTS][PER_PART];
    memset(seen, 0, sizeof(seen));
    size_t want = 0;
    for (int p = 0; p < PARTS; p++) want += (size_t)(k_hi[p] - k_lo[p]);
    for (size_t i = 0; i < n; i++) {
        int p, k;
        id_pk(recs[i].r.id, &p, &k);
        assert_string_equal(recs[i].key, recs[i].r.id);
        assert_true(p >= 0 && p < PARTS && k >= 0 && k < PER_PART);
        if (k < k_lo[p] || k >= k_hi[p])
            fail_msg("%s is outside the replayed range of partition %d: [%d, %d)",
                     recs[i].r.id, p, k_lo[p], k_hi[p]);
        if (seen[p][k]++) fail_msg("%s answered twice", recs[i].r.id);
        assert_string_equal(recs[i].r.topic, "rp.jobs");
        assert_int_equal(recs[i].r.partition, p);
        assert_int_equal(recs[i].r.offset, k);
        check_result(&recs[i].r, name, m, p, k);
    }
    assert_int_equal(n, want);
}

/* ---- bounds as text ------------------------------------------------------ */

/* replay_parse_time against a table: accepted forms and their instants,
 * and what must be refused. */
static void test_parse_time(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int64_t ms; /* -1: must be refused */
    } cases[] = {
        {"1700000000000", 1700000000000LL},
        {"0", 0},
        {"2023-11-14T22:13:20Z", 1700000000000LL},
        {"2023-11-14t22:13:20z", 1700000000000LL},
        {"2023-11-14 22:13:20Z", 1700000000000LL},
        {"2023-11-14T23:13:20+01:00", 1700000000000LL},
        {"2023-11-14T17:43:20-04:30", 1700000000000LL},
        {"2023-11-14T22:13:20.5Z", 1700000000500LL},
        {"2023-11-14T22:13:20.123Z", 1700000000123LL},
        {"2023-11-14T22:13:20.1230Z", 1700000000123LL},
        {"2023-11-14T22:13:20.1231Z", 1700000000124LL}, /* rounds up */
        {"1970-01-01T00:00:00Z", 0},
        {"2024-02-29T00:00:00Z", 1709164800000LL},
        {"2000-03-01T00:00:00Z", 951868800000LL},
        {"2023-11-14T22:13:20", -1},     /* no offset */
        {"2023-02-29T00:00:00Z", -1},    /* not a leap year */
        {"2023-13-01T00:00:00Z", -1},
        {"2023-11-14T24:00:00Z", -1},
        {"2023-11-14T22:13Z", -1},
        {"2023-11-14", -1},
        {"2023-1-14T22:13:20Z", -1},
        {"2023-11-14T22:13:20.Z", -1},
        {"2023-11-14T22:13:20+0100", -1},
        {"1969-12-31T23:59:59Z", -1},
        {"99999999999999999999", -1},
        {"", -1},
        {"yesterday", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t ms = -7;
        char why[256] = "";
        int rc = replay_parse_time(cases[i].s, &ms, why, sizeof(why));
        if (cases[i].ms < 0) {
            if (rc == 0) fail_msg("'%s' was accepted as %lld", cases[i].s, (long long)ms);
            assert_true(why[0] != '\0');
        } else {
            if (rc != 0) fail_msg("'%s' was refused: %s", cases[i].s, why);
            if (ms != cases[i].ms)
                fail_msg("'%s' = %lld, expected %lld", cases[i].s, (long long)ms,
                         (long long)cases[i].ms);
        }
    }
}

/* ---- plans and refusals ----------------------------------------------------- */

/* --dry-run counts per partition for each kind of bound, and bad
 * arguments stop the replay before it runs (exit 1, a message). */
static void test_dry_run_and_bad_bounds(void **state)
{
    (void)state;
    char out[8192];
    /* Jobs 10..29 of every partition by time: 80. */
    const char *by_time[] = {"--from", "2023-11-14T22:13:30Z", "--to", "1700000030000",
                             "--dry-run", NULL};
    assert_int_equal(replay("dry-time", out, sizeof(out), by_time), 0);
    assert_int_equal(field(out, "jobs"), 80);
    assert_int_equal(field(out, "partitions"), PARTS);
    /* The same instant written as another offset is the same plan. */
    const char *by_time2[] = {"--from", "2023-11-14T23:13:30+01:00", "--to",
                              "2023-11-14T22:13:50Z", "--dry-run", NULL};
    assert_int_equal(replay("dry-time2", out, sizeof(out), by_time2), 0);
    assert_int_equal(field(out, "jobs"), 80);
    /* A time between two records starts at the later one: 10.005 s is
     * after job 10 of partition 0 (10.000) but before job 10 of
     * partition 1 (10.010). */
    const char *between[] = {"--from", "1700000010005", "--to", "now", "--dry-run", NULL};
    assert_int_equal(replay("dry-between", out, sizeof(out), between), 0);
    assert_int_equal(field(out, "jobs"), 39 + 40 * 3);
    /* Offsets: partitions 0 and 1 only. */
    const char *by_off[] = {"--from", "0:5,rp.jobs:1:5", "--to", "0:15,1:25", "--dry-run", NULL};
    assert_int_equal(replay("dry-off", out, sizeof(out), by_off), 0);
    assert_int_equal(field(out, "jobs"), 30);
    assert_int_equal(field(out, "partitions"), 2);
    /* Everything. */
    const char *all[] = {"--from", "earliest", "--to", "now", "--dry-run", NULL};
    assert_int_equal(replay("dry-all", out, sizeof(out), all), 0);
    assert_int_equal(field(out, "jobs"), N_JOBS);

    /* Refused before anything runs. */
    const char *const bad[][7] = {
        {"--from", "1700000030000", "--to", "1700000010000", NULL},  /* reversed */
        {"--from", "0:20", "--to", "0:10", NULL},                    /* reversed offsets */
        {"--from", "0:0,9:0", "--to", "now", NULL},                  /* no partition 9 */
        {"--from", "yesterday", "--to", "now", NULL},
        {"--from", "earliest", "--to", "now", "--model", "zzz", NULL},
        {"--from", "earliest", "--to", "now", "--redis", "maybe", NULL},
        {"--from", "earliest", "--to", "now", "--topic", "no.such.topic", NULL},
        {"--from", "earliest", "--to", "now", "--reply-topic", "rp.jobs", NULL},
        {"--from", "earliest", NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "bad-%zu", i);
        if (replay(name, out, sizeof(out), bad[i]) != 1)
            fail_msg("%s %s %s %s was not refused", bad[i][0], bad[i][1],
                     bad[i][2] ? bad[i][2] : "", bad[i][3] ? bad[i][3] : "");
        assert_true(log_has(name, "kinfer replay: "));
    }
}

/* ---- exact ranges ------------------------------------------------------------ */

/* A middle time range (RFC 3339 start, Unix ms end): exactly jobs 10..29
 * of every partition on the reply topic, each once, from model a. */
static void test_time_range(void **state)
{
    (void)state;
    char out[8192];
    const char *args[] = {"--from", "2023-11-14T22:13:30Z", "--to", "1700000030000",
                          "--redis", "off", "--reply-topic", "rp.r.time", NULL};
    assert_int_equal(replay("time", out, sizeof(out), args), 0);
    assert_non_null(strstr(out, "kinfer replay: done "));
    assert_int_equal(field(out, "jobs"), 80);
    assert_int_equal(field(out, "ok"), 80);
    assert_int_equal(field(out, "errors"), 0);
    static struct rec recs[2 * N_JOBS];
    size_t n = read_all("rp.r.time", recs, 2 * N_JOBS);
    const int lo[PARTS] = {10, 10, 10, 10}, hi[PARTS] = {30, 30, 30, 30};
    check_exact_set(recs, n, lo, hi, "a", &model_a);
    free_recs(recs, n);
}

/* Offsets 5..14 of partition 0 and 5..24 of partition 1 (one entry in the
 * TOPIC:P:OFF form): those jobs, nothing from partitions 2 and 3. */
static void test_offset_range(void **state)
{
    (void)state;
    char out[8192];
    const char *args[] = {"--from", "0:5,rp.jobs:1:5", "--to", "0:15,1:25", "--redis", "off",
                          "--reply-topic", "rp.r.off", "--priority", "2", NULL};
    assert_int_equal(replay("offsets", out, sizeof(out), args), 0);
    assert_int_equal(field(out, "jobs"), 30);
    static struct rec recs[2 * N_JOBS];
    size_t n = read_all("rp.r.off", recs, 2 * N_JOBS);
    const int lo[PARTS] = {5, 5, 0, 0}, hi[PARTS] = {15, 25, 0, 0};
    check_exact_set(recs, n, lo, hi, "a", &model_a);
    free_recs(recs, n);
}

/* ---- Redis modes and --model ----------------------------------------------------- */

/* GETs rp:<id> for jobs k_lo..PER_PART-1 of every partition into bodies
 * (malloc'd, NULL when absent). */
static void get_keys(redisContext *rc, int k_lo, char **bodies, size_t *lens)
{
    for (int p = 0; p < PARTS; p++)
        for (int k = k_lo; k < PER_PART; k++) {
            size_t i = (size_t)(p * PER_PART + k);
            redisReply *r = redisCommand(rc, "GET rp:rp-%d-%d", p, k);
            assert_non_null(r);
            bodies[i] = NULL;
            if (r->type == REDIS_REPLY_STRING) {
                bodies[i] = malloc(r->len);
                memcpy(bodies[i], r->str, r->len);
                lens[i] = r->len;
            }
            freeReplyObject(r);
        }
}

/* if-absent fills only missing keys, on overwrites; both with model b,
 * which the result names and whose values it carries. Also: a finished
 * replay refuses to run again without --restart. */
static void test_redis_modes_and_model(void **state)
{
    (void)state;
    redisContext *rc = redisConnect("127.0.0.1", redis_port);
    assert_true(rc && !rc->err);
    static char *before[N_JOBS], *after[N_JOBS];
    static size_t blen[N_JOBS], alen[N_JOBS];
    /* The live worker answered every job with model a. */
    get_keys(rc, 40, before, blen);
    for (int p = 0; p < PARTS; p++)
        for (int k = 40; k < PER_PART; k++) assert_non_null(before[p * PER_PART + k]);
    /* Two results per partition go missing (expired, say). */
    for (int p = 0; p < PARTS; p++)
        for (int k = 40; k < 42; k++) {
            redisReply *r = redisCommand(rc, "DEL rp:rp-%d-%d", p, k);
            freeReplyObject(r);
        }

    /* Backfill jobs 40..49 with model b, if absent: only the holes fill. */
    char out[8192];
    const char *ifabs[] = {"--from", "0:40,1:40,2:40,3:40", "--to", "now", "--model", "b",
                           "--reply-topic", "rp.r.model", NULL};
    assert_int_equal(replay("if-absent", out, sizeof(out), ifabs), 0);
    assert_int_equal(field(out, "jobs"), 40);
    get_keys(rc, 40, after, alen);
    for (int p = 0; p < PARTS; p++)
        for (int k = 40; k < PER_PART; k++) {
            size_t i = (size_t)(p * PER_PART + k);
            assert_non_null(after[i]);
            struct wire_result r;
            char why[256];
            assert_int_equal(wire_decode_result(after[i], alen[i], &r, why, sizeof(why)), 0);
            if (k < 42) {
                check_result(&r, "b", &model_b, p, k);
            } else {
                assert_int_equal(alen[i], blen[i]);
                assert_memory_equal(after[i], before[i], blen[i]);
                check_result(&r, "a", &model_a, p, k);
            }
            wire_result_fini(&r);
            free(after[i]);
        }

    /* The same replay again: it already ran to its end. */
    assert_int_equal(replay("again", out, sizeof(out), ifabs), 1);
    assert_true(log_has("again", "already ran to its end"));

    /* --redis on overwrites every one of them with model b. */
    const char *on[] = {"--from", "0:40,1:40,2:40,3:40", "--to", "now", "--model", "b",
                        "--reply-topic", "rp.r.model", "--redis", "on", "--restart", NULL};
    assert_int_equal(replay("on", out, sizeof(out), on), 0);
    assert_int_equal(field(out, "jobs"), 40);
    get_keys(rc, 40, after, alen);
    for (int p = 0; p < PARTS; p++)
        for (int k = 40; k < PER_PART; k++) {
            size_t i = (size_t)(p * PER_PART + k);
            struct wire_result r;
            char why[256];
            assert_non_null(after[i]);
            assert_int_equal(wire_decode_result(after[i], alen[i], &r, why, sizeof(why)), 0);
            check_result(&r, "b", &model_b, p, k);
            wire_result_fini(&r);
            free(after[i]);
            free(before[i]);
        }
    /* Both runs published all 40 to the reply topic, all from model b. */
    static struct rec recs[2 * N_JOBS];
    size_t n = read_all("rp.r.model", recs, 2 * N_JOBS);
    assert_int_equal(n, 80);
    for (size_t i = 0; i < n; i++) {
        int p, k;
        id_pk(recs[i].r.id, &p, &k);
        assert_true(k >= 40);
        check_result(&recs[i].r, "b", &model_b, p, k);
    }
    free_recs(recs, n);
    redisFree(rc);
}

/* ---- interrupted and resumed ------------------------------------------------------- */

/* Records on topic now (sum of high watermarks). */
static long long topic_count(const char *topic)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    long long sum = 0;
    for (int p = 0; p < PARTS; p++) {
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(c, topic, p, &lo, &hi, 5000) == 0) sum += hi - lo;
    }
    rd_kafka_destroy(c);
    return sum;
}

/* SIGINT part-way (exit 3), a refusal without --resume, then --resume to
 * the end: every job answered, repeats within the in-flight window. */
static void test_interrupt_and_resume(void **state)
{
    (void)state;
    produce_jobs("rs.jobs", "rs", RS_PER_PART, 0);
    const char *args[] = {"--topic", "rs.jobs", "--from", "earliest", "--to", "now",
                          "--redis", "off", "--reply-topic", "rs.r", "--rate", "1000",
                          "--progress-ms", "200", NULL};
    char *argv[32] = {(char *)KINFER, "replay", "-c", cfg_path};
    int n = 4;
    for (int i = 0; args[i]; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    char log[300];
    snprintf(log, sizeof(log), "%s/resume-1.log", h_dir());
    int fd;
    pid_t pid = h_spawn(argv, &fd, log);
    /* Interrupt it part-way. */
    double until = h_now() + 30;
    long long mid = 0;
    while (h_now() < until && (mid = topic_count("rs.r")) < RS_JOBS / 5) h_sleep_ms(20);
    assert_true(mid >= RS_JOBS / 5);
    int st = h_stop(pid, SIGINT, 60);
    char out[8192];
    ssize_t got = read(fd, out, sizeof(out) - 1);
    out[got > 0 ? got : 0] = '\0';
    close(fd);
    fprintf(stderr, "test_replay: resume-1: exit %d after %lld results: %s", st, mid, out);
    assert_int_equal(st, 3);
    assert_non_null(strstr(out, "interrupted"));
    long long first = field(out, "jobs");
    assert_true(first > 0 && first < RS_JOBS);
    assert_true(log_count("resume-1", "replay_progress ") > 0);

    /* Without --resume it will not silently start over. */
    assert_int_equal(replay("resume-refused", out, sizeof(out), args), 1);
    assert_true(log_has("resume-refused", "--resume continues it"));

    const char *more[32];
    for (n = 0; args[n]; n++) more[n] = args[n];
    more[n++] = "--resume";
    more[n] = NULL;
    assert_int_equal(replay("resume-2", out, sizeof(out), more), 0);
    long long second = field(out, "jobs");
    fprintf(stderr, "test_replay: first run %lld jobs, resumed run %lld\n", first, second);
    assert_true(first + second >= RS_JOBS && first + second <= RS_JOBS + INFLIGHT_WINDOW);

    /* Every job answered at least once; repeats within the in-flight window. */
    static struct rec recs[RS_JOBS + 4 * INFLIGHT_WINDOW];
    size_t nr = read_all("rs.r", recs, RS_JOBS + 4 * INFLIGHT_WINDOW);
    static int seen[PARTS][RS_PER_PART];
    memset(seen, 0, sizeof(seen));
    for (size_t i = 0; i < nr; i++) {
        int p, k;
        id_pk(recs[i].r.id, &p, &k);
        assert_true(p >= 0 && p < PARTS && k >= 0 && k < RS_PER_PART);
        assert_true(recs[i].r.ok);
        seen[p][k]++;
    }
    for (int p = 0; p < PARTS; p++)
        for (int k = 0; k < RS_PER_PART; k++)
            if (!seen[p][k]) fail_msg("rs-%d-%d was never answered", p, k);
    fprintf(stderr, "test_replay: %zu results for %d jobs (window %d)\n", nr, RS_JOBS,
            INFLIGHT_WINDOW);
    assert_true(nr >= RS_JOBS && nr <= RS_JOBS + INFLIGHT_WINDOW);
    free_recs(recs, nr);
}

/* ---- the live group ----------------------------------------------------------------- */

/* After every replay: the live group committed nothing new and never
 * rebalanced; its worker still stops cleanly. */
static void test_live_group_untouched(void **state)
{
    (void)state;
    assert_int_equal(h_committed_sum(brokers, "g-live", "rp.jobs", PARTS), live_committed);
    assert_int_equal(h_committed_sum(brokers, "g-live", "rs.jobs", PARTS), 0);
    /* The live worker kept its partitions throughout: no rebalance. */
    assert_int_equal(log_count("live", "partitions_revoked"), 0);
    assert_int_equal(log_count("live", "partitions_lost"), 0);
    assert_int_equal(h_stop(live_worker, SIGTERM, 30), 0);
    live_worker = 0;
    assert_int_equal(h_committed_sum(brokers, "g-live", "rp.jobs", PARTS), live_committed);
}

/* ---- setup ---------------------------------------------------------------------------- */

static void write_config(void)
{
    snprintf(cfg_path, sizeof(cfg_path), "%s/replay.cfg", h_dir());
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    const char *layers =
        "layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
        "    { op = \"relu\"; }, { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } );";
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"g-live\"; topics = [ \"rp.jobs\" ];\n"
            "  reply_topic = \"rp.results\"; dlq_topic = \"rp.dlq\";\n"
            "  properties = ( ( \"auto.commit.interval.ms\", \"200\" ),\n"
            "                 ( \"fetch.wait.max.ms\", \"10\" ) ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"rp:\"; ttl_ms = 600000; };\n"
            "batching = { max_batch_rows = 8; max_wait_ms = 5; max_job_rows = 8;\n"
            "  max_queued_rows = 256; max_inflight_batches = 2; };\n"
            "models = ( { name = \"a\"; path = \"%s\";\n  %s },\n"
            "           { name = \"b\"; path = \"%s\";\n  %s } );\n"
            "default_model = \"a\";\n"
            "replay = { reply_topic = \"rp.replay\"; };\n"
            "log = { level = \"info\"; };\n"
            "metrics = { listen = \"\"; heartbeat_prefix = \"\"; };\n",
            brokers, redis_port, model_a.path, layers, model_b.path, layers);
    fclose(f);
}

/* Models, broker, Redis, the history of jobs, and the live worker that
 * answers them first. */
/* ---- deadlines do not apply to history ----------------------------------------- */

/* Jobs whose deadline_ms and timeout_ms passed long ago still run in a
 * replay (a backfill must not turn them into deadline_exceeded). */
static void test_replay_ignores_deadlines(void **state)
{
    (void)state;
    rd_kafka_t *pr = h_producer(brokers);
    for (int k = 0; k < 6; k++) {
        char id[32];
        float in[IN_W];
        snprintf(id, sizeof(id), "rd-%d", k);
        job_input(0, k, in);
        struct wire_job j = {.id = id, .input = in, .n_input = IN_W, .priority = -1,
                             .deadline_ms = k % 2 ? 1000 : 0, .timeout_ms = k % 2 ? -1 : 1};
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
        assert_int_equal(h_produce(pr, "rd.jobs", id, strlen(id), body, len, NULL), 0);
        free(body);
    }
    assert_int_equal(rd_kafka_flush(pr, 10000), 0);
    rd_kafka_destroy(pr);
    char out[8192];
    const char *args[] = {"--topic", "rd.jobs", "--from", "earliest", "--to", "now", "--redis",
                          "off", "--reply-topic", "rd.r", NULL};
    assert_int_equal(replay("deadlines", out, sizeof(out), args), 0);
    assert_int_equal(field(out, "ok"), 6);
    static struct rec recs[16];
    size_t n = read_all("rd.r", recs, 16);
    assert_int_equal(n, 6);
    for (size_t i = 0; i < n; i++)
        if (!recs[i].r.ok) fail_msg("%s: %s %s", recs[i].r.id, recs[i].r.code, recs[i].r.message);
    free_recs(recs, n);
}

static int setup(void **state)
{
    (void)state;
    struct ref_model *ms[] = {&model_a, &model_b};
    for (int i = 0; i < 2; i++) {
        snprintf(ms[i]->path, sizeof(ms[i]->path), "%s/model-%c.safetensors", h_dir(), 'a' + i);
        char err[256];
        if (model_write_demo(ms[i]->path, IN_W, HID_W, OUT_W, 11 + 11 * (uint64_t)i, err,
                             sizeof(err)) < 0) {
            fprintf(stderr, "model_write_demo: %s\n", err);
            return -1;
        }
        load_reference(ms[i]);
    }
    if (h_start_broker(KINFER, "rp.jobs,rp.results,rp.dlq,rp.replay,rp.r.time,rp.r.off,"
                               "rp.r.model,rs.jobs,rs.r,rd.jobs,rd.r", PARTS, brokers, sizeof(brokers)) < 0)
        return -1;
    if (h_start_redis(&redis_port) < 0) return -1;
    write_config();
    fprintf(stderr, "test_replay: broker %s, redis port %d, logs in %s\n", brokers, redis_port,
            h_dir());

    /* History: jobs at known times, answered by a live worker (model a),
     * which stays up, in its group, while the replays run. */
    produce_jobs("rp.jobs", "rp", PER_PART, 1);
    char log[300];
    snprintf(log, sizeof(log), "%s/live.log", h_dir());
    char *argv[] = {(char *)KINFER, "worker", "-c", cfg_path, NULL};
    live_worker = h_spawn(argv, NULL, log);
    double until = h_now() + 60;
    while (h_now() < until &&
           (live_committed = h_committed_sum(brokers, "g-live", "rp.jobs", PARTS)) < N_JOBS)
        h_sleep_ms(100);
    if (live_committed != N_JOBS) {
        fprintf(stderr, "test_replay: the live worker committed %lld of %d\n", live_committed,
                N_JOBS);
        return -1;
    }
    return 0;
}

/* Every child process goes, whatever failed. */
static int teardown(void **state)
{
    (void)state;
    h_kill_all();
    return 0;
}

/* The parser table on its own, then the end-to-end cases in order. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest unit[] = {cmocka_unit_test(test_parse_time)};
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dry_run_and_bad_bounds),
        cmocka_unit_test(test_time_range),
        cmocka_unit_test(test_offset_range),
        cmocka_unit_test(test_redis_modes_and_model),
        cmocka_unit_test(test_interrupt_and_resume),
        cmocka_unit_test(test_replay_ignores_deadlines),
        cmocka_unit_test(test_live_group_untouched),
    };
    int failed = cmocka_run_group_tests_name("replay_parse_time", unit, NULL, NULL);
    failed += cmocka_run_group_tests_name("replay_end_to_end", tests, setup, teardown);
    return failed;
}

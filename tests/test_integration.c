/* test_integration.c - the worker end to end, with real parts: `kinfer
 * broker` (librdkafka's mock cluster in its own process, the Kafka protocol
 * on loopback), a real redis-server, and the worker binary. Jobs go in with
 * librdkafka in both encodings; results are checked in Redis and on the
 * reply topic against the model run here in float64; bad jobs must come
 * back with the right error code or land in the dead-letter topic; a
 * SIGTERM mid-load followed by a restart must lose nothing.
 *
 * Each test uses its own topics and consumer group on one shared broker
 * and Redis, so the tests are independent of each other's leftovers. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <msgpack.h>

#include "../base/utf8.h"
#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "harness.h"
#include "refmlp.h"
#include "tablebody.h"
#include "testutil.h"

#define IN_W 8
#define HID_W 16
#define OUT_W 4
#define PARTS 4

/* The binary under test: $KINFER_BIN (make test sets it), else build/kinfer. */
static const char *kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}
#define KINFER kinfer_bin()

/* The backend the workers run: $KINFER_TEST_BACKEND ("cuda" on a GPU
 * machine runs this whole suite on the CUDA backend), else the CPU. */
static const char *test_backend(void)
{
    const char *b = getenv("KINFER_TEST_BACKEND");
    return b && *b ? b : "cpu";
}

static char brokers[512];
static int redis_port;
static char model_path[300];
static struct ref_mlp reference_model; /* the demo model, in float64 */



/* Writes a worker config for the given topics and group; returns its path. */
static const char *write_config(const char *name, const char *topic, const char *reply,
                                const char *dlq, const char *group, const char *extra)
{
    static char path[300];
    snprintf(path, sizeof(path), "%s/%s.cfg", h_dir(), name);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"%s\"; topics = [ \"%s\" ];\n"
            "  reply_topic = \"%s\"; dlq_topic = \"%s\";\n"
            "  properties = ( ( \"auto.commit.interval.ms\", \"200\" ), ( \"fetch.wait.max.ms\", \"10\" ) ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"%s:\"; ttl_ms = 600000; };\n"
            "batching = { max_batch_rows = 16; max_wait_ms = 5; };\n"
            "models = ( { name = \"demo\"; path = \"%s\";\n"
            "  layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
            "             { op = \"relu\"; },\n"
            "             { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); } );\n"
            "log = { level = \"info\"; };\n"
            "worker = { backend = \"%s\"; };\n"
            "metrics = { listen = \"\"; heartbeat_prefix = \"\"; };\n%s\n",
            brokers, group, topic, reply, dlq, redis_port, name, model_path, test_backend(),
            extra ? extra : "");
    fclose(f);
    return path;
}

static pid_t start_worker(const char *cfg, const char *name)
{
    char log[300];
    snprintf(log, sizeof(log), "%s/%s.worker.log", h_dir(), name);
    char *argv[] = {(char *)KINFER, "worker", "-c", (char *)cfg, NULL};
    return h_spawn(argv, NULL, log);
}

/* Polls Redis until every key prefix:ids[i] exists or timeout; stores
 * each body (malloc'd) in bodies[i]. Returns how many were found. */
static size_t wait_results(const char *prefix, char ids[][64], size_t n, char **bodies,
                           size_t *lens, double timeout_s)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    assert_true(c && !c->err);
    size_t found = 0;
    double until = h_now() + timeout_s;
    while (found < n && h_now() < until) {
        for (size_t i = 0; i < n; i++) {
            if (bodies[i]) continue;
            redisReply *r = redisCommand(c, "GET %s:%s", prefix, ids[i]);
            if (r && r->type == REDIS_REPLY_STRING) {
                bodies[i] = malloc(r->len);
                memcpy(bodies[i], r->str, r->len);
                lens[i] = r->len;
                found++;
            }
            if (r) freeReplyObject(r);
        }
        if (found < n) h_sleep_ms(100);
    }
    redisFree(c);
    return found;
}

struct reply_rec {
    char key[64];
    char *val;
    size_t len;
    char ct[64];
    char hdr_code[64];
    char hdr_topic[64];
    char hdr_error[PROTO_ERRMSG_MAX + 8];
    size_t hdr_error_len;
};

/* Reads up to max records from topic until `want` records came or
 * timeout. Returns how many were read. */
static size_t read_topic(const char *topic, struct reply_rec *out, size_t max, size_t want,
                         double timeout_s)
{
    rd_kafka_t *c = h_reader(brokers, topic);
    size_t n = 0;
    double until = h_now() + timeout_s;
    while (n < want && n < max && h_now() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        if (!m->err) {
            struct reply_rec *r = &out[n++];
            memset(r, 0, sizeof(*r));
            size_t kl = m->key_len < 63 ? m->key_len : 63;
            if (kl) memcpy(r->key, m->key, kl);
            r->val = malloc(m->len + 1);
            memcpy(r->val, m->payload, m->len);
            r->len = m->len;
            rd_kafka_headers_t *h;
            const void *v;
            size_t vs;
            if (rd_kafka_message_headers(m, &h) == 0) {
                if (rd_kafka_header_get_last(h, "content-type", &v, &vs) == 0)
                    snprintf(r->ct, sizeof(r->ct), "%.*s", (int)vs, (const char *)v);
                if (rd_kafka_header_get_last(h, "x-error-code", &v, &vs) == 0)
                    snprintf(r->hdr_code, sizeof(r->hdr_code), "%.*s", (int)vs, (const char *)v);
                if (rd_kafka_header_get_last(h, "x-source-topic", &v, &vs) == 0)
                    snprintf(r->hdr_topic, sizeof(r->hdr_topic), "%.*s", (int)vs, (const char *)v);
                if (rd_kafka_header_get_last(h, "x-error", &v, &vs) == 0) {
                    r->hdr_error_len = vs < sizeof(r->hdr_error) ? vs : sizeof(r->hdr_error) - 1;
                    memcpy(r->hdr_error, v, r->hdr_error_len);
                }
            }
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return n;
}

/* Checks one decoded ok result against the float64 reference. */
static void check_values(const struct wire_result *r, const float *in, size_t rows)
{
    assert_true(r->ok);
    assert_int_equal(r->rows, rows);
    assert_int_equal(r->width, OUT_W);
    assert_non_null(r->output);
    double ref[64 * OUT_W];
    ref_mlp_forward(&reference_model, in, rows, ref);
    for (size_t k = 0; k < rows * OUT_W; k++) {
        /* float32 through two small GEMMs: 1e-5 relative (plus 1e-5 absolute
         * near zero) holds with room; JSON carries 9 significant digits. */
        double tol = 1e-5 * fmax(1.0, fabs(ref[k]));
        if (fabs((double)r->output[k] - ref[k]) > tol)
            fail_msg("%s: output[%zu] = %.9g, reference %.9g", r->id, k, r->output[k], ref[k]);
    }
}

/* Decodes n result bodies of one-row jobs, checks each against the
 * reference for its input, and frees the bodies. */
static void check_single_row_results(char **bodies, const size_t *lens,
                                     const float (*inputs)[IN_W], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[i], lens[i], &r, err, sizeof(err)), 0);
        check_values(&r, inputs[i], 1);
        wire_result_fini(&r);
        free(bodies[i]);
    }
}

/* Prints and counts the warning and error lines a worker's log holds up to
 * its first partitions_assigned line: what a clean start must not have. */
static size_t start_warnings(const char *name)
{
    char path[300], line[4096];
    snprintf(path, sizeof(path), "%s/%s.worker.log", h_dir(), name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = 0;
    while (fgets(line, sizeof(line), f) && !strstr(line, "event=partitions_assigned")) {
        if (strstr(line, " level=warn ") || strstr(line, " level=error ")) {
            fprintf(stderr, "start: %s", line);
            n++;
        }
    }
    fclose(f);
    return n;
}

/* ---- good jobs in every encoding ----------------------------------------- */

#define N_GOOD 120

static void test_results_every_encoding(void **state)
{
    (void)state;
    const char *cfg = write_config("good", "good.jobs", "good.results", "good.dlq", "g-good", NULL);
    pid_t w = start_worker(cfg, "good");
    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_GOOD][64];
    static float inputs[N_GOOD][3 * IN_W];
    size_t rows[N_GOOD];
    for (size_t i = 0; i < N_GOOD; i++) {
        snprintf(ids[i], sizeof(ids[i]), "good-%zu", i);
        rows[i] = i % 7 == 0 ? 3 : 1;
        for (size_t k = 0; k < rows[i] * IN_W; k++) inputs[i][k] = tu_randf(-2, 2);
        /* Four ways in: msgpack bin, msgpack number array, JSON, and
         * msgpack with the id only in the record key. */
        int way = (int)(i % 4);
        char meta[64];
        snprintf(meta, sizeof(meta), "{\"n\":%zu,\"tag\":[\"x\",true,null]}", i);
        struct wire_job j = {.id = way == 3 ? NULL : ids[i], .input = inputs[i],
                             .n_input = rows[i] * IN_W, .input_as_array = way == 1,
                             .timeout_ms = -1, .priority = i % 10 == 0 ? 5 : -1,
                             .meta_json = i % 3 == 0 ? meta : NULL};
        unsigned char *body;
        size_t len;
        enum proto_enc enc = way == 2 ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK;
        assert_int_equal(wire_encode_job(&j, enc, &body, &len), 0);
        if (way == 3) {
            /* Remove the empty id field: re-encode without it. */
            free(body);
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            msgpack_packer pk;
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            msgpack_pack_map(&pk, 1);
            msgpack_pack_str(&pk, 5);
            msgpack_pack_str_body(&pk, "input", 5);
            msgpack_pack_bin(&pk, rows[i] * IN_W * 4);
            msgpack_pack_bin_body(&pk, inputs[i], rows[i] * IN_W * 4);
            body = (unsigned char *)sb.data;
            len = sb.size;
        }
        assert_int_equal(h_produce(p, "good.jobs", ids[i], strlen(ids[i]), body, len,
                                   enc == PROTO_ENC_JSON ? "application/json" : NULL), 0);
        free(body);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    static char *bodies[N_GOOD];
    static size_t lens[N_GOOD];
    size_t found = wait_results("good", ids, N_GOOD, bodies, lens, 60);
    assert_int_equal(found, N_GOOD);
    for (size_t i = 0; i < N_GOOD; i++) {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[i], lens[i], &r, err, sizeof(err)), 0);
        assert_string_equal(r.id, ids[i]);
        assert_string_equal(r.model, "demo");
        check_values(&r, inputs[i], rows[i]);
        /* The result is encoded the way the job was. */
        assert_int_equal(bodies[i][0] == '{', i % 4 == 2);
        assert_string_equal(r.topic, "good.jobs");
        assert_true(r.partition >= 0 && r.partition < PARTS);
        assert_true(r.offset >= 0);
        assert_true(r.batch_rows >= (int64_t)rows[i] && r.batch_rows <= 16 + 2);
        assert_true(r.total_ms >= 0 && r.queued_ms >= 0 && r.infer_ms >= 0);
        if (i % 3 == 0 && i % 4 != 3) { /* the key-only body carries no meta */
            char meta[64];
            snprintf(meta, sizeof(meta), "{\"n\":%zu,\"tag\":[\"x\",true,null]}", i);
            assert_true(r.has_meta);
            assert_string_equal(r.meta_json, meta);
        } else {
            assert_false(r.has_meta);
        }
        wire_result_fini(&r);
    }

    /* The reply topic holds the same bodies, keyed by id, with a
     * content-type header, at least once each. */
    static struct reply_rec recs[N_GOOD * 2];
    size_t n = read_topic("good.results", recs, N_GOOD * 2, N_GOOD, 30);
    assert_true(n >= N_GOOD);
    for (size_t i = 0; i < N_GOOD; i++) {
        int seen = 0;
        for (size_t k = 0; k < n; k++) {
            if (strcmp(recs[k].key, ids[i]) != 0) continue;
            seen++;
            assert_int_equal(recs[k].len, lens[i]);
            assert_memory_equal(recs[k].val, bodies[i], lens[i]);
            assert_string_equal(recs[k].ct, i % 4 == 2 ? "application/json" : "application/msgpack");
        }
        if (!seen) fail_msg("no reply record for %s", ids[i]);
    }
    for (size_t k = 0; k < n; k++) free(recs[k].val);
    for (size_t i = 0; i < N_GOOD; i++) free(bodies[i]);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    /* A clean start warns about nothing (its config holds consumer-only
     * librdkafka properties, which the producer must not be given). */
    assert_int_equal(start_warnings("good"), 0);
}

/* ---- error results and dead letters -------------------------------------- */

static void test_errors_and_dead_letters(void **state)
{
    (void)state;
    const char *cfg = write_config("bad", "bad.jobs", "bad.results", "bad.dlq", "g-bad", NULL);
    pid_t w = start_worker(cfg, "bad");
    rd_kafka_t *p = h_producer(brokers);
    float good[IN_W + 1], nan_in[IN_W]; /* one spare: a case sends IN_W + 1 values */
    for (int k = 0; k < IN_W; k++) good[k] = nan_in[k] = tu_randf(-1, 1);
    good[IN_W] = 0.5f;
    nan_in[3] = NAN;
    struct {
        const char *id;
        struct wire_job j;
        enum proto_enc enc;
        const char *code;
    } cases[] = {
        {"bad-width", {.input = good, .n_input = IN_W - 1}, PROTO_ENC_MSGPACK, "invalid_input"},
        {"bad-width-json", {.input = good, .n_input = IN_W + 1}, PROTO_ENC_JSON, "invalid_input"},
        {"bad-model", {.model = "nope", .input = good, .n_input = IN_W}, PROTO_ENC_MSGPACK, "unknown_model"},
        {"bad-deadline", {.input = good, .n_input = IN_W, .deadline_ms = 1000}, PROTO_ENC_MSGPACK, "deadline_exceeded"},
        {"bad-timeout", {.input = good, .n_input = IN_W, .timeout_ms = 0}, PROTO_ENC_JSON, "deadline_exceeded"},
        {"bad-nan", {.input = nan_in, .n_input = IN_W}, PROTO_ENC_MSGPACK, "invalid_input"},
        {"bad-priority", {.input = good, .n_input = IN_W, .priority = 12}, PROTO_ENC_MSGPACK, "invalid_input"},
        {"bad-noinput", {.input = NULL}, PROTO_ENC_MSGPACK, "invalid_input"},
        {"ok-control", {.input = good, .n_input = IN_W}, PROTO_ENC_MSGPACK, NULL},
    };
    size_t nc = sizeof(cases) / sizeof(cases[0]);
    static char ids[16][64];
    for (size_t i = 0; i < nc; i++) {
        snprintf(ids[i], sizeof(ids[i]), "%s", cases[i].id);
        struct wire_job j = cases[i].j;
        j.id = cases[i].id;
        if (!j.timeout_ms && strcmp(cases[i].id, "bad-timeout") != 0) j.timeout_ms = -1;
        if (!j.priority) j.priority = -1;
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, cases[i].enc, &body, &len), 0);
        assert_int_equal(h_produce(p, "bad.jobs", j.id, strlen(j.id), body, len, NULL), 0);
        free(body);
    }
    /* Records that are not jobs at all: dead-lettered with their bytes. */
    const unsigned char garbage[] = {0xc1, 0x00, 0x01};
    const unsigned char hostile[] = {0xdf, 0x10, 0x00, 0x00, 0x00}; /* map32, 2^28 entries */
    const char notjson[] = "{\"id\": \"x\", \"input\": [1, 2";
    assert_int_equal(h_produce(p, "bad.jobs", NULL, 0, garbage, sizeof(garbage), NULL), 0);
    assert_int_equal(h_produce(p, "bad.jobs", NULL, 0, hostile, sizeof(hostile), NULL), 0);
    assert_int_equal(h_produce(p, "bad.jobs", NULL, 0, notjson, strlen(notjson), NULL), 0);
    /* One that is no job either, keyed by a usable id: dead-lettered, and
     * its sender answered invalid_input under the key. */
    const char keyed[] = "{\"id\":\"bad-json\",\"text\":\"hello";
    assert_int_equal(h_produce(p, "bad.jobs", "bad-json", 8, keyed, strlen(keyed), NULL), 0);
    snprintf(ids[nc], sizeof(ids[nc]), "bad-json");
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    static char *bodies[16];
    static size_t lens[16];
    assert_int_equal(wait_results("bad", ids, nc + 1, bodies, lens, 60), nc + 1);
    {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[nc], lens[nc], &r, err, sizeof(err)), 0);
        assert_string_equal(r.id, "bad-json");
        assert_false(r.ok);
        assert_string_equal(r.code, "invalid_input");
        assert_non_null(strstr(r.message, "json"));
        wire_result_fini(&r);
        free(bodies[nc]);
    }
    for (size_t i = 0; i < nc; i++) {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[i], lens[i], &r, err, sizeof(err)), 0);
        assert_string_equal(r.id, cases[i].id);
        if (cases[i].code) {
            assert_false(r.ok);
            if (strcmp(r.code, cases[i].code) != 0)
                fail_msg("%s: code %s, expected %s (%s)", r.id, r.code, cases[i].code, r.message);
            assert_true(strlen(r.message) > 0);
            assert_null(r.output);
        } else {
            check_values(&r, good, 1);
        }
        wire_result_fini(&r);
        free(bodies[i]);
    }
    struct reply_rec dead[8];
    size_t n = read_topic("bad.dlq", dead, 8, 4, 30);
    assert_int_equal(n, 4);
    int saw_garbage = 0, saw_hostile = 0, saw_json = 0, saw_keyed = 0;
    for (size_t k = 0; k < n; k++) {
        assert_string_equal(dead[k].hdr_topic, "bad.jobs");
        assert_true(dead[k].hdr_code[0] != 0);
        if (dead[k].len == sizeof(garbage) && !memcmp(dead[k].val, garbage, sizeof(garbage))) saw_garbage = 1;
        if (dead[k].len == sizeof(hostile) && !memcmp(dead[k].val, hostile, sizeof(hostile))) saw_hostile = 1;
        if (dead[k].len == strlen(notjson) && !memcmp(dead[k].val, notjson, strlen(notjson))) saw_json = 1;
        if (dead[k].len == strlen(keyed) && !memcmp(dead[k].val, keyed, strlen(keyed))) saw_keyed = 1;
        free(dead[k].val);
    }
    assert_true(saw_garbage && saw_hostile && saw_json && saw_keyed);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    /* Everything, dead letters included, was committed on the way out. */
    assert_int_equal(h_committed_sum(brokers, "g-bad", "bad.jobs", PARTS), (long long)nc + 4);
}

/* ---- hostile field values: far deadlines, ill-formed UTF-8 ------------------ */

/* A MessagePack job whose meta holds a str of ill-formed UTF-8. */
static void produce_bad_meta(rd_kafka_t *p, const char *topic, const char *id, const float *in)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_str_with_body(&pk, id, strlen(id));
    msgpack_pack_str_with_body(&pk, "input", 5);
    msgpack_pack_bin_with_body(&pk, in, IN_W * sizeof(float));
    msgpack_pack_str_with_body(&pk, "meta", 4);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "k\xff", 2);
    msgpack_pack_str_with_body(&pk, "v\xc3(", 3);
    assert_int_equal(h_produce(p, topic, id, strlen(id), sb.data, sb.size, NULL), 0);
    msgpack_sbuffer_destroy(&sb);
}

/* Deadlines at and past where `(deadline_ms - now_ms) * 1000` overflows
 * int64 (9.3e15 ms and up, 2^63-1, and timeout_ms 2^63-1) are far in the
 * future, so the jobs run and are answered ok, not deadline_exceeded.
 * Ill-formed UTF-8 in a job's model and meta comes back repaired (U+FFFD),
 * so every str of the result is well-formed and a strict client can read
 * the error code; a broken JSON record with ill-formed UTF-8 is
 * dead-lettered with an x-error header that is well-formed too. */
static void test_hostile_fields_answered(void **state)
{
    (void)state;
    const char *cfg = write_config("hostile", "hostile.jobs", "hostile.results", "hostile.dlq",
                                   "g-hostile", NULL);
    pid_t w = start_worker(cfg, "hostile");
    rd_kafka_t *p = h_producer(brokers);
    float in[IN_W];
    for (int k = 0; k < IN_W; k++) in[k] = tu_randf(-1, 1);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t now_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    static const struct {
        const char *id;
        int64_t deadline_ms, timeout_ms;
        const char *model;
        const char *code; /* NULL: ok */
    } cases[] = {
        {"far-9p3e15", 9300000000000000LL, -1, NULL, NULL},
        {"far-1e16", 10000000000000000LL, -1, NULL, NULL},
        {"far-2p62", 4611686018427387904LL, -1, NULL, NULL},
        {"far-max", INT64_MAX, -1, NULL, NULL},
        {"far-timeout-max", 0, INT64_MAX, NULL, NULL},
        {"near-minute", -60000, -1, NULL, NULL}, /* now + 60 s */
        {"past", 1, -1, NULL, "deadline_exceeded"},
        {"bad-utf8-model", 0, -1, "\xc3\x28", "unknown_model"},
    };
    size_t nc = sizeof(cases) / sizeof(cases[0]);
    static char ids[16][64];
    for (size_t i = 0; i < nc; i++) {
        snprintf(ids[i], sizeof(ids[i]), "%s", cases[i].id);
        struct wire_job j = {.id = cases[i].id, .model = cases[i].model, .input = in,
                             .n_input = IN_W, .timeout_ms = cases[i].timeout_ms, .priority = -1};
        j.deadline_ms = cases[i].deadline_ms < 0 ? now_ms - cases[i].deadline_ms
                                                 : cases[i].deadline_ms;
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
        assert_int_equal(h_produce(p, "hostile.jobs", j.id, strlen(j.id), body, len, NULL), 0);
        free(body);
    }
    snprintf(ids[nc], sizeof(ids[nc]), "bad-utf8-meta");
    produce_bad_meta(p, "hostile.jobs", ids[nc], in);
    /* no JSON document (cut short) with ill-formed UTF-8 in it */
    const char bad_json[] = "{\"id\":\"dead-utf8\",\"model\":\"\xc3(\",\"input\":[1]";
    assert_int_equal(h_produce(p, "hostile.jobs", NULL, 0, bad_json, strlen(bad_json), NULL), 0);
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    static char *bodies[16];
    static size_t lens[16];
    assert_int_equal(wait_results("hostile", ids, nc + 1, bodies, lens, 60), nc + 1);
    for (size_t i = 0; i <= nc; i++) {
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        assert_int_equal(msgpack_unpack_next(&up, bodies[i], lens[i], NULL), MSGPACK_UNPACK_SUCCESS);
        if (!mp_strs_valid(&up.data)) fail_msg("%s: a str of the result is not UTF-8", ids[i]);
        msgpack_unpacked_destroy(&up);
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[i], lens[i], &r, err, sizeof(err)), 0);
        const char *code = i < nc ? cases[i].code : NULL;
        if (code) {
            if (r.ok || strcmp(r.code, code) != 0)
                fail_msg("%s: %s, expected %s (%s)", ids[i], r.ok ? "ok" : r.code, code, r.message);
        } else {
            if (!r.ok) fail_msg("%s: %s (%s), expected ok", ids[i], r.code, r.message);
            check_values(&r, in, 1);
        }
        if (i < nc && cases[i].model) {
            assert_string_equal(r.model, "\xef\xbf\xbd(");
            assert_non_null(strstr(r.message, "\xef\xbf\xbd("));
        }
        wire_result_fini(&r);
        free(bodies[i]);
    }
    struct reply_rec dead[4];
    assert_int_equal(read_topic("hostile.dlq", dead, 4, 1, 30), 1);
    assert_true(dead[0].hdr_error_len > 0);
    assert_true(utf8_valid(dead[0].hdr_error, dead[0].hdr_error_len));
    free(dead[0].val);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
}

/* One job of `rows` rows of IN_W floats (MessagePack), keyed by its id,
 * with the given timeout (-1: none). */
static void produce_rows(rd_kafka_t *p, const char *topic, const char *id, const float *in,
                         size_t rows, int64_t timeout_ms)
{
    struct wire_job j = {.id = id, .input = in, .n_input = rows * IN_W,
                         .timeout_ms = timeout_ms, .priority = -1};
    unsigned char *body;
    size_t len;
    assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
    assert_int_equal(h_produce(p, topic, id, strlen(id), body, len, NULL), 0);
    free(body);
}

/* One single-row job (MessagePack) with the given timeout (-1: none). */
static void produce_one(rd_kafka_t *p, const char *topic, const char *id, const float *in,
                        int64_t timeout_ms)
{
    produce_rows(p, topic, id, in, 1, timeout_ms);
}

/* ---- SIGTERM under load, then restart: nothing lost ----------------------- */

#define N_LOAD 3000

static void test_sigterm_restart_loses_nothing(void **state)
{
    (void)state;
    const char *cfg = write_config("term", "term.jobs", "term.results", "term.dlq", "g-term", NULL);
    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_LOAD][64];
    static float inputs[N_LOAD][IN_W];
    for (size_t i = 0; i < N_LOAD; i++) {
        snprintf(ids[i], sizeof(ids[i]), "term-%zu", i);
        for (int k = 0; k < IN_W; k++) inputs[i][k] = tu_randf(-2, 2);
        produce_one(p, "term.jobs", ids[i], inputs[i], -1);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    /* Let the first worker get going, then stop it mid-load. */
    pid_t w = start_worker(cfg, "term");
    redisContext *rc = redisConnect("127.0.0.1", redis_port);
    double until = h_now() + 60;
    long long done = 0;
    /* EXISTS over every id of this test: how many results are in. */
    static const char *argv[N_LOAD + 1];
    static char keys[N_LOAD][80];
    argv[0] = "EXISTS";
    for (size_t i = 0; i < N_LOAD; i++) {
        snprintf(keys[i], sizeof(keys[i]), "term:%.60s", ids[i]);
        argv[i + 1] = keys[i];
    }
    while (h_now() < until) {
        redisReply *r = redisCommandArgv(rc, N_LOAD + 1, argv, NULL);
        done = r ? r->integer : 0;
        if (r) freeReplyObject(r);
        if (done > 0) break;
        h_sleep_ms(2);
    }
    fprintf(stderr, "test_integration: SIGTERM after %lld of %d results\n", done, N_LOAD);
    assert_true(done > 0 && done < N_LOAD);
    int st = h_stop(w, SIGTERM, 30);
    assert_int_equal(st, 0);

    /* A second worker finishes the rest. */
    w = start_worker(cfg, "term");
    static char *bodies[N_LOAD];
    static size_t lens[N_LOAD];
    size_t found = wait_results("term", ids, N_LOAD, bodies, lens, 120);
    assert_int_equal(found, N_LOAD);
    check_single_row_results(bodies, lens, inputs, N_LOAD);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    assert_int_equal(h_committed_sum(brokers, "g-term", "term.jobs", PARTS), N_LOAD);
    redisFree(rc);
}

/* ---- batching on a real run: a burst fills batches, a trickle does not wait -- */

#define N_BURST 320
#define N_TRICKLE 12

static void test_burst_and_trickle(void **state)
{
    (void)state;
    const char *cfg = write_config("batch", "batch.jobs", "batch.results", "batch.dlq",
                                   "g-batch", NULL);
    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_BURST + N_TRICKLE][64];
    float in[IN_W];
    for (int k = 0; k < IN_W; k++) in[k] = tu_randf(-1, 1);
    /* The burst waits in Kafka before the worker starts: it arrives as a
     * backlog, so batches should close by size (max_batch_rows = 16). */
    for (size_t i = 0; i < N_BURST; i++) {
        snprintf(ids[i], sizeof(ids[i]), "burst-%zu", i);
        produce_one(p, "batch.jobs", ids[i], in, -1);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    pid_t w = start_worker(cfg, "batch");
    static char *bodies[N_BURST + N_TRICKLE];
    static size_t lens[N_BURST + N_TRICKLE];
    assert_int_equal(wait_results("batch", ids, N_BURST, bodies, lens, 60), N_BURST);
    size_t full = 0;
    for (size_t i = 0; i < N_BURST; i++) {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[i], lens[i], &r, err, sizeof(err)), 0);
        assert_true(r.ok);
        assert_true(r.batch_rows >= 1 && r.batch_rows <= 16);
        full += r.batch_rows == 16;
        wire_result_fini(&r);
    }
    fprintf(stderr, "test_integration: burst: %zu of %d jobs ran in full batches of 16\n",
            full, N_BURST);
    assert_true(full * 10 >= N_BURST * 8); /* at least 80% in full batches */

    /* The trickle: one job at a time, far apart: each runs alone, having
     * waited about max_wait_ms (5) plus a small slack for a busy machine. */
    for (size_t i = N_BURST; i < N_BURST + N_TRICKLE; i++) {
        snprintf(ids[i], sizeof(ids[i]), "trickle-%zu", i);
        produce_one(p, "batch.jobs", ids[i], in, -1);
        rd_kafka_flush(p, 5000);
        assert_int_equal(wait_results("batch", ids + i, 1, bodies + i, lens + i, 30), 1);
    }
    size_t alone = 0;
    for (size_t i = N_BURST; i < N_BURST + N_TRICKLE; i++) {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[i], lens[i], &r, err, sizeof(err)), 0);
        assert_true(r.ok);
        alone += r.batch_rows == 1;
        if (r.queued_ms > 5 + 40)
            fail_msg("%s waited %.1f ms in the queue; max_wait_ms is 5", r.id, r.queued_ms);
        wire_result_fini(&r);
    }
    assert_int_equal(alone, N_TRICKLE);
    for (size_t i = 0; i < N_BURST + N_TRICKLE; i++) free(bodies[i]);
    rd_kafka_destroy(p);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
}

/* ---- a backlog through many pause/resume cycles ---------------------------- */

#define N_BACKLOG 2000

/* Counts lines of a file that contain needle. */
static size_t count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    size_t n = 0;
    while (fgets(line, sizeof(line), f)) n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* A backlog 15 times batching.max_queued_rows drains through dozens of
 * pause/resume cycles, each resume followed by the seek that restarts the
 * fetchers (kafka.resume_seek). A seek to the wrong offset would skip jobs
 * (lost) or read them twice (duplicates on the reply topic, where no fault
 * can excuse one): every job must be answered exactly once, correctly, and
 * its offset committed. */
static void test_backlog_through_pauses(void **state)
{
    (void)state;
    const char *cfg = write_config("pause", "pause.jobs", "pause.results", "pause.dlq", "g-pause",
                                   NULL);
    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_BACKLOG][64];
    static float inputs[N_BACKLOG][IN_W];
    for (size_t i = 0; i < N_BACKLOG; i++) {
        snprintf(ids[i], sizeof(ids[i]), "pause-%zu", i);
        for (int k = 0; k < IN_W; k++) inputs[i][k] = tu_randf(-2, 2);
        produce_one(p, "pause.jobs", ids[i], inputs[i], -1);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    char log[300];
    snprintf(log, sizeof(log), "%s/pause.worker.log", h_dir());
    char *argv[] = {(char *)KINFER, "worker", "-c", (char *)cfg,
                    "--set", "batching.max_queued_rows=128",
                    "--set", "batching.max_job_rows=16",
                    "--set", "batching.max_inflight_batches=2",
                    /* One executor, slower than the intake, so the queue
                     * fills and pauses fetching whatever the machine's
                     * speed (under ASan on two loaded cores, with two
                     * executors sleeping 2 ms, the intake was the slower
                     * one: 5 to 9 resumes). */
                    "--set", "batching.executors=1",
                    "--set", "debug.batch_sleep_ms=4",
                    /* Pause as soon as the queue is full (by default it
                     * holds first and pauses only when full for 500 ms,
                     * which these executors never are): the path under
                     * test is the pause, the resume and its seek. */
                    "--set", "batching.pause_after_ms=0",
                    "--set", "log.level=debug", NULL};
    pid_t w = h_spawn(argv, NULL, log);
    static char *bodies[N_BACKLOG];
    static size_t lens[N_BACKLOG];
    assert_int_equal(wait_results("pause", ids, N_BACKLOG, bodies, lens, 120), N_BACKLOG);
    check_single_row_results(bodies, lens, inputs, N_BACKLOG);
    /* One reply record per job, no more: read past N_BACKLOG for a while
     * so that a duplicate would be seen. */
    static struct reply_rec recs[N_BACKLOG + 64];
    size_t n = read_topic("pause.results", recs, N_BACKLOG + 64, N_BACKLOG + 64, 8);
    assert_int_equal(n, N_BACKLOG);
    static unsigned char seen[N_BACKLOG];
    memset(seen, 0, sizeof(seen));
    for (size_t i = 0; i < n; i++) {
        size_t k;
        assert_int_equal(sscanf(recs[i].key, "pause-%zu", &k), 1);
        assert_true(k < N_BACKLOG);
        if (seen[k]++) fail_msg("%s answered twice on the reply topic", recs[i].key);
        free(recs[i].val);
    }
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    assert_int_equal(h_committed_sum(brokers, "g-pause", "pause.jobs", PARTS), N_BACKLOG);

    size_t resumes = count_lines(log, "event=resumed");
    fprintf(stderr, "test_integration: backlog of %d drained through %zu resumes\n", N_BACKLOG,
            resumes);
    assert_true(resumes >= 10); /* the path under test really ran */
    assert_int_equal(count_lines(log, "event=resume_seek_failed"), 0);
}

/* ---- big jobs through a small queue ---------------------------------------- */

#define N_BIG 400
#define BIG_ROWS 64

/* A backlog of 64-row jobs through a queue of twice a job
 * (batching.max_queued_rows 128, max_job_rows 64). The queue fills after
 * every job or two; before, each time it paused the partitions, which
 * dropped what librdkafka had prefetched and cost a fetch restart per job
 * or two (about one pause per two jobs, 23 jobs/s in the run).
 * Now a full queue holds (takes no record, keeps the prefetch) and pauses
 * only when full for batching.pause_after_ms: the pauses must be rare
 * (at most one per 20 jobs), and every job answered exactly once,
 * correctly, and committed. */
static void test_big_jobs_small_queue(void **state)
{
    (void)state;
    const char *cfg = write_config("big", "big.jobs", "big.results", "big.dlq", "g-big", NULL);
    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_BIG][64];
    static float in[BIG_ROWS * IN_W];
    for (size_t k = 0; k < BIG_ROWS * IN_W; k++) in[k] = tu_randf(-2, 2);
    for (size_t i = 0; i < N_BIG; i++) {
        snprintf(ids[i], sizeof(ids[i]), "big-%zu", i);
        produce_rows(p, "big.jobs", ids[i], in, BIG_ROWS, -1);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    char log[300];
    snprintf(log, sizeof(log), "%s/big.worker.log", h_dir());
    char *argv[] = {(char *)KINFER, "worker", "-c", (char *)cfg,
                    "--set", "batching.max_queued_rows=128",
                    "--set", "batching.max_job_rows=64",
                    "--set", "log.level=debug", NULL};
    double t0 = h_now();
    pid_t w = h_spawn(argv, NULL, log);
    static char *bodies[N_BIG];
    static size_t lens[N_BIG];
    assert_int_equal(wait_results("big", ids, N_BIG, bodies, lens, 120), N_BIG);
    double took = h_now() - t0;
    for (size_t i = 0; i < N_BIG; i++) {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(bodies[i], lens[i], &r, err, sizeof(err)), 0);
        check_values(&r, in, BIG_ROWS);
        wire_result_fini(&r);
        free(bodies[i]);
    }
    static struct reply_rec recs[N_BIG + 16];
    size_t n = read_topic("big.results", recs, N_BIG + 16, N_BIG + 16, 8);
    assert_int_equal(n, N_BIG);
    for (size_t i = 0; i < n; i++) free(recs[i].val);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    assert_int_equal(h_committed_sum(brokers, "g-big", "big.jobs", PARTS), N_BIG);
    size_t pauses = count_lines(log, "event=paused");
    fprintf(stderr, "test_integration: %d jobs of %d rows through a queue of 128 rows: "
            "%zu pauses, %.1f s from start to the last result\n", N_BIG, BIG_ROWS, pauses, took);
    if (pauses > N_BIG / 20) fail_msg("%zu pauses for %d jobs", pauses, N_BIG);
}

/* ---- a dead device: exit 2, nothing committed past the failed batch ---- */

#define N_FAULT 40
#define FAULT_AT 20

/* debug.device_fault_id fails the device when the job of that id runs (a
 * sticky CUDA error on a GPU; the same MODEL_EFATAL on the CPU). The worker
 * must stop serving and exit 2, commit nothing at or past the failed job,
 * and a restarted worker must answer every job correctly. All jobs share a
 * key, so they sit in one partition in order (offset i is job i). */
static void test_device_fault_exits_2(void **state)
{
    (void)state;
    char extra[128];
    snprintf(extra, sizeof(extra), "debug = { device_fault_id = \"fault-%d\"; };", FAULT_AT);
    const char *cfg = write_config("fault", "fault.jobs", "fault.results", "fault.dlq", "g-fault",
                                   extra);
    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_FAULT][64];
    static float inputs[N_FAULT][IN_W];
    for (size_t i = 0; i < N_FAULT; i++) {
        snprintf(ids[i], sizeof(ids[i]), "fault-%zu", i);
        for (int k = 0; k < IN_W; k++) inputs[i][k] = tu_randf(-2, 2);
        struct wire_job j = {.id = ids[i], .input = inputs[i], .n_input = IN_W,
                             .timeout_ms = -1, .priority = -1};
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
        assert_int_equal(h_produce(p, "fault.jobs", "k", 1, body, len, NULL), 0);
        free(body);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    pid_t w = start_worker(cfg, "fault");
    int status = -1;
    double until = h_now() + 60;
    while (!h_exited(w, &status) && h_now() < until) h_sleep_ms(50);
    if (status < 0) h_stop(w, SIGKILL, 5);
    fprintf(stderr, "test_integration: device fault: worker exited %d\n", status);
    assert_int_equal(status, 2);
    char log[300];
    snprintf(log, sizeof(log), "%s/fault.worker.log", h_dir());
    assert_true(count_lines(log, "event=debug_device_fault") >= 1);
    assert_true(count_lines(log, "event=model_failed") >= 1);
    long long committed = h_committed_sum(brokers, "g-fault", "fault.jobs", PARTS);
    fprintf(stderr, "test_integration: device fault: committed %lld of %d\n", committed, N_FAULT);
    assert_true(committed <= FAULT_AT);
    redisContext *rc = redisConnect("127.0.0.1", redis_port);
    assert_true(rc && !rc->err);
    redisReply *r = redisCommand(rc, "EXISTS fault:%s", ids[FAULT_AT]);
    assert_non_null(r);
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    redisFree(rc);

    /* The restarted worker (no fault this time) answers every job. */
    cfg = write_config("fault", "fault.jobs", "fault.results", "fault.dlq", "g-fault", NULL);
    w = start_worker(cfg, "fault-restart");
    static char *bodies[N_FAULT];
    static size_t lens[N_FAULT];
    assert_int_equal(wait_results("fault", ids, N_FAULT, bodies, lens, 120), N_FAULT);
    check_single_row_results(bodies, lens, inputs, N_FAULT);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    assert_int_equal(h_committed_sum(brokers, "g-fault", "fault.jobs", PARTS), N_FAULT);
}

static int setup(void **state)
{
    (void)state;
    snprintf(model_path, sizeof(model_path), "%s/demo.safetensors", h_dir());
    char err[256];
    if (model_write_demo(model_path, IN_W, HID_W, OUT_W, tu_rand64(), err, sizeof(err)) < 0) {
        fprintf(stderr, "model_write_demo: %s\n", err);
        return -1;
    }
    ref_mlp_load(&reference_model, model_path);
    if (h_start_broker(KINFER, "good.jobs,good.results,good.dlq,bad.jobs,bad.results,bad.dlq,"
                               "term.jobs,term.results,term.dlq,batch.jobs,batch.results,batch.dlq,"
                               "pause.jobs,pause.results,pause.dlq,hostile.jobs,hostile.results,hostile.dlq,"
                               "big.jobs,big.results,big.dlq,"
                               "fault.jobs,fault.results,fault.dlq", PARTS, brokers,
                       sizeof(brokers)) < 0)
        return -1;
    if (h_start_redis(&redis_port) < 0) return -1;
    fprintf(stderr, "test_integration: broker %s, redis port %d, logs in %s\n", brokers,
            redis_port, h_dir());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    h_kill_all();
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_results_every_encoding),
        cmocka_unit_test(test_errors_and_dead_letters),
        cmocka_unit_test(test_hostile_fields_answered),
        cmocka_unit_test(test_sigterm_restart_loses_nothing),
        cmocka_unit_test(test_burst_and_trickle),
        cmocka_unit_test(test_backlog_through_pauses),
        cmocka_unit_test(test_big_jobs_small_queue),
        cmocka_unit_test(test_device_fault_exits_2),
    };
    /* KINFER_TEST_FILTER=test_hostile* runs only the matching cases. */
    const char *filter = getenv("KINFER_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}

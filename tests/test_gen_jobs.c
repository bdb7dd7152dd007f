/* test_gen_jobs.c - generation jobs end to end, with real parts: `kinfer
 * broker` (librdkafka's mock cluster in its own process), a real
 * redis-server and the worker binary serving a small random Llama folder
 * ("llm", decoder_write_demo: byte-level BPE, a ChatML chat template) and
 * an MLP ("mlp"), on the CPU backend ($KINFER_TEST_BACKEND: another, such
 * as the emulated CUDA device in tests/emu_e2e.sh). The weights are
 * random: the text is not language, so what is checked is the contract,
 * not the words.
 *
 * Checked, for jobs in JSON and MessagePack: every job answered exactly
 * once on the reply topic with the same body Redis holds, and every
 * offset committed; an ok result has text (valid UTF-8), tokens (at most
 * max_tokens, each an id of the vocabulary), finish_reason (eos, stop,
 * length; length whenever fewer than max_tokens is not what came out),
 * usage (completion_tokens = tokens, prompt_tokens > 0, the same for the
 * same prompt) and timing (ttft_ms, decode_tokens_per_s); logprobs when
 * asked (one per token, each <= 0); greedy jobs with the same prompt give
 * the same tokens, and so do sampled jobs with the same seed, in either
 * encoding (the batches they run in differ only in the order float sums
 * are taken in, which moves a logit by about 1e-6: a near tie that close
 * is rare enough at this vocabulary and length); a stop string taken from
 * a greedy job's text cuts the same prompt's text before it (finish_reason
 * stop); a streamed job's Redis stream holds start, then text pieces whose
 * concatenation is the final text, then done with the finish_reason, and
 * expires; a job whose deadline passed is deadline_exceeded; hostile
 * or wrong jobs are each a clear invalid_input naming what is wrong;
 * /readyz names the models' kinds and /metrics counts the tokens; a
 * worker killed with SIGKILL mid-generation, and one whose device fails,
 * lose no job; and chat templates are checked at load (one that does not
 * parse or render stops the worker at startup; a list's "default" is
 * taken; without one, messages jobs are invalid_input). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "../base/utf8.h"
#include "../gpu/decoder.h"
#include "../gpu/model.h"
#include "harness.h"
#include "testutil.h"

#define PARTS 2
#define CONTEXT 512 /* the demo folder's max_position_embeddings */

static char brokers[512];
static int redis_port;
static char llm_dir[300], mlp_path[300];
static size_t vocab;

static const char *kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}

static int64_t wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* ---- jobs -------------------------------------------------------------------- */

/* A job: its JSON form (the MessagePack one is packed from it), and what
 * its answer must say. */
struct gcase {
    char id[64];
    json_t *job;        /* owned */
    int msgpack;
    const char *want_code; /* NULL: ok; else the error code */
    const char *want_msg;  /* a substring of the error message */
    json_t *res;        /* the answer, parsed (owned) */
    int replies;
};

static struct gcase *gc_new(const char *id, json_t *job, int msgpack)
{
    struct gcase *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    snprintf(c->id, sizeof(c->id), "%s", id);
    json_object_set_new(job, "id", json_string(id));
    c->job = job;
    c->msgpack = msgpack;
    return c;
}

static struct gcase *gc_bad(const char *id, json_t *job, int msgpack, const char *code,
                            const char *msg)
{
    struct gcase *c = gc_new(id, job, msgpack);
    c->want_code = code;
    c->want_msg = msg;
    return c;
}

static void gc_free(struct gcase *c)
{
    json_decref(c->job);
    json_decref(c->res);
    free(c);
}

/* Packs a JSON value as MessagePack (strings as str, integers as ints,
 * reals as float64). A string member "__bad_utf8" of an object is
 * written as the str "\xff\xfe" under the key "prompt". */
static void pack_js(msgpack_packer *pk, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(v));
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            if (strcmp(k, "__bad_utf8") == 0) {
                msgpack_pack_str_with_body(pk, "prompt", 6);
                msgpack_pack_str_with_body(pk, "ok \xff\xfe", 5);
                continue;
            }
            msgpack_pack_str_with_body(pk, k, strlen(k));
            pack_js(pk, e);
        }
        break;
    }
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++) pack_js(pk, json_array_get(v, i));
        break;
    case JSON_STRING:
        msgpack_pack_str_with_body(pk, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER: msgpack_pack_int64(pk, json_integer_value(v)); break;
    case JSON_REAL: msgpack_pack_double(pk, json_real_value(v)); break;
    case JSON_TRUE: msgpack_pack_true(pk); break;
    case JSON_FALSE: msgpack_pack_false(pk); break;
    case JSON_NULL: msgpack_pack_nil(pk); break;
    }
}

/* A MessagePack object as JSON (bin as a string of its length, for the
 * checks here only). */
static json_t *mp_to_js(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            char key[128];
            snprintf(key, sizeof(key), "%.*s", (int)k->via.str.size, k->via.str.ptr);
            json_object_set_new(m, key, mp_to_js(&o->via.map.ptr[i].val));
        }
        return m;
    }
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->via.array.size; i++)
            json_array_append_new(a, mp_to_js(&o->via.array.ptr[i]));
        return a;
    }
    case MSGPACK_OBJECT_STR: {
        json_t *s = json_stringn(o->via.str.ptr, o->via.str.size);
        return s ? s : json_string("<<invalid utf-8>>");
    }
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return json_real(o->via.f64);
    case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
    default: return json_null();
    }
}

static json_t *parse_body(const char *body, size_t len)
{
    if (len && body[0] == '{') {
        json_error_t e;
        json_t *j = json_loadb(body, len, JSON_ALLOW_NUL, &e); /* U+0000 is text too */
        if (!j) fail_msg("a result is not JSON: %s", e.text);
        return j;
    }
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    if (msgpack_unpack_next(&up, body, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        fail_msg("a result is not MessagePack");
    json_t *j = mp_to_js(&up.data);
    msgpack_unpacked_destroy(&up);
    return j;
}

static void produce_try(const char *topic, struct gcase **cs, size_t n, int tries)
{
    rd_kafka_t *p = h_producer(brokers);
    assert_non_null(p);
    h_dr_failed = 0;
    for (size_t i = 0; i < n; i++) {
        char *body;
        size_t len;
        msgpack_sbuffer sb;
        if (cs[i]->msgpack) {
            msgpack_sbuffer_init(&sb);
            msgpack_packer pk;
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            pack_js(&pk, cs[i]->job);
            body = sb.data;
            len = sb.size;
        } else {
            body = json_dumps(cs[i]->job, JSON_COMPACT);
            len = strlen(body);
        }
        assert_int_equal(h_produce(p, topic, cs[i]->id, strlen(cs[i]->id), body, len,
                                   cs[i]->msgpack ? "application/msgpack" : "application/json"),
                         0);
        if (cs[i]->msgpack) msgpack_sbuffer_destroy(&sb);
        else free(body);
    }
    assert_int_equal(rd_kafka_flush(p, 20000), 0);
    rd_kafka_destroy(p);
    /* Records the embedded broker refused (its delivery report said so)
     * go again, at most twice more; only those: the rest must not be
     * answered twice. */
    size_t failed = h_dr_failed < H_DR_KEEP ? h_dr_failed : H_DR_KEEP;
    assert_true(h_dr_failed <= H_DR_KEEP);
    struct gcase *again[H_DR_KEEP];
    size_t na = 0;
    char keys[H_DR_KEEP][128];
    memcpy(keys, h_dr_keys, sizeof(keys));
    for (size_t f = 0; f < failed; f++)
        for (size_t i = 0; i < n; i++)
            if (strcmp(cs[i]->id, keys[f]) == 0) again[na++] = cs[i];
    if (na) {
        if (tries >= 3) fail_msg("%zu record(s) still not delivered after %d tries", na, tries);
        fprintf(stderr, "test_gen_jobs: %zu record(s) sent again\n", na);
        produce_try(topic, again, na, tries + 1);
    }
}

static void produce(const char *topic, struct gcase **cs, size_t n)
{
    produce_try(topic, cs, n, 1);
}

/* $KINFER_TEST_BACKEND runs the workers on another backend ("cuda": the
 * emulated device in tests/emu_e2e.sh); $KINFER_TEST_WAIT_S, when set,
 * is how long to wait for answers instead of 120 s. */
static const char *test_backend(void)
{
    const char *b = getenv("KINFER_TEST_BACKEND");
    return b && *b ? b : "cpu";
}

static double wait_s(void)
{
    const char *s = getenv("KINFER_TEST_WAIT_S");
    double v = s && *s ? atof(s) : 0;
    return v > 0 ? v : 120;
}

/* Set by a crash test: an id may be answered more than once. */
static int at_least_once;

/* Waits for every case's result in Redis (prefix:id), then reads the reply
 * topic: each id answered once, with Redis's bytes. Cases before first
 * were collected by an earlier call (the topic is read from its start). */
static void collect(const char *name, struct gcase **cs, size_t n, size_t first)
{
    redisContext *r = redisConnect("127.0.0.1", redis_port);
    assert_true(r && !r->err);
    double until = h_now() + wait_s();
    size_t found = 0;
    char **bodies = calloc(n, sizeof(*bodies));
    size_t *lens = calloc(n, sizeof(*lens));
    for (size_t i = 0; i < n; i++) cs[i]->replies = 0;
    while (found < n && h_now() < until) {
        for (size_t i = 0; i < n; i++) {
            if (bodies[i]) continue;
            if (i < first) json_decref(cs[i]->res);
            redisReply *rep = redisCommand(r, "GET %s:%s", name, cs[i]->id);
            if (rep && rep->type == REDIS_REPLY_STRING) {
                bodies[i] = malloc(rep->len);
                memcpy(bodies[i], rep->str, rep->len);
                lens[i] = rep->len;
                cs[i]->res = parse_body(rep->str, rep->len);
                found++;
            }
            freeReplyObject(rep);
        }
        if (found < n) h_sleep_ms(50);
    }
    redisFree(r);
    for (size_t i = 0; i < n; i++)
        if (!bodies[i]) fail_msg("%s: no result in Redis after %.0f s", cs[i]->id, wait_s());
    char topic[128];
    snprintf(topic, sizeof(topic), "%s.results", name);
    rd_kafka_t *c = h_reader(brokers, topic);
    size_t distinct = 0;
    double grace = 0;
    until = h_now() + 60;
    while (h_now() < until && (!grace || h_now() < grace)) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        if (!m->err) {
            size_t i = 0;
            while (i < n && !(m->key_len == strlen(cs[i]->id) &&
                              memcmp(m->key, cs[i]->id, m->key_len) == 0))
                i++;
            if (i == n) fail_msg("a reply keyed '%.*s' answers no job", (int)m->key_len,
                                 (const char *)m->key);
            if (cs[i]->replies++ == 0) distinct++;
            if (!at_least_once && (m->len != lens[i] || memcmp(m->payload, bodies[i], m->len) != 0))
                fail_msg("%s: the reply differs from Redis", cs[i]->id);
            if (distinct == n && !grace) grace = h_now() + 2;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    for (size_t i = 0; i < n; i++) {
        if (cs[i]->replies != 1 && !(at_least_once && cs[i]->replies > 1))
            fail_msg("%s: answered %d times", cs[i]->id, cs[i]->replies);
        free(bodies[i]);
    }
    free(bodies);
    free(lens);
}

/* The answer's checks: the error asked for, or a well-formed result. */
static void check(const struct gcase *c)
{
    const json_t *r = c->res;
    const char *status = json_string_value(json_object_get(r, "status"));
    if (c->want_code) {
        const json_t *e = json_object_get(r, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        if (!status || strcmp(status, "error") || !code || strcmp(code, c->want_code) || !msg ||
            !strstr(msg, c->want_msg))
            fail_msg("%s: want %s with \"%s\", got %s %s: %s", c->id, c->want_code, c->want_msg,
                     status ? status : "?", code ? code : "-", msg ? msg : "-");
        return;
    }
    if (!status || strcmp(status, "ok") != 0) {
        const json_t *e = json_object_get(r, "error");
        fail_msg("%s: not ok: %s", c->id, json_string_value(json_object_get(e, "message")));
    }
    const json_t *text = json_object_get(r, "text"), *toks = json_object_get(r, "tokens");
    const char *fin = json_string_value(json_object_get(r, "finish_reason"));
    const json_t *usage = json_object_get(r, "usage");
    assert_true(json_is_string(text) && json_is_array(toks) && fin && json_is_object(usage));
    assert_true(utf8_valid(json_string_value(text), json_string_length(text)));
    size_t n = json_array_size(toks);
    json_int_t max = json_integer_value(json_object_get(c->job, "max_tokens"));
    if (max) assert_true(n <= (size_t)max);
    for (size_t i = 0; i < n; i++) {
        json_int_t id = json_integer_value(json_array_get(toks, i));
        assert_true(id >= 0 && (size_t)id < vocab);
    }
    assert_true(!strcmp(fin, "eos") || !strcmp(fin, "stop") || !strcmp(fin, "length"));
    if (max && ((n == (size_t)max && !strcmp(fin, "eos")) || (!strcmp(fin, "length") && n != (size_t)max)))
        fail_msg("%s: %zu tokens of max_tokens %d, finish_reason %s", c->id, n, (int)max, fin);
    assert_int_equal(json_integer_value(json_object_get(usage, "completion_tokens")), n);
    assert_true(json_integer_value(json_object_get(usage, "prompt_tokens")) > 0);
    const json_t *t = json_object_get(r, "timing");
    assert_true(json_is_number(json_object_get(t, "ttft_ms")));
    assert_true(json_is_number(json_object_get(t, "decode_tokens_per_s")));
    const json_t *lp = json_object_get(r, "logprobs");
    if (json_is_true(json_object_get(c->job, "logprobs"))) {
        assert_true(json_is_array(lp));
        assert_int_equal(json_array_size(lp), n);
        for (size_t i = 0; i < n; i++) assert_true(json_number_value(json_array_get(lp, i)) <= 0);
    } else {
        assert_null(lp);
    }
}

static int same_tokens(const json_t *a, const json_t *b)
{
    return json_equal(json_object_get(a, "tokens"), json_object_get(b, "tokens"));
}

/* ---- the worker --------------------------------------------------------------- */

static int metrics_port;

/* GET path from the worker's HTTP endpoint: the whole response, or NULL. */
static char *http_get(const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)metrics_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return NULL;
    }
    char q[128];
    snprintf(q, sizeof(q), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, q, strlen(q)) != (ssize_t)strlen(q)) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    ssize_t r;
    while ((r = read(fd, b + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 2) b = realloc(b, cap *= 2);
    }
    b[len] = '\0';
    close(fd);
    return b;
}

/* The value of an unlabelled metric, or NAN. */
static double metric(const char *body, const char *name)
{
    char pat[128];
    snprintf(pat, sizeof(pat), "\n%s ", name);
    const char *p = strstr(body, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* The models of the config: "llm" (the demo folder, or llm_path) and "mlp". */
static const char *llm_path;
static char last_log[300]; /* the last worker's log */

static pid_t start_worker_with(const char *name, const char *topic, const char *debug)
{
    char path[300], log[300];
    snprintf(path, sizeof(path), "%s/%s.cfg", h_dir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"g-%s\"; topics = [ \"%s\" ];\n"
            "  reply_topic = \"%s.results\"; dlq_topic = \"%s.dlq\";\n"
            "  properties = ( ( \"auto.commit.interval.ms\", \"200\" ),"
            " ( \"fetch.wait.max.ms\", \"10\" ), ( \"session.timeout.ms\", \"6000\" ),"
            " ( \"heartbeat.interval.ms\", \"500\" ) ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"%s:\"; ttl_ms = 600000;"
            " stream_prefix = \"%s-stream:\"; };\n"
            "generation = { kv_cache_mb = 4; max_seqs = 8; max_tokens = 16; };\n"
            "models = ( { name = \"llm\"; path = \"%s\"; },\n"
            "  { name = \"mlp\"; path = \"%s\";\n"
            "    layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
            "               { op = \"relu\"; },\n"
            "               { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); } );\n"
            "default_model = \"llm\";\n"
            "worker = { backend = \"%s\"; };\n"
            "debug = { %s };\n"
            "metrics = { listen = \"127.0.0.1:%d\"; heartbeat_prefix = \"\"; };\n",
            brokers, name, topic, name, name, redis_port, name, name,
            llm_path ? llm_path : llm_dir, mlp_path, test_backend(), debug,
            metrics_port = h_free_port());
    fclose(f);
    static int runs;
    snprintf(log, sizeof(log), "%s/%s.worker%d.log", h_dir(), name, runs++);
    snprintf(last_log, sizeof(last_log), "%s", log);
    char *argv[] = {(char *)kinfer_bin(), "worker", "-c", path, NULL};
    return h_spawn(argv, NULL, log);
}

static pid_t start_worker(const char *name, const char *topic)
{
    return start_worker_with(name, topic, "");
}

static void stop_worker(pid_t w, const char *name, size_t n_jobs)
{
    char group[64], topic[64];
    snprintf(group, sizeof(group), "g-%s", name);
    snprintf(topic, sizeof(topic), "%s.jobs", name);
    double until = h_now() + 30;
    long long sum = -1;
    while (h_now() < until && (sum = h_committed_sum(brokers, group, topic, PARTS)) <
                                  (long long)n_jobs)
        h_sleep_ms(200);
    assert_int_equal(sum, (long long)n_jobs);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
}

/* ---- the tests ---------------------------------------------------------------- */

static int file_has(const char *path, const char *needle);

static json_t *prompt_job(const char *prompt, int max_tokens, double temperature)
{
    return json_pack("{s:s, s:s, s:i, s:f}", "model", "llm", "prompt", prompt, "max_tokens",
                     max_tokens, "temperature", temperature);
}

static json_t *chat(void)
{
    return json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content",
                     "You are terse.", "role", "user", "content", "hello there, how are you?");
}

/* Checks the Redis stream of a streamed job against its result. */
static void check_stream(const char *name, const struct gcase *c)
{
    redisContext *r = redisConnect("127.0.0.1", redis_port);
    assert_true(r && !r->err);
    redisReply *rep = redisCommand(r, "XRANGE %s-stream:%s - +", name, c->id);
    assert_true(rep && rep->type == REDIS_REPLY_ARRAY);
    assert_true(rep->elements >= 2);
    char *joined = calloc(1, 1);
    size_t jl = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        redisReply *fields = rep->element[i]->element[1];
        const char *f0 = fields->element[0]->str;
        if (i == 0) {
            assert_string_equal(f0, "start");
            assert_string_equal(fields->element[1]->str, "1");
        } else if (i == rep->elements - 1) {
            assert_string_equal(f0, "done");
            assert_true(fields->elements == 4);
            assert_string_equal(fields->element[3]->str,
                                json_string_value(json_object_get(c->res, "finish_reason")));
        } else {
            assert_string_equal(f0, "text");
            size_t l = fields->element[1]->len;
            assert_true(utf8_valid(fields->element[1]->str, l));
            joined = realloc(joined, jl + l + 1);
            memcpy(joined + jl, fields->element[1]->str, l);
            jl += l;
            joined[jl] = '\0';
        }
    }
    freeReplyObject(rep);
    const json_t *text = json_object_get(c->res, "text");
    assert_int_equal(jl, json_string_length(text));
    assert_memory_equal(joined, json_string_value(text), jl);
    free(joined);
    rep = redisCommand(r, "PTTL %s-stream:%s", name, c->id);
    assert_true(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0);
    freeReplyObject(rep);
    redisFree(r);
}

static void test_gen_results(void **state)
{
    (void)state;
    const char *name = "gen";
    pid_t w = start_worker(name, "gen.jobs");
    struct gcase *cs[16];
    size_t n = 0;
    const char *p = "the quick brown fox";
    cs[n++] = gc_new("greedy-js", prompt_job(p, 6, 0), 0);
    cs[n++] = gc_new("greedy-mp", prompt_job(p, 6, 0), 1);
    json_t *s1 = prompt_job("once upon a time", 10, 1.0), *s2 = prompt_job("once upon a time", 10, 1.0);
    json_object_set_new(s1, "seed", json_integer(1234567));
    json_object_set_new(s2, "seed", json_integer(1234567));
    json_object_set_new(s2, "top_p", json_real(0.9));
    json_object_set_new(s1, "top_p", json_real(0.9));
    cs[n++] = gc_new("seed-js", s1, 0);
    cs[n++] = gc_new("seed-mp", s2, 1);
    json_t *m1 = json_pack("{s:o, s:i, s:f, s:b}", "messages", chat(), "max_tokens", 8,
                           "temperature", 0.0, "logprobs", 1);
    cs[n++] = gc_new("chat-js", m1, 0);
    json_t *m2 = json_pack("{s:s, s:o, s:i, s:b, s:f, s:i}", "model", "llm", "messages", chat(),
                           "max_tokens", 12, "stream", 1, "temperature", 0.8, "seed", 7);
    cs[n++] = gc_new("stream-mp", m2, 1);
    json_t *m3 = json_pack("{s:o, s:i, s:b}", "prompt", json_string("stream me"), "max_tokens",
                           9, "stream", 1);
    cs[n++] = gc_new("stream-js", m3, 0);
    cs[n++] = gc_new("one-token", prompt_job("a", 1, 0), 1);
    json_t *dflt = json_pack("{s:s}", "prompt", "no max tokens given");
    cs[n++] = gc_new("default-max", dflt, 0);
    json_t *late = prompt_job(p, 4, 0);
    json_object_set_new(late, "deadline_ms", json_integer(wall_ms() - 5000));
    cs[n++] = gc_bad("late", late, 0, "deadline_exceeded", "deadline");
    size_t n1 = n;
    produce("gen.jobs", cs, n);
    collect(name, cs, n, 0);
    for (size_t i = 0; i < n; i++) check(cs[i]);
    assert_true(same_tokens(cs[0]->res, cs[1]->res));
    assert_true(same_tokens(cs[2]->res, cs[3]->res));
    assert_true(json_equal(json_object_get(cs[0]->res, "usage"),
                           json_object_get(cs[1]->res, "usage")));
    assert_true(json_array_size(json_object_get(cs[8]->res, "tokens")) <= 16);
    check_stream(name, cs[5]);
    check_stream(name, cs[6]);

    /* A stop string from the greedy text: the same prompt stops before it. */
    char *gt = strdup(json_string_value(json_object_get(cs[0]->res, "text")));
    size_t gl = strlen(gt);
    if (gl >= 4) {
        /* Two bytes from the middle, on character boundaries. */
        size_t at = gl / 2;
        while (at > 0 && ((unsigned char)gt[at] & 0xC0) == 0x80) at--;
        size_t end = at + 1;
        while (end < gl && ((unsigned char)gt[end] & 0xC0) == 0x80) end++;
        char stop[16];
        snprintf(stop, sizeof(stop), "%.*s", (int)(end - at), gt + at);
        const char *first = strstr(gt, stop);
        json_t *sj = prompt_job(p, 6, 0);
        json_object_set_new(sj, "stop", json_pack("[s, s]", stop, "zzzz-not-there"));
        cs[n++] = gc_new("stop-js", sj, 0);
        produce("gen.jobs", cs + n1, 1);
        collect(name, cs, n, n1);
        check(cs[n1]);
        const json_t *r = cs[n1]->res;
        assert_string_equal(json_string_value(json_object_get(r, "finish_reason")), "stop");
        const char *st = json_string_value(json_object_get(r, "text"));
        assert_int_equal(strlen(st), (size_t)(first - gt));
        assert_memory_equal(st, gt, strlen(st));
    } else {
        fprintf(stderr, "test_gen_jobs: the greedy text is %zu bytes: no stop string case\n", gl);
    }
    free(gt);

    /* Operations: /readyz names the kinds, /metrics counts the tokens. */
    char *ready = http_get("/readyz"), *m = http_get("/metrics");
    assert_non_null(ready);
    assert_non_null(m);
    assert_non_null(strstr(ready, "llm=generator,mlp=mlp"));
    double gen = 0, prompt = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *u = json_object_get(cs[i]->res, "usage");
        gen += (double)json_integer_value(json_object_get(u, "completion_tokens"));
        prompt += (double)json_integer_value(json_object_get(u, "prompt_tokens"));
    }
    assert_true(metric(m, "kinfer_gen_generated_tokens_total") == gen);
    assert_true(metric(m, "kinfer_gen_prompt_tokens_total") == prompt);
    assert_true(metric(m, "kinfer_gen_kv_blocks_total") > 0);
    assert_true(metric(m, "kinfer_gen_kv_blocks_used") == 0);
    assert_true(metric(m, "kinfer_gen_ttft_seconds_count") >= 1);
    free(ready);
    free(m);
    stop_worker(w, name, n);
    /* Where the tokens were chosen (the worker says so as it stops): on
     * the CUDA backend by the device's sampler, no logits to the host,
     * decode steps replayed from graphs, and chained (generation.overlap,
     * on by default); on the CPU backend on the host, none chained. */
    if (!strcmp(test_backend(), "cuda")) {
        assert_true(file_has(last_log, "logits_bytes=0"));
        assert_false(file_has(last_log, "device_picks=0 "));
        assert_true(file_has(last_log, "device_picks="));
        assert_false(file_has(last_log, "graph_steps=0 "));
        assert_true(file_has(last_log, "graph_steps="));
        assert_false(file_has(last_log, "chained_steps=0 "));
        assert_true(file_has(last_log, "chained_steps="));
    } else {
        assert_true(file_has(last_log, "device_picks=0 "));
        assert_true(file_has(last_log, "graph_steps=0 "));
        assert_true(file_has(last_log, "chained_steps=0 "));
    }
    for (size_t i = 0; i < n; i++) gc_free(cs[i]);
}

static void test_gen_invalid(void **state)
{
    (void)state;
    const char *name = "bad";
    pid_t w = start_worker(name, "bad.jobs");
    struct gcase *cs[32];
    size_t n = 0;
    const char *ii = "invalid_input";
    char *huge = malloc(70001);
    memset(huge, 'a', 70000);
    huge[70000] = '\0';
    cs[n++] = gc_bad("huge", json_pack("{s:s}", "prompt", huge), 0, ii, "max_text_chars");
    /* Within the character cap, over the context. */
    char *longp = malloc(6001);
    for (size_t i = 0; i < 6000; i++) longp[i] = i % 2 ? ' ' : "abcdefghij"[(i / 2) % 10];
    longp[6000] = '\0';
    cs[n++] = gc_bad("over-context", json_pack("{s:s}", "prompt", longp), 1, ii, "context");
    cs[n++] = gc_bad("role", json_pack("{s:[{s:s, s:s}]}", "messages", "role", "wizard",
                                       "content", "hi"), 0, ii, "unknown role");
    cs[n++] = gc_bad("content", json_pack("{s:[{s:s, s:i}]}", "messages", "role", "user",
                                          "content", 5), 1, ii, "content must be a string");
    cs[n++] = gc_bad("utf8", json_pack("{s:s}", "__bad_utf8", "x"), 1, ii, "UTF-8");
    cs[n++] = gc_bad("both", json_pack("{s:s, s:[{s:s, s:s}]}", "prompt", "x", "messages",
                                       "role", "user", "content", "y"), 0, ii, "exactly one");
    cs[n++] = gc_bad("temp", json_pack("{s:s, s:f}", "prompt", "x", "temperature", -1.0), 0, ii,
                     "temperature");
    cs[n++] = gc_bad("topp", json_pack("{s:s, s:f}", "prompt", "x", "top_p", 0.0), 1, ii,
                     "top_p");
    cs[n++] = gc_bad("minp", json_pack("{s:s, s:f}", "prompt", "x", "min_p", 1.0), 0, ii,
                     "min_p");
    cs[n++] = gc_bad("topk", json_pack("{s:s, s:i}", "prompt", "x", "top_k", -3), 0, ii, "top_k");
    cs[n++] = gc_bad("maxtok", json_pack("{s:s, s:i}", "prompt", "x", "max_tokens", 0), 1, ii,
                     "max_tokens");
    cs[n++] = gc_bad("stops", json_pack("{s:s, s:[s,s,s,s,s,s,s,s,s]}", "prompt", "x", "stop",
                                        "a", "b", "c", "d", "e", "f", "g", "h", "i"), 0, ii,
                     "stop");
    cs[n++] = gc_bad("stop-empty", json_pack("{s:s, s:s}", "prompt", "x", "stop", ""), 1, ii,
                     "stop");
    cs[n++] = gc_bad("logprobs", json_pack("{s:s, s:s}", "prompt", "x", "logprobs", "yes"), 0,
                     ii, "boolean");
    cs[n++] = gc_bad("to-mlp", json_pack("{s:s, s:s}", "model", "mlp", "prompt", "x"), 0, ii,
                     "not a text-generating");
    cs[n++] = gc_bad("text-to-llm", json_pack("{s:s, s:s}", "model", "llm", "text", "x"), 1, ii,
                     "generates text");
    cs[n++] = gc_bad("input-to-llm", json_pack("{s:[f,f]}", "input", 1.0, 2.0), 0, ii,
                     "generates text");
    cs[n++] = gc_bad("empty-prompt", json_pack("{s:s}", "prompt", ""), 0, ii, "empty");
    json_t *nan = json_pack("{s:s, s:f}", "prompt", "x", "temperature", 1e300);
    cs[n++] = gc_bad("absurd-temp", nan, 1, ii, "temperature");
    produce("bad.jobs", cs, n);
    collect(name, cs, n, 0);
    for (size_t i = 0; i < n; i++) check(cs[i]);
    stop_worker(w, name, n);
    for (size_t i = 0; i < n; i++) gc_free(cs[i]);
    free(huge);
    free(longp);
}

/* Nothing lost when the worker dies generating: a worker killed with
 * SIGKILL mid-generation (each step slowed down so that jobs are
 * generating), then one whose device fails on a job (it must exit 2 with
 * its jobs uncommitted), then a healthy one: every job is answered (at
 * least once: a job interrupted runs again) and every offset committed. */
static void test_gen_crash(void **state)
{
    (void)state;
    const char *name = "crash";
    struct gcase *cs[8];
    size_t n = 0;
    char id[32];
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof(id), "long-%d", i);
        json_t *j = prompt_job(i % 2 ? "tell me a long story" : "count to a hundred", 60, 0);
        if (i == 1) json_object_set_new(j, "stream", json_true());
        cs[n++] = gc_new(id, j, i % 2);
    }
    pid_t a = start_worker_with(name, "crash.jobs",
                                "batch_sleep_ms = 25; device_fault_id = \"boom\";");
    produce("crash.jobs", cs, n);
    /* Killed once a first job is done: the others are generating or waiting. */
    redisContext *r = redisConnect("127.0.0.1", redis_port);
    assert_true(r && !r->err);
    size_t done = 0;
    double until = h_now() + 60;
    while (!done && h_now() < until) {
        for (size_t i = 0; i < n; i++) {
            redisReply *rep = redisCommand(r, "EXISTS %s:%s", name, cs[i]->id);
            done += rep && rep->integer == 1;
            freeReplyObject(rep);
        }
        if (!done) h_sleep_ms(20);
    }
    assert_true(done > 0);
    assert_int_equal(h_stop(a, SIGKILL, 10), 128 + SIGKILL);
    fprintf(stderr, "test_gen_crash: killed with %zu of %zu jobs answered\n", done, n);
    /* The device fails on "boom": that worker exits 2, its jobs uncommitted. */
    cs[n++] = gc_new("boom", prompt_job("boom", 8, 0), 0);
    pid_t b = start_worker_with(name, "crash.jobs", "device_fault_id = \"boom\";");
    produce("crash.jobs", cs + n - 1, 1);
    int st = -1, gone = 0;
    until = h_now() + 60;
    while (!(gone = h_exited(b, &st)) && h_now() < until) h_sleep_ms(50);
    assert_true(gone);
    assert_int_equal(st, 2);
    redisReply *rep = redisCommand(r, "EXISTS %s:boom", name);
    assert_true(rep && rep->integer == 0);
    freeReplyObject(rep);
    redisFree(r);
    pid_t c = start_worker(name, "crash.jobs");
    at_least_once = 1;
    collect(name, cs, n, 0);
    at_least_once = 0;
    for (size_t i = 0; i < n; i++) check(cs[i]);
    stop_worker(c, name, n);
    for (size_t i = 0; i < n; i++) gc_free(cs[i]);
}

/* A copy of the demo folder at dir whose tokenizer_config.json's
 * chat_template is tmpl (a JSON value; NULL: the key removed). */
static void folder_with_template(const char *dir, json_t *tmpl)
{
    char err[512], path[400];
    assert_int_equal(decoder_write_demo(dir, 2, 32, 4, 2, 64, tu_rand64(), err, sizeof(err)), 0);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    json_error_t e;
    json_t *tc = json_load_file(path, 0, &e);
    assert_non_null(tc);
    if (tmpl) json_object_set_new(tc, "chat_template", tmpl);
    else json_object_del(tc, "chat_template");
    assert_int_equal(json_dump_file(tc, path, JSON_INDENT(2)), 0);
    json_decref(tc);
}

static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int yes = 0;
    while (!yes && fgets(line, sizeof(line), f)) yes = strstr(line, needle) != NULL;
    fclose(f);
    return yes;
}

/* Chat templates at load: one that does not parse, or cannot render a
 * sample conversation, stops the worker at startup (exit 1, the reason
 * logged); a list of named templates takes "default"; a folder without a
 * template serves prompt jobs and answers messages jobs invalid_input. */
static void test_gen_templates(void **state)
{
    (void)state;
    static const struct {
        const char *sub, *tmpl, *log;
    } bad[] = {
        {"t-syntax", "{% for m in messages %}{{ m.content }}", "does not parse"},
        {"t-raise", "{{ raise_exception('no chat here') }}", "no chat here"},
        {"t-type", "{{ messages + 1 }}", "cannot render a sample conversation"},
    };
    char dir[300];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(dir, sizeof(dir), "%s/%s", h_dir(), bad[i].sub);
        folder_with_template(dir, json_string(bad[i].tmpl));
        llm_path = dir;
        pid_t w = start_worker_with("tmpl", "tmpl.jobs", "");
        int st = -1, gone = 0;
        double until = h_now() + 60;
        while (!(gone = h_exited(w, &st)) && h_now() < until) h_sleep_ms(50);
        assert_true(gone);
        assert_int_equal(st, 1);
        if (!file_has(last_log, bad[i].log))
            fail_msg("%s: the log does not say \"%s\"", bad[i].sub, bad[i].log);
    }
    /* A list of named templates: "default" is the one. */
    char listed[300], none[300];
    snprintf(listed, sizeof(listed), "%s/t-list", h_dir());
    folder_with_template(listed, json_pack("[{s:s, s:s}, {s:s, s:s}]", "name", "tool_use",
                                           "template", "{{ raise_exception('not this one') }}",
                                           "name", "default", "template",
                                           "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                                           "{% endfor %}"));
    snprintf(none, sizeof(none), "%s/t-none", h_dir());
    folder_with_template(none, NULL);
    const char *folders[] = {listed, none};
    for (int k = 0; k < 2; k++) {
        llm_path = folders[k];
        const char *name = k ? "tnone" : "tlist";
        char topic[64];
        snprintf(topic, sizeof(topic), "%s.jobs", name);
        pid_t w = start_worker_with(name, topic, "");
        struct gcase *cs[2];
        cs[0] = gc_new("p", prompt_job("plain prompt", 4, 0), 0);
        cs[1] = k ? gc_bad("m", json_pack("{s:o}", "messages", chat()), 1, "invalid_input",
                           "has no chat template")
                  : gc_new("m", json_pack("{s:o, s:i}", "messages", chat(), "max_tokens", 4), 1);
        produce(topic, cs, 2);
        collect(name, cs, 2, 0);
        check(cs[0]);
        check(cs[1]);
        stop_worker(w, name, 2);
        gc_free(cs[0]);
        gc_free(cs[1]);
    }
    llm_path = NULL;
}

static int setup(void **state)
{
    (void)state;
    char err[512];
    snprintf(llm_dir, sizeof(llm_dir), "%s/llm", h_dir());
    snprintf(mlp_path, sizeof(mlp_path), "%s/mlp.safetensors", h_dir());
    if (decoder_write_demo(llm_dir, 2, 32, 4, 2, 64, tu_rand64(), err, sizeof(err)) < 0 ||
        model_write_demo(mlp_path, 8, 16, 4, tu_rand64(), err, sizeof(err)) < 0) {
        fprintf(stderr, "test_gen_jobs: %s\n", err);
        return -1;
    }
    char path[400];
    snprintf(path, sizeof(path), "%s/config.json", llm_dir);
    json_error_t e;
    json_t *cfg = json_load_file(path, 0, &e);
    if (!cfg) return -1;
    vocab = (size_t)json_integer_value(json_object_get(cfg, "vocab_size"));
    json_decref(cfg);
    if (h_start_broker(kinfer_bin(), "gen.jobs,gen.results,gen.dlq,bad.jobs,bad.results,bad.dlq,"
                                     "crash.jobs,crash.results,crash.dlq,tmpl.jobs,"
                                     "tlist.jobs,tlist.results,tlist.dlq,tnone.jobs,"
                                     "tnone.results,tnone.dlq",
                       PARTS, brokers, sizeof(brokers)) < 0)
        return -1;
    if (h_start_redis(&redis_port) < 0) return -1;
    fprintf(stderr, "test_gen_jobs: broker %s, redis port %d, logs in %s\n", brokers, redis_port,
            h_dir());
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
        cmocka_unit_test(test_gen_results),
        cmocka_unit_test(test_gen_invalid),
        cmocka_unit_test(test_gen_crash),
        cmocka_unit_test(test_gen_templates),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

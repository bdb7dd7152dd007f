/* test_text_jobs.c - text encoders end to end, with real parts: `kinfer
 * broker` (librdkafka's mock cluster in its own process), a real
 * redis-server and the worker binary serving three encoders made from two
 * random BERT folders (an embedder "emb", a 3-label classifier "cls", and
 * "tok", the embedder with every token's vector), one random folder of
 * each other family with its own tokenizer ("rob": RoBERTa with
 * byte-level BPE, "xlmr": XLM-R with Unigram, "mpnet", "distil": a
 * DistilBERT classifier, "nomic": NomicBERT), a one-label BERT
 * cross-encoder "rerank"
 * (sigmoid relevance scores for text + text_pair) and an MLP "mlp". Jobs go
 * in through codecs/wire.c in both encodings: single strings and rows of
 * very different lengths, text pairs, pre-tokenized rows with type ids,
 * rows too long with and without truncation, and hostile ones (invalid
 * UTF-8, NUL bytes, 10 MB of text, ids outside the vocabulary, the wrong
 * kind of input for the model, rows empty or only whitespace for every
 * tokenizer).
 *
 * Expected values come from the same folders loaded here on the CPU and
 * each row run alone through model_encode after the model's own
 * tokenizer; a worker batches rows with others, which changes only the
 * float32 summation order, so 1e-4 absolute holds. One job, the issue's
 * {"id": "a", "text": "..."}, is also checked against PyTorch
 * (tests/torch_encoder.py, Debian's python3-torch): KINFER_TEST_NO_TORCH=1
 * skips that part on a machine without it.
 *
 * Every job must be answered exactly once on the reply topic, with the
 * body stored in Redis, and its offset committed. The hostile 10 MB
 * records go to partitions of their own (see test_invalid_jobs for why). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <msgpack.h>

#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "../text/tokenizer.h"
#include "harness.h"
#include "testutil.h"

#define LAYERS 2
#define HIDDEN 32
#define HEADS 4
#define INTER 64
#define N_LABELS 3
#define PARTS 4
#define MAX_TOK 128         /* the demo folders' model_max_length */
#define BATCH_TOKENS 1024   /* batching.max_batch_tokens of the workers */
#define MAX_ROWS 10         /* rows in one job of this test */
#define MAX_IDS 2048        /* ids in one row before truncation */
#define MAX_TEXT_CHARS 65536 /* worker.max_text_chars's default */
#define TOL 1e-4
#define BIG_TEXT ((size_t)10 << 20) /* the hostile 10 MB text */

static const char *kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}

/* $KINFER_TEST_BACKEND runs the workers on another backend ("cuda"); the
 * expected values are always computed on the CPU. */
static const char *test_backend(void)
{
    const char *b = getenv("KINFER_TEST_BACKEND");
    return b && *b ? b : "cpu";
}

/* Seconds to wait for a worker's answers: $KINFER_TEST_WAIT_S, 60 by
 * default (the emulated device, tests/emu_e2e.sh, is far slower than a
 * CPU or a GPU and is given more). */
static double wait_s(void)
{
    const char *s = getenv("KINFER_TEST_WAIT_S");
    double v = s && *s ? atof(s) : 0;
    return v > 0 ? v : 60;
}

static char brokers[512];
static int redis_port;
static char emb_dir[300], cls_dir[300], mlp_path[300];
static char rob_dir[300], xlmr_dir[300], mpnet_dir[300], distil_dir[300], rerank_dir[300];
static char nomic_dir[300];

/* ---- the reference: the same folders, one row at a time --------------- */

/* The text encoders first (M_EMB..M_NOMIC: one of each family, each
 * with its own tokenizer), the MLP last. */
enum { M_EMB, M_CLS, M_TOK, M_ROB, M_XLMR, M_MPNET, M_DISTIL, M_RERANK, M_NOMIC, M_MLP, M_N };
static const char *const model_names[M_N] = {"emb",   "cls",    "tok",    "rob",   "xlmr",
                                             "mpnet", "distil", "rerank", "nomic", "mlp"};

static struct model_runtime *ref_rt;
static struct model *ref_model[M_MLP];
static struct model_ws *ref_ws[M_MLP];
static struct tokenizer_scratch *ref_wp;

static const struct model_encoder_info *enc_of(int m)
{
    return model_encoder(ref_model[m]);
}

/* Width of one output row of model m (per token for "tok"). */
static size_t out_width(int m)
{
    return model_output_width(ref_model[m]);
}

/* One row as the worker should see it: ids after tokenizing/truncation,
 * and the expected output (out_width floats, or len x hidden for tok). */
struct row {
    int32_t ids[MAX_IDS], types[MAX_IDS];
    size_t len;
    float *expect;
};

/* Runs a row alone through model m; the output goes into r->expect. */
static void ref_run(int m, struct row *r)
{
    uint32_t offs[2] = {0, (uint32_t)r->len};
    struct model_seqs s = {r->ids, r->types, offs, 1};
    const float *out = NULL;
    assert_int_equal(model_encode(ref_model[m], ref_ws[m], &s, &out), MODEL_OK);
    size_t n = (m == M_TOK ? r->len : 1) * out_width(m);
    r->expect = malloc(n * sizeof(float));
    assert_non_null(r->expect);
    memcpy(r->expect, out, n * sizeof(float));
}

/* Tokenizes text (and pair) with model m's tokenizer into r, limited to
 * the model's max_tokens when truncate; returns tokenizer_encode's answer, and
 * the untruncated length in *full. */
static int ref_tokenize(int m, const char *text, size_t len, const char *pair, int truncate,
                        struct row *r, size_t *full)
{
    char err[200];
    int n = tokenizer_encode(enc_of(m)->tokenizer, ref_wp, text, len, pair,
                             pair ? strlen(pair) : 0, truncate ? enc_of(m)->max_tokens : 0,
                             truncate, r->ids, r->types, MAX_IDS, full, err, sizeof(err));
    r->len = n > 0 ? (size_t)n : 0;
    return n;
}

/* ---- jobs ------------------------------------------------------------------ */

/* A job of this test: what is sent, and what should come back. */
struct tcase {
    char id[64];
    int model;                 /* M_*, or -1: the worker's default (emb) */
    enum proto_enc enc;
    enum wire_truncate truncate;
    /* text rows (owned copies; NUL bytes allowed) and optional pairs */
    char *text[MAX_ROWS];
    size_t text_len[MAX_ROWS];
    char *pair[MAX_ROWS];
    size_t n_text;
    int text_as_array;
    /* pre-tokenized rows */
    int32_t *tokens, *type_ids;
    size_t token_off[MAX_ROWS + 1];
    size_t n_token_rows;
    int with_types;
    /* anything else the job carries */
    int64_t deadline_ms;
    const float *input;
    size_t n_input;
    /* expected: rows when ok, else the error code and message parts */
    struct row *rows[MAX_ROWS];
    size_t n_rows;
    const char *code;
    char msg1[96], msg2[96];
    /* a job sent raw (not through wire_encode_job), to a partition */
    unsigned char *raw;
    size_t raw_len;
    int partition;
};

static int model_of(const struct tcase *c)
{
    return c->model < 0 ? M_EMB : c->model;
}

static struct tcase *case_new(const char *id, int model, enum proto_enc enc)
{
    struct tcase *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    snprintf(c->id, sizeof(c->id), "%s", id);
    c->model = model;
    c->enc = enc;
    c->partition = RD_KAFKA_PARTITION_UA;
    return c;
}

static void case_free(struct tcase *c)
{
    for (size_t i = 0; i < c->n_text; i++) {
        free(c->text[i]);
        free(c->pair[i]);
    }
    for (size_t i = 0; i < c->n_rows; i++) {
        free(c->rows[i]->expect);
        free(c->rows[i]);
    }
    free(c->tokens);
    free(c->type_ids);
    free(c->raw);
    free(c);
}

/* Adds a text row (len bytes, NUL bytes allowed; pair may be NULL). The
 * expected row is tokenized from same_as (the text the row must equal,
 * e.g. without its NUL bytes) or from the text itself, and run through
 * the reference when the job is to succeed (c->code NULL). */
static void case_text(struct tcase *c, const char *text, size_t len, const char *pair,
                      const char *same_as)
{
    assert_true(c->n_text < MAX_ROWS);
    size_t i = c->n_text++;
    c->text[i] = malloc(len + 1);
    assert_non_null(c->text[i]);
    memcpy(c->text[i], text, len);
    c->text[i][len] = '\0';
    c->text_len[i] = len;
    if (pair) c->pair[i] = strdup(pair);
    if (c->code) return;
    struct row *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    size_t full;
    const char *t = same_as ? same_as : text;
    int n = ref_tokenize(model_of(c), t, same_as ? strlen(same_as) : len, pair,
                         c->truncate != WIRE_TRUNCATE_FALSE, r, &full);
    if (n < 2) fail_msg("%s: reference tokenizer failed on row %zu (%d)", c->id, i, n);
    ref_run(model_of(c), r);
    c->rows[c->n_rows++] = r;
}

/* Adds a row of plain text (a C string) with an optional pair. */
static void case_str(struct tcase *c, const char *text, const char *pair)
{
    case_text(c, text, strlen(text), pair, NULL);
}

/* Adds a pre-tokenized row; the expected row is what the worker keeps of
 * it (the first max_tokens - 1 ids and the last when truncated). */
static void case_tokens(struct tcase *c, const int32_t *ids, const int32_t *types, size_t n)
{
    assert_true(c->n_token_rows < MAX_ROWS);
    size_t at = c->token_off[c->n_token_rows];
    c->tokens = realloc(c->tokens, (at + n) * sizeof(int32_t));
    c->type_ids = realloc(c->type_ids, (at + n) * sizeof(int32_t));
    assert_true(c->tokens && c->type_ids);
    memcpy(c->tokens + at, ids, n * sizeof(int32_t));
    for (size_t k = 0; k < n; k++) c->type_ids[at + k] = types ? types[k] : 0;
    c->with_types |= types != NULL;
    c->token_off[++c->n_token_rows] = at + n;
    if (c->code) return;
    struct row *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    size_t max = enc_of(model_of(c))->max_tokens;
    r->len = n > max ? max : n;
    for (size_t k = 0; k < r->len; k++) {
        size_t src = k + 1 == r->len && r->len < n ? n - 1 : k;
        r->ids[k] = ids[src];
        r->types[k] = types ? types[src] : 0;
    }
    ref_run(model_of(c), r);
    c->rows[c->n_rows++] = r;
}

/* The job's body, as a producer would encode it. */
static void case_encode(const struct tcase *c, unsigned char **body, size_t *len)
{
    if (c->raw) {
        *body = malloc(c->raw_len);
        assert_non_null(*body);
        memcpy(*body, c->raw, c->raw_len);
        *len = c->raw_len;
        return;
    }
    /* text_pair has a row for every row of text, or is absent. */
    const char *pairs[MAX_ROWS];
    for (size_t i = 0; i < c->n_text; i++) {
        pairs[i] = c->pair[i];
        assert_true((pairs[i] != NULL) == (c->pair[0] != NULL));
    }
    struct wire_job j = {
        .id = c->id,
        .model = c->model < 0 ? NULL : model_names[c->model],
        .input = c->input,
        .n_input = c->n_input,
        .deadline_ms = c->deadline_ms,
        .timeout_ms = -1,
        .priority = -1,
        .text = c->n_text ? (const char *const *)c->text : NULL,
        .text_len = c->text_len,
        .n_text = c->n_text,
        .text_as_array = c->text_as_array,
        .text_pair = c->n_text && c->pair[0] ? pairs : NULL,
        .tokens = c->n_token_rows ? c->tokens : NULL,
        .token_off = c->token_off,
        .n_token_rows = c->n_token_rows,
        .type_ids = c->n_token_rows && c->with_types ? c->type_ids : NULL,
        .truncate = c->truncate,
    };
    assert_int_equal(wire_encode_job(&j, c->enc, body, len), 0);
}

/* Records the broker did not acknowledge. */
static int delivery_errors;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (m->err) {
        fprintf(stderr, "test_text_jobs: delivery failed: %s\n", rd_kafka_err2str(m->err));
        delivery_errors++;
    }
}

/* A producer whose records may be as large as the hostile ones (the mock
 * broker has no record size limit of its own). */
static rd_kafka_t *big_producer(void)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err));
    rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err));
    rd_kafka_conf_set(conf, "linger.ms", "2", err, sizeof(err));
    assert_int_equal(rd_kafka_conf_set(conf, "message.max.bytes", "33554432", err, sizeof(err)),
                     RD_KAFKA_CONF_OK);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!p) fail_msg("producer: %s", err);
    return p;
}

/* Produces every case to topic (keyed by id) and waits for the acks. */
static void produce_all(const char *topic, struct tcase **cases, size_t n)
{
    rd_kafka_t *p = big_producer();
    for (size_t i = 0; i < n; i++) {
        unsigned char *body;
        size_t len;
        case_encode(cases[i], &body, &len);
        const char *ct = cases[i]->enc == PROTO_ENC_JSON ? "application/json"
                                                         : "application/msgpack";
        rd_kafka_resp_err_t e;
        do {
            e = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic),
                                  RD_KAFKA_V_PARTITION(cases[i]->partition),
                                  RD_KAFKA_V_KEY(cases[i]->id, strlen(cases[i]->id)),
                                  RD_KAFKA_V_VALUE(body, len),
                                  RD_KAFKA_V_HEADER("content-type", ct, -1),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) rd_kafka_poll(p, 10);
        } while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
        if (e) fail_msg("produce %s: %s", cases[i]->id, rd_kafka_err2str(e));
        free(body);
        rd_kafka_poll(p, 0);
    }
    assert_int_equal(rd_kafka_flush(p, 20000), 0);
    assert_int_equal(delivery_errors, 0);
    rd_kafka_destroy(p);
}

/* ---- the worker ----------------------------------------------------------- */

/* Writes a worker config serving every model of model_names on the given
 * topics (a comma list of quoted names); results go to <name>.results. */
static const char *write_config(const char *name, const char *topics, const char *worker_extra,
                                const char *metrics_listen)
{
    static char path[300];
    snprintf(path, sizeof(path), "%s/%s.cfg", h_dir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"g-%s\"; topics = [ %s ];\n"
            "  reply_topic = \"%s.results\"; dlq_topic = \"%s.dlq\";\n"
            "  properties = ( ( \"auto.commit.interval.ms\", \"200\" ),"
            " ( \"fetch.wait.max.ms\", \"10\" ) ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"%s:\"; ttl_ms = 600000; };\n"
            "batching = { max_batch_rows = 16; max_wait_ms = 5; max_batch_tokens = %d; };\n"
            "models = ( { name = \"emb\"; path = \"%s\"; },\n"
            "  { name = \"cls\"; path = \"%s\"; },\n"
            "  { name = \"tok\"; path = \"%s\"; encoder = { pooling = \"none\"; normalize = false; }; },\n"
            "  { name = \"rob\"; path = \"%s\"; }, { name = \"xlmr\"; path = \"%s\"; },\n"
            "  { name = \"mpnet\"; path = \"%s\"; }, { name = \"distil\"; path = \"%s\"; },\n"
            "  { name = \"rerank\"; path = \"%s\"; }, { name = \"nomic\"; path = \"%s\"; },\n"
            "  { name = \"mlp\"; path = \"%s\";\n"
            "    layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
            "               { op = \"relu\"; },\n"
            "               { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); } );\n"
            "default_model = \"emb\";\n"
            "log = { level = \"info\"; };\n"
            "worker = { backend = \"%s\"; %s };\n"
            "metrics = { listen = \"%s\"; heartbeat_prefix = \"\"; };\n",
            brokers, name, topics, name, name, redis_port, name, BATCH_TOKENS, emb_dir, cls_dir,
            emb_dir, rob_dir, xlmr_dir, mpnet_dir, distil_dir, rerank_dir, nomic_dir, mlp_path, test_backend(), worker_extra ? worker_extra : "",
            metrics_listen ? metrics_listen : "");
    fclose(f);
    return path;
}

static pid_t start_worker(const char *cfg, const char *name)
{
    char log[300];
    snprintf(log, sizeof(log), "%s/%s.worker.log", h_dir(), name);
    char *argv[] = {(char *)kinfer_bin(), "worker", "-c", (char *)cfg, NULL};
    return h_spawn(argv, NULL, log);
}

/* ---- results -------------------------------------------------------------- */

struct answer {
    char *body;  /* from Redis */
    size_t len;
    int replies; /* records on the reply topic keyed by the id */
};

/* Waits until Redis holds prefix:id for every case (MGET rounds), or
 * timeout; stores the bodies. Returns how many were found. */
static size_t wait_answers(const char *prefix, struct tcase **cases, size_t n,
                           struct answer *ans, double timeout_s)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    assert_true(c && !c->err);
    const char **argv = calloc(n + 1, sizeof(*argv));
    char (*keys)[96] = calloc(n, sizeof(*keys));
    assert_true(argv && keys);
    argv[0] = "MGET";
    for (size_t i = 0; i < n; i++) {
        snprintf(keys[i], sizeof(keys[i]), "%s:%s", prefix, cases[i]->id);
        argv[i + 1] = keys[i];
    }
    size_t found = 0;
    double until = h_now() + timeout_s;
    while (found < n && h_now() < until) {
        redisReply *r = redisCommandArgv(c, (int)n + 1, argv, NULL);
        assert_true(r && r->type == REDIS_REPLY_ARRAY && r->elements == n);
        for (size_t i = 0; i < n; i++) {
            if (ans[i].body || r->element[i]->type != REDIS_REPLY_STRING) continue;
            ans[i].len = r->element[i]->len;
            ans[i].body = malloc(ans[i].len);
            memcpy(ans[i].body, r->element[i]->str, ans[i].len);
            found++;
        }
        freeReplyObject(r);
        if (found < n) h_sleep_ms(50);
    }
    free(argv);
    free(keys);
    redisFree(c);
    return found;
}

/* Reads the reply topic until every case has a record, then a little
 * longer so that a duplicate would show; each record must carry the body
 * Redis has for its id. Fails on a record for an unknown id, a record
 * that differs from Redis, or an id answered more or less than once. */
static void check_replies(const char *topic, struct tcase **cases, size_t n, struct answer *ans)
{
    rd_kafka_t *c = h_reader(brokers, topic);
    assert_non_null(c);
    size_t distinct = 0;
    double until = h_now() + 60, grace_until = 0;
    while (h_now() < until && (!grace_until || h_now() < grace_until)) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        if (m->err) {
            rd_kafka_message_destroy(m);
            continue;
        }
        size_t i = 0;
        while (i < n && !(m->key_len == strlen(cases[i]->id) &&
                          memcmp(m->key, cases[i]->id, m->key_len) == 0))
            i++;
        if (i == n) fail_msg("%s: a record keyed '%.*s' answers no job of this test", topic,
                             (int)m->key_len, (const char *)m->key);
        if (ans[i].replies++ == 0) distinct++;
        if (m->len != ans[i].len || memcmp(m->payload, ans[i].body, m->len) != 0)
            fail_msg("%s: the reply record differs from the Redis value", cases[i]->id);
        rd_kafka_message_destroy(m);
        if (distinct == n && !grace_until) grace_until = h_now() + 2;
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    for (size_t i = 0; i < n; i++)
        if (ans[i].replies != 1)
            fail_msg("%s: answered %d times on %s, expected once", cases[i]->id, ans[i].replies,
                     topic);
}

/* The "scores" of a result body, which wire_decode_result only notes. */
static float *result_scores(const char *body, size_t len, size_t *n)
{
    float *out = NULL;
    *n = 0;
    if (body[0] == '{') {
        json_t *o = json_loadb(body, len, 0, NULL);
        json_t *a = json_object_get(o, "scores");
        *n = json_array_size(a);
        out = malloc((*n + 1) * sizeof(float));
        for (size_t i = 0; out && i < *n; i++)
            out[i] = (float)json_number_value(json_array_get(a, i));
        json_decref(o);
        return out;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, body, len, NULL) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            const msgpack_object *k = &u.data.via.map.ptr[i].key, *v = &u.data.via.map.ptr[i].val;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == 6 &&
                !memcmp(k->via.str.ptr, "scores", 6) && v->type == MSGPACK_OBJECT_BIN) {
                *n = v->via.bin.size / 4;
                out = malloc((*n + 1) * sizeof(float));
                if (out) memcpy(out, v->via.bin.ptr, *n * 4);
            }
        }
    }
    msgpack_unpacked_destroy(&u);
    return out;
}

static void expect_close(const char *id, const char *what, size_t k, float got, float want)
{
    if (!(fabs((double)got - (double)want) <= TOL))
        fail_msg("%s: %s[%zu] = %.9g, reference %.9g", id, what, k, got, want);
}

/* Checks one answer against its case: an error with the right code and
 * message, or the reference's values with the result's shape, lengths,
 * scores, labels and token counts. */
static void check_answer(const struct tcase *c, const struct answer *a, const char *topic)
{
    struct wire_result r;
    char err[256];
    if (wire_decode_result(a->body, a->len, &r, err, sizeof(err)) != 0)
        fail_msg("%s: %s", c->id, err);
    assert_string_equal(r.id, c->id);
    assert_int_equal(a->body[0] == '{', c->enc == PROTO_ENC_JSON);
    if (c->code) {
        if (r.ok) fail_msg("%s: status ok, expected %s", c->id, c->code);
        if (strcmp(r.code, c->code) != 0)
            fail_msg("%s: code %s, expected %s (%s)", c->id, r.code, c->code, r.message);
        if (!strstr(r.message, c->msg1) || !strstr(r.message, c->msg2))
            fail_msg("%s: message \"%s\" does not say \"%s\" and \"%s\"", c->id, r.message,
                     c->msg1, c->msg2);
        assert_null(r.output);
        wire_result_fini(&r);
        return;
    }
    if (!r.ok) fail_msg("%s: %s: %s", c->id, r.code, r.message);
    int m = model_of(c);
    assert_string_equal(r.model, model_names[m]);
    assert_string_equal(r.topic, topic);
    assert_int_equal(r.rows, c->n_rows);
    assert_int_equal(r.width, out_width(m));
    assert_non_null(r.output);
    size_t w = out_width(m), tokens = 0, longest = 0;
    for (size_t i = 0; i < c->n_rows; i++) {
        tokens += c->rows[i]->len;
        if (c->rows[i]->len > longest) longest = c->rows[i]->len;
    }
    if (m == M_TOK) {
        /* [rows, tokens, hidden]: each row's vectors, then zeros. */
        assert_int_equal(r.tokens_dim, longest);
        assert_non_null(r.lengths);
        for (size_t i = 0; i < c->n_rows; i++) {
            if (r.lengths[i] != c->rows[i]->len)
                fail_msg("%s: row %zu has %zu tokens, the tokenizer says %zu", c->id, i,
                         r.lengths[i], c->rows[i]->len);
            const float *o = r.output + i * longest * w;
            for (size_t k = 0; k < c->rows[i]->len * w; k++)
                expect_close(c->id, "output", i * longest * w + k, o[k], c->rows[i]->expect[k]);
            for (size_t k = c->rows[i]->len * w; k < longest * w; k++)
                if (o[k] != 0.0f)
                    fail_msg("%s: padding of row %zu is %g at %zu, not 0", c->id, i, o[k], k);
        }
    } else {
        assert_int_equal(r.tokens_dim, 0);
        assert_null(r.lengths);
        for (size_t i = 0; i < c->n_rows; i++)
            for (size_t k = 0; k < w; k++)
                expect_close(c->id, "output", i * w + k, r.output[i * w + k],
                             c->rows[i]->expect[k]);
    }
    if (enc_of(m)->head == MODEL_HEAD_CLASSIFIER) {
        /* scores are the output; labels name each row's best score; the
         * softmax rows sum to 1, a cross-encoder's sigmoid scores lie in
         * (0, 1). */
        assert_true(r.has_scores);
        assert_non_null(r.labels);
        size_t ns;
        float *sc = result_scores(a->body, a->len, &ns);
        assert_non_null(sc);
        assert_int_equal(ns, c->n_rows * w);
        assert_memory_equal(sc, r.output, ns * sizeof(float));
        free(sc);
        for (size_t i = 0; i < c->n_rows; i++) {
            const float *s = r.output + i * w;
            size_t best = 0;
            double sum = 0;
            for (size_t k = 0; k < w; k++) {
                sum += s[k];
                if (s[k] > s[best]) best = k;
            }
            char want[32];
            snprintf(want, sizeof(want), "label_%zu", best);
            assert_non_null(r.labels[i]);
            assert_string_equal(r.labels[i], want);
            if (enc_of(m)->sigmoid == MODEL_SCORES_SOFTMAX && fabs(sum - 1.0) > 1e-5)
                fail_msg("%s: scores of row %zu sum to %.9g", c->id, i, sum);
            for (size_t k = 0; enc_of(m)->sigmoid == MODEL_SCORES_SIGMOID && k < w; k++)
                if (!(s[k] > 0 && s[k] < 1))
                    fail_msg("%s: sigmoid score %zu of row %zu is %.9g", c->id, k, i, s[k]);
        }
    } else {
        assert_false(r.has_scores);
        assert_null(r.labels);
    }
    /* Token counts: the rows' own tokens; the batch's shape is rows x its
     * longest row, no shorter than this job's, no longer than the model
     * takes. */
    if (r.tokens != (int64_t)tokens)
        fail_msg("%s: timing.tokens %lld, the rows have %zu", c->id, (long long)r.tokens, tokens);
    assert_true(r.padded_tokens >= r.tokens);
    assert_true(r.padded_tokens >= (int64_t)(c->n_rows * longest));
    assert_true(r.padded_tokens % (int64_t)c->n_rows == 0);
    assert_true(r.padded_tokens / (int64_t)c->n_rows <= MAX_TOK);
    assert_true(r.batch_rows >= (int64_t)c->n_rows);
    wire_result_fini(&r);
}

/* Produced, answered, replied once, committed: the whole life of cases on
 * one worker. */
static void run_cases(const char *name, const char *topic, struct tcase **cases, size_t n,
                      struct answer *ans)
{
    assert_int_equal(wait_answers(name, cases, n, ans, wait_s()), n);
    char reply[96];
    snprintf(reply, sizeof(reply), "%s.results", name);
    check_replies(reply, cases, n, ans);
    for (size_t i = 0; i < n; i++) check_answer(cases[i], &ans[i], topic);
}

/* ---- text to fill jobs with -------------------------------------------------- */

/* Words the demo vocabulary holds whole, in pieces, or not at all. */
static const char *const words[] = {
    "the", "worker", "read", "a", "good", "book", "about", "kafka", "and", "redis", "Movie",
    "films", "quickly", "never", "GREAT", "searching", "documents", "tokenization", "ok",
    "city", "walked", "happiness", "Price", "product", "qualities", "slowest", "gpu", "é",
    "naïve", "über", "日本", "emoji😀", "x", "said", "water", "houses", "thinking", "kinfer"};

/* n words drawn from the list, with now and then a comma or a full stop. */
static char *rand_text(size_t n)
{
    size_t cap = n * 24 + 1, at = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const char *w = words[tu_rand64() % (sizeof(words) / sizeof(words[0]))];
        uint64_t p = tu_rand64() % 10;
        at += (size_t)snprintf(s + at, cap - at, "%s%s%s", i ? " " : "", w,
                               p == 0 ? "," : p == 1 ? "." : "");
    }
    return s;
}

/* unit repeated n times, then tail (may be NULL); a new C string. */
static char *repeat(const char *unit, size_t n, const char *tail)
{
    size_t u = strlen(unit), t = tail ? strlen(tail) : 0;
    char *s = malloc(u * n + t + 1);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) memcpy(s + i * u, unit, u);
    if (t) memcpy(s + u * n, tail, t);
    s[u * n + t] = '\0';
    return s;
}

/* Adds a row of n random words to c. */
static void add_rand_row(struct tcase *c, size_t n, const char *pair)
{
    char *t = rand_text(n);
    case_text(c, t, strlen(t), pair, NULL);
    free(t);
}

/* A pre-tokenized row made by the reference tokenizer from a text pair,
 * so the ids and type ids are realistic. */
static size_t tokens_of(int m, const char *text, const char *pair, int32_t *ids, int32_t *types)
{
    struct row r;
    size_t full;
    int n = ref_tokenize(m, text, strlen(text), pair, 0, &r, &full);
    assert_true(n >= 2);
    memcpy(ids, r.ids, r.len * sizeof(int32_t));
    memcpy(types, r.types, r.len * sizeof(int32_t));
    return r.len;
}

/* ---- PyTorch -------------------------------------------------------------- */

static char torch_script[300];

/* Runs a command with the request on its stdin; returns its stdout
 * (malloc'd, NUL-terminated) and exit status in *status. */
static char *run_with_stdin(char *const argv[], const char *in, int *status)
{
    int to[2], from[2];
    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[0]);
        close(to[1]);
        close(from[0]);
        close(from[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    size_t n = strlen(in);
    for (size_t at = 0; at < n;) {
        ssize_t w = write(to[1], in + at, n - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    close(to[1]);
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    ssize_t r;
    while ((r = read(from[0], out + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 2) out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    close(from[0]);
    int st;
    waitpid(pid, &st, 0);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return out;
}

/* 1 when the PyTorch check is to run (torch importable), 0 when skipped
 * by KINFER_TEST_NO_TORCH=1; fails otherwise. */
static int torch_wanted(void)
{
    int st;
    char *argv[] = {"/usr/bin/python3", "-c", "import torch", NULL};
    free(run_with_stdin(argv, "", &st));
    if (st == 0) return 1;
    const char *no = getenv("KINFER_TEST_NO_TORCH");
    if (no && strcmp(no, "1") == 0) {
        printf("test_text_jobs: skipped the PyTorch check: KINFER_TEST_NO_TORCH=1 and "
               "python3-torch is not importable\n");
        return 0;
    }
    fail_msg("python3-torch missing: make deps (or KINFER_TEST_NO_TORCH=1 to skip the check)");
    return 0;
}

/* Runs the embedder folder through tests/torch_encoder.py on row r's ids;
 * compares with got (hidden floats). */
static void check_torch(const struct row *r, const float *got)
{
    json_t *ids = json_array(), *types = json_array();
    for (size_t k = 0; k < r->len; k++) {
        json_array_append_new(ids, json_integer(r->ids[k]));
        json_array_append_new(types, json_integer(r->types[k]));
    }
    json_t *req = json_pack("{s:[o],s:[o],s:s,s:b,s:s,s:b}", "rows", ids, "type_ids", types,
                            "pooling", "mean", "normalize", 1, "head", "embedding", "sigmoid", 0);
    char *in = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char *argv[] = {"/usr/bin/python3", torch_script, emb_dir, NULL};
    int st;
    char *out = run_with_stdin(argv, in, &st);
    free(in);
    if (st != 0) fail_msg("%s exited %d", torch_script, st);
    json_error_t je;
    json_t *res = json_loads(out, 0, &je);
    if (!res) fail_msg("torch_encoder.py: not JSON: %s", je.text);
    json_t *row = json_array_get(json_object_get(res, "output"), 0);
    assert_int_equal(json_array_size(row), HIDDEN);
    double worst = 0;
    for (size_t k = 0; k < HIDDEN; k++) {
        double want = json_number_value(json_array_get(row, k));
        double d = fabs((double)got[k] - want);
        if (d > worst) worst = d;
        if (!(d <= TOL)) fail_msg("a: output[%zu] = %.9g, PyTorch %.9g", k, got[k], want);
    }
    printf("test_text_jobs: job a matches PyTorch (largest difference %.2e)\n", worst);
    json_decref(res);
    free(out);
}

/* ---- metrics (optional) ------------------------------------------------------ */

/* GET /metrics from 127.0.0.1:port; returns the body (malloc'd) or NULL. */
static char *get_metrics(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return NULL;
    }
    const char *q = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
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

/* ---- good jobs ----------------------------------------------------------------- */

#define N_STREAM 40
#define MAX_CASES 128

static void test_text_results(void **state)
{
    (void)state;
    static struct tcase *cases[MAX_CASES];
    static struct answer ans[MAX_CASES];
    size_t n = 0;
    struct tcase *c;
    int torch = torch_wanted(); /* before anything else: a missing torch fails fast */

    /* The "done when": {"id": "a", "text": "..."}, default model. */
    c = cases[n++] = case_new("a", -1, PROTO_ENC_JSON);
    case_str(c, "The worker read a good book about Kafka and Redis.", NULL);

    c = cases[n++] = case_new("emb-mp-one", M_EMB, PROTO_ENC_MSGPACK);
    case_str(c, "Hello, World! The GPU is FAST; tokenization, naïve über 日本語.", NULL);

    /* Rows of very different lengths, one a single letter: the job pads. */
    for (int e = 0; e < 2; e++) {
        c = cases[n++] = case_new(e ? "emb-mp-rows" : "emb-js-rows", M_EMB,
                                  e ? PROTO_ENC_MSGPACK : PROTO_ENC_JSON);
        add_rand_row(c, 1, NULL);
        add_rand_row(c, 70, NULL);
        case_str(c, " q ", NULL);
        add_rand_row(c, 6, NULL);
        add_rand_row(c, 25, NULL);
    }
    c = cases[n++] = case_new("emb-mp-array1", M_EMB, PROTO_ENC_MSGPACK);
    c->text_as_array = 1;
    add_rand_row(c, 9, NULL);

    /* text_pair: the second segment has type id 1. */
    c = cases[n++] = case_new("pair-js", M_EMB, PROTO_ENC_JSON);
    case_str(c, "what is a good movie", "the best film of the year");
    case_str(c, "kafka", "a book, never read");
    c = cases[n++] = case_new("pair-mp", M_EMB, PROTO_ENC_MSGPACK);
    case_str(c, "search query", "a long document about searching documents in the city");
    case_str(c, "x", "y");
    case_str(c, "Price and quality", "fast service");

    /* Pre-tokenized rows with type ids (made from pairs), and without. */
    for (int e = 0; e < 2; e++) {
        c = cases[n++] = case_new(e ? "tokens-mp" : "tokens-js", M_EMB,
                                  e ? PROTO_ENC_MSGPACK : PROTO_ENC_JSON);
        int32_t ids[MAX_IDS], types[MAX_IDS];
        size_t len = tokens_of(M_EMB, "is the product good", "the quality is great", ids, types);
        case_tokens(c, ids, types, len);
        len = tokens_of(M_EMB, "redis", "a worker wrote the result to redis quickly", ids, types);
        case_tokens(c, ids, types, len);
        len = tokens_of(M_EMB, "ok", NULL, ids, types);
        case_tokens(c, ids, types, len);
    }
    {
        c = cases[n++] = case_new("tokens-notypes-mp", M_EMB, PROTO_ENC_MSGPACK);
        int32_t ids[MAX_IDS], types[MAX_IDS];
        size_t len = tokens_of(M_EMB, "never walk slowly", NULL, ids, types);
        case_tokens(c, ids, NULL, len);
    }

    /* The classifier: scores, labels. */
    c = cases[n++] = case_new("cls-js", M_CLS, PROTO_ENC_JSON);
    add_rand_row(c, 4, NULL);
    add_rand_row(c, 40, NULL);
    add_rand_row(c, 12, NULL);
    c = cases[n++] = case_new("cls-mp", M_CLS, PROTO_ENC_MSGPACK);
    case_str(c, "i love this movie", "it is great");
    case_str(c, "the worst food", "bad service, never again");

    /* Every token's vector: [rows, tokens, hidden], zero padded. */
    c = cases[n++] = case_new("tok-js", M_TOK, PROTO_ENC_JSON);
    add_rand_row(c, 3, NULL);
    add_rand_row(c, 30, NULL);
    case_str(c, "\t.", NULL);
    c = cases[n++] = case_new("tok-mp", M_TOK, PROTO_ENC_MSGPACK);
    case_str(c, "one two three", "four");
    add_rand_row(c, 17, "z"); /* a one-letter second segment */

    /* Too long, truncated (the default, and truncate = true): the row
     * keeps max_tokens tokens. */
    {
        char *long_text = rand_text(150);
        c = cases[n++] = case_new("long-default-js", M_EMB, PROTO_ENC_JSON);
        case_text(c, long_text, strlen(long_text), NULL, NULL);
        assert_int_equal(c->rows[0]->len, MAX_TOK);
        add_rand_row(c, 2, NULL);
        c = cases[n++] = case_new("long-true-mp", M_TOK, PROTO_ENC_MSGPACK);
        c->truncate = WIRE_TRUNCATE_TRUE;
        case_text(c, long_text, strlen(long_text), NULL, NULL);
        add_rand_row(c, 5, NULL);
        c = cases[n++] = case_new("long-pair-mp", M_CLS, PROTO_ENC_MSGPACK);
        char *other = rand_text(120);
        case_text(c, long_text, strlen(long_text), other, NULL);
        free(other);
        assert_int_equal(c->rows[0]->len, MAX_TOK);
        c = cases[n++] = case_new("long-tokens-mp", M_EMB, PROTO_ENC_MSGPACK);
        int32_t ids[MAX_IDS], types[MAX_IDS];
        size_t len = tokens_of(M_EMB, long_text, NULL, ids, types);
        assert_true(len > MAX_TOK);
        case_tokens(c, ids, types, len);
        free(long_text);
    }

    /* Exactly max_tokens with truncate = false: accepted. */
    {
        char *t = repeat("kafka ", MAX_TOK - 2, NULL);
        c = cases[n++] = case_new("exact-false-js", M_EMB, PROTO_ENC_JSON);
        c->truncate = WIRE_TRUNCATE_FALSE;
        case_str(c, t, NULL);
        assert_int_equal(c->rows[0]->len, MAX_TOK);
        c = cases[n++] = case_new("exact-false-tokens-mp", M_TOK, PROTO_ENC_MSGPACK);
        c->truncate = WIRE_TRUNCATE_FALSE;
        int32_t ids[MAX_IDS], types[MAX_IDS];
        size_t len = tokens_of(M_TOK, t, NULL, ids, types);
        case_tokens(c, ids, types, len);
        assert_int_equal(c->rows[0]->len, MAX_TOK);
        free(t);
    }

    /* A text of exactly max_text_chars characters (two bytes each):
     * accepted, and cut to max_tokens. */
    {
        char *t = repeat("é b ", MAX_TEXT_CHARS / 4, NULL);
        c = cases[n++] = case_new("max-chars-mp", M_TOK, PROTO_ENC_MSGPACK);
        case_str(c, t, NULL);
        assert_int_equal(c->rows[0]->len, MAX_TOK);
        free(t);
    }

    /* NUL bytes inside the text: dropped by the tokenizer, so the row is
     * the same text without them. */
    c = cases[n++] = case_new("nul-js", M_EMB, PROTO_ENC_JSON);
    case_text(c, "\0hello\0world, a good\0 book\0", 27, NULL, "helloworld, a good book");
    c = cases[n++] = case_new("nul-mp", M_TOK, PROTO_ENC_MSGPACK);
    case_text(c, "the\0 kafka\0\0 worker", 19, NULL, "the kafka worker");
    case_text(c, "\0", 1, NULL, "");

    /* The other families, each through its own tokenizer, in both
     * encodings: RoBERTa (byte-level BPE; pairs, type ids all 0), XLM-R
     * (Unigram; accents, CJK, emoji), MPNet, DistilBERT's classifier, and
     * a cross-encoder scoring a query against passages (text_pair). */
    for (int e = 0; e < 2; e++) {
        enum proto_enc enc = e ? PROTO_ENC_MSGPACK : PROTO_ENC_JSON;
        c = cases[n++] = case_new(e ? "rob-mp" : "rob-js", M_ROB, enc);
        case_str(c, "The worker read a good book about Kafka and Redis.", NULL);
        add_rand_row(c, 40, NULL);
        c = cases[n++] = case_new(e ? "rob-pair-mp" : "rob-pair-js", M_ROB, enc);
        case_str(c, "what is a good movie", "the best film of the year");
        add_rand_row(c, 9, "a book, never read");
        c = cases[n++] = case_new(e ? "xlmr-mp" : "xlmr-js", M_XLMR, enc);
        case_str(c, "Hello, World! naïve über 日本語 emoji😀 ｆｕｌｌ width", NULL);
        add_rand_row(c, 25, NULL);
        c = cases[n++] = case_new(e ? "xlmr-pair-mp" : "xlmr-pair-js", M_XLMR, enc);
        case_str(c, "search query", "a long document about searching documents");
        c = cases[n++] = case_new(e ? "mpnet-mp" : "mpnet-js", M_MPNET, enc);
        add_rand_row(c, 3, NULL);
        add_rand_row(c, 60, NULL);
        c = cases[n++] = case_new(e ? "distil-mp" : "distil-js", M_DISTIL, enc);
        add_rand_row(c, 12, NULL);
        case_str(c, "i love this movie, it is great", NULL);
        c = cases[n++] = case_new(e ? "nomic-mp" : "nomic-js", M_NOMIC, enc);
        case_str(c, "search_query: what is kafka", NULL);
        add_rand_row(c, 70, NULL);
        c = cases[n++] = case_new(e ? "nomic-pair-mp" : "nomic-pair-js", M_NOMIC, enc);
        case_str(c, "search_document: a worker", "a second segment");
        c = cases[n++] = case_new(e ? "rerank-mp" : "rerank-js", M_RERANK, enc);
        case_str(c, "how do i reset my password", "open the settings page and choose reset");
        case_str(c, "how do i reset my password", "the city has good food and water");
        add_rand_row(c, 30, "kafka redis worker");
    }

    /* A stream of one-row jobs of every length, to every text encoder, in
     * both encodings: the backlog batches them together. Pairs only for
     * the models that take them (MPNet's and DistilBERT's one token type
     * takes no WordPiece pair). */
    for (size_t i = 0; i < N_STREAM; i++) {
        char id[32];
        snprintf(id, sizeof(id), "stream-%zu", i);
        int m = (int)(i % M_MLP);
        c = cases[n++] = case_new(id, m, i % 2 ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK);
        int pair = i % 5 == 0 && m != M_MPNET && m != M_DISTIL;
        add_rand_row(c, 1 + tu_rand64() % 90, pair ? "and a second segment" : NULL);
    }
    assert_true(n <= MAX_CASES);

    /* The backlog is in Kafka before the worker starts. */
    produce_all("text.jobs", cases, n);
    int mport = h_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", mport);
    const char *cfg = write_config("text", "\"text.jobs\"", NULL, listen);
    pid_t w = start_worker(cfg, "text");
    run_cases("text", "text.jobs", cases, n, ans);

    /* The "done when": job a's embedding matches PyTorch. */
    if (torch) {
        struct wire_result r;
        char err[256];
        assert_int_equal(wire_decode_result(ans[0].body, ans[0].len, &r, err, sizeof(err)), 0);
        check_torch(cases[0]->rows[0], r.output);
        wire_result_fini(&r);
    }

    /* Tokens counted in the metrics: every row's own tokens; the padding
     * ratio a fraction. */
    long long tokens = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < cases[i]->n_rows; k++) tokens += (long long)cases[i]->rows[k]->len;
    char *body = get_metrics(mport);
    assert_non_null(body);
    double got = metric(body, "kinfer_tokens_total");
    double ratio = metric(body, "kinfer_padding_ratio");
    printf("test_text_jobs: %zu jobs, %lld tokens, padding ratio %.3f\n", n, tokens, ratio);
    if (got != (double)tokens) fail_msg("kinfer_tokens_total %g, the jobs had %lld", got, tokens);
    assert_true(ratio >= 0 && ratio < 1);
    assert_true(metric(body, "kinfer_padded_tokens_total") >= got);
    free(body);

    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    assert_int_equal(h_committed_sum(brokers, "g-text", "text.jobs", PARTS), (long long)n);
    for (size_t i = 0; i < n; i++) {
        free(ans[i].body);
        case_free(cases[i]);
    }
}

/* ---- bad jobs ------------------------------------------------------------------- */

/* A case that must come back invalid_input saying msg1 and msg2. */
static struct tcase *bad_case(const char *id, int model, enum proto_enc enc, const char *msg1,
                              const char *msg2)
{
    struct tcase *c = case_new(id, model, enc);
    c->code = "invalid_input";
    snprintf(c->msg1, sizeof(c->msg1), "%s", msg1);
    snprintf(c->msg2, sizeof(c->msg2), "%s", msg2 ? msg2 : "");
    return c;
}

/* A job body of BIG_TEXT bytes of text ("kafka " repeated), made by hand
 * (wire_encode_job would do, at the cost of copies). */
static void big_body(struct tcase *c)
{
    size_t n = BIG_TEXT, at = 0;
    if (c->enc == PROTO_ENC_JSON) {
        c->raw = malloc(n + 128);
        assert_non_null(c->raw);
        at = (size_t)sprintf((char *)c->raw, "{\"id\":\"%s\",\"text\":\"", c->id);
        for (size_t k = 0; k < n; k++) c->raw[at++] = "kafka "[k % 6];
        at += (size_t)sprintf((char *)c->raw + at, "\"}");
        c->raw_len = at;
        return;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str(&pk, 2);
    msgpack_pack_str_body(&pk, "id", 2);
    msgpack_pack_str(&pk, strlen(c->id));
    msgpack_pack_str_body(&pk, c->id, strlen(c->id));
    msgpack_pack_str(&pk, 4);
    msgpack_pack_str_body(&pk, "text", 4);
    char *t = malloc(n);
    assert_non_null(t);
    for (size_t k = 0; k < n; k++) t[k] = "kafka "[k % 6];
    msgpack_pack_str(&pk, n);
    msgpack_pack_str_body(&pk, t, n);
    free(t);
    c->raw = (unsigned char *)sb.data;
    c->raw_len = sb.size;
}

static void test_invalid_jobs(void **state)
{
    (void)state;
    static struct tcase *cases[96];
    static struct answer ans[96];
    size_t n = 0;
    struct tcase *c;
    char m1[96], m2[96];
    int32_t ids[MAX_IDS], types[MAX_IDS];
    size_t vocab = enc_of(M_EMB)->vocab;

    /* Too long with truncate = false: the count and the limit. */
    {
        char *long_text = rand_text(150), *other = rand_text(90);
        struct row r;
        size_t full;
        ref_tokenize(M_EMB, long_text, strlen(long_text), NULL, 0, &r, &full);
        snprintf(m1, sizeof(m1), "row 1: input is %zu tokens", full);
        snprintf(m2, sizeof(m2), "limit of %d", MAX_TOK);
        c = cases[n++] = bad_case("long-false-js", M_EMB, PROTO_ENC_JSON, m1, m2);
        c->truncate = WIRE_TRUNCATE_FALSE;
        add_rand_row(c, 3, NULL); /* row 0 is fine, row 1 is not */
        case_text(c, long_text, strlen(long_text), NULL, NULL);
        ref_tokenize(M_TOK, long_text, strlen(long_text), other, 0, &r, &full);
        snprintf(m1, sizeof(m1), "row 0: input is %zu tokens", full);
        c = cases[n++] = bad_case("long-false-pair-mp", M_TOK, PROTO_ENC_MSGPACK, m1, m2);
        c->truncate = WIRE_TRUNCATE_FALSE;
        case_text(c, long_text, strlen(long_text), other, NULL);
        size_t len = tokens_of(M_EMB, long_text, NULL, ids, types);
        snprintf(m1, sizeof(m1), "row 0 is %zu tokens", len);
        c = cases[n++] = bad_case("long-false-tokens-js", M_CLS, PROTO_ENC_JSON, m1, m2);
        c->truncate = WIRE_TRUNCATE_FALSE;
        case_tokens(c, ids, types, len);
        free(long_text);
        free(other);
    }

    /* One token over, and far over (a row at max_text_chars: the count
     * is the untruncated one, not a buffer's). */
    {
        snprintf(m2, sizeof(m2), "limit of %d", MAX_TOK);
        char *t = repeat("kafka ", MAX_TOK - 1, NULL);
        snprintf(m1, sizeof(m1), "row 0: input is %d tokens", MAX_TOK + 1);
        c = cases[n++] = bad_case("over-by-one-mp", M_EMB, PROTO_ENC_MSGPACK, m1, m2);
        c->truncate = WIRE_TRUNCATE_FALSE;
        case_str(c, t, NULL);
        size_t len = tokens_of(M_EMB, t, NULL, ids, types);
        snprintf(m1, sizeof(m1), "row 0 is %d tokens", MAX_TOK + 1);
        c = cases[n++] = bad_case("over-by-one-tokens-js", M_EMB, PROTO_ENC_JSON, m1, m2);
        c->truncate = WIRE_TRUNCATE_FALSE;
        case_tokens(c, ids, types, len);
        free(t);
        t = repeat("kafka ", MAX_TEXT_CHARS / 6, NULL);
        struct row r;
        size_t full;
        ref_tokenize(M_EMB, t, strlen(t), NULL, 0, &r, &full);
        snprintf(m1, sizeof(m1), "row 0: input is %zu tokens", full);
        c = cases[n++] = bad_case("far-over-mp", M_EMB, PROTO_ENC_MSGPACK, m1, m2);
        c->truncate = WIRE_TRUNCATE_FALSE;
        case_str(c, t, NULL);
        free(t);
    }

    /* Invalid UTF-8 (MessagePack strings carry any bytes): a stray
     * continuation byte, a lead byte of nothing, an overlong '/', a
     * surrogate, a sequence cut short, in text or in text_pair. */
    static const struct {
        const char *id, *text, *pair, *row;
    } utf8[] = {
        {"utf8-ff", "bad \xff byte", NULL, "row 0"},
        {"utf8-cont", "ok", NULL, NULL},
        {"utf8-overlong", "\xc0\xaf", NULL, "row 0"},
        {"utf8-surrogate", "\xed\xa0\x80", NULL, "row 0"},
        {"utf8-cut", "end \xe2\x82", NULL, "row 0"},
        {"utf8-pair", "fine", "pair \x80", "row 0"},
    };
    for (size_t i = 0; i < sizeof(utf8) / sizeof(utf8[0]); i++) {
        c = cases[n++] = bad_case(utf8[i].id, M_EMB, PROTO_ENC_MSGPACK, "field text",
                                  utf8[i].row ? utf8[i].row : "row 1");
        case_text(c, utf8[i].text, strlen(utf8[i].text), utf8[i].pair, NULL);
        if (!utf8[i].row) case_text(c, "\x80 stray", 7, NULL, NULL);
    }

    /* Empty, or only whitespace (spaces, tabs, line breaks, U+00A0,
     * U+3000), in text or text_pair: nothing to embed, for every
     * tokenizer (WordPiece, byte-level BPE, Unigram), in both encodings,
     * the row named; row 0 is fine. */
    static const struct {
        const char *id;
        int model;
        const char *text, *pair, *field;
    } blank[] = {
        {"blank-empty-wp", M_EMB, "", NULL, "field text: row 1"},
        {"blank-ws-wp", M_TOK, " \t\r\n ", NULL, "field text: row 1"},
        {"blank-nbsp-wp", M_MPNET, "\xc2\xa0\xe3\x80\x80", NULL, "field text: row 1"},
        {"blank-empty-bpe", M_ROB, "", NULL, "field text: row 1"},
        {"blank-ws-bpe", M_ROB, "\xc2\xa0 \xe3\x80\x80\n", NULL, "field text: row 1"},
        {"blank-empty-ug", M_XLMR, "", NULL, "field text: row 1"},
        {"blank-ws-ug", M_XLMR, "\n\n\t \xe2\x80\x83", NULL, "field text: row 1"},
        {"blank-ws-distil", M_DISTIL, "   ", NULL, "field text: row 1"},
        {"blank-pair-empty", M_RERANK, "a query", "", "field text_pair: row 1"},
        {"blank-pair-ws-bpe", M_ROB, "a query", " \t ", "field text_pair: row 1"},
        {"blank-pair-ws-ug", M_XLMR, "a query", "\xe3\x80\x80", "field text_pair: row 1"},
        {"blank-text-with-pair", M_RERANK, "  ", "a passage", "field text: row 1"},
    };
    for (size_t i = 0; i < sizeof(blank) / sizeof(blank[0]); i++) {
        c = cases[n++] = bad_case(blank[i].id, blank[i].model,
                                  i % 2 ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK, blank[i].field,
                                  "is empty or only whitespace");
        case_str(c, "a good book", blank[i].pair ? "a fine pair" : NULL);
        case_str(c, blank[i].text, blank[i].pair);
    }

    /* The wrong kind of input for the model. */
    c = cases[n++] = bad_case("mlp-text-js", M_MLP, PROTO_ENC_JSON, "model mlp takes input",
                              "not text or tokens");
    case_str(c, "a good book", NULL);
    c = cases[n++] = bad_case("mlp-tokens-mp", M_MLP, PROTO_ENC_MSGPACK, "model mlp takes input",
                              NULL);
    size_t len = tokens_of(M_EMB, "a good book", NULL, ids, types);
    case_tokens(c, ids, NULL, len);
    static const float floats[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    c = cases[n++] = bad_case("emb-input-mp", M_EMB, PROTO_ENC_MSGPACK, "text encoder",
                              "send text or tokens");
    c->input = floats;
    c->n_input = 8;
    c = cases[n++] = bad_case("cls-input-js", M_CLS, PROTO_ENC_JSON, "text encoder", NULL);
    c->input = floats;
    c->n_input = 8;

    /* Ids the model does not have. */
    snprintf(m1, sizeof(m1), "id %zu is not in the model's vocabulary", vocab);
    c = cases[n++] = bad_case("vocab-mp", M_EMB, PROTO_ENC_MSGPACK, m1, "row 1");
    case_tokens(c, ids, NULL, len);
    ids[2] = (int32_t)vocab;
    case_tokens(c, ids, NULL, len);
    ids[2] = 2000000000;
    c = cases[n++] = bad_case("vocab-js", M_TOK, PROTO_ENC_JSON, "2000000000", "vocabulary");
    case_tokens(c, ids, NULL, len);
    ids[2] = -1;
    c = cases[n++] = bad_case("negative-js", M_EMB, PROTO_ENC_JSON, "field tokens",
                              "is not an id");
    case_tokens(c, ids, NULL, len);
    len = tokens_of(M_EMB, "a good book", NULL, ids, types);
    types[1] = 2;
    c = cases[n++] = bad_case("type-id-mp", M_EMB, PROTO_ENC_MSGPACK, "field type_ids",
                              "not a type id");
    case_tokens(c, ids, types, len);

    /* Text and tokens together; a pair with pre-tokenized rows is not
     * expressible through wire.c, text and tokens is. */
    for (int e = 0; e < 2; e++) {
        c = cases[n++] = bad_case(e ? "text-and-tokens-js" : "text-and-tokens-mp", M_EMB,
                                  e ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK, "exactly one", NULL);
        case_str(c, "a good book", NULL);
        len = tokens_of(M_EMB, "a good book", NULL, ids, types);
        case_tokens(c, ids, NULL, len);
    }

    /* More padded tokens than one batch holds: 9 rows of 128 > 1024. */
    {
        char *long_text = rand_text(150);
        snprintf(m1, sizeof(m1), "max_batch_tokens %d", BATCH_TOKENS);
        c = cases[n++] = bad_case("over-batch-js", M_EMB, PROTO_ENC_JSON, m1, NULL);
        for (int r = 0; r < 9; r++) case_text(c, long_text, strlen(long_text), NULL, NULL);
        free(long_text);
    }

    /* One character over max_text_chars (characters, not bytes). */
    {
        char *t = repeat("é b ", MAX_TEXT_CHARS / 4, "é");
        snprintf(m1, sizeof(m1), "row 1 is %d characters", MAX_TEXT_CHARS + 1);
        c = cases[n++] = bad_case("max-chars-over-mp", M_EMB, PROTO_ENC_MSGPACK, m1,
                                  "over max_text_chars 65536");
        case_str(c, "ok", NULL);
        case_str(c, t, NULL);
        free(t);
    }

    /* Shapes wire.c never writes, sent as JSON text. */
    static const struct {
        const char *id, *json, *msg;
    } raw[] = {
        {"raw-pair-rows", "\"text\":[\"a\",\"b\"],\"text_pair\":[\"c\"]", "one pair per row"},
        {"raw-pair-alone", "\"text_pair\":\"c\"", "only with text"},
        {"raw-types-alone", "\"text\":\"a\",\"type_ids\":[0,0]", "only with tokens"},
        {"raw-types-shape", "\"tokens\":[[2,9,3],[2,3]],\"type_ids\":[[0,0,0],[0]]", "type_ids"},
        {"raw-empty-text", "\"text\":[]", "empty array"},
        {"raw-empty-row", "\"tokens\":[[2,3],[]]", "row 1 is empty"},
        {"raw-text-number", "\"text\":[\"a\",7]", "row 1 is"},
        {"raw-truncate", "\"text\":\"a\",\"truncate\":\"no\"", "must be a boolean"},
        {"raw-token-real", "\"tokens\":[2,9.5,3]", "not an id"},
        {"raw-blank-escaped", "\"text\":\"\\u3000\\t\\u00a0\"", "row 0 is empty or only whitespace"},
    };
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        c = cases[n++] = bad_case(raw[i].id, M_EMB, PROTO_ENC_JSON, raw[i].msg, NULL);
        char body[256];
        int blen = snprintf(body, sizeof(body), "{\"id\":\"%s\",\"model\":\"emb\",%s}", raw[i].id,
                           raw[i].json);
        c->raw = (unsigned char *)strdup(body);
        c->raw_len = (size_t)blen;
    }

    /* Tokenized, then found expired: answered, its ids freed. */
    c = cases[n++] = bad_case("expired-tok-mp", M_TOK, PROTO_ENC_MSGPACK, "deadline", NULL);
    c->code = "deadline_exceeded";
    c->deadline_ms = 1000;
    case_str(c, "a good book", NULL);
    case_str(c, "never read", NULL);

    /* A good job among them: answered ok. */
    c = cases[n++] = case_new("ok-control", M_EMB, PROTO_ENC_MSGPACK);
    add_rand_row(c, 8, NULL);

    /* 10 MB of text over the default max_payload_bytes: answered through
     * the record key. Each goes alone to a partition of its own, in a
     * topic of its own: librdkafka 2.0.2's mock keeps at most 5 MB per
     * partition, and an append that passes that evicts every older record
     * of the partition and moves its start offset past the new record too
     * (the start is set to the end offset when the last old record goes,
     * before the new one is linked), so the new record is lost as well. A
     * record alone in its partition is kept whatever its size. */
    for (int e = 0; e < 2; e++) {
        c = cases[n++] = bad_case(e ? "big-mp" : "big-js", M_EMB,
                                  e ? PROTO_ENC_MSGPACK : PROTO_ENC_JSON,
                                  "exceeds max_payload_bytes 1048576", "payload of");
        big_body(c);
        c->partition = e;
    }
    size_t n_bad = n - 2;
    produce_all("bad.jobs", cases, n_bad);
    produce_all("big.jobs", cases + n_bad, 2);
    const char *cfg = write_config("bad", "\"bad.jobs\", \"big.jobs\"", NULL, NULL);
    pid_t w = start_worker(cfg, "bad");
    assert_int_equal(wait_answers("bad", cases, n, ans, wait_s()), n);
    char reply[] = "bad.results";
    check_replies(reply, cases, n, ans);
    for (size_t i = 0; i < n; i++)
        check_answer(cases[i], &ans[i], i < n_bad ? "bad.jobs" : "big.jobs");
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    assert_int_equal(h_committed_sum(brokers, "g-bad", "bad.jobs", PARTS), (long long)n_bad);
    assert_int_equal(h_committed_sum(brokers, "g-bad", "big.jobs", PARTS), 2);
    for (size_t i = 0; i < n; i++) {
        free(ans[i].body);
        case_free(cases[i]);
    }
}

/* 10 MB of text with max_payload_bytes raised to 16 MB: decoded, and
 * refused for its characters before any tokenizing. */
static void test_big_text_over_max_text_chars(void **state)
{
    (void)state;
    struct tcase *cases[3];
    struct answer ans[3] = {{0}};
    char m1[96];
    snprintf(m1, sizeof(m1), "row 0 is %zu characters", BIG_TEXT);
    for (int e = 0; e < 2; e++) {
        cases[e] = bad_case(e ? "big2-mp" : "big2-js", M_EMB,
                            e ? PROTO_ENC_MSGPACK : PROTO_ENC_JSON, m1,
                            "over max_text_chars 65536");
        big_body(cases[e]);
        cases[e]->partition = e;
    }
    cases[2] = case_new("big2-ok", M_CLS, PROTO_ENC_JSON);
    cases[2]->partition = 2;
    add_rand_row(cases[2], 10, NULL);
    produce_all("big2.jobs", cases, 3);
    const char *cfg = write_config("big2", "\"big2.jobs\"", "max_payload_bytes = 16777216;", NULL);
    pid_t w = start_worker(cfg, "big2");
    run_cases("big2", "big2.jobs", cases, 3, ans);
    assert_int_equal(h_stop(w, SIGTERM, 30), 0);
    assert_int_equal(h_committed_sum(brokers, "g-big2", "big2.jobs", PARTS), 3);
    for (size_t i = 0; i < 3; i++) {
        free(ans[i].body);
        case_free(cases[i]);
    }
}

/* ---- setup -------------------------------------------------------------------- */

static int load_reference(int m, const char *dir)
{
    char err[512];
    struct model_spec spec;
    memset(&spec, 0, sizeof(spec));
    snprintf(spec.name, sizeof(spec.name), "%s", model_names[m]);
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    model_encoder_spec_defaults(&spec.enc);
    if (m == M_TOK) {
        spec.enc.pooling = MODEL_POOL_NONE;
        spec.enc.normalize = 0;
    }
    if (!(ref_model[m] = model_load(ref_rt, &spec, err, sizeof(err))) ||
        !(ref_ws[m] = model_ws_new_tokens(ref_model[m], 0, 1, MAX_TOK, err, sizeof(err)))) {
        fprintf(stderr, "test_text_jobs: reference %s: %s\n", model_names[m], err);
        return -1;
    }
    return 0;
}

static int setup(void **state)
{
    (void)state;
    char err[512];
    snprintf(emb_dir, sizeof(emb_dir), "%s/emb", h_dir());
    snprintf(cls_dir, sizeof(cls_dir), "%s/cls", h_dir());
    snprintf(mlp_path, sizeof(mlp_path), "%s/mlp.safetensors", h_dir());
    if (model_write_demo_bert(emb_dir, LAYERS, HIDDEN, HEADS, INTER, 0, tu_rand64(), err,
                              sizeof(err)) < 0 ||
        model_write_demo_bert(cls_dir, LAYERS, HIDDEN, HEADS, INTER, N_LABELS, tu_rand64(), err,
                              sizeof(err)) < 0 ||
        model_write_demo(mlp_path, 8, 16, 4, tu_rand64(), err, sizeof(err)) < 0) {
        fprintf(stderr, "test_text_jobs: %s\n", err);
        return -1;
    }
    /* One folder of each other family, each with its own tokenizer
     * (RoBERTa: byte-level BPE, XLM-R: Unigram, MPNet, DistilBERT and NomicBERT:
     * WordPiece), and a one-label BERT cross-encoder (sigmoid scores). */
    static const struct {
        char *dir;
        const char *sub, *kind;
        size_t labels;
    } fam[] = {{rob_dir, "rob", "roberta", 0},          {xlmr_dir, "xlmr", "xlm-roberta", 0},
               {mpnet_dir, "mpnet", "mpnet", 0},        {distil_dir, "distil", "distilbert", 2},
               {rerank_dir, "rerank", "bert", 1},       {nomic_dir, "nomic", "nomic-bert", 0}};
    for (size_t i = 0; i < sizeof(fam) / sizeof(fam[0]); i++) {
        snprintf(fam[i].dir, 300, "%s/%s", h_dir(), fam[i].sub);
        if (model_write_demo_encoder(fam[i].dir, fam[i].kind, LAYERS, HIDDEN, HEADS, INTER,
                                     fam[i].labels, tu_rand64(), err, sizeof(err)) < 0) {
            fprintf(stderr, "test_text_jobs: %s\n", err);
            return -1;
        }
    }
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cpu";
    rc.cpu_threads = 1;
    if (!(ref_rt = model_runtime_new(&rc, err, sizeof(err)))) {
        fprintf(stderr, "test_text_jobs: runtime: %s\n", err);
        return -1;
    }
    if (load_reference(M_EMB, emb_dir) < 0 || load_reference(M_CLS, cls_dir) < 0 ||
        load_reference(M_TOK, emb_dir) < 0 || load_reference(M_ROB, rob_dir) < 0 ||
        load_reference(M_XLMR, xlmr_dir) < 0 || load_reference(M_MPNET, mpnet_dir) < 0 ||
        load_reference(M_DISTIL, distil_dir) < 0 || load_reference(M_RERANK, rerank_dir) < 0 ||
        load_reference(M_NOMIC, nomic_dir) < 0 ||
        !(ref_wp = tokenizer_scratch_new(0)))
        return -1;
    int fams_ok = 1;
    for (int m = M_ROB; m <= M_NOMIC; m++) fams_ok &= enc_of(m)->max_tokens == MAX_TOK;
    if (enc_of(M_EMB)->max_tokens != MAX_TOK || enc_of(M_CLS)->n_labels != N_LABELS ||
        enc_of(M_EMB)->pooling != MODEL_POOL_MEAN || !enc_of(M_EMB)->normalize || !fams_ok ||
        strcmp(tokenizer_kind_name(enc_of(M_ROB)->tokenizer), "BPE") != 0 ||
        strcmp(tokenizer_kind_name(enc_of(M_XLMR)->tokenizer), "Unigram") != 0 ||
        enc_of(M_RERANK)->n_labels != 1 || enc_of(M_RERANK)->sigmoid != MODEL_SCORES_SIGMOID) {
        fprintf(stderr, "test_text_jobs: the demo folders are not what this test expects\n");
        return -1;
    }
    /* tests/torch_encoder.py, next to this file. */
    const char *slash = strrchr(__FILE__, '/');
    snprintf(torch_script, sizeof(torch_script), "%.*storch_encoder.py",
             slash ? (int)(slash - __FILE__ + 1) : 0, __FILE__);
    if (h_start_broker(kinfer_bin(), "text.jobs,text.results,text.dlq,bad.jobs,big.jobs,"
                                     "bad.results,bad.dlq,big2.jobs,big2.results,big2.dlq",
                       PARTS, brokers, sizeof(brokers)) < 0)
        return -1;
    if (h_start_redis(&redis_port) < 0) return -1;
    fprintf(stderr, "test_text_jobs: broker %s, redis port %d, logs in %s\n", brokers, redis_port,
            h_dir());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    h_kill_all();
    for (int m = 0; m < M_MLP; m++) {
        model_ws_destroy(ref_ws[m]);
        model_destroy(ref_model[m]);
    }
    model_runtime_destroy(ref_rt);
    tokenizer_scratch_destroy(ref_wp);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_results),
        cmocka_unit_test(test_invalid_jobs),
        cmocka_unit_test(test_big_text_over_max_text_chars),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_admission.c - the intake's admission (worker/intake.h,
 * intake_admit) without Kafka: records given as bytes go through decode,
 * routing, tokenizing and the deadline, and each lands where it should,
 * checked there: queued in the batcher with its rows and token ids (the
 * model's own tokenizer's), answered at once in the sink's queue with the
 * error code and message, or dead-lettered with its bytes. Every record's
 * offset is tracked. Cases are a table.
 *
 * Models: a demo BERT folder ("emb", tiny, written here), a demo MLP
 * ("mlp", 8 -> 4), and demo RoBERTa ("rob", byte-level BPE, one token
 * type) and MPNet ("mpn", WordPiece, one token type) folders, on the CPU
 * backend. Single-threaded; the folder lives in
 * a temporary directory removed at the end. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../batching/batcher.h"
#include "../gpu/model.h"
#include "../telemetry/stats.h"
#include "../text/tokenizer.h"
#include "../config/config.h"
#include "../worker/intake.h"
#include "../batching/job.h"
#include "../worker/jobq.h"
#include "../worker/offsets.h"
#include "testutil.h"

#define TOPIC "adm.jobs"
#define MAX_TOKENS 64
#define N_MODELS 4

static char dir[64];

/* Everything admission needs, made once. */
struct fx {
    struct kcfg *cfg;
    struct model_runtime *rt;
    struct model *models[N_MODELS]; /* emb, mlp, rob, mpn: the config's order */
    struct batcher *batcher;
    struct jobq sink, done;
    struct offsets *offsets;
    struct stats *stats;
    struct worker_opts opts;
    atomic_int fatal;
    struct intake *in;
};

static struct fx F;

/* ---- the cases ----------------------------------------------------------- */

struct acase {
    const char *what;
    const char *value;          /* the record's value; NULL: value_hex */
    const char *key;            /* NULL: none */
    const char *content_type;   /* NULL: none (the codec sniffs) */
    enum intake_admitted want;
    int model_idx;              /* queued: the model it routes to */
    size_t rows;                /* queued: rows */
    const char *text[2];        /* queued, encoders: each row's text, tokenized as the job was */
    const char *pair;           /* queued, encoders: the first row's pair */
    enum proto_err err;         /* answered: the code */
    const char *msg;            /* answered or dead: a substring of the message */
    const char *id;             /* the job's id, when it has one */
    const char *answer;         /* dead: a substring of the error result also
                                   published under the key (NULL: none) */
};

static const struct acase cases[] = {
    {"text to the encoder", "{\"id\": \"a\", \"model\": \"emb\", \"text\": [\"hello world\"]}",
     NULL, "application/json", INTAKE_QUEUED, 0, 1, {"hello world"}, .id = "a"},
    {"two rows and the default model", "{\"id\": \"b\", \"text\": [\"the movie\", \"ok\"]}", NULL,
     NULL, INTAKE_QUEUED, 0, 2, {"the movie", "ok"}, .id = "b"},
    {"a pair", "{\"id\": \"c\", \"text\": [\"kafka\"], \"text_pair\": [\"and redis\"]}", NULL,
     NULL, INTAKE_QUEUED, 0, 1, {"kafka"}, "and redis", .id = "c"},
    {"a long text truncated",
     "{\"id\": \"d\", \"text\": [\"a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e "
     "f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p\"]}",
     NULL, NULL, INTAKE_QUEUED, 0, 1,
     {"a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p q r s "
      "t u v w x y z a b c d e f g h i j k l m n o p"},
     .id = "d"},
    {"floats to the mlp",
     "{\"id\": \"e\", \"model\": \"mlp\", \"input\": [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, "
     "7, 8]}",
     NULL, NULL, INTAKE_QUEUED, 1, 2, .id = "e"},
    {"the id from the key", "{\"text\": [\"ok\"]}", "key-7", NULL, INTAKE_QUEUED, 0, 1, {"ok"},
     .id = "key-7"},
    {"an unknown model", "{\"id\": \"f\", \"model\": \"nope\", \"text\": [\"x\"]}", NULL, NULL,
     INTAKE_ANSWERED, .err = PROTO_ERR_UNKNOWN_MODEL, .msg = "no model named 'nope'", .id = "f"},
    {"text to the mlp", "{\"id\": \"g\", \"model\": \"mlp\", \"text\": [\"x\"]}", NULL, NULL,
     INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT,
     .msg = "model mlp takes input (float32 rows), not text or tokens", .id = "g"},
    {"floats to the encoder", "{\"id\": \"h\", \"input\": [1, 2, 3, 4, 5, 6, 7, 8]}", NULL, NULL,
     INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT,
     .msg = "model emb is a text encoder: send text or tokens", .id = "h"},
    {"a row of the wrong width", "{\"id\": \"i\", \"model\": \"mlp\", \"input\": [1, 2, 3]}", NULL,
     NULL, INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT,
     .msg = "3 values is not a multiple of the model's input width 8", .id = "i"},
    {"too long, truncate false",
     "{\"id\": \"j\", \"truncate\": false, \"text\": [\"a b c d e f g h i j k l m n o p q r s t u "
     "v w x y z a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n "
     "o p\"]}",
     NULL, NULL, INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT,
     .msg = "over the limit of 64 (truncate is false)", .id = "j"},
    {"a pre-tokenized id outside the vocabulary",
     "{\"id\": \"k\", \"tokens\": [[2, 999999, 3]]}", NULL, NULL, INTAKE_ANSWERED,
     .err = PROTO_ERR_INVALID_INPUT, .msg = "is not in the model's vocabulary", .id = "k"},
    /* Ids past the cut (row 70 ids, the model takes 64) are checked too. */
    {"an id outside the vocabulary past the cut",
     "{\"id\": \"n\", \"tokens\": [[2,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,"
     "5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,99999,"
     "5,5,3]]}",
     NULL, NULL, INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT,
     .msg = "field tokens: row 0 element 66: id 99999 is not in", .id = "n"},
    {"a type id the model lacks past the cut",
     "{\"id\": \"o\", \"tokens\": [[2,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,"
     "5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,"
     "3]], \"type_ids\": [[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"
     ",0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,7,0,0]]}",
     NULL, NULL, INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT,
     .msg = "field type_ids: row 0 element 67: 7 is not a type id", .id = "o"},
    {"a deadline already passed", "{\"id\": \"l\", \"deadline_ms\": 1, \"text\": [\"x\"]}", NULL,
     NULL, INTAKE_ANSWERED, .err = PROTO_ERR_DEADLINE_EXCEEDED,
     .msg = "deadline passed before the job was queued", .id = "l"},
    {"a bad field", "{\"id\": \"m\", \"text\": 7}", NULL, NULL, INTAKE_ANSWERED,
     .err = PROTO_ERR_INVALID_INPUT, .msg = "text", .id = "m"},
    {"empty text", "{\"id\": \"m2\", \"text\": []}", NULL, NULL, INTAKE_ANSWERED,
     .err = PROTO_ERR_INVALID_INPUT, .msg = "text", .id = "m2"},
    {"a bad priority", "{\"id\": \"m3\", \"text\": \"x\", \"priority\": 42}", NULL, NULL,
     INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT, .msg = "priority", .id = "m3"},
    {"not a job", "\x01\x02 garbage", NULL, NULL, INTAKE_DEAD, .msg = ""},
    /* A record that is no job but whose key is a usable id: dead-lettered,
     * and its sender answered under the key. */
    {"truncated JSON with a key", "{\"id\":\"bad-json\",\"text\":\"hello", "bad-json", NULL,
     INTAKE_DEAD, .msg = "json", .id = "bad-json",
     .answer = "{\"id\":\"bad-json\","},
    {"garbage with a key", "\x01\x02 garbage", "k-9", NULL, INTAKE_DEAD, .msg = "not a job",
     .id = "k-9", .answer = "\xa5model\xa3" "emb"},
    {"garbage with a key that is no id", "\x01\x02 garbage", "no id!", NULL, INTAKE_DEAD,
     .msg = "not a job"},
    {"JSON without an id or key", "{\"text\": [\"x\"]}", NULL, NULL, INTAKE_DEAD, .msg = "id"},
    {"a pair to RoBERTa (one token type, pairs all type 0)",
     "{\"id\": \"n\", \"model\": \"rob\", \"text\": [\"the movie\"], \"text_pair\": "
     "[\"was great\"]}",
     NULL, NULL, INTAKE_QUEUED, 2, 1, {"the movie"}, "was great", .id = "n"},
    {"RoBERTa text", "{\"id\": \"o\", \"model\": \"rob\", \"text\": [\"Kafka and Redis.\", "
     "\"ok\"]}",
     NULL, NULL, INTAKE_QUEUED, 2, 2, {"Kafka and Redis.", "ok"}, .id = "o"},
    {"a pair to MPNet (one token type, its tokenizer gives the pair type 1)",
     "{\"id\": \"p\", \"model\": \"mpn\", \"text\": [\"the movie\"], \"text_pair\": "
     "[\"was great\"]}",
     NULL, NULL, INTAKE_ANSWERED, .err = PROTO_ERR_INVALID_INPUT,
     .msg = "model mpn has 1 token type: its tokenizer gives type id 1 to a text_pair, so it "
            "takes none",
     .id = "p"},
    {"MPNet text", "{\"id\": \"q\", \"model\": \"mpn\", \"text\": [\"the movie\"]}", NULL,
     NULL, INTAKE_QUEUED, 3, 1, {"the movie"}, .id = "q"},
};

/* The ids the model's own tokenizer gives row text (and pair), as the
 * intake should have put them in the job. */
static int want_ids(int model_idx, const char *text, const char *pair, int32_t *ids,
                    int32_t *types)
{
    const struct model_encoder_info *e = model_encoder(F.models[model_idx]);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    assert_non_null(s);
    char err[256];
    int n = tokenizer_encode(e->tokenizer, s, text, strlen(text), pair, pair ? strlen(pair) : 0,
                             e->max_tokens, 1, ids, types, 256, NULL, err, sizeof(err));
    tokenizer_scratch_destroy(s);
    if (n < 0) fail_msg("tokenizer_encode: %s", err);
    return n;
}

/* A queued job: its model, rows, and each row's ids and type ids. */
static void check_queued(const struct acase *c, struct job *j)
{
    assert_int_equal(j->model_idx, c->model_idx);
    assert_int_equal(j->rows, c->rows);
    if (c->model_idx == 1) { /* the mlp */
        assert_null(j->ids);
        return;
    }
    assert_non_null(j->offs);
    for (size_t r = 0; r < c->rows; r++) {
        int32_t ids[256], types[256];
        int n = want_ids(c->model_idx, c->text[r], r == 0 ? c->pair : NULL, ids, types);
        size_t b = j->offs[r], len = j->offs[r + 1] - b;
        if (len != (size_t)n) fail_msg("%s: row %zu is %zu tokens, want %d", c->what, r, len, n);
        assert_memory_equal(j->ids + b, ids, len * sizeof(int32_t));
        if (j->type_ids) assert_memory_equal(j->type_ids + b, types, len * sizeof(int32_t));
        assert_true(len <= MAX_TOKENS);
    }
    assert_int_equal(j->n_tokens, j->offs[c->rows]);
}

static void test_cases(void **state)
{
    (void)state;
    size_t n = sizeof(cases) / sizeof(cases[0]);
    for (size_t i = 0; i < n; i++) {
        const struct acase *c = &cases[i];
        struct intake_record r = {
            .topic = TOPIC,
            .partition = (int32_t)i,
            .offset = 100 + (int64_t)i,
            .key = c->key,
            .key_len = c->key ? strlen(c->key) : 0,
            .value = c->value,
            .value_len = strlen(c->value),
            .content_type = c->content_type,
            .timestamp_ms = -1,
        };
        enum intake_admitted got = intake_admit(F.in, &r);
        if (got != c->want) fail_msg("%s: admitted %d, want %d", c->what, got, c->want);
        struct job *j = got == INTAKE_QUEUED ? batcher_purge(F.batcher, TOPIC, (int32_t)i)
                                             : jobq_take(&F.sink, 0);
        if (!j || j->next) fail_msg("%s: not one job where it should be", c->what);
        assert_string_equal(j->topic, TOPIC);
        assert_int_equal(j->partition, (int32_t)i);
        assert_int_equal(j->offset, 100 + (int64_t)i);
        if (c->id) assert_string_equal(j->req.id, c->id);
        if (got == INTAKE_QUEUED) {
            check_queued(c, j);
        } else if (got == INTAKE_ANSWERED) {
            assert_int_equal(j->kind, JOB_RESULT);
            if (j->err != c->err || !strstr(j->errmsg, c->msg))
                fail_msg("%s: error %d \"%s\", want %d with \"%s\"", c->what, j->err, j->errmsg,
                         c->err, c->msg);
            /* a job that names no model is answered under the default's
             * name, as an ok result would be */
            if (!strstr(c->value, "\"model\"")) {
                char *body = strndup((const char *)j->body, j->body_len);
                assert_non_null(body);
                if (!strstr(body, "\"model\":\"emb\""))
                    fail_msg("%s: result %s does not name the default model", c->what, body);
                free(body);
            }
        } else {
            assert_int_equal(j->kind, JOB_DEAD);
            assert_int_equal(j->raw_value_len, strlen(c->value));
            assert_memory_equal(j->raw_value, c->value, j->raw_value_len);
            if (!strstr(j->errmsg, c->msg))
                fail_msg("%s: dead letter says \"%s\", want \"%s\"", c->what, j->errmsg, c->msg);
            if (!c->answer) {
                assert_null(j->body);
            } else {
                if (!j->body) fail_msg("%s: no error result beside the dead letter", c->what);
                char *body = strndup((const char *)j->body, j->body_len);
                assert_non_null(body);
                if (!strstr(body, c->answer) || !strstr(body, "invalid_input"))
                    fail_msg("%s: error result %s, want \"%s\"", c->what, body, c->answer);
                free(body);
            }
        }
        printf("  %-42s %s\n", c->what,
               got == INTAKE_QUEUED ? "queued" : j->errmsg[0] ? j->errmsg : "(answered)");
        job_free(j);
    }
    /* every record's offset is tracked until its job finishes */
    assert_int_equal(offsets_pending_total(F.offsets), n);
    assert_int_equal(atomic_load(&F.fatal), 0);
}

/* A job the worker accepts must be answerable: with the
 * producer able to publish 4096 bytes, a JSON job whose result could pass
 * that (rows x 32 values x 16 bytes, plus the envelope) is answered
 * invalid_input naming message.max.bytes before it runs, and one row
 * fewer is queued. MessagePack (4 bytes a value) takes more rows. */
static void test_result_size(void **state)
{
    (void)state;
    char err[256];
    struct intake_conf ic = {.cfg = F.cfg, .opts = &F.opts, .models = F.models, .n_models = 2,
                             .default_model = 0, .model_override = -1, .batcher = F.batcher,
                             .sink = &F.sink, .offsets = F.offsets, .stats = F.stats,
                             .fatal = &F.fatal, .max_record_bytes = 4096};
    struct intake *in = intake_new_offline(&ic, err, sizeof(err));
    assert_non_null(in);
    static const struct {
        int msgpack;
        size_t rows;
        enum intake_admitted want;
    } tab[] = {
        {0, 6, INTAKE_QUEUED},   {0, 7, INTAKE_ANSWERED},
        {1, 20, INTAKE_QUEUED},  {1, 40, INTAKE_ANSWERED},
    };
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        char body[4096];
        size_t len;
        if (tab[i].msgpack) {
            /* {"id": "s", "text": ["hi", ...]} */
            unsigned char *b = (unsigned char *)body;
            len = 0;
            b[len++] = 0x82;
            b[len++] = 0xa2, b[len++] = 'i', b[len++] = 'd', b[len++] = 0xa1, b[len++] = 's';
            b[len++] = 0xa4;
            memcpy(b + len, "text", 4);
            len += 4;
            b[len++] = 0xdc, b[len++] = 0, b[len++] = (unsigned char)tab[i].rows;
            for (size_t r = 0; r < tab[i].rows; r++)
                b[len++] = 0xa2, b[len++] = 'h', b[len++] = 'i';
        } else {
            len = (size_t)snprintf(body, sizeof(body), "{\"id\": \"s\", \"text\": [");
            for (size_t r = 0; r < tab[i].rows; r++)
                len += (size_t)snprintf(body + len, sizeof(body) - len, "%s\"hi\"", r ? "," : "");
            len += (size_t)snprintf(body + len, sizeof(body) - len, "]}");
        }
        struct intake_record r = {.topic = TOPIC, .partition = 1000 + (int32_t)i, .offset = 1,
                                  .value = body, .value_len = len, .timestamp_ms = -1};
        enum intake_admitted got = intake_admit(in, &r);
        struct job *j = got == INTAKE_QUEUED ? batcher_purge(F.batcher, TOPIC, r.partition)
                                             : jobq_take(&F.sink, 0);
        assert_non_null(j);
        printf("  %s, %zu rows: %s\n", tab[i].msgpack ? "MessagePack" : "JSON", tab[i].rows,
               got == INTAKE_QUEUED ? "queued" : j->errmsg);
        if (got != tab[i].want) fail_msg("row %zu: admitted %d, want %d (%s)", i, got,
                                         tab[i].want, j->errmsg);
        if (got == INTAKE_ANSWERED) {
            assert_int_equal(j->err, PROTO_ERR_INVALID_INPUT);
            if (!strstr(j->errmsg, "message.max.bytes (4096 usable)"))
                fail_msg("message \"%s\" names no limit", j->errmsg);
        }
        job_free(j);
    }
    intake_destroy(in);
}

/* Records the consumer jumped over (an offset reset past
 * records the broker deleted unread) are counted per partition with the
 * latest range: offsets 10, 11, then 60 (48 skipped: 12..59), then 61
 * and a re-read 40 (none). Another partition counts apart. Before, the
 * jump went unseen: no metric, no log, the jobs vanished. */
static void test_skipped_records(void **state)
{
    (void)state;
    static const struct {
        int32_t partition;
        int64_t offset;
    } recs[] = {{2000, 10}, {2000, 11}, {2000, 60}, {2000, 61}, {2000, 40},
                {2001, 5},  {2001, 7}};
    for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++) {
        const char *v = "{\"id\": \"q\", \"model\": \"mlp\", \"input\": [1,2,3]}";
        struct intake_record r = {.topic = TOPIC, .partition = recs[i].partition,
                                  .offset = recs[i].offset, .value = v, .value_len = strlen(v),
                                  .timestamp_ms = -1};
        assert_int_equal(intake_admit(F.in, &r), INTAKE_ANSWERED);
        job_free(jobq_take(&F.sink, 0));
    }
    struct stats_snapshot s;
    assert_int_equal(stats_snapshot(F.stats, 0, &s), 0);
    int seen = 0;
    for (size_t i = 0; i < s.n_skips; i++) {
        const struct stats_skip *k = &s.skips[i];
        printf("  %s [%d]: %llu skipped, latest %lld..%lld\n", k->topic, (int)k->partition,
               (unsigned long long)k->records, (long long)k->last_from, (long long)k->last_to);
        if (k->partition == 2000) {
            assert_int_equal(k->records, 48);
            assert_int_equal(k->last_from, 12);
            assert_int_equal(k->last_to, 59);
            seen |= 1;
        } else if (k->partition == 2001) {
            assert_int_equal(k->records, 1);
            assert_int_equal(k->last_from, 6);
            seen |= 2;
        }
    }
    stats_snapshot_fini(&s);
    if (seen != 3) fail_msg("skips not counted per partition (seen %d)", seen);
}

/* ---- fixture ------------------------------------------------------------------ */

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static int setup(void **state)
{
    (void)state;
    char err[512], emb[128], mlp[128], rob[128], mpn[128], cfgp[128];
    snprintf(dir, sizeof(dir), "/tmp/kinfer-adm-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(emb, sizeof(emb), "%s/emb", dir);
    snprintf(mlp, sizeof(mlp), "%s/mlp.safetensors", dir);
    snprintf(rob, sizeof(rob), "%s/rob", dir);
    snprintf(mpn, sizeof(mpn), "%s/mpn", dir);
    snprintf(cfgp, sizeof(cfgp), "%s/adm.cfg", dir);
    if (model_write_demo_bert(emb, 2, 32, 4, 64, 0, tu_rand64(), err, sizeof(err)) < 0 ||
        model_write_demo(mlp, 8, 16, 4, tu_rand64(), err, sizeof(err)) < 0 ||
        model_write_demo_encoder(rob, "roberta", 1, 16, 2, 32, 0, tu_rand64(), err,
                                 sizeof(err)) < 0 ||
        model_write_demo_encoder(mpn, "mpnet", 1, 16, 2, 32, 0, tu_rand64(), err,
                                 sizeof(err)) < 0) {
        fprintf(stderr, "test_admission: %s\n", err);
        return -1;
    }
    FILE *f = fopen(cfgp, "w");
    if (!f) return -1;
    fprintf(f,
            "kafka = { brokers = \"127.0.0.1:1\"; group = \"g\"; topics = [ \"" TOPIC "\" ];\n"
            "  reply_topic = \"adm.results\"; dlq_topic = \"adm.dlq\"; };\n"
            "batching = { max_batch_rows = 16; max_batch_tokens = 4096; };\n"
            "models = ( { name = \"emb\"; path = \"emb\"; encoder = { max_tokens = %d; }; },\n"
            "  { name = \"mlp\"; path = \"mlp.safetensors\";\n"
            "    layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
            "               { op = \"relu\"; },\n"
            "               { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); },\n"
            "  { name = \"rob\"; path = \"rob\"; }, { name = \"mpn\"; path = \"mpn\"; } );\n"
            "worker = { backend = \"cpu\"; };\n",
            MAX_TOKENS);
    fclose(f);
    if (!(F.cfg = cfg_load(cfgp, NULL, 0, err, sizeof(err)))) {
        fprintf(stderr, "test_admission: %s\n", err);
        return -1;
    }
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cpu";
    rc.cpu_threads = 1;
    if (!(F.rt = model_runtime_new(&rc, err, sizeof(err)))) {
        fprintf(stderr, "test_admission: runtime: %s\n", err);
        return -1;
    }
    for (size_t i = 0; i < N_MODELS; i++) {
        if (!(F.models[i] = model_load(F.rt, &F.cfg->models[i], err, sizeof(err)))) {
            fprintf(stderr, "test_admission: %s\n", err);
            return -1;
        }
    }
    struct batcher_conf bc = {.n_models = N_MODELS, .max_batch_rows = 16, .max_wait_ms = 5,
                              .max_batch_tokens = 4096};
    F.batcher = batcher_new(&bc);
    jobq_init(&F.sink);
    jobq_init(&F.done);
    F.offsets = offsets_new(&F.done);
    F.stats = stats_new();
    F.opts.priority = -1;
    atomic_init(&F.fatal, 0);
    if (!F.batcher || !F.offsets || !F.stats) return -1;
    struct intake_conf ic = {.cfg = F.cfg, .opts = &F.opts, .models = F.models, .n_models = N_MODELS,
                             .default_model = 0, .model_override = -1, .batcher = F.batcher,
                             .sink = &F.sink, .offsets = F.offsets, .stats = F.stats,
                             .fatal = &F.fatal, .max_record_bytes = 1 << 20};
    if (!(F.in = intake_new_offline(&ic, err, sizeof(err)))) {
        fprintf(stderr, "test_admission: intake: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    intake_destroy(F.in);
    offsets_destroy(F.offsets);
    job_free_list(jobq_take(&F.done, 0));
    jobq_fini(&F.done);
    jobq_fini(&F.sink);
    batcher_destroy(F.batcher);
    stats_destroy(F.stats);
    for (size_t i = 0; i < N_MODELS; i++) model_destroy(F.models[i]);
    model_runtime_destroy(F.rt);
    cfg_destroy(F.cfg);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_result_size),
        cmocka_unit_test(test_skipped_records),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

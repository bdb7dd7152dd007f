/* test_codec.c - tests of codecs/codec_*.c and codecs/mpscan.c against the
 * wire contract (docs/protocol.md) and the hostile-input rules
 * (docs/reliability.md, rule 9): round trips in both encodings with fresh random
 * data, every error code, and tables of malformed and hostile records,
 * each of which must end as CODEC_DEAD or an invalid_input job, never a
 * crash. Replay a failure with the printed KINFER_TEST_SEED. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <msgpack.h>

#include "../codecs/codec.h"
#include "../codecs/mpscan.h"
#include "../base/utf8.h"
#include "../codecs/wire.h"
#include "tablebody.h"
#include "testutil.h"

static const struct codec_limits LIM = {
    .max_payload_bytes = 1 << 20,
    .max_input_floats = 1 << 16,
    .max_depth = 16,
};

static const char ID_CHARS[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/-";

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

/* Fails the test with both strings shown when needle is not in hay. */
static void assert_contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle)) fail_msg("\"%s\" does not contain \"%s\"", hay ? hay : "(null)", needle);
}

/* A uniform random integer in [0, n). */
static size_t rnd(size_t n)
{
    return (size_t)(tu_rand64() % n);
}

/* A random valid id of 1..max bytes into buf (max+1 bytes). */
static void rand_id(char *buf, size_t max)
{
    size_t n = 1 + rnd(max);
    for (size_t i = 0; i < n; i++) buf[i] = ID_CHARS[rnd(sizeof(ID_CHARS) - 1)];
    buf[n] = '\0';
}

/* What the tests decode into and encode from: the codec's request, and
 * the fields an executor fills before a result is encoded (the pipeline's
 * own record, batching/job.h, is not the codec's business). The result's
 * error is the request's: the tests set req.err to encode an error. */
struct tjob {
    struct codec_request req;
    const char *model_name; /* NULL: req.model */
    float *output;
    size_t out_rows, out_width;
    double queued_ms, infer_ms;
    size_t batch_rows;
    char topic[PROTO_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t record_ts_ms;
    unsigned char *body;
    size_t body_len;
};

static struct tjob *tjob_new(void)
{
    struct tjob *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->req.priority = -1;
    return t;
}

static void tjob_free(struct tjob *t)
{
    if (!t) return;
    codec_request_fini(&t->req);
    free(t->output);
    free(t->body);
    free(t);
}

/* Encodes t's result into t->body (replacing it), total_ms from its
 * record timestamp to now_ms as the worker computes it. */
static int tjob_encode(struct tjob *t, int64_t now_ms)
{
    struct codec_result r = {
        .id = t->req.id, .model = t->model_name ? t->model_name : t->req.model,
        .enc = t->req.enc, .err = t->req.err, .errmsg = t->req.errmsg,
        .output = t->output, .out_rows = t->out_rows, .out_width = t->out_width,
        .meta = t->req.meta, .meta_len = t->req.meta_len, .queued_ms = t->queued_ms,
        .infer_ms = t->infer_ms,
        .total_ms = t->record_ts_ms > 0 && now_ms > t->record_ts_ms
                        ? (double)(now_ms - t->record_ts_ms) : 0.0,
        .batch_rows = t->batch_rows, .topic = t->topic, .partition = t->partition,
        .offset = t->offset};
    free(t->body);
    t->body = NULL;
    t->body_len = 0;
    return codec_encode_result(&r, &t->body, &t->body_len);
}

/* One decode: a fresh job, its outcome and the dead-letter reason. */
struct dres {
    enum codec_rc rc;
    struct tjob *job;
    char err[256];
};

/* Decodes value with a key (may be NULL) and content type (may be NULL). */
static struct dres decode(const void *v, size_t len, const char *key, const char *ct,
                          int64_t ts, const struct codec_limits *lim)
{
    struct dres r;
    r.job = tjob_new();
    assert_non_null(r.job);
    r.rc = codec_decode_job(v, len, key, key ? strlen(key) : 0, ct, ts, lim, &r.job->req, r.err,
                            sizeof(r.err));
    /* Invariants of every outcome. */
    if (r.rc == CODEC_DEAD) {
        assert_true(r.err[0] != '\0');
        assert_null(r.job->req.input);
        assert_null(r.job->req.meta);
    } else {
        assert_int_equal(r.rc, CODEC_JOB);
        assert_true(proto_id_valid(r.job->req.id, strlen(r.job->req.id)));
        if (r.job->req.err == PROTO_OK) {
            assert_non_null(r.job->req.input);
            assert_true(r.job->req.n_input > 0);
            for (size_t i = 0; i < r.job->req.n_input; i++) assert_true(isfinite(r.job->req.input[i]));
        } else {
            assert_true(r.job->req.errmsg[0] != '\0');
        }
    }
    return r;
}

/* Checks an outcome: DEAD with errsub in the reason, or a job with error
 * code `code` and errsub in its message. */
static void expect(const struct dres *r, enum codec_rc rc, enum proto_err code, const char *errsub)
{
    if (r->rc != rc)
        fail_msg("rc %d, expected %d (err \"%s\", errmsg \"%s\")", r->rc, rc, r->err,
                 r->job->req.errmsg);
    if (rc == CODEC_DEAD) {
        if (errsub) assert_contains(r->err, errsub);
        return;
    }
    if (r->job->req.err != code)
        fail_msg("err %s (\"%s\"), expected %s", proto_err_name(r->job->req.err), r->job->req.errmsg,
                 proto_err_name(code));
    if (errsub) assert_contains(r->job->req.errmsg, errsub);
}

/* Asserts the JSON object's keys are exactly `keys`, in that order. */
static void assert_js_keys(json_t *o, const char *const *keys, size_t n)
{
    assert_true(json_is_object(o));
    assert_int_equal(json_object_size(o), n);
    size_t i = 0;
    for (void *it = json_object_iter(o); it; it = json_object_iter_next(o, it), i++)
        assert_string_equal(json_object_iter_key(it), keys[i]);
    assert_int_equal(i, n);
}

/* Unpacks a whole result body (one object, nothing after it). */
static void unpack_all(msgpack_unpacked *up, const void *p, size_t len)
{
    size_t off = 0;
    msgpack_unpacked_init(up);
    assert_int_equal(msgpack_unpack_next(up, p, len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, len);
}

/* Fills the executor side of a job with random output and timings. */
static void fake_run(struct tjob *j, size_t rows, size_t width)
{
    j->out_rows = rows;
    j->out_width = width;
    j->output = malloc(rows * width * sizeof(float));
    assert_non_null(j->output);
    for (size_t i = 0; i < rows * width; i++) j->output[i] = tu_randf(-1e6f, 1e6f);
    if (rows * width > 2) {
        j->output[0] = FLT_MAX;     /* extremes must survive too */
        j->output[1] = 1e-45f;      /* smallest denormal */
        j->output[2] = -0.0f;
    }
    j->queued_ms = tu_randf(0, 1000);
    j->infer_ms = tu_randf(0, 1000);
    j->batch_rows = 1 + rnd(512);
    snprintf(j->topic, sizeof(j->topic), "jobs.t%u", (unsigned)rnd(1000));
    j->partition = (int32_t)rnd(64);
    j->offset = (int64_t)(tu_rand64() >> 2);
}

/* ------------------------------------------------------------------ */
/* mpscan                                                              */
/* ------------------------------------------------------------------ */

/* One object of every MessagePack format, wrapped in an array of 42. */
static const char ALL_FORMATS[] =
    "dc 00 2a"
    " 05 7f e0 ff"                        /* positive and negative fixint */
    " c0 c2 c3"                           /* nil false true */
    " ca 3f c0 00 00"                     /* float32 1.5 */
    " cb 3f f8 00 00 00 00 00 00"         /* float64 1.5 */
    " cc ff cd ff ff ce ff ff ff ff cf ff ff ff ff ff ff ff ff"
    " d0 80 d1 80 00 d2 80 00 00 00 d3 80 00 00 00 00 00 00 00"
    " a0 a3 61 62 63"                     /* fixstr "" "abc" */
    " d9 01 61 da 00 01 61 db 00 00 00 01 61"
    " c4 02 01 02 c5 00 01 01 c6 00 00 00 01 01"
    " 90 92 01 02 dc 00 01 01 dd 00 00 00 01 01"
    " 80 81 01 02 de 00 01 01 02 df 00 00 00 01 01 02"
    " d4 01 aa d5 01 aa bb d6 01 00 00 00 00 d7 01 00 00 00 00 00 00 00 00"
    " d8 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
    " c7 02 05 01 02 c8 00 01 05 01 c9 00 00 00 01 05 01"
    " c7 00 05";                          /* empty ext8 */

/* Every format is accepted, msgpack-c agrees the buffer is one complete
 * object, and every strict prefix of it is rejected as incomplete. */
static void test_mpscan_all_formats(void **state)
{
    (void)state;
    unsigned char buf[512];
    char err[160];
    size_t n = unhex(ALL_FORMATS, buf, sizeof(buf));
    assert_int_equal(mpscan_check(buf, n, 4, err, sizeof(err)), 0);

    msgpack_unpacked up;
    unpack_all(&up, buf, n);
    assert_int_equal(up.data.type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(up.data.via.array.size, 42);
    msgpack_unpacked_destroy(&up);

    for (size_t k = 0; k < n; k++) {
        err[0] = '\0';
        if (mpscan_check(buf, k, 4, err, sizeof(err)) != -1) fail_msg("prefix %zu accepted", k);
        assert_true(err[0] != '\0');
    }
}

/* Hand-made buffers: hostile counts and lengths, truncation, trailing
 * bytes, 0xc1, and the cumulative element budget. */
static void test_mpscan_table(void **state)
{
    (void)state;
    static const struct {
        const char *hex;
        int depth;
        int rc;
        const char *errsub;
    } cases[] = {
        {"c0", 4, 0, NULL},
        {"", 4, -1, "empty"},
        {"c1", 4, -1, "invalid byte 0xc1"},
        {"91 c1", 4, -1, "invalid byte 0xc1 at byte 1"},
        {"df 10 00 00 00", 4, -1, "exceeds"},           /* map32, 2^28 entries */
        {"dd ff ff ff ff", 4, -1, "exceeds"},           /* array32, 2^32-1 */
        {"de ff ff 01 02", 4, -1, "exceeds"},
        {"db ff ff ff ff 61", 4, -1, "str of 4294967295 bytes"},
        {"c6 00 01 00 00 00", 4, -1, "bin of 65536 bytes"},
        {"c9 ff ff ff ff 01", 4, -1, "ext of"},
        {"d8 01 00", 4, -1, "ext of 16 bytes"},
        {"a3 61 62", 4, -1, "str of 3 bytes"},
        {"cb 00 00", 4, -1, "truncated"},
        {"cd 01", 4, -1, "truncated"},
        {"c7 02", 4, -1, "truncated"},
        {"c0 c0", 4, -1, "1 trailing bytes"},
        {"92 01 02 ff ff", 4, -1, "2 trailing bytes"},
        {"81 c0", 4, -1, "exceeds"},                    /* an entry needs 2 bytes */
        {"82 01 02 03", 4, -1, "exceeds"},
        {"82 01 02 03 04", 4, 0, NULL},
        {"9f", 4, -1, "exceeds"},
        {"90", 4, 0, NULL},
        {"80", 4, 0, NULL},
        {"c7 02 05 01 02", 4, 0, NULL},
        {"c7 03 05 01 02", 4, -1, "exceeds"},
        /* inner array fits the bytes left on its own (2 <= 2), but not
           together with the one element the outer array still owes */
        {"92 dc 00 02 01 01", 4, -1, "array of 2 entries at byte 1"},
        {"92 dc 00 02 01 01 01", 4, 0, NULL},
        {"91 91 91 90", 4, 0, NULL},
        {"91 91 91 91 90", 4, -1, "nesting deeper than 4"},
        {"91 81 01 80", 3, 0, NULL},
        {"91 81 01 80", 2, -1, "nesting deeper than 2 at byte 3"},
        {"90", 0, -1, "nesting deeper than 0"},
        {"01", 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned char buf[64];
        char err[160] = "";
        size_t n = unhex(cases[i].hex, buf, sizeof(buf));
        int rc = mpscan_check(n ? buf : NULL, n, cases[i].depth, err, sizeof(err));
        if (rc != cases[i].rc) fail_msg("case %zu (%s): rc %d, err \"%s\"", i, cases[i].hex, rc, err);
        if (cases[i].errsub) assert_contains(err, cases[i].errsub);
        /* errstr is optional */
        assert_int_equal(mpscan_check(n ? buf : NULL, n, cases[i].depth, NULL, 0), cases[i].rc);
    }
}

/* 32 x `dc ff ff`: every level declares 65535 elements in a 96-byte buffer. */
static void test_mpscan_array16_chain(void **state)
{
    (void)state;
    unsigned char buf[96];
    char err[160];
    for (int i = 0; i < 32; i++) {
        buf[3 * i] = 0xdc;
        buf[3 * i + 1] = 0xff;
        buf[3 * i + 2] = 0xff;
    }
    assert_int_equal(mpscan_check(buf, sizeof(buf), 64, err, sizeof(err)), -1);
    assert_contains(err, "array of 65535 entries at byte 0");
}

/* Depth limits are exact for arrays and maps, and a limit above the cap
 * is clamped to MPSCAN_DEPTH_CAP. */
static void test_mpscan_depth(void **state)
{
    (void)state;
    static const struct {
        int nest;  /* containers nested */
        int limit;
        int rc;
    } cases[] = {
        {16, 16, 0}, {17, 16, -1}, {40, 16, -1}, {1, 1, 0}, {2, 1, -1},
        {MPSCAN_DEPTH_CAP, 100000, 0}, {MPSCAN_DEPTH_CAP + 1, 100000, -1},
    };
    unsigned char buf[2 * (MPSCAN_DEPTH_CAP + 1) + 1];
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int use_map = 0; use_map < 2; use_map++) {
            size_t n = 0;
            for (int i = 0; i < cases[c].nest - 1; i++) {
                if (use_map) {
                    buf[n++] = 0x81; /* {0: ...} */
                    buf[n++] = 0x00;
                } else {
                    buf[n++] = 0x91; /* [...] */
                }
            }
            buf[n++] = use_map ? 0x80 : 0x90;
            char err[160] = "";
            int rc = mpscan_check(buf, n, cases[c].limit, err, sizeof(err));
            if (rc != cases[c].rc)
                fail_msg("nest %d limit %d map %d: rc %d (%s)", cases[c].nest, cases[c].limit,
                         use_map, rc, err);
            if (rc) assert_contains(err, "nesting deeper than");
        }
    }
}

/* Whatever mpscan accepts, msgpack-c unpacks completely: random mutations
 * of a valid buffer, and random short byte strings. */
static void test_mpscan_agrees_with_unpacker(void **state)
{
    (void)state;
    unsigned char base[512], buf[512];
    size_t n = unhex(ALL_FORMATS, base, sizeof(base));
    int accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        size_t len;
        if (iter % 2) {
            memcpy(buf, base, n);
            len = n;
            for (int k = 1 + (int)rnd(3); k > 0; k--) buf[rnd(n)] = (unsigned char)tu_rand64();
            if (rnd(4) == 0) len = rnd(n + 1);
        } else {
            len = rnd(12);
            for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)tu_rand64();
        }
        if (mpscan_check(buf, len, 16, NULL, 0) != 0) continue;
        accepted++;
        msgpack_unpacked up;
        size_t off = 0;
        msgpack_unpacked_init(&up);
        msgpack_unpack_return r = msgpack_unpack_next(&up, (const char *)buf, len, &off);
        if (r != MSGPACK_UNPACK_SUCCESS || off != len)
            fail_msg("iter %d: mpscan accepted %zu bytes, unpack rc %d off %zu", iter, len,
                     (int)r, off);
        msgpack_unpacked_destroy(&up);
    }
    assert_true(accepted > 100); /* the property was exercised */
}

/* ------------------------------------------------------------------ */
/* Round trips                                                         */
/* ------------------------------------------------------------------ */

/* A MessagePack job with every field and random values: decoding copies
 * each one out exactly; the result parses back with every field right,
 * output bit-exact and meta equal to what was sent. */
static void test_roundtrip_msgpack(void **state)
{
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        char id[PROTO_ID_MAX + 1], model[32];
        rand_id(id, PROTO_ID_MAX);
        snprintf(model, sizeof(model), "model-%u", (unsigned)rnd(100000));
        size_t n = 1 + rnd(300);
        float *in = malloc(n * sizeof(float));
        unsigned char *inle = malloc(4 * n);
        assert_non_null(in);
        assert_non_null(inle);
        for (size_t i = 0; i < n; i++) {
            in[i] = tu_randf(-1e4f, 1e4f);
            uint32_t u;
            memcpy(&u, &in[i], 4);
            for (int b = 0; b < 4; b++) inle[4 * i + b] = (unsigned char)(u >> (8 * b));
        }
        int64_t ts = 1700000000000 + (int64_t)rnd(100000000);
        int64_t deadline = ts + 1 + (int64_t)rnd(10000);
        int64_t timeout = (int64_t)rnd(10000);
        int prio = (int)rnd(10);
        double mf = (double)tu_randf(-1, 1) / 3.0;
        char trace[24];
        rand_id(trace, 20);

        /* meta, packed on its own first: the job must store these bytes */
        msgpack_sbuffer msb;
        msgpack_sbuffer_init(&msb);
        msgpack_packer mpk;
        msgpack_packer_init(&mpk, &msb, msgpack_sbuffer_write);
        msgpack_pack_map(&mpk, 4);
        msgpack_pack_str_with_body(&mpk, "trace", 5);
        msgpack_pack_str_with_body(&mpk, trace, strlen(trace));
        msgpack_pack_str_with_body(&mpk, "f", 1);
        msgpack_pack_double(&mpk, mf);
        msgpack_pack_str_with_body(&mpk, "list", 4);
        msgpack_pack_array(&mpk, 5);
        msgpack_pack_int64(&mpk, -(int64_t)rnd(1000000));
        msgpack_pack_nil(&mpk);
        msgpack_pack_true(&mpk);
        msgpack_pack_float(&mpk, 1.25f);
        msgpack_pack_bin_with_body(&mpk, "\x01\x02", 2);
        msgpack_pack_str_with_body(&mpk, "x", 1);
        msgpack_pack_map(&mpk, 0);

        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 9);
        msgpack_pack_str_with_body(&pk, "id", 2);
        msgpack_pack_str_with_body(&pk, id, strlen(id));
        msgpack_pack_str_with_body(&pk, "model", 5);
        msgpack_pack_str_with_body(&pk, model, strlen(model));
        msgpack_pack_str_with_body(&pk, "unknown_field", 13);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_nil(&pk);
        msgpack_pack_str_with_body(&pk, "input", 5);
        msgpack_pack_bin_with_body(&pk, inle, 4 * n);
        msgpack_pack_str_with_body(&pk, "deadline_ms", 11);
        msgpack_pack_int64(&pk, deadline);
        msgpack_pack_str_with_body(&pk, "timeout_ms", 10);
        msgpack_pack_int64(&pk, timeout);
        msgpack_pack_str_with_body(&pk, "priority", 8);
        msgpack_pack_int(&pk, prio);
        msgpack_pack_int(&pk, 7); /* a non-string key: ignored */
        msgpack_pack_int(&pk, 7);
        msgpack_pack_str_with_body(&pk, "meta", 4);
        msgpack_sbuffer_write(&sb, msb.data, msb.size);

        struct dres r = decode(sb.data, sb.size, "other-key", "application/msgpack", ts, &LIM);
        expect(&r, CODEC_JOB, PROTO_OK, NULL);
        struct tjob *j = r.job;
        assert_string_equal(j->req.id, id);
        assert_string_equal(j->req.model, model);
        assert_int_equal(j->req.enc, PROTO_ENC_MSGPACK);
        assert_int_equal(j->req.n_input, n);
        assert_memory_equal(j->req.input, in, n * sizeof(float));
        assert_int_equal(j->req.deadline_ms, ts + timeout < deadline ? ts + timeout : deadline);
        assert_int_equal(j->req.priority, prio);
        assert_int_equal(j->req.meta_len, msb.size);
        assert_memory_equal(j->req.meta, msb.data, msb.size);
        assert_string_equal(r.err, "");

        /* the result */
        size_t rows = 1 + rnd(8), width = 1 + rnd(64);
        fake_run(j, rows, width);
        j->record_ts_ms = ts;
        j->model_name = "served-model";
        int64_t now = ts + (int64_t)rnd(5000);
        assert_int_equal(tjob_encode(j, now), 0);
        assert_non_null(j->body);

        msgpack_unpacked up, mup;
        unpack_all(&up, j->body, j->body_len);
        unpack_all(&mup, msb.data, msb.size);
        const msgpack_object *o = &up.data;
        static const char *const keys[] = {"id", "model", "status", "output", "shape",
                                           "meta", "timing", "source"};
        assert_mp_keys(o, keys, 8);
        assert_mp_str(mp_get(o, "id"), id);
        assert_mp_str(mp_get(o, "model"), "served-model");
        assert_mp_str(mp_get(o, "status"), "ok");
        const msgpack_object *out = mp_get(o, "output");
        assert_int_equal(out->type, MSGPACK_OBJECT_BIN);
        assert_int_equal(out->via.bin.size, 4 * rows * width);
        for (size_t i = 0; i < rows * width; i++) {
            const unsigned char *b = (const unsigned char *)out->via.bin.ptr + 4 * i;
            uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                         (uint32_t)b[3] << 24, w;
            memcpy(&w, &j->output[i], 4);
            assert_int_equal(u, w);
        }
        const msgpack_object *shape = mp_get(o, "shape");
        assert_int_equal(shape->type, MSGPACK_OBJECT_ARRAY);
        assert_int_equal(shape->via.array.size, 2);
        assert_int_equal(shape->via.array.ptr[0].via.u64, rows);
        assert_int_equal(shape->via.array.ptr[1].via.u64, width);
        assert_true(msgpack_object_equal(*mp_get(o, "meta"), mup.data));
        const msgpack_object *t = mp_get(o, "timing");
        static const char *const tkeys[] = {"queued_ms", "infer_ms", "total_ms", "batch_rows"};
        assert_mp_keys(t, tkeys, 4);
        assert_int_equal(mp_get(t, "queued_ms")->type, MSGPACK_OBJECT_FLOAT64);
        assert_true(mp_get(t, "queued_ms")->via.f64 == j->queued_ms);
        assert_true(mp_get(t, "infer_ms")->via.f64 == j->infer_ms);
        assert_true(mp_get(t, "total_ms")->via.f64 == (double)(now - ts));
        assert_int_equal(mp_get(t, "batch_rows")->via.u64, j->batch_rows);
        const msgpack_object *s = mp_get(o, "source");
        static const char *const skeys[] = {"topic", "partition", "offset"};
        assert_mp_keys(s, skeys, 3);
        assert_mp_str(mp_get(s, "topic"), j->topic);
        assert_int_equal(mp_get(s, "partition")->via.i64, j->partition);
        assert_int_equal(mp_get(s, "offset")->via.i64, j->offset);

        msgpack_unpacked_destroy(&up);
        msgpack_unpacked_destroy(&mup);
        msgpack_sbuffer_destroy(&sb);
        msgpack_sbuffer_destroy(&msb);
        free(in);
        free(inle);
        tjob_free(j);
    }
}

/* A JSON job with every field: input copied exactly (17-digit producer
 * numbers), meta equal; the result parses back, output within float32
 * round-trip (9 digits: exact after conversion to float), meta reals at
 * full precision. */
static void test_roundtrip_json(void **state)
{
    (void)state;
    for (int rep = 0; rep < 20; rep++) {
        char id[PROTO_ID_MAX + 1];
        rand_id(id, PROTO_ID_MAX);
        size_t n = 1 + rnd(300);
        float *in = malloc(n * sizeof(float));
        assert_non_null(in);
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) {
            in[i] = tu_randf(-1e4f, 1e4f);
            if (i == 0) in[i] = (float)(int)in[i]; /* an integer-valued one */
            json_array_append_new(arr, i == 0 ? json_integer((json_int_t)in[i])
                                              : json_real((double)in[i]));
        }
        int64_t ts = 1700000000000 + (int64_t)rnd(100000000);
        int64_t deadline = ts + 1 + (int64_t)rnd(10000);
        int64_t timeout = (int64_t)rnd(10000);
        int prio = (int)rnd(10);
        json_t *meta = json_pack("{s:s,s:f,s:[i,s,n,b],s:{}}", "trace", id, "f",
                                 0.12345678901234567, "list", (int)rnd(1000), "two", 1, "x");
        json_t *root = json_pack("{s:s,s:s,s:o,s:I,s:I,s:i,s:O,s:s}", "id", id, "model", "m1",
                                 "input", arr, "deadline_ms", (json_int_t)deadline, "timeout_ms",
                                 (json_int_t)timeout, "priority", prio, "meta", meta, "zzz",
                                 "ignored");
        assert_non_null(root);
        char *text = json_dumps(root, JSON_COMPACT);
        assert_non_null(text);

        struct dres r = decode(text, strlen(text), NULL, "application/json", ts, &LIM);
        expect(&r, CODEC_JOB, PROTO_OK, NULL);
        struct tjob *j = r.job;
        assert_string_equal(j->req.id, id);
        assert_string_equal(j->req.model, "m1");
        assert_int_equal(j->req.enc, PROTO_ENC_JSON);
        assert_int_equal(j->req.n_input, n);
        assert_memory_equal(j->req.input, in, n * sizeof(float));
        assert_int_equal(j->req.deadline_ms, ts + timeout < deadline ? ts + timeout : deadline);
        assert_int_equal(j->req.priority, prio);
        json_t *jm = json_loadb((const char *)j->req.meta, j->req.meta_len, JSON_DECODE_ANY, NULL);
        assert_true(json_equal(jm, meta));
        json_decref(jm);

        size_t rows = 1 + rnd(8), width = 1 + rnd(64);
        fake_run(j, rows, width);
        j->record_ts_ms = ts;
        int64_t now = ts + (int64_t)rnd(5000);
        assert_int_equal(tjob_encode(j, now), 0);
        assert_int_equal(strcmp(codec_content_type(j->req.enc), "application/json"), 0);

        json_error_t e;
        json_t *res = json_loadb((const char *)j->body, j->body_len, 0, &e);
        if (!res) fail_msg("result does not parse: %s", e.text);
        static const char *const keys[] = {"id", "model", "status", "output", "shape",
                                           "meta", "timing", "source"};
        assert_js_keys(res, keys, 8);
        assert_string_equal(json_string_value(json_object_get(res, "id")), id);
        assert_string_equal(json_string_value(json_object_get(res, "model")), "m1");
        assert_string_equal(json_string_value(json_object_get(res, "status")), "ok");
        json_t *out = json_object_get(res, "output");
        assert_int_equal(json_array_size(out), rows * width);
        for (size_t i = 0; i < rows * width; i++) {
            float f = (float)json_number_value(json_array_get(out, i));
            if (memcmp(&f, &j->output[i], 4) != 0)
                fail_msg("output[%zu]: %.9g != %.9g", i, (double)f, (double)j->output[i]);
        }
        json_t *shape = json_object_get(res, "shape");
        assert_int_equal(json_integer_value(json_array_get(shape, 0)), rows);
        assert_int_equal(json_integer_value(json_array_get(shape, 1)), width);
        assert_true(json_equal(json_object_get(res, "meta"), meta));
        assert_true(json_real_value(json_object_get(json_object_get(res, "meta"), "f")) ==
                    0.12345678901234567);
        json_t *t = json_object_get(res, "timing");
        static const char *const tkeys[] = {"queued_ms", "infer_ms", "total_ms", "batch_rows"};
        assert_js_keys(t, tkeys, 4);
        assert_float_equal(json_real_value(json_object_get(t, "queued_ms")), j->queued_ms,
                           1e-8 * (1 + j->queued_ms));
        assert_float_equal(json_real_value(json_object_get(t, "infer_ms")), j->infer_ms,
                           1e-8 * (1 + j->infer_ms));
        assert_float_equal(json_number_value(json_object_get(t, "total_ms")),
                           (double)(now - ts), 1e-6);
        assert_int_equal(json_integer_value(json_object_get(t, "batch_rows")), j->batch_rows);
        json_t *s = json_object_get(res, "source");
        static const char *const skeys[] = {"topic", "partition", "offset"};
        assert_js_keys(s, skeys, 3);
        assert_string_equal(json_string_value(json_object_get(s, "topic")), j->topic);
        assert_int_equal(json_integer_value(json_object_get(s, "partition")), j->partition);
        assert_int_equal(json_integer_value(json_object_get(s, "offset")), j->offset);

        json_decref(res);
        json_decref(root);
        json_decref(meta);
        free(text);
        free(in);
        tjob_free(j);
    }
}

/* input as a MessagePack array of mixed numbers: float32, float64,
 * positive and negative integers of every width, converted to float32. */
static void test_input_msgpack_number_array(void **state)
{
    (void)state;
    for (int rep = 0; rep < 10; rep++) {
        size_t n = 5 + rnd(200);
        float *want = malloc(n * sizeof(float));
        assert_non_null(want);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 2);
        msgpack_pack_str_with_body(&pk, "id", 2);
        msgpack_pack_str_with_body(&pk, "arr", 3);
        msgpack_pack_str_with_body(&pk, "input", 5);
        msgpack_pack_array(&pk, n);
        for (size_t i = 0; i < n; i++) {
            float f = tu_randf(-1e5f, 1e5f);
            switch (i % 5) {
            case 0: msgpack_pack_float(&pk, f); want[i] = f; break;
            case 1: msgpack_pack_double(&pk, (double)f / 7.0); want[i] = (float)((double)f / 7.0); break;
            case 2: {
                int64_t v = (int64_t)f;
                msgpack_pack_int64(&pk, v);
                want[i] = (float)v;
                break;
            }
            case 3: {
                uint64_t v = tu_rand64();
                msgpack_pack_uint64(&pk, v);
                want[i] = (float)v;
                break;
            }
            default: {
                int64_t v = -(int64_t)(tu_rand64() >> 1);
                msgpack_pack_int64(&pk, v);
                want[i] = (float)v;
            }
            }
        }
        struct dres r = decode(sb.data, sb.size, NULL, NULL, 1, &LIM);
        expect(&r, CODEC_JOB, PROTO_OK, NULL);
        assert_string_equal(r.job->req.id, "arr");
        assert_int_equal(r.job->req.n_input, n);
        assert_memory_equal(r.job->req.input, want, n * sizeof(float));
        assert_int_equal(r.job->req.priority, -1);
        assert_int_equal(r.job->req.deadline_ms, 0);
        assert_null(r.job->req.meta);
        assert_string_equal(r.job->req.model, "");
        tjob_free(r.job);
        msgpack_sbuffer_destroy(&sb);
        free(want);
    }
}

/* Every error code encodes as status "error" with {code, message}, no
 * output or shape, meta still echoed, in both encodings; model falls back
 * to the requested one when no model ran. */
static void test_error_results(void **state)
{
    (void)state;
    for (int e = PROTO_ERR_INVALID_INPUT; e <= PROTO_ERR_SHUTTING_DOWN; e++) {
        for (int enc = 0; enc < 2; enc++) {
            const char *text = "{'id':'err-1','model':'asked','input':[1],'meta':{'k':[1,2]}}";
            struct body b = make_body(text, (enum proto_enc)enc);
            struct dres r = decode(b.p, b.len, NULL, NULL, 1000, &LIM);
            expect(&r, CODEC_JOB, PROTO_OK, NULL);
            struct tjob *j = r.job;
            char msg[64];
            snprintf(msg, sizeof(msg), "failure \"%d\" \\ %s", e, proto_err_name((enum proto_err)e));
            j->req.err = (enum proto_err)e;
            snprintf(j->req.errmsg, sizeof(j->req.errmsg), "%s", msg);
            j->record_ts_ms = 1000;
            j->partition = 3;
            j->offset = 42;
            strcpy(j->topic, "in");
            assert_int_equal(tjob_encode(j, 900), 0); /* clock behind: total 0 */
            static const char *const keys[] = {"id", "model", "status", "error", "meta",
                                               "timing", "source"};
            if (enc == PROTO_ENC_MSGPACK) {
                msgpack_unpacked up;
                unpack_all(&up, j->body, j->body_len);
                assert_mp_keys(&up.data, keys, 7);
                assert_mp_str(mp_get(&up.data, "id"), "err-1");
                assert_mp_str(mp_get(&up.data, "model"), "asked");
                assert_mp_str(mp_get(&up.data, "status"), "error");
                const msgpack_object *eo = mp_get(&up.data, "error");
                static const char *const ekeys[] = {"code", "message"};
                assert_mp_keys(eo, ekeys, 2);
                assert_mp_str(mp_get(eo, "code"), proto_err_name((enum proto_err)e));
                assert_mp_str(mp_get(eo, "message"), msg);
                const msgpack_object *m = mp_get(&up.data, "meta");
                assert_int_equal(mp_get(m, "k")->via.array.size, 2);
                assert_true(mp_get(mp_get(&up.data, "timing"), "total_ms")->via.f64 == 0.0);
                msgpack_unpacked_destroy(&up);
            } else {
                json_t *res = json_loadb((const char *)j->body, j->body_len, 0, NULL);
                assert_non_null(res);
                assert_js_keys(res, keys, 7);
                assert_string_equal(json_string_value(json_object_get(res, "model")), "asked");
                assert_string_equal(json_string_value(json_object_get(res, "status")), "error");
                json_t *eo = json_object_get(res, "error");
                assert_string_equal(json_string_value(json_object_get(eo, "code")),
                                    proto_err_name((enum proto_err)e));
                assert_string_equal(json_string_value(json_object_get(eo, "message")), msg);
                assert_int_equal(json_array_size(json_object_get(json_object_get(res, "meta"), "k")), 2);
                assert_true(json_number_value(json_object_get(json_object_get(res, "timing"),
                                                              "total_ms")) == 0.0);
                json_decref(res);
            }
            tjob_free(j);
            free(b.p);
        }
    }
}

/* Encoding details: no meta key without meta, the body is replaced on a
 * second encode, inconsistent output fails cleanly, a non-finite output
 * value is null in JSON and raw in MessagePack, content types. */
static void test_encode_edges(void **state)
{
    (void)state;
    for (int enc = 0; enc < 2; enc++) {
        struct tjob *j = tjob_new();
        assert_non_null(j);
        j->req.enc = (enum proto_enc)enc;
        strcpy(j->req.id, "e");
        fake_run(j, 1, 3);
        j->output[1] = NAN;
        j->record_ts_ms = 0; /* no timestamp: total 0 */
        assert_int_equal(tjob_encode(j, 5000), 0);
        assert_int_equal(tjob_encode(j, 5000), 0); /* replaces, no leak */
        static const char *const keys[] = {"id", "model", "status", "output", "shape",
                                           "timing", "source"};
        if (enc == PROTO_ENC_MSGPACK) {
            msgpack_unpacked up;
            unpack_all(&up, j->body, j->body_len);
            assert_mp_keys(&up.data, keys, 7);
            assert_mp_str(mp_get(&up.data, "model"), "");
            float f;
            const unsigned char *b = (const unsigned char *)mp_get(&up.data, "output")->via.bin.ptr + 4;
            uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                         (uint32_t)b[3] << 24;
            memcpy(&f, &u, 4);
            assert_true(isnan(f));
            assert_true(mp_get(mp_get(&up.data, "timing"), "total_ms")->via.f64 == 0.0);
            msgpack_unpacked_destroy(&up);
            assert_string_equal(codec_content_type(PROTO_ENC_MSGPACK), "application/msgpack");
        } else {
            json_t *res = json_loadb((const char *)j->body, j->body_len, 0, NULL);
            assert_non_null(res);
            assert_js_keys(res, keys, 7);
            assert_true(json_is_null(json_array_get(json_object_get(res, "output"), 1)));
            json_decref(res);
        }
        /* rows without data: refused, and no stale body is left behind */
        free(j->output);
        j->output = NULL;
        assert_int_equal(tjob_encode(j, 5000), -1);
        assert_null(j->body);
        assert_int_equal(j->body_len, 0);
        /* an error result needs no output at all */
        j->req.err = PROTO_ERR_UNKNOWN_MODEL;
        snprintf(j->req.errmsg, sizeof(j->req.errmsg), "no model \"%s\"", "x");
        assert_int_equal(tjob_encode(j, 5000), 0);
        assert_non_null(j->body);
        tjob_free(j);
    }
}

/* JSON floats take the fewest significant digits that read back as the
 * same float32 ("%.9g" wrote 0.1f as 0.100000001), never more
 * than CODEC_JSON_FLOAT_MAX bytes, and stay reals ("1.0", not "1"). A table
 * of known cases, then random bit patterns that must read back exactly,
 * with no shorter form (one digit fewer) that would. */
static void test_json_float_shortest(void **state)
{
    (void)state;
    static const struct {
        float f;
        const char *want;
    } tab[] = {
        {0.1f, "0.1"},           {1.0f, "1.0"},         {-2.5f, "-2.5"},
        {0.0f, "0.0"},           {100.0f, "1e2"},       {1e-5f, "1e-5"},
        {3.14159274f, "3.1415927"}, {16777216.0f, "16777216.0"},
        {FLT_MAX, "3.4028235e38"}, {-FLT_MIN, "-1.1754944e-38"},
        {1e-45f, "1e-45"},       {NAN, "null"},         {INFINITY, "null"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        size_t n = codec_format_float(buf, sizeof(buf), tab[i].f);
        if (strcmp(buf, tab[i].want) != 0 || n != strlen(buf))
            fail_msg("%.9g: \"%s\", want \"%s\"", (double)tab[i].f, buf, tab[i].want);
    }
    size_t total = 0;
    for (int rep = 0; rep < 200000; rep++) {
        uint32_t u = (uint32_t)tu_rand64();
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f)) continue;
        size_t n = codec_format_float(buf, sizeof(buf), f);
        if (n > CODEC_JSON_FLOAT_MAX) fail_msg("%s: %zu bytes", buf, n);
        if (strtof(buf, NULL) != f || (float)strtod(buf, NULL) != f)
            fail_msg("%s does not read back as %.9g", buf, (double)f);
        total += n;
        /* the value of the shortest form that reads back (tried from 1 digit up) */
        char shortest[400];
        for (int p = 1; p <= 9; p++) {
            snprintf(shortest, sizeof(shortest), "%.*g", p, (double)f);
            if (strtof(shortest, NULL) == f && (float)strtod(shortest, NULL) == f) break;
        }
        if (strtod(shortest, NULL) != strtod(buf, NULL))
            fail_msg("%s: %s is shorter", buf, shortest);
    }
    printf("  random floats: %.2f bytes each on average\n", (double)total / 200000);
}

/* codec_result_max_bytes bounds what the encoder writes, whatever the
 * values: outputs of the longest floats (-1.17549435e-38 is 15 bytes),
 * per-token lengths, classifier labels, long ids and meta, in both
 * encodings. The admission check relies on it (worker/intake.c). */
static void test_result_bound(void **state)
{
    (void)state;
    static const char *const labels[] = {"positive\x01", "negative"};
    for (int enc = 0; enc < 2; enc++)
        for (int kind = 0; kind < 3; kind++) {
            size_t rows = 1 + rnd(40), width = 1 + rnd(300), tokens = kind == 1 ? 1 + rnd(9) : 0;
            size_t n = rows * width * (tokens ? tokens : 1);
            float *out = malloc(n * sizeof(float));
            size_t *lengths = calloc(rows, sizeof(size_t));
            const char **lab = calloc(rows, sizeof(char *));
            assert_true(out && lengths && lab);
            for (size_t i = 0; i < n; i++) out[i] = -1.17549435e-38f;
            for (size_t i = 0; i < rows; i++) {
                lengths[i] = 123456789;
                lab[i] = labels[i % 2];
            }
            char id[PROTO_ID_MAX + 1], meta[600];
            memset(id, '/', PROTO_ID_MAX);
            id[PROTO_ID_MAX] = '\0';
            int ml = snprintf(meta, sizeof(meta), "{\"k\":\"%0500d\"}", 7);
            struct codec_result r = {
                .id = id, .model = "m\x02odel", .enc = (enum proto_enc)enc, .err = PROTO_OK,
                .output = out, .out_rows = rows, .out_width = width,
                .meta = (const unsigned char *)meta, .meta_len = (size_t)ml,
                .queued_ms = 1e300, .infer_ms = -1.2345678901234567e-300, .total_ms = NAN,
                .batch_rows = SIZE_MAX, .out_tokens = tokens, .lengths = lengths,
                .labels = kind == 2 ? lab : NULL, .tokens = SIZE_MAX, .padded_tokens = SIZE_MAX,
                .topic = "a-topic", .partition = INT32_MIN, .offset = INT64_MIN};
            unsigned char *body;
            size_t len;
            assert_int_equal(codec_encode_result(&r, &body, &len), 0);
            struct codec_result_size rs = {
                .enc = r.enc, .rows = rows, .values = n, .per_token = tokens > 0,
                .labels = kind == 2, .label_max = strlen(labels[0]),
                .id_len = strlen(id), .model_len = strlen(r.model), .topic_len = strlen(r.topic),
                .meta_len = r.meta_len};
            size_t bound = codec_result_max_bytes(&rs);
            if (len > bound) fail_msg("enc %d kind %d: %zu bytes over the bound %zu", enc, kind,
                                      len, bound);
            free(body);
            free(out);
            free(lengths);
            free(lab);
        }
    struct codec_result_size huge = {.enc = PROTO_ENC_JSON, .rows = SIZE_MAX, .values = SIZE_MAX};
    assert_true(codec_result_max_bytes(&huge) == SIZE_MAX);
}

/* Numbers JSON allows but C types do not: jansson
 * refuses the whole document for one, which used to dead-letter the
 * record. Now meta echoes them as written, any other field answers
 * invalid_input naming itself, an unknown field ignores them, and a
 * forged rewrite tag is not taken for one. */
static void test_json_big_numbers(void **state)
{
    (void)state;
    static const struct codec_limits lim = {.max_payload_bytes = 1 << 20,
                                            .max_input_floats = 1 << 16, .max_depth = 16,
                                            .max_rows = 16, .max_text_chars = 1000,
                                            .max_tokens = 1000};
    static const struct {
        const char *json;
        enum codec_rc rc;
        enum proto_err err;
        const char *sub;  /* in the error message, or (ok) in the encoded result */
    } tab[] = {
        {"{\"id\":\"a\",\"input\":[1],\"meta\":{\"n\":18446744073709551616}}", CODEC_JOB,
         PROTO_OK, "\"meta\":{\"n\":18446744073709551616}"},
        {"{\"id\":\"b\",\"input\":[1],\"meta\":[1e400,-9223372036854775809,\"1e400\",2.5]}",
         CODEC_JOB, PROTO_OK, "\"meta\":[1e400,-9223372036854775809,\"1e400\",2.5]"},
        {"{\"id\":\"c\",\"input\":[1],\"meta\":{\"s\":\"x\\\"1e999\",\"n\":-1E+400}}", CODEC_JOB,
         PROTO_OK, "\"meta\":{\"s\":\"x\\\"1e999\",\"n\":-1E+400}"},
        {"{\"id\":\"d\",\"input\":[1],\"deadline_ms\":9223372036854775808}", CODEC_JOB,
         PROTO_ERR_INVALID_INPUT, "field deadline_ms: out of range"},
        {"{\"id\":\"e\",\"input\":[1],\"timeout_ms\":1e400}", CODEC_JOB, PROTO_ERR_INVALID_INPUT,
         "field timeout_ms: must be an integer, got real"},
        {"{\"id\":\"f\",\"input\":[1],\"priority\":99999999999999999999}", CODEC_JOB,
         PROTO_ERR_INVALID_INPUT, "field priority: must be 0..9"},
        {"{\"id\":\"g\",\"tokens\":[[2,9223372036854775808,3]]}", CODEC_JOB,
         PROTO_ERR_INVALID_INPUT, "field tokens: row 0 element 1 is not an id"},
        {"{\"id\":\"h\",\"input\":[1,1e400]}", CODEC_JOB, PROTO_ERR_INVALID_INPUT,
         "field input: element 1 is not finite"},
        {"{\"id\":\"i\",\"text\":[\"a\",1e400]}", CODEC_JOB, PROTO_ERR_INVALID_INPUT,
         "field text: row 1 is real, not a string"},
        {"{\"id\":\"j\",\"input\":[1],\"zzz\":1e999}", CODEC_JOB, PROTO_OK, "\"status\":\"ok\""},
        {"{\"id\":\"k\",\"input\":[1],\"model\":1e999}", CODEC_JOB, PROTO_ERR_INVALID_INPUT,
         "field model"},
        {"{\"id\":18446744073709551616,\"input\":[1]}", CODEC_DEAD, PROTO_OK, "id"},
        /* a forged tag next to a real big number: not ours, so as before */
        {"{\"id\":\"l\",\"input\":[1],\"meta\":[\"\\u0000kinfer-number:5\",1e400]}", CODEC_DEAD,
         PROTO_OK, "real number overflow"},
        /* a forged tag alone is a string like any other */
        {"{\"id\":\"m\",\"input\":[1],\"meta\":[\"\\u0000kinfer-number:5\"]}", CODEC_JOB, PROTO_OK,
         "\"meta\":[\"\\u0000kinfer-number:5\"]"},
        /* still not JSON: dead as before */
        {"{\"id\":\"n\",\"input\":[1],\"meta\":1e400,}", CODEC_DEAD, PROTO_OK, "json"},
    };
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        struct dres r = decode(tab[i].json, strlen(tab[i].json), NULL, NULL, 0, &lim);
        printf("  %-70.70s %s\n", tab[i].json,
               r.rc == CODEC_DEAD ? r.err : r.job->req.err ? r.job->req.errmsg : "ok");
        if (tab[i].err != PROTO_OK || tab[i].rc == CODEC_DEAD) {
            expect(&r, tab[i].rc, tab[i].err, tab[i].sub);
        } else {
            expect(&r, CODEC_JOB, PROTO_OK, NULL);
            fake_run(r.job, 1, 1);
            assert_int_equal(tjob_encode(r.job, 0), 0);
            char *body = strndup((const char *)r.job->body, r.job->body_len);
            assert_contains(body, tab[i].sub);
            free(body);
        }
        tjob_free(r.job);
    }
}

/* Every str a result holds is well-formed UTF-8, whatever the job sent:
 * a model name of ill-formed bytes (c3 28) is kept repaired (U+FFFD) and
 * so is the message that quotes it; meta strs (keys and values) echo back
 * repaired; a message set from ill-formed bytes and a model name from
 * elsewhere are repaired by the encoder; well-formed text is untouched;
 * reasons for dead letters are well-formed too. */
static void test_results_are_utf8(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_str_with_body(&pk, "u-1", 3);
    msgpack_pack_str_with_body(&pk, "model", 5);
    msgpack_pack_str_with_body(&pk, "\xc3\x28", 2);
    msgpack_pack_str_with_body(&pk, "input", 5);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str_with_body(&pk, "meta", 4);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "k\xff", 2);
    msgpack_pack_str_with_body(&pk, "v\xed\xa0\x80", 4); /* a surrogate */
    msgpack_pack_str_with_body(&pk, "caf\xc3\xa9", 5);
    msgpack_pack_str_with_body(&pk, "ok \xf0\x9f\x98\x80", 7);
    struct dres r = decode(sb.data, sb.size, NULL, NULL, 1000, &LIM);
    msgpack_sbuffer_destroy(&sb);
    expect(&r, CODEC_JOB, PROTO_OK, NULL);
    struct tjob *j = r.job;
    assert_string_equal(j->req.model, "\xef\xbf\xbd(");
    /* What the intake then answers: unknown_model, quoting the name. */
    j->req.err = PROTO_ERR_UNKNOWN_MODEL;
    snprintf(j->req.errmsg, sizeof(j->req.errmsg), "no model named '%s' on this worker",
             j->req.model);
    assert_int_equal(tjob_encode(j, 2000), 0);
    msgpack_unpacked up;
    unpack_all(&up, j->body, j->body_len);
    assert_true(mp_strs_valid(&up.data));
    assert_mp_str(mp_get(&up.data, "model"), "\xef\xbf\xbd(");
    const msgpack_object *meta = mp_get(&up.data, "meta");
    assert_mp_str(&meta->via.map.ptr[0].key, "k\xef\xbf\xbd");
    assert_mp_str(&meta->via.map.ptr[0].val, "v\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    assert_mp_str(&meta->via.map.ptr[1].key, "caf\xc3\xa9");
    assert_mp_str(&meta->via.map.ptr[1].val, "ok \xf0\x9f\x98\x80");
    msgpack_unpacked_destroy(&up);
    /* Strings that reach the encoder ill-formed (a message written
     * elsewhere, a model name from the configuration) are repaired there,
     * in both encodings. */
    free(j->req.meta); /* MessagePack bytes: they cannot go in a JSON result */
    j->req.meta = NULL;
    j->req.meta_len = 0;
    for (int enc = 0; enc < 2; enc++) {
        j->req.enc = (enum proto_enc)enc;
        snprintf(j->req.errmsg, sizeof(j->req.errmsg), "raw \xc3\x28 \xff");
        j->model_name = "m\xe2\x82";
        assert_int_equal(tjob_encode(j, 2000), 0);
        if (enc == PROTO_ENC_MSGPACK) {
            unpack_all(&up, j->body, j->body_len);
            assert_true(mp_strs_valid(&up.data));
            assert_mp_str(mp_get(&up.data, "model"), "m\xef\xbf\xbd");
            assert_mp_str(mp_get(mp_get(&up.data, "error"), "message"),
                          "raw \xef\xbf\xbd( \xef\xbf\xbd");
            msgpack_unpacked_destroy(&up);
        } else {
            json_t *res = json_loadb((const char *)j->body, j->body_len, 0, NULL);
            assert_non_null(res);
            assert_string_equal(json_string_value(json_object_get(res, "model")), "m\xef\xbf\xbd");
            json_decref(res);
        }
    }
    tjob_free(j);
    /* A dead letter's reason that quotes the record is well-formed. */
    const char text[] = "{\"id\":\"a\" \"\xc3\x28\" }";
    r = decode(text, strlen(text), NULL, NULL, 1000, &LIM);
    assert_int_equal(r.rc, CODEC_DEAD);
    assert_true(utf8_valid(r.err, strlen(r.err)));
    tjob_free(r.job);
}

/* ------------------------------------------------------------------ */
/* Decode tables                                                       */
/* ------------------------------------------------------------------ */

enum { BOTH = 0, MP_ONLY = 1, JS_ONLY = 2 };

/* Bad, odd and hostile bodies, written once and run in each encoding
 * that can express them. */
static void test_decode_table(void **state)
{
    (void)state;
    static const struct {
        int only;
        const char *body;
        const char *key;
        enum codec_rc rc;
        enum proto_err err;
        const char *sub;   /* in errmsg (job) or errstr (dead) */
        const char *id;    /* expected id of a job */
    } cases[] = {
        /* id */
        {BOTH, "{'id':5,'input':[1]}", NULL, CODEC_DEAD, 0, "field id: must be a string, got integer", NULL},
        {BOTH, "{'id':5,'input':[1]}", "k-1", CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field id: must be a string", "k-1"},
        {BOTH, "{'id':'a b','input':[1]}", "k-1", CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field id: characters", "k-1"},
        {BOTH, "{'id':'a b','input':[1]}", "bad key", CODEC_DEAD, 0, "not a valid id either", NULL},
        {BOTH, "{'id':'','input':[1]}", NULL, CODEC_DEAD, 0, "field id: empty", NULL},
        {BOTH, "{'id':null,'input':[1]}", NULL, CODEC_DEAD, 0, "field id: must be a string", NULL},
        {BOTH, "{'input':[1]}", "key.1:x@y/z-_", CODEC_JOB, PROTO_OK, NULL, "key.1:x@y/z-_"},
        {BOTH, "{'input':[1]}", NULL, CODEC_DEAD, 0, "no field id, and no record key", NULL},
        {BOTH, "{'input':[1]}", "bad key", CODEC_DEAD, 0, "record key is not a valid id", NULL},
        {BOTH, "{'id':'from-body','input':[1]}", "from-key", CODEC_JOB, PROTO_OK, NULL, "from-body"},
        {MP_ONLY, "{'id':{'$bin':'6162'},'input':[1]}", NULL, CODEC_DEAD, 0, "got bin", NULL},
        /* model */
        {BOTH, "{'id':'a','model':7,'input':[1]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field model: must be a string", "a"},
        {BOTH, "{'id':'a','model':['m'],'input':[1]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field model", "a"},
        {MP_ONLY, "{'id':'a','model':{'$raw':'a3610062'},'input':[1]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "NUL", "a"},
        /* input */
        {BOTH, "{'id':'a'}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: missing", "a"},
        {BOTH, "{'id':'a','input':'1,2'}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: must be", "a"},
        {BOTH, "{'id':'a','input':{'x':1}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: must be", "a"},
        {BOTH, "{'id':'a','input':null}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: must be", "a"},
        {BOTH, "{'id':'a','input':[]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: empty", "a"},
        {BOTH, "{'id':'a','input':['a']}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: element 0 is not a number", "a"},
        {BOTH, "{'id':'a','input':[1,2,true]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: element 2 is not a number", "a"},
        {BOTH, "{'id':'a','input':[1,[2]]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 1 is not a number", "a"},
        {BOTH, "{'id':'a','input':[1,2,3,1e39]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: element 3 is not finite", "a"},
        {BOTH, "{'id':'a','input':[-3.5e38]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 0 is not finite", "a"},
        {BOTH, "{'id':'a','input':[3.4028234e38, -1e-46, 16777217]}", NULL, CODEC_JOB, PROTO_OK, NULL, "a"},
        {MP_ONLY, "{'id':'a','input':{'$bin':'0000803f0000'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "bin of 6 bytes is not a multiple of 4", "a"},
        {MP_ONLY, "{'id':'a','input':{'$bin':''}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: empty", "a"},
        {MP_ONLY, "{'id':'a','input':{'$bin':'0000803f0000c07f'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 1 is not finite", "a"},
        {MP_ONLY, "{'id':'a','input':{'$bin':'0000807f'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 0 is not finite", "a"},
        {MP_ONLY, "{'id':'a','input':{'$bin':'0000803f000080ff'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 1 is not finite", "a"},
        {MP_ONLY, "{'id':'a','input':[1,{'$raw':'ca7fc00000'}]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 1 is not finite", "a"},
        {MP_ONLY, "{'id':'a','input':[{'$raw':'cb7ff8000000000000'}]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 0 is not finite", "a"},
        {MP_ONLY, "{'id':'a','input':[{'$raw':'cbfff0000000000000'}]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 0 is not finite", "a"},
        {MP_ONLY, "{'id':'a','input':[{'$raw':'ca7f800000'}]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 0 is not finite", "a"},
        {MP_ONLY, "{'id':'a','input':[{'$bin':'00'}]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "element 0 is not a number (bin)", "a"},
        {MP_ONLY, "{'id':'a','input':{'$raw':'c70101aa'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "got ext", "a"},
        /* deadline_ms, timeout_ms */
        {BOTH, "{'id':'a','input':[1],'deadline_ms':'soon'}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field deadline_ms: must be an integer, got string", "a"},
        {BOTH, "{'id':'a','input':[1],'deadline_ms':1.5}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field deadline_ms: must be an integer", "a"},
        {BOTH, "{'id':'a','input':[1],'deadline_ms':-5}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field deadline_ms: out of range", "a"},
        {MP_ONLY, "{'id':'a','input':[1],'deadline_ms':{'$raw':'cfffffffffffffffff'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field deadline_ms: out of range", "a"},
        {BOTH, "{'id':'a','input':[1],'timeout_ms':-1}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field timeout_ms: must be >= 0, got -1", "a"},
        {BOTH, "{'id':'a','input':[1],'timeout_ms':[5]}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field timeout_ms: must be an integer, got array", "a"},
        {BOTH, "{'id':'a','input':[1],'timeout_ms':false}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "got boolean", "a"},
        {MP_ONLY, "{'id':'a','input':[1],'timeout_ms':{'$raw':'cfffffffffffffffff'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field timeout_ms: out of range", "a"},
        /* priority */
        {BOTH, "{'id':'a','input':[1],'priority':10}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field priority: must be 0..9", "a"},
        {BOTH, "{'id':'a','input':[1],'priority':-1}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field priority: must be 0..9", "a"},
        {BOTH, "{'id':'a','input':[1],'priority':1.0}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field priority: must be an integer", "a"},
        {BOTH, "{'id':'a','input':[1],'priority':'3'}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field priority: must be an integer, got string", "a"},
        {MP_ONLY, "{'id':'a','input':[1],'priority':{'$raw':'cfffffffffffffffff'}}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field priority: must be 0..9", "a"},
        /* first error wins: the id error is reported, not the input one */
        {BOTH, "{'id':7,'input':'x','priority':99}", "k", CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field id:", "k"},
        {BOTH, "{'id':'a','input':'x','priority':99}", NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input:", "a"},
        /* unknown fields are ignored; meta may be any value */
        {BOTH, "{'future':{'x':[1,{'y':null}]},'id':'a','input':[1],'meta':null}", NULL, CODEC_JOB, PROTO_OK, NULL, "a"},
        {BOTH, "{'id':'a','input':[1],'meta':'just a string'}", NULL, CODEC_JOB, PROTO_OK, NULL, "a"},
        /* not a job */
        {MP_ONLY, "[1,2]", "k-1", CODEC_DEAD, 0, "top level is array, not a map", NULL},
        {MP_ONLY, "'{}'", "k-1", CODEC_DEAD, 0, "top level is string", NULL},
        {MP_ONLY, "5", NULL, CODEC_DEAD, 0, "top level is integer", NULL},
        {MP_ONLY, "{'id':'a','input':[1],'x':{'$raw':'c1'}}", "k", CODEC_DEAD, 0, "invalid byte 0xc1", NULL},
        {MP_ONLY, "{'id':'a','input':{'$raw':'df10000000'}}", "k", CODEC_DEAD, 0, "exceeds", NULL},
        {MP_ONLY, "{'id':'a','input':{'$raw':'dcffffdcffffdcffff'}}", "k", CODEC_DEAD, 0, "exceeds", NULL},
        {JS_ONLY, "{'id':'a','input':[1],'id':'b'}", "k", CODEC_DEAD, 0, "duplicate", NULL},
        {JS_ONLY, "{'id':'a','input':[1],'meta':{'x':1,'x':2}}", "k", CODEC_DEAD, 0, "duplicate", NULL},
        {JS_ONLY, "{'id':'a','input':[NaN]}", "k", CODEC_DEAD, 0, "json:", NULL},
        {JS_ONLY, "{'id':'a','input':[Infinity]}", "k", CODEC_DEAD, 0, "json:", NULL},
        /* too large for C: answered, not dead-lettered (test_json_big_numbers) */
        {JS_ONLY, "{'id':'a','input':[1e400]}", "k", CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field input: element 0 is not finite", "a"},
        {JS_ONLY, "{'id':'a','input':[1]} x", "k", CODEC_DEAD, 0, "json:", NULL},
        {JS_ONLY, "{'id':'a','input':[1]}{}", "k", CODEC_DEAD, 0, "json:", NULL},
        {JS_ONLY, "{'id':'a\\u0000b','input':[1]}", NULL, CODEC_DEAD, 0, "field id: characters outside", NULL},
        {JS_ONLY, "{'id':'a','input':[1],}", "k", CODEC_DEAD, 0, "json:", NULL},
        {JS_ONLY, "{\xff}", "k", CODEC_DEAD, 0, "json:", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            if ((cases[i].only == MP_ONLY && enc != PROTO_ENC_MSGPACK) ||
                (cases[i].only == JS_ONLY && enc != PROTO_ENC_JSON))
                continue;
            struct body b = make_body(cases[i].body, (enum proto_enc)enc);
            struct dres r = decode(b.p, b.len, cases[i].key, NULL, 1000, &LIM);
            if (r.rc != cases[i].rc ||
                (r.rc == CODEC_JOB && r.job->req.err != cases[i].err))
                fail_msg("case %zu enc %d (%s): rc %d err %s \"%s\" / \"%s\"", i, enc,
                         cases[i].body, r.rc, proto_err_name(r.job->req.err), r.job->req.errmsg, r.err);
            expect(&r, cases[i].rc, cases[i].err, cases[i].sub);
            if (r.rc == CODEC_JOB) {
                assert_string_equal(r.job->req.id, cases[i].id);
                assert_int_equal(r.job->req.enc, enc);
                assert_string_equal(r.err, "");
            }
            tjob_free(r.job);
            free(b.p);
        }
    }
}

/* Duplicate known fields in a MessagePack map are refused (JSON refuses
 * any duplicate at parse time); duplicate unknown ones do not matter. */
static void test_decode_msgpack_duplicates(void **state)
{
    (void)state;
    static const struct {
        const char *hex;
        enum codec_rc rc;
        const char *sub;
    } cases[] = {
        /* {"id":"a","input":[1],"id":"b"} */
        {"83 a2 69 64 a1 61 a5 69 6e 70 75 74 91 01 a2 69 64 a1 62", CODEC_DEAD, "duplicate field id"},
        /* {"id":"a","input":[1],"input":[2]} */
        {"83 a2 69 64 a1 61 a5 69 6e 70 75 74 91 01 a5 69 6e 70 75 74 91 02", CODEC_DEAD, "duplicate field input"},
        /* {"id":"a","meta":1,"input":[1],"meta":2} */
        {"84 a2 69 64 a1 61 a4 6d 65 74 61 01 a5 69 6e 70 75 74 91 01 a4 6d 65 74 61 02", CODEC_DEAD, "duplicate field meta"},
        /* {"id":"a","input":[1],"zz":1,"zz":2} */
        {"84 a2 69 64 a1 61 a5 69 6e 70 75 74 91 01 a2 7a 7a 01 a2 7a 7a 02", CODEC_JOB, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned char buf[64];
        size_t n = unhex(cases[i].hex, buf, sizeof(buf));
        struct dres r = decode(buf, n, "k", NULL, 1, &LIM);
        expect(&r, cases[i].rc, PROTO_OK, cases[i].sub);
        tjob_free(r.job);
    }
}

/* The content-type header must name a known type that agrees with the
 * body; parameters and case do not matter. */
static void test_content_type(void **state)
{
    (void)state;
    static const struct {
        const char *ct;
        int ok_msgpack, ok_json;
    } cases[] = {
        {NULL, 1, 1},
        {"application/msgpack", 1, 0},
        {"application/x-msgpack", 1, 0},
        {"Application/MsgPack", 1, 0},
        {"application/json", 0, 1},
        {"application/json; charset=utf-8", 0, 1},
        {" APPLICATION/JSON", 0, 1},
        {"application/jsonx", 0, 0},
        {"text/plain", 0, 0},
        {"", 0, 0},
        {"application/\xff\"x", 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            struct body b = make_body("{'id':'ct','input':[1,2],'meta':{'m':1}}", (enum proto_enc)enc);
            struct dres r = decode(b.p, b.len, NULL, cases[i].ct, 1, &LIM);
            int ok = enc == PROTO_ENC_JSON ? cases[i].ok_json : cases[i].ok_msgpack;
            expect(&r, CODEC_JOB, ok ? PROTO_OK : PROTO_ERR_INVALID_INPUT, ok ? NULL : "content-type");
            assert_string_equal(r.job->req.id, "ct");
            assert_non_null(r.job->req.meta); /* echoed in the error result too */
            if (!ok) {
                for (const char *p = r.job->req.errmsg; *p; p++) /* printable, quotable */
                    assert_true(*p >= 0x20 && *p < 0x7f);
                assert_int_equal(tjob_encode(r.job, 2), 0);
            }
            tjob_free(r.job);
            free(b.p);
        }
    }
}

/* deadline_ms and timeout_ms combine; the earlier wins; 0 means none;
 * a record without a timestamp counts the timeout from now. */
static void test_deadline_table(void **state)
{
    (void)state;
    int64_t base = 1600000000000 + (int64_t)rnd(1000000000);
    static const struct {
        int has_dl;
        int64_t dl;     /* relative to base */
        int has_to;
        int64_t to;
        int64_t ts;     /* relative to base; INT64_MIN: record has no timestamp */
        int64_t want;   /* relative to base; 0: none; INT64_MAX: saturated */
    } cases[] = {
        {0, 0, 0, 0, 0, 0},
        {1, 5000, 0, 0, 0, 5000},
        {0, 0, 1, 100, 1000, 1100},
        {1, 5000, 1, 100, 1000, 1100},   /* timeout earlier */
        {1, 1050, 1, 100, 1000, 1050},   /* deadline earlier */
        {1, 1100, 1, 100, 1000, 1100},   /* equal */
        {0, 0, 1, 0, 1000, 1000},        /* zero timeout: due at once */
        {1, -1, 1, INT64_MAX, 1000, 0},  /* dl = 0 ("none"), huge timeout */
        {0, 0, 1, 250, INT64_MIN, 250},  /* timeout from now */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            char text[256];
            int64_t dl = cases[i].dl == -1 ? 0 : base + cases[i].dl;
            int n = snprintf(text, sizeof(text), "{'id':'d','input':[1]");
            if (cases[i].has_dl)
                n += snprintf(text + n, sizeof(text) - (size_t)n, ",'deadline_ms':%lld", (long long)dl);
            if (cases[i].has_to)
                n += snprintf(text + n, sizeof(text) - (size_t)n, ",'timeout_ms':%lld", (long long)cases[i].to);
            snprintf(text + n, sizeof(text) - (size_t)n, "}");
            struct body b = make_body(text, (enum proto_enc)enc);
            int64_t ts = cases[i].ts == INT64_MIN ? -1 : base + cases[i].ts;
            struct timespec t0;
            clock_gettime(CLOCK_REALTIME, &t0);
            int64_t now0 = (int64_t)t0.tv_sec * 1000 + t0.tv_nsec / 1000000;
            struct dres r = decode(b.p, b.len, NULL, NULL, ts, &LIM);
            expect(&r, CODEC_JOB, PROTO_OK, NULL);
            if (cases[i].ts == INT64_MIN)
                assert_in_range(r.job->req.deadline_ms, now0 + cases[i].to, now0 + cases[i].to + 5000);
            else if (cases[i].to == INT64_MAX)
                assert_int_equal(r.job->req.deadline_ms, INT64_MAX);
            else if (cases[i].want == 0)
                assert_int_equal(r.job->req.deadline_ms, 0);
            else if (r.job->req.deadline_ms != base + cases[i].want)
                fail_msg("case %zu: deadline %lld, want %lld", i, (long long)r.job->req.deadline_ms,
                         (long long)(base + cases[i].want));
            tjob_free(r.job);
            free(b.p);
        }
    }
}

/* ------------------------------------------------------------------ */
/* Hostile records                                                     */
/* ------------------------------------------------------------------ */

/* Every strict prefix of a valid body, in both encodings, is dead; the
 * full body is a good job. */
static void test_truncated_bodies(void **state)
{
    (void)state;
    const char *text = "{'id':'trunc-1','model':'m','input':[1.5,-2,3e-3],'deadline_ms':99,"
                       "'timeout_ms':5,'priority':4,'meta':{'a':[1,'b',null,{'c':2.5}]}}";
    for (int enc = 0; enc < 2; enc++) {
        struct body b = make_body(text, (enum proto_enc)enc);
        for (size_t k = 0; k <= b.len; k++) {
            struct dres r = decode(b.p, k, "trunc-1", NULL, 1, &LIM);
            if (k < b.len && r.rc != CODEC_DEAD)
                fail_msg("enc %d prefix %zu/%zu: rc %d", enc, k, b.len, r.rc);
            if (k == b.len) expect(&r, CODEC_JOB, PROTO_OK, NULL);
            tjob_free(r.job);
        }
        free(b.p);
    }
}

/* Random byte flips and truncations of a valid body (MessagePack, and
 * JSON one time in four) never crash, never produce a job that breaks the
 * decode invariants, and every job they produce can be answered. */
static void test_mutated_bodies(void **state)
{
    (void)state;
    const char *text = "{'id':'mut','model':'m','input':{'$bin':'0000803f00000040'},"
                       "'priority':4,'meta':{'a':[1,'b',null,{'c':2.5}]}}";
    struct body b = make_body(text, PROTO_ENC_MSGPACK);
    struct body bj = make_body(text, PROTO_ENC_JSON);
    unsigned char *buf = malloc(b.len > bj.len ? b.len : bj.len);
    assert_non_null(buf);
    int jobs = 0, deads = 0;
    for (int iter = 0; iter < 20000; iter++) {
        const struct body *src = iter % 4 == 3 ? &bj : &b;
        memcpy(buf, src->p, src->len);
        size_t len = src->len;
        for (int k = 1 + (int)rnd(3); k > 0; k--) buf[rnd(len)] = (unsigned char)tu_rand64();
        if (rnd(8) == 0) len = rnd(len + 1);
        struct dres r = decode(buf, len, rnd(2) ? "mut-key" : NULL, NULL, 1, &LIM);
        if (r.rc == CODEC_JOB) {
            jobs++;
            assert_int_equal(tjob_encode(r.job, 2), 0);
        } else {
            deads++;
        }
        tjob_free(r.job);
    }
    assert_true(jobs > 0 && deads > 0);
    free(buf);
    free(b.p);
    free(bj.p);
}

/* The header examples of docs/reliability.md, raw: a map32 declaring 2^28
 * entries, 32 x `dc ff ff`, and 0xc1. */
static void test_hostile_raw(void **state)
{
    (void)state;
    static unsigned char chain[96];
    for (int i = 0; i < 32; i++) memcpy(chain + 3 * i, "\xdc\xff\xff", 3);
    static const unsigned char map32[] = {0xdf, 0x10, 0x00, 0x00, 0x00};
    static const unsigned char c1[] = {0xc1};
    static const unsigned char trailing[] = {0x81, 0xa2, 'i', 'd', 0xa1, 'a', 0x00};
    static const unsigned char text[] = "not a job"; /* 'n' is a positive fixint */
    static const struct {
        const unsigned char *p;
        size_t len;
        const char *sub;
    } cases[] = {
        {map32, sizeof(map32), "exceeds"},
        {chain, sizeof(chain), "exceeds"},
        {c1, sizeof(c1), "invalid byte 0xc1"},
        {trailing, sizeof(trailing), "trailing"},
        {text, sizeof(text) - 1, "not a job: a job is a JSON object or a MessagePack map"},
        {chain, sizeof(chain), "not a job"},
        /* JSON that is no object is said to be JSON, not MessagePack's trailing bytes */
        {(const unsigned char *)"[1,2,3]", 7, "not a job: the record is a JSON array; a job is a JSON object"},
        {(const unsigned char *)"\"x\"", 3, "not a job: the record is a JSON string; a job is a JSON object"},
        {(const unsigned char *)" {\"id\":\"a\"}", 11,
         "not a job: the record is a JSON object after whitespace; a JSON job starts with '{'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int keyed = 0; keyed < 2; keyed++) {
            struct dres r = decode(cases[i].p, cases[i].len, keyed ? "k" : NULL, NULL, 1, &LIM);
            expect(&r, CODEC_DEAD, 0, cases[i].sub);
            tjob_free(r.job);
        }
    }
    /* an empty value is dead whatever the key */
    struct dres r = decode("", 0, "good-key", NULL, 1, &LIM);
    expect(&r, CODEC_DEAD, 0, "empty");
    tjob_free(r.job);
    r = decode(NULL, 0, NULL, NULL, 1, &LIM);
    expect(&r, CODEC_DEAD, 0, "empty");
    tjob_free(r.job);
}

/* Builds {'id':'a','input':[1],'meta': k nested arrays}: depth 1 + k. */
static char *nested_text(int k)
{
    size_t cap = 64 + 2 * (size_t)k;
    char *s = malloc(cap);
    assert_non_null(s);
    size_t n = (size_t)snprintf(s, cap, "{'id':'a','input':[1],'meta':");
    for (int i = 0; i < k; i++) s[n++] = '[';
    for (int i = 0; i < k; i++) s[n++] = ']';
    s[n++] = '}';
    s[n] = '\0';
    return s;
}

/* Nesting: exactly max_depth is accepted, one more is dead, 40 deep is
 * dead, in both encodings; past msgpack-c's own 32 levels and jansson's
 * 2048 the record is dead too, not a crash. */
static void test_deep_nesting(void **state)
{
    (void)state;
    static const struct {
        int total_depth;
        int max_depth;
        enum codec_rc rc;
    } cases[] = {
        {16, 16, CODEC_JOB}, {17, 16, CODEC_DEAD}, {40, 16, CODEC_DEAD},
        {32, 32, CODEC_JOB}, {33, 32, CODEC_DEAD}, /* the worker's limit = msgpack-c's */
        {40, 64, CODEC_DEAD},   /* msgpack-c stops at 32; jansson: ours at 64 passes */
        {2100, 4096, CODEC_DEAD},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct codec_limits lim = LIM;
        lim.max_depth = cases[i].max_depth;
        char *text = nested_text(cases[i].total_depth - 1);
        for (int enc = 0; enc < 2; enc++) {
            if (cases[i].total_depth > 1000 && enc == PROTO_ENC_MSGPACK) continue;
            struct body b = make_body(text, (enum proto_enc)enc);
            struct dres r = decode(b.p, b.len, "k", NULL, 1, &lim);
            enum codec_rc want = cases[i].rc;
            if (cases[i].total_depth == 40 && cases[i].max_depth == 64 && enc == PROTO_ENC_JSON)
                want = CODEC_JOB;
            if (r.rc != want) fail_msg("case %zu enc %d: rc %d (%s)", i, enc, r.rc, r.err);
            if (want == CODEC_DEAD && cases[i].max_depth <= 32) {
                char sub[48];
                snprintf(sub, sizeof(sub), "nesting deeper than %d", cases[i].max_depth);
                assert_contains(r.err, sub);
            }
            tjob_free(r.job);
            free(b.p);
        }
        free(text);
    }
    /* a body that is nothing but nesting */
    unsigned char deep[40];
    memset(deep, 0x91, sizeof(deep));
    deep[39] = 0x90;
    struct dres r = decode(deep, sizeof(deep), "k", NULL, 1, &LIM);
    expect(&r, CODEC_DEAD, 0, "nesting");
    tjob_free(r.job);
}

/* A 10 KB id: dead without a usable key, invalid_input under the key with
 * one; a 200-byte id is fine and 201 is not; a 129-byte model is refused. */
static void test_long_strings(void **state)
{
    (void)state;
    static const struct {
        size_t id_len;
        size_t model_len;
        const char *key;
        enum codec_rc rc;
        enum proto_err err;
        const char *sub;
    } cases[] = {
        {10240, 1, NULL, CODEC_DEAD, 0, "field id: 10240 bytes, longer than 200"},
        {10240, 1, "bad key", CODEC_DEAD, 0, "field id: 10240 bytes"},
        {10240, 1, "good-key", CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field id: 10240 bytes"},
        {200, 1, NULL, CODEC_JOB, PROTO_OK, NULL},
        {201, 1, NULL, CODEC_DEAD, 0, "201 bytes"},
        {5, 128, NULL, CODEC_JOB, PROTO_OK, NULL},
        {5, 129, NULL, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field model: 129 bytes, longer than 128"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *id = malloc(cases[i].id_len + 1), *model = malloc(cases[i].model_len + 1);
        assert_non_null(id);
        assert_non_null(model);
        for (size_t k = 0; k < cases[i].id_len; k++) id[k] = ID_CHARS[rnd(sizeof(ID_CHARS) - 1)];
        id[cases[i].id_len] = '\0';
        memset(model, 'm', cases[i].model_len);
        model[cases[i].model_len] = '\0';
        json_t *root = json_pack("{s:s,s:s,s:[f]}", "id", id, "model", model, "input", 1.0);
        char *text = json_dumps(root, JSON_COMPACT);
        for (int enc = 0; enc < 2; enc++) {
            struct body b = make_body(text, (enum proto_enc)enc);
            struct dres r = decode(b.p, b.len, cases[i].key, NULL, 1, &LIM);
            expect(&r, cases[i].rc, cases[i].err, cases[i].sub);
            if (r.rc == CODEC_JOB)
                assert_string_equal(r.job->req.id, cases[i].id_len <= PROTO_ID_MAX ? id : cases[i].key);
            if (r.rc == CODEC_JOB && cases[i].err == PROTO_OK) assert_string_equal(r.job->req.model, model);
            tjob_free(r.job);
            free(b.p);
        }
        free(text);
        json_decref(root);
        free(id);
        free(model);
    }
}

/* The payload cap: over it nothing is parsed; with a usable key the job is
 * answered invalid_input in the encoding the first byte names. */
static void test_oversize_payload(void **state)
{
    (void)state;
    struct codec_limits lim = LIM;
    lim.max_payload_bytes = 40;
    static const struct {
        const char *key;
        enum codec_rc rc;
    } cases[] = {{"big-1", CODEC_JOB}, {NULL, CODEC_DEAD}, {"bad key", CODEC_DEAD}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            char text[256];
            snprintf(text, sizeof(text), "{'id':'a','input':[%s]}",
                     "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28");
            struct body b = make_body(text, (enum proto_enc)enc);
            assert_true(b.len > 40);
            struct dres r = decode(b.p, b.len, cases[i].key, NULL, 1, &lim);
            char want[128];
            snprintf(want, sizeof(want), "payload of %zu bytes exceeds max_payload_bytes 40", b.len);
            expect(&r, cases[i].rc, PROTO_ERR_INVALID_INPUT, want);
            if (r.rc == CODEC_JOB) {
                assert_string_equal(r.job->req.id, "big-1");
                assert_int_equal(r.job->req.enc, enc);
                assert_null(r.job->req.input);
                assert_int_equal(tjob_encode(r.job, 2), 0);
            }
            tjob_free(r.job);
            /* at the cap exactly it is parsed */
            lim.max_payload_bytes = b.len;
            r = decode(b.p, b.len, cases[i].key, NULL, 1, &lim);
            expect(&r, CODEC_JOB, PROTO_OK, NULL);
            lim.max_payload_bytes = 40;
            tjob_free(r.job);
            free(b.p);
        }
    }
}

/* max_input_floats bounds both the bin and the array forms. */
static void test_input_limit(void **state)
{
    (void)state;
    struct codec_limits lim = LIM;
    lim.max_input_floats = 4;
    static const struct {
        const char *body;
        int only;
        enum proto_err err;
    } cases[] = {
        {"{'id':'a','input':[1,2,3,4]}", BOTH, PROTO_OK},
        {"{'id':'a','input':[1,2,3,4,5]}", BOTH, PROTO_ERR_INVALID_INPUT},
        {"{'id':'a','input':{'$bin':'00000000000000000000000000000000'}}", MP_ONLY, PROTO_OK},
        {"{'id':'a','input':{'$bin':'0000000000000000000000000000000000000000'}}", MP_ONLY, PROTO_ERR_INVALID_INPUT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            if (cases[i].only == MP_ONLY && enc != PROTO_ENC_MSGPACK) continue;
            struct body b = make_body(cases[i].body, (enum proto_enc)enc);
            struct dres r = decode(b.p, b.len, NULL, NULL, 1, &lim);
            expect(&r, CODEC_JOB, cases[i].err,
                   cases[i].err ? "field input: 5 values, more than max_input_floats 4" : NULL);
            if (cases[i].err == PROTO_OK) assert_int_equal(r.job->req.n_input, 4);
            tjob_free(r.job);
            free(b.p);
        }
    }
}

/* meta: up to PROTO_META_MAX encoded bytes is kept, one more is
 * invalid_input and dropped; a bad meta does not hide an earlier id
 * error, and a good meta is kept when a later field fails. */
static void test_meta_limits(void **state)
{
    (void)state;
    static const struct {
        size_t str_len[2]; /* [msgpack, json]: string length giving the encoded size */
        int fits;
    } cases[] = {
        {{PROTO_META_MAX - 3, PROTO_META_MAX - 2}, 1}, /* str16 header 3 / two quotes */
        {{PROTO_META_MAX - 2, PROTO_META_MAX - 1}, 0},
        {{5000, 5000}, 0},
        {{100000, 100000}, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            size_t n = cases[i].str_len[enc];
            char *s = malloc(n + 1);
            assert_non_null(s);
            memset(s, 'x', n);
            s[n] = '\0';
            json_t *root = json_pack("{s:s,s:[i],s:s,s:i}", "id", "meta-1", "input", 1, "meta", s,
                                     "priority", 3);
            char *text = json_dumps(root, JSON_COMPACT);
            struct body b = make_body(text, (enum proto_enc)enc);
            struct dres r = decode(b.p, b.len, NULL, NULL, 1, &LIM);
            if (cases[i].fits) {
                expect(&r, CODEC_JOB, PROTO_OK, NULL);
                assert_int_equal(r.job->req.meta_len, PROTO_META_MAX);
            } else {
                expect(&r, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field meta: more than 4096 encoded bytes");
                assert_null(r.job->req.meta);
            }
            tjob_free(r.job);
            free(b.p);
            free(text);
            json_decref(root);
            free(s);
        }
    }
    for (int enc = 0; enc < 2; enc++) {
        /* a later error keeps the meta for the error result */
        struct body b = make_body("{'id':'a','input':[1],'priority':10,'meta':{'t':'x'}}", (enum proto_enc)enc);
        struct dres r = decode(b.p, b.len, NULL, NULL, 1, &LIM);
        expect(&r, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field priority");
        assert_non_null(r.job->req.meta);
        assert_int_equal(tjob_encode(r.job, 5), 0);
        assert_non_null(memmem(r.job->body, r.job->body_len, "meta", 4));
        tjob_free(r.job);
        free(b.p);
        /* an id error comes first even when meta is bad too */
        char *big = malloc(6000);
        assert_non_null(big);
        memset(big, 'y', 5999);
        big[5999] = '\0';
        json_t *root = json_pack("{s:i,s:[i],s:s}", "id", 1, "input", 1, "meta", big);
        char *text = json_dumps(root, JSON_COMPACT);
        b = make_body(text, (enum proto_enc)enc);
        r = decode(b.p, b.len, "kk", NULL, 1, &LIM);
        expect(&r, CODEC_JOB, PROTO_ERR_INVALID_INPUT, "field id: must be a string");
        assert_null(r.job->req.meta);
        tjob_free(r.job);
        free(b.p);
        free(text);
        json_decref(root);
        free(big);
    }
}

/* A job struct that is reused keeps nothing of the previous decode. */
/* A bin input of random length decodes to exactly its floats; one NaN or
 * infinity placed at a random position (lengths across the vector widths
 * the finiteness pass may be compiled to) is reported at that index. */
static void test_bin_input_random(void **state)
{
    (void)state;
    static const uint32_t bad_bits[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f800001u,
                                        0xffffffffu};
    for (int round = 0; round < 400; round++) {
        size_t n = 1 + rnd(round < 200 ? 40 : 3000);
        float *in = malloc(n * sizeof(float));
        assert_non_null(in);
        for (size_t i = 0; i < n; i++) in[i] = tu_randf(-1e38f, 1e38f);
        size_t bad = round % 2 ? rnd(n) : n; /* half the rounds stay finite */
        if (bad < n) {
            uint32_t u = bad_bits[rnd(sizeof(bad_bits) / sizeof(bad_bits[0]))];
            memcpy(&in[bad], &u, sizeof(u));
        }
        unsigned char *le = malloc(4 * n);
        assert_non_null(le);
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &in[i], sizeof(u));
            for (int k = 0; k < 4; k++) le[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
        }
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 2);
        msgpack_pack_str(&pk, 2);
        msgpack_pack_str_body(&pk, "id", 2);
        msgpack_pack_str(&pk, 1);
        msgpack_pack_str_body(&pk, "r", 1);
        msgpack_pack_str(&pk, 5);
        msgpack_pack_str_body(&pk, "input", 5);
        msgpack_pack_bin(&pk, 4 * n);
        msgpack_pack_bin_body(&pk, le, 4 * n);
        struct codec_limits lim = LIM;
        lim.max_input_floats = 4096;
        struct dres r = decode(sb.data, sb.size, NULL, NULL, 1, &lim);
        assert_int_equal(r.rc, CODEC_JOB);
        if (bad < n) {
            char want[96];
            snprintf(want, sizeof(want), "field input: element %zu is not finite", bad);
            assert_int_equal(r.job->req.err, PROTO_ERR_INVALID_INPUT);
            assert_string_equal(r.job->req.errmsg, want);
        } else {
            assert_int_equal(r.job->req.err, PROTO_OK);
            assert_int_equal(r.job->req.n_input, n);
            assert_memory_equal(r.job->req.input, in, n * sizeof(float));
        }
        tjob_free(r.job);
        msgpack_sbuffer_destroy(&sb);
        free(le);
        free(in);
    }
}

static void test_decode_resets_job(void **state)
{
    (void)state;
    struct tjob *j = tjob_new();
    assert_non_null(j);
    char err[128];
    struct body b1 = make_body("{'id':'one','model':'m','input':[1,2],'priority':3,'deadline_ms':7,'meta':1}", PROTO_ENC_MSGPACK);
    struct body b2 = make_body("{'id':'two','input':[5]}", PROTO_ENC_JSON);
    assert_int_equal(codec_decode_job(b1.p, b1.len, NULL, 0, NULL, 1, &LIM, &j->req, err, sizeof(err)), CODEC_JOB);
    assert_int_equal(codec_decode_job(b2.p, b2.len, NULL, 0, NULL, 1, &LIM, &j->req, err, sizeof(err)), CODEC_JOB);
    assert_string_equal(j->req.id, "two");
    assert_string_equal(j->req.model, "");
    assert_int_equal(j->req.enc, PROTO_ENC_JSON);
    assert_int_equal(j->req.n_input, 1);
    assert_true(j->req.input[0] == 5.0f);
    assert_int_equal(j->req.priority, -1);
    assert_int_equal(j->req.deadline_ms, 0);
    assert_null(j->req.meta);
    /* and a dead decode leaves it owning nothing; errstr may be absent */
    assert_int_equal(codec_decode_job(b1.p, 3, NULL, 0, NULL, 1, &LIM, &j->req, NULL, 0), CODEC_DEAD);
    assert_null(j->req.input);
    assert_string_equal(j->req.id, "");
    tjob_free(j);
    free(b1.p);
    free(b2.p);
}

/* The repo's client side (codecs/wire.c) and this codec agree: a job that
 * wire encodes decodes here exactly, and the result encoded here decodes
 * there with every field intact, in both encodings and both tensor forms. */
static void test_wire_interop(void **state)
{
    (void)state;
    for (int form = 0; form < 3; form++) {
        enum proto_enc enc = form == 2 ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK;
        size_t n = 1 + rnd(100);
        float *in = malloc(n * sizeof(float));
        assert_non_null(in);
        for (size_t i = 0; i < n; i++) in[i] = tu_randf(-100, 100);
        char id[PROTO_ID_MAX + 1];
        rand_id(id, 40);
        struct wire_job wj = {
            .id = id, .model = "wm", .input = in, .n_input = n, .input_as_array = form == 1,
            .deadline_ms = 0, .timeout_ms = 2500, .priority = 7,
            .meta_json = "{\"a\":[1,2.5,\"x\",null],\"b\":{\"c\":true}}",
        };
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&wj, enc, &body, &len), 0);
        int64_t ts = 1700000000000 + (int64_t)rnd(1000000);
        struct dres r = decode(body, len, NULL, codec_content_type(enc), ts, &LIM);
        expect(&r, CODEC_JOB, PROTO_OK, NULL);
        struct tjob *j = r.job;
        assert_string_equal(j->req.id, id);
        assert_string_equal(j->req.model, "wm");
        assert_int_equal(j->req.n_input, n);
        assert_memory_equal(j->req.input, in, n * sizeof(float));
        assert_int_equal(j->req.deadline_ms, ts + 2500);
        assert_int_equal(j->req.priority, 7);

        fake_run(j, 1 + rnd(4), 1 + rnd(16));
        j->offset >>= 22; /* wire.c reads integers through a double: keep below 2^53 */
        j->record_ts_ms = ts;
        assert_int_equal(tjob_encode(j, ts + 12), 0);
        struct wire_result w;
        char err[128];
        assert_int_equal(wire_decode_result(j->body, j->body_len, &w, err, sizeof(err)), 0);
        assert_string_equal(w.id, id);
        assert_string_equal(w.model, "wm");
        assert_true(w.ok);
        assert_int_equal(w.rows, j->out_rows);
        assert_int_equal(w.width, j->out_width);
        assert_memory_equal(w.output, j->output, j->out_rows * j->out_width * sizeof(float));
        assert_true(w.total_ms == 12.0);
        assert_int_equal(w.batch_rows, j->batch_rows);
        assert_string_equal(w.topic, j->topic);
        assert_int_equal(w.partition, j->partition);
        assert_int_equal(w.offset, j->offset);
        assert_true(w.has_meta);
        json_t *got = json_loads(w.meta_json, JSON_DECODE_ANY, NULL);
        json_t *want = json_loads(wj.meta_json, 0, NULL);
        assert_true(json_equal(got, want));
        json_decref(got);
        json_decref(want);
        wire_result_fini(&w);
        tjob_free(j);
        free(body);
        free(in);
    }
}

/* Seeds the generator (printed, replayable) and runs every case. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpscan_all_formats),
        cmocka_unit_test(test_mpscan_table),
        cmocka_unit_test(test_mpscan_array16_chain),
        cmocka_unit_test(test_mpscan_depth),
        cmocka_unit_test(test_mpscan_agrees_with_unpacker),
        cmocka_unit_test(test_roundtrip_msgpack),
        cmocka_unit_test(test_roundtrip_json),
        cmocka_unit_test(test_input_msgpack_number_array),
        cmocka_unit_test(test_bin_input_random),
        cmocka_unit_test(test_error_results),
        cmocka_unit_test(test_encode_edges),
        cmocka_unit_test(test_json_float_shortest),
        cmocka_unit_test(test_result_bound),
        cmocka_unit_test(test_json_big_numbers),
        cmocka_unit_test(test_results_are_utf8),
        cmocka_unit_test(test_decode_table),
        cmocka_unit_test(test_decode_msgpack_duplicates),
        cmocka_unit_test(test_content_type),
        cmocka_unit_test(test_deadline_table),
        cmocka_unit_test(test_truncated_bodies),
        cmocka_unit_test(test_mutated_bodies),
        cmocka_unit_test(test_hostile_raw),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_long_strings),
        cmocka_unit_test(test_oversize_payload),
        cmocka_unit_test(test_input_limit),
        cmocka_unit_test(test_meta_limits),
        cmocka_unit_test(test_decode_resets_job),
        cmocka_unit_test(test_wire_interop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

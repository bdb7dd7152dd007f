/* test_codec_text.c - the encoder half of the wire contract (docs/protocol.md,
 * "Text and token inputs (encoder models, v1.1)") through codecs/codec_payload.c and
 * codecs/wire.c: jobs with text, text_pair, tokens, type_ids and truncate,
 * and results with per-token output, lengths, scores, labels and token
 * timings.
 *
 * Proves: a job wire encodes with fresh random rows (UTF-8 of every width,
 * embedded NUL, empty rows, one row as a string or as an array, pairs,
 * flat and nested ids, type ids, truncate true/false/absent) decodes to
 * exactly those bytes, offsets and ids in both encodings; a table of bad
 * jobs (field combinations, types, empty and oversize rows, the limits
 * and one past them, characters counted as code points, ids out of range,
 * shapes that disagree) is answered invalid_input with a message that
 * says why, in both encodings, and a failed job owns no rows (nothing
 * half-copied); MessagePack text that is not UTF-8 decodes
 * (the tokenizer refuses it later), JSON "\u0000" in text is kept, NUL in
 * an id or model is still refused; results in every combination of
 * per-token output, labels, token timings and meta decode with
 * wire_decode_result and with msgpack-c/jansson directly, with exactly
 * the keys the contract lists and nothing new for a layer model.
 *
 * Deterministic given the printed KINFER_TEST_SEED. Every allocation is
 * freed (the ASan build checks). */
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
#include "../codecs/wire.h"
#include "tablebody.h"
#include "testutil.h"

/* Round trips: room for everything they generate. */
static const struct codec_limits LIM = {
    .max_payload_bytes = 1 << 20,
    .max_input_floats = 1 << 16,
    .max_depth = 16,
    .max_rows = 64,
    .max_text_chars = 1000,
    .max_tokens = 4096,
};

/* The error table: small limits, so that at-the-limit and one-past cases
 * fit in a line. */
static const struct codec_limits SMALL = {
    .max_payload_bytes = 1 << 20,
    .max_input_floats = 1 << 16,
    .max_depth = 16,
    .max_rows = 4,
    .max_text_chars = 5,
    .max_tokens = 8,
};

static const char ID_CHARS[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/-";

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static void assert_contains(const char *hay, const char *needle)
{
    if (!hay || !strstr(hay, needle))
        fail_msg("\"%s\" does not contain \"%s\"", hay ? hay : "(null)", needle);
}

/* A uniform random integer in [0, n). */
static size_t rnd(size_t n)
{
    return (size_t)(tu_rand64() % n);
}

static void rand_id(char *buf, size_t max)
{
    size_t n = 1 + rnd(max);
    for (size_t i = 0; i < n; i++) buf[i] = ID_CHARS[rnd(sizeof(ID_CHARS) - 1)];
    buf[n] = '\0';
}

/* Writes one random code point as UTF-8 at out (room for 4 bytes) and
 * returns its byte count: ASCII (controls, quotes and backslashes
 * included), 2-, 3- (surrogates excluded) and 4-byte sequences; U+0000
 * only when nul_ok. */
static size_t rand_cp(unsigned char *out, int nul_ok)
{
    uint32_t cp;
    switch (rnd(5)) {
    case 0:
        if (nul_ok && rnd(3) == 0) {
            out[0] = 0;
            return 1;
        }
        cp = 1 + (uint32_t)rnd(0x7f);
        break;
    case 1: cp = 0x20 + (uint32_t)rnd(0x5f); break;
    case 2: cp = 0x80 + (uint32_t)rnd(0x800 - 0x80); break;
    case 3:
        do cp = 0x800 + (uint32_t)rnd(0x10000 - 0x800);
        while (cp >= 0xD800 && cp <= 0xDFFF);
        break;
    default: cp = 0x10000 + (uint32_t)rnd(0x110000 - 0x10000); break;
    }
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A random row of 0..max_cp code points (a new buffer, NUL-terminated
 * after its *len bytes; *cps gets the code points). */
static char *rand_row(size_t max_cp, int nul_ok, size_t *len, size_t *cps)
{
    size_t n = rnd(4) == 0 ? 0 : rnd(max_cp + 1);
    unsigned char *s = malloc(4 * n + 1);
    assert_non_null(s);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) at += rand_cp(s + at, nul_ok);
    s[at] = '\0';
    *len = at;
    if (cps) *cps = n;
    return (char *)s;
}

/* A random token id: the edges 0 and INT32_MAX often, else anything in
 * range. */
static int32_t rand_tok(void)
{
    switch (rnd(6)) {
    case 0: return 0;
    case 1: return INT32_MAX;
    case 2: return (int32_t)rnd(128);
    default: return (int32_t)(tu_rand64() >> 33);
    }
}

/* One decode and its outcome. */
struct dec {
    enum codec_rc rc;
    struct codec_request req;
    char err[256];
};

/* Checks that offs[0..n] start at 0, never decrease and end at total. */
static void assert_offsets(const size_t *off, size_t n)
{
    assert_non_null(off);
    assert_int_equal(off[0], 0);
    for (size_t i = 0; i < n; i++) assert_true(off[i] <= off[i + 1]);
}

/* Decodes value (key may be NULL) into d and checks the invariants of
 * every outcome: a dead letter owns nothing; a good job carries exactly
 * one of input, text and tokens, with consistent offsets; a failed job
 * says why. */
static void dec(struct dec *d, const void *v, size_t len, const char *key,
                const struct codec_limits *lim)
{
    memset(d, 0, sizeof(*d));
    d->req.priority = -1;
    d->rc = codec_decode_job(v, len, key, key ? strlen(key) : 0, NULL, 1000, lim, &d->req,
                             d->err, sizeof(d->err));
    struct codec_request *r = &d->req;
    if (d->rc == CODEC_DEAD) {
        assert_true(d->err[0] != '\0');
        assert_null(r->input);
        assert_null(r->meta);
        assert_null(r->text);
        assert_null(r->text_off);
        assert_null(r->pair);
        assert_null(r->tokens);
        assert_null(r->token_off);
        assert_null(r->type_ids);
        return;
    }
    assert_int_equal(d->rc, CODEC_JOB);
    assert_true(proto_id_valid(r->id, strlen(r->id)));
    if (r->err != PROTO_OK) {
        assert_true(r->errmsg[0] != '\0');
        /* a failed job carries no half-decoded rows (as no input) */
        assert_int_equal(r->n_text, 0);
        assert_int_equal(r->n_token_rows, 0);
        assert_null(r->text);
        assert_null(r->text_off);
        assert_null(r->pair);
        assert_null(r->pair_off);
        assert_null(r->tokens);
        assert_null(r->token_off);
        assert_null(r->type_ids);
        assert_null(r->input);
        return;
    }
    int kinds = (r->n_input > 0) + (r->n_text > 0) + (r->n_token_rows > 0);
    assert_int_equal(kinds, 1);
    assert_true(r->truncate == 0 || r->truncate == 1);
    if (r->n_text) {
        assert_true(r->n_text <= lim->max_rows);
        assert_non_null(r->text);
        assert_offsets(r->text_off, r->n_text);
        if (r->pair) assert_offsets(r->pair_off, r->n_text);
        assert_null(r->tokens);
    }
    if (r->n_token_rows) {
        assert_true(r->n_token_rows <= lim->max_rows);
        assert_non_null(r->tokens);
        assert_offsets(r->token_off, r->n_token_rows);
        assert_true(r->token_off[r->n_token_rows] <= lim->max_tokens);
        for (size_t i = 0; i < r->n_token_rows; i++)
            assert_true(r->token_off[i] < r->token_off[i + 1]); /* no empty rows */
        for (size_t i = 0; i < r->token_off[r->n_token_rows]; i++) {
            assert_true(r->tokens[i] >= 0);
            if (r->type_ids) assert_true(r->type_ids[i] >= 0);
        }
        assert_null(r->text);
    }
}

static void dec_fini(struct dec *d)
{
    codec_request_fini(&d->req);
}

/* Fails with the whole outcome shown unless it is a job (id `id`) with
 * error `code` and errsub in its message. */
static void expect_job(const struct dec *d, const char *what, const char *id,
                       enum proto_err code, const char *errsub)
{
    if (d->rc != CODEC_JOB || d->req.err != code)
        fail_msg("%s: rc %d err %s \"%s\" / dead \"%s\", expected a job with %s", what, d->rc,
                 proto_err_name(d->req.err), d->req.errmsg, d->err, proto_err_name(code));
    assert_string_equal(d->req.id, id);
    if (errsub && !strstr(d->req.errmsg, errsub))
        fail_msg("%s: message \"%s\" does not contain \"%s\"", what, d->req.errmsg, errsub);
}

/* Asserts the JSON object's keys are exactly `keys`, in that order. */
static void assert_js_keys(json_t *o, const char *const *keys, size_t n)
{
    assert_true(json_is_object(o));
    if (json_object_size(o) != n)
        fail_msg("object has %zu keys, expected %zu", json_object_size(o), n);
    size_t i = 0;
    for (void *it = json_object_iter(o); it; it = json_object_iter_next(o, it), i++)
        assert_string_equal(json_object_iter_key(it), keys[i]);
    assert_int_equal(i, n);
}

/* Unpacks a whole body (one object, nothing after it). */
static void unpack_all(msgpack_unpacked *up, const void *p, size_t len)
{
    size_t off = 0;
    msgpack_unpacked_init(up);
    assert_int_equal(msgpack_unpack_next(up, p, len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, len);
}

static uint64_t mp_uint(const msgpack_object *o)
{
    assert_non_null(o);
    assert_int_equal(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    return o->via.u64;
}

/* ------------------------------------------------------------------ */
/* Round trips: wire_encode_job -> codec_decode_job                    */
/* ------------------------------------------------------------------ */

#define RT_ITERS 300
#define RT_MAX_ROWS 8

/* Random text jobs, each encoding: rows of random UTF-8 (with NUL when
 * sent with explicit lengths; empty rows), one row as a string or as an
 * array, pairs half the time, truncate in each of its three states. */
static void test_roundtrip_text(void **state)
{
    (void)state;
    for (int it = 0; it < RT_ITERS; it++) {
        enum proto_enc enc = (enum proto_enc)(it & 1);
        size_t n = 1 + rnd(RT_MAX_ROWS);
        int with_len = rnd(2), with_pair = rnd(2);
        char *rows[RT_MAX_ROWS], *pairs[RT_MAX_ROWS];
        size_t lens[RT_MAX_ROWS], plens[RT_MAX_ROWS];
        for (size_t i = 0; i < n; i++) {
            rows[i] = rand_row(40, with_len, &lens[i], NULL);
            /* wire sends pairs by strlen: no NUL in them */
            pairs[i] = with_pair ? rand_row(40, 0, &plens[i], NULL) : NULL;
        }
        char id[PROTO_ID_MAX + 1];
        rand_id(id, 40);
        enum wire_truncate tr = (enum wire_truncate)rnd(3);
        struct wire_job wj = {
            .id = id, .timeout_ms = -1, .priority = -1,
            .text = (const char *const *)rows, .text_len = with_len ? lens : NULL, .n_text = n,
            .text_as_array = n == 1 && rnd(2),
            .text_pair = with_pair ? (const char *const *)pairs : NULL, .truncate = tr,
        };
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&wj, enc, &body, &len), 0);
        struct dec d;
        dec(&d, body, len, NULL, &LIM);
        expect_job(&d, "text round trip", id, PROTO_OK, NULL);
        struct codec_request *r = &d.req;
        assert_int_equal(r->enc, enc);
        assert_int_equal(r->n_text, n);
        assert_int_equal(r->truncate, tr != WIRE_TRUNCATE_FALSE);
        assert_null(r->input);
        assert_int_equal(r->n_input, 0);
        assert_int_equal(r->n_token_rows, 0);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(r->text_off[i + 1] - r->text_off[i], lens[i]);
            if (lens[i]) assert_memory_equal(r->text + r->text_off[i], rows[i], lens[i]);
        }
        if (with_pair) {
            assert_non_null(r->pair);
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(r->pair_off[i + 1] - r->pair_off[i], plens[i]);
                if (plens[i]) assert_memory_equal(r->pair + r->pair_off[i], pairs[i], plens[i]);
            }
        } else {
            assert_null(r->pair);
            assert_null(r->pair_off);
        }
        /* only text rows freed, the rest kept */
        codec_request_fini_rows(r);
        assert_null(r->text);
        assert_int_equal(r->n_text, 0);
        assert_string_equal(r->id, id);
        dec_fini(&d);
        free(body);
        for (size_t i = 0; i < n; i++) {
            free(rows[i]);
            free(pairs[i]);
        }
    }
}

/* Whether a job body's tokens field is an array of arrays. */
static int tokens_nested(const unsigned char *body, size_t len, enum proto_enc enc)
{
    int nested;
    if (enc == PROTO_ENC_JSON) {
        json_t *o = json_loadb((const char *)body, len, 0, NULL);
        assert_non_null(o);
        json_t *t = json_object_get(o, "tokens");
        assert_true(json_is_array(t));
        nested = json_is_array(json_array_get(t, 0));
        json_decref(o);
        return nested;
    }
    msgpack_unpacked up;
    unpack_all(&up, body, len);
    const msgpack_object *t = mp_get(&up.data, "tokens");
    assert_non_null(t);
    assert_int_equal(t->type, MSGPACK_OBJECT_ARRAY);
    nested = t->via.array.ptr[0].type == MSGPACK_OBJECT_ARRAY;
    msgpack_unpacked_destroy(&up);
    return nested;
}

/* Random token jobs, each encoding: one row (sent flat) or several
 * (nested), ids over the whole range 0..INT32_MAX, type ids half the
 * time, truncate in each state. */
static void test_roundtrip_tokens(void **state)
{
    (void)state;
    for (int it = 0; it < RT_ITERS; it++) {
        enum proto_enc enc = (enum proto_enc)(it & 1);
        size_t n = 1 + rnd(RT_MAX_ROWS);
        size_t off[RT_MAX_ROWS + 1];
        off[0] = 0;
        for (size_t i = 0; i < n; i++) off[i + 1] = off[i] + 1 + rnd(64);
        size_t total = off[n];
        int32_t *ids = malloc(total * sizeof(*ids)), *types = malloc(total * sizeof(*types));
        assert_non_null(ids);
        assert_non_null(types);
        for (size_t i = 0; i < total; i++) {
            ids[i] = rand_tok();
            types[i] = rnd(8) ? (int32_t)rnd(2) : rand_tok();
        }
        int with_types = rnd(2);
        char id[PROTO_ID_MAX + 1];
        rand_id(id, 40);
        enum wire_truncate tr = (enum wire_truncate)rnd(3);
        struct wire_job wj = {
            .id = id, .model = "enc", .timeout_ms = -1, .priority = (int)rnd(10),
            .tokens = ids, .token_off = off, .n_token_rows = n,
            .type_ids = with_types ? types : NULL, .truncate = tr,
        };
        unsigned char *body;
        size_t len;
        assert_int_equal(wire_encode_job(&wj, enc, &body, &len), 0);
        struct dec d;
        dec(&d, body, len, NULL, &LIM);
        expect_job(&d, "token round trip", id, PROTO_OK, NULL);
        struct codec_request *r = &d.req;
        assert_string_equal(r->model, "enc");
        assert_int_equal(r->priority, wj.priority);
        assert_int_equal(r->n_token_rows, n);
        assert_int_equal(r->n_text, 0);
        assert_null(r->input);
        assert_int_equal(r->truncate, tr != WIRE_TRUNCATE_FALSE);
        for (size_t i = 0; i <= n; i++) assert_int_equal(r->token_off[i], off[i]);
        /* one row goes flat ([1,2,...]), several nested ([[...],[...]]) */
        int nested = tokens_nested(body, len, enc);
        assert_int_equal(nested, n > 1);
        for (size_t i = 0; i < total; i++) assert_int_equal(r->tokens[i], ids[i]);
        if (with_types) {
            assert_non_null(r->type_ids);
            for (size_t i = 0; i < total; i++) assert_int_equal(r->type_ids[i], types[i]);
        } else {
            assert_null(r->type_ids);
        }
        dec_fini(&d);
        free(body);
        free(ids);
        free(types);
    }
}

/* What wire cannot produce: one row sent nested ([[...]]), type ids
 * alike; the limits exactly reached (rows, characters of every width,
 * ids) decode. */
static void test_decode_shapes_and_limits(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        size_t rows;     /* text or token rows expected */
        int tokens;      /* 1: a token job, else text */
        size_t total;    /* tokens: ids; text: bytes of row 0 */
    } cases[] = {
        {"{'id':'a','tokens':[[5,6,7]]}", 1, 1, 3},
        {"{'id':'a','tokens':[[5,6,7]],'type_ids':[[0,1,1]]}", 1, 1, 3},
        {"{'id':'a','tokens':[[1],[2],[3],[4]]}", 4, 1, 4},          /* max_rows */
        {"{'id':'a','tokens':[1,2,3,4,5,6,7,8]}", 1, 1, 8},          /* max_tokens */
        {"{'id':'a','tokens':[[1,2,3],[4,5,6,7,8]]}", 2, 1, 8},
        {"{'id':'a','tokens':[2147483647,0]}", 1, 1, 2},
        {"{'id':'a','text':['a','b','c','d']}", 4, 0, 1},            /* max_rows */
        {"{'id':'a','text':'abcde'}", 1, 0, 5},                      /* max_text_chars */
        {"{'id':'a','text':'h\xc3\xa9llo'}", 1, 0, 6},              /* 2-byte */
        {"{'id':'a','text':'\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe6\x97\xa5\xe6\x9c\xac'}", 1, 0, 15},
        {"{'id':'a','text':'\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80"
         "\xf0\x9f\x98\x80'}", 1, 0, 20},                            /* 4-byte */
        {"{'id':'a','text':['abcde'],'text_pair':['\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9']}", 1, 0, 5},
        {"{'id':'a','text':'','text_pair':''}", 1, 0, 0},
        {"{'id':'a','text':['',''],'truncate':false}", 2, 0, 0},
        {"{'id':'a','text':'x','truncate':true}", 1, 0, 1},
        /* truncate beside input is harmless */
        {"{'id':'a','input':[1,2],'truncate':false}", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            struct body b = make_body(cases[i].body, (enum proto_enc)enc);
            struct dec d;
            dec(&d, b.p, b.len, NULL, &SMALL);
            char what[64];
            snprintf(what, sizeof(what), "case %zu enc %d", i, enc);
            expect_job(&d, what, "a", PROTO_OK, NULL);
            if (cases[i].rows == 0) {
                assert_int_equal(d.req.n_input, 2);
            } else if (cases[i].tokens) {
                assert_int_equal(d.req.n_token_rows, cases[i].rows);
                assert_int_equal(d.req.token_off[cases[i].rows], cases[i].total);
            } else {
                assert_int_equal(d.req.n_text, cases[i].rows);
                assert_int_equal(d.req.text_off[1], cases[i].total);
            }
            dec_fini(&d);
            free(b.p);
        }
    }
    /* nested single row: every id and type id in place */
    for (int enc = 0; enc < 2; enc++) {
        struct body b = make_body("{'id':'a','tokens':[[5,6,7]],'type_ids':[[0,1,1]]}",
                                  (enum proto_enc)enc);
        struct dec d;
        dec(&d, b.p, b.len, NULL, &SMALL);
        expect_job(&d, "nested one row", "a", PROTO_OK, NULL);
        static const int32_t want[] = {5, 6, 7}, want_t[] = {0, 1, 1};
        assert_memory_equal(d.req.tokens, want, sizeof(want));
        assert_memory_equal(d.req.type_ids, want_t, sizeof(want_t));
        assert_int_equal(d.req.truncate, 1);
        dec_fini(&d);
        free(b.p);
    }
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

enum { BOTH = 0, MP_ONLY = 1, JS_ONLY = 2 };

/* Bad encoder jobs, each in every encoding that can say it: answered
 * invalid_input (id 'a') with the reason in the message. SMALL limits:
 * 4 rows, 5 characters, 8 ids. */
static void test_error_table(void **state)
{
    (void)state;
    static const struct {
        int only;
        const char *body;
        const char *sub;
    } cases[] = {
        /* which fields */
        {BOTH, "{'id':'a','input':[1],'text':'x'}", "exactly one of them"},
        {BOTH, "{'id':'a','text':'x','tokens':[1]}", "exactly one of them"},
        {BOTH, "{'id':'a','input':[1],'tokens':[1]}", "exactly one of them"},
        {BOTH, "{'id':'a','input':[1],'text':'x','tokens':[1]}", "exactly one of them"},
        {BOTH, "{'id':'a','input':[1],'text_pair':'x'}", "field text_pair: only with text"},
        {BOTH, "{'id':'a','tokens':[1],'text_pair':'x'}", "field text_pair: only with text"},
        {BOTH, "{'id':'a','text_pair':'x'}", "field text_pair: only with text"},
        {BOTH, "{'id':'a','text':'x','type_ids':[0]}", "field type_ids: only with tokens"},
        {BOTH, "{'id':'a','input':[1],'type_ids':[0]}", "field type_ids: only with tokens"},
        {BOTH, "{'id':'a','type_ids':[0]}", "field type_ids: only with tokens"},
        {BOTH, "{'id':'a','truncate':true}", "field input: missing"},
        /* text: type, rows */
        {BOTH, "{'id':'a','text':5}", "field text: must be a string or an array of strings, got integer"},
        {BOTH, "{'id':'a','text':null}", "field text: must be a string or an array of strings, got"},
        {BOTH, "{'id':'a','text':{'x':'y'}}", "field text: must be a string or an array of strings, got"},
        {BOTH, "{'id':'a','text':true}", "got boolean"},
        {BOTH, "{'id':'a','text':1.5}", "field text: must be a string"},
        {BOTH, "{'id':'a','text':['a',1]}", "field text: row 1 is integer, not a string"},
        {BOTH, "{'id':'a','text':[['a']]}", "field text: row 0 is array, not a string"},
        {BOTH, "{'id':'a','text':['a','b',null]}", "field text: row 2 is"},
        {BOTH, "{'id':'a','text':[]}", "field text: empty array"},
        {BOTH, "{'id':'a','text':['a','b','c','d','e']}", "field text: 5 rows, more than"},
        {BOTH, "{'id':'a','text':'abcdef'}", "field text: row 0 is 6 characters, over max_text_chars 5"},
        {BOTH, "{'id':'a','text':['ok','h\xc3\xa9llo!']}", "field text: row 1 is 6 characters"},
        {BOTH, "{'id':'a','text':'\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e'}",
         "row 0 is 6 characters"},
        {BOTH, "{'id':'a','text':'\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80"
               "\xf0\x9f\x98\x80\xf0\x9f\x98\x80'}", "row 0 is 6 characters"},
        /* text_pair */
        {BOTH, "{'id':'a','text':['a','b'],'text_pair':['x']}", "field text_pair: 1 rows, but text has 2"},
        {BOTH, "{'id':'a','text':'a','text_pair':['x','y']}", "field text_pair: 2 rows, but text has 1"},
        {BOTH, "{'id':'a','text':['a','b'],'text_pair':'x'}", "field text_pair: 1 rows, but text has 2"},
        {BOTH, "{'id':'a','text':'a','text_pair':7}", "field text_pair: must be a string or an array"},
        {BOTH, "{'id':'a','text':['a'],'text_pair':[false]}", "field text_pair: row 0 is boolean"},
        {BOTH, "{'id':'a','text':['a'],'text_pair':[]}", "field text_pair: empty array"},
        {BOTH, "{'id':'a','text':'a','text_pair':'abcdef'}", "field text_pair: row 0 is 6 characters"},
        {BOTH, "{'id':'a','text':['a','b','c','d','e'],'text_pair':['a','b','c','d','e']}",
         "field text: 5 rows"},
        /* tokens: type, rows, ids */
        {BOTH, "{'id':'a','tokens':'1 2 3'}", "field tokens: must be an array of ids or of arrays of ids, got string"},
        {BOTH, "{'id':'a','tokens':7}", "field tokens: must be an array"},
        {BOTH, "{'id':'a','tokens':null}", "field tokens: must be an array"},
        {BOTH, "{'id':'a','tokens':[]}", "field tokens: empty array"},
        {BOTH, "{'id':'a','tokens':[[]]}", "field tokens: row 0 is empty"},
        {BOTH, "{'id':'a','tokens':[[1],[]]}", "field tokens: row 1 is empty"},
        {BOTH, "{'id':'a','tokens':[[1],2]}", "field tokens: row 1 is integer, not an array"},
        {BOTH, "{'id':'a','tokens':[[1],'x']}", "field tokens: row 1 is string, not an array"},
        {BOTH, "{'id':'a','tokens':[1,[2]]}", "field tokens: row 0 element 1 is not an id"},
        {BOTH, "{'id':'a','tokens':[1,-1]}", "field tokens: row 0 element 1 is not an id (an integer 0..2147483647)"},
        {BOTH, "{'id':'a','tokens':[[1],[2,-2147483648]]}", "field tokens: row 1 element 1 is not an id"},
        {BOTH, "{'id':'a','tokens':[1.5]}", "field tokens: row 0 element 0 is not an id"},
        {BOTH, "{'id':'a','tokens':[1.0]}", "row 0 element 0 is not an id"},
        {BOTH, "{'id':'a','tokens':[2147483648]}", "row 0 element 0 is not an id"},
        {BOTH, "{'id':'a','tokens':[9223372036854775807]}", "row 0 element 0 is not an id"},
        {MP_ONLY, "{'id':'a','tokens':[{'$raw':'cfffffffffffffffff'}]}", "row 0 element 0 is not an id"},
        {MP_ONLY, "{'id':'a','tokens':[{'$raw':'ca3f800000'}]}", "row 0 element 0 is not an id"},
        {BOTH, "{'id':'a','tokens':['1']}", "row 0 element 0 is not an id"},
        {BOTH, "{'id':'a','tokens':[1,true]}", "row 0 element 1 is not an id"},
        {BOTH, "{'id':'a','tokens':[1,null]}", "row 0 element 1 is not an id"},
        {BOTH, "{'id':'a','tokens':[1,{}]}", "row 0 element 1 is not an id"},
        {BOTH, "{'id':'a','tokens':[1,2,3,4,5,6,7,8,9]}", "field tokens: more than 8 ids in one job"},
        {BOTH, "{'id':'a','tokens':[[1,2,3,4],[5,6,7,8],[9]]}", "field tokens: more than 8 ids in one job"},
        {BOTH, "{'id':'a','tokens':[[1],[2],[3],[4],[5]]}", "field tokens: 5 rows, more than"},
        /* type_ids */
        {BOTH, "{'id':'a','tokens':[[1,2],[3]],'type_ids':[[0,0]]}", "field type_ids: not the shape of tokens"},
        {BOTH, "{'id':'a','tokens':[[1,2],[3]],'type_ids':[[0],[0,1]]}", "field type_ids: row 0 has 1 ids, tokens' row has 2"},
        {BOTH, "{'id':'a','tokens':[[1,2],[3,4]],'type_ids':[[0,0],[0]]}", "field type_ids: not the shape of tokens"},
        {BOTH, "{'id':'a','tokens':[1,2,3],'type_ids':[0,0]}", "field type_ids: not the shape of tokens"},
        {BOTH, "{'id':'a','tokens':[[1,2],[3,4]],'type_ids':[0,0,0,0]}", "field type_ids: not the shape of tokens"},
        {BOTH, "{'id':'a','tokens':[1,2,3,4],'type_ids':[[0,0],[0,0]]}", "field type_ids: not the shape of tokens"},
        {BOTH, "{'id':'a','tokens':[1,2,3],'type_ids':[0,0,0,0]}", "field type_ids: not the shape of tokens"},
        {BOTH, "{'id':'a','tokens':[1,2],'type_ids':[0,-1]}", "field type_ids: row 0 element 1 is not an id"},
        {BOTH, "{'id':'a','tokens':[1,2],'type_ids':[0,0.5]}", "field type_ids: row 0 element 1 is not an id"},
        {BOTH, "{'id':'a','tokens':[1,2],'type_ids':0}", "field type_ids: must be an array"},
        {BOTH, "{'id':'a','tokens':[1,2],'type_ids':[]}", "field type_ids: empty array"},
        {BOTH, "{'id':'a','tokens':[[1],[2]],'type_ids':[[0],[]]}", "field type_ids: row 1 is empty"},
        {BOTH, "{'id':'a','tokens':[1,2],'type_ids':[0,0,0,0,0,0,0,0,0]}", "field type_ids: more than 8 ids"},
        /* truncate */
        {BOTH, "{'id':'a','text':'x','truncate':1}", "field truncate: must be a boolean, got integer"},
        {BOTH, "{'id':'a','text':'x','truncate':'yes'}", "field truncate: must be a boolean, got string"},
        {BOTH, "{'id':'a','tokens':[1],'truncate':null}", "field truncate: must be a boolean"},
        {BOTH, "{'id':'a','tokens':[1],'truncate':[true]}", "field truncate: must be a boolean, got array"},
        {BOTH, "{'id':'a','input':[1],'truncate':0}", "field truncate: must be a boolean"},
        /* NUL: kept in text, refused in a model name */
        {BOTH, "{'id':'a','model':'m\\u0000x','text':'x'}", "field model: contains a NUL byte"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            if ((cases[i].only == MP_ONLY && enc != PROTO_ENC_MSGPACK) ||
                (cases[i].only == JS_ONLY && enc != PROTO_ENC_JSON))
                continue;
            struct body b = make_body(cases[i].body, (enum proto_enc)enc);
            struct dec d;
            dec(&d, b.p, b.len, NULL, &SMALL);
            char what[512];
            snprintf(what, sizeof(what), "case %zu enc %d (%s)", i, enc, cases[i].body);
            expect_job(&d, what, "a", PROTO_ERR_INVALID_INPUT, cases[i].sub);
            assert_int_equal(d.req.enc, enc);
            assert_string_equal(d.err, "");
            /* the same job with a record key: the error stays the job's */
            struct dec k;
            dec(&k, b.p, b.len, "key-1", &SMALL);
            expect_job(&k, what, "a", PROTO_ERR_INVALID_INPUT, cases[i].sub);
            dec_fini(&k);
            dec_fini(&d);
            free(b.p);
        }
    }
}

/* The limits are not off by one in either direction, for each limit and
 * character width: n at the limit decodes, n + 1 is refused. */
static void test_limits_generated(void **state)
{
    (void)state;
    static const char *const chars[] = {"a", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80"};
    for (int enc = 0; enc < 2; enc++) {
        for (size_t w = 0; w < 4; w++) {
            for (size_t extra = 0; extra < 2; extra++) {
                /* one row of max_text_chars (+1) characters of width w+1 */
                size_t n = LIM.max_text_chars + extra;
                char *row = malloc(n * 4 + 1);
                assert_non_null(row);
                size_t at = 0;
                for (size_t i = 0; i < n; i++) {
                    size_t cl = strlen(chars[w]);
                    memcpy(row + at, chars[w], cl);
                    at += cl;
                }
                row[at] = '\0';
                const char *rows[2] = {"short", row}, *other[2] = {"x", "y"};
                for (int as_pair = 0; as_pair < 2; as_pair++) {
                    /* the long row as text's row 1, or as text_pair's */
                    struct wire_job wj = {.id = "lim", .timeout_ms = -1, .priority = -1,
                                          .text = as_pair ? other : rows,
                                          .text_pair = as_pair ? rows : NULL, .n_text = 2};
                    unsigned char *body;
                    size_t len;
                    assert_int_equal(wire_encode_job(&wj, (enum proto_enc)enc, &body, &len), 0);
                    struct dec d;
                    dec(&d, body, len, NULL, &LIM);
                    if (extra == 0) {
                        expect_job(&d, "text at max_text_chars", "lim", PROTO_OK, NULL);
                    } else {
                        char sub[96];
                        snprintf(sub, sizeof(sub), "field %s: row 1 is %zu characters",
                                 as_pair ? "text_pair" : "text", n);
                        expect_job(&d, "text over max_text_chars", "lim",
                                   PROTO_ERR_INVALID_INPUT, sub);
                    }
                    dec_fini(&d);
                    free(body);
                }
                free(row);
            }
        }
        for (size_t extra = 0; extra < 2; extra++) {
            /* max_rows (+1) rows of text, and of tokens */
            size_t n = LIM.max_rows + extra;
            const char **rows = malloc(n * sizeof(*rows));
            size_t *off = malloc((n + 1) * sizeof(*off));
            int32_t *ids = malloc(n * sizeof(*ids));
            assert_non_null(rows);
            assert_non_null(off);
            assert_non_null(ids);
            for (size_t i = 0; i < n; i++) {
                rows[i] = "r";
                off[i] = i;
                ids[i] = (int32_t)i;
            }
            off[n] = n;
            struct wire_job tj = {.id = "rows", .timeout_ms = -1, .priority = -1,
                                  .text = rows, .n_text = n};
            struct wire_job kj = {.id = "rows", .timeout_ms = -1, .priority = -1,
                                  .tokens = ids, .token_off = off, .n_token_rows = n};
            const struct wire_job *jobs[2] = {&tj, &kj};
            for (int k = 0; k < 2; k++) {
                unsigned char *body;
                size_t len;
                assert_int_equal(wire_encode_job(jobs[k], (enum proto_enc)enc, &body, &len), 0);
                struct dec d;
                dec(&d, body, len, NULL, &LIM);
                if (extra == 0) {
                    expect_job(&d, "rows at max_rows", "rows", PROTO_OK, NULL);
                } else {
                    char sub[96];
                    snprintf(sub, sizeof(sub), "field %s: %zu rows, more than",
                             k ? "tokens" : "text", n);
                    expect_job(&d, "rows over max_rows", "rows", PROTO_ERR_INVALID_INPUT, sub);
                }
                dec_fini(&d);
                free(body);
            }
            free(rows);
            free(off);
            free(ids);
        }
        for (size_t extra = 0; extra < 2; extra++) {
            /* max_tokens (+1) ids over 3 rows, type ids alike */
            size_t n = LIM.max_tokens + extra;
            int32_t *ids = malloc(n * sizeof(*ids));
            assert_non_null(ids);
            for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(i % 30000);
            size_t off[4] = {0, n / 3, 2 * n / 3, n};
            struct wire_job kj = {.id = "toks", .timeout_ms = -1, .priority = -1,
                                  .tokens = ids, .token_off = off, .n_token_rows = 3,
                                  .type_ids = ids};
            unsigned char *body;
            size_t len;
            assert_int_equal(wire_encode_job(&kj, (enum proto_enc)enc, &body, &len), 0);
            struct dec d;
            dec(&d, body, len, NULL, &LIM);
            if (extra == 0) {
                expect_job(&d, "ids at max_tokens", "toks", PROTO_OK, NULL);
                assert_int_equal(d.req.token_off[3], n);
                assert_memory_equal(d.req.tokens, ids, n * sizeof(*ids));
                assert_memory_equal(d.req.type_ids, ids, n * sizeof(*ids));
            } else {
                expect_job(&d, "ids over max_tokens", "toks", PROTO_ERR_INVALID_INPUT,
                           "field tokens: more than 4096 ids in one job");
            }
            dec_fini(&d);
            free(body);
            free(ids);
        }
    }
}

/* ------------------------------------------------------------------ */
/* Bytes: invalid UTF-8, NUL                                           */
/* ------------------------------------------------------------------ */

/* Packs {"id":"u", field: <rows as str>} by hand so any bytes can go in. */
static struct body mp_text_job(const char *field, const char *const *rows, const size_t *lens,
                               size_t n, int as_array)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_str_with_body(&pk, "u", 1);
    msgpack_pack_str_with_body(&pk, field, strlen(field));
    if (as_array) msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < n; i++) msgpack_pack_str_with_body(&pk, rows[i], lens[i]);
    struct body b = {malloc(sb.size), sb.size};
    assert_non_null(b.p);
    memcpy(b.p, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return b;
}

/* Packs {"id":"u", field: <rows as JSON strings>} by hand, any bytes
 * going in as they are (NUL aside). */
static struct body js_text_job(const char *field, const char *const *rows, const size_t *lens,
                               size_t n, int as_array)
{
    size_t cap = 64 + strlen(field);
    for (size_t i = 0; i < n; i++) cap += lens[i] + 4;
    struct body b = {malloc(cap), 0};
    assert_non_null(b.p);
    b.len = (size_t)snprintf((char *)b.p, cap, "{\"id\":\"u\",\"%s\":%s", field,
                             as_array ? "[" : "");
    for (size_t i = 0; i < n; i++) {
        memcpy((char *)b.p + b.len, i ? ",\"" : "\"", i ? 2 : 1);
        b.len += i ? 2 : 1;
        memcpy((char *)b.p + b.len, rows[i], lens[i]);
        b.len += lens[i];
        ((char *)b.p)[b.len++] = '"';
    }
    if (as_array) ((char *)b.p)[b.len++] = ']';
    ((char *)b.p)[b.len++] = '}';
    return b;
}

/* MessagePack carries text as bytes: invalid UTF-8 (stray continuation,
 * truncated sequence, overlong, 0xff, a lone surrogate) decodes as sent;
 * the tokenizer is where it is refused. The character limit counts the
 * bytes that do not continue a sequence. JSON reads the same bytes the
 * same way (json_utf8.c), though its parser refuses them. */
static void test_msgpack_invalid_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *bytes;
        size_t len;
        int ok; /* under SMALL (5 characters) */
        int json; /* JSON can carry it (no NUL) */
    } rows[] = {
        {"\xff\xfe", 2, 1, 1},
        {"ab\x80\x80\x80\x80\x80\x80\x80\x80", 10, 1, 1}, /* 2 characters by the count */
        {"\xe6\x97", 2, 1, 1},                            /* truncated 3-byte sequence */
        {"\xc0\xaf", 2, 1, 1},                            /* overlong '/' */
        {"\xed\xa0\x80", 3, 1, 1},                        /* U+D800 */
        {"a\xc3(\xe9", 4, 1, 1},                          /* good and bad mixed */
        {"a\0b\0c", 5, 1, 0},
        {"\xff\xff\xff\xff\xff\xff", 6, 0, 1},            /* 6 lead bytes: 6 "characters" */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        for (int k = 0; k < 4; k++) {
            int as_array = k & 1, js = k >> 1;
            if (js && !rows[i].json) continue;
            const char *r[1] = {rows[i].bytes};
            size_t l[1] = {rows[i].len};
            struct body b = js ? js_text_job("text", r, l, 1, as_array)
                               : mp_text_job("text", r, l, 1, as_array);
            struct dec d;
            dec(&d, b.p, b.len, NULL, &SMALL);
            if (rows[i].ok) {
                expect_job(&d, "invalid utf-8", "u", PROTO_OK, NULL);
                assert_int_equal(d.req.n_text, 1);
                assert_int_equal(d.req.text_off[1], rows[i].len);
                assert_memory_equal(d.req.text, rows[i].bytes, rows[i].len);
            } else {
                expect_job(&d, "invalid utf-8 over the limit", "u", PROTO_ERR_INVALID_INPUT,
                           "row 0 is 6 characters");
            }
            dec_fini(&d);
            free(b.p);
        }
    }
    /* JSON: the second row holds the bad byte, and only it keeps it. */
    static const char two[] = "{\"id\":\"u\",\"text\":[\"caf\xc3\xa9\",\"x\xc3(\"],"
                              "\"text_pair\":[\"\xff\",\"y\"]}";
    struct dec d;
    dec(&d, two, sizeof(two) - 1, NULL, &SMALL);
    expect_job(&d, "two rows", "u", PROTO_OK, NULL);
    assert_int_equal(d.req.n_text, 2);
    assert_int_equal(d.req.text_off[1], 5);
    assert_memory_equal(d.req.text, "caf\xc3\xa9x\xc3(", 8);
    assert_int_equal(d.req.pair_off[2], 2);
    assert_memory_equal(d.req.pair, "\xffy", 2);
    dec_fini(&d);
    /* meta (keys too) and model are repaired to U+FFFD, as in MessagePack */
    static const char meta[] = "{\"id\":\"u\",\"model\":\"m\xc3(\",\"text\":\"ok\","
                               "\"meta\":{\"k\xff\":[\"a\xc3(\"]}}";
    dec(&d, meta, sizeof(meta) - 1, NULL, &SMALL);
    expect_job(&d, "meta", "u", PROTO_OK, NULL);
    assert_string_equal(d.req.model, "m\xef\xbf\xbd(");
    assert_int_equal(d.req.meta_len, strlen("{\"k\xef\xbf\xbd\":[\"a\xef\xbf\xbd(\"]}"));
    assert_memory_equal(d.req.meta, "{\"k\xef\xbf\xbd\":[\"a\xef\xbf\xbd(\"]}", d.req.meta_len);
    dec_fini(&d);
    /* an id with such a byte is no id: the key stands in, as in MessagePack */
    static const char id[] = "{\"id\":\"u\xc3\",\"text\":\"ok\"}";
    dec(&d, id, sizeof(id) - 1, "k", &SMALL);
    expect_job(&d, "bad id", "k", PROTO_ERR_INVALID_INPUT, "field id: characters outside");
    dec_fini(&d);
    /* Still dead: a record spelling the marker itself beside a bad byte,
     * and bad bytes outside a string. */
    static const char forged[] = "{\"id\":\"u\",\"text\":[\"\\u0000\\u0001\\u00c3\","
                                 "\"\xc3(\"]}";
    dec(&d, forged, sizeof(forged) - 1, "u", &SMALL);
    assert_int_equal(d.rc, CODEC_DEAD);
    assert_contains(d.err, "json: unable to decode byte 0xc3");
    dec_fini(&d);
    static const char outside[] = "{\"id\":\"u\",\"text\":\"ok\"\xff}";
    dec(&d, outside, sizeof(outside) - 1, "u", &SMALL);
    assert_int_equal(d.rc, CODEC_DEAD);
    assert_contains(d.err, "json:");
    dec_fini(&d);
}

/* JSON "\u0000" inside text and text_pair is kept as a NUL byte (and
 * counts as one character); NUL in an id or a model is still refused. */
static void test_json_nul(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        size_t len0;          /* text row 0's bytes */
        const char *row0;
        size_t plen0;         /* pair row 0's bytes, or (size_t)-1 for none */
        const char *pair0;
    } ok[] = {
        {"{'id':'n','text':'a\\u0000b'}", 3, "a\0b", (size_t)-1, NULL},
        {"{'id':'n','text':'\\u0000'}", 1, "\0", (size_t)-1, NULL},
        {"{'id':'n','text':['\\u0000\\u0000\\u0000\\u0000\\u0000','x']}", 5, "\0\0\0\0\0",
         (size_t)-1, NULL},
        {"{'id':'n','text':'x','text_pair':'\\u0000y'}", 1, "x", 2, "\0y"},
        {"{'id':'n','text':'\\u00e9\\u0000'}", 3, "\xc3\xa9\0", (size_t)-1, NULL},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        for (int enc = 0; enc < 2; enc++) {
            struct body b = make_body(ok[i].body, (enum proto_enc)enc);
            struct dec d;
            dec(&d, b.p, b.len, NULL, &SMALL);
            expect_job(&d, ok[i].body, "n", PROTO_OK, NULL);
            assert_int_equal(d.req.text_off[1], ok[i].len0);
            assert_memory_equal(d.req.text, ok[i].row0, ok[i].len0);
            if (ok[i].pair0) {
                assert_int_equal(d.req.pair_off[1], ok[i].plen0);
                assert_memory_equal(d.req.pair, ok[i].pair0, ok[i].plen0);
            } else {
                assert_null(d.req.pair);
            }
            dec_fini(&d);
            free(b.p);
        }
    }
    /* six NULs are six characters: over SMALL's 5 */
    struct body b = make_body("{'id':'n','text':'\\u0000\\u0000\\u0000\\u0000\\u0000\\u0000'}",
                              PROTO_ENC_JSON);
    struct dec d;
    dec(&d, b.p, b.len, NULL, &SMALL);
    expect_job(&d, "six NULs", "n", PROTO_ERR_INVALID_INPUT, "row 0 is 6 characters");
    dec_fini(&d);
    free(b.p);

    /* An id with a NUL: no usable id without a key (dead), the key's with one. */
    b = make_body("{'id':'a\\u0000b','text':'x'}", PROTO_ENC_JSON);
    dec(&d, b.p, b.len, NULL, &SMALL);
    assert_int_equal(d.rc, CODEC_DEAD);
    assert_contains(d.err, "field id: characters outside");
    dec_fini(&d);
    dec(&d, b.p, b.len, "key-2", &SMALL);
    expect_job(&d, "id with NUL and a key", "key-2", PROTO_ERR_INVALID_INPUT,
               "field id: characters outside");
    dec_fini(&d);
    free(b.p);
    /* and the same in MessagePack (a str with a 0 byte) */
    b = make_body("{'id':'a\\u0000b','text':'x'}", PROTO_ENC_MSGPACK);
    dec(&d, b.p, b.len, NULL, &SMALL);
    assert_int_equal(d.rc, CODEC_DEAD);
    assert_contains(d.err, "field id: characters outside");
    dec_fini(&d);
    free(b.p);
    /* wire sends NUL inside text with explicit lengths, in JSON too */
    const char *rows[1] = {"p\0q"};
    size_t lens[1] = {3};
    struct wire_job wj = {.id = "w", .timeout_ms = -1, .priority = -1, .text = rows,
                          .text_len = lens, .n_text = 1};
    unsigned char *body;
    size_t len;
    assert_int_equal(wire_encode_job(&wj, PROTO_ENC_JSON, &body, &len), 0);
    assert_non_null(memmem(body, len, "\\u0000", 6));
    dec(&d, body, len, NULL, &SMALL);
    expect_job(&d, "wire NUL", "w", PROTO_OK, NULL);
    assert_int_equal(d.req.text_off[1], 3);
    assert_memory_equal(d.req.text, "p\0q", 3);
    dec_fini(&d);
    free(body);
}

/* A decode into a request that already holds rows frees them first, and
 * a failed encoder job leaves nothing that could be mistaken for rows to
 * run (n_text / n_token_rows 0 unless the job is good). */
static void test_decode_reuses_request(void **state)
{
    (void)state;
    static const char *const seq[] = {
        "{'id':'a','text':['x','y'],'text_pair':['p','q']}",
        "{'id':'a','tokens':[[1,2],[3]],'type_ids':[[0,1],[0]]}",
        "{'id':'a','tokens':[[1,2],[3]],'type_ids':[[0],[0]]}",    /* fails after tokens */
        "{'id':'a','text':['x','y'],'text_pair':['p','abcdef']}",  /* fails after text */
        "{'id':'a','tokens':[[1,2],[3,-1]]}",                       /* fails mid-copy */
        "{'id':'a','input':[1,2,3]}",
        "{'id':'a','text':'z'}",
    };
    for (int enc = 0; enc < 2; enc++) {
        struct codec_request req;
        memset(&req, 0, sizeof(req));
        char err[128];
        for (int round = 0; round < 2; round++)
            for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
                struct body b = make_body(seq[i], (enum proto_enc)enc);
                enum codec_rc rc = codec_decode_job(b.p, b.len, NULL, 0, NULL, 1000, &SMALL, &req,
                                                    err, sizeof(err));
                assert_int_equal(rc, CODEC_JOB);
                if (req.err != PROTO_OK) {
                    assert_int_equal(req.err, PROTO_ERR_INVALID_INPUT);
                    assert_int_equal(req.n_text + req.n_token_rows + req.n_input, 0);
                    assert_null(req.text);
                    assert_null(req.pair);
                    assert_null(req.tokens);
                    assert_null(req.type_ids);
                } else {
                    int kinds = (req.n_input > 0) + (req.n_text > 0) + (req.n_token_rows > 0);
                    assert_int_equal(kinds, 1);
                }
                free(b.p);
            }
        codec_request_fini(&req);
        codec_request_fini(&req); /* twice is harmless */
        assert_null(req.text);
        assert_null(req.tokens);
        assert_null(req.type_ids);
    }
}

/* ------------------------------------------------------------------ */
/* Results                                                             */
/* ------------------------------------------------------------------ */

/* An encoder result to encode, with what it borrows. */
struct eres {
    float *out;
    size_t rows, toks, width;
    size_t *lengths;
    const char **labels;
    size_t tokens, padded;
};

static const char *const LABELS[] = {"positive", "negative", "neutral", "caf\xc3\xa9",
                                     "\xe6\x97\xa5\xe6\x9c\xac", "x y \"z\""};

/* Random output: per-token (toks > 0) or pooled, with lengths, labels
 * (a classifier) and token timing as asked. */
static void eres_make(struct eres *e, int per_token, int classifier, int timed)
{
    memset(e, 0, sizeof(*e));
    e->rows = 1 + rnd(5);
    e->toks = per_token ? 1 + rnd(9) : 0;
    e->width = 1 + rnd(7);
    size_t n = e->rows * (e->toks ? e->toks : 1) * e->width;
    e->out = malloc(n * sizeof(float));
    assert_non_null(e->out);
    for (size_t i = 0; i < n; i++) e->out[i] = tu_randf(-1e4f, 1e4f);
    if (n > 2) {
        e->out[0] = FLT_MAX;
        e->out[1] = 1e-45f;
        e->out[2] = -0.0f;
    }
    size_t sum = 0;
    if (per_token) {
        e->lengths = malloc(e->rows * sizeof(size_t));
        assert_non_null(e->lengths);
        for (size_t i = 0; i < e->rows; i++) {
            e->lengths[i] = 1 + rnd(e->toks);
            sum += e->lengths[i];
        }
        e->lengths[rnd(e->rows)] = e->toks; /* the longest row sets the padding */
    } else {
        sum = e->rows * (1 + rnd(50));
    }
    if (classifier) {
        e->labels = malloc(e->rows * sizeof(*e->labels));
        assert_non_null(e->labels);
        for (size_t i = 0; i < e->rows; i++)
            e->labels[i] = LABELS[rnd(sizeof(LABELS) / sizeof(LABELS[0]))];
    }
    if (timed) {
        e->tokens = sum ? sum : 1;
        e->padded = e->tokens + rnd(100);
    }
}

static void eres_free(struct eres *e)
{
    free(e->out);
    free(e->lengths);
    free(e->labels);
}

static size_t eres_n(const struct eres *e)
{
    return e->rows * (e->toks ? e->toks : 1) * e->width;
}

/* Bitwise float equality (so -0.0 and denormals count). */
static void assert_floats(const float *a, const float *b, size_t n)
{
    assert_memory_equal(a, b, n * sizeof(float));
}

/* The result body keys in protocol order for a result with these parts. */
static size_t result_keys(const char **keys, int ok, int per_token, int classifier, int meta)
{
    size_t n = 0;
    keys[n++] = "id";
    keys[n++] = "model";
    keys[n++] = "status";
    if (ok) {
        keys[n++] = "output";
        keys[n++] = "shape";
        if (per_token) keys[n++] = "lengths";
        if (classifier) {
            keys[n++] = "scores";
            keys[n++] = "labels";
        }
    } else {
        keys[n++] = "error";
    }
    if (meta) keys[n++] = "meta";
    keys[n++] = "timing";
    keys[n++] = "source";
    return n;
}

/* Every combination of per-token output, classifier labels, token timing,
 * meta and status, in both encodings: the body has exactly the keys the
 * contract lists, in order; shape has 3 dims exactly for per-token output;
 * lengths, scores (= output, bit for bit) and labels (in row order) are
 * there; timing has tokens and padded_tokens exactly when tokens > 0; and
 * wire_decode_result reads it all back. */
static void test_results_matrix(void **state)
{
    (void)state;
    for (int combo = 0; combo < 64; combo++) {
        enum proto_enc enc = (enum proto_enc)(combo & 1);
        int per_token = combo >> 1 & 1, classifier = combo >> 2 & 1, timed = combo >> 3 & 1,
            with_meta = combo >> 4 & 1, ok = !(combo >> 5 & 1);
        for (int rep = 0; rep < 4; rep++) {
            struct eres e;
            eres_make(&e, per_token, classifier, timed);
            static const unsigned char meta_mp[] = {0x81, 0xa1, 'k', 0x93, 1, 2, 3};
            static const char meta_js[] = "{\"k\":[1,2,3]}";
            char id[PROTO_ID_MAX + 1];
            rand_id(id, 30);
            struct codec_result r = {
                .id = id, .model = "bert", .enc = enc,
                .err = ok ? PROTO_OK : PROTO_ERR_INVALID_INPUT,
                .errmsg = ok ? "" : "field text: row 0: bad",
                .output = e.out, .out_rows = e.rows, .out_width = e.width,
                .meta = with_meta ? (enc == PROTO_ENC_JSON ? (const unsigned char *)meta_js
                                                          : meta_mp)
                                  : NULL,
                .meta_len = with_meta ? (enc == PROTO_ENC_JSON ? strlen(meta_js) : sizeof(meta_mp))
                                      : 0,
                .queued_ms = 1.5, .infer_ms = 2.25, .total_ms = 9.0,
                .batch_rows = 1 + rnd(64), .out_tokens = e.toks, .lengths = e.lengths,
                .labels = (const char *const *)e.labels, .tokens = e.tokens,
                .padded_tokens = e.padded, .topic = "jobs", .partition = 3,
                .offset = (int64_t)rnd(1u << 30),
            };
            unsigned char *body = NULL;
            size_t len = 0;
            assert_int_equal(codec_encode_result(&r, &body, &len), 0);
            const char *keys[16];
            size_t nk = result_keys(keys, ok, per_token, classifier, with_meta);
            static const char *const tk4[] = {"queued_ms", "infer_ms", "total_ms", "batch_rows"};
            static const char *const tk6[] = {"queued_ms", "infer_ms", "total_ms", "batch_rows",
                                              "tokens", "padded_tokens"};
            size_t n = eres_n(&e);

            /* directly, with the encoding's own library */
            if (enc == PROTO_ENC_MSGPACK) {
                msgpack_unpacked up;
                unpack_all(&up, body, len);
                const msgpack_object *m = &up.data;
                assert_mp_keys(m, keys, nk);
                assert_mp_str(mp_get(m, "id"), id);
                assert_mp_str(mp_get(m, "status"), ok ? "ok" : "error");
                if (ok) {
                    const msgpack_object *o = mp_get(m, "output");
                    assert_int_equal(o->type, MSGPACK_OBJECT_BIN);
                    assert_int_equal(o->via.bin.size, n * 4);
                    assert_floats((const float *)o->via.bin.ptr, e.out, n);
                    const msgpack_object *s = mp_get(m, "shape");
                    assert_int_equal(s->type, MSGPACK_OBJECT_ARRAY);
                    assert_int_equal(s->via.array.size, per_token ? 3 : 2);
                    assert_int_equal(mp_uint(&s->via.array.ptr[0]), e.rows);
                    if (per_token) assert_int_equal(mp_uint(&s->via.array.ptr[1]), e.toks);
                    assert_int_equal(mp_uint(&s->via.array.ptr[per_token ? 2 : 1]), e.width);
                    if (per_token) {
                        const msgpack_object *l = mp_get(m, "lengths");
                        assert_int_equal(l->type, MSGPACK_OBJECT_ARRAY);
                        assert_int_equal(l->via.array.size, e.rows);
                        for (size_t i = 0; i < e.rows; i++)
                            assert_int_equal(mp_uint(&l->via.array.ptr[i]), e.lengths[i]);
                    }
                    if (classifier) {
                        const msgpack_object *sc = mp_get(m, "scores");
                        assert_int_equal(sc->type, MSGPACK_OBJECT_BIN);
                        assert_int_equal(sc->via.bin.size, n * 4);
                        assert_memory_equal(sc->via.bin.ptr, o->via.bin.ptr, n * 4);
                        const msgpack_object *lb = mp_get(m, "labels");
                        assert_int_equal(lb->type, MSGPACK_OBJECT_ARRAY);
                        assert_int_equal(lb->via.array.size, e.rows);
                        for (size_t i = 0; i < e.rows; i++)
                            assert_mp_str(&lb->via.array.ptr[i], e.labels[i]);
                    }
                }
                const msgpack_object *t = mp_get(m, "timing");
                assert_mp_keys(t, timed ? tk6 : tk4, timed ? 6 : 4);
                if (timed) {
                    assert_int_equal(mp_uint(mp_get(t, "tokens")), e.tokens);
                    assert_int_equal(mp_uint(mp_get(t, "padded_tokens")), e.padded);
                }
                msgpack_unpacked_destroy(&up);
            } else {
                json_error_t je;
                json_t *o = json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &je);
                if (!o) fail_msg("result is not JSON: %s", je.text);
                assert_js_keys(o, keys, nk);
                assert_string_equal(json_string_value(json_object_get(o, "id")), id);
                if (ok) {
                    json_t *out = json_object_get(o, "output");
                    assert_int_equal(json_array_size(out), n);
                    for (size_t i = 0; i < n; i++)
                        assert_true((float)json_number_value(json_array_get(out, i)) == e.out[i]);
                    json_t *s = json_object_get(o, "shape");
                    assert_int_equal(json_array_size(s), per_token ? 3 : 2);
                    assert_int_equal(json_integer_value(json_array_get(s, 0)), e.rows);
                    if (per_token)
                        assert_int_equal(json_integer_value(json_array_get(s, 1)), e.toks);
                    assert_int_equal(json_integer_value(json_array_get(s, per_token ? 2 : 1)),
                                     e.width);
                    if (per_token) {
                        json_t *l = json_object_get(o, "lengths");
                        assert_int_equal(json_array_size(l), e.rows);
                        for (size_t i = 0; i < e.rows; i++)
                            assert_int_equal(json_integer_value(json_array_get(l, i)),
                                             e.lengths[i]);
                    }
                    if (classifier) {
                        assert_true(json_equal(json_object_get(o, "scores"), out));
                        json_t *lb = json_object_get(o, "labels");
                        assert_int_equal(json_array_size(lb), e.rows);
                        for (size_t i = 0; i < e.rows; i++)
                            assert_string_equal(json_string_value(json_array_get(lb, i)),
                                                e.labels[i]);
                    }
                }
                json_t *t = json_object_get(o, "timing");
                assert_js_keys(t, timed ? tk6 : tk4, timed ? 6 : 4);
                if (timed) {
                    assert_int_equal(json_integer_value(json_object_get(t, "tokens")), e.tokens);
                    assert_int_equal(json_integer_value(json_object_get(t, "padded_tokens")),
                                     e.padded);
                }
                json_decref(o);
            }

            /* and as a client reads it */
            struct wire_result w;
            char err[128];
            assert_int_equal(wire_decode_result(body, len, &w, err, sizeof(err)), 0);
            assert_string_equal(w.id, id);
            assert_string_equal(w.model, "bert");
            assert_int_equal(w.ok, ok);
            assert_int_equal(w.tokens, timed ? (int64_t)e.tokens : 0);
            assert_int_equal(w.padded_tokens, timed ? (int64_t)e.padded : 0);
            assert_int_equal(w.offset, r.offset);
            assert_int_equal(w.batch_rows, r.batch_rows);
            assert_int_equal(w.has_meta, with_meta);
            if (ok) {
                assert_int_equal(w.rows, e.rows);
                assert_int_equal(w.width, e.width);
                assert_int_equal(w.tokens_dim, e.toks);
                assert_non_null(w.output);
                assert_floats(w.output, e.out, n);
                if (per_token) {
                    assert_non_null(w.lengths);
                    for (size_t i = 0; i < e.rows; i++) assert_int_equal(w.lengths[i], e.lengths[i]);
                } else {
                    assert_null(w.lengths);
                }
                assert_int_equal(w.has_scores, classifier);
                if (classifier) {
                    assert_non_null(w.labels);
                    for (size_t i = 0; i < e.rows; i++) assert_string_equal(w.labels[i], e.labels[i]);
                    assert_null(w.labels[e.rows]);
                } else {
                    assert_null(w.labels);
                }
            } else {
                assert_string_equal(w.code, "invalid_input");
                assert_string_equal(w.message, "field text: row 0: bad");
                assert_null(w.output);
                assert_null(w.lengths);
                assert_null(w.labels);
                assert_int_equal(w.has_scores, 0);
            }
            wire_result_fini(&w);
            free(body);
            eres_free(&e);
        }
    }
}

/* A layer model's result (no encoder fields set) is what v1 wrote: the
 * same keys, a 2-dim shape, a 4-key timing; no lengths, scores, labels
 * or token timing. */
static void test_layer_result_unchanged(void **state)
{
    (void)state;
    for (int enc = 0; enc < 2; enc++) {
        size_t rows = 1 + rnd(4), width = 1 + rnd(16);
        float *out = malloc(rows * width * sizeof(float));
        assert_non_null(out);
        for (size_t i = 0; i < rows * width; i++) out[i] = tu_randf(-1, 1);
        struct codec_result r = {.id = "layer", .model = "mlp", .enc = (enum proto_enc)enc,
                                 .output = out, .out_rows = rows, .out_width = width,
                                 .batch_rows = 3, .topic = "t"};
        unsigned char *body;
        size_t len;
        assert_int_equal(codec_encode_result(&r, &body, &len), 0);
        static const char *const keys[] = {"id", "model", "status", "output", "shape",
                                           "timing", "source"};
        static const char *const tk[] = {"queued_ms", "infer_ms", "total_ms", "batch_rows"};
        static const char *const sk[] = {"topic", "partition", "offset"};
        if (enc == PROTO_ENC_MSGPACK) {
            msgpack_unpacked up;
            unpack_all(&up, body, len);
            assert_mp_keys(&up.data, keys, 7);
            assert_int_equal(mp_get(&up.data, "shape")->via.array.size, 2);
            assert_mp_keys(mp_get(&up.data, "timing"), tk, 4);
            assert_mp_keys(mp_get(&up.data, "source"), sk, 3);
            msgpack_unpacked_destroy(&up);
        } else {
            json_t *o = json_loadb((const char *)body, len, 0, NULL);
            assert_non_null(o);
            assert_js_keys(o, keys, 7);
            assert_int_equal(json_array_size(json_object_get(o, "shape")), 2);
            assert_js_keys(json_object_get(o, "timing"), tk, 4);
            assert_js_keys(json_object_get(o, "source"), sk, 3);
            json_decref(o);
        }
        struct wire_result w;
        char err[128];
        assert_int_equal(wire_decode_result(body, len, &w, err, sizeof(err)), 0);
        assert_int_equal(w.rows, rows);
        assert_int_equal(w.width, width);
        assert_int_equal(w.tokens_dim, 0);
        assert_null(w.lengths);
        assert_null(w.labels);
        assert_int_equal(w.has_scores, 0);
        assert_int_equal(w.tokens, 0);
        assert_int_equal(w.padded_tokens, 0);
        assert_floats(w.output, out, rows * width);
        wire_result_fini(&w);
        free(body);
        free(out);
    }
}

/* Per-token output without lengths cannot be written: the encode fails
 * cleanly rather than writing a shape without its lengths. */
static void test_per_token_needs_lengths(void **state)
{
    (void)state;
    float out[6] = {1, 2, 3, 4, 5, 6};
    for (int enc = 0; enc < 2; enc++) {
        struct codec_result r = {.id = "p", .model = "m", .enc = (enum proto_enc)enc,
                                 .output = out, .out_rows = 1, .out_tokens = 3, .out_width = 2,
                                 .topic = "t"};
        unsigned char *body = NULL;
        size_t len = 0;
        assert_int_equal(codec_encode_result(&r, &body, &len), -1);
        assert_null(body);
        size_t lengths[1] = {2};
        r.lengths = lengths;
        assert_int_equal(codec_encode_result(&r, &body, &len), 0);
        struct wire_result w;
        char err[64];
        assert_int_equal(wire_decode_result(body, len, &w, err, sizeof(err)), 0);
        assert_int_equal(w.tokens_dim, 3);
        assert_int_equal(w.lengths[0], 2);
        assert_floats(w.output, out, 6);
        wire_result_fini(&w);
        free(body);
    }
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_text),
        cmocka_unit_test(test_roundtrip_tokens),
        cmocka_unit_test(test_decode_shapes_and_limits),
        cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_limits_generated),
        cmocka_unit_test(test_msgpack_invalid_utf8),
        cmocka_unit_test(test_json_nul),
        cmocka_unit_test(test_decode_reuses_request),
        cmocka_unit_test(test_results_matrix),
        cmocka_unit_test(test_layer_result_unchanged),
        cmocka_unit_test(test_per_token_needs_lengths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

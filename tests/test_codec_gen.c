/* test_codec_gen.c - the generation half of the wire contract
 * (docs/protocol.md, "Generation jobs (decoder language models, v1.2)")
 * through codecs/codec_gen.c: jobs with prompt or messages and every
 * sampling parameter, and generation results.
 *
 * Proves: jobs with fresh random prompts and messages (UTF-8 of every
 * width) and random in-range parameters decode to exactly those bytes
 * and values, in JSON and MessagePack; a table of bad jobs (both prompt
 * and messages, generation fields with input/text, types, every range's
 * edge and one past it, unknown roles, invalid UTF-8 in MessagePack, too
 * many or empty stop strings, the character cap) is answered
 * invalid_input naming the field, with no generation fields kept; results
 * (text, tokens, finish_reason, usage, logprobs, timing.ttft_ms and
 * decode_tokens_per_s) decode in both encodings with the values given;
 * and the admission bound (codec_result_max_bytes with gen_tokens) holds
 * for the worst text a result can carry (every byte escaped in JSON).
 *
 * Deterministic given the printed KINFER_TEST_SEED. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <msgpack.h>

#include "../codecs/codec.h"
#include "testutil.h"

static const struct codec_limits LIM = {
    .max_payload_bytes = 1 << 20,
    .max_input_floats = 1 << 16,
    .max_depth = 16,
    .max_rows = 8,
    .max_text_chars = 200,
    .max_tokens = 4096,
};

/* JSON value -> MessagePack; an object member "__raw" (a string) is
 * written as the key "prompt" with the string's bytes hex-decoded. */
static void pack(msgpack_packer *pk, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(v));
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            if (!strcmp(k, "__raw")) {
                const char *h = json_string_value(e);
                size_t n = strlen(h) / 2;
                char b[64];
                for (size_t i = 0; i < n; i++) sscanf(h + 2 * i, "%2hhx", (unsigned char *)&b[i]);
                msgpack_pack_str_with_body(pk, "prompt", 6);
                msgpack_pack_str_with_body(pk, b, n);
                continue;
            }
            msgpack_pack_str_with_body(pk, k, strlen(k));
            pack(pk, e);
        }
        break;
    }
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++) pack(pk, json_array_get(v, i));
        break;
    case JSON_STRING: msgpack_pack_str_with_body(pk, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: msgpack_pack_int64(pk, json_integer_value(v)); break;
    case JSON_REAL: msgpack_pack_double(pk, json_real_value(v)); break;
    case JSON_TRUE: msgpack_pack_true(pk); break;
    case JSON_FALSE: msgpack_pack_false(pk); break;
    default: msgpack_pack_nil(pk); break;
    }
}

/* Decodes job (JSON, or packed as MessagePack) into r. */
static void decode(const json_t *job, int mp, struct codec_request *r)
{
    char err[256];
    if (mp) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        pack(&pk, job);
        assert_int_equal(codec_decode_job(sb.data, sb.size, NULL, 0, NULL, 1000, &LIM, r, err,
                                          sizeof(err)), CODEC_JOB);
        msgpack_sbuffer_destroy(&sb);
    } else {
        char *s = json_dumps(job, JSON_COMPACT);
        assert_int_equal(codec_decode_job(s, strlen(s), NULL, 0, NULL, 1000, &LIM, r, err,
                                          sizeof(err)), CODEC_JOB);
        free(s);
    }
}

/* A random UTF-8 string of n code points of every width (no NUL). */
static char *rand_utf8(size_t n, size_t *len)
{
    char *s = malloc(4 * n + 1);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        switch (tu_rand64() % 4) {
        case 0: cp = 0x20 + (uint32_t)(tu_rand64() % 0x5f); break;
        case 1: cp = 0x80 + (uint32_t)(tu_rand64() % 0x780); break;
        case 2: cp = 0x800 + (uint32_t)(tu_rand64() % 0xd000); break; /* below surrogates */
        default: cp = 0x10000 + (uint32_t)(tu_rand64() % 0xfffff); break;
        }
        if (cp < 0x80) s[at++] = (char)cp;
        else if (cp < 0x800) {
            s[at++] = (char)(0xc0 | cp >> 6);
            s[at++] = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            s[at++] = (char)(0xe0 | cp >> 12);
            s[at++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            s[at++] = (char)(0x80 | (cp & 0x3f));
        } else {
            s[at++] = (char)(0xf0 | cp >> 18);
            s[at++] = (char)(0x80 | ((cp >> 12) & 0x3f));
            s[at++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            s[at++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    s[at] = '\0';
    *len = at;
    return s;
}

static void test_roundtrip(void **state)
{
    (void)state;
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (int round = 0; round < 40; round++) {
        int mp = round % 2, msgs = (round / 2) % 2;
        json_t *job = json_pack("{s:s}", "id", "job-1");
        size_t len;
        char *texts[4];
        size_t lens[4], n_msgs = 1 + tu_rand64() % 4;
        int rl[4];
        if (msgs) {
            json_t *a = json_array();
            for (size_t i = 0; i < n_msgs; i++) {
                texts[i] = rand_utf8(tu_rand64() % 40, &lens[i]);
                rl[i] = (int)(tu_rand64() % 4);
                json_array_append_new(a, json_pack("{s:s, s:s%}", "role", roles[rl[i]],
                                                   "content", texts[i], lens[i]));
            }
            json_object_set_new(job, "messages", a);
        } else {
            texts[0] = rand_utf8(1 + tu_rand64() % 150, &lens[0]);
            json_object_set_new(job, "prompt", json_stringn(texts[0], lens[0]));
        }
        int max_tokens = 1 + (int)(tu_rand64() % 5000), top_k = (int)(tu_rand64() % 100);
        double temp = (double)(tu_rand64() % 2000) / 1000.0;
        double top_p = (double)(1 + tu_rand64() % 1000) / 1000.0;
        double min_p = (double)(tu_rand64() % 1000) / 1000.0;
        json_int_t seed = (json_int_t)(tu_rand64() >> 2);
        json_object_set_new(job, "max_tokens", json_integer(max_tokens));
        json_object_set_new(job, "temperature", json_real(temp));
        json_object_set_new(job, "top_k", json_integer(top_k));
        json_object_set_new(job, "top_p", json_real(top_p));
        json_object_set_new(job, "min_p", json_real(min_p));
        json_object_set_new(job, "seed", json_integer(seed));
        json_object_set_new(job, "stop", round % 3 ? json_pack("[s, s]", "\n\n", "caf\xc3\xa9")
                                                   : json_string("END"));
        json_object_set_new(job, "logprobs", json_boolean(round % 3 == 1));
        json_object_set_new(job, "stream", json_boolean(round % 5 == 2));
        struct codec_request r;
        memset(&r, 0, sizeof(r));
        decode(job, mp, &r);
        if (r.err != PROTO_OK) fail_msg("round %d: %s", round, r.errmsg);
        const struct codec_gen *g = r.gen;
        assert_non_null(g);
        if (msgs) {
            assert_null(g->prompt);
            assert_int_equal(g->n_msgs, n_msgs);
            for (size_t i = 0; i < n_msgs; i++) {
                assert_int_equal(g->roles[i], rl[i]);
                assert_int_equal(g->content_off[i + 1] - g->content_off[i], lens[i]);
                assert_memory_equal(g->content + g->content_off[i], texts[i], lens[i]);
                free(texts[i]);
            }
        } else {
            assert_int_equal(g->n_msgs, 0);
            assert_int_equal(g->prompt_len, lens[0]);
            assert_memory_equal(g->prompt, texts[0], lens[0]);
            free(texts[0]);
        }
        assert_int_equal(g->max_tokens, (size_t)max_tokens);
        assert_int_equal(g->top_k, (uint32_t)top_k);
        assert_true(g->temperature == (float)temp && g->top_p == (float)top_p &&
                    g->min_p == (float)min_p);
        assert_true(g->seed == (uint64_t)seed);
        assert_int_equal(g->n_stop, round % 3 ? 2 : 1);
        assert_string_equal(g->stop[0], round % 3 ? "\n\n" : "END");
        assert_int_equal(g->logprobs, round % 3 == 1);
        assert_int_equal(g->stream, round % 5 == 2);
        codec_request_fini(&r);
        assert_null(r.gen);
        json_decref(job);
        (void)len;
    }
    /* Defaults: nothing but a prompt. */
    json_t *job = json_pack("{s:s, s:s}", "id", "d", "prompt", "hi");
    struct codec_request r;
    memset(&r, 0, sizeof(r));
    decode(job, 0, &r);
    assert_non_null(r.gen);
    assert_true(r.gen->max_tokens == 0 && r.gen->temperature < 0 && r.gen->top_k == 0 &&
                r.gen->top_p == 1.0f && r.gen->min_p == 0 && r.gen->n_stop == 0 &&
                !r.gen->logprobs && !r.gen->stream);
    codec_request_fini(&r);
    json_decref(job);
}

static void test_error_table(void **state)
{
    (void)state;
    char big[220];
    memset(big, 'a', 201);
    big[201] = '\0';
    char fits[220];
    memset(fits, 'a', 200);
    fits[200] = '\0';
    static const struct {
        const char *json, *msg; /* msg NULL: accepted */
    } rows[] = {
        {"{\"prompt\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"b\"}]}", "exactly one"},
        {"{\"prompt\":\"a\",\"input\":[1.0]}", "no input"},
        {"{\"messages\":[],\"text\":\"x\"}", "no input"},
        {"{\"prompt\":5}", "field prompt: must be a string"},
        {"{\"prompt\":\"\"}", "field prompt: empty"},
        {"{\"messages\":[]}", "field messages: empty"},
        {"{\"messages\":{}}", "field messages: must be an array"},
        {"{\"messages\":[\"hi\"]}", "element 0 is string, not a map"},
        {"{\"messages\":[{\"content\":\"x\"}]}", "role must be a string"},
        {"{\"messages\":[{\"role\":\"user\"}]}", "content must be a string"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "unknown role \"wizard\""},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"1\"},{\"role\":\"user\",\"content\":\"2\"},"
         "{\"role\":\"user\",\"content\":\"3\"},{\"role\":\"user\",\"content\":\"4\"},"
         "{\"role\":\"user\",\"content\":\"5\"},{\"role\":\"user\",\"content\":\"6\"},"
         "{\"role\":\"user\",\"content\":\"7\"},{\"role\":\"user\",\"content\":\"8\"},"
         "{\"role\":\"user\",\"content\":\"9\"}]}", "more than max_job_rows 8"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", "field max_tokens"},
        {"{\"prompt\":\"x\",\"max_tokens\":1}", NULL},
        {"{\"prompt\":\"x\",\"max_tokens\":1.5}", "field max_tokens: must be an integer"},
        {"{\"prompt\":\"x\",\"max_tokens\":18446744073709551616}", "field max_tokens"},
        {"{\"prompt\":\"x\",\"temperature\":-0.001}", "field temperature"},
        {"{\"prompt\":\"x\",\"temperature\":0}", NULL},
        {"{\"prompt\":\"x\",\"temperature\":1e400}", "field temperature"},
        {"{\"prompt\":\"x\",\"temperature\":\"hot\"}", "field temperature: must be a number"},
        {"{\"prompt\":\"x\",\"top_k\":-1}", "field top_k"},
        {"{\"prompt\":\"x\",\"top_k\":0}", NULL},
        {"{\"prompt\":\"x\",\"top_p\":0}", "field top_p: must be in (0, 1]"},
        {"{\"prompt\":\"x\",\"top_p\":1}", NULL},
        {"{\"prompt\":\"x\",\"top_p\":1.0001}", "field top_p"},
        {"{\"prompt\":\"x\",\"min_p\":1}", "field min_p: must be in [0, 1)"},
        {"{\"prompt\":\"x\",\"min_p\":0}", NULL},
        {"{\"prompt\":\"x\",\"min_p\":-0.1}", "field min_p"},
        {"{\"prompt\":\"x\",\"seed\":1.5}", "field seed"},
        {"{\"prompt\":\"x\",\"seed\":-7}", NULL},
        {"{\"prompt\":\"x\",\"stop\":\"\"}", "field stop"},
        {"{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\"]}", NULL},
        {"{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
         "field stop: 9 strings, more than 8"},
        {"{\"prompt\":\"x\",\"stop\":[1]}", "field stop: must be a string"},
        {"{\"prompt\":\"x\",\"stop\":\"a\\u0000b\"}", "without NUL"},
        {"{\"prompt\":\"x\",\"logprobs\":1}", "field logprobs: must be a boolean"},
        {"{\"prompt\":\"x\",\"stream\":\"yes\"}", "field stream: must be a boolean"},
        {"{\"prompt\":\"x\",\"stream\":true,\"logprobs\":false}", NULL},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        json_error_t e;
        json_t *job = json_loads(rows[i].json, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
        if (!job) {
            /* The big number: jansson refuses it; send it as text. */
            for (int mp = 0; mp < 1; mp++) {
                struct codec_request r;
                memset(&r, 0, sizeof(r));
                char err[256];
                assert_int_equal(codec_decode_job(rows[i].json, strlen(rows[i].json), "k", 1,
                                                  NULL, 1000, &LIM, &r, err, sizeof(err)),
                                 CODEC_JOB);
                assert_int_equal(r.err, PROTO_ERR_INVALID_INPUT);
                if (!strstr(r.errmsg, rows[i].msg))
                    fail_msg("row %zu: \"%s\" lacks \"%s\"", i, r.errmsg, rows[i].msg);
                assert_null(r.gen);
                codec_request_fini(&r);
            }
            continue;
        }
        json_object_set_new(job, "id", json_string("row"));
        for (int mp = 0; mp < 2; mp++) {
            struct codec_request r;
            memset(&r, 0, sizeof(r));
            decode(job, mp, &r);
            if (!rows[i].msg) {
                if (r.err != PROTO_OK) fail_msg("row %zu (%s): %s", i, mp ? "mp" : "json", r.errmsg);
                assert_non_null(r.gen);
            } else {
                if (r.err != PROTO_ERR_INVALID_INPUT || !strstr(r.errmsg, rows[i].msg))
                    fail_msg("row %zu (%s): got \"%s\", want \"%s\"", i, mp ? "mp" : "json",
                             r.errmsg, rows[i].msg);
                assert_null(r.gen);
            }
            codec_request_fini(&r);
        }
        json_decref(job);
    }
    /* The character cap: 200 code points pass, 201 do not. */
    const char *both[2] = {fits, big};
    for (int k = 0; k < 2; k++) {
        json_t *job = json_pack("{s:s, s:s}", "id", "cap", "prompt", both[k]);
        for (int mp = 0; mp < 2; mp++) {
            struct codec_request r;
            memset(&r, 0, sizeof(r));
            decode(job, mp, &r);
            if (k) assert_true(r.err == PROTO_ERR_INVALID_INPUT && strstr(r.errmsg, "max_text_chars"));
            else assert_int_equal(r.err, PROTO_OK);
            codec_request_fini(&r);
        }
        json_decref(job);
    }
    /* MessagePack text that is not UTF-8 (JSON cannot carry it as a string). */
    json_t *job = json_pack("{s:s, s:s}", "id", "bad", "__raw", "61ff62");
    struct codec_request r;
    memset(&r, 0, sizeof(r));
    decode(job, 1, &r);
    assert_int_equal(r.err, PROTO_ERR_INVALID_INPUT);
    assert_non_null(strstr(r.errmsg, "not valid UTF-8"));
    assert_null(r.gen);
    codec_request_fini(&r);
    json_decref(job);
}

/* A result with n tokens and text, in both encodings, read back. */
static void test_results(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        size_t n = tu_rand64() % 30, len;
        char *text = rand_utf8(tu_rand64() % 60, &len);
        int32_t *tok = malloc((n + 1) * sizeof(*tok));
        float *lp = malloc((n + 1) * sizeof(*lp));
        for (size_t i = 0; i < n; i++) {
            tok[i] = (int32_t)(tu_rand64() % 150000);
            lp[i] = -(float)(tu_rand64() % 100000) / 1000.0f;
        }
        int with_lp = round % 2;
        struct codec_gen_result g = {.text = text, .text_len = len, .tokens = tok, .n_tokens = n,
                                     .finish_reason = round % 3 ? "length" : "eos",
                                     .prompt_tokens = 17, .completion_tokens = n,
                                     .logprobs = with_lp ? lp : NULL, .ttft_ms = 12.5,
                                     .decode_tokens_per_s = 33.25};
        for (int mp = 0; mp < 2; mp++) {
            struct codec_result r = {.id = "res", .model = "llm",
                                     .enc = mp ? PROTO_ENC_MSGPACK : PROTO_ENC_JSON,
                                     .err = PROTO_OK, .topic = "t", .gen = &g};
            unsigned char *body;
            size_t blen;
            assert_int_equal(codec_encode_result(&r, &body, &blen), 0);
            json_t *o;
            if (mp) {
                msgpack_unpacked up;
                msgpack_unpacked_init(&up);
                size_t off = 0;
                assert_int_equal(msgpack_unpack_next(&up, (const char *)body, blen, &off),
                                 MSGPACK_UNPACK_SUCCESS);
                assert_int_equal(off, blen);
                /* Through msgpack's own JSON-ish walk: the keys and values checked below. */
                const msgpack_object *m = &up.data;
                assert_int_equal(m->type, MSGPACK_OBJECT_MAP);
                o = json_object();
                for (uint32_t i = 0; i < m->via.map.size; i++) {
                    const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
                    char key[64];
                    snprintf(key, sizeof(key), "%.*s", (int)k->via.str.size, k->via.str.ptr);
                    json_t *jv = NULL;
                    if (v->type == MSGPACK_OBJECT_STR) jv = json_stringn(v->via.str.ptr, v->via.str.size);
                    else if (v->type == MSGPACK_OBJECT_ARRAY) {
                        jv = json_array();
                        for (uint32_t q = 0; q < v->via.array.size; q++) {
                            const msgpack_object *e = &v->via.array.ptr[q];
                            json_array_append_new(jv, e->type == MSGPACK_OBJECT_FLOAT32 ||
                                                              e->type == MSGPACK_OBJECT_FLOAT64
                                                          ? json_real(e->via.f64)
                                                          : json_integer((json_int_t)e->via.i64));
                        }
                    } else if (v->type == MSGPACK_OBJECT_MAP) {
                        jv = json_object();
                        for (uint32_t q = 0; q < v->via.map.size; q++) {
                            const msgpack_object *kk = &v->via.map.ptr[q].key, *vv = &v->via.map.ptr[q].val;
                            char k2[64];
                            snprintf(k2, sizeof(k2), "%.*s", (int)kk->via.str.size, kk->via.str.ptr);
                            json_object_set_new(jv, k2, vv->type == MSGPACK_OBJECT_FLOAT64 ||
                                                                vv->type == MSGPACK_OBJECT_FLOAT32
                                                            ? json_real(vv->via.f64)
                                                            : json_integer((json_int_t)vv->via.u64));
                        }
                    } else {
                        jv = json_null();
                    }
                    json_object_set_new(o, key, jv);
                }
                msgpack_unpacked_destroy(&up);
            } else {
                json_error_t e;
                o = json_loadb((const char *)body, blen, 0, &e);
                assert_non_null(o);
            }
            const json_t *t = json_object_get(o, "text");
            assert_int_equal(json_string_length(t), len);
            assert_memory_equal(json_string_value(t), text, len);
            const json_t *ta = json_object_get(o, "tokens");
            assert_int_equal(json_array_size(ta), n);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(json_integer_value(json_array_get(ta, i)), tok[i]);
            assert_string_equal(json_string_value(json_object_get(o, "finish_reason")),
                                g.finish_reason);
            const json_t *u = json_object_get(o, "usage");
            assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 17);
            assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), n);
            const json_t *l = json_object_get(o, "logprobs");
            if (with_lp) {
                assert_int_equal(json_array_size(l), n);
                for (size_t i = 0; i < n; i++)
                    assert_true((float)json_number_value(json_array_get(l, i)) == lp[i]);
            } else {
                assert_null(l);
            }
            assert_null(json_object_get(o, "output"));
            assert_null(json_object_get(o, "shape"));
            const json_t *tm = json_object_get(o, "timing");
            assert_true(json_number_value(json_object_get(tm, "ttft_ms")) == 12.5);
            assert_true(json_number_value(json_object_get(tm, "decode_tokens_per_s")) == 33.25);
            json_decref(o);
            free(body);
        }
        free(text);
        free(tok);
        free(lp);
    }
}

/* The admission bound against the worst result: every text byte a control
 * character (six bytes escaped in JSON), the longest ids and
 * log-probabilities, long names and meta. */
static void test_result_bound(void **state)
{
    (void)state;
    for (int round = 0; round < 12; round++) {
        size_t toks = 1 + tu_rand64() % 300, tb = 1 + tu_rand64() % 16;
        size_t len = toks * tb;
        char *text = malloc(len + 1);
        for (size_t i = 0; i < len; i++) text[i] = (char)(1 + tu_rand64() % 31);
        text[len] = '\0';
        int32_t *tok = malloc(toks * sizeof(*tok));
        float *lp = malloc(toks * sizeof(*lp));
        for (size_t i = 0; i < toks; i++) {
            tok[i] = INT32_MAX;
            lp[i] = -1.17549435e-38f;
        }
        char id[201], model[101];
        memset(id, 'i', 200);
        id[200] = '\0';
        memset(model, 'm', 100);
        model[100] = '\0';
        struct codec_gen_result g = {.text = text, .text_len = len, .tokens = tok,
                                     .n_tokens = toks, .finish_reason = "length",
                                     .prompt_tokens = SIZE_MAX / 2, .completion_tokens = toks,
                                     .logprobs = round % 2 ? lp : NULL, .ttft_ms = 1e300,
                                     .decode_tokens_per_s = -1e-300};
        for (int mp = 0; mp < 2; mp++) {
            struct codec_result r = {.id = id, .model = model,
                                     .enc = mp ? PROTO_ENC_MSGPACK : PROTO_ENC_JSON,
                                     .err = PROTO_OK, .topic = "topic", .gen = &g,
                                     .queued_ms = 1e300, .infer_ms = 1e300, .total_ms = 1e300,
                                     .partition = INT32_MAX, .offset = INT64_MAX};
            unsigned char *body;
            size_t blen;
            assert_int_equal(codec_encode_result(&r, &body, &blen), 0);
            struct codec_result_size s = {.enc = r.enc, .id_len = 200, .model_len = 100,
                                          .topic_len = 5, .gen_tokens = toks,
                                          .gen_token_bytes = tb, .gen_logprobs = round % 2};
            size_t bound = codec_result_max_bytes(&s);
            if (blen > bound) fail_msg("round %d %s: %zu bytes over the bound %zu", round,
                                       mp ? "mp" : "json", blen, bound);
            free(body);
        }
        free(text);
        free(tok);
        free(lp);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_results),
        cmocka_unit_test(test_result_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

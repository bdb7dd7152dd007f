/* test_smoke_gen.c - `kinfer smoke`'s generation mode without a worker
 * (tools/smoke_gen.h): the jobs it sends are jobs the worker's codec takes
 * with the fields smoke meant, in both encodings; a result body comes back
 * through smoke_gen_decode as it went in; and smoke_gen_check accepts a
 * correct answer (random texts, cut into random stream pieces) and rejects
 * each way of breaking the contract, on results made by hand. `make demo`
 * runs the mode against a real worker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "../codecs/codec.h"
#include "../tools/smoke_gen.h"
#include "testutil.h"

static const struct smoke_gen_model M = {.vocab = 100, .ctx = 512};

/* Smoke's job i of run seed 77. */
static json_t *job(size_t i)
{
    char id[64];
    snprintf(id, sizeof(id), "smoke-gen-77-%zu", i);
    json_t *j = smoke_gen_job(77, i, id, "llm");
    assert_non_null(j);
    return j;
}

/* A correct answer to j: text, n tokens, fin; logprobs when asked. */
static json_t *answer(const json_t *j, const char *text, size_t n, const char *fin)
{
    json_t *toks = json_array(), *lp = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer((json_int_t)(tu_rand64() % M.vocab)));
        json_array_append_new(lp, json_real(-(double)tu_randf(0.0f, 5.0f)));
    }
    json_t *r = json_pack("{s:O, s:s, s:s, s:s, s:o, s:s, s:{s:i, s:I}, s:{s:f, s:f, s:f}}", "id",
                          json_object_get(j, "id"), "model", "llm", "status", "ok", "text", text,
                          "tokens", toks, "finish_reason", fin, "usage", "prompt_tokens", 7,
                          "completion_tokens", (json_int_t)n, "timing", "total_ms", 12.5,
                          "ttft_ms", 3.0, "decode_tokens_per_s", 250.0);
    assert_non_null(r);
    if (json_is_true(json_object_get(j, "logprobs"))) json_object_set_new(r, "logprobs", lp);
    else json_decref(lp);
    return r;
}

/* The stream of a correct answer: start, text cut at the byte offsets
 * cuts[0..n_cuts) (each at a character boundary), done. */
static json_t *stream_of(const char *text, const size_t *cuts, size_t n_cuts, const char *fin)
{
    json_t *s = json_pack("[[s, s]]", "start", "1");
    size_t at = 0, len = strlen(text);
    for (size_t k = 0; k <= n_cuts; k++) {
        size_t end = k < n_cuts ? cuts[k] : len;
        if (end > at) json_array_append_new(s, json_pack("[s, s%]", "text", text + at, end - at));
        at = end;
    }
    json_array_append_new(s, json_pack("[s, s, s, s]", "done", "1", "finish_reason", fin));
    return s;
}

static int check(const json_t *j, const json_t *r, const json_t *s, char *why)
{
    return smoke_gen_check(j, r, s, &M, why, 512);
}

/* Every job smoke sends decodes in the worker's codec as a generation job
 * with smoke's fields, JSON and MessagePack alike, and comes back through
 * smoke_gen_decode unchanged. */
static void test_jobs_reach_the_codec(void **state)
{
    (void)state;
    static const struct codec_limits lim = {.max_payload_bytes = 1 << 20,
                                            .max_input_floats = 1 << 16, .max_depth = 16,
                                            .max_rows = 8, .max_text_chars = 4096,
                                            .max_tokens = 4096};
    size_t streamed = 0, chats = 0;
    for (size_t i = 0; i < 40; i++) {
        json_t *j = job(i);
        if (smoke_gen_twin(i)) {
            json_t *prev = job(i - 1);
            json_object_del(prev, "id");
            json_t *same = json_deep_copy(j);
            json_object_del(same, "id");
            assert_true(json_equal(prev, same));
            json_decref(prev);
            json_decref(same);
        }
        for (int e = 0; e < 2; e++) {
            unsigned char *body;
            size_t len;
            char err[256];
            assert_int_equal(smoke_gen_encode(j, e ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK, &body,
                                              &len), 0);
            assert_true(len > 0);
            json_t *back = smoke_gen_decode(body, len, err, sizeof(err));
            assert_non_null(back);
            assert_true(json_equal(back, j));
            json_decref(back);
            struct codec_request r;
            memset(&r, 0, sizeof(r));
            assert_int_equal(codec_decode_job(body, len, NULL, 0, NULL, 1000, &lim, &r, err,
                                              sizeof(err)), CODEC_JOB);
            assert_non_null(r.gen);
            assert_string_equal(r.id, json_string_value(json_object_get(j, "id")));
            size_t max = (size_t)json_integer_value(json_object_get(j, "max_tokens"));
            assert_true(max >= 2 && max <= 17);
            assert_int_equal(r.gen->max_tokens, max);
            assert_int_equal(r.gen->stream, json_is_true(json_object_get(j, "stream")));
            size_t b = smoke_gen_twin(i) ? i - 1 : i;
            assert_int_equal(r.gen->n_stop, r.gen->stream ? (b % 8 == 2 ? 1 : 2) : 0);
            assert_int_equal(!!r.gen->prompt, json_is_string(json_object_get(j, "prompt")));
            if (e) streamed += r.gen->stream, chats += r.gen->n_msgs > 0;
            codec_request_fini(&r);
            free(body);
        }
        json_decref(j);
    }
    assert_true(streamed >= 8 && chats >= 16);
}

/* Correct answers pass: random UTF-8 texts free of the stop strings, the
 * stream cut at random character boundaries, every finish reason. */
static void test_check_accepts(void **state)
{
    (void)state;
    static const char *const pieces[] = {"a", "b", "z", " ", "\xc3\xa9", "\xe6\x95\xb0",
                                         "\xf0\x9f\x90\x89", "\t", "\\", "\""};
    char why[512];
    for (int round = 0; round < 200; round++) {
        size_t i = (size_t)(tu_rand64() % 40);
        json_t *j = job(i);
        size_t max = (size_t)json_integer_value(json_object_get(j, "max_tokens"));
        char text[256];
        size_t at = 0, cuts[64], n_cuts = 0;
        size_t n_pieces = (size_t)(tu_rand64() % 30);
        for (size_t k = 0; k < n_pieces; k++) {
            const char *p = pieces[tu_rand64() % 10];
            memcpy(text + at, p, strlen(p));
            at += strlen(p);
            if (tu_rand64() % 3 == 0 && n_cuts < 64) cuts[n_cuts++] = at;
        }
        text[at] = '\0';
        const char *fin = json_object_get(j, "stop") && tu_rand64() % 2 ? "stop" : "length";
        size_t n = strcmp(fin, "length") == 0 ? max : (size_t)(tu_rand64() % (max + 1));
        if (tu_rand64() % 4 == 0) fin = "eos", n = (size_t)(tu_rand64() % max);
        json_t *r = answer(j, text, n, fin);
        json_t *s = stream_of(text, cuts, n_cuts, fin);
        if (check(j, r, s, why) != 0) fail_msg("job %zu: %s", i, why);
        /* The result body in either encoding, decoded as smoke decodes it. */
        unsigned char *body;
        size_t len;
        assert_int_equal(smoke_gen_encode(r, tu_rand64() % 2 ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK,
                                          &body, &len), 0);
        json_t *back = smoke_gen_decode(body, len, why, sizeof(why));
        assert_non_null(back);
        assert_int_equal(check(j, back, s, why), 0);
        json_decref(back);
        free(body);
        json_decref(r);
        json_decref(s);
        json_decref(j);
    }
}

/* One way to break a correct answer (job 2: streamed, stop "e", sampled;
 * job 4: logprobs; both with max_tokens from smoke_gen_job). */
struct breakage {
    size_t job;
    const char *name;
    const char *why; /* a substring of the reason */
    void (*apply)(json_t *job, json_t *res, json_t *stream);
};

static void set(json_t *o, const char *k, json_t *v)
{
    json_object_set_new(o, k, v);
}

static void b_status(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    set(r, "status", json_string("error"));
    set(r, "error", json_pack("{s:s, s:s}", "code", "invalid_input", "message", "bad"));
}
static void b_id(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    set(r, "id", json_string("someone-else"));
}
static void b_too_many(json_t *j, json_t *r, json_t *s)
{
    (void)s;
    json_t *t = json_object_get(r, "tokens");
    while (json_array_size(t) <= (size_t)json_integer_value(json_object_get(j, "max_tokens")))
        json_array_append_new(t, json_integer(1));
    set(json_object_get(r, "usage"), "completion_tokens", json_integer((json_int_t)json_array_size(t)));
}
static void b_id_vocab(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_array_set_new(json_object_get(r, "tokens"), 0, json_integer((json_int_t)M.vocab));
}
static void b_id_negative(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_array_set_new(json_object_get(r, "tokens"), 0, json_integer(-1));
}
static void b_id_real(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_array_set_new(json_object_get(r, "tokens"), 0, json_real(1.0));
}
static void b_usage(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_t *u = json_object_get(r, "usage");
    set(u, "completion_tokens", json_integer(json_integer_value(json_object_get(u, "completion_tokens")) + 1));
}
static void b_prompt_tokens(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    set(json_object_get(r, "usage"), "prompt_tokens", json_integer(0));
}
static void b_finish(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    set(r, "finish_reason", json_string("deadline"));
}
static void b_eos_at_max(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    set(r, "finish_reason", json_string("eos"));
}
static void b_length_short(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_array_remove(json_object_get(r, "tokens"), 0);
    set(json_object_get(r, "usage"), "completion_tokens",
        json_integer((json_int_t)json_array_size(json_object_get(r, "tokens"))));
    if (json_object_get(r, "logprobs")) json_array_remove(json_object_get(r, "logprobs"), 0);
}
static void b_stop_unasked(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    set(r, "finish_reason", json_string("stop"));
}
static void b_holds_stop(json_t *j, json_t *r, json_t *s)
{
    (void)j;
    set(r, "text", json_string("abc e"));
    json_array_set_new(s, 1, json_pack("[s, s]", "text", "abc e"));
}
static void b_no_ttft(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_object_del(json_object_get(r, "timing"), "ttft_ms");
}
static void b_no_logprobs(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_object_del(r, "logprobs");
}
static void b_positive_logprob(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    json_array_set_new(json_object_get(r, "logprobs"), 0, json_real(0.5));
}
static void b_unasked_logprobs(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)s;
    set(r, "logprobs", json_array());
}
static void b_no_start(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)r;
    json_array_remove(s, 0);
}
static void b_no_done(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)r;
    json_array_remove(s, json_array_size(s) - 1);
}
static void b_piece_differs(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)r;
    json_array_set_new(s, 1, json_pack("[s, s]", "text", "abX"));
}
static void b_piece_missing(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)r;
    json_array_remove(s, 2);
}
static void b_piece_extra(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)r;
    json_array_insert_new(s, 2, json_pack("[s, s]", "text", "!"));
}
static void b_done_other(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)r;
    json_array_set_new(s, json_array_size(s) - 1,
                       json_pack("[s, s, s, s]", "done", "1", "finish_reason", "eos"));
}
static void b_no_stream(json_t *j, json_t *r, json_t *s)
{
    (void)j, (void)r;
    json_array_clear(s);
}

static void test_check_rejects(void **state)
{
    (void)state;
    static const struct breakage cases[] = {
        {2, "status", "status error: invalid_input: bad", b_status},
        {2, "id", "another id", b_id},
        {2, "too many tokens", "more than max_tokens", b_too_many},
        {2, "id = vocab", "not an id in [0, 100)", b_id_vocab},
        {2, "id < 0", "not an id", b_id_negative},
        {2, "id a real", "not an id", b_id_real},
        {2, "completion_tokens", "completion_tokens", b_usage},
        {2, "prompt_tokens", "prompt_tokens", b_prompt_tokens},
        {2, "finish deadline", "not eos, stop or length", b_finish},
        {2, "eos at max", "eos at max_tokens", b_eos_at_max},
        {2, "length short", "finish_reason length after", b_length_short},
        {4, "stop unasked", "gave no stop", b_stop_unasked},
        {2, "text holds stop", "stop string", b_holds_stop},
        {2, "no ttft", "ttft_ms", b_no_ttft},
        {4, "no logprobs", "one per token", b_no_logprobs},
        {4, "logprob > 0", "logprobs[0]", b_positive_logprob},
        {2, "logprobs unasked", "did not ask", b_unasked_logprobs},
        {2, "no start", "want start", b_no_start},
        {2, "no done", "want done", b_no_done},
        {2, "piece differs", "does not continue", b_piece_differs},
        {2, "piece missing", "pieces hold", b_piece_missing},
        {2, "piece extra", "does not continue", b_piece_extra},
        {2, "done differs", "another finish_reason", b_done_other},
        {2, "empty stream", "entries", b_no_stream},
    };
    char why[512];
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        json_t *j = job(cases[k].job);
        size_t max = (size_t)json_integer_value(json_object_get(j, "max_tokens"));
        assert_int_equal(json_is_true(json_object_get(j, "stream")), cases[k].job == 2);
        assert_int_equal(json_is_true(json_object_get(j, "logprobs")), cases[k].job == 4);
        json_t *r = answer(j, "abc xyz", max, "length");
        size_t cuts[] = {3};
        json_t *s = stream_of("abc xyz", cuts, 1, "length");
        if (check(j, r, s, why) != 0) fail_msg("%s: the unbroken answer fails: %s", cases[k].name, why);
        cases[k].apply(j, r, s);
        why[0] = '\0';
        if (check(j, r, s, why) == 0) fail_msg("%s: accepted", cases[k].name);
        if (!strstr(why, cases[k].why))
            fail_msg("%s: reason \"%s\", want \"%s\"", cases[k].name, why, cases[k].why);
        json_decref(r);
        json_decref(s);
        json_decref(j);
    }
    /* A streamed job's stream must have been read at all. */
    json_t *j = job(2);
    json_t *r = answer(j, "x", 1, "stop");
    assert_int_equal(check(j, r, NULL, why), -1);
    assert_non_null(strstr(why, "no entries"));
    json_decref(r);
    json_decref(j);
}

/* Bodies smoke must refuse: text that is not UTF-8, bytes after the
 * value, a bin, a non-str key, neither encoding. */
static void test_decode_rejects(void **state)
{
    (void)state;
    char why[256];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    for (int k = 0; k < 4; k++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 1);
        if (k == 3) msgpack_pack_int(&pk, 1);
        else msgpack_pack_str_with_body(&pk, "text", 4);
        if (k == 0) msgpack_pack_str_with_body(&pk, "ok \xc3", 4);
        else if (k == 2) msgpack_pack_bin_with_body(&pk, "ab", 2);
        else msgpack_pack_str_with_body(&pk, "ok", 2);
        if (k == 1) msgpack_pack_nil(&pk);
        why[0] = '\0';
        assert_null(smoke_gen_decode(sb.data, sb.size, why, sizeof(why)));
        assert_true(why[0] != '\0');
        msgpack_sbuffer_destroy(&sb);
    }
    assert_null(smoke_gen_decode("{\"text\": \"\xff\"}", 13, why, sizeof(why)));
    assert_null(smoke_gen_decode("{\"text\": 1", 10, why, sizeof(why)));
    assert_null(smoke_gen_decode("", 0, why, sizeof(why)));
    json_t *ok = smoke_gen_decode("{\"text\": \"\\u00e9\"}", 18, why, sizeof(why));
    assert_non_null(ok);
    assert_string_equal(json_string_value(json_object_get(ok, "text")), "\xc3\xa9");
    json_decref(ok);
    /* U+0000 is text a byte-level vocabulary can generate, in either encoding. */
    ok = smoke_gen_decode("{\"text\": \"a\\u0000b\"}", 20, why, sizeof(why));
    if (!ok) fail_msg("a JSON text with U+0000: %s", why);
    assert_int_equal(json_string_length(json_object_get(ok, "text")), 3);
    unsigned char *body;
    size_t len;
    assert_int_equal(smoke_gen_encode(ok, PROTO_ENC_MSGPACK, &body, &len), 0);
    json_t *mp = smoke_gen_decode(body, len, why, sizeof(why));
    assert_non_null(mp);
    assert_true(json_equal(mp, ok));
    json_decref(mp);
    free(body);
    json_decref(ok);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_reach_the_codec),
        cmocka_unit_test(test_check_accepts),
        cmocka_unit_test(test_check_rejects),
        cmocka_unit_test(test_decode_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* smoke_gencheck.c - the client side of a generation smoke run
 * (smoke_gen.h): the jobs it sends, their encoding, the decoding of a
 * result body, and the check of an answer against docs/protocol.md's
 * "Generation jobs". Nothing here talks to Kafka or Redis.
 *
 * Threads: any; no shared state. */
#include "smoke_gen.h"

#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"

#define MP_MAX_DEPTH 16

static int fail(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills why and returns -1, so that a check reads `return fail(...)`. */
static int fail(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

int smoke_gen_model_read(const char *dir, struct smoke_gen_model *m, char *why, size_t cap)
{
    char path[4200];
    json_error_t e;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_t *cfg = json_load_file(path, 0, &e);
    if (!cfg) return fail(why, cap, "%s: %s", path, e.text);
    json_int_t v = json_integer_value(json_object_get(cfg, "vocab_size"));
    json_int_t ctx = json_integer_value(json_object_get(cfg, "max_position_embeddings"));
    json_decref(cfg);
    if (v <= 0) return fail(why, cap, "%s: no positive vocab_size", path);
    m->vocab = (size_t)v;
    m->ctx = ctx > 0 ? (size_t)ctx : 0;
    return 0;
}

/* ---- the jobs ------------------------------------------------------------------ */

static const char *const prompts[] = {
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away,",
    "Caf\xc3\xa9 au lait, s'il vous pla\xc3\xaet: ",
    "Daten flie\xc3\x9f" "en durch kinfer \xe2\x86\x92 ",
    "\xe6\x95\xb0\xe6\x8d\xae and tokens \xf0\x9f\x90\x89 ",
    "Write one line about Kafka and Redis.",
};
#define N_PROMPTS (sizeof(prompts) / sizeof(prompts[0]))

int smoke_gen_twin(size_t i)
{
    return i % 10 == 1 || i % 10 == 6;
}

/* The job whose fields job i takes: itself, or the one it repeats. */
static size_t base_of(size_t i)
{
    return smoke_gen_twin(i) ? i - 1 : i;
}

json_t *smoke_gen_job(uint64_t run_seed, size_t i, const char *id, const char *model)
{
    size_t b = base_of(i);
    json_t *j = json_object();
    if (!j) return NULL;
    int r = json_object_set_new(j, "id", json_string(id));
    if (model) r |= json_object_set_new(j, "model", json_string(model));
    const char *p = prompts[(b / 2) % N_PROMPTS];
    if (b % 2 == 0) {
        r |= json_object_set_new(j, "prompt", json_string(p));
    } else {
        json_t *msgs = b % 4 == 1 ? json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system",
                                              "content", "You answer in one line.", "role",
                                              "user", "content", p)
                                  : json_pack("[{s:s, s:s}]", "role", "user", "content", p);
        r |= json_object_set_new(j, "messages", msgs);
    }
    r |= json_object_set_new(j, "max_tokens", json_integer((json_int_t)(2 + (b * 7) % 16)));
    uint64_t s = (run_seed ^ (b * 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
    r |= json_object_set_new(j, "seed", json_integer((json_int_t)((s >> 33) & 0x7fffffff)));
    if (b % 3 == 0) {
        r |= json_object_set_new(j, "temperature", json_real(0.0));
    } else if (b % 3 == 1) {
        r |= json_object_set_new(j, "temperature", json_real(0.8));
        r |= json_object_set_new(j, "top_k", json_integer(40));
    } else {
        r |= json_object_set_new(j, "temperature", json_real(1.0));
        r |= json_object_set_new(j, "top_p", json_real(0.9));
        r |= json_object_set_new(j, "min_p", json_real(0.02));
    }
    if (b % 4 == 2) {
        r |= json_object_set_new(j, "stream", json_true());
        r |= json_object_set_new(j, "stop", b % 8 == 2 ? json_string("e")
                                                       : json_pack("[s, s]", "o", "\n"));
    }
    if (b % 5 == 4) r |= json_object_set_new(j, "logprobs", json_true());
    if (r) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* ---- encoding and decoding ---------------------------------------------------- */

/* Packs a JSON value as MessagePack. Returns nonzero when out of memory. */
static int pack_js(msgpack_packer *pk, const json_t *v)
{
    int r = 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *e;
        r |= msgpack_pack_map(pk, json_object_size(v));
        json_object_foreach((json_t *)v, k, e) {
            r |= msgpack_pack_str_with_body(pk, k, strlen(k));
            r |= pack_js(pk, e);
        }
        return r;
    }
    case JSON_ARRAY:
        r |= msgpack_pack_array(pk, json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++) r |= pack_js(pk, json_array_get(v, i));
        return r;
    case JSON_STRING:
        return msgpack_pack_str_with_body(pk, json_string_value(v), json_string_length(v));
    case JSON_INTEGER: return msgpack_pack_int64(pk, json_integer_value(v));
    case JSON_REAL: return msgpack_pack_double(pk, json_real_value(v));
    case JSON_TRUE: return msgpack_pack_true(pk);
    case JSON_FALSE: return msgpack_pack_false(pk);
    case JSON_NULL: return msgpack_pack_nil(pk);
    }
    return -1;
}

int smoke_gen_encode(const json_t *job, enum proto_enc enc, unsigned char **out, size_t *len)
{
    if (enc == PROTO_ENC_JSON) {
        char *s = json_dumps(job, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s) return -1;
        *out = (unsigned char *)s;
        *len = strlen(s);
        return 0;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (pack_js(&pk, job) != 0) {
        msgpack_sbuffer_destroy(&sb);
        return -1;
    }
    *len = sb.size; /* release empties sb */
    *out = (unsigned char *)msgpack_sbuffer_release(&sb);
    msgpack_sbuffer_destroy(&sb);
    return *out ? 0 : -1;
}

/* A MessagePack object as JSON; NULL with why filled when it has no JSON
 * form smoke accepts (see smoke_gen_decode). */
static json_t *mp_js(const msgpack_object *o, int depth, char *why, size_t cap)
{
    if (depth > MP_MAX_DEPTH) {
        fail(why, cap, "nested deeper than %d", MP_MAX_DEPTH);
        return NULL;
    }
    json_t *v = NULL;
    switch (o->type) {
    case MSGPACK_OBJECT_MAP:
        v = json_object();
        for (uint32_t i = 0; v && i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR || !utf8_valid(k->via.str.ptr, k->via.str.size) ||
                memchr(k->via.str.ptr, 0, k->via.str.size)) {
                fail(why, cap, "a map key is not a UTF-8 str");
                json_decref(v);
                return NULL;
            }
            json_t *e = mp_js(&o->via.map.ptr[i].val, depth + 1, why, cap);
            char key[256];
            snprintf(key, sizeof(key), "%.*s", (int)k->via.str.size, k->via.str.ptr);
            if (!e || json_object_set_new(v, key, e) < 0) {
                if (e) fail(why, cap, "out of memory");
                json_decref(v);
                return NULL;
            }
        }
        break;
    case MSGPACK_OBJECT_ARRAY:
        v = json_array();
        for (uint32_t i = 0; v && i < o->via.array.size; i++) {
            json_t *e = mp_js(&o->via.array.ptr[i], depth + 1, why, cap);
            if (!e || json_array_append_new(v, e) < 0) {
                if (e) fail(why, cap, "out of memory");
                json_decref(v);
                return NULL;
            }
        }
        break;
    case MSGPACK_OBJECT_STR:
        if (!utf8_valid(o->via.str.ptr, o->via.str.size)) {
            fail(why, cap, "a str is not valid UTF-8");
            return NULL;
        }
        v = json_stringn(o->via.str.ptr, o->via.str.size);
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX) {
            fail(why, cap, "an integer above 2^63 - 1");
            return NULL;
        }
        v = json_integer((json_int_t)o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: v = json_integer((json_int_t)o->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: v = json_real(o->via.f64); break;
    case MSGPACK_OBJECT_BOOLEAN: v = json_boolean(o->via.boolean); break;
    case MSGPACK_OBJECT_NIL: v = json_null(); break;
    default: fail(why, cap, "a bin or extension value"); return NULL;
    }
    if (!v) fail(why, cap, "out of memory");
    return v;
}

json_t *smoke_gen_decode(const void *body, size_t len, char *why, size_t cap)
{
    const char *b = body;
    if (len && b[0] == '{') {
        json_error_t e;
        /* A byte-level vocabulary can generate U+0000: valid text. */
        json_t *j = json_loadb(b, len, JSON_ALLOW_NUL, &e);
        if (!j) fail(why, cap, "not JSON: %s", e.text);
        return j;
    }
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    json_t *j = NULL;
    if (msgpack_unpack_next(&up, b, len, &off) != MSGPACK_UNPACK_SUCCESS)
        fail(why, cap, "neither JSON nor MessagePack");
    else if (off != len)
        fail(why, cap, "%zu bytes after the MessagePack value", len - off);
    else
        j = mp_js(&up.data, 0, why, cap);
    msgpack_unpacked_destroy(&up);
    return j;
}

/* ---- the check ------------------------------------------------------------------ */

/* The job's stop strings as an array (a string alone becomes one). */
static size_t stops_of(const json_t *job, const char **out, size_t cap)
{
    const json_t *s = json_object_get(job, "stop");
    if (json_is_string(s)) {
        out[0] = json_string_value(s);
        return 1;
    }
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(s) && n < cap; i++)
        if (json_is_string(json_array_get(s, i))) out[n++] = json_string_value(json_array_get(s, i));
    return n;
}

/* The stream's entries against text and finish_reason (smoke_gen_check). */
static int check_stream(const json_t *stream, const char *text, size_t text_len, const char *fin,
                        char *why, size_t cap)
{
    size_t n = json_array_size(stream), at = 0;
    if (n < 2) return fail(why, cap, "stream: %zu entries, want start ... done", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(stream, i);
        size_t nf = json_array_size(e);
        const char *f0 = json_string_value(json_array_get(e, 0));
        const json_t *v0 = json_array_get(e, 1);
        if (!f0 || !json_is_string(v0))
            return fail(why, cap, "stream: entry %zu is not field/value strings", i);
        const char *want = i == 0 ? "start" : i == n - 1 ? "done" : "text";
        if (strcmp(f0, want) != 0)
            return fail(why, cap, "stream: entry %zu is %s, want %s", i,
                        strcmp(f0, "start") == 0 || strcmp(f0, "text") == 0 ||
                                strcmp(f0, "done") == 0 ? f0 : "another field",
                        want);
        if (i == 0 || i == n - 1) {
            if (strcmp(json_string_value(v0), "1") != 0)
                return fail(why, cap, "stream: %s entry's value is not \"1\"", want);
            if (i == 0 && nf != 2) return fail(why, cap, "stream: start entry has other fields");
            continue;
        }
        size_t l = json_string_length(v0);
        if (nf != 2 || l > text_len - at || memcmp(text + at, json_string_value(v0), l) != 0)
            return fail(why, cap, "stream: text entry %zu does not continue the result's text", i);
        at += l;
    }
    if (at != text_len)
        return fail(why, cap, "stream: its text pieces hold %zu bytes, the result's text %zu", at,
                    text_len);
    const json_t *d = json_array_get(stream, n - 1);
    const char *f2 = json_string_value(json_array_get(d, 2));
    const char *v2 = json_string_value(json_array_get(d, 3));
    if (json_array_size(d) != 4 || !f2 || strcmp(f2, "finish_reason") != 0 || !v2)
        return fail(why, cap, "stream: done entry without finish_reason");
    if (strcmp(v2, fin) != 0) return fail(why, cap, "stream: done says another finish_reason");
    return 0;
}

int smoke_gen_check(const json_t *job, const json_t *res, const json_t *stream,
                    const struct smoke_gen_model *m, char *why, size_t cap)
{
    if (!json_is_object(res)) return fail(why, cap, "the result is not a map");
    const char *id = json_string_value(json_object_get(job, "id"));
    const char *rid = json_string_value(json_object_get(res, "id"));
    if (!rid || !id || strcmp(id, rid) != 0) return fail(why, cap, "the result has another id");
    const char *status = json_string_value(json_object_get(res, "status"));
    if (!status || strcmp(status, "ok") != 0) {
        const json_t *e = json_object_get(res, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        return fail(why, cap, "status %s: %s: %s", status ? status : "missing",
                    code ? code : "no code", msg ? msg : "no message");
    }
    const json_t *text = json_object_get(res, "text"), *toks = json_object_get(res, "tokens");
    const char *fin = json_string_value(json_object_get(res, "finish_reason"));
    const json_t *usage = json_object_get(res, "usage");
    if (!json_is_string(text)) return fail(why, cap, "no text string");
    const char *t = json_string_value(text);
    size_t tl = json_string_length(text);
    if (!utf8_valid(t, tl)) return fail(why, cap, "text is not valid UTF-8");
    if (!json_is_array(toks)) return fail(why, cap, "no tokens array");
    if (!fin) return fail(why, cap, "no finish_reason string");
    if (!json_is_object(usage)) return fail(why, cap, "no usage map");

    size_t n = json_array_size(toks);
    json_int_t max = json_integer_value(json_object_get(job, "max_tokens"));
    if (max > 0 && n > (size_t)max)
        return fail(why, cap, "%zu tokens, more than max_tokens %lld", n, (long long)max);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(toks, i);
        json_int_t tok = json_integer_value(v);
        if (!json_is_integer(v) || tok < 0 || (size_t)tok >= m->vocab)
            return fail(why, cap, "token %zu is not an id in [0, %zu)", i, m->vocab);
    }
    const char *stops[8];
    size_t n_stops = stops_of(job, stops, 8);
    for (size_t k = 0; k < n_stops; k++)
        if (stops[k][0] && memmem(t, tl, stops[k], strlen(stops[k])))
            return fail(why, cap, "text holds stop string %zu", k);

    const json_t *ct = json_object_get(usage, "completion_tokens");
    json_int_t pt = json_integer_value(json_object_get(usage, "prompt_tokens"));
    if (!json_is_integer(ct) || json_integer_value(ct) != (json_int_t)n)
        return fail(why, cap, "usage.completion_tokens is not the %zu tokens", n);
    if (pt < 1) return fail(why, cap, "usage.prompt_tokens is not a positive integer");
    int at_max = max > 0 && n == (size_t)max;
    int at_ctx = m->ctx && (size_t)pt + n >= m->ctx;
    if (strcmp(fin, "eos") == 0) {
        if (at_max) return fail(why, cap, "finish_reason eos at max_tokens %lld", (long long)max);
    } else if (strcmp(fin, "stop") == 0) {
        if (!n_stops) return fail(why, cap, "finish_reason stop, but the job gave no stop");
    } else if (strcmp(fin, "length") == 0) {
        if (!at_max && !at_ctx)
            return fail(why, cap, "finish_reason length after %zu of max_tokens %lld", n,
                        (long long)max);
    } else {
        return fail(why, cap, "finish_reason is not eos, stop or length");
    }
    const json_t *tm = json_object_get(res, "timing");
    if (!json_is_number(json_object_get(tm, "ttft_ms")) ||
        !json_is_number(json_object_get(tm, "decode_tokens_per_s")))
        return fail(why, cap, "timing lacks ttft_ms or decode_tokens_per_s");
    const json_t *lp = json_object_get(res, "logprobs");
    if (json_is_true(json_object_get(job, "logprobs"))) {
        if (json_array_size(lp) != n) return fail(why, cap, "logprobs is not one per token");
        for (size_t i = 0; i < n; i++) {
            const json_t *v = json_array_get(lp, i);
            if (!json_is_number(v) || !(json_number_value(v) <= 0.0))
                return fail(why, cap, "logprobs[%zu] is not a number <= 0", i);
        }
    } else if (lp) {
        return fail(why, cap, "logprobs given, but the job did not ask");
    }
    if (json_is_true(json_object_get(job, "stream"))) {
        if (!stream) return fail(why, cap, "stream: no entries read");
        return check_stream(stream, t, tl, fin, why, cap);
    }
    return 0;
}

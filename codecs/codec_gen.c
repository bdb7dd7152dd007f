/* codec_gen.c - the wire contract's generation jobs (docs/protocol.md,
 * "Generation jobs", v1.2): reading `prompt` or `messages` and the
 * sampling parameters of a job, each checked against the contract's
 * ranges (a value out of range is invalid_input naming the field and
 * the range), and writing a generation result's fields.
 *
 * Sizes: the prompt, and the messages' contents together, may take at
 * most max_text_chars characters (worker.max_text_chars); messages at
 * most max_rows (batching.max_job_rows); stop strings at most
 * CODEC_GEN_MAX_STOPS of at most 256 bytes each. Every string must be
 * well-formed UTF-8.
 *
 * Threads: any; no shared state. Ownership: the parse is borrowed; what
 * is kept is copied into the request's codec_gen (codec_gen_free). */
#include "codec.h"
#include "codec_decode.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <msgpack.h>

#include "../base/utf8.h"
#include "gbuf.h"

#define STOP_MAX_BYTES 256

enum { G_PROMPT, G_MESSAGES, G_MAX_TOKENS, G_TEMPERATURE, G_TOP_K, G_TOP_P, G_MIN_P, G_SEED,
       G_STOP, G_LOGPROBS, G_STREAM };

const char *const codec_gen_names[CODEC_GEN_FIELDS] = {
    "prompt", "messages", "max_tokens", "temperature", "top_k", "top_p",
    "min_p",  "seed",     "stop",       "logprobs",    "stream"};

static const char *const role_names[] = {"system", "user", "assistant", "tool"};

const char *codec_role_name(enum codec_role r)
{
    return (unsigned)r < 4 ? role_names[r] : "?";
}

/* A value of either encoding (one of the two set). */
struct gv {
    const json_t *js;
    const msgpack_object *mp;
};

static const char *gv_type(struct gv v)
{
    return v.js ? codec_js_type(v.js) : codec_mp_type(v.mp);
}

/* 1 with *s, *n set when v is a string (not a rewritten number). */
static int gv_str(struct gv v, const char **s, size_t *n)
{
    size_t big;
    if (v.js) {
        if (!json_is_string(v.js) || codec_js_bignum(v.js, &big)) return 0;
        *s = json_string_value(v.js);
        *n = json_string_length(v.js);
        return 1;
    }
    if (v.mp->type != MSGPACK_OBJECT_STR) return 0;
    *s = v.mp->via.str.ptr;
    *n = v.mp->via.str.size;
    return 1;
}

static int gv_is_array(struct gv v)
{
    return v.js ? json_is_array(v.js) : v.mp->type == MSGPACK_OBJECT_ARRAY;
}

static size_t gv_len(struct gv v)
{
    return v.js ? json_array_size(v.js) : v.mp->via.array.size;
}

static struct gv gv_elem(struct gv v, size_t i)
{
    struct gv e = {NULL, NULL};
    if (v.js) e.js = json_array_get(v.js, i);
    else e.mp = &v.mp->via.array.ptr[i];
    return e;
}

/* The member name of map v, or {NULL, NULL}; *is_map says whether v is one. */
static struct gv gv_member(struct gv v, const char *name, int *is_map)
{
    struct gv e = {NULL, NULL};
    if (v.js) {
        *is_map = json_is_object(v.js);
        if (*is_map) e.js = json_object_get(v.js, name);
        return e;
    }
    *is_map = v.mp->type == MSGPACK_OBJECT_MAP;
    size_t n = strlen(name);
    for (uint32_t i = 0; *is_map && i < v.mp->via.map.size; i++) {
        const msgpack_object *k = &v.mp->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
            memcmp(k->via.str.ptr, name, n) == 0)
            e.mp = &v.mp->via.map.ptr[i].val;
    }
    return e;
}

/* 1 with *out set when v is a boolean. */
static int gv_bool(struct gv v, int *out)
{
    if (v.js) {
        if (!json_is_boolean(v.js)) return 0;
        *out = json_is_true(v.js);
        return 1;
    }
    if (v.mp->type != MSGPACK_OBJECT_BOOLEAN) return 0;
    *out = v.mp->via.boolean;
    return 1;
}

/* An integer: 1 with *i (a value in int64) or *u (above INT64_MAX, *big
 * set) set; 0 when v is no integer (a rewritten big number is one, too
 * big either way: *big = 2). */
static int gv_int(struct gv v, int64_t *i, uint64_t *u, int *big)
{
    size_t n;
    *big = 0;
    if (v.js) {
        const char *num = codec_js_bignum(v.js, &n);
        if (num) {
            for (size_t k = 0; k < n; k++)
                if (num[k] == '.' || num[k] == 'e' || num[k] == 'E') return 0;
            *big = 2;
            return 1;
        }
        if (!json_is_integer(v.js)) return 0;
        *i = json_integer_value(v.js);
        *u = (uint64_t)*i;
        return 1;
    }
    if (v.mp->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *u = v.mp->via.u64;
        *big = *u > INT64_MAX;
        *i = *big ? INT64_MAX : (int64_t)*u;
        return 1;
    }
    if (v.mp->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *i = v.mp->via.i64;
        *u = (uint64_t)*i;
        return 1;
    }
    return 0;
}

/* A number (integer or real) as a double; 0 when v is none (a rewritten
 * real beyond the double range is +-inf). */
static int gv_num(struct gv v, double *d)
{
    size_t n;
    if (v.js) {
        const char *num = codec_js_bignum(v.js, &n);
        if (num) {
            *d = num[0] == '-' ? -INFINITY : INFINITY;
            return 1;
        }
        if (!json_is_number(v.js)) return 0;
        *d = json_number_value(v.js);
        return 1;
    }
    switch (v.mp->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *d = (double)v.mp->via.u64; return 1;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *d = (double)v.mp->via.i64; return 1;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *d = v.mp->via.f64; return 1;
    default: return 0;
    }
}

void codec_gen_free(struct codec_gen *g)
{
    if (!g) return;
    free(g->prompt);
    free(g->roles);
    free(g->content);
    free(g->content_off);
    for (size_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g);
}

/* Characters in a valid UTF-8 string. */
static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* prompt: a non-empty UTF-8 string within the character cap. */
static int take_prompt(struct codec_request *j, struct codec_gen *g, struct gv v,
                       const struct codec_limits *lim)
{
    const char *s;
    size_t n;
    if (!gv_str(v, &s, &n))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field prompt: must be a string, got %s",
                          gv_type(v));
    if (n == 0) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field prompt: empty");
    if (!utf8_valid(s, n))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field prompt: not valid UTF-8");
    if (utf8_chars(s, n) > lim->max_text_chars)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                          "field prompt: more than max_text_chars %zu characters",
                          lim->max_text_chars);
    if (!(g->prompt = malloc(n + 1)))
        return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
    memcpy(g->prompt, s, n);
    g->prompt[n] = '\0';
    g->prompt_len = n;
    return 0;
}

/* messages: a non-empty array of {role, content}, within the caps. */
static int take_messages(struct codec_request *j, struct codec_gen *g, struct gv v,
                         const struct codec_limits *lim)
{
    if (!gv_is_array(v))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                          "field messages: must be an array of {role, content}, got %s",
                          gv_type(v));
    size_t n = gv_len(v), bytes = 0, chars = 0;
    if (n == 0) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field messages: empty array");
    if (n > lim->max_rows)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                          "field messages: %zu messages, more than max_job_rows %zu", n,
                          lim->max_rows);
    for (size_t i = 0; i < n; i++) {
        struct gv m = gv_elem(v, i);
        int is_map;
        struct gv role = gv_member(m, "role", &is_map), content = gv_member(m, "content", &is_map);
        if (!is_map)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field messages: element %zu is %s, not a map", i, gv_type(m));
        const char *s;
        size_t len;
        if (!(role.js || role.mp) || !gv_str(role, &s, &len))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field messages: element %zu: role must be a string", i);
        int known = 0;
        for (size_t r = 0; r < 4; r++)
            known |= len == strlen(role_names[r]) && memcmp(s, role_names[r], len) == 0;
        if (!known) {
            char shown[48];
            utf8_repair(shown, sizeof(shown), s, len < 40 ? len : 40);
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field messages: element %zu: unknown role \"%s\" (system, user, "
                              "assistant or tool)", i, shown);
        }
        if (!(content.js || content.mp) || !gv_str(content, &s, &len))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field messages: element %zu: content must be a string", i);
        if (!utf8_valid(s, len))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field messages: element %zu: content is not valid UTF-8", i);
        bytes += len;
        chars += utf8_chars(s, len);
        if (chars > lim->max_text_chars)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field messages: more than max_text_chars %zu characters of "
                              "content", lim->max_text_chars);
    }
    g->roles = malloc(n);
    g->content = malloc(bytes + 1);
    g->content_off = malloc((n + 1) * sizeof(*g->content_off));
    if (!g->roles || !g->content || !g->content_off)
        return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        struct gv m = gv_elem(v, i);
        int is_map;
        const char *s;
        size_t len;
        gv_str(gv_member(m, "role", &is_map), &s, &len);
        for (unsigned char r = 0; r < 4; r++)
            if (len == strlen(role_names[r]) && memcmp(s, role_names[r], len) == 0) g->roles[i] = r;
        gv_str(gv_member(m, "content", &is_map), &s, &len);
        g->content_off[i] = at;
        memcpy(g->content + at, s, len);
        at += len;
    }
    g->content_off[n] = at;
    g->content[at] = '\0';
    g->n_msgs = n;
    return 0;
}

/* stop: a non-empty string, or an array of at most 8 of them. */
static int take_stop(struct codec_request *j, struct codec_gen *g, struct gv v)
{
    int one = !gv_is_array(v);
    size_t n = one ? 1 : gv_len(v);
    if (n > CODEC_GEN_MAX_STOPS)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                          "field stop: %zu strings, more than %d", n, CODEC_GEN_MAX_STOPS);
    for (size_t i = 0; i < n; i++) {
        struct gv e = one ? v : gv_elem(v, i);
        const char *s;
        size_t len;
        if (!gv_str(e, &s, &len))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field stop: must be a string or an array of strings, got %s",
                              gv_type(e));
        if (len == 0 || len > STOP_MAX_BYTES || memchr(s, '\0', len) || !utf8_valid(s, len))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field stop: string %zu must be 1..%d bytes of UTF-8 without NUL",
                              i, STOP_MAX_BYTES);
        if (!(g->stop[i] = malloc(len + 1)))
            return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
        memcpy(g->stop[i], s, len);
        g->stop[i][len] = '\0';
        g->n_stop = i + 1;
    }
    return 0;
}

/* A real field: a finite number within [lo, hi] (lo_open / hi_open make
 * that end open). */
static int take_real(struct codec_request *j, const char *name, struct gv v, double lo,
                     int lo_open, double hi, int hi_open, float *out)
{
    double d;
    if (!gv_num(v, &d))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: must be a number, got %s", name,
                          gv_type(v));
    if (!isfinite(d) || d < lo || (lo_open && d == lo) || d > hi || (hi_open && d == hi))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: must be in %c%g, %g%c, got %g",
                          name, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', d);
    *out = (float)d;
    return 0;
}

/* The parameters after prompt / messages, each only when present. */
static int take_params(struct codec_request *j, struct codec_gen *g, const struct gv *p)
{
    int64_t i;
    uint64_t u;
    int big;
    struct gv v = p[G_MAX_TOKENS];
    if (v.js || v.mp) {
        if (!gv_int(v, &i, &u, &big))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field max_tokens: must be an integer, got %s", gv_type(v));
        if (big || i < 1 || i > INT32_MAX)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field max_tokens: must be an integer >= 1");
        g->max_tokens = (size_t)i;
    }
    v = p[G_TEMPERATURE];
    if ((v.js || v.mp) && take_real(j, "temperature", v, 0, 0, 1e6, 0, &g->temperature) < 0)
        return -1;
    v = p[G_TOP_K];
    if (v.js || v.mp) {
        if (!gv_int(v, &i, &u, &big) || big || i < 0 || i > INT32_MAX)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field top_k: must be an integer >= 0, got %s", gv_type(v));
        g->top_k = (uint32_t)i;
    }
    v = p[G_TOP_P];
    if ((v.js || v.mp) && take_real(j, "top_p", v, 0, 1, 1, 0, &g->top_p) < 0) return -1;
    v = p[G_MIN_P];
    if ((v.js || v.mp) && take_real(j, "min_p", v, 0, 0, 1, 1, &g->min_p) < 0) return -1;
    v = p[G_SEED];
    if (v.js || v.mp) {
        if (!gv_int(v, &i, &u, &big) || big == 2)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                              "field seed: must be an integer of 64 bits, got %s", gv_type(v));
        g->seed = u;
    }
    v = p[G_STOP];
    if ((v.js || v.mp) && take_stop(j, g, v) < 0) return -1;
    const char *bools[] = {"logprobs", "stream"};
    int *outs[] = {&g->logprobs, &g->stream};
    for (size_t k = 0; k < 2; k++) {
        v = p[G_LOGPROBS + k];
        if ((v.js || v.mp) && !gv_bool(v, outs[k]))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: must be a boolean, got %s",
                              bools[k], gv_type(v));
    }
    return 0;
}

int codec_take_gen(struct codec_request *j, const struct fields *f,
                   const struct codec_limits *lim)
{
    struct gv p[CODEC_GEN_FIELDS];
    for (size_t k = 0; k < CODEC_GEN_FIELDS; k++) p[k] = (struct gv){f->js_gen[k], f->mp_gen[k]};
    int has_prompt = p[G_PROMPT].js || p[G_PROMPT].mp;
    int has_msgs = p[G_MESSAGES].js || p[G_MESSAGES].mp;
    if (!has_prompt && !has_msgs) return 0;
    if (has_prompt && has_msgs)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                          "fields prompt and messages: a job gives exactly one of them");
    if (f->mp_input || f->js_input || f->mp_text || f->js_text || f->mp_tokens || f->js_tokens)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                          "field %s: a generation job gives no input, text or tokens",
                          has_prompt ? "prompt" : "messages");
    struct codec_gen *g = calloc(1, sizeof(*g));
    if (!g) return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
    g->temperature = -1.0f;
    g->top_p = 1.0f;
    int rc = has_prompt ? take_prompt(j, g, p[G_PROMPT], lim)
                        : take_messages(j, g, p[G_MESSAGES], lim);
    if (rc == 0) rc = take_params(j, g, p);
    if (rc < 0) {
        codec_gen_free(g);
        return -1;
    }
    j->gen = g;
    return 1;
}

/* ---- results ---------------------------------------------------------------- */

int codec_gen_mp_entries(const struct codec_gen_result *g)
{
    return 4 + (g->logprobs ? 1 : 0);
}

int codec_gen_put_mp(msgpack_packer *pk, const struct codec_gen_result *g)
{
    int r = 0;
    r |= gbuf_mp_str_n(pk, "text", 4);
    r |= gbuf_mp_str_n(pk, g->text, g->text_len);
    r |= gbuf_mp_str_n(pk, "tokens", 6);
    r |= msgpack_pack_array(pk, g->n_tokens);
    for (size_t i = 0; i < g->n_tokens; i++) r |= msgpack_pack_int32(pk, g->tokens[i]);
    r |= gbuf_mp_str_n(pk, "finish_reason", 13);
    r |= gbuf_mp_str_n(pk, g->finish_reason, strlen(g->finish_reason));
    r |= gbuf_mp_str_n(pk, "usage", 5);
    r |= msgpack_pack_map(pk, 2);
    r |= gbuf_mp_str_n(pk, "prompt_tokens", 13);
    r |= msgpack_pack_uint64(pk, g->prompt_tokens);
    r |= gbuf_mp_str_n(pk, "completion_tokens", 17);
    r |= msgpack_pack_uint64(pk, g->completion_tokens);
    if (g->logprobs) {
        r |= gbuf_mp_str_n(pk, "logprobs", 8);
        r |= msgpack_pack_array(pk, g->n_tokens);
        for (size_t i = 0; i < g->n_tokens; i++)
            r |= isfinite(g->logprobs[i]) ? msgpack_pack_float(pk, g->logprobs[i])
                                          : msgpack_pack_nil(pk);
    }
    return r ? -1 : 0;
}

/* Appends s (NUL-terminated) as it is. */
static int put(struct gbuf *b, const char *s)
{
    return gbuf_put(b, s, strlen(s));
}

int codec_gen_put_js(struct gbuf *b, const struct codec_gen_result *g)
{
    int r = put(b, ",\"text\":");
    json_t *t = json_stringn(g->text, g->text_len);
    if (!t) return -1;
    r |= json_dump_callback(t, gbuf_json_write, b, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(t);
    r |= put(b, ",\"tokens\":[");
    char s[64];
    for (size_t i = 0; i < g->n_tokens && r == 0; i++) {
        int n = snprintf(s, sizeof(s), "%s%" PRId32, i ? "," : "", g->tokens[i]);
        r |= gbuf_put(b, s, (size_t)n);
    }
    r |= put(b, "],\"finish_reason\":\"");
    r |= put(b, g->finish_reason);
    int n = snprintf(s, sizeof(s), "\",\"usage\":{\"prompt_tokens\":%zu,", g->prompt_tokens);
    r |= gbuf_put(b, s, (size_t)n);
    n = snprintf(s, sizeof(s), "\"completion_tokens\":%zu}", g->completion_tokens);
    r |= gbuf_put(b, s, (size_t)n);
    if (g->logprobs) {
        r |= put(b, ",\"logprobs\":[");
        for (size_t i = 0; i < g->n_tokens && r == 0; i++) {
            size_t len = 0;
            if (i) s[len++] = ',';
            len += codec_format_float(s + len, sizeof(s) - len, g->logprobs[i]);
            r |= gbuf_put(b, s, len);
        }
        r |= put(b, "]");
    }
    return r ? -1 : 0;
}

/* a + b and a * b, saturating at SIZE_MAX. */
static size_t g_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t g_mul(size_t a, size_t b)
{
    return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

/* Keys, finish_reason, usage and the two timings: 256 bytes; the text:
 * each token's bytes, each byte at most 3 (U+FFFD for a stray byte) and
 * escaped at most 6 ways over; an id 12 bytes, a log-probability
 * CODEC_JSON_FLOAT_MAX + 1. */
size_t codec_gen_max_bytes(const struct codec_result_size *s)
{
    size_t text = g_mul(g_mul(s->gen_tokens, s->gen_token_bytes), 18);
    size_t per = 12 + (s->gen_logprobs ? CODEC_JSON_FLOAT_MAX + 1 : 0);
    return g_add(g_add(256, g_add(text, 8)), g_mul(s->gen_tokens, per));
}

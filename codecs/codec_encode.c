/* codec_encode.c - the encoding half of the wire contract of
 * docs/protocol.md: a job's result, in the encoding the job came in
 * (MessagePack: output as one bin of little-endian float32; JSON: arrays
 * of numbers), every str well-formed UTF-8.
 *
 * Threads: the executor (or whichever thread holds the job); no shared
 * state. Ownership: the result is borrowed; the body is a new allocation
 * the caller owns, handed over only when complete. */
#include "codec.h"

#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <msgpack.h>

#include "../base/utf8.h"
#include "codec_decode.h"
#include "gbuf.h"

/* Tensors are raw IEEE-754 binary32 on the wire; the byte order is handled
 * explicitly, the format must match the host's. */
_Static_assert(sizeof(float) == 4 && sizeof(uint32_t) == 4 && FLT_RADIX == 2 &&
                   FLT_MANT_DIG == 24 && FLT_MAX_EXP == 128,
               "float must be IEEE-754 binary32");

#if !PROTO_HOST_IS_WIRE_ORDER
/* Writes a float as 4 little-endian bytes whatever the host's order. */
static void put_f32le(unsigned char *d, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    d[0] = (unsigned char)u;
    d[1] = (unsigned char)(u >> 8);
    d[2] = (unsigned char)(u >> 16);
    d[3] = (unsigned char)(u >> 24);
}
#endif

/* The number of output floats, or -1 when the job's output is unusable
 * (overflowing shape, or a shape without data). */
static int output_count(const struct codec_result *j, size_t *n)
{
    size_t per_row = j->out_width;
    if (j->out_tokens) {
        if (!j->lengths || (per_row && j->out_tokens > SIZE_MAX / 4 / per_row)) return -1;
        per_row *= j->out_tokens;
    }
    if (per_row && j->out_rows > SIZE_MAX / 4 / per_row) return -1;
    *n = j->out_rows * per_row;
    if (*n && !j->output) return -1;
    return 0;
}

/* Packs a NUL-terminated string. */
static int mp_str(msgpack_packer *pk, const char *s)
{
    return gbuf_mp_str_n(pk, s, strlen(s));
}

/* The body of a bin of n float32, little-endian. */
static int mp_pack_floats(msgpack_packer *pk, const float *x, size_t n)
{
#if PROTO_HOST_IS_WIRE_ORDER
    return msgpack_pack_bin_body(pk, x, 4 * n); /* host order is the wire's */
#else
    int r = 0;
    unsigned char chunk[4 * 256];
    for (size_t i = 0; i < n && r == 0; i += 256) {
        size_t m = n - i < 256 ? n - i : 256;
        for (size_t k = 0; k < m; k++) put_f32le(chunk + 4 * k, x[i + k]);
        r |= msgpack_pack_bin_body(pk, chunk, 4 * m);
    }
    return r;
#endif
}

/* The MessagePack result, keys in protocol order. meta is written as the
 * stored bytes (already MessagePack), output as one bin of LE float32. */
static int encode_mp(const struct codec_result *j, struct gbuf *b)
{
    int ok = j->err == PROTO_OK;
    const struct codec_gen_result *gen = ok ? j->gen : NULL;
    size_t n = 0;
    if (ok && !gen && (output_count(j, &n) < 0 || n > UINT32_MAX / 4)) return -1;
    msgpack_packer pk;
    msgpack_packer_init(&pk, b, gbuf_mp_write);
    int r = 0;
    int extra = ok ? (j->out_tokens ? 1 : 0) + (j->labels ? 2 : 0) : 0;
    int body = gen ? codec_gen_mp_entries(gen) : ok ? 2 + extra : 1;
    r |= msgpack_pack_map(&pk, 3 + body + (j->meta ? 1 : 0) + 2);
    r |= mp_str(&pk, "id");
    r |= mp_str(&pk, j->id);
    r |= mp_str(&pk, "model");
    r |= mp_str(&pk, j->model);
    r |= mp_str(&pk, "status");
    r |= mp_str(&pk, ok ? "ok" : "error");
    if (gen) {
        r |= codec_gen_put_mp(&pk, gen);
    } else if (ok) {
        r |= mp_str(&pk, "output");
        r |= msgpack_pack_bin(&pk, n * 4);
        r |= mp_pack_floats(&pk, j->output, n);
        r |= mp_str(&pk, "shape");
        r |= msgpack_pack_array(&pk, j->out_tokens ? 3 : 2);
        r |= msgpack_pack_uint64(&pk, j->out_rows);
        if (j->out_tokens) r |= msgpack_pack_uint64(&pk, j->out_tokens);
        r |= msgpack_pack_uint64(&pk, j->out_width);
        if (j->out_tokens) {
            r |= mp_str(&pk, "lengths");
            r |= msgpack_pack_array(&pk, j->out_rows);
            for (size_t i = 0; i < j->out_rows; i++) r |= msgpack_pack_uint64(&pk, j->lengths[i]);
        }
        if (j->labels) {
            /* The scores are the output: a second bin of the same floats. */
            r |= mp_str(&pk, "scores");
            r |= msgpack_pack_bin(&pk, n * 4);
            r |= mp_pack_floats(&pk, j->output, n);
            r |= mp_str(&pk, "labels");
            r |= msgpack_pack_array(&pk, j->out_rows);
            for (size_t i = 0; i < j->out_rows; i++) r |= mp_str(&pk, j->labels[i]);
        }
    } else {
        r |= mp_str(&pk, "error");
        r |= msgpack_pack_map(&pk, 2);
        r |= mp_str(&pk, "code");
        r |= mp_str(&pk, proto_err_name(j->err));
        r |= mp_str(&pk, "message");
        r |= mp_str(&pk, j->errmsg);
    }
    if (j->meta) {
        r |= mp_str(&pk, "meta");
        r |= gbuf_put(b, j->meta, j->meta_len);
    }
    r |= mp_str(&pk, "timing");
    r |= msgpack_pack_map(&pk, (j->tokens ? 6 : 4) + (gen ? 2 : 0));
    r |= mp_str(&pk, "queued_ms");
    r |= msgpack_pack_double(&pk, j->queued_ms);
    r |= mp_str(&pk, "infer_ms");
    r |= msgpack_pack_double(&pk, j->infer_ms);
    r |= mp_str(&pk, "total_ms");
    r |= msgpack_pack_double(&pk, j->total_ms);
    r |= mp_str(&pk, "batch_rows");
    r |= msgpack_pack_uint64(&pk, j->batch_rows);
    if (j->tokens) {
        r |= mp_str(&pk, "tokens");
        r |= msgpack_pack_uint64(&pk, j->tokens);
        r |= mp_str(&pk, "padded_tokens");
        r |= msgpack_pack_uint64(&pk, j->padded_tokens);
    }
    if (gen) {
        r |= mp_str(&pk, "ttft_ms");
        r |= msgpack_pack_double(&pk, isfinite(gen->ttft_ms) ? gen->ttft_ms : 0.0);
        r |= mp_str(&pk, "decode_tokens_per_s");
        r |= msgpack_pack_double(&pk, isfinite(gen->decode_tokens_per_s)
                                          ? gen->decode_tokens_per_s : 0.0);
    }
    r |= mp_str(&pk, "source");
    r |= msgpack_pack_map(&pk, 3);
    r |= mp_str(&pk, "topic");
    r |= mp_str(&pk, j->topic);
    r |= mp_str(&pk, "partition");
    r |= msgpack_pack_int32(&pk, j->partition);
    r |= mp_str(&pk, "offset");
    r |= msgpack_pack_int64(&pk, j->offset);
    return r ? -1 : 0;
}

/* A JSON string from a C string that should be UTF-8 but may not be (a
 * model name from config, a message quoting something): ill-formed
 * sequences are replaced by U+FFFD (utf8.h) rather than failing the whole
 * result. */
static json_t *js_str(const char *s)
{
    json_t *v = json_string(s ? s : "");
    if (v || !s) return v;
    size_t n = strlen(s);
    char *t = malloc(3 * n + 1);
    if (!t) return NULL;
    utf8_repair(t, 3 * n + 1, s, n);
    v = json_string(t);
    free(t);
    return v;
}

/* A JSON real for a double that may be non-finite (jansson refuses those):
 * timings fall back to 0. */
static json_t *js_num(double d)
{
    return json_real(isfinite(d) ? d : 0.0);
}

/* Whether s reads back as f, both as a float32 and as a double rounded to
 * float32 (what a client that parses JSON numbers as doubles gets). */
static int reads_back(const char *s, float f)
{
    return strtof(s, NULL) == f && (float)strtod(s, NULL) == f;
}

/* Writes f with the fewest significant digits (1..9) that read back as
 * the same float32; 9 always do (FLT_DECIMAL_DIG). Most outputs need 7 to
 * 9, so the search starts at 6 and goes the way the first try says. The
 * exponent loses its '+' and leading zeros, and a number that would read
 * as an integer gets ".0" so that it stays a real for typed decoders. */
size_t codec_format_float(char *buf, size_t cap, float f)
{
    char s[40];
    if (!isfinite(f)) {
        snprintf(buf, cap, "null");
        return cap > 4 ? 4 : cap ? cap - 1 : 0;
    }
    int p = 6;
    snprintf(s, sizeof(s), "%.*g", p, (double)f);
    if (reads_back(s, f)) {
        char t[40];
        while (p > 1) {
            snprintf(t, sizeof(t), "%.*g", p - 1, (double)f);
            if (!reads_back(t, f)) break;
            memcpy(s, t, sizeof(t));
            p--;
        }
    } else {
        do {
            p++;
            snprintf(s, sizeof(s), "%.*g", p, (double)f);
        } while (p < 9 && !reads_back(s, f));
    }
    /* Tidy the exponent: "1e+02" -> "1e2", "1e-05" -> "1e-5". */
    char *e = strchr(s, 'e');
    if (e) {
        char *d = e + 1, *q = e + 1;
        if (*q == '+') q++;
        else if (*q == '-') d++, q++;
        while (*q == '0' && q[1]) q++;
        memmove(d, q, strlen(q) + 1);
    } else if (!strchr(s, '.')) {
        strcat(s, ".0");
    }
    size_t n = strlen(s);
    if (cap) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, s, k);
        buf[k] = '\0';
    }
    return n;
}

/* Appends n floats as a JSON array, straight into the result's buffer:
 * the body is the only memory a result takes (no value per float). */
static int js_put_floats(struct gbuf *b, const float *x, size_t n)
{
    char s[CODEC_JSON_FLOAT_MAX + 2];
    int r = gbuf_put(b, "[", 1);
    for (size_t i = 0; i < n && r == 0; i++) {
        size_t len = 0;
        if (i) s[len++] = ',';
        len += codec_format_float(s + len, sizeof(s) - len, x[i]);
        r = gbuf_put(b, s, len);
    }
    return r | gbuf_put(b, "]", 1);
}

/* Appends a string as a JSON string (jansson escapes it). */
static int js_put_str(struct gbuf *b, const char *s)
{
    json_t *v = js_str(s);
    if (!v) return -1;
    int r = json_dump_callback(v, gbuf_json_write, b, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(v);
    return r;
}

/* Appends text as it is (keys, punctuation). */
static int js_put(struct gbuf *b, const char *s)
{
    return gbuf_put(b, s, strlen(s));
}

/* Appends an unsigned integer. */
static int js_put_uint(struct gbuf *b, size_t v)
{
    char s[24];
    int n = snprintf(s, sizeof(s), "%zu", v);
    return gbuf_put(b, s, (size_t)n);
}

/* Builds the last part of the JSON result: timing and source. */
static json_t *js_tail(const struct codec_result *j)
{
    json_t *o = json_object();
    if (!o) return NULL;
    int r = 0;
    json_t *timing =
        json_pack("{s:o,s:o,s:o,s:I}", "queued_ms", js_num(j->queued_ms), "infer_ms",
                  js_num(j->infer_ms), "total_ms", js_num(j->total_ms),
                  "batch_rows", (json_int_t)j->batch_rows);
    if (timing && j->tokens) {
        r |= json_object_set_new(timing, "tokens", json_integer((json_int_t)j->tokens));
        r |= json_object_set_new(timing, "padded_tokens",
                                 json_integer((json_int_t)j->padded_tokens));
    }
    if (timing && j->gen && j->err == PROTO_OK) {
        r |= json_object_set_new(timing, "ttft_ms", js_num(j->gen->ttft_ms));
        r |= json_object_set_new(timing, "decode_tokens_per_s",
                                 js_num(j->gen->decode_tokens_per_s));
    }
    r |= json_object_set_new(o, "timing", timing);
    r |= json_object_set_new(o, "source",
                             json_pack("{s:o,s:i,s:I}", "topic", js_str(j->topic), "partition",
                                       (int)j->partition, "offset", (json_int_t)j->offset));
    if (r) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The JSON result, written straight into the body's buffer: id, model,
 * status, then output, shape (lengths, scores, labels) or error, then
 * meta, timing and source. Floats take the fewest digits that read back
 * as the same float32 (codec_format_float), at most CODEC_JSON_FLOAT_MAX
 * bytes each, and no value is built per float, so a result takes the
 * memory of its own bytes. meta is spliced in as its stored bytes rather
 * than re-parsed and re-dumped, which would round its reals: docs/protocol.md
 * echoes meta untouched. The small tail (timing, source) is dumped by
 * jansson, as before, without its opening brace. */
static int encode_json(const struct codec_result *j, struct gbuf *b)
{
    int ok = j->err == PROTO_OK;
    const struct codec_gen_result *gen = ok ? j->gen : NULL;
    size_t n = 0;
    if (ok && !gen && output_count(j, &n) < 0) return -1;
    int r = 0;
    r |= js_put(b, "{\"id\":");
    r |= js_put_str(b, j->id);
    r |= js_put(b, ",\"model\":");
    r |= js_put_str(b, j->model);
    r |= js_put(b, ok ? ",\"status\":\"ok\"" : ",\"status\":\"error\"");
    if (gen) {
        r |= codec_gen_put_js(b, gen);
    } else if (ok) {
        r |= js_put(b, ",\"output\":");
        r |= js_put_floats(b, j->output, n);
        r |= js_put(b, ",\"shape\":[");
        r |= js_put_uint(b, j->out_rows);
        if (j->out_tokens) {
            r |= js_put(b, ",");
            r |= js_put_uint(b, j->out_tokens);
        }
        r |= js_put(b, ",");
        r |= js_put_uint(b, j->out_width);
        r |= js_put(b, "]");
        if (j->out_tokens) {
            r |= js_put(b, ",\"lengths\":[");
            for (size_t i = 0; i < j->out_rows && r == 0; i++) {
                if (i) r |= js_put(b, ",");
                r |= js_put_uint(b, j->lengths[i]);
            }
            r |= js_put(b, "]");
        }
        if (j->labels) {
            r |= js_put(b, ",\"scores\":");
            r |= js_put_floats(b, j->output, n);
            r |= js_put(b, ",\"labels\":[");
            for (size_t i = 0; i < j->out_rows && r == 0; i++) {
                if (i) r |= js_put(b, ",");
                r |= js_put_str(b, j->labels[i]);
            }
            r |= js_put(b, "]");
        }
    } else {
        r |= js_put(b, ",\"error\":{\"code\":");
        r |= js_put_str(b, proto_err_name(j->err));
        r |= js_put(b, ",\"message\":");
        r |= js_put_str(b, j->errmsg);
        r |= js_put(b, "}");
    }
    if (j->meta) {
        r |= js_put(b, ",\"meta\":");
        r |= gbuf_put(b, j->meta, j->meta_len);
    }
    if (r) return -1;
    struct gbuf tail = {.limit = SIZE_MAX};
    json_t *t = js_tail(j);
    r = -1;
    if (!t) goto fail;
    if (json_dump_callback(t, gbuf_json_write, &tail, JSON_COMPACT | JSON_REAL_PRECISION(9)) != 0)
        goto fail;
    if (tail.len < 2 || tail.p[0] != '{') goto fail;
    r = gbuf_put(b, ",", 1);
    r |= gbuf_put(b, tail.p + 1, tail.len - 1);
fail:
    json_decref(t);
    free(tail.p);
    return r;
}

/* a + b, or SIZE_MAX when that overflows. */
static size_t sat_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* a * b, or SIZE_MAX when that overflows. */
static size_t sat_mul(size_t a, size_t b)
{
    return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

/* Strings may grow when escaped (JSON \uXXXX) or repaired (U+FFFD for a
 * bad byte): 6 bytes per byte bounds both, plus quotes or a str header. */
static size_t str_bound(size_t len)
{
    return sat_add(sat_mul(len, 6), 8);
}

/* The bound of codec.h: the envelope (keys, shape, timing, source: 512
 * bytes covers them with 20-digit integers and 17-digit reals), the
 * strings, meta as stored, and per value and per row what the encoding
 * spends at most. */
size_t codec_result_max_bytes(const struct codec_result_size *s)
{
    int js = s->enc == PROTO_ENC_JSON;
    size_t per_value = js ? CODEC_JSON_FLOAT_MAX + 1 : 4;
    size_t tensors = s->labels ? 2 : 1;
    size_t n = 512;
    n = sat_add(n, str_bound(s->id_len));
    n = sat_add(n, str_bound(s->model_len));
    n = sat_add(n, str_bound(s->topic_len));
    n = sat_add(n, s->meta_len);
    n = sat_add(n, sat_mul(tensors, sat_add(sat_mul(s->values, per_value), 8)));
    if (s->per_token) n = sat_add(n, sat_mul(s->rows, 21));
    if (s->labels) n = sat_add(n, sat_mul(s->rows, sat_add(str_bound(s->label_max), 1)));
    if (s->gen_tokens) n = sat_add(n, codec_gen_max_bytes(s));
    return n;
}

/* Encodes into a fresh buffer and hands it over only when complete. */
int codec_encode_result(const struct codec_result *r, unsigned char **body, size_t *body_len)
{
    struct gbuf b = {.limit = SIZE_MAX};
    int rc = r->enc == PROTO_ENC_JSON ? encode_json(r, &b) : encode_mp(r, &b);
    if (rc != 0) {
        free(b.p);
        return -1;
    }
    *body = gbuf_take(&b, body_len);
    return 0;
}

/* The content-type header value that goes with an encoding. */
const char *codec_content_type(enum proto_enc enc)
{
    return enc == PROTO_ENC_JSON ? PROTO_CT_JSON : PROTO_CT_MSGPACK;
}

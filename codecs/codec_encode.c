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
    size_t n = 0;
    if (ok && (output_count(j, &n) < 0 || n > UINT32_MAX / 4)) return -1;
    msgpack_packer pk;
    msgpack_packer_init(&pk, b, gbuf_mp_write);
    int r = 0;
    int extra = ok ? (j->out_tokens ? 1 : 0) + (j->labels ? 2 : 0) : 0;
    r |= msgpack_pack_map(&pk, 3 + (ok ? 2 : 1) + extra + (j->meta ? 1 : 0) + 2);
    r |= mp_str(&pk, "id");
    r |= mp_str(&pk, j->id);
    r |= mp_str(&pk, "model");
    r |= mp_str(&pk, j->model);
    r |= mp_str(&pk, "status");
    r |= mp_str(&pk, ok ? "ok" : "error");
    if (ok) {
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
    r |= msgpack_pack_map(&pk, j->tokens ? 6 : 4);
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
 * timings fall back to 0, output values to null. */
static json_t *js_num(double d, int null_if_bad)
{
    if (isfinite(d)) return json_real(d);
    return null_if_bad ? json_null() : json_real(0.0);
}

/* A JSON array of n floats (non-finite ones null); NULL when out of
 * memory, which json_object_set_new then reports. */
static json_t *js_floats(const float *x, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, js_num((double)x[i], 1)) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Builds the first part of the JSON result: id, model, status, then output
 * and shape, or error. */
static json_t *js_head(const struct codec_result *j)
{
    int ok = j->err == PROTO_OK;
    size_t n = 0;
    if (ok && output_count(j, &n) < 0) return NULL;
    json_t *o = json_object();
    if (!o) return NULL;
    int r = 0;
    r |= json_object_set_new(o, "id", js_str(j->id));
    r |= json_object_set_new(o, "model", js_str(j->model));
    r |= json_object_set_new(o, "status", json_string(ok ? "ok" : "error"));
    if (ok) {
        r |= json_object_set_new(o, "output", js_floats(j->output, n));
        if (j->out_tokens) {
            r |= json_object_set_new(o, "shape",
                                     json_pack("[III]", (json_int_t)j->out_rows,
                                               (json_int_t)j->out_tokens,
                                               (json_int_t)j->out_width));
            json_t *len = json_array();
            r |= len ? 0 : -1;
            for (size_t i = 0; i < j->out_rows && r == 0; i++)
                r |= json_array_append_new(len, json_integer((json_int_t)j->lengths[i]));
            r |= json_object_set_new(o, "lengths", len);
        } else {
            r |= json_object_set_new(o, "shape", json_pack("[II]", (json_int_t)j->out_rows,
                                                           (json_int_t)j->out_width));
        }
        if (j->labels) {
            r |= json_object_set_new(o, "scores", js_floats(j->output, n));
            json_t *lab = json_array();
            r |= lab ? 0 : -1;
            for (size_t i = 0; i < j->out_rows && r == 0; i++)
                r |= json_array_append_new(lab, js_str(j->labels[i]));
            r |= json_object_set_new(o, "labels", lab);
        }
    } else {
        r |= json_object_set_new(o, "error", json_pack("{s:s,s:o}", "code",
                                                       proto_err_name(j->err), "message",
                                                       js_str(j->errmsg)));
    }
    if (r) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Builds the last part of the JSON result: timing and source. */
static json_t *js_tail(const struct codec_result *j)
{
    json_t *o = json_object();
    if (!o) return NULL;
    int r = 0;
    json_t *timing =
        json_pack("{s:o,s:o,s:o,s:I}", "queued_ms", js_num(j->queued_ms, 0), "infer_ms",
                  js_num(j->infer_ms, 0), "total_ms", js_num(j->total_ms, 0),
                  "batch_rows", (json_int_t)j->batch_rows);
    if (timing && j->tokens) {
        r |= json_object_set_new(timing, "tokens", json_integer((json_int_t)j->tokens));
        r |= json_object_set_new(timing, "padded_tokens",
                                 json_integer((json_int_t)j->padded_tokens));
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

/* The JSON result. Output is dumped with 9 significant digits, enough for
 * any float32 to round-trip. meta is spliced in as its stored bytes rather
 * than re-parsed and re-dumped, which would round its reals to 9 digits
 * too: docs/protocol.md echoes meta untouched. So the result is dumped as two
 * objects, head (up to output/error) and tail (timing, source), joined
 * with `,"meta":<bytes>,` — both are non-empty compact objects. */
static int encode_json(const struct codec_result *j, struct gbuf *b)
{
    const size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(9);
    struct gbuf tail = {.limit = SIZE_MAX};
    json_t *h = js_head(j);
    json_t *t = h ? js_tail(j) : NULL;
    int r = -1;
    if (!h || !t) goto fail;
    if (json_dump_callback(h, gbuf_json_write, b, flags) != 0) goto fail;
    if (json_dump_callback(t, gbuf_json_write, &tail, flags) != 0) goto fail;
    if (b->len < 2 || tail.len < 2 || b->p[b->len - 1] != '}' || tail.p[0] != '{') goto fail;
    b->len--; /* drop the head's closing brace */
    r = 0;
    if (j->meta) {
        r |= gbuf_put(b, ",\"meta\":", 8);
        r |= gbuf_put(b, j->meta, j->meta_len);
    }
    r |= gbuf_put(b, ",", 1);
    r |= gbuf_put(b, tail.p + 1, tail.len - 1);
fail:
    json_decref(h);
    json_decref(t);
    free(tail.p);
    return r;
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

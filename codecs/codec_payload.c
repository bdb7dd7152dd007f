/* codec_payload.c - the decoder's reading of what a job carries to run:
 * the input tensor (`input`: a bin of little-endian float32 or an array of
 * numbers) for layer models, and for encoders (v1.1) rows of text
 * (`text`, `text_pair`) or of token ids (`tokens`, `type_ids`), each row
 * checked against the limits and copied out of the parse.
 *
 * Threads: the poll thread, inside codec_decode_job; no shared state.
 * Ownership: the parsed document is borrowed; what is kept is copied into
 * the request's own arrays (codec_request_fini frees them), and a failed
 * field leaves none of them half-filled. */
#include "codec.h"
#include "codec_decode.h"

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

/* Tensors are raw IEEE-754 binary32 on the wire; the byte order is handled
 * explicitly, the format must match the host's. */
_Static_assert(sizeof(float) == 4 && sizeof(uint32_t) == 4 && FLT_RADIX == 2 &&
                   FLT_MANT_DIG == 24 && FLT_MAX_EXP == 128,
               "float must be IEEE-754 binary32");

#if !PROTO_HOST_IS_WIRE_ORDER
/* Reads 4 little-endian bytes (any alignment) as a float. */
static float get_f32le(const unsigned char *s)
{
    uint32_t u = (uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 |
                 (uint32_t)s[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}
#endif

/* Allocates req->input for n floats after checking n against the limits. */
static int input_alloc(struct codec_request *j, size_t n, const struct codec_limits *lim)
{
    if (n == 0) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: empty");
    if (lim->max_input_floats == 0)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                    "field input: this worker's models are text encoders: send text or tokens");
    if (n > lim->max_input_floats)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: %zu values, more than max_input_floats %zu",
                    n, lim->max_input_floats);
    j->input = malloc(n * sizeof(float));
    if (!j->input) return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for %zu input values", n);
    j->n_input = n;
    return 0;
}

/* Stores element i, already converted to float32. The check is after the
 * conversion: a finite double beyond FLT_MAX becomes inf here (IEEE-754,
 * C11 Annex F) and is as useless to the model as a NaN. */
static int not_finite(struct codec_request *j, size_t i)
{
    return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: element %zu is not finite", i);
}

static int input_put(struct codec_request *j, size_t i, float f)
{
    if (!isfinite(f)) return not_finite(j, i);
    j->input[i] = f;
    return 0;
}

/* Index of the first element of x[0..n) that is NaN or infinite (exponent
 * bits all ones), n when none is. One branch-free pass finds whether there
 * is one; only then is the position looked for. */
static size_t first_nonfinite(const float *x, size_t n)
{
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof(u));
        any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    if (!any) return n;
    size_t i = 0;
    while (i < n && isfinite(x[i])) i++;
    return i;
}

/* Drops a half-filled input after an element error, so a failed job does
 * not carry a tensor that no one will run. */
static int input_drop(struct codec_request *j)
{
    free(j->input);
    j->input = NULL;
    j->n_input = 0;
    return -1;
}

/* MessagePack input: a bin of 4*n little-endian float32 bytes, or an array
 * of numbers (integers or floats). */
int codec_input_mp(struct codec_request *j, const msgpack_object *o, const struct codec_limits *lim)
{
    if (!o) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: missing (nor text, nor tokens)");
    if (o->type == MSGPACK_OBJECT_BIN) {
        const unsigned char *b = (const unsigned char *)o->via.bin.ptr;
        size_t sz = o->via.bin.size;
        if (sz % 4 != 0)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                        "field input: bin of %zu bytes is not a multiple of 4", sz);
        if (input_alloc(j, sz / 4, lim) < 0) return -1;
#if PROTO_HOST_IS_WIRE_ORDER
        /* The wire's layout is the host's: one copy and one check. */
        memcpy(j->input, b, sz);
        size_t bad = first_nonfinite(j->input, sz / 4);
        if (bad < sz / 4) {
            not_finite(j, bad);
            return input_drop(j);
        }
#else
        for (size_t i = 0; i < sz / 4; i++)
            if (input_put(j, i, get_f32le(b + 4 * i)) < 0) return input_drop(j);
#endif
        return 0;
    }
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                    "field input: must be a bin of float32 or an array of numbers, got %s",
                    codec_mp_type(o));
    size_t n = o->via.array.size;
    if (input_alloc(j, n, lim) < 0) return -1;
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        float f;
        switch (e->type) {
        case MSGPACK_OBJECT_POSITIVE_INTEGER: f = (float)e->via.u64; break;
        case MSGPACK_OBJECT_NEGATIVE_INTEGER: f = (float)e->via.i64; break;
        case MSGPACK_OBJECT_FLOAT32:
        case MSGPACK_OBJECT_FLOAT64: f = (float)e->via.f64; break;
        default:
            codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: element %zu is not a number (%s)", i,
                 codec_mp_type(e));
            return input_drop(j);
        }
        if (input_put(j, i, f) < 0) return input_drop(j);
    }
    return 0;
}

/* JSON input: an array of numbers. */
int codec_input_js(struct codec_request *j, const json_t *v, const struct codec_limits *lim)
{
    if (!v) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: missing (nor text, nor tokens)");
    if (!json_is_array(v))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: must be an array of numbers, got %s",
                    codec_js_type(v));
    size_t n = json_array_size(v);
    if (input_alloc(j, n, lim) < 0) return -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        float f;
        size_t big;
        if (codec_js_bignum(e, &big)) {
            /* past int64 or DBL_MAX: past FLT_MAX too */
            not_finite(j, i);
            return input_drop(j);
        } else if (json_is_integer(e)) {
            f = (float)json_integer_value(e);
        } else if (json_is_real(e)) {
            f = (float)json_real_value(e);
        } else {
            codec_fail(j, PROTO_ERR_INVALID_INPUT, "field input: element %zu is not a number (%s)", i,
                 codec_js_type(e));
            return input_drop(j);
        }
        if (input_put(j, i, f) < 0) return input_drop(j);
    }
    return 0;
}

/* ---- v1.1: rows of text or of token ids (encoders) ------------------ */

/* One string of a text field, borrowed from the parse. */
struct sview {
    const char *s;
    size_t len;
};

/* Code points in s: the bytes that do not continue a UTF-8 sequence (on
 * invalid UTF-8 a bound, which is all the limit needs; the tokenizer
 * reports the bad byte). */
static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Copies n strings into one buffer with offsets, after checking the row
 * count and each row's characters against the limits. */
static int text_store(struct codec_request *j, const char *field, const struct sview *v,
                      size_t n, const struct codec_limits *lim, char **buf, size_t **off)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t chars = utf8_chars(v[i].s, v[i].len);
        if (chars > lim->max_text_chars)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                        "field %s: row %zu is %zu characters, over max_text_chars %zu", field,
                        i, chars, lim->max_text_chars);
        total += v[i].len;
    }
    *buf = malloc(total ? total : 1);
    *off = malloc((n + 1) * sizeof(**off));
    if (!*buf || !*off)
        return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for %zu bytes of text", total);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        (*off)[i] = at;
        if (v[i].len) memcpy(*buf + at, v[i].s, v[i].len);
        at += v[i].len;
    }
    (*off)[n] = at;
    return 0;
}

/* A field's value in either encoding (exactly one of the two is set),
 * walked by index the same way: text and token rows are read by one
 * piece of code whichever encoding carried them. */
struct wval {
    const json_t *js;
    const msgpack_object *mp;
};

static int wv_is_array(const struct wval *v)
{
    return v->js ? json_is_array(v->js) : v->mp->type == MSGPACK_OBJECT_ARRAY;
}

static size_t wv_len(const struct wval *v)
{
    return v->js ? json_array_size(v->js) : v->mp->via.array.size;
}

static struct wval wv_elem(const struct wval *v, size_t i)
{
    struct wval e = {NULL, NULL};
    if (v->js) e.js = json_array_get(v->js, i);
    else e.mp = &v->mp->via.array.ptr[i];
    return e;
}

static const char *wv_type(const struct wval *v)
{
    return v->js ? codec_js_type(v->js) : codec_mp_type(v->mp);
}

/* 1 with *out set when v is a string, else 0. */
static int wv_string(const struct wval *v, struct sview *out)
{
    size_t big;
    if (v->js ? !json_is_string(v->js) || codec_js_bignum(v->js, &big)
              : v->mp->type != MSGPACK_OBJECT_STR)
        return 0;
    if (v->js) *out = (struct sview){json_string_value(v->js), json_string_length(v->js)};
    else *out = (struct sview){v->mp->via.str.ptr, v->mp->via.str.size};
    return 1;
}

/* The id of element e, 0..INT32_MAX; -1 for anything else. */
static int64_t wv_id(const struct wval *e)
{
    if (e->js) {
        if (!json_is_integer(e->js)) return -1;
        json_int_t v = json_integer_value(e->js);
        return v < 0 || v > INT32_MAX ? -1 : (int64_t)v;
    }
    if (e->mp->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->mp->via.u64 > INT32_MAX) return -1;
    return (int64_t)e->mp->via.u64;
}

/* A text field's rows: a string is one row, an array of strings one row
 * each. *v (the caller frees) gets views into the parse. */
static int text_rows(struct codec_request *j, const char *field, const struct wval *t,
                     const struct codec_limits *lim, struct sview **v, size_t *n)
{
    struct sview one;
    int is_one = wv_string(t, &one);
    if (!is_one && !wv_is_array(t))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                    "field %s: must be a string or an array of strings, got %s", field,
                    wv_type(t));
    *n = is_one ? 1 : wv_len(t);
    if (*n == 0) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: empty array", field);
    if (*n > lim->max_rows)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: %zu rows, more than max_job_rows %zu",
                    field, *n, lim->max_rows);
    if (!(*v = malloc(*n * sizeof(**v))))
        return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
    if (is_one) {
        (*v)[0] = one;
        return 0;
    }
    for (size_t i = 0; i < *n; i++) {
        struct wval e = wv_elem(t, i);
        if (!wv_string(&e, &(*v)[i]))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: row %zu is %s, not a string",
                        field, i, wv_type(&e));
    }
    return 0;
}

/* text and text_pair (same number of rows; pair may be NULL) into the
 * request. */
static int take_text(struct codec_request *j, const struct wval *text, const struct wval *pair,
                     const struct codec_limits *lim)
{
    struct sview *tv = NULL, *pv = NULL;
    size_t nt = 0, np = 0;
    int rc = text_rows(j, "text", text, lim, &tv, &nt);
    if (rc == 0 && pair) rc = text_rows(j, "text_pair", pair, lim, &pv, &np);
    if (rc == 0 && pv && np != nt)
        rc = codec_fail(j, PROTO_ERR_INVALID_INPUT,
                  "field text_pair: %zu rows, but text has %zu (one pair per row)", np, nt);
    if (rc == 0) rc = text_store(j, "text", tv, nt, lim, &j->text, &j->text_off);
    if (rc == 0 && pv) rc = text_store(j, "text_pair", pv, np, lim, &j->pair, &j->pair_off);
    if (rc == 0) j->n_text = nt;
    free(tv);
    free(pv);
    return rc;
}

/* Reads one token field into ids and offsets; shape_off (when not NULL)
 * is tokens' offsets, which this field's rows must match one for one. */
static int tok_read(struct codec_request *j, const char *field, const struct wval *t,
                    const struct codec_limits *lim, int32_t **ids, size_t **off,
                    size_t *rows_out, const size_t *shape_off, size_t shape_rows)
{
    if (!wv_is_array(t))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                    "field %s: must be an array of ids or of arrays of ids, got %s", field,
                    wv_type(t));
    size_t n = wv_len(t);
    if (n == 0) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: empty array", field);
    struct wval first = wv_elem(t, 0);
    int nested = wv_is_array(&first);
    size_t rows = nested ? n : 1, total = 0;
    if (rows > lim->max_rows)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: %zu rows, more than max_job_rows %zu",
                    field, rows, lim->max_rows);
    for (size_t r = 0; r < rows; r++) {
        struct wval row = nested ? wv_elem(t, r) : *t;
        if (!wv_is_array(&row))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: row %zu is %s, not an array",
                        field, r, wv_type(&row));
        size_t len = wv_len(&row);
        if (len == 0) return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: row %zu is empty", field, r);
        total += len;
        if (total > lim->max_tokens)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: more than %zu ids in one job",
                        field, lim->max_tokens);
    }
    if (shape_off && (rows != shape_rows || total != shape_off[shape_rows]))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field %s: not the shape of tokens", field);
    *ids = malloc(total * sizeof(**ids));
    *off = malloc((rows + 1) * sizeof(**off));
    if (!*ids || !*off)
        return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for %zu ids", total);
    size_t at = 0;
    for (size_t r = 0; r < rows; r++) {
        struct wval row = nested ? wv_elem(t, r) : *t;
        size_t len = wv_len(&row);
        if (shape_off && len != shape_off[r + 1] - shape_off[r])
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                        "field %s: row %zu has %zu ids, tokens' row has %zu", field, r, len,
                        shape_off[r + 1] - shape_off[r]);
        (*off)[r] = at;
        for (size_t i = 0; i < len; i++) {
            struct wval e = wv_elem(&row, i);
            int64_t id = wv_id(&e);
            if (id < 0)
                return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                            "field %s: row %zu element %zu is not an id (an integer 0..%d)",
                            field, r, i, INT32_MAX);
            (*ids)[at++] = (int32_t)id;
        }
    }
    (*off)[rows] = at;
    *rows_out = rows;
    return 0;
}

/* tokens and type_ids (same shape) into the request. */
static int take_tokens(struct codec_request *j, const struct wval *tok,
                       const struct wval *types, const struct codec_limits *lim)
{
    size_t rows = 0;
    if (tok_read(j, "tokens", tok, lim, &j->tokens, &j->token_off, &rows, NULL, 0) < 0)
        return -1;
    j->n_token_rows = rows;
    if (!types) return 0;
    size_t *off = NULL, trows = 0;
    int rc = tok_read(j, "type_ids", types, lim, &j->type_ids, &off, &trows, j->token_off, rows);
    free(off);
    return rc;
}

/* The fields of an encoder's job, when it has them: exactly one of input,
 * text and tokens; text_pair only with text, type_ids only with tokens;
 * truncate a boolean. Returns 1 when the job is a text or token job (then
 * decoded, or failed), 0 when it is not (input goes the old way), -1 on
 * an error. */
int codec_take_rows(struct codec_request *j, const struct fields *f,
                     const struct codec_limits *lim)
{
    int has_in = f->mp_input || f->js_input, has_text = f->mp_text || f->js_text,
        has_tok = f->mp_tokens || f->js_tokens;
    j->truncate = 1;
    if (f->js_truncate) {
        if (!json_is_boolean(f->js_truncate))
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field truncate: must be a boolean, got %s",
                        codec_js_type(f->js_truncate));
        j->truncate = json_is_true(f->js_truncate);
    } else if (f->mp_truncate) {
        if (f->mp_truncate->type != MSGPACK_OBJECT_BOOLEAN)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field truncate: must be a boolean, got %s",
                        codec_mp_type(f->mp_truncate));
        j->truncate = f->mp_truncate->via.boolean;
    }
    if (has_in + has_text + has_tok > 1)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                    "fields input, text and tokens: a job gives exactly one of them");
    if ((f->mp_pair || f->js_pair) && !has_text)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field text_pair: only with text");
    if ((f->mp_types || f->js_types) && !has_tok)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field type_ids: only with tokens");
    int rc = 0;
    if (has_text) {
        struct wval text = {f->js_text, f->mp_text}, pair = {f->js_pair, f->mp_pair};
        rc = take_text(j, &text, pair.js || pair.mp ? &pair : NULL, lim) < 0 ? -1 : 1;
    } else if (has_tok) {
        struct wval tok = {f->js_tokens, f->mp_tokens}, ty = {f->js_types, f->mp_types};
        rc = take_tokens(j, &tok, ty.js || ty.mp ? &ty : NULL, lim) < 0 ? -1 : 1;
    }
    /* Like input_drop: a failed job keeps no half-copied rows (text
     * stored before its pair failed, ids before type_ids did, a partly
     * filled type_ids array) that a reader could take for rows to run. */
    if (rc < 0) codec_request_fini_rows(j);
    return rc;
}

/* codec.c - the wire contract of docs/protocol.md: decodes a job record
 * value (MessagePack or JSON, told apart by the first byte) into a struct
 * codec_request, and encodes a job's result in the encoding the job came
 * in.
 *
 * Threads: the poll thread decodes, the executor (or whichever thread holds
 * the job) encodes; there is no shared state, so any thread may call either.
 * Ownership: every input is borrowed. Whatever a request keeps (input
 * floats, re-encoded meta) and the result body are copied into malloc'd
 * memory that the caller owns (codec_request_fini); nothing points into
 * the Kafka message, the msgpack zone or the jansson tree after a call
 * returns.
 *
 * Hostile input (docs/reliability.md, rule 9): the payload is capped before any
 * parsing, MessagePack is pre-scanned by mpscan before msgpack-c may
 * allocate from its declared counts, nesting is capped in both encodings,
 * and meta re-encoding stops as soon as it passes PROTO_META_MAX.
 *
 * Decisions the contract leaves open, made here:
 * - A record that parses but whose top level is not a map is not a job and
 *   is dead-lettered even when its key is a valid id: it "cannot be decoded"
 *   (docs/protocol.md). Likewise anything that does not parse (truncated, too
 *   deep, trailing bytes, duplicate keys). Only an oversize payload is
 *   answered with invalid_input when the key is a usable id, because that
 *   record may be a well-formed job that is merely too big.
 * - Duplicate keys: JSON rejects them anywhere (JSON_REJECT_DUPLICATES);
 *   MessagePack rejects a duplicated known top-level field (comparing every
 *   key pair of a large hostile map would be quadratic).
 * - deadline_ms: 0 means none (as in struct codec_request); negative is invalid.
 * - timeout_ms is relative to record_ts_ms; when the record has no
 *   timestamp (<= 0, librdkafka's -1), the current wall clock stands in.
 * - Element numbers in messages ("element 3") count from 0.
 * - Running out of memory while copying a decoded job answers it with
 *   inference_failed rather than dead-lettering a job that may be fine. */
#include "codec.h"
#include "mpscan.h"
#include "../base/utf8.h"

#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>
#include <msgpack.h>

#include "../base/clock.h"

/* Tensors are raw IEEE-754 binary32 on the wire; the byte order is handled
 * explicitly below, the format must match the host's. */
_Static_assert(sizeof(float) == 4 && sizeof(uint32_t) == 4 && FLT_RADIX == 2 &&
                   FLT_MANT_DIG == 24 && FLT_MAX_EXP == 128,
               "float must be IEEE-754 binary32");

#define CT_MSGPACK "application/msgpack"
#define CT_JSON "application/json"

/* ------------------------------------------------------------------ */
/* Small buffers and helpers                                           */
/* ------------------------------------------------------------------ */

/* A growable byte buffer with a hard limit, shared by the msgpack packer
 * and jansson's dump callback so that the codec owns its allocations (and
 * can stop re-encoding meta the moment it passes PROTO_META_MAX). */
struct gbuf {
    unsigned char *p;
    size_t len, cap;
    size_t limit; /* len never exceeds this */
    int over;     /* a write was refused because of `limit` (not memory) */
};

/* Appends n bytes; -1 when the limit would be passed or memory runs out. */
static int gbuf_put(struct gbuf *b, const void *src, size_t n)
{
    if (n == 0) return 0;
    if (n > b->limit - b->len) {
        b->over = 1;
        return -1;
    }
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                cap = b->len + n;
                break;
            }
            cap *= 2;
        }
        unsigned char *np = realloc(b->p, cap);
        if (!np) return -1;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

/* msgpack_packer's write callback (data first). */
static int gbuf_mp_write(void *data, const char *buf, size_t len)
{
    return gbuf_put(data, buf, len);
}

/* jansson's dump callback (data last). */
static int gbuf_json_write(const char *buf, size_t len, void *data)
{
    return gbuf_put(data, buf, len);
}

/* Hands the buffer's bytes to the caller as an exact-size allocation. */
static unsigned char *gbuf_take(struct gbuf *b, size_t *len)
{
    unsigned char *p = b->p;
    if (p && b->len < b->cap) {
        unsigned char *np = realloc(p, b->len ? b->len : 1);
        if (np) p = np;
    }
    *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

/* float32 on the wire is little-endian. A little-endian host copies it as
 * it is; any other converts element by element with these two. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_IS_WIRE_ORDER 1
#else
#define HOST_IS_WIRE_ORDER 0

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

/* ------------------------------------------------------------------ */
/* Decoding                                                            */
/* ------------------------------------------------------------------ */

/* A scalar top-level field seen through either encoding, so that id,
 * model, deadline_ms, timeout_ms and priority are validated by one piece
 * of code and say the same thing in both. */
enum fv_kind { FV_ABSENT = 0, FV_STR, FV_INT, FV_OTHER };

struct fval {
    enum fv_kind kind;
    const char *s;    /* FV_STR: bytes (not NUL-terminated), borrowed from the parse */
    size_t len;
    int64_t i;        /* FV_INT */
    int too_big;      /* FV_INT: an unsigned value above INT64_MAX */
    const char *type; /* the value's type, for messages */
};

/* The top-level fields, referring into the parsed document (msgpack zone
 * or jansson tree); valid until that document is freed. */
struct fields {
    struct fval id, model, deadline, timeout, priority;
    const msgpack_object *mp_input, *mp_meta;
    json_t *js_input, *js_meta;
    /* v1.1, for encoders */
    const msgpack_object *mp_text, *mp_pair, *mp_tokens, *mp_types, *mp_truncate;
    json_t *js_text, *js_pair, *js_tokens, *js_types, *js_truncate;
};

/* One decode call's arguments, passed down as one pointer. */
struct dctx {
    struct codec_request *req;
    const struct codec_limits *lim;
    const char *key;
    size_t key_len;
    int key_ok; /* the record key is a valid id */
    const char *content_type;
    int64_t record_ts_ms;
    char *errstr;
    size_t errstr_size;
};

/* Gives up on the record: says why in errstr, and leaves the job owning
 * nothing the decoder allocated, so the caller can dead-letter it. */
static enum codec_rc dead(struct dctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static enum codec_rc dead(struct dctx *c, const char *fmt, ...)
{
    if (c->errstr && c->errstr_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->errstr, c->errstr_size, fmt, ap);
        va_end(ap);
        utf8_repair_str(c->errstr, c->errstr_size); /* it may quote the record */
    }
    struct codec_request *j = c->req;
    codec_request_fini(j);
    j->id[0] = '\0';
    j->err = PROTO_OK;
    j->errmsg[0] = '\0';
    return CODEC_DEAD;
}

/* Leaves r owning nothing, so it can be reused or thrown away. */
void codec_request_fini(struct codec_request *r)
{
    if (!r) return;
    free(r->input);
    r->input = NULL;
    r->n_input = 0;
    free(r->meta);
    r->meta = NULL;
    r->meta_len = 0;
    codec_request_fini_rows(r);
}

void codec_request_fini_rows(struct codec_request *r)
{
    free(r->text);
    free(r->text_off);
    free(r->pair);
    free(r->pair_off);
    r->text = r->pair = NULL;
    r->text_off = r->pair_off = NULL;
    r->n_text = 0;
    free(r->tokens);
    free(r->token_off);
    free(r->type_ids);
    r->tokens = r->type_ids = NULL;
    r->token_off = NULL;
    r->n_token_rows = 0;
}

/* Copies the record key in as the job id; only called when key_ok. */
static void id_from_key(struct dctx *c)
{
    memcpy(c->req->id, c->key, c->key_len);
    c->req->id[c->key_len] = '\0';
}

/* The MessagePack type of an object, for messages. */
static const char *mp_type(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "string";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_EXT: return "ext";
    }
    return "unknown";
}

/* The JSON type of a value, for messages. */
static const char *js_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* Views a MessagePack object as a field value. */
static void fval_mp(struct fval *f, const msgpack_object *o)
{
    memset(f, 0, sizeof(*f));
    f->type = mp_type(o);
    if (o->type == MSGPACK_OBJECT_STR) {
        f->kind = FV_STR;
        f->s = o->via.str.ptr;
        f->len = o->via.str.size;
    } else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        f->kind = FV_INT;
        if (o->via.u64 > (uint64_t)INT64_MAX) f->too_big = 1;
        else f->i = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        f->kind = FV_INT;
        f->i = o->via.i64;
    } else {
        f->kind = FV_OTHER;
    }
}

/* Views a JSON value (NULL = absent) as a field value. */
static void fval_js(struct fval *f, const json_t *v)
{
    memset(f, 0, sizeof(*f));
    if (!v) return;
    f->type = js_type(v);
    if (json_is_string(v)) {
        f->kind = FV_STR;
        f->s = json_string_value(v);
        f->len = json_string_length(v);
    } else if (json_is_integer(v)) {
        f->kind = FV_INT;
        f->i = (int64_t)json_integer_value(v);
    } else {
        f->kind = FV_OTHER;
    }
}

static int fail(struct codec_request *j, enum proto_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Picks the job id: the `id` field when valid, else the record key (with
 * invalid_input when `id` was present but bad). Returns CODEC_DEAD when
 * no usable id exists, because then no one could be answered. */
static enum codec_rc resolve_id(struct dctx *c, const struct fval *id)
{
    char why[PROTO_ERRMSG_MAX];

    if (id->kind == FV_ABSENT) {
        if (c->key_ok) {
            id_from_key(c);
            return CODEC_JOB;
        }
        return dead(c, "no field id, and %s", c->key && c->key_len
                                                   ? "the record key is not a valid id"
                                                   : "no record key");
    }
    if (id->kind != FV_STR)
        snprintf(why, sizeof(why), "field id: must be a string, got %s", id->type);
    else if (id->len == 0)
        snprintf(why, sizeof(why), "field id: empty");
    else if (id->len > PROTO_ID_MAX)
        snprintf(why, sizeof(why), "field id: %zu bytes, longer than %d", id->len, PROTO_ID_MAX);
    else if (!proto_id_valid(id->s, id->len))
        snprintf(why, sizeof(why), "field id: characters outside [A-Za-z0-9._:@/-]");
    else {
        memcpy(c->req->id, id->s, id->len);
        c->req->id[id->len] = '\0';
        return CODEC_JOB;
    }
    if (c->key_ok) {
        id_from_key(c);
        fail(c->req, PROTO_ERR_INVALID_INPUT, "%s", why);
        return CODEC_JOB;
    }
    return dead(c, "%s; the record key is not a valid id either", why);
}

/* Records a decode error on the job unless an earlier one is already set:
 * the first error is the one reported. Returns -1 for `return fail(...)`. */
static int fail(struct codec_request *j, enum proto_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct codec_request *j, enum proto_err e, const char *fmt, ...)
{
    if (j->err == PROTO_OK) {
        j->err = e;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
        va_end(ap);
        utf8_repair_str(j->errmsg, sizeof(j->errmsg)); /* it may quote the record */
    }
    return -1;
}

/* Stores the re-encoded meta, or fails the job when it is too big. The
 * buffer stops at PROTO_META_MAX + 1 bytes so a hostile meta costs little. */
static int meta_store(struct codec_request *j, struct gbuf *b, int rc)
{
    if (rc != 0 || b->over) {
        free(b->p);
        if (b->over)
            return fail(j, PROTO_ERR_INVALID_INPUT, "field meta: more than %d encoded bytes",
                        PROTO_META_MAX);
        return fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory encoding meta");
    }
    j->meta = gbuf_take(b, &j->meta_len);
    return 0;
}

static int mp_str_n(msgpack_packer *pk, const char *s, size_t n);

/* Packs o as msgpack_pack_object does, except that a str that is not
 * well-formed UTF-8 is packed repaired (utf8.h): meta goes back to the
 * client, whose decoder may refuse such a str and with it the result.
 * Recursion is bounded by the pre-scan's depth limit. */
static int mp_pack_clean(msgpack_packer *pk, const msgpack_object *o)
{
    int r = 0;
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        return mp_str_n(pk, o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY:
        r = msgpack_pack_array(pk, o->via.array.size);
        for (uint32_t i = 0; i < o->via.array.size && r == 0; i++)
            r = mp_pack_clean(pk, &o->via.array.ptr[i]);
        return r;
    case MSGPACK_OBJECT_MAP:
        r = msgpack_pack_map(pk, o->via.map.size);
        for (uint32_t i = 0; i < o->via.map.size && r == 0; i++) {
            r = mp_pack_clean(pk, &o->via.map.ptr[i].key);
            if (r == 0) r = mp_pack_clean(pk, &o->via.map.ptr[i].val);
        }
        return r;
    default:
        return msgpack_pack_object(pk, *o);
    }
}

/* Re-encodes a MessagePack meta value into the job (new bytes, owned). */
static int meta_mp(struct codec_request *j, const msgpack_object *o)
{
    struct gbuf b = {.limit = PROTO_META_MAX};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, gbuf_mp_write);
    return meta_store(j, &b, mp_pack_clean(&pk, o));
}

/* Re-encodes a JSON meta value into the job (new bytes, owned). Full
 * precision (jansson's default) so that reals echo back unchanged. */
static int meta_js(struct codec_request *j, const json_t *v)
{
    struct gbuf b = {.limit = PROTO_META_MAX};
    int rc = json_dump_callback(v, gbuf_json_write, &b, JSON_COMPACT | JSON_ENCODE_ANY);
    return meta_store(j, &b, rc);
}

/* Copies a content-type header into a printable, bounded form for a
 * message: the header is untrusted and the message goes back to clients. */
static void printable(char *dst, size_t dst_size, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < dst_size; i++) {
        unsigned char ch = (unsigned char)s[i];
        dst[k++] = ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' ? (char)ch : '?';
    }
    if (dst_size) dst[k] = '\0';
}

/* Checks the content-type header against the body's encoding. Media types
 * are case-insensitive and may carry parameters ("; charset=utf-8"), which
 * are ignored; an unknown type is an error, like a disagreeing one. */
static int check_content_type(struct codec_request *j, const char *ct)
{
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, "; \t");
    char shown[72];
    printable(shown, sizeof(shown), ct, n);
    int is_json = n == strlen(CT_JSON) && strncasecmp(ct, CT_JSON, n) == 0;
    int is_mp = (n == strlen(CT_MSGPACK) && strncasecmp(ct, CT_MSGPACK, n) == 0) ||
                (n == strlen("application/x-msgpack") &&
                 strncasecmp(ct, "application/x-msgpack", n) == 0);
    if (!is_json && !is_mp)
        return fail(j, PROTO_ERR_INVALID_INPUT, "content-type \"%s\" is not %s or %s", shown,
                    CT_MSGPACK, CT_JSON);
    if (is_json != (j->enc == PROTO_ENC_JSON))
        return fail(j, PROTO_ERR_INVALID_INPUT, "content-type \"%s\" disagrees with the %s body",
                    shown, j->enc == PROTO_ENC_JSON ? "JSON" : "MessagePack");
    return 0;
}

/* Validates and copies `model`: an optional string of at most
 * PROTO_MODEL_MAX bytes (no NUL: it becomes a C string). */
static int take_model(struct codec_request *j, const struct fval *m)
{
    if (m->kind == FV_ABSENT) return 0;
    if (m->kind != FV_STR)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field model: must be a string, got %s", m->type);
    if (m->len > PROTO_MODEL_MAX)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field model: %zu bytes, longer than %d", m->len,
                    PROTO_MODEL_MAX);
    if (m->len && memchr(m->s, '\0', m->len))
        return fail(j, PROTO_ERR_INVALID_INPUT, "field model: contains a NUL byte");
    /* The name goes back in the result and into messages: ill-formed
     * UTF-8 is repaired here, once (no model is named so, so the job is
     * answered unknown_model under the repaired name). */
    utf8_repair(j->model, sizeof(j->model), m->s, m->len);
    return 0;
}

/* Allocates req->input for n floats after checking n against the limits. */
static int input_alloc(struct codec_request *j, size_t n, const struct codec_limits *lim)
{
    if (n == 0) return fail(j, PROTO_ERR_INVALID_INPUT, "field input: empty");
    if (lim->max_input_floats == 0)
        return fail(j, PROTO_ERR_INVALID_INPUT,
                    "field input: this worker's models are text encoders: send text or tokens");
    if (n > lim->max_input_floats)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field input: %zu values, more than max_input_floats %zu",
                    n, lim->max_input_floats);
    j->input = malloc(n * sizeof(float));
    if (!j->input) return fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for %zu input values", n);
    j->n_input = n;
    return 0;
}

/* Stores element i, already converted to float32. The check is after the
 * conversion: a finite double beyond FLT_MAX becomes inf here (IEEE-754,
 * C11 Annex F) and is as useless to the model as a NaN. */
static int not_finite(struct codec_request *j, size_t i)
{
    return fail(j, PROTO_ERR_INVALID_INPUT, "field input: element %zu is not finite", i);
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
static int input_mp(struct codec_request *j, const msgpack_object *o, const struct codec_limits *lim)
{
    if (!o) return fail(j, PROTO_ERR_INVALID_INPUT, "field input: missing (nor text, nor tokens)");
    if (o->type == MSGPACK_OBJECT_BIN) {
        const unsigned char *b = (const unsigned char *)o->via.bin.ptr;
        size_t sz = o->via.bin.size;
        if (sz % 4 != 0)
            return fail(j, PROTO_ERR_INVALID_INPUT,
                        "field input: bin of %zu bytes is not a multiple of 4", sz);
        if (input_alloc(j, sz / 4, lim) < 0) return -1;
#if HOST_IS_WIRE_ORDER
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
        return fail(j, PROTO_ERR_INVALID_INPUT,
                    "field input: must be a bin of float32 or an array of numbers, got %s",
                    mp_type(o));
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
            fail(j, PROTO_ERR_INVALID_INPUT, "field input: element %zu is not a number (%s)", i,
                 mp_type(e));
            return input_drop(j);
        }
        if (input_put(j, i, f) < 0) return input_drop(j);
    }
    return 0;
}

/* JSON input: an array of numbers. */
static int input_js(struct codec_request *j, const json_t *v, const struct codec_limits *lim)
{
    if (!v) return fail(j, PROTO_ERR_INVALID_INPUT, "field input: missing (nor text, nor tokens)");
    if (!json_is_array(v))
        return fail(j, PROTO_ERR_INVALID_INPUT, "field input: must be an array of numbers, got %s",
                    js_type(v));
    size_t n = json_array_size(v);
    if (input_alloc(j, n, lim) < 0) return -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        float f;
        if (json_is_integer(e)) {
            f = (float)json_integer_value(e);
        } else if (json_is_real(e)) {
            f = (float)json_real_value(e);
        } else {
            fail(j, PROTO_ERR_INVALID_INPUT, "field input: element %zu is not a number (%s)", i,
                 js_type(e));
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
            return fail(j, PROTO_ERR_INVALID_INPUT,
                        "field %s: row %zu is %zu characters, over max_text_chars %zu", field,
                        i, chars, lim->max_text_chars);
        total += v[i].len;
    }
    *buf = malloc(total ? total : 1);
    *off = malloc((n + 1) * sizeof(**off));
    if (!*buf || !*off)
        return fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for %zu bytes of text", total);
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
    return v->js ? js_type(v->js) : mp_type(v->mp);
}

/* 1 with *out set when v is a string, else 0. */
static int wv_string(const struct wval *v, struct sview *out)
{
    if (v->js ? !json_is_string(v->js) : v->mp->type != MSGPACK_OBJECT_STR) return 0;
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
        return fail(j, PROTO_ERR_INVALID_INPUT,
                    "field %s: must be a string or an array of strings, got %s", field,
                    wv_type(t));
    *n = is_one ? 1 : wv_len(t);
    if (*n == 0) return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: empty array", field);
    if (*n > lim->max_rows)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: %zu rows, more than max_job_rows %zu",
                    field, *n, lim->max_rows);
    if (!(*v = malloc(*n * sizeof(**v))))
        return fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory");
    if (is_one) {
        (*v)[0] = one;
        return 0;
    }
    for (size_t i = 0; i < *n; i++) {
        struct wval e = wv_elem(t, i);
        if (!wv_string(&e, &(*v)[i]))
            return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: row %zu is %s, not a string",
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
        rc = fail(j, PROTO_ERR_INVALID_INPUT,
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
        return fail(j, PROTO_ERR_INVALID_INPUT,
                    "field %s: must be an array of ids or of arrays of ids, got %s", field,
                    wv_type(t));
    size_t n = wv_len(t);
    if (n == 0) return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: empty array", field);
    struct wval first = wv_elem(t, 0);
    int nested = wv_is_array(&first);
    size_t rows = nested ? n : 1, total = 0;
    if (rows > lim->max_rows)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: %zu rows, more than max_job_rows %zu",
                    field, rows, lim->max_rows);
    for (size_t r = 0; r < rows; r++) {
        struct wval row = nested ? wv_elem(t, r) : *t;
        if (!wv_is_array(&row))
            return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: row %zu is %s, not an array",
                        field, r, wv_type(&row));
        size_t len = wv_len(&row);
        if (len == 0) return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: row %zu is empty", field, r);
        total += len;
        if (total > lim->max_tokens)
            return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: more than %zu ids in one job",
                        field, lim->max_tokens);
    }
    if (shape_off && (rows != shape_rows || total != shape_off[shape_rows]))
        return fail(j, PROTO_ERR_INVALID_INPUT, "field %s: not the shape of tokens", field);
    *ids = malloc(total * sizeof(**ids));
    *off = malloc((rows + 1) * sizeof(**off));
    if (!*ids || !*off)
        return fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for %zu ids", total);
    size_t at = 0;
    for (size_t r = 0; r < rows; r++) {
        struct wval row = nested ? wv_elem(t, r) : *t;
        size_t len = wv_len(&row);
        if (shape_off && len != shape_off[r + 1] - shape_off[r])
            return fail(j, PROTO_ERR_INVALID_INPUT,
                        "field %s: row %zu has %zu ids, tokens' row has %zu", field, r, len,
                        shape_off[r + 1] - shape_off[r]);
        (*off)[r] = at;
        for (size_t i = 0; i < len; i++) {
            struct wval e = wv_elem(&row, i);
            int64_t id = wv_id(&e);
            if (id < 0)
                return fail(j, PROTO_ERR_INVALID_INPUT,
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
static int take_rows(struct codec_request *j, const struct fields *f,
                     const struct codec_limits *lim)
{
    int has_in = f->mp_input || f->js_input, has_text = f->mp_text || f->js_text,
        has_tok = f->mp_tokens || f->js_tokens;
    j->truncate = 1;
    if (f->js_truncate) {
        if (!json_is_boolean(f->js_truncate))
            return fail(j, PROTO_ERR_INVALID_INPUT, "field truncate: must be a boolean, got %s",
                        js_type(f->js_truncate));
        j->truncate = json_is_true(f->js_truncate);
    } else if (f->mp_truncate) {
        if (f->mp_truncate->type != MSGPACK_OBJECT_BOOLEAN)
            return fail(j, PROTO_ERR_INVALID_INPUT, "field truncate: must be a boolean, got %s",
                        mp_type(f->mp_truncate));
        j->truncate = f->mp_truncate->via.boolean;
    }
    if (has_in + has_text + has_tok > 1)
        return fail(j, PROTO_ERR_INVALID_INPUT,
                    "fields input, text and tokens: a job gives exactly one of them");
    if ((f->mp_pair || f->js_pair) && !has_text)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field text_pair: only with text");
    if ((f->mp_types || f->js_types) && !has_tok)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field type_ids: only with tokens");
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

/* deadline_ms and timeout_ms: both optional integers; the earlier of the
 * absolute deadline and record time + timeout wins; 0 means none. */
static int take_deadline(struct codec_request *j, const struct fval *dl, const struct fval *to,
                         int64_t record_ts_ms)
{
    int64_t deadline = 0;
    if (dl->kind != FV_ABSENT) {
        if (dl->kind != FV_INT)
            return fail(j, PROTO_ERR_INVALID_INPUT, "field deadline_ms: must be an integer, got %s",
                        dl->type);
        if (dl->too_big || dl->i < 0)
            return fail(j, PROTO_ERR_INVALID_INPUT,
                        "field deadline_ms: out of range (Unix ms, 0 = none)");
        deadline = dl->i;
    }
    if (to->kind != FV_ABSENT) {
        if (to->kind != FV_INT)
            return fail(j, PROTO_ERR_INVALID_INPUT, "field timeout_ms: must be an integer, got %s",
                        to->type);
        if (to->too_big)
            return fail(j, PROTO_ERR_INVALID_INPUT, "field timeout_ms: out of range");
        if (to->i < 0)
            return fail(j, PROTO_ERR_INVALID_INPUT, "field timeout_ms: must be >= 0, got %" PRId64,
                        to->i);
        int64_t base = record_ts_ms > 0 ? record_ts_ms : clock_wall_ms();
        int64_t t = to->i > INT64_MAX - base ? INT64_MAX : base + to->i;
        if (deadline == 0 || t < deadline) deadline = t;
    }
    j->deadline_ms = deadline;
    return 0;
}

/* priority: an optional integer 0..9; absent leaves the job's -1. */
static int take_priority(struct codec_request *j, const struct fval *p)
{
    if (p->kind == FV_ABSENT) return 0;
    if (p->kind != FV_INT)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field priority: must be an integer, got %s",
                    p->type);
    if (p->too_big || p->i < 0 || p->i > 9)
        return fail(j, PROTO_ERR_INVALID_INPUT, "field priority: must be 0..9");
    j->priority = (int)p->i;
    return 0;
}

/* The format-independent part of decoding, in the order errors are
 * reported: id, meta (kept even when a later field fails, so the error
 * result echoes it), content-type, model, input, deadline, priority. The
 * first error stops the rest. */
static enum codec_rc decode_fields(struct dctx *c, const struct fields *f)
{
    struct codec_request *j = c->req;
    if (resolve_id(c, &f->id) == CODEC_DEAD) return CODEC_DEAD;
    if (f->mp_meta) meta_mp(j, f->mp_meta);
    else if (f->js_meta) meta_js(j, f->js_meta);
    if (j->err != PROTO_OK) return CODEC_JOB;
    if (check_content_type(j, c->content_type) < 0) return CODEC_JOB;
    if (take_model(j, &f->model) < 0) return CODEC_JOB;
    int rows = take_rows(j, f, c->lim);
    if (rows < 0) return CODEC_JOB;
    if (rows == 0 && (j->enc == PROTO_ENC_MSGPACK ? input_mp(j, f->mp_input, c->lim) < 0
                                                  : input_js(j, f->js_input, c->lim) < 0))
        return CODEC_JOB;
    if (take_deadline(j, &f->deadline, &f->timeout, c->record_ts_ms) < 0) return CODEC_JOB;
    take_priority(j, &f->priority);
    return CODEC_JOB;
}

/* Matches a MessagePack map key against a field name. */
static int mp_key_is(const msgpack_object *k, const char *name)
{
    size_t n = strlen(name);
    return k->via.str.size == n && memcmp(k->via.str.ptr, name, n) == 0;
}

/* MessagePack: pre-scan (no allocation), unpack into a zone, pick the
 * fields, decode them, free the zone. */
static enum codec_rc decode_msgpack(struct dctx *c, const unsigned char *v, size_t len)
{
    char why[160];
    int is_map = (v[0] >= 0x80 && v[0] <= 0x8f) || v[0] == 0xde || v[0] == 0xdf;
    if (mpscan_check(v, len, c->lim->max_depth, why, sizeof(why)) < 0) {
        /* For something that is not even a map (plain text, say), lead
         * with that: how its bytes failed to parse is secondary. */
        if (!is_map)
            return dead(c, "not a job: a job is a JSON object or a MessagePack map, "
                           "this value starts with byte 0x%02x (msgpack: %s)", v[0], why);
        return dead(c, "msgpack: %s", why);
    }

    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&up, (const char *)v, len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS || off != len) {
        msgpack_unpacked_destroy(&up);
        return dead(c, "msgpack: unpack failed (%d)%s", (int)r,
                    r == MSGPACK_UNPACK_NOMEM_ERROR ? ": out of memory or nested deeper than 32"
                                                    : "");
    }
    const msgpack_object *root = &up.data;
    if (root->type != MSGPACK_OBJECT_MAP) {
        const char *type = mp_type(root); /* before destroy clears root */
        msgpack_unpacked_destroy(&up);
        return dead(c, "msgpack: top level is %s, not a map", type);
    }

    struct fields f;
    memset(&f, 0, sizeof(f));
    enum codec_rc rc = CODEC_JOB;
    const char *dup = NULL;
    for (uint32_t i = 0; i < root->via.map.size && !dup; i++) {
        const msgpack_object *k = &root->via.map.ptr[i].key;
        const msgpack_object *val = &root->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR) continue; /* not a field we know */
        static const char *const scalar_names[] = {"id", "model", "deadline_ms", "timeout_ms",
                                                   "priority"};
        struct fval *scalars[] = {&f.id, &f.model, &f.deadline, &f.timeout, &f.priority};
        for (size_t s = 0; s < sizeof(scalars) / sizeof(scalars[0]); s++) {
            if (!mp_key_is(k, scalar_names[s])) continue;
            if (scalars[s]->kind != FV_ABSENT) dup = scalar_names[s];
            fval_mp(scalars[s], val);
        }
        static const char *const obj_names[] = {"input", "meta",     "text",    "text_pair",
                                                 "tokens", "type_ids", "truncate"};
        const msgpack_object **objs[] = {&f.mp_input,  &f.mp_meta,  &f.mp_text,
                                         &f.mp_pair,   &f.mp_tokens, &f.mp_types,
                                         &f.mp_truncate};
        for (size_t o = 0; o < sizeof(objs) / sizeof(objs[0]); o++) {
            if (!mp_key_is(k, obj_names[o])) continue;
            if (*objs[o]) dup = obj_names[o];
            *objs[o] = val;
        }
    }
    if (dup) rc = dead(c, "msgpack: duplicate field %s", dup);
    else rc = decode_fields(c, &f);
    msgpack_unpacked_destroy(&up);
    return rc;
}

/* 1 when no container in v lies deeper than max (v itself at `depth`).
 * Recursion stops one level past max, so it is bounded by the limit. */
static int json_depth_ok(const json_t *v, int depth, int max)
{
    if (json_is_object(v)) {
        if (depth > max) return 0;
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e)
            if (!json_depth_ok(e, depth + 1, max)) return 0;
    } else if (json_is_array(v)) {
        if (depth > max) return 0;
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_depth_ok(json_array_get(v, i), depth + 1, max)) return 0;
    }
    return 1;
}

/* JSON: parse (duplicates rejected, trailing bytes rejected by jansson),
 * cap the depth, pick the fields, decode them, free the tree. */
static enum codec_rc decode_json(struct dctx *c, const unsigned char *v, size_t len)
{
    json_error_t e;
    /* NUL is allowed inside strings (\u0000): a text may carry one, and
     * the tokenizer drops it; every other string field is checked. */
    json_t *root = json_loadb((const char *)v, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
    if (!root) return dead(c, "json: %s (line %d, column %d)", e.text, e.line, e.column);
    if (!json_is_object(root)) {
        enum codec_rc rc = dead(c, "json: top level is %s, not an object", js_type(root));
        json_decref(root);
        return rc;
    }
    if (!json_depth_ok(root, 1, c->lim->max_depth)) {
        json_decref(root);
        return dead(c, "json: nesting deeper than %d", c->lim->max_depth);
    }
    struct fields f;
    memset(&f, 0, sizeof(f));
    fval_js(&f.id, json_object_get(root, "id"));
    fval_js(&f.model, json_object_get(root, "model"));
    fval_js(&f.deadline, json_object_get(root, "deadline_ms"));
    fval_js(&f.timeout, json_object_get(root, "timeout_ms"));
    fval_js(&f.priority, json_object_get(root, "priority"));
    f.js_input = json_object_get(root, "input");
    f.js_meta = json_object_get(root, "meta");
    f.js_text = json_object_get(root, "text");
    f.js_pair = json_object_get(root, "text_pair");
    f.js_tokens = json_object_get(root, "tokens");
    f.js_types = json_object_get(root, "type_ids");
    f.js_truncate = json_object_get(root, "truncate");
    enum codec_rc rc = decode_fields(c, &f);
    json_decref(root);
    return rc;
}

/* Entry point: cheap checks first (empty, oversize), then the encoding's
 * decoder. See the header for the contract and the top of this file for
 * the choices made where the contract is silent. */
enum codec_rc codec_decode_job(const void *value, size_t len, const void *key,
                               size_t key_len, const char *content_type,
                               int64_t record_ts_ms,
                               const struct codec_limits *lim, struct codec_request *req,
                               char *errstr, size_t errstr_size)
{
    struct dctx c = {
        .req = req,
        .lim = lim,
        .key = key,
        .key_len = key ? key_len : 0,
        .content_type = content_type,
        .record_ts_ms = record_ts_ms,
        .errstr = errstr,
        .errstr_size = errstr_size,
    };
    c.key_ok = key && proto_id_valid(key, key_len);
    if (errstr && errstr_size > 0) errstr[0] = '\0';

    codec_request_fini(req);
    req->id[0] = '\0';
    req->model[0] = '\0';
    req->deadline_ms = 0;
    req->priority = -1;
    req->err = PROTO_OK;
    req->errmsg[0] = '\0';

    if (!value || len == 0) return dead(&c, "empty value");
    const unsigned char *v = value;
    req->enc = v[0] == '{' ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK;
    if (len > lim->max_payload_bytes) {
        if (!c.key_ok)
            return dead(&c, "payload of %zu bytes exceeds max_payload_bytes %zu, and the record "
                            "key is not a valid id", len, lim->max_payload_bytes);
        id_from_key(&c);
        fail(req, PROTO_ERR_INVALID_INPUT, "payload of %zu bytes exceeds max_payload_bytes %zu",
                 len, lim->max_payload_bytes);
        return CODEC_JOB;
    }
    return req->enc == PROTO_ENC_JSON ? decode_json(&c, v, len) : decode_msgpack(&c, v, len);
}

/* ------------------------------------------------------------------ */
/* Encoding                                                            */
/* ------------------------------------------------------------------ */

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

/* Packs n bytes as a str, repaired when they are not well-formed UTF-8
 * (every str of a result must be: see utf8.h). A str longer than
 * PROTO_META_MAX is cut there first: no result field is longer, and meta
 * that long is refused whole anyway. */
static int mp_str_n(msgpack_packer *pk, const char *s, size_t n)
{
    if (utf8_valid(s, n)) return msgpack_pack_str_with_body(pk, s, n);
    if (n > PROTO_META_MAX + 1) n = PROTO_META_MAX + 1;
    char *t = malloc(3 * n + 1);
    if (!t) return -1;
    size_t len = utf8_repair(t, 3 * n + 1, s, n);
    int r = msgpack_pack_str_with_body(pk, t, len);
    free(t);
    return r;
}

/* Packs a NUL-terminated string. */
static int mp_str(msgpack_packer *pk, const char *s)
{
    return mp_str_n(pk, s, strlen(s));
}

/* The body of a bin of n float32, little-endian. */
static int mp_pack_floats(msgpack_packer *pk, const float *x, size_t n)
{
#if HOST_IS_WIRE_ORDER
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
    return enc == PROTO_ENC_JSON ? CT_JSON : CT_MSGPACK;
}

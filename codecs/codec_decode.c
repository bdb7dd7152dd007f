/* codec_decode.c - the decoding half of the wire contract of
 * docs/protocol.md: decodes a job record value (MessagePack or JSON, told
 * apart by the first byte) into a struct codec_request. This file reads
 * the envelope (id, meta, content type, model, deadline, priority); what
 * the job carries to run (input floats, text or token rows) is read by
 * codec_payload.c. codec_encode.c encodes results.
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
 *   deep, trailing bytes, duplicate keys). An oversize payload is answered
 *   with invalid_input when the key is a usable id, because that record
 *   may be a well-formed job that is merely too big; a dead-lettered
 *   record with such a key is answered as well, by the intake (it has the
 *   record's bytes for the dead letter).
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
#include "codec_decode.h"

#include <errno.h>
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

#include "../base/clock.h"
#include "../base/utf8.h"
#include "gbuf.h"
#include "mpscan.h"

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
    codec_gen_free(r->gen);
    r->gen = NULL;
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
const char *codec_mp_type(const msgpack_object *o)
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

/* See codec_decode.h. */
const char *codec_js_bignum(const json_t *v, size_t *len)
{
    if (!json_is_string(v)) return NULL;
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (n <= CODEC_BIGNUM_TAG_LEN || memcmp(s, CODEC_BIGNUM_TAG, CODEC_BIGNUM_TAG_LEN) != 0)
        return NULL;
    *len = n - CODEC_BIGNUM_TAG_LEN;
    return s + CODEC_BIGNUM_TAG_LEN;
}

/* Whether a number's text is a real (has a fraction or an exponent). */
static int num_is_real(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '.' || s[i] == 'e' || s[i] == 'E') return 1;
    return 0;
}

/* The JSON type of a value, for messages. */
const char *codec_js_type(const json_t *v)
{
    size_t n;
    const char *num = codec_js_bignum(v, &n);
    if (num) return num_is_real(num, n) ? "real" : "integer";
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
    f->type = codec_mp_type(o);
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
    f->type = codec_js_type(v);
    size_t n;
    const char *num = codec_js_bignum(v, &n);
    if (num) {
        /* too large for C: an integer is out of range, a real is not an integer */
        f->kind = num_is_real(num, n) ? FV_OTHER : FV_INT;
        f->too_big = 1;
    } else if (json_is_string(v)) {
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
        codec_fail(c->req, PROTO_ERR_INVALID_INPUT, "%s", why);
        return CODEC_JOB;
    }
    return dead(c, "%s; the record key is not a valid id either", why);
}

/* Records a decode error on the job unless an earlier one is already set:
 * the first error is the one reported. Returns -1 for `return codec_fail(...)`. */
int codec_fail(struct codec_request *j, enum proto_err e, const char *fmt, ...)
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
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field meta: more than %d encoded bytes",
                        PROTO_META_MAX);
        return codec_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory encoding meta");
    }
    j->meta = gbuf_take(b, &j->meta_len);
    return 0;
}

/* Packs o as msgpack_pack_object does, except that a str that is not
 * well-formed UTF-8 is packed repaired (utf8.h): meta goes back to the
 * client, whose decoder may refuse such a str and with it the result.
 * Recursion is bounded by the pre-scan's depth limit. */
static int mp_pack_clean(msgpack_packer *pk, const msgpack_object *o)
{
    int r = 0;
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        return gbuf_mp_str_n(pk, o->via.str.ptr, o->via.str.size);
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

/* The dumped form of a rewritten number: the string jansson writes for
 * CODEC_BIGNUM_TAG and the text that follows it. */
static const char BIGNUM_DUMPED[] = "\"\\u0000kinfer-number:";

/* Puts the numbers rewritten as strings back as they were written, in
 * place: `"\u0000kinfer-number:1e400"` becomes `1e400` (the text between
 * is a number's, which needs no escaping). A key (followed by ':') that
 * merely looks like one stays as it is. */
static void meta_unrewrite(struct gbuf *b)
{
    size_t tag = sizeof(BIGNUM_DUMPED) - 1, r = 0, w = 0;
    while (r < b->len) {
        if (b->len - r > tag && memcmp(b->p + r, BIGNUM_DUMPED, tag) == 0) {
            size_t end = r + tag;
            while (end < b->len && b->p[end] != '"') end++;
            if (end < b->len && (end + 1 == b->len || b->p[end + 1] != ':')) {
                memmove(b->p + w, b->p + r + tag, end - r - tag);
                w += end - r - tag;
                r = end + 1;
                continue;
            }
        }
        b->p[w++] = b->p[r++];
    }
    b->len = w;
}

/* Re-encodes a JSON meta value into the job (new bytes, owned). Full
 * precision (jansson's default) so that reals echo back unchanged; numbers
 * too large for C (bignums of them, rewritten as strings) echo back as
 * they were written. The limit allows for the rewriting, then holds for
 * the bytes stored. */
static int meta_js(struct codec_request *j, const json_t *v, size_t bignums)
{
    size_t extra = bignums > PROTO_META_MAX ? PROTO_META_MAX : bignums;
    struct gbuf b = {.limit = PROTO_META_MAX + extra * sizeof(BIGNUM_DUMPED)};
    int rc = json_dump_callback(v, gbuf_json_write, &b, JSON_COMPACT | JSON_ENCODE_ANY);
    if (rc == 0 && !b.over && bignums) {
        meta_unrewrite(&b);
        if (b.len > PROTO_META_MAX) b.over = 1;
    }
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
    int is_json = n == strlen(PROTO_CT_JSON) && strncasecmp(ct, PROTO_CT_JSON, n) == 0;
    int is_mp = (n == strlen(PROTO_CT_MSGPACK) && strncasecmp(ct, PROTO_CT_MSGPACK, n) == 0) ||
                (n == strlen("application/x-msgpack") &&
                 strncasecmp(ct, "application/x-msgpack", n) == 0);
    if (!is_json && !is_mp)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "content-type \"%s\" is not %s or %s", shown,
                    PROTO_CT_MSGPACK, PROTO_CT_JSON);
    if (is_json != (j->enc == PROTO_ENC_JSON))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "content-type \"%s\" disagrees with the %s body",
                    shown, j->enc == PROTO_ENC_JSON ? "JSON" : "MessagePack");
    return 0;
}

/* Validates and copies `model`: an optional string of at most
 * PROTO_MODEL_MAX bytes (no NUL: it becomes a C string). */
static int take_model(struct codec_request *j, const struct fval *m)
{
    if (m->kind == FV_ABSENT) return 0;
    if (m->kind != FV_STR)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field model: must be a string, got %s", m->type);
    if (m->len > PROTO_MODEL_MAX)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field model: %zu bytes, longer than %d", m->len,
                    PROTO_MODEL_MAX);
    if (m->len && memchr(m->s, '\0', m->len))
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field model: contains a NUL byte");
    /* The name goes back in the result and into messages: ill-formed
     * UTF-8 is repaired here, once (no model is named so, so the job is
     * answered unknown_model under the repaired name). */
    utf8_repair(j->model, sizeof(j->model), m->s, m->len);
    return 0;
}

/* deadline_ms and timeout_ms: both optional integers; the earlier of the
 * absolute deadline and record time + timeout wins; 0 means none. */
static int take_deadline(struct codec_request *j, const struct fval *dl, const struct fval *to,
                         int64_t record_ts_ms)
{
    int64_t deadline = 0;
    if (dl->kind != FV_ABSENT) {
        if (dl->kind != FV_INT)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field deadline_ms: must be an integer, got %s",
                        dl->type);
        if (dl->too_big || dl->i < 0)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT,
                        "field deadline_ms: out of range (Unix ms, 0 = none)");
        deadline = dl->i;
    }
    if (to->kind != FV_ABSENT) {
        if (to->kind != FV_INT)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field timeout_ms: must be an integer, got %s",
                        to->type);
        if (to->too_big)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field timeout_ms: out of range");
        if (to->i < 0)
            return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field timeout_ms: must be >= 0, got %" PRId64,
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
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field priority: must be an integer, got %s",
                    p->type);
    if (p->too_big || p->i < 0 || p->i > 9)
        return codec_fail(j, PROTO_ERR_INVALID_INPUT, "field priority: must be 0..9");
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
    else if (f->js_meta) meta_js(j, f->js_meta, f->js_bignums);
    if (j->err != PROTO_OK) return CODEC_JOB;
    if (check_content_type(j, c->content_type) < 0) return CODEC_JOB;
    if (take_model(j, &f->model) < 0) return CODEC_JOB;
    int gen = codec_take_gen(j, f, c->lim);
    if (gen < 0) return CODEC_JOB;
    int rows = gen ? 1 : codec_take_rows(j, f, c->lim);
    if (rows < 0) return CODEC_JOB;
    if (rows == 0 && (j->enc == PROTO_ENC_MSGPACK ? codec_input_mp(j, f->mp_input, c->lim) < 0
                                                  : codec_input_js(j, f->js_input, c->lim) < 0))
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
    /* A record that is JSON but no object ([1,2,3], or an object after
     * whitespace) is told so, rather than how MessagePack read its bytes. */
    json_t *js = is_map ? NULL : json_loadb((const char *)v, len, JSON_DECODE_ANY, NULL);
    if (js) {
        const char *type = json_is_object(js) ? "object" : codec_js_type(js);
        int obj = json_is_object(js);
        json_decref(js);
        if (obj)
            return dead(c, "not a job: the record is a JSON object after whitespace; a JSON job "
                           "starts with '{'");
        return dead(c, "not a job: the record is a JSON %s; a job is a JSON object", type);
    }
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
        const char *type = codec_mp_type(root); /* before destroy clears root */
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
        for (size_t o = 0; o < CODEC_GEN_FIELDS; o++) {
            if (!mp_key_is(k, codec_gen_names[o])) continue;
            if (f.mp_gen[o]) dup = codec_gen_names[o];
            f.mp_gen[o] = val;
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

/* Whether the number text s (n bytes) is one jansson refuses: an integer
 * outside int64 ("too big integer"), or a real that overflows a double
 * ("real number overflow"); underflow to 0 is accepted, as jansson does. */
static int num_overflows(const char *s, size_t n)
{
    char buf[64];
    char *t = n < sizeof(buf) ? buf : malloc(n + 1);
    if (!t) return 0;
    memcpy(t, s, n);
    t[n] = '\0';
    int over;
    errno = 0;
    if (num_is_real(s, n)) {
        double d = strtod(t, NULL);
        over = isinf(d) && errno == ERANGE;
    } else {
        (void)strtoll(t, NULL, 10);
        over = errno == ERANGE;
    }
    if (t != buf) free(t);
    return over;
}

/* A copy of the JSON text v with every number jansson would refuse
 * rewritten as a CODEC_BIGNUM_TAG string (codec_decode.h), *count of them;
 * NULL when out of memory. Strings are skipped as they are (escapes
 * included); anything that is not valid JSON stays invalid. */
static char *rewrite_bignums(const unsigned char *v, size_t len, size_t *count, size_t *out_len)
{
    static const char open[] = "\"\\u0000kinfer-number:";
    struct gbuf b = {.limit = SIZE_MAX};
    int in_str = 0, r = 0;
    size_t i = 0;
    *count = 0;
    while (i < len && r == 0) {
        unsigned char ch = v[i];
        if (in_str) {
            size_t k = i;
            while (k < len && v[k] != '"' && v[k] != '\\') k++;
            if (k < len && v[k] == '\\') k = k + 2 > len ? len : k + 2;
            else if (k < len) in_str = 0, k++;
            r = gbuf_put(&b, v + i, k - i);
            i = k;
        } else if (ch == '"') {
            in_str = 1;
            r = gbuf_put(&b, v + i++, 1);
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            size_t k = i;
            while (k < len && ((v[k] >= '0' && v[k] <= '9') || v[k] == '-' || v[k] == '+' ||
                               v[k] == '.' || v[k] == 'e' || v[k] == 'E'))
                k++;
            if (num_overflows((const char *)v + i, k - i)) {
                r |= gbuf_put(&b, open, sizeof(open) - 1);
                r |= gbuf_put(&b, v + i, k - i);
                r |= gbuf_put(&b, "\"", 1);
                ++*count;
            } else {
                r = gbuf_put(&b, v + i, k - i);
            }
            i = k;
        } else {
            r = gbuf_put(&b, v + i++, 1);
        }
    }
    if (r) {
        free(b.p);
        return NULL;
    }
    *out_len = b.len;
    return (char *)b.p;
}

/* Rewritten numbers in the tree (CODEC_BIGNUM_TAG strings, keys aside). */
static size_t count_bignums(const json_t *v)
{
    size_t n = 0, len;
    if (codec_js_bignum(v, &len)) return 1;
    if (json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) n += count_bignums(e);
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) n += count_bignums(json_array_get(v, i));
    }
    return n;
}

/* JSON: parse (duplicates rejected, trailing bytes rejected by jansson),
 * cap the depth, pick the fields, decode them, free the tree. A document
 * refused for ill-formed UTF-8 is parsed again with it marked, and the
 * markers turned back (json_utf8.c): kept only when exactly those are
 * found, else the record is dead-lettered for jansson's first error. A document
 * refused only for numbers C cannot hold is parsed again with them
 * rewritten (codec_decode.h, CODEC_BIGNUM_TAG); that is kept only when
 * it holds exactly the rewritten numbers (no forged tag), else the record
 * is dead-lettered for its first error as before. */
static enum codec_rc decode_json(struct dctx *c, const unsigned char *v, size_t len)
{
    json_error_t e;
    /* NUL is allowed inside strings (\u0000): a text may carry one, and
     * the tokenizer drops it; every other string field is checked. */
    const size_t flags = JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL;
    json_t *root = json_loadb((const char *)v, len, flags, &e);
    /* Ill-formed UTF-8: parsed again with it marked (json_utf8.c); e
     * stays the first error, the one a dead letter names. */
    char *marked = NULL;
    size_t marks = 0, keys = 0;
    json_error_t e2 = e;
    if (!root && json_error_code(&e) == json_error_invalid_utf8) {
        size_t mlen = 0;
        marked = codec_js_mark_utf8(v, len, &marks, &keys, &mlen);
        if (marked && (marks || keys)) {
            v = (const unsigned char *)marked;
            len = mlen;
            root = json_loadb(marked, mlen, flags, &e2);
        }
    }
    size_t bignums = 0;
    if (!root && json_error_code(&e2) == json_error_numeric_overflow) {
        size_t rlen = 0;
        char *rw = rewrite_bignums(v, len, &bignums, &rlen);
        json_error_t e3;
        if (rw && bignums) root = json_loadb(rw, rlen, flags, &e3);
        free(rw);
        if (root && (!json_depth_ok(root, 1, c->lim->max_depth) ||
                     count_bignums(root) != bignums)) {
            json_decref(root);
            root = NULL;
        }
    }
    free(marked);
    if (root && marks) {
        size_t found = 0;
        if (!json_depth_ok(root, 1, c->lim->max_depth) ||
            codec_js_unmark_utf8(root, &found) < 0 || found != marks) {
            json_decref(root);
            root = NULL;
        }
    }
    if (!root) return dead(c, "json: %s (line %d, column %d)", e.text, e.line, e.column);
    if (!json_is_object(root)) {
        enum codec_rc rc = dead(c, "json: top level is %s, not an object", codec_js_type(root));
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
    f.js_bignums = bignums;
    for (size_t o = 0; o < CODEC_GEN_FIELDS; o++)
        f.js_gen[o] = json_object_get(root, codec_gen_names[o]);
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
        codec_fail(req, PROTO_ERR_INVALID_INPUT, "payload of %zu bytes exceeds max_payload_bytes %zu",
                 len, lim->max_payload_bytes);
        return CODEC_JOB;
    }
    return req->enc == PROTO_ENC_JSON ? decode_json(&c, v, len) : decode_msgpack(&c, v, len);
}

/* wire.c - client-side encoding of jobs and decoding of results, with
 * msgpack-c and jansson. Results come from kinfer (trusted, size-bounded by
 * its own encoder), so no pre-scan is needed here.
 *
 * Threads: any. */
#include "wire.h"

#include <jansson.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* Packs a jansson value as MessagePack (for meta given as JSON text). */
static void pack_json(msgpack_packer *pk, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(v));
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            pack_str(pk, k);
            pack_json(pk, e);
        }
        break;
    }
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++) pack_json(pk, json_array_get(v, i));
        break;
    case JSON_STRING: pack_str(pk, json_string_value(v)); break;
    case JSON_INTEGER: msgpack_pack_int64(pk, json_integer_value(v)); break;
    case JSON_REAL: msgpack_pack_double(pk, json_real_value(v)); break;
    case JSON_TRUE: msgpack_pack_true(pk); break;
    case JSON_FALSE: msgpack_pack_false(pk); break;
    case JSON_NULL: msgpack_pack_nil(pk); break;
    }
}

static size_t text_len(const struct wire_job *j, size_t i)
{
    return j->text_len ? j->text_len[i] : strlen(j->text[i]);
}

/* An encoder's fields, MessagePack: how many map entries they add. */
static size_t mp_rows_fields(const struct wire_job *j)
{
    return (j->text != NULL) + (j->text_pair != NULL) + (j->tokens != NULL) +
           (j->type_ids != NULL) + (j->truncate != WIRE_TRUNCATE_ABSENT);
}

static void mp_ids(msgpack_packer *pk, const struct wire_job *j, const int32_t *ids)
{
    int one = j->n_token_rows == 1;
    if (!one) msgpack_pack_array(pk, j->n_token_rows);
    for (size_t r = 0; r < j->n_token_rows; r++) {
        msgpack_pack_array(pk, j->token_off[r + 1] - j->token_off[r]);
        for (size_t k = j->token_off[r]; k < j->token_off[r + 1]; k++)
            msgpack_pack_int32(pk, ids[k]);
    }
}

static void mp_rows(msgpack_packer *pk, const struct wire_job *j)
{
    int one = j->n_text == 1 && !j->text_as_array;
    const char *const *fields[2] = {j->text, j->text_pair};
    const char *names[2] = {"text", "text_pair"};
    for (int f = 0; f < 2; f++) {
        if (!fields[f]) continue;
        pack_str(pk, names[f]);
        if (!one) msgpack_pack_array(pk, j->n_text);
        for (size_t i = 0; i < j->n_text; i++) {
            size_t n = f == 0 ? text_len(j, i) : strlen(fields[f][i]);
            msgpack_pack_str(pk, n);
            msgpack_pack_str_body(pk, fields[f][i], n);
        }
    }
    if (j->tokens) {
        pack_str(pk, "tokens");
        mp_ids(pk, j, j->tokens);
    }
    if (j->type_ids) {
        pack_str(pk, "type_ids");
        mp_ids(pk, j, j->type_ids);
    }
    if (j->truncate != WIRE_TRUNCATE_ABSENT) {
        pack_str(pk, "truncate");
        if (j->truncate == WIRE_TRUNCATE_TRUE) msgpack_pack_true(pk);
        else msgpack_pack_false(pk);
    }
}

static json_t *js_ids(const struct wire_job *j, const int32_t *ids)
{
    json_t *all = json_array();
    for (size_t r = 0; r < j->n_token_rows; r++) {
        json_t *row = json_array();
        for (size_t k = j->token_off[r]; k < j->token_off[r + 1]; k++)
            json_array_append_new(row, json_integer(ids[k]));
        if (j->n_token_rows == 1) {
            json_decref(all);
            return row;
        }
        json_array_append_new(all, row);
    }
    return all;
}

static void js_rows(json_t *o, const struct wire_job *j)
{
    int one = j->n_text == 1 && !j->text_as_array;
    const char *const *fields[2] = {j->text, j->text_pair};
    const char *names[2] = {"text", "text_pair"};
    for (int f = 0; f < 2; f++) {
        if (!fields[f]) continue;
        json_t *a = one ? NULL : json_array();
        for (size_t i = 0; i < j->n_text; i++) {
            size_t n = f == 0 ? text_len(j, i) : strlen(fields[f][i]);
            json_t *str = json_stringn_nocheck(fields[f][i], n);
            if (one) a = str;
            else json_array_append_new(a, str);
        }
        json_object_set_new(o, names[f], a);
    }
    if (j->tokens) json_object_set_new(o, "tokens", js_ids(j, j->tokens));
    if (j->type_ids) json_object_set_new(o, "type_ids", js_ids(j, j->type_ids));
    if (j->truncate != WIRE_TRUNCATE_ABSENT)
        json_object_set_new(o, "truncate", json_boolean(j->truncate == WIRE_TRUNCATE_TRUE));
}

static int encode_msgpack(const struct wire_job *j, unsigned char **out, size_t *out_len)
{
    json_t *meta = NULL;
    if (j->meta_json) {
        meta = json_loads(j->meta_json, JSON_DECODE_ANY, NULL);
        if (!meta) return -1;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    size_t n = 1 + (j->model != NULL) + (j->input != NULL) + (j->deadline_ms != 0) +
               (j->timeout_ms >= 0) + (j->priority >= 0) + (meta != NULL) + mp_rows_fields(j);
    msgpack_pack_map(&pk, n);
    pack_str(&pk, "id");
    pack_str(&pk, j->id ? j->id : "");
    if (j->model) { pack_str(&pk, "model"); pack_str(&pk, j->model); }
    if (j->input) {
        pack_str(&pk, "input");
        if (j->input_as_array) {
            msgpack_pack_array(&pk, j->n_input);
            for (size_t i = 0; i < j->n_input; i++) msgpack_pack_float(&pk, j->input[i]);
        } else {
            /* float32 little-endian: the host order on every target kinfer builds for. */
            _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian host");
            msgpack_pack_bin(&pk, j->n_input * 4);
            msgpack_pack_bin_body(&pk, j->input, j->n_input * 4);
        }
    }
    mp_rows(&pk, j);
    if (j->deadline_ms) { pack_str(&pk, "deadline_ms"); msgpack_pack_int64(&pk, j->deadline_ms); }
    if (j->timeout_ms >= 0) { pack_str(&pk, "timeout_ms"); msgpack_pack_int64(&pk, j->timeout_ms); }
    if (j->priority >= 0) { pack_str(&pk, "priority"); msgpack_pack_int(&pk, j->priority); }
    if (meta) { pack_str(&pk, "meta"); pack_json(&pk, meta); json_decref(meta); }
    *out = (unsigned char *)sb.data;
    *out_len = sb.size;
    return 0;
}

static int encode_json(const struct wire_job *j, unsigned char **out, size_t *out_len)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(j->id ? j->id : ""));
    if (j->model) json_object_set_new(o, "model", json_string(j->model));
    if (j->input) {
        json_t *a = json_array();
        for (size_t i = 0; i < j->n_input; i++) json_array_append_new(a, json_real(j->input[i]));
        json_object_set_new(o, "input", a);
    }
    js_rows(o, j);
    if (j->deadline_ms) json_object_set_new(o, "deadline_ms", json_integer(j->deadline_ms));
    if (j->timeout_ms >= 0) json_object_set_new(o, "timeout_ms", json_integer(j->timeout_ms));
    if (j->priority >= 0) json_object_set_new(o, "priority", json_integer(j->priority));
    if (j->meta_json) {
        json_t *meta = json_loads(j->meta_json, JSON_DECODE_ANY, NULL);
        if (!meta) { json_decref(o); return -1; }
        json_object_set_new(o, "meta", meta);
    }
    size_t size = json_dumpb(o, NULL, 0, JSON_COMPACT | JSON_REAL_PRECISION(9));
    char *s = size ? malloc(size + 1) : NULL;
    if (s) {
        json_dumpb(o, s, size, JSON_COMPACT | JSON_REAL_PRECISION(9));
        s[size] = '\0';
    }
    json_decref(o);
    if (!s) return -1;
    *out = (unsigned char *)s;
    *out_len = size;
    return 0;
}

int wire_encode_job(const struct wire_job *j, enum proto_enc enc, unsigned char **out,
                    size_t *out_len)
{
    return enc == PROTO_ENC_JSON ? encode_json(j, out, out_len)
                               : encode_msgpack(j, out, out_len);
}

/* ---- results -------------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap) n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

static double mp_num(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return o->via.f64;
    default: return 0;
    }
}

static int mp_key_is(const msgpack_object *k, const char *s)
{
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(s) &&
           memcmp(k->via.str.ptr, s, k->via.str.size) == 0;
}

/* Converts a msgpack object to jansson (for meta's JSON text). */
static json_t *mp_to_json(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return json_null();
    case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer(o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return json_real(o->via.f64);
    case MSGPACK_OBJECT_STR: return json_stringn(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->via.array.size; i++)
            json_array_append_new(a, mp_to_json(&o->via.array.ptr[i]));
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR) continue;
            char key[256];
            copy_str(key, sizeof(key), k->via.str.ptr, k->via.str.size);
            json_object_set_new(m, key, mp_to_json(&o->via.map.ptr[i].val));
        }
        return m;
    }
    default: return json_null();
    }
}

static void set_meta(struct wire_result *r, json_t *meta)
{
    char *s = json_dumps(meta, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    if (s) {
        copy_str(r->meta_json, sizeof(r->meta_json), s, strlen(s));
        r->has_meta = 1;
        free(s);
    }
}

static int decode_msgpack(const void *body, size_t len, struct wire_result *r,
                          char *errstr, size_t errstr_size)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, body, len, NULL) != MSGPACK_UNPACK_SUCCESS ||
        u.data.type != MSGPACK_OBJECT_MAP) {
        snprintf(errstr, errstr_size, "result is not a MessagePack map");
        msgpack_unpacked_destroy(&u);
        return -1;
    }
    const msgpack_object_map *m = &u.data.via.map;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key, *v = &m->ptr[i].val;
        if (mp_key_is(k, "id") && v->type == MSGPACK_OBJECT_STR)
            copy_str(r->id, sizeof(r->id), v->via.str.ptr, v->via.str.size);
        else if (mp_key_is(k, "model") && v->type == MSGPACK_OBJECT_STR)
            copy_str(r->model, sizeof(r->model), v->via.str.ptr, v->via.str.size);
        else if (mp_key_is(k, "status") && v->type == MSGPACK_OBJECT_STR)
            r->ok = v->via.str.size == 2 && memcmp(v->via.str.ptr, "ok", 2) == 0;
        else if (mp_key_is(k, "output") && v->type == MSGPACK_OBJECT_BIN) {
            size_t n = v->via.bin.size / 4;
            r->output = malloc(n ? n * 4 : 1);
            if (r->output) memcpy(r->output, v->via.bin.ptr, n * 4);
        } else if (mp_key_is(k, "shape") && v->type == MSGPACK_OBJECT_ARRAY &&
                   (v->via.array.size == 2 || v->via.array.size == 3)) {
            size_t d = v->via.array.size;
            r->rows = (size_t)mp_num(&v->via.array.ptr[0]);
            r->width = (size_t)mp_num(&v->via.array.ptr[d - 1]);
            if (d == 3) r->tokens_dim = (size_t)mp_num(&v->via.array.ptr[1]);
        } else if (mp_key_is(k, "lengths") && v->type == MSGPACK_OBJECT_ARRAY) {
            r->lengths = calloc(v->via.array.size + 1, sizeof(size_t));
            r->n_lengths = r->lengths ? v->via.array.size : 0;
            for (uint32_t e = 0; r->lengths && e < v->via.array.size; e++)
                r->lengths[e] = (size_t)mp_num(&v->via.array.ptr[e]);
        } else if (mp_key_is(k, "scores")) {
            r->has_scores = 1;
            if (v->type == MSGPACK_OBJECT_BIN) {
                size_t n = v->via.bin.size / 4;
                r->scores = malloc(n ? n * 4 : 1);
                if (r->scores) memcpy(r->scores, v->via.bin.ptr, n * 4);
            }
        } else if (mp_key_is(k, "labels") && v->type == MSGPACK_OBJECT_ARRAY) {
            r->labels = calloc(v->via.array.size + 1, sizeof(char *));
            r->n_labels = r->labels ? v->via.array.size : 0;
            for (uint32_t e = 0; r->labels && e < v->via.array.size; e++) {
                const msgpack_object *l = &v->via.array.ptr[e];
                if (l->type == MSGPACK_OBJECT_STR) r->labels[e] = strndup(l->via.str.ptr, l->via.str.size);
            }
        } else if ((mp_key_is(k, "error") || mp_key_is(k, "timing") ||
                    mp_key_is(k, "source")) && v->type == MSGPACK_OBJECT_MAP) {
            for (uint32_t e = 0; e < v->via.map.size; e++) {
                const msgpack_object *ek = &v->via.map.ptr[e].key,
                                     *ev = &v->via.map.ptr[e].val;
                int is_str = ev->type == MSGPACK_OBJECT_STR;
                if (mp_key_is(ek, "code") && is_str)
                    copy_str(r->code, sizeof(r->code), ev->via.str.ptr, ev->via.str.size);
                else if (mp_key_is(ek, "message") && is_str)
                    copy_str(r->message, sizeof(r->message), ev->via.str.ptr, ev->via.str.size);
                else if (mp_key_is(ek, "topic") && is_str)
                    copy_str(r->topic, sizeof(r->topic), ev->via.str.ptr, ev->via.str.size);
                else if (mp_key_is(ek, "queued_ms")) r->queued_ms = mp_num(ev);
                else if (mp_key_is(ek, "infer_ms")) r->infer_ms = mp_num(ev);
                else if (mp_key_is(ek, "total_ms")) r->total_ms = mp_num(ev);
                else if (mp_key_is(ek, "batch_rows")) r->batch_rows = (int64_t)mp_num(ev);
                else if (mp_key_is(ek, "tokens")) r->tokens = (int64_t)mp_num(ev);
                else if (mp_key_is(ek, "padded_tokens")) r->padded_tokens = (int64_t)mp_num(ev);
                else if (mp_key_is(ek, "partition")) r->partition = (int64_t)mp_num(ev);
                else if (mp_key_is(ek, "offset")) r->offset = (int64_t)mp_num(ev);
            }
        } else if (mp_key_is(k, "meta")) {
            json_t *j = mp_to_json(v);
            set_meta(r, j);
            json_decref(j);
        }
    }
    msgpack_unpacked_destroy(&u);
    return 0;
}

static int decode_json(const void *body, size_t len, struct wire_result *r,
                       char *errstr, size_t errstr_size)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o || !json_is_object(o)) {
        snprintf(errstr, errstr_size, "result is not a JSON object: %s", je.text);
        json_decref(o);
        return -1;
    }
    const char *s;
    if ((s = json_string_value(json_object_get(o, "id")))) copy_str(r->id, sizeof(r->id), s, strlen(s));
    if ((s = json_string_value(json_object_get(o, "model")))) copy_str(r->model, sizeof(r->model), s, strlen(s));
    s = json_string_value(json_object_get(o, "status"));
    r->ok = s && strcmp(s, "ok") == 0;
    json_t *out = json_object_get(o, "output");
    if (json_is_array(out)) {
        size_t n = json_array_size(out);
        r->output = malloc(n ? n * sizeof(float) : 1);
        for (size_t i = 0; r->output && i < n; i++)
            r->output[i] = (float)json_number_value(json_array_get(out, i));
    }
    json_t *shape = json_object_get(o, "shape");
    size_t d = json_array_size(shape);
    if (d == 2 || d == 3) {
        r->rows = (size_t)json_integer_value(json_array_get(shape, 0));
        r->width = (size_t)json_integer_value(json_array_get(shape, d - 1));
        if (d == 3) r->tokens_dim = (size_t)json_integer_value(json_array_get(shape, 1));
    }
    json_t *lens = json_object_get(o, "lengths");
    if (json_is_array(lens)) {
        r->lengths = calloc(json_array_size(lens) + 1, sizeof(size_t));
        r->n_lengths = r->lengths ? json_array_size(lens) : 0;
        for (size_t i = 0; r->lengths && i < json_array_size(lens); i++)
            r->lengths[i] = (size_t)json_integer_value(json_array_get(lens, i));
    }
    json_t *scores = json_object_get(o, "scores");
    r->has_scores = scores != NULL;
    if (json_is_array(scores)) {
        size_t n = json_array_size(scores);
        r->scores = malloc(n ? n * sizeof(float) : 1);
        for (size_t i = 0; r->scores && i < n; i++)
            r->scores[i] = (float)json_number_value(json_array_get(scores, i));
    }
    json_t *labels = json_object_get(o, "labels");
    if (json_is_array(labels)) {
        r->labels = calloc(json_array_size(labels) + 1, sizeof(char *));
        r->n_labels = r->labels ? json_array_size(labels) : 0;
        for (size_t i = 0; r->labels && i < json_array_size(labels); i++)
            if ((s = json_string_value(json_array_get(labels, i)))) r->labels[i] = strdup(s);
    }
    json_t *e = json_object_get(o, "error");
    if ((s = json_string_value(json_object_get(e, "code")))) copy_str(r->code, sizeof(r->code), s, strlen(s));
    if ((s = json_string_value(json_object_get(e, "message")))) copy_str(r->message, sizeof(r->message), s, strlen(s));
    json_t *t = json_object_get(o, "timing");
    r->queued_ms = json_number_value(json_object_get(t, "queued_ms"));
    r->infer_ms = json_number_value(json_object_get(t, "infer_ms"));
    r->total_ms = json_number_value(json_object_get(t, "total_ms"));
    r->batch_rows = json_integer_value(json_object_get(t, "batch_rows"));
    r->tokens = json_integer_value(json_object_get(t, "tokens"));
    r->padded_tokens = json_integer_value(json_object_get(t, "padded_tokens"));
    json_t *src = json_object_get(o, "source");
    if ((s = json_string_value(json_object_get(src, "topic")))) copy_str(r->topic, sizeof(r->topic), s, strlen(s));
    r->partition = json_integer_value(json_object_get(src, "partition"));
    r->offset = json_integer_value(json_object_get(src, "offset"));
    json_t *meta = json_object_get(o, "meta");
    if (meta) set_meta(r, meta);
    json_decref(o);
    return 0;
}

int wire_decode_result(const void *body, size_t len, struct wire_result *r,
                       char *errstr, size_t errstr_size)
{
    memset(r, 0, sizeof(*r));
    if (len == 0) {
        snprintf(errstr, errstr_size, "empty result");
        return -1;
    }
    return ((const unsigned char *)body)[0] == '{'
               ? decode_json(body, len, r, errstr, errstr_size)
               : decode_msgpack(body, len, r, errstr, errstr_size);
}

void wire_result_fini(struct wire_result *r)
{
    free(r->output);
    r->output = NULL;
    free(r->lengths);
    r->lengths = NULL;
    free(r->scores);
    r->scores = NULL;
    for (size_t i = 0; r->labels && i < r->n_labels; i++) free(r->labels[i]);
    free(r->labels);
    r->labels = NULL;
}

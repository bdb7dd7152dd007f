/* tablebody.h - record bodies written as readable tables, for the codec
 * tests: hex to bytes, ' for " in table texts, and one table body turned
 * into either encoding (JSON as written, or MessagePack packed from the
 * same JSON value), and the asserts that read MessagePack results back.
 * Include after cmocka.h. */
#ifndef KINFER_TABLEBODY_H
#define KINFER_TABLEBODY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <msgpack.h>

#include "../codecs/protocol.h"
#include "../base/utf8.h"

/* Hex text (spaces allowed) to bytes; returns the byte count. */
static inline size_t unhex(const char *hex, unsigned char *out, size_t cap)
{
    size_t n = 0;
    while (*hex) {
        if (*hex == ' ') {
            hex++;
            continue;
        }
        unsigned v;
        assert_int_equal(sscanf(hex, "%2x", &v), 1);
        assert_true(n < cap);
        out[n++] = (unsigned char)v;
        hex += 2;
    }
    return n;
}

/* Table bodies are written with ' for " so they stay readable; this makes
 * them JSON (returns a new string). */
static inline char *q(const char *s)
{
    char *d = strdup(s);
    assert_non_null(d);
    for (char *p = d; *p; p++)
        if (*p == '\'') *p = '"';
    return d;
}

/* Packs a JSON value as MessagePack, so one table body serves both
 * encodings. Markers for what JSON cannot say: {"$bin":"hex"} packs a
 * bin, {"$raw":"hex"} writes those bytes as the value verbatim. */
static inline void pack_json(msgpack_packer *pk, msgpack_sbuffer *sb, const json_t *v)
{
    unsigned char raw[256];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        json_t *m;
        if (json_object_size(v) == 1 && (m = json_object_get(v, "$bin"))) {
            size_t n = unhex(json_string_value(m), raw, sizeof(raw));
            msgpack_pack_bin_with_body(pk, raw, n);
            return;
        }
        if (json_object_size(v) == 1 && (m = json_object_get(v, "$raw"))) {
            size_t n = unhex(json_string_value(m), raw, sizeof(raw));
            msgpack_sbuffer_write(sb, (const char *)raw, n);
            return;
        }
        msgpack_pack_map(pk, json_object_size(v));
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            msgpack_pack_str_with_body(pk, k, strlen(k));
            pack_json(pk, sb, e);
        }
        return;
    }
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++) pack_json(pk, sb, json_array_get(v, i));
        return;
    case JSON_STRING:
        msgpack_pack_str_with_body(pk, json_string_value(v), json_string_length(v));
        return;
    case JSON_INTEGER: msgpack_pack_int64(pk, json_integer_value(v)); return;
    case JSON_REAL: msgpack_pack_double(pk, json_real_value(v)); return;
    case JSON_TRUE: msgpack_pack_true(pk); return;
    case JSON_FALSE: msgpack_pack_false(pk); return;
    case JSON_NULL: msgpack_pack_nil(pk); return;
    }
}

/* A record value in one encoding. */
struct body {
    unsigned char *p;
    size_t len;
};

/* Makes a body from a table text (' for "): JSON as is, or MessagePack
 * through pack_json (parsed with JSON_ALLOW_NUL, so "\u0000" survives).
 * Free b.p. */
static inline struct body make_body(const char *text, enum proto_enc enc)
{
    struct body b;
    char *js = q(text);
    if (enc == PROTO_ENC_JSON) {
        b.p = (unsigned char *)js;
        b.len = strlen(js);
        return b;
    }
    json_error_t e;
    json_t *v = json_loads(js, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!v) fail_msg("bad table body %s: %s", js, e.text);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_json(&pk, &sb, v);
    json_decref(v);
    free(js);
    b.len = sb.size;
    b.p = malloc(sb.size);
    assert_non_null(b.p);
    memcpy(b.p, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return b;
}

/* Finds a key in a MessagePack map, or NULL. */
static inline const msgpack_object *mp_get(const msgpack_object *m, const char *k)
{
    assert_int_equal(m->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *key = &m->via.map.ptr[i].key;
        if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == strlen(k) &&
            memcmp(key->via.str.ptr, k, key->via.str.size) == 0)
            return &m->via.map.ptr[i].val;
    }
    return NULL;
}

/* Asserts a MessagePack string equals s. */
static inline void assert_mp_str(const msgpack_object *o, const char *s)
{
    assert_non_null(o);
    assert_int_equal(o->type, MSGPACK_OBJECT_STR);
    assert_int_equal(o->via.str.size, strlen(s));
    assert_memory_equal(o->via.str.ptr, s, strlen(s));
}

/* Asserts the map's keys are exactly `keys`, in that order. */
static inline void assert_mp_keys(const msgpack_object *m, const char *const *keys, size_t n)
{
    assert_int_equal(m->type, MSGPACK_OBJECT_MAP);
    if (m->via.map.size != n) fail_msg("map has %u keys, expected %zu", m->via.map.size, n);
    for (size_t i = 0; i < n; i++) assert_mp_str(&m->via.map.ptr[i].key, keys[i]);
}

/* 1 when every str in o (map keys included) is well-formed UTF-8. */
static inline int mp_strs_valid(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_STR: return utf8_valid(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; i++)
            if (!mp_strs_valid(&o->via.array.ptr[i])) return 0;
        return 1;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; i++)
            if (!mp_strs_valid(&o->via.map.ptr[i].key) || !mp_strs_valid(&o->via.map.ptr[i].val))
                return 0;
        return 1;
    default: return 1;
    }
}

#endif

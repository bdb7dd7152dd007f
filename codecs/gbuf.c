/* gbuf.c - the codec's growable output buffer (see gbuf.h) and its str
 * packer.
 *
 * Threads: any; a buffer belongs to the thread writing it. */
#include "gbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "protocol.h"

/* Appends n bytes; -1 when the limit would be passed or memory runs out. */
int gbuf_put(struct gbuf *b, const void *src, size_t n)
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
int gbuf_mp_write(void *data, const char *buf, size_t len)
{
    return gbuf_put(data, buf, len);
}

/* jansson's dump callback (data last). */
int gbuf_json_write(const char *buf, size_t len, void *data)
{
    return gbuf_put(data, buf, len);
}

/* Hands the buffer's bytes to the caller as an exact-size allocation. */
unsigned char *gbuf_take(struct gbuf *b, size_t *len)
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

/* Packs n bytes as a str, repaired when they are not well-formed UTF-8
 * (every str of a result must be: see utf8.h). A str longer than
 * PROTO_META_MAX is cut there first: no result field is longer, and meta
 * that long is refused whole anyway. */
int gbuf_mp_str_n(msgpack_packer *pk, const char *s, size_t n)
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

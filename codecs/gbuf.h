/* gbuf.h - the growable byte buffer the codec writes MessagePack and JSON
 * into (the encoder its results, the decoder re-encoded meta), with a hard
 * limit, and the one way the codec packs a MessagePack str.
 *
 * Threads: a buffer belongs to the thread writing it. Ownership: the
 * buffer owns p until gbuf_take hands it over (or the caller frees it). */
#ifndef KINFER_GBUF_H
#define KINFER_GBUF_H

#include <msgpack.h>
#include <stddef.h>

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
int gbuf_put(struct gbuf *b, const void *src, size_t n);
/* msgpack_packer's write callback (data first). */
int gbuf_mp_write(void *data, const char *buf, size_t len);
/* jansson's dump callback (data last). */
int gbuf_json_write(const char *buf, size_t len, void *data);
/* Hands the buffer's bytes to the caller as an exact-size allocation
 * (the caller frees it) and leaves b empty. */
unsigned char *gbuf_take(struct gbuf *b, size_t *len);

/* Packs n bytes (borrowed) as a str, repaired when they are not
 * well-formed UTF-8 (every str of a result must be: see utf8.h). A str
 * longer than PROTO_META_MAX is cut there first: no result field is
 * longer, and meta that long is refused whole anyway. */
int gbuf_mp_str_n(msgpack_packer *pk, const char *s, size_t n);

#endif

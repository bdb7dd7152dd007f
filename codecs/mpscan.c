/* mpscan.c - allocation-free structural check of untrusted MessagePack,
 * run before msgpack_unpack_next() so that the unpacker never reserves
 * memory for elements that are not in the buffer (docs/reliability.md, rule 9).
 *
 * Threads: any (the poll thread in practice); no shared state. Ownership:
 * the buffer is borrowed and only read; nothing is kept after the call.
 *
 * The walk is iterative: one counter per open container in a fixed array
 * on the stack (MPSCAN_DEPTH_CAP of them), so neither a deep nor a wide
 * input can exhaust the C stack or the heap. */
#include "mpscan.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

enum hdr_kind { HK_SCALAR, HK_BLOB, HK_ARRAY, HK_MAP };

/* What the first byte of an object says about the rest of its header. */
struct hdr {
    enum hdr_kind kind;
    size_t size;       /* header bytes, the tag byte included */
    int lenbytes;      /* 0, or width of the big-endian length/count after the tag */
    uint64_t fixed;    /* length or count encoded in the tag itself (lenbytes == 0) */
    const char *name;  /* for messages: "str", "bin", "ext", "array", "map" */
};

/* Formats an error into errstr; a helper so that every failure is one line
 * and errstr may be absent. Always returns -1 for `return scan_fail(...)`. */
static int scan_fail(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int scan_fail(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (errstr && errstr_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr, errstr_size, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Reads an n-byte big-endian unsigned integer (MessagePack's byte order)
 * byte by byte, so it works on any host and any alignment. */
static uint64_t read_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* Sets a header description; keeps the classification table below short. */
static void set_hdr(struct hdr *h, enum hdr_kind kind, size_t size, int lenbytes,
                    uint64_t fixed, const char *name)
{
    h->kind = kind;
    h->size = size;
    h->lenbytes = lenbytes;
    h->fixed = fixed;
    h->name = name;
}

/* Classifies a tag byte per the MessagePack spec, covering every format.
 * Returns -1 for the one byte the spec never uses (0xc1). */
static int classify(unsigned char t, struct hdr *h)
{
    if (t <= 0x7f || t >= 0xe0) { set_hdr(h, HK_SCALAR, 1, 0, 0, "int"); return 0; }
    if (t <= 0x8f) { set_hdr(h, HK_MAP, 1, 0, t & 0x0fu, "map"); return 0; }
    if (t <= 0x9f) { set_hdr(h, HK_ARRAY, 1, 0, t & 0x0fu, "array"); return 0; }
    if (t <= 0xbf) { set_hdr(h, HK_BLOB, 1, 0, t & 0x1fu, "str"); return 0; }
    switch (t) {
    case 0xc0: case 0xc2: case 0xc3: set_hdr(h, HK_SCALAR, 1, 0, 0, "nil/bool"); return 0;
    case 0xc1: return -1;
    case 0xc4: set_hdr(h, HK_BLOB, 2, 1, 0, "bin"); return 0;
    case 0xc5: set_hdr(h, HK_BLOB, 3, 2, 0, "bin"); return 0;
    case 0xc6: set_hdr(h, HK_BLOB, 5, 4, 0, "bin"); return 0;
    case 0xc7: set_hdr(h, HK_BLOB, 3, 1, 0, "ext"); return 0; /* len, then type */
    case 0xc8: set_hdr(h, HK_BLOB, 4, 2, 0, "ext"); return 0;
    case 0xc9: set_hdr(h, HK_BLOB, 6, 4, 0, "ext"); return 0;
    case 0xca: set_hdr(h, HK_SCALAR, 5, 0, 0, "float32"); return 0;
    case 0xcb: set_hdr(h, HK_SCALAR, 9, 0, 0, "float64"); return 0;
    case 0xcc: case 0xd0: set_hdr(h, HK_SCALAR, 2, 0, 0, "int"); return 0;
    case 0xcd: case 0xd1: set_hdr(h, HK_SCALAR, 3, 0, 0, "int"); return 0;
    case 0xce: case 0xd2: set_hdr(h, HK_SCALAR, 5, 0, 0, "int"); return 0;
    case 0xcf: case 0xd3: set_hdr(h, HK_SCALAR, 9, 0, 0, "int"); return 0;
    case 0xd4: set_hdr(h, HK_BLOB, 2, 0, 1, "ext"); return 0;  /* fixext: type byte, */
    case 0xd5: set_hdr(h, HK_BLOB, 2, 0, 2, "ext"); return 0;  /* then 1..16 bytes   */
    case 0xd6: set_hdr(h, HK_BLOB, 2, 0, 4, "ext"); return 0;
    case 0xd7: set_hdr(h, HK_BLOB, 2, 0, 8, "ext"); return 0;
    case 0xd8: set_hdr(h, HK_BLOB, 2, 0, 16, "ext"); return 0;
    case 0xd9: set_hdr(h, HK_BLOB, 2, 1, 0, "str"); return 0;
    case 0xda: set_hdr(h, HK_BLOB, 3, 2, 0, "str"); return 0;
    case 0xdb: set_hdr(h, HK_BLOB, 5, 4, 0, "str"); return 0;
    case 0xdc: set_hdr(h, HK_ARRAY, 3, 2, 0, "array"); return 0;
    case 0xdd: set_hdr(h, HK_ARRAY, 5, 4, 0, "array"); return 0;
    case 0xde: set_hdr(h, HK_MAP, 3, 2, 0, "map"); return 0;
    case 0xdf: set_hdr(h, HK_MAP, 5, 4, 0, "map"); return 0;
    }
    return -1; /* not reached: every byte value is covered above */
}

/* The walk. `owed` counts the elements still due to all open containers
 * together; since each needs at least one byte, owed > bytes left means the
 * buffer cannot be complete, and checking it at every container header
 * bounds what the unpacker will ever allocate by the buffer's length. */
int mpscan_check(const void *buf, size_t len, int max_depth, char *errstr,
                 size_t errstr_size)
{
    const unsigned char *p = buf;
    uint64_t left[MPSCAN_DEPTH_CAP]; /* elements still due, per open container */
    int depth = 0;
    int limit = max_depth < 0 ? 0 : max_depth > MPSCAN_DEPTH_CAP ? MPSCAN_DEPTH_CAP : max_depth;
    uint64_t owed = 0;
    size_t pos = 0;

    if (!p || len == 0) return scan_fail(errstr, errstr_size, "empty buffer");
    for (;;) {
        struct hdr h;
        size_t at = pos;
        if (pos >= len)
            return scan_fail(errstr, errstr_size, "truncated: object expected at byte %zu", pos);
        if (classify(p[pos], &h) < 0)
            return scan_fail(errstr, errstr_size, "invalid byte 0x%02x at byte %zu", p[pos], pos);
        if (len - pos < h.size)
            return scan_fail(errstr, errstr_size,
                             "truncated: %zu-byte %s header at byte %zu, %zu bytes left",
                             h.size, h.name, at, len - pos);
        /* The length/count, if any, follows the tag; ext8/16/32 then have a type byte. */
        uint64_t n = h.lenbytes ? read_be(p + pos + 1, h.lenbytes) : h.fixed;
        pos += h.size;
        if (depth > 0) {
            left[depth - 1]--;
            owed--;
        }
        if (h.kind == HK_BLOB) {
            if (n > len - pos)
                return scan_fail(errstr, errstr_size,
                                 "%s of %llu bytes at byte %zu exceeds the %zu bytes left",
                                 h.name, (unsigned long long)n, at, len - pos);
            pos += (size_t)n;
        } else if (h.kind == HK_ARRAY || h.kind == HK_MAP) {
            uint64_t elems = h.kind == HK_MAP ? 2 * n : n;
            if (depth >= limit)
                return scan_fail(errstr, errstr_size, "nesting deeper than %d at byte %zu",
                                 limit, at);
            if (owed + elems > len - pos)
                return scan_fail(errstr, errstr_size,
                                 "%s of %llu entries at byte %zu exceeds the %zu bytes left",
                                 h.name, (unsigned long long)n, at, len - pos);
            if (elems > 0) {
                left[depth++] = elems;
                owed += elems;
                continue;
            }
        }
        if (owed > len - pos)
            return scan_fail(errstr, errstr_size,
                             "truncated: %llu more elements due at byte %zu, %zu bytes left",
                             (unsigned long long)owed, pos, len - pos);
        while (depth > 0 && left[depth - 1] == 0) depth--;
        if (depth == 0) break;
    }
    if (pos != len)
        return scan_fail(errstr, errstr_size, "%zu trailing bytes after the object (at byte %zu)",
                         len - pos, pos);
    return 0;
}

/* utf8.c - UTF-8 checking and repair (utf8.h). The well-formed sequences
 * are those of the Unicode Standard's table 3-7: no overlong forms, no
 * surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.. and F5..FF).
 *
 * Threads: any; no state. */
#include "utf8.h"

#include <string.h>

size_t utf8_char_len(const unsigned char *s, size_t n, size_t *skip)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) len = 3;
    else if (c >= 0xf0 && c <= 0xf4) len = 4;
    else {
        if (skip) *skip = 1;
        return 0;
    }
    if (c == 0xe0) lo = 0xa0;
    else if (c == 0xed) hi = 0x9f;
    else if (c == 0xf0) lo = 0x90;
    else if (c == 0xf4) hi = 0x8f;
    for (size_t k = 1; k < len; k++) {
        unsigned char b = k < n ? s[k] : 0;
        int ok = k < n && (k == 1 ? b >= lo && b <= hi : b >= 0x80 && b <= 0xbf);
        if (!ok) {
            /* The bytes so far are the maximal subpart: one replacement. */
            if (skip) *skip = k;
            return 0;
        }
    }
    return len;
}

int utf8_valid(const void *s, size_t n)
{
    const unsigned char *p = s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = utf8_char_len(p + i, n - i, NULL);
        if (!len) return 0;
        i += len;
    }
    return 1;
}

size_t utf8_repair(char *dst, size_t cap, const void *src, size_t n)
{
    static const char fffd[] = "\xef\xbf\xbd";
    const unsigned char *p = src;
    size_t i = 0, w = 0;
    while (i < n) {
        size_t skip = 0, len = utf8_char_len(p + i, n - i, &skip);
        const void *from = len ? (const void *)(p + i) : (const void *)fffd;
        size_t put = len ? len : 3;
        if (w + put >= cap) break;
        memmove(dst + w, from, put);
        w += put;
        i += len ? len : skip;
    }
    dst[w] = '\0';
    return w;
}

void utf8_repair_str(char *buf, size_t cap)
{
    size_t n = strlen(buf);
    if (utf8_valid(buf, n)) return;
    char tmp[4096];
    char *copy = n < sizeof(tmp) ? tmp : NULL;
    if (!copy) {
        /* Longer than any message kinfer keeps: cut rather than allocate. */
        n = sizeof(tmp) - 1;
        copy = tmp;
    }
    memcpy(copy, buf, n);
    utf8_repair(buf, cap, copy, n);
}

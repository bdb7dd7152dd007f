/* json_utf8.c - JSON records with ill-formed UTF-8 read as MessagePack
 * ones are (docs/protocol.md, "Text encoding"). jansson refuses a whole
 * document for one ill-formed byte in any string, where the MessagePack
 * decoder keeps the record and judges each field: a text row with such
 * bytes is invalid_input naming its row and byte (the tokenizer's check),
 * meta and model are repaired to U+FFFD, an id is no valid id. So a
 * document jansson refused for that is parsed again with each ill-formed
 * sequence (utf8.h's maximal subparts) written as a marker jansson
 * accepts, and the markers are then turned back: into the original bytes
 * in every string outside meta (the field's own check then speaks as it
 * does for MessagePack), into U+FFFD inside meta, which goes back to the
 * client as it is. A key (jansson takes none with a NUL) gets U+FFFD at
 * once: a top-level key so spelled is no field either way, and meta's
 * keys are repaired as MessagePack's are.
 *
 * The marker, as JSON text: \u0000, then \u000N with N the sequence's
 * length (1..3), then each byte b as \u00bb (every byte of an ill-formed
 * sequence is >= 0x80). Parsed, that is NUL, N, and N two-byte
 * characters U+0080..U+00FF. A record could carry that text itself: the
 * markers found in the tree must be exactly the sequences rewritten, else
 * the record is refused as jansson refused it (codec_decode.c).
 *
 * Threads: any; no state. Ownership: inputs borrowed; the rewritten text
 * is malloc'd for the caller. */
#include "codec_decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "gbuf.h"

/* Writes the string at v[i] (its opening quote) up to its closing quote
 * into b, each ill-formed sequence as a marker (or, in a key, as U+FFFD:
 * jansson takes no NUL in a key), counting them; returns the index after
 * it, or len when it does not close (the parse then fails as before). */
static size_t put_string(struct gbuf *b, const unsigned char *v, size_t len, size_t i,
                         size_t *marks, size_t *keys, int *r)
{
    size_t end = i + 1;
    while (end < len && v[end] != '"') end += v[end] == '\\' ? 2 : 1;
    if (end > len) end = len;
    size_t after = end + 1;
    while (after < len && (v[after] == ' ' || v[after] == '\t' || v[after] == '\n' ||
                           v[after] == '\r'))
        after++;
    int key = after < len && v[after] == ':';
    size_t k = i;
    while (k < end && *r == 0) {
        size_t run = k;
        while (run < end && v[run] < 0x80) run++;
        if (run > k) {
            *r = gbuf_put(b, v + k, run - k);
            k = run;
            continue;
        }
        size_t skip = 0, n = utf8_char_len(v + k, end - k, &skip);
        if (n) {
            *r = gbuf_put(b, v + k, n);
            k += n;
            continue;
        }
        if (skip < 1 || skip > 3) skip = 1;
        if (key) {
            *r = gbuf_put(b, "\\ufffd", 6);
            ++*keys;
        } else {
            char m[13 + 6 * 3];
            int w = snprintf(m, sizeof(m), "\\u0000\\u000%zu", skip);
            for (size_t s = 0; s < skip; s++)
                w += snprintf(m + w, sizeof(m) - (size_t)w, "\\u00%02x", v[k + s]);
            *r = gbuf_put(b, m, (size_t)w);
            ++*marks;
        }
        k += skip;
    }
    if (end < len && *r == 0) *r = gbuf_put(b, "\"", 1);
    return end < len ? end + 1 : len;
}

char *codec_js_mark_utf8(const unsigned char *v, size_t len, size_t *marks, size_t *keys,
                         size_t *out_len)
{
    struct gbuf b = {.limit = SIZE_MAX};
    int r = 0;
    size_t i = 0;
    *marks = *keys = 0;
    while (i < len && r == 0) {
        if (v[i] == '"') {
            i = put_string(&b, v, len, i, marks, keys, &r);
            continue;
        }
        size_t run = i;
        while (run < len && v[run] != '"') run++;
        r = gbuf_put(&b, v + i, run - i);
        i = run;
    }
    if (r) {
        free(b.p);
        return NULL;
    }
    *out_len = b.len;
    return (char *)b.p;
}

/* The marker at s (n bytes left): its length in the parsed string, and
 * the original bytes into raw (*raw_len of them); 0 when s holds none. */
static size_t marker_at(const unsigned char *s, size_t n, unsigned char raw[3], size_t *raw_len)
{
    if (n < 4 || s[0] != 0 || s[1] < 1 || s[1] > 3 || n < 2 + 2 * (size_t)s[1]) return 0;
    size_t cnt = s[1];
    for (size_t k = 0; k < cnt; k++) {
        unsigned char c0 = s[2 + 2 * k], c1 = s[3 + 2 * k];
        if ((c0 != 0xc2 && c0 != 0xc3) || (c1 & 0xc0) != 0x80) return 0;
        raw[k] = (unsigned char)(((c0 & 3) << 6) | (c1 & 0x3f));
        if (raw[k] < 0x80) return 0;
    }
    *raw_len = cnt;
    return 2 + 2 * cnt;
}

/* s (n bytes) with its markers turned back (raw bytes, or U+FFFD when
 * repair), malloc'd into *out; returns the markers found, 0 leaving *out
 * NULL. (size_t)-1 when out of memory. */
static size_t unmark_str(const char *s, size_t n, int repair, char **out, size_t *out_len)
{
    const unsigned char *u = (const unsigned char *)s;
    *out = NULL;
    size_t found = 0;
    unsigned char raw[3];
    size_t rl;
    for (size_t i = 0; i < n; i++)
        if (u[i] == 0 && marker_at(u + i, n - i, raw, &rl)) found++;
    if (!found) return 0;
    char *o = malloc(n + 1);
    if (!o) return (size_t)-1;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        size_t m = u[i] == 0 ? marker_at(u + i, n - i, raw, &rl) : 0;
        if (!m) {
            o[w++] = s[i++];
            continue;
        }
        /* a marker is at least 4 bytes: U+FFFD (3) and raw (<= 3) fit */
        if (repair) {
            memcpy(o + w, "\xef\xbf\xbd", 3);
            w += 3;
        } else {
            memcpy(o + w, raw, rl);
            w += rl;
        }
        i += m;
    }
    o[w] = '\0';
    *out = o;
    *out_len = w;
    return found;
}

/* Turns the markers of v back (repair: inside meta; top: v is the
 * document); adds those found to *found. Returns 0, or -1 when out of
 * memory. Recursion is bounded by the depth check made before. */
static int unmark(json_t *v, int repair, int top, size_t *found)
{
    if (json_is_string(v)) {
        char *o;
        size_t olen, n = unmark_str(json_string_value(v), json_string_length(v), repair, &o, &olen);
        if (n == (size_t)-1) return -1;
        if (!n) return 0;
        *found += n;
        int r = repair ? json_string_setn(v, o, olen) : json_string_setn_nocheck(v, o, olen);
        free(o);
        return r;
    }
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (unmark(json_array_get(v, i), repair, 0, found) < 0) return -1;
        return 0;
    }
    if (!json_is_object(v)) return 0;
    const char *k;
    json_t *e;
    size_t klen;
    json_object_keylen_foreach(v, k, klen, e) {
        int meta = top && klen == 4 && memcmp(k, "meta", 4) == 0;
        if (unmark(e, repair || meta, 0, found) < 0) return -1;
    }
    return 0;
}

int codec_js_unmark_utf8(json_t *root, size_t *found)
{
    *found = 0;
    return unmark(root, 0, 1, found);
}

/* wordpiece.c - BERT WordPiece tokenizer: loading (vocab.txt, tokenizer.json,
 * tokenizer_config.json) and encoding, matching Hugging Face's fast
 * tokenizer id for id (see wordpiece.h for the rules).
 *
 * Encoding is one streaming pass over the input: each character is decoded,
 * checked against the special-token trie, and pushed through the normalizer
 * stages (clean -> chinese -> strip -> lowercase) into the pre-tokenizer,
 * which collects a word and hands it to the WordPiece matcher when a space
 * or punctuation ends it. Only the current word (capped at max_word_chars
 * characters), a run of combining characters awaiting canonical ordering,
 * and the ids of each sequence are kept, all in the caller's wp_scratch.
 *
 * Threads: the loaders run on whichever thread calls them; a loaded
 * tokenizer is read-only, so wp_encode/wp_normalize may run on many
 * threads at once, each with its own scratch. Nothing here is global.
 *
 * Ownership: a wp_tokenizer owns its token pool, tables and trie; the
 * strings it hands out are borrowed from it. A wp_scratch owns its
 * buffers; wp_normalize's result is borrowed from the scratch. Inputs are
 * borrowed for the duration of a call. */
#include "wordpiece.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#define WP_SPECIAL_MAX_BYTES 256      /* longest special/added token accepted */
#define WP_MAX_TOKENS ((size_t)1 << 24) /* ids beyond this: refused */
#define WP_DECOMP_MAX 32              /* canonical decompositions are at most 4 */
#define WP_FNV_OFFSET 0xcbf29ce484222325ull
#define WP_FNV_PRIME 0x100000001b3ull

/* One node of the special-token trie: the id of the token that ends here
 * (or -1) and its outgoing edges, sorted by byte, in the edge array. */
struct wp_tnode {
    int32_t id;
    uint32_t edge0;
    uint32_t n_edges;
};

struct wp_tedge {
    uint32_t child;
    unsigned char byte;
};

struct wp_tokenizer {
    struct wp_conf conf;      /* as given or as the file said */
    int strip;                /* strip_accents resolved against lowercase */
    char *pool;               /* every token, NUL-terminated, by id */
    size_t *tok_off;          /* id -> offset in pool */
    uint32_t *tok_len;        /* id -> bytes */
    size_t n_ids;
    int32_t *slots;           /* open-addressing table of ids, -1 = empty */
    uint64_t *slot_hash;      /* FNV-1a of each slot's token */
    size_t slot_mask;
    size_t max_start;         /* longest token, bytes */
    size_t max_cont;          /* longest token after the prefix, among prefixed ones */
    size_t prefix_len;
    uint64_t prefix_hash;     /* FNV-1a state after the prefix */
    int32_t unk, cls, sep, pad, mask;
    struct wp_tnode *tn;      /* special-token trie, NULL if none; root is tn[0] */
    struct wp_tedge *te;
    unsigned char first[32];  /* bitmap of the specials' first bytes */
};

/* A growable array of ids (one per sequence in the scratch). */
struct wp_ivec {
    int32_t *v;
    size_t n, cap;
};

/* A character held back for canonical ordering, with its combining class. */
struct wp_runc {
    uint32_t cp;
    uint32_t ccc;
};

struct wp_scratch {
    struct wp_ivec a, b;      /* ids of the first and second sequence */
    char *word;               /* the current word, UTF-8 */
    size_t word_n, word_cap;
    size_t word_chars;        /* characters seen, also those past the cap */
    uint64_t *hs;             /* running hashes of a word suffix */
    size_t hs_cap;
    struct wp_runc *run;      /* nonstarters awaiting canonical ordering */
    struct wp_runc *run_tmp;  /* counting-sort output, same capacity */
    size_t run_n, run_cap;
    char *norm;               /* wp_normalize's output */
    size_t norm_n, norm_cap;
};

/* Formats into the caller's error buffer; every failure path goes through
 * here so a NULL or zero-sized buffer is handled once. */
static void wp_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void wp_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || errstr_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* ---- Unicode -------------------------------------------------------------
 * The reference decides "control", "nonspacing mark" and "punctuation" with
 * tables of Unicode 8.0 categories, decomposes with a normalization table
 * that lacks U+11938's mapping, and lowercases with Unicode 16.0; libutf8proc
 * 2.8 answers for Unicode 15.0. These rows are every code point where the
 * two disagree, found by running all 1,112,064 scalar values through both
 * (tests/data/wordpiece/unicode.tsv holds the reference's side, and
 * test_wordpiece checks each value against it). */
enum {
    WP_X_NOT_OTHER = 1,  /* not a control/format char to the reference */
    WP_X_NOT_MN = 2,     /* not a nonspacing mark to the reference */
    WP_X_IS_MN = 4,      /* a nonspacing mark to the reference */
    WP_X_NOT_PUNCT = 8,  /* not punctuation to the reference */
    WP_X_IS_PUNCT = 16,  /* punctuation to the reference */
    WP_X_NO_DECOMP = 32, /* the reference does not decompose it */
};

static const struct {
    uint32_t lo, hi;
    uint8_t flags;
} wp_uexc[] = {
    {0x061D, 0x061D, WP_X_NOT_PUNCT},   {0x07FD, 0x07FD, WP_X_NOT_MN},
    {0x0890, 0x0891, WP_X_NOT_OTHER},   {0x0898, 0x089F, WP_X_NOT_MN},
    {0x08CA, 0x08E1, WP_X_NOT_MN},      {0x08E2, 0x08E2, WP_X_NOT_OTHER},
    {0x09FD, 0x09FD, WP_X_NOT_PUNCT},   {0x09FE, 0x09FE, WP_X_NOT_MN},
    {0x0A76, 0x0A76, WP_X_NOT_PUNCT},   {0x0AFA, 0x0AFF, WP_X_NOT_MN},
    {0x0B55, 0x0B55, WP_X_NOT_MN},      {0x0C04, 0x0C04, WP_X_NOT_MN},
    {0x0C3C, 0x0C3C, WP_X_NOT_MN},      {0x0C77, 0x0C77, WP_X_NOT_PUNCT},
    {0x0C84, 0x0C84, WP_X_NOT_PUNCT},   {0x0D00, 0x0D00, WP_X_NOT_MN},
    {0x0D3B, 0x0D3C, WP_X_NOT_MN},      {0x0D81, 0x0D81, WP_X_NOT_MN},
    {0x0EBA, 0x0EBA, WP_X_NOT_MN},      {0x0ECE, 0x0ECE, WP_X_NOT_MN},
    {0x166D, 0x166D, WP_X_IS_PUNCT},    {0x1734, 0x1734, WP_X_IS_MN},
    {0x180F, 0x180F, WP_X_NOT_MN},      {0x1885, 0x1886, WP_X_NOT_MN},
    {0x1ABF, 0x1ACE, WP_X_NOT_MN},      {0x1B7D, 0x1B7E, WP_X_NOT_PUNCT},
    {0x1DF6, 0x1DFB, WP_X_NOT_MN},      {0x2E43, 0x2E4F, WP_X_NOT_PUNCT},
    {0x2E52, 0x2E5D, WP_X_NOT_PUNCT},   {0xA82C, 0xA82C, WP_X_NOT_MN},
    {0xA8C5, 0xA8C5, WP_X_NOT_MN},      {0xA8FF, 0xA8FF, WP_X_NOT_MN},
    {0xA9BD, 0xA9BD, WP_X_NOT_MN},      {0x10D24, 0x10D27, WP_X_NOT_MN},
    {0x10EAB, 0x10EAC, WP_X_NOT_MN},    {0x10EAD, 0x10EAD, WP_X_NOT_PUNCT},
    {0x10EFD, 0x10EFF, WP_X_NOT_MN},    {0x10F46, 0x10F50, WP_X_NOT_MN},
    {0x10F55, 0x10F59, WP_X_NOT_PUNCT}, {0x10F82, 0x10F85, WP_X_NOT_MN},
    {0x10F86, 0x10F89, WP_X_NOT_PUNCT}, {0x11070, 0x11070, WP_X_NOT_MN},
    {0x11073, 0x11074, WP_X_NOT_MN},    {0x110C2, 0x110C2, WP_X_NOT_MN},
    {0x110CD, 0x110CD, WP_X_NOT_OTHER}, {0x111C9, 0x111C9, WP_X_NOT_MN | WP_X_IS_PUNCT},
    {0x111CF, 0x111CF, WP_X_NOT_MN},    {0x1123E, 0x1123E, WP_X_NOT_MN},
    {0x11241, 0x11241, WP_X_NOT_MN},    {0x1133B, 0x1133B, WP_X_NOT_MN},
    {0x11438, 0x1143F, WP_X_NOT_MN},    {0x11442, 0x11444, WP_X_NOT_MN},
    {0x11446, 0x11446, WP_X_NOT_MN},    {0x1144B, 0x1144F, WP_X_NOT_PUNCT},
    {0x1145A, 0x1145B, WP_X_NOT_PUNCT}, {0x1145D, 0x1145D, WP_X_NOT_PUNCT},
    {0x1145E, 0x1145E, WP_X_NOT_MN},    {0x11660, 0x1166C, WP_X_NOT_PUNCT},
    {0x116B9, 0x116B9, WP_X_NOT_PUNCT}, {0x1182F, 0x11837, WP_X_NOT_MN},
    {0x11839, 0x1183A, WP_X_NOT_MN},    {0x1183B, 0x1183B, WP_X_NOT_PUNCT},
    {0x11938, 0x11938, WP_X_NO_DECOMP}, {0x1193B, 0x1193C, WP_X_NOT_MN},
    {0x1193E, 0x1193E, WP_X_NOT_MN},    {0x11943, 0x11943, WP_X_NOT_MN},
    {0x11944, 0x11946, WP_X_NOT_PUNCT}, {0x119D4, 0x119D7, WP_X_NOT_MN},
    {0x119DA, 0x119DB, WP_X_NOT_MN},    {0x119E0, 0x119E0, WP_X_NOT_MN},
    {0x119E2, 0x119E2, WP_X_NOT_PUNCT}, {0x11A01, 0x11A0A, WP_X_NOT_MN},
    {0x11A33, 0x11A38, WP_X_NOT_MN},    {0x11A3B, 0x11A3E, WP_X_NOT_MN},
    {0x11A3F, 0x11A46, WP_X_NOT_PUNCT}, {0x11A47, 0x11A47, WP_X_NOT_MN},
    {0x11A51, 0x11A56, WP_X_NOT_MN},    {0x11A59, 0x11A5B, WP_X_NOT_MN},
    {0x11A8A, 0x11A96, WP_X_NOT_MN},    {0x11A98, 0x11A99, WP_X_NOT_MN},
    {0x11A9A, 0x11A9C, WP_X_NOT_PUNCT}, {0x11A9E, 0x11AA2, WP_X_NOT_PUNCT},
    {0x11B00, 0x11B09, WP_X_NOT_PUNCT}, {0x11C30, 0x11C36, WP_X_NOT_MN},
    {0x11C38, 0x11C3D, WP_X_NOT_MN},    {0x11C3F, 0x11C3F, WP_X_NOT_MN},
    {0x11C41, 0x11C45, WP_X_NOT_PUNCT}, {0x11C70, 0x11C71, WP_X_NOT_PUNCT},
    {0x11C92, 0x11CA7, WP_X_NOT_MN},    {0x11CAA, 0x11CB0, WP_X_NOT_MN},
    {0x11CB2, 0x11CB3, WP_X_NOT_MN},    {0x11CB5, 0x11CB6, WP_X_NOT_MN},
    {0x11D31, 0x11D36, WP_X_NOT_MN},    {0x11D3A, 0x11D3A, WP_X_NOT_MN},
    {0x11D3C, 0x11D3D, WP_X_NOT_MN},    {0x11D3F, 0x11D45, WP_X_NOT_MN},
    {0x11D47, 0x11D47, WP_X_NOT_MN},    {0x11D90, 0x11D91, WP_X_NOT_MN},
    {0x11D95, 0x11D95, WP_X_NOT_MN},    {0x11D97, 0x11D97, WP_X_NOT_MN},
    {0x11EF3, 0x11EF4, WP_X_NOT_MN},    {0x11EF7, 0x11EF8, WP_X_NOT_PUNCT},
    {0x11F00, 0x11F01, WP_X_NOT_MN},    {0x11F36, 0x11F3A, WP_X_NOT_MN},
    {0x11F40, 0x11F40, WP_X_NOT_MN},    {0x11F42, 0x11F42, WP_X_NOT_MN},
    {0x11F43, 0x11F4F, WP_X_NOT_PUNCT}, {0x11FFF, 0x11FFF, WP_X_NOT_PUNCT},
    {0x12FF1, 0x12FF2, WP_X_NOT_PUNCT}, {0x13430, 0x1343F, WP_X_NOT_OTHER},
    {0x13440, 0x13440, WP_X_NOT_MN},    {0x13447, 0x13455, WP_X_NOT_MN},
    {0x16E97, 0x16E9A, WP_X_NOT_PUNCT}, {0x16F4F, 0x16F4F, WP_X_NOT_MN},
    {0x16FE2, 0x16FE2, WP_X_NOT_PUNCT}, {0x16FE4, 0x16FE4, WP_X_NOT_MN},
    {0x1CF00, 0x1CF2D, WP_X_NOT_MN},    {0x1CF30, 0x1CF46, WP_X_NOT_MN},
    {0x1E000, 0x1E006, WP_X_NOT_MN},    {0x1E008, 0x1E018, WP_X_NOT_MN},
    {0x1E01B, 0x1E021, WP_X_NOT_MN},    {0x1E023, 0x1E024, WP_X_NOT_MN},
    {0x1E026, 0x1E02A, WP_X_NOT_MN},    {0x1E08F, 0x1E08F, WP_X_NOT_MN},
    {0x1E130, 0x1E136, WP_X_NOT_MN},    {0x1E2AE, 0x1E2AE, WP_X_NOT_MN},
    {0x1E2EC, 0x1E2EF, WP_X_NOT_MN},    {0x1E4EC, 0x1E4EF, WP_X_NOT_MN},
    {0x1E944, 0x1E94A, WP_X_NOT_MN},    {0x1E95E, 0x1E95F, WP_X_NOT_PUNCT},
};

/* Lowercase mappings the reference has (Unicode 16.0) and utf8proc 2.8
 * lacks: each code point in lo..hi lowercases to itself + delta. */
static const struct {
    uint32_t lo, hi;
    int32_t delta;
} wp_lexc[] = {
    {0x1C89, 0x1C89, 1},       {0xA7CB, 0xA7CB, -42343}, {0xA7CC, 0xA7CC, 1},
    {0xA7CE, 0xA7CE, 1},       {0xA7D2, 0xA7D2, 1},      {0xA7D4, 0xA7D4, 1},
    {0xA7DA, 0xA7DA, 1},       {0xA7DC, 0xA7DC, -42561}, {0x10D50, 0x10D65, 32},
    {0x16EA0, 0x16EB8, 27},
};

#define WP_NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* The exception flags of cp (0 for almost everything): a binary search
 * over wp_uexc, skipped outright outside its span. */
static unsigned wp_xflags(uint32_t cp)
{
    if (cp < 0x061D || cp > 0x1E95F) return 0;
    size_t lo = 0, hi = WP_NELEM(wp_uexc);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < wp_uexc[mid].lo) hi = mid;
        else if (cp > wp_uexc[mid].hi) lo = mid + 1;
        else return wp_uexc[mid].flags;
    }
    return 0;
}

/* White_Space, as Rust's char::is_whitespace: the separators plus
 * U+0009..U+000D and U+0085. */
static int wp_is_ws(uint32_t cp, int cat)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
    return cp == 0x85 || cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP;
}

/* clean_text's "control": categories Cc, Cf, Co (Cs cannot occur in valid
 * UTF-8); unassigned code points are kept, as the reference keeps them.
 * Tab, newline and carriage return are whitespace, not controls. */
static int wp_is_other(uint32_t cp, int cat)
{
    if (cp == '\t' || cp == '\n' || cp == '\r') return 0;
    if (cat != UTF8PROC_CATEGORY_CC && cat != UTF8PROC_CATEGORY_CF &&
        cat != UTF8PROC_CATEGORY_CO && cat != UTF8PROC_CATEGORY_CS)
        return 0;
    return !(wp_xflags(cp) & WP_X_NOT_OTHER);
}

/* ASCII punctuation (which includes symbols like $ + < = > ^ ` | ~) or a
 * Unicode P* category. */
static int wp_is_punct(uint32_t cp, int cat)
{
    if (cp < 0x80)
        return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
               (cp >= 123 && cp <= 126);
    unsigned x = wp_xflags(cp);
    if (x & WP_X_IS_PUNCT) return 1;
    if (cat < UTF8PROC_CATEGORY_PC || cat > UTF8PROC_CATEGORY_PO) return 0;
    return !(x & WP_X_NOT_PUNCT);
}

/* strip_accents drops exactly the Mn characters. */
static int wp_is_mn(uint32_t cp, int cat)
{
    unsigned x = wp_xflags(cp);
    if (x & WP_X_IS_MN) return 1;
    return cat == UTF8PROC_CATEGORY_MN && !(x & WP_X_NOT_MN);
}

/* The CJK ideograph blocks handle_chinese_chars isolates (the reference's
 * own list, not the Unicode Ideographic property). */
static int wp_is_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Simple lowercase mapping (U+0130, the one character whose lowercase is
 * two, is handled by the caller). */
static uint32_t wp_lower(uint32_t cp)
{
    if (cp >= 0x1C89 && cp <= 0x16EB8) {
        for (size_t i = 0; i < WP_NELEM(wp_lexc); i++)
            if (cp >= wp_lexc[i].lo && cp <= wp_lexc[i].hi)
                return (uint32_t)((int32_t)cp + wp_lexc[i].delta);
    }
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

/* Category of a non-ASCII code point, via utf8proc's property table. */
static int wp_cat(uint32_t cp)
{
    return utf8proc_get_property((utf8proc_int32_t)cp)->category;
}

/* ---- UTF-8 -------------------------------------------------------------- */

/* Decodes one strict UTF-8 sequence at p (n bytes available): no overlong
 * forms, no surrogates, nothing past U+10FFFF, no truncation. Returns its
 * length (1-4) with *cp set, or 0 if the bytes are not valid UTF-8. */
static size_t wp_utf8_decode(const unsigned char *p, size_t n, uint32_t *cp)
{
    unsigned b0 = p[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (n < 2 || (p[1] & 0xC0) != 0x80) return 0;
        *cp = (b0 & 0x1Fu) << 6 | (p[1] & 0x3Fu);
        return 2;
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (b0 == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (b0 == 0xED && p[1] > 0x9F) return 0; /* surrogate */
        *cp = (b0 & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
        return 3;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if (b0 == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (b0 == 0xF4 && p[1] > 0x8F) return 0; /* past U+10FFFF */
        *cp = (b0 & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
        return 4;
    }
    return 0;
}

/* Encodes a scalar value into out (4 bytes of room); returns the length. */
static size_t wp_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Checks that s (n bytes) is valid UTF-8; returns the offset of the first
 * bad byte, or n if all is well. */
static size_t wp_utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = wp_utf8_decode(p + i, n - i, &cp);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* ---- vocabulary table ------------------------------------------------------ */

/* FNV-1a, fed a byte at a time so a word's candidate pieces are hashed in
 * one forward pass. */
static inline uint64_t wp_fnv(uint64_t h, unsigned char b)
{
    return (h ^ b) * WP_FNV_PRIME;
}

/* Hash of a whole byte string from the FNV offset basis. */
static uint64_t wp_hash(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) h = wp_fnv(h, (unsigned char)s[i]);
    return h;
}

/* Slot index for a hash: FNV's high bits mixed down, since its low bits
 * alone cluster. */
static size_t wp_slot(const struct wp_tokenizer *t, uint64_t h)
{
    return (size_t)(h ^ (h >> 31) ^ (h >> 47)) & t->slot_mask;
}

/* Finds the id of the token a+b (the prefix, or nothing, then a piece of
 * a word) given its hash h; -1 if it is not in the vocabulary. Splitting
 * the key in two spares building "##piece" strings in the hot loop. */
static int32_t wp_lookup(const struct wp_tokenizer *t, uint64_t h, const char *a, size_t alen,
                         const char *b, size_t blen)
{
    size_t i = wp_slot(t, h);
    for (;;) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (t->slot_hash[i] == h && t->tok_len[id] == alen + blen) {
            const char *tok = t->pool + t->tok_off[id];
            if (memcmp(tok, a, alen) == 0 && memcmp(tok + alen, b, blen) == 0) return id;
        }
        i = (i + 1) & t->slot_mask;
    }
}

/* ---- special-token trie ----------------------------------------------------- */

/* Orders ids by their token bytes (a prefix before its extensions), so the
 * trie builder sees each node's tokens as one contiguous range; ctx is the
 * tokenizer (qsort_r, so concurrent loads share nothing). */
static int wp_cmp_tok(const void *x, const void *y, void *ctx)
{
    const struct wp_tokenizer *t = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    size_t la = t->tok_len[a], lb = t->tok_len[b];
    int c = memcmp(t->pool + t->tok_off[a], t->pool + t->tok_off[b], la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb;
}

/* Builds the trie node for the ids in sorted[lo..hi), which share their
 * first depth bytes; returns the node's index. Nodes and edges were sized
 * beforehand (at most one per token byte), so nothing moves while the
 * recursion runs; depth is bounded by WP_SPECIAL_MAX_BYTES. */
static uint32_t wp_trie_build(struct wp_tokenizer *t, const int32_t *sorted, size_t lo, size_t hi,
                              size_t depth, uint32_t *n_nodes, uint32_t *n_edges)
{
    uint32_t me = (*n_nodes)++;
    t->tn[me].id = -1;
    if (lo < hi && t->tok_len[sorted[lo]] == depth) t->tn[me].id = sorted[lo++];
    uint32_t groups = 0;
    for (size_t i = lo; i < hi;) {
        unsigned char b = (unsigned char)t->pool[t->tok_off[sorted[i]] + depth];
        while (i < hi && (unsigned char)t->pool[t->tok_off[sorted[i]] + depth] == b) i++;
        groups++;
    }
    uint32_t edge0 = *n_edges;
    *n_edges += groups;
    t->tn[me].edge0 = edge0;
    t->tn[me].n_edges = groups;
    uint32_t k = 0;
    for (size_t i = lo; i < hi;) {
        size_t j = i;
        unsigned char b = (unsigned char)t->pool[t->tok_off[sorted[i]] + depth];
        while (j < hi && (unsigned char)t->pool[t->tok_off[sorted[j]] + depth] == b) j++;
        uint32_t child = wp_trie_build(t, sorted, i, j, depth + 1, n_nodes, n_edges);
        t->te[edge0 + k].child = child;
        t->te[edge0 + k].byte = b;
        k++;
        i = j;
    }
    return me;
}

/* The longest special token that starts at p (n bytes available): its id
 * with *mlen set, or -1. Walks the trie until a byte has no edge, so the
 * cost is bounded by the longest special token, whatever the input. */
static int32_t wp_trie_match(const struct wp_tokenizer *t, const unsigned char *p, size_t n,
                             size_t *mlen)
{
    const struct wp_tnode *node = &t->tn[0];
    int32_t best = -1;
    for (size_t i = 0;; i++) {
        if (node->id >= 0) {
            best = node->id;
            *mlen = i;
        }
        if (i == n || node->n_edges == 0) break;
        const struct wp_tedge *e = t->te + node->edge0;
        size_t lo = 0, hi = node->n_edges;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (e[mid].byte < p[i]) lo = mid + 1;
            else hi = mid;
        }
        if (lo == node->n_edges || e[lo].byte != p[i]) break;
        node = &t->tn[e[lo].child];
    }
    return best;
}

/* ---- construction ------------------------------------------------------------ */

/* One token as a loader found it: bytes borrowed from the loader's buffer. */
struct wp_src {
    const char *s;
    size_t n;
};

/* Allocates a tokenizer holding n tokens (src[id], copied) and its lookup
 * table. Returns it, or NULL: *dup_a and *dup_b are then the ids of two equal
 * tokens, or both -1 if memory ran out. */
static struct wp_tokenizer *wp_build(const struct wp_src *src, size_t n, int32_t *dup_a,
                                     int32_t *dup_b)
{
    *dup_a = *dup_b = -1;
    struct wp_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    size_t pool = 0;
    for (size_t i = 0; i < n; i++) pool += src[i].n + 1;
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    t->pool = malloc(pool ? pool : 1);
    t->tok_off = malloc((n ? n : 1) * sizeof(*t->tok_off));
    t->tok_len = malloc((n ? n : 1) * sizeof(*t->tok_len));
    t->slots = malloc(slots * sizeof(*t->slots));
    t->slot_hash = malloc(slots * sizeof(*t->slot_hash));
    if (!t->pool || !t->tok_off || !t->tok_len || !t->slots || !t->slot_hash) goto fail;
    t->n_ids = n;
    t->slot_mask = slots - 1;
    memset(t->slots, 0xff, slots * sizeof(*t->slots));
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(t->pool + off, src[i].s, src[i].n);
        t->pool[off + src[i].n] = '\0';
        t->tok_off[i] = off;
        t->tok_len[i] = (uint32_t)src[i].n;
        off += src[i].n + 1;
        uint64_t h = wp_hash(src[i].s, src[i].n, WP_FNV_OFFSET);
        int32_t other = wp_lookup(t, h, src[i].s, src[i].n, "", 0);
        if (other >= 0) {
            *dup_a = other;
            *dup_b = (int32_t)i;
            goto fail;
        }
        size_t k = wp_slot(t, h);
        while (t->slots[k] >= 0) k = (k + 1) & t->slot_mask;
        t->slots[k] = (int32_t)i;
        t->slot_hash[k] = h;
        if (src[i].n > t->max_start) t->max_start = src[i].n;
    }
    t->unk = t->cls = t->sep = t->pad = t->mask = -1;
    return t;
fail:
    wp_destroy(t);
    return NULL;
}

/* Settles what depends on the settings: the prefix's hash and the longest
 * prefixed token, used to bound WordPiece's candidate pieces. */
static void wp_set_prefix(struct wp_tokenizer *t)
{
    const char *p = t->conf.prefix;
    t->prefix_len = strlen(p);
    t->prefix_hash = wp_hash(p, t->prefix_len, WP_FNV_OFFSET);
    t->max_cont = 0;
    for (size_t i = 0; i < t->n_ids; i++) {
        size_t n = t->tok_len[i];
        if (n >= t->prefix_len && memcmp(t->pool + t->tok_off[i], p, t->prefix_len) == 0 &&
            n - t->prefix_len > t->max_cont)
            t->max_cont = n - t->prefix_len;
    }
    t->strip = t->conf.strip_accents < 0 ? t->conf.lowercase != 0 : t->conf.strip_accents != 0;
}

/* Builds the special-token trie over ids[0..n) (duplicates allowed, empty
 * tokens skipped). Returns 0, or -1 with errstr filled. */
static int wp_set_specials(struct wp_tokenizer *t, const int32_t *ids, size_t n, const char *path,
                           char *errstr, size_t errstr_size)
{
    int32_t *sorted = malloc((n ? n : 1) * sizeof(*sorted));
    if (!sorted) {
        wp_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    size_t m = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = t->tok_len[ids[i]];
        if (len == 0) continue;
        if (len > WP_SPECIAL_MAX_BYTES) {
            wp_seterr(errstr, errstr_size, "%s: special token of %zu bytes, at most %d supported",
                      path, len, WP_SPECIAL_MAX_BYTES);
            goto fail;
        }
        sorted[m++] = ids[i];
    }
    qsort_r(sorted, m, sizeof(*sorted), wp_cmp_tok, t);
    size_t u = 0;
    for (size_t i = 0; i < m; i++)
        if (u == 0 || sorted[u - 1] != sorted[i]) sorted[u++] = sorted[i];
    if (u > 0) {
        for (size_t i = 0; i < u; i++) {
            unsigned char b0 = (unsigned char)t->pool[t->tok_off[sorted[i]]];
            bytes += t->tok_len[sorted[i]];
            t->first[b0 >> 3] |= (unsigned char)(1u << (b0 & 7));
        }
        t->tn = malloc((bytes + 1) * sizeof(*t->tn));
        t->te = malloc((bytes + 1) * sizeof(*t->te));
        if (!t->tn || !t->te) {
            wp_seterr(errstr, errstr_size, "%s: out of memory", path);
            goto fail;
        }
        uint32_t n_nodes = 0, n_edges = 0;
        wp_trie_build(t, sorted, 0, u, 0, &n_nodes, &n_edges);
    }
    free(sorted);
    return 0;
fail:
    free(sorted);
    return -1;
}

/* Renders a token for an error message: at most 64 bytes of it. */
static int wp_show_len(size_t n)
{
    return n > 64 ? 64 : (int)n;
}

/* Reads the whole of path into a new NUL-terminated buffer, refusing what
 * is not a regular file or is over WP_MAX_FILE_BYTES. */
static char *wp_read_file(const char *path, size_t *len, char *errstr, size_t errstr_size)
{
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        wp_seterr(errstr, errstr_size, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        wp_seterr(errstr, errstr_size, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        wp_seterr(errstr, errstr_size, "%s: not a regular file", path);
        goto fail;
    }
    if ((unsigned long long)st.st_size > WP_MAX_FILE_BYTES) {
        wp_seterr(errstr, errstr_size, "%s: file is %lld bytes, over the %zu-byte limit", path,
                  (long long)st.st_size, WP_MAX_FILE_BYTES);
        goto fail;
    }
    size_t size = (size_t)st.st_size, got = 0;
    buf = malloc(size + 1);
    if (!buf) {
        wp_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            wp_seterr(errstr, errstr_size, "%s: %s", path,
                      r < 0 ? strerror(errno) : "file shrank while being read");
            goto fail;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[size] = '\0';
    *len = size;
    return buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

/* Looks up a NUL-terminated token. */
static int32_t wp_find(const struct wp_tokenizer *t, const char *tok)
{
    size_t n = strlen(tok);
    return wp_lookup(t, wp_hash(tok, n, WP_FNV_OFFSET), tok, n, "", 0);
}

/* Copies a token string into a conf field, refusing one that does not fit. */
static int wp_set_tokstr(char *dst, const char *src, size_t n)
{
    if (n >= WP_TOKEN_MAX) return -1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

/* ---- public: settings and vocab.txt --------------------------------------- */

/* bert-base-uncased's settings: the common case needs no config file. */
void wp_conf_defaults(struct wp_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->lowercase = 1;
    c->strip_accents = -1;
    c->chinese_chars = 1;
    c->clean_text = 1;
    c->max_word_chars = 100;
    strcpy(c->unk_token, "[UNK]");
    strcpy(c->cls_token, "[CLS]");
    strcpy(c->sep_token, "[SEP]");
    strcpy(c->pad_token, "[PAD]");
    strcpy(c->mask_token, "[MASK]");
    strcpy(c->prefix, "##");
}

/* Trailing whitespace of a line is not part of the token (the reference
 * trims each line's end), so this returns where the token ends: after the
 * last non-whitespace character. The line must be valid UTF-8. */
static size_t wp_trim_end(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, end = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = wp_utf8_decode(p + i, n - i, &cp);
        if (!wp_is_ws(cp, cp < 0x80 ? 0 : wp_cat(cp))) end = i + k;
        i += k;
    }
    return end;
}

/* Resolves a conf token string to an id, or fails with a message; an
 * empty string is allowed (id -1) only where optional. */
static int wp_special_id(const struct wp_tokenizer *t, const char *path, const char *what,
                         const char *tok, int optional, int32_t *id, char *errstr,
                         size_t errstr_size)
{
    *id = -1;
    if (!tok[0]) {
        if (optional) return 0;
        wp_seterr(errstr, errstr_size, "%s: no %s given", path, what);
        return -1;
    }
    *id = wp_find(t, tok);
    if (*id < 0) {
        wp_seterr(errstr, errstr_size, "%s: the vocabulary has no %s \"%s\"", path, what, tok);
        return -1;
    }
    return 0;
}

/* vocab.txt: lines are split on '\n' (a final line without one counts, an
 * empty remainder after the last does not), each validated and trimmed,
 * and the line number is the id. */
struct wp_tokenizer *wp_load_vocab(const char *vocab_txt, const struct wp_conf *c, char *errstr,
                                   size_t errstr_size)
{
    size_t len;
    struct wp_src *src = NULL;
    struct wp_tokenizer *t = NULL;
    char *buf = wp_read_file(vocab_txt, &len, errstr, errstr_size);
    if (!buf) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += buf[i] == '\n';
    if (len && buf[len - 1] != '\n') n++;
    if (n == 0) {
        wp_seterr(errstr, errstr_size, "%s: empty vocabulary", vocab_txt);
        goto fail;
    }
    if (n > WP_MAX_TOKENS) {
        wp_seterr(errstr, errstr_size, "%s: %zu tokens, at most %zu supported", vocab_txt, n,
                  WP_MAX_TOKENS);
        goto fail;
    }
    src = malloc(n * sizeof(*src));
    if (!src) {
        wp_seterr(errstr, errstr_size, "%s: out of memory", vocab_txt);
        goto fail;
    }
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        size_t bad = wp_utf8_check(buf + pos, end - pos);
        if (bad != end - pos) {
            wp_seterr(errstr, errstr_size, "%s: line %zu: invalid UTF-8 at byte %zu", vocab_txt,
                      i + 1, bad + 1);
            goto fail;
        }
        if (memchr(buf + pos, '\0', end - pos)) {
            wp_seterr(errstr, errstr_size, "%s: line %zu: token holds a NUL byte", vocab_txt, i + 1);
            goto fail;
        }
        src[i].s = buf + pos;
        src[i].n = wp_trim_end(buf + pos, end - pos);
        pos = end + 1;
    }
    int32_t da, db;
    t = wp_build(src, n, &da, &db);
    if (!t) {
        if (da >= 0)
            wp_seterr(errstr, errstr_size, "%s: line %d: token \"%.*s\" repeats line %d", vocab_txt,
                      db + 1, wp_show_len(src[db].n), src[db].s, da + 1);
        else
            wp_seterr(errstr, errstr_size, "%s: out of memory", vocab_txt);
        goto fail;
    }
    t->conf = *c;
    t->conf.unk_token[WP_TOKEN_MAX - 1] = t->conf.cls_token[WP_TOKEN_MAX - 1] = '\0';
    t->conf.sep_token[WP_TOKEN_MAX - 1] = t->conf.pad_token[WP_TOKEN_MAX - 1] = '\0';
    t->conf.mask_token[WP_TOKEN_MAX - 1] = t->conf.prefix[WP_TOKEN_MAX - 1] = '\0';
    if (wp_special_id(t, vocab_txt, "unk token", t->conf.unk_token, 0, &t->unk, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "cls token", t->conf.cls_token, 0, &t->cls, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "sep token", t->conf.sep_token, 0, &t->sep, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "pad token", t->conf.pad_token, 1, &t->pad, errstr,
                      errstr_size) ||
        wp_special_id(t, vocab_txt, "mask token", t->conf.mask_token, 1, &t->mask, errstr,
                      errstr_size))
        goto fail;
    wp_set_prefix(t);
    int32_t sp[5] = {t->unk, t->cls, t->sep, t->pad, t->mask};
    int32_t spv[5];
    size_t nsp = 0;
    for (int i = 0; i < 5; i++)
        if (sp[i] >= 0) spv[nsp++] = sp[i];
    if (wp_set_specials(t, spv, nsp, vocab_txt, errstr, errstr_size) != 0) goto fail;
    free(src);
    free(buf);
    return t;
fail:
    wp_destroy(t);
    free(src);
    free(buf);
    return NULL;
}

/* ---- tokenizer.json ------------------------------------------------------------ */

/* Reads an optional bool member: absent leaves *out, anything but a bool
 * fails with a message naming where. */
static int wp_json_bool(const json_t *obj, const char *key, int *out, const char *path,
                        const char *where, char *errstr, size_t errstr_size)
{
    const json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) {
        wp_seterr(errstr, errstr_size, "%s: %s.%s is not true or false", path, where, key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* The "type" string of a component object, or NULL. */
static const char *wp_json_type(const json_t *obj)
{
    return json_string_value(json_object_get(obj, "type"));
}

/* Checks one step of a TemplateProcessing template: {"SpecialToken":
 * {"id": X, "type_id": T}} or {"Sequence": {"id": "A"|"B", "type_id": T}};
 * for a special token, *tok gets its string. */
static int wp_tmpl_item(const json_t *item, const char *kind, const char *seq, json_int_t type_id,
                        const char **tok)
{
    const json_t *o = json_object_get(item, kind);
    if (!json_is_object(o) || json_object_size(item) != 1) return -1;
    const json_t *id = json_object_get(o, "id");
    const json_t *ty = json_object_get(o, "type_id");
    if (!json_is_string(id) || !json_is_integer(ty) || json_integer_value(ty) != type_id) return -1;
    if (seq && strcmp(json_string_value(id), seq) != 0) return -1;
    if (tok) *tok = json_string_value(id);
    return 0;
}

/* Accepts only the BERT template: single [CLS]:0 A:0 [SEP]:0 and pair
 * [CLS]:0 A:0 [SEP]:0 B:1 [SEP]:1, with one id per special token.
 * Returns 0 with the two strings and ids, or -1. */
static int wp_tmpl_bert(const json_t *pp, const char **cls, const char **sep, json_int_t *cls_id,
                        json_int_t *sep_id)
{
    const json_t *single = json_object_get(pp, "single");
    const json_t *pair = json_object_get(pp, "pair");
    const json_t *sp = json_object_get(pp, "special_tokens");
    if (!json_is_array(single) || json_array_size(single) != 3 || !json_is_array(pair) ||
        json_array_size(pair) != 5 || !json_is_object(sp))
        return -1;
    const char *c2, *s2, *s3;
    if (wp_tmpl_item(json_array_get(single, 0), "SpecialToken", NULL, 0, cls) ||
        wp_tmpl_item(json_array_get(single, 1), "Sequence", "A", 0, NULL) ||
        wp_tmpl_item(json_array_get(single, 2), "SpecialToken", NULL, 0, sep) ||
        wp_tmpl_item(json_array_get(pair, 0), "SpecialToken", NULL, 0, &c2) ||
        wp_tmpl_item(json_array_get(pair, 1), "Sequence", "A", 0, NULL) ||
        wp_tmpl_item(json_array_get(pair, 2), "SpecialToken", NULL, 0, &s2) ||
        wp_tmpl_item(json_array_get(pair, 3), "Sequence", "B", 1, NULL) ||
        wp_tmpl_item(json_array_get(pair, 4), "SpecialToken", NULL, 1, &s3))
        return -1;
    if (strcmp(c2, *cls) != 0 || strcmp(s2, *sep) != 0 || strcmp(s3, *sep) != 0) return -1;
    const char *names[2] = {*cls, *sep};
    json_int_t *ids[2] = {cls_id, sep_id};
    for (int i = 0; i < 2; i++) {
        const json_t *e = json_object_get(sp, names[i]);
        const json_t *eid = json_object_get(e, "ids");
        if (!json_is_array(eid) || json_array_size(eid) != 1 ||
            !json_is_integer(json_array_get(eid, 0)))
            return -1;
        *ids[i] = json_integer_value(json_array_get(eid, 0));
    }
    return 0;
}

/* Reads the post-processor's [CLS]/[SEP] strings and ids: BertProcessing's
 * ["[SEP]", 102] pairs, or the BERT-shaped TemplateProcessing. */
static int wp_json_post(const json_t *pp, const char *path, const char **cls, const char **sep,
                        json_int_t *cls_id, json_int_t *sep_id, char *errstr, size_t errstr_size)
{
    const char *type = wp_json_type(pp);
    if (!json_is_object(pp) || !type) {
        wp_seterr(errstr, errstr_size, "%s: post_processor is missing: not a BERT tokenizer", path);
        return -1;
    }
    if (strcmp(type, "BertProcessing") == 0) {
        const char *keys[2] = {"cls", "sep"};
        const char **strs[2] = {cls, sep};
        json_int_t *ids[2] = {cls_id, sep_id};
        for (int i = 0; i < 2; i++) {
            const json_t *a = json_object_get(pp, keys[i]);
            if (!json_is_array(a) || json_array_size(a) != 2 ||
                !json_is_string(json_array_get(a, 0)) || !json_is_integer(json_array_get(a, 1))) {
                wp_seterr(errstr, errstr_size, "%s: post_processor.%s is not [token, id]", path,
                          keys[i]);
                return -1;
            }
            *strs[i] = json_string_value(json_array_get(a, 0));
            *ids[i] = json_integer_value(json_array_get(a, 1));
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        if (wp_tmpl_bert(pp, cls, sep, cls_id, sep_id) != 0) {
            wp_seterr(errstr, errstr_size,
                      "%s: post_processor template is not BERT's "
                      "([CLS]:0 A:0 [SEP]:0, pair ... B:1 [SEP]:1)",
                      path);
            return -1;
        }
        return 0;
    }
    wp_seterr(errstr, errstr_size, "%s: post_processor type \"%s\" is not BERT's", path, type);
    return -1;
}

/* Reads the normalizer into c: only a BertNormalizer, fields defaulting
 * as the reference's do when absent. */
static int wp_json_normalizer(const json_t *nm, const char *path, struct wp_conf *c, char *errstr,
                              size_t errstr_size)
{
    const char *type = wp_json_type(nm);
    if (!json_is_object(nm) || !type || strcmp(type, "BertNormalizer") != 0) {
        wp_seterr(errstr, errstr_size, "%s: normalizer is \"%s\", not BertNormalizer", path,
                  type ? type : "null");
        return -1;
    }
    if (wp_json_bool(nm, "clean_text", &c->clean_text, path, "normalizer", errstr, errstr_size) ||
        wp_json_bool(nm, "handle_chinese_chars", &c->chinese_chars, path, "normalizer", errstr,
                     errstr_size) ||
        wp_json_bool(nm, "lowercase", &c->lowercase, path, "normalizer", errstr, errstr_size))
        return -1;
    const json_t *sa = json_object_get(nm, "strip_accents");
    if (!sa || json_is_null(sa)) {
        c->strip_accents = -1;
    } else if (json_is_boolean(sa)) {
        c->strip_accents = json_is_true(sa);
    } else {
        wp_seterr(errstr, errstr_size, "%s: normalizer.strip_accents is not null, true or false",
                  path);
        return -1;
    }
    return 0;
}

/* Reads model: a WordPiece with its unk token, prefix, word limit and
 * vocab map; fills src[0..n) by id (src sized by the caller to the vocab's
 * member count) and refuses ids outside 0..n-1 or shared. */
static int wp_json_model(const json_t *model, const char *path, struct wp_conf *c,
                         struct wp_src *src, size_t n, char *errstr, size_t errstr_size)
{
    const json_t *v = json_object_get(model, "unk_token");
    if (!json_is_string(v) || wp_set_tokstr(c->unk_token, json_string_value(v),
                                            json_string_length(v)) != 0) {
        wp_seterr(errstr, errstr_size, "%s: model.unk_token is not a string of under %d bytes",
                  path, WP_TOKEN_MAX);
        return -1;
    }
    v = json_object_get(model, "continuing_subword_prefix");
    if (v && (!json_is_string(v) ||
              wp_set_tokstr(c->prefix, json_string_value(v), json_string_length(v)) != 0)) {
        wp_seterr(errstr, errstr_size,
                  "%s: model.continuing_subword_prefix is not a string of under %d bytes", path,
                  WP_TOKEN_MAX);
        return -1;
    }
    v = json_object_get(model, "max_input_chars_per_word");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            wp_seterr(errstr, errstr_size,
                      "%s: model.max_input_chars_per_word is not a non-negative integer", path);
            return -1;
        }
        c->max_word_chars = (size_t)json_integer_value(v);
    }
    const json_t *vocab = json_object_get(model, "vocab");
    const char *key;
    json_t *val;
    for (size_t i = 0; i < n; i++) src[i].s = NULL;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            (unsigned long long)json_integer_value(val) >= n) {
            wp_seterr(errstr, errstr_size,
                      "%s: model.vocab: id of \"%.*s\" is not in 0..%zu (ids must be dense)", path,
                      wp_show_len(strlen(key)), key, n - 1);
            return -1;
        }
        size_t id = (size_t)json_integer_value(val);
        if (src[id].s) {
            wp_seterr(errstr, errstr_size, "%s: model.vocab: \"%.*s\" and \"%.*s\" share id %zu",
                      path, wp_show_len(src[id].n), src[id].s, wp_show_len(strlen(key)), key, id);
            return -1;
        }
        src[id].s = key;
        src[id].n = strlen(key);
    }
    return 0;
}

/* A HF tokenizer.json: each component is checked to be BERT's before
 * anything is built, so a BPE or SentencePiece file is refused by name. */
struct wp_tokenizer *wp_load_json(const char *tokenizer_json, char *errstr, size_t errstr_size)
{
    const char *path = tokenizer_json;
    size_t len;
    struct wp_src *src = NULL;
    int32_t *spids = NULL;
    struct wp_tokenizer *t = NULL;
    json_t *root = NULL;
    char *buf = wp_read_file(path, &len, errstr, errstr_size);
    if (!buf) return NULL;
    json_error_t jerr;
    root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        wp_seterr(errstr, errstr_size, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                  jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        wp_seterr(errstr, errstr_size, "%s: not a JSON object", path);
        goto fail;
    }
    struct wp_conf c;
    wp_conf_defaults(&c);
    c.pad_token[0] = c.mask_token[0] = '\0';

    const json_t *model = json_object_get(root, "model");
    const char *mtype = wp_json_type(model);
    if (!json_is_object(model) || !mtype || strcmp(mtype, "WordPiece") != 0) {
        wp_seterr(errstr, errstr_size, "%s: model type is \"%s\", not WordPiece", path,
                  mtype ? mtype : "missing");
        goto fail;
    }
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
        wp_seterr(errstr, errstr_size, "%s: model.vocab is not a non-empty object", path);
        goto fail;
    }
    if (wp_json_normalizer(json_object_get(root, "normalizer"), path, &c, errstr, errstr_size))
        goto fail;
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *ptype = wp_json_type(pre);
    if (!ptype || strcmp(ptype, "BertPreTokenizer") != 0) {
        wp_seterr(errstr, errstr_size, "%s: pre_tokenizer is \"%s\", not BertPreTokenizer", path,
                  ptype ? ptype : "null");
        goto fail;
    }
    const char *cls_s, *sep_s;
    json_int_t cls_id, sep_id;
    if (wp_json_post(json_object_get(root, "post_processor"), path, &cls_s, &sep_s, &cls_id,
                     &sep_id, errstr, errstr_size))
        goto fail;
    if (wp_set_tokstr(c.cls_token, cls_s, strlen(cls_s)) ||
        wp_set_tokstr(c.sep_token, sep_s, strlen(sep_s))) {
        wp_seterr(errstr, errstr_size, "%s: post_processor token of %d bytes or more", path,
                  WP_TOKEN_MAX);
        goto fail;
    }

    /* added tokens: those already in the vocab keep their ids, the others
     * extend the id space densely */
    size_t nv = json_object_size(vocab);
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) {
        wp_seterr(errstr, errstr_size, "%s: added_tokens is not an array", path);
        goto fail;
    }
    size_t na = json_is_array(added) ? json_array_size(added) : 0;
    if (nv + na > WP_MAX_TOKENS) {
        wp_seterr(errstr, errstr_size, "%s: %zu tokens, at most %zu supported", path, nv + na,
                  WP_MAX_TOKENS);
        goto fail;
    }
    src = malloc((nv + na) * sizeof(*src));
    spids = malloc((na + 1) * sizeof(*spids));
    if (!src || !spids) {
        wp_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    if (wp_json_model(model, path, &c, src, nv, errstr, errstr_size)) goto fail;
    size_t n = nv;
    for (size_t i = 0; i < na; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *cont = json_object_get(a, "content");
        const json_t *aid = json_object_get(a, "id");
        if (!json_is_object(a) || !json_is_string(cont) || !json_is_integer(aid)) {
            wp_seterr(errstr, errstr_size, "%s: added_tokens[%zu] lacks a string content or an id",
                      path, i);
            goto fail;
        }
        const char *flags[4] = {"normalized", "lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 4; f++) {
            int on = 0;
            if (wp_json_bool(a, flags[f], &on, path, "added_tokens[]", errstr, errstr_size))
                goto fail;
            if (on) {
                wp_seterr(errstr, errstr_size, "%s: added token \"%.*s\": %s=true is not supported",
                          path, wp_show_len(json_string_length(cont)), json_string_value(cont),
                          flags[f]);
                goto fail;
            }
        }
        /* matched as raw text, so it must not be empty or hold a NUL */
        if (json_string_length(cont) == 0 ||
            strlen(json_string_value(cont)) != json_string_length(cont)) {
            wp_seterr(errstr, errstr_size, "%s: added_tokens[%zu]: empty content", path, i);
            goto fail;
        }
        json_int_t id = json_integer_value(aid);
        const char *s = json_string_value(cont);
        size_t sl = json_string_length(cont);
        /* is it a vocab token? (a linear probe of src would be quadratic;
         * the vocab object itself is a hash table) */
        const json_t *vid = json_object_get(vocab, s);
        if (vid) {
            if (json_integer_value(vid) != id) {
                wp_seterr(errstr, errstr_size,
                          "%s: added token \"%.*s\" has id %lld, the vocab says %lld", path,
                          wp_show_len(sl), s, (long long)id, (long long)json_integer_value(vid));
                goto fail;
            }
        } else {
            if (id != (json_int_t)n) {
                wp_seterr(errstr, errstr_size,
                          "%s: added token \"%.*s\" has id %lld, expected %zu (ids must be dense)",
                          path, wp_show_len(sl), s, (long long)id, n);
                goto fail;
            }
            src[n].s = s;
            src[n].n = sl;
            n++;
        }
        spids[i] = (int32_t)id;
    }
    int32_t da, db;
    t = wp_build(src, n, &da, &db);
    if (!t) {
        if (da >= 0)
            wp_seterr(errstr, errstr_size, "%s: token \"%.*s\" appears twice (ids %d and %d)", path,
                      wp_show_len(src[db].n), src[db].s, da, db);
        else
            wp_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    t->unk = wp_find(t, c.unk_token);
    if (t->unk < 0 || (size_t)t->unk >= nv) {
        wp_seterr(errstr, errstr_size, "%s: model.vocab has no unk token \"%s\"", path, c.unk_token);
        goto fail;
    }
    t->cls = wp_find(t, c.cls_token);
    t->sep = wp_find(t, c.sep_token);
    if (t->cls < 0 || t->cls != cls_id || t->sep < 0 || t->sep != sep_id) {
        wp_seterr(errstr, errstr_size,
                  "%s: post_processor says %s=%lld and %s=%lld, the vocabulary %d and %d", path,
                  c.cls_token, (long long)cls_id, c.sep_token, (long long)sep_id, t->cls, t->sep);
        goto fail;
    }
    const json_t *padding = json_object_get(root, "padding");
    const json_t *pad_id = json_object_get(padding, "pad_id");
    if (json_is_integer(pad_id)) {
        if (json_integer_value(pad_id) < 0 || (size_t)json_integer_value(pad_id) >= n) {
            wp_seterr(errstr, errstr_size, "%s: padding.pad_id %lld is out of range", path,
                      (long long)json_integer_value(pad_id));
            goto fail;
        }
        t->pad = (int32_t)json_integer_value(pad_id);
    } else {
        t->pad = wp_find(t, "[PAD]");
    }
    t->mask = wp_find(t, "[MASK]");
    if (t->pad >= 0) wp_set_tokstr(c.pad_token, wp_id_token(t, t->pad), t->tok_len[t->pad]);
    if (t->mask >= 0) wp_set_tokstr(c.mask_token, "[MASK]", 6);
    t->conf = c;
    wp_set_prefix(t);
    if (wp_set_specials(t, spids, na, path, errstr, errstr_size) != 0) goto fail;
    json_decref(root);
    free(spids);
    free(src);
    free(buf);
    return t;
fail:
    wp_destroy(t);
    json_decref(root);
    free(spids);
    free(src);
    free(buf);
    return NULL;
}

/* ---- tokenizer_config.json ---------------------------------------------------- */

/* A special-token entry of tokenizer_config.json: a string, an AddedToken
 * object {"content": ...}, or null (no such token). */
static int wp_cfg_token(const json_t *root, const char *key, char *dst, const char *path,
                        char *errstr, size_t errstr_size)
{
    const json_t *v = json_object_get(root, key);
    if (!v) return 0;
    if (json_is_null(v)) {
        dst[0] = '\0';
        return 0;
    }
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
        wp_set_tokstr(dst, json_string_value(v), json_string_length(v)) != 0) {
        wp_seterr(errstr, errstr_size, "%s: %s is not a token string of under %d bytes", path, key,
                  WP_TOKEN_MAX);
        return -1;
    }
    return 0;
}

/* The settings a folder with vocab.txt and tokenizer_config.json implies,
 * read the way transformers reads them for BertTokenizer(Fast). */
int wp_read_config_json(const char *tokenizer_config_json, struct wp_conf *c,
                        size_t *model_max_length, char *errstr, size_t errstr_size)
{
    const char *path = tokenizer_config_json;
    size_t len;
    int rc = -1;
    json_t *root = NULL;
    char *buf = wp_read_file(path, &len, errstr, errstr_size);
    if (!buf) return -1;
    json_error_t jerr;
    /* integers as reals: transformers writes int(1e30), past any json_int_t */
    root = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) {
        wp_seterr(errstr, errstr_size, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                  jerr.text);
        goto out;
    }
    if (!json_is_object(root)) {
        wp_seterr(errstr, errstr_size, "%s: not a JSON object", path);
        goto out;
    }
    struct wp_conf n = *c;
    if (wp_json_bool(root, "do_lower_case", &n.lowercase, path, "config", errstr, errstr_size) ||
        wp_json_bool(root, "tokenize_chinese_chars", &n.chinese_chars, path, "config", errstr,
                     errstr_size))
        goto out;
    const json_t *sa = json_object_get(root, "strip_accents");
    if (sa) {
        if (json_is_null(sa)) {
            n.strip_accents = -1;
        } else if (json_is_boolean(sa)) {
            n.strip_accents = json_is_true(sa);
        } else {
            wp_seterr(errstr, errstr_size, "%s: strip_accents is not null, true or false", path);
            goto out;
        }
    }
    if (wp_cfg_token(root, "unk_token", n.unk_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "cls_token", n.cls_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "sep_token", n.sep_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "pad_token", n.pad_token, path, errstr, errstr_size) ||
        wp_cfg_token(root, "mask_token", n.mask_token, path, errstr, errstr_size))
        goto out;
    size_t mml = 0;
    const json_t *m = json_object_get(root, "model_max_length");
    if (m && !json_is_null(m)) {
        /* transformers writes int(1e30) for "no limit"; anything past
         * 2^53 is that placeholder, not a length */
        double d = json_is_integer(m) ? (double)json_integer_value(m)
                                      : json_is_real(m) ? json_real_value(m) : -1.0;
        if (!json_is_number(m) || d < 0 || (d < 9007199254740992.0 && d != (double)(size_t)d)) {
            wp_seterr(errstr, errstr_size, "%s: model_max_length is not a non-negative integer",
                      path);
            goto out;
        }
        mml = d >= 9007199254740992.0 ? 0 : (size_t)d;
    }
    *c = n;
    if (model_max_length) *model_max_length = mml;
    rc = 0;
out:
    json_decref(root);
    free(buf);
    return rc;
}

/* ---- accessors -------------------------------------------------------------- */

/* Frees everything t owns. */
void wp_destroy(struct wp_tokenizer *t)
{
    if (!t) return;
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->slots);
    free(t->slot_hash);
    free(t->tn);
    free(t->te);
    free(t);
}

/* Lets callers log and check the settings a file implied. */
const struct wp_conf *wp_get_conf(const struct wp_tokenizer *t)
{
    return &t->conf;
}

/* Size of the id space, for checking ids against an embedding table. */
size_t wp_vocab_size(const struct wp_tokenizer *t)
{
    return t->n_ids;
}

/* Public lookup of a whole token. */
int32_t wp_token_id(const struct wp_tokenizer *t, const char *token)
{
    return wp_find(t, token);
}

/* Reverse lookup, for logs and tests. */
const char *wp_id_token(const struct wp_tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_ids) return NULL;
    return t->pool + t->tok_off[id];
}

/* The special ids a caller needs to build its own batches. */
int32_t wp_unk_id(const struct wp_tokenizer *t) { return t->unk; }
/* See wp_unk_id. */
int32_t wp_cls_id(const struct wp_tokenizer *t) { return t->cls; }
/* See wp_unk_id. */
int32_t wp_sep_id(const struct wp_tokenizer *t) { return t->sep; }
/* See wp_unk_id; -1 if the vocabulary has no pad token. */
int32_t wp_pad_id(const struct wp_tokenizer *t) { return t->pad; }
/* See wp_unk_id; -1 if the vocabulary has no mask token. */
int32_t wp_mask_id(const struct wp_tokenizer *t) { return t->mask; }

/* ---- scratch ------------------------------------------------------------------ */

/* Grows an array to hold need elements of elem bytes (doubling, so
 * appends are amortised O(1)); returns the new pointer, or NULL with p and
 * *cap untouched. */
static void *wp_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return NULL;
        nc *= 2;
    }
    void *q = realloc(p, nc * elem);
    if (!q) return NULL;
    *cap = nc;
    return q;
}

/* A scratch sized for expect_len bytes of input, so that the first call
 * already runs without allocating. */
struct wp_scratch *wp_scratch_new(size_t expect_len)
{
    struct wp_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    void *p;
    if (!(p = wp_grow(s->a.v, &s->a.cap, expect_len + 3, sizeof(int32_t)))) goto fail;
    s->a.v = p;
    if (!(p = wp_grow(s->b.v, &s->b.cap, 16, sizeof(int32_t)))) goto fail;
    s->b.v = p;
    if (!(p = wp_grow(s->word, &s->word_cap, 512, 1))) goto fail;
    s->word = p;
    if (!(p = wp_grow(s->hs, &s->hs_cap, 512, sizeof(uint64_t)))) goto fail;
    s->hs = p;
    return s;
fail:
    wp_scratch_destroy(s);
    return NULL;
}

/* Frees everything s owns. */
void wp_scratch_destroy(struct wp_scratch *s)
{
    if (!s) return;
    free(s->a.v);
    free(s->b.v);
    free(s->word);
    free(s->hs);
    free(s->run);
    free(s->run_tmp);
    free(s->norm);
    free(s);
}

/* ---- the pipeline ---------------------------------------------------------------- */

/* One call's state: where characters go (ids of one sequence, or the
 * normalized text for wp_normalize) and a sticky out-of-memory flag, so
 * the per-character stages need no error plumbing. */
struct wp_enc {
    const struct wp_tokenizer *t;
    struct wp_scratch *s;
    struct wp_ivec *out;
    int normalize_only;
    int oom;
};

/* Appends one id to the current sequence. */
static void wp_push(struct wp_enc *e, int32_t id)
{
    struct wp_ivec *v = e->out;
    if (v->n == v->cap) {
        void *p = wp_grow(v->v, &v->cap, v->n + 1, sizeof(int32_t));
        if (!p) {
            e->oom = 1;
            return;
        }
        v->v = p;
    }
    v->v[v->n++] = id;
}

/* WordPiece over the finished word: at each position the longest
 * vocabulary entry (prefixed after the first piece) wins; no match at some
 * position, or too many characters, makes the whole word the unk token.
 * Candidate ends are tried from the longest a vocabulary entry can be,
 * with every candidate's hash taken from one forward pass, so a word costs
 * O(length x longest token). */
static void wp_wordpiece(struct wp_enc *e)
{
    const struct wp_tokenizer *t = e->t;
    struct wp_scratch *s = e->s;
    if (s->word_chars > t->conf.max_word_chars) {
        wp_push(e, t->unk);
        return;
    }
    const char *w = s->word;
    size_t n = s->word_n;
    size_t mark = e->out->n;
    size_t st = 0;
    while (st < n) {
        uint64_t h = st == 0 ? WP_FNV_OFFSET : t->prefix_hash;
        size_t maxl = st == 0 ? t->max_start : t->max_cont;
        size_t lim = n - st < maxl ? n : st + maxl;
        for (size_t k = st; k < lim; k++) {
            h = wp_fnv(h, (unsigned char)w[k]);
            s->hs[k - st] = h;
        }
        int32_t id = -1;
        size_t end;
        for (end = lim; end > st; end--) {
            if (end < n && ((unsigned char)w[end] & 0xC0) == 0x80) continue;
            id = wp_lookup(t, s->hs[end - st - 1], t->conf.prefix, st ? t->prefix_len : 0, w + st,
                           end - st);
            if (id >= 0) break;
        }
        if (id < 0) {
            e->out->n = mark;
            wp_push(e, t->unk);
            return;
        }
        wp_push(e, id);
        st = end;
    }
}

/* Ends the current word, if any, and tokenizes it. */
static void wp_end_word(struct wp_enc *e)
{
    struct wp_scratch *s = e->s;
    if (s->word_chars == 0) return;
    wp_wordpiece(e);
    s->word_n = 0;
    s->word_chars = 0;
}

/* Adds a character to the current word. Only the first max_word_chars are
 * stored (a longer word is the unk token whatever it holds), so the word
 * buffer stays small however long the input's words are. */
static void wp_word_add(struct wp_enc *e, uint32_t cp)
{
    struct wp_scratch *s = e->s;
    s->word_chars++;
    if (s->word_chars > e->t->conf.max_word_chars) return;
    if (s->word_n + 4 > s->word_cap) {
        void *p = wp_grow(s->word, &s->word_cap, s->word_n + 4, 1);
        if (!p) {
            e->oom = 1;
            return;
        }
        s->word = p;
    }
    if (s->word_cap > s->hs_cap) {
        void *p = wp_grow(s->hs, &s->hs_cap, s->word_cap, sizeof(uint64_t));
        if (!p) {
            e->oom = 1;
            return;
        }
        s->hs = p;
    }
    s->word_n += wp_utf8_encode(cp, s->word + s->word_n);
}

/* Appends a character to wp_normalize's output. */
static void wp_norm_add(struct wp_enc *e, uint32_t cp)
{
    struct wp_scratch *s = e->s;
    if (s->norm_n + 4 > s->norm_cap) {
        void *p = wp_grow(s->norm, &s->norm_cap, s->norm_n + 4, 1);
        if (!p) {
            e->oom = 1;
            return;
        }
        s->norm = p;
    }
    s->norm_n += wp_utf8_encode(cp, s->norm + s->norm_n);
}

/* Pre-tokenizer: whitespace ends a word; punctuation ends it and is a word
 * of its own; anything else extends it. */
static void wp_stage_pre(struct wp_enc *e, uint32_t cp)
{
    if (e->normalize_only) {
        wp_norm_add(e, cp);
        return;
    }
    int cat = cp < 0x80 ? 0 : wp_cat(cp);
    if (wp_is_ws(cp, cat)) {
        wp_end_word(e);
    } else if (wp_is_punct(cp, cat)) {
        wp_end_word(e);
        wp_word_add(e, cp);
        wp_end_word(e);
    } else {
        wp_word_add(e, cp);
    }
}

/* Normalizer, last step: lowercase, character by character, as Rust's
 * char::to_lowercase (context-free: a final sigma stays σ). */
static void wp_stage_lower(struct wp_enc *e, uint32_t cp)
{
    if (!e->t->conf.lowercase) {
        wp_stage_pre(e, cp);
    } else if (cp < 0x80) {
        wp_stage_pre(e, cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    } else if (cp == 0x130) {
        wp_stage_pre(e, 'i');
        wp_stage_pre(e, 0x307);
    } else {
        wp_stage_pre(e, wp_lower(cp));
    }
}

/* Releases the held run of nonstarters in canonical order: stable by
 * combining class. Short runs (all real text) use insertion sort; long
 * ones, which only hostile input makes, a counting sort, so a megabyte of
 * combining marks stays linear. */
static void wp_flush_run(struct wp_enc *e)
{
    struct wp_scratch *s = e->s;
    size_t n = s->run_n;
    if (n == 0) return;
    struct wp_runc *r = s->run;
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            struct wp_runc x = r[i];
            size_t j = i;
            while (j > 0 && r[j - 1].ccc > x.ccc) {
                r[j] = r[j - 1];
                j--;
            }
            r[j] = x;
        }
    } else {
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[r[i].ccc + 1]++;
        for (size_t c = 1; c < 257; c++) count[c] += count[c - 1];
        for (size_t i = 0; i < n; i++) s->run_tmp[count[r[i].ccc]++] = r[i];
        r = s->run_tmp;
    }
    s->run_n = 0;
    for (size_t i = 0; i < n; i++) wp_stage_lower(e, r[i].cp);
}

/* Holds a nonstarter back until the run it belongs to ends. */
static void wp_run_add(struct wp_enc *e, uint32_t cp, uint32_t ccc)
{
    struct wp_scratch *s = e->s;
    if (s->run_n == s->run_cap) {
        size_t cap = s->run_cap, cap2 = s->run_cap;
        void *p = wp_grow(s->run, &cap, s->run_n + 1, sizeof(*s->run));
        if (!p) {
            e->oom = 1;
            return;
        }
        s->run = p;
        void *q = wp_grow(s->run_tmp, &cap2, cap, sizeof(*s->run_tmp));
        if (!q) {
            e->oom = 1;
            return;
        }
        s->run_tmp = q;
        s->run_cap = cap < cap2 ? cap : cap2;
    }
    s->run[s->run_n].cp = cp;
    s->run[s->run_n].ccc = ccc;
    s->run_n++;
}

/* Normalizer, strip_accents: canonical decomposition (NFD: full
 * decomposition, then each run of nonstarters put in combining-class
 * order), dropping the nonspacing marks. A mark that is dropped still
 * counts for where runs begin and end, as NFD runs before the filter. */
static void wp_stage_strip(struct wp_enc *e, uint32_t cp)
{
    if (!e->t->strip) {
        wp_stage_lower(e, cp);
        return;
    }
    if (cp < 0x80) {
        wp_flush_run(e);
        wp_stage_lower(e, cp);
        return;
    }
    utf8proc_int32_t d[WP_DECOMP_MAX];
    utf8proc_ssize_t nd = 0;
    if (!(wp_xflags(cp) & WP_X_NO_DECOMP)) {
        int bc = 0;
        nd = utf8proc_decompose_char((utf8proc_int32_t)cp, d, WP_DECOMP_MAX, UTF8PROC_DECOMPOSE,
                                     &bc);
    }
    if (nd <= 0 || nd > WP_DECOMP_MAX) {
        d[0] = (utf8proc_int32_t)cp;
        nd = 1;
    }
    for (utf8proc_ssize_t i = 0; i < nd; i++) {
        uint32_t c = (uint32_t)d[i];
        const utf8proc_property_t *p = utf8proc_get_property(d[i]);
        int mn = wp_is_mn(c, p->category);
        if (p->combining_class == 0) {
            wp_flush_run(e);
            if (!mn) wp_stage_lower(e, c);
        } else if (!mn) {
            wp_run_add(e, c, p->combining_class);
        }
    }
}

/* Normalizer, first steps: clean_text then handle_chinese_chars, for one
 * input character. */
static void wp_feed(struct wp_enc *e, uint32_t cp)
{
    const struct wp_conf *c = &e->t->conf;
    int cat = cp < 0x80 ? (cp < 0x20 || cp == 0x7F ? UTF8PROC_CATEGORY_CC : 0) : wp_cat(cp);
    if (c->clean_text) {
        if (cp == 0 || cp == 0xFFFD || wp_is_other(cp, cat)) return;
        if (wp_is_ws(cp, cat)) cp = ' ';
    }
    if (c->chinese_chars && cp >= 0x3400 && wp_is_cjk(cp)) {
        wp_stage_strip(e, ' ');
        wp_stage_strip(e, cp);
        wp_stage_strip(e, ' ');
    } else {
        wp_stage_strip(e, cp);
    }
}

/* Ends a stretch of normal text (at a special token or the end): releases
 * held characters and the last word. */
static void wp_end_segment(struct wp_enc *e)
{
    wp_flush_run(e);
    if (!e->normalize_only) wp_end_word(e);
}

/* Runs one sequence through the whole pipeline into out. Returns 0, or an
 * enum wp_err with errstr filled (which names the sequence). */
static int wp_run(struct wp_enc *e, const char *text, size_t len, struct wp_ivec *out,
                  const char *which, char *errstr, size_t errstr_size)
{
    const struct wp_tokenizer *t = e->t;
    struct wp_scratch *s = e->s;
    const unsigned char *p = (const unsigned char *)text;
    e->out = out;
    out->n = 0;
    s->word_n = s->word_chars = s->run_n = 0;
    size_t i = 0;
    while (i < len) {
        if (!e->normalize_only && t->tn && (t->first[p[i] >> 3] >> (p[i] & 7) & 1)) {
            size_t ml = 0;
            int32_t id = wp_trie_match(t, p + i, len - i, &ml);
            if (id >= 0) {
                wp_end_segment(e);
                wp_push(e, id);
                i += ml;
                continue;
            }
        }
        uint32_t cp;
        size_t k = wp_utf8_decode(p + i, len - i, &cp);
        if (!k) {
            wp_seterr(errstr, errstr_size, "%s is not valid UTF-8 at byte %zu (0x%02x)", which, i,
                      p[i]);
            return WP_ERR_UTF8;
        }
        wp_feed(e, cp);
        i += k;
    }
    wp_end_segment(e);
    if (e->oom) {
        wp_seterr(errstr, errstr_size, "out of memory encoding %zu bytes of %s", len, which);
        return WP_ERR_NOMEM;
    }
    return 0;
}

/* The reference's longest_first for a pair, with room for max tokens
 * besides the specials (max_len in all): keep the shorter side whole if
 * the longer still gets at least as many, else split max evenly, the odd
 * token going to the side that was longer. Which side is longer is judged
 * after cutting each to max_len, as the reference does (it cuts every
 * sequence to max_len before the pair rule runs), so two sides that both
 * reach max_len count as a tie and the odd token goes to the second. */
static void wp_longest_first(size_t *na, size_t *nb, size_t max, size_t max_len)
{
    size_t n1 = *na < max_len ? *na : max_len;
    size_t n2 = *nb < max_len ? *nb : max_len;
    int swap = n1 > n2;
    if (swap) {
        size_t x = n1;
        n1 = n2;
        n2 = x;
    }
    if (n1 > max) n2 = n1;
    else n2 = n1 > max - n1 ? n1 : max - n1;
    if (n1 + n2 > max) {
        n1 = max / 2;
        n2 = n1 + max % 2;
    }
    if (swap) {
        size_t x = n1;
        n1 = n2;
        n2 = x;
    }
    if (n1 < *na) *na = n1;
    if (n2 < *nb) *nb = n2;
}

/* Encodes text (and pair) and lays out [CLS] A [SEP] (B [SEP]), truncated
 * as asked; see wordpiece.h. */
int wp_encode(const struct wp_tokenizer *t, struct wp_scratch *s, const char *text, size_t len,
              const char *pair, size_t pair_len, size_t max_len, int truncate, int32_t *ids,
              int32_t *type_ids, size_t cap, size_t *full_len, char *errstr, size_t errstr_size)
{
    if ((!text && len) || (!pair && pair_len) || (!ids && cap)) {
        wp_seterr(errstr, errstr_size, "wp_encode: NULL buffer with a non-zero length");
        return WP_ERR_ARG;
    }
    struct wp_enc e = {.t = t, .s = s};
    int rc = wp_run(&e, text ? text : "", len, &s->a, "text", errstr, errstr_size);
    if (rc) return rc;
    s->b.n = 0;
    if (pair && (rc = wp_run(&e, pair, pair_len, &s->b, "pair", errstr, errstr_size))) return rc;
    size_t nspec = pair ? 3 : 2;
    size_t na = s->a.n, nb = s->b.n;
    size_t full = na + nb + nspec;
    if (full_len) *full_len = full;
    if (max_len && full > max_len) {
        if (!truncate) {
            wp_seterr(errstr, errstr_size, "input is %zu tokens, over the limit of %zu", full,
                      max_len);
            return WP_ERR_TOO_LONG;
        }
        if (max_len < nspec) {
            wp_seterr(errstr, errstr_size,
                      "max_len %zu cannot hold the %zu special tokens of a %s", max_len, nspec,
                      pair ? "pair" : "sequence");
            return WP_ERR_ARG;
        }
        if (pair) wp_longest_first(&na, &nb, max_len - nspec, max_len);
        else na = max_len - nspec;
    }
    size_t need = na + nb + nspec;
    if (need > INT_MAX) {
        wp_seterr(errstr, errstr_size, "the encoding needs %zu entries, more than an int counts",
                  need);
        return WP_ERR_CAP;
    }
    if (need > cap) {
        wp_seterr(errstr, errstr_size, "the encoding needs %zu entries, the buffer holds %zu", need,
                  cap);
        return WP_ERR_CAP;
    }
    size_t o = 0;
    ids[o++] = t->cls;
    memcpy(ids + o, s->a.v, na * sizeof(int32_t));
    o += na;
    ids[o++] = t->sep;
    if (pair) {
        memcpy(ids + o, s->b.v, nb * sizeof(int32_t));
        o += nb;
        ids[o++] = t->sep;
    }
    if (type_ids) {
        size_t first = na + 2;
        for (size_t i = 0; i < o; i++) type_ids[i] = i < first ? 0 : 1;
    }
    return (int)o;
}

/* The normalizer alone, into the scratch's text buffer. */
const char *wp_normalize(const struct wp_tokenizer *t, struct wp_scratch *s, const char *text,
                         size_t len, size_t *out_len, char *errstr, size_t errstr_size)
{
    if (!text && len) {
        wp_seterr(errstr, errstr_size, "wp_normalize: NULL text with a non-zero length");
        return NULL;
    }
    struct wp_enc e = {.t = t, .s = s, .normalize_only = 1};
    s->norm_n = 0;
    if (wp_run(&e, text ? text : "", len, &s->a, "text", errstr, errstr_size) != 0) return NULL;
    if (!s->norm) {
        void *p = wp_grow(s->norm, &s->norm_cap, 1, 1);
        if (!p) {
            wp_seterr(errstr, errstr_size, "out of memory");
            return NULL;
        }
        s->norm = p;
    }
    *out_len = s->norm_n;
    return s->norm;
}

/* unicode.c - the character classes, lowercasing, canonical decomposition
 * and strict UTF-8 that Hugging Face's normalizers and pre-tokenizers
 * apply (unicode.h), with the reference's own answers where its tables and
 * libutf8proc's disagree. WordPiece uses them today; byte-level BPE and
 * Unigram are to use the same ones.
 *
 * Threads: any; nothing here has state. Ownership: callers' buffers only. */
#include "unicode.h"

#include <stddef.h>
#include <stdint.h>
#include <utf8proc.h>

/* ---- Unicode -------------------------------------------------------------
 * The reference decides "control", "nonspacing mark" and "punctuation" with
 * tables of Unicode 8.0 categories, decomposes with a normalization table
 * that lacks U+11938's mapping, and lowercases with Unicode 16.0; libutf8proc
 * 2.8 answers for Unicode 15.0. These rows are every code point where the
 * two disagree, found by running all 1,112,064 scalar values through both
 * (tests/data/wordpiece/unicode.tsv holds the reference's side, and
 * test_wordpiece checks each value against it). */
enum {
    UNI_X_NOT_OTHER = 1,  /* not a control/format char to the reference */
    UNI_X_NOT_MN = 2,     /* not a nonspacing mark to the reference */
    UNI_X_IS_MN = 4,      /* a nonspacing mark to the reference */
    UNI_X_NOT_PUNCT = 8,  /* not punctuation to the reference */
    UNI_X_IS_PUNCT = 16,  /* punctuation to the reference */
    UNI_X_NO_DECOMP = 32, /* the reference does not decompose it */
};

static const struct {
    uint32_t lo, hi;
    uint8_t flags;
} uni_exc[] = {
    {0x061D, 0x061D, UNI_X_NOT_PUNCT},   {0x07FD, 0x07FD, UNI_X_NOT_MN},
    {0x0890, 0x0891, UNI_X_NOT_OTHER},   {0x0898, 0x089F, UNI_X_NOT_MN},
    {0x08CA, 0x08E1, UNI_X_NOT_MN},      {0x08E2, 0x08E2, UNI_X_NOT_OTHER},
    {0x09FD, 0x09FD, UNI_X_NOT_PUNCT},   {0x09FE, 0x09FE, UNI_X_NOT_MN},
    {0x0A76, 0x0A76, UNI_X_NOT_PUNCT},   {0x0AFA, 0x0AFF, UNI_X_NOT_MN},
    {0x0B55, 0x0B55, UNI_X_NOT_MN},      {0x0C04, 0x0C04, UNI_X_NOT_MN},
    {0x0C3C, 0x0C3C, UNI_X_NOT_MN},      {0x0C77, 0x0C77, UNI_X_NOT_PUNCT},
    {0x0C84, 0x0C84, UNI_X_NOT_PUNCT},   {0x0D00, 0x0D00, UNI_X_NOT_MN},
    {0x0D3B, 0x0D3C, UNI_X_NOT_MN},      {0x0D81, 0x0D81, UNI_X_NOT_MN},
    {0x0EBA, 0x0EBA, UNI_X_NOT_MN},      {0x0ECE, 0x0ECE, UNI_X_NOT_MN},
    {0x166D, 0x166D, UNI_X_IS_PUNCT},    {0x1734, 0x1734, UNI_X_IS_MN},
    {0x180F, 0x180F, UNI_X_NOT_MN},      {0x1885, 0x1886, UNI_X_NOT_MN},
    {0x1ABF, 0x1ACE, UNI_X_NOT_MN},      {0x1B7D, 0x1B7E, UNI_X_NOT_PUNCT},
    {0x1DF6, 0x1DFB, UNI_X_NOT_MN},      {0x2E43, 0x2E4F, UNI_X_NOT_PUNCT},
    {0x2E52, 0x2E5D, UNI_X_NOT_PUNCT},   {0xA82C, 0xA82C, UNI_X_NOT_MN},
    {0xA8C5, 0xA8C5, UNI_X_NOT_MN},      {0xA8FF, 0xA8FF, UNI_X_NOT_MN},
    {0xA9BD, 0xA9BD, UNI_X_NOT_MN},      {0x10D24, 0x10D27, UNI_X_NOT_MN},
    {0x10EAB, 0x10EAC, UNI_X_NOT_MN},    {0x10EAD, 0x10EAD, UNI_X_NOT_PUNCT},
    {0x10EFD, 0x10EFF, UNI_X_NOT_MN},    {0x10F46, 0x10F50, UNI_X_NOT_MN},
    {0x10F55, 0x10F59, UNI_X_NOT_PUNCT}, {0x10F82, 0x10F85, UNI_X_NOT_MN},
    {0x10F86, 0x10F89, UNI_X_NOT_PUNCT}, {0x11070, 0x11070, UNI_X_NOT_MN},
    {0x11073, 0x11074, UNI_X_NOT_MN},    {0x110C2, 0x110C2, UNI_X_NOT_MN},
    {0x110CD, 0x110CD, UNI_X_NOT_OTHER}, {0x111C9, 0x111C9, UNI_X_NOT_MN | UNI_X_IS_PUNCT},
    {0x111CF, 0x111CF, UNI_X_NOT_MN},    {0x1123E, 0x1123E, UNI_X_NOT_MN},
    {0x11241, 0x11241, UNI_X_NOT_MN},    {0x1133B, 0x1133B, UNI_X_NOT_MN},
    {0x11438, 0x1143F, UNI_X_NOT_MN},    {0x11442, 0x11444, UNI_X_NOT_MN},
    {0x11446, 0x11446, UNI_X_NOT_MN},    {0x1144B, 0x1144F, UNI_X_NOT_PUNCT},
    {0x1145A, 0x1145B, UNI_X_NOT_PUNCT}, {0x1145D, 0x1145D, UNI_X_NOT_PUNCT},
    {0x1145E, 0x1145E, UNI_X_NOT_MN},    {0x11660, 0x1166C, UNI_X_NOT_PUNCT},
    {0x116B9, 0x116B9, UNI_X_NOT_PUNCT}, {0x1182F, 0x11837, UNI_X_NOT_MN},
    {0x11839, 0x1183A, UNI_X_NOT_MN},    {0x1183B, 0x1183B, UNI_X_NOT_PUNCT},
    {0x11938, 0x11938, UNI_X_NO_DECOMP}, {0x1193B, 0x1193C, UNI_X_NOT_MN},
    {0x1193E, 0x1193E, UNI_X_NOT_MN},    {0x11943, 0x11943, UNI_X_NOT_MN},
    {0x11944, 0x11946, UNI_X_NOT_PUNCT}, {0x119D4, 0x119D7, UNI_X_NOT_MN},
    {0x119DA, 0x119DB, UNI_X_NOT_MN},    {0x119E0, 0x119E0, UNI_X_NOT_MN},
    {0x119E2, 0x119E2, UNI_X_NOT_PUNCT}, {0x11A01, 0x11A0A, UNI_X_NOT_MN},
    {0x11A33, 0x11A38, UNI_X_NOT_MN},    {0x11A3B, 0x11A3E, UNI_X_NOT_MN},
    {0x11A3F, 0x11A46, UNI_X_NOT_PUNCT}, {0x11A47, 0x11A47, UNI_X_NOT_MN},
    {0x11A51, 0x11A56, UNI_X_NOT_MN},    {0x11A59, 0x11A5B, UNI_X_NOT_MN},
    {0x11A8A, 0x11A96, UNI_X_NOT_MN},    {0x11A98, 0x11A99, UNI_X_NOT_MN},
    {0x11A9A, 0x11A9C, UNI_X_NOT_PUNCT}, {0x11A9E, 0x11AA2, UNI_X_NOT_PUNCT},
    {0x11B00, 0x11B09, UNI_X_NOT_PUNCT}, {0x11C30, 0x11C36, UNI_X_NOT_MN},
    {0x11C38, 0x11C3D, UNI_X_NOT_MN},    {0x11C3F, 0x11C3F, UNI_X_NOT_MN},
    {0x11C41, 0x11C45, UNI_X_NOT_PUNCT}, {0x11C70, 0x11C71, UNI_X_NOT_PUNCT},
    {0x11C92, 0x11CA7, UNI_X_NOT_MN},    {0x11CAA, 0x11CB0, UNI_X_NOT_MN},
    {0x11CB2, 0x11CB3, UNI_X_NOT_MN},    {0x11CB5, 0x11CB6, UNI_X_NOT_MN},
    {0x11D31, 0x11D36, UNI_X_NOT_MN},    {0x11D3A, 0x11D3A, UNI_X_NOT_MN},
    {0x11D3C, 0x11D3D, UNI_X_NOT_MN},    {0x11D3F, 0x11D45, UNI_X_NOT_MN},
    {0x11D47, 0x11D47, UNI_X_NOT_MN},    {0x11D90, 0x11D91, UNI_X_NOT_MN},
    {0x11D95, 0x11D95, UNI_X_NOT_MN},    {0x11D97, 0x11D97, UNI_X_NOT_MN},
    {0x11EF3, 0x11EF4, UNI_X_NOT_MN},    {0x11EF7, 0x11EF8, UNI_X_NOT_PUNCT},
    {0x11F00, 0x11F01, UNI_X_NOT_MN},    {0x11F36, 0x11F3A, UNI_X_NOT_MN},
    {0x11F40, 0x11F40, UNI_X_NOT_MN},    {0x11F42, 0x11F42, UNI_X_NOT_MN},
    {0x11F43, 0x11F4F, UNI_X_NOT_PUNCT}, {0x11FFF, 0x11FFF, UNI_X_NOT_PUNCT},
    {0x12FF1, 0x12FF2, UNI_X_NOT_PUNCT}, {0x13430, 0x1343F, UNI_X_NOT_OTHER},
    {0x13440, 0x13440, UNI_X_NOT_MN},    {0x13447, 0x13455, UNI_X_NOT_MN},
    {0x16E97, 0x16E9A, UNI_X_NOT_PUNCT}, {0x16F4F, 0x16F4F, UNI_X_NOT_MN},
    {0x16FE2, 0x16FE2, UNI_X_NOT_PUNCT}, {0x16FE4, 0x16FE4, UNI_X_NOT_MN},
    {0x1CF00, 0x1CF2D, UNI_X_NOT_MN},    {0x1CF30, 0x1CF46, UNI_X_NOT_MN},
    {0x1E000, 0x1E006, UNI_X_NOT_MN},    {0x1E008, 0x1E018, UNI_X_NOT_MN},
    {0x1E01B, 0x1E021, UNI_X_NOT_MN},    {0x1E023, 0x1E024, UNI_X_NOT_MN},
    {0x1E026, 0x1E02A, UNI_X_NOT_MN},    {0x1E08F, 0x1E08F, UNI_X_NOT_MN},
    {0x1E130, 0x1E136, UNI_X_NOT_MN},    {0x1E2AE, 0x1E2AE, UNI_X_NOT_MN},
    {0x1E2EC, 0x1E2EF, UNI_X_NOT_MN},    {0x1E4EC, 0x1E4EF, UNI_X_NOT_MN},
    {0x1E944, 0x1E94A, UNI_X_NOT_MN},    {0x1E95E, 0x1E95F, UNI_X_NOT_PUNCT},
};

/* Lowercase mappings the reference has (Unicode 16.0) and utf8proc 2.8
 * lacks: each code point in lo..hi lowercases to itself + delta. */
static const struct {
    uint32_t lo, hi;
    int32_t delta;
} uni_lower_exc[] = {
    {0x1C89, 0x1C89, 1},       {0xA7CB, 0xA7CB, -42343}, {0xA7CC, 0xA7CC, 1},
    {0xA7CE, 0xA7CE, 1},       {0xA7D2, 0xA7D2, 1},      {0xA7D4, 0xA7D4, 1},
    {0xA7DA, 0xA7DA, 1},       {0xA7DC, 0xA7DC, -42561}, {0x10D50, 0x10D65, 32},
    {0x16EA0, 0x16EB8, 27},
};

#define UNI_NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* The exception flags of cp (0 for almost everything): a binary search
 * over uni_exc, skipped outright outside its span. */
static unsigned uni_xflags(uint32_t cp)
{
    if (cp < 0x061D || cp > 0x1E95F) return 0;
    size_t lo = 0, hi = UNI_NELEM(uni_exc);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < uni_exc[mid].lo) hi = mid;
        else if (cp > uni_exc[mid].hi) lo = mid + 1;
        else return uni_exc[mid].flags;
    }
    return 0;
}

/* White_Space beyond ASCII, as Rust's char::is_whitespace: U+0085 and
 * the separators. */
int uni_is_ws_wide(uint32_t cp, int cat)
{
    return cp == 0x85 || cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP;
}

/* clean_text's "control" beyond ASCII: categories Cc, Cf, Co (Cs cannot
 * occur in valid UTF-8); unassigned code points are kept, as the
 * reference keeps them. */
int uni_is_control_wide(uint32_t cp, int cat)
{
    if (cat != UTF8PROC_CATEGORY_CC && cat != UTF8PROC_CATEGORY_CF &&
        cat != UTF8PROC_CATEGORY_CO && cat != UTF8PROC_CATEGORY_CS)
        return 0;
    return !(uni_xflags(cp) & UNI_X_NOT_OTHER);
}

/* Punctuation beyond ASCII: a Unicode P* category, as the reference's
 * tables have it. */
int uni_is_punct_wide(uint32_t cp, int cat)
{
    unsigned x = uni_xflags(cp);
    if (x & UNI_X_IS_PUNCT) return 1;
    if (cat < UTF8PROC_CATEGORY_PC || cat > UTF8PROC_CATEGORY_PO) return 0;
    return !(x & UNI_X_NOT_PUNCT);
}

/* strip_accents drops exactly the Mn characters. */
int uni_is_mn(uint32_t cp, int cat)
{
    unsigned x = uni_xflags(cp);
    if (x & UNI_X_IS_MN) return 1;
    return cat == UTF8PROC_CATEGORY_MN && !(x & UNI_X_NOT_MN);
}

/* The CJK ideograph blocks handle_chinese_chars isolates (the reference's
 * own list, not the Unicode Ideographic property). */
int uni_is_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Simple lowercase mapping (U+0130, the one character whose lowercase is
 * two, is handled by the caller). */
uint32_t uni_lower(uint32_t cp)
{
    if (cp >= 0x1C89 && cp <= 0x16EB8) {
        for (size_t i = 0; i < UNI_NELEM(uni_lower_exc); i++)
            if (cp >= uni_lower_exc[i].lo && cp <= uni_lower_exc[i].hi)
                return (uint32_t)((int32_t)cp + uni_lower_exc[i].delta);
    }
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

/* Category of a code point, via utf8proc's property table. */
int uni_category(uint32_t cp)
{
    return utf8proc_get_property((utf8proc_int32_t)cp)->category;
}

/* The canonical full decomposition of cp as the reference has it (it
 * lacks U+11938's mapping): cp itself when there is none. */
int uni_decompose(uint32_t cp, int32_t *out, int cap)
{
    utf8proc_ssize_t nd = 0;
    if (!(uni_xflags(cp) & UNI_X_NO_DECOMP)) {
        int bc = 0;
        nd = utf8proc_decompose_char((utf8proc_int32_t)cp, out, cap, UTF8PROC_DECOMPOSE, &bc);
    }
    if (nd <= 0 || nd > cap) {
        out[0] = (int32_t)cp;
        nd = 1;
    }
    return (int)nd;
}

/* ---- UTF-8 -------------------------------------------------------------- */

/* The whole of strict UTF-8 decoding (unicode.h's inline uni_utf8_decode
 * takes ASCII itself): no overlong forms, no surrogates, nothing past
 * U+10FFFF, no truncation. */
size_t uni_utf8_decode_wide(const unsigned char *p, size_t n, uint32_t *cp)
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
size_t uni_utf8_encode(uint32_t cp, char *out)
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
size_t uni_utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = uni_utf8_decode(p + i, n - i, &cp);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* unicode.h - the Unicode that Hugging Face's tokenizers apply, answered
 * as the reference (the Rust `tokenizers` library) answers: character
 * classes (whitespace, control, punctuation, nonspacing mark, CJK
 * ideograph), simple lowercasing, canonical decomposition, and strict
 * UTF-8. Every tokenizer implementation in text/ uses these, so each agrees
 * with the reference the same way.
 *
 * The reference classifies characters with older tables (categories as of
 * Unicode 8) and lowercases with newer ones (Unicode 16); libutf8proc 2.8
 * answers for Unicode 15. unicode.c holds the code points where they
 * disagree; tests/test_wordpiece.c checks every scalar value against the
 * reference's own answers (tests/data/wordpiece/unicode.tsv).
 *
 * A `cat` argument is the code point's utf8proc category
 * (UTF8PROC_CATEGORY_*, from uni_category); ASCII code points need none
 * (any value): the inline functions answer ASCII themselves, so the
 * per-character loop stays in the caller for plain text.
 *
 * Threads: any; nothing here has state. Every pointer is the caller's,
 * borrowed for the call. */
#ifndef KINFER_UNICODE_H
#define KINFER_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Canonical decompositions are at most 4 code points; room for more. */
#define UNI_DECOMP_MAX 32

/* utf8proc's category of cp (UTF8PROC_CATEGORY_*). */
int uni_category(uint32_t cp);

/* White_Space beyond ASCII, and punctuation (a P* category) beyond
 * ASCII: use uni_is_ws and uni_is_punct, which take ASCII inline. */
int uni_is_ws_wide(uint32_t cp, int cat);
int uni_is_punct_wide(uint32_t cp, int cat);

/* White_Space, as Rust's char::is_whitespace: the separators plus
 * U+0009..U+000D and U+0085. */
static inline int uni_is_ws(uint32_t cp, int cat)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
    return uni_is_ws_wide(cp, cat);
}

/* ASCII punctuation (which includes symbols like $ + < = > ^ ` | ~) or a
 * Unicode P* category. */
static inline int uni_is_punct(uint32_t cp, int cat)
{
    if (cp < 0x80)
        return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
               (cp >= 123 && cp <= 126);
    return uni_is_punct_wide(cp, cat);
}

/* Controls beyond ASCII: use uni_is_control, which takes ASCII inline. */
int uni_is_control_wide(uint32_t cp, int cat);

/* clean_text's "control": categories Cc, Cf, Co; tab, newline and
 * carriage return are whitespace, not controls. */
static inline int uni_is_control(uint32_t cp, int cat)
{
    if (cp < 0x80) return cp == 0x7F || (cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r');
    return uni_is_control_wide(cp, cat);
}
/* A nonspacing mark (Mn): what strip_accents drops. */
int uni_is_mn(uint32_t cp, int cat);
/* The CJK ideograph blocks handle_chinese_chars isolates (the reference's
 * own list, not the Unicode Ideographic property). */
int uni_is_cjk(uint32_t cp);
/* Simple lowercase mapping, as Rust's char::to_lowercase gives for every
 * code point but U+0130 (whose lowercase is two: the caller's case). */
uint32_t uni_lower(uint32_t cp);
/* The canonical full decomposition of cp, as the reference has it, into
 * out (cap entries, UNI_DECOMP_MAX is enough); cp itself when it has none.
 * Returns the number of code points written (at least 1). */
int uni_decompose(uint32_t cp, int32_t *out, int cap);

/* Decodes a UTF-8 sequence of 2-4 bytes at p (n bytes available): use
 * uni_utf8_decode, which takes ASCII inline. */
size_t uni_utf8_decode_wide(const unsigned char *p, size_t n, uint32_t *cp);

/* Decodes one strict UTF-8 sequence at p (n >= 1 bytes available): no
 * overlong forms, no surrogates, nothing past U+10FFFF, no truncation.
 * Returns its length (1-4) with *cp set, or 0 if the bytes are not valid
 * UTF-8. */
static inline size_t uni_utf8_decode(const unsigned char *p, size_t n, uint32_t *cp)
{
    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    }
    return uni_utf8_decode_wide(p, n, cp);
}

/* Encodes a scalar value into out (4 bytes of room); returns the length. */
size_t uni_utf8_encode(uint32_t cp, char *out);
/* The offset of the first byte of s (n bytes) that is not valid UTF-8, or
 * n if all is. */
size_t uni_utf8_check(const char *s, size_t n);

#endif

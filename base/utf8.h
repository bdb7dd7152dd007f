/* utf8.h - every string kinfer writes (results, dead-letter headers, log
 * lines) must be valid UTF-8, whatever bytes a record brought in: a client
 * whose MessagePack library checks str types could not read a result
 * that copied a stray 0xc3 from a job, error code and all. These helpers
 * check text and repair it by replacing each ill-formed sequence with
 * U+FFFD (EF BF BD), one replacement per maximal ill-formed subpart, as
 * the Unicode Standard (chapter 3, "U+FFFD Substitution of Maximal
 * Subparts") recommends and most decoders do.
 *
 * Threads: any; no state. Ownership: every input is borrowed; output goes
 * to the caller's buffer. */
#ifndef KINFER_UTF8_H
#define KINFER_UTF8_H

#include <stddef.h>

/* Length of the well-formed UTF-8 character at s (n bytes available):
 * 1..4, or 0 when s starts an ill-formed sequence (then *skip, when not
 * NULL, receives how many bytes that sequence spans: 1..3). n must be > 0. */
size_t utf8_char_len(const unsigned char *s, size_t n, size_t *skip);

/* 1 if the n bytes at s are well-formed UTF-8 (NUL bytes included as
 * characters), else 0. */
int utf8_valid(const void *s, size_t n);

/* Copies the n bytes at src into dst (cap >= 1 bytes) as well-formed UTF-8
 * and NUL-terminates it: each ill-formed sequence becomes U+FFFD. Stops
 * before a character that would not fit, never splitting one. Returns the
 * bytes written, without the NUL. */
size_t utf8_repair(char *dst, size_t cap, const void *src, size_t n);

/* Repairs the NUL-terminated string in buf (cap bytes) in place, the same
 * way; a string that is already well-formed is left alone (the common
 * case costs one pass). */
void utf8_repair_str(char *buf, size_t cap);

#endif

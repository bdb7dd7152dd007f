/* test_utf8.c - base/utf8: which byte sequences are well-formed (the
 * Unicode Standard's table 3-7, boundaries on both sides of each row),
 * how ill-formed ones are repaired (one U+FFFD per maximal subpart, the
 * rest kept), that repair never splits a character at the buffer's end,
 * and that whatever random bytes go in, what comes out is well-formed by
 * an independent check (jansson's strict decoder, which json_stringn
 * applies; glibc's mbrtowc still takes the old five-byte forms). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "tablebody.h"
#include "testutil.h"

/* Bytes to hex text, for messages. */
static const char *hex(const void *p, size_t n)
{
    static char buf[512];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < sizeof(buf); i++)
        k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%s%02x", i ? " " : "",
                              ((const unsigned char *)p)[i]);
    buf[k] = '\0';
    return buf;
}

/* Each row: input bytes, whether they are well-formed, what repair makes
 * of them ("EF BF BD" is U+FFFD). */
static void test_table(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int valid;
        const char *out;
    } cases[] = {
        {"", 1, ""},
        {"41 7f", 1, "41 7f"},
        {"00", 1, "00"},
        {"c2 80", 1, "c2 80"},             /* U+0080, the first two-byte */
        {"df bf", 1, "df bf"},
        {"c0 80", 0, "ef bf bd ef bf bd"}, /* overlong NUL: two maximal subparts */
        {"c1 bf", 0, "ef bf bd ef bf bd"},
        {"c3 28", 0, "ef bf bd 28"},       /* the model name */
        {"c3", 0, "ef bf bd"},             /* cut short */
        {"e0 a0 80", 1, "e0 a0 80"},       /* U+0800 */
        {"e0 9f bf", 0, "ef bf bd ef bf bd ef bf bd"}, /* overlong */
        {"ed 9f bf", 1, "ed 9f bf"},       /* U+D7FF */
        {"ed a0 80", 0, "ef bf bd ef bf bd ef bf bd"}, /* a surrogate */
        {"ef bf bf", 1, "ef bf bf"},
        {"e2 82", 0, "ef bf bd"},          /* a truncated three-byte: one subpart */
        {"e2 82 41", 0, "ef bf bd 41"},
        {"f0 90 80 80", 1, "f0 90 80 80"}, /* U+10000 */
        {"f0 8f bf bf", 0, "ef bf bd ef bf bd ef bf bd ef bf bd"},
        {"f4 8f bf bf", 1, "f4 8f bf bf"}, /* U+10FFFF */
        {"f4 90 80 80", 0, "ef bf bd ef bf bd ef bf bd ef bf bd"},
        {"f5 80", 0, "ef bf bd ef bf bd"},
        {"ff fe", 0, "ef bf bd ef bf bd"},
        {"80", 0, "ef bf bd"},             /* a lone continuation byte */
        {"f0 9f 98", 0, "ef bf bd"},       /* an emoji cut before its last byte */
        {"1b 5b 33 31 6d", 1, "1b 5b 33 31 6d"}, /* ESC is well-formed: escaping is the logger's */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned char in[32], want[64];
        size_t n = unhex(cases[i].in, in, sizeof(in));
        size_t wn = unhex(cases[i].out, want, sizeof(want));
        if (utf8_valid(in, n) != cases[i].valid)
            fail_msg("case %zu (%s): utf8_valid %d", i, cases[i].in, !cases[i].valid);
        char out[64];
        size_t got = utf8_repair(out, sizeof(out), in, n);
        if (got != wn || memcmp(out, want, wn) != 0)
            fail_msg("case %zu (%s): repaired to %s", i, cases[i].in, hex(out, got));
        assert_int_equal(out[got], '\0');
    }
}

/* A full buffer stops before a character, never inside one. */
static void test_repair_never_splits(void **state)
{
    (void)state;
    const char *s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xc3(";
    size_t n = strlen(s);
    for (size_t cap = 1; cap < 24; cap++) {
        char out[32];
        size_t got = utf8_repair(out, cap, s, n);
        assert_true(got < cap);
        assert_int_equal(out[got], '\0');
        assert_true(utf8_valid(out, got));
    }
    char buf[8] = "ab\xc3(";
    utf8_repair_str(buf, sizeof(buf));
    assert_string_equal(buf, "ab\xef\xbf\xbd(");
    char ok[16] = "d\xc3\xa9j\xc3\xa0";
    utf8_repair_str(ok, sizeof(ok));
    assert_string_equal(ok, "d\xc3\xa9j\xc3\xa0");
}

/* 1 if jansson takes the n bytes at s as a string (its check is strict
 * UTF-8: no overlongs, surrogates or values above U+10FFFF). */
static int jansson_valid(const void *s, size_t n)
{
    json_t *v = json_stringn((const char *)s, n);
    json_decref(v);
    return v != NULL;
}

/* Random bytes: utf8_valid agrees with jansson on the input, and repair's
 * output is always well-formed by it. */
static void test_random_against_jansson(void **state)
{
    (void)state;
    for (int round = 0; round < 20000; round++) {
        unsigned char in[24];
        size_t n = 1 + tu_rand64() % sizeof(in);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = tu_rand64();
            /* Mostly bytes that start or continue sequences. */
            in[i] = (unsigned char)(r % 4 == 0 ? r >> 8 : 0x80 + (r >> 8) % 0x78);
            if (in[i] == 0) in[i] = 'x';
        }
        int ref = jansson_valid(in, n);
        if (utf8_valid(in, n) != ref)
            fail_msg("%s: utf8_valid %d, jansson %d", hex(in, n), !ref, ref);
        char out[80];
        size_t got = utf8_repair(out, sizeof(out), in, n);
        if (!jansson_valid(out, got))
            fail_msg("%s repaired to ill-formed %s", hex(in, n), hex(out, got));
        if (ref && (got != n || memcmp(out, in, n) != 0))
            fail_msg("%s is well-formed but was changed to %s", hex(in, n), hex(out, got));
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_repair_never_splits),
        cmocka_unit_test(test_random_against_jansson),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

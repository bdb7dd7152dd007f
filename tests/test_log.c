/* test_log.c - base/log: a value can never forge a line. Hostile
 * values (quotes that would end a quoted value, ` event=pwn`, backslashes,
 * raw ESC and other control bytes, ill-formed UTF-8) in quoted and bare
 * positions come out as values: the text line parses back into exactly
 * the fields the format wrote, the JSON line is one object with one
 * "event" and no duplicate key, neither holds a control byte or
 * ill-formed UTF-8, and the values read back as the input with its
 * ill-formed sequences replaced. Numbers format as printf formats them.
 * Warnings are rate-limited per event, and the next line after a
 * suppression counts what was dropped.
 *
 * stderr is redirected to a file for each case and read back. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/utf8.h"
#include "../base/log.h"
#include "testutil.h"

static char cap_path[64];
static int saved_fd = -1;

/* Sends stderr to a fresh file until captured() reads it back. */
static void capture(void)
{
    fflush(stderr);
    snprintf(cap_path, sizeof(cap_path), "/tmp/kinfer-test-log-XXXXXX");
    int fd = mkstemp(cap_path);
    assert_true(fd >= 0);
    saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* Restores stderr; returns what was written meanwhile (malloc'd). */
static char *captured(void)
{
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    FILE *f = fopen(cap_path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    unlink(cap_path);
    buf[n] = '\0';
    return strdup(buf);
}

/* Lines in text starting with... anything: counts '\n'. */
static size_t count_lines(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char *line = strndup(l, len);
        if (strstr(line, needle)) n++;
        free(line);
        l = e ? e + 1 : NULL;
    }
    return n;
}

/* One key=value field of a text line, value unescaped. */
struct field {
    char key[32];
    char val[1024];
};

/* Parses a text line as key=value fields (a value bare, or quoted with
 * JSON escapes); returns the field count or -1 when the line does not
 * parse. \uXXXX escapes below 0x80 are decoded to their byte. */
static int parse_text(const char *line, struct field *f, int max)
{
    int n = 0;
    const char *p = line;
    while (*p && *p != '\n') {
        if (n == max) return -1;
        size_t k = 0;
        while (*p && *p != '=' && *p != ' ' && *p != '\n' && k + 1 < sizeof(f[n].key))
            f[n].key[k++] = *p++;
        f[n].key[k] = '\0';
        if (*p != '=' || k == 0) return -1;
        p++;
        size_t v = 0;
        if (*p == '"') {
            p++;
            while (*p && *p != '"') {
                char c = *p++;
                if (c == '\\') {
                    char e = *p++;
                    if (e == 'n') c = '\n';
                    else if (e == 't') c = '\t';
                    else if (e == 'r') c = '\r';
                    else if (e == 'u') {
                        unsigned x;
                        if (sscanf(p, "%4x", &x) != 1) return -1;
                        p += 4;
                        c = (char)x;
                    } else c = e;
                }
                if (v + 1 < sizeof(f[n].val)) f[n].val[v++] = c;
            }
            if (*p != '"') return -1;
            p++;
        } else {
            while (*p && *p != ' ' && *p != '\n') {
                if (*p == '"' || *p == '\\') return -1;
                if (v + 1 < sizeof(f[n].val)) f[n].val[v++] = *p;
                p++;
            }
        }
        f[n].val[v] = '\0';
        n++;
        if (*p == ' ') p++;
        else if (*p && *p != '\n') return -1;
    }
    return n;
}

/* No control byte but the final newline, and well-formed UTF-8. */
static void assert_clean_line(const char *line)
{
    size_t n = strlen(line);
    assert_true(n > 0 && line[n - 1] == '\n');
    for (size_t i = 0; i + 1 < n; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
            fail_msg("control byte 0x%02x at %zu in: %s", (unsigned char)line[i], i, line);
    assert_true(utf8_valid(line, n));
}

static const char *const hostile[] = {
    "x\" event=pwn level=error",
    "a\\\" b=c",
    "esc\x1b[31mred\x1b[0m bell\x07 nl\nend del\x7f",
    "bad \xc3( utf8 \xff",
    "",
    "plain",
    "k=v",
    "caf\xc3\xa9 \xf0\x9f\x98\x80",
};

/* What a hostile value reads back as: itself, ill-formed UTF-8 repaired. */
static void expected(const char *in, char *out, size_t cap)
{
    utf8_repair(out, cap, in, strlen(in));
}

static void test_text_values_stay_values(void **state)
{
    (void)state;
    log_fmt = LOG_TEXT;
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        capture();
        LOG_I("probe", "id=%s error=\"%s\" n=%d", hostile[i], hostile[i], 7);
        char *out = captured();
        assert_clean_line(out);
        struct field f[16];
        int n = parse_text(out, f, 16);
        if (n != 6) fail_msg("value %zu: %d fields in: %s", i, n, out);
        static const char *const keys[] = {"ts", "level", "event", "id", "error", "n"};
        for (int k = 0; k < 6; k++) assert_string_equal(f[k].key, keys[k]);
        assert_string_equal(f[2].val, "probe");
        char want[256];
        expected(hostile[i], want, sizeof(want));
        assert_string_equal(f[3].val, want);
        assert_string_equal(f[4].val, want);
        assert_string_equal(f[5].val, "7");
        free(out);
    }
}

static void test_json_lines_are_json(void **state)
{
    (void)state;
    log_fmt = LOG_JSON;
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        capture();
        LOG_I("probe", "id=%s error=\"%s\" n=%zu", hostile[i], hostile[i], (size_t)7);
        char *out = captured();
        assert_clean_line(out);
        json_error_t je;
        json_t *doc = json_loads(out, JSON_REJECT_DUPLICATES, &je);
        if (!doc) fail_msg("value %zu: not JSON (%s): %s", i, je.text, out);
        assert_int_equal(json_object_size(doc), 6);
        assert_string_equal(json_string_value(json_object_get(doc, "event")), "probe");
        char want[256];
        expected(hostile[i], want, sizeof(want));
        assert_string_equal(json_string_value(json_object_get(doc, "id")), want);
        assert_string_equal(json_string_value(json_object_get(doc, "error")), want);
        assert_string_equal(json_string_value(json_object_get(doc, "n")), "7");
        json_decref(doc);
        free(out);
    }
    log_fmt = LOG_TEXT;
}

/* Numbers and the printf details the log calls use. */
static void test_conversions(void **state)
{
    (void)state;
    log_fmt = LOG_TEXT;
    capture();
    LOG_I("nums", "a=%d b=%zu c=%" PRId64 " d=%" PRIu64 " e=%.1f f=%5.2f h=%.3s i=%x j=%ld%%",
          -3, (size_t)42, (int64_t)-9000000000LL, (uint64_t)18000000000ULL, 2.25, 3.14159,
          "abcdef", 255u, 77L);
    char *out = captured();
    assert_non_null(strstr(out, " a=-3 b=42 c=-9000000000 d=18000000000 e=2.2 f= 3.14 "
                                "h=abc i=ff j=77%\n"));
    free(out);
}

/* 100 warnings of one event in a burst: at most the burst gets out; an
 * error of another event is not held back by them; a second later the
 * next line of the first event says how many were dropped. */
static void test_rate_limit(void **state)
{
    (void)state;
    log_fmt = LOG_TEXT;
    capture();
    for (int i = 0; i < 100; i++) LOG_W("flood", "i=%d", i);
    LOG_E("other", "x=1");
    for (int i = 0; i < 5; i++) LOG_I("info_event", "i=%d", i); /* info is never limited */
    char *out = captured();
    size_t flood = count_lines(out, "event=flood");
    if (flood > 11) fail_msg("%zu of 100 flood lines written", flood);
    assert_true(flood >= 10);
    assert_int_equal(count_lines(out, "event=other"), 1);
    assert_int_equal(count_lines(out, "event=info_event"), 5);
    free(out);
    usleep(1100 * 1000);
    capture();
    LOG_W("flood", "i=%d", 100);
    out = captured();
    unsigned long dropped = 0;
    const char *s = strstr(out, "suppressed=");
    assert_non_null(s);
    dropped = strtoul(s + strlen("suppressed="), NULL, 10);
    assert_int_equal(dropped, 100 - flood);
    free(out);
}

/* A burst that stops: its count still gets out, on a line of its own,
 * at the next line of another event once its window reopened, or at a
 * flush, per event; a flush with nothing dropped writes nothing. */
static void test_suppressed_after_burst(void **state)
{
    (void)state;
    log_fmt = LOG_TEXT;
    capture();
    for (int i = 0; i < 200; i++) LOG_W("burst_a", "i=%d", i);
    for (int i = 0; i < 30; i++) LOG_E("burst_b", "i=%d", i);
    char *out = captured();
    size_t a = count_lines(out, "event=burst_a"), b = count_lines(out, "event=burst_b");
    assert_true(a >= 10 && a <= 11);
    assert_true(b >= 10 && b <= 11);
    free(out);
    usleep(1100 * 1000);
    capture();
    LOG_I("something_else", "x=1");
    out = captured();
    char want[64];
    snprintf(want, sizeof(want), "level=warn event=burst_a suppressed=%zu", 200 - a);
    if (!strstr(out, want)) fail_msg("no \"%s\" in:\n%s", want, out);
    snprintf(want, sizeof(want), "level=error event=burst_b suppressed=%zu", 30 - b);
    if (!strstr(out, want)) fail_msg("no \"%s\" in:\n%s", want, out);
    free(out);
    /* said once: the next flush has nothing to say */
    capture();
    log_flush_suppressed(1);
    out = captured();
    assert_null(strstr(out, "suppressed="));
    free(out);
    /* a burst still going is counted at a final flush */
    capture();
    for (int i = 0; i < 50; i++) LOG_W("burst_c", "i=%d", i);
    log_flush_suppressed(0); /* its window is still shut */
    log_flush_suppressed(1);
    out = captured();
    size_t c = count_lines(out, "event=burst_c");
    snprintf(want, sizeof(want), "event=burst_c suppressed=%zu", 50 - (c - 1));
    if (!strstr(out, want)) fail_msg("no \"%s\" in:\n%s", want, out);
    free(out);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_values_stay_values),
        cmocka_unit_test(test_json_lines_are_json),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_rate_limit),
        cmocka_unit_test(test_suppressed_after_burst),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_jinja.c - the chat-template interpreter (text/jinja_*.c):
 *   - every golden of tests/data/jinja/golden.json (written by
 *     tests/golden/jinja_golden.js with the npm `@huggingface/jinja`):
 *     ChatML-, Llama 3-, Mistral- and Qwen 3-style templates over several
 *     conversations, with and without the generation prompt, and one small
 *     template per feature; the output must be byte for byte the
 *     reference's, and where the reference raised, the same message;
 *   - templates refused at parse time, with line and column;
 *   - render errors (types, undefined calls) with their position;
 *   - the limits: output, steps, memory, macro depth, range();
 *   - Python's answers where Python's Jinja and the reference differ;
 *   - one parsed template rendered by several threads at once gives each
 *     the golden text;
 *   - random corruptions of the golden templates: parse or render may
 *     fail, but never crash, and any output is valid UTF-8.
 * Run from the repository root. */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "../base/utf8.h"
#include "../text/jinja.h"
#include "testutil.h"

#define GOLDEN "tests/data/jinja/golden.json"

static json_t *golden;

/* Renders src over the JSON object ctx_json (NULL: none) under lim. */
static int render(const char *src, const char *ctx_json, const struct jinja_limits *lim,
                  char **out, char *err, size_t errsz)
{
    struct jinja_tmpl *t = jinja_parse(src, strlen(src), err, errsz);
    if (!t) return 1;
    json_t *ctx = NULL;
    if (ctx_json) {
        json_error_t jerr;
        ctx = json_loads(ctx_json, 0, &jerr);
        assert_non_null(ctx);
    }
    size_t n;
    int rc = jinja_render(t, ctx, lim, out, &n, err, errsz);
    if (rc == 0) {
        assert_int_equal(strlen(*out), n);
        assert_true(utf8_valid(*out, n));
    }
    json_decref(ctx);
    jinja_destroy(t);
    return rc;
}

static void test_goldens(void **state)
{
    (void)state;
    const json_t *cases = json_object_get(golden, "cases");
    printf("  reference: %s, %zu cases\n", json_string_value(json_object_get(golden, "reference")),
           json_array_size(cases));
    assert_true(json_array_size(cases) >= 90);
    size_t i, bad = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *tj = json_object_get(c, "template");
        char err[512];
        struct jinja_tmpl *t = jinja_parse(json_string_value(tj), json_string_length(tj), err,
                                           sizeof err);
        if (!t) {
            printf("  %s: parse failed: %s\n", name, err);
            bad++;
            continue;
        }
        char *out = NULL;
        size_t n = 0;
        int rc = jinja_render(t, json_object_get(c, "context"), NULL, &out, &n, err, sizeof err);
        const json_t *want = json_object_get(c, "output");
        if (want) {
            if (rc != 0) {
                printf("  %s: render failed (%d): %s\n", name, rc, err);
                bad++;
            } else if (n != json_string_length(want) ||
                       memcmp(out, json_string_value(want), n) != 0) {
                printf("  %s: output differs\n    got:  ", name);
                for (size_t k = 0; k < n; k++) putchar(out[k] == '\n' ? '|' : out[k]);
                printf("\n    want: %s\n", json_string_value(want));
                bad++;
            }
        } else {
            const char *werr = json_string_value(json_object_get(c, "error"));
            if (rc != JINJA_ERR_RAISED || strcmp(err, werr) != 0) {
                printf("  %s: want raised '%s', got %d '%s'\n", name, werr, rc, rc ? err : "");
                bad++;
            }
        }
        free(out);
        jinja_destroy(t);
    }
    assert_int_equal(bad, 0);
}

/* ---- parse errors ---------------------------------------------------------------- */

static void test_parse_errors(void **state)
{
    (void)state;
    static const struct { const char *src, *want; } cases[] = {
        { "{{ x | nope }}", "line 1 col 8: unknown filter 'nope'" },
        { "a\n{{ x is frobbed }}", "line 2 col 9: unknown test 'frobbed'" },
        { "{{ x.frob() }}", "line 1 col 6: unknown method 'frob'" },
        { "{% for m in messages %}x", "missing {% endfor %}" },
        { "{% if a %}x{% else %}y", "missing {% endif %}" },
        { "{% endif %}", "line 1 col 4: unknown or misplaced tag 'endif'" },
        { "{% include 'x' %}", "unknown or misplaced tag 'include'" },
        { "{{ 'abc }}", "line 1 col 4: unterminated string" },
        { "{{ 'a\\q' }}", "unknown escape" },
        { "{{ a + }}", "expected an expression" },
        { "{{ a b }}", "expected '}}'" },
        { "{% set %}", "expected a name" },
        { "{% break %}", "'break' outside a loop" },
        { "{# never closed", "unterminated comment" },
        { "{{ x", "missing }}" },
        { "{{ 99999999999999999999 }}", "integer too large" },
        { "{% for x in y recursive %}{% endfor %}", "recursive loops are not supported" },
        { "ok \xff bad", "not valid UTF-8" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char err[256] = "";
        struct jinja_tmpl *t = jinja_parse(cases[k].src, strlen(cases[k].src), err, sizeof err);
        if (t || !strstr(err, cases[k].want))
            fail_msg("%s: want '%s', got '%s'", cases[k].src, cases[k].want, t ? "(parsed)" : err);
    }
    /* Nesting past the parser's bound is an error, not a stack overflow. */
    char deep[4096] = "{{ ";
    for (int k = 0; k < 1000; k++) strcat(deep, "(");
    strcat(deep, "1");
    for (int k = 0; k < 1000; k++) strcat(deep, ")");
    strcat(deep, " }}");
    char err[256];
    assert_null(jinja_parse(deep, strlen(deep), err, sizeof err));
    assert_non_null(strstr(err, "nested too deeply"));
    /* So is a chain of elifs past it. */
    char chain[8192] = "{% if a %}";
    for (int k = 0; k < 300; k++) strcat(chain, "{% elif b %}");
    strcat(chain, "{% endif %}");
    assert_null(jinja_parse(chain, strlen(chain), err, sizeof err));
    assert_non_null(strstr(err, "nested too deeply"));
}

/* ---- render errors ------------------------------------------------------------------ */

static void test_render_errors(void **state)
{
    (void)state;
    static const struct { const char *src; int rc; const char *want; } cases[] = {
        { "{{ raise_exception('no system role') }}", JINJA_ERR_RAISED, "no system role" },
        { "\n  {{ 1 - 'a' }}", JINJA_ERR_RENDER,
          "cannot apply '-' to integer and string (line 2 col 8)" },
        { "{{ missing ~ 'x' }}", JINJA_ERR_RENDER, "cannot concatenate undefined" },
        { "{% for c in 5 %}{% endfor %}", JINJA_ERR_RENDER, "cannot loop over integer" },
        { "{% set s = 'x' %}{% set s.y = 1 %}", JINJA_ERR_RENDER, "only of a namespace" },
        { "{{ nothing() }}", JINJA_ERR_RENDER, "undefined is not callable" },
        { "{{ 1 // 0 }}", JINJA_ERR_RENDER, "division by zero" },
        { "{{ 9223372036854775807 + 1 }}", JINJA_ERR_RENDER, "integer overflow" },
        { "{{ 5 | upper }}", JINJA_ERR_RENDER, "filter 'upper' does not apply to integer" },
        { "{{ [1].strip() }}", JINJA_ERR_RENDER, "list has no method 'strip'" },
        { "{{ 'a' < 1 }}", JINJA_ERR_RENDER, "cannot compare string with integer" },
        { "{{ 'abc'[1:2:0] }}", JINJA_ERR_RENDER, "slice step cannot be zero" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char err[256] = "", *out = NULL;
        int rc = render(cases[k].src, NULL, NULL, &out, err, sizeof err);
        if (rc != cases[k].rc || !strstr(err, cases[k].want))
            fail_msg("%s: want %d '%s', got %d '%s'", cases[k].src, cases[k].rc, cases[k].want, rc,
                     err);
        assert_null(out);
    }
    /* A context that is not an object is the caller's error. */
    struct jinja_tmpl *t = jinja_parse("x", 1, NULL, 0);
    json_t *arr = json_array();
    char *out;
    assert_int_equal(jinja_render(t, arr, NULL, &out, NULL, NULL, 0), JINJA_ERR_ARG);
    json_decref(arr);
    /* A string from the caller that is not UTF-8 is refused, not copied out. */
    json_t *ctx = json_object();
    json_object_set_new(ctx, "x", json_stringn_nocheck("\xc3", 1));
    struct jinja_tmpl *t2 = jinja_parse("{{ x }}", 7, NULL, 0);
    char err[128];
    assert_int_equal(jinja_render(t2, ctx, NULL, &out, NULL, err, sizeof err), JINJA_ERR_RENDER);
    assert_non_null(strstr(err, "not UTF-8"));
    json_decref(ctx);
    jinja_destroy(t2);
    jinja_destroy(t);
}

/* ---- limits ------------------------------------------------------------------------ */

static void test_limits(void **state)
{
    (void)state;
    struct jinja_limits lim;
    char err[256], *out = NULL;

    jinja_limits_init(&lim);
    lim.max_output = 1000;
    assert_int_equal(render("{% for i in range(99) %}0123456789{% endfor %}", NULL, &lim, &out,
                            err, sizeof err), 0);
    free(out);
    assert_int_equal(render("{% for i in range(101) %}0123456789{% endfor %}", NULL, &lim, &out,
                            err, sizeof err), JINJA_ERR_LIMIT);
    assert_non_null(strstr(err, "output is over 1000 bytes"));

    jinja_limits_init(&lim);
    lim.max_steps = 100000;
    assert_int_equal(render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}"
                            "{% endfor %}", NULL, &lim, &out, err, sizeof err), JINJA_ERR_LIMIT);
    assert_non_null(strstr(err, "more than 100000 steps"));
    assert_int_equal(render("{{ range(1000000000000) | length }}", NULL, &lim, &out, err,
                            sizeof err), JINJA_ERR_LIMIT);

    jinja_limits_init(&lim);
    lim.max_memory = 4 << 20;
    assert_int_equal(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
                            NULL, &lim, &out, err, sizeof err), JINJA_ERR_LIMIT);
    assert_non_null(strstr(err, "bytes of memory"));

    jinja_limits_init(&lim);
    assert_int_equal(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim,
                            &out, err, sizeof err), JINJA_ERR_LIMIT);
    assert_non_null(strstr(err, "nested deeper than 32"));
    /* Nor can a list nested a million deep make == recurse that deep. */
    assert_int_equal(render("{% set ns = namespace(l=[], m=[]) %}{% for i in range(100000) %}"
                            "{% set ns.l = [ns.l] %}{% set ns.m = [ns.m] %}{% endfor %}"
                            "{{ ns.l == ns.m }} {{ ns.l == ns.l }}", NULL, &lim, &out, err,
                            sizeof err), 0);
    assert_string_equal(out, "false true");
    free(out);
    /* A namespace that holds itself cannot make tojson loop forever. */
    assert_int_equal(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}", NULL,
                            &lim, &out, err, sizeof err), JINJA_ERR_RENDER);
    assert_non_null(strstr(err, "nested too deeply"));
}

/* ---- Python's answers, and other checks the goldens do not cover --------------------- */

static void test_python_semantics(void **state)
{
    (void)state;
    static const struct { const char *src, *want; } cases[] = {
        { "{{ 'xxhixx'.lstrip('x') }}|{{ 'xxhixx'.rstrip('x') }}|{{ '\\n\\nhi \\n'.strip('\\n') }}",
          "hixx|xxhi|hi " },
        { "{{ -7 % 3 }} {{ 7 % -3 }} {{ -7 // 2 }} {{ -7.5 % 2 }}", "2 -2 -4 0.5" },
        { "{{ 2.5 is float }} {{ 2 is float }}", "true false" },
        { "{{ 'hELLO wORLD' | capitalize }} {{ 'hello big world' | title }}",
          "Hello world Hello Big World" },
        { "{{ 'été'[0] }}{{ 'été'[-1] }}{{ 'été' | length }}{{ 'aé😀b'[1:3] }}",
          "éé3é😀" },
        { "{{ 'a b c'.split(none, 1) | tojson }}", "[\"a\", \"b c\"]" },
        { "{{ 'abc'.replace('', '-') }}", "-a-b-c-" },
        { "{{ [3, 1] | tojson(separators=(',', ':')) }}", "[3,1]" },
        { "{{ {'b': 1, 'a': [2]} | tojson(sort_keys=true) }}", "{\"a\": [2], \"b\": 1}" },
        { "{{ 'é😀' | tojson(ensure_ascii=true) }}", "\"\\u00e9\\ud83d\\ude00\"" },
        { "{{ 10.0 ** 300 * 10.0 ** 10 }} {{ 0.000001 }} {{ 1.5 / 10000000 }} {{ 10.0 ** 21 }}",
          "Infinity 0.000001 1.5e-7 1e+21" },
        { "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", "37" },
        { "{{ 'x' if none else 'y' }}{% generation %}g{% endgeneration %}", "yg" },
        { "{% if x is not defined %}u{% endif %}{{ x | default('d') }}{{ loop }}", "ud" },
        { "{{ \"a\" 'b' }}{{ '\\u00e9\\x41' }}", "abéA" },
        { "{{ ['a', 'code', 'b'] | reject('equalto', 'code') | join(', ') }} "
          "{{ [0, 1, 2, 3] | select('odd') | list | length }} {{ [0, '', 'x'] | select | length }}",
          "a, b 2 1" },
        { "{% for k, v in {'b': 2, 'A': 1, 'c': 0} | dictsort(by='value', reverse=true) %}"
          "{{ k }}{% endfor %}", "bAc" },
        { "{{ (-1) ** 7 }} {{ (-1) ** 8 }} {{ 0 ** 0 }} {{ 1 ** 999999999999 }} {{ (-3) ** 3 }}",
          "-1 1 1 1 -27" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char err[256] = "", *out = NULL;
        int rc = render(cases[k].src, "{}", NULL, &out, err, sizeof err);
        if (rc != 0 || strcmp(out, cases[k].want) != 0)
            fail_msg("%s: want '%s', got %d '%s' %s", cases[k].src, cases[k].want, rc,
                     out ? out : "", err);
        free(out);
    }
}

/* ---- threads ------------------------------------------------------------------------- */

#define NTHREADS 4

static struct jinja_tmpl **shared_tmpls;

static void *render_all(void *arg)
{
    size_t *bad = arg;
    const json_t *cases = json_object_get(golden, "cases");
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const json_t *c = json_array_get(cases, i);
            const json_t *want = json_object_get(c, "output");
            char *out = NULL, err[256];
            size_t n;
            int rc = jinja_render(shared_tmpls[i], json_object_get(c, "context"), NULL, &out, &n,
                                  err, sizeof err);
            if (want ? (rc != 0 || n != json_string_length(want) ||
                        memcmp(out, json_string_value(want), n) != 0)
                     : rc != JINJA_ERR_RAISED)
                (*bad)++;
            free(out);
        }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    const json_t *cases = json_object_get(golden, "cases");
    size_t n = json_array_size(cases);
    shared_tmpls = calloc(n, sizeof *shared_tmpls);
    for (size_t i = 0; i < n; i++) {
        const json_t *tj = json_object_get(json_array_get(cases, i), "template");
        shared_tmpls[i] = jinja_parse(json_string_value(tj), json_string_length(tj), NULL, 0);
        assert_non_null(shared_tmpls[i]);
    }
    pthread_t th[NTHREADS];
    size_t bad[NTHREADS] = { 0 };
    for (int k = 0; k < NTHREADS; k++)
        assert_int_equal(pthread_create(&th[k], NULL, render_all, &bad[k]), 0);
    for (int k = 0; k < NTHREADS; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(bad[k], 0);
    }
    for (size_t i = 0; i < n; i++) jinja_destroy(shared_tmpls[i]);
    free(shared_tmpls);
}

/* ---- robustness ---------------------------------------------------------------------- */

/* The template keeps nothing of its source: the caller's buffer is
 * overwritten and freed before the render, which must not notice. */
static void test_source_not_kept(void **state)
{
    (void)state;
    const char *text = "{% for m in messages %}{{ '<' + m['role'] + '>' + m.content }}"
                       "{% endfor %}{% if add_generation_prompt %}[gen]{% endif %}";
    size_t n = strlen(text);
    char *src = malloc(n), err[256];
    assert_non_null(src);
    memcpy(src, text, n);
    struct jinja_tmpl *t = jinja_parse(src, n, err, sizeof(err));
    assert_non_null(t);
    memset(src, 'x', n);
    free(src);
    json_t *ctx = json_pack("{s:[{s:s, s:s}], s:b}", "messages", "role", "user", "content",
                            "hi", "add_generation_prompt", 1);
    char *out = NULL;
    size_t len = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(jinja_render(t, ctx, NULL, &out, &len, err, sizeof(err)), 0);
        assert_string_equal(out, "<user>hi[gen]");
        free(out);
    }
    json_decref(ctx);
    jinja_destroy(t);
}

static void test_corrupted_templates(void **state)
{
    (void)state;
    const json_t *cases = json_object_get(golden, "cases");
    static const char pieces[][6] = { "{{", "}}", "{%", "%}", "{#", "#}", "-", "'", "(", ")",
                                      "[", "]", "|", ".", ",", "é", "\n", " ", "x", "if",
                                      "endfor", "not", "~", "=", ":" };
    struct jinja_limits lim;
    jinja_limits_init(&lim);
    lim.max_steps = 200000;
    lim.max_output = 1 << 20;
    lim.max_memory = 16 << 20;
    size_t parsed = 0, rendered = 0;
    for (int iter = 0; iter < 3000; iter++) {
        const json_t *c = json_array_get(cases, tu_rand64() % json_array_size(cases));
        const json_t *tj = json_object_get(c, "template");
        size_t n = json_string_length(tj);
        char *buf = malloc(n + 64);
        memcpy(buf, json_string_value(tj), n);
        int edits = 1 + (int)(tu_rand64() % 3);
        for (int e = 0; e < edits && n; e++) {
            size_t at = tu_rand64() % n;
            const char *p = pieces[tu_rand64() % (sizeof pieces / sizeof pieces[0])];
            size_t pl = strlen(p), del = tu_rand64() % 4;
            if (del > n - at) del = n - at;
            memmove(buf + at + pl, buf + at + del, n - at - del);
            memcpy(buf + at, p, pl);
            n = n - del + pl;
        }
        char *text = malloc(3 * n + 1); /* an edit may split a character: mend it */
        n = utf8_repair(text, 3 * n + 1, buf, n);
        char err[256];
        struct jinja_tmpl *t = jinja_parse(text, n, err, sizeof err);
        if (t) {
            parsed++;
            char *out = NULL;
            size_t on = 0;
            int rc = jinja_render(t, json_object_get(c, "context"), &lim, &out, &on, err,
                                  sizeof err);
            if (rc == 0) {
                rendered++;
                assert_true(utf8_valid(out, on));
            } else {
                assert_null(out);
                assert_true(utf8_valid(err, strlen(err)));
            }
            free(out);
            jinja_destroy(t);
        } else {
            assert_true(strncmp(err, "line ", 5) == 0);
        }
        free(text);
        free(buf);
    }
    printf("  3000 corrupted templates: %zu parsed, %zu rendered\n", parsed, rendered);
}

static int setup(void **state)
{
    (void)state;
    json_error_t jerr;
    golden = json_load_file(GOLDEN, 0, &jerr);
    if (!golden) {
        fprintf(stderr, "%s: %s (run from the repository root)\n", GOLDEN, jerr.text);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(golden);
    return 0;
}

int main(void)
{
    tu_seed("test_jinja");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_python_semantics),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_corrupted_templates),
        cmocka_unit_test(test_source_not_kept),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

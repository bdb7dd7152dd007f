/* test_run_sh.c - tests/run.sh, the runner of make test, run on three
 * stand-in programs written here (one passes after 200 lines of output,
 * one skips with exit 77 and a reason, one fails after a line of
 * detail).
 *
 * Proves: a passing program gets one line and none of its output; a
 * skipped one one line with its reason; a failed one its line and then
 * its whole output; the last line is exactly "tests: 1 passed, 1 failed,
 * 1 skipped" (CI greps it); the exit status is non-zero with a failure and
 * 0 without. No timings are checked. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

/* Writes an executable shell script at dir/name. */
static void script(const char *name, const char *body, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    assert_int_equal(chmod(path, 0755), 0);
}

/* Runs cmd; its stdout and stderr into *out (caller frees), exit status
 * returned. */
static int run(const char *cmd, char **out)
{
    char full[1200];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) n += got;
    buf[n] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_summary_and_failures(void **state)
{
    (void)state;
    char pass[128], skip[128], fail[128], cmd[1024];
    script("pass", "i=0; while [ $i -lt 200 ]; do echo pass-line-$i; i=$((i+1)); done", pass,
           sizeof(pass));
    script("skip", "echo starting; echo 'skipped: no CUDA device'; exit 77", skip, sizeof(skip));
    script("fail", "echo fail-detail-1; echo fail-detail-2 >&2; exit 3", fail, sizeof(fail));
    snprintf(cmd, sizeof(cmd), "tests/run.sh %s %s %s", pass, skip, fail);
    char *out;
    int rc = run(cmd, &out);
    assert_int_not_equal(rc, 0);
    if (strstr(out, "pass-line-")) fail_msg("a passing program's output was printed:\n%s", out);
    char want[256];
    snprintf(want, sizeof(want), "ok       %s (", pass);
    if (!strstr(out, want)) fail_msg("no '%s' in:\n%s", want, out);
    snprintf(want, sizeof(want), "skipped  %s (", skip);
    const char *s = strstr(out, want);
    if (!s || !strstr(s, "): skipped: no CUDA device\n")) fail_msg("no skip line with its reason in:\n%s", out);
    if (strstr(out, "starting")) fail_msg("a skipped program's output was printed:\n%s", out);
    snprintf(want, sizeof(want), "FAILED   %s (", fail);
    const char *f = strstr(out, want);
    if (!f || !strstr(f, "fail-detail-1") || !strstr(f, "fail-detail-2"))
        fail_msg("the failure's output is not after its line:\n%s", out);
    size_t n = strlen(out);
    const char *last = "tests: 1 passed, 1 failed, 1 skipped\n";
    if (n < strlen(last) || strcmp(out + n - strlen(last), last) != 0)
        fail_msg("the last line is not '%s':\n%s", last, out);
    /* one line per program, then the lists and the summary, and the
     * failure's detail: nothing else */
    size_t lines = 0;
    for (const char *p = out; *p; p++) lines += *p == '\n';
    if (lines > 10) fail_msg("%zu lines printed:\n%s", lines, out);
    free(out);
    snprintf(cmd, sizeof(cmd), "tests/run.sh %s %s", pass, skip);
    assert_int_equal(run(cmd, &out), 0);
    n = strlen(out);
    last = "tests: 1 passed, 0 failed, 1 skipped\n";
    if (n < strlen(last) || strcmp(out + n - strlen(last), last) != 0)
        fail_msg("the last line is not '%s':\n%s", last, out);
    free(out);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kinfer-test-run-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    const char *names[] = {"pass", "skip", "fail"};
    char p[128];
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_and_failures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

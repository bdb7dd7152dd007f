/* test_job.c - batching/job: the deadline arithmetic on hostile values. A
 * deadline_ms where `(deadline_ms - now_ms) * 1000` overflows int64
 * (from about 9.22e15 ms) and the largest values a job can send (2^62,
 * 2^63-1, and a timeout of 2^63-1 that the decoder saturates) must land
 * far in the future on the monotonic clock, never in the past; later
 * deadlines never map earlier; ordinary ones map exactly; the default
 * timeout saturates on a record timestamp near INT64_MAX; a message that
 * quotes ill-formed UTF-8 is stored repaired. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "../base/utf8.h"
#include "../batching/job.h"
#include "testutil.h"

static void test_deadline_us_boundaries(void **state)
{
    (void)state;
    const int64_t now_ms = 1795000000000LL, now_us = 123456789012LL;
    /* Ordinary deadlines: exact. */
    assert_int_equal(job_deadline_us(now_ms + 1, now_ms, now_us), now_us + 1000);
    assert_int_equal(job_deadline_us(now_ms + 60000, now_ms, now_us), now_us + 60000000LL);
    assert_int_equal(job_deadline_us(now_ms, now_ms, now_us), now_us); /* due now */
    assert_int_equal(job_deadline_us(now_ms - 5, now_ms, now_us), now_us);
    /* Where the old product overflowed, and the largest values. */
    static const int64_t far[] = {
        9223372036854LL + now_ms,         /* just below the overflow */
        9223372036855LL + now_ms,
        9300000000000000LL, 10000000000000000LL, 4611686018427387904LL, INT64_MAX - 1, INT64_MAX,
    };
    int64_t prev = now_us;
    for (size_t i = 0; i < sizeof(far) / sizeof(far[0]); i++) {
        int64_t d = job_deadline_us(far[i], now_ms, now_us);
        if (d < now_us + 100LL * 365 * 86400 * 1000000)
            fail_msg("deadline_ms %lld maps to %lld us, less than a century away",
                     (long long)far[i], (long long)d);
        assert_true(d <= JOB_DEADLINE_FAR_US);
        assert_true(d >= prev);
        prev = d;
    }
    /* A monotonic clock reading past the cap still never goes back. */
    assert_int_equal(job_deadline_us(INT64_MAX, now_ms, JOB_DEADLINE_FAR_US + 5),
                     JOB_DEADLINE_FAR_US + 5);
}

static void test_effective_deadline(void **state)
{
    (void)state;
    assert_int_equal(job_effective_deadline_ms(0, 1000, 0), 0);
    assert_int_equal(job_effective_deadline_ms(5000, 1000, 0), 5000);
    assert_int_equal(job_effective_deadline_ms(0, 1000, 250), 1250);
    assert_int_equal(job_effective_deadline_ms(5000, 1000, 250), 1250); /* the default is earlier */
    assert_int_equal(job_effective_deadline_ms(1100, 1000, 250), 1100); /* the job's is earlier */
    assert_int_equal(job_effective_deadline_ms(INT64_MAX, 1000, 0), INT64_MAX);
    /* Record timestamps are the producer's: any int64. */
    assert_int_equal(job_effective_deadline_ms(0, INT64_MAX - 10, 86400000), INT64_MAX);
    assert_int_equal(job_effective_deadline_ms(0, -1, 250), 250);
}

static void test_fail_message_utf8(void **state)
{
    (void)state;
    struct job *j = job_new();
    assert_non_null(j);
    job_fail(j, PROTO_ERR_UNKNOWN_MODEL, "no model named '%s'", "\xc3\x28\xff");
    assert_string_equal(j->errmsg, "no model named '\xef\xbf\xbd(\xef\xbf\xbd'");
    assert_true(utf8_valid(j->errmsg, strlen(j->errmsg)));
    job_free(j);
    job_free(NULL);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline_us_boundaries),
        cmocka_unit_test(test_effective_deadline),
        cmocka_unit_test(test_fail_message_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

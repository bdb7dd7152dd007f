/* test_stats.c - telemetry/stats.c and the renderers of telemetry/metrics.c,
 * without a socket.
 *
 * Proves: histogram values land in the bucket Prometheus's le means
 * (upper bound inclusive), and the rendered histogram is cumulative with
 * +Inf equal to _count; counters by label render with the right values,
 * every series from the start, and a mirrored counter never goes back;
 * the rendered text is well formed (every sample belongs to a family
 * declared with HELP and TYPE, label values escaped); librdkafka's
 * statistics JSON (realistic documents captured from librdkafka 2.0.2's
 * consumer and producer against its mock cluster, in tests/data/, with
 * lags edited to tell the fallbacks apart) gives the lag of assigned
 * partitions only, the group state and the broker connections, and bad
 * documents change nothing; the smoothed rates follow the exponential
 * formula on a clock the test controls, and the drain estimate follows
 * from them; the watchdog trips on a silent loop, names it and stays
 * tripped; readiness lists each unmet condition.
 *
 * Run from the repository root (make test does): the JSON samples are
 * read from tests/data/. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../telemetry/metrics.h"
#include "../base/clock.h"
#include "../telemetry/stats.h"
#include "../batching/batcher.h"
#include "../batching/job.h"

/* Reads a whole file (the statistics samples); fails the test if absent. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: cannot open (run from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* The rendered /metrics text of st at now_us; caller frees. */
static char *render(struct stats *st, int64_t now_us)
{
    struct stats_snapshot s;
    assert_int_equal(stats_snapshot(st, now_us, &s), 0);
    char *text;
    size_t len;
    assert_int_equal(metrics_render(&s, &text, &len), 0);
    assert_int_equal(strlen(text), len);
    stats_snapshot_fini(&s);
    return text;
}

/* True if text has a line that is exactly line. */
static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p++)
        if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0')) return 1;
    return 0;
}

#define ASSERT_LINE(text, line)                                                  \
    do {                                                                         \
        if (!has_line((text), (line))) fail_msg("no line '%s' in:\n%s", (line), (text)); \
    } while (0)

/* ---- histogram buckets ------------------------------------------------- */

/* Bucket placement at and around each bound, +Inf past the last. */
static void test_hist_buckets(void **state)
{
    (void)state;
    size_t n_rows, n_secs;
    stats_hist_bounds(STATS_HIST_BATCH_ROWS, &n_rows);
    stats_hist_bounds(STATS_HIST_E2E_S, &n_secs);
    const struct {
        enum stats_hist h;
        double v;
        size_t bucket;
    } cases[] = {
        {STATS_HIST_BATCH_ROWS, 0, 0},       {STATS_HIST_BATCH_ROWS, 1, 0},
        {STATS_HIST_BATCH_ROWS, 1.5, 1},     {STATS_HIST_BATCH_ROWS, 2, 1},
        {STATS_HIST_BATCH_ROWS, 3, 2},       {STATS_HIST_BATCH_ROWS, 32, 5},
        {STATS_HIST_BATCH_ROWS, 33, 6},      {STATS_HIST_BATCH_ROWS, 65536, n_rows - 1},
        {STATS_HIST_BATCH_ROWS, 65537, n_rows}, {STATS_HIST_QUEUE_S, 0, 0},
        {STATS_HIST_QUEUE_S, 0.0005, 0},     {STATS_HIST_QUEUE_S, 0.00051, 1},
        {STATS_HIST_INFER_S, 0.001, 1},      {STATS_HIST_INFER_S, 0.1, 7},
        {STATS_HIST_E2E_S, 60, n_secs - 1},  {STATS_HIST_E2E_S, 60.001, n_secs},
        {STATS_HIST_E2E_S, 1e9, n_secs},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t got = stats_hist_bucket(cases[i].h, cases[i].v);
        if (got != cases[i].bucket)
            fail_msg("case %zu: %g in bucket %zu, expected %zu", i, cases[i].v, got,
                     cases[i].bucket);
    }
    /* Bounds ascend strictly, or le would be ambiguous. */
    for (int h = 0; h < STATS_N_HIST; h++) {
        size_t n;
        const double *b = stats_hist_bounds((enum stats_hist)h, &n);
        assert_true(n >= 1 && n <= STATS_HIST_MAX_BOUNDS);
        for (size_t i = 1; i < n; i++) assert_true(b[i] > b[i - 1]);
    }
}

/* ---- counters, histograms and the text format ---------------------------- */

/* Every non-comment line is "name{labels} value" or "name value" where
 * the name, less a histogram suffix, was declared by HELP and TYPE lines
 * before it; every label value is properly quoted and escaped. */
static void check_well_formed(const char *text)
{
    char declared[128][80];
    char types[128][16];
    size_t nd = 0;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        assert_non_null(nl); /* the text ends with a newline */
        size_t len = (size_t)(nl - p);
        char line[1024];
        assert_true(len < sizeof(line));
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl + 1;
        if (strncmp(line, "# HELP ", 7) == 0) {
            char name[80];
            assert_int_equal(sscanf(line + 7, "%79s", name), 1);
            assert_true(strlen(line) > 7 + strlen(name) + 1); /* has a text */
            assert_true(nd < 128);
            snprintf(declared[nd], sizeof(declared[nd]), "%s", name);
            types[nd][0] = '\0';
            nd++;
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[80], type[16];
            assert_int_equal(sscanf(line + 7, "%79s %15s", name, type), 2);
            assert_true(nd > 0);
            assert_string_equal(name, declared[nd - 1]);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                        strcmp(type, "histogram") == 0);
            snprintf(types[nd - 1], sizeof(types[nd - 1]), "%s", type);
            continue;
        }
        assert_true(line[0] != '#');
        size_t nlen = strcspn(line, "{ ");
        char name[80];
        assert_true(nlen > 0 && nlen < sizeof(name));
        memcpy(name, line, nlen);
        name[nlen] = '\0';
        assert_true(nd > 0);
        const char *fam = declared[nd - 1];
        int ok = strcmp(name, fam) == 0;
        if (!ok && strcmp(types[nd - 1], "histogram") == 0) {
            const char *sfx[] = {"_bucket", "_sum", "_count"};
            for (int k = 0; k < 3 && !ok; k++) {
                char full[100];
                snprintf(full, sizeof(full), "%s%s", fam, sfx[k]);
                ok = strcmp(name, full) == 0;
            }
        }
        if (!ok) fail_msg("sample '%s' outside its family %s", line, fam);
        const char *q = line + nlen;
        if (*q == '{') {
            q++;
            while (*q != '}') {
                while (*q >= 'a' && *q <= 'z') q++;
                assert_true(q[0] == '=' && q[1] == '"');
                q += 2;
                while (*q != '"') {
                    assert_true(*q != '\0' && *q != '\n');
                    if (*q == '\\') {
                        assert_true(q[1] == '\\' || q[1] == '"' || q[1] == 'n');
                        q++;
                    }
                    q++;
                }
                q++;
                if (*q == ',') q++;
            }
            q++;
        }
        assert_true(*q == ' ');
        char *end;
        const char *v = q + 1;
        if (strcmp(v, "+Inf") && strcmp(v, "-Inf") && strcmp(v, "NaN")) {
            strtod(v, &end);
            if (*end) fail_msg("bad value in '%s'", line);
        }
    }
}

/* Events in, exact exposition lines out; well formed throughout. */
static void test_counters_render(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    assert_non_null(st);
    for (int i = 0; i < 7; i++) stats_consumed(st);
    stats_job(st, STATS_STATUS_OK, PROTO_OK, 0.002, 0.001, 0.010);
    stats_job(st, STATS_STATUS_OK, PROTO_OK, 0.003, 0.001, 0.020);
    stats_job(st, STATS_STATUS_OK, PROTO_OK, 0.5, 0.2, 2.0);
    stats_job(st, STATS_STATUS_ERROR, PROTO_ERR_INVALID_INPUT, -1, -1, 0.001);
    stats_job(st, STATS_STATUS_ERROR, PROTO_ERR_INVALID_INPUT, -1, -1, 0.002);
    stats_job(st, STATS_STATUS_ERROR, PROTO_ERR_DEADLINE_EXCEEDED, 0.004, -1, 0.004);
    stats_job(st, STATS_STATUS_DEAD_LETTER, PROTO_ERR_INVALID_INPUT, -1, -1, 5.0);
    stats_batch(st, STATS_BATCH_SIZE, 2);
    stats_batch(st, STATS_BATCH_WAIT, 1);
    stats_batch(st, STATS_BATCH_DRAIN, 0);
    stats_produce_error(st);
    stats_produce_error(st);
    stats_set_redis_errors(st, 5);
    stats_set_redis_errors(st, 3); /* a counter never goes back */
    stats_heartbeat_error(st);
    stats_set_queue(st, 12, 5, 0.25, 40, 2);
    stats_set_partitions(st, 4, 4);
    char *text = render(st, clock_mono_us());
    check_well_formed(text);

    const char *lines[] = {
        "# TYPE kinfer_jobs_total counter",
        "kinfer_jobs_total{status=\"ok\",code=\"ok\"} 3",
        "kinfer_jobs_total{status=\"error\",code=\"invalid_input\"} 2",
        "kinfer_jobs_total{status=\"error\",code=\"deadline_exceeded\"} 1",
        "kinfer_jobs_total{status=\"error\",code=\"unknown_model\"} 0",
        "kinfer_jobs_total{status=\"error\",code=\"shutting_down\"} 0",
        "kinfer_jobs_total{status=\"dead_letter\",code=\"invalid_input\"} 1",
        "kinfer_jobs_total{status=\"dead_letter\",code=\"inference_failed\"} 0",
        "kinfer_consumed_total 7",
        "# TYPE kinfer_batches_total counter",
        "kinfer_batches_total{reason=\"size\"} 1",
        "kinfer_batches_total{reason=\"deadline\"} 0",
        "kinfer_batches_total{reason=\"wait\"} 1",
        "kinfer_batches_total{reason=\"drain\"} 1",
        "kinfer_dead_letters_total 1",
        "kinfer_produce_errors_total 2",
        "kinfer_redis_errors_total 5",
        "kinfer_heartbeat_errors_total 1",
        "# TYPE kinfer_batch_rows histogram",
        "kinfer_batch_rows_bucket{le=\"1\"} 1",
        "kinfer_batch_rows_bucket{le=\"2\"} 2",
        "kinfer_batch_rows_bucket{le=\"65536\"} 2",
        "kinfer_batch_rows_bucket{le=\"+Inf\"} 2",
        "kinfer_batch_rows_sum 3",
        "kinfer_batch_rows_count 2",
        "# TYPE kinfer_queue_seconds histogram",
        "kinfer_queue_seconds_bucket{le=\"0.0025\"} 1",
        "kinfer_queue_seconds_bucket{le=\"0.005\"} 3",
        "kinfer_queue_seconds_bucket{le=\"0.5\"} 4",
        "kinfer_queue_seconds_count 4",
        "kinfer_queue_seconds_sum 0.509",
        "kinfer_infer_seconds_count 3",
        "kinfer_e2e_seconds_bucket{le=\"0.001\"} 1",
        "kinfer_e2e_seconds_bucket{le=\"2.5\"} 6",
        "kinfer_e2e_seconds_bucket{le=\"+Inf\"} 6",
        "kinfer_e2e_seconds_count 6",
        "kinfer_queue_depth_rows 12",
        "kinfer_queue_depth_jobs 5",
        "kinfer_oldest_queued_seconds 0.25",
        "kinfer_inflight_rows 40",
        "kinfer_inflight_batches 2",
        "kinfer_assigned_partitions 4",
        "kinfer_paused_partitions 4",
        "# TYPE kinfer_build_info gauge",
        "kinfer_ready 0",
        "kinfer_healthy 1",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) ASSERT_LINE(text, lines[i]);
    /* No GPU line until the backend reports one; no series for an
     * impossible pairing. */
    assert_null(strstr(text, "kinfer_gpu_busy_ratio"));
    assert_null(strstr(text, "status=\"ok\",code=\"invalid_input\""));
    assert_non_null(strstr(text, "kinfer_build_info{version=\""));
    free(text);

    /* The CUDA backend's devices: one series each, labelled by index. */
    struct stats_device d0 = {.index = 0, .busy_ratio = 0.25, .mem_used = 1 << 20,
                              .mem_total = 80ull << 30, .batches = 7, .busy_s = 1.5};
    struct stats_device d1 = {.index = 3, .busy_ratio = 1.5, .batches = 9}; /* capped */
    stats_set_device(st, 0, &d0);
    stats_set_device(st, 1, &d1);
    stats_set_backend(st, "cuda");
    stats_set_precision(st, "bf16");
    stats_set_device_name(st, "NVIDIA H100 80GB HBM3, NVIDIA H100 80GB HBM3");
    text = render(st, clock_mono_us());
    ASSERT_LINE(text, "# TYPE kinfer_gpu_busy_ratio gauge");
    ASSERT_LINE(text, "kinfer_gpu_busy_ratio{device=\"0\"} 0.25");
    ASSERT_LINE(text, "kinfer_gpu_busy_ratio{device=\"3\"} 1");
    ASSERT_LINE(text, "kinfer_gpu_memory_used_bytes{device=\"0\"} 1048576");
    ASSERT_LINE(text, "kinfer_gpu_memory_total_bytes{device=\"0\"} 85899345920");
    ASSERT_LINE(text, "# TYPE kinfer_gpu_batches_total counter");
    ASSERT_LINE(text, "kinfer_gpu_batches_total{device=\"3\"} 9");
    ASSERT_LINE(text, "kinfer_gpu_busy_seconds_total{device=\"0\"} 1.5");
    ASSERT_LINE(text, "kinfer_backend_info{backend=\"cuda\",device=\"NVIDIA H100 80GB HBM3, "
                      "NVIDIA H100 80GB HBM3\",precision=\"bf16\",devices=\"2\"} 1");
    free(text);
    stats_destroy(st);
}

/* job_report reads the outcome off a finished job. */
static void test_job_done(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    struct job ok = {.kind = JOB_RESULT, .err = PROTO_OK, .batch_rows = 4, .queued_ms = 3,
                     .infer_ms = 2, .record_ts_ms = 1000};
    struct job early = {.kind = JOB_RESULT, .err = PROTO_ERR_UNKNOWN_MODEL, .record_ts_ms = 1000};
    struct job dead = {.kind = JOB_DEAD, .err = PROTO_ERR_INVALID_INPUT, .record_ts_ms = 1000};
    struct job ahead = {.kind = JOB_RESULT, .err = PROTO_OK, .batch_rows = 1,
                        .record_ts_ms = 9000}; /* producer clock ahead */
    job_report(&ok, st, 1500);
    job_report(&early, st, 1001);
    job_report(&dead, st, 1001);
    job_report(&ahead, st, 1001);
    struct stats_snapshot s;
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(s.jobs[STATS_STATUS_OK][PROTO_OK], 2);
    assert_int_equal(s.jobs[STATS_STATUS_ERROR][PROTO_ERR_UNKNOWN_MODEL], 1);
    assert_int_equal(s.jobs[STATS_STATUS_DEAD_LETTER][PROTO_ERR_INVALID_INPUT], 1);
    assert_int_equal(s.dead_letters, 1);
    assert_int_equal(s.hist[STATS_HIST_QUEUE_S].count, 2); /* the two that ran */
    assert_int_equal(s.hist[STATS_HIST_E2E_S].count, 3);   /* all but the dead letter */
    /* e2e: 0.5 s, 0.001 s, and 0 for the clock that runs ahead. */
    assert_true(fabs(s.hist[STATS_HIST_E2E_S].sum - 0.501) < 1e-9);
    assert_int_equal(s.hist[STATS_HIST_E2E_S].buckets[0], 1); /* 0 */
    assert_int_equal(s.hist[STATS_HIST_E2E_S].buckets[1], 1); /* 0.001 */
    stats_snapshot_fini(&s);
    stats_destroy(st);
}

/* ---- librdkafka statistics ------------------------------------------------ */

/* The realistic consumer and producer documents of tests/data/. */
static void test_rdkafka_samples(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    size_t len;
    char *json = slurp("tests/data/rdkafka_stats_consumer.json", &len);
    assert_int_equal(stats_rdkafka_json(st, json, len), 0);
    free(json);
    struct stats_snapshot s;
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    /* jobs[0]: nothing stored or committed: the whole log (hi 58 - lo 0);
     * jobs[1]: consumer_lag_stored; jobs[2]: consumer_lag_stored unknown,
     * consumer_lag from the committed offset; jobs[3]: caught up;
     * jobs.hi[0] revoked (desired false) and every [-1] are left out. */
    const struct {
        const char *topic;
        int32_t partition;
        int64_t lag;
    } want[] = {{"jobs", 0, 58}, {"jobs", 1, 3}, {"jobs", 2, 5}, {"jobs", 3, 0},
                {"jobs.hi", 1, 7}};
    size_t nw = sizeof(want) / sizeof(want[0]);
    assert_int_equal(s.n_parts, nw);
    for (size_t i = 0; i < nw; i++) {
        assert_string_equal(s.parts[i].topic, want[i].topic);
        assert_int_equal(s.parts[i].partition, want[i].partition);
        assert_int_equal(s.parts[i].lag, want[i].lag);
    }
    assert_int_equal(s.lag_total, 73);
    assert_true(s.lag_known);
    assert_int_equal(s.brokers_up_consumer, 2); /* the GroupCoordinator entry does not count */
    assert_int_equal(s.group_joined, 1);
    assert_int_equal(s.cond[STATS_COND_CONSUMER], 1);
    assert_int_equal(s.brokers_up_producer, -1);
    assert_int_equal(s.cond[STATS_COND_PRODUCER], 0);
    char *text;
    assert_int_equal(metrics_render(&s, &text, &len), 0);
    ASSERT_LINE(text, "kinfer_consumer_lag{topic=\"jobs\",partition=\"0\"} 58");
    ASSERT_LINE(text, "kinfer_consumer_lag{topic=\"jobs.hi\",partition=\"1\"} 7");
    ASSERT_LINE(text, "kinfer_kafka_brokers_up{client=\"consumer\"} 2");
    assert_null(strstr(text, "partition=\"-1\""));
    assert_null(strstr(text, "kinfer_kafka_brokers_up{client=\"producer\"}"));
    free(text);
    stats_snapshot_fini(&s);

    json = slurp("tests/data/rdkafka_stats_producer.json", &len);
    assert_int_equal(stats_rdkafka_json(st, json, len), 0);
    free(json);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(s.brokers_up_producer, 1);
    assert_int_equal(s.cond[STATS_COND_PRODUCER], 1);
    assert_int_equal(s.n_parts, nw); /* a producer document leaves the lag alone */
    stats_snapshot_fini(&s);
    stats_destroy(st);
}

/* Small documents for the edge cases; each row starts from a stats struct
 * that has read the realistic consumer sample (5 partitions). */
static void test_rdkafka_edges(void **state)
{
    (void)state;
    const struct {
        const char *name;
        const char *json;
        int rc;
        int n_parts;         /* partitions after; 5 = unchanged */
        int64_t lag_total;
        int consumer_cond;   /* STATS_COND_CONSUMER after */
        int producer_cond;
    } cases[] = {
        {"not json", "{\"type\": \"consumer\", ", -1, 5, 73, 1, 0},
        {"not an object", "[1,2]", -1, 5, 73, 1, 0},
        {"no type", "{\"topics\": {}}", -1, 5, 73, 1, 0},
        {"other type", "{\"type\": \"admin\"}", -1, 5, 73, 1, 0},
        {"consumer, no topics: table emptied", "{\"type\": \"consumer\"}", 0, 0, 0, 0, 0},
        {"group still joining",
         "{\"type\":\"consumer\",\"cgrp\":{\"state\":\"up\",\"join_state\":\"wait-join\"}}", 0, 0,
         0, 0, 0},
        {"coordinator lost",
         "{\"type\":\"consumer\",\"cgrp\":{\"state\":\"query-coord\",\"join_state\":\"steady\"}}",
         0, 0, 0, 0, 0},
        {"lag unknowable: committed but no watermark yet",
         "{\"type\":\"consumer\",\"cgrp\":{\"state\":\"up\",\"join_state\":\"steady\"},"
         "\"topics\":{\"t\":{\"topic\":\"t\",\"partitions\":{\"0\":{\"partition\":0,"
         "\"desired\":true,\"consumer_lag_stored\":-1,\"consumer_lag\":-1,"
         "\"committed_offset\":5,\"stored_offset\":-1001,\"hi_offset\":-1,\"lo_offset\":-1}}}}}",
         0, 0, 0, 1, 0},
        {"unknown partition left out",
         "{\"type\":\"consumer\",\"topics\":{\"t\":{\"topic\":\"t\",\"partitions\":{\"0\":"
         "{\"partition\":0,\"desired\":true,\"unknown\":true,\"consumer_lag_stored\":4}}}}}",
         0, 0, 0, 0, 0},
        {"producer, every broker down",
         "{\"type\":\"producer\",\"brokers\":{\"a:1/1\":{\"source\":\"configured\","
         "\"state\":\"DOWN\"},\"a:1/bootstrap\":{\"source\":\"learned\",\"state\":\"TRY_CONNECT\"}}}",
         0, 5, 73, 1, 0},
        {"producer, one broker up",
         "{\"type\":\"producer\",\"brokers\":{\"a:1/1\":{\"source\":\"configured\","
         "\"state\":\"UP\"}}}",
         0, 5, 73, 1, 1},
        {"producer, only a logical broker up",
         "{\"type\":\"producer\",\"brokers\":{\"GroupCoordinator\":{\"source\":\"logical\","
         "\"state\":\"UP\"}}}",
         0, 5, 73, 1, 0},
    };
    size_t len;
    char *sample = slurp("tests/data/rdkafka_stats_consumer.json", &len);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct stats *st = stats_new();
        assert_int_equal(stats_rdkafka_json(st, sample, len), 0);
        int rc = stats_rdkafka_json(st, cases[i].json, strlen(cases[i].json));
        struct stats_snapshot s;
        assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
        if (rc != cases[i].rc || (int)s.n_parts != cases[i].n_parts ||
            s.lag_total != cases[i].lag_total || s.cond[STATS_COND_CONSUMER] != cases[i].consumer_cond ||
            s.cond[STATS_COND_PRODUCER] != cases[i].producer_cond)
            fail_msg("%s: rc %d parts %zu lag %lld consumer %d producer %d", cases[i].name, rc,
                     s.n_parts, (long long)s.lag_total, s.cond[STATS_COND_CONSUMER],
                     s.cond[STATS_COND_PRODUCER]);
        stats_snapshot_fini(&s);
        stats_destroy(st);
    }
    free(sample);
}

/* Label values are escaped, whatever a topic is called. */
static void test_label_escaping(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    const char *doc =
        "{\"type\":\"consumer\",\"topics\":{\"x\":{\"topic\":\"a\\\"b\\\\c\\nd\",\"partitions\":"
        "{\"2\":{\"partition\":2,\"desired\":true,\"consumer_lag_stored\":9}}}}}";
    assert_int_equal(stats_rdkafka_json(st, doc, strlen(doc)), 0);
    char *text = render(st, clock_mono_us());
    ASSERT_LINE(text, "kinfer_consumer_lag{topic=\"a\\\"b\\\\c\\nd\",partition=\"2\"} 9");
    check_well_formed(text);
    free(text);
    stats_destroy(st);
}

/* ---- rates and the drain estimate ------------------------------------------ */

/* The smoothed rates on a clock the test drives, and the drain estimate. */
static void test_rates_and_drain(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    const char *doc = "{\"type\":\"consumer\",\"topics\":{\"t\":{\"topic\":\"t\",\"partitions\":"
                      "{\"0\":{\"partition\":0,\"desired\":true,\"consumer_lag_stored\":300}}}}}";
    assert_int_equal(stats_rdkafka_json(st, doc, strlen(doc)), 0);
    const int64_t t0 = 1000000000; /* any monotonic origin */
    struct stats_snapshot s;

    /* First look: primes the counters; no rate, lag but no progress:
     * the drain time is unknown and not rendered. */
    assert_int_equal(stats_snapshot(st, t0, &s), 0);
    assert_true(s.jobs_per_s == 0 && !s.drain_known);
    char *text;
    size_t len;
    assert_int_equal(metrics_render(&s, &text, &len), 0);
    assert_null(strstr(text, "\nkinfer_estimated_drain_seconds "));
    ASSERT_LINE(text, "# TYPE kinfer_estimated_drain_seconds gauge");
    free(text);
    stats_snapshot_fini(&s);

    /* 100 jobs and 400 rows in 10 s: the first interval seeds the rates. */
    for (int i = 0; i < 100; i++) stats_job(st, STATS_STATUS_OK, PROTO_OK, -1, -1, -1);
    for (int i = 0; i < 10; i++) stats_batch(st, STATS_BATCH_SIZE, 40);
    assert_int_equal(stats_snapshot(st, t0 + 10000000, &s), 0);
    assert_true(fabs(s.jobs_per_s - 10.0) < 1e-9);
    assert_true(fabs(s.rows_per_s - 40.0) < 1e-9);
    assert_true(s.drain_known && fabs(s.drain_s - 30.0) < 1e-9);
    stats_snapshot_fini(&s);

    /* Half a second later: too soon, nothing moves. */
    for (int i = 0; i < 50; i++) stats_job(st, STATS_STATUS_OK, PROTO_OK, -1, -1, -1);
    assert_int_equal(stats_snapshot(st, t0 + 10500000, &s), 0);
    assert_true(fabs(s.jobs_per_s - 10.0) < 1e-9);
    stats_snapshot_fini(&s);

    /* 10 s more with those 50 jobs (5/s): the weight of the new interval
     * is 1 - exp(-10/15). */
    assert_int_equal(stats_snapshot(st, t0 + 20000000, &s), 0);
    double a = 1.0 - exp(-10.0 / STATS_RATE_TAU_S);
    double want = 10.0 + a * (5.0 - 10.0);
    assert_true(fabs(s.jobs_per_s - want) < 1e-9);
    assert_true(fabs(s.rows_per_s - (40.0 + a * (0.0 - 40.0))) < 1e-9);
    assert_true(fabs(s.drain_s - 300.0 / want) < 1e-6);
    stats_snapshot_fini(&s);

    /* Caught up: the estimate is 0 whatever the rate. */
    doc = "{\"type\":\"consumer\",\"topics\":{}}";
    assert_int_equal(stats_rdkafka_json(st, doc, strlen(doc)), 0);
    assert_int_equal(stats_snapshot(st, t0 + 21000000, &s), 0);
    assert_true(s.drain_known && s.drain_s == 0);
    assert_int_equal(metrics_render(&s, &text, &len), 0);
    ASSERT_LINE(text, "kinfer_estimated_drain_seconds 0");
    free(text);
    stats_snapshot_fini(&s);
    stats_destroy(st);
}

/* ---- liveness and readiness ------------------------------------------------- */

/* A silent loop trips the watchdog, named, for good; stopped loops do not. */
static void test_watchdog(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    stats_set_watchdog(st, 30000);
    stats_alive(st, STATS_LOOP_POLL);
    stats_alive(st, STATS_LOOP_SINK);
    stats_alive(st, STATS_LOOP_EXEC + 2);
    stats_alive(st, STATS_LOOP_GEN + 1);
    int64_t now = clock_mono_us();
    struct stats_snapshot s;
    char *body;
    size_t len;

    assert_int_equal(stats_snapshot(st, now + 1000000, &s), 0);
    assert_true(s.healthy);
    assert_true(s.loop_silence_s[STATS_LOOP_POLL] >= 1.0);
    assert_true(s.loop_silence_s[STATS_LOOP_HEARTBEAT] < 0); /* never reported */
    assert_true(s.loop_silence_s[STATS_LOOP_EXEC] < 0);
    assert_true(s.loop_silence_s[STATS_LOOP_EXEC + 2] >= 1.0);
    assert_int_equal(metrics_render_health(&s, &body, &len), 1);
    assert_non_null(strstr(body, "\"healthy\":true"));
    assert_non_null(strstr(body, "\"executor-2\":"));
    /* a generator lane is a loop of its own, past every executor's */
    assert_non_null(strstr(body, "\"generator-1\":"));
    assert_true(s.loop_silence_s[STATS_LOOP_EXEC + STATS_MAX_EXECUTORS - 1] < 0);
    assert_true(s.loop_silence_s[STATS_LOOP_GEN + 1] >= 1.0);
    assert_null(strstr(body, "\"heartbeat\":"));
    free(body);
    stats_snapshot_fini(&s);

    /* The sink stops on purpose: no longer watched. Poll and executor-2
     * stay silent past the bound: tripped, naming the first. */
    stats_loop_stop(st, STATS_LOOP_SINK);
    assert_int_equal(stats_snapshot(st, now + 31000000, &s), 0);
    assert_false(s.healthy);
    assert_true(s.loop_silence_s[STATS_LOOP_SINK] < 0);
    assert_non_null(strstr(s.unhealthy_why, "poll"));
    assert_int_equal(metrics_render_health(&s, &body, &len), 0);
    assert_non_null(strstr(body, "\"healthy\":false"));
    assert_non_null(strstr(body, "loop poll silent"));
    free(body);
    char *text;
    assert_int_equal(metrics_render(&s, &text, &len), 0);
    ASSERT_LINE(text, "kinfer_healthy 0");
    free(text);
    stats_snapshot_fini(&s);

    /* Reporting again does not untrip it. */
    stats_alive(st, STATS_LOOP_POLL);
    stats_alive(st, STATS_LOOP_EXEC + 2);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_false(s.healthy);
    stats_snapshot_fini(&s);
    stats_destroy(st);
}

/* Each readiness condition, its reason, and draining. */
static void test_readiness(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    struct stats_snapshot s;
    const char *reasons[8];
    size_t n;
    char *body;
    size_t len;

    /* Fresh: four reasons, in a fixed order. */
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_int_equal(n, 4);
    assert_string_equal(reasons[0], "model: not loaded");
    assert_string_equal(reasons[1], "consumer: not joined to the group");
    assert_string_equal(reasons[2], "producer: no Kafka broker reached yet");
    assert_string_equal(reasons[3], "redis: not reachable");
    assert_int_equal(metrics_render_ready(&s, &body, &len), 0);
    assert_non_null(strstr(body, "{\"ready\":false,\"reasons\":[\"model: not loaded\","));
    free(body);
    stats_snapshot_fini(&s);

    /* One condition at a time, each taking its reason away. */
    const struct {
        const char *what;
        int cond;      /* -1: set partitions instead */
        size_t left;
    } steps[] = {
        {"model", STATS_COND_MODEL, 3},
        {"assigned partitions count as joined", -1, 2},
        {"producer", STATS_COND_PRODUCER, 1},
        {"redis", STATS_COND_REDIS, 0},
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        if (steps[i].cond < 0) stats_set_partitions(st, 2, 0);
        else stats_set_cond(st, (enum stats_cond)steps[i].cond, 1);
        assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
        int ready = stats_ready(&s, reasons, 8, &n);
        if (n != steps[i].left || ready != (steps[i].left == 0))
            fail_msg("after %s: %zu reasons left, ready %d", steps[i].what, n, ready);
        stats_snapshot_fini(&s);
    }
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(metrics_render_ready(&s, &body, &len), 1);
    assert_string_equal(body,
                        "{\"ready\":true,\"reasons\":[],\"backend\":\"cpu\",\"device\":\"cpu\"}\n");
    free(body);
    stats_snapshot_fini(&s);
    /* The backend the runtime chose, and its device, are what /readyz names. */
    stats_set_backend(st, "cuda");
    stats_set_device_name(st, "emulated NVIDIA H100 80GB HBM3");
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(metrics_render_ready(&s, &body, &len), 1);
    assert_string_equal(body, "{\"ready\":true,\"reasons\":[],\"backend\":\"cuda\","
                              "\"device\":\"emulated NVIDIA H100 80GB HBM3\"}\n");
    free(body);
    stats_snapshot_fini(&s);
    stats_set_backend(st, "cpu");
    /* And the models with their kinds, once the worker set them. */
    stats_set_models(st, "llm=generator,emb=encoder");
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(metrics_render_ready(&s, &body, &len), 1);
    assert_non_null(strstr(body, ",\"models\":\"llm=generator,emb=encoder\"}"));
    free(body);
    stats_snapshot_fini(&s);

    /* A producer that lost every broker says so. */
    const char *down = "{\"type\":\"producer\",\"brokers\":{\"b/1\":{\"source\":\"configured\","
                       "\"state\":\"DOWN\"}}}";
    assert_int_equal(stats_rdkafka_json(st, down, strlen(down)), 0);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(reasons[0], "producer: no connection to any Kafka broker");
    stats_snapshot_fini(&s);
    stats_set_cond(st, STATS_COND_PRODUCER, 1);

    /* Draining is final. */
    stats_set_draining(st);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(reasons[0], "worker: draining, stopping");
    stats_snapshot_fini(&s);
    stats_destroy(st);
}

/* Before a client's first statistics, what its own calls show decides its
 * condition (a producer with metadata, a consumer with a member id);
 * once the statistics come, they alone do. */
static void test_readiness_before_statistics(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    struct stats_snapshot s;
    const char *reasons[8];
    size_t n;
    stats_set_cond(st, STATS_COND_MODEL, 1);
    stats_set_cond(st, STATS_COND_REDIS, 1);
    stats_set_early(st, STATS_COND_PRODUCER, 1);
    stats_set_early(st, STATS_COND_CONSUMER, 1);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 1);
    stats_snapshot_fini(&s);
    /* The statistics say otherwise: they win. */
    const char *down = "{\"type\":\"producer\",\"brokers\":{\"b/1\":{\"source\":\"configured\","
                       "\"state\":\"DOWN\"}}}";
    assert_int_equal(stats_rdkafka_json(st, down, strlen(down)), 0);
    const char *cons = "{\"type\":\"consumer\",\"cgrp\":{\"state\":\"up\",\"join_state\":"
                       "\"wait-join\"},\"brokers\":{}}";
    assert_int_equal(stats_rdkafka_json(st, cons, strlen(cons)), 0);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(reasons[0], "consumer: not joined to the group");
    assert_string_equal(reasons[1], "producer: no connection to any Kafka broker");
    stats_snapshot_fini(&s);
    /* Without early signs and without statistics: not ready, saying so. */
    stats_destroy(st);
    st = stats_new();
    stats_set_cond(st, STATS_COND_MODEL, 1);
    stats_set_cond(st, STATS_COND_REDIS, 1);
    stats_set_early(st, STATS_COND_PRODUCER, 0);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_string_equal(reasons[1], "producer: no Kafka broker reached yet");
    stats_snapshot_fini(&s);
    stats_destroy(st);
}

/* What the dependency said becomes the reason; a sink path that has failed
 * for STATS_SINK_FAILING_S without a success since makes the worker not
 * ready, naming the error, and a success clears it. */
static void test_readiness_reasons_say_why(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    struct stats_snapshot s;
    const char *reasons[8];
    size_t n;
    for (int k = 0; k < STATS_N_COND; k++) stats_set_cond(st, (enum stats_cond)k, 1);
    stats_set_cond_why(st, STATS_COND_REDIS, 0, "redis: WRONGPASS invalid username-password pair");
    stats_sink_failing(st, STATS_SINK_KAFKA, "Broker: Topic authorization failed");
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_int_equal(n, 1); /* the sink has not failed for a second yet */
    assert_string_equal(reasons[0], "redis: WRONGPASS invalid username-password pair");
    stats_snapshot_fini(&s);
    usleep((useconds_t)(STATS_SINK_FAILING_S * 1e6) + 100000);
    stats_sink_failing(st, STATS_SINK_KAFKA, "Broker: Topic authorization failed");
    stats_sink_failing(st, STATS_SINK_REDIS, "OOM command not allowed");
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_int_equal(n, 2); /* redis's failure is new: not yet */
    assert_string_equal(reasons[1], "sink: kafka: Broker: Topic authorization failed");
    stats_snapshot_fini(&s);
    stats_set_cond_why(st, STATS_COND_REDIS, 1, NULL);
    stats_sink_failing(st, STATS_SINK_KAFKA, NULL);
    stats_sink_failing(st, STATS_SINK_REDIS, NULL);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 1);
    stats_snapshot_fini(&s);
    /* A condition set without a reason keeps the default one. */
    stats_set_cond(st, STATS_COND_REDIS, 0);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(stats_ready(&s, reasons, 8, &n), 0);
    assert_string_equal(reasons[0], "redis: not reachable");
    stats_snapshot_fini(&s);
    stats_destroy(st);
}

/* One cmocka group; no fixtures: each case makes its own stats. */
/* The queue gauges are read from the batcher when a snapshot is taken:
 * a queue that emptied after the poll thread's last stats_set_queue (the
 * last results in, a scrape at once) shows empty, not the depth of a
 * tenth of a second before. Unregistered, the last value stays. */
static void queue_from_batcher(void *ctx, int64_t now_us, size_t *rows, size_t *jobs,
                               double *oldest_s)
{
    struct batcher_stats bs;
    batcher_get_stats(ctx, now_us, &bs);
    *rows = bs.queued_rows;
    *jobs = bs.queued_jobs;
    *oldest_s = (double)bs.oldest_age_us / 1e6;
}

static void test_queue_gauges_current(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    assert_non_null(st);
    struct batcher_conf bc = {.n_models = 1, .max_batch_rows = 64, .max_wait_ms = 0};
    struct batcher *b = batcher_new(&bc);
    assert_non_null(b);
    stats_set_queue_source(st, queue_from_batcher, b);
    struct stats_snapshot s;
    for (int i = 0; i < 13; i++) {
        struct job *j = job_new();
        assert_non_null(j);
        j->model_idx = 0;
        j->rows = 2;
        j->arrived_us = clock_mono_us();
        batcher_push(b, j);
    }
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(s.queue_rows, 26);
    assert_int_equal(s.queue_jobs, 13);
    stats_snapshot_fini(&s);
    /* the poll thread's last sample: 26 rows; then everything is taken */
    stats_set_queue(st, 26, 13, 0.01, 26, 0);
    size_t taken = 0;
    while (taken < 26) {
        size_t rows = 0;
        enum batcher_reason why;
        struct job *batch = batcher_take(b, clock_mono_us(), &rows, &why, NULL);
        assert_non_null(batch);
        taken += rows;
        job_free_list(batch);
    }
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(s.queue_rows, 0);
    assert_int_equal(s.queue_jobs, 0);
    assert_true(s.oldest_queued_s == 0);
    stats_snapshot_fini(&s);
    stats_set_queue_source(st, NULL, NULL);
    stats_set_queue(st, 5, 1, 0, 5, 0);
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    assert_int_equal(s.queue_rows, 5);
    stats_snapshot_fini(&s);
    batcher_destroy(b);
    stats_destroy(st);
}

/* make demo prints a few metrics with tests/demo.sh's grep -E pattern:
 * every family it names must have a line that pattern matches in a real
 * rendering (labelled series included: kinfer_jobs_total{...}), with a
 * generating model loaded as in the demo. */
static void test_demo_grep_matches(void **state)
{
    (void)state;
    size_t n;
    char *demo = slurp("tests/demo.sh", &n);
    assert_non_null(demo);
    const char *at = strstr(demo, "grep -E '^kinfer_(");
    assert_non_null(at);
    at += strlen("grep -E '");
    const char *end = strchr(at, '\'');
    assert_non_null(end);
    char pattern[256];
    assert_true((size_t)(end - at) < sizeof(pattern));
    memcpy(pattern, at, (size_t)(end - at));
    pattern[end - at] = '\0';
    free(demo);
    struct stats *st = stats_new();
    assert_non_null(st);
    stats_consumed(st);
    stats_gen_gauges(st, 1, 0, 0, 0, 16, 0, 0); /* the demo serves a generating model */
    char *text = render(st, clock_mono_us());
    char path[] = "/tmp/kinfer-test-demo-grep-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    free(text);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "grep -E '%s' %s", pattern, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char got[8192];
    size_t g = fread(got, 1, sizeof(got) - 1, p);
    got[g] = '\0';
    pclose(p);
    unlink(path);
    /* each name of the alternation */
    const char *names = strchr(pattern, '(') + 1;
    const char *close_p = strchr(names, ')');
    for (const char *q = names; q < close_p;) {
        const char *bar = memchr(q, '|', (size_t)(close_p - q));
        if (!bar) bar = close_p;
        char want[64];
        snprintf(want, sizeof(want), "\nkinfer_%.*s", (int)(bar - q), q);
        char hay[8200];
        snprintf(hay, sizeof(hay), "\n%s", got);
        if (!strstr(hay, want)) fail_msg("demo.sh's grep finds no kinfer_%.*s in:\n%s", (int)(bar - q), q, got);
        q = bar + 1;
    }
    stats_destroy(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hist_buckets),     cmocka_unit_test(test_counters_render),
        cmocka_unit_test(test_queue_gauges_current),
        cmocka_unit_test(test_demo_grep_matches),
        cmocka_unit_test(test_job_done),         cmocka_unit_test(test_rdkafka_samples),
        cmocka_unit_test(test_rdkafka_edges),    cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_rates_and_drain),  cmocka_unit_test(test_watchdog),
        cmocka_unit_test(test_readiness),      cmocka_unit_test(test_readiness_before_statistics),
        cmocka_unit_test(test_readiness_reasons_say_why),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

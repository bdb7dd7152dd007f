/* test_ops.c - the operations layer with real parts: the HTTP endpoints
 * (metrics.c) scraped with the curl CLI, `kinfer lag` and `kinfer status`
 * run as a user runs them, the broker's control channel, and the shipped
 * ops/ and docker/ files checked with the tools that read them.
 *
 * Proves:
 * - ops/: the alert rules pass `promtool check rules` and their unit tests
 *   (`promtool test rules`); both Prometheus configs pass `promtool check
 *   config`; every YAML file parses (python3-yaml) into the objects it
 *   should hold; the Grafana dashboard is JSON with the panels the issue
 *   asks for; every PromQL expression of the dashboard and of the KEDA
 *   Prometheus trigger parses (as promtool-checked recording rules); every
 *   kinfer_ name in ops/, docker/ and the README is a metric the worker
 *   exports, and every exported family is documented in the README.
 * - docker/Dockerfile's RUNTIME_DEBS is exactly the Debian packages that
 *   hold the shared libraries the built binary needs (readelf, ldd,
 *   dpkg -S); the image builds themselves are not run here.
 * - metrics_start serves /metrics (Prometheus text, passes `promtool
 *   check metrics`), /healthz, /readyz (503 with JSON reasons, then 200),
 *   404/405 for other requests, and reports a port already taken.
 * - `kinfer broker`'s control channel answers each command, refuses bad
 *   ones, and end of input does not stop the broker.
 * - `kinfer lag` with no worker ever run: the whole backlog, per partition
 *   and in total, nothing committed; a missing topic is named.
 * - A worker (kinfer broker + redis-server + the binary): after good jobs,
 *   invalid jobs and undecodable records, /metrics shows queue depth and
 *   in-flight back to 0, kinfer_jobs_total per status/code equal to what
 *   was produced, consumer lag 0 on every partition, histogram counts and
 *   sums that match, every family with its type, and passes promtool;
 *   `kinfer lag` agrees (committed = produced, lag 0); `kinfer status`
 *   lists the worker with its numbers, and no longer after it stops.
 * - /readyz turns 503 (naming the producer) when the broker's brokers are
 *   set down through the control channel, while /healthz stays 200, and
 *   200 again when they come back; the worker then still finishes jobs.
 *
 * Waits poll until a condition holds, with generous limits; no assertion
 * is about how long anything took. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <sys/resource.h>

#include "../codecs/wire.h"
#include "../config/config.h"
#include "../gpu/model.h"
#include "../telemetry/metrics.h"
#include "../telemetry/stats.h"
/* harness.h is header-only with static helpers; this program starts its
 * broker its own way (with a control pipe), so h_start_broker is unused. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "harness.h"
#pragma GCC diagnostic pop
#include "../base/clock.h"
#include "testutil.h"

#define IN_W 8
#define HID_W 16
#define OUT_W 4
#define PARTS 4

/* The binary under test: $KINFER_BIN (make test sets it), else build/kinfer. */
static const char *kinfer_bin(void)
{
    const char *b = getenv("KINFER_BIN");
    return b && *b ? b : "build/kinfer";
}
#define KINFER kinfer_bin()

static char brokers[512];
static int redis_port;
static char model_path[300];
static pid_t broker_pid;
static int ctl_in = -1, ctl_out = -1; /* the broker's stdin and stdout */

/* ---- small process and text helpers -------------------------------------- */

/* Reads one line from fd into buf (without the newline), waiting up to
 * timeout_s. Returns its length, or -1 on timeout or end of input. */
static int read_line(int fd, char *buf, size_t cap, double timeout_s)
{
    size_t n = 0;
    double until = h_now() + timeout_s;
    while (n + 1 < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)((until - h_now()) * 1000);
        if (left <= 0 || poll(&p, 1, left) <= 0) return -1;
        char c;
        if (read(fd, &c, 1) != 1) return -1;
        if (c == '\n') break;
        buf[n++] = c;
    }
    buf[n] = '\0';
    return (int)n;
}

/* Runs a shell command, capturing its stdout into *out (malloc'd, NUL
 * terminated; may be NULL). Returns the exit status, or -1. */
static int run_capture(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
    }
    if (buf) buf[n] = '\0';
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Reads a whole file into a new NUL-terminated buffer, or NULL. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

/* One HTTP request with the curl CLI: the status code (0 when curl could
 * not connect), the body in *body (malloc'd, may be NULL) and the
 * Content-Type in ctype. method is "GET", "HEAD" or "POST". */
static int http(int port, const char *method, const char *path, char **body, char *ctype,
                size_t ccap)
{
    char file[300], cmd[1024];
    snprintf(file, sizeof(file), "%s/http.body", h_dir());
    unlink(file);
    const char *how = strcmp(method, "HEAD") == 0   ? "-I"
                      : strcmp(method, "POST") == 0 ? "-X POST -d x"
                                                    : "";
    snprintf(cmd, sizeof(cmd),
             "curl -sS -m 10 %s -o '%s' -w '%%{http_code} %%{content_type}' "
             "'http://127.0.0.1:%d%s' 2>/dev/null",
             how, file, port, path);
    char *out = NULL;
    run_capture(cmd, &out);
    int code = out ? atoi(out) : 0;
    if (ctype) {
        const char *sp = out ? strchr(out, ' ') : NULL;
        snprintf(ctype, ccap, "%s", sp ? sp + 1 : "");
    }
    free(out);
    if (body) *body = read_file(file);
    return code;
}

/* The value of the sample line that starts with series (name plus
 * labels exactly as rendered), or NAN when there is none. */
static double metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
    }
    return NAN;
}

/* The sum of every sample of family name (its labelled series), and how
 * many there are in *count. */
static double family_sum(const char *text, const char *name, int *count)
{
    size_t n = strlen(name);
    double sum = 0;
    int c = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) != 0 || (p[n] != '{' && p[n] != ' ')) continue;
        const char *sp = strchr(p, ' ');
        if (p[n] == '{') sp = strstr(p, "} ") ? strstr(p, "} ") + 1 : NULL;
        if (!sp) continue;
        sum += strtod(sp + 1, NULL);
        c++;
    }
    if (count) *count = c;
    return sum;
}

/* The families every worker exports, with their types. */
static const struct {
    const char *name, *type;
} families[] = {
    {"kinfer_build_info", "gauge"},           {"kinfer_start_time_seconds", "gauge"},
    {"kinfer_ready", "gauge"},                {"kinfer_healthy", "gauge"},
    {"kinfer_loop_silence_seconds", "gauge"}, {"kinfer_queue_depth_rows", "gauge"},
    {"kinfer_queue_depth_jobs", "gauge"},     {"kinfer_oldest_queued_seconds", "gauge"},
    {"kinfer_inflight_rows", "gauge"},        {"kinfer_inflight_batches", "gauge"},
    {"kinfer_assigned_partitions", "gauge"},  {"kinfer_paused_partitions", "gauge"},
    {"kinfer_consumer_lag", "gauge"},         {"kinfer_kafka_brokers_up", "gauge"},
    {"kinfer_consumed_total", "counter"},     {"kinfer_jobs_total", "counter"},
    {"kinfer_batches_total", "counter"},      {"kinfer_dead_letters_total", "counter"},
    {"kinfer_produce_errors_total", "counter"}, {"kinfer_redis_errors_total", "counter"},
    {"kinfer_heartbeat_errors_total", "counter"}, {"kinfer_batch_rows", "histogram"},
    {"kinfer_queue_seconds", "histogram"},    {"kinfer_infer_seconds", "histogram"},
    {"kinfer_e2e_seconds", "histogram"},      {"kinfer_rows_per_second", "gauge"},
    {"kinfer_jobs_per_second", "gauge"},      {"kinfer_estimated_drain_seconds", "gauge"},
};
#define N_FAMILIES (sizeof(families) / sizeof(families[0]))

/* Every family above is declared in text with its type. */
static void check_families(const char *text)
{
    for (size_t i = 0; i < N_FAMILIES; i++) {
        char line[160];
        snprintf(line, sizeof(line), "# TYPE %s %s\n", families[i].name, families[i].type);
        if (!strstr(text, line)) fail_msg("scrape lacks '%.*s'", (int)strlen(line) - 1, line);
    }
}

/* Saves text to a file and runs `promtool check metrics` on it; fails
 * with promtool's findings. */
static void promtool_metrics(const char *text)
{
    char file[300], cmd[600];
    snprintf(file, sizeof(file), "%s/scrape.txt", h_dir());
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", file);
    char *out = NULL;
    int rc = run_capture(cmd, &out);
    if (rc != 0) fail_msg("promtool check metrics: exit %d\n%s", rc, out ? out : "");
    free(out);
}

/* ---- the embedded broker with its control channel ------------------------- */

/* Starts `kinfer broker` with pipes on stdin and stdout (the harness's
 * h_start_broker closes both), so the test can send control commands. */
static pid_t start_broker_ctl(const char *topics, int partitions)
{
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0) return -1;
    char parts[16], log[300];
    snprintf(parts, sizeof(parts), "%d", partitions);
    snprintf(log, sizeof(log), "%s/broker.log", h_dir());
    char *argv[] = {(char *)KINFER, "broker", "--partitions", parts, "--topics",
                    (char *)topics, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) dup2(fd, 2);
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    setpgid(pid, pid);
    close(in[0]);
    close(out[1]);
    ctl_in = in[1];
    ctl_out = out[0];
    for (int i = 0; i < H_MAX_CHILDREN; i++)
        if (h_children[i] == 0) {
            h_children[i] = pid;
            break;
        }
    if (read_line(ctl_out, brokers, sizeof(brokers), 30) <= 0) return -1;
    return pid;
}

/* Sends one control command and reads its one-line answer. */
static void broker_cmd(const char *cmd, char *answer, size_t cap)
{
    char line[256];
    int n = snprintf(line, sizeof(line), "%s\n", cmd);
    assert_int_equal(write(ctl_in, line, (size_t)n), n);
    if (read_line(ctl_out, answer, cap, 30) < 0) fail_msg("no answer to '%s'", cmd);
}

/* ---- worker configs and jobs ---------------------------------------------- */

/* Writes a config for topic name.jobs (replies name.results, dead letters
 * name.dlq), group g-name, Redis keys "name:", worker id "name-w", the
 * HTTP endpoints on metrics_port (0: none), statistics every 500 ms and a
 * heartbeat every 300 ms. extra_topic, when given, is listed too. */
static const char *write_config(const char *name, int metrics_port, const char *extra_topic)
{
    static char path[300];
    char listen[64] = "";
    if (metrics_port) snprintf(listen, sizeof(listen), "127.0.0.1:%d", metrics_port);
    snprintf(path, sizeof(path), "%s/%s.cfg", h_dir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "kafka = { brokers = \"%s\"; group = \"g-%s\"; topics = [ \"ops.%s.jobs\"%s%s%s ];\n"
            "  reply_topic = \"ops.%s.results\"; dlq_topic = \"ops.%s.dlq\";\n"
            "  properties = ( ( \"auto.commit.interval.ms\", \"200\" ), ( \"fetch.wait.max.ms\", \"10\" ),\n"
            "                 ( \"statistics.interval.ms\", \"500\" ) ); };\n"
            "redis = { host = \"127.0.0.1\"; port = %d; key_prefix = \"%s:\"; ttl_ms = 600000; };\n"
            "batching = { max_batch_rows = 16; max_wait_ms = 5; };\n"
            "models = ( { name = \"demo\"; path = \"%s\";\n"
            "  layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
            "             { op = \"relu\"; },\n"
            "             { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); } );\n"
            "metrics = { listen = \"%s\"; heartbeat_interval_ms = 300; worker_id = \"%s-w\"; };\n"
            "log = { level = \"info\"; };\n",
            brokers, name, name, extra_topic ? ", \"" : "", extra_topic ? extra_topic : "",
            extra_topic ? "\"" : "", name, name, redis_port, name, model_path, listen, name);
    fclose(f);
    return path;
}

/* The worker binary on cfg, its log in the scratch directory. */
static pid_t start_worker(const char *cfg, const char *name)
{
    char log[300];
    snprintf(log, sizeof(log), "%s/%s.worker.log", h_dir(), name);
    char *argv[] = {(char *)KINFER, "worker", "-c", (char *)cfg, NULL};
    return h_spawn(argv, NULL, log);
}

/* Produces one job of rows rows (n_input floats; a wrong count makes an
 * invalid_input job) keyed by id. */
static void produce_job(rd_kafka_t *p, const char *topic, const char *id, size_t n_input)
{
    float in[4 * IN_W];
    for (size_t k = 0; k < n_input; k++) in[k] = tu_randf(-1, 1);
    struct wire_job j = {.id = id, .input = in, .n_input = n_input, .timeout_ms = -1,
                         .priority = -1};
    unsigned char *body;
    size_t len;
    assert_int_equal(wire_encode_job(&j, PROTO_ENC_MSGPACK, &body, &len), 0);
    assert_int_equal(h_produce(p, topic, id, strlen(id), body, len, NULL), 0);
    free(body);
}

/* Polls Redis until every prefix:id exists; returns how many did. */
static size_t wait_keys(const char *prefix, char ids[][32], size_t n, double timeout_s)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    assert_true(c && !c->err);
    size_t found = 0;
    double until = h_now() + timeout_s;
    while (h_now() < until) {
        found = 0;
        for (size_t i = 0; i < n; i++) {
            redisReply *r = redisCommand(c, "EXISTS %s:%s", prefix, ids[i]);
            if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) found++;
            if (r) freeReplyObject(r);
        }
        if (found == n) break;
        h_sleep_ms(100);
    }
    redisFree(c);
    return found;
}

/* Polls /readyz until it answers want; returns the last code, with the
 * last body in *body (malloc'd). */
static int wait_ready(int port, int want, double timeout_s, char **body)
{
    int code = 0;
    double until = h_now() + timeout_s;
    *body = NULL;
    while (h_now() < until) {
        free(*body);
        code = http(port, "GET", "/readyz", body, NULL, 0);
        if (code == want) break;
        h_sleep_ms(200);
    }
    return code;
}

/* Runs `kinfer <cmd> -c cfg --json` and parses its output. */
static json_t *kinfer_json(const char *cmd, const char *cfg)
{
    char line[800];
    snprintf(line, sizeof(line), "%s %s -c '%s' --json 2>>'%s/cli.log'", KINFER, cmd, cfg,
             h_dir());
    char *out = NULL;
    int rc = run_capture(line, &out);
    if (rc != 0) fail_msg("kinfer %s exited %d (see %s/cli.log): %s", cmd, rc, h_dir(),
                          out ? out : "");
    json_error_t e;
    json_t *doc = json_loads(out, 0, &e);
    if (!doc) fail_msg("kinfer %s --json printed no JSON: %s", cmd, out);
    free(out);
    return doc;
}

/* ---- static checks of ops/ and docker/ ------------------------------------- */

/* Runs a command expected to succeed; fails with its output otherwise. */
static void must_pass(const char *cmd)
{
    char *out = NULL;
    int rc = run_capture(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out ? out : "");
    free(out);
}

/* A catalogue of what the worker exports: the families a full snapshot
 * renders (GPU and drain included), as "name type" lines. */
static char *catalogue(void)
{
    struct stats *st = stats_new();
    const char *c = "{\"type\":\"consumer\",\"topics\":{\"t\":{\"topic\":\"t\",\"partitions\":"
                    "{\"0\":{\"partition\":0,\"desired\":true,\"consumer_lag_stored\":0}}}}}";
    const char *p = "{\"type\":\"producer\",\"brokers\":{}}";
    stats_rdkafka_json(st, c, strlen(c));
    stats_rdkafka_json(st, p, strlen(p));
    struct stats_device d = {.index = 0, .busy_ratio = 0.5, .mem_used = 1, .mem_total = 2,
                             .batches = 3};
    stats_set_device(st, 0, &d);
    stats_gen_gauges(st, 1, 1, 0, 2, 8, 0, 0); /* a generating model: its families too */
    stats_alive(st, STATS_LOOP_POLL);
    struct stats_snapshot s;
    assert_int_equal(stats_snapshot(st, clock_mono_us(), &s), 0);
    char *text;
    size_t len;
    assert_int_equal(metrics_render(&s, &text, &len), 0);
    stats_snapshot_fini(&s);
    stats_destroy(st);
    return text;
}

/* The type of family name in the catalogue text, or NULL. */
static const char *family_type(const char *cat, const char *name, char *buf, size_t cap)
{
    char key[160];
    snprintf(key, sizeof(key), "# TYPE %s ", name);
    const char *p = strstr(cat, key);
    if (!p) return NULL;
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    snprintf(buf, cap, "%.*s", (int)n, p);
    return buf;
}

/* Every kinfer_ name in file is an exported family, or a histogram's
 * _bucket/_sum/_count. */
static void check_names_in(const char *file, const char *cat)
{
    char *text = read_file(file);
    if (!text) fail_msg("%s: cannot read", file);
    for (const char *p = text; (p = strstr(p, "kinfer_"));) {
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '-')) {
            p += 7;
            continue;
        }
        size_t n = 7;
        while (islower((unsigned char)p[n]) || isdigit((unsigned char)p[n]) || p[n] == '_') n++;
        char name[128], base[128], t[32];
        snprintf(name, sizeof(name), "%.*s", (int)n, p);
        p += n;
        if (n == 7 || name[n - 1] == '_') continue; /* "kinfer_" as a prefix in prose */
        if (family_type(cat, name, t, sizeof(t))) continue;
        int ok = 0;
        const char *sfx[] = {"_bucket", "_sum", "_count"};
        for (int k = 0; k < 3 && !ok; k++) {
            size_t sl = strlen(sfx[k]);
            if (n > sl && strcmp(name + n - sl, sfx[k]) == 0) {
                snprintf(base, sizeof(base), "%.*s", (int)(n - sl), name);
                ok = family_type(cat, base, t, sizeof(t)) && strcmp(t, "histogram") == 0;
            }
        }
        if (!ok) fail_msg("%s mentions %s, which the worker does not export", file, name);
    }
    free(text);
}

/* The shipped ops/ and docker/ files, checked by the tools that read them. */
static void test_ops_files(void **state)
{
    (void)state;
    /* Prometheus: rules, their unit tests, both scrape configs. */
    must_pass("promtool check rules ops/kinfer-rules.yml 2>&1");
    must_pass("cd ops && promtool test rules kinfer-rules.test.yml 2>&1");
    must_pass("promtool check config ops/prometheus.yml 2>&1");
    must_pass("promtool check config docker/prometheus.yml 2>&1");

    /* YAML documents hold what they should. */
    const struct {
        const char *file, *want;
    } yamls[] = {
        {"ops/keda-scaledobject.yaml", "ScaledObject:kafka"},
        {"ops/keda-scaledobject-prometheus.yaml", "ScaledObject:prometheus"},
        {"ops/kinfer-deployment.yaml",
         "Namespace ConfigMap PersistentVolumeClaim Deployment Service"},
        {"ops/kinfer-statefulset.yaml", "StatefulSet"},
        {"ops/kinfer-podmonitor.yaml", "PodMonitor"},
        {"docker/docker-compose.yml", "grafana kafka kafka-init kinfer kinfer-gpu prometheus redis"},
        {"docker/docker-compose.models.yml", "kinfer"},
        {"docker/grafana/provisioning/datasources/prometheus.yml", "apiVersion datasources"},
        {"docker/grafana/provisioning/dashboards/kinfer.yml", "apiVersion providers"},
    };
    static const char py[] =
        "import sys, yaml\n"
        "docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]\n"
        "d = docs[0]\n"
        "if 'services' in d: print(' '.join(sorted(d['services'])))\n"
        "elif 'kind' in d: print(' '.join(x['kind'] + (':' + ','.join(t['type'] for t in "
        "x['spec']['triggers']) if x['kind'] == 'ScaledObject' else '') for x in docs))\n"
        "else: print(' '.join(sorted(d)))\n";
    char pyfile[300];
    snprintf(pyfile, sizeof(pyfile), "%s/yaml_kinds.py", h_dir());
    FILE *f = fopen(pyfile, "w");
    assert_non_null(f);
    fputs(py, f);
    fclose(f);
    if (access("/usr/bin/python3", X_OK) != 0) fail_msg("/usr/bin/python3 missing: make deps");
    for (size_t i = 0; i < sizeof(yamls) / sizeof(yamls[0]); i++) {
        char cmd[600], *out = NULL;
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 '%s' '%s' 2>&1", pyfile, yamls[i].file);
        int rc = run_capture(cmd, &out);
        size_t n = out ? strcspn(out, "\n") : 0;
        if (rc != 0 || !out || strncmp(out, yamls[i].want, n) != 0 || n != strlen(yamls[i].want))
            fail_msg("%s: expected '%s', got (exit %d) %s", yamls[i].file, yamls[i].want, rc,
                     out ? out : "");
        free(out);
    }

    /* The dashboard: JSON, the panels asked for, every expression valid
     * PromQL (with the KEDA trigger's query) as promtool-checked rules. */
    json_error_t je;
    json_t *dash = json_load_file("ops/grafana-dashboard.json", 0, &je);
    if (!dash) fail_msg("ops/grafana-dashboard.json: line %d: %s", je.line, je.text);
    json_t *panels = json_object_get(dash, "panels");
    assert_true(json_array_size(panels) >= 8);
    const char *titles[] = {"Throughput",         "End-to-end latency",        "Batch rows",
                            "Queue depth and in flight", "Consumer lag by partition", "GPU busy"};
    for (size_t t = 0; t < sizeof(titles) / sizeof(titles[0]); t++) {
        int seen = 0;
        for (size_t i = 0; i < json_array_size(panels); i++)
            seen |= strcmp(json_string_value(json_object_get(json_array_get(panels, i), "title")),
                           titles[t]) == 0;
        if (!seen) fail_msg("dashboard has no panel '%s'", titles[t]);
    }
    char rules[300];
    snprintf(rules, sizeof(rules), "%s/exprs.yml", h_dir());
    f = fopen(rules, "w");
    assert_non_null(f);
    fprintf(f, "groups:\n  - name: exprs\n    rules:\n");
    int n_expr = 0;
    for (size_t i = 0; i < json_array_size(panels); i++) {
        json_t *targets = json_object_get(json_array_get(panels, i), "targets");
        assert_true(json_array_size(targets) >= 1);
        for (size_t k = 0; k < json_array_size(targets); k++) {
            const char *e = json_string_value(json_object_get(json_array_get(targets, k), "expr"));
            assert_non_null(e);
            json_t *js = json_string(e);
            char *q = json_dumps(js, JSON_ENCODE_ANY); /* a YAML-safe quoted string */
            fprintf(f, "      - record: dashboard_expr_%d\n        expr: %s\n", n_expr++, q);
            free(q);
            json_decref(js);
        }
    }
    char *keda = read_file("ops/keda-scaledobject-prometheus.yaml");
    assert_non_null(keda);
    const char *qline = strstr(keda, "query: ");
    assert_non_null(qline);
    fprintf(f, "      - record: keda_query\n        expr: '%.*s'\n", (int)strcspn(qline + 7, "\n"),
            qline + 7);
    assert_non_null(strstr(qline, "kinfer_estimated_drain_seconds"));
    free(keda);
    fclose(f);
    json_decref(dash);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "promtool check rules '%s' 2>&1", rules);
    must_pass(cmd);

    /* Names: everything mentioned exists; everything exported is
     * documented. */
    char *cat = catalogue();
    const char *files[] = {"ops/kinfer-rules.yml", "ops/kinfer-rules.test.yml",
                           "ops/grafana-dashboard.json", "ops/keda-scaledobject-prometheus.yaml",
                           "ops/keda-scaledobject.yaml", "docker/prometheus.yml", "README.md"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) check_names_in(files[i], cat);
    char *readme = read_file("README.md");
    assert_non_null(readme);
    for (const char *p = cat; (p = strstr(p, "# TYPE "));) {
        p += 7;
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(p, " "), p);
        char quoted[140];
        snprintf(quoted, sizeof(quoted), "`%s", name);
        if (!strstr(readme, quoted)) fail_msg("README.md does not document %s", name);
    }
    free(readme);
    free(cat);
}

/* qsort order for the package names. */
static int by_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The packages of the libraries the binary needs, sorted, space-separated,
 * from readelf (what it names), ldd (where they are) and dpkg -S (whose
 * they are). libc6, libgcc-s1 and libstdc++6 are in the base image;
 * CUDA's own libraries, outside Debian's packages, belong to the GPU
 * stage; a sanitizer's runtime belongs to the test build only. */
static void binary_runtime_debs(char *out, size_t cap)
{
    char cmd[1024], *needed = NULL, *ldd = NULL;
    snprintf(cmd, sizeof(cmd), "readelf -d '%s' | sed -n 's/.*Shared library: \\[\\(.*\\)\\]/\\1/p'",
             KINFER);
    assert_int_equal(run_capture(cmd, &needed), 0);
    snprintf(cmd, sizeof(cmd), "ldd '%s'", KINFER);
    assert_int_equal(run_capture(cmd, &ldd), 0);
    char pkgs[64][64];
    size_t np = 0;
    char *save = NULL;
    for (char *lib = strtok_r(needed, "\n", &save); lib; lib = strtok_r(NULL, "\n", &save)) {
        /* The loader, and a sanitizer's runtime in a SANITIZE= build. */
        if (strncmp(lib, "ld-linux", 8) == 0 || strstr(lib, "san.so")) continue;
        char key[200];
        snprintf(key, sizeof(key), "\t%s => ", lib);
        const char *at = strstr(ldd, key);
        if (!at) fail_msg("ldd does not resolve %s", lib);
        at += strlen(key);
        char path[256];
        snprintf(path, sizeof(path), "%.*s", (int)strcspn(at, " \n"), at);
        if (strstr(path, "/cuda")) continue;
        char *owner = NULL;
        snprintf(cmd, sizeof(cmd),
                 "dpkg -S '%s' 2>/dev/null || dpkg -S \"$(readlink -f '%s')\" 2>/dev/null", path,
                 path);
        if (run_capture(cmd, &owner) != 0 || !owner || !*owner)
            fail_msg("%s (%s) belongs to no Debian package", lib, path);
        char pkg[64];
        snprintf(pkg, sizeof(pkg), "%.*s", (int)strcspn(owner, ":"), owner);
        free(owner);
        /* In debian:12-slim already. */
        if (!strcmp(pkg, "libc6") || !strcmp(pkg, "libgcc-s1") || !strcmp(pkg, "libstdc++6"))
            continue;
        int dup = 0;
        for (size_t i = 0; i < np; i++) dup |= strcmp(pkgs[i], pkg) == 0;
        if (!dup && np < 64) snprintf(pkgs[np++], sizeof(pkgs[0]), "%s", pkg);
    }
    free(needed);
    free(ldd);
    qsort(pkgs, np, sizeof(pkgs[0]), by_name);
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < np && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? " " : "", pkgs[i]);
}

/* The runtime images install exactly what the binary links; the CPU
 * image's file never reaches for NVIDIA's repository (a builder that
 * builds every stage of a file would otherwise need it). */
static void test_dockerfile_runtime_deps(void **state)
{
    (void)state;
    char needed[1024];
    binary_runtime_debs(needed, sizeof(needed));
    const char *files[] = {"docker/Dockerfile", "docker/Dockerfile.gpu"};
    for (size_t i = 0; i < 2; i++) {
        char *df = read_file(files[i]);
        assert_non_null(df);
        const char *arg = strstr(df, "\nARG RUNTIME_DEBS=\"");
        if (!arg) fail_msg("%s: no ARG RUNTIME_DEBS", files[i]);
        arg += strlen("\nARG RUNTIME_DEBS=\"");
        char listed[1024];
        snprintf(listed, sizeof(listed), "%.*s", (int)strcspn(arg, "\""), arg);
        if (!strstr(df, "--no-install-recommends ${RUNTIME_DEBS}"))
            fail_msg("%s: its runtime stage does not install RUNTIME_DEBS", files[i]);
        if (!strstr(df, "make deps-build"))
            fail_msg("%s: the build stage must install build packages only (make deps-build)",
                     files[i]);
        if (i == 0 && strstr(df, "nvidia.com"))
            fail_msg("docker/Dockerfile reaches for NVIDIA's repository");
        free(df);
        if (strcmp(listed, needed) != 0)
            fail_msg("%s RUNTIME_DEBS=\"%s\", but %s needs \"%s\"", files[i], listed, KINFER,
                     needed);
    }
}

/* The worker.cfg the Kubernetes manifest mounts is one the worker reads,
 * and its model lives on the mounted models volume. */
static void test_shipped_configmap(void **state)
{
    (void)state;
    char cfgpath[300], cmd[800], *out = NULL;
    snprintf(cfgpath, sizeof(cfgpath), "%s/configmap.cfg", h_dir());
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c 'import sys, yaml\n"
             "d = [x for x in yaml.safe_load_all(open(\"ops/kinfer-deployment.yaml\")) if x]\n"
             "cm = [x for x in d if x[\"kind\"] == \"ConfigMap\"][0]\n"
             "open(sys.argv[1], \"w\").write(cm[\"data\"][\"worker.cfg\"])' '%s' 2>&1",
             cfgpath);
    int rc = run_capture(cmd, &out);
    if (rc != 0) fail_msg("extracting the ConfigMap's worker.cfg: %s", out ? out : "");
    free(out);
    char err[512];
    struct kcfg *c = cfg_load(cfgpath, NULL, 0, err, sizeof(err));
    if (!c) fail_msg("the ConfigMap's worker.cfg: %s", err);
    assert_true(c->n_models >= 1);
    for (size_t i = 0; i < c->n_models; i++)
        if (strncmp(c->models[i].path, "/models/", 8) != 0)
            fail_msg("model %s: path %s is not on the models volume (/models)", c->models[i].name,
                     c->models[i].path);
    cfg_destroy(c);
}

/* ---- the HTTP endpoints in this process ------------------------------------- */

/* metrics_start in this process, on a stats struct filled by hand. */
static void test_http_endpoints(void **state)
{
    (void)state;
    struct stats *st = stats_new();
    struct kcfg c;
    memset(&c, 0, sizeof(c));
    c.metrics.listen = (char *)"127.0.0.1:0";
    c.metrics.watchdog_ms = 60000;
    char err[256];
    struct metrics *m = metrics_start(&c, st, err, sizeof(err));
    if (!m) fail_msg("metrics_start: %s", err);
    int port = metrics_port(m);
    assert_true(port > 0);
    stats_alive(st, STATS_LOOP_POLL);
    stats_job(st, STATS_STATUS_OK, PROTO_OK, 0.001, 0.002, 0.01);
    stats_job(st, STATS_STATUS_OK, PROTO_OK, 0.001, 0.002, 0.01);
    stats_batch(st, STATS_BATCH_SIZE, 2);

    char *body, ctype[128];
    assert_int_equal(http(port, "GET", "/metrics", &body, ctype, sizeof(ctype)), 200);
    assert_string_equal(ctype, "text/plain; version=0.0.4; charset=utf-8");
    assert_true(metric(body, "kinfer_jobs_total{status=\"ok\",code=\"ok\"}") == 2);
    assert_true(metric(body, "kinfer_batch_rows_count") == 1);
    check_families(body);
    promtool_metrics(body);
    free(body);

    assert_int_equal(http(port, "GET", "/healthz", &body, ctype, sizeof(ctype)), 200);
    assert_string_equal(ctype, "application/json");
    assert_non_null(strstr(body, "\"healthy\":true"));
    free(body);

    assert_int_equal(http(port, "GET", "/readyz", &body, ctype, sizeof(ctype)), 503);
    json_error_t je;
    json_t *doc = json_loads(body, 0, &je);
    assert_non_null(doc);
    assert_true(json_is_false(json_object_get(doc, "ready")));
    json_t *reasons = json_object_get(doc, "reasons");
    assert_int_equal(json_array_size(reasons), 4);
    assert_string_equal(json_string_value(json_array_get(reasons, 0)), "model: not loaded");
    json_decref(doc);
    free(body);
    for (int k = 0; k < STATS_N_COND; k++) stats_set_cond(st, (enum stats_cond)k, 1);
    assert_int_equal(http(port, "GET", "/readyz", &body, NULL, 0), 200);
    assert_string_equal(body,
                        "{\"ready\":true,\"reasons\":[],\"backend\":\"cpu\",\"device\":\"cpu\"}\n");
    free(body);

    const struct {
        const char *method, *path;
        int code;
    } others[] = {
        {"GET", "/nope", 404}, {"GET", "/metrics/x", 404}, {"POST", "/metrics", 405},
        {"HEAD", "/metrics", 200}, {"GET", "/", 200},
    };
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        int code = http(port, others[i].method, others[i].path, NULL, NULL, 0);
        if (code != others[i].code)
            fail_msg("%s %s: %d, expected %d", others[i].method, others[i].path, code,
                     others[i].code);
    }

    /* The same port again: refused, saying why. */
    char taken[64];
    snprintf(taken, sizeof(taken), "127.0.0.1:%d", port);
    c.metrics.listen = taken;
    assert_null(metrics_start(&c, st, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot listen"));
    /* what the system said, not a remark of libmicrohttpd's about its options */
    if (!strstr(err, strerror(EADDRINUSE)) || strstr(err, "MHD_OPTION"))
        fail_msg("the refusal says: %s", err);
    /* Empty: a server that serves nothing. */
    c.metrics.listen = (char *)"";
    struct metrics *none = metrics_start(&c, st, err, sizeof(err));
    assert_non_null(none);
    assert_int_equal(metrics_port(none), 0);
    metrics_stop(none);
    metrics_stop(m);
    stats_destroy(st);
}

/* ---- the broker's control channel -------------------------------------------- */

/* Every control command answered; bad ones refused with the reason. */
static void test_broker_control(void **state)
{
    (void)state;
    const struct {
        const char *cmd, *answer; /* answer: exact, or a prefix ending in '*' */
    } cases[] = {
        {"ping", "ok"},
        {"  ping  ", "ok"},
        {"rtt 1 0", "ok"},
        {"rtt all 0", "ok"},
        {"error DeleteTopics 2 NOT_LEADER_FOR_PARTITION", "ok"},
        {"error 20 1 6", "ok"},
        {"leader ops.lag.jobs 0 1", "ok"},
        {"coordinator g-nobody 1", "ok"},
        {"down 2", "error broker id must be 1..1 or all"},
        {"up x", "error broker id must be 1..1 or all"},
        {"rtt 1 -5", "error rtt: ms must be 0..3600000"},
        {"error NoSuchApi 1 6", "error unknown ApiKey 'NoSuchApi'"},
        {"error Fetch 0 6", "error count must be*"},
        {"error Fetch 1 NOT_AN_ERROR", "error unknown error code 'NOT_AN_ERROR'"},
        {"leader ops.lag.jobs x 1", "error leader: bad partition or broker id"},
        {"bogus", "error unknown command or wrong arguments: bogus*"},
        {"down", "error unknown command or wrong arguments: down*"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char answer[512];
        broker_cmd(cases[i].cmd, answer, sizeof(answer));
        size_t n = strlen(cases[i].answer);
        int ok = cases[i].answer[n - 1] == '*' ? strncmp(answer, cases[i].answer, n - 1) == 0
                                               : strcmp(answer, cases[i].answer) == 0;
        if (!ok) fail_msg("'%s' answered '%s', expected '%s'", cases[i].cmd, answer, cases[i].answer);
    }
    /* The injected DeleteTopics errors are harmless: nothing deletes. */
}

/* ---- kinfer lag with no worker -------------------------------------------------- */

#define N_LAG 40

/* A backlog no worker ever read: all of it is lag, nothing committed. */
static void test_lag_without_worker(void **state)
{
    (void)state;
    rd_kafka_t *p = h_producer(brokers);
    for (int i = 0; i < N_LAG; i++) {
        char id[32];
        snprintf(id, sizeof(id), "lag-%d", i);
        produce_job(p, "ops.lag.jobs", id, IN_W);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    const char *cfg = write_config("lag", 0, "ops.nosuch");
    json_t *doc = kinfer_json("lag", cfg);
    assert_string_equal(json_string_value(json_object_get(doc, "group")), "g-lag");
    assert_int_equal(json_integer_value(json_object_get(doc, "total_lag")), N_LAG);
    json_t *parts = json_object_get(doc, "partitions");
    assert_int_equal(json_array_size(parts), PARTS);
    json_int_t high = 0, lag = 0;
    for (size_t i = 0; i < json_array_size(parts); i++) {
        json_t *r = json_array_get(parts, i);
        assert_string_equal(json_string_value(json_object_get(r, "topic")), "ops.lag.jobs");
        assert_int_equal(json_integer_value(json_object_get(r, "partition")), (json_int_t)i);
        assert_true(json_is_null(json_object_get(r, "committed"))); /* never consumed */
        high += json_integer_value(json_object_get(r, "high"));
        lag += json_integer_value(json_object_get(r, "lag"));
    }
    assert_int_equal(high, N_LAG);
    assert_int_equal(lag, N_LAG);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(doc, "topics"),
                                                        "ops.lag.jobs")), N_LAG);
    json_t *missing = json_object_get(doc, "missing_topics");
    assert_int_equal(json_array_size(missing), 1);
    assert_string_equal(json_string_value(json_array_get(missing, 0)), "ops.nosuch");
    json_decref(doc);

    /* The table says the same. */
    char cmd[600], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s lag -c '%s' 2>>'%s/cli.log'", KINFER, cfg, h_dir());
    assert_int_equal(run_capture(cmd, &out), 0);
    char want[64];
    snprintf(want, sizeof(want), "total lag %d\n", N_LAG);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "topic ops.nosuch: not found in the cluster"));
    free(out);
    /* Unreachable brokers: an error, not a hang or a zero. */
    snprintf(cmd, sizeof(cmd), "%s lag -c '%s' --set kafka.brokers=127.0.0.1:1 --timeout 2 "
             ">/dev/null 2>>'%s/cli.log'", KINFER, cfg, h_dir());
    assert_int_equal(run_capture(cmd, NULL), 1);
}

/* ---- a worker, scraped ------------------------------------------------------------ */

#define N_OK 60
#define N_BAD 5
#define N_DEAD 3

/* Good, invalid and undecodable records through a real worker, then its
 * numbers as /metrics, `kinfer lag` and `kinfer status` report them. */
static void test_worker_metrics(void **state)
{
    (void)state;
    int port = h_free_port();
    const char *cfg = write_config("run", port, NULL);
    pid_t w = start_worker(cfg, "run");
    char *body = NULL;
    assert_int_equal(wait_ready(port, 200, 60, &body), 200);
    free(body);

    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_OK + N_BAD][32];
    size_t rows = 0;
    for (int i = 0; i < N_OK; i++) {
        snprintf(ids[i], sizeof(ids[i]), "ok-%d", i);
        size_t r = i % 5 == 0 ? 2 : 1;
        rows += r;
        produce_job(p, "ops.run.jobs", ids[i], r * IN_W);
    }
    for (int i = 0; i < N_BAD; i++) {
        snprintf(ids[N_OK + i], sizeof(ids[0]), "bad-%d", i);
        produce_job(p, "ops.run.jobs", ids[N_OK + i], IN_W - 1);
    }
    const unsigned char garbage[] = {0xc1, 0x00, 0x01};
    for (int i = 0; i < N_DEAD; i++)
        assert_int_equal(h_produce(p, "ops.run.jobs", NULL, 0, garbage, sizeof(garbage), NULL), 0);
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);
    assert_int_equal(wait_keys("run", ids, N_OK + N_BAD, 60), N_OK + N_BAD);

    const int total = N_OK + N_BAD + N_DEAD;
    /* First the brokers' view, independent of the worker's own numbers:
     * every record committed (`kinfer lag`, and librdkafka asked
     * directly). The worker's lag gauge comes from librdkafka's periodic
     * statistics, so only reports after this point must show 0. */
    json_t *doc = NULL;
    double until = h_now() + 60;
    json_int_t committed = 0;
    while (h_now() < until) {
        json_decref(doc);
        doc = kinfer_json("lag", cfg);
        committed = 0;
        json_t *parts = json_object_get(doc, "partitions");
        for (size_t i = 0; i < json_array_size(parts); i++)
            committed += json_integer_value(json_object_get(json_array_get(parts, i), "committed"));
        if (committed == total) break;
        h_sleep_ms(300);
    }
    assert_int_equal(committed, total);
    assert_int_equal(json_integer_value(json_object_get(doc, "total_lag")), 0);
    json_decref(doc);
    /* ... and so does librdkafka asked directly. */
    assert_int_equal(h_committed_sum(brokers, "g-run", "ops.run.jobs", PARTS), total);

    /* Then poll the endpoint until everything has settled: nothing queued
     * or in flight, every job counted, every partition's lag 0. */
    char *text = NULL;
    int settled = 0;
    until = h_now() + 60;
    while (!settled && h_now() < until) {
        free(text);
        text = NULL;
        if (http(port, "GET", "/metrics", &text, NULL, 0) == 200 && text) {
            int n_lag;
            double lag = family_sum(text, "kinfer_consumer_lag", &n_lag);
            settled = metric(text, "kinfer_queue_depth_rows") == 0 &&
                      metric(text, "kinfer_queue_depth_jobs") == 0 &&
                      metric(text, "kinfer_inflight_rows") == 0 &&
                      metric(text, "kinfer_inflight_batches") == 0 &&
                      family_sum(text, "kinfer_jobs_total", NULL) == total && n_lag == PARTS &&
                      lag == 0;
        }
        if (!settled) h_sleep_ms(200);
    }
    if (!settled) fail_msg("metrics did not settle; last scrape:\n%s", text ? text : "(none)");

    const struct {
        const char *series;
        double want;
    } want[] = {
        {"kinfer_jobs_total{status=\"ok\",code=\"ok\"}", N_OK},
        {"kinfer_jobs_total{status=\"error\",code=\"invalid_input\"}", N_BAD},
        {"kinfer_jobs_total{status=\"error\",code=\"unknown_model\"}", 0},
        {"kinfer_jobs_total{status=\"dead_letter\",code=\"invalid_input\"}", N_DEAD},
        {"kinfer_consumed_total", total},
        {"kinfer_dead_letters_total", N_DEAD},
        {"kinfer_batch_rows_sum", (double)rows},
        {"kinfer_queue_seconds_count", N_OK},
        {"kinfer_infer_seconds_count", N_OK},
        {"kinfer_e2e_seconds_count", N_OK + N_BAD},
        {"kinfer_e2e_seconds_bucket{le=\"+Inf\"}", N_OK + N_BAD},
        {"kinfer_assigned_partitions", PARTS},
        {"kinfer_paused_partitions", 0},
        {"kinfer_oldest_queued_seconds", 0},
        {"kinfer_ready", 1},
        {"kinfer_healthy", 1},
        {"kinfer_produce_errors_total", 0},
        {"kinfer_redis_errors_total", 0},
        {"kinfer_kafka_brokers_up{client=\"producer\"}", 1},
        {"kinfer_consumer_lag{topic=\"ops.run.jobs\",partition=\"0\"}", 0},
        {"kinfer_consumer_lag{topic=\"ops.run.jobs\",partition=\"3\"}", 0},
        {"kinfer_estimated_drain_seconds", 0},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        double v = metric(text, want[i].series);
        if (v != want[i].want) fail_msg("%s = %g, expected %g", want[i].series, v, want[i].want);
    }
    assert_true(metric(text, "kinfer_batch_rows_count") == family_sum(text, "kinfer_batches_total", NULL));
    assert_true(metric(text, "kinfer_batch_rows_count") >= 1);
    assert_true(metric(text, "kinfer_jobs_per_second") >= 0);
    assert_non_null(strstr(text, "kinfer_loop_silence_seconds{loop=\"executor-0\"}"));
    assert_non_null(strstr(text, "kinfer_build_info{version=\""));
    assert_null(strstr(text, "kinfer_gpu_busy_ratio")); /* CPU backend */
    check_families(text);
    promtool_metrics(text);
    free(text);

    char *health;
    assert_int_equal(http(port, "GET", "/healthz", &health, NULL, 0), 200);
    const char *loops[] = {"\"poll\":", "\"sink\":", "\"heartbeat\":", "\"executor-0\":"};
    for (int i = 0; i < 4; i++)
        if (!strstr(health, loops[i])) fail_msg("/healthz lacks %s: %s", loops[i], health);
    free(health);

    /* kinfer status lists this worker with its numbers. */
    json_t *me = NULL;
    until = h_now() + 30;
    doc = NULL;
    /* Heartbeats come every 300 ms: wait for one written after the end. */
    while (h_now() < until) {
        json_decref(doc);
        doc = kinfer_json("status", cfg);
        json_t *ws = json_object_get(doc, "workers");
        me = json_array_size(ws) == 1 ? json_array_get(ws, 0) : NULL;
        if (me && json_integer_value(json_object_get(me, "jobs_done")) == total &&
            json_integer_value(json_object_get(me, "lag")) == 0)
            break;
        h_sleep_ms(300);
    }
    assert_non_null(me);
    assert_string_equal(json_string_value(json_object_get(doc, "group")), "g-run");
    assert_string_equal(json_string_value(json_object_get(me, "id")), "run-w");
    assert_int_equal(json_integer_value(json_object_get(me, "jobs_done")), total);
    assert_int_equal(json_integer_value(json_object_get(me, "assigned")), PARTS);
    assert_int_equal(json_integer_value(json_object_get(me, "lag")), 0);
    assert_int_equal(json_integer_value(json_object_get(me, "queue_rows")), 0);
    assert_int_equal(json_integer_value(json_object_get(me, "pid")), w);
    assert_true(json_is_true(json_object_get(me, "ready")));
    assert_true(json_is_true(json_object_get(me, "healthy")));
    assert_string_equal(json_string_value(json_object_get(me, "backend")), "cpu");
    assert_string_equal(json_string_value(json_object_get(me, "device")), "cpu");
    assert_int_equal(json_array_size(json_object_get(me, "partitions")), PARTS);
    json_decref(doc);
    char cmd[600], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s status -c '%s' 2>>'%s/cli.log'", KINFER, cfg, h_dir());
    assert_int_equal(run_capture(cmd, &out), 0);
    assert_non_null(strstr(out, "group g-run: 1 live worker\n"));
    assert_non_null(strstr(out, " BACKEND "));
    /* the age column says what it is: the heartbeat's age, not uptime */
    assert_non_null(strstr(out, " HEARTBEAT_AGE_S"));
    assert_null(strstr(out, " AGE_S"));
    free(out);
    /* --json: the same name, and numbers as written, rounded (no
     * 0.10299999999999999) */
    snprintf(cmd, sizeof(cmd), "%s status -c '%s' --json 2>>'%s/cli.log'", KINFER, cfg, h_dir());
    assert_int_equal(run_capture(cmd, &out), 0);
    assert_non_null(strstr(out, "\"heartbeat_age_s\":"));
    assert_null(strstr(out, "\"age_s\":"));
    for (const char *q = out; *q; q++) {
        if (*q != '.') continue;
        size_t digits = strspn(q + 1, "0123456789");
        if (digits > 9) fail_msg("kinfer status --json prints a number of %zu decimals: %s", digits, out);
    }
    free(out);
    snprintf(cmd, sizeof(cmd), "%s status -c '%s' 2>>'%s/cli.log'", KINFER, cfg, h_dir());
    assert_int_equal(run_capture(cmd, &out), 0);
    assert_non_null(strstr(out, "\nrun-w "));
    assert_non_null(strstr(out, " cpu "));
    free(out);

    /* Stopped cleanly: exit 0, and its heartbeat is gone at once. */
    assert_int_equal(h_stop(w, SIGTERM, 60), 0);
    doc = kinfer_json("status", cfg);
    assert_int_equal(json_array_size(json_object_get(doc, "workers")), 0);
    json_decref(doc);
}

/* ---- ready before the first statistics ------------------------------------------- */

/* librdkafka's statistics are held back a minute here, so readiness can
 * only come from what the clients' own calls show (a producer holding
 * cluster metadata, a consumer with a group member id): /readyz must
 * answer 200 within seconds of the group join, not after the first
 * statistics (5 s by default, a minute here). */
static void test_ready_before_statistics(void **state)
{
    (void)state;
    int port = h_free_port();
    const char *cfg = write_config("early", port, NULL);
    char log[300];
    snprintf(log, sizeof(log), "%s/early.worker.log", h_dir());
    char *argv[] = {(char *)KINFER, "worker", "-c", (char *)cfg, "--set",
                    "kafka.properties.statistics.interval.ms=60000", NULL};
    double t0 = h_now();
    pid_t w = h_spawn(argv, NULL, log);
    char *body = NULL;
    int code = wait_ready(port, 200, 30, &body);
    double took = h_now() - t0;
    if (code != 200) fail_msg("/readyz %d after %.1f s: %s", code, took, body ? body : "");
    fprintf(stderr, "test_ops: ready %.1f s after start, statistics every 60 s\n", took);
    free(body);
    assert_int_equal(h_stop(w, SIGTERM, 60), 0);
}

/* ---- probes answered whatever idle sockets are open ---------------------------- */

/* One GET of path on 127.0.0.1:port with a deadline of timeout_s for the
 * whole exchange (connect, send, the status line): the status code, or 0
 * when none came in time. */
static int probe(int port, const char *path, double timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (long)timeout_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int code = 0;
    double until = h_now() + timeout_s;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        char req[128], buf[256];
        int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                         path);
        if (send(fd, req, (size_t)n, MSG_NOSIGNAL) == n) {
            size_t got = 0;
            while (got < 12 && h_now() < until) {
                ssize_t r = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
                if (r <= 0) break;
                got += (size_t)r;
            }
            buf[got] = '\0';
            if (got >= 12 && strncmp(buf, "HTTP/1.", 7) == 0 && h_now() <= until)
                code = atoi(buf + 9);
        }
    }
    close(fd);
    return code;
}

/* The port a worker logged it listens on (metrics_listening ... port=N),
 * waiting up to timeout_s for the line. */
static int logged_port(const char *log, double timeout_s)
{
    double until = h_now() + timeout_s;
    while (h_now() < until) {
        char *text = read_file(log);
        const char *l = text ? strstr(text, "event=metrics_listening") : NULL;
        const char *p = l ? strstr(l, " port=") : NULL;
        int port = p ? atoi(p + 6) : 0;
        free(text);
        if (port > 0) return port;
        h_sleep_ms(50);
    }
    return 0;
}

#define N_IDLE 1000

/* metrics.listen with port 0: the worker picks a free port and logs it.
 * Then 1,000 connections from 127.0.0.2 are opened and left idle (a
 * loopback alias, no setup needed): a probe from 127.0.0.1 must still get
 * its 200 within a second, /healthz, /readyz and /metrics alike. */
static void test_idle_sockets_do_not_block_probes(void **state)
{
    (void)state;
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < N_IDLE + 256) {
        rl.rlim_cur = rl.rlim_max < N_IDLE + 256 ? rl.rlim_max : N_IDLE + 256;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < N_IDLE + 64) skip();
    const char *cfg = write_config("idle", 0, NULL);
    char log[300];
    snprintf(log, sizeof(log), "%s/idle.worker.log", h_dir());
    char *argv[] = {(char *)KINFER, "worker", "-c", (char *)cfg, "--set",
                    "metrics.listen=127.0.0.1:0", NULL};
    pid_t w = h_spawn(argv, NULL, log);
    int port = logged_port(log, 30);
    if (!port) fail_msg("no metrics_listening line with a port in %s", log);
    fprintf(stderr, "test_ops: metrics.listen 127.0.0.1:0 took port %d\n", port);
    char *body = NULL;
    assert_int_equal(wait_ready(port, 200, 60, &body), 200);
    free(body);

    static int fds[N_IDLE];
    int opened = 0;
    for (int i = 0; i < N_IDLE; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        assert_true(fd >= 0);
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002)};
        struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
        if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) == 0 || errno == EINPROGRESS)
            opened++;
        fds[i] = fd;
    }
    h_sleep_ms(300); /* the server has seen them all */
    fprintf(stderr, "test_ops: %d idle connections from 127.0.0.2\n", opened);
    static const char *const paths[] = {"/healthz", "/readyz", "/metrics"};
    double slowest = 0;
    for (int round = 0; round < 3; round++) {
        for (size_t k = 0; k < 3; k++) {
            double t0 = h_now();
            int code = probe(port, paths[k], 1.0);
            double took = h_now() - t0;
            if (code != 200)
                fail_msg("%s from 127.0.0.1 with %d idle connections open: %d after %.2f s",
                         paths[k], opened, code, took);
            if (took > slowest) slowest = took;
        }
    }
    fprintf(stderr, "test_ops: 9 probes answered 200, the slowest in %.1f ms\n", slowest * 1e3);
    for (int i = 0; i < N_IDLE; i++) close(fds[i]);
    assert_int_equal(h_stop(w, SIGTERM, 60), 0);
}

/* ---- readiness says what failed, and the log stays small -------------------------- */

/* Polls /readyz until its body contains needle; returns the last body. */
static char *wait_reason(int port, const char *needle, double timeout_s)
{
    double until = h_now() + timeout_s;
    char *body = NULL;
    while (h_now() < until) {
        free(body);
        body = NULL;
        http(port, "GET", "/readyz", &body, NULL, 0);
        if (body && strstr(body, needle)) break;
        h_sleep_ms(200);
    }
    return body;
}

/* Size of a file in bytes (0 when it cannot be read). */
static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

#define N_SICK 200

/* Redis that answers but refuses (OOM: maxmemory 1) and a broker that
 * refuses every Produce (TOPIC_AUTHORIZATION_FAILED, injected through the
 * control channel): /readyz turns 503 and says what Redis or the broker
 * said, the heartbeat's view ("redis: OOM ...") and the sink's ("sink:
 * redis: ...", "sink: kafka: ..."); the log grows by a few lines a second,
 * not one per job per retry; when the fault clears, readiness comes back
 * and every job is delivered. Batches sleep 1.5 s so that the results are
 * produced after the fault is set. */
static void test_readyz_names_the_failure(void **state)
{
    (void)state;
    int port = h_free_port();
    const char *cfg = write_config("sick", port, NULL);
    char log[300], answer[256];
    snprintf(log, sizeof(log), "%s/sick.worker.log", h_dir());
    char *argv[] = {(char *)KINFER, "worker", "-c", (char *)cfg, "--set",
                    "debug.batch_sleep_ms=1500", NULL};
    pid_t w = h_spawn(argv, NULL, log);
    char *body = NULL;
    assert_int_equal(wait_ready(port, 200, 60, &body), 200);
    free(body);
    redisContext *rc = redisConnect("127.0.0.1", redis_port);
    assert_true(rc && !rc->err);

    /* Redis out of memory: every write refused. */
    redisReply *r = redisCommand(rc, "CONFIG SET maxmemory 1");
    freeReplyObject(r);
    rd_kafka_t *p = h_producer(brokers);
    static char ids[N_SICK][32];
    for (int i = 0; i < 5; i++) {
        snprintf(ids[i], sizeof(ids[i]), "oom-%d", i);
        produce_job(p, "ops.sick.jobs", ids[i], IN_W);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    body = wait_reason(port, "sink: redis: OOM", 30);
    r = redisCommand(rc, "CONFIG SET maxmemory 0");
    freeReplyObject(r);
    if (!body || !strstr(body, "sink: redis: OOM")) fail_msg("/readyz during OOM: %s", body);
    assert_non_null(strstr(body, "\"redis: OOM command not allowed"));
    fprintf(stderr, "test_ops: /readyz with Redis out of memory: %s", body);
    free(body);
    assert_int_equal(wait_ready(port, 200, 30, &body), 200);
    free(body);
    assert_int_equal(wait_keys("sick", ids, 5, 30), 5);

    /* Every Produce refused by the broker. */
    for (int i = 0; i < N_SICK; i++) {
        snprintf(ids[i], sizeof(ids[i]), "auth-%d", i);
        produce_job(p, "ops.sick.jobs", ids[i], IN_W);
    }
    assert_int_equal(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);
    broker_cmd("error Produce 10000 TOPIC_AUTHORIZATION_FAILED", answer, sizeof(answer));
    assert_string_equal(answer, "ok");
    body = wait_reason(port, "sink: kafka: ", 30);
    long size0 = file_size(log);
    h_sleep_ms(5000);
    double kb_per_s = (double)(file_size(log) - size0) / 1024.0 / 5.0;
    char *during = wait_reason(port, "sink: kafka: ", 1);
    broker_cmd("clear Produce", answer, sizeof(answer));
    if (!body || !strstr(body, "sink: kafka: ")) fail_msg("/readyz while Produce fails: %s", body);
    fprintf(stderr, "test_ops: /readyz while every Produce fails: %s", during ? during : body);
    fprintf(stderr, "test_ops: the log grew %.1f KB/s meanwhile\n", kb_per_s);
    free(body);
    free(during);
    assert_true(kb_per_s < 8.0);
    assert_int_equal(wait_ready(port, 200, 60, &body), 200);
    free(body);
    assert_int_equal(wait_keys("sick", ids, N_SICK, 60), N_SICK);
    redisFree(rc);
    assert_int_equal(h_stop(w, SIGTERM, 60), 0);
}

/* ---- readiness follows the brokers ------------------------------------------------ */

/* Brokers down: not ready (but alive); brokers back: ready, and working. */
static void test_readyz_follows_brokers(void **state)
{
    (void)state;
    int port = h_free_port();
    const char *cfg = write_config("flip", port, NULL);
    pid_t w = start_worker(cfg, "flip");
    char *body = NULL, answer[256];
    assert_int_equal(wait_ready(port, 200, 60, &body), 200);
    free(body);

    broker_cmd("down all", answer, sizeof(answer));
    assert_string_equal(answer, "ok");
    int code = wait_ready(port, 503, 60, &body);
    if (code != 503) fail_msg("/readyz stayed %d with the brokers down: %s", code, body);
    assert_non_null(strstr(body, "producer: no connection to any Kafka broker"));
    free(body);
    /* Kafka being away is not the process being stuck. */
    assert_int_equal(http(port, "GET", "/healthz", NULL, NULL, 0), 200);
    char *text;
    assert_int_equal(http(port, "GET", "/metrics", &text, NULL, 0), 200);
    assert_true(metric(text, "kinfer_ready") == 0);
    assert_true(metric(text, "kinfer_kafka_brokers_up{client=\"producer\"}") == 0);
    free(text);

    broker_cmd("up all", answer, sizeof(answer));
    assert_string_equal(answer, "ok");
    code = wait_ready(port, 200, 120, &body);
    if (code != 200) fail_msg("/readyz stayed %d with the brokers back: %s", code, body);
    free(body);

    /* And it still works. */
    rd_kafka_t *p = h_producer(brokers);
    static char ids[10][32];
    for (int i = 0; i < 10; i++) {
        snprintf(ids[i], sizeof(ids[i]), "after-%d", i);
        produce_job(p, "ops.flip.jobs", ids[i], IN_W);
    }
    assert_int_equal(rd_kafka_flush(p, 30000), 0);
    rd_kafka_destroy(p);
    assert_int_equal(wait_keys("flip", ids, 10, 90), 10);
    assert_int_equal(h_stop(w, SIGTERM, 60), 0);
}

/* ---- a stop bounded with the broker frozen ------------------------------------------ */

/* A broker that takes connections and answers nothing (frozen with
 * SIGSTOP here; an overloaded or half-dead broker, or one starved of CPU,
 * looks the same) must not hold the stop past worker.drain_timeout_ms:
 * the commit and the consumer's close give up at the drain deadline and
 * the process exits 0. librdkafka's own close (and its destroy) waited for
 * the group to wind down without a bound: this stop took minutes. */
static void test_stop_with_frozen_broker(void **state)
{
    (void)state;
    int port = h_free_port();
    const char *cfg = write_config("frozen", port, NULL);
    FILE *f = fopen(cfg, "a");
    assert_non_null(f);
    fprintf(f, "worker = { drain_timeout_ms = 2000; };\n");
    fclose(f);
    pid_t w = start_worker(cfg, "frozen");
    char *body = NULL;
    assert_int_equal(wait_ready(port, 200, 60, &body), 200);
    free(body);
    /* Work done first: the group has a member, offsets, connections. */
    rd_kafka_t *p = h_producer(brokers);
    static char ids[10][32];
    for (int i = 0; i < 10; i++) {
        snprintf(ids[i], sizeof(ids[i]), "frozen-%d", i);
        produce_job(p, "ops.frozen.jobs", ids[i], IN_W);
    }
    assert_int_equal(rd_kafka_flush(p, 30000), 0);
    rd_kafka_destroy(p);
    assert_int_equal(wait_keys("frozen", ids, 10, 90), 10);
    int64_t committed = 0;
    for (double until = h_now() + 60; h_now() < until && committed < 10; h_sleep_ms(100))
        committed = h_committed_sum(brokers, "g-frozen", "ops.frozen.jobs", PARTS);
    assert_int_equal(committed, 10);

    assert_int_equal(kill(broker_pid, SIGSTOP), 0);
    h_sleep_ms(1000); /* requests in flight to the frozen broker */
    int st = h_stop(w, SIGTERM, 30);
    assert_int_equal(kill(broker_pid, SIGCONT), 0);
    char log[300];
    snprintf(log, sizeof(log), "%s/frozen.worker.log", h_dir());
    if (st != 0)
        fail_msg("the worker %s SIGTERM with the broker frozen (see %s)",
                 st < 0 ? "was still running 30 s after" : "exited non-zero after", log);
    char *text = read_file(log);
    assert_non_null(text);
    assert_non_null(strstr(text, "event=consumer_close_timeout"));
    free(text);
}

/* ---- a stop bounded when a step never returns ---------------------------------------- */

/* An executor that never returns (debug.hang_id) cannot be joined, and the
 * watchdog (rule 7) only watches the running loop: the stop waited for it
 * forever. The stop's guard ends the process drain_timeout_ms + 5 s after
 * the signal, non-zero, naming the step it was stuck in. */
static void test_stop_with_hung_executor(void **state)
{
    (void)state;
    int port = h_free_port();
    const char *cfg = write_config("stuck", port, NULL);
    FILE *f = fopen(cfg, "a");
    assert_non_null(f);
    fprintf(f, "worker = { drain_timeout_ms = 1000; };\ndebug = { hang_id = \"stuck-0\"; };\n");
    fclose(f);
    pid_t w = start_worker(cfg, "stuck");
    char *body = NULL;
    assert_int_equal(wait_ready(port, 200, 60, &body), 200);
    free(body);
    rd_kafka_t *p = h_producer(brokers);
    produce_job(p, "ops.stuck.jobs", "stuck-0", IN_W);
    assert_int_equal(rd_kafka_flush(p, 30000), 0);
    rd_kafka_destroy(p);
    char log[300];
    snprintf(log, sizeof(log), "%s/stuck.worker.log", h_dir());
    char *text = NULL;
    for (double until = h_now() + 60; h_now() < until; h_sleep_ms(50)) {
        free(text);
        text = read_file(log);
        if (text && strstr(text, "event=debug_hang")) break;
    }
    assert_non_null(text);
    assert_non_null(strstr(text, "event=debug_hang"));
    free(text);
    int st = h_stop(w, SIGTERM, 30);
    if (st != 2) fail_msg("the stop with a hung executor: exit %d (want 2; -1: still running "
                          "30 s after SIGTERM); see %s", st, log);
    text = read_file(log);
    assert_non_null(text);
    assert_non_null(strstr(text, "event=stop_stuck step=executors"));
    free(text);
}

/* ---- end of the control channel's input ---------------------------------------------- */

/* End of the control channel's input leaves the broker serving. */
static void test_broker_outlives_stdin(void **state)
{
    (void)state;
    close(ctl_in);
    ctl_in = -1;
    /* The broker must still serve: `kinfer lag` needs its metadata. */
    const char *cfg = write_config("lag", 0, NULL);
    json_t *doc = kinfer_json("lag", cfg);
    assert_int_equal(json_integer_value(json_object_get(doc, "total_lag")), N_LAG);
    json_decref(doc);
    int st;
    assert_false(h_exited(broker_pid, &st));
}

/* `kinfer broker --port N`: the bootstrap line is 127.0.0.1:N, and a
 * client given that address alone produces and reads metadata (it finds
 * the brokers through it); a port already taken is refused with the
 * system's reason. */
static void test_broker_fixed_port(void **state)
{
    (void)state;
    int port = h_free_port();
    char ps[16], log[300];
    snprintf(ps, sizeof(ps), "%d", port);
    snprintf(log, sizeof(log), "%s/broker-port.log", h_dir());
    char *argv[] = {(char *)KINFER, "broker", "--port", ps, "--topics", "ops.port.jobs", NULL};
    int fd;
    pid_t pid = h_spawn(argv, &fd, log);
    char line[128];
    size_t n = 0;
    char c;
    while (n + 1 < sizeof(line) && read(fd, &c, 1) == 1 && c != '\n') line[n++] = c;
    line[n] = '\0';
    close(fd);
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    assert_string_equal(line, want);
    rd_kafka_t *p = h_producer(want);
    assert_non_null(p);
    assert_int_equal(h_produce(p, "ops.port.jobs", "k", 1, "v", 1, NULL), 0);
    assert_int_equal(rd_kafka_flush(p, 20000), 0);
    const struct rd_kafka_metadata *md = NULL;
    assert_int_equal(rd_kafka_metadata(p, 1, NULL, &md, 10000), 0);
    assert_true(md->broker_cnt >= 1);
    rd_kafka_metadata_destroy(md);
    rd_kafka_destroy(p);
    /* a second one on the same port: refused, saying why */
    snprintf(log, sizeof(log), "%s/broker-port2.log", h_dir());
    char *argv2[] = {(char *)KINFER, "broker", "--port", ps, NULL};
    pid_t pid2 = h_spawn(argv2, NULL, log);
    int st = 0;
    for (int i = 0; i < 200 && !h_exited(pid2, &st); i++) h_sleep_ms(50);
    assert_int_equal(st, 1);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char buf[1024];
    size_t got = fread(buf, 1, sizeof(buf) - 1, f);
    buf[got] = '\0';
    fclose(f);
    if (!strstr(buf, "Address already in use")) fail_msg("the refusal says: %s", buf);
    kill(pid, SIGTERM);
    for (int i = 0; i < 200 && !h_exited(pid, &st); i++) h_sleep_ms(50);
}

/* One broker (with its control pipe), one Redis and the model for all. */
static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    snprintf(model_path, sizeof(model_path), "%s/demo.safetensors", h_dir());
    char err[256];
    if (model_write_demo(model_path, IN_W, HID_W, OUT_W, tu_rand64(), err, sizeof(err)) < 0) {
        fprintf(stderr, "model_write_demo: %s\n", err);
        return -1;
    }
    broker_pid = start_broker_ctl("ops.lag.jobs,ops.run.jobs,ops.run.results,ops.run.dlq,"
                                  "ops.flip.jobs,ops.flip.results,ops.flip.dlq,"
                                  "ops.early.jobs,ops.early.results,ops.early.dlq,"
                                  "ops.idle.jobs,ops.idle.results,ops.idle.dlq,"
                                  "ops.sick.jobs,ops.sick.results,ops.sick.dlq,"
                                  "ops.frozen.jobs,ops.frozen.results,ops.frozen.dlq,"
                                  "ops.stuck.jobs,ops.stuck.results,ops.stuck.dlq",
                                  PARTS);
    if (broker_pid < 0) return -1;
    if (h_start_redis(&redis_port) < 0) return -1;
    fprintf(stderr, "test_ops: broker %s, redis port %d, logs in %s\n", brokers, redis_port,
            h_dir());
    return 0;
}

/* Kills whatever is still running. */
static int teardown(void **state)
{
    (void)state;
    h_kill_all();
    return 0;
}

/* Static checks first, then the live ones; the brokers-down case last
 * but one, since it disturbs the shared broker. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_files),
        cmocka_unit_test(test_dockerfile_runtime_deps),
        cmocka_unit_test(test_shipped_configmap),
        cmocka_unit_test(test_http_endpoints),
        cmocka_unit_test(test_broker_control),
        cmocka_unit_test(test_broker_fixed_port),
        cmocka_unit_test(test_lag_without_worker),
        cmocka_unit_test(test_worker_metrics),
        cmocka_unit_test(test_ready_before_statistics),
        cmocka_unit_test(test_idle_sockets_do_not_block_probes),
        cmocka_unit_test(test_readyz_names_the_failure),
        cmocka_unit_test(test_readyz_follows_brokers),
        cmocka_unit_test(test_stop_with_frozen_broker),
        cmocka_unit_test(test_stop_with_hung_executor),
        cmocka_unit_test(test_broker_outlives_stdin),
    };
    /* KINFER_TEST_FILTER=test_ready* runs only the matching cases. */
    const char *filter = getenv("KINFER_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}

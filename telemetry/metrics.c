/* metrics.c - renders the stats as Prometheus text and health JSON and
 * serves them over HTTP with libmicrohttpd.
 *
 * Threads: metrics_start and metrics_stop run on the main thread; every
 * request is answered on libmicrohttpd's one internal thread, which takes
 * a stats snapshot per request and never blocks the pipeline (the stats
 * mutex is held only for copies). Ownership: a response body is malloc'd
 * here and handed to libmicrohttpd, which frees it; the server borrows the
 * stats struct for its whole life. */
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "../base/clock.h"
#include "../gpu/model.h"
#include "../base/log.h"

#ifndef KINFER_VERSION
#define KINFER_VERSION "dev"
#endif

struct metrics {
    struct MHD_Daemon *daemon; /* NULL when metrics.listen is empty */
    struct stats *st;
    int port;
    atomic_int starting;       /* route libmicrohttpd's messages to start_err */
    char start_err[256];
};

/* ---- a growable text buffer ---------------------------------------------- */

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

/* Appends printf-style; on allocation failure marks the buffer and keeps
 * going so callers check once at the end. */
__attribute__((format(printf, 2, 3)))
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = b->cap ? b->cap * 2 : 4096;
        while (ncap < b->len + (size_t)n + 1) ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

/* Hands the text to the caller, or frees it and returns -1 on failure. */
static int sb_finish(struct sbuf *b, char **out, size_t *len)
{
    if (b->oom || !b->p) {
        free(b->p);
        *out = NULL;
        *len = 0;
        return -1;
    }
    *out = b->p;
    *len = b->len;
    return 0;
}

/* ---- Prometheus text format ------------------------------------------------ */

/* A sample value as the text format spells it: integers without an
 * exponent where exact, +Inf/-Inf/NaN by name. */
static void sb_value(struct sbuf *b, double v)
{
    if (isnan(v)) sb_printf(b, "NaN");
    else if (isinf(v)) sb_printf(b, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15) sb_printf(b, "%.0f", v);
    else sb_printf(b, "%.9g", v);
}

/* A label value with \, " and newline escaped, as the format requires
 * (topic names cannot hold them, but the renderer does not rely on it). */
static void sb_label(struct sbuf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\') sb_printf(b, "\\\\");
        else if (*v == '"') sb_printf(b, "\\\"");
        else if (*v == '\n') sb_printf(b, "\\n");
        else sb_printf(b, "%c", *v);
    }
}

/* The two comment lines every family starts with. */
static void family(struct sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family with one unlabelled sample. */
static void single(struct sbuf *b, const char *name, const char *type, const char *help,
                   double v)
{
    family(b, name, type, help);
    sb_printf(b, "%s ", name);
    sb_value(b, v);
    sb_printf(b, "\n");
}

/* One histogram: cumulative buckets with le labels, then _sum and _count
 * (the +Inf bucket and _count are the same number by construction). */
static void histogram(struct sbuf *b, const struct stats_snapshot *s, enum stats_hist h,
                      const char *name, const char *help)
{
    size_t n;
    const double *bounds = stats_hist_bounds(h, &n);
    const struct stats_hist_snap *hs = &s->hist[h];
    family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += hs->buckets[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, bounds[i], cum);
    }
    cum += hs->buckets[n];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    sb_printf(b, "%s_sum ", name);
    sb_value(b, hs->sum);
    sb_printf(b, "\n%s_count %" PRIu64 "\n", name, hs->count);
}

/* kinfer_jobs_total's series: ok with code "ok"; error and dead_letter
 * with each error code. Every series is written from the start (as 0),
 * so rate() and alerts see a series before its first event. */
static void jobs_family(struct sbuf *b, const struct stats_snapshot *s)
{
    family(b, "kinfer_jobs_total", "counter",
           "Jobs finished (result or dead letter acknowledged), by status and error code.");
    for (int st = 0; st < STATS_N_STATUS; st++) {
        for (int c = 0; c <= PROTO_ERR_SHUTTING_DOWN; c++) {
            if ((st == STATS_STATUS_OK) != (c == PROTO_OK)) continue;
            sb_printf(b, "kinfer_jobs_total{status=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                      stats_status_name((enum stats_status)st), proto_err_name((enum proto_err)c),
                      s->jobs[st][c]);
        }
    }
}

/* The CUDA backend's devices, one series per device label (its CUDA
 * index), exported only when there are devices. */
static void gpu_families(struct sbuf *b, const struct stats_snapshot *s)
{
    static const struct {
        const char *name, *type, *help;
    } fams[] = {
        {"kinfer_gpu_busy_ratio", "gauge",
         "Fraction of the last interval the device ran kinfer's work (CUDA events around each "
         "batch on each stream; overlapping streams count once, capped at 1)."},
        {"kinfer_gpu_memory_used_bytes", "gauge",
         "Device memory in use, by every process on the device."},
        {"kinfer_gpu_memory_total_bytes", "gauge", "Device memory in all."},
        {"kinfer_gpu_batches_total", "counter", "Forward passes run on the device."},
        {"kinfer_gpu_busy_seconds_total", "counter",
         "Device time of kinfer's work (CUDA events around each batch), summed over streams."},
    };
    for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
        family(b, fams[f].name, fams[f].type, fams[f].help);
        for (size_t d = 0; d < s->n_devices; d++) {
            const struct stats_device *dv = &s->devices[d];
            double v = f == 0   ? dv->busy_ratio
                       : f == 1 ? (double)dv->mem_used
                       : f == 2 ? (double)dv->mem_total
                       : f == 3 ? (double)dv->batches
                                : dv->busy_s;
            sb_printf(b, "%s{device=\"%d\"} ", fams[f].name, dv->index);
            sb_value(b, v);
            sb_printf(b, "\n");
        }
    }
}

/* The whole exposition, family by family in a fixed order, so scrapes
 * diff cleanly and tests can look for exact lines. */
int metrics_render(const struct stats_snapshot *s, char **out, size_t *len)
{
    struct sbuf b = {0};
    const char *reasons[8];
    size_t n_reasons;
    int ready = stats_ready(s, reasons, 8, &n_reasons);

    family(&b, "kinfer_build_info", "gauge",
           "Always 1; the labels say what is running.");
    sb_printf(&b, "kinfer_build_info{version=\"");
    sb_label(&b, KINFER_VERSION);
    sb_printf(&b, "\",backend=\"");
    sb_label(&b, s->backend);
    sb_printf(&b, "\",librdkafka=\"");
    sb_label(&b, rd_kafka_version_str());
    sb_printf(&b, "\",cuda=\"%s\"} 1\n", model_cuda_built() ? "built" : "none");
    family(&b, "kinfer_backend_info", "gauge",
           "Always 1; what runs the models: backend (cpu, cuda), device (cpu, or the CUDA "
           "devices' names; \"emulated ...\" on the emulated device), precision and devices.");
    sb_printf(&b, "kinfer_backend_info{backend=\"");
    sb_label(&b, s->backend);
    sb_printf(&b, "\",device=\"");
    sb_label(&b, s->device);
    sb_printf(&b, "\",precision=\"");
    sb_label(&b, s->precision);
    sb_printf(&b, "\",devices=\"%zu\"} 1\n", s->n_devices);
    single(&b, "kinfer_start_time_seconds", "gauge",
           "Unix time the worker started.", floor(s->start_time_s));
    single(&b, "kinfer_ready", "gauge",
           "1 when /readyz answers 200: model loaded, consumer joined, producer connected, "
           "Redis reachable, not draining.", ready);
    single(&b, "kinfer_healthy", "gauge",
           "1 while /healthz answers 200; 0 once a loop was silent longer than "
           "metrics.watchdog_ms.", s->healthy);
    family(&b, "kinfer_loop_silence_seconds", "gauge",
           "Seconds since each worker loop last reported to the watchdog.");
    for (int l = 0; l < STATS_N_LOOPS; l++) {
        if (s->loop_silence_s[l] < 0) continue;
        char name[32];
        sb_printf(&b, "kinfer_loop_silence_seconds{loop=\"%s\"} ",
                  stats_loop_name(l, name, sizeof(name)));
        sb_value(&b, s->loop_silence_s[l]);
        sb_printf(&b, "\n");
    }

    single(&b, "kinfer_queue_depth_rows", "gauge",
           "Rows queued in the batcher, waiting for a batch.", (double)s->queue_rows);
    single(&b, "kinfer_queue_depth_jobs", "gauge",
           "Jobs queued in the batcher, waiting for a batch.", (double)s->queue_jobs);
    single(&b, "kinfer_oldest_queued_seconds", "gauge",
           "How long the oldest queued job has waited; 0 when the queue is empty.",
           s->oldest_queued_s);
    single(&b, "kinfer_inflight_rows", "gauge",
           "Rows taken from Kafka and not yet finished (queued, running or being written); "
           "fetching pauses above batching.max_queued_rows.", (double)s->inflight_rows);
    single(&b, "kinfer_inflight_batches", "gauge",
           "Batches taken by an executor and not yet written out.",
           (double)s->inflight_batches);
    single(&b, "kinfer_assigned_partitions", "gauge",
           "Partitions assigned to this worker by the consumer group.", (double)s->assigned);
    single(&b, "kinfer_paused_partitions", "gauge",
           "Assigned partitions paused by backpressure.", (double)s->paused);

    family(&b, "kinfer_consumer_lag", "gauge",
           "Messages in each assigned partition not yet processed (librdkafka "
           "consumer_lag_stored), refreshed every statistics.interval.ms.");
    for (size_t i = 0; i < s->n_parts; i++) {
        sb_printf(&b, "kinfer_consumer_lag{topic=\"");
        sb_label(&b, s->parts[i].topic);
        sb_printf(&b, "\",partition=\"%" PRId32 "\"} %" PRId64 "\n", s->parts[i].partition,
                  s->parts[i].lag);
    }
    family(&b, "kinfer_kafka_brokers_up", "gauge",
           "Kafka broker connections that are up, per client (from librdkafka statistics).");
    if (s->brokers_up_consumer >= 0)
        sb_printf(&b, "kinfer_kafka_brokers_up{client=\"consumer\"} %d\n",
                  s->brokers_up_consumer);
    if (s->brokers_up_producer >= 0)
        sb_printf(&b, "kinfer_kafka_brokers_up{client=\"producer\"} %d\n",
                  s->brokers_up_producer);

    single(&b, "kinfer_consumed_total", "counter",
           "Records taken from the input topics.", (double)s->consumed);
    jobs_family(&b, s);
    family(&b, "kinfer_batches_total", "counter",
           "Batches run, by why they closed: size, deadline, wait or drain.");
    for (int r = 0; r < STATS_N_BATCH_REASONS; r++)
        sb_printf(&b, "kinfer_batches_total{reason=\"%s\"} %" PRIu64 "\n",
                  stats_batch_reason_name((enum stats_batch_reason)r), s->batches[r]);
    single(&b, "kinfer_dead_letters_total", "counter",
           "Records written to the dead-letter topic (acknowledged).",
           (double)s->dead_letters);
    family(&b, "kinfer_records_skipped_total", "counter",
           "Records of each partition the worker never read: offsets jumped over "
           "between two records taken (an offset reset past records the broker deleted).");
    for (size_t i = 0; i < s->n_skips; i++) {
        sb_printf(&b, "kinfer_records_skipped_total{topic=\"");
        sb_label(&b, s->skips[i].topic);
        sb_printf(&b, "\",partition=\"%" PRId32 "\"} %" PRIu64 "\n", s->skips[i].partition,
                  s->skips[i].records);
    }
    single(&b, "kinfer_offset_resets_total", "counter",
           "Fetch offsets librdkafka reset (auto.offset.reset), from its log.",
           (double)s->offset_resets);
    single(&b, "kinfer_produce_errors_total", "counter",
           "Produce attempts to the reply or dead-letter topic that failed (then retried).",
           (double)s->produce_errors);
    single(&b, "kinfer_redis_errors_total", "counter",
           "Failed attempts to write results to Redis (connection errors, timeouts, "
           "error replies; then retried).", (double)s->redis_errors);
    single(&b, "kinfer_heartbeat_errors_total", "counter",
           "Failed heartbeat writes or Redis checks.", (double)s->heartbeat_errors);

    histogram(&b, s, STATS_HIST_BATCH_ROWS, "kinfer_batch_rows",
              "Rows per forward pass.");
    histogram(&b, s, STATS_HIST_QUEUE_S, "kinfer_queue_seconds",
              "Time a job waited from arrival to the start of its batch.");
    histogram(&b, s, STATS_HIST_INFER_S, "kinfer_infer_seconds",
              "Forward-pass time of the batch a job ran in.");
    histogram(&b, s, STATS_HIST_E2E_S, "kinfer_e2e_seconds",
              "Record timestamp to result acknowledged by Kafka and Redis.");
    if (s->gen_models) {
        histogram(&b, s, STATS_HIST_TTFT_S, "kinfer_gen_ttft_seconds",
                  "Generation: record timestamp to a job's first generated token.");
        histogram(&b, s, STATS_HIST_TPOT_S, "kinfer_gen_tpot_seconds",
                  "Generation: time per output token after a job's first.");
        single(&b, "kinfer_gen_prompt_tokens_total", "counter",
               "Generation: prompt tokens of finished jobs.", (double)s->gen_prompt_tokens);
        single(&b, "kinfer_gen_generated_tokens_total", "counter",
               "Generation: tokens generated by finished jobs.", (double)s->gen_tokens);
        single(&b, "kinfer_gen_preemptions_total", "counter",
               "Generation: sequences that gave their cache blocks back to wait again.",
               (double)s->gen_preemptions);
        single(&b, "kinfer_gen_prefix_tokens_total", "counter",
               "Generation: prompt tokens found in the key/value cache, not computed again.",
               (double)s->gen_shared_tokens);
        single(&b, "kinfer_gen_running_sequences", "gauge",
               "Generation: sequences generating now.", (double)s->gen_running);
        single(&b, "kinfer_gen_waiting_sequences", "gauge",
               "Generation: jobs waiting to start generating.", (double)s->gen_waiting);
        single(&b, "kinfer_gen_kv_blocks_used", "gauge",
               "Generation: key/value cache blocks in use.", (double)s->gen_blocks_used);
        single(&b, "kinfer_gen_kv_blocks_total", "gauge",
               "Generation: key/value cache blocks in all.", (double)s->gen_blocks_total);
    }

    single(&b, "kinfer_rows_per_second", "gauge",
           "Rows run through the model per second, exponentially smoothed (15 s).",
           s->rows_per_s);
    single(&b, "kinfer_jobs_per_second", "gauge",
           "Jobs finished per second, exponentially smoothed (15 s).", s->jobs_per_s);
    single(&b, "kinfer_tokens_total", "counter",
           "Tokens run through encoder models (rows' own tokens, specials included).",
           (double)s->tokens);
    single(&b, "kinfer_padded_tokens_total", "counter",
           "Encoder batches' shape, rows x the batch's longest row, summed: what a backend "
           "that pads pays (the CPU backend packs sequences and pays only the tokens).",
           (double)s->padded_tokens);
    single(&b, "kinfer_tokens_per_second", "gauge",
           "Encoder tokens per second, exponentially smoothed (15 s).", s->tokens_per_s);
    single(&b, "kinfer_padding_ratio", "gauge",
           "Fraction of the padded tokens that were padding, smoothed (15 s); since start "
           "when idle.", s->padding_ratio);
    family(&b, "kinfer_estimated_drain_seconds", "gauge",
           "This worker's consumer lag divided by its smoothed jobs rate; absent while "
           "it has lag and has finished nothing lately.");
    if (s->drain_known) {
        sb_printf(&b, "kinfer_estimated_drain_seconds ");
        sb_value(&b, s->drain_s);
        sb_printf(&b, "\n");
    }
    if (s->n_devices) gpu_families(&b, s);
    return sb_finish(&b, out, len);
}

/* A JSON string literal; the reasons and loop names are ASCII, but quotes
 * and control characters are escaped all the same. */
static void sb_json_str(struct sbuf *b, const char *v)
{
    sb_printf(b, "\"");
    for (; *v; v++) {
        unsigned char c = (unsigned char)*v;
        if (c == '"' || c == '\\') sb_printf(b, "\\%c", c);
        else if (c < 0x20) sb_printf(b, "\\u%04x", c);
        else sb_printf(b, "%c", c);
    }
    sb_printf(b, "\"");
}

/* Readiness as JSON: probes read the status code, people the reasons. */
int metrics_render_ready(const struct stats_snapshot *s, char **out, size_t *len)
{
    const char *reasons[8];
    size_t n;
    int ready = stats_ready(s, reasons, 8, &n);
    struct sbuf b = {0};
    sb_printf(&b, "{\"ready\":%s,\"reasons\":[", ready ? "true" : "false");
    for (size_t i = 0; i < n && i < 8; i++) {
        if (i) sb_printf(&b, ",");
        sb_json_str(&b, reasons[i]);
    }
    sb_printf(&b, "],\"backend\":");
    sb_json_str(&b, s->backend);
    sb_printf(&b, ",\"device\":");
    sb_json_str(&b, s->device);
    if (s->models[0]) { /* the worker's models and their kinds, once set */
        sb_printf(&b, ",\"models\":");
        sb_json_str(&b, s->models);
    }
    sb_printf(&b, "}\n");
    return sb_finish(&b, out, len) < 0 ? -1 : ready;
}

/* Liveness as JSON, with every watched loop's silence so a near-trip is
 * visible before it happens. */
int metrics_render_health(const struct stats_snapshot *s, char **out, size_t *len)
{
    struct sbuf b = {0};
    sb_printf(&b, "{\"healthy\":%s,\"reason\":", s->healthy ? "true" : "false");
    sb_json_str(&b, s->healthy ? "" : s->unhealthy_why);
    sb_printf(&b, ",\"watchdog_ms\":%d,\"loops\":{", s->watchdog_ms);
    int first = 1;
    for (int l = 0; l < STATS_N_LOOPS; l++) {
        if (s->loop_silence_s[l] < 0) continue;
        char name[32];
        if (!first) sb_printf(&b, ",");
        first = 0;
        sb_json_str(&b, stats_loop_name(l, name, sizeof(name)));
        sb_printf(&b, ":%.3f", s->loop_silence_s[l]);
    }
    sb_printf(&b, "}}\n");
    return sb_finish(&b, out, len) < 0 ? -1 : s->healthy;
}

/* ---- HTTP ------------------------------------------------------------------- */

static const char index_body[] =
    "kinfer worker\n"
    "  /metrics  Prometheus metrics\n"
    "  /healthz  liveness (503 once the watchdog tripped)\n"
    "  /readyz   readiness (503 with the reasons as JSON)\n";

/* Queues body (malloc'd; libmicrohttpd frees it) with a status and type. */
static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, char *body,
                               size_t len, const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A short plain-text answer (index, 404, 405, 500). */
static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status,
                                    const char *text)
{
    size_t len = strlen(text);
    char *body = malloc(len + 1);
    if (!body) return MHD_NO;
    memcpy(body, text, len + 1);
    return respond(conn, status, body, len, "text/plain; charset=utf-8");
}

/* libmicrohttpd's request callback, on its thread. GET and HEAD only;
 * every answer is computed from one fresh snapshot. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    struct metrics *m = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    int route = strcmp(url, "/metrics") == 0   ? 1
                : strcmp(url, "/healthz") == 0 ? 2
                : strcmp(url, "/readyz") == 0  ? 3
                : strcmp(url, "/") == 0        ? 4
                                               : 0;
    if (route == 0) return respond_text(conn, MHD_HTTP_NOT_FOUND, "not found\n");
    if (route == 4) return respond_text(conn, MHD_HTTP_OK, index_body);

    struct stats_snapshot s;
    if (stats_snapshot(m->st, clock_mono_us(), &s) < 0) {
        stats_snapshot_fini(&s);
        return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    char *body;
    size_t len;
    int rc;
    enum MHD_Result ret;
    if (route == 1) {
        rc = metrics_render(&s, &body, &len);
        ret = rc < 0 ? respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n")
                     : respond(conn, MHD_HTTP_OK, body, len,
                               "text/plain; version=0.0.4; charset=utf-8");
    } else {
        rc = route == 2 ? metrics_render_health(&s, &body, &len)
                        : metrics_render_ready(&s, &body, &len);
        ret = rc < 0 ? respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n")
                     : respond(conn, rc ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, body, len,
                               "application/json");
    }
    stats_snapshot_fini(&s);
    return ret;
}

/* libmicrohttpd's own messages: during start they become the error
 * metrics_start reports; afterwards they go to the log. */
__attribute__((format(printf, 2, 0)))
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct metrics *m = cls;
    char buf[256];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
    if (atomic_load(&m->starting)) {
        if (!m->start_err[0]) snprintf(m->start_err, sizeof(m->start_err), "%s", buf);
        return;
    }
    LOG_W("http_error", "msg=\"%s\"", buf);
}

/* Splits "host:port" / "[v6]:port" (config.c has checked the shape)
 * into host and port strings. Returns 0, or -1 when they do not fit. */
static int split_listen(const char *listen, char *host, size_t hcap, char *port, size_t pcap,
                        int *v6)
{
    const char *colon = strrchr(listen, ':');
    if (!colon) return -1;
    const char *h = listen;
    size_t hlen = (size_t)(colon - listen);
    *v6 = 0;
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
        *v6 = 1;
    }
    if (hlen >= hcap || strlen(colon + 1) >= pcap) return -1;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

/* Who may hold the server's connections, and for how long. Probes (a
 * kubelet's, Prometheus's) use one connection at a time; without a bound
 * per client, a few idle sockets from anyone (64 took every slot) made
 * every probe fail and a kubelet would restart a healthy worker. A client
 * address holds at most HTTP_MAX_PER_IP connections (more are closed as
 * they arrive); a connection idle for HTTP_IDLE_TIMEOUT_S is closed;
 * HTTP_MAX_CONNECTIONS bounds the file descriptors all of them take. The
 * server is event driven (epoll, one thread), so idle and slow
 * connections cost no thread. */
enum { HTTP_MAX_CONNECTIONS = 256, HTTP_MAX_PER_IP = 8, HTTP_IDLE_TIMEOUT_S = 5 };

/* Resolves and binds at startup, so a bad or taken address stops the
 * worker with a message instead of leaving it unobservable. Port 0 binds
 * any free port; the log line names the one bound (metrics_port too). */
struct metrics *metrics_start(const struct kcfg *c, struct stats *st, char *errstr,
                              size_t errstr_size)
{
    struct metrics *m = calloc(1, sizeof(*m));
    struct addrinfo *ai = NULL;
    if (!m) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    m->st = st;
    stats_set_watchdog(st, c->metrics.watchdog_ms);
    const char *listen = c->metrics.listen ? c->metrics.listen : "";
    if (!*listen) return m; /* nothing to serve */

    char host[256], port[16];
    int v6;
    if (split_listen(listen, host, sizeof(host), port, sizeof(port), &v6) < 0) {
        snprintf(errstr, errstr_size, "metrics.listen '%s' is not host:port", listen);
        goto fail;
    }
    struct addrinfo hints = {.ai_family = v6 ? AF_INET6 : AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        snprintf(errstr, errstr_size, "metrics.listen '%s': %s", listen,
                 gai ? gai_strerror(gai) : "no address");
        goto fail;
    }
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    atomic_store(&m->starting, 1);
    /* The logger first: libmicrohttpd wants it so, and says so in its
     * first message otherwise, which would then stand in for the reason
     * a start failed ("Failed to bind to port N: Address already in use"). */
    m->daemon = MHD_start_daemon(
        flags, (uint16_t)atoi(port), NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER,
        on_mhd_log, m, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)HTTP_MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)HTTP_MAX_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)HTTP_IDLE_TIMEOUT_S, MHD_OPTION_END);
    int saved = errno;
    atomic_store(&m->starting, 0);
    if (!m->daemon) {
        snprintf(errstr, errstr_size, "metrics.listen '%s': cannot listen: %s", listen,
                 m->start_err[0] ? m->start_err : strerror(saved));
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->daemon, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info ? (int)info->port : atoi(port);
    freeaddrinfo(ai);
    LOG_I("metrics_listening", "listen=%s port=%d", listen, m->port);
    return m;
fail:
    if (ai) freeaddrinfo(ai);
    free(m);
    return NULL;
}

/* libmicrohttpd joins its thread, so no request runs after this. */
void metrics_stop(struct metrics *m)
{
    if (!m) return;
    if (m->daemon) MHD_stop_daemon(m->daemon);
    free(m);
}

/* Tests bind port 0 and need to know where to connect. */
int metrics_port(const struct metrics *m)
{
    return m && m->daemon ? m->port : 0;
}

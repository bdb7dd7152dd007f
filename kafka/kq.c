/* kq.c - builds librdkafka configurations. kinfer never re-declares
 * librdkafka's options: it sets the few its guarantees need and passes the
 * operator's properties through unchanged (after config.c refused unsafe
 * ones), kcat-style. One list (kafka.properties) serves both clients, so
 * each client gets only the properties of its kind, as librdkafka itself
 * marks them (see kq_property_scope): a producer handed fetch.wait.max.ms
 * would log a warning (CONFWARN) at every start.
 *
 * kq_client_new makes the worker's clients with the callbacks they all
 * share (errors, statistics, logs).
 *
 * Threads: main thread; the callbacks run on whichever thread serves the
 * client (librdkafka's log callback on its own threads). */
#include "kq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "../base/log.h"

/* librdkafka's syslog levels mapped onto ours, one line per event. An
 * offset reset after an error ("offset reset (at offset N, broker B) to
 * BEGINNING: fetch failed due to requested offset not available on the
 * broker: Broker: Offset out of range") means records were skipped: it
 * is counted (kinfer_offset_resets_total) and logged as an error of its
 * own; how many records, the intake counts from the offsets it sees
 * (kinfer_records_skipped_total). */
static void log_cb(const rd_kafka_t *rk, int level, const char *fac,
                   const char *buf)
{
    if (level <= 4 && strcmp(fac, "OFFSET") == 0 && strstr(buf, "offset reset")) {
        const struct kq_ctx *ctx = rd_kafka_opaque(rk);
        if (ctx && ctx->stats) stats_offset_reset(ctx->stats);
        LOG_E("offset_reset", "client=%s msg=\"%s\" records=skipped "
              "see=kinfer_records_skipped_total", rd_kafka_name(rk), buf);
        return;
    }
    enum log_level l = level <= 3 ? LOG_ERROR : level == 4 ? LOG_WARN
                     : level <= 6 ? LOG_INFO : LOG_DEBUG;
    LOG(l, "rdkafka", "client=%s facility=%s msg=\"%s\"", rd_kafka_name(rk),
        fac, buf);
}

int kq_set(rd_kafka_conf_t *conf, const char *name, const char *value,
           char *errstr, size_t errstr_size)
{
    char e[512];
    if (rd_kafka_conf_set(conf, name, value, e, sizeof(e)) != RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "kafka property %s=%s: %s", name, value, e);
        return -1;
    }
    return 0;
}

/* librdkafka's property table as text, in the form of its
 * CONFIGURATION.md: one row per property, "name | C/P | ...", where C is
 * consumer only, P producer only and * both (aliases have rows of their
 * own). Asking the library that runs, rather than keeping a copy of its
 * table, stays right when librdkafka adds or moves properties. Returns new
 * text (free it), or NULL when out of memory. */
static char *properties_table(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    rd_kafka_conf_properties_show(f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The C/P column of name's row in table, or 0 when it has none (a
 * property librdkafka does not list: passed on, and refused by
 * rd_kafka_conf_set if it does not exist). */
static char scope_in(const char *table, const char *name)
{
    size_t n = strlen(name);
    for (const char *line = table; line && *line;) {
        const char *end = strchr(line, '\n');
        if (strncmp(line, name, n) == 0 && (line[n] == ' ' || line[n] == '|')) {
            const char *bar = strchr(line, '|');
            if (bar && (!end || bar < end)) {
                const char *p = bar + 1;
                while (*p == ' ') p++;
                if (*p == 'C' || *p == 'P' || *p == '*') return *p;
            }
        }
        line = end ? end + 1 : NULL;
    }
    return 0;
}

char kq_property_scope(const char *name)
{
    char *table = properties_table();
    char scope = table ? scope_in(table, name) : 0;
    free(table);
    return scope;
}

rd_kafka_conf_t *kq_conf_new(const struct kcfg *c, enum kq_role role,
                             char *errstr, size_t errstr_size)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    /* What kinfer's at-least-once promise rests on (docs/reliability.md, rules
     * 1-3): offsets are stored by the worker only after both
     * acknowledgements; stored offsets are committed automatically; a new
     * group starts at the beginning; results are written idempotently. */
    static const char *const consumer_base[][2] = {
        {"enable.auto.offset.store", "false"},
        {"enable.auto.commit", "true"},
        {"auto.offset.reset", "earliest"},
        /* librdkafka's eager assignors (its default), not cooperative-sticky:
         * 2.0.2 (Debian 12) aborts when a cooperative consumer closes during
         * a rebalance (librdkafka issue #4312), which turns a SIGTERM into a
         * crash. The rebalance callback handles both protocols, so a newer
         * librdkafka can opt in through kafka.properties. Hand-over times,
         * and why the embedded broker gains nothing from cooperative:
         * docs/reliability.md, "Scale-out and scale-in". */
        {"partition.assignment.strategy", "range,roundrobin"},
        {"enable.partition.eof", "false"},
        /* How long the group waits for a member that stopped heartbeating
         * (a crash, a frozen host) before its partitions move: librdkafka's
         * 45 s default stalled them 45 s per kill -9. Heartbeats come from
         * librdkafka's own thread, not from the poll loop or the model, so a
         * live worker under any load keeps its membership; 10 s leaves
         * three heartbeats (heartbeat.interval.ms 3000) to be lost first.
         * docs/reliability.md, "Crash recovery", has the trade-off. */
        {"session.timeout.ms", "10000"},
        {"statistics.interval.ms", "5000"}, /* consumer lag for the metrics */
    };
    static const char *const producer_base[][2] = {
        {"enable.idempotence", "true"},
        {"acks", "all"},
        {"linger.ms", "5"},
        {"statistics.interval.ms", "5000"},
    };
    if (kq_set(conf, "bootstrap.servers", c->kafka.brokers, errstr, errstr_size) < 0)
        goto fail;
    if (role == KQ_CONSUMER) {
        if (kq_set(conf, "group.id", c->kafka.group, errstr, errstr_size) < 0)
            goto fail;
        /* Static membership: a worker restarted under the same id (a
         * StatefulSet's pod name) takes its partitions back at once, with no
         * rebalance and no wait for its old session to time out. Only an id
         * set on purpose: the default <hostname>-<pid> changes each start. */
        if (c->kafka.static_membership && c->metrics.worker_id && *c->metrics.worker_id &&
            kq_set(conf, "group.instance.id", c->metrics.worker_id, errstr, errstr_size) < 0)
            goto fail;
        for (size_t i = 0; i < sizeof(consumer_base) / sizeof(consumer_base[0]); i++)
            if (kq_set(conf, consumer_base[i][0], consumer_base[i][1], errstr,
                       errstr_size) < 0)
                goto fail;
    } else {
        for (size_t i = 0; i < sizeof(producer_base) / sizeof(producer_base[0]); i++)
            if (kq_set(conf, producer_base[i][0], producer_base[i][1], errstr,
                       errstr_size) < 0)
                goto fail;
    }
    char *table = c->kafka.n_properties ? properties_table() : NULL;
    char other = role == KQ_CONSUMER ? 'P' : 'C';
    for (size_t i = 0; i < c->kafka.n_properties; i++) {
        const struct cfg_kv *p = &c->kafka.properties[i];
        if (table && scope_in(table, p->key) == other) {
            LOG_D("kafka_property_skipped", "property=%s client=%s note=\"a %s property\"",
                  p->key, role == KQ_CONSUMER ? "consumer" : "producer",
                  other == 'P' ? "producer" : "consumer");
            continue;
        }
        if (kq_set(conf, p->key, p->value, errstr, errstr_size) < 0) {
            free(table);
            goto fail;
        }
    }
    free(table);
    rd_kafka_conf_set_log_cb(conf, log_cb);
    return conf;
fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

/* librdkafka's error events: transient ones are logged (the client
 * retries), a fatal one stops the worker so its supervisor restarts it. */
static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    struct kq_ctx *ctx = opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char buf[512];
        rd_kafka_fatal_error(rk, buf, sizeof(buf));
        LOG_E("kafka_fatal", "client=%s error=\"%s\"", rd_kafka_name(rk), buf);
        atomic_store(ctx->fatal, 1);
        return;
    }
    LOG_W("kafka_error", "client=%s error=\"%s\" reason=\"%s\"", rd_kafka_name(rk),
          rd_kafka_err2str(err), reason);
}

/* librdkafka's statistics (every statistics.interval.ms), served on the
 * thread that polls the client: lag, group state, broker connections. */
static int stats_cb(rd_kafka_t *rk, char *json, size_t len, void *opaque)
{
    (void)rk;
    struct kq_ctx *ctx = opaque;
    stats_rdkafka_json(ctx->stats, json, len);
    return 0; /* librdkafka frees json */
}

rd_kafka_t *kq_client_new(const struct kcfg *c, enum kq_role role, const struct kq_hooks *h,
                          char *errstr, size_t errstr_size)
{
    rd_kafka_conf_t *conf = kq_conf_new(c, role, errstr, errstr_size);
    if (!conf) return NULL;
    if (role == KQ_CONSUMER && h->group &&
        kq_set(conf, "group.id", h->group, errstr, errstr_size) < 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set_opaque(conf, h->opaque);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    rd_kafka_conf_set_stats_cb(conf, stats_cb);
    if (h->rebalance_cb) rd_kafka_conf_set_rebalance_cb(conf, h->rebalance_cb);
    if (h->dr_msg_cb) rd_kafka_conf_set_dr_msg_cb(conf, h->dr_msg_cb);
    rd_kafka_t *rk = rd_kafka_new(role == KQ_CONSUMER ? RD_KAFKA_CONSUMER : RD_KAFKA_PRODUCER,
                                  conf, errstr, errstr_size);
    if (!rk) rd_kafka_conf_destroy(conf); /* taken only on success */
    return rk;
}

const char *kq_header_string(const rd_kafka_message_t *m, const char *name, char *buf,
                             size_t cap)
{
    rd_kafka_headers_t *hdrs = NULL;
    const void *val;
    size_t size;
    if (cap == 0 || rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return NULL;
    if (rd_kafka_header_get_last(hdrs, name, &val, &size) != RD_KAFKA_RESP_ERR_NO_ERROR || !val)
        return NULL;
    if (size >= cap) size = cap - 1;
    memcpy(buf, val, size);
    buf[size] = '\0';
    return buf;
}

int kq_consumer_close_by(rd_kafka_t *rk, int64_t deadline_us,
                         void (*rebalance)(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                                           rd_kafka_topic_partition_list_t *parts,
                                           void *opaque),
                         void *opaque, char *errstr, size_t errstr_size)
{
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    if (!q) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    rd_kafka_error_t *e = rd_kafka_consumer_close_queue(rk, q);
    if (e) {
        snprintf(errstr, errstr_size, "%s", rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        rd_kafka_queue_destroy(q);
        return -1;
    }
    while (!rd_kafka_consumer_closed(rk)) {
        int64_t left_us = deadline_us - clock_mono_us();
        if (left_us <= 0) break;
        int wait_ms = left_us > 100000 ? 100 : (int)((left_us + 999) / 1000);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, wait_ms);
        if (!ev) continue;
        if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_REBALANCE)
            rebalance(rk, rd_kafka_event_error(ev), rd_kafka_event_topic_partition_list(ev),
                      opaque);
        rd_kafka_event_destroy(ev);
    }
    int closed = rd_kafka_consumer_closed(rk);
    rd_kafka_queue_destroy(q);
    return closed;
}

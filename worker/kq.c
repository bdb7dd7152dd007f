/* kq.c - builds librdkafka configurations. kinfer never re-declares
 * librdkafka's options: it sets the few its guarantees need and passes the
 * operator's properties through unchanged (after config.c refused unsafe
 * ones), kcat-style.
 *
 * Threads: main thread; the log callback runs on librdkafka's threads. */
#include "kq.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

/* librdkafka's syslog levels mapped onto ours, one line per event. */
static void log_cb(const rd_kafka_t *rk, int level, const char *fac,
                   const char *buf)
{
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
         * librdkafka can opt in through kafka.properties. */
        {"partition.assignment.strategy", "range,roundrobin"},
        {"enable.partition.eof", "false"},
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
    for (size_t i = 0; i < c->kafka.n_properties; i++) {
        const struct cfg_kv *p = &c->kafka.properties[i];
        if (kq_set(conf, p->key, p->value, errstr, errstr_size) < 0) goto fail;
    }
    rd_kafka_conf_set_log_cb(conf, log_cb);
    return conf;
fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

/* test_kq.c - kafka/kq: which client each librdkafka property goes to.
 * librdkafka's own table decides (consumer-only, producer-only, both;
 * aliases and topic properties included), so a worker configured with the
 * properties of both kinds creates both clients without one CONFWARN
 * line, and each client still gets every property of its kind. A
 * property librdkafka does not know is still refused at once.
 *
 * stderr (where librdkafka's logs go through kinfer's logger) is
 * redirected to a file while the clients are made, and read back. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kafka/kq.h"
#include "../base/log.h"
#include "testutil.h"

static void test_scope_from_librdkafka(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        char scope;
    } cases[] = {
        {"fetch.wait.max.ms", 'C'},     {"session.timeout.ms", 'C'},
        {"auto.commit.interval.ms", 'C'}, {"group.instance.id", 'C'},
        {"auto.offset.reset", 'C'},     /* a topic property */
        {"linger.ms", 'P'},             /* an alias */
        {"queue.buffering.max.ms", 'P'}, {"acks", 'P'}, {"enable.idempotence", 'P'},
        {"statistics.interval.ms", '*'}, {"bootstrap.servers", '*'}, {"client.id", '*'},
        {"fetch.wait", 0},              /* a prefix of a name is not the name */
        {"no.such.property", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char got = kq_property_scope(cases[i].name);
        if (got != cases[i].scope)
            fail_msg("%s: scope '%c', expected '%c'", cases[i].name, got ? got : '0',
                     cases[i].scope ? cases[i].scope : '0');
    }
}

static struct cfg_kv props[] = {
    {"fetch.wait.max.ms", "10"},     {"session.timeout.ms", "7000"},
    {"auto.commit.interval.ms", "200"}, {"heartbeat.interval.ms", "700"},
    {"linger.ms", "3"},              {"statistics.interval.ms", "1000"},
    {"client.id", "kq-test"},
};

/* A config with the properties above and an address nothing answers on. */
static void make_cfg(struct kcfg *c)
{
    memset(c, 0, sizeof(*c));
    c->kafka.brokers = "127.0.0.1:1";
    c->kafka.group = "kq-test";
    c->kafka.properties = props;
    c->kafka.n_properties = sizeof(props) / sizeof(props[0]);
}

/* The value of name in conf. */
static const char *conf_value(rd_kafka_conf_t *conf, const char *name)
{
    static char buf[256];
    size_t n = sizeof(buf);
    assert_int_equal(rd_kafka_conf_get(conf, name, buf, &n), RD_KAFKA_CONF_OK);
    return buf;
}

/* Both clients made from one properties list: no CONFWARN, and each has
 * its own kind's values and the shared ones. */
static void test_no_confwarn(void **state)
{
    (void)state;
    struct kcfg c;
    make_cfg(&c);
    char path[] = "/tmp/kinfer-test-kq-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    close(fd);
    log_threshold = LOG_DEBUG;
    char err[512];
    rd_kafka_conf_t *cc = kq_conf_new(&c, KQ_CONSUMER, err, sizeof(err));
    rd_kafka_conf_t *pc = kq_conf_new(&c, KQ_PRODUCER, err, sizeof(err));
    assert_non_null(cc);
    assert_non_null(pc);
    assert_string_equal(conf_value(cc, "fetch.wait.max.ms"), "10");
    assert_string_equal(conf_value(cc, "session.timeout.ms"), "7000");
    assert_string_equal(conf_value(cc, "statistics.interval.ms"), "1000");
    assert_string_equal(conf_value(pc, "linger.ms"), "3");
    assert_string_equal(conf_value(pc, "statistics.interval.ms"), "1000");
    assert_string_equal(conf_value(pc, "client.id"), "kq-test");
    rd_kafka_t *consumer = rd_kafka_new(RD_KAFKA_CONSUMER, cc, err, sizeof(err));
    rd_kafka_t *producer = rd_kafka_new(RD_KAFKA_PRODUCER, pc, err, sizeof(err));
    assert_non_null(consumer);
    assert_non_null(producer);
    rd_kafka_destroy(producer);
    rd_kafka_destroy(consumer);
    log_threshold = LOG_INFO;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    int warns = 0, skipped = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strstr(line, "CONFWARN")) {
            fprintf(stderr, "%s", line);
            warns++;
        }
        if (strstr(line, "event=kafka_property_skipped")) skipped++;
    }
    fclose(f);
    unlink(path);
    assert_int_equal(warns, 0);
    assert_int_equal(skipped, 5); /* four consumer-only to the producer, linger.ms to the consumer */
}

/* Crash recovery (docs/reliability.md): the consumer's session timeout is
 * kinfer's own default unless the file gives one, and a worker_id set on
 * purpose makes the worker a static member under that id, unless
 * kafka.static_membership is 0. The producer never gets either. */
static void test_static_membership(void **state)
{
    (void)state;
    struct kcfg c;
    memset(&c, 0, sizeof(c));
    c.kafka.brokers = "127.0.0.1:1";
    c.kafka.group = "kq-test";
    c.kafka.static_membership = 1;
    char err[512], buf[256];
    size_t n;
    struct {
        const char *worker_id;
        int on;
        const char *want; /* group.instance.id, or NULL for none */
    } cases[] = {{"", 1, NULL}, {NULL, 1, NULL}, {"kinfer-2", 1, "kinfer-2"}, {"kinfer-2", 0, NULL}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        c.metrics.worker_id = (char *)cases[i].worker_id;
        c.kafka.static_membership = cases[i].on;
        rd_kafka_conf_t *cc = kq_conf_new(&c, KQ_CONSUMER, err, sizeof(err));
        assert_non_null(cc);
        assert_string_equal(conf_value(cc, "session.timeout.ms"), "10000");
        n = sizeof(buf);
        rd_kafka_conf_res_t r = rd_kafka_conf_get(cc, "group.instance.id", buf, &n);
        if (cases[i].want) {
            assert_int_equal(r, RD_KAFKA_CONF_OK);
            assert_string_equal(buf, cases[i].want);
        } else {
            /* unset reads back as an empty string */
            assert_true(r != RD_KAFKA_CONF_OK || buf[0] == '\0');
        }
        rd_kafka_conf_destroy(cc);
        rd_kafka_conf_t *pc = kq_conf_new(&c, KQ_PRODUCER, err, sizeof(err));
        assert_non_null(pc);
        n = sizeof(buf);
        r = rd_kafka_conf_get(pc, "group.instance.id", buf, &n);
        assert_true(r != RD_KAFKA_CONF_OK || buf[0] == '\0');
        rd_kafka_conf_destroy(pc);
    }
    /* The file's own session timeout wins (make_cfg's list gives 7000). */
    make_cfg(&c);
    rd_kafka_conf_t *cc = kq_conf_new(&c, KQ_CONSUMER, err, sizeof(err));
    assert_non_null(cc);
    assert_string_equal(conf_value(cc, "session.timeout.ms"), "7000");
    rd_kafka_conf_destroy(cc);
}

/* A misspelt property still stops the client from being made. */
static void test_unknown_refused(void **state)
{
    (void)state;
    struct kcfg c;
    make_cfg(&c);
    struct cfg_kv bad[] = {{"fetch.wait.max.msx", "10"}};
    c.kafka.properties = bad;
    c.kafka.n_properties = 1;
    char err[512];
    assert_null(kq_conf_new(&c, KQ_CONSUMER, err, sizeof(err)));
    assert_non_null(strstr(err, "fetch.wait.max.msx"));
    assert_null(kq_conf_new(&c, KQ_PRODUCER, err, sizeof(err)));
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scope_from_librdkafka),
        cmocka_unit_test(test_no_confwarn),
        cmocka_unit_test(test_unknown_refused),
        cmocka_unit_test(test_static_membership),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

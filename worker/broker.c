/* broker.c - hosts librdkafka's mock cluster in this process until a
 * signal. The mock keeps at most ~5 MB per partition (librdkafka 2.0.2), so
 * tests size their backlogs below that; topics not created here are
 * auto-created on first use with the mock's default partition count.
 *
 * Threads: main thread. */
#include "broker.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int broker_run(const struct broker_opts *o, volatile sig_atomic_t *stop)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    /* The handle only hosts the cluster; keep its own logging quiet. */
    rd_kafka_conf_set(conf, "log_level", "3", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "kinfer broker: %s\n", err);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, o->brokers);
    if (!mc) {
        fprintf(stderr, "kinfer broker: cannot start a mock cluster of %d brokers\n",
                o->brokers);
        rd_kafka_destroy(rk);
        return 1;
    }
    int rf = o->brokers < 3 ? o->brokers : 3;
    if (o->topics && *o->topics) {
        char *list = strdup(o->topics), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(mc, t, o->partitions, rf);
            if (e) {
                fprintf(stderr, "kinfer broker: topic %s: %s\n", t, rd_kafka_err2str(e));
                free(list);
                rd_kafka_mock_cluster_destroy(mc);
                rd_kafka_destroy(rk);
                return 1;
            }
        }
        free(list);
    }
    printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
    fflush(stdout);
    fprintf(stderr, "kinfer broker: %d broker(s), topics=%s partitions=%d; "
            "SIGINT or SIGTERM stops it\n", o->brokers,
            o->topics && *o->topics ? o->topics : "(auto-created)", o->partitions);
    while (!*stop) {
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return 0;
}

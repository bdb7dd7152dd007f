/* broker.h - `kinfer broker`: an embedded Kafka for development and tests.
 * librdkafka's mock cluster speaks the real Kafka protocol on loopback, so
 * any Kafka client can use it; running it as its own process lets tests
 * kill a worker without killing the cluster.
 *
 * Threads: main thread; the mock cluster runs its own. */
#ifndef KINFER_BROKER_H
#define KINFER_BROKER_H

#include <signal.h>

struct broker_opts {
    int brokers;        /* number of mock brokers, >= 1 */
    int partitions;     /* partitions of each topic created up front */
    const char *topics; /* comma-separated names, may be NULL */
};

/* Starts the cluster, creates the topics, prints the bootstrap list as the
 * first line of stdout and runs until *stop. Returns 0, or 1 with a message
 * on stderr. Borrows o. */
int broker_run(const struct broker_opts *o, volatile sig_atomic_t *stop);

#endif

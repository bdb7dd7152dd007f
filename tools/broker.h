/* broker.h - `kinfer broker`: an embedded Kafka for development and tests.
 * librdkafka's mock cluster speaks the real Kafka protocol on loopback, so
 * any Kafka client can use it; running it as its own process lets tests
 * kill a worker without killing the cluster.
 *
 * Threads: main thread; the mock cluster runs its own. */
#ifndef KINFER_BROKER_H
#define KINFER_BROKER_H

#include <signal.h>

/* The control channel, for `kinfer broker --help`: commands read from
 * stdin, one per line, each answered by one line on stdout. */
#define BROKER_CONTROL_HELP                                                        \
    "\n"                                                                           \
    "Control channel: after the bootstrap line, commands are read from stdin,\n"   \
    "one per line, and each is answered on stdout with one line, \"ok\" or\n"      \
    "\"error <why>\". End of input only stops the reading, never the broker.\n"   \
    "  down <broker_id|all>             close its connections, refuse new ones\n"  \
    "  up <broker_id|all>               accept connections again\n"                \
    "  rtt <broker_id|all> <ms>         delay every response by ms\n"              \
    "  error <ApiKey> <count> <errcode> fail the next count requests of ApiKey\n"  \
    "                                   (number or name: Produce, Fetch, ...;\n"   \
    "                                   errcode a number or NOT_LEADER_FOR_PARTITION)\n" \
    "  clear <ApiKey>                   drop the errors of ApiKey not used up yet\n"   \
    "  coordinator <group> <broker_id>  make broker_id the group's coordinator\n"  \
    "  leader <topic> <partition> <broker_id>  move a partition's leader\n"       \
    "  ping                             answers ok\n"                               \
    "Broker ids are 1..--brokers.\n"

struct broker_opts {
    int brokers;        /* number of mock brokers, >= 1 */
    int partitions;     /* partitions of each topic created up front */
    const char *topics; /* comma-separated names, may be NULL */
    int port;           /* > 0: the bootstrap address is 127.0.0.1:port
                           (broker_fwd.h); 0: the first broker's own */
};

/* Starts the cluster, creates the topics, prints the bootstrap list (with
 * a port, 127.0.0.1:port) as the first line of stdout and runs until *stop, serving the control channel
 * (BROKER_CONTROL_HELP) on stdin/stdout meanwhile. Returns 0, or 1 with a
 * message on stderr. Borrows o. */
int broker_run(const struct broker_opts *o, volatile sig_atomic_t *stop);

#endif

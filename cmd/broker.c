/* broker.c (cmd/) - `kinfer broker`: parses the options, installs the
 * signal handlers and runs the embedded Kafka (tools/broker.c's
 * broker_run) until a signal stops it.
 *
 * Threads: the main thread. */
#include <getopt.h>
#include <stdio.h>

#include "../tools/broker.h"
#include "cli.h"
#include "commands.h"

static const char usage[] =
    "usage: kinfer broker [--brokers N] [--partitions P] [--topics a,b,c] [--port N]\n"
    "\n"
    "Runs librdkafka's mock cluster: the Kafka protocol on loopback, for\n"
    "development and tests (no TLS/SASL; about 5 MB kept per partition).\n"
    "Prints the bootstrap address list as the first line of stdout and runs\n"
    "until SIGINT/SIGTERM.\n"
    "\n"
    "  -b, --brokers N      brokers in the cluster (default 1)\n"
    "  -p, --partitions P   partitions of each topic in --topics (default 4)\n"
    "  -t, --topics LIST    topics to create up front; others are auto-created\n"
    "  -P, --port N         bootstrap on 127.0.0.1:N, the same at every start (the\n"
    "                       brokers' own ports still change; clients find them\n"
    "                       through it); default: the first broker's own address\n";

/* `kinfer broker`: options, then broker_run until SIGINT/SIGTERM. --help
 * also lists the control channel's commands. */
int cmd_broker(int argc, char **argv)
{
    static const struct option opts[] = {
        {"brokers", required_argument, 0, 'b'}, {"partitions", required_argument, 0, 'p'},
        {"topics", required_argument, 0, 't'},  {"port", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    struct broker_opts o = {.brokers = 1, .partitions = 4, .topics = NULL};
    int ch;
    long v;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "b:p:t:P:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'b':
            if (cli_parse_long("broker", "--brokers", optarg, 1, 32, &v) < 0) return 1;
            o.brokers = (int)v;
            break;
        case 'p':
            if (cli_parse_long("broker", "--partitions", optarg, 1, 1024, &v) < 0) return 1;
            o.partitions = (int)v;
            break;
        case 't': o.topics = optarg; break;
        case 'P':
            if (cli_parse_long("broker", "--port", optarg, 1, 65535, &v) < 0) return 1;
            o.port = (int)v;
            break;
        case 'h': fputs(usage, stdout); fputs(BROKER_CONTROL_HELP, stdout); return 0;
        default: fputs(usage, stderr); return 1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer broker: unexpected argument '%s'\n", argv[optind]);
        return 1;
    }
    cli_install_signals();
    return broker_run(&o, &cli_stop);
}

/* worker.c (cmd/) - `kinfer worker`: parses -c and --set, loads the
 * config, installs the signal handlers and runs the worker (worker/) until
 * a signal stops it. The exit status is worker_run's.
 *
 * Threads: the main thread, which becomes the worker's poll thread. */
#include <getopt.h>
#include <stdio.h>

#include "../worker/worker.h"
#include "cli.h"
#include "commands.h"

static const char usage[] =
    "usage: kinfer worker -c FILE [--set section.key=value]...\n"
    "\n"
    "Consumes jobs from kafka.topics, runs them in batches and publishes each\n"
    "result to kafka.reply_topic and Redis; stops cleanly on SIGTERM/SIGINT.\n"
    "\n"
    "  -c, --config FILE   configuration file (see worker.cfg for every setting)\n"
    "  -s, --set K=V       override one setting, e.g. --set batching.max_wait_ms=10,\n"
    "                      or a list: --set kafka.topics=jobs,jobs.high\n"
    "\n"
    "exit status: 0 after a clean stop, 1 if it could not start, 2 on a fatal\n"
    "runtime error (restart it: unfinished jobs are redelivered).\n";

int cmd_worker(int argc, char **argv)
{
    static const struct option opts[] = {CLI_CONFIG_OPTIONS, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct cli_config cc;
    int rc = WORKER_EXIT_STARTUP, ch;
    if (cli_config_init(&cc, argc) < 0) return rc;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
        if (cli_config_opt(&cc, ch, optarg)) continue;
        if (ch == 'h') {
            fputs(usage, stdout);
            rc = 0;
        } else {
            fputs(usage, stderr);
        }
        goto out;
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer worker: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    struct kcfg *c = cli_config_load("worker", &cc);
    if (!c) goto out;
    cli_install_signals();
    rc = (int)worker_run(c, NULL, &cli_stop);
    cfg_destroy(c);
out:
    cli_config_fini(&cc);
    return rc;
}

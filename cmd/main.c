/* main.c - the kinfer binary: one program, subcommands. Finds the
 * subcommand and hands it the rest of the command line; each lives in a
 * file of its own (cmd/worker.c, cmd/replay.c, cmd/lag.c, ...), and
 * cmd/cli.c holds what they share. Only the subcommands decide the exit
 * status.
 *
 * Threads: main thread. */
#include <stdio.h>
#include <string.h>

#include "../gpu/model.h"
#include "lag.h"
#include "status.h"
#include "commands.h"
#include "replay.h"

#ifndef KINFER_VERSION
#define KINFER_VERSION "dev"
#endif

static const char usage_main[] =
    "usage: kinfer COMMAND [options]\n"
    "\n"
    "kinfer consumes inference jobs from Kafka, batches them, runs a model and\n"
    "publishes each result to a reply topic and to Redis.\n"
    "\n"
    "commands:\n"
    "  worker   run the worker:            kinfer worker -c worker.cfg\n"
    "  replay   recompute a range:         kinfer replay -c worker.cfg --from T --to T\n"
    "  lag      the group's lag:           kinfer lag -c worker.cfg [--json]\n"
    "  status   live workers (heartbeats): kinfer status -c worker.cfg [--json]\n"
    "  broker   run an embedded Kafka:     kinfer broker --topics jobs\n"
    "  smoke    check a running worker:    kinfer smoke -c worker.cfg\n"
    "  bench    load tools and floors:     kinfer bench --help (make bench runs them)\n"
    "  model    model tools:               kinfer model demo -o models/demo.safetensors\n"
    "\n"
    "  kinfer COMMAND --help   options of a command\n"
    "  kinfer --version        version and build\n";

/* The subcommands, by the name on the command line. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"worker", cmd_worker}, {"replay", replay_main}, {"lag", lag_main},
    {"status", status_main}, {"broker", cmd_broker}, {"smoke", cmd_smoke},
    {"bench", cmd_bench},  {"model", cmd_model},
};

/* The version, and what this build can do with CUDA on this machine. */
static void print_version(void)
{
    char cuda[512];
    model_cuda_describe(cuda, sizeof(cuda));
    printf("kinfer %s\n%s\n", KINFER_VERSION, cuda);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return 1;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        print_version();
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kinfer: unknown command '%s'\n\n%s", cmd, usage_main);
    return 1;
}

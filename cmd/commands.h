/* commands.h - the entry points of the subcommands whose files live in
 * cmd/ (the others are declared by their modules: replay.h, lag.h,
 * status.h). Each takes the command's argv
 * (argv[0] is the command's name) and returns the process exit status.
 *
 * Threads: the main thread. */
#ifndef KINFER_COMMANDS_H
#define KINFER_COMMANDS_H

/* `kinfer worker -c FILE [--set K=V]...`: 0 after a clean stop, 1 when it
 * could not start, 2 on a fatal runtime error. */
int cmd_worker(int argc, char **argv);

/* `kinfer model demo -o PATH [...]`: 0, or 1 on a usage or write error. */
int cmd_model(int argc, char **argv);

/* `kinfer broker [--brokers N] [--partitions P] [--topics a,b,c]`: runs
 * the embedded Kafka until a signal; 0, or 1 on a usage error. */
int cmd_broker(int argc, char **argv);

/* `kinfer smoke -c FILE [--set K=V]... [--model NAME] [--jobs N] [--rows K]
 * [--json-every N] [--rate R] [--timeout S]`: 0 when every job got a
 * correct result, else 1. */
int cmd_smoke(int argc, char **argv);

/* `kinfer bench COMMAND [options]`: the load tools and floors; 0, or 1 on
 * a failure or bad usage. */
int cmd_bench(int argc, char **argv);

#endif

/* commands.h - the entry points of the subcommands whose files live in
 * cmd/ (the others are declared by their modules: replay.h, lag.h,
 * status.h, bench.h, smoke.h, broker.h). Each takes the command's argv
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

#endif

/* status.h - `kinfer status`: the live workers of a group, from their
 * heartbeats in Redis.
 *
 * Threads: the main thread of the command. */
#ifndef KINFER_STATUS_H
#define KINFER_STATUS_H

/* `kinfer status -c FILE [--set K=V]... [--json]`: lists the live workers
 * of kafka.group from their heartbeats. argv[0] is "status". Returns the
 * exit status: 0 (also when none is live), 1 on a usage, config or Redis
 * error. */
int status_main(int argc, char **argv);

#endif

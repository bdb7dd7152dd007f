/* broker_fwd.h - a fixed bootstrap port for `kinfer broker` (--port):
 * connections to 127.0.0.1:port are relayed to the mock cluster's first
 * broker (broker_fwd.c says why that is enough).
 *
 * Threads: its own; start and stop from one thread. */
#ifndef KINFER_BROKER_FWD_H
#define KINFER_BROKER_FWD_H

#include <stddef.h>

struct broker_fwd;

/* Listens on 127.0.0.1:port and relays to the first address of
 * bootstraps (the cluster's "host:port,..." list). NULL with err set (the
 * system's reason: "Address already in use") when it cannot. */
struct broker_fwd *broker_fwd_start(int port, const char *bootstraps, char *err, size_t cap);

/* Stops accepting and frees the listener (relays end with the process). */
void broker_fwd_stop(struct broker_fwd *f);

#endif

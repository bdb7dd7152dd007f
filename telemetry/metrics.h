/* metrics.h - the worker's HTTP endpoints on metrics.listen, served by
 * libmicrohttpd from a thread of its own:
 *   /metrics  Prometheus text format (0.0.4), every kinfer_ metric
 *   /healthz  200 while the worker's loops report in; 503 once the
 *             watchdog tripped (JSON body says which loop)
 *   /readyz   200 when the model is loaded, the consumer joined, the
 *             producer connected and Redis reachable; else 503 with the
 *             reasons as JSON
 * The renderers are separate functions so tests can check the text
 * without a socket.
 *
 * Threads: metrics_start/metrics_stop on the main thread; requests are
 * answered on libmicrohttpd's thread, which only reads the stats. */
#ifndef KINFER_METRICS_H
#define KINFER_METRICS_H

#include <stddef.h>

#include "../config/config.h"
#include "stats.h"

struct metrics;

/* Starts serving c->metrics.listen ("host:port", "[v6]:port"; port 0
 * picks a free one) and sets st's watchdog bound from
 * c->metrics.watchdog_ms. An empty listen returns a server that serves
 * nothing (metrics_port gives 0). Returns NULL with errstr filled when the
 * address cannot be resolved or bound. Borrows c (not kept) and st (kept:
 * st must outlive the server). */
struct metrics *metrics_start(const struct kcfg *c, struct stats *st, char *errstr,
                              size_t errstr_size);

/* Stops the server, waiting for a request being answered; frees m.
 * Accepts NULL. */
void metrics_stop(struct metrics *m);

/* The port actually bound (useful with port 0), or 0 when not serving. */
int metrics_port(const struct metrics *m);

/* The /metrics body for s: Prometheus text format, one family per
 * metric with HELP and TYPE. *out is new (caller frees), *len its length.
 * Returns 0, or -1 when out of memory. Borrows s. */
int metrics_render(const struct stats_snapshot *s, char **out, size_t *len);

/* The /readyz body, {"ready":bool,"reasons":[...],"backend":"cpu"}. Returns 1 when
 * ready, 0 when not, -1 when out of memory. *out is new. */
int metrics_render_ready(const struct stats_snapshot *s, char **out, size_t *len);

/* The /healthz body, {"healthy":bool,"reason":"...","loops":{name:
 * seconds since it last reported}}. Returns 1 when healthy, 0 when the
 * watchdog tripped, -1 when out of memory. *out is new. */
int metrics_render_health(const struct stats_snapshot *s, char **out, size_t *len);

#endif

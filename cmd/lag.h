/* lag.h - `kinfer lag`: the consumer group's lag per partition, asked of
 * the brokers directly (committed offsets against high watermarks), so it
 * works with no worker running: before the first one starts, after the
 * last one stopped, or to check what the workers' own metrics say.
 *
 * Threads: main thread of the `lag` command. */
#ifndef KINFER_LAG_H
#define KINFER_LAG_H

#include <stddef.h>
#include <stdint.h>

#include "../config/config.h"

/* One partition of one input topic. */
struct lag_row {
    char *topic;
    int32_t partition;
    int64_t committed; /* the group's committed offset, -1 when none */
    int64_t low, high; /* the partition's watermarks */
    int64_t lag;       /* high - committed; high - low when nothing is committed */
};

struct lag_report {
    struct lag_row *rows; /* by topic (config order), then partition */
    size_t n;
    int64_t total;
    char **missing;       /* input topics the cluster does not have */
    size_t n_missing;
};

/* The lag of c->kafka.group on every partition of c->kafka.topics, from
 * metadata, rd_kafka_committed and rd_kafka_query_watermark_offsets, each
 * bounded by timeout_ms. Never joins the group and never commits.
 * Returns 0 with *out filled (release with lag_report_fini), or -1 with
 * errstr filled. Borrows c. */
int lag_query(const struct kcfg *c, int timeout_ms, struct lag_report *out, char *errstr,
              size_t errstr_size);
/* Frees what a report owns; accepts a zeroed one. */
void lag_report_fini(struct lag_report *r);

/* `kinfer lag -c FILE [--set K=V]... [--json] [--timeout S]`; argv[0] is
 * "lag". Prints the table (or JSON) and returns the exit status: 0, or 1
 * on a usage or config error or when the brokers did not answer. */
int lag_main(int argc, char **argv);

#endif

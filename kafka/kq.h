/* kq.h - librdkafka configuration for kinfer's consumer and producer: the
 * settings the delivery guarantee depends on, then every property from the
 * config passed straight through (config validation has already refused
 * unsafe values), and librdkafka's logs routed to kinfer's logger.
 *
 * Threads: main thread at startup. */
#ifndef KINFER_KQ_H
#define KINFER_KQ_H

#include <librdkafka/rdkafka.h>
#include <stdatomic.h>
#include <stddef.h>

#include "../telemetry/stats.h"
#include "../config/config.h"

enum kq_role { KQ_CONSUMER, KQ_PRODUCER };

/* Returns a new conf for role (caller owns it until rd_kafka_new takes
 * it), or NULL with errstr filled ("kafka.properties: <librdkafka's
 * message>"). Each of c's kafka.properties is given to the client only
 * when it is of the client's kind or both (kq_property_scope); the others
 * are skipped with a debug line. Borrows c. */
rd_kafka_conf_t *kq_conf_new(const struct kcfg *c, enum kq_role role,
                             char *errstr, size_t errstr_size);

/* What every client of the worker reports through: librdkafka's
 * statistics go to stats, a fatal client error sets *fatal. The opaque of
 * a client made by kq_client_new must point at a struct whose first member
 * is a struct kq_ctx (the stage that owns the client), because librdkafka
 * hands every callback the same opaque. */
struct kq_ctx {
    struct stats *stats;
    atomic_int *fatal;
};

/* The stage-specific parts of a client. */
struct kq_hooks {
    void *opaque;           /* starts with a struct kq_ctx (see above) */
    const char *group;      /* consumer: group.id instead of kafka.group; NULL = it */
    /* consumer: the rebalance callback; producer: the delivery report */
    void (*rebalance_cb)(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque);
    void (*dr_msg_cb)(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque);
};

/* A consumer or producer of the worker: kq_conf_new's configuration, the
 * hooks, and the shared error and statistics callbacks. Returns a new
 * client, or NULL with errstr filled. Borrows c and h. */
rd_kafka_t *kq_client_new(const struct kcfg *c, enum kq_role role, const struct kq_hooks *h,
                          char *errstr, size_t errstr_size);

/* Which client a librdkafka property (or topic property, or alias) is
 * for, as the linked librdkafka lists it: 'C' consumer, 'P' producer,
 * '*' both, 0 unknown to it. Borrows name. */
char kq_property_scope(const char *name);

/* Sets one property; on failure fills errstr and returns -1. */
int kq_set(rd_kafka_conf_t *conf, const char *name, const char *value,
           char *errstr, size_t errstr_size);

/* The last header called name of m, NUL-terminated into buf (cut to
 * cap - 1 bytes), or NULL when m has none. */
const char *kq_header_string(const rd_kafka_message_t *m, const char *name, char *buf,
                             size_t cap);

/* Closes a consumer by deadline_us (clock_mono_us). rd_kafka_consumer_close
 * waits without a bound for the group to wind down: the revoke, the
 * commit, the LeaveGroup and every request in flight to the coordinator,
 * each held up to socket.timeout.ms (60 s) when the coordinator is slow
 * or does not answer, and rd_kafka_destroy waits the same way. Here the
 * close runs on a queue of its own, served until the consumer is closed
 * or the deadline passes; a rebalance on the way goes to rebalance(rk,
 * err, partitions, opaque), as it would to the rebalance callback.
 * Returns 1 when closed, 0 when the deadline passed first (destroying rk
 * would wait again: leave it to the process's exit), -1 when the close
 * could not start (errstr says why). */
int kq_consumer_close_by(rd_kafka_t *rk, int64_t deadline_us,
                         void (*rebalance)(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                                           rd_kafka_topic_partition_list_t *parts,
                                           void *opaque),
                         void *opaque, char *errstr, size_t errstr_size);

#endif

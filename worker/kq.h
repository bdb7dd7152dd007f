/* kq.h - librdkafka configuration for kinfer's consumer and producer: the
 * settings the delivery guarantee depends on, then every property from the
 * config passed straight through (config validation has already refused
 * unsafe values), and librdkafka's logs routed to kinfer's logger.
 *
 * Threads: main thread at startup. */
#ifndef KINFER_KQ_H
#define KINFER_KQ_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>

#include "config.h"

enum kq_role { KQ_CONSUMER, KQ_PRODUCER };

/* Returns a new conf for role (caller owns it until rd_kafka_new takes
 * it), or NULL with errstr filled ("kafka.properties: <librdkafka's
 * message>"). Borrows c. */
rd_kafka_conf_t *kq_conf_new(const struct kcfg *c, enum kq_role role,
                             char *errstr, size_t errstr_size);

/* Sets one property; on failure fills errstr and returns -1. */
int kq_set(rd_kafka_conf_t *conf, const char *name, const char *value,
           char *errstr, size_t errstr_size);

#endif

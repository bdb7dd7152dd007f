/* config_kafka.c - the Kafka settings that are lists: kafka.topics, and
 * kafka.properties, librdkafka's own properties passed through as string
 * pairs (libconfig names cannot hold their dots), except that the few the
 * delivery guarantee rests on are guarded: an unsafe value stops startup
 * with the reason.
 *
 * Threads: main thread, inside cfg_load. Ownership: every string read is
 * copied into the struct kcfg being built. */
#include "config_read.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* kafka.topics: a non-empty list or array of distinct, non-empty strings.
 * Replaces the default list. */
int cfg_read_topics(struct loader *ld, const config_setting_t *s)
{
    struct kcfg *c = ld->c;
    if (!config_setting_is_list(s) && !config_setting_is_array(s))
        return cfg_fail_at(ld, s, "kafka.topics: expected a list of strings [ \"jobs\" ], got %s",
                       cfg_type_words(config_setting_type(s)));
    int n = config_setting_length(s);
    if (n == 0) return cfg_fail_at(ld, s, "kafka.topics: must name at least one topic");
    for (size_t i = 0; i < c->kafka.n_topics; i++) free(c->kafka.topics[i]);
    free(c->kafka.topics);
    c->kafka.n_topics = 0;
    c->kafka.topics = calloc((size_t)n, sizeof(char *));
    if (!c->kafka.topics) return cfg_fail_plain(ld, "out of memory");
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        if (config_setting_type(e) != CONFIG_TYPE_STRING)
            return cfg_fail_at(ld, e, "kafka.topics[%d]: expected a string, got %s", i,
                           cfg_type_words(config_setting_type(e)));
        const char *t = config_setting_get_string(e);
        if (!*t) return cfg_fail_at(ld, e, "kafka.topics[%d]: must not be empty", i);
        for (size_t j = 0; j < c->kafka.n_topics; j++)
            if (strcmp(c->kafka.topics[j], t) == 0)
                return cfg_fail_at(ld, e, "kafka.topics: '%s' is listed twice", t);
        if (!(c->kafka.topics[i] = strdup(t))) return cfg_fail_plain(ld, "out of memory");
        c->kafka.n_topics++;
    }
    return 0;
}

/* librdkafka properties kinfer's delivery guarantees rest on. They pass
 * through like any other property when given their safe value (which is
 * harmless), and are refused otherwise, saying why; safe == NULL means
 * kinfer sets it from its own setting and it may not be given here. */
static const char *const bool_true[] = {"true", "t", "1", NULL};
static const char *const bool_false[] = {"false", "f", "0", NULL};
static const char *const acks_all[] = {"all", "-1", NULL};
static const char *const reset_earliest[] = {"earliest", "smallest", "beginning", NULL};
static const char *const store_broker[] = {"broker", NULL};

static const struct guarded_property {
    const char *name;
    const char *const *safe;
    const char *why;
} guarded[] = {
    {"enable.auto.offset.store", bool_false,
     "must stay false: kinfer stores each offset itself, only after the job's result is "
     "acknowledged, so a crash replays jobs instead of losing them"},
    {"enable.auto.commit", bool_true,
     "must stay true: kinfer commits the offsets it stored through librdkafka's auto-commit"},
    {"auto.commit.enable", bool_true,
     "must stay true: kinfer commits the offsets it stored through librdkafka's auto-commit"},
    {"offset.store.method", store_broker,
     "must be broker: kinfer's progress lives in the consumer group's committed offsets"},
    {"auto.offset.reset", reset_earliest,
     "must be earliest: a new consumer group must not skip jobs already waiting"},
    {"enable.idempotence", bool_true,
     "must stay true: a retried produce must not publish a result twice or out of order"},
    {"acks", acks_all,
     "must be all (or -1): a job's offset is stored once its result is acknowledged, which "
     "must mean every in-sync replica has it"},
    {"request.required.acks", acks_all,
     "must be all (or -1): a job's offset is stored once its result is acknowledged, which "
     "must mean every in-sync replica has it"},
    {"transactional.id", NULL,
     "cannot be set: kinfer does not use transactions, and a transactional producer refuses "
     "plain produces"},
    {"group.id", NULL, "cannot be set here: use kafka.group"},
    {"group.instance.id", NULL,
     "cannot be set here: set metrics.worker_id (unique per worker), which "
     "kafka.static_membership = 1 makes the static member id"},
    {"bootstrap.servers", NULL, "cannot be set here: use kafka.brokers"},
    {"metadata.broker.list", NULL, "cannot be set here: use kafka.brokers"},
};

/* Returns why property key=value is refused, or NULL if it may pass
 * through to librdkafka. Values compare without case, as librdkafka's
 * own parsing of booleans and enums does. */
const char *cfg_property_refusal(const char *key, const char *value)
{
    for (size_t i = 0; i < sizeof(guarded) / sizeof(guarded[0]); i++) {
        if (strcmp(guarded[i].name, key) != 0) continue;
        if (guarded[i].safe)
            for (const char *const *v = guarded[i].safe; *v; v++)
                if (strcasecmp(*v, value) == 0) return NULL;
        return guarded[i].why;
    }
    return NULL;
}

/* Adds key=value to kafka.properties, or replaces the value of a key
 * already there (a --set overrides the file; a key given twice in the
 * file is refused by cfg_read_properties before it gets here). */
int cfg_property_put(struct loader *ld, const char *key, const char *value)
{
    struct kcfg *c = ld->c;
    for (size_t i = 0; i < c->kafka.n_properties; i++) {
        if (strcmp(c->kafka.properties[i].key, key) != 0) continue;
        char *v = strdup(value);
        if (!v) return cfg_fail_plain(ld, "out of memory");
        free(c->kafka.properties[i].value);
        c->kafka.properties[i].value = v;
        return 0;
    }
    struct cfg_kv *p = realloc(c->kafka.properties,
                               (c->kafka.n_properties + 1) * sizeof(*p));
    if (!p) return cfg_fail_plain(ld, "out of memory");
    c->kafka.properties = p;
    struct cfg_kv *kv = &p[c->kafka.n_properties];
    kv->key = strdup(key);
    kv->value = strdup(value);
    if (!kv->key || !kv->value) {
        free(kv->key);
        free(kv->value);
        return cfg_fail_plain(ld, "out of memory");
    }
    c->kafka.n_properties++;
    return 0;
}

/* kafka.properties: ( ( "name", "value" ), ... ). libconfig 1.5 names
 * cannot hold dots, so librdkafka's dotted names travel as string pairs
 * and reach librdkafka untouched (kinfer never re-declares its options),
 * except the guarded ones above. */
int cfg_read_properties(struct loader *ld, const config_setting_t *s)
{
    /* An empty [] is an array; a non-empty one cannot hold pairs. */
    if (!config_setting_is_list(s) &&
        !(config_setting_is_array(s) && config_setting_length(s) == 0))
        return cfg_fail_at(ld, s,
                       "kafka.properties: expected a list of pairs "
                       "( ( \"name\", \"value\" ), ... ), got %s",
                       cfg_type_words(config_setting_type(s)));
    int n = config_setting_length(s);
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        bool pair = (config_setting_is_list(e) || config_setting_is_array(e)) &&
                    config_setting_length(e) == 2 &&
                    config_setting_type(config_setting_get_elem(e, 0)) == CONFIG_TYPE_STRING &&
                    config_setting_type(config_setting_get_elem(e, 1)) == CONFIG_TYPE_STRING;
        if (!pair)
            return cfg_fail_at(ld, e,
                           "kafka.properties[%d]: expected a pair of strings "
                           "( \"name\", \"value\" ); write numbers as strings too",
                           i);
        const char *key = config_setting_get_string_elem(e, 0);
        const char *value = config_setting_get_string_elem(e, 1);
        if (!*key) return cfg_fail_at(ld, e, "kafka.properties[%d]: empty property name", i);
        for (size_t j = 0; j < ld->c->kafka.n_properties; j++)
            if (strcmp(ld->c->kafka.properties[j].key, key) == 0)
                return cfg_fail_at(ld, e, "kafka.properties: '%s' is given twice", key);
        const char *why = cfg_property_refusal(key, value);
        if (why) return cfg_fail_at(ld, e, "kafka.properties: '%s' %s", key, why);
        if (cfg_property_put(ld, key, value) < 0) return -1;
    }
    return 0;
}

/* lag.c - `kinfer lag`: the group's lag per partition from the brokers.
 *
 * A consumer handle configured like the worker's (same brokers, group,
 * security properties) asks for the cluster metadata, the group's
 * committed offsets and each partition's watermarks. It never subscribes,
 * so it never joins the group or takes partitions from the workers, and
 * auto-commit is off, so it cannot move an offset.
 *
 * Threads: main thread. Ownership: a lag_report owns its rows and
 * strings; the librdkafka handle lives only inside lag_query. */
#include "lag.h"

#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../kafka/kq.h"
#include "../base/log.h"

/* Partition order inside a topic, for a stable table. */
static int by_partition(const void *a, const void *b)
{
    const struct lag_row *x = a, *y = b;
    return (x->partition > y->partition) - (x->partition < y->partition);
}

/* Committed offset and watermarks to lag. With nothing committed the
 * worker starts at the earliest offset (auto.offset.reset=earliest), so
 * the whole log is lag; a committed offset below the low watermark
 * (retention deleted what it pointed at) means the same. */
static int64_t row_lag(int64_t committed, int64_t low, int64_t high)
{
    int64_t from = committed >= 0 && committed >= low ? committed : low;
    return high > from ? high - from : 0;
}

/* Frees the rows and names; leaves r zeroed so a second call is harmless. */
void lag_report_fini(struct lag_report *r)
{
    for (size_t i = 0; i < r->n; i++) free(r->rows[i].topic);
    free(r->rows);
    for (size_t i = 0; i < r->n_missing; i++) free(r->missing[i]);
    free(r->missing);
    memset(r, 0, sizeof(*r));
}

/* Appends the rows of one topic found in the metadata. */
static int add_topic_rows(struct lag_report *r, const rd_kafka_metadata_topic_t *t)
{
    size_t first = r->n;
    struct lag_row *nr = realloc(r->rows, (r->n + (size_t)t->partition_cnt + 1) * sizeof(*nr));
    if (!nr) return -1;
    r->rows = nr;
    for (int i = 0; i < t->partition_cnt; i++) {
        struct lag_row *row = &r->rows[r->n];
        memset(row, 0, sizeof(*row));
        if (!(row->topic = strdup(t->topic))) return -1;
        row->partition = t->partitions[i].id;
        row->committed = -1;
        r->n++;
    }
    qsort(r->rows + first, r->n - first, sizeof(*r->rows), by_partition);
    return 0;
}

/* One metadata request, one committed-offsets request and a watermark
 * query per partition, each bounded by timeout_ms, so an unreachable
 * cluster ends in an error rather than a hang. */
int lag_query(const struct kcfg *c, int timeout_ms, struct lag_report *out, char *errstr,
              size_t errstr_size)
{
    memset(out, 0, sizeof(*out));
    char err[512];
    rd_kafka_t *rk = NULL;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_partition_list_t *l = NULL;
    rd_kafka_conf_t *conf = kq_conf_new(c, KQ_CONSUMER, errstr, errstr_size);
    if (!conf) return -1;
    /* A bystander: no commits, no statistics. */
    if (kq_set(conf, "enable.auto.commit", "false", errstr, errstr_size) < 0 ||
        kq_set(conf, "statistics.interval.ms", "0", errstr, errstr_size) < 0) {
        rd_kafka_conf_destroy(conf);
        return -1;
    }
    if (!(rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err)))) {
        rd_kafka_conf_destroy(conf);
        snprintf(errstr, errstr_size, "kafka client: %s", err);
        return -1;
    }
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms);
    if (e) {
        snprintf(errstr, errstr_size, "metadata from %s: %s", c->kafka.brokers,
                 rd_kafka_err2str(e));
        goto fail;
    }
    for (size_t k = 0; k < c->kafka.n_topics; k++) {
        const rd_kafka_metadata_topic_t *t = NULL;
        for (int i = 0; i < md->topic_cnt && !t; i++)
            if (strcmp(md->topics[i].topic, c->kafka.topics[k]) == 0) t = &md->topics[i];
        if (!t || t->err || t->partition_cnt == 0) {
            char **nm = realloc(out->missing, (out->n_missing + 1) * sizeof(*nm));
            if (!nm) goto oom;
            out->missing = nm;
            if (!(out->missing[out->n_missing] = strdup(c->kafka.topics[k]))) goto oom;
            out->n_missing++;
            continue;
        }
        if (add_topic_rows(out, t) < 0) goto oom;
    }
    if (out->n) {
        l = rd_kafka_topic_partition_list_new((int)out->n);
        for (size_t i = 0; i < out->n; i++)
            rd_kafka_topic_partition_list_add(l, out->rows[i].topic, out->rows[i].partition);
        e = rd_kafka_committed(rk, l, timeout_ms);
        if (e) {
            snprintf(errstr, errstr_size, "committed offsets of group %s: %s", c->kafka.group,
                     rd_kafka_err2str(e));
            goto fail;
        }
    }
    for (size_t i = 0; i < out->n; i++) {
        struct lag_row *row = &out->rows[i];
        const rd_kafka_topic_partition_t *p =
            rd_kafka_topic_partition_list_find(l, row->topic, row->partition);
        if (p && !p->err && p->offset >= 0) row->committed = p->offset;
        e = rd_kafka_query_watermark_offsets(rk, row->topic, row->partition, &row->low,
                                             &row->high, timeout_ms);
        if (e) {
            snprintf(errstr, errstr_size, "watermarks of %s [%" PRId32 "]: %s", row->topic,
                     row->partition, rd_kafka_err2str(e));
            goto fail;
        }
        row->lag = row_lag(row->committed, row->low, row->high);
        out->total += row->lag;
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_metadata_destroy(md);
    rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    return 0;
oom:
    snprintf(errstr, errstr_size, "out of memory");
fail:
    if (l) rd_kafka_topic_partition_list_destroy(l);
    if (md) rd_kafka_metadata_destroy(md);
    rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    lag_report_fini(out);
    return -1;
}

/* The report as one JSON document: partitions, per-topic totals, total,
 * and the topics that do not exist. */
static char *report_json(const struct kcfg *c, const struct lag_report *r)
{
    json_t *doc = json_object(), *parts = json_array(), *topics = json_object(),
           *missing = json_array();
    for (size_t i = 0; i < r->n; i++) {
        const struct lag_row *row = &r->rows[i];
        json_t *committed = row->committed >= 0 ? json_integer(row->committed) : json_null();
        json_array_append_new(parts, json_pack("{s:s, s:i, s:o, s:I, s:I, s:I}", "topic",
                                               row->topic, "partition", (int)row->partition,
                                               "committed", committed, "low",
                                               (json_int_t)row->low, "high",
                                               (json_int_t)row->high, "lag",
                                               (json_int_t)row->lag));
        json_t *sum = json_object_get(topics, row->topic);
        json_int_t before = sum ? json_integer_value(sum) : 0;
        json_object_set_new(topics, row->topic, json_integer(before + row->lag));
    }
    for (size_t i = 0; i < r->n_missing; i++)
        json_array_append_new(missing, json_string(r->missing[i]));
    json_object_set_new(doc, "group", json_string(c->kafka.group));
    json_object_set_new(doc, "partitions", parts);
    json_object_set_new(doc, "topics", topics);
    json_object_set_new(doc, "total_lag", json_integer((json_int_t)r->total));
    json_object_set_new(doc, "missing_topics", missing);
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return text;
}

/* The report as a table with a per-topic and an overall total. */
static void report_text(const struct kcfg *c, const struct lag_report *r)
{
    printf("group %s (brokers %s)\n", c->kafka.group, c->kafka.brokers);
    printf("%-32s %9s %12s %12s %12s %12s\n", "TOPIC", "PARTITION", "COMMITTED", "LOW", "HIGH",
           "LAG");
    for (size_t i = 0; i < r->n; i++) {
        const struct lag_row *row = &r->rows[i];
        char committed[24];
        if (row->committed >= 0) snprintf(committed, sizeof(committed), "%" PRId64, row->committed);
        else snprintf(committed, sizeof(committed), "-");
        printf("%-32s %9" PRId32 " %12s %12" PRId64 " %12" PRId64 " %12" PRId64 "\n", row->topic,
               row->partition, committed, row->low, row->high, row->lag);
    }
    for (size_t i = 0; i < r->n;) {
        int64_t sum = 0;
        size_t k = i;
        for (; k < r->n && strcmp(r->rows[k].topic, r->rows[i].topic) == 0; k++)
            sum += r->rows[k].lag;
        printf("topic %s: lag %" PRId64 "\n", r->rows[i].topic, sum);
        i = k;
    }
    for (size_t i = 0; i < r->n_missing; i++)
        printf("topic %s: not found in the cluster\n", r->missing[i]);
    printf("total lag %" PRId64 "\n", r->total);
}

static const char usage_lag[] =
    "usage: kinfer lag -c FILE [--set section.key=value]... [--json] [--timeout S]\n"
    "\n"
    "Prints the lag of kafka.group on every partition of kafka.topics, asked of\n"
    "the brokers: committed offset against the high watermark (the whole log\n"
    "when nothing is committed yet), with per-topic and overall totals. Needs no\n"
    "worker running; never joins the group or commits.\n"
    "\n"
    "  -c, --config FILE   configuration file (brokers, group, topics, properties)\n"
    "  -s, --set K=V       override one setting\n"
    "  -j, --json          one JSON document instead of a table\n"
    "  -T, --timeout S     seconds to wait for each broker request (default 10)\n";

/* The `kinfer lag` command: config, query, print. */
int lag_main(int argc, char **argv)
{
    static const struct option opts[] = {CLI_CONFIG_OPTIONS,
                                         {"json", no_argument, 0, 'j'},
                                         {"timeout", required_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct cli_config cc;
    int as_json = 0, rc = 1, ch;
    long timeout_s = 10;
    struct kcfg *c = NULL;
    struct lag_report r = {0};
    if (cli_config_init(&cc, argc) < 0) return 1;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:s:jT:h", opts, NULL)) != -1) {
        if (cli_config_opt(&cc, ch, optarg)) continue;
        switch (ch) {
        case 'j': as_json = 1; break;
        case 'T':
            if (cli_parse_long("lag", "--timeout", optarg, 1, 3600, &timeout_s) < 0) goto out;
            break;
        case 'h': fputs(usage_lag, stdout); rc = 0; goto out;
        default: fputs(usage_lag, stderr); goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer lag: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (!(c = cli_config_load("lag", &cc))) goto out;
    char err[1024];
    if (lag_query(c, (int)timeout_s * 1000, &r, err, sizeof(err)) < 0) {
        fprintf(stderr, "kinfer lag: %s\n", err);
        goto out;
    }
    if (as_json) {
        char *text = report_json(c, &r);
        if (!text) {
            fprintf(stderr, "kinfer lag: out of memory\n");
            goto out;
        }
        printf("%s\n", text);
        free(text);
    } else {
        report_text(c, &r);
    }
    rc = 0;
out:
    lag_report_fini(&r);
    cfg_destroy(c);
    cli_config_fini(&cc);
    return rc;
}

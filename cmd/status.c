/* status.c - `kinfer status`: lists the live workers of a consumer group
 * from their Redis heartbeats (telemetry/heartbeat.c writes them), as a
 * table or as JSON. Reads only: one SCAN pass and an HGETALL per worker.
 *
 * Threads: the main thread of the command. */
#include "status.h"

#include <getopt.h>
#include <hiredis/hiredis.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "cli.h"
#include "../config/config.h"
#include "../telemetry/heartbeat.h"

static const char usage_status[] =
    "usage: kinfer status -c FILE [--set section.key=value]... [--json]\n"
    "\n"
    "Lists the live workers of kafka.group from their Redis heartbeats (hashes\n"
    "at <metrics.heartbeat_prefix><kafka.group>:<id>, refreshed every\n"
    "metrics.heartbeat_interval_ms and gone three intervals after a worker\n"
    "stops writing them).\n"
    "\n"
    "  -c, --config FILE   configuration file (Redis and group are read from it)\n"
    "  -s, --set K=V       override one setting\n"
    "  -j, --json          one JSON document instead of a table\n";

/* Reads one worker's hash into a JSON object typed by hb_fields, plus
 * heartbeat_age_s from updated_at_ms (how long since the worker last
 * wrote it; its uptime is started_at_ms's). Returns a new object or NULL. */
static json_t *read_worker(redisContext *c, const char *key, int64_t now_ms)
{
    const char *argv[] = {"HGETALL", key};
    redisReply *r = redisCommandArgv(c, 2, argv, NULL);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        if (r) freeReplyObject(r);
        return NULL; /* expired between SCAN and HGETALL */
    }
    json_t *o = json_object();
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *name = r->element[i]->str, *v = r->element[i + 1]->str;
        if (!name || !v) continue;
        enum hb_type t = hb_field_type(name);
        json_t *jv;
        if (t == HB_INT) jv = json_integer((json_int_t)strtoll(v, NULL, 10));
        else if (t == HB_NUM) jv = json_real(strtod(v, NULL));
        else if (t == HB_BOOL) jv = json_boolean(strcmp(v, "0") != 0);
        else if (t == HB_LIST) {
            jv = json_array();
            char *copy = strdup(v), *save = NULL;
            for (char *p = copy ? strtok_r(copy, ",", &save) : NULL; p;
                 p = strtok_r(NULL, ",", &save))
                json_array_append_new(jv, json_string(p));
            free(copy);
        } else jv = json_string(v);
        json_object_set_new(o, name, jv);
    }
    freeReplyObject(r);
    json_t *upd = json_object_get(o, "updated_at_ms");
    if (json_is_integer(upd))
        json_object_set_new(o, "heartbeat_age_s",
                            json_real((double)(now_ms - json_integer_value(upd)) / 1000.0));
    return o;
}

/* Workers in id order, so repeated runs line up. */
static int by_id(const void *a, const void *b)
{
    const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    const char *ix = json_string_value(json_object_get(x, "id"));
    const char *iy = json_string_value(json_object_get(y, "id"));
    return strcmp(ix ? ix : "", iy ? iy : "");
}

/* Collects every live worker's hash with SCAN (never KEYS: this may run
 * against a busy production Redis). Returns a new JSON array or NULL
 * with err filled. */
static json_t *list_workers(const struct kcfg *c, char *err, size_t cap)
{
    redisContext *rc = hb_redis_open(c->redis.host, c->redis.port, c->redis.password, c->redis.db,
                                  c->redis.timeout_ms, err, cap);
    if (!rc) return NULL;
    char pattern[2600];
    hb_key_pattern(c->metrics.heartbeat_prefix, c->kafka.group, pattern, sizeof(pattern));
    json_t *arr = json_array();
    char cursor[32] = "0";
    int64_t now = clock_wall_ms();
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "200"};
        redisReply *r = redisCommandArgv(rc, 6, argv, NULL);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            snprintf(err, cap, "SCAN: %s", r && r->type == REDIS_REPLY_ERROR ? r->str
                                            : rc->errstr[0]                  ? rc->errstr
                                                                             : "bad reply");
            if (r) freeReplyObject(r);
            json_decref(arr);
            redisFree(rc);
            return NULL;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str ? r->element[0]->str : "0");
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            json_t *w = read_worker(rc, r->element[1]->element[i]->str, now);
            if (w) json_array_append_new(arr, w);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    redisFree(rc);

    size_t n = json_array_size(arr);
    json_t **items = n ? malloc(n * sizeof(*items)) : NULL;
    if (items) {
        for (size_t i = 0; i < n; i++) items[i] = json_incref(json_array_get(arr, i));
        qsort(items, n, sizeof(*items), by_id);
        json_array_clear(arr);
        for (size_t i = 0; i < n; i++) json_array_append_new(arr, items[i]);
        free(items);
    }
    return arr;
}

/* A numeric field as text for the table, "-" when absent. */
static void cell(const json_t *w, const char *name, char *buf, size_t cap)
{
    const json_t *v = json_object_get(w, name);
    if (json_is_integer(v)) snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v)) snprintf(buf, cap, "%.1f", json_real_value(v));
    else if (json_is_boolean(v)) snprintf(buf, cap, "%s", json_is_true(v) ? "yes" : "no");
    else if (json_is_string(v)) snprintf(buf, cap, "%s", json_string_value(v));
    else snprintf(buf, cap, "-");
}

/* The `kinfer status` command: config, one SCAN pass, a table or JSON. */
int status_main(int argc, char **argv)
{
    static const struct option opts[] = {CLI_CONFIG_OPTIONS,
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct cli_config cc;
    int as_json = 0, rc = 1, ch;
    struct kcfg *c = NULL;
    json_t *workers = NULL;
    if (cli_config_init(&cc, argc) < 0) return 1;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:s:jh", opts, NULL)) != -1) {
        if (cli_config_opt(&cc, ch, optarg)) continue;
        switch (ch) {
        case 'j': as_json = 1; break;
        case 'h': fputs(usage_status, stdout); rc = 0; goto out;
        default: fputs(usage_status, stderr); goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kinfer status: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (!(c = cli_config_load("status", &cc))) goto out;
    char err[1024];
    if (!*c->metrics.heartbeat_prefix) {
        fprintf(stderr, "kinfer status: metrics.heartbeat_prefix is empty: workers write no "
                        "heartbeat\n");
        goto out;
    }
    if (!(workers = list_workers(c, err, sizeof(err)))) {
        fprintf(stderr, "kinfer status: redis %s\n", err);
        goto out;
    }
    size_t n = json_array_size(workers);
    if (as_json) {
        json_t *doc = json_pack("{s:s, s:O}", "group", c->kafka.group, "workers", workers);
        /* Reals at 10 significant digits: what the heartbeat wrote (0.103),
         * not the nearest double's 17 (0.10299999999999999). */
        char *text = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
        if (!text) {
            json_decref(doc);
            fprintf(stderr, "kinfer status: out of memory\n");
            goto out;
        }
        printf("%s\n", text);
        free(text);
        json_decref(doc);
    } else {
        printf("group %s: %zu live worker%s\n", c->kafka.group, n, n == 1 ? "" : "s");
        if (n)
            printf("%-28s %-20s %-7s %8s %6s %10s %13s %10s %8s %5s %15s %-24s %s\n", "ID", "HOST",
                   "BACKEND", "ASSIGNED", "PAUSED", "QUEUE_ROWS", "INFLIGHT_ROWS", "LAG",
                   "JOBS/S", "READY", "HEARTBEAT_AGE_S", "MODELS", "DEVICE");
        for (size_t i = 0; i < n; i++) {
            const json_t *w = json_array_get(workers, i);
            char f[10][64];
            const char *names[] = {"id", "host", "backend", "assigned", "paused", "queue_rows",
                                   "inflight_rows", "lag", "jobs_per_second", "ready"};
            for (int k = 0; k < 10; k++) cell(w, names[k], f[k], sizeof(f[k]));
            char age[32], dev[128], mods[512];
            cell(w, "heartbeat_age_s", age, sizeof(age));
            cell(w, "device", dev, sizeof(dev));
            cell(w, "models", mods, sizeof(mods));
            printf("%-28s %-20s %-7s %8s %6s %10s %13s %10s %8s %5s %15s %-24s %s\n", f[0], f[1],
                   f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], age, mods[0] ? mods : "-", dev);
        }
    }
    rc = 0;
out:
    json_decref(workers);
    cfg_destroy(c);
    cli_config_fini(&cc);
    return rc;
}

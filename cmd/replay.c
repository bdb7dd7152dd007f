/* replay.c - `kinfer replay`: recomputes a bounded range of history through
 * the worker pipeline (batcher, model, reply topic, Redis) next to live
 * traffic.
 *
 *   command line -> bounds (time, Unix ms, earliest, now, offsets)
 *   -> per-partition offset ranges: watermarks, offsets-for-times (and a
 *      scan of record timestamps where the broker has no time index)
 *   -> checkpoint: a consumer group of the replay's own, named after what
 *      is replayed; refused, resumed (--resume) or reset (--restart)
 *   -> worker_run in assign mode over exactly those ranges
 *   -> progress on stderr, summary on stdout.
 *
 * The live consumer group is never joined and never committed to: every
 * librdkafka handle made here and in worker_run carries the replay group.
 *
 * This file is the command: options, config, the plan's printout, the
 * run and its progress; replay_bounds.c parses the bounds, replay_plan.c
 * resolves them into ranges and keeps the checkpoint.
 *
 * Threads: main thread; the progress callback runs on it too (it is
 * worker_run's poll loop). The signal handlers only set cli_stop.
 * Ownership: replay_main owns the config, the
 * parsed arguments, the plan and every librdkafka handle made here;
 * worker_run borrows the config and the ranges. */
#include "replay.h"
#include "replay_plan.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../config/config.h"
#include "../kafka/kq.h"
#include "../base/log.h"
#include "../worker/worker.h"
#include "cli.h"

/* ---- progress ------------------------------------------------------------- */

struct progress {
    const struct replay_args *a;
    int tty;
    int64_t total[REPLAY_TOPICS_MAX], done[REPLAY_TOPICS_MAX];
    /* The last report, for the summary. */
    int64_t jobs;
    uint64_t ok, failed, dead;
    double elapsed_s;
    int reported;
};

/* h:mm:ss or m:ss, for an ETA a person reads at a glance. */
static void fmt_duration(double s, char *buf, size_t cap)
{
    if (s < 0 || s > 1e8) {
        snprintf(buf, cap, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* The terminal's width, so a bar line never wraps (a wrapped line would
 * break the cursor arithmetic of the redraw). */
static int term_width(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
    return 80;
}

/* One bar per topic on a terminal. Each line is cut to the terminal's
 * width (a wrapped line would break the cursor arithmetic), and the cursor
 * goes back to the first bar afterwards, so the next redraw writes over
 * them and a warning printed meanwhile pushes them down instead of being
 * overwritten. The final draw leaves the cursor below the bars. */
static void draw_bars(struct progress *pr, double elapsed, int final)
{
    int width = term_width();
    for (size_t t = 0; t < pr->a->n_topics; t++) {
        int64_t total = pr->total[t], done = pr->done[t];
        double frac = total > 0 ? (double)done / (double)total : 1.0;
        if (frac > 1) frac = 1;
        double rate = elapsed > 0 ? (double)done / elapsed : 0;
        char when[32], tail[160], bar[41], line[512];
        fmt_duration(final ? elapsed : rate > 0 ? (double)(total - done) / rate : -1, when,
                     sizeof(when));
        int tl = snprintf(tail, sizeof(tail), " %" PRId64 "/%" PRId64 " %5.1f%% %.0f jobs/s %s %s",
                          done, total, frac * 100, rate, final ? "in" : "ETA", when);
        if (tl < 0 || tl >= (int)sizeof(tail)) tl = (int)sizeof(tail) - 1;
        int bar_w = width - 1 - 20 - 3 - tl; /* the name, " [" and "]" */
        if (bar_w > 40) bar_w = 40;
        if (bar_w < 10) bar_w = 10;
        int filled = (int)(frac * bar_w);
        for (int k = 0; k < bar_w; k++) bar[k] = k < filled ? '#' : '.';
        bar[bar_w] = '\0';
        snprintf(line, sizeof(line), "%-20.20s [%s]%s", pr->a->topics[t], bar, tail);
        fprintf(stderr, "\r\033[K%.*s\n", width - 1, line);
    }
    if (!final) fprintf(stderr, "\033[%zuA", pr->a->n_topics);
    fflush(stderr);
}

/* worker_run's progress callback (poll thread = main thread): totals per
 * topic, then a bar redraw on a terminal or one log line per topic. */
static void on_progress(void *ctx, const struct worker_progress *p)
{
    struct progress *pr = ctx;
    memset(pr->total, 0, sizeof(pr->total));
    memset(pr->done, 0, sizeof(pr->done));
    int64_t jobs = 0;
    for (size_t i = 0; i < p->n_ranges; i++) {
        size_t t = 0;
        while (t < pr->a->n_topics && strcmp(pr->a->topics[t], p->ranges[i].topic) != 0) t++;
        if (t == pr->a->n_topics) continue;
        int64_t span = p->ranges[i].end - p->ranges[i].start;
        pr->total[t] += span > 0 ? span : 0;
        pr->done[t] += p->done[i];
        jobs += p->done[i];
    }
    pr->jobs = jobs;
    pr->ok = p->ok;
    pr->failed = p->failed;
    pr->dead = p->dead_lettered;
    pr->elapsed_s = p->elapsed_s;
    pr->reported = 1;
    if (pr->tty) {
        draw_bars(pr, p->elapsed_s, p->finished);
        return;
    }
    for (size_t t = 0; t < pr->a->n_topics; t++) {
        double rate = p->elapsed_s > 0 ? (double)pr->done[t] / p->elapsed_s : 0;
        double eta = rate > 0 ? (double)(pr->total[t] - pr->done[t]) / rate : -1;
        /* Emitted whatever log.level says: progress is what was asked for. */
        log_emit(LOG_INFO, p->finished ? "replay_progress_final" : "replay_progress",
                 "topic=%s done=%" PRId64 " total=%" PRId64 " pct=%.1f rate=%.1f eta_s=%.0f"
                 " ok=%" PRIu64 " errors=%" PRIu64 " dead_lettered=%" PRIu64,
                 pr->a->topics[t], pr->done[t], pr->total[t],
                 pr->total[t] ? 100.0 * (double)pr->done[t] / (double)pr->total[t] : 100.0,
                 rate, eta, p->ok, p->failed, p->dead_lettered);
    }
}

/* ---- the command ------------------------------------------------------------ */

static const char usage[] =
    "usage: kinfer replay -c FILE --from T --to T [options]\n"
    "\n"
    "Runs the jobs of a range of history again through the worker pipeline, next\n"
    "to live traffic: partitions are assigned directly (the live consumer group is\n"
    "never joined or committed to), every partition stops exactly at --to, and a\n"
    "summary is printed. Progress is checkpointed under a group of the replay's\n"
    "own, so an interrupted replay continues with --resume.\n"
    "\n"
    "T is one of:\n"
    "  2024-05-01T10:00:00Z       an RFC 3339 time (fraction and +HH:MM allowed)\n"
    "  1714557600000              Unix milliseconds\n"
    "  earliest, now              the log start, the log end (when planned)\n"
    "  P:OFF[,P:OFF...]           offsets of partitions, for every replayed topic\n"
    "  TOPIC:P:OFF[,...]          offsets of one topic's partitions\n"
    "A time resolves, per partition, to the first record stamped at or after it.\n"
    "--from is inclusive, --to exclusive. With an offset list, only the partitions\n"
    "it names are replayed (one named by one list only runs from the log start or\n"
    "to the log end).\n"
    "\n"
    "  -c, --config FILE       configuration file (see worker.cfg)\n"
    "  -s, --set K=V           override one setting, as for kinfer worker\n"
    "  -f, --from T            first record to run\n"
    "  -t, --to T              where to stop (not run)\n"
    "  -T, --topic A[,B]       topics to replay (repeatable; default kafka.topics)\n"
    "  -r, --reply-topic NAME  where results go (default replay.reply_topic)\n"
    "  -R, --redis MODE        if-absent (default: SET NX, never overwrite a result),\n"
    "                          on (SET, overwrite), off (reply topic only)\n"
    "  -m, --model NAME        run every job on this model (one of the config's)\n"
    "      --rate N            at most N jobs per second (default: no cap)\n"
    "      --priority P        priority 0..9 for every job\n"
    "  -n, --dry-run           print what would run, per partition; run nothing\n"
    "      --resume            continue this replay from its checkpoint\n"
    "      --restart           run this replay again from its start\n"
    "      --progress-ms MS    progress line period when stderr is not a terminal\n"
    "                          (default 5000; a terminal gets a bar per topic)\n"
    "\n"
    "exit status: 0 every range done, 1 could not start (bad arguments, config,\n"
    "bounds, or a checkpoint that needs --resume or --restart), 2 fatal runtime\n"
    "error, 3 interrupted by SIGINT/SIGTERM (run again with --resume).\n";

/* Parses argv into a. Returns 0, 1 when --help was answered, -1 on error
 * (message printed). */
static int parse_args(int argc, char **argv, struct replay_args *a)
{
    enum { O_RATE = 256, O_PRIORITY, O_RESUME, O_RESTART, O_PROGRESS };
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},  {"set", required_argument, 0, 's'},
        {"from", required_argument, 0, 'f'},    {"to", required_argument, 0, 't'},
        {"topic", required_argument, 0, 'T'},   {"reply-topic", required_argument, 0, 'r'},
        {"redis", required_argument, 0, 'R'},   {"model", required_argument, 0, 'm'},
        {"rate", required_argument, 0, O_RATE}, {"priority", required_argument, 0, O_PRIORITY},
        {"dry-run", no_argument, 0, 'n'},       {"resume", no_argument, 0, O_RESUME},
        {"restart", no_argument, 0, O_RESTART}, {"progress-ms", required_argument, 0, O_PROGRESS},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    const char *from = NULL, *to = NULL;
    char why[512] = "";
    long long v;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:s:f:t:T:r:R:m:nh", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': a->cfg_path = optarg; break;
        case 's': a->sets[a->n_sets++] = optarg; break;
        case 'f': from = optarg; break;
        case 't': to = optarg; break;
        case 'T':
            if (replay_add_topics(a, optarg, why, sizeof(why)) < 0) goto bad;
            break;
        case 'r': a->reply_topic = optarg; break;
        case 'R':
            if (strcmp(optarg, "on") == 0) a->redis = WORKER_REDIS_SET;
            else if (strcmp(optarg, "off") == 0) a->redis = WORKER_REDIS_OFF;
            else if (strcmp(optarg, "if-absent") == 0) a->redis = WORKER_REDIS_IF_ABSENT;
            else {
                snprintf(why, sizeof(why), "--redis: '%s' is not on, off or if-absent", optarg);
                goto bad;
            }
            break;
        case 'm': a->model = optarg; break;
        case O_RATE: {
            char *end;
            errno = 0;
            a->rate = strtod(optarg, &end);
            if (!*optarg || *end || errno || !(a->rate > 0) || a->rate > 1e9) {
                snprintf(why, sizeof(why), "--rate: '%s' is not a number of jobs per second",
                         optarg);
                goto bad;
            }
            break;
        }
        case O_PRIORITY:
            if (replay_parse_int(optarg, 0, 9, &v) < 0) {
                snprintf(why, sizeof(why), "--priority: '%s' is not in 0..9", optarg);
                goto bad;
            }
            a->priority = (int)v;
            break;
        case 'n': a->dry_run = 1; break;
        case O_RESUME: a->resume = 1; break;
        case O_RESTART: a->restart = 1; break;
        case O_PROGRESS:
            if (replay_parse_int(optarg, 10, 3600000, &v) < 0) {
                snprintf(why, sizeof(why), "--progress-ms: '%s' is not in 10..3600000", optarg);
                goto bad;
            }
            a->progress_ms = (int)v;
            break;
        case 'h': fputs(usage, stdout); return 1;
        default: fputs(usage, stderr); return -1;
        }
    }
    if (optind < argc) {
        snprintf(why, sizeof(why), "unexpected argument '%s'", argv[optind]);
        goto bad;
    }
    if (!a->cfg_path || !from || !to) {
        snprintf(why, sizeof(why), "-c FILE, --from and --to are required (--help shows them)");
        goto bad;
    }
    if (a->resume && a->restart) {
        snprintf(why, sizeof(why), "--resume and --restart exclude each other");
        goto bad;
    }
    if (replay_parse_bound(from, &a->from, why, sizeof(why)) < 0 ||
        replay_parse_bound(to, &a->to, why, sizeof(why)) < 0 ||
        replay_check_bound_order(&a->from, &a->to, why, sizeof(why)) < 0)
        goto bad;
    return 0;
bad:
    fprintf(stderr, "kinfer replay: %s\n", why);
    return -1;
}

/* Whether the settings table has a row of this name: replay turns off the
 * worker's HTTP endpoint and heartbeat (a live worker on the same host owns
 * the port, and a replay is not a member of the live group) only where
 * this build has them. */
static int has_option(const char *name)
{
    size_t n;
    const struct cfgtab_row *o = cfg_options(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(o[i].name, name) == 0) return 1;
    return 0;
}

/* Loads the config with replay's own defaults first (so the user's --set
 * still wins), then the settings a replay of history needs. */
static struct kcfg *load_config(struct replay_args *a, const char **user_sets, size_t n_user)
{
    static const char *const mine[] = {"metrics.listen=", "metrics.heartbeat_prefix="};
    a->n_sets = 0;
    for (size_t i = 0; i < sizeof(mine) / sizeof(mine[0]); i++) {
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)(strchr(mine[i], '=') - mine[i]), mine[i]);
        if (has_option(name)) a->sets[a->n_sets++] = mine[i];
    }
    for (size_t i = 0; i < n_user; i++) a->sets[a->n_sets++] = user_sets[i];
    struct cli_config cc = {.path = a->cfg_path, .sets = a->sets, .n_sets = a->n_sets,
                            .cap = a->n_sets};
    struct kcfg *c = cli_config_load("replay", &cc);
    if (!c) return NULL;
    /* The records are history: a deadline counted from their timestamps
     * has passed for all of them. */
    c->batching.default_timeout_ms = 0;
    return c;
}

/* Checks what only the loaded config can tell: the topics, the reply
 * topic and the model. */
static int check_against_config(const struct kcfg *c, struct replay_args *a,
                                const char *reply_topic)
{
    if (a->n_topics == 0)
        for (size_t i = 0; i < c->kafka.n_topics; i++)
            if (replay_add_topics(a, c->kafka.topics[i], NULL, 0) < 0) return -1;
    for (size_t i = 0; i < a->n_topics; i++)
        if (strcmp(a->topics[i], reply_topic) == 0) {
            fprintf(stderr, "kinfer replay: the reply topic %s is also a replayed topic\n",
                    reply_topic);
            return -1;
        }
    if (a->model && cfg_model_index(c, a->model) < 0) {
        fprintf(stderr, "kinfer replay: --model %s is not one of the config's models\n",
                a->model);
        return -1;
    }
    return 0;
}

/* Prints the plan, one line per partition, and the totals (stdout). */
static void print_plan(const struct part *parts, size_t n, const struct replay_args *a,
                       const char *group, const char *reply_topic)
{
    int64_t jobs = 0, left = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t span = parts[i].end - parts[i].start;
        int64_t from = parts[i].start;
        if (parts[i].committed > from) from = parts[i].committed < parts[i].end
                                                  ? parts[i].committed : parts[i].end;
        printf("kinfer replay: topic=%s partition=%" PRId32 " from=%" PRId64 " to=%" PRId64
               " jobs=%" PRId64 " checkpoint=%" PRId64 " left=%" PRId64 "\n",
               parts[i].topic, parts[i].partition, parts[i].start, parts[i].end, span,
               parts[i].committed, parts[i].end - from);
        jobs += span;
        left += parts[i].end - from;
    }
    printf("kinfer replay: dry run: jobs=%" PRId64 " left_after_checkpoint=%" PRId64
           " partitions=%zu topics=%zu group=%s reply_topic=%s redis=%s model=%s\n",
           jobs, left, n, a->n_topics, group, reply_topic,
           a->redis == WORKER_REDIS_SET ? "on" : a->redis == WORKER_REDIS_OFF ? "off" : "if-absent",
           a->model ? a->model : "(as asked)");
}

/* Whether every non-empty range's checkpoint has reached its end. */
static int checkpoint_complete(const struct part *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (parts[i].end > parts[i].start && parts[i].committed < parts[i].end) return 0;
    return 1;
}

/* Parse, load, plan, check the checkpoint, run, summarize: each step can
 * refuse before anything is consumed or written, and only the run itself
 * produces results. */
int replay_main(int argc, char **argv)
{
    struct replay_args a;
    memset(&a, 0, sizeof(a));
    a.priority = -1;
    a.redis = WORKER_REDIS_IF_ABSENT;
    int rc = REPLAY_EXIT_STARTUP;
    struct kcfg *c = NULL;
    rd_kafka_t *rk = NULL;
    struct part *parts = NULL;
    struct worker_range *ranges = NULL;
    size_t n_parts = 0;
    const char **user_sets = calloc((size_t)argc + 1, sizeof(char *));
    a.sets = calloc((size_t)argc + 4, sizeof(char *));
    if (!user_sets || !a.sets) goto out;
    int parsed = parse_args(argc, argv, &a);
    if (parsed != 0) {
        rc = parsed > 0 ? REPLAY_EXIT_DONE : REPLAY_EXIT_STARTUP;
        goto out;
    }
    /* parse_args gathered the user's --set in a.sets; replay's own go first. */
    size_t n_user = a.n_sets;
    memcpy(user_sets, a.sets, n_user * sizeof(char *));
    if (!(c = load_config(&a, user_sets, n_user))) goto out;
    const char *reply_topic = a.reply_topic ? a.reply_topic : c->replay.reply_topic;
    if (check_against_config(c, &a, reply_topic) < 0) goto out;
    cli_install_signals();

    char group[64], why[1024] = "";
    replay_group_id(c, &a, reply_topic, group, sizeof(group));
    if (!(rk = replay_planner_new(c, group, why, sizeof(why)))) {
        fprintf(stderr, "kinfer replay: %s\n", why);
        goto out;
    }
    if (replay_plan(rk, &a, &parts, &n_parts, why, sizeof(why)) < 0) {
        fprintf(stderr, "kinfer replay: %s\n", why);
        if (cli_stop) rc = REPLAY_EXIT_INTERRUPTED;
        goto out;
    }
    if (a.dry_run) {
        print_plan(parts, n_parts, &a, group, reply_topic);
        rc = REPLAY_EXIT_DONE;
        goto out;
    }

    /* The checkpoint: a fresh run never silently skips what an earlier run
     * of the same replay did, nor silently redoes it. */
    int64_t total = 0, done_before = 0;
    int has_checkpoint = 0;
    for (size_t i = 0; i < n_parts; i++) {
        int64_t span = parts[i].end - parts[i].start;
        total += span;
        if (parts[i].committed < 0) continue;
        has_checkpoint = 1;
        int64_t cp = parts[i].committed;
        done_before += cp <= parts[i].start ? 0 : cp >= parts[i].end ? span : cp - parts[i].start;
    }
    if (has_checkpoint && !a.resume && !a.restart) {
        if (checkpoint_complete(parts, n_parts))
            fprintf(stderr, "kinfer replay: this replay already ran to its end (group %s); "
                    "--restart runs it again\n", group);
        else
            fprintf(stderr, "kinfer replay: this replay has a checkpoint (group %s, %" PRId64
                    " of %" PRId64 " jobs done): --resume continues it, --restart starts over\n",
                    group, done_before, total);
        goto out;
    }
    if (a.restart && has_checkpoint && replay_reset_checkpoint(rk, parts, n_parts, why, sizeof(why)) < 0) {
        fprintf(stderr, "kinfer replay: %s\n", why);
        goto out;
    }
    ranges = calloc(n_parts ? n_parts : 1, sizeof(*ranges));
    if (!ranges) goto out;
    int64_t to_run = 0;
    for (size_t i = 0; i < n_parts; i++) {
        struct worker_range *r = &ranges[i];
        snprintf(r->topic, sizeof(r->topic), "%s", parts[i].topic);
        r->partition = parts[i].partition;
        r->start = parts[i].start;
        r->end = parts[i].end;
        if (a.resume && parts[i].committed > r->start)
            r->start = parts[i].committed < r->end ? parts[i].committed : r->end;
        to_run += r->end - r->start;
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    rk = NULL;

    LOG_I("replay_plan", "group=%s topics=%zu partitions=%zu jobs=%" PRId64 " resumed_from=%" PRId64
          " from=\"%s\" to=\"%s\" reply_topic=%s redis=%s model=%s rate=%.0f",
          group, a.n_topics, n_parts, to_run, a.resume ? done_before : 0, a.from.text, a.to.text,
          reply_topic,
          a.redis == WORKER_REDIS_SET ? "on" : a.redis == WORKER_REDIS_OFF ? "off" : "if-absent",
          a.model ? a.model : "(as asked)", a.rate);
    struct progress pr;
    memset(&pr, 0, sizeof(pr));
    pr.a = &a;
    /* A bar on a terminal, unless debug logging is asked for: info lines
     * would scroll the bars away, so they are held back while it shows. */
    pr.tty = isatty(STDERR_FILENO) && log_threshold < LOG_DEBUG && a.progress_ms == 0;
    enum log_level saved_threshold = log_threshold;
    if (pr.tty && log_threshold > LOG_WARN) log_threshold = LOG_WARN;
    struct worker_opts wo = {
        .group = group, .reply_topic = reply_topic, .redis = a.redis, .model = a.model,
        .priority = a.priority, .rate = a.rate, .ranges = ranges, .n_ranges = n_parts,
        .ignore_deadlines = 1, /* history: every deadline has passed */
        .progress = on_progress, .progress_ctx = &pr,
        .progress_ms = pr.tty ? REPLAY_PROGRESS_TTY_MS
                              : a.progress_ms ? a.progress_ms : REPLAY_PROGRESS_LINE_MS};
    enum worker_exit wrc = worker_run(c, &wo, &cli_stop);
    log_threshold = saved_threshold;
    if (wrc == WORKER_EXIT_STARTUP) goto out;

    /* Done means every range reached its end. A stop request that came
     * after the last job still counts as done: ask the checkpoint. */
    int complete = wrc == WORKER_EXIT_OK && !cli_stop;
    if (wrc == WORKER_EXIT_OK && cli_stop && (rk = replay_planner_new(c, group, why, sizeof(why))) &&
        replay_read_checkpoint(rk, parts, n_parts, why, sizeof(why)) == 0)
        complete = checkpoint_complete(parts, n_parts);
    rc = wrc == WORKER_EXIT_FATAL ? REPLAY_EXIT_FATAL
         : complete              ? REPLAY_EXIT_DONE
                                 : REPLAY_EXIT_INTERRUPTED;
    double rate = pr.elapsed_s > 0 ? (double)pr.jobs / pr.elapsed_s : 0;
    printf("kinfer replay: %s jobs=%" PRId64 " ok=%" PRIu64 " errors=%" PRIu64
           " dead_lettered=%" PRIu64 " duration_s=%.1f rate=%.1f group=%s\n",
           rc == REPLAY_EXIT_DONE ? "done" : rc == REPLAY_EXIT_FATAL ? "failed" : "interrupted",
           pr.jobs, pr.ok, pr.failed, pr.dead, pr.elapsed_s, rate, group);
    if (rc == REPLAY_EXIT_INTERRUPTED)
        printf("kinfer replay: run the same command with --resume to continue\n");
    fflush(stdout);
out:
    if (rk) {
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
    }
    free(ranges);
    free(parts);
    free(a.from.offs);
    free(a.to.offs);
    for (size_t i = 0; i < a.n_topics; i++) free(a.topics[i]);
    free(a.sets);
    free(user_sets);
    cfg_destroy(c);
    return rc;
}

/* worker.c - the worker's lifecycle: sets up the pipeline's stages and the
 * queues between them, runs the poll loop until a stop request (or a
 * fatal error, or the end of a bounded run), and takes it down in order.
 *
 *   intake (poll thread) --batcher--> exec (executor threads) --sinkq--> sink (sink thread)
 *      ^  answers, dead letters ----------------------------------sinkq--^      |
 *      +-- offsets (poll thread) <----------------------------------doneq-------+
 *
 * docs/architecture.md draws the same picture and says who owns a job
 * when. Each stage owns its state; they share only the batcher and the two
 * job queues, plus the stats (telemetry) and one flag that any of them may
 * raise when the process must stop.
 *
 * Threads: worker_run runs on the caller's thread, which becomes the poll
 * thread; the executors, the sink, the heartbeat and the HTTP endpoints
 * run on threads of their own. */
#include "worker.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../batching/batcher.h"
#include "../gpu/model.h"
#include "../telemetry/heartbeat.h"
#include "../telemetry/metrics.h"
#include "../telemetry/stats.h"
#include "exec.h"
#include "intake.h"
#include "jobq.h"
#include "../base/log.h"
#include "offsets.h"
#include "ranges.h"
#include "sink.h"

/* The models, loaded once for every stage to share. */
struct models {
    struct model_runtime *rt;
    struct model **m;          /* NULL for a generating model */
    struct genmodel **g;       /* a generating model's (genmodel.h), else NULL */
    size_t n;
    int default_idx;
    char device[128]; /* model_runtime_device_name: "cpu", or the CUDA devices' names */
};

/* Opens the backend worker.backend names and loads every model with it;
 * logs each. Returns 0, or -1 (logged). */
static int models_load(const struct kcfg *c, struct models *ms)
{
    char err[512];
    struct model_runtime_conf rc;
    cfg_model_runtime(c, &rc);
    if (!(ms->rt = model_runtime_new(&rc, err, sizeof(err)))) {
        LOG_E("backend_failed", "backend=%s error=\"%s\"", c->worker.backend, err);
        return -1;
    }
    model_runtime_device_name(ms->rt, ms->device, sizeof(ms->device));
    LOG_I("backend_selected", "backend=%s device=\"%s\" setting=%s detail=\"%s\"",
          model_runtime_backend(ms->rt), ms->device, c->worker.backend,
          model_runtime_describe(ms->rt));
    if (!(ms->m = calloc(c->n_models, sizeof(*ms->m))) ||
        !(ms->g = calloc(c->n_models, sizeof(*ms->g))))
        return -1;
    for (size_t i = 0; i < c->n_models; i++) {
        if (c->models[i].n_layers == 0 && genmodel_is_decoder_folder(c->models[i].path)) {
            if (!(ms->g[i] = genmodel_load(ms->rt, &c->models[i], err, sizeof(err)))) {
                LOG_E("model_load_failed", "model=%s error=\"%s\"", c->models[i].name, err);
                return -1;
            }
            ms->n++;
            const struct decoder_info *di = decoder_info(ms->g[i]->dec);
            LOG_I("model_loaded", "model=%s path=%s kind=generator arch=%s layers=%zu "
                  "hidden=%zu context=%zu vocab=%zu chat_template=%s params=%zu backend=%s",
                  c->models[i].name, c->models[i].path, di->arch, di->layers, di->hidden,
                  di->context, di->vocab, ms->g[i]->tmpl ? "yes" : "no", di->n_params,
                  model_runtime_backend(ms->rt));
            continue;
        }
        ms->m[i] = model_load(ms->rt, &c->models[i], err, sizeof(err));
        if (!ms->m[i]) {
            LOG_E("model_load_failed", "model=%s error=\"%s\"", c->models[i].name, err);
            return -1;
        }
        ms->n++;
        const struct model_encoder_info *e = model_encoder(ms->m[i]);
        if (e)
            LOG_I("model_loaded", "model=%s path=%s kind=encoder arch=%s layers=%zu hidden=%zu "
                  "heads=%zu max_tokens=%zu vocab=%zu head=%s pooling=%s normalize=%d "
                  "output_width=%zu params=%zu backend=%s", model_name(ms->m[i]),
                  c->models[i].path, model_arch_name(ms->m[i]), e->layers, e->hidden, e->heads, e->max_tokens, e->vocab,
                  e->head == MODEL_HEAD_CLASSIFIER ? "classifier" : "embedding",
                  model_pooling_name(e->pooling), e->normalize, model_output_width(ms->m[i]),
                  model_param_count(ms->m[i]), model_runtime_backend(ms->rt));
        else
            LOG_I("model_loaded", "model=%s path=%s input_width=%zu output_width=%zu "
                  "params=%zu backend=%s", model_name(ms->m[i]), c->models[i].path,
                  model_input_width(ms->m[i]), model_output_width(ms->m[i]),
                  model_param_count(ms->m[i]), model_runtime_backend(ms->rt));
    }
    ms->default_idx = cfg_model_index(c, c->default_model);
    return ms->default_idx < 0 ? -1 : 0;
}

static void models_free(struct models *ms)
{
    for (size_t i = 0; i < ms->n; i++) {
        model_destroy(ms->m[i]);
        if (ms->g) genmodel_destroy(ms->g[i]);
    }
    free(ms->m);
    free(ms->g);
    model_runtime_destroy(ms->rt);
}

/* Everything the lifecycle holds: the stages, the queues between them,
 * and the telemetry. */
struct worker {
    const struct kcfg *cfg;
    struct worker_opts opts;
    atomic_int fatal;
    struct stats *stats;
    struct metrics *metrics;   /* NULL in a bounded run */
    struct hb *hb;             /* NULL in a bounded run */
    struct models models;
    struct batcher *batcher;   /* intake -> executors */
    struct jobq sinkq;         /* executors, intake -> sink */
    struct jobq doneq;         /* sink -> offsets */
    struct offsets *offsets;
    struct ranges *ranges;     /* NULL: the live group */
    struct sink *sink;
    struct intake *intake;
    struct exec *exec;
    struct genexec *genexec;   /* generation jobs (genexec.h) */
    atomic_size_t lightened;   /* exec -> intake: rows shed by jobs that ran */
    int64_t started_us;
    int64_t stop_by_us;        /* the drain deadline once stopping; 0 before */
    struct stop_guard *guard;  /* once stopping */
};

/* The finished jobs by outcome, from the stats (the one telemetry path). */
static void outcome_totals(const struct stats_snapshot *s, uint64_t *ok, uint64_t *failed,
                           uint64_t *dead)
{
    *ok = *failed = *dead = 0;
    for (int c = 0; c < PROTO_N_ERRS; c++) {
        *ok += s->jobs[STATS_STATUS_OK][c];
        *failed += s->jobs[STATS_STATUS_ERROR][c];
        *dead += s->jobs[STATS_STATUS_DEAD_LETTER][c];
    }
}

/* One line of counters every 10 s and at the end, for logs without
 * /metrics. */
static void log_stats(struct worker *w)
{
    struct batcher_stats bs;
    batcher_get_stats(w->batcher, clock_mono_us(), &bs);
    struct stats_snapshot s;
    memset(&s, 0, sizeof(s));
    stats_snapshot(w->stats, clock_mono_us(), &s);
    uint64_t ok, failed, dead, batches = 0;
    outcome_totals(&s, &ok, &failed, &dead);
    for (int r = 0; r < STATS_N_BATCH_REASONS; r++) batches += s.batches[r];
    const struct stats_hist_snap *rows = &s.hist[STATS_HIST_BATCH_ROWS];
    LOG_I("stats", "consumed=%" PRIu64 " ok=%" PRIu64 " failed=%" PRIu64
          " dead_lettered=%" PRIu64 " batches=%" PRIu64 " mean_batch_rows=%.1f"
          " closed_size=%" PRIu64 " closed_deadline=%" PRIu64 " closed_wait=%" PRIu64
          " closed_drain=%" PRIu64 " expired=%" PRIu64 " queued_rows=%zu queued_jobs=%zu"
          " oldest_queued_ms=%.1f inflight_batches=%d inflight_rows=%zu"
          " paused_partitions=%d produce_errors=%" PRIu64 " redis_errors=%" PRIu64,
          s.consumed, ok, failed, dead, batches,
          rows->count ? rows->sum / (double)rows->count : 0.0, bs.closed[BATCH_SIZE],
          bs.closed[BATCH_DEADLINE], bs.closed[BATCH_WAIT], bs.closed[BATCH_DRAIN], bs.expired,
          bs.queued_rows, bs.queued_jobs, (double)bs.oldest_age_us / 1000.0,
          w->exec ? exec_inflight_batches(w->exec) : 0, intake_inflight_rows(w->intake),
          intake_paused(w->intake) ? intake_assigned(w->intake) : 0, s.produce_errors,
          sink_redis_errors(w->sink));
    stats_snapshot_fini(&s);
}

/* The batcher's depth at the moment a snapshot is taken (any thread: the
 * batcher locks). */
static void queue_source(void *ctx, int64_t now_us, size_t *rows, size_t *jobs,
                         double *oldest_s)
{
    struct batcher_stats bs;
    batcher_get_stats(ctx, now_us, &bs);
    *rows = bs.queued_rows;
    *jobs = bs.queued_jobs;
    *oldest_s = (double)bs.oldest_age_us / 1e6;
}

/* The stages' gauges for /metrics and the heartbeat. */
static void publish_gauges(struct worker *w, int64_t now)
{
    struct batcher_stats bs;
    batcher_get_stats(w->batcher, now, &bs);
    stats_set_queue(w->stats, bs.queued_rows, bs.queued_jobs, (double)bs.oldest_age_us / 1e6,
                    intake_inflight_rows(w->intake), exec_inflight_batches(w->exec));
    int assigned = intake_assigned(w->intake);
    stats_set_partitions(w->stats, assigned, intake_paused(w->intake) ? assigned : 0);
    stats_set_redis_errors(w->stats, sink_redis_errors(w->sink));
    /* Readiness before the clients' first statistics (stats.h). */
    stats_set_early(w->stats, STATS_COND_PRODUCER, sink_broker_reached(w->sink));
    stats_set_early(w->stats, STATS_COND_CONSUMER, intake_has_member(w->intake));
}

/* Reliability rule 7: a hung loop (an executor stuck in the model, say)
 * trips the watchdog after metrics.watchdog_ms, and the process must end
 * so its supervisor restarts it. The hung thread can never be joined and
 * the others still use what an orderly shutdown would free, so this is
 * the one place that exits on its own, with _exit: nothing is lost, as
 * no offset past unfinished work was ever stored. */
static void watchdog_check(struct worker *w)
{
    struct stats_snapshot snap;
    memset(&snap, 0, sizeof(snap));
    if (stats_snapshot(w->stats, clock_mono_us(), &snap) == 0 && !snap.healthy) {
        LOG_E("watchdog_exit", "reason=\"%s\" watchdog_ms=%d note=\"exiting: unfinished "
              "jobs are uncommitted and run again after the restart\"", snap.unhealthy_why,
              w->cfg->metrics.watchdog_ms);
        fflush(stderr);
        _exit(WORKER_EXIT_FATAL);
    }
    stats_snapshot_fini(&snap);
}

/* Hands a bounded run's counters to its progress callback. */
static void report_progress(struct worker *w, int finished)
{
    struct stats_snapshot s;
    memset(&s, 0, sizeof(s));
    stats_snapshot(w->stats, clock_mono_us(), &s);
    struct worker_progress p = {.elapsed_s = (double)(clock_mono_us() - w->started_us) / 1e6,
                                .finished = finished};
    ranges_progress(w->ranges, &p);
    outcome_totals(&s, &p.ok, &p.failed, &p.dead_lettered);
    stats_snapshot_fini(&s);
    w->opts.progress(w->opts.progress_ctx, &p);
}

/* The devices' gauges, once a second: busy time is a counter in the
 * runtime, so the ratio is its growth over the wall time since the last
 * call (several streams on one device can add up past the wall time; the
 * stats cap the ratio at 1). */
struct device_marks {
    int64_t at_us;
    double busy_s[MODEL_MAX_DEVICES];
};

static void publish_devices(struct worker *w, struct device_marks *dm, int64_t now)
{
    size_t n = model_runtime_devices(w->models.rt);
    double wall_s = (double)(now - dm->at_us) / 1e6;
    for (size_t d = 0; d < n && d < MODEL_MAX_DEVICES; d++) {
        struct model_device_stats ds;
        if (model_runtime_device_stats(w->models.rt, d, &ds) < 0) continue;
        struct stats_device sd = {.index = ds.index, .mem_used = ds.mem_used,
                                  .mem_total = ds.mem_total, .batches = ds.batches,
                                  .busy_s = ds.busy_s};
        sd.busy_ratio = dm->at_us && wall_s > 0 ? (ds.busy_s - dm->busy_s[d]) / wall_s : 0;
        dm->busy_s[d] = ds.busy_s;
        stats_set_device(w->stats, d, &sd);
    }
    dm->at_us = now;
}

/* What the poll thread does besides polling, each on its own period:
 * gauges (10 a second), the watchdog and the devices (every second), the
 * log line (every 10 s) and a bounded run's progress. */
struct ticks {
    int64_t gauges, watchdog, log, progress;
    struct device_marks devices;
};

static void tick(struct worker *w, struct ticks *t)
{
    int64_t now = clock_mono_us();
    stats_alive(w->stats, STATS_LOOP_POLL);
    if (now >= t->gauges) {
        publish_gauges(w, now);
        struct genexec_gauges gg;
        genexec_gauges(w->genexec, &gg);
        size_t ng = 0;
        for (size_t i = 0; i < w->models.n; i++) ng += w->models.g[i] != NULL;
        stats_gen_gauges(w->stats, (int)ng, gg.running, gg.waiting, gg.blocks_used,
                         gg.blocks_total, gg.preemptions, gg.shared_tokens);
        t->gauges = now + 100000;
    }
    if (now >= t->watchdog) {
        watchdog_check(w);
        publish_devices(w, &t->devices, now);
        log_flush_suppressed(0); /* counts of a burst that is over */
        t->watchdog = now + 1000000;
    }
    if (now >= t->log) {
        log_stats(w);
        t->log = now + 10 * 1000000;
    }
    if (w->ranges && w->opts.progress && now >= t->progress) {
        report_progress(w, 0);
        t->progress = now + (int64_t)(w->opts.progress_ms > 0 ? w->opts.progress_ms : 1000) * 1000;
    }
}

/* The stop's last resort. Each step of the stop has its own bound (the
 * drain, the flush, the consumer's close), but a step that blocks where
 * no bound reaches (a thread that never returns to be joined, a library
 * call that waits on something that never comes) would hold the process
 * past its supervisor's grace period, with nothing in the log. The guard
 * thread ends the process STOP_GRACE_US after the drain deadline if the
 * stop is still running, naming the step it was in. Like the watchdog
 * (rule 7) it loses nothing: no offset past unfinished work was stored. */
#define STOP_GRACE_US 5000000

struct stop_guard {
    pthread_t thr;
    atomic_int done;
    int64_t by_us;
    int drain_timeout_ms;
    _Atomic(const char *) step;
};

static void *guard_main(void *arg)
{
    struct stop_guard *g = arg;
    while (!atomic_load(&g->done)) {
        if (clock_mono_us() >= g->by_us) {
            LOG_E("stop_stuck", "step=%s drain_timeout_ms=%d grace_ms=%d note=\"exiting: the "
                  "stop did not finish in time; unfinished jobs stay uncommitted and run "
                  "again\"", atomic_load(&g->step), g->drain_timeout_ms,
                  STOP_GRACE_US / 1000);
            fflush(stderr);
            _exit(WORKER_EXIT_FATAL);
        }
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Starts the guard for a stop that must end by by_us; NULL if it could
 * not (logged: the stop goes on unguarded). */
static struct stop_guard *guard_start(int64_t by_us, int drain_timeout_ms)
{
    struct stop_guard *g = calloc(1, sizeof(*g));
    if (g) {
        atomic_init(&g->done, 0);
        atomic_init(&g->step, "drain");
        g->by_us = by_us;
        g->drain_timeout_ms = drain_timeout_ms;
        if (pthread_create(&g->thr, NULL, guard_main, g) == 0) return g;
        free(g);
    }
    LOG_W("thread_failed", "thread=stop_guard note=\"the stop runs without its last bound\"");
    return NULL;
}

static void guard_step(struct stop_guard *g, const char *step)
{
    if (g) atomic_store(&g->step, step);
}

static void guard_stop(struct stop_guard *g)
{
    if (!g) return;
    atomic_store(&g->done, 1);
    pthread_join(g->thr, NULL);
    free(g);
}

/* Creates every stage, consumers last so nothing arrives before there is
 * somewhere for it to go. Returns 0, or -1 (logged). */
static int setup(struct worker *w)
{
    const struct kcfg *c = w->cfg;
    char err[512];
    if (!(w->stats = stats_new())) return -1;
    /* The endpoints and the heartbeat belong to a group member, not to a
     * bounded run (replay), which may run beside one. */
    if (!w->opts.ranges && !(w->metrics = metrics_start(c, w->stats, err, sizeof(err)))) {
        LOG_E("metrics_failed", "error=\"%s\"", err);
        return -1;
    }
    if (models_load(c, &w->models) < 0) return -1;
    stats_set_backend(w->stats, model_runtime_backend(w->models.rt));
    stats_set_precision(w->stats, model_runtime_precision(w->models.rt));
    stats_set_device_name(w->stats, w->models.device);
    char kinds[512];
    size_t at = 0;
    for (size_t i = 0; i < w->models.n && at < sizeof(kinds); i++)
        at += (size_t)snprintf(kinds + at, sizeof(kinds) - at, "%s%s=%s", i ? "," : "",
                               c->models[i].name,
                               w->models.g[i] ? "generator"
                               : model_encoder(w->models.m[i]) ? "encoder" : "mlp");
    stats_set_models(w->stats, kinds);
    stats_set_cond(w->stats, STATS_COND_MODEL, 1);
    int override = -1;
    if (w->opts.model && (override = cfg_model_index(c, w->opts.model)) < 0) {
        LOG_E("unknown_model", "model=%s note=\"not one of this config's models\"",
              w->opts.model);
        return -1;
    }
    struct batcher_conf bc = {.n_models = w->models.n,
                              .max_batch_rows = (size_t)c->batching.max_batch_rows,
                              .max_wait_ms = c->batching.max_wait_ms,
                              .aging_ms = c->batching.aging_ms,
                              .n_preferred = c->batching.n_preferred_sizes,
                              .max_batch_tokens = (size_t)c->batching.max_batch_tokens,
                              .group_by_length = c->batching.group_by_length};
    memcpy(bc.preferred, c->batching.preferred_sizes,
           c->batching.n_preferred_sizes * sizeof(size_t));
    if (!(w->batcher = batcher_new(&bc)) || !(w->offsets = offsets_new(&w->doneq))) return -1;
    stats_set_queue_source(w->stats, queue_source, w->batcher);
    if (w->opts.ranges && !(w->ranges = ranges_new(w->opts.ranges, w->opts.n_ranges))) return -1;

    struct sink_conf sc = {.cfg = c, .redis = w->opts.redis, .in = &w->sinkq,
                           .done = &w->doneq, .stats = w->stats, .fatal = &w->fatal,
                           .reply_topic = w->opts.reply_topic ? w->opts.reply_topic
                                                              : c->kafka.reply_topic};
    if (!(w->sink = sink_new(&sc, err, sizeof(err)))) {
        LOG_E("kafka_client", "client=producer error=\"%s\"", err);
        return -1;
    }
    if (!w->opts.ranges && !(w->hb = hb_start(c, w->stats, err, sizeof(err)))) {
        LOG_E("heartbeat_failed", "error=\"%s\"", err);
        return -1;
    }
    if (w->opts.redis != WORKER_REDIS_OFF && sink_redis_ping(w->sink) < 0)
        LOG_W("redis_unreachable", "host=%s port=%d note=\"results wait until it answers\"",
              c->redis.host, c->redis.port);
    struct genexec_conf gc = {.cfg = c, .gens = w->models.g, .n_models = w->models.n,
                              .out = &w->sinkq, .stats = w->stats, .fatal = &w->fatal,
                              .count_attempts = c->worker.max_attempts > 0 &&
                                                w->opts.redis != WORKER_REDIS_OFF,
                              .stream = w->opts.redis != WORKER_REDIS_OFF,
                              .lanes = model_runtime_devices(w->models.rt)};
    if (!(w->genexec = genexec_start(&gc, err, sizeof(err)))) {
        LOG_E("generator_failed", "error=\"%s\"", err);
        return -1;
    }
    struct intake_conf ic = {.cfg = c, .opts = &w->opts, .models = w->models.m,
                             .gens = w->models.g, .genexec = w->genexec,
                             .n_models = w->models.n, .default_model = w->models.default_idx,
                             .model_override = override, .batcher = w->batcher,
                             .sink = &w->sinkq, .offsets = w->offsets, .ranges = w->ranges,
                             .stats = w->stats, .fatal = &w->fatal,
                             .max_record_bytes = sink_max_record_bytes(w->sink),
                             .lightened = &w->lightened};
    if (!(w->intake = intake_new(&ic, err, sizeof(err)))) {
        LOG_E("kafka_client", "client=consumer error=\"%s\"", err);
        return -1;
    }
    if (sink_start(w->sink) < 0) {
        LOG_E("thread_failed", "thread=sink");
        return -1;
    }
    size_t n_exec = c->batching.executors > 0 ? (size_t)c->batching.executors
                                              : model_runtime_executors(w->models.rt);
    struct exec_conf ec = {.cfg = c, .models = w->models.m, .n_models = w->models.n,
                           .n_threads = n_exec < STATS_MAX_EXECUTORS ? n_exec
                                                                    : STATS_MAX_EXECUTORS,
                           .batcher = w->batcher, .out = &w->sinkq, .stats = w->stats,
                           .fatal = &w->fatal,
                           .max_record_bytes = sink_max_record_bytes(w->sink),
                           .count_attempts = c->worker.max_attempts > 0 &&
                                             w->opts.redis != WORKER_REDIS_OFF,
                           .lightened = &w->lightened};
    if (!(w->exec = exec_start(&ec, err, sizeof(err)))) {
        LOG_E("thread_failed", "thread=executor error=\"%s\"", err);
        return -1;
    }
    return 0;
}

/* Frees whatever setup made, in the reverse order; the consumer goes
 * before the producer, the stats after every thread that reports to them. */
static void teardown(struct worker *w)
{
    exec_stop(w->exec);
    genexec_stop(w->genexec);
    intake_destroy(w->intake);
    sink_destroy(w->sink);
    jobq_fini(&w->sinkq);
    jobq_fini(&w->doneq);
    if (w->stats) stats_set_queue_source(w->stats, NULL, NULL);
    batcher_destroy(w->batcher);
    offsets_destroy(w->offsets);
    ranges_destroy(w->ranges);
    models_free(&w->models);
    hb_stop(w->hb, w->stop_by_us);
    metrics_stop(w->metrics);
    stats_destroy(w->stats);
}

enum worker_exit worker_run(const struct kcfg *c, const struct worker_opts *opts,
                            volatile sig_atomic_t *stop)
{
    struct worker *w = calloc(1, sizeof(*w));
    enum worker_exit rc = WORKER_EXIT_STARTUP;
    if (!w) return rc;
    w->cfg = c;
    if (opts) w->opts = *opts;
    else w->opts.priority = -1;
    atomic_init(&w->fatal, 0);
    atomic_init(&w->lightened, 0);
    jobq_init(&w->sinkq);
    jobq_init(&w->doneq);

    /* set up */
    if (setup(w) < 0) goto out;
    LOG_I("worker_started", "brokers=%s group=%s topics=%zu reply_topic=%s redis=%s:%d "
          "max_batch_rows=%d max_wait_ms=%d executors=%zu ranges=%zu", c->kafka.brokers,
          w->opts.group ? w->opts.group : c->kafka.group, c->kafka.n_topics,
          w->opts.reply_topic ? w->opts.reply_topic : c->kafka.reply_topic, c->redis.host,
          c->redis.port, c->batching.max_batch_rows, c->batching.max_wait_ms,
          exec_threads(w->exec), w->opts.n_ranges);
    w->started_us = clock_mono_us();
    struct ticks t = {.log = w->started_us + 10 * 1000000};

    /* the poll loop */
    while (!*stop && !atomic_load(&w->fatal) && !intake_ranges_done(w->intake)) {
        tick(w, &t);
        intake_poll(w->intake);
    }

    /* tear down: drain what was taken in (unless the process is failing),
     * stop the executors, then the sink, deliver what the producer still
     * owes, store and commit what finished, leave the group, all within
     * worker.drain_timeout_ms of the stop (its supervisor's grace period
     * counts on it). What the drain leaves unfinished is stuck (Redis not
     * answering, say): the Redis calls that hold it are cut, not waited
     * out. */
    int fatal = atomic_load(&w->fatal);
    stats_set_draining(w->stats);
    LOG_I("draining", "reason=%s inflight_rows=%zu",
          fatal ? "fatal_error" : *stop ? "signal" : "ranges_done",
          intake_inflight_rows(w->intake));
    int64_t drain_us = (int64_t)c->worker.drain_timeout_ms * 1000;
    w->stop_by_us = clock_mono_us() + drain_us;
    w->guard = guard_start(w->stop_by_us + STOP_GRACE_US, c->worker.drain_timeout_ms);
    /* What comes after the drain (stopping threads, flushing, committing,
     * leaving the group, the heartbeat's DEL) gets a fifth of the budget,
     * at most a second. */
    int64_t tail_us = drain_us / 5 < 1000000 ? drain_us / 5 : 1000000;
    size_t stuck = 0;
    if (!fatal) stuck = intake_drain(w->intake, (int)((drain_us - tail_us) / 1000));
    stats_loop_stop(w->stats, STATS_LOOP_POLL);
    if (stuck) {
        LOG_W("drain_timeout", "unfinished=%zu drain_timeout_ms=%d note=\"cutting Redis calls "
              "short; unfinished jobs stay uncommitted and run again\"", stuck,
              c->worker.drain_timeout_ms);
        exec_cut(w->exec);
        genexec_cut(w->genexec);
        sink_cut(w->sink);
    }
    guard_step(w->guard, "executors");
    exec_stop(w->exec);
    w->exec = NULL;
    genexec_stop(w->genexec); /* what still generates stays uncommitted */
    w->genexec = NULL;
    guard_step(w->guard, "sink");
    sink_stop(w->sink);
    intake_pipeline_stopped(w->intake);
    /* The flush leaves half the tail to the commit and the close. */
    guard_step(w->guard, "flush");
    int64_t left_ms = (w->stop_by_us - tail_us / 2 - clock_mono_us()) / 1000;
    sink_flush(w->sink, left_ms < 5000 ? (left_ms > 0 ? (int)left_ms : 0) : 5000);
    intake_collect(w->intake);
    size_t left = intake_pending(w->intake);
    guard_step(w->guard, "consumer_close");
    intake_close(w->intake, w->stop_by_us);
    guard_step(w->guard, "teardown");
    if (w->ranges && w->opts.progress) report_progress(w, 1);
    log_stats(w);
    LOG_I("stopped", "unfinished=%zu note=\"unfinished jobs stay uncommitted and run again\"",
          left);
    rc = fatal || atomic_load(&w->fatal) ? WORKER_EXIT_FATAL : WORKER_EXIT_OK;
out:
    teardown(w);
    guard_stop(w->guard);
    free(w);
    return rc;
}

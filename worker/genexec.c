/* genexec.c - genexec.h: the generator lanes, their engines, and what a
 * lane does with a job from push to the sink.
 *
 * Threads: each lane's thread does everything for its jobs but
 * genexec_push (the poll thread: it picks the lane and pushes to its
 * locked queue, jobq.h) and the gauges (atomics, summed over the lanes).
 * A lane's engines are made on its thread, as gen/engine.h asks.
 * Ownership: a job is in exactly one place: a lane's input queue, its
 * pending list (its engine's waiting queue was full), an engine (the
 * lane's `live` list, linked through ->next), or pushed to the sink. */
#include "genexec.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "../base/log.h"
#include "../gen/engine.h"
#include "rsink.h"

/* The watchdog loop generator lane i reports as. */
#define GENEXEC_LOOP(i) (STATS_LOOP_GEN + (int)(i))
_Static_assert(GENEXEC_MAX_LANES <= STATS_MAX_GENERATORS, "a watchdog loop for every lane");

/* One generator thread and its engines, on executor slot `slot` (its
 * device: slots go round the devices). */
struct lane {
    struct genexec_conf c;
    unsigned slot;
    atomic_size_t load;           /* jobs pushed to it and not yet published */
    struct jobq in;
    pthread_t thr;
    int has_thr;
    atomic_int stop;
    atomic_int ready;             /* 1 engines made, -1 failed */
    char err[512];
    struct gen_engine **eng;      /* by model index (thread's) */
    struct job *live;             /* jobs in an engine */
    struct job *pending;          /* jobs its engine had no room for yet */
    struct rsink *rs;             /* stream entries and attempt counters */
    int64_t stream_down_until;    /* after a failed entry: streams end until then (us) */
    atomic_size_t g_running, g_waiting, g_used, g_total;
    atomic_uint_fast64_t g_preempt, g_shared;
};

struct genexec {
    struct genexec_conf c;
    struct lane *lane;
    size_t n_lanes;
    size_t next;                  /* where ties go next (round robin) */
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Removes j from the live list. */
static void live_remove(struct lane *g, struct job *j)
{
    for (struct job **p = &g->live; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            j->next = NULL;
            return;
        }
}

/* Encodes j's result (or error) and hands it to the sink as a batch of one. */
static void publish(struct lane *g, struct job *j)
{
    free(j->ids); /* the prompt: not needed any more */
    j->ids = NULL;
    j->batch_rows = 1;
    j->batch_last = 1;
    j->next = NULL;
    if (job_encode(j, clock_wall_ms()) < 0 || !j->body) {
        LOG_E("out_of_memory", "where=encode id=%s", j->req.id);
        atomic_store(g->c.fatal, 1);
    }
    j->gen_res = NULL;
    jobq_push(g->c.out, j);
    atomic_fetch_sub(&g->load, 1);
}

/* One stream entry for j; a failure ends the job's stream, not the job.
 * After a failure every stream that would write within the next second
 * ends too (a reader falls back to the result): a Redis that does not
 * answer costs one timeout a second, not one per piece. */
static void stream_add(struct lane *g, struct job *j, const char *const *fields,
                       const char *const *values, const size_t *lens, size_t n)
{
    if (!j->gen_stream_ok || !g->rs) return;
    if (clock_mono_us() < g->stream_down_until) {
        j->gen_stream_ok = 0;
        return;
    }
    char key[1400];
    int kl = snprintf(key, sizeof(key), "%s%s", g->c.cfg->redis.stream_prefix, j->req.id);
    if (kl < 0 || (size_t)kl >= sizeof(key) ||
        rsink_xadd(g->rs, key, (size_t)kl, fields, values, lens, n, g->c.cfg->redis.ttl_ms) < 0) {
        LOG_W("stream_failed", "id=%s note=\"the result still goes to Redis and the reply "
              "topic\"", j->req.id);
        j->gen_stream_ok = 0;
        g->stream_down_until = clock_mono_us() + 1000000;
    }
}

static void on_piece(void *arg, void *user, const char *text, size_t len)
{
    const char *f[] = {"text"};
    const char *v[] = {text};
    stream_add(arg, user, f, v, &len, 1);
}

static void on_done(void *arg, const struct gen_result *r)
{
    struct lane *g = arg;
    struct job *j = r->user;
    live_remove(g, j);
    double now_mono = (double)clock_mono_us() / 1000.0;
    int64_t now_wall = clock_wall_ms();
    j->infer_ms = now_mono - r->submit_ms;
    const char *fin = r->status == GEN_OK             ? gen_finish_name(r->finish)
                      : r->status == GEN_DEADLINE_EXCEEDED ? "deadline"
                                                           : "error";
    const char *f[] = {"done", "finish_reason"};
    const char *v[] = {"1", fin};
    size_t l[] = {1, strlen(fin)};
    stream_add(g, j, f, v, l, 2);
    if (r->status != GEN_OK) {
        if (r->status == GEN_FAILED)
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "generation failed: %s",
                     r->error ? r->error : "the device failed");
        else
            job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED,
                     "deadline passed before the first token was generated");
        publish(g, j);
        return;
    }
    double ttft = -1, tps = 0;
    if (r->n_tokens > 0) {
        /* The first token's instant on the wall clock, from the record's timestamp. */
        double first_wall = (double)now_wall - (now_mono - r->token_ms[0]);
        ttft = first_wall - (double)j->record_ts_ms;
        if (ttft < 0) ttft = 0;
        double span = r->token_ms[r->n_tokens - 1] - r->token_ms[0];
        if (r->n_tokens > 1 && span > 0) tps = (double)(r->n_tokens - 1) * 1000.0 / span;
    }
    struct codec_gen_result res = {
        .text = r->text, .text_len = r->text_len, .tokens = r->tokens, .n_tokens = r->n_tokens,
        .finish_reason = fin, .prompt_tokens = r->prompt_tokens,
        .completion_tokens = r->completion_tokens, .logprobs = r->logprobs,
        .ttft_ms = ttft < 0 ? 0 : ttft, .decode_tokens_per_s = tps};
    j->gen_res = &res; /* borrowed by job_encode inside publish */
    stats_gen_done(g->c.stats, r->prompt_tokens, r->completion_tokens,
                   ttft >= 0 ? ttft / 1000.0 : -1, tps > 0 ? 1.0 / tps : -1);
    publish(g, j);
}

/* Attempt counters: 1 when j may run; 0 after answering it (it was
 * running each of the last max_attempts times the worker died). */
static int attempts_allow(struct lane *g, struct job *j)
{
    int max = g->c.cfg->worker.max_attempts;
    long long n = 0;
    if (!g->c.count_attempts || !g->rs || max <= 0) return 1;
    if (rsink_incr_attempts(g->rs, &j, 1, &n, 0) < 0 || n <= max) return 1;
    LOG_E("poison_job", "id=%s topic=%s partition=%" PRId32 " offset=%" PRId64 " attempts=%lld",
          j->req.id, j->topic, j->partition, j->offset, n);
    job_fail(j, PROTO_ERR_INFERENCE_FAILED,
             "not run: the worker stopped while generating this job %lld times "
             "(worker.max_attempts %d)", n - 1, max);
    return 0;
}

/* Submits j to its engine: 1 taken (or answered), 0 the engine is full. */
static int submit_one(struct lane *g, struct job *j)
{
    struct gen_engine *e = g->eng[j->model_idx];
    const struct codec_gen *q = j->req.gen;
    const struct genmodel *gm = g->c.gens[j->model_idx];
    int64_t now_ms = clock_wall_ms();
    if (j->deadline_ms && j->deadline_ms <= now_ms) {
        j->queued_ms = (double)(clock_mono_us() - j->arrived_us) / 1000.0;
        job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED, "deadline passed after %.1f ms in the queue",
                 j->queued_ms);
        publish(g, j);
        return 1;
    }
    const struct decoder_info *di = decoder_info(gm->dec);
    struct gen_request r = {
        .prompt = j->ids, .n_prompt = j->n_tokens, .seed = q->seed,
        .max_tokens = j->gen_max_tokens, .end_ids = di->eos_ids, .n_end = di->n_eos,
        .logprobs = q->logprobs, .priority = j->priority, .user = j,
        .deadline_ms = j->deadline_us ? (int64_t)(j->deadline_us / 1000) : 0};
    if (r.n_end > GEN_MAX_END_IDS) r.n_end = GEN_MAX_END_IDS;
    r.sampling.temperature = q->temperature >= 0 ? q->temperature : gm->default_temperature;
    r.sampling.top_k = q->top_k;
    r.sampling.top_p = q->top_p;
    r.sampling.min_p = q->min_p;
    for (size_t i = 0; i < q->n_stop; i++) r.stop[i] = q->stop[i];
    r.n_stop = q->n_stop;
    char why[256];
    int rc = gen_engine_submit(e, &r, why, sizeof(why));
    if (rc == GEN_EFULL) return 0;
    j->queued_ms = (double)(clock_mono_us() - j->arrived_us) / 1000.0;
    if (rc == GEN_EINVAL || rc == GEN_ENOMEM) {
        if (rc == GEN_ENOMEM) snprintf(why, sizeof(why), "out of memory");
        job_fail(j, rc == GEN_EINVAL ? PROTO_ERR_INVALID_INPUT : PROTO_ERR_INFERENCE_FAILED,
                 "%s", why);
        publish(g, j);
        return 1;
    }
    j->next = g->live;
    g->live = j;
    const char *fault = g->c.cfg->debug.device_fault_id;
    if (*fault && strcmp(fault, j->req.id) == 0) {
        LOG_W("device_fault_injected", "id=%s", j->req.id);
        decoder_ws_inject_fault(gen_engine_ws(e));
    }
    j->gen_stream_ok = q->stream;
    const char *f[] = {"start"};
    const char *v[] = {"1"};
    size_t l[] = {1};
    stream_add(g, j, f, v, l, 1);
    return 1;
}

/* Takes new jobs in and submits what the engines have room for, in order
 * of arrival per engine. */
static void feed(struct lane *g, int wait_ms)
{
    struct job *got = jobq_take(&g->in, wait_ms);
    struct job **tail = &g->pending;
    while (*tail) tail = &(*tail)->next;
    *tail = got;
    struct job *keep = NULL, **kt = &keep;
    for (struct job *j = g->pending, *next; j; j = next) {
        next = j->next;
        j->next = NULL;
        /* Counted once, when first taken (picked: the batcher's mark, free here). */
        if (!j->picked && (j->picked = 1) && !attempts_allow(g, j)) {
            publish(g, j);
            continue;
        }
        if (submit_one(g, j)) continue;
        *kt = j;
        kt = &j->next;
    }
    g->pending = keep;
}

static void gauges_update(struct lane *g)
{
    size_t run = 0, wait = 0, used = 0, total = 0;
    uint64_t pre = 0, shared = 0;
    for (size_t i = 0; i < g->c.n_models; i++) {
        if (!g->eng[i]) continue;
        shared += gen_engine_shared_tokens(g->eng[i]);
        run += gen_engine_running(g->eng[i]);
        wait += gen_engine_waiting(g->eng[i]);
        pre += gen_engine_preemptions(g->eng[i]);
        struct kvcache *kv = decoder_ws_cache(gen_engine_ws(g->eng[i]));
        total += kvcache_total_blocks(kv);
        used += kvcache_total_blocks(kv) - kvcache_free_blocks(kv);
    }
    for (struct job *j = g->pending; j; j = j->next) wait++;
    atomic_store(&g->g_running, run);
    atomic_store(&g->g_waiting, wait);
    atomic_store(&g->g_used, used);
    atomic_store(&g->g_total, total);
    atomic_store(&g->g_preempt, pre);
    atomic_store(&g->g_shared, shared);
}

static void *genexec_main(void *arg)
{
    struct lane *g = arg;
    const struct kcfg *k = g->c.cfg;
    struct gen_engine_cb cb = {.on_done = on_done, .on_piece = on_piece, .arg = g};
    struct gen_engine_conf ec = {
        .max_seqs = (size_t)k->generation.max_seqs,
        .max_waiting = 2 * (size_t)k->generation.max_seqs + 8,
        .max_batch_tokens = (size_t)k->batching.max_batch_tokens,
        .block_tokens = (size_t)k->generation.block_tokens,
        .prefix_sharing = k->generation.prefix_sharing,
        .overlap = k->generation.overlap,
        .kv_bytes = (size_t)k->generation.kv_cache_mb << 20};
    if (ec.max_batch_tokens < ec.max_seqs) ec.max_batch_tokens = ec.max_seqs;
    for (size_t i = 0; i < g->c.n_models; i++) {
        if (!g->c.gens[i]) continue;
        g->eng[i] = gen_engine_new(g->c.gens[i]->dec, g->c.gens[i]->tok, g->slot, &ec, &cb,
                                   g->err, sizeof(g->err));
        if (!g->eng[i]) {
            for (size_t k2 = 0; k2 < i; k2++) gen_engine_destroy(g->eng[k2]);
            memset(g->eng, 0, g->c.n_models * sizeof(*g->eng));
            atomic_store(&g->ready, -1);
            return NULL;
        }
    }
    atomic_store(&g->ready, 1);
    int fatal_step = 0;
    while (!atomic_load(&g->stop) && !atomic_load(g->c.fatal)) {
        stats_alive(g->c.stats, GENEXEC_LOOP(g->slot));
        int busy = 0;
        for (size_t i = 0; i < g->c.n_models; i++)
            if (g->eng[i] && (gen_engine_running(g->eng[i]) || gen_engine_waiting(g->eng[i])))
                busy = 1;
        feed(g, busy ? 0 : 50);
        for (size_t i = 0; i < g->c.n_models && !fatal_step; i++) {
            if (!g->eng[i] || (!gen_engine_running(g->eng[i]) && !gen_engine_waiting(g->eng[i])))
                continue;
            if (k->debug.batch_sleep_ms > 0) sleep_ms(k->debug.batch_sleep_ms);
            int rc = gen_engine_step(g->eng[i]);
            if (rc >= 0) continue;
            const char *why = gen_engine_error(g->eng[i]);
            if (rc == MODEL_EFATAL) {
                LOG_E("generator_failed", "model=%s error=\"%s\" note=\"the device failed for "
                      "good: stopping; its jobs run again after the restart\"",
                      g->c.gens[i]->name, why ? why : "");
                fatal_step = 1;
                atomic_store(g->c.fatal, 1);
            } else {
                gen_engine_abort(g->eng[i], why ? why : "the step failed");
            }
        }
        gauges_update(g);
    }
    stats_loop_stop(g->c.stats, GENEXEC_LOOP(g->slot));
    /* On the thread that made them; requests still in them are dropped
     * unreported (their jobs are freed by genexec_stop). Each says where
     * its tokens were chosen: on the device (no logits to the host) or
     * on the host from the logits. */
    for (size_t i = 0; i < g->c.n_models; i++) {
        if (g->eng[i]) {
            struct decoder_ws_counters dc;
            decoder_ws_counters(gen_engine_ws(g->eng[i]), &dc);
            LOG_I("generator_stopped",
                  "model=%s lane=%u steps=%" PRIu64 " graph_steps=%" PRIu64
                  " chained_steps=%" PRIu64 " chain_refused=%" PRIu64 " device_picks=%" PRIu64
                  " logits_bytes=%" PRIu64,
                  g->c.gens[i]->name, g->slot, dc.steps, dc.graph_steps,
                  gen_engine_overlapped(g->eng[i]), gen_engine_chain_refused(g->eng[i]),
                  dc.device_picks, dc.logits_bytes);
        }
        gen_engine_destroy(g->eng[i]);
        g->eng[i] = NULL;
    }
    return NULL;
}

/* Stops lane g's thread and frees what it holds (jobs unanswered,
 * uncommitted: they run again). */
static void lane_fini(struct lane *g)
{
    atomic_store(&g->stop, 1);
    if (g->has_thr) pthread_join(g->thr, NULL);
    g->has_thr = 0;
    job_free_list(g->live);
    job_free_list(g->pending);
    job_free_list(jobq_take(&g->in, 0));
    jobq_fini(&g->in);
    rsink_destroy(g->rs);
    free(g->eng);
}

/* Starts lane g on slot: its engines are made on its thread (lane_wait
 * waits for them), so the lanes of several devices set up at once. */
static int lane_start(struct lane *g, const struct genexec_conf *c, unsigned slot, char *errstr,
                      size_t errstr_size)
{
    g->c = *c;
    g->slot = slot;
    jobq_init(&g->in);
    if (!(g->eng = calloc(c->n_models, sizeof(*g->eng)))) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    const struct kcfg *k = c->cfg;
    if ((c->stream || c->count_attempts)) {
        struct rsink_conf rc = {.host = k->redis.host, .port = k->redis.port,
                                .password = k->redis.password, .db = k->redis.db,
                                .key_prefix = k->redis.key_prefix, .ttl_ms = k->redis.ttl_ms,
                                .timeout_ms = k->redis.timeout_ms,
                                .attempt_prefix = k->worker.attempt_prefix};
        g->rs = rsink_new(&rc); /* NULL (out of memory): no streams, no counters */
    }
    if (pthread_create(&g->thr, NULL, genexec_main, g) != 0) {
        snprintf(errstr, errstr_size, "cannot start generator thread %u", slot);
        return -1;
    }
    g->has_thr = 1;
    return 0;
}

/* 0 once lane g's engines are made, or -1 with why. */
static int lane_wait(struct lane *g, char *errstr, size_t errstr_size)
{
    while (atomic_load(&g->ready) == 0) sleep_ms(1);
    if (atomic_load(&g->ready) < 0) {
        snprintf(errstr, errstr_size, "%s", g->err);
        return -1;
    }
    return 0;
}

struct genexec *genexec_start(const struct genexec_conf *c, char *errstr, size_t errstr_size)
{
    struct genexec *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    x->c = *c;
    size_t n = 0;
    for (size_t i = 0; i < c->n_models; i++) n += c->gens[i] != NULL;
    if (!n) return x;
    size_t lanes = c->lanes ? c->lanes : 1;
    if (lanes > GENEXEC_MAX_LANES) lanes = GENEXEC_MAX_LANES;
    if (!(x->lane = calloc(lanes, sizeof(*x->lane)))) {
        snprintf(errstr, errstr_size, "out of memory");
        free(x);
        return NULL;
    }
    int rc = 0;
    for (; rc == 0 && x->n_lanes < lanes; x->n_lanes++)
        rc = lane_start(&x->lane[x->n_lanes], c, (unsigned)x->n_lanes, errstr, errstr_size);
    for (size_t i = 0; rc == 0 && i < x->n_lanes; i++)
        rc = lane_wait(&x->lane[i], errstr, errstr_size);
    if (rc < 0) { /* the lane that failed is stopped with the others */
        genexec_stop(x);
        return NULL;
    }
    return x;
}

/* The lane with the fewest jobs; among equals the next after the last
 * chosen, so idle lanes take turns. */
void genexec_push(struct genexec *x, struct job *j)
{
    if (!x->n_lanes) { /* no generating model: the intake never pushes one */
        j->next = NULL;
        job_free_list(j); /* uncommitted: it runs again elsewhere */
        return;
    }
    size_t best = x->next % x->n_lanes, low = atomic_load(&x->lane[best].load);
    for (size_t k = 1; k < x->n_lanes && low; k++) {
        size_t i = (x->next + k) % x->n_lanes, l = atomic_load(&x->lane[i].load);
        if (l < low) best = i, low = l;
    }
    x->next = best + 1;
    j->next = NULL;
    atomic_fetch_add(&x->lane[best].load, 1);
    jobq_push(&x->lane[best].in, j);
}

void genexec_gauges(struct genexec *x, struct genexec_gauges *out)
{
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; x && i < x->n_lanes; i++) {
        struct lane *g = &x->lane[i];
        out->running += atomic_load(&g->g_running);
        out->waiting += atomic_load(&g->g_waiting);
        out->blocks_used += atomic_load(&g->g_used);
        out->blocks_total += atomic_load(&g->g_total);
        out->preemptions += atomic_load(&g->g_preempt);
        out->shared_tokens += atomic_load(&g->g_shared);
    }
}

void genexec_cut(struct genexec *x)
{
    for (size_t i = 0; x && i < x->n_lanes; i++)
        if (x->lane[i].rs) rsink_cancel(x->lane[i].rs);
}

void genexec_stop(struct genexec *x)
{
    if (!x) return;
    for (size_t i = 0; i < x->n_lanes; i++) atomic_store(&x->lane[i].stop, 1);
    for (size_t i = 0; i < x->n_lanes; i++) lane_fini(&x->lane[i]);
    free(x->lane);
    free(x);
}

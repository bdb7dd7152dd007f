/* exec.c - the executor stage (exec.h): each thread takes a closed batch,
 * checks deadlines and attempt counts, runs the batch's jobs in one
 * forward pass (suspects of an earlier crash alone, after the others are
 * written out), encodes the results and pushes the batch to the sink.
 *
 * Threads: the executor threads share only the stage's counters (atomics)
 * and the batcher and sink queue (locked); each owns its workspaces, its
 * scratch arrays and its own Redis connection for the attempt counters.
 * Buffers are made once per thread; per batch it allocates only each
 * job's output and body. */
#include "exec.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "../base/log.h"
#include "rsink.h"

struct exec {
    struct exec_conf c;
    pthread_t *thr;
    struct rsink **rs;    /* per thread slot: attempt counters; NULL = not counted.
                             Made before the threads and freed after them, so
                             exec_cut may reach them while the threads run */
    size_t n_rs;          /* slots in rs: every thread asked for */
    size_t n_thr;
    atomic_int running;   /* batches taken and not yet pushed to the sink */
    atomic_int stop;
    atomic_int ids;       /* hands each thread its slot */
};

/* One thread's own things. */
struct exec_thread {
    struct exec *ex;
    int loop;                 /* its watchdog loop: STATS_LOOP_EXEC + slot */
    struct model_ws **ws;     /* by model index */
    struct job **jobs, **group;
    long long *counts;
    int *suspect;
    struct rsink *rs;         /* attempt counters; NULL = not counted */
    /* Packing an encoder's batch (when a model is one): every row's ids
     * and type ids one after another, and where each row starts. */
    int32_t *seq_ids, *seq_types;
    uint32_t *seq_offs;
};

/* stats_batch takes the batcher's reasons as they are. */
_Static_assert((int)BATCH_SIZE == (int)STATS_BATCH_SIZE &&
                   (int)BATCH_DEADLINE == (int)STATS_BATCH_DEADLINE &&
                   (int)BATCH_WAIT == (int)STATS_BATCH_WAIT &&
                   (int)BATCH_DRAIN == (int)STATS_BATCH_DRAIN,
               "enum stats_batch_reason mirrors enum batcher_reason");

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A forward pass that failed for good: logged; the worker stops. */
static int model_fatal(struct exec *ex, const struct model *m, struct model_ws *ws, size_t rows)
{
    LOG_E("model_failed", "model=%s rows=%zu error=\"%s\" note=\"exiting: the batch is "
          "uncommitted and runs again after the restart\"", model_name(m), rows,
          model_ws_error(ws));
    atomic_store(ex->c.fatal, 1);
    return MODEL_EFATAL;
}

/* Runs n jobs of an encoder as one pass: their rows' token ids packed
 * into the thread's buffers, the encoder run once, each job given its rows
 * of the output (pooled vectors or classifier scores with the best label
 * per row; for per-token output, each row's vectors padded with zeros to
 * the job's longest row). */
static int run_encoder(struct exec_thread *t, int model_idx, struct job **jobs, size_t n)
{
    struct exec *ex = t->ex;
    const struct model *m = ex->c.models[model_idx];
    struct model_ws *ws = t->ws[model_idx];
    size_t rows = 0, at = 0, longest = 0;
    for (size_t i = 0; i < n; i++) {
        const struct job *j = jobs[i];
        for (size_t r = 0; r < j->rows; r++) t->seq_offs[rows++] = (uint32_t)(at + j->offs[r]);
        memcpy(t->seq_ids + at, j->ids, j->n_tokens * sizeof(int32_t));
        memcpy(t->seq_types + at, j->type_ids, j->n_tokens * sizeof(int32_t));
        at += j->n_tokens;
        if (j->seq_len > longest) longest = j->seq_len;
    }
    if (!rows) return 0;
    t->seq_offs[rows] = (uint32_t)at;
    struct model_seqs seqs = {t->seq_ids, t->seq_types, t->seq_offs, rows};
    int64_t start_us = clock_mono_us();
    const float *out = NULL;
    int rc = model_encode(m, ws, &seqs, &out);
    if (rc == MODEL_EFATAL) return model_fatal(ex, m, ws, rows);
    double infer_ms = (double)(clock_mono_us() - start_us) / 1000.0;
    if (rc == 0) {
        batcher_record(ex->c.batcher, model_idx, rows * longest, infer_ms / 1000.0);
        stats_tokens(ex->c.stats, at, rows * longest);
    }
    size_t out_w = model_output_width(m), row0 = 0;
    int per_token = model_per_token(m);
    const char *const *labels = rc == 0 ? model_ws_labels(ws) : NULL;
    for (size_t i = 0; i < n; i++) {
        struct job *j = jobs[i];
        size_t first_row = row0, first_tok = t->seq_offs[row0];
        row0 += j->rows;
        j->infer_ms = infer_ms;
        j->batch_rows = rows;
        j->padded_tokens = j->rows * longest;
        if (rc < 0) {
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "model %s failed on a batch of %zu rows "
                     "(%zu tokens)", model_name(m), rows, at);
            continue;
        }
        size_t per_row = per_token ? j->seq_len * out_w : out_w;
        j->output = calloc(j->rows * per_row, sizeof(float));
        if (!j->output || (labels && !(j->labels = malloc(j->rows * sizeof(char *))))) {
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for the output");
            continue;
        }
        j->out_rows = j->rows;
        j->out_width = out_w;
        if (per_token) {
            j->out_tokens = j->seq_len;
            for (size_t r = 0; r < j->rows; r++)
                memcpy(j->output + r * per_row, out + (first_tok + j->offs[r]) * out_w,
                       (j->offs[r + 1] - j->offs[r]) * out_w * sizeof(float));
            continue;
        }
        memcpy(j->output, out + first_row * out_w, j->rows * out_w * sizeof(float));
        for (size_t r = 0; labels && r < j->rows; r++) j->labels[r] = labels[first_row + r];
    }
    return 0;
}

/* Runs n jobs of one model as one forward pass: packs their rows into the
 * workspace's input buffer, runs the model once, gives each job its rows
 * of the output. Returns MODEL_EFATAL when the backend failed for good:
 * the jobs are then left unanswered (the caller drops the batch and the
 * worker exits, so they stay uncommitted and run again after a restart);
 * 0 otherwise, failed jobs answered inference_failed. */
static int run_group(struct exec_thread *t, int model_idx, struct job **jobs, size_t n)
{
    struct exec *ex = t->ex;
    const struct model *m = ex->c.models[model_idx];
    if (model_encoder(m)) return run_encoder(t, model_idx, jobs, n);
    struct model_ws *ws = t->ws[model_idx];
    size_t in_w = model_input_width(m), out_w = model_output_width(m);
    size_t rows = 0;
    float *staging = model_ws_input(ws);
    for (size_t i = 0; i < n; i++) {
        memcpy(staging + rows * in_w, jobs[i]->req.input, jobs[i]->rows * in_w * sizeof(float));
        rows += jobs[i]->rows;
    }
    if (!rows) return 0;
    int64_t start_us = clock_mono_us();
    const float *out = NULL;
    int rc = model_forward(m, ws, staging, rows, &out);
    if (rc == MODEL_EFATAL) return model_fatal(ex, m, ws, rows);
    double infer_ms = (double)(clock_mono_us() - start_us) / 1000.0;
    if (rc == 0) batcher_record(ex->c.batcher, model_idx, rows, infer_ms / 1000.0);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        struct job *j = jobs[i];
        j->infer_ms = infer_ms;
        j->batch_rows = rows;
        if (rc < 0) {
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "model %s failed on a batch of %zu rows",
                     model_name(m), rows);
            continue;
        }
        const float *mine = out + at * out_w;
        at += j->rows;
        j->output = malloc(j->rows * out_w * sizeof(float));
        if (!j->output) {
            job_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory for the output");
            continue;
        }
        memcpy(j->output, mine, j->rows * out_w * sizeof(float));
        j->out_rows = j->rows;
        j->out_width = out_w;
    }
    return 0;
}

/* The fault-injection points of the debug section, just before job j
 * runs: a crash (abort), a hang (forever), or a dead device (the next
 * forward pass on j's workspace fails as a sticky CUDA error would).
 * Empty settings never match. */
static void failpoints(const struct exec_thread *t, const struct job *j)
{
    const struct exec *ex = t->ex;
    const char *crash = ex->c.cfg->debug.crash_id, *hang = ex->c.cfg->debug.hang_id;
    const char *dev = ex->c.cfg->debug.device_fault_id;
    if (dev[0] && strcmp(j->req.id, dev) == 0) {
        LOG_E("debug_device_fault", "id=%s note=\"debug.device_fault_id: failing the device on "
              "purpose\"", j->req.id);
        model_ws_inject_fault(t->ws[j->model_idx]);
    }
    if (crash[0] && strcmp(j->req.id, crash) == 0) {
        LOG_E("debug_crash", "id=%s note=\"debug.crash_id: aborting on purpose\"", j->req.id);
        abort();
    }
    if (hang[0] && strcmp(j->req.id, hang) == 0) {
        LOG_E("debug_hang", "id=%s note=\"debug.hang_id: hanging on purpose\"", j->req.id);
        for (;;) sleep_ms(1000);
    }
}

/* Counts an attempt for every job of the batch before it runs (rule 10).
 * A job counted before was in a batch when the worker died: it is a
 * suspect (suspect[i] = 1) and runs alone, after everything else is
 * written out. If Redis does not answer, the batch runs uncounted:
 * nothing is lost; only crash-loop protection is missing while Redis is
 * away. */
static void count_attempts(struct exec_thread *t, size_t n)
{
    for (size_t i = 0; i < n; i++) t->suspect[i] = 0;
    if (!t->rs || rsink_incr_attempts(t->rs, t->jobs, n, t->counts, 0) < 0) return;
    for (size_t i = 0; i < n; i++) t->suspect[i] = t->counts[i] > 1;
}

/* Before a suspect runs alone: counts that solo run. Only a job that
 * kills the worker while running alone collects solo runs, so one counted
 * more than worker.max_attempts times is the culprit: it is answered
 * inference_failed and never run again (its partition moves on). Returns
 * 1 if it may run. */
static int solo_allowed(struct exec_thread *t, struct job *j)
{
    long long solo = 0;
    int max = t->ex->c.cfg->worker.max_attempts;
    if (!t->rs || rsink_incr_attempts(t->rs, &j, 1, &solo, 1) < 0 || solo <= max) return 1;
    LOG_E("poison_job", "id=%s topic=%s partition=%" PRId32 " offset=%" PRId64
          " solo_attempts=%lld", j->req.id, j->topic, j->partition, j->offset, solo);
    job_fail(j, PROTO_ERR_INFERENCE_FAILED,
             "not run: the worker stopped while running this job alone %lld times "
             "(worker.max_attempts %d)", solo - 1, max);
    return 0;
}

/* A job that ran and was encoded holds only its result's body: from now
 * on it weighs that, in rows of its model's input, plus one, and the rows
 * it sheds go to the intake's count (exec.h, `lightened`). A model with no
 * float input width (an encoder: its rows are sequences) keeps its jobs'
 * weight. */
static void lighten(struct exec *ex, struct job *j)
{
    if (!ex->c.lightened || j->model_idx < 0 || !j->rows) return;
    size_t row_bytes = model_input_width(ex->c.models[j->model_idx]) * sizeof(float);
    if (!row_bytes) return;
    size_t w = 1 + j->body_len / row_bytes;
    if (w >= j->weight) return;
    atomic_fetch_add(ex->c.lightened, j->weight - w);
    j->weight = w;
}

/* Encodes every job of a batch (already run) and hands the batch to the
 * sink; its last job marks the end of an in-flight batch. */
static void finish_batch(struct exec *ex, struct job *batch, enum batcher_reason why,
                         size_t rows)
{
    int64_t enc_ms = clock_wall_ms();
    for (struct job *j = batch; j; j = j->next) {
        free(j->req.input); /* not needed any more: keep the sink's memory small */
        j->req.input = NULL;
        free(j->ids);
        free(j->type_ids);
        j->ids = j->type_ids = NULL;
        if (job_encode(j, enc_ms) == 0 && j->body_len > ex->c.max_record_bytes) {
            /* The producer could never publish it: answer with an error
             * that fits instead of retrying forever. Admission bounds
             * every result it accepts below this (worker/intake.c,
             * result_fits), so this is a last resort that should never
             * be reached. */
            size_t big = j->body_len;
            free(j->output);
            j->output = NULL;
            j->out_rows = j->out_width = 0;
            job_fail(j, PROTO_ERR_INFERENCE_FAILED,
                     "result of %zu bytes exceeds the producer's message.max.bytes "
                     "(%zu usable): send fewer rows per job", big, ex->c.max_record_bytes);
            job_encode(j, enc_ms);
        }
        if (!j->body) {
            LOG_E("out_of_memory", "where=encode id=%s", j->req.id);
            atomic_store(ex->c.fatal, 1);
        }
        free(j->output); /* the body holds it now */
        j->output = NULL;
        lighten(ex, j);
        j->batch_last = j->next == NULL;
    }
    jobq_push(ex->c.out, batch);
    atomic_fetch_sub(&ex->running, 1);
    stats_batch(ex->c.stats, (enum stats_batch_reason)why, rows);
}

/* Waits until the sink has written out every batch pushed so far (or the
 * stage is stopping): the suspect path only, where a crash must not find
 * innocent results still unwritten. */
static void wait_written(struct exec *ex)
{
    jobq_wait_written(ex->c.out, jobq_pushed(ex->c.out), &ex->stop);
}

/* A batch with suspects (jobs that were running when the worker died):
 * everyone else runs first and is written out, and only then does each
 * suspect run alone and get written out in turn, so a crash can only ever
 * be counted against the job that caused it. n jobs of the batch are
 * runnable (t->jobs), with t->suspect set. Returns MODEL_EFATAL when the
 * model failed for good (what was not pushed is dropped). */
static int run_with_suspects(struct exec_thread *t, struct job *batch, size_t n,
                             enum batcher_reason why, size_t rows)
{
    struct exec *ex = t->ex;
    int model_idx = batch->model_idx;
    struct job *rest = NULL, **rest_tail = &rest, *alone = NULL, **alone_tail = &alone;
    size_t g = 0;
    for (struct job *j = batch, *next; j; j = next) {
        next = j->next;
        j->next = NULL;
        int sus = 0;
        for (size_t i = 0; i < n; i++)
            if (t->jobs[i] == j) sus = t->suspect[i] && j->err == PROTO_OK;
        if (sus) {
            *alone_tail = j;
            alone_tail = &j->next;
        } else {
            if (j->err == PROTO_OK) {
                failpoints(t, j);
                t->group[g++] = j;
            }
            *rest_tail = j;
            rest_tail = &j->next;
        }
    }
    if (run_group(t, model_idx, t->group, g) == MODEL_EFATAL) {
        job_free_list(rest);
        job_free_list(alone);
        return MODEL_EFATAL;
    }
    if (rest) {
        finish_batch(ex, rest, why, rows);
        wait_written(ex);
    } else {
        atomic_fetch_sub(&ex->running, 1); /* each suspect counts its own */
    }
    for (struct job *j = alone, *next; j; j = next) {
        next = j->next;
        j->next = NULL;
        atomic_fetch_add(&ex->running, 1);
        if (solo_allowed(t, j)) {
            failpoints(t, j);
            if (run_group(t, j->model_idx, &j, 1) == MODEL_EFATAL) {
                j->next = next;
                job_free_list(j); /* unanswered: they run again after the restart */
                return MODEL_EFATAL;
            }
        }
        finish_batch(ex, j, why, j->rows);
        wait_written(ex);
    }
    return 0;
}

/* Takes batches while fewer than max_inflight_batches are running or
 * being written out; meanwhile jobs keep queueing (and the queue's high
 * mark pauses fetching). */
static void exec_loop(struct exec_thread *t)
{
    struct exec *ex = t->ex;
    int max_inflight = ex->c.cfg->batching.max_inflight_batches;
    while (!atomic_load(&ex->stop) && !atomic_load(ex->c.fatal)) {
        stats_alive(ex->c.stats, t->loop);
        if (exec_inflight_batches(ex) >= max_inflight) {
            sleep_ms(1);
            continue;
        }
        size_t rows;
        enum batcher_reason why = BATCH_SIZE;
        struct job *batch = batcher_next(ex->c.batcher, 100, &rows, &why);
        if (!batch) continue;
        atomic_fetch_add(&ex->running, 1);
        if (ex->c.cfg->debug.batch_sleep_ms > 0) sleep_ms(ex->c.cfg->debug.batch_sleep_ms);
        int64_t start_us = clock_mono_us(), now_ms = clock_wall_ms();
        size_t n = 0;
        for (struct job *j = batch; j; j = j->next) {
            j->queued_ms = (double)(start_us - j->arrived_us) / 1000.0;
            if (j->deadline_ms && j->deadline_ms <= now_ms) {
                job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED,
                         "deadline passed after %.1f ms in the queue", j->queued_ms);
                continue;
            }
            t->jobs[n++] = j;
        }
        count_attempts(t, n);
        int any_suspect = 0;
        for (size_t i = 0; i < n; i++) any_suspect |= t->suspect[i] && t->jobs[i]->err == PROTO_OK;
        if (any_suspect) {
            if (run_with_suspects(t, batch, n, why, rows) == MODEL_EFATAL) break;
            continue;
        }
        size_t g = 0;
        for (size_t i = 0; i < n; i++)
            if (t->jobs[i]->err == PROTO_OK) {
                failpoints(t, t->jobs[i]);
                t->group[g++] = t->jobs[i];
            }
        if (run_group(t, batch->model_idx, t->group, g) == MODEL_EFATAL) {
            job_free_list(batch);
            break;
        }
        finish_batch(ex, batch, why, rows);
    }
}

/* One executor: its buffers, made once, then the loop. */
static void *exec_main(void *arg)
{
    struct exec *ex = arg;
    struct exec_thread t = {.ex = ex};
    unsigned slot = (unsigned)atomic_fetch_add(&ex->ids, 1);
    t.loop = STATS_LOOP_EXEC + (int)slot;
    size_t cap = (size_t)ex->c.cfg->batching.max_batch_rows;
    if ((size_t)ex->c.cfg->batching.max_job_rows > cap)
        cap = (size_t)ex->c.cfg->batching.max_job_rows;
    char err[256] = "out of memory";
    t.ws = calloc(ex->c.n_models, sizeof(*t.ws));
    t.jobs = calloc(cap + 1, sizeof(*t.jobs));
    t.group = calloc(cap + 1, sizeof(*t.group));
    t.counts = calloc(cap + 1, sizeof(*t.counts));
    t.suspect = calloc(cap + 1, sizeof(*t.suspect));
    if (!t.ws || !t.jobs || !t.group || !t.counts || !t.suspect) goto oom;
    size_t max_tok = (size_t)ex->c.cfg->batching.max_batch_tokens;
    for (size_t i = 0; i < ex->c.n_models; i++) {
        const struct model *m = ex->c.models[i];
        if (!m) continue; /* a generating model: the generator runs it (genexec.h) */
        if (!model_encoder(m)) {
            if (!(t.ws[i] = model_ws_new(m, slot, cap, err, sizeof(err)))) goto oom;
            continue;
        }
        /* An encoder's batch holds at most max_batch_tokens padded tokens,
         * so no more rows than that either. */
        size_t rows = cap < max_tok ? cap : max_tok;
        if (!(t.ws[i] = model_ws_new_tokens(m, slot, rows, max_tok, err, sizeof(err))))
            goto oom;
        if (!t.seq_ids && (!(t.seq_ids = malloc(max_tok * sizeof(int32_t))) ||
                           !(t.seq_types = malloc(max_tok * sizeof(int32_t))) ||
                           !(t.seq_offs = malloc((cap + 1) * sizeof(uint32_t)))))
            goto oom;
    }
    /* Its own connection: the counters go up before the batch runs. */
    t.rs = ex->rs[slot];
    exec_loop(&t);
    stats_loop_stop(ex->c.stats, t.loop);
    goto done;
oom:
    LOG_E("executor_failed", "where=executor_buffers rows=%zu error=\"%s\"", cap, err);
    atomic_store(ex->c.fatal, 1);
done:
    for (size_t i = 0; t.ws && i < ex->c.n_models; i++) model_ws_destroy(t.ws[i]);
    free(t.ws);
    free(t.jobs);
    free(t.group);
    free(t.counts);
    free(t.suspect);
    free(t.seq_ids);
    free(t.seq_types);
    free(t.seq_offs);
    return NULL;
}

struct exec *exec_start(const struct exec_conf *c, char *errstr, size_t errstr_size)
{
    struct exec *ex = calloc(1, sizeof(*ex));
    size_t n = c->n_threads ? c->n_threads : 1;
    if (!ex || !(ex->thr = calloc(n, sizeof(*ex->thr))) || !(ex->rs = calloc(n, sizeof(*ex->rs)))) {
        snprintf(errstr, errstr_size, "out of memory");
        if (ex) free(ex->thr);
        free(ex);
        return NULL;
    }
    ex->c = *c;
    ex->n_rs = n;
    for (size_t i = 0; i < n && c->count_attempts; i++) {
        const struct kcfg *k = c->cfg;
        struct rsink_conf rc = {.host = k->redis.host, .port = k->redis.port,
                                .password = k->redis.password, .db = k->redis.db,
                                .key_prefix = k->redis.key_prefix, .ttl_ms = k->redis.ttl_ms,
                                .timeout_ms = k->redis.timeout_ms,
                                .attempt_prefix = k->worker.attempt_prefix};
        ex->rs[i] = rsink_new(&rc); /* NULL (out of memory): that executor counts nothing */
    }
    for (; ex->n_thr < n; ex->n_thr++)
        if (pthread_create(&ex->thr[ex->n_thr], NULL, exec_main, ex) != 0) {
            snprintf(errstr, errstr_size, "cannot start executor thread %zu of %zu",
                     ex->n_thr + 1, n);
            exec_stop(ex);
            return NULL;
        }
    return ex;
}

size_t exec_threads(const struct exec *ex)
{
    return ex->n_thr;
}

int exec_inflight_batches(const struct exec *ex)
{
    return atomic_load(&ex->running) + (int)jobq_unwritten(ex->c.out);
}

void exec_cut(struct exec *ex)
{
    if (!ex) return;
    for (size_t i = 0; i < ex->n_rs; i++)
        if (ex->rs[i]) rsink_cancel(ex->rs[i]);
}

void exec_stop(struct exec *ex)
{
    if (!ex) return;
    atomic_store(&ex->stop, 1);
    batcher_stop(ex->c.batcher);
    for (size_t i = 0; i < ex->n_thr; i++) pthread_join(ex->thr[i], NULL);
    for (size_t i = 0; i < ex->n_rs; i++) rsink_destroy(ex->rs[i]);
    free(ex->rs);
    free(ex->thr);
    free(ex);
}

/* job.c - lifecycle of the pipeline's job record, and the view of it the
 * codec encodes a result from, and its report to the stats.
 *
 * Threads: any thread, on a job it owns. */
#include "job.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../base/utf8.h"

struct job *job_new(void)
{
    struct job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    j->req.priority = -1;
    j->model_idx = -1;
    j->priority = -1;
    return j;
}

void job_free(struct job *j)
{
    if (!j) return;
    codec_request_fini(&j->req);
    free(j->ids);
    free(j->type_ids);
    free(j->offs);
    free(j->labels);
    free(j->output);
    free(j->body);
    free(j->raw_key);
    free(j->raw_value);
    free(j);
}

void job_free_list(struct job *j)
{
    while (j) {
        struct job *next = j->next;
        job_free(j);
        j = next;
    }
}

void job_fail(struct job *j, enum proto_err e, const char *fmt, ...)
{
    j->err = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
    va_end(ap);
    utf8_repair_str(j->errmsg, sizeof(j->errmsg)); /* it may quote the record */
}

/* Saturating: a record may carry any timestamp and a job any deadline, and
 * a sum that wrapped would put the deadline in the past. */
int64_t job_effective_deadline_ms(int64_t own_ms, int64_t record_ts_ms, int64_t default_timeout_ms)
{
    int64_t d = own_ms > 0 ? own_ms : 0;
    if (default_timeout_ms > 0) {
        int64_t base = record_ts_ms > 0 ? record_ts_ms : 0;
        int64_t t = base > INT64_MAX - default_timeout_ms ? INT64_MAX : base + default_timeout_ms;
        if (!d || t < d) d = t;
    }
    return d;
}

/* The monotonic deadline is now_us plus what is left of deadline_ms. What
 * is left can be anything up to INT64_MAX ms (a deadline of 2^63-1 is a
 * valid integer), and in microseconds that no longer fits: it is capped so
 * the result stays below JOB_DEADLINE_FAR_US, which no clock reaches. */
int64_t job_deadline_us(int64_t deadline_ms, int64_t now_ms, int64_t now_us)
{
    if (deadline_ms <= now_ms) return now_us;
    int64_t left_ms = deadline_ms - now_ms; /* both >= 0: cannot wrap */
    int64_t max_left_ms = now_us < JOB_DEADLINE_FAR_US ? (JOB_DEADLINE_FAR_US - now_us) / 1000 : 0;
    if (left_ms > max_left_ms) left_ms = max_left_ms;
    return now_us + left_ms * 1000;
}

/* total_ms runs from the record's timestamp to now, never negative, and
 * is 0 when the record carried none. The old body is freed either way: a
 * stale body must never be published. */
int job_encode(struct job *j, int64_t now_ms)
{
    double total = j->record_ts_ms > 0 && now_ms > j->record_ts_ms
                       ? (double)(now_ms - j->record_ts_ms)
                       : 0.0;
    free(j->body);
    j->body = NULL;
    j->body_len = 0;
    /* Per-token output: each row's length, from its offsets. */
    size_t *lengths = NULL;
    int ok = j->err == PROTO_OK;
    if (ok && j->out_tokens) {
        if (!j->offs || !(lengths = malloc(j->out_rows * sizeof(*lengths)))) return -1;
        for (size_t i = 0; i < j->out_rows; i++) lengths[i] = j->offs[i + 1] - j->offs[i];
    }
    struct codec_result r = {
        .id = j->req.id,
        .model = j->model_name ? j->model_name : j->req.model,
        .enc = j->req.enc,
        .err = j->err,
        .errmsg = j->errmsg,
        .output = j->output,
        .out_rows = j->out_rows,
        .out_width = j->out_width,
        .meta = j->req.meta,
        .meta_len = j->req.meta_len,
        .queued_ms = j->queued_ms,
        .infer_ms = j->infer_ms,
        .total_ms = total,
        .batch_rows = j->batch_rows,
        .out_tokens = ok ? j->out_tokens : 0,
        .lengths = lengths,
        .labels = ok ? (const char *const *)j->labels : NULL,
        .tokens = j->n_tokens,
        .padded_tokens = j->padded_tokens,
        .topic = j->topic,
        .partition = j->partition,
        .offset = j->offset,
        .gen = ok ? j->gen_res : NULL,
    };
    if (j->gen_max_tokens) r.tokens = 0; /* the prompt's ids: not an encoder's timing */
    int rc = codec_encode_result(&r, &j->body, &j->body_len);
    free(lengths);
    return rc;
}

/* A job that ran has batch_rows set by the executor; the others (early
 * errors, expired while queued) have no queue or inference time. */
void job_report(const struct job *j, struct stats *st, int64_t now_ms)
{
    enum stats_status s = j->kind == JOB_DEAD ? STATS_STATUS_DEAD_LETTER
                          : j->err == PROTO_OK  ? STATS_STATUS_OK
                                                : STATS_STATUS_ERROR;
    int ran = j->batch_rows > 0;
    double e2e = -1;
    if (j->record_ts_ms > 0) {
        e2e = (double)(now_ms - j->record_ts_ms) / 1000.0;
        if (e2e < 0) e2e = 0; /* the producer's clock is ahead of ours */
    }
    stats_job(st, s, j->err, ran ? j->queued_ms / 1000.0 : -1, ran ? j->infer_ms / 1000.0 : -1,
              e2e);
}

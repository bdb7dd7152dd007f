/* intake.c - the intake stage (intake.h): the poll loop's round,
 * decoding and routing, backpressure, the expiry timer, the rate cap, and
 * the rebalance callback.
 *
 * Threads: the poll thread only; the rebalance callback runs inside
 * rd_kafka_consumer_poll on it, so it sees a consistent view of the
 * intake's state and of the offsets. Ownership: as intake.h says. */
#include "intake.h"

#include <inttypes.h>
#include <stdarg.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "../batching/flow.h"
#include "../text/tokenizer.h"
#include "../kafka/kq.h"
#include "../base/log.h"
#include "genadmit.h"

struct intake {
    struct kq_ctx kq;          /* first: the consumer's opaque (kq.h) */
    struct intake_conf c;
    rd_kafka_t *consumer;
    struct codec_limits lim;
    size_t max_job_rows;
    size_t row_bytes;          /* bytes of one input row of the widest model */
    size_t inflight_rows;      /* taken from Kafka, not yet finished */
    int64_t next_deadline_us;  /* the earliest deadline queued (INT64_MAX: none) */
    double tokens;             /* rate cap: jobs that may be taken now */
    int64_t tokens_at_us;
    /* Tokenizing an encoder's jobs: one work area, and room for the
     * largest job (max_batch_tokens ids) before it is copied to the job. */
    struct tokenizer_scratch *tok_scratch, *gen_scratch; /* gen_scratch: genadmit's */
    int32_t *tok_ids, *tok_types;
    size_t tok_cap;
    int paused;
    int64_t full_since_us;     /* full and holding since (0: not full) */
    int draining;
    int pipeline_stopped;      /* executors and sink stopped: nothing more completes */
    int n_assigned;
    int coop;                  /* the group's protocol is cooperative (known once assigned) */
    int64_t close_by_us;       /* closing: everything must end by then; 0 before */
    int closed;                /* the consumer closed in time (else destroyed without) */
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static size_t job_weight(const struct job *j)
{
    return j->weight ? j->weight : 1;
}

/* Frees jobs the intake took back (finished or purged) and takes their
 * rows off the in-flight count. */
static void release(struct intake *in, struct job *list, int finished)
{
    while (list) {
        struct job *next = list->next;
        size_t w = job_weight(list);
        in->inflight_rows -= w < in->inflight_rows ? w : in->inflight_rows;
        if (finished && in->c.ranges) ranges_job_done(in->c.ranges, list->topic, list->partition);
        job_free(list);
        list = next;
    }
}

void intake_collect(struct intake *in)
{
    /* Jobs that ran weigh their result now, not their input (exec.h). */
    size_t light = in->c.lightened ? atomic_exchange(in->c.lightened, 0) : 0;
    in->inflight_rows -= light < in->inflight_rows ? light : in->inflight_rows;
    release(in, offsets_collect(in->c.offsets, in->consumer), 1);
}

/* The model a job that names none is answered under: the one it would
 * have run on (the override, else the default), as an ok result names
 * it; NULL (the job's own name) when it names one. */
static const char *answered_model(const struct intake *in, const struct job *j)
{
    if (j->model_name || j->req.model[0]) return j->model_name;
    int idx = in->c.model_override >= 0 ? in->c.model_override : in->c.default_model;
    return idx >= 0 && (size_t)idx < in->c.n_models ? in->c.cfg->models[idx].name : NULL;
}

/* Finishes a job that will not run: encodes its error result and hands it
 * to the sink. */
static void answer_now(struct intake *in, struct job *j)
{
    j->model_name = answered_model(in, j);
    if (!j->weight) j->weight = 1;
    in->inflight_rows += j->weight;
    if (job_encode(j, clock_wall_ms()) < 0) {
        /* Out of memory: stop (the supervisor restarts us; the job is not
         * committed, so it runs again) rather than publish nothing. */
        LOG_E("out_of_memory", "where=encode id=%s", j->req.id);
        atomic_store(in->c.fatal, 1);
    }
    jobq_push(in->c.sink, j);
}

/* Copies what a dead letter needs from the record and queues it. */
static void dead_letter(struct intake *in, struct job *j, const struct intake_record *m,
                        const char *why)
{
    j->kind = JOB_DEAD;
    j->err = PROTO_ERR_INVALID_INPUT;
    snprintf(j->errmsg, sizeof(j->errmsg), "%s", why);
    /* The record is copied, up to what the producer can publish: the
     * original stays in its topic at the offset the headers name. */
    size_t klen = m->key_len < 16384 ? m->key_len : 16384;
    size_t vlen = m->value_len < in->c.max_record_bytes ? m->value_len : in->c.max_record_bytes;
    j->truncated_from = vlen < m->value_len ? m->value_len : 0;
    if (klen) {
        j->raw_key = malloc(klen);
        if (j->raw_key) memcpy(j->raw_key, m->key, klen);
        j->raw_key_len = j->raw_key ? klen : 0;
    }
    if (vlen) {
        j->raw_value = malloc(vlen);
        if (j->raw_value) memcpy(j->raw_value, m->value, vlen);
        j->raw_value_len = j->raw_value ? vlen : 0;
    }
    /* A key that is a usable id names the job: whoever sent it is told,
     * with an invalid_input result under that id, as an oversize record's
     * sender is (docs/protocol.md, "Records that are not jobs"). */
    if (m->key && proto_id_valid((const char *)m->key, m->key_len)) {
        memcpy(j->req.id, m->key, m->key_len);
        j->req.id[m->key_len] = '\0';
        j->req.enc = m->value_len && ((const char *)m->value)[0] == '{' ? PROTO_ENC_JSON
                                                                        : PROTO_ENC_MSGPACK;
        j->model_name = answered_model(in, j);
        if (job_encode(j, clock_wall_ms()) < 0) {
            LOG_E("out_of_memory", "where=encode id=%s", j->req.id);
            atomic_store(in->c.fatal, 1);
        }
    }
    /* Held bytes count against the in-flight bound like rows of input. */
    j->weight = 1 + (klen + vlen + j->body_len) / in->row_bytes;
    in->inflight_rows += j->weight;
    LOG_W("dead_letter", "topic=%s partition=%" PRId32 " offset=%" PRId64 " error=\"%s\"",
          j->topic, j->partition, j->offset, why);
    jobq_push(in->c.sink, j);
}

/* Fails j with invalid_input, answers it, and returns -1. */
__attribute__((format(printf, 3, 4)))
static int reject(struct intake *in, struct job *j, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[PROTO_ERRMSG_MAX];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    job_fail(j, PROTO_ERR_INVALID_INPUT, "%s", msg);
    answer_now(in, j);
    return -1;
}

/* Row r of a pre-tokenized job into the intake's buffers at *at: every id
 * the job sent is checked against the model's vocabulary and type ids,
 * those past the cut too (a job is not `ok` with ids the model could not
 * take, wherever they are); longer than max_tokens it is cut to its first
 * max_tokens - 1 ids and its last (its [SEP]) when truncate is set.
 * Returns the row's length, or -1 after answering. */
static long take_token_row(struct intake *in, struct job *j, const struct model_encoder_info *e,
                           size_t r, size_t at)
{
    const struct codec_request *q = &j->req;
    size_t b = q->token_off[r], len = q->token_off[r + 1] - b;
    if (len > e->max_tokens) {
        if (!q->truncate)
            return reject(in, j, "field tokens: row %zu is %zu tokens, over the model's limit "
                          "of %zu (truncate is false)", r, len, e->max_tokens);
    }
    size_t keep = len > e->max_tokens ? e->max_tokens : len;
    if (keep > in->tok_cap - at)
        return reject(in, j, "the job is over batching.max_batch_tokens %zu tokens",
                      in->tok_cap);
    for (size_t k = 0; k < len; k++) {
        int32_t id = q->tokens[b + k];
        int32_t ty = q->type_ids ? q->type_ids[b + k] : 0;
        if ((size_t)id >= e->vocab)
            return reject(in, j, "field tokens: row %zu element %zu: id %" PRId32 " is not in "
                          "the model's vocabulary (0..%zu)", r, k, id, e->vocab - 1);
        if (ty < 0 || (size_t)ty >= e->type_vocab)
            return reject(in, j, "field type_ids: row %zu element %zu: %" PRId32 " is not a "
                          "type id of the model (0..%zu)", r, k, ty, e->type_vocab - 1);
    }
    for (size_t k = 0; k < keep; k++) {
        size_t src = b + (k + 1 == keep && keep < len ? len - 1 : k);
        in->tok_ids[at + k] = q->tokens[src];
        in->tok_types[at + k] = q->type_ids ? q->type_ids[src] : 0;
    }
    return (long)keep;
}

/* Row r of a text job through the model's tokenizer into the intake's
 * buffers at *at. Returns the row's length, or -1 after answering. */
static long take_text_row(struct intake *in, struct job *j, const struct model_encoder_info *e,
                          size_t r, size_t at)
{
    const struct codec_request *q = &j->req;
    const char *pair = q->pair ? q->pair + q->pair_off[r] : NULL;
    size_t pair_len = q->pair ? q->pair_off[r + 1] - q->pair_off[r] : 0;
    char why[160];
    size_t full = 0;
    /* nothing to embed: an error, not the vector of the specials alone */
    if (tokenizer_text_blank(q->text + q->text_off[r], q->text_off[r + 1] - q->text_off[r]))
        return reject(in, j, "field text: row %zu is empty or only whitespace", r);
    if (pair && tokenizer_text_blank(pair, pair_len))
        return reject(in, j, "field text_pair: row %zu is empty or only whitespace", r);
    int n = tokenizer_encode(e->tokenizer, in->tok_scratch, q->text + q->text_off[r],
                             q->text_off[r + 1] - q->text_off[r], pair, pair_len, e->max_tokens,
                             q->truncate, in->tok_ids + at, in->tok_types + at, in->tok_cap - at,
                             &full, why, sizeof(why));
    if (n >= 0) {
        /* a pair is fine for a model of one token type (RoBERTa, MPNet,
         * DistilBERT) when its tokenizer's post-processor gives every
         * token a type id the model has (RoBERTa's: 0 throughout) */
        for (int k = 0; pair && k < n; k++)
            if (in->tok_types[at + (size_t)k] < 0 ||
                (size_t)in->tok_types[at + (size_t)k] >= e->type_vocab)
                return reject(in, j, "model %s has %zu token type%s: its tokenizer gives "
                              "type id %" PRId32 " to a text_pair, so it takes none",
                              j->model_name, e->type_vocab, e->type_vocab == 1 ? "" : "s",
                              in->tok_types[at + (size_t)k]);
        return n;
    }
    switch (n) {
    case TOKENIZER_ERR_UTF8:
    case TOKENIZER_ERR_TOO_LONG:
        return reject(in, j, "field text: row %zu: %s%s", r, why,
                      n == TOKENIZER_ERR_TOO_LONG ? " (truncate is false)" : "");
    case TOKENIZER_ERR_CAP:
        return reject(in, j, "the job is over batching.max_batch_tokens %zu tokens", in->tok_cap);
    default:
        job_fail(j, PROTO_ERR_INFERENCE_FAILED, "tokenizer: %s", why);
        answer_now(in, j);
        return -1;
    }
}

/* An encoder's job: every row tokenized (or its ids checked) into the
 * job's own arrays, its text freed. The padded tokens of the job (rows x
 * its longest row) must fit one batch. Returns 0, or -1 after answering. */
static int tokenize(struct intake *in, struct job *j, const struct model_encoder_info *e)
{
    struct codec_request *q = &j->req;
    size_t rows = q->n_text ? q->n_text : q->n_token_rows;
    if (!rows)
        return reject(in, j, "model %s is a text encoder: send text or tokens, not input",
                      j->model_name);
    if (rows > in->max_job_rows)
        return reject(in, j, "%zu rows exceeds batching.max_job_rows %zu", rows,
                      in->max_job_rows);
    if (!(j->offs = malloc((rows + 1) * sizeof(*j->offs)))) goto oom;
    size_t at = 0, longest = 0;
    for (size_t r = 0; r < rows; r++) {
        long n = q->n_text ? take_text_row(in, j, e, r, at) : take_token_row(in, j, e, r, at);
        if (n < 0) return -1;
        j->offs[r] = (uint32_t)at;
        at += (size_t)n;
        if ((size_t)n > longest) longest = (size_t)n;
        if ((r + 1) * longest > in->tok_cap)
            return reject(in, j, "the job is %zu rows of up to %zu tokens, over "
                          "batching.max_batch_tokens %zu padded tokens", rows, longest,
                          in->tok_cap);
    }
    j->offs[rows] = (uint32_t)at;
    if (!(j->ids = malloc(at * sizeof(*j->ids))) ||
        !(j->type_ids = malloc(at * sizeof(*j->type_ids))))
        goto oom;
    memcpy(j->ids, in->tok_ids, at * sizeof(*j->ids));
    memcpy(j->type_ids, in->tok_types, at * sizeof(*j->type_ids));
    j->n_tokens = at;
    j->seq_len = longest;
    j->rows = rows;
    codec_request_fini_rows(q);
    return 0;
oom:
    job_fail(j, PROTO_ERR_INFERENCE_FAILED, "out of memory tokenizing %zu rows", rows);
    answer_now(in, j);
    return -1;
}

/* A job the worker accepts must be answerable: the most bytes its result
 * can take (codec_result_max_bytes: rows x width x the encoding's bytes
 * per value, per-token output padded to the job's longest row, plus the
 * envelope) must fit what the producer can publish. Checked before the
 * job runs, so no forward pass ends in a result that cannot be sent
 * (docs/protocol.md, "Result size"). Returns 0, or -1 after answering. */
static int result_fits(struct intake *in, struct job *j, const struct model *m, size_t rows)
{
    const struct model_encoder_info *e = model_encoder(m);
    int per_token = e && model_per_token(m);
    size_t width = model_output_width(m);
    size_t per_row = per_token ? j->seq_len * width : width;
    struct codec_result_size rs = {
        .enc = j->req.enc,
        .rows = rows,
        .values = per_row && rows > SIZE_MAX / per_row ? SIZE_MAX : rows * per_row,
        .per_token = per_token,
        .labels = e && e->n_labels > 0,
        .id_len = strlen(j->req.id),
        .model_len = strlen(j->model_name),
        .topic_len = strlen(j->topic),
        .meta_len = j->req.meta_len,
    };
    for (size_t i = 0; rs.labels && i < e->n_labels; i++) {
        size_t len = strlen(e->labels[i]);
        if (len > rs.label_max) rs.label_max = len;
    }
    size_t need = codec_result_max_bytes(&rs);
    if (need <= in->c.max_record_bytes) return 0;
    int js = j->req.enc == PROTO_ENC_JSON;
    return reject(in, j, "the result could take %zu bytes (%zu rows x %zu values x %d bytes "
                  "in %s), over the producer's message.max.bytes (%zu usable): send fewer "
                  "rows per job", need, rows, per_row, js ? CODEC_JSON_FLOAT_MAX + 1 : 4,
                  js ? "JSON" : "MessagePack", in->c.max_record_bytes);
}

/* Records the worker will never read: a record at an offset past the one
 * after the last record taken from its partition means the consumer
 * jumped (librdkafka reset the fetch offset because the broker deleted
 * records before they were read: retention, or a full partition of the
 * embedded broker). Nothing can answer those jobs, so they are counted
 * per partition (kinfer_records_skipped_total, alerted on by
 * KinferRecordsSkipped) and logged as an error naming the range
 * (docs/reliability.md, "When the broker deletes unread records"). On a
 * transactional or compacted topic a gap is also what commit markers and
 * compaction leave. */
static void skipped(struct intake *in, const char *topic, int32_t partition, int64_t offset)
{
    int64_t next = offsets_next(in->c.offsets, topic, partition);
    if (next < 0 || offset <= next) return;
    LOG_E("records_skipped", "topic=%s partition=%" PRId32 " from=%" PRId64 " to=%" PRId64
          " records=%" PRId64 " why=\"the consumer jumped over them (offset reset: the broker "
          "deleted them unread?)\"", topic, partition, next, offset - 1, offset - next);
    stats_skipped(in->c.stats, topic, partition, next, offset - 1);
}

/* Admission (intake.h): decode, route, tokenize, deadline, queue. Every
 * record becomes exactly one job that is tracked until both its
 * acknowledgements. */
enum intake_admitted intake_admit(struct intake *in, const struct intake_record *m)
{
    const struct kcfg *cfg = in->c.cfg;
    const struct worker_opts *opts = in->c.opts;
    struct job *j = job_new();
    if (!j) {
        LOG_E("out_of_memory", "where=take_record");
        atomic_store(in->c.fatal, 1);
        return INTAKE_FATAL;
    }
    snprintf(j->topic, sizeof(j->topic), "%s", m->topic);
    j->partition = m->partition;
    j->offset = m->offset;
    j->record_ts_ms = m->timestamp_ms;
    if (j->record_ts_ms < 0) j->record_ts_ms = clock_wall_ms();
    j->arrived_us = clock_mono_us();
    skipped(in, j->topic, j->partition, j->offset);
    if (offsets_track(in->c.offsets, j->topic, j->partition, j->offset) < 0) {
        LOG_E("out_of_memory", "where=offtrack");
        job_free(j);
        atomic_store(in->c.fatal, 1);
        return INTAKE_FATAL;
    }
    stats_consumed(in->c.stats);

    char why[256];
    enum codec_rc rc = codec_decode_job(m->value, m->value_len, m->key, m->key_len,
                                        m->content_type, j->record_ts_ms, &in->lim, &j->req, why,
                                        sizeof(why));
    if (rc == CODEC_DEAD) {
        dead_letter(in, j, m, why);
        return INTAKE_DEAD;
    }
    if (j->req.err != PROTO_OK) {
        job_fail(j, j->req.err, "%s", j->req.errmsg);
        answer_now(in, j);
        return INTAKE_ANSWERED;
    }
    int idx = in->c.model_override >= 0 ? in->c.model_override
              : j->req.model[0]          ? -1
                                         : in->c.default_model;
    for (size_t i = 0; idx < 0 && i < in->c.n_models; i++)
        if (strcmp(in->c.cfg->models[i].name, j->req.model) == 0) idx = (int)i;
    if (idx < 0) {
        job_fail(j, PROTO_ERR_UNKNOWN_MODEL, "no model named '%s' on this worker",
                 j->req.model);
        answer_now(in, j);
        return INTAKE_ANSWERED;
    }
    j->model_idx = idx;
    j->model_name = in->c.cfg->models[idx].name;
    const struct genmodel *gm = in->c.gens ? in->c.gens[idx] : NULL;
    const struct model_encoder_info *enc = gm ? NULL : model_encoder(in->c.models[idx]);
    size_t rows;
    if (gm || j->req.gen) {
        int g = genadmit(gm, &in->gen_scratch, cfg, in->c.max_record_bytes, j);
        if (g == -2) LOG_E("out_of_memory", "where=genadmit id=%s", j->req.id);
        if (g == -2) atomic_store(in->c.fatal, 1);
        if (g < 0) {
            answer_now(in, j);
            return INTAKE_ANSWERED;
        }
        rows = j->weight;
    } else if (enc) {
        if (tokenize(in, j, enc) < 0) return INTAKE_ANSWERED;
        rows = j->rows;
    } else {
        if (j->req.n_text || j->req.n_token_rows) {
            job_fail(j, PROTO_ERR_INVALID_INPUT, "model %s takes input (float32 rows), not "
                     "text or tokens", j->model_name);
            answer_now(in, j);
            return INTAKE_ANSWERED;
        }
        size_t width = model_input_width(in->c.models[idx]);
        if (j->req.n_input % width != 0) {
            job_fail(j, PROTO_ERR_INVALID_INPUT,
                     "field input: %zu values is not a multiple of the model's "
                     "input width %zu", j->req.n_input, width);
            answer_now(in, j);
            return INTAKE_ANSWERED;
        }
        rows = j->req.n_input / width;
        if (rows > in->max_job_rows) {
            job_fail(j, PROTO_ERR_INVALID_INPUT,
                     "field input: %zu rows exceeds batching.max_job_rows %zu", rows,
                     in->max_job_rows);
            answer_now(in, j);
            return INTAKE_ANSWERED;
        }
    }
    if (!gm && result_fits(in, j, in->c.models[idx], rows) < 0) return INTAKE_ANSWERED;
    /* The configured default timeout bounds every job; a job's own
     * deadline may only make it earlier. */
    int64_t now_ms = clock_wall_ms();
    j->deadline_ms = opts->ignore_deadlines ? 0
                     : job_effective_deadline_ms(j->req.deadline_ms, j->record_ts_ms,
                                                 cfg->batching.default_timeout_ms);
    if (j->deadline_ms && j->deadline_ms <= now_ms) {
        job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED, "deadline passed before the job was queued");
        answer_now(in, j);
        return INTAKE_ANSWERED;
    }
    if (j->deadline_ms) j->deadline_us = job_deadline_us(j->deadline_ms, now_ms, j->arrived_us);
    j->rows = rows;
    j->weight = rows;
    in->inflight_rows += rows;
    j->priority = opts->priority >= 0 ? opts->priority : j->req.priority;
    if (j->priority < 0) j->priority = cfg_topic_priority(cfg, j->topic);
    if (j->deadline_us && j->deadline_us < in->next_deadline_us)
        in->next_deadline_us = j->deadline_us;
    if (gm) genexec_push(in->c.genexec, j);
    else batcher_push(in->c.batcher, j);
    return INTAKE_QUEUED;
}

/* A consumed message as admission reads it: its bytes, where it came
 * from, its timestamp and content-type header. */
static void take_record(struct intake *in, const rd_kafka_message_t *m)
{
    char ctbuf[64];
    rd_kafka_timestamp_type_t tstype;
    struct intake_record r = {
        .topic = rd_kafka_topic_name(m->rkt),
        .partition = m->partition,
        .offset = m->offset,
        .key = m->key,
        .key_len = m->key_len,
        .value = m->payload,
        .value_len = m->len,
        .content_type = kq_header_string(m, "content-type", ctbuf, sizeof(ctbuf)),
        .timestamp_ms = rd_kafka_message_timestamp(m, &tstype),
    };
    intake_admit(in, &r);
}

/* The expiry timer: answers deadline_exceeded for every queued job whose
 * deadline has passed (they never run) and moves the timer to the
 * earliest deadline still queued. */
static void expire(struct intake *in, int64_t now)
{
    struct job *j = batcher_expire(in->c.batcher, now, &in->next_deadline_us);
    while (j) {
        struct job *following = j->next;
        j->next = NULL;
        j->queued_ms = (double)(now - j->arrived_us) / 1000.0;
        job_fail(j, PROTO_ERR_DEADLINE_EXCEEDED, "deadline passed after %.1f ms in the queue",
                 j->queued_ms);
        answer_now(in, j);
        j = following;
    }
}

/* Pauses or resumes every assigned partition around the high and low
 * marks, so the backlog stays in Kafka and memory stays bounded. A full
 * queue first only holds: no record is taken (librdkafka keeps its
 * prefetch, within queued.max.messages.kbytes) until there is room again,
 * which needs no fetch to restart; only a queue full for
 * batching.pause_after_ms pauses. Pausing drops the prefetch and costs a
 * fetch restart at the resume, once per cycle: with a queue of a few jobs
 * that was a restart per job (docs/batching.md, "A small queue and big
 * jobs"). Returns 1 while holding: the round must take no record. */
static int backpressure(struct intake *in)
{
    /* High marks: the queue holds max_queued_rows, or everything taken in
     * reaches twice that plus a full batch per in-flight slot. A batch is
     * as large as its largest job when that one is larger than
     * max_batch_rows (it runs alone). The second half is for results
     * awaiting their acknowledgements, which weigh their result's bytes
     * (exec.h, `lightened`): with librdkafka's linger.ms (5) each waits
     * milliseconds, and a bound with no room for them capped a small
     * queue's throughput at what fits in flight per linger (docs/batching.md,
     * "A small queue and big jobs"). */
    const struct kcfg *c = in->c.cfg;
    size_t batch = (size_t)(c->batching.max_job_rows > c->batching.max_batch_rows
                                ? c->batching.max_job_rows : c->batching.max_batch_rows);
    size_t one = (size_t)c->batching.max_queued_rows +
                 (size_t)c->batching.max_inflight_batches * batch;
    struct flow_marks marks = {.queued_high = (size_t)c->batching.max_queued_rows,
                               .taken_high = 2 * one};
    size_t queued = batcher_queued_rows(in->c.batcher);
    int want = in->draining || flow_should_pause(&marks, in->paused, queued, in->inflight_rows);
    if (!want) {
        in->full_since_us = 0;
    } else if (!in->paused && !in->draining) {
        int64_t now = clock_mono_us();
        if (!in->full_since_us) in->full_since_us = now;
        if (now - in->full_since_us < (int64_t)c->batching.pause_after_ms * 1000) return 1;
    }
    if (want == in->paused) return 0;
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(in->consumer, &a) != RD_KAFKA_RESP_ERR_NO_ERROR) return 0;
    if (in->c.ranges) ranges_keep_unfinished(in->c.ranges, a); /* the others stay paused */
    if (want) {
        rd_kafka_pause_partitions(in->consumer, a);
    } else {
        rd_kafka_resume_partitions(in->consumer, a);
        if (c->kafka.resume_seek) offsets_restart_fetch(in->c.offsets, in->consumer, a);
    }
    LOG_D(want ? "paused" : "resumed", "partitions=%d queued_rows=%zu inflight_rows=%zu",
          a->cnt, queued, in->inflight_rows);
    rd_kafka_topic_partition_list_destroy(a);
    in->paused = want;
    in->full_since_us = 0;
    return 0;
}

/* Partitions are being taken away. Queued jobs of theirs are dropped (the
 * next owner reads them again from the committed offset); jobs already
 * running get revoke_timeout_ms to finish; then the offsets are committed
 * synchronously (docs/reliability.md, rule 5). On a lost assignment
 * nothing is committed: another member may own the partitions already. */
static void on_revoke(struct intake *in, rd_kafka_topic_partition_list_t *parts, int lost)
{
    size_t *purged = calloc((size_t)parts->cnt + 1, sizeof(size_t));
    for (int i = 0; i < parts->cnt; i++) {
        struct job *j = batcher_purge(in->c.batcher, parts->elems[i].topic,
                                      parts->elems[i].partition);
        for (struct job *k = j; k && purged; k = k->next) purged[i]++;
        release(in, j, 0);
    }
    if (!lost) {
        /* Once the executors and sink have stopped (the close at the end of
         * a drain) nothing more can finish: don't wait for it. */
        int64_t budget_ms = in->pipeline_stopped ? 0 : in->c.cfg->kafka.revoke_timeout_ms;
        if (in->close_by_us && budget_ms > (in->close_by_us - clock_mono_us()) / 1000)
            budget_ms = (in->close_by_us - clock_mono_us()) / 1000;
        if (budget_ms < 0) budget_ms = 0;
        int64_t give_up = clock_mono_us() + budget_ms * 1000;
        for (;;) {
            intake_collect(in);
            int busy = 0;
            for (int i = 0; i < parts->cnt && !busy; i++)
                busy = offsets_pending(in->c.offsets, parts->elems[i].topic,
                                       parts->elems[i].partition) > (purged ? purged[i] : 0);
            if (!busy) break;
            if (clock_mono_us() >= give_up) {
                if (budget_ms)
                    LOG_W("revoke_timeout", "partitions=%d timeout_ms=%d", parts->cnt,
                          in->c.cfg->kafka.revoke_timeout_ms);
                break;
            }
            stats_alive(in->c.stats, STATS_LOOP_POLL);
            sleep_ms(2);
        }
        if (in->close_by_us) offsets_commit_by(in->consumer, "revoke", in->close_by_us);
        else offsets_commit(in->consumer, "revoke");
    }
    for (int i = 0; i < parts->cnt; i++)
        offsets_drop(in->c.offsets, parts->elems[i].topic, parts->elems[i].partition);
    free(purged);
    LOG_I(lost ? "partitions_lost" : "partitions_revoked", "count=%d", parts->cnt);
}

/* Unassigns what was revoked (or everything, with an eager assignor). */
static void unassign(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts, int coop)
{
    if (coop) {
        rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
        if (e) rd_kafka_error_destroy(e);
    } else {
        rd_kafka_assign(rk, NULL);
    }
}

/* While closing, this asks librdkafka nothing it can do without: each
 * query (protocol, assignment) waits on the group's thread without a
 * bound. The protocol is the last one seen, the revoke's count is known. */
static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    struct intake *in = opaque;
    int coop = in->close_by_us ? in->coop
                               : strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    in->coop = coop;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        rd_kafka_error_t *e = NULL;
        if (coop) e = rd_kafka_incremental_assign(rk, parts);
        else rd_kafka_assign(rk, parts);
        if (e) {
            LOG_E("assign_failed", "error=\"%s\"", rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
        /* librdkafka keeps a partition's application pause through revoke
         * and re-assign: a partition paused by backpressure before a
         * rebalance would stay paused for good unless resumed here. */
        if (in->paused) rd_kafka_pause_partitions(rk, parts);
        else rd_kafka_resume_partitions(rk, parts);
        LOG_I("partitions_assigned", "count=%d protocol=%s", parts->cnt,
              coop ? "cooperative" : "eager");
    } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        on_revoke(in, parts, rd_kafka_assignment_lost(rk));
        unassign(rk, parts, coop);
    } else {
        /* Treated as a lost assignment: commit nothing, let everything go. */
        LOG_E("rebalance_error", "error=\"%s\"", rd_kafka_err2str(err));
        on_revoke(in, parts, 1);
        unassign(rk, parts, coop);
    }
    if (in->close_by_us && err != RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        in->n_assigned = coop && in->n_assigned > parts->cnt ? in->n_assigned - parts->cnt : 0;
        return;
    }
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(rk, &a) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        in->n_assigned = a->cnt;
        rd_kafka_topic_partition_list_destroy(a);
    }
}

/* The rate cap (replay's --rate): a token bucket holding at most a
 * second's worth. Returns 1 if a record may be taken now. */
static int take_allowed(struct intake *in, int64_t now)
{
    double rate = in->c.opts->rate;
    if (rate <= 0) return 1;
    in->tokens += (double)(now - in->tokens_at_us) / 1e6 * rate;
    in->tokens_at_us = now;
    if (in->tokens > rate) in->tokens = rate;
    if (in->tokens < -1) in->tokens = -1;
    return in->tokens >= 1;
}

void intake_poll(struct intake *in)
{
    intake_collect(in);
    int64_t now = clock_mono_us();
    if (in->next_deadline_us <= now) expire(in, now);
    if (backpressure(in)) {
        /* Full, holding: room comes as executors take batches and the
         * sink finishes jobs, often within the millisecond. */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        return;
    }
    if (!take_allowed(in, now)) {
        sleep_ms(1);
        return;
    }
    /* Poll no longer than until the next queued deadline: the expiry
     * timer of jobs waiting in the queue, executors busy or not. */
    int64_t wait_us = in->next_deadline_us - now;
    int wait_ms = wait_us >= 20000 ? 20 : wait_us <= 0 ? 0 : (int)((wait_us + 999) / 1000);
    rd_kafka_message_t *m = rd_kafka_consumer_poll(in->consumer, wait_ms);
    if (!m) return;
    if (m->err) {
        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            LOG_W("consume_error", "error=\"%s\"", rd_kafka_message_errstr(m));
    } else if (!in->c.ranges || ranges_admit(in->c.ranges, in->consumer, m)) {
        take_record(in, m);
        in->tokens -= 1;
    }
    rd_kafka_message_destroy(m);
}

size_t intake_drain(struct intake *in, int timeout_ms)
{
    in->draining = 1;
    backpressure(in);
    batcher_close(in->c.batcher);
    int64_t give_up = clock_mono_us() + (int64_t)timeout_ms * 1000;
    size_t left;
    while ((left = offsets_pending_total(in->c.offsets)) > 0 && clock_mono_us() < give_up &&
           !atomic_load(in->c.fatal)) {
        /* Keep serving the group (and rebalances) while draining; records
         * still buffered for paused partitions are not taken. */
        stats_alive(in->c.stats, STATS_LOOP_POLL);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(in->consumer, 5);
        if (m) rd_kafka_message_destroy(m);
        intake_collect(in);
    }
    return left;
}

size_t intake_pending(const struct intake *in)
{
    return offsets_pending_total(in->c.offsets);
}

void intake_pipeline_stopped(struct intake *in)
{
    in->pipeline_stopped = 1;
}

int intake_ranges_done(struct intake *in)
{
    return in->c.ranges && ranges_finished(in->c.ranges, in->consumer, in->c.offsets);
}

/* Admission's state: the widest model's row sets the codec's input bound
 * and what a dead letter's bytes count for; encoders get the tokenizer's
 * buffers. */
struct intake *intake_new_offline(const struct intake_conf *c, char *errstr, size_t errstr_size)
{
    struct intake *in = calloc(1, sizeof(*in));
    if (!in) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    in->c = *c;
    in->kq.stats = c->stats;
    in->kq.fatal = c->fatal;
    in->next_deadline_us = INT64_MAX;
    in->tokens_at_us = clock_mono_us();
    in->max_job_rows = (size_t)c->cfg->batching.max_job_rows;
    size_t max_in = 0, max_tok = 0;
    for (size_t i = 0; i < c->n_models; i++) {
        if (!c->models[i]) continue; /* a generator */
        const struct model_encoder_info *e = model_encoder(c->models[i]);
        if (model_input_width(c->models[i]) > max_in) max_in = model_input_width(c->models[i]);
        if (e && e->max_tokens > max_tok) max_tok = e->max_tokens;
    }
    in->lim.max_payload_bytes = (size_t)c->cfg->worker.max_payload_bytes;
    in->lim.max_input_floats = in->max_job_rows * max_in;
    /* Only generators: an `input` job decodes (the payload bounds it) so
     * that admission can say the model generates text. */
    if (!max_in && !max_tok && c->gens)
        in->lim.max_input_floats = (size_t)c->cfg->worker.max_payload_bytes / 4;
    in->lim.max_depth = 32;
    in->lim.max_rows = in->max_job_rows;
    in->lim.max_text_chars = (size_t)c->cfg->worker.max_text_chars;
    in->tok_cap = (size_t)c->cfg->batching.max_batch_tokens;
    /* Pre-tokenized rows may be longer than the model takes (truncate cuts
     * them); beyond that, what could never fit a batch is refused early. */
    in->lim.max_tokens = in->tok_cap + in->max_job_rows * max_tok;
    /* A row's bytes: the widest float row, or an encoder's longest row of
     * ids; what a dead letter's bytes count for against the in-flight bound. */
    in->row_bytes = max_in * sizeof(float) > max_tok * sizeof(int32_t)
                        ? max_in * sizeof(float)
                        : max_tok * sizeof(int32_t);
    if (in->row_bytes == 0) in->row_bytes = 1;
    if (max_tok) {
        in->tok_scratch = tokenizer_scratch_new(4096);
        in->tok_ids = malloc(in->tok_cap * sizeof(*in->tok_ids));
        in->tok_types = malloc(in->tok_cap * sizeof(*in->tok_types));
        if (!in->tok_scratch || !in->tok_ids || !in->tok_types) {
            snprintf(errstr, errstr_size, "out of memory for the tokenizer's buffers");
            intake_destroy(in);
            return NULL;
        }
    }
    return in;
}

/* Admission's state, then the consumer joins the group, or, with ranges,
 * takes its partitions directly (no live group is joined or
 * rebalanced). */
struct intake *intake_new(const struct intake_conf *c, char *errstr, size_t errstr_size)
{
    struct intake *in = intake_new_offline(c, errstr, errstr_size);
    if (!in) return NULL;
    struct kq_hooks h = {.opaque = in, .group = c->opts->group, .rebalance_cb = rebalance_cb};
    if (!(in->consumer = kq_client_new(c->cfg, KQ_CONSUMER, &h, errstr, errstr_size))) {
        intake_destroy(in);
        return NULL;
    }
    rd_kafka_poll_set_consumer(in->consumer);
    rd_kafka_resp_err_t err;
    if (c->ranges) {
        rd_kafka_topic_partition_list_t *l = ranges_assignment(c->ranges);
        err = rd_kafka_assign(in->consumer, l);
        rd_kafka_topic_partition_list_destroy(l);
    } else {
        rd_kafka_topic_partition_list_t *topics =
            rd_kafka_topic_partition_list_new((int)c->cfg->kafka.n_topics);
        for (size_t i = 0; i < c->cfg->kafka.n_topics; i++)
            rd_kafka_topic_partition_list_add(topics, c->cfg->kafka.topics[i],
                                              RD_KAFKA_PARTITION_UA);
        err = rd_kafka_subscribe(in->consumer, topics);
        rd_kafka_topic_partition_list_destroy(topics);
    }
    if (err) {
        snprintf(errstr, errstr_size, "%s: %s", c->ranges ? "assign" : "subscribe",
                 rd_kafka_err2str(err));
        intake_destroy(in);
        return NULL;
    }
    return in;
}

/* Not rd_kafka_consumer_close, which waits for the group without a
 * bound (kq.h). */
int intake_close(struct intake *in, int64_t deadline_us)
{
    in->close_by_us = deadline_us > 0 ? deadline_us : 1;
    offsets_commit_by(in->consumer, "shutdown", in->close_by_us);
    char err[256];
    int rc = kq_consumer_close_by(in->consumer, in->close_by_us, rebalance_cb, in, err,
                                  sizeof(err));
    in->closed = rc == 1;
    if (rc < 0) LOG_W("consumer_close_failed", "error=\"%s\"", err);
    else if (!in->closed)
        LOG_W("consumer_close_timeout", "note=\"the group did not wind down in time (its "
              "coordinator slow or away): leaving it to the session timeout; what was not "
              "committed runs again\"");
    return in->closed ? 0 : -1;
}

void intake_destroy(struct intake *in)
{
    if (!in) return;
    if (in->close_by_us && !in->closed) {
        /* A consumer whose close did not finish is left to the process's
         * exit (kq.h). Nothing polls it, so only its log callback runs
         * again, and that one touches no stats once they are cleared. */
        in->kq.stats = NULL;
        return;
    }
    if (in->consumer) rd_kafka_destroy(in->consumer);
    tokenizer_scratch_destroy(in->tok_scratch);
    tokenizer_scratch_destroy(in->gen_scratch);
    free(in->tok_ids);
    free(in->tok_types);
    free(in);
}

size_t intake_inflight_rows(const struct intake *in)
{
    return in->inflight_rows;
}

int intake_assigned(const struct intake *in)
{
    return in->n_assigned;
}

/* The group coordinator gave this consumer a member id: it has joined,
 * seconds before its first statistics say so. */
int intake_has_member(struct intake *in)
{
    char *id = rd_kafka_memberid(in->consumer);
    int joined = id && *id;
    if (id) rd_kafka_mem_free(in->consumer, id);
    return joined;
}

int intake_paused(const struct intake *in)
{
    return in->paused;
}

/* job.h - the pipeline's record of one job: the request as the codec
 * decoded it, where its record came from, how it is routed, what came of
 * it, and the sink's bookkeeping. A job has exactly one owner at a time as
 * it moves intake -> batcher -> executor -> sink -> offsets (see
 * docs/architecture.md); every pointer field is owned by the job and freed
 * by job_free(). Nothing here points into a Kafka message or a parser's
 * memory.
 *
 * Threads: whichever thread owns the job. */
#ifndef KINFER_JOB_H
#define KINFER_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "../codecs/codec.h"
#include "../telemetry/stats.h"

/* What the sink does with the job. */
enum job_kind {
    JOB_RESULT = 0, /* publish `body` to the reply topic and Redis */
    JOB_DEAD = 1,   /* publish `raw_key`/`raw_value` to the dead-letter topic;
                       with `body` set (its key a usable id) the error result
                       too, to the reply topic and Redis */
};

struct job {
    enum job_kind kind;
    struct codec_request req;      /* as decoded; req.err is the decoder's verdict */

    /* --- source record (intake) --- */
    char topic[PROTO_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t record_ts_ms;          /* Kafka record timestamp, Unix ms */
    int64_t arrived_us;            /* monotonic clock when polled */

    /* --- routing (intake) --- */
    int model_idx;                 /* index into the worker's models, -1 if none */
    size_t rows;                   /* n_input / the model's input width */
    size_t weight;                 /* what it counts against the worker's
                                      in-flight bound, in rows (a dead letter
                                      by its bytes) */
    int priority;                  /* effective 0..9: the job's own, else its
                                      topic's or the default; -1 until set */
    int64_t deadline_ms;           /* effective absolute Unix ms; 0 = none */
    int64_t deadline_us;           /* deadline_ms on the monotonic clock; 0 = none */

    /* --- an encoder's rows, tokenized (intake); NULL/0 for a layer model --- */
    int32_t *ids;                  /* every row's token ids, one after another, owned */
    int32_t *type_ids;             /* as ids, owned; NULL = all 0 */
    uint32_t *offs;                /* rows + 1 offsets into ids, owned */
    size_t n_tokens;               /* offs[rows] */
    size_t seq_len;                /* its longest row, tokens; 0 = not an encoder job */
    int picked;                    /* the batcher's mark while it cuts a batch */

    /* --- a generation job (intake, generator); 0 otherwise: its prompt's
     * ids are ids[0..n_tokens) (req.gen holds its parameters) --- */
    size_t gen_max_tokens;         /* > 0: a generation job, this many tokens at most */
    int gen_stream_ok;             /* streaming: Redis still takes its entries */
    const struct codec_gen_result *gen_res; /* borrowed while job_encode runs */

    /* --- outcome (executor, or intake for early errors) --- */
    enum proto_err err;
    char errmsg[PROTO_ERRMSG_MAX];
    const char *model_name;        /* borrowed from the model; NULL: req.model */
    float *output;                 /* out_rows x out_width float32, owned */
    size_t out_rows, out_width;
    double queued_ms, infer_ms;
    size_t batch_rows;
    size_t out_tokens;             /* per-token output: tokens per row (padded) */
    const char **labels;           /* a classifier's best label per row (names
                                      borrowed from the model; the array owned) */
    size_t padded_tokens;          /* tokens the forward pass computed for it */

    /* --- what the sink publishes --- */
    unsigned char *body;           /* encoded result (JOB_RESULT), owned */
    size_t body_len;
    unsigned char *raw_key;        /* original record key (JOB_DEAD), owned */
    size_t raw_key_len;
    unsigned char *raw_value;      /* original record value (JOB_DEAD), owned */
    size_t raw_value_len;
    size_t truncated_from;         /* raw_value was cut from this many bytes; 0 = whole */

    /* --- sink bookkeeping --- */
    int acks_pending;              /* reply/DLQ delivery + Redis SET still owed */
    int produce_attempts;
    unsigned owed;                 /* records not yet delivered: SINK_REC_* bits */
    unsigned sent;                 /* of those, handed to the producer */
    int on_retry;                  /* on the sink's retry list */
    int stranded;                  /* sink gave up on it at stop: never done */
    int batch_last;                /* last job of an executor batch */
    struct job *stranded_next;     /* sink's list of jobs given up at stop */

    struct job *next;              /* intrusive list link, owned by whoever holds the job */
};

/* Returns a new zeroed job with model_idx = -1 and priority = -1, or NULL. */
struct job *job_new(void);

/* Frees the job and everything it owns. Accepts NULL. */
void job_free(struct job *j);

/* Frees a list of jobs linked through ->next. Accepts NULL. */
void job_free_list(struct job *j);

/* Marks the job failed with a code and a printf-style message. */
void job_fail(struct job *j, enum proto_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The effective deadline of a job, Unix ms, 0 = none: the job's own
 * (own_ms, 0 = none) or record_ts_ms + default_timeout_ms (0 = no default;
 * a record without a timestamp counts from 0), whichever is earlier. Any
 * inputs are safe: sums saturate at INT64_MAX instead of wrapping. */
int64_t job_effective_deadline_ms(int64_t own_ms, int64_t record_ts_ms,
                                  int64_t default_timeout_ms);

/* A deadline on the monotonic clock far beyond any real one (about 146,000
 * years of uptime): where every later deadline is capped. */
#define JOB_DEADLINE_FAR_US (INT64_MAX / 2)

/* deadline_ms (Unix ms) moved onto the monotonic clock, given the two
 * clocks' readings now: now_us when it has passed, else at most
 * JOB_DEADLINE_FAR_US. Never overflows, whatever deadline_ms is. */
int64_t job_deadline_us(int64_t deadline_ms, int64_t now_ms, int64_t now_us);

/* Encodes the job's result into j->body (replacing any) in the encoding
 * the job came in, with total_ms from its record timestamp to now_ms.
 * Returns 0, or -1 when out of memory (j->body is then NULL). */
int job_encode(struct job *j, int64_t now_ms);

/* Counts a finished job (both acknowledgements in) in st: kind and err
 * give the status and code; queue and inference times when it ran
 * (batch_rows > 0); end to end from record_ts_ms to now_ms (Unix ms) unless
 * dead-lettered. Borrows j and st. */
void job_report(const struct job *j, struct stats *st, int64_t now_ms);

#endif

/* job.h - one job as plain data. A job has exactly one owner at a time as
 * it moves poll thread -> batcher -> executor -> sink; every pointer field
 * below is owned by the job and freed by job_free(). Nothing here points
 * into a Kafka message or a msgpack zone. */
#ifndef KINFER_JOB_H
#define KINFER_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

/* What the sink does with the job. */
enum job_kind {
    JOB_RESULT = 0, /* publish `body` to the reply topic and Redis */
    JOB_DEAD = 1,   /* publish `raw_key`/`raw_value` to the dead-letter topic */
};

struct job {
    enum job_kind kind;

    /* --- request (codec_decode_job) --- */
    char id[PROTO_ID_MAX + 1];
    char model[PROTO_MODEL_MAX + 1]; /* "" = the worker's default model */
    enum proto_enc enc;              /* the result is encoded the same way */
    float *input;                  /* n_input float32 values, owned */
    size_t n_input;
    int64_t deadline_ms;           /* absolute Unix ms; 0 = none */
    int priority;                  /* 0..9, or -1 when the job gave none */
    unsigned char *meta;           /* `meta` re-encoded in `enc`, owned; NULL = none */
    size_t meta_len;

    /* --- source record (poll thread) --- */
    char topic[PROTO_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t record_ts_ms;          /* Kafka record timestamp, Unix ms */
    int64_t arrived_us;            /* monotonic clock when polled */
    int64_t deadline_us;           /* deadline_ms on the monotonic clock; 0 = none */

    /* --- routing (poll thread) --- */
    int model_idx;                 /* index into the worker's models, -1 if none */
    size_t rows;                   /* n_input / the model's input width */
    size_t weight;                 /* what it counts against the worker's
                                      in-flight bound, in rows (a dead letter
                                      by its bytes); set by the poll thread */

    /* --- outcome (executor, or poll thread for early errors) --- */
    enum proto_err err;
    char errmsg[PROTO_ERRMSG_MAX];
    const char *model_name;        /* borrowed from the model; NULL: use `model` */
    float *output;                 /* out_rows x out_width float32, owned */
    size_t out_rows, out_width;
    double queued_ms, infer_ms;
    size_t batch_rows;

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
    int stranded;                  /* sink gave up on it at stop: never done */
    int batch_last;                /* last job of an executor batch */
    struct job *stranded_next;     /* sink's list of jobs given up at stop */

    struct job *next;              /* intrusive list link, owned by whoever holds the job */
};

/* Returns a new zeroed job with model_idx = -1 and priority = -1, or NULL. */
struct job *job_new(void);

/* Frees the job and everything it owns. Accepts NULL. */
void job_free(struct job *j);

/* Marks the job failed with a code and a printf-style message. */
void job_fail(struct job *j, enum proto_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

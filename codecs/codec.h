/* codec.h - the wire contract of docs/protocol.md:
 * decode a job record (MessagePack or JSON, told apart by the first byte),
 * encode its result in the same encoding.
 *
 * Threads: any; no shared state. Untrusted input is bounded before any
 * library allocates from it (msgpack pre-scan, payload cap). */
#ifndef KINFER_CODEC_H
#define KINFER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "job.h"

struct codec_limits {
    size_t max_payload_bytes; /* records longer than this are not parsed */
    size_t max_input_floats;  /* `input` longer than this is invalid_input */
    int max_depth;            /* deepest nesting accepted anywhere (meta included) */
};

/* Outcome of codec_decode_job. */
enum codec_rc {
    CODEC_JOB = 0,  /* job filled; job->err may be set (e.g. invalid_input)
                       and then the job is answered with that error */
    CODEC_DEAD = 1, /* no decodable job with a usable id: dead-letter it;
                       errstr says why */
};

/* Decodes one record value into job (fields id, model, enc, input,
 * n_input, deadline_ms, priority, meta, err, errmsg). key/key_len is the
 * record key (may be NULL): the id falls back to it. content_type is the
 * record's content-type header or NULL. record_ts_ms turns timeout_ms into
 * an absolute deadline (the earlier of deadline_ms and ts + timeout_ms).
 * Borrows every input; the job owns copies of what it keeps. */
enum codec_rc codec_decode_job(const void *value, size_t len, const void *key,
                               size_t key_len, const char *content_type,
                               int64_t record_ts_ms,
                               const struct codec_limits *lim, struct job *job,
                               char *errstr, size_t errstr_size);

/* Encodes the result of job into job->body/body_len (replacing any), in
 * job->enc: id, model (job->model_name, else job->model), status,
 * output+shape when job->err == PROTO_OK, error {code,message} otherwise,
 * meta (raw, as decoded), timing {queued_ms, infer_ms, total_ms,
 * batch_rows}, source {topic, partition, offset}. total_ms is now_ms minus
 * job->record_ts_ms. Returns 0 or -1 on allocation failure. */
int codec_encode_result(struct job *job, int64_t now_ms);

/* The content-type header value for an encoding. */
const char *codec_content_type(enum proto_enc enc);

#endif

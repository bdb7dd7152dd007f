/* codec.h - the worker's side of the wire contract of docs/protocol.md:
 * decode a job record (MessagePack or JSON, told apart by the first byte),
 * encode its result in the same encoding.
 *
 * Threads: any; no shared state. Untrusted input is bounded before any
 * library allocates from it (msgpack pre-scan, payload cap). */
#ifndef KINFER_CODEC_H
#define KINFER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

struct codec_limits {
    size_t max_payload_bytes; /* records longer than this are not parsed */
    size_t max_input_floats;  /* `input` longer than this is invalid_input */
    int max_depth;            /* deepest nesting accepted anywhere (meta included) */
    size_t max_rows;          /* rows of text or tokens in one job */
    size_t max_text_chars;    /* characters (code points) in one text row */
    size_t max_tokens;        /* token ids in one job, all rows together */
};

/* A generation job's fields (docs/protocol.md, "Generation jobs", v1.2),
 * decoded and range-checked. Plain data, owned by its request: every
 * pointer is freed by codec_request_fini. Strings are valid UTF-8. */
#define CODEC_GEN_MAX_STOPS 8
enum codec_role { CODEC_ROLE_SYSTEM = 0, CODEC_ROLE_USER, CODEC_ROLE_ASSISTANT, CODEC_ROLE_TOOL };
struct codec_gen {
    char *prompt;                    /* NUL-terminated; NULL when messages are given */
    size_t prompt_len;
    size_t n_msgs;                   /* messages; 0 with a prompt */
    unsigned char *roles;            /* n_msgs enum codec_role */
    char *content;                   /* the messages' contents, one after another */
    size_t *content_off;             /* n_msgs + 1 offsets into content */
    size_t max_tokens;               /* >= 1; 0 = the model's default */
    float temperature;               /* >= 0; -1 = the model's default */
    uint32_t top_k;                  /* 0 = off */
    float top_p;                     /* (0, 1]; 1 = off */
    float min_p;                     /* [0, 1); 0 = off */
    uint64_t seed;                   /* 0 when the job gave none */
    char *stop[CODEC_GEN_MAX_STOPS]; /* NUL-terminated, not empty, owned */
    size_t n_stop;
    int logprobs, stream;            /* booleans */
};

/* "system", "user", "assistant", "tool". */
const char *codec_role_name(enum codec_role r);

/* A job as its record carries it in, decoded and validated. Plain data:
 * input and meta are owned (codec_request_fini frees them); nothing points
 * into the record or a parser's memory. */
struct codec_request {
    char id[PROTO_ID_MAX + 1];
    char model[PROTO_MODEL_MAX + 1]; /* "" = the worker's default model */
    enum proto_enc enc;              /* the result goes back the same way */
    float *input;                    /* n_input float32 values, owned */
    size_t n_input;
    int64_t deadline_ms;             /* absolute Unix ms (deadline_ms and
                                        timeout_ms combined); 0 = none */
    int priority;                    /* 0..9, or -1 when the job gave none */
    unsigned char *meta;             /* `meta` re-encoded in enc, owned; NULL = none */
    size_t meta_len;
    /* An encoder's rows (docs/protocol.md v1.1), instead of input: text
     * (with an optional second segment per row), or token ids. Owned. */
    size_t n_text;                   /* rows of text; 0 = none */
    char *text;                      /* the rows' bytes, one after another (as sent:
                                        UTF-8 is checked by the tokenizer) */
    size_t *text_off;                /* n_text + 1 offsets into text */
    char *pair;                      /* text_pair's rows alike; NULL = no pairs */
    size_t *pair_off;
    size_t n_token_rows;             /* rows of token ids; 0 = none */
    int32_t *tokens;                 /* every row's ids, one after another */
    size_t *token_off;               /* n_token_rows + 1 offsets into tokens */
    int32_t *type_ids;               /* as tokens; NULL = all 0 */
    int truncate;                    /* 1 (the default): cut rows to the model's
                                        length; 0: too long is invalid_input */
    struct codec_gen *gen;           /* a generation job's fields, owned; NULL: not one */
    /* The decoder's verdict on a job it could decode: PROTO_OK, or the
     * error the job is to be answered with (invalid_input, ...). */
    enum proto_err err;
    char errmsg[PROTO_ERRMSG_MAX];
};

/* Frees what r owns and zeroes those fields (not r). Accepts NULL. */
void codec_request_fini(struct codec_request *r);
/* Frees only r's rows of text and tokens (once tokenized, they are not
 * needed any more). */
void codec_request_fini_rows(struct codec_request *r);

/* A generation job's result (views, borrowed for the encode call). */
struct codec_gen_result {
    const char *text;                /* valid UTF-8 */
    size_t text_len;
    const int32_t *tokens;
    size_t n_tokens;
    const char *finish_reason;       /* "eos", "stop", "length", "deadline" */
    size_t prompt_tokens, completion_tokens;
    const float *logprobs;           /* n_tokens values, or NULL when not asked */
    double ttft_ms, decode_tokens_per_s;
};

/* A result to encode: views of what its owner holds, borrowed for the
 * call. */
struct codec_result {
    const char *id;
    const char *model;               /* the model that ran, or was asked for */
    enum proto_enc enc;
    enum proto_err err;              /* PROTO_OK: output and shape; else error */
    const char *errmsg;
    const float *output;             /* out_rows x out_width floats when ok */
    size_t out_rows, out_width;
    const unsigned char *meta;       /* as codec_request has it; NULL = none */
    size_t meta_len;
    double queued_ms, infer_ms, total_ms;
    size_t batch_rows;
    /* An encoder's (all 0/NULL for a layer model's job): */
    size_t out_tokens;               /* > 0: per-token output, out_rows x out_tokens x
                                        out_width, each row padded with zeros after
                                        its own length */
    const size_t *lengths;           /* per-token output: each row's tokens */
    const char *const *labels;       /* a classifier's best label per row (then the
                                        output is also written as `scores`) */
    size_t tokens, padded_tokens;    /* timing; written when tokens > 0 */
    const char *topic;               /* the job's record */
    int32_t partition;
    int64_t offset;
    /* A generation job's (ok results only): text, tokens, finish_reason,
     * usage, logprobs instead of output and shape; timing gains ttft_ms
     * and decode_tokens_per_s. NULL: not a generation job. */
    const struct codec_gen_result *gen;
};

/* Outcome of codec_decode_job. */
enum codec_rc {
    CODEC_JOB = 0,  /* req filled; req->err may be set (e.g. invalid_input)
                       and then the job is answered with that error */
    CODEC_DEAD = 1, /* no decodable job with a usable id: dead-letter it;
                       errstr says why, and req owns nothing */
};

/* Decodes one record value into req (which it resets first, freeing what
 * it owned). key/key_len is the record key (may be NULL): the id falls
 * back to it. content_type is the record's content-type header or NULL.
 * record_ts_ms turns timeout_ms into an absolute deadline (the earlier of
 * deadline_ms and ts + timeout_ms). Borrows every input; req owns copies
 * of what it keeps. */
enum codec_rc codec_decode_job(const void *value, size_t len, const void *key,
                               size_t key_len, const char *content_type,
                               int64_t record_ts_ms, const struct codec_limits *lim,
                               struct codec_request *req, char *errstr, size_t errstr_size);

/* Encodes r in r->enc into a new buffer (*body, *body_len; caller frees):
 * id, model, status, output+shape when r->err == PROTO_OK (and for an
 * encoder lengths, or scores+labels), error {code,message} otherwise,
 * meta (raw, as decoded), timing {queued_ms, infer_ms, total_ms,
 * batch_rows, and tokens, padded_tokens for an encoder}, source {topic,
 * partition, offset}.
 * Returns 0, or -1 on allocation failure (*body untouched). Borrows r. */
int codec_encode_result(const struct codec_result *r, unsigned char **body, size_t *body_len);

/* The most bytes one output float takes in a JSON result: "-1.17549435e-38"
 * (sign, 9 digits, point, exponent), before its comma. In MessagePack a
 * float is 4 bytes of a bin. */
#define CODEC_JSON_FLOAT_MAX 15

/* Writes f as JSON with the fewest significant digits that read back as
 * the same float32 (and as the same float32 through a double), "null"
 * when not finite, into buf (cap bytes, NUL-terminated, at most
 * CODEC_JSON_FLOAT_MAX + 1 needed). Returns the length. */
size_t codec_format_float(char *buf, size_t cap, float f);

/* What bounds a result's size, known before the job runs (at admission). */
struct codec_result_size {
    enum proto_enc enc;
    size_t rows;        /* output rows */
    size_t values;      /* output floats of all rows (per-token output: rows x
                           tokens x width, the zero padding included) */
    int per_token;      /* a `lengths` integer per row */
    int labels;         /* a classifier: `scores` repeats the output, and a label per row */
    size_t label_max;   /* the longest label name's bytes */
    size_t id_len, model_len, topic_len, meta_len;
    /* A generation job's: at most gen_tokens tokens of at most
     * gen_token_bytes bytes of text each, with logprobs or not (rows and
     * values then 0). */
    size_t gen_tokens, gen_token_bytes;
    int gen_logprobs;
};

/* The most bytes codec_encode_result can write for an ok result of that
 * size, whatever the values are (saturates at SIZE_MAX). A job whose bound
 * passes what the producer can publish is refused before it runs. */
size_t codec_result_max_bytes(const struct codec_result_size *s);

/* The content-type header value for an encoding. */
const char *codec_content_type(enum proto_enc enc);

#endif

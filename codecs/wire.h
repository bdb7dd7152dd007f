/* wire.h - the client side of the wire contract (docs/protocol.md): encode
 * a job as a producer would, decode a result as a client would. Used by
 * `kinfer smoke`, the tests and the benchmark; the worker itself uses
 * codec.h.
 *
 * Threads: any; no shared state. */
#ifndef KINFER_WIRE_H
#define KINFER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

/* A job's truncate field: left out unless set. */
enum wire_truncate { WIRE_TRUNCATE_ABSENT = 0, WIRE_TRUNCATE_TRUE, WIRE_TRUNCATE_FALSE };

/* A job to encode. NULL/0 fields are left out. */
struct wire_job {
    const char *id;
    const char *model;
    const float *input;
    size_t n_input;
    int input_as_array;     /* MessagePack: array of numbers instead of bin */
    int64_t deadline_ms;    /* 0: absent */
    int64_t timeout_ms;     /* -1: absent */
    int priority;           /* -1: absent */
    const char *meta_json;  /* JSON text of meta, or NULL */
    /* An encoder's job (docs/protocol.md v1.1) instead of input: */
    const char *const *text;    /* n_text rows of text (NULL = none) */
    const size_t *text_len;     /* their lengths in bytes; NULL = strlen */
    size_t n_text;
    int text_as_array;          /* 1 row: as ["..."] instead of "..." */
    const char *const *text_pair; /* n_text second segments, or NULL */
    const int32_t *tokens;      /* n_token_rows rows of ids (NULL = none) */
    const size_t *token_off;    /* n_token_rows + 1 offsets into tokens */
    size_t n_token_rows;
    const int32_t *type_ids;    /* as tokens, or NULL */
    enum wire_truncate truncate; /* absent (the zero value), true or false */
};

/* Encodes j in enc into a new buffer (*out, caller frees). Returns 0 or -1. */
int wire_encode_job(const struct wire_job *j, enum proto_enc enc,
                    unsigned char **out, size_t *out_len);

/* A decoded result. Strings are NUL-terminated copies; output is owned. */
struct wire_result {
    char id[PROTO_ID_MAX + 1];
    char model[PROTO_MODEL_MAX + 1];
    int ok;                        /* status == "ok" */
    char code[32];                 /* error.code when !ok */
    char message[PROTO_ERRMSG_MAX];
    float *output;                 /* rows x width (x tokens) when ok */
    size_t rows, width;
    size_t tokens_dim;             /* per-token output: shape [rows, tokens_dim, width] */
    size_t *lengths;               /* per-token output: each row's tokens, owned */
    size_t n_lengths;
    int has_scores;                /* a classifier's: scores present */
    float *scores;                 /* their values (rows x width), owned; NULL if absent */
    char **labels;                 /* a classifier's best label per row, owned (an
                                      entry that was not a string is NULL) */
    size_t n_labels;
    int64_t tokens, padded_tokens; /* timing of an encoder's job; 0 otherwise */
    double queued_ms, infer_ms, total_ms;
    int64_t batch_rows;
    char topic[PROTO_TOPIC_MAX + 1];
    int64_t partition, offset;
    int has_meta;
    char meta_json[PROTO_META_MAX + 1]; /* meta re-encoded as compact JSON */
};

/* Decodes a result body (either encoding). Returns 0, or -1 with errstr. */
int wire_decode_result(const void *body, size_t len, struct wire_result *r,
                       char *errstr, size_t errstr_size);

/* Frees what r owns (not r). */
void wire_result_fini(struct wire_result *r);

#endif

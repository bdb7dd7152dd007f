/* protocol.h - the vocabulary of the wire contract (docs/protocol.md) that
 * both sides of it share: the size limits, the two encodings, the error
 * codes and the id rule. The worker's decoder and encoder (codec.h) and
 * the client side (wire.h) use it; nothing here knows about the pipeline.
 *
 * Threads: any; no state. */
#ifndef KINFER_PROTOCOL_H
#define KINFER_PROTOCOL_H

#include <stddef.h>

#define PROTO_ID_MAX 200        /* 1..200 bytes of [A-Za-z0-9._:@/-] */
#define PROTO_MODEL_MAX 128     /* longest model name accepted */
#define PROTO_META_MAX 4096     /* meta: at most 4096 encoded bytes */
#define PROTO_TOPIC_MAX 249     /* Kafka's own limit on topic names */
#define PROTO_ERRMSG_MAX 256    /* error.message, bytes with the NUL */

/* The content-type header values of the two encodings. */
#define PROTO_CT_MSGPACK "application/msgpack"
#define PROTO_CT_JSON "application/json"

/* float32 on the wire is little-endian: 1 when the host's order is that
 * (a tensor is then copied as it is), else 0 (converted element by
 * element). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define PROTO_HOST_IS_WIRE_ORDER 1
#else
#define PROTO_HOST_IS_WIRE_ORDER 0
#endif

/* How a job came, and so how its result goes. */
enum proto_enc { PROTO_ENC_MSGPACK = 0, PROTO_ENC_JSON = 1 };

/* The error codes of docs/protocol.md, in its order. */
enum proto_err {
    PROTO_OK = 0,
    PROTO_ERR_INVALID_INPUT,
    PROTO_ERR_UNKNOWN_MODEL,
    PROTO_ERR_DEADLINE_EXCEEDED,
    PROTO_ERR_INFERENCE_FAILED,
    PROTO_ERR_SHUTTING_DOWN,
};
#define PROTO_N_ERRS (PROTO_ERR_SHUTTING_DOWN + 1)

/* The protocol name of an error code ("invalid_input", ...); "ok" for
 * PROTO_OK. Static storage. */
const char *proto_err_name(enum proto_err e);

/* 1 if s (len bytes, borrowed) is a valid job id, else 0. */
int proto_id_valid(const char *s, size_t len);

#endif

/* protocol.c - the error names and the id rule of docs/protocol.md.
 *
 * Threads: any; no state. */
#include "protocol.h"

/* Unknown values fall back to inference_failed, the code that promises
 * least about the job. */
const char *proto_err_name(enum proto_err e)
{
    switch (e) {
    case PROTO_OK: return "ok";
    case PROTO_ERR_INVALID_INPUT: return "invalid_input";
    case PROTO_ERR_UNKNOWN_MODEL: return "unknown_model";
    case PROTO_ERR_DEADLINE_EXCEEDED: return "deadline_exceeded";
    case PROTO_ERR_INFERENCE_FAILED: return "inference_failed";
    case PROTO_ERR_SHUTTING_DOWN: return "shutting_down";
    }
    return "inference_failed";
}

/* Ids name Redis keys and record keys, so they are kept to characters
 * that need no quoting anywhere. */
int proto_id_valid(const char *s, size_t len)
{
    if (len < 1 || len > PROTO_ID_MAX) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                 (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
                 c == '@' || c == '/' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

/* codec_decode.h - private to the decoder (codec_decode.c reads the
 * envelope, codec_payload.c what the job carries to run): the top-level
 * fields as the parse found them, and the helpers both use. Not for use
 * outside codecs/ (codec.h is the codec's API).
 *
 * Threads: the decoding thread; no state. */
#ifndef KINFER_CODEC_DECODE_H
#define KINFER_CODEC_DECODE_H

#include <jansson.h>
#include <msgpack.h>
#include <stdint.h>

#include "codec.h"

/* The top-level fields of a generation job (codec_gen.c), in the order
 * of struct fields' mp_gen / js_gen. */
#define CODEC_GEN_FIELDS 11
extern const char *const codec_gen_names[CODEC_GEN_FIELDS];

/* A scalar top-level field seen through either encoding, so that id,
 * model, deadline_ms, timeout_ms and priority are validated by one piece
 * of code and say the same thing in both. */
enum fv_kind { FV_ABSENT = 0, FV_STR, FV_INT, FV_OTHER };

struct fval {
    enum fv_kind kind;
    const char *s;    /* FV_STR: bytes (not NUL-terminated), borrowed from the parse */
    size_t len;
    int64_t i;        /* FV_INT */
    int too_big;      /* FV_INT: an unsigned value above INT64_MAX */
    const char *type; /* the value's type, for messages */
};

/* The top-level fields, referring into the parsed document (msgpack zone
 * or jansson tree); valid until that document is freed. */
struct fields {
    struct fval id, model, deadline, timeout, priority;
    const msgpack_object *mp_input, *mp_meta;
    json_t *js_input, *js_meta;
    /* v1.1, for encoders */
    const msgpack_object *mp_text, *mp_pair, *mp_tokens, *mp_types, *mp_truncate;
    json_t *js_text, *js_pair, *js_tokens, *js_types, *js_truncate;
    size_t js_bignums; /* numbers rewritten as CODEC_BIGNUM_TAG strings */
    /* v1.2, for generators: the fields codec_gen_names lists, in order */
    const msgpack_object *mp_gen[CODEC_GEN_FIELDS];
    json_t *js_gen[CODEC_GEN_FIELDS];
};

/* Records a decode error on the job unless an earlier one is already set:
 * the first error is the one reported. Returns -1 for `return
 * codec_fail(...)`. The message is repaired to UTF-8 (it may quote the
 * record). */
int codec_fail(struct codec_request *j, enum proto_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* JSON allows numbers C cannot hold (an integer past int64, a real past
 * DBL_MAX), and jansson refuses the whole document for one. So a document
 * that failed for that alone is parsed again with each such number
 * rewritten as a JSON string of CODEC_BIGNUM_TAG followed by the number's
 * text (the tag starts with NUL, which no valid field holds): meta echoes
 * the number as written, every other field answers invalid_input naming
 * itself. */
#define CODEC_BIGNUM_TAG "\0kinfer-number:"
#define CODEC_BIGNUM_TAG_LEN 15

/* When v is such a rewritten number, its text (*len bytes, borrowed from
 * v); else NULL. */
const char *codec_js_bignum(const json_t *v, size_t *len);

/* The type of a MessagePack object / a JSON value, for messages (a
 * rewritten number is an "integer" or a "real", as it was written). */
const char *codec_mp_type(const msgpack_object *o);
const char *codec_js_type(const json_t *v);

/* The `input` field (o / v may be NULL: missing), checked against lim and
 * copied into j->input. Returns 0, or -1 with the job failed and no input
 * kept. */
int codec_input_mp(struct codec_request *j, const msgpack_object *o,
                   const struct codec_limits *lim);
int codec_input_js(struct codec_request *j, const json_t *v, const struct codec_limits *lim);

/* The fields of an encoder's job, when it has them: exactly one of input,
 * text and tokens; text_pair only with text, type_ids only with tokens;
 * truncate a boolean. Returns 1 when the job is a text or token job (then
 * decoded, or failed), 0 when it is not (input goes the old way), -1 on
 * an error. */
int codec_take_rows(struct codec_request *j, const struct fields *f,
                    const struct codec_limits *lim);

/* The fields of a generation job (codec_gen.c), when it has prompt or
 * messages: exactly one of them, and neither input, text nor tokens;
 * each parameter checked against the contract's ranges. Returns 1 when
 * the job is a generation job (then j->gen is set, or the job failed), 0
 * when it is not, -1 on an error. */
int codec_take_gen(struct codec_request *j, const struct fields *f,
                   const struct codec_limits *lim);
/* Frees j->gen and everything it owns. */
void codec_gen_free(struct codec_gen *g);

/* Writes a generation result's fields (text, tokens, finish_reason,
 * usage, logprobs) into an open map / after a JSON member; the timing
 * members ttft_ms and decode_tokens_per_s (codec_encode.c). 0, or -1. */
struct gbuf;
int codec_gen_put_mp(msgpack_packer *pk, const struct codec_gen_result *g);
int codec_gen_put_js(struct gbuf *b, const struct codec_gen_result *g);
/* Map entries codec_gen_put_mp writes. */
int codec_gen_mp_entries(const struct codec_gen_result *g);
/* The most bytes codec_gen_put_* write for s's generation bound. */
size_t codec_gen_max_bytes(const struct codec_result_size *s);

/* JSON text with ill-formed UTF-8 read as MessagePack is (json_utf8.c):
 * a copy of v with each ill-formed sequence in a string value written as
 * a marker, *marks of them, and each in a key as U+FFFD, *keys of them
 * (NULL when out of memory); then, in the tree parsed from it, the
 * markers turned back, *found of them: the original bytes in strings
 * outside the top level's meta, U+FFFD inside it. Returns 0, or -1 when
 * out of memory. */
char *codec_js_mark_utf8(const unsigned char *v, size_t len, size_t *marks, size_t *keys,
                         size_t *out_len);
int codec_js_unmark_utf8(json_t *root, size_t *found);

#endif

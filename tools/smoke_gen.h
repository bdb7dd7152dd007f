/* smoke_gen.h - `kinfer smoke` against a generating model (a folder whose
 * config.json names a decoder, gen/genmodel.h): sends generation jobs
 * (docs/protocol.md, "Generation jobs") as a client would, prompts and
 * chats, JSON and MessagePack, some streamed with stop strings, some with
 * logprobs, each with a seed, and checks every answer against the
 * contract. The weights of a demo model are random, so the text itself is
 * not checked, only its shape: smoke_gen_check says what that is.
 *
 * The pieces are separate so that the checker can be tested on bodies
 * made by hand (tests/test_smoke_gen.c): building a job, encoding it,
 * decoding a result body, and the check.
 *
 * Threads: the caller's; no shared state. Ownership: json_t values
 * returned are new references the caller releases; arguments are
 * borrowed. */
#ifndef KINFER_SMOKE_GEN_H
#define KINFER_SMOKE_GEN_H

#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "../codecs/protocol.h"
#include "../config/config.h"
#include "smoke.h"

/* What a client knows of the model from its folder's config.json. */
struct smoke_gen_model {
    size_t vocab;   /* vocab_size: every id in tokens is below it */
    size_t ctx;     /* max_position_embeddings; 0 = unknown */
};

/* Reads dir/config.json into *m. Returns 0, or -1 with why filled. */
int smoke_gen_model_read(const char *dir, struct smoke_gen_model *m, char *why, size_t cap);

/* The i-th job of a run as JSON: id, model (when model is not NULL),
 * `prompt` (even i) or `messages` (odd i), max_tokens 2..17, a seed drawn
 * from run_seed and i, greedy or sampled, every 4th streamed with stop
 * strings, every 5th with logprobs. NULL when out of memory. */
json_t *smoke_gen_job(uint64_t run_seed, size_t i, const char *id, const char *model);

/* 1 when job i repeats job i - 1 (all but its id: i % 10 is 1 or 6, so
 * with --json-every 5 one of the two is JSON and the other MessagePack):
 * the same seed must give the same tokens. */
int smoke_gen_twin(size_t i);

/* Encodes a job (any JSON value made of objects, arrays, strings,
 * integers, reals, booleans and null) in enc into a new buffer (*out, the
 * caller frees it). Returns 0, or -1 when out of memory. */
int smoke_gen_encode(const json_t *job, enum proto_enc enc, unsigned char **out, size_t *len);

/* Decodes a result body, JSON or MessagePack (told apart by its first
 * byte), into JSON. A MessagePack str that is not valid UTF-8, a map key
 * that is not a str, a bin or extension value, nesting deeper than 16, or
 * bytes after the value make it fail. Returns the value, or NULL with why
 * filled. */
json_t *smoke_gen_decode(const void *body, size_t len, char *why, size_t cap);

/* Checks res, the answer to job, against the contract:
 *  - status "ok", the job's id;
 *  - text a valid UTF-8 string that contains none of the job's stop strings;
 *  - tokens an array of at most max_tokens integers, each in [0, vocab);
 *  - finish_reason eos, stop or length: eos only below max_tokens, stop only
 *    when the job gave stop strings, length only at max_tokens (or where
 *    prompt_tokens + tokens reach m->ctx, when known);
 *  - usage.completion_tokens equal to the number of tokens (the EOS token is
 *    neither listed nor counted), usage.prompt_tokens at least 1;
 *  - timing.ttft_ms and timing.decode_tokens_per_s numbers;
 *  - logprobs, only when the job asked: one number <= 0 per token.
 * For a job with stream: true, stream holds the Redis stream's entries in
 * order, each an array of strings [field, value, field, value...]: it must
 * be ["start","1"], then ["text", piece]... whose pieces joined equal text,
 * then ["done","1","finish_reason", the result's]. stream is ignored for
 * other jobs. Returns 0, or -1 with why filled (no text of the job's or
 * the result's in it but the worker's own error message). */
int smoke_gen_check(const json_t *job, const json_t *res, const json_t *stream,
                    const struct smoke_gen_model *m, char *why, size_t cap);

/* smoke_run for model index di of c, which generates: sends o->jobs jobs
 * (o->rows is not used), waits for every result and, for streamed jobs,
 * reads their streams, checks them all, and prints the summary (jobs,
 * finish reasons, p50/p99 latency and time to first token, tokens/s).
 * Returns 0 when every job got a correct result in time, else 1. */
int smoke_gen_run(const struct kcfg *c, int di, const struct smoke_opts *o,
                  volatile sig_atomic_t *stop);

#endif

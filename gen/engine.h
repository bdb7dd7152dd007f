/* engine.h - the generation engine of one executor: continuous batching
 * of text-generation requests over a decoder workspace (gpu/decoder.h)
 * and its paged key/value cache.
 *
 * A request (its prompt already tokenized) is submitted to a bounded
 * waiting queue. Each gen_engine_step makes one decoder step over a batch:
 * every running sequence that has its prompt in the cache adds one decode
 * token; sequences still reading their prompt add a chunk of it (a long
 * prompt is read over several steps); waiting requests are admitted by
 * priority (higher first), then deadline (earlier first, none last), then
 * arrival, while the step's token budget (max_batch_tokens), the free
 * sequence slots and the cache's free blocks allow (a request is admitted
 * only when the blocks its whole prompt takes are free, and admission
 * stops at the first that cannot be, so a large prompt is not passed over
 * for ever). Each sequence whose prompt is all read is sampled from its
 * last logits with its own random stream (gen/sample.h): on the host, or
 * where the workspace's backend has a sampler (decoder_ws_samples: the
 * CUDA backend) on the device by decoder_step_sample, the same choice
 * with the draw still taken from the job's stream here, so no logits
 * come back. The token is decoded incrementally and the stop strings
 * looked for (gen/stop.h).
 *
 * A sequence ends with finish_reason
 *   eos       it sampled one of the request's end ids (not in tokens)
 *   stop      its text reached a stop string (text ends before it)
 *   length    max_tokens generated, or prompt + generated reached the
 *             context, or it cannot grow even with the whole cache to
 *             itself
 *   deadline  the deadline passed after its first token
 * and is reported through on_done (status GEN_OK), or with status
 * GEN_DEADLINE_EXCEEDED when the deadline passed before its first token.
 *
 * Preemption by recomputation: when a running sequence needs a block and
 * none is free, the lowest priority, then newest, running sequence gives
 * its blocks back and waits again with its prompt and the tokens it
 * generated as the prompt to read; its random stream, text and timings
 * stay, so its output is what it would have been without preemption (up
 * to the order floating-point sums are taken in: see tests/test_gen_engine.c).
 *
 * Streaming: on_piece gets each settled piece of a sequence's text (valid
 * UTF-8, never part of what may turn out to be a stop string), in order;
 * the pieces joined are the final text.
 *
 * Overlap: where the workspace can leave a step in flight and the
 * device picks the tokens (decoder_ws_overlaps: the CUDA backend), a step
 * of sequences that all pick, with none waiting for a free slot, none
 * ending by length and the cache holding their next tokens, is followed
 * at once by a chained step whose ids are its picks, on the device; the
 * host then takes the first step's tokens (decoding, stop strings,
 * callbacks) while the device computes the second, and gen_engine_step
 * returns with it in flight (the next call collects it, chaining again
 * while it may). A sequence that ends with an end id or a stop string
 * meanwhile has its row of the chained step computed and dropped: its
 * output is what it would have been without overlap, up to the order
 * floating-point sums are taken in (the extra row changes the step's
 * shape, and with it, for a long context, how its attention is split).
 *
 * Threads: an engine and everything it calls back run on the one executor
 * thread that made it; a callback must not call into the engine. Ownership: the engine borrows the decoder and the
 * tokenizer (which must outlive it) and copies everything a request
 * points at; a result and a piece point into the engine, valid during the
 * callback only. Memory: the waiting queue holds at most max_waiting
 * requests, the batch at most max_seqs; each request's buffers are sized
 * by its prompt, max_tokens and the context. */
#ifndef KINFER_GEN_ENGINE_H
#define KINFER_GEN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../gpu/decoder.h"
#include "../text/tokenizer.h"
#include "sample.h"
#include "stop.h"

#define GEN_MAX_END_IDS 8

/* Return codes of gen_engine_submit. */
enum {
    GEN_EINVAL = -1, /* the request can never run (why says how) */
    GEN_EFULL = -2,  /* the waiting queue is full: try later */
    GEN_ENOMEM = -3,
};

enum gen_status {
    GEN_OK = 0,            /* finished with a finish_reason */
    GEN_DEADLINE_EXCEEDED, /* the deadline passed before the first token */
    GEN_FAILED,            /* gen_engine_abort: the device failed */
};

enum gen_finish { GEN_FINISH_NONE = 0, GEN_FINISH_EOS, GEN_FINISH_STOP, GEN_FINISH_LENGTH,
                  GEN_FINISH_DEADLINE };

/* "eos", "stop", "length", "deadline" ("" for none). */
const char *gen_finish_name(enum gen_finish f);

/* A request; everything it points at is copied by gen_engine_submit. */
struct gen_request {
    const int32_t *prompt; /* n_prompt ids of the decoder's vocabulary */
    size_t n_prompt;
    struct gen_sampling sampling;
    uint64_t seed;
    size_t max_tokens;                /* >= 1 */
    const char *stop[GEN_MAX_STOPS];  /* NUL-terminated, not empty */
    size_t n_stop;
    const int32_t *end_ids;           /* eos ids (decoder_info's eos_ids) */
    size_t n_end;                     /* at most GEN_MAX_END_IDS */
    int logprobs;                     /* 1: report each token's log-probability */
    int priority;                     /* higher runs first */
    int64_t deadline_ms;              /* on the engine's clock; 0 = none */
    void *user;                       /* handed back, never touched */
};

/* What a finished request reports (borrowed from the engine for the
 * callback's duration). Times are on the engine's clock, in ms. */
struct gen_result {
    void *user;
    enum gen_status status;
    enum gen_finish finish;
    const char *text; /* valid UTF-8, NUL-terminated */
    size_t text_len;
    const int32_t *tokens; /* generated ids, the end id left out */
    size_t n_tokens;
    const float *logprobs;  /* n_tokens entries, or NULL when not asked */
    const double *token_ms; /* when each of tokens was sampled */
    size_t prompt_tokens, completion_tokens;
    double submit_ms;        /* when gen_engine_submit took it */
    double ttft_ms;          /* first token's time - submit_ms; -1 when none */
    unsigned preemptions;    /* times it gave its blocks back */
    const char *error;       /* GEN_FAILED: why */
};

struct gen_engine_cb {
    void (*on_done)(void *arg, const struct gen_result *r);
    /* May be NULL: no streaming. */
    void (*on_piece)(void *arg, void *user, const char *text, size_t len);
    void *arg;
};

struct gen_engine_conf {
    size_t max_waiting;      /* the waiting queue's bound (>= 1) */
    size_t max_seqs;         /* sequences in a batch (>= 1) */
    size_t max_batch_tokens; /* new tokens per step (>= max_seqs) */
    size_t max_ctx;          /* tokens per sequence; 0 = the model's context */
    size_t block_tokens;     /* 0 = 16 */
    size_t kv_bytes;         /* the cache's budget (decoder_ws_conf) */
    int prefix_sharing;      /* 1: full blocks of ids already in the cache are shared
                                (kvcache.h), not computed again */
    int overlap;             /* 1: chain decode steps where the workspace overlaps
                                (decoder_ws_overlaps; see Overlap above) */
    /* The clock deadlines and timings are read on (ms); NULL = the
     * monotonic clock (clock_mono_us / 1000). */
    double (*clock_ms)(void *arg);
    void *clock_arg;
};

struct gen_engine;

/* An engine with its own decoder workspace on executor slot. NULL with
 * errstr filled for a bound out of range or when memory runs out. */
struct gen_engine *gen_engine_new(const struct decoder *d, const struct tokenizer *tok,
                                  unsigned slot, const struct gen_engine_conf *conf,
                                  const struct gen_engine_cb *cb, char *errstr,
                                  size_t errstr_size);
/* Frees the engine; requests still in it are dropped without a report
 * (gen_engine_abort first to report them). NULL is fine. */
void gen_engine_destroy(struct gen_engine *e);

/* Queues r. 0; GEN_EINVAL with why filled for a request that can never
 * run (no prompt, an id out of the vocabulary, prompt + 1 over the
 * context, a prompt taking more blocks than the whole cache holds,
 * max_tokens 0, bad sampling, too many or empty stop strings); GEN_EFULL
 * when max_waiting requests wait; GEN_ENOMEM. Nothing is kept on error. */
int gen_engine_submit(struct gen_engine *e, const struct gen_request *r, char *why,
                      size_t why_size);

/* One step (see above; with a chained step in flight, that one's
 * collection, and a step of its own only when no chain follows);
 * requests finished by the steps collected are reported before it
 * returns. Returns the number of requests still in the engine (0: idle),
 * or a negative MODEL_* code when the decoder failed (gen_engine_error
 * says why; on MODEL_EINVAL the requests stay as they were: step again,
 * or gen_engine_abort; MODEL_EFATAL: the device failed, and the steps in
 * flight with it). */
int gen_engine_step(struct gen_engine *e);

/* Reports every request in the engine as GEN_FAILED with error why and
 * drops it. */
void gen_engine_abort(struct gen_engine *e, const char *why);

size_t gen_engine_waiting(const struct gen_engine *e);
size_t gen_engine_running(const struct gen_engine *e);
/* Chained steps submitted since the engine was made (Overlap), and
 * those the decoder refused (the step before was collected as it was). */
uint64_t gen_engine_overlapped(const struct gen_engine *e);
uint64_t gen_engine_chain_refused(const struct gen_engine *e);
/* Preemptions since the engine was made. */
uint64_t gen_engine_preemptions(const struct gen_engine *e);
/* Tokens sequences found in the cache when admitted (shared prefixes). */
uint64_t gen_engine_shared_tokens(const struct gen_engine *e);
const char *gen_engine_error(const struct gen_engine *e);
/* The workspace (for tests and statistics: its cache's free blocks). */
struct decoder_ws *gen_engine_ws(struct gen_engine *e);

#endif

/* decoder.h - the runtime of text-generating decoders (Llama, Mistral,
 * Qwen2, Qwen3 from a Hugging Face folder): loading one onto a
 * model_runtime's backend, a workspace per executor holding a paged
 * key/value cache, and the step that runs a batch of sequences, each
 * adding k >= 1 new tokens (a prefill chunk, or one decode token) at its
 * current length, and returns their logits, or (decoder_step_sample, on
 * a backend that samples on the device) the tokens chosen from them, so
 * the logits never leave the device. Stopping and scheduling are the
 * caller's, and so is the sampling's randomness: each row's draw.
 *
 * A sequence is a kvcache id (gpu/kvcache.h) of the workspace's cache:
 * the caller makes it (kvcache_seq_new), asks whether its next tokens fit
 * (kvcache_fits, kvcache_blocks_needed), and frees it when the sequence
 * ends; decoder_step grows it.
 *
 * Threads: decoder_load and decoder_destroy on the main thread; a
 * workspace, its cache and decoder_step on the executor thread that made
 * the workspace. A loaded decoder is read-only, shared by executors.
 * Ownership: the decoder owns its weights; a workspace owns its cache and
 * every buffer; logits point into the workspace. */
#ifndef KINFER_DECODER_H
#define KINFER_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "model.h"

struct decoder;
struct decoder_ws;

#define DECODER_MAX_EOS 8

/* What a loaded decoder is (borrowed from it). The token ids come from
 * generation_config.json, else config.json (bos_token_id, eos_token_id:
 * an id or a list); ids outside the vocabulary are left out. */
struct decoder_info {
    const char *arch;        /* "llama" */
    size_t vocab, hidden, layers, heads, kv_heads, head_dim, intermediate;
    size_t context;          /* positions a sequence may take */
    size_t n_params;
    double flops_per_token;
    int32_t bos_id;          /* -1: none */
    int32_t eos_ids[DECODER_MAX_EOS];
    size_t n_eos;
};

/* 1 when config.json's model_type names a decoder this build runs. */
int decoder_model_type_known(const char *model_type);

/* Loads the folder spec->path: config.json, and model.safetensors or the
 * shards model.safetensors.index.json names (F32, F16 or BF16). Every
 * tensor is checked before any is uploaded. Returns the decoder, or NULL
 * with errstr filled ("model NAME: ..."). Borrows rt (which must outlive
 * the decoder) and spec. */
struct decoder *decoder_load(struct model_runtime *rt, const struct model_spec *spec,
                             char *errstr, size_t errstr_size);
void decoder_destroy(struct decoder *d);
const struct decoder_info *decoder_info(const struct decoder *d);

/* Bytes of one cache block of block_tokens tokens (every layer's keys
 * and values, in the backend's cache type: backend.h's kv_size). */
size_t decoder_kv_block_bytes(const struct decoder *d, size_t block_tokens);

/* A workspace's bounds. */
struct decoder_ws_conf {
    size_t max_seqs;      /* live sequences (cache ids), and sequences per step */
    size_t max_tokens;    /* new tokens per step, all sequences together */
    size_t max_ctx;       /* tokens per sequence; 0 = the model's context */
    size_t block_tokens;  /* tokens per cache block; 0 = 16 */
    size_t kv_bytes;      /* the cache's budget: whole blocks of
                             decoder_kv_block_bytes(d, block_tokens) */
    int all_logits;       /* 1: decoder_step returns every new token's logits */
};

/* A workspace (every buffer, the cache included, allocated here) on
 * executor slot. NULL with errstr filled when a bound is 0 or too large,
 * the budget holds no block, or memory runs out. */
struct decoder_ws *decoder_ws_new(const struct decoder *d, unsigned slot,
                                  const struct decoder_ws_conf *conf, char *errstr,
                                  size_t errstr_size);
void decoder_ws_destroy(struct decoder_ws *ws);
/* The workspace's cache bookkeeping: sequences are made and freed here. */
struct kvcache *decoder_ws_cache(struct decoder_ws *ws);

/* One step: sequence b->seqs[i] (a live cache id, each at most once)
 * adds the tokens ids[offsets[i] .. offsets[i+1]) at positions len ..
 * len + k - 1 where len is its length before the call. */
struct decoder_batch {
    size_t n;
    const int *seqs;
    const int32_t *ids;
    const uint32_t *offsets;   /* n + 1 entries, offsets[0] = 0, increasing */
};

/* Runs the step. On MODEL_OK every sequence has grown by its k tokens
 * and *logits points, in ws, at n x vocab floats (the logits of each
 * sequence's last new token), or with all_logits at (total new tokens) x
 * vocab in the packed order; valid until the next call with ws.
 * MODEL_EINVAL, with nothing changed, for a malformed batch (an id out
 * of the vocabulary, a sequence not live or twice, more sequences or
 * tokens than the workspace holds) or one whose tokens do not fit the
 * cache (check with kvcache_fits first); MODEL_EFATAL when the device
 * failed for good. After a failed pass the sequences keep their lengths
 * from before the call. decoder_ws_error says what happened. */
int decoder_step(const struct decoder *d, struct decoder_ws *ws, const struct decoder_batch *b,
                 const float **logits);
const char *decoder_ws_error(const struct decoder_ws *ws);

/* Choosing the next tokens on the device. Row i of a step's batch picks
 * a token when rows[i].on, under the parameters of gen/sample.h's struct
 * gen_sampling, with u its draw from the job's own stream (unused when
 * greedy): the same choice gen_sample makes from the logits decoder_step
 * would return (gpu/backend.h's sample says how close), without copying
 * them to the host. */
struct decoder_sample {
    float temperature;   /* 0: greedy */
    uint32_t top_k;      /* 0: off */
    float top_p;         /* 1: off */
    float min_p;         /* 0: off */
    double u;            /* [0, 1) */
    int on;              /* 0: the row picks nothing (its pick is left as it was) */
    int logprob;         /* 1: the pick's raw log-probability too */
};
struct decoder_pick {
    int32_t id;          /* -1: the row's logits have no finite value */
    float logprob;       /* with logprob; NaN when id is -1 */
};

/* 1 when ws's backend picks tokens on the device (decoder_step_sample
 * may be called), 0 when the caller samples decoder_step's logits (the
 * CPU backend, or a workspace with all_logits). */
int decoder_ws_samples(const struct decoder_ws *ws);

/* decoder_step, then the picks of the rows that ask (rows and picks: b->n
 * entries each) instead of the logits: only the picks come back from the
 * device. Return codes and failures as decoder_step; MODEL_EINVAL when
 * decoder_ws_samples is 0. */
int decoder_step_sample(const struct decoder *d, struct decoder_ws *ws,
                        const struct decoder_batch *b, const struct decoder_sample *rows,
                        struct decoder_pick *picks);

/* Overlap: the host prepares the next step while the device runs one.
 * decoder_ws_overlaps is 1 when ws's backend samples on the device and
 * can leave a step in flight (the CUDA backend). decoder_step_submit is
 * decoder_step_sample without the wait: on MODEL_OK the step is queued
 * (its sequences have grown), and decoder_step_collect waits for the
 * oldest step in flight and fills its picks as decoder_step_sample
 * would. At most two steps are in flight; decoder_step and
 * decoder_step_sample refuse while one is. A chained step (chain 1)
 * takes its token ids on the device from the picks of the step
 * submitted just before it, which must have had the same sequences in
 * the same order and every row picking: one token each, b->ids unread
 * (NULL is fine), so it may be submitted before that step's picks are
 * known. Sequences may be freed while a step holding them is in flight
 * (the blocks go to steps submitted later, which the device runs after
 * it). A failed submit changes nothing (a step submitted before it stays
 * in flight); a collect with no step in flight is refused (MODEL_EINVAL,
 * nothing changed); one that fails (the device failed) drops every step
 * in flight, their sequences keeping the lengths the steps gave them. */
int decoder_ws_overlaps(const struct decoder_ws *ws);
int decoder_step_submit(const struct decoder *d, struct decoder_ws *ws,
                        const struct decoder_batch *b, const struct decoder_sample *rows,
                        int chain);
int decoder_step_collect(const struct decoder *d, struct decoder_ws *ws,
                         struct decoder_pick *picks);
/* Steps submitted and not yet collected (0, 1 or 2). */
size_t decoder_ws_in_flight(const struct decoder_ws *ws);

/* What a workspace's steps moved: logits_bytes of logits copied to the
 * host (decoder_step), tokens picked on the device (decoder_step_sample);
 * graph_steps: decode steps replayed from a recording (a backend with
 * graphs, gpu.graphs on: a step of n decode tokens is recorded the second
 * time n is seen, then replayed). */
struct decoder_ws_counters {
    uint64_t steps, logits_bytes, device_picks, graph_steps;
};
void decoder_ws_counters(const struct decoder_ws *ws, struct decoder_ws_counters *out);
/* Fault injection (debug.device_fault_id): the next decoder_step on ws
 * fails as a dead device would (MODEL_EFATAL; on a GPU a sticky error
 * that poisons the process's CUDA context). */
void decoder_ws_inject_fault(struct decoder_ws *ws);

/* Writes a small random Llama folder to dir (created if missing; the
 * files gpu/demo_llama.c lists), drawn from seed: the same seed, the
 * same folder. hidden / heads must be even, kv_heads must divide heads.
 * 0, or -1 with errstr filled. */
int decoder_write_demo(const char *dir, size_t layers, size_t hidden, size_t heads,
                       size_t kv_heads, size_t inter, uint64_t seed, char *errstr,
                       size_t errstr_size);

/* The tokenizer a demo folder gets: byte-level BPE with ChatML specials
 * (Qwen's kind), or SentencePiece BPE with byte fallback and <s> in front
 * (Llama 2's and Mistral's kind). */
enum decoder_demo_tok { DECODER_DEMO_BYTELEVEL, DECODER_DEMO_SENTENCEPIECE };
/* As decoder_write_demo, with the tokenizer tok. */
int decoder_write_demo_tok(const char *dir, size_t layers, size_t hidden, size_t heads,
                           size_t kv_heads, size_t inter, uint64_t seed,
                           enum decoder_demo_tok tok, char *errstr, size_t errstr_size);
/* decoder_write_demo with more choices: the tokenizer, a vocabulary of at least
 * vocab rows (0: the tokenizer's; rows past the tokenizer's are drawn
 * like the others) and the weights in BF16 instead of F32 (rounded to
 * nearest from the same draws). */
struct decoder_demo_conf {
    size_t layers, hidden, heads, kv_heads, inter;
    size_t vocab;
    int bf16;
    uint64_t seed;
    enum decoder_demo_tok tok;  /* the tokenizer (0: byte-level) */
};
int decoder_write_demo_ex(const char *dir, const struct decoder_demo_conf *c, char *errstr,
                          size_t errstr_size);

#endif

/* sample.h - choosing the next token from a decoder's logits: greedy,
 * temperature, top-k, top-p, min-p, each job with a random stream of its
 * own, and the chosen token's log-probability.
 *
 * The order is transformers' generate: the raw logits are divided by the
 * temperature, then top-k keeps the k largest, top-p the smallest set of
 * the most likely tokens whose probability reaches p, min-p the tokens at
 * least min_p times as likely as the most likely one; the token is drawn
 * from the softmax of what is left. Temperature 0 is greedy: the largest
 * logit, the lowest id among equals (torch.argmax's choice), whatever the
 * other settings say. The log-probability reported is the chosen token's
 * under the log-softmax of the raw logits, before any of the above (the
 * contract's `logprobs`).
 *
 * Randomness: a job's draws come only from its own stream (xoshiro256**
 * seeded from the job's seed through splitmix64), one uniform draw per
 * sampled token, so the tokens a job gets never depend on what else runs
 * in its batch, nor on the order sequences are sampled in. The draw walks
 * the kept tokens in id order, so logits that differ only in their last
 * bits (summed in another order in another batch) move each token's share
 * of [0, 1) by as little, and never swap two near ties' shares.
 *
 * The CUDA backend makes the same choice on the device (gpu/backend.h's
 * sample, gpu/cuda_sample.cu) from the same logits and the uniform draw
 * the engine takes from the job's stream with gen_rng_uniform.
 *
 * Threads: a sampler's scratch belongs to one thread; streams belong to
 * their jobs. Nothing here allocates except gen_scratch_new. */
#ifndef KINFER_GEN_SAMPLE_H
#define KINFER_GEN_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

struct gen_sampling {
    float temperature; /* >= 0; 0 = greedy */
    uint32_t top_k;    /* 0 = off */
    float top_p;       /* (0, 1]; 1 = off */
    float min_p;       /* [0, 1); 0 = off */
};

/* Greedy, every filter off. */
void gen_sampling_defaults(struct gen_sampling *sp);

/* Checks the ranges the contract gives; 0, or -1 with why filled
 * ("top_p must be in (0, 1], got 1.5"). */
int gen_sampling_check(const struct gen_sampling *sp, char *why, size_t why_size);

struct gen_rng {
    uint64_t s[4];
};

void gen_rng_seed(struct gen_rng *r, uint64_t seed);
/* The next 64 random bits; a uniform double in [0, 1) from the top 53. */
uint64_t gen_rng_next(struct gen_rng *r);
double gen_rng_uniform(struct gen_rng *r);

/* Work area for a vocabulary of up to cap tokens (one per thread). */
struct gen_scratch;
struct gen_scratch *gen_scratch_new(size_t cap);
void gen_scratch_destroy(struct gen_scratch *s);

/* The distribution sp leaves over n logits (borrowed; NaN and inf count
 * as absent): fills s with the kept token ids (gen_scratch_ids, in the
 * order gen_sample walks them) and their probabilities, renormalized to
 * sum to 1 (gen_scratch_prob, by id). Greedy keeps the argmax alone.
 * Returns how many are kept, or 0 when n is 0 or over the scratch's cap,
 * or no logit is finite. */
size_t gen_filter(const float *logits, size_t n, const struct gen_sampling *sp,
                  struct gen_scratch *s);
const uint32_t *gen_scratch_ids(const struct gen_scratch *s);
double gen_scratch_prob(const struct gen_scratch *s, uint32_t id);

/* The next token from n logits (borrowed; NaN counts as -inf, and all -inf
 * or NaN is an error) under sp: gen_filter, then one uniform draw from r
 * (r NULL means greedy). *logprob (may be NULL) gets the token's raw
 * log-probability. Returns the token id, or -1 when n is 0 or over the
 * scratch's cap, or no logit is finite. */
int32_t gen_sample(const float *logits, size_t n, const struct gen_sampling *sp,
                   struct gen_rng *r, struct gen_scratch *s, float *logprob);

/* The raw log-probability of token id under logits (log-softmax), or NaN
 * when id is out of range or no logit is finite. */
float gen_logprob(const float *logits, size_t n, int32_t id);

#endif

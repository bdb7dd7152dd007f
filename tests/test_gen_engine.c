/* test_gen_engine.c - the generation engine (gen/engine.h) over small
 * random Llama folders (decoder_write_demo, weights drawn from the run's
 * seed) on the CPU backend; the program built over the emulated device
 * (build/emu/tests/, make test) runs every test on the CUDA backend in
 * fp32 instead, its injected fault excepted (a sticky error there ends
 * the context for the rest of the program), and so does the native
 * program on a GPU machine with $KINFER_TEST_BACKEND=cuda.
 *
 * The rule for comparing runs: a sequence's logits in a batch differ from
 * its logits alone only in the order floating-point sums are taken in
 * (each row of a step is computed from its own tokens and cache). On the
 * CPU backend they are not bit for bit the same: the matrix products
 * group their sums by the batch's shape, and the log-probabilities of the
 * same token alone and in a batch differ by about 1e-6 (test 1 prints
 * how many jobs came out identical anyway, and the largest difference).
 * So runs are compared by the margin rule: both are checked, step by
 * step along the first run's tokens, against reference logits from a
 * plain loop over decoder_step; a greedy token must be the reference's
 * argmax wherever its two largest logits are more than MARGIN (1e-4)
 * apart, a sampled token the reference's choice for the job's draw
 * wherever the draw is more than SMARGIN (1e-5) from a boundary of the
 * sampler's walk and top-k's cut is more than MARGIN wide; past the
 * first step where that does not hold both are valid continuations and
 * the comparison stops. Log-probabilities agree within LPTOL (1e-4).
 * Each test asserts that at least half of all tokens were checked; runs
 * checked to the end must agree in everything (tokens, finish reason,
 * text). A job alone is a plain loop's steps exactly, and is compared bit
 * for bit.
 *
 * Checked: (1) 32 greedy jobs alone and all at once agree; a job's
 * greedy tokens alone equal a plain loop over decoder_step;
 * (2) a cache small enough to force preemption gives the same outputs;
 * (3) seeded sampling reproduces (the same run twice: bit for bit),
 * agrees across batch compositions, and different seeds differ; (4) finish reasons eos, stop (text cut before
 * the stop string, the stream never shows it), length (max_tokens and
 * context, and a lone sequence the whole cache cannot grow), deadline
 * and deadline_exceeded; a failed step leaves the jobs to step again,
 * gen_engine_abort reports them; (5) prompts that can never
 * fit are refused at submit; (6) the waiting queue is bounded; (7) a
 * long prompt read in chunks gives what one read gives; (8) shared
 * prefixes: jobs starting with a common prefix (and a job that is all
 * prefix, one shorter than it, identical jobs) find its blocks in the
 * cache, skip computing them and give what they give without sharing,
 * also in a cache small enough to preempt and evict; (9) overlap: every
 * test runs with chained steps on (the CUDA backend chains them), and
 * the same jobs with it off give the same outputs bit for bit, with end
 * ids, stop strings, lengths and admissions in the way. Streams: the
 * pieces joined are always the final text. Every run checks where its
 * tokens were chosen: on the CUDA backend by the device's sampler with
 * no logits copied to the host (decoder_ws_counters), on the CPU backend
 * on the host. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gen/engine.h"
#include "../gpu/decoder.h"
#include "../text/tokenizer.h"
#include "testutil.h"

#define MARGIN 1e-4
#define MAXJ 64
#define MAXG 128

static char dir[] = "/tmp/kinfer_test_gen_engine_XXXXXX";
static struct model_runtime *rt;
#ifdef KINFER_EMU
static const char *backend = "cuda";
#else
static const char *backend = "cpu"; /* "cuda" with $KINFER_TEST_BACKEND=cuda (a GPU machine) */
#endif
static struct decoder *dec;
static struct tokenizer *tok;
static size_t vocab;

/* One job's outcome as the engine reported it (copied). */
struct out {
    int done, status, finish;
    int32_t tokens[MAXG];
    float lp[MAXG];
    size_t n;
    char text[4096], streamed[4096];
    size_t text_len, streamed_len;
    size_t prompt_tokens;
    double ttft;
    unsigned preempt;
};

static void on_done(void *arg, const struct gen_result *r)
{
    (void)arg;
    struct out *o = r->user;
    assert_int_equal(o->done, 0);
    o->done = 1;
    o->status = (int)r->status;
    o->finish = (int)r->finish;
    assert_true(r->n_tokens <= MAXG);
    memcpy(o->tokens, r->tokens, r->n_tokens * sizeof(int32_t));
    if (r->logprobs) memcpy(o->lp, r->logprobs, r->n_tokens * sizeof(float));
    o->n = r->n_tokens;
    assert_int_equal(r->completion_tokens, r->n_tokens);
    assert_true(r->text_len < sizeof(o->text));
    memcpy(o->text, r->text, r->text_len + 1);
    o->text_len = r->text_len;
    o->prompt_tokens = r->prompt_tokens;
    o->ttft = r->ttft_ms;
    o->preempt = r->preemptions;
    for (size_t i = 1; i < r->n_tokens; i++) assert_true(r->token_ms[i] >= r->token_ms[i - 1]);
}

static void on_piece(void *arg, void *user, const char *text, size_t len)
{
    (void)arg;
    struct out *o = user;
    assert_int_equal(o->done, 0);
    assert_true(len > 0 && o->streamed_len + len < sizeof(o->streamed));
    memcpy(o->streamed + o->streamed_len, text, len);
    o->streamed_len += len;
    o->streamed[o->streamed_len] = '\0';
}

static double fake_now;
static double fake_clock(void *arg)
{
    (void)arg;
    return fake_now;
}

/* The stream's pieces joined are the final text. */
static void same_stream(const struct out *o)
{
    assert_int_equal(o->streamed_len, o->text_len);
    assert_memory_equal(o->streamed, o->text, o->text_len);
}

static struct gen_engine_conf conf_of(size_t seqs, size_t tokens, size_t blocks, size_t bt)
{
    size_t block = decoder_kv_block_bytes(dec, bt);
    struct gen_engine_conf c = {.max_waiting = MAXJ, .max_seqs = seqs,
                                .max_batch_tokens = tokens, .max_ctx = 256,
                                .block_tokens = bt, .kv_bytes = block * blocks,
                                .overlap = 1, .clock_ms = fake_clock};
    return c;
}

static struct gen_engine *engine(const struct gen_engine_conf *c)
{
    char err[256];
    struct gen_engine_cb cb = {.on_done = on_done, .on_piece = on_piece};
    struct gen_engine *e = gen_engine_new(dec, tok, 0, c, &cb, err, sizeof(err));
    if (!e) fail_msg("engine: %s", err);
    return e;
}

/* A job: a random prompt and its settings. */
struct job {
    int32_t prompt[300];
    size_t n;
    struct gen_request r;
};

static void job_init(struct job *j, size_t lo, size_t hi, size_t max_tokens)
{
    memset(j, 0, sizeof(*j));
    j->n = lo + tu_rand64() % (hi - lo + 1);
    for (size_t i = 0; i < j->n; i++) j->prompt[i] = (int32_t)(3 + tu_rand64() % (vocab - 3));
    j->r.prompt = j->prompt;
    j->r.n_prompt = j->n;
    gen_sampling_defaults(&j->r.sampling);
    j->r.seed = tu_rand64();
    j->r.max_tokens = max_tokens;
    j->r.logprobs = 1;
}

static void submit(struct gen_engine *e, struct job *j, struct out *o)
{
    char why[256];
    memset(o, 0, sizeof(*o));
    j->r.user = o;
    int rc = gen_engine_submit(e, &j->r, why, sizeof(why));
    if (rc != 0) fail_msg("submit: %d %s", rc, why);
}

static void drain(struct gen_engine *e)
{
    int n, steps = 0;
    while ((n = gen_engine_step(e)) > 0) assert_true(++steps < 100000);
    assert_int_equal(n, 0);
}

/* The tokens were chosen where the backend chooses them: on the device
 * (the CUDA backend: no logits came back to the host, every token was a
 * device pick) or on the host from the logits (the CPU backend). Decode
 * steps of one sequence, decode1 of them: on CUDA the first runs, the
 * second is recorded, the rest replay; the CPU has no graphs. */
static void check_path(struct gen_engine *e, size_t decode1)
{
    struct decoder_ws_counters k;
    decoder_ws_counters(gen_engine_ws(e), &k);
    assert_true(k.steps > 0);
    if (!strcmp(backend, "cuda")) {
        assert_true(k.device_picks > 0);
        assert_true(k.logits_bytes == 0);
        if (decode1 > 2) assert_true(k.graph_steps >= decode1 - 2);
    } else {
        assert_true(k.device_picks == 0);
        assert_true(k.logits_bytes > 0);
        assert_true(k.graph_steps == 0);
    }
}

/* Each job through e on its own, then all at once through e2. */
static void run_alone(const struct gen_engine_conf *c, struct job *jobs, size_t n, struct out *o)
{
    struct gen_engine *e = engine(c);
    for (size_t i = 0; i < n; i++) {
        submit(e, &jobs[i], &o[i]);
        drain(e);
        assert_int_equal(o[i].done, 1);
    }
    size_t decode1 = 0; /* the first token of each comes from its prefill step */
    for (size_t i = 0; i < n; i++) decode1 += o[i].n > 1 ? o[i].n - 1 : 0;
    check_path(e, decode1);
    gen_engine_destroy(e);
}

static void run_together(const struct gen_engine_conf *c, struct job *jobs, size_t n,
                         struct out *o, uint64_t *preemptions)
{
    struct gen_engine *e = engine(c);
    for (size_t i = 0; i < n; i++) submit(e, &jobs[i], &o[i]);
    drain(e);
    if (preemptions) *preemptions = gen_engine_preemptions(e);
    check_path(e, 0);
    gen_engine_destroy(e);
    for (size_t i = 0; i < n; i++) assert_int_equal(o[i].done, 1);
}

/* The reference: the logits before each of a run's generated tokens,
 * by a plain loop over decoder_step (the prompt in one read, then the
 * run's tokens one at a time). n_tok x vocab floats, malloc'd. */
static float *ref_logits(const int32_t *prompt, size_t n, const int32_t *toks, size_t n_tok)
{
    char err[256];
    struct decoder_ws_conf c = {.max_seqs = 1, .max_tokens = 512, .max_ctx = 512,
                                .block_tokens = 16,
                                .kv_bytes = decoder_kv_block_bytes(dec, 16) * 33};
    struct decoder_ws *ws = decoder_ws_new(dec, 0, &c, err, sizeof(err));
    if (!ws) fail_msg("ws: %s", err);
    float *out = malloc((n_tok ? n_tok : 1) * vocab * sizeof(float));
    assert_non_null(out);
    int id = kvcache_seq_new(decoder_ws_cache(ws));
    int32_t ids[512];
    memcpy(ids, prompt, n * sizeof(*ids));
    uint32_t off[2] = {0, (uint32_t)n};
    struct decoder_batch b = {.n = 1, .seqs = &id, .ids = ids, .offsets = off};
    const float *lg;
    for (size_t g = 0; g < n_tok; g++) {
        assert_int_equal(decoder_step(dec, ws, &b, &lg), MODEL_OK);
        memcpy(out + g * vocab, lg, vocab * sizeof(float));
        ids[0] = toks[g];
        off[1] = 1;
    }
    decoder_ws_destroy(ws);
    return out;
}

static int32_t argmax(const float *lg, double *gap)
{
    int32_t best = 0;
    for (size_t v = 1; v < vocab; v++)
        if (lg[v] > lg[best]) best = (int32_t)v;
    double second = -INFINITY;
    for (size_t v = 0; v < vocab; v++)
        if ((int32_t)v != best && lg[v] > second) second = lg[v];
    *gap = (double)lg[best] - second;
    return best;
}

/* The margin rule against reference logits ref (n_ref steps) for job j:
 * at each step the run's token must be the reference's choice, unless
 * the choice is fragile there - greedy: the two largest logits within
 * MARGIN; sampled: the job's draw within SMARGIN of a boundary of the
 * cumulative walk, or top-k's cut within MARGIN - where the comparison
 * stops. Log-probabilities agree within LPTOL. Returns the steps
 * checked; n_ref when the whole run was. */
#define SMARGIN 1e-5
#define LPTOL 1e-4
static size_t check_run(const struct job *j, const struct out *o, const float *ref, size_t n_ref)
{
    static struct gen_scratch *sc;
    if (!sc) sc = gen_scratch_new(vocab);
    struct gen_rng rng;
    gen_rng_seed(&rng, j->r.seed);
    const struct gen_sampling *sp = &j->r.sampling;
    for (size_t i = 0; i < n_ref && i < o->n; i++) {
        const float *lg = ref + i * vocab;
        int32_t want;
        if (sp->temperature == 0) {
            double gap;
            want = argmax(lg, &gap);
            if (gap <= MARGIN) return i;
        } else {
            struct gen_rng r2 = rng;
            double u = gen_rng_uniform(&r2);
            size_t m = gen_filter(lg, vocab, sp, sc);
            const uint32_t *ids = gen_scratch_ids(sc);
            double acc = 0, near = 1;
            for (size_t k = 0; k < m; k++) {
                acc += gen_scratch_prob(sc, ids[k]);
                if (fabs(u - acc) < near) near = fabs(u - acc);
            }
            if (near < SMARGIN) return i;
            if (sp->top_k && sp->top_k < vocab) { /* the k-th and next logits */
                float *c = malloc(vocab * sizeof(float));
                memcpy(c, lg, vocab * sizeof(float));
                for (size_t a = 0; a <= sp->top_k; a++) /* partial selection sort */
                    for (size_t b2 = a + 1; b2 < vocab; b2++)
                        if (c[b2] > c[a]) {
                            float t = c[a];
                            c[a] = c[b2];
                            c[b2] = t;
                        }
                double cut = (double)c[sp->top_k - 1] - c[sp->top_k];
                free(c);
                if (cut <= MARGIN) return i;
            }
            want = gen_sample(lg, vocab, sp, &rng, sc, NULL);
        }
        if (o->tokens[i] != want)
            fail_msg("step %zu: token %d, the reference's %d", i, o->tokens[i], want);
        double lp = gen_logprob(lg, vocab, want);
        if (fabs(lp - o->lp[i]) > LPTOL)
            fail_msg("step %zu: logprob %g, the reference's %g", i, (double)o->lp[i], lp);
    }
    return n_ref;
}

/* got and want (a run of the same job) agree by the margin rule against
 * the reference along want's tokens; when no step was fragile, they are
 * the same in everything. Returns the steps checked. */
static size_t agree(const struct job *j, const struct out *want, const struct out *got)
{
    same_stream(want);
    same_stream(got);
    float *ref = ref_logits(j->prompt, j->n, want->tokens, want->n);
    size_t a = check_run(j, want, ref, want->n), b = check_run(j, got, ref, want->n);
    free(ref);
    if (a == want->n && b == want->n) {
        assert_int_equal(got->status, want->status);
        assert_int_equal(got->finish, want->finish);
        assert_int_equal(got->n, want->n);
        assert_memory_equal(got->tokens, want->tokens, want->n * sizeof(int32_t));
        assert_int_equal(got->text_len, want->text_len);
        assert_memory_equal(got->text, want->text, want->text_len);
    }
    return a < b ? a : b;
}

/* ---- the tests ------------------------------------------------------------ */

static size_t total_tokens(const struct out *o, size_t n)
{
    size_t t = 0;
    for (size_t i = 0; i < n; i++) t += o[i].n;
    return t;
}

/* 1 when a and b are the same bit for bit. */
static int identical(const struct out *a, const struct out *b)
{
    return a->n == b->n && a->finish == b->finish &&
           !memcmp(a->tokens, b->tokens, a->n * sizeof(int32_t)) &&
           !memcmp(a->lp, b->lp, a->n * sizeof(float)) && a->text_len == b->text_len &&
           !memcmp(a->text, b->text, a->text_len);
}

/* (1) 32 greedy jobs alone vs together agree by the margin rule; and a
 * job alone is exactly a plain decoder_step loop (the same steps). */
static void test_batch_invariance(void **state)
{
    (void)state;
    enum { N = 32 };
    static struct job jobs[N];
    static struct out alone[N], together[N];
    for (size_t i = 0; i < N; i++) job_init(&jobs[i], 1, 40, 1 + tu_rand64() % 30);
    struct gen_engine_conf c = conf_of(N, 512, 600, 16);
    run_alone(&c, jobs, N, alone);
    run_together(&c, jobs, N, together, NULL);
    size_t checked = 0, same = 0;
    double worst = 0;
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(alone[i].status, GEN_OK);
        assert_int_equal(alone[i].finish, GEN_FINISH_LENGTH);
        assert_int_equal(alone[i].n, jobs[i].r.max_tokens);
        assert_int_equal(alone[i].prompt_tokens, jobs[i].n);
        assert_true(alone[i].ttft >= 0);
        checked += agree(&jobs[i], &alone[i], &together[i]);
        same += (size_t)identical(&alone[i], &together[i]);
        for (size_t g = 0; g < alone[i].n && g < together[i].n; g++) {
            if (alone[i].tokens[g] != together[i].tokens[g]) break;
            double dl = fabs((double)alone[i].lp[g] - together[i].lp[g]);
            if (dl > worst) worst = dl;
        }
        float *ref = ref_logits(jobs[i].prompt, jobs[i].n, alone[i].tokens, alone[i].n);
        for (size_t g = 0; g < alone[i].n; g++) {
            double gap;
            assert_int_equal(argmax(ref + g * vocab, &gap), alone[i].tokens[g]);
            float lp = gen_logprob(ref + g * vocab, vocab, alone[i].tokens[g]);
            assert_memory_equal(&lp, &alone[i].lp[g], sizeof(float));
        }
        free(ref);
    }
    printf("test_batch_invariance: %zu of %zu tokens checked by the margin rule; %zu of %d "
           "jobs bit for bit the same alone and in the batch; log-probabilities differ by up to "
           "%.3g\n",
           checked, total_tokens(alone, N), same, N, worst);
    assert_true(checked * 2 >= total_tokens(alone, N));
}

/* (2) a cache too small for every job at once: preemption, the same
 * outputs (greedy and sampled, mixed priorities). */
static void test_preemption(void **state)
{
    (void)state;
    enum { N = 12 };
    static struct job jobs[N];
    static struct out alone[N], together[N];
    for (size_t i = 0; i < N; i++) {
        job_init(&jobs[i], 5, 30, 20 + tu_rand64() % 20);
        if (i % 2) { /* half of them sampled */
            jobs[i].r.sampling.temperature = 0.9f;
            jobs[i].r.sampling.top_k = 20;
        }
        jobs[i].r.priority = (int)(i % 3);
    }
    struct gen_engine_conf c = conf_of(N, 64, 40, 4); /* 160 token slots */
    run_alone(&c, jobs, N, alone);
    uint64_t pre = 0;
    run_together(&c, jobs, N, together, &pre);
    unsigned seen = 0;
    size_t checked = 0;
    for (size_t i = 0; i < N; i++) {
        seen += together[i].preempt;
        checked += agree(&jobs[i], &alone[i], &together[i]);
    }
    printf("test_preemption: %llu preemptions; %zu of %zu tokens checked\n",
           (unsigned long long)pre, checked, total_tokens(alone, N));
    assert_true(pre > 0);
    assert_int_equal(seen, pre);
    assert_true(checked * 2 >= total_tokens(alone, N));
    /* long prompts read 8 tokens a step (6 sequences) into 120 slots: prompts stall
     * half read and give their blocks back */
    for (size_t i = 0; i < N; i++) job_init(&jobs[i], 25, 45, 30 + tu_rand64() % 20);
    c = conf_of(6, 8, 30, 4); /* 120 slots */
    run_alone(&c, jobs, N, alone);
    run_together(&c, jobs, N, together, &pre);
    checked = 0;
    for (size_t i = 0; i < N; i++) checked += agree(&jobs[i], &alone[i], &together[i]);
    printf("test_preemption: long prompts: %llu preemptions; %zu of %zu tokens checked\n",
           (unsigned long long)pre, checked, total_tokens(alone, N));
    assert_true(pre > 0);
    assert_true(checked * 2 >= total_tokens(alone, N));
}

/* (3) seeds: the same seed the same tokens, alone or in any batch;
 * another seed other tokens. */
static void test_seeds(void **state)
{
    (void)state;
    enum { N = 16 };
    static struct job jobs[N];
    static struct out alone[N], together[N], again[N], twice[N];
    for (size_t i = 0; i < N; i++) {
        job_init(&jobs[i], 3, 30, 30);
        jobs[i].r.sampling.temperature = 0.8f + 0.1f * (float)(i % 4);
        jobs[i].r.sampling.top_k = 10 + (uint32_t)(i % 3) * 15;
    }
    jobs[1] = jobs[0]; /* the same job twice in one batch */
    jobs[1].r.prompt = jobs[1].prompt;
    jobs[2] = jobs[0]; /* and with another seed */
    jobs[2].r.prompt = jobs[2].prompt;
    jobs[2].r.seed = jobs[0].r.seed + 1;
    struct gen_engine_conf c = conf_of(N, 256, 300, 16);
    run_alone(&c, jobs, N, alone);
    run_together(&c, jobs, N, together, NULL);
    run_together(&c, jobs, N, twice, NULL);
    c.max_seqs = 5; /* other batch compositions */
    c.max_batch_tokens = 9;
    run_together(&c, jobs, N, again, NULL);
    size_t checked = 0;
    for (size_t i = 0; i < N; i++) {
        checked += agree(&jobs[i], &alone[i], &together[i]);
        checked += agree(&jobs[i], &alone[i], &again[i]);
        assert_true(identical(&together[i], &twice[i])); /* the same run again */
    }
    checked += agree(&jobs[0], &together[0], &together[1]); /* twins in one batch */
    printf("test_seeds: %zu of %zu tokens checked\n", checked,
           2 * total_tokens(alone, N) + together[0].n);
    assert_true(checked * 2 >= 2 * total_tokens(alone, N) + together[0].n);
    assert_true(together[0].n != together[2].n ||
                memcmp(together[0].tokens, together[2].tokens, together[0].n * 4) != 0);
}

/* (7) a long prompt read in chunks of a few tokens agrees with one read. */
static void test_chunked_prefill(void **state)
{
    (void)state;
    struct job j[3];
    static struct out one[3], chunked[3];
    for (int i = 0; i < 3; i++) job_init(&j[i], 100, 250, 16);
    struct gen_engine_conf c = conf_of(3, 512, 100, 16);
    run_together(&c, j, 3, one, NULL);
    c.max_batch_tokens = 5; /* every prompt over many steps, mixed with decodes */
    run_together(&c, j, 3, chunked, NULL);
    size_t checked = 0;
    for (int i = 0; i < 3; i++) checked += agree(&j[i], &one[i], &chunked[i]);
    assert_true(checked * 2 >= total_tokens(one, 3));
}

/* Finishes one job alone through c. */
static void one_job(const struct gen_engine_conf *c, struct job *j, struct out *o)
{
    run_alone(c, j, 1, o);
}

/* (4) every finish reason. */
static void test_finish_reasons(void **state)
{
    (void)state;
    struct gen_engine_conf c = conf_of(4, 256, 100, 16);
    struct job j;
    static struct out ref, o;
    /* a long enough text to find stop strings and end ids in */
    for (int tries = 0;; tries++) {
        assert_true(tries < 50);
        job_init(&j, 3, 10, 60);
        one_job(&c, &j, &ref);
        if (ref.text_len >= 12) break;
    }
    assert_int_equal(ref.finish, GEN_FINISH_LENGTH);
    assert_int_equal(ref.n, 60);
    /* eos: the first generated id that did not come before, as an end id */
    size_t at = 5;
    while (at < ref.n) {
        size_t k = 0;
        while (k < at && ref.tokens[k] != ref.tokens[at]) k++;
        if (k == at) break;
        at++;
    }
    if (at < ref.n) {
        int32_t end[2] = {(int32_t)(vocab + 5 > 0 ? 1 : 0), ref.tokens[at]};
        end[0] = ref.tokens[at] == 1 ? 2 : 1;
        int seen_end0 = 0;
        for (size_t k = 0; k < at; k++) seen_end0 |= ref.tokens[k] == end[0];
        if (!seen_end0) {
            j.r.end_ids = end;
            j.r.n_end = 2;
            one_job(&c, &j, &o);
            assert_int_equal(o.status, GEN_OK);
            assert_int_equal(o.finish, GEN_FINISH_EOS);
            assert_int_equal(o.n, at);
            assert_memory_equal(o.tokens, ref.tokens, at * sizeof(int32_t));
            same_stream(&o);
            j.r.n_end = 0;
        }
    }
    /* stop: three bytes from the middle of the text (on a character
     * boundary); the text ends before their first occurrence */
    size_t p = ref.text_len / 2, q;
    for (;; p++) {
        assert_true(p + 3 < ref.text_len);
        while (p > 0 && ((unsigned char)ref.text[p] & 0xC0) == 0x80) p--;
        q = p + 3;
        while (q < ref.text_len && ((unsigned char)ref.text[q] & 0xC0) == 0x80) q++;
        if (!memchr(ref.text + p, 0, q - p)) break;
    }
    char stop[64];
    snprintf(stop, sizeof(stop), "%.*s", (int)(q - p), ref.text + p);
    const char *first = memmem(ref.text, ref.text_len, stop, strlen(stop));
    assert_non_null(first);
    j.r.stop[0] = "\xe2\x80\x94never-there";
    j.r.stop[1] = stop;
    j.r.n_stop = 2;
    one_job(&c, &j, &o);
    assert_int_equal(o.finish, GEN_FINISH_STOP);
    assert_int_equal(o.text_len, (size_t)(first - ref.text));
    assert_memory_equal(o.text, ref.text, o.text_len);
    same_stream(&o);
    assert_true(o.n <= ref.n);
    assert_memory_equal(o.tokens, ref.tokens, o.n * sizeof(int32_t));
    j.r.n_stop = 0;
    /* length by max_tokens */
    j.r.max_tokens = 7;
    one_job(&c, &j, &o);
    assert_int_equal(o.finish, GEN_FINISH_LENGTH);
    assert_int_equal(o.n, 7);
    assert_memory_equal(o.tokens, ref.tokens, 7 * sizeof(int32_t));
    /* length by the context: prompt + generated = max_ctx */
    struct gen_engine_conf cc = c;
    cc.max_ctx = j.n + 9;
    j.r.max_tokens = 100;
    one_job(&cc, &j, &o);
    assert_int_equal(o.finish, GEN_FINISH_LENGTH);
    assert_int_equal(o.n, 9);
    /* deadline: passes after the third token */
    fake_now = 1000;
    j.r.deadline_ms = 2000;
    struct gen_engine *e = engine(&c);
    submit(e, &j, &o);
    int steps = 0;
    while (!o.done) {
        if (++steps == 4) fake_now = 2000; /* three steps, three tokens */
        gen_engine_step(e);
    }
    assert_int_equal(o.status, GEN_OK);
    assert_int_equal(o.finish, GEN_FINISH_DEADLINE);
    assert_int_equal(o.n, 3);
    assert_memory_equal(o.tokens, ref.tokens, 3 * sizeof(int32_t));
    same_stream(&o);
    /* deadline passed before the first token: deadline_exceeded, while a
     * job without one runs */
    static struct out o2;
    struct job j2 = j;
    j2.r.prompt = j2.prompt;
    j2.r.deadline_ms = 0;
    j2.r.max_tokens = 2;
    submit(e, &j, &o);
    submit(e, &j2, &o2);
    fake_now = 2500;
    drain(e);
    assert_int_equal(o.status, GEN_DEADLINE_EXCEEDED);
    assert_int_equal(o.n, 0);
    assert_int_equal(o.text_len, 0);
    assert_int_equal(o2.status, GEN_OK);
    assert_int_equal(o2.n, 2);
    /* a failed step changes nothing: stepping again gives the same job
     * (on the CPU backend, whose injected fault is not sticky) */
    if (strcmp(backend, "cpu") != 0) goto abort;
    j2.r.max_tokens = 5;
    submit(e, &j2, &o2);
    assert_true(gen_engine_step(e) > 0);
    decoder_ws_inject_fault(gen_engine_ws(e));
    assert_true(gen_engine_step(e) < 0);
    assert_true(strlen(gen_engine_error(e)) > 0);
    assert_int_equal(gen_engine_running(e), 1);
    assert_int_equal(o2.done, 0);
    drain(e);
    assert_int_equal(o2.status, GEN_OK);
    assert_int_equal(o2.n, 5);
    assert_memory_equal(o2.tokens, ref.tokens, 5 * sizeof(int32_t));
abort:
    /* abort reports everything left */
    submit(e, &j2, &o2);
    gen_engine_abort(e, "the device failed");
    assert_int_equal(o2.status, GEN_FAILED);
    assert_int_equal(gen_engine_waiting(e) + gen_engine_running(e), 0);
    gen_engine_destroy(e);
    fake_now = 0;
}

/* (5) prompts that can never run are refused at submit, with why. */
static void test_refused(void **state)
{
    (void)state;
    struct gen_engine_conf c = conf_of(2, 64, 8, 4); /* 32 token slots */
    c.max_ctx = 48;
    struct gen_engine *e = engine(&c);
    struct job j;
    struct out o;
    char why[256];
    job_init(&j, 33, 33, 4);
    j.r.user = &o;
    assert_int_equal(gen_engine_submit(e, &j.r, why, sizeof(why)), GEN_EINVAL);
    assert_non_null(strstr(why, "cache"));
    c.kv_bytes *= 4;
    gen_engine_destroy(e);
    e = engine(&c);
    j.r.n_prompt = 48; /* prompt + 1 over the context */
    assert_int_equal(gen_engine_submit(e, &j.r, why, sizeof(why)), GEN_EINVAL);
    assert_non_null(strstr(why, "context"));
    j.r.n_prompt = 0;
    assert_int_equal(gen_engine_submit(e, &j.r, why, sizeof(why)), GEN_EINVAL);
    j.r.n_prompt = 5;
    j.prompt[2] = (int32_t)vocab;
    assert_int_equal(gen_engine_submit(e, &j.r, why, sizeof(why)), GEN_EINVAL);
    assert_non_null(strstr(why, "vocabulary"));
    j.prompt[2] = 3;
    j.r.max_tokens = 0;
    assert_int_equal(gen_engine_submit(e, &j.r, why, sizeof(why)), GEN_EINVAL);
    j.r.max_tokens = 4;
    j.r.sampling.top_p = 1.5f;
    assert_int_equal(gen_engine_submit(e, &j.r, why, sizeof(why)), GEN_EINVAL);
    j.r.sampling.top_p = 1;
    j.r.stop[0] = "";
    j.r.n_stop = 1;
    assert_int_equal(gen_engine_submit(e, &j.r, why, sizeof(why)), GEN_EINVAL);
    j.r.n_stop = 0;
    assert_int_equal(gen_engine_waiting(e), 0);
    /* a prompt that fits the cache but cannot grow past it: length */
    c.kv_bytes /= 4;
    c.max_ctx = 0;
    gen_engine_destroy(e);
    e = engine(&c);
    j.r.n_prompt = 30;
    j.r.max_tokens = 10;
    submit(e, &j, &o);
    drain(e);
    assert_int_equal(o.finish, GEN_FINISH_LENGTH);
    assert_int_equal(o.n, 3); /* 32 slots hold the prompt and two; the third is sampled */
    c.kv_bytes *= 4;
    c.max_ctx = 48;
    gen_engine_destroy(e);
    e = engine(&c);
    /* the longest that fits runs, up to the context */
    j.r.n_prompt = 47;
    j.r.max_tokens = 10;
    submit(e, &j, &o);
    drain(e);
    assert_int_equal(o.finish, GEN_FINISH_LENGTH);
    assert_int_equal(o.n, 1);
    gen_engine_destroy(e);
}

/* (6) the waiting queue holds max_waiting requests; preempted sequences
 * do not take its places. */
static void test_bounded(void **state)
{
    (void)state;
    struct gen_engine_conf c = conf_of(2, 16, 12, 4);
    c.max_waiting = 4;
    struct gen_engine *e = engine(&c);
    static struct job j[8];
    static struct out o[8];
    char why[256];
    for (int i = 0; i < 4; i++) {
        job_init(&j[i], 10, 14, 12);
        submit(e, &j[i], &o[i]);
    }
    job_init(&j[4], 4, 4, 4);
    j[4].r.user = &o[4];
    assert_int_equal(gen_engine_submit(e, &j[4].r, why, sizeof(why)), GEN_EFULL);
    assert_int_equal(gen_engine_waiting(e), 4);
    gen_engine_step(e); /* two admitted: two places free */
    assert_int_equal(gen_engine_running(e), 2);
    for (int i = 4; i < 6; i++) {
        job_init(&j[i], 10, 14, 12);
        submit(e, &j[i], &o[i]);
    }
    assert_int_equal(gen_engine_submit(e, &j[4].r, why, sizeof(why)), GEN_EFULL);
    for (int s = 0; s < 100000 && gen_engine_step(e) > 0; s++) {
        assert_true(gen_engine_running(e) <= 2);
        assert_true(gen_engine_waiting(e) <= 4 + 2);
    }
    for (int i = 0; i < 6; i++) assert_int_equal(o[i].done, 1);
    gen_engine_destroy(e);
}

static int setup(void **state)
{
    (void)state;
    char err[512];
    if (!mkdtemp(dir)) return -1;
    if (decoder_write_demo(dir, 2, 32, 4, 2, 64, tu_rand64(), err, sizeof(err)) < 0) {
        fprintf(stderr, "demo: %s\n", err);
        return -1;
    }
    struct model_runtime_conf c;
    model_runtime_conf_defaults(&c);
    c.backend = backend;
    rt = model_runtime_new(&c, err, sizeof(err));
    if (!rt) {
        fprintf(stderr, "runtime: %s\n", err);
        return -1;
    }
    struct model_spec spec = {0};
    snprintf(spec.name, sizeof(spec.name), "demo");
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    dec = decoder_load(rt, &spec, err, sizeof(err));
    tok = dec ? tokenizer_load(dir, NULL, err, sizeof(err)) : NULL;
    if (!tok) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    vocab = decoder_info(dec)->vocab;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tokenizer_destroy(tok);
    decoder_destroy(dec);
    model_runtime_destroy(rt);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* (8) shared prefixes. */
static void run_shared(const struct gen_engine_conf *c, struct job *jobs, size_t n,
                       struct out *o, uint64_t *shared, uint64_t *preemptions)
{
    struct gen_engine *e = engine(c);
    for (size_t i = 0; i < n; i++) submit(e, &jobs[i], &o[i]);
    drain(e);
    *shared = gen_engine_shared_tokens(e);
    *preemptions = gen_engine_preemptions(e);
    gen_engine_destroy(e);
    for (size_t i = 0; i < n; i++) assert_int_equal(o[i].done, 1);
}

static void test_shared_prefix(void **state)
{
    (void)state;
    enum { N = 16 };
    static struct job jobs[N];
    static struct out alone[N], shared_out[N];
    int32_t prefix[37];
    for (size_t i = 0; i < 37; i++) prefix[i] = (int32_t)(3 + tu_rand64() % (vocab - 3));
    for (size_t i = 0; i < N; i++) {
        job_init(&jobs[i], 1, 20, 8 + tu_rand64() % 12);
        size_t pre = i == 0 ? 12 : 37; /* job 0: only the prefix's first 12 */
        size_t own = i == 1 ? 0 : jobs[i].n; /* job 1: the prefix alone */
        memmove(jobs[i].prompt + pre, jobs[i].prompt, own * sizeof(int32_t));
        memcpy(jobs[i].prompt, prefix, pre * sizeof(int32_t));
        jobs[i].n = pre + own;
        jobs[i].r.n_prompt = jobs[i].n;
        if (i % 3 == 2) {
            jobs[i].r.sampling.temperature = 0.8f;
            jobs[i].r.sampling.top_p = 0.9f;
        }
    }
    jobs[N - 1] = jobs[N - 2]; /* the same job twice */
    jobs[N - 1].r.prompt = jobs[N - 1].prompt;
    struct gen_engine_conf c = conf_of(4, 64, 200, 4); /* four at a time: later ones share */
    run_alone(&c, jobs, N, alone);
    c.prefix_sharing = 1;
    uint64_t shared = 0, pre = 0;
    run_shared(&c, jobs, N, shared_out, &shared, &pre);
    size_t checked = 0;
    for (size_t i = 0; i < N; i++) checked += agree(&jobs[i], &alone[i], &shared_out[i]);
    printf("test_shared_prefix: %llu prompt tokens found in the cache; %zu of %zu tokens "
           "checked\n", (unsigned long long)shared, checked, total_tokens(alone, N));
    /* each of the 12 jobs after the first wave skips at least the 36
     * prefix tokens of its 9 full blocks (the all-prefix job 8) */
    assert_true(shared >= 12 * 32);
    assert_true(checked * 2 >= total_tokens(alone, N));
    /* a cache of 30 blocks for 6 at a time: preempted jobs come back to
     * their own idle blocks, evicted ones compute them again */
    c = conf_of(6, 16, 30, 4);
    c.prefix_sharing = 1;
    run_shared(&c, jobs, N, shared_out, &shared, &pre);
    checked = 0;
    for (size_t i = 0; i < N; i++) checked += agree(&jobs[i], &alone[i], &shared_out[i]);
    printf("test_shared_prefix: small cache: %llu preemptions, %llu tokens found; %zu of %zu "
           "tokens checked\n", (unsigned long long)pre, (unsigned long long)shared, checked,
           total_tokens(alone, N));
    assert_true(pre > 0);
    assert_true(shared > 0);
    assert_true(checked * 2 >= total_tokens(alone, N));
}

/* (9) overlap. Jobs whose ends come from every side (an end id and a
 * stop string found in a first run's output, max_tokens, the context,
 * jobs waiting for a slot) run with chained steps and without; the
 * outputs are the same bit for bit (the chained steps compute the same
 * rows, plus rows of jobs that ended, which nothing reads; the contexts
 * stay under the 256 positions past which a step of few rows splits its
 * attention, by a rule that counts those rows too). On the CUDA
 * backend steps were chained and left in flight between calls; on the
 * CPU none are. */
static void run_overlap(const struct gen_engine_conf *c, struct job *jobs, size_t n,
                        struct out *o, uint64_t *chained, size_t *in_flight)
{
    struct gen_engine *e = engine(c);
    for (size_t i = 0; i < n; i++) submit(e, &jobs[i], &o[i]);
    int left, steps = 0;
    *in_flight = 0;
    while ((left = gen_engine_step(e)) > 0) {
        assert_true(++steps < 100000);
        *in_flight += decoder_ws_in_flight(gen_engine_ws(e)) > 0;
        assert_true(decoder_ws_in_flight(gen_engine_ws(e)) <= 1);
    }
    assert_int_equal(left, 0);
    *chained = gen_engine_overlapped(e);
    check_path(e, 0);
    gen_engine_destroy(e);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(o[i].done, 1);
        same_stream(&o[i]);
    }
}

static void test_overlap(void **state)
{
    (void)state;
    enum { N = 12 };
    static struct job jobs[N];
    static struct out first[N], on[N], off[N];
    static char stops[N][64];
    static int32_t ends[N];
    for (size_t i = 0; i < N; i++) {
        if (i % 3 == 2) /* prompt + max_tokens past the context of 40 */
            job_init(&jobs[i], 20, 30, 30 + tu_rand64() % 10);
        else
            job_init(&jobs[i], 2, 30, 12 + tu_rand64() % 30);
        if (i % 2) {
            jobs[i].r.sampling.temperature = 0.9f;
            jobs[i].r.sampling.top_p = 0.95f;
        }
    }
    struct gen_engine_conf c = conf_of(5, 128, 200, 8); /* five at a time: admissions wait */
    c.overlap = 0;
    c.max_ctx = 40; /* some jobs end by the context */
    uint64_t chained;
    size_t flying;
    run_overlap(&c, jobs, N, first, &chained, &flying);
    assert_true(chained == 0 && flying == 0);
    /* ends: an end id from the middle of jobs 0, 3, 6...; a stop string
     * of the text's middle bytes (on a character boundary) for jobs 1,
     * 4, 7...; the rest run to max_tokens or the context */
    for (size_t i = 0; i < N; i++) {
        const struct out *f = &first[i];
        if (i % 3 == 0 && f->n > 4) {
            ends[i] = f->tokens[f->n / 2];
            jobs[i].r.end_ids = &ends[i];
            jobs[i].r.n_end = 1;
        } else if (i % 3 == 1 && f->text_len > 8) {
            size_t p = f->text_len / 2, q;
            while (p > 0 && ((unsigned char)f->text[p] & 0xC0) == 0x80) p--;
            q = p + 2;
            while (q < f->text_len && ((unsigned char)f->text[q] & 0xC0) == 0x80) q++;
            if (q <= f->text_len && !memchr(f->text + p, 0, q - p)) {
                snprintf(stops[i], sizeof(stops[i]), "%.*s", (int)(q - p), f->text + p);
                jobs[i].r.stop[0] = stops[i];
                jobs[i].r.n_stop = 1;
            }
        }
    }
    run_overlap(&c, jobs, N, off, &chained, &flying);
    assert_true(chained == 0 && flying == 0);
    c.overlap = 1;
    run_overlap(&c, jobs, N, on, &chained, &flying);
    size_t eos = 0, stop = 0, ctx = 0, checked = 0;
    for (size_t i = 0; i < N; i++) {
#ifndef KINFER_EMU
        /* a real GPU's GEMMs may sum a batch with ended rows in it in
         * another order: there the margin rule */
        if (!strcmp(backend, "cuda")) {
            checked += agree(&jobs[i], &off[i], &on[i]);
            continue;
        }
#endif
        assert_true(identical(&on[i], &off[i]));
        checked += on[i].n;
        assert_int_equal(on[i].status, off[i].status);
        eos += on[i].finish == GEN_FINISH_EOS;
        stop += on[i].finish == GEN_FINISH_STOP;
        ctx += on[i].finish == GEN_FINISH_LENGTH && on[i].n < jobs[i].r.max_tokens;
    }
    printf("test_overlap: %llu chained steps, %zu calls returned with one in flight; %zu jobs "
           "ended by an end id, %zu by a stop string, %zu by the context\n",
           (unsigned long long)chained, flying, eos, stop, ctx);
    assert_true(checked * 2 >= total_tokens(off, N));
    assert_true(eos > 0 && stop > 0 && ctx > 0);
    if (!strcmp(backend, "cuda")) {
        assert_true(chained > 0);
        assert_true(flying > 0);
    } else {
        assert_true(chained == 0 && flying == 0);
    }
}

int main(void)
{
    tu_seed("test_gen_engine");
#ifndef KINFER_EMU
    const char *b = getenv("KINFER_TEST_BACKEND");
    if (b && !strcmp(b, "cuda")) backend = "cuda";
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_preemption),       cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_chunked_prefill),  cmocka_unit_test(test_finish_reasons),
        cmocka_unit_test(test_refused),          cmocka_unit_test(test_bounded),
        cmocka_unit_test(test_shared_prefix),    cmocka_unit_test(test_overlap),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* engine.c - continuous batching of generation requests over one
 * decoder workspace (engine.h says what it does).
 *
 * A request becomes a sequence: ids holds its prompt then the tokens it
 * generated (the end id never), computed how many of them the cache
 * holds. A sequence whose ids are all in the cache but the last sampled
 * one is decoding (one new token a step); one with more to read is
 * reading its prompt (a chunk a step). Preemption frees the cache and sets
 * computed to 0: the whole of ids is read again, and sampling resumes
 * where it was.
 *
 * Threads: the executor thread that made the engine, callbacks included.
 * Ownership: every buffer here is the engine's. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"

struct gen_seq {
    void *user;
    struct gen_sampling sp;
    struct gen_rng rng;
    size_t max_tokens;
    struct gen_stops stops;
    char *stop_mem;
    int32_t end_ids[GEN_MAX_END_IDS];
    size_t n_end;
    int want_lp, priority;
    int64_t deadline;
    uint64_t arrival;
    int32_t *ids;        /* prompt, then generated */
    size_t n_ids, cap_ids, n_prompt, n_gen;
    float *lp;           /* cap_ids - n_prompt entries when asked */
    double *tms;
    struct gen_detok dt;
    size_t dt_ctx;       /* prompt ids the decoding starts after */
    char *text;
    size_t text_len, text_cap, searched, streamed;
    int cid;             /* cache id, -1 while waiting */
    size_t computed;     /* ids in the cache */
    size_t keyed;        /* full blocks published (or shared) so far */
    uint64_t key;        /* the chained key of the last of them */
    size_t take;         /* ids this step reads */
    double submit_ms, first_ms;
    unsigned preempt;
};

struct gen_engine {
    const struct decoder *d;
    const struct tokenizer *tok;
    struct decoder_ws *ws;
    struct kvcache *kv;
    struct gen_engine_conf conf;
    struct gen_engine_cb cb;
    size_t vocab, ctx, bt;
    struct gen_seq **waiting; /* max_waiting + max_seqs (preempted always fit) */
    size_t n_waiting, n_fresh; /* n_fresh: those that came by submit, not preemption */
    struct gen_seq **running; /* max_seqs */
    size_t n_running;
    struct gen_seq **order;   /* scratch: a step's running, best first */
    /* A step's batch, two of them: while one is in flight chained (fly
     * its index, -1: none), the next may be prepared in the other. */
    struct gen_batch {
        size_t n;
        int *seqs;
        int32_t *ids;
        uint32_t *off;
        struct gen_seq **of;            /* each row's sequence; NULL once it ended */
        struct decoder_sample *samp;    /* with a device sampler: each row's parameters */
        struct decoder_pick *pick;      /* and its pick */
        struct gen_rng *rng;            /* each row's stream after its draw (kept if it ran) */
    } batch[2];
    int fly;
    uint64_t overlapped;      /* chained steps submitted */
    uint64_t chain_refused;   /* chained steps the decoder refused */
    struct gen_scratch *scratch;
    uint64_t arrivals, preemptions, shared_tokens;
    uint32_t *match;          /* scratch: blocks an admission found */
    char err[256];
};

const char *gen_finish_name(enum gen_finish f)
{
    switch (f) {
    case GEN_FINISH_EOS: return "eos";
    case GEN_FINISH_STOP: return "stop";
    case GEN_FINISH_LENGTH: return "length";
    case GEN_FINISH_DEADLINE: return "deadline";
    default: return "";
    }
}

static double now_ms(const struct gen_engine *e)
{
    if (e->conf.clock_ms) return e->conf.clock_ms(e->conf.clock_arg);
    return (double)clock_mono_us() / 1000.0;
}

static void seq_free(struct gen_seq *s)
{
    if (!s) return;
    free(s->stop_mem);
    free(s->ids);
    free(s->lp);
    free(s->tms);
    free(s->text);
    gen_detok_free(&s->dt);
    free(s);
}

struct gen_engine *gen_engine_new(const struct decoder *d, const struct tokenizer *tok,
                                  unsigned slot, const struct gen_engine_conf *conf,
                                  const struct gen_engine_cb *cb, char *errstr,
                                  size_t errstr_size)
{
    const struct decoder_info *in = decoder_info(d);
    if (!cb || !cb->on_done || !tok) {
        snprintf(errstr, errstr_size, "generation engine: a tokenizer and on_done are required");
        return NULL;
    }
    if (conf->max_waiting < 1 || conf->max_waiting > (1u << 20) || conf->max_seqs < 1 ||
        conf->max_batch_tokens < conf->max_seqs) {
        snprintf(errstr, errstr_size,
                 "generation engine: max_waiting must be in [1, 1048576], max_seqs >= 1 and "
                 "max_batch_tokens >= max_seqs (got %zu, %zu, %zu)",
                 conf->max_waiting, conf->max_seqs, conf->max_batch_tokens);
        return NULL;
    }
    if (tok && tokenizer_vocab_size(tok) > in->vocab) {
        snprintf(errstr, errstr_size,
                 "generation engine: the tokenizer's %zu ids exceed the model's vocabulary of %zu",
                 tokenizer_vocab_size(tok), in->vocab);
        return NULL;
    }
    struct gen_engine *e = calloc(1, sizeof(*e));
    if (!e) goto nomem;
    e->d = d;
    e->tok = tok;
    e->conf = *conf;
    e->cb = *cb;
    e->vocab = in->vocab;
    e->ctx = conf->max_ctx && conf->max_ctx < in->context ? conf->max_ctx : in->context;
    struct decoder_ws_conf wc = {.max_seqs = conf->max_seqs,
                                 .max_tokens = conf->max_batch_tokens,
                                 .max_ctx = e->ctx,
                                 .block_tokens = conf->block_tokens,
                                 .kv_bytes = conf->kv_bytes,
                                 .all_logits = 0};
    e->ws = decoder_ws_new(d, slot, &wc, errstr, errstr_size);
    if (!e->ws) goto fail;
    e->kv = decoder_ws_cache(e->ws);
    e->bt = kvcache_block_tokens(e->kv);
    size_t nw = conf->max_waiting + conf->max_seqs, ns = conf->max_seqs;
    e->waiting = calloc(nw, sizeof(*e->waiting));
    e->running = calloc(ns, sizeof(*e->running));
    e->order = calloc(ns, sizeof(*e->order));
    e->match = calloc(kvcache_table_width(e->kv), sizeof(*e->match));
    e->scratch = gen_scratch_new(e->vocab);
    e->fly = -1;
    if (!e->waiting || !e->running || !e->order || !e->match || !e->scratch) goto nomem;
    for (int i = 0; i < 2; i++) {
        struct gen_batch *b = &e->batch[i];
        if (!(b->seqs = calloc(ns, sizeof(*b->seqs))) || !(b->of = calloc(ns, sizeof(*b->of))) ||
            !(b->off = calloc(ns + 1, sizeof(*b->off))) ||
            !(b->ids = calloc(conf->max_batch_tokens, sizeof(*b->ids))))
            goto nomem;
        if (decoder_ws_samples(e->ws) &&
            (!(b->samp = calloc(ns, sizeof(*b->samp))) ||
             !(b->pick = calloc(ns, sizeof(*b->pick))) || !(b->rng = calloc(ns, sizeof(*b->rng)))))
            goto nomem;
    }
    return e;
nomem:
    snprintf(errstr, errstr_size, "generation engine: out of memory");
fail:
    gen_engine_destroy(e);
    return NULL;
}

void gen_engine_destroy(struct gen_engine *e)
{
    if (!e) return;
    for (size_t i = 0; i < e->n_waiting; i++) seq_free(e->waiting[i]);
    for (size_t i = 0; i < e->n_running; i++) seq_free(e->running[i]);
    decoder_ws_destroy(e->ws);
    free(e->waiting);
    free(e->running);
    free(e->order);
    for (int i = 0; i < 2; i++) {
        struct gen_batch *b = &e->batch[i];
        free(b->seqs);
        free(b->of);
        free(b->off);
        free(b->ids);
        free(b->samp);
        free(b->pick);
        free(b->rng);
    }
    free(e->match);
    gen_scratch_destroy(e->scratch);
    free(e);
}

size_t gen_engine_waiting(const struct gen_engine *e) { return e->n_waiting; }
size_t gen_engine_running(const struct gen_engine *e) { return e->n_running; }
uint64_t gen_engine_preemptions(const struct gen_engine *e) { return e->preemptions; }
uint64_t gen_engine_shared_tokens(const struct gen_engine *e) { return e->shared_tokens; }
uint64_t gen_engine_overlapped(const struct gen_engine *e) { return e->overlapped; }
uint64_t gen_engine_chain_refused(const struct gen_engine *e) { return e->chain_refused; }
const char *gen_engine_error(const struct gen_engine *e) { return e->err; }
struct decoder_ws *gen_engine_ws(struct gen_engine *e) { return e->ws; }

static size_t blocks_for(const struct gen_engine *e, size_t tokens)
{
    return (tokens + e->bt - 1) / e->bt;
}

int gen_engine_submit(struct gen_engine *e, const struct gen_request *r, char *why,
                      size_t why_size)
{
    if (r->n_prompt == 0 || !r->prompt) {
        snprintf(why, why_size, "the prompt has no tokens");
        return GEN_EINVAL;
    }
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || (size_t)r->prompt[i] >= e->vocab) {
            snprintf(why, why_size, "prompt token %zu is id %ld, outside the vocabulary of %zu",
                     i, (long)r->prompt[i], e->vocab);
            return GEN_EINVAL;
        }
    if (r->n_prompt + 1 > e->ctx) {
        snprintf(why, why_size,
                 "the prompt has %zu tokens: with one generated token that exceeds the "
                 "context of %zu",
                 r->n_prompt, e->ctx);
        return GEN_EINVAL;
    }
    if (blocks_for(e, r->n_prompt) > kvcache_total_blocks(e->kv)) {
        snprintf(why, why_size,
                 "the prompt has %zu tokens, more than the key/value cache holds (%zu)",
                 r->n_prompt, kvcache_total_blocks(e->kv) * e->bt);
        return GEN_EINVAL;
    }
    if (r->max_tokens < 1) {
        snprintf(why, why_size, "max_tokens must be at least 1");
        return GEN_EINVAL;
    }
    if (gen_sampling_check(&r->sampling, why, why_size) < 0) return GEN_EINVAL;
    if (r->n_stop > GEN_MAX_STOPS || r->n_end > GEN_MAX_END_IDS) {
        snprintf(why, why_size, "at most %d stop strings and %d end ids", GEN_MAX_STOPS,
                 GEN_MAX_END_IDS);
        return GEN_EINVAL;
    }
    size_t stop_bytes = 0;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t n = r->stop[i] ? strlen(r->stop[i]) : 0;
        if (n == 0) {
            snprintf(why, why_size, "stop string %zu is empty", i);
            return GEN_EINVAL;
        }
        stop_bytes += n + 1;
    }
    if (e->n_fresh >= e->conf.max_waiting) {
        snprintf(why, why_size, "the waiting queue is full (%zu requests)", e->conf.max_waiting);
        return GEN_EFULL;
    }
    struct gen_seq *s = calloc(1, sizeof(*s));
    if (!s) goto nomem;
    size_t room = e->ctx - r->n_prompt; /* tokens it may generate */
    if (r->max_tokens < room) room = r->max_tokens;
    s->cap_ids = r->n_prompt + room;
    s->ids = malloc(s->cap_ids * sizeof(*s->ids));
    s->tms = malloc(room * sizeof(*s->tms));
    s->lp = r->logprobs ? malloc(room * sizeof(*s->lp)) : NULL;
    s->text_cap = 64;
    s->text = malloc(s->text_cap);
    s->stop_mem = stop_bytes ? malloc(stop_bytes) : NULL;
    if (!s->ids || !s->tms || (r->logprobs && !s->lp) || !s->text || (stop_bytes && !s->stop_mem))
        goto nomem;
    s->text[0] = '\0';
    char *at = s->stop_mem;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t n = strlen(r->stop[i]);
        memcpy(at, r->stop[i], n + 1);
        gen_stops_add(&s->stops, at, n);
        at += n + 1;
    }
    memcpy(s->ids, r->prompt, r->n_prompt * sizeof(*s->ids));
    s->n_ids = s->n_prompt = r->n_prompt;
    for (size_t i = 0; i < r->n_end; i++) s->end_ids[s->n_end++] = r->end_ids[i];
    s->user = r->user;
    s->sp = r->sampling;
    gen_rng_seed(&s->rng, r->seed);
    s->max_tokens = r->max_tokens;
    s->want_lp = r->logprobs != 0;
    s->priority = r->priority;
    s->deadline = r->deadline_ms;
    s->arrival = e->arrivals++;
    s->dt_ctx = r->n_prompt < GEN_DETOK_CONTEXT ? r->n_prompt : GEN_DETOK_CONTEXT;
    gen_detok_init(&s->dt, s->dt_ctx);
    s->cid = -1;
    s->submit_ms = now_ms(e);
    s->first_ms = -1;
    e->waiting[e->n_waiting++] = s;
    e->n_fresh++;
    return 0;
nomem:
    seq_free(s);
    snprintf(why, why_size, "out of memory taking the request");
    return GEN_ENOMEM;
}

/* ---- finishing -------------------------------------------------------------- */

static void emit(struct gen_engine *e, struct gen_seq *s, size_t upto)
{
    if (e->cb.on_piece && upto > s->streamed) {
        e->cb.on_piece(e->cb.arg, s->user, s->text + s->streamed, upto - s->streamed);
        s->streamed = upto;
    }
}

/* Looks for a stop string in the text the last tokens added: 1 when one
 * was found (the text then ends before it). */
static int find_stop(struct gen_seq *s)
{
    if (s->stops.n == 0) return 0;
    long p = gen_stops_find(&s->stops, s->text, s->text_len, s->searched);
    s->searched = s->text_len;
    if (p < 0) return 0;
    s->text_len = (size_t)p;
    s->text[p] = '\0';
    return 1;
}

/* Removes s from whichever list holds it. */
static void unlink_seq(struct gen_engine *e, struct gen_seq *s)
{
    struct gen_seq **list = s->cid >= 0 ? e->running : e->waiting;
    size_t *n = s->cid >= 0 ? &e->n_running : &e->n_waiting;
    for (size_t i = 0; i < *n; i++)
        if (list[i] == s) {
            memmove(list + i, list + i + 1, (*n - i - 1) * sizeof(*list));
            (*n)--;
            break;
        }
    if (s->cid < 0 && s->preempt == 0) e->n_fresh--; /* preempted ones are not counted */
    if (s->cid >= 0) kvcache_seq_free(e->kv, s->cid); /* a step in flight may still write its
                                                         blocks: later steps run after it */
    s->cid = -1;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < e->batch[k].n; i++)
            if (e->batch[k].of[i] == s) e->batch[k].of[i] = NULL;
}

static void finish(struct gen_engine *e, struct gen_seq *s, enum gen_status st,
                   enum gen_finish f, const char *error)
{
    if (st == GEN_OK && f != GEN_FINISH_STOP) {
        const int32_t *win = s->ids + s->n_prompt - s->dt_ctx;
        if (gen_detok_flush(&s->dt, e->tok, win, s->dt_ctx + s->n_gen, &s->text, &s->text_len,
                            &s->text_cap) >= 0 &&
            find_stop(s))
            f = GEN_FINISH_STOP;
    }
    if (st == GEN_OK) emit(e, s, s->text_len);
    struct gen_result r = {
        .user = s->user,
        .status = st,
        .finish = st == GEN_OK ? f : GEN_FINISH_NONE,
        .text = s->text,
        .text_len = s->text_len,
        .tokens = s->ids + s->n_prompt,
        .n_tokens = s->n_gen,
        .logprobs = s->want_lp ? s->lp : NULL,
        .token_ms = s->tms,
        .prompt_tokens = s->n_prompt,
        .completion_tokens = s->n_gen,
        .submit_ms = s->submit_ms,
        .ttft_ms = s->first_ms >= 0 ? s->first_ms - s->submit_ms : -1,
        .preemptions = s->preempt,
        .error = error,
    };
    unlink_seq(e, s);
    e->cb.on_done(e->cb.arg, &r);
    seq_free(s);
}

void gen_engine_abort(struct gen_engine *e, const char *why)
{
    if (e->fly >= 0) { /* whatever it computed is dropped */
        (void)decoder_step_collect(e->d, e->ws, e->batch[e->fly].pick);
        e->batch[e->fly].n = 0;
        e->fly = -1;
    }
    while (e->n_running) finish(e, e->running[e->n_running - 1], GEN_FAILED, 0, why);
    while (e->n_waiting) finish(e, e->waiting[e->n_waiting - 1], GEN_FAILED, 0, why);
}

/* ---- scheduling ------------------------------------------------------------- */

/* Running order: priority (higher first), then arrival. The last is the
 * one preempted first. */
static int run_cmp(const void *a, const void *b)
{
    const struct gen_seq *x = *(struct gen_seq *const *)a, *y = *(struct gen_seq *const *)b;
    if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
    return x->arrival < y->arrival ? -1 : x->arrival > y->arrival;
}

/* Admission order: priority, then deadline (none last), then arrival. */
static int wait_cmp(const void *a, const void *b)
{
    const struct gen_seq *x = *(struct gen_seq *const *)a, *y = *(struct gen_seq *const *)b;
    if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
    int64_t dx = x->deadline ? x->deadline : INT64_MAX, dy = y->deadline ? y->deadline : INT64_MAX;
    if (dx != dy) return dx < dy ? -1 : 1;
    return x->arrival < y->arrival ? -1 : x->arrival > y->arrival;
}

/* Gives s's blocks back and puts it in waiting to read all its ids again. */
static void preempt(struct gen_engine *e, struct gen_seq *s)
{
    for (size_t i = 0; i < e->n_running; i++)
        if (e->running[i] == s) {
            memmove(e->running + i, e->running + i + 1,
                    (e->n_running - i - 1) * sizeof(*e->running));
            e->n_running--;
            break;
        }
    kvcache_seq_free(e->kv, s->cid);
    s->cid = -1;
    s->computed = 0;
    s->keyed = 0;
    s->key = 0;
    s->take = 0;
    s->preempt++;
    e->preemptions++;
    e->waiting[e->n_waiting++] = s;
}

/* The most of k tokens s can read with avail blocks not yet taken. */
static size_t fit(const struct gen_engine *e, const struct gen_seq *s, size_t k, size_t avail)
{
    size_t len = s->computed, slack = blocks_for(e, len) * e->bt - len;
    size_t room = slack + avail * e->bt;
    return k < room ? k : room;
}

/* Chooses this step's tokens (each sequence's take); returns how many
 * sequences read something. */
static size_t schedule(struct gen_engine *e)
{
    size_t budget = e->conf.max_batch_tokens, reserved = 0, nb = 0;
    size_t n = e->n_running;
    memcpy(e->order, e->running, n * sizeof(*e->order));
    qsort(e->order, n, sizeof(*e->order), run_cmp);
    for (size_t i = 0; i < n; i++) e->order[i]->take = 0;
    /* decoding sequences first, one token each (max_batch_tokens >=
     * max_seqs: the budget always holds them) */
    for (size_t i = 0; i < n; i++) {
        struct gen_seq *s = e->order[i];
        if (s->cid < 0 || s->n_ids - s->computed != 1) continue;
        while (fit(e, s, 1, kvcache_free_blocks(e->kv) - reserved) == 0) {
            /* it needs a block: the worst other running sequence not yet
             * given a token gives its blocks back, else this one does */
            size_t v = n;
            while (v > i + 1 && e->order[v - 1]->cid < 0) v--;
            if (v > i + 1) {
                preempt(e, e->order[v - 1]);
            } else if (e->n_running == 1) {
                finish(e, s, GEN_OK, GEN_FINISH_LENGTH, NULL); /* the cache is too small */
                return nb;
            } else {
                preempt(e, s);
                break;
            }
        }
        if (s->cid < 0) continue;
        s->take = 1;
        reserved += kvcache_blocks_needed(e->kv, s->cid, 1);
        budget--;
        nb++;
    }
    /* then the prompts being read, a chunk each while the budget and the
     * free blocks last */
    for (size_t i = 0; i < n && budget > 0; i++) {
        struct gen_seq *s = e->order[i];
        if (s->cid < 0 || s->n_ids - s->computed < 2) continue;
        size_t need = s->n_ids - s->computed;
        size_t k = fit(e, s, need < budget ? need : budget, kvcache_free_blocks(e->kv) - reserved);
        if (k == 0) continue;
        s->take = k;
        reserved += kvcache_blocks_needed(e->kv, s->cid, k);
        budget -= k;
        nb++;
    }
    /* admissions */
    qsort(e->waiting, e->n_waiting, sizeof(*e->waiting), wait_cmp);
    while (e->n_waiting && budget > 0 && e->n_running < e->conf.max_seqs) {
        struct gen_seq *s = e->waiting[0];
        if (blocks_for(e, s->n_ids) > kvcache_total_blocks(e->kv)) {
            /* preempted after growing past what the whole cache holds */
            finish(e, s, GEN_OK, GEN_FINISH_LENGTH, NULL);
            continue;
        }
        /* the blocks of its leading ids the cache holds already (never
         * the last id's: its logits are needed) */
        uint64_t key = 0;
        size_t m = 0, idle = 0;
        while (e->conf.prefix_sharing && (m + 1) * e->bt < s->n_ids) {
            uint64_t k = kvcache_key(key, s->ids + m * e->bt, e->bt);
            long b = kvcache_find(e->kv, k, s->ids + m * e->bt);
            if (b < 0) break;
            idle += (size_t)kvcache_block_idle(e->kv, (uint32_t)b);
            e->match[m++] = (uint32_t)b;
            key = k;
        }
        size_t avail = kvcache_free_blocks(e->kv) - reserved;
        if (idle + blocks_for(e, s->n_ids) - m > avail) break;
        int cid = kvcache_seq_new(e->kv);
        if (cid < 0) break;
        for (size_t j = 0; j < m; j++) kvcache_share(e->kv, cid, e->match[j]); /* checked above */
        memmove(e->waiting, e->waiting + 1, (e->n_waiting - 1) * sizeof(*e->waiting));
        e->n_waiting--;
        if (s->preempt == 0) e->n_fresh--; /* a preempted one was not counted */
        s->cid = cid;
        s->computed = m * e->bt;
        s->keyed = m;
        s->key = key;
        e->shared_tokens += m * e->bt;
        size_t left = s->n_ids - s->computed;
        s->take = left < budget ? left : budget;
        reserved += kvcache_blocks_needed(e->kv, cid, s->take);
        budget -= s->take;
        e->running[e->n_running++] = s;
        nb++;
    }
    return nb;
}

/* ---- the step --------------------------------------------------------------- */

static int is_end(const struct gen_seq *s, int32_t id)
{
    for (size_t i = 0; i < s->n_end; i++)
        if (s->end_ids[i] == id) return 1;
    return 0;
}

/* s read all its ids: its next token is id (-1: its logits had no
 * finite value), lp its log-probability when asked. */
static void advance(struct gen_engine *e, struct gen_seq *s, int32_t id, float lp, double t)
{
    if (id < 0) {
        finish(e, s, GEN_FAILED, 0, "the model's logits are not finite");
        return;
    }
    if (s->first_ms < 0) s->first_ms = t;
    if (is_end(s, id)) {
        finish(e, s, GEN_OK, GEN_FINISH_EOS, NULL);
        return;
    }
    size_t g = s->n_gen++;
    s->ids[s->n_ids++] = id;
    s->tms[g] = t;
    if (s->want_lp) s->lp[g] = lp;
    const int32_t *win = s->ids + s->n_prompt - s->dt_ctx;
    if (gen_detok_step(&s->dt, e->tok, win, s->dt_ctx + s->n_gen, &s->text, &s->text_len,
                       &s->text_cap) < 0) {
        finish(e, s, GEN_FAILED, 0, "decoding the generated tokens failed");
        return;
    }
    if (find_stop(s)) {
        finish(e, s, GEN_OK, GEN_FINISH_STOP, NULL);
        return;
    }
    if (s->n_gen >= s->max_tokens || s->n_ids >= e->ctx) {
        finish(e, s, GEN_OK, GEN_FINISH_LENGTH, NULL);
        return;
    }
    emit(e, s, gen_stops_settled(&s->stops, s->text, s->text_len));
}

/* Ends every request whose deadline passed by now. */
static void deadlines(struct gen_engine *e, double now)
{
    for (int pass = 0; pass < 2; pass++) {
        struct gen_seq **list = pass ? e->waiting : e->running;
        size_t *n = pass ? &e->n_waiting : &e->n_running;
        for (size_t i = *n; i-- > 0;) {
            struct gen_seq *s = list[i];
            if (!s->deadline || now < (double)s->deadline) continue;
            if (s->n_gen == 0)
                finish(e, s, GEN_DEADLINE_EXCEEDED, 0, NULL);
            else
                finish(e, s, GEN_OK, GEN_FINISH_DEADLINE, NULL);
        }
    }
}

/* Each row's parameters and draw, taken from a copy of the job's stream
 * that replaces it once the step ran (one draw per sampled token, as
 * gen_sample takes it). */
static void sample_row(struct gen_batch *b, size_t i, const struct gen_seq *s,
                       const struct gen_rng *from, int on)
{
    struct decoder_sample *r = &b->samp[i];
    b->rng[i] = *from;
    *r = (struct decoder_sample){.temperature = s->sp.temperature, .top_k = s->sp.top_k,
                                 .top_p = s->sp.top_p, .min_p = s->sp.min_p, .on = on,
                                 .logprob = s->want_lp};
    if (on && s->sp.temperature > 0) r->u = gen_rng_uniform(&b->rng[i]);
}

/* Whether the step in b (submitted, not yet collected) may be followed
 * by a chained one at once: every running sequence is in it and picks
 * there, none will end by length with that pick, none waits to be
 * admitted while a slot is free, and the cache has the next token's
 * blocks. A sequence may still end with an end id or a stop string: its
 * row of the chained step is then computed and dropped. */
static int can_chain(const struct gen_engine *e, const struct gen_batch *b)
{
    if (!e->conf.overlap || !decoder_ws_overlaps(e->ws) || b->n != e->n_running ||
        (e->n_waiting && e->n_running < e->conf.max_seqs))
        return 0;
    size_t need = 0;
    for (size_t i = 0; i < b->n; i++) {
        const struct gen_seq *s = b->of[i];
        size_t k = b->off[i + 1] - b->off[i];
        if (!s || s->computed + k != s->n_ids || s->n_gen + 1 >= s->max_tokens ||
            s->n_ids + 1 >= e->ctx)
            return 0;
        need += kvcache_blocks_needed(e->kv, s->cid, 1);
    }
    return need <= kvcache_free_blocks(e->kv);
}

/* Submits the step after from, chained (its ids are from's picks, on
 * the device), into the other batch. 0, or a negative MODEL_* code. */
static int chain(struct gen_engine *e, const struct gen_batch *from)
{
    struct gen_batch *b = &e->batch[from == &e->batch[0]];
    b->n = from->n;
    b->off[0] = 0;
    for (size_t i = 0; i < b->n; i++) {
        struct gen_seq *s = from->of[i];
        b->of[i] = s;
        b->seqs[i] = s->cid;
        b->off[i + 1] = (uint32_t)(i + 1);
        sample_row(b, i, s, &from->rng[i], 1);
    }
    struct decoder_batch db = {.n = b->n, .seqs = b->seqs, .ids = NULL, .offsets = b->off};
    int rc = decoder_step_submit(e->d, e->ws, &db, b->samp, 1);
    if (rc < 0) {
        b->n = 0;
        return rc;
    }
    e->overlapped++;
    e->fly = (int)(b - e->batch);
    return 0;
}

/* The step of b ran: its sequences grow by their tokens, and each that
 * read all its ids takes its next token (logits: from the host's
 * sampler, else b's picks). */
static void absorb(struct gen_engine *e, struct gen_batch *b, const float *logits)
{
    double t = now_ms(e);
    for (size_t i = 0; i < b->n; i++) {
        struct gen_seq *s = b->of[i];
        if (!s) continue; /* it ended while the step was in flight */
        s->computed += b->off[i + 1] - b->off[i];
        s->take = 0;
        /* its newly full blocks, findable by later sequences */
        for (; e->conf.prefix_sharing && (s->keyed + 1) * e->bt <= s->computed; s->keyed++) {
            s->key = kvcache_key(s->key, s->ids + s->keyed * e->bt, e->bt);
            kvcache_publish(e->kv, s->cid, s->keyed, s->key, s->ids + s->keyed * e->bt);
        }
        if (s->computed != s->n_ids) continue;
        int32_t id;
        float lp = 0;
        if (logits) {
            struct gen_rng *r = s->sp.temperature > 0 ? &s->rng : NULL;
            id = gen_sample(logits + i * e->vocab, e->vocab, &s->sp, r, e->scratch,
                            s->want_lp ? &lp : NULL);
        } else {
            s->rng = b->rng[i];
            id = b->pick[i].id;
            lp = b->pick[i].logprob;
        }
        advance(e, s, id, lp, t);
    }
    b->n = 0;
}

/* Collects the step in flight in b, chaining the next one first when it
 * may; with rows of b, chained or not, ended meanwhile dropped. */
static int collect(struct gen_engine *e, struct gen_batch *b)
{
    int chained = 0;
    if (can_chain(e, b)) {
        /* a refused chain (a graph that could not be recorded, say) only
         * costs the overlap: the step in flight is collected as it is */
        chained = chain(e, b) == 0;
        e->chain_refused += !chained;
    }
    int rc = decoder_step_collect(e->d, e->ws, b->pick);
    if (rc < 0) {
        /* the device failed: the steps in flight are lost with it */
        snprintf(e->err, sizeof(e->err), "%s", decoder_ws_error(e->ws));
        for (size_t i = 0; i < e->n_running; i++) e->running[i]->take = 0;
        e->batch[0].n = e->batch[1].n = 0;
        e->fly = -1;
        return rc;
    }
    if (!chained) e->fly = -1;
    absorb(e, b, NULL);
    if (e->fly >= 0) {
        /* every row of the chained step ended already: nothing to wait for */
        struct gen_batch *c = &e->batch[e->fly];
        size_t live = 0;
        for (size_t i = 0; i < c->n; i++) live += c->of[i] != NULL;
        if (live == 0) {
            e->fly = -1;
            rc = decoder_step_collect(e->d, e->ws, c->pick);
            c->n = 0;
            if (rc < 0) {
                snprintf(e->err, sizeof(e->err), "%s", decoder_ws_error(e->ws));
                return rc;
            }
        }
    }
    return 0;
}

int gen_engine_step(struct gen_engine *e)
{
    deadlines(e, now_ms(e));
    if (e->fly >= 0) {
        /* a chained step is in flight: collect it (chaining the next) */
        int rc = collect(e, &e->batch[e->fly]);
        if (rc < 0) return rc;
        if (e->fly >= 0) return (int)(e->n_waiting + e->n_running);
    }
    size_t nb;
    for (;;) {
        nb = schedule(e);
        if (nb > 0 || e->n_running == 0) break;
        /* every running sequence is stalled reading its prompt (the blocks
         * went to others): the worst gives its blocks back, or a lone one
         * that cannot grow ends */
        memcpy(e->order, e->running, e->n_running * sizeof(*e->order));
        qsort(e->order, e->n_running, sizeof(*e->order), run_cmp);
        struct gen_seq *w = e->order[e->n_running - 1];
        if (e->n_running == 1)
            finish(e, w, GEN_OK, GEN_FINISH_LENGTH, NULL);
        else
            preempt(e, w);
    }
    if (nb == 0) return (int)(e->n_waiting + e->n_running);
    /* the sequences that read one token (decode tokens, a prompt's last
     * token) first, then the chunks, each in running order: the backend
     * may answer the lone tokens' attention apart from the chunks'
     * (bk_seqs.lone). Every row of b (samp, pick, logits) follows this
     * order through b->of. */
    struct gen_batch *b = &e->batch[0];
    size_t k = 0, tok = 0;
    b->off[0] = 0;
    for (int chunks = 0; chunks < 2; chunks++)
        for (size_t i = 0; i < e->n_running; i++) {
            struct gen_seq *s = e->running[i];
            if (s->take == 0 || (s->take > 1) != chunks) continue;
            memcpy(b->ids + tok, s->ids + s->computed, s->take * sizeof(*b->ids));
            tok += s->take;
            b->seqs[k] = s->cid;
            b->of[k] = s;
            b->off[++k] = (uint32_t)tok;
        }
    b->n = k;
    struct decoder_batch db = {.n = k, .seqs = b->seqs, .ids = b->ids, .offsets = b->off};
    const float *logits = NULL;
    int rc;
    if (b->samp) {
        for (size_t i = 0; i < k; i++) {
            struct gen_seq *s = b->of[i];
            sample_row(b, i, s, &s->rng, s->computed + s->take == s->n_ids);
        }
        rc = decoder_step_submit(e->d, e->ws, &db, b->samp, 0);
        if (rc == MODEL_OK) { /* a failed collect has said why and dropped the steps */
            rc = collect(e, b);
            return rc < 0 ? rc : (int)(e->n_waiting + e->n_running);
        }
    } else {
        rc = decoder_step(e->d, e->ws, &db, &logits);
    }
    if (rc != MODEL_OK) {
        snprintf(e->err, sizeof(e->err), "%s", decoder_ws_error(e->ws));
        for (size_t i = 0; i < e->n_running; i++) e->running[i]->take = 0;
        b->n = 0;
        return rc;
    }
    absorb(e, b, logits);
    return (int)(e->n_waiting + e->n_running);
}

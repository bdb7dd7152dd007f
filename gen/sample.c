/* sample.c - the next token from a decoder's logits (sample.h).
 *
 * Cost. A vocabulary is 32k to 150k tokens and a step samples every
 * running sequence, so nothing here sorts the whole vocabulary unless it
 * must: top-k selects its k in linear time, and top-p sorts only the most
 * likely tokens, 64 first and four times as many each time those do not
 * yet reach p. */
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct gen_scratch {
    size_t cap;
    uint32_t *idx; /* candidate token ids */
    double *p;     /* their scaled logits, then probabilities (by token id) */
};

void gen_sampling_defaults(struct gen_sampling *sp)
{
    sp->temperature = 0.0f;
    sp->top_k = 0;
    sp->top_p = 1.0f;
    sp->min_p = 0.0f;
}

int gen_sampling_check(const struct gen_sampling *sp, char *why, size_t why_size)
{
    if (!(sp->temperature >= 0.0f) || !isfinite(sp->temperature)) {
        snprintf(why, why_size, "temperature must be a number >= 0, got %g",
                 (double)sp->temperature);
        return -1;
    }
    if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f)) {
        snprintf(why, why_size, "top_p must be in (0, 1], got %g", (double)sp->top_p);
        return -1;
    }
    if (!(sp->min_p >= 0.0f && sp->min_p < 1.0f)) {
        snprintf(why, why_size, "min_p must be in [0, 1), got %g", (double)sp->min_p);
        return -1;
    }
    return 0;
}

/* ---- the random stream: xoshiro256** (Blackman and Vigna), seeded by
 * splitmix64 so that every 64-bit seed, 0 included, gives a good state. */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void gen_rng_seed(struct gen_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t gen_rng_next(struct gen_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double gen_rng_uniform(struct gen_rng *r)
{
    return (double)(gen_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- scratch ------------------------------------------------------------- */

struct gen_scratch *gen_scratch_new(size_t cap)
{
    struct gen_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->cap = cap;
    s->idx = malloc((cap ? cap : 1) * sizeof(*s->idx));
    s->p = malloc((cap ? cap : 1) * sizeof(*s->p));
    if (!s->idx || !s->p) {
        gen_scratch_destroy(s);
        return NULL;
    }
    return s;
}

void gen_scratch_destroy(struct gen_scratch *s)
{
    if (!s) return;
    free(s->idx);
    free(s->p);
    free(s);
}

/* ---- helpers ------------------------------------------------------------- */

/* The largest finite logit's index (the lowest among equals), or -1. */
static long argmax_finite(const float *l, size_t n)
{
    long best = -1;
    for (size_t i = 0; i < n; i++)
        if (isfinite(l[i]) && (best < 0 || l[i] > l[best])) best = (long)i;
    return best;
}

float gen_logprob(const float *logits, size_t n, int32_t id)
{
    long m = argmax_finite(logits, n);
    if (m < 0 || id < 0 || (size_t)id >= n || !isfinite(logits[id])) return NAN;
    double mx = logits[m], sum = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(logits[i])) sum += exp((double)logits[i] - mx);
    return (float)((double)logits[id] - mx - log(sum));
}

/* Orders candidate a before b: the higher value first, the lower id among
 * equals, so every selection and sort below is deterministic. */
static int before(const double *v, uint32_t a, uint32_t b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

static void swap_idx(uint32_t *x, size_t i, size_t j)
{
    uint32_t t = x[i];
    x[i] = x[j];
    x[j] = t;
}

/* Rearranges idx[0..n) so that its first k are the k first in `before`
 * order (in no particular order among themselves): quickselect, Lomuto's
 * partition around a median of three. Keys never tie (ids differ). */
static void select_top(uint32_t *idx, size_t n, size_t k, const double *v)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2, last = hi - 1;
        if (before(v, idx[mid], idx[lo])) swap_idx(idx, mid, lo);
        if (before(v, idx[last], idx[lo])) swap_idx(idx, last, lo);
        if (before(v, idx[mid], idx[last])) swap_idx(idx, mid, last);
        /* The median is now at last: the pivot. */
        uint32_t pivot = idx[last];
        size_t store = lo;
        for (size_t i = lo; i < last; i++)
            if (before(v, idx[i], pivot)) swap_idx(idx, i, store++);
        swap_idx(idx, store, last);
        /* idx[lo..store) come before the pivot (at store), the rest after. */
        if (k == store || k == store + 1) return;
        if (k < store)
            hi = store;
        else
            lo = store + 1;
    }
}

/* Sorts idx[0..n) in `before` order. qsort has no context argument, and a
 * scratch belongs to one thread, so the values go through a thread-local. */
static _Thread_local const double *tl_v;
static int by_before(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return before(tl_v, x, y) ? -1 : before(tl_v, y, x) ? 1 : 0;
}

static void sort_top(uint32_t *idx, size_t n, const double *v)
{
    tl_v = v;
    qsort(idx, n, sizeof(*idx), by_before);
}

/* ---- sampling ------------------------------------------------------------ */

size_t gen_filter(const float *logits, size_t n, const struct gen_sampling *sp,
                  struct gen_scratch *s)
{
    if (n == 0 || !s || n > s->cap) return 0;
    long am = argmax_finite(logits, n);
    if (am < 0) return 0;
    double *v = s->p;
    if (sp->temperature == 0.0f) {
        s->idx[0] = (uint32_t)am;
        v[am] = 1.0;
        return 1;
    }

    /* The candidates: every finite logit, scaled by the temperature. */
    double inv_t = 1.0 / (double)sp->temperature;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(logits[i])) continue;
        v[i] = (double)logits[i] * inv_t;
        s->idx[m++] = (uint32_t)i;
    }
    if (sp->top_k > 0 && sp->top_k < m) {
        select_top(s->idx, m, sp->top_k, v);
        m = sp->top_k;
    }

    /* Probabilities of what is left (its largest logit is the argmax). */
    double mx = v[am], sum = 0.0;
    for (size_t i = 0; i < m; i++) sum += (v[s->idx[i]] = exp(v[s->idx[i]] - mx));
    for (size_t i = 0; i < m; i++) v[s->idx[i]] /= sum;

    if (sp->top_p < 1.0f) {
        /* Sort just enough of the most likely to reach p: a token stays
         * while the tokens more likely than it hold less than p. */
        size_t want = 64;
        for (;;) {
            if (want >= m) want = m;
            if (want < m) select_top(s->idx, m, want, v);
            sort_top(s->idx, want, v);
            double cum = 0.0;
            size_t keep = 0;
            while (keep < want && (keep == 0 || cum < (double)sp->top_p)) cum += v[s->idx[keep++]];
            if (cum >= (double)sp->top_p || want == m) {
                m = keep;
                break;
            }
            want *= 4;
        }
    }
    if (sp->min_p > 0.0f) {
        /* At least min_p times as likely as the most likely: the ratio is
         * the same before and after renormalizing, and the argmax stays. */
        double floor = (double)sp->min_p * v[am];
        size_t keep = 0;
        for (size_t i = 0; i < m; i++)
            if (v[s->idx[i]] >= floor) s->idx[keep++] = s->idx[i];
        m = keep;
    }
    double mass = 0.0;
    for (size_t i = 0; i < m; i++) mass += v[s->idx[i]];
    for (size_t i = 0; i < m; i++) v[s->idx[i]] /= mass;
    return m;
}

const uint32_t *gen_scratch_ids(const struct gen_scratch *s)
{
    return s->idx;
}

double gen_scratch_prob(const struct gen_scratch *s, uint32_t id)
{
    return s->p[id];
}

int32_t gen_sample(const float *logits, size_t n, const struct gen_sampling *sp,
                   struct gen_rng *r, struct gen_scratch *s, float *logprob)
{
    struct gen_sampling greedy;
    if (!r && sp->temperature != 0.0f) {
        greedy = *sp;
        greedy.temperature = 0.0f;
        sp = &greedy;
    }
    size_t m = gen_filter(logits, n, sp, s);
    if (m == 0) return -1;
    int32_t id = (int32_t)s->idx[m - 1];
    if (sp->temperature != 0.0f) {
        /* One draw per sampled token (even when one token is left, so a
         * job's stream advances with its tokens alone), walked over the
         * kept tokens in the filter's order. */
        double u = gen_rng_uniform(r), acc = 0.0;
        for (size_t i = 0; i < m; i++) {
            acc += s->p[s->idx[i]];
            if (u < acc) {
                id = (int32_t)s->idx[i];
                break;
            }
        }
    }
    if (logprob) *logprob = gen_logprob(logits, n, id);
    return id;
}

/* backend_cpu_kv.c - the CPU backend's decoding primitives (backend.h):
 * SwiGLU, storing keys and values in the paged cache, and attention of
 * new tokens over it. Plain loops in float32 with the dot products and
 * the softmax's sum in double; the cache, the block tables, positions
 * and sequence ids are host memory here, so every index is checked
 * before it is used and a bad one refuses the call.
 *
 * Threads and ownership: as backend_cpu.c (a context's calls on its
 * executor thread; the scratch is the caller's). */
#include "backend_cpu_kv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

__attribute__((format(printf, 2, 3)))
static int kv_refuse(void *cp, const char *fmt, ...)
{
    struct cpu_ctx *c = cp;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    return MODEL_EINVAL;
}

int cpu_swiglu(void *cp, void *yp, const void *xp, size_t rows, size_t w)
{
    (void)cp;
    float *y = yp;
    const float *x = xp;
    for (size_t r = 0; r < rows; r++) {
        const float *g = x + r * 2 * w, *u = g + w;
        float *o = y + r * w;
        for (size_t j = 0; j < w; j++) {
            double a = g[j];
            double silu = a >= 0 ? a / (1.0 + exp(-a)) : a * exp(a) / (1.0 + exp(a));
            o[j] = (float)(silu * (double)u[j]);
        }
    }
    return 0;
}

/* The cache row (kv_heads x dh floats) of sequence seq's position pos,
 * or -1 when the table or the pool does not hold it. */
static long kv_slot(const struct bk_kv *kv, uint32_t seq, uint32_t pos)
{
    size_t b = pos / kv->block_tokens;
    if (b >= kv->table_w) return -1;
    uint32_t block = kv->tables[(size_t)seq * kv->table_w + b];
    if (block >= kv->blocks) return -1;
    return (long)((size_t)block * kv->block_tokens + pos % kv->block_tokens);
}

int cpu_kv_store(void *cp, const struct bk_kv *kv, const void *kp, size_t ldk, const void *vp,
                 size_t ldv, const struct bk_seqs *s)
{
    if (!kv || !kv->k || !kv->v || !kv->tables || !kv->block_tokens || !kv->kv_heads ||
        !kv->dh || !s)
        return kv_refuse(cp, "kv_store: no cache");
    size_t row = kv->kv_heads * kv->dh;
    const float *k = kp, *v = vp;
    float *K = kv->k, *V = kv->v;
    for (size_t t = 0; t < s->tokens; t++) {
        long slot = kv_slot(kv, s->seq[t], s->pos[t]);
        if (slot < 0)
            return kv_refuse(cp, "kv_store: token %zu (sequence %u, position %u) has no block",
                             t, s->seq[t], s->pos[t]);
        memcpy(K + (size_t)slot * row, k + t * ldk, row * sizeof(float));
        memcpy(V + (size_t)slot * row, v + t * ldv, row * sizeof(float));
    }
    return 0;
}

/* One score per cached position of the longest context. */
size_t cpu_paged_attention_scratch(void *be, size_t max_tokens, size_t max_ctx, size_t heads)
{
    (void)be;
    (void)max_tokens;
    (void)heads;
    return (max_ctx ? max_ctx : 1) * sizeof(float);
}

/* Per new token and head: the scores over its sequence's positions 0 ..
 * pos (block by block through the table), softmax shifted by their max,
 * then the weighted sum of the values. */
int cpu_paged_attention(void *cp, const struct bk_paged_attention *a)
{
    const struct bk_kv *kv = a->kv;
    const struct bk_seqs *s = a->s;
    if (!kv || !s || !a->heads || !kv->kv_heads || a->heads % kv->kv_heads || !kv->dh ||
        !kv->block_tokens || !a->scratch)
        return kv_refuse(cp, "paged attention: %zu heads over %zu cache heads", a->heads,
                         kv ? kv->kv_heads : 0);
    size_t dh = kv->dh, group = a->heads / kv->kv_heads, row = kv->kv_heads * dh;
    const float *K = kv->k, *V = kv->v;
    float *sc = a->scratch;
    for (size_t t = 0; t < s->tokens; t++) {
        uint32_t seq = s->seq[t], pos = s->pos[t];
        if (pos >= a->max_ctx)
            return kv_refuse(cp, "paged attention: position %u past the context of %zu", pos,
                             a->max_ctx);
        for (uint32_t j = 0; j <= pos; j++)
            if (kv_slot(kv, seq, j) < 0)
                return kv_refuse(cp, "paged attention: sequence %u has no block for position %u",
                                 seq, j);
        for (size_t h = 0; h < a->heads; h++) {
            const float *q = (const float *)a->q + t * a->ldq + h * dh;
            size_t g = h / group;
            float mx = -INFINITY;
            for (uint32_t j = 0; j <= pos; j++) {
                const float *k = K + (size_t)kv_slot(kv, seq, j) * row + g * dh;
                double d = 0.0;
                for (size_t e = 0; e < dh; e++) d += (double)q[e] * k[e];
                sc[j] = (float)(d * a->scale);
                if (sc[j] > mx) mx = sc[j];
            }
            double sum = 0.0;
            for (uint32_t j = 0; j <= pos; j++) {
                sc[j] = expf(sc[j] - mx);
                sum += sc[j];
            }
            float *o = (float *)a->out + t * a->ldo + h * dh;
            memset(o, 0, dh * sizeof(float));
            for (uint32_t j = 0; j <= pos; j++) {
                const float *v = V + (size_t)kv_slot(kv, seq, j) * row + g * dh;
                float p = (float)(sc[j] / sum);
                for (size_t e = 0; e < dh; e++) o[e] += p * v[e];
            }
        }
    }
    return 0;
}

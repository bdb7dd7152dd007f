/* backend_cpu_kv.c - the CPU backend's decoding primitives (backend.h):
 * RMSNorm's rows, SwiGLU, the rotary rotation, storing keys and values in
 * the paged cache, and attention of new tokens over it. RMSNorm's and
 * SwiGLU's rows split over cpu_mm.h's pool when there are enough (a step
 * of many sequences: 32 of a SmolLM2-135M shape, bf16, decoded 990 ->
 * 1110 tokens/s on two threads so, a prefill 1670 -> 2065); attention in
 * float32 (dot products in 16 lanes, cpu_vec.h's exp, the softmax's sum
 * in double), its (token, head) pairs split over cpu_mm.h's pool. The
 * cache holds float32, or bfloat16 under worker.cpu_precision "bf16"
 * (keys rotated in float32, then rounded once; widened as they are
 * read). The cache, the block tables, positions and sequence ids are host memory
 * here, so every index is checked before it is used and a bad one
 * refuses the call.
 *
 * Threads and ownership: as backend_cpu.c (a context's calls on its
 * executor thread; the scratch is the caller's). */
#include "backend_cpu_kv.h"
#include "cpu_mm.h"
#include "cpu_vec.h"
#include "safetensors.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Attention runs in at most this many parts at once (each with its own
 * scratch). */
#define KV_PARTS 8
#define KV_GROUP 8 /* query heads of one cache head done together */
#define KV_AHEAD 4 /* cache rows prefetched ahead */
#define KV_WIDE 256 /* the longest bfloat16 head widened once for its query heads */

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

struct kv_rms {
    float *x, *y;
    const float *res, *gw;
    float eps;
    size_t w;
};

static void kv_rms_rows(void *arg, size_t r0, size_t r1)
{
    const struct kv_rms *a = arg;
    size_t w = a->w;
    for (size_t r = r0; r < r1; r++) {
        float *row = a->x + r * w, *out = a->y + r * w;
        if (a->res)
            for (size_t k = 0; k < w; k++) row[k] += a->res[r * w + k];
        double ss = 0.0;
        for (size_t k = 0; k < w; k++) ss += (double)row[k] * row[k];
        double inv = 1.0 / sqrt(ss / (double)w + (double)a->eps);
        for (size_t k = 0; k < w; k++) out[k] = (float)(row[k] * inv * (a->gw ? a->gw[k] : 1.0f));
    }
}

/* Rows over the pool when there are enough of them (CPU_ROWS_MIN). */
void cpu_rmsnorm_rows(float *y, float *x, const float *res, const float *g, float eps,
                      size_t rows, size_t w)
{
    struct kv_rms a = {x, y, res, g, eps, w};
    cpu_par_rows(kv_rms_rows, &a, rows, CPU_ROWS_MIN / (w ? w : 1) + 1);
}

struct kv_swiglu {
    float *y;
    const float *x;
    size_t w;
};

/* silu(a) = a sigmoid(a), the sigmoid from e = exp(-|a|) (cpuv_exp, in
 * blocks of 256) as 1 / (1 + e) or e / (1 + e): float32, within a few ulp. */
static void kv_swiglu_rows(void *arg, size_t r0, size_t r1)
{
    const struct kv_swiglu *sw = arg;
    size_t w = sw->w;
    float e[256];
    for (size_t r = r0; r < r1; r++) {
        const float *g = sw->x + r * 2 * w, *u = g + w;
        float *o = sw->y + r * w;
        for (size_t j0 = 0; j0 < w; j0 += 256) {
            size_t n = w - j0 < 256 ? w - j0 : 256;
            for (size_t j = 0; j < n; j++) e[j] = -fabsf(g[j0 + j]);
            cpuv_exp(e, e, n); /* exp(-|a|) never overflows */
            for (size_t j = 0; j < n; j++) {
                float a = g[j0 + j], sig = (a >= 0 ? 1.0f : e[j]) / (1.0f + e[j]);
                o[j0 + j] = a * sig * u[j0 + j];
            }
        }
    }
}

/* Rows over the pool when there are enough of them (CPU_ROWS_MIN). */
int cpu_swiglu(void *cp, void *yp, const void *xp, size_t rows, size_t w)
{
    (void)cp;
    struct kv_swiglu a = {yp, xp, w};
    cpu_par_rows(kv_swiglu_rows, &a, rows, CPU_ROWS_MIN / (w ? w : 1) + 1);
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

/* rope's rotation: the angle in double, its cosine and sine rounded to
 * float32 (the CUDA kernels form the angle in float32, so at positions
 * in the thousands theirs is off by its rounding, about 1e-4). */
void cpu_rope_rows(float *x, size_t rows, size_t ld, size_t col, size_t heads, size_t dh,
                   const uint32_t *pos, const float *inv_freq)
{
    size_t half = dh / 2;
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < half; i++) {
            double ang = (double)pos[r] * (double)inv_freq[i];
            float cs = (float)cos(ang), sn = (float)sin(ang);
            for (size_t h = 0; h < heads; h++) {
                float *v = x + r * ld + col + h * dh;
                float a = v[i], b = v[i + half];
                v[i] = a * cs - b * sn;
                v[i + half] = b * cs + a * sn;
            }
        }
}

/* n floats rounded to bfloat16 (to nearest, ties to even; a NaN stays a
 * NaN), 16 at a time. */
typedef uint32_t kv_w16v __attribute__((vector_size(64)));
typedef uint16_t kv_h16v __attribute__((vector_size(32)));
static void kv_round(uint16_t *dst, const float *src, size_t n)
{
    size_t e = 0;
    for (; e + 16 <= n; e += 16) {
        kv_w16v x;
        memcpy(&x, src + e, sizeof(x));
        kv_w16v nan = (x & 0x7fffffffu) > 0x7f800000u;
        kv_w16v r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
        r = (nan & ((x >> 16) | 0x40u)) | (~nan & r);
        kv_h16v h = __builtin_convertvector(r, kv_h16v);
        memcpy(dst + e, &h, sizeof(h));
    }
    for (; e < n; e++) dst[e] = st_f32_to_bf16(src[e]);
}

int cpu_kv_store(void *cp, const struct bk_kv *kv, const void *kp, size_t ldk, const void *vp,
                 size_t ldv, const struct bk_seqs *s, const float *rope, size_t rope_n)
{
    if (!kv || !kv->k || !kv->v || !kv->tables || !kv->block_tokens || !kv->kv_heads ||
        !kv->dh || !s)
        return kv_refuse(cp, "kv_store: no cache");
    if (rope && (kv->dh % 2 || rope_n < kv->dh / 2))
        return kv_refuse(cp, "kv_store: %zu rotary frequencies for heads of %zu", rope_n,
                         kv->dh);
    struct cpu_ctx *c = cp;
    size_t row = kv->kv_heads * kv->dh;
    const float *k = kp, *v = vp;
    if (c->kv16 && c->kvrow_n < row) {
        float *p = realloc(c->kvrow, row * sizeof(float));
        if (!p) return kv_refuse(cp, "kv_store: out of memory for a row of %zu", row);
        c->kvrow = p;
        c->kvrow_n = row;
    }
    for (size_t t = 0; t < s->tokens; t++) {
        long slot = kv_slot(kv, s->seq[t], s->pos[t]);
        if (slot < 0)
            return kv_refuse(cp, "kv_store: token %zu (sequence %u, position %u) has no block",
                             t, s->seq[t], s->pos[t]);
        size_t at = (size_t)slot * row;
        if (!c->kv16) {
            float *K = kv->k, *V = kv->v;
            memcpy(K + at, k + t * ldk, row * sizeof(float));
            memcpy(V + at, v + t * ldv, row * sizeof(float));
            if (rope) cpu_rope_rows(K + at, 1, row, 0, kv->kv_heads, kv->dh, &s->pos[t], rope);
            continue;
        }
        /* bfloat16: the key rotated in float32, then each value rounded once */
        uint16_t *K = kv->k, *V = kv->v;
        memcpy(c->kvrow, k + t * ldk, row * sizeof(float));
        if (rope) cpu_rope_rows(c->kvrow, 1, row, 0, kv->kv_heads, kv->dh, &s->pos[t], rope);
        kv_round(K + at, c->kvrow, row);
        kv_round(V + at, v + t * ldv, row);
    }
    return 0;
}

/* Per part: KV_GROUP scores and a cache slot per position of the
 * longest context. */
size_t cpu_paged_attention_scratch(void *be, size_t max_tokens, size_t max_ctx, size_t heads)
{
    (void)be;
    (void)max_tokens;
    (void)heads;
    return KV_PARTS * (max_ctx ? max_ctx : 1) * (KV_GROUP * sizeof(float) + sizeof(uint32_t));
}

struct kv_att {
    const struct bk_paged_attention *a;
    size_t items;            /* tokens x cache heads */
    int kv16;                /* the cache in bfloat16 */
};

#pragma GCC diagnostic ignored "-Wpsabi"
typedef float kv_v16 __attribute__((vector_size(64)));
typedef int kv_i16 __attribute__((vector_size(64)));
typedef uint16_t kv_h16 __attribute__((vector_size(32)));
typedef uint32_t kv_u16 __attribute__((vector_size(64)));

/* 16 cache values from p as floats: float32 (h 0) or bfloat16 (h 1, the
 * high half of a float32). */
static inline __attribute__((always_inline)) kv_v16 kv_load(const void *p, size_t e, int h)
{
    kv_v16 r;
    if (!h) {
        memcpy(&r, (const float *)p + e, sizeof(r));
    } else {
        kv_h16 b;
        memcpy(&b, (const uint16_t *)p + e, sizeof(b));
        kv_u16 w = __builtin_convertvector(b, kv_u16) << 16;
        memcpy(&r, &w, sizeof(r));
    }
    return r;
}

/* One cache value from p as a float. */
static inline __attribute__((always_inline)) float kv_at(const void *p, size_t e, int h)
{
    if (!h) return ((const float *)p)[e];
    uint32_t w = (uint32_t)((const uint16_t *)p)[e] << 16;
    float f;
    memcpy(&f, &w, sizeof(f));
    return f;
}

/* x . y over n values, y a cache row (h as kv_load). */
static inline __attribute__((always_inline)) float kv_dot(const float *x, const void *y, size_t n,
                                                          int h)
{
    kv_v16 acc = {0};
    size_t e = 0;
    for (; e + 16 <= n; e += 16) {
        kv_v16 a;
        memcpy(&a, x + e, sizeof(a));
        acc += a * kv_load(y, e, h);
    }
    /* lanes added pairwise, 8 apart, then 4, 2, 1 */
    acc += __builtin_shuffle(acc, (kv_i16){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    acc += __builtin_shuffle(acc, (kv_i16){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    acc += __builtin_shuffle(acc, (kv_i16){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    acc += __builtin_shuffle(acc, (kv_i16){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    float s = acc[0];
    for (; e < n; e++) s += x[e] * kv_at(y, e, h);
    return s;
}

/* n bfloat16 cache values from p into dst as floats. */
static inline __attribute__((always_inline)) void kv_widen(float *dst, const void *p, size_t n)
{
    size_t e = 0;
    for (; e + 16 <= n; e += 16) {
        kv_v16 r = kv_load(p, e, 1);
        memcpy(dst + e, &r, sizeof(r));
    }
    for (; e < n; e++) dst[e] = kv_at(p, e, 1);
}

/* The cache lines of n bytes from p, asked for ahead of their use
 * (rows of scattered blocks defeat the hardware's prefetchers). */
static inline __attribute__((always_inline)) void kv_prefetch(const void *p, size_t n)
{
    for (size_t e = 0; e < n; e += 64) __builtin_prefetch((const char *)p + e);
}

/* o[e] += p v[e], n values, v a cache row (h as kv_load). */
static inline __attribute__((always_inline)) void kv_axpy(float *o, float p, const void *v,
                                                          size_t n, int h)
{
    size_t e = 0;
    for (; e + 16 <= n; e += 16) {
        kv_v16 a;
        memcpy(&a, o + e, sizeof(a));
        a += p * kv_load(v, e, h);
        memcpy(o + e, &a, sizeof(a));
    }
    for (; e < n; e++) o[e] += p * kv_at(v, e, h);
}

/* One clone per instruction set, chosen at load time, except under
 * ThreadSanitizer, which instruments the clones' resolver and crashes in
 * it (it runs before the sanitizer starts). */
#ifdef __SANITIZE_THREAD__
#define KV_CLONES
#else
#define KV_CLONES __attribute__((target_clones("avx512f", "default")))
#endif
/* Part `part` of the (token, cache head) pairs: the slots of the
 * token's positions (checked by the caller), then for up to KV_GROUP of
 * the query heads reading that cache head at once (each key and value
 * row loaded once for all of them): the scores, softmax shifted by their
 * max (cpuv_exp), the weighted sum of the values. */
static inline __attribute__((always_inline)) void kv_att_run(const struct kv_att *w,
                                                              size_t part, size_t parts,
                                                              const int h)
{
    const struct bk_paged_attention *a = w->a;
    const struct bk_kv *kv = a->kv;
    const struct bk_seqs *s = a->s;
    size_t dh = kv->dh, group = a->heads / kv->kv_heads, row = kv->kv_heads * dh;
    size_t ctx = a->max_ctx ? a->max_ctx : 1;
    float *sc = (float *)a->scratch + part * ctx * (KV_GROUP + 1);
    uint32_t *slot = (uint32_t *)(sc + ctx * KV_GROUP);
    const size_t es = h ? sizeof(uint16_t) : sizeof(float), rb = row * es;
    const char *K = kv->k, *V = kv->v;
    _Alignas(64) float wide[KV_WIDE];
    size_t i0 = w->items * part / parts, i1 = w->items * (part + 1) / parts, cur = SIZE_MAX;
    for (size_t it = i0; it < i1; it++) {
        size_t t = it / kv->kv_heads, g = it % kv->kv_heads;
        uint32_t pos = s->pos[t], n = pos + 1;
        if (t != cur) {
            for (uint32_t j = 0; j < n; j++) slot[j] = (uint32_t)kv_slot(kv, s->seq[t], j);
            cur = t;
        }
        for (size_t h0 = g * group; h0 < (g + 1) * group; h0 += KV_GROUP) {
            size_t nh = (g + 1) * group - h0 < KV_GROUP ? (g + 1) * group - h0 : KV_GROUP;
            const float *q = (const float *)a->q + t * a->ldq + h0 * dh;
            /* a bfloat16 row read by several heads is widened once */
            const int once = h && nh > 1 && dh <= KV_WIDE;
            for (uint32_t j = 0; j < n; j++) {
                const char *kr = K + (size_t)slot[j] * rb + g * dh * es;
                if (j + KV_AHEAD < n)
                    kv_prefetch(K + (size_t)slot[j + KV_AHEAD] * rb + g * dh * es, dh * es);
                if (once) kv_widen(wide, kr, dh);
                for (size_t x = 0; x < nh; x++)
                    sc[x * ctx + j] = once ? kv_dot(q + x * dh, wide, dh, 0)
                                           : kv_dot(q + x * dh, kr, dh, h);
            }
            float inv[KV_GROUP];
            for (size_t x = 0; x < nh; x++) {
                float *p = sc + x * ctx, mx = -INFINITY;
                for (uint32_t j = 0; j < n; j++) {
                    p[j] *= a->scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (uint32_t j = 0; j < n; j++) p[j] -= mx;
                cpuv_exp(p, p, n);
                double sum = 0.0;
                for (uint32_t j = 0; j < n; j++) sum += p[j];
                inv[x] = (float)(1.0 / sum);
            }
            float *o = (float *)a->out + t * a->ldo + h0 * dh;
            for (size_t x = 0; x < nh; x++) memset(o + x * dh, 0, dh * sizeof(float));
            for (uint32_t j = 0; j < n; j++) {
                const char *vr = V + (size_t)slot[j] * rb + g * dh * es;
                if (j + KV_AHEAD < n)
                    kv_prefetch(V + (size_t)slot[j + KV_AHEAD] * rb + g * dh * es, dh * es);
                if (once) kv_widen(wide, vr, dh);
                for (size_t x = 0; x < nh; x++) {
                    if (once)
                        kv_axpy(o + x * dh, sc[x * ctx + j] * inv[x], wide, dh, 0);
                    else
                        kv_axpy(o + x * dh, sc[x * ctx + j] * inv[x], vr, dh, h);
                }
            }
        }
    }
}

/* kv_att_run with the cache's type a constant, so each loop is compiled
 * for it. */
KV_CLONES
static void kv_att_part(void *arg, size_t part, size_t parts)
{
    const struct kv_att *w = arg;
    if (w->kv16)
        kv_att_run(w, part, parts, 1);
    else
        kv_att_run(w, part, parts, 0);
}

/* Every token's positions are checked against its table first; then the
 * (token, head) pairs are split over the pool (cpu_mm.h), each part with
 * its own piece of the scratch. */
int cpu_paged_attention(void *cp, const struct bk_paged_attention *a)
{
    const struct bk_kv *kv = a->kv;
    const struct bk_seqs *s = a->s;
    if (!kv || !s || !a->heads || !kv->kv_heads || a->heads % kv->kv_heads || !kv->dh ||
        !kv->block_tokens || !a->scratch)
        return kv_refuse(cp, "paged attention: %zu heads over %zu cache heads", a->heads,
                         kv ? kv->kv_heads : 0);
    for (size_t t = 0; t < s->tokens; t++) {
        uint32_t seq = s->seq[t], pos = s->pos[t];
        if (pos >= a->max_ctx)
            return kv_refuse(cp, "paged attention: position %u past the context of %zu", pos,
                             a->max_ctx);
        for (uint32_t j = 0; j <= pos; j++)
            if (kv_slot(kv, seq, j) < 0)
                return kv_refuse(cp, "paged attention: sequence %u has no block for position %u",
                                 seq, j);
    }
    struct kv_att w = {a, s->tokens * kv->kv_heads, ((struct cpu_ctx *)cp)->kv16};
    if (w.items) cpu_par(kv_att_part, &w, w.items < KV_PARTS ? w.items : KV_PARTS);
    return 0;
}

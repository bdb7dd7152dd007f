/* cpu_mm.c - the products of few rows of cpu_mm.h, and the pool of
 * helper threads they are split over.
 *
 * Blocking: W is walked 4 rows at a time; for each such tile every group
 * of up to 4 rows of A is multiplied against it (16 accumulators of 16
 * lanes), so the tile is read from memory once and reused from L1 by all
 * of A, which stays in L2 for the decode shapes (m <= 64, k <= a few
 * thousand). A row past n reads W's last row again and is not stored.
 * One row of A (a decode step of one sequence) takes a loop of its own
 * that reads W strictly in order, a row at a time, 64 elements per
 * iteration in four accumulators: one stream for the prefetchers, which
 * measured faster than four interleaved ones when memory is the limit;
 * W is software-prefetched MM_PREFETCH bytes ahead there (BF16 weights of
 * a decode step's shapes: 9.9 -> 11-13 GB/s on one thread) and in the
 * tiles.
 *
 * BF16 weights and one row of A take a loop of their own again, the one
 * a bf16 folder's decode spends its time in: A is first copied with each
 * 32-element chunk's even elements ahead of its odd ones, so that one
 * 64-byte load of W gives both halves in float32 by a shift and by a mask
 * (no widening shuffle); two rows of W are walked side by side, sharing
 * the loads of A; W is prefetched into L2 MM_PREFETCH_BF16 bytes ahead.
 * The decode chain of a SmolLM2-135M shape (30 layers' products and the
 * head, weights 64-byte aligned) measured 14.0 -> 15.6 GB/s on one
 * thread and 28 -> 30-31 on two, against 16.2 and 32.2 for a plain
 * streaming read. Several rows of A against BF16 W are split the same
 * way (each row into a buffer of the call's) and take a tile kernel of
 * their own: the widening shuffle it saves ran on a port the
 * multiply-adds need (32 sequences of that shape: 232 -> 270 tokens/s on
 * one thread, 408 -> 456 on two).
 *
 * The pool: each helper waits for its job number to move, spinning a
 * little (a product follows the previous one within microseconds in a
 * decode step) and then asleep on a condition variable. The caller
 * publishes the job, bumps the numbers of the helpers it needs, does
 * part 0 itself and spins until those have finished theirs. One job at a time: a caller
 * that cannot take the pool's lock at once does the whole job alone. */
#include "cpu_mm.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MM_X86 1
#define MM_PAUSE() _mm_pause()
#else
#define MM_PAUSE() ((void)0)
#endif

#define MM_MAX_THREADS 64
#define MM_SPIN_NS 50000         /* helpers spin this long for the next job */
#define MM_POOL_MIN 65536        /* m n k below this: not worth the pool */
#define MM_PREFETCH 1024         /* bytes ahead of each W row's loads */
#define MM_PREFETCH_BF16 4096    /* the same for the one-row BF16 loop, into L2 */
#define MM_SPLIT_MAX 16384       /* longest k of that loop (its copy of A is on the stack) */

/* ---- the kernels ---------------------------------------------------------------- */

/* One part of a product: W rows [j0, j1), every row of A. */
struct mm_job {
    size_t m, n, k, lda, ldc;
    const float *a;
    const void *w;
    enum cpu_wkind kind;
    const float *bias;
    float *c;
    const float *a2;   /* BF16: A split per 32-chunk (mm_split; rows of k), or NULL */
};

static float mm_widen1(const void *w, size_t i, enum cpu_wkind kind)
{
    const uint16_t *h = w;
    if (kind == CPU_W_F32) return ((const float *)w)[i];
    if (kind == CPU_W_BF16) {
        uint32_t u = (uint32_t)h[i] << 16;
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
    }
    /* float16: exact by construction of the format */
    uint32_t x = h[i], sign = (x & 0x8000u) << 16, ex = (x >> 10) & 0x1f, man = x & 0x3ff, u;
    if (ex == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (ex) {
        u = sign | ((ex + 112) << 23) | (man << 13);
    } else if (!man) {
        u = sign;
    } else {
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* The plain copy: 16 partial sums per dot product, as the vector one. */
static void mm_part_plain(const struct mm_job *j, size_t j0, size_t j1)
{
    for (size_t r = j0; r < j1; r++)
        for (size_t i = 0; i < j->m; i++) {
            const float *a = j->a + i * j->lda;
            float lane[16] = {0};
            for (size_t e = 0; e < j->k; e++)
                lane[e % 16] += a[e] * mm_widen1(j->w, r * j->k + e, j->kind);
            float s = 0;
            for (int l = 0; l < 16; l++) s += lane[l];
            j->c[i * j->ldc + r] = s + (j->bias ? j->bias[r] : 0.0f);
        }
}

#ifdef MM_X86
#define MM_AVX __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define MM_INLINE static inline __attribute__((always_inline)) MM_AVX

MM_INLINE __m512 mm_ld(const void *w, size_t at, enum cpu_wkind kind, __mmask16 mk)
{
    if (kind == CPU_W_F32) return _mm512_maskz_loadu_ps(mk, (const float *)w + at);
    __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)w + at);
    if (kind == CPU_W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The end of a tile: columns e .. k - 1 in masked steps of 16 (W widened
 * as mm_ld widens it), then each accumulator's lanes summed into out. */
MM_INLINE void mm_tile_end(const float *a, size_t lda, size_t k, size_t e, const void *w,
                           const size_t wr[4], enum cpu_wkind kind, int mr, __m512 acc[4][4],
                           float out[4][4])
{
    for (; e < k; e += 16) {
        __mmask16 mk = k - e >= 16 ? 0xffff : (__mmask16)((1u << (k - e)) - 1);
        __m512 wv[4];
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) wv[q] = mm_ld(w, wr[q] + e, kind, mk);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < mr; i++) {
            __m512 av = _mm512_maskz_loadu_ps(mk, a + i * lda + e);
            _Pragma("GCC unroll 4")
            for (int q = 0; q < 4; q++) acc[i][q] = _mm512_fmadd_ps(av, wv[q], acc[i][q]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < mr; i++)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) out[i][q] = _mm512_reduce_add_ps(acc[i][q]);
}

/* mr (1..4) rows of A from a, against W rows w0..w3 (element offsets),
 * into out[i][q]. */
MM_INLINE void mm_tile(const float *a, size_t lda, size_t k, const void *w, const size_t wr[4],
                       enum cpu_wkind kind, int mr, float out[4][4])
{
    __m512 acc[4][4];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) acc[i][q] = _mm512_setzero_ps();
    size_t e = 0;
    for (; e + 16 <= k; e += 16) {
        __m512 wv[4];
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) {
            _mm_prefetch((const char *)w + (wr[q] + e) * (kind ? 2 : 4) + MM_PREFETCH, _MM_HINT_T0);
            wv[q] = mm_ld(w, wr[q] + e, kind, 0xffff);
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < mr; i++) {
            __m512 av = _mm512_loadu_ps(a + i * lda + e);
            _Pragma("GCC unroll 4")
            for (int q = 0; q < 4; q++) acc[i][q] = _mm512_fmadd_ps(av, wv[q], acc[i][q]);
        }
    }
    mm_tile_end(a, lda, k, e, w, wr, kind, mr, acc, out);
}

/* The kernel for one kind, mr fixed so that each copy keeps its
 * accumulators in registers. */
#define MM_TILE_FOR(KIND, MR)                                                              \
    static MM_AVX void mm_tile_##KIND##_##MR(const float *a, size_t lda, size_t k,         \
                                             const void *w, const size_t wr[4],            \
                                             float out[4][4])                              \
    {                                                                                      \
        mm_tile(a, lda, k, w, wr, KIND, MR, out);                                          \
    }
#define MM_TILES_FOR(KIND) MM_TILE_FOR(KIND, 1) MM_TILE_FOR(KIND, 2) MM_TILE_FOR(KIND, 3) \
    MM_TILE_FOR(KIND, 4)
MM_TILES_FOR(CPU_W_F32)
MM_TILES_FOR(CPU_W_BF16)
MM_TILES_FOR(CPU_W_F16)

/* The tile for BF16 W against A split per 32 columns (mm_split, row by
 * row, leading dimension k): each 64-byte load of a W row gives its even
 * and odd columns by a shift and a mask, no widening shuffle (which
 * competes with the multiply-adds for a port); the columns past the last
 * whole 32 as mm_tile takes them. */
MM_INLINE void mm_tile_split(const float *a, size_t k, const void *w, const size_t wr[4], int mr,
                             float out[4][4])
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const uint16_t *wh = w;
    __m512 acc[4][4];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) acc[i][q] = _mm512_setzero_ps();
    size_t e = 0, k32 = k / 32 * 32;
    for (; e < k32; e += 32) {
        __m512 we[4], wo[4];
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) {
            _mm_prefetch((const char *)(wh + wr[q] + e) + MM_PREFETCH, _MM_HINT_T0);
            __m512i x = _mm512_loadu_si512(wh + wr[q] + e);
            we[q] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            wo[q] = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < mr; i++) {
            __m512 ae = _mm512_loadu_ps(a + i * k + e), ao = _mm512_loadu_ps(a + i * k + e + 16);
            _Pragma("GCC unroll 4")
            for (int q = 0; q < 4; q++)
                acc[i][q] = _mm512_fmadd_ps(ao, wo[q], _mm512_fmadd_ps(ae, we[q], acc[i][q]));
        }
    }
    mm_tile_end(a, k, k, e, w, wr, CPU_W_BF16, mr, acc, out);
}

#define MM_SPLIT_FOR(MR)                                                                   \
    static MM_AVX void mm_tile_split_##MR(const float *a, size_t lda, size_t k,            \
                                          const void *w, const size_t wr[4],               \
                                          float out[4][4])                                 \
    {                                                                                      \
        (void)lda;                                                                         \
        mm_tile_split(a, k, w, wr, MR, out);                                               \
    }
MM_SPLIT_FOR(1)
MM_SPLIT_FOR(2)
MM_SPLIT_FOR(3)
MM_SPLIT_FOR(4)

typedef void (*mm_tile_fn)(const float *, size_t, size_t, const void *, const size_t[4],
                           float[4][4]);
static const mm_tile_fn mm_split_tiles[4] = {mm_tile_split_1, mm_tile_split_2, mm_tile_split_3,
                                             mm_tile_split_4};
static const mm_tile_fn mm_tiles[3][4] = {
    {mm_tile_CPU_W_F32_1, mm_tile_CPU_W_F32_2, mm_tile_CPU_W_F32_3, mm_tile_CPU_W_F32_4},
    {mm_tile_CPU_W_BF16_1, mm_tile_CPU_W_BF16_2, mm_tile_CPU_W_BF16_3, mm_tile_CPU_W_BF16_4},
    {mm_tile_CPU_W_F16_1, mm_tile_CPU_W_F16_2, mm_tile_CPU_W_F16_3, mm_tile_CPU_W_F16_4}};

/* One row of A: W read strictly in order, a row at a time, four
 * accumulators across each row's 64-element chunks. */
MM_INLINE void mm_row1(const float *a, size_t k, const void *w, size_t j0, size_t j1,
                       enum cpu_wkind kind, const float *bias, float *c)
{
    size_t esz = kind == CPU_W_F32 ? 4 : 2;
    for (size_t r = j0; r < j1; r++) {
        size_t base = r * k, e = 0;
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (; e + 64 <= k; e += 64) {
            const char *ahead = (const char *)w + (base + e) * esz + MM_PREFETCH;
            _mm_prefetch(ahead, _MM_HINT_T0);
            _mm_prefetch(ahead + 64, _MM_HINT_T0);
            if (esz == 4) {
                _mm_prefetch(ahead + 128, _MM_HINT_T0);
                _mm_prefetch(ahead + 192, _MM_HINT_T0);
            }
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + e), mm_ld(w, base + e, kind, 0xffff), s0);
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + e + 16),
                                 mm_ld(w, base + e + 16, kind, 0xffff), s1);
            s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + e + 32),
                                 mm_ld(w, base + e + 32, kind, 0xffff), s2);
            s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + e + 48),
                                 mm_ld(w, base + e + 48, kind, 0xffff), s3);
        }
        for (; e < k; e += 16) {
            __mmask16 mk = k - e >= 16 ? 0xffff : (__mmask16)((1u << (k - e)) - 1);
            s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + e), mm_ld(w, base + e, kind, mk),
                                 s0);
        }
        float v = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1),
                                                     _mm512_add_ps(s2, s3)));
        c[r] = v + (bias ? bias[r] : 0.0f);
    }
}

/* One 32-element chunk x of BF16 W (16 bit pairs) against the split A
 * at a: even elements by the shift, odd ones by the mask. */
#define MM_BF16_CHUNK(x, a, s_even, s_odd)                                                  \
    do {                                                                                   \
        s_even = _mm512_fmadd_ps(_mm512_loadu_ps(a),                                       \
                                 _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), s_even);   \
        s_odd = _mm512_fmadd_ps(_mm512_loadu_ps((a) + 16),                                 \
                                _mm512_castsi512_ps(_mm512_and_si512(x, hi)), s_odd);      \
    } while (0)

/* BF16 rows [j0, j1) of W against the split A a2, one at a time. */
static MM_AVX void mm_bf16_one(const float *a2, size_t k, const uint16_t *w, size_t j0,
                               size_t j1, const float *bias, float *c)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    size_t k32 = k / 32 * 32;
    for (size_t r = j0; r < j1; r++) {
        const uint16_t *wr = w + r * k;
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        size_t e = 0;
        for (; e + 64 <= k32; e += 64) {
            const char *ahead = (const char *)(wr + e) + MM_PREFETCH_BF16;
            _mm_prefetch(ahead, _MM_HINT_T1);
            _mm_prefetch(ahead + 64, _MM_HINT_T1);
            __m512i x0 = _mm512_loadu_si512(wr + e), x1 = _mm512_loadu_si512(wr + e + 32);
            MM_BF16_CHUNK(x0, a2 + e, s0, s1);
            MM_BF16_CHUNK(x1, a2 + e + 32, s2, s3);
        }
        if (e < k32) {
            __m512i x0 = _mm512_loadu_si512(wr + e);
            MM_BF16_CHUNK(x0, a2 + e, s0, s1);
            e += 32;
        }
        for (; e < k; e += 16) { /* the tail, not split */
            __mmask16 mk = k - e >= 16 ? 0xffff : (__mmask16)((1u << (k - e)) - 1);
            s2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a2 + e),
                                 mm_ld(wr, e, CPU_W_BF16, mk), s2);
        }
        float v = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1),
                                                     _mm512_add_ps(s2, s3)));
        c[r] = v + (bias ? bias[r] : 0.0f);
    }
}

/* The same, two rows side by side when k is whole chunks. */
static MM_AVX void mm_bf16_two(const float *a2, size_t k, const uint16_t *w, size_t j0,
                               size_t j1, const float *bias, float *c)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    size_t r = j0;
    for (; k % 32 == 0 && r + 2 <= j1; r += 2) {
        const uint16_t *wa = w + r * k, *wb = wa + k;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
        for (size_t e = 0; e < k; e += 32) {
            _mm_prefetch((const char *)(wa + e) + MM_PREFETCH_BF16, _MM_HINT_T1);
            _mm_prefetch((const char *)(wb + e) + MM_PREFETCH_BF16, _MM_HINT_T1);
            __m512i xa = _mm512_loadu_si512(wa + e), xb = _mm512_loadu_si512(wb + e);
            MM_BF16_CHUNK(xa, a2 + e, a0, a1);
            MM_BF16_CHUNK(xb, a2 + e, b0, b1);
        }
        c[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + (bias ? bias[r] : 0.0f);
        c[r + 1] = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1)) + (bias ? bias[r + 1] : 0.0f);
    }
    if (r < j1) mm_bf16_one(a2, k, w, r, j1, bias, c);
}

#define MM_ROW1_FOR(KIND)                                                                  \
    static MM_AVX void mm_row1_##KIND(const struct mm_job *j, size_t j0, size_t j1)        \
    {                                                                                      \
        mm_row1(j->a, j->k, j->w, j0, j1, KIND, j->bias, j->c);                            \
    }
MM_ROW1_FOR(CPU_W_F32)
MM_ROW1_FOR(CPU_W_BF16)
MM_ROW1_FOR(CPU_W_F16)
static void (*const mm_row1s[3])(const struct mm_job *, size_t, size_t) = {
    mm_row1_CPU_W_F32, mm_row1_CPU_W_BF16, mm_row1_CPU_W_F16};

static void mm_part_avx512(const struct mm_job *j, size_t j0, size_t j1)
{
    if (j->m == 1 && j->a2) {
        mm_bf16_two(j->a2, j->k, j->w, j0, j1, j->bias, j->c);
        return;
    }
    if (j->m == 1) {
        mm_row1s[j->kind](j, j0, j1);
        return;
    }
    for (size_t r = j0; r < j1; r += 4) {
        size_t nr = j1 - r < 4 ? j1 - r : 4, wr[4];
        for (size_t q = 0; q < 4; q++) wr[q] = (r + (q < nr ? q : nr - 1)) * j->k;
        for (size_t i = 0; i < j->m; i += 4) {
            size_t mr = j->m - i < 4 ? j->m - i : 4;
            float out[4][4];
            if (j->a2)
                mm_split_tiles[mr - 1](j->a2 + i * j->k, j->k, j->k, j->w, wr, out);
            else
                mm_tiles[j->kind][mr - 1](j->a + i * j->lda, j->lda, j->k, j->w, wr, out);
            for (size_t x = 0; x < mr; x++)
                for (size_t q = 0; q < nr; q++)
                    j->c[(i + x) * j->ldc + r + q] =
                        out[x][q] + (j->bias ? j->bias[r + q] : 0.0f);
        }
    }
}

static void mm_widen_avx512(float *dst, const uint16_t *src, size_t n, enum cpu_wkind kind)
    MM_AVX;
static void mm_widen_avx512(float *dst, const uint16_t *src, size_t n, enum cpu_wkind kind)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, mk, mm_ld(src, i, kind, mk));
    }
}
#endif

static atomic_int mm_lvl = -1;

int cpu_mm_level(int cap)
{
    int best = 0;
#ifdef MM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        best = 1;
#endif
    int lvl = cap >= 0 && cap < best ? cap : best;
    atomic_store(&mm_lvl, lvl);
    return lvl;
}

static int mm_level_now(void)
{
    int l = atomic_load_explicit(&mm_lvl, memory_order_relaxed);
    return l >= 0 ? l : cpu_mm_level(-1);
}

static void mm_part(const struct mm_job *j, size_t part, size_t parts)
{
    size_t tiles = (j->n + 3) / 4;
    size_t t0 = tiles * part / parts, t1 = tiles * (part + 1) / parts;
    size_t j0 = t0 * 4, j1 = t1 * 4 < j->n ? t1 * 4 : j->n;
    if (j0 >= j1) return;
#ifdef MM_X86
    if (mm_level_now() == 1) {
        mm_part_avx512(j, j0, j1);
        return;
    }
#endif
    mm_part_plain(j, j0, j1);
}

void cpu_mm_widen(float *dst, const uint16_t *src, size_t n, enum cpu_wkind kind)
{
#ifdef MM_X86
    if (mm_level_now() == 1) {
        mm_widen_avx512(dst, src, n, kind);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = mm_widen1(src, i, kind);
}

void *cpu_mm_alloc(size_t bytes, int zero)
{
    /* unaligned W: the BF16 decode chain of a SmolLM2-135M shape read
     * 14.5 GB/s on one thread, against 15.6 aligned */
    size_t up = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, up ? up : 64);
    if (p && zero) memset(p, 0, up);
    return p;
}

/* ---- the pool ------------------------------------------------------------------- */

static struct {
    pthread_mutex_t busy;        /* held by the caller of a job */
    pthread_mutex_t lock;        /* with wake: the sleepers' */
    pthread_cond_t wake;
    atomic_uint go[MM_MAX_THREADS]; /* helper i's job number: bumped to start it */
    atomic_int pending;          /* helpers yet to finish the job */
    atomic_int want;             /* threads per product, caller included */
    int started;                 /* helpers running (under busy) */
    void (*fn)(void *, size_t, size_t); /* the job, published by go for the */
    void *arg;                   /* helpers it starts */
    size_t parts;
} mm_pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER,
             .wake = PTHREAD_COND_INITIALIZER, .want = 1};

static uint64_t mm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Helper me (1..): waits for its go number to move, does its part of the
 * job, says so. Only the helpers a job starts read its fields, and the
 * caller changes them only after every one of those has finished. */
static void *mm_helper(void *arg)
{
    size_t me = (size_t)(uintptr_t)arg;
    atomic_uint *go = &mm_pool.go[me];
    unsigned seen = 0; /* go[me] is 0 until its first job, maybe bumped already */
    for (;;) {
        uint64_t t0 = mm_now_ns();
        for (int it = 1; atomic_load(go) == seen; it++) {
            MM_PAUSE();
            if (it % 64 == 0 && mm_now_ns() - t0 > MM_SPIN_NS) {
                pthread_mutex_lock(&mm_pool.lock);
                while (atomic_load(go) == seen) pthread_cond_wait(&mm_pool.wake, &mm_pool.lock);
                pthread_mutex_unlock(&mm_pool.lock);
            }
        }
        seen = atomic_load(go);
        mm_pool.fn(mm_pool.arg, me, mm_pool.parts);
        atomic_fetch_sub(&mm_pool.pending, 1);
    }
    return NULL;
}

void cpu_mm_threads(int n)
{
    atomic_store(&mm_pool.want, n < 1 ? 1 : n > MM_MAX_THREADS ? MM_MAX_THREADS : n);
}

void cpu_par(void (*fn)(void *arg, size_t part, size_t parts), void *arg, size_t max_parts)
{
    size_t want = (size_t)atomic_load(&mm_pool.want);
    if (want > max_parts) want = max_parts;
    if (want < 2 || pthread_mutex_trylock(&mm_pool.busy) != 0) {
        fn(arg, 0, 1);
        return;
    }
    while ((size_t)mm_pool.started + 1 < want) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int bad = pthread_create(&t, &at, mm_helper, (void *)(uintptr_t)(mm_pool.started + 1));
        pthread_attr_destroy(&at);
        if (bad) break;
        mm_pool.started++;
    }
    size_t parts = (size_t)mm_pool.started + 1;
    if (parts > want) parts = want;
    mm_pool.fn = fn;
    mm_pool.arg = arg;
    mm_pool.parts = parts;
    atomic_store(&mm_pool.pending, (int)parts - 1);
    pthread_mutex_lock(&mm_pool.lock);
    for (size_t h = 1; h < parts; h++) atomic_fetch_add(&mm_pool.go[h], 1);
    pthread_cond_broadcast(&mm_pool.wake);
    pthread_mutex_unlock(&mm_pool.lock);
    fn(arg, 0, parts);
    for (int it = 1; atomic_load(&mm_pool.pending) > 0; it++) {
        MM_PAUSE();
        if (it % 4096 == 0) sched_yield();
    }
    pthread_mutex_unlock(&mm_pool.busy);
}

struct mm_rows_job {
    void (*fn)(void *, size_t, size_t);
    void *arg;
    size_t rows;
};

static void mm_rows_part(void *arg, size_t part, size_t parts)
{
    const struct mm_rows_job *j = arg;
    size_t r0 = j->rows * part / parts, r1 = j->rows * (part + 1) / parts;
    if (r0 < r1) j->fn(j->arg, r0, r1);
}

void cpu_par_rows(void (*fn)(void *arg, size_t r0, size_t r1), void *arg, size_t rows,
                  size_t min_rows)
{
    size_t parts = rows / (min_rows ? min_rows : 1);
    if (parts < 2) {
        if (rows) fn(arg, 0, rows);
        return;
    }
    struct mm_rows_job j = {fn, arg, rows};
    cpu_par(mm_rows_part, &j, parts);
}

static void mm_part_fn(void *arg, size_t part, size_t parts)
{
    mm_part(arg, part, parts);
}

/* a2 = a with each whole 32-element chunk's even elements ahead of its
 * odd ones, the tail as it is (the one-row BF16 loop's A). */
static void mm_split(float *a2, const float *a, size_t k)
{
    size_t k32 = k / 32 * 32;
    for (size_t e = 0; e < k32; e += 32)
        for (size_t i = 0; i < 16; i++) {
            a2[e + i] = a[e + 2 * i];
            a2[e + 16 + i] = a[e + 2 * i + 1];
        }
    memcpy(a2 + k32, a + k32, (k - k32) * sizeof(float));
}

void cpu_mm(size_t m, size_t n, size_t k, const float *a, size_t lda, const void *w,
            enum cpu_wkind kind, const float *bias, float *c, size_t ldc)
{
    struct mm_job j = {m, n, k, lda, ldc, a, w, kind, bias, c, NULL};
    _Alignas(64) float a2[MM_SPLIT_MAX];
    float *a2m = NULL; /* several rows: on the heap, freed below */
    if (kind == CPU_W_BF16 && mm_level_now() == 1) {
        if (m == 1 && k <= MM_SPLIT_MAX) {
            mm_split(a2, a, k);
            j.a2 = a2;
        } else if (m > 1 && (a2m = aligned_alloc(64, (m * k * sizeof(float) + 63) / 64 * 64))) {
            for (size_t i = 0; i < m; i++) mm_split(a2m + i * k, a + i * lda, k);
            j.a2 = a2m;
        }
    }
    size_t tiles = (n + 3) / 4;
    if (m * n * k < MM_POOL_MIN)
        mm_part(&j, 0, 1);
    else
        cpu_par(mm_part_fn, &j, tiles);
    free(a2m);
}

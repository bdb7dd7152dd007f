/* cpu_amx.c - the bfloat16 products of cpu_amx.h on AMX tiles.
 *
 * Tiles: 0-3 accumulate a 2 x 2 block of C (16 x 16 floats each), 4-5
 * hold two 16-row blocks of A (32 bfloat16 columns each), 6-7 two blocks
 * of W in the packed layout. One step over 32 columns loads those four
 * and runs four TDPBF16PS; a block at the edge of C runs the ones it has.
 * A thread takes whole pairs of W's 16-row bands, and walks A in chunks
 * of AMX_MCHUNK rows: the chunk (at most 256 rows of k bfloat16) stays
 * in L2 while every band of the thread passes it, each band read once
 * per chunk. For the decode shapes (one chunk) every weight byte is read
 * once per product, in order within each band, prefetched ahead.
 *
 * The kernel code is compiled for AMX and AVX-512 by target attributes
 * and only entered after cpu_amx_ready() said 1, so the rest of the
 * build runs on any x86-64 CPU. Elsewhere this file only packs and
 * unpacks (cpu_amx_ready says 0). */
#include "cpu_amx.h"
#include "model.h"
#include "safetensors.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_X86 1
#endif

#define AMX_MCHUNK 16        /* 16-row blocks of A per chunk */
#define AMX_PREFETCH 32      /* W blocks (KiB) ahead of the loads */
#define AMX_POOL_MIN 262144  /* m n k below this: one thread */

/* Layout: element (r, c) of a rows x cols matrix. */
static size_t amx_at(size_t cols, size_t r, size_t c)
{
    size_t kb = (cols + 31) / 32;
    return ((r / 16) * kb + c / 32) * 512 + (c % 32 / 2) * 32 + (r % 16) * 2 + (c & 1);
}

size_t cpu_amx_packed_elems(size_t rows, size_t cols)
{
    return (rows + 15) / 16 * 16 * ((cols + 31) / 32 * 32);
}

void cpu_amx_pack(uint16_t *dst, size_t rows, size_t cols, size_t r0, size_t nr,
                  const void *src, enum cpu_wkind kind)
{
    (void)rows;
    float tmp[64];
    for (size_t r = 0; r < nr; r++) {
        if (kind == CPU_W_BF16) {
            const uint16_t *s = (const uint16_t *)src + r * cols;
            for (size_t c = 0; c < cols; c++) dst[amx_at(cols, r0 + r, c)] = s[c];
            continue;
        }
        for (size_t c0 = 0; c0 < cols; c0 += 64) {
            size_t w = cols - c0 < 64 ? cols - c0 : 64;
            const float *f = (const float *)src + r * cols + c0;
            if (kind == CPU_W_F16) {
                cpu_mm_widen(tmp, (const uint16_t *)src + r * cols + c0, w, kind);
                f = tmp;
            }
            for (size_t c = 0; c < w; c++) dst[amx_at(cols, r0 + r, c0 + c)] = st_f32_to_bf16(f[c]);
        }
    }
}

void cpu_amx_row(float *dst, const uint16_t *w, size_t rows, size_t cols, size_t r)
{
    (void)rows;
    for (size_t c = 0; c < cols; c++) {
        dst[c] = st_bf16_to_f32(w[amx_at(cols, r, c)]);
    }
}

size_t cpu_amx_scratch_size(size_t m, size_t k)
{
    return (m + 15) / 16 * 16 * ((k + 31) / 32 * 32) * sizeof(uint16_t);
}

static atomic_int amx_state = -1; /* -1 not asked yet, 0 no, 1 yes */
static atomic_int amx_allowed = 1;

#ifdef AMX_X86
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

static int amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int tiles = (d >> 24) & 1, bf16 = (d >> 22) & 1, f = (b >> 16) & 1, bw = (b >> 30) & 1;
    if (!tiles || !bf16 || !f || !bw) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6u) != 0xe6u || (lo & 0x60000u) != 0x60000u) return 0; /* AVX-512, tiles */
    return syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0;
}
#endif

int cpu_amx_allow(int allow)
{
    atomic_store(&amx_allowed, allow ? 1 : 0);
    return cpu_amx_ready();
}

int cpu_amx_ready(void)
{
    if (!atomic_load_explicit(&amx_allowed, memory_order_relaxed)) return 0;
    int s = atomic_load_explicit(&amx_state, memory_order_acquire);
    if (s >= 0) return s;
#ifdef AMX_X86
    s = amx_probe();
#else
    s = 0;
#endif
    atomic_store_explicit(&amx_state, s, memory_order_release);
    return s;
}

#ifdef AMX_X86
#define AMX_TGT __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define AMX_INLINE static inline __attribute__((always_inline)) AMX_TGT

struct amx_job {
    size_t m, n, k, kp;     /* kp: k rounded up to 32 */
    size_t mblocks, bands;  /* 16-row blocks of A and of W (n rounded up) */
    const uint16_t *a;      /* mblocks * 16 x kp, row-major */
    const uint16_t *w;
    const float *bias;
    const struct cpu_amx_epi *epi;
    float *c;
    size_t ldc;
};

struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tile t of C holds rows i0.. and columns j0..: stored with the bias,
 * then the epilogue. */
AMX_INLINE void amx_store1(const struct amx_job *j, float *tmp, size_t i0, size_t j0)
{
    size_t mr = j->m - i0 < 16 ? j->m - i0 : 16, nc = j->n - j0 < 16 ? j->n - j0 : 16;
    __mmask16 mk = (__mmask16)(nc == 16 ? 0xffffu : (1u << nc) - 1);
    __m512 b = j->bias ? _mm512_maskz_loadu_ps(mk, j->bias + j0) : _mm512_setzero_ps();
    for (size_t r = 0; r < mr; r++) {
        float *out = j->c + (i0 + r) * j->ldc + j0;
        _mm512_mask_storeu_ps(out, mk, _mm512_add_ps(_mm512_loadu_ps(tmp + r * 16), b));
        if (j->epi) j->epi->fn(out, nc, j->epi->arg);
    }
}

/* One block of C: A blocks mb (and mb + 1 when two_m) against W bands nb
 * (and nb + 1 when two_n), over every column. */
AMX_INLINE void amx_block(const struct amx_job *j, size_t mb, size_t nb, int two_m, int two_n,
                          float *tmp)
{
    size_t kbs = j->kp / 32, astride = j->kp * sizeof(uint16_t);
    const uint16_t *a0 = j->a + mb * 16 * j->kp, *a1 = a0 + 16 * j->kp;
    const uint16_t *w0 = j->w + nb * kbs * 512, *w1 = w0 + kbs * 512;
    _tile_zero(0);
    if (two_n) _tile_zero(1);
    if (two_m) _tile_zero(2);
    if (two_m && two_n) _tile_zero(3);
    for (size_t kb = 0; kb < kbs; kb++) {
        _mm_prefetch((const char *)(w0 + (kb + AMX_PREFETCH) * 512), _MM_HINT_T0);
        if (two_n) _mm_prefetch((const char *)(w1 + (kb + AMX_PREFETCH) * 512), _MM_HINT_T0);
        _tile_loadd(4, a0 + kb * 32, astride);
        _tile_loadd(6, w0 + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
            _tile_loadd(7, w1 + kb * 512, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (two_m) {
            _tile_loadd(5, a1 + kb * 32, astride);
            _tile_dpbf16ps(2, 5, 6);
            if (two_n) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, tmp, 64);
    amx_store1(j, tmp, mb * 16, nb * 16);
    if (two_n) {
        _tile_stored(1, tmp, 64);
        amx_store1(j, tmp, mb * 16, nb * 16 + 16);
    }
    if (two_m) {
        _tile_stored(2, tmp, 64);
        amx_store1(j, tmp, mb * 16 + 16, nb * 16);
    }
    if (two_m && two_n) {
        _tile_stored(3, tmp, 64);
        amx_store1(j, tmp, mb * 16 + 16, nb * 16 + 16);
    }
}

/* The block at A's row block mb (and mb + 1 when below mend) and W's
 * band nb (and nb + 1 when there is one). */
static AMX_TGT void amx_block_any(const struct amx_job *j, size_t mb, size_t mend, size_t nb,
                                  float *tmp)
{
    int two_m = mb + 1 < mend, two_n = nb + 1 < j->bands;
    if (two_m && two_n)
        amx_block(j, mb, nb, 1, 1, tmp);
    else if (two_m)
        amx_block(j, mb, nb, 1, 0, tmp);
    else if (two_n)
        amx_block(j, mb, nb, 0, 1, tmp);
    else
        amx_block(j, mb, nb, 0, 0, tmp);
}

/* Part part of parts: its pairs of bands against every chunk of A. */
static AMX_TGT void amx_part(void *arg, size_t part, size_t parts)
{
    const struct amx_job *j = arg;
    size_t pairs = (j->bands + 1) / 2, p0 = pairs * part / parts, p1 = pairs * (part + 1) / parts;
    if (p0 >= p1) return;
    struct amx_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    float tmp[256] __attribute__((aligned(64)));
    for (size_t mc = 0; mc < j->mblocks; mc += AMX_MCHUNK) {
        size_t me = mc + AMX_MCHUNK < j->mblocks ? mc + AMX_MCHUNK : j->mblocks;
        for (size_t p = p0; p < p1; p++)
            for (size_t mb = mc; mb < me; mb += 2) amx_block_any(j, mb, me, 2 * p, tmp);
    }
    _tile_release();
}

/* A (m x k floats, lda) to bfloat16 rows of kp, padded with zeros to a
 * multiple of 16 rows. */
static AMX_TGT void amx_convert(uint16_t *dst, size_t m, size_t k, size_t kp, const float *a,
                                size_t lda)
{
    size_t mp = (m + 15) / 16 * 16;
    for (size_t i = 0; i < mp; i++) {
        uint16_t *d = dst + i * kp;
        if (i >= m) {
            memset(d, 0, kp * sizeof(uint16_t));
            continue;
        }
        const float *s = a + i * lda;
        for (size_t c = 0; c < kp; c += 32) {
            size_t left = c < k ? k - c : 0;
            __mmask16 lo = (__mmask16)(left >= 16 ? 0xffffu : (1u << left) - 1);
            __mmask16 hi = (__mmask16)(left >= 32 ? 0xffffu : left > 16 ? (1u << (left - 16)) - 1 : 0);
            __m512 x0 = _mm512_maskz_loadu_ps(lo, s + c), x1 = _mm512_maskz_loadu_ps(hi, s + c + 16);
            __m512bh v = _mm512_cvtne2ps_pbh(x1, x0);
            _mm512_storeu_si512((void *)(d + c), (__m512i)v);
        }
    }
}

static void amx_part_fn(void *arg, size_t part, size_t parts)
{
    amx_part(arg, part, parts);
}

/* One row of A (a decode step) takes no tiles: W's bands are read in
 * order, each 64-byte line (one column pair of a band's 16 rows) giving
 * its low halves by a shift and its high halves by a mask, times the
 * pair's two elements of A (rounded to bfloat16 first, as the tiles'
 * A is: the products are as exact), for all 16 rows at once.
 * The decode chain of a SmolLM2-135M shape read 26-27 GB/s of weights
 * on two threads through the tiles, 30 this way. */
struct amx_row_job {
    size_t n, kp, bands;
    const float *a;         /* kp floats, zero past k */
    const uint16_t *w;
    const float *bias;
    const struct cpu_amx_epi *epi;
    float *c;
};

#define AMX_ROW_AHEAD 4096 /* bytes of W prefetched into L2 ahead of the loads */

static AMX_TGT void amx_row_part(void *arg, size_t part, size_t parts)
{
    const struct amx_row_job *j = arg;
    size_t b0 = j->bands * part / parts, b1 = j->bands * (part + 1) / parts;
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (size_t b = b0; b < b1; b++) {
        const uint16_t *w = j->w + b * 16 * j->kp;
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (size_t e = 0; e < j->kp; e += 4) { /* two column pairs */
            const uint16_t *line = w + e * 16;
            _mm_prefetch((const char *)line + AMX_ROW_AHEAD, _MM_HINT_T1);
            _mm_prefetch((const char *)line + AMX_ROW_AHEAD + 64, _MM_HINT_T1);
            __m512i x0 = _mm512_loadu_si512(line), x1 = _mm512_loadu_si512(line + 32);
            s0 = _mm512_fmadd_ps(_mm512_set1_ps(j->a[e]),
                                 _mm512_castsi512_ps(_mm512_slli_epi32(x0, 16)), s0);
            s1 = _mm512_fmadd_ps(_mm512_set1_ps(j->a[e + 1]),
                                 _mm512_castsi512_ps(_mm512_and_si512(x0, hi)), s1);
            s2 = _mm512_fmadd_ps(_mm512_set1_ps(j->a[e + 2]),
                                 _mm512_castsi512_ps(_mm512_slli_epi32(x1, 16)), s2);
            s3 = _mm512_fmadd_ps(_mm512_set1_ps(j->a[e + 3]),
                                 _mm512_castsi512_ps(_mm512_and_si512(x1, hi)), s3);
        }
        size_t j0 = b * 16, nc = j->n - j0 < 16 ? j->n - j0 : 16;
        __mmask16 mk = (__mmask16)(nc == 16 ? 0xffffu : (1u << nc) - 1);
        __m512 v = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
        if (j->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, j->bias + j0));
        _mm512_mask_storeu_ps(j->c + j0, mk, v);
        if (j->epi) j->epi->fn(j->c + j0, nc, j->epi->arg);
    }
}

static void amx_row_part_fn(void *arg, size_t part, size_t parts)
{
    amx_row_part(arg, part, parts);
}

/* C (one row) = A W^T over the packed W, the scratch holding A padded. */
static void amx_row(size_t n, size_t k, const float *a, const uint16_t *w, const float *bias,
                    const struct cpu_amx_epi *epi, float *c, void *scratch)
{
    struct amx_row_job j = {.n = n, .kp = (k + 31) / 32 * 32, .bands = (n + 15) / 16,
                            .a = scratch, .w = w, .bias = bias, .epi = epi, .c = c};
    float *ap = scratch;
    for (size_t e = 0; e < k; e++) ap[e] = st_bf16_to_f32(st_f32_to_bf16(a[e]));
    memset(ap + k, 0, (j.kp - k) * sizeof(float));
    if (n * k < AMX_POOL_MIN / 4)
        amx_row_part(&j, 0, 1);
    else
        cpu_par(amx_row_part_fn, &j, j.bands);
}
#endif

void cpu_amx_mm(size_t m, size_t n, size_t k, const float *a, size_t lda, const uint16_t *w,
                size_t rows, const float *bias, const struct cpu_amx_epi *epi, float *c,
                size_t ldc, void *scratch)
{
    if (n > rows) return; /* past the packed rows: refused (the backend checks) */
#ifdef AMX_X86
    if (m == 1) {
        amx_row(n, k, a, w, bias, epi, c, scratch);
        return;
    }
    struct amx_job j = {.m = m, .n = n, .k = k, .kp = (k + 31) / 32 * 32,
                        .mblocks = (m + 15) / 16, .bands = (n + 15) / 16, .a = scratch,
                        .w = w, .bias = bias, .epi = epi, .c = c, .ldc = ldc};
    amx_convert(scratch, m, k, j.kp, a, lda);
    if (m * n * k < AMX_POOL_MIN)
        amx_part(&j, 0, 1);
    else
        cpu_par(amx_part_fn, &j, (j.bands + 1) / 2);
#else
    (void)m, (void)n, (void)k, (void)a, (void)lda, (void)w, (void)bias, (void)epi, (void)c;
    (void)ldc;
    (void)scratch;
#endif
}

static double amx_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double model_cpu_amx_peak(size_t n, double seconds)
{
    if (!n || n > 8192 || !cpu_amx_ready()) return 0;
    float *a = malloc(n * n * sizeof(float)), *c = malloc(n * n * sizeof(float));
    uint16_t *w = calloc(cpu_amx_packed_elems(n, n), sizeof(uint16_t));
    void *scratch = aligned_alloc(64, (cpu_amx_scratch_size(n, n) + 63) / 64 * 64);
    double best = 0;
    if (a && c && w && scratch) {
        for (size_t i = 0; i < n * n; i++) a[i] = (float)(i % 7) * 0.25f - 0.75f;
        for (size_t r = 0; r < n; r++) cpu_amx_pack(w, n, n, r, 1, a + r * n, CPU_W_F32);
        double start = amx_now();
        for (int rep = 0; rep < 3 || amx_now() - start < seconds; rep++) {
            double t0 = amx_now();
            cpu_amx_mm(n, n, n, a, n, w, n, NULL, NULL, c, n, scratch);
            double s = amx_now() - t0, gf = 2.0 * (double)n * (double)n * (double)n / s / 1e9;
            if (s > 0 && gf > best) best = gf;
        }
    }
    free(a);
    free(c);
    free(w);
    free(scratch);
    return best;
}

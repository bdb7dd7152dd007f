// cuda_attn.cu - paged attention for prefill chunks (kc_paged_prefill,
// called by kc_paged_attention in gpu/cuda_kernels.cu when a step has
// enough tokens): a block takes a tile of consecutive packed tokens and
// the query heads of one cache head that it holds (all of them under
// grouped-query attention when they fit), up to kRows query rows, so
// every key and value it loads from the cache serves all of those rows
// instead of one. A mixed step (decode tokens packed first, then prompt
// chunks) is split: its lone tokens go to the one-row kernel, the chunks
// after them here, so that no block walks a tile of decode tokens'
// contexts one after the other while the rest of the step waits (unless
// a tile is one token, which walks nothing: then the whole step comes
// here).
//
// The block's rows are (token, head) pairs, token-major. It walks its
// tokens in runs of the same sequence (the whole tile when it lies inside
// one prefill chunk; a token at a time between sequences or for decode
// tokens), so correctness never depends on how the step's tokens are
// packed: seq and pos are device memory, read by the kernel, never by the
// host. For a run, the rows' queries go to shared memory; then the run's
// cache positions 0 .. (its largest position) are taken in steps of
// kSpan: the step's slots; its keys, bk at a time (to float32, coalesced)
// into shared memory, and every row's scores against them (float32 dot,
// times scale; -inf past the row's own position: causal); one warp per
// row takes the step's max and sum and turns the scores into weights
// (the online softmax: the running max and sum of exponentials rescaled
// to the new max, and the row's outputs with them); then the values, bk
// at a time, and each thread adds the weighted values into its own
// elements of the rows' outputs, kept in registers. The L x L scores are
// never stored: only each row's scores over one step.
//
// A row's arithmetic is paged_attn_span's (gpu/cuda_kernels.cu) in the
// same order: steps of kThreads positions from 0, the dot in element
// order, the step's sum warp by warp through the same butterfly, the
// weighted values in position order. So a token's output does not depend
// on whether its step took this kernel or the one-row walk (a prompt read
// whole or in chunks, a token alone or in a batch), as the generation
// engine's bit-for-bit checks expect; the emulated device checks it. (The
// flash-decoding split of gpu/cuda_kernels.cu sums a row's context in
// parts, in another order: a long context's row differs in the last bits
// between a split step and an unsplit one.)
//
// A row whose positions are not all in the table (a block id not below
// blocks, a table entry past table_w) or whose position reaches max_ctx
// answers NaN, as paged_attn_kernel does; nothing outside the table or
// the cache is read.
//
// Every loop bound and every branch around a barrier is the same for the
// whole block (computed from the launch's sizes and from seq and pos,
// which every thread reads alike), so every __syncthreads is reached by
// every thread; reductions are warp shuffles, no atomics, so the emulated
// device (emu/) runs it as it is.
//
// Threads: the launcher is called by executor threads on their own
// streams; no state.
#include "cuda_common.cuh"

#include <math.h>
#include <stdint.h>

namespace {

// Query rows a block holds: tokens x heads of one cache head.
constexpr int kRows = 16;
// Positions of one online-softmax step: paged_attn_span's tile (one
// position per thread there), so that a row's sums are taken in the same
// order and come out the same to the bit.
constexpr int kSpan = kThreads;
// Floats of shared memory for the rows' queries (kRows x dh), their
// scores over a step (kRows x kSpan) and a part of the step's keys or
// values (bk rows of dh + 1: the odd stride puts the keys that a warp's
// threads read at once in different banks): 44 KiB, under the 48 KiB of
// static shared memory with the step's slots and the rows' state.
constexpr int kBuf = 11264;
// Output elements a thread keeps: kRows x dh over the block's threads.
constexpr int kPer = kRows * KC_PAGED_MAX_DH / kThreads;
static_assert(kRows * KC_PAGED_MAX_DH % kThreads == 0, "whole outputs per thread");
static_assert(kSpan == 8 * 32 && kWarps == 8, "a step's sum as block_reduce takes it");
static_assert(kRows * (KC_PAGED_MAX_DH + kSpan) + KC_PAGED_MAX_DH + 1 <= kBuf,
              "room for one key at the largest head");

// Query heads a block takes: the whole group when it fits, else the
// largest divisor of the group that does (so a block never straddles two
// cache heads).
size_t prefill_heads(size_t group)
{
    size_t gh = group < (size_t)kRows ? group : (size_t)kRows;
    while (group % gh) gh--;
    return gh;
}

// Positions of keys (or values) a part holds for heads of dh values: what
// kBuf leaves after the queries and scores, at most a whole step.
size_t prefill_keys(size_t dh)
{
    size_t bk = (kBuf - kRows * (dh + kSpan)) / (dh + 1);
    return bk < (size_t)kSpan ? bk : (size_t)kSpan;
}

// Cache head g's rows (keys or values, from src, in the cache's type) at
// the nc slots into kv as float32, one row every dh + 1 floats (the odd
// stride keeps the rows' reads off one bank); a missing slot's row is
// zeros. The whole block loads.
template <typename C>
__device__ __forceinline__ void load_part(float *kv, const C *src, const long long *slots,
                                          size_t nc, size_t row, size_t g, size_t dh)
{
    for (size_t x = threadIdx.x; x < nc * dh; x += blockDim.x) {
        long long sl = slots[x / dh];
        kv[x / dh * (dh + 1) + x % dh] = sl >= 0 ? ld(src, (size_t)sl * row + g * dh + x % dh)
                                                 : 0.0f;
    }
}

// One block per (tile of bq tokens, gh query heads): grid tiles x
// heads / gh, blockIdx.x = tile x (heads / gh) + which heads.
template <typename T>
__global__ void paged_prefill_kernel(const T *q, size_t ldq, size_t tokens, size_t heads,
                                     size_t group, size_t gh, size_t bq, size_t bk, float scale,
                                     const T *K, const T *V, const uint32_t *seq,
                                     const uint32_t *pos, const uint32_t *tables,
                                     size_t table_w, size_t block_tokens, size_t blocks,
                                     size_t row, size_t dh, size_t max_ctx, T *out, size_t ldo)
{
    __shared__ float buf[kBuf];
    __shared__ float m[kRows], l[kRows], corr[kRows];
    __shared__ long long rpos[kRows], slots[kSpan];
    __shared__ int bad[kRows];
    const size_t hb = heads / gh, t0 = blockIdx.x / hb * bq, h0 = blockIdx.x % hb * gh;
    const size_t t1 = t0 + bq < tokens ? t0 + bq : tokens, g = h0 / group;
    float *qs = buf, *s = buf + kRows * dh, *kv = s + kRows * kSpan;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (size_t r0 = t0; r0 < t1;) {
        /* the run: tokens r0 .. r1 - 1 of one sequence, rows token-major */
        const size_t sq = seq[r0];
        size_t r1 = r0 + 1;
        while (r1 < t1 && seq[r1] == sq) r1++;
        const size_t nrows = (r1 - r0) * gh;
        long long jhi = -1; /* the run's largest position below max_ctx */
        for (size_t t = r0; t < r1; t++)
            if (pos[t] < max_ctx && (long long)pos[t] > jhi) jhi = pos[t];
        for (size_t i = threadIdx.x; i < (size_t)kRows; i += blockDim.x) {
            long long p = -1; /* -1: no row, or one past max_ctx */
            if (i < nrows && pos[r0 + i / gh] < max_ctx) p = pos[r0 + i / gh];
            rpos[i] = p;
            bad[i] = i < nrows && p < 0;
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        for (size_t x = threadIdx.x; x < nrows * dh; x += blockDim.x) {
            size_t i = x / dh, e = x % dh;
            qs[x] = ld(q, (r0 + i / gh) * ldq + (h0 + i % gh) * dh + e);
        }
        float acc[kPer];
        for (int k = 0; k < kPer; k++) acc[k] = 0.0f;
        /* steps of kSpan positions; a row takes part in those that start
         * at or before its position (j0 <= rpos[i]) */
        for (long long j0 = 0; j0 <= jhi; j0 += kSpan) {
            const size_t n = (size_t)(jhi + 1 - j0) < (size_t)kSpan ? (size_t)(jhi + 1 - j0)
                                                                   : (size_t)kSpan;
            for (size_t i = threadIdx.x; i < (size_t)kSpan; i += blockDim.x) {
                long long slot = -1; /* -2: the table holds no block there */
                if (i < n) {
                    size_t j = (size_t)j0 + i, b = j / block_tokens;
                    uint32_t blk = b < table_w ? tables[sq * table_w + b] : 0xffffffffu;
                    slot = blk < blocks ? (long long)((size_t)blk * block_tokens + j % block_tokens)
                                        : -2;
                }
                slots[i] = slot;
            }
            __syncthreads(); /* also: qs and the rows' state, at a run's start */
            /* scores, bk keys at a time: -inf past the row's position or
             * at a missing block */
            for (size_t c0 = 0; c0 < n; c0 += bk) {
                size_t nc = n - c0 < bk ? n - c0 : bk;
                load_part(kv, K, slots + c0, nc, row, g, dh);
                __syncthreads();
                for (size_t x = threadIdx.x; x < nrows * nc; x += blockDim.x) {
                    size_t i = x / nc, jj = x % nc;
                    long long j = j0 + (long long)(c0 + jj);
                    if (j0 > rpos[i]) continue;
                    float sc = -INFINITY;
                    if (slots[c0 + jj] >= 0 && j <= rpos[i]) {
                        const float *qr = qs + i * dh, *kr = kv + jj * (dh + 1);
                        float d = 0.0f;
                        for (size_t e = 0; e < dh; e++) d = __fmaf_rn(qr[e], kr[e], d);
                        sc = __fmul_rn(d, scale);
                    }
                    s[i * kSpan + c0 + jj] = sc;
                }
                __syncthreads(); /* before the next part overwrites kv */
            }
            /* the online softmax, one warp per row, as paged_attn_span
             * takes it: the step's max, the weights replacing the scores,
             * their sum warp by warp of 32 positions, corr rescaling what
             * the row had */
            for (size_t i = warp; i < nrows; i += kWarps) {
                if (j0 > rpos[i]) continue;
                float *si = s + i * kSpan;
                float mx = -INFINITY, miss = 0.0f;
                for (size_t jj = lane; jj < n; jj += 32) {
                    mx = fmaxf(mx, si[jj]);
                    if (slots[jj] == -2 && j0 + (long long)jj <= rpos[i]) miss = 1.0f;
                }
                mx = warp_reduce(mx, 1);
                miss = warp_reduce(miss, 1);
                float mo = m[i], mn = fmaxf(mo, mx), sum = 0.0f;
                for (int w = 0; w < kWarps; w++) { /* past the step: 0, as there */
                    size_t jj = (size_t)w * 32 + lane;
                    float pj = jj < n ? expf(si[jj] - mn) : 0.0f;
                    if (jj < n) si[jj] = pj;
                    sum = sum + warp_reduce(pj, 0);
                }
                if (lane == 0) {
                    float c = expf(mo - mn);
                    corr[i] = c;
                    l[i] = __fmaf_rn(l[i], c, sum);
                    m[i] = mn;
                    if (miss > 0.0f) bad[i] = 1;
                }
            }
            __syncthreads();
            for (int k = 0; k < kPer; k++) {
                size_t x = threadIdx.x + (size_t)k * blockDim.x;
                if (x < nrows * dh && j0 <= rpos[x / dh])
                    acc[k] = __fmul_rn(acc[k], corr[x / dh]);
            }
            /* the weighted values, bk at a time, each row's up to its
             * position, in position order */
            for (size_t c0 = 0; c0 < n; c0 += bk) {
                size_t nc = n - c0 < bk ? n - c0 : bk;
                load_part(kv, V, slots + c0, nc, row, g, dh);
                __syncthreads();
                for (int k = 0; k < kPer; k++) {
                    size_t x = threadIdx.x + (size_t)k * blockDim.x;
                    if (x >= nrows * dh) break;
                    size_t i = x / dh, e = x % dh;
                    long long last = rpos[i] - j0 - (long long)c0; /* its last in the part */
                    if (last < 0) continue;
                    size_t end = (size_t)last < nc ? (size_t)last + 1 : nc;
                    const float *w = s + i * kSpan + c0;
                    float a = acc[k];
                    for (size_t jj = 0; jj < end; jj++)
                        a = __fmaf_rn(w[jj], kv[jj * (dh + 1) + e], a);
                    acc[k] = a;
                }
                __syncthreads(); /* before the next part or step overwrites kv, s, slots */
            }
        }
        __syncthreads(); /* a run with no step: its state was still written */
        for (int k = 0; k < kPer; k++) {
            size_t x = threadIdx.x + (size_t)k * blockDim.x;
            if (x >= nrows * dh) break;
            size_t i = x / dh, e = x % dh;
            st(out, (r0 + i / gh) * ldo + (h0 + i % gh) * dh + e, bad[i] ? NAN : acc[k] / l[i]);
        }
        __syncthreads(); /* the next run overwrites qs and the rows' state */
        r0 = r1;
    }
}

}  // namespace

size_t kc_paged_prefill_tokens(size_t group)
{
    return group ? (size_t)kRows / prefill_heads(group) : 0;
}

cudaError_t kc_paged_prefill(cudaStream_t s, enum kc_type t, const void *q, size_t ldq,
                             size_t tokens, size_t heads, size_t group, float scale,
                             const void *K, const void *V, const uint32_t *seq,
                             const uint32_t *pos, const uint32_t *tables, size_t table_w,
                             size_t block_tokens, size_t blocks, size_t kv_heads, size_t dh,
                             size_t max_ctx, void *out, size_t ldo)
{
    if (tokens == 0 || group == 0 || dh == 0 || dh > KC_PAGED_MAX_DH || block_tokens == 0 ||
        table_w == 0 || heads != kv_heads * group || max_ctx == 0)
        return cudaErrorInvalidValue;
    size_t gh = prefill_heads(group), bq = kRows / gh, bk = prefill_keys(dh);
    size_t grid = (tokens + bq - 1) / bq * (heads / gh);
    if (grid > 0x7fffffffu) return cudaErrorInvalidValue;
    return with_type(t, [&](auto *p) {
        using T = KC_T(p);
        paged_prefill_kernel<<<(unsigned)grid, kThreads, 0, s>>>(
            (const T *)q, ldq, tokens, heads, group, gh, bq, bk, scale, (const T *)K,
            (const T *)V, seq, pos, tables, table_w, block_tokens, blocks, kv_heads * dh, dh, max_ctx, (T *)out, ldo);
    });
}

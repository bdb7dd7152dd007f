// cuda_sample.cu - choosing each row's next token on the device
// (kc_sample, cuda_kernels.h): the same choice as the host's sampler
// (gen/sample.h) from the same logits and the same uniform draw, so only
// a token id and its log-probability per row come back to the host.
//
// One block per row. The order of the filters and the draw are the
// host's: greedy is the largest finite logit, the lowest id among equals;
// otherwise top-k, then top-p over what top-k kept, then min-p, then one
// draw walking the kept tokens in id order. Nothing is sorted: ordering
// by probability is ordering by logit (scaling by 1 / temperature keeps
// the order, and equal logits stay equal), so each filter is a cut in the
// order "higher logit first, lower id among equals": every token whose
// logit is above a threshold value, and the c lowest ids of those equal
// to it (the host's selection and sort break ties by id the same way).
// The threshold is found by bisection over the float's order-preserving
// 32-bit key (-0 counted as +0, as the host's comparisons do): for top-k
// the largest key t with at least k tokens at or above it, for top-p the
// largest t whose tokens at or above it hold at least top_p of top-k's
// mass; the count c of the tokens equal to it comes from the host's own
// rule (top-k: k minus those above; top-p: add them one at a time while
// the mass so far is below top_p, the first token always kept). Each
// bisection step is one pass over the row.
//
// Values: e_i = exp(l_i / T - max / T) in float64, as the host computes
// them (top-p's bisection guesses in float first, then checks its
// answer in float64); the masses are float64 sums in another order than the host's, so
// a boundary (top-p's, min-p's, the draw's) can only fall differently
// when it lies within a few float64 roundings of it. The draw: the kept
// tokens' e summed in id order, each thread a contiguous chunk of ids and
// an exclusive scan over the chunks; the token is the first whose running
// sum passes u times the kept mass (the last kept one if rounding leaves
// none). The log-probability is the raw log-softmax of the chosen logit.
//
// No atomics: reductions are warp shuffles and a shared array of the
// warps' results, so the emulated device (emu/) runs it as it is.
//
// Threads: launchers are called by executor threads on their own
// streams; no state.
#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }

// Finite (neither NaN nor an infinity), without the library's macros.
__device__ __forceinline__ bool fin(float x) { return x - x == 0.0f; }

// The order-preserving key of a finite float: larger float, larger key;
// -0 and +0 are one key (they compare equal). Every finite key is above 0.
__device__ __forceinline__ uint32_t key_of(float x)
{
    if (x == 0.0f) x = 0.0f;
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float val_of(uint32_t k)
{
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

struct Sum {
    template <typename V>
    __device__ V operator()(V a, V b) const { return a + b; }
};
struct Max {
    template <typename V>
    __device__ V operator()(V a, V b) const { return a > b ? a : b; }
};
struct Min {
    template <typename V>
    __device__ V operator()(V a, V b) const { return a < b ? a : b; }
};

// The block's reduction of v under op, the same value in every thread
// (each lane combines in the same order). sh: kWarps values of shared
// memory; two barriers; every thread must call it.
template <typename V, typename Op>
__device__ V block_all(V v, Op op, V *sh)
{
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    V r = sh[0];
    for (int k = 1; k < kWarps; k++) r = op(r, sh[k]);
    __syncthreads();
    return r;
}

// The sum of v over the threads before this one (exclusive scan), and
// the block's total in *all. Same calling rules as block_all.
template <typename V>
__device__ V block_scan(V v, V *sh, V *all)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    V x = v;
    for (int o = 1; o < 32; o <<= 1) {
        V y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    V ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = 0;
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    V before = 0, total = 0;
    for (int k = 0; k < kWarps; k++) {
        if (k < warp) before += sh[k];
        total += sh[k];
    }
    __syncthreads();
    *all = total;
    return before + ex;
}

template <typename T>
__global__ void sample_kernel(const T *logits, size_t ldl, size_t n,
                              const struct kc_sample_row *rows, struct kc_sample_out *out,
                              int32_t *ids)
{
    __shared__ double shd[kWarps];
    __shared__ unsigned long long shu[kWarps];
    const struct kc_sample_row p = rows[blockIdx.x];
    if (!(p.flags & KC_SAMPLE_ON)) return;  // the whole block: no barrier is skipped
    const T *x = logits + blockIdx.x * ldl;
    struct kc_sample_out *o = out + blockIdx.x;
    const size_t tid = threadIdx.x;

    // The largest finite logit (its key above, the complement of its id
    // below: the lowest id wins among equals) and how many are finite.
    unsigned long long best = 0, cnt = 0;
    for (size_t i = tid; i < n; i += kThreads) {
        float v = ld(x, i);
        if (!fin(v)) continue;
        cnt++;
        unsigned long long b = (unsigned long long)key_of(v) << 32 | (0xffffffffu - (uint32_t)i);
        if (b > best) best = b;
    }
    best = block_all(best, Max(), shu);
    cnt = block_all(cnt, Sum(), shu);
    if (best == 0) {
        if (tid == 0) {
            o->id = -1;
            o->logprob = NAN;
            if (ids) ids[blockIdx.x] = 0;
        }
        return;
    }
    const uint32_t kmax = (uint32_t)(best >> 32);
    const float mx = val_of(kmax);
    int32_t id = (int32_t)(0xffffffffu - (uint32_t)best);

    if (p.temperature > 0.0f) {
        const double it = 1.0 / (double)p.temperature, mv = (double)mx * it;
        auto e_of = [=](float v) { return exp((double)v * it - mv); };
        // Count (and, with mass, sum e over) the finite tokens whose key
        // is above lo (strict) or at least lo.
        auto count_from = [&](uint32_t lo, bool strict, double *mass) {
            unsigned long long c = 0;
            double s = 0.0;
            for (size_t i = tid; i < n; i += kThreads) {
                float v = ld(x, i);
                if (!fin(v)) continue;
                uint32_t k = key_of(v);
                if (strict ? k > lo : k >= lo) {
                    c++;
                    if (mass) s += e_of(v);
                }
            }
            if (mass) *mass = block_all(s, Sum(), shd);
            return block_all(c, Sum(), shu);
        };

        // The cut: tokens with key above tk, and the tc lowest ids of
        // those equal to tk (tk 0: every finite token). S: its mass.
        uint32_t tk = 0;
        unsigned long long tc = ~0ull, above_n = 0;
        double S, above = 0.0;
        if (p.top_k > 0 && p.top_k < cnt) {
            uint32_t lo = 1, hi = kmax;  // count(key >= 1) = cnt >= top_k
            while (lo < hi) {
                uint32_t mid = lo + (hi - lo + 1) / 2;
                if (count_from(mid, false, nullptr) >= p.top_k)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            tk = lo;
            above_n = count_from(tk, true, &above);
            tc = p.top_k - above_n;
            S = above + (double)tc * e_of(val_of(tk));
        } else {
            count_from(0, true, &S);
        }

        if (p.top_p < 1.0f) {
            // The largest key t >= tk whose tokens at or above it hold at
            // least top_p of S (t = tk holds all of S).
            // The bisection's passes take e in float (expf), a guess that
            // one float64 pass then checks: the answer is the one key
            // whose tokens at or above it hold at least P and those above
            // it less. Only a guess within float roundings of the
            // boundary fails the check, and the float64 bisection runs.
            const double P = (double)p.top_p * S;
            auto bisect = [&](bool quick) {
                uint32_t lo = tk, hi = kmax;
                while (lo < hi) {
                    uint32_t mid = lo + (hi - lo + 1) / 2;
                    double g = 0.0;
                    if (quick) {
                        for (size_t i = tid; i < n; i += kThreads) {
                            float v = ld(x, i);
                            if (fin(v) && key_of(v) >= mid)
                                g += (double)expf((float)((double)v * it - mv));
                        }
                        g = block_all(g, Sum(), shd);
                    } else {
                        count_from(mid, false, &g);
                    }
                    if (g >= P)
                        lo = mid;
                    else
                        hi = mid - 1;
                }
                return lo;
            };
            uint32_t lo = bisect(true);
            double at;
            unsigned long long at_n;
            for (int exact = 0;; exact = 1) {
                at_n = count_from(lo, false, &at);
                above_n = count_from(lo, true, &above);
                if (exact || ((lo == tk || at >= P) && above < P)) break;
                lo = bisect(false);
            }
            unsigned long long avail = lo != tk ? at_n - above_n : tc;
            // The host's loop: a token stays while those before it (in
            // the order) hold less than top_p, the first one always.
            const double et = e_of(val_of(lo));
            double cum = above;
            unsigned long long c = 0;
            while (c < avail && (above_n + c == 0 || cum < P)) {
                cum += et;
                c++;
            }
            tk = lo;
            tc = c;
        }
        const double floor = (double)p.min_p;  // e of the most likely is 1

        // The draw over the kept tokens in id order: thread tid walks ids
        // [b, end). Its share of the tokens equal to tk comes first.
        const size_t chunk = (n + kThreads - 1) / kThreads;
        const size_t b = tid * chunk < n ? tid * chunk : n;
        const size_t end = b + chunk < n ? b + chunk : n;
        unsigned long long ties = 0, ties_before, ties_all;
        for (size_t i = b; i < end; i++) {
            float v = ld(x, i);
            if (fin(v) && key_of(v) == tk) ties++;
        }
        ties_before = block_scan(ties, shu, &ties_all);
        const unsigned long long quota =
            tc > ties_before ? (tc - ties_before < ties ? tc - ties_before : ties) : 0;
        auto walk = [&](double start, double target, size_t *hit, size_t *last) {
            unsigned long long seen = 0;
            double acc = start;
            for (size_t i = b; i < end; i++) {
                float v = ld(x, i);
                if (!fin(v)) continue;
                uint32_t k = key_of(v);
                if (k < tk || (k == tk && seen++ >= quota)) continue;
                double e = e_of(v);
                if (floor > 0.0 && !(e >= floor)) continue;
                acc += e;
                *last = i + 1;
                if (hit && target < acc) {
                    *hit = i;
                    break;
                }
            }
            return acc - start;
        };
        size_t last = 0, hit = SIZE_MAX;
        double mine = walk(0.0, 0.0, nullptr, &last), E;
        double start = block_scan(mine, shd, &E);
        const double target = p.u * E;
        if (mine > 0.0 && target >= start && target < start + mine) {
            size_t l2 = 0;
            walk(start, target, &hit, &l2);
        }
        unsigned long long h = block_all((unsigned long long)hit, Min(), shu);
        unsigned long long l = block_all((unsigned long long)last, Max(), shu);
        id = h != (unsigned long long)SIZE_MAX ? (int32_t)h : (int32_t)(l - 1);
    }

    // The raw log-softmax of the chosen logit, as the host's gen_logprob.
    float lp = 0.0f;
    if (p.flags & KC_SAMPLE_LOGPROB) {
        double s = 0.0;
        for (size_t i = tid; i < n; i += kThreads) {
            float v = ld(x, i);
            if (fin(v)) s += exp((double)v - (double)mx);
        }
        s = block_all(s, Sum(), shd);
        lp = (float)((double)ld(x, (size_t)id) - (double)mx - log(s));
    }
    if (tid == 0) {
        o->id = id;
        o->logprob = lp;
        if (ids) ids[blockIdx.x] = id;
    }
}

}  // namespace

extern "C" cudaError_t kc_sample(cudaStream_t s, enum kc_type t, const void *logits, size_t ld,
                                 size_t rows, size_t vocab, const struct kc_sample_row *p,
                                 struct kc_sample_out *out, int32_t *ids)
{
    if (rows == 0 || rows > 0x7fffffffu || vocab == 0 || vocab > 0x7fffffffu || ld < vocab ||
        !logits || !p || !out)
        return cudaErrorInvalidValue;
    switch (t) {
    case KC_F32:
        sample_kernel<<<(unsigned)rows, kThreads, 0, s>>>((const float *)logits, ld, vocab, p, out,
                                                          ids);
        break;
    case KC_F16:
        sample_kernel<<<(unsigned)rows, kThreads, 0, s>>>((const __half *)logits, ld, vocab, p,
                                                          out, ids);
        break;
    case KC_BF16:
        sample_kernel<<<(unsigned)rows, kThreads, 0, s>>>((const __nv_bfloat16 *)logits, ld,
                                                          vocab, p, out, ids);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

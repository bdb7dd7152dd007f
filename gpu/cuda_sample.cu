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
// The threshold's key is the float's order-preserving 32-bit key (-0
// counted as +0, as the host's comparisons do); the count c of the
// tokens equal to it comes from the host's own rule (top-k: k minus
// those above; top-p: add them one at a time while the mass so far is
// below top_p, the first token always kept).
//
// Two paths. The fast one, for a row whose top-k keeps at most kCand
// (4096) tokens, or whose top-p alone keeps no more than the first kCand
// of the order: four passes over the row for half and bfloat16 logits,
// five for float.
//   1. The first pass takes the max, the count of finite tokens and a
//      4096-bin count of their keys' top 12 bits (shared-memory atomic
//      adds of integers: the counts are exact whatever their order).
//   2. The key of the need-th token of the order (need: top-k's k, or
//      kCand for top-p alone; skipped when every finite token fits) in
//      more radix rounds (the next 12 bits, then for float the last 8;
//      a half's or bfloat16's low bits are all alike), each a pass
//      counting the tokens whose higher bits are the ones chosen.
//   3. The candidates, the first need tokens of the order, are gathered
//      into shared memory in id order, then into registers, kPer a
//      thread: each warp walks a stretch of ids 32 at a time (coalesced)
//      and counts, a scan over the warps places them, and a second walk
//      writes them, each lane its place from the warp's ballots. The
//      counting walk sums the row's mass when top-p's is the whole
//      row's, and exp(l - max) when the log-probability is asked.
//   4. top-p bisects over the candidates' keys (their e held in
//      registers: no pass over the row), and the draw walks them. When
//      top-p alone needs more than the candidates hold (a flat
//      distribution), the row takes the whole-row path.
// The whole-row path (top-k above kCand, such top-p rows, temperature
// and min-p alone) bisects over the keys with one pass over the row a
// step, about 32 steps for each of top-k and top-p (top-p's steps guess
// with float exponentials; one float64 pass checks the guess, and a
// float64 bisection runs where it fails), then walks the row.
//
// Values: e_i = exp(l_i / T - max / T) in float64, as the host computes
// them; the masses are float64 sums in another order than the host's, so
// a boundary (top-p's, min-p's, the draw's) can only fall differently
// when it lies within a few float64 roundings of it. Each is summed in a
// fixed order (warp shuffles and a shared array of the warps' results),
// so a row's pick is the same on every run. The draw: the kept tokens' e
// summed in id order, each thread a contiguous stretch of ids and an
// exclusive scan over the stretches; the token is the first whose
// running sum passes u times the kept mass (the last kept one if
// rounding leaves none). The log-probability is the raw log-softmax of
// the chosen logit.
//
// Atomics: only the radix rounds' integer counts. The emulated device
// (emu/) runs them as plain adds (its threads switch only at barriers
// and shuffles).
//
// Costs to watch on a device (none measured yet): lanes of a warp whose
// keys share a bin serialise their adds (a few lanes for typical logits,
// most of the warp for a narrow row); the float64 exponentials of step
// 3's sums (top-p alone over more than kCand tokens, or a log-probability)
// take one multiprocessor about a pass's time at a 128k vocabulary; at
// 106 registers a thread, one block fits a multiprocessor.
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

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// A radix round's bins (12 bits of a key), and the candidates the fast
// path holds, kPer a thread (in registers once gathered).
constexpr int kBins = 4096;
constexpr int kCand = 4096;
constexpr int kPer = kCand / kThreads;
static_assert(kBins % kThreads == 0 && kCand % kThreads == 0, "whole shares a thread");

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

// The shared memory of a row's block: a radix round's counts, or the
// candidates (their keys and ids, in id order) once those are found; and
// the warps' partial results of block_all and block_scan.
struct Shared {
    union {
        uint32_t hist[kBins];
        struct {
            uint32_t key[kCand];
            uint32_t id[kCand];
        } cand;
    } u;
    double d[kWarps];
    unsigned long long q[kWarps];
    int pick;
    unsigned long long pick_before, pick_own;
};

// The bin where a count taken from the top reaches need: base plus the
// bins above it stay below need, adding the bin reaches it (base < need
// <= base + every bin: one bin qualifies). Every thread gets the bin, the
// count above it (base included, *before) and its own count (*own).
// Every thread must call it; it ends at a barrier, so the bins may be
// overwritten afterwards.
__device__ int crossing(Shared &s, unsigned long long base, unsigned long long need,
                        unsigned long long *before, unsigned long long *own)
{
    constexpr int per = kBins / kThreads;
    const int top = kBins - (int)threadIdx.x * per;  // this thread's bins: [top - per, top)
    unsigned long long mine = 0, all;
    for (int b = top - 1; b >= top - per; b--) mine += s.u.hist[b];
    unsigned long long c = base + block_scan(mine, s.q, &all);
    if (c < need && c + mine >= need) {
        for (int b = top - 1; b >= top - per; b--) {
            if (c + s.u.hist[b] >= need) {
                s.pick = b;
                s.pick_before = c;
                s.pick_own = s.u.hist[b];
                break;
            }
            c += s.u.hist[b];
        }
    }
    __syncthreads();
    const int b = s.pick;
    *before = s.pick_before;
    *own = s.pick_own;
    __syncthreads();
    return b;
}

// The key of the need-th token in the order "higher key first" (0 < need
// < the finite tokens): the key t with fewer than need tokens above it
// and at least need at or above it, in three radix rounds of the key's
// bits from the top (12, 12, 8), each a 4096-bin count of the tokens
// whose higher bits are the ones chosen so far. Round 0's counts are in
// s.u.hist on entry (the caller's first pass takes them). *above: the
// tokens with a key above t.
template <typename T>
__device__ uint32_t select_key(const T *x, size_t n, unsigned long long need, Shared &s,
                               unsigned long long *above)
{
    // A half's or a bfloat16's key has its low 13 or 16 bits all equal
    // (0 for a positive value, 1 for a negative one): two rounds decide.
    constexpr int rounds = std::is_same<T, float>::value ? 3 : 2;
    uint32_t prefix = 0;
    unsigned long long base = 0, own;
    for (int r = 0; r < rounds; r++) {
        const int shift = r == 0 ? 20 : r == 1 ? 8 : 0, width = r == 2 ? 8 : 12;
        if (r > 0) {
            for (int b = threadIdx.x; b < kBins; b += kThreads) s.u.hist[b] = 0;
            __syncthreads();
            for (size_t i = threadIdx.x; i < n; i += kThreads) {
                float v = ld(x, i);
                if (!fin(v)) continue;
                uint32_t k = key_of(v);
                if ((k >> (shift + width)) == prefix)
                    atomicAdd(&s.u.hist[(k >> shift) & ((1u << width) - 1u)], 1u);
            }
            __syncthreads();
        }
        const int b = crossing(s, base, need, &base, &own);
        prefix = prefix << width | (uint32_t)b;
    }
    if (rounds == 2) prefix = prefix << 8 | (prefix >> 23 ? 0x00u : 0xffu);
    *above = base;
    return prefix;
}

// This thread's contiguous chunk of ids, [*b, *end): the chunks of the
// threads in order cover the row in id order.
__device__ __forceinline__ void chunk_of(size_t n, size_t *b, size_t *end)
{
    const size_t chunk = (n + kThreads - 1) / kThreads;
    *b = threadIdx.x * chunk < n ? threadIdx.x * chunk : n;
    *end = *b + chunk < n ? *b + chunk : n;
}

// How many of the block's `ties` tokens equal to a cut's key this thread
// keeps when the cut keeps the first `keep` of them in id order (each
// thread counted `mine` in its own stretch of ids, the stretches in id
// order). Every thread must call it.
__device__ unsigned long long tie_quota(unsigned long long mine, unsigned long long keep,
                                        Shared &s)
{
    unsigned long long all, before = block_scan(mine, s.q, &all);
    return keep > before ? (keep - before < mine ? keep - before : mine) : 0;
}

// How many of the avail tokens equal to top-p's cut key (e each) it
// keeps, after above_n tokens above it holding `above`: the host's loop,
// a token stays while those before it (in the order) hold less than P,
// the first one always.
__device__ unsigned long long top_p_ties(double above, unsigned long long above_n,
                                         unsigned long long avail, double e, double P)
{
    unsigned long long c = 0;
    while (c < avail && (above_n + c == 0 || above < P)) {
        above += e;
        c++;
    }
    return c;
}

// The lowest thread whose claim is set (kThreads when none is). Every
// thread must call it.
__device__ unsigned first_past(bool claim, Shared &s)
{
    return (unsigned)block_all(claim ? (unsigned long long)threadIdx.x : (unsigned long long)kThreads,
                               Min(), s.q);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const T *logits, size_t ldl, size_t n, const struct kc_sample_row *rows,
                  struct kc_sample_out *out, int32_t *ids)
{
    __shared__ Shared s;
    const struct kc_sample_row p = rows[blockIdx.x];
    if (!(p.flags & KC_SAMPLE_ON)) return;  // the whole block: no barrier is skipped
    const T *x = logits + blockIdx.x * ldl;
    struct kc_sample_out *o = out + blockIdx.x;
    const size_t tid = threadIdx.x;
    const bool sampled = p.temperature > 0.0f;
    // The fast path's candidates: top-k's survivors (top-k at most kCand),
    // or the first kCand tokens of the order (top-p alone). The first
    // pass takes the first radix round's counts for it.
    const bool hist = sampled && (p.top_k > 0 || p.top_p < 1.0f);
    if (hist) {
        for (int b = tid; b < kBins; b += kThreads) s.u.hist[b] = 0;
        __syncthreads();
    }

    // The largest finite logit (its key above, the complement of its id
    // below: the lowest id wins among equals) and how many are finite.
    unsigned long long best = 0, cnt = 0;
    for (size_t i = tid; i < n; i += kThreads) {
        float v = ld(x, i);
        if (!fin(v)) continue;
        cnt++;
        const uint32_t k = key_of(v);
        unsigned long long b = (unsigned long long)k << 32 | (0xffffffffu - (uint32_t)i);
        if (b > best) best = b;
        if (hist) atomicAdd(&s.u.hist[k >> 20], 1u);
    }
    best = block_all(best, Max(), s.q);
    cnt = block_all(cnt, Sum(), s.q);
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
    const bool want_lp = (p.flags & KC_SAMPLE_LOGPROB) != 0;
    double lsum = -1.0;  // the sum of exp(l - max) over the row, once taken

    if (sampled) {
        const double it = 1.0 / (double)p.temperature, mv = (double)mx * it;
        auto e_of = [=](float v) { return exp((double)v * it - mv); };
        const double floor = (double)p.min_p;  // e of the most likely is 1
        const bool use_k = p.top_k > 0 && p.top_k < cnt, use_p = p.top_p < 1.0f;
        bool fast = hist && (use_k || use_p) && (!use_k || p.top_k <= (uint32_t)kCand);

        if (fast) {
            // The candidates: the first need tokens of the order (all the
            // finite ones when they fit): those above the key c and the
            // lowest ids of those equal to it.
            const bool select = use_k || cnt > (unsigned long long)kCand;
            const unsigned long long need = use_k ? p.top_k : (unsigned long long)kCand;
            unsigned long long above = 0;
            const uint32_t c = select ? select_key(x, n, need, s, &above) : 0;
            // Gathered in id order: each warp takes a stretch of ids, 32 at
            // a time (coalesced), and counts; a scan over the warps places
            // them; then the warp walks its stretch again and writes, each
            // lane its place among the warp's kept ones (ballots). The
            // counting walk also sums e over the whole row when top-p's
            // mass is the row's, and exp(l - max) when asked.
            const unsigned lane = tid & 31, below = (1u << lane) - 1u;
            const size_t span = ((n + kWarps - 1) / kWarps + 31) / 32 * 32;
            const size_t wb = (tid >> 5) * span < n ? (tid >> 5) * span : n;
            const size_t we = wb + span < n ? wb + span : n;
            unsigned long long up = 0, eq = 0;  // the warp's, in every lane
            double es = 0.0, ls = 0.0;
            for (size_t i0 = wb; i0 < we; i0 += 32) {
                const size_t i = i0 + lane;
                const float v = i < we ? ld(x, i) : NAN;
                const bool f = fin(v);
                const uint32_t k = f ? key_of(v) : 0;
                up += __popc(__ballot_sync(0xffffffffu, f && k > c));
                eq += __popc(__ballot_sync(0xffffffffu, f && k == c));
                if (f && !use_k && use_p) es += e_of(v);
                if (f && want_lp) ls += exp((double)v - (double)mx);
            }
            // the warp's quota of ties and its first place (lane 0's
            // counts stand for the warp in the scans)
            unsigned long long quota = tie_quota(lane ? 0 : eq, select ? need - above : 0, s);
            quota = __shfl_sync(0xffffffffu, quota, 0);
            unsigned long long m, at = block_scan(lane ? 0 : up + quota, s.q, &m);
            at = __shfl_sync(0xffffffffu, at, 0);
            const unsigned long long last = at + up + quota;
            unsigned long long ties = 0;
            for (size_t i0 = wb; i0 < we && at < last; i0 += 32) {
                const size_t i = i0 + lane;
                const float v = i < we ? ld(x, i) : NAN;
                const bool f = fin(v);
                const uint32_t k = f ? key_of(v) : 0;
                const unsigned tb = __ballot_sync(0xffffffffu, f && k == c);
                const bool keep = f && (k > c || (k == c && ties + __popc(tb & below) < quota));
                const unsigned kb = __ballot_sync(0xffffffffu, keep);
                if (keep) {
                    const unsigned long long pl = at + __popc(kb & below);
                    s.u.cand.key[pl] = k;
                    s.u.cand.id[pl] = (uint32_t)i;
                }
                at += __popc(kb);
                ties += __popc(tb);
            }
            if (want_lp) lsum = block_all(ls, Sum(), s.d);
            es = block_all(es, Sum(), s.d);  // also the barrier before the reads below

            // This thread's candidates: [tid kPer, tid kPer + kPer).
            uint32_t kk[kPer], ii[kPer];
            double ek[kPer], M = 0.0;
            uint32_t kmin = 0xffffffffu;
            for (int j = 0; j < kPer; j++) {
                const size_t at_j = tid * kPer + j;
                kk[j] = at_j < m ? s.u.cand.key[at_j] : 0;
                ii[j] = at_j < m ? s.u.cand.id[at_j] : 0;
                ek[j] = at_j < m ? e_of(val_of(kk[j])) : 0.0;
                M += ek[j];
                if (at_j < m && kk[j] < kmin) kmin = kk[j];
            }
            M = block_all(M, Sum(), s.d);
            kmin = (uint32_t)block_all((unsigned long long)kmin, Min(), s.q);

            // The cut within them: every candidate above ck, and the first
            // ct of those equal to it (ck 0: all of them).
            uint32_t ck = 0;
            unsigned long long ct = ~0ull;
            if (use_p) {
                // top-p's mass: top-k's survivors', or the whole row's
                const double S = use_k || !select ? M : es, P = (double)p.top_p * S;
                if (M < P) {
                    fast = false;  // top-p keeps more than the candidates
                } else {
                    // the largest key t whose candidates at or above it
                    // hold at least P (at kmin they hold M)
                    uint32_t lo = kmin, hi = kmax;
                    while (lo < hi) {
                        uint32_t mid = lo + (hi - lo + 1) / 2;
                        double g = 0.0;
                        for (int j = 0; j < kPer; j++) g += kk[j] >= mid ? ek[j] : 0.0;
                        if (block_all(g, Sum(), s.d) >= P)
                            lo = mid;
                        else
                            hi = mid - 1;
                    }
                    double up_e = 0.0;
                    unsigned long long up_n = 0, eq_n = 0;
                    for (int j = 0; j < kPer; j++) {
                        up_e += kk[j] > lo ? ek[j] : 0.0;
                        up_n += kk[j] > lo;
                        eq_n += kk[j] == lo && tid * kPer + j < m;
                    }
                    up_e = block_all(up_e, Sum(), s.d);
                    up_n = block_all(up_n, Sum(), s.q);
                    eq_n = block_all(eq_n, Sum(), s.q);
                    ck = lo;
                    ct = top_p_ties(up_e, up_n, eq_n, e_of(val_of(lo)), P);
                }
            }
            if (fast) {
                // The draw over the kept candidates in id order.
                unsigned long long eq_c = 0;
                for (int j = 0; j < kPer; j++) eq_c += kk[j] == ck && tid * kPer + j < m;
                const unsigned long long q = tie_quota(eq_c, ct, s);
                auto kept = [&](int j, unsigned long long *seen_j) {
                    if (tid * kPer + j >= m) return false;
                    if (kk[j] < ck || (kk[j] == ck && (*seen_j)++ >= q)) return false;
                    return !(floor > 0.0 && !(ek[j] >= floor));
                };
                double mine = 0.0;
                uint32_t last = 0, hit = 0xffffffffu;
                unsigned long long seen_j = 0;
                for (int j = 0; j < kPer; j++)
                    if (kept(j, &seen_j)) {
                        mine += ek[j];
                        last = ii[j] + 1;
                    }
                double E, start = block_scan(mine, s.d, &E);
                const double target = p.u * E;
                // the first thread whose kept tokens end past the target
                // walks them (its own last one if rounding leaves the
                // target between its sums and the scan's)
                if (tid == first_past(mine > 0.0 && target < start + mine, s)) {
                    double acc = start;
                    seen_j = 0;
                    hit = last - 1;
                    for (int j = 0; j < kPer; j++)
                        if (kept(j, &seen_j)) {
                            acc += ek[j];
                            if (target < acc) {
                                hit = ii[j];
                                break;
                            }
                        }
                }
                const uint32_t h = (uint32_t)block_all((unsigned long long)hit, Min(), s.q);
                const uint32_t l = (uint32_t)block_all((unsigned long long)last, Max(), s.q);
                id = h != 0xffffffffu ? (int32_t)h : (int32_t)(l - 1);
            }
        }

        if (!fast) {
            // Count (and, with mass, sum e over) the finite tokens whose key
            // is above lo (strict) or at least lo.
            auto count_from = [&](uint32_t lo, bool strict, double *mass) {
                unsigned long long c = 0;
                double sum = 0.0;
                for (size_t i = tid; i < n; i += kThreads) {
                    float v = ld(x, i);
                    if (!fin(v)) continue;
                    uint32_t k = key_of(v);
                    if (strict ? k > lo : k >= lo) {
                        c++;
                        if (mass) sum += e_of(v);
                    }
                }
                if (mass) *mass = block_all(sum, Sum(), s.d);
                return block_all(c, Sum(), s.q);
            };

            // The cut: tokens with key above tk, and the tc lowest ids of
            // those equal to tk (tk 0: every finite token). S: its mass.
            uint32_t tk = 0;
            unsigned long long tc = ~0ull, above_n = 0;
            double S = 0.0, above = 0.0;
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
            } else if (p.top_p < 1.0f) {
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
                            g = block_all(g, Sum(), s.d);
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
                tc = top_p_ties(above, above_n, avail, e_of(val_of(lo)), P);
                tk = lo;
            }
            // The draw over the kept tokens in id order: thread tid walks ids
            // [b, end). Its share of the tokens equal to tk comes first.
            size_t b, end;
            chunk_of(n, &b, &end);
            unsigned long long ties = 0;
            for (size_t i = b; i < end; i++) {
                float v = ld(x, i);
                if (fin(v) && key_of(v) == tk) ties++;
            }
            const unsigned long long quota = tie_quota(ties, tc, s);
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
            double start = block_scan(mine, s.d, &E);
            const double target = p.u * E;
            if (tid == first_past(mine > 0.0 && target < start + mine, s)) {
                size_t l2 = 0;
                walk(start, target, &hit, &l2);
                if (hit == SIZE_MAX) hit = last - 1;
            }
            unsigned long long h = block_all((unsigned long long)hit, Min(), s.q);
            unsigned long long l = block_all((unsigned long long)last, Max(), s.q);
            id = h != (unsigned long long)SIZE_MAX ? (int32_t)h : (int32_t)(l - 1);
        }
    }

    // The raw log-softmax of the chosen logit, as the host's gen_logprob.
    float lp = 0.0f;
    if (want_lp) {
        if (lsum < 0.0) {
            double sum = 0.0;
            for (size_t i = tid; i < n; i += kThreads) {
                float v = ld(x, i);
                if (fin(v)) sum += exp((double)v - (double)mx);
            }
            lsum = block_all(sum, Sum(), s.d);
        }
        lp = (float)((double)ld(x, (size_t)id) - (double)mx - log(lsum));
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

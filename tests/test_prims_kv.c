/* test_prims_kv.c - the decoding primitives of the backend seam
 * (gpu/backend.h: swiglu, kv_store, paged_attention) on the CPU backend,
 * against a float64 reference written here, on fresh random shapes and
 * values each run (the seed is printed; KINFER_TEST_SEED replays it).
 *
 * Proves:
 * - swiglu is silu(gate) * up row by row, for large and small inputs;
 * - kv_store puts each token's key and value heads in the slot its
 *   sequence's block table gives its position, and nowhere else, with
 *   blocks handed out by gpu/kvcache.c to interleaved sequences (so a
 *   sequence's blocks are not contiguous) and block sizes from 1 up; in
 *   odd rounds the keys rotated to their positions on the way (rope's
 *   rotation, against float64), the attention then over those; too few
 *   frequencies refused;
 * - paged_attention of a batch of several sequences, each with a
 *   different number of cached positions (0 too) and of new tokens
 *   (a prefill chunk, or one decode token), multi-head and grouped-query
 *   (1 to 4 and 8 query heads a cache head; contexts of one token, of
 *   whole blocks and of the longest allowed),
 *   with strided q and output, equals softmax(scale q k^T) v over
 *   positions 0 .. pos of the dense reference;
 * - both refuse a position their table does not cover.
 * - the same with the cache in bfloat16 (worker.cpu_precision "bf16"):
 *   each value stored rounded once (a key after its rotation in float32).
 * Tolerance: 2e-5 relative to the output's largest magnitude (at least 1);
 * 1e-2 with the bfloat16 cache. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/backend.h"
#include "../gpu/cpu_mm.h"
#include "../gpu/kvcache.h"
#include "../gpu/safetensors.h"
#include "testutil.h"

#define TOL 2e-5
/* With the cache in bfloat16 (worker.cpu_precision "bf16"): each cached
 * value is off by at most 2^-9 of itself, so outputs (averages of values
 * of at most 1) by at most about 4e-3. */
#define TOL16 1e-2

static size_t irand(size_t lo, size_t hi)
{
    return lo + (size_t)(tu_rand64() % (uint64_t)(hi - lo + 1));
}

static float *rnd(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = tu_randf(-1, 1);
    return p;
}

static double tol = TOL; /* TOL16 while the cache is bfloat16 */

static double check(const char *what, const float *got, const double *ref, size_t n)
{
    double scale = 1.0, worst = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (tol * scale);
        if (!(e <= 1.0))
            fail_msg("%s: element %zu is %.9g, reference %.9g", what, i, (double)got[i],
                     ref[i]);
        if (e > worst) worst = e;
    }
    return worst;
}

struct dev {
    const struct backend_ops *o;
    void *be, *c;
    int kv16; /* the cache in bfloat16 */
};

static void dev_open(struct dev *d, int bf16)
{
    struct model_runtime_conf conf;
    model_runtime_conf_defaults(&conf);
    conf.cpu_precision = bf16 ? MODEL_BF16 : MODEL_FP32;
    char desc[400], err[300];
    d->o = &backend_cpu;
    d->be = d->o->open(&conf, desc, sizeof(desc), err, sizeof(err));
    if (!d->be) fail_msg("open: %s", err);
    d->c = d->o->ctx_new(d->be, 0, err, sizeof(err));
    if (!d->c) fail_msg("ctx_new: %s", err);
    d->kv16 = d->o->kv_size(d->be) == 2;
    assert_int_equal(d->o->kv_size(d->be), bf16 ? 2 : 4);
}

/* Cache element e (either type) as a float. */
static float cache_at(const struct dev *d, const void *p, size_t e)
{
    return d->kv16 ? st_bf16_to_f32(((const uint16_t *)p)[e]) : ((const float *)p)[e];
}

/* x as the cache holds it. */
static float cached(const struct dev *d, float x)
{
    return d->kv16 ? st_bf16_to_f32(st_f32_to_bf16(x)) : x;
}

static void dev_close(struct dev *d)
{
    d->o->ctx_free(d->c);
    d->o->close(d->be);
}

static void *dev_put(struct dev *d, const void *h, size_t bytes)
{
    void *p = d->o->ctx_alloc(d->c, bytes ? bytes : 1, 0);
    assert_non_null(p);
    if (h) assert_int_equal(d->o->upload(d->c, p, h, bytes), 0);
    return p;
}

static void test_swiglu(void **state)
{
    (void)state;
    struct dev d;
    dev_open(&d, 0);
    for (int round = 0; round < 7; round++) {
        /* the last two: enough rows for the pool, on two threads */
        size_t rows = round < 5 ? irand(1, 9) : irand(30, 60);
        size_t w = round < 5 ? irand(1, 70) : irand(300, 700);
        cpu_mm_threads(round < 5 ? 1 : 2);
        float *x = rnd(rows * 2 * w);
        for (size_t i = 0; i < rows * 2 * w; i += 7) x[i] *= 40; /* saturating gates */
        double *ref = malloc(rows * w * sizeof(double));
        assert_non_null(ref);
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < w; j++) {
                double g = x[r * 2 * w + j], u = x[r * 2 * w + w + j];
                ref[r * w + j] = g / (1.0 + exp(-g)) * u;
            }
        void *dx = dev_put(&d, NULL, rows * 2 * w * 4), *dy = dev_put(&d, NULL, rows * w * 4);
        assert_int_equal(d.o->load_f32(d.c, dx, x, rows * 2 * w), 0);
        assert_int_equal(d.o->swiglu(d.c, dy, dx, rows, w), 0);
        float *got = malloc(rows * w * sizeof(float));
        assert_non_null(got);
        assert_int_equal(d.o->store_f32(d.c, got, dy, rows * w), 0);
        check("swiglu", got, ref, rows * w);
        free(x), free(ref), free(got);
    }
    cpu_mm_threads(1);
    dev_close(&d);
}

/* One random case: n sequences, each with past[i] cached positions and
 * k[i] new tokens; the past is stored first (one kv_store over all of
 * it), then the new tokens are stored and attend. */
static void paged_case(struct dev *d, int round)
{
    char err[256];
    static const size_t ratios[] = {1, 2, 3, 4, 8}; /* query heads per cache head */
    size_t n = irand(1, 5), kvh = irand(1, 3), group = ratios[irand(0, 4)], heads = kvh * group;
    size_t dh = 2 * irand(1, 8), bt = irand(1, 6), max_ctx = irand(1, 40);
    size_t past[5], k[5], total_new = 0, total_past = 0;
    for (size_t i = 0; i < n; i++) {
        /* the edges: the longest context, a context of one token, one of
         * whole blocks (its last position at a block's end) */
        size_t len = irand(1, max_ctx);
        if (i == 0 && round % 3 == 0) len = max_ctx;
        if (i == 1 && round % 3 == 1) len = 1;
        if (i == 2 && max_ctx >= bt) len = bt * irand(1, max_ctx / bt);
        k[i] = (i == 0 || tu_rand64() % 2) ? irand(1, len) : 1;
        past[i] = len - k[i];
        total_new += k[i];
        total_past += past[i];
    }
    size_t width = (max_ctx + bt - 1) / bt, blocks = n * width + irand(0, 3);
    struct kvcache *kv = kvcache_new(blocks, bt, n, max_ctx, err, sizeof(err));
    assert_non_null(kv);
    int ids[5];
    for (size_t i = 0; i < n; i++) ids[i] = kvcache_seq_new(kv);
    /* interleaved growth: sequence blocks are scattered over the pool */
    for (size_t step = 0; step < max_ctx; step++)
        for (size_t i = 0; i < n; i++)
            if (step < past[i] + k[i]) assert_int_equal(kvcache_extend(kv, ids[i], 1), 0);
    uint32_t *tables = malloc(n * width * sizeof(uint32_t));
    assert_non_null(tables);
    for (size_t i = 0; i < n; i++)
        memcpy(tables + i * width, kvcache_table(kv, ids[i]), width * sizeof(uint32_t));
    /* the dense reference: keys and values of every position */
    size_t row = kvh * dh, ldx = 3 * row + irand(0, 3); /* [junk | K | V] rows, strided */
    float *Kd[5], *Vd[5];
    for (size_t i = 0; i < n; i++) {
        Kd[i] = rnd((past[i] + k[i]) * row);
        Vd[i] = rnd((past[i] + k[i]) * row);
    }
    /* odd rounds: the keys rotated to their positions as they are stored
     * (rope's rotation inside kv_store); Kr: the keys the cache must hold */
    int use_rope = round % 2;
    double *Kr[5];
    float *f = malloc(dh / 2 * sizeof(float));
    assert_non_null(f);
    for (size_t i = 0; i < dh / 2; i++) f[i] = (float)pow(10000.0, -2.0 * (double)i / (double)dh);
    struct bk_wsrc fsrc = {.f = f, .n = dh / 2};
    char werr[128];
    struct bk_weight *fw =
        use_rope ? d->o->weight_new(d->be, 0, BK_W_F32, &fsrc, 1, werr, sizeof(werr)) : NULL;
    assert_true(!use_rope || fw);
    for (size_t i = 0; i < n; i++) {
        Kr[i] = tu_cached_keys(Kd[i], past[i] + k[i], row, kvh, dh, use_rope ? f : NULL);
        assert_non_null(Kr[i]);
    }
    size_t cache_floats = blocks * bt * row, es = d->kv16 ? 2 : 4;
    void *Kc = dev_put(d, NULL, cache_floats * es), *Vc = dev_put(d, NULL, cache_floats * es);
    for (size_t e = 0; e < cache_floats; e++) { /* unwritten slots poison */
        if (d->kv16) {
            ((uint16_t *)Kc)[e] = ((uint16_t *)Vc)[e] = st_f32_to_bf16(NAN);
        } else {
            ((float *)Kc)[e] = ((float *)Vc)[e] = NAN;
        }
    }
    struct bk_kv cache = {.k = Kc, .v = Vc, .blocks = blocks, .block_tokens = bt,
                          .kv_heads = kvh, .dh = dh, .table_w = width};
    cache.tables = dev_put(d, tables, n * width * sizeof(uint32_t));
    /* two stores: the past, then the new tokens */
    for (int phase = 0; phase < 2; phase++) {
        size_t T = phase ? total_new : total_past, t = 0;
        uint32_t *seq = malloc((T ? T : 1) * 4), *pos = malloc((T ? T : 1) * 4);
        float *x = malloc((T ? T : 1) * ldx * sizeof(float));
        assert_true(seq && pos && x);
        for (size_t i = 0; i < n; i++) {
            size_t p0 = phase ? past[i] : 0, p1 = phase ? past[i] + k[i] : past[i];
            for (size_t p = p0; p < p1; p++, t++) {
                seq[t] = (uint32_t)i;
                pos[t] = (uint32_t)p;
                for (size_t e = 0; e < ldx; e++) x[t * ldx + e] = tu_randf(-1, 1);
                memcpy(x + t * ldx + ldx - 2 * row, Kd[i] + p * row, row * 4);
                memcpy(x + t * ldx + ldx - row, Vd[i] + p * row, row * 4);
            }
        }
        struct bk_seqs s = {.n = n, .tokens = T, .seq = dev_put(d, seq, T * 4),
                            .pos = dev_put(d, pos, T * 4)};
        void *dx = dev_put(d, NULL, T * ldx * 4);
        assert_int_equal(d->o->load_f32(d->c, dx, x, T * ldx), 0);
        float *dk = (float *)dx + ldx - 2 * row, *dv = (float *)dx + ldx - row;
        if (T) assert_int_equal(d->o->kv_store(d->c, &cache, dk, ldx, dv, ldx, &s, fw), 0);
        free(seq), free(pos), free(x);
    }
    /* every position's slot holds its key and value (as the cache's type
     * holds them: exactly, rounded once) */
    float *kg = malloc(row * sizeof(float));
    assert_non_null(kg);
    for (size_t i = 0; i < n; i++)
        for (size_t p = 0; p < past[i] + k[i]; p++) {
            size_t slot = (size_t)tables[i * width + p / bt] * bt + p % bt;
            for (size_t e = 0; e < row; e++) {
                kg[e] = cache_at(d, Kc, slot * row + e);
                float vg = cache_at(d, Vc, slot * row + e), vw = cached(d, Vd[i][p * row + e]);
                if (memcmp(&vg, &vw, sizeof(vg)))
                    fail_msg("kv_store: value %zu of position %zu is %.9g, want %.9g", e, p,
                             (double)vg, (double)vw);
                if (!use_rope && kg[e] != cached(d, Kd[i][p * row + e]))
                    fail_msg("kv_store: key %zu of position %zu is %.9g, want %.9g", e, p,
                             (double)kg[e], (double)cached(d, Kd[i][p * row + e]));
            }
            if (use_rope) check("kv_store with rope", kg, Kr[i] + p * row, row);
        }
    free(kg);
    /* attention of the new tokens */
    size_t ldq = heads * dh + irand(0, 3), ldo = heads * dh + irand(0, 3), T = total_new;
    float *q = rnd(T * ldq);
    uint32_t *seq = malloc(T * 4), *pos = malloc(T * 4);
    double *ref = calloc(T * ldo, sizeof(double));
    assert_true(seq && pos && ref);
    size_t t = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t p = past[i]; p < past[i] + k[i]; p++, t++) {
            seq[t] = (uint32_t)i;
            pos[t] = (uint32_t)p;
            for (size_t h = 0; h < heads; h++) {
                size_t g = h / group;
                double sc[64], mx = -INFINITY, sum = 0;
                for (size_t j = 0; j <= p; j++) {
                    double dot = 0;
                    for (size_t e = 0; e < dh; e++)
                        dot += (double)q[t * ldq + h * dh + e] * Kr[i][j * row + g * dh + e];
                    sc[j] = dot / sqrt((double)dh);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (size_t j = 0; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (size_t e = 0; e < dh; e++) {
                    double o = 0;
                    for (size_t j = 0; j <= p; j++) o += sc[j] / sum * Vd[i][j * row + g * dh + e];
                    ref[t * ldo + h * dh + e] = o;
                }
            }
        }
    struct bk_seqs s = {.n = n, .tokens = T, .seq = dev_put(d, seq, T * 4),
                        .pos = dev_put(d, pos, T * 4)};
    void *dq = dev_put(d, NULL, T * ldq * 4), *dout = dev_put(d, NULL, T * ldo * 4);
    assert_int_equal(d->o->load_f32(d->c, dq, q, T * ldq), 0);
    struct bk_paged_attention pa = {
        .q = dq, .ldq = ldq, .heads = heads, .scale = (float)(1.0 / sqrt((double)dh)),
        .kv = &cache, .s = &s, .max_ctx = max_ctx, .out = dout, .ldo = ldo,
        .scratch = dev_put(d, NULL, d->o->paged_attention_scratch(d->be, T, max_ctx, heads))};
    assert_int_equal(d->o->paged_attention(d->c, &pa), 0);
    float *got = malloc(T * ldo * sizeof(float));
    assert_non_null(got);
    assert_int_equal(d->o->store_f32(d->c, got, dout, T * ldo), 0);
    for (size_t r = 0; r < T; r++) /* the padding columns are not compared */
        for (size_t e = heads * dh; e < ldo; e++) got[r * ldo + e] = (float)ref[r * ldo + e];
    char what[160];
    snprintf(what, sizeof(what), "paged attention #%d: %zu seqs, %zu/%zu heads, dh %zu, block %zu",
             round, n, heads, kvh, dh, bt);
    double worst = check(what, got, ref, T * ldo);
    if (round < 4) printf("  %-70s worst err/tol %.3f\n", what, worst);
    /* a position past the table is refused */
    uint32_t bad = (uint32_t)(width * bt);
    struct bk_seqs sb = {.n = 1, .tokens = 1, .seq = dev_put(d, &(uint32_t){0}, 4),
                         .pos = dev_put(d, &bad, 4)};
    assert_int_equal(d->o->kv_store(d->c, &cache, dq, ldq, dq, ldq, &sb, NULL), MODEL_EINVAL);
    if (round == 1 && dh > 2) { /* too few frequencies for the heads */
        struct bk_wsrc one = {.f = f, .n = 1};
        struct bk_weight *w1 = d->o->weight_new(d->be, 0, BK_W_F32, &one, 1, werr, sizeof(werr));
        assert_non_null(w1);
        assert_int_equal(d->o->kv_store(d->c, &cache, dq, ldq, dq, ldq, &s, w1), MODEL_EINVAL);
        assert_non_null(strstr(d->o->ctx_error(d->c), "rotary"));
        d->o->weight_free(d->be, w1);
    }
    pa.s = &sb;
    pa.max_ctx = bad + 1;
    assert_int_equal(d->o->paged_attention(d->c, &pa), MODEL_EINVAL);
    assert_non_null(strstr(d->o->ctx_error(d->c), "position"));
    for (size_t i = 0; i < n; i++) free(Kd[i]), free(Vd[i]), free(Kr[i]);
    if (fw) d->o->weight_free(d->be, fw);
    free(f);
    free(tables), free(q), free(seq), free(pos), free(ref), free(got);
    kvcache_destroy(kv);
}

static void test_paged(void **state)
{
    (void)state;
    struct dev d;
    dev_open(&d, 0);
    for (int round = 0; round < 40; round++) paged_case(&d, round);
    dev_close(&d);
}

/* The same with the cache in bfloat16 (worker.cpu_precision "bf16"),
 * against the same float64 reference within TOL16. */
static void test_paged_bf16(void **state)
{
    (void)state;
    struct dev d;
    dev_open(&d, 1);
    tol = TOL16;
    for (int round = 0; round < 40; round++) paged_case(&d, round);
    tol = TOL;
    dev_close(&d);
}

int main(void)
{
    tu_seed("test_prims_kv");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_paged),
        cmocka_unit_test(test_paged_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

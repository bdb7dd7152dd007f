/* test_gpu_plan.c - gpu/plan.c, the host-side decisions of the CUDA
 * backend, which run on any machine: device selection from gpu.devices,
 * executor slots spread over devices, the graph keys' LRU (test_shapes),
 * which kernels take a step of paged attention (test_paged_plan), and
 * weight conversion into each precision (bit for bit where
 * the file already holds that format, round to nearest even otherwise,
 * checked against a rounding written here on fresh random values).
 *
 * Single-threaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/plan.h"
#include "testutil.h"

/* gpu.devices: empty is every device; indices are checked against the
 * machine's count and for repeats, and keep their order. */
static void test_devices(void **state)
{
    (void)state;
    int out[MODEL_MAX_DEVICES];
    char why[256];
    assert_int_equal(plan_devices(NULL, 0, 3, out, why, sizeof(why)), 3);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[2], 2);
    const int two[] = {2, 0};
    assert_int_equal(plan_devices(two, 2, 4, out, why, sizeof(why)), 2);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 0);
    const int bad[] = {0, 4};
    assert_int_equal(plan_devices(bad, 2, 4, out, why, sizeof(why)), -1);
    assert_string_equal(why, "gpu.devices: device 4 does not exist (4 usable: 0..3)");
    const int dup[] = {1, 1};
    assert_int_equal(plan_devices(dup, 2, 4, out, why, sizeof(why)), -1);
    assert_string_equal(why, "gpu.devices: device 1 is listed twice");
    assert_int_equal(plan_devices(NULL, 0, 0, out, why, sizeof(why)), -1);
    assert_string_equal(why, "no usable CUDA device");
    /* More devices than a worker takes: the first MODEL_MAX_DEVICES. */
    assert_int_equal(plan_devices(NULL, 0, 40, out, why, sizeof(why)), MODEL_MAX_DEVICES);
}

/* Executor slots go round robin, so each device gets its share. */
static void test_slots(void **state)
{
    (void)state;
    size_t nd = 1 + tu_rand64() % 8, per[MODEL_MAX_DEVICES] = {0};
    unsigned slots = (unsigned)(nd * (1 + tu_rand64() % 4));
    for (unsigned s = 0; s < slots; s++) {
        size_t d = plan_slot_device(s, nd);
        assert_true(d < nd);
        per[d]++;
    }
    for (size_t d = 0; d < nd; d++) assert_int_equal(per[d], slots / nd);
    assert_int_equal(plan_slot_device(5, 0), 0);
}

/* An independent float32 -> bfloat16 rounding: nearest, ties to even, on
 * the value (not the bits), NaN kept a NaN. */
static uint16_t ref_bf16(float f)
{
    if (isnan(f)) return 0x7fc0;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float a, b;
    memcpy(&a, &lo, 4);
    memcpy(&b, &hi, 4);
    double da = fabs((double)f - a), db = fabs((double)f - b);
    if (isinf(b) && !isinf(f)) { /* the next bf16 up is infinity: compare to 2^128 */
        db = fabs((double)f - ldexp(1.0, 128) * (f < 0 ? -1 : 1));
    }
    if (da < db || (da == db && !((lo >> 16) & 1))) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

/* Tensors of each loadable dtype, converted to each precision: same
 * format copies bits; float32 targets widen exactly; 16-bit targets round
 * to nearest even (bf16 checked against ref_bf16, fp16 against the
 * nearest of the two halves around the value). */
static void test_convert(void **state)
{
    (void)state;
    enum { N = 4096 };
    float vals[N];
    for (size_t i = 0; i < N; i++) {
        int e = (int)(tu_rand64() % 40) - 20;
        vals[i] = ldexpf(tu_randf(-1, 1), e);
    }
    vals[0] = 0.0f;
    vals[1] = -0.0f;
    vals[2] = 65504.0f;     /* largest half */
    vals[3] = 1e-8f;        /* below half's subnormals */
    unsigned char f32[N * 4], f16[N * 2], b16[N * 2];
    for (size_t i = 0; i < N; i++) {
        uint32_t u;
        memcpy(&u, &vals[i], 4);
        for (int k = 0; k < 4; k++) f32[4 * i + k] = (unsigned char)(u >> (8 * k));
        uint16_t h = st_f32_to_f16(vals[i]), b = st_f32_to_bf16(vals[i]);
        f16[2 * i] = (unsigned char)h;
        f16[2 * i + 1] = (unsigned char)(h >> 8);
        b16[2 * i] = (unsigned char)b;
        b16[2 * i + 1] = (unsigned char)(b >> 8);
    }
    struct st_tensor t32 = {.name = "a", .dtype = ST_F32, .ndim = 1, .shape = {N}, .numel = N,
                            .data = f32, .nbytes = sizeof(f32)};
    struct st_tensor t16 = t32, tb16 = t32;
    t16.dtype = ST_F16;
    t16.data = f16;
    tb16.dtype = ST_BF16;
    tb16.data = b16;
    static float out32[N];
    static uint16_t out16[N];
    /* F32 into each precision. */
    assert_int_equal(plan_convert(&t32, MODEL_FP32, out32), 0);
    assert_memory_equal(out32, vals, sizeof(vals));
    assert_int_equal(plan_convert(&t32, MODEL_TF32, out32), 0);
    assert_memory_equal(out32, vals, sizeof(vals));
    assert_int_equal(plan_convert(&t32, MODEL_BF16, out16), 0);
    for (size_t i = 0; i < N; i++)
        if (out16[i] != ref_bf16(vals[i]))
            fail_msg("bf16 of %a: got %04x, want %04x", (double)vals[i], out16[i],
                     ref_bf16(vals[i]));
    assert_int_equal(plan_convert(&t32, MODEL_FP16, out16), 0);
    for (size_t i = 0; i < N; i++) {
        double v = vals[i], got = st_f16_to_f32(out16[i]);
        /* Past the midpoint between the largest half and 2^16, IEEE
         * rounding overflows to infinity. */
        if (fabs(v) >= 65520.0) {
            if (!isinf(got)) fail_msg("fp16 of %a: got %a, want infinity", v, got);
            continue;
        }
        if (isinf(got)) fail_msg("fp16 of %a: got infinity", v);
        /* No half lies strictly between the value and the one chosen. */
        uint16_t up = (uint16_t)(out16[i] + 1), down = (uint16_t)(out16[i] - 1);
        double nb[2] = {st_f16_to_f32(up), st_f16_to_f32(down)};
        for (int k = 0; k < 2; k++)
            if (isfinite(nb[k]) && fabs(nb[k] - v) < fabs(got - v))
                fail_msg("fp16 of %a: %a is nearer than %a", v, nb[k], got);
    }
    assert_int_equal(out16[2], 0x7bff);
    assert_int_equal(out16[3], 0x0000);
    /* Same format: the bits as they are. */
    assert_int_equal(plan_convert(&t16, MODEL_FP16, out16), 0);
    assert_memory_equal(out16, f16, sizeof(f16));
    assert_int_equal(plan_convert(&tb16, MODEL_BF16, out16), 0);
    assert_memory_equal(out16, b16, sizeof(b16));
    /* Across 16-bit formats: through float32, exactly widened. */
    assert_int_equal(plan_convert(&t16, MODEL_BF16, out16), 0);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(out16[i], st_f32_to_bf16(st_f16_to_f32(st_f32_to_f16(vals[i]))));
    assert_int_equal(plan_convert(&tb16, MODEL_FP32, out32), 0);
    for (size_t i = 0; i < N; i++) assert_true(out32[i] == st_bf16_to_f32(st_f32_to_bf16(vals[i])));
    assert_int_equal(plan_convert_f32(&t16, out32), 0);
    for (size_t i = 0; i < N; i++) assert_true(out32[i] == st_f16_to_f32(st_f32_to_f16(vals[i])));
    /* Element sizes, and a dtype that is not a weight. */
    assert_int_equal(plan_elem_size(MODEL_FP32), 4);
    assert_int_equal(plan_elem_size(MODEL_TF32), 4);
    assert_int_equal(plan_elem_size(MODEL_FP16), 2);
    assert_int_equal(plan_elem_size(MODEL_BF16), 2);
    struct st_tensor ti = t32;
    ti.dtype = ST_I32;
    assert_int_equal(plan_convert(&ti, MODEL_FP16, out16), -1);
}

/* Precision names round-trip and unknown ones are refused. */
/* A shape key as a caller would make one: plain sizes. */
struct tkey {
    uint64_t n, tokens, len;
};

static enum plan_shape_action use(struct plan_shapes *t, struct tkey k, size_t *slot, int *evict)
{
    return plan_shape_use(t, &k, sizeof(k), slot, evict);
}

/* plan_shape_use: once eager, twice captured, then replayed; the least
 * recently used key gives its slot up, its graph with it; a key whose
 * capture failed runs eagerly; keys are compared by their bytes and
 * length. */
static void test_shapes(void **state)
{
    (void)state;
    struct plan_shapes t;
    memset(&t, 0, sizeof(t));
    size_t slot, a_slot;
    int evict;
    struct tkey a = {4, 100, 32}, b = {4, 101, 32};
    assert_int_equal(use(&t, a, &a_slot, &evict), PLAN_SHAPE_EAGER);
    assert_false(evict);
    assert_int_equal(use(&t, b, &slot, &evict), PLAN_SHAPE_EAGER);
    assert_int_not_equal(slot, a_slot);
    assert_int_equal(use(&t, a, &slot, &evict), PLAN_SHAPE_CAPTURE);
    assert_int_equal(slot, a_slot);
    /* a capture that was not finished leaves no graph: the next one tries again */
    assert_int_equal(use(&t, a, &slot, &evict), PLAN_SHAPE_CAPTURE);
    t.slot[slot].graph = 1;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(use(&t, a, &slot, &evict), PLAN_SHAPE_GRAPH);
        assert_int_equal(slot, a_slot);
        assert_false(evict);
    }
    /* every byte of the key counts, and its length */
    struct tkey c[3] = {{5, 100, 32}, {4, 100, 40}, {4, 99, 32}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(use(&t, c[i], &slot, &evict), PLAN_SHAPE_EAGER);
        assert_int_not_equal(slot, a_slot);
    }
    assert_int_equal(plan_shape_use(&t, &a, sizeof(a) - 1, &slot, &evict), PLAN_SHAPE_EAGER);
    assert_int_not_equal(slot, a_slot);
    /* a failed capture: eager from then on, while the key keeps its slot */
    struct tkey r = {9, 9, 9};
    size_t r_slot;
    assert_int_equal(use(&t, r, &r_slot, &evict), PLAN_SHAPE_EAGER);
    assert_int_equal(use(&t, r, &slot, &evict), PLAN_SHAPE_CAPTURE);
    plan_shape_refuse(&t, slot);
    for (int i = 0; i < 3; i++) assert_int_equal(use(&t, r, &slot, &evict), PLAN_SHAPE_EAGER);
    /* keys too long or empty take no slot */
    unsigned char big[PLAN_KEY_MAX + 1] = {0};
    assert_int_equal(plan_shape_use(&t, big, sizeof(big), &slot, &evict), PLAN_SHAPE_EAGER);
    assert_int_equal(slot, PLAN_SHAPE_SLOTS);
    assert_int_equal(plan_shape_use(&t, big, 0, &slot, &evict), PLAN_SHAPE_EAGER);
    assert_int_equal(slot, PLAN_SHAPE_SLOTS);
    assert_int_equal(plan_shape_use(&t, big, PLAN_KEY_MAX, &slot, &evict), PLAN_SHAPE_EAGER);
    assert_true(slot < PLAN_SHAPE_SLOTS);
    /* Fill every slot with new keys while using a now and then: the
     * others go first, a (with its graph) stays. */
    for (size_t i = 0; i < PLAN_SHAPE_SLOTS; i++) {
        struct tkey n = {1, 1000 + i, 8};
        use(&t, n, &slot, &evict);
        assert_false(evict);
        assert_int_equal(use(&t, a, &slot, &evict), PLAN_SHAPE_GRAPH);
    }
    assert_int_equal(use(&t, b, &slot, &evict), PLAN_SHAPE_EAGER); /* forgotten */
    /* Now a and b hold two slots, the other 30 older keys the rest: 30
     * new ones replace those, and the next new one evicts a (now the
     * least recently used), graph and all. */
    for (size_t i = 0; i + 2 < PLAN_SHAPE_SLOTS; i++) {
        struct tkey n = {2, 5000 + i, 8};
        use(&t, n, &slot, &evict);
        assert_false(evict);
    }
    struct tkey last = {3, 7, 8};
    assert_int_equal(use(&t, last, &slot, &evict), PLAN_SHAPE_EAGER);
    assert_true(evict);
    assert_int_equal(slot, a_slot);
    assert_false(t.slot[slot].graph);
    assert_int_equal(use(&t, a, &slot, &evict), PLAN_SHAPE_EAGER);
    /* the hash is FNV-1a */
    assert_true(plan_key_hash("", 0) == 14695981039346656037ull);
    assert_true(plan_key_hash("a", 1) == 0xaf63dc4c8601ec8cull);
}

/* Paged attention's kernels (plan_paged_attention) on fresh random steps:
 * the rule restated here, and what each kind of step must get. */
static void test_paged_plan(void **state)
{
    (void)state;
    struct plan_paged p;
    /* a decode step of few rows over a long context: split, no tiles */
    plan_paged_attention(4, 8, 2, 256, 4096, 1, 4, 4, &p);
    assert_true(p.one_rows == 32 && p.parts == 16 && p.chunk == 256 && p.skip == 4);
    /* without scratch, or over a short context: one block a row */
    plan_paged_attention(4, 8, 2, 256, 4096, 0, 4, 4, &p);
    assert_true(p.one_rows == 32 && p.parts == 1 && p.skip == 4);
    plan_paged_attention(4, 8, 2, 256, 200, 1, 4, 4, &p);
    assert_true(p.one_rows == 32 && p.parts == 1);
    /* a prompt chunk: all tiles */
    plan_paged_attention(512, 32, 4, 256, 4096, 1, 1, 0, &p);
    assert_true(p.one_rows == 0 && p.skip == 0);
    /* three decode tokens led a 500-token chunk: apart, the lone rows split */
    plan_paged_attention(503, 32, 4, 256, 4096, 1, 4, 3, &p);
    assert_true(p.one_rows == 96 && p.parts == 16 && p.skip == 3);
    /* ... the same step not told of them: all tiles */
    plan_paged_attention(503, 32, 4, 256, 4096, 1, 4, 0, &p);
    assert_true(p.one_rows == 0 && p.skip == 0);
    /* ... at a tile of one token: all tiles (no block walks several) */
    plan_paged_attention(503, 32, 1, 256, 4096, 1, 4, 3, &p);
    assert_true(p.one_rows == 0 && p.skip == 0);
    /* 200 decode tokens beside a 300-token chunk: apart, too many rows to split */
    plan_paged_attention(500, 32, 4, 256, 4096, 1, 201, 200, &p);
    assert_true(p.one_rows == 6400 && p.parts == 1 && p.skip == 200);
    /* a lone count past the tokens is taken as all of them */
    plan_paged_attention(4, 8, 2, 256, 200, 1, 4, 9, &p);
    assert_true(p.one_rows == 32 && p.skip == 4);

    for (int round = 0; round < 2000; round++) {
        size_t tokens = 1 + tu_rand64() % 600, heads = 1 + tu_rand64() % 40;
        size_t tile = 1 + tu_rand64() % 16, ctx = 1 + tu_rand64() % 9000;
        size_t lone = tu_rand64() % 2 ? tu_rand64() % (tokens + 1) : 0;
        size_t seqs = lone + (tokens > lone ? 1 + tu_rand64() % (tokens - lone) : 0);
        if (tu_rand64() % 5 == 0) seqs = 0; /* not known */
        int scratch = (int)(tu_rand64() % 2);
        plan_paged_attention(tokens, heads, tile, 256, ctx, scratch, seqs, lone, &p);
        /* the parts: whole steps of 256, at most 32, covering the context */
        assert_true(p.chunk >= 256 && p.chunk % 256 == 0 && p.parts >= 1 && p.parts <= 32);
        assert_true(p.parts == 1 || (p.parts - 1) * p.chunk < ctx);
        assert_true(p.parts * p.chunk >= ctx || p.parts == 1);
        /* every token is taken once: one-row rows are the first tokens' */
        assert_true(p.one_rows % heads == 0 && p.skip <= tokens);
        assert_true(p.skip == tokens ? p.one_rows == tokens * heads : p.one_rows == p.skip * heads);
        /* a split only for few rows, with scratch */
        assert_true(p.parts == 1 || (scratch && p.one_rows <= PLAN_SPLIT_ROWS));
        /* the tiles take a step of two tiles and a tile a sequence */
        if (p.skip < tokens) {
            size_t rest = tokens - p.skip, rs = seqs ? seqs - p.skip : 0;
            assert_true(rest >= 2 * tile && (seqs == 0 || rest >= rs * tile));
            assert_true(p.skip == 0 || (p.skip == lone && tile > 1));
        }
        /* a decode step (every token its own sequence) never takes tiles
         * unless the sequences are not known */
        if (seqs == tokens && tile > 1) assert_true(p.skip == tokens);
    }
}

static void test_precision_names(void **state)
{
    (void)state;
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        enum model_precision q;
        assert_int_equal(model_precision_parse(model_precision_name((enum model_precision)p), &q),
                         0);
        assert_int_equal(q, p);
    }
    enum model_precision q;
    assert_int_equal(model_precision_parse("fp8", &q), -1);
    assert_string_equal(model_precision_name(MODEL_N_PRECISIONS), "?");
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devices),  cmocka_unit_test(test_slots),  cmocka_unit_test(test_convert),
        cmocka_unit_test(test_precision_names), cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_paged_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* testutil.h - small helpers shared by the test programs: a fresh random
 * seed per run (printed, and overridable with KINFER_TEST_SEED so a failure
 * can be replayed) and uniform random floats. Header-only. */
#ifndef KINFER_TESTUTIL_H
#define KINFER_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

static uint64_t tu_rng_state;

/* Seeds the generator from the clock (or KINFER_TEST_SEED) and prints it. */
static inline uint64_t tu_seed(const char *prog)
{
    const char *s = getenv("KINFER_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = s ? strtoull(s, NULL, 10)
                      : (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
    if (seed == 0) seed = 1;
    tu_rng_state = seed;
    fprintf(stderr, "%s: KINFER_TEST_SEED=%llu\n", prog, (unsigned long long)seed);
    return seed;
}

/* xorshift64*: good enough for test data, reproducible from the seed. */
static inline uint64_t tu_rand64(void)
{
    uint64_t x = tu_rng_state;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    tu_rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform float in [lo, hi). */
static inline float tu_randf(float lo, float hi)
{
    return lo + (hi - lo) * (float)((tu_rand64() >> 40) * (1.0 / 16777216.0));
}

/* A GPU program that found no usable device (why says what it found):
 * prints that it is skipped and returns 77, which tests/run.sh counts as
 * skipped; with KINFER_REQUIRE_GPU=1 (tools/device-run.sh sets it) no
 * device is a failure instead: prints so and returns 1. */
static inline int tu_no_gpu(const char *prog, const char *why)
{
    const char *req = getenv("KINFER_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0) {
        printf("%s: FAILED: KINFER_REQUIRE_GPU=1 and no CUDA device (%s)\n", prog, why);
        return 1;
    }
    printf("%s: skipped: no CUDA device (%s)\n", prog, why);
    return 77;
}

/* The float64 reference of rope's rotation: rows [0, len) of x (row
 * doubles apart, heads heads of dh each) rotated to their positions 0 ..
 * len - 1 by the inverse frequencies f[dh / 2]. */
static inline void tu_rope_ref(double *x, size_t len, size_t row, size_t heads, size_t dh,
                               const float *f);

/* The keys a cache must hold for len positions of k (row floats each,
 * heads heads of dh): a malloc'd copy, rotated by tu_rope_ref when f
 * (dh / 2 inverse frequencies) is given. */
static inline double *tu_cached_keys(const float *k, size_t len, size_t row, size_t heads,
                                     size_t dh, const float *f)
{
    double *r = malloc(len * row * sizeof(double));
    if (!r) return NULL;
    for (size_t x = 0; x < len * row; x++) r[x] = k[x];
    if (f) tu_rope_ref(r, len, row, heads, dh, f);
    return r;
}

static inline void tu_rope_ref(double *x, size_t len, size_t row, size_t heads, size_t dh,
                               const float *f)
{
    for (size_t p = 0; p < len; p++)
        for (size_t h = 0; h < heads; h++)
            for (size_t c = 0; c < dh / 2; c++) {
                double th = (double)p * f[c], *o = x + p * row + h * dh;
                double a = o[c], b = o[c + dh / 2];
                o[c] = a * cos(th) - b * sin(th);
                o[c + dh / 2] = b * cos(th) + a * sin(th);
            }
}

#endif

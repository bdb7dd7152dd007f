/* test_emu_kernel.c - the emulated execution model (emu/emu_kernel.h,
 * emu/emu_kernel.cc) with the kernels of tests/emu_kernels.cu, compiled
 * by the host compiler: a grid-stride kernel over many blocks; a block
 * reduction through warp shuffles and shared memory, right with its
 * __syncthreads() and wrong without it under the shuffled thread order
 * (the proof that such a bug fails here); a histogram through atomic
 * adds to shared and device memory; a half-warp shuffle with its
 * mask honoured; a kernel launch captured in a graph and replayed; a bad
 * launch configuration (a non-sticky error); and last a shuffle whose
 * mask names lanes that left, which hangs the block and fails the launch
 * with a sticky cudaErrorLaunchFailure (reported from the next
 * synchronisation on, as a device reports it).
 *
 * Built only where CUDA's headers are. Single-threaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../emu/emu_rt.h"
#include "testutil.h"

cudaError_t emu_test_scale(cudaStream_t s, const float *x, float *y, size_t n);
cudaError_t emu_test_row_sum(cudaStream_t s, const float *x, size_t rows, size_t w, float *out,
                             int sync);
cudaError_t emu_test_half_warp(cudaStream_t s, const int *x, int *out, int leave);
cudaError_t emu_test_bad_config(cudaStream_t s, float *y);
cudaError_t emu_test_histogram(cudaStream_t s, const unsigned *x, size_t n, unsigned *out,
                               unsigned bins);
void emu_kernel_seed(uint64_t seed);

static void *dev(size_t bytes)
{
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
}

static void test_grid_stride(void **state)
{
    (void)state;
    emu_rt_reset();
    const size_t sizes[] = {1, 255, 256, 257, 5000};
    for (size_t c = 0; c < sizeof(sizes) / sizeof(sizes[0]); c++) {
        size_t n = sizes[c];
        float *h = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) h[i] = (float)i;
        float *x = dev(n * sizeof(float)), *y = dev(n * sizeof(float));
        assert_int_equal(cudaMemcpy(x, h, n * sizeof(float), cudaMemcpyHostToDevice), 0);
        assert_int_equal(emu_test_scale(NULL, x, y, n), cudaSuccess);
        assert_int_equal(cudaMemcpy(g, y, n * sizeof(float), cudaMemcpyDeviceToHost), 0);
        for (size_t i = 0; i < n; i++) assert_true(g[i] == 2.0f * (float)i + 1.0f);
        cudaFree(x);
        cudaFree(y);
        free(h);
        free(g);
    }
}

/* rows x w of small integers: every sum is exact whatever the order. */
static int row_sums(int sync, size_t rows, size_t w)
{
    float *h = malloc(rows * w * sizeof(float)), *out = malloc(rows * sizeof(float));
    double *want = calloc(rows, sizeof(double));
    for (size_t i = 0; i < rows * w; i++) {
        h[i] = (float)((int)(tu_rand64() % 7) - 3);
        want[i / w] += h[i];
    }
    float *x = dev(rows * w * sizeof(float)), *d = dev(rows * sizeof(float));
    assert_int_equal(cudaMemcpy(x, h, rows * w * sizeof(float), cudaMemcpyHostToDevice), 0);
    assert_int_equal(cudaMemset(d, 0, rows * sizeof(float)), 0);
    assert_int_equal(emu_test_row_sum(NULL, x, rows, w, d, sync), cudaSuccess);
    assert_int_equal(cudaMemcpy(out, d, rows * sizeof(float), cudaMemcpyDeviceToHost), 0);
    int wrong = 0;
    for (size_t r = 0; r < rows; r++) wrong += out[r] != (float)want[r];
    cudaFree(x);
    cudaFree(d);
    free(h);
    free(out);
    free(want);
    return wrong;
}

static void test_block_reduce(void **state)
{
    (void)state;
    emu_rt_reset();
    emu_kernel_seed(tu_rand64());
    assert_int_equal(row_sums(1, 20, 1000), 0);
    assert_int_equal(row_sums(1, 3, 7), 0);
    /* Without the barrier, thread 0 reads warps' sums not yet written. */
    int wrong = row_sums(0, 20, 1000);
    fprintf(stderr, "test_emu_kernel: without __syncthreads, %d of 20 rows wrong\n", wrong);
    assert_true(wrong > 0);
}

/* Skewed values (half of them in bin 0) so that many threads add to one
 * bin between barriers: every count must come out exact. */
static void test_atomics(void **state)
{
    (void)state;
    emu_rt_reset();
    emu_kernel_seed(tu_rand64());
    const size_t n = 20000;
    const unsigned bins = 1 + (unsigned)(tu_rand64() % 64);
    unsigned *h = malloc(n * sizeof(unsigned)), want[64] = {0}, got[64] = {0};
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) {
        h[i] = tu_rand64() % 2 ? 0 : (unsigned)(tu_rand64() % bins);
        want[h[i]]++;
    }
    unsigned *x = dev(n * sizeof(unsigned)), *out = dev(64 * sizeof(unsigned));
    assert_int_equal(cudaMemcpy(x, h, n * sizeof(unsigned), cudaMemcpyHostToDevice), 0);
    assert_int_equal(cudaMemset(out, 0, 64 * sizeof(unsigned)), 0);
    assert_int_equal(emu_test_histogram(NULL, x, n, out, bins), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost), 0);
    for (unsigned b = 0; b < bins; b++) assert_int_equal(got[b], want[b]);
    cudaFree(x);
    cudaFree(out);
    free(h);
}

static void test_half_warp(void **state)
{
    (void)state;
    emu_rt_reset();
    int h[32], got = 0;
    for (int i = 0; i < 32; i++) h[i] = i + 1;
    int *x = dev(sizeof(h)), *out = dev(sizeof(int));
    assert_int_equal(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice), 0);
    assert_int_equal(emu_test_half_warp(NULL, x, out, 0), cudaSuccess);
    assert_int_equal(cudaMemcpy(&got, out, sizeof(int), cudaMemcpyDeviceToHost), 0);
    assert_int_equal(got, 16 * 17 / 2);
    cudaFree(x);
    cudaFree(out);
}

static void test_graph_and_config(void **state)
{
    (void)state;
    emu_rt_reset();
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), 0);
    float h[300], g[300];
    for (int i = 0; i < 300; i++) h[i] = (float)i;
    float *x = dev(sizeof(h)), *y = dev(sizeof(h));
    assert_int_equal(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice), 0);
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), 0);
    assert_int_equal(emu_test_scale(s, x, y, 300), cudaSuccess);
    assert_int_equal(emu_test_scale(s, y, x, 300), cudaSuccess);
    cudaGraph_t graph;
    assert_int_equal(cudaStreamEndCapture(s, &graph), 0);
    assert_int_equal(cudaMemcpy(g, x, sizeof(g), cudaMemcpyDeviceToHost), 0);
    for (int i = 0; i < 300; i++) assert_true(g[i] == h[i]); /* nothing ran */
    cudaGraphExec_t ex;
    assert_int_equal(cudaGraphInstantiate(&ex, graph, 0), 0);
    cudaGraphDestroy(graph);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(cudaGraphLaunch(ex, s), 0);
        assert_int_equal(cudaStreamSynchronize(s), 0);
        assert_int_equal(cudaMemcpy(g, x, sizeof(g), cudaMemcpyDeviceToHost), 0);
        for (int i = 0; i < 300; i++) {
            h[i] = 2.0f * (2.0f * h[i] + 1.0f) + 1.0f;
            assert_true(g[i] == h[i]);
        }
    }
    cudaGraphExecDestroy(ex);
    assert_int_equal(emu_test_bad_config(s, y), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaFree(x);
    cudaFree(y);
    cudaStreamDestroy(s);
}

/* Last: lanes 16-31 leave, 0-15 shuffle naming all 32: the block hangs. */
static void test_hang(void **state)
{
    (void)state;
    emu_rt_reset();
    int h[32] = {0}, *x = dev(sizeof(h)), *out = dev(sizeof(int));
    assert_int_equal(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice), 0);
    /* As on a device, the launch returns; the next synchronisation fails. */
    assert_int_equal(emu_test_half_warp(NULL, x, out, 1), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(NULL), cudaErrorLaunchFailure);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchFailure); /* sticky */
    emu_rt_reset();
}

int main(void)
{
    tu_seed("test_emu_kernel");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_stride),
        cmocka_unit_test(test_block_reduce),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_half_warp),
        cmocka_unit_test(test_graph_and_config),
        cmocka_unit_test(test_hang),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

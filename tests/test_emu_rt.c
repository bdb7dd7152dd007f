/* test_emu_rt.c - the emulated CUDA runtime (emu/emu_rt.c) on its own,
 * through CUDA's own header: the device's properties (an H100, sm_90, 132
 * SMs, named "emulated"), device selection, memory and its accounting,
 * copies and memsets in stream order, the checks on device ranges, events
 * and their timing, graph capture (nothing runs while capturing) and
 * replay (the records run again, on the inputs of the moment, a cuBLASLt
 * matmul of emu/emu_lt.c among them), the calls a capture forbids (each
 * fails and invalidates the capture), and the error model: a non-sticky
 * error is cleared by cudaGetLastError, a sticky one makes every later
 * call fail until emu_rt_reset.
 *
 * Built only where CUDA's headers are; links emu/emu_rt.o and
 * emu/emu_lt.o, never kinfer's objects. Single-threaded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../emu/emu_lt.h"
#include "../emu/emu_rt.h"

static void test_device(void **state)
{
    (void)state;
    emu_rt_reset();
    int n = 0, d = -1;
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 1);
    struct cudaDeviceProp p;
    assert_int_equal(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    assert_non_null(strstr(p.name, "emulated"));
    assert_non_null(strstr(p.name, "H100"));
    assert_int_equal(p.major, 9);
    assert_int_equal(p.minor, 0);
    assert_int_equal(p.multiProcessorCount, 132);
    assert_int_equal(p.warpSize, 32);
    assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(emu_rt_configure(2, 0), 0);
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 2);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaGetDevice(&d), cudaSuccess);
    assert_int_equal(d, 1);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(emu_rt_configure(1, 0), 0);
    assert_string_equal(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress");
    int v = 0;
    assert_int_equal(cudaRuntimeGetVersion(&v), cudaSuccess);
    assert_int_equal(v, CUDART_VERSION);
}

static void test_memory(void **state)
{
    (void)state;
    emu_rt_reset();
    assert_int_equal(emu_rt_configure(1, 1 << 20), 0);
    size_t fr = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&fr, &total), cudaSuccess);
    assert_int_equal(total, 1 << 20);
    void *d = NULL, *big = NULL;
    assert_int_equal(cudaMalloc(&d, 1000), cudaSuccess);
    assert_int_equal((uintptr_t)d % 256, 0);
    assert_int_equal(emu_rt_used(0), 1000);
    assert_int_equal(cudaMalloc(&big, 2 << 20), cudaErrorMemoryAllocation);
    assert_null(big);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    unsigned char in[1000], out[1000];
    for (int i = 0; i < 1000; i++) in[i] = (unsigned char)i;
    /* In order: copy in, clear the middle, copy out. */
    assert_int_equal(cudaMemcpyAsync(d, in, 1000, cudaMemcpyHostToDevice, s), cudaSuccess);
    assert_int_equal(cudaMemsetAsync((char *)d + 100, 0, 100, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(out, d, 1000, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(out[i], i >= 100 && i < 200 ? 0 : (unsigned char)i);
    /* Ranges past an allocation, and pointers that are not device memory. */
    assert_int_equal(cudaMemcpyAsync((char *)d + 1, in, 1000, cudaMemcpyHostToDevice, s),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpyAsync(out, in, 10, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
    assert_int_equal(cudaMemsetAsync((char *)d + 999, 0, 2, s), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(in), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    void *h = NULL;
    assert_int_equal(cudaHostAlloc(&h, 64, cudaHostAllocPortable), cudaSuccess);
    assert_int_equal(cudaFree(h), cudaErrorInvalidValue); /* host memory is not cudaFree's */
    assert_int_equal(cudaFreeHost(h), cudaSuccess);
    assert_int_equal(cudaMemcpy(out, d, 10, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(emu_rt_used(0), 0);
    assert_int_equal(cudaFree(NULL), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    (void)cudaGetLastError();
    emu_rt_reset();
    assert_int_equal(emu_rt_configure(1, 0), 0);
}

static void nap(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 3000000};
    nanosleep(&ts, NULL);
}

static void test_events(void **state)
{
    (void)state;
    emu_rt_reset();
    cudaStream_t s;
    cudaEvent_t a, b, c;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(cudaEventCreate(&a), cudaSuccess);
    assert_int_equal(cudaEventCreate(&b), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&c, cudaEventDisableTiming), cudaSuccess);
    float ms = -1;
    assert_int_equal(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventRecord(a, s), cudaSuccess);
    assert_int_equal(emu_rt_enqueue(s, nap, NULL, 0), 0);
    assert_int_equal(cudaEventRecord(b, s), cudaSuccess);
    assert_int_equal(cudaEventRecord(c, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    assert_true(ms >= 3.0f && ms < 1000.0f);
    assert_int_equal(cudaEventElapsedTime(&ms, a, c), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaEventDestroy(c);
    cudaStreamDestroy(s);
}

/* ---- graphs ------------------------------------------------------------------ */

struct add_arg {
    float *x;
    size_t n;
    float v;
};

static void add_run(void *p)
{
    const struct add_arg *a = p;
    for (size_t i = 0; i < a->n; i++) a->x[i] += a->v;
}

/* in (host) -> device -> x + 1 -> D = 2 * x (a 1 x 4 x 1 cuBLASLt GEMM
 * with a bias of 0.5 in its epilogue) -> out (host), captured once and
 * replayed on new inputs. */
static void test_graph(void **state)
{
    (void)state;
    emu_rt_reset();
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *dx, *dy, *dtwo, *dbias, *hin, *hout;
    assert_int_equal(cudaMalloc((void **)&dx, 4 * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dy, 4 * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dtwo, sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dbias, sizeof(float)), cudaSuccess);
    assert_int_equal(cudaHostAlloc((void **)&hin, 4 * sizeof(float), 0), cudaSuccess);
    assert_int_equal(cudaHostAlloc((void **)&hout, 4 * sizeof(float), 0), cudaSuccess);
    const float two = 2.0f, half = 0.5f;
    assert_int_equal(cudaMemcpy(dtwo, &two, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dbias, &half, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    assert_int_equal(cublasLtCreate(&lt), 0);
    assert_int_equal(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    assert_int_equal(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof(epi)), 0);
    assert_int_equal(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &dbias, sizeof(dbias)), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 1, 1, 1), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 1, 4, 1), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 1, 4, 1), 0);
    const float one = 1.0f, zero = 0.0f;

    for (int i = 0; i < 4; i++) hin[i] = (float)i, hout[i] = -1;
    unsigned long mm = emu_lt_matmuls();
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dx, hin, 4 * sizeof(float), cudaMemcpyHostToDevice, s),
                     cudaSuccess);
    struct add_arg a = {dx, 4, 1.0f};
    assert_int_equal(emu_rt_enqueue(s, add_run, &a, sizeof(a)), 0);
    assert_int_equal(cublasLtMatmul(lt, desc, &one, dtwo, la, dx, lb, &zero, dy, lc, dy, lc, NULL,
                                    NULL, 0, s), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaMemcpyAsync(hout, dy, 4 * sizeof(float), cudaMemcpyDeviceToHost, s),
                     cudaSuccess);
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    assert_non_null(g);
    assert_int_equal(emu_lt_matmuls() - mm, 1);
    for (int i = 0; i < 4; i++) assert_true(hout[i] == -1.0f); /* nothing ran */
    cudaGraphExec_t x;
    assert_int_equal(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 4; i++) hin[i] = (float)(10 * round + i);
        assert_int_equal(cudaGraphLaunch(x, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        for (int i = 0; i < 4; i++) assert_true(hout[i] == 2.0f * (hin[i] + 1.0f) + 0.5f);
    }
    assert_int_equal(cudaGraphExecDestroy(x), cudaSuccess);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dtwo);
    cudaFree(dbias);
    cudaFreeHost(hin);
    cudaFreeHost(hout);
    cudaStreamDestroy(s);
}

/* What a capture forbids: each call fails, and the capture is lost. */
enum forbidden { FB_MALLOC, FB_FREE, FB_HOSTALLOC, FB_SYNC, FB_DEVSYNC, FB_MEMCPY, FB_MEMSET,
                 FB_LEGACY, FB_N };

static const struct {
    enum forbidden what;
    const char *name;
    cudaError_t want;
} forbidden[] = {
    {FB_MALLOC, "cudaMalloc", cudaErrorStreamCaptureUnsupported},
    {FB_FREE, "cudaFree", cudaErrorStreamCaptureUnsupported},
    {FB_HOSTALLOC, "cudaHostAlloc", cudaErrorStreamCaptureUnsupported},
    {FB_SYNC, "cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported},
    {FB_DEVSYNC, "cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported},
    {FB_MEMCPY, "cudaMemcpy", cudaErrorStreamCaptureUnsupported},
    {FB_MEMSET, "cudaMemset", cudaErrorStreamCaptureUnsupported},
    {FB_LEGACY, "work on the legacy stream", cudaErrorStreamCaptureImplicit},
};

static void test_capture_forbidden(void **state)
{
    (void)state;
    emu_rt_reset();
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *d;
    assert_int_equal(cudaMalloc((void **)&d, 64), cudaSuccess);
    float h[16] = {0};
    for (size_t i = 0; i < sizeof(forbidden) / sizeof(forbidden[0]); i++) {
        void *p = NULL, *victim = NULL;
        assert_int_equal(cudaMalloc(&victim, 16), cudaSuccess);
        assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        assert_int_equal(cudaMemsetAsync(d, 0, 64, s), cudaSuccess);
        cudaError_t e = cudaSuccess;
        struct add_arg a = {h, 16, 1.0f};
        switch (forbidden[i].what) {
        case FB_MALLOC: e = cudaMalloc(&p, 16); break;
        case FB_FREE: e = cudaFree(victim); break;
        case FB_HOSTALLOC: e = cudaHostAlloc(&p, 16, 0); break;
        case FB_SYNC: e = cudaStreamSynchronize(s); break;
        case FB_DEVSYNC: e = cudaDeviceSynchronize(); break;
        case FB_MEMCPY: e = cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost); break;
        case FB_MEMSET: e = cudaMemset(d, 0, 64); break;
        case FB_LEGACY: e = emu_rt_enqueue(NULL, add_run, &a, sizeof(a)); break;
        case FB_N: break;
        }
        if (e != forbidden[i].want)
            fail_msg("%s during capture: %s, want %s", forbidden[i].name, cudaGetErrorName(e),
                     cudaGetErrorName(forbidden[i].want));
        assert_null(p);
        cudaGraph_t g = (cudaGraph_t)(uintptr_t)1;
        assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
        assert_null(g);
        assert_int_equal(cudaFree(victim), cudaSuccess);
        (void)cudaGetLastError();
    }
    assert_true(h[0] == 0.0f); /* the legacy work never ran */
    /* Not capturing: the same calls are fine; ending is an error. */
    cudaGraph_t g;
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
    assert_int_equal(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal),
                     cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    cudaFree(d);
    cudaStreamDestroy(s);
}

static void raise_error(void *p)
{
    emu_rt_device_error(*(const int *)p);
}

/* Last: a sticky error outlives everything but emu_rt_reset. */
static void test_errors(void **state)
{
    (void)state;
    emu_rt_reset();
    cudaStream_t s;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    void *d;
    assert_int_equal(cudaMalloc(&d, 64), cudaSuccess);
    int soft = cudaErrorInvalidValue, hard = cudaErrorIllegalAddress;
    assert_int_equal(emu_rt_enqueue(s, raise_error, &soft, sizeof(soft)), 0);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(emu_rt_enqueue(s, raise_error, &hard, sizeof(hard)), 0);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
    assert_int_equal(cudaGetLastError(), cudaErrorIllegalAddress);
    assert_int_equal(cudaGetLastError(), cudaErrorIllegalAddress);
    void *p;
    assert_int_equal(cudaMalloc(&p, 16), cudaErrorIllegalAddress);
    assert_int_equal(cudaMemsetAsync(d, 0, 64, s), cudaErrorIllegalAddress);
    assert_int_equal(cudaFree(NULL), cudaErrorIllegalAddress);
    assert_int_equal(cudaSetDevice(0), cudaErrorIllegalAddress);
    assert_int_equal(emu_rt_enqueue(s, raise_error, &soft, sizeof(soft)), cudaErrorIllegalAddress);
    cudaStreamDestroy(s);
    emu_rt_reset();
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaMalloc(&p, 16), cudaSuccess);
    assert_int_equal(cudaFree(p), cudaSuccess);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device),          cmocka_unit_test(test_memory),
        cmocka_unit_test(test_events),          cmocka_unit_test(test_graph),
        cmocka_unit_test(test_capture_forbidden), cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

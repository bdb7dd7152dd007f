/* test_gpu.c - the CUDA backend (gpu/backend_cuda.c and its kernels)
 * against the float64 reference of tests/refmodel.h, on fresh random
 * models and inputs: every op alone and whole models, every batch size
 * from 1 to MAX_ROWS through one workspace (so every graph bucket and its
 * padding), in every precision; F16/BF16 weight files used as they are;
 * graph replay against eager launches; several executors at once against
 * one; and an injected device fault answered MODEL_EFATAL. `make test-gpu`
 * runs it; `make test` builds and runs it too, and on a machine without a
 * usable CUDA device (or a build without CUDA) it prints
 * "skipped: no CUDA device" and exits 0.
 *
 * Tolerance, per precision, |got - ref| <= tol * max(1, |ref|) as in
 * test_model.c, with activations of O(1) and layers up to 128 wide:
 *   fp32  2e-5  float32 throughout; the GEMM sums in another order than
 *               OpenBLAS and the kernels use CUDA's expf/erfcf (a few ulp)
 *   tf32  1e-2  GEMM inputs rounded to 10 mantissa bits (2^-11 each), over
 *               K <= 128 terms and a few layers
 *   fp16  1e-2  activations and weights stored in half (2^-11), float32
 *               accumulation
 *   bf16  6e-2  8 mantissa bits (2^-8), float32 accumulation
 * These bounds are estimates written before the first run on a device;
 * the worst ratio each test saw is printed so they can be tightened (see
 * docs/gpu.md).
 *
 * Threads: the concurrency test runs four executor threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <unistd.h>

#include "refmodel.h"
#include "testutil.h"

#define MAX_ROWS 64

static const double tolerance[MODEL_N_PRECISIONS] = {
    [MODEL_FP32] = 2e-5, [MODEL_TF32] = 1e-2, [MODEL_FP16] = 1e-2, [MODEL_BF16] = 6e-2};

static char dir[64], path[128];

/* A CUDA runtime in precision p, graphs on or off; fails the test when
 * it cannot open. */
static struct model_runtime *cuda_rt(enum model_precision p, int graphs)
{
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cuda";
    rc.precision = p;
    rc.graphs = graphs;
    char err[512];
    struct model_runtime *rt = model_runtime_new(&rc, err, sizeof(err));
    if (!rt) fail_msg("model_runtime_new(cuda, %s): %s", model_precision_name(p), err);
    assert_string_equal(model_runtime_backend(rt), "cuda");
    assert_string_equal(model_runtime_precision(rt), model_precision_name(p));
    return rt;
}

static struct model *load(struct model_runtime *rt, struct built *b)
{
    char err[512];
    struct model *m = model_load(rt, &b->spec, err, sizeof(err));
    if (!m) fail_msg("model_load: %s", err);
    return m;
}

static struct model_ws *ws_new(const struct model *m, unsigned slot, size_t rows)
{
    char err[512];
    struct model_ws *ws = model_ws_new(m, slot, rows, err, sizeof(err));
    if (!ws) fail_msg("model_ws_new: %s", err);
    return ws;
}

/* Runs every batch size 1..MAX_ROWS (fresh inputs each) through one
 * workspace and checks each against the reference; returns the worst
 * err/tolerance ratio. Inputs go through the workspace's own buffer on
 * odd sizes and through a separate one on even sizes: both paths. */
static double all_sizes(struct built *b, enum model_precision p, int graphs, const char *what)
{
    struct model_runtime *rt = cuda_rt(p, graphs);
    struct model *m = load(rt, b);
    struct model_ws *ws = ws_new(m, 0, MAX_ROWS);
    float *own = malloc(MAX_ROWS * b->in * sizeof(float));
    assert_non_null(own);
    double worst = 0;
    char label[160];
    for (size_t rows = 1; rows <= MAX_ROWS; rows++) {
        float *in = rows % 2 ? model_ws_input(ws) : own;
        for (size_t i = 0; i < rows * b->in; i++) in[i] = tu_randf(-1, 1);
        double *ref = ref_forward(b->ref, b->n, in, rows);
        const float *out = NULL;
        int rc = model_forward(m, ws, in, rows, &out);
        if (rc != MODEL_OK) fail_msg("%s: forward(%zu rows): %s", what, rows, model_ws_error(ws));
        snprintf(label, sizeof(label), "%s, %s, %zu rows", what, model_precision_name(p), rows);
        double r = check_close_tol(out, ref, rows * b->out, tolerance[p], label);
        if (r > worst) worst = r;
        free(ref);
    }
    free(own);
    model_ws_destroy(ws);
    model_destroy(m);
    model_runtime_destroy(rt);
    return worst;
}

/* Each op alone (after a dense layer, so it sees a batch of real
 * activations, and with a dense after it, so its output feeds a GEMM). */
static void test_ops(void **state)
{
    (void)state;
    static const struct tmodel ops[] = {
        {"dense", 1, {DENSE(0, 0)}, 0},
        {"dense no bias", 1, {DENSE(0, 1)}, 0},
        {"dense+relu (fused)", 3, {DENSE(0, 0), ACT(MODEL_OP_RELU), DENSE(0, 0)}, 0},
        {"dense no bias+relu (fused)", 2, {DENSE(0, 1), ACT(MODEL_OP_RELU)}, 0},
        {"relu alone", 2, {ACT(MODEL_OP_RELU), DENSE(0, 0)}, 1},
        {"gelu", 3, {DENSE(0, 0), ACT(MODEL_OP_GELU), DENSE(0, 0)}, 0},
        {"tanh", 3, {DENSE(0, 0), ACT(MODEL_OP_TANH), DENSE(0, 0)}, 0},
        {"sigmoid", 3, {DENSE(0, 0), ACT(MODEL_OP_SIGMOID), DENSE(0, 0)}, 0},
        {"layernorm", 3, {DENSE_MIN(2), LN(0, 0, 0), DENSE(0, 0)}, 0},
        {"layernorm plain", 2, {DENSE_MIN(2), LN(1, 1, 1e-3)}, 0},
        {"softmax", 2, {DENSE(0, 0), ACT(MODEL_OP_SOFTMAX)}, 0},
        {"l2norm", 2, {DENSE(0, 0), ACT(MODEL_OP_L2NORM)}, 0},
    };
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        double worst = 0;
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
            struct built b;
            build(&ops[i], rand_between(1, 96), ST_F32, path, &b);
            double r = all_sizes(&b, (enum model_precision)p, 1, ops[i].what);
            if (r > worst) worst = r;
            built_free(&b);
        }
        fprintf(stderr, "test_gpu: ops in %s: worst err/tol %.3f\n",
                model_precision_name((enum model_precision)p), worst);
    }
}

/* Whole models, including the 768 -> 3072 -> 768 MLP of the benchmarks
 * (fewer sizes: its reference is slow in double). */
static void test_models(void **state)
{
    (void)state;
    static const struct tmodel models[] = {
        {"mlp", 3, {DENSE(128, 0), ACT(MODEL_OP_RELU), DENSE(16, 0)}, 0},
        {"deep", 7,
         {DENSE(0, 0), ACT(MODEL_OP_GELU), LN(0, 0, 0), DENSE(0, 1), ACT(MODEL_OP_TANH),
          DENSE(0, 0), ACT(MODEL_OP_SOFTMAX)},
         0},
        {"embedder", 4, {DENSE(64, 0), ACT(MODEL_OP_RELU), DENSE(32, 0), ACT(MODEL_OP_L2NORM)}, 0},
    };
    for (int p = 0; p < MODEL_N_PRECISIONS; p++)
        for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
            struct built b;
            build(&models[i], 64, ST_F32, path, &b);
            double r = all_sizes(&b, (enum model_precision)p, 1, models[i].what);
            fprintf(stderr, "test_gpu: %s in %s: worst err/tol %.3f\n", models[i].what,
                    model_precision_name((enum model_precision)p), r);
            built_free(&b);
        }
    /* The benchmarks' MLP at one batch size per precision. */
    static const struct tmodel big = {"768-3072-768", 3,
                                      {DENSE(3072, 0), ACT(MODEL_OP_RELU), DENSE(768, 0)}, 0};
    struct built b;
    build(&big, 768, ST_F32, path, &b);
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        struct model_runtime *rt = cuda_rt((enum model_precision)p, 1);
        struct model *m = load(rt, &b);
        struct model_ws *ws = ws_new(m, 0, 32);
        size_t rows = rand_between(1, 32);
        float *in = model_ws_input(ws);
        for (size_t i = 0; i < rows * 768; i++) in[i] = tu_randf(-1, 1);
        double *ref = ref_forward(b.ref, b.n, in, rows);
        const float *out;
        assert_int_equal(model_forward(m, ws, in, rows, &out), MODEL_OK);
        /* K = 3072: the 16-bit precisions' rounding adds up over more terms. */
        double tol = p == MODEL_FP32 ? 1e-4 : 4 * tolerance[p];
        double r = check_close_tol(out, ref, rows * 768, tol, "768-3072-768");
        fprintf(stderr, "test_gpu: 768-3072-768 in %s: worst err/tol %.3f (tol %g)\n",
                model_precision_name((enum model_precision)p), r, tol);
        free(ref);
        model_ws_destroy(ws);
        model_destroy(m);
        model_runtime_destroy(rt);
    }
    built_free(&b);
}

/* F16 and BF16 files in the matching precision: the weights reach the
 * device bit for bit (the reference holds those exact values), and in
 * another precision they are converted. */
static void test_16bit_files(void **state)
{
    (void)state;
    static const struct tmodel tm = {"mlp", 4,
                                     {DENSE(96, 0), ACT(MODEL_OP_GELU), LN(0, 0, 0), DENSE(8, 0)},
                                     0};
    const struct {
        enum st_dtype dt;
        enum model_precision p;
    } cases[] = {{ST_F16, MODEL_FP16}, {ST_BF16, MODEL_BF16}, {ST_F16, MODEL_FP32},
                 {ST_BF16, MODEL_FP16}, {ST_F16, MODEL_BF16}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct built b;
        build(&tm, 48, cases[i].dt, path, &b);
        char what[64];
        snprintf(what, sizeof(what), "%s file", cases[i].dt == ST_F16 ? "F16" : "BF16");
        double r = all_sizes(&b, cases[i].p, 1, what);
        fprintf(stderr, "test_gpu: %s in %s: worst err/tol %.3f\n", what,
                model_precision_name(cases[i].p), r);
        built_free(&b);
    }
}

/* Replaying a bucket's graph does what launching its calls one by one
 * does: the same shapes, kernels and algorithms, so the same bits. */
static void test_graph_equals_eager(void **state)
{
    (void)state;
    static const struct tmodel tm = {"mlp", 5,
                                     {DENSE(128, 0), ACT(MODEL_OP_RELU), LN(0, 0, 0), DENSE(64, 1),
                                      ACT(MODEL_OP_SOFTMAX)},
                                     0};
    struct built b;
    build(&tm, 40, ST_F32, path, &b);
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        struct model_runtime *rg = cuda_rt((enum model_precision)p, 1);
        struct model_runtime *re = cuda_rt((enum model_precision)p, 0);
        struct model *mg = load(rg, &b), *me = load(re, &b);
        struct model_ws *wg = ws_new(mg, 0, MAX_ROWS), *we = ws_new(me, 0, MAX_ROWS);
        float *in = malloc(MAX_ROWS * b.in * sizeof(float)), *keep = malloc(MAX_ROWS * b.out * 4);
        assert_true(in && keep);
        for (size_t rows = 1; rows <= MAX_ROWS; rows++) {
            for (size_t i = 0; i < rows * b.in; i++) in[i] = tu_randf(-2, 2);
            const float *og, *oe;
            assert_int_equal(model_forward(mg, wg, in, rows, &og), MODEL_OK);
            memcpy(keep, og, rows * b.out * sizeof(float));
            assert_int_equal(model_forward(me, we, in, rows, &oe), MODEL_OK);
            if (memcmp(keep, oe, rows * b.out * sizeof(float)) != 0)
                fail_msg("%s, %zu rows: graph and eager results differ",
                         model_precision_name((enum model_precision)p), rows);
        }
        free(in);
        free(keep);
        model_ws_destroy(wg);
        model_ws_destroy(we);
        model_destroy(mg);
        model_destroy(me);
        model_runtime_destroy(rg);
        model_runtime_destroy(re);
    }
    built_free(&b);
}

/* ---- several executors at once -------------------------------------- */

struct runner {
    struct model *m;
    unsigned slot;
    size_t in_w, out_w, batches;
    const float *inputs;      /* batches x MAX_ROWS x in_w, shared, read-only */
    const size_t *rows;       /* per batch */
    float *outputs;           /* batches x MAX_ROWS x out_w, this runner's */
    int rc;
};

static void *run_batches(void *arg)
{
    struct runner *r = arg;
    char err[512];
    struct model_ws *ws = model_ws_new(r->m, r->slot, MAX_ROWS, err, sizeof(err));
    if (!ws) {
        fprintf(stderr, "test_gpu: executor %u: %s\n", r->slot, err);
        r->rc = -1;
        return NULL;
    }
    for (size_t k = 0; k < r->batches && r->rc == 0; k++) {
        const float *out;
        if (model_forward(r->m, ws, r->inputs + k * MAX_ROWS * r->in_w, r->rows[k], &out) !=
            MODEL_OK) {
            fprintf(stderr, "test_gpu: executor %u: %s\n", r->slot, model_ws_error(ws));
            r->rc = -1;
            break;
        }
        memcpy(r->outputs + k * MAX_ROWS * r->out_w, out, r->rows[k] * r->out_w * sizeof(float));
    }
    model_ws_destroy(ws);
    return NULL;
}

/* Four executors, each on its own slot (its own stream, and device when
 * there are several), run the same batches at once: each gets exactly
 * what one executor alone gets. */
static void test_executors_at_once(void **state)
{
    (void)state;
    static const struct tmodel tm = {"mlp", 3,
                                     {DENSE(256, 0), ACT(MODEL_OP_GELU), DENSE(32, 0)}, 0};
    struct built b;
    build(&tm, 64, ST_F32, path, &b);
    enum { EXECS = 4, BATCHES = 200 };
    struct model_runtime *rt = cuda_rt(MODEL_FP32, 1);
    struct model *m = load(rt, &b);
    float *inputs = malloc(BATCHES * MAX_ROWS * b.in * sizeof(float));
    size_t rows[BATCHES];
    struct runner r[EXECS + 1];
    assert_non_null(inputs);
    for (size_t k = 0; k < BATCHES; k++) {
        rows[k] = rand_between(1, MAX_ROWS);
        for (size_t i = 0; i < rows[k] * b.in; i++) inputs[k * MAX_ROWS * b.in + i] = tu_randf(-1, 1);
    }
    for (int e = 0; e <= EXECS; e++) {
        r[e] = (struct runner){.m = m, .slot = (unsigned)e, .in_w = b.in, .out_w = b.out,
                               .batches = BATCHES, .inputs = inputs, .rows = rows};
        r[e].outputs = calloc(BATCHES * MAX_ROWS * b.out, sizeof(float));
        assert_non_null(r[e].outputs);
    }
    run_batches(&r[EXECS]); /* alone, first */
    assert_int_equal(r[EXECS].rc, 0);
    pthread_t t[EXECS];
    for (int e = 0; e < EXECS; e++) assert_int_equal(pthread_create(&t[e], NULL, run_batches, &r[e]), 0);
    for (int e = 0; e < EXECS; e++) pthread_join(t[e], NULL);
    int same_device = model_runtime_devices(rt) == 1;
    for (int e = 0; e < EXECS; e++) {
        assert_int_equal(r[e].rc, 0);
        for (size_t k = 0; k < BATCHES; k++) {
            const float *a = r[e].outputs + k * MAX_ROWS * b.out;
            const float *z = r[EXECS].outputs + k * MAX_ROWS * b.out;
            if (same_device) {
                if (memcmp(a, z, rows[k] * b.out * sizeof(float)) != 0)
                    fail_msg("executor %d, batch %zu: differs from one executor alone", e, k);
            } else {
                double *ref = malloc(rows[k] * b.out * sizeof(double));
                assert_non_null(ref);
                for (size_t i = 0; i < rows[k] * b.out; i++) ref[i] = z[i];
                check_close_tol(a, ref, rows[k] * b.out, tolerance[MODEL_FP32], "another device");
                free(ref);
            }
        }
    }
    struct model_device_stats ds;
    assert_int_equal(model_runtime_device_stats(rt, 0, &ds), 0);
    assert_true(ds.batches >= BATCHES);
    assert_true(ds.busy_s > 0);
    assert_true(ds.mem_used > 0 && ds.mem_used <= ds.mem_total);
    for (int e = 0; e <= EXECS; e++) free(r[e].outputs);
    free(inputs);
    model_destroy(m);
    model_runtime_destroy(rt);
    built_free(&b);
}

/* Last, since it poisons the process's CUDA context for good: an
 * injected device fault makes the forward pass answer MODEL_EFATAL with
 * the sticky error named. */
static void test_injected_fault(void **state)
{
    (void)state;
    static const struct tmodel tm = {"d", 1, {DENSE(8, 0)}, 0};
    struct built b;
    build(&tm, 8, ST_F32, path, &b);
    struct model_runtime *rt = cuda_rt(MODEL_FP32, 1);
    struct model *m = load(rt, &b);
    struct model_ws *ws = ws_new(m, 0, 4);
    float in[32] = {0};
    const float *out;
    assert_int_equal(model_forward(m, ws, in, 4, &out), MODEL_OK);
    model_ws_inject_fault(ws);
    assert_int_equal(model_forward(m, ws, in, 4, &out), MODEL_EFATAL);
    fprintf(stderr, "test_gpu: injected fault: %s\n", model_ws_error(ws));
    assert_non_null(strstr(model_ws_error(ws), "sticky"));
    /* Nothing is freed: the context is gone and the process ends. */
    built_free(&b);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kinfer_gpu_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof(path), "%s/m.safetensors", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    rmdir(dir);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    char cuda[512];
    model_cuda_describe(cuda, sizeof(cuda));
    if (!model_cuda_built() || strstr(cuda, " 0 usable devices")) {
        printf("test_gpu: skipped: no CUDA device (%s)\n", cuda);
        return 0;
    }
    tu_seed(argv[0]);
    fprintf(stderr, "test_gpu: %s\n", cuda);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_16bit_files),
        cmocka_unit_test(test_graph_equals_eager),
        cmocka_unit_test(test_executors_at_once),
        cmocka_unit_test(test_injected_fault),
    };
    /* Under compute-sanitizer the deliberate illegal address would be
     * reported as the finding it is: KINFER_TEST_NO_FAULT leaves it out. */
    size_t n = sizeof(tests) / sizeof(tests[0]);
    const char *nf = getenv("KINFER_TEST_NO_FAULT");
    if (nf && *nf && strcmp(nf, "0") != 0) n--;
    return _cmocka_run_group_tests("test_gpu", tests, n, setup, teardown);
}

/* test_gpu.c - the CUDA backend (gpu/backend_cuda.c and its kernels)
 * against the float64 reference of tests/refmodel.h, on fresh random
 * models and inputs: every op alone and whole models, every batch size
 * from 1 to MAX_ROWS through one workspace (each shape eager, then
 * captured, then replayed), in every precision; F16/BF16 weight files
 * used as they are;
 * graph replay against eager launches; several executors at once against
 * one; text encoders (tiny BERT folders) against the CPU backend in every
 * precision, pooling and head, mixed lengths against each sequence alone,
 * the refusals, the device counters; and an injected device fault
 * answered MODEL_EFATAL, by a layer model and (in a child process, since
 * the fault poisons the context) by an encoder. `make test-gpu`
 * runs it; `make test` builds and runs it too, and on a machine without a
 * usable CUDA device (or a build without CUDA) it prints
 * "skipped: no CUDA device" and exits 77, which tests/run.sh counts as
 * skipped, never as passed. With KINFER_REQUIRE_GPU=1 (tools/device-run.sh
 * sets it) no device is a failure instead: exit 1. `make test` also runs
 * build/emu/tests/test_gpu, this program over the emulated device (emu/;
 * its device line says "emulated"), with the same tolerances and fewer
 * encoder batches (ENC_BATCHES).
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

#include <ftw.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>
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
        /* At least 8 features into a layernorm: over 2 it maps each row to
         * about +-1 by the sign of a difference, which turns TF32's input
         * rounding into errors above the tolerance (seen in an emulated
         * run); 8 keeps it a normalization. */
        {"layernorm", 3, {DENSE_MIN(8), LN(0, 0, 0), DENSE(0, 0)}, 0},
        {"layernorm plain", 2, {DENSE_MIN(8), LN(1, 1, 1e-3)}, 0},
        {"softmax", 2, {DENSE(0, 0), ACT(MODEL_OP_SOFTMAX)}, 0},
        /* At least 8 features into l2norm too: over 2 a row whose dense
         * sums nearly cancel has a tiny norm, and bf16's input rounding
         * turns its direction by more than the tolerance (seen in an
         * emulated run: 0.065 over 2 features). */
        {"l2norm", 2, {DENSE_MIN(8), ACT(MODEL_OP_L2NORM)}, 0},
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

/* Replaying a shape's graph does what launching its calls one by one
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

/* ---- text encoders ------------------------------------------------------
 *
 * A tiny random BERT folder (gpu/model.h's model_write_demo_bert, its
 * attention and feed-forward weights scaled up: sharpen) runs on the CPU
 * backend and on CUDA, the same packed batches through both: the CPU
 * backend is the reference here (tests/torch_encoder.py checks it against
 * PyTorch in float64; its float32 results are within ~1e-6 of that, far
 * inside these bounds). |got - ref| <= tol x max(1, |ref|), the worst
 * over every value of every batch (up to 512 tokens x 64 for pooling
 * none), 2 or 3 layers:
 *   fp32  1e-4  float32 throughout; the CPU's LayerNorm sums in double,
 *               the GEMMs sum in another order, CUDA's expf/erfcf/tanhf
 *               differ by ulps
 *   tf32  6e-3  GEMM inputs rounded to 10 mantissa bits (2^-11), sums of
 *               up to 128 terms, through softmax and GELU
 *   fp16  1e-2  the same rounding in the GEMMs, plus every hidden state,
 *               score and probability stored in half (2^-11 relative,
 *               values up to a few units)
 *   bf16  8e-2  8 mantissa bits: 8x half's rounding, the same path
 * Written before the first run on a device. A host emulation of the same
 * arithmetic (cuBLASLt's GEMMs in float32 over 16-bit or TF32-rounded
 * inputs, the kernels' formulas; not a device) saw at worst, over six
 * draws: 3e-6, 2.8e-3, 4.9e-3 and 3.9e-2, so these bounds leave about 2x
 * (fp32 far more). Each test prints its worst err/tol ratio so the bounds
 * can be tightened to what a device shows. */

#define ENC_ROWS 16     /* sequences per workspace */
#define ENC_TOKENS 512  /* tokens per workspace: 16 sequences of 32, or 4 of 128 */
/* Batches per case in enc_compare: the four kinds it names, then more
 * random draws. Built over the emulated device (KINFER_EMU, the build/emu/
 * program make test runs) only the four kinds: every path (a full
 * workspace of mixed lengths, one sequence, sequences all of the longest
 * length, a full workspace of one length) still runs in every case and
 * precision, in half the time (the emulation runs every kernel thread). */
#ifdef KINFER_EMU
#define ENC_BATCHES 4
#else
#define ENC_BATCHES 8
#endif

static const double enc_tolerance[MODEL_N_PRECISIONS] = {
    [MODEL_FP32] = 1e-4, [MODEL_TF32] = 6e-3, [MODEL_FP16] = 1e-2, [MODEL_BF16] = 8e-2};

/* The folders, written once by enc_folders (and sharpened): two embedders
 * of different shapes (dh 16 and 8), the first again with hidden_act
 * "gelu_new" (the same weights), and a classifier with 5 labels. */
static char enc_a[128], enc_b[128], enc_gelu[128], enc_cls[128];

static void write_bert(const char *d, size_t layers, size_t hidden, size_t heads, size_t inter,
                       size_t labels, uint64_t seed)
{
    char err[512];
    if (model_write_demo_bert(d, layers, hidden, heads, inter, labels, seed, err, sizeof(err)) < 0)
        fail_msg("model_write_demo_bert(%s): %s", d, err);
}

/* Replaces from with to in file path (once). */
static void edit_file(const char *path_, const char *from, const char *to)
{
    FILE *f = fopen(path_, "r");
    assert_non_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *at = strstr(buf, from);
    if (!at) fail_msg("%s: no \"%s\" to replace", path_, from);
    f = fopen(path_, "w");
    assert_non_null(f);
    fprintf(f, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    fclose(f);
}

/* Scales the weights of folder's model.safetensors whose names end so:
 * the demo's initialization (+-0.035) leaves attention nearly uniform and
 * the GELU's inputs near 0, where a transposed score matrix or one GELU
 * for the other would hide under the tolerance (erf and tanh GELU then
 * differ by ~1e-6 at the output). Query and key x4 (scores x16, softmax
 * rows far from uniform), the feed-forward's first weight x10 (inputs of
 * a few units, where the two GELUs differ by up to 5e-4) and its second
 * x5. */
static void sharpen(const char *folder)
{
    static const struct {
        const char *suffix;
        float k;
    } scale[] = {{"attention.self.query.weight", 4}, {"attention.self.key.weight", 4},
                 {"intermediate.dense.weight", 10}, {"output.dense.weight", 5}};
    char p[192], err[512];
    snprintf(p, sizeof(p), "%s/model.safetensors", folder);
    struct st_file *f = st_open(p, err, sizeof(err));
    if (!f) fail_msg("st_open: %s", err);
    size_t n = st_count(f);
    struct st_write_tensor *w = calloc(n, sizeof(*w));
    float **data = calloc(n, sizeof(*data));
    assert_true(w && data);
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_tensor_at(f, i);
        data[i] = malloc(t->numel * sizeof(float));
        assert_non_null(data[i]);
        assert_int_equal(st_to_f32(t, data[i]), 0);
        size_t ln = strlen(t->name);
        for (size_t k = 0; k < sizeof(scale) / sizeof(scale[0]); k++) {
            size_t ls = strlen(scale[k].suffix);
            /* "attention.output.dense.weight" ends in "output.dense.weight"
             * too: only the feed-forward's ("<layer>.output.dense"). */
            if (ln < ls || strcmp(t->name + ln - ls, scale[k].suffix) != 0 ||
                (k == 3 && strstr(t->name, "attention")))
                continue;
            for (size_t j = 0; j < t->numel; j++) data[i][j] *= scale[k].k;
        }
        w[i] = (struct st_write_tensor){t->name, ST_F32, t->ndim, t->shape, data[i]};
    }
    if (st_write(p, w, n, err, sizeof(err)) < 0) fail_msg("st_write: %s", err);
    st_close(f);
    for (size_t i = 0; i < n; i++) free(data[i]);
    free(data);
    free(w);
}

static void enc_folders(void)
{
    static int done;
    if (done) return;
    done = 1;
    snprintf(enc_a, sizeof(enc_a), "%s/bert_a", dir);
    snprintf(enc_b, sizeof(enc_b), "%s/bert_b", dir);
    snprintf(enc_gelu, sizeof(enc_gelu), "%s/bert_gelu", dir);
    snprintf(enc_cls, sizeof(enc_cls), "%s/bert_cls", dir);
    uint64_t seed = tu_rand64();
    write_bert(enc_a, 2, 64, 4, 128, 0, seed);
    write_bert(enc_b, 3, 40, 5, 72, 0, seed + 1);
    write_bert(enc_gelu, 2, 64, 4, 128, 0, seed); /* enc_a's weights: its erf twin */
    write_bert(enc_cls, 2, 64, 4, 128, 5, seed + 3);
    sharpen(enc_a);
    sharpen(enc_b);
    sharpen(enc_gelu);
    sharpen(enc_cls);
    char cfg[192];
    snprintf(cfg, sizeof(cfg), "%s/config.json", enc_gelu);
    edit_file(cfg, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"gelu_new\"");
}

/* A model entry for folder with these overrides (-1: the folder's). */
static struct model_spec enc_spec(const char *folder, int pooling, int normalize, int sigmoid)
{
    struct model_spec s;
    memset(&s, 0, sizeof(s));
    snprintf(s.name, sizeof(s.name), "bert");
    snprintf(s.path, sizeof(s.path), "%s", folder);
    model_encoder_spec_defaults(&s.enc);
    s.enc.pooling = pooling;
    s.enc.normalize = normalize;
    s.enc.sigmoid = sigmoid;
    return s;
}

static struct model *load_spec(struct model_runtime *rt, const struct model_spec *s)
{
    char err[512];
    struct model *m = model_load(rt, s, err, sizeof(err));
    if (!m) fail_msg("model_load(%s): %s", s->path, err);
    return m;
}

static struct model_ws *enc_ws(const struct model *m, unsigned slot)
{
    char err[512];
    struct model_ws *ws = model_ws_new_tokens(m, slot, ENC_ROWS, ENC_TOKENS, err, sizeof(err));
    if (!ws) fail_msg("model_ws_new_tokens: %s", err);
    return ws;
}

static struct model_runtime *cpu_rt(void)
{
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cpu";
    char err[512];
    struct model_runtime *rt = model_runtime_new(&rc, err, sizeof(err));
    if (!rt) fail_msg("model_runtime_new(cpu): %s", err);
    return rt;
}

/* One packed batch. */
struct tbatch {
    size_t n;
    uint32_t offsets[ENC_ROWS + 1];
    int32_t ids[ENC_TOKENS], types[ENC_TOKENS];
    int with_types;
};

/* A random batch for e: n sequences (random 1..ENC_ROWS when 0) of random
 * lengths from 1 to the most that fits (all of that length when full),
 * random ids, and random type ids or none (all 0). */
static void rand_batch(const struct model_encoder_info *e, size_t n, int full, struct tbatch *b)
{
    b->n = n ? n : rand_between(1, ENC_ROWS);
    size_t cap = ENC_TOKENS / b->n < e->max_tokens ? ENC_TOKENS / b->n : e->max_tokens;
    b->offsets[0] = 0;
    for (size_t i = 0; i < b->n; i++)
        b->offsets[i + 1] = b->offsets[i] + (uint32_t)(full ? cap : rand_between(1, cap));
    for (size_t t = 0; t < b->offsets[b->n]; t++) {
        b->ids[t] = (int32_t)rand_between(0, e->vocab - 1);
        b->types[t] = (int32_t)rand_between(0, e->type_vocab - 1);
    }
    b->with_types = (int)(tu_rand64() & 1);
}

static struct model_seqs seqs_of(const struct tbatch *b)
{
    return (struct model_seqs){b->ids, b->with_types ? b->types : NULL, b->offsets, b->n};
}

/* Floats model_encode answers for b: a row per sequence, or for pooling
 * none a row per token. */
static size_t enc_count(const struct model *m, const struct tbatch *b)
{
    const struct model_encoder_info *e = model_encoder(m);
    if (e->head == MODEL_HEAD_EMBEDDING && e->pooling == MODEL_POOL_NONE)
        return b->offsets[b->n] * e->hidden;
    return b->n * model_output_width(m);
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc((n ? n : 1) * sizeof(double));
    assert_non_null(d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static const float *encode_ok(const struct model *m, struct model_ws *ws, const struct tbatch *b,
                              const char *what)
{
    struct model_seqs s = seqs_of(b);
    const float *out = NULL;
    if (model_encode(m, ws, &s, &out) != MODEL_OK)
        fail_msg("%s: encode(%zu sequences, %u tokens): %s", what, b->n, b->offsets[b->n],
                 model_ws_error(ws));
    return out;
}

/* ENC_BATCHES random batches of spec through the CPU backend and CUDA in
 * precision p (the first with every sequence the workspace holds, the
 * second with one, the third and fourth filling it with sequences of one
 * length, the rest random); returns the worst err/tolerance ratio. */
static double enc_compare(struct model_runtime *cpu, const struct model_spec *spec,
                          enum model_precision p, const char *what)
{
    struct model_runtime *rt = cuda_rt(p, 1);
    struct model *mc = load_spec(cpu, spec), *mg = load_spec(rt, spec);
    assert_int_equal(model_encoder(mg)->padded, 1); /* CUDA attention pads */
    struct model_ws *wc = enc_ws(mc, 0), *wg = enc_ws(mg, 0);
    const struct model_encoder_info *e = model_encoder(mg);
    double worst = 0;
    char label[192];
    struct tbatch b;
    for (int k = 0; k < ENC_BATCHES; k++) {
        rand_batch(e, k == 0 || k == 3 ? ENC_ROWS : k == 1 ? 1 : 0, k == 2 || k == 3, &b);
        size_t count = enc_count(mg, &b);
        double *ref = to_double(encode_ok(mc, wc, &b, "cpu"), count);
        snprintf(label, sizeof(label), "%s, %s, batch %d (%zu sequences, %u tokens)", what,
                 model_precision_name(p), k, b.n, b.offsets[b.n]);
        double r = check_close_tol(encode_ok(mg, wg, &b, label), ref, count, enc_tolerance[p],
                                   label);
        if (r > worst) worst = r;
        free(ref);
    }
    model_ws_destroy(wc);
    model_ws_destroy(wg);
    model_destroy(mc);
    model_destroy(mg);
    model_runtime_destroy(rt);
    return worst;
}

/* Every pooling with and without normalization, both shapes, gelu_new,
 * the classifier with softmax and sigmoid, in every precision. */
static void test_encoders(void **state)
{
    (void)state;
    enc_folders();
    const struct {
        const char *what, *folder;
        int pooling, normalize, sigmoid;
    } cases[] = {
        {"cls", enc_a, MODEL_POOL_CLS, 0, -1},
        {"cls normalized", enc_a, MODEL_POOL_CLS, 1, -1},
        {"mean", enc_a, MODEL_POOL_MEAN, 0, -1},
        {"mean normalized (the folder's)", enc_a, -1, -1, -1},
        {"max", enc_a, MODEL_POOL_MAX, 0, -1},
        {"max normalized", enc_a, MODEL_POOL_MAX, 1, -1},
        {"none", enc_a, MODEL_POOL_NONE, 0, -1},
        {"none normalized", enc_a, MODEL_POOL_NONE, 1, -1},
        {"dh 8, 3 layers", enc_b, -1, -1, -1},
        {"dh 8, 3 layers, none", enc_b, MODEL_POOL_NONE, 0, -1},
        {"gelu_new", enc_gelu, -1, -1, -1},
        {"gelu_new, none", enc_gelu, MODEL_POOL_NONE, 0, -1},
        {"classifier softmax", enc_cls, -1, -1, -1},
        {"classifier sigmoid", enc_cls, -1, -1, 1},
    };
    struct model_runtime *cpu = cpu_rt();
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        double worst = 0;
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            struct model_spec s = enc_spec(cases[i].folder, cases[i].pooling, cases[i].normalize,
                                           cases[i].sigmoid);
            double r = enc_compare(cpu, &s, (enum model_precision)p, cases[i].what);
            fprintf(stderr, "test_gpu: encoder %s in %s: worst err/tol %.3f\n", cases[i].what,
                    model_precision_name((enum model_precision)p), r);
            if (r > worst) worst = r;
        }
        fprintf(stderr, "test_gpu: encoders in %s: worst err/tol %.3f (tol %g)\n",
                model_precision_name((enum model_precision)p), worst, enc_tolerance[p]);
    }
    model_runtime_destroy(cpu);
}

/* hidden_act "gelu_new" runs the tanh GELU (fused in cuBLASLt's
 * epilogue, or a kernel), not the erf one: in fp32, CUDA's distance to the
 * CPU's tanh result stays under a quarter of the distance between the
 * CPU's tanh and erf results (the same weights), whatever the draw. */
static void test_encoder_gelu_new(void **state)
{
    (void)state;
    enc_folders();
    struct model_runtime *cpu = cpu_rt(), *rt = cuda_rt(MODEL_FP32, 1);
    struct model_spec st = enc_spec(enc_gelu, MODEL_POOL_NONE, 0, -1);
    struct model_spec se = enc_spec(enc_a, MODEL_POOL_NONE, 0, -1);
    struct model *mt = load_spec(cpu, &st), *me = load_spec(cpu, &se), *mg = load_spec(rt, &st);
    struct model_ws *wt = enc_ws(mt, 0), *we = enc_ws(me, 0), *wg = enc_ws(mg, 0);
    struct tbatch b;
    for (int k = 0; k < 4; k++) {
        rand_batch(model_encoder(mg), 0, 0, &b);
        size_t count = enc_count(mg, &b);
        double *tanh_ref = to_double(encode_ok(mt, wt, &b, "cpu tanh"), count);
        const float *erf_out = encode_ok(me, we, &b, "cpu erf");
        double gap = 0, err = 0;
        for (size_t i = 0; i < count; i++) {
            double g = fabs(erf_out[i] - tanh_ref[i]);
            if (g > gap) gap = g;
        }
        const float *got = encode_ok(mg, wg, &b, "cuda");
        for (size_t i = 0; i < count; i++) {
            double e = fabs(got[i] - tanh_ref[i]);
            if (e > err) err = e;
        }
        fprintf(stderr, "test_gpu: gelu_new, batch %d: cuda - tanh %.3g, erf - tanh %.3g\n", k,
                err, gap);
        if (!(err < gap / 4))
            fail_msg("gelu_new: CUDA is %.3g from the tanh GELU's result, the erf one is %.3g "
                     "from it: not clearly the tanh form", err, gap);
        free(tanh_ref);
    }
    model_ws_destroy(wt);
    model_ws_destroy(we);
    model_ws_destroy(wg);
    model_destroy(mt);
    model_destroy(me);
    model_destroy(mg);
    model_runtime_destroy(rt);
    model_runtime_destroy(cpu);
}

/* Mixed lengths in one batch give each sequence what it gets run alone
 * (within the tolerance: the GEMMs' algorithms may differ with the token
 * count): padding and masking never leak between sequences. Every
 * token's vector is compared (pooling none). */
static void test_encoder_alone(void **state)
{
    (void)state;
    enc_folders();
    struct model_spec s = enc_spec(enc_a, MODEL_POOL_NONE, 0, -1);
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        struct model_runtime *rt = cuda_rt((enum model_precision)p, 1);
        struct model *m = load_spec(rt, &s);
        struct model_ws *ws = enc_ws(m, 0);
        size_t H = model_encoder(m)->hidden;
        struct tbatch b, one;
        rand_batch(model_encoder(m), ENC_ROWS / 2, 0, &b);
        size_t count = enc_count(m, &b);
        double *all = to_double(encode_ok(m, ws, &b, "batch"), count);
        double worst = 0;
        for (size_t i = 0; i < b.n; i++) {
            size_t o = b.offsets[i], len = b.offsets[i + 1] - o;
            one.n = 1;
            one.offsets[0] = 0;
            one.offsets[1] = (uint32_t)len;
            memcpy(one.ids, b.ids + o, len * sizeof(int32_t));
            memcpy(one.types, b.types + o, len * sizeof(int32_t));
            one.with_types = b.with_types;
            char label[96];
            snprintf(label, sizeof(label), "%s: sequence %zu of %zu alone (%zu tokens)",
                     model_precision_name((enum model_precision)p), i, b.n, len);
            double r = check_close_tol(encode_ok(m, ws, &one, label), all + o * H, len * H,
                                       enc_tolerance[p], label);
            if (r > worst) worst = r;
        }
        fprintf(stderr, "test_gpu: encoder, each sequence alone in %s: worst err/tol %.3f\n",
                model_precision_name((enum model_precision)p), worst);
        free(all);
        model_ws_destroy(ws);
        model_destroy(m);
        model_runtime_destroy(rt);
    }
}

/* gpu.graphs on an encoder: a shape's first batch runs eagerly, its
 * second is captured, later ones replay the graph; with two shapes
 * interleaved (A B A B A B) every result equals, bit for bit, what a
 * runtime with graphs off gives for the same batch. */
static void test_encoder_graph_equals_eager(void **state)
{
    (void)state;
    enc_folders();
    struct model_spec s = enc_spec(enc_a, MODEL_POOL_MEAN, 1, -1);
    for (int p = 0; p < MODEL_N_PRECISIONS; p++) {
        struct model_runtime *rg = cuda_rt((enum model_precision)p, 1);
        struct model_runtime *re = cuda_rt((enum model_precision)p, 0);
        struct model *mg = load_spec(rg, &s), *me = load_spec(re, &s);
        struct model_ws *wg = enc_ws(mg, 0), *we = enc_ws(me, 0);
        struct tbatch b[2];
        rand_batch(model_encoder(mg), 0, 0, &b[0]);
        do rand_batch(model_encoder(mg), 0, 0, &b[1]);
        while (b[1].n == b[0].n && b[1].offsets[b[1].n] == b[0].offsets[b[0].n]);
        size_t count[2];
        float *want[2];
        for (int k = 0; k < 2; k++) {
            count[k] = enc_count(me, &b[k]);
            want[k] = malloc(count[k] * sizeof(float));
            assert_non_null(want[k]);
            memcpy(want[k], encode_ok(me, we, &b[k], "eager"), count[k] * sizeof(float));
        }
        for (int round = 0; round < 6; round++) {
            int k = round % 2;
            char label[96];
            snprintf(label, sizeof(label), "%s, shape %d, its run %d (graphs on)",
                     model_precision_name((enum model_precision)p), k, round / 2 + 1);
            const float *got = encode_ok(mg, wg, &b[k], label);
            if (memcmp(got, want[k], count[k] * sizeof(float)) != 0)
                fail_msg("%s: differs from graphs off", label);
        }
        for (int k = 0; k < 2; k++) free(want[k]);
        model_ws_destroy(wg);
        model_ws_destroy(we);
        model_destroy(mg);
        model_destroy(me);
        model_runtime_destroy(rg);
        model_runtime_destroy(re);
    }
}

/* What model_encode refuses on CUDA, before anything reaches the device;
 * the workspace still works after every one. */
static void test_encoder_einval(void **state)
{
    (void)state;
    enc_folders();
    struct model_runtime *rt = cuda_rt(MODEL_FP32, 1);
    struct model_spec s = enc_spec(enc_a, -1, -1, -1);
    struct model *m = load_spec(rt, &s), *other = load_spec(rt, &s);
    struct model_ws *ws = enc_ws(m, 0), *wo = enc_ws(other, 1);
    const struct model_encoder_info *e = model_encoder(m);
    char err[512];
    assert_null(model_ws_new(m, 0, 4, err, sizeof(err)));
    static int32_t ids[ENC_TOKENS + 256], types[ENC_TOKENS + 256];
    uint32_t off[ENC_ROWS + 2];
    const float *out;
    float in[4] = {0};
    assert_int_equal(model_forward(m, ws, in, 1, &out), MODEL_EINVAL);
    const struct {
        const char *what;
        size_t n;
        size_t len;           /* of every sequence */
        int32_t id, type;     /* put at token 1 */
        int zero_first;       /* offsets[0] = 1 */
    } cases[] = {
        {"no sequences", 0, 3, 5, 0, 0},
        {"more sequences than the workspace", ENC_ROWS + 1, 3, 5, 0, 0},
        {"rows x longest over its tokens", 5, 128, 5, 0, 0},
        {"a sequence longer than max_tokens", 1, 129, 5, 0, 0},
        {"an empty sequence", 2, 0, 5, 0, 0},
        {"offsets[0] not 0", 1, 3, 5, 0, 1},
        {"an id past the vocabulary", 2, 3, (int32_t)e->vocab, 0, 0},
        {"a negative id", 2, 3, -1, 0, 0},
        {"a type id past type_vocab", 2, 3, 5, (int32_t)e->type_vocab, 0},
        {"a negative type id", 2, 3, 5, -1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (size_t t = 0; t < sizeof(ids) / sizeof(ids[0]); t++) ids[t] = types[t] = 0;
        ids[1] = cases[i].id;
        types[1] = cases[i].type;
        for (size_t k = 0; k <= cases[i].n; k++)
            off[k] = (uint32_t)(k * cases[i].len + (size_t)cases[i].zero_first);
        struct model_seqs sq = {ids, types, off, cases[i].n};
        if (model_encode(m, ws, &sq, &out) != MODEL_EINVAL)
            fail_msg("encode with %s: not MODEL_EINVAL", cases[i].what);
    }
    struct tbatch b;
    rand_batch(e, 0, 0, &b);
    struct model_seqs sq = seqs_of(&b);
    assert_int_equal(model_encode(m, wo, &sq, &out), MODEL_EINVAL); /* another model's */
    assert_int_equal(model_encode(m, NULL, &sq, &out), MODEL_EINVAL);
    encode_ok(m, ws, &b, "after the refusals");
    model_ws_destroy(ws);
    model_ws_destroy(wo);
    model_destroy(m);
    model_destroy(other);
    /* A layer model takes no sequences. */
    static const struct tmodel tm = {"d", 1, {DENSE(8, 0)}, 0};
    struct built bl;
    build(&tm, 8, ST_F32, path, &bl);
    struct model *ml = load(rt, &bl);
    struct model_ws *wl = ws_new(ml, 0, 4);
    assert_null(model_encoder(ml));
    assert_null(model_ws_new_tokens(ml, 0, 4, 64, err, sizeof(err)));
    assert_int_equal(model_encode(ml, wl, &sq, &out), MODEL_EINVAL);
    model_ws_destroy(wl);
    model_destroy(ml);
    built_free(&bl);
    model_runtime_destroy(rt);
}

/* The device's counters count encoder batches and their busy time. */
static void test_encoder_stats(void **state)
{
    (void)state;
    enc_folders();
    struct model_runtime *rt = cuda_rt(MODEL_FP16, 1);
    struct model_spec s = enc_spec(enc_cls, -1, -1, -1);
    struct model *m = load_spec(rt, &s);
    struct model_ws *ws = enc_ws(m, 0);
    struct model_device_stats ds;
    assert_int_equal(model_runtime_device_stats(rt, 0, &ds), 0);
    assert_int_equal(ds.batches, 0);
    enum { K = 5 };
    struct tbatch b;
    for (int k = 0; k < K; k++) {
        rand_batch(model_encoder(m), 0, 0, &b);
        encode_ok(m, ws, &b, "stats");
    }
    uint64_t batches = 0;
    double busy = 0;
    for (size_t d = 0; d < model_runtime_devices(rt); d++) {
        assert_int_equal(model_runtime_device_stats(rt, d, &ds), 0);
        batches += ds.batches;
        busy += ds.busy_s;
    }
    assert_int_equal(batches, K);
    assert_true(busy > 0);
    model_ws_destroy(ws);
    model_destroy(m);
    model_runtime_destroy(rt);
}

/* The encoder's injected fault (main runs it alone in test_encoder_fault's
 * child): the next encode answers MODEL_EFATAL with the sticky error
 * named. */
static void encoder_fault(void **state)
{
    (void)state;
    enc_folders();
    struct model_runtime *rt = cuda_rt(MODEL_FP32, 1);
    struct model_spec s = enc_spec(enc_a, -1, -1, -1);
    struct model *m = load_spec(rt, &s);
    struct model_ws *ws = enc_ws(m, 0);
    struct tbatch b;
    rand_batch(model_encoder(m), 0, 0, &b);
    struct model_seqs sq = seqs_of(&b);
    const float *out;
    encode_ok(m, ws, &b, "before the fault");
    model_ws_inject_fault(ws);
    assert_int_equal(model_encode(m, ws, &sq, &out), MODEL_EFATAL);
    fprintf(stderr, "test_gpu: encoder's injected fault: %s\n", model_ws_error(ws));
    assert_non_null(strstr(model_ws_error(ws), "sticky"));
    /* Nothing is freed: the context is gone and the process ends. */
}

/* A fault poisons its process's CUDA context for good, and the layer
 * model's fault test below needs a live one: the encoder's runs in a
 * child, this program again with the argument "encoder-fault". */
static void test_encoder_fault(void **state)
{
    (void)state;
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
    assert_true(k > 0);
    self[k] = 0;
    char arg[] = "encoder-fault";
    char *args[] = {self, arg, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, self, NULL, NULL, args, environ), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the encoder's fault test (a child process) failed: status %d", st);
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

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

/* The scratch folder and everything in it (the encoders' folders too). */
static int teardown(void **state)
{
    (void)state;
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int main(int argc, char **argv)
{
    char cuda[512];
    model_cuda_describe(cuda, sizeof(cuda));
    if (!model_cuda_built() || strstr(cuda, " 0 usable devices")) return tu_no_gpu("test_gpu", cuda);
    /* The seed goes to the environment, so test_encoder_fault's child
     * draws what this run draws and KINFER_TEST_SEED replays both. */
    char seed[32];
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)tu_seed(argv[0]));
    setenv("KINFER_TEST_SEED", seed, 1);
    if (argc > 1 && strcmp(argv[1], "encoder-fault") == 0) {
        /* test_encoder_fault's child. */
        const struct CMUnitTest fault[] = {cmocka_unit_test(encoder_fault)};
        return _cmocka_run_group_tests("test_gpu encoder-fault", fault, 1, setup, teardown);
    }
    fprintf(stderr, "test_gpu: %s\n", cuda);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_16bit_files),
        cmocka_unit_test(test_graph_equals_eager),
        cmocka_unit_test(test_executors_at_once),
        cmocka_unit_test(test_encoders),
        cmocka_unit_test(test_encoder_gelu_new),
        cmocka_unit_test(test_encoder_alone),
        cmocka_unit_test(test_encoder_graph_equals_eager),
        cmocka_unit_test(test_encoder_einval),
        cmocka_unit_test(test_encoder_stats),
        /* The two fault tests stay last. */
        cmocka_unit_test(test_encoder_fault),
        cmocka_unit_test(test_injected_fault),
    };
    /* Under compute-sanitizer the deliberate illegal addresses would be
     * reported as the findings they are: KINFER_TEST_NO_FAULT leaves both
     * fault tests out. */
    size_t n = sizeof(tests) / sizeof(tests[0]);
    const char *nf = getenv("KINFER_TEST_NO_FAULT");
    if (nf && *nf && strcmp(nf, "0") != 0) n -= 2;
    return _cmocka_run_group_tests("test_gpu", tests, n, setup, teardown);
}

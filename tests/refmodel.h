/* refmodel.h - the float64 reference of kinfer's layer-list models, for
 * the test programs that check a backend against it (test_model.c for the
 * CPU backend, test_gpu.c for the CUDA one): a model described as a table
 * (struct tmodel) is written to a safetensors file with random weights in
 * F32, F16 or BF16, with its spec and a double-precision twin of every
 * layer (weights already rounded to the file's dtype, so only a backend's
 * own arithmetic is measured), which runs rows through PyTorch's
 * semantics in double. Header-only; each test program includes it once,
 * after testutil.h and cmocka.h. */
#ifndef KINFER_REFMODEL_H
#define KINFER_REFMODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/model.h"
#include "../gpu/safetensors.h"
#include "testutil.h"

/* Every helper is static and may go unused by a given test program. */
#define RM_FN static __attribute__((unused))

#define MAX_LAYERS 8

/* Uniform integer in [lo, hi], from the seeded test generator. */
RM_FN size_t rand_between(size_t lo, size_t hi)
{
    return lo + (size_t)(tu_rand64() % (hi - lo + 1));
}

/* ---- float64 reference ---------------------------------------------- */

/* One layer as the reference sees it: weights in double, already rounded
 * to whatever dtype the file stores. */
struct ref_layer {
    enum model_op op;
    size_t in, out;
    double *w, *b; /* NULL when absent */
    double eps;
};

/* Applies one layer to rows of x (rows x in) into y (rows x out). */
RM_FN void ref_layer_fwd(const struct ref_layer *L, const double *x, double *y, size_t rows)
{
    size_t w = L->in;
    for (size_t r = 0; r < rows; r++) {
        const double *xr = x + r * L->in;
        double *yr = y + r * L->out;
        switch (L->op) {
        case MODEL_OP_DENSE:
            for (size_t j = 0; j < L->out; j++) {
                double s = L->b ? L->b[j] : 0.0;
                for (size_t k = 0; k < L->in; k++) s += xr[k] * L->w[j * L->in + k];
                yr[j] = s;
            }
            break;
        case MODEL_OP_RELU:
            for (size_t i = 0; i < w; i++) yr[i] = xr[i] > 0 ? xr[i] : 0.0;
            break;
        case MODEL_OP_GELU:
            for (size_t i = 0; i < w; i++) yr[i] = 0.5 * xr[i] * (1.0 + erf(xr[i] / sqrt(2.0)));
            break;
        case MODEL_OP_TANH:
            for (size_t i = 0; i < w; i++) yr[i] = tanh(xr[i]);
            break;
        case MODEL_OP_SIGMOID:
            for (size_t i = 0; i < w; i++) yr[i] = 1.0 / (1.0 + exp(-xr[i]));
            break;
        case MODEL_OP_LAYERNORM: {
            double mean = 0, var = 0;
            for (size_t i = 0; i < w; i++) mean += xr[i];
            mean /= (double)w;
            for (size_t i = 0; i < w; i++) var += (xr[i] - mean) * (xr[i] - mean);
            var /= (double)w;
            for (size_t i = 0; i < w; i++) {
                double v = (xr[i] - mean) / sqrt(var + L->eps);
                yr[i] = v * (L->w ? L->w[i] : 1.0) + (L->b ? L->b[i] : 0.0);
            }
            break;
        }
        case MODEL_OP_SOFTMAX: {
            double mx = xr[0], s = 0;
            for (size_t i = 1; i < w; i++) mx = xr[i] > mx ? xr[i] : mx;
            for (size_t i = 0; i < w; i++) s += exp(xr[i] - mx);
            for (size_t i = 0; i < w; i++) yr[i] = exp(xr[i] - mx) / s;
            break;
        }
        case MODEL_OP_L2NORM: {
            double s = 0;
            for (size_t i = 0; i < w; i++) s += xr[i] * xr[i];
            double d = sqrt(s) > 1e-12 ? sqrt(s) : 1e-12;
            for (size_t i = 0; i < w; i++) yr[i] = xr[i] / d;
            break;
        }
        default:
            fail_msg("the reference has no op %d", (int)L->op);
        }
    }
}

/* Runs rows of float input through every layer; returns new rows x
 * out-width doubles. */
RM_FN double *ref_forward(const struct ref_layer *L, size_t n, const float *in, size_t rows)
{
    size_t maxw = L[0].in;
    for (size_t i = 0; i < n; i++) maxw = L[i].out > maxw ? L[i].out : maxw;
    double *a = malloc(rows * maxw * sizeof(double));
    double *b = malloc(rows * maxw * sizeof(double));
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < rows * L[0].in; i++) a[i] = in[i];
    for (size_t i = 0; i < n; i++) {
        ref_layer_fwd(&L[i], a, b, rows);
        double *t = a;
        a = b;
        b = t;
    }
    free(b);
    return a;
}

/* Compares got with the reference: each value within tol * max(1, |ref|)
 * (relative above 1, absolute below: see the test programs' headers), NaN
 * matching NaN. Fails the test at the first value out of bounds; returns
 * the worst err/tolerance ratio (<= 1 passes). */
RM_FN double check_close_tol(const float *got, const double *ref, size_t n, double tolerance,
                             const char *what)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i])) {
            if (!(isnan(ref[i]) && isnan(got[i])))
                fail_msg("%s: [%zu] got %.9g, want %.9g", what, i, (double)got[i], ref[i]);
            continue;
        }
        double err = fabs((double)got[i] - ref[i]);
        double tol = tolerance * (fabs(ref[i]) > 1.0 ? fabs(ref[i]) : 1.0);
        if (err > tol)
            fail_msg("%s: [%zu] got %.9g, want %.12g (err %.3g > tol %.3g)", what, i,
                     (double)got[i], ref[i], err, tol);
        if (err / tol > worst) worst = err / tol;
    }
    return worst;
}

/* ---- test models: description -> file + spec + reference ------------ */

/* One layer of a test model. */
struct tlayer {
    enum model_op op;
    size_t out;  /* dense: out features, 0 = random 1..64 */
    int no_bias; /* dense/layernorm */
    int no_weight; /* layernorm */
    double eps;  /* layernorm; 0 = 1e-5 */
    size_t min_out; /* dense with random out: at least this (default 1) */
};

/* Table shorthands: dense with out features (0 = random 1..64) and
 * no_bias; dense at least min wide; layernorm without weight/bias and
 * with eps; a tensorless op. */
#define DENSE(out, no_bias) {MODEL_OP_DENSE, (out), (no_bias), 0, 0, 0}
#define DENSE_MIN(min) {MODEL_OP_DENSE, 0, 0, 0, 0, (min)}
#define LN(no_weight, no_bias, eps) {MODEL_OP_LAYERNORM, 0, (no_bias), (no_weight), (eps), 0}
#define ACT(op) {(op), 0, 0, 0, 0, 0}

struct tmodel {
    const char *what;
    size_t n;
    struct tlayer l[MAX_LAYERS];
    int give_width; /* pass the input width in the spec instead of inferring it */
};

/* A built model: the spec model_load reads, the reference twin, and the
 * float32 tensors written to the file. */
struct built {
    struct model_layer_spec ls[MAX_LAYERS];
    struct model_spec spec;
    struct ref_layer ref[MAX_LAYERS];
    size_t n, in, out;
    size_t n_params;
};

/* Fills n weights uniformly in [lo,hi), rounded through dtype, into both
 * the raw file buffer and the reference's doubles. */
RM_FN void fill_weights(enum st_dtype dt, size_t n, float lo, float hi, void *raw, double *ref)
{
    for (size_t i = 0; i < n; i++) {
        float v = tu_randf(lo, hi);
        if (dt == ST_F16) {
            uint16_t h = st_f32_to_f16(v);
            memcpy((char *)raw + 2 * i, &h, 2);
            v = st_f16_to_f32(h);
        } else if (dt == ST_BF16) {
            uint16_t h = st_f32_to_bf16(v);
            memcpy((char *)raw + 2 * i, &h, 2);
            v = st_bf16_to_f32(h);
        } else {
            memcpy((char *)raw + 4 * i, &v, 4);
        }
        ref[i] = v;
    }
}

/* Turns a description into a file at path (weights in dtype dt), a spec
 * and the reference; in = input width (>= 1). */
RM_FN void build(const struct tmodel *tm, size_t in, enum st_dtype dt, const char *path,
                  struct built *b)
{
    memset(b, 0, sizeof(*b));
    struct st_write_tensor wt[2 * MAX_LAYERS] = {{0}};
    uint64_t shapes[2 * MAX_LAYERS][2];
    void *raw[2 * MAX_LAYERS];
    size_t nt = 0, w = in;
    b->n = tm->n;
    b->in = in;
    for (size_t i = 0; i < tm->n; i++) {
        const struct tlayer *tl = &tm->l[i];
        struct ref_layer *R = &b->ref[i];
        struct model_layer_spec *S = &b->ls[i];
        R->op = S->op = tl->op;
        R->in = w;
        R->out = w;
        if (tl->op == MODEL_OP_DENSE) {
            R->out = tl->out ? tl->out : rand_between(tl->min_out ? tl->min_out : 1, 64);
            float bound = 1.0f / sqrtf((float)w);
            size_t nw = R->out * w;
            R->w = malloc(nw * sizeof(double));
            raw[nt] = malloc(nw * 4);
            assert_true(R->w && raw[nt]);
            fill_weights(dt, nw, -bound, bound, raw[nt], R->w);
            snprintf(S->weight, sizeof(S->weight), "%zu.weight", i);
            shapes[nt][0] = R->out;
            shapes[nt][1] = w;
            wt[nt] = (struct st_write_tensor){S->weight, dt, 2, shapes[nt], raw[nt]};
            nt++;
            b->n_params += nw;
            if (!tl->no_bias) {
                R->b = malloc(R->out * sizeof(double));
                raw[nt] = malloc(R->out * 4);
                assert_true(R->b && raw[nt]);
                fill_weights(dt, R->out, -bound, bound, raw[nt], R->b);
                snprintf(S->bias, sizeof(S->bias), "%zu.bias", i);
                shapes[nt][0] = R->out;
                wt[nt] = (struct st_write_tensor){S->bias, dt, 1, shapes[nt], raw[nt]};
                nt++;
                b->n_params += R->out;
            }
        } else if (tl->op == MODEL_OP_LAYERNORM) {
            R->eps = S->eps = tl->eps ? tl->eps : 1e-5;
            R->eps = (double)(float)R->eps; /* the backend keeps eps as a float */
            for (int k = 0; k < 2; k++) {
                if (k == 0 ? tl->no_weight : tl->no_bias) continue;
                double **dst = k == 0 ? &R->w : &R->b;
                char *name = k == 0 ? S->weight : S->bias;
                *dst = malloc(w * sizeof(double));
                raw[nt] = malloc(w * 4);
                assert_true(*dst && raw[nt]);
                fill_weights(dt, w, k == 0 ? 0.5f : -0.5f, k == 0 ? 1.5f : 0.5f, raw[nt], *dst);
                snprintf(name, MODEL_TENSOR_NAME_MAX, "%zu.%s", i, k == 0 ? "weight" : "bias");
                shapes[nt][0] = w;
                wt[nt] = (struct st_write_tensor){name, dt, 1, shapes[nt], raw[nt]};
                nt++;
                b->n_params += w;
            }
        }
        w = R->out;
    }
    b->out = w;
    char err[512] = "";
    if (st_write(path, wt, nt, err, sizeof(err)) != 0) fail_msg("st_write: %s", err);
    for (size_t i = 0; i < nt; i++) free(raw[i]);
    snprintf(b->spec.name, sizeof(b->spec.name), "t");
    snprintf(b->spec.path, sizeof(b->spec.path), "%s", path);
    b->spec.layers = b->ls;
    b->spec.n_layers = tm->n;
    b->spec.input_width = tm->give_width ? in : 0;
}

/* Frees the reference weights build() allocated. */
RM_FN void built_free(struct built *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->ref[i].w);
        free(b->ref[i].b);
    }
}

#endif

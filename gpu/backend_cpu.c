/* backend_cpu.c - the CPU backend of backend.h: OpenBLAS for the dense
 * layers (one cblas_sgemm per layer for the whole batch) and plain loops
 * for the rest, with PyTorch's semantics. The only file in kinfer that
 * includes OpenBLAS.
 *
 * Threads: open/close/model_new/model_free on the main thread; a model's
 * float32 weights are never written after model_new, so every executor
 * shares them, each with its own workspace. OpenBLAS's thread count is
 * process-wide: the last open sets it.
 *
 * Ownership: a cpu_model owns its float32 copy of every weight (converted
 * from F32/F16/BF16 once, at load); a cpu_ws owns its input buffer and its
 * two ping-pong activation buffers; the output pointer forward hands back
 * points into them. */
#include "backend.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One layer with its weights as float32. */
struct cpu_layer {
    enum model_op op;
    size_t in, out;
    float *w;   /* dense [out,in]; layernorm [in] or NULL (= ones) */
    float *b;   /* dense [out] or NULL; layernorm [in] or NULL (= zeros) */
    float eps;
};

struct cpu_model {
    size_t n_layers;
    struct cpu_layer *layers;
    size_t in_w, max_w;
};

struct cpu_ws {
    const struct cpu_model *m;
    size_t max_rows;
    int fault;      /* armed by inject_fault: the next forward fails */
    float *input;   /* max_rows * in_w: where callers may pack a batch */
    float *buf[2];  /* max_rows * max_w each */
};

/* The CPU is always there: one device. */
static int cpu_probe(char *what, size_t what_size)
{
    if (what && what_size) snprintf(what, what_size, "the CPU (OpenBLAS)");
    return 1;
}

/* OpenBLAS's pool is process-wide; 0 keeps its default (all cores or
 * OPENBLAS_NUM_THREADS). There is no per-backend state beyond that, so
 * the handle is a marker. */
static void *cpu_open(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                      char *errstr, size_t errstr_size)
{
    (void)errstr;
    (void)errstr_size;
    static int marker;
    if (c->cpu_threads > 0) openblas_set_num_threads(c->cpu_threads);
    int n = openblas_get_num_threads();
    snprintf(desc, desc_size, "cpu: OpenBLAS (%s), %d thread%s per pass",
             openblas_get_config(), n, n == 1 ? "" : "s");
    return &marker;
}

static void cpu_close(void *be)
{
    (void)be;
}

/* A new float32 array holding t's values, or NULL when out of memory. */
static float *cpu_convert(const struct st_tensor *t)
{
    float *p = malloc((size_t)t->numel * sizeof(float));
    if (p) st_to_f32(t, p); /* the loader checked the dtype is loadable */
    return p;
}

static void cpu_model_free(void *be, void *bm)
{
    (void)be;
    struct cpu_model *m = bm;
    if (!m) return;
    for (size_t i = 0; m->layers && i < m->n_layers; i++) {
        free(m->layers[i].w);
        free(m->layers[i].b);
    }
    free(m->layers);
    free(m);
}

/* Converts every weight to float32 once, so the forward pass reads them
 * as they are. */
static void *cpu_model_new(void *be, const struct backend_plan *p, char *errstr,
                           size_t errstr_size)
{
    struct cpu_model *m = calloc(1, sizeof(*m));
    if (!m || !(m->layers = calloc(p->n_layers, sizeof(*m->layers)))) goto oom;
    m->n_layers = p->n_layers;
    m->in_w = p->in_w;
    m->max_w = p->max_w;
    for (size_t i = 0; i < p->n_layers; i++) {
        const struct backend_layer *s = &p->layers[i];
        struct cpu_layer *L = &m->layers[i];
        L->op = s->op;
        L->in = s->in;
        L->out = s->out;
        L->eps = s->eps;
        if ((s->w && !(L->w = cpu_convert(s->w))) || (s->b && !(L->b = cpu_convert(s->b))))
            goto oom;
    }
    return m;
oom:
    snprintf(errstr, errstr_size, "model %s: out of memory converting its weights", p->name);
    cpu_model_free(be, m);
    return NULL;
}

static void cpu_ws_free(void *wsp)
{
    struct cpu_ws *ws = wsp;
    if (!ws) return;
    free(ws->input);
    free(ws->buf[0]);
    free(ws->buf[1]);
    free(ws);
}

/* Both activation buffers hold the widest activation of any layer for
 * max_rows rows: dense reads one and writes the other, every other op
 * works in place. The slot does not matter on the CPU. */
static void *cpu_ws_new(void *be, void *bm, const struct backend_plan *p, unsigned slot,
                        size_t max_rows, char *errstr, size_t errstr_size)
{
    (void)be;
    (void)slot;
    struct cpu_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) goto oom;
    ws->m = bm;
    ws->max_rows = max_rows;
    ws->input = calloc(max_rows * p->in_w, sizeof(float));
    ws->buf[0] = calloc(max_rows * p->max_w, sizeof(float));
    ws->buf[1] = calloc(max_rows * p->max_w, sizeof(float));
    if (!ws->input || !ws->buf[0] || !ws->buf[1]) goto oom;
    return ws;
oom:
    snprintf(errstr, errstr_size, "model %s: out of memory for a workspace of %zu rows",
             p->name, max_rows);
    cpu_ws_free(ws);
    return NULL;
}

static float *cpu_ws_input(void *wsp)
{
    return ((struct cpu_ws *)wsp)->input;
}

/* y = x W^T + b for the whole batch in one GEMM (row-major, W stored as
 * nn.Linear's [out,in], hence Trans): the bias is copied into y first and
 * added through beta = 1. */
static void cpu_dense(const struct cpu_layer *L, const float *x, float *y, size_t rows)
{
    float beta = 0.0f;
    if (L->b) {
        for (size_t r = 0; r < rows; r++) memcpy(y + r * L->out, L->b, L->out * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)L->out, (int)L->in,
                1.0f, x, (int)L->in, L->w, (int)L->in, beta, y, (int)L->out);
}

/* Elementwise ops over n values; y may equal x. relu keeps NaN as
 * PyTorch does. gelu uses erfc(-x/sqrt 2), equal to 1 + erf(x/sqrt 2) but
 * without its cancellation for negative x. sigmoid takes the branch whose
 * exp cannot overflow. */
static void cpu_pointwise(enum model_op op, const float *x, float *y, size_t n)
{
    switch (op) {
    case MODEL_OP_RELU:
        for (size_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
        break;
    case MODEL_OP_GELU:
        for (size_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * erfcf(-x[i] * 0.70710678118654752f);
        break;
    case MODEL_OP_TANH:
        for (size_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
        break;
    case MODEL_OP_SIGMOID:
        for (size_t i = 0; i < n; i++) {
            if (x[i] >= 0.0f) {
                y[i] = 1.0f / (1.0f + expf(-x[i]));
            } else {
                float e = expf(x[i]);
                y[i] = e / (1.0f + e);
            }
        }
        break;
    default:
        break;
    }
}

/* Layernorm of one row of w values (biased variance, as PyTorch); sums in
 * double so wide rows lose no precision. y may equal x. */
static void cpu_layernorm_row(const struct cpu_layer *L, const float *x, float *y, size_t w)
{
    double mean = 0.0, var = 0.0;
    for (size_t i = 0; i < w; i++) mean += x[i];
    mean /= (double)w;
    for (size_t i = 0; i < w; i++) {
        double d = x[i] - mean;
        var += d * d;
    }
    var /= (double)w;
    double inv = 1.0 / sqrt(var + (double)L->eps);
    for (size_t i = 0; i < w; i++) {
        double v = (x[i] - mean) * inv;
        if (L->w) v *= L->w[i];
        if (L->b) v += L->b[i];
        y[i] = (float)v;
    }
}

/* Softmax of one row, shifted by its max so exp cannot overflow. y may
 * equal x. */
static void cpu_softmax_row(const float *x, float *y, size_t w)
{
    float mx = x[0];
    for (size_t i = 1; i < w; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (size_t i = 0; i < w; i++) {
        y[i] = expf(x[i] - mx);
        sum += y[i];
    }
    double inv = 1.0 / sum;
    for (size_t i = 0; i < w; i++) y[i] = (float)(y[i] * inv);
}

/* x / max(||x||_2, 1e-12) of one row, as F.normalize. y may equal x. */
static void cpu_l2norm_row(const float *x, float *y, size_t w)
{
    double ss = 0.0;
    for (size_t i = 0; i < w; i++) ss += (double)x[i] * x[i];
    double norm = sqrt(ss);
    double inv = 1.0 / (norm > 1e-12 ? norm : 1e-12);
    for (size_t i = 0; i < w; i++) y[i] = (float)(x[i] * inv);
}

/* Ping-pongs between the two workspace buffers: dense writes the buffer
 * it does not read, the other ops rewrite in place; the caller's input is
 * never written. Nothing here can fail: the caller checked the rows. */
static int cpu_forward(void *wsp, const float *in, size_t rows, const float **out,
                       char *errstr, size_t errstr_size)
{
    struct cpu_ws *ws = wsp;
    if (ws->fault) {
        /* The fault tests' stand-in for a dead device: what the worker
         * does next (drop the batch, exit 2) is the same. */
        ws->fault = 0;
        snprintf(errstr, errstr_size, "injected device fault (debug.device_fault_id)");
        return MODEL_EFATAL;
    }
    const struct cpu_model *m = ws->m;
    float *cur = NULL; /* buffer holding the activations; NULL = still `in` */
    size_t w = m->in_w;
    for (size_t li = 0; li < m->n_layers; li++) {
        const struct cpu_layer *L = &m->layers[li];
        const float *src = cur ? cur : in;
        if (L->op == MODEL_OP_DENSE) {
            float *dst = cur == ws->buf[0] ? ws->buf[1] : ws->buf[0];
            cpu_dense(L, src, dst, rows);
            cur = dst;
            w = L->out;
            continue;
        }
        float *dst = cur ? cur : ws->buf[0];
        switch (L->op) {
        case MODEL_OP_LAYERNORM:
            for (size_t r = 0; r < rows; r++) cpu_layernorm_row(L, src + r * w, dst + r * w, w);
            break;
        case MODEL_OP_SOFTMAX:
            for (size_t r = 0; r < rows; r++) cpu_softmax_row(src + r * w, dst + r * w, w);
            break;
        case MODEL_OP_L2NORM:
            for (size_t r = 0; r < rows; r++) cpu_l2norm_row(src + r * w, dst + r * w, w);
            break;
        default:
            cpu_pointwise(L->op, src, dst, rows * w);
            break;
        }
        cur = dst;
    }
    *out = cur;
    return MODEL_OK;
}

static void cpu_inject_fault(void *wsp)
{
    ((struct cpu_ws *)wsp)->fault = 1;
}

/* One executor per online CPU: with one OpenBLAS thread each, that keeps
 * every core busy on compute-bound models. */
static size_t cpu_executors(void *be)
{
    (void)be;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (size_t)n;
}

static const char *cpu_precision(void *be)
{
    (void)be;
    return "fp32";
}

static size_t cpu_devices(void *be)
{
    (void)be;
    return 0;
}

static int cpu_device_stats(void *be, size_t dev, struct model_device_stats *out)
{
    (void)be;
    (void)dev;
    (void)out;
    return -1;
}

const struct backend_ops backend_cpu = {
    .name = "cpu",
    .compiled_in = 1,
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .model_new = cpu_model_new,
    .model_free = cpu_model_free,
    .ws_new = cpu_ws_new,
    .ws_free = cpu_ws_free,
    .ws_input = cpu_ws_input,
    .forward = cpu_forward,
    .inject_fault = cpu_inject_fault,
    .executors = cpu_executors,
    .precision = cpu_precision,
    .devices = cpu_devices,
    .device_stats = cpu_device_stats,
};

/* model.c - the CPU backend of model.h: loads a safetensors file, checks
 * the layer list against it (tensor presence, dtype, shapes chained layer
 * to layer), converts every weight to float32 once, and runs batches
 * through it with one cblas_sgemm per dense layer and plain loops for the
 * rest, with PyTorch's semantics.
 *
 * Threads: model_load/model_destroy on the main thread at startup and
 * shutdown. A loaded model is never written again, so executor threads
 * share it; each executor owns one model_ws and is the only caller of
 * model_forward with it.
 *
 * Ownership: the model owns its layer table and float32 weights; the
 * st_file is closed before model_load returns, so nothing points into the
 * file. A model_ws owns its two ping-pong buffers; the output pointer
 * model_forward hands back points into them. */
#include "model.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

struct model_layer {
    enum model_op op;
    size_t in, out;  /* widths: dense changes them, every other op keeps them */
    float *w;        /* dense [out,in]; layernorm [in] or NULL (= ones) */
    float *b;        /* dense [out] or NULL; layernorm [in] or NULL (= zeros) */
    float eps;       /* layernorm */
};

struct model {
    char name[MODEL_NAME_MAX];
    size_t in_w, out_w, max_w;
    size_t n_params;
    size_t n_layers;
    struct model_layer *layers;
};

struct model_ws {
    const struct model *m; /* the model the buffers were sized for */
    size_t max_rows;
    float *buf[2];         /* max_rows * m->max_w floats each */
};

/* The op table, in enum order: what each op's layer may name, what it
 * must name, and how its tensors are shaped. The config reader judges a
 * layer's keys by the same rows the loader reads its tensors by. */
static const struct model_op_desc model_ops[MODEL_N_OPS] = {
    [MODEL_OP_DENSE] = {"dense", MODEL_KEY_WEIGHT | MODEL_KEY_BIAS, MODEL_KEY_WEIGHT,
                        MODEL_SHAPE_LINEAR},
    [MODEL_OP_RELU] = {"relu", 0, 0, MODEL_SHAPE_NONE},
    [MODEL_OP_GELU] = {"gelu", 0, 0, MODEL_SHAPE_NONE},
    [MODEL_OP_TANH] = {"tanh", 0, 0, MODEL_SHAPE_NONE},
    [MODEL_OP_SIGMOID] = {"sigmoid", 0, 0, MODEL_SHAPE_NONE},
    [MODEL_OP_LAYERNORM] = {"layernorm", MODEL_KEY_WEIGHT | MODEL_KEY_BIAS | MODEL_KEY_EPS, 0,
                            MODEL_SHAPE_FEATURE},
    [MODEL_OP_SOFTMAX] = {"softmax", 0, 0, MODEL_SHAPE_NONE},
    [MODEL_OP_L2NORM] = {"l2norm", 0, 0, MODEL_SHAPE_NONE},
};

/* Bounds-checked access, so a corrupt enum value is an error message
 * rather than a read past the table. */
const struct model_op_desc *model_op_desc(enum model_op op)
{
    if ((unsigned)op >= MODEL_N_OPS) return NULL;
    return &model_ops[op];
}

/* Config strings map to ops through the same table model_op_name reads,
 * so the two can never disagree. */
int model_op_parse(const char *s, enum model_op *out)
{
    for (size_t i = 0; i < MODEL_N_OPS; i++) {
        if (strcmp(s, model_ops[i].name) == 0) {
            *out = (enum model_op)i;
            return 0;
        }
    }
    return -1;
}

/* Names ops for error messages and logs; "?" rather than a crash for a
 * value outside the enum. */
const char *model_op_name(enum model_op op)
{
    const struct model_op_desc *d = model_op_desc(op);
    return d ? d->name : "?";
}

/* Shared by the config reader (which adds the line number) and the
 * loader (which adds the model and layer). */
int model_eps_check(double eps, char *why, size_t why_size)
{
    if (eps > 0 && eps < 1 && isfinite(eps)) return 0;
    if (why && why_size) snprintf(why, why_size, "%g is out of range: must be > 0 and < 1", eps);
    return -1;
}

/* One place formats load errors so each names the model, and NULL or
 * empty error buffers are tolerated. */
static void model_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void model_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || errstr_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* "[16,32]" for error messages. */
static void model_shape_str(const struct st_tensor *t, char *buf, size_t n)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < t->ndim && off < n; i++) {
        int w = snprintf(buf + off, n - off, "%s%llu", i ? "," : "[",
                         (unsigned long long)t->shape[i]);
        if (w < 0) return;
        off += (size_t)w;
    }
    if (off < n) snprintf(buf + off, n - off, "%s", t->ndim ? "]" : "[]");
}

/* Context for one layer's checks, so every message starts the same way:
 * "model NAME: layer I (OP): ...". */
struct model_ctx {
    const struct model_spec *spec;
    const struct st_file *f;
    size_t li;
    char *errstr;
    size_t errstr_size;
};

#define LAYER_ERR(c, fmt, ...)                                                      \
    model_seterr((c)->errstr, (c)->errstr_size, "model %s: layer %zu (%s): " fmt,   \
                 (c)->spec->name, (c)->li,                                          \
                 model_op_name((c)->spec->layers[(c)->li].op), __VA_ARGS__)

/* Finds tensor name in the file and checks it can become float32; the
 * caller checks the shape, because only it knows what is expected. */
static const struct st_tensor *model_find(const struct model_ctx *c, const char *name)
{
    const struct st_tensor *t = st_find(c->f, name);
    if (!t) {
        LAYER_ERR(c, "tensor %s not found in %s", name, c->spec->path);
        return NULL;
    }
    if (!st_dtype_loadable(t->dtype)) {
        LAYER_ERR(c, "tensor %s has dtype %s, expected F32, F16 or BF16", name,
                  st_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

/* Checks that t is 1-D of width w (w == 0: any width > 0, which is then
 * returned through *w). */
static int model_check_vec(const struct model_ctx *c, const struct st_tensor *t,
                           size_t *w)
{
    if (t->ndim == 1 && t->shape[0] > 0 && t->shape[0] <= INT_MAX &&
        (*w == 0 || t->shape[0] == *w)) {
        *w = (size_t)t->shape[0];
        return 0;
    }
    char got[160];
    model_shape_str(t, got, sizeof(got));
    if (*w) LAYER_ERR(c, "tensor %s has shape %s, expected [%zu]", t->name, got, *w);
    else LAYER_ERR(c, "tensor %s has shape %s, expected [w] with 0 < w <= %d", t->name,
                   got, INT_MAX);
    return -1;
}

/* Converts t to a new float32 array (the model owns it) and counts its
 * parameters. */
static float *model_convert(const struct model_ctx *c, const struct st_tensor *t,
                            struct model *m)
{
    float *p = malloc((size_t)t->numel * sizeof(float));
    if (!p) {
        LAYER_ERR(c, "out of memory converting tensor %s", t->name);
        return NULL;
    }
    st_to_f32(t, p); /* dtype already checked loadable */
    m->n_params += (size_t)t->numel;
    return p;
}

/* Validates and loads one dense layer. *w is the running width (0 while
 * still unknown: the weight's in-features then define it). */
static int model_load_dense(const struct model_ctx *c, struct model_layer *L,
                            struct model *m, size_t *w)
{
    const struct model_layer_spec *ls = &c->spec->layers[c->li];
    if (!ls->weight[0]) {
        LAYER_ERR(c, "%s", "dense needs a weight tensor");
        return -1;
    }
    const struct st_tensor *tw = model_find(c, ls->weight);
    if (!tw) return -1;
    int ok = tw->ndim == 2 && tw->shape[0] > 0 && tw->shape[1] > 0 &&
             tw->shape[0] <= INT_MAX && tw->shape[1] <= INT_MAX &&
             (*w == 0 || tw->shape[1] == *w);
    if (!ok) {
        char got[160];
        model_shape_str(tw, got, sizeof(got));
        if (*w) LAYER_ERR(c, "tensor %s has shape %s, expected [*,%zu]", tw->name, got, *w);
        else LAYER_ERR(c, "tensor %s has shape %s, expected [out,in] with 0 < out,in <= %d",
                       tw->name, got, INT_MAX);
        return -1;
    }
    L->in = (size_t)tw->shape[1];
    L->out = (size_t)tw->shape[0];
    if (ls->bias[0]) {
        const struct st_tensor *tb = model_find(c, ls->bias);
        size_t bw = L->out;
        if (!tb || model_check_vec(c, tb, &bw) != 0) return -1;
        if (!(L->b = model_convert(c, tb, m))) return -1;
    }
    if (!(L->w = model_convert(c, tw, m))) return -1;
    *w = L->out;
    return 0;
}

/* Validates and loads one layernorm. Weight and bias are each optional
 * (PyTorch's elementwise_affine=False and bias=False): absent means ones
 * and zeros. eps must be finite and > 0, else a constant row divides by
 * zero. */
static int model_load_layernorm(const struct model_ctx *c, struct model_layer *L,
                                struct model *m, size_t *w)
{
    const struct model_layer_spec *ls = &c->spec->layers[c->li];
    char why[128];
    if (model_eps_check(ls->eps, why, sizeof(why)) != 0) {
        LAYER_ERR(c, "eps %s", why);
        return -1;
    }
    L->eps = (float)ls->eps;
    const char *names[2] = {ls->weight, ls->bias};
    float **dst[2] = {&L->w, &L->b};
    for (int i = 0; i < 2; i++) {
        if (!names[i][0]) continue;
        const struct st_tensor *t = model_find(c, names[i]);
        if (!t || model_check_vec(c, t, w) != 0) return -1;
        if (!(*dst[i] = model_convert(c, t, m))) return -1;
    }
    L->in = L->out = *w; /* still 0 if no tensor and no width yet: fixed up later */
    return 0;
}

/* Walks the layers once: each op's loader checks its tensors against the
 * running width and converts them, so the first inconsistency is the one
 * reported, and a failed load leaves nothing behind. Layers are numbered
 * from 0 in messages, as in the config's list. */
struct model *model_load(const struct model_spec *spec, char *errstr, size_t errstr_size)
{
    if (spec->n_layers == 0) {
        model_seterr(errstr, errstr_size, "model %s: no layers", spec->name);
        return NULL;
    }
    if (spec->input_width > INT_MAX) {
        model_seterr(errstr, errstr_size, "model %s: input_width %zu exceeds %d",
                     spec->name, spec->input_width, INT_MAX);
        return NULL;
    }
    char sterr[512];
    struct st_file *f = st_open(spec->path, sterr, sizeof(sterr));
    if (!f) {
        model_seterr(errstr, errstr_size, "model %s: %s", spec->name, sterr);
        return NULL;
    }
    struct model *m = calloc(1, sizeof(*m));
    if (!m || !(m->layers = calloc(spec->n_layers, sizeof(*m->layers)))) {
        model_seterr(errstr, errstr_size, "model %s: out of memory", spec->name);
        goto fail;
    }
    snprintf(m->name, sizeof(m->name), "%s", spec->name);
    m->n_layers = spec->n_layers;

    struct model_ctx c = {spec, f, 0, errstr, errstr_size};
    size_t w = spec->input_width; /* running width; 0 = not known yet */
    for (c.li = 0; c.li < spec->n_layers; c.li++) {
        const struct model_layer_spec *ls = &spec->layers[c.li];
        struct model_layer *L = &m->layers[c.li];
        const struct model_op_desc *d = model_op_desc(ls->op);
        if (!d) {
            model_seterr(errstr, errstr_size, "model %s: layer %zu: unknown op %d",
                         spec->name, c.li, (int)ls->op);
            goto fail;
        }
        L->op = ls->op;
        /* A tensor the table does not give the op is an error, not
         * something to ignore. */
        int stray_w = !(d->keys & MODEL_KEY_WEIGHT) && ls->weight[0];
        int stray_b = !(d->keys & MODEL_KEY_BIAS) && ls->bias[0];
        if (stray_w || stray_b) {
            LAYER_ERR(&c, "takes no tensors, but %s \"%s\" is set", stray_w ? "weight" : "bias",
                      stray_w ? ls->weight : ls->bias);
            goto fail;
        }
        size_t before = w;
        if (d->shape == MODEL_SHAPE_LINEAR) {
            if (model_load_dense(&c, L, m, &w) != 0) goto fail;
        } else if (d->shape == MODEL_SHAPE_FEATURE) {
            if (model_load_layernorm(&c, L, m, &w) != 0) goto fail;
        } else {
            L->in = L->out = w;
        }
        if (before == 0 && w != 0) {
            /* First shaped layer: it fixes the input width, and the
             * width-keeping layers before it take that width too. */
            m->in_w = L->in;
            for (size_t j = 0; j < c.li; j++) m->layers[j].in = m->layers[j].out = L->in;
        }
    }
    if (w == 0) {
        model_seterr(errstr, errstr_size,
                     "model %s: no layer has a shape to infer the input width from; "
                     "set input_width", spec->name);
        goto fail;
    }
    if (spec->input_width) m->in_w = spec->input_width;
    m->out_w = w;
    m->max_w = m->in_w;
    for (size_t i = 0; i < m->n_layers; i++)
        if (m->layers[i].out > m->max_w) m->max_w = m->layers[i].out;
    st_close(f);
    return m;
fail:
    st_close(f);
    model_destroy(m);
    return NULL;
}

/* Frees weights and the layer table; tolerates a half-built model, which
 * is what model_load's failure path hands it. */
void model_destroy(struct model *m)
{
    if (!m) return;
    for (size_t i = 0; m->layers && i < m->n_layers; i++) {
        free(m->layers[i].w);
        free(m->layers[i].b);
    }
    free(m->layers);
    free(m);
}

/* Accessors: the executor and the logs need these, nothing else. */
const char *model_name(const struct model *m)
{
    return m->name;
}

/* Floats per input row: what the codec checks a job's width against. */
size_t model_input_width(const struct model *m)
{
    return m->in_w;
}

/* Floats per output row: what the sink encodes. */
size_t model_output_width(const struct model *m)
{
    return m->out_w;
}

/* Parameter count, for the startup log line. */
size_t model_param_count(const struct model *m)
{
    return m->n_params;
}

/* Both buffers hold the widest activation of any layer for max_rows rows:
 * dense reads one and writes the other, every other op works in place. */
struct model_ws *model_ws_new(const struct model *m, size_t max_rows)
{
    if (!m || max_rows == 0 || max_rows > INT_MAX ||
        max_rows > SIZE_MAX / sizeof(float) / m->max_w)
        return NULL;
    struct model_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) return NULL;
    ws->m = m;
    ws->max_rows = max_rows;
    for (int i = 0; i < 2; i++) {
        ws->buf[i] = calloc(max_rows * m->max_w, sizeof(float));
        if (!ws->buf[i]) {
            model_ws_destroy(ws);
            return NULL;
        }
    }
    return ws;
}

/* Accepts NULL, so failure paths can call it unconditionally. */
void model_ws_destroy(struct model_ws *ws)
{
    if (!ws) return;
    free(ws->buf[0]);
    free(ws->buf[1]);
    free(ws);
}

/* y = x W^T + b for the whole batch in one GEMM (row-major, W stored as
 * nn.Linear's [out,in], hence Trans): the bias is copied into y first and
 * added through beta = 1. */
static void model_dense(const struct model_layer *L, const float *x, float *y, size_t rows)
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
static void model_pointwise(enum model_op op, const float *x, float *y, size_t n)
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
static void model_layernorm_row(const struct model_layer *L, const float *x, float *y,
                                size_t w)
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
static void model_softmax_row(const float *x, float *y, size_t w)
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
static void model_l2norm_row(const float *x, float *y, size_t w)
{
    double ss = 0.0;
    for (size_t i = 0; i < w; i++) ss += (double)x[i] * x[i];
    double norm = sqrt(ss);
    double inv = 1.0 / (norm > 1e-12 ? norm : 1e-12);
    for (size_t i = 0; i < w; i++) y[i] = (float)(x[i] * inv);
}

/* Ping-pongs between the two workspace buffers: dense writes the buffer
 * it does not read, the other ops rewrite in place; the caller's input is
 * never written. Checks only what is cheap (rows, workspace owner). */
int model_forward(const struct model *m, struct model_ws *ws, const float *in,
                  size_t rows, const float **out)
{
    if (!m || !ws || ws->m != m || !in || !out || rows == 0 || rows > ws->max_rows)
        return -1;
    float *cur = NULL; /* buffer holding the activations; NULL = still `in` */
    size_t w = m->in_w;
    for (size_t li = 0; li < m->n_layers; li++) {
        const struct model_layer *L = &m->layers[li];
        const float *src = cur ? cur : in;
        if (L->op == MODEL_OP_DENSE) {
            float *dst = cur == ws->buf[0] ? ws->buf[1] : ws->buf[0];
            model_dense(L, src, dst, rows);
            cur = dst;
            w = L->out;
            continue;
        }
        float *dst = cur ? cur : ws->buf[0];
        switch (L->op) {
        case MODEL_OP_LAYERNORM:
            for (size_t r = 0; r < rows; r++) model_layernorm_row(L, src + r * w, dst + r * w, w);
            break;
        case MODEL_OP_SOFTMAX:
            for (size_t r = 0; r < rows; r++) model_softmax_row(src + r * w, dst + r * w, w);
            break;
        case MODEL_OP_L2NORM:
            for (size_t r = 0; r < rows; r++) model_l2norm_row(src + r * w, dst + r * w, w);
            break;
        default:
            model_pointwise(L->op, src, dst, rows * w);
            break;
        }
        cur = dst;
    }
    *out = cur;
    return 0;
}

/* OpenBLAS's pool is process-wide; 0 keeps its default (all cores or
 * OPENBLAS_NUM_THREADS), which the config uses to mean "don't care". */
void model_set_threads(int n)
{
    if (n > 0) openblas_set_num_threads(n);
}

/* splitmix64: a tiny, well-mixed generator so the demo weights depend only
 * on the seed, not on libc's rand. */
static uint64_t model_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-bound, bound). */
static float model_rng_uniform(uint64_t *s, float bound)
{
    double u = (double)(model_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)((2.0 * u - 1.0) * bound);
}

/* Generates weights in memory and writes them with st_write, so the demo
 * file is a real safetensors file the normal load path reads. */
int model_write_demo(const char *path, size_t in, size_t hidden, size_t out,
                     uint64_t seed, char *errstr, size_t errstr_size)
{
    if (in == 0 || hidden == 0 || out == 0 || in > INT_MAX || hidden > INT_MAX ||
        out > INT_MAX || hidden > SIZE_MAX / sizeof(float) / (in > out ? in : out)) {
        model_seterr(errstr, errstr_size, "model demo: bad sizes in=%zu hidden=%zu out=%zu",
                     in, hidden, out);
        return -1;
    }
    int rc = -1;
    float *w0 = malloc(hidden * in * sizeof(float));
    float *b0 = malloc(hidden * sizeof(float));
    float *w2 = malloc(out * hidden * sizeof(float));
    float *b2 = malloc(out * sizeof(float));
    if (!w0 || !b0 || !w2 || !b2) {
        model_seterr(errstr, errstr_size, "model demo: out of memory");
        goto fail;
    }
    uint64_t s = seed;
    float bound0 = 1.0f / sqrtf((float)in), bound2 = 1.0f / sqrtf((float)hidden);
    for (size_t i = 0; i < hidden * in; i++) w0[i] = model_rng_uniform(&s, bound0);
    for (size_t i = 0; i < hidden; i++) b0[i] = model_rng_uniform(&s, bound0);
    for (size_t i = 0; i < out * hidden; i++) w2[i] = model_rng_uniform(&s, bound2);
    for (size_t i = 0; i < out; i++) b2[i] = model_rng_uniform(&s, bound2);
    uint64_t sw0[2] = {hidden, in}, sb0[1] = {hidden}, sw2[2] = {out, hidden}, sb2[1] = {out};
    struct st_write_tensor t[4] = {
        {"0.weight", ST_F32, 2, sw0, w0},
        {"0.bias", ST_F32, 1, sb0, b0},
        {"2.weight", ST_F32, 2, sw2, w2},
        {"2.bias", ST_F32, 1, sb2, b2},
    };
    rc = st_write(path, t, 4, errstr, errstr_size);
fail:
    free(w0);
    free(b0);
    free(w2);
    free(b2);
    return rc;
}

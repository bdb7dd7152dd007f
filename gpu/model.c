/* model.c - the runtime of model.h: the op table, the choice of backend,
 * loading a model, and the calls that pass through to the backend.
 *
 * Loading checks a layer list against its safetensors file once, for
 * every backend alike (tensor presence, dtype, shapes chained layer to
 * layer, as the op table says), and hands the result to the chosen
 * backend as a struct backend_plan while the file is still mapped; the
 * backend keeps its own copy of the weights and the file is closed.
 *
 * Threads: the runtime, model_load and model_destroy on the main thread
 * at startup and shutdown. A loaded model is never written again, so
 * executor threads share it; each executor owns one model_ws and is the
 * only caller of model_forward with it.
 *
 * Ownership: the runtime owns the backend's state; a model owns its layer
 * table and the backend's copy of its weights; a model_ws owns the
 * backend's workspace. Nothing points into the file after model_load. */
#include "model.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../text/tokenizer.h"
#include "backend.h"
#include "bert.h"
#include "safetensors.h"

struct model_runtime {
    const struct backend_ops *ops;
    void *be;                 /* the backend's state */
    char desc[800];           /* model_runtime_describe */
};

struct model {
    char name[MODEL_NAME_MAX];
    struct model_runtime *rt;
    struct backend_layer *layers; /* tensors NULL once loaded (the file is closed) */
    struct backend_plan plan;     /* what the backend built from; layers above */
    size_t n_params;
    void *bm;                     /* the backend's copy of the weights */
    /* An encoder's (plan.bert is NULL once loaded: the file is closed): */
    int is_encoder;
    struct model_encoder_info enc;
    struct tokenizer *tok;        /* enc.tokenizer */
    char **labels;                /* enc.labels */
};

struct model_ws {
    const struct model *m; /* the model the workspace was made for */
    size_t max_rows;
    size_t max_tokens;     /* an encoder's: rows x longest per call */
    void *bws;             /* the backend's workspace */
    char err[256];         /* model_ws_error */
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
    st_tensor_shape_str(t, got, sizeof(got));
    if (*w) LAYER_ERR(c, "tensor %s has shape %s, expected [%zu]", t->name, got, *w);
    else LAYER_ERR(c, "tensor %s has shape %s, expected [w] with 0 < w <= %d", t->name,
                   got, INT_MAX);
    return -1;
}

/* Takes t as the layer's tensor: the backend reads it while the file is
 * still mapped. Counts its parameters. */
static const struct st_tensor *model_take(struct model *m, const struct st_tensor *t)
{
    m->n_params += (size_t)t->numel;
    return t;
}

/* Validates one dense layer. *w is the running width (0 while still
 * unknown: the weight's in-features then define it). */
static int model_load_dense(const struct model_ctx *c, struct backend_layer *L,
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
        st_tensor_shape_str(tw, got, sizeof(got));
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
        L->b = model_take(m, tb);
    }
    L->w = model_take(m, tw);
    *w = L->out;
    return 0;
}

/* Validates one layernorm. Weight and bias are each optional (PyTorch's
 * elementwise_affine=False and bias=False): absent means ones and zeros.
 * eps follows model_eps_check, else a constant row divides by zero. */
static int model_load_layernorm(const struct model_ctx *c, struct backend_layer *L,
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
    const struct st_tensor **dst[2] = {&L->w, &L->b};
    for (int i = 0; i < 2; i++) {
        if (!names[i][0]) continue;
        const struct st_tensor *t = model_find(c, names[i]);
        if (!t || model_check_vec(c, t, w) != 0) return -1;
        *dst[i] = model_take(m, t);
    }
    L->in = L->out = *w; /* still 0 if no tensor and no width yet: fixed up later */
    return 0;
}

/* A Hugging Face BERT folder: gpu/bert.c reads and checks it, the backend
 * copies the weights while the file is mapped, and the model keeps the
 * tokenizer, the labels and what the worker needs to know. */
static struct model *model_load_encoder(struct model_runtime *rt, const struct model_spec *spec,
                                        char *errstr, size_t errstr_size)
{
    if (!rt->ops->encode) {
        model_seterr(errstr, errstr_size, "model %s: the %s backend does not run encoders",
                     spec->name, rt->ops->name);
        return NULL;
    }
    struct bert_folder bf;
    if (bert_folder_read(spec, &bf, errstr, errstr_size) < 0) return NULL;
    struct model *m = calloc(1, sizeof(*m));
    if (!m) {
        model_seterr(errstr, errstr_size, "model %s: out of memory", spec->name);
        bert_folder_fini(&bf);
        return NULL;
    }
    snprintf(m->name, sizeof(m->name), "%s", spec->name);
    m->rt = rt;
    m->is_encoder = 1;
    const struct backend_bert *b = &bf.plan;
    m->plan.name = m->name;
    m->plan.bert = b;
    m->plan.out_w = b->head == MODEL_HEAD_CLASSIFIER ? b->n_labels : b->hidden;
    m->plan.max_w = b->intermediate > 3 * b->hidden ? b->intermediate : 3 * b->hidden;
    m->n_params = bf.n_params;
    m->bm = rt->ops->model_new(rt->be, &m->plan, errstr, errstr_size);
    m->plan.bert = NULL; /* it points into bf, which goes below */
    if (!m->bm) {
        bert_folder_fini(&bf);
        free(m);
        return NULL;
    }
    m->tok = bf.tok;
    m->labels = bf.labels;
    bf.tok = NULL;
    bf.labels = NULL;
    m->enc = (struct model_encoder_info){
        .tokenizer = m->tok,
        .hidden = b->hidden,
        .layers = b->n_layers,
        .heads = b->heads,
        .intermediate = b->intermediate,
        .max_tokens = bf.max_tokens,
        .type_vocab = b->type_vocab,
        .vocab = b->vocab,
        .pooling = b->pooling,
        .normalize = b->normalize,
        .head = b->head,
        .sigmoid = b->sigmoid,
        .n_labels = b->head == MODEL_HEAD_CLASSIFIER ? b->n_labels : 0,
        .labels = (const char *const *)m->labels,
        .padded = rt->ops->encoder_pads,
    };
    bert_folder_fini(&bf);
    return m;
}

/* Walks the layers once, each op's checks by its row of the op table
 * against the running width, so the first inconsistency is the one
 * reported; then the backend builds its copy from the validated plan
 * while the file is mapped, and a failed load leaves nothing behind.
 * Layers are numbered from 0 in messages, as in the config's list. */
struct model *model_load(struct model_runtime *rt, const struct model_spec *spec,
                         char *errstr, size_t errstr_size)
{
    if (!rt) {
        model_seterr(errstr, errstr_size, "model %s: no runtime", spec->name);
        return NULL;
    }
    struct stat st;
    int is_dir = stat(spec->path, &st) == 0 && S_ISDIR(st.st_mode);
    if (spec->n_layers == 0) {
        if (!is_dir) {
            model_seterr(errstr, errstr_size,
                         "model %s: %s is not a directory: a model without layers is a "
                         "Hugging Face model folder (config.json, model.safetensors, vocab.txt)",
                         spec->name, spec->path);
            return NULL;
        }
        return model_load_encoder(rt, spec, errstr, errstr_size);
    }
    if (is_dir) {
        model_seterr(errstr, errstr_size,
                     "model %s: %s is a directory: a model with layers is a safetensors file "
                     "(a model folder takes no layers)", spec->name, spec->path);
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
    m->rt = rt;

    struct model_ctx c = {spec, f, 0, errstr, errstr_size};
    size_t w = spec->input_width; /* running width; 0 = not known yet */
    for (c.li = 0; c.li < spec->n_layers; c.li++) {
        const struct model_layer_spec *ls = &spec->layers[c.li];
        struct backend_layer *L = &m->layers[c.li];
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
            m->plan.in_w = L->in;
            for (size_t j = 0; j < c.li; j++) m->layers[j].in = m->layers[j].out = L->in;
        }
    }
    if (w == 0) {
        model_seterr(errstr, errstr_size,
                     "model %s: no layer has a shape to infer the input width from; "
                     "set input_width", spec->name);
        goto fail;
    }
    if (spec->input_width) m->plan.in_w = spec->input_width;
    m->plan.name = m->name;
    m->plan.layers = m->layers;
    m->plan.n_layers = spec->n_layers;
    m->plan.out_w = w;
    m->plan.max_w = m->plan.in_w;
    for (size_t i = 0; i < spec->n_layers; i++)
        if (m->layers[i].out > m->plan.max_w) m->plan.max_w = m->layers[i].out;
    if (!(m->bm = rt->ops->model_new(rt->be, &m->plan, errstr, errstr_size))) goto fail;
    /* The file closes below: nothing may point into it afterwards. */
    for (size_t i = 0; i < spec->n_layers; i++) m->layers[i].w = m->layers[i].b = NULL;
    st_close(f);
    return m;
fail:
    st_close(f);
    model_destroy(m);
    return NULL;
}

/* Frees the backend's copy and the layer table; tolerates a half-built
 * model, which is what model_load's failure path hands it. */
void model_destroy(struct model *m)
{
    if (!m) return;
    if (m->bm) m->rt->ops->model_free(m->rt->be, m->bm);
    free(m->layers);
    tokenizer_destroy(m->tok);
    for (size_t i = 0; m->labels && i < m->enc.n_labels; i++) free(m->labels[i]);
    free(m->labels);
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
    return m->plan.in_w;
}

/* Floats per output row: what the sink encodes. */
size_t model_output_width(const struct model *m)
{
    return m->plan.out_w;
}

/* Parameter count, for the startup log line. */
size_t model_param_count(const struct model *m)
{
    return m->n_params;
}

/* The backend sizes its buffers; the limits on max_rows keep every
 * rows x width product it computes inside size_t and int. */
static struct model_ws *model_ws_make(const struct model *m, unsigned slot, size_t max_rows,
                                      size_t max_tokens, char *errstr, size_t errstr_size);

struct model_ws *model_ws_new(const struct model *m, unsigned slot, size_t max_rows,
                              char *errstr, size_t errstr_size)
{
    if (m && m->is_encoder) {
        model_seterr(errstr, errstr_size,
                     "model %s is an encoder: its workspace is sized in tokens", m->name);
        return NULL;
    }
    return model_ws_make(m, slot, max_rows, 0, errstr, errstr_size);
}

/* An encoder's workspace: every token of the largest batch through the
 * widest activation must stay inside size_t and int. */
struct model_ws *model_ws_new_tokens(const struct model *m, unsigned slot, size_t max_rows,
                                     size_t max_tokens, char *errstr, size_t errstr_size)
{
    if (m && !m->is_encoder) {
        model_seterr(errstr, errstr_size, "model %s is not an encoder", m->name);
        return NULL;
    }
    if (!m || max_tokens < max_rows || max_tokens > INT_MAX / 4 ||
        max_tokens > SIZE_MAX / sizeof(float) / (m->plan.max_w + 2 * m->enc.hidden)) {
        model_seterr(errstr, errstr_size,
                     "model %s: a workspace of %zu rows and %zu tokens is not possible",
                     m ? m->name : "?", max_rows, max_tokens);
        return NULL;
    }
    return model_ws_make(m, slot, max_rows, max_tokens, errstr, errstr_size);
}

static struct model_ws *model_ws_make(const struct model *m, unsigned slot, size_t max_rows,
                                      size_t max_tokens, char *errstr, size_t errstr_size)
{
    if (!m || max_rows == 0 || max_rows > INT_MAX ||
        max_rows > SIZE_MAX / sizeof(float) / m->plan.max_w) {
        model_seterr(errstr, errstr_size, "model %s: a workspace of %zu rows is not possible",
                     m ? m->name : "?", max_rows);
        return NULL;
    }
    struct model_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) {
        model_seterr(errstr, errstr_size, "model %s: out of memory", m->name);
        return NULL;
    }
    ws->m = m;
    ws->max_rows = max_rows;
    ws->max_tokens = max_tokens;
    ws->bws = m->rt->ops->ws_new(m->rt->be, m->bm, &m->plan, slot, max_rows, max_tokens,
                                 errstr, errstr_size);
    if (!ws->bws) {
        free(ws);
        return NULL;
    }
    return ws;
}

/* Accepts NULL, so failure paths can call it unconditionally. */
void model_ws_destroy(struct model_ws *ws)
{
    if (!ws) return;
    ws->m->rt->ops->ws_free(ws->bws);
    free(ws);
}

float *model_ws_input(struct model_ws *ws)
{
    return ws->m->rt->ops->ws_input(ws->bws);
}

/* Checks what is cheap (rows, workspace owner) so every backend can trust
 * its arguments. */
int model_forward(const struct model *m, struct model_ws *ws, const float *in,
                  size_t rows, const float **out)
{
    if (!m || m->is_encoder || !ws || ws->m != m || !in || !out || rows == 0 ||
        rows > ws->max_rows)
        return MODEL_EINVAL;
    return m->rt->ops->forward(ws->bws, in, rows, out, ws->err, sizeof(ws->err));
}

const struct model_encoder_info *model_encoder(const struct model *m)
{
    return m && m->is_encoder ? &m->enc : NULL;
}

/* Checks everything a backend indexes with (counts, offsets, ids, type
 * ids), so no hostile token array reaches a kernel or a table lookup. */
int model_encode(const struct model *m, struct model_ws *ws, const struct model_seqs *s,
                 const float **out)
{
    if (!m || !m->is_encoder || !ws || ws->m != m || !s || !out || !s->ids || !s->offsets ||
        s->n == 0 || s->n > ws->max_rows || s->offsets[0] != 0)
        return MODEL_EINVAL;
    size_t longest = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->offsets[i + 1] <= s->offsets[i]) return MODEL_EINVAL;
        size_t len = s->offsets[i + 1] - s->offsets[i];
        if (len > m->enc.max_tokens) return MODEL_EINVAL;
        if (len > longest) longest = len;
    }
    if (longest > ws->max_tokens / s->n) return MODEL_EINVAL;
    size_t total = s->offsets[s->n];
    for (size_t t = 0; t < total; t++) {
        if (s->ids[t] < 0 || (size_t)s->ids[t] >= m->enc.vocab) return MODEL_EINVAL;
        if (s->type_ids && (s->type_ids[t] < 0 || (size_t)s->type_ids[t] >= m->enc.type_vocab))
            return MODEL_EINVAL;
    }
    return m->rt->ops->encode(ws->bws, s, out, ws->err, sizeof(ws->err));
}

const char *model_ws_error(const struct model_ws *ws)
{
    return ws->err;
}

void model_ws_inject_fault(struct model_ws *ws)
{
    ws->m->rt->ops->inject_fault(ws->bws);
}

double model_flops_per_row(const struct model *m)
{
    if (m->is_encoder) {
        /* Per token: Q, K, V and the attention output (4 H x H) and the
         * feed-forward (2 H x I) per layer; attention's own T x T work
         * depends on the length and is left out. */
        double h = (double)m->enc.hidden, im = (double)m->enc.intermediate;
        return 2.0 * (double)m->enc.layers * (4.0 * h * h + 2.0 * h * im);
    }
    double f = 0;
    for (size_t i = 0; i < m->plan.n_layers; i++)
        if (m->layers[i].op == MODEL_OP_DENSE)
            f += 2.0 * (double)m->layers[i].in * (double)m->layers[i].out;
    return f;
}

void model_encoder_spec_defaults(struct model_encoder_spec *e)
{
    e->pooling = e->normalize = e->head = e->sigmoid = e->lowercase = -1;
    e->max_tokens = 0;
}

static const char *const pooling_names[] = {
    [MODEL_POOL_CLS] = "cls", [MODEL_POOL_MEAN] = "mean", [MODEL_POOL_MAX] = "max",
    [MODEL_POOL_NONE] = "none"};

const char *model_pooling_name(enum model_pooling p)
{
    return (unsigned)p <= MODEL_POOL_NONE ? pooling_names[p] : "?";
}

int model_pooling_parse(const char *s, enum model_pooling *out)
{
    for (int i = 0; i <= MODEL_POOL_NONE; i++)
        if (strcmp(s, pooling_names[i]) == 0) {
            *out = (enum model_pooling)i;
            return 0;
        }
    return -1;
}

/* ---- the runtime -------------------------------------------------------- */

void model_runtime_conf_defaults(struct model_runtime_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->backend = "auto";
    c->cpu_threads = 1;
    c->precision = MODEL_FP32;
    c->graphs = 1;
    c->executors_per_device = 2;
    c->workspace_mb = 32;
}

static const char *const precision_names[MODEL_N_PRECISIONS] = {
    [MODEL_FP32] = "fp32", [MODEL_TF32] = "tf32", [MODEL_FP16] = "fp16", [MODEL_BF16] = "bf16"};

const char *model_precision_name(enum model_precision p)
{
    return (unsigned)p < MODEL_N_PRECISIONS ? precision_names[p] : "?";
}

int model_precision_parse(const char *s, enum model_precision *out)
{
    for (int i = 0; i < MODEL_N_PRECISIONS; i++)
        if (strcmp(s, precision_names[i]) == 0) {
            *out = (enum model_precision)i;
            return 0;
        }
    return -1;
}

/* "auto" asks the CUDA backend first and falls back to the CPU with the
 * reason kept for the log; an explicit choice is taken or fails. */
struct model_runtime *model_runtime_new(const struct model_runtime_conf *c, char *errstr,
                                        size_t errstr_size)
{
    const char *want = c->backend ? c->backend : "auto";
    struct model_runtime *rt = calloc(1, sizeof(*rt));
    char what[256] = "";
    if (!rt) {
        model_seterr(errstr, errstr_size, "out of memory");
        return NULL;
    }
    char why[300] = "", desc[400] = "";
    if (strcmp(want, "auto") == 0) {
        if (backend_cuda.probe(what, sizeof(what)) > 0) {
            rt->be = backend_cuda.open(c, desc, sizeof(desc), what, sizeof(what));
            if (rt->be) rt->ops = &backend_cuda;
        }
        if (!rt->be) {
            snprintf(why, sizeof(why), "auto: %s", what);
            rt->ops = &backend_cpu;
        }
    } else if (strcmp(want, "cpu") == 0) {
        rt->ops = &backend_cpu;
    } else if (strcmp(want, "cuda") == 0) {
        if (backend_cuda.probe(what, sizeof(what)) <= 0) {
            model_seterr(errstr, errstr_size, "backend cuda: no usable CUDA device: %s", what);
            free(rt);
            return NULL;
        }
        rt->ops = &backend_cuda;
    } else {
        model_seterr(errstr, errstr_size, "backend '%s' is not one of auto, cpu, cuda", want);
        free(rt);
        return NULL;
    }
    if (!rt->be) {
        char err[256];
        rt->be = rt->ops->open(c, desc, sizeof(desc), err, sizeof(err));
        if (!rt->be) {
            model_seterr(errstr, errstr_size, "backend %s: %s", rt->ops->name, err);
            free(rt);
            return NULL;
        }
    }
    if (why[0]) snprintf(rt->desc, sizeof(rt->desc), "%s (%s)", desc, why);
    else snprintf(rt->desc, sizeof(rt->desc), "%s", desc);
    return rt;
}

void model_runtime_destroy(struct model_runtime *rt)
{
    if (!rt) return;
    rt->ops->close(rt->be);
    free(rt);
}

const char *model_runtime_backend(const struct model_runtime *rt)
{
    return rt->ops->name;
}

const char *model_runtime_describe(const struct model_runtime *rt)
{
    return rt->desc;
}

size_t model_runtime_executors(const struct model_runtime *rt)
{
    return rt->ops->executors(rt->be);
}

const char *model_runtime_precision(const struct model_runtime *rt)
{
    return rt->ops->precision(rt->be);
}

size_t model_runtime_devices(const struct model_runtime *rt)
{
    return rt->ops->devices(rt->be);
}

int model_runtime_device_stats(const struct model_runtime *rt, size_t dev,
                               struct model_device_stats *out)
{
    return rt->ops->device_stats(rt->be, dev, out);
}

int model_cuda_built(void)
{
    return backend_cuda.compiled_in;
}

/* Probes on each call: a driver may come or go between calls. */
void model_cuda_describe(char *buf, size_t n)
{
    char what[256];
    int devices = backend_cuda.probe(what, sizeof(what));
    if (!backend_cuda.compiled_in)
        snprintf(buf, n, "cuda: not built (no nvcc at build time); CPU backend only");
    else if (devices > 0)
        snprintf(buf, n, "cuda: built in; %d usable device%s (%s)", devices,
                 devices == 1 ? "" : "s", what);
    else
        snprintf(buf, n, "cuda: built in; 0 usable devices (%s)", what);
}

/* arch_mlp.c - the layer-list model: a safetensors file and the list of
 * layers worker.cfg gives (dense, relu, gelu, tanh, sigmoid, layernorm,
 * softmax, l2norm; model.h's op table). Loading checks every tensor a
 * layer names against the op table, with the widths chained layer to
 * layer; the forward pass is one GEMM per dense layer over the whole
 * batch (an activation right after it fused into its epilogue) and one
 * primitive per other layer.
 *
 * Threads and ownership: as arch.h says; an mlp_model owns its layer
 * table and every copy of its weights. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"

struct mlp_layer {
    enum model_op op;
    size_t in, out;
    float eps;
    enum bk_act fused;          /* dense: the activation that follows, fused */
    int skip;                   /* an activation fused into the dense before it */
    const struct st_tensor *tw, *tb; /* while loading */
    struct bk_weight *w[MODEL_MAX_DEVICES], *b[MODEL_MAX_DEVICES];
};

struct mlp_model {
    size_t n_layers, copies;
    struct mlp_layer *layers;
    size_t in_w, out_w, max_w;  /* max_w: the widest activation, input included */
};

struct mlp_ws {
    void *buf[2];               /* max_rows x max_w each */
};

/* "model NAME: layer I (OP): ..." */
#define LAYER_ERR(ld, li, fmt, ...)                                                 \
    arch_fail((ld), "layer %zu (%s): " fmt, (li),                                   \
              model_op_name((ld)->spec->layers[(li)].op), __VA_ARGS__)

/* Finds tensor name in the file and checks it can become float32; the
 * caller checks the shape, because only it knows what is expected. */
static const struct st_tensor *mlp_find(struct arch_load *ld, size_t li, const char *name)
{
    const struct st_tensor *t = st_find(ld->file, name);
    if (!t) {
        LAYER_ERR(ld, li, "tensor %s not found in %s", name, ld->spec->path);
        return NULL;
    }
    if (!st_dtype_loadable(t->dtype)) {
        LAYER_ERR(ld, li, "tensor %s has dtype %s, expected F32, F16 or BF16", name,
                  st_dtype_name(t->dtype));
        return NULL;
    }
    ld->n_params += (size_t)t->numel;
    return t;
}

/* Checks that t is 1-D of width w (w == 0: any width > 0, which is then
 * returned through *w). */
static int mlp_check_vec(struct arch_load *ld, size_t li, const struct st_tensor *t, size_t *w)
{
    if (t->ndim == 1 && t->shape[0] > 0 && t->shape[0] <= INT_MAX &&
        (*w == 0 || t->shape[0] == *w)) {
        *w = (size_t)t->shape[0];
        return 0;
    }
    char got[160];
    st_tensor_shape_str(t, got, sizeof(got));
    if (*w) return LAYER_ERR(ld, li, "tensor %s has shape %s, expected [%zu]", t->name, got, *w);
    return LAYER_ERR(ld, li, "tensor %s has shape %s, expected [w] with 0 < w <= %d", t->name,
                     got, INT_MAX);
}

/* One dense layer. *w is the running width (0 while still unknown: the
 * weight's in-features then define it). */
static int mlp_read_dense(struct arch_load *ld, size_t li, struct mlp_layer *L, size_t *w)
{
    const struct model_layer_spec *ls = &ld->spec->layers[li];
    if (!ls->weight[0]) return LAYER_ERR(ld, li, "%s", "dense needs a weight tensor");
    const struct st_tensor *tw = mlp_find(ld, li, ls->weight);
    if (!tw) return -1;
    int ok = tw->ndim == 2 && tw->shape[0] > 0 && tw->shape[1] > 0 &&
             tw->shape[0] <= INT_MAX && tw->shape[1] <= INT_MAX &&
             (*w == 0 || tw->shape[1] == *w);
    if (!ok) {
        char got[160];
        st_tensor_shape_str(tw, got, sizeof(got));
        if (*w) return LAYER_ERR(ld, li, "tensor %s has shape %s, expected [*,%zu]", tw->name,
                                 got, *w);
        return LAYER_ERR(ld, li, "tensor %s has shape %s, expected [out,in] with 0 < out,in <= %d",
                         tw->name, got, INT_MAX);
    }
    L->in = (size_t)tw->shape[1];
    L->out = (size_t)tw->shape[0];
    if (ls->bias[0]) {
        const struct st_tensor *tb = mlp_find(ld, li, ls->bias);
        size_t bw = L->out;
        if (!tb || mlp_check_vec(ld, li, tb, &bw) != 0) return -1;
        L->tb = tb;
    }
    L->tw = tw;
    *w = L->out;
    return 0;
}

/* One layernorm. Weight and bias are each optional (PyTorch's
 * elementwise_affine=False and bias=False): absent means ones and zeros.
 * eps follows model_eps_check, else a constant row divides by zero. */
static int mlp_read_layernorm(struct arch_load *ld, size_t li, struct mlp_layer *L, size_t *w)
{
    const struct model_layer_spec *ls = &ld->spec->layers[li];
    char why[128];
    if (model_eps_check(ls->eps, why, sizeof(why)) != 0)
        return LAYER_ERR(ld, li, "eps %s", why);
    L->eps = (float)ls->eps;
    const char *names[2] = {ls->weight, ls->bias};
    const struct st_tensor **dst[2] = {&L->tw, &L->tb};
    for (int i = 0; i < 2; i++) {
        if (!names[i][0]) continue;
        const struct st_tensor *t = mlp_find(ld, li, names[i]);
        if (!t || mlp_check_vec(ld, li, t, w) != 0) return -1;
        *dst[i] = t;
    }
    L->in = L->out = *w; /* still 0 if no tensor and no width yet: fixed up later */
    return 0;
}

static void mlp_unload(const struct arch_rt *rt, void *am)
{
    struct mlp_model *m = am;
    if (!m) return;
    for (size_t i = 0; m->layers && i < m->n_layers; i++)
        for (size_t d = 0; d < m->copies; d++) {
            arch_weight_free(rt, m->layers[i].w[d]);
            arch_weight_free(rt, m->layers[i].b[d]);
        }
    free(m->layers);
    free(m);
}

/* The activation ops, as a GEMM epilogue can take them. */
static enum bk_act mlp_act_of(enum model_op op)
{
    switch (op) {
    case MODEL_OP_RELU: return BK_ACT_RELU;
    case MODEL_OP_GELU: return BK_ACT_GELU;
    case MODEL_OP_TANH: return BK_ACT_TANH;
    case MODEL_OP_SIGMOID: return BK_ACT_SIGMOID;
    default: return BK_ACT_NONE;
    }
}

/* Walks the layers once, each op's checks by its row of the op table
 * against the running width, so the first inconsistency is the one
 * reported; then uploads. Layers are numbered from 0 in messages, as in
 * the config's list. */
static void *mlp_load(struct arch_load *ld, struct arch_info *info)
{
    const struct model_spec *spec = ld->spec;
    if (spec->input_width > INT_MAX) {
        arch_fail(ld, "input_width %zu exceeds %d", spec->input_width, INT_MAX);
        return NULL;
    }
    struct mlp_model *m = calloc(1, sizeof(*m));
    if (!m || !(m->layers = calloc(spec->n_layers, sizeof(*m->layers)))) {
        arch_fail(ld, "out of memory");
        free(m);
        return NULL;
    }
    m->n_layers = spec->n_layers;
    size_t w = spec->input_width; /* running width; 0 = not known yet */
    for (size_t li = 0; li < spec->n_layers; li++) {
        const struct model_layer_spec *ls = &spec->layers[li];
        struct mlp_layer *L = &m->layers[li];
        const struct model_op_desc *d = model_op_desc(ls->op);
        if (!d) {
            arch_fail(ld, "layer %zu: unknown op %d", li, (int)ls->op);
            goto fail;
        }
        L->op = ls->op;
        /* A tensor the table does not give the op is an error, not
         * something to ignore. */
        int stray_w = !(d->keys & MODEL_KEY_WEIGHT) && ls->weight[0];
        int stray_b = !(d->keys & MODEL_KEY_BIAS) && ls->bias[0];
        if (stray_w || stray_b) {
            LAYER_ERR(ld, li, "takes no tensors, but %s \"%s\" is set",
                      stray_w ? "weight" : "bias", stray_w ? ls->weight : ls->bias);
            goto fail;
        }
        size_t before = w;
        if (d->shape == MODEL_SHAPE_LINEAR) {
            if (mlp_read_dense(ld, li, L, &w) != 0) goto fail;
        } else if (d->shape == MODEL_SHAPE_FEATURE) {
            if (mlp_read_layernorm(ld, li, L, &w) != 0) goto fail;
        } else {
            L->in = L->out = w;
        }
        if (before == 0 && w != 0) {
            /* First shaped layer: it fixes the input width, and the
             * width-keeping layers before it take that width too. */
            m->in_w = L->in;
            for (size_t j = 0; j < li; j++) m->layers[j].in = m->layers[j].out = L->in;
        }
    }
    if (w == 0) {
        arch_fail(ld, "no layer has a shape to infer the input width from; set input_width");
        goto fail;
    }
    if (spec->input_width) m->in_w = spec->input_width;
    m->out_w = w;
    m->max_w = m->in_w;
    for (size_t i = 0; i < m->n_layers; i++) {
        struct mlp_layer *L = &m->layers[i];
        if (L->out > m->max_w) m->max_w = L->out;
        if (L->op == MODEL_OP_DENSE && i + 1 < m->n_layers &&
            mlp_act_of(m->layers[i + 1].op) != BK_ACT_NONE) {
            L->fused = mlp_act_of(m->layers[i + 1].op);
            m->layers[i + 1].skip = 1;
        }
    }
    m->copies = ld->rt.ops->weight_copies(ld->rt.be);
    for (size_t d = 0; d < m->copies; d++)
        for (size_t i = 0; i < m->n_layers; i++) {
            struct mlp_layer *L = &m->layers[i];
            enum bk_wtype t = L->op == MODEL_OP_DENSE ? BK_W_ACT : BK_W_F32;
            if ((L->tw && !(L->w[d] = arch_weight1(ld, d, t, L->tw))) ||
                (L->tb && !(L->b[d] = arch_weight1(ld, d, t, L->tb))))
                goto fail;
        }
    /* The file closes after load: nothing may point into it. */
    for (size_t i = 0; i < m->n_layers; i++) m->layers[i].tw = m->layers[i].tb = NULL;
    info->in_w = m->in_w;
    info->out_w = m->out_w;
    info->flops_per_row = 0;
    for (size_t i = 0; i < m->n_layers; i++)
        if (m->layers[i].op == MODEL_OP_DENSE)
            info->flops_per_row += 2.0 * (double)m->layers[i].in * (double)m->layers[i].out;
    return m;
fail:
    mlp_unload(&ld->rt, m);
    return NULL;
}

/* Two buffers of the widest activation: dense reads one and writes the
 * other, every other op works in place. */
static void *mlp_ws_new(const struct arch_rt *rt, const void *am, void *c,
                        const struct arch_sizes *sz, char *errstr, size_t errstr_size)
{
    const struct mlp_model *m = am;
    struct mlp_ws *ws = calloc(1, sizeof(*ws));
    size_t bytes = arch_act_bytes(rt, sz->max_rows * m->max_w);
    if (!ws || !(ws->buf[0] = rt->ops->ctx_alloc(c, bytes, 0)) ||
        !(ws->buf[1] = rt->ops->ctx_alloc(c, bytes, 0))) {
        snprintf(errstr, errstr_size, "out of memory for a workspace of %zu rows",
                 sz->max_rows);
        free(ws);
        return NULL;
    }
    return ws;
}

static void mlp_ws_free(void *aws)
{
    free(aws);
}

/* Layer by layer; the input buffer is the runtime's and may be rewritten
 * in place (it is filled again for every pass). */
static int mlp_forward(const struct arch_rt *rt, const void *am, void *aws, void *c,
                       const struct arch_batch *b, const void **out)
{
    const struct mlp_model *m = am;
    const struct backend_ops *o = rt->ops;
    struct mlp_ws *ws = aws;
    size_t d = o->ctx_copy(c), rows = b->rows, w = m->in_w;
    void *cur = (void *)b->x;
    int rc = 0;
    for (size_t li = 0; li < m->n_layers && rc == 0; li++) {
        const struct mlp_layer *L = &m->layers[li];
        if (L->skip) continue;
        switch (L->op) {
        case MODEL_OP_DENSE: {
            void *dst = cur == ws->buf[0] ? ws->buf[1] : ws->buf[0];
            struct bk_gemm g = {.m = rows, .n = L->out, .k = L->in, .a = cur, .w = L->w[d],
                                .bias = L->b[d], .act = L->fused, .c = dst};
            rc = o->gemm(c, &g);
            cur = dst;
            w = L->out;
            break;
        }
        case MODEL_OP_LAYERNORM:
            rc = o->layernorm(c, cur, cur, NULL, L->w[d], L->b[d], L->eps, rows, w);
            break;
        case MODEL_OP_SOFTMAX:
            rc = o->softmax(c, cur, rows, w);
            break;
        case MODEL_OP_L2NORM:
            rc = o->l2norm(c, cur, rows, w);
            break;
        default:
            rc = o->act(c, cur, rows * w, mlp_act_of(L->op));
            break;
        }
    }
    *out = cur;
    return rc;
}

const struct arch arch_mlp = {
    .name = "mlp",
    .model_types = NULL,
    .load = mlp_load,
    .unload = mlp_unload,
    .ws_new = mlp_ws_new,
    .ws_free = mlp_ws_free,
    .forward = mlp_forward,
};

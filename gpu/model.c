/* model.c - the runtime of model.h: the op table, the choice of backend,
 * loading a model through the architecture registry (arch.h), the
 * workspaces, and the passes.
 *
 * Loading: a layer list's safetensors file goes to the layer-list
 * architecture; a Hugging Face folder is read here (folder.c: config.json,
 * tokenizer, head, limits) and its model_type picks the architecture,
 * which checks and uploads its tensors while the file is mapped. A pass
 * stages the batch (rows, or token arrays) on the device, runs the
 * architecture's forward (or replays its recording), fetches the result
 * and, for a classifier, picks each row's label.
 *
 * Threads: the runtime, model_load and model_destroy on the main thread
 * at startup and shutdown. A loaded model is never written again, so
 * executor threads share it; each executor owns its model_ws and is the
 * only caller of model_forward / model_encode with it.
 *
 * Ownership: the runtime owns the backend's state; a model owns the
 * architecture's model (every copy of the weights), the tokenizer and the
 * labels; a model_ws owns its backend context, which owns every buffer of
 * the workspace. Nothing points into the file after model_load. */
#include "model.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../text/tokenizer.h"
#include "arch.h"
#include "backend.h"
#include "folder.h"
#include "safetensors.h"

struct model_runtime {
    const struct backend_ops *ops;
    void *be;                 /* the backend's state */
    char desc[1400];          /* model_runtime_describe */
};

struct model {
    char name[MODEL_NAME_MAX];
    struct model_runtime *rt;
    const struct arch *arch;     /* the registry's row */
    void *am;                    /* the architecture's model (weights on every copy) */
    struct arch_info info;
    size_t n_params;
    /* A folder's (an encoder): */
    int is_encoder;
    struct head_conf head;
    struct model_encoder_info enc;
    struct tokenizer *tok;       /* enc.tokenizer */
    char **labels;               /* enc.labels */
};

struct model_ws {
    const struct model *m;       /* the model the workspace was made for */
    size_t max_rows;
    size_t max_tokens;           /* an encoder's: rows x longest per call */
    void *ctx;                   /* the backend's context */
    void *aws;                   /* the architecture's buffers */
    float *h_in;                 /* pinned: max_rows x in_w (model_ws_input) */
    void *d_in;                  /* the same on the device, as activations */
    uint32_t *h_tok, *d_tok;     /* a batch's token arrays, pinned and on the device */
    float *h_out;                /* pinned: the result */
    const void *d_out;           /* where the architecture left it (fixed per workspace) */
    const char **labels;         /* a classifier's best label per row */
    char err[256];               /* model_ws_error */
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

/* ---- loading ------------------------------------------------------------ */

/* A tokenizer must not produce ids past the embedding table. */
static int model_vocab_check(const struct model_spec *spec, size_t tok_vocab, size_t vocab,
                             char *errstr, size_t errstr_size)
{
    if (tok_vocab <= vocab) return 0;
    model_seterr(errstr, errstr_size,
                 "model %s: the tokenizer has %zu tokens, the model's vocab_size is %zu",
                 spec->name, tok_vocab, vocab);
    return -1;
}

/* A folder's model: the runtime reads the folder (folder.c), the
 * registry picks the architecture by config.json's model_type, the
 * architecture reads and uploads its tensors while the file is mapped;
 * the model keeps the tokenizer, the labels and what the worker needs to
 * know. */
static int model_load_folder(struct model *m, const struct model_spec *spec, char *errstr,
                             size_t errstr_size)
{
    struct folder f;
    if (folder_open(spec, &f, errstr, errstr_size) < 0) return -1;
    int rc = -1;
    m->arch = arch_for_model_type(f.model_type);
    if (!m->arch) {
        char types[256];
        arch_model_types(types, sizeof(types));
        model_seterr(errstr, errstr_size,
                     "model %s: config.json: model_type \"%s\" is not one this build runs (%s)",
                     spec->name, f.model_type, types);
        goto done;
    }
    /* Before the tensors, so a tokenizer that does not fit is named as
     * such rather than as a table of the wrong size. */
    const json_t *vs = json_object_get(f.config, "vocab_size");
    if (json_is_integer(vs) && json_integer_value(vs) > 0 &&
        model_vocab_check(spec, f.tok_vocab, (size_t)json_integer_value(vs), errstr,
                          errstr_size) < 0)
        goto done;
    struct arch_load ld = {.rt = {m->rt->ops, m->rt->be}, .spec = spec, .config = f.config,
                           .file = f.file, .head = &f.head, .errstr = errstr,
                           .errstr_size = errstr_size};
    if (!(m->am = m->arch->load(&ld, &m->info))) goto done;
    m->n_params = ld.n_params;
    m->head = f.head;
    /* Again by the architecture's own count (its config key may differ). */
    if (model_vocab_check(spec, f.tok_vocab, m->info.vocab, errstr, errstr_size) < 0) goto done;
    /* The entry's limit, else the least of what the folder states. */
    size_t max_tokens = m->info.pos_limit;
    if (f.tok_max && f.tok_max < max_tokens) max_tokens = f.tok_max;
    if (f.st_max && f.st_max < max_tokens) max_tokens = f.st_max;
    if (spec->enc.max_tokens) {
        if (spec->enc.max_tokens > m->info.pos_limit) {
            model_seterr(errstr, errstr_size,
                         "model %s: encoder.max_tokens %zu is more than the %zu tokens "
                         "max_position_embeddings %zu allows", spec->name, spec->enc.max_tokens,
                         m->info.pos_limit, m->info.max_pos);
            goto done;
        }
        max_tokens = spec->enc.max_tokens;
    }
    if (max_tokens < 3) {
        model_seterr(errstr, errstr_size,
                     "model %s: at most %zu tokens per row: too few for [CLS] text [SEP]",
                     spec->name, max_tokens);
        goto done;
    }
    size_t n_labels = 0;
    if (f.head.head == MODEL_HEAD_CLASSIFIER) {
        char why[300];
        n_labels = m->info.n_labels;
        if (!(m->labels = head_labels_read(f.config, n_labels, why, sizeof(why)))) {
            model_seterr(errstr, errstr_size, "model %s: %s", spec->name, why);
            goto done;
        }
    }
    m->tok = f.tok;
    f.tok = NULL;
    m->is_encoder = 1;
    m->enc = (struct model_encoder_info){
        .tokenizer = m->tok,
        .hidden = m->info.hidden,
        .layers = m->info.layers,
        .heads = m->info.heads,
        .intermediate = m->info.intermediate,
        .max_tokens = max_tokens,
        .type_vocab = m->info.type_vocab,
        .vocab = m->info.vocab,
        .pooling = f.head.pooling,
        .normalize = f.head.normalize,
        .head = f.head.head,
        .sigmoid = f.head.sigmoid,
        .n_labels = n_labels,
        .labels = (const char *const *)m->labels,
        .padded = m->rt->ops->attention_pads,
    };
    rc = 0;
done:
    folder_close(&f);
    return rc;
}

/* A safetensors file with a layer list: the layer-list architecture
 * checks it against the op table. */
static int model_load_layers(struct model *m, const struct model_spec *spec, char *errstr,
                             size_t errstr_size)
{
    char sterr[512];
    struct st_file *f = st_open(spec->path, sterr, sizeof(sterr));
    if (!f) {
        model_seterr(errstr, errstr_size, "model %s: %s", spec->name, sterr);
        return -1;
    }
    m->arch = arch_layer_list();
    struct arch_load ld = {.rt = {m->rt->ops, m->rt->be}, .spec = spec, .file = f,
                           .errstr = errstr, .errstr_size = errstr_size};
    m->am = m->arch->load(&ld, &m->info);
    m->n_params = ld.n_params;
    st_close(f); /* nothing may point into it afterwards */
    return m->am ? 0 : -1;
}

/* A directory is a Hugging Face folder, a file a layer list's weights;
 * a failed load leaves nothing behind. */
struct model *model_load(struct model_runtime *rt, const struct model_spec *spec,
                         char *errstr, size_t errstr_size)
{
    if (!rt) {
        model_seterr(errstr, errstr_size, "model %s: no runtime", spec->name);
        return NULL;
    }
    struct stat st;
    int is_dir = stat(spec->path, &st) == 0 && S_ISDIR(st.st_mode);
    if (spec->n_layers == 0 && !is_dir) {
        model_seterr(errstr, errstr_size,
                     "model %s: %s is not a directory: a model without layers is a "
                     "Hugging Face model folder (config.json, model.safetensors, vocab.txt)",
                     spec->name, spec->path);
        return NULL;
    }
    if (spec->n_layers && is_dir) {
        model_seterr(errstr, errstr_size,
                     "model %s: %s is a directory: a model with layers is a safetensors file "
                     "(a model folder takes no layers)", spec->name, spec->path);
        return NULL;
    }
    struct model *m = calloc(1, sizeof(*m));
    if (!m) {
        model_seterr(errstr, errstr_size, "model %s: out of memory", spec->name);
        return NULL;
    }
    snprintf(m->name, sizeof(m->name), "%s", spec->name);
    m->rt = rt;
    int rc = spec->n_layers ? model_load_layers(m, spec, errstr, errstr_size)
                            : model_load_folder(m, spec, errstr, errstr_size);
    if (rc < 0) {
        model_destroy(m);
        return NULL;
    }
    return m;
}

/* Tolerates a half-built model, which is what model_load's failure path
 * hands it. */
void model_destroy(struct model *m)
{
    if (!m) return;
    if (m->am) m->arch->unload(&(struct arch_rt){m->rt->ops, m->rt->be}, m->am);
    tokenizer_destroy(m->tok);
    for (size_t i = 0; m->labels && i < m->info.n_labels; i++) free(m->labels[i]);
    free(m->labels);
    free(m);
}

/* Accessors: the executor and the logs need these, nothing else. */
const char *model_name(const struct model *m)
{
    return m->name;
}

size_t model_input_width(const struct model *m)
{
    return m->info.in_w;
}

size_t model_output_width(const struct model *m)
{
    return m->info.out_w;
}

size_t model_param_count(const struct model *m)
{
    return m->n_params;
}

const char *model_arch_name(const struct model *m)
{
    return m->arch->name;
}

int model_per_token(const struct model *m)
{
    return m->is_encoder && m->head.head == MODEL_HEAD_EMBEDDING &&
           m->head.pooling == MODEL_POOL_NONE;
}

double model_flops_per_row(const struct model *m)
{
    return m->info.flops_per_row;
}

const struct model_encoder_info *model_encoder(const struct model *m)
{
    return m && m->is_encoder ? &m->enc : NULL;
}

/* ---- workspaces --------------------------------------------------------- */

/* Accepts NULL, so failure paths can call it unconditionally. */
void model_ws_destroy(struct model_ws *ws)
{
    if (!ws) return;
    if (ws->aws) ws->m->arch->ws_free(ws->aws);
    if (ws->ctx) ws->m->rt->ops->ctx_free(ws->ctx);
    free(ws->labels);
    free(ws);
}

/* The backend context, the staging the runtime does (a layer model's
 * input rows; a token model's ids, type ids, positions, sequence of each
 * token and offsets, pinned and on the device), the result's pinned
 * buffer, then the architecture's own buffers. */
static struct model_ws *model_ws_make(const struct model *m, unsigned slot, size_t max_rows,
                                      size_t max_tokens, char *errstr, size_t errstr_size)
{
    const struct backend_ops *o = m->rt->ops;
    struct arch_rt rt = {o, m->rt->be};
    struct model_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) {
        model_seterr(errstr, errstr_size, "model %s: out of memory", m->name);
        return NULL;
    }
    ws->m = m;
    ws->max_rows = max_rows;
    ws->max_tokens = max_tokens;
    char err[256] = "";
    if (!(ws->ctx = o->ctx_new(m->rt->be, slot, err, sizeof(err)))) goto fail;
    size_t out_rows = m->is_encoder && model_per_token(m) ? max_tokens : max_rows;
    if (!(ws->h_out = o->ctx_alloc(ws->ctx, out_rows * m->info.out_w * sizeof(float), 1)))
        goto oom;
    if (m->is_encoder) {
        size_t words = 4 * max_tokens + max_rows + 1;
        if (!(ws->h_tok = o->ctx_alloc(ws->ctx, words * sizeof(uint32_t), 1)) ||
            !(ws->d_tok = o->ctx_alloc(ws->ctx, words * sizeof(uint32_t), 0)) ||
            (m->enc.n_labels && !(ws->labels = calloc(max_rows, sizeof(*ws->labels)))))
            goto oom;
    } else if (!(ws->h_in = o->ctx_alloc(ws->ctx, max_rows * m->info.in_w * sizeof(float), 1)) ||
               !(ws->d_in = o->ctx_alloc(ws->ctx, arch_act_bytes(&rt, max_rows * m->info.in_w),
                                         0))) {
        goto oom;
    }
    struct arch_sizes sz = {max_rows, max_tokens,
                            max_tokens < m->enc.max_tokens ? max_tokens : m->enc.max_tokens};
    if (!(ws->aws = m->arch->ws_new(&rt, m->am, ws->ctx, &sz, err, sizeof(err)))) goto fail;
    return ws;
oom:
    snprintf(err, sizeof(err), "out of memory for a workspace of %zu rows%s (%s)", max_rows,
             m->is_encoder ? " and its tokens" : "", o->ctx_error(ws->ctx));
fail:
    model_seterr(errstr, errstr_size, "model %s: %s", m->name, err);
    model_ws_destroy(ws);
    return NULL;
}

/* The limits on max_rows keep every rows x width product inside size_t
 * and int. */
struct model_ws *model_ws_new(const struct model *m, unsigned slot, size_t max_rows,
                              char *errstr, size_t errstr_size)
{
    if (m && m->is_encoder) {
        model_seterr(errstr, errstr_size,
                     "model %s is an encoder: its workspace is sized in tokens", m->name);
        return NULL;
    }
    size_t w = m ? (m->info.in_w > m->info.out_w ? m->info.in_w : m->info.out_w) : 1;
    if (!m || max_rows == 0 || max_rows > INT_MAX || max_rows > SIZE_MAX / sizeof(float) / w ||
        max_rows * w > INT_MAX) {
        model_seterr(errstr, errstr_size, "model %s: a workspace of %zu rows is not possible",
                     m ? m->name : "?", max_rows);
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
    size_t widest = m ? 3 * m->info.hidden : 1;
    if (m && m->info.intermediate > widest) widest = m->info.intermediate;
    if (!m || max_rows == 0 || max_rows > INT_MAX || max_tokens < max_rows ||
        max_tokens > INT_MAX / 4 ||
        max_tokens > SIZE_MAX / sizeof(float) / (widest + 2 * m->info.hidden)) {
        model_seterr(errstr, errstr_size,
                     "model %s: a workspace of %zu rows and %zu tokens is not possible",
                     m ? m->name : "?", max_rows, max_tokens);
        return NULL;
    }
    return model_ws_make(m, slot, max_rows, max_tokens, errstr, errstr_size);
}

float *model_ws_input(struct model_ws *ws)
{
    return ws->h_in;
}

const char *model_ws_error(const struct model_ws *ws)
{
    return ws->err;
}

void model_ws_inject_fault(struct model_ws *ws)
{
    ws->m->rt->ops->inject_fault(ws->ctx);
}

const char *const *model_ws_labels(const struct model_ws *ws)
{
    return ws->labels;
}

/* ---- passes ------------------------------------------------------------- */

/* The worse of two outcomes (EFATAL over EINVAL over OK). */
static int model_worse(int a, int b)
{
    return a < b ? a : b;
}

/* One pass of the architecture over a batch already on the device:
 * replayed from a recording when the backend has one for the shape key,
 * else issued call by call (and maybe recorded); then n floats of the
 * output fetched into the pinned result buffer. The pass is bracketed by
 * pass_begin/pass_end, which report a dead device. */
static int model_pass(struct model_ws *ws, const struct arch_batch *b, const void *key,
                      size_t key_len, size_t n_out, const float **out)
{
    const struct model *m = ws->m;
    const struct backend_ops *o = m->rt->ops;
    struct arch_rt rt = {o, m->rt->be};
    int rc = 0;
    int g = o->graph_begin ? o->graph_begin(ws->ctx, key, key_len) : BK_GRAPH_RUN;
    if (g < 0) {
        rc = g;
    } else if (g == BK_GRAPH_RUN) {
        rc = m->arch->forward(&rt, m->am, ws->aws, ws->ctx, b, &ws->d_out);
        if (o->graph_end) rc = model_worse(rc, o->graph_end(ws->ctx));
    }
    if (rc == 0) rc = o->store_f32(ws->ctx, ws->h_out, ws->d_out, n_out);
    rc = model_worse(rc, o->pass_end(ws->ctx));
    if (rc < 0) {
        snprintf(ws->err, sizeof(ws->err), "%s", o->ctx_error(ws->ctx));
        return rc;
    }
    *out = ws->h_out;
    return MODEL_OK;
}

/* Checks what is cheap (rows, workspace owner) so every backend can trust
 * its arguments. */
int model_forward(const struct model *m, struct model_ws *ws, const float *in,
                  size_t rows, const float **out)
{
    if (!m || m->is_encoder || !ws || ws->m != m || !in || !out || rows == 0 ||
        rows > ws->max_rows)
        return MODEL_EINVAL;
    const struct backend_ops *o = m->rt->ops;
    int rc = o->pass_begin(ws->ctx);
    if (rc == 0) rc = o->load_f32(ws->ctx, ws->d_in, in, rows * m->info.in_w);
    if (rc < 0) {
        snprintf(ws->err, sizeof(ws->err), "%s", o->ctx_error(ws->ctx));
        o->pass_end(ws->ctx);
        return rc;
    }
    struct arch_batch b = {.rows = rows, .x = ws->d_in};
    uint64_t key = rows;
    return model_pass(ws, &b, &key, sizeof(key), rows * m->info.out_w, out);
}

/* Checks everything a backend indexes with (counts, offsets, ids, type
 * ids), so no hostile token array reaches a kernel or a table lookup;
 * stages the batch; runs it; picks each row's label. */
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
    size_t T = s->offsets[s->n], cap = ws->max_tokens;
    for (size_t t = 0; t < T; t++) {
        if (s->ids[t] < 0 || (size_t)s->ids[t] >= m->enc.vocab) return MODEL_EINVAL;
        if (s->type_ids && (s->type_ids[t] < 0 || (size_t)s->type_ids[t] >= m->enc.type_vocab))
            return MODEL_EINVAL;
    }
    /* ids [cap], types [cap], pos [cap], seq [cap], offsets [rows + 1] */
    uint32_t *h = ws->h_tok, *d = ws->d_tok;
    memcpy(h, s->ids, T * sizeof(uint32_t));
    if (s->type_ids) memcpy(h + cap, s->type_ids, T * sizeof(uint32_t));
    else memset(h + cap, 0, T * sizeof(uint32_t));
    for (size_t i = 0; i < s->n; i++)
        for (uint32_t t = s->offsets[i]; t < s->offsets[i + 1]; t++) {
            h[2 * cap + t] = t - s->offsets[i];
            h[3 * cap + t] = (uint32_t)i;
        }
    memcpy(h + 4 * cap, s->offsets, (s->n + 1) * sizeof(uint32_t));
    const struct backend_ops *o = m->rt->ops;
    int rc = o->pass_begin(ws->ctx);
    for (size_t k = 0; k < 4 && rc == 0; k++)
        rc = o->upload(ws->ctx, d + k * cap, h + k * cap, T * sizeof(uint32_t));
    if (rc == 0) rc = o->upload(ws->ctx, d + 4 * cap, h + 4 * cap, (s->n + 1) * sizeof(uint32_t));
    if (rc < 0) {
        snprintf(ws->err, sizeof(ws->err), "%s", o->ctx_error(ws->ctx));
        o->pass_end(ws->ctx);
        return rc;
    }
    struct bk_seqs seqs = {.n = s->n, .tokens = T, .longest = longest,
                           .offsets = d + 4 * cap, .seq = d + 3 * cap, .pos = d + 2 * cap,
                           .ids = (const int32_t *)d, .types = (const int32_t *)(d + cap)};
    struct arch_batch b = {.rows = s->n, .s = &seqs};
    uint64_t key[3] = {s->n, T, longest};
    size_t w = m->info.out_w, n_out = (model_per_token(m) ? T : s->n) * w;
    rc = model_pass(ws, &b, key, sizeof(key), n_out, out);
    if (rc == MODEL_OK && ws->labels)
        for (size_t r = 0; r < s->n; r++) {
            const float *sc = *out + r * w;
            size_t best = 0;
            for (size_t k = 1; k < w; k++)
                if (sc[k] > sc[best]) best = k;
            ws->labels[r] = m->labels[best];
        }
    return rc;
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
    c->cpu_precision = MODEL_FP32;
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

/* r with gpu.precision "auto" resolved from r->specs' weights (why, of
 * why_size bytes, holds the reason, borrowed by r); r unchanged without. */
static const struct model_runtime_conf *runtime_precision(struct model_runtime_conf *r,
                                                          char *why, size_t why_size)
{
    if (r->precision_auto) {
        r->precision = model_weights_precision(r->specs, r->n_specs, why, why_size);
        r->precision_why = why;
    }
    return r;
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
    /* gpu.precision "auto" resolves once a CUDA device is found, before
     * that backend opens; the CPU backend ignores it, so without a device
     * no header is read. */
    struct model_runtime_conf resolved = *c;
    char pwhy[512];
    char why[300] = "", desc[1000] = "";
    if (strcmp(want, "auto") == 0) {
        if (backend_cuda.probe(what, sizeof(what)) > 0) {
            c = runtime_precision(&resolved, pwhy, sizeof(pwhy));
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
        c = runtime_precision(&resolved, pwhy, sizeof(pwhy));
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

struct arch_rt model_runtime_arch(const struct model_runtime *rt)
{
    return (struct arch_rt){rt->ops, rt->be};
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

void model_runtime_device_name(const struct model_runtime *rt, char *buf, size_t n)
{
    if (!n) return;
    buf[0] = '\0';
    size_t used = 0, devs = rt->ops->devices(rt->be);
    for (size_t d = 0; d < devs && used < n; d++) {
        struct model_device_stats ds;
        if (model_runtime_device_stats(rt, d, &ds) < 0) continue;
        int k = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", ds.name);
        if (k < 0) break;
        used += (size_t)k < n - used ? (size_t)k : n - used - 1;
    }
    if (!used) snprintf(buf, n, "%s", rt->ops->name);
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

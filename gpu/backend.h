/* backend.h - the contract a model backend fills in. gpu/model.c is the
 * only caller: it validates a model once (shapes, dtypes, the op table),
 * then hands the validated plan to the backend the runtime chose, and
 * calls through the table for workspaces and forward passes. Each backend
 * is a file (or a few) of its own: backend_cpu.c (OpenBLAS),
 * backend_cuda.c with its kernels (cuBLASLt), or cuda_stub.c in a build
 * without CUDA. Nothing outside gpu/ includes this header.
 *
 * Handles are void pointers: each backend defines its own state, model and
 * workspace types in its own file, and only it looks inside them.
 *
 * Threads: open, close, model_new and model_free on the main thread at
 * startup and shutdown; ws_new, ws_free and forward on the executor thread
 * that owns the workspace (several executors run at once, each on its own
 * workspace). probe on any thread. */
#ifndef KINFER_BACKEND_H
#define KINFER_BACKEND_H

#include <stddef.h>

#include "model.h"
#include "safetensors.h"

/* One validated layer. The tensors point into the model's safetensors
 * file, which stays mapped only while model_new runs: a backend copies or
 * converts what it keeps. A layernorm's w/b may be NULL (ones/zeros). */
struct backend_layer {
    enum model_op op;
    size_t in, out;              /* row widths before and after the layer */
    const struct st_tensor *w;   /* dense [out,in]; layernorm [in]; else NULL */
    const struct st_tensor *b;   /* dense [out]; layernorm [in]; else NULL */
    float eps;                   /* layernorm */
};

/* One BERT layer's tensors (the file's names in the comments). Linear
 * weights are [out,in] as nn.Linear stores them. */
struct backend_bert_layer {
    const struct st_tensor *q_w, *q_b;    /* attention.self.query [H,H], [H] */
    const struct st_tensor *k_w, *k_b;    /* attention.self.key */
    const struct st_tensor *v_w, *v_b;    /* attention.self.value */
    const struct st_tensor *ao_w, *ao_b;  /* attention.output.dense [H,H], [H] */
    const struct st_tensor *ln1_w, *ln1_b;/* attention.output.LayerNorm [H] */
    const struct st_tensor *i_w, *i_b;    /* intermediate.dense [I,H], [I] */
    const struct st_tensor *o_w, *o_b;    /* output.dense [H,I], [H] */
    const struct st_tensor *ln2_w, *ln2_b;/* output.LayerNorm [H] */
};

/* A validated BERT encoder (gpu/bert.c reads it from a folder): shapes
 * checked, every tensor present, the head and pooling decided. */
struct backend_bert {
    size_t vocab, hidden, heads, intermediate, max_pos, type_vocab, n_layers;
    float ln_eps;
    int gelu_tanh;                        /* hidden_act: tanh approximation, else erf */
    const struct st_tensor *word, *pos, *type; /* embeddings [V,H], [P,H], [T,H] */
    const struct st_tensor *emb_ln_w, *emb_ln_b;
    const struct backend_bert_layer *layers;
    enum model_pooling pooling;
    int normalize;
    enum model_head head;
    int sigmoid;
    size_t n_labels;
    const struct st_tensor *pool_w, *pool_b; /* pooler.dense [H,H], [H]: classifier */
    const struct st_tensor *cls_w, *cls_b;   /* classifier [labels,H], [labels] */
};

/* A validated model, as a backend builds from it (plain data, borrowed
 * for the duration of model_new). An encoder has bert set and no layers;
 * its in_w is 0 and out_w its output width per row. */
struct backend_plan {
    const char *name;
    const struct backend_layer *layers;
    size_t n_layers;
    size_t in_w, out_w;
    size_t max_w;                /* widest activation of any layer, input included */
    const struct backend_bert *bert;
};

struct backend_ops {
    const char *name;            /* "cpu", "cuda" */
    int compiled_in;             /* 0 for the stub of a build without it */
    int encoder_pads;            /* encode pads each sequence to the batch's longest */

    /* How many devices this backend could use now (the CPU counts as
     * one), with a line saying what they are or why there are none
     * ("2 x NVIDIA H100 80GB HBM3", "no CUDA driver"). */
    int (*probe)(char *what, size_t what_size);

    /* Process-wide set-up (thread pools, devices). Returns the backend's
     * state, or NULL with errstr filled. The one-line description of
     * what was set up goes into desc. Borrows c. */
    void *(*open)(const struct model_runtime_conf *c, char *desc, size_t desc_size,
                  char *errstr, size_t errstr_size);
    void (*close)(void *be);

    /* The backend's own copy of a validated model's weights (converted,
     * uploaded to each device). Returns NULL with errstr filled, naming
     * the model and the sizes when memory runs out. */
    void *(*model_new)(void *be, const struct backend_plan *p, char *errstr,
                       size_t errstr_size);
    void (*model_free)(void *be, void *bm);

    /* A workspace for up to max_rows rows of the model bm (an encoder's:
     * max_rows sequences of max_tokens tokens in all); slot is the
     * executor's number. Everything forward needs is allocated here. */
    void *(*ws_new)(void *be, void *bm, const struct backend_plan *p, unsigned slot,
                    size_t max_rows, size_t max_tokens, char *errstr, size_t errstr_size);
    void (*ws_free)(void *ws);
    /* The workspace's input buffer (max_rows x in_w floats). */
    float *(*ws_input)(void *ws);

    /* Runs rows (1..max_rows, checked by the caller) through the model;
     * on MODEL_OK *out points at rows x out_w floats inside the
     * workspace. MODEL_EFATAL with errstr filled when the device failed
     * for good. */
    int (*forward)(void *ws, const float *in, size_t rows, const float **out, char *errstr,
                   size_t errstr_size);
    /* An encoder's forward pass over packed sequences (checked by the
     * caller: counts within the workspace, ids and type ids in range,
     * every sequence 1..max_pos tokens); *out as model_encode says. NULL
     * for a backend without encoders. */
    int (*encode)(void *ws, const struct model_seqs *s, const float **out, char *errstr,
                  size_t errstr_size);
    /* Arms ws so its next forward fails as a dead device would. */
    void (*inject_fault)(void *ws);

    /* What the runtime reports about itself: executors when
     * batching.executors is 0, the precision, the devices and their
     * counters (-1 for a device that does not exist). */
    size_t (*executors)(void *be);
    const char *(*precision)(void *be);
    size_t (*devices)(void *be);
    int (*device_stats)(void *be, size_t dev, struct model_device_stats *out);
};

/* The backends of this build. backend_cuda is the stub of cuda_stub.c
 * when the build has no CUDA: its probe finds nothing and its open says
 * why. */
extern const struct backend_ops backend_cpu;
extern const struct backend_ops backend_cuda;

#endif

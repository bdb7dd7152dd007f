/* model.h - kinfer's inference runtime, the one API the rest of kinfer
 * uses to run a model: the op table, loading a model (a safetensors file
 * plus a layer list), per-executor workspaces and the forward pass. Which
 * backend runs it (OpenBLAS on the CPU, cuBLAS on a GPU) is chosen once,
 * by model_runtime_new; nothing above gpu/ knows which one it is (the
 * backends fill in gpu/backend.h). Plain C.
 *
 * Threads: model_runtime_new and model_load at startup (main thread); a
 * loaded model is read-only and may be shared; each executor thread owns
 * its own model_ws and is the only caller of model_forward with it. */
#ifndef KINFER_MODEL_H
#define KINFER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define MODEL_NAME_MAX 128
#define MODEL_TENSOR_NAME_MAX 256

enum model_op {
    MODEL_OP_DENSE = 0, /* nn.Linear: weight [out,in], optional bias [out]; y = x W^T + b */
    MODEL_OP_RELU,
    MODEL_OP_GELU,      /* erf form: 0.5 x (1 + erf(x / sqrt 2)) */
    MODEL_OP_TANH,
    MODEL_OP_SIGMOID,
    MODEL_OP_LAYERNORM, /* weight [w], bias [w], eps; biased variance over the last dim */
    MODEL_OP_SOFTMAX,   /* over the last dim */
    MODEL_OP_L2NORM,    /* x / max(||x||_2, 1e-12) over the last dim */
    MODEL_N_OPS
};

/* The keys a layer of worker.cfg may give besides its op, as bits. */
enum model_key {
    MODEL_KEY_WEIGHT = 1 << 0, /* a tensor name */
    MODEL_KEY_BIAS = 1 << 1,   /* a tensor name */
    MODEL_KEY_EPS = 1 << 2,    /* a number */
};

/* How an op's tensors are shaped and what it does to the row width. */
enum model_shape {
    MODEL_SHAPE_NONE = 0, /* no tensors; the width passes through */
    MODEL_SHAPE_LINEAR,   /* weight [out,in], bias [out]: the width becomes out */
    MODEL_SHAPE_FEATURE,  /* weight and bias [w], one per feature: the width stays */
};

/* One row of the op table: everything the config reader and the loader
 * need to judge a layer, so the two can never disagree. Plain data. */
struct model_op_desc {
    const char *name;      /* as written in worker.cfg: "dense", "relu", ... */
    unsigned keys;         /* enum model_key bits a layer of this op may give */
    unsigned required;     /* of those, the ones it must give */
    enum model_shape shape;
};

/* Default layernorm eps (PyTorch's nn.LayerNorm). */
#define MODEL_EPS_DEFAULT 1e-5

/* The op table's row for op, or NULL for a value outside the enum. */
const struct model_op_desc *model_op_desc(enum model_op op);
/* Parses "dense", "relu", ... into *out; returns 0 or -1 if unknown. */
int model_op_parse(const char *s, enum model_op *out);
/* The op's name, "?" for a value outside the enum. */
const char *model_op_name(enum model_op op);
/* The one rule for a layernorm eps: finite, > 0 and < 1 (a constant row
 * divides by sqrt(eps), so 0 is refused; 1 or more is surely a typo).
 * Returns 0, or -1 with why filled. */
int model_eps_check(double eps, char *why, size_t why_size);

/* One layer as the config describes it (plain data). */
struct model_layer_spec {
    enum model_op op;
    char weight[MODEL_TENSOR_NAME_MAX]; /* tensor name, "" if the op has none */
    char bias[MODEL_TENSOR_NAME_MAX];   /* tensor name, "" = no bias */
    double eps;                         /* layernorm only; MODEL_EPS_DEFAULT */
};

/* One model as the config describes it (plain data, owned by the config). */
/* How a text encoder's rows become its output. */
enum model_pooling {
    MODEL_POOL_CLS = 0, /* the [CLS] token's vector */
    MODEL_POOL_MEAN,    /* the mean over the row's tokens (padding never counts) */
    MODEL_POOL_MAX,     /* the elementwise max over the row's tokens */
    MODEL_POOL_NONE,    /* every token's vector */
};

/* What an encoder's output is. */
enum model_head {
    MODEL_HEAD_EMBEDDING = 0, /* pooled hidden states (optionally L2-normalized) */
    MODEL_HEAD_CLASSIFIER,    /* *ForSequenceClassification: pooler + classifier,
                                 scores over the labels (enum model_scores) */
};

/* What a classifier's scores are (the `sigmoid` fields below hold one):
 * a softmax over the labels, each label's sigmoid (a multi-label model,
 * or a one-label cross-encoder), or the raw logits (a cross-encoder whose
 * folder says Identity). */
enum model_scores {
    MODEL_SCORES_SOFTMAX = 0,
    MODEL_SCORES_SIGMOID = 1,
    MODEL_SCORES_NONE = 2,
};

/* A model entry's overrides of what a Hugging Face folder says; each
 * field's "unset" value keeps the folder's (plain data). */
struct model_encoder_spec {
    int pooling;    /* enum model_pooling, or -1 */
    int normalize;  /* 1/0: L2-normalize the embeddings, or -1 */
    int head;       /* enum model_head, or -1 */
    int sigmoid;    /* classifier scores: enum model_scores, or -1 */
    int lowercase;  /* tokenizer: 1/0, or -1 */
    size_t max_tokens; /* tokens per row, specials included; 0 = the folder's */
};

/* One model as the config describes it (plain data, owned by the config):
 * a safetensors file with a layer list, or a Hugging Face BERT folder
 * (path names a directory; no layers) with optional overrides. */
struct model_spec {
    char name[MODEL_NAME_MAX];
    char path[4096];
    struct model_layer_spec *layers;
    size_t n_layers;
    size_t input_width;                 /* 0 = infer from the first shaped layer */
    struct model_encoder_spec enc;      /* folders only */
};

/* Fills e with "the folder says" everywhere. */
void model_encoder_spec_defaults(struct model_encoder_spec *e);
/* "cls", "mean", "max", "none"; parse returns 0, or -1 for another name. */
const char *model_pooling_name(enum model_pooling p);
int model_pooling_parse(const char *s, enum model_pooling *out);

/* ---- the runtime: which backend runs the models ---------------------- */

/* The number format of a GPU backend's weights and activations. fp32 is
 * exact float32 throughout (the CPU path's results to about 1e-5); tf32
 * keeps float32 storage but lets the tensor cores round GEMM inputs to
 * 10 mantissa bits; fp16 and bf16 store weights and activations in 16 bits
 * with float32 accumulation (and float32 statistics in normalizations). */
enum model_precision { MODEL_FP32 = 0, MODEL_TF32, MODEL_FP16, MODEL_BF16, MODEL_N_PRECISIONS };

/* "fp32", "tf32", "fp16", "bf16"; "?" outside the enum. */
const char *model_precision_name(enum model_precision p);
/* Parses a precision name into *out; returns 0, or -1 when it is none. */
int model_precision_parse(const char *s, enum model_precision *out);

/* gpu.precision "auto": the precision the weights of the n models of
 * specs ship in, read from their safetensors headers (a folder's
 * model.safetensors, or the shards model.safetensors.index.json names),
 * each model's dtype being the one of F32, F16 and BF16 holding the most
 * bytes. Every model mainly BF16: MODEL_BF16; every one mainly F16:
 * MODEL_FP16; anything else (a model mainly F32, BF16 models beside F16
 * ones, a layer list over a file, no models, a model whose weights cannot
 * be read) MODEL_FP32. why gets the reason in words ("the models' weights
 * are BF16"). Never fails: loading a model that cannot be read says why
 * later, with its own message. Borrows specs; reads headers only. */
enum model_precision model_weights_precision(const struct model_spec *specs, size_t n,
                                             char *why, size_t why_size);
/* The precision a device of compute capability major.x runs p in: p, or
 * MODEL_FP32 for bf16 that "auto" chose (precision_auto 1) on a device
 * before 8.0 (not fp16: BF16 values may overflow its range); -1 when p,
 * given explicitly, needs 8.0 or newer (tf32, bf16) and the device is
 * older. */
int model_precision_on_device(enum model_precision p, int precision_auto, int major);

#define MODEL_MAX_DEVICES 16

/* How the runtime is chosen and set up (plain data, borrowed). */
struct model_runtime_conf {
    const char *backend;  /* "auto" (CUDA when a device is usable, else the CPU),
                             "cpu" or "cuda" */
    int cpu_threads;      /* OpenBLAS threads per forward pass; 0 = its default */
    enum model_precision cpu_precision; /* MODEL_FP32 or MODEL_BF16 (worker.cpu_precision) */
    /* The CUDA backend's (gpu.* in worker.cfg): */
    enum model_precision precision;
    /* 1 (gpu.precision "auto"): model_runtime_new, opening the CUDA
     * backend, replaces precision with model_weights_precision of specs,
     * and a device without bf16 (compute capability under 8.0) runs BF16
     * weights in fp32 rather than failing. 0: precision as given. */
    int precision_auto;
    const struct model_spec *specs; /* the models the runtime will load */
    size_t n_specs;
    /* Set by model_runtime_new for the backend with precision_auto: why
     * the precision was chosen, for the description. */
    const char *precision_why;
    int graphs;           /* 1: a batch shape seen twice is captured and replayed */
    int devices[MODEL_MAX_DEVICES]; /* device indices to use */
    size_t n_devices;     /* 0 = every usable device */
    int executors_per_device; /* executors when batching.executors is 0 */
    int workspace_mb;     /* cuBLASLt workspace per executor, MiB */
};

/* Backend "auto", one OpenBLAS thread, fp32 (precision_auto 0: a caller
 * without models to read; worker.cfg's "auto" is cfg_model_runtime's),
 * graphs on, every device, two executors per device, a 32 MiB workspace. */
void model_runtime_conf_defaults(struct model_runtime_conf *c);

struct model_runtime;

/* Opens the backend c->backend names. "auto" takes the CUDA backend when
 * it is built in and a device is usable, else the CPU one; "cuda" with
 * no usable device is an error that says why. With c->precision_auto the
 * CUDA backend's precision is first read from c->specs' weights
 * (model_weights_precision), and the description says so ("precision
 * bf16 (auto: the model's weights are BF16)"). Returns a new runtime, or
 * NULL with errstr filled. Borrows c. */
struct model_runtime *model_runtime_new(const struct model_runtime_conf *c, char *errstr,
                                        size_t errstr_size);
/* Frees rt; every model loaded with it must be destroyed first. Accepts
 * NULL. */
void model_runtime_destroy(struct model_runtime *rt);

/* "cpu" or "cuda": the backend that runs the models (static storage). */
const char *model_runtime_backend(const struct model_runtime *rt);
/* One line on what runs the models and why it was chosen, for the
 * startup log ("cpu: OpenBLAS, 1 thread per pass (auto: no CUDA device:
 * ...)"). Borrowed from rt. */
const char *model_runtime_describe(const struct model_runtime *rt);

/* How many executors suit this runtime when batching.executors is 0: one
 * per online CPU on the CPU backend, gpu.executors_per_device per device on
 * CUDA (each on its own stream, so copies and compute of different batches
 * overlap). */
size_t model_runtime_executors(const struct model_runtime *rt);

/* What runs the models, for kinfer_backend_info: the precision ("fp32" on
 * the CPU) and the number of devices (0 on the CPU). */
const char *model_runtime_precision(const struct model_runtime *rt);
size_t model_runtime_devices(const struct model_runtime *rt);

/* One device's counters since the runtime opened (any thread). */
struct model_device_stats {
    char name[96];        /* "NVIDIA H100 80GB HBM3" */
    int index;            /* the CUDA device index */
    double busy_s;        /* time the device ran kinfer's work (CUDA events) */
    uint64_t batches;     /* forward passes run on it */
    uint64_t mem_used;    /* bytes in use on the device (all processes) */
    uint64_t mem_total;
    double mem_gbs;       /* peak memory bandwidth, GB/s (2 x memory clock x bus
                           * width, as the device reports them); 0 unknown */
};

/* Fills *out for the runtime's device dev (0..devices-1). Returns 0, or
 * -1 when there is no such device (always, on the CPU). */
int model_runtime_device_stats(const struct model_runtime *rt, size_t dev,
                               struct model_device_stats *out);

/* Which device runs the models, in words, into buf: "cpu", or the CUDA
 * devices' names ("NVIDIA H100 80GB HBM3"; the emulated device's name
 * begins "emulated"), several joined by ", ". For the startup log,
 * /readyz, the heartbeat and kinfer_backend_info. */
void model_runtime_device_name(const struct model_runtime *rt, char *buf, size_t n);

/* What this build knows of CUDA, for `kinfer --version` and the build
 * info metric: whether the CUDA backend is compiled in, and a line saying
 * so and how many devices are usable now ("cuda: built in; 0 usable
 * devices (no CUDA driver)"). Any thread. */
int model_cuda_built(void);
void model_cuda_describe(char *buf, size_t n);

/* ---- models ---------------------------------------------------------- */

struct model;
struct model_ws;

/* The forward pass's outcome. */
enum model_rc {
    MODEL_OK = 0,
    MODEL_EINVAL = -1, /* bad arguments (rows 0 or over the workspace, a
                          workspace of another model): nothing ran */
    MODEL_EFATAL = -2, /* the device failed in a way that poisons the process
                          (a sticky CUDA error): stop, never serve again */
};

/* Loads the safetensors file named by spec->path, validates every tensor
 * the layers name (dtype F32/F16/BF16, shapes chained layer to layer, as
 * the op table says) and hands the weights to rt's backend, which keeps
 * its own copy. Returns a new model or NULL with errstr filled ("model
 * demo: layer 2 (dense): tensor 1.weight has shape [16,32], expected
 * [*,64]"; layers are numbered from 0). Rules: at least one layer; dense
 * needs a weight, its bias is optional; layernorm's weight and bias are
 * each optional (absent = ones / zeros, as PyTorch's
 * elementwise_affine=False / bias=False) and its eps passes
 * model_eps_check; the other ops must name no tensor. The file is closed
 * before this returns. Borrows rt (which must outlive the model) and
 * spec; copies what it keeps. */
struct model *model_load(struct model_runtime *rt, const struct model_spec *spec,
                         char *errstr, size_t errstr_size);
void model_destroy(struct model *m);

const char *model_name(const struct model *m);
/* Layer models: floats per input and output row. Encoders: 0 and the
 * output width per row (hidden size, or the number of labels). */
size_t model_input_width(const struct model *m);
size_t model_output_width(const struct model *m);
size_t model_param_count(const struct model *m);

/* ---- text encoders -------------------------------------------------- */

struct tokenizer;

/* What the worker needs to know of an encoder (borrowed from the model). */
struct model_encoder_info {
    const struct tokenizer *tokenizer;
    size_t hidden, layers, heads, intermediate;
    size_t max_tokens;          /* per row, [CLS]/[SEP] included */
    size_t type_vocab;          /* segment ids 0..type_vocab-1 (2: pairs work) */
    size_t vocab;               /* token ids 0..vocab-1 */
    enum model_pooling pooling;
    int normalize;
    enum model_head head;
    int sigmoid;                /* classifier: enum model_scores */
    size_t n_labels;
    const char *const *labels;  /* n_labels names (id2label, else "LABEL_i") */
    int padded;                 /* 1: the backend pads every sequence of a batch to
                                   its longest (cost rows x longest); 0: it packs
                                   them (cost = the tokens) */
};

/* The encoder's description, or NULL for a layer model. */
const struct model_encoder_info *model_encoder(const struct model *m);

/* The architecture that runs m ("mlp", "bert", ...; static storage). */
const char *model_arch_name(const struct model *m);

/* 1 when model_encode's output is every token's vector (pooling none):
 * (total tokens) x output_width floats rather than one row per sequence. */
int model_per_token(const struct model *m);

/* A batch of token sequences, packed: sequence i is ids[offsets[i] ..
 * offsets[i+1]), each with its [CLS] ... [SEP]; type_ids alike (may be
 * NULL: all 0). Nothing is padded; each sequence attends to itself only.
 * Borrowed for the call. */
struct model_seqs {
    const int32_t *ids;
    const int32_t *type_ids;
    const uint32_t *offsets;    /* n + 1 entries, offsets[0] = 0 */
    size_t n;
};

/* A workspace for up to max_rows sequences of max_tokens tokens in all
 * (an encoder's; model_ws_new sizes a layer model's). */
struct model_ws *model_ws_new_tokens(const struct model *m, unsigned slot, size_t max_rows,
                                     size_t max_tokens, char *errstr, size_t errstr_size);

/* Runs the sequences through the encoder. On MODEL_OK *out points, in ws,
 * at n x output_width floats (pooled embeddings, or classifier scores), or
 * for MODEL_POOL_NONE at (total tokens) x hidden floats in the packed
 * order. MODEL_EINVAL for more rows or tokens than the workspace holds, a
 * token id or type id out of range, an empty or too long sequence, or a
 * layer model; MODEL_EFATAL as model_forward. */
int model_encode(const struct model *m, struct model_ws *ws, const struct model_seqs *s,
                 const float **out);

/* A classifier's best label for each row of the last model_encode on ws
 * (the argmax of its scores; borrowed from the model), or NULL for a
 * model without labels. */
const char *const *model_ws_labels(const struct model_ws *ws);

/* Workspace for up to max_rows rows through m: every buffer the forward
 * pass needs, allocated once here so model_forward allocates nothing.
 * slot is the executor's number: a backend with several devices spreads
 * the slots over them. Returns NULL with errstr filled on allocation
 * failure or if max_rows is 0 or > INT_MAX. */
struct model_ws *model_ws_new(const struct model *m, unsigned slot, size_t max_rows,
                              char *errstr, size_t errstr_size);
void model_ws_destroy(struct model_ws *ws);

/* The workspace's input buffer: max_rows x input_width floats where a
 * caller may pack a batch, so model_forward reads it without a copy (on
 * a GPU it is pinned host memory, copied to the device in one transfer).
 * Owned by ws. */
float *model_ws_input(struct model_ws *ws);

/* Runs rows x input_width floats (row-major, contiguous) through the
 * model. On success returns MODEL_OK and points *out at rows x
 * output_width floats inside ws (valid until the next call with ws).
 * Returns MODEL_EINVAL if rows exceeds the workspace or is 0, or ws was
 * made for another model; MODEL_EFATAL when the backend failed for good
 * (model_ws_error says how). Allocates nothing; never writes in, which
 * may be model_ws_input(ws) or any other buffer. */
int model_forward(const struct model *m, struct model_ws *ws, const float *in,
                  size_t rows, const float **out);

/* The last failure model_forward reported on ws, "" if none. */
const char *model_ws_error(const struct model_ws *ws);

/* Fault injection for the fault tests (debug.device_fault_id): the next
 * model_forward on ws fails as a dead device would. On a GPU it launches
 * a kernel that writes to an illegal address, a sticky error that poisons
 * the process's CUDA context; on the CPU it answers MODEL_EFATAL. */
void model_ws_inject_fault(struct model_ws *ws);

/* FLOPs of one row through m (2 x in x out per dense layer; the others
 * are counted as free), for benchmarks. */
double model_flops_per_row(const struct model *m);

/* For benchmarks of the CPU backend: while profiling is on, every
 * matrix product of every pass (cblas_sgemm, cpu_mm and the AMX tiles;
 * projections and attention alike) is timed,
 * and model_cpu_gemm_seconds is their total so far, summed over threads.
 * Off by default; turn it on or off before passes start. */
void model_cpu_gemm_profile(int on);
double model_cpu_gemm_seconds(void);

/* The machine's measured cblas_sgemm rate in GFLOP/s: the best of
 * repeated n x n x n products for about `seconds`, with OpenBLAS's
 * current threads (what the last runtime opened set). The yardstick a
 * forward pass's GFLOP/s is compared with. */
double model_cpu_sgemm_peak(size_t n, double seconds);

/* The same yardstick for worker.cpu_precision "bf16": the best rate of
 * n x n x n products on the AMX tiles (cpu_amx.h) with the threads the
 * last runtime opened, GFLOP/s; 0 where the CPU has no tiles. */
double model_cpu_amx_peak(size_t n, double seconds);

/* Writes a demo 2-layer MLP to path as a safetensors file (F32): tensors
 * "0.weight" [hidden,in], "0.bias" [hidden], "2.weight" [out,hidden],
 * "2.bias" [out], drawn like PyTorch's nn.Linear init (uniform in
 * +-1/sqrt(fan_in)) from a generator seeded with seed, so the same seed
 * gives the same file. The matching layer list is dense(0.weight, 0.bias),
 * relu, dense(2.weight, 2.bias). Returns 0, or -1 with errstr filled. */
int model_write_demo(const char *path, size_t in, size_t hidden, size_t out,
                     uint64_t seed, char *errstr, size_t errstr_size);

/* Writes a small random BERT folder to dir (created if missing): a
 * vocabulary of a few hundred English word pieces (uncased), config.json,
 * model.safetensors (F32, drawn from seed: the same seed gives the same
 * folder), tokenizer_config.json; for an embedder (n_labels 0) the
 * sentence-transformers files that make it mean-pooled and normalized
 * (modules.json, 1_Pooling/config.json, 2_Normalize/); with n_labels > 0
 * a BertForSequenceClassification with labels label_0... instead.
 * Returns 0, or -1 with errstr filled. */
int model_write_demo_bert(const char *dir, size_t layers, size_t hidden, size_t heads,
                          size_t intermediate, size_t n_labels, uint64_t seed, char *errstr,
                          size_t errstr_size);

/* The same for the encoder family kind ("bert", "roberta", "xlm-roberta",
 * "mpnet", "distilbert": model_demo_encoder_kinds lists them), with the family's
 * config.json keys, architectures and tensor names (a classifier's
 * encoder tensors under its prefix, "roberta." ..., as Hugging Face saves
 * them; BERT's bare). RoBERTa's tokenizer is byte-level BPE, as the real
 * ones are (tokenizer.json: the 256 byte characters and the demo words
 * with their merges, RobertaProcessing), XLM-R's SentencePiece Unigram
 * (tokenizer.json: the demo words scored above their letters, NFKC,
 * Metaspace, RobertaProcessing); the others' is WordPiece (vocab.txt). RoBERTa's and MPNet's put <s> <pad> </s> <unk> <mask>
 * first (the padding id 1 their positions count from) and name them in
 * tokenizer_config.json. */
int model_write_demo_encoder(const char *dir, const char *kind, size_t layers, size_t hidden,
                             size_t heads, size_t intermediate, size_t n_labels, uint64_t seed,
                             char *errstr, size_t errstr_size);
const char *model_demo_encoder_kinds(void);

#endif

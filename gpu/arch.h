/* arch.h - what an architecture file gives the runtime, and the helpers
 * the runtime gives it. An architecture (gpu/arch_mlp.c, gpu/arch_bert.c,
 * ...) is written once against the backend's primitives (backend.h): it
 * says which models it takes, reads and checks its tensors by their
 * names, uploads them, sizes its buffers and runs its forward pass. The
 * registry (arch_registry in gpu/arch.c) lists them; gpu/model.c picks one
 * per model and is the only caller. Adding an architecture means adding
 * its file and a registry row.
 *
 * What is not an architecture's: choosing the backend, the tokenizer, the
 * head's configuration (pooling, normalization, labels, activation: see
 * head.h), staging a batch's inputs and fetching its outputs.
 *
 * Threads: load and unload on the main thread; ws_new, ws_free and
 * forward on the executor thread that owns the context. */
#ifndef KINFER_ARCH_H
#define KINFER_ARCH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "head.h"
#include "model.h"
#include "safetensors.h"

/* The backend an architecture runs on (borrowed from the runtime). */
struct arch_rt {
    const struct backend_ops *ops;
    void *be;
};

/* What a load has to work with, and where it reports. */
struct arch_load {
    struct arch_rt rt;
    const struct model_spec *spec;
    const json_t *config;           /* config.json (a folder), else NULL */
    const struct st_file *file;     /* the weights, mapped while load runs */
    /* More files of a sharded checkpoint (model.safetensors.index.json),
     * searched after file; n_shards 0 for one file. */
    const struct st_file *const *shards;
    size_t n_shards;
    const struct head_conf *head;   /* the head the runtime decided (folders) */
    char *errstr;
    size_t errstr_size;
    size_t n_params;                /* arch_tensor counts what it returns */
};

/* What a loaded model is, as the runtime reports it. */
struct arch_info {
    size_t in_w;           /* floats per input row (layer lists), 0 for token models */
    size_t out_w;          /* floats per output row (or per token) */
    double flops_per_row;  /* per input row, or per token */
    /* Token models: */
    size_t vocab, type_vocab, max_pos, hidden, layers, heads, intermediate;
    size_t pos_limit;      /* tokens a sequence may have by the position table */
    size_t n_labels;       /* a classifier's (head_classifier_read) */
};

/* The sizes a workspace must hold: rows of a layer model, or sequences
 * and tokens (max_len the longest sequence) of a token model. */
struct arch_sizes {
    size_t max_rows, max_tokens, max_len;
};

/* A batch on the device: rows x in_w activations (layer models), or
 * packed sequences. */
struct arch_batch {
    size_t rows;
    const void *x;
    const struct bk_seqs *s;
};

struct arch {
    const char *name;                     /* "mlp", "bert" */
    /* config.json's model_type values it takes (NULL-terminated); NULL
     * for the layer-list model, which has no folder. */
    const char *const *model_types;
    /* Reads and checks the model, uploads its weights to every copy,
     * fills *info. Returns the architecture's model, or NULL with
     * ld->errstr filled ("model NAME: ..."). */
    void *(*load)(struct arch_load *ld, struct arch_info *info);
    void (*unload)(const struct arch_rt *rt, void *am);
    /* Buffers for a workspace, allocated in the context c (ctx_alloc):
     * everything forward needs, so forward allocates nothing. */
    void *(*ws_new)(const struct arch_rt *rt, const void *am, void *c,
                    const struct arch_sizes *sz, char *errstr, size_t errstr_size);
    void (*ws_free)(void *aws);
    /* Runs the batch; *out points at device activations: rows x out_w
     * (or tokens x out_w for per-token output). Calls only primitives and
     * depends only on the batch's shape (so a graph can record it).
     * Returns 0 or a negative enum model_rc. */
    int (*forward)(const struct arch_rt *rt, const void *am, void *aws, void *c,
                   const struct arch_batch *b, const void **out);
};

/* The registry: every architecture of this build. */
extern const struct arch *const arch_registry[];
extern const size_t arch_registry_len;

/* The architecture that takes config.json's model_type (NULL if none),
 * and the one for layer lists. */
const struct arch *arch_for_model_type(const char *model_type);
const struct arch *arch_layer_list(void);
/* "bert, mpnet, ..." into buf: the model types this build reads. */
void arch_model_types(char *buf, size_t n);

/* ---- decoders (text generation; gpu/decoder.c is their runtime) -------- */

/* What a loaded decoder is. */
struct arch_dec_info {
    size_t vocab, hidden, layers, heads, kv_heads, head_dim, intermediate;
    size_t context;            /* positions a sequence may take (max_position_embeddings) */
    double flops_per_token;    /* the GEMMs' 2 x multiply-adds per token */
};

/* What a decoder workspace must hold: sequences and new tokens per step,
 * the longest sequence, and whether every new token's logits are wanted
 * (else the last of each sequence's). */
struct arch_dec_sizes {
    size_t max_seqs, max_tokens, max_ctx;
    int all_logits;
};

/* One step on the device: s packs the new tokens (s->seq[t] is the batch
 * row, which is also the row of kv.tables; s->pos[t] the absolute
 * position); kv describes layer 0's cache, layer l's being layer_bytes
 * further in both k and v. */
struct arch_dec_batch {
    const struct bk_seqs *s;
    struct bk_kv kv;
    size_t layer_bytes;
    size_t max_ctx;
    int all_logits;
};

struct arch_decoder {
    const char *name;                     /* "llama" */
    const char *const *model_types;       /* NULL-terminated */
    void *(*load)(struct arch_load *ld, struct arch_dec_info *info);
    void (*unload)(const struct arch_rt *rt, void *am);
    void *(*ws_new)(const struct arch_rt *rt, const void *am, void *c,
                    const struct arch_dec_sizes *sz, char *errstr, size_t errstr_size);
    void (*ws_free)(void *aws);
    /* Stores the new tokens' keys and values in the cache and points *out
     * at their float logits (activations): s->n rows (each sequence's
     * last token), or s->tokens rows with all_logits; vocab wide. */
    int (*step)(const struct arch_rt *rt, const void *am, void *aws, void *c,
                const struct arch_dec_batch *b, const void **out);
};

/* The decoder architecture that takes model_type (NULL if none). */
const struct arch_decoder *arch_decoder_for_model_type(const char *model_type);

/* The runtime's backend, for the decoder runtime (gpu/decoder.c). */
struct arch_rt model_runtime_arch(const struct model_runtime *rt);

/* ---- helpers for architecture files ----------------------------------- */

/* Runs a primitive (or any call returning 0 or a negative enum model_rc)
 * and returns its failure from the calling function. */
#define ARCH_TRY(call)            \
    do {                          \
        int arch_rc_ = (call);    \
        if (arch_rc_ < 0) return arch_rc_; \
    } while (0)

/* "model NAME: " + the message into ld->errstr; returns -1 (or NULL
 * through the macro callers). */
int arch_fail(struct arch_load *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The tensor called name (or, failing that, prefix + name for each of
 * the NULL-terminated prefixes, e.g. "bert."), loadable (F32, F16, BF16)
 * and of shape [d0] (d1 == 0) or [d0,d1]; counted in ld->n_params. NULL
 * with the error set (naming what was expected). */
const struct st_tensor *arch_tensor(struct arch_load *ld, const char *const *prefixes,
                                    const char *name, size_t d0, size_t d1);

/* A positive integer of config.json: def when absent (0: required),
 * at most max. */
int arch_cfg_size(struct arch_load *ld, const char *key, size_t def, size_t max, size_t *out);
/* A number of config.json in (0, 1): def when absent. */
int arch_cfg_eps(struct arch_load *ld, const char *key, double def, float *out);
/* hidden_act (or key) as an activation: gelu, gelu_new/_pytorch_tanh/
 * _fast, relu, silu; def when absent. */
int arch_cfg_act(struct arch_load *ld, const char *key, enum bk_act def, enum bk_act *out);

/* Uploads pieces to copy dev; NULL with the error set. */
struct bk_weight *arch_weight(struct arch_load *ld, size_t dev, enum bk_wtype type,
                              const struct bk_wsrc *src, size_t n);
/* One tensor as a weight (NULL stays NULL without an error). */
struct bk_weight *arch_weight1(struct arch_load *ld, size_t dev, enum bk_wtype type,
                               const struct st_tensor *t);
/* Frees a weight (NULL is fine). */
void arch_weight_free(const struct arch_rt *rt, struct bk_weight *w);

/* Bytes of n activations, and a pointer that far into activations. */
size_t arch_act_bytes(const struct arch_rt *rt, size_t n);
void *arch_act_at(const struct arch_rt *rt, const void *p, size_t n);

/* The architectures (a file each). */
extern const struct arch arch_mlp;
extern const struct arch arch_bert;
extern const struct arch arch_roberta;
extern const struct arch arch_mpnet;
extern const struct arch arch_distilbert;
extern const struct arch arch_nomic;
extern const struct arch_decoder arch_llama;

#endif

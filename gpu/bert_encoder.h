/* bert_encoder.h - what the BERT family of encoders shares, for their
 * architecture files (gpu/arch_bert.c, arch_roberta.c, arch_mpnet.c,
 * arch_distilbert.c) only. They are one model with other names:
 * embeddings (word + absolute position, from a base, + optional token
 * type) and their LayerNorm; post-LayerNorm layers of self-attention (Q,
 * K, V, an output projection; Add & LayerNorm) and a feed-forward (two
 * linear layers with an activation between; Add & LayerNorm), with an
 * optional relative position bias shared by every layer (MPNet); then the
 * runtime's head (head.h), whose classifier may have a dense layer before
 * the labels' (tanh or ReLU).
 *
 * A family's file says what its tensors are called (struct
 * bert_encoder_names), reads its config.json into a struct
 * bert_encoder_conf (computing what the file does not hold, such as
 * MPNet's bias table), and hands both to bert_encoder_load; the other
 * entries of its registry row are this module's.
 *
 * Threads and ownership: as arch.h says; the model bert_encoder_load
 * returns owns every copy of its weights. */
#ifndef KINFER_BERT_ENCODER_H
#define KINFER_BERT_ENCODER_H

#include <stddef.h>

#include "arch.h"

/* What a family calls a layer's tensors: layer i's are under layer, i
 * and a dot ("encoder.layer." gives "encoder.layer.3."); the others are
 * the linear and LayerNorm modules there, each with .weight and .bias. */
struct bert_layer_names {
    const char *layer;
    const char *q, *k, *v, *attn_out, *attn_ln, *ffn_in, *ffn_out, *ffn_ln;
};

/* A family's tensor names (all tried bare, then under each prefix). */
struct bert_encoder_names {
    const char *const *prefixes;        /* {"bert.", NULL} */
    const char *word, *pos, *type;      /* tables' full names; type NULL: none */
    const char *emb_ln;                 /* the embeddings' LayerNorm module */
    struct bert_layer_names layer;
    /* The classifier: the dense layer before the labels' (NULL: none)
     * and its activation, and the labels' layer (modules, with .weight
     * and .bias). */
    const char *cls_pre, *cls_out;
    enum bk_act cls_pre_act;
};

/* Sizes and settings, as the family's config.json gives them. */
struct bert_encoder_conf {
    size_t vocab, hidden, n_layers, heads, inter;
    size_t max_pos;          /* rows of the position table */
    size_t pos_base;         /* position of a sequence's first token */
    size_t type_vocab;       /* rows of the type table (1 when there is none) */
    float eps;               /* every LayerNorm's */
    enum bk_act act;         /* the feed-forward's */
    /* Computed by the family, borrowed for the load (NULL: none): */
    const float *pos_table;  /* [max_pos, hidden] when the file has no table */
    const float *rel_bias;   /* [heads, 2 rel_span - 1] (backend.h's attention) */
    size_t rel_span;
};

/* BertConfig's keys (vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads, intermediate_size, max_position_embeddings (512),
 * type_vocab_size (type_def), layer_norm_eps (1e-12), hidden_act (gelu))
 * into cf, checked; the other fields are left 0. 0, or -1 with the load's
 * error set. */
int bert_encoder_config(struct arch_load *ld, size_t type_def, struct bert_encoder_conf *cf);

/* Reads and checks every tensor by the names nm, then uploads them (and
 * the computed tables of cf) to each of the backend's copies; fills
 * *info. Returns the model, or NULL with the load's error set. Borrows nm
 * and cf. */
void *bert_encoder_load(struct arch_load *ld, const struct bert_encoder_names *nm,
                        const struct bert_encoder_conf *cf, struct arch_info *info);

/* The rest of a registry row (arch.h). */
void bert_encoder_unload(const struct arch_rt *rt, void *am);
void *bert_encoder_ws_new(const struct arch_rt *rt, const void *am, void *c,
                          const struct arch_sizes *sz, char *errstr, size_t errstr_size);
void bert_encoder_ws_free(void *aws);
int bert_encoder_forward(const struct arch_rt *rt, const void *am, void *aws, void *c,
                         const struct arch_batch *b, const void **out);

#endif

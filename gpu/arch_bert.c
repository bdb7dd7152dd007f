/* arch_bert.c - BERT encoders (config.json model_type "bert"), as
 * Hugging Face's BertModel defines them: word + absolute position (from
 * 0) + token type embeddings and their LayerNorm, then post-LayerNorm
 * layers of self-attention and a GELU feed-forward (bert_encoder.c); the
 * runtime's head at the end (pooling, or BertForSequenceClassification's
 * pooler (dense + tanh) and classifier).
 *
 * Tensors by their BertModel names, with or without the "bert." prefix
 * (LayerNorm's old gamma/beta names too).
 *
 * Threads and ownership: as arch.h says. */
#include "arch.h"
#include "bert_encoder.h"

static const char *const bert_prefixes[] = {"bert.", NULL};

static const struct bert_encoder_names bert_names = {
    .prefixes = bert_prefixes,
    .word = "embeddings.word_embeddings.weight",
    .pos = "embeddings.position_embeddings.weight",
    .type = "embeddings.token_type_embeddings.weight",
    .emb_ln = "embeddings.LayerNorm",
    .layer = {"encoder.layer.", "attention.self.query", "attention.self.key",
              "attention.self.value", "attention.output.dense", "attention.output.LayerNorm",
              "intermediate.dense", "output.dense", "output.LayerNorm"},
    .cls_pre = "pooler.dense",
    .cls_out = "classifier",
    .cls_pre_act = BK_ACT_TANH,
};

static void *bert_load(struct arch_load *ld, struct arch_info *info)
{
    struct bert_encoder_conf cf;
    if (bert_encoder_config(ld, 2, &cf) < 0) return NULL;
    return bert_encoder_load(ld, &bert_names, &cf, info);
}

static const char *const bert_types[] = {"bert", NULL};

const struct arch arch_bert = {
    .name = "bert",
    .model_types = bert_types,
    .load = bert_load,
    .unload = bert_encoder_unload,
    .ws_new = bert_encoder_ws_new,
    .ws_free = bert_encoder_ws_free,
    .forward = bert_encoder_forward,
};

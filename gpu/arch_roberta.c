/* arch_roberta.c - RoBERTa encoders and the models built on it
 * (config.json model_type "roberta", "xlm-roberta", "camembert"), as
 * Hugging Face's RobertaModel defines them: BERT's embeddings, layers and
 * tensor names (bert_encoder.c), with positions that start after the
 * padding id (a sequence's first token at pad_token_id + 1, as
 * create_position_ids_from_input_ids numbers an unpadded sequence), so
 * max_position_embeddings (514) allows two tokens fewer (512); then the
 * runtime's head, whose classifier is RobertaClassificationHead's:
 * classifier.dense and tanh on the first token, then classifier.out_proj.
 *
 * Tensors by their RobertaModel names, bare (sentence-transformers) or
 * under "roberta." (the *ForSequenceClassification models; XLM-R and
 * CamemBERT use the same prefix).
 *
 * Not modelled: a token equal to the padding id inside a sequence, which
 * Hugging Face gives the padding position and does not count (tokenizers
 * never produce one).
 *
 * Threads and ownership: as arch.h says. */
#include "arch.h"
#include "bert_encoder.h"

static const char *const roberta_prefixes[] = {"roberta.", NULL};

static const struct bert_encoder_names roberta_names = {
    .prefixes = roberta_prefixes,
    .word = "embeddings.word_embeddings.weight",
    .pos = "embeddings.position_embeddings.weight",
    .type = "embeddings.token_type_embeddings.weight",
    .emb_ln = "embeddings.LayerNorm",
    .layer = {"encoder.layer.", "attention.self.query", "attention.self.key",
              "attention.self.value", "attention.output.dense", "attention.output.LayerNorm",
              "intermediate.dense", "output.dense", "output.LayerNorm"},
    .cls_pre = "classifier.dense",
    .cls_out = "classifier.out_proj",
    .cls_pre_act = BK_ACT_TANH,
};

static void *roberta_load(struct arch_load *ld, struct arch_info *info)
{
    struct bert_encoder_conf cf;
    if (bert_encoder_config(ld, 1, &cf) < 0) return NULL;
    const json_t *pad = json_object_get(ld->config, "pad_token_id");
    if (pad && (!json_is_integer(pad) || json_integer_value(pad) < 0 ||
                json_integer_value(pad) >= 1 << 16)) {
        arch_fail(ld, "config.json: pad_token_id must be an integer in 0..65535");
        return NULL;
    }
    cf.pos_base = (pad ? (size_t)json_integer_value(pad) : 1) + 1;
    return bert_encoder_load(ld, &roberta_names, &cf, info);
}

static const char *const roberta_types[] = {"roberta", "xlm-roberta", "camembert", NULL};

const struct arch arch_roberta = {
    .name = "roberta",
    .model_types = roberta_types,
    .load = roberta_load,
    .unload = bert_encoder_unload,
    .ws_new = bert_encoder_ws_new,
    .ws_free = bert_encoder_ws_free,
    .forward = bert_encoder_forward,
};

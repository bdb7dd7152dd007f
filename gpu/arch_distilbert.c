/* arch_distilbert.c - DistilBERT encoders (config.json model_type
 * "distilbert"), as Hugging Face's DistilBertModel defines them: word +
 * absolute position embeddings (no token types; positions from 0) and
 * their LayerNorm, then BERT's post-LayerNorm layers (bert_encoder.c)
 * under DistilBERT's names (q_lin, k_lin, v_lin, out_lin, sa_layer_norm,
 * ffn.lin1, ffn.lin2, output_layer_norm) with activation gelu or relu;
 * then the runtime's head, whose classifier is
 * DistilBertForSequenceClassification's: pre_classifier and ReLU on the
 * first token, then classifier.
 *
 * Its config.json has keys of its own (dim, n_layers, n_heads,
 * hidden_dim, activation); every LayerNorm's eps is 1e-12. With
 * sinusoidal_pos_embds the position table is the file's when it has one
 * (Hugging Face saves it), else computed as create_sinusoidal_embeddings
 * does.
 *
 * Tensors by their DistilBertModel names, bare or under "distilbert.".
 *
 * Threads and ownership: as arch.h says. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "arch.h"
#include "bert_encoder.h"

static const char *const distilbert_prefixes[] = {"distilbert.", NULL};

static const struct bert_encoder_names distilbert_names = {
    .prefixes = distilbert_prefixes,
    .word = "embeddings.word_embeddings.weight",
    .pos = "embeddings.position_embeddings.weight",
    .type = NULL,
    .emb_ln = "embeddings.LayerNorm",
    .layer = {"transformer.layer.", "attention.q_lin", "attention.k_lin", "attention.v_lin",
              "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2",
              "output_layer_norm"},
    .cls_pre = "pre_classifier",
    .cls_out = "classifier",
    .cls_pre_act = BK_ACT_RELU,
};

/* DistilBertConfig's keys; eps is fixed. */
static int distilbert_config(struct arch_load *ld, struct bert_encoder_conf *cf)
{
    if (arch_cfg_size(ld, "vocab_size", 0, 1 << 24, &cf->vocab) < 0 ||
        arch_cfg_size(ld, "dim", 0, 1 << 16, &cf->hidden) < 0 ||
        arch_cfg_size(ld, "n_layers", 0, 256, &cf->n_layers) < 0 ||
        arch_cfg_size(ld, "n_heads", 0, 1024, &cf->heads) < 0 ||
        arch_cfg_size(ld, "hidden_dim", 0, 1 << 18, &cf->inter) < 0 ||
        arch_cfg_size(ld, "max_position_embeddings", 512, 1 << 16, &cf->max_pos) < 0)
        return -1;
    if (cf->hidden % cf->heads)
        return arch_fail(ld, "config.json: dim %zu is not a multiple of n_heads %zu",
                         cf->hidden, cf->heads);
    if (arch_cfg_act(ld, "activation", BK_ACT_GELU, &cf->act) < 0) return -1;
    if (cf->act != BK_ACT_GELU && cf->act != BK_ACT_RELU)
        return arch_fail(ld, "config.json: activation \"%s\" is not supported (gelu, relu)",
                         json_string_value(json_object_get(ld->config, "activation")));
    cf->eps = 1e-12f;
    cf->type_vocab = 1;
    return 0;
}

/* The file's position table, under any of the names arch_tensor tries. */
static int distilbert_has_pos(const struct arch_load *ld)
{
    char n[160];
    if (st_find(ld->file, distilbert_names.pos)) return 1;
    for (const char *const *p = distilbert_prefixes; *p; p++) {
        snprintf(n, sizeof(n), "%s%s", *p, distilbert_names.pos);
        if (st_find(ld->file, n)) return 1;
    }
    return 0;
}

static void *distilbert_load(struct arch_load *ld, struct arch_info *info)
{
    struct bert_encoder_conf cf = {0};
    if (distilbert_config(ld, &cf) < 0) return NULL;
    float *tab = NULL;
    if (json_is_true(json_object_get(ld->config, "sinusoidal_pos_embds")) &&
        !distilbert_has_pos(ld)) {
        size_t H = cf.hidden;
        if (!(tab = malloc(cf.max_pos * H * sizeof(float)))) {
            arch_fail(ld, "out of memory");
            return NULL;
        }
        /* sin at even columns, cos at odd, of pos / 10000^(2 (j/2) / H) */
        for (size_t p = 0; p < cf.max_pos; p++)
            for (size_t j = 0; j < H; j++) {
                double a = (double)p / pow(10000.0, 2.0 * (double)(j / 2) / (double)H);
                tab[p * H + j] = (float)(j % 2 ? cos(a) : sin(a));
            }
        cf.pos_table = tab;
    }
    void *m = bert_encoder_load(ld, &distilbert_names, &cf, info);
    free(tab);
    return m;
}

static const char *const distilbert_types[] = {"distilbert", NULL};

const struct arch arch_distilbert = {
    .name = "distilbert",
    .model_types = distilbert_types,
    .load = distilbert_load,
    .unload = bert_encoder_unload,
    .ws_new = bert_encoder_ws_new,
    .ws_free = bert_encoder_ws_free,
    .forward = bert_encoder_forward,
};

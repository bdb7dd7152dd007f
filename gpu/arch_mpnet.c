/* arch_mpnet.c - MPNet encoders (config.json model_type "mpnet"), as
 * Hugging Face's MPNetModel defines them: word + absolute position
 * embeddings (no token types; positions from padding_idx + 1 = 2, the
 * padding id being fixed at 1 in MPNetEmbeddings) and their LayerNorm,
 * then BERT's post-LayerNorm layers (bert_encoder.c) under MPNet's names,
 * with a relative position bias shared by every layer added to the
 * attention scores; then the runtime's head, whose classifier is
 * MPNetClassificationHead's: classifier.dense and tanh on the first
 * token, then classifier.out_proj.
 *
 * The bias: encoder.relative_attention_bias.weight [32, heads] is looked
 * up by T5's bidirectional bucket of the distance j - i (key minus query)
 * with 32 buckets and max_distance 128, as MPNetEncoder's
 * relative_position_bucket computes it; here it is expanded once at load
 * into the attention primitive's table [heads, 2 span - 1] over every
 * distance a sequence can have (span: the longest sequence).
 *
 * Tensors by their MPNetModel names, bare or under "mpnet.".
 *
 * Threads and ownership: as arch.h says. */
#include <math.h>
#include <stdlib.h>

#include "arch.h"
#include "bert_encoder.h"

static const char *const mpnet_prefixes[] = {"mpnet.", NULL};

static const struct bert_encoder_names mpnet_names = {
    .prefixes = mpnet_prefixes,
    .word = "embeddings.word_embeddings.weight",
    .pos = "embeddings.position_embeddings.weight",
    .type = NULL,
    .emb_ln = "embeddings.LayerNorm",
    .layer = {"encoder.layer.", "attention.attn.q", "attention.attn.k", "attention.attn.v",
              "attention.attn.o", "attention.LayerNorm", "intermediate.dense", "output.dense",
              "output.LayerNorm"},
    .cls_pre = "classifier.dense",
    .cls_out = "classifier.out_proj",
    .cls_pre_act = BK_ACT_TANH,
};

/* MPNetModel's PyTorch code buckets with these, whatever config.json's
 * relative_attention_num_buckets says. */
#define MPNET_BUCKETS 32
#define MPNET_MAX_DISTANCE 128

/* The bucket of relative position rel = key - query: half the buckets
 * for keys before the query (rel < 0), half for after; within a half,
 * exact distances below 8, then logarithmic up to 128, then the last. */
static size_t mpnet_bucket(long rel)
{
    size_t half = MPNET_BUCKETS / 2, exact = half / 2, ret = 0;
    long n = -rel;
    if (n < 0) ret += half;
    unsigned long a = (unsigned long)labs(n);
    if (a < exact) return ret + a;
    size_t v = exact + (size_t)(log((double)a / (double)exact) /
                                log((double)MPNET_MAX_DISTANCE / (double)exact) *
                                (double)(half - exact));
    return ret + (v < half - 1 ? v : half - 1);
}

static void *mpnet_load(struct arch_load *ld, struct arch_info *info)
{
    struct bert_encoder_conf cf;
    size_t nb;
    float *rel = NULL, *tab = NULL;
    void *m = NULL;
    if (bert_encoder_config(ld, 1, &cf) < 0 ||
        arch_cfg_size(ld, "relative_attention_num_buckets", MPNET_BUCKETS, 1 << 16, &nb) < 0)
        return NULL;
    if (nb != MPNET_BUCKETS) {
        arch_fail(ld, "config.json: relative_attention_num_buckets %zu: MPNetModel buckets "
                  "with %d", nb, MPNET_BUCKETS);
        return NULL;
    }
    cf.pos_base = 2;
    if (cf.max_pos <= cf.pos_base) {
        arch_fail(ld, "config.json: max_position_embeddings %zu leaves no position after the "
                  "first %zu", cf.max_pos, cf.pos_base);
        return NULL;
    }
    const struct st_tensor *t = arch_tensor(ld, mpnet_prefixes,
                                            "encoder.relative_attention_bias.weight", nb,
                                            cf.heads);
    if (!t) return NULL;
    size_t span = cf.max_pos - cf.pos_base, bw = 2 * span - 1;
    if (!(rel = malloc(nb * cf.heads * sizeof(float))) ||
        !(tab = malloc(cf.heads * bw * sizeof(float)))) {
        arch_fail(ld, "out of memory");
        goto done;
    }
    if (st_to_f32(t, rel) != 0) {
        arch_fail(ld, "tensor %s could not be read", t->name);
        goto done;
    }
    for (size_t h = 0; h < cf.heads; h++)
        for (size_t c = 0; c < bw; c++)
            tab[h * bw + c] = rel[mpnet_bucket((long)c - (long)(span - 1)) * cf.heads + h];
    cf.rel_bias = tab;
    cf.rel_span = span;
    m = bert_encoder_load(ld, &mpnet_names, &cf, info);
done:
    free(rel);
    free(tab);
    return m;
}

static const char *const mpnet_types[] = {"mpnet", NULL};

const struct arch arch_mpnet = {
    .name = "mpnet",
    .model_types = mpnet_types,
    .load = mpnet_load,
    .unload = bert_encoder_unload,
    .ws_new = bert_encoder_ws_new,
    .ws_free = bert_encoder_ws_free,
    .forward = bert_encoder_forward,
};

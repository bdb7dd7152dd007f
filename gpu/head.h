/* head.h - the runtime's heads: what turns an encoder's hidden states into
 * a job's rows. An embedding head pools each sequence's tokens (first,
 * mean, max, last; or keeps every token) and may L2-normalize them; a
 * classifier head reads the first token through an optional dense layer
 * with its activation (tanh for BERT's pooler and RoBERTa's head, ReLU
 * for DistilBERT's), then the labels' layer, then softmax, sigmoid or
 * nothing. Which head, pooling and activation a model has is read here
 * from its folder (config.json's architectures, problem_type, label
 * count and sentence-transformers' cross-encoder activation; its
 * modules.json) with the model entry's overrides; an architecture only
 * says where its classifier's tensors are (head_classifier_read) and calls
 * head_run at the end of its forward pass.
 *
 * Threads: reading and uploading on the main thread at load; head_ws_new
 * and head_run on the executor thread that owns the context. */
#ifndef KINFER_HEAD_H
#define KINFER_HEAD_H

#include <jansson.h>
#include <stddef.h>

#include "backend.h"
#include "model.h"

struct arch_load;
struct arch_rt;

/* A model's head as its folder and entry decide it (plain data). */
struct head_conf {
    enum model_head head;
    enum model_pooling pooling;   /* embeddings; a classifier reads the first token */
    int normalize;
    int sigmoid;                  /* classifier: enum model_scores (softmax, sigmoid for
                                     multi-label or one label, none: the logits) */
};

/* Reads the head of the folder dir with config.json cfg: a
 * *ForSequenceClassification architecture is a classifier; modules.json's
 * Pooling and Normalize set an embedder's pooling (cls when absent) and
 * normalization; then spec->enc's overrides. 0, or -1 with why filled
 * (without the model's name). */
int head_conf_read(const char *dir, const json_t *cfg, const struct model_encoder_spec *o,
                   struct head_conf *h, char *why, size_t why_size);

/* A classifier's tensors, as the file has them. */
struct head_tensors {
    const struct st_tensor *pre_w, *pre_b; /* [H,H], [H], or NULL: no dense before */
    enum bk_act pre_act;                   /* after it: head_classifier_read sets tanh,
                                              the architecture may change it */
    const struct st_tensor *out_w, *out_b; /* [labels,H], [labels] */
    size_t n_labels;
};

/* Finds the classifier's tensors by the architecture's names (pre_w NULL:
 * none before the labels' layer) and checks their shapes; t->pre_act is
 * tanh (BERT's pooler) until the caller says otherwise. 0, or -1 with
 * the load's error set. */
int head_classifier_read(struct arch_load *ld, const char *const *prefixes, const char *pre_w,
                         const char *pre_b, const char *out_w, const char *out_b, size_t hidden,
                         struct head_tensors *t);

/* A classifier on one device. */
struct head_weights {
    struct bk_weight *pre_w, *pre_b, *out_w, *out_b;
    enum bk_act pre_act;
};
int head_upload(struct arch_load *ld, size_t dev, const struct head_tensors *t,
                struct head_weights *w);
void head_free(const struct arch_rt *rt, struct head_weights *w);

/* The head's output width: the labels for a classifier, else hidden. */
size_t head_out_w(const struct head_conf *h, size_t hidden, size_t n_labels);

/* A head's buffers for up to max_rows sequences. */
struct head_ws {
    void *pooled, *tmp, *logits;
};
int head_ws_new(const struct arch_rt *rt, void *c, const struct head_conf *h, size_t max_rows,
                size_t hidden, size_t n_labels, struct head_ws *ws);

/* Runs the head over x [tokens, hidden] (written in place for per-token
 * normalized output); *out gets the rows (or tokens) of output. */
int head_run(const struct arch_rt *rt, void *c, const struct head_conf *h,
             const struct head_weights *w, size_t n_labels, struct head_ws *ws, void *x,
             const struct bk_seqs *s, size_t hidden, const void **out);

/* config.json's id2label for n labels (LABEL_i where it has none): a new
 * array of n new strings, or NULL with why filled. */
char **head_labels_read(const json_t *cfg, size_t n, char *why, size_t why_size);

#endif

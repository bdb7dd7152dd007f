/* bert.h - reads a Hugging Face BERT folder as save_pretrained and
 * sentence-transformers write it (config.json, model.safetensors, the
 * tokenizer, modules.json with 1_Pooling/ and 2_Normalize/) into a
 * validated struct backend_bert, the tokenizer and the labels. Internal to
 * gpu/: model.c calls it for a model whose path is a directory.
 *
 * Threads: the main thread at start-up. Ownership: a bert_folder owns
 * what it opened; the tensors its plan points at live in the safetensors
 * file, mapped until bert_folder_fini (model.c hands the plan to the
 * backend, which copies the weights, first). */
#ifndef KINFER_BERT_H
#define KINFER_BERT_H

#include <stddef.h>

#include "backend.h"
#include "model.h"
#include "safetensors.h"

struct tokenizer;

struct bert_folder {
    struct st_file *file;           /* model.safetensors */
    struct backend_bert plan;       /* tensors point into file */
    struct backend_bert_layer *layers;
    struct tokenizer *tok;
    char **labels;                  /* plan.n_labels names */
    size_t max_tokens;              /* per row, specials included */
    size_t n_params;
};

/* Reads and checks the folder spec->path names, applying spec->enc's
 * overrides. Every problem is an error naming the model and the file
 * ("model minilm: config.json: hidden_size 384 is not a multiple of
 * num_attention_heads 5", "model minilm: tensor
 * encoder.layer.2.attention.self.query.weight has shape [384,385],
 * expected [384,384]"). Returns 0 with *bf filled, or -1 with errstr
 * (nothing left open). Borrows spec. */
int bert_folder_read(const struct model_spec *spec, struct bert_folder *bf, char *errstr,
                     size_t errstr_size);

/* Unmaps the file (the plan's tensors then dangle). */
void bert_folder_close_file(struct bert_folder *bf);

/* Frees what bf still owns: the file if open, the layer table, and the
 * tokenizer and labels unless taken (set to NULL) by the caller. */
void bert_folder_fini(struct bert_folder *bf);

#endif

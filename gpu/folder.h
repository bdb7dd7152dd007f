/* folder.h - what the runtime reads of a Hugging Face model folder before
 * an architecture reads its tensors: config.json, the tokenizer, the head
 * (head.h), the sequence-length limits the folder states, and the mapped
 * model.safetensors. Internal to gpu/: model.c is the only caller.
 *
 *   config.json                the architecture (model_type) and its sizes
 *   tokenizer.json             the tokenizer, else vocab.txt with
 *   tokenizer_config.json      its settings and model_max_length
 *   modules.json, 1_Pooling/   sentence-transformers' pooling, Normalize
 *   sentence_bert_config.json  max_seq_length
 *   model.safetensors          the weights
 *
 * Threads: the main thread at start-up. Ownership: a folder owns what it
 * opened until folder_close; the caller may take the tokenizer (set the
 * field to NULL). */
#ifndef KINFER_FOLDER_H
#define KINFER_FOLDER_H

#include <jansson.h>
#include <stddef.h>

#include "head.h"
#include "model.h"
#include "safetensors.h"

struct tokenizer;

struct folder {
    json_t *config;
    const char *model_type;     /* config.json's, "" when it has none */
    struct tokenizer *tok;
    size_t tok_vocab;           /* tokens the tokenizer can produce */
    size_t tok_max;             /* tokenizer's model_max_length (0: none) */
    size_t st_max;              /* sentence-transformers' max_seq_length (0: none) */
    struct head_conf head;
    struct st_file *file;       /* model.safetensors */
};

/* Reads spec->path's folder. Every problem is an error naming the model
 * and the file ("model minilm: config.json:3: ..."). 0 with *f filled, or
 * -1 with errstr (nothing left open). Borrows spec. */
int folder_open(const struct model_spec *spec, struct folder *f, char *errstr,
                size_t errstr_size);

/* Closes and frees what f still owns. */
void folder_close(struct folder *f);

#endif

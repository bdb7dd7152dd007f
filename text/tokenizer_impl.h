/* tokenizer_impl.h - the table a tokenizer implementation fills (as
 * nginx's event modules fill ngx_event_actions_t), and the helpers
 * tokenizer.c lends them. Only tokenizer.c and the implementation files
 * include it; callers use tokenizer.h.
 *
 * A new implementation (byte-level BPE, Unigram) is a file that defines
 * one const struct tokenizer_impl and a row in tokenizer.c's registry;
 * nothing else changes.
 *
 * Threads and ownership: as tokenizer.h says; each entry below states
 * what its pointers are. */
#ifndef KINFER_TOKENIZER_IMPL_H
#define KINFER_TOKENIZER_IMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Files over this are refused before they are read. */
#define TOKENIZER_MAX_FILE_BYTES ((size_t)64 << 20)

/* What tokenizer.c hands an implementation's load. */
struct tokenizer_src {
    const char *dir;              /* the folder */
    const json_t *json;           /* tokenizer.json, parsed (borrowed); NULL: the folder has none */
    const char *json_path;        /* its path, for messages; NULL without json */
    const struct tokenizer_opts *opts;
};

struct tokenizer_impl {
    /* tokenizer.json's model.type this implementation reads ("WordPiece"). */
    const char *name;
    /* A file that, in a folder without tokenizer.json, makes the folder
     * this implementation's ("vocab.txt"); NULL: none. */
    const char *plain_file;
    /* Reads the folder into a new model (freed with destroy), setting
     * *max_tokens to the folder's model_max_length (0: none); NULL with
     * errstr filled. */
    void *(*load)(const struct tokenizer_src *src, size_t *max_tokens, char *errstr,
                  size_t errstr_size);
    void (*destroy)(void *model);
    /* A work area of this implementation (new, freed with
     * scratch_destroy, which accepts NULL), or NULL when out of memory. */
    void *(*scratch_new)(size_t expect_len);
    void (*scratch_destroy)(void *scratch);
    /* Bytes the work area holds now (tokenizer_scratch_bytes). */
    size_t (*scratch_bytes)(const void *scratch);
    /* tokenizer.h's tokenizer_encode, with the implementation's scratch;
     * answers enum tokenizer_err codes. */
    int (*encode)(const void *model, void *scratch, const char *text, size_t len,
                  const char *pair, size_t pair_len, size_t max_tokens, int truncate,
                  int32_t *ids, int32_t *type_ids, size_t cap, size_t *full_len, char *errstr,
                  size_t errstr_size);
    /* tokenizer.h's tokenizer_decode. */
    int (*decode)(const void *model, const int32_t *ids, size_t n, char *buf, size_t cap);
    size_t (*vocab_size)(const void *model);
    const char *(*id_token)(const void *model, int32_t id);
    int32_t (*token_id)(const void *model, const char *token);
    int32_t (*special_id)(const void *model, enum tokenizer_special which);
};

/* The implementations (text/wp_tokenizer.c, ...). */
extern const struct tokenizer_impl wp_tokenizer_impl;
extern const struct tokenizer_impl bpe_tokenizer_impl;
extern const struct tokenizer_impl ug_tokenizer_impl;

/* Reads the whole of path into a new NUL-terminated buffer (free()), its
 * length in *len, refusing what is not a regular file or is over
 * TOKENIZER_MAX_FILE_BYTES. NULL with errstr filled ("PATH: ..."). */
char *tokenizer_read_file(const char *path, size_t *len, char *errstr, size_t errstr_size);

/* 1 if path names something that exists. */
int tokenizer_file_exists(const char *path);

#endif

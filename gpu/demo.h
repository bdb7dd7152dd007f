/* demo.h - what the demo writers (gpu/demo.c, gpu/demo_llama.c) share:
 * the seeded generator's draws, paths and text files, and the
 * tokenizer.json files of the demo words (byte-level BPE, SentencePiece
 * BPE). Internal to them.
 *
 * Threads: any; nothing is shared. */
#ifndef KINFER_DEMO_H
#define KINFER_DEMO_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Uniform in [-bound, bound), from the splitmix64 state s. */
float demo_uniform(uint64_t *s, float bound);
/* dir/name into buf; 0, or -1 when it does not fit. */
int demo_path_in(char *buf, size_t cap, const char *dir, const char *name);
/* Writes text to path; 0, or -1 with errstr filled. */
int demo_write_text(const char *path, const char *text, char *errstr, size_t errstr_size);
/* Writes j (NULL: out of memory before it) to dir/name, dumped with the
 * jansson flags; 0, or -1 with errstr filled. Borrows j. */
int demo_write_json(const char *dir, const char *name, const json_t *j, size_t flags,
                    char *errstr, size_t errstr_size);
/* dir/tokenizer.json as Hugging Face saves a byte-level BPE tokenizer:
 * the n_specials specials first (ids 0..; added tokens, "<mask>"
 * lstripped), the 256 byte characters, then each demo word, bare and
 * after a space (Ġ), built by a chain of merges one character at a time;
 * the ByteLevel pre-tokenizer and decoder, and post (a post_processor
 * object, or NULL for none; the reference is taken). *vocab gets the
 * number of ids. 0, or -1 with errstr filled. */
int demo_bpe_write(const char *dir, const char *const *specials, size_t n_specials,
                   json_t *post, size_t *vocab, char *errstr, size_t errstr_size);

/* dir/tokenizer.json as Hugging Face converts a Llama 2 / Mistral
 * SentencePiece BPE: <unk> <s> </s> (ids 0..2), the 256 byte tokens
 * <0x00>..<0xFF>, "▁" and the printable ASCII characters, then each demo
 * word, bare and after "▁", built by a chain of merges one character at a
 * time; Metaspace (prepend_scheme "first", no split), byte_fallback,
 * fuse_unk, <s> in front (TemplateProcessing), the Replace, ByteFallback,
 * Fuse, Strip decoder. *vocab gets the number of ids. 0, or -1 with
 * errstr filled. */
int demo_sp_write(const char *dir, size_t *vocab, char *errstr, size_t errstr_size);

#endif

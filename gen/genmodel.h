/* genmodel.h - a text-generating model as the worker serves it: the
 * decoder (gpu/decoder.h), its tokenizer, its chat template and the
 * generation defaults, loaded from one Hugging Face folder, and the two
 * ways a generation job's input becomes prompt ids.
 *
 * Loading (genmodel_load, at startup): config.json's model_type must be
 * one decoder_model_type_known accepts; tokenizer.json is the tokenizer;
 * the chat template is tokenizer_config.json's `chat_template` (a
 * string, or a list of {name, template} whose "default" is taken), else
 * chat_template.jinja, else none; bos_token and eos_token are
 * tokenizer_config.json's (a string, or an object whose `content` is
 * one). A template that does not parse, or fails to render a small
 * sample conversation with add_generation_prompt, fails the load: the
 * worker refuses to start rather than fail every `messages` job. The
 * default temperature is generation_config.json's (0 when it says
 * do_sample false), else 1.
 *
 * Prompts: `prompt` text is encoded by the tokenizer with its special
 * tokens (the BOS its post-processor adds, if any); `messages` are
 * rendered by the template (messages, add_generation_prompt = true,
 * bos_token, eos_token) and the text encoded WITHOUT the post-processor's
 * special tokens (the template writes them itself), as transformers'
 * apply_chat_template does. The tokenizer has no switch for that, so the
 * load finds out which ids the post-processor puts before and after a
 * text (encoding "" and "a") and they are taken off again.
 *
 * Threads: load and destroy on the main thread; the rest from any thread
 * (a loaded genmodel is read-only; each thread brings its own tokenizer
 * scratch). Ownership: the genmodel owns the decoder, tokenizer and
 * template; pointers passed in are borrowed for the call. */
#ifndef KINFER_GENMODEL_H
#define KINFER_GENMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../gpu/decoder.h"
#include "../gpu/model.h"
#include "../text/tokenizer.h"

#define GENMODEL_MAX_AFFIX 4 /* special ids the post-processor adds on a side */

struct genmodel {
    char name[MODEL_NAME_MAX];
    struct decoder *dec;
    struct tokenizer *tok;
    struct jinja_tmpl *tmpl; /* NULL: no chat template (messages jobs refused) */
    char *bos_token, *eos_token; /* "" when the folder names none */
    float default_temperature;
    size_t n_prefix, n_suffix;   /* ids the post-processor adds before / after */
    size_t longest_token;        /* bytes of the longest token's string (result bounds) */
};

/* 1 when dir is a folder whose config.json's model_type names a decoder
 * this build runs (the worker then loads it with genmodel_load). */
int genmodel_is_decoder_folder(const char *dir);

/* Loads spec->path on rt (see above). NULL with errstr filled ("model
 * NAME: ..."). Borrows rt (which must outlive the result) and spec. */
struct genmodel *genmodel_load(struct model_runtime *rt, const struct model_spec *spec,
                               char *errstr, size_t errstr_size);
void genmodel_destroy(struct genmodel *g);

/* One chat message (borrowed strings; content need not be NUL-terminated). */
struct genmodel_msg {
    const char *role;
    const char *content;
    size_t content_len;
};

/* The prompt ids of a `prompt` text (len bytes) or of n chat messages,
 * into a new array (*ids, *n_ids; the caller frees it) of at most cap
 * ids. Returns 0; -1 with why filled when the input is the job's fault
 * (invalid UTF-8, a template that raised, more than cap ids, no
 * template for messages: answered invalid_input); -2 when out of memory.
 * s is the calling thread's tokenizer scratch. */
int genmodel_encode_prompt(const struct genmodel *g, struct tokenizer_scratch *s, const char *text,
                           size_t len, size_t cap, int32_t **ids, size_t *n_ids, char *why,
                           size_t why_size);
int genmodel_encode_messages(const struct genmodel *g, struct tokenizer_scratch *s,
                             const struct genmodel_msg *msgs, size_t n, size_t cap,
                             int32_t **ids, size_t *n_ids, char *why, size_t why_size);

#endif

/* jinja.h - a small, strict interpreter for the Jinja subset that chat
 * templates use (tokenizer_config.json's `chat_template`): a generation
 * job's `messages` become the prompt text by the model folder's own
 * template, rendered as Hugging Face's libraries render it (trim_blocks and
 * lstrip_blocks on, one trailing newline of the template dropped, undefined
 * names empty, `raise_exception`). tests/test_jinja.c checks it against
 * goldens written by `@huggingface/jinja`.
 *
 * Parsing is separate from rendering: jinja_parse reads the whole template
 * once (at model load) and refuses anything it could not render - a syntax
 * error, an unknown tag, filter, test or method, a template that is not
 * UTF-8 - with the line and column. Rendering then fails only on what the
 * job's data does to it (raise_exception, a type error, a limit).
 *
 * Rendering is bounded (struct jinja_limits): the output size, the memory
 * the render may allocate (values, strings, scopes), the number of steps
 * (statements run, expressions evaluated, loop iterations) and the macro
 * call depth, so a hostile template or context cannot take the memory or
 * the time of the worker. Everything a render allocates lives in one arena
 * that is freed as the render returns.
 *
 * Values: the context is a jansson object whose keys are the top-level
 * names (messages, add_generation_prompt, bos_token, eos_token, tools...).
 * It is copied into the interpreter's own value type (jinja_impl.h), which
 * also has what JSON lacks: undefined, namespace() objects, macros, the
 * loop variable, and integers kept apart from floats.
 *
 * Threads: a parsed template is never modified; any number of threads may
 * render it at once. Ownership: every pointer parameter is borrowed for the
 * call unless said otherwise; (errstr, errstr_size) is the caller's buffer
 * for a message on failure (NULL or 0: no message). */
#ifndef KINFER_JINJA_H
#define KINFER_JINJA_H

#include <stddef.h>

#include <jansson.h>

struct jinja_tmpl;

/* What jinja_render answers besides 0. */
enum jinja_err {
    JINJA_ERR_RENDER = -1, /* a type error, an undefined call... (errstr says where) */
    JINJA_ERR_RAISED = -2, /* the template called raise_exception: errstr holds its message */
    JINJA_ERR_LIMIT = -3,  /* a limit of struct jinja_limits was reached */
    JINJA_ERR_ARG = -4,    /* NULL template, context not an object, output NULL */
    JINJA_ERR_NOMEM = -5,  /* malloc failed below the limits */
};

/* Bounds on one render (plain data; jinja_limits_init gives the defaults). */
struct jinja_limits {
    size_t max_output; /* bytes of rendered text (default 8 MiB) */
    size_t max_memory; /* bytes the render may allocate, the context's copy included
                          (default 64 MiB) */
    size_t max_steps;  /* statements + expressions + loop iterations (default 10M) */
    size_t max_depth;  /* nested macro calls (default 32) */
};

void jinja_limits_init(struct jinja_limits *lim);

/* Parses the len bytes at src. Returns a new template (free with
 * jinja_destroy), or NULL with the reason, "line L col C: ...", in errstr.
 * The template keeps no pointer into src. */
struct jinja_tmpl *jinja_parse(const char *src, size_t len, char *errstr, size_t errstr_size);

void jinja_destroy(struct jinja_tmpl *t);

/* Renders t with the names of the object ctx (borrowed; NULL: no names)
 * under lim (NULL: the defaults). On success returns 0 and *out holds a
 * new NUL-terminated string of *out_len bytes, valid UTF-8 (the caller
 * frees it); otherwise returns an enum jinja_err with the reason in errstr
 * and *out is NULL. */
int jinja_render(const struct jinja_tmpl *t, const json_t *ctx, const struct jinja_limits *lim,
                 char **out, size_t *out_len, char *errstr, size_t errstr_size);

#endif

/* jinja_impl.h - what the Jinja interpreter's files share: the arena, the
 * value type, tokens, the syntax tree and the render state. Private to
 * text/jinja_*.c; callers use jinja.h.
 *
 *   jinja_lex.c    arena, source -> tokens (whitespace control, trim_blocks,
 *                  lstrip_blocks), string escapes
 *   jinja_parse.c  tokens -> tree; checks every name a template uses
 *   jinja_eval.c   statements and expressions, scopes, the loop variable
 *   jinja_value.c  values: truth, equality, text, JSON, subscripts, slices,
 *                  the context's copy
 *   jinja_filters.c  filters, tests, methods
 *
 * Errors inside a render unwind with longjmp to jinja_render: every
 * allocation of a render is in its arena and the output buffer is the
 * state's, so nothing is left behind when a deep expression fails. */
#ifndef KINFER_JINJA_IMPL_H
#define KINFER_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja.h"

/* ---- arena --------------------------------------------------------------- */

struct jarena {
    struct jchunk *head;
    size_t used, cap; /* bytes taken from malloc, and the most allowed (0: none) */
};

void jarena_init(struct jarena *a, size_t cap);
void jarena_fini(struct jarena *a);
/* n bytes, 16-aligned, zeroed; NULL when over the cap or out of memory. */
void *jarena_alloc(struct jarena *a, size_t n);

/* ---- values -------------------------------------------------------------- */

struct jstr {
    const char *p;
    size_t n;
};

enum jv_kind {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR,
    JV_LIST, JV_DICT, JV_NS, /* ns: namespace(), a dict whose entries `set` may change */
    JV_FUNC,                 /* a global function, .i = enum jfunc */
    JV_MACRO,                /* .m = its definition */
    JV_LOOP,                 /* the loop variable, .loop */
};

enum jfunc { JF_RAISE, JF_NAMESPACE, JF_RANGE, JF_STRFTIME };

struct jv {
    enum jv_kind k;
    union {
        int b;
        long long i;
        double f;
        struct jstr s;
        struct jlist *l;
        struct jdict *d;
        const struct jmacro *m;
        struct jloop *loop;
    } u;
};

struct jlist {
    size_t n;
    struct jv *v;
};

struct jentry {
    struct jstr key;
    struct jv v;
};

struct jdict {
    size_t n, cap;
    struct jentry *e;
};

struct jloop {
    size_t i, n;
    const struct jv *items;
};

/* ---- tokens --------------------------------------------------------------- */

enum jtok_kind {
    JT_TEXT, JT_OPEN_EXPR, JT_CLOSE_EXPR, JT_OPEN_STMT, JT_CLOSE_STMT,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP, JT_EOF
};

struct jtok {
    enum jtok_kind k;
    int line, col;
    struct jstr s; /* text, name, unescaped string, operator */
    long long i;
    double f;
};

struct jtoks {
    struct jtok *t;
    size_t n, cap;
};

/* Tokenizes src (the template's arena holds the strings). 0, or -1 with
 * "line L col C: ..." in err. */
int jinja_lex(struct jarena *a, const char *src, size_t len, struct jtoks *out, char *err,
              size_t errsz);

/* ---- tree ----------------------------------------------------------------- */

enum jnode_kind {
    /* statements */
    JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_BREAK, JN_CONTINUE,
    /* expressions */
    JN_LIT, JN_NAME, JN_ATTR, JN_INDEX, JN_SLICE, JN_CALL, JN_METHOD, JN_FILTER, JN_TEST,
    JN_NOT, JN_NEG, JN_POS, JN_BIN, JN_AND, JN_OR, JN_COND, JN_LIST, JN_DICT, JN_KWARG,
};

enum jbin_op {
    JB_ADD, JB_SUB, JB_MUL, JB_DIV, JB_FLOORDIV, JB_MOD, JB_POW, JB_CAT,
    JB_EQ, JB_NE, JB_LT, JB_LE, JB_GT, JB_GE, JB_IN, JB_NOTIN,
};

struct jnode {
    enum jnode_kind k;
    int op;  /* JN_BIN: enum jbin_op; JN_TEST: 1 when negated */
    int line, col;
    struct jstr name;  /* text, identifier, attribute, method, filter, test, kwarg */
    struct jv lit;     /* JN_LIT */
    struct jnode *a, *b, *c;
    struct jnode **v;  /* body, arguments, items (dict: key, value, key, value...) */
    size_t n;
    struct jnode **w;  /* else body; macro parameters */
    size_t m;
};

struct jmacro {
    const struct jnode *def; /* JN_MACRO */
    struct jframe *closure;
};

struct jinja_tmpl {
    struct jarena arena;
    struct jnode **body;
    size_t n;
};

/* Filters, tests and methods the interpreter knows: the parser refuses the
 * others. */
int jinja_filter_known(struct jstr name);
int jinja_test_known(struct jstr name);
int jinja_method_known(struct jstr name);

/* ---- render ----------------------------------------------------------------- */

struct jframe {
    struct jframe *parent;
    size_t n, cap;
    struct jentry *e;
};

struct jrender {
    struct jarena arena;
    struct jinja_limits lim;
    char *out;
    size_t len, cap;
    size_t steps, depth;
    struct jframe *globals;
    jmp_buf fail;
    int rc;
    char *err;
    size_t errsz;
};

/* Stops the render: rc (an enum jinja_err) and the message, with the
 * node's position when node is not NULL. */
_Noreturn void jinja_fail(struct jrender *r, const struct jnode *node, int rc, const char *fmt,
                          ...) __attribute__((format(printf, 4, 5)));

void *jr_alloc(struct jrender *r, size_t n);
struct jstr jr_strdup(struct jrender *r, const char *p, size_t n);
void jr_emit(struct jrender *r, const char *p, size_t n);
void jr_step(struct jrender *r, const struct jnode *node);

static inline struct jv jv_undef(void) { struct jv v = { .k = JV_UNDEF }; return v; }
static inline struct jv jv_none(void) { struct jv v = { .k = JV_NONE }; return v; }
static inline struct jv jv_bool(int b) { struct jv v = { .k = JV_BOOL, .u.b = !!b }; return v; }
static inline struct jv jv_int(long long i) { struct jv v = { .k = JV_INT, .u.i = i }; return v; }
static inline struct jv jv_float(double f) { struct jv v = { .k = JV_FLOAT, .u.f = f }; return v; }
static inline struct jv jv_str(struct jstr s) { struct jv v = { .k = JV_STR, .u.s = s }; return v; }
static inline int jstr_eq(struct jstr a, const char *z)
{
    size_t i = 0;
    for (; i < a.n && z[i]; i++)
        if (a.p[i] != z[i]) return 0;
    return i == a.n && !z[i];
}

const char *jv_kind_name(enum jv_kind k);
int jv_truthy(struct jv v);
int jv_equal(struct jv a, struct jv b);
/* The value as {{ }} prints it (undefined and none: empty). */
struct jstr jv_to_text(struct jrender *r, struct jv v);
/* Appends v as text (jv_to_text) to the output. */
void jv_emit(struct jrender *r, struct jv v);
struct jdict *jdict_new(struct jrender *r, size_t cap);
struct jv *jdict_get(const struct jdict *d, struct jstr key);
void jdict_set(struct jrender *r, struct jdict *d, struct jstr key, struct jv v);
struct jlist *jlist_new(struct jrender *r, size_t n);
size_t jutf8_count(struct jstr s);

/* Arguments of a filter, method or call, evaluated: positional then keyword. */
struct jargs {
    size_t n, nk;
    struct jv *v;
    struct jentry *kw;
};

struct jv jinja_apply_filter(struct jrender *r, const struct jnode *node, struct jv x,
                             const struct jargs *args);
int jinja_apply_test(struct jrender *r, const struct jnode *node, struct jv x,
                     const struct jargs *args);
struct jv jinja_call_method(struct jrender *r, const struct jnode *node, struct jv obj,
                            const struct jargs *args);
/* obj[key] / obj.key: undefined when absent. */
struct jv jinja_getitem(struct jrender *r, const struct jnode *node, struct jv obj, struct jv key);
struct jv jinja_slice(struct jrender *r, const struct jnode *node, struct jv obj, struct jv a,
                      struct jv b, struct jv c);
/* v as JSON (the tojson filter; a: indent, sort_keys, ensure_ascii,
 * separators, or NULL); undefined is null when undef_null, else
 * "undefined" (as a printed list shows it). */
struct jstr jinja_tojson(struct jrender *r, const struct jnode *x, struct jv v,
                         const struct jargs *a, int undef_null);
struct jv jinja_from_json(struct jrender *r, const json_t *j, int depth);

#endif

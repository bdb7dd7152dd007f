/* jinja_parse.c - tokens -> syntax tree (jinja_impl.h), and the public
 * jinja_parse / jinja_destroy. Called once per template, at model load.
 *
 * The grammar is Jinja's, as much of it as chat templates use:
 *   statements  if/elif/else, for (tuple targets, `if` filter, else,
 *               break/continue), set (name, namespace attribute, block),
 *               macro; generation/endgeneration are accepted and do nothing
 *   expressions ternary  x if c else y
 *               or, and, not
 *               comparisons  == != < <= > >= in, not in
 *               ~ (concatenation), + -, * / // %, ** , unary - +
 *               filters x|f(args), tests x is [not] t(args)
 *               postfix .attr .method(args) [index] [a:b:c] (args)
 *               literals: strings, numbers, true/false/none (either case),
 *               lists, tuples (as lists), dicts
 * Every filter, test and method name is checked here, so a template that
 * would fail on a name at render time fails at load instead. Nesting is
 * bounded (MAX_NEST) so no template can exhaust the stack.
 *
 * Errors unwind with longjmp to jinja_parse: the tree lives in the
 * template's arena, freed whole on failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "jinja_impl.h"

#define MAX_NEST 200

struct parser {
    struct jarena *a;
    struct jtok *t;
    size_t i, n;
    int nest, loops, macros;
    char *err;
    size_t errsz;
    jmp_buf fail;
};

__attribute__((format(printf, 3, 4))) _Noreturn static void perr(struct parser *p,
                                                                  const struct jtok *t,
                                                                  const char *fmt, ...)
{
    if (p->err && p->errsz) {
        int k = snprintf(p->err, p->errsz, "line %d col %d: ", t->line, t->col);
        if (k >= 0 && (size_t)k < p->errsz) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + k, p->errsz - (size_t)k, fmt, ap);
            va_end(ap);
        }
        utf8_repair_str(p->err, p->errsz); /* a cut may split a character */
    }
    longjmp(p->fail, 1);
}

static void *palloc(struct parser *p, size_t n)
{
    void *x = jarena_alloc(p->a, n);
    if (!x) perr(p, &p->t[p->i], "out of memory");
    return x;
}

static struct jtok *cur(struct parser *p) { return &p->t[p->i]; }
static struct jtok *peek(struct parser *p, size_t k)
{
    return p->i + k < p->n ? &p->t[p->i + k] : &p->t[p->n - 1];
}

static int is_op(const struct jtok *t, const char *op)
{
    return t->k == JT_OP && jstr_eq(t->s, op);
}

static int is_name(const struct jtok *t, const char *name)
{
    return t->k == JT_NAME && jstr_eq(t->s, name);
}

static const char *tok_desc(const struct jtok *t)
{
    switch (t->k) {
    case JT_TEXT: return "text";
    case JT_OPEN_EXPR: return "'{{'";
    case JT_CLOSE_EXPR: return "'}}'";
    case JT_OPEN_STMT: return "'{%'";
    case JT_CLOSE_STMT: return "'%}'";
    case JT_NAME: return "a name";
    case JT_STRING: return "a string";
    case JT_INT: case JT_FLOAT: return "a number";
    case JT_OP: return "an operator";
    case JT_EOF: return "the end of the template";
    }
    return "?";
}

static void expect_op(struct parser *p, const char *op)
{
    if (!is_op(cur(p), op)) perr(p, cur(p), "expected '%s', found %s", op, tok_desc(cur(p)));
    p->i++;
}

static struct jstr expect_name(struct parser *p)
{
    if (cur(p)->k != JT_NAME) perr(p, cur(p), "expected a name, found %s", tok_desc(cur(p)));
    return p->t[p->i++].s;
}

static void expect_close(struct parser *p)
{
    if (cur(p)->k != JT_CLOSE_STMT)
        perr(p, cur(p), "expected '%%}', found %s", tok_desc(cur(p)));
    p->i++;
}

static struct jnode *mk(struct parser *p, enum jnode_kind k, const struct jtok *at)
{
    struct jnode *x = palloc(p, sizeof *x);
    x->k = k;
    x->line = at->line;
    x->col = at->col;
    return x;
}

/* A growing list of nodes, copied into the arena when done. */
struct nvec {
    struct jnode **v;
    size_t n, cap;
};

static void nvec_push(struct parser *p, struct nvec *v, struct jnode *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        struct jnode **nv = palloc(p, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static void enter(struct parser *p)
{
    if (++p->nest > MAX_NEST) perr(p, cur(p), "nested too deeply (over %d)", MAX_NEST);
}

/* ---- expressions ------------------------------------------------------------ */

static struct jnode *parse_expr(struct parser *p);
static struct jnode *parse_or(struct parser *p);
static struct jnode *parse_unary(struct parser *p);

/* '(' args ')' with the cursor on '(' ; keyword arguments become JN_KWARG. */
static void parse_args(struct parser *p, struct jnode *x)
{
    struct nvec v = { 0 };
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (v.n) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        if (cur(p)->k == JT_NAME && is_op(peek(p, 1), "=")) {
            struct jnode *kw = mk(p, JN_KWARG, cur(p));
            kw->name = p->t[p->i].s;
            p->i += 2;
            kw->a = parse_expr(p);
            nvec_push(p, &v, kw);
        } else {
            for (size_t k = 0; k < v.n; k++)
                if (v.v[k]->k == JN_KWARG)
                    perr(p, cur(p), "a positional argument after a keyword argument");
            nvec_push(p, &v, parse_expr(p));
        }
    }
    p->i++;
    x->v = v.v;
    x->n = v.n;
}

static struct jnode *lit(struct parser *p, const struct jtok *at, struct jv v)
{
    struct jnode *x = mk(p, JN_LIT, at);
    x->lit = v;
    return x;
}

static struct jnode *parse_primary(struct parser *p)
{
    struct jtok *t = cur(p);
    switch (t->k) {
    case JT_STRING: {
        p->i++;
        struct jstr s = t->s;
        while (cur(p)->k == JT_STRING) { /* "a" "b" is "ab" */
            char *b = palloc(p, s.n + cur(p)->s.n + 1);
            memcpy(b, s.p, s.n);
            memcpy(b + s.n, cur(p)->s.p, cur(p)->s.n);
            s.p = b;
            s.n += cur(p)->s.n;
            p->i++;
        }
        return lit(p, t, jv_str(s));
    }
    case JT_INT: p->i++; return lit(p, t, jv_int(t->i));
    case JT_FLOAT: p->i++; return lit(p, t, jv_float(t->f));
    case JT_NAME: {
        p->i++;
        if (jstr_eq(t->s, "true") || jstr_eq(t->s, "True")) return lit(p, t, jv_bool(1));
        if (jstr_eq(t->s, "false") || jstr_eq(t->s, "False")) return lit(p, t, jv_bool(0));
        if (jstr_eq(t->s, "none") || jstr_eq(t->s, "None")) return lit(p, t, jv_none());
        struct jnode *x = mk(p, JN_NAME, t);
        x->name = t->s;
        return x;
    }
    case JT_OP:
        if (is_op(t, "(")) {
            p->i++;
            struct jnode *e = parse_expr(p);
            if (!is_op(cur(p), ",")) {
                expect_op(p, ")");
                return e;
            }
            struct nvec v = { 0 };
            nvec_push(p, &v, e);
            while (is_op(cur(p), ",")) {
                p->i++;
                if (is_op(cur(p), ")")) break;
                nvec_push(p, &v, parse_expr(p));
            }
            expect_op(p, ")");
            struct jnode *x = mk(p, JN_LIST, t);
            x->v = v.v;
            x->n = v.n;
            return x;
        }
        if (is_op(t, "[") || is_op(t, "{")) {
            int dict = is_op(t, "{");
            const char *close = dict ? "}" : "]";
            p->i++;
            struct nvec v = { 0 };
            while (!is_op(cur(p), close)) {
                if (v.n) expect_op(p, ",");
                if (is_op(cur(p), close)) break;
                nvec_push(p, &v, parse_expr(p));
                if (dict) {
                    expect_op(p, ":");
                    nvec_push(p, &v, parse_expr(p));
                }
            }
            p->i++;
            struct jnode *x = mk(p, dict ? JN_DICT : JN_LIST, t);
            x->v = v.v;
            x->n = v.n;
            return x;
        }
        break;
    default:
        break;
    }
    perr(p, t, "expected an expression, found %s", tok_desc(t));
}

static struct jnode *parse_postfix(struct parser *p)
{
    struct jnode *x = parse_primary(p);
    for (;;) {
        struct jtok *t = cur(p);
        if (is_op(t, ".")) {
            p->i++;
            struct jtok *nt = cur(p);
            struct jstr name = expect_name(p);
            if (is_op(cur(p), "(")) {
                if (!jinja_method_known(name))
                    perr(p, nt, "unknown method '%.*s'", (int)name.n, name.p);
                struct jnode *m = mk(p, JN_METHOD, nt);
                m->name = name;
                m->a = x;
                parse_args(p, m);
                x = m;
            } else {
                struct jnode *m = mk(p, JN_ATTR, nt);
                m->name = name;
                m->a = x;
                x = m;
            }
        } else if (is_op(t, "[")) {
            p->i++;
            struct jnode *idx[3] = { NULL, NULL, NULL };
            int colons = 0;
            for (;;) {
                if (!is_op(cur(p), ":") && !is_op(cur(p), "]")) idx[colons] = parse_expr(p);
                if (is_op(cur(p), ":") && colons < 2) {
                    colons++;
                    p->i++;
                    continue;
                }
                break;
            }
            expect_op(p, "]");
            struct jnode *m = mk(p, colons ? JN_SLICE : JN_INDEX, t);
            if (!colons && !idx[0]) perr(p, t, "empty subscript");
            m->a = x;
            m->b = idx[0];
            m->c = idx[1];
            if (colons == 2) { /* step: kept in the argument list */
                m->v = palloc(p, sizeof *m->v);
                m->v[0] = idx[2];
                m->n = idx[2] ? 1 : 0;
            }
            x = m;
        } else if (is_op(t, "(")) {
            struct jnode *m = mk(p, JN_CALL, t);
            m->a = x;
            parse_args(p, m);
            x = m;
        } else {
            return x;
        }
    }
}

static int starts_operand(const struct jtok *t)
{
    if (t->k == JT_STRING || t->k == JT_INT || t->k == JT_FLOAT) return 1;
    if (t->k != JT_NAME) return 0;
    static const char *const kw[] = { "and", "or", "not", "in", "is", "if", "else", NULL };
    for (int k = 0; kw[k]; k++)
        if (jstr_eq(t->s, kw[k])) return 0;
    return 1;
}

/* Filters and tests after an operand. */
static struct jnode *parse_filters(struct parser *p, struct jnode *x)
{
    for (;;) {
        struct jtok *t = cur(p);
        if (is_op(t, "|")) {
            p->i++;
            struct jtok *nt = cur(p);
            struct jnode *f = mk(p, JN_FILTER, nt);
            f->name = expect_name(p);
            if (!jinja_filter_known(f->name))
                perr(p, nt, "unknown filter '%.*s'", (int)f->name.n, f->name.p);
            f->a = x;
            if (is_op(cur(p), "(")) parse_args(p, f);
            x = f;
        } else if (is_name(t, "is")) {
            p->i++;
            struct jnode *f = mk(p, JN_TEST, t);
            if (is_name(cur(p), "not")) {
                f->op = 1;
                p->i++;
            }
            struct jtok *nt = cur(p);
            f->name = expect_name(p);
            if (!jinja_test_known(f->name))
                perr(p, nt, "unknown test '%.*s'", (int)f->name.n, f->name.p);
            f->a = x;
            if (is_op(cur(p), "(")) {
                parse_args(p, f);
            } else if (starts_operand(cur(p))) {
                f->v = palloc(p, sizeof *f->v);
                f->v[0] = parse_postfix(p);
                f->n = 1;
            }
            x = f;
        } else {
            return x;
        }
    }
}

static struct jnode *parse_unary(struct parser *p)
{
    enter(p);
    struct jtok *t = cur(p);
    struct jnode *x;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->i++;
        x = mk(p, is_op(t, "-") ? JN_NEG : JN_POS, t);
        x->a = parse_unary(p);
    } else {
        x = parse_filters(p, parse_postfix(p));
    }
    p->nest--;
    return x;
}

static struct jnode *bin(struct parser *p, const struct jtok *at, int op, struct jnode *l,
                         struct jnode *r)
{
    struct jnode *x = mk(p, JN_BIN, at);
    x->op = op;
    x->a = l;
    x->b = r;
    return x;
}

static struct jnode *parse_pow(struct parser *p)
{
    struct jnode *x = parse_unary(p);
    while (is_op(cur(p), "**")) {
        struct jtok *t = &p->t[p->i++];
        x = bin(p, t, JB_POW, x, parse_unary(p));
    }
    return x;
}

static struct jnode *parse_mul(struct parser *p)
{
    struct jnode *x = parse_pow(p);
    for (;;) {
        struct jtok *t = cur(p);
        int op = is_op(t, "*") ? JB_MUL : is_op(t, "/") ? JB_DIV : is_op(t, "//") ? JB_FLOORDIV
               : is_op(t, "%") ? JB_MOD : -1;
        if (op < 0) return x;
        p->i++;
        x = bin(p, t, op, x, parse_pow(p));
    }
}

static struct jnode *parse_add(struct parser *p)
{
    struct jnode *x = parse_mul(p);
    for (;;) {
        struct jtok *t = cur(p);
        int op = is_op(t, "+") ? JB_ADD : is_op(t, "-") ? JB_SUB : -1;
        if (op < 0) return x;
        p->i++;
        x = bin(p, t, op, x, parse_mul(p));
    }
}

static struct jnode *parse_concat(struct parser *p)
{
    struct jnode *x = parse_add(p);
    while (is_op(cur(p), "~")) {
        struct jtok *t = &p->t[p->i++];
        x = bin(p, t, JB_CAT, x, parse_add(p));
    }
    return x;
}

static struct jnode *parse_compare(struct parser *p)
{
    struct jnode *x = parse_concat(p);
    for (;;) {
        struct jtok *t = cur(p);
        int op = is_op(t, "==") ? JB_EQ : is_op(t, "!=") ? JB_NE : is_op(t, "<") ? JB_LT
               : is_op(t, "<=") ? JB_LE : is_op(t, ">") ? JB_GT : is_op(t, ">=") ? JB_GE
               : is_name(t, "in") ? JB_IN : -1;
        if (op < 0 && is_name(t, "not") && is_name(peek(p, 1), "in")) {
            op = JB_NOTIN;
            p->i++;
        }
        if (op < 0) return x;
        p->i++;
        x = bin(p, t, op, x, parse_concat(p));
    }
}

static struct jnode *parse_not(struct parser *p)
{
    if (is_name(cur(p), "not")) {
        enter(p);
        struct jnode *x = mk(p, JN_NOT, cur(p));
        p->i++;
        x->a = parse_not(p);
        p->nest--;
        return x;
    }
    return parse_compare(p);
}

static struct jnode *parse_and(struct parser *p)
{
    struct jnode *x = parse_not(p);
    while (is_name(cur(p), "and")) {
        struct jnode *y = mk(p, JN_AND, cur(p));
        p->i++;
        y->a = x;
        y->b = parse_not(p);
        x = y;
    }
    return x;
}

static struct jnode *parse_or(struct parser *p)
{
    struct jnode *x = parse_and(p);
    while (is_name(cur(p), "or")) {
        struct jnode *y = mk(p, JN_OR, cur(p));
        p->i++;
        y->a = x;
        y->b = parse_and(p);
        x = y;
    }
    return x;
}

static struct jnode *parse_expr(struct parser *p)
{
    enter(p);
    struct jnode *x = parse_or(p);
    if (is_name(cur(p), "if")) {
        struct jnode *c = mk(p, JN_COND, cur(p));
        p->i++;
        c->a = parse_or(p);
        c->b = x;
        if (is_name(cur(p), "else")) {
            p->i++;
            c->c = parse_expr(p);
        }
        x = c;
    }
    p->nest--;
    return x;
}

/* ---- statements ---------------------------------------------------------- */

/* Statements until a {% NAME %} with NAME among stop (NULL-terminated);
 * the cursor is left on that NAME, and *which says which one it was. */
static void parse_body(struct parser *p, const char *const *stop, int *which, struct jnode ***out,
                       size_t *n);

static int stop_index(const struct jtok *t, const char *const *stop)
{
    for (int k = 0; stop && stop[k]; k++)
        if (is_name(t, stop[k])) return k;
    return -1;
}

static void parse_end(struct parser *p, const char *name)
{
    if (!is_name(cur(p), name)) perr(p, cur(p), "expected '%s'", name);
    p->i++;
    expect_close(p);
}

static struct jnode *parse_if(struct parser *p, struct jtok *at)
{
    static const char *const stop[] = { "elif", "else", "endif", NULL };
    static const char *const stop_end[] = { "endif", NULL };
    enter(p); /* an elif chain nests */
    struct jnode *x = mk(p, JN_IF, at);
    x->a = parse_expr(p);
    expect_close(p);
    int which;
    parse_body(p, stop, &which, &x->v, &x->n);
    struct jtok *t = &p->t[p->i++];
    if (which == 0) {
        x->w = palloc(p, sizeof *x->w);
        x->w[0] = parse_if(p, t);
        x->m = 1;
    } else if (which == 1) {
        expect_close(p);
        parse_body(p, stop_end, &which, &x->w, &x->m);
        parse_end(p, "endif");
    } else {
        expect_close(p);
    }
    p->nest--;
    return x;
}

static struct jnode *parse_for(struct parser *p, struct jtok *at)
{
    static const char *const stop[] = { "else", "endfor", NULL };
    static const char *const stop_end[] = { "endfor", NULL };
    struct jnode *x = mk(p, JN_FOR, at);
    struct nvec targets = { 0 };
    int paren = is_op(cur(p), "(");
    if (paren) p->i++;
    do {
        if (targets.n) p->i++;
        struct jnode *nm = mk(p, JN_NAME, cur(p));
        nm->name = expect_name(p);
        nvec_push(p, &targets, nm);
    } while (is_op(cur(p), ","));
    if (paren) expect_op(p, ")");
    x->c = mk(p, JN_LIST, at);
    x->c->v = targets.v;
    x->c->n = targets.n;
    if (!is_name(cur(p), "in")) perr(p, cur(p), "expected 'in'");
    p->i++;
    x->a = parse_or(p);
    if (is_name(cur(p), "if")) {
        p->i++;
        x->b = parse_expr(p);
    }
    if (is_name(cur(p), "recursive")) perr(p, cur(p), "recursive loops are not supported");
    expect_close(p);
    p->loops++;
    int which;
    parse_body(p, stop, &which, &x->v, &x->n);
    p->loops--;
    if (which == 0) {
        p->i++;
        expect_close(p);
        parse_body(p, stop_end, &which, &x->w, &x->m);
    }
    parse_end(p, "endfor");
    return x;
}

static struct jnode *parse_set(struct parser *p, struct jtok *at)
{
    static const char *const stop[] = { "endset", NULL };
    struct jnode *target = mk(p, JN_NAME, cur(p));
    target->name = expect_name(p);
    if (is_op(cur(p), ".")) {
        p->i++;
        struct jnode *attr = mk(p, JN_ATTR, cur(p));
        attr->a = target;
        attr->name = expect_name(p);
        target = attr;
    }
    if (is_op(cur(p), "=")) {
        p->i++;
        struct jnode *x = mk(p, JN_SET, at);
        x->a = target;
        x->b = parse_expr(p);
        expect_close(p);
        return x;
    }
    if (target->k != JN_NAME) perr(p, cur(p), "a block set takes a plain name");
    struct jnode *x = mk(p, JN_SETBLOCK, at);
    x->a = target;
    expect_close(p);
    int which;
    parse_body(p, stop, &which, &x->v, &x->n);
    parse_end(p, "endset");
    return x;
}

static struct jnode *parse_macro(struct parser *p, struct jtok *at)
{
    static const char *const stop[] = { "endmacro", NULL };
    struct jnode *x = mk(p, JN_MACRO, at);
    x->name = expect_name(p);
    struct nvec params = { 0 };
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (params.n) expect_op(p, ",");
        struct jnode *pn = mk(p, JN_KWARG, cur(p));
        pn->name = expect_name(p);
        if (is_op(cur(p), "=")) {
            p->i++;
            pn->a = parse_expr(p);
        }
        nvec_push(p, &params, pn);
    }
    p->i++;
    x->w = params.v;
    x->m = params.n;
    expect_close(p);
    int loops = p->loops, which;
    p->loops = 0;
    p->macros++;
    parse_body(p, stop, &which, &x->v, &x->n);
    p->macros--;
    p->loops = loops;
    parse_end(p, "endmacro");
    return x;
}

static struct jnode *parse_stmt(struct parser *p)
{
    struct jtok *at = cur(p);
    if (at->k != JT_NAME) perr(p, at, "expected a statement name, found %s", tok_desc(at));
    p->i++;
    if (jstr_eq(at->s, "if")) return parse_if(p, at);
    if (jstr_eq(at->s, "for")) return parse_for(p, at);
    if (jstr_eq(at->s, "set")) return parse_set(p, at);
    if (jstr_eq(at->s, "macro")) {
        if (p->macros) perr(p, at, "a macro inside a macro is not supported");
        return parse_macro(p, at);
    }
    if (jstr_eq(at->s, "break") || jstr_eq(at->s, "continue")) {
        if (!p->loops) perr(p, at, "'%.*s' outside a loop", (int)at->s.n, at->s.p);
        expect_close(p);
        return mk(p, jstr_eq(at->s, "break") ? JN_BREAK : JN_CONTINUE, at);
    }
    if (jstr_eq(at->s, "generation") || jstr_eq(at->s, "endgeneration")) {
        expect_close(p);
        return NULL;
    }
    perr(p, at, "unknown or misplaced tag '%.*s'", (int)at->s.n, at->s.p);
}

static void parse_body(struct parser *p, const char *const *stop, int *which, struct jnode ***out,
                       size_t *n)
{
    enter(p);
    struct nvec v = { 0 };
    for (;;) {
        struct jtok *t = cur(p);
        if (t->k == JT_EOF) {
            if (stop && stop[0]) { /* the last of stop is the end tag */
                int last = 0;
                while (stop[last + 1]) last++;
                perr(p, t, "missing {%% %s %%}", stop[last]);
            }
            break;
        }
        if (t->k == JT_TEXT) {
            struct jnode *x = mk(p, JN_TEXT, t);
            x->name = t->s;
            nvec_push(p, &v, x);
            p->i++;
        } else if (t->k == JT_OPEN_EXPR) {
            p->i++;
            struct jnode *x = mk(p, JN_OUTPUT, t);
            x->a = parse_expr(p);
            if (cur(p)->k != JT_CLOSE_EXPR)
                perr(p, cur(p), "expected '}}', found %s", tok_desc(cur(p)));
            p->i++;
            nvec_push(p, &v, x);
        } else if (t->k == JT_OPEN_STMT) {
            p->i++;
            int k = stop_index(cur(p), stop);
            if (k >= 0) {
                *which = k;
                break;
            }
            struct jnode *x = parse_stmt(p);
            if (x) nvec_push(p, &v, x);
        } else {
            perr(p, t, "unexpected %s", tok_desc(t));
        }
    }
    *out = v.v;
    *n = v.n;
    p->nest--;
}

struct jinja_tmpl *jinja_parse(const char *src, size_t len, char *errstr, size_t errstr_size)
{
    if (errstr && errstr_size) errstr[0] = 0;
    if (!src) {
        if (errstr && errstr_size) snprintf(errstr, errstr_size, "no template");
        return NULL;
    }
    struct jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t) {
        if (errstr && errstr_size) snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    jarena_init(&t->arena, 0);
    /* Names and literals point into the source: the template keeps its
     * own copy, so the caller's may go (jinja.h). */
    char *own = jarena_alloc(&t->arena, len + 1);
    if (!own) {
        if (errstr && errstr_size) snprintf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    memcpy(own, src, len);
    own[len] = '\0';
    src = own;
    struct jtoks toks = { 0 };
    if (jinja_lex(&t->arena, src, len, &toks, errstr, errstr_size)) goto fail;
    struct parser *p = jarena_alloc(&t->arena, sizeof *p);
    if (!p) goto fail;
    p->a = &t->arena;
    p->t = toks.t;
    p->n = toks.n;
    p->err = errstr;
    p->errsz = errstr_size;
    if (setjmp(p->fail)) goto fail;
    int which = -1;
    parse_body(p, NULL, &which, &t->body, &t->n);
    if (which >= 0 || cur(p)->k != JT_EOF)
        perr(p, cur(p), "unexpected '%.*s'", (int)cur(p)->s.n, cur(p)->s.p);
    return t;
fail:
    jarena_fini(&t->arena);
    free(t);
    return NULL;
}

void jinja_destroy(struct jinja_tmpl *t)
{
    if (!t) return;
    jarena_fini(&t->arena);
    free(t);
}

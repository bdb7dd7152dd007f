/* jinja_eval.c - runs a parsed template: statements, expressions, scopes,
 * the loop variable, macros, and the public jinja_render. Any thread;
 * a render touches only its own state (struct jrender) and reads the
 * template.
 *
 * Scopes are Jinja's: a for loop opens one (what `set` does inside stays
 * inside; a namespace() object is how a template carries a value out), if
 * does not, a macro call opens one over the scope the macro was defined
 * in. Names are looked up from the innermost scope out to the context,
 * then the global functions (raise_exception, namespace, range,
 * strftime_now); a name found nowhere is undefined, which prints as
 * nothing, is false, and fails in arithmetic and concatenation.
 *
 * Each statement run, expression evaluated and loop iteration is a step
 * (jr_step); the output, the arena and the macro depth are capped too,
 * from struct jinja_limits. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>

#include "../base/utf8.h"
#include "jinja_impl.h"

_Noreturn void jinja_fail(struct jrender *r, const struct jnode *node, int rc, const char *fmt,
                          ...)
{
    if (r->err && r->errsz) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(r->err, r->errsz, fmt, ap);
        va_end(ap);
        if (node && k >= 0 && (size_t)k < r->errsz)
            snprintf(r->err + k, r->errsz - (size_t)k, " (line %d col %d)", node->line, node->col);
        utf8_repair_str(r->err, r->errsz);
    }
    r->rc = rc;
    longjmp(r->fail, 1);
}

void *jr_alloc(struct jrender *r, size_t n)
{
    void *p = jarena_alloc(&r->arena, n);
    if (!p)
        jinja_fail(r, NULL, JINJA_ERR_LIMIT, "the render needs more than %zu bytes of memory",
                   r->lim.max_memory);
    return p;
}

struct jstr jr_strdup(struct jrender *r, const char *p, size_t n)
{
    char *d = jr_alloc(r, n + 1);
    if (n) memcpy(d, p, n);
    struct jstr s = { d, n };
    return s;
}

void jr_emit(struct jrender *r, const char *p, size_t n)
{
    if (n > r->lim.max_output - r->len)
        jinja_fail(r, NULL, JINJA_ERR_LIMIT, "the output is over %zu bytes", r->lim.max_output);
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n + 1) cap *= 2;
        char *o = realloc(r->out, cap);
        if (!o) jinja_fail(r, NULL, JINJA_ERR_NOMEM, "out of memory");
        r->out = o;
        r->cap = cap;
    }
    memcpy(r->out + r->len, p, n);
    r->len += n;
}

void jr_step(struct jrender *r, const struct jnode *node)
{
    if (++r->steps > r->lim.max_steps)
        jinja_fail(r, node, JINJA_ERR_LIMIT, "the render takes more than %zu steps",
                   r->lim.max_steps);
}

/* ---- scopes ----------------------------------------------------------------- */

static struct jframe *frame_new(struct jrender *r, struct jframe *parent)
{
    struct jframe *f = jr_alloc(r, sizeof *f);
    f->parent = parent;
    return f;
}

static void frame_set(struct jrender *r, struct jframe *f, struct jstr name, struct jv v)
{
    for (size_t k = 0; k < f->n; k++)
        if (f->e[k].key.n == name.n && memcmp(f->e[k].key.p, name.p, name.n) == 0) {
            f->e[k].v = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        struct jentry *e = jr_alloc(r, cap * sizeof *e);
        if (f->n) memcpy(e, f->e, f->n * sizeof *e);
        f->e = e;
        f->cap = cap;
    }
    f->e[f->n].key = name;
    f->e[f->n++].v = v;
}

static struct jv lookup(struct jframe *f, struct jstr name)
{
    for (; f; f = f->parent)
        for (size_t k = f->n; k-- > 0;)
            if (f->e[k].key.n == name.n && memcmp(f->e[k].key.p, name.p, name.n) == 0)
                return f->e[k].v;
    struct jv v = { .k = JV_FUNC };
    if (jstr_eq(name, "raise_exception")) v.u.i = JF_RAISE;
    else if (jstr_eq(name, "namespace")) v.u.i = JF_NAMESPACE;
    else if (jstr_eq(name, "range")) v.u.i = JF_RANGE;
    else if (jstr_eq(name, "strftime_now")) v.u.i = JF_STRFTIME;
    else v = jv_undef();
    return v;
}

/* ---- expressions ------------------------------------------------------------ */

static struct jv eval(struct jrender *r, struct jframe *f, const struct jnode *x);
static void run_body(struct jrender *r, struct jframe *f, struct jnode *const *body, size_t n,
                     int *ctl);

static void eval_args(struct jrender *r, struct jframe *f, const struct jnode *x,
                      struct jargs *a)
{
    memset(a, 0, sizeof *a);
    if (!x->n) return;
    a->v = jr_alloc(r, x->n * sizeof *a->v);
    a->kw = jr_alloc(r, x->n * sizeof *a->kw);
    for (size_t k = 0; k < x->n; k++) {
        const struct jnode *arg = x->v[k];
        if (arg->k == JN_KWARG) {
            a->kw[a->nk].key = arg->name;
            a->kw[a->nk++].v = eval(r, f, arg->a);
        } else {
            a->v[a->n++] = eval(r, f, arg);
        }
    }
}

static int is_num(struct jv v) { return v.k == JV_INT || v.k == JV_FLOAT; }
static double num(struct jv v) { return v.k == JV_INT ? (double)v.u.i : v.u.f; }

static struct jv concat(struct jrender *r, struct jstr a, struct jstr b)
{
    char *d = jr_alloc(r, a.n + b.n + 1);
    if (a.n) memcpy(d, a.p, a.n);
    if (b.n) memcpy(d + a.n, b.p, b.n);
    struct jstr s = { d, a.n + b.n };
    return jv_str(s);
}

static int compare_order(struct jrender *r, const struct jnode *x, struct jv a, struct jv b)
{
    if (is_num(a) && is_num(b)) {
        double p = num(a), q = num(b);
        if (a.k == JV_INT && b.k == JV_INT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        return (p > q) - (p < q);
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        if (c) return c < 0 ? -1 : 1;
        return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    jinja_fail(r, x, JINJA_ERR_RENDER, "cannot compare %s with %s", jv_kind_name(a.k),
               jv_kind_name(b.k));
}

static int contains(struct jrender *r, const struct jnode *x, struct jv item, struct jv in)
{
    switch (in.k) {
    case JV_UNDEF:
        return 0;
    case JV_LIST:
        for (size_t k = 0; k < in.u.l->n; k++) {
            jr_step(r, x);
            if (jv_equal(item, in.u.l->v[k])) return 1;
        }
        return 0;
    case JV_STR:
        if (item.k != JV_STR) break;
        if (!item.u.s.n) return 1;
        return memmem(in.u.s.p, in.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case JV_DICT: case JV_NS:
        if (item.k != JV_STR) break;
        return jdict_get(in.u.d, item.u.s) != NULL;
    default:
        break;
    }
    jinja_fail(r, x, JINJA_ERR_RENDER, "'in' is not defined for %s in %s", jv_kind_name(item.k),
               jv_kind_name(in.k));
}

static struct jv arith(struct jrender *r, const struct jnode *x, struct jv a, struct jv b)
{
    int op = x->op;
    if (a.k == JV_BOOL) a = jv_int(a.u.b);
    if (b.k == JV_BOOL) b = jv_int(b.u.b);
    if (!is_num(a) || !is_num(b)) {
        if (op == JB_ADD && a.k == JV_STR && b.k == JV_STR) return concat(r, a.u.s, b.u.s);
        if (op == JB_ADD && a.k == JV_LIST && b.k == JV_LIST) {
            struct jlist *l = jlist_new(r, a.u.l->n + b.u.l->n);
            if (a.u.l->n) memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
            if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
            struct jv v = { .k = JV_LIST, .u.l = l };
            return v;
        }
        static const char *const names[] = { "+", "-", "*", "/", "//", "%", "**" };
        jinja_fail(r, x, JINJA_ERR_RENDER, "cannot apply '%s' to %s and %s", names[op],
                   jv_kind_name(a.k), jv_kind_name(b.k));
    }
    if (a.k == JV_INT && b.k == JV_INT) {
        long long p = a.u.i, q = b.u.i, res = 0;
        int over = 0;
        switch (op) {
        case JB_ADD: over = __builtin_add_overflow(p, q, &res); break;
        case JB_SUB: over = __builtin_sub_overflow(p, q, &res); break;
        case JB_MUL: over = __builtin_mul_overflow(p, q, &res); break;
        case JB_FLOORDIV: case JB_MOD:
            if (q == 0) jinja_fail(r, x, JINJA_ERR_RENDER, "division by zero");
            if (p == -9223372036854775807LL - 1 && q == -1) { over = 1; break; }
            res = op == JB_MOD ? p % q : p / q;
            if (op == JB_MOD && res != 0 && ((res < 0) != (q < 0))) res += q;
            if (op == JB_FLOORDIV && (p % q != 0) && ((p < 0) != (q < 0))) res--;
            break;
        case JB_POW:
            if (q < 0) break;
            if (p == 0 || p == 1 || p == -1) { /* the only bases a large q cannot overflow */
                res = q == 0 ? 1 : p == -1 ? (q % 2 ? -1 : 1) : p;
                break;
            }
            res = 1; /* |p| >= 2: overflow comes within 63 multiplications */
            for (long long k = 0; k < q && !over; k++) over = __builtin_mul_overflow(res, p, &res);
            break;
        default:
            break;
        }
        if (over) jinja_fail(r, x, JINJA_ERR_RENDER, "integer overflow");
        if (op != JB_DIV && !(op == JB_POW && q < 0)) return jv_int(res);
    }
    double p = num(a), q = num(b);
    switch (op) {
    case JB_ADD: return jv_float(p + q);
    case JB_SUB: return jv_float(p - q);
    case JB_MUL: return jv_float(p * q);
    case JB_DIV:
        if (q == 0) jinja_fail(r, x, JINJA_ERR_RENDER, "division by zero");
        return jv_float(p / q);
    case JB_FLOORDIV:
        if (q == 0) jinja_fail(r, x, JINJA_ERR_RENDER, "division by zero");
        return jv_float(__builtin_floor(p / q));
    case JB_MOD: {
        if (q == 0) jinja_fail(r, x, JINJA_ERR_RENDER, "division by zero");
        double m = __builtin_fmod(p, q);
        if (m != 0 && ((m < 0) != (q < 0))) m += q;
        return jv_float(m);
    }
    default:
        if (p == 0 && q < 0)
            jinja_fail(r, x, JINJA_ERR_RENDER, "0 cannot be raised to a negative power");
        return jv_float(__builtin_pow(p, q));
    }
}

static struct jv eval_bin(struct jrender *r, struct jframe *f, const struct jnode *x)
{
    struct jv a = eval(r, f, x->a), b = eval(r, f, x->b);
    switch (x->op) {
    case JB_EQ: return jv_bool(jv_equal(a, b));
    case JB_NE: return jv_bool(!jv_equal(a, b));
    case JB_IN: return jv_bool(contains(r, x, a, b));
    case JB_NOTIN: return jv_bool(!contains(r, x, a, b));
    case JB_LT: return jv_bool(compare_order(r, x, a, b) < 0);
    case JB_LE: return jv_bool(compare_order(r, x, a, b) <= 0);
    case JB_GT: return jv_bool(compare_order(r, x, a, b) > 0);
    case JB_GE: return jv_bool(compare_order(r, x, a, b) >= 0);
    case JB_CAT:
        if (a.k == JV_UNDEF || b.k == JV_UNDEF || a.k == JV_NONE || b.k == JV_NONE)
            jinja_fail(r, x, JINJA_ERR_RENDER, "cannot concatenate %s with '~'",
                       jv_kind_name(a.k == JV_UNDEF || a.k == JV_NONE ? a.k : b.k));
        return concat(r, jv_to_text(r, a), jv_to_text(r, b));
    default:
        if (x->op == JB_ADD && (a.k == JV_STR) != (b.k == JV_STR) && a.k != JV_UNDEF &&
            b.k != JV_UNDEF && a.k != JV_NONE && b.k != JV_NONE)
            return concat(r, jv_to_text(r, a), jv_to_text(r, b));
        return arith(r, x, a, b);
    }
}

static struct jv call_macro(struct jrender *r, const struct jnode *x, const struct jmacro *m,
                            const struct jargs *a)
{
    const struct jnode *def = m->def;
    if (a->n > def->m)
        jinja_fail(r, x, JINJA_ERR_RENDER, "macro '%.*s' takes %zu arguments, given %zu",
                   (int)def->name.n, def->name.p, def->m, a->n);
    if (++r->depth > r->lim.max_depth)
        jinja_fail(r, x, JINJA_ERR_LIMIT, "macro calls nested deeper than %zu", r->lim.max_depth);
    struct jframe *scope = frame_new(r, m->closure);
    for (size_t k = 0; k < def->m; k++) {
        const struct jnode *pn = def->w[k];
        struct jv v = jv_undef();
        int given = 0;
        if (k < a->n) {
            v = a->v[k];
            given = 1;
        }
        for (size_t j = 0; j < a->nk; j++)
            if (a->kw[j].key.n == pn->name.n &&
                memcmp(a->kw[j].key.p, pn->name.p, pn->name.n) == 0) {
                v = a->kw[j].v;
                given = 1;
            }
        if (!given && pn->a) v = eval(r, scope, pn->a);
        frame_set(r, scope, pn->name, v);
    }
    size_t mark = r->len;
    int ctl = 0;
    run_body(r, scope, def->v, def->n, &ctl);
    struct jstr s = jr_strdup(r, r->out + mark, r->len - mark);
    r->len = mark;
    r->depth--;
    return jv_str(s);
}

static struct jv call_func(struct jrender *r, const struct jnode *x, struct jv fn,
                           const struct jargs *a)
{
    if (fn.k == JV_MACRO) return call_macro(r, x, fn.u.m, a);
    if (fn.k != JV_FUNC)
        jinja_fail(r, x, JINJA_ERR_RENDER, "%s is not callable", jv_kind_name(fn.k));
    switch (fn.u.i) {
    case JF_RAISE: {
        struct jstr msg = a->n ? jv_to_text(r, a->v[0]) : jr_strdup(r, "", 0);
        jinja_fail(r, NULL, JINJA_ERR_RAISED, "%.*s", (int)msg.n, msg.p);
    }
    case JF_NAMESPACE: {
        struct jdict *d = jdict_new(r, a->nk + 4);
        if (a->n > 1) jinja_fail(r, x, JINJA_ERR_RENDER, "namespace() takes one mapping");
        if (a->n == 1) {
            if (a->v[0].k != JV_DICT && a->v[0].k != JV_NS)
                jinja_fail(r, x, JINJA_ERR_RENDER, "namespace() takes a mapping");
            for (size_t k = 0; k < a->v[0].u.d->n; k++)
                jdict_set(r, d, a->v[0].u.d->e[k].key, a->v[0].u.d->e[k].v);
        }
        for (size_t k = 0; k < a->nk; k++) jdict_set(r, d, a->kw[k].key, a->kw[k].v);
        struct jv v = { .k = JV_NS, .u.d = d };
        return v;
    }
    case JF_RANGE: {
        long long lo = 0, hi, step = 1;
        if (a->n < 1 || a->n > 3 || a->nk)
            jinja_fail(r, x, JINJA_ERR_RENDER, "range() takes 1 to 3 integers");
        for (size_t k = 0; k < a->n; k++)
            if (a->v[k].k != JV_INT) jinja_fail(r, x, JINJA_ERR_RENDER, "range() takes integers");
        if (a->n == 1) {
            hi = a->v[0].u.i;
        } else {
            lo = a->v[0].u.i;
            hi = a->v[1].u.i;
            if (a->n == 3) step = a->v[2].u.i;
        }
        if (step == 0) jinja_fail(r, x, JINJA_ERR_RENDER, "range() step is zero");
        long double span = step > 0 ? (long double)hi - lo : (long double)lo - hi;
        long double mag = step > 0 ? (long double)step : -(long double)step;
        long double cnt = span <= 0 ? 0 : floorl((span + mag - 1) / mag);
        if (cnt > (long double)r->lim.max_steps)
            jinja_fail(r, x, JINJA_ERR_LIMIT, "range() is longer than the step limit");
        struct jlist *l = jlist_new(r, (size_t)cnt);
        for (size_t k = 0; k < l->n; k++) l->v[k] = jv_int(lo + (long long)k * step);
        struct jv v = { .k = JV_LIST, .u.l = l };
        return v;
    }
    default: {
        if (a->n != 1 || a->v[0].k != JV_STR)
            jinja_fail(r, x, JINJA_ERR_RENDER, "strftime_now() takes a format string");
        char fmt[256], buf[512];
        size_t n = a->v[0].u.s.n < sizeof fmt - 1 ? a->v[0].u.s.n : sizeof fmt - 1;
        memcpy(fmt, a->v[0].u.s.p, n);
        fmt[n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        size_t len = strftime(buf, sizeof buf, fmt, &tm); /* the template's own format */
#pragma GCC diagnostic pop
        if (!utf8_valid(buf, len)) len = 0;
        return jv_str(jr_strdup(r, buf, len));
    }
    }
}

static struct jv eval(struct jrender *r, struct jframe *f, const struct jnode *x)
{
    jr_step(r, x);
    switch (x->k) {
    case JN_LIT: return x->lit;
    case JN_NAME: return lookup(f, x->name);
    case JN_ATTR: return jinja_getitem(r, x, eval(r, f, x->a), jv_str(x->name));
    case JN_INDEX: {
        struct jv obj = eval(r, f, x->a);
        return jinja_getitem(r, x, obj, eval(r, f, x->b));
    }
    case JN_SLICE: {
        struct jv obj = eval(r, f, x->a);
        struct jv a = x->b ? eval(r, f, x->b) : jv_none();
        struct jv b = x->c ? eval(r, f, x->c) : jv_none();
        struct jv c = x->n ? eval(r, f, x->v[0]) : jv_none();
        return jinja_slice(r, x, obj, a, b, c);
    }
    case JN_CALL: {
        struct jv fn = eval(r, f, x->a);
        struct jargs a;
        eval_args(r, f, x, &a);
        return call_func(r, x, fn, &a);
    }
    case JN_METHOD: {
        struct jv obj = eval(r, f, x->a);
        struct jargs a;
        eval_args(r, f, x, &a);
        return jinja_call_method(r, x, obj, &a);
    }
    case JN_FILTER: {
        struct jv v = eval(r, f, x->a);
        struct jargs a;
        eval_args(r, f, x, &a);
        return jinja_apply_filter(r, x, v, &a);
    }
    case JN_TEST: {
        struct jv v = eval(r, f, x->a);
        struct jargs a;
        eval_args(r, f, x, &a);
        int t = jinja_apply_test(r, x, v, &a);
        return jv_bool(x->op ? !t : t);
    }
    case JN_NOT: return jv_bool(!jv_truthy(eval(r, f, x->a)));
    case JN_NEG: case JN_POS: {
        struct jv v = eval(r, f, x->a);
        if (v.k == JV_BOOL) v = jv_int(v.u.b);
        if (v.k == JV_INT) {
            if (x->k == JN_NEG && v.u.i == -9223372036854775807LL - 1)
                jinja_fail(r, x, JINJA_ERR_RENDER, "integer overflow");
            return x->k == JN_NEG ? jv_int(-v.u.i) : v;
        }
        if (v.k == JV_FLOAT) return x->k == JN_NEG ? jv_float(-v.u.f) : v;
        jinja_fail(r, x, JINJA_ERR_RENDER, "unary '%c' on %s", x->k == JN_NEG ? '-' : '+',
                   jv_kind_name(v.k));
    }
    case JN_BIN: return eval_bin(r, f, x);
    case JN_AND: {
        struct jv a = eval(r, f, x->a);
        return jv_truthy(a) ? eval(r, f, x->b) : a;
    }
    case JN_OR: {
        struct jv a = eval(r, f, x->a);
        return jv_truthy(a) ? a : eval(r, f, x->b);
    }
    case JN_COND:
        if (jv_truthy(eval(r, f, x->a))) return eval(r, f, x->b);
        return x->c ? eval(r, f, x->c) : jv_undef();
    case JN_LIST: {
        struct jlist *l = jlist_new(r, x->n);
        for (size_t k = 0; k < x->n; k++) l->v[k] = eval(r, f, x->v[k]);
        struct jv v = { .k = JV_LIST, .u.l = l };
        return v;
    }
    case JN_DICT: {
        struct jdict *d = jdict_new(r, x->n / 2 + 1);
        for (size_t k = 0; k + 1 < x->n; k += 2) {
            struct jv key = eval(r, f, x->v[k]);
            if (key.k != JV_STR)
                jinja_fail(r, x->v[k], JINJA_ERR_RENDER, "a dict key must be a string");
            jdict_set(r, d, key.u.s, eval(r, f, x->v[k + 1]));
        }
        struct jv v = { .k = JV_DICT, .u.d = d };
        return v;
    }
    default:
        jinja_fail(r, x, JINJA_ERR_RENDER, "not an expression");
    }
}

/* ---- statements -------------------------------------------------------------- */

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

static void bind_targets(struct jrender *r, struct jframe *f, const struct jnode *targets,
                         struct jv item)
{
    if (targets->n == 1) {
        frame_set(r, f, targets->v[0]->name, item);
        return;
    }
    if (item.k != JV_LIST || item.u.l->n != targets->n)
        jinja_fail(r, targets, JINJA_ERR_RENDER, "cannot unpack %s into %zu names",
                   jv_kind_name(item.k), targets->n);
    for (size_t k = 0; k < targets->n; k++) frame_set(r, f, targets->v[k]->name, item.u.l->v[k]);
}

static void run_for(struct jrender *r, struct jframe *f, const struct jnode *x)
{
    struct jframe *scope = frame_new(r, f);
    struct jv it = eval(r, scope, x->a);
    const struct jv *items;
    size_t n;
    if (it.k == JV_LIST) {
        items = it.u.l->v;
        n = it.u.l->n;
    } else if (it.k == JV_DICT) {
        struct jv *keys = jr_alloc(r, (it.u.d->n + 1) * sizeof *keys);
        for (size_t k = 0; k < it.u.d->n; k++) keys[k] = jv_str(it.u.d->e[k].key);
        items = keys;
        n = it.u.d->n;
    } else {
        jinja_fail(r, x->a, JINJA_ERR_RENDER, "cannot loop over %s", jv_kind_name(it.k));
    }
    if (x->b) { /* the loop's `if`: items failing it are not iterations */
        struct jv *kept = jr_alloc(r, (n + 1) * sizeof *kept);
        size_t m = 0;
        for (size_t k = 0; k < n; k++) {
            bind_targets(r, scope, x->c, items[k]);
            if (jv_truthy(eval(r, scope, x->b))) kept[m++] = items[k];
        }
        items = kept;
        n = m;
    }
    struct jloop *lp = jr_alloc(r, sizeof *lp);
    lp->items = items;
    lp->n = n;
    struct jv loopv = { .k = JV_LOOP, .u.loop = lp };
    for (size_t k = 0; k < n; k++) {
        jr_step(r, x);
        lp->i = k;
        frame_set(r, scope, (struct jstr){ "loop", 4 }, loopv);
        bind_targets(r, scope, x->c, items[k]);
        int ctl = CTL_NONE;
        run_body(r, scope, x->v, x->n, &ctl);
        if (ctl == CTL_BREAK) break;
    }
    if (n == 0 && x->m) {
        int ctl = CTL_NONE;
        run_body(r, scope, x->w, x->m, &ctl);
    }
}

static void run_set(struct jrender *r, struct jframe *f, const struct jnode *x, struct jv v)
{
    const struct jnode *t = x->a;
    if (t->k == JN_NAME) {
        frame_set(r, f, t->name, v);
        return;
    }
    struct jv ns = lookup(f, t->a->name);
    if (ns.k != JV_NS)
        jinja_fail(r, t, JINJA_ERR_RENDER, "cannot set an attribute of %s (only of a namespace)",
                   jv_kind_name(ns.k));
    jdict_set(r, ns.u.d, t->name, v);
}

static void run_body(struct jrender *r, struct jframe *f, struct jnode *const *body, size_t n,
                     int *ctl)
{
    for (size_t k = 0; k < n && *ctl == CTL_NONE; k++) {
        const struct jnode *x = body[k];
        jr_step(r, x);
        switch (x->k) {
        case JN_TEXT: jr_emit(r, x->name.p, x->name.n); break;
        case JN_OUTPUT: jv_emit(r, eval(r, f, x->a)); break;
        case JN_IF:
            if (jv_truthy(eval(r, f, x->a))) run_body(r, f, x->v, x->n, ctl);
            else run_body(r, f, x->w, x->m, ctl);
            break;
        case JN_FOR: run_for(r, f, x); break;
        case JN_SET: run_set(r, f, x, eval(r, f, x->b)); break;
        case JN_SETBLOCK: {
            size_t mark = r->len;
            int inner = CTL_NONE;
            run_body(r, f, x->v, x->n, &inner);
            struct jstr s = jr_strdup(r, r->out + mark, r->len - mark);
            r->len = mark;
            run_set(r, f, x, jv_str(s));
            break;
        }
        case JN_MACRO: {
            struct jmacro *m = jr_alloc(r, sizeof *m);
            m->def = x;
            m->closure = f;
            struct jv v = { .k = JV_MACRO, .u.m = m };
            frame_set(r, f, x->name, v);
            break;
        }
        case JN_BREAK: *ctl = CTL_BREAK; break;
        case JN_CONTINUE: *ctl = CTL_CONTINUE; break;
        default: jinja_fail(r, x, JINJA_ERR_RENDER, "not a statement");
        }
    }
}

void jinja_limits_init(struct jinja_limits *lim)
{
    lim->max_output = (size_t)8 << 20;
    lim->max_memory = (size_t)64 << 20;
    lim->max_steps = 10000000;
    lim->max_depth = 32;
}

int jinja_render(const struct jinja_tmpl *t, const json_t *ctx, const struct jinja_limits *lim,
                 char **out, size_t *out_len, char *errstr, size_t errstr_size)
{
    if (errstr && errstr_size) errstr[0] = 0;
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out || (ctx && !json_is_object(ctx))) {
        if (errstr && errstr_size) snprintf(errstr, errstr_size, "bad arguments");
        return JINJA_ERR_ARG;
    }
    struct jrender *r = calloc(1, sizeof *r);
    if (!r) return JINJA_ERR_NOMEM;
    if (lim) r->lim = *lim;
    else jinja_limits_init(&r->lim);
    r->err = errstr;
    r->errsz = errstr_size;
    jarena_init(&r->arena, r->lim.max_memory ? r->lim.max_memory : 1);
    int rc = 0;
    if (setjmp(r->fail)) {
        rc = r->rc;
        free(r->out);
        goto done;
    }
    r->globals = frame_new(r, NULL);
    if (ctx) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)ctx, key, val) {
            struct jstr k = jr_strdup(r, key, strlen(key));
            frame_set(r, r->globals, k, jinja_from_json(r, val, 0));
        }
    }
    int ctl = 0;
    run_body(r, frame_new(r, r->globals), t->body, t->n, &ctl);
    jr_emit(r, "", 0);
    r->out[r->len] = 0;
    if (!utf8_valid(r->out, r->len)) /* cannot happen from valid pieces; never pass it on */
        jinja_fail(r, NULL, JINJA_ERR_RENDER, "the output is not valid UTF-8");
    *out = r->out;
    if (out_len) *out_len = r->len;
done:
    jarena_fini(&r->arena);
    free(r);
    return rc;
}

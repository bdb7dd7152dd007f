/* jinja_filters.c - the filters (x|f), tests (x is t) and methods
 * (x.m()) the interpreter knows, and the name tables the parser checks a
 * template against. Any thread; results live in the render's arena.
 *
 * Strings follow Python where Hugging Face's renderer and Python agree and
 * where the template's author would expect Python (transformers renders
 * with Python's Jinja): strip/lstrip/rstrip take an optional set of
 * characters; split() without a separator splits on runs of whitespace;
 * capitalize lowers the rest; upper and lower map every code point
 * (utf8proc's simple case mappings). Whitespace is ASCII's. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "jinja_impl.h"

static const char *const FILTERS[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "first", "float", "int", "items",
    "join", "last", "length", "list", "lower", "map", "reject", "rejectattr", "replace",
    "reverse", "safe", "select", "selectattr", "string", "title", "tojson", "trim", "upper",
    NULL
};
static const char *const TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false", "float",
    "integer", "iterable", "lower", "mapping", "none", "number", "odd", "sameas", "sequence",
    "string", "true", "undefined", "upper", NULL
};
static const char *const METHODS[] = {
    "capitalize", "endswith", "find", "get", "items", "keys", "lower", "lstrip", "replace",
    "rstrip", "split", "startswith", "strip", "title", "upper", "values", NULL
};

static int known(const char *const *tab, struct jstr name)
{
    for (int k = 0; tab[k]; k++)
        if (jstr_eq(name, tab[k])) return 1;
    return 0;
}

int jinja_filter_known(struct jstr name) { return known(FILTERS, name); }
int jinja_test_known(struct jstr name) { return known(TESTS, name); }
int jinja_method_known(struct jstr name) { return known(METHODS, name); }

/* The argument at position pos, or keyword name; NULL when not given. */
static const struct jv *arg(const struct jargs *a, size_t pos, const char *name)
{
    if (pos < a->n) return &a->v[pos];
    for (size_t k = 0; name && k < a->nk; k++)
        if (jstr_eq(a->kw[k].key, name)) return &a->kw[k].v;
    return NULL;
}

static struct jstr want_str(struct jrender *r, const struct jnode *x, const struct jv *v,
                            const char *what)
{
    if (!v || v->k != JV_STR)
        jinja_fail(r, x, JINJA_ERR_RENDER, "%.*s: %s must be a string", (int)x->name.n, x->name.p,
                   what);
    return v->u.s;
}

static struct jv list_of(struct jlist *l)
{
    struct jv v = { .k = JV_LIST, .u.l = l };
    return v;
}

/* ---- strings -------------------------------------------------------------------- */

static size_t char_len(const char *p, size_t n)
{
    unsigned char c = (unsigned char)*p;
    size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    return len <= n ? len : n;
}

static int in_set(const char *p, size_t len, const struct jstr *chars)
{
    if (!chars)
        return len == 1 && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\v' ||
                            *p == '\f');
    for (size_t k = 0; k < chars->n;) {
        size_t cl = char_len(chars->p + k, chars->n - k);
        if (cl == len && !memcmp(chars->p + k, p, len)) return 1;
        k += cl;
    }
    return 0;
}

static struct jstr strip(struct jstr s, const struct jstr *chars, int left, int right)
{
    if (left)
        while (s.n) {
            size_t cl = char_len(s.p, s.n);
            if (!in_set(s.p, cl, chars)) break;
            s.p += cl;
            s.n -= cl;
        }
    if (right)
        while (s.n) {
            size_t b = s.n - 1;
            while (b > 0 && ((unsigned char)s.p[b] & 0xc0) == 0x80) b--;
            if (!in_set(s.p + b, s.n - b, chars)) break;
            s.n = b;
        }
    return s;
}

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE };

static struct jstr map_case(struct jrender *r, struct jstr s, int how)
{
    char *d = jr_alloc(r, s.n * 2 + 4);
    size_t o = 0, cap = s.n * 2 + 4;
    int first = 1, prev_alpha = 0;
    for (size_t k = 0; k < s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate((const utf8proc_uint8_t *)s.p + k,
                                                (utf8proc_ssize_t)(s.n - k), &cp);
        if (len <= 0) { /* not reached: strings are valid UTF-8 */
            len = 1;
            cp = 0xfffd;
        }
        int up;
        if (how == CASE_UPPER) up = 1;
        else if (how == CASE_LOWER) up = 0;
        else if (how == CASE_CAPITALIZE) up = first;
        else up = !prev_alpha;
        utf8proc_int32_t m = up ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        const utf8proc_property_t *pr = utf8proc_get_property(cp);
        prev_alpha = pr->category >= UTF8PROC_CATEGORY_LU && pr->category <= UTF8PROC_CATEGORY_LO;
        if (o + 4 > cap) { /* case mappings can lengthen a character */
            char *nd = jr_alloc(r, cap * 2);
            memcpy(nd, d, o);
            d = nd;
            cap *= 2;
        }
        o += (size_t)utf8proc_encode_char(m, (utf8proc_uint8_t *)d + o);
        k += (size_t)len;
        first = 0;
    }
    return (struct jstr){ d, o };
}

static struct jstr replace(struct jrender *r, const struct jnode *x, struct jstr s,
                           struct jstr from, struct jstr to, long long count)
{
    size_t mark = r->len;
    long long done = 0;
    if (!from.n) { /* Python: `to` before every character and at the end */
        for (size_t k = 0; k <= s.n;) {
            if (count < 0 || done < count) {
                jr_emit(r, to.p, to.n);
                done++;
            }
            if (k == s.n) break;
            size_t cl = char_len(s.p + k, s.n - k);
            jr_emit(r, s.p + k, cl);
            k += cl;
        }
    } else {
        size_t k = 0;
        while (k < s.n) {
            const char *hit = (count < 0 || done < count)
                                  ? memmem(s.p + k, s.n - k, from.p, from.n) : NULL;
            if (!hit) break;
            jr_step(r, x);
            jr_emit(r, s.p + k, (size_t)(hit - (s.p + k)));
            jr_emit(r, to.p, to.n);
            k = (size_t)(hit - s.p) + from.n;
            done++;
        }
        jr_emit(r, s.p + k, s.n - k);
    }
    struct jstr out = jr_strdup(r, r->out + mark, r->len - mark);
    r->len = mark;
    return out;
}

static struct jv split(struct jrender *r, const struct jnode *x, struct jstr s,
                       const struct jv *sepv, long long maxsplit)
{
    size_t cap = 8, n = 0;
    struct jv *parts = jr_alloc(r, cap * sizeof *parts);
    int ws = !sepv || sepv->k == JV_NONE;
    struct jstr sep = ws ? (struct jstr){ "", 0 } : want_str(r, x, sepv, "the separator");
    if (!ws && !sep.n) jinja_fail(r, x, JINJA_ERR_RENDER, "split: empty separator");
    size_t k = 0;
    for (;;) {
        jr_step(r, x);
        struct jstr piece;
        int last = 0;
        if (ws) {
            while (k < s.n && in_set(s.p + k, 1, NULL)) k++;
            if (k >= s.n) break;
            if (maxsplit >= 0 && (long long)n >= maxsplit) {
                piece = strip((struct jstr){ s.p + k, s.n - k }, NULL, 0, 1);
                last = 1;
            } else {
                size_t e = k;
                while (e < s.n && !in_set(s.p + e, 1, NULL)) e++;
                piece = (struct jstr){ s.p + k, e - k };
                k = e;
            }
        } else {
            const char *hit = (maxsplit < 0 || (long long)n < maxsplit)
                                  ? memmem(s.p + k, s.n - k, sep.p, sep.n) : NULL;
            if (hit) {
                piece = (struct jstr){ s.p + k, (size_t)(hit - (s.p + k)) };
                k = (size_t)(hit - s.p) + sep.n;
            } else {
                piece = (struct jstr){ s.p + k, s.n - k };
                last = 1;
            }
        }
        if (n == cap) {
            struct jv *np = jr_alloc(r, cap * 2 * sizeof *np);
            memcpy(np, parts, n * sizeof *np);
            parts = np;
            cap *= 2;
        }
        parts[n++] = jv_str(piece);
        if (last) break;
    }
    struct jlist *l = jlist_new(r, n);
    memcpy(l->v, parts, n * sizeof *parts);
    return list_of(l);
}

static int affix(struct jrender *r, const struct jnode *x, struct jstr s, const struct jv *p,
                 int end)
{
    if (p && p->k == JV_LIST) {
        for (size_t k = 0; k < p->u.l->n; k++)
            if (affix(r, x, s, &p->u.l->v[k], end)) return 1;
        return 0;
    }
    struct jstr q = want_str(r, x, p, "the argument");
    if (q.n > s.n) return 0;
    return !q.n || !memcmp(end ? s.p + s.n - q.n : s.p, q.p, q.n);
}

static long long want_int(struct jrender *r, const struct jnode *x, const struct jv *v,
                          long long dflt)
{
    if (!v || v->k == JV_NONE) return dflt;
    if (v->k != JV_INT) jinja_fail(r, x, JINJA_ERR_RENDER, "%.*s: expected an integer",
                                   (int)x->name.n, x->name.p);
    return v->u.i;
}

static struct jv dict_items(struct jrender *r, const struct jdict *d, int what)
{
    struct jlist *l = jlist_new(r, d->n);
    for (size_t k = 0; k < d->n; k++) {
        if (what == 0) {
            struct jlist *pair = jlist_new(r, 2);
            pair->v[0] = jv_str(d->e[k].key);
            pair->v[1] = d->e[k].v;
            l->v[k] = list_of(pair);
        } else {
            l->v[k] = what == 1 ? jv_str(d->e[k].key) : d->e[k].v;
        }
    }
    return list_of(l);
}

struct jv jinja_call_method(struct jrender *r, const struct jnode *x, struct jv obj,
                            const struct jargs *a)
{
    struct jstr m = x->name;
    if (obj.k == JV_STR) {
        struct jstr s = obj.u.s;
        if (jstr_eq(m, "strip") || jstr_eq(m, "lstrip") || jstr_eq(m, "rstrip")) {
            const struct jv *c = arg(a, 0, "chars");
            struct jstr chars;
            if (c && c->k != JV_NONE) chars = want_str(r, x, c, "chars");
            return jv_str(strip(s, c && c->k != JV_NONE ? &chars : NULL, m.p[0] != 'r',
                                m.p[0] != 'l'));
        }
        if (jstr_eq(m, "upper")) return jv_str(map_case(r, s, CASE_UPPER));
        if (jstr_eq(m, "lower")) return jv_str(map_case(r, s, CASE_LOWER));
        if (jstr_eq(m, "capitalize")) return jv_str(map_case(r, s, CASE_CAPITALIZE));
        if (jstr_eq(m, "title")) return jv_str(map_case(r, s, CASE_TITLE));
        if (jstr_eq(m, "startswith") || jstr_eq(m, "endswith"))
            return jv_bool(affix(r, x, s, arg(a, 0, NULL), m.p[0] == 'e'));
        if (jstr_eq(m, "split"))
            return split(r, x, s, arg(a, 0, "sep"), want_int(r, x, arg(a, 1, "maxsplit"), -1));
        if (jstr_eq(m, "replace"))
            return jv_str(replace(r, x, s, want_str(r, x, arg(a, 0, NULL), "old"),
                                  want_str(r, x, arg(a, 1, NULL), "new"),
                                  want_int(r, x, arg(a, 2, "count"), -1)));
        if (jstr_eq(m, "find")) {
            struct jstr q = want_str(r, x, arg(a, 0, NULL), "the argument");
            const char *hit = q.n ? memmem(s.p, s.n, q.p, q.n) : s.p;
            return jv_int(hit ? (long long)jutf8_count((struct jstr){ s.p, (size_t)(hit - s.p) })
                              : -1);
        }
    } else if (obj.k == JV_DICT || obj.k == JV_NS) {
        if (jstr_eq(m, "get")) {
            struct jstr key = want_str(r, x, arg(a, 0, "key"), "the key");
            struct jv *v = jdict_get(obj.u.d, key);
            const struct jv *dflt = arg(a, 1, "default");
            return v ? *v : dflt ? *dflt : jv_none();
        }
        if (jstr_eq(m, "items")) return dict_items(r, obj.u.d, 0);
        if (jstr_eq(m, "keys")) return dict_items(r, obj.u.d, 1);
        if (jstr_eq(m, "values")) return dict_items(r, obj.u.d, 2);
    }
    jinja_fail(r, x, JINJA_ERR_RENDER, "%s has no method '%.*s'", jv_kind_name(obj.k), (int)m.n,
               m.p);
}

/* ---- tests ------------------------------------------------------------------------ */

int jinja_apply_test(struct jrender *r, const struct jnode *x, struct jv v, const struct jargs *a)
{
    struct jstr t = x->name;
    if (jstr_eq(t, "defined")) return v.k != JV_UNDEF;
    if (jstr_eq(t, "undefined")) return v.k == JV_UNDEF;
    if (jstr_eq(t, "none")) return v.k == JV_NONE;
    if (jstr_eq(t, "string")) return v.k == JV_STR;
    if (jstr_eq(t, "number")) return v.k == JV_INT || v.k == JV_FLOAT;
    if (jstr_eq(t, "integer")) return v.k == JV_INT;
    if (jstr_eq(t, "float")) return v.k == JV_FLOAT;
    if (jstr_eq(t, "boolean")) return v.k == JV_BOOL;
    if (jstr_eq(t, "true")) return v.k == JV_BOOL && v.u.b;
    if (jstr_eq(t, "false")) return v.k == JV_BOOL && !v.u.b;
    if (jstr_eq(t, "mapping")) return v.k == JV_DICT;
    if (jstr_eq(t, "iterable")) return v.k == JV_LIST || v.k == JV_STR || v.k == JV_DICT;
    if (jstr_eq(t, "sequence")) return v.k == JV_LIST || v.k == JV_STR || v.k == JV_DICT;
    if (jstr_eq(t, "callable")) return v.k == JV_FUNC || v.k == JV_MACRO;
    if (jstr_eq(t, "lower") || jstr_eq(t, "upper")) {
        if (v.k != JV_STR) return 0;
        struct jstr m = map_case(r, v.u.s, t.p[0] == 'l' ? CASE_LOWER : CASE_UPPER);
        return m.n == v.u.s.n && (!m.n || !memcmp(m.p, v.u.s.p, m.n));
    }
    if (jstr_eq(t, "odd") || jstr_eq(t, "even") || jstr_eq(t, "divisibleby")) {
        if (v.k != JV_INT)
            jinja_fail(r, x, JINJA_ERR_RENDER, "'%.*s' needs an integer, not %s", (int)t.n, t.p,
                       jv_kind_name(v.k));
        if (t.p[0] == 'o') return v.u.i % 2 != 0;
        if (t.p[0] == 'e') return v.u.i % 2 == 0;
        long long d = want_int(r, x, arg(a, 0, "num"), 0);
        if (d == 0) jinja_fail(r, x, JINJA_ERR_RENDER, "divisibleby(0)");
        return d == -1 || v.u.i % d == 0;
    }
    /* eq, equalto, sameas */
    const struct jv *o = arg(a, 0, "other");
    if (!o) jinja_fail(r, x, JINJA_ERR_RENDER, "'%.*s' needs a value to compare", (int)t.n, t.p);
    return jv_equal(v, *o);
}

/* ---- filters ---------------------------------------------------------------------- */

/* select/reject (by_attr 0: select(test, args...)) and selectattr/
 * rejectattr (by_attr 1: selectattr(attribute, test, args...)); without a
 * test an item is kept by its truth. */
static struct jv select_items(struct jrender *r, const struct jnode *x, struct jv v,
                              const struct jargs *a, int keep, int by_attr)
{
    if (v.k != JV_LIST)
        jinja_fail(r, x, JINJA_ERR_RENDER, "'%.*s' needs a list", (int)x->name.n, x->name.p);
    struct jstr attr = by_attr ? want_str(r, x, arg(a, 0, NULL), "the attribute")
                               : (struct jstr){ "", 0 };
    size_t ti = by_attr ? 1 : 0;
    struct jnode test = *x;
    struct jargs targs = { 0 };
    if (a->n > ti) {
        test.name = want_str(r, x, &a->v[ti], "the test");
        if (!jinja_test_known(test.name))
            jinja_fail(r, x, JINJA_ERR_RENDER, "unknown test '%.*s'", (int)test.name.n,
                       test.name.p);
        targs.n = a->n - ti - 1;
        targs.v = a->v + ti + 1;
    }
    struct jlist *l = jlist_new(r, v.u.l->n);
    size_t n = 0;
    for (size_t k = 0; k < v.u.l->n; k++) {
        jr_step(r, x);
        struct jv item = by_attr ? jinja_getitem(r, x, v.u.l->v[k], jv_str(attr)) : v.u.l->v[k];
        int ok = a->n > ti ? jinja_apply_test(r, &test, item, &targs) : jv_truthy(item);
        if (ok == keep) l->v[n++] = v.u.l->v[k];
    }
    l->n = n;
    return list_of(l);
}

/* Case-insensitive unless asked: Jinja's default. */
static int ci_cmp(struct jstr a, struct jstr b, int cs)
{
    size_t n = a.n < b.n ? a.n : b.n;
    for (size_t k = 0; k < n; k++) {
        int p = (unsigned char)a.p[k], q = (unsigned char)b.p[k];
        if (!cs && p >= 'A' && p <= 'Z') p += 32;
        if (!cs && q >= 'A' && q <= 'Z') q += 32;
        if (p != q) return p < q ? -1 : 1;
    }
    return (a.n > b.n) - (a.n < b.n);
}

/* dictsort(case_sensitive=false, by='key', reverse=false): [key, value]
 * pairs in key order (insertion sort: dicts in templates are small, and
 * every comparison is a step). */
static struct jv dictsort(struct jrender *r, const struct jnode *x, const struct jdict *d,
                          const struct jargs *a)
{
    const struct jv *csv = arg(a, 0, "case_sensitive"), *byv = arg(a, 1, "by");
    const struct jv *revv = arg(a, 2, "reverse");
    int cs = csv && jv_truthy(*csv), rev = revv && jv_truthy(*revv);
    int by_value = byv && byv->k == JV_STR && jstr_eq(byv->u.s, "value");
    struct jv pairs = dict_items(r, d, 0);
    struct jv *e = pairs.u.l->v;
    for (size_t i = 1; i < d->n; i++)
        for (size_t j = i; j > 0; j--) {
            jr_step(r, x);
            struct jv p = e[j - 1].u.l->v[by_value], q = e[j].u.l->v[by_value];
            int c;
            if (p.k == JV_STR && q.k == JV_STR) c = ci_cmp(p.u.s, q.u.s, cs);
            else if ((p.k == JV_INT || p.k == JV_FLOAT) && (q.k == JV_INT || q.k == JV_FLOAT)) {
                double u = p.k == JV_INT ? (double)p.u.i : p.u.f;
                double w = q.k == JV_INT ? (double)q.u.i : q.u.f;
                c = (u > w) - (u < w);
            } else {
                jinja_fail(r, x, JINJA_ERR_RENDER, "dictsort: cannot order %s and %s",
                           jv_kind_name(p.k), jv_kind_name(q.k));
            }
            if (rev ? c >= 0 : c <= 0) break;
            struct jv t = e[j - 1];
            e[j - 1] = e[j];
            e[j] = t;
        }
    return pairs;
}

static struct jv str_chars(struct jrender *r, struct jstr s)
{
    struct jlist *l = jlist_new(r, jutf8_count(s));
    size_t i = 0;
    for (size_t k = 0; k < s.n; i++) {
        size_t cl = char_len(s.p + k, s.n - k);
        l->v[i] = jv_str((struct jstr){ s.p + k, cl });
        k += cl;
    }
    return list_of(l);
}

struct jv jinja_apply_filter(struct jrender *r, const struct jnode *x, struct jv v,
                             const struct jargs *a)
{
    struct jstr f = x->name;
    if (jstr_eq(f, "safe")) return v;
    if (jstr_eq(f, "tojson")) return jv_str(jinja_tojson(r, x, v, a, 1));
    if (jstr_eq(f, "default") || jstr_eq(f, "d")) {
        const struct jv *dflt = arg(a, 0, "default_value");
        const struct jv *boolean = arg(a, 1, "boolean");
        int use = v.k == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
        if (!use) return v;
        return dflt ? *dflt : jv_str((struct jstr){ "", 0 });
    }
    if (jstr_eq(f, "string")) return v.k == JV_NONE ? jv_str((struct jstr){ "None", 4 })
                                                    : jv_str(jv_to_text(r, v));
    if (jstr_eq(f, "length") || jstr_eq(f, "count")) {
        if (v.k == JV_STR) return jv_int((long long)jutf8_count(v.u.s));
        if (v.k == JV_LIST) return jv_int((long long)v.u.l->n);
        if (v.k == JV_DICT || v.k == JV_NS) return jv_int((long long)v.u.d->n);
        if (v.k == JV_UNDEF) return jv_int(0);
    } else if (jstr_eq(f, "first") || jstr_eq(f, "last")) {
        int last = f.p[0] == 'l';
        if (v.k == JV_LIST)
            return v.u.l->n ? v.u.l->v[last ? v.u.l->n - 1 : 0] : jv_undef();
        if (v.k == JV_STR) return jinja_getitem(r, x, v, jv_int(last ? -1 : 0));
    } else if (jstr_eq(f, "join")) {
        struct jv list = v.k == JV_STR ? str_chars(r, v.u.s) : v;
        const struct jv *sepv = arg(a, 0, "d");
        struct jstr sep = sepv ? want_str(r, x, sepv, "the separator") : (struct jstr){ "", 0 };
        const struct jv *attr = arg(a, 1, "attribute");
        if (list.k == JV_LIST) {
            size_t mark = r->len;
            for (size_t k = 0; k < list.u.l->n; k++) {
                jr_step(r, x);
                if (k) jr_emit(r, sep.p, sep.n);
                struct jv item = list.u.l->v[k];
                if (attr) item = jinja_getitem(r, x, item, *attr);
                struct jstr s = jv_to_text(r, item);
                jr_emit(r, s.p, s.n);
            }
            struct jstr s = jr_strdup(r, r->out + mark, r->len - mark);
            r->len = mark;
            return jv_str(s);
        }
    } else if (jstr_eq(f, "items")) {
        if (v.k == JV_DICT || v.k == JV_NS) return dict_items(r, v.u.d, 0);
        if (v.k == JV_UNDEF) return list_of(jlist_new(r, 0));
    } else if (jstr_eq(f, "list")) {
        if (v.k == JV_LIST) return v;
        if (v.k == JV_STR) return str_chars(r, v.u.s);
        if (v.k == JV_DICT) return dict_items(r, v.u.d, 1);
    } else if (jstr_eq(f, "reverse")) {
        if (v.k == JV_STR) {
            struct jv chars = str_chars(r, v.u.s);
            char *d = jr_alloc(r, v.u.s.n + 1);
            size_t o = 0;
            for (size_t k = chars.u.l->n; k-- > 0;) {
                memcpy(d + o, chars.u.l->v[k].u.s.p, chars.u.l->v[k].u.s.n);
                o += chars.u.l->v[k].u.s.n;
            }
            return jv_str((struct jstr){ d, o });
        }
        if (v.k == JV_LIST) {
            struct jlist *l = jlist_new(r, v.u.l->n);
            for (size_t k = 0; k < l->n; k++) l->v[k] = v.u.l->v[l->n - 1 - k];
            return list_of(l);
        }
    } else if (jstr_eq(f, "map")) {
        const struct jv *attr = arg(a, 99, "attribute");
        if (v.k == JV_LIST && attr && !a->n) {
            struct jlist *l = jlist_new(r, v.u.l->n);
            const struct jv *dflt = arg(a, 99, "default");
            for (size_t k = 0; k < l->n; k++) {
                l->v[k] = jinja_getitem(r, x, v.u.l->v[k], *attr);
                if (l->v[k].k == JV_UNDEF && dflt) l->v[k] = *dflt;
            }
            return list_of(l);
        }
        jinja_fail(r, x, JINJA_ERR_RENDER, "map: only map(attribute=...) over a list");
    } else if (jstr_eq(f, "selectattr") || jstr_eq(f, "rejectattr")) {
        return select_items(r, x, v, a, f.p[0] == 's', 1);
    } else if (jstr_eq(f, "select") || jstr_eq(f, "reject")) {
        return select_items(r, x, v, a, f.p[0] == 's', 0);
    } else if (jstr_eq(f, "dictsort")) {
        if (v.k == JV_DICT || v.k == JV_NS) return dictsort(r, x, v.u.d, a);
    } else if (jstr_eq(f, "int")) {
        if (v.k == JV_INT) return v;
        if (v.k == JV_FLOAT) return jv_int((long long)v.u.f);
        if (v.k == JV_BOOL) return jv_int(v.u.b);
        if (v.k == JV_STR) {
            char buf[32];
            size_t n = v.u.s.n < sizeof buf - 1 ? v.u.s.n : sizeof buf - 1;
            memcpy(buf, v.u.s.p, n);
            buf[n] = 0;
            char *end;
            long long i = strtoll(buf, &end, 10);
            if (end != buf) return jv_int(i);
            const struct jv *dflt = arg(a, 0, "default");
            return dflt ? *dflt : jv_int(0);
        }
    } else if (jstr_eq(f, "float")) {
        if (v.k == JV_INT) return jv_float((double)v.u.i);
        if (v.k == JV_FLOAT) return v;
        if (v.k == JV_BOOL) return jv_float(v.u.b);
        if (v.k == JV_STR) {
            char buf[64];
            size_t n = v.u.s.n < sizeof buf - 1 ? v.u.s.n : sizeof buf - 1;
            memcpy(buf, v.u.s.p, n);
            buf[n] = 0;
            char *end;
            double d = strtod(buf, &end);
            if (end != buf) return jv_float(d);
            const struct jv *dflt = arg(a, 0, "default");
            return dflt ? *dflt : jv_float(0);
        }
    } else if (jstr_eq(f, "abs")) {
        if (v.k == JV_INT && v.u.i != -9223372036854775807LL - 1) return jv_int(llabs(v.u.i));
        if (v.k == JV_FLOAT) return jv_float(v.u.f < 0 ? -v.u.f : v.u.f);
    } else if (v.k == JV_STR) {
        if (jstr_eq(f, "trim")) {
            const struct jv *c = arg(a, 0, "chars");
            struct jstr chars;
            if (c && c->k != JV_NONE) chars = want_str(r, x, c, "chars");
            return jv_str(strip(v.u.s, c && c->k != JV_NONE ? &chars : NULL, 1, 1));
        }
        if (jstr_eq(f, "upper")) return jv_str(map_case(r, v.u.s, CASE_UPPER));
        if (jstr_eq(f, "lower")) return jv_str(map_case(r, v.u.s, CASE_LOWER));
        if (jstr_eq(f, "capitalize")) return jv_str(map_case(r, v.u.s, CASE_CAPITALIZE));
        if (jstr_eq(f, "title")) return jv_str(map_case(r, v.u.s, CASE_TITLE));
        if (jstr_eq(f, "replace"))
            return jv_str(replace(r, x, v.u.s, want_str(r, x, arg(a, 0, "old"), "old"),
                                  want_str(r, x, arg(a, 1, "new"), "new"),
                                  want_int(r, x, arg(a, 2, "count"), -1)));
    }
    jinja_fail(r, x, JINJA_ERR_RENDER, "filter '%.*s' does not apply to %s", (int)f.n, f.p,
               jv_kind_name(v.k));
}

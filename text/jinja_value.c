/* jinja_value.c - the interpreter's values: truth, equality, text (what
 * {{ }} prints), JSON (the tojson filter), dicts and lists, subscripts and
 * slices, and the context's copy from jansson. Any thread; everything is
 * allocated in the render's arena.
 *
 * Printing follows Hugging Face's renderer, which the goldens come from:
 * none and undefined print nothing, booleans print as true/false, a float
 * with an integral value keeps one decimal (2.0), other floats print as the
 * shortest decimal that reads back the same, and lists and dicts print as
 * JSON with ", " and ": ". Strings are indexed, sliced and counted by
 * Unicode code point. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "jinja_impl.h"

const char *jv_kind_name(enum jv_kind k)
{
    static const char *const names[] = { "undefined", "none", "boolean", "integer", "float",
                                         "string", "list", "dict", "namespace", "function",
                                         "macro", "loop" };
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

int jv_truthy(struct jv v)
{
    switch (v.k) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int numeric(struct jv v, double *d)
{
    if (v.k == JV_INT) *d = (double)v.u.i;
    else if (v.k == JV_FLOAT) *d = v.u.f;
    else if (v.k == JV_BOOL) *d = v.u.b;
    else return 0;
    return 1;
}

/* Values nested deeper than this compare by identity: a template can
 * build a list of any depth, and the comparison must not exhaust the
 * stack. */
#define EQUAL_DEPTH 128

static int equal(struct jv a, struct jv b, int depth);

int jv_equal(struct jv a, struct jv b) { return equal(a, b, 0); }

static int equal(struct jv a, struct jv b, int depth)
{
    double p, q;
    if ((a.k == JV_INT || a.k == JV_BOOL) && (b.k == JV_INT || b.k == JV_BOOL))
        return (a.k == JV_INT ? a.u.i : a.u.b) == (b.k == JV_INT ? b.u.i : b.u.b);
    if (numeric(a, &p) && numeric(b, &q)) return p == q;
    if ((a.k == JV_UNDEF || a.k == JV_NONE) && (b.k == JV_UNDEF || b.k == JV_NONE)) return 1;
    if (a.k != b.k) return 0;
    if (depth > EQUAL_DEPTH && (a.k == JV_LIST || a.k == JV_DICT || a.k == JV_NS))
        return a.k == JV_LIST ? a.u.l == b.u.l : a.u.d == b.u.d;
    switch (a.k) {
    case JV_STR: return a.u.s.n == b.u.s.n && (!a.u.s.n || !memcmp(a.u.s.p, b.u.s.p, a.u.s.n));
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t k = 0; k < a.u.l->n; k++)
            if (!equal(a.u.l->v[k], b.u.l->v[k], depth + 1)) return 0;
        return 1;
    case JV_DICT: case JV_NS:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t k = 0; k < a.u.d->n; k++) {
            struct jv *o = jdict_get(b.u.d, a.u.d->e[k].key);
            if (!o || !equal(a.u.d->e[k].v, *o, depth + 1)) return 0;
        }
        return 1;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.i == b.u.i;
    case JV_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

/* ---- dicts and lists ------------------------------------------------------- */

struct jdict *jdict_new(struct jrender *r, size_t cap)
{
    struct jdict *d = jr_alloc(r, sizeof *d);
    d->cap = cap ? cap : 1;
    d->e = jr_alloc(r, d->cap * sizeof *d->e);
    return d;
}

struct jv *jdict_get(const struct jdict *d, struct jstr key)
{
    for (size_t k = 0; k < d->n; k++)
        if (d->e[k].key.n == key.n && (!key.n || !memcmp(d->e[k].key.p, key.p, key.n)))
            return &d->e[k].v;
    return NULL;
}

void jdict_set(struct jrender *r, struct jdict *d, struct jstr key, struct jv v)
{
    struct jv *old = jdict_get(d, key);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        struct jentry *e = jr_alloc(r, cap * sizeof *e);
        memcpy(e, d->e, d->n * sizeof *e);
        d->e = e;
        d->cap = cap;
    }
    d->e[d->n].key = key;
    d->e[d->n++].v = v;
}

struct jlist *jlist_new(struct jrender *r, size_t n)
{
    struct jlist *l = jr_alloc(r, sizeof *l);
    l->n = n;
    l->v = jr_alloc(r, (n ? n : 1) * sizeof *l->v);
    return l;
}

size_t jutf8_count(struct jstr s)
{
    size_t c = 0;
    for (size_t k = 0; k < s.n; k++) c += ((unsigned char)s.p[k] & 0xc0) != 0x80;
    return c;
}

/* Byte offset of code point cp in s (s.n when past the end). */
static size_t cp_offset(struct jstr s, size_t cp)
{
    size_t k = 0;
    for (; k < s.n; k++)
        if (((unsigned char)s.p[k] & 0xc0) != 0x80 && cp-- == 0) return k;
    return s.n;
}

/* ---- numbers as text ----------------------------------------------------------- */

/* d as JavaScript's Number#toString writes it: the shortest digits that
 * read back as d, positional between 1e-7 and 1e21, else d.ddde+x. */
static size_t fmt_number(double d, char *out)
{
    if (isnan(d)) return (size_t)sprintf(out, "NaN");
    if (isinf(d)) return (size_t)sprintf(out, d < 0 ? "-Infinity" : "Infinity");
    if (d == 0) return (size_t)sprintf(out, "0");
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *c = e;
    int neg = *c == '-';
    if (neg) c++;
    for (; *c && *c != 'e'; c++)
        if (*c != '.') digits[nd++] = *c;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int n = atoi(c + 1) + 1; /* decimal point after n digits */
    size_t o = 0;
    if (neg) out[o++] = '-';
    if ((int)nd <= n && n <= 21) {
        memcpy(out + o, digits, nd);
        o += nd;
        for (int k = (int)nd; k < n; k++) out[o++] = '0';
    } else if (0 < n && n <= 21) {
        memcpy(out + o, digits, (size_t)n);
        o += (size_t)n;
        out[o++] = '.';
        memcpy(out + o, digits + n, nd - (size_t)n);
        o += nd - (size_t)n;
    } else if (-6 < n && n <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int k = 0; k < -n; k++) out[o++] = '0';
        memcpy(out + o, digits, nd);
        o += nd;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        o += (size_t)sprintf(out + o, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
    }
    out[o] = 0;
    return o;
}

static size_t fmt_float(double d, char *out)
{
    if (d == 0 && signbit(d)) return (size_t)sprintf(out, "-0.0");
    if (isfinite(d) && d == floor(d) && fabs(d) < 1e21) return (size_t)sprintf(out, "%.1f", d);
    return fmt_number(d, out);
}

/* ---- JSON ------------------------------------------------------------------- */

struct json_opts {
    long long indent; /* 0: one line */
    int sort_keys, ensure_ascii, undef_null;
    struct jstr item_sep, key_sep;
};

static void emit_z(struct jrender *r, const char *z) { jr_emit(r, z, strlen(z)); }

static void jsonw_string(struct jrender *r, struct jstr s, int ascii)
{
    jr_emit(r, "\"", 1);
    size_t run = 0;
    for (size_t k = 0; k < s.n; k++) {
        unsigned char c = (unsigned char)s.p[k];
        const char *esc = NULL;
        char buf[16];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(buf, sizeof buf, "\\u%04x", c);
            esc = buf;
        } else if (ascii && c >= 0x7f) {
            size_t skip = 1, len = utf8_char_len((const unsigned char *)s.p + k, s.n - k, &skip);
            unsigned cp = c;
            if (len == 2) cp = (c & 0x1fu) << 6 | (s.p[k + 1] & 0x3fu);
            else if (len == 3)
                cp = (c & 0x0fu) << 12 | (s.p[k + 1] & 0x3fu) << 6 | (s.p[k + 2] & 0x3fu);
            else if (len == 4)
                cp = (c & 0x07u) << 18 | (s.p[k + 1] & 0x3fu) << 12 | (s.p[k + 2] & 0x3fu) << 6 |
                     (s.p[k + 3] & 0x3fu);
            if (cp >= 0x10000)
                snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10),
                         0xdc00 + ((cp - 0x10000) & 0x3ff));
            else
                snprintf(buf, sizeof buf, "\\u%04x", cp);
            jr_emit(r, s.p + k - run, run);
            run = 0;
            emit_z(r, buf);
            k += (len ? len : skip) - 1;
            continue;
        }
        if (!esc) {
            run++;
            continue;
        }
        jr_emit(r, s.p + k - run, run);
        run = 0;
        emit_z(r, esc);
    }
    jr_emit(r, s.p + s.n - run, run);
    jr_emit(r, "\"", 1);
}

static void json_pad(struct jrender *r, const struct json_opts *o, int depth)
{
    jr_emit(r, "\n", 1);
    for (long long k = 0; k < o->indent * depth; k++) jr_emit(r, " ", 1);
}

static int key_cmp(const void *a, const void *b)
{
    const struct jentry *x = *(const struct jentry *const *)a;
    const struct jentry *y = *(const struct jentry *const *)b;
    size_t n = x->key.n < y->key.n ? x->key.n : y->key.n;
    int c = n ? memcmp(x->key.p, y->key.p, n) : 0;
    return c ? c : (x->key.n > y->key.n) - (x->key.n < y->key.n);
}

static void json_value(struct jrender *r, struct jv v, const struct json_opts *o, int depth)
{
    char num[64];
    if (depth > 128) jinja_fail(r, NULL, JINJA_ERR_RENDER, "a value nested too deeply for JSON");
    jr_step(r, NULL);
    switch (v.k) {
    case JV_UNDEF: emit_z(r, o->undef_null ? "null" : "undefined"); return;
    case JV_NONE: emit_z(r, "null"); return;
    case JV_BOOL: emit_z(r, v.u.b ? "true" : "false"); return;
    case JV_INT: snprintf(num, sizeof num, "%lld", v.u.i); emit_z(r, num); return;
    case JV_FLOAT:
        if (!isfinite(v.u.f)) emit_z(r, "null");
        else { fmt_number(v.u.f, num); emit_z(r, num); }
        return;
    case JV_STR: jsonw_string(r, v.u.s, o->ensure_ascii); return;
    case JV_LIST: {
        jr_emit(r, "[", 1);
        for (size_t k = 0; k < v.u.l->n; k++) {
            if (k) jr_emit(r, o->item_sep.p, o->item_sep.n);
            if (o->indent) json_pad(r, o, depth + 1);
            json_value(r, v.u.l->v[k], o, depth + 1);
        }
        if (o->indent && v.u.l->n) json_pad(r, o, depth);
        jr_emit(r, "]", 1);
        return;
    }
    case JV_DICT: case JV_NS: {
        size_t n = v.u.d->n;
        const struct jentry **es = jr_alloc(r, (n + 1) * sizeof *es);
        for (size_t k = 0; k < n; k++) es[k] = &v.u.d->e[k];
        if (o->sort_keys && n > 1) qsort(es, n, sizeof *es, key_cmp);
        jr_emit(r, "{", 1);
        for (size_t k = 0; k < n; k++) {
            if (k) jr_emit(r, o->item_sep.p, o->item_sep.n);
            if (o->indent) json_pad(r, o, depth + 1);
            jsonw_string(r, es[k]->key, o->ensure_ascii);
            jr_emit(r, o->key_sep.p, o->key_sep.n);
            json_value(r, es[k]->v, o, depth + 1);
        }
        if (o->indent && n) json_pad(r, o, depth);
        jr_emit(r, "}", 1);
        return;
    }
    default:
        jinja_fail(r, NULL, JINJA_ERR_RENDER, "a %s has no JSON form", jv_kind_name(v.k));
    }
}

struct jstr jinja_tojson(struct jrender *r, const struct jnode *x, struct jv v,
                         const struct jargs *a, int undef_null)
{
    struct json_opts o = { .undef_null = undef_null };
    for (size_t k = 0; a && k < a->nk; k++) {
        struct jstr key = a->kw[k].key;
        struct jv val = a->kw[k].v;
        if (jstr_eq(key, "indent") && (val.k == JV_INT || val.k == JV_NONE)) {
            o.indent = val.k == JV_INT ? val.u.i : 0;
            if (o.indent < 0 || o.indent > 64) o.indent = 0;
        } else if (jstr_eq(key, "sort_keys") && val.k == JV_BOOL) {
            o.sort_keys = val.u.b;
        } else if (jstr_eq(key, "ensure_ascii") && val.k == JV_BOOL) {
            o.ensure_ascii = val.u.b;
        } else if (jstr_eq(key, "separators") && val.k == JV_LIST && val.u.l->n == 2 &&
                   val.u.l->v[0].k == JV_STR && val.u.l->v[1].k == JV_STR) {
            o.item_sep = val.u.l->v[0].u.s;
            o.key_sep = val.u.l->v[1].u.s;
        } else if (!(jstr_eq(key, "separators") && val.k == JV_NONE)) {
            jinja_fail(r, x, JINJA_ERR_RENDER, "tojson: bad argument '%.*s'", (int)key.n, key.p);
        }
    }
    if (a && a->n) jinja_fail(r, x, JINJA_ERR_RENDER, "tojson takes keyword arguments only");
    if (!o.item_sep.p) {
        o.item_sep = o.indent ? (struct jstr){ ",", 1 } : (struct jstr){ ", ", 2 };
        o.key_sep = (struct jstr){ ": ", 2 };
    }
    size_t mark = r->len;
    json_value(r, v, &o, 0);
    struct jstr s = jr_strdup(r, r->out + mark, r->len - mark);
    r->len = mark;
    return s;
}

struct jstr jv_to_text(struct jrender *r, struct jv v)
{
    char num[64];
    switch (v.k) {
    case JV_UNDEF: case JV_NONE: return (struct jstr){ "", 0 };
    case JV_BOOL: return v.u.b ? (struct jstr){ "true", 4 } : (struct jstr){ "false", 5 };
    case JV_INT: {
        int n = snprintf(num, sizeof num, "%lld", v.u.i);
        return jr_strdup(r, num, (size_t)n);
    }
    case JV_FLOAT: {
        size_t n = fmt_float(v.u.f, num);
        return jr_strdup(r, num, n);
    }
    case JV_STR: return v.u.s;
    case JV_LIST: case JV_DICT: case JV_NS: return jinja_tojson(r, NULL, v, NULL, 0);
    default:
        jinja_fail(r, NULL, JINJA_ERR_RENDER, "a %s cannot be printed", jv_kind_name(v.k));
    }
}

void jv_emit(struct jrender *r, struct jv v)
{
    if (v.k == JV_STR) jr_emit(r, v.u.s.p, v.u.s.n);
    else if (v.k != JV_UNDEF && v.k != JV_NONE) {
        struct jstr s = jv_to_text(r, v);
        jr_emit(r, s.p, s.n);
    }
}

/* ---- subscripts -------------------------------------------------------------- */

static struct jv loop_attr(struct jloop *lp, struct jstr key)
{
    long long i = (long long)lp->i, n = (long long)lp->n;
    if (jstr_eq(key, "index")) return jv_int(i + 1);
    if (jstr_eq(key, "index0")) return jv_int(i);
    if (jstr_eq(key, "revindex")) return jv_int(n - i);
    if (jstr_eq(key, "revindex0")) return jv_int(n - i - 1);
    if (jstr_eq(key, "first")) return jv_bool(i == 0);
    if (jstr_eq(key, "last")) return jv_bool(i == n - 1);
    if (jstr_eq(key, "length")) return jv_int(n);
    if (jstr_eq(key, "previtem")) return i > 0 ? lp->items[i - 1] : jv_undef();
    if (jstr_eq(key, "nextitem")) return i + 1 < n ? lp->items[i + 1] : jv_undef();
    return jv_undef();
}

struct jv jinja_getitem(struct jrender *r, const struct jnode *node, struct jv obj, struct jv key)
{
    switch (obj.k) {
    case JV_DICT: case JV_NS: {
        if (key.k != JV_STR)
            jinja_fail(r, node, JINJA_ERR_RENDER, "a dict key must be a string, not %s",
                       jv_kind_name(key.k));
        struct jv *v = jdict_get(obj.u.d, key.u.s);
        return v ? *v : jv_undef();
    }
    case JV_LOOP:
        return key.k == JV_STR ? loop_attr(obj.u.loop, key.u.s) : jv_undef();
    case JV_LIST: case JV_STR: {
        if (key.k == JV_STR)
            return jstr_eq(key.u.s, "length")
                       ? jv_int((long long)(obj.k == JV_LIST ? obj.u.l->n : jutf8_count(obj.u.s)))
                       : jv_undef();
        if (key.k != JV_INT)
            jinja_fail(r, node, JINJA_ERR_RENDER, "an index must be an integer, not %s",
                       jv_kind_name(key.k));
        long long n = (long long)(obj.k == JV_LIST ? obj.u.l->n : jutf8_count(obj.u.s));
        long long i = key.u.i < 0 ? key.u.i + n : key.u.i;
        if (i < 0 || i >= n) return jv_undef();
        if (obj.k == JV_LIST) return obj.u.l->v[i];
        size_t a = cp_offset(obj.u.s, (size_t)i), b = cp_offset(obj.u.s, (size_t)i + 1);
        return jv_str((struct jstr){ obj.u.s.p + a, b - a });
    }
    default:
        return jv_undef();
    }
}

static long long slice_bound(struct jrender *r, const struct jnode *node, struct jv v,
                             long long dflt, long long n, long long step)
{
    if (v.k == JV_NONE || v.k == JV_UNDEF) return dflt;
    if (v.k != JV_INT) jinja_fail(r, node, JINJA_ERR_RENDER, "a slice bound must be an integer");
    long long i = v.u.i;
    if (i < 0) {
        i += n;
        if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
        i = step < 0 ? n - 1 : n;
    }
    return i;
}

struct jv jinja_slice(struct jrender *r, const struct jnode *node, struct jv obj, struct jv a,
                      struct jv b, struct jv c)
{
    if (obj.k != JV_LIST && obj.k != JV_STR)
        jinja_fail(r, node, JINJA_ERR_RENDER, "cannot slice %s", jv_kind_name(obj.k));
    long long step = 1;
    if (c.k == JV_INT) step = c.u.i;
    else if (c.k != JV_NONE && c.k != JV_UNDEF)
        jinja_fail(r, node, JINJA_ERR_RENDER, "a slice step must be an integer");
    if (step == 0) jinja_fail(r, node, JINJA_ERR_RENDER, "a slice step cannot be zero");
    long long n = (long long)(obj.k == JV_LIST ? obj.u.l->n : jutf8_count(obj.u.s));
    long long lo = slice_bound(r, node, a, step > 0 ? 0 : n - 1, n, step);
    long long hi = slice_bound(r, node, b, step > 0 ? n : -1, n, step);
    size_t cnt = 0;
    if (step > 0 && hi > lo) cnt = (size_t)((hi - lo + step - 1) / step);
    if (step < 0 && lo > hi) cnt = (size_t)((lo - hi - step - 1) / -step);
    if (obj.k == JV_LIST) {
        struct jlist *l = jlist_new(r, cnt);
        for (size_t k = 0; k < cnt; k++) l->v[k] = obj.u.l->v[lo + (long long)k * step];
        struct jv v = { .k = JV_LIST, .u.l = l };
        return v;
    }
    if (step == 1) {
        size_t p = cp_offset(obj.u.s, (size_t)lo), q = cnt ? cp_offset(obj.u.s, (size_t)hi) : p;
        return jv_str((struct jstr){ obj.u.s.p + p, q - p });
    }
    char *d = jr_alloc(r, obj.u.s.n + 1);
    size_t o = 0;
    for (size_t k = 0; k < cnt; k++) {
        jr_step(r, node);
        size_t cp = (size_t)(lo + (long long)k * step);
        size_t p = cp_offset(obj.u.s, cp), q = cp_offset(obj.u.s, cp + 1);
        memcpy(d + o, obj.u.s.p + p, q - p);
        o += q - p;
    }
    return jv_str((struct jstr){ d, o });
}

/* ---- the context -------------------------------------------------------------- */

struct jv jinja_from_json(struct jrender *r, const json_t *j, int depth)
{
    if (depth > 64) jinja_fail(r, NULL, JINJA_ERR_RENDER, "the context is nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct jdict *d = jdict_new(r, json_object_size(j));
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            struct jstr k = { key, strlen(key) };
            if (!utf8_valid(k.p, k.n)) jinja_fail(r, NULL, JINJA_ERR_RENDER, "a key is not UTF-8");
            jdict_set(r, d, k, jinja_from_json(r, val, depth + 1));
        }
        struct jv v = { .k = JV_DICT, .u.d = d };
        return v;
    }
    case JSON_ARRAY: {
        struct jlist *l = jlist_new(r, json_array_size(j));
        for (size_t k = 0; k < l->n; k++)
            l->v[k] = jinja_from_json(r, json_array_get(j, k), depth + 1);
        struct jv v = { .k = JV_LIST, .u.l = l };
        return v;
    }
    case JSON_STRING: {
        struct jstr s = { json_string_value(j), json_string_length(j) };
        if (!utf8_valid(s.p, s.n)) jinja_fail(r, NULL, JINJA_ERR_RENDER, "a string is not UTF-8");
        return jv_str(s);
    }
    case JSON_INTEGER: return jv_int((long long)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    default: return jv_none();
    }
}

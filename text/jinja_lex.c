/* jinja_lex.c - the interpreter's arena, and the template source cut into
 * tokens: text between tags, and the tokens inside {{ }} and {% %}.
 * Comments ({# #}) leave no token. Whitespace is handled here, as Hugging
 * Face's libraries render chat templates:
 *   - one trailing newline of the template is dropped;
 *   - `-` beside a tag's delimiter ({%- -%} {{- -}} {#- -#}) strips all
 *     whitespace on that side;
 *   - trim_blocks: the newline right after a %} or #} is dropped;
 *   - lstrip_blocks: spaces and tabs from the start of a line to a {% or
 *     {# are dropped.
 * Called by jinja_parse only (at model load); the strings of the tokens
 * live in the template's arena. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "jinja_impl.h"

/* ---- arena --------------------------------------------------------------- */

struct jchunk {
    struct jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define JCHUNK_MIN (64u * 1024u)

void jarena_init(struct jarena *a, size_t cap)
{
    a->head = NULL;
    a->used = 0;
    a->cap = cap;
}

void jarena_fini(struct jarena *a)
{
    struct jchunk *c = a->head;
    while (c) {
        struct jchunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void *jarena_alloc(struct jarena *a, size_t n)
{
    if (n > ((size_t)1 << 40)) return NULL;
    n = (n + 15) & ~(size_t)15;
    struct jchunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > JCHUNK_MIN ? n : JCHUNK_MIN;
        if (a->cap && a->used + size + sizeof *c > a->cap) return NULL;
        c = malloc(sizeof *c + size);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->used += size + sizeof *c;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

/* ---- lexer --------------------------------------------------------------- */

struct lexer {
    struct jarena *a;
    const char *s;
    size_t len, i;
    size_t lc_off; /* line and column are known at lc_off */
    int line, col;
    struct jtoks *out;
    char *err;
    size_t errsz;
};

static void lx_pos(struct lexer *lx, size_t off, int *line, int *col)
{
    if (off < lx->lc_off) { /* never happens in order; recount */
        lx->lc_off = 0;
        lx->line = 1;
        lx->col = 1;
    }
    for (; lx->lc_off < off; lx->lc_off++) {
        unsigned char ch = (unsigned char)lx->s[lx->lc_off];
        if (ch == '\n') {
            lx->line++;
            lx->col = 1;
        } else if ((ch & 0xc0) != 0x80) {
            lx->col++;
        }
    }
    *line = lx->line;
    *col = lx->col;
}

static int lx_error(struct lexer *lx, size_t off, const char *msg)
{
    int line, col;
    lx_pos(lx, off, &line, &col);
    if (lx->err && lx->errsz) {
        snprintf(lx->err, lx->errsz, "line %d col %d: %s", line, col, msg);
        utf8_repair_str(lx->err, lx->errsz);
    }
    return -1;
}

static struct jtok *lx_push(struct lexer *lx, enum jtok_kind k, size_t off)
{
    struct jtoks *o = lx->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        struct jtok *t = jarena_alloc(lx->a, cap * sizeof *t);
        if (!t) return NULL;
        if (o->n) memcpy(t, o->t, o->n * sizeof *t);
        o->t = t;
        o->cap = cap;
    }
    struct jtok *t = &o->t[o->n++];
    memset(t, 0, sizeof *t);
    t->k = k;
    lx_pos(lx, off, &t->line, &t->col);
    return t;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int is_name0(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int starts(const struct lexer *lx, size_t i, const char *z)
{
    size_t n = strlen(z);
    return i + n <= lx->len && memcmp(lx->s + i, z, n) == 0;
}

static size_t put_utf8(char *d, unsigned cp)
{
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        d[0] = (char)(0xc0 | cp >> 6);
        d[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    d[0] = (char)(0xe0 | cp >> 12);
    d[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    d[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A quoted string at lx->i; its unescaped bytes become the token's. */
static int lex_string(struct lexer *lx)
{
    size_t start = lx->i;
    char q = lx->s[lx->i++];
    char *buf = jarena_alloc(lx->a, (lx->len - lx->i) * 3 / 2 + 4);
    if (!buf) return lx_error(lx, start, "out of memory");
    size_t n = 0;
    for (;;) {
        if (lx->i >= lx->len) return lx_error(lx, start, "unterminated string");
        char c = lx->s[lx->i++];
        if (c == q) break;
        if (c != '\\') {
            buf[n++] = c;
            continue;
        }
        if (lx->i >= lx->len) return lx_error(lx, start, "unterminated string");
        char e = lx->s[lx->i++];
        switch (e) {
        case 'n': buf[n++] = '\n'; break;
        case 't': buf[n++] = '\t'; break;
        case 'r': buf[n++] = '\r'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'v': buf[n++] = '\v'; break;
        case '\'': case '"': case '\\': buf[n++] = e; break;
        case 'x': case 'u': {
            int digits = e == 'x' ? 2 : 4;
            unsigned cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = lx->i < lx->len ? hexval(lx->s[lx->i]) : -1;
                if (h < 0) return lx_error(lx, lx->i, "bad hexadecimal escape in a string");
                cp = cp * 16 + (unsigned)h;
                lx->i++;
            }
            if (cp >= 0xd800 && cp <= 0xdfff)
                return lx_error(lx, lx->i, "a surrogate escape is not a character");
            n += put_utf8(buf + n, cp);
            break;
        }
        default:
            return lx_error(lx, lx->i - 1, "unknown escape in a string");
        }
    }
    struct jtok *t = lx_push(lx, JT_STRING, start);
    if (!t) return lx_error(lx, start, "out of memory");
    t->s.p = buf;
    t->s.n = n;
    return 0;
}

static const char *const OPS2[] = { "**", "//", "==", "!=", "<=", ">=" };
static const char OPS1[] = "+-*/%~<>=()[]{},.:|";

/* The tokens of one tag, from after its opener to after its closer. *strip
 * is set when the closer asks to strip the whitespace after it, *trim when
 * trim_blocks applies (a statement). */
static int lex_tag(struct lexer *lx, int stmt, int *strip, int *trim)
{
    int depth = 0;
    for (;;) {
        while (lx->i < lx->len && is_ws(lx->s[lx->i])) lx->i++;
        if (lx->i >= lx->len) return lx_error(lx, lx->i, stmt ? "missing %}" : "missing }}");
        size_t at = lx->i;
        const char *close = stmt ? "%}" : "}}";
        int dash = lx->s[at] == '-' && starts(lx, at + 1, close);
        if (dash || (starts(lx, at, close) && (stmt || depth == 0))) {
            if (!lx_push(lx, stmt ? JT_CLOSE_STMT : JT_CLOSE_EXPR, at))
                return lx_error(lx, at, "out of memory");
            lx->i = at + 2 + (size_t)dash;
            *strip = dash;
            *trim = stmt;
            return 0;
        }
        char c = lx->s[at];
        if (c == '\'' || c == '"') {
            if (lex_string(lx)) return -1;
            continue;
        }
        if (is_name0(c)) {
            while (lx->i < lx->len && (is_name0(lx->s[lx->i]) || is_digit(lx->s[lx->i]))) lx->i++;
            struct jtok *t = lx_push(lx, JT_NAME, at);
            if (!t) return lx_error(lx, at, "out of memory");
            t->s.p = lx->s + at;
            t->s.n = lx->i - at;
            continue;
        }
        if (is_digit(c)) {
            while (lx->i < lx->len && is_digit(lx->s[lx->i])) lx->i++;
            int isf = lx->i + 1 < lx->len && lx->s[lx->i] == '.' && is_digit(lx->s[lx->i + 1]);
            if (isf) {
                lx->i++;
                while (lx->i < lx->len && is_digit(lx->s[lx->i])) lx->i++;
            }
            char num[64];
            size_t nl = lx->i - at;
            if (nl >= sizeof num) return lx_error(lx, at, "number too long");
            memcpy(num, lx->s + at, nl);
            num[nl] = 0;
            struct jtok *t = lx_push(lx, isf ? JT_FLOAT : JT_INT, at);
            if (!t) return lx_error(lx, at, "out of memory");
            if (isf) {
                t->f = strtod(num, NULL);
            } else {
                char *end;
                unsigned long long v = strtoull(num, &end, 10);
                if (nl > 18 && v > (unsigned long long)9223372036854775807LL)
                    return lx_error(lx, at, "integer too large");
                if (nl > 19) return lx_error(lx, at, "integer too large");
                t->i = (long long)v;
            }
            continue;
        }
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof OPS2 / sizeof OPS2[0]; k++)
            if (starts(lx, at, OPS2[k])) oplen = 2;
        if (!oplen && c && strchr(OPS1, c)) oplen = 1;
        if (!oplen) return lx_error(lx, at, "unexpected character in a tag");
        if (c == '{') depth++;
        if (c == '}') depth--;
        struct jtok *t = lx_push(lx, JT_OP, at);
        if (!t) return lx_error(lx, at, "out of memory");
        t->s.p = lx->s + at;
        t->s.n = oplen;
        lx->i = at + oplen;
    }
}

int jinja_lex(struct jarena *a, const char *src, size_t len, struct jtoks *out, char *err,
              size_t errsz)
{
    struct lexer lx = { .a = a, .s = src, .len = len, .line = 1, .col = 1, .out = out,
                        .err = err, .errsz = errsz };
    if (!utf8_valid(src, len)) return lx_error(&lx, 0, "the template is not valid UTF-8");
    if (lx.len && src[lx.len - 1] == '\n') lx.len--;
    int strip_next = 0, trim_next = 0;
    while (lx.i < lx.len) {
        size_t start = lx.i, j = lx.i;
        while (j < lx.len && !(src[j] == '{' && j + 1 < lx.len &&
                               (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#')))
            j++;
        size_t ts = start, te = j;
        if (strip_next) {
            while (ts < te && is_ws(src[ts])) ts++;
        } else if (trim_next && ts < te && src[ts] == '\n') {
            ts++;
        }
        strip_next = trim_next = 0;
        int tag = j < lx.len;
        if (tag) {
            char kind = src[j + 1];
            if (j + 2 < lx.len && src[j + 2] == '-') {
                while (te > ts && is_ws(src[te - 1])) te--;
            } else if (kind != '{') { /* lstrip_blocks */
                size_t b = j;
                while (b > 0 && (src[b - 1] == ' ' || src[b - 1] == '\t')) b--;
                if (b == 0 || src[b - 1] == '\n' || src[b - 1] == '\r') te = b > ts ? b : ts;
            }
        }
        if (te > ts) {
            struct jtok *t = lx_push(&lx, JT_TEXT, ts);
            if (!t) return lx_error(&lx, ts, "out of memory");
            t->s.p = src + ts;
            t->s.n = te - ts;
        }
        if (!tag) break;
        char kind = src[j + 1];
        lx.i = j + 2;
        if (lx.i < lx.len && src[lx.i] == '-') lx.i++;
        if (kind == '#') {
            size_t k = lx.i;
            while (k + 1 < lx.len && !(src[k] == '#' && src[k + 1] == '}')) k++;
            if (k + 1 >= lx.len) return lx_error(&lx, j, "unterminated comment");
            strip_next = k > lx.i && src[k - 1] == '-';
            trim_next = 1;
            lx.i = k + 2;
            continue;
        }
        if (!lx_push(&lx, kind == '%' ? JT_OPEN_STMT : JT_OPEN_EXPR, j))
            return lx_error(&lx, j, "out of memory");
        if (lex_tag(&lx, kind == '%', &strip_next, &trim_next)) return -1;
    }
    if (!lx_push(&lx, JT_EOF, lx.len)) return lx_error(&lx, lx.len, "out of memory");
    return 0;
}

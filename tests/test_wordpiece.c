/* test_wordpiece.c - text/wordpiece against Hugging Face's fast BERT
 * tokenizer: every golden case (tests/data/wordpiece/golden.json, written
 * by tests/golden/wordpiece_golden.js from the `tokenizers` npm package)
 * id for id and type id for type id, from both loaders; every Unicode
 * scalar value through each normalizer step and the pre-tokenizer against
 * the reference's answers (unicode.tsv); then what the goldens cannot
 * show: invalid UTF-8, length limits, refused files, a 10 MB input checked
 * against its own pieces, hostile shapes that would expose quadratic work,
 * and four threads sharing one tokenizer.
 *
 * Runs from the repository root (as make test does). Single-threaded
 * except test_threads; bad files live in a temporary directory that the
 * group teardown removes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../text/wordpiece.h"
#include "testutil.h"

#define DATA "tests/data/wordpiece/"
#define MAX_SETTINGS 8

struct setting {
    const char *name;
    struct wp_tokenizer *from_vocab;
    struct wp_tokenizer *from_json;
    struct wp_conf conf;
};

struct golden {
    const char *setting;
    const char *text;
    size_t text_len;
    const char *pair; /* NULL = no pair */
    size_t pair_len;
    size_t max_len;
    size_t n;
    int32_t *ids;
    int32_t *type_ids;
};

struct fixture {
    char dir[64];
    json_t *root;
    struct setting set[MAX_SETTINGS];
    size_t n_set;
    struct golden *g;
    size_t n_g;
};

/* Prints bytes with C escapes, for failure messages. */
static void show(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != 0x7f && c != '\\' && c != '"') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o] = '\0';
}

/* Reads an int array member of a golden case into a new array. */
static int32_t *int_array(const json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int32_t *v = malloc((*n ? *n : 1) * sizeof(*v));
    assert_non_null(v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

/* The conf a golden setting describes, for wp_load_vocab. */
static void setting_conf(const json_t *s, struct wp_conf *c)
{
    wp_conf_defaults(c);
    c->clean_text = json_is_true(json_object_get(s, "clean_text"));
    c->chinese_chars = json_is_true(json_object_get(s, "handle_chinese_chars"));
    c->lowercase = json_is_true(json_object_get(s, "lowercase"));
    const json_t *sa = json_object_get(s, "strip_accents");
    c->strip_accents = json_is_null(sa) ? -1 : json_is_true(sa);
}

/* Loads golden.json and builds each setting's tokenizer both ways. */
static int group_setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    if (!fx) return -1;
    snprintf(fx->dir, sizeof(fx->dir), "/tmp/kinfer_wp_XXXXXX");
    if (!mkdtemp(fx->dir)) return -1;
    json_error_t jerr;
    fx->root = json_load_file(DATA "golden.json", JSON_ALLOW_NUL, &jerr);
    if (!fx->root) {
        fprintf(stderr, "%s: %s (run from the repository root)\n", DATA "golden.json", jerr.text);
        return -1;
    }
    const char *name;
    json_t *s;
    json_object_foreach(json_object_get(fx->root, "settings"), name, s) {
        if (fx->n_set == MAX_SETTINGS) return -1;
        struct setting *st = &fx->set[fx->n_set++];
        char err[512] = "", path[256];
        st->name = name;
        setting_conf(s, &st->conf);
        st->from_vocab = wp_load_vocab(DATA "vocab.txt", &st->conf, err, sizeof(err));
        if (!st->from_vocab) {
            fprintf(stderr, "setting %s: %s\n", name, err);
            return -1;
        }
        snprintf(path, sizeof(path), DATA "%s", json_string_value(json_object_get(s, "json")));
        st->from_json = wp_load_json(path, err, sizeof(err));
        if (!st->from_json) {
            fprintf(stderr, "setting %s: %s\n", name, err);
            return -1;
        }
    }
    const json_t *cases = json_object_get(fx->root, "cases");
    fx->n_g = json_array_size(cases);
    fx->g = calloc(fx->n_g, sizeof(*fx->g));
    if (!fx->g) return -1;
    for (size_t i = 0; i < fx->n_g; i++) {
        const json_t *c = json_array_get(cases, i);
        struct golden *g = &fx->g[i];
        g->setting = json_string_value(json_object_get(c, "setting"));
        g->text = json_string_value(json_object_get(c, "text"));
        g->text_len = json_string_length(json_object_get(c, "text"));
        const json_t *p = json_object_get(c, "pair");
        if (json_is_string(p)) {
            g->pair = json_string_value(p);
            g->pair_len = json_string_length(p);
        }
        g->max_len = (size_t)json_integer_value(json_object_get(c, "max_len"));
        size_t nt;
        g->ids = int_array(json_object_get(c, "ids"), &g->n);
        g->type_ids = int_array(json_object_get(c, "type_ids"), &nt);
        if (nt != g->n) return -1;
    }
    fprintf(stderr, "golden: %zu cases, %zu settings, reference %s\n", fx->n_g, fx->n_set,
            json_string_value(json_object_get(fx->root, "reference")));
    *state = fx;
    return 0;
}

/* Frees the fixture and removes the temporary directory. */
static int group_teardown(void **state)
{
    struct fixture *fx = *state;
    for (size_t i = 0; i < fx->n_set; i++) {
        wp_destroy(fx->set[i].from_vocab);
        wp_destroy(fx->set[i].from_json);
    }
    for (size_t i = 0; i < fx->n_g; i++) {
        free(fx->g[i].ids);
        free(fx->g[i].type_ids);
    }
    free(fx->g);
    json_decref(fx->root);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fx->dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", fx->dir);
    free(fx);
    return 0;
}

/* The setting called name. */
static struct setting *find_setting(struct fixture *fx, const char *name)
{
    for (size_t i = 0; i < fx->n_set; i++)
        if (strcmp(fx->set[i].name, name) == 0) return &fx->set[i];
    fail_msg("no setting %s", name);
    return NULL;
}

/* Encodes golden case g with t into ids/type_ids (cap entries each);
 * returns the count or the error. */
static int encode_case(const struct wp_tokenizer *t, struct wp_scratch *s, const struct golden *g,
                       int32_t *ids, int32_t *type_ids, size_t cap, char *err, size_t errsz)
{
    size_t full = 0;
    return wp_encode(t, s, g->text, g->text_len, g->pair, g->pair_len, g->max_len,
                     g->max_len != 0, ids, type_ids, cap, &full, err, errsz);
}

/* Checks every golden case with one loader's tokenizers; reports up to 20
 * mismatches with both token lists before failing. */
static void check_goldens(struct fixture *fx, int use_json)
{
    struct wp_scratch *s = wp_scratch_new(0);
    assert_non_null(s);
    static int32_t ids[4096], type_ids[4096];
    size_t bad = 0;
    for (size_t i = 0; i < fx->n_g; i++) {
        const struct golden *g = &fx->g[i];
        struct setting *st = find_setting(fx, g->setting);
        const struct wp_tokenizer *t = use_json ? st->from_json : st->from_vocab;
        char err[256] = "";
        int n = encode_case(t, s, g, ids, type_ids, 4096, err, sizeof(err));
        int same = n == (int)g->n && memcmp(ids, g->ids, g->n * sizeof(int32_t)) == 0 &&
                   memcmp(type_ids, g->type_ids, g->n * sizeof(int32_t)) == 0;
        if (same) continue;
        if (bad++ >= 20) continue;
        char txt[600], pr[300];
        show(g->text, g->text_len, txt, sizeof(txt));
        show(g->pair ? g->pair : "", g->pair_len, pr, sizeof(pr));
        print_error("case %zu [%s] \"%s\"%s%s%s max_len %zu: %s\n", i, g->setting, txt,
                    g->pair ? " + \"" : "", g->pair ? pr : "", g->pair ? "\"" : "", g->max_len,
                    n < 0 ? err : "");
        print_error("  want:");
        for (size_t k = 0; k < g->n; k++)
            print_error(" %s/%d", wp_id_token(t, g->ids[k]), g->type_ids[k]);
        print_error("\n  got: ");
        for (int k = 0; k < n; k++) print_error(" %s/%d", wp_id_token(t, ids[k]), type_ids[k]);
        print_error("\n");
    }
    wp_scratch_destroy(s);
    if (bad) fail_msg("%zu of %zu golden cases differ (%s loader)", bad, fx->n_g,
                      use_json ? "tokenizer.json" : "vocab.txt");
    print_message("%zu golden cases match (%s loader)\n", fx->n_g,
                  use_json ? "tokenizer.json" : "vocab.txt");
}

/* Goldens through wp_load_vocab + the setting's conf. */
static void test_golden_vocab(void **state)
{
    check_goldens(*state, 0);
}

/* Goldens through wp_load_json of the file the reference saved. */
static void test_golden_json(void **state)
{
    check_goldens(*state, 1);
}

/* What wp_load_json read from each saved file: the settings, the prefix,
 * the word limit and the special ids all agree with the vocab.txt path. */
static void test_json_settings(void **state)
{
    struct fixture *fx = *state;
    for (size_t i = 0; i < fx->n_set; i++) {
        const struct setting *st = &fx->set[i];
        const struct wp_conf *c = wp_get_conf(st->from_json);
        assert_int_equal(c->lowercase, st->conf.lowercase);
        assert_int_equal(c->strip_accents, st->conf.strip_accents);
        assert_int_equal(c->chinese_chars, st->conf.chinese_chars);
        assert_int_equal(c->clean_text, st->conf.clean_text);
        assert_int_equal(c->max_word_chars, 100);
        assert_string_equal(c->prefix, "##");
        assert_string_equal(c->unk_token, "[UNK]");
        assert_string_equal(c->cls_token, "[CLS]");
        assert_string_equal(c->sep_token, "[SEP]");
        const struct wp_tokenizer *a = st->from_json, *b = st->from_vocab;
        assert_int_equal(wp_vocab_size(a), wp_vocab_size(b));
        assert_int_equal(wp_unk_id(a), 1);
        assert_int_equal(wp_cls_id(a), 2);
        assert_int_equal(wp_sep_id(a), 3);
        assert_int_equal(wp_pad_id(a), 0);
        assert_int_equal(wp_mask_id(a), 4);
        assert_int_equal(wp_unk_id(b), 1);
        assert_int_equal(wp_cls_id(b), 2);
        assert_int_equal(wp_sep_id(b), 3);
        assert_int_equal(wp_pad_id(b), 0);
        assert_int_equal(wp_mask_id(b), 4);
        for (int32_t id = 0; id < (int32_t)wp_vocab_size(a); id++) {
            assert_string_equal(wp_id_token(a, id), wp_id_token(b, id));
            assert_int_equal(wp_token_id(a, wp_id_token(a, id)), id);
        }
        assert_null(wp_id_token(a, -1));
        assert_null(wp_id_token(a, (int32_t)wp_vocab_size(a)));
        assert_int_equal(wp_token_id(a, "no-such-token"), -1);
    }
}

/* ---- the per-code-point sweep ------------------------------------------------ */

enum { K_CLEAN, K_STRIP, K_LOWER, K_CJK, K_PRE, K_N };

struct urow {
    uint32_t lo, hi;
    int tag;          /* clean: 1 del, 2 sp; pre: 2 ws, 3 punct */
    size_t nv;        /* strip/lower: values (0 = deleted) */
    uint32_t v[20];
};

struct utable {
    struct urow *r;
    size_t n, cap;
};

/* Parses unicode.tsv into one sorted table per kind. */
static void load_unicode(struct utable *tab)
{
    FILE *fp = fopen(DATA "unicode.tsv", "r");
    assert_non_null(fp);
    char line[512];
    static const char *kinds[K_N] = {"clean", "strip", "lower", "cjk", "pre"};
    while (fgets(line, sizeof(line), fp)) {
        if (line[0] == '#') continue;
        char *save = NULL;
        char *kind = strtok_r(line, "\t\n", &save);
        int k = -1;
        for (int i = 0; i < K_N; i++)
            if (kind && strcmp(kind, kinds[i]) == 0) k = i;
        assert_true(k >= 0);
        struct urow r = {0};
        r.lo = (uint32_t)strtoul(strtok_r(NULL, "\t\n", &save), NULL, 16);
        r.hi = (uint32_t)strtoul(strtok_r(NULL, "\t\n", &save), NULL, 16);
        char *f;
        while ((f = strtok_r(NULL, "\t\n", &save))) {
            if (strcmp(f, "del") == 0) r.tag = 1;
            else if (strcmp(f, "sp") == 0 || strcmp(f, "ws") == 0) r.tag = 2;
            else if (strcmp(f, "punct") == 0) r.tag = 3;
            else if (strcmp(f, "cjk") == 0) r.tag = 1;
            else if (strcmp(f, "-") == 0) r.nv = 0;
            else {
                assert_true(r.nv < 20);
                r.v[r.nv++] = (uint32_t)strtoul(f, NULL, 16);
            }
        }
        struct utable *t = &tab[k];
        if (t->n == t->cap) {
            t->cap = t->cap ? 2 * t->cap : 256;
            t->r = realloc(t->r, t->cap * sizeof(*t->r));
            assert_non_null(t->r);
        }
        t->r[t->n++] = r;
    }
    fclose(fp);
}

/* The row of table t covering cp, advancing *pos (cps come in order). */
static const struct urow *urow_at(const struct utable *t, size_t *pos, uint32_t cp)
{
    while (*pos < t->n && t->r[*pos].hi < cp) (*pos)++;
    if (*pos < t->n && t->r[*pos].lo <= cp) return &t->r[*pos];
    return NULL;
}

/* Appends cp as UTF-8. */
static size_t put_utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A tokenizer over a tiny vocabulary with one normalizer step on. */
static struct wp_tokenizer *step_tokenizer(const char *vocab, int clean, int cjk, int strip,
                                           int lower)
{
    struct wp_conf c;
    wp_conf_defaults(&c);
    c.clean_text = clean;
    c.chinese_chars = cjk;
    c.strip_accents = strip;
    c.lowercase = lower;
    char err[256];
    struct wp_tokenizer *t = wp_load_vocab(vocab, &c, err, sizeof(err));
    if (!t) fail_msg("%s", err);
    return t;
}

/* Writes a file in the fixture's directory; returns its path (static). */
static const char *write_file(struct fixture *fx, const char *name, const char *body, size_t n)
{
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", fx->dir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(body, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
    return path;
}

/* Every scalar value alone through clean_text, strip_accents, lowercase
 * and handle_chinese_chars (each on its own), and as "a<c>b" through the
 * pre-tokenizer, against what the reference did with it. */
static void test_unicode_sweep(void **state)
{
    struct fixture *fx = *state;
    struct utable tab[K_N] = {{0}};
    load_unicode(tab);
    const char *voc = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n";
    const char *vpath = write_file(fx, "sweep_vocab.txt", voc, strlen(voc));
    struct wp_tokenizer *step[K_N];
    step[K_CLEAN] = step_tokenizer(vpath, 1, 0, 0, 0);
    step[K_STRIP] = step_tokenizer(vpath, 0, 0, 1, 0);
    step[K_LOWER] = step_tokenizer(vpath, 0, 0, 0, 1);
    step[K_CJK] = step_tokenizer(vpath, 0, 1, 0, 0);
    step[K_PRE] = step_tokenizer(vpath, 0, 0, 0, 0);
    struct wp_scratch *s = wp_scratch_new(0);
    assert_non_null(s);
    size_t pos[K_N] = {0}, bad = 0, checked = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char in[8];
        size_t inl = put_utf8(cp, in);
        for (int k = 0; k < K_PRE; k++) {
            char want[128];
            size_t wl = 0;
            const struct urow *r = urow_at(&tab[k], &pos[k], cp);
            if (!r) {
                memcpy(want, in, inl);
                wl = inl;
            } else if (k == K_CLEAN) {
                if (r->tag == 2) want[wl++] = ' ';
            } else if (k == K_CJK) {
                want[wl++] = ' ';
                memcpy(want + wl, in, inl);
                wl += inl;
                want[wl++] = ' ';
            } else {
                for (size_t i = 0; i < r->nv; i++)
                    wl += put_utf8(r->v[i] + (i + 1 == r->nv ? cp - r->lo : 0), want + wl);
            }
            size_t gl = 0;
            char err[128];
            const char *got = wp_normalize(step[k], s, in, inl, &gl, err, sizeof(err));
            assert_non_null(got);
            if (gl != wl || memcmp(got, want, wl) != 0) {
                if (bad++ < 20) {
                    char a[64], b[64];
                    show(want, wl, a, sizeof(a));
                    show(got, gl, b, sizeof(b));
                    print_error("U+%04X step %d: want \"%s\", got \"%s\"\n", cp, k, a, b);
                }
            }
        }
        const struct urow *r = urow_at(&tab[K_PRE], &pos[K_PRE], cp);
        int want_n = 2 + (r ? r->tag : 1);
        char txt[8];
        txt[0] = 'a';
        memcpy(txt + 1, in, inl);
        txt[1 + inl] = 'b';
        int32_t ids[8];
        char err[128];
        int n = wp_encode(step[K_PRE], s, txt, inl + 2, NULL, 0, 0, 0, ids, NULL, 8, NULL, err,
                          sizeof(err));
        if (n != want_n && bad++ < 20)
            print_error("U+%04X pre-tokenizer: want %d tokens, got %d\n", cp, want_n, n);
        checked++;
    }
    for (int k = 0; k < K_N; k++) {
        wp_destroy(step[k]);
        free(tab[k].r);
    }
    wp_scratch_destroy(s);
    if (bad) fail_msg("%zu code point checks differ from the reference", bad);
    print_message("%zu code points x 5 checks match the reference\n", checked);
}

/* ---- hostile input ---------------------------------------------------------- */

/* Invalid UTF-8 anywhere in text or pair is refused with its offset,
 * including sequences cut off by the end of the buffer (each input sits
 * in a buffer of exactly its length, so ASan sees any over-read). */
static void test_invalid_utf8(void **state)
{
    struct fixture *fx = *state;
    const struct wp_tokenizer *t = find_setting(fx, "uncased")->from_json;
    static const struct {
        const char *what;
        const char *bytes;
    } bad[] = {
        {"overlong slash", "\xC0\xAF"},          {"overlong 2-byte", "\xC1\xBF"},
        {"overlong 3-byte", "\xE0\x80\xAF"},     {"overlong 3-byte max", "\xE0\x9F\xBF"},
        {"overlong 4-byte", "\xF0\x80\x80\xAF"}, {"overlong 4-byte max", "\xF0\x8F\xBF\xBF"},
        {"high surrogate", "\xED\xA0\x80"},      {"low surrogate", "\xED\xBF\xBF"},
        {"past U+10FFFF", "\xF4\x90\x80\x80"},   {"F5 lead", "\xF5\x80\x80\x80"},
        {"0xFF", "\xFF"},                        {"0xFE", "\xFE"},
        {"lone continuation", "\x80"},           {"continuation run", "\xBF\xBF"},
        {"truncated 2-byte", "\xC3"},            {"truncated 3-byte", "\xE2\x82"},
        {"truncated 4-byte", "\xF0\x9F\x98"},    {"bad second byte", "\xC3\x28"},
        {"bad third byte", "\xE2\x82\x28"},      {"bad fourth byte", "\xF0\x9F\x98\x28"},
    };
    struct wp_scratch *s = wp_scratch_new(16);
    assert_non_null(s);
    int32_t ids[64];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (int where = 0; where < 4; where++) {
            /* 0: "abc" + bad + "def"; 1: bad at the very end; 2: in the
             * pair; 3: wp_normalize */
            size_t bl = strlen(bad[i].bytes);
            size_t n = where == 1 ? 3 + bl : 3 + bl + 3;
            char *buf = malloc(n);
            assert_non_null(buf);
            memcpy(buf, "abc", 3);
            memcpy(buf + 3, bad[i].bytes, bl);
            if (where != 1) memcpy(buf + 3 + bl, "def", 3);
            char err[256] = "";
            int rc;
            if (where == 3) {
                size_t ol;
                rc = wp_normalize(t, s, buf, n, &ol, err, sizeof(err)) ? 0 : WP_ERR_UTF8;
            } else if (where == 2) {
                rc = wp_encode(t, s, "ok", 2, buf, n, 0, 0, ids, NULL, 64, NULL, err, sizeof(err));
            } else {
                rc = wp_encode(t, s, buf, n, NULL, 0, 0, 0, ids, NULL, 64, NULL, err, sizeof(err));
            }
            free(buf);
            if (rc != WP_ERR_UTF8 || !strstr(err, "not valid UTF-8 at byte 3"))
                fail_msg("%s (case %d): rc %d, '%s'", bad[i].what, where, rc, err);
            if (where == 2 && strncmp(err, "pair", 4) != 0) fail_msg("%s: '%s'", bad[i].what, err);
        }
    }
    /* the edges of the valid range, and NUL inside the length, are fine */
    static const char ok[] = "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF"
                             "\xF0\x90\x80\x80\xF4\x8F\xBF\xBF a\0b";
    char err[256] = "";
    int n = wp_encode(t, s, ok, sizeof(ok) - 1, NULL, 0, 0, 0, ids, NULL, 64, NULL, err, sizeof(err));
    if (n < 0) fail_msg("%s", err);
    /* "a\0b" is "ab" once clean_text drops the NUL: its last tokens are
     * those of "ab" */
    int32_t ab[8];
    int m = wp_encode(t, s, "ab", 2, NULL, 0, 0, 0, ab, NULL, 8, NULL, err, sizeof(err));
    assert_true(m >= 3 && n >= m);
    assert_memory_equal(ids + n - (m - 1), ab + 1, (size_t)(m - 1) * sizeof(int32_t));
    wp_scratch_destroy(s);
}

/* Length limits: without truncation an over-long input is refused with
 * both counts; with it, tiny limits and a small output buffer are the
 * caller's errors, and max_len 0 means no limit. */
static void test_limits(void **state)
{
    struct fixture *fx = *state;
    const struct wp_tokenizer *t = find_setting(fx, "uncased")->from_json;
    struct wp_scratch *s = wp_scratch_new(0);
    assert_non_null(s);
    int32_t ids[64], type_ids[64];
    char err[256] = "";
    const char *text = "the quick brown fox jumps over the lazy dog the dog"; /* 11 tokens */
    size_t full = 0;
    int n = wp_encode(t, s, text, strlen(text), NULL, 0, 5, 0, ids, type_ids, 64, &full, err,
                      sizeof(err));
    assert_int_equal(n, WP_ERR_TOO_LONG);
    assert_int_equal(full, 13);
    assert_string_equal(err, "input is 13 tokens, over the limit of 5");
    n = wp_encode(t, s, text, strlen(text), "hi", 2, 13, 0, ids, type_ids, 64, &full, err,
                  sizeof(err));
    assert_int_equal(n, WP_ERR_TOO_LONG);
    assert_int_equal(full, 15);
    assert_string_equal(err, "input is 15 tokens, over the limit of 13");
    /* exactly at the limit is fine, truncate or not */
    n = wp_encode(t, s, text, strlen(text), NULL, 0, 13, 0, ids, type_ids, 64, &full, err,
                  sizeof(err));
    assert_int_equal(n, 13);
    n = wp_encode(t, s, text, strlen(text), NULL, 0, 0, 0, ids, type_ids, 64, &full, err,
                  sizeof(err));
    assert_int_equal(n, 13);
    /* truncation to the minimum, and below it */
    n = wp_encode(t, s, text, strlen(text), NULL, 0, 2, 1, ids, type_ids, 64, &full, err,
                  sizeof(err));
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], wp_cls_id(t));
    assert_int_equal(ids[1], wp_sep_id(t));
    assert_int_equal(full, 13);
    n = wp_encode(t, s, text, strlen(text), NULL, 0, 1, 1, ids, type_ids, 64, &full, err,
                  sizeof(err));
    assert_int_equal(n, WP_ERR_ARG);
    assert_non_null(strstr(err, "cannot hold the 2 special tokens"));
    n = wp_encode(t, s, text, strlen(text), "x", 1, 3, 1, ids, type_ids, 64, &full, err,
                  sizeof(err));
    assert_int_equal(n, 3);
    assert_int_equal(type_ids[2], 1);
    n = wp_encode(t, s, text, strlen(text), "x", 1, 2, 1, ids, type_ids, 64, &full, err,
                  sizeof(err));
    assert_int_equal(n, WP_ERR_ARG);
    /* a buffer too small for the result */
    n = wp_encode(t, s, text, strlen(text), NULL, 0, 0, 0, ids, type_ids, 12, &full, err,
                  sizeof(err));
    assert_int_equal(n, WP_ERR_CAP);
    assert_int_equal(full, 13);
    assert_non_null(strstr(err, "needs 13 entries, the buffer holds 12"));
    /* NULL buffers with lengths */
    assert_int_equal(wp_encode(t, s, NULL, 3, NULL, 0, 0, 0, ids, NULL, 64, NULL, err, sizeof(err)),
                     WP_ERR_ARG);
    assert_int_equal(wp_encode(t, s, NULL, 0, NULL, 0, 0, 0, ids, NULL, 64, NULL, err, sizeof(err)),
                     2);
    wp_scratch_destroy(s);
}

/* Appends one random character of a mixed alphabet (ASCII letters,
 * spaces, punctuation, accented and combining, CJK, emoji, specials). */
static size_t rand_piece(char *o)
{
    static const char *alpha[] = {
        "a", "b", "e", "h", "l", "o", "s", "t", "E", "T", " ", " ", " ", "\t", "\n", ".", ",", "!",
        "'", "-", "(", "\xc3\xa9", "\xc3\x89", "\xcc\x81", "\xe4\xb8\xad", "\xe5\x9b\xbd",
        "\xf0\x9f\x98\x80", "\xce\xa3", "\xc2\xa0", "\xe2\x80\x8b", "\xc4\xb0", "\0", "\x01",
        "[MASK]", "[CLS", "##", "the ", "hello ", "aaaa", "\xe3\x80\x82", "\xef\xbf\xbd",
    };
    const char *p = alpha[tu_rand64() % (sizeof(alpha) / sizeof(alpha[0]))];
    size_t n = p[0] ? strlen(p) : 1;
    memcpy(o, p, n);
    return n;
}

/* Monotonic seconds, for the timings printed by the big-input tests. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A 10 MB random text tokenizes whole, and its token count is the sum of
 * the counts of its ASCII-whitespace-separated chunks tokenized one by one
 * (no token, mark run or special token crosses such a space) - a property
 * no hard-coded answer could satisfy. */
static void test_big_random(void **state)
{
    struct fixture *fx = *state;
    const struct wp_tokenizer *t = find_setting(fx, "uncased")->from_json;
    size_t cap = 10u << 20;
    char *text = malloc(cap + 16);
    assert_non_null(text);
    size_t n = 0;
    while (n < cap) {
        n += rand_piece(text + n);
        if (tu_rand64() % 4000 == 0) /* now and then a word far over the limit */
            for (int k = 0; k < 300 && n < cap; k++) text[n++] = 'x';
    }
    struct wp_scratch *s = wp_scratch_new(0);
    assert_non_null(s);
    size_t idcap = n + 3;
    int32_t *ids = malloc(idcap * sizeof(*ids));
    assert_non_null(ids);
    char err[256] = "";
    size_t full = 0;
    double t0 = now_s();
    int whole = wp_encode(t, s, text, n, NULL, 0, 0, 0, ids, NULL, idcap, &full, err, sizeof(err));
    double t1 = now_s();
    if (whole < 0) fail_msg("%s", err);
    assert_int_equal((size_t)whole, full);
    size_t sum = 0, chunks = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n')) i++;
        size_t j = i;
        while (j < n && text[j] != ' ' && text[j] != '\t' && text[j] != '\n') j++;
        if (j > i) {
            int k = wp_encode(t, s, text + i, j - i, NULL, 0, 0, 0, ids, NULL, idcap, NULL, err,
                              sizeof(err));
            if (k < 0) fail_msg("chunk at %zu: %s", i, err);
            sum += (size_t)k - 2;
            chunks++;
        }
        i = j;
    }
    double t2 = now_s();
    print_message("%zu bytes: %d tokens in %.2f s whole; %zu chunks in %.2f s\n", n, whole,
                  t1 - t0, chunks, t2 - t1);
    assert_int_equal(sum + 2, (size_t)whole);
    free(ids);
    free(text);
    wp_scratch_destroy(s);
}

/* Shapes that would expose quadratic work: one 10 MB word, 10 MB of
 * combining marks on one base, 10 MB of '[' and of "[MASK" near-misses
 * for the special-token matcher, 10 MB of CJK. Each must finish and give
 * the count its structure implies. */
static void test_hostile_shapes(void **state)
{
    struct fixture *fx = *state;
    const struct wp_tokenizer *t = find_setting(fx, "uncased")->from_json;
    size_t size = 10u << 20;
    char *text = malloc(size + 8);
    assert_non_null(text);
    struct wp_scratch *s = wp_scratch_new(0);
    assert_non_null(s);
    size_t idcap = size + 3;
    int32_t *ids = malloc(idcap * sizeof(*ids));
    assert_non_null(ids);
    static const struct {
        const char *what;
        const char *unit;
        int lead_a;   /* starts with "a" (a base for the marks) */
        int per_unit; /* tokens per unit, or -1 for "one in all" */
    } shapes[] = {
        {"one long word", "a", 0, -1},
        {"combining marks", "\xcc\x81\xcc\xa3\xf0\x9d\x85\xa5\xf0\x9d\x85\xad", 1, -1},
        {"brackets", "[", 0, 1},
        {"special near-misses", "[MASK", 0, 5}, /* [ m ##a ##s ##k */
        {"specials", "[MASK]", 0, 1},
        {"CJK", "\xe4\xb8\xad", 0, 1},
    };
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        size_t ul = strlen(shapes[k].unit), n = 0, units = 0;
        if (shapes[k].lead_a) text[n++] = 'a';
        while (n + ul <= size) {
            memcpy(text + n, shapes[k].unit, ul);
            n += ul;
            units++;
        }
        char err[256] = "";
        double t0 = now_s();
        int got = wp_encode(t, s, text, n, NULL, 0, 0, 0, ids, NULL, idcap, NULL, err, sizeof(err));
        double dt = now_s() - t0;
        if (got < 0) fail_msg("%s: %s", shapes[k].what, err);
        size_t want = shapes[k].per_unit < 0 ? 1 : units * (size_t)shapes[k].per_unit;
        print_message("%s: %zu bytes, %d tokens, %.2f s\n", shapes[k].what, n, got, dt);
        assert_int_equal((size_t)got, want + 2);
    }
    free(ids);
    free(text);
    wp_scratch_destroy(s);
}

/* ---- refused files ---------------------------------------------------------- */

/* Loads path as vocab.txt (defaults) or tokenizer.json, expecting failure
 * with an error containing want. */
static void expect_refused(const char *path, int json, const char *want)
{
    char err[512] = "";
    struct wp_conf c;
    wp_conf_defaults(&c);
    struct wp_tokenizer *t = json ? wp_load_json(path, err, sizeof(err))
                                  : wp_load_vocab(path, &c, err, sizeof(err));
    if (t || !strstr(err, want)) {
        wp_destroy(t);
        fail_msg("want error containing '%s', got %s '%s'", want, t ? "success" : "error", err);
    }
}

/* Bad vocab.txt files, one broken rule each. */
static void test_bad_vocab(void **state)
{
    struct fixture *fx = *state;
    static const struct {
        const char *what, *body;
        size_t len; /* 0: strlen */
        const char *want;
    } rows[] = {
        {"empty", "", 0, "empty vocabulary"},
        {"no unk", "[PAD]\n[CLS]\n[SEP]\n[MASK]\na\n", 0, "has no unk token \"[UNK]\""},
        {"no cls", "[PAD]\n[UNK]\n[SEP]\n[MASK]\na\n", 0, "has no cls token \"[CLS]\""},
        {"no sep", "[PAD]\n[UNK]\n[CLS]\n[MASK]\na\n", 0, "has no sep token \"[SEP]\""},
        {"no mask", "[PAD]\n[UNK]\n[CLS]\n[SEP]\na\n", 0, "has no mask token \"[MASK]\""},
        {"repeat", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\na\n", 0,
         "line 8: token \"a\" repeats line 6"},
        {"repeat after trim", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\na \t\n", 0,
         "line 7: token \"a\" repeats line 6"},
        {"repeat after CR", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nb\r\nb\n", 0,
         "line 7: token \"b\" repeats line 6"},
        {"bad UTF-8", "[PAD]\n[UNK]\nab\xff\n[CLS]\n[SEP]\n[MASK]\n", 0,
         "line 3: invalid UTF-8 at byte 3"},
        {"surrogate", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n\xed\xa0\x80\n", 0,
         "line 6: invalid UTF-8 at byte 1"},
        {"NUL", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\0b\n", 35, "line 6: token holds a NUL byte"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        print_message("case: %s\n", rows[i].what);
        const char *p = write_file(fx, "bad_vocab.txt", rows[i].body,
                                   rows[i].len ? rows[i].len : strlen(rows[i].body));
        expect_refused(p, 0, rows[i].want);
    }
    /* over the size bound (a sparse file, nothing written) */
    const char *p = write_file(fx, "huge.txt", "[UNK]\n", 6);
    assert_int_equal(truncate(p, (off_t)WP_MAX_FILE_BYTES + 1), 0);
    expect_refused(p, 0, "over the 67108864-byte limit");
    expect_refused(p, 1, "over the 67108864-byte limit");
    unlink(p);
    char missing[128];
    snprintf(missing, sizeof(missing), "%s/nope.txt", fx->dir);
    expect_refused(missing, 0, "No such file");
    expect_refused(fx->dir, 1, "not a regular file");

    /* an optional pad/mask may be named "" for a vocabulary without them */
    const char *minimal = "[UNK]\n[CLS]\n[SEP]\nhi\n";
    p = write_file(fx, "minimal.txt", minimal, strlen(minimal));
    struct wp_conf c;
    wp_conf_defaults(&c);
    c.pad_token[0] = c.mask_token[0] = '\0';
    char err[256];
    struct wp_tokenizer *t = wp_load_vocab(p, &c, err, sizeof(err));
    if (!t) fail_msg("%s", err);
    assert_int_equal(wp_pad_id(t), -1);
    assert_int_equal(wp_mask_id(t), -1);
    assert_int_equal(wp_vocab_size(t), 4);
    wp_destroy(t);
}

/* A small tokenizer.json with each component replaceable, for the table of
 * refused files. */
static void make_json(char *buf, size_t n, const char *added, const char *norm, const char *pre,
                      const char *post, const char *model)
{
    snprintf(buf, n,
             "{\"version\":\"1.0\",\"added_tokens\":%s,\"normalizer\":%s,"
             "\"pre_tokenizer\":%s,\"post_processor\":%s,\"model\":%s}",
             added ? added
                   : "[{\"id\":1,\"content\":\"[UNK]\",\"single_word\":false,\"lstrip\":false,"
                     "\"rstrip\":false,\"normalized\":false,\"special\":true},"
                     "{\"id\":4,\"content\":\"[MASK]\",\"single_word\":false,\"lstrip\":false,"
                     "\"rstrip\":false,\"normalized\":false,\"special\":true}]",
             norm ? norm
                  : "{\"type\":\"BertNormalizer\",\"clean_text\":true,"
                    "\"handle_chinese_chars\":true,\"strip_accents\":null,\"lowercase\":true}",
             pre ? pre : "{\"type\":\"BertPreTokenizer\"}",
             post ? post
                  : "{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",3],\"cls\":[\"[CLS]\",2]}",
             model ? model
                   : "{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
                     "\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":100,"
                     "\"vocab\":{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"[MASK]\":4,"
                     "\"a\":5,\"##b\":6}}");
}

#define WP_MODEL(extra, vocab)                                                                  \
    "{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\"" extra \
    ",\"vocab\":" vocab "}"
#define WP_VOCAB "{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"[MASK]\":4,\"a\":5}"
#define TMPL(t1, t2)                                                                             \
    "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"[CLS]\","       \
    "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":"   \
    "\"[SEP]\",\"type_id\":0}}],\"pair\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}}," \
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\","          \
    "\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":" #t1 "}},{\"SpecialToken\":"     \
    "{\"id\":\"[SEP]\",\"type_id\":" #t2 "}}],\"special_tokens\":{\"[CLS]\":{\"id\":\"[CLS]\"," \
    "\"ids\":[2],\"tokens\":[\"[CLS]\"]},\"[SEP]\":{\"id\":\"[SEP]\",\"ids\":[3],"              \
    "\"tokens\":[\"[SEP]\"]}}}"

/* Bad tokenizer.json files, one broken rule each; then the good base file
 * and a few unusual-but-valid ones load. */
static void test_bad_json(void **state)
{
    struct fixture *fx = *state;
    static const struct {
        const char *what;
        const char *added, *norm, *pre, *post, *model;
        const char *raw; /* whole file instead */
        const char *want;
    } rows[] = {
        {"not JSON", 0, 0, 0, 0, 0, "{\"model\": ", "line 1 column"},
        {"array", 0, 0, 0, 0, 0, "[1, 2]", "not a JSON object"},
        {"BPE model", 0, 0, 0, 0,
         "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}", 0,
         "model type is \"BPE\", not WordPiece"},
        {"no model", 0, 0, 0, 0, "null", 0, "model type is \"missing\", not WordPiece"},
        {"Unigram model", 0, 0, 0, 0, "{\"type\":\"Unigram\",\"vocab\":[]}", 0,
         "model type is \"Unigram\""},
        {"empty vocab", 0, 0, 0, 0, WP_MODEL("", "{}"), 0, "model.vocab is not a non-empty object"},
        {"vocab array", 0, 0, 0, 0, WP_MODEL("", "[\"a\"]"), 0, "model.vocab is not a non-empty"},
        {"normalizer sequence", 0, "{\"type\":\"Sequence\",\"normalizers\":[]}", 0, 0, 0, 0,
         "normalizer is \"Sequence\", not BertNormalizer"},
        {"no normalizer", 0, "null", 0, 0, 0, 0, "normalizer is \"null\", not BertNormalizer"},
        {"strip_accents string", 0,
         "{\"type\":\"BertNormalizer\",\"strip_accents\":\"yes\"}", 0, 0, 0, 0,
         "normalizer.strip_accents is not null, true or false"},
        {"lowercase number", 0, "{\"type\":\"BertNormalizer\",\"lowercase\":1}", 0, 0, 0, 0,
         "normalizer.lowercase is not true or false"},
        {"whitespace pre-tokenizer", 0, 0, "{\"type\":\"Whitespace\"}", 0, 0, 0,
         "pre_tokenizer is \"Whitespace\", not BertPreTokenizer"},
        {"no pre-tokenizer", 0, 0, "null", 0, 0, 0, "pre_tokenizer is \"null\""},
        {"roberta post", 0, 0, 0,
         "{\"type\":\"RobertaProcessing\",\"sep\":[\"</s>\",2],\"cls\":[\"<s>\",0]}", 0, 0,
         "post_processor type \"RobertaProcessing\" is not BERT's"},
        {"no post", 0, 0, 0, "null", 0, 0, "post_processor is missing"},
        {"bert post malformed", 0, 0, 0, "{\"type\":\"BertProcessing\",\"sep\":\"[SEP]\"}", 0, 0,
         "post_processor.cls is not [token, id]"},
        {"template type ids", 0, 0, 0, TMPL(0, 0), 0, 0, "template is not BERT's"},
        {"template half", 0, 0, 0, TMPL(1, 0), 0, 0, "template is not BERT's"},
        {"post id mismatch", 0, 0, 0,
         "{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",5],\"cls\":[\"[CLS]\",2]}", 0, 0,
         "post_processor says [CLS]=2 and [SEP]=5, the vocabulary 2 and 3"},
        {"post token absent", 0, 0, 0,
         "{\"type\":\"BertProcessing\",\"sep\":[\"</s>\",3],\"cls\":[\"[CLS]\",2]}", 0, 0,
         "post_processor says"},
        {"no unk", "[]", 0, 0, 0,
         WP_MODEL("", "{\"[PAD]\":0,\"[CLS]\":1,\"[SEP]\":2,\"[MASK]\":3,\"a\":4}"), 0,
         "model.vocab has no unk token \"[UNK]\""},
        {"unk not string", 0, 0, 0, 0,
         "{\"type\":\"WordPiece\",\"unk_token\":5,\"vocab\":" WP_VOCAB "}", 0,
         "model.unk_token is not a string"},
        {"negative word limit", 0, 0, 0, 0, WP_MODEL(",\"max_input_chars_per_word\":-1", WP_VOCAB),
         0, "max_input_chars_per_word is not a non-negative integer"},
        {"duplicate key", 0, 0, 0, 0,
         WP_MODEL("", "{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"a\":4,\"a\":5}"), 0,
         "duplicate object key"},
        {"shared id", 0, 0, 0, 0,
         WP_MODEL("", "{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"a\":3,\"b\":4}"), 0,
         "share id 3"},
        {"id out of range", 0, 0, 0, 0,
         WP_MODEL("", "{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"a\":40}"), 0,
         "id of \"a\" is not in 0..4"},
        {"negative id", 0, 0, 0, 0,
         WP_MODEL("", "{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"a\":-1}"), 0,
         "id of \"a\" is not in 0..4"},
        {"string id", 0, 0, 0, 0,
         WP_MODEL("", "{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,\"a\":\"4\"}"), 0,
         "id of \"a\" is not in 0..4"},
        {"added id mismatch",
         "[{\"id\":7,\"content\":\"[UNK]\",\"normalized\":false,\"special\":true}]", 0, 0, 0, 0, 0,
         "added token \"[UNK]\" has id 7, the vocab says 1"},
        {"added id gap", "[{\"id\":9,\"content\":\"[NEW]\",\"normalized\":false}]", 0, 0, 0, 0, 0,
         "added token \"[NEW]\" has id 9, expected 7"},
        {"added normalized",
         "[{\"id\":7,\"content\":\"new\",\"normalized\":true,\"special\":false}]", 0, 0, 0, 0, 0,
         "added token \"new\": normalized=true is not supported"},
        {"added lstrip", "[{\"id\":4,\"content\":\"[MASK]\",\"lstrip\":true,\"normalized\":false}]",
         0, 0, 0, 0, 0, "added token \"[MASK]\": lstrip=true is not supported"},
        {"added no content", "[{\"id\":4}]", 0, 0, 0, 0, 0,
         "added_tokens[0] lacks a string content or an id"},
        {"added empty", "[{\"id\":7,\"content\":\"\",\"normalized\":false}]", 0, 0, 0, 0, 0,
         "added_tokens[0]: empty content"},
        {"added not array", "{}", 0, 0, 0, 0, 0, "added_tokens is not an array"},
    };
    char *buf = malloc(8192);
    assert_non_null(buf);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        print_message("case: %s\n", rows[i].what);
        if (rows[i].raw) snprintf(buf, 8192, "%s", rows[i].raw);
        else make_json(buf, 8192, rows[i].added, rows[i].norm, rows[i].pre, rows[i].post,
                       rows[i].model);
        expect_refused(write_file(fx, "bad.json", buf, strlen(buf)), 1, rows[i].want);
    }

    /* the base file loads; an added token beyond the vocab extends the ids
     * and is matched in text; the template form loads too */
    char err[512] = "";
    make_json(buf, 8192,
              "[{\"id\":1,\"content\":\"[UNK]\",\"normalized\":false,\"special\":true},"
              "{\"id\":7,\"content\":\"<new>\",\"normalized\":false,\"special\":false}]",
              "{\"type\":\"BertNormalizer\",\"lowercase\":false}", 0, TMPL(1, 1), 0);
    struct wp_tokenizer *t = wp_load_json(write_file(fx, "ok.json", buf, strlen(buf)), err,
                                          sizeof(err));
    if (!t) fail_msg("%s", err);
    assert_int_equal(wp_vocab_size(t), 8);
    assert_int_equal(wp_token_id(t, "<new>"), 7);
    assert_int_equal(wp_get_conf(t)->lowercase, 0);
    assert_int_equal(wp_get_conf(t)->strip_accents, -1);
    assert_int_equal(wp_get_conf(t)->clean_text, 1);
    struct wp_scratch *s = wp_scratch_new(0);
    assert_non_null(s);
    int32_t ids[16], type_ids[16];
    /* "<new>" is one token; "[MASK]" is not special here: punctuation and
     * an unknown word */
    int n = wp_encode(t, s, "ab<new>A", 8, "a", 1, 0, 0, ids, type_ids, 16, NULL, err, sizeof(err));
    static const int32_t want[] = {2, 5, 6, 7, 1, 3, 5, 3};
    static const int32_t want_t[] = {0, 0, 0, 0, 0, 0, 1, 1};
    assert_int_equal(n, 8);
    assert_memory_equal(ids, want, sizeof(want));
    assert_memory_equal(type_ids, want_t, sizeof(want_t));
    n = wp_encode(t, s, "[MASK]", 6, NULL, 0, 0, 0, ids, NULL, 16, NULL, err, sizeof(err));
    assert_int_equal(n, 5); /* [ UNK ] */
    wp_destroy(t);
    wp_scratch_destroy(s);

    /* padding.pad_id names the pad token */
    make_json(buf, 8192, 0, 0, 0, 0, 0);
    size_t l = strlen(buf);
    snprintf(buf + l - 1, 8192 - l + 1, ",\"padding\":{\"pad_id\":5,\"pad_token\":\"a\"}}");
    t = wp_load_json(write_file(fx, "pad.json", buf, strlen(buf)), err, sizeof(err));
    if (!t) fail_msg("%s", err);
    assert_int_equal(wp_pad_id(t), 5);
    assert_int_equal(wp_mask_id(t), 4);
    wp_destroy(t);
    free(buf);
}

/* tokenizer_config.json: settings and special tokens (strings, AddedToken
 * objects), the "no limit" placeholder, and wrong types refused. */
static void test_config_json(void **state)
{
    struct fixture *fx = *state;
    struct wp_conf c;
    size_t mml = 1;
    char err[512] = "";
    wp_conf_defaults(&c);
    if (wp_read_config_json(DATA "tokenizer_config_cased.json", &c, &mml, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(c.lowercase, 0);
    assert_int_equal(c.strip_accents, -1);
    assert_int_equal(c.chinese_chars, 1);
    assert_int_equal(mml, 512);
    assert_string_equal(c.unk_token, "[UNK]");
    assert_string_equal(c.mask_token, "[MASK]");
    /* with those settings the test vocabulary gives the cased goldens */
    struct wp_tokenizer *t = wp_load_vocab(DATA "vocab.txt", &c, err, sizeof(err));
    if (!t) fail_msg("%s", err);
    const struct wp_tokenizer *ref = find_setting(fx, "cased")->from_json;
    struct wp_scratch *s = wp_scratch_new(0);
    assert_non_null(s);
    int32_t a[64], b[64];
    const char *txt = "Café Ångström [MASK] 中国 İstanbul";
    int na = wp_encode(t, s, txt, strlen(txt), NULL, 0, 0, 0, a, NULL, 64, NULL, err, sizeof(err));
    int nb = wp_encode(ref, s, txt, strlen(txt), NULL, 0, 0, 0, b, NULL, 64, NULL, err, sizeof(err));
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof(int32_t));
    wp_destroy(t);
    wp_scratch_destroy(s);

    static const struct {
        const char *body;
        int ok;
        size_t mml;
        const char *want;
    } rows[] = {
        {"{\"model_max_length\": 1000000000000000019884624838656}", 1, 0, NULL},
        {"{\"model_max_length\": 1e30, \"do_lower_case\": true}", 1, 0, NULL},
        {"{\"model_max_length\": 128.0}", 1, 128, NULL},
        {"{}", 1, 0, NULL},
        {"{\"strip_accents\": false, \"tokenize_chinese_chars\": false}", 1, 0, NULL},
        {"{\"unk_token\": {\"content\": \"<unk>\", \"__type\": \"AddedToken\"}}", 1, 0, NULL},
        {"{\"model_max_length\": -1}", 0, 0, "model_max_length is not a non-negative integer"},
        {"{\"model_max_length\": 12.5}", 0, 0, "model_max_length is not a non-negative integer"},
        {"{\"model_max_length\": \"512\"}", 0, 0, "model_max_length is not"},
        {"{\"do_lower_case\": \"yes\"}", 0, 0, "config.do_lower_case is not true or false"},
        {"{\"strip_accents\": 1}", 0, 0, "strip_accents is not null, true or false"},
        {"{\"cls_token\": 7}", 0, 0, "cls_token is not a token string"},
        {"{\"sep_token\": {\"content\": 7}}", 0, 0, "sep_token is not a token string"},
        {"[]", 0, 0, "not a JSON object"},
        {"{", 0, 0, "line 1 column"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        wp_conf_defaults(&c);
        mml = 99;
        const char *p = write_file(fx, "cfg.json", rows[i].body, strlen(rows[i].body));
        int rc = wp_read_config_json(p, &c, &mml, err, sizeof(err));
        if (rows[i].ok) {
            if (rc != 0) fail_msg("%s: %s", rows[i].body, err);
            assert_int_equal(mml, rows[i].mml);
        } else if (rc == 0 || !strstr(err, rows[i].want)) {
            fail_msg("%s: want '%s', got %d '%s'", rows[i].body, rows[i].want, rc, err);
        } else {
            assert_int_equal(mml, 99); /* untouched on failure */
        }
    }
    wp_conf_defaults(&c);
    const char *p = write_file(fx, "cfg.json", rows[4].body, strlen(rows[4].body));
    assert_int_equal(wp_read_config_json(p, &c, NULL, err, sizeof(err)), 0);
    assert_int_equal(c.strip_accents, 0);
    assert_int_equal(c.chinese_chars, 0);
    assert_int_equal(c.lowercase, 1);
    p = write_file(fx, "cfg.json", rows[5].body, strlen(rows[5].body));
    assert_int_equal(wp_read_config_json(p, &c, NULL, err, sizeof(err)), 0);
    assert_string_equal(c.unk_token, "<unk>");
}

/* ---- threads ------------------------------------------------------------------ */

#define THREAD_CAP 512 /* entries per golden case; the longest is far shorter */

struct thread_arg {
    struct fixture *fx;
    int32_t *out; /* THREAD_CAP per case */
    int *n;
    int rounds;
};

/* Encodes every golden case with the shared uncased/cased tokenizers,
 * each thread with its own scratch, several rounds over. */
static void *thread_main(void *p)
{
    struct thread_arg *a = p;
    struct wp_scratch *s = wp_scratch_new(0);
    if (!s) return NULL;
    int32_t type_ids[THREAD_CAP];
    for (int r = 0; r < a->rounds; r++) {
        for (size_t i = 0; i < a->fx->n_g; i++) {
            const struct golden *g = &a->fx->g[i];
            const struct wp_tokenizer *t = NULL;
            for (size_t k = 0; k < a->fx->n_set; k++)
                if (strcmp(a->fx->set[k].name, g->setting) == 0) t = a->fx->set[k].from_json;
            char err[128];
            a->n[i] = encode_case(t, s, g, a->out + i * THREAD_CAP, type_ids, THREAD_CAP, err,
                                  sizeof(err));
        }
    }
    wp_scratch_destroy(s);
    return NULL;
}

/* Four threads sharing the tokenizers give exactly the single-threaded
 * ids (and ThreadSanitizer builds see no race). */
static void test_threads(void **state)
{
    struct fixture *fx = *state;
    enum { NT = 4 };
    struct thread_arg args[NT + 1];
    pthread_t th[NT];
    for (int i = 0; i <= NT; i++) {
        args[i].fx = fx;
        args[i].out = calloc(fx->n_g * THREAD_CAP, sizeof(int32_t));
        args[i].n = calloc(fx->n_g, sizeof(int));
        args[i].rounds = i == NT ? 1 : 3;
        assert_non_null(args[i].out);
        assert_non_null(args[i].n);
    }
    thread_main(&args[NT]);
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < NT; i++) {
        for (size_t c = 0; c < fx->n_g; c++) {
            assert_int_equal(args[i].n[c], args[NT].n[c]);
            assert_true(args[i].n[c] > 0);
            assert_memory_equal(args[i].out + c * THREAD_CAP, args[NT].out + c * THREAD_CAP,
                                (size_t)args[i].n[c] * sizeof(int32_t));
        }
    }
    for (int i = 0; i <= NT; i++) {
        free(args[i].out);
        free(args[i].n);
    }
}

/* Small API points: defaults, NULL destroys, wp_normalize on known text,
 * scratch reuse across very different sizes. */
static void test_api(void **state)
{
    struct fixture *fx = *state;
    struct wp_conf c;
    wp_conf_defaults(&c);
    assert_int_equal(c.lowercase, 1);
    assert_int_equal(c.strip_accents, -1);
    assert_int_equal(c.max_word_chars, 100);
    assert_string_equal(c.prefix, "##");
    wp_destroy(NULL);
    wp_scratch_destroy(NULL);
    const struct wp_tokenizer *t = find_setting(fx, "uncased")->from_vocab;
    struct wp_scratch *s = wp_scratch_new(1 << 20);
    assert_non_null(s);
    static const struct {
        const char *in, *out;
    } rows[] = {
        {"Héllo\tWorld", "hello world"},
        {"a\0b\xef\xbf\xbd" "c", "abc"},
        {"中文x", " 中  文 x"},
        {"\xc4\xb0", "i"},
        {"ΟΔΟΣ", "οδοσ"},
        {"e\xcc\x81\xcc\xa3", "e"},
        {"\xe2\x80\x8bzw", "zw"},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        size_t inl = i == 1 ? 7 : strlen(rows[i].in), ol = 0;
        char err[128];
        const char *o = wp_normalize(t, s, rows[i].in, inl, &ol, err, sizeof(err));
        assert_non_null(o);
        assert_int_equal(ol, strlen(rows[i].out));
        assert_memory_equal(o, rows[i].out, ol);
    }
    /* canonical ordering of a long run (the counting-sort path): U+1D16D
     * (class 226) and U+1D165 (class 216) alternating 40 times after a
     * base come out as all the 216s then all the 226s; the marks of class
     * 230 between them are dropped */
    char in[1024], want[1024];
    size_t il = 0, wl = 0;
    memcpy(in, "\xf0\x9d\x85\x98", 4); /* U+1D158 */
    memcpy(want, in, 4);
    il = wl = 4;
    for (int k = 0; k < 40; k++) {
        memcpy(in + il, "\xf0\x9d\x85\xad\xcc\x81\xf0\x9d\x85\xa5", 10);
        il += 10;
    }
    for (int k = 0; k < 40; k++, wl += 4) memcpy(want + wl, "\xf0\x9d\x85\xa5", 4);
    for (int k = 0; k < 40; k++, wl += 4) memcpy(want + wl, "\xf0\x9d\x85\xad", 4);
    size_t ol = 0;
    char err[128];
    const char *o = wp_normalize(t, s, in, il, &ol, err, sizeof(err));
    assert_non_null(o);
    assert_int_equal(ol, wl);
    assert_memory_equal(o, want, wl);
    wp_scratch_destroy(s);
}

/* Seeds the generator (printed, replayable) and runs the group. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_vocab),  cmocka_unit_test(test_golden_json),
        cmocka_unit_test(test_json_settings), cmocka_unit_test(test_unicode_sweep),
        cmocka_unit_test(test_invalid_utf8),  cmocka_unit_test(test_limits),
        cmocka_unit_test(test_big_random),    cmocka_unit_test(test_hostile_shapes),
        cmocka_unit_test(test_bad_vocab),     cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_config_json),   cmocka_unit_test(test_threads),
        cmocka_unit_test(test_api),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

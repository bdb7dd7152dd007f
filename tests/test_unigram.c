/* test_unigram.c - text/unigram against Hugging Face's tokenizers: every
 * golden case of tests/data/unigram/golden.json (written by
 * tests/golden/unigram_golden.js from the `tokenizers` npm package, over
 * the tokenizer.json files tests/golden/unigram_spm.py made from
 * SentencePiece-trained models: XLM-R's Precompiled nmt_nfkc charsmap and
 * template, byte fallback, RobertaProcessing) id for id and type id for
 * type id through tokenizer.h, every golden decoding byte for byte, every
 * golden normalization, every code point through the charsmap
 * (charsmap.tsv) and with marks after it (graphemes.tsv); then what the goldens cannot show: invalid UTF-8,
 * length limits and buffers, refused files, long and hostile inputs.
 *
 * Runs from the repository root (as make test does). Single-threaded but
 * for test_threads; bad files live in a temporary directory that the
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
#include <sys/stat.h>
#include <unistd.h>

#include "../text/tokenizer.h"
#include "../text/unigram.h"
#include "testutil.h"

#define DATA "tests/data/unigram/"
#define N_TOK 3

static const char *const tok_names[N_TOK] = {"xlmr", "bytefb", "plain"};

struct fixture {
    char dir[64];
    json_t *root;
    struct tokenizer *tok[N_TOK];
    struct ug_tokenizer *ug[N_TOK]; /* the same files through unigram.h */
    json_t *ugjson[N_TOK];
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

/* UTF-8 of a scalar value into out (4 bytes of room); its length. */
static size_t uni_utf8_encode_test(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int tok_index(const char *name)
{
    for (int i = 0; i < N_TOK; i++)
        if (strcmp(tok_names[i], name) == 0) return i;
    return -1;
}

static int group_setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    if (!fx) return -1;
    snprintf(fx->dir, sizeof(fx->dir), "/tmp/kinfer_ug_XXXXXX");
    if (!mkdtemp(fx->dir)) return -1;
    json_error_t jerr;
    fx->root = json_load_file(DATA "golden.json", JSON_ALLOW_NUL, &jerr);
    if (!fx->root) {
        fprintf(stderr, "%s: %s (run from the repository root)\n", DATA "golden.json", jerr.text);
        return -1;
    }
    for (int i = 0; i < N_TOK; i++) {
        char dir[256], path[300], err[512] = "";
        snprintf(dir, sizeof(dir), DATA "%s", tok_names[i]);
        fx->tok[i] = tokenizer_load(dir, NULL, err, sizeof(err));
        if (!fx->tok[i]) {
            fprintf(stderr, "%s: %s\n", dir, err);
            return -1;
        }
        snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
        fx->ugjson[i] = json_load_file(path, 0, &jerr);
        if (!fx->ugjson[i]) return -1;
        fx->ug[i] = ug_from_json(fx->ugjson[i], path, err, sizeof(err));
        if (!fx->ug[i]) {
            fprintf(stderr, "%s: %s\n", path, err);
            return -1;
        }
    }
    fprintf(stderr, "golden: reference %s\n",
            json_string_value(json_object_get(fx->root, "reference")));
    *state = fx;
    return 0;
}

static int group_teardown(void **state)
{
    struct fixture *fx = *state;
    for (int i = 0; i < N_TOK; i++) {
        tokenizer_destroy(fx->tok[i]);
        ug_destroy(fx->ug[i]);
        json_decref(fx->ugjson[i]);
    }
    json_decref(fx->root);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fx->dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", fx->dir);
    free(fx);
    return 0;
}

/* Writes ids as "[1, 2, 3]" into out. */
static void show_ids(const int32_t *v, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && o + 16 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%d", i ? " " : "", v[i]);
}

/* Every encoding golden, through tokenizer.h. */
static void test_goldens(void **state)
{
    struct fixture *fx = *state;
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    assert_non_null(s);
    const json_t *cases = json_object_get(fx->root, "cases");
    size_t bad = 0, n = json_array_size(cases);
    int32_t ids[4096], tids[4096];
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(cases, i);
        int k = tok_index(json_string_value(json_object_get(c, "tok")));
        assert_true(k >= 0);
        const json_t *tx = json_object_get(c, "text"), *pr = json_object_get(c, "pair");
        const json_t *want = json_object_get(c, "ids"), *wt = json_object_get(c, "type_ids");
        size_t max_len = (size_t)json_integer_value(json_object_get(c, "max_len"));
        char err[256] = "";
        size_t full = 0;
        int got = tokenizer_encode(fx->tok[k], s, json_string_value(tx), json_string_length(tx),
                                   json_is_string(pr) ? json_string_value(pr) : NULL,
                                   json_is_string(pr) ? json_string_length(pr) : 0, max_len,
                                   max_len != 0, ids, tids, 4096, &full, err, sizeof(err));
        int ok = got >= 0 && (size_t)got == json_array_size(want);
        for (size_t j = 0; ok && j < (size_t)got; j++)
            ok = ids[j] == json_integer_value(json_array_get(want, j)) &&
                 tids[j] == (wt ? json_integer_value(json_array_get(wt, j)) : 0);
        if (!ok && bad++ < 20) {
            char t1[512], g1[2048], w1[2048];
            int32_t wv[1024];
            size_t wn = json_array_size(want) < 1024 ? json_array_size(want) : 1024;
            for (size_t j = 0; j < wn; j++) wv[j] = (int32_t)json_integer_value(json_array_get(want, j));
            show(json_string_value(tx), json_string_length(tx), t1, sizeof(t1));
            show_ids(ids, got > 0 ? (size_t)got : 0, g1, sizeof(g1));
            show_ids(wv, wn, w1, sizeof(w1));
            fprintf(stderr, "MISMATCH %s \"%s\"%s max_len %zu: rc %d %s\n  got  %s\n  want %s\n",
                    tok_names[k], t1, json_is_string(pr) ? " (pair)" : "", max_len, got, err, g1,
                    w1);
        }
    }
    tokenizer_scratch_destroy(s);
    fprintf(stderr, "goldens: %zu cases, %zu mismatches\n", n, bad);
    assert_int_equal(bad, 0);
}

/* Every decoding golden. */
static void test_decodes(void **state)
{
    struct fixture *fx = *state;
    const json_t *dec = json_object_get(fx->root, "decodes");
    size_t bad = 0, n = json_array_size(dec);
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(dec, i);
        int k = tok_index(json_string_value(json_object_get(c, "tok")));
        const json_t *a = json_object_get(c, "ids"), *w = json_object_get(c, "text");
        int32_t ids[1024];
        size_t m = json_array_size(a);
        assert_true(m <= 1024);
        for (size_t j = 0; j < m; j++) ids[j] = (int32_t)json_integer_value(json_array_get(a, j));
        char buf[8192];
        int got = tokenizer_decode(fx->tok[k], ids, m, buf, sizeof(buf));
        if (got < 0 || (size_t)got != json_string_length(w) ||
            memcmp(buf, json_string_value(w), (size_t)got) != 0) {
            if (bad++ < 20) {
                char g1[1024], w1[1024], i1[1024];
                show(buf, got > 0 ? (size_t)got : 0, g1, sizeof(g1));
                show(json_string_value(w), json_string_length(w), w1, sizeof(w1));
                show_ids(ids, m, i1, sizeof(i1));
                fprintf(stderr, "DECODE %s [%s]: rc %d\n  got  \"%s\"\n  want \"%s\"\n",
                        tok_names[k], i1, got, g1, w1);
            }
        }
    }
    fprintf(stderr, "decodes: %zu, %zu mismatches\n", n, bad);
    assert_int_equal(bad, 0);
}

/* Every normalization golden (the normalizer alone). */
static void test_normalize(void **state)
{
    struct fixture *fx = *state;
    struct ug_scratch *s = ug_scratch_new(0);
    assert_non_null(s);
    const json_t *nz = json_object_get(fx->root, "normalize");
    size_t bad = 0, n = json_array_size(nz);
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(nz, i);
        int k = tok_index(json_string_value(json_object_get(c, "tok")));
        const json_t *tx = json_object_get(c, "text"), *w = json_object_get(c, "normalized");
        size_t ol = 0;
        char err[256];
        const char *got = ug_normalize(fx->ug[k], s, json_string_value(tx),
                                       json_string_length(tx), &ol, err, sizeof(err));
        if (!got || ol != json_string_length(w) || memcmp(got, json_string_value(w), ol) != 0) {
            if (bad++ < 20) {
                char g1[1024], w1[1024], t1[1024];
                show(got ? got : "", got ? ol : 0, g1, sizeof(g1));
                show(json_string_value(w), json_string_length(w), w1, sizeof(w1));
                show(json_string_value(tx), json_string_length(tx), t1, sizeof(t1));
                fprintf(stderr, "NORMALIZE %s \"%s\"\n  got  \"%s\"\n  want \"%s\"\n",
                        tok_names[k], t1, g1, w1);
            }
        }
    }
    ug_scratch_destroy(s);
    fprintf(stderr, "normalize: %zu, %zu mismatches\n", n, bad);
    assert_int_equal(bad, 0);
}

/* Every scalar value alone through tokenizer k's normalizer against the
 * reference's sweep in file; returns the mismatches (the first 20
 * printed). */
static size_t check_sweep(struct fixture *fx, const char *file, int k_tok)
{
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    struct run {
        uint32_t lo, hi;
        char mode;
        uint32_t v[24];
        int nv;
    } *runs = calloc(8192, sizeof(*runs));
    assert_non_null(runs);
    size_t nr = 0;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#') continue;
        assert_true(nr < 8192);
        struct run *r = &runs[nr++];
        char *p = line, *e;
        r->lo = (uint32_t)strtoul(p, &e, 16);
        r->hi = (uint32_t)strtoul(e, &p, 16);
        while (*p == '\t') p++;
        r->mode = *p++;
        while (r->mode != '-' && *p && *p != '\n') {
            assert_true(r->nv < 24);
            r->v[r->nv++] = (uint32_t)strtoul(p, &e, 16);
            if (e == p) break;
            p = e;
        }
    }
    fclose(f);
    struct ug_scratch *s = ug_scratch_new(0);
    size_t k = 0, bad = 0, checked = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char in[4], want[64];
        size_t wl = 0, il = uni_utf8_encode_test(cp, in);
        while (k < nr && runs[k].hi < cp) k++;
        if (k < nr && runs[k].lo <= cp) {
            const struct run *r = &runs[k];
            for (int i = 0; i < r->nv; i++) {
                uint32_t v = r->v[i];
                if (i == r->nv - 1 && r->mode == '+') v += cp - r->lo;
                wl += uni_utf8_encode_test(v, want + wl);
            }
        } else {
            memcpy(want, in, il);
            wl = il;
        }
        size_t ol = 0;
        const char *got = ug_normalize(fx->ug[k_tok], s, in, il, &ol, NULL, 0);
        checked++;
        if (!got || ol != wl || memcmp(got, want, wl) != 0) {
            if (bad++ < 20) {
                char g1[128], w1[128];
                show(got ? got : "", got ? ol : 0, g1, sizeof(g1));
                show(want, wl, w1, sizeof(w1));
                fprintf(stderr, "%s U+%04X: got \"%s\" want \"%s\"\n", file, cp, g1, w1);
            }
        }
    }
    ug_scratch_destroy(s);
    free(runs);
    fprintf(stderr, "%s: %zu code points, %zu runs, %zu mismatches\n", file, checked, nr, bad);
    return bad;
}

/* Every scalar value through xlmr's normalizer (Precompiled nmt_nfkc). */
static void test_charsmap(void **state)
{
    assert_int_equal(check_sweep(*state, DATA "charsmap.tsv", 0), 0);
}

/* Every scalar value through plain's normalizer (NFKC). */
static void test_nfkc(void **state)
{
    assert_int_equal(check_sweep(*state, DATA "nfkc.tsv", 2), 0);
}

/* Hex digits into bytes; returns the count. */
static size_t unhex(const char *h, char *out, size_t cap)
{
    size_t n = 0;
    while (h[0] && h[1] && n < cap && h[0] != '\n' && h[0] != '\t') {
        unsigned v;
        if (sscanf(h, "%2x", &v) != 1) break;
        out[n++] = (char)v;
        h += 2;
    }
    return n;
}

/* A mapped character and a mark in one grapheme: the reference maps the
 * grapheme by its first character (graphemes.tsv: a hash per mark over
 * every mapped code point, Hangul jamo and every 97th syllable, and
 * examples). */
static void test_graphemes(void **state)
{
    struct fixture *fx = *state;
    FILE *f = fopen(DATA "graphemes.tsv", "r");
    assert_non_null(f);
    struct ug_scratch *s = ug_scratch_new(0);
    uint32_t *set = malloc(0x110000 * sizeof(*set));
    assert_non_null(set);
    size_t nset = 0;
    for (uint32_t cp = 1; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char in[4];
        size_t il = uni_utf8_encode_test(cp, in), ol = 0;
        const char *o = ug_normalize(fx->ug[0], s, in, il, &ol, NULL, 0);
        assert_non_null(o);
        if ((ol != il || memcmp(o, in, il) != 0) || (cp >= 0x1100 && cp <= 0x11FF) ||
            (cp >= 0x3130 && cp <= 0x318F) ||
            (cp >= 0xAC00 && cp <= 0xD7A3 && (cp - 0xAC00) % 97 == 0))
            set[nset++] = cp;
    }
    char line[512];
    size_t marks = 0, exs = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "mark\t", 5) == 0) {
            char mk[32], m[16];
            size_t want_n = 0, ml = 0;
            unsigned long long want_h = 0;
            assert_int_equal(sscanf(line + 5, "%31[^\t]\t%zu\t%llx", mk, &want_n, &want_h), 3);
            for (char *p = mk; *p;) {
                char *e;
                unsigned long v = strtoul(p, &e, 16);
                if (e == p) break;
                ml += uni_utf8_encode_test((uint32_t)v, m + ml);
                p = e;
            }
            assert_int_equal(nset, want_n);
            uint64_t h = 0xcbf29ce484222325ull;
            for (size_t i = 0; i < nset; i++) {
                char in[32];
                size_t il = uni_utf8_encode_test(set[i], in), ol = 0;
                memcpy(in + il, m, ml);
                const char *o = ug_normalize(fx->ug[0], s, in, il + ml, &ol, NULL, 0);
                assert_non_null(o);
                for (size_t k = 0; k <= ol; k++) {
                    unsigned char b = k < ol ? (unsigned char)o[k] : 0xFF;
                    h = (h ^ b) * 0x100000001b3ull;
                }
            }
            if (h != (uint64_t)want_h) fail_msg("mark %s: hash %016llx, want %016llx", mk,
                                                (unsigned long long)h, want_h);
            marks++;
        } else if (strncmp(line, "ex\t", 3) == 0) {
            char in[64], want[64];
            char *tab = strchr(line + 3, '\t');
            assert_non_null(tab);
            size_t il = unhex(line + 3, in, sizeof(in)), wl = unhex(tab + 1, want, sizeof(want));
            size_t ol = 0;
            const char *o = ug_normalize(fx->ug[0], s, in, il, &ol, NULL, 0);
            assert_non_null(o);
            if (ol != wl || memcmp(o, want, wl) != 0) fail_msg("example %s", line);
            exs++;
        }
    }
    fclose(f);
    free(set);
    ug_scratch_destroy(s);
    fprintf(stderr, "graphemes: %zu marks over %zu code points, %zu examples\n", marks, nset, exs);
    assert_true(marks >= 5);
}

/* The interface's view: kind, sizes, specials, lookups. */
static void test_interface(void **state)
{
    struct fixture *fx = *state;
    struct tokenizer *x = fx->tok[0];
    assert_string_equal(tokenizer_kind_name(x), "Unigram");
    size_t n = tokenizer_vocab_size(x);
    assert_int_equal(tokenizer_special_id(x, TOKENIZER_CLS), 0);
    assert_int_equal(tokenizer_special_id(x, TOKENIZER_PAD), 1);
    assert_int_equal(tokenizer_special_id(x, TOKENIZER_SEP), 2);
    assert_int_equal(tokenizer_special_id(x, TOKENIZER_UNK), 3);
    assert_int_equal(tokenizer_special_id(x, TOKENIZER_MASK), (int32_t)n - 1);
    assert_string_equal(tokenizer_id_token(x, (int32_t)n - 1), "<mask>");
    assert_null(tokenizer_id_token(x, (int32_t)n));
    assert_null(tokenizer_id_token(x, -1));
    assert_int_equal(tokenizer_token_id(x, "</s>"), 2);
    assert_int_equal(tokenizer_token_id(x, "no such piece"), -1);
    for (int32_t id = 0; id < (int32_t)n; id++)
        assert_int_equal(tokenizer_token_id(x, tokenizer_id_token(x, id)), id);
    /* bytefb: a template with <s> only */
    assert_int_equal(tokenizer_special_id(fx->tok[1], TOKENIZER_CLS), 1);
    assert_int_equal(tokenizer_special_id(fx->tok[1], TOKENIZER_SEP), -1);
    assert_int_equal(tokenizer_special_id(fx->tok[1], TOKENIZER_MASK), -1);
    assert_int_equal(tokenizer_max_tokens(x), 0);
}

/* Invalid UTF-8 in the text or the pair: refused with the offset, for
 * every tokenizer; a scratch that saw an error still works. */
static void test_utf8(void **state)
{
    struct fixture *fx = *state;
    static const struct {
        const char *s;
        size_t n, at;
    } bad[] = {
        {"abc\xff", 4, 3},          {"\xc3", 1, 0},         {"a\xc0\xafz", 4, 1},
        {"\xed\xa0\x80", 3, 0},     {"x\xf4\x90\x80\x80", 5, 1}, {"ok \xe3\x81", 5, 3},
        {"<s>\x80</s>", 8, 3},      {"\xf0\x9f\x98", 3, 0},
    };
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    int32_t ids[64];
    for (int k = 0; k < N_TOK; k++) {
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            char err[256] = "", want[64];
            size_t full = 12345;
            int rc = tokenizer_encode(fx->tok[k], s, bad[i].s, bad[i].n, NULL, 0, 0, 0, ids, NULL,
                                      64, &full, err, sizeof(err));
            assert_int_equal(rc, TOKENIZER_ERR_UTF8);
            snprintf(want, sizeof(want), "at byte %zu", bad[i].at);
            if (!strstr(err, want)) fail_msg("%s: \"%s\" lacks \"%s\"", tok_names[k], err, want);
            rc = tokenizer_encode(fx->tok[k], s, "fine", 4, bad[i].s, bad[i].n, 0, 0, ids, NULL,
                                  64, NULL, err, sizeof(err));
            assert_int_equal(rc, TOKENIZER_ERR_UTF8);
            assert_non_null(strstr(err, "pair"));
        }
        assert_true(tokenizer_encode(fx->tok[k], s, "fine", 4, NULL, 0, 0, 0, ids, NULL, 64, NULL,
                                     NULL, 0) > 0);
    }
    tokenizer_scratch_destroy(s);
}

/* Empty text, NULL with length 0, limits, small buffers, bad arguments. */
static void test_limits(void **state)
{
    struct fixture *fx = *state;
    struct tokenizer *x = fx->tok[0];
    struct tokenizer_scratch *s = tokenizer_scratch_new(16);
    int32_t ids[64], tids[64];
    char err[256];
    size_t full = 0;
    assert_int_equal(tokenizer_encode(x, s, "", 0, NULL, 0, 0, 0, ids, tids, 64, &full, err,
                                      sizeof(err)), 2);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 2);
    assert_int_equal(tokenizer_encode(x, s, NULL, 0, "", 0, 0, 0, ids, tids, 64, &full, err,
                                      sizeof(err)), 4);
    const char *t = "the quick brown fox jumps over the lazy dog";
    int n = tokenizer_encode(x, s, t, strlen(t), NULL, 0, 0, 0, ids, tids, 64, &full, err,
                             sizeof(err));
    assert_true(n > 8);
    assert_int_equal(full, (size_t)n);
    assert_int_equal(tokenizer_encode(x, s, t, strlen(t), NULL, 0, 5, 0, ids, tids, 64, &full, err,
                                      sizeof(err)), TOKENIZER_ERR_TOO_LONG);
    assert_int_equal(full, (size_t)n);
    assert_non_null(strstr(err, "over the limit of 5"));
    assert_int_equal(tokenizer_encode(x, s, t, strlen(t), NULL, 0, 5, 1, ids, tids, 64, &full, err,
                                      sizeof(err)), 5);
    assert_int_equal(ids[4], 2);
    assert_int_equal(tokenizer_encode(x, s, t, strlen(t), "b", 1, 3, 1, ids, tids, 64, &full, err,
                                      sizeof(err)), TOKENIZER_ERR_ARG);
    assert_int_equal(tokenizer_encode(x, s, t, strlen(t), NULL, 0, 0, 0, ids, tids, 4, &full, err,
                                      sizeof(err)), TOKENIZER_ERR_CAP);
    assert_int_equal(tokenizer_encode(x, s, NULL, 3, NULL, 0, 0, 0, ids, tids, 4, &full, err,
                                      sizeof(err)), TOKENIZER_ERR_ARG);
    /* decode: an id out of range; a short buffer gets a cut copy */
    int32_t oob[] = {5, (int32_t)tokenizer_vocab_size(x)};
    char buf[8];
    assert_int_equal(tokenizer_decode(x, oob, 2, buf, sizeof(buf)), TOKENIZER_ERR_ARG);
    n = tokenizer_encode(x, s, t, strlen(t), NULL, 0, 0, 0, ids, NULL, 64, NULL, NULL, 0);
    int d = tokenizer_decode(x, ids, (size_t)n, buf, sizeof(buf));
    assert_int_equal(d, (int)strlen(t));
    assert_int_equal(strlen(buf), sizeof(buf) - 1);
    assert_memory_equal(buf, t, sizeof(buf) - 1);
    assert_int_equal(tokenizer_decode(x, ids, (size_t)n, NULL, 0), (int)strlen(t));
    tokenizer_scratch_destroy(s);
}

/* Long and hostile inputs: one 4 MB word for each tokenizer (no spaces:
 * the lattice spans it all), megabytes of combining marks, of unknown
 * characters, of added tokens and of spaces, each within a time bound;
 * a short text still encodes after each. */
static void test_long(void **state)
{
    struct fixture *fx = *state;
    size_t big = 4u << 20;
    char *text = malloc(big + 8);
    int32_t *ids = malloc((big + 16) * sizeof(int32_t));
    assert_non_null(text);
    assert_non_null(ids);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    /* ... and marks of alternating combining classes (230, 220), which a
     * canonical ordering by insertion would take quadratic time over */
    static const char *const unit[] = {"ab", "\xe0\xb6\x9e", "e\xcc\x81", "<mask>", " ",
                                       "\xf0\x9f\x98\x80x", "hello", "\xcc\x81\xcc\x96"};
    for (int k = 0; k < N_TOK; k++) {
        for (size_t u = 0; u < sizeof(unit) / sizeof(unit[0]); u++) {
            size_t ul = strlen(unit[u]), n = 0;
            size_t lim = u == 2 || u == 3 || u == 7 ? (1u << 20) : big;
            while (n + ul <= lim) {
                memcpy(text + n, unit[u], ul);
                n += ul;
            }
            clock_t c0 = clock();
            char err[256] = "";
            int rc = tokenizer_encode(fx->tok[k], s, text, n, NULL, 0, 0, 0, ids, NULL, big + 16,
                                      NULL, err, sizeof(err));
            double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
            if (rc < 0) fail_msg("%s unit %zu: %d %s", tok_names[k], u, rc, err);
            if (secs > 20) fail_msg("%s unit %zu: %.1f s", tok_names[k], u, secs);
            /* a short text is still right after the big one */
            int32_t a[64];
            assert_true(tokenizer_encode(fx->tok[k], s, "hello", 5, NULL, 0, 0, 0, a, NULL, 64,
                                         NULL, NULL, 0) > 0);
        }
    }
    /* "ඞ" (no piece) repeated: the fused unknowns make one unk per word */
    int32_t a[64];
    int n = tokenizer_encode(fx->tok[0], s, "\xe0\xb6\x9e\xe0\xb6\x9e\xe0\xb6\x9e", 9, NULL, 0, 0,
                             0, a, NULL, 64, NULL, NULL, 0);
    assert_true(n >= 3);
    assert_int_equal(a[n - 2], 3);
    tokenizer_scratch_destroy(s);
    free(text);
    free(ids);
}

/* A 2 MB word grows the lattice to 2M entries; the call gives it back. */
static void test_lattice_given_back(void **state)
{
    struct fixture *fx = *state;
    size_t n = 2u << 20;
    char *text = malloc(n);
    int32_t *ids = malloc((n + 8) * sizeof(int32_t));
    assert_non_null(text);
    assert_non_null(ids);
    memset(text, 'a', n);
    struct ug_scratch *s = ug_scratch_new(0);
    for (int k = 0; k < N_TOK; k++) {
        char err[256] = "";
        int rc = ug_encode(fx->ug[k], s, text, n, NULL, 0, 0, 0, ids, NULL, n + 8, NULL, err,
                           sizeof(err));
        if (rc < 0) fail_msg("%s: %s", tok_names[k], err);
        assert_true(ug_scratch_lattice(s) <= UG_LATTICE_KEEP);
        rc = ug_encode(fx->ug[k], s, "aaaa", 4, NULL, 0, 0, 0, ids, NULL, 16, NULL, err,
                       sizeof(err));
        assert_true(rc > 0);
        assert_true(ug_scratch_lattice(s) > 0);
    }
    ug_scratch_destroy(s);
    free(text);
    free(ids);
}

/* Writes text to dir/name. */
static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Files that are refused, and what the message says. */
static void test_refused(void **state)
{
    struct fixture *fx = *state;
#define V "\"vocab\": [[\"<unk>\", 0], [\"a\", -1], [\"b\", -2]]"
    static const struct {
        const char *what, *json, *want;
    } rows[] = {
        {"a null unk_id", "{\"model\": {\"type\": \"Unigram\", \"unk_id\": null, " V "}}",
         "a null unk_id is not supported"},
        {"a repeated piece",
         "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0], "
         "[\"a\", -1], [\"a\", -2]]}}", "repeats the piece \"a\""},
        {"a piece without score",
         "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\"]]}}",
         "model.vocab[0] is not [piece, score]"},
        {"an NFD normalizer", "{\"normalizer\": {\"type\": \"NFD\"}, \"model\": {\"type\": "
         "\"Unigram\", \"unk_id\": 0, " V "}}", "normalizer \"NFD\" is not supported"},
        {"a Replace regex", "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": "
         "\"a+\"}, \"content\": \"b\"}, \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, " V "}}",
         "normalizer Replace has settings"},
        {"a charsmap that is not base64", "{\"normalizer\": {\"type\": \"Precompiled\", "
         "\"precompiled_charsmap\": \"***\"}, \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, "
         V "}}", "not base64"},
        {"a charsmap too short", "{\"normalizer\": {\"type\": \"Precompiled\", "
         "\"precompiled_charsmap\": \"/////wAAAAA=\"}, \"model\": {\"type\": \"Unigram\", "
         "\"unk_id\": 0, " V "}}", "does not fit"},
        {"a ByteLevel pre-tokenizer", "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": "
         "{\"type\": \"Unigram\", \"unk_id\": 0, " V "}}", "pre-tokenizer \"ByteLevel\""},
        {"a normalized added token", "{\"added_tokens\": [{\"id\": 3, \"content\": \"xyz\", "
         "\"normalized\": true}], \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, " V "}}",
         "normalized true is not supported"},
        {"an added token that disagrees", "{\"added_tokens\": [{\"id\": 1, \"content\": \"xyz\"}],"
         " \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, " V "}}", "in the vocabulary"},
        {"a gap past the vocabulary", "{\"added_tokens\": [{\"id\": 5, \"content\": \"xyz\"}],"
         " \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, " V "}}", "unused"},
        {"a template without $B", "{\"post_processor\": {\"type\": \"TemplateProcessing\", "
         "\"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"Sequence\":"
         " {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {}}, \"model\": {\"type\": "
         "\"Unigram\", \"unk_id\": 0, " V "}}", "needs $A and $B"},
    };
#undef V
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char dir[128], err[512] = "";
        snprintf(dir, sizeof(dir), "%s/bad%zu", fx->dir, i);
        assert_int_equal(mkdir(dir, 0700), 0);
        write_file(dir, "tokenizer.json", rows[i].json);
        struct tokenizer *t = tokenizer_load(dir, NULL, err, sizeof(err));
        if (t) fail_msg("%s: loaded", rows[i].what);
        if (!strstr(err, rows[i].want) || !strstr(err, "tokenizer.json"))
            fail_msg("%s: message \"%s\" lacks \"%s\"", rows[i].what, err, rows[i].want);
        printf("  %-36s %s\n", rows[i].what, err);
    }
}

/* Four threads share one tokenizer, each with its own scratch, over every
 * golden case of xlmr; each result must be the golden's. */
struct thr_arg {
    struct fixture *fx;
    size_t bad;
};

static void *thr_main(void *p)
{
    struct thr_arg *a = p;
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    const json_t *cases = json_object_get(a->fx->root, "cases");
    int32_t ids[4096];
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const json_t *c = json_array_get(cases, i);
            int k = tok_index(json_string_value(json_object_get(c, "tok")));
            const json_t *tx = json_object_get(c, "text"), *pr = json_object_get(c, "pair");
            const json_t *want = json_object_get(c, "ids");
            size_t max_len = (size_t)json_integer_value(json_object_get(c, "max_len"));
            int got = tokenizer_encode(a->fx->tok[k], s, json_string_value(tx),
                                       json_string_length(tx),
                                       json_is_string(pr) ? json_string_value(pr) : NULL,
                                       json_is_string(pr) ? json_string_length(pr) : 0, max_len,
                                       max_len != 0, ids, NULL, 4096, NULL, NULL, 0);
            int ok = got >= 0 && (size_t)got == json_array_size(want);
            for (size_t j = 0; ok && j < (size_t)got; j++)
                ok = ids[j] == json_integer_value(json_array_get(want, j));
            a->bad += !ok;
        }
    }
    tokenizer_scratch_destroy(s);
    return NULL;
}

static void test_threads(void **state)
{
    struct fixture *fx = *state;
    pthread_t th[4];
    struct thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr_arg){fx, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    size_t bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    assert_int_equal(bad, 0);
}

/* A minimal file: no normalizer, pre-tokenizer, post-processor or decoder;
 * model_max_length from tokenizer_config.json. */
static void test_minimal(void **state)
{
    struct fixture *fx = *state;
    char dir[128], err[512] = "";
    snprintf(dir, sizeof(dir), "%s/minimal", fx->dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    write_file(dir, "tokenizer.json",
               "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0],"
               " [\"a\", -1], [\"b\", -2], [\"ab\", -2.5], [\"abc\", -10]]}}");
    write_file(dir, "tokenizer_config.json", "{\"model_max_length\": 77}");
    struct tokenizer *t = tokenizer_load(dir, NULL, err, sizeof(err));
    if (!t) fail_msg("%s", err);
    assert_int_equal(tokenizer_max_tokens(t), 77);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    int32_t ids[16], tids[16];
    /* "abc": ab (-2.5) + c (unk: -10 - 10) vs abc (-10): abc wins;
       "abcx": x unknown */
    assert_int_equal(tokenizer_encode(t, s, "abab", 4, "abcx", 4, 0, 0, ids, tids, 16, NULL, NULL,
                                      0), 4);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 4);
    assert_int_equal(ids[3], 0);
    assert_int_equal(tids[1], 0);
    assert_int_equal(tids[2], 1);
    char buf[64];
    int32_t d[] = {1, 2, 0, 3};
    assert_int_equal(tokenizer_decode(t, d, 4, buf, sizeof(buf)), 12);
    assert_string_equal(buf, "a b <unk> ab");
    tokenizer_scratch_destroy(s);
    tokenizer_destroy(t);
}

/* The lowercase override belongs to WordPiece: refused for a Unigram. */
static void test_lowercase(void **state)
{
    (void)state;
    struct tokenizer_opts o;
    tokenizer_opts_init(&o);
    o.lowercase = 1;
    char err[512] = "";
    struct tokenizer *t = tokenizer_load(DATA "xlmr", &o, err, sizeof(err));
    assert_null(t);
    assert_non_null(strstr(err, "the lowercase override is WordPiece's"));
    o.lowercase = -1;
    o.max_tokens = 128;
    t = tokenizer_load(DATA "xlmr", &o, err, sizeof(err));
    assert_non_null(t);
    assert_int_equal(tokenizer_max_tokens(t), 128);
    tokenizer_destroy(t);
}

int main(void)
{
    tu_seed("test_unigram");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),   cmocka_unit_test(test_decodes),
        cmocka_unit_test(test_normalize), cmocka_unit_test(test_charsmap),
        cmocka_unit_test(test_nfkc),
        cmocka_unit_test(test_graphemes), cmocka_unit_test(test_interface),
        cmocka_unit_test(test_utf8),      cmocka_unit_test(test_limits),
        cmocka_unit_test(test_long),      cmocka_unit_test(test_refused),
        cmocka_unit_test(test_minimal),   cmocka_unit_test(test_threads),
        cmocka_unit_test(test_lowercase), cmocka_unit_test(test_lattice_given_back),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/* test_tokenizer.c - text/tokenizer, the interface over every tokenizer:
 * folders written here (tokenizer.json, vocab.txt with and without
 * tokenizer_config.json) load as the right implementation with the right
 * settings and special ids; what is not a tokenizer kinfer reads is
 * refused with a message naming it (an unknown model type by its name);
 * pairs and truncation through the interface equal wordpiece.h's own
 * answers id for id; decoding follows the reference's WordPiece decoder
 * (special tokens left out, "##" joined, cleanup) and round-trips text;
 * one scratch serves tokenizers loaded from different files; which texts
 * are blank (empty or only White_Space: the worker refuses them).
 *
 * Runs from the repository root (as make test does), single-threaded;
 * folders live in a temporary directory the group teardown removes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../text/tokenizer.h"
#include "../text/wordpiece.h"

#define DATA "tests/data/wordpiece/"

static char root_dir[64];

/* A fresh folder under the group's directory. */
static void folder(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", root_dir, name);
    assert_int_equal(mkdir(out, 0700), 0);
}

/* Writes text into dir/name. */
static void write_file(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Copies a file of tests/data/wordpiece into dir, under name. */
static void copy_data(const char *file, const char *dir, const char *name)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cp '" DATA "%s' '%s/%s'", file, dir, name);
    assert_int_equal(system(cmd), 0);
}

static struct tokenizer *load(const char *dir, const struct tokenizer_opts *o)
{
    char err[512] = "";
    struct tokenizer *t = tokenizer_load(dir, o, err, sizeof(err));
    if (!t) fail_msg("tokenizer_load %s: %s", dir, err);
    return t;
}

/* ---- loading ----------------------------------------------------------- */

/* Each folder shape loads as WordPiece with the file's settings: the
 * vocabulary, the special ids, model_max_length (and the override of it),
 * and the lowercase override that switches to vocab.txt. */
static void test_folders(void **state)
{
    (void)state;
    char dj[128], dv[128], dc[128];
    folder("json", dj, sizeof(dj));
    copy_data("tokenizer.json", dj, "tokenizer.json");
    folder("vocab", dv, sizeof(dv));
    copy_data("vocab.txt", dv, "vocab.txt");
    folder("cased", dc, sizeof(dc));
    copy_data("vocab.txt", dc, "vocab.txt");
    copy_data("tokenizer_config_cased.json", dc, "tokenizer_config.json");

    struct wp_tokenizer *ref = wp_load_json(DATA "tokenizer.json", NULL, 0);
    assert_non_null(ref);
    const char *dirs[3] = {dj, dv, dc};
    const size_t max_tokens[3] = {0, 0, 512};
    for (int k = 0; k < 3; k++) {
        struct tokenizer *t = load(dirs[k], NULL);
        assert_string_equal(tokenizer_kind_name(t), "WordPiece");
        assert_int_equal(tokenizer_vocab_size(t), 818);
        assert_int_equal(tokenizer_max_tokens(t), max_tokens[k]);
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_CLS), wp_cls_id(ref));
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_SEP), wp_sep_id(ref));
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_PAD), wp_pad_id(ref));
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_UNK), wp_unk_id(ref));
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_MASK), wp_mask_id(ref));
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_N_SPECIAL), -1);
        assert_int_equal(tokenizer_token_id(t, "the"), wp_token_id(ref, "the"));
        assert_int_equal(tokenizer_token_id(t, "no such token"), -1);
        assert_string_equal(tokenizer_id_token(t, 165), "the");
        assert_null(tokenizer_id_token(t, 818));
        assert_null(tokenizer_id_token(t, -1));
        tokenizer_destroy(t);
    }
    wp_destroy(ref);

    /* the override of max_tokens wins over model_max_length */
    struct tokenizer_opts o;
    tokenizer_opts_init(&o);
    assert_int_equal(o.lowercase, -1);
    assert_int_equal(o.max_tokens, 0);
    o.max_tokens = 64;
    struct tokenizer *t = load(dc, &o);
    assert_int_equal(tokenizer_max_tokens(t), 64);

    /* lower-casing: the cased config keeps "The" (a token of its own in
     * this vocabulary); the override turns it on, over the config and
     * over tokenizer.json (which then gives way to vocab.txt) */
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    assert_non_null(s);
    int32_t ids[16];
    int32_t the = 165, cased_the = tokenizer_token_id(t, "The");
    assert_true(cased_the >= 0 && cased_the != the);
    struct {
        const char *dir;
        int lowercase;
        int32_t want;
    } rows[] = {
        {dc, -1, cased_the}, {dc, 1, the}, {dv, -1, the}, {dv, 0, cased_the}, {dj, -1, the},
    };
    tokenizer_destroy(t);
    copy_data("vocab.txt", dj, "vocab.txt");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        tokenizer_opts_init(&o);
        o.lowercase = rows[i].lowercase;
        t = load(rows[i].dir, &o);
        assert_int_equal(tokenizer_encode(t, s, "The", 3, NULL, 0, 0, 0, ids, NULL, 16, NULL,
                                          NULL, 0),
                         3);
        if (ids[1] != rows[i].want)
            fail_msg("row %zu (%s, lowercase %d): id %d, want %d", i, rows[i].dir,
                     rows[i].lowercase, ids[1], rows[i].want);
        tokenizer_destroy(t);
    }
    /* tokenizer.json with a lowercase override: read from vocab.txt */
    tokenizer_opts_init(&o);
    o.lowercase = 0;
    t = load(dj, &o);
    assert_int_equal(tokenizer_encode(t, s, "The", 3, NULL, 0, 0, 0, ids, NULL, 16, NULL, NULL, 0),
                     3);
    assert_int_equal(ids[1], cased_the);
    tokenizer_destroy(t);
    tokenizer_scratch_destroy(s);
}

/* What is refused, and how the message names it. */
static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        const char *json;     /* tokenizer.json's text; NULL: none */
        int vocab;            /* 1: a vocab.txt beside it */
        int lowercase;
        const char *want[2];  /* substrings of the message */
    } rows[] = {
        {"an empty folder", NULL, 0, -1,
         {"no tokenizer.json in the folder (nor vocab.txt, merges.txt)"}},
        {"a Unigram model without pieces", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
         1, -1, {"tokenizer.json: model.vocab must be a non-empty array"}},
        {"a BPE model without a vocabulary", "{\"model\": {\"type\": \"BPE\"}}", 0, -1,
         {"tokenizer.json: model.vocab is not a non-empty object"}},
        {"a WordLevel model", "{\"model\": {\"type\": \"WordLevel\"}}", 0, -1,
         {"model type \"WordLevel\" is not supported", "(supported: WordPiece, BPE, Unigram)"}},
        {"no model.type", "{\"model\": {\"vocab\": {}}}", 1, -1,
         {"tokenizer.json: model.type is missing"}},
        {"not JSON", "{\"model\": ", 0, -1, {"tokenizer.json: line "}},
        {"not an object", "[1, 2]", 0, -1, {"tokenizer.json: not a JSON object"}},
        {"a lowercase override without vocab.txt", NULL, 0, 1, {"no tokenizer.json in the folder"}},
        {"a WordPiece file that is not BERT's",
         "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\","
         " \"vocab\": {\"[UNK]\": 0}},"
         " \"normalizer\": {\"type\": \"NFC\"}}",
         0, -1, {"normalizer is \"NFC\", not BertNormalizer"}},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char dir[128], name[32], err[512] = "";
        snprintf(name, sizeof(name), "bad%zu", i);
        folder(name, dir, sizeof(dir));
        if (rows[i].json) write_file(dir, "tokenizer.json", rows[i].json);
        if (rows[i].vocab) copy_data("vocab.txt", dir, "vocab.txt");
        struct tokenizer_opts o;
        tokenizer_opts_init(&o);
        o.lowercase = rows[i].lowercase;
        struct tokenizer *t = tokenizer_load(dir, &o, err, sizeof(err));
        if (t) fail_msg("%s: loaded", rows[i].what);
        for (int k = 0; k < 2 && rows[i].want[k]; k++)
            if (!strstr(err, rows[i].want[k]))
                fail_msg("%s: message \"%s\" lacks \"%s\"", rows[i].what, err, rows[i].want[k]);
        printf("  %-42s %s\n", rows[i].what, err);
    }
    /* the lowercase override beside a tokenizer.json needs vocab.txt */
    char dir[128], err[512] = "";
    folder("lcjson", dir, sizeof(dir));
    copy_data("tokenizer.json", dir, "tokenizer.json");
    struct tokenizer_opts o;
    tokenizer_opts_init(&o);
    o.lowercase = 1;
    assert_null(tokenizer_load(dir, &o, err, sizeof(err)));
    assert_non_null(strstr(err, "the lowercase override needs vocab.txt in the folder"));
}

/* ---- encoding ------------------------------------------------------------ */

/* Pairs, truncation and every error through the interface are
 * wp_encode's answers exactly: ids, type ids, full length, message. */
static void test_encode_equals_wp(void **state)
{
    (void)state;
    char dir[128];
    folder("enc", dir, sizeof(dir));
    copy_data("tokenizer.json", dir, "tokenizer.json");
    struct tokenizer *t = load(dir, NULL);
    struct wp_tokenizer *w = wp_load_json(DATA "tokenizer.json", NULL, 0);
    assert_non_null(w);
    struct tokenizer_scratch *s = tokenizer_scratch_new(64);
    struct wp_scratch *ws = wp_scratch_new(0);
    assert_true(s && ws);
    static const char *const texts[] = {
        "", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
        "[CLS] literal [SEP] specials", "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87",
        "bad \xff utf-8",
    };
    static const size_t maxes[] = {0, 3, 4, 5, 8, 13, 512};
    size_t nt = sizeof(texts) / sizeof(texts[0]), cases = 0;
    for (size_t a = 0; a < nt; a++) {
        for (size_t b = 0; b <= nt; b++) {
            const char *pair = b < nt ? texts[b] : NULL;
            for (size_t m = 0; m < sizeof(maxes) / sizeof(maxes[0]); m++) {
                for (int trunc = 0; trunc <= 1; trunc++) {
                    for (size_t cap = 4; cap <= 64; cap += 60) {
                        int32_t i1[64], i2[64], t1[64], t2[64];
                        size_t f1 = 999, f2 = 999;
                        char e1[256] = "", e2[256] = "";
                        int n1 = tokenizer_encode(t, s, texts[a], strlen(texts[a]), pair,
                                                  pair ? strlen(pair) : 0, maxes[m], trunc, i1,
                                                  t1, cap, &f1, e1, sizeof(e1));
                        int n2 = wp_encode(w, ws, texts[a], strlen(texts[a]), pair,
                                           pair ? strlen(pair) : 0, maxes[m], trunc, i2, t2, cap,
                                           &f2, e2, sizeof(e2));
                        if (n1 != n2 || f1 != f2 || strcmp(e1, e2) != 0)
                            fail_msg("\"%s\" / \"%s\" max %zu truncate %d cap %zu: %d %zu \"%s\""
                                     " vs wp %d %zu \"%s\"",
                                     texts[a], pair ? pair : "(none)", maxes[m], trunc, cap, n1,
                                     f1, e1, n2, f2, e2);
                        if (n1 > 0) {
                            assert_memory_equal(i1, i2, (size_t)n1 * sizeof(int32_t));
                            assert_memory_equal(t1, t2, (size_t)n1 * sizeof(int32_t));
                        }
                        cases++;
                    }
                }
            }
        }
    }
    printf("  %zu encodings equal wp_encode's\n", cases);
    /* the error codes are tokenizer.h's */
    int32_t ids[8];
    assert_int_equal(tokenizer_encode(t, s, "\xc0", 1, NULL, 0, 0, 0, ids, NULL, 8, NULL, NULL, 0),
                     TOKENIZER_ERR_UTF8);
    assert_int_equal(tokenizer_encode(t, s, "a b c d", 7, NULL, 0, 4, 0, ids, NULL, 8, NULL, NULL,
                                      0),
                     TOKENIZER_ERR_TOO_LONG);
    assert_int_equal(tokenizer_encode(t, s, "a b c d", 7, "x", 1, 2, 1, ids, NULL, 8, NULL, NULL,
                                      0),
                     TOKENIZER_ERR_ARG);
    assert_int_equal(tokenizer_encode(t, s, "a b c d", 7, NULL, 0, 0, 0, ids, NULL, 3, NULL, NULL,
                                      0),
                     TOKENIZER_ERR_CAP);
    wp_scratch_destroy(ws);
    wp_destroy(w);
    tokenizer_scratch_destroy(s);
    tokenizer_destroy(t);
}

/* One scratch serves tokenizers of different folders in turn. */
static void test_shared_scratch(void **state)
{
    (void)state;
    char d1[128], d2[128];
    folder("s1", d1, sizeof(d1));
    copy_data("tokenizer.json", d1, "tokenizer.json");
    folder("s2", d2, sizeof(d2));
    copy_data("vocab.txt", d2, "vocab.txt");
    copy_data("tokenizer_config_cased.json", d2, "tokenizer_config.json");
    struct tokenizer *a = load(d1, NULL), *b = load(d2, NULL);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    assert_non_null(s);
    int32_t x[16], y[16];
    for (int round = 0; round < 3; round++) {
        assert_int_equal(tokenizer_encode(a, s, "The fox", 7, NULL, 0, 0, 0, x, NULL, 16, NULL,
                                          NULL, 0),
                         4);
        assert_int_equal(x[1], 165);
        assert_int_equal(tokenizer_encode(b, s, "The fox", 7, NULL, 0, 0, 0, y, NULL, 16, NULL,
                                          NULL, 0),
                         4);
        assert_int_equal(y[1], tokenizer_token_id(b, "The")); /* cased */
        assert_int_equal(y[2], x[2]);
    }
    tokenizer_scratch_destroy(s);
    tokenizer_scratch_destroy(NULL);
    tokenizer_destroy(a);
    tokenizer_destroy(b);
    tokenizer_destroy(NULL);
}

/* A huge row does not pin its peak (a 1M-character row left RSS
 * 20 MB higher): after a row of 500,000 words and one of 200,000
 * combining marks (the canonical-ordering run), a small row leaves the
 * scratch at most a few WP_SCRATCH_KEEP buffers, and encodes as on a fresh
 * scratch. */
static void test_scratch_gives_back(void **state)
{
    (void)state;
    char d[128];
    folder("big", d, sizeof(d));
    copy_data("tokenizer.json", d, "tokenizer.json");
    struct tokenizer *t = load(d, NULL);
    struct tokenizer_scratch *s = tokenizer_scratch_new(4096), *fresh = tokenizer_scratch_new(0);
    assert_true(s && fresh);
    size_t start = tokenizer_scratch_bytes(s);
    size_t n = 1000000;
    char *big = malloc(n + 1);
    assert_non_null(big);
    for (size_t i = 0; i < n; i += 2) big[i] = 'a', big[i + 1] = ' ';
    int32_t ids[128], want[128];
    assert_int_equal(tokenizer_encode(t, s, big, n, NULL, 0, 128, 1, ids, NULL, 128, NULL, NULL,
                                      0),
                     128);
    /* 'a' then U+0301 x 200,000: one run of nonstarters */
    big[0] = 'a';
    size_t len = 1;
    for (size_t i = 0; i < 200000; i++) big[len++] = (char)0xcc, big[len++] = (char)0x81;
    assert_true(tokenizer_encode(t, s, big, len, NULL, 0, 128, 1, ids, NULL, 128, NULL, NULL,
                                 0) > 0);
    int got = tokenizer_encode(t, s, "The fox", 7, NULL, 0, 0, 0, ids, NULL, 128, NULL, NULL, 0);
    int ref = tokenizer_encode(t, fresh, "The fox", 7, NULL, 0, 0, 0, want, NULL, 128, NULL,
                               NULL, 0);
    assert_int_equal(got, ref);
    assert_memory_equal(ids, want, (size_t)got * sizeof(int32_t));
    size_t after = tokenizer_scratch_bytes(s);
    printf("  scratch: %zu bytes new, %zu after a 1M-character row and a small one\n", start,
           after);
    if (after > start + 4 * WP_SCRATCH_KEEP)
        fail_msg("the scratch kept %zu bytes (started with %zu)", after, start);
    free(big);
    tokenizer_scratch_destroy(s);
    tokenizer_scratch_destroy(fresh);
    tokenizer_destroy(t);
}

/* ---- decoding ------------------------------------------------------------- */

/* A small vocabulary whose ids the rows below name. */
static const char small_vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" /* 0-4 */
                                  "hello\nworld\n##s\n,\n.\n"          /* 5-9 */
                                  "!\n'\nt\nn\n##'\n"                  /* 10-14 */
                                  "do\nnot\n?\n##ing\n";               /* 15-18 */

/* The decoder as Hugging Face's tokenizers has it (decoders/wordpiece.rs
 * and Tokenizer::decode with skip_special_tokens), row by row: the first
 * token as it is, a "##" continuation joined, a space before any other,
 * then the cleanup within each token's piece. */
static void test_decode_rules(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        int32_t ids[10];
        size_t n;
        const char *want;       /* the WordPiece decoder with cleanup */
        const char *want_raw;   /* cleanup false */
        const char *want_none;  /* no decoder: joined by spaces */
    } rows[] = {
        {"specials left out", {2, 5, 8, 6, 7, 10, 3}, 7, "hello, worlds!", "hello , worlds !",
         "hello , world ##s !"},
        {"unk and pad left out too", {5, 1, 6, 0, 0}, 5, "hello world", "hello world",
         "hello world"},
        {"a first token keeps its ##", {7, 5}, 2, "##s hello", "##s hello", "##s hello"},
        {"a continuation after a special", {5, 3, 7}, 3, "hellos", "hellos", "hello ##s"},
        {"' between words", {5, 11, 12}, 3, "hello ' t", "hello ' t", "hello ' t"},
        {"? and .", {5, 17, 6, 9}, 4, "hello? world.", "hello ? world .", "hello ? world ."},
        {"only specials", {2, 3}, 2, "", "", ""},
        {"nothing", {0}, 0, "", "", ""},
        {"do not stays two tokens", {15, 16}, 2, "do not", "do not", "do not"},
        {"##ing", {15, 18}, 2, "doing", "doing", "do ##ing"},
    };
    char base[128], dj_raw[128], dj_none[128];
    folder("dec", base, sizeof(base));
    write_file(base, "vocab.txt", small_vocab);
    /* the same vocabulary as tokenizer.json, with each decoder */
#define DEC_JSON                                                                            \
    "{\"added_tokens\": [%s], \"normalizer\": {\"type\": \"BertNormalizer\"},"               \
    " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"                                 \
    " \"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 3],"            \
    " \"cls\": [\"[CLS]\", 2]}, \"decoder\": %s,"                                            \
    " \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"vocab\": {%s}}}"
    char vocab_json[1024] = "", added[1024] = "", json[4096];
    const char *p = small_vocab;
    for (int id = 0; *p; id++) {
        const char *nl = strchr(p, '\n');
        size_t o = strlen(vocab_json);
        snprintf(vocab_json + o, sizeof(vocab_json) - o, "%s\"%.*s\": %d", id ? ", " : "",
                 (int)(nl - p), p, id);
        if (id < 5) {
            o = strlen(added);
            snprintf(added + o, sizeof(added) - o,
                     "%s{\"id\": %d, \"content\": \"%.*s\", \"special\": true}", id ? ", " : "",
                     id, (int)(nl - p), p);
        }
        p = nl + 1;
    }
    folder("dec_raw", dj_raw, sizeof(dj_raw));
    snprintf(json, sizeof(json), DEC_JSON, added,
             "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": false}", vocab_json);
    write_file(dj_raw, "tokenizer.json", json);
    folder("dec_none", dj_none, sizeof(dj_none));
    snprintf(json, sizeof(json), DEC_JSON, added, "null", vocab_json);
    write_file(dj_none, "tokenizer.json", json);

    struct tokenizer *tv = load(base, NULL), *traw = load(dj_raw, NULL),
                     *tnone = load(dj_none, NULL);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct tokenizer *tk[3] = {tv, traw, tnone};
        const char *want[3] = {rows[i].want, rows[i].want_raw, rows[i].want_none};
        for (int k = 0; k < 3; k++) {
            char buf[128];
            memset(buf, 'x', sizeof(buf));
            int n = tokenizer_decode(tk[k], rows[i].ids, rows[i].n, buf, sizeof(buf));
            if (n != (int)strlen(want[k]) || strcmp(buf, want[k]) != 0)
                fail_msg("%s (decoder %d): got %d \"%s\", want \"%s\"", rows[i].what, k, n, buf,
                         want[k]);
        }
    }
    /* like snprintf: cut to the buffer, NUL-terminated, the full length
     * returned; cap 0 writes nothing */
    int32_t ids[] = {5, 8, 6};
    char small[6];
    assert_int_equal(tokenizer_decode(tv, ids, 3, small, sizeof(small)), 12);
    assert_string_equal(small, "hello");
    assert_int_equal(tokenizer_decode(tv, ids, 3, NULL, 0), 12);
    /* ids out of range are refused, not skipped */
    int32_t bad[] = {5, 19};
    char buf[32];
    assert_int_equal(tokenizer_decode(tv, bad, 2, buf, sizeof(buf)), TOKENIZER_ERR_ARG);
    bad[1] = -1;
    assert_int_equal(tokenizer_decode(tv, bad, 2, buf, sizeof(buf)), TOKENIZER_ERR_ARG);
    tokenizer_destroy(tv);
    tokenizer_destroy(traw);
    tokenizer_destroy(tnone);
}

/* Lower-case text of whole-vocabulary words and punctuation comes back as
 * it went in; a pair comes back as its two halves joined; truncated text
 * as its kept words. */
static void test_decode_round_trip(void **state)
{
    (void)state;
    char dir[128];
    folder("rt", dir, sizeof(dir));
    copy_data("tokenizer.json", dir, "tokenizer.json");
    struct tokenizer *t = load(dir, NULL);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    static const char *const texts[] = {
        "hello, world!",
        "the quick brown fox.",
        "hello world? the fox!",
        "the",
    };
    int32_t unk = tokenizer_special_id(t, TOKENIZER_UNK);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        int32_t ids[64];
        int n = tokenizer_encode(t, s, texts[i], strlen(texts[i]), NULL, 0, 0, 0, ids, NULL, 64,
                                 NULL, NULL, 0);
        assert_true(n > 2);
        for (int k = 0; k < n; k++)
            if (ids[k] == unk) fail_msg("\"%s\": token %d is unknown", texts[i], k);
        char buf[256];
        assert_int_equal(tokenizer_decode(t, ids, (size_t)n, buf, sizeof(buf)),
                         (int)strlen(texts[i]));
        assert_string_equal(buf, texts[i]);
    }
    /* "Hello, World!" lower-cases on the way */
    int32_t ids[64];
    char buf[256];
    int n = tokenizer_encode(t, s, "Hello, World!", 13, "The fox.", 8, 0, 0, ids, NULL, 64, NULL,
                             NULL, 0);
    assert_true(n > 0);
    tokenizer_decode(t, ids, (size_t)n, buf, sizeof(buf));
    assert_string_equal(buf, "hello, world! the fox.");
    /* truncated to 5: [CLS] the quick brown [SEP] */
    n = tokenizer_encode(t, s, "the quick brown fox.", 20, NULL, 0, 5, 1, ids, NULL, 64, NULL,
                         NULL, 0);
    assert_int_equal(n, 5);
    tokenizer_decode(t, ids, (size_t)n, buf, sizeof(buf));
    assert_string_equal(buf, "the quick brown");
    tokenizer_scratch_destroy(s);
    tokenizer_destroy(t);
}

/* ---- fixture ----------------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    snprintf(root_dir, sizeof(root_dir), "/tmp/kinfer-tok-XXXXXX");
    return mkdtemp(root_dir) ? 0 : -1;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    nftw(root_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* tokenizer_text_blank: empty and White_Space only (ASCII and beyond) are
 * blank; a letter, a control character, or invalid UTF-8 anywhere is not. */
static void test_text_blank(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n;
        int blank;
    } t[] = {
        {"", 0, 1},
        {" ", 1, 1},
        {" \t\n\v\f\r", 6, 1},
        {"\xc2\x85\xc2\xa0\xe1\x9a\x80\xe2\x80\x80\xe2\x80\x8a\xe2\x80\xa8\xe2\x80\xa9"
         "\xe2\x80\xaf\xe2\x81\x9f\xe3\x80\x80", 28, 1},  /* U+0085 ... U+3000 */
        {"  a  ", 5, 0},
        {"\0", 1, 0},                                /* a control: removed, not blank */
        {"\xe2\x80\x8b", 3, 0},                    /* U+200B ZERO WIDTH SPACE: Cf */
        {" \xff ", 3, 0},                            /* invalid UTF-8 */
        {" \xe3\x80", 3, 0},                         /* a cut sequence */
        {"\xc2\xa0x", 3, 0},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (tokenizer_text_blank(t[i].s, t[i].n) != t[i].blank)
            fail_msg("case %zu: tokenizer_text_blank says %d", i, !t[i].blank);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_folders),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_encode_equals_wp),
        cmocka_unit_test(test_shared_scratch),
        cmocka_unit_test(test_scratch_gives_back),
        cmocka_unit_test(test_decode_rules),
        cmocka_unit_test(test_decode_round_trip),
        cmocka_unit_test(test_text_blank),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/* test_bpe_sp.c - SentencePiece-style BPE (text/bpe_sp.c with text/bpe.c
 * and the loaders) through the tokenizer interface, against Hugging
 * Face's own library:
 *   - every golden of tests/data/bpe_sp/golden.json (written by
 *     tests/golden/bpe_sp_golden.js with the npm `tokenizers` package):
 *     ids, type ids and decoded text in three settings (Llama 2's first
 *     form: Prepend + Replace normalizer; the newer Metaspace "first"
 *     without split; Metaspace "always" with split, ignore_merges, missing
 *     byte tokens so some characters are <unk>, a Metaspace decoder), and
 *     decodings of id lists that cut byte runs (U+FFFD per byte token);
 *   - every cut of a decode buffer ending on a character boundary;
 *   - random UTF-8 text encoding and decoding back to itself, and the
 *     same ids decoded one at a time as generation does (gen/stop.c's
 *     gen_detok): every piece released is valid UTF-8 and together they
 *     are the whole decoding;
 *   - 1 MiB inputs (one long word, spaces, emoji as bytes, <unk> runs)
 *     encode, decode back, and leave the scratch small again;
 *   - files refused with a message naming what is not supported;
 *   - the SentencePiece demo decoder folder (decoder_write_demo_tok):
 *     its tokenizer loads, puts <s> first, keeps demo words whole, falls
 *     back to bytes, decodes back, and has config.json's vocab_size ids;
 *     the folder loads as a decoder, and sampled generations (random
 *     weights: many byte tokens, runs cut anywhere) stream valid UTF-8
 *     pieces that join into the final text.
 *
 * Runs from the repository root; folders under a temporary directory
 * removed at the end. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../gen/engine.h"
#include "../gen/stop.h"
#include "../gpu/decoder.h"
#include "../gpu/model.h"
#include "../text/tokenizer.h"
#include "../text/unicode.h"
#include "testutil.h"

#define DATA "tests/data/bpe_sp/"
#define CAP 4096

static char tmpdir[64];
static json_t *golden;

static const char *const settings[] = {"legacy", "meta", "split"};
#define N_SETTINGS 3
static struct tokenizer *toks[N_SETTINGS];

/* ---- helpers ------------------------------------------------------------- */

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    if (!in || !out) fail_msg("copy %s -> %s", from, to);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

static int32_t *int_array(const json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int32_t *v = malloc((*n + 1) * sizeof(*v));
    assert_non_null(v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

static int setting_index(const char *name)
{
    for (int i = 0; i < N_SETTINGS; i++)
        if (!strcmp(settings[i], name)) return i;
    fail_msg("unknown setting %s", name);
    return -1;
}

/* Printable rendering of a text for a failure message. */
static void show(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o] = '\0';
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* A folder under the temporary directory holding body as tokenizer.json;
 * the tokenizer loaded from it, or NULL with err filled. */
static struct tokenizer *load_json(const char *name, const char *body, char *err, size_t cap)
{
    char dir[160], p[200];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    mkdir(dir, 0755);
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    return tokenizer_load(dir, NULL, err, cap);
}

static int setup(void **state)
{
    (void)state;
    json_error_t jerr;
    golden = json_load_file(DATA "golden.json", JSON_ALLOW_NUL, &jerr);
    if (!golden) {
        fprintf(stderr, "%s: %s (run from the repository root)\n", DATA "golden.json", jerr.text);
        return -1;
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_bpe_sp.XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    for (int i = 0; i < N_SETTINGS; i++) {
        char dir[128], from[128], to[160];
        snprintf(dir, sizeof(dir), "%s/%s", tmpdir, settings[i]);
        mkdir(dir, 0755);
        snprintf(from, sizeof(from), DATA "tokenizer_%s.json", settings[i]);
        snprintf(to, sizeof(to), "%s/tokenizer.json", dir);
        copy_file(from, to);
        char err[512] = "";
        if (!(toks[i] = tokenizer_load(dir, NULL, err, sizeof(err)))) {
            fprintf(stderr, "%s: %s\n", dir, err);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < N_SETTINGS; i++) tokenizer_destroy(toks[i]);
    json_decref(golden);
    nftw(tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

/* ---- goldens --------------------------------------------------------------- */

/* One case: 0 when ids, type ids and the decoded text match, else a
 * message printed. */
static int check_case(struct tokenizer *t, struct tokenizer_scratch *s, const json_t *c,
                      size_t idx)
{
    const json_t *jt = json_object_get(c, "text"), *jp = json_object_get(c, "pair");
    size_t nw, nt;
    int32_t *want = int_array(json_object_get(c, "ids"), &nw);
    int32_t *wty = int_array(json_object_get(c, "type_ids"), &nt);
    static int32_t ids[CAP], ty[CAP];
    char err[512] = "", shown[512], got[CAP];
    int n = tokenizer_encode(t, s, json_string_value(jt), json_string_length(jt),
                             json_is_string(jp) ? json_string_value(jp) : NULL,
                             json_string_length(jp), 0, 0, ids, ty, CAP, NULL, err, sizeof(err));
    int bad = n != (int)nw || memcmp(ids, want, nw * sizeof(int32_t)) ||
              memcmp(ty, wty, nt * sizeof(int32_t));
    show(json_string_value(jt), json_string_length(jt), shown, sizeof(shown));
    if (bad) {
        printf("  case %zu %s \"%s\"%s: n %d (%s) want %zu:", idx,
               json_string_value(json_object_get(c, "setting")), shown,
               json_is_string(jp) ? " + pair" : "", n, n < 0 ? err : "", nw);
        for (int i = 0; i < n && i < 24; i++) printf(" %d/%d", ids[i], ty[i]);
        printf("\n     want:");
        for (size_t i = 0; i < nw && i < 24; i++) printf(" %d/%d", want[i], wty[i]);
        printf("\n");
    } else {
        const json_t *wd = json_object_get(c, "decoded");
        int dl = tokenizer_decode(t, ids, (size_t)n, got, sizeof(got));
        if (dl != (int)json_string_length(wd) || memcmp(got, json_string_value(wd), (size_t)dl)) {
            char g2[512], w2[512];
            show(got, dl > 0 ? (size_t)dl : 0, g2, sizeof(g2));
            show(json_string_value(wd), json_string_length(wd), w2, sizeof(w2));
            printf("  case %zu %s \"%s\": decoded \"%s\", want \"%s\"\n", idx,
                   json_string_value(json_object_get(c, "setting")), shown, g2, w2);
            bad = 1;
        }
    }
    free(want);
    free(wty);
    return bad;
}

static void test_goldens(void **state)
{
    (void)state;
    printf("  reference: %s\n", json_string_value(json_object_get(golden, "reference")));
    const json_t *cases = json_object_get(golden, "cases");
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    assert_non_null(s);
    size_t bad = 0, i;
    const json_t *c;
    json_array_foreach(cases, i, c) {
        int k = setting_index(json_string_value(json_object_get(c, "setting")));
        bad += (size_t)check_case(toks[k], s, c, i);
    }
    printf("  %zu cases, %zu differ\n", json_array_size(cases), bad);
    tokenizer_scratch_destroy(s);
    assert_true(json_array_size(cases) > 300);
    assert_int_equal(bad, 0);
}

static void test_golden_decodes(void **state)
{
    (void)state;
    const json_t *decs = json_object_get(golden, "decodes");
    size_t bad = 0, i;
    const json_t *c;
    json_array_foreach(decs, i, c) {
        struct tokenizer *t = toks[setting_index(json_string_value(json_object_get(c, "setting")))];
        size_t n;
        int32_t *ids = int_array(json_object_get(c, "ids"), &n);
        const json_t *w = json_object_get(c, "text");
        char got[1024];
        int dl = tokenizer_decode(t, ids, n, got, sizeof(got));
        if (dl != (int)json_string_length(w) || memcmp(got, json_string_value(w), (size_t)dl)) {
            char g2[512], w2[512];
            show(got, dl > 0 ? (size_t)dl : 0, g2, sizeof(g2));
            show(json_string_value(w), json_string_length(w), w2, sizeof(w2));
            printf("  decode %zu: \"%s\", want \"%s\"\n", i, g2, w2);
            bad++;
        }
        /* every cut of the buffer is a prefix ending on a character
         * boundary, NUL-terminated */
        for (size_t cap = 0; dl > 0 && cap <= (size_t)dl + 1; cap++) {
            char cut[1024];
            memset(cut, 'X', sizeof(cut));
            int r = tokenizer_decode(t, ids, n, cut, cap);
            assert_int_equal(r, dl);
            if (cap == 0) continue;
            size_t m = strlen(cut);
            assert_true(m < cap);
            assert_memory_equal(cut, got, m);
            assert_int_equal(uni_utf8_check(cut, m), m);
            if (m < (size_t)dl && cap - 1 - m >= 4) fail_msg("cut at %zu kept only %zu", cap, m);
        }
        free(ids);
    }
    printf("  %zu decodes, %zu differ\n", json_array_size(decs), bad);
    assert_true(json_array_size(decs) > 300);
    assert_int_equal(bad, 0);
}

/* ---- random text -------------------------------------------------------------- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Random valid UTF-8 of about n characters into out (room for 4n + 1):
 * ASCII with spaces, tabs and newlines, Latin-1, CJK, emoji, any scalar
 * value; never "▁" (which decodes to a space) nor "<" (added tokens). */
static size_t random_text(char *out, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        switch (rnd(8)) {
        case 0: cp = " \t\n"[rnd(3)]; break;
        case 1: cp = 0x20 + rnd(0x5f); break;
        case 2: cp = 'a' + rnd(26); break;
        case 3: cp = 0xa0 + rnd(0x60); break;
        case 4: cp = 0x4e00 + rnd(0x200); break;
        case 5: cp = 0x1f600 + rnd(0x50); break;
        case 6: cp = rnd(0x80); break;
        default:
            do cp = rnd(0x110000);
            while (cp >= 0xd800 && cp <= 0xdfff);
        }
        if (cp == 0x2581 || cp == '<') cp = 'x';
        o += uni_utf8_encode(cp, out + o);
    }
    out[o] = '\0';
    return o;
}

/* Random text encodes and decodes back to itself (legacy and meta: every
 * byte has a token; meta puts no "▁" before a text that starts with a
 * space, so the decoder's Strip takes that space); the same ids released one at a time as generation
 * does give valid UTF-8 pieces that together are the whole decoding. */
static void test_roundtrip_incremental(void **state)
{
    (void)state;
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    assert_non_null(s);
    static int32_t ids[CAP];
    char text[4 * 200 + 1], got[CAP], err[256];
    for (int k = 0; k < 2; k++) {
        for (int round = 0; round < 300; round++) {
            size_t len = random_text(text, round % 60);
            int n = tokenizer_encode(toks[k], s, text, len, NULL, 0, 0, 0, ids, NULL, CAP, NULL,
                                     err, sizeof(err));
            assert_true(n >= 1);
            assert_int_equal(ids[0], 1); /* <s> */
            int dl = tokenizer_decode(toks[k], ids, (size_t)n, got, sizeof(got));
            size_t skip = k == 1 && len && text[0] == ' ';
            if (dl != (int)(len - skip) || memcmp(got, text + skip, len - skip)) {
                char a[1024], b[1024];
                show(text, len, a, sizeof(a));
                show(got, dl > 0 ? (size_t)dl : 0, b, sizeof(b));
                fail_msg("%s round %d: \"%s\" decoded \"%s\"", settings[k], round, a, b);
            }
            struct gen_detok d;
            gen_detok_init(&d, 1);
            char *out = NULL;
            size_t out_len = 0, out_cap = 0;
            for (int i = 2; i <= n; i++) {
                size_t before = out_len;
                long r = gen_detok_step(&d, toks[k], ids, (size_t)i, &out, &out_len, &out_cap);
                assert_true(r >= 0);
                assert_int_equal(uni_utf8_check(out + before, out_len - before),
                                 out_len - before);
            }
            assert_true(gen_detok_flush(&d, toks[k], ids, (size_t)n, &out, &out_len, &out_cap) >= 0);
            /* the decoding after <s> drops a first space the whole
             * decoding keeps only when text starts with one */
            int dl1 = tokenizer_decode(toks[k], ids + 1, (size_t)n - 1, got, sizeof(got));
            assert_int_equal((int)out_len, dl1);
            if (out_len) assert_memory_equal(out, got, out_len);
            gen_detok_free(&d);
            free(out);
        }
    }
    tokenizer_scratch_destroy(s);
}

/* Byte tokens of a character that arrive one by one release nothing
 * until the last one, then the whole character. */
static void test_incremental_bytes(void **state)
{
    (void)state;
    struct tokenizer *t = toks[1];
    char b[16];
    int32_t ids[8] = {1};
    size_t n = 1;
    for (const char *p = "\xF0\x9F\x98\x80"; *p; p++) {
        snprintf(b, sizeof(b), "<0x%02X>", (unsigned char)*p);
        ids[n] = tokenizer_token_id(t, b);
        assert_true(ids[n] >= 0);
        n++;
    }
    struct gen_detok d;
    gen_detok_init(&d, 1);
    char *out = NULL;
    size_t out_len = 0, out_cap = 0;
    for (size_t i = 2; i < n; i++)
        assert_int_equal(gen_detok_step(&d, t, ids, i, &out, &out_len, &out_cap), 0);
    assert_int_equal(gen_detok_step(&d, t, ids, n, &out, &out_len, &out_cap), 4);
    assert_memory_equal(out, "\xF0\x9F\x98\x80", 4);
    gen_detok_free(&d);
    free(out);
}

/* ---- long inputs ---------------------------------------------------------------------- */

static void test_long_inputs(void **state)
{
    (void)state;
    size_t big = 1 << 20;
    char *text = malloc(big + 1), *back = malloc(big + 16);
    int32_t *ids = malloc((big + 2) * sizeof(int32_t));
    assert_true(text && back && ids);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    static const char *const units[] = {"a", "ab", " ", "\xf0\x9f\x98\x80", "\n", "the ",
                                        "\xe4\xb8\xad"};
    for (int k = 0; k < N_SETTINGS; k++)
        for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
            size_t ul = strlen(units[u]), n = big / ul;
            for (size_t i = 0; i < n; i++) memcpy(text + i * ul, units[u], ul);
            char err[256] = "";
            int r = tokenizer_encode(toks[k], s, text, n * ul, NULL, 0, 0, 0, ids, NULL, big + 2,
                                     NULL, err, sizeof(err));
            if (r < 0) fail_msg("%s unit %zu: %s", settings[k], u, err);
            assert_true(r >= 1);
            int dl = tokenizer_decode(toks[k], ids, (size_t)r, back, big + 16);
            /* split's emoji have no byte tokens: one <unk> each (not
             * fused), which decodes to nothing; a text that starts with a
             * space gets no "▁" in front, so the decoder takes that space */
            if (k == 2 && u == 3) {
                assert_int_equal(r, (int)n + 2);
                assert_int_equal(dl, 0);
            } else {
                size_t skip = units[u][0] == ' ' && k != 0;
                assert_int_equal(dl, (int)(n * ul - skip));
                assert_memory_equal(back, text + skip, n * ul - skip);
            }
            printf("  %-7s 1 MiB of \"%s\": %d ids, scratch %zu bytes after\n", settings[k],
                   units[u][0] == '\n' ? "\\n" : units[u], r, tokenizer_scratch_bytes(s));
            assert_true(tokenizer_scratch_bytes(s) < big / 2);
        }
    tokenizer_scratch_destroy(s);
    free(text);
    free(back);
    free(ids);
}

/* ---- refused files ---------------------------------------------------------------- */

static void test_refused(void **state)
{
    (void)state;
    static const char head[] =
        "{\"version\":\"1.0\",\"added_tokens\":[],\"post_processor\":null,";
    static const char model[] =
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
        "\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"a\":1,\"\\u2581\":2,\"<0x61>\":3},"
        "\"merges\":[]}}";
    const struct {
        const char *parts, *want;
    } cases[] = {
        {"\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":null,",
         "byte_fallback with a ByteLevel"},
        {"\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},\"content\":\"x\"},"
         "\"pre_tokenizer\":null,\"decoder\":null,", "only a String pattern"},
        {"\"normalizer\":{\"type\":\"Lowercase\"},\"pre_tokenizer\":null,\"decoder\":null,",
         "normalizer \"Lowercase\""},
        {"\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\","
         "\"prepend_scheme\":\"first\",\"split\":false},\"decoder\":null,", "not one character"},
        {"\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\","
         "\"prepend_scheme\":\"sometimes\"},\"decoder\":null,", "prepend_scheme \"sometimes\""},
        {"\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"decoder\":null,",
         "pre_tokenizer \"Whitespace\""},
        {"\"normalizer\":null,\"pre_tokenizer\":null,\"decoder\":{\"type\":\"ByteLevel\"},",
         "decoder \"ByteLevel\""},
        {"\"normalizer\":null,\"pre_tokenizer\":null,\"decoder\":{\"type\":\"Strip\","
         "\"content\":\" \",\"start\":-1,\"stop\":0},", "not counts"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char body[2048], err[512] = "", name[32];
        snprintf(body, sizeof(body), "%s%s%s", head, cases[i].parts, model);
        snprintf(name, sizeof(name), "refused%zu", i);
        struct tokenizer *t = load_json(name, body, err, sizeof(err));
        if (t) fail_msg("case %zu loaded", i);
        if (!strstr(err, cases[i].want)) fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err,
                                                  cases[i].want);
    }
    /* the same model with the legacy normalizer and decoder loads */
    char body[2048], err[512] = "";
    snprintf(body, sizeof(body), "%s%s%s", head,
             "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
             "\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
             "\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,\"decoder\":{\"type\":"
             "\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
             "\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
             "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},", model);
    struct tokenizer *t = load_json("accepted", body, err, sizeof(err));
    if (!t) fail_msg("%s", err);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    int32_t ids[16];
    /* "a" is a token; "b" has no byte token: unk, fused with the next */
    int n = tokenizer_encode(t, s, "abb a", 5, NULL, 0, 0, 0, ids, NULL, 16, NULL, err,
                             sizeof(err));
    assert_int_equal(n, 5); /* no post-processor: no <s> */
    const int32_t want[] = {2, 1, 0, 2, 1};
    assert_memory_equal(ids, want, 5 * sizeof(int32_t));
    tokenizer_scratch_destroy(s);
    tokenizer_destroy(t);
}

/* ---- the demo folder ---------------------------------------------------------------- */

static void test_demo_folder(void **state)
{
    (void)state;
    char dir[128], err[512] = "", p[200];
    snprintf(dir, sizeof(dir), "%s/demo", tmpdir);
    if (decoder_write_demo_tok(dir, 1, 32, 4, 2, 64, 3, DECODER_DEMO_SENTENCEPIECE, err,
                               sizeof(err)) < 0)
        fail_msg("%s", err);
    struct tokenizer *t = tokenizer_load(dir, NULL, err, sizeof(err));
    if (!t) fail_msg("%s", err);
    assert_string_equal(tokenizer_kind_name(t), "BPE");
    snprintf(p, sizeof(p), "%s/config.json", dir);
    json_error_t jerr;
    json_t *cfg = json_load_file(p, 0, &jerr);
    assert_non_null(cfg);
    assert_int_equal(json_integer_value(json_object_get(cfg, "vocab_size")),
                     tokenizer_vocab_size(t));
    assert_int_equal(json_integer_value(json_object_get(cfg, "bos_token_id")),
                     tokenizer_token_id(t, "<s>"));
    assert_int_equal(json_integer_value(json_object_get(cfg, "eos_token_id")),
                     tokenizer_token_id(t, "</s>"));
    json_decref(cfg);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    int32_t ids[64];
    char got[256];
    int n = tokenizer_encode(t, s, "the movie", 9, NULL, 0, 0, 0, ids, NULL, 64, NULL, err,
                             sizeof(err));
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], tokenizer_token_id(t, "<s>"));
    assert_int_equal(ids[1], tokenizer_token_id(t, "\xe2\x96\x81the"));
    assert_int_equal(ids[2], tokenizer_token_id(t, "\xe2\x96\x81movie"));
    n = tokenizer_encode(t, s, "a\xF0\x9F\x98\x80", 5, NULL, 0, 0, 0, ids, NULL, 64, NULL, err,
                         sizeof(err));
    assert_int_equal(n, 6); /* <s> ▁a and the emoji's four bytes */
    assert_int_equal(ids[2], tokenizer_token_id(t, "<0xF0>"));
    assert_int_equal(ids[5], tokenizer_token_id(t, "<0x80>"));
    static const char *const texts[] = {"the job was great", "Kafka and Redis.",
                                        "  two  spaces\n\tand \xc3\xa9 \xe4\xb8\xad", ""};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        size_t len = strlen(texts[i]);
        n = tokenizer_encode(t, s, texts[i], len, NULL, 0, 0, 0, ids, NULL, 64, NULL, err,
                             sizeof(err));
        assert_true(n >= 1);
        int dl = tokenizer_decode(t, ids, (size_t)n, got, sizeof(got));
        /* a text that starts with a space gets no second one, and the
         * decoder's Strip takes the first */
        size_t skip = texts[i][0] == ' ';
        assert_int_equal(dl, (int)(len - skip));
        assert_memory_equal(got, texts[i] + skip, len - skip);
    }
    tokenizer_scratch_destroy(s);
    tokenizer_destroy(t);
}

/* What one generation streamed and returned. */
struct gen_out {
    char streamed[4096], text[4096];
    size_t streamed_len, text_len, n_tokens;
    int done, bytes;
};

static void gen_piece(void *arg, void *user, const char *text, size_t len)
{
    (void)arg;
    struct gen_out *o = user;
    assert_true(len > 0 && o->streamed_len + len < sizeof(o->streamed));
    assert_int_equal(uni_utf8_check(text, len), len);
    memcpy(o->streamed + o->streamed_len, text, len);
    o->streamed_len += len;
}

static void gen_done(void *arg, const struct gen_result *r)
{
    struct tokenizer *t = arg;
    struct gen_out *o = r->user;
    assert_int_equal(r->status, GEN_OK);
    assert_true(r->text_len < sizeof(o->text));
    assert_int_equal(uni_utf8_check(r->text, r->text_len), r->text_len);
    memcpy(o->text, r->text, r->text_len);
    o->text_len = r->text_len;
    o->n_tokens = r->n_tokens;
    for (size_t i = 0; i < r->n_tokens; i++) {
        const char *tok = tokenizer_id_token(t, r->tokens[i]);
        o->bytes += tok && !strncmp(tok, "<0x", 3);
    }
    o->done = 1;
}

static void test_demo_generate(void **state)
{
    (void)state;
    char dir[128], err[512] = "";
    snprintf(dir, sizeof(dir), "%s/demo_gen", tmpdir);
    if (decoder_write_demo_tok(dir, 1, 32, 4, 2, 64, 11, DECODER_DEMO_SENTENCEPIECE, err,
                               sizeof(err)) < 0)
        fail_msg("%s", err);
    struct model_runtime_conf c;
    model_runtime_conf_defaults(&c);
    c.backend = "cpu";
    struct model_runtime *rt = model_runtime_new(&c, err, sizeof(err));
    if (!rt) fail_msg("runtime: %s", err);
    struct model_spec spec = {0};
    snprintf(spec.name, sizeof(spec.name), "demo");
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    struct decoder *d = decoder_load(rt, &spec, err, sizeof(err));
    if (!d) fail_msg("decoder: %s", err);
    struct tokenizer *t = tokenizer_load(dir, NULL, err, sizeof(err));
    if (!t) fail_msg("tokenizer: %s", err);
    const struct decoder_info *in = decoder_info(d);
    assert_int_equal(in->vocab, tokenizer_vocab_size(t));
    assert_int_equal(in->bos_id, tokenizer_token_id(t, "<s>"));
    assert_int_equal(in->n_eos, 1);
    assert_int_equal(in->eos_ids[0], tokenizer_token_id(t, "</s>"));
    struct gen_engine_conf ec = {.max_waiting = 8, .max_seqs = 4, .max_batch_tokens = 256,
                                 .max_ctx = 256, .block_tokens = 16,
                                 .kv_bytes = (size_t)8 << 20};
    struct gen_engine_cb cb = {.on_done = gen_done, .on_piece = gen_piece, .arg = t};
    struct gen_engine *e = gen_engine_new(d, t, 0, &ec, &cb, err, sizeof(err));
    if (!e) fail_msg("engine: %s", err);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    static const char prompt[] = "[INST] the movie was great \xe4\xb8\xad [/INST]";
    int32_t ids[64];
    int n = tokenizer_encode(t, s, prompt, strlen(prompt), NULL, 0, 0, 0, ids, NULL, 64, NULL,
                             err, sizeof(err));
    assert_true(n > 1);
    assert_int_equal(ids[0], in->bos_id);
    static struct gen_out outs[8];
    memset(outs, 0, sizeof(outs));
    for (int i = 0; i < 8; i++) {
        struct gen_request r = {.prompt = ids, .n_prompt = (size_t)n, .seed = 100 + (uint64_t)i,
                                .max_tokens = 48, .end_ids = in->eos_ids, .n_end = in->n_eos,
                                .user = &outs[i]};
        gen_sampling_defaults(&r.sampling);
        r.sampling.temperature = 1.5f;
        char why[256];
        if (gen_engine_submit(e, &r, why, sizeof(why)) != 0) fail_msg("submit: %s", why);
    }
    for (int k = 0; k < 10000 && gen_engine_step(e) > 0; k++) continue;
    int bytes = 0;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(outs[i].done, 1);
        assert_int_equal(outs[i].streamed_len, outs[i].text_len);
        assert_memory_equal(outs[i].streamed, outs[i].text, outs[i].text_len);
        bytes += outs[i].bytes;
    }
    printf("  8 generations, %d byte tokens among them\n", bytes);
    assert_true(bytes > 0); /* the byte runs were exercised */
    tokenizer_scratch_destroy(s);
    gen_engine_destroy(e);
    tokenizer_destroy(t);
    decoder_destroy(d);
    model_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_golden_decodes),
        cmocka_unit_test(test_roundtrip_incremental),
        cmocka_unit_test(test_incremental_bytes),
        cmocka_unit_test(test_long_inputs),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_demo_folder),
        cmocka_unit_test(test_demo_generate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_bpe.c - byte-level BPE (text/bpe.c, text/bpe_load.c) through the
 * tokenizer interface, against Hugging Face's own library:
 *   - every golden of tests/data/bpe/golden.json (written by
 *     tests/golden/bpe_golden.js with the npm `tokenizers` package from
 *     tokenizers it trains itself): ids, type ids and the decoded text of
 *     singles, pairs and truncated encodings in three settings (RoBERTa's
 *     ByteLevel + RobertaProcessing, with and without add_prefix_space;
 *     a Llama-3 style Split regex + NFC + TemplateProcessing), and
 *     decodings of id lists that cut characters in the middle (U+FFFD as
 *     the reference's from_utf8_lossy gives);
 *   - the same RoBERTa tokenizer as slow files (vocab.json + merges.txt +
 *     tokenizer_config.json) giving the same ids;
 *   - every Unicode scalar value through both pre-tokenizers (GPT-2's
 *     regex, Llama 3's) splitting as the reference does
 *     (tests/data/bpe/pretok.tsv), but for the letters and digits of
 *     Unicode 15 and 16, which Debian 12's PCRE2 does not know yet;
 *   - hostile input: invalid UTF-8 refused with the interface's error,
 *     very long words and whitespace runs (linear time, the scratch given
 *     back), empty text, cut decode buffers that never end in half a
 *     character;
 *   - files refused with a message naming what is not supported;
 *   - a RoBERTa demo folder (model_write_demo_encoder, BPE tokenizer.json)
 *     loading through model_load and encoding;
 *   - four threads sharing the tokenizers, each with its own scratch;
 *   - random text of any code points decoding back to itself (its NFC
 *     for llama).
 *
 * Runs from the repository root; folders under a
 * temporary directory removed at the end. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "../gpu/model.h"
#include "../text/bpe_impl.h" /* bpe_pre_tokenize, for the sweep */
#include "../text/tokenizer.h"
#include "../text/tokenizer_impl.h"
#include "../text/unicode.h"
#include "testutil.h"

#define DATA "tests/data/bpe/"
#define CAP 4096

static char tmpdir[64];
static json_t *golden;

static const char *const settings[] = {"roberta", "roberta_prefix", "llama"};
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

static void write_file(const char *dir, const char *name, const char *body)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
}

/* A fresh folder under the temporary directory. */
static void folder(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
    assert_int_equal(mkdir(out, 0755), 0);
}

static struct tokenizer *load(const char *dir)
{
    char err[512] = "";
    struct tokenizer *t = tokenizer_load(dir, NULL, err, sizeof(err));
    if (!t) fail_msg("%s: %s", dir, err);
    return t;
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

static int setup(void **state)
{
    (void)state;
    json_error_t jerr;
    golden = json_load_file(DATA "golden.json", JSON_ALLOW_NUL, &jerr);
    if (!golden) {
        fprintf(stderr, "%s: %s (run from the repository root)\n", DATA "golden.json", jerr.text);
        return -1;
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_bpe.XXXXXX");
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

/* One case through t: 0 when ids, type ids and (decode 1) the decoded
 * text all match, else a message printed. */
static int check_case(struct tokenizer *t, struct tokenizer_scratch *s, const json_t *c,
                      int decode, size_t idx)
{
    const json_t *jt = json_object_get(c, "text"), *jp = json_object_get(c, "pair");
    size_t max = (size_t)json_integer_value(json_object_get(c, "max_len"));
    size_t nw, nt;
    int32_t *want = int_array(json_object_get(c, "ids"), &nw);
    int32_t *wty = int_array(json_object_get(c, "type_ids"), &nt);
    static int32_t ids[CAP], ty[CAP];
    char err[512] = "";
    int n = tokenizer_encode(t, s, json_string_value(jt), json_string_length(jt),
                             json_is_string(jp) ? json_string_value(jp) : NULL,
                             json_string_length(jp), max, 1, ids, ty, CAP, NULL, err,
                             sizeof(err));
    int bad = n != (int)nw || memcmp(ids, want, nw * sizeof(int32_t)) ||
              memcmp(ty, wty, nt * sizeof(int32_t));
    char shown[512], got[CAP];
    if (!bad && decode) {
        const char *wd = json_string_value(json_object_get(c, "decoded"));
        size_t wl = json_string_length(json_object_get(c, "decoded"));
        int dl = tokenizer_decode(t, ids, (size_t)n, got, sizeof(got));
        if (dl != (int)wl || memcmp(got, wd, wl)) {
            show(json_string_value(jt), json_string_length(jt), shown, sizeof(shown));
            char g2[512], w2[512];
            show(got, dl > 0 ? (size_t)dl : 0, g2, sizeof(g2));
            show(wd, wl, w2, sizeof(w2));
            printf("  case %zu \"%s\": decoded \"%s\", want \"%s\"\n", idx, shown, g2, w2);
            bad = 1;
        }
    } else if (bad) {
        show(json_string_value(jt), json_string_length(jt), shown, sizeof(shown));
        printf("  case %zu %s \"%s\"%s max %zu: n %d (%s) want %zu:", idx,
               json_string_value(json_object_get(c, "setting")), shown, jp && !json_is_null(jp) ?
               " + pair" : "", max, n, n < 0 ? err : "", nw);
        for (int i = 0; i < n && i < 24; i++) printf(" %d/%d", ids[i], ty[i]);
        printf("\n     want:");
        for (size_t i = 0; i < nw && i < 24; i++) printf(" %d/%d", want[i], wty[i]);
        printf("\n");
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
        bad += (size_t)check_case(toks[k], s, c, 1, i);
    }
    printf("  %zu cases, %zu differ\n", json_array_size(cases), bad);
    tokenizer_scratch_destroy(s);
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
            printf("  decode %zu: got %d bytes, want %zu\n", i, dl, json_string_length(w));
            bad++;
        }
        /* every cut of the buffer ends on a character boundary */
        for (size_t cap = 0; dl > 0 && cap <= (size_t)dl + 1; cap++) {
            char cut[1024];
            memset(cut, 'x', sizeof(cut));
            int r = tokenizer_decode(t, ids, n, cut, cap);
            assert_int_equal(r, dl);
            if (!cap) continue;
            size_t l = strlen(cut);
            assert_true(l < cap);
            assert_memory_equal(cut, got, l);
            assert_true(l == (size_t)dl || ((unsigned char)got[l] & 0xC0) != 0x80);
        }
        free(ids);
    }
    printf("  %zu decodes, %zu differ\n", json_array_size(decs), bad);
    assert_int_equal(bad, 0);
}

/* The roberta setting as vocab.json + merges.txt gives its goldens (but
 * for [NEW], an added token only tokenizer.json has): with
 * tokenizer_config.json naming the specials, with special_tokens_map.json
 * naming them instead, and with neither (RoBERTa's defaults). */
static void test_slow_files(void **state)
{
    (void)state;
    static const char map[] =
        "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"unk_token\": \"<unk>\", "
        "\"sep_token\": \"</s>\", \"pad_token\": \"<pad>\", \"cls_token\": \"<s>\", "
        "\"mask_token\": {\"content\": \"<mask>\", \"lstrip\": true}}";
    for (int variant = 0; variant < 3; variant++) {
        char dir[128], p[192], name[32];
        snprintf(name, sizeof(name), "slow%d", variant);
        folder(name, dir, sizeof(dir));
        static const char *const files[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
        for (int i = 0; i < (variant == 0 ? 3 : 2); i++) {
            char from[128];
            snprintf(from, sizeof(from), DATA "slow/%s", files[i]);
            snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
            copy_file(from, p);
        }
        if (variant == 1) write_file(dir, "special_tokens_map.json", map);
        struct tokenizer *t = load(dir);
        assert_string_equal(tokenizer_kind_name(t), "BPE");
        assert_int_equal(tokenizer_max_tokens(t), variant == 0 ? 512 : 0);
        assert_int_equal(tokenizer_vocab_size(t), tokenizer_vocab_size(toks[0]) - 1);
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_CLS), 0);
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_PAD), 1);
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_SEP), 2);
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_UNK), 3);
        assert_int_equal(tokenizer_special_id(t, TOKENIZER_MASK),
                         tokenizer_special_id(toks[0], TOKENIZER_MASK));
        struct tokenizer_scratch *s = tokenizer_scratch_new(0);
        const json_t *cases = json_object_get(golden, "cases"), *c;
        size_t i, bad = 0, n = 0;
        json_array_foreach(cases, i, c) {
            const char *set = json_string_value(json_object_get(c, "setting"));
            const json_t *pair = json_object_get(c, "pair");
            if (strcmp(set, "roberta") ||
                strstr(json_string_value(json_object_get(c, "text")), "[NEW]") ||
                (json_is_string(pair) && strstr(json_string_value(pair), "[NEW]")))
                continue;
            bad += (size_t)check_case(t, s, c, 1, i);
            n++;
        }
        printf("  slow files (%s): %zu cases, %zu differ\n",
               variant == 0 ? "tokenizer_config.json" : variant == 1 ? "special_tokens_map.json"
                                                                     : "defaults",
               n, bad);
        assert_int_equal(bad, 0);
        tokenizer_scratch_destroy(s);
        tokenizer_destroy(t);
    }
}

/* ---- threads ------------------------------------------------------------------ */

struct thr {
    size_t bad, done;
};

/* Every golden case, on this thread's own scratch, three times over. */
static void *thread_main(void *p)
{
    struct thr *x = p;
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    const json_t *cases = json_object_get(golden, "cases"), *c;
    size_t i;
    for (int round = 0; round < 3 && s; round++)
        json_array_foreach(cases, i, c) {
            int k = setting_index(json_string_value(json_object_get(c, "setting")));
            const json_t *jt = json_object_get(c, "text"), *jp = json_object_get(c, "pair");
            size_t nw;
            int32_t *want = int_array(json_object_get(c, "ids"), &nw);
            int32_t got[CAP];
            int n = tokenizer_encode(toks[k], s, json_string_value(jt), json_string_length(jt),
                                     json_is_string(jp) ? json_string_value(jp) : NULL,
                                     json_string_length(jp),
                                     (size_t)json_integer_value(json_object_get(c, "max_len")), 1,
                                     got, NULL, CAP, NULL, NULL, 0);
            x->bad += n != (int)nw || memcmp(got, want, nw * sizeof(int32_t));
            x->done++;
            free(want);
        }
    tokenizer_scratch_destroy(s);
    return NULL;
}

/* The loaded tokenizers are shared read-only by threads with their own
 * scratches. */
static void test_threads(void **state)
{
    (void)state;
    enum { NT = 4 };
    pthread_t th[NT];
    struct thr x[NT];
    memset(x, 0, sizeof(x));
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_create(&th[i], NULL, thread_main, &x[i]), 0);
    size_t bad = 0, done = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        bad += x[i].bad;
        done += x[i].done;
    }
    printf("  %d threads: %zu encodings, %zu differ\n", NT, done, bad);
    assert_int_equal(done, (size_t)NT * 3 * json_array_size(json_object_get(golden, "cases")));
    assert_int_equal(bad, 0);
}

/* ---- the pre-tokenizers, code point by code point ---------------------------- */

/* Letters and digits that Unicode 15 and 16 added (Kawi, CJK Ext. H and
 * I, Garay, ...): the reference's Oniguruma knows them as \p{L} / \p{N},
 * Debian 12's PCRE2 (10.42, Unicode 14) as unassigned, so text holding
 * them splits differently. Every other code point must split as the
 * reference splits it. */
static const uint32_t newer_unicode[][2] = {
    {0x1C89, 0x1C8A},   {0xA7CB, 0xA7CD},   {0xA7DA, 0xA7DC},   {0x105C0, 0x105F3},
    {0x10D40, 0x10D65}, {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x1123F, 0x11240},
    {0x11380, 0x113B7}, {0x113D1, 0x113D3}, {0x116D0, 0x116E3}, {0x11BC0, 0x11BF9},
    {0x11F02, 0x11F59}, {0x1342F, 0x1342F}, {0x13441, 0x13446}, {0x13460, 0x143FA},
    {0x16100, 0x16139}, {0x16D40, 0x16D79}, {0x18CFF, 0x18CFF}, {0x1B132, 0x1B132},
    {0x1B155, 0x1B155}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3}, {0x1DF25, 0x1DF2A},
    {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4F9}, {0x1E5D0, 0x1E5FA}, {0x2B739, 0x2B739},
    {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF},
};

static int is_newer(uint32_t cp)
{
    for (size_t i = 0; i < sizeof(newer_unicode) / sizeof(newer_unicode[0]); i++)
        if (cp >= newer_unicode[i][0] && cp <= newer_unicode[i][1]) return 1;
    return 0;
}

struct pieces {
    char s[128];
    size_t n;
};

static void piece_cb(void *ctx, const char *p, size_t n)
{
    (void)p;
    struct pieces *x = ctx;
    x->n += (size_t)snprintf(x->s + x->n, sizeof(x->s) - x->n, "%s%zu", x->n ? "," : "", n);
}

static struct bpe_tok *load_bpe(const char *setting)
{
    char path[128], dir[128], err[512] = "";
    snprintf(path, sizeof(path), DATA "tokenizer_%s.json", setting);
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, setting);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    size_t max = 0;
    struct bpe_tok *t = bpe_from_json(dir, root, path, &max, err, sizeof(err));
    if (!t) fail_msg("%s: %s", path, err);
    json_decref(root);
    return t;
}

/* Every scalar value in the probe "a<c>b 1<c>2 <c><c> x" through
 * roberta's and llama's pre-tokenizers: the pieces' byte lengths as
 * tests/data/bpe/pretok.tsv records the reference's. */
static void test_pretok_sweep(void **state)
{
    (void)state;
    struct bpe_tok *g = load_bpe("roberta"), *l = load_bpe("llama");
    void *sc = bpe_tokenizer_impl.scratch_new(0);
    assert_non_null(sc);
    FILE *fp = fopen(DATA "pretok.tsv", "r");
    assert_non_null(fp);
    char line[512];
    size_t checked = 0, skipped = 0, bad = 0;
    uint32_t next = 0;
    while (fgets(line, sizeof(line), fp)) {
        if (line[0] == '#') continue;
        unsigned lo, hi;
        char wg[200], wl[200];
        if (sscanf(line, "%x\t%x\t%199[^\t]\t%199s", &lo, &hi, wg, wl) != 4)
            fail_msg("pretok.tsv: bad line %s", line);
        assert_int_equal(lo, next);
        next = hi + 1 == 0xD800 ? 0xE000 : hi + 1;
        const char *want[2] = {wg, wl};
        for (uint32_t cp = lo; cp <= hi; cp++) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            if (is_newer(cp)) {
                skipped++;
                continue;
            }
            char c[4], probe[32];
            size_t k = uni_utf8_encode(cp, c), n = 0;
#define PUT(p, m) (memcpy(probe + n, (p), (m)), n += (m))
            PUT("a", 1), PUT(c, k), PUT("b 1", 3), PUT(c, k), PUT("2 ", 2), PUT(c, k), PUT(c, k),
                PUT(" x", 2);
#undef PUT
            struct pieces pg = {.n = 0}, pl = {.n = 0};
            assert_int_equal(bpe_pre_tokenize(g, sc, probe, n, piece_cb, &pg), 0);
            assert_int_equal(bpe_pre_tokenize(l, sc, probe, n, piece_cb, &pl), 0);
            checked++;
            if (strcmp(pg.s, want[0]) || strcmp(pl.s, want[1])) {
                if (bad++ < 10)
                    printf("  U+%04X: gpt2 %s (want %s), llama %s (want %s)\n", cp, pg.s, want[0],
                           pl.s, want[1]);
            }
        }
    }
    fclose(fp);
    assert_int_equal(next, 0x110000);
    printf("  %zu code points split as the reference splits them, %zu differ; %zu letters and "
           "digits newer than PCRE2's Unicode 14 skipped\n", checked - bad, bad, skipped);
    assert_int_equal(bad, 0);
    bpe_tokenizer_impl.scratch_destroy(sc);
    bpe_destroy(g);
    bpe_destroy(l);
}

/* ---- hostile input ----------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n;
        size_t at;
    } rows[] = {
        {"ok \xff", 4, 3},         {"\xc3", 1, 0},           {"a\xc0\x80", 3, 1},
        {"\xed\xa0\x80", 3, 0},    {"\xf4\x90\x80\x80", 4, 0}, {"abc\xe2\x82", 5, 3},
        {"<s>\x80</s>", 8, 3},     {"\xf0\x9f\x98", 3, 0},
    };
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    for (int k = 0; k < N_SETTINGS; k++)
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
            int32_t ids[64];
            char err[256] = "", want[64];
            int n = tokenizer_encode(toks[k], s, rows[i].s, rows[i].n, NULL, 0, 0, 0, ids, NULL,
                                     64, NULL, err, sizeof(err));
            assert_int_equal(n, TOKENIZER_ERR_UTF8);
            snprintf(want, sizeof(want), "text is not valid UTF-8 at byte %zu", rows[i].at);
            if (!strstr(err, want)) fail_msg("row %zu: \"%s\" lacks \"%s\"", i, err, want);
            n = tokenizer_encode(toks[k], s, "ok", 2, rows[i].s, rows[i].n, 0, 0, ids, NULL, 64,
                                 NULL, err, sizeof(err));
            assert_int_equal(n, TOKENIZER_ERR_UTF8);
            assert_non_null(strstr(err, "pair is not valid UTF-8"));
        }
    tokenizer_scratch_destroy(s);
}

/* Long words, whitespace runs, many specials: linear time, the right
 * counts, and a scratch that still works after giving memory back. */
static void test_long_inputs(void **state)
{
    (void)state;
    size_t big = 1 << 20;
    char *text = malloc(big * 4 + 1);
    int32_t *ids = malloc(big * 4 * sizeof(int32_t));
    assert_true(text && ids);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    static const char *const units[] = {"a", "ab", " ", "\xf0\x9f\x98\x80", "<s>", "1", "\n ",
                                        "\xd9\x85"};
    for (int k = 0; k < N_SETTINGS; k++)
        for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
            size_t ul = strlen(units[u]), n = big / ul;
            for (size_t i = 0; i < n; i++) memcpy(text + i * ul, units[u], ul);
            double t0 = now_s();
            size_t full = 0;
            char err[256] = "";
            int r = tokenizer_encode(toks[k], s, text, n * ul, NULL, 0, 0, 0, ids, NULL, big * 4,
                                     &full, err, sizeof(err));
            double dt = now_s() - t0;
            if (r < 0) fail_msg("%s unit %zu: %s", settings[k], u, err);
            assert_int_equal((size_t)r, full);
            assert_true(r >= 1);
            /* decoding gives the text back (RoBERTa without a prefix space) */
            if (k != 1) {
                char *back = malloc(n * ul + 16);
                int dl = tokenizer_decode(toks[k], ids, (size_t)r, back, n * ul + 16);
                if (strcmp(units[u], "<s>") != 0 || k == 2) { /* Llama's <s> is text */
                    assert_int_equal(dl, (int)(n * ul));
                    assert_memory_equal(back, text, n * ul);
                } else {
                    assert_int_equal(dl, 0);
                }
                free(back);
            }
            printf("  %-14s 1 MiB of \"%s\" x %zu: %d ids, %.3fs\n", settings[k],
                   u == 2 ? " " : u == 6 ? "\\n " : units[u], n, r, dt);
            if (dt > 5.0) fail_msg("%s unit %zu: %.2fs for 1 MiB", settings[k], u, dt);
            /* the scratch still encodes short text after giving back */
            int32_t few[16];
            assert_true(tokenizer_encode(toks[k], s, "hello", 5, NULL, 0, 0, 0, few, NULL, 16, NULL,
                                         NULL, 0) > 0);
        }
    /* empty text and pairs: only the specials */
    int32_t few[16], ty[16];
    assert_int_equal(tokenizer_encode(toks[0], s, "", 0, NULL, 0, 0, 0, few, ty, 16, NULL, NULL, 0),
                     2);
    assert_int_equal(few[0], 0);
    assert_int_equal(few[1], 2);
    assert_int_equal(tokenizer_encode(toks[0], s, NULL, 0, "", 0, 0, 0, few, ty, 16, NULL, NULL, 0),
                     4);
    assert_int_equal(tokenizer_encode(toks[2], s, "", 0, NULL, 0, 0, 0, few, ty, 16, NULL, NULL, 0),
                     1);
    /* too long without truncation, too small a cap, too small a limit */
    char err[256];
    size_t full = 0;
    assert_int_equal(tokenizer_encode(toks[0], s, "hello world", 11, NULL, 0, 3, 0, few, ty, 16,
                                      &full, err, sizeof(err)),
                     TOKENIZER_ERR_TOO_LONG);
    assert_non_null(strstr(err, "over the limit of 3"));
    assert_int_equal(tokenizer_encode(toks[0], s, "hello world", 11, NULL, 0, 0, 0, few, ty, 2,
                                      NULL, err, sizeof(err)),
                     TOKENIZER_ERR_CAP);
    assert_int_equal(tokenizer_encode(toks[0], s, "hello", 5, "x", 1, 3, 1, few, ty, 16, NULL, err,
                                      sizeof(err)),
                     TOKENIZER_ERR_ARG);
    int32_t badid = (int32_t)tokenizer_vocab_size(toks[0]);
    char out[8];
    assert_int_equal(tokenizer_decode(toks[0], &badid, 1, out, sizeof(out)), TOKENIZER_ERR_ARG);
    tokenizer_scratch_destroy(s);
    free(text);
    free(ids);
}

/* Byte-level BPE loses nothing: random text of any code points (but '<'
 * and '[', which could spell an added token) decodes back to itself
 * through roberta's tokenizer, and to its NFC through llama's. */
static void test_round_trip(void **state)
{
    (void)state;
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    static int32_t ids[CAP];
    char text[512], back[2048];
    size_t rounds = 3000;
    for (size_t r = 0; r < rounds; r++) {
        size_t n = 0, chars = 1 + tu_rand64() % 40;
        int k = (int)(r % 2) * 2; /* roberta, llama */
        for (size_t c = 0; c < chars; c++) {
            uint32_t cp;
            uint64_t x = tu_rand64();
            switch (x % 4) {
            case 0: cp = (uint32_t)(x >> 8) % 0x80; break;         /* ASCII, controls too */
            case 1: cp = 0x20 + (uint32_t)(x >> 8) % 0x5F; break;  /* printable */
            case 2: cp = (uint32_t)(x >> 8) % 0x3000; break;       /* Latin ... CJK punct. */
            default: cp = (uint32_t)(x >> 8) % 0x110000; break;
            }
            if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == '<' || cp == '[') cp = 'z';
            n += uni_utf8_encode(cp, text + n);
        }
        int m = tokenizer_encode(toks[k], s, text, n, NULL, 0, 0, 0, ids, NULL, CAP, NULL, NULL, 0);
        assert_true(m > 0);
        int dl = tokenizer_decode(toks[k], ids, (size_t)m, back, sizeof(back));
        /* llama normalizes to NFC first: that is what comes back */
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n,
                                           &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        assert_true(nl >= 0);
        const char *want = k == 2 ? (const char *)nfc : text;
        size_t wn = k == 2 ? (size_t)nl : n;
        int same = dl == (int)wn && !memcmp(back, want, wn);
        free(nfc);
        if (!same) {
            char a[1024], b[1024];
            show(text, n, a, sizeof(a));
            show(back, dl > 0 ? (size_t)dl : 0, b, sizeof(b));
            fail_msg("%s: \"%s\" came back as \"%s\"", settings[k], a, b);
        }
    }
    printf("  %zu random texts came back whole\n", rounds);
    tokenizer_scratch_destroy(s);
}

/* ---- refused files --------------------------------------------------------------------- */

static void test_refused(void **state)
{
    (void)state;
    static const char base[] =
        "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": %s, \"pre_tokenizer\": %s,"
        " \"post_processor\": %s, \"decoder\": null, \"model\": {\"type\": \"BPE\", %s"
        " \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [%s]}}";
    static const char bl[] = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}";
    static const struct {
        const char *what, *norm, *pre, *post, *model, *merges, *want;
    } rows[] = {
        {"a Metaspace of two characters", "null",
         "{\"type\": \"Metaspace\", \"replacement\": \"ab\"}", "null", "", "\"a b\"",
         "Metaspace.replacement is not one character"},
        {"Whitespace", "null", "{\"type\": \"Whitespace\"}", "null", "", "\"a b\"",
         "pre_tokenizer \"Whitespace\" is not supported"},
        {"Lowercase", "{\"type\": \"Lowercase\"}", bl, "null", "", "\"a b\"",
         "normalizer \"Lowercase\" is not supported"},
        {"dropout", "null", bl, "null", "\"dropout\": 0.1,", "\"a b\"", "BPE dropout"},
        {"byte_fallback", "null", bl, "null", "\"byte_fallback\": true,", "\"a b\"",
         "byte_fallback"},
        {"a merge outside the vocab", "null", bl, "null", "", "\"a c\"",
         "merge 0 (\"a\" \"c\"): the right token is not in the vocabulary"},
        {"a bad merge", "null", bl, "null", "", "\"a b c\"", "model.merges[0]"},
        {"BertProcessing", "null", bl, "{\"type\": \"BertProcessing\"}", "", "\"a b\"",
         "post_processor \"BertProcessing\" is not supported"},
        {"a Split that merges", "null",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"a\"}, \"behavior\": \"MergedWithNext\", \"invert\": false}, "
         "{\"type\": \"ByteLevel\"}]}",
         "null", "", "\"a b\"", "behavior Isolated or Removed"},
        {"a regex that does not compile", "null",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"(a\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
         "{\"type\": \"ByteLevel\"}]}",
         "null", "", "\"a b\"", "the pattern does not compile"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char dir[128], name[32], body[2048], err[512] = "";
        snprintf(name, sizeof(name), "bad%zu", i);
        folder(name, dir, sizeof(dir));
        snprintf(body, sizeof(body), base, rows[i].norm, rows[i].pre, rows[i].post, rows[i].model,
                 rows[i].merges);
        write_file(dir, "tokenizer.json", body);
        struct tokenizer *t = tokenizer_load(dir, NULL, err, sizeof(err));
        if (t) fail_msg("%s: loaded", rows[i].what);
        if (!strstr(err, rows[i].want))
            fail_msg("%s: message \"%s\" lacks \"%s\"", rows[i].what, err, rows[i].want);
        printf("  %-32s %s\n", rows[i].what, strchr(err, ':') ? strchr(err, ':') + 2 : err);
    }
    /* merges.txt alone */
    char dir[128], err[512] = "";
    folder("mergesonly", dir, sizeof(dir));
    write_file(dir, "merges.txt", "#version: 0.2\na b\n");
    assert_null(tokenizer_load(dir, NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "merges.txt without vocab.json"));
}

/* ---- the RoBERTa demo folder ------------------------------------------------------------- */

static void test_demo_roberta(void **state)
{
    (void)state;
    char dir[128], err[512] = "";
    snprintf(dir, sizeof(dir), "%s/demo", tmpdir);
    if (model_write_demo_encoder(dir, "roberta", 1, 16, 2, 32, 2, 7, err, sizeof(err)) != 0)
        fail_msg("demo: %s", err);
    char p[192];
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    assert_int_equal(access(p, F_OK), 0);
    struct tokenizer *t = load(dir);
    assert_string_equal(tokenizer_kind_name(t), "BPE");
    tokenizer_destroy(t);
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cpu";
    struct model_runtime *rt = model_runtime_new(&rc, err, sizeof(err));
    if (!rt) fail_msg("runtime: %s", err);
    struct model_spec spec;
    memset(&spec, 0, sizeof(spec));
    snprintf(spec.name, sizeof(spec.name), "demo");
    snprintf(spec.path, sizeof(spec.path), "%s", dir);
    model_encoder_spec_defaults(&spec.enc);
    struct model *m = model_load(rt, &spec, err, sizeof(err));
    if (!m) fail_msg("model_load %s: %s", dir, err);
    const struct model_encoder_info *e = model_encoder(m);
    assert_non_null(e);
    struct tokenizer_scratch *s = tokenizer_scratch_new(0);
    int32_t ids[64], ty[64];
    static const char *const texts[] = {"The movie was really great!", "Kafka and Redis.",
                                        "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe4\xb8\xad"};
    for (size_t i = 0; i < 3; i++) {
        int n = tokenizer_encode(e->tokenizer, s, texts[i], strlen(texts[i]), "a pair", 6,
                                 e->max_tokens, 1, ids, ty, 64, NULL, err, sizeof(err));
        if (n < 0) fail_msg("%s: %s", texts[i], err);
        assert_int_equal(ids[0], 0);
        assert_int_equal(ids[n - 1], 2);
        for (int k = 0; k < n; k++) {
            assert_true(ids[k] >= 0 && (size_t)ids[k] < e->vocab);
            assert_true((size_t)ty[k] < e->type_vocab);
            if (k > 0 && k < n - 1) assert_int_not_equal(ids[k], 1); /* never <pad> */
        }
        char back[256];
        tokenizer_decode(e->tokenizer, ids, (size_t)n, back, sizeof(back));
        printf("  demo: \"%s\" -> %d ids -> \"%s\"\n", texts[i], n, back);
    }
    tokenizer_scratch_destroy(s);
    model_destroy(m);
    model_runtime_destroy(rt);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),     cmocka_unit_test(test_golden_decodes),
        cmocka_unit_test(test_slow_files),  cmocka_unit_test(test_pretok_sweep),
        cmocka_unit_test(test_threads),     cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_long_inputs), cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_demo_roberta),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

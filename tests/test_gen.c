/* test_gen.c - the pieces of text generation that surround the model:
 * the sampler (gen/sample.c) against a float64 reference written here
 * (every filter, their order, the draw, the per-job random streams, the
 * log-probabilities), stop strings found across token boundaries against a
 * brute-force search, and incremental decoding against decoding the whole
 * generation at once, with tokenizers of every kind from tests/data. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/utf8.h"
#include "../gen/sample.h"
#include "../gen/stop.h"
#include "../text/tokenizer.h"
#include "testutil.h"

/* ---- the sampler's reference ----------------------------------------------- */

static const double *ref_z;
static int ref_order(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    if (ref_z[x] != ref_z[y]) return ref_z[x] > ref_z[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* What sp keeps of logits, computed the plain way in float64: every
 * finite logit scaled, all sorted (higher first, lower id among equals),
 * the first top_k, softmax, the prefix of the sorted tokens whose
 * predecessors hold less than top_p, those at least min_p times the most
 * likely, renormalized. keep[id] gets the probability (0 for dropped). */
static void ref_filter(const float *l, size_t n, const struct gen_sampling *sp, double *keep)
{
    size_t *ord = malloc(n * sizeof(*ord)), m = 0;
    double *z = malloc(n * sizeof(*z));
    for (size_t i = 0; i < n; i++) {
        keep[i] = 0.0;
        if (isfinite(l[i])) ord[m++] = i;
    }
    if (m == 0) goto out;
    double t = sp->temperature;
    for (size_t i = 0; i < n; i++) z[i] = t > 0 ? (double)l[i] / t : (double)l[i];
    ref_z = z;
    qsort(ord, m, sizeof(*ord), ref_order);
    if (t == 0) {
        keep[ord[0]] = 1.0;
        goto out;
    }
    if (sp->top_k > 0 && sp->top_k < m) m = sp->top_k;
    double sum = 0;
    for (size_t i = 0; i < m; i++) sum += exp(z[ord[i]] - z[ord[0]]);
    double *p = calloc(n, sizeof(*p));
    for (size_t i = 0; i < m; i++) p[ord[i]] = exp(z[ord[i]] - z[ord[0]]) / sum;
    if (sp->top_p < 1.0f) {
        double cum = 0;
        size_t k = 0;
        while (k < m && (k == 0 || cum < (double)sp->top_p)) cum += p[ord[k++]];
        m = k;
    }
    double mass = 0;
    for (size_t i = 0; i < m; i++)
        if (p[ord[i]] >= (double)sp->min_p * p[ord[0]]) mass += p[ord[i]];
    for (size_t i = 0; i < m; i++)
        if (p[ord[i]] >= (double)sp->min_p * p[ord[0]]) keep[ord[i]] = p[ord[i]] / mass;
    free(p);
out:
    free(ord);
    free(z);
}

static float randn(void)
{
    float u = tu_randf(1e-7f, 1.0f), v = tu_randf(0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Random logits: normal times a scale, with ties, -inf and NaN sprinkled. */
static void random_logits(float *l, size_t n)
{
    float scale = tu_randf(0.1f, 8.0f);
    for (size_t i = 0; i < n; i++) {
        l[i] = randn() * scale;
        uint64_t r = tu_rand64() % 40;
        if (r == 0) l[i] = -INFINITY;
        if (r == 1) l[i] = NAN;
        if (r == 2 && i > 0) l[i] = l[i - 1];
    }
}

static void random_sampling(struct gen_sampling *sp, size_t n)
{
    const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.8f};
    const float tops[] = {1.0f, 0.95f, 0.8f, 0.5f, 0.1f, 0.01f};
    const float mins[] = {0.0f, 0.0f, 0.02f, 0.1f, 0.5f};
    const uint32_t ks[] = {0, 0, 1, 2, 5, 40, (uint32_t)n, (uint32_t)n + 7};
    sp->temperature = temps[tu_rand64() % 5];
    sp->top_p = tops[tu_rand64() % 6];
    sp->min_p = mins[tu_rand64() % 5];
    sp->top_k = ks[tu_rand64() % 8];
}

/* gen_filter keeps exactly what the reference keeps, with its
 * probabilities to 1e-9, over vocabularies from 1 to 50k tokens. */
static void test_filter_matches_reference(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 2, 7, 64, 65, 300, 4099, 50000};
    struct gen_scratch *s = gen_scratch_new(50000);
    assert_non_null(s);
    size_t cases = 0;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        float *l = malloc(n * sizeof(*l));
        double *ref = malloc(n * sizeof(*ref)), *got = calloc(n, sizeof(*got));
        int rounds = n > 5000 ? 12 : 120;
        for (int r = 0; r < rounds; r++, cases++) {
            random_logits(l, n);
            struct gen_sampling sp;
            random_sampling(&sp, n);
            ref_filter(l, n, &sp, ref);
            size_t m = gen_filter(l, n, &sp, s);
            memset(got, 0, n * sizeof(*got));
            const uint32_t *ids = gen_scratch_ids(s);
            for (size_t i = 0; i < m; i++) {
                assert_true(ids[i] < n);
                assert_true(got[ids[i]] == 0.0); /* no id twice */
                got[ids[i]] = gen_scratch_prob(s, ids[i]);
            }
            size_t ref_m = 0;
            for (size_t i = 0; i < n; i++) {
                ref_m += ref[i] > 0;
                if (fabs(ref[i] - got[i]) > 1e-9 || ((ref[i] > 0) != (got[i] > 0)))
                    fail_msg("n=%zu T=%g k=%u p=%g min_p=%g: token %zu kept with %.17g, "
                             "reference %.17g",
                             n, (double)sp.temperature, sp.top_k, (double)sp.top_p,
                             (double)sp.min_p, i, got[i], ref[i]);
            }
            /* All-absent logits keep nothing; otherwise the same count. */
            assert_int_equal(m, ref_m);
        }
        free(l);
        free(ref);
        free(got);
    }
    gen_scratch_destroy(s);
    printf("test_gen: %zu filter cases equal to the float64 reference\n", cases);
}

/* Greedy is the first largest logit; nothing finite is an error; a
 * vocabulary over the scratch is refused. */
static void test_greedy_and_edges(void **state)
{
    (void)state;
    struct gen_scratch *s = gen_scratch_new(8);
    struct gen_sampling sp;
    gen_sampling_defaults(&sp);
    float l[8] = {1, 3, NAN, 3, -INFINITY, INFINITY, 2, 0};
    float lp = 0;
    assert_int_equal(gen_sample(l, 8, &sp, NULL, s, &lp), 1);
    double e = 0;
    for (int i = 0; i < 8; i++)
        if (isfinite(l[i])) e += exp((double)l[i] - 3.0);
    assert_true(fabs((double)lp - (0.0 - log(e))) < 1e-6);
    float none[3] = {NAN, -INFINITY, INFINITY};
    assert_int_equal(gen_sample(none, 3, &sp, NULL, s, NULL), -1);
    float big[9] = {0};
    assert_int_equal(gen_sample(big, 9, &sp, NULL, s, NULL), -1);
    assert_int_equal(gen_sample(big, 0, &sp, NULL, s, NULL), -1);
    /* Temperature without a stream is greedy too. */
    sp.temperature = 1.0f;
    assert_int_equal(gen_sample(l, 8, &sp, NULL, s, NULL), 1);
    gen_scratch_destroy(s);

    char why[128];
    struct gen_sampling bad;
    gen_sampling_defaults(&bad);
    assert_int_equal(gen_sampling_check(&bad, why, sizeof(why)), 0);
    bad.top_p = 0.0f;
    assert_int_equal(gen_sampling_check(&bad, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "top_p"));
    gen_sampling_defaults(&bad);
    bad.min_p = 1.0f;
    assert_int_equal(gen_sampling_check(&bad, why, sizeof(why)), -1);
    gen_sampling_defaults(&bad);
    bad.temperature = -0.5f;
    assert_int_equal(gen_sampling_check(&bad, why, sizeof(why)), -1);
    bad.temperature = NAN;
    assert_int_equal(gen_sampling_check(&bad, why, sizeof(why)), -1);
}

/* The draw follows the filtered distribution: 40,000 draws, every kept
 * token's count within 5 standard deviations of its expectation, no
 * dropped token ever drawn. */
static void test_draws_follow_distribution(void **state)
{
    (void)state;
    const size_t n = 12, draws = 40000;
    struct gen_scratch *s = gen_scratch_new(n);
    float l[12];
    for (int round = 0; round < 6; round++) {
        random_logits(l, n);
        for (size_t i = 0; i < n; i++)
            if (!isfinite(l[i])) l[i] = -1.0f;
        struct gen_sampling sp = {.temperature = 0.9f, .top_k = round % 2 ? 8 : 0,
                                  .top_p = round % 3 ? 0.9f : 1.0f, .min_p = round == 5 ? 0.05f : 0};
        double ref[12];
        ref_filter(l, n, &sp, ref);
        struct gen_rng r;
        gen_rng_seed(&r, tu_rand64());
        size_t count[12] = {0};
        for (size_t d = 0; d < draws; d++) {
            int32_t id = gen_sample(l, n, &sp, &r, s, NULL);
            assert_true(id >= 0 && (size_t)id < n);
            count[id]++;
        }
        for (size_t i = 0; i < n; i++) {
            double want = ref[i] * (double)draws, sd = sqrt((double)draws * ref[i] * (1 - ref[i]));
            if (ref[i] == 0 && count[i]) fail_msg("token %zu drawn %zu times, dropped", i, count[i]);
            if (fabs((double)count[i] - want) > 5 * sd + 1)
                fail_msg("token %zu drawn %zu times, expected %.0f +- %.0f", i, count[i], want, sd);
        }
    }
    gen_scratch_destroy(s);
}

/* A job's tokens depend on its seed alone: the same seed gives the same
 * tokens whether the job is sampled alone or interleaved with others;
 * another seed gives other tokens. The log-probability is the raw one. */
static void test_seeds_and_logprobs(void **state)
{
    (void)state;
    const size_t n = 500, steps = 64;
    struct gen_scratch *s = gen_scratch_new(n);
    float *l = malloc(steps * n * sizeof(*l));
    for (size_t t = 0; t < steps; t++) random_logits(l + t * n, n);
    struct gen_sampling sp = {.temperature = 1.0f, .top_k = 0, .top_p = 0.95f, .min_p = 0.0f};
    uint64_t seed = tu_rand64();
    int32_t alone[64], mixed[64], other[64];
    struct gen_rng a, b, c;
    gen_rng_seed(&a, seed);
    for (size_t t = 0; t < steps; t++) alone[t] = gen_sample(l + t * n, n, &sp, &a, s, NULL);
    gen_rng_seed(&b, seed);
    gen_rng_seed(&c, seed + 1);
    int differs = 0;
    for (size_t t = 0; t < steps; t++) {
        /* Another job sampled in between, with its own stream. */
        other[t] = gen_sample(l + ((t * 7) % steps) * n, n, &sp, &c, s, NULL);
        float lp;
        mixed[t] = gen_sample(l + t * n, n, &sp, &b, s, &lp);
        const float *lt = l + t * n;
        double mx = -INFINITY, sum = 0;
        for (size_t i = 0; i < n; i++)
            if (isfinite(lt[i]) && lt[i] > mx) mx = lt[i];
        for (size_t i = 0; i < n; i++)
            if (isfinite(lt[i])) sum += exp((double)lt[i] - mx);
        double want = (double)lt[mixed[t]] - mx - log(sum);
        assert_true(fabs((double)lp - want) <= 1e-5 * (1 + fabs(want)));
        assert_true(fabs((double)gen_logprob(lt, n, mixed[t]) - want) <= 1e-5 * (1 + fabs(want)));
    }
    assert_memory_equal(alone, mixed, sizeof(alone));
    gen_rng_seed(&c, seed + 1);
    for (size_t t = 0; t < steps; t++) differs |= gen_sample(l + t * n, n, &sp, &c, s, NULL) != alone[t];
    assert_true(differs);
    (void)other;
    assert_true(isnan(gen_logprob(l, n, -1)) && isnan(gen_logprob(l, n, (int32_t)n)));
    free(l);
    gen_scratch_destroy(s);
}

/* ---- stop strings ----------------------------------------------------------- */

static long brute_first(const struct gen_stops *st, const char *text, size_t len)
{
    for (size_t at = 0; at < len; at++)
        for (size_t i = 0; i < st->n; i++)
            if (at + st->len[i] <= len && memcmp(text + at, st->s[i], st->len[i]) == 0)
                return (long)at;
    return -1;
}

static size_t brute_settled(const struct gen_stops *st, const char *text, size_t len)
{
    size_t best = 0;
    for (size_t h = 1; h <= len; h++)
        for (size_t i = 0; i < st->n; i++)
            if (h < st->len[i] && memcmp(text + len - h, st->s[i], h) == 0 && h > best) best = h;
    return len - best;
}

/* Text over a small alphabet arrives in random pieces; after each piece
 * the incremental search answers what a search of the whole text does,
 * and what it calls settled never starts a stop string that more text
 * could complete. */
static void test_stops_across_pieces(void **state)
{
    (void)state;
    char text[400], stops[GEN_MAX_STOPS][8];
    for (int round = 0; round < 3000; round++) {
        struct gen_stops st = {0};
        size_t nst = 1 + tu_rand64() % GEN_MAX_STOPS;
        for (size_t i = 0; i < nst; i++) {
            size_t len = 1 + tu_rand64() % 6;
            for (size_t j = 0; j < len; j++) stops[i][j] = "abc"[tu_rand64() % 3];
            assert_int_equal(gen_stops_add(&st, stops[i], len), 0);
        }
        assert_int_equal(gen_stops_add(&st, "x", 1), st.n < GEN_MAX_STOPS ? 0 : -1);
        size_t len = 0, seen = 0;
        long found = -1;
        while (len < sizeof(text) - 8 && found < 0) {
            size_t piece = 1 + tu_rand64() % 4;
            for (size_t j = 0; j < piece; j++) text[len++] = "abcd"[tu_rand64() % 4];
            found = gen_stops_find(&st, text, len, seen);
            long want = brute_first(&st, text, len);
            if (found != want) fail_msg("round %d: found %ld, a full search %ld", round, found, want);
            if (found < 0) {
                size_t settled = gen_stops_settled(&st, text, len);
                assert_int_equal(settled, brute_settled(&st, text, len));
            }
            seen = len;
        }
    }
    struct gen_stops st = {0};
    assert_int_equal(gen_stops_add(&st, "", 0), -1);
}

/* ---- incremental decoding ----------------------------------------------------- */

#define DATA "tests/data/"
static char tmpdir[64];

static struct tokenizer *load_json(const char *name, const char *file)
{
    char dir[160], to[200];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    mkdir(dir, 0755);
    snprintf(to, sizeof(to), "%s/tokenizer.json", dir);
    FILE *in = fopen(file, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof(buf), in)) > 0) assert_int_equal(fwrite(buf, 1, k, out), k);
    fclose(in);
    fclose(out);
    char err[512] = "";
    struct tokenizer *t = tokenizer_load(dir, NULL, err, sizeof(err));
    if (!t) fail_msg("%s: %s", file, err);
    return t;
}

/* Lines of the multilingual corpus (accents, CJK, emoji, RTL, combining
 * marks), encoded, then decoded one token at a time: every released piece
 * is valid UTF-8, and the pieces joined are the whole decoding, with a
 * prompt's tokens before them as context or without. Random ids too
 * (byte tokens that make no character): still valid UTF-8, and the flush
 * gives the whole decoding. */
static void test_detok_incremental(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_gen.XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    const char *files[][2] = {{"llama", DATA "bpe/tokenizer_llama.json"},
                              {"roberta", DATA "bpe/tokenizer_roberta.json"},
                              {"xlmr", DATA "unigram/xlmr/tokenizer.json"},
                              {"bytefb", DATA "unigram/bytefb/tokenizer.json"},
                              {"wordpiece", DATA "wordpiece/tokenizer.json"}};
    FILE *corpus = fopen(DATA "unigram/corpus.txt", "r");
    assert_non_null(corpus);
    char lines[64][512];
    size_t nl = 0;
    while (nl < 64 && fgets(lines[nl], sizeof(lines[nl]), corpus)) {
        lines[nl][strcspn(lines[nl], "\n")] = '\0';
        if (lines[nl][0]) nl++;
    }
    fclose(corpus);
    assert_true(nl >= 8);
    struct tokenizer_scratch *ts = tokenizer_scratch_new(0);
    int32_t ids[1024];
    char whole[8192];
    size_t checked = 0;
    for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
        struct tokenizer *t = load_json(files[f][0], files[f][1]);
        size_t vocab = tokenizer_vocab_size(t);
        for (size_t li = 0; li < nl + 20; li++) {
            int n;
            size_t ctx = 0;
            if (li < nl) {
                char err[256];
                n = tokenizer_encode(t, ts, lines[li], strlen(lines[li]), NULL, 0, 0, 0, ids, NULL,
                                     1024, NULL, err, sizeof(err));
                if (n < 0) fail_msg("%s: %s", files[f][0], err);
                /* Odd lines: the first tokens as a prompt's context,
                 * cut where their text is the start of the whole (a
                 * prompt ends at a character). */
                ctx = li % 2 ? (size_t)(n < 3 ? n : 3) : 0;
                for (; ctx > 0; ctx--) {
                    char a[8192], b[8192];
                    int al = tokenizer_decode(t, ids, ctx, a, sizeof(a));
                    int bl = tokenizer_decode(t, ids, (size_t)n, b, sizeof(b));
                    if (al >= 0 && bl >= al && memcmp(a, b, (size_t)al) == 0 &&
                        (al < 3 || memcmp(a + al - 3, "\xef\xbf\xbd", 3) != 0))
                        break;
                }
            } else {
                n = 40;
                for (int i = 0; i < n; i++) ids[i] = (int32_t)(tu_rand64() % vocab);
            }
            struct gen_detok d;
            gen_detok_init(&d, ctx);
            char *out = NULL;
            size_t out_len = 0, out_cap = 0;
            for (size_t k = ctx + 1; k <= (size_t)n; k++) {
                size_t before = out_len;
                long got = gen_detok_step(&d, t, ids, k, &out, &out_len, &out_cap);
                assert_true(got >= 0);
                assert_int_equal((size_t)got, out_len - before);
                if (!utf8_valid(out + before, (size_t)got)) {
                    fprintf(stderr, "ids:");
                    for (size_t q = 0; q < k; q++) fprintf(stderr, " %d(%s)", ids[q], tokenizer_id_token(t, ids[q]));
                    fprintf(stderr, "\npiece:");
                    for (long q = 0; q < got; q++) fprintf(stderr, " %02x", (unsigned char)out[before + q]);
                    fail_msg("%s line %zu ctx %zu: a piece is not valid UTF-8", files[f][0], li, ctx);
                }
            }
            assert_true(gen_detok_flush(&d, t, ids, (size_t)n, &out, &out_len, &out_cap) >= 0);
            assert_true(out_len == 0 || utf8_valid(out, out_len));
            gen_detok_free(&d);
            /* The whole: the generated ids' text after the context's. */
            int wl = tokenizer_decode(t, ids, (size_t)n, whole, sizeof(whole));
            char ctxt[8192];
            int cl = tokenizer_decode(t, ids, ctx, ctxt, sizeof(ctxt));
            assert_true(wl >= 0 && cl >= 0 && wl < (int)sizeof(whole));
            assert_true(cl <= wl && memcmp(whole, ctxt, (size_t)cl) == 0);
            /* Text a tokenizer made is UTF-8, so the pieces are exactly
             * the whole; random ids only keep every piece valid. */
            if (li < nl &&
                (out_len != (size_t)(wl - cl) || (out_len && memcmp(out, whole + cl, out_len) != 0)))
                fail_msg("%s line %zu: incremental \"%.*s\", whole \"%s\"", files[f][0], li,
                         (int)out_len, out ? out : "", whole + cl);
            free(out);
            checked++;
        }
        tokenizer_destroy(t);
    }
    tokenizer_scratch_destroy(ts);
    printf("test_gen: %zu generations decoded token by token\n", checked);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

int main(void)
{
    tu_seed("test_gen");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filter_matches_reference),
        cmocka_unit_test(test_greedy_and_edges),
        cmocka_unit_test(test_draws_follow_distribution),
        cmocka_unit_test(test_seeds_and_logprobs),
        cmocka_unit_test(test_stops_across_pieces),
        cmocka_unit_test(test_detok_incremental),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_encoder.c - BERT encoders on the CPU backend (gpu/arch_bert.c reading a
 * folder, gpu/backend_cpu.c running it) against the float64 reference of
 * refencoder.h and against PyTorch: every head and pooling on fresh
 * random models and inputs (two shapes and a few more, F32/F16/BF16, the
 * "bert." prefix and gamma/beta names, gelu and its tanh forms, each
 * override), what model_encoder() reports, a packed batch against each
 * sequence alone and one of more than 1024 tokens, pairs and truncation
 * through the real tokenizer, the tokenizer files a folder may hold,
 * default label names, every EINVAL of model_encode, encoders and layer
 * models kept apart, the folder errors (each a table row with the words
 * its message must hold), the demo folder, and tests/torch_encoder.py
 * (PyTorch's own nn.TransformerEncoderLayer) on the same batches.
 *
 * Tolerance. The backend computes in float32 (unit roundoff u = 6e-8); the
 * reference in double from the very same weights (F16/BF16 already
 * rounded), so only the backend's arithmetic is measured. Each output must
 * satisfy
 *     |got - ref| <= 2e-5 * max(1, |ref|)
 * (absolute for values below 1: LayerNorm outputs, softmax and sigmoid
 * scores, unit-norm embeddings; relative above). Why looser than the 1e-5
 * of test_model.c: an encoder chains 1-3 layers of five float32 GEMMs each
 * (inner widths 4 to 128, each adding about u * sqrt(K) * |terms|),
 * softmaxes and gelus, and every LayerNorm divides the error accumulated
 * so far by its row's standard deviation, so the error grows with depth.
 * Over 150 seeds the worst error / max(1, |ref|) seen was 1.4e-6 (about
 * 9e-7 typically; the test prints the worst err/tol ratio and the largest
 * error of its run), so 2e-5 keeps a margin of more than ten for unlucky
 * seeds, while the mistakes an
 * encoder can make (a sequence seeing its neighbour, positions not
 * restarting, a type row, eps, the gelu form, a pooling over one token too
 * many, the attention scale) move outputs by 1e-3 or more; the models are
 * drawn so that each stage matters (attention neither flat nor one-hot,
 * gelu in its curved part, layer_norm_eps 0.05 in one model so eps shows).
 * PyTorch runs in float64 too, so it must agree with the reference to
 * 1e-9 relative (only the order of summation differs; 1e-15 is typical)
 * and with kinfer at 2e-5.
 *
 * Runs from the repository root (as make test does), single-threaded;
 * the folders live in a temporary directory removed at the end. The
 * PyTorch check needs Debian's python3-torch at /usr/bin/python3 (make
 * deps); without it the test fails saying so, unless
 * KINFER_TEST_NO_TORCH=1, which skips it with a printed line. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../gpu/model.h"
#include "../gpu/safetensors.h"
#include "../text/tokenizer.h"
#include "refencoder.h"
#include "testutil.h"

#define TOL 2e-5       /* kinfer (float32) against float64: see above */
#define TOL_F64 1e-9   /* PyTorch (float64) against the reference (float64) */
#define TORCH_PY "tests/torch_encoder.py"

struct fixture {
    char dir[64];
};

static struct model_runtime *cpu_rt;
/* The worst err/tol ratio and absolute error of the whole run. */
static double run_worst_ratio, run_worst_abs;

static int group_setup(void **state)
{
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    rc.backend = "cpu";
    rc.cpu_threads = 1;
    char err[256];
    if (!(cpu_rt = model_runtime_new(&rc, err, sizeof(err)))) {
        fprintf(stderr, "model_runtime_new: %s\n", err);
        return -1;
    }
    struct fixture *fx = calloc(1, sizeof(*fx));
    if (!fx) return -1;
    snprintf(fx->dir, sizeof(fx->dir), "/tmp/kinfer_encoder_XXXXXX");
    if (!mkdtemp(fx->dir)) return -1;
    *state = fx;
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Removes dir and everything in it. */
static void rm_rf(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int group_teardown(void **state)
{
    struct fixture *fx = *state;
    rm_rf(fx->dir);
    free(fx);
    model_runtime_destroy(cpu_rt);
    fprintf(stderr, "test_encoder: worst err/tol %.3g (tol %g), largest error %.3g\n",
            run_worst_ratio, TOL, run_worst_abs);
    return 0;
}

/* A fresh folder path under the fixture's directory. */
static void folder(void **state, const char *name, char *out, size_t n)
{
    struct fixture *fx = *state;
    snprintf(out, n, "%s/%s", fx->dir, name);
    rm_rf(out);
}

/* Loads rm's folder with overrides o (NULL: none); fails the test when
 * refused. */
static struct model *load(struct re_model *rm, const struct model_encoder_spec *o)
{
    if (o) rm->spec.enc = *o;
    else model_encoder_spec_defaults(&rm->spec.enc);
    char err[512] = "";
    struct model *m = model_load(cpu_rt, &rm->spec, err, sizeof(err));
    if (!m) fail_msg("%s: model_load: %s", rm->d.what ? rm->d.what : rm->dir, err);
    return m;
}

static struct model_ws *ws_new(const struct model *m, size_t rows, size_t tokens)
{
    char err[256];
    struct model_ws *ws = model_ws_new_tokens(m, 0, rows, tokens, err, sizeof(err));
    if (!ws) fail_msg("model_ws_new_tokens(%zu, %zu): %s", rows, tokens, err);
    return ws;
}

/* The tolerance check above; keeps the run's worst. */
static double check(const float *got, const double *ref, size_t n, const char *what)
{
    double r = check_close_tol(got, ref, n, TOL, what);
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (e > run_worst_abs) run_worst_abs = e;
    }
    if (r > run_worst_ratio) run_worst_ratio = r;
    return r;
}

/* Runs batch b through m and the reference with head h; returns the
 * worst err/tol ratio. */
static double encode_check(const struct re_model *rm, const struct re_head *h, struct model *m,
                           struct model_ws *ws, const struct re_batch *b, const char *what)
{
    const float *out = NULL;
    int rc = model_encode(m, ws, &b->s, &out);
    if (rc != MODEL_OK) fail_msg("%s: model_encode: %d (%s)", what, rc, model_ws_error(ws));
    assert_non_null(out);
    size_t count;
    double *ref = re_encode(rm, h, &b->s, &count);
    double r = check(out, ref, count, what);
    free(ref);
    return r;
}

/* ---- every head and pooling against the reference ------------------- */

/* An override of a yes/no setting: KEEP the folder's, or SET_ON / SET_OFF. */
enum { KEEP = 0, SET_ON, SET_OFF };

/* One model: a folder description and the model entry's overrides (zero:
 * the folder's). */
struct variant {
    struct re_desc d;
    const char *pooling;  /* "cls", "mean", "max", "none"; NULL = keep */
    int normalize;        /* KEEP, SET_ON, SET_OFF */
    int embedder;         /* 1: head embedding, whatever the folder is */
    int sigmoid;          /* KEEP, SET_ON, SET_OFF */
    size_t max_tokens;
};

/* The entry's overrides of variant V, as a model_encoder_spec. */
static struct model_encoder_spec overrides(const struct variant *V)
{
    struct model_encoder_spec o;
    model_encoder_spec_defaults(&o);
    if (V->pooling) {
        enum model_pooling p;
        assert_int_equal(model_pooling_parse(V->pooling, &p), 0);
        o.pooling = (int)p;
    }
    if (V->normalize) o.normalize = V->normalize == SET_ON;
    if (V->embedder) o.head = MODEL_HEAD_EMBEDDING;
    if (V->sigmoid) o.sigmoid = V->sigmoid == SET_ON;
    o.max_tokens = V->max_tokens;
    return o;
}

static const struct variant variants[] = {
    {.d = {.what = "cls (no modules.json), F32"}},
    {.d = {.what = "mean + normalize (modules.json)", .st = 1, .st_pool = MODEL_POOL_MEAN,
      .st_normalize = 1}},
    {.d = {.what = "max (modules.json), BF16", .st = 1, .st_pool = MODEL_POOL_MAX,
           .dtype = "BF16"}},
    {.d = {.what = "cls (modules.json) + normalize, F16", .st = 1, .st_pool = MODEL_POOL_CLS,
      .st_normalize = 1, .dtype = "F16"}},
    {.d = {.what = "none (override), F16", .dtype = "F16"}, .pooling = "none"},
    {.d = {.what = "none + normalize (overrides)"},
     .pooling = "none", .normalize = SET_ON},
    {.d = {.what = "modules.json cls+normalize overridden to mean, not normalized", .st = 1,
      .st_pool = MODEL_POOL_CLS, .st_normalize = 1},
     .pooling = "mean", .normalize = SET_OFF},
    {.d = {.what = "bert. prefix, gamma/beta, gelu_new, mean", .prefix = 1, .old_ln = 1,
      .act = "gelu_new", .st = 1, .st_pool = MODEL_POOL_MEAN}},
    {.d = {.what = "gelu_pytorch_tanh, layer_norm_eps 0.05, max", .act = "gelu_pytorch_tanh",
      .eps = 0.05},
     .pooling = "max"},
    {.d = {.what = "classifier, softmax, 3 labels, model_max_length 24", .n_labels = 3,
           .tok_max = 24}},
    {.d = {.what = "classifier, sigmoid (multi_label), bert. prefix, F16", .n_labels = 4,
      .multi_label = 1, .prefix = 1, .dtype = "F16"}},
    {.d = {.what = "classifier, sigmoid by override, BF16", .n_labels = 2, .dtype = "BF16"},
     .sigmoid = SET_ON},
    {.d = {.what = "classifier, one label (a cross-encoder): sigmoid", .n_labels = 1}},
    {.d = {.what = "classifier, 40 labels (more than hidden)", .n_labels = 40}},
    {.d = {.what = "classifier folder read as a mean embedder", .n_labels = 3},
     .embedder = 1, .pooling = "mean"},
    {.d = {.what = "other shape: 3 layers, hidden 24, 3 heads, type_vocab 1, mean", .layers = 3,
      .hidden = 24, .heads = 3, .inter = 40, .max_pos = 24, .type_vocab = 1, .st = 1,
      .st_pool = MODEL_POOL_MEAN}},
    {.d = {.what = "other shape: classifier, 3 layers, hidden 24, 3 heads", .layers = 3,
      .hidden = 24, .heads = 3, .inter = 40, .max_pos = 24, .n_labels = 5}},
    {.d = {.what = "1 layer, hidden 64, 16 heads (dh 4), max_seq_length 20, model_max_length 30",
      .layers = 1, .hidden = 64, .heads = 16, .inter = 128, .max_pos = 48, .st_max_seq = 20,
      .tok_max = 30, .st = 1, .st_pool = MODEL_POOL_MAX, .st_normalize = 1}},
    {.d = {.what = "max_tokens override 9 below model_max_length 16", .tok_max = 16},
     .max_tokens = 9},
};

/* What model_encoder() says agrees with the folder and the overrides. */
static void check_info(const struct model *m, const struct re_model *rm, const struct re_head *h,
                       size_t max_tokens, const char *what)
{
    const struct model_encoder_info *e = model_encoder(m);
    if (!e) fail_msg("%s: model_encoder is NULL", what);
    assert_non_null(e->tokenizer);
    assert_int_equal(e->hidden, rm->d.hidden);
    assert_int_equal(e->layers, rm->d.layers);
    assert_int_equal(e->heads, rm->d.heads);
    assert_int_equal(e->intermediate, rm->d.inter);
    assert_int_equal(e->vocab, rm->vocab);
    assert_int_equal(e->type_vocab, rm->d.type_vocab);
    if (e->max_tokens != max_tokens)
        fail_msg("%s: max_tokens %zu, expected %zu", what, e->max_tokens, max_tokens);
    if ((int)e->head != (int)h->head || e->sigmoid != h->sigmoid)
        fail_msg("%s: head %d sigmoid %d, expected %d %d", what, e->head, e->sigmoid, h->head,
                 h->sigmoid);
    if (h->head == MODEL_HEAD_EMBEDDING &&
        ((int)e->pooling != (int)h->pooling || e->normalize != h->normalize))
        fail_msg("%s: pooling %s normalize %d, expected %s %d", what,
                 model_pooling_name(e->pooling), e->normalize, model_pooling_name(h->pooling),
                 h->normalize);
    assert_int_equal(e->padded, 0); /* the CPU packs */
    assert_int_equal(model_input_width(m), 0);
    assert_int_equal(model_output_width(m), re_width(rm, h));
    size_t params = rm->n_params, H = rm->d.hidden, nl = rm->d.n_labels;
    if (h->head == MODEL_HEAD_EMBEDDING && nl) /* the pooler and classifier go unread */
        params -= H * H + H + nl * H + nl;
    assert_int_equal(model_param_count(m), params);
    if (h->head == MODEL_HEAD_CLASSIFIER) {
        assert_int_equal(e->n_labels, rm->d.n_labels);
        for (size_t i = 0; i < e->n_labels; i++) {
            char want[32];
            snprintf(want, sizeof(want), "class_%zu", i);
            assert_string_equal(e->labels[i], want);
        }
    } else {
        assert_int_equal(e->n_labels, 0);
    }
}

/* Every variant: a fresh random folder, loaded, its description checked,
 * then two random batches (with and without type ids; one sequence of
 * the longest allowed length, one of length 1 often) against the
 * reference, and the same batch twice giving the same bits. */
static void test_reference(void **state)
{
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        const struct variant *V = &variants[v];
        char dir[128];
        folder(state, "ref", dir, sizeof(dir));
        struct re_model rm;
        re_build(&V->d, dir, &rm);
        struct model_encoder_spec o = overrides(V);
        struct model *m = load(&rm, &o);
        struct re_head h = re_expect(&rm, &o);
        size_t maxt = re_max_tokens(&rm, V->max_tokens);
        check_info(m, &rm, &h, maxt, V->d.what);
        size_t rows = rand_between(3, 7);
        struct model_ws *ws = ws_new(m, rows, rows * maxt);
        double worst = 0;
        for (int types = 0; types < 2; types++) {
            struct re_batch b;
            re_batch_random(&b, &rm, rand_between(1, rows), maxt, types);
            double r = encode_check(&rm, &h, m, ws, &b, V->d.what);
            worst = r > worst ? r : worst;
            /* the same batch again over the same workspace: the same bits */
            size_t count = (h.head == MODEL_HEAD_EMBEDDING && h.pooling == MODEL_POOL_NONE
                                ? b.total
                                : b.n) *
                           model_output_width(m);
            const float *out;
            assert_int_equal(model_encode(m, ws, &b.s, &out), MODEL_OK);
            float *first = malloc(count * sizeof(float));
            assert_non_null(first);
            memcpy(first, out, count * sizeof(float));
            assert_int_equal(model_encode(m, ws, &b.s, &out), MODEL_OK);
            assert_memory_equal(first, out, count * sizeof(float));
            free(first);
            re_batch_free(&b);
        }
        printf("  %-80s worst err/tol %.3f\n", V->d.what, worst);
        model_ws_destroy(ws);
        model_destroy(m);
        re_free(&rm);
    }
}

/* ---- packing: a batch is each sequence alone ------------------------ */

/* For a mean embedder, every token's vectors, max + normalize and a
 * classifier: a packed batch of sequences of different lengths (1 and the
 * longest among them) gives, row for row, what each sequence gives alone
 * in the same workspace, and both match the reference; a batch of more
 * tokens than the feed-forward runs at once (1024) is right across the
 * chunks; then a short batch after the long ones (stale buffers) is still
 * right. A sequence seeing its neighbours, or positions not restarting at
 * 0, fails here. */
static void test_packed_vs_alone(void **state)
{
    static const struct variant vs[] = {
        {.d = {.what = "packed: mean", .st = 1, .st_pool = MODEL_POOL_MEAN}},
        {.d = {.what = "packed: none"}, .pooling = "none"},
        {.d = {.what = "packed: max + normalize"}, .pooling = "max", .normalize = SET_ON},
        {.d = {.what = "packed: classifier", .n_labels = 3}},
    };
    for (size_t v = 0; v < sizeof(vs) / sizeof(vs[0]); v++) {
        char dir[128];
        folder(state, "packed", dir, sizeof(dir));
        struct re_model rm;
        re_build(&vs[v].d, dir, &rm);
        struct model_encoder_spec o = overrides(&vs[v]);
        struct model *m = load(&rm, &o);
        struct re_head h = re_expect(&rm, &o);
        size_t maxt = rm.d.max_pos, W = model_output_width(m);
        int tokens = h.head == MODEL_HEAD_EMBEDDING && h.pooling == MODEL_POOL_NONE;
        struct model_ws *ws = ws_new(m, 8, 8 * maxt);
        size_t lens[6] = {maxt, 1, rand_between(2, maxt - 1), rand_between(2, maxt - 1), 2,
                          rand_between(1, maxt)};
        struct re_batch b;
        re_batch_make(&b, &rm, lens, 6, 1);
        encode_check(&rm, &h, m, ws, &b, vs[v].d.what);
        size_t count = (tokens ? b.total : b.n) * W;
        const float *out;
        assert_int_equal(model_encode(m, ws, &b.s, &out), MODEL_OK);
        float *batch = malloc(count * sizeof(float));
        assert_non_null(batch);
        memcpy(batch, out, count * sizeof(float));
        for (size_t i = 0; i < b.n; i++) {
            uint32_t off[2] = {0, b.offsets[i + 1] - b.offsets[i]};
            struct model_seqs one = {b.ids + b.offsets[i], b.types + b.offsets[i], off, 1};
            assert_int_equal(model_encode(m, ws, &one, &out), MODEL_OK);
            const float *want = batch + (tokens ? b.offsets[i] : i) * W;
            size_t n = (tokens ? off[1] : 1) * W;
            for (size_t k = 0; k < n; k++)
                if (fabsf(out[k] - want[k]) > TOL * fmaxf(1.0f, fabsf(want[k])))
                    fail_msg("%s: sequence %zu (%u tokens) alone: [%zu] %.9g, in the batch %.9g",
                             vs[v].d.what, i, off[1], k, (double)out[k], (double)want[k]);
        }
        free(batch);
        re_batch_free(&b);
        /* more tokens than the feed-forward's chunk (1024) in one batch */
        size_t big_lens[40];
        for (size_t i = 0; i < 40; i++) big_lens[i] = rand_between(maxt - 12, maxt);
        struct model_ws *big = ws_new(m, 40, 40 * maxt);
        re_batch_make(&b, &rm, big_lens, 40, 1);
        assert_true(b.total > 1100);
        encode_check(&rm, &h, m, big, &b, vs[v].d.what);
        re_batch_free(&b);
        model_ws_destroy(big);
        /* a short batch after the long one */
        size_t short_lens[2] = {2, 3};
        re_batch_make(&b, &rm, short_lens, 2, 0);
        encode_check(&rm, &h, m, ws, &b, vs[v].d.what);
        re_batch_free(&b);
        model_ws_destroy(ws);
        model_destroy(m);
        re_free(&rm);
    }
}

/* ---- pairs and truncation through the tokenizer ---------------------- */

/* Encodes text (and pair) with the model's own tokenizer at its limit;
 * returns the count, the ids and type ids in the caller's arrays. */
static int tokenize(const struct model_encoder_info *e, struct tokenizer_scratch *sc,
                    const char *text, const char *pair, size_t max, int truncate, int32_t *ids,
                    int32_t *types, size_t *full)
{
    char err[256];
    return tokenizer_encode(e->tokenizer, sc, text, strlen(text), pair, pair ? strlen(pair) : 0,
                            max, truncate, ids, types, 256, full, err, sizeof(err));
}

/* Text pairs truncated by tokenizer_encode to the model's max_tokens (an
 * override, 12) feed model_encode: [CLS] A' [SEP] B' [SEP] with A' and
 * B' prefixes of A and B, B' and its [SEP] of type id 1, and the outputs
 * match the reference computed on those very ids and type ids. The type
 * ids matter (the same ids as one segment give other outputs); one token
 * over the limit is refused, and without truncation the text is too
 * long with its full length reported. */
static void test_pairs_truncation(void **state)
{
    char dir[128];
    folder(state, "pairs", dir, sizeof(dir));
    struct re_desc d = {.what = "pairs", .st = 1, .st_pool = MODEL_POOL_MEAN, .st_normalize = 1};
    struct re_model rm;
    re_build(&d, dir, &rm);
    struct model_encoder_spec o;
    model_encoder_spec_defaults(&o);
    o.max_tokens = 12;
    struct model *m = load(&rm, &o);
    const struct model_encoder_info *e = model_encoder(m);
    assert_int_equal(e->max_tokens, 12);
    struct re_head h = re_expect(&rm, &o);
    struct tokenizer_scratch *sc = tokenizer_scratch_new(0);
    assert_non_null(sc);
    const char *A = "The cat sat on the mat, and the dog ran fast!";
    const char *B = "Hello world: kafka, redis";
    int32_t a_ids[256], b_ids[256], ids[4][256], types[4][256];
    size_t full = 0;
    int na = tokenize(e, sc, A, NULL, 0, 0, a_ids, NULL, &full);
    int nb = tokenize(e, sc, B, NULL, 0, 0, b_ids, NULL, &full);
    assert_true(na > 12 && nb > 3);
    /* the pair, truncated longest-first */
    int n0 = tokenize(e, sc, A, B, e->max_tokens, 1, ids[0], types[0], &full);
    assert_int_equal(n0, 12);
    assert_int_equal(full, (size_t)(na + nb - 1));
    assert_int_equal(ids[0][0], RE_CLS);
    assert_int_equal(ids[0][11], RE_SEP);
    int sep = -1;
    for (int t = 1; t < 11 && sep < 0; t++)
        if (ids[0][t] == RE_SEP) sep = t;
    assert_true(sep > 1 && sep < 10); /* both segments kept something */
    assert_memory_equal(ids[0] + 1, a_ids + 1, (size_t)(sep - 1) * sizeof(int32_t));
    assert_memory_equal(ids[0] + sep + 1, b_ids + 1, (size_t)(10 - sep) * sizeof(int32_t));
    for (int t = 0; t < 12; t++) assert_int_equal(types[0][t], t > sep ? 1 : 0);
    /* one text truncated; a short pair untruncated; one text without truncation */
    int n1 = tokenize(e, sc, A, NULL, e->max_tokens, 1, ids[1], types[1], &full);
    assert_int_equal(n1, 12);
    assert_memory_equal(ids[1], a_ids, 11 * sizeof(int32_t));
    assert_int_equal(ids[1][11], RE_SEP);
    int n2 = tokenize(e, sc, "kafka", "redis batch", e->max_tokens, 1, ids[2], types[2], &full);
    assert_int_equal(n2, 6);
    assert_int_equal(types[2][5], 1);
    assert_int_equal(types[2][2], 0);
    assert_int_equal(tokenize(e, sc, A, NULL, e->max_tokens, 0, ids[3], types[3], &full),
                     TOKENIZER_ERR_TOO_LONG);
    assert_int_equal(full, (size_t)na);
    int n3 = tokenize(e, sc, "Kafka!", NULL, e->max_tokens, 0, ids[3], types[3], &full);
    assert_int_equal(n3, 4);

    /* packed into one batch */
    int ns[4] = {n0, n1, n2, n3};
    int32_t all_ids[64], all_types[64];
    uint32_t off[5] = {0};
    for (int i = 0; i < 4; i++) {
        memcpy(all_ids + off[i], ids[i], (size_t)ns[i] * sizeof(int32_t));
        memcpy(all_types + off[i], types[i], (size_t)ns[i] * sizeof(int32_t));
        off[i + 1] = off[i] + (uint32_t)ns[i];
    }
    struct model_seqs s = {all_ids, all_types, off, 4};
    struct model_ws *ws = ws_new(m, 4, 48);
    struct re_batch b = {.s = s};
    encode_check(&rm, &h, m, ws, &b, "pairs through the tokenizer");
    /* the type ids take part: the pair as one segment differs */
    const float *out;
    assert_int_equal(model_encode(m, ws, &s, &out), MODEL_OK);
    float first[32];
    memcpy(first, out, sizeof(first));
    struct model_seqs flat = {all_ids, NULL, off, 1};
    assert_int_equal(model_encode(m, ws, &flat, &out), MODEL_OK);
    double diff = 0;
    for (int k = 0; k < 32; k++) diff = fmax(diff, fabs((double)out[k] - first[k]));
    assert_true(diff > 1e-3);
    /* one token over the limit */
    int32_t longer[256];
    int n4 = tokenize(e, sc, A, B, 13, 1, longer, NULL, &full);
    assert_int_equal(n4, 13);
    uint32_t off13[2] = {0, 13};
    struct model_seqs over = {longer, NULL, off13, 1};
    assert_int_equal(model_encode(m, ws, &over, &out), MODEL_EINVAL);
    tokenizer_scratch_destroy(sc);
    model_ws_destroy(ws);
    model_destroy(m);
    re_free(&rm);
}

/* A classifier without id2label names its labels LABEL_0...; with
 * problem_type single_label_classification it is softmax. */
static void test_default_labels(void **state)
{
    char dir[128];
    folder(state, "labels", dir, sizeof(dir));
    struct re_desc d = {.what = "labels", .n_labels = 3};
    struct re_model rm;
    re_build(&d, dir, &rm);
    re_config_set(dir, "id2label", NULL);
    re_config_set(dir, "label2id", NULL);
    re_config_set(dir, "problem_type", "\"single_label_classification\"");
    struct model *m = load(&rm, NULL);
    const struct model_encoder_info *e = model_encoder(m);
    assert_int_equal(e->n_labels, 3);
    assert_int_equal(e->sigmoid, 0);
    for (size_t i = 0; i < 3; i++) {
        char want[32];
        snprintf(want, sizeof(want), "LABEL_%zu", i);
        assert_string_equal(e->labels[i], want);
    }
    struct re_head h = re_expect(&rm, &rm.spec.enc);
    struct model_ws *ws = ws_new(m, 3, 3 * 40);
    struct re_batch b;
    re_batch_random(&b, &rm, 3, 40, 1);
    encode_check(&rm, &h, m, ws, &b, "labels");
    re_batch_free(&b);
    model_ws_destroy(ws);
    model_destroy(m);
    re_free(&rm);
}

/* The tokenizer a folder gives: tokenizer.json over vocab.txt (here one
 * of 818 tokens from the tokenizer's tests beside a vocab.txt of 92),
 * vocab.txt with tokenizer_config.json's lower-casing, and the entry's
 * lowercase override (which needs vocab.txt). Text through the chosen
 * tokenizer runs and matches the reference. */
static void test_tokenizer_files(void **state)
{
    char dir[128], path[256], err[512];
    folder(state, "tok", dir, sizeof(dir));
    struct re_desc d = {.what = "tokenizer.json", .vocab = 830};
    struct re_model rm;
    re_build(&d, dir, &rm);
    /* vocab.txt alone, lower-cased as tokenizer_config.json says */
    struct model *m = load(&rm, NULL);
    const struct model_encoder_info *e = model_encoder(m);
    assert_int_equal(tokenizer_vocab_size(e->tokenizer), RE_N_WORDS);
    struct tokenizer_scratch *sc = tokenizer_scratch_new(0);
    int32_t ids[64];
    assert_int_equal(tokenize(e, sc, "Kafka", NULL, 0, 0, ids, NULL, NULL), 3);
    assert_int_equal(ids[1], tokenizer_token_id(e->tokenizer, "kafka"));
    model_destroy(m);
    /* lowercase off: "Kafka" is unknown to an uncased vocabulary */
    struct model_encoder_spec o;
    model_encoder_spec_defaults(&o);
    o.lowercase = 0;
    m = load(&rm, &o);
    e = model_encoder(m);
    assert_int_equal(tokenize(e, sc, "Kafka", NULL, 0, 0, ids, NULL, NULL), 3);
    assert_int_equal(ids[1], tokenizer_special_id(e->tokenizer, TOKENIZER_UNK));
    model_destroy(m);
    /* tokenizer.json wins over vocab.txt */
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cp tests/data/wordpiece/tokenizer.json '%s/'", dir);
    assert_int_equal(system(cmd), 0);
    m = load(&rm, NULL);
    e = model_encoder(m);
    assert_int_equal(tokenizer_vocab_size(e->tokenizer), 818);
    int n = tokenize(e, sc, "Hello, world! The quick brown fox.", "A pair", e->max_tokens, 1, ids,
                     NULL, NULL);
    assert_true(n > 6);
    int32_t types[64];
    assert_int_equal(tokenize(e, sc, "Hello, world! The quick brown fox.", "A pair", e->max_tokens,
                              1, ids, types, NULL), n);
    uint32_t off[2] = {0, (uint32_t)n};
    struct re_batch b = {.s = {ids, types, off, 1}};
    struct model_ws *ws = ws_new(m, 1, 40);
    struct re_head h = re_expect(&rm, &rm.spec.enc);
    encode_check(&rm, &h, m, ws, &b, "text through tokenizer.json");
    model_ws_destroy(ws);
    model_destroy(m);
    /* the lowercase override needs vocab.txt */
    snprintf(path, sizeof(path), "%s/vocab.txt", dir);
    assert_int_equal(unlink(path), 0);
    rm.spec.enc = o;
    assert_null(model_load(cpu_rt, &rm.spec, err, sizeof(err)));
    assert_true(strncmp(err, "model t: ", 9) == 0);
    assert_non_null(strstr(err, ": the lowercase override needs vocab.txt in the folder"));
    tokenizer_scratch_destroy(sc);
    re_free(&rm);
}

/* ---- what model_encode refuses --------------------------------------- */

enum bad { BAD_ID_VOCAB, BAD_ID_NEG, BAD_TYPE, BAD_TYPE_NEG, BAD_ROWS, BAD_TOKENS,
           BAD_EMPTY, BAD_LONG, BAD_OFFSET0, BAD_N0, BAD_NULL_IDS, BAD_NULL_OFFSETS,
           BAD_NULL_OUT, BAD_WS_OTHER, BAD_LAYER_MODEL };

static const struct {
    const char *what;
    enum bad bad;
} einval[] = {
    {"a token id equal to vocab_size", BAD_ID_VOCAB},
    {"a negative token id", BAD_ID_NEG},
    {"a type id equal to type_vocab_size", BAD_TYPE},
    {"a negative type id", BAD_TYPE_NEG},
    {"more sequences than the workspace's rows", BAD_ROWS},
    {"rows x the longest over the workspace's tokens", BAD_TOKENS},
    {"an empty sequence", BAD_EMPTY},
    {"a sequence over max_tokens", BAD_LONG},
    {"offsets[0] not 0", BAD_OFFSET0},
    {"no sequences", BAD_N0},
    {"ids NULL", BAD_NULL_IDS},
    {"offsets NULL", BAD_NULL_OFFSETS},
    {"out NULL", BAD_NULL_OUT},
    {"a workspace of another encoder", BAD_WS_OTHER},
    {"a layer model", BAD_LAYER_MODEL},
};

/* Each bad call is refused with MODEL_EINVAL, leaving the workspace fit
 * for the next good batch (checked against the reference after every
 * refusal); the limits themselves (n x longest == tokens, a sequence of
 * exactly max_tokens, the largest id and type id) are accepted. */
static void test_encode_einval(void **state)
{
    char dir[128], other_dir[128], mlp[160];
    folder(state, "einval", dir, sizeof(dir));
    folder(state, "einval2", other_dir, sizeof(other_dir));
    struct re_desc d = {.what = "einval", .max_pos = 16};
    struct re_model rm, other;
    re_build(&d, dir, &rm);
    re_build(&d, other_dir, &other);
    struct model *m = load(&rm, NULL), *m2 = load(&other, NULL);
    struct re_head h = re_expect(&rm, &rm.spec.enc);
    /* a layer model */
    char err[512];
    snprintf(mlp, sizeof(mlp), "%s/mlp.safetensors", ((struct fixture *)*state)->dir);
    assert_int_equal(model_write_demo(mlp, 4, 8, 2, 7, err, sizeof(err)), 0);
    struct model_layer_spec ls[3] = {{.op = MODEL_OP_DENSE}, {.op = MODEL_OP_RELU},
                                     {.op = MODEL_OP_DENSE}};
    snprintf(ls[0].weight, sizeof(ls[0].weight), "0.weight");
    snprintf(ls[0].bias, sizeof(ls[0].bias), "0.bias");
    snprintf(ls[2].weight, sizeof(ls[2].weight), "2.weight");
    snprintf(ls[2].bias, sizeof(ls[2].bias), "2.bias");
    struct model_spec lspec = {.name = "mlp", .layers = ls, .n_layers = 3};
    snprintf(lspec.path, sizeof(lspec.path), "%s", mlp);
    struct model *lm = model_load(cpu_rt, &lspec, err, sizeof(err));
    if (!lm) fail_msg("layer model: %s", err);
    struct model_ws *lws = model_ws_new(lm, 0, 4, err, sizeof(err));
    assert_non_null(lws);

    /* rows 4, tokens 40: 4 x 10 fits, 3 x 14 does not */
    struct model_ws *ws = ws_new(m, 4, 40), *ws2 = ws_new(m2, 4, 40);
    size_t edge[4] = {10, 10, 10, 10};
    struct re_batch good;
    re_batch_make(&good, &rm, edge, 4, 1);
    good.ids[3] = (int32_t)rm.vocab - 1; /* the largest id, type id */
    good.types[4] = (int32_t)rm.d.type_vocab - 1;
    encode_check(&rm, &h, m, ws, &good, "n x longest == the workspace's tokens");
    size_t at_max[2] = {16, 3};
    struct re_batch full;
    re_batch_make(&full, &rm, at_max, 2, 1);
    encode_check(&rm, &h, m, ws, &full, "a sequence of max_tokens");
    re_batch_free(&full);

    for (size_t i = 0; i < sizeof(einval) / sizeof(einval[0]); i++) {
        size_t lens[5] = {3, 5, 2, 4, 1};
        size_t n = 3;
        if (einval[i].bad == BAD_ROWS) n = 5;
        if (einval[i].bad == BAD_TOKENS) {
            lens[0] = 14; /* 3 x 14 = 42 > 40, though only 17 tokens */
            lens[1] = lens[2] = 1;
        }
        if (einval[i].bad == BAD_LONG) { /* 17 > max_tokens 16, though 17 <= 40 tokens */
            n = 1;
            lens[0] = 17;
        }
        struct re_batch b;
        re_batch_make(&b, &rm, lens, n, 1);
        struct model_seqs s = b.s;
        const float *out = NULL, **outp = &out;
        const struct model *mm = m;
        struct model_ws *w = ws;
        switch (einval[i].bad) {
        case BAD_ID_VOCAB: b.ids[4] = (int32_t)rm.vocab; break;
        case BAD_ID_NEG: b.ids[b.total - 1] = -1; break;
        case BAD_TYPE: b.types[2] = (int32_t)rm.d.type_vocab; break;
        case BAD_TYPE_NEG: b.types[0] = -1; break;
        case BAD_EMPTY: b.offsets[2] = b.offsets[1]; break;
        case BAD_OFFSET0: b.offsets[0] = 1; break;
        case BAD_N0: s.n = 0; break;
        case BAD_NULL_IDS: s.ids = NULL; break;
        case BAD_NULL_OFFSETS: s.offsets = NULL; break;
        case BAD_NULL_OUT: outp = NULL; break;
        case BAD_WS_OTHER: w = ws2; break;
        case BAD_LAYER_MODEL: mm = lm; w = lws; break;
        default: break;
        }
        int rc = model_encode(mm, w, &s, outp);
        if (rc != MODEL_EINVAL)
            fail_msg("%s: model_encode gave %d, not EINVAL", einval[i].what, rc);
        assert_null(out);
        re_batch_free(&b);
        /* the workspace still serves */
        encode_check(&rm, &h, m, ws, &good, einval[i].what);
    }
    /* a layer model's workspace given to the encoder */
    const float *out = NULL;
    assert_int_equal(model_encode(m, lws, &good.s, &out), MODEL_EINVAL);
    assert_int_equal(model_encode(NULL, ws, &good.s, &out), MODEL_EINVAL);
    assert_int_equal(model_encode(m, NULL, &good.s, &out), MODEL_EINVAL);
    assert_int_equal(model_encode(m, ws, NULL, &out), MODEL_EINVAL);
    re_batch_free(&good);
    model_ws_destroy(lws);
    model_destroy(lm);
    model_ws_destroy(ws);
    model_ws_destroy(ws2);
    model_destroy(m);
    model_destroy(m2);
    re_free(&rm);
    re_free(&other);
}

/* An encoder is not a layer model and back: model_forward on an encoder
 * is EINVAL, model_ws_new refuses an encoder and model_ws_new_tokens a
 * layer model (with messages), model_encoder of a layer model is NULL,
 * and impossible token workspaces are refused. */
static void test_encoder_vs_layers(void **state)
{
    char dir[128], mlp[160], err[512];
    folder(state, "kinds", dir, sizeof(dir));
    struct re_desc d = {.what = "kinds"};
    struct re_model rm;
    re_build(&d, dir, &rm);
    struct model *m = load(&rm, NULL);
    struct model_ws *ws = ws_new(m, 2, 64);
    float in[64] = {0};
    const float *out = NULL;
    assert_int_equal(model_forward(m, ws, in, 1, &out), MODEL_EINVAL);
    assert_null(out);
    assert_null(model_ws_new(m, 0, 4, err, sizeof(err)));
    assert_non_null(strstr(err, "model t is an encoder: its workspace is sized in tokens"));
    assert_null(model_ws_new_tokens(m, 0, 4, 3, err, sizeof(err)));
    assert_non_null(strstr(err, "model t: a workspace of 4 rows and 3 tokens is not possible"));
    assert_null(model_ws_new_tokens(m, 0, 0, 8, err, sizeof(err)));
    assert_non_null(strstr(err, "model t: "));

    snprintf(mlp, sizeof(mlp), "%s/kinds.safetensors", ((struct fixture *)*state)->dir);
    assert_int_equal(model_write_demo(mlp, 4, 8, 2, 7, err, sizeof(err)), 0);
    struct model_layer_spec ls[1] = {{.op = MODEL_OP_DENSE}};
    snprintf(ls[0].weight, sizeof(ls[0].weight), "0.weight");
    struct model_spec lspec = {.name = "mlp", .layers = ls, .n_layers = 1};
    snprintf(lspec.path, sizeof(lspec.path), "%s", mlp);
    struct model *lm = model_load(cpu_rt, &lspec, err, sizeof(err));
    if (!lm) fail_msg("layer model: %s", err);
    assert_null(model_encoder(lm));
    assert_null(model_ws_new_tokens(lm, 0, 4, 64, err, sizeof(err)));
    assert_non_null(strstr(err, "model mlp is not an encoder"));
    /* layers given for a folder */
    struct model_spec both = rm.spec;
    both.layers = ls;
    both.n_layers = 1;
    assert_null(model_load(cpu_rt, &both, err, sizeof(err)));
    assert_non_null(strstr(err, "model t: "));
    assert_non_null(strstr(err, "is a directory: a model with layers is a safetensors file"));
    model_destroy(lm);
    model_ws_destroy(ws);
    model_destroy(m);
    re_free(&rm);
}

/* ---- folders that must be refused ------------------------------------ */

/* One bad folder: a good folder made from d, then one change, and the
 * words the message must hold (besides "model t: "). */
struct bad_folder {
    const char *what;
    struct re_desc d;
    const char *cfg_key, *cfg_json;  /* config.json: set key (cfg_json NULL: remove) */
    const char *file, *text;         /* a file written over */
    const char *rm;                  /* a file removed */
    size_t max_tokens;               /* the entry's max_tokens */
    int classifier;                  /* the entry says head classifier */
    const char *want[3];
};

static const struct bad_folder bad_folders[] = {
    {"no config.json", {0}, .rm = "config.json",
     .want = {"config.json: no such file"}},
    {"config.json not JSON", {0}, .file = "config.json", .text = "{\"hidden_size\": ",
     .want = {"config.json:"}},
    {"no model.safetensors", {0}, .rm = "model.safetensors",
     .want = {"model.safetensors: no such file"}},
    {"a tensor missing", {.omit = "encoder.layer.1.output.dense.bias"},
     .want = {"tensor encoder.layer.1.output.dense.bias not found in model.safetensors"}},
    {"an embedding missing, bert. prefix", {.omit = "embeddings.position_embeddings.weight",
                                             .prefix = 1},
     .want = {"tensor embeddings.position_embeddings.weight not found",
              "bert.embeddings.position_embeddings.weight"}},
    {"a matrix of the wrong shape", {.misshape = "encoder.layer.0.attention.self.key.weight"},
          .want = {"tensor encoder.layer.0.attention.self.key.weight has shape [32,33], "
              "expected [32,32]"}},
    {"a vector of the wrong shape, bert. prefix, gamma",
     {.misshape = "encoder.layer.1.output.LayerNorm.weight", .prefix = 1, .old_ln = 1},
          .want = {"tensor bert.encoder.layer.1.output.LayerNorm.gamma has shape [33], "
              "expected [32]"}},
    {"a tensor of dtype I32", {.as_i32 = "encoder.layer.0.intermediate.dense.bias"},
     .want = {"tensor encoder.layer.0.intermediate.dense.bias has dtype I32, expected F32, F16 "
              "or BF16"}},
    {"hidden_size not a multiple of the heads", {0}, .cfg_key = "num_attention_heads",
     .cfg_json = "5",
     .want = {"config.json: hidden_size 32 is not a multiple of num_attention_heads 5"}},
    {"hidden_size missing", {0}, .cfg_key = "hidden_size",
     .want = {"config.json: hidden_size is missing"}},
    {"hidden_act relu", {.act = "relu"},
     .want = {"config.json: hidden_act \"relu\" is not supported"}},
    {"model_type gpt2", {0}, .cfg_key = "model_type", .cfg_json = "\"gpt2\"",
     .want = {"config.json: model_type \"gpt2\" is not one this build runs (bert, roberta, "
              "xlm-roberta, camembert, mpnet, distilbert, nomic_bert)"}},
    {"relative positions", {0}, .cfg_key = "position_embedding_type",
     .cfg_json = "\"relative_key\"",
     .want = {"position_embedding_type \"relative_key\": only absolute positions"}},
    {"layer_norm_eps 0", {0}, .cfg_key = "layer_norm_eps", .cfg_json = "0",
     .want = {"config.json: layer_norm_eps must be > 0 and < 1"}},
    {"pooling mean_sqrt_len", {.st = 1, .st_pool = MODEL_POOL_MEAN},
     .file = "1_Pooling/config.json",
     .text = "{\"pooling_mode_mean_sqrt_len_tokens\": true}",
     .want = {"1_Pooling/config.json: pooling_mode_mean_sqrt_len_tokens is not supported"}},
    {"two pooling modes", {.st = 1, .st_pool = MODEL_POOL_MEAN},
     .file = "1_Pooling/config.json",
     .text = "{\"pooling_mode_cls_token\": true, \"pooling_mode_max_tokens\": true}",
     .want = {"1_Pooling/config.json: pooling_mode_cls_token and pooling_mode_max_tokens are "
              "both set: only one pooling mode is supported"}},
    {"no pooling mode", {.st = 1, .st_pool = MODEL_POOL_MEAN}, .file = "1_Pooling/config.json",
     .text = "{\"word_embedding_dimension\": 32}",
     .want = {"1_Pooling/config.json: no pooling mode is set"}},
    {"1_Pooling/config.json missing", {.st = 1, .st_pool = MODEL_POOL_MEAN},
     .rm = "1_Pooling/config.json",
     .want = {"1_Pooling/config.json: no such file"}},
    {"a Dense module", {.st = 1, .st_pool = MODEL_POOL_MEAN}, .file = "modules.json",
     .text = "[{\"idx\": 0, \"path\": \"2_Dense\", \"type\": "
             "\"sentence_transformers.models.Dense\"}]",
     .want = {"modules.json: module sentence_transformers.models.Dense is not supported"}},
    {"id2label with 3 labels, classifier 2", {.n_labels = 2}, .cfg_key = "id2label",
     .cfg_json = "{\"0\": \"a\", \"1\": \"b\", \"2\": \"c\"}",
     .want = {"config.json: id2label has 3 labels, the classifier 2"}},
    {"id2label without label 1", {.n_labels = 2}, .cfg_key = "id2label",
     .cfg_json = "{\"0\": \"a\", \"7\": \"b\"}",
     .want = {"config.json: id2label has no label 1"}},
    {"a classifier without classifier.weight", {.n_labels = 2, .omit = "classifier.weight"},
     .want = {"a classifier needs tensor classifier.weight [labels,32]"}},
    {"classifier head asked of an embedder", {0}, .classifier = 1,
     .want = {"a classifier needs tensor classifier.weight"}},
    {"a pooler missing", {.n_labels = 2, .omit = "pooler.dense.bias"},
     .want = {"tensor pooler.dense.bias not found"}},
    {"vocab.txt longer than vocab_size", {0}, .cfg_key = "vocab_size", .cfg_json = "10",
     .want = {"the tokenizer has ", " tokens, the model's vocab_size is 10"}},
    {"no vocab.txt", {0}, .rm = "vocab.txt",
     .want = {"no tokenizer.json in the folder (nor vocab.txt, merges.txt)"}},
    {"max_tokens over max_position_embeddings", {0}, .max_tokens = 41,
     .want = {"encoder.max_tokens 41 is more than the 40 tokens max_position_embeddings 40 "
              "allows"}},
    {"max_tokens 2", {0}, .max_tokens = 2,
     .want = {"at most 2 tokens per row: too few for [CLS] text [SEP]"}},
};

/* Each bad folder is refused with a message naming the model, and the
 * file or tensor, as the table says; the same folder made good loads
 * (so the row tests the one change). */
static void test_folder_errors(void **state)
{
    for (size_t i = 0; i < sizeof(bad_folders) / sizeof(bad_folders[0]); i++) {
        const struct bad_folder *B = &bad_folders[i];
        char dir[128], path[256], err[1024] = "";
        folder(state, "bad", dir, sizeof(dir));
        struct re_model rm;
        struct re_desc d = B->d;
        d.what = B->what;
        /* first the folder without the change loads */
        if (!d.omit && !d.misshape && !d.as_i32 && strcmp(d.act ? d.act : "", "relu") != 0) {
            re_build(&d, dir, &rm);
            model_destroy(load(&rm, NULL));
            re_free(&rm);
            rm_rf(dir);
        }
        re_build(&d, dir, &rm);
        if (B->cfg_key) re_config_set(dir, B->cfg_key, B->cfg_json);
        if (B->file) re_write_text(dir, B->file, B->text);
        if (B->rm) {
            snprintf(path, sizeof(path), "%s/%s", dir, B->rm);
            assert_int_equal(unlink(path), 0);
        }
        rm.spec.enc.max_tokens = B->max_tokens;
        if (B->classifier) rm.spec.enc.head = MODEL_HEAD_CLASSIFIER;
        struct model *m = model_load(cpu_rt, &rm.spec, err, sizeof(err));
        if (m) fail_msg("%s: loaded", B->what);
        if (strncmp(err, "model t: ", 9) != 0)
            fail_msg("%s: message does not name the model: %s", B->what, err);
        for (int k = 0; k < 3 && B->want[k]; k++)
            if (!strstr(err, B->want[k]))
                fail_msg("%s: message \"%s\" lacks \"%s\"", B->what, err, B->want[k]);
        printf("  %-45s %s\n", B->what, err + 9);
        re_free(&rm);
    }
}

/* ---- the demo folder ------------------------------------------------- */

/* model_write_demo_bert's folders load and run: the embedder mean-pooled
 * and normalized (unit norms), the classifier with labels label_0...
 * (softmax rows summing to 1), both matching the reference read back from
 * the folder on tokenized text; the same seed writes the same weights. */
static void test_demo(void **state)
{
    static const char *const texts[] = {"The movie was really great!", "Kafka and Redis.",
                                        "I hate slow service", "ok"};
    for (size_t labels = 0; labels <= 3; labels += 3) {
        char dir[128], again[128], err[512];
        folder(state, "demo", dir, sizeof(dir));
        folder(state, "demo2", again, sizeof(again));
        uint64_t seed = tu_rand64();
        if (model_write_demo_bert(dir, 2, 32, 4, 64, labels, seed, err, sizeof(err)) != 0)
            fail_msg("model_write_demo_bert: %s", err);
        assert_int_equal(model_write_demo_bert(again, 2, 32, 4, 64, labels, seed, err,
                                               sizeof(err)), 0);
        char p1[256], p2[256];
        snprintf(p1, sizeof(p1), "%s/model.safetensors", dir);
        snprintf(p2, sizeof(p2), "%s/model.safetensors", again);
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
        assert_true(f1 && f2);
        a = malloc(1 << 20);
        b = malloc(1 << 20);
        na = fread(a, 1, 1 << 20, f1);
        nb = fread(b, 1, 1 << 20, f2);
        fclose(f1);
        fclose(f2);
        assert_true(na > 1000 && na == nb && !memcmp(a, b, na));
        free(a);
        free(b);

        struct re_model rm;
        re_read(dir, &rm);
        struct model *m = load(&rm, NULL);
        const struct model_encoder_info *e = model_encoder(m);
        struct re_head h = {labels ? MODEL_HEAD_CLASSIFIER : MODEL_HEAD_EMBEDDING,
                            labels ? MODEL_POOL_CLS : MODEL_POOL_MEAN, !labels, 0};
        assert_int_equal(e->head, h.head);
        assert_int_equal(e->n_labels, labels);
        if (!labels) {
            assert_int_equal(e->pooling, MODEL_POOL_MEAN);
            assert_int_equal(e->normalize, 1);
        }
        for (size_t i = 0; i < labels; i++) {
            char want[32];
            snprintf(want, sizeof(want), "label_%zu", i);
            assert_string_equal(e->labels[i], want);
        }
        struct tokenizer_scratch *sc = tokenizer_scratch_new(0);
        int32_t ids[256];
        uint32_t off[5] = {0};
        for (size_t i = 0; i < 4; i++) {
            int n = tokenize(e, sc, texts[i], NULL, e->max_tokens, 1, ids + off[i], NULL, NULL);
            assert_true(n >= 3);
            for (int t = 1; t + 1 < n; t++) /* the demo's words are in its vocabulary */
                assert_int_not_equal(ids[off[i] + (uint32_t)t],
                                     tokenizer_special_id(e->tokenizer, TOKENIZER_UNK));
            off[i + 1] = off[i] + (uint32_t)n;
        }
        struct model_ws *ws = ws_new(m, 4, 4 * 16);
        struct re_batch bt = {.s = {ids, NULL, off, 4}};
        encode_check(&rm, &h, m, ws, &bt, labels ? "demo classifier" : "demo embedder");
        const float *out;
        assert_int_equal(model_encode(m, ws, &bt.s, &out), MODEL_OK);
        size_t W = model_output_width(m);
        for (size_t i = 0; i < 4; i++) {
            double s = 0;
            for (size_t k = 0; k < W; k++)
                s += labels ? out[i * W + k] : (double)out[i * W + k] * out[i * W + k];
            assert_true(fabs(s - 1.0) < 1e-5);
        }
        tokenizer_scratch_destroy(sc);
        model_ws_destroy(ws);
        model_destroy(m);
        re_free(&rm);
    }
}

/* ---- PyTorch ---------------------------------------------------------- */

/* The folders PyTorch checks (its request's head/pooling/normalize come
 * from re_expect, not from kinfer). */
static const struct variant torch_variants[] = {
    {.d = {.what = "torch: mean + normalize (modules.json)", .st = 1, .st_pool = MODEL_POOL_MEAN,
      .st_normalize = 1}},
    {.d = {.what = "torch: cls, bert. prefix, gamma/beta", .prefix = 1, .old_ln = 1}},
    {.d = {.what = "torch: max (modules.json), BF16", .st = 1, .st_pool = MODEL_POOL_MAX,
      .dtype = "BF16"}},
    {.d = {.what = "torch: none (override)"}, .pooling = "none"},
    {.d = {.what = "torch: classifier, softmax", .n_labels = 3}},
    {.d = {.what = "torch: classifier, sigmoid (multi_label)", .n_labels = 4, .multi_label = 1}},
    {.d = {.what = "torch: gelu_new, mean", .act = "gelu_new", .st = 1,
           .st_pool = MODEL_POOL_MEAN}},
    {.d = {.what = "torch: F16 weights, cls + normalize (override)", .dtype = "F16"},
     .normalize = SET_ON},
    {.d = {.what = "torch: other shape (3 layers, hidden 24, 3 heads), eps 1e-7, mean", .layers = 3,
      .hidden = 24, .heads = 3, .inter = 40, .max_pos = 24, .eps = 1e-7, .st = 1,
      .st_pool = MODEL_POOL_MEAN}},
};
#define N_TORCH (sizeof(torch_variants) / sizeof(torch_variants[0]))

/* The JSON request torch_encoder.py reads, for batch b and head h. */
static json_t *torch_request(const struct re_batch *b, const struct re_head *h)
{
    json_t *rows = json_array(), *types = json_array();
    for (size_t i = 0; i < b->n; i++) {
        json_t *r = json_array(), *t = json_array();
        for (uint32_t k = b->offsets[i]; k < b->offsets[i + 1]; k++) {
            json_array_append_new(r, json_integer(b->ids[k]));
            json_array_append_new(t, json_integer(b->types[k]));
        }
        json_array_append_new(rows, r);
        json_array_append_new(types, t);
    }
    return json_pack("{s:o, s:o, s:s, s:b, s:s, s:b}", "rows", rows, "type_ids", types,
                     "pooling", model_pooling_name(h->pooling), "normalize", h->normalize,
                     "head", h->head == MODEL_HEAD_CLASSIFIER ? "classifier" : "embedding",
                     "sigmoid", h->sigmoid);
}

/* PyTorch's own modules (tests/torch_encoder.py: nn.Embedding,
 * nn.LayerNorm, nn.TransformerEncoderLayer post-norm, as one padded batch
 * with a key padding mask) against kinfer and the reference on the same
 * random multi-length batch of every folder above, all in one start of
 * python. */
static void test_torch(void **state)
{
    struct fixture *fx = *state;
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        const char *no = getenv("KINFER_TEST_NO_TORCH");
        if (no && !strcmp(no, "1")) {
            printf("test_torch: skipped: /usr/bin/python3 cannot import torch "
                   "(KINFER_TEST_NO_TORCH=1)\n");
            skip();
        }
        fail_msg("python3-torch missing: make deps (/usr/bin/python3 -c 'import torch' failed; "
                 "KINFER_TEST_NO_TORCH=1 skips this check)");
    }
    if (access(TORCH_PY, R_OK) != 0)
        fail_msg("%s not found: run from the repository root", TORCH_PY);
    struct re_model rm[N_TORCH];
    struct re_head h[N_TORCH];
    struct re_batch b[N_TORCH];
    float *got[N_TORCH];
    size_t count[N_TORCH];
    size_t cmdcap = 8192, cmdlen;
    char *cmd = malloc(cmdcap);
    assert_non_null(cmd);
    cmdlen = (size_t)snprintf(cmd, cmdcap, "/usr/bin/python3 %s", TORCH_PY);
    for (size_t v = 0; v < N_TORCH; v++) {
        const struct variant *V = &torch_variants[v];
        char dir[128], req[160], name[32];
        snprintf(name, sizeof(name), "torch%zu", v);
        folder(state, name, dir, sizeof(dir));
        re_build(&V->d, dir, &rm[v]);
        struct model_encoder_spec o = overrides(V);
        struct model *m = load(&rm[v], &o);
        h[v] = re_expect(&rm[v], &o);
        size_t maxt = re_max_tokens(&rm[v], 0);
        struct model_ws *ws = ws_new(m, 5, 5 * maxt);
        re_batch_random(&b[v], &rm[v], 5, maxt, 1);
        const float *out;
        if (model_encode(m, ws, &b[v].s, &out) != MODEL_OK) fail_msg("%s: model_encode", V->d.what);
        double *ref = re_encode(&rm[v], &h[v], &b[v].s, &count[v]);
        free(ref);
        got[v] = malloc(count[v] * sizeof(float));
        assert_non_null(got[v]);
        memcpy(got[v], out, count[v] * sizeof(float));
        model_ws_destroy(ws);
        model_destroy(m);
        snprintf(req, sizeof(req), "%s/req%zu.json", fx->dir, v);
        json_t *j = torch_request(&b[v], &h[v]);
        assert_int_equal(json_dump_file(j, req, 0), 0);
        json_decref(j);
        cmdlen += (size_t)snprintf(cmd + cmdlen, cmdcap - cmdlen, " '%s' '%s'", dir, req);
        assert_true(cmdlen < cmdcap);
    }
    char outp[160], errp[160];
    snprintf(outp, sizeof(outp), "%s/torch_out.json", fx->dir);
    snprintf(errp, sizeof(errp), "%s/torch_err.txt", fx->dir);
    snprintf(cmd + cmdlen, cmdcap - cmdlen, " >'%s' 2>'%s'", outp, errp);
    int rc = system(cmd);
    if (rc != 0) {
        char msg[2048] = "";
        FILE *f = fopen(errp, "r");
        if (f) {
            size_t n = fread(msg, 1, sizeof(msg) - 1, f);
            msg[n] = '\0';
            fclose(f);
        }
        fail_msg("%s failed (status %d): %s", TORCH_PY, rc, msg);
    }
    free(cmd);
    json_error_t je;
    json_t *res = json_load_file(outp, 0, &je);
    if (!res || json_array_size(res) != N_TORCH)
        fail_msg("%s: %d results, expected %zu (%s)", outp, res ? (int)json_array_size(res) : -1,
                 (size_t)N_TORCH, res ? "" : je.text);
    for (size_t v = 0; v < N_TORCH; v++) {
        const char *what = torch_variants[v].d.what;
        json_t *rows = json_object_get(json_array_get(res, v), "output");
        double *pt = malloc(count[v] * sizeof(double));
        assert_non_null(pt);
        size_t n = 0, i;
        json_t *row;
        json_array_foreach(rows, i, row) {
            size_t k;
            json_t *x;
            json_array_foreach(row, k, x) {
                if (n >= count[v] || !json_is_number(x))
                    fail_msg("%s: PyTorch's output is not %zu numbers", what, count[v]);
                pt[n++] = json_number_value(x);
            }
        }
        if (n != count[v]) fail_msg("%s: PyTorch gave %zu values, kinfer %zu", what, n, count[v]);
        /* PyTorch against the reference: both float64 */
        size_t cnt;
        double *ref = re_encode(&rm[v], &h[v], &b[v].s, &cnt);
        double worst64 = 0;
        for (size_t k = 0; k < cnt; k++) {
            double e = fabs(pt[k] - ref[k]);
            if (!(e <= TOL_F64 * fmax(1.0, fabs(ref[k]))))
                fail_msg("%s: [%zu] PyTorch %.17g, reference %.17g", what, k, pt[k], ref[k]);
            worst64 = e > worst64 ? e : worst64;
        }
        /* kinfer against PyTorch */
        char label[160];
        snprintf(label, sizeof(label), "%s (kinfer vs PyTorch)", what);
        double r = check(got[v], pt, count[v], label);
        printf("  %-70s kinfer err/tol %.3f, |torch - ref| %.2g\n", what, r, worst64);
        free(ref);
        free(pt);
        free(got[v]);
        re_batch_free(&b[v]);
        re_free(&rm[v]);
    }
    json_decref(res);
}

/* Seeds the generator (printed, replayable) and runs the group. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),       cmocka_unit_test(test_packed_vs_alone),
        cmocka_unit_test(test_pairs_truncation), cmocka_unit_test(test_default_labels),
        cmocka_unit_test(test_tokenizer_files),
        cmocka_unit_test(test_encode_einval),
        cmocka_unit_test(test_encoder_vs_layers), cmocka_unit_test(test_folder_errors),
        cmocka_unit_test(test_demo),            cmocka_unit_test(test_torch),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

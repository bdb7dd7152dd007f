/* test_exec.c - worker/exec: the executor stage driven with real parts and
 * no Kafka. A config read by cfg_load (with --set overrides per case), the
 * CPU backend, real models (model_write_demo's MLP; model_write_demo_bert's
 * embedder, the same folder with pooling "none", and a classifier), a real
 * batcher fed jobs as the intake builds them (float rows, or token rows),
 * exec_start / exec_stop, and the sink's jobq popped by the test, which
 * reports every batch written. No Redis: count_attempts is 0.
 *
 * Each case is a row: a model, executors, max_batch_rows, the jobs' row
 * counts and what must become of each job ('o' a result equal to the
 * reference, 'B' an error result because the result is larger than
 * max_record_bytes, '-' never emitted because its batch's forward pass
 * failed for good). Checked for every row:
 *   - every job comes out at most once, and exactly the jobs marked 'o'
 *     and 'B' come out; nothing more after exec_stop;
 *   - each job's output, decoded from its result body as a client would,
 *     equals the float64 reference run on that job's own input (refmlp.h,
 *     refencoder.h) within |got - ref| <= TOL_ABS + TOL_REL |ref|, whatever
 *     batch it shared (several jobs of different row counts per batch,
 *     several executors);
 *   - each batch's jobs (the lists between batch_last marks) carry
 *     batch_rows equal to the rows of that batch, and the rows asked for
 *     "mixed" hold a batch of several jobs of different row counts;
 *   - a classifier's labels are the argmax of the reference scores, row
 *     by row; its rows are drawn so that labels alternate from row to row
 *     (split_head, cls_rows), so a job given another row's labels shows;
 *   - per-token output gives each row its own tokens, zero-padded to the
 *     job's longest row, with lengths;
 *   - a device fault (debug.device_fault_id) sets the fatal flag and its
 *     batch's jobs never come out;
 *   - a result over max_record_bytes comes out as inference_failed saying
 *     so, and fits.
 *
 * Threads: the executors exec_start makes; the test thread pops. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/clock.h"
#include "../batching/batcher.h"
#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "../telemetry/stats.h"
#include "../config/config.h"
#include "../worker/exec.h"
#include "../worker/jobq.h"
#include "refencoder.h"
#include "refmlp.h"
#include "testutil.h"

/* float32 on the CPU against float64, through the result's encoding
 * (MessagePack float32, or JSON decimals). The worst error seen in 60
 * runs was a tenth of this, in the classifier, whose rewritten head
 * (split_head) magnifies its pooled vector's rounding. */
#define TOL_ABS 1e-4
#define TOL_REL 1e-4

#define MAX_JOBS 16
#define MLP_IN 12
#define MLP_HID 24
#define MLP_OUT 16
#define N_LABELS 2

/* ---- the models, made once ------------------------------------------- */

enum { M_MLP = 0, M_EMB, M_TOK, M_CLS, N_MODELS };
static const char *const model_names[N_MODELS] = {"mlp", "emb", "tok", "cls"};

static char dir[64];               /* everything the program writes */
static char cfg_path[128];
static struct kcfg *base_cfg;      /* the models' entries */
static struct model_runtime *rt;
static struct model *models[N_MODELS];
static struct ref_mlp ref_mlp;
static struct re_model ref_emb, ref_cls;
static unsigned labels_seen;       /* bit per label index given out in the case */
static struct re_head heads[N_MODELS];
static double worst_ratio;         /* the run's worst error, as a share of the tolerance */

static const char cfg_text[] =
    "worker = { backend = \"cpu\"; blas_threads = 1; };\n"
    "batching = { max_wait_ms = 5; };\n"
    "models = (\n"
    "  { name = \"mlp\"; path = \"mlp.safetensors\"; layers = (\n"
    "      { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
    "      { op = \"relu\"; },\n"
    "      { op = \"dense\"; weight = \"2.weight\"; bias = \"2.bias\"; } ); },\n"
    "  { name = \"emb\"; path = \"emb\"; },\n"
    "  { name = \"tok\"; path = \"emb\"; encoder = { pooling = \"none\"; }; },\n"
    "  { name = \"cls\"; path = \"cls\"; }\n"
    ");\n"
    "log = { level = \"error\"; };\n";

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* The demo classifier is initialised as BERT is (weights of about 0.02):
 * its pooled [CLS] vector hardly depends on the input, and every row gets
 * the same best label, so a mix-up of labels between rows would go unseen.
 * Its two-label head is rewritten to split the inputs instead: along d,
 * from the mean of 64 sampled rows' pooled vectors to the farthest one, at
 * the median of their projections, scaled so that a typical row's two
 * logits differ by about 2. The folder's file is written again and *rm
 * (the twin) read back from it. */
static void split_head(const char *folder, struct re_model *rm)
{
    enum { S = 64 };
    re_read(folder, rm);
    size_t H = rm->d.hidden, lens[S];
    assert_int_equal(rm->d.n_labels, 2);
    for (size_t i = 0; i < S; i++) lens[i] = rand_between(2, 12);
    struct re_batch b;
    re_batch_make(&b, rm, lens, S, 1);
    struct re_head cls = {MODEL_HEAD_EMBEDDING, MODEL_POOL_CLS, 0, 0};
    size_t count;
    double *x = re_encode(rm, &cls, &b.s, &count), *p = malloc(S * H * sizeof(double));
    double proj[S], sorted[S], d[64], mean = 0, var = 0;
    assert_true(p && count == S * H && H <= 64);
    re_linear(x, S, H, rm->pool_w, rm->pool_b, H, p);
    for (size_t k = 0; k < S * H; k++) p[k] = tanh(p[k]);
    double pm[64] = {0}, far = -1;
    for (size_t i = 0; i < S; i++)
        for (size_t k = 0; k < H; k++) pm[k] += p[i * H + k] / S;
    for (size_t i = 0; i < S; i++) { /* d: from the mean to the farthest sample */
        double dist = 0;
        for (size_t k = 0; k < H; k++) dist += (p[i * H + k] - pm[k]) * (p[i * H + k] - pm[k]);
        if (dist > far)
            for (size_t k = 0; k < H; k++) d[k] = p[i * H + k] - pm[k];
        far = dist > far ? dist : far;
    }
    for (size_t i = 0; i < S; i++) {
        proj[i] = 0;
        for (size_t k = 0; k < H; k++) proj[i] += d[k] * p[i * H + k];
        sorted[i] = proj[i];
        mean += proj[i] / S;
    }
    for (size_t i = 0; i < S; i++) var += (proj[i] - mean) * (proj[i] - mean) / S;
    for (size_t i = 1; i < S; i++) /* insertion sort: the median */
        for (size_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            double t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    assert_true(var > 0);
    double scale = 1.0 / sqrt(var), mid = (sorted[S / 2 - 1] + sorted[S / 2]) / 2;
    float cw[2 * 64], cb[2] = {(float)(-mid * scale), (float)(mid * scale)};
    for (size_t k = 0; k < H; k++) {
        cw[k] = (float)(d[k] * scale);
        cw[H + k] = (float)(-d[k] * scale);
    }
    free(x);
    free(p);
    re_batch_free(&b);
    re_free(rm);

    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/model.safetensors", folder);
    struct st_file *f = st_open(path, err, sizeof(err));
    if (!f) fail_msg("%s", err);
    size_t n = st_count(f);
    struct st_write_tensor *w = calloc(n, sizeof(*w));
    float **data = calloc(n, sizeof(*data));
    assert_true(w && data);
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_tensor_at(f, i);
        assert_int_equal(t->dtype, ST_F32);
        data[i] = malloc(t->numel * sizeof(float) + 1);
        assert_non_null(data[i]);
        assert_int_equal(st_to_f32(t, data[i]), 0);
        if (strcmp(t->name, "classifier.weight") == 0) memcpy(data[i], cw, 2 * H * sizeof(float));
        if (strcmp(t->name, "classifier.bias") == 0) memcpy(data[i], cb, sizeof(cb));
        w[i] = (struct st_write_tensor){t->name, ST_F32, t->ndim, t->shape, data[i]};
    }
    if (st_write(path, w, n, err, sizeof(err)) != 0) fail_msg("st_write: %s", err);
    st_close(f);
    for (size_t i = 0; i < n; i++) free(data[i]);
    free(data);
    free(w);
    re_read(folder, rm);
}

/* The config file is read with these --set overrides (n of them). */
static struct kcfg *load_cfg(const char *const *sets, size_t n)
{
    char err[512];
    struct kcfg *c = cfg_load(cfg_path, sets, n, err, sizeof(err));
    if (!c) fail_msg("cfg_load: %s", err);
    return c;
}

static int group_setup(void **state)
{
    (void)state;
    char err[512], path[256];
    snprintf(dir, sizeof(dir), "/tmp/kinfer_exec_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof(path), "%s/mlp.safetensors", dir);
    if (model_write_demo(path, MLP_IN, MLP_HID, MLP_OUT, tu_rand64(), err, sizeof(err)) < 0)
        goto fail;
    ref_mlp_load(&ref_mlp, path);
    snprintf(path, sizeof(path), "%s/emb", dir);
    if (model_write_demo_bert(path, 2, 32, 4, 64, 0, tu_rand64(), err, sizeof(err)) < 0)
        goto fail;
    re_read(path, &ref_emb);
    snprintf(path, sizeof(path), "%s/cls", dir);
    if (model_write_demo_bert(path, 2, 32, 4, 64, N_LABELS, tu_rand64(), err, sizeof(err)) < 0)
        goto fail;
    split_head(path, &ref_cls);
    /* What the folders say (modules.json: mean, normalized; a classifier
     * with softmax), then the "tok" entry's override. */
    heads[M_EMB] = (struct re_head){MODEL_HEAD_EMBEDDING, MODEL_POOL_MEAN, 1, 0};
    heads[M_TOK] = (struct re_head){MODEL_HEAD_EMBEDDING, MODEL_POOL_NONE, 1, 0};
    heads[M_CLS] = (struct re_head){MODEL_HEAD_CLASSIFIER, MODEL_POOL_CLS, 0, 0};

    snprintf(cfg_path, sizeof(cfg_path), "%s/worker.cfg", dir);
    FILE *f = fopen(cfg_path, "w");
    if (!f || fputs(cfg_text, f) < 0 || fclose(f) != 0) return -1;
    if (!(base_cfg = cfg_load(cfg_path, NULL, 0, err, sizeof(err)))) goto fail;
    struct model_runtime_conf rc;
    cfg_model_runtime(base_cfg, &rc);
    if (!(rt = model_runtime_new(&rc, err, sizeof(err)))) goto fail;
    if (base_cfg->n_models != N_MODELS) return -1;
    for (size_t i = 0; i < N_MODELS; i++)
        if (!(models[i] = model_load(rt, &base_cfg->models[i], err, sizeof(err)))) goto fail;
    if (model_per_token(models[M_TOK]) != 1 || model_output_width(models[M_CLS]) != N_LABELS)
        return -1;
    return 0;
fail:
    fprintf(stderr, "test_exec setup: %s\n", err);
    return -1;
}

static int group_teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_MODELS; i++) model_destroy(models[i]);
    model_runtime_destroy(rt);
    cfg_destroy(base_cfg);
    ref_mlp_free(&ref_mlp);
    re_free(&ref_emb);
    re_free(&ref_cls);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    fprintf(stderr, "test_exec: worst err/tol %.3g (tol %g + %g |ref|)\n", worst_ratio, TOL_ABS,
            TOL_REL);
    return 0;
}

static const struct re_model *ref_encoder(int model)
{
    return model == M_CLS ? &ref_cls : &ref_emb;
}

/* ---- the cases ------------------------------------------------------- */

struct exec_case {
    const char *name;
    int model;                  /* M_* */
    size_t threads;             /* executors */
    int max_batch_rows;
    size_t rows[MAX_JOBS];      /* each job's rows; 0 ends */
    const char *expect;         /* per job: 'o' result, 'B' too big, '-' never out */
    int fault;                  /* the job named by debug.device_fault_id; -1 none */
    size_t max_record_bytes;    /* 0: 1 MiB */
    int mixed;                  /* some batch must hold jobs of different row counts */
};

static const struct exec_case cases[] = {
    {"mlp: 2 executors, jobs of 1-5 rows sharing batches", M_MLP, 2, 8,
     {3, 1, 5, 2, 4, 1, 3, 2, 5, 1, 2, 4}, "oooooooooooo", -1, 0, 1},
    {"mlp: one executor, a job over max_batch_rows runs alone", M_MLP, 1, 4,
     {2, 9, 1, 3, 1}, "ooooo", -1, 0, 1},
    {"emb: mean-pooled, normalized, 2 executors", M_EMB, 2, 6,
     {2, 1, 3, 2, 1, 4, 2}, "ooooooo", -1, 0, 1},
    {"tok: pooling none, every row's tokens", M_TOK, 2, 5,
     {2, 1, 3, 1, 2}, "ooooo", -1, 0, 1},
    {"cls: each row's label is the argmax of its scores", M_CLS, 2, 8,
     {3, 2, 1, 4, 2, 1, 3, 2}, "oooooooo", -1, 0, 1},
    /* One executor, batches closed by size in arrival order: {j0}, then
     * {j1, j2}, whose pass fails; the executor stops, j3 stays queued. */
    {"mlp: a device fault drops its batch and sets fatal", M_MLP, 1, 4,
     {4, 2, 2, 3}, "o---", 2, 0, 0},
    {"cls: a device fault in an encoder batch", M_CLS, 1, 4,
     {4, 1, 3, 2}, "o---", 1, 0, 0},
    {"mlp: a result over max_record_bytes is an error result", M_MLP, 1, 64,
     {1, 40, 2}, "oBo", -1, 1024, 1},
    /* its 'B' job's rows are all 12 tokens: 12 x 12 x 32 floats, 18 KiB */
    {"tok: a per-token result over max_record_bytes", M_TOK, 2, 8,
     {1, 12, 1}, "oBo", -1, 16384, 0},
};

/* One job's input as the test keeps it, for the reference. */
struct tjob {
    size_t rows;
    float *input;             /* a layer model's rows x MLP_IN */
    struct re_batch seqs;     /* an encoder's rows */
    int seen;
};

/* The classifier's best label for sequence r of b, by the reference; 2
 * when the two scores are within 0.2 of each other. */
static size_t ref_label(const struct re_batch *b, size_t r)
{
    uint32_t off[2] = {0, b->offsets[r + 1] - b->offsets[r]};
    const int32_t *types = b->s.type_ids ? b->types + b->offsets[r] : NULL;
    struct model_seqs one = {b->ids + b->offsets[r], types, off, 1};
    size_t count;
    double *sc = re_encode(&ref_cls, &heads[M_CLS], &one, &count);
    size_t best = fabs(sc[0] - sc[1]) < 0.2 ? 2 : sc[1] > sc[0];
    free(sc);
    return best;
}

/* n rows for the classifier, drawn (length, ids, type ids) until the
 * best label for row r is clearly (first + r) % 2: the classifier case's
 * rows alternate labels, so whichever jobs share a batch, a job given
 * another row's labels shows. */
static void cls_rows(struct re_batch *b, size_t n, size_t first)
{
    struct re_batch one[MAX_JOBS];
    memset(b, 0, sizeof(*b));
    for (size_t r = 0; r < n; r++) {
        for (int tries = 0;; tries++) {
            if (tries == 2000) fail_msg("no row with label %zu in 2000 draws", (first + r) % 2);
            size_t len = rand_between(2, 12);
            re_batch_make(&one[r], &ref_cls, &len, 1, 1);
            if (ref_label(&one[r], 0) == (first + r) % 2) break;
            re_batch_free(&one[r]);
        }
        b->total += one[r].total;
    }
    b->n = n;
    b->ids = malloc(b->total * sizeof(int32_t));
    b->types = malloc(b->total * sizeof(int32_t));
    b->offsets = malloc((n + 1) * sizeof(uint32_t));
    assert_true(b->ids && b->types && b->offsets);
    size_t at = 0;
    for (size_t r = 0; r < n; r++) {
        b->offsets[r] = (uint32_t)at;
        memcpy(b->ids + at, one[r].ids, one[r].total * sizeof(int32_t));
        memcpy(b->types + at, one[r].types, one[r].total * sizeof(int32_t));
        at += one[r].total;
        re_batch_free(&one[r]);
    }
    b->offsets[n] = (uint32_t)at;
    b->s = (struct model_seqs){b->ids, b->types, b->offsets, n};
}

static struct job *make_job(const struct exec_case *c, size_t i, struct tjob *t)
{
    struct job *j = job_new();
    assert_non_null(j);
    snprintf(j->req.id, sizeof(j->req.id), "j%zu", i);
    snprintf(j->topic, sizeof(j->topic), "jobs");
    j->req.enc = i % 3 == 2 ? PROTO_ENC_JSON : PROTO_ENC_MSGPACK;
    j->req.priority = -1;
    j->offset = (int64_t)i;
    j->record_ts_ms = (int64_t)time(NULL) * 1000;
    j->arrived_us = clock_mono_us();
    j->model_idx = c->model;
    j->model_name = model_name(models[c->model]);
    j->priority = 5;
    j->rows = t->rows = c->rows[i];
    j->weight = j->rows;
    if (c->model == M_MLP) {
        /* as the intake takes float rows: req.input, n_input = rows x width */
        size_t n = j->rows * MLP_IN;
        j->req.input = malloc(n * sizeof(float));
        t->input = malloc(n * sizeof(float));
        assert_true(j->req.input && t->input);
        for (size_t k = 0; k < n; k++) t->input[k] = j->req.input[k] = tu_randf(-2, 2);
        j->req.n_input = n;
        return j;
    }
    /* as the intake tokenizes: ids, type ids, rows + 1 offsets, the longest row */
    if (c->model == M_CLS) {
        cls_rows(&t->seqs, j->rows, i);
    } else { /* 2 to 12 tokens a row ('B': 12), type ids in odd jobs */
        size_t lens[MAX_JOBS];
        for (size_t r = 0; r < j->rows; r++)
            lens[r] = c->expect[i] == 'B' ? 12 : rand_between(2, 12);
        re_batch_make(&t->seqs, ref_encoder(c->model), lens, j->rows, (int)(i % 2));
    }
    const struct re_batch *b = &t->seqs;
    j->ids = malloc(b->total * sizeof(int32_t));
    j->type_ids = malloc(b->total * sizeof(int32_t));
    j->offs = malloc((j->rows + 1) * sizeof(uint32_t));
    assert_true(j->ids && j->type_ids && j->offs);
    memcpy(j->ids, b->ids, b->total * sizeof(int32_t));
    memcpy(j->type_ids, b->types, b->total * sizeof(int32_t));
    memcpy(j->offs, b->offsets, (j->rows + 1) * sizeof(uint32_t));
    j->n_tokens = b->total;
    for (size_t r = 0; r < j->rows; r++)
        if (b->offsets[r + 1] - b->offsets[r] > j->seq_len)
            j->seq_len = b->offsets[r + 1] - b->offsets[r];
    return j;
}

static void check_close(double got, double want, const char *what, size_t i, size_t k)
{
    double tol = TOL_ABS + TOL_REL * fabs(want), ratio = fabs(got - want) / tol;
    if (ratio > worst_ratio) worst_ratio = ratio;
    if (fabs(got - want) > tol)
        fail_msg("%s: job j%zu value %zu: got %.9g, reference %.9g", what, i, k, got, want);
}

/* A label is right when it names the reference's best score, or the
 * second best when the two are within the tolerance. */
static void check_label(int model, const char *got, const double *ref, size_t w, size_t i,
                        size_t r)
{
    const struct model_encoder_info *e = model_encoder(models[model]);
    size_t best = 0, second = w > 1 ? 1 : 0;
    for (size_t k = 0; k < w; k++)
        if (ref[k] > ref[best]) best = k;
    for (size_t k = 0; k < w; k++)
        if (k != best && (second == best || ref[k] > ref[second])) second = k;
    assert_non_null(got);
    labels_seen |= 1u << best;
    if (strcmp(got, e->labels[best]) == 0) return;
    if (ref[best] - ref[second] <= 2 * (TOL_ABS + TOL_REL) && strcmp(got, e->labels[second]) == 0)
        return;
    fail_msg("job j%zu row %zu: label %s, the reference's best is %s (%.6f)", i, r, got,
             e->labels[best], ref[best]);
}

/* A result the test received: what a client decodes from its body,
 * against the reference on the job's own input. */
static void check_result(const struct exec_case *c, const struct job *j, struct tjob *t,
                         size_t i)
{
    struct wire_result r;
    char err[256];
    assert_int_equal(j->kind, JOB_RESULT);
    assert_non_null(j->body);
    if (wire_decode_result(j->body, j->body_len, &r, err, sizeof(err)) < 0)
        fail_msg("job j%zu: result body: %s", i, err);
    assert_string_equal(r.id, j->req.id);
    assert_string_equal(r.model, model_names[c->model]);
    size_t cap = c->max_record_bytes ? c->max_record_bytes : 1 << 20;
    if (j->body_len > cap) fail_msg("job j%zu: body %zu bytes over %zu", i, j->body_len, cap);
    if (c->expect[i] == 'B') {
        if (r.ok) fail_msg("job j%zu: expected an error result for its size", i);
        assert_string_equal(r.code, "inference_failed");
        if (!strstr(r.message, "exceeds")) fail_msg("job j%zu: message \"%s\"", i, r.message);
        wire_result_fini(&r);
        return;
    }
    if (!r.ok) fail_msg("job j%zu: %s: %s", i, r.code, r.message);
    const struct model *m = models[c->model];
    size_t w = model_output_width(m);
    assert_int_equal(r.rows, t->rows);
    assert_int_equal(r.width, w);
    assert_true(r.batch_rows >= (int64_t)t->rows);
    if (c->model == M_MLP) {
        double *ref = malloc(t->rows * w * sizeof(double));
        assert_non_null(ref);
        ref_mlp_forward(&ref_mlp, t->input, t->rows, ref);
        for (size_t k = 0; k < t->rows * w; k++) check_close(r.output[k], ref[k], c->name, i, k);
        free(ref);
        wire_result_fini(&r);
        return;
    }
    size_t count;
    double *ref = re_encode(ref_encoder(c->model), &heads[c->model], &t->seqs.s, &count);
    if (c->model == M_TOK) {
        /* rows x the job's longest row x hidden, each row zero-padded */
        size_t longest = j->seq_len;
        assert_int_equal(r.tokens_dim, longest);
        assert_int_equal(r.n_lengths, t->rows);
        for (size_t row = 0; row < t->rows; row++) {
            size_t o = t->seqs.offsets[row], len = t->seqs.offsets[row + 1] - o;
            assert_int_equal(r.lengths[row], len);
            for (size_t tok = 0; tok < longest; tok++)
                for (size_t k = 0; k < w; k++) {
                    size_t at = (row * longest + tok) * w + k;
                    double want = tok < len ? ref[(o + tok) * w + k] : 0.0;
                    check_close(r.output[at], want, c->name, i, at);
                }
        }
    } else {
        assert_int_equal(count, t->rows * w);
        for (size_t k = 0; k < count; k++) check_close(r.output[k], ref[k], c->name, i, k);
    }
    if (c->model == M_CLS) {
        assert_true(r.has_scores);
        assert_non_null(j->labels);
        assert_int_equal(r.n_labels, t->rows);
        for (size_t row = 0; row < t->rows; row++) {
            check_label(c->model, r.labels[row], ref + row * w, w, i, row);
            assert_string_equal(j->labels[row], r.labels[row]);
        }
    } else {
        assert_null(j->labels);
        assert_int_equal(r.n_labels, 0);
    }
    free(ref);
    wire_result_fini(&r);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Checks one list the queue handed over and frees it: each batch (the
 * jobs up to a batch_last mark) has batch_rows = its rows, and holds at
 * most max_batch_rows unless it is one job; counts what came out. Returns
 * the jobs in the list; *mixed is set when a batch held jobs of different
 * row counts. */
static size_t take_list(const struct exec_case *c, struct jobq *out, struct job *l,
                        struct tjob *tj, size_t n, int *mixed)
{
    size_t got = 0;
    unsigned batches = 0;
    struct job *first = l;
    for (struct job *j = l; j; j = j->next) {
        size_t i = (size_t)j->offset;
        assert_true(i < n);
        if (tj[i].seen++) fail_msg("%s: job j%zu came out twice", c->name, i);
        if (c->expect[i] == '-') fail_msg("%s: job j%zu came out of a failed batch", c->name, i);
        check_result(c, j, &tj[i], i);
        got++;
        if (!j->batch_last) continue;
        size_t rows = 0, jobs = 0;
        int diff = 0;
        for (struct job *b = first; b != j->next; b = b->next) {
            rows += b->rows;
            jobs++;
            diff |= b->rows != first->rows;
        }
        for (struct job *b = first; b != j->next; b = b->next)
            if (b->batch_rows != rows)
                fail_msg("%s: job %s says batch_rows %zu, its batch has %zu", c->name,
                         b->req.id, b->batch_rows, rows);
        if (jobs > 1 && rows > (size_t)c->max_batch_rows)
            fail_msg("%s: a batch of %zu jobs holds %zu rows", c->name, jobs, rows);
        *mixed |= jobs > 1 && diff;
        first = j->next;
        batches++;
    }
    assert_null(first); /* a list ends with a batch */
    job_free_list(l);
    jobq_written(out, batches); /* as the sink reports: the executors' in-flight bound */
    return got;
}

/* One case's parts, on the heap so that its teardown stops the executors
 * and frees everything even when a check failed mid-run. */
struct run {
    const struct exec_case *c;
    size_t n;                   /* jobs */
    struct kcfg *cfg;
    struct batcher *b;
    struct jobq out;
    int out_made;
    struct stats *st;
    atomic_int fatal;
    struct exec *ex;
    struct tjob tj[MAX_JOBS];
};

/* The case's config (its --set overrides), batcher and jobs, all queued
 * before the executors start so that batches close by size with several
 * jobs each (the rest by max_wait_ms). */
static int case_setup(void **state)
{
    const struct exec_case *c = *state;
    struct run *r = calloc(1, sizeof(*r));
    if (!r) return -1;
    r->c = c;
    *state = r;
    labels_seen = 0;
    while (r->n < MAX_JOBS && c->rows[r->n]) r->n++;
    char s_rows[64], s_fault[64];
    snprintf(s_rows, sizeof(s_rows), "batching.max_batch_rows=%d", c->max_batch_rows);
    snprintf(s_fault, sizeof(s_fault), "debug.device_fault_id=j%d", c->fault);
    const char *sets[2] = {s_rows, s_fault};
    r->cfg = load_cfg(sets, c->fault >= 0 ? 2 : 1);
    const struct kcfg *k = r->cfg;
    struct batcher_conf bc = {.n_models = N_MODELS,
                              .max_batch_rows = (size_t)k->batching.max_batch_rows,
                              .max_wait_ms = k->batching.max_wait_ms,
                              .aging_ms = k->batching.aging_ms,
                              .max_batch_tokens = (size_t)k->batching.max_batch_tokens,
                              .group_by_length = k->batching.group_by_length};
    if (!(r->b = batcher_new(&bc)) || !(r->st = stats_new())) return -1;
    for (size_t i = 0; i < r->n; i++) batcher_push(r->b, make_job(c, i, &r->tj[i]));
    jobq_init(&r->out);
    r->out_made = 1;
    return 0;
}

static int case_teardown(void **state)
{
    struct run *r = *state;
    exec_stop(r->ex);
    if (r->out_made) jobq_fini(&r->out);
    batcher_destroy(r->b); /* with whatever a fault left queued */
    stats_destroy(r->st);
    cfg_destroy(r->cfg);
    for (size_t i = 0; i < r->n; i++) {
        free(r->tj[i].input);
        re_batch_free(&r->tj[i].seqs);
    }
    free(r);
    return 0;
}

static void test_case(void **state)
{
    struct run *r = *state;
    const struct exec_case *c = r->c;
    size_t n = r->n, want = 0;
    assert_int_equal(strlen(c->expect), n);
    for (size_t i = 0; i < n; i++) want += c->expect[i] != '-';
    int want_fatal = want < n;

    struct exec_conf ec = {.cfg = r->cfg, .n_threads = c->threads, .models = models,
                           .n_models = N_MODELS, .batcher = r->b, .out = &r->out,
                           .stats = r->st, .fatal = &r->fatal,
                           .max_record_bytes = c->max_record_bytes ? c->max_record_bytes
                                                                   : 1 << 20,
                           .count_attempts = 0};
    char err[256];
    if (!(r->ex = exec_start(&ec, err, sizeof(err)))) fail_msg("exec_start: %s", err);
    assert_int_equal(exec_threads(r->ex), c->threads);

    size_t got = 0;
    int mixed = 0;
    int64_t until = now_ms() + 10000;
    while ((got < want || (want_fatal && !atomic_load(&r->fatal))) && now_ms() < until)
        got += take_list(c, &r->out, jobq_take(&r->out, 20), r->tj, n, &mixed);
    if (want_fatal) {
        if (!atomic_load(&r->fatal)) fail_msg("%s: the fatal flag was not set", c->name);
        got += take_list(c, &r->out, jobq_take(&r->out, 100), r->tj, n, &mixed); /* none late */
    } else if (atomic_load(&r->fatal)) {
        fail_msg("%s: the fatal flag was set", c->name);
    }
    exec_stop(r->ex);
    r->ex = NULL;
    got += take_list(c, &r->out, jobq_take(&r->out, 0), r->tj, n, &mixed);
    for (size_t i = 0; i < n; i++)
        if (r->tj[i].seen != (c->expect[i] != '-'))
            fail_msg("%s: job j%zu came out %d times, expected '%c'", c->name, i,
                     r->tj[i].seen, c->expect[i]);
    assert_int_equal(got, want);
    if (c->mixed && !mixed) fail_msg("%s: no batch held jobs of different row counts", c->name);
    if (c->model == M_CLS && !strchr(c->expect, '-') && !(labels_seen & (labels_seen - 1)))
        fail_msg("%s: every row had the same best label: the labels went untested", c->name);
}

int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    enum { N = sizeof(cases) / sizeof(cases[0]) };
    struct CMUnitTest tests[N];
    for (size_t i = 0; i < N; i++) /* one test per row, the row as its state */
        tests[i] = (struct CMUnitTest){cases[i].name, test_case, case_setup, case_teardown,
                                       (void *)&cases[i]};
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

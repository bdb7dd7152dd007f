/* bench_model.c - the model floors of `kinfer bench`: the default
 * model's forward pass alone (gemm: rows/s per batch size) and an
 * encoder's on mixed-length texts batched as the batcher would (encode).
 *
 * Threads: the main thread starts --parallel measuring threads, each with
 * its own workspace slot and buffers, and joins them. Ownership: the model
 * and runtime are made and freed by the subcommand. */
#include "bench.h"
#include "bench_shared.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../codecs/wire.h"
#include "../gpu/model.h"
#include "../text/tokenizer.h"
#include "textgen.h"
#include "../config/config.h"
#include "../kafka/kq.h"
#include "../base/log.h"

/* `bench gemm`: the default model's forward pass alone (model_forward, the
 * code the executor runs, so bias and activation are in), for each batch
 * size in --batch, --seconds each after a warm-up, on --threads OpenBLAS
 * threads, in --parallel threads at once (each with its own buffers, as
 * the worker's executors): the compute floor a worker can at best reach
 * with that layout. */
struct gemm_run {
    struct model *m;
    unsigned slot;          /* the workspace's executor number */
    size_t batch;
    double seconds;
    pthread_barrier_t *start;
    size_t calls;
    double elapsed_s;
    int rc;
};

static void *gemm_thread(void *arg)
{
    struct gemm_run *g = arg;
    size_t in_w = model_input_width(g->m);
    char err[256];
    struct model_ws *ws = model_ws_new(g->m, g->slot, g->batch, err, sizeof(err));
    if (!ws) fprintf(stderr, "kinfer bench gemm: %s\n", err);
    float *in = malloc(g->batch * in_w * sizeof(float));
    const float *out;
    g->rc = ws && in ? 0 : -1;
    for (size_t k = 0; in && k < g->batch * in_w; k++)
        in[k] = (float)((k * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (int w = 0; g->rc == 0 && w < 3; w++)
        if (model_forward(g->m, ws, in, g->batch, &out) < 0) g->rc = -1;
    pthread_barrier_wait(g->start);
    double t0 = bench_mono_s(), t = t0;
    while (g->rc == 0 && (t - t0 < g->seconds || g->calls < 3)) {
        if (model_forward(g->m, ws, in, g->batch, &out) < 0) g->rc = -1;
        g->calls++;
        t = bench_mono_s();
    }
    g->elapsed_s = t - t0;
    free(in);
    model_ws_destroy(ws);
    return NULL;
}

int bench_gemm(const struct kcfg *c, const struct bench_opts *o)
{
    size_t sizes[16];
    int n = bench_parse_size_list(o->batches, sizes, 16);
    if (n <= 0) {
        fprintf(stderr, "kinfer bench gemm: --batch wants sizes like 1,32,128\n");
        return 1;
    }
    struct model_runtime *rt;
    struct model *m = bench_load_default_model(c, 0, o->threads, &rt);
    if (!m) return 1;
    int rc = 0;
    size_t par = o->parallel;
    struct gemm_run *runs = calloc(par, sizeof(*runs));
    pthread_t *thr = calloc(par, sizeof(*thr));
    if (!runs || !thr) rc = 1;
    for (int i = 0; i < n && rc == 0; i++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)par);
        size_t started = 0;
        for (; started < par; started++) {
            runs[started] = (struct gemm_run){.m = m, .slot = (unsigned)started,
                                              .batch = sizes[i], .seconds = o->seconds,
                                              .start = &start};
            if (pthread_create(&thr[started], NULL, gemm_thread, &runs[started]) != 0) break;
        }
        if (started < par) {
            /* Threads already started wait at the barrier for ever: give up. */
            fprintf(stderr, "kinfer bench gemm: cannot start %zu threads\n", par);
            exit(1);
        }
        double rows_per_s = 0, ms = 0;
        for (size_t k = 0; k < par; k++) {
            pthread_join(thr[k], NULL);
            if (runs[k].rc) rc = 1;
            rows_per_s += (double)(runs[k].calls * sizes[i]) / runs[k].elapsed_s;
            ms += runs[k].elapsed_s * 1000.0 / (double)runs[k].calls / (double)par;
        }
        pthread_barrier_destroy(&start);
        char dev[128];
        model_runtime_device_name(rt, dev, sizeof(dev));
        if (rc == 0)
            printf("gemm: model=%s backend=%s precision=%s threads=%d parallel=%zu batch=%zu "
                   "rows_per_s=%.0f batch_ms=%.3f tflops=%.4f device=\"%s\"\n", model_name(m),
                   model_runtime_backend(rt), model_runtime_precision(rt), o->threads, par,
                   sizes[i], rows_per_s, ms, rows_per_s * model_flops_per_row(m) / 1e12, dev);
    }
    if (rc) fprintf(stderr, "kinfer bench gemm: forward pass failed\n");
    free(runs);
    free(thr);
    model_destroy(m);
    model_runtime_destroy(rt);
    return rc;
}

/* ---- encode ------------------------------------------------------------------ */

/* `bench encode`: an encoder's forward pass alone on the configured
 * backend. --jobs texts of produce's length mix are tokenized and cut into
 * batches as the worker's batcher does at saturation with group_by_length
 * (by length, then at max_batch_rows rows or max_batch_tokens padded
 * tokens); --parallel threads each run every batch, back to back, for
 * --seconds (whole passes), with --threads OpenBLAS threads per pass.
 * Prints sequences/s, tokens/s and the batches' padding; on the CPU
 * backend also the share of the passes' time spent in cblas_sgemm
 * (gemm_share, warm-up pass included) and the passes' GFLOP/s as a
 * fraction of the machine's measured cblas_sgemm rate (1024^3 products
 * with the same OpenBLAS threads; times --parallel), and in bf16 as a
 * fraction of the AMX tiles' measured rate (amx_peak_frac). --dump FILE
 * writes the batches' ids, one JSON array of arrays per line, so PyTorch
 * can run the very same batches (bench/torch_encoder_bench.py). */

/* The batches, shared read-only by the threads. */
struct enc_set {
    const struct model *m;
    const int32_t *ids;     /* every sequence's ids */
    const size_t *off;      /* sequence s is ids[off[s] .. off[s + 1]) */
    const size_t *order;    /* [length, sequence] pairs, by length */
    const size_t *bstart;   /* batch b is order[bstart[b] .. bstart[b + 1]) */
    size_t nb, max_rows, max_tok;
    double seconds;
    pthread_barrier_t *start;
};

/* One thread's run over the set. */
struct enc_run {
    const struct enc_set *set;
    unsigned slot;
    FILE *dump;             /* slot 0 only: where the warm-up pass writes the batches */
    size_t seqs, toks, passes;
    double elapsed_s, warm_s;   /* the timed passes; the warm-up pass */
    int rc;
};

static int len_cmp(const void *a, const void *b)
{
    const size_t *x = a, *y = b; /* [length, sequence] pairs */
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* One untimed pass over every batch (the dump), then whole passes until
 * the set's seconds have gone by. */
static void *enc_thread(void *arg)
{
    struct enc_run *r = arg;
    const struct enc_set *st = r->set;
    char err[256];
    struct model_ws *ws = model_ws_new_tokens(st->m, r->slot, st->max_rows, st->max_tok, err,
                                              sizeof(err));
    int32_t *bids = malloc(st->max_tok * sizeof(int32_t));
    uint32_t *boff = malloc((st->max_rows + 1) * sizeof(uint32_t));
    r->rc = ws && bids && boff ? 0 : -1;
    if (!ws) fprintf(stderr, "kinfer bench encode: %s\n", err);
    double t0 = 0;
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 0) t0 = bench_mono_s();
        if (phase == 1) {
            r->warm_s = bench_mono_s() - t0;
            pthread_barrier_wait(st->start);
            t0 = bench_mono_s();
        }
        for (size_t b = 0; r->rc == 0; b = (b + 1) % st->nb) {
            size_t at = 0, rows = st->bstart[b + 1] - st->bstart[b];
            FILE *dump = phase == 0 ? r->dump : NULL;
            if (dump) fputc('[', dump);
            for (size_t k = 0; k < rows; k++) {
                size_t s = st->order[2 * (st->bstart[b] + k) + 1];
                size_t len = st->off[s + 1] - st->off[s];
                boff[k] = (uint32_t)at;
                memcpy(bids + at, st->ids + st->off[s], len * sizeof(int32_t));
                if (dump) {
                    fputs(k ? ",[" : "[", dump);
                    for (size_t t = 0; t < len; t++)
                        fprintf(dump, "%s%" PRId32, t ? "," : "", bids[at + t]);
                    fputc(']', dump);
                }
                at += len;
            }
            if (dump) fputs("]\n", dump);
            boff[rows] = (uint32_t)at;
            struct model_seqs q = {bids, NULL, boff, rows};
            const float *out;
            if (model_encode(st->m, ws, &q, &out) != MODEL_OK) {
                fprintf(stderr, "kinfer bench encode: forward pass failed: %s\n",
                        model_ws_error(ws));
                r->rc = -1;
            }
            if (phase == 1) {
                r->seqs += rows;
                r->toks += at;
                r->passes += b + 1 == st->nb;
                r->elapsed_s = bench_mono_s() - t0;
            }
            if (b + 1 == st->nb && (phase == 0 || r->elapsed_s >= st->seconds)) break;
        }
        if (phase == 0 && r->rc) pthread_barrier_wait(st->start); /* the others wait there */
        if (phase == 0 && r->rc) break;
    }
    free(bids);
    free(boff);
    model_ws_destroy(ws);
    return NULL;
}

int bench_encode(const struct kcfg *c, const struct bench_opts *o)
{
    char err[512];
    struct model_runtime *rt;
    struct model *m = bench_load_default_model(c, 0, o->threads, &rt);
    const struct model_encoder_info *e = m ? model_encoder(m) : NULL;
    if (!e) {
        if (m) fprintf(stderr, "kinfer bench encode: the default model is not an encoder\n");
        model_destroy(m);
        model_runtime_destroy(rt);
        return 1;
    }
    size_t n = o->jobs, max_rows = (size_t)c->batching.max_batch_rows;
    size_t max_tok = (size_t)c->batching.max_batch_tokens, cap = n * e->max_tokens;
    size_t par = o->parallel;
    struct textgen tg;
    struct tokenizer_scratch *sc = tokenizer_scratch_new(4096);
    int32_t *ids = malloc(cap * sizeof(int32_t));
    size_t *off = malloc((n + 1) * sizeof(size_t)), *order = malloc(2 * n * sizeof(size_t));
    size_t *bstart = malloc((n + 1) * sizeof(size_t));
    struct enc_run *runs = calloc(par, sizeof(*runs));
    pthread_t *thr = calloc(par, sizeof(*thr));
    FILE *dump = NULL;
    int rc = 1;
    if (textgen_init(&tg, e) < 0 || !sc || !ids || !off || !order || !bstart || !runs || !thr)
        goto out;
    off[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t = o->length ? textgen_fixed(&tg, i, o->length - 2) : textgen_text(&tg, i);
        int k = tokenizer_encode(e->tokenizer, sc, t, strlen(t), NULL, 0, e->max_tokens, 1,
                                 ids + off[i], NULL, cap - off[i], NULL, err, sizeof(err));
        if (k < 0) {
            fprintf(stderr, "kinfer bench encode: tokenizer: %s\n", err);
            goto out;
        }
        off[i + 1] = off[i] + (size_t)k;
        order[2 * i] = (size_t)k;
        order[2 * i + 1] = i;
    }
    qsort(order, n, 2 * sizeof(size_t), len_cmp);
    size_t nb = 0, padded = 0;
    double flops = 0; /* one pass: projections, feed-forward, attention */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && j - i < max_rows && (j - i + 1) * order[2 * j] <= max_tok) j++;
        if (j == i) j++;
        bstart[nb++] = i;
        padded += (j - i) * order[2 * (j - 1)];
        i = j;
    }
    bstart[nb] = n;
    for (size_t i = 0; i < n; i++) {
        double len = (double)order[2 * i];
        flops += len * model_flops_per_row(m) +
                 4.0 * (double)e->layers * len * len * (double)e->hidden;
    }
    if (o->dump && !(dump = fopen(o->dump, "w"))) {
        fprintf(stderr, "kinfer bench encode: %s: %s\n", o->dump, strerror(errno));
        goto out;
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)par);
    struct enc_set set = {m, ids, off, order, bstart, nb, max_rows, max_tok, o->seconds, &start};
    int cpu = strcmp(model_runtime_backend(rt), "cpu") == 0;
    if (cpu) model_cpu_gemm_profile(1);
    size_t started = 0;
    for (; started < par; started++) {
        runs[started] = (struct enc_run){.set = &set, .slot = (unsigned)started,
                                         .dump = started ? NULL : dump};
        if (pthread_create(&thr[started], NULL, enc_thread, &runs[started]) != 0) break;
    }
    if (started < par) {
        fprintf(stderr, "kinfer bench encode: cannot start %zu threads\n", par);
        exit(1); /* the started ones wait at the barrier for ever */
    }
    double seqs_s = 0, toks_s = 0, passes_s = 0, busy_s = 0;
    rc = 0;
    for (size_t k = 0; k < par; k++) {
        pthread_join(thr[k], NULL);
        if (runs[k].rc || runs[k].elapsed_s <= 0) {
            rc = 1;
            continue;
        }
        seqs_s += (double)runs[k].seqs / runs[k].elapsed_s;
        toks_s += (double)runs[k].toks / runs[k].elapsed_s;
        passes_s += (double)runs[k].passes / runs[k].elapsed_s;
        busy_s += runs[k].warm_s + runs[k].elapsed_s;
    }
    char gemm[256] = "";
    if (cpu && rc == 0 && busy_s > 0) {
        model_cpu_gemm_profile(0);
        double share = model_cpu_gemm_seconds() / busy_s, peak = model_cpu_sgemm_peak(1024, 1.0);
        double rate = flops * passes_s / 1e9 / (double)par;
        int at = snprintf(gemm, sizeof(gemm), " gemm_share=%.3f sgemm_peak_gflops=%.1f peak_frac=%.3f",
                          share, peak, peak > 0 ? rate / peak : 0.0);
        double amx = strcmp(model_runtime_precision(rt), "bf16") ? 0 : model_cpu_amx_peak(1024, 1.0);
        if (amx > 0 && at > 0 && (size_t)at < sizeof(gemm))
            snprintf(gemm + at, sizeof(gemm) - (size_t)at, " amx_peak_gflops=%.1f amx_peak_frac=%.3f",
                     amx, rate / amx);
    }
    pthread_barrier_destroy(&start);
    char dev[128];
    model_runtime_device_name(rt, dev, sizeof(dev));
    if (rc == 0)
        printf("encode: model=%s backend=%s precision=%s threads=%d parallel=%zu layers=%zu "
               "hidden=%zu seqs=%zu batches=%zu mean_batch_rows=%.1f mean_tokens=%.1f "
               "padded_ratio=%.3f seqs_per_s=%.1f tokens_per_s=%.0f gflops=%.2f%s device=\"%s\"\n",
               model_name(m), model_runtime_backend(rt), model_runtime_precision(rt), o->threads,
               par, e->layers, e->hidden, n, nb, (double)n / (double)nb,
               (double)off[n] / (double)n, 1.0 - (double)off[n] / (double)padded, seqs_s,
               toks_s, flops * passes_s / 1e9, gemm, dev);
out:
    if (dump) fclose(dump);
    textgen_fini(&tg);
    tokenizer_scratch_destroy(sc);
    free(ids);
    free(off);
    free(order);
    free(bstart);
    free(runs);
    free(thr);
    model_destroy(m);
    model_runtime_destroy(rt);
    return rc;
}

/* bench_gen.c - `kinfer bench generate`: a decoder folder's text
 * generation alone on the configured backend (gpu/decoder.h, the code
 * the generation engine runs): prefill tokens/s of one prompt, and decode
 * tokens/s at each --batch size (that many sequences, each after a
 * prompt of --length tokens, stepping one token each per decoder_step),
 * beside the memory bandwidth and the decode bound it sets (the weights
 * as they are held read once per step): on the CPU the machine's read
 * bandwidth, measured; on CUDA the device's peak, as it reports it.
 *
 * Token ids are a fixed function of (sequence, position), the same as
 * bench/torch_decoder_bench.py's and bench/hf_generate_bench.py's, so the
 * sides run the same inputs. On the CPU the logits are not sampled (what
 * is measured is the model, not a sampler); on CUDA each decode step
 * picks on the device, as the engine does there: greedily, or with
 * --sampling's temperature, top-k and top-p, each row's draw a fixed
 * function of (sequence, step).
 *
 * Threads: the main thread, plus --threads readers while the bandwidth
 * is measured. Ownership: the decoder, runtime and workspaces are made
 * and freed here. */
#include "bench.h"
#include "bench_shared.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/decoder.h"
#include "../gpu/safetensors.h"

#define GEN_ROUNDS 3          /* decode runs per batch size: the median is printed */
#define GEN_BW_BYTES (1ul << 30) /* bandwidth buffer: far past any cache */

/* ---- read bandwidth ---------------------------------------------------------- */

typedef uint64_t gen_v8 __attribute__((vector_size(64)));

struct gen_bw {
    const gen_v8 *p;
    size_t n;          /* vectors */
    uint64_t sink;
};

/* Sums the buffer in four independent chains (the sum only keeps the
 * loads from being dropped). One clone per instruction set, chosen at
 * load time, except under ThreadSanitizer, which instruments the clones'
 * resolver and crashes in it (it runs before the sanitizer starts). */
#ifdef __SANITIZE_THREAD__
#define GEN_CLONES
#else
#define GEN_CLONES __attribute__((target_clones("avx512f", "default")))
#endif
GEN_CLONES
static void *gen_bw_read(void *arg)
{
    struct gen_bw *b = arg;
    gen_v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i + 4 <= b->n; i += 4) {
        s0 += b->p[i];
        s1 += b->p[i + 1];
        s2 += b->p[i + 2];
        s3 += b->p[i + 3];
    }
    gen_v8 s = s0 + s1 + s2 + s3;
    uint64_t t = 0;
    for (int k = 0; k < 8; k++) t += s[k];
    b->sink = t;
    return NULL;
}

/* GB/s reading GEN_BW_BYTES with `threads` threads, each its own slice;
 * the best of five passes. 0 when memory or threads are not there. */
static double gen_bandwidth(int threads)
{
    size_t n = GEN_BW_BYTES / sizeof(gen_v8);
    gen_v8 *buf = aligned_alloc(64, n * sizeof(gen_v8));
    if (!buf || threads < 1 || threads > 256) {
        free(buf);
        return 0;
    }
    memset(buf, 1, n * sizeof(gen_v8));
    struct gen_bw parts[256];
    pthread_t thr[256];
    double best = 0;
    size_t per = n / (size_t)threads / 4 * 4;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = bench_mono_s();
        int started = 0;
        for (; started < threads; started++) {
            parts[started] = (struct gen_bw){buf + (size_t)started * per, per, 0};
            if (started && pthread_create(&thr[started], NULL, gen_bw_read, &parts[started]))
                break;
        }
        gen_bw_read(&parts[0]);
        for (int k = 1; k < started; k++) pthread_join(thr[k], NULL);
        double s = bench_mono_s() - t0, gbs = (double)started * (double)per * 64 / s / 1e9;
        if (started == threads && gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

/* ---- the decoder ------------------------------------------------------------- */

/* The id sequence seq reads at position pos (bench/torch_decoder_bench.py
 * draws the same). */
static int32_t gen_id(size_t seq, size_t pos, size_t vocab)
{
    return (int32_t)((seq * 104729u + pos * 7919u + 3u) % vocab);
}

/* Bytes per element of the folder's weights (its lm_head, else embedding
 * table), 0 when unreadable. */
static size_t gen_weight_bytes(const char *dir)
{
    char path[4200], err[256];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct st_file *f = st_open(path, err, sizeof(err));
    if (!f) return 0;
    const struct st_tensor *t = st_find(f, "lm_head.weight");
    if (!t) t = st_find(f, "model.embed_tokens.weight");
    size_t b = t ? st_dtype_size(t->dtype) : 0;
    st_close(f);
    return b;
}

struct gen_set {
    const struct decoder *d;
    const struct decoder_info *in;
    size_t prompt, steps;
    int overlap;               /* generation.overlap: decode steps chained */
    float temperature, top_p;  /* --sampling; temperature 0: greedy */
    uint32_t top_k;
};

/* A draw in [0, 1) for sequence i's step s (splitmix64 of the pair). */
static double gen_draw(size_t i, size_t s)
{
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + (uint64_t)s + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* --sampling "TEMP,TOP_K,TOP_P" into g; 0, or -1 with the reason printed. */
static int gen_sampling(const char *spec, struct gen_set *g)
{
    if (!spec) return 0;
    char *end;
    double t = strtod(spec, &end);
    unsigned long k = 0;
    double p = 0;
    int ok = *end == ',';
    if (ok) k = strtoul(end + 1, &end, 10), ok = *end == ',';
    if (ok) p = strtod(end + 1, &end), ok = *end == '\0';
    if (!ok || !(t > 0 && t <= 100) || k > 0x7fffffffu || !(p > 0 && p <= 1)) {
        fprintf(stderr, "kinfer bench generate: --sampling '%s': TEMP,TOP_K,TOP_P with TEMP "
                "in (0, 100], TOP_K 0 (off) or a count, TOP_P in (0, 1] (1: off)\n", spec);
        return -1;
    }
    g->temperature = (float)t;
    g->top_k = (uint32_t)k;
    g->top_p = (float)p;
    return 0;
}

/* A workspace for b sequences of prompt + steps tokens, prompts whole in
 * one step. */
static struct decoder_ws *gen_ws(const struct gen_set *g, size_t b)
{
    char err[512];
    size_t ctx = g->prompt + g->steps, blocks = (ctx + 15) / 16 + 1;
    struct decoder_ws_conf c = {.max_seqs = b, .max_tokens = b > g->prompt ? b : g->prompt, .max_ctx = ctx,
                                .block_tokens = 16,
                                .kv_bytes = b * blocks * decoder_kv_block_bytes(g->d, 16)};
    struct decoder_ws *ws = decoder_ws_new(g->d, 0, &c, err, sizeof(err));
    if (!ws) fprintf(stderr, "kinfer bench generate: %s\n", err);
    return ws;
}

/* Prefills b sequences with the prompt (chunk sequences per step), then
 * runs `steps` decode steps of one token each; the seconds of each phase
 * into pre_s and dec_s. 0, or -1 with the reason printed. */
static int gen_run(const struct gen_set *g, struct decoder_ws *ws, size_t b, size_t chunk,
                   double *pre_s, double *dec_s, double *gemm_s)
{
    struct kvcache *kv = decoder_ws_cache(ws);
    size_t P = g->prompt, V = g->in->vocab;
    int *seqs = malloc(b * sizeof(int));
    int32_t *ids = malloc(b * P * sizeof(int32_t));
    uint32_t *off = malloc((b + 1) * sizeof(uint32_t));
    /* picks on the device where the backend has a sampler */
    struct decoder_sample *rows = NULL;
    struct decoder_pick *picks = NULL;
    if (decoder_ws_samples(ws)) {
        rows = calloc(b, sizeof(*rows));
        picks = calloc(b, sizeof(*picks));
        for (size_t i = 0; rows && i < b; i++)
            rows[i] = (struct decoder_sample){.temperature = g->temperature, .top_k = g->top_k,
                                              .top_p = g->temperature > 0 ? g->top_p : 1.0f,
                                              .on = 1};
    }
    const float *lg;
    int rc = seqs && ids && off && (!decoder_ws_samples(ws) || (rows && picks)) ? 0 : -1;
    int overlap = rows && decoder_ws_overlaps(ws) && g->overlap;
    for (size_t i = 0; rc == 0 && i < b; i++)
        if ((seqs[i] = kvcache_seq_new(kv)) < 0) rc = -1;
    double t0 = bench_mono_s();
    for (size_t at = 0; rc == 0 && at < b; at += chunk) {
        size_t n = b - at < chunk ? b - at : chunk;
        off[0] = 0;
        for (size_t i = 0; i < n; i++) {
            for (size_t p = 0; p < P; p++) ids[i * P + p] = gen_id(at + i, p, V);
            off[i + 1] = (uint32_t)((i + 1) * P);
        }
        struct decoder_batch bt = {.n = n, .seqs = seqs + at, .ids = ids, .offsets = off};
        if (decoder_step(g->d, ws, &bt, &lg) != MODEL_OK) rc = -1;
    }
    model_cpu_gemm_profile(1);
    double g0 = model_cpu_gemm_seconds(), t1 = bench_mono_s();
    for (size_t s = 0; rc == 0 && s < g->steps; s++) {
        for (size_t i = 0; i < b; i++) {
            ids[i] = gen_id(i, P + s, V);
            off[i + 1] = (uint32_t)(i + 1);
            if (rows) rows[i].u = gen_draw(i, s);
        }
        off[0] = 0;
        struct decoder_batch bt = {.n = b, .seqs = seqs, .ids = ids, .offsets = off};
        if (overlap) {
            /* as the engine runs them: each step chained to the one before
             * (its ids that one's picks) and submitted before it is
             * collected */
            if (decoder_step_submit(g->d, ws, &bt, rows, s > 0) != MODEL_OK ||
                (s > 0 && decoder_step_collect(g->d, ws, picks) != MODEL_OK))
                rc = -1;
        } else if (rows ? decoder_step_sample(g->d, ws, &bt, rows, picks) != MODEL_OK
                        : decoder_step(g->d, ws, &bt, &lg) != MODEL_OK) {
            rc = -1;
        }
    }
    if (rc == 0 && overlap && g->steps && decoder_step_collect(g->d, ws, picks) != MODEL_OK)
        rc = -1;
    *pre_s = t1 - t0;
    *dec_s = bench_mono_s() - t1;
    *gemm_s = model_cpu_gemm_seconds() - g0;
    model_cpu_gemm_profile(0);
    if (rc) fprintf(stderr, "kinfer bench generate: step: %s\n", decoder_ws_error(ws));
    for (size_t i = 0; seqs && i < b; i++)
        if (seqs[i] >= 0) kvcache_seq_free(kv, seqs[i]);
    free(seqs);
    free(ids);
    free(off);
    free(rows);
    free(picks);
    return rc;
}

int bench_generate(const struct kcfg *c, const struct bench_opts *o)
{
    char err[512], dev[128];
    if (!o->model) {
        fprintf(stderr, "kinfer bench generate: --model DIR is required\n");
        return 1;
    }
    struct model_spec spec = {0};
    snprintf(spec.name, sizeof(spec.name), "bench");
    snprintf(spec.path, sizeof(spec.path), "%s", o->model);
    struct model_runtime_conf rconf;
    cfg_model_runtime(c, &rconf); /* worker.backend, precisions, gpu.* */
    rconf.cpu_threads = o->threads;
    rconf.specs = &spec; /* gpu.precision "auto" reads --model's folder */
    rconf.n_specs = 1;
    struct model_runtime *rt = model_runtime_new(&rconf, err, sizeof(err));
    struct decoder *d = rt ? decoder_load(rt, &spec, err, sizeof(err)) : NULL;
    if (!d) {
        fprintf(stderr, "kinfer bench generate: %s\n", err);
        model_runtime_destroy(rt);
        return 1;
    }
    const struct decoder_info *in = decoder_info(d);
    struct gen_set g = {d, in, o->length ? o->length : 128, o->steps ? o->steps : 64,
                        c->generation.overlap, 0.0f, 1.0f, 0};
    if (gen_sampling(o->sampling, &g) < 0) {
        decoder_destroy(d);
        model_runtime_destroy(rt);
        return 1;
    }
    const char *prec = model_runtime_precision(rt);
    int cpu = strcmp(model_runtime_backend(rt), "cpu") == 0;
    /* bytes per weight as held: the CPU keeps 16-bit files 16-bit in fp32
     * (bf16 rounds all to 16); CUDA converts to the activation type */
    size_t wb = strcmp(prec, "bf16") == 0 || strcmp(prec, "fp16") == 0 ? 2
                : cpu ? gen_weight_bytes(o->model) : 4;
    size_t Q = in->heads * in->head_dim;
    size_t K = in->kv_heads * in->head_dim, H = in->hidden;
    double wparams = (double)in->layers * (double)(2 * H * Q + 2 * H * K +
                                                   3 * H * in->intermediate) +
                     (double)in->vocab * (double)H;
    double wbytes = wparams * (double)wb;
    int threads = o->threads > 0 ? o->threads : 1;
    struct model_device_stats ds;
    double bw = cpu ? gen_bandwidth(threads)
                    : model_runtime_device_stats(rt, 0, &ds) == 0 ? ds.mem_gbs : 0.0;
    model_runtime_device_name(rt, dev, sizeof(dev));
    printf("generate: phase=bandwidth backend=%s threads=%d precision=%s read_gbs=%.2f "
           "read_source=%s weight_bytes=%.0f weight_dtype_bytes=%zu bound_steps_per_s=%.1f\n",
           model_runtime_backend(rt), threads, prec, bw, cpu ? "measured" : "device_peak",
           wbytes, wb, wbytes > 0 ? bw * 1e9 / wbytes : 0.0);
    fflush(stdout);
    int rc = 0;
    char sampling[64] = "greedy";
    if (g.temperature > 0)
        snprintf(sampling, sizeof(sampling), "%g,%u,%g", (double)g.temperature, g.top_k,
                 (double)g.top_p);
    /* prefill: one sequence, its whole prompt in one step */
    struct decoder_ws *ws = gen_ws(&g, 1);
    double best_pre = 0, pre, dec, gs;
    for (int r = 0; ws && rc == 0 && r < GEN_ROUNDS; r++) {
        struct gen_set one = g;
        one.steps = 0;
        rc = gen_run(&one, ws, 1, 1, &pre, &dec, &gs);
        if (rc == 0 && pre > 0 && (double)g.prompt / pre > best_pre)
            best_pre = (double)g.prompt / pre;
    }
    decoder_ws_destroy(ws);
    if (!ws) rc = -1;
    if (rc == 0)
        printf("generate: phase=prefill threads=%d precision=%s prompt=%zu tokens_per_s=%.1f\n",
               threads, prec, g.prompt, best_pre);
    const char *p = o->batches;
    while (rc == 0 && p && *p) {
        size_t b = strtoul(p, NULL, 10);
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
        if (!b || b > 1024) continue;
        if (!(ws = gen_ws(&g, b))) {
            rc = -1;
            break;
        }
        double rate[GEN_ROUNDS], share[GEN_ROUNDS], gbs[GEN_ROUNDS];
        for (int r = 0; rc == 0 && r < GEN_ROUNDS; r++) {
            rc = gen_run(&g, ws, b, 1, &pre, &dec, &gs);
            rate[r] = dec > 0 ? (double)(g.steps * b) / dec : 0;
            share[r] = dec > 0 ? gs / dec : 0;
            gbs[r] = gs > 0 ? wbytes * (double)g.steps / gs / 1e9 : 0;
        }
        int chained = g.overlap && decoder_ws_overlaps(ws), samples = decoder_ws_samples(ws);
        decoder_ws_destroy(ws);
        if (rc) break;
        /* the median run (by rate), its share of time in the GEMMs and
         * the weight bytes per second those read */
        double sorted[GEN_ROUNDS];
        memcpy(sorted, rate, sizeof(sorted));
        qsort(sorted, GEN_ROUNDS, sizeof(double), bench_cmp_double);
        int med = 0;
        while (med < GEN_ROUNDS - 1 && rate[med] != sorted[GEN_ROUNDS / 2]) med++;
        double bound = wbytes > 0 ? bw * 1e9 / wbytes * (double)b : 0;
        printf("generate: phase=decode threads=%d precision=%s seqs=%zu prompt=%zu steps=%zu "
               "tokens_per_s=%.1f steps_per_s=%.2f bound_tokens_per_s=%.1f bound_frac=%.3f "
               "gemm_share=%.3f gemm_read_gbs=%.2f chained=%d sampling=%s device=\"%s\"\n",
               threads, prec, b, g.prompt, g.steps, rate[med], rate[med] / (double)b, bound,
               bound > 0 ? rate[med] / bound : 0.0, share[med], gbs[med], chained,
               samples ? sampling : "none", dev);
        fflush(stdout);
    }
    decoder_destroy(d);
    model_runtime_destroy(rt);
    return rc ? 1 : 0;
}

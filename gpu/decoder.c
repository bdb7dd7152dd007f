/* decoder.c - the decoder runtime of decoder.h: reading a decoder folder
 * (config.json, one safetensors file or the shards an index names),
 * handing it to its architecture (arch.h's decoder registry), workspaces
 * with their paged cache, and the step: check the batch, grow the
 * sequences in the cache's bookkeeping, stage the token arrays and block
 * tables on the device, run the architecture, fetch the logits (or let
 * the backend's sampler pick from them and fetch the picks).
 *
 * Threads and ownership: as decoder.h says. */
#include "decoder.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arch.h"
#include "backend.h"
#include "safetensors.h"

#define DECODER_MAX_SHARDS 512
#define DECODER_BLOCK_DEFAULT 16

struct decoder {
    char name[MODEL_NAME_MAX];
    struct arch_rt rt;
    const struct arch_decoder *arch;
    void *am;
    struct arch_dec_info ai;
    struct decoder_info info;
};

struct decoder_ws {
    const struct decoder *d;
    struct decoder_ws_conf conf;     /* resolved */
    void *ctx;
    void *aws;
    struct kvcache *kv;
    size_t width;                    /* block table entries per sequence */
    size_t layer_bytes;              /* per layer in each of k and v */
    void *k, *v;                     /* the cache */
    /* Host staging, two of each so a step may be prepared while the one
     * before it is in flight (the step's slot: its number's parity). */
    uint32_t *h_tok[2], *d_tok;      /* ids, pos, seq [T each], offsets [n+1], tables */
    float *h_out;
    struct bk_sample_row *h_srow[2]; /* sampling: per row, host; NULL without a sampler */
    struct bk_sample_out *h_sout[2];
    void *d_sscr;                    /* the sampler's scratch */
    /* Steps in flight (submitted, not collected), oldest first: each
     * step's slot, rows and whether they pick. */
    struct dec_flight {
        unsigned slot;
        size_t n;
        int logits;                  /* decoder_step's: logits to the host */
        unsigned char *on;           /* [max_seqs]: the row picks (with logprob: 2) */
    } flight[2];
    size_t n_flight;
    uint64_t submitted;
    /* The last step submitted, for a chained step to follow: its
     * sequences when every row picked (n 0 otherwise). */
    int *last_seqs;
    size_t last_n;
    struct decoder_ws_counters count;
    const void *step_out;            /* the architecture's output, for replayed steps */
    size_t *old_len;                 /* per batch row, to undo a failed step */
    unsigned char *mark;             /* per cache id: seen in this batch */
    char err[256];
};

__attribute__((format(printf, 3, 4)))
static void dec_err(char *errstr, size_t n, const char *fmt, ...)
{
    if (!errstr || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, n, fmt, ap);
    va_end(ap);
}

int decoder_model_type_known(const char *model_type)
{
    return arch_decoder_for_model_type(model_type) != NULL;
}

/* ---- loading ------------------------------------------------------------------ */

/* The weights: model.safetensors, else every file the index's weight_map
 * names (plain file names in the folder, each opened once). */
static int dec_open_weights(const struct model_spec *spec, struct st_file ***files, size_t *n,
                            char *errstr, size_t errstr_size)
{
    char path[4200], why[512];
    struct stat st;
    *files = NULL;
    *n = 0;
    snprintf(path, sizeof(path), "%s/model.safetensors", spec->path);
    if (stat(path, &st) == 0) {
        if (!(*files = calloc(1, sizeof(**files)))) goto oom;
        if (!((*files)[0] = st_open(path, why, sizeof(why)))) {
            dec_err(errstr, errstr_size, "model %s: %s", spec->name, why);
            return -1;
        }
        *n = 1;
        return 0;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", spec->path);
    json_error_t je;
    json_t *idx = json_load_file(path, 0, &je);
    if (!idx) {
        dec_err(errstr, errstr_size,
                "model %s: %s/model.safetensors: no such file, and no readable "
                "model.safetensors.index.json (%s)", spec->name, spec->path, je.text);
        return -1;
    }
    const json_t *map = json_object_get(idx, "weight_map");
    int rc = -1;
    if (!json_is_object(map) || !json_object_size(map)) {
        dec_err(errstr, errstr_size, "model %s: %s: no weight_map", spec->name, path);
        goto done;
    }
    if (!(*files = calloc(DECODER_MAX_SHARDS, sizeof(**files)))) goto oom_idx;
    const char *key;
    const json_t *val;
    const char *names[DECODER_MAX_SHARDS];
    json_object_foreach((json_t *)map, key, val) {
        const char *f = json_string_value(val);
        if (!f || !*f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, ".")) {
            dec_err(errstr, errstr_size, "model %s: %s: weight_map[\"%s\"] is not a file name",
                    spec->name, path, key);
            goto done;
        }
        size_t k = 0;
        while (k < *n && strcmp(names[k], f)) k++;
        if (k < *n) continue;
        if (*n == DECODER_MAX_SHARDS) {
            dec_err(errstr, errstr_size, "model %s: more than %d shards", spec->name,
                    DECODER_MAX_SHARDS);
            goto done;
        }
        char sp[4200];
        snprintf(sp, sizeof(sp), "%s/%s", spec->path, f);
        if (!((*files)[*n] = st_open(sp, why, sizeof(why)))) {
            dec_err(errstr, errstr_size, "model %s: %s", spec->name, why);
            goto done;
        }
        names[(*n)++] = f;
    }
    rc = 0;
done:
    json_decref(idx);
    return rc;
oom_idx:
    json_decref(idx);
oom:
    dec_err(errstr, errstr_size, "model %s: out of memory", spec->name);
    return -1;
}

/* bos_token_id and eos_token_id of generation_config.json, else of
 * config.json (either may be absent). */
static void dec_token_ids(const char *dir, const json_t *config, struct decoder_info *in)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    json_t *gen = json_load_file(path, 0, NULL);
    const json_t *src[2] = {json_is_object(gen) ? gen : NULL, config};
    in->bos_id = -1;
    in->n_eos = 0;
    for (int k = 0; k < 2; k++) {
        const json_t *b = json_object_get(src[k], "bos_token_id");
        if (in->bos_id < 0 && json_is_integer(b) && json_integer_value(b) >= 0 &&
            (size_t)json_integer_value(b) < in->vocab)
            in->bos_id = (int32_t)json_integer_value(b);
        const json_t *e = json_object_get(src[k], "eos_token_id"), *x;
        if (in->n_eos || !e) continue;
        size_t i, n = json_is_array(e) ? json_array_size(e) : 1;
        for (i = 0; i < n && in->n_eos < DECODER_MAX_EOS; i++) {
            x = json_is_array(e) ? json_array_get(e, i) : e;
            if (json_is_integer(x) && json_integer_value(x) >= 0 &&
                (size_t)json_integer_value(x) < in->vocab)
                in->eos_ids[in->n_eos++] = (int32_t)json_integer_value(x);
        }
    }
    json_decref(gen);
}

struct decoder *decoder_load(struct model_runtime *rt, const struct model_spec *spec,
                             char *errstr, size_t errstr_size)
{
    struct decoder *d = calloc(1, sizeof(*d));
    struct st_file **files = NULL;
    size_t n_files = 0;
    json_t *config = NULL;
    if (!d) {
        dec_err(errstr, errstr_size, "model %s: out of memory", spec->name);
        return NULL;
    }
    snprintf(d->name, sizeof(d->name), "%s", spec->name);
    d->rt = model_runtime_arch(rt);
    char path[4200];
    json_error_t je;
    snprintf(path, sizeof(path), "%s/config.json", spec->path);
    if (!(config = json_load_file(path, JSON_REJECT_DUPLICATES, &je)) || !json_is_object(config)) {
        dec_err(errstr, errstr_size, "model %s: %s:%d: %s", spec->name, path, je.line,
                config ? "not a JSON object" : je.text);
        goto fail;
    }
    const char *mt = json_string_value(json_object_get(config, "model_type"));
    if (!(d->arch = arch_decoder_for_model_type(mt))) {
        dec_err(errstr, errstr_size,
                "model %s: config.json: model_type \"%s\" is not a decoder this build runs "
                "(llama, mistral, qwen2, qwen3)", spec->name, mt ? mt : "");
        goto fail;
    }
    if (dec_open_weights(spec, &files, &n_files, errstr, errstr_size) < 0) goto fail;
    struct arch_load ld = {.rt = d->rt, .spec = spec, .config = config, .file = files[0],
                           .shards = (const struct st_file *const *)files + 1,
                           .n_shards = n_files - 1, .errstr = errstr,
                           .errstr_size = errstr_size};
    if (!(d->am = d->arch->load(&ld, &d->ai))) goto fail;
    d->info = (struct decoder_info){
        .arch = d->arch->name, .vocab = d->ai.vocab, .hidden = d->ai.hidden,
        .layers = d->ai.layers, .heads = d->ai.heads, .kv_heads = d->ai.kv_heads,
        .head_dim = d->ai.head_dim, .intermediate = d->ai.intermediate,
        .context = d->ai.context, .n_params = ld.n_params,
        .flops_per_token = d->ai.flops_per_token};
    dec_token_ids(spec->path, config, &d->info);
    for (size_t i = 0; i < n_files; i++) st_close(files[i]);
    free(files);
    json_decref(config);
    return d;
fail:
    for (size_t i = 0; files && i < n_files; i++) st_close(files[i]);
    free(files);
    json_decref(config);
    decoder_destroy(d);
    return NULL;
}

void decoder_destroy(struct decoder *d)
{
    if (!d) return;
    if (d->am) d->arch->unload(&d->rt, d->am);
    free(d);
}

const struct decoder_info *decoder_info(const struct decoder *d)
{
    return &d->info;
}

/* ---- workspaces ------------------------------------------------------------------ */

void decoder_ws_destroy(struct decoder_ws *ws)
{
    if (!ws) return;
    if (ws->aws) ws->d->arch->ws_free(ws->aws);
    if (ws->ctx) ws->d->rt.ops->ctx_free(ws->ctx);
    kvcache_destroy(ws->kv);
    free(ws->old_len);
    free(ws->mark);
    free(ws->last_seqs);
    free(ws->flight[0].on);
    free(ws->flight[1].on);
    free(ws);
}

size_t decoder_kv_block_bytes(const struct decoder *d, size_t block_tokens)
{
    return d->info.layers * 2 * block_tokens * d->info.kv_heads * d->info.head_dim *
           d->rt.ops->kv_size(d->rt.be);
}

struct decoder_ws *decoder_ws_new(const struct decoder *d, unsigned slot,
                                  const struct decoder_ws_conf *conf, char *errstr,
                                  size_t errstr_size)
{
    const struct backend_ops *o = d->rt.ops;
    struct decoder_ws_conf c = *conf;
    if (!c.max_ctx || c.max_ctx > d->info.context) c.max_ctx = d->info.context;
    if (!c.block_tokens) c.block_tokens = DECODER_BLOCK_DEFAULT;
    size_t row = d->info.kv_heads * d->info.head_dim;
    size_t wide = d->info.vocab > 4 * d->info.intermediate ? d->info.vocab
                                                           : 4 * d->info.intermediate;
    if (!c.max_seqs || !c.max_tokens || c.max_seqs > (1u << 16) || c.max_tokens > (1u << 24) ||
        c.max_tokens > SIZE_MAX / sizeof(float) / wide / 2 || c.block_tokens > 4096) {
        dec_err(errstr, errstr_size, "model %s: a decoder workspace of %zu sequences and %zu "
                "tokens per step is not possible", d->name, c.max_seqs, c.max_tokens);
        return NULL;
    }
    size_t es = o->kv_size(d->rt.be); /* a cached key or value element */
    size_t block_bytes = decoder_kv_block_bytes(d, c.block_tokens);
    size_t blocks = kvcache_blocks_for_budget(c.kv_bytes, block_bytes);
    struct decoder_ws *ws = calloc(1, sizeof(*ws));
    if (!ws) goto oom;
    ws->d = d;
    ws->conf = c;
    char err[256] = "";
    if (!blocks) {
        dec_err(errstr, errstr_size, "model %s: a kv cache budget of %zu bytes holds no block "
                "of %zu bytes", d->name, c.kv_bytes, block_bytes);
        goto fail_quiet;
    }
    if (!(ws->kv = kvcache_new(blocks, c.block_tokens, c.max_seqs, c.max_ctx, err, sizeof(err))))
        goto fail;
    ws->width = kvcache_table_width(ws->kv);
    ws->layer_bytes = blocks * c.block_tokens * row * es;
    if (!(ws->ctx = o->ctx_new(d->rt.be, slot, err, sizeof(err)))) goto fail;
    size_t words = 3 * c.max_tokens + c.max_seqs + 1 + c.max_seqs * ws->width;
    size_t lrows = c.all_logits ? c.max_tokens : c.max_seqs;
    if (ws->layer_bytes > SIZE_MAX / d->info.layers) goto oom;
    size_t cache = d->info.layers * ws->layer_bytes;
    if (!(ws->k = o->ctx_alloc(ws->ctx, cache, 0)) || !(ws->v = o->ctx_alloc(ws->ctx, cache, 0)) ||
        !(ws->h_tok[0] = o->ctx_alloc(ws->ctx, words * sizeof(uint32_t), 1)) ||
        !(ws->h_tok[1] = o->ctx_alloc(ws->ctx, words * sizeof(uint32_t), 1)) ||
        !(ws->d_tok = o->ctx_alloc(ws->ctx, words * sizeof(uint32_t), 0)) ||
        !(ws->h_out = o->ctx_alloc(ws->ctx, lrows * d->info.vocab * sizeof(float), 1)) ||
        !(ws->old_len = calloc(c.max_seqs, sizeof(size_t))) ||
        !(ws->mark = calloc(c.max_seqs, 1)) ||
        !(ws->last_seqs = calloc(c.max_seqs, sizeof(int))) ||
        !(ws->flight[0].on = calloc(c.max_seqs, 1)) || !(ws->flight[1].on = calloc(c.max_seqs, 1)))
        goto oom;
    for (int i = 0; o->sample && !c.all_logits && i < 2; i++)
        if (!(ws->h_srow[i] = o->ctx_alloc(ws->ctx, c.max_seqs * sizeof(*ws->h_srow[i]), 1)) ||
            !(ws->h_sout[i] = o->ctx_alloc(ws->ctx, c.max_seqs * sizeof(*ws->h_sout[i]), 1)))
            goto oom;
    if (ws->h_srow[0] &&
        !(ws->d_sscr = o->ctx_alloc(ws->ctx, o->sample_scratch(d->rt.be, c.max_seqs), 0)))
        goto oom;
    struct arch_dec_sizes sz = {c.max_seqs, c.max_tokens, c.max_ctx, c.all_logits};
    if (!(ws->aws = d->arch->ws_new(&d->rt, d->am, ws->ctx, &sz, err, sizeof(err)))) goto fail;
    return ws;
oom:
    snprintf(err, sizeof(err), "out of memory for a decoder workspace (%s)",
             ws && ws->ctx ? o->ctx_error(ws->ctx) : "host");
fail:
    dec_err(errstr, errstr_size, "model %s: %s", d->name, err);
fail_quiet:
    decoder_ws_destroy(ws);
    return NULL;
}

struct kvcache *decoder_ws_cache(struct decoder_ws *ws)
{
    return ws->kv;
}

const char *decoder_ws_error(const struct decoder_ws *ws)
{
    return ws->err;
}

int decoder_ws_samples(const struct decoder_ws *ws)
{
    return ws->h_srow[0] != NULL;
}

int decoder_ws_overlaps(const struct decoder_ws *ws)
{
    return ws->h_srow[0] && ws->d->rt.ops->pass_submit && ws->d->rt.ops->pass_wait;
}

size_t decoder_ws_in_flight(const struct decoder_ws *ws)
{
    return ws->n_flight;
}

void decoder_ws_counters(const struct decoder_ws *ws, struct decoder_ws_counters *out)
{
    *out = ws->count;
}

void decoder_ws_inject_fault(struct decoder_ws *ws)
{
    ws->d->rt.ops->inject_fault(ws->ctx);
}

/* ---- the step ------------------------------------------------------------------- */

/* Everything a backend indexes with is checked here; the blocks the
 * batch needs are counted before any sequence grows. A chained batch
 * repeats the last step's sequences, one token each, its ids being
 * that step's picks on the device (b->ids unread). */
static int dec_check(const struct decoder *d, struct decoder_ws *ws, const struct decoder_batch *b,
                     int chain)
{
    const struct decoder_ws_conf *c = &ws->conf;
    if (!b || !b->seqs || (!b->ids && !chain) || !b->offsets || !b->n || b->n > c->max_seqs ||
        b->offsets[0] != 0) {
        snprintf(ws->err, sizeof(ws->err), "a step of %zu sequences (at most %zu)",
                 b ? b->n : 0, c->max_seqs);
        return MODEL_EINVAL;
    }
    if (chain) {
        int same = b->n == ws->last_n;
        for (size_t i = 0; same && i < b->n; i++)
            same = b->seqs[i] == ws->last_seqs[i] && b->offsets[i + 1] == i + 1;
        if (!same) {
            snprintf(ws->err, sizeof(ws->err), "a chained step must repeat the last step's "
                     "sequences, every one of which picked, one token each");
            return MODEL_EINVAL;
        }
    }
    size_t need = 0;
    int rc = 0;
    for (size_t i = 0; i < b->n && !rc; i++) {
        int id = b->seqs[i];
        if (b->offsets[i + 1] <= b->offsets[i] || b->offsets[i + 1] > c->max_tokens) {
            snprintf(ws->err, sizeof(ws->err), "sequence %zu of the step: offsets %u..%u", i,
                     b->offsets[i], b->offsets[i + 1]);
            rc = MODEL_EINVAL;
        } else if (!kvcache_seq_live(ws->kv, id) || ws->mark[id]) {
            snprintf(ws->err, sizeof(ws->err), "cache sequence %d is not live or is twice in "
                     "the step", id);
            rc = MODEL_EINVAL;
        } else {
            ws->mark[id] = 1;
            size_t k = b->offsets[i + 1] - b->offsets[i];
            size_t nb = kvcache_blocks_needed(ws->kv, id, k);
            if (nb == SIZE_MAX) {
                snprintf(ws->err, sizeof(ws->err), "cache sequence %d: %zu + %zu tokens pass "
                         "the %zu a sequence may hold", id, kvcache_seq_len(ws->kv, id), k,
                         c->max_ctx);
                rc = MODEL_EINVAL;
            }
            need += nb == SIZE_MAX ? 0 : nb;
        }
    }
    for (size_t i = 0; i < b->n; i++)
        if (b->seqs[i] >= 0 && (size_t)b->seqs[i] < c->max_seqs) ws->mark[b->seqs[i]] = 0;
    if (rc) return rc;
    if (need > kvcache_free_blocks(ws->kv)) {
        snprintf(ws->err, sizeof(ws->err), "the step needs %zu cache blocks, %zu are free",
                 need, kvcache_free_blocks(ws->kv));
        return MODEL_EINVAL;
    }
    size_t T = b->offsets[b->n];
    for (size_t t = 0; !chain && t < T; t++)
        if (b->ids[t] < 0 || (size_t)b->ids[t] >= d->info.vocab) {
            snprintf(ws->err, sizeof(ws->err), "token id %d is outside the vocabulary of %zu",
                     (int)b->ids[t], d->info.vocab);
            return MODEL_EINVAL;
        }
    return 0;
}

/* Grows the batch's sequences in the cache's bookkeeping (their lengths
 * before, in old_len) and stages the token arrays and block tables in
 * host buffer h (a chained step's ids come from the device): ids [cap],
 * pos [cap], seq [cap], offsets [max_seqs + 1], tables [max_seqs, W].
 * Returns the most tokens one sequence adds. */
static size_t dec_stage(struct decoder_ws *ws, const struct decoder_batch *b, int chain,
                        uint32_t *h)
{
    size_t n = b->n, cap = ws->conf.max_tokens, W = ws->width, longest = 0;
    size_t off_at = 3 * cap, tab_at = off_at + ws->conf.max_seqs + 1;
    if (!chain) memcpy(h, b->ids, b->offsets[n] * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        ws->old_len[i] = kvcache_seq_len(ws->kv, b->seqs[i]);
        uint32_t k = b->offsets[i + 1] - b->offsets[i];
        kvcache_extend(ws->kv, b->seqs[i], k); /* checked by dec_check */
        for (uint32_t j = 0; j < k; j++) {
            h[cap + b->offsets[i] + j] = (uint32_t)(ws->old_len[i] + j);
            h[2 * cap + b->offsets[i] + j] = (uint32_t)i;
        }
        memcpy(h + tab_at + i * W, kvcache_table(ws->kv, b->seqs[i]), W * sizeof(uint32_t));
        if (k > longest) longest = k;
    }
    memcpy(h + off_at, b->offsets, (n + 1) * sizeof(uint32_t));
    return longest;
}

/* Begins the pass, uploads what dec_stage staged in h and runs the
 * architecture (or replays its recording): *out its logits on the
 * device. */
static int dec_forward(const struct decoder *d, struct decoder_ws *ws,
                       const struct decoder_batch *b, int chain, const uint32_t *h,
                       size_t longest, const void **out)
{
    const struct backend_ops *o = d->rt.ops;
    size_t n = b->n, T = b->offsets[n], cap = ws->conf.max_tokens, W = ws->width;
    size_t off_at = 3 * cap, tab_at = off_at + ws->conf.max_seqs + 1;
    uint32_t *dv = ws->d_tok;
    int rc = o->pass_begin(ws->ctx);
    for (size_t k = chain ? 1 : 0; k < 3 && rc == 0; k++)
        rc = o->upload(ws->ctx, dv + k * cap, h + k * cap, T * sizeof(uint32_t));
    if (rc == 0) rc = o->upload(ws->ctx, dv + off_at, h + off_at, (n + 1) * sizeof(uint32_t));
    if (rc == 0) rc = o->upload(ws->ctx, dv + tab_at, h + tab_at, n * W * sizeof(uint32_t));
    /* the leading sequences of one token (the engine packs them first),
     * which the backend's attention may answer apart from the chunks */
    size_t lone = 0;
    while (lone < n && b->offsets[lone + 1] == lone + 1) lone++;
    struct bk_seqs s = {.n = n, .tokens = T, .longest = longest, .lone = lone,
                        .offsets = dv + off_at, .seq = dv + 2 * cap, .pos = dv + cap,
                        .ids = (const int32_t *)dv};
    struct arch_dec_batch ab = {
        .s = &s,
        .kv = {.k = ws->k, .v = ws->v, .blocks = kvcache_total_blocks(ws->kv),
               .block_tokens = ws->conf.block_tokens, .kv_heads = d->info.kv_heads,
               .dh = d->info.head_dim, .tables = dv + tab_at, .table_w = W},
        .layer_bytes = ws->layer_bytes,
        .max_ctx = ws->conf.max_ctx,
        .all_logits = ws->conf.all_logits};
    /* A step of decode tokens alone (one a sequence) issues calls that
     * depend on n and the workspace only: the ids, positions and block
     * tables are device data staged above. Such a step may be recorded
     * and replayed (the backend's graphs); prefill runs eagerly. */
    int g = BK_GRAPH_RUN, graphed = rc == 0 && T == n && o->graph_begin;
    if (graphed) {
        uint32_t key[3] = {0x636564u /* "dec" */, (uint32_t)n, (uint32_t)ws->conf.all_logits};
        if ((g = o->graph_begin(ws->ctx, key, sizeof(key))) < 0) rc = g;
    }
    if (rc == 0 && g == BK_GRAPH_REPLAYED) {
        *out = ws->step_out;
        ws->count.graph_steps++;
    } else if (rc == 0) {
        rc = d->arch->step(&d->rt, d->am, ws->aws, ws->ctx, &ab, out);
        if (graphed) {
            int end = o->graph_end(ws->ctx);
            if (end < rc) rc = end;
        }
        ws->step_out = *out;
    }
    return rc;
}

/* The device's sampler picks from the logits at out (rows given; each
 * pick also goes to the device ids a chained step reads), or the logits
 * go to the host; f records the rows that pick. *all_on: every row does. */
static int dec_pick(const struct decoder *d, struct decoder_ws *ws, size_t n, size_t T,
                    const struct decoder_sample *rows, unsigned slot, const void *out,
                    struct dec_flight *f, int *all_on)
{
    const struct backend_ops *o = d->rt.ops;
    *all_on = rows != NULL;
    if (!rows)
        return o->store_f32(ws->ctx, ws->h_out, out,
                            (ws->conf.all_logits ? T : n) * d->info.vocab);
    struct bk_sample_row *sr = ws->h_srow[slot];
    for (size_t i = 0; i < n; i++) {
        sr[i] = (struct bk_sample_row){
            .temperature = rows[i].temperature, .top_k = rows[i].top_k, .top_p = rows[i].top_p,
            .min_p = rows[i].min_p, .u = rows[i].u,
            .flags = rows[i].on ? BK_SAMPLE_ON | (rows[i].logprob ? BK_SAMPLE_LOGPROB : 0) : 0};
        f->on[i] = rows[i].on != 0;
        *all_on &= rows[i].on != 0;
    }
    struct bk_sample sa = {.logits = out, .rows = n, .vocab = d->info.vocab,
                           .ld = d->info.vocab, .params = sr, .out = ws->h_sout[slot],
                           .scratch = ws->d_sscr, .ids = (int32_t *)ws->d_tok};
    return o->sample(ws->ctx, &sa);
}

/* Submits the step: the logits to the host (rows NULL), or the picks of
 * the device's sampler, which also leaves each pick where a chained
 * step reads its ids. With the backend's pass_submit the step stays in
 * flight; dec_collect waits for it. Host buffers alternate by the step's
 * number, so a step is staged while the one before it may still read its
 * own. */
static int dec_submit(const struct decoder *d, struct decoder_ws *ws,
                      const struct decoder_batch *b, const struct decoder_sample *rows, int chain)
{
    ws->err[0] = '\0';
    if (ws->n_flight == 2) {
        snprintf(ws->err, sizeof(ws->err), "two steps are in flight: collect one first");
        return MODEL_EINVAL;
    }
    int rc = dec_check(d, ws, b, chain);
    if (rc < 0) return rc;
    const struct backend_ops *o = d->rt.ops;
    unsigned slot = (unsigned)(ws->submitted % 2);
    size_t n = b->n, T = b->offsets[n];
    size_t longest = dec_stage(ws, b, chain, ws->h_tok[slot]);
    const void *out = NULL;
    struct dec_flight *f = &ws->flight[ws->n_flight];
    int all_on = 0;
    rc = dec_forward(d, ws, b, chain, ws->h_tok[slot], longest, &out);
    if (rc == 0) rc = dec_pick(d, ws, n, T, rows, slot, out, f, &all_on);
    int end = o->pass_submit ? o->pass_submit(ws->ctx) : o->pass_end(ws->ctx);
    if (end < rc) rc = end;
    ws->last_n = 0;
    if (rc < 0) {
        snprintf(ws->err, sizeof(ws->err), "%s", o->ctx_error(ws->ctx));
        for (size_t i = 0; i < n; i++) kvcache_truncate(ws->kv, b->seqs[i], ws->old_len[i]);
        return rc;
    }
    if (all_on) {
        memcpy(ws->last_seqs, b->seqs, n * sizeof(int));
        ws->last_n = n;
    }
    f->slot = slot;
    f->n = ws->conf.all_logits && !rows ? T : n;
    f->logits = rows == NULL;
    ws->n_flight++;
    ws->submitted++;
    return MODEL_OK;
}

/* Waits for the oldest step in flight: its picks (rows that picked) or
 * its logits. A failure here (the device failed) drops every step in
 * flight, their sequences keeping the lengths they gave them. */
static int dec_collect(const struct decoder *d, struct decoder_ws *ws, struct decoder_pick *picks,
                       const float **logits)
{
    const struct backend_ops *o = d->rt.ops;
    if (ws->n_flight == 0 || !ws->flight[0].logits != !logits) {
        snprintf(ws->err, sizeof(ws->err), "no step of that kind is in flight");
        return MODEL_EINVAL;
    }
    struct dec_flight f = ws->flight[0];
    ws->flight[0] = ws->flight[1];
    ws->flight[1] = f; /* keeps both rows' buffers */
    ws->n_flight--;
    int rc = o->pass_submit ? o->pass_wait(ws->ctx) : 0;
    if (rc < 0) {
        snprintf(ws->err, sizeof(ws->err), "%s", o->ctx_error(ws->ctx));
        for (; ws->n_flight; ws->n_flight--) (void)o->pass_wait(ws->ctx);
        ws->last_n = 0;
        return rc;
    }
    ws->count.steps++;
    if (logits) {
        *logits = ws->h_out;
        ws->count.logits_bytes += f.n * d->info.vocab * sizeof(float);
        return MODEL_OK;
    }
    const struct bk_sample_out *so = ws->h_sout[f.slot];
    for (size_t i = 0; i < f.n; i++)
        if (f.on[i]) {
            picks[i] = (struct decoder_pick){so[i].id, so[i].logprob};
            ws->count.device_picks++;
        }
    return MODEL_OK;
}

static int dec_idle(struct decoder_ws *ws)
{
    if (ws->n_flight == 0) return 0;
    snprintf(ws->err, sizeof(ws->err), "a step is in flight: collect it first");
    return MODEL_EINVAL;
}

int decoder_step(const struct decoder *d, struct decoder_ws *ws, const struct decoder_batch *b,
                 const float **logits)
{
    if (!d || !ws || ws->d != d || !logits) return MODEL_EINVAL;
    int rc = dec_idle(ws);
    if (rc == 0) rc = dec_submit(d, ws, b, NULL, 0);
    return rc < 0 ? rc : dec_collect(d, ws, NULL, logits);
}

static int dec_samples(struct decoder_ws *ws)
{
    if (ws->h_srow[0]) return 0;
    snprintf(ws->err, sizeof(ws->err), "this workspace's backend does not sample on the device");
    return MODEL_EINVAL;
}

int decoder_step_sample(const struct decoder *d, struct decoder_ws *ws,
                        const struct decoder_batch *b, const struct decoder_sample *rows,
                        struct decoder_pick *picks)
{
    if (!d || !ws || ws->d != d || !rows || !picks) return MODEL_EINVAL;
    int rc = dec_samples(ws);
    if (rc == 0) rc = dec_idle(ws);
    if (rc == 0) rc = dec_submit(d, ws, b, rows, 0);
    return rc < 0 ? rc : dec_collect(d, ws, picks, NULL);
}

int decoder_step_submit(const struct decoder *d, struct decoder_ws *ws,
                        const struct decoder_batch *b, const struct decoder_sample *rows,
                        int chain)
{
    if (!d || !ws || ws->d != d || !rows) return MODEL_EINVAL;
    int rc = dec_samples(ws);
    return rc < 0 ? rc : dec_submit(d, ws, b, rows, chain);
}

int decoder_step_collect(const struct decoder *d, struct decoder_ws *ws,
                         struct decoder_pick *picks)
{
    if (!d || !ws || ws->d != d || !picks) return MODEL_EINVAL;
    return dec_collect(d, ws, picks, NULL);
}

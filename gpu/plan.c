/* plan.c - host-side decisions of a GPU backend (plan.h).
 *
 * Threads: any; no state. */
#include "plan.h"

#include <stdio.h>
#include <string.h>

int plan_devices(const int *want, size_t n_want, int count, int *out, char *why,
                 size_t why_size)
{
    if (count <= 0) {
        snprintf(why, why_size, "no usable CUDA device");
        return -1;
    }
    if (n_want == 0) {
        int n = count < MODEL_MAX_DEVICES ? count : MODEL_MAX_DEVICES;
        for (int i = 0; i < n; i++) out[i] = i;
        return n;
    }
    if (n_want > MODEL_MAX_DEVICES) {
        snprintf(why, why_size, "gpu.devices: at most %d devices, got %zu", MODEL_MAX_DEVICES,
                 n_want);
        return -1;
    }
    for (size_t i = 0; i < n_want; i++) {
        if (want[i] < 0 || want[i] >= count) {
            snprintf(why, why_size, "gpu.devices: device %d does not exist (%d usable: 0..%d)",
                     want[i], count, count - 1);
            return -1;
        }
        for (size_t k = 0; k < i; k++)
            if (want[k] == want[i]) {
                snprintf(why, why_size, "gpu.devices: device %d is listed twice", want[i]);
                return -1;
            }
        out[i] = want[i];
    }
    return (int)n_want;
}

/* Round robin: executor slots 0, 1, 2, ... take devices 0, 1, ..., 0, ...
 * so each device gets the same number of executors, give or take one. */
size_t plan_slot_device(unsigned slot, size_t n_devices)
{
    return n_devices ? (size_t)slot % n_devices : 0;
}

size_t plan_elem_size(enum model_precision p)
{
    return p == MODEL_FP16 || p == MODEL_BF16 ? 2 : 4;
}

/* Raw element i of t as 16 bits, from its little-endian bytes (the data
 * may be unaligned). */
static uint16_t raw16(const struct st_tensor *t, size_t i)
{
    const unsigned char *p = t->data + 2 * i;
    return (uint16_t)(p[0] | p[1] << 8);
}

/* Element i of an F32 tensor, from its little-endian bytes. */
static float raw32f(const struct st_tensor *t, size_t i)
{
    const unsigned char *b = t->data + 4 * i;
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                 (uint32_t)b[3] << 24;
    float v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

int plan_convert_f32(const struct st_tensor *t, float *dst)
{
    return st_to_f32(t, dst);
}

int plan_convert(const struct st_tensor *t, enum model_precision p, void *dst)
{
    if (!st_dtype_loadable(t->dtype)) return -1;
    size_t n = (size_t)t->numel;
    if (p == MODEL_FP32 || p == MODEL_TF32) return st_to_f32(t, dst);
    uint16_t *h = dst;
    enum st_dtype same = p == MODEL_FP16 ? ST_F16 : ST_BF16;
    if (t->dtype == same) {
        for (size_t i = 0; i < n; i++) h[i] = raw16(t, i);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        float f = t->dtype == ST_F32   ? raw32f(t, i)
                  : t->dtype == ST_F16 ? st_f16_to_f32(raw16(t, i))
                                       : st_bf16_to_f32(raw16(t, i));
        h[i] = p == MODEL_FP16 ? st_f32_to_f16(f) : st_f32_to_bf16(f);
    }
    return 0;
}

uint64_t plan_key_hash(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* A linear scan: PLAN_SHAPE_SLOTS entries, once per pass. */
enum plan_shape_action plan_shape_use(struct plan_shapes *t, const void *key, size_t len,
                                      size_t *slot, int *evict)
{
    *evict = 0;
    *slot = PLAN_SHAPE_SLOTS;
    if (len == 0 || len > PLAN_KEY_MAX) return PLAN_SHAPE_EAGER;
    uint64_t h = plan_key_hash(key, len);
    t->tick++;
    size_t victim = 0;
    for (size_t i = 0; i < PLAN_SHAPE_SLOTS; i++) {
        if (t->slot[i].last && t->slot[i].hash == h && t->slot[i].len == len &&
            memcmp(t->slot[i].key, key, len) == 0) {
            t->slot[i].last = t->tick;
            t->slot[i].seen++;
            *slot = i;
            if (t->slot[i].graph) return PLAN_SHAPE_GRAPH;
            if (t->slot[i].refused) return PLAN_SHAPE_EAGER;
            return t->slot[i].seen >= 2 ? PLAN_SHAPE_CAPTURE : PLAN_SHAPE_EAGER;
        }
        if (t->slot[i].last < t->slot[victim].last) victim = i; /* free (0) or older */
    }
    *evict = t->slot[victim].graph;
    memcpy(t->slot[victim].key, key, len);
    t->slot[victim].len = len;
    t->slot[victim].hash = h;
    t->slot[victim].last = t->tick;
    t->slot[victim].seen = 1;
    t->slot[victim].graph = 0;
    t->slot[victim].refused = 0;
    *slot = victim;
    return PLAN_SHAPE_EAGER;
}

void plan_shape_refuse(struct plan_shapes *t, size_t slot)
{
    if (slot >= PLAN_SHAPE_SLOTS) return;
    t->slot[slot].refused = 1;
    t->slot[slot].graph = 0;
}

void plan_paged_attention(size_t tokens, size_t heads, size_t tile, size_t span,
                          size_t max_ctx, int scratch, size_t seqs, size_t lone,
                          struct plan_paged *p)
{
    if (lone > tokens) lone = tokens;
    size_t chunk = (max_ctx + PLAN_SPLIT_MAX - 1) / PLAN_SPLIT_MAX;
    chunk = chunk < PLAN_SPLIT_CHUNK ? PLAN_SPLIT_CHUNK : (chunk + span - 1) / span * span;
    size_t parts = (max_ctx + chunk - 1) / chunk, rows = tokens * heads, rest = tokens - lone;
    int split = scratch && rows <= PLAN_SPLIT_ROWS && parts > 1;
    int whole = !split && tokens >= 2 * tile && (seqs == 0 || tokens >= seqs * tile);
    int apart = !split && lone && tile > 1 && rest >= 2 * tile &&
                (seqs == 0 || rest >= (seqs - lone) * tile);
    *p = (struct plan_paged){.one_rows = rows, .parts = split ? parts : 1, .chunk = chunk,
                             .skip = tokens};
    if (apart) {
        /* the lone rows, split when they are few enough */
        p->one_rows = lone * heads;
        p->parts = scratch && p->one_rows <= PLAN_SPLIT_ROWS && parts > 1 ? parts : 1;
        p->skip = lone;
    } else if (whole) {
        p->one_rows = 0;
        p->skip = 0;
    }
}

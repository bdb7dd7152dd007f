/* plan.h - the host-side decisions of a GPU backend, in plain C so they
 * are tested on any machine: which devices gpu.devices names, which device an executor's workspace lives on, and each weight's
 * bytes in the chosen precision (F16/BF16 weights are taken as they are
 * when the precision matches, never round-tripped through float32), and
 * which pass keys keep a captured graph.
 *
 * Threads: any; no state but a struct plan_shapes, which is one
 * context's. */
#ifndef KINFER_PLAN_H
#define KINFER_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "safetensors.h"


/* The devices to use: want (n_want of them; 0 = every one of the count
 * the machine has), checked for range and repeats, into out in the order
 * given. Returns how many, or -1 with why filled ("gpu.devices: device 3
 * does not exist (2 usable: 0..1)"). */
int plan_devices(const int *want, size_t n_want, int count, int *out, char *why,
                 size_t why_size);

/* The device index (into the plan_devices list) of executor slot. */
size_t plan_slot_device(unsigned slot, size_t n_devices);

/* Bytes per element of weights and activations in precision p: 4 for
 * fp32 and tf32, 2 for fp16 and bf16. */
size_t plan_elem_size(enum model_precision p);

/* Writes t's numel elements into dst (numel * plan_elem_size(p) bytes,
 * native byte order) in p's format: float32 for fp32/tf32, IEEE half for
 * fp16, bfloat16 for bf16. A tensor already in that format is copied bit
 * for bit; others are widened exactly and then rounded to nearest even.
 * Returns 0, or -1 when t's dtype is not loadable. */
int plan_convert(const struct st_tensor *t, enum model_precision p, void *dst);

/* Writes t as float32 (layernorm's parameters stay float32 in every
 * precision). Returns 0, or -1 when t's dtype is not loadable. */
int plan_convert_f32(const struct st_tensor *t, float *dst);

/* ---- graphs ----------------------------------------------------------- */

/* A pass's shape key is opaque bytes from the caller (backend.h's
 * graph_begin): every host value its calls depend on (sizes, the padded
 * length attention runs at, which buffers it uses). Keys of up to
 * PLAN_KEY_MAX bytes are remembered. */
#define PLAN_KEY_MAX 64
#define PLAN_SHAPE_SLOTS 32 /* keys (and graphs) one context remembers */

/* The keys one context has seen lately, and which of them have a graph.
 * Zero it to start. */
struct plan_shapes {
    struct {
        unsigned char key[PLAN_KEY_MAX];
        size_t len;
        uint64_t hash;      /* plan_key_hash of key */
        uint64_t last;      /* tick of its last use; 0 = a free slot */
        unsigned seen;      /* passes of this key since it took the slot */
        int graph;          /* the caller holds a graph for this slot */
        int refused;        /* its capture failed: it runs eagerly from now on */
    } slot[PLAN_SHAPE_SLOTS];
    uint64_t tick;
};

/* What to do with a pass of a key. */
enum plan_shape_action {
    PLAN_SHAPE_EAGER = 0, /* run its calls one by one */
    PLAN_SHAPE_CAPTURE,   /* capture them into slot's graph, then launch it */
    PLAN_SHAPE_GRAPH,     /* launch slot's graph */
};

/* FNV-1a of len bytes at key: the slots are compared by hash, then by
 * bytes. */
uint64_t plan_key_hash(const void *key, size_t len);

/* A pass of key (len bytes, 1..PLAN_KEY_MAX): a key with a graph replays
 * it; one seen for the second time while it holds its slot is captured (a
 * key seen once may never come back, and capturing costs more than a
 * run), unless its capture failed before; others run eagerly. A new key
 * takes a free slot, else the least recently used one: *evict is then set
 * when that slot's graph must be destroyed first. *slot gets the slot.
 * After a successful capture the caller sets t->slot[*slot].graph = 1,
 * after a failed one calls plan_shape_refuse. A len of 0 or over
 * PLAN_KEY_MAX runs eagerly and takes no slot (*slot = PLAN_SHAPE_SLOTS). */
enum plan_shape_action plan_shape_use(struct plan_shapes *t, const void *key, size_t len,
                                      size_t *slot, int *evict);

/* The capture of slot's key failed: it is not tried again while the key
 * keeps its slot. */
void plan_shape_refuse(struct plan_shapes *t, size_t slot);

/* How the CUDA backend's paged attention (gpu/cuda_kernels.cu) takes a
 * step of tokens new tokens, heads query heads each, over contexts of at
 * most max_ctx positions, its first lone tokens each a sequence of its
 * own (bk_seqs.lone), in seqs sequences (0: not known). Two kernels: the
 * one-row walk (a block per (token, head) row, or per part of its
 * context: the flash-decoding split, which needs scratch and only pays
 * for at most PLAN_SPLIT_ROWS rows), and the tiled prefill kernel, whose
 * blocks take `tile` consecutive tokens (1 when the query heads of a
 * cache head fill a block) and walk their sequences one after another.
 * The tiled kernel takes a step of at least two tiles of tokens and a
 * tile's worth a sequence on average; a step whose lone tokens lead it
 * is judged on the tokens after them, the lone ones then walked apart
 * (so that no block walks a tile of decode contexts while the step waits
 * for it), unless a tile is one token. Sizes alone decide, so a recorded
 * decode step replays the same launches. Parts are of at least
 * PLAN_SPLIT_CHUNK positions, whole multiples of span (the one-row
 * kernel's positions a step), at most PLAN_SPLIT_MAX of them. */
#define PLAN_SPLIT_ROWS 256
#define PLAN_SPLIT_MAX 32
#define PLAN_SPLIT_CHUNK 256
struct plan_paged {
    size_t one_rows;   /* rows of tokens 0 .. one_rows / heads - 1 the one-row walk takes */
    size_t parts;      /* 1, or the parts each of those rows' contexts is split into */
    size_t chunk;      /* positions a part */
    size_t skip;       /* the tiled kernel takes tokens skip .. tokens - 1 (none: tokens) */
};
void plan_paged_attention(size_t tokens, size_t heads, size_t tile, size_t span,
                          size_t max_ctx, int scratch, size_t seqs, size_t lone,
                          struct plan_paged *p);

#endif

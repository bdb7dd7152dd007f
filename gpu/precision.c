/* precision.c - gpu.precision "auto" (model.h, model_weights_precision):
 * the number format the configured models' weights ship in, read from
 * their safetensors headers before the runtime opens, so a BF16 or F16
 * checkpoint runs on the GPU in its own format without a setting.
 *
 * Only headers are read (st_open maps a file and validates its header;
 * no tensor's bytes are touched). Nothing here fails: a model whose
 * weights cannot be read counts as float32, and loading it later says
 * what is wrong with its own message.
 *
 * Threads: the main thread at startup. Ownership: borrows the specs;
 * every file is closed before a call returns. The CUDA backend asks
 * model_precision_on_device what each device runs. */
#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"

/* More distinct shard files than this in one index: not a checkpoint this
 * looks into (float32 then; the loader has its own limit and message). */
#define PREC_MAX_SHARDS 1024

/* The floating dtypes a model's weights may mainly be, by bytes. */
enum { PREC_F32 = 0, PREC_F16, PREC_BF16, PREC_N };
static const char *const prec_dt_names[PREC_N] = {"F32", "F16", "BF16"};

/* Adds the bytes of path's F32, F16 and BF16 tensors to sums. Returns 0,
 * or -1 with why filled. */
static int prec_file(const char *path, uint64_t sums[PREC_N], char *why, size_t why_size)
{
    struct st_file *f = st_open(path, why, why_size);
    if (!f) return -1;
    for (size_t i = 0; i < st_count(f); i++) {
        const struct st_tensor *t = st_tensor_at(f, i);
        if (t->dtype == ST_F32) sums[PREC_F32] += t->nbytes;
        else if (t->dtype == ST_F16) sums[PREC_F16] += t->nbytes;
        else if (t->dtype == ST_BF16) sums[PREC_BF16] += t->nbytes;
    }
    st_close(f);
    return 0;
}

/* The shards model.safetensors.index.json names (as the decoder loader
 * finds them: plain file names in the folder, each counted once). */
static int prec_index(const char *dir, uint64_t sums[PREC_N], char *why, size_t why_size)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    json_error_t je;
    json_t *idx = json_load_file(path, 0, &je);
    if (!idx) {
        snprintf(why, why_size, "no model.safetensors, and no readable "
                 "model.safetensors.index.json (%s)", je.text);
        return -1;
    }
    const json_t *map = json_object_get(idx, "weight_map");
    const char *seen[PREC_MAX_SHARDS];
    size_t n = 0;
    int rc = 0;
    if (!json_is_object(map) || !json_object_size(map)) {
        snprintf(why, why_size, "model.safetensors.index.json: no weight_map");
        json_decref(idx);
        return -1;
    }
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)map, key, val) {
        const char *f = json_string_value(val);
        if (!f || !*f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, ".")) {
            snprintf(why, why_size, "model.safetensors.index.json: weight_map[\"%.200s\"] is "
                     "not a file name", key);
            rc = -1;
            break;
        }
        size_t k = 0;
        while (k < n && strcmp(seen[k], f)) k++;
        if (k < n) continue;
        if (n == PREC_MAX_SHARDS) {
            snprintf(why, why_size, "more than %d shards", PREC_MAX_SHARDS);
            rc = -1;
            break;
        }
        seen[n++] = f;
        char sp[4200];
        if (snprintf(sp, sizeof(sp), "%s/%s", dir, f) >= (int)sizeof(sp)) {
            snprintf(why, why_size, "a shard's path is longer than %zu bytes", sizeof(sp) - 1);
            rc = -1;
            break;
        }
        if ((rc = prec_file(sp, sums, why, why_size)) < 0) break;
    }
    json_decref(idx);
    return rc;
}

/* The main floating dtype (PREC_*) of spec's weights: the one holding the
 * most bytes, float32 winning a tie. Returns it, or -1 with why filled
 * when the model is not a folder this reads (a layer list over a file) or
 * its weights cannot be read or hold no floats. */
static int prec_model(const struct model_spec *spec, char *why, size_t why_size)
{
    struct stat st;
    if (spec->n_layers > 0 || (stat(spec->path, &st) == 0 && !S_ISDIR(st.st_mode))) {
        snprintf(why, why_size, "model %.128s names a safetensors file (a layer list, run "
                 "in fp32), not a folder", spec->name);
        return -1;
    }
    if (stat(spec->path, &st) != 0) {
        snprintf(why, why_size, "model %.128s: %.200s: %s", spec->name, spec->path,
                 strerror(errno));
        return -1;
    }
    uint64_t sums[PREC_N] = {0};
    char path[4200], err[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", spec->path);
    int rc = stat(path, &st) == 0 ? prec_file(path, sums, err, sizeof(err))
                                  : prec_index(spec->path, sums, err, sizeof(err));
    if (rc < 0) {
        snprintf(why, why_size, "model %.128s: its weights cannot be read (%s)", spec->name,
                 err);
        return -1;
    }
    int best = PREC_F32;
    for (int d = PREC_F16; d < PREC_N; d++)
        if (sums[d] > sums[best]) best = d;
    if (!sums[best]) {
        snprintf(why, why_size, "model %.128s has no F32, F16 or BF16 tensors", spec->name);
        return -1;
    }
    return best;
}

enum model_precision model_weights_precision(const struct model_spec *specs, size_t n,
                                             char *why, size_t why_size)
{
    char w[1024] = "";
    if (!n) {
        snprintf(why, why_size, "no models to read");
        return MODEL_FP32;
    }
    int first = -1;
    size_t first_i = 0;
    for (size_t i = 0; i < n; i++) {
        int d = prec_model(&specs[i], w, sizeof(w));
        if (d < 0) {
            snprintf(why, why_size, "%s", w);
            return MODEL_FP32;
        }
        if (d == PREC_F32) {
            snprintf(why, why_size, "model %.128s's weights are mainly F32", specs[i].name);
            return MODEL_FP32;
        }
        if (first < 0) {
            first = d;
            first_i = i;
        } else if (d != first) {
            snprintf(why, why_size, "models %.128s (%s) and %.128s (%s) differ",
                     specs[first_i].name, prec_dt_names[first], specs[i].name,
                     prec_dt_names[d]);
            return MODEL_FP32;
        }
    }
    snprintf(why, why_size, "the model%s weights are %s", n == 1 ? "'s" : "s'",
             prec_dt_names[first]);
    return first == PREC_BF16 ? MODEL_BF16 : MODEL_FP16;
}

/* tf32 and bf16 need the tensor cores of compute capability 8.0. */
int model_precision_on_device(enum model_precision p, int precision_auto, int major)
{
    if ((p != MODEL_BF16 && p != MODEL_TF32) || major >= 8) return (int)p;
    return precision_auto && p == MODEL_BF16 ? (int)MODEL_FP32 : -1;
}

/* test_precision.c - gpu.precision "auto" (model_weights_precision): the
 * precision read from the models' safetensors headers, on folders the
 * project's own writers make (the demo decoder in F32 and BF16, F16 and
 * mixed files by st_write, a sharded checkpoint with its index), and the
 * runtime that carries it: the CPU backend ignores it; a CUDA backend,
 * where one is usable (a GPU, or the emulated device's build of this
 * program), runs in the resolved precision and says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "../gpu/decoder.h"
#include "../gpu/model.h"
#include "../gpu/safetensors.h"
#include "testutil.h"

static char root[256];
static uint64_t seed;

/* root/name, made if missing. */
static const char *dir_of(const char *name)
{
    static char buf[8][512];
    static unsigned k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", root, name);
    mkdir(p, 0755);
    return p;
}

static struct model_spec spec_of(const char *name, const char *path)
{
    struct model_spec s;
    memset(&s, 0, sizeof(s));
    snprintf(s.name, sizeof(s.name), "%s", name);
    snprintf(s.path, sizeof(s.path), "%s", path);
    model_encoder_spec_defaults(&s.enc);
    return s;
}

/* A small demo decoder folder, its weights BF16 or F32. */
static const char *demo_decoder(const char *name, int bf16)
{
    const char *d = dir_of(name);
    struct decoder_demo_conf c = {.layers = 1, .hidden = 16, .heads = 2, .kv_heads = 1,
                                  .inter = 32, .bf16 = bf16, .seed = seed};
    char err[512];
    if (decoder_write_demo_ex(d, &c, err, sizeof(err)) < 0) fail_msg("demo decoder: %s", err);
    return d;
}

/* One tensor of n elements of dt (zero bytes: only the header matters). */
struct tdesc {
    const char *name;
    enum st_dtype dt;
    uint64_t n;
};

/* Writes the tensors as dir/file. */
static void write_st(const char *dir, const char *file, const struct tdesc *t, size_t n)
{
    struct st_write_tensor w[8];
    uint64_t shapes[8];
    void *data[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        shapes[i] = t[i].n;
        data[i] = calloc(t[i].n ? t[i].n : 1, st_dtype_size(t[i].dt));
        assert_non_null(data[i]);
        w[i] = (struct st_write_tensor){t[i].name, t[i].dt, 1, &shapes[i], data[i]};
    }
    char path[600], err[512];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    if (st_write(path, w, n, err, sizeof(err)) < 0) fail_msg("st_write: %s", err);
    for (size_t i = 0; i < n; i++) free(data[i]);
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Resolves specs; checks the precision and that why holds want. */
static void expect(const struct model_spec *specs, size_t n, enum model_precision prec,
                   const char *want)
{
    char why[512] = "";
    enum model_precision got = model_weights_precision(specs, n, why, sizeof(why));
    printf("  %zu model(s) from %s: %s (%s)\n", n, n ? specs[0].name : "-",
           model_precision_name(got), why);
    if (got != prec)
        fail_msg("precision %s, expected %s (%s)", model_precision_name(got),
                 model_precision_name(prec), why);
    if (!strstr(why, want)) fail_msg("reason \"%s\" lacks \"%s\"", why, want);
}

static void test_demo_decoders(void **state)
{
    (void)state;
    struct model_spec bf = spec_of("llm-bf16", demo_decoder("dec_bf16", 1));
    struct model_spec f32 = spec_of("llm-f32", demo_decoder("dec_f32", 0));
    expect(&bf, 1, MODEL_BF16, "the model's weights are BF16");
    expect(&f32, 1, MODEL_FP32, "model llm-f32's weights are mainly F32");
    struct model_spec both[2] = {bf, f32};
    expect(both, 2, MODEL_FP32, "llm-f32's weights are mainly F32");
    struct model_spec two_bf[2] = {bf, bf};
    snprintf(two_bf[1].name, sizeof(two_bf[1].name), "llm-bf16-b");
    expect(two_bf, 2, MODEL_BF16, "the models' weights are BF16");
}

/* A model's dtype is the one holding the most bytes: a BF16 or F16
 * checkpoint keeps float32 norms, and integer tensors never count. */
static void test_bytes_decide(void **state)
{
    (void)state;
    const char *f16 = dir_of("f16");
    const struct tdesc t16[] = {{"w", ST_F16, 4096}, {"norm", ST_F32, 64}, {"ids", ST_I64, 100000}};
    write_st(f16, "model.safetensors", t16, 3);
    struct model_spec s16 = spec_of("enc-f16", f16);
    expect(&s16, 1, MODEL_FP16, "the model's weights are F16");

    const char *mostly32 = dir_of("mostly_f32");
    const struct tdesc t32[] = {{"a", ST_BF16, 1000}, {"b", ST_F32, 600}};
    write_st(mostly32, "model.safetensors", t32, 2); /* 2000 bytes BF16, 2400 F32 */
    struct model_spec s32 = spec_of("mixed", mostly32);
    expect(&s32, 1, MODEL_FP32, "model mixed's weights are mainly F32");

    const char *ints = dir_of("ints");
    const struct tdesc ti[] = {{"q", ST_I8, 4096}, {"s", ST_U8, 16}};
    write_st(ints, "model.safetensors", ti, 2);
    struct model_spec si = spec_of("quantized", ints);
    expect(&si, 1, MODEL_FP32, "model quantized has no F32, F16 or BF16 tensors");

    struct model_spec bf = spec_of("llm-bf16", demo_decoder("dec_bf16_2", 1));
    struct model_spec mix[2] = {bf, s16};
    expect(mix, 2, MODEL_FP32, "models llm-bf16 (BF16) and enc-f16 (F16) differ");
}

/* model.safetensors.index.json's shards, each file counted once. */
static void test_shards(void **state)
{
    (void)state;
    const char *d = dir_of("sharded");
    const struct tdesc s1[] = {{"a", ST_BF16, 3000}, {"n1", ST_F32, 100}};
    const struct tdesc s2[] = {{"b", ST_F32, 2000}, {"c", ST_BF16, 3000}};
    write_st(d, "model-00001-of-00002.safetensors", s1, 2);
    write_st(d, "model-00002-of-00002.safetensors", s2, 2);
    write_text(d, "model.safetensors.index.json",
               "{\"metadata\": {}, \"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
               " \"n1\": \"model-00001-of-00002.safetensors\","
               " \"b\": \"model-00002-of-00002.safetensors\","
               " \"c\": \"model-00002-of-00002.safetensors\"}}");
    /* 12000 bytes BF16 against 8400 F32; the second shard alone is F32 */
    struct model_spec s = spec_of("sharded", d);
    expect(&s, 1, MODEL_BF16, "the model's weights are BF16");

    const char *bad = dir_of("sharded_missing");
    write_text(bad, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\"}}");
    struct model_spec sb = spec_of("half-copied", bad);
    expect(&sb, 1, MODEL_FP32, "model half-copied: its weights cannot be read");

    const char *up = dir_of("sharded_escape");
    write_text(up, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../x\"}}");
    struct model_spec su = spec_of("escape", up);
    expect(&su, 1, MODEL_FP32, "is not a file name");
}

/* What is not a readable folder runs in fp32, and resolving never fails. */
static void test_fp32_cases(void **state)
{
    (void)state;
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/no_such_folder", root);
    struct model_spec m = spec_of("gone", missing);
    expect(&m, 1, MODEL_FP32, "model gone: ");
    expect(&m, 1, MODEL_FP32, "no_such_folder: No such file or directory");

    struct model_spec empty = spec_of("empty", dir_of("empty"));
    expect(&empty, 1, MODEL_FP32, "model empty: its weights cannot be read (no model.safetensors");

    /* a layer list over a file: fp32 whatever its file holds */
    const char *d = dir_of("mlp");
    const struct tdesc tm[] = {{"0.weight", ST_BF16, 64}};
    write_st(d, "mlp.safetensors", tm, 1);
    char file[600];
    snprintf(file, sizeof(file), "%s/mlp.safetensors", d);
    struct model_layer_spec layer = {.op = MODEL_OP_DENSE, .weight = "0.weight"};
    struct model_spec mlp = spec_of("mlp", file);
    mlp.layers = &layer;
    mlp.n_layers = 1;
    expect(&mlp, 1, MODEL_FP32, "model mlp names a safetensors file");
    struct model_spec bare = spec_of("bare-file", file);
    expect(&bare, 1, MODEL_FP32, "model bare-file names a safetensors file");

    /* a truncated header */
    const char *tr = dir_of("truncated");
    char path[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", tr);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite("\x10\0\0\0\0\0\0\0{\"a\":", 1, 13, f), 13); /* 16 header bytes said, 5 there */
    fclose(f);
    struct model_spec st = spec_of("truncated", tr);
    expect(&st, 1, MODEL_FP32, "model truncated: its weights cannot be read");

    /* the first model that is not BF16 decides, even after BF16 ones */
    struct model_spec bf = spec_of("llm-bf16", demo_decoder("dec_bf16_3", 1));
    struct model_spec list[2] = {bf, m};
    expect(list, 2, MODEL_FP32, "model gone: ");
    expect(NULL, 0, MODEL_FP32, "no models");
}

/* What a device runs: "auto"'s bf16 falls back to fp32 before compute
 * capability 8.0; an explicit tf32 or bf16 is refused there. */
static void test_on_device(void **state)
{
    (void)state;
    assert_int_equal(model_precision_on_device(MODEL_BF16, 1, 7), MODEL_FP32);
    assert_int_equal(model_precision_on_device(MODEL_BF16, 0, 7), -1);
    assert_int_equal(model_precision_on_device(MODEL_TF32, 0, 7), -1);
    assert_int_equal(model_precision_on_device(MODEL_TF32, 1, 7), -1);
    assert_int_equal(model_precision_on_device(MODEL_FP16, 1, 7), MODEL_FP16);
    assert_int_equal(model_precision_on_device(MODEL_FP16, 0, 7), MODEL_FP16);
    assert_int_equal(model_precision_on_device(MODEL_FP32, 1, 7), MODEL_FP32);
    for (int p = 0; p < MODEL_N_PRECISIONS; p++)
        for (int a = 0; a < 2; a++) {
            assert_int_equal(model_precision_on_device((enum model_precision)p, a, 8), p);
            assert_int_equal(model_precision_on_device((enum model_precision)p, a, 9), p);
        }
}

/* The runtime: the CPU backend ignores "auto" (its precision is
 * worker.cpu_precision's); a CUDA backend runs what the weights are. */
static void test_runtime(void **state)
{
    (void)state;
    struct model_spec bf = spec_of("llm-bf16", demo_decoder("dec_bf16_4", 1));
    struct model_spec f32 = spec_of("llm-f32", demo_decoder("dec_f32_4", 0));
    struct model_runtime_conf rc;
    model_runtime_conf_defaults(&rc);
    assert_int_equal(rc.precision_auto, 0);
    rc.backend = "cpu";
    rc.precision_auto = 1;
    rc.specs = &bf;
    rc.n_specs = 1;
    char err[512];
    struct model_runtime *rt = model_runtime_new(&rc, err, sizeof(err));
    if (!rt) fail_msg("cpu runtime: %s", err);
    assert_string_equal(model_runtime_precision(rt), "fp32");
    assert_null(strstr(model_runtime_describe(rt), "auto: the model"));
    model_runtime_destroy(rt);

    rc.backend = "cuda";
    rt = model_runtime_new(&rc, err, sizeof(err));
    if (!rt) {
        printf("  no CUDA backend here (%s): its part skipped\n", err);
        if (getenv("KINFER_REQUIRE_GPU") && strcmp(getenv("KINFER_REQUIRE_GPU"), "1") == 0)
            fail_msg("KINFER_REQUIRE_GPU=1 and no CUDA backend: %s", err);
        return;
    }
    printf("  %s\n", model_runtime_describe(rt));
    assert_string_equal(model_runtime_precision(rt), "bf16");
    assert_non_null(strstr(model_runtime_describe(rt),
                           "precision bf16 (auto: the model's weights are BF16)"));
    char lerr[512];
    struct decoder *d = decoder_load(rt, &bf, lerr, sizeof(lerr));
    if (!d) fail_msg("decoder_load on bf16: %s", lerr);
    decoder_destroy(d);
    model_runtime_destroy(rt);

    struct model_spec both[2] = {bf, f32};
    rc.specs = both;
    rc.n_specs = 2;
    rt = model_runtime_new(&rc, err, sizeof(err));
    if (!rt) fail_msg("cuda runtime: %s", err);
    assert_string_equal(model_runtime_precision(rt), "fp32");
    assert_non_null(strstr(model_runtime_describe(rt),
                           "precision fp32 (auto: model llm-f32's weights are mainly F32)"));
    model_runtime_destroy(rt);

    /* an explicit precision is taken as given, without a reason */
    rc.precision_auto = 0;
    rc.precision = MODEL_FP16;
    rt = model_runtime_new(&rc, err, sizeof(err));
    if (!rt) fail_msg("cuda runtime: %s", err);
    assert_string_equal(model_runtime_precision(rt), "fp16");
    assert_null(strstr(model_runtime_describe(rt), "auto:"));
    model_runtime_destroy(rt);
}

static int setup(void **state)
{
    (void)state;
    seed = tu_seed("test_precision");
    snprintf(root, sizeof(root), "/tmp/kinfer_prec_XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_decoders),
        cmocka_unit_test(test_bytes_decide),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_fp32_cases),
        cmocka_unit_test(test_on_device),
        cmocka_unit_test(test_runtime),
    };
    return cmocka_run_group_tests_name("precision", tests, setup, teardown);
}

/* test_safetensors.c - gpu/safetensors: st_write/st_open round trips,
 * every malformed-file rule (as a table of hand-written headers), and the
 * F16/BF16 conversions against known bit patterns, exhaustively over all
 * halves, and against the compiler's _Float16 where it has one.
 *
 * Single-threaded; files live in a fresh temporary directory that the
 * group teardown removes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gpu/safetensors.h"
#include "testutil.h"

struct fixture {
    char dir[64];
    char path[128];
};

/* One temp dir per run so parallel runs never collide. */
static int group_setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    if (!fx) return -1;
    snprintf(fx->dir, sizeof(fx->dir), "/tmp/kinfer_st_XXXXXX");
    if (!mkdtemp(fx->dir)) return -1;
    snprintf(fx->path, sizeof(fx->path), "%s/t.safetensors", fx->dir);
    *state = fx;
    return 0;
}

/* Removes what group_setup made. */
static int group_teardown(void **state)
{
    struct fixture *fx = *state;
    unlink(fx->path);
    rmdir(fx->dir);
    free(fx);
    return 0;
}

/* Writes a file by hand: the 8-byte length (hlen, normally strlen(hdr)),
 * the header text and dsize bytes of data (a counting pattern). */
static void write_raw(const char *path, uint64_t hlen, const char *hdr, size_t dsize)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(hlen >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, fp), 8);
    size_t n = strlen(hdr);
    assert_int_equal(fwrite(hdr, 1, n, fp), n);
    for (size_t i = 0; i < dsize; i++) fputc((int)(i & 0xff), fp);
    assert_int_equal(fclose(fp), 0);
}

/* Opens path expecting failure, and an error containing want. */
static void expect_open_error(const char *path, const char *want)
{
    char err[512] = "";
    struct st_file *f = st_open(path, err, sizeof(err));
    if (f || !strstr(err, want)) {
        print_error("want error containing '%s', got %s '%s'\n", want,
                    f ? "success" : "error", err);
        st_close(f);
        fail();
    }
}

/* Malformed headers: each row is one broken rule. */
static const struct bad_case {
    const char *what;
    const char *hdr;
    size_t dsize;
    const char *want;
} bad_cases[] = {
    {"bad JSON", "{\"a\": ", 0, "header is not valid JSON"},
    {"trailing garbage", "{} x", 0, "header is not valid JSON"},
    {"not an object", "[1,2]", 0, "header is not a JSON object"},
    {"scalar header", "\"str\"", 0, "header is not valid JSON"},
    {"duplicate name",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
     "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "duplicate"},
    {"entry not object", "{\"a\":5}", 0, "tensor \"a\": entry is not a JSON object"},
    {"missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "tensor \"a\": missing \"dtype\""},
    {"dtype not string", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "tensor \"a\": \"dtype\" is not a string"},
    {"unknown dtype", "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "tensor \"w\": unknown dtype \"F33\""},
    {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
     "tensor \"a\": missing \"shape\""},
    {"shape not array", "{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", 12,
     "tensor \"a\": \"shape\" is not an array"},
    {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
     "tensor \"a\": shape[0] is not a non-negative integer"},
    {"real dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}", 8,
     "tensor \"a\": shape[1] is not a non-negative integer"},
    {"string dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
     "tensor \"a\": shape[0] is not a non-negative integer"},
    {"too many dims",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
     "\"data_offsets\":[0,1]}}", 1, "tensor \"a\": 17 dims"},
    {"element count overflow",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
     "tensor \"a\": shape [4294967296,4294967296] overflows"},
    {"byte count overflow",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952,2],\"data_offsets\":[0,0]}}", 0,
     "tensor \"a\": shape [2305843009213693952,2] overflows"},
    {"missing offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
     "tensor \"a\": missing \"data_offsets\""},
    {"one offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
     "tensor \"a\": \"data_offsets\" is not [begin, end]"},
    {"negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
     "tensor \"a\": \"data_offsets\" is not [begin, end]"},
    {"end before begin", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
     "tensor \"a\": data_offsets [8,4] end before begin"},
    {"offsets past data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8,
     "tensor \"a\": data_offsets [4,12] run past the 8-byte data region"},
    {"begin past data", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[9,9]}}", 8,
     "tensor \"a\": data_offsets [9,9] run past"},
    {"size vs shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16,
     "tensor \"a\": data_offsets [0,12] hold 12 bytes, shape [2,2] F32 needs 16"},
    {"size vs dtype", "{\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
     "tensor \"a\": data_offsets [0,16] hold 16 bytes, shape [4] F16 needs 8"},
    {"unknown field",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
     "tensor \"a\": unknown field \"x\""},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
     "tensor \"b\" overlaps tensor \"a\""},
    {"same range",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlaps"},
    {"nested overlap",
     "{\"big\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
     "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
     "\"y\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]}}", 16, "overlaps"},
    {"metadata not object", "{\"__metadata__\":[1]}", 0, "\"__metadata__\" is not a JSON object"},
    {"metadata value", "{\"__metadata__\":{\"k\":1}}", 0, "\"__metadata__\".\"k\" is not a string"},
};

/* Runs bad_cases: each must fail to open with its message. */
static void test_bad_headers(void **state)
{
    struct fixture *fx = *state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const struct bad_case *c = &bad_cases[i];
        print_message("case: %s\n", c->what);
        write_raw(fx->path, strlen(c->hdr), c->hdr, c->dsize);
        expect_open_error(fx->path, c->want);
    }
}

/* The length prefix itself: too short a file, N beyond the file, N beyond
 * the 100 MB cap (a sparse file, so no 100 MB is written). */
static void test_bad_length(void **state)
{
    struct fixture *fx = *state;
    FILE *fp = fopen(fx->path, "wb");
    assert_non_null(fp);
    fclose(fp);
    expect_open_error(fx->path, "file is 0 bytes, too short");

    fp = fopen(fx->path, "wb");
    assert_non_null(fp);
    fwrite("\x02\0\0\0\0\0\0", 1, 7, fp);
    fclose(fp);
    expect_open_error(fx->path, "file is 7 bytes, too short");

    write_raw(fx->path, 1000, "{}", 10);
    expect_open_error(fx->path, "header length 1000 exceeds the 12 bytes after it");

    write_raw(fx->path, UINT64_MAX, "{}", 0);
    expect_open_error(fx->path, "header length 18446744073709551615 exceeds");

    uint64_t big = ST_MAX_HEADER + 1;
    write_raw(fx->path, big, "{}", 0);
    assert_int_equal(truncate(fx->path, (off_t)(big + 8)), 0);
    expect_open_error(fx->path, "exceeds the 100000000-byte limit");

    char missing[160];
    snprintf(missing, sizeof(missing), "%s/nope.safetensors", fx->dir);
    expect_open_error(missing, "No such file");
    expect_open_error(fx->dir, "not a regular file");
}

/* Valid but unusual layouts: gaps, unaligned F32 data, empty tensors
 * sitting on another tensor's bytes, trailing bytes, metadata, and a
 * header with trailing spaces. */
static void test_valid_layouts(void **state)
{
    struct fixture *fx = *state;
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
        "\"u\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]},"
        "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
        "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[12,13]}}   ";
    write_raw(fx->path, strlen(hdr), hdr, 20);
    char err[512] = "";
    struct st_file *f = st_open(fx->path, err, sizeof(err));
    if (!f) fail_msg("%s", err);
    assert_int_equal(st_count(f), 3);
    assert_string_equal(st_metadata(f, "format"), "pt");
    assert_string_equal(st_metadata(f, "note"), "x");
    assert_null(st_metadata(f, "nope"));
    assert_null(st_find(f, "__metadata__"));
    assert_null(st_find(f, "zz"));

    const struct st_tensor *u = st_find(f, "u");
    assert_non_null(u);
    assert_int_equal(u->nbytes, 8);
    float got[2];
    assert_int_equal(st_to_f32(u, got), 0);
    /* data bytes are i & 0xff, so "u" holds bytes 1..8 */
    uint32_t w0 = 1u | 2u << 8 | 3u << 16 | 4u << 24, w1 = 5u | 6u << 8 | 7u << 16 | 8u << 24;
    float want0, want1;
    memcpy(&want0, &w0, 4);
    memcpy(&want1, &w1, 4);
    assert_memory_equal(&got[0], &want0, 4);
    assert_memory_equal(&got[1], &want1, 4);

    const struct st_tensor *e = st_find(f, "e");
    assert_int_equal(e->numel, 0);
    assert_int_equal(e->ndim, 2);
    const struct st_tensor *s = st_find(f, "s");
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->numel, 1);
    assert_int_equal(s->data[0], 12);
    assert_int_equal(st_to_f32(s, got), -1); /* U8 is not loadable */
    st_close(f);

    write_raw(fx->path, 2, "{}", 0);
    f = st_open(fx->path, err, sizeof(err));
    assert_non_null(f);
    assert_int_equal(st_count(f), 0);
    st_close(f);
}

/* Random tensors of every loadable dtype (and one that is not) through
 * st_write and back: names, dtypes, shapes and bytes must survive, and
 * the header must be space-padded to a multiple of 8. */
static void test_round_trip(void **state)
{
    struct fixture *fx = *state;
    enum { NT = 6 };
    static const enum st_dtype dts[NT] = {ST_F32, ST_F16, ST_BF16, ST_I32, ST_F32, ST_F32};
    static const char *names[NT] = {"layer.0.weight", "h", "b\"q\\uote", "ints", "scalar",
                                    "empty"};
    uint64_t shapes[NT][3];
    size_t ndims[NT];
    void *data[NT];
    float *vals[NT];
    struct st_write_tensor t[NT];
    for (int i = 0; i < NT; i++) {
        ndims[i] = i == 4 ? 0 : 1 + (size_t)(tu_rand64() % 3);
        uint64_t numel = 1;
        for (size_t d = 0; d < ndims[i]; d++) {
            shapes[i][d] = i == 5 && d == 0 ? 0 : 1 + tu_rand64() % 7;
            numel *= shapes[i][d];
        }
        vals[i] = malloc((numel ? numel : 1) * sizeof(float));
        data[i] = malloc((numel ? numel : 1) * 4);
        assert_non_null(vals[i]);
        assert_non_null(data[i]);
        for (uint64_t k = 0; k < numel; k++) {
            float v = tu_randf(-100.0f, 100.0f);
            if (dts[i] == ST_F16) {
                uint16_t h = st_f32_to_f16(v);
                memcpy((char *)data[i] + 2 * k, &h, 2);
                v = st_f16_to_f32(h);
            } else if (dts[i] == ST_BF16) {
                uint16_t h = st_f32_to_bf16(v);
                memcpy((char *)data[i] + 2 * k, &h, 2);
                v = st_bf16_to_f32(h);
            } else if (dts[i] == ST_I32) {
                int32_t x = (int32_t)v;
                memcpy((char *)data[i] + 4 * k, &x, 4);
            } else {
                memcpy((char *)data[i] + 4 * k, &v, 4);
            }
            vals[i][k] = v;
        }
        t[i] = (struct st_write_tensor){names[i], dts[i], ndims[i], shapes[i], data[i]};
    }
    char err[512] = "";
    if (st_write(fx->path, t, NT, err, sizeof(err)) != 0) fail_msg("%s", err);

    FILE *fp = fopen(fx->path, "rb");
    assert_non_null(fp);
    unsigned char len[8];
    assert_int_equal(fread(len, 1, 8, fp), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len[i];
    assert_int_equal(hlen % 8, 0);
    char *hdr = malloc(hlen);
    assert_non_null(hdr);
    assert_int_equal(fread(hdr, 1, hlen, fp), hlen);
    fclose(fp);
    assert_int_equal(hdr[0], '{');
    size_t end = hlen;
    while (end > 0 && hdr[end - 1] == ' ') end--;
    assert_true(end > 0 && hdr[end - 1] == '}');
    free(hdr);

    struct st_file *f = st_open(fx->path, err, sizeof(err));
    if (!f) fail_msg("%s", err);
    assert_int_equal(st_count(f), NT);
    for (int i = 0; i < NT; i++) {
        const struct st_tensor *x = st_find(f, names[i]);
        assert_non_null(x);
        assert_ptr_equal(x, st_tensor_at(f, (size_t)i)); /* header order kept */
        assert_int_equal(x->dtype, dts[i]);
        assert_int_equal(x->ndim, ndims[i]);
        for (size_t d = 0; d < ndims[i]; d++) assert_int_equal(x->shape[d], shapes[i][d]);
        assert_int_equal(x->nbytes, x->numel * st_dtype_size(dts[i]));
        if (x->nbytes) assert_memory_equal(x->data, data[i], x->nbytes);
        float *conv = malloc((x->numel ? x->numel : 1) * sizeof(float));
        assert_non_null(conv);
        if (dts[i] == ST_I32) {
            assert_int_equal(st_to_f32(x, conv), -1);
        } else {
            assert_int_equal(st_to_f32(x, conv), 0);
            if (x->numel) assert_memory_equal(conv, vals[i], x->numel * sizeof(float));
        }
        free(conv);
    }
    st_close(f);
    for (int i = 0; i < NT; i++) {
        free(vals[i]);
        free(data[i]);
    }
}

/* The writer refuses what the reader would refuse. */
static void test_write_errors(void **state)
{
    struct fixture *fx = *state;
    uint64_t shape[1] = {1};
    float v = 1.0f;
    char err[512] = "";
    struct st_write_tensor dup[2] = {{"a", ST_F32, 1, shape, &v}, {"a", ST_F32, 1, shape, &v}};
    assert_int_equal(st_write(fx->path, dup, 2, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "tensor \"a\": duplicate name"));
    struct st_write_tensor meta = {"__metadata__", ST_F32, 1, shape, &v};
    assert_int_equal(st_write(fx->path, &meta, 1, err, sizeof(err)), -1);
    struct st_write_tensor nodata = {"a", ST_F32, 1, shape, NULL};
    assert_int_equal(st_write(fx->path, &nodata, 1, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "no data"));
    char bad[160];
    snprintf(bad, sizeof(bad), "%s/no/such/dir/x.safetensors", fx->dir);
    struct st_write_tensor ok = {"a", ST_F32, 1, shape, &v};
    assert_int_equal(st_write(bad, &ok, 1, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "No such file"));
}

/* Every dtype of the format: name, size, loadability. */
static void test_dtype_names(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        size_t size;
        int loadable;
    } rows[] = {
        {"BOOL", 1, 0}, {"U8", 1, 0},  {"I8", 1, 0},   {"F8_E4M3", 1, 0}, {"F8_E5M2", 1, 0},
        {"I16", 2, 0},  {"U16", 2, 0}, {"F16", 2, 1},  {"BF16", 2, 1},    {"I32", 4, 0},
        {"U32", 4, 0},  {"F32", 4, 1}, {"I64", 8, 0},  {"U64", 8, 0},     {"F64", 8, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        enum st_dtype dt;
        assert_int_equal(st_dtype_parse(rows[i].name, &dt), 0);
        assert_string_equal(st_dtype_name(dt), rows[i].name);
        assert_int_equal(st_dtype_size(dt), rows[i].size);
        assert_int_equal(st_dtype_loadable(dt), rows[i].loadable);
    }
    enum st_dtype dt;
    assert_int_equal(st_dtype_parse("f32", &dt), -1);
    assert_int_equal(st_dtype_parse("", &dt), -1);
}

/* Bit casts for the conversion tables. */
static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The inverse bit cast. */
static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Known half bit patterns and the float each is exactly. */
static void test_f16_to_f32(void **state)
{
    (void)state;
    static const struct {
        uint16_t h;
        uint32_t f; /* float bits */
    } rows[] = {
        {0x0000, 0x00000000}, /* +0 */
        {0x8000, 0x80000000}, /* -0 */
        {0x0001, 0x33800000}, /* min subnormal 2^-24 */
        {0x8001, 0xb3800000}, /* -2^-24 */
        {0x0002, 0x34000000}, /* 2^-23 */
        {0x0200, 0x38000000}, /* 2^-15 */
        {0x03ff, 0x387fc000}, /* max subnormal 1023 * 2^-24 */
        {0x0400, 0x38800000}, /* min normal 2^-14 */
        {0x3c00, 0x3f800000}, /* 1 */
        {0x3c01, 0x3f802000}, /* 1 + 2^-10 */
        {0xc000, 0xc0000000}, /* -2 */
        {0x3555, 0x3eaaa000}, /* 0.333251953125 */
        {0x7bff, 0x477fe000}, /* max 65504 */
        {0x7c00, 0x7f800000}, /* +inf */
        {0xfc00, 0xff800000}, /* -inf */
        {0x7e00, 0x7fc00000}, /* quiet NaN */
        {0x7c01, 0x7f802000}, /* signalling NaN, payload kept */
        {0xfe01, 0xffc02000}, /* negative NaN with payload */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        uint32_t got = f32_bits(st_f16_to_f32(rows[i].h));
        if (got != rows[i].f)
            fail_msg("f16 0x%04x -> 0x%08x, want 0x%08x", rows[i].h, got, rows[i].f);
    }
    assert_true(signbit(st_f16_to_f32(0x8000)));
    assert_true(isnan(st_f16_to_f32(0x7c01)));
    assert_float_equal(st_f16_to_f32(0x0001), ldexpf(1.0f, -24), 0.0f);
}

/* float -> half rounding: ties to even, overflow, underflow, NaN. */
static void test_f32_to_f16(void **state)
{
    (void)state;
    static const struct {
        uint32_t f;
        uint16_t h;
        const char *what;
    } rows[] = {
        {0x3f800000, 0x3c00, "1"},
        {0x80000000, 0x8000, "-0"},
        {0x3f801000, 0x3c00, "1 + 2^-11: tie, even stays"},
        {0x3f803000, 0x3c02, "1 + 3*2^-11: tie, rounds up to even"},
        {0x3f801001, 0x3c01, "just above the tie"},
        {0x477fe000, 0x7bff, "65504"},
        {0x477fefff, 0x7bff, "just below 65520"},
        {0x477ff000, 0x7c00, "65520: tie, rounds to inf"},
        {0x49742400, 0x7c00, "1e6 overflows"},
        {0x7f7fffff, 0x7c00, "FLT_MAX"},
        {0xff800000, 0xfc00, "-inf"},
        {0x33800000, 0x0001, "2^-24"},
        {0x33000000, 0x0000, "2^-25: tie, to zero"},
        {0x33000001, 0x0001, "just above 2^-25"},
        {0xb3000000, 0x8000, "-2^-25: -0"},
        {0x33c00000, 0x0002, "1.5 * 2^-24: tie, up to even 2"},
        {0x34200000, 0x0002, "2.5 * 2^-24: tie, down to even 2"},
        {0x34600000, 0x0004, "3.5 * 2^-24: tie, up to even 4"},
        {0x34400000, 0x0003, "3 * 2^-24: exact"},
        {0x387fe000, 0x0400, "max subnormal + half ulp: carries to min normal"},
        {0x2edbe6ff, 0x0000, "1e-10"},
        {0x00000001, 0x0000, "float subnormal"},
        {0x38800000, 0x0400, "2^-14"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        uint16_t got = st_f32_to_f16(bits_f32(rows[i].f));
        if (got != rows[i].h)
            fail_msg("%s: 0x%08x -> 0x%04x, want 0x%04x", rows[i].what, rows[i].f, got,
                     rows[i].h);
    }
    uint16_t n = st_f32_to_f16(NAN);
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x03ff) != 0);
    /* a NaN whose payload sits only in the low bits must stay a NaN */
    n = st_f32_to_f16(bits_f32(0x7f800001));
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x03ff) != 0);
}

/* Every half through float and back must be the identity (NaNs stay NaN,
 * quiet ones bit-exact); and where the compiler has _Float16, both
 * directions must agree with it bit for bit on all halves and on random
 * floats. */
static void test_f16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = st_f16_to_f32((uint16_t)h);
        uint16_t back = st_f32_to_f16(f);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan) {
            assert_true(isnan(f));
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
            if (h & 0x200) assert_int_equal(back, h);
        } else if (back != h) {
            fail_msg("half 0x%04x -> %a -> 0x%04x", h, (double)f, back);
        }
#ifdef __FLT16_MAX__
        _Float16 hf;
        uint16_t hb = (uint16_t)h;
        memcpy(&hf, &hb, 2);
        float ref = (float)hf;
        if (!nan && f32_bits(ref) != f32_bits(f))
            fail_msg("half 0x%04x: %a, _Float16 says %a", h, (double)f, (double)ref);
#endif
    }
#ifdef __FLT16_MAX__
    for (int i = 0; i < 1000000; i++) {
        /* random bit patterns cover every exponent, random magnitudes the
         * interesting range near half's limits */
        uint32_t bits = (uint32_t)tu_rand64();
        float f = (i & 1) ? bits_f32(bits) : tu_randf(-70000.0f, 70000.0f) *
                                                 ldexpf(1.0f, -(int)(tu_rand64() % 40));
        if (isnan(f)) continue;
        _Float16 hf = (_Float16)f;
        uint16_t want;
        memcpy(&want, &hf, 2);
        uint16_t got = st_f32_to_f16(f);
        if (got != want) fail_msg("float %a -> 0x%04x, _Float16 says 0x%04x", (double)f, got, want);
    }
#else
    print_message("no _Float16: compiler cross-check skipped\n");
#endif
}

/* BF16 both ways against known patterns, and exhaustive round trips. */
static void test_bf16(void **state)
{
    (void)state;
    static const struct {
        uint16_t b;
        uint32_t f;
    } widen[] = {
        {0x3f80, 0x3f800000}, {0xc000, 0xc0000000}, {0x0000, 0x00000000},
        {0x8000, 0x80000000}, {0x0001, 0x00010000}, /* bf16 subnormal 2^-133 */
        {0x4049, 0x40490000},                       /* 3.140625 */
        {0x7f7f, 0x7f7f0000},                       /* max finite */
        {0x7f80, 0x7f800000}, {0xff80, 0xff800000}, {0x7fc0, 0x7fc00000},
        {0x7f81, 0x7f810000}, /* signalling NaN kept */
    };
    for (size_t i = 0; i < sizeof(widen) / sizeof(widen[0]); i++) {
        uint32_t got = f32_bits(st_bf16_to_f32(widen[i].b));
        if (got != widen[i].f)
            fail_msg("bf16 0x%04x -> 0x%08x, want 0x%08x", widen[i].b, got, widen[i].f);
    }
    static const struct {
        uint32_t f;
        uint16_t b;
    } narrow[] = {
        {0x3f800000, 0x3f80}, {0x3f808000, 0x3f80}, /* tie, even stays */
        {0x3f818000, 0x3f82},                       /* tie, up to even */
        {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80}, {0x7f7fffff, 0x7f80}, /* rounds to inf */
        {0x7f7f7fff, 0x7f7f}, {0xff800000, 0xff80}, {0x00000001, 0x0000},
        {0x80008000, 0x8000}, {0x40490fdb, 0x4049}, /* pi */
    };
    for (size_t i = 0; i < sizeof(narrow) / sizeof(narrow[0]); i++) {
        uint16_t got = st_f32_to_bf16(bits_f32(narrow[i].f));
        if (got != narrow[i].b)
            fail_msg("0x%08x -> bf16 0x%04x, want 0x%04x", narrow[i].f, got, narrow[i].b);
    }
    uint16_t n = st_f32_to_bf16(bits_f32(0x7f800001)); /* NaN only in the low bits */
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    for (uint32_t b = 0; b <= 0xffff; b++) {
        int nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
        uint16_t back = st_f32_to_bf16(st_bf16_to_f32((uint16_t)b));
        if (!nan) assert_int_equal(back, b);
    }
}

/* Seeds the generator (printed, replayable) and runs the group. */
int main(int argc, char **argv)
{
    (void)argc;
    tu_seed(argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_headers),   cmocka_unit_test(test_bad_length),
        cmocka_unit_test(test_valid_layouts), cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_write_errors),  cmocka_unit_test(test_dtype_names),
        cmocka_unit_test(test_f16_to_f32),    cmocka_unit_test(test_f32_to_f16),
        cmocka_unit_test(test_f16_exhaustive), cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

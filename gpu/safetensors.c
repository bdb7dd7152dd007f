/* safetensors.c - safetensors reader (mmap + strict header validation) and
 * writer.
 *
 * Threads: st_open and st_write run on whichever thread calls them
 * (startup, or the `kinfer model demo` tool); nothing here is global, so
 * separate files may be opened concurrently. An open st_file is never
 * modified, so its tensors may be read from any thread.
 *
 * Ownership: st_open returns an st_file owning the mapping, the tensor
 * table, every tensor name and the metadata strings; everything it hands
 * out is borrowed and dies with st_close. st_write borrows its inputs. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct st_file {
    void *map;             /* the whole file, PROT_READ */
    size_t map_size;
    struct st_tensor *t;   /* n tensors, names owned */
    size_t n;
    char **meta_key;       /* n_meta "__metadata__" pairs, owned */
    char **meta_val;
    size_t n_meta;
};

/* dtype table: one row per dtype, in enum order, so name and size lookups
 * are an index and the parser is a loop over the same rows. */
static const struct {
    const char *name;
    size_t size;
    int loadable;
} st_dtypes[] = {
    [ST_BOOL] = {"BOOL", 1, 0},     [ST_U8] = {"U8", 1, 0},
    [ST_I8] = {"I8", 1, 0},         [ST_F8_E4M3] = {"F8_E4M3", 1, 0},
    [ST_F8_E5M2] = {"F8_E5M2", 1, 0}, [ST_I16] = {"I16", 2, 0},
    [ST_U16] = {"U16", 2, 0},       [ST_F16] = {"F16", 2, 1},
    [ST_BF16] = {"BF16", 2, 1},     [ST_I32] = {"I32", 4, 0},
    [ST_U32] = {"U32", 4, 0},       [ST_F32] = {"F32", 4, 1},
    [ST_I64] = {"I64", 8, 0},       [ST_U64] = {"U64", 8, 0},
    [ST_F64] = {"F64", 8, 0},
};
#define ST_N_DTYPES (sizeof(st_dtypes) / sizeof(st_dtypes[0]))

/* Formats into the caller's error buffer; every failure path goes through
 * here so a NULL or zero-sized buffer is handled once. */
static void st_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void st_seterr(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    if (!errstr || errstr_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* Renders a shape as "[2,3]" for error messages; truncates quietly, since
 * the message is for a human and the buffer is generous. */
static void st_shape_str(const uint64_t *shape, size_t ndim, char *buf, size_t n)
{
    size_t off = 0;
    int w = snprintf(buf, n, "[");
    for (size_t i = 0; w >= 0 && i < ndim; i++) {
        off += (size_t)w;
        if (off >= n) return;
        w = snprintf(buf + off, n - off, "%s%llu", i ? "," : "",
                     (unsigned long long)shape[i]);
    }
    if (w < 0) return;
    off += (size_t)w;
    if (off < n) snprintf(buf + off, n - off, "]");
}

void st_tensor_shape_str(const struct st_tensor *t, char *buf, size_t n)
{
    st_shape_str(t->shape, t->ndim, buf, n);
}

/* Table lookups: bounds-checked so a corrupt enum value gives "?"/0,
 * never an out-of-bounds read. */
const char *st_dtype_name(enum st_dtype dt)
{
    if ((size_t)dt >= ST_N_DTYPES) return "?";
    return st_dtypes[dt].name;
}

/* Linear scan of 15 names: parsed once per tensor at open. */
int st_dtype_parse(const char *s, enum st_dtype *out)
{
    for (size_t i = 0; i < ST_N_DTYPES; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (enum st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* Element size drives the byte-count check of every entry. */
size_t st_dtype_size(enum st_dtype dt)
{
    if ((size_t)dt >= ST_N_DTYPES) return 0;
    return st_dtypes[dt].size;
}

/* Which dtypes st_to_f32 accepts; the model loader checks this first
 * so it can name the tensor and dtype in its error. */
int st_dtype_loadable(enum st_dtype dt)
{
    if ((size_t)dt >= ST_N_DTYPES) return 0;
    return st_dtypes[dt].loadable;
}

/* The format is little-endian whatever the host; decoding byte by byte
 * keeps the reader correct on any host and safe on unaligned data. */
static uint64_t st_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Reads one JSON integer that must be >= 0 (shape dims and offsets): a
 * real, a string or a negative number is a malformed header. */
static int st_json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    if (i < 0) return -1;
    *out = (uint64_t)i;
    return 0;
}

/* Validates one tensor entry against the data region (data, dsize) and
 * fills *t; the checks follow the format's rules in order so the first
 * broken rule is the one reported. name is already copied into t. */
static int st_parse_entry(const char *path, const json_t *e,
                          const unsigned char *data, uint64_t dsize,
                          struct st_tensor *t, char *errstr, size_t errstr_size)
{
    const char *nm = t->name;
    if (!json_is_object(e)) {
        st_seterr(errstr, errstr_size, "%s: tensor \"%s\": entry is not a JSON object",
                  path, nm);
        return -1;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)e, key, val) {
        (void)val;
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0) {
            st_seterr(errstr, errstr_size, "%s: tensor \"%s\": unknown field \"%s\"",
                      path, nm, key);
            return -1;
        }
    }

    const json_t *jd = json_object_get(e, "dtype");
    if (!json_is_string(jd)) {
        st_seterr(errstr, errstr_size, "%s: tensor \"%s\": %s", path, nm,
                  jd ? "\"dtype\" is not a string" : "missing \"dtype\"");
        return -1;
    }
    if (st_dtype_parse(json_string_value(jd), &t->dtype) != 0) {
        st_seterr(errstr, errstr_size, "%s: tensor \"%s\": unknown dtype \"%s\"",
                  path, nm, json_string_value(jd));
        return -1;
    }

    const json_t *js = json_object_get(e, "shape");
    if (!json_is_array(js)) {
        st_seterr(errstr, errstr_size, "%s: tensor \"%s\": %s", path, nm,
                  js ? "\"shape\" is not an array" : "missing \"shape\"");
        return -1;
    }
    t->ndim = json_array_size(js);
    if (t->ndim > ST_MAX_DIMS) {
        st_seterr(errstr, errstr_size, "%s: tensor \"%s\": %zu dims, at most %d supported",
                  path, nm, t->ndim, ST_MAX_DIMS);
        return -1;
    }
    /* A zero dim makes the tensor empty however large the others are, so
     * overflow only matters when no dim is zero. */
    uint64_t numel = 1;
    int overflow = 0, zero = 0;
    for (size_t i = 0; i < t->ndim; i++) {
        if (st_json_u64(json_array_get(js, i), &t->shape[i]) != 0) {
            st_seterr(errstr, errstr_size,
                      "%s: tensor \"%s\": shape[%zu] is not a non-negative integer",
                      path, nm, i);
            return -1;
        }
        uint64_t d = t->shape[i];
        if (d == 0) zero = 1;
        else if (numel > UINT64_MAX / d) overflow = 1;
        else numel *= d;
    }
    char sh[256];
    st_shape_str(t->shape, t->ndim, sh, sizeof(sh));
    if (zero) numel = 0;
    size_t esz = st_dtypes[t->dtype].size;
    if (overflow || numel > UINT64_MAX / esz || numel * esz > SIZE_MAX) {
        st_seterr(errstr, errstr_size,
                  "%s: tensor \"%s\": shape %s overflows the element count", path, nm, sh);
        return -1;
    }
    t->numel = numel;

    const json_t *jo = json_object_get(e, "data_offsets");
    uint64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        st_json_u64(json_array_get(jo, 0), &begin) != 0 ||
        st_json_u64(json_array_get(jo, 1), &end) != 0) {
        st_seterr(errstr, errstr_size, "%s: tensor \"%s\": %s", path, nm,
                  jo ? "\"data_offsets\" is not [begin, end] of non-negative integers"
                     : "missing \"data_offsets\"");
        return -1;
    }
    if (end < begin) {
        st_seterr(errstr, errstr_size,
                  "%s: tensor \"%s\": data_offsets [%llu,%llu] end before begin", path, nm,
                  (unsigned long long)begin, (unsigned long long)end);
        return -1;
    }
    if (end > dsize) {
        st_seterr(errstr, errstr_size,
                  "%s: tensor \"%s\": data_offsets [%llu,%llu] run past the %llu-byte "
                  "data region", path, nm, (unsigned long long)begin,
                  (unsigned long long)end, (unsigned long long)dsize);
        return -1;
    }
    if (end - begin != numel * esz) {
        st_seterr(errstr, errstr_size,
                  "%s: tensor \"%s\": data_offsets [%llu,%llu] hold %llu bytes, shape %s "
                  "%s needs %llu", path, nm, (unsigned long long)begin,
                  (unsigned long long)end, (unsigned long long)(end - begin), sh,
                  st_dtypes[t->dtype].name, (unsigned long long)(numel * esz));
        return -1;
    }
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    return 0;
}

/* Orders tensors by where their bytes start (then end), so overlaps are
 * found by one pass over neighbours. */
static int st_cmp_offset(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* Two tensors sharing bytes would alias each other; the format forbids it.
 * Empty tensors own no bytes and never overlap anything. */
static int st_check_overlap(const char *path, struct st_file *f, char *errstr,
                            size_t errstr_size)
{
    if (f->n < 2) return 0;
    const struct st_tensor **order = malloc(f->n * sizeof(*order));
    if (!order) {
        st_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < f->n; i++) order[i] = &f->t[i];
    qsort(order, f->n, sizeof(*order), st_cmp_offset);
    const struct st_tensor *prev = NULL; /* non-empty tensor reaching furthest */
    int rc = 0;
    for (size_t i = 0; i < f->n; i++) {
        const struct st_tensor *t = order[i];
        if (t->nbytes == 0) continue;
        if (prev && t->data < prev->data + prev->nbytes) {
            st_seterr(errstr, errstr_size,
                      "%s: tensor \"%s\" overlaps tensor \"%s\" in the data region", path,
                      t->name, prev->name);
            rc = -1;
            break;
        }
        if (!prev || t->data + t->nbytes > prev->data + prev->nbytes) prev = t;
    }
    free(order);
    return rc;
}

/* Copies "__metadata__" (an object of strings) into f. */
static int st_parse_meta(const char *path, const json_t *m, struct st_file *f,
                         char *errstr, size_t errstr_size)
{
    if (!json_is_object(m)) {
        st_seterr(errstr, errstr_size, "%s: \"__metadata__\" is not a JSON object", path);
        return -1;
    }
    size_t n = json_object_size(m);
    f->meta_key = calloc(n ? n : 1, sizeof(char *));
    f->meta_val = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_key || !f->meta_val) {
        st_seterr(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)m, key, val) {
        if (!json_is_string(val)) {
            st_seterr(errstr, errstr_size, "%s: \"__metadata__\".\"%s\" is not a string",
                      path, key);
            return -1;
        }
        f->meta_key[f->n_meta] = strdup(key);
        f->meta_val[f->n_meta] = strdup(json_string_value(val));
        f->n_meta++;
        if (!f->meta_key[f->n_meta - 1] || !f->meta_val[f->n_meta - 1]) {
            st_seterr(errstr, errstr_size, "%s: out of memory", path);
            return -1;
        }
    }
    return 0;
}

/* Validates the mapped file held by f: header length, JSON, every entry,
 * then overlaps across entries. */
static int st_parse(const char *path, struct st_file *f, char *errstr,
                    size_t errstr_size)
{
    const unsigned char *base = f->map;
    uint64_t size = f->map_size;
    uint64_t hlen = st_le64(base);
    if (hlen > size - 8) {
        st_seterr(errstr, errstr_size,
                  "%s: header length %llu exceeds the %llu bytes after it", path,
                  (unsigned long long)hlen, (unsigned long long)(size - 8));
        return -1;
    }
    if (hlen > ST_MAX_HEADER) {
        st_seterr(errstr, errstr_size, "%s: header length %llu exceeds the %llu-byte limit",
                  path, (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
        return -1;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES,
                              &jerr);
    if (!root) {
        st_seterr(errstr, errstr_size, "%s: header is not valid JSON: %s (at byte %d)",
                  path, jerr.text, jerr.position);
        return -1;
    }
    int rc = -1;
    if (!json_is_object(root)) {
        st_seterr(errstr, errstr_size, "%s: header is not a JSON object", path);
        goto fail;
    }
    const unsigned char *data = base + 8 + hlen;
    uint64_t dsize = size - 8 - hlen;
    size_t cap = json_object_size(root);
    f->t = calloc(cap ? cap : 1, sizeof(*f->t));
    if (!f->t) {
        st_seterr(errstr, errstr_size, "%s: out of memory", path);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (st_parse_meta(path, val, f, errstr, errstr_size) != 0) goto fail;
            continue;
        }
        struct st_tensor *t = &f->t[f->n];
        t->name = strdup(key);
        if (!t->name) {
            st_seterr(errstr, errstr_size, "%s: out of memory", path);
            goto fail;
        }
        f->n++;
        if (st_parse_entry(path, val, data, dsize, t, errstr, errstr_size) != 0) goto fail;
    }
    if (st_check_overlap(path, f, errstr, errstr_size) != 0) goto fail;
    rc = 0;
fail:
    json_decref(root);
    return rc;
}

/* mmap rather than read: a model file may be large, and the loader only
 * touches each byte once while converting. A file truncated under us
 * could fault, but model files are not rewritten in place (st_write
 * renames a new file over the old). */
struct st_file *st_open(const char *path, char *errstr, size_t errstr_size)
{
    struct st_file *f = calloc(1, sizeof(*f));
    if (!f) {
        st_seterr(errstr, errstr_size, "%s: out of memory", path);
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st_seterr(errstr, errstr_size, "%s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st_seterr(errstr, errstr_size, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st_seterr(errstr, errstr_size, "%s: not a regular file", path);
        goto fail;
    }
    if (sb.st_size < 8) {
        st_seterr(errstr, errstr_size,
                  "%s: file is %lld bytes, too short for the 8-byte header length", path,
                  (long long)sb.st_size);
        goto fail;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        st_seterr(errstr, errstr_size, "%s: file too large to map", path);
        goto fail;
    }
    f->map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st_seterr(errstr, errstr_size, "%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    f->map_size = (size_t)sb.st_size;
    close(fd);
    fd = -1;
    if (st_parse(path, f, errstr, errstr_size) != 0) goto fail;
    return f;
fail:
    if (fd >= 0) close(fd);
    st_close(f);
    return NULL;
}

/* Frees in reverse of st_open; tolerates the half-built file st_open's
 * failure path hands it. */
void st_close(struct st_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free((char *)f->t[i].name);
    free(f->t);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->meta_key);
    free(f->meta_val);
    if (f->map) munmap(f->map, f->map_size);
    free(f);
}

/* Lets callers list tensors (e.g. to log what a file holds). */
size_t st_count(const struct st_file *f)
{
    return f->n;
}

/* Index access, NULL past the end. */
const struct st_tensor *st_tensor_at(const struct st_file *f, size_t i)
{
    return i < f->n ? &f->t[i] : NULL;
}

/* Linear search: lookups happen a few times per layer at load, never in
 * the hot path, and files hold at most thousands of tensors. */
const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

/* Metadata is informational ("format": "pt"); exposed for logging. */
const char *st_metadata(const struct st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return NULL;
}

/* Bit casts through memcpy: the only type-pun C11 defines. */
static float st_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* The inverse bit cast. */
static uint32_t st_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* Every half is exactly a float, so this is a re-encoding: re-bias the
 * exponent, normalise subnormals (value = mant * 2^-24), and carry the
 * NaN payload over so a NaN stays the same NaN. */
float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return st_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return st_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return st_bits_f32(sign);
    int p = 9; /* position of the leading 1: value = 1.f * 2^(p - 24) */
    while (!(man & (1u << p))) p--;
    uint32_t frac = (man << (10 - p)) & 0x3ffu;
    return st_bits_f32(sign | ((uint32_t)(p + 103) << 23) | (frac << 13));
}

/* BF16 is the top half of an F32, so widening is a shift. */
float st_bf16_to_f32(uint16_t b)
{
    return st_bits_f32((uint32_t)b << 16);
}

/* Round to nearest, ties to even, done on the integer bits so the result
 * does not depend on the FPU's rounding mode or on _Float16 support. */
uint16_t st_f32_to_f16(float f)
{
    uint32_t x = st_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;
    if (exp == 0xff) {
        if (man == 0) return sign | 0x7c00u;
        return (uint16_t)(sign | 0x7e00u | (man >> 13)); /* quiet, top payload kept */
    }
    int e = (int)exp - 112; /* half's biased exponent */
    if (e >= 31) return sign | 0x7c00u;
    if (e <= 0) {
        /* Half subnormal (or zero): count units of 2^-24. Below 2^-25 the
         * value rounds to zero whatever its significand. */
        if (e < -10) return sign;
        uint32_t m = man | 0x800000u;
        unsigned shift = (unsigned)(14 - e); /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++; /* may carry into the min normal */
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++; /* may carry to inf */
    return (uint16_t)(sign | q);
}

/* Rounds to nearest even by adding 0x7fff plus the kept LSB before
 * truncating; NaN is handled first so rounding can't turn it into inf. */
uint16_t st_f32_to_bf16(float f)
{
    uint32_t x = st_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Converts element by element from little-endian bytes: the data may be
 * unaligned (offsets are arbitrary), which rules out casting to float*. */
int st_to_f32(const struct st_tensor *t, float *dst)
{
    const unsigned char *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case ST_F32:
        for (size_t i = 0; i < n; i++, p += 4)
            dst[i] = st_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                 (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        return 0;
    case ST_F16:
        for (size_t i = 0; i < n; i++, p += 2)
            dst[i] = st_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        return 0;
    case ST_BF16:
        for (size_t i = 0; i < n; i++, p += 2)
            dst[i] = st_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
        return 0;
    default:
        return -1;
    }
}

/* write(2) until done: a short write is not an error. */
static int st_write_all(int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Builds the JSON header for t (offsets packed in order) and returns it as
 * a new string, plus the data size in *data_size. */
static char *st_build_header(const struct st_write_tensor *t, size_t n, uint64_t *data_size,
                             char *errstr, size_t errstr_size)
{
    json_t *root = json_object();
    char *out = NULL;
    uint64_t off = 0;
    if (!root) goto oom;
    for (size_t i = 0; i < n; i++) {
        const char *nm = t[i].name;
        if (!nm || strcmp(nm, "__metadata__") == 0) {
            st_seterr(errstr, errstr_size, "st_write: tensor %zu: invalid name", i);
            goto fail;
        }
        if (json_object_get(root, nm)) {
            st_seterr(errstr, errstr_size, "st_write: tensor \"%s\": duplicate name", nm);
            goto fail;
        }
        size_t esz = st_dtype_size(t[i].dtype);
        if (esz == 0 || t[i].ndim > ST_MAX_DIMS || (t[i].ndim && !t[i].shape)) {
            st_seterr(errstr, errstr_size, "st_write: tensor \"%s\": bad dtype or shape", nm);
            goto fail;
        }
        json_t *shape = json_array();
        json_t *e = json_object();
        json_t *offs = json_array();
        if (!shape || !e || !offs) {
            json_decref(shape);
            json_decref(e);
            json_decref(offs);
            goto oom;
        }
        json_object_set_new(e, "dtype", json_string(st_dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(root, nm, e);
        uint64_t numel = 1;
        int zero = 0, overflow = 0;
        for (size_t d = 0; d < t[i].ndim; d++) {
            uint64_t v = t[i].shape[d];
            if (v > (uint64_t)LLONG_MAX) overflow = 1;
            if (v == 0) zero = 1;
            else if (numel > UINT64_MAX / v) overflow = 1;
            else numel *= v;
            json_array_append_new(shape, json_integer((json_int_t)v));
        }
        if (zero) numel = 0;
        if (overflow || numel > ((uint64_t)LLONG_MAX - off) / esz) {
            st_seterr(errstr, errstr_size, "st_write: tensor \"%s\": too large", nm);
            goto fail;
        }
        if (numel && !t[i].data) {
            st_seterr(errstr, errstr_size, "st_write: tensor \"%s\": no data", nm);
            goto fail;
        }
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += numel * esz;
        json_array_append_new(offs, json_integer((json_int_t)off));
    }
    out = json_dumps(root, JSON_COMPACT);
    if (!out) goto oom;
    json_decref(root);
    *data_size = off;
    return out;
oom:
    st_seterr(errstr, errstr_size, "st_write: out of memory");
fail:
    json_decref(root);
    return NULL;
}

/* Writes into a temp file beside path and renames it over path, so a
 * reader never sees a half-written model. */
int st_write(const char *path, const struct st_write_tensor *t, size_t n, char *errstr,
             size_t errstr_size)
{
    uint64_t dsize = 0;
    char *hdr = st_build_header(t, n, &dsize, errstr, errstr_size);
    if (!hdr) return -1;
    int rc = -1, fd = -1, made = 0;
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7;
    char *tmp = NULL;
    char *pad = malloc(padded + 8);
    size_t tlen = strlen(path) + 16;
    tmp = malloc(tlen);
    if (!pad || !tmp) {
        st_seterr(errstr, errstr_size, "st_write: out of memory");
        goto fail;
    }
    for (int i = 0; i < 8; i++) pad[i] = (char)((uint64_t)padded >> (8 * i));
    memcpy(pad + 8, hdr, hlen);
    memset(pad + 8 + hlen, ' ', padded - hlen);
    snprintf(tmp, tlen, "%s.tmpXXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        st_seterr(errstr, errstr_size, "%s: %s", tmp, strerror(errno));
        goto fail;
    }
    made = 1;
    if (fchmod(fd, 0644) != 0 || st_write_all(fd, pad, padded + 8) != 0) goto io_fail;
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (size_t d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        size_t nb = (size_t)numel * st_dtype_size(t[i].dtype);
        if (nb && st_write_all(fd, t[i].data, nb) != 0) goto io_fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        goto io_fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        st_seterr(errstr, errstr_size, "%s: rename: %s", path, strerror(errno));
        goto fail;
    }
    made = 0;
    rc = 0;
    goto done;
io_fail:
    st_seterr(errstr, errstr_size, "%s: write: %s", tmp, strerror(errno));
fail:
    if (fd >= 0) close(fd);
    if (made) unlink(tmp);
done:
    free(tmp);
    free(pad);
    free(hdr);
    return rc;
}

/* safetensors.h - reads and writes the safetensors format: an 8-byte
 * little-endian header length N, N bytes of JSON describing each tensor
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}}, plus an
 * optional "__metadata__" object of strings), then the raw little-endian
 * data the offsets point into. The reader validates everything before it
 * hands out a tensor, so a truncated or hostile file is an error message,
 * never an out-of-bounds read. Stricter than the reference reader on
 * entries (unknown fields refused), laxer on layout: gaps between tensors
 * and trailing bytes are accepted; overlaps are not. Plain C.
 *
 * Threads: st_open/st_write at startup (main thread) or in tools; an open
 * st_file is read-only and may be read from any thread. */
#ifndef KINFER_SAFETENSORS_H
#define KINFER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 16                       /* more dims than this: refused */
#define ST_MAX_HEADER ((uint64_t)100000000)  /* 100 MB, as the reference reader */

/* Every dtype the format defines. Only F32, F16 and BF16 convert to float
 * (st_dtype_loadable); the others parse and validate, and are refused by
 * st_to_f32. */
enum st_dtype {
    ST_BOOL = 0,
    ST_U8,
    ST_I8,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_I64,
    ST_U64,
    ST_F64,
};

/* One tensor of an open file (plain data, owned by the st_file). */
struct st_tensor {
    const char *name;
    enum st_dtype dtype;
    size_t ndim;                    /* 0 = scalar (one element) */
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;                 /* product of shape; 1 for a scalar */
    const unsigned char *data;      /* nbytes raw little-endian bytes inside
                                     * the file's mapping, maybe unaligned;
                                     * valid until st_close */
    size_t nbytes;
};

/* What st_write writes: the caller's raw little-endian elements of dtype,
 * numel * st_dtype_size(dtype) bytes (data may be NULL if that is 0).
 * Borrowed for the duration of the call. */
struct st_write_tensor {
    const char *name;
    enum st_dtype dtype;
    size_t ndim;
    const uint64_t *shape;
    const void *data;
};

struct st_file;

/* Maps path read-only and validates its header and every tensor entry.
 * Returns a new st_file, or NULL with errstr filled ("PATH: tensor \"x\":
 * data_offsets [0,12] hold 12 bytes, shape [2,2] F32 needs 16"). */
struct st_file *st_open(const char *path, char *errstr, size_t errstr_size);
/* Unmaps and frees f and every tensor it handed out. Accepts NULL. */
void st_close(struct st_file *f);

/* Number of tensors and the i-th one (in header order), borrowed from f. */
size_t st_count(const struct st_file *f);
const struct st_tensor *st_tensor_at(const struct st_file *f, size_t i);
/* The tensor called name, borrowed from f, or NULL if there is none. */
const struct st_tensor *st_find(const struct st_file *f, const char *name);
/* The value of "__metadata__"[key], borrowed from f, or NULL. */
const char *st_metadata(const struct st_file *f, const char *key);

/* t's shape as "[384,385]" into buf (n bytes), for messages; cut short
 * quietly when it does not fit. */
void st_tensor_shape_str(const struct st_tensor *t, char *buf, size_t n);

/* "F32", "BF16", ...; "?" for an out-of-range value. */
const char *st_dtype_name(enum st_dtype dt);
/* Parses a dtype name into *out; returns 0, or -1 if it is not one. */
int st_dtype_parse(const char *s, enum st_dtype *out);
/* Bytes per element (1 for BOOL and the F8 types). */
size_t st_dtype_size(enum st_dtype dt);
/* 1 for F32, F16 and BF16: the dtypes st_to_f32 converts. */
int st_dtype_loadable(enum st_dtype dt);

/* Converts t's numel elements into dst (caller's, numel floats). Returns
 * 0, or -1 if t's dtype is not loadable (dst untouched). */
int st_to_f32(const struct st_tensor *t, float *dst);

/* Scalar conversions, exact in the widening direction (F16 subnormals,
 * infinities, NaN payloads and signed zeros are kept); the narrowing ones
 * round to nearest, ties to even, overflow to infinity and keep NaN a
 * (quiet) NaN. */
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t b);
uint16_t st_f32_to_f16(float f);
uint16_t st_f32_to_bf16(float f);

/* Writes the n tensors of t (borrowed) to path as one safetensors file,
 * packed in the given order, header padded with spaces to a multiple of 8.
 * The file appears whole or not at all (written beside path, then
 * renamed). Returns 0, or -1 with errstr filled. */
int st_write(const char *path, const struct st_write_tensor *t, size_t n,
             char *errstr, size_t errstr_size);

#endif

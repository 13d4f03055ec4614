/* core.h: what every layer of the torchtpu core shares.
 *
 * - tpu_status: errors are values. A function that can fail returns a
 *   tpu_status* (NULL on success); the caller owns a non-NULL status and frees
 *   it with tpu_status_free (which accepts NULL).
 * - tpu_dtype: element types. The numeric values are those of PJRT_Buffer_Type,
 *   so the runtime passes them to the plugin unchanged.
 */
#ifndef TPU_CORE_H
#define TPU_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TPU_MAX_RANK 64

/* FNV-1a 64 over n bytes, continuing from h (start with TPU_FNV_BASIS). */
#define TPU_FNV_BASIS 14695981039346656037ull
uint64_t tpu_fnv1a(uint64_t h, const void *p, size_t n);
/* A fast 64-bit hash of n bytes for in-memory tables (not stable across
 * versions: nothing on disk depends on it). */
uint64_t tpu_hash64(const void *p, size_t n);

/* ---- status ------------------------------------------------------------ */

typedef enum {
  TPU_ERR_RUNTIME = 1,   /* RuntimeError: plugin or execution failure      */
  TPU_ERR_VALUE,         /* ValueError: bad argument value                 */
  TPU_ERR_TYPE,          /* TypeError: wrong argument kind or dtype        */
  TPU_ERR_INDEX,         /* IndexError: dimension or index out of range    */
  TPU_ERR_UNIMPLEMENTED, /* NotImplementedError: op or case not lowered    */
  TPU_ERR_PLUGIN,        /* RuntimeError naming what to install            */
  TPU_ERR_MEMORY         /* MemoryError                                    */
} tpu_code;

/* A printf-formatted string of any length: owned (free), NULL when out of memory. */
char *tpu_strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *tpu_strfmtv(const char *fmt, va_list ap);
/* n bytes for people: "512 bytes", "1.5 KiB", ..., "2.0 TiB" (binary units,
 * one decimal); snprintf's contract. */
int tpu_bytes_str(int64_t n, char *buf, size_t len);
/* Where the first "<number> bytes" of 1 KiB or more in msg[0..len) ends (0:
 * none), and that number in *bytes (the plugins' out-of-memory messages give
 * sizes so). */
int tpu_bytes_in_text(const char *msg, int len, int64_t *bytes);

typedef struct tpu_status tpu_status;

/* Returns an owned status; never NULL (falls back to a static out-of-memory
 * status, which tpu_status_free recognises). */
tpu_status *tpu_status_new(tpu_code code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
tpu_status *tpu_status_newv(tpu_code code, const char *fmt, va_list ap);
tpu_code tpu_status_code(const tpu_status *s);
/* Borrowed; lifetime of s. */
const char *tpu_status_message(const tpu_status *s);
/* Prefixes the message with "<fmt>: " and returns s (for context chains). */
tpu_status *tpu_status_prefix(tpu_status *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tpu_status_free(tpu_status *s);

/* ---- element types ------------------------------------------------------- */

typedef enum {
  TPU_INVALID = 0,
  TPU_PRED = 1,
  TPU_S8 = 2,
  TPU_S16 = 3,
  TPU_S32 = 4,
  TPU_S64 = 5,
  TPU_U8 = 6,
  TPU_U16 = 7,
  TPU_U32 = 8,
  TPU_U64 = 9,
  TPU_F16 = 10,
  TPU_F32 = 11,
  TPU_F64 = 12,
  TPU_BF16 = 13,
  TPU_C64 = 14,
  TPU_C128 = 15,
  TPU_NUM_DTYPES
} tpu_dtype;

size_t tpu_dtype_size(tpu_dtype t);      /* bytes per element; 0 if invalid */
const char *tpu_dtype_mlir(tpu_dtype t); /* "f32", "i1", "ui8", "complex<f32>" */
const char *tpu_dtype_name(tpu_dtype t); /* torch name: "float32", "bool", ... */
bool tpu_dtype_is_float(tpu_dtype t);    /* f16, bf16, f32, f64 */
bool tpu_dtype_is_complex(tpu_dtype t);
bool tpu_dtype_is_signed_int(tpu_dtype t);   /* s8..s64 */
bool tpu_dtype_is_unsigned_int(tpu_dtype t); /* u8..u64 */
bool tpu_dtype_is_int(tpu_dtype t);          /* signed or unsigned, not pred */
const char *tpu_dtype_c10_name(tpu_dtype t); /* c10's name: "Float", "Long", "ComplexFloat" */
/* The range of dtype t's values: for bool and the integer types exactly
 * (u64's highest clamped to INT64_MAX), the int64 range for other types. */
int64_t tpu_dtype_int_min(tpu_dtype t);
int64_t tpu_dtype_int_max(tpu_dtype t);
/* The same as doubles, -inf and inf for floating and complex types (the
 * identities of max and min). */
double tpu_dtype_lowest(tpu_dtype t);
double tpu_dtype_highest(tpu_dtype t);
/* The largest finite value of a floating type (f64's for other types). */
double tpu_dtype_float_max(tpu_dtype t);
/* The significand bits of a floating type (f16 11, bf16 8, f32 24, f64 53:
 * every integer of magnitude up to 2**digits is exact); 0 for other types. */
int tpu_dtype_float_digits(tpu_dtype t);
/* torch.can_cast: a result of dtype from may be written into a tensor of
 * dtype to (no complex to real, no float to integer, nothing else to bool). */
bool tpu_dtype_can_cast(tpu_dtype from, tpu_dtype to);
/* torch.promote_types for two dtypes. */
tpu_dtype tpu_dtype_promote(tpu_dtype a, tpu_dtype b);

/* Elements a tensor of these sizes and strides (NULL: contiguous) spans in
 * its storage, into *numel. False when that count, or its bytes at itemsize
 * bytes an element, does not fit in int64 (torch's "Storage size calculation
 * overflowed"), or a size or a stride is negative (as torch): never an overflowing multiplication. */
bool tpu_storage_numel(int rank, const int64_t *sizes, const int64_t *strides, size_t itemsize, int64_t *numel);

#endif

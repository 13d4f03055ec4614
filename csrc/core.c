/* core.c: statuses and element types.
 *
 * A status is one heap block (code + message). When even that allocation
 * fails, a static out-of-memory status is returned instead; freeing it is a
 * no-op, so callers never need a special case.
 */
#include "core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tpu_status {
  tpu_code code;
  char *msg;
};

static tpu_status tpu_status_oom = {TPU_ERR_MEMORY, "out of memory"};

char *tpu_strfmtv(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf) vsnprintf(buf, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return buf;
}

int tpu_bytes_str(int64_t n, char *buf, size_t len) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) return snprintf(buf, len, "%lld bytes", (long long)n);
  double v = (double)n / 1024;
  int u = 0;
  while (v >= 1023.95 && u < 5) v /= 1024, u++;
  return snprintf(buf, len, "%.1f %s", v, units[u]);
}

int tpu_bytes_in_text(const char *msg, int len, int64_t *bytes) {
  for (int i = 0; i < len; i++) {
    if (msg[i] < '0' || msg[i] > '9' || (i > 0 && msg[i - 1] >= '0' && msg[i - 1] <= '9')) continue;
    int64_t v = 0;
    int j = i;
    while (j < len && msg[j] >= '0' && msg[j] <= '9' && v < INT64_MAX / 10) v = v * 10 + (msg[j++] - '0');
    if (j + 6 <= len && memcmp(msg + j, " bytes", 6) == 0 && v >= 1024) {
      *bytes = v;
      return j + 6;
    }
  }
  return 0;
}

char *tpu_strfmt(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *buf = tpu_strfmtv(fmt, ap);
  va_end(ap);
  return buf;
}

tpu_status *tpu_status_newv(tpu_code code, const char *fmt, va_list ap) {
  tpu_status *s = malloc(sizeof *s);
  if (!s) return &tpu_status_oom;
  s->msg = tpu_strfmtv(fmt, ap);
  if (!s->msg) {
    free(s);
    return &tpu_status_oom;
  }
  s->code = code;
  return s;
}

tpu_status *tpu_status_new(tpu_code code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tpu_status *s = tpu_status_newv(code, fmt, ap);
  va_end(ap);
  return s;
}

tpu_code tpu_status_code(const tpu_status *s) { return s->code; }
const char *tpu_status_message(const tpu_status *s) { return s->msg; }

tpu_status *tpu_status_prefix(tpu_status *s, const char *fmt, ...) {
  if (!s || s == &tpu_status_oom) return s;
  va_list ap;
  va_start(ap, fmt);
  char *head = tpu_strfmtv(fmt, ap); /* any length: a prefix may hold a Python stack */
  va_end(ap);
  if (!head) return s;
  size_t n = strlen(head) + 2 + strlen(s->msg) + 1;
  char *m = malloc(n);
  if (m) snprintf(m, n, "%s: %s", head, s->msg);
  free(head);
  if (!m) return s;
  free(s->msg);
  s->msg = m;
  return s;
}

void tpu_status_free(tpu_status *s) {
  if (!s || s == &tpu_status_oom) return;
  free(s->msg);
  free(s);
}

/* ---- element types ------------------------------------------------------- */

static const struct {
  size_t size;
  const char *mlir;
  const char *name;
  const char *c10; /* c10::ScalarType's name, as torch's messages spell it */
} tpu_dtype_info[TPU_NUM_DTYPES] = {
    [TPU_INVALID] = {0, "?", "invalid", "Undefined"},
    [TPU_PRED] = {1, "i1", "bool", "Bool"},
    [TPU_S8] = {1, "i8", "int8", "Char"},
    [TPU_S16] = {2, "i16", "int16", "Short"},
    [TPU_S32] = {4, "i32", "int32", "Int"},
    [TPU_S64] = {8, "i64", "int64", "Long"},
    [TPU_U8] = {1, "ui8", "uint8", "Byte"},
    [TPU_U16] = {2, "ui16", "uint16", "UInt16"},
    [TPU_U32] = {4, "ui32", "uint32", "UInt32"},
    [TPU_U64] = {8, "ui64", "uint64", "UInt64"},
    [TPU_F16] = {2, "f16", "float16", "Half"},
    [TPU_F32] = {4, "f32", "float32", "Float"},
    [TPU_F64] = {8, "f64", "float64", "Double"},
    [TPU_BF16] = {2, "bf16", "bfloat16", "BFloat16"},
    [TPU_C64] = {8, "complex<f32>", "complex64", "ComplexFloat"},
    [TPU_C128] = {16, "complex<f64>", "complex128", "ComplexDouble"},
};

static bool tpu_dtype_valid(tpu_dtype t) { return t > TPU_INVALID && t < TPU_NUM_DTYPES; }
size_t tpu_dtype_size(tpu_dtype t) { return tpu_dtype_valid(t) ? tpu_dtype_info[t].size : 0; }
const char *tpu_dtype_c10_name(tpu_dtype t) { return tpu_dtype_info[tpu_dtype_valid(t) ? t : TPU_INVALID].c10; }

bool tpu_dtype_can_cast(tpu_dtype from, tpu_dtype to) {
  if (tpu_dtype_is_complex(from) && !tpu_dtype_is_complex(to)) return false;
  if (tpu_dtype_is_float(from) && (tpu_dtype_is_int(to) || to == TPU_PRED)) return false;
  if (from != TPU_PRED && to == TPU_PRED) return false;
  return true;
}
const char *tpu_dtype_mlir(tpu_dtype t) { return tpu_dtype_valid(t) ? tpu_dtype_info[t].mlir : "?"; }
const char *tpu_dtype_name(tpu_dtype t) { return tpu_dtype_valid(t) ? tpu_dtype_info[t].name : "invalid"; }
bool tpu_dtype_is_float(tpu_dtype t) { return t == TPU_F16 || t == TPU_BF16 || t == TPU_F32 || t == TPU_F64; }
bool tpu_dtype_is_complex(tpu_dtype t) { return t == TPU_C64 || t == TPU_C128; }
bool tpu_dtype_is_signed_int(tpu_dtype t) { return t >= TPU_S8 && t <= TPU_S64; }
bool tpu_dtype_is_unsigned_int(tpu_dtype t) { return t >= TPU_U8 && t <= TPU_U64; }
bool tpu_dtype_is_int(tpu_dtype t) { return tpu_dtype_is_signed_int(t) || tpu_dtype_is_unsigned_int(t); }

int64_t tpu_dtype_int_min(tpu_dtype t) {
  switch (t) {
    case TPU_PRED:
    case TPU_U8:
    case TPU_U16:
    case TPU_U32:
    case TPU_U64: return 0;
    case TPU_S8: return INT8_MIN;
    case TPU_S16: return INT16_MIN;
    case TPU_S32: return INT32_MIN;
    default: return INT64_MIN;
  }
}

int64_t tpu_dtype_int_max(tpu_dtype t) {
  switch (t) {
    case TPU_PRED: return 1;
    case TPU_S8: return INT8_MAX;
    case TPU_U8: return UINT8_MAX;
    case TPU_S16: return INT16_MAX;
    case TPU_U16: return UINT16_MAX;
    case TPU_S32: return INT32_MAX;
    case TPU_U32: return UINT32_MAX;
    default: return INT64_MAX;
  }
}

double tpu_dtype_lowest(tpu_dtype t) {
  return tpu_dtype_is_int(t) || t == TPU_PRED ? (double)tpu_dtype_int_min(t) : -INFINITY;
}

double tpu_dtype_highest(tpu_dtype t) {
  return tpu_dtype_is_int(t) || t == TPU_PRED ? (double)tpu_dtype_int_max(t) : INFINITY;
}

double tpu_dtype_float_max(tpu_dtype t) {
  switch (t) {
    case TPU_F16: return 65504.0;
    case TPU_BF16: return 3.3895313892515355e38;
    case TPU_F32: return 3.4028234663852886e38;
    default: return 1.7976931348623157e308;
  }
}

int tpu_dtype_float_digits(tpu_dtype t) {
  switch (t) {
    case TPU_F16: return 11;
    case TPU_BF16: return 8;
    case TPU_F32: return 24;
    case TPU_F64: return 53;
    default: return 0;
  }
}

/* torch's promotion lattice: bool < integers < floats < complex. Within a
 * kind the wider type wins; mixing signed and unsigned needs a signed type
 * wider than the unsigned one (u8 + s8 -> s16; torch has no wider unsigned
 * rule, and u64 with a signed type is an error there; we pick s64); f16 with
 * bf16 gives f32. */
tpu_dtype tpu_dtype_promote(tpu_dtype a, tpu_dtype b) {
  if (a == b) return a;
  if (a == TPU_PRED) return b;
  if (b == TPU_PRED) return a;
  if (tpu_dtype_is_complex(a) || tpu_dtype_is_complex(b)) {
    bool wide = a == TPU_C128 || b == TPU_C128 || a == TPU_F64 || b == TPU_F64;
    return wide ? TPU_C128 : TPU_C64;
  }
  if (tpu_dtype_is_float(a) || tpu_dtype_is_float(b)) {
    if (!tpu_dtype_is_float(a)) return b;
    if (!tpu_dtype_is_float(b)) return a;
    if ((a == TPU_F16 && b == TPU_BF16) || (a == TPU_BF16 && b == TPU_F16)) return TPU_F32;
    return tpu_dtype_size(a) >= tpu_dtype_size(b) ? a : b;
  }
  bool ua = tpu_dtype_is_unsigned_int(a), ub = tpu_dtype_is_unsigned_int(b);
  if (ua == ub) return tpu_dtype_size(a) >= tpu_dtype_size(b) ? a : b;
  tpu_dtype u = ua ? a : b, s = ua ? b : a;
  if (tpu_dtype_size(s) > tpu_dtype_size(u)) return s;
  switch (tpu_dtype_size(u)) {
    case 1: return TPU_S16;
    case 2: return TPU_S32;
    default: return TPU_S64;
  }
}

uint64_t tpu_fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Eight bytes per multiply instead of FNV's one: signatures are hashed on
 * every eager op and every flush, and FNV's byte chain (a multiply per
 * byte) showed up as the hottest function of an op's dispatch. */
uint64_t tpu_hash64(const void *p, size_t n) {
  const uint8_t *b = p;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n * 0xff51afd7ed558ccdull);
  for (; n >= 8; n -= 8, b += 8) {
    uint64_t w;
    memcpy(&w, b, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  memcpy(&w, b, n);
  h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 32);
}

bool tpu_storage_numel(int rank, const int64_t *sizes, const int64_t *strides, size_t itemsize, int64_t *numel) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (sizes[i] < 0) return false;
    if (sizes[i] == 0) n = 0;
  }
  if (n == 0) {
    *numel = 0;
    return true;
  }
  if (strides) {
    /* the last element's offset + 1 */
    n = 1;
    for (int i = 0; i < rank; i++) {
      int64_t step;
      if (strides[i] < 0 || __builtin_mul_overflow(sizes[i] - 1, strides[i], &step) ||
          __builtin_add_overflow(n, step, &n))
        return false;
    }
  } else {
    for (int i = 0; i < rank; i++)
      if (__builtin_mul_overflow(n, sizes[i], &n)) return false;
  }
  int64_t bytes;
  if (__builtin_mul_overflow(n, (int64_t)itemsize, &bytes)) return false;
  *numel = n;
  return true;
}

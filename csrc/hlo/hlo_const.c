/* hlo_const.c: constants (see hlo.h; the builder's files are listed in
 * hlo_impl.h).
 *
 * Scalar constants of every dtype, dense integer constants of any shape, and
 * iota, each one stablehlo.constant (or iota) op whose value is a dense<...>
 * literal. A float is first rounded to its dtype (nearest-even, in double
 * arithmetic), then printed with just enough digits to identify it; infinity
 * and NaN are printed as bit patterns. An integer out of its dtype's range
 * wraps like a C cast.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hlo_impl.h"

/* v rounded to nearest-even in a binary format with p significand bits and
 * normal exponents emin..emax (inf past the largest finite value). Done in
 * double arithmetic, so there is no double rounding through f32 and no
 * out-of-range float conversion. */
static double tpu_round_format(double v, int p, int emin, int emax) {
  if (v == 0 || !isfinite(v)) return v;
  int e;
  frexp(v, &e);
  int exp = e - 1 < emin ? emin : e - 1; /* subnormals share emin's quantum */
  double r = ldexp(nearbyint(ldexp(v, p - 1 - exp)), exp - (p - 1));
  double maxf = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
  if (fabs(r) > maxf) return copysign(INFINITY, v);
  return r;
}

static void tpu_put_float(tpu_hlo *m, tpu_buf *b, tpu_dtype dt, double v) {
  if (dt == TPU_F32)
    v = tpu_round_format(v, 24, -126, 127);
  else if (dt == TPU_BF16)
    v = tpu_round_format(v, 8, -126, 127);
  else if (dt == TPU_F16)
    v = tpu_round_format(v, 11, -14, 15);
  if (!isfinite(v)) {
    /* MLIR takes hex literals in a float dense attribute as bit patterns. */
    bool neg = signbit(v);
    const char *s;
    if (isnan(v)) {
      s = dt == TPU_F64 ? "0x7FF8000000000000" : dt == TPU_F16 ? "0x7E00" : dt == TPU_BF16 ? "0x7FC0" : "0x7FC00000";
    } else if (dt == TPU_F64) {
      s = neg ? "0xFFF0000000000000" : "0x7FF0000000000000";
    } else if (dt == TPU_F16) {
      s = neg ? "0xFC00" : "0x7C00";
    } else if (dt == TPU_BF16) {
      s = neg ? "0xFF80" : "0x7F80";
    } else {
      s = neg ? "0xFF800000" : "0x7F800000";
    }
    tpu_hloi_buf_put(m, b, s, strlen(s));
    return;
  }
  /* v is now exactly representable in dt; 9 significant digits identify any
   * f32 (hence f16/bf16) value, 17 any f64. */
  char tmp[64];
  snprintf(tmp, sizeof tmp, dt == TPU_F64 ? "%.17g" : "%.9g", v);
  if (!strpbrk(tmp, ".n")) {
    /* MLIR wants a '.' in a float literal: "1e-30" -> "1.0e-30" */
    char *e = strpbrk(tmp, "eE");
    if (e) {
      memmove(e + 2, e, strlen(e) + 1);
      e[0] = '.';
      e[1] = '0';
    } else {
      strcat(tmp, ".0");
    }
  }
  tpu_hloi_buf_put(m, b, tmp, strlen(tmp));
}

static void tpu_put_scalar_literal(tpu_hlo *m, tpu_buf *b, tpu_dtype dt, double f, int64_t i) {
  if (dt == TPU_PRED)
    tpu_hloi_buf_printf(m, b, "%s", i ? "true" : "false");
  else if (tpu_dtype_is_float(dt))
    tpu_put_float(m, b, dt, f);
  else if (dt == TPU_C64 || dt == TPU_C128) {
    tpu_dtype part = dt == TPU_C64 ? TPU_F32 : TPU_F64;
    tpu_hloi_buf_put(m, b, "(", 1);
    tpu_put_float(m, b, part, f);
    tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_put_float(m, b, part, 0.0);
    tpu_hloi_buf_put(m, b, ")", 1);
  } else if (tpu_dtype_is_unsigned_int(dt)) {
    uint64_t u = (uint64_t)i;
    if (tpu_dtype_size(dt) < 8) u &= ((uint64_t)1 << (8 * tpu_dtype_size(dt))) - 1;
    tpu_hloi_buf_printf(m, b, "%llu", (unsigned long long)u);
  } else {
    int bits = (int)tpu_dtype_size(dt) * 8;
    int64_t v = i;
    if (bits < 64) {
      int64_t lo = -((int64_t)1 << (bits - 1)), hi = ((int64_t)1 << (bits - 1)) - 1;
      uint64_t mask = ((uint64_t)1 << bits) - 1;
      if (v < lo || v > hi) { /* wrap like a C cast */
        uint64_t u = (uint64_t)v & mask;
        v = (u & ((uint64_t)1 << (bits - 1))) ? (int64_t)(u | ~mask) : (int64_t)u;
      }
    }
    tpu_hloi_buf_printf(m, b, "%lld", (long long)v);
  }
}

static tpu_hv tpu_constant(tpu_hlo *m, tpu_dtype dt, double f, int64_t i) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  tpu_hlo_type t = tpu_hlo_type_make(dt, 0, NULL);
  if (!tpu_hloi_type_valid(&t)) {
    tpu_hloi_fail_type(m, "stablehlo.constant", &t);
    return TPU_HV_NONE;
  }
  tpu_attrs a = {0};
  tpu_hloi_buf_put(m, &a.b, "value = dense<", strlen("value = dense<"));
  tpu_put_scalar_literal(m, &a.b, dt, f, i);
  tpu_hloi_buf_put(m, &a.b, "> : ", strlen("> : "));
  tpu_hloi_put_type(m, &a.b, &t);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.constant", NULL, 0, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_constant(tpu_hlo *m, tpu_dtype dt, double v) {
  /* The integer form for integer dtypes: truncated toward zero, saturated
   * to the 64-bit range (a plain cast would be undefined out of range). */
  int64_t i = 0;
  if (isnan(v))
    i = 0;
  else if (v >= 18446744073709551616.0)
    i = dt == TPU_U64 ? -1 : INT64_MAX;
  else if (v >= 9223372036854775808.0)
    i = dt == TPU_U64 ? (int64_t)(uint64_t)v : INT64_MAX;
  else if (v < -9223372036854775808.0)
    i = INT64_MIN;
  else
    i = (int64_t)v;
  return tpu_constant(m, dt, v, i);
}

tpu_hv tpu_hlo_constant_int(tpu_hlo *m, tpu_dtype dt, int64_t v) { return tpu_constant(m, dt, (double)v, v); }

static void tpu_put_nested(tpu_hlo *m, tpu_buf *b, const tpu_hlo_type *t, int d, const int64_t *vals, int64_t *k) {
  if (d == t->rank) {
    tpu_put_scalar_literal(m, b, t->dtype, (double)vals[*k], vals[*k]);
    (*k)++;
    return;
  }
  tpu_hloi_buf_put(m, b, "[", 1);
  for (int64_t i = 0; i < t->dims[d]; i++) {
    if (i) tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_put_nested(m, b, t, d + 1, vals, k);
  }
  tpu_hloi_buf_put(m, b, "]", 1);
}

tpu_hv tpu_hlo_constant_ints(tpu_hlo *m, tpu_hlo_type t, const int64_t *vals) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  if (!tpu_hloi_type_valid(&t) || !(tpu_dtype_is_int(t.dtype) || t.dtype == TPU_PRED)) {
    tpu_hloi_fail_type(m, "stablehlo.constant (integer values)", &t);
    return TPU_HV_NONE;
  }
  tpu_attrs a = {0};
  int64_t k = 0;
  tpu_hloi_buf_put(m, &a.b, "value = dense<", strlen("value = dense<"));
  tpu_put_nested(m, &a.b, &t, 0, vals, &k);
  tpu_hloi_buf_put(m, &a.b, "> : ", strlen("> : "));
  tpu_hloi_put_type(m, &a.b, &t);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.constant", NULL, 0, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_iota(tpu_hlo *m, tpu_hlo_type t, int dim) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  if (dim < 0 || dim >= t.rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.iota: dimension %d out of range for rank %d", dim, t.rank);
    return TPU_HV_NONE;
  }
  if (!tpu_dtype_is_int(t.dtype) && !tpu_dtype_is_float(t.dtype) && !tpu_dtype_is_complex(t.dtype)) {
    tpu_hloi_fail_type(m, "stablehlo.iota", &t);
    return TPU_HV_NONE;
  }
  char attrs[64];
  snprintf(attrs, sizeof attrs, "iota_dimension = %d : i64", dim);
  return tpu_hlo_emit1(m, "stablehlo.iota", NULL, 0, attrs, t);
}

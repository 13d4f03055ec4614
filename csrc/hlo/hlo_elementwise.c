/* hlo_elementwise.c: elementwise ops (see hlo.h; the builder's files are
 * listed in hlo_impl.h).
 *
 * Unary and binary ops by tpu_hlo_op, compare, select, clamp, convert and
 * bitcast_convert. Each op takes only the element types XLA's CPU plugin
 * compiles for it (the table tpu_op_kinds) and refuses the rest here. With
 * exact division on, a float division (or atan2) by a value XLA may see as a
 * broadcast or a constant goes through an optimization barrier, and rsqrt is
 * 1 / sqrt, so that results match torch's CPU kernels.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#include "hlo_impl.h"

static const char *const tpu_op_names[TPU_HLO_NUM_OPS] = {
    [TPU_HLO_ABS] = "abs",
    [TPU_HLO_NEG] = "negate",
    [TPU_HLO_EXP] = "exponential",
    [TPU_HLO_EXPM1] = "exponential_minus_one",
    [TPU_HLO_LOG] = "log",
    [TPU_HLO_LOG1P] = "log_plus_one",
    [TPU_HLO_SQRT] = "sqrt",
    [TPU_HLO_RSQRT] = "rsqrt",
    [TPU_HLO_CBRT] = "cbrt",
    [TPU_HLO_TANH] = "tanh",
    [TPU_HLO_LOGISTIC] = "logistic",
    [TPU_HLO_SIN] = "sine",
    [TPU_HLO_COS] = "cosine",
    [TPU_HLO_TAN] = "tan",
    [TPU_HLO_FLOOR] = "floor",
    [TPU_HLO_CEIL] = "ceil",
    [TPU_HLO_ROUND_EVEN] = "round_nearest_even",
    [TPU_HLO_ROUND_AWAY] = "round_nearest_afz",
    [TPU_HLO_SIGN] = "sign",
    [TPU_HLO_NOT] = "not",
    [TPU_HLO_IS_FINITE] = "is_finite",
    [TPU_HLO_POPCNT] = "popcnt",
    [TPU_HLO_CLZ] = "count_leading_zeros",
    [TPU_HLO_REAL] = "real",
    [TPU_HLO_IMAG] = "imag",
    [TPU_HLO_ADD] = "add",
    [TPU_HLO_SUB] = "subtract",
    [TPU_HLO_MUL] = "multiply",
    [TPU_HLO_DIV] = "divide",
    [TPU_HLO_REM] = "remainder",
    [TPU_HLO_POW] = "power",
    [TPU_HLO_MAX] = "maximum",
    [TPU_HLO_MIN] = "minimum",
    [TPU_HLO_AND] = "and",
    [TPU_HLO_OR] = "or",
    [TPU_HLO_XOR] = "xor",
    [TPU_HLO_ATAN2] = "atan2",
    [TPU_HLO_SHL] = "shift_left",
    [TPU_HLO_SHR_A] = "shift_right_arithmetic",
    [TPU_HLO_SHR_L] = "shift_right_logical",
    [TPU_HLO_COMPLEX] = "complex",
};

static void tpu_opname(char *buf, size_t n, tpu_hlo_op op) {
  snprintf(buf, n, "stablehlo.%s", (op >= 0 && op < TPU_HLO_NUM_OPS && tpu_op_names[op]) ? tpu_op_names[op] : "?");
}

/* Element-type classes an op accepts: those XLA's CPU plugin compiles (each
 * checked against it). Some others do worse than fail: remainder of complex
 * values, and a complex -> real convert, crash the plugin while it lowers
 * the program, so they must never reach it. */
enum { K_PRED = 1, K_SINT = 2, K_UINT = 4, K_FLOAT = 8, K_COMPLEX = 16 };
#define K_INT (K_SINT | K_UINT)
#define K_NUM (K_INT | K_FLOAT | K_COMPLEX)
#define K_ANY (K_PRED | K_NUM)

static const unsigned char tpu_op_kinds[TPU_HLO_NUM_OPS] = {
    [TPU_HLO_ABS] = K_SINT | K_FLOAT | K_COMPLEX,
    [TPU_HLO_NEG] = K_NUM,
    [TPU_HLO_EXP] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_EXPM1] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_LOG] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_LOG1P] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_SQRT] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_RSQRT] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_CBRT] = K_FLOAT,
    [TPU_HLO_TANH] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_LOGISTIC] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_SIN] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_COS] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_TAN] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_FLOOR] = K_FLOAT,
    [TPU_HLO_CEIL] = K_FLOAT,
    [TPU_HLO_ROUND_EVEN] = K_FLOAT,
    [TPU_HLO_ROUND_AWAY] = K_FLOAT,
    [TPU_HLO_SIGN] = K_SINT | K_FLOAT | K_COMPLEX,
    [TPU_HLO_NOT] = K_PRED | K_INT,
    [TPU_HLO_IS_FINITE] = K_FLOAT,
    [TPU_HLO_POPCNT] = K_INT,
    [TPU_HLO_CLZ] = K_INT,
    [TPU_HLO_REAL] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_IMAG] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_ADD] = K_ANY,
    [TPU_HLO_SUB] = K_NUM,
    [TPU_HLO_MUL] = K_ANY,
    [TPU_HLO_DIV] = K_NUM,
    [TPU_HLO_REM] = K_INT | K_FLOAT,
    [TPU_HLO_POW] = K_NUM,
    [TPU_HLO_MAX] = K_ANY,
    [TPU_HLO_MIN] = K_ANY,
    [TPU_HLO_AND] = K_PRED | K_INT,
    [TPU_HLO_OR] = K_PRED | K_INT,
    [TPU_HLO_XOR] = K_PRED | K_INT,
    [TPU_HLO_ATAN2] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_SHL] = K_INT,
    [TPU_HLO_SHR_A] = K_INT,
    [TPU_HLO_SHR_L] = K_INT,
    [TPU_HLO_COMPLEX] = 0, /* f32/f64 only: checked by hand */
};

static unsigned tpu_kind(tpu_dtype dt) {
  return dt == TPU_PRED                  ? K_PRED
         : tpu_dtype_is_signed_int(dt)   ? K_SINT
         : tpu_dtype_is_unsigned_int(dt) ? K_UINT
         : tpu_dtype_is_float(dt)        ? K_FLOAT
         : tpu_dtype_is_complex(dt)      ? K_COMPLEX
                                         : 0;
}

static bool tpu_op_accepts(tpu_hlo *m, const char *name, tpu_hlo_op op, tpu_hv x) {
  tpu_dtype dt = TY(x).dtype;
  bool ok = op == TPU_HLO_COMPLEX ? (dt == TPU_F32 || dt == TPU_F64) : (tpu_op_kinds[op] & tpu_kind(dt)) != 0;
  if (!ok) {
    char s[128];
    tpu_hlo_type_str(&TY(x), s, sizeof s);
    tpu_hlo_fail(m, TPU_ERR_TYPE, "%s: operand type %s has an unsupported element type", name, s);
  }
  return ok;
}

tpu_hv tpu_hlo_unary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (op < 0 || op >= TPU_HLO_ADD) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: op %d is not unary", (int)op);
    return TPU_HV_NONE;
  }
  char name[64];
  tpu_opname(name, sizeof name, op);
  if (!tpu_op_accepts(m, name, op, x)) return TPU_HV_NONE;
  tpu_hlo_type t = TY(x);
  if (op == TPU_HLO_RSQRT && m->exact_div &&
      (t.dtype == TPU_F32 || t.dtype == TPU_F16 || t.dtype == TPU_BF16 || t.dtype == TPU_F64)) {
    /* XLA's CPU rsqrt is approximate (up to 2 ulp); torch's kernel divides 1
     * by the (correctly rounded) sqrt in f32. The barrier keeps XLA from
     * turning 1 / sqrt(x) back into rsqrt(x). */
    tpu_hlo_type t32 = t;
    t32.dtype = t.dtype == TPU_F64 ? TPU_F64 : TPU_F32;
    tpu_hv x32 = tpu_hlo_convert(m, x, t32.dtype);
    tpu_hv r = tpu_hlo_emit1(m, "stablehlo.sqrt", &x32, 1, NULL, t32);
    r = tpu_hlo_emit1(m, "stablehlo.optimization_barrier", &r, 1, TPU_HLO_CPU_EXACT, t32);
    tpu_hv one = tpu_hlo_constant(m, t32.dtype, 1);
    if (t.rank) one = tpu_hlo_broadcast_in_dim(m, one, t.rank, t.dims, NULL);
    return tpu_hlo_convert(m, tpu_hlo_binary(m, TPU_HLO_DIV, one, r), t.dtype);
  }
  if (op == TPU_HLO_IS_FINITE) t.dtype = TPU_PRED;
  if ((op == TPU_HLO_REAL || op == TPU_HLO_IMAG || op == TPU_HLO_ABS) && tpu_dtype_is_complex(t.dtype))
    t.dtype = t.dtype == TPU_C64 ? TPU_F32 : TPU_F64;
  return tpu_hlo_emit1(m, name, &x, 1, NULL, t);
}

void tpu_hlo_set_exact_division(tpu_hlo *m, bool on) { m->exact_div = on; }

tpu_hv tpu_hlo_binary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x, tpu_hv y) {
  tpu_hv ops[2] = {x, y};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  /* XLA's CPU simplifier rewrites A / broadcast(B) into A * broadcast(1 / B)
   * and A / constant into A * (1 / constant): not the correctly rounded
   * quotient that torch computes (1 ulp off in ~1/4 of elements; 0 * inf
   * for 0 / 0 of booleans); and atan2(A, 1) into atan(A), which the newer
   * CPU plugin computes wrongly for 64 elements and more. A barrier keeps
   * such a divisor opaque. */
  if ((op == TPU_HLO_DIV || op == TPU_HLO_ATAN2) && m->exact_div && tpu_hloi_val_at(m, y)->splat &&
      (tpu_dtype_is_float(TY(y).dtype) || tpu_dtype_is_complex(TY(y).dtype))) {
    ops[1] = y = tpu_hlo_emit1(m, "stablehlo.optimization_barrier", &y, 1, TPU_HLO_CPU_EXACT, TY(y));
    if (y == TPU_HV_NONE) return TPU_HV_NONE;
  }
  char name[64];
  tpu_opname(name, sizeof name, op);
  if (op < TPU_HLO_ADD || op >= TPU_HLO_NUM_OPS) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: op %s is not binary", name);
    return TPU_HV_NONE;
  }
  if (!tpu_hlo_type_eq(&TY(x), &TY(y))) {
    tpu_hloi_fail_types(m, name, x, y);
    return TPU_HV_NONE;
  }
  if (!tpu_op_accepts(m, name, op, x)) return TPU_HV_NONE;
  tpu_hlo_type t = TY(x);
  if (op == TPU_HLO_COMPLEX) t.dtype = t.dtype == TPU_F64 ? TPU_C128 : TPU_C64;
  return tpu_hlo_emit1(m, name, ops, 2, NULL, t);
}

tpu_hv tpu_hlo_compare(tpu_hlo *m, tpu_hlo_cmp dir, tpu_hv x, tpu_hv y) {
  tpu_hv ops[2] = {x, y};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  if (!tpu_hlo_type_eq(&TY(x), &TY(y))) {
    tpu_hloi_fail_types(m, "stablehlo.compare", x, y);
    return TPU_HV_NONE;
  }
  static const char *dirs[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  tpu_dtype dt = TY(x).dtype;
  if ((int)dir < 0 || dir > TPU_HLO_GE || (tpu_dtype_is_complex(dt) && dir != TPU_HLO_EQ && dir != TPU_HLO_NE)) {
    tpu_hlo_fail(m, TPU_ERR_TYPE, "stablehlo.compare: direction %d is not defined for %s", (int)dir,
                 tpu_dtype_mlir(dt));
    return TPU_HV_NONE;
  }
  const char *ct = (tpu_dtype_is_float(dt) || tpu_dtype_is_complex(dt)) ? "FLOAT"
                   : tpu_dtype_is_signed_int(dt)                        ? "SIGNED"
                                                                        : "UNSIGNED";
  char attrs[160];
  snprintf(attrs, sizeof attrs,
           "comparison_direction = #stablehlo<comparison_direction %s>, compare_type = #stablehlo<comparison_type %s>",
           dirs[dir], ct);
  tpu_hlo_type t = TY(x);
  t.dtype = TPU_PRED;
  return tpu_hlo_emit1(m, "stablehlo.compare", ops, 2, attrs, t);
}

tpu_hv tpu_hlo_select(tpu_hlo *m, tpu_hv pred, tpu_hv on_true, tpu_hv on_false) {
  tpu_hv ops[3] = {pred, on_true, on_false};
  if (!tpu_hloi_check(m, ops, 3)) return TPU_HV_NONE;
  if (!tpu_hlo_type_eq(&TY(on_true), &TY(on_false))) {
    tpu_hloi_fail_types(m, "stablehlo.select", on_true, on_false);
    return TPU_HV_NONE;
  }
  const tpu_hlo_type *p = &TY(pred);
  tpu_hlo_type want = TY(on_true);
  want.dtype = TPU_PRED;
  if (p->dtype != TPU_PRED || (p->rank != 0 && !tpu_hlo_type_eq(p, &want))) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.select: predicate must be i1 of the operands' shape or 0-d");
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.select", ops, 3, NULL, TY(on_true));
}

tpu_hv tpu_hlo_clamp(tpu_hlo *m, tpu_hv lo, tpu_hv x, tpu_hv hi) {
  tpu_hv ops[3] = {lo, x, hi};
  if (!tpu_hloi_check(m, ops, 3)) return TPU_HV_NONE;
  for (int i = 0; i < 3; i += 2) {
    const tpu_hlo_type *t = &TY(ops[i]);
    if (t->dtype != TY(x).dtype || (t->rank != 0 && !tpu_hlo_type_eq(t, &TY(x)))) {
      tpu_hloi_fail_types(m, "stablehlo.clamp", ops[i], x);
      return TPU_HV_NONE;
    }
  }
  return tpu_hlo_emit1(m, "stablehlo.clamp", ops, 3, NULL, TY(x));
}

tpu_hv tpu_hlo_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (TY(x).dtype == dt) return x;
  tpu_hlo_type t = TY(x);
  t.dtype = dt;
  if (tpu_dtype_is_complex(TY(x).dtype) && dt == TPU_PRED) {
    /* a complex number is true when either part is nonzero (as bool(z) in torch) */
    tpu_hv re = tpu_hlo_convert(m, tpu_hlo_unary(m, TPU_HLO_REAL, x), TPU_PRED);
    return tpu_hlo_binary(m, TPU_HLO_OR, re, tpu_hlo_convert(m, tpu_hlo_unary(m, TPU_HLO_IMAG, x), TPU_PRED));
  }
  if (tpu_dtype_is_complex(TY(x).dtype) && !tpu_dtype_is_complex(dt)) {
    /* XLA rejects complex -> real converts; callers take REAL first. */
    tpu_hlo_fail(m, TPU_ERR_TYPE, "stablehlo.convert: %s to %s drops the imaginary part; take REAL first",
                 tpu_dtype_mlir(TY(x).dtype), tpu_dtype_mlir(dt));
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.convert", &x, 1, NULL, t);
}

tpu_hv tpu_hlo_bitcast_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (tpu_dtype_size(TY(x).dtype) != tpu_dtype_size(dt)) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.bitcast_convert: element sizes differ");
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = TY(x);
  t.dtype = dt;
  return tpu_hlo_emit1(m, "stablehlo.bitcast_convert", &x, 1, NULL, t);
}

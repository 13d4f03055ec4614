/* emit_core.c: emitters the core itself relies on (copies) and the first
 * elementwise ops. */
#include <string.h>

#include "emit.h"

/* tpu::copy(dst, src): dst's view takes src's values, converted to dst's
 * dtype and broadcast to its shape (copy_ semantics). */
void tpu_emit_copy(tpu_lower *L) {
  tpu_lower_write(L, 0, -1, tpu_lower_tensor(L, 1, -1));
  tpu_lower_return_arg(L, 0, -1);
}

/* tpu::materialize(src): a contiguous copy of a view. */
void tpu_emit_materialize(tpu_lower *L) { tpu_lower_out(L, tpu_lower_tensor(L, 0, -1)); }

/* add(self, other, *, alpha=1) */
void tpu_emit_add(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  if (L->nargs > 2 && !L->args[2].is_default && !tpu_lower_is_none(L, 2))
    v[1] = tpu_lower_binary(L, TPU_HLO_MUL, v[1], tpu_lower_scalar(L, 2, dt));
  tpu_lower_out(L, tpu_lower_binary(L, dt == TPU_PRED ? TPU_HLO_OR : TPU_HLO_ADD, v[0], v[1]));
}

/* Whether argument i is a bool tensor or a Python bool. */
static bool tpu_arg_is_bool(tpu_lower *L, int i) {
  if (i >= L->nargs) return false;
  const tpu_arg *a = &L->args[i];
  if (a->kind == TPU_ARG_TENSOR) return a->t.dtype == TPU_PRED;
  return a->kind == TPU_ARG_SCALAR && a->skind == TPU_SCALAR_BOOL;
}

/* torch's sub_check: no subtraction with a bool operand. */
static bool tpu_refuse_bool_sub(tpu_lower *L) {
  bool a = tpu_arg_is_bool(L, 0), b = tpu_arg_is_bool(L, 1);
  if (a && b)
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Subtraction, the `-` operator, with two bool tensors is not supported. "
                   "Use the `^` or `logical_xor()` operator instead.");
  else if (a || b)
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Subtraction, the `-` operator, with a bool tensor is not supported. "
                   "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  return a || b;
}

/* Binary arithmetic on promoted operands 0 and 1; int results for true
 * division are floats (float_result). */
static void tpu_emit_arith(tpu_lower *L, tpu_hlo_op op, bool float_result) {
  if (op == TPU_HLO_SUB && tpu_refuse_bool_sub(L)) return;
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (float_result) dt = tpu_lower_float_type(dt);
  tpu_hv a = tpu_lower_input(L, 0, dt), b = tpu_lower_input(L, 1, dt);
  if (op == TPU_HLO_SUB && L->nargs > 2 && L->args[2].kind == TPU_ARG_SCALAR && !L->args[2].is_default)
    b = tpu_lower_binary(L, TPU_HLO_MUL, b, tpu_lower_scalar(L, 2, dt));
  if (op == TPU_HLO_SUB && dt == TPU_PRED)
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Subtraction, the `-` operator, with two bool tensors is not supported. "
                   "Use the `^` or `logical_xor()` operator instead.");
  if (op == TPU_HLO_MUL && dt == TPU_PRED) op = TPU_HLO_AND;
  tpu_lower_out(L, tpu_lower_binary(L, op, a, b));
}

void tpu_emit_sub(tpu_lower *L) { tpu_emit_arith(L, TPU_HLO_SUB, false); }
void tpu_emit_mul(tpu_lower *L) { tpu_emit_arith(L, TPU_HLO_MUL, false); }
void tpu_emit_maximum(tpu_lower *L) { tpu_emit_arith(L, TPU_HLO_MAX, false); }
void tpu_emit_minimum(tpu_lower *L) { tpu_emit_arith(L, TPU_HLO_MIN, false); }
void tpu_emit_atan2(tpu_lower *L) { tpu_emit_arith(L, TPU_HLO_ATAN2, true); }

/* rsub(self, other, alpha): other - alpha * self */
void tpu_emit_rsub(tpu_lower *L) {
  if (tpu_refuse_bool_sub(L)) return;
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv a = tpu_lower_input(L, 0, dt), b = tpu_lower_input(L, 1, dt);
  if (L->nargs > 2 && L->args[2].kind == TPU_ARG_SCALAR && !L->args[2].is_default)
    a = tpu_lower_binary(L, TPU_HLO_MUL, a, tpu_lower_scalar(L, 2, dt));
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_SUB, b, a));
}

/* div(self, other, *, rounding_mode=None|"trunc"|"floor") */
void tpu_emit_div(tpu_lower *L) {
  tpu_emit_div_rounding(L, (L->nargs > 2 && L->args[2].kind == TPU_ARG_STR) ? L->args[2].str : NULL);
}

void tpu_emit_div_rounding(tpu_lower *L, const char *mode) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (!mode) {
    dt = tpu_lower_float_type(dt);
    tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_DIV, tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)));
    return;
  }
  if (dt == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"%s_cpu\" not implemented for 'Bool'",
                   strcmp(mode, "floor") == 0 ? "div_floor" : "div_trunc");
    return;
  }
  /* half types divide and round in f32, then round once to the result type */
  tpu_dtype out_dt = dt;
  dt = tpu_acc_type(dt);
  tpu_hv a = tpu_lower_input(L, 0, dt), b = tpu_lower_input(L, 1, dt);
  tpu_lower_check_divisor(L, b);
  tpu_hv q = tpu_lower_binary(L, TPU_HLO_DIV, a, b);
  if (strcmp(mode, "trunc") == 0) {
    /* torch's CPU kernel rounds the quotient to the half type before truncating */
    q = tpu_hlo_convert(H, tpu_hlo_convert(H, q, out_dt), dt);
    if (tpu_dtype_is_float(dt)) {
      tpu_hv neg = tpu_hlo_compare(H, TPU_HLO_LT, q, tpu_lower_full_like(L, q, 0));
      q = tpu_hlo_select(H, neg, tpu_hlo_unary(H, TPU_HLO_CEIL, q), tpu_hlo_unary(H, TPU_HLO_FLOOR, q));
    }
  } else if (strcmp(mode, "floor") == 0) {
    if (tpu_dtype_is_float(dt)) {
      /* As torch, step by step in the tensor's own type (half types round
       * after each step): div = (a - fmod(a, b)) / b, one less when the
       * remainder's sign differs from b's, then rounded to the nearest
       * integer; b == 0 keeps a / b (inf or nan). */
      tpu_hv v[2] = {tpu_lower_input(L, 0, out_dt), tpu_lower_input(L, 1, out_dt)};
      tpu_lower_broadcast_all(L, v, 2);
      q = tpu_hlo_convert(H, q, out_dt);
      tpu_hv z = tpu_lower_full_like(L, v[0], 0), one = tpu_lower_full_like(L, v[0], 1);
      tpu_hv mod = tpu_hlo_binary(H, TPU_HLO_REM, v[0], v[1]);
      tpu_hv d = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_hlo_binary(H, TPU_HLO_SUB, v[0], mod), v[1]);
      tpu_hv sdiff = tpu_hlo_compare(H, TPU_HLO_NE, tpu_hlo_compare(H, TPU_HLO_LT, v[1], z),
                                     tpu_hlo_compare(H, TPU_HLO_LT, mod, z));
      tpu_hv adj = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_NE, mod, z), sdiff);
      d = tpu_hlo_select(H, adj, tpu_hlo_binary(H, TPU_HLO_SUB, d, one), d);
      tpu_hv f = tpu_hlo_unary(H, TPU_HLO_FLOOR, d);
      tpu_hv up = tpu_hlo_compare(H, TPU_HLO_GT, tpu_hlo_binary(H, TPU_HLO_SUB, d, f), tpu_lower_full_like(L, d, 0.5));
      f = tpu_hlo_select(H, up, tpu_hlo_binary(H, TPU_HLO_ADD, f, one), f);
      /* a zero quotient takes the sign of a / b (1 / q < 0 tells -0) */
      tpu_hv neg = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_compare(H, TPU_HLO_LT, q, z),
                                  tpu_hlo_compare(H, TPU_HLO_LT, tpu_hlo_binary(H, TPU_HLO_DIV, one, q), z));
      tpu_hv zq = tpu_hlo_select(H, neg, tpu_lower_full_like(L, q, -0.0), z);
      f = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, d, z), zq, f);
      q = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, v[1], z), q, f);
    } else {
      /* integer division truncates; step down when signs differ and it is inexact */
      tpu_hv v[2] = {a, b};
      tpu_lower_broadcast_all(L, v, 2);
      tpu_hv r = tpu_hlo_binary(H, TPU_HLO_REM, v[0], v[1]);
      tpu_hv z = tpu_lower_full_like(L, r, 0);
      tpu_hv inexact = tpu_hlo_compare(H, TPU_HLO_NE, r, z);
      tpu_hv sdiff =
          tpu_hlo_compare(H, TPU_HLO_NE, tpu_hlo_compare(H, TPU_HLO_LT, r, z), tpu_hlo_compare(H, TPU_HLO_LT, v[1], z));
      tpu_hv adj = tpu_hlo_binary(H, TPU_HLO_AND, inexact, sdiff);
      q = tpu_hlo_select(H, adj, tpu_hlo_binary(H, TPU_HLO_SUB, q, tpu_lower_full_like(L, q, 1)), q);
    }
  } else {
    tpu_lower_fail(L, TPU_ERR_VALUE, "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '%s'",
                   mode);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, q, out_dt));
}

/* remainder: Python semantics (sign of the divisor). */
void tpu_emit_remainder(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_lower_check_divisor(L, v[1]);
  tpu_hv r = tpu_hlo_binary(H, TPU_HLO_REM, v[0], v[1]);
  tpu_hv z = tpu_lower_full_like(L, r, 0);
  tpu_hv fix = tpu_hlo_binary(
      H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_NE, r, z),
      tpu_hlo_compare(H, TPU_HLO_NE, tpu_hlo_compare(H, TPU_HLO_LT, r, z), tpu_hlo_compare(H, TPU_HLO_LT, v[1], z)));
  tpu_lower_out(L, tpu_hlo_select(H, fix, tpu_hlo_binary(H, TPU_HLO_ADD, r, v[1]), r));
}

void tpu_emit_pow(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (dt == TPU_PRED && L->args[1].kind != TPU_ARG_SCALAR) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"pow\" not implemented for 'Bool'");
    return;
  }
  if (dt == TPU_PRED) { /* bool tensor ** a Python bool: computed as integers */
    tpu_hv r = tpu_lower_binary(L, TPU_HLO_POW, tpu_lower_input(L, 0, TPU_S32), tpu_lower_input(L, 1, TPU_S32));
    tpu_lower_out(L, tpu_hlo_convert(H, r, TPU_PRED));
    return;
  }
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_POW, tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)));
}

/* ---- unary ----------------------------------------------------------------------------- */

static void tpu_emit_unary_op(tpu_lower *L, tpu_hlo_op op, bool to_float) {
  tpu_dtype dt = L->args[0].t.dtype;
  if (to_float) dt = tpu_lower_float_type(dt);
  tpu_lower_out(L, tpu_hlo_unary(H, op, tpu_lower_input(L, 0, dt)));
}

void tpu_emit_neg(tpu_lower *L) {
  if (L->args[0].t.dtype == TPU_PRED)
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Negation, the `-` operator, on a bool tensor is not supported. "
                   "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  tpu_emit_unary_op(L, TPU_HLO_NEG, false);
}
/* torch's CPU kernels refuse bool for these; so do we, with the same words. */
static bool tpu_refuse_bool(tpu_lower *L, const char *kernel) {
  if (L->args[0].t.dtype != TPU_PRED) return false;
  tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"%s\" not implemented for 'Bool'", kernel);
  return true;
}

void tpu_emit_abs(tpu_lower *L) {
  if (!tpu_refuse_bool(L, "abs_cpu")) tpu_emit_unary_op(L, TPU_HLO_ABS, false);
}
void tpu_emit_exp(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_EXP, true); }
void tpu_emit_expm1(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_EXPM1, true); }
void tpu_emit_log(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_LOG, true); }
void tpu_emit_log1p(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_LOG1P, true); }
void tpu_emit_sqrt(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_SQRT, true); }
void tpu_emit_rsqrt(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_RSQRT, true); }
void tpu_emit_sin(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_SIN, true); }
void tpu_emit_cos(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_COS, true); }
void tpu_emit_tanh(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_TANH, true); }
void tpu_emit_sigmoid(tpu_lower *L) { tpu_emit_unary_op(L, TPU_HLO_LOGISTIC, true); }
void tpu_emit_floor(tpu_lower *L) {
  if (tpu_refuse_bool(L, "floor_vml_cpu")) return;
  if (!tpu_dtype_is_float(L->args[0].t.dtype))
    tpu_lower_out(L, tpu_lower_tensor(L, 0, -1));
  else
    tpu_emit_unary_op(L, TPU_HLO_FLOOR, false);
}
void tpu_emit_ceil(tpu_lower *L) {
  if (tpu_refuse_bool(L, "ceil_vml_cpu")) return;
  if (!tpu_dtype_is_float(L->args[0].t.dtype))
    tpu_lower_out(L, tpu_lower_tensor(L, 0, -1));
  else
    tpu_emit_unary_op(L, TPU_HLO_CEIL, false);
}
void tpu_emit_round(tpu_lower *L) {
  if (tpu_refuse_bool(L, "round_vml_cpu")) return;
  if (!tpu_dtype_is_float(L->args[0].t.dtype))
    tpu_lower_out(L, tpu_lower_tensor(L, 0, -1));
  else
    tpu_emit_unary_op(L, TPU_HLO_ROUND_EVEN, false);
}
/* sign as torch's CPU kernel computes it, (0 < x) - (x < 0): NaN gives 0. */
tpu_hv tpu_sign_v(tpu_lower *L, tpu_hv x) {
  tpu_hv s = tpu_hlo_unary(H, TPU_HLO_SIGN, x);
  if (!tpu_dtype_is_float(T(L, x)->dtype)) return s;
  return tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, x, x), tpu_lower_full_like(L, x, 0), s);
}
void tpu_emit_sign(tpu_lower *L) {
  if (L->args[0].t.dtype == TPU_PRED)
    tpu_lower_out(L, tpu_lower_tensor(L, 0, -1));
  else
    tpu_lower_out(L, tpu_sign_v(L, tpu_lower_tensor(L, 0, -1)));
}
void tpu_emit_reciprocal(tpu_lower *L) {
  tpu_dtype dt = tpu_lower_float_type(L->args[0].t.dtype);
  tpu_hv x = tpu_lower_input(L, 0, dt);
  tpu_lower_out(L, tpu_hlo_binary(H, TPU_HLO_DIV, tpu_lower_full_like(L, x, 1), x));
}
void tpu_emit_relu(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (T(L, x)->dtype == TPU_PRED) tpu_lower_fail(L, TPU_ERR_RUNTIME, "Boolean inputs not supported for relu");
  tpu_lower_out(L, tpu_hlo_binary(H, TPU_HLO_MAX, x, tpu_lower_full_like(L, x, 0)));
}
void tpu_emit_logical_not(tpu_lower *L) {
  tpu_hv x = tpu_lower_input(L, 0, TPU_PRED);
  tpu_lower_out(L, tpu_hlo_unary(H, TPU_HLO_NOT, x));
}
void tpu_emit_bitwise_not(tpu_lower *L) {
  if (tpu_dtype_is_float(L->args[0].t.dtype))
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"bitwise_not_cpu\" not implemented for '%s'",
                   tpu_dtype_c10_name(L->args[0].t.dtype));
  tpu_lower_out(L, tpu_hlo_unary(H, TPU_HLO_NOT, tpu_lower_tensor(L, 0, -1)));
}
static void tpu_emit_logical(tpu_lower *L, tpu_hlo_op op) {
  tpu_hv a = tpu_lower_input(L, 0, TPU_PRED), b = tpu_lower_input(L, 1, TPU_PRED);
  tpu_lower_out(L, tpu_lower_binary(L, op, a, b));
}
void tpu_emit_logical_and(tpu_lower *L) { tpu_emit_logical(L, TPU_HLO_AND); }
void tpu_emit_logical_or(tpu_lower *L) { tpu_emit_logical(L, TPU_HLO_OR); }
void tpu_emit_logical_xor(tpu_lower *L) { tpu_emit_logical(L, TPU_HLO_XOR); }
static void tpu_emit_bitwise(tpu_lower *L, tpu_hlo_op op) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (tpu_dtype_is_float(dt) || tpu_dtype_is_complex(dt))
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"%s_cpu\" not implemented for '%s'",
                   op == TPU_HLO_AND  ? "bitwise_and"
                   : op == TPU_HLO_OR ? "bitwise_or"
                                      : "bitwise_xor",
                   tpu_dtype_c10_name(dt));
  tpu_lower_out(L, tpu_lower_binary(L, op, tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)));
}
void tpu_emit_bitwise_and(tpu_lower *L) { tpu_emit_bitwise(L, TPU_HLO_AND); }
void tpu_emit_bitwise_or(tpu_lower *L) { tpu_emit_bitwise(L, TPU_HLO_OR); }
void tpu_emit_bitwise_xor(tpu_lower *L) { tpu_emit_bitwise(L, TPU_HLO_XOR); }

/* erf in f32: a rational approximation on [-4, 4] (beyond it erf is +-1 in
 * f32), the odd numerator and even denominator evaluated by Horner's rule. */
static tpu_hv tpu_erf_f32(tpu_lower *L, tpu_hv x) {
  static const double alpha[] = {-2.72614225801306e-10, 2.77068142495902e-08,  -2.10102402082508e-06,
                                 -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                 -1.60960333262415e-02};
  static const double beta[] = {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                -7.37332916720468e-03, -1.42647390514189e-02};
  x = tpu_hlo_clamp(H, tpu_hlo_constant(H, TPU_F32, -4.0), x, tpu_hlo_constant(H, TPU_F32, 4.0));
  tpu_hv x2 = tpu_hlo_binary(H, TPU_HLO_MUL, x, x);
  tpu_hv p = tpu_lower_full_like(L, x, alpha[0]);
  for (int i = 1; i < 7; i++)
    p = tpu_hlo_binary(H, TPU_HLO_ADD, tpu_hlo_binary(H, TPU_HLO_MUL, p, x2), tpu_lower_full_like(L, x, alpha[i]));
  p = tpu_hlo_binary(H, TPU_HLO_MUL, p, x);
  tpu_hv q = tpu_lower_full_like(L, x, beta[0]);
  for (int i = 1; i < 5; i++)
    q = tpu_hlo_binary(H, TPU_HLO_ADD, tpu_hlo_binary(H, TPU_HLO_MUL, q, x2), tpu_lower_full_like(L, x, beta[i]));
  return tpu_hlo_binary(H, TPU_HLO_DIV, p, q);
}

static tpu_hv tpu_erf(tpu_lower *L, tpu_hv x) {
  tpu_dtype dt = T(L, x)->dtype;
  return tpu_hlo_convert(H, tpu_erf_f32(L, tpu_hlo_convert(H, x, TPU_F32)), dt);
}

void tpu_emit_erf(tpu_lower *L) {
  tpu_dtype dt = tpu_lower_float_type(L->args[0].t.dtype);
  tpu_lower_out(L, tpu_erf(L, tpu_lower_input(L, 0, dt)));
}

static bool tpu_gelu_tanh(tpu_lower *L, int i) {
  return i < L->nargs && L->args[i].kind == TPU_ARG_STR && strcmp(L->args[i].str, "tanh") == 0;
}

void tpu_emit_gelu(tpu_lower *L) {
  if (L->nargs > 1 && L->args[1].kind == TPU_ARG_STR && strcmp(L->args[1].str, "none") &&
      strcmp(L->args[1].str, "tanh")) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "approximate argument must be either none or tanh.");
    return;
  }
  tpu_dtype dt = L->args[0].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc), y;
  if (tpu_gelu_tanh(L, 1)) {
    tpu_hv inner = tpu_mul(L, tpu_k(L, x, 0.7978845608028654),
                           tpu_add(L, x, tpu_mul(L, tpu_k(L, x, 0.044715), tpu_mul(L, x, tpu_mul(L, x, x)))));
    y = tpu_mul(L, tpu_mul(L, tpu_k(L, x, 0.5), x), tpu_add(L, tpu_k(L, x, 1), tpu_hlo_unary(H, TPU_HLO_TANH, inner)));
  } else {
    tpu_hv e = tpu_erf(L, tpu_mul(L, x, tpu_k(L, x, 0.7071067811865476)));
    y = tpu_mul(L, tpu_mul(L, tpu_k(L, x, 0.5), x), tpu_add(L, tpu_k(L, x, 1), e));
  }
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* gelu_backward(grad_output, self, approximate) */
void tpu_emit_gelu_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[1].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv g = tpu_lower_input(L, 0, acc), x = tpu_lower_input(L, 1, acc), d;
  if (tpu_gelu_tanh(L, 2)) {
    tpu_hv x2 = tpu_mul(L, x, x);
    tpu_hv inner = tpu_mul(L, tpu_k(L, x, 0.7978845608028654),
                           tpu_add(L, x, tpu_mul(L, tpu_k(L, x, 0.044715), tpu_mul(L, x2, x))));
    tpu_hv t = tpu_hlo_unary(H, TPU_HLO_TANH, inner);
    tpu_hv dinner = tpu_mul(L, tpu_k(L, x, 0.7978845608028654),
                            tpu_add(L, tpu_k(L, x, 1), tpu_mul(L, tpu_k(L, x, 3 * 0.044715), x2)));
    tpu_hv left = tpu_mul(L, tpu_k(L, x, 0.5), tpu_add(L, tpu_k(L, x, 1), t));
    tpu_hv right =
        tpu_mul(L, tpu_mul(L, tpu_k(L, x, 0.5), x), tpu_mul(L, tpu_sub(L, tpu_k(L, x, 1), tpu_mul(L, t, t)), dinner));
    d = tpu_add(L, left, right);
  } else {
    tpu_hv cdf = tpu_mul(L, tpu_k(L, x, 0.5),
                         tpu_add(L, tpu_k(L, x, 1), tpu_erf(L, tpu_mul(L, x, tpu_k(L, x, 0.7071067811865476)))));
    tpu_hv pdf = tpu_mul(L, tpu_k(L, x, 0.3989422804014327),
                         tpu_hlo_unary(H, TPU_HLO_EXP, tpu_mul(L, tpu_k(L, x, -0.5), tpu_mul(L, x, x))));
    d = tpu_add(L, cdf, tpu_mul(L, x, pdf));
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_lower_binary(L, TPU_HLO_MUL, g, d), dt));
}

void tpu_emit_silu(tpu_lower *L) {
  tpu_dtype dt = tpu_lower_float_type(L->args[0].t.dtype);
  tpu_hv x = tpu_lower_input(L, 0, dt);
  tpu_lower_out(L, tpu_mul(L, x, tpu_hlo_unary(H, TPU_HLO_LOGISTIC, x)));
}

void tpu_emit_silu_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[1].t.dtype;
  tpu_hv g = tpu_lower_input(L, 0, dt), x = tpu_lower_input(L, 1, dt);
  tpu_hv s = tpu_hlo_unary(H, TPU_HLO_LOGISTIC, x);
  tpu_hv d = tpu_mul(L, s, tpu_add(L, tpu_k(L, x, 1), tpu_mul(L, x, tpu_sub(L, tpu_k(L, x, 1), s))));
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_MUL, g, d));
}

/* tanh_backward(grad_output, output) = g * (1 - y^2) */
void tpu_emit_tanh_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[1].t.dtype;
  tpu_hv g = tpu_lower_input(L, 0, dt), y = tpu_lower_input(L, 1, dt);
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_MUL, g, tpu_sub(L, tpu_k(L, y, 1), tpu_mul(L, y, y))));
}

/* sigmoid_backward(grad_output, output) = g * y * (1 - y) */
void tpu_emit_sigmoid_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[1].t.dtype;
  tpu_hv g = tpu_lower_input(L, 0, dt), y = tpu_lower_input(L, 1, dt);
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_MUL, g, tpu_mul(L, y, tpu_sub(L, tpu_k(L, y, 1), y))));
}

/* threshold_backward(grad_output, self, threshold): grad where self > threshold */
void tpu_emit_threshold_backward(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv th = tpu_lower_broadcast_to(L, tpu_lower_scalar(L, 2, dt), T(L, v[1])->rank, T(L, v[1])->dims);
  tpu_hv keep = tpu_hlo_compare(H, TPU_HLO_GT, v[1], th);
  tpu_lower_out(L, tpu_hlo_select(H, keep, v[0], tpu_k(L, v[0], 0)));
}

/* ---- comparisons, where, clamp ------------------------------------------------------- */

static void tpu_emit_cmp(tpu_lower *L, tpu_hlo_cmp dir) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_lower_out(L, tpu_hlo_compare(H, dir, v[0], v[1]));
}
void tpu_emit_eq(tpu_lower *L) { tpu_emit_cmp(L, TPU_HLO_EQ); }
void tpu_emit_ne(tpu_lower *L) { tpu_emit_cmp(L, TPU_HLO_NE); }
void tpu_emit_lt(tpu_lower *L) { tpu_emit_cmp(L, TPU_HLO_LT); }
void tpu_emit_le(tpu_lower *L) { tpu_emit_cmp(L, TPU_HLO_LE); }
void tpu_emit_gt(tpu_lower *L) { tpu_emit_cmp(L, TPU_HLO_GT); }
void tpu_emit_ge(tpu_lower *L) { tpu_emit_cmp(L, TPU_HLO_GE); }

/* where(condition, self, other) */
void tpu_emit_where(tpu_lower *L) {
  int idx[2] = {1, 2};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[3] = {tpu_lower_input(L, 0, TPU_PRED), tpu_lower_input(L, 1, dt), tpu_lower_input(L, 2, dt)};
  tpu_lower_broadcast_all(L, v, 3);
  tpu_lower_out(L, tpu_hlo_select(H, v[0], v[1], v[2]));
}

/* masked_fill(self, mask, value) */
void tpu_emit_masked_fill(tpu_lower *L) {
  tpu_dtype dt = L->args[0].t.dtype;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv m = tpu_lower_input(L, 1, TPU_PRED);
  tpu_hv val;
  if (L->args[2].kind == TPU_ARG_SCALAR) {
    val = tpu_lower_scalar(L, 2, dt);
  } else {
    if (L->args[2].t.rank != 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "masked_fill_ only supports a 0-dimensional value tensor, but got tensor "
                     "with %d dimension(s).",
                     L->args[2].t.rank);
      return;
    }
    val = tpu_lower_tensor(L, 2, -1);
    tpu_lower_check_fits(L, val, dt); /* the CPU reads the value and converts it checked */
    if (tpu_dtype_is_complex(T(L, val)->dtype) && !tpu_dtype_is_complex(dt)) val = tpu_hlo_unary(H, TPU_HLO_REAL, val);
    val = tpu_hlo_reshape(H, tpu_hlo_convert(H, val, dt), 0, NULL);
  }
  /* out of place, self and mask broadcast together; in place, mask to self */
  if (!(L->flags & TPU_OP_INPLACE)) {
    tpu_hv v[2] = {x, m};
    tpu_lower_broadcast_all(L, v, 2);
    x = v[0], m = v[1];
  }
  const tpu_hlo_type *xt = T(L, x);
  m = tpu_lower_broadcast_to(L, m, xt->rank, xt->dims);
  tpu_lower_out(L, tpu_hlo_select(H, m, tpu_lower_broadcast_to(L, val, xt->rank, xt->dims), x));
}

/* clamp(self, min=None, max=None): Scalar or Tensor bounds */
void tpu_emit_clamp(tpu_lower *L) {
  int idx[3] = {0, 1, 2};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 3);
  if (dt == TPU_PRED && (L->args[1].kind == TPU_ARG_TENSOR || L->args[2].kind == TPU_ARG_TENSOR)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"clamp_cpu\" not implemented for 'Bool'");
    return;
  }
  tpu_hv x = tpu_lower_input(L, 0, dt);
  if (tpu_lower_is_none(L, 1) && tpu_lower_is_none(L, 2))
    tpu_lower_fail(L, TPU_ERR_VALUE, "torch.clamp: At least one of 'min' or 'max' must not be None");
  if (!tpu_lower_is_none(L, 1)) x = tpu_lower_binary(L, TPU_HLO_MAX, x, tpu_lower_input(L, 1, dt));
  if (!tpu_lower_is_none(L, 2)) x = tpu_lower_binary(L, TPU_HLO_MIN, x, tpu_lower_input(L, 2, dt));
  tpu_lower_out(L, x);
}
void tpu_emit_clamp_min(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_MAX, tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)));
}
void tpu_emit_clamp_max(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_MIN, tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)));
}

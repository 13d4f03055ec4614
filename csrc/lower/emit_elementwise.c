/* emit_elementwise.c: elementwise arithmetic, math, logic and comparisons:
 * add ... pow and the other binary ops (fmod, copysign, xlogy, logaddexp,
 * shifts, lerp, addcmul), the unary functions, complex numbers (complex,
 * polar, conj_physical, angle), logical and bitwise ops, comparisons,
 * where, masked_fill and clamp.
 *
 * Most unary ops are one StableHLO op, or one CHLO op (XLA legalises CHLO
 * when it compiles a StableHLO module, with its own accurate expansions), on
 * the input promoted to a float type; half types compute in f32 and round
 * once, as torch's CPU kernels do. hypot is the worked example of
 * notes/adding_an_op.md. */
#include <math.h>
#include <string.h>

#include "emit.h"

#define TPU_LN2 0.69314718055994530942
#define TPU_LN10 2.30258509299404568402

/* ---- helpers --------------------------------------------------------------------------- */

/* Input i promoted to the default float type if it is not floating. */
static tpu_hv tpu_float_in(tpu_lower *L, int i) {
  return tpu_lower_input(L, i, tpu_lower_float_type(tpu_arg_dtype(L, i)));
}

/* ---- arithmetic ----------------------------------------------------------------------------- */

/* torch's alpha_check: alpha (argument i, a Python number) must be of a kind
 * the result's dtype dt holds. */
static bool tpu_alpha_ok(tpu_lower *L, int i, tpu_dtype dt) {
  if (i >= L->nargs || L->args[i].kind != TPU_ARG_SCALAR) return true;
  tpu_scalar_kind k = L->args[i].skind;
  if (k == TPU_SCALAR_BOOL && dt != TPU_PRED)
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Boolean alpha only supported for Boolean results.");
  else if (k == TPU_SCALAR_FLOAT && !tpu_dtype_is_float(dt) && !tpu_dtype_is_complex(dt))
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "For integral input tensors, argument alpha must not be a floating point number.");
  else if (k == TPU_SCALAR_COMPLEX && !tpu_dtype_is_complex(dt))
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "For non-complex input tensors, argument alpha must not be a complex number.");
  else
    return true;
  return false;
}

/* add(self, other, *, alpha=1) */
void tpu_emit_add(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (!tpu_alpha_ok(L, 2, dt)) return;
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
    tpu_lower_fail(L, tpu_lower_check_code(TPU_COMPAT_BOOL_SUB),
                   "Subtraction, the `-` operator, with two bool tensors is not supported. "
                   "Use the `^` or `logical_xor()` operator instead.");
  else if (a || b)
    tpu_lower_fail(L, tpu_lower_check_code(TPU_COMPAT_BOOL_SUB),
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
  if (op == TPU_HLO_SUB && !tpu_alpha_ok(L, 2, dt)) return;
  tpu_hv a = tpu_lower_input(L, 0, dt), b = tpu_lower_input(L, 1, dt);
  if (op == TPU_HLO_SUB && L->nargs > 2 && L->args[2].kind == TPU_ARG_SCALAR && !L->args[2].is_default)
    b = tpu_lower_binary(L, TPU_HLO_MUL, b, tpu_lower_scalar(L, 2, dt));
  if (op == TPU_HLO_SUB && dt == TPU_PRED)
    tpu_lower_fail(L, tpu_lower_check_code(TPU_COMPAT_BOOL_SUB),
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
  if (!tpu_alpha_ok(L, 2, dt)) return;
  tpu_hv a = tpu_lower_input(L, 0, dt), b = tpu_lower_input(L, 1, dt);
  if (L->nargs > 2 && L->args[2].kind == TPU_ARG_SCALAR && !L->args[2].is_default)
    a = tpu_lower_binary(L, TPU_HLO_MUL, a, tpu_lower_scalar(L, 2, dt));
  tpu_lower_out(L, tpu_lower_binary(L, TPU_HLO_SUB, b, a));
}

/* div of arguments 0 and 1 with rounding mode NULL, "trunc" or "floor". */
static void tpu_emit_div_rounding(tpu_lower *L, const char *mode) {
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

/* div(self, other, *, rounding_mode=None|"trunc"|"floor") */
void tpu_emit_div(tpu_lower *L) {
  tpu_emit_div_rounding(L, (L->nargs > 2 && L->args[2].kind == TPU_ARG_STR) ? L->args[2].str : NULL);
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

/* hypot(self, other) = sqrt(self^2 + other^2), floats only */
void tpu_emit_hypot(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_float_type(tpu_lower_result_type(L, idx, 2));
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv s = tpu_add(L, tpu_mul(L, v[0], v[0]), tpu_mul(L, v[1], v[1]));
  tpu_lower_out(L, tpu_hlo_unary(L->hlo, TPU_HLO_SQRT, s));
}

/* ---- other binary ops ----------------------------------------------------------------------- */

/* Arguments 0 and 1 promoted together (to a float type when to_float) and broadcast. */
static tpu_dtype tpu_bin_in(tpu_lower *L, tpu_hv *v, bool to_float) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (to_float) dt = tpu_lower_float_type(dt);
  v[0] = tpu_lower_input(L, 0, dt);
  v[1] = tpu_lower_input(L, 1, dt);
  tpu_lower_broadcast_all(L, v, 2);
  return dt;
}

/* fmod: C's fmod (truncated), the sign of the dividend */
void tpu_emit_fmod(tpu_lower *L) {
  tpu_hv v[2];
  tpu_dtype dt = tpu_bin_in(L, v, false);
  if (dt == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"fmod_cpu\" not implemented for 'Bool'");
    return;
  }
  tpu_lower_check_divisor(L, v[1]);
  tpu_lower_out(L, tpu_hlo_binary(H, TPU_HLO_REM, v[0], v[1]));
}

/* fmax/fmin: NaN only when both are NaN */
static void tpu_emit_fmaxmin(tpu_lower *L, tpu_hlo_op op) {
  tpu_hv v[2];
  tpu_dtype dt = tpu_bin_in(L, v, false);
  tpu_hv m = tpu_hlo_binary(H, op, v[0], v[1]);
  if (tpu_dtype_is_float(dt)) {
    m = tpu_sel(L, tpu_isnan(L, v[0]), v[1], m);
    m = tpu_sel(L, tpu_isnan(L, v[1]), v[0], m);
  }
  tpu_lower_out(L, m);
}
void tpu_emit_fmax(tpu_lower *L) { tpu_emit_fmaxmin(L, TPU_HLO_MAX); }
void tpu_emit_fmin(tpu_lower *L) { tpu_emit_fmaxmin(L, TPU_HLO_MIN); }

static tpu_hv tpu_signbit_v(tpu_lower *L, tpu_hv x) {
  tpu_dtype dt = T(L, x)->dtype;
  tpu_dtype it = tpu_dtype_size(dt) == 8 ? TPU_S64 : tpu_dtype_size(dt) == 4 ? TPU_S32 : TPU_S16;
  tpu_hv b = tpu_hlo_bitcast_convert(H, x, it);
  return tpu_cmp(L, TPU_HLO_LT, b, tpu_k(L, b, 0));
}

void tpu_emit_copysign(tpu_lower *L) {
  tpu_hv v[2];
  tpu_bin_in(L, v, true);
  tpu_hv a = tpu_un(L, TPU_HLO_ABS, v[0]);
  tpu_lower_out(L, tpu_sel(L, tpu_signbit_v(L, v[1]), tpu_un(L, TPU_HLO_NEG, a), a));
}

/* xlogy(x, y) = x * log(y), 0 where x == 0 unless y is NaN */
void tpu_emit_xlogy(tpu_lower *L) {
  tpu_hv v[2];
  tpu_bin_in(L, v, true);
  tpu_hv x = v[0], y = v[1];
  tpu_hv r = tpu_mul(L, x, tpu_un(L, TPU_HLO_LOG, y));
  r = tpu_sel(L, tpu_cmp(L, TPU_HLO_EQ, x, tpu_k(L, x, 0)), tpu_k(L, x, 0), r);
  tpu_lower_out(L, tpu_sel(L, tpu_isnan(L, y), y, r));
}

/* logaddexp(a, b) = max + log1p(exp(-|a - b|)); equal infinities give themselves */
static void tpu_emit_logaddexp_base(tpu_lower *L, bool base2) {
  tpu_hv v[2];
  tpu_dtype dt = tpu_bin_in(L, v, true), acc = tpu_acc_type(dt);
  tpu_hv a = tpu_hlo_convert(H, v[0], acc), b = tpu_hlo_convert(H, v[1], acc);
  tpu_hv m = tpu_hlo_binary(H, TPU_HLO_MAX, a, b);
  tpu_hv d = tpu_un(L, TPU_HLO_NEG, tpu_un(L, TPU_HLO_ABS, tpu_sub(L, a, b)));
  tpu_hv r;
  if (base2)
    r = tpu_add(L, m,
                tpu_mul(L, tpu_un(L, TPU_HLO_LOG1P, tpu_hlo_binary(H, TPU_HLO_POW, tpu_k(L, d, 2.0), d)),
                        tpu_k(L, d, 1.0 / TPU_LN2)));
  else
    r = tpu_add(L, m, tpu_un(L, TPU_HLO_LOG1P, tpu_un(L, TPU_HLO_EXP, d)));
  tpu_hv same_inf = tpu_hlo_binary(H, TPU_HLO_AND, tpu_cmp(L, TPU_HLO_EQ, a, b),
                                   tpu_cmp(L, TPU_HLO_EQ, tpu_un(L, TPU_HLO_ABS, a), tpu_k(L, a, INFINITY)));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_sel(L, same_inf, a, r), dt));
}
void tpu_emit_logaddexp(tpu_lower *L) { tpu_emit_logaddexp_base(L, false); }
void tpu_emit_logaddexp2(tpu_lower *L) { tpu_emit_logaddexp_base(L, true); }

void tpu_emit_floor_divide(tpu_lower *L) { tpu_emit_div_rounding(L, "floor"); }

void tpu_emit_nextafter(tpu_lower *L) {
  tpu_hv v[2];
  tpu_bin_in(L, v, true);
  tpu_hlo_type t = *T(L, v[0]);
  tpu_lower_out(L, tpu_hlo_emit1(H, "chlo.next_after", v, 2, NULL, t));
}

static void tpu_emit_shift(tpu_lower *L, bool left) {
  tpu_hv v[2];
  tpu_dtype dt = tpu_bin_in(L, v, false);
  if (tpu_dtype_is_float(dt) || dt == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"%s_cpu\" not implemented for '%s'", left ? "lshift" : "rshift",
                   tpu_dtype_name(dt));
    return;
  }
  tpu_hlo_op op = left ? TPU_HLO_SHL : tpu_dtype_is_unsigned_int(dt) ? TPU_HLO_SHR_L : TPU_HLO_SHR_A;
  tpu_lower_out(L, tpu_hlo_binary(H, op, v[0], v[1]));
}
void tpu_emit_bitwise_left_shift(tpu_lower *L) { tpu_emit_shift(L, true); }
void tpu_emit_bitwise_right_shift(tpu_lower *L) { tpu_emit_shift(L, false); }

/* lerp(self, end, weight): PyTorch's two-sided formula for accuracy near 1 */
void tpu_emit_lerp(tpu_lower *L) {
  int idx[3] = {0, 1, 2};
  tpu_dtype dt = tpu_lower_result_type(L, idx, L->args[2].kind == TPU_ARG_TENSOR ? 3 : 2), acc = tpu_acc_type(dt);
  tpu_hv v[3] = {tpu_lower_input(L, 0, acc), tpu_lower_input(L, 1, acc), tpu_lower_input(L, 2, acc)};
  tpu_lower_broadcast_all(L, v, 3);
  tpu_hv a = v[0], b = v[1], w = v[2];
  tpu_hv diff = tpu_sub(L, b, a);
  tpu_hv lo = tpu_add(L, a, tpu_mul(L, w, diff));
  tpu_hv hi = tpu_sub(L, b, tpu_mul(L, diff, tpu_sub(L, tpu_k(L, w, 1), w)));
  tpu_hv r = tpu_sel(L, tpu_cmp(L, TPU_HLO_LT, tpu_un(L, TPU_HLO_ABS, w), tpu_k(L, w, 0.5)), lo, hi);
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* addcmul/addcdiv(self, tensor1, tensor2, *, value=1) */
static void tpu_emit_addc(tpu_lower *L, bool div) {
  int idx[3] = {0, 1, 2};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 3);
  if (div && !tpu_dtype_is_float(dt) && !tpu_dtype_is_complex(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Integer division with addcdiv is no longer supported, and in a future release addcdiv will "
                   "perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be "
                   "implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer "
                   "inputs and as (input + value * tensor1 / tensor2) for float inputs. The future addcdiv "
                   "behavior is just the latter implementation: (input + value * tensor1 / tensor2), for all "
                   "dtypes.");
    return;
  }
  tpu_dtype acc = tpu_acc_type(dt);
  tpu_hv v[3] = {tpu_lower_input(L, 0, acc), tpu_lower_input(L, 1, acc), tpu_lower_input(L, 2, acc)};
  tpu_lower_broadcast_all(L, v, 3);
  tpu_hv p = div ? tpu_div(L, v[1], v[2]) : tpu_mul(L, v[1], v[2]);
  if (!L->args[3].is_default) p = tpu_mul(L, tpu_scalar_like(L, 3, p), p);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_add(L, v[0], p), dt));
}
void tpu_emit_addcmul(tpu_lower *L) { tpu_emit_addc(L, false); }
void tpu_emit_addcdiv(tpu_lower *L) { tpu_emit_addc(L, true); }

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
  if (tpu_refuse_bool(L, "abs_cpu")) return;
  /* |z| is real: torch refuses to write it into a complex self in place (abs.out may) */
  if ((L->flags & TPU_OP_INPLACE) && tpu_dtype_is_complex(L->args[0].t.dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "In-place abs is not supported for complex tensors.");
    return;
  }
  tpu_emit_unary_op(L, TPU_HLO_ABS, false);
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
static tpu_hv tpu_sign_v(tpu_lower *L, tpu_hv x) {
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

tpu_hv tpu_erf(tpu_lower *L, tpu_hv x) {
  tpu_dtype dt = T(L, x)->dtype;
  return tpu_hlo_convert(H, tpu_erf_f32(L, tpu_hlo_convert(H, x, TPU_F32)), dt);
}

void tpu_emit_erf(tpu_lower *L) {
  tpu_dtype dt = tpu_lower_float_type(L->args[0].t.dtype);
  tpu_lower_out(L, tpu_erf(L, tpu_lower_input(L, 0, dt)));
}

#define TPU_CHLO_UNARY(op, name)                                                            \
  static tpu_hv tpu_f_##op(tpu_lower *L, tpu_hv x) { return tpu_named_op(L, name, &x, 1); } \
  void tpu_emit_##op(tpu_lower *L) { tpu_float_unary(L, tpu_f_##op); }

TPU_CHLO_UNARY(acos, "chlo.acos")
TPU_CHLO_UNARY(asin, "chlo.asin")
/* atan(x) = atan2(x, 1): the newer XLA CPU plugin's atan is wrong for arrays
 * of 64 elements and more (up to 20 off); its atan2 is right (the builder
 * keeps the 1 opaque on CPU, or XLA turns atan2(x, 1) back into atan). */
static tpu_hv tpu_f_atan(tpu_lower *L, tpu_hv x) { return tpu_hlo_binary(H, TPU_HLO_ATAN2, x, tpu_k(L, x, 1.0)); }
void tpu_emit_atan(tpu_lower *L) { tpu_float_unary(L, tpu_f_atan); }
TPU_CHLO_UNARY(acosh, "chlo.acosh")
TPU_CHLO_UNARY(asinh, "chlo.asinh")
TPU_CHLO_UNARY(atanh, "chlo.atanh")
TPU_CHLO_UNARY(cosh, "chlo.cosh")
TPU_CHLO_UNARY(sinh, "chlo.sinh")
TPU_CHLO_UNARY(tan, "stablehlo.tan")
TPU_CHLO_UNARY(erfc, "chlo.erfc")
TPU_CHLO_UNARY(erfinv, "chlo.erf_inv")
TPU_CHLO_UNARY(lgamma, "chlo.lgamma")
/* digamma: emit_special.c (torch's poles) */

static tpu_hv tpu_f_exp2(tpu_lower *L, tpu_hv x) { return tpu_hlo_binary(H, TPU_HLO_POW, tpu_k(L, x, 2.0), x); }
static tpu_hv tpu_f_log2(tpu_lower *L, tpu_hv x) {
  return tpu_mul(L, tpu_un(L, TPU_HLO_LOG, x), tpu_k(L, x, 1.0 / TPU_LN2));
}
static tpu_hv tpu_f_log10(tpu_lower *L, tpu_hv x) {
  return tpu_mul(L, tpu_un(L, TPU_HLO_LOG, x), tpu_k(L, x, 1.0 / TPU_LN10));
}
void tpu_emit_exp2(tpu_lower *L) { tpu_float_unary(L, tpu_f_exp2); }
void tpu_emit_log2(tpu_lower *L) { tpu_float_unary(L, tpu_f_log2); }
void tpu_emit_log10(tpu_lower *L) { tpu_float_unary(L, tpu_f_log10); }

static tpu_hv tpu_trunc_v(tpu_lower *L, tpu_hv x) {
  if (!tpu_dtype_is_float(T(L, x)->dtype)) return x;
  return tpu_sel(L, tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, 0)), tpu_un(L, TPU_HLO_CEIL, x), tpu_un(L, TPU_HLO_FLOOR, x));
}

/* trunc and frac keep the dtype; ints are their own trunc. */
void tpu_emit_trunc(tpu_lower *L) {
  if (L->args[0].t.dtype == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"trunc_vml_cpu\" not implemented for 'Bool'");
    return;
  }
  tpu_lower_out(L, tpu_trunc_v(L, tpu_lower_tensor(L, 0, -1)));
}
void tpu_emit_frac(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (!tpu_dtype_is_float(T(L, x)->dtype)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"frac_cpu\" not implemented for '%s'",
                   tpu_dtype_c10_name(T(L, x)->dtype));
    return;
  }
  tpu_lower_out(L, tpu_sub(L, x, tpu_trunc_v(L, x)));
}

/* sgn on real tensors is sign. */
void tpu_emit_sgn(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_dtype dt = T(L, x)->dtype;
  if (dt == TPU_PRED) {
    tpu_lower_out(L, x);
  } else if (tpu_dtype_is_complex(dt)) {
    tpu_hv a = tpu_un(L, TPU_HLO_ABS, x); /* real */
    tpu_hv ac = tpu_hlo_binary(H, TPU_HLO_COMPLEX, a, tpu_k(L, a, 0));
    tpu_hv z = tpu_cmp(L, TPU_HLO_EQ, a, tpu_k(L, a, 0));
    tpu_lower_out(L, tpu_sel(L, z, tpu_k(L, x, 0), tpu_div(L, x, ac)));
  } else {
    tpu_lower_out(L, tpu_sign_v(L, x));
  }
}

/* signbit: the sign bit itself, so -0.0 and negative NaNs count. */
void tpu_emit_signbit(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_dtype dt = T(L, x)->dtype;
  if (dt == TPU_PRED || tpu_dtype_is_unsigned_int(dt)) {
    tpu_lower_out(L, tpu_cmp(L, TPU_HLO_NE, x, x)); /* all false */
    return;
  }
  if (tpu_dtype_is_float(dt)) {
    tpu_dtype it = tpu_dtype_size(dt) == 8 ? TPU_S64 : tpu_dtype_size(dt) == 4 ? TPU_S32 : TPU_S16;
    x = tpu_hlo_bitcast_convert(H, x, it);
  }
  tpu_lower_out(L, tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, 0)));
}

static void tpu_emit_isinf_dir(tpu_lower *L, double v) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (!tpu_dtype_is_float(T(L, x)->dtype)) {
    tpu_lower_out(L, tpu_cmp(L, TPU_HLO_NE, x, x));
    return;
  }
  tpu_lower_out(L, tpu_cmp(L, TPU_HLO_EQ, x, tpu_k(L, x, v)));
}
void tpu_emit_isposinf(tpu_lower *L) { tpu_emit_isinf_dir(L, INFINITY); }
void tpu_emit_isneginf(tpu_lower *L) { tpu_emit_isinf_dir(L, -INFINITY); }

void tpu_emit_isnan(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_lower_out(L, tpu_isnan(L, x)); /* false for ints */
}

/* nan_to_num(self, nan=None, posinf=None, neginf=None) */
void tpu_emit_nan_to_num(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_dtype dt = T(L, x)->dtype;
  if (!tpu_dtype_is_float(dt)) {
    tpu_lower_out(L, x);
    return;
  }
  double nv = L->args[1].kind == TPU_ARG_FLOAT ? L->args[1].f : 0.0;
  double pv = L->args[2].kind == TPU_ARG_FLOAT ? L->args[2].f : tpu_dtype_float_max(dt);
  double mv = L->args[3].kind == TPU_ARG_FLOAT ? L->args[3].f : -tpu_dtype_float_max(dt);
  tpu_hv y = tpu_sel(L, tpu_isnan(L, x), tpu_k(L, x, nv), x);
  y = tpu_sel(L, tpu_cmp(L, TPU_HLO_EQ, x, tpu_k(L, x, INFINITY)), tpu_k(L, x, pv), y);
  y = tpu_sel(L, tpu_cmp(L, TPU_HLO_EQ, x, tpu_k(L, x, -INFINITY)), tpu_k(L, x, mv), y);
  tpu_lower_out(L, y);
}

/* round.decimals(self, *, decimals): round half to even at 10^-decimals */
void tpu_emit_round_decimals(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_dtype dt = T(L, x)->dtype;
  if (!tpu_dtype_is_float(dt)) {
    tpu_lower_out(L, x);
    return;
  }
  int64_t d = L->args[1].i;
  tpu_hv xa = tpu_hlo_convert(H, x, tpu_acc_type(dt));
  double p = pow(10.0, (double)(d < 0 ? -d : d));
  tpu_hv y;
  if (d >= 0)
    y = tpu_div(L, tpu_un(L, TPU_HLO_ROUND_EVEN, tpu_mul(L, xa, tpu_k(L, xa, p))), tpu_k(L, xa, p));
  else
    y = tpu_mul(L, tpu_un(L, TPU_HLO_ROUND_EVEN, tpu_div(L, xa, tpu_k(L, xa, p))), tpu_k(L, xa, p));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* ---- complex numbers ---------------------------------------------------------------------- */

/* Arguments 0 and 1 of complex/polar: two f32 (or two f64) tensors,
 * broadcast together (half types are refused, as by torch's CPU kernel). */
static bool tpu_complex_parts(tpu_lower *L, tpu_hv *v) {
  tpu_dtype a = L->args[0].t.dtype, b = L->args[1].t.dtype;
  if (a != b || (a != TPU_F32 && a != TPU_F64)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected both inputs to be Float or Double tensors but got %s and %s",
                   tpu_dtype_name(a), tpu_dtype_name(b));
    return false;
  }
  v[0] = tpu_lower_tensor(L, 0, -1);
  v[1] = tpu_lower_tensor(L, 1, -1);
  tpu_lower_broadcast_all(L, v, 2);
  return true;
}

/* complex(real, imag): f32 -> c64, f64 -> c128 */
void tpu_emit_complex(tpu_lower *L) {
  tpu_hv v[2];
  if (tpu_complex_parts(L, v)) tpu_lower_out(L, tpu_hlo_binary(L->hlo, TPU_HLO_COMPLEX, v[0], v[1]));
}

/* polar(abs, angle) = abs * (cos(angle) + i sin(angle)) */
void tpu_emit_polar(tpu_lower *L) {
  tpu_hv v[2];
  if (!tpu_complex_parts(L, v)) return;
  tpu_hv re = tpu_mul(L, v[0], tpu_hlo_unary(L->hlo, TPU_HLO_COS, v[1]));
  tpu_hv im = tpu_mul(L, v[0], tpu_hlo_unary(L->hlo, TPU_HLO_SIN, v[1]));
  tpu_lower_out(L, tpu_hlo_binary(L->hlo, TPU_HLO_COMPLEX, re, im));
}

/* conj_physical(self): the conjugate, materialised (torch resolves lazily
 * conjugated tensors through it before they reach other kernels) */
void tpu_emit_conj_physical(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (!tpu_dtype_is_complex(T(L, x)->dtype)) {
    tpu_lower_out(L, x);
    return;
  }
  tpu_hv re = tpu_un(L, TPU_HLO_REAL, x), im = tpu_un(L, TPU_HLO_IMAG, x);
  tpu_lower_out(L, tpu_hlo_binary(H, TPU_HLO_COMPLEX, re, tpu_un(L, TPU_HLO_NEG, im)));
}

/* angle: atan2(imag, real) for complex inputs; for real ones pi below zero,
 * 0 otherwise, NaN kept (integers and bool give the default float type). */
void tpu_emit_angle(tpu_lower *L) {
  tpu_dtype in = tpu_arg_dtype(L, 0);
  if (tpu_dtype_is_complex(in)) {
    tpu_hv z = tpu_lower_tensor(L, 0, -1);
    tpu_lower_out(L, tpu_hlo_binary(H, TPU_HLO_ATAN2, tpu_un(L, TPU_HLO_IMAG, z), tpu_un(L, TPU_HLO_REAL, z)));
    return;
  }
  tpu_hv x = tpu_float_in(L, 0);
  tpu_hv r = tpu_sel(L, tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, 0)), tpu_k(L, x, 3.14159265358979323846), tpu_k(L, x, 0));
  tpu_lower_out(L, tpu_sel(L, tpu_isnan(L, x), x, r));
}

/* ---- logical and bitwise ops ---------------------------------------------------------------- */

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
  tpu_dtype cd = L->args[0].kind == TPU_ARG_TENSOR ? L->args[0].t.dtype : TPU_PRED;
  if (cd != TPU_PRED && cd != TPU_U8) { /* uint8: deprecated, still taken (the warning is torch's, before us) */
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "where expected condition to be a boolean tensor, but got a tensor with dtype %s",
                   tpu_dtype_c10_name(cd));
    return;
  }
  int idx[2] = {1, 2};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[3] = {tpu_lower_input(L, 0, TPU_PRED), tpu_lower_input(L, 1, dt), tpu_lower_input(L, 2, dt)};
  tpu_lower_broadcast_all(L, v, 3);
  tpu_lower_out(L, tpu_hlo_select(H, v[0], v[1], v[2]));
}

/* masked_fill(self, mask, value) */
void tpu_emit_masked_fill(tpu_lower *L) {
  tpu_dtype dt = L->args[0].t.dtype;
  if (L->args[1].kind == TPU_ARG_TENSOR && L->args[1].t.dtype != TPU_PRED) { /* x[uint8 mask] = v on the CPU too */
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "masked_fill_ only supports boolean masks, but got mask with dtype %s",
                   tpu_typemeta_name(L->args[1].t.dtype));
    return;
  }
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
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.clamp: At least one of 'min' or 'max' must not be None");
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

/* emit_elementwise.c: elementwise math and activations beyond the first op
 * set. Most unary ops are one StableHLO op, or one CHLO op (XLA legalises
 * CHLO when it compiles a StableHLO module, with its own accurate
 * expansions), on the input promoted to a float type; half types compute in
 * f32 and round once, as torch's CPU kernels do. Activations and their
 * backwards are small select/arith compositions with PyTorch's formulas. */
#include <math.h>
#include <string.h>

#include "emit.h"

#define TPU_LN2 0.69314718055994530942
#define TPU_LN10 2.30258509299404568402

/* ---- helpers --------------------------------------------------------------------------- */

static tpu_dtype tpu_arg_dtype(tpu_lower *L, int i) {
  return L->args[i].kind == TPU_ARG_TENSOR ? L->args[i].t.dtype : TPU_F32;
}

/* Input i promoted to the default float type if it is not floating. */
static tpu_hv tpu_float_in(tpu_lower *L, int i) {
  return tpu_lower_input(L, i, tpu_lower_float_type(tpu_arg_dtype(L, i)));
}

static tpu_hv tpu_named1(tpu_lower *L, const char *name, tpu_hv x) {
  tpu_hlo_type t = *T(L, x);
  return tpu_hlo_emit1(H, name, &x, 1, NULL, t);
}

static tpu_hv tpu_isnan(tpu_lower *L, tpu_hv x) { return tpu_hlo_compare(H, TPU_HLO_NE, x, x); }
static tpu_hv tpu_sel(tpu_lower *L, tpu_hv p, tpu_hv a, tpu_hv b) { return tpu_hlo_select(H, p, a, b); }
static tpu_hv tpu_cmp(tpu_lower *L, tpu_hlo_cmp d, tpu_hv a, tpu_hv b) { return tpu_hlo_compare(H, d, a, b); }
static tpu_hv tpu_div(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_DIV, a, b); }
static tpu_hv tpu_un(tpu_lower *L, tpu_hlo_op op, tpu_hv x) { return tpu_hlo_unary(H, op, x); }

/* Scalar argument i as a value broadcast like `like` (in like's dtype). */
static tpu_hv tpu_scalar_like(tpu_lower *L, int i, tpu_hv like) {
  const tpu_hlo_type *t = T(L, like);
  return tpu_lower_broadcast_to(L, tpu_lower_scalar(L, i, t->dtype), t->rank, t->dims);
}

/* Float unary f(x) computed in the accumulation type, rounded once. */
typedef tpu_hv (*tpu_ufn)(tpu_lower *L, tpu_hv x);

static void tpu_float_unary(tpu_lower *L, tpu_ufn f) {
  tpu_hv x = tpu_float_in(L, 0);
  tpu_dtype dt = T(L, x)->dtype;
  tpu_lower_out(L, tpu_hlo_convert(H, f(L, tpu_hlo_convert(H, x, tpu_acc_type(dt))), dt));
}

#define TPU_CHLO_UNARY(op, name)                                                      \
  static tpu_hv tpu_f_##op(tpu_lower *L, tpu_hv x) { return tpu_named1(L, name, x); } \
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

/* largest finite value of a float dtype */
static double tpu_float_max(tpu_dtype dt) {
  switch (dt) {
    case TPU_F16: return 65504.0;
    case TPU_BF16: return 3.3895313892515355e38;
    case TPU_F32: return 3.4028234663852886e38;
    default: return 1.7976931348623157e308;
  }
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
  double pv = L->args[2].kind == TPU_ARG_FLOAT ? L->args[2].f : tpu_float_max(dt);
  double mv = L->args[3].kind == TPU_ARG_FLOAT ? L->args[3].f : -tpu_float_max(dt);
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

/* ---- binary ---------------------------------------------------------------------------- */

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

/* ---- activations ------------------------------------------------------------------------ */

/* The float input (argument i) in f32 for half types; *dt gets the result type. */
static tpu_hv tpu_act_in(tpu_lower *L, int i, tpu_dtype *dt) {
  *dt = tpu_lower_float_type(tpu_arg_dtype(L, i));
  return tpu_lower_input(L, i, tpu_acc_type(*dt));
}

static tpu_hv tpu_s(tpu_lower *L, int i, tpu_hv like, double dflt) {
  if (i >= L->nargs || L->args[i].kind == TPU_ARG_NONE) return tpu_k(L, like, dflt);
  if (L->args[i].kind == TPU_ARG_FLOAT) return tpu_k(L, like, L->args[i].f);
  return tpu_scalar_like(L, i, like);
}

/* elu(self, alpha=1, scale=1, input_scale=1) */
void tpu_emit_elu(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  tpu_hv alpha = tpu_s(L, 1, x, 1), scale = tpu_s(L, 2, x, 1), iscale = tpu_s(L, 3, x, 1);
  tpu_hv neg = tpu_mul(L, tpu_mul(L, alpha, scale), tpu_un(L, TPU_HLO_EXPM1, tpu_mul(L, x, iscale)));
  tpu_hv y = tpu_sel(L, tpu_cmp(L, TPU_HLO_LE, x, tpu_k(L, x, 0)), neg, tpu_mul(L, x, scale));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result) */
void tpu_emit_elu_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 5, &dt);
  tpu_hv g = tpu_lower_input(L, 0, tpu_acc_type(dt));
  tpu_hv alpha = tpu_s(L, 1, x, 1), scale = tpu_s(L, 2, x, 1), iscale = tpu_s(L, 3, x, 1);
  tpu_hv negcoef = tpu_mul(L, alpha, scale), neg;
  if (L->args[4].i)
    neg = tpu_mul(L, tpu_mul(L, g, iscale), tpu_add(L, x, negcoef));
  else
    neg = tpu_mul(L, tpu_mul(L, tpu_mul(L, g, iscale), negcoef), tpu_un(L, TPU_HLO_EXP, tpu_mul(L, x, iscale)));
  tpu_hv y = tpu_sel(L, tpu_cmp(L, TPU_HLO_LE, x, tpu_k(L, x, 0)), neg, tpu_mul(L, g, scale));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* leaky_relu(self, negative_slope=0.01) */
void tpu_emit_leaky_relu(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  tpu_hv y = tpu_sel(L, tpu_cmp(L, TPU_HLO_GT, x, tpu_k(L, x, 0)), x, tpu_mul(L, x, tpu_s(L, 1, x, 0.01)));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* leaky_relu_backward(grad_output, self, negative_slope, self_is_result) */
void tpu_emit_leaky_relu_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 1, &dt);
  tpu_hv g = tpu_lower_input(L, 0, tpu_acc_type(dt));
  tpu_hv v[2] = {g, x};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv y =
      tpu_sel(L, tpu_cmp(L, TPU_HLO_GT, v[1], tpu_k(L, v[1], 0)), v[0], tpu_mul(L, v[0], tpu_s(L, 2, v[0], 0.01)));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* hardtanh(self, min_val=-1, max_val=1): ints too */
void tpu_emit_hardtanh(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (T(L, x)->dtype == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Bool inputs not supported for hardtanh");
    return;
  }
  tpu_hv lo = tpu_s(L, 1, x, -1), hi = tpu_s(L, 2, x, 1);
  tpu_lower_out(L, tpu_hlo_binary(H, TPU_HLO_MIN, tpu_hlo_binary(H, TPU_HLO_MAX, x, lo), hi));
}

/* hardtanh_backward(grad_output, self, min_val, max_val) */
void tpu_emit_hardtanh_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[1].t.dtype;
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv x = v[1];
  tpu_hv out = tpu_hlo_binary(H, TPU_HLO_OR, tpu_cmp(L, TPU_HLO_LE, x, tpu_s(L, 2, x, -1)),
                              tpu_cmp(L, TPU_HLO_GE, x, tpu_s(L, 3, x, 1)));
  tpu_lower_out(L, tpu_sel(L, out, tpu_k(L, v[0], 0), v[0]));
}

static tpu_hv tpu_relu6_shift(tpu_lower *L, tpu_hv x) {
  return tpu_hlo_clamp(H, tpu_k(L, x, 0), tpu_add(L, x, tpu_k(L, x, 3)), tpu_k(L, x, 6));
}

void tpu_emit_hardswish(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_div(L, tpu_mul(L, x, tpu_relu6_shift(L, x)), tpu_k(L, x, 6)), dt));
}

/* hardswish_backward(grad_output, self) */
void tpu_emit_hardswish_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 1, &dt);
  tpu_hv v[2] = {tpu_lower_input(L, 0, tpu_acc_type(dt)), x};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv g = v[0];
  x = v[1];
  tpu_hv mid = tpu_mul(L, g, tpu_add(L, tpu_div(L, x, tpu_k(L, x, 3)), tpu_k(L, x, 0.5)));
  tpu_hv y = tpu_sel(L, tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, -3)), tpu_k(L, x, 0),
                     tpu_sel(L, tpu_cmp(L, TPU_HLO_LE, x, tpu_k(L, x, 3)), mid, g));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

void tpu_emit_hardsigmoid(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_div(L, tpu_relu6_shift(L, x), tpu_k(L, x, 6)), dt));
}

/* hardsigmoid_backward(grad_output, self) */
void tpu_emit_hardsigmoid_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 1, &dt);
  tpu_hv v[2] = {tpu_lower_input(L, 0, tpu_acc_type(dt)), x};
  tpu_lower_broadcast_all(L, v, 2);
  x = v[1];
  tpu_hv in = tpu_hlo_binary(H, TPU_HLO_AND, tpu_cmp(L, TPU_HLO_GT, x, tpu_k(L, x, -3)),
                             tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, 3)));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_sel(L, in, tpu_div(L, v[0], tpu_k(L, x, 6)), tpu_k(L, x, 0)), dt));
}

/* hardshrink(self, lambd=0.5); softshrink(self, lambd=0.5) */
void tpu_emit_hardshrink(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv l = tpu_s(L, 1, x, 0.5);
  tpu_hv in = tpu_hlo_binary(H, TPU_HLO_AND, tpu_cmp(L, TPU_HLO_GE, x, tpu_un(L, TPU_HLO_NEG, l)),
                             tpu_cmp(L, TPU_HLO_LE, x, l));
  tpu_lower_out(L, tpu_sel(L, in, tpu_k(L, x, 0), x));
}

void tpu_emit_softshrink(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv l = tpu_s(L, 1, x, 0.5);
  tpu_hv y =
      tpu_sel(L, tpu_cmp(L, TPU_HLO_GT, x, l), tpu_sub(L, x, l),
              tpu_sel(L, tpu_cmp(L, TPU_HLO_LT, x, tpu_un(L, TPU_HLO_NEG, l)), tpu_add(L, x, l), tpu_k(L, x, 0)));
  tpu_lower_out(L, y);
}

/* hardshrink_backward / softshrink_backward(grad_out, self, lambd): zero inside [-l, l] */
void tpu_emit_shrink_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[1].t.dtype;
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv x = v[1], l = tpu_s(L, 2, x, 0.5);
  tpu_hv in = tpu_hlo_binary(H, TPU_HLO_AND, tpu_cmp(L, TPU_HLO_GE, x, tpu_un(L, TPU_HLO_NEG, l)),
                             tpu_cmp(L, TPU_HLO_LE, x, l));
  tpu_lower_out(L, tpu_sel(L, in, tpu_k(L, v[0], 0), v[0]));
}

/* softplus(self, beta=1, threshold=20) */
void tpu_emit_softplus(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  tpu_hv beta = tpu_s(L, 1, x, 1), th = tpu_s(L, 2, x, 20);
  tpu_hv xb = tpu_mul(L, x, beta);
  tpu_hv soft = tpu_div(L, tpu_un(L, TPU_HLO_LOG1P, tpu_un(L, TPU_HLO_EXP, xb)), beta);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_sel(L, tpu_cmp(L, TPU_HLO_GT, xb, th), x, soft), dt));
}

/* softplus_backward(grad_output, self, beta, threshold) */
void tpu_emit_softplus_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 1, &dt);
  tpu_hv v[2] = {tpu_lower_input(L, 0, tpu_acc_type(dt)), x};
  tpu_lower_broadcast_all(L, v, 2);
  x = v[1];
  tpu_hv beta = tpu_s(L, 2, x, 1), th = tpu_s(L, 3, x, 20);
  tpu_hv xb = tpu_mul(L, x, beta);
  tpu_hv z = tpu_un(L, TPU_HLO_EXP, xb);
  tpu_hv d = tpu_mul(L, v[0], tpu_div(L, z, tpu_add(L, z, tpu_k(L, z, 1))));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_sel(L, tpu_cmp(L, TPU_HLO_GT, xb, th), v[0], d), dt));
}

/* mish(x) = x * tanh(softplus(x)) */
void tpu_emit_mish(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  tpu_hv sp = tpu_un(L, TPU_HLO_LOG1P, tpu_un(L, TPU_HLO_EXP, x));
  sp = tpu_sel(L, tpu_cmp(L, TPU_HLO_GT, x, tpu_k(L, x, 20)), x, sp);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, x, tpu_un(L, TPU_HLO_TANH, sp)), dt));
}

/* threshold(self, threshold, value): value where self <= threshold */
void tpu_emit_threshold(tpu_lower *L) {
  int idx[1] = {0};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 1);
  tpu_hv x = tpu_lower_input(L, 0, dt);
  tpu_hv th = tpu_scalar_like(L, 1, x), val = tpu_scalar_like(L, 2, x);
  tpu_lower_out(L, tpu_sel(L, tpu_cmp(L, TPU_HLO_LE, x, th), val, x));
}

/* log_sigmoid_forward(self) -> (output, buffer): min(x, 0) - log1p(exp(-|x|)) */
void tpu_emit_log_sigmoid_forward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  tpu_hv z = tpu_un(L, TPU_HLO_EXP, tpu_un(L, TPU_HLO_NEG, tpu_un(L, TPU_HLO_ABS, x)));
  tpu_hv y = tpu_sub(L, tpu_hlo_binary(H, TPU_HLO_MIN, x, tpu_k(L, x, 0)), tpu_un(L, TPU_HLO_LOG1P, z));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, z, dt));
}

/* log_sigmoid_backward(grad_output, self, buffer) */
void tpu_emit_log_sigmoid_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 1, &dt);
  tpu_hv v[2] = {tpu_lower_input(L, 0, tpu_acc_type(dt)), x};
  tpu_lower_broadcast_all(L, v, 2);
  x = v[1];
  tpu_hv neg = tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, 0));
  tpu_hv z = tpu_un(L, TPU_HLO_EXP, tpu_un(L, TPU_HLO_NEG, tpu_un(L, TPU_HLO_ABS, x)));
  tpu_hv q = tpu_div(L, z, tpu_add(L, z, tpu_k(L, z, 1)));
  tpu_hv d = tpu_sel(L, neg, tpu_sub(L, tpu_k(L, x, 1), q), q);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, v[0], d), dt));
}

/* Halves of x along dim (glu). */
static void tpu_halves(tpu_lower *L, tpu_hv x, int64_t dim, tpu_hv *a, tpu_hv *b) {
  const tpu_hlo_type *t = T(L, x);
  int64_t s0[TPU_MAX_RANK] = {0}, s1[TPU_MAX_RANK] = {0}, l0[TPU_MAX_RANK], l1[TPU_MAX_RANK], st[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) {
    l0[i] = l1[i] = t->dims[i];
    st[i] = 1;
  }
  int64_t h = t->dims[dim] / 2;
  l0[dim] = h;
  s1[dim] = h;
  *a = tpu_hlo_slice(H, x, s0, l0, st);
  *b = tpu_hlo_slice(H, x, s1, l1, st);
}

static int64_t tpu_glu_dim(tpu_lower *L, int argi, int rank) {
  int64_t d = tpu_lower_dim(L, L->args[argi].kind == TPU_ARG_INT ? L->args[argi].i : -1, rank);
  return d;
}

/* glu(self, dim=-1) = a * sigmoid(b) */
void tpu_emit_glu(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  int rank = T(L, x)->rank;
  if (rank == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "glu does not support scalars because halving size must be even");
    return;
  }
  int64_t d = tpu_glu_dim(L, 1, rank);
  if (T(L, x)->dims[d] % 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Halving dimension must be even, but dimension %lld is size %lld", (long long)d,
                   (long long)T(L, x)->dims[d]);
    return;
  }
  tpu_hv a, b;
  tpu_halves(L, x, d, &a, &b);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, a, tpu_un(L, TPU_HLO_LOGISTIC, b)), dt));
}

/* glu_backward(grad_output, self, dim) */
void tpu_emit_glu_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 1, &dt);
  tpu_hv g = tpu_lower_input(L, 0, tpu_acc_type(dt));
  int64_t d = tpu_glu_dim(L, 2, T(L, x)->rank);
  tpu_hv a, b;
  tpu_halves(L, x, d, &a, &b);
  tpu_hv s = tpu_un(L, TPU_HLO_LOGISTIC, b);
  tpu_hv ga = tpu_mul(L, g, s);
  tpu_hv gb = tpu_mul(L, tpu_mul(L, ga, a), tpu_sub(L, tpu_k(L, s, 1), s));
  tpu_hv parts[2] = {ga, gb};
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_concat(H, parts, 2, (int)d), dt));
}

/* _prelu_kernel(self, weight): weight already broadcastable to self */
void tpu_emit_prelu(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_lower_out(L, tpu_sel(L, tpu_cmp(L, TPU_HLO_GT, v[0], tpu_k(L, v[0], 0)), v[0], tpu_mul(L, v[0], v[1])));
}

/* _prelu_kernel_backward(grad_output, self, weight) -> (grad_self, grad_weight) */
void tpu_emit_prelu_backward(tpu_lower *L) {
  int idx[3] = {0, 1, 2};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 3);
  tpu_hv v[3] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt), tpu_lower_input(L, 2, dt)};
  tpu_lower_broadcast_all(L, v, 3);
  tpu_hv pos = tpu_cmp(L, TPU_HLO_GT, v[1], tpu_k(L, v[1], 0));
  tpu_lower_out(L, tpu_sel(L, pos, v[0], tpu_mul(L, v[2], v[0])));
  tpu_lower_out(L, tpu_sel(L, pos, tpu_k(L, v[0], 0), tpu_mul(L, v[1], v[0])));
}

/* logit(self, eps=None) */
void tpu_emit_logit(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 0, &dt);
  if (L->nargs > 1 && L->args[1].kind == TPU_ARG_FLOAT) {
    double e = L->args[1].f;
    x = tpu_hlo_clamp(H, tpu_k(L, x, e), x, tpu_k(L, x, 1 - e));
  }
  tpu_hv y = tpu_un(L, TPU_HLO_LOG, tpu_div(L, x, tpu_sub(L, tpu_k(L, x, 1), x)));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* logit_backward(grad_output, self, eps=None) */
void tpu_emit_logit_backward(tpu_lower *L) {
  tpu_dtype dt;
  tpu_hv x = tpu_act_in(L, 1, &dt);
  tpu_hv v[2] = {tpu_lower_input(L, 0, tpu_acc_type(dt)), x};
  tpu_lower_broadcast_all(L, v, 2);
  x = v[1];
  tpu_hv d = tpu_div(L, v[0], tpu_mul(L, x, tpu_sub(L, tpu_k(L, x, 1), x)));
  tpu_hv y;
  if (L->nargs > 2 && L->args[2].kind == TPU_ARG_FLOAT) {
    double e = L->args[2].f;
    tpu_hv out = tpu_hlo_binary(H, TPU_HLO_OR, tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, e)),
                                tpu_cmp(L, TPU_HLO_GT, x, tpu_k(L, x, 1 - e)));
    y = tpu_sel(L, out, tpu_k(L, x, 0), d);
  } else {
    tpu_hv out = tpu_hlo_binary(H, TPU_HLO_OR, tpu_cmp(L, TPU_HLO_LT, x, tpu_k(L, x, 0)),
                                tpu_cmp(L, TPU_HLO_GT, x, tpu_k(L, x, 1)));
    y = tpu_sel(L, out, tpu_k(L, x, NAN), d);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
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

/* emit_activation.c: activation functions and their backwards: relu, gelu,
 * silu, elu, leaky_relu, hardtanh, hardswish, hardsigmoid, hardshrink,
 * softshrink, softplus, mish, threshold, log_sigmoid, glu, prelu and logit,
 * and the backwards of tanh and sigmoid. Activations and their backwards are
 * small select/arith compositions with PyTorch's formulas, in f32 for half
 * types (rounded once), as torch's CPU kernels compute them. */
#include <math.h>
#include <string.h>

#include "emit.h"

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

void tpu_emit_relu(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (T(L, x)->dtype == TPU_PRED) tpu_lower_fail(L, TPU_ERR_RUNTIME, "Boolean inputs not supported for relu");
  tpu_lower_out(L, tpu_hlo_binary(H, TPU_HLO_MAX, x, tpu_lower_full_like(L, x, 0)));
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
  /* self <= threshold ? 0 : grad, as torch's kernel: a nan self passes its gradient */
  tpu_hv drop = tpu_hlo_compare(H, TPU_HLO_LE, v[1], th);
  tpu_lower_out(L, tpu_hlo_select(H, drop, tpu_k(L, v[0], 0), v[0]));
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
  tpu_hv y = tpu_sel(
      L, tpu_cmp(L, TPU_HLO_GT, x, l), tpu_sub(L, x, l),
      tpu_sel(L, tpu_cmp(L, TPU_HLO_LT, x, tpu_un(L, TPU_HLO_NEG, l)), tpu_add(L, x, l),
              tpu_mul(L, x, tpu_k(L, x, 0)))); /* x * 0 inside, as torch's kernel: nan stays, -0 keeps its sign */
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

/* emit_loss.c: loss functions and their backwards: nll_loss (1-d and 2-d),
 * the pointwise losses (mse, smooth_l1, huber, binary_cross_entropy), the
 * margin losses (multi_margin, multilabel_margin) and CTC.
 *
 * Losses compute in the accumulation type (f32 for half inputs, as torch's
 * CPU kernels do) and reduce with torch's Reduction enum: 0 none, 1 mean,
 * 2 sum. Backwards take the gradient of the reduced output and broadcast it
 * back, so one helper serves every pointwise loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

static tpu_hv tpu_sum_all(tpu_lower *L, tpu_hv x) {
  const tpu_hlo_type *t = T(L, x);
  int64_t dims[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) dims[i] = i;
  return tpu_reduce_sum(L, x, dims, t->rank);
}

/* Reduce an elementwise loss l (acc type) and declare it as dtype dt. */
static void tpu_loss_out(tpu_lower *L, tpu_hv l, int64_t red, tpu_dtype dt) {
  if (red == RED_NONE) {
    tpu_lower_out(L, tpu_hlo_convert(H, l, dt));
    return;
  }
  int64_t n = tpu_hlo_type_numel(T(L, l));
  tpu_hv s = tpu_sum_all(L, l);
  /* mean of nothing is NaN, as 0/0 on CPU */
  if (red == RED_MEAN) s = tpu_hlo_binary(H, TPU_HLO_DIV, s, tpu_k(L, s, (double)n));
  tpu_lower_out(L, tpu_hlo_convert(H, s, dt));
}

/* The upstream gradient broadcast to like's shape, divided by numel for a
 * mean reduction. */
static tpu_hv tpu_loss_grad(tpu_lower *L, int gi, tpu_hv like, int64_t red) {
  const tpu_hlo_type lt = *T(L, like);
  tpu_hv g = tpu_lower_input(L, gi, lt.dtype);
  if (red != RED_NONE) {
    g = tpu_hlo_reshape(H, g, 0, NULL);
    if (red == RED_MEAN) g = tpu_hlo_binary(H, TPU_HLO_DIV, g, tpu_k(L, g, (double)tpu_hlo_type_numel(&lt)));
  }
  return tpu_lower_broadcast_to(L, g, lt.rank, lt.dims);
}

/* self and target (args a, b) in the acc type, broadcast together. */
static tpu_dtype tpu_loss_pair(tpu_lower *L, int a, int b, tpu_hv *x, tpu_hv *y) {
  int idx[2] = {a, b};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2), acc = tpu_acc_type(dt);
  tpu_hv v[2] = {tpu_lower_input(L, a, acc), tpu_lower_input(L, b, acc)};
  tpu_lower_broadcast_all(L, v, 2);
  *x = v[0];
  *y = v[1];
  return dt;
}

/* ---- nll_loss ----------------------------------------------------------------------------- */

/* torch's check of a class weight: none, or one value per class (C); its
 * 2-d kernel's message names neither. */
static bool tpu_nll_weight_ok(tpu_lower *L, int wi, int64_t C, bool two_d) {
  if (tpu_lower_is_none(L, wi)) return true;
  tpu_tref *wt = &L->args[wi].t;
  if (two_d ? tpu_numel(wt->rank, wt->sizes) == C : wt->rank == 1 && wt->sizes[0] == C) return true;
  if (two_d) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "weight tensor should be defined either for all or no classes");
    return false;
  }
  char shape[TPU_MAX_RANK * 24 + 3] = "[";
  size_t n = 1;
  for (int i = 0; i < wt->rank; i++)
    n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%lld", i ? ", " : "", (long long)wt->sizes[i]);
  snprintf(shape + n, sizeof shape - n, "]");
  tpu_lower_fail(L, TPU_ERR_RUNTIME,
                 "weight tensor should be defined either for all %lld classes or no classes but got weight tensor "
                 "of shape: %s",
                 (long long)C, shape);
  return false;
}

/* One-hot [N, C] of target (or [C] for a 0-d target) and the per-sample
 * weight * (target != ignore_index). */
static void tpu_nll_common(tpu_lower *L, int self_i, int target_i, int weight_i, int ignore_i, tpu_hv *onehot,
                           tpu_hv *w) {
  tpu_tref *s = &L->args[self_i].t;
  tpu_dtype dt = s->dtype;
  if (s->rank < 1 || s->rank > 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "input tensor should be 1D or 2D");
    return;
  }
  int64_t C = s->sizes[s->rank - 1];
  if (!tpu_nll_weight_ok(L, weight_i, C, false)) return;
  tpu_hv tg = tpu_lower_tensor(L, target_i, -1);
  if (tpu_dtype_is_float(T(L, tg)->dtype))
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected scalar type Long but found %s", tpu_dtype_name(T(L, tg)->dtype));
  tg = tpu_hlo_convert(H, tg, TPU_S64);
  int64_t N = s->rank == 2 ? s->sizes[0] : 1;
  if (s->rank == 2 && (T(L, tg)->rank != 1 || T(L, tg)->dims[0] != N)) {
    tpu_lower_fail(L, TPU_ERR_VALUE, "Expected input batch_size (%lld) to match target batch_size (%lld).",
                   (long long)N, (long long)(T(L, tg)->rank ? T(L, tg)->dims[0] : 0));
    return;
  }
  int64_t nc[2] = {N, C};
  tg = tpu_hlo_reshape(H, tg, 1, &N);
  tpu_lower_check_targets(L, tg, C, L->args[ignore_i].i);
  tpu_hv tgb = tpu_hlo_broadcast_in_dim(H, tg, 2, nc, (int64_t[]){0});
  tpu_hv cls = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nc), 1);
  tpu_hv hot = tpu_hlo_compare(H, TPU_HLO_EQ, tgb, cls);
  tpu_hv valid = tpu_hlo_compare(H, TPU_HLO_NE, tg,
                                 tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &N), (double)L->args[ignore_i].i));
  tpu_hv hotf = tpu_hlo_convert(H, hot, dt);
  tpu_hv wn;
  if (!tpu_lower_is_none(L, weight_i)) {
    tpu_hv wt = tpu_hlo_broadcast_in_dim(H, tpu_lower_input(L, weight_i, dt), 2, nc, (int64_t[]){1});
    int64_t one = 1;
    wn = tpu_hlo_reduce(H, tpu_mul(L, hotf, wt), tpu_hlo_constant(H, dt, 0), &one, 1, TPU_HLO_ADD);
  } else {
    wn = tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &N), 1);
  }
  wn = tpu_hlo_select(H, valid, wn, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &N), 0));
  *onehot = hotf;
  *w = wn;
}

/* nll_loss_forward(self, target, weight, reduction, ignore_index) -> (output, total_weight) */
void tpu_emit_nll_loss_forward(tpu_lower *L) {
  tpu_tref *s = &L->args[0].t;
  tpu_dtype dt = s->dtype;
  tpu_hv hot, w;
  tpu_nll_common(L, 0, 1, 2, 4, &hot, &w);
  if (!tpu_hlo_ok(H)) return;
  int64_t N = s->rank == 2 ? s->sizes[0] : 1, C = s->sizes[s->rank - 1], nc[2] = {N, C};
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 2, nc);
  int64_t one = 1, zero = 0;
  tpu_hv picked = tpu_hlo_reduce(H, tpu_mul(L, x, hot), tpu_hlo_constant(H, dt, 0), &one, 1, TPU_HLO_ADD);
  /* A masked-out target picks nothing; keep inf * 0 out of the product. */
  tpu_hv loss = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, w, tpu_k(L, w, 0)),
                               tpu_hlo_unary(H, TPU_HLO_NEG, tpu_mul(L, picked, w)), tpu_k(L, w, 0));
  tpu_hv tw = tpu_hlo_reduce(H, w, tpu_hlo_constant(H, dt, 0), &zero, 1, TPU_HLO_ADD);
  int64_t red = L->args[3].i;
  if (red == 0) {
    tpu_lower_out(L, s->rank == 2 ? loss : tpu_hlo_reshape(H, loss, 0, NULL));
  } else {
    tpu_hv sum = tpu_hlo_reduce(H, loss, tpu_hlo_constant(H, dt, 0), &zero, 1, TPU_HLO_ADD);
    tpu_lower_out(L, red == 1 ? tpu_hlo_binary(H, TPU_HLO_DIV, sum, tw) : sum);
  }
  tpu_lower_out(L, tw);
}

/* nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight) */
void tpu_emit_nll_loss_backward(tpu_lower *L) {
  tpu_tref *s = &L->args[1].t;
  tpu_dtype dt = s->dtype;
  tpu_hv hot, w;
  tpu_nll_common(L, 1, 2, 3, 5, &hot, &w);
  if (!tpu_hlo_ok(H)) return;
  int64_t N = s->rank == 2 ? s->sizes[0] : 1, C = s->sizes[s->rank - 1], nc[2] = {N, C};
  tpu_hv g = tpu_lower_input(L, 0, dt);
  int64_t red = L->args[4].i;
  tpu_hv gn;
  if (red == 0 && s->rank == 2) {
    gn = tpu_hlo_reshape(H, g, 1, &N);
  } else {
    g = tpu_hlo_reshape(H, g, 0, NULL);
    if (red == 1) g = tpu_hlo_binary(H, TPU_HLO_DIV, g, tpu_hlo_reshape(H, tpu_lower_input(L, 6, dt), 0, NULL));
    gn = tpu_hlo_broadcast_in_dim(H, g, 1, &N, NULL);
  }
  tpu_hv coef = tpu_hlo_unary(H, TPU_HLO_NEG, tpu_mul(L, gn, w));
  tpu_hv r = tpu_mul(L, hot, tpu_hlo_broadcast_in_dim(H, coef, 2, nc, (int64_t[]){0}));
  tpu_lower_out(L, tpu_hlo_reshape(H, r, s->rank, s->sizes));
}

/* ---- pointwise losses -------------------------------------------------------------------- */

/* mse_loss(self, target, reduction) */
void tpu_emit_mse_loss(tpu_lower *L) {
  if (!tpu_need_float(L, 0, "mse_cpu")) return;
  tpu_hv x, y;
  tpu_dtype dt = tpu_loss_pair(L, 0, 1, &x, &y);
  tpu_hv d = tpu_sub(L, x, y);
  tpu_loss_out(L, tpu_mul(L, d, d), L->args[2].i, dt);
}

/* mse_loss_backward(grad_output, self, target, reduction) */
void tpu_emit_mse_loss_backward(tpu_lower *L) {
  tpu_hv x, y;
  tpu_dtype dt = tpu_loss_pair(L, 1, 2, &x, &y);
  tpu_hv d = tpu_sub(L, x, y);
  tpu_hv g = tpu_loss_grad(L, 0, d, L->args[3].i);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, tpu_mul(L, d, tpu_k(L, d, 2)), g), dt));
}

/* smooth_l1_loss(self, target, reduction, beta): |d| < beta ? 0.5 d^2 / beta : |d| - beta / 2 */
void tpu_emit_smooth_l1_loss(tpu_lower *L) {
  double beta = L->args[3].f;
  if (beta < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "smooth_l1_loss does not support negative values for beta.");
    return;
  }
  tpu_hv x, y;
  tpu_dtype dt = tpu_loss_pair(L, 0, 1, &x, &y);
  tpu_hv z = tpu_hlo_unary(H, TPU_HLO_ABS, tpu_sub(L, x, y));
  tpu_hv l = z;
  if (beta > 0) {
    tpu_hv quad = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_mul(L, tpu_mul(L, z, z), tpu_k(L, z, 0.5)), tpu_k(L, z, beta));
    l = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_LT, z, tpu_k(L, z, beta)), quad,
                       tpu_sub(L, z, tpu_k(L, z, 0.5 * beta)));
  }
  tpu_loss_out(L, l, L->args[2].i, dt);
}

/* d <= -t ? -lo : d >= t ? lo : mid, torch's CPU order of tests */
static tpu_hv tpu_piecewise_grad(tpu_lower *L, tpu_hv d, double t, tpu_hv lo, tpu_hv mid) {
  tpu_hv r = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GE, d, tpu_k(L, d, t)), lo, mid);
  return tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_LE, d, tpu_k(L, d, -t)), tpu_hlo_unary(H, TPU_HLO_NEG, lo), r);
}

/* smooth_l1_loss_backward(grad_output, self, target, reduction, beta) */
void tpu_emit_smooth_l1_loss_backward(tpu_lower *L) {
  double beta = L->args[4].f;
  tpu_hv x, y;
  tpu_dtype dt = tpu_loss_pair(L, 1, 2, &x, &y);
  tpu_hv d = tpu_sub(L, x, y);
  tpu_hv g = tpu_loss_grad(L, 0, d, L->args[3].i);
  tpu_hv mid = beta > 0 ? tpu_hlo_binary(H, TPU_HLO_DIV, tpu_mul(L, d, g), tpu_k(L, d, beta)) : tpu_k(L, d, 0);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_piecewise_grad(L, d, beta, g, mid), dt));
}

/* huber_loss(self, target, reduction, delta): |d| < delta ? 0.5 d^2 : delta (|d| - delta / 2) */
void tpu_emit_huber_loss(tpu_lower *L) {
  double delta = L->args[3].f;
  if (!(delta > 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "huber_loss does not support non-positive values for delta.");
    return;
  }
  tpu_hv x, y;
  tpu_dtype dt = tpu_loss_pair(L, 0, 1, &x, &y);
  tpu_hv z = tpu_hlo_unary(H, TPU_HLO_ABS, tpu_sub(L, x, y));
  tpu_hv quad = tpu_mul(L, tpu_mul(L, z, z), tpu_k(L, z, 0.5));
  tpu_hv lin = tpu_mul(L, tpu_k(L, z, delta), tpu_sub(L, z, tpu_k(L, z, 0.5 * delta)));
  tpu_loss_out(L, tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_LT, z, tpu_k(L, z, delta)), quad, lin), L->args[2].i,
               dt);
}

/* huber_loss_backward(grad_output, self, target, reduction, delta) */
void tpu_emit_huber_loss_backward(tpu_lower *L) {
  double delta = L->args[4].f;
  tpu_hv x, y;
  tpu_dtype dt = tpu_loss_pair(L, 1, 2, &x, &y);
  tpu_hv d = tpu_sub(L, x, y);
  tpu_hv g = tpu_loss_grad(L, 0, d, L->args[3].i);
  tpu_hv r = tpu_piecewise_grad(L, d, delta, tpu_mul(L, g, tpu_k(L, g, delta)), tpu_mul(L, d, g));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* binary_cross_entropy(self, target, weight, reduction):
 * -w (y max(log x, -100) + (1 - y) max(log(1 - x), -100)) */
void tpu_emit_binary_cross_entropy(tpu_lower *L) {
  if (!tpu_need_float(L, 0, "binary_cross_entropy")) return;
  tpu_tref *s = &L->args[0].t, *t = &L->args[1].t;
  if (s->rank != t->rank || memcmp(s->sizes, t->sizes, sizeof(int64_t) * (size_t)s->rank)) {
    tpu_lower_fail(L, TPU_ERR_VALUE,
                   "Using a target size that is different to the input size is deprecated. "
                   "Please ensure they have the same size.");
    return;
  }
  tpu_dtype dt = s->dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc), y = tpu_lower_input(L, 1, acc);
  tpu_hv inside = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GE, x, tpu_k(L, x, 0)),
                                 tpu_hlo_compare(H, TPU_HLO_LE, x, tpu_k(L, x, 1)));
  tpu_lower_check(L, tpu_hlo_unary(H, TPU_HLO_NOT, inside), TPU_ERR_RUNTIME,
                  "all elements of input should be between 0 and 1");
  tpu_hv lx = tpu_hlo_binary(H, TPU_HLO_MAX, tpu_hlo_unary(H, TPU_HLO_LOG, x), tpu_k(L, x, -100));
  tpu_hv l1x = tpu_hlo_binary(H, TPU_HLO_MAX, tpu_hlo_unary(H, TPU_HLO_LOG1P, tpu_hlo_unary(H, TPU_HLO_NEG, x)),
                              tpu_k(L, x, -100));
  tpu_hv l = tpu_sub(L, tpu_mul(L, tpu_sub(L, y, tpu_k(L, y, 1)), l1x), tpu_mul(L, y, lx));
  if (!tpu_lower_is_none(L, 2)) l = tpu_lower_binary(L, TPU_HLO_MUL, l, tpu_lower_input(L, 2, acc));
  tpu_loss_out(L, l, L->args[3].i, dt);
}

/* binary_cross_entropy_backward(grad_output, self, target, weight, reduction):
 * g (x - y) / max((1 - x) x, 1e-12) w */
void tpu_emit_binary_cross_entropy_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[1].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 1, acc), y = tpu_lower_input(L, 2, acc);
  tpu_hv g = tpu_loss_grad(L, 0, x, L->args[4].i);
  tpu_hv den = tpu_hlo_binary(H, TPU_HLO_MAX, tpu_mul(L, tpu_sub(L, tpu_k(L, x, 1), x), x), tpu_k(L, x, 1e-12));
  tpu_hv r = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_mul(L, g, tpu_sub(L, x, y)), den);
  if (!tpu_lower_is_none(L, 3)) r = tpu_lower_binary(L, TPU_HLO_MUL, r, tpu_lower_input(L, 3, acc));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* ---- class-indexed losses --------------------------------------------------------------- */

/* target (arg ti, shape [N] or 0-d) as a one-hot [N, C] of dtype dt */
static tpu_hv tpu_onehot_rows(tpu_lower *L, int ti, int64_t N, int64_t C, tpu_dtype dt) {
  tpu_hv tg = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, ti, -1), TPU_S64), 1, &N);
  int64_t nc[2] = {N, C};
  tpu_hv tgb = tpu_hlo_broadcast_in_dim(H, tg, 2, nc, (int64_t[]){0});
  tpu_hv cls = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nc), 1);
  return tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_EQ, tgb, cls), dt);
}

static tpu_hv tpu_row_sum(tpu_lower *L, tpu_hv x) {
  int64_t one = 1;
  return tpu_reduce_sum(L, x, &one, 1);
}

static tpu_hv tpu_bcast_rows(tpu_lower *L, tpu_hv v, int64_t N, int64_t C) {
  return tpu_hlo_broadcast_in_dim(H, v, 2, (int64_t[]){N, C}, (int64_t[]){0});
}

/* Shapes of multi_margin_loss: (N, C) from a [C] or [N, C] input. */
static bool tpu_margin_shape(tpu_lower *L, int si, int ti, int64_t *N, int64_t *C) {
  tpu_tref *s = &L->args[si].t, *t = &L->args[ti].t;
  if (s->rank > 2 || (s->rank == 2 && s->sizes[1] == 0) || (s->rank == 1 && s->sizes[0] == 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected non-empty vector or matrix with optional 0-dim batch size, but got: [...]");
    return false;
  }
  *N = s->rank == 2 ? s->sizes[0] : 1;
  *C = s->rank == 0 ? 1 : s->sizes[s->rank - 1];
  int64_t tn = tpu_numel(t->rank, t->sizes);
  if (t->rank > 1 || tn != *N) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "inconsistent target size: [%lld] for input of size: [%lld, %lld]",
                   (long long)tn, (long long)*N, (long long)*C);
    return false;
  }
  if (tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected scalar type Long but found %s", tpu_dtype_name(t->dtype));
    return false;
  }
  return true;
}

/* The margin terms z[n, j] = margin - x[n, y] + x[n, j] (j != y) clamped at
 * 0, and the per-sample class weight w[y] ([N], or NONE). */
static void tpu_margin_terms(tpu_lower *L, int si, int ti, int mi, int wi, int64_t N, int64_t C, tpu_hv *hot, tpu_hv *z,
                             tpu_hv *wy) {
  tpu_dtype acc = tpu_acc_type(L->args[si].t.dtype);
  int64_t nc[2] = {N, C};
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_input(L, si, acc), 2, nc);
  *hot = tpu_onehot_rows(L, ti, N, C, acc);
  tpu_hv xy = tpu_row_sum(L, tpu_mul(L, x, *hot));
  tpu_hv m = tpu_lower_scalar(L, mi, acc);
  tpu_hv d = tpu_add(L, tpu_sub(L, tpu_lower_broadcast_to(L, m, 2, nc), tpu_bcast_rows(L, xy, N, C)), x);
  tpu_hv pos = tpu_hlo_compare(H, TPU_HLO_GT, d, tpu_k(L, d, 0));
  tpu_hv nothot = tpu_hlo_compare(H, TPU_HLO_EQ, *hot, tpu_k(L, *hot, 0));
  *z = tpu_hlo_select(H, tpu_hlo_binary(H, TPU_HLO_AND, pos, nothot), d, tpu_k(L, d, 0));
  *wy = TPU_HV_NONE;
  if (!tpu_lower_is_none(L, wi)) {
    tpu_hv w = tpu_hlo_broadcast_in_dim(H, tpu_lower_input(L, wi, acc), 2, nc, (int64_t[]){1});
    *wy = tpu_row_sum(L, tpu_mul(L, w, *hot));
  }
}

/* p is 1 or 2 (a Python number, a program input): select between the forms */
static tpu_hv tpu_margin_is_p2(tpu_lower *L, int pi, tpu_hv like) {
  tpu_hv p = tpu_lower_scalar(L, pi, TPU_F64);
  tpu_hv is2 = tpu_hlo_compare(H, TPU_HLO_EQ, p, tpu_hlo_constant(H, TPU_F64, 2));
  const tpu_hlo_type *t = T(L, like);
  return tpu_hlo_broadcast_in_dim(H, is2, t->rank, t->dims, NULL);
}

static bool tpu_margin_check_p(tpu_lower *L, int pi) {
  tpu_arg *p = &L->args[pi];
  double v = p->kind == TPU_ARG_SCALAR ? (p->skind == TPU_SCALAR_INT ? (double)p->i : p->f) : 1;
  if (v != 1 && v != 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "only p == 1 and p == 2 supported");
    return false;
  }
  return true;
}

/* multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=Mean):
 * per sample sum_{j != y} max(0, margin - x[y] + x[j])^p w[y] / C */
void tpu_emit_multi_margin_loss(tpu_lower *L) {
  if (!tpu_need_float(L, 0, "multi_margin_loss_cpu_kernel")) return;
  int64_t N, C;
  if (!tpu_margin_check_p(L, 2) || !tpu_margin_shape(L, 0, 1, &N, &C)) return;
  tpu_tref *s = &L->args[0].t;
  tpu_dtype dt = s->dtype;
  tpu_hv hot, z, wy;
  tpu_margin_terms(L, 0, 1, 3, 4, N, C, &hot, &z, &wy);
  z = tpu_hlo_select(H, tpu_margin_is_p2(L, 2, z), tpu_mul(L, z, z), z);
  tpu_hv l = tpu_row_sum(L, z);
  if (wy != TPU_HV_NONE) l = tpu_mul(L, l, wy);
  l = tpu_hlo_binary(H, TPU_HLO_DIV, l, tpu_k(L, l, (double)C));
  int64_t red = L->args[5].i;
  if (red == RED_NONE && L->args[1].t.rank == 0) l = tpu_hlo_reshape(H, l, 0, NULL);
  tpu_loss_out(L, l, red, dt);
}

/* multi_margin_loss_backward(grad_output, self, target, p, margin, weight, reduction) */
void tpu_emit_multi_margin_loss_backward(tpu_lower *L) {
  int64_t N, C;
  if (!tpu_margin_shape(L, 1, 2, &N, &C)) return;
  tpu_tref *s = &L->args[1].t;
  tpu_dtype dt = s->dtype;
  tpu_hv hot, z, wy;
  tpu_margin_terms(L, 1, 2, 4, 5, N, C, &hot, &z, &wy);
  tpu_hv active = tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_GT, z, tpu_k(L, z, 0)), T(L, z)->dtype);
  /* d/dx_j of z^p: 1 (p = 1) or 2 z (p = 2) where the term is active */
  tpu_hv dz = tpu_hlo_select(H, tpu_margin_is_p2(L, 3, z), tpu_mul(L, z, tpu_k(L, z, 2)), active);
  int64_t red = L->args[6].i;
  tpu_hv g = tpu_hlo_convert(H, tpu_lower_tensor(L, 0, -1), T(L, z)->dtype);
  if (red == RED_NONE) {
    g = tpu_hlo_reshape(H, g, 1, &N);
  } else {
    g = tpu_hlo_reshape(H, g, 0, NULL);
    if (red == RED_MEAN) g = tpu_hlo_binary(H, TPU_HLO_DIV, g, tpu_k(L, g, (double)N));
    g = tpu_hlo_broadcast_in_dim(H, g, 1, &N, NULL);
  }
  g = tpu_hlo_binary(H, TPU_HLO_DIV, g, tpu_k(L, g, (double)C));
  if (wy != TPU_HV_NONE) g = tpu_mul(L, g, wy);
  tpu_hv gj = tpu_mul(L, dz, tpu_bcast_rows(L, g, N, C));
  /* the target column gets minus the sum of the others */
  tpu_hv gy = tpu_mul(L, hot, tpu_bcast_rows(L, tpu_row_sum(L, gj), N, C));
  tpu_hv r = tpu_sub(L, gj, gy);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, r, s->rank, s->sizes), dt));
}

/* multilabel margin: shapes (N, C) from a 0-d, [C] or [N, C] input whose
 * target has the same shape. */
static bool tpu_mlm_shape(tpu_lower *L, int si, int ti, int64_t *N, int64_t *C) {
  tpu_tref *s = &L->args[si].t, *t = &L->args[ti].t;
  if (s->rank > 2 || (s->rank == 1 && s->sizes[0] == 0) || (s->rank == 2 && s->sizes[1] == 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected non-empty vector or matrix with optional 0-dim batch size, but got: [...]");
    return false;
  }
  if (t->rank != s->rank || memcmp(t->sizes, s->sizes, sizeof(int64_t) * (size_t)s->rank)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "inconsistent target size: [...] for input of size: [...]");
    return false;
  }
  if (tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected scalar type Long but found %s", tpu_dtype_name(t->dtype));
    return false;
  }
  *N = s->rank == 2 ? s->sizes[0] : 1;
  *C = s->rank == 0 ? 1 : s->sizes[s->rank - 1];
  return true;
}

/* The multilabel terms: for sample n, target slot k (before the first -1)
 * and class c not among the targets, z = max(0, 1 - x[t_k] + x[c]).
 * Returns z [N, K, C] (K = C), the slot one-hots hot [N, K, C] (zero for
 * unused slots) and is_target [N, C]. */
static void tpu_mlm_terms(tpu_lower *L, int si, int ti, int64_t N, int64_t C, tpu_hv *z, tpu_hv *hot, tpu_hv *ist) {
  tpu_dtype acc = tpu_acc_type(L->args[si].t.dtype);
  int64_t nc[2] = {N, C}, nkc[3] = {N, C, C};
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_input(L, si, acc), 2, nc);
  tpu_hv tg = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, ti, -1), TPU_S64), 2, nc);
  /* slot k is used when no -1 occurs at or before it: first -1 position */
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, 2, nc);
  tpu_hv kio = tpu_hlo_iota(H, it, 1);
  tpu_hv neg = tpu_hlo_compare(H, TPU_HLO_EQ, tg, tpu_lower_full(L, it, -1));
  tpu_hv firstneg = tpu_hlo_reduce(H, tpu_hlo_select(H, neg, kio, tpu_lower_full(L, it, (double)C)),
                                   tpu_hlo_constant_int(H, TPU_S64, C), (int64_t[]){1}, 1, TPU_HLO_MIN);
  tpu_hv used = tpu_hlo_compare(H, TPU_HLO_LT, kio, tpu_hlo_broadcast_in_dim(H, firstneg, 2, nc, (int64_t[]){0}));
  tpu_hlo_type it3 = tpu_hlo_type_make(TPU_S64, 3, nkc);
  tpu_hv cls = tpu_hlo_iota(H, it3, 2);
  tpu_hv tgb = tpu_hlo_broadcast_in_dim(H, tg, 3, nkc, (int64_t[]){0, 1});
  tpu_hv h = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_EQ, tgb, cls),
                            tpu_hlo_broadcast_in_dim(H, used, 3, nkc, (int64_t[]){0, 1}));
  tpu_hv isb = tpu_hlo_reduce(H, h, tpu_hlo_constant_int(H, TPU_PRED, 0), (int64_t[]){1}, 1, TPU_HLO_OR); /* [N, C] */
  tpu_hv hf = tpu_hlo_convert(H, h, acc);
  tpu_hv xb = tpu_hlo_broadcast_in_dim(H, x, 3, nkc, (int64_t[]){0, 2});
  tpu_hv xt = tpu_reduce_sum(L, tpu_mul(L, hf, xb), (int64_t[]){2}, 1); /* x[t_k], [N, K] */
  tpu_hv d = tpu_sub(L, tpu_add(L, tpu_k(L, xb, 1), xb), tpu_hlo_broadcast_in_dim(H, xt, 3, nkc, (int64_t[]){0, 1}));
  tpu_hv live =
      tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_broadcast_in_dim(H, used, 3, nkc, (int64_t[]){0, 1}),
                     tpu_hlo_unary(H, TPU_HLO_NOT, tpu_hlo_broadcast_in_dim(H, isb, 3, nkc, (int64_t[]){0, 2})));
  live = tpu_hlo_binary(H, TPU_HLO_AND, live, tpu_hlo_compare(H, TPU_HLO_GT, d, tpu_k(L, d, 0)));
  *z = tpu_hlo_select(H, live, d, tpu_k(L, d, 0));
  *hot = hf;
  *ist = isb;
}

/* multilabel_margin_loss_forward(self, target, reduction) -> (output, is_target) */
void tpu_emit_multilabel_margin_loss_forward(tpu_lower *L) {
  if (!tpu_need_float(L, 0, "multilabel_margin_loss_forward_out_frame")) return;
  int64_t N, C;
  if (!tpu_mlm_shape(L, 0, 1, &N, &C)) return;
  tpu_tref *s = &L->args[0].t;
  tpu_dtype dt = s->dtype;
  tpu_hv z, hot, ist;
  tpu_mlm_terms(L, 0, 1, N, C, &z, &hot, &ist);
  tpu_hv l = tpu_reduce_sum(L, z, (int64_t[]){1, 2}, 2);
  l = tpu_hlo_binary(H, TPU_HLO_DIV, l, tpu_k(L, l, (double)C));
  int64_t red = L->args[2].i;
  if (red == RED_NONE && s->rank < 2) l = tpu_hlo_reshape(H, l, 0, NULL);
  tpu_loss_out(L, l, red, dt);
  tpu_lower_out(L, tpu_hlo_reshape(H, tpu_hlo_convert(H, ist, dt), s->rank, s->sizes));
}

/* multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target) */
void tpu_emit_multilabel_margin_loss_backward(tpu_lower *L) {
  int64_t N, C;
  if (!tpu_mlm_shape(L, 1, 2, &N, &C)) return;
  tpu_tref *s = &L->args[1].t;
  tpu_dtype dt = s->dtype;
  tpu_hv z, hot, ist;
  tpu_mlm_terms(L, 1, 2, N, C, &z, &hot, &ist);
  tpu_dtype acc = T(L, z)->dtype;
  tpu_hv act = tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_GT, z, tpu_k(L, z, 0)), acc); /* [N, K, C] */
  /* +1 for class c per active (k, c), -1 for each target t_k per active c */
  tpu_hv gc = tpu_reduce_sum(L, act, (int64_t[]){1}, 1);  /* [N, C] */
  tpu_hv cnt = tpu_reduce_sum(L, act, (int64_t[]){2}, 1); /* [N, K] */
  int64_t nkc[3] = {N, C, C};
  tpu_hv gt = tpu_reduce_sum(L, tpu_mul(L, hot, tpu_hlo_broadcast_in_dim(H, cnt, 3, nkc, (int64_t[]){0, 1})),
                             (int64_t[]){1}, 1); /* [N, C] */
  tpu_hv r = tpu_sub(L, gc, gt);
  int64_t red = L->args[3].i;
  tpu_hv g = tpu_hlo_convert(H, tpu_lower_tensor(L, 0, -1), acc);
  if (red == RED_NONE) {
    g = tpu_hlo_reshape(H, g, 1, &N);
  } else {
    g = tpu_hlo_reshape(H, g, 0, NULL);
    if (red == RED_MEAN) g = tpu_hlo_binary(H, TPU_HLO_DIV, g, tpu_k(L, g, (double)N));
    g = tpu_hlo_broadcast_in_dim(H, g, 1, &N, NULL);
  }
  g = tpu_hlo_binary(H, TPU_HLO_DIV, g, tpu_k(L, g, (double)C));
  r = tpu_mul(L, r, tpu_bcast_rows(L, g, N, C));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, r, s->rank, s->sizes), dt));
}

/* ---- nll_loss2d ---------------------------------------------------------------------------- */

/* One-hot of target [N, H, W] over dim 1 of [N, C, H, W] and the per-pixel
 * weight w[t] * (t != ignore_index), [N, H, W]. */
static bool tpu_nll2d_common(tpu_lower *L, int si, int ti, int wi, int ii, tpu_hv *hot, tpu_hv *w) {
  tpu_tref *s = &L->args[si].t, *t = &L->args[ti].t;
  if (s->rank != 4) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "only batches of spatial inputs supported (4D tensors), but got input of dimension: %d", s->rank);
    return false;
  }
  if (t->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "only batches of spatial targets supported (3D tensors) but got targets of dimension: %d", t->rank);
    return false;
  }
  if (s->sizes[0] != t->sizes[0] || s->sizes[2] != t->sizes[1] || s->sizes[3] != t->sizes[2]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "input and target batch or spatial sizes don't match: target [%lld, %lld, %lld], "
                   "input [%lld, %lld, %lld, %lld]",
                   (long long)t->sizes[0], (long long)t->sizes[1], (long long)t->sizes[2], (long long)s->sizes[0],
                   (long long)s->sizes[1], (long long)s->sizes[2], (long long)s->sizes[3]);
    return false;
  }
  if (tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected scalar type Long but found %s", tpu_dtype_name(t->dtype));
    return false;
  }
  tpu_dtype acc = tpu_acc_type(s->dtype);
  int64_t C = s->sizes[1];
  if (!tpu_nll_weight_ok(L, wi, C, true)) return false;
  tpu_hv tg = tpu_hlo_convert(H, tpu_lower_tensor(L, ti, -1), TPU_S64);
  tpu_lower_check_targets(L, tg, C, L->args[ii].i);
  const tpu_hlo_type tt = *T(L, tg);
  tpu_hv h = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_broadcast_in_dim(H, tg, 4, s->sizes, (int64_t[]){0, 2, 3}),
                             tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 4, s->sizes), 1));
  tpu_hv hf = tpu_hlo_convert(H, h, acc);
  tpu_hv valid = tpu_hlo_compare(H, TPU_HLO_NE, tg, tpu_lower_full(L, tt, (double)L->args[ii].i));
  tpu_hv wn;
  if (!tpu_lower_is_none(L, wi)) {
    tpu_hv wv = tpu_hlo_reshape(H, tpu_lower_input(L, wi, acc), 1, &C);
    wn = tpu_reduce_sum(L, tpu_mul(L, hf, tpu_hlo_broadcast_in_dim(H, wv, 4, s->sizes, (int64_t[]){1})), (int64_t[]){1},
                        1);
  } else {
    wn = tpu_lower_full(L, tpu_hlo_type_make(acc, 3, tt.dims), 1);
  }
  *w = tpu_hlo_select(H, valid, wn, tpu_k(L, wn, 0));
  *hot = hf;
  return true;
}

/* nll_loss2d_forward(self, target, weight, reduction, ignore_index) -> (output, total_weight) */
void tpu_emit_nll_loss2d_forward(tpu_lower *L) {
  if (!tpu_need_float(L, 0, "nll_loss2d_forward_out_frame")) return;
  tpu_dtype dt = L->args[0].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv hot, w;
  if (!tpu_nll2d_common(L, 0, 1, 2, 4, &hot, &w)) return;
  tpu_hv x = tpu_lower_input(L, 0, acc);
  tpu_hv picked = tpu_reduce_sum(L, tpu_mul(L, x, hot), (int64_t[]){1}, 1);
  /* a masked-out pixel picks nothing; keep inf * 0 out of the product */
  tpu_hv loss = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, w, tpu_k(L, w, 0)),
                               tpu_hlo_unary(H, TPU_HLO_NEG, tpu_mul(L, picked, w)), tpu_k(L, w, 0));
  tpu_hv tw = tpu_sum_all(L, w);
  int64_t red = L->args[3].i;
  if (red == RED_NONE) {
    tpu_lower_out(L, tpu_hlo_convert(H, loss, dt));
  } else {
    tpu_hv s = tpu_sum_all(L, loss);
    tpu_lower_out(L, tpu_hlo_convert(H, red == RED_MEAN ? tpu_hlo_binary(H, TPU_HLO_DIV, s, tw) : s, dt));
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tw, dt));
}

/* nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight) */
void tpu_emit_nll_loss2d_backward(tpu_lower *L) {
  tpu_tref *s = &L->args[1].t;
  tpu_dtype dt = s->dtype, acc = tpu_acc_type(dt);
  tpu_hv hot, w;
  if (!tpu_nll2d_common(L, 1, 2, 3, 5, &hot, &w)) return;
  const tpu_hlo_type wt = *T(L, w);
  tpu_hv g = tpu_lower_input(L, 0, acc);
  int64_t red = L->args[4].i;
  if (red != RED_NONE) {
    g = tpu_hlo_reshape(H, g, 0, NULL);
    if (red == RED_MEAN) g = tpu_hlo_binary(H, TPU_HLO_DIV, g, tpu_hlo_reshape(H, tpu_lower_input(L, 6, acc), 0, NULL));
    g = tpu_hlo_broadcast_in_dim(H, g, 3, wt.dims, NULL);
  }
  tpu_hv coef = tpu_hlo_unary(H, TPU_HLO_NEG, tpu_mul(L, g, w));
  tpu_hv r = tpu_mul(L, hot, tpu_hlo_broadcast_in_dim(H, coef, 4, s->sizes, (int64_t[]){0, 2, 3}));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* ---- CTC loss -------------------------------------------------------------------------------
 * The alpha (and, for the gradient, beta) recursions over time are
 * stablehlo.while loops (unrolled steps made XLA's compile time grow with T);
 * the lengths are int lists (attributes) and enter the loop as constants. Work is in log space over the
 * extended label sequence l' (blanks around each target), S' = 2 max(L) + 1
 * per sample; steps past a sample's input length keep its state. */

typedef struct {
  int64_t T, N, C, S; /* S: extended length 2 * max target length + 1 */
  int64_t in_len[TPU_MAX_LIST], tg_len[TPU_MAX_LIST];
  tpu_dtype dt;
  tpu_hv lpe;    /* [T, N, S] log-probs of each extended label */
  tpu_hv ext;    /* [N, S] extended labels (s64) */
  tpu_hv skip;   /* [N, S] pred: the s-2 -> s transition is allowed */
  tpu_hv neginf; /* [N, S] of -inf */
} tpu_ctc;

static tpu_hv tpu_lse(tpu_lower *L, const tpu_hv *v, int n) {
  tpu_hv m = v[0];
  for (int i = 1; i < n; i++) m = tpu_hlo_binary(H, TPU_HLO_MAX, m, v[i]);
  tpu_hv fin = tpu_hlo_unary(H, TPU_HLO_IS_FINITE, m);
  tpu_hv ms = tpu_hlo_select(H, fin, m, tpu_k(L, m, 0));
  tpu_hv s = tpu_hlo_unary(H, TPU_HLO_EXP, tpu_sub(L, v[0], ms));
  for (int i = 1; i < n; i++) s = tpu_add(L, s, tpu_hlo_unary(H, TPU_HLO_EXP, tpu_sub(L, v[i], ms)));
  return tpu_hlo_select(H, fin, tpu_add(L, ms, tpu_hlo_unary(H, TPU_HLO_LOG, s)), m);
}

/* x [N, S] shifted along S by k (positive: towards higher s), filled with fill */
static tpu_hv tpu_ctc_shift(tpu_lower *L, tpu_hv x, int64_t k, tpu_hv fill) {
  int64_t lo[2] = {0, k}, hi[2] = {0, -k}, in[2] = {0, 0};
  return tpu_hlo_pad(H, x, fill, lo, hi, in);
}

/* A [N] mask constant (per-sample condition) broadcast to [N, S]. */
static tpu_hv tpu_ctc_rows(tpu_lower *L, tpu_ctc *c, const bool *rows) {
  int64_t v[TPU_MAX_LIST];
  for (int64_t n = 0; n < c->N; n++) v[n] = rows[n];
  tpu_hv m = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 1, &c->N), v);
  return tpu_hlo_broadcast_in_dim(H, m, 2, (int64_t[]){c->N, c->S}, (int64_t[]){0});
}

static bool tpu_ctc_setup(tpu_lower *L, tpu_ctc *c, int lpi, int tgi, int ili, int tli, int blank_i) {
  tpu_tref *lp = &L->args[lpi].t, *tg = &L->args[tgi].t;
  if (lp->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "ctc_loss: expected log_probs to be 3-D (T, N, C), got %d-D", lp->rank);
    return false;
  }
  if (!tpu_dtype_is_float(lp->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"ctc_loss_cpu\" not implemented for '%s'", tpu_dtype_name(lp->dtype));
    return false;
  }
  c->T = lp->sizes[0];
  c->N = lp->sizes[1];
  c->C = lp->sizes[2];
  c->dt = tpu_acc_type(lp->dtype);
  int64_t blank = L->args[blank_i].i;
  if (blank < 0 || blank >= c->C) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "blank must be in label range");
    return false;
  }
  tpu_arg *il = &L->args[ili], *tl = &L->args[tli];
  if (il->nints != c->N || tl->nints != c->N) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "input_lengths and target_lengths must have batch_size (%lld) entries",
                   (long long)c->N);
    return false;
  }
  int64_t maxl = 0, total = 0;
  for (int64_t n = 0; n < c->N; n++) {
    c->in_len[n] = il->ints[n];
    c->tg_len[n] = tl->ints[n];
    if (c->in_len[n] < 0 || c->in_len[n] > c->T) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Expected input_lengths to have value at most %lld, but got value %lld "
                     "(while checking arguments for ctc_loss_cpu)",
                     (long long)c->T, (long long)c->in_len[n]);
      return false;
    }
    if (c->tg_len[n] < 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "target lengths must be non-negative");
      return false;
    }
    if (c->tg_len[n] > maxl) maxl = c->tg_len[n];
    total += c->tg_len[n];
  }
  c->S = 2 * maxl + 1;
  int64_t NS = c->N * c->S, M = 1;
  for (int i = 0; i < tg->rank; i++) M *= tg->sizes[i];
  if (tg->rank == 2 && tg->sizes[1] < maxl) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected tensor to have size at least %lld at dimension 1, but got size %lld "
                   "for argument #2 'targets' (while checking arguments for ctc_loss_cpu)",
                   (long long)maxl, (long long)tg->sizes[1]);
    return false;
  }
  if (tg->rank == 1 && M < total) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "targets has %lld elements, expected at least the sum of target_lengths (%lld)",
                   (long long)M, (long long)total);
    return false;
  }
  if (tg->rank != 1 && tg->rank != 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "targets must be 1-D (concatenated) or 2-D (padded)");
    return false;
  }
  /* where each odd extended position reads its target (flat index into targets) */
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)(NS ? NS : 1));
  int64_t *useb = malloc(sizeof(int64_t) * (size_t)(NS ? NS : 1));
  if (!idx || !useb) {
    free(idx);
    free(useb);
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "ctc_loss: out of memory");
    return false;
  }
  int64_t off = 0;
  for (int64_t n = 0; n < c->N; n++) {
    for (int64_t s = 0; s < c->S; s++) {
      int64_t k = (s - 1) / 2;
      bool lab = (s & 1) && k < c->tg_len[n];
      int64_t base = tg->rank == 2 ? n * tg->sizes[1] : off;
      idx[n * c->S + s] = lab ? base + k : 0;
      useb[n * c->S + s] = !lab;
    }
    off += c->tg_len[n];
  }
  tpu_hv ix = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, (int64_t[]){NS, 1}), idx);
  tpu_hv isb = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 2, (int64_t[]){c->N, c->S}), useb);
  free(idx);
  free(useb);
  int64_t ns[2] = {c->N, c->S};
  tpu_hv flat = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, tgi, -1), TPU_S64), 2, (int64_t[]){M, 1});
  tpu_hv lab = M ? tpu_hlo_reshape(H, tpu_lower_gather_rows(L, flat, ix), 2, ns)
                 : tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 2, ns), (double)blank);
  tpu_hv bl = tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 2, ns), (double)blank);
  c->ext = tpu_hlo_select(H, isb, bl, lab);
  /* s-2 -> s allowed when l'_s is a label different from l'_{s-2} */
  tpu_hv prev2 = tpu_ctc_shift(L, c->ext, 2, tpu_hlo_constant_int(H, TPU_S64, blank));
  c->skip = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_NE, c->ext, bl),
                           tpu_hlo_compare(H, TPU_HLO_NE, c->ext, prev2));
  /* lpe[t, n, s] = log_probs[t, n, l'_s] */
  int64_t tnsc[4] = {c->T, c->N, c->S, c->C};
  tpu_hv hot = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_broadcast_in_dim(H, c->ext, 4, tnsc, (int64_t[]){1, 2}),
                               tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 4, tnsc), 3));
  tpu_hv lpb = tpu_hlo_broadcast_in_dim(H, tpu_lower_input(L, lpi, c->dt), 4, tnsc, (int64_t[]){0, 1, 3});
  c->lpe = tpu_reduce_sum(L, tpu_hlo_select(H, hot, lpb, tpu_k(L, lpb, 0)), (int64_t[]){3}, 1);
  c->neginf = tpu_lower_full(L, tpu_hlo_type_make(c->dt, 2, ns), -INFINITY);
  return tpu_hlo_ok(H);
}

/* A stablehlo.while over t carrying (t, state [N, S], history [T, N, S],
 * lpe, skip, lengths): step t runs one recursion of alpha (forward, t up
 * from 0) or beta (backward, t down from T - 1) and stores it in the
 * history. Everything the body reads is carried, so the loop body uses only
 * its own arguments. */
static tpu_hv tpu_ctc_scan(tpu_lower *L, tpu_ctc *c, bool forward, tpu_hv state0, tpu_hv skip, tpu_hv endm) {
  int64_t ns[2] = {c->N, c->S}, tns[3] = {c->T, c->N, c->S}, n1s[3] = {1, c->N, c->S};
  int64_t lens[TPU_MAX_LIST];
  for (int64_t n = 0; n < c->N; n++) lens[n] = c->in_len[n];
  tpu_hv len = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 1, &c->N), lens);
  tpu_hv hist0 = tpu_lower_full(L, tpu_hlo_type_make(c->dt, 3, tns), -INFINITY);
  tpu_hv t0 = tpu_hlo_constant_int(H, TPU_S64, forward ? 0 : c->T - 1);
  tpu_hv init[7] = {t0, state0, hist0, c->lpe, skip, endm, len};
  tpu_hlo_type ty[7];
  for (int i = 0; i < 7; i++) ty[i] = *T(L, init[i]);
  tpu_hv a[7];
  tpu_hlo_region_begin(H, ty, 7, a);
  tpu_hv cont = forward ? tpu_hlo_compare(H, TPU_HLO_LT, a[0], tpu_hlo_constant_int(H, TPU_S64, c->T))
                        : tpu_hlo_compare(H, TPU_HLO_GE, a[0], tpu_hlo_constant_int(H, TPU_S64, 0));
  int cond = tpu_hlo_region_end(H, &cont, 1);
  tpu_hlo_region_begin(H, ty, 7, a);
  tpu_hv zero = tpu_hlo_constant_int(H, TPU_S64, 0);
  tpu_hv st[3] = {a[0], zero, zero};
  tpu_hv lp = tpu_hlo_reshape(H, tpu_hlo_dynamic_slice(H, a[3], st, n1s), 2, ns);
  tpu_hv ninf = tpu_hlo_constant(H, c->dt, -INFINITY);
  tpu_hv neg = tpu_lower_full(L, tpu_hlo_type_make(c->dt, 2, ns), -INFINITY);
  tpu_hv p = a[1];
  int64_t d = forward ? 1 : -1;
  tpu_hv v[3] = {p, tpu_ctc_shift(L, p, d, ninf), tpu_hlo_select(H, a[4], tpu_ctc_shift(L, p, 2 * d, ninf), neg)};
  tpu_hv rec = tpu_add(L, tpu_lse(L, v, 3), lp);
  tpu_hv tb = tpu_hlo_broadcast_in_dim(H, a[0], 1, &c->N, NULL);
  tpu_hv one = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, 1), 1, &c->N, NULL);
  tpu_hv r;
  if (forward) {
    /* samples past their input length keep their state */
    tpu_hv act = tpu_hlo_broadcast_in_dim(H, tpu_hlo_compare(H, TPU_HLO_LT, tb, a[6]), 2, ns, (int64_t[]){0});
    r = tpu_hlo_select(H, act, rec, p);
  } else {
    /* beta starts at t = T_n - 1 on the last two positions */
    tpu_hv last = tpu_sub(L, a[6], one);
    tpu_hv at_end = tpu_hlo_broadcast_in_dim(H, tpu_hlo_compare(H, TPU_HLO_EQ, tb, last), 2, ns, (int64_t[]){0});
    tpu_hv act = tpu_hlo_broadcast_in_dim(H, tpu_hlo_compare(H, TPU_HLO_LT, tb, last), 2, ns, (int64_t[]){0});
    r = tpu_hlo_select(H, act, rec, neg);
    r = tpu_hlo_select(H, at_end, tpu_hlo_select(H, a[5], lp, neg), r);
  }
  tpu_hv hist = tpu_hlo_dynamic_update_slice(H, a[2], tpu_hlo_reshape(H, r, 3, n1s), st);
  tpu_hv nt = tpu_hlo_binary(H, forward ? TPU_HLO_ADD : TPU_HLO_SUB, a[0], tpu_hlo_constant_int(H, TPU_S64, 1));
  tpu_hv res[7] = {nt, r, hist, a[3], a[4], a[5], a[6]};
  int body = tpu_hlo_region_end(H, res, 7);
  int regions[2] = {cond, body};
  tpu_hv outs[7];
  for (int i = 0; i < 7; i++) outs[i] = TPU_HV_NONE;
  tpu_hlo_emit(H, "stablehlo.while", init, 7, regions, 2, NULL, ty, 7, outs);
  return outs[2];
}

/* alphas [T, N, S] (alpha[t] for t >= T_n repeats alpha[T_n - 1]) */
static tpu_hv tpu_ctc_alphas(tpu_lower *L, tpu_ctc *c) {
  /* alpha before t = 0: 0 at s = 0, so that step 0 gives lp on s = 0, 1 */
  tpu_hv sio = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, (int64_t[]){c->N, c->S}), 1);
  tpu_hv s0 =
      tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, sio, tpu_k(L, sio, 0)), tpu_k(L, c->neginf, 0), c->neginf);
  tpu_hv nomask = tpu_lower_full(L, tpu_hlo_type_make(TPU_PRED, 2, (int64_t[]){c->N, c->S}), 0);
  return tpu_ctc_scan(L, c, true, s0, c->skip, nomask);
}

/* per-sample -log p: -lse(alpha[T_n-1][2L], alpha[T_n-1][2L-1]) ([N]) */
static tpu_hv tpu_ctc_nll(tpu_lower *L, tpu_ctc *c, tpu_hv la) {
  int64_t ns[2] = {c->N, c->S};
  int64_t *e1 = malloc(sizeof(int64_t) * (size_t)(c->N * c->S)), *e2 = malloc(sizeof(int64_t) * (size_t)(c->N * c->S));
  if (!e1 || !e2) {
    free(e1);
    free(e2);
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "ctc_loss: out of memory");
    return TPU_HV_NONE;
  }
  for (int64_t n = 0; n < c->N; n++)
    for (int64_t s = 0; s < c->S; s++) {
      e1[n * c->S + s] = s == 2 * c->tg_len[n];
      e2[n * c->S + s] = c->tg_len[n] > 0 && s == 2 * c->tg_len[n] - 1;
    }
  tpu_hv m1 = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 2, ns), e1);
  tpu_hv m2 = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 2, ns), e2);
  free(e1);
  free(e2);
  /* the last alpha holds each sample's final state (later steps kept it) */
  tpu_hv last = c->neginf;
  if (c->T)
    last = tpu_hlo_reshape(
        H, tpu_hlo_slice(H, la, (int64_t[]){c->T - 1, 0, 0}, (int64_t[]){c->T, c->N, c->S}, (int64_t[]){1, 1, 1}), 2,
        ns);
  bool rows[TPU_MAX_LIST];
  for (int64_t n = 0; n < c->N; n++) rows[n] = c->in_len[n] > 0;
  last = tpu_hlo_select(H, tpu_ctc_rows(L, c, rows), last, c->neginf);
  tpu_hv ninf0 = tpu_hlo_constant(H, c->dt, -INFINITY);
  int64_t one = 1;
  tpu_hv a1 = tpu_hlo_reduce(H, tpu_hlo_select(H, m1, last, c->neginf), ninf0, &one, 1, TPU_HLO_MAX);
  tpu_hv a2 = tpu_hlo_reduce(H, tpu_hlo_select(H, m2, last, c->neginf), ninf0, &one, 1, TPU_HLO_MAX);
  tpu_hv v[2] = {a1, a2};
  return tpu_hlo_unary(H, TPU_HLO_NEG, tpu_lse(L, v, 2));
}

/* _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False)
 * -> (neg_log_likelihood [N], log_alpha [N, T, S']) */
void tpu_emit_ctc_loss(tpu_lower *L) {
  tpu_ctc c;
  if (!tpu_ctc_setup(L, &c, 0, 1, 2, 3, 4)) return;
  tpu_hv la = tpu_ctc_alphas(L, &c); /* [T, N, S] */
  /* infinite losses stay: ctc_loss zeroes them after this op under
   * zero_infinity, and the backward recognises them by their value */
  tpu_hv nll = tpu_ctc_nll(L, &c, la);
  tpu_dtype dt = L->args[0].t.dtype;
  tpu_lower_out(L, tpu_hlo_convert(H, nll, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_transpose(H, la, (int64_t[]){1, 0, 2}), dt));
}

/* _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood,
 *                    log_alpha, blank, zero_infinity):
 * grad[t, n, c] = g[n] (exp(lp) - exp(lse_{s: l'_s = c}(alpha + beta) + nll - lp)) for t < T_n */
void tpu_emit_ctc_loss_backward(tpu_lower *L) {
  tpu_ctc c;
  if (!tpu_ctc_setup(L, &c, 1, 2, 3, 4, 7)) return;
  int64_t ns[2] = {c.N, c.S}, NS = c.N * c.S;
  int64_t tnsc[4] = {c.T, c.N, c.S, c.C}, tnc[3] = {c.T, c.N, c.C};
  /* beta's start at t = T_n - 1: positions 2L and 2L - 1 */
  int64_t *e = malloc(sizeof(int64_t) * (size_t)(NS ? NS : 1));
  if (!e) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "ctc_loss: out of memory");
    return;
  }
  for (int64_t n = 0; n < c.N; n++)
    for (int64_t s = 0; s < c.S; s++)
      e[n * c.S + s] = s == 2 * c.tg_len[n] || (c.tg_len[n] > 0 && s == 2 * c.tg_len[n] - 1);
  tpu_hv endm = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 2, ns), e);
  free(e);
  /* the s -> s+2 transition of beta is allowed when skip[s + 2] */
  tpu_hv skip_next = tpu_ctc_shift(L, c.skip, -2, tpu_hlo_constant_int(H, TPU_PRED, 0));
  tpu_hv beta = tpu_ctc_scan(L, &c, false, c.neginf, skip_next, endm); /* [T, N, S] */
  tpu_hv alpha = tpu_hlo_transpose(H, tpu_hlo_convert(H, tpu_lower_tensor(L, 6, -1), c.dt), (int64_t[]){1, 0, 2});
  tpu_hv ab = tpu_add(L, alpha, beta);
  tpu_hv hot = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_broadcast_in_dim(H, c.ext, 4, tnsc, (int64_t[]){1, 2}),
                               tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 4, tnsc), 3));
  tpu_hv abb = tpu_hlo_select(H, hot, tpu_hlo_broadcast_in_dim(H, ab, 4, tnsc, (int64_t[]){0, 1, 2}),
                              tpu_lower_full(L, tpu_hlo_type_make(c.dt, 4, tnsc), -INFINITY));
  /* logsumexp over s */
  tpu_hv m = tpu_hlo_reduce(H, abb, tpu_hlo_constant(H, c.dt, -INFINITY), (int64_t[]){2}, 1, TPU_HLO_MAX);
  tpu_hv fin = tpu_hlo_unary(H, TPU_HLO_IS_FINITE, m);
  tpu_hv ms = tpu_hlo_select(H, fin, m, tpu_k(L, m, 0));
  tpu_hv sum = tpu_reduce_sum(
      L, tpu_hlo_unary(H, TPU_HLO_EXP, tpu_sub(L, abb, tpu_hlo_broadcast_in_dim(H, ms, 4, tnsc, (int64_t[]){0, 1, 3}))),
      (int64_t[]){2}, 1);
  tpu_hv lcab = tpu_hlo_select(H, fin, tpu_add(L, ms, tpu_hlo_unary(H, TPU_HLO_LOG, sum)), m); /* [T, N, C] */
  tpu_hv lp = tpu_lower_input(L, 1, c.dt);
  tpu_hv nll = tpu_hlo_broadcast_in_dim(H, tpu_lower_input(L, 5, c.dt), 3, tnc, (int64_t[]){1});
  tpu_hv g = tpu_hlo_broadcast_in_dim(H, tpu_lower_input(L, 0, c.dt), 3, tnc, (int64_t[]){1});
  tpu_hv r = tpu_sub(L, tpu_hlo_unary(H, TPU_HLO_EXP, lp),
                     tpu_hlo_unary(H, TPU_HLO_EXP, tpu_sub(L, tpu_add(L, lcab, nll), lp)));
  r = tpu_mul(L, r, g);
  /* steps past each input length, and infinite losses under zero_infinity, get 0 */
  int64_t *mk = malloc(sizeof(int64_t) * (size_t)(c.T * c.N > 0 ? c.T * c.N : 1));
  if (!mk) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "ctc_loss: out of memory");
    return;
  }
  for (int64_t t = 0; t < c.T; t++)
    for (int64_t n = 0; n < c.N; n++) mk[t * c.N + n] = t < c.in_len[n];
  tpu_hv keep = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 2, (int64_t[]){c.T, c.N}), mk);
  free(mk);
  keep = tpu_hlo_broadcast_in_dim(H, keep, 3, tnc, (int64_t[]){0, 1});
  if (tpu_arg_bool(L, 8))
    keep = tpu_hlo_binary(H, TPU_HLO_AND, keep, tpu_hlo_compare(H, TPU_HLO_NE, nll, tpu_k(L, nll, INFINITY)));
  r = tpu_hlo_select(H, keep, r, tpu_k(L, r, 0));
  tpu_lower_out(L, tpu_hlo_convert(H, r, L->args[1].t.dtype));
}

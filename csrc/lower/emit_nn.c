/* emit_nn.c: nn layers that compute along dims: softmax and log_softmax,
 * the normalizations (layer norm, batch norm, group norm) and the fused
 * LSTM and GRU cells, with their backwards. */
#include <math.h>

#include "emit.h"

/* Sum over dims keeping them (size 1). */
static tpu_hv tpu_sum_keep(tpu_lower *L, tpu_hv x, const int64_t *dims, int n) {
  const tpu_hlo_type in = *T(L, x);
  bool mask[TPU_MAX_RANK] = {0};
  for (int i = 0; i < n; i++) mask[dims[i]] = true;
  return tpu_keepdim(L, tpu_reduce_sum(L, x, dims, n), &in, mask, true);
}

/* ---- softmax ---------------------------------------------------------------------------- */

/* _softmax / _log_softmax (self, dim, half_to_float) */
static void tpu_emit_softmax_impl(tpu_lower *L, bool log) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = t->dtype;
  if (!tpu_dtype_is_float(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"%s_lastdim_kernel_impl\" not implemented for '%s'",
                   log ? "log_softmax" : "softmax", tpu_dtype_name(dt));
    return;
  }
  tpu_dtype out = tpu_arg_bool(L, 2) ? TPU_F32 : dt, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc);
  if (t->rank == 0) x = tpu_hlo_reshape(H, x, 1, (int64_t[]){1});
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  tpu_hlo_type in = *T(L, x);
  bool mask[TPU_MAX_RANK] = {0};
  mask[d] = true;
  tpu_hv m = tpu_keepdim(L, tpu_reduce_extreme(L, x, &d, 1, true), &in, mask, true);
  /* A row of -inf has max -inf: shifted by 0 instead, it gives NaN from 0 / 0 as the CPU does.
   * A +inf or NaN max stays: inf - inf is NaN, and the whole row is NaN, as on the CPU. */
  tpu_hv ninf = tpu_hlo_compare(H, TPU_HLO_EQ, m, tpu_k(L, m, -INFINITY));
  m = tpu_hlo_select(H, ninf, tpu_k(L, m, 0), m);
  tpu_hv sh = tpu_lower_binary(L, TPU_HLO_SUB, x, m);
  tpu_hv e = tpu_hlo_unary(H, TPU_HLO_EXP, sh);
  tpu_hv s = tpu_keepdim(L, tpu_reduce_sum(L, e, &d, 1), &in, mask, true);
  /* softmax multiplies by the reciprocal of the row sum, as torch's CPU
   * kernel does (and no barrier is needed, see tpu_hlo_set_exact_division) */
  tpu_hv r = log ? tpu_lower_binary(L, TPU_HLO_SUB, sh, tpu_hlo_unary(H, TPU_HLO_LOG, s))
                 : tpu_lower_binary(L, TPU_HLO_MUL, e, tpu_hlo_binary(H, TPU_HLO_DIV, tpu_k(L, s, 1), s));
  if (t->rank == 0) r = tpu_hlo_reshape(H, r, 0, NULL);
  tpu_lower_out(L, tpu_hlo_convert(H, r, out));
}
void tpu_emit_softmax(tpu_lower *L) { tpu_emit_softmax_impl(L, false); }
void tpu_emit_log_softmax(tpu_lower *L) { tpu_emit_softmax_impl(L, true); }

/* _softmax_backward_data(grad_output, output, dim, input_dtype) */
void tpu_emit_softmax_backward(tpu_lower *L) {
  tpu_dtype in_dt = L->args[3].dtype, acc = tpu_acc_type(L->args[1].t.dtype);
  tpu_hv g = tpu_lower_input(L, 0, acc), y = tpu_lower_input(L, 1, acc);
  int rank = T(L, y)->rank;
  int64_t d = tpu_lower_dim(L, L->args[2].i, rank);
  tpu_hv gy = tpu_mul(L, g, y);
  tpu_hv s = rank ? tpu_sum_keep(L, gy, &d, 1) : gy;
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, y, tpu_lower_binary(L, TPU_HLO_SUB, g, s)), in_dt));
}

/* _log_softmax_backward_data(grad_output, output, dim, input_dtype) */
void tpu_emit_log_softmax_backward(tpu_lower *L) {
  tpu_dtype in_dt = L->args[3].dtype, acc = tpu_acc_type(L->args[1].t.dtype);
  tpu_hv g = tpu_lower_input(L, 0, acc), y = tpu_lower_input(L, 1, acc);
  int rank = T(L, y)->rank;
  int64_t d = tpu_lower_dim(L, L->args[2].i, rank);
  tpu_hv s = rank ? tpu_sum_keep(L, g, &d, 1) : g;
  tpu_hv r = tpu_sub(L, g, tpu_lower_binary(L, TPU_HLO_MUL, tpu_hlo_unary(H, TPU_HLO_EXP, y), s));
  tpu_lower_out(L, tpu_hlo_convert(H, r, in_dt));
}

/* 1/sqrt(v + eps), rounded once through f64 as torch's CPU kernels divide
 * (XLA's f32 rsqrt is approximate); on a TPU, which emulates f64, its rsqrt. */
static tpu_hv tpu_inv_sqrt(tpu_lower *L, tpu_hv v, double eps) {
  tpu_dtype dt = T(L, v)->dtype;
  tpu_hv ve = tpu_add(L, v, tpu_k(L, v, eps));
  if (L->tpu_like && dt != TPU_F64) return tpu_hlo_unary(H, TPU_HLO_RSQRT, ve);
  tpu_hv sd = tpu_hlo_unary(H, TPU_HLO_SQRT, tpu_hlo_convert(H, ve, TPU_F64));
  return tpu_hlo_convert(H, tpu_hlo_binary(H, TPU_HLO_DIV, tpu_k(L, sd, 1), sd), dt);
}

/* ---- layer norm ------------------------------------------------------------------------ */

/* native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd) */
void tpu_emit_native_layer_norm(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int nn = L->args[1].nints, axis = t->rank - nn;
  if (nn == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                   "least one element, but got normalized_shape = []");
    return;
  }
  if (axis < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Given normalized_shape has too many dimensions for the input");
    return;
  }
  for (int i = 0; i < nn; i++)
    if (L->args[1].ints[i] != t->sizes[axis + i]) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Given normalized_shape=[...], expected input with shape [*, ...], "
                     "but got input of size with mismatch at dimension %d",
                     axis + i);
      return;
    }
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc);
  int64_t dims[TPU_MAX_RANK], count = 1;
  for (int i = 0; i < nn; i++) {
    dims[i] = axis + i;
    count *= t->sizes[axis + i];
  }
  tpu_hv mean = tpu_sum_keep(L, x, dims, nn);
  mean = tpu_hlo_binary(H, TPU_HLO_DIV, mean, tpu_k(L, mean, (double)count));
  tpu_hv xc = tpu_lower_binary(L, TPU_HLO_SUB, x, mean);
  tpu_hv var = tpu_sum_keep(L, tpu_mul(L, xc, xc), dims, nn);
  var = tpu_hlo_binary(H, TPU_HLO_DIV, var, tpu_k(L, var, (double)count));
  /* torch's CPU kernel divides, and the weight gradient of a one-element
   * norm depends on rstd's last bit (tpu_inv_sqrt) */
  tpu_hv rstd = tpu_inv_sqrt(L, var, L->args[4].f);
  tpu_hv y = tpu_lower_binary(L, TPU_HLO_MUL, xc, rstd);
  if (!tpu_lower_is_none(L, 2)) y = tpu_lower_binary(L, TPU_HLO_MUL, y, tpu_lower_input(L, 2, acc));
  if (!tpu_lower_is_none(L, 3)) y = tpu_lower_binary(L, TPU_HLO_ADD, y, tpu_lower_input(L, 3, acc));
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
  /* statistics in the input's dtype, or f32 for a half input with f32 params (torch's mixed type) */
  tpu_dtype sdt = (acc != dt && !tpu_lower_is_none(L, 2) && L->args[2].t.dtype == acc) ? acc : dt;
  tpu_lower_out(L, tpu_hlo_convert(H, mean, sdt));
  tpu_lower_out(L, tpu_hlo_convert(H, rstd, sdt));
}

/* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask) */
void tpu_emit_native_layer_norm_backward(tpu_lower *L) {
  tpu_tref *t = &L->args[1].t;
  int nn = L->args[2].nints, axis = t->rank - nn;
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt);
  tpu_hv g = tpu_lower_input(L, 0, acc), x = tpu_lower_input(L, 1, acc);
  tpu_hv mean = tpu_lower_input(L, 3, acc), rstd = tpu_lower_input(L, 4, acc);
  int64_t ndims[TPU_MAX_RANK], bdims[TPU_MAX_RANK], count = 1;
  for (int i = 0; i < nn; i++) {
    ndims[i] = axis + i;
    count *= t->sizes[axis + i];
  }
  for (int i = 0; i < axis; i++) bdims[i] = i;
  tpu_hv xhat = tpu_lower_binary(L, TPU_HLO_MUL, tpu_lower_binary(L, TPU_HLO_SUB, x, mean), rstd);
  tpu_hv gw = g;
  if (!tpu_lower_is_none(L, 5)) gw = tpu_lower_binary(L, TPU_HLO_MUL, g, tpu_lower_input(L, 5, acc));
  tpu_hv m1 = tpu_sum_keep(L, gw, ndims, nn);
  m1 = tpu_hlo_binary(H, TPU_HLO_DIV, m1, tpu_k(L, m1, (double)count));
  tpu_hv m2 = tpu_sum_keep(L, tpu_mul(L, gw, xhat), ndims, nn);
  m2 = tpu_hlo_binary(H, TPU_HLO_DIV, m2, tpu_k(L, m2, (double)count));
  tpu_hv gi = tpu_lower_binary(L, TPU_HLO_SUB, tpu_lower_binary(L, TPU_HLO_SUB, gw, m1),
                               tpu_lower_binary(L, TPU_HLO_MUL, xhat, m2));
  gi = tpu_lower_binary(L, TPU_HLO_MUL, gi, rstd);
  tpu_lower_out(L, tpu_hlo_convert(H, gi, dt));
  tpu_dtype wdt = tpu_lower_is_none(L, 5) ? dt : L->args[5].t.dtype;
  tpu_dtype bdt = tpu_lower_is_none(L, 6) ? dt : L->args[6].t.dtype;
  /* torch's CPU kernel forms x_hat for the weight gradient as fma(x, rstd,
   * -mean*rstd); when x - mean cancels (one normalized element) the fma's
   * rounding is all that remains, so compute it the same way (an f64 product
   * of two f32 values is exact). */
  tpu_hv xw = xhat;
  if (acc == TPU_F32 && !L->tpu_like) {
    tpu_hv b = tpu_hlo_unary(H, TPU_HLO_NEG, tpu_mul(L, mean, rstd));
    tpu_hv p64 = tpu_lower_binary(L, TPU_HLO_MUL, tpu_hlo_convert(H, x, TPU_F64), tpu_hlo_convert(H, rstd, TPU_F64));
    xw = tpu_hlo_convert(H, tpu_lower_binary(L, TPU_HLO_ADD, p64, tpu_hlo_convert(H, b, TPU_F64)), TPU_F32);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, tpu_mul(L, g, xw), bdims, axis), wdt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, g, bdims, axis), bdt));
}

/* ---- batch norm and group norm -------------------------------------------------------------
 *
 * Inputs are viewed as (N, C, S) (S: the product of the spatial dims). Batch
 * norm reduces over (N, S) per channel, group norm over (C/G, S) per (N, G).
 * Statistics are kept in the parameters' dtype (f32 for a half input with f32
 * parameters, else the input's), as torch's CPU kernels do; 1/sqrt as
 * tpu_inv_sqrt. */

/* The first present parameter's dtype, else the input's. */
static tpu_dtype tpu_param_type(tpu_lower *L, const int *params, int n, tpu_dtype input) {
  for (int k = 0; k < n; k++)
    if (params[k] >= 0 && !tpu_lower_is_none(L, params[k])) return L->args[params[k]].t.dtype;
  return input;
}

static void tpu_ncs(const tpu_tref *t, int64_t *ncs) {
  ncs[0] = t->sizes[0];
  ncs[1] = t->rank > 1 ? t->sizes[1] : 1;
  ncs[2] = 1;
  for (int i = 2; i < t->rank; i++) ncs[2] *= t->sizes[i];
}

/* A per-channel vector (arg i, or the constant dflt when None) broadcast over (N, C, S). */
static tpu_hv tpu_chan(tpu_lower *L, int i, tpu_dtype acc, const int64_t *ncs, double dflt) {
  int64_t one = 1;
  if (i < 0 || tpu_lower_is_none(L, i)) return tpu_lower_full(L, tpu_hlo_type_make(acc, 3, ncs), dflt);
  tpu_hv v = tpu_hlo_reshape(H, tpu_lower_input(L, i, acc), 1, &ncs[1]);
  return tpu_hlo_broadcast_in_dim(H, v, 3, ncs, &one);
}

static tpu_hv tpu_chan_b(tpu_lower *L, tpu_hv v, const int64_t *ncs) {
  int64_t one = 1;
  return tpu_hlo_broadcast_in_dim(H, v, 3, ncs, &one);
}

static tpu_hv tpu_sum_ns(tpu_lower *L, tpu_hv x) {
  int64_t dims[2] = {0, 2};
  return tpu_hlo_reduce(H, x, tpu_hlo_constant(H, T(L, x)->dtype, 0), dims, 2, TPU_HLO_ADD);
}

static void tpu_bn_forward(tpu_lower *L, int rm_i, int rv_i, bool training, double momentum, double eps, bool reserve) {
  tpu_tref *t = &L->args[0].t;
  if (t->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "batch_norm: expected 2D or higher input, but got %dD", t->rank);
    return;
  }
  int params[4] = {1, 2, rm_i, rv_i};
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt), pdt = tpu_param_type(L, params, 4, dt);
  int64_t ncs[3], C;
  tpu_ncs(t, ncs);
  C = ncs[1];
  for (int k = 0; k < 4; k++) {
    int i = params[k];
    if (i < 0 || tpu_lower_is_none(L, i)) continue;
    tpu_tref *p = &L->args[i].t;
    int64_t n = 1;
    for (int d = 0; d < p->rank; d++) n *= p->sizes[d];
    if (n != C) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s should contain %lld elements not %lld",
                     k == 0   ? "weight"
                     : k == 1 ? "bias"
                     : k == 2 ? "running_mean"
                              : "running_var",
                     (long long)C, (long long)n);
      return;
    }
  }
  if (!training && (rm_i < 0 || tpu_lower_is_none(L, rm_i) || tpu_lower_is_none(L, rv_i))) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "running_mean and running_var must be defined in evaluation mode");
    return;
  }
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_input(L, 0, acc), 3, ncs);
  double count = (double)(ncs[0] * ncs[2]);
  tpu_hv mean, invstd, var = TPU_HV_NONE;
  if (training) {
    mean = tpu_sum_ns(L, x);
    mean = tpu_hlo_binary(H, TPU_HLO_DIV, mean, tpu_k(L, mean, count));
    tpu_hv xc = tpu_sub(L, x, tpu_chan_b(L, mean, ncs));
    var = tpu_sum_ns(L, tpu_mul(L, xc, xc));
    var = tpu_hlo_binary(H, TPU_HLO_DIV, var, tpu_k(L, var, count));
  } else {
    mean = tpu_hlo_reshape(H, tpu_lower_input(L, rm_i, acc), 1, &C);
    var = tpu_hlo_reshape(H, tpu_lower_input(L, rv_i, acc), 1, &C);
  }
  invstd = tpu_inv_sqrt(L, var, eps);
  /* torch's kernel normalizes with the statistics as stored (rounded to a half parameter type) */
  mean = tpu_hlo_convert(H, tpu_hlo_convert(H, mean, pdt), acc);
  invstd = tpu_hlo_convert(H, tpu_hlo_convert(H, invstd, pdt), acc);
  tpu_hv y = tpu_mul(L, tpu_sub(L, x, tpu_chan_b(L, mean, ncs)), tpu_chan_b(L, invstd, ncs));
  if (!tpu_lower_is_none(L, 1)) y = tpu_mul(L, y, tpu_chan(L, 1, acc, ncs, 1));
  if (!tpu_lower_is_none(L, 2)) y = tpu_add(L, y, tpu_chan(L, 2, acc, ncs, 0));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, y, t->rank, t->sizes), dt));
  if (training) {
    tpu_lower_out(L, tpu_hlo_convert(H, mean, pdt));
    tpu_lower_out(L, tpu_hlo_convert(H, invstd, pdt));
  } else {
    int64_t zero = 0;
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(pdt, 1, &zero), 0));
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(pdt, 1, &zero), 0));
  }
  if (reserve) {
    int64_t zero = 0;
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_U8, 1, &zero), 0));
  }
  if (training && rm_i >= 0 && !tpu_lower_is_none(L, rm_i)) {
    tpu_tref *r = &L->args[rm_i].t;
    tpu_hv old = tpu_hlo_reshape(H, tpu_lower_input(L, rm_i, acc), 1, &C);
    tpu_hv nv = tpu_add(L, tpu_mul(L, old, tpu_k(L, old, 1 - momentum)), tpu_mul(L, mean, tpu_k(L, mean, momentum)));
    tpu_lower_write(L, rm_i, -1, tpu_hlo_reshape(H, nv, r->rank, r->sizes));
  }
  if (training && rv_i >= 0 && !tpu_lower_is_none(L, rv_i)) {
    tpu_tref *r = &L->args[rv_i].t;
    tpu_hv old = tpu_hlo_reshape(H, tpu_lower_input(L, rv_i, acc), 1, &C);
    tpu_hv ub = tpu_mul(L, var, tpu_k(L, var, count / (count - 1)));
    tpu_hv nv = tpu_add(L, tpu_mul(L, old, tpu_k(L, old, 1 - momentum)), tpu_mul(L, ub, tpu_k(L, ub, momentum)));
    tpu_lower_write(L, rv_i, -1, tpu_hlo_reshape(H, nv, r->rank, r->sizes));
  }
}

/* native_batch_norm / _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps) */
void tpu_emit_native_batch_norm(tpu_lower *L) {
  tpu_bn_forward(L, 3, 4, L->args[5].i != 0, L->args[6].f, L->args[7].f, false);
}
/* _native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps) */
void tpu_emit_batch_norm_no_stats(tpu_lower *L) { tpu_bn_forward(L, -1, -1, true, L->args[4].f, L->args[5].f, false); }
/* _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps) -> (out, mean, rstd, reserve) */
void tpu_emit_batch_norm_with_update(tpu_lower *L) { tpu_bn_forward(L, 3, 4, true, L->args[5].f, L->args[6].f, true); }

/* native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
 * save_invstd, train, eps, output_mask); batch_norm_backward has the same
 * leading arguments (update for train, save_var holding the invstd) and a reserve. */
void tpu_emit_native_batch_norm_backward(tpu_lower *L) {
  tpu_tref *t = &L->args[1].t;
  int params[3] = {2, 3, 4};
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt), pdt = tpu_param_type(L, params, 3, dt);
  bool train = L->args[7].i != 0;
  double eps = L->args[8].f;
  bool mask[3] = {true, true, true};
  for (int k = 0; k < 3 && k < L->args[9].nints; k++) mask[k] = L->args[9].ints[k] != 0;
  int64_t ncs[3], C;
  tpu_ncs(t, ncs);
  C = ncs[1];
  double count = (double)(ncs[0] * ncs[2]);
  tpu_hv mean, invstd;
  if (train) {
    if (tpu_lower_is_none(L, 5) || tpu_lower_is_none(L, 6)) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "batch_norm_backward: save_mean and save_invstd must be defined in training mode");
      return;
    }
    mean = tpu_hlo_reshape(H, tpu_lower_input(L, 5, acc), 1, &C);
    invstd = tpu_hlo_reshape(H, tpu_lower_input(L, 6, acc), 1, &C);
  } else {
    if (tpu_lower_is_none(L, 3) || tpu_lower_is_none(L, 4)) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "batch_norm_backward: running stats must be defined in evaluation mode");
      return;
    }
    mean = tpu_hlo_reshape(H, tpu_lower_input(L, 3, acc), 1, &C);
    invstd = tpu_inv_sqrt(L, tpu_hlo_reshape(H, tpu_lower_input(L, 4, acc), 1, &C), eps);
  }
  tpu_hv g = tpu_hlo_reshape(H, tpu_lower_input(L, 0, acc), 3, ncs);
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_input(L, 1, acc), 3, ncs);
  tpu_hv xhat = tpu_mul(L, tpu_sub(L, x, tpu_chan_b(L, mean, ncs)), tpu_chan_b(L, invstd, ncs));
  tpu_hv sg = tpu_sum_ns(L, g), sgx = tpu_sum_ns(L, tpu_mul(L, g, xhat));
  tpu_hv w = tpu_chan(L, 2, acc, ncs, 1);
  tpu_hv gi;
  if (train) {
    tpu_hv a = tpu_chan_b(L, tpu_hlo_binary(H, TPU_HLO_DIV, sg, tpu_k(L, sg, count)), ncs);
    tpu_hv b = tpu_chan_b(L, tpu_hlo_binary(H, TPU_HLO_DIV, sgx, tpu_k(L, sgx, count)), ncs);
    gi = tpu_sub(L, tpu_sub(L, g, a), tpu_mul(L, xhat, b));
    gi = tpu_mul(L, gi, tpu_mul(L, w, tpu_chan_b(L, invstd, ncs)));
  } else {
    gi = tpu_mul(L, g, tpu_mul(L, w, tpu_chan_b(L, invstd, ncs)));
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, mask[0] ? gi : tpu_k(L, gi, 0), t->rank, t->sizes), dt));
  tpu_lower_out(L, tpu_hlo_convert(H, mask[1] ? sgx : tpu_k(L, sgx, 0), pdt));
  tpu_lower_out(L, tpu_hlo_convert(H, mask[2] ? sg : tpu_k(L, sg, 0), pdt));
}

/* native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd) */
void tpu_emit_native_group_norm(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int params[2] = {1, 2};
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt), pdt = tpu_param_type(L, params, 2, dt);
  int64_t N = L->args[3].i, C = L->args[4].i, S = L->args[5].i, G = L->args[6].i;
  int64_t numel = tpu_numel(t->rank, t->sizes);
  if (G <= 0 || C % G != 0 || numel != N * C * S) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected number of channels in input to be divisible by num_groups, but got input "
                   "of shape [...] and num_groups=%lld",
                   (long long)G);
    return;
  }
  for (int k = 0; k < 2; k++)
    if (!tpu_lower_is_none(L, params[k]) && L->args[params[k]].t.rank == 1 && L->args[params[k]].t.sizes[0] != C) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Expected %s to be a vector of size equal to the number of channels in input, "
                     "but got %s of shape [%lld] and input of shape [...]",
                     k ? "bias" : "weight", k ? "bias" : "weight", (long long)L->args[params[k]].t.sizes[0]);
      return;
    }
  int64_t ngd[3] = {N, G, C / G * S}, ncs[3] = {N, C, S}, two = 2, ng[2] = {N, G}, bd[2] = {0, 1};
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_input(L, 0, acc), 3, ngd);
  double D = (double)(C / G * S);
  tpu_hv mean = tpu_hlo_reduce(H, x, tpu_hlo_constant(H, acc, 0), &two, 1, TPU_HLO_ADD);
  mean = tpu_hlo_binary(H, TPU_HLO_DIV, mean, tpu_k(L, mean, D));
  tpu_hv xc = tpu_sub(L, x, tpu_hlo_broadcast_in_dim(H, mean, 3, ngd, bd));
  tpu_hv var = tpu_hlo_reduce(H, tpu_mul(L, xc, xc), tpu_hlo_constant(H, acc, 0), &two, 1, TPU_HLO_ADD);
  var = tpu_hlo_binary(H, TPU_HLO_DIV, var, tpu_k(L, var, D));
  tpu_hv rstd = tpu_inv_sqrt(L, var, L->args[7].f);
  tpu_hv y = tpu_hlo_reshape(H, tpu_mul(L, xc, tpu_hlo_broadcast_in_dim(H, rstd, 3, ngd, bd)), 3, ncs);
  if (!tpu_lower_is_none(L, 1)) y = tpu_mul(L, y, tpu_chan(L, 1, acc, ncs, 1));
  if (!tpu_lower_is_none(L, 2)) y = tpu_add(L, y, tpu_chan(L, 2, acc, ncs, 0));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, y, t->rank, t->sizes), dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, mean, 2, ng), pdt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, rstd, 2, ng), pdt));
}

/* native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask) */
void tpu_emit_native_group_norm_backward(tpu_lower *L) {
  tpu_tref *t = &L->args[1].t;
  int params[1] = {4};
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt), pdt = tpu_param_type(L, params, 1, L->args[2].t.dtype);
  int64_t N = L->args[5].i, C = L->args[6].i, S = L->args[7].i, G = L->args[8].i;
  bool mask[3] = {true, true, true};
  for (int k = 0; k < 3 && k < L->args[9].nints; k++) mask[k] = L->args[9].ints[k] != 0;
  if (G <= 0 || C % G != 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "native_group_norm_backward: bad group count %lld", (long long)G);
    return;
  }
  int64_t ngd[3] = {N, G, C / G * S}, ncs[3] = {N, C, S}, two = 2, ng[2] = {N, G}, bd[2] = {0, 1};
  double D = (double)(C / G * S);
  tpu_hv g = tpu_hlo_reshape(H, tpu_lower_input(L, 0, acc), 3, ncs);
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_input(L, 1, acc), 3, ngd);
  tpu_hv mean = tpu_hlo_broadcast_in_dim(H, tpu_hlo_reshape(H, tpu_lower_input(L, 2, acc), 2, ng), 3, ngd, bd);
  tpu_hv rstd = tpu_hlo_broadcast_in_dim(H, tpu_hlo_reshape(H, tpu_lower_input(L, 3, acc), 2, ng), 3, ngd, bd);
  tpu_hv xhat = tpu_mul(L, tpu_sub(L, x, mean), rstd);
  tpu_hv gw = tpu_hlo_reshape(H, tpu_mul(L, g, tpu_chan(L, 4, acc, ncs, 1)), 3, ngd);
  tpu_hv m1 = tpu_hlo_reduce(H, gw, tpu_hlo_constant(H, acc, 0), &two, 1, TPU_HLO_ADD);
  tpu_hv m2 = tpu_hlo_reduce(H, tpu_mul(L, gw, xhat), tpu_hlo_constant(H, acc, 0), &two, 1, TPU_HLO_ADD);
  m1 = tpu_hlo_broadcast_in_dim(H, tpu_hlo_binary(H, TPU_HLO_DIV, m1, tpu_k(L, m1, D)), 3, ngd, bd);
  m2 = tpu_hlo_broadcast_in_dim(H, tpu_hlo_binary(H, TPU_HLO_DIV, m2, tpu_k(L, m2, D)), 3, ngd, bd);
  tpu_hv gi = tpu_mul(L, tpu_sub(L, tpu_sub(L, gw, m1), tpu_mul(L, xhat, m2)), rstd);
  tpu_hv xh = tpu_hlo_reshape(H, xhat, 3, ncs);
  tpu_hv gwt = tpu_sum_ns(L, tpu_mul(L, g, xh)), gbt = tpu_sum_ns(L, g);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, mask[0] ? gi : tpu_k(L, gi, 0), t->rank, t->sizes), dt));
  tpu_lower_out(L, tpu_hlo_convert(H, mask[1] ? gwt : tpu_k(L, gwt, 0), pdt));
  tpu_lower_out(L, tpu_hlo_convert(H, mask[2] ? gbt : tpu_k(L, gbt, 0), pdt));
}

/* ---- fused RNN cells (nn.LSTM / nn.GRU on an accelerator) --------------------------------
 * aten::lstm and aten::gru run their cells through these on every device
 * but the CPU. Gate order along dim 1: LSTM (input, forget, cell, output),
 * GRU (reset, update, new). The workspace a cell returns holds what its
 * backward needs: LSTM, the four activated gates [B, 4H]; GRU, the reset,
 * update and new gates, hx and the hidden new-gate pre-activation [B, 5H]. */

/* Columns [k*h, (k+1)*h) of a [B, n*h] value. */
static tpu_hv tpu_gate(tpu_lower *L, tpu_hv x, int k, int64_t h) {
  const tpu_hlo_type *t = T(L, x);
  int64_t s[2] = {0, k * h}, l[2] = {t->dims[0], (k + 1) * h}, st[2] = {1, 1};
  return tpu_hlo_slice(H, x, s, l, st);
}

static tpu_hv tpu_sigm(tpu_lower *L, tpu_hv x) { return tpu_hlo_unary(H, TPU_HLO_LOGISTIC, x); }
static tpu_hv tpu_tanh(tpu_lower *L, tpu_hv x) { return tpu_hlo_unary(H, TPU_HLO_TANH, x); }
/* s * (1 - s): the derivative of a sigmoid from its value */
static tpu_hv tpu_dsigm(tpu_lower *L, tpu_hv s) { return tpu_mul(L, s, tpu_sub(L, tpu_k(L, s, 1), s)); }

/* Gate pre-activations gates [+ bias] as acc values; the bias is [n*h]. */
static tpu_hv tpu_gates_in(tpu_lower *L, int gi, int bi, tpu_dtype acc) {
  tpu_hv g = tpu_lower_input(L, gi, acc);
  if (!tpu_lower_is_none(L, bi)) g = tpu_lower_binary(L, TPU_HLO_ADD, g, tpu_lower_input(L, bi, acc));
  return g;
}

static bool tpu_cell_check(tpu_lower *L, int n, int hx_arg) {
  tpu_tref *ig = &L->args[0].t, *hg = &L->args[1].t, *hx = &L->args[hx_arg].t;
  if (ig->rank != 2 || hg->rank != 2 || ig->sizes[0] != hg->sizes[0] || ig->sizes[1] != hg->sizes[1] || hx->rank != 2 ||
      ig->sizes[1] != n * hx->sizes[1] || ig->sizes[0] != hx->sizes[0]) {
    tpu_lower_fail(L, TPU_ERR_VALUE, "expected input and hidden gates of one shape [B, %d*H] and a state [B, H]", n);
    return false;
  }
  return true;
}

/* _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias) -> (hy, cy, workspace) */
void tpu_emit_thnn_fused_lstm_cell(tpu_lower *L) {
  if (!tpu_cell_check(L, 4, 2)) return;
  tpu_dtype dt = L->args[0].t.dtype, acc = tpu_acc_type(dt);
  int64_t h = L->args[2].t.sizes[1];
  tpu_hv g = tpu_add(L, tpu_gates_in(L, 0, 3, acc), tpu_gates_in(L, 1, 4, acc));
  tpu_hv ig = tpu_sigm(L, tpu_gate(L, g, 0, h)), fg = tpu_sigm(L, tpu_gate(L, g, 1, h));
  tpu_hv cg = tpu_tanh(L, tpu_gate(L, g, 2, h)), og = tpu_sigm(L, tpu_gate(L, g, 3, h));
  tpu_hv cx = tpu_lower_input(L, 2, acc);
  tpu_hv cy = tpu_add(L, tpu_mul(L, fg, cx), tpu_mul(L, ig, cg));
  tpu_hv hy = tpu_mul(L, og, tpu_tanh(L, cy));
  tpu_hv ws[4] = {ig, fg, cg, og};
  tpu_lower_out(L, tpu_hlo_convert(H, hy, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, cy, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_concat(H, ws, 4, 1), dt));
}

/* _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)
 * -> (grad_gates, grad_cx, grad_bias); missing output gradients count as zeros.
 * The bias gradient is computed even without a bias (autograd drops it). */
void tpu_emit_thnn_fused_lstm_cell_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[2].t.dtype, acc = tpu_acc_type(dt);
  int64_t h = L->args[2].t.sizes[1];
  tpu_hv cx = tpu_lower_input(L, 2, acc), cy = tpu_lower_input(L, 3, acc), w = tpu_lower_input(L, 4, acc);
  tpu_hv go = tpu_lower_is_none(L, 0) ? tpu_k(L, cx, 0) : tpu_lower_input(L, 0, acc);
  tpu_hv goc = tpu_lower_is_none(L, 1) ? tpu_k(L, cx, 0) : tpu_lower_input(L, 1, acc);
  tpu_hv ig = tpu_gate(L, w, 0, h), fg = tpu_gate(L, w, 1, h), cg = tpu_gate(L, w, 2, h), og = tpu_gate(L, w, 3, h);
  tpu_hv t = tpu_tanh(L, cy);
  tpu_hv gcx = tpu_add(L, tpu_mul(L, tpu_mul(L, go, og), tpu_sub(L, tpu_k(L, t, 1), tpu_mul(L, t, t))), goc);
  tpu_hv gs[4] = {
      tpu_mul(L, tpu_mul(L, gcx, cg), tpu_dsigm(L, ig)),
      tpu_mul(L, tpu_mul(L, gcx, cx), tpu_dsigm(L, fg)),
      tpu_mul(L, tpu_mul(L, gcx, ig), tpu_sub(L, tpu_k(L, cg, 1), tpu_mul(L, cg, cg))),
      tpu_mul(L, tpu_mul(L, go, t), tpu_dsigm(L, og)),
  };
  tpu_hv gates = tpu_hlo_concat(H, gs, 4, 1);
  int64_t d0 = 0;
  tpu_lower_out(L, tpu_hlo_convert(H, gates, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, gcx, fg), dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, gates, &d0, 1), dt));
}

/* _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias) -> (hy, workspace) */
void tpu_emit_thnn_fused_gru_cell(tpu_lower *L) {
  if (!tpu_cell_check(L, 3, 2)) return;
  tpu_dtype dt = L->args[0].t.dtype, acc = tpu_acc_type(dt);
  int64_t h = L->args[2].t.sizes[1];
  tpu_hv ig = tpu_gates_in(L, 0, 3, acc), hg = tpu_gates_in(L, 1, 4, acc);
  tpu_hv hx = tpu_lower_input(L, 2, acc);
  tpu_hv rg = tpu_sigm(L, tpu_add(L, tpu_gate(L, ig, 0, h), tpu_gate(L, hg, 0, h)));
  tpu_hv zg = tpu_sigm(L, tpu_add(L, tpu_gate(L, ig, 1, h), tpu_gate(L, hg, 1, h)));
  tpu_hv hn = tpu_gate(L, hg, 2, h);
  tpu_hv ng = tpu_tanh(L, tpu_add(L, tpu_gate(L, ig, 2, h), tpu_mul(L, rg, hn)));
  tpu_hv hy = tpu_add(L, ng, tpu_mul(L, zg, tpu_sub(L, hx, ng)));
  tpu_hv ws[5] = {rg, zg, ng, hx, hn};
  tpu_lower_out(L, tpu_hlo_convert(H, hy, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_concat(H, ws, 5, 1), dt));
}

/* _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
 * -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias) */
void tpu_emit_thnn_fused_gru_cell_backward(tpu_lower *L) {
  tpu_tref *g = &L->args[0].t, *ws = &L->args[1].t;
  if (g->rank != 2 || ws->rank != 2 || ws->sizes[1] != 5 * g->sizes[1] || ws->sizes[0] != g->sizes[0]) {
    tpu_lower_fail(L, TPU_ERR_VALUE, "expected grad_hy [B, H] and a workspace [B, 5*H]");
    return;
  }
  tpu_dtype dt = g->dtype, acc = tpu_acc_type(dt);
  int64_t h = g->sizes[1];
  tpu_hv go = tpu_lower_input(L, 0, acc), w = tpu_lower_input(L, 1, acc);
  tpu_hv rg = tpu_gate(L, w, 0, h), zg = tpu_gate(L, w, 1, h), ng = tpu_gate(L, w, 2, h);
  tpu_hv hx = tpu_gate(L, w, 3, h), hn = tpu_gate(L, w, 4, h);
  tpu_hv gz = tpu_mul(L, tpu_mul(L, go, tpu_sub(L, hx, ng)), tpu_dsigm(L, zg));
  tpu_hv ghx = tpu_mul(L, go, zg);
  tpu_hv gn =
      tpu_mul(L, tpu_mul(L, go, tpu_sub(L, tpu_k(L, zg, 1), zg)), tpu_sub(L, tpu_k(L, ng, 1), tpu_mul(L, ng, ng)));
  tpu_hv ghn = tpu_mul(L, gn, rg);
  tpu_hv gr = tpu_mul(L, tpu_mul(L, gn, hn), tpu_dsigm(L, rg));
  tpu_hv gi3[3] = {gr, gz, gn}, gh3[3] = {gr, gz, ghn};
  tpu_hv gi = tpu_hlo_concat(H, gi3, 3, 1), gh = tpu_hlo_concat(H, gh3, 3, 1);
  int64_t d0 = 0;
  tpu_lower_out(L, tpu_hlo_convert(H, gi, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, gh, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, ghx, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, gi, &d0, 1), dt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, gh, &d0, 1), dt));
}

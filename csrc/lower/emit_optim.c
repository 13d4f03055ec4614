/* emit_optim.c: fused optimizer steps (Adam/AdamW, SGD, Adagrad) and
 * GradScaler's two ops (unscaling with the inf/NaN check, the scale update).
 *
 * tpu::fused_adam updates every parameter of a group in one program, as
 * PyTorch's fused Adam/AdamW kernels do: the parameters, moments (and the
 * running maximum for amsgrad) are in-place writes of their records;
 * tpu::fused_sgd (momentum buffers) and tpu::fused_adagrad (state sums) do
 * the same for SGD and Adagrad. Each internal row takes the arguments of its
 * aten overload (a trailing adamw flag for Adam); the Python wrapper splits
 * long parameter lists into groups that fit one call. Hyper-parameters
 * arrive as program inputs (Python numbers or 0-d tensors), so a
 * learning-rate schedule never recompiles. Math in f32 (f64 for f64
 * parameters), as torch's fused CPU kernel does in its opmath type; weight
 * decay and the found_inf skip are branch-free selects on input values.
 *
 * tpu::fused_adam's arguments: params, grads, exp_avgs, exp_avg_sqs,
 * max_exp_avg_sqs, state_steps (lists), lr, beta1, beta2, weight_decay, eps
 * (numbers or 0-d tensors), amsgrad, maximize (bools), grad_scale, found_inf
 * (optional 0-d tensors), adamw (bool). */
#include "emit.h"

enum {
  FA_P,
  FA_G,
  FA_M,
  FA_V,
  FA_VMAX,
  FA_STEP,
  FA_LR,
  FA_B1,
  FA_B2,
  FA_WD,
  FA_EPS,
  FA_AMS,
  FA_MAX,
  FA_SCALE,
  FA_INF,
  FA_ADAMW,
  FA_NARGS
};

static tpu_hv fa_bin(tpu_lower *L, tpu_hlo_op op, tpu_hv a, tpu_hv b) { return tpu_lower_binary(L, op, a, b); }

/* The shared checks of a fused step: nargs arguments, of which 0..last are
 * tensor lists as long as the parameters (argument 0), except those in
 * `empty_ok` (a bit per argument) when they are empty. Returns the number
 * of parameters, or -1 after failing. */
static int fo_lists(tpu_lower *L, int nargs, int last, unsigned empty_ok) {
  if (L->nargs != nargs) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: expected %d arguments", L->opname, nargs);
    return -1;
  }
  int n = L->args[0].kind == TPU_ARG_TENSORS ? L->args[0].nlist : -1;
  for (int i = 0; i <= last; i++) {
    tpu_arg *a = &L->args[i];
    if (a->kind != TPU_ARG_TENSORS || (a->nlist != n && !((empty_ok >> i & 1u) && a->nlist == 0))) {
      tpu_lower_fail(L, TPU_ERR_VALUE, "%s: argument %d must be a list of tensors as long as the parameters", L->opname,
                     i);
      return -1;
    }
  }
  return n;
}

/* The math type of parameter j (f32, or f64 for f64), or TPU_INVALID after
 * failing. */
static tpu_dtype fo_type(tpu_lower *L, int j) {
  tpu_dtype pdt = L->args[0].list[j].dtype;
  if (!tpu_dtype_is_float(pdt)) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: parameters must be floating point, got %s", L->opname, tpu_dtype_name(pdt));
    return TPU_INVALID;
  }
  return pdt == TPU_F64 ? TPU_F64 : TPU_F32;
}

/* Gradient j (argument 1 of every fused step) in the math type, divided by
 * argument `scale` when given (*unscaled: that value, which the fused kernels
 * store back), then negated when maximizing. */
static tpu_hv fo_grad(tpu_lower *L, int j, tpu_dtype ct, int scale, bool maximize, tpu_hv *unscaled) {
  tpu_hv g = tpu_hlo_convert(H, tpu_lower_tensor(L, 1, j), ct);
  if (!tpu_lower_is_none(L, scale)) g = fa_bin(L, TPU_HLO_DIV, g, tpu_lower_scalar(L, scale, ct));
  *unscaled = g;
  return maximize ? tpu_hlo_unary(H, TPU_HLO_NEG, g) : g;
}

/* A step with found_inf set changes nothing (torch's kernels return early):
 * old where argument inf is non-zero, else new. */
static tpu_hv fo_unless_inf(tpu_lower *L, int inf, tpu_dtype ct, tpu_hv old, tpu_hv new) {
  tpu_hv skip = tpu_hlo_compare(H, TPU_HLO_NE, tpu_lower_scalar(L, inf, ct), tpu_hlo_constant(H, ct, 0.0));
  return tpu_hlo_select(H, tpu_lower_broadcast_to(L, skip, T(L, new)->rank, T(L, new)->dims), old, new);
}

void tpu_emit_fused_adam(tpu_lower *L) {
  bool ams = tpu_arg_bool(L, FA_AMS), maximize = tpu_arg_bool(L, FA_MAX), adamw = tpu_arg_bool(L, FA_ADAMW);
  int n = fo_lists(L, FA_NARGS, FA_STEP, ams ? 0u : 1u << FA_VMAX);
  bool has_scale = !tpu_lower_is_none(L, FA_SCALE), has_inf = !tpu_lower_is_none(L, FA_INF);
  for (int j = 0; j < n; j++) {
    tpu_dtype ct = fo_type(L, j);
    if (ct == TPU_INVALID) return;
    tpu_hv p = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_P, j), ct);
    tpu_hv g0, g = fo_grad(L, j, ct, FA_SCALE, maximize, &g0);
    tpu_hv m = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_M, j), ct);
    tpu_hv v = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_V, j), ct);
    tpu_hv step = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, FA_STEP, j), ct), 0, NULL);
    tpu_hv lr = tpu_lower_scalar(L, FA_LR, ct), b1 = tpu_lower_scalar(L, FA_B1, ct);
    tpu_hv b2 = tpu_lower_scalar(L, FA_B2, ct), wd = tpu_lower_scalar(L, FA_WD, ct);
    tpu_hv eps = tpu_lower_scalar(L, FA_EPS, ct);
    tpu_hv one = tpu_hlo_constant(H, ct, 1.0);
    if (adamw)
      p = fa_bin(L, TPU_HLO_SUB, p, fa_bin(L, TPU_HLO_MUL, p, tpu_hlo_binary(H, TPU_HLO_MUL, lr, wd)));
    else
      g = fa_bin(L, TPU_HLO_ADD, g, fa_bin(L, TPU_HLO_MUL, p, wd));
    tpu_hv omb1 = tpu_hlo_binary(H, TPU_HLO_SUB, one, b1), omb2 = tpu_hlo_binary(H, TPU_HLO_SUB, one, b2);
    tpu_hv m1 = fa_bin(L, TPU_HLO_ADD, fa_bin(L, TPU_HLO_MUL, m, b1), fa_bin(L, TPU_HLO_MUL, g, omb1));
    tpu_hv v1 = fa_bin(L, TPU_HLO_ADD, fa_bin(L, TPU_HLO_MUL, v, b2), fa_bin(L, TPU_HLO_MUL, tpu_mul(L, g, g), omb2));
    tpu_hv bc1 = tpu_hlo_binary(H, TPU_HLO_SUB, one, tpu_hlo_binary(H, TPU_HLO_POW, b1, step));
    tpu_hv bc2 = tpu_hlo_binary(H, TPU_HLO_SUB, one, tpu_hlo_binary(H, TPU_HLO_POW, b2, step));
    tpu_hv step_size = tpu_hlo_binary(H, TPU_HLO_DIV, lr, bc1);
    tpu_hv bc2_sqrt = tpu_hlo_unary(H, TPU_HLO_SQRT, bc2);
    tpu_hv vmax = TPU_HV_NONE, vden = v1;
    if (ams) {
      vmax = tpu_hlo_binary(H, TPU_HLO_MAX, tpu_hlo_convert(H, tpu_lower_tensor(L, FA_VMAX, j), ct), v1);
      vden = vmax;
    }
    tpu_hv denom = fa_bin(L, TPU_HLO_ADD, fa_bin(L, TPU_HLO_DIV, tpu_hlo_unary(H, TPU_HLO_SQRT, vden), bc2_sqrt), eps);
    tpu_hv p1 = fa_bin(L, TPU_HLO_SUB, p, fa_bin(L, TPU_HLO_MUL, fa_bin(L, TPU_HLO_DIV, m1, denom), step_size));
    if (has_inf) {
      p1 = fo_unless_inf(L, FA_INF, ct, tpu_hlo_convert(H, tpu_lower_tensor(L, FA_P, j), ct), p1);
      m1 = fo_unless_inf(L, FA_INF, ct, m, m1);
      v1 = fo_unless_inf(L, FA_INF, ct, v, v1);
      if (ams) vmax = fo_unless_inf(L, FA_INF, ct, tpu_hlo_convert(H, tpu_lower_tensor(L, FA_VMAX, j), ct), vmax);
    }
    tpu_lower_write(L, FA_P, j, p1);
    tpu_lower_write(L, FA_M, j, m1);
    tpu_lower_write(L, FA_V, j, v1);
    if (ams) tpu_lower_write(L, FA_VMAX, j, vmax);
    /* Fused kernels leave the gradients unscaled. */
    if (has_scale) tpu_lower_write(L, FA_G, j, g0);
  }
}

/* tpu::fused_sgd: params, grads, momentum_buffers (lists; the buffers list
 * is empty when momentum is 0), weight_decay, momentum, lr, dampening
 * (numbers or 0-d tensors), nesterov, maximize, is_first_step (bools),
 * grad_scale, found_inf (optional 0-d tensors). As torch's fused SGD: the
 * first step starts the momentum buffer from the gradient. */
enum { FS_P, FS_G, FS_BUF, FS_WD, FS_MOM, FS_LR, FS_DAMP, FS_NEST, FS_MAX, FS_FIRST, FS_SCALE, FS_INF, FS_NARGS };

void tpu_emit_fused_sgd(tpu_lower *L) {
  int n = fo_lists(L, FS_NARGS, FS_BUF, 1u << FS_BUF);
  bool use_mom = n > 0 && L->args[FS_BUF].nlist > 0;
  bool nesterov = tpu_arg_bool(L, FS_NEST), maximize = tpu_arg_bool(L, FS_MAX), first = tpu_arg_bool(L, FS_FIRST);
  bool has_scale = !tpu_lower_is_none(L, FS_SCALE), has_inf = !tpu_lower_is_none(L, FS_INF);
  for (int j = 0; j < n; j++) {
    tpu_dtype ct = fo_type(L, j);
    if (ct == TPU_INVALID) return;
    tpu_hv p0 = tpu_hlo_convert(H, tpu_lower_tensor(L, FS_P, j), ct);
    tpu_hv g_unscaled, g = fo_grad(L, j, ct, FS_SCALE, maximize, &g_unscaled);
    tpu_hv wd = tpu_lower_scalar(L, FS_WD, ct), lr = tpu_lower_scalar(L, FS_LR, ct);
    g = fa_bin(L, TPU_HLO_ADD, g, fa_bin(L, TPU_HLO_MUL, p0, wd));
    tpu_hv buf0 = TPU_HV_NONE, buf = TPU_HV_NONE;
    if (use_mom) {
      tpu_hv mom = tpu_lower_scalar(L, FS_MOM, ct), damp = tpu_lower_scalar(L, FS_DAMP, ct);
      buf0 = tpu_hlo_convert(H, tpu_lower_tensor(L, FS_BUF, j), ct);
      if (first) {
        buf = g;
      } else {
        tpu_hv omd = tpu_hlo_binary(H, TPU_HLO_SUB, tpu_hlo_constant(H, ct, 1.0), damp);
        buf = fa_bin(L, TPU_HLO_ADD, fa_bin(L, TPU_HLO_MUL, buf0, mom), fa_bin(L, TPU_HLO_MUL, g, omd));
      }
      g = nesterov ? fa_bin(L, TPU_HLO_ADD, g, fa_bin(L, TPU_HLO_MUL, buf, mom)) : buf;
    }
    tpu_hv p1 = fa_bin(L, TPU_HLO_SUB, p0, fa_bin(L, TPU_HLO_MUL, g, lr));
    if (has_inf) {
      p1 = fo_unless_inf(L, FS_INF, ct, p0, p1);
      if (use_mom) buf = fo_unless_inf(L, FS_INF, ct, buf0, buf);
    }
    tpu_lower_write(L, FS_P, j, p1);
    if (use_mom) tpu_lower_write(L, FS_BUF, j, buf);
    if (has_scale) tpu_lower_write(L, FS_G, j, g_unscaled);
  }
}

/* tpu::fused_adagrad: params, grads, state_sums, state_steps (lists), lr,
 * lr_decay, weight_decay, eps (numbers or 0-d tensors), maximize (bool),
 * grad_scale, found_inf. The steps were already incremented by the caller:
 * clr = lr / (1 + (step - 1) * lr_decay). */
enum { FG_P, FG_G, FG_SUM, FG_STEP, FG_LR, FG_DECAY, FG_WD, FG_EPS, FG_MAX, FG_SCALE, FG_INF, FG_NARGS };

void tpu_emit_fused_adagrad(tpu_lower *L) {
  int n = fo_lists(L, FG_NARGS, FG_STEP, 0);
  bool maximize = tpu_arg_bool(L, FG_MAX);
  bool has_scale = !tpu_lower_is_none(L, FG_SCALE), has_inf = !tpu_lower_is_none(L, FG_INF);
  for (int j = 0; j < n; j++) {
    tpu_dtype ct = fo_type(L, j);
    if (ct == TPU_INVALID) return;
    tpu_hv p0 = tpu_hlo_convert(H, tpu_lower_tensor(L, FG_P, j), ct);
    tpu_hv g_unscaled, g = fo_grad(L, j, ct, FG_SCALE, maximize, &g_unscaled);
    tpu_hv s0 = tpu_hlo_convert(H, tpu_lower_tensor(L, FG_SUM, j), ct);
    tpu_hv step = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, FG_STEP, j), ct), 0, NULL);
    tpu_hv lr = tpu_lower_scalar(L, FG_LR, ct), decay = tpu_lower_scalar(L, FG_DECAY, ct);
    tpu_hv wd = tpu_lower_scalar(L, FG_WD, ct), eps = tpu_lower_scalar(L, FG_EPS, ct);
    g = fa_bin(L, TPU_HLO_ADD, g, fa_bin(L, TPU_HLO_MUL, p0, wd));
    tpu_hv one = tpu_hlo_constant(H, ct, 1.0);
    tpu_hv clr = tpu_hlo_binary(
        H, TPU_HLO_DIV, lr,
        tpu_hlo_binary(H, TPU_HLO_ADD, one,
                       tpu_hlo_binary(H, TPU_HLO_MUL, tpu_hlo_binary(H, TPU_HLO_SUB, step, one), decay)));
    tpu_hv s1 = fa_bin(L, TPU_HLO_ADD, s0, tpu_mul(L, g, g));
    tpu_hv std = fa_bin(L, TPU_HLO_ADD, tpu_hlo_unary(H, TPU_HLO_SQRT, s1), eps);
    tpu_hv p1 = fa_bin(L, TPU_HLO_SUB, p0, fa_bin(L, TPU_HLO_MUL, fa_bin(L, TPU_HLO_DIV, g, std), clr));
    if (has_inf) {
      p1 = fo_unless_inf(L, FG_INF, ct, p0, p1);
      s1 = fo_unless_inf(L, FG_INF, ct, s0, s1);
    }
    tpu_lower_write(L, FG_P, j, p1);
    tpu_lower_write(L, FG_SUM, j, s1);
    if (has_scale) tpu_lower_write(L, FG_G, j, g_unscaled);
  }
}

/* ---- gradient scaling (torch.amp.GradScaler) ---------------------------------------- */

/* _amp_foreach_non_finite_check_and_unscale_(grads[], found_inf, inv_scale):
 * every gradient is multiplied by inv_scale in place; found_inf becomes 1
 * when any of them holds an inf or a NaN (it is never reset here). */
void tpu_emit_amp_unscale(tpu_lower *L) {
  if (L->nargs != 3 || L->args[0].kind != TPU_ARG_TENSORS) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: expected (Tensor[] grads, Tensor found_inf, Tensor inv_scale)", L->opname);
    return;
  }
  tpu_dtype fdt = L->args[1].t.dtype;
  tpu_hv bad = tpu_hlo_constant(H, TPU_PRED, 0);
  for (int j = 0; j < L->args[0].nlist; j++) {
    tpu_dtype dt = L->args[0].list[j].dtype;
    tpu_dtype ct = tpu_acc_type(dt);
    tpu_hv g = tpu_hlo_convert(H, tpu_lower_tensor(L, 0, j), ct);
    const tpu_hlo_type *gt = T(L, g);
    int64_t dims[TPU_MAX_RANK];
    for (int d = 0; d < gt->rank; d++) dims[d] = d;
    tpu_hv fin = tpu_hlo_unary(H, TPU_HLO_IS_FINITE, g);
    tpu_hv all = gt->rank ? tpu_hlo_reduce(H, fin, tpu_hlo_constant(H, TPU_PRED, 1), dims, gt->rank, TPU_HLO_AND) : fin;
    bad = tpu_hlo_binary(H, TPU_HLO_OR, bad, tpu_hlo_unary(H, TPU_HLO_NOT, all));
    tpu_lower_write(L, 0, j, fa_bin(L, TPU_HLO_MUL, g, tpu_lower_scalar(L, 2, ct)));
  }
  tpu_hv old = tpu_lower_tensor(L, 1, -1);
  const tpu_hlo_type *ot = T(L, old);
  tpu_hv one = tpu_lower_full(L, *ot, 1.0);
  tpu_hv sel = tpu_lower_broadcast_to(L, bad, ot->rank, ot->dims);
  tpu_lower_write(L, 1, -1, tpu_hlo_convert(H, tpu_hlo_select(H, sel, one, old), fdt));
}

/* _amp_update_scale_(scale, growth_tracker, found_inf, growth, backoff,
 * interval): after an inf, scale *= backoff and the tracker restarts;
 * otherwise the tracker counts, and every `interval` clean steps the scale
 * grows (when the grown scale is finite). Returns scale. */
void tpu_emit_amp_update_scale(tpu_lower *L) {
  if (L->nargs != 6) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: expected 6 arguments", L->opname);
    return;
  }
  tpu_dtype sdt = L->args[0].t.dtype, tdt = L->args[1].t.dtype;
  tpu_hv scale = tpu_lower_tensor(L, 0, -1), tracker = tpu_lower_tensor(L, 1, -1);
  tpu_hv inf = tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), sdt);
  const tpu_hlo_type *st = T(L, scale);
  tpu_hv found = tpu_hlo_compare(H, TPU_HLO_NE, inf, tpu_lower_full(L, *T(L, inf), 0.0));
  tpu_hv next = tpu_hlo_binary(H, TPU_HLO_ADD, tracker, tpu_lower_full(L, *T(L, tracker), 1.0));
  tpu_hv due = tpu_hlo_compare(H, TPU_HLO_EQ, next, tpu_lower_full(L, *T(L, tracker), (double)L->args[5].i));
  tpu_hv grown = tpu_hlo_binary(H, TPU_HLO_MUL, scale, tpu_lower_full(L, *st, L->args[3].f));
  tpu_hv grow_ok = tpu_hlo_binary(H, TPU_HLO_AND, due, tpu_hlo_unary(H, TPU_HLO_IS_FINITE, grown));
  tpu_hv backed = tpu_hlo_binary(H, TPU_HLO_MUL, scale, tpu_lower_full(L, *st, L->args[4].f));
  tpu_hv new_scale = tpu_hlo_select(H, found, backed, tpu_hlo_select(H, grow_ok, grown, scale));
  tpu_hv zero = tpu_lower_full(L, *T(L, tracker), 0.0);
  tpu_hv new_tracker = tpu_hlo_select(H, found, zero, tpu_hlo_select(H, due, zero, next));
  tpu_lower_write(L, 0, -1, new_scale);
  tpu_lower_write(L, 1, -1, tpu_hlo_convert(H, new_tracker, tdt));
  tpu_lower_return_arg(L, 0, -1);
}

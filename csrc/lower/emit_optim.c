/* emit_optim.c: fused optimizer steps (Adam/AdamW, SGD, Adagrad).
 *
 * tpu::fused_adam updates every parameter of a group in one program, as
 * PyTorch's fused Adam/AdamW kernels do: the parameters, moments (and the
 * running maximum for amsgrad) are in-place writes of their records. The
 * Python wrapper of aten::_fused_adam_ / _fused_adamw_ splits long parameter
 * lists into groups that fit one call. Hyper-parameters arrive as program
 * inputs (Python numbers or 0-d tensors), so a learning-rate schedule never
 * recompiles. Math in f32 (f64 for f64 parameters), as torch's fused CPU
 * kernel does in its opmath type; weight decay and the found_inf skip are
 * branch-free selects on input values.
 *
 * Arguments: params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
 * state_steps (lists), lr, beta1, beta2, weight_decay, eps (numbers or 0-d
 * tensors), amsgrad, maximize, adamw (bools), grad_scale, found_inf
 * (optional 0-d tensors). */
#include "emit.h"

enum { FA_P, FA_G, FA_M, FA_V, FA_VMAX, FA_STEP, FA_LR, FA_B1, FA_B2, FA_WD, FA_EPS, FA_AMS, FA_MAX, FA_ADAMW,
       FA_SCALE, FA_INF, FA_NARGS };

static tpu_hv fa_bin(tpu_lower *L, tpu_hlo_op op, tpu_hv a, tpu_hv b) { return tpu_lower_binary(L, op, a, b); }

void tpu_emit_fused_adam(tpu_lower *L) {
  if (L->nargs != FA_NARGS) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: expected %d arguments", L->opname, FA_NARGS);
    return;
  }
  for (int i = FA_P; i <= FA_STEP; i++)
    if (L->args[i].kind != TPU_ARG_TENSORS) {
      tpu_lower_fail(L, TPU_ERR_TYPE, "%s: argument %d must be a list of tensors", L->opname, i);
      return;
    }
  int n = L->args[FA_P].nlist;
  bool ams = tpu_arg_bool(L, FA_AMS), maximize = tpu_arg_bool(L, FA_MAX), adamw = tpu_arg_bool(L, FA_ADAMW);
  for (int i = FA_G; i <= FA_STEP; i++) {
    if (i == FA_VMAX && !ams) continue;
    if (L->args[i].nlist != n) {
      tpu_lower_fail(L, TPU_ERR_VALUE, "%s: tensor lists must have the same length (%d and %d)", L->opname, n,
                     L->args[i].nlist);
      return;
    }
  }
  bool has_scale = !tpu_lower_is_none(L, FA_SCALE), has_inf = !tpu_lower_is_none(L, FA_INF);
  for (int j = 0; j < n; j++) {
    tpu_dtype pdt = L->args[FA_P].list[j].dtype;
    if (!tpu_dtype_is_float(pdt)) {
      tpu_lower_fail(L, TPU_ERR_TYPE, "%s: parameters must be floating point, got %s", L->opname,
                     tpu_dtype_name(pdt));
      return;
    }
    tpu_dtype ct = pdt == TPU_F64 ? TPU_F64 : TPU_F32;
    tpu_hv p = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_P, j), ct);
    tpu_hv g = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_G, j), ct);
    tpu_hv m = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_M, j), ct);
    tpu_hv v = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_V, j), ct);
    tpu_hv step = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, FA_STEP, j), ct), 0, NULL);
    tpu_hv lr = tpu_lower_scalar(L, FA_LR, ct), b1 = tpu_lower_scalar(L, FA_B1, ct);
    tpu_hv b2 = tpu_lower_scalar(L, FA_B2, ct), wd = tpu_lower_scalar(L, FA_WD, ct);
    tpu_hv eps = tpu_lower_scalar(L, FA_EPS, ct);
    tpu_hv one = tpu_hlo_constant(H, ct, 1.0);
    tpu_hv g0 = g;
    if (has_scale) {
      g = fa_bin(L, TPU_HLO_DIV, g, tpu_lower_scalar(L, FA_SCALE, ct));
      g0 = g;
    }
    if (maximize) g = tpu_hlo_unary(H, TPU_HLO_NEG, g);
    if (adamw)
      p = fa_bin(L, TPU_HLO_SUB, p, fa_bin(L, TPU_HLO_MUL, p, tpu_hlo_binary(H, TPU_HLO_MUL, lr, wd)));
    else
      g = fa_bin(L, TPU_HLO_ADD, g, fa_bin(L, TPU_HLO_MUL, p, wd));
    tpu_hv omb1 = tpu_hlo_binary(H, TPU_HLO_SUB, one, b1), omb2 = tpu_hlo_binary(H, TPU_HLO_SUB, one, b2);
    tpu_hv m1 = fa_bin(L, TPU_HLO_ADD, fa_bin(L, TPU_HLO_MUL, m, b1), fa_bin(L, TPU_HLO_MUL, g, omb1));
    tpu_hv v1 = fa_bin(L, TPU_HLO_ADD, fa_bin(L, TPU_HLO_MUL, v, b2),
                       fa_bin(L, TPU_HLO_MUL, tpu_mul(L, g, g), omb2));
    tpu_hv bc1 = tpu_hlo_binary(H, TPU_HLO_SUB, one, tpu_hlo_binary(H, TPU_HLO_POW, b1, step));
    tpu_hv bc2 = tpu_hlo_binary(H, TPU_HLO_SUB, one, tpu_hlo_binary(H, TPU_HLO_POW, b2, step));
    tpu_hv step_size = tpu_hlo_binary(H, TPU_HLO_DIV, lr, bc1);
    tpu_hv bc2_sqrt = tpu_hlo_unary(H, TPU_HLO_SQRT, bc2);
    tpu_hv vmax = TPU_HV_NONE, vden = v1;
    if (ams) {
      vmax = tpu_hlo_binary(H, TPU_HLO_MAX, tpu_hlo_convert(H, tpu_lower_tensor(L, FA_VMAX, j), ct), v1);
      vden = vmax;
    }
    tpu_hv denom = fa_bin(L, TPU_HLO_ADD, fa_bin(L, TPU_HLO_DIV, tpu_hlo_unary(H, TPU_HLO_SQRT, vden), bc2_sqrt),
                          eps);
    tpu_hv p1 = fa_bin(L, TPU_HLO_SUB, p, fa_bin(L, TPU_HLO_MUL, fa_bin(L, TPU_HLO_DIV, m1, denom), step_size));
    if (has_inf) {
      /* A step with found_inf set changes nothing (torch's kernels return early). */
      tpu_hv inf = tpu_lower_scalar(L, FA_INF, ct);
      tpu_hv skip = tpu_hlo_compare(H, TPU_HLO_NE, inf, tpu_hlo_constant(H, ct, 0.0));
      tpu_hv keep_p = tpu_hlo_convert(H, tpu_lower_tensor(L, FA_P, j), ct);
      p1 = tpu_hlo_select(H, tpu_lower_broadcast_to(L, skip, T(L, p1)->rank, T(L, p1)->dims),
                          keep_p, p1);
      tpu_hv sk_m = tpu_lower_broadcast_to(L, skip, T(L, m1)->rank, T(L, m1)->dims);
      m1 = tpu_hlo_select(H, sk_m, m, m1);
      v1 = tpu_hlo_select(H, sk_m, v, v1);
      if (ams) vmax = tpu_hlo_select(H, sk_m, tpu_hlo_convert(H, tpu_lower_tensor(L, FA_VMAX, j), ct), vmax);
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
  if (L->nargs != FS_NARGS) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: expected %d arguments", L->opname, FS_NARGS);
    return;
  }
  for (int i = FS_P; i <= FS_BUF; i++)
    if (L->args[i].kind != TPU_ARG_TENSORS) {
      tpu_lower_fail(L, TPU_ERR_TYPE, "%s: argument %d must be a list of tensors", L->opname, i);
      return;
    }
  int n = L->args[FS_P].nlist;
  bool use_mom = L->args[FS_BUF].nlist > 0;
  if (L->args[FS_G].nlist != n || (use_mom && L->args[FS_BUF].nlist != n)) {
    tpu_lower_fail(L, TPU_ERR_VALUE, "%s: tensor lists must have the same length", L->opname);
    return;
  }
  bool nesterov = tpu_arg_bool(L, FS_NEST), maximize = tpu_arg_bool(L, FS_MAX), first = tpu_arg_bool(L, FS_FIRST);
  bool has_scale = !tpu_lower_is_none(L, FS_SCALE), has_inf = !tpu_lower_is_none(L, FS_INF);
  for (int j = 0; j < n; j++) {
    tpu_dtype pdt = L->args[FS_P].list[j].dtype;
    if (!tpu_dtype_is_float(pdt)) {
      tpu_lower_fail(L, TPU_ERR_TYPE, "%s: parameters must be floating point, got %s", L->opname,
                     tpu_dtype_name(pdt));
      return;
    }
    tpu_dtype ct = pdt == TPU_F64 ? TPU_F64 : TPU_F32;
    tpu_hv p0 = tpu_hlo_convert(H, tpu_lower_tensor(L, FS_P, j), ct);
    tpu_hv g = tpu_hlo_convert(H, tpu_lower_tensor(L, FS_G, j), ct);
    tpu_hv wd = tpu_lower_scalar(L, FS_WD, ct), lr = tpu_lower_scalar(L, FS_LR, ct);
    if (has_scale) g = fa_bin(L, TPU_HLO_DIV, g, tpu_lower_scalar(L, FS_SCALE, ct));
    tpu_hv g_unscaled = g;
    if (maximize) g = tpu_hlo_unary(H, TPU_HLO_NEG, g);
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
      tpu_hv skip = tpu_hlo_compare(H, TPU_HLO_NE, tpu_lower_scalar(L, FS_INF, ct), tpu_hlo_constant(H, ct, 0.0));
      tpu_hv sk = tpu_lower_broadcast_to(L, skip, T(L, p1)->rank, T(L, p1)->dims);
      p1 = tpu_hlo_select(H, sk, p0, p1);
      if (use_mom) buf = tpu_hlo_select(H, sk, buf0, buf);
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
  if (L->nargs != FG_NARGS) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: expected %d arguments", L->opname, FG_NARGS);
    return;
  }
  for (int i = FG_P; i <= FG_STEP; i++)
    if (L->args[i].kind != TPU_ARG_TENSORS || L->args[i].nlist != L->args[FG_P].nlist) {
      tpu_lower_fail(L, TPU_ERR_VALUE, "%s: argument %d must be a tensor list as long as params", L->opname, i);
      return;
    }
  bool maximize = tpu_arg_bool(L, FG_MAX);
  bool has_scale = !tpu_lower_is_none(L, FG_SCALE), has_inf = !tpu_lower_is_none(L, FG_INF);
  for (int j = 0; j < L->args[FG_P].nlist; j++) {
    tpu_dtype pdt = L->args[FG_P].list[j].dtype;
    if (!tpu_dtype_is_float(pdt)) {
      tpu_lower_fail(L, TPU_ERR_TYPE, "%s: parameters must be floating point, got %s", L->opname,
                     tpu_dtype_name(pdt));
      return;
    }
    tpu_dtype ct = pdt == TPU_F64 ? TPU_F64 : TPU_F32;
    tpu_hv p0 = tpu_hlo_convert(H, tpu_lower_tensor(L, FG_P, j), ct);
    tpu_hv g = tpu_hlo_convert(H, tpu_lower_tensor(L, FG_G, j), ct);
    tpu_hv s0 = tpu_hlo_convert(H, tpu_lower_tensor(L, FG_SUM, j), ct);
    tpu_hv step = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, FG_STEP, j), ct), 0, NULL);
    tpu_hv lr = tpu_lower_scalar(L, FG_LR, ct), decay = tpu_lower_scalar(L, FG_DECAY, ct);
    tpu_hv wd = tpu_lower_scalar(L, FG_WD, ct), eps = tpu_lower_scalar(L, FG_EPS, ct);
    if (has_scale) g = fa_bin(L, TPU_HLO_DIV, g, tpu_lower_scalar(L, FG_SCALE, ct));
    tpu_hv g_unscaled = g;
    if (maximize) g = tpu_hlo_unary(H, TPU_HLO_NEG, g);
    g = fa_bin(L, TPU_HLO_ADD, g, fa_bin(L, TPU_HLO_MUL, p0, wd));
    tpu_hv one = tpu_hlo_constant(H, ct, 1.0);
    tpu_hv clr = tpu_hlo_binary(
        H, TPU_HLO_DIV, lr,
        tpu_hlo_binary(H, TPU_HLO_ADD, one, tpu_hlo_binary(H, TPU_HLO_MUL, tpu_hlo_binary(H, TPU_HLO_SUB, step, one), decay)));
    tpu_hv s1 = fa_bin(L, TPU_HLO_ADD, s0, tpu_mul(L, g, g));
    tpu_hv std = fa_bin(L, TPU_HLO_ADD, tpu_hlo_unary(H, TPU_HLO_SQRT, s1), eps);
    tpu_hv p1 = fa_bin(L, TPU_HLO_SUB, p0, fa_bin(L, TPU_HLO_MUL, fa_bin(L, TPU_HLO_DIV, g, std), clr));
    if (has_inf) {
      tpu_hv skip = tpu_hlo_compare(H, TPU_HLO_NE, tpu_lower_scalar(L, FG_INF, ct), tpu_hlo_constant(H, ct, 0.0));
      tpu_hv sk = tpu_lower_broadcast_to(L, skip, T(L, p1)->rank, T(L, p1)->dims);
      p1 = tpu_hlo_select(H, sk, p0, p1);
      s1 = tpu_hlo_select(H, sk, s0, s1);
    }
    tpu_lower_write(L, FG_P, j, p1);
    tpu_lower_write(L, FG_SUM, j, s1);
    if (has_scale) tpu_lower_write(L, FG_G, j, g_unscaled);
  }
}

/* emit_conv.c: convolution, pooling, normalization and upsampling.
 *
 * Convolutions map onto stablehlo.convolution in the (batch, feature,
 * spatial...) layout torch uses. Three building blocks serve every case: the
 * forward convolution, its gradient with respect to the input (a convolution
 * of the lhs-dilated gradient with the flipped, group-transposed kernel) and
 * its gradient with respect to the weight (batch and feature roles swapped,
 * groups as batch groups). A transposed convolution is the input gradient of
 * a plain one, so its forward and backward are the same blocks reordered.
 * Half types compute in f32, as torch's CPU kernels accumulate.
 */
#include <math.h>
#include <string.h>

#include "emit.h"

/* ---- convolution ------------------------------------------------------------------------ */

typedef struct {
  int nsp;
  int64_t stride[TPU_MAX_RANK], pad[TPU_MAX_RANK], dil[TPU_MAX_RANK], opad[TPU_MAX_RANK];
  int64_t groups;
} tpu_conv_p;

/* An int list argument expanded to n values (a single value repeats). */
static bool tpu_conv_list(tpu_lower *L, int i, int n, int64_t dflt, int64_t *out) {
  tpu_arg *a = &L->args[i];
  for (int k = 0; k < n; k++) out[k] = dflt;
  if (a->kind == TPU_ARG_INT) {
    for (int k = 0; k < n; k++) out[k] = a->i;
    return true;
  }
  if (a->kind != TPU_ARG_INTS || a->nints == 0) return true;
  if (a->nints != 1 && a->nints != n) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: expected %d values in an int list argument, got %d", L->opname, n, a->nints);
    return false;
  }
  for (int k = 0; k < n; k++) out[k] = a->ints[a->nints == 1 ? 0 : k];
  return true;
}

/* Parameters from args at (stride, padding, dilation, transposed, output_padding, groups). */
static bool tpu_conv_params(tpu_lower *L, int nsp, int first, tpu_conv_p *p) {
  p->nsp = nsp;
  if (!tpu_conv_list(L, first, nsp, 1, p->stride) || !tpu_conv_list(L, first + 1, nsp, 0, p->pad) ||
      !tpu_conv_list(L, first + 2, nsp, 1, p->dil) || !tpu_conv_list(L, first + 4, nsp, 0, p->opad))
    return false;
  p->groups = L->args[first + 5].i;
  for (int k = 0; k < nsp; k++) {
    if (p->stride[k] < 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "non-positive stride is not supported");
      return false;
    }
    if (p->pad[k] < 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "negative padding is not supported");
      return false;
    }
    if (p->dil[k] < 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "dilation should be greater than zero");
      return false;
    }
  }
  if (p->groups < 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "non-positive groups is not supported");
    return false;
  }
  return true;
}

static tpu_hv tpu_conv_fwd(tpu_lower *L, tpu_hv x, tpu_hv w, const tpu_conv_p *p) {
  int64_t pad[2 * TPU_MAX_RANK];
  for (int k = 0; k < p->nsp; k++) pad[2 * k] = pad[2 * k + 1] = p->pad[k];
  return tpu_hlo_convolution(H, x, w, p->nsp, p->stride, pad, NULL, p->dil, p->groups, 1, TPU_HLO_PREC_HIGHEST);
}

/* Gradient of tpu_conv_fwd with respect to its input (spatial sizes isz),
 * given g (N, C_out, o...) and w (C_out, C_in/G, k...). */
static tpu_hv tpu_conv_dinput(tpu_lower *L, tpu_hv g, tpu_hv w, const tpu_conv_p *p, const int64_t *isz) {
  const tpu_hlo_type wt = *T(L, w), gt = *T(L, g);
  int nsp = p->nsp;
  int64_t G = p->groups, co = wt.dims[0], cig = wt.dims[1];
  /* (C_out, C_in/G, k) -> (G, C_out/G, C_in/G, k) -> (G, C_in/G, C_out/G, k) -> (C_in, C_out/G, k) */
  int64_t d5[TPU_MAX_RANK + 1], perm[TPU_MAX_RANK + 1], d4[TPU_MAX_RANK];
  d5[0] = G;
  d5[1] = co / G;
  d5[2] = cig;
  for (int k = 0; k < nsp; k++) d5[3 + k] = wt.dims[2 + k];
  tpu_hv k5 = tpu_hlo_reshape(H, w, nsp + 3, d5);
  perm[0] = 0;
  perm[1] = 2;
  perm[2] = 1;
  for (int k = 0; k < nsp; k++) perm[3 + k] = 3 + k;
  k5 = tpu_hlo_transpose(H, k5, perm);
  d4[0] = G * cig;
  d4[1] = co / G;
  for (int k = 0; k < nsp; k++) d4[2 + k] = wt.dims[2 + k];
  tpu_hv kr = tpu_hlo_reshape(H, k5, nsp + 2, d4);
  int64_t rev[TPU_MAX_RANK];
  for (int k = 0; k < nsp; k++) rev[k] = 2 + k;
  kr = tpu_hlo_reverse(H, kr, rev, nsp);
  int64_t pad[2 * TPU_MAX_RANK];
  for (int k = 0; k < nsp; k++) {
    int64_t D = p->dil[k] * (wt.dims[2 + k] - 1);
    pad[2 * k] = D - p->pad[k];
    pad[2 * k + 1] = isz[k] - (gt.dims[2 + k] - 1) * p->stride[k] - 1 + p->pad[k];
  }
  return tpu_hlo_convolution(H, g, kr, nsp, NULL, pad, p->stride, p->dil, G, 1, TPU_HLO_PREC_HIGHEST);
}

/* Gradient of tpu_conv_fwd with respect to its weight (spatial sizes ksz),
 * given x (N, C_in, i...) and g (N, C_out, o...). */
static tpu_hv tpu_conv_dweight(tpu_lower *L, tpu_hv x, tpu_hv g, const tpu_conv_p *p, const int64_t *ksz) {
  const tpu_hlo_type xt = *T(L, x), gt = *T(L, g);
  int nsp = p->nsp;
  int64_t perm[TPU_MAX_RANK];
  perm[0] = 1;
  perm[1] = 0;
  for (int k = 0; k < nsp; k++) perm[2 + k] = 2 + k;
  tpu_hv xs = tpu_hlo_transpose(H, x, perm); /* (C_in, N, i...) */
  tpu_hv gs = tpu_hlo_transpose(H, g, perm); /* (C_out, N, o...) */
  int64_t pad[2 * TPU_MAX_RANK];
  for (int k = 0; k < nsp; k++) {
    pad[2 * k] = p->pad[k];
    pad[2 * k + 1] = (ksz[k] - 1) * p->dil[k] + (gt.dims[2 + k] - 1) * p->stride[k] + 1 - xt.dims[2 + k] - p->pad[k];
  }
  /* (C_in/G, C_out, k...) */
  tpu_hv r = tpu_hlo_convolution(H, xs, gs, nsp, p->dil, pad, NULL, p->stride, 1, p->groups, TPU_HLO_PREC_HIGHEST);
  return tpu_hlo_transpose(H, r, perm);
}

static bool tpu_conv_check(tpu_lower *L, tpu_tref *x, tpu_tref *w) {
  if (x->dtype != w->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Input type (%s) and weight type (%s) should be the same",
                   tpu_dtype_name(x->dtype), tpu_dtype_name(w->dtype));
    return false;
  }
  if (x->dtype == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"slow_conv2d_cpu\" not implemented for 'Bool'");
    return false;
  }
  if (x->rank < 3 || x->rank != w->rank) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected %d-dimensional input for %d-dimensional weight, but got %d-dimensional input",
                   w->rank, w->rank, x->rank);
    return false;
  }
  return true;
}

/* convolution_overrideable(input, weight, bias, stride, padding, dilation,
 * transposed, output_padding, groups) */
void tpu_emit_convolution(tpu_lower *L) {
  tpu_tref *xr = &L->args[0].t, *wr = &L->args[1].t;
  if (!tpu_conv_check(L, xr, wr)) return;
  int nsp = xr->rank - 2;
  tpu_conv_p p;
  if (!tpu_conv_params(L, nsp, 3, &p)) return;
  bool transposed = L->args[6].i != 0;
  tpu_dtype dt = xr->dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc), w = tpu_lower_input(L, 1, acc);
  int64_t cin = transposed ? wr->sizes[0] : wr->sizes[1] * p.groups;
  if (xr->sizes[1] != cin || wr->sizes[0] % p.groups) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Given groups=%lld, weight of size [%lld, %lld, ...], expected input[%lld, %lld, ...] "
                   "to have %lld channels, but got %lld channels instead", (long long)p.groups, (long long)wr->sizes[0],
                   (long long)wr->sizes[1], (long long)xr->sizes[0], (long long)xr->sizes[1], (long long)cin,
                   (long long)xr->sizes[1]);
    return;
  }
  tpu_hv y;
  if (transposed) {
    int64_t osz[TPU_MAX_RANK];
    for (int k = 0; k < nsp; k++)
      osz[k] = (xr->sizes[2 + k] - 1) * p.stride[k] - 2 * p.pad[k] + p.dil[k] * (wr->sizes[2 + k] - 1) + p.opad[k] + 1;
    y = tpu_conv_dinput(L, x, w, &p, osz);
  } else {
    y = tpu_conv_fwd(L, x, w, &p);
  }
  if (!tpu_lower_is_none(L, 2)) {
    const tpu_hlo_type *yt = T(L, y);
    int64_t one = 1;
    tpu_hv b = tpu_hlo_broadcast_in_dim(H, tpu_lower_input(L, 2, acc), yt->rank, yt->dims, &one);
    y = tpu_add(L, y, b);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, y, dt));
}

/* convolution_backward_overrideable(grad_output, input, weight, stride, padding,
 * dilation, transposed, output_padding, groups, output_mask) -> (gi, gw, gb) */
void tpu_emit_convolution_backward(tpu_lower *L) {
  tpu_tref *gr = &L->args[0].t, *xr = &L->args[1].t, *wr = &L->args[2].t;
  if (!tpu_conv_check(L, xr, wr)) return;
  int nsp = xr->rank - 2;
  tpu_conv_p p;
  if (!tpu_conv_params(L, nsp, 3, &p)) return;
  bool transposed = L->args[6].i != 0;
  bool mask[3] = {true, true, true};
  for (int k = 0; k < 3 && k < L->args[9].nints; k++) mask[k] = L->args[9].ints[k] != 0;
  tpu_dtype dt = xr->dtype, acc = tpu_acc_type(dt);
  tpu_hv g = tpu_lower_input(L, 0, acc);
  tpu_hv gi, gw, gb;
  if (mask[0]) {
    tpu_hv w = tpu_lower_input(L, 2, acc);
    if (transposed) {
      /* output_padding >= stride leaves input rows the forward never reached */
      gi = tpu_conv_fwd(L, g, w, &p);
      int64_t start[TPU_MAX_RANK] = {0}, one[TPU_MAX_RANK];
      for (int k = 0; k < xr->rank; k++) one[k] = 1;
      gi = tpu_hlo_slice(H, gi, start, xr->sizes, one);
    } else {
      gi = tpu_conv_dinput(L, g, w, &p, xr->sizes + 2);
    }
  } else {
    gi = tpu_lower_full(L, tpu_hlo_type_make(acc, xr->rank, xr->sizes), 0);
  }
  if (mask[1]) {
    tpu_hv x = tpu_lower_input(L, 1, acc);
    gw = transposed ? tpu_conv_dweight(L, g, x, &p, wr->sizes + 2) : tpu_conv_dweight(L, x, g, &p, wr->sizes + 2);
  } else {
    gw = tpu_lower_full(L, tpu_hlo_type_make(acc, wr->rank, wr->sizes), 0);
  }
  int64_t cout = gr->sizes[1];
  if (mask[2]) {
    int64_t dims[TPU_MAX_RANK];
    int n = 0;
    for (int k = 0; k < gr->rank; k++)
      if (k != 1) dims[n++] = k;
    gb = tpu_hlo_reduce(H, g, tpu_hlo_constant(H, acc, 0), dims, n, TPU_HLO_ADD);
  } else {
    gb = tpu_lower_full(L, tpu_hlo_type_make(acc, 1, &cout), 0);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, gi, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, gw, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, gb, dt));
}

/* emit_conv.c: convolution, pooling, upsampling, im2col/col2im, channel_shuffle
 * and grid sampling.
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
#include <stdio.h>
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
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: expected %d values in an int list argument, got %d", L->opname, n,
                   a->nints);
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
  return tpu_hlo_convolution(H, x, w, p->nsp, p->stride, pad, NULL, p->dil, p->groups, 1, L->precision);
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
  return tpu_hlo_convolution(H, g, kr, nsp, NULL, pad, p->stride, p->dil, G, 1, L->precision);
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
  tpu_hv r = tpu_hlo_convolution(H, xs, gs, nsp, p->dil, pad, NULL, p->stride, 1, p->groups, L->precision);
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
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected %d-dimensional input for %d-dimensional weight, but got %d-dimensional input", w->rank,
                   w->rank, x->rank);
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
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Given groups=%lld, weight of size [%lld, %lld, ...], expected input[%lld, %lld, ...] "
                   "to have %lld channels, but got %lld channels instead",
                   (long long)p.groups, (long long)wr->sizes[0], (long long)wr->sizes[1], (long long)xr->sizes[0],
                   (long long)xr->sizes[1], (long long)cin, (long long)xr->sizes[1]);
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

/* ---- pooling ---------------------------------------------------------------------------------
 *
 * Every pooling window is a box, so it is described per spatial dim: output
 * position o reads input positions idx[o*K + j] (j < K) where valid. The
 * tables are computed here, on the host, from the static sizes. Average
 * pooling (plain and adaptive) is then a linear map per dim: a contraction
 * with a 0/1 matrix, divided by the per-dim counts' product; its backward is
 * the transposed contraction. Max pooling gathers each dim's windows and
 * reduces (value, flat index) pairs with torch's rule: the first maximum wins,
 * and a NaN beats any number (the last NaN, as torch's scan keeps it). */

#include <stdlib.h>

typedef struct {
  int64_t in, out, K;
  int64_t *idx;   /* out*K positions, clamped into [0, in) */
  uint8_t *valid; /* out*K flags */
  int64_t *cnt;   /* out divisors (avg pooling) */
} tpu_win;

typedef struct {
  int nsp, lead; /* spatial dims; leading (batch, channel) dims */
  tpu_win w[3];
} tpu_pool;

static void tpu_pool_free(tpu_pool *P) {
  for (int d = 0; d < P->nsp; d++) {
    free(P->w[d].idx);
    free(P->w[d].valid);
    free(P->w[d].cnt);
  }
}

static bool tpu_win_alloc(tpu_lower *L, tpu_win *w) {
  w->idx = calloc((size_t)(w->out * w->K + 1), sizeof(int64_t));
  w->valid = calloc((size_t)(w->out * w->K + 1), 1);
  w->cnt = calloc((size_t)(w->out + 1), sizeof(int64_t));
  if (!w->idx || !w->valid || !w->cnt) {
    tpu_lower_fail(L, TPU_ERR_MEMORY, "%s: out of memory", L->opname);
    return false;
  }
  return true;
}

/* Sliding windows: kernel k, stride s, padding p, dilation d. */
static bool tpu_win_sliding(tpu_lower *L, tpu_win *w, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d,
                            bool ceil_mode, bool count_pad) {
  int64_t span = d * (k - 1) + 1;
  int64_t num = in + 2 * p - span + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) out--;
  w->in = in;
  w->out = out < 0 ? 0 : out;
  w->K = k;
  if (!tpu_win_alloc(L, w)) return false;
  for (int64_t o = 0; o < w->out; o++) {
    int64_t start = o * s - p, hend = start + (k - 1) * d + 1;
    if (hend > in + p) hend = in + p;
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t pos = start + j * d;
      bool v = pos >= 0 && pos < in;
      w->valid[o * k + j] = v;
      w->idx[o * k + j] = pos < 0 ? 0 : pos >= in ? in - 1 : pos;
      n += v;
    }
    w->cnt[o] = count_pad ? hend - start : n;
  }
  return true;
}

/* Adaptive windows: [floor(o*in/out), ceil((o+1)*in/out)). */
static bool tpu_win_adaptive(tpu_lower *L, tpu_win *w, int64_t in, int64_t out) {
  w->in = in;
  w->out = out;
  w->K = out > 0 ? (in + out - 1) / out + 1 : 1;
  if (w->K > in) w->K = in > 0 ? in : 1;
  if (!tpu_win_alloc(L, w)) return false;
  for (int64_t o = 0; o < out; o++) {
    int64_t a = o * in / out, b = ((o + 1) * in + out - 1) / out;
    for (int64_t j = 0; j < w->K; j++) {
      int64_t pos = a + j;
      w->valid[o * w->K + j] = pos < b;
      w->idx[o * w->K + j] = pos < b ? pos : b - 1;
    }
    w->cnt[o] = b - a;
  }
  return true;
}

/* Input rank check: (C, spatial...) or (N, C, spatial...), non-empty
 * spatial dims. */
static bool tpu_pool_input(tpu_lower *L, tpu_tref *t, int nsp, const char *name, tpu_pool *P) {
  memset(P, 0, sizeof *P);
  P->nsp = nsp;
  if (t->rank != nsp + 1 && t->rank != nsp + 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "%s: Expected %dD or %dD (batch mode) tensor for input with possibly 0 batch size "
                   "and non-zero dimensions for input, but got: %dD",
                   name, nsp + 1, nsp + 2, t->rank);
    return false;
  }
  P->lead = t->rank - nsp;
  for (int i = 1; i < t->rank; i++)
    if (t->sizes[i] == 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "%s: Expected input's non-batch dimensions to have positive length, but input "
                     "has a shape of %lld at dimension %d",
                     name, (long long)t->sizes[i], i);
      return false;
    }
  return true;
}

/* kernel_size, stride, padding (and dilation) lists at args first.. */
static bool tpu_pool_sliding(tpu_lower *L, tpu_tref *t, int nsp, int first, bool has_dil, bool ceil_mode,
                             bool count_pad, const char *name, tpu_pool *P) {
  if (!tpu_pool_input(L, t, nsp, name, P)) return false;
  int64_t k[3], s[3], p[3], d[3] = {1, 1, 1};
  tpu_arg *ka = &L->args[first], *sa = &L->args[first + 1];
  if (ka->kind != TPU_ARG_INTS || (ka->nints != 1 && ka->nints != nsp)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: kernel_size must either be a single int, or a tuple of %d ints", name, nsp);
    return false;
  }
  if (sa->kind == TPU_ARG_INTS && sa->nints != 0 && sa->nints != 1 && sa->nints != nsp) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: stride must either be omitted, a single int, or a tuple of %d ints", name,
                   nsp);
    return false;
  }
  if (!tpu_conv_list(L, first, nsp, 1, k) || !tpu_conv_list(L, first + 2, nsp, 0, p) ||
      (has_dil && !tpu_conv_list(L, first + 3, nsp, 1, d)))
    return false;
  if (sa->kind == TPU_ARG_INTS && sa->nints == 0) {
    memcpy(s, k, sizeof s);
  } else if (!tpu_conv_list(L, first + 1, nsp, 1, s)) {
    return false;
  }
  for (int i = 0; i < nsp; i++) {
    if (k[i] <= 0 || s[i] <= 0 || d[i] <= 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     k[i] <= 0   ? "kernel size should be greater than zero, but got kH: %lld"
                     : s[i] <= 0 ? "stride should be greater than zero, but got dH: %lld"
                                 : "dilation should be greater than zero, but got dilationH: %lld",
                     (long long)(k[i] <= 0   ? k[i]
                                 : s[i] <= 0 ? s[i]
                                             : d[i]));
      return false;
    }
    if (p[i] < 0 || p[i] > (has_dil ? (d[i] * (k[i] - 1) + 1) / 2 : k[i] / 2)) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     has_dil ? "pad should be at most half of effective kernel size, but got pad=%lld, "
                               "kernel_size=%lld and dilation=%lld"
                             : "pad should be at most half of kernel size, but got pad=%lld, "
                               "kernel_size=%lld and dilation=%lld",
                     (long long)p[i], (long long)k[i], (long long)d[i]);
      return false;
    }
  }
  for (int i = 0; i < nsp; i++) {
    if (!tpu_win_sliding(L, &P->w[i], t->sizes[P->lead + i], k[i], s[i], p[i], d[i], ceil_mode, count_pad))
      return false;
    if (P->w[i].out < 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Given input size: (%lldx...). Calculated output size: (%lldx...). "
                     "Output size is too small",
                     (long long)t->sizes[P->lead - 1], (long long)P->w[i].out);
      return false;
    }
  }
  return true;
}

static bool tpu_pool_adaptive(tpu_lower *L, tpu_tref *t, int nsp, int osz_arg, const char *name, tpu_pool *P) {
  if (!tpu_pool_input(L, t, nsp, name, P)) return false;
  tpu_arg *a = &L->args[osz_arg];
  if (a->kind != TPU_ARG_INTS || (a->nints != nsp && a->nints != 1)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: output_size must be %d", name, nsp);
    return false;
  }
  for (int i = 0; i < nsp; i++) {
    int64_t o = a->ints[a->nints == 1 ? 0 : i];
    if (o < 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "%s: elements of output_size must be greater than or equal to 0 but received {%lld}", name,
                     (long long)o);
      return false;
    }
    if (!tpu_win_adaptive(L, &P->w[i], t->sizes[P->lead + i], o)) return false;
  }
  return true;
}

/* Apply the per-dim 0/1 window matrices (transposed: back from outputs to inputs). */
static tpu_hv tpu_pool_products(tpu_lower *L, tpu_hv x, const tpu_pool *P, bool transposed) {
  tpu_dtype dt = T(L, x)->dtype;
  for (int d = 0; d < P->nsp; d++) {
    const tpu_win *w = &P->w[d];
    int64_t n = w->out * w->in;
    int64_t *m = calloc((size_t)n + 1, sizeof(int64_t));
    if (!m) {
      tpu_lower_fail(L, TPU_ERR_MEMORY, "%s: out of memory", L->opname);
      return TPU_HV_NONE;
    }
    for (int64_t o = 0; o < w->out; o++)
      for (int64_t j = 0; j < w->K; j++)
        if (w->valid[o * w->K + j]) m[o * w->in + w->idx[o * w->K + j]] = 1;
    int64_t md[2] = {w->out, w->in};
    tpu_hv mat = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, md), m);
    free(m);
    mat = tpu_hlo_convert(H, mat, dt);
    int64_t lc = P->lead, rc = transposed ? 0 : 1;
    x = tpu_hlo_dot_general(H, x, mat, 0, NULL, NULL, 1, &lc, &rc, TPU_HLO_PREC_HIGHEST, dt);
  }
  return x;
}

/* x's finite values (0 elsewhere), and 0/1 flags of its nans, +infs and
 * -infs, in x's dtype. */
static tpu_hv tpu_nonfinite_flags(tpu_lower *L, tpu_hv x, tpu_hv flags[3]) {
  tpu_hv zero = tpu_k(L, x, 0), one = tpu_k(L, x, 1), inf = tpu_k(L, x, INFINITY);
  flags[0] = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, x, x), one, zero);
  flags[1] = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, x, inf), one, zero);
  flags[2] = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, x, tpu_hlo_unary(H, TPU_HLO_NEG, inf)), one, zero);
  return tpu_hlo_select(H, tpu_hlo_unary(H, TPU_HLO_IS_FINITE, x), x, zero);
}

/* sum of the finite terms, made nan where nan > 0 or both pos and neg (the
 * counts of nan terms, +inf and -inf terms) are, else +inf or -inf where one is. */
static tpu_hv tpu_nonfinite_sum(tpu_lower *L, tpu_hv sum, tpu_hv nan, tpu_hv pos, tpu_hv neg) {
  tpu_hv z = tpu_k(L, sum, 0), hasp = tpu_hlo_compare(H, TPU_HLO_GT, pos, z);
  tpu_hv hasn = tpu_hlo_compare(H, TPU_HLO_GT, neg, z);
  tpu_hv bad =
      tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_compare(H, TPU_HLO_GT, nan, z), tpu_hlo_binary(H, TPU_HLO_AND, hasp, hasn));
  sum = tpu_hlo_select(H, hasn, tpu_k(L, sum, -INFINITY), sum);
  sum = tpu_hlo_select(H, hasp, tpu_k(L, sum, INFINITY), sum);
  return tpu_hlo_select(H, bad, tpu_k(L, sum, NAN), sum);
}

/* The window sums: products with the 0/1 window matrices, of the finite
 * values only, since a product counts 0 * inf or 0 * nan where the window
 * does not reach (every output of the row would be nan). A window that
 * holds a nan, or both infinities, sums to nan; one infinity, to it; as the
 * CPU's loops. */
static tpu_hv tpu_pool_linear(tpu_lower *L, tpu_hv x, const tpu_pool *P, bool transposed) {
  if (!tpu_dtype_is_float(T(L, x)->dtype)) return tpu_pool_products(L, x, P, transposed);
  tpu_hv f[3], fin = tpu_nonfinite_flags(L, x, f); /* how many nans, +infs and -infs each window holds */
  return tpu_nonfinite_sum(L, tpu_pool_products(L, fin, P, transposed), tpu_pool_products(L, f[0], P, transposed),
                           tpu_pool_products(L, f[1], P, transposed), tpu_pool_products(L, f[2], P, transposed));
}

/* Divisors over the output's spatial shape (dtype dt), broadcast to `dims`. */
static tpu_hv tpu_pool_divisor(tpu_lower *L, const tpu_pool *P, tpu_dtype dt, int rank, const int64_t *dims) {
  tpu_hv r = TPU_HV_NONE;
  for (int d = 0; d < P->nsp; d++) {
    const tpu_win *w = &P->w[d];
    tpu_hv c = tpu_hlo_convert(H, tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 1, &w->out), w->cnt), dt);
    int64_t bd = P->lead + d;
    c = tpu_hlo_broadcast_in_dim(H, c, rank, dims, &bd);
    r = d == 0 ? c : tpu_mul(L, r, c);
  }
  return r;
}

static tpu_hv tpu_pool_avg(tpu_lower *L, int xarg, const tpu_pool *P, int div_arg) {
  tpu_tref *t = &L->args[xarg].t;
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt);
  tpu_hv y = tpu_pool_linear(L, tpu_lower_input(L, xarg, acc), P, false);
  const tpu_hlo_type yt = *T(L, y);
  tpu_hv div;
  if (div_arg >= 0 && !tpu_lower_is_none(L, div_arg))
    div = tpu_lower_full(L, yt, (double)L->args[div_arg].i);
  else
    div = tpu_pool_divisor(L, P, acc, yt.rank, yt.dims);
  return tpu_hlo_convert(H, tpu_hlo_binary(H, TPU_HLO_DIV, y, div), dt);
}

static tpu_hv tpu_pool_avg_backward(tpu_lower *L, int garg, const tpu_pool *P, int div_arg) {
  tpu_dtype dt = L->args[garg].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv g = tpu_lower_input(L, garg, acc);
  const tpu_hlo_type gt = *T(L, g);
  tpu_hv div;
  if (div_arg >= 0 && !tpu_lower_is_none(L, div_arg))
    div = tpu_lower_full(L, gt, (double)L->args[div_arg].i);
  else
    div = tpu_pool_divisor(L, P, acc, gt.rank, gt.dims);
  g = tpu_hlo_binary(H, TPU_HLO_DIV, g, div);
  return tpu_hlo_convert(H, tpu_pool_linear(L, g, P, true), dt);
}

/* Elements of x along dim picked by the constant positions idx[0..n). */
static tpu_hv tpu_take(tpu_lower *L, tpu_hv x, int dim, const int64_t *idx, int64_t n) {
  const tpu_hlo_type xt = *T(L, x);
  int64_t nd[2] = {n, 1};
  tpu_hv iv = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, nd), idx);
  tpu_hlo_gather_dims g;
  memset(&g, 0, sizeof g);
  int64_t slice[TPU_MAX_RANK];
  tpu_hlo_type rt = xt;
  rt.dims[dim] = n;
  for (int i = 0; i < xt.rank; i++) {
    slice[i] = i == dim ? 1 : xt.dims[i];
    if (i != dim) g.offset_dims[g.n_offset++] = i;
  }
  g.n_collapsed = 1;
  g.collapsed_slice_dims[0] = dim;
  g.n_start_index_map = 1;
  g.start_index_map[0] = dim;
  g.index_vector_dim = 1;
  return tpu_hlo_gather(H, x, iv, &g, slice, rt);
}

/* The lowest value of dt (-inf for floats), the padding of max pooling. */
static tpu_hv tpu_lowest_value(tpu_lower *L, tpu_dtype dt) {
  if (tpu_dtype_is_float(dt)) return tpu_hlo_constant(H, dt, -INFINITY);
  return tpu_hlo_constant_int(H, dt, tpu_dtype_int_min(dt));
}

/* Max pooling: (values, flat indices within each plane). */
static void tpu_pool_max(tpu_lower *L, int xarg, const tpu_pool *P, tpu_hv *vals, tpu_hv *idxs) {
  tpu_tref *t = &L->args[xarg].t;
  tpu_dtype dt = t->dtype;
  int lead = P->lead, nsp = P->nsp;
  tpu_hv x = tpu_lower_tensor(L, xarg, -1);
  for (int d = 0; d < nsp; d++) x = tpu_take(L, x, lead + d, P->w[d].idx, P->w[d].out * P->w[d].K);
  /* (lead..., o1, K1, o2, K2, ...) */
  int64_t ed[TPU_MAX_RANK * 2];
  int er = lead + 2 * nsp;
  for (int i = 0; i < lead; i++) ed[i] = t->sizes[i];
  for (int d = 0; d < nsp; d++) {
    ed[lead + 2 * d] = P->w[d].out;
    ed[lead + 2 * d + 1] = P->w[d].K;
  }
  if (er > TPU_MAX_RANK) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s: too many dims", L->opname);
    return;
  }
  x = tpu_hlo_reshape(H, x, er, ed);
  /* flat index and validity over (o1, K1, ...), then broadcast over lead */
  tpu_hv fi = TPU_HV_NONE, ok = TPU_HV_NONE;
  int64_t stride = 1;
  for (int d = nsp - 1; d >= 0; d--) {
    const tpu_win *w = &P->w[d];
    int64_t wd[2] = {w->out, w->K}, bd[2] = {lead + 2 * d, lead + 2 * d + 1};
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(w->out * w->K + 1));
    if (!v) {
      tpu_lower_fail(L, TPU_ERR_MEMORY, "%s: out of memory", L->opname);
      return;
    }
    for (int64_t i = 0; i < w->out * w->K; i++) v[i] = w->idx[i] * stride;
    tpu_hv c = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, wd), v);
    for (int64_t i = 0; i < w->out * w->K; i++) v[i] = w->valid[i];
    tpu_hv vc = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 2, wd), v);
    free(v);
    c = tpu_hlo_broadcast_in_dim(H, c, er, ed, bd);
    vc = tpu_hlo_broadcast_in_dim(H, vc, er, ed, bd);
    fi = d == nsp - 1 ? c : tpu_add(L, fi, c);
    ok = d == nsp - 1 ? vc : tpu_hlo_binary(H, TPU_HLO_AND, ok, vc);
    stride *= w->in;
  }
  tpu_hv low = tpu_lowest_value(L, dt);
  x = tpu_hlo_select(H, ok, x, tpu_hlo_broadcast_in_dim(H, low, er, ed, NULL));
  fi = tpu_hlo_select(H, ok, fi, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, er, ed), 9.2e18));
  tpu_hlo_type st[4] = {tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL),
                        tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL)};
  tpu_hv a[4];
  tpu_hlo_region_begin(H, st, 4, a); /* (acc value, acc index, elem value, elem index) */
  tpu_hv gt = tpu_hlo_compare(H, TPU_HLO_GT, a[2], a[0]);
  tpu_hv eq = tpu_hlo_compare(H, TPU_HLO_EQ, a[2], a[0]);
  tpu_hv lt_idx = tpu_hlo_compare(H, TPU_HLO_LT, a[3], a[1]);
  tpu_hv take = tpu_hlo_binary(H, TPU_HLO_OR, gt, tpu_hlo_binary(H, TPU_HLO_AND, eq, lt_idx));
  if (tpu_dtype_is_float(dt)) {
    tpu_hv en = tpu_hlo_compare(H, TPU_HLO_NE, a[2], a[2]), an = tpu_hlo_compare(H, TPU_HLO_NE, a[0], a[0]);
    tpu_hv gt_idx = tpu_hlo_compare(H, TPU_HLO_GT, a[3], a[1]);
    /* both NaN: the later one; one NaN: it; none: the rule above */
    tpu_hv both = tpu_hlo_binary(H, TPU_HLO_AND, en, an);
    tpu_hv either = tpu_hlo_binary(H, TPU_HLO_OR, en, an);
    take = tpu_hlo_select(H, both, gt_idx, tpu_hlo_select(H, either, en, take));
  }
  tpu_hv rv[2] = {tpu_hlo_select(H, take, a[2], a[0]), tpu_hlo_select(H, take, a[3], a[1])};
  int region = tpu_hlo_region_end(H, rv, 2);
  int64_t rd[3];
  for (int d = 0; d < nsp; d++) rd[d] = lead + 2 * d + 1;
  tpu_hv xs[2] = {x, fi};
  tpu_hv inits[2] = {low, tpu_hlo_constant_int(H, TPU_S64, INT64_MAX)};
  tpu_hv outs[2] = {TPU_HV_NONE, TPU_HV_NONE};
  tpu_hlo_reduce_region(H, xs, inits, 2, rd, nsp, region, outs);
  *vals = outs[0];
  *idxs = outs[1];
}

/* Scatter-add g (lead..., o...) into zeros of the input's shape at the flat
 * plane indices: the backward of max pooling. */
static tpu_hv tpu_pool_max_backward(tpu_lower *L, int garg, int xarg, int iarg, int nsp) {
  tpu_tref *g = &L->args[garg].t, *x = &L->args[xarg].t, *ix = &L->args[iarg].t;
  tpu_dtype dt = g->dtype, acc = tpu_acc_type(dt);
  int lead = x->rank - nsp;
  int64_t planes = 1, in_n = 1, on = 1;
  for (int i = 0; i < lead; i++) planes *= x->sizes[i];
  for (int i = lead; i < x->rank; i++) in_n *= x->sizes[i];
  for (int i = 0; i < ix->rank; i++) on *= ix->sizes[i];
  if (ix->rank != g->rank || on == 0 || planes == 0) {
    if (on != 0 && planes != 0)
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: indices and grad_output shapes differ", L->opname);
    return tpu_hlo_convert(H, tpu_lower_full(L, tpu_hlo_type_make(acc, x->rank, x->sizes), 0), dt);
  }
  on /= planes;
  int64_t pd[2] = {planes, on}, n = planes * on, n1[2] = {n, 1}, tot = planes * in_n;
  tpu_hv idx = tpu_hlo_reshape(H, tpu_lower_input(L, iarg, TPU_S64), 2, pd);
  tpu_hv base = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, pd), 0);
  idx = tpu_add(L, idx, tpu_mul(L, base, tpu_k(L, base, (double)in_n)));
  idx = tpu_hlo_reshape(H, idx, 2, n1);
  tpu_hv upd = tpu_hlo_reshape(H, tpu_lower_input(L, garg, acc), 1, &n);
  tpu_hlo_type st = tpu_hlo_type_make(acc, 0, NULL), sts[2] = {st, st};
  tpu_hv a[2];
  tpu_hlo_region_begin(H, sts, 2, a);
  tpu_hv sum = tpu_add(L, a[0], a[1]);
  int region = tpu_hlo_region_end(H, &sum, 1);
  tpu_hv r = tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(acc, 1, &tot), 0), idx, upd, region);
  return tpu_hlo_convert(H, tpu_hlo_reshape(H, r, x->rank, x->sizes), dt);
}

/* max_pool{2,3}d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode) -> (out, indices) */
static void tpu_emit_max_pool_nd(tpu_lower *L, int nsp) {
  tpu_pool P;
  const char *name = nsp == 2 ? "max_pool2d" : "max_pool3d";
  const tpu_tref *in = &L->args[0].t;
  for (int d = in->rank == nsp + 2 ? 1 : 0; d < in->rank && in->rank >= nsp + 1; d++)
    if (in->sizes[d] == 0) {
      char shp[256];
      size_t n = 0;
      for (int k = 0; k < in->rank; k++)
        n += (size_t)snprintf(shp + n, sizeof shp - n, "%s%lld", k ? ", " : "", (long long)in->sizes[k]);
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "%s_with_indices_out_cpu_template(): Expected input's non-batch dimensions to "
                     "have positive length, but input has a shape of [%s] and non-batch dimension %d has length zero!",
                     name, shp, d);
      return;
    }
  if (tpu_pool_sliding(L, &L->args[0].t, nsp, 1, true, tpu_arg_bool(L, 5), false, name, &P)) {
    tpu_hv v, i;
    tpu_pool_max(L, 0, &P, &v, &i);
    tpu_lower_out(L, v);
    tpu_lower_out(L, i);
  }
  tpu_pool_free(&P);
}
void tpu_emit_max_pool2d(tpu_lower *L) { tpu_emit_max_pool_nd(L, 2); }
void tpu_emit_max_pool3d(tpu_lower *L) { tpu_emit_max_pool_nd(L, 3); }

/* max_pool{2,3}d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices) */
void tpu_emit_max_pool2d_backward(tpu_lower *L) { tpu_lower_out(L, tpu_pool_max_backward(L, 0, 1, 7, 2)); }
void tpu_emit_max_pool3d_backward(tpu_lower *L) { tpu_lower_out(L, tpu_pool_max_backward(L, 0, 1, 7, 3)); }

/* adaptive_max_pool{2,3}d(self, output_size) -> (out, indices) */
static void tpu_emit_adaptive_max_nd(tpu_lower *L, int nsp) {
  tpu_pool P;
  if (tpu_pool_adaptive(L, &L->args[0].t, nsp, 1, nsp == 2 ? "adaptive_max_pool2d" : "adaptive_max_pool3d", &P)) {
    tpu_hv v, i;
    tpu_pool_max(L, 0, &P, &v, &i);
    tpu_lower_out(L, v);
    tpu_lower_out(L, i);
  }
  tpu_pool_free(&P);
}
void tpu_emit_adaptive_max_pool2d(tpu_lower *L) { tpu_emit_adaptive_max_nd(L, 2); }
void tpu_emit_adaptive_max_pool3d(tpu_lower *L) { tpu_emit_adaptive_max_nd(L, 3); }

/* adaptive_max_pool{2,3}d_backward(grad_output, self, indices) */
void tpu_emit_adaptive_max_pool2d_backward(tpu_lower *L) { tpu_lower_out(L, tpu_pool_max_backward(L, 0, 1, 2, 2)); }
void tpu_emit_adaptive_max_pool3d_backward(tpu_lower *L) { tpu_lower_out(L, tpu_pool_max_backward(L, 0, 1, 2, 3)); }

/* avg_pool{2,3}d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override) */
static void tpu_emit_avg_pool_nd(tpu_lower *L, int nsp) {
  tpu_pool P;
  if (!tpu_lower_is_none(L, 6) && L->args[6].i == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "divisor must be not zero");
    return;
  }
  if (L->args[0].t.dtype == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"avg_pool%dd\" not implemented for 'Bool'", nsp);
    return;
  }
  if (tpu_pool_sliding(L, &L->args[0].t, nsp, 1, false, tpu_arg_bool(L, 4),
                       L->args[5].kind != TPU_ARG_BOOL || L->args[5].i, nsp == 2 ? "avg_pool2d" : "avg_pool3d", &P))
    tpu_lower_out(L, tpu_pool_avg(L, 0, &P, 6));
  tpu_pool_free(&P);
}
void tpu_emit_avg_pool2d(tpu_lower *L) { tpu_emit_avg_pool_nd(L, 2); }
void tpu_emit_avg_pool3d(tpu_lower *L) { tpu_emit_avg_pool_nd(L, 3); }

/* avg_pool{2,3}d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override) */
static void tpu_emit_avg_pool_backward_nd(tpu_lower *L, int nsp) {
  tpu_pool P;
  if (tpu_pool_sliding(L, &L->args[1].t, nsp, 2, false, tpu_arg_bool(L, 5),
                       L->args[6].kind != TPU_ARG_BOOL || L->args[6].i,
                       nsp == 2 ? "avg_pool2d_backward" : "avg_pool3d_backward", &P))
    tpu_lower_out(L, tpu_pool_avg_backward(L, 0, &P, 7));
  tpu_pool_free(&P);
}
void tpu_emit_avg_pool2d_backward(tpu_lower *L) { tpu_emit_avg_pool_backward_nd(L, 2); }
void tpu_emit_avg_pool3d_backward(tpu_lower *L) { tpu_emit_avg_pool_backward_nd(L, 3); }

/* _adaptive_avg_pool{2,3}d(self, output_size) */
static void tpu_emit_adaptive_avg_nd(tpu_lower *L, int nsp) {
  tpu_pool P;
  if (tpu_pool_adaptive(L, &L->args[0].t, nsp, 1, nsp == 2 ? "adaptive_avg_pool2d" : "adaptive_avg_pool3d", &P))
    tpu_lower_out(L, tpu_pool_avg(L, 0, &P, -1));
  tpu_pool_free(&P);
}
void tpu_emit_adaptive_avg_pool2d(tpu_lower *L) { tpu_emit_adaptive_avg_nd(L, 2); }
void tpu_emit_adaptive_avg_pool3d(tpu_lower *L) { tpu_emit_adaptive_avg_nd(L, 3); }

/* _adaptive_avg_pool{2,3}d_backward(grad_output, self) */
static void tpu_emit_adaptive_avg_backward_nd(tpu_lower *L, int nsp) {
  tpu_pool P;
  tpu_tref *g = &L->args[0].t;
  if (!tpu_pool_input(L, &L->args[1].t, nsp, "adaptive_avg_pool_backward", &P)) return;
  bool ok = true;
  for (int i = 0; ok && i < nsp; i++)
    ok = tpu_win_adaptive(L, &P.w[i], L->args[1].t.sizes[P.lead + i], g->sizes[g->rank - nsp + i]);
  if (ok) tpu_lower_out(L, tpu_pool_avg_backward(L, 0, &P, -1));
  tpu_pool_free(&P);
}
void tpu_emit_adaptive_avg_pool2d_backward(tpu_lower *L) { tpu_emit_adaptive_avg_backward_nd(L, 2); }
void tpu_emit_adaptive_avg_pool3d_backward(tpu_lower *L) { tpu_emit_adaptive_avg_backward_nd(L, 3); }

/* max_unpool2d(self, indices, output_size); max_unpool3d(self, indices, output_size, stride, padding):
 * each plane's values go to their flat indices in a zero plane. */
static void tpu_emit_max_unpool_nd(tpu_lower *L, int nsp) {
  tpu_tref *x = &L->args[0].t, *ix = &L->args[1].t;
  tpu_arg *os = &L->args[2];
  if (ix->dtype != TPU_S64) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "elements in indices should be type int64 but got: %s",
                   tpu_dtype_name(ix->dtype));
    return;
  }
  if (os->kind != TPU_ARG_INTS || os->nints != nsp) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "There should be exactly %d elements but got %d elements", nsp,
                   os->kind == TPU_ARG_INTS ? os->nints : 0);
    return;
  }
  if (x->rank != nsp + 1 && x->rank != nsp + 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Input to max_unpooling%dd should be a %dd or %dd Tensor, but got a tensor with %d "
                   "dimensions.",
                   nsp, nsp + 1, nsp + 2, x->rank);
    return;
  }
  bool same = ix->rank == x->rank;
  for (int i = 0; same && i < x->rank; i++) same = ix->sizes[i] == x->sizes[i];
  if (!same) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected shape of indices to be same as that of the input tensor");
    return;
  }
  int lead = x->rank - nsp;
  int64_t planes = 1, in_n = 1, out_n = 1, od[TPU_MAX_RANK];
  for (int i = 0; i < lead; i++) {
    planes *= x->sizes[i];
    od[i] = x->sizes[i];
  }
  for (int i = 0; i < nsp; i++) {
    in_n *= x->sizes[lead + i];
    out_n *= os->ints[i];
    od[lead + i] = os->ints[i];
  }
  tpu_dtype dt = x->dtype;
  int64_t tot = planes * out_n;
  if (planes * in_n == 0 || tot == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, x->rank, od), 0));
    return;
  }
  int64_t pd[2] = {planes, in_n}, n = planes * in_n, n1[2] = {n, 1};
  tpu_hv idx = tpu_hlo_reshape(H, tpu_lower_tensor(L, 1, -1), 2, pd);
  /* out-of-range indices are dropped (torch raises; the check would need a device read) */
  tpu_hv bad = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_compare(H, TPU_HLO_LT, idx, tpu_k(L, idx, 0)),
                              tpu_hlo_compare(H, TPU_HLO_GE, idx, tpu_k(L, idx, (double)out_n)));
  tpu_hv base = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, pd), 0);
  idx = tpu_add(L, idx, tpu_mul(L, base, tpu_k(L, base, (double)out_n)));
  idx = tpu_hlo_select(H, bad, tpu_k(L, idx, (double)tot), idx);
  idx = tpu_hlo_reshape(H, idx, 2, n1);
  tpu_hv upd = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &n);
  tpu_hv r = tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &tot), 0), idx, upd, -1);
  tpu_lower_out(L, tpu_hlo_reshape(H, r, x->rank, od));
}
void tpu_emit_max_unpool2d(tpu_lower *L) { tpu_emit_max_unpool_nd(L, 2); }
void tpu_emit_max_unpool3d(tpu_lower *L) { tpu_emit_max_unpool_nd(L, 3); }

/* ---- upsampling ----------------------------------------------------------------------------
 *
 * Every mode is separable: each spatial dim is resampled by an (out x in)
 * matrix whose rows hold torch's taps and weights (computed here in torch's
 * arithmetic: float for float/half inputs, double for double). The forward
 * applies the last dim first, as torch's kernel nests its sums; the backward
 * applies the transposed matrices. Nearest modes gather instead (exact for
 * every dtype). */

typedef enum { TPU_UP_NEAREST, TPU_UP_NEAREST_EXACT, TPU_UP_LINEAR, TPU_UP_CUBIC, TPU_UP_AA_LINEAR } tpu_up_mode;

/* A read of an element with weight w: bit 0 read, 1 a positive weight, 2 a
 * negative one, 3 a zero one (the border's clamped taps read one element
 * several times: torch's loop adds each term, so an infinity read with
 * weights of both signs, or with a zero weight, is nan). */
#define TPU_UP_TAP(t, w) ((t) |= (unsigned char)(1 | ((w) > 0 ? 2 : (w) < 0 ? 4 : 8)))

/* torch's compute_scales_value / area_pixel_compute_scale, in T */
#define TPU_UP_DEFINE(T, SUF)                                                                                          \
  static T tpu_up_scale_##SUF(int64_t in, int64_t out, bool align, bool has_s, double s) {                             \
    if (align) return out > 1 ? (T)(in - 1) / (T)(out - 1) : (T)0;                                                     \
    return (has_s && s > 0) ? (T)(1.0 / s) : (T)in / (T)out;                                                           \
  }                                                                                                                    \
  static T tpu_up_src_##SUF(T scale, int64_t o, bool align, bool cubic) {                                              \
    if (align) return scale * (T)o;                                                                                    \
    T src = scale * ((T)o + (T)0.5) - (T)0.5;                                                                          \
    return (!cubic && src < 0) ? (T)0 : src;                                                                           \
  }                                                                                                                    \
  static T tpu_cc1_##SUF(T x, T A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }                                     \
  static T tpu_cc2_##SUF(T x, T A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }                               \
  static void tpu_up_row_##SUF(tpu_up_mode mode, int64_t in, int64_t out, int64_t o, bool align, bool has_s, double s, \
                               double *row, unsigned char *tap) {                                                      \
    T scale = tpu_up_scale_##SUF(in, out, align, has_s, s);                                                            \
    if (mode == TPU_UP_LINEAR) {                                                                                       \
      T real = tpu_up_src_##SUF(scale, o, align, false);                                                               \
      int64_t i0 = (int64_t)floor((double)real);                                                                       \
      if (i0 > in - 1) i0 = in - 1;                                                                                    \
      T lam = real - (T)i0;                                                                                            \
      lam = lam < 0 ? 0 : lam > 1 ? 1 : lam;                                                                           \
      int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);                                                                         \
      row[i0] += (double)((T)1 - lam);                                                                                 \
      row[i1] += (double)lam;                                                                                          \
      TPU_UP_TAP(tap[i0], (T)1 - lam);                                                                                 \
      TPU_UP_TAP(tap[i1], lam);                                                                                        \
    } else if (mode == TPU_UP_CUBIC) {                                                                                 \
      T real = tpu_up_src_##SUF(scale, o, align, true);                                                                \
      int64_t i0 = (int64_t)floor((double)real);                                                                       \
      T t = real - (T)i0, A = (T) - 0.75;                                                                              \
      T w[4] = {tpu_cc2_##SUF(t + 1, A), tpu_cc1_##SUF(t, A), tpu_cc1_##SUF(1 - t, A), tpu_cc2_##SUF(2 - t, A)};       \
      for (int j = 0; j < 4; j++) {                                                                                    \
        int64_t k = i0 - 1 + j;                                                                                        \
        k = k < 0 ? 0 : k > in - 1 ? in - 1 : k;                                                                       \
        row[k] += (double)w[j];                                                                                        \
        TPU_UP_TAP(tap[k], w[j]);                                                                                      \
      }                                                                                                                \
    } else { /* antialiased linear: a triangle filter widened by the downscale */                                      \
      T support = scale >= 1 ? scale : (T)1;                                                                           \
      T center = scale * ((T)o + (T)0.5);                                                                              \
      T inv = scale >= 1 ? (T)1 / scale : (T)1;                                                                        \
      int64_t lo = (int64_t)(center - support + (T)0.5);                                                               \
      if (lo < 0) lo = 0;                                                                                              \
      int64_t hi = (int64_t)(center + support + (T)0.5);                                                               \
      if (hi > in) hi = in;                                                                                            \
      T tot = 0, ws[4096];                                                                                             \
      int64_t n = hi - lo > 4096 ? 4096 : hi - lo;                                                                     \
      for (int64_t j = 0; j < n; j++) {                                                                                \
        T x = ((T)(j + lo) - center + (T)0.5) * inv;                                                                   \
        x = x < 0 ? -x : x;                                                                                            \
        ws[j] = x < 1 ? (T)1 - x : (T)0;                                                                               \
        tot += ws[j];                                                                                                  \
      }                                                                                                                \
      for (int64_t j = 0; j < n; j++) {                                                                                \
        row[lo + j] += (double)(tot != 0 ? ws[j] / tot : (T)0);                                                        \
        TPU_UP_TAP(tap[lo + j], tot != 0 ? ws[j] / tot : (T)0);                                                        \
      }                                                                                                                \
    }                                                                                                                  \
  }
TPU_UP_DEFINE(float, f)
TPU_UP_DEFINE(double, d)

/* torch's nearest_idx / nearest-exact source index (float arithmetic). */
static int64_t tpu_up_nearest(bool exact, int64_t in, int64_t out, int64_t o, bool has_s, double s) {
  if (!exact && out == in) return o;
  if (!exact && out == 2 * in) return o >> 1;
  float scale = tpu_up_scale_f(in, out, false, has_s, s);
  int64_t i = (int64_t)floorf(exact ? ((float)o + 0.5f) * scale : (float)o * scale);
  return i < in - 1 ? i : in - 1;
}

typedef struct {
  tpu_up_mode mode;
  int nsp;
  bool align;
  int64_t in[3], out[3];
  bool has_s[3];
  double s[3];
} tpu_up;

/* The (out x in) matrix of dim d as a constant of dtype dt (f32 or f64);
 * taps[4] (when asked), 0/1 matrices of dtype dt: the elements torch's
 * kernel reads for each output, whatever their weight; those an infinity
 * read makes +inf, -inf, nan (see TPU_UP_TAP); TPU_HV_NONE where none. */
static tpu_hv tpu_up_matrix(tpu_lower *L, const tpu_up *U, int d, tpu_dtype dt, tpu_hv *taps) {
  int64_t in = U->in[d], out = U->out[d], n = in * out;
  double *m = calloc((size_t)n + 1, sizeof(double));
  int64_t *bits = calloc((size_t)n + 1, sizeof(int64_t));
  unsigned char *tap = calloc((size_t)n + 1, 1);
  if (!m || !bits || !tap) {
    free(m);
    free(bits);
    free(tap);
    tpu_lower_fail(L, TPU_ERR_MEMORY, "%s: out of memory", L->opname);
    return TPU_HV_NONE;
  }
  for (int64_t o = 0; o < out; o++) {
    if (U->mode == TPU_UP_NEAREST || U->mode == TPU_UP_NEAREST_EXACT) {
      int64_t k = tpu_up_nearest(U->mode == TPU_UP_NEAREST_EXACT, in, out, o, U->has_s[d], U->s[d]);
      m[o * in + k] = 1;
      tap[o * in + k] = 1;
    } else if (dt == TPU_F64) {
      tpu_up_row_d(U->mode, in, out, o, U->align, U->has_s[d], U->s[d], m + o * in, tap + o * in);
    } else {
      tpu_up_row_f(U->mode, in, out, o, U->align, U->has_s[d], U->s[d], m + o * in, tap + o * in);
    }
  }
  for (int64_t i = 0; i < n; i++) {
    if (dt == TPU_F64) {
      memcpy(&bits[i], &m[i], 8);
    } else {
      float f = (float)m[i];
      int32_t b;
      memcpy(&b, &f, 4);
      bits[i] = b;
    }
  }
  int64_t md[2] = {out, in};
  tpu_hv c = tpu_hlo_constant_ints(H, tpu_hlo_type_make(dt == TPU_F64 ? TPU_S64 : TPU_S32, 2, md), bits);
  if (taps) { /* read; an infinity read gives +inf, -inf, nan; TPU_HV_NONE: no such read */
    for (int k = 0; k < 4; k++) {
      bool any = false;
      for (int64_t i = 0; i < n; i++) {
        unsigned char t = tap[i];
        bool pos = t & 2, neg = t & 4, nan = (t & 8) || (pos && neg);
        bits[i] = k == 0 ? (t & 1) : k == 1 ? (pos && !nan) : k == 2 ? (neg && !nan) : nan;
        any = any || bits[i];
      }
      taps[k] =
          any ? tpu_hlo_convert(H, tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S32, 2, md), bits), dt) : TPU_HV_NONE;
    }
  }
  free(m);
  free(bits);
  free(tap);
  return tpu_hlo_bitcast_convert(H, c, dt == TPU_F64 ? TPU_F64 : TPU_F32);
}

/* x with dim `dim` mapped through mat (contracting mat's dim `cd`). */
static tpu_hv tpu_apply_dim(tpu_lower *L, tpu_hv x, tpu_hv mat, int dim, int cd) {
  int rank = T(L, x)->rank;
  int64_t lc = dim, rc = cd;
  tpu_hv r = tpu_hlo_dot_general(H, x, mat, 0, NULL, NULL, 1, &lc, &rc, TPU_HLO_PREC_HIGHEST, T(L, x)->dtype);
  int64_t perm[TPU_MAX_RANK];
  for (int i = 0, k = 0; i < rank; i++) perm[i] = i == dim ? rank - 1 : k++;
  return tpu_hlo_transpose(H, r, perm);
}

/* tpu_apply_dim as torch's loops compute it with non-finite values: the
 * product takes the finite values; a nan read by an output (whatever its
 * weight), or an infinity read with a zero weight, with weights of both
 * signs, or beside the other infinity, makes it nan; otherwise an infinity
 * read makes it that infinity times its weight's sign (taps: the classes of
 * tpu_up_matrix, TPU_HV_NONE for one no output has). A product would spread
 * a nan or an inf to every output of its row. */
/* count plus flag's reads through taps (TPU_HV_NONE: a class no output has) */
static tpu_hv tpu_count_reads(tpu_lower *L, tpu_hv count, tpu_hv flag, tpu_hv taps, int dim, int cd) {
  if (taps == TPU_HV_NONE) return count;
  tpu_hv c = tpu_apply_dim(L, flag, taps, dim, cd);
  return count == TPU_HV_NONE ? c : tpu_add(L, count, c);
}

static tpu_hv tpu_apply_dim_exact(tpu_lower *L, tpu_hv x, tpu_hv mat, const tpu_hv *taps, int dim, int cd) {
  tpu_hv f[3], fin = tpu_nonfinite_flags(L, x, f), none = TPU_HV_NONE;
  tpu_hv sum = tpu_apply_dim(L, fin, mat, dim, cd);
  tpu_hv c[3] = {
      tpu_count_reads(L, tpu_count_reads(L, none, f[0], taps[0], dim, cd), tpu_add(L, f[1], f[2]), taps[3], dim, cd),
      tpu_count_reads(L, tpu_count_reads(L, none, f[1], taps[1], dim, cd), f[2], taps[2], dim, cd),
      tpu_count_reads(L, tpu_count_reads(L, none, f[1], taps[2], dim, cd), f[2], taps[1], dim, cd)};
  for (int k = 0; k < 3; k++)
    if (c[k] == TPU_HV_NONE) c[k] = tpu_k(L, sum, 0);
  return tpu_nonfinite_sum(L, sum, c[0], c[1], c[2]);
}

/* Reads sizes and scales: output_size at arg 1; backward: input_size at 2. */
static bool tpu_up_setup(tpu_lower *L, tpu_up *U, tpu_up_mode mode, int nsp, bool backward, bool has_align) {
  memset(U, 0, sizeof *U);
  U->mode = mode;
  U->nsp = nsp;
  tpu_arg *os = &L->args[1];
  if (os->kind != TPU_ARG_INTS || os->nints != nsp) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "It is expected output_size equals to %d, but got size %d", nsp,
                   os->kind == TPU_ARG_INTS ? os->nints : 0);
    return false;
  }
  int next = 2;
  int64_t full_in[TPU_MAX_RANK];
  int rank;
  if (backward) {
    tpu_arg *is = &L->args[2];
    if (is->kind != TPU_ARG_INTS || is->nints != nsp + 2) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "It is expected input_size equals to %d, but got size %d", nsp + 2,
                     is->kind == TPU_ARG_INTS ? is->nints : 0);
      return false;
    }
    rank = nsp + 2;
    memcpy(full_in, is->ints, sizeof(int64_t) * (size_t)rank);
    next = 3;
  } else {
    tpu_tref *t = &L->args[0].t;
    rank = t->rank;
    if (rank != nsp + 2) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected %dD input, but got input of rank %d", nsp + 2, rank);
      return false;
    }
    memcpy(full_in, t->sizes, sizeof(int64_t) * (size_t)rank);
  }
  if (has_align) U->align = L->args[next++].i != 0;
  for (int d = 0; d < nsp; d++) {
    U->in[d] = full_in[2 + d];
    U->out[d] = os->ints[d];
    if (U->in[d] <= 0 || U->out[d] <= 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Input and output sizes should be greater than 0, but got input (%lld) and "
                     "output (%lld)",
                     (long long)U->in[d], (long long)U->out[d]);
      return false;
    }
    tpu_arg *sa = next + d < L->nargs ? &L->args[next + d] : NULL;
    U->has_s[d] = sa && sa->kind == TPU_ARG_FLOAT;
    U->s[d] = U->has_s[d] ? sa->f : 0;
  }
  if (backward) {
    tpu_tref *g = &L->args[0].t;
    bool ok = g->rank == rank && g->sizes[0] == full_in[0] && g->sizes[1] == full_in[1];
    for (int d = 0; ok && d < nsp; d++) ok = g->sizes[2 + d] == U->out[d];
    if (!ok) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected grad_output to have the shape of the output");
      return false;
    }
  }
  return true;
}

static void tpu_emit_upsample(tpu_lower *L, tpu_up_mode mode, int nsp, bool has_align) {
  tpu_up U;
  if (!tpu_up_setup(L, &U, mode, nsp, false, has_align)) return;
  tpu_tref *t = &L->args[0].t;
  if (mode == TPU_UP_NEAREST || mode == TPU_UP_NEAREST_EXACT) {
    tpu_hv x = tpu_lower_tensor(L, 0, -1);
    for (int d = 0; d < nsp; d++) {
      int64_t *idx = malloc(sizeof(int64_t) * (size_t)(U.out[d] + 1));
      if (!idx) {
        tpu_lower_fail(L, TPU_ERR_MEMORY, "%s: out of memory", L->opname);
        return;
      }
      for (int64_t o = 0; o < U.out[d]; o++)
        idx[o] = tpu_up_nearest(mode == TPU_UP_NEAREST_EXACT, U.in[d], U.out[d], o, U.has_s[d], U.s[d]);
      x = tpu_take(L, x, 2 + d, idx, U.out[d]);
      free(idx);
    }
    tpu_lower_out(L, x);
    return;
  }
  if (!tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"%s\" not implemented for '%s'", L->opname, tpu_dtype_name(t->dtype));
    return;
  }
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc);
  for (int d = nsp - 1; d >= 0; d--) {
    tpu_hv taps[4] = {TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE}, mat = tpu_up_matrix(L, &U, d, acc, taps);
    x = tpu_apply_dim_exact(L, x, mat, taps, 2 + d, 1);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, x, dt));
}

static void tpu_emit_upsample_backward(tpu_lower *L, tpu_up_mode mode, int nsp, bool has_align) {
  tpu_up U;
  if (!tpu_up_setup(L, &U, mode, nsp, true, has_align)) return;
  tpu_dtype dt = L->args[0].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv g = tpu_lower_input(L, 0, acc);
  for (int d = 0; d < nsp; d++) {
    tpu_hv taps[4] = {TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE}, mat = tpu_up_matrix(L, &U, d, acc, taps);
    g = tpu_apply_dim_exact(L, g, mat, taps, 2 + d, 0);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, g, dt));
}

void tpu_emit_upsample_nearest1d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_NEAREST, 1, false); }
void tpu_emit_upsample_nearest2d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_NEAREST, 2, false); }
void tpu_emit_upsample_nearest3d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_NEAREST, 3, false); }
void tpu_emit_upsample_nearest_exact1d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_NEAREST_EXACT, 1, false); }
void tpu_emit_upsample_nearest_exact2d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_NEAREST_EXACT, 2, false); }
void tpu_emit_upsample_nearest_exact3d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_NEAREST_EXACT, 3, false); }
void tpu_emit_upsample_linear1d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_LINEAR, 1, true); }
void tpu_emit_upsample_bilinear2d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_LINEAR, 2, true); }
void tpu_emit_upsample_trilinear3d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_LINEAR, 3, true); }
void tpu_emit_upsample_bicubic2d(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_CUBIC, 2, true); }
void tpu_emit_upsample_bilinear2d_aa(tpu_lower *L) { tpu_emit_upsample(L, TPU_UP_AA_LINEAR, 2, true); }
void tpu_emit_upsample_nearest1d_backward(tpu_lower *L) { tpu_emit_upsample_backward(L, TPU_UP_NEAREST, 1, false); }
void tpu_emit_upsample_nearest2d_backward(tpu_lower *L) { tpu_emit_upsample_backward(L, TPU_UP_NEAREST, 2, false); }
void tpu_emit_upsample_nearest3d_backward(tpu_lower *L) { tpu_emit_upsample_backward(L, TPU_UP_NEAREST, 3, false); }
void tpu_emit_upsample_nearest_exact1d_backward(tpu_lower *L) {
  tpu_emit_upsample_backward(L, TPU_UP_NEAREST_EXACT, 1, false);
}
void tpu_emit_upsample_nearest_exact2d_backward(tpu_lower *L) {
  tpu_emit_upsample_backward(L, TPU_UP_NEAREST_EXACT, 2, false);
}
void tpu_emit_upsample_nearest_exact3d_backward(tpu_lower *L) {
  tpu_emit_upsample_backward(L, TPU_UP_NEAREST_EXACT, 3, false);
}
void tpu_emit_upsample_linear1d_backward(tpu_lower *L) { tpu_emit_upsample_backward(L, TPU_UP_LINEAR, 1, true); }
void tpu_emit_upsample_bilinear2d_backward(tpu_lower *L) { tpu_emit_upsample_backward(L, TPU_UP_LINEAR, 2, true); }
void tpu_emit_upsample_trilinear3d_backward(tpu_lower *L) { tpu_emit_upsample_backward(L, TPU_UP_LINEAR, 3, true); }
void tpu_emit_upsample_bicubic2d_backward(tpu_lower *L) { tpu_emit_upsample_backward(L, TPU_UP_CUBIC, 2, true); }
void tpu_emit_upsample_bilinear2d_aa_backward(tpu_lower *L) {
  tpu_emit_upsample_backward(L, TPU_UP_AA_LINEAR, 2, true);
}

/* ---- im2col, col2im, channel_shuffle -------------------------------------------------------- */

/* Window tables of im2col/col2im over spatial sizes sp[2]; args from `first`:
 * kernel_size, dilation, padding, stride. */
static bool tpu_unfold_windows(tpu_lower *L, int first, const int64_t *sp, tpu_pool *P) {
  memset(P, 0, sizeof *P);
  P->nsp = 2;
  int64_t k[2], d[2], p[2], s[2];
  if (!tpu_conv_list(L, first, 2, 1, k) || !tpu_conv_list(L, first + 1, 2, 1, d) ||
      !tpu_conv_list(L, first + 2, 2, 0, p) || !tpu_conv_list(L, first + 3, 2, 1, s))
    return false;
  for (int i = 0; i < 2; i++) {
    if (k[i] <= 0 || d[i] <= 0 || s[i] <= 0 || p[i] < 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     k[i] <= 0   ? "kernel size should be greater than zero, but got kernel_height: %lld"
                     : d[i] <= 0 ? "dilation should be greater than zero, but got dilation_height: %lld"
                     : s[i] <= 0 ? "stride should be greater than zero, but got stride_height: %lld"
                                 : "padding should be non-negative, but got pad_height: %lld",
                     (long long)(k[i] <= 0   ? k[i]
                                 : d[i] <= 0 ? d[i]
                                 : s[i] <= 0 ? s[i]
                                             : p[i]));
      return false;
    }
    if (!tpu_win_sliding(L, &P->w[i], sp[i], k[i], s[i], p[i], d[i], false, false)) return false;
    if (P->w[i].out < 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Given input with spatial size (%lld, %lld), kernel_size=(%lld, %lld), "
                     "dilation=(%lld, %lld), padding=(%lld, %lld), calculated shape of the array of sliding blocks as "
                     "(%lld, %lld), but its components must be at least one.",
                     (long long)sp[0], (long long)sp[1], (long long)k[0], (long long)k[1], (long long)d[0],
                     (long long)d[1], (long long)p[0], (long long)p[1], (long long)P->w[0].out, (long long)P->w[1].out);
      return false;
    }
  }
  return true;
}

/* 0/1 validity of the (o1, K1, o2, K2) window positions, broadcast to dims. */
static tpu_hv tpu_unfold_valid(tpu_lower *L, const tpu_pool *P, int lead, int rank, const int64_t *dims) {
  tpu_hv ok = TPU_HV_NONE;
  for (int d = 0; d < 2; d++) {
    const tpu_win *w = &P->w[d];
    int64_t n = w->out * w->K, wd[2] = {w->out, w->K}, bd[2] = {lead + 2 * d, lead + 2 * d + 1};
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!v) {
      tpu_lower_fail(L, TPU_ERR_MEMORY, "%s: out of memory", L->opname);
      return TPU_HV_NONE;
    }
    for (int64_t i = 0; i < n; i++) v[i] = w->valid[i];
    tpu_hv c = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_PRED, 2, wd), v);
    free(v);
    c = tpu_hlo_broadcast_in_dim(H, c, rank, dims, bd);
    ok = d == 0 ? c : tpu_hlo_binary(H, TPU_HLO_AND, ok, c);
  }
  return ok;
}

/* im2col(self, kernel_size, dilation, padding, stride): (N, C, H, W) -> (N, C*kh*kw, L) */
void tpu_emit_im2col(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (t->rank != 3 && t->rank != 4) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected 3D or 4D (batch mode) tensor for input with possibly 0 batch size and "
                   "non-zero dimensions for input, but got: %dD",
                   t->rank);
    return;
  }
  int lead = t->rank - 2;
  tpu_pool P;
  if (tpu_unfold_windows(L, 1, t->sizes + lead, &P)) {
    tpu_hv x = tpu_lower_tensor(L, 0, -1);
    for (int d = 0; d < 2; d++) x = tpu_take(L, x, lead + d, P.w[d].idx, P.w[d].out * P.w[d].K);
    int64_t ed[6], od = P.w[0].out, ow = P.w[1].out, kh = P.w[0].K, kw = P.w[1].K;
    for (int i = 0; i < lead; i++) ed[i] = t->sizes[i];
    ed[lead] = od;
    ed[lead + 1] = kh;
    ed[lead + 2] = ow;
    ed[lead + 3] = kw;
    x = tpu_hlo_reshape(H, x, lead + 4, ed);
    x = tpu_hlo_select(H, tpu_unfold_valid(L, &P, lead, lead + 4, ed), x, tpu_k(L, x, 0));
    int64_t perm[6], rd[3];
    for (int i = 0; i < lead; i++) perm[i] = i;
    perm[lead] = lead + 1;
    perm[lead + 1] = lead + 3;
    perm[lead + 2] = lead;
    perm[lead + 3] = lead + 2;
    x = tpu_hlo_transpose(H, x, perm); /* (.., C, kh, kw, oh, ow) */
    for (int i = 0; i < lead - 1; i++) rd[i] = t->sizes[i];
    rd[lead - 1] = t->sizes[lead - 1] * kh * kw;
    rd[lead] = od * ow;
    tpu_lower_out(L, tpu_hlo_reshape(H, x, lead + 1, rd));
  }
  tpu_pool_free(&P);
}

/* col2im(self, output_size, kernel_size, dilation, padding, stride): the sum of
 * the blocks back into (N, C, H, W), as 0/1 contractions per spatial dim. */
void tpu_emit_col2im(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (t->rank != 2 && t->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and "
                   "non-zero dimensions for input, but got: %dD",
                   t->rank);
    return;
  }
  tpu_arg *os = &L->args[1];
  if (os->kind != TPU_ARG_INTS || os->nints != 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "It is expected output_size equals to 2, but got size %d",
                   os->kind == TPU_ARG_INTS ? os->nints : 0);
    return;
  }
  tpu_pool P;
  if (tpu_unfold_windows(L, 2, os->ints, &P)) {
    int64_t oh = P.w[0].out, ow = P.w[1].out, kh = P.w[0].K, kw = P.w[1].K;
    int64_t ck = t->sizes[t->rank - 2];
    if (ck % (kh * kw) != 0 || t->sizes[t->rank - 1] != oh * ow) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Expected size of input's dimension 1 to be divisible by the product of "
                     "kernel_size, but got input.size(1)=%lld and kernel_size=(%lld, %lld)",
                     (long long)ck, (long long)kh, (long long)kw);
      tpu_pool_free(&P);
      return;
    }
    int cl = t->rank - 2; /* channel dim */
    int64_t ed[6];
    for (int i = 0; i < cl; i++) ed[i] = t->sizes[i];
    ed[cl] = ck / (kh * kw);
    ed[cl + 1] = kh;
    ed[cl + 2] = kw;
    ed[cl + 3] = oh;
    ed[cl + 4] = ow;
    tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt);
    tpu_hv x = tpu_hlo_reshape(H, tpu_lower_input(L, 0, acc), cl + 5, ed);
    int64_t perm[6];
    for (int i = 0; i <= cl; i++) perm[i] = i;
    perm[cl + 1] = cl + 3;
    perm[cl + 2] = cl + 1;
    perm[cl + 3] = cl + 4;
    perm[cl + 4] = cl + 2;
    x = tpu_hlo_transpose(H, x, perm); /* (.., C, oh, kh, ow, kw) */
    int64_t fd[5];
    for (int i = 0; i <= cl; i++) fd[i] = ed[i];
    fd[cl + 1] = oh * kh;
    fd[cl + 2] = ow * kw;
    x = tpu_hlo_reshape(H, x, cl + 3, fd);
    /* per dim: a (in x o*K) 0/1 matrix that drops padding positions */
    for (int d = 0; d < 2; d++) {
      const tpu_win *w = &P.w[d];
      int64_t n = w->out * w->K;
      int64_t *m = calloc((size_t)(n * w->in + 1), sizeof(int64_t));
      if (!m) {
        tpu_lower_fail(L, TPU_ERR_MEMORY, "%s: out of memory", L->opname);
        break;
      }
      for (int64_t j = 0; j < n; j++)
        if (w->valid[j]) m[w->idx[j] * n + j] = 1;
      int64_t md[2] = {w->in, n};
      tpu_hv mat = tpu_hlo_convert(H, tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, md), m), acc);
      free(m);
      /* each read with weight 1: a nan or both infinities in a sum make it nan, one infinity it */
      tpu_hv taps[4] = {mat, mat, TPU_HV_NONE, TPU_HV_NONE};
      x = tpu_apply_dim_exact(L, x, mat, taps, cl + 1 + d, 1);
    }
    tpu_lower_out(L, tpu_hlo_convert(H, x, dt));
  }
  tpu_pool_free(&P);
}

/* channel_shuffle(self, groups): (N, g, C/g, *) -> (N, C/g, g, *) */
void tpu_emit_channel_shuffle(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t g = L->args[1].i;
  if (t->rank < 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "channel_shuffle expects input to have at least 3 dimensions, but got input with "
                   "sizes [...]");
    return;
  }
  if (g <= 0 || t->sizes[1] % g != 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   g <= 0 ? "Number of groups to divide channels in must be positive. Value of "
                            "groups:%lld"
                          : "Number of channels must be divisible by groups. Got %lld channels and %lld groups.",
                   g <= 0 ? (long long)g : (long long)t->sizes[1], (long long)g);
    return;
  }
  int64_t d[TPU_MAX_RANK + 1], perm[TPU_MAX_RANK + 1];
  d[0] = t->sizes[0];
  d[1] = g;
  d[2] = t->sizes[1] / g;
  for (int i = 2; i < t->rank; i++) d[i + 1] = t->sizes[i];
  for (int i = 0; i <= t->rank; i++) perm[i] = i;
  perm[1] = 2;
  perm[2] = 1;
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), t->rank + 1, d);
  tpu_lower_out(L, tpu_hlo_reshape(H, tpu_hlo_transpose(H, x, perm), t->rank, t->sizes));
}

/* ---- grid_sampler_{2,3}d ---------------------------------------------------------------------
 *
 * Each output point reads a few taps of its input plane: per spatial dim a
 * tap list (bilinear: 2, nearest: 1, bicubic: 4) with positions, weights and
 * the weights' derivatives by the coordinate; a tap of the whole grid is one
 * choice per dim. Values are gathered as rows of (N*S, C); the input gradient
 * scatter-adds the weighted output gradient to the same rows; the grid
 * gradient sums value x derivative, chained through the padding mode and
 * the unnormalization as torch does. */

enum { TPU_GS_BILINEAR = 0, TPU_GS_NEAREST = 1, TPU_GS_BICUBIC = 2 };
enum { TPU_GS_ZEROS = 0, TPU_GS_BORDER = 1, TPU_GS_REFLECTION = 2 };

typedef struct {
  int k;                      /* taps in this dim */
  tpu_hv pos[4], w[4], dw[4]; /* (N, P) each, acc dtype; pos integral-valued */
  tpu_hv mult;                /* d(source coordinate)/d(grid value) */
} tpu_gs_dim;

/* clip to [0, S-1] with its gradient factor */
static tpu_hv tpu_gs_clip(tpu_lower *L, tpu_hv c, double S, tpu_hv *grad) {
  tpu_hv lo = tpu_k(L, c, 0), hi = tpu_k(L, c, S - 1);
  if (grad) {
    tpu_hv inside =
        tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GT, c, lo), tpu_hlo_compare(H, TPU_HLO_LT, c, hi));
    *grad = tpu_mul(L, *grad, tpu_hlo_select(H, inside, tpu_k(L, c, 1), tpu_k(L, c, 0)));
  }
  return tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_LE, c, lo), lo,
                        tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GE, c, hi), hi, c));
}

/* torch's reflect_coordinates over [twice_low/2, twice_high/2], with its gradient factor */
static tpu_hv tpu_gs_reflect(tpu_lower *L, tpu_hv c, double tlo, double thi, tpu_hv *grad) {
  if (tlo == thi) {
    if (grad) *grad = tpu_k(L, c, 0);
    return tpu_k(L, c, 0);
  }
  double mn = tlo / 2, span = (thi - tlo) / 2;
  tpu_hv in = tpu_sub(L, c, tpu_k(L, c, mn));
  tpu_hv neg = tpu_hlo_compare(H, TPU_HLO_LT, in, tpu_k(L, in, 0));
  in = tpu_hlo_unary(H, TPU_HLO_ABS, in);
  tpu_hv extra = tpu_hlo_binary(H, TPU_HLO_REM, in, tpu_k(L, in, span));
  tpu_hv flips = tpu_hlo_unary(H, TPU_HLO_FLOOR, tpu_hlo_binary(H, TPU_HLO_DIV, in, tpu_k(L, in, span)));
  tpu_hv half = tpu_mul(L, flips, tpu_k(L, flips, 0.5));
  tpu_hv even = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_unary(H, TPU_HLO_FLOOR, half), half);
  tpu_hv r = tpu_hlo_select(H, even, tpu_add(L, extra, tpu_k(L, extra, mn)),
                            tpu_add(L, tpu_sub(L, tpu_k(L, extra, span), extra), tpu_k(L, extra, mn)));
  if (grad) {
    tpu_hv one = tpu_k(L, c, 1), mone = tpu_k(L, c, -1);
    tpu_hv s = tpu_hlo_select(H, neg, mone, one);
    s = tpu_hlo_select(H, even, s, tpu_hlo_unary(H, TPU_HLO_NEG, s));
    *grad = tpu_mul(L, *grad, s);
  }
  return r;
}

/* torch's compute_coordinates (padding), with its gradient factor when grad != NULL */
static tpu_hv tpu_gs_pad(tpu_lower *L, tpu_hv c, int pad, bool align, double S, tpu_hv *grad) {
  if (pad == TPU_GS_BORDER) return tpu_gs_clip(L, c, S, grad);
  if (pad == TPU_GS_REFLECTION) {
    c = align ? tpu_gs_reflect(L, c, 0, 2 * (S - 1), grad) : tpu_gs_reflect(L, c, -1, 2 * S - 1, grad);
    return tpu_gs_clip(L, c, S, grad);
  }
  return c;
}

static tpu_hv tpu_gs_cc1(tpu_lower *L, tpu_hv x, double A) { /* ((A+2)x - (A+3)) x x + 1 */
  tpu_hv r = tpu_sub(L, tpu_mul(L, tpu_k(L, x, A + 2), x), tpu_k(L, x, A + 3));
  return tpu_add(L, tpu_mul(L, tpu_mul(L, r, x), x), tpu_k(L, x, 1));
}
static tpu_hv tpu_gs_cc2(tpu_lower *L, tpu_hv x, double A) { /* ((A x - 5A) x + 8A) x - 4A */
  tpu_hv r = tpu_sub(L, tpu_mul(L, tpu_k(L, x, A), x), tpu_k(L, x, 5 * A));
  r = tpu_add(L, tpu_mul(L, r, x), tpu_k(L, x, 8 * A));
  return tpu_sub(L, tpu_mul(L, r, x), tpu_k(L, x, 4 * A));
}
/* torch's get_cubic_coefficients_grad forms (the negated derivatives) */
static tpu_hv tpu_gs_poly(tpu_lower *L, tpu_hv x, double a, double b, double c) { /* (a x + b) x + c */
  return tpu_add(L, tpu_mul(L, tpu_add(L, tpu_mul(L, tpu_k(L, x, a), x), tpu_k(L, x, b)), x), tpu_k(L, x, c));
}
static void tpu_gs_taps(tpu_lower *L, tpu_hv c, int mode, int pad, bool align, double S, bool vec, tpu_gs_dim *D) {
  D->mult = tpu_k(L, c, align ? (S - 1) / 2 : S / 2);
  /* unnormalize: torch's vectorized 2d kernel scales by a precomputed factor, its 3d kernel by the formula */
  if (vec)
    c = align ? tpu_mul(L, tpu_add(L, c, tpu_k(L, c, 1)), D->mult)
              : tpu_sub(L, tpu_mul(L, tpu_add(L, c, tpu_k(L, c, 1)), D->mult), tpu_k(L, c, 0.5));
  else if (align)
    c = tpu_mul(L, tpu_mul(L, tpu_add(L, c, tpu_k(L, c, 1)), tpu_k(L, c, 0.5)), tpu_k(L, c, S - 1));
  else
    c = tpu_mul(L, tpu_sub(L, tpu_mul(L, tpu_add(L, c, tpu_k(L, c, 1)), tpu_k(L, c, S)), tpu_k(L, c, 1)),
                tpu_k(L, c, 0.5));
  if (mode != TPU_GS_BICUBIC) c = tpu_gs_pad(L, c, pad, align, S, &D->mult);
  if (mode == TPU_GS_NEAREST) {
    D->k = 1;
    D->pos[0] = tpu_hlo_unary(H, TPU_HLO_ROUND_EVEN, c);
    D->w[0] = tpu_k(L, c, 1);
    D->dw[0] = tpu_k(L, c, 0);
    return;
  }
  tpu_hv i0 = tpu_hlo_unary(H, TPU_HLO_FLOOR, c);
  if (mode == TPU_GS_BILINEAR) {
    D->k = 2;
    D->pos[0] = i0;
    D->pos[1] = tpu_add(L, i0, tpu_k(L, i0, 1));
    D->w[0] = tpu_sub(L, D->pos[1], c);
    D->w[1] = tpu_sub(L, c, i0);
    D->dw[0] = tpu_k(L, c, -1);
    D->dw[1] = tpu_k(L, c, 1);
    return;
  }
  double A = -0.75;
  tpu_hv t = tpu_sub(L, c, i0), one = tpu_k(L, t, 1), two = tpu_k(L, t, 2);
  D->k = 4;
  D->w[0] = tpu_gs_cc2(L, tpu_add(L, t, one), A);
  D->w[1] = tpu_gs_cc1(L, t, A);
  D->w[2] = tpu_gs_cc1(L, tpu_sub(L, one, t), A);
  D->w[3] = tpu_gs_cc2(L, tpu_sub(L, two, t), A);
  tpu_hv g0 = tpu_gs_poly(L, tpu_sub(L, tpu_k(L, t, -1), t), -3 * A, -10 * A, -8 * A);
  tpu_hv g1 = tpu_gs_poly(L, tpu_hlo_unary(H, TPU_HLO_NEG, t), -3 * (A + 2), -2 * (A + 3), 0);
  tpu_hv g2 = tpu_gs_poly(L, tpu_sub(L, one, t), 3 * (A + 2), -2 * (A + 3), 0);
  tpu_hv g3 = tpu_gs_poly(L, tpu_sub(L, two, t), 3 * A, -10 * A, 8 * A);
  D->dw[0] = tpu_hlo_unary(H, TPU_HLO_NEG, g0);
  D->dw[1] = tpu_hlo_unary(H, TPU_HLO_NEG, g1);
  D->dw[2] = tpu_hlo_unary(H, TPU_HLO_NEG, g2);
  D->dw[3] = tpu_hlo_unary(H, TPU_HLO_NEG, g3);
  for (int k = 0; k < 4; k++) D->pos[k] = tpu_gs_pad(L, tpu_add(L, i0, tpu_k(L, i0, k - 1)), pad, align, S, NULL);
}

typedef struct {
  int nsp, mode, pad;
  bool align;
  int64_t N, C, P, S, sp[3], osp[3];
  tpu_dtype dt, acc;
  tpu_gs_dim d[3];
} tpu_gs;

/* args: input at xi, grid at xi+1, then mode, padding, align_corners */
static bool tpu_gs_setup(tpu_lower *L, int xi, int nsp, tpu_gs *G) {
  tpu_tref *x = &L->args[xi].t, *g = &L->args[xi + 1].t;
  memset(G, 0, sizeof *G);
  G->nsp = nsp;
  G->mode = (int)L->args[xi + 2].i;
  G->pad = (int)L->args[xi + 3].i;
  G->align = L->args[xi + 4].i != 0;
  if (x->rank != nsp + 2 || g->rank != nsp + 2 || g->sizes[nsp + 1] != nsp || x->sizes[0] != g->sizes[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "grid_sampler(): expected %dD input and grid with same batch size and last "
                   "dimension %d",
                   nsp + 2, nsp);
    return false;
  }
  if (x->dtype != g->dtype || !tpu_dtype_is_float(x->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "grid_sampler(): expected input and grid to have same dtype, but input has %s and "
                   "grid has %s",
                   tpu_dtype_name(x->dtype), tpu_dtype_name(g->dtype));
    return false;
  }
  if (G->mode < 0 || G->mode > 2 || G->pad < 0 || G->pad > 2 || (nsp == 3 && G->mode == TPU_GS_BICUBIC)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "grid_sampler(): unsupported interpolation or padding mode");
    return false;
  }
  G->N = x->sizes[0];
  G->C = x->sizes[1];
  G->P = 1;
  G->S = 1;
  for (int d = 0; d < nsp; d++) {
    G->sp[d] = x->sizes[2 + d];
    G->osp[d] = g->sizes[1 + d];
    G->P *= G->osp[d];
    G->S *= G->sp[d];
  }
  G->dt = x->dtype;
  G->acc = x->dtype; /* torch computes half types per op in their own precision here */
  int64_t gd[3] = {G->N, G->P, nsp}, one[3] = {1, 1, 1}, np[2] = {G->N, G->P};
  tpu_hv grid = tpu_hlo_reshape(H, tpu_lower_input(L, xi + 1, G->acc), 3, gd);
  for (int d = 0; d < nsp; d++) {
    int comp = nsp - 1 - d;
    int64_t st[3] = {0, 0, comp}, lim[3] = {G->N, G->P, comp + 1};
    tpu_hv c = tpu_hlo_reshape(H, tpu_hlo_slice(H, grid, st, lim, one), 2, np);
    tpu_gs_taps(L, c, G->mode, G->pad, G->align, (double)G->sp[d], nsp == 2, &G->d[d]);
  }
  return tpu_hlo_ok(H);
}

/* The t-th tap (mixed radix over dims): weight, validity, global row index (N*P, 1). */
static void tpu_gs_tap(tpu_lower *L, const tpu_gs *G, int t, tpu_hv *w, tpu_hv *ok, tpu_hv *rows, int *ks) {
  tpu_hv flat = TPU_HV_NONE;
  *w = TPU_HV_NONE;
  *ok = TPU_HV_NONE;
  int64_t stride = 1;
  for (int d = G->nsp - 1; d >= 0; d--) {
    const tpu_gs_dim *D = &G->d[d];
    int k = t % D->k;
    t /= D->k;
    ks[d] = k;
    tpu_hv p = D->pos[k];
    tpu_hv v = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GE, p, tpu_k(L, p, 0)),
                              tpu_hlo_compare(H, TPU_HLO_LT, p, tpu_k(L, p, (double)G->sp[d])));
    tpu_hv pi = tpu_hlo_convert(
        H, tpu_hlo_clamp(H, tpu_hlo_constant(H, G->acc, 0), p, tpu_hlo_constant(H, G->acc, (double)(G->sp[d] - 1))),
        TPU_S64);
    pi = tpu_mul(L, pi, tpu_k(L, pi, (double)stride));
    flat = flat == TPU_HV_NONE ? pi : tpu_add(L, flat, pi);
    *ok = *ok == TPU_HV_NONE ? v : tpu_hlo_binary(H, TPU_HLO_AND, *ok, v);
    *w = *w == TPU_HV_NONE ? D->w[k] : tpu_mul(L, *w, D->w[k]);
    stride *= G->sp[d];
  }
  int64_t np[2] = {G->N, G->P}, n1[2] = {G->N * G->P, 1};
  tpu_hv base = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, np), 0);
  flat = tpu_add(L, flat, tpu_mul(L, base, tpu_k(L, base, (double)G->S)));
  *rows = tpu_hlo_reshape(H, flat, 2, n1);
}

static int tpu_gs_ntaps(const tpu_gs *G) {
  int n = 1;
  for (int d = 0; d < G->nsp; d++) n *= G->d[d].k;
  return n;
}

/* input as rows (N*S, C) */
static tpu_hv tpu_gs_rows(tpu_lower *L, int xi, const tpu_gs *G) {
  int nsp = G->nsp;
  int64_t perm[5] = {0}, rd[2] = {G->N * G->S, G->C};
  for (int d = 0; d < nsp; d++) perm[1 + d] = 2 + d;
  perm[nsp + 1] = 1;
  tpu_hv x = tpu_hlo_transpose(H, tpu_lower_input(L, xi, G->acc), perm);
  return tpu_hlo_reshape(H, x, 2, rd);
}

static tpu_hv tpu_gs_bcast_c(tpu_lower *L, const tpu_gs *G, tpu_hv v) { /* (N, P) -> (N, P, C) */
  int64_t d3[3] = {G->N, G->P, G->C}, bd[2] = {0, 1};
  return tpu_hlo_broadcast_in_dim(H, v, 3, d3, bd);
}

/* grid_sampler_{2,3}d(input, grid, interpolation_mode, padding_mode, align_corners) */
static void tpu_emit_grid_sampler(tpu_lower *L, int nsp) {
  tpu_gs G;
  if (!tpu_gs_setup(L, 0, nsp, &G)) return;
  tpu_hv xr = tpu_gs_rows(L, 0, &G), out = TPU_HV_NONE;
  int64_t d3[3] = {G.N, G.P, G.C};
  for (int t = 0; t < tpu_gs_ntaps(&G); t++) {
    tpu_hv w, ok, rows;
    int ks[3];
    tpu_gs_tap(L, &G, t, &w, &ok, &rows, ks);
    tpu_hv v = tpu_hlo_reshape(H, tpu_lower_gather_rows(L, xr, rows), 3, d3);
    tpu_hv c = tpu_mul(L, tpu_gs_bcast_c(L, &G, tpu_hlo_select(H, ok, w, tpu_k(L, w, 0))), v);
    c = tpu_hlo_select(H, tpu_gs_bcast_c(L, &G, ok), c, tpu_k(L, c, 0));
    out = out == TPU_HV_NONE ? c : tpu_add(L, out, c);
  }
  int64_t perm[3] = {0, 2, 1}, od[5] = {G.N, G.C};
  for (int d = 0; d < nsp; d++) od[2 + d] = G.osp[d];
  out = tpu_hlo_reshape(H, tpu_hlo_transpose(H, out, perm), nsp + 2, od);
  tpu_lower_out(L, tpu_hlo_convert(H, out, G.dt));
}
void tpu_emit_grid_sampler_2d(tpu_lower *L) { tpu_emit_grid_sampler(L, 2); }
void tpu_emit_grid_sampler_3d(tpu_lower *L) { tpu_emit_grid_sampler(L, 3); }

/* grid_sampler_{2,3}d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
 * align_corners, output_mask) -> (grad_input, grad_grid) */
static void tpu_emit_grid_sampler_backward(tpu_lower *L, int nsp) {
  tpu_gs G;
  if (!tpu_gs_setup(L, 1, nsp, &G)) return;
  tpu_tref *x = &L->args[1].t, *gr = &L->args[2].t;
  tpu_hv xr = tpu_gs_rows(L, 1, &G);
  int64_t d3[3] = {G.N, G.P, G.C}, perm[5] = {0}, np[2] = {G.N, G.P}, two = 2;
  for (int d = 0; d < nsp; d++) perm[1 + d] = 2 + d;
  perm[nsp + 1] = 1;
  tpu_hv go = tpu_hlo_reshape(H, tpu_hlo_transpose(H, tpu_lower_input(L, 0, G.acc), perm), 3, d3);
  tpu_hv gin = tpu_lower_full(L, tpu_hlo_type_make(G.acc, 2, (int64_t[]){G.N * G.S, G.C}), 0);
  tpu_hv gc[3] = {TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE};
  tpu_hlo_type st = tpu_hlo_type_make(G.acc, 0, NULL), sts[2] = {st, st};
  for (int t = 0; t < tpu_gs_ntaps(&G); t++) {
    tpu_hv w, ok, rows;
    int ks[3];
    tpu_gs_tap(L, &G, t, &w, &ok, &rows, ks);
    tpu_hv okc = tpu_gs_bcast_c(L, &G, ok);
    tpu_hv upd = tpu_mul(L, go, tpu_gs_bcast_c(L, &G, tpu_hlo_select(H, ok, w, tpu_k(L, w, 0))));
    upd = tpu_hlo_select(H, okc, upd, tpu_k(L, upd, 0));
    tpu_hv a[2];
    tpu_hlo_region_begin(H, sts, 2, a);
    tpu_hv s = tpu_add(L, a[0], a[1]);
    int region = tpu_hlo_region_end(H, &s, 1);
    gin = tpu_lower_scatter_rows(L, gin, rows, tpu_hlo_reshape(H, upd, 2, (int64_t[]){G.N * G.P, G.C}), region);
    if (G.mode == TPU_GS_NEAREST) continue;
    tpu_hv v = tpu_hlo_reshape(H, tpu_lower_gather_rows(L, xr, rows), 3, d3);
    v = tpu_hlo_select(H, okc, v, tpu_k(L, v, 0));
    /* per channel over the taps first, then over channels: torch's order */
    for (int d = 0; d < nsp; d++) {
      tpu_dtype wd = G.acc == TPU_F32 ? TPU_F64 : G.acc; /* torch's f32 sum cancels; keep ours exact */
      tpu_hv f = tpu_mul(L, tpu_hlo_convert(H, v, wd), tpu_hlo_convert(H, tpu_gs_bcast_c(L, &G, G.d[d].dw[ks[d]]), wd));
      for (int e = nsp - 1; e >= 0; e--)
        if (e != d) f = tpu_mul(L, f, tpu_hlo_convert(H, tpu_gs_bcast_c(L, &G, G.d[e].w[ks[e]]), wd));
      f = tpu_mul(L, f, tpu_hlo_convert(H, go, wd));
      gc[d] = gc[d] == TPU_HV_NONE ? f : tpu_add(L, gc[d], f);
    }
  }
  for (int d = 0; d < nsp; d++)
    if (gc[d] != TPU_HV_NONE)
      gc[d] = tpu_hlo_convert(
          H, tpu_hlo_reduce(H, gc[d], tpu_hlo_constant(H, T(L, gc[d])->dtype, 0), &two, 1, TPU_HLO_ADD), G.acc);
  /* grad_input back to (N, C, spatial...) */
  int64_t xd[5] = {G.N}, iperm[5] = {0, 0};
  for (int d = 0; d < nsp; d++) xd[1 + d] = G.sp[d];
  xd[nsp + 1] = G.C;
  iperm[1] = nsp + 1;
  for (int d = 0; d < nsp; d++) iperm[2 + d] = 1 + d;
  gin = tpu_hlo_transpose(H, tpu_hlo_reshape(H, gin, nsp + 2, xd), iperm);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, gin, x->rank, x->sizes), G.dt));
  /* grad_grid: component j is spatial dim nsp-1-j */
  tpu_hv comps[3];
  int64_t np1[3] = {G.N, G.P, 1};
  for (int j = 0; j < nsp; j++) {
    int d = nsp - 1 - j;
    tpu_hv c =
        gc[d] == TPU_HV_NONE ? tpu_lower_full(L, tpu_hlo_type_make(G.acc, 2, np), 0) : tpu_mul(L, gc[d], G.d[d].mult);
    comps[j] = tpu_hlo_reshape(H, c, 3, np1);
  }
  tpu_hv gg = tpu_hlo_concat(H, comps, nsp, 2);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, gg, gr->rank, gr->sizes), G.dt));
}
void tpu_emit_grid_sampler_2d_backward(tpu_lower *L) { tpu_emit_grid_sampler_backward(L, 2); }
void tpu_emit_grid_sampler_3d_backward(tpu_lower *L) { tpu_emit_grid_sampler_backward(L, 3); }

/* fractional_max_pool{2,3}d(self, kernel_size, output_size, random_samples) -> (out, indices).
 * Window starts per plane and dim as ATen draws them from the plane's sample
 * u: alpha = (in - k) / (out - 1) in the input's dtype, start_i =
 * int((i + u) alpha) - int(u alpha), the last window at in - k. The samples
 * are (N, C, nsp); the 2-d op reads its width from sample 0 and its height
 * from sample 1, the 3-d op (t, h, w) in order. The max keeps the first of
 * equal values and the last NaN (row-major window order), as the CPU. */
static void tpu_emit_fractional_max_nd(tpu_lower *L, int nsp) {
  const char *name = nsp == 2 ? "fractional_max_pool2d" : "fractional_max_pool3d";
  tpu_tref *t = &L->args[0].t, *rs = &L->args[3].t;
  if (t->rank != nsp + 1 && t->rank != nsp + 2) {
    char sz[256] = "";
    size_t used = 0;
    for (int i = 0; i < t->rank && used < sizeof sz - 32; i++)
      used += (size_t)snprintf(sz + used, sizeof sz - used, "%s%lld", i ? ", " : "", (long long)t->sizes[i]);
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s(): Expected %dD or %dD tensor, but got: [%s]", name, nsp + 1, nsp + 2, sz);
    return;
  }
  if (L->args[1].kind != TPU_ARG_INTS || L->args[1].nints != nsp || L->args[2].kind != TPU_ARG_INTS ||
      L->args[2].nints != nsp) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: kernel_size and output_size must have %d elements", name, nsp);
    return;
  }
  if (rs->dtype != t->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expect _random_samples to have the same dtype as input");
    return;
  }
  if (rs->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expect _random_samples to have 3 dimensions, got %d", rs->rank);
    return;
  }
  int lead = t->rank - nsp;
  int64_t nbatch = lead == 2 ? t->sizes[0] : 1, nchan = t->sizes[lead - 1];
  if (rs->sizes[0] < nbatch) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expect _random_samples.size(0) no less then input batch size.");
    return;
  }
  if (rs->sizes[1] != nchan) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expect _random_samples.size(1) equals to input channel size.");
    return;
  }
  if (rs->sizes[2] != nsp) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expect _random_samples.size(2) equals to %d; got %lld.", nsp,
                   (long long)rs->sizes[2]);
    return;
  }
  if (!tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"%s\" not implemented for '%s'", name, tpu_dtype_name(t->dtype));
    return;
  }
  int64_t planes = 1, in_n = 1, on = 1, in[3], k[3], o[3];
  for (int i = 0; i < lead; i++) planes *= t->sizes[i];
  static const char *dn[3] = {"time", "height", "width"};
  for (int d = 0; d < nsp; d++) {
    in[d] = t->sizes[lead + d];
    k[d] = L->args[1].ints[d];
    o[d] = L->args[2].ints[d];
    in_n *= in[d];
    on *= o[d];
    const char *w = dn[d + 3 - nsp];
    if (k[d] <= 0 || o[d] <= 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s(): kernel_size and output_size must be greater than zero", name);
      return;
    }
    /* the 3-d op wants the windows to leave room (strictly), as the CPU */
    if (o[d] + k[d] - 1 > in[d] || (nsp == 3 && o[d] + k[d] - 1 == in[d])) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s(): pool %s %lld too large relative to input %s %lld",
                     nsp == 3 ? "fractional_max_pool3d_out" : name, w, (long long)k[d], w, (long long)in[d]);
      return;
    }
  }
  tpu_dtype dt = t->dtype;
  int64_t od[4], er = nsp + 1, outd[TPU_MAX_RANK];
  od[0] = planes;
  for (int d = 0; d < nsp; d++) od[d + 1] = o[d];
  for (int i = 0; i < lead; i++) outd[i] = t->sizes[i];
  for (int d = 0; d < nsp; d++) outd[lead + d] = o[d];
  if (planes == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, t->rank, outd), 0));
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, t->rank, outd), 0));
    return;
  }
  int64_t pd2[2] = {planes, nsp};
  tpu_hv u = tpu_lower_tensor(L, 3, -1);
  if (rs->sizes[0] != nbatch) { /* extra samples are not used */
    int64_t lo3[3] = {0, 0, 0}, hi3[3] = {nbatch, nchan, nsp}, st3[3] = {1, 1, 1};
    u = tpu_hlo_slice(H, u, lo3, hi3, st3);
  }
  u = tpu_hlo_reshape(H, u, 2, pd2);
  /* starts[d]: s64 (planes, o[d]) broadcast to (planes, o...) */
  tpu_hv start[3];
  for (int d = 0; d < nsp; d++) {
    int si = nsp == 2 ? 1 - d : d;
    int64_t lo[2] = {0, si}, hi[2] = {planes, si + 1}, one[2] = {1, 1}, p1 = planes;
    tpu_hv ud = tpu_hlo_reshape(H, tpu_hlo_slice(H, u, lo, hi, one), 1, &p1);
    int64_t sd[2] = {planes, o[d]}, b0 = 0;
    tpu_hv s;
    if (o[d] == 1) {
      s = tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 2, sd), (double)(in[d] - k[d]));
    } else {
      tpu_hv alpha = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_hlo_constant(H, dt, (double)(in[d] - k[d])),
                                    tpu_hlo_constant(H, dt, (double)(o[d] - 1)));
      tpu_hv ub = tpu_hlo_broadcast_in_dim(H, ud, 2, sd, &b0);
      tpu_hv ab = tpu_hlo_broadcast_in_dim(H, alpha, 2, sd, NULL);
      tpu_hv io = tpu_hlo_iota(H, tpu_hlo_type_make(dt, 2, sd), 1);
      tpu_hv a = tpu_hlo_convert(H, tpu_mul(L, tpu_add(L, io, ub), ab), TPU_S64);
      tpu_hv b = tpu_hlo_convert(H, tpu_mul(L, ub, ab), TPU_S64);
      s = tpu_sub(L, a, b);
      tpu_hv last = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, sd), 1),
                                    tpu_k(L, s, (double)(o[d] - 1)));
      s = tpu_hlo_select(H, last, tpu_k(L, s, (double)(in[d] - k[d])), s);
    }
    int64_t bd[2] = {0, d + 1};
    start[d] = tpu_hlo_broadcast_in_dim(H, s, (int)er, od, bd);
  }
  int64_t flat_n = planes * in_n, n = planes * on, f1[2] = {flat_n, 1}, n1[2] = {n, 1};
  tpu_hv xf = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 2, f1);
  tpu_hv pbase = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, (int)er, od), 0);
  pbase = tpu_mul(L, pbase, tpu_k(L, pbase, (double)in_n));
  tpu_hv acc = TPU_HV_NONE, ai = TPU_HV_NONE;
  int64_t nk = 1;
  for (int d = 0; d < nsp; d++) nk *= k[d];
  for (int64_t w = 0; w < nk; w++) {
    int64_t rem = w, off[3];
    for (int d = nsp - 1; d >= 0; d--) {
      off[d] = rem % k[d];
      rem /= k[d];
    }
    tpu_hv flat = TPU_HV_NONE;
    for (int d = 0; d < nsp; d++) {
      int64_t stride = 1;
      for (int e = d + 1; e < nsp; e++) stride *= in[e];
      tpu_hv c =
          tpu_mul(L, tpu_add(L, start[d], tpu_k(L, start[d], (double)off[d])), tpu_k(L, start[d], (double)stride));
      flat = flat == TPU_HV_NONE ? c : tpu_add(L, flat, c);
    }
    tpu_hv g = tpu_lower_gather_rows(L, xf, tpu_hlo_reshape(H, tpu_add(L, flat, pbase), 2, n1));
    tpu_hv v = tpu_hlo_reshape(H, g, (int)er, od);
    if (acc == TPU_HV_NONE) {
      acc = v;
      ai = flat;
      continue;
    }
    tpu_hv take =
        tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_compare(H, TPU_HLO_GT, v, acc), tpu_hlo_compare(H, TPU_HLO_NE, v, v));
    acc = tpu_hlo_select(H, take, v, acc);
    ai = tpu_hlo_select(H, take, flat, ai);
  }
  tpu_lower_out(L, tpu_hlo_reshape(H, acc, t->rank, outd));
  tpu_lower_out(L, tpu_hlo_reshape(H, ai, t->rank, outd));
}
void tpu_emit_fractional_max_pool2d(tpu_lower *L) { tpu_emit_fractional_max_nd(L, 2); }
void tpu_emit_fractional_max_pool3d(tpu_lower *L) { tpu_emit_fractional_max_nd(L, 3); }

/* fractional_max_pool{2,3}d_backward(grad_output, self, kernel_size, output_size, indices) */
void tpu_emit_fractional_max_pool_backward(tpu_lower *L) {
  tpu_lower_out(L, tpu_pool_max_backward(L, 0, 1, 4, L->args[2].nints == 3 ? 3 : 2));
}

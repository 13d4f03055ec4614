/* hlo_reduce.c: reductions (see hlo.h; the builder's files are listed in
 * hlo_impl.h).
 *
 * reduce and reduce_window: 1 to 8 operands of one shape, as many 0-d
 * initial values of their dtypes, and a body region (acc..., elem...) ->
 * acc... over those scalars, checked before the op consumes it.
 * tpu_hlo_reduce builds the body (one binary op) itself.
 */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#include "hlo_impl.h"

static int tpu_scalar_body(tpu_hlo *m, tpu_dtype dt, tpu_hlo_op op) {
  tpu_hlo_type st = tpu_hlo_type_make(dt, 0, NULL);
  tpu_hlo_type sts[2] = {st, st};
  tpu_hv args[2];
  tpu_hlo_region_begin(m, sts, 2, args);
  tpu_hv r = tpu_hlo_binary(m, op, args[0], args[1]);
  return tpu_hlo_region_end(m, &r, 1);
}

/* Variadic reductions: n inputs of one shape, n 0-d inits of their dtypes,
 * and a body (acc..., elem...) -> acc... over those scalars. */
static bool tpu_reduce_operands(tpu_hlo *m, const char *op, const tpu_hv *xs, const tpu_hv *inits, int n, int region,
                                tpu_hv *ops) {
  if (n < 1 || n > 8) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: %d operands (1 to 8 supported)", op, n);
    return false;
  }
  for (int i = 0; i < n; i++) {
    ops[i] = xs[i];
    ops[n + i] = inits[i];
  }
  if (!tpu_hloi_check(m, ops, 2 * n)) return false;
  tpu_hlo_type st[16];
  for (int i = 0; i < n; i++) {
    const tpu_hlo_type *x = &TY(xs[i]), *x0 = &TY(xs[0]);
    bool same = x->rank == x0->rank && memcmp(x->dims, x0->dims, sizeof(int64_t) * (size_t)x->rank) == 0;
    if (!same) {
      tpu_hloi_fail_types(m, op, xs[0], xs[i]);
      return false;
    }
    st[i] = st[n + i] = tpu_hlo_type_make(x->dtype, 0, NULL);
    if (!tpu_hlo_type_eq(&TY(inits[i]), &st[i])) {
      tpu_hloi_fail_types(m, op, xs[i], inits[i]);
      return false;
    }
  }
  return tpu_hloi_region_sig(m, op, region, st, 2 * n, st, n);
}

bool tpu_hlo_reduce_region(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *dims, int ndims,
                           int region, tpu_hv *outs) {
  for (int i = 0; i < n && i < 8; i++) outs[i] = TPU_HV_NONE;
  tpu_hv ops[16];
  if (!tpu_reduce_operands(m, "stablehlo.reduce", xs, inits, n, region, ops)) return false;
  const tpu_hlo_type *xt = &TY(xs[0]);
  bool red[TPU_MAX_RANK] = {0};
  if (ndims < 0 || ndims > xt->rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.reduce: %d dimensions for rank %d", ndims, xt->rank);
    return false;
  }
  for (int i = 0; i < ndims; i++) {
    if (dims[i] < 0 || dims[i] >= xt->rank || red[dims[i]]) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.reduce: bad dimension %lld", (long long)dims[i]);
      return false;
    }
    red[dims[i]] = true;
  }
  tpu_hlo_type rt[8];
  for (int k = 0; k < n; k++) {
    rt[k] = tpu_hlo_type_make(TY(xs[k]).dtype, 0, NULL);
    for (int i = 0; i < xt->rank; i++)
      if (!red[i]) rt[k].dims[rt[k].rank++] = xt->dims[i];
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "dimensions", dims, ndims);
  bool ok = tpu_hlo_emit(m, "stablehlo.reduce", ops, 2 * n, &region, 1, tpu_hloi_attrs_str(&a), rt, n, outs);
  tpu_hloi_attrs_free(&a);
  return ok;
}

tpu_hv tpu_hlo_reduce(tpu_hlo *m, tpu_hv x, tpu_hv init, const int64_t *dims, int ndims, tpu_hlo_op op) {
  tpu_hv ops[2] = {x, init};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  int region = tpu_scalar_body(m, TY(x).dtype, op);
  tpu_hv out = TPU_HV_NONE;
  tpu_hlo_reduce_region(m, &x, &init, 1, dims, ndims, region, &out);
  return out;
}

bool tpu_hlo_reduce_window(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *window,
                           const int64_t *strides, const int64_t *base_dil, const int64_t *win_dil, const int64_t *pad,
                           int region, tpu_hv *outs) {
  for (int i = 0; i < n && i < 8; i++) outs[i] = TPU_HV_NONE;
  tpu_hv ops[16];
  if (!tpu_reduce_operands(m, "stablehlo.reduce_window", xs, inits, n, region, ops)) return false;
  const tpu_hlo_type *xt = &TY(xs[0]);
  int r = xt->rank;
  int64_t ones[TPU_MAX_RANK];
  for (int i = 0; i < r; i++) ones[i] = 1;
  const int64_t *st = strides ? strides : ones, *bd = base_dil ? base_dil : ones, *wd = win_dil ? win_dil : ones;
  for (int i = 0; i < r; i++)
    if (!window || window[i] < 1 || st[i] < 1 || bd[i] < 1 || wd[i] < 1) {
      tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.reduce_window: window, strides and dilations must be >= 1 (dim %d)", i);
      return false;
    }
  tpu_hlo_type rt[8];
  for (int k = 0; k < n; k++) {
    rt[k] = TY(xs[k]);
    for (int i = 0; i < r; i++) {
      int64_t dil = xt->dims[i] ? (xt->dims[i] - 1) * bd[i] + 1 : 0;
      int64_t padded = dil + (pad ? pad[2 * i] + pad[2 * i + 1] : 0);
      int64_t wspan = (window[i] - 1) * wd[i] + 1;
      rt[k].dims[i] = padded < wspan ? 0 : (padded - wspan) / st[i] + 1;
    }
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "window_dimensions", window, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "window_strides", st, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "base_dilations", bd, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "window_dilations", wd, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_padding(m, &a.b, pad, r);
  bool ok = tpu_hlo_emit(m, "stablehlo.reduce_window", ops, 2 * n, &region, 1, tpu_hloi_attrs_str(&a), rt, n, outs);
  tpu_hloi_attrs_free(&a);
  return ok;
}

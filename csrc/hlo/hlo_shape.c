/* hlo_shape.c: shape ops (see hlo.h; the builder's files are listed in
 * hlo_impl.h).
 *
 * reshape, broadcast_in_dim, transpose, slice, dynamic_slice,
 * dynamic_update_slice, concatenate, pad and reverse: each checks its
 * operands, infers its result type and emits one op. Where the op would do
 * nothing (a reshape to the same type, an identity broadcast or permutation,
 * one operand to concatenate, no dimension to reverse) the operand itself is
 * returned.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "hlo_impl.h"

tpu_hv tpu_hlo_reshape(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (rank < 0 || rank > TPU_MAX_RANK || (rank && !dims)) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.reshape: bad rank %d", rank);
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = tpu_hlo_type_make(TY(x).dtype, rank, dims);
  if (!tpu_hloi_type_valid(&t)) {
    tpu_hloi_fail_type(m, "stablehlo.reshape", &t);
    return TPU_HV_NONE;
  }
  if (tpu_hlo_type_eq(&t, &TY(x))) return x;
  if (tpu_hlo_type_numel(&t) != tpu_hlo_type_numel(&TY(x))) {
    char a[128], b[128];
    tpu_hlo_type_str(&TY(x), a, sizeof a);
    tpu_hlo_type_str(&t, b, sizeof b);
    tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.reshape: cannot reshape %s to %s", a, b);
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.reshape", &x, 1, NULL, t);
}

tpu_hv tpu_hlo_broadcast_in_dim(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims, const int64_t *bdims) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  if (xt->rank > rank || rank > TPU_MAX_RANK || (xt->rank && !bdims) || (rank && !dims)) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.broadcast_in_dim: bad rank %d for an operand of rank %d", rank,
                 xt->rank);
    return TPU_HV_NONE;
  }
  bool used[TPU_MAX_RANK] = {0};
  for (int i = 0; i < xt->rank; i++) {
    if (bdims[i] < 0 || bdims[i] >= rank || used[bdims[i]] || (xt->dims[i] != 1 && xt->dims[i] != dims[bdims[i]])) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.broadcast_in_dim: dimension %d does not fit", i);
      return TPU_HV_NONE;
    }
    used[bdims[i]] = true;
  }
  tpu_hlo_type t = tpu_hlo_type_make(xt->dtype, rank, dims);
  if (tpu_hlo_type_eq(&t, xt)) {
    bool ident = true;
    for (int i = 0; i < rank; i++) ident = ident && bdims[i] == i;
    if (ident) return x;
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "broadcast_dimensions", bdims, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.broadcast_in_dim", &x, 1, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_transpose(tpu_hlo *m, tpu_hv x, const int64_t *perm) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hlo_type t = *xt;
  bool ident = true, seen[TPU_MAX_RANK] = {0};
  for (int i = 0; i < xt->rank; i++) {
    if (perm[i] < 0 || perm[i] >= xt->rank || seen[perm[i]]) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.transpose: not a permutation");
      return TPU_HV_NONE;
    }
    seen[perm[i]] = true;
    t.dims[i] = xt->dims[perm[i]];
    ident = ident && perm[i] == i;
  }
  if (ident) return x;
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "permutation", perm, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.transpose", &x, 1, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_slice(tpu_hlo *m, tpu_hv x, const int64_t *start, const int64_t *limit, const int64_t *strides) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hlo_type t = *xt;
  int64_t ones[TPU_MAX_RANK];
  for (int i = 0; i < xt->rank; i++) {
    ones[i] = strides ? strides[i] : 1;
    if (start[i] < 0 || limit[i] > xt->dims[i] || start[i] > limit[i] || ones[i] < 1) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.slice: bad bounds in dimension %d", i);
      return TPU_HV_NONE;
    }
    t.dims[i] = (limit[i] - start[i] + ones[i] - 1) / ones[i];
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "start_indices", start, xt->rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "limit_indices", limit, xt->rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "strides", ones, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.slice", &x, 1, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

/* Start indices: one 0-d integer per dimension, all of one dtype. */
static bool tpu_starts_ok(tpu_hlo *m, const char *op, const tpu_hv *starts, int n) {
  for (int i = 0; i < n; i++) {
    const tpu_hlo_type *t = &TY(starts[i]);
    if (t->rank != 0 || !tpu_dtype_is_int(t->dtype) || t->dtype != TY(starts[0]).dtype) {
      char a[128];
      tpu_hlo_type_str(t, a, sizeof a);
      tpu_hlo_fail(m, TPU_ERR_TYPE, "%s: start index %d has type %s; want 0-d integers of one dtype", op, i, a);
      return false;
    }
  }
  return true;
}

tpu_hv tpu_hlo_dynamic_slice(tpu_hlo *m, tpu_hv x, const tpu_hv *starts, const int64_t *sizes) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hv ops[1 + TPU_MAX_RANK];
  ops[0] = x;
  for (int i = 0; i < xt->rank; i++) ops[1 + i] = starts[i];
  if (!tpu_hloi_check(m, ops, 1 + xt->rank)) return TPU_HV_NONE;
  if (!tpu_starts_ok(m, "stablehlo.dynamic_slice", starts, xt->rank)) return TPU_HV_NONE;
  for (int i = 0; i < xt->rank; i++)
    if (sizes[i] < 0 || sizes[i] > xt->dims[i]) {
      tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.dynamic_slice: size %lld out of range in dimension %d",
                   (long long)sizes[i], i);
      return TPU_HV_NONE;
    }
  tpu_hlo_type t = tpu_hlo_type_make(xt->dtype, xt->rank, sizes);
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "slice_sizes", sizes, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.dynamic_slice", ops, 1 + xt->rank, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_dynamic_update_slice(tpu_hlo *m, tpu_hv x, tpu_hv update, const tpu_hv *starts) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hv ops[2 + TPU_MAX_RANK];
  ops[0] = x;
  ops[1] = update;
  for (int i = 0; i < xt->rank; i++) ops[2 + i] = starts[i];
  if (!tpu_hloi_check(m, ops, 2 + xt->rank)) return TPU_HV_NONE;
  bool fits = TY(update).dtype == xt->dtype && TY(update).rank == xt->rank;
  for (int i = 0; fits && i < xt->rank; i++) fits = TY(update).dims[i] <= xt->dims[i];
  if (!fits) {
    tpu_hloi_fail_types(m, "stablehlo.dynamic_update_slice", x, update);
    return TPU_HV_NONE;
  }
  if (!tpu_starts_ok(m, "stablehlo.dynamic_update_slice", starts, xt->rank)) return TPU_HV_NONE;
  return tpu_hlo_emit1(m, "stablehlo.dynamic_update_slice", ops, 2 + xt->rank, NULL, *xt);
}

tpu_hv tpu_hlo_concat(tpu_hlo *m, const tpu_hv *xs, int n, int dim) {
  if (n < 1 || !tpu_hloi_check(m, xs, n)) {
    if (n < 1) tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.concatenate: no operands");
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = TY(xs[0]);
  if (dim < 0 || dim >= t.rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.concatenate: bad dimension %d", dim);
    return TPU_HV_NONE;
  }
  t.dims[dim] = 0;
  for (int i = 0; i < n; i++) {
    const tpu_hlo_type *u = &TY(xs[i]);
    bool ok = u->dtype == t.dtype && u->rank == t.rank;
    for (int d = 0; ok && d < t.rank; d++) ok = d == dim || u->dims[d] == t.dims[d];
    if (!ok) {
      tpu_hloi_fail_types(m, "stablehlo.concatenate", xs[0], xs[i]);
      return TPU_HV_NONE;
    }
    t.dims[dim] += u->dims[dim];
  }
  if (n == 1) return xs[0];
  char attrs[48];
  snprintf(attrs, sizeof attrs, "dimension = %d : i64", dim);
  return tpu_hlo_emit1(m, "stablehlo.concatenate", xs, n, attrs, t);
}

tpu_hv tpu_hlo_pad(tpu_hlo *m, tpu_hv x, tpu_hv padval, const int64_t *lo, const int64_t *hi, const int64_t *interior) {
  tpu_hv ops[2] = {x, padval};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  tpu_hlo_type t = TY(x);
  if (TY(padval).rank != 0 || TY(padval).dtype != t.dtype) {
    tpu_hloi_fail_types(m, "stablehlo.pad", x, padval);
    return TPU_HV_NONE;
  }
  int64_t zeros[TPU_MAX_RANK] = {0};
  const int64_t *in = interior ? interior : zeros;
  for (int i = 0; i < t.rank; i++) {
    int64_t d = t.dims[i];
    t.dims[i] = lo[i] + hi[i] + d + (d > 0 ? (d - 1) * in[i] : 0);
    if (t.dims[i] < 0 || in[i] < 0) {
      tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.pad: negative result size in dimension %d", i);
      return TPU_HV_NONE;
    }
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "edge_padding_low", lo, t.rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "edge_padding_high", hi, t.rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "interior_padding", in, t.rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.pad", ops, 2, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_reverse(tpu_hlo *m, tpu_hv x, const int64_t *dims, int ndims) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (ndims == 0) return x;
  bool seen[TPU_MAX_RANK] = {0};
  for (int i = 0; i < ndims; i++) {
    if (ndims > TY(x).rank || dims[i] < 0 || dims[i] >= TY(x).rank || seen[dims[i]]) {
      tpu_hlo_fail(m, TPU_ERR_INDEX, "stablehlo.reverse: bad dimension list");
      return TPU_HV_NONE;
    }
    seen[dims[i]] = true;
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "dimensions", dims, ndims);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.reverse", &x, 1, tpu_hloi_attrs_str(&a), TY(x));
  tpu_hloi_attrs_free(&a);
  return r;
}

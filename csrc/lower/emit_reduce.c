/* emit_reduce.c: reductions (sum, mean, prod, max/min and their indices,
 * any/all, var/std, norms, count_nonzero, trace), scans, sorting and
 * selection (sort, topk, kthvalue, median, mode), searching (searchsorted,
 * bucketize), histograms and hash_tensor. Emitters index their arguments
 * from the front, so the functional and .out overloads (whose out= tensors
 * trail) share them. Scans are reduce_window over the whole prefix (XLA
 * turns them into efficient loops); sorts are stablehlo.sort with a
 * comparator that orders NaN as torch does (largest), stable so that ties
 * keep their order. */
#include <math.h>
#include <string.h>

#include "emit.h"

/* ---- helpers --------------------------------------------------------------------------- */

static tpu_dtype tpu_sum_dtype(tpu_lower *L, int dt_arg) {
  if (tpu_arg_is(L, dt_arg, TPU_ARG_DTYPE)) return L->args[dt_arg].dtype;
  tpu_dtype dt = L->args[0].t.dtype;
  return (dt == TPU_PRED || tpu_dtype_is_int(dt)) ? TPU_S64 : dt;
}

/* The elements over dims of t: the count a reduction over them combines. */
static int64_t tpu_numel_over(const tpu_hlo_type *t, const int64_t *dims, int n) {
  int64_t c = 1;
  for (int i = 0; i < n; i++) c *= t->dims[dims[i]];
  return c;
}

/* The accumulator of torch's CPU scans (at::acc_type<T, false>): double for
 * float, float for half types; scans round only their outputs. */
static tpu_dtype tpu_scan_acc(tpu_dtype dt) {
  if (dt == TPU_F32) return TPU_F64;
  if (dt == TPU_C64) return TPU_C128;
  return tpu_acc_type(dt);
}

/* A region (a, b) -> op(a, b) on scalars of dt. */
static int tpu_binop_region(tpu_lower *L, tpu_dtype dt, tpu_hlo_op op) {
  tpu_hlo_type st[2] = {tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(dt, 0, NULL)};
  tpu_hv a[2];
  tpu_hlo_region_begin(H, st, 2, a);
  tpu_hv r = tpu_hlo_binary(H, op, a[0], a[1]);
  return tpu_hlo_region_end(H, &r, 1);
}

/* A scan along dim that combines nothing (a single element). */
static bool tpu_scan_trivial(tpu_lower *L, tpu_hv x, int64_t dim) {
  const tpu_hlo_type *t = T(L, x);
  return t->rank == 0 || t->dims[dim] <= 1;
}

/* Inclusive prefix scan of xs[0..n) along dim with a region over 2n scalars
 * (callers skip trivial scans: a region must be used once built). */
static void tpu_scan(tpu_lower *L, const tpu_hv *xs, const tpu_hv *inits, int n, int64_t dim, int region,
                     tpu_hv *outs) {
  const tpu_hlo_type *t = T(L, xs[0]);
  int64_t win[TPU_MAX_RANK], pad[2 * TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) {
    win[i] = i == dim ? t->dims[i] : 1;
    pad[2 * i] = i == dim ? t->dims[i] - 1 : 0;
    pad[2 * i + 1] = 0;
  }
  tpu_hlo_reduce_window(H, xs, inits, n, win, NULL, NULL, NULL, pad, region, outs);
}

/* Dims to reduce from an optional int list argument (None or [] = all). */
int tpu_red_dims(tpu_lower *L, int arg, int rank, int64_t *dims, bool *mask) {
  memset(mask, 0, sizeof(bool) * TPU_MAX_RANK);
  int n = 0;
  bool all = arg >= L->nargs || L->args[arg].kind == TPU_ARG_NONE ||
             (L->args[arg].kind == TPU_ARG_INTS && L->args[arg].nints == 0);
  if (all) {
    for (int i = 0; i < rank; i++) dims[n++] = i;
  } else if (L->args[arg].kind == TPU_ARG_INT) {
    dims[n++] = tpu_lower_dim(L, L->args[arg].i, rank);
  } else {
    for (int i = 0; i < L->args[arg].nints; i++) {
      int64_t d = tpu_lower_dim(L, L->args[arg].ints[i], rank);
      if (rank == 0) continue;
      if (mask[d]) {
        tpu_lower_fail(L, TPU_ERR_VALUE, "dim %lld appears multiple times in the list of dims", (long long)d);
        return 0;
      }
      dims[n++] = d;
    }
  }
  for (int i = 0; i < n; i++) mask[dims[i]] = true;
  return rank == 0 ? 0 : n;
}

tpu_hv tpu_keepdim(tpu_lower *L, tpu_hv r, const tpu_hlo_type *in, const bool *mask, bool keep) {
  if (!keep) return r;
  int64_t dims[TPU_MAX_RANK];
  for (int i = 0; i < in->rank; i++) dims[i] = mask[i] ? 1 : in->dims[i];
  return tpu_hlo_reshape(H, r, in->rank, dims);
}

tpu_hv tpu_reduce_sum(tpu_lower *L, tpu_hv x, const int64_t *dims, int n) {
  tpu_dtype dt = T(L, x)->dtype;
  tpu_hlo_op op = dt == TPU_PRED ? TPU_HLO_OR : TPU_HLO_ADD;
  return tpu_hlo_reduce(H, x, tpu_lower_full(L, tpu_hlo_type_make(dt, 0, NULL), 0), dims, n, op);
}

tpu_hv tpu_init_value(tpu_lower *L, tpu_dtype dt, bool is_max) {
  tpu_hlo_type s = tpu_hlo_type_make(dt, 0, NULL);
  if (dt == TPU_S64) return tpu_hlo_constant_int(H, dt, is_max ? INT64_MIN : INT64_MAX);
  if (dt == TPU_U64) return tpu_hlo_constant_int(H, dt, is_max ? 0 : -1);
  return tpu_lower_full(L, s, is_max ? tpu_dtype_lowest(dt) : tpu_dtype_highest(dt));
}

/* max/min with NaN propagation for floats (torch propagates NaN). */
tpu_hv tpu_reduce_extreme(tpu_lower *L, tpu_hv x, const int64_t *dims, int n, bool is_max) {
  tpu_dtype dt = T(L, x)->dtype;
  tpu_hlo_op op = dt == TPU_PRED ? (is_max ? TPU_HLO_OR : TPU_HLO_AND) : (is_max ? TPU_HLO_MAX : TPU_HLO_MIN);
  tpu_hv r = tpu_hlo_reduce(H, x, tpu_init_value(L, dt, is_max), dims, n, op);
  if (!tpu_dtype_is_float(dt)) return r;
  /* XLA's max/min may drop NaNs; torch propagates them */
  tpu_hv nan = tpu_hlo_reduce(H, tpu_hlo_compare(H, TPU_HLO_NE, x, x), tpu_hlo_constant_int(H, TPU_PRED, 0), dims, n,
                              TPU_HLO_OR);
  return tpu_hlo_select(H, nan, tpu_k(L, r, NAN), r);
}

/* ---- max, min and their indices, any, all --------------------------------------------------- */

static void tpu_emit_amaxmin(tpu_lower *L, bool is_max) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, 1, t->rank, dims, mask);
  bool all =
      L->nargs < 2 || L->args[1].kind == TPU_ARG_NONE || (L->args[1].kind == TPU_ARG_INTS && L->args[1].nints == 0);
  int64_t numel = tpu_numel(t->rank, t->sizes);
  if (all && numel == 0)
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "%s(): Expected reduction dim to be specified for input.numel() == 0. "
                   "Specify the reduction dim with the 'dim' argument.",
                   is_max ? "amax" : "amin");
  for (int i = 0; i < n; i++)
    if (t->sizes[dims[i]] == 0)
      tpu_lower_fail(L, TPU_ERR_INDEX, "%s(): Expected reduction dim %lld to have non-zero size.",
                     is_max ? "amax" : "amin", (long long)dims[i]);
  tpu_hlo_type in = *T(L, x);
  tpu_lower_out(L, tpu_keepdim(L, tpu_reduce_extreme(L, x, dims, n, is_max), &in, mask, tpu_arg_bool(L, 2)));
}
void tpu_emit_amax(tpu_lower *L) { tpu_emit_amaxmin(L, true); }
void tpu_emit_amin(tpu_lower *L) { tpu_emit_amaxmin(L, false); }

/* max() / min(): full reduction */
static void tpu_emit_maxmin_all(tpu_lower *L, bool is_max) {
  tpu_tref *t = &L->args[0].t;
  int64_t numel = 1, dims[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) {
    numel *= t->sizes[i];
    dims[i] = i;
  }
  if (numel == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "%s(): Expected reduction dim to be specified for input.numel() == 0. "
                   "Specify the reduction dim with the 'dim' argument.",
                   is_max ? "max" : "min");
    return;
  }
  tpu_lower_out(L, tpu_reduce_extreme(L, tpu_lower_tensor(L, 0, -1), dims, t->rank, is_max));
}
void tpu_emit_max_all(tpu_lower *L) { tpu_emit_maxmin_all(L, true); }
void tpu_emit_min_all(tpu_lower *L) { tpu_emit_maxmin_all(L, false); }

/* (values, indices) along one dim: a variadic reduce keeping the first
 * index of the extreme; NaN counts as the extreme (torch's rule). */
void tpu_arg_extreme(tpu_lower *L, tpu_hv x, int64_t dim, bool is_max, tpu_hv *vals, tpu_hv *idx) {
  const tpu_hlo_type xt = *T(L, x);
  tpu_dtype dt = xt.dtype;
  tpu_hv iota = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, xt.rank, xt.dims), (int)dim);
  tpu_hlo_type st[4] = {tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL),
                        tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL)};
  tpu_hlo_type rs[4] = {st[0], st[1], st[0], st[1]};
  tpu_hv a[4];
  tpu_hlo_region_begin(H, rs, 4, a); /* acc value, acc index, elem value, elem index */
  tpu_hv better = tpu_hlo_compare(H, is_max ? TPU_HLO_GT : TPU_HLO_LT, a[2], a[0]);
  tpu_hv eq = tpu_hlo_compare(H, TPU_HLO_EQ, a[2], a[0]);
  if (tpu_dtype_is_float(dt)) {
    tpu_hv enan = tpu_hlo_compare(H, TPU_HLO_NE, a[2], a[2]);
    tpu_hv anan = tpu_hlo_compare(H, TPU_HLO_NE, a[0], a[0]);
    better = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_binary(H, TPU_HLO_AND, enan, tpu_hlo_unary(H, TPU_HLO_NOT, anan)),
                            tpu_hlo_binary(H, TPU_HLO_AND, better, tpu_hlo_unary(H, TPU_HLO_NOT, anan)));
    eq = tpu_hlo_binary(H, TPU_HLO_OR, eq, tpu_hlo_binary(H, TPU_HLO_AND, enan, anan));
  }
  tpu_hv lower_idx = tpu_hlo_compare(H, TPU_HLO_LT, a[3], a[1]);
  tpu_hv take = tpu_hlo_binary(H, TPU_HLO_OR, better, tpu_hlo_binary(H, TPU_HLO_AND, eq, lower_idx));
  tpu_hv rv[2] = {tpu_hlo_select(H, take, a[2], a[0]), tpu_hlo_select(H, take, a[3], a[1])};
  int region = tpu_hlo_region_end(H, rv, 2);
  tpu_hv xs[2] = {x, iota};
  tpu_hv inits[2] = {tpu_init_value(L, dt, is_max), tpu_hlo_constant_int(H, TPU_S64, 0)};
  tpu_hv outs[2] = {TPU_HV_NONE, TPU_HV_NONE};
  tpu_hlo_reduce_region(H, xs, inits, 2, &dim, 1, region, outs);
  *vals = outs[0];
  *idx = outs[1];
}

/* max.dim / min.dim (self, dim, keepdim) -> (values, indices) */
static void tpu_emit_maxmin_dim(tpu_lower *L, bool is_max) {
  tpu_tref *t = &L->args[0].t;
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (t->rank == 0) x = tpu_hlo_reshape(H, x, 1, (int64_t[]){1});
  tpu_hlo_type in = *T(L, x);
  if (in.dims[d] == 0)
    tpu_lower_fail(L, TPU_ERR_INDEX, "%s(): Expected reduction dim %lld to have non-zero size.", is_max ? "max" : "min",
                   (long long)d);
  tpu_hv v, i;
  tpu_arg_extreme(L, x, d, is_max, &v, &i);
  bool mask[TPU_MAX_RANK] = {0};
  mask[d] = true;
  bool keep = tpu_arg_bool(L, 2);
  if (t->rank == 0) {
    v = tpu_hlo_reshape(H, v, 0, NULL);
    i = tpu_hlo_reshape(H, i, 0, NULL);
    keep = false;
  }
  tpu_lower_out(L, tpu_keepdim(L, v, &in, mask, keep));
  tpu_lower_out(L, tpu_keepdim(L, i, &in, mask, keep));
}
void tpu_emit_max_dim(tpu_lower *L) { tpu_emit_maxmin_dim(L, true); }
void tpu_emit_min_dim(tpu_lower *L) { tpu_emit_maxmin_dim(L, false); }

/* argmax/argmin(self, dim=None, keepdim=False) */
static void tpu_emit_argext(tpu_lower *L, bool is_max) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  bool keep = tpu_arg_bool(L, 2);
  if (t->dtype == TPU_PRED) {
    tpu_lower_fail(L, tpu_lower_check_code(TPU_COMPAT_ARG_BOOL), "%s(): does not support bool input",
                   is_max ? "argmax" : "argmin");
    return;
  }
  if (tpu_lower_is_none(L, 1)) {
    int64_t n = tpu_numel(t->rank, t->sizes);
    if (n == 0)
      tpu_lower_fail(L, TPU_ERR_INDEX, "%s(): Expected reduction dim to be specified for input.numel() == 0.",
                     is_max ? "argmax" : "argmin");
    x = tpu_hlo_reshape(H, x, 1, &n);
    tpu_hv v, i;
    tpu_arg_extreme(L, x, 0, is_max, &v, &i);
    if (keep) {
      int64_t ones[TPU_MAX_RANK];
      for (int k = 0; k < t->rank; k++) ones[k] = 1;
      i = tpu_hlo_reshape(H, i, t->rank, ones);
    }
    tpu_lower_out(L, i);
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  if (t->rank == 0) {
    tpu_lower_out(L, tpu_hlo_constant_int(H, TPU_S64, 0));
    return;
  }
  tpu_hlo_type in = *T(L, x);
  if (in.dims[d] == 0) {
    tpu_lower_fail(L, TPU_ERR_INDEX, "%s(): Expected reduction dim %lld to have non-zero size.",
                   is_max ? "argmax" : "argmin", (long long)d);
    return;
  }
  tpu_hv v, i;
  tpu_arg_extreme(L, x, d, is_max, &v, &i);
  bool mask[TPU_MAX_RANK] = {0};
  mask[d] = true;
  tpu_lower_out(L, tpu_keepdim(L, i, &in, mask, keep));
}
void tpu_emit_argmax(tpu_lower *L) { tpu_emit_argext(L, true); }
void tpu_emit_argmin(tpu_lower *L) { tpu_emit_argext(L, false); }

/* any/all (self) and (.dim self, dim, keepdim) */
static void tpu_emit_anyall(tpu_lower *L, bool any) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_input(L, 0, TPU_PRED);
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, L->nargs > 1 ? 1 : L->nargs, t->rank, dims, mask);
  tpu_hlo_type in = *T(L, x);
  tpu_hv r =
      tpu_hlo_reduce(H, x, tpu_hlo_constant_int(H, TPU_PRED, any ? 0 : 1), dims, n, any ? TPU_HLO_OR : TPU_HLO_AND);
  r = tpu_keepdim(L, r, &in, mask, tpu_arg_bool(L, 2));
  tpu_lower_out(L, t->dtype == TPU_U8 ? tpu_hlo_convert(H, r, TPU_U8) : r);
}
void tpu_emit_any(tpu_lower *L) { tpu_emit_anyall(L, true); }
void tpu_emit_all(tpu_lower *L) { tpu_emit_anyall(L, false); }

/* ---- sums, products, means --------------------------------------------------------------------- */

static tpu_hv tpu_reduce_prod(tpu_lower *L, tpu_hv x, const int64_t *dims, int n) {
  tpu_dtype dt = T(L, x)->dtype;
  tpu_hlo_op op = dt == TPU_PRED ? TPU_HLO_AND : TPU_HLO_MUL;
  return tpu_hlo_reduce(H, x, tpu_lower_full(L, tpu_hlo_type_make(dt, 0, NULL), 1), dims, n, op);
}

typedef enum { TPU_RED_SUM, TPU_RED_NANSUM, TPU_RED_MEAN, TPU_RED_PROD } tpu_red_kind;

/* The sum family over (self, dim, keepdim, *, dtype) with the argument
 * positions given (dim_i < 0: all dims, keep_i < 0: not kept). Ints and
 * bool sum and multiply in int64; half types accumulate in f32. */
static void tpu_emit_red(tpu_lower *L, tpu_red_kind kind, int dim_i, int keep_i, int dt_i) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt;
  if (kind == TPU_RED_MEAN) {
    dt = tpu_arg_is(L, dt_i, TPU_ARG_DTYPE) ? L->args[dt_i].dtype : t->dtype;
    if (!tpu_dtype_is_float(dt) && !tpu_dtype_is_complex(dt)) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "mean(): could not infer output dtype. Input dtype must be either a floating "
                     "point or complex dtype. Got: %s",
                     tpu_dtype_name(dt));
      return;
    }
  } else {
    dt = tpu_sum_dtype(L, dt_i);
  }
  tpu_dtype acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc);
  if (kind == TPU_RED_NANSUM && tpu_dtype_is_float(acc))
    x = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, x, x), tpu_k(L, x, 0), x);
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, dim_i < 0 ? L->nargs : dim_i, t->rank, dims, mask);
  tpu_hlo_type in = *T(L, x);
  tpu_hv r = kind == TPU_RED_PROD ? tpu_reduce_prod(L, x, dims, n) : tpu_reduce_sum(L, x, dims, n);
  if (kind == TPU_RED_MEAN) r = tpu_hlo_binary(H, TPU_HLO_DIV, r, tpu_k(L, r, (double)tpu_numel_over(&in, dims, n)));
  bool keep = keep_i >= 0 && tpu_arg_bool(L, keep_i);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_keepdim(L, r, &in, mask, keep), dt));
}

/* sum.IntList_out / nansum / mean.out / prod.int_out (self, dim, keepdim, *, dtype) */
void tpu_emit_sum_dims(tpu_lower *L) { tpu_emit_red(L, TPU_RED_SUM, 1, 2, 3); }
void tpu_emit_nansum(tpu_lower *L) { tpu_emit_red(L, TPU_RED_NANSUM, 1, 2, 3); }
void tpu_emit_mean_dims(tpu_lower *L) { tpu_emit_red(L, TPU_RED_MEAN, 1, 2, 3); }
void tpu_emit_prod_dim(tpu_lower *L) { tpu_emit_red(L, TPU_RED_PROD, 1, 2, 3); }
/* sum / mean / prod (self, *, dtype) */
void tpu_emit_sum_all(tpu_lower *L) { tpu_emit_red(L, TPU_RED_SUM, -1, -1, 1); }
void tpu_emit_mean_all(tpu_lower *L) { tpu_emit_red(L, TPU_RED_MEAN, -1, -1, 1); }
void tpu_emit_prod_all(tpu_lower *L) { tpu_emit_red(L, TPU_RED_PROD, -1, -1, 1); }

/* ---- variance and standard deviation ------------------------------------------------------------ */

/* var/std/var_mean/std_mean.correction(self, dim=None, *, correction=None, keepdim=False) */
static void tpu_emit_moments(tpu_lower *L, bool sqrt_it, bool with_mean) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = t->dtype;
  if (!tpu_dtype_is_float(dt) && !tpu_dtype_is_complex(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "std and var only support floating point and complex dtypes");
    return;
  }
  tpu_dtype acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc);
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, 1, t->rank, dims, mask);
  tpu_hlo_type in = *T(L, x);
  bool keep = tpu_arg_bool(L, 3);
  double count = (double)tpu_numel_over(&in, dims, n);
  tpu_hv sum = tpu_reduce_sum(L, x, dims, n);
  tpu_hv mean = tpu_hlo_binary(H, TPU_HLO_DIV, sum, tpu_k(L, sum, count));
  tpu_hv meank = tpu_keepdim(L, mean, &in, mask, true);
  tpu_hv d = tpu_sub(L, x, tpu_lower_broadcast_to(L, meank, in.rank, in.dims));
  tpu_hv ss = tpu_reduce_sum(L, tpu_mul(L, d, d), dims, n);
  tpu_hv c = tpu_lower_is_none(L, 2) ? tpu_k(L, ss, 1.0) : tpu_lower_scalar(L, 2, acc);
  if (!tpu_lower_is_none(L, 2)) c = tpu_lower_broadcast_to(L, c, T(L, ss)->rank, T(L, ss)->dims);
  tpu_hv div = tpu_hlo_binary(H, TPU_HLO_MAX, tpu_sub(L, tpu_k(L, ss, count), c), tpu_k(L, ss, 0));
  tpu_hv v = tpu_hlo_binary(H, TPU_HLO_DIV, ss, div);
  if (sqrt_it) v = tpu_hlo_unary(H, TPU_HLO_SQRT, v);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_keepdim(L, v, &in, mask, keep), dt));
  if (with_mean) tpu_lower_out(L, tpu_hlo_convert(H, tpu_keepdim(L, mean, &in, mask, keep), dt));
}
void tpu_emit_var(tpu_lower *L) { tpu_emit_moments(L, false, false); }
void tpu_emit_std(tpu_lower *L) { tpu_emit_moments(L, true, false); }
void tpu_emit_var_mean(tpu_lower *L) { tpu_emit_moments(L, false, true); }
void tpu_emit_std_mean(tpu_lower *L) { tpu_emit_moments(L, true, true); }

/* ---- norms ---------------------------------------------------------------------------------------- */

/* A number argument (a Python scalar, float or int) as a double; dflt when None. */
static double tpu_arg_number(const tpu_arg *a, double dflt) {
  if (a->kind == TPU_ARG_NONE) return dflt;
  if (a->kind == TPU_ARG_SCALAR) return a->skind == TPU_SCALAR_INT || a->skind == TPU_SCALAR_BOOL ? (double)a->i : a->f;
  if (a->kind == TPU_ARG_FLOAT) return a->f;
  if (a->kind == TPU_ARG_INT) return (double)a->i;
  return dflt;
}

/* The p-norm over dims of x, which holds absolute values in a float type. */
static tpu_hv tpu_pnorm(tpu_lower *L, tpu_hv x, double p, const int64_t *dims, int n) {
  tpu_dtype acc = T(L, x)->dtype;
  if (isinf(p)) return tpu_reduce_extreme(L, x, dims, n, p > 0);
  if (p == 0)
    return tpu_reduce_sum(L, tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_NE, x, tpu_k(L, x, 0)), acc), dims, n);
  if (p == 1) return tpu_reduce_sum(L, x, dims, n);
  if (p == 2) return tpu_hlo_unary(H, TPU_HLO_SQRT, tpu_reduce_sum(L, tpu_mul(L, x, x), dims, n));
  tpu_hv s = tpu_reduce_sum(L, tpu_hlo_binary(H, TPU_HLO_POW, x, tpu_k(L, x, p)), dims, n);
  return tpu_hlo_binary(H, TPU_HLO_POW, s, tpu_k(L, s, 1.0 / p));
}

/* linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None) and
 * norm.out / norm.dtype_out (self, p, dim, keepdim[, dtype]): the same layout.
 * The order shapes the program (rows flagged TPU_OP_SCALAR_ATTRS). */
/* |item j of tensor argument i| (j -1: not a list) in the accumulation type
 * of the norm's result dtype (argument dt_arg, else the input's, real for a
 * complex input), stored in *dt; TPU_HV_NONE after failing on an integer input. */
static tpu_hv tpu_norm_abs(tpu_lower *L, int i, int j, const tpu_tref *t, int dt_arg, tpu_dtype *dt) {
  *dt = tpu_arg_is(L, dt_arg, TPU_ARG_DTYPE) ? L->args[dt_arg].dtype : t->dtype;
  if (tpu_dtype_is_complex(*dt)) *dt = *dt == TPU_C128 ? TPU_F64 : TPU_F32;
  if (!tpu_dtype_is_float(*dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "linalg.vector_norm: Expected a floating point or complex tensor as input. "
                   "Got %s",
                   tpu_dtype_name(t->dtype));
    return TPU_HV_NONE;
  }
  tpu_hv x = tpu_lower_tensor(L, i, j);
  if (tpu_dtype_is_complex(T(L, x)->dtype)) x = tpu_hlo_unary(H, TPU_HLO_ABS, x);
  return tpu_hlo_unary(H, TPU_HLO_ABS, tpu_hlo_convert(H, x, tpu_acc_type(*dt)));
}

void tpu_emit_vector_norm(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double p = tpu_arg_number(&L->args[1], 2.0);
  tpu_dtype dt;
  tpu_hv x = tpu_norm_abs(L, 0, -1, t, 4, &dt);
  if (x == TPU_HV_NONE) return;
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, 2, t->rank, dims, mask);
  tpu_hlo_type in = *T(L, x);
  if (tpu_numel_over(&in, dims, n) == 0 && p < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "linalg.vector_norm cannot compute the %g norm on an empty tensor because the "
                   "operation does not have an identity",
                   p);
    return;
  }
  tpu_hv r = tpu_pnorm(L, x, p, dims, n);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_keepdim(L, r, &in, mask, tpu_arg_bool(L, 3)), dt));
}

/* tpu::foreach_norm(tensors, ord, dtype): torch._foreach_norm as one op, the
 * vector norm of each tensor (clip_grad_norm_ over a model's gradients). */
void tpu_emit_foreach_norm(tpu_lower *L) {
  tpu_arg *a = &L->args[0];
  double p = tpu_arg_number(&L->args[1], 2.0);
  for (int j = 0; j < a->nlist; j++) {
    tpu_tref *t = &a->list[j];
    tpu_dtype dt;
    tpu_hv x = tpu_norm_abs(L, 0, j, t, 2, &dt);
    if (x == TPU_HV_NONE) return;
    int64_t dims[TPU_MAX_RANK];
    for (int i = 0; i < t->rank; i++) dims[i] = i;
    if (tpu_numel_over(T(L, x), dims, t->rank) == 0 && (p < 0 || isinf(p))) {
      if (isinf(p) && p > 0)
        tpu_lower_fail(L, TPU_ERR_RUNTIME,
                       "_foreach_norm cannot compute the infinity norm on an empty tensor because "
                       "the operation does not have an identity");
      else
        tpu_lower_fail(L, TPU_ERR_RUNTIME,
                       "linalg.vector_norm cannot compute the %g norm on an empty tensor because "
                       "the operation does not have an identity",
                       p);
      return;
    }
    tpu_lower_out(L, tpu_hlo_convert(H, tpu_pnorm(L, x, p, dims, t->rank), dt));
  }
}

/* ---- small reductions ------------------------------------------------------------------------------ */

/* count_nonzero.dim_IntList(self, dim) */
void tpu_emit_count_nonzero(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv nz = tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_NE, x, tpu_k(L, x, 0)), TPU_S64);
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, 1, t->rank, dims, mask);
  tpu_lower_out(L, tpu_reduce_sum(L, nz, dims, n));
}

/* aminmax(self, *, dim=None, keepdim=False) -> (min, max) */
void tpu_emit_aminmax(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, 1, t->rank, dims, mask);
  if (tpu_numel_over(T(L, x), dims, n) == 0 && t->rank > 0) {
    tpu_lower_fail(L, TPU_ERR_INDEX, "aminmax(): Expected reduction dim to have non-zero size.");
    return;
  }
  tpu_hlo_type in = *T(L, x);
  bool keep = tpu_arg_bool(L, 2);
  tpu_lower_out(L, tpu_keepdim(L, tpu_reduce_extreme(L, x, dims, n, false), &in, mask, keep));
  tpu_lower_out(L, tpu_keepdim(L, tpu_reduce_extreme(L, x, dims, n, true), &in, mask, keep));
}

/* any.all_out / all.all_out (self) */
static void tpu_emit_anyall_full(tpu_lower *L, bool any) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_input(L, 0, TPU_PRED);
  int64_t dims[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) dims[i] = i;
  tpu_hv r = tpu_hlo_reduce(H, x, tpu_hlo_constant_int(H, TPU_PRED, any ? 0 : 1), dims, t->rank,
                            any ? TPU_HLO_OR : TPU_HLO_AND);
  tpu_lower_out(L, t->dtype == TPU_U8 ? tpu_hlo_convert(H, r, TPU_U8) : r);
}
void tpu_emit_any_full(tpu_lower *L) { tpu_emit_anyall_full(L, true); }
void tpu_emit_all_full(tpu_lower *L) { tpu_emit_anyall_full(L, false); }

/* trace(self): sum of the main diagonal of a matrix */
void tpu_emit_trace(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (t->rank != 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "trace: expected a matrix, but got tensor with dim %d", t->rank);
    return;
  }
  tpu_dtype dt = tpu_sum_dtype(L, 99);
  tpu_hv x = tpu_lower_input(L, 0, dt);
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, 2, t->sizes);
  tpu_hv diag = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, it, 0), tpu_hlo_iota(H, it, 1));
  x = tpu_hlo_select(H, diag, x, tpu_k(L, x, 0));
  int64_t dims[2] = {0, 1};
  tpu_lower_out(L, tpu_reduce_sum(L, x, dims, 2));
}

/* ---- scans ----------------------------------------------------------------------------------------- */

/* cumsum.out / cumprod.out (self, dim, *, dtype) */
static void tpu_emit_cum(tpu_lower *L, tpu_hlo_op op) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = tpu_sum_dtype(L, 2), acc = tpu_scan_acc(dt);
  tpu_hv x = tpu_hlo_convert(H, tpu_lower_input(L, 0, dt), acc);
  if (t->rank == 0) {
    tpu_lower_out(L, tpu_hlo_convert(H, x, dt));
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  if (acc == TPU_PRED) op = op == TPU_HLO_ADD ? TPU_HLO_OR : TPU_HLO_AND;
  tpu_hv init = tpu_lower_full(L, tpu_hlo_type_make(acc, 0, NULL), op == TPU_HLO_MUL || op == TPU_HLO_AND ? 1 : 0);
  tpu_hv out = x;
  if (!tpu_scan_trivial(L, x, d)) tpu_scan(L, &x, &init, 1, d, tpu_binop_region(L, acc, op), &out);
  tpu_lower_out(L, tpu_hlo_convert(H, out, dt));
}
void tpu_emit_cumsum(tpu_lower *L) { tpu_emit_cum(L, TPU_HLO_ADD); }
void tpu_emit_cumprod(tpu_lower *L) { tpu_emit_cum(L, TPU_HLO_MUL); }

/* _logcumsumexp(self, dim) */
void tpu_emit_logcumsumexp(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = t->dtype, acc = tpu_scan_acc(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc);
  if (t->rank == 0) {
    tpu_lower_out(L, tpu_hlo_convert(H, x, dt));
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  if (tpu_scan_trivial(L, x, d)) {
    tpu_lower_out(L, tpu_hlo_convert(H, x, dt));
    return;
  }
  tpu_hlo_type st[2] = {tpu_hlo_type_make(acc, 0, NULL), tpu_hlo_type_make(acc, 0, NULL)};
  tpu_hv a[2];
  tpu_hlo_region_begin(H, st, 2, a);
  tpu_hv m = tpu_hlo_binary(H, TPU_HLO_MAX, a[0], a[1]);
  tpu_hv mn = tpu_hlo_binary(H, TPU_HLO_MIN, a[0], a[1]);
  tpu_hv r = tpu_add(L, m, tpu_hlo_unary(H, TPU_HLO_LOG1P, tpu_hlo_unary(H, TPU_HLO_EXP, tpu_sub(L, mn, m))));
  /* equal infinities (and -inf, -inf) combine to themselves */
  tpu_hv same = tpu_hlo_binary(
      H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_EQ, a[0], a[1]),
      tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_unary(H, TPU_HLO_ABS, a[0]), tpu_hlo_constant(H, acc, INFINITY)));
  r = tpu_hlo_select(H, same, a[0], r);
  /* a nan stays (max and min need not keep it: XLA's CPU compiler's drop it) */
  tpu_hv nan = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_compare(H, TPU_HLO_NE, a[0], a[0]),
                              tpu_hlo_compare(H, TPU_HLO_NE, a[1], a[1]));
  r = tpu_hlo_select(H, nan, tpu_add(L, a[0], a[1]), r);
  int region = tpu_hlo_region_end(H, &r, 1);
  tpu_hv init = tpu_hlo_constant(H, acc, -INFINITY), out;
  tpu_scan(L, &x, &init, 1, d, region, &out);
  tpu_lower_out(L, tpu_hlo_convert(H, out, dt));
}

/* _cummax_helper / _cummin_helper(self, values, indices, dim): writes the
 * running extreme and its (last) index into values and indices. The
 * combiner is order-independent: NaN beats numbers, the better value wins,
 * ties go to the later index. */
static void tpu_emit_cumext(tpu_lower *L, bool is_max) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (t->rank == 0) {
    tpu_lower_write(L, 1, -1, x);
    tpu_lower_write(L, 2, -1, tpu_hlo_constant_int(H, TPU_S64, 0));
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[3].i, t->rank);
  tpu_dtype dt = T(L, x)->dtype;
  tpu_dtype cdt = dt == TPU_PRED ? TPU_U8 : dt;
  x = tpu_hlo_convert(H, x, cdt);
  tpu_hlo_type xt = *T(L, x);
  tpu_hv iota = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, xt.rank, xt.dims), (int)d);
  if (tpu_scan_trivial(L, x, d)) {
    tpu_lower_write(L, 1, -1, tpu_hlo_convert(H, x, dt));
    tpu_lower_write(L, 2, -1, iota);
    return;
  }
  tpu_hlo_type st[4] = {tpu_hlo_type_make(cdt, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL),
                        tpu_hlo_type_make(cdt, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL)};
  tpu_hv a[4]; /* (acc value, acc index, elem value, elem index) */
  tpu_hlo_region_begin(H, st, 4, a);
  tpu_hv v0 = a[0], i0 = a[1], v1 = a[2], i1 = a[3];
  tpu_hv later = tpu_hlo_compare(H, TPU_HLO_GT, i1, i0);
  tpu_hv better = tpu_hlo_compare(H, is_max ? TPU_HLO_GT : TPU_HLO_LT, v1, v0);
  tpu_hv eq = tpu_hlo_compare(H, TPU_HLO_EQ, v1, v0);
  tpu_hv take;
  if (tpu_dtype_is_float(cdt)) {
    tpu_hv n0 = tpu_hlo_compare(H, TPU_HLO_NE, v0, v0), n1 = tpu_hlo_compare(H, TPU_HLO_NE, v1, v1);
    tpu_hv both_nan = tpu_hlo_binary(H, TPU_HLO_AND, n0, n1);
    tpu_hv one_nan = tpu_hlo_binary(H, TPU_HLO_XOR, n0, n1);
    tpu_hv by_value = tpu_hlo_binary(H, TPU_HLO_OR, better, tpu_hlo_binary(H, TPU_HLO_AND, eq, later));
    tpu_hv by_nan = n1;
    take = tpu_hlo_select(H, one_nan, by_nan, tpu_hlo_select(H, both_nan, later, by_value));
  } else {
    take = tpu_hlo_binary(H, TPU_HLO_OR, better, tpu_hlo_binary(H, TPU_HLO_AND, eq, later));
  }
  tpu_hv rv[2] = {tpu_hlo_select(H, take, v1, v0), tpu_hlo_select(H, take, i1, i0)};
  int region = tpu_hlo_region_end(H, rv, 2);
  tpu_hv xs[2] = {x, iota};
  tpu_hv inits[2] = {tpu_init_value(L, cdt, is_max), tpu_hlo_constant_int(H, TPU_S64, -1)};
  tpu_hv outs[2] = {TPU_HV_NONE, TPU_HV_NONE};
  tpu_scan(L, xs, inits, 2, d, region, outs);
  tpu_lower_write(L, 1, -1, tpu_hlo_convert(H, outs[0], dt));
  tpu_lower_write(L, 2, -1, outs[1]);
}
void tpu_emit_cummax_helper(tpu_lower *L) { tpu_emit_cumext(L, true); }
void tpu_emit_cummin_helper(tpu_lower *L) { tpu_emit_cumext(L, false); }

/* ---- sorting --------------------------------------------------------------------------------------- */

/* Sort x along dim, returning values and int64 indices (stable; NaN largest). */
static void tpu_sort_with_indices(tpu_lower *L, tpu_hv x, int64_t dim, bool descending, tpu_hv *vals, tpu_hv *idx) {
  tpu_dtype dt = T(L, x)->dtype;
  tpu_dtype cdt = dt == TPU_PRED ? TPU_U8 : dt;
  tpu_hlo_type xt = *T(L, x);
  if (xt.rank == 0) {
    *vals = x;
    *idx = tpu_hlo_constant_int(H, TPU_S64, 0);
    return;
  }
  tpu_hv iota = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, xt.rank, xt.dims), (int)dim);
  if (xt.dims[dim] <= 1) {
    *vals = x;
    *idx = iota;
    return;
  }
  x = tpu_hlo_convert(H, x, cdt);
  tpu_hlo_type st[4] = {tpu_hlo_type_make(cdt, 0, NULL), tpu_hlo_type_make(cdt, 0, NULL),
                        tpu_hlo_type_make(TPU_S64, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL)};
  tpu_hv a[4];
  tpu_hlo_region_begin(H, st, 4, a);
  tpu_hv lt;
  if (descending)
    lt = tpu_hlo_compare(H, TPU_HLO_GT, a[0], a[1]);
  else
    lt = tpu_hlo_compare(H, TPU_HLO_LT, a[0], a[1]);
  if (tpu_dtype_is_float(cdt)) {
    tpu_hv na = tpu_hlo_compare(H, TPU_HLO_NE, a[0], a[0]), nb = tpu_hlo_compare(H, TPU_HLO_NE, a[1], a[1]);
    tpu_hv nan_first = descending ? tpu_hlo_binary(H, TPU_HLO_AND, na, tpu_hlo_unary(H, TPU_HLO_NOT, nb))
                                  : tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_unary(H, TPU_HLO_NOT, na), nb);
    lt = tpu_hlo_binary(H, TPU_HLO_OR, lt, nan_first);
  }
  int region = tpu_hlo_region_end(H, &lt, 1);
  tpu_hv xs[2] = {x, iota};
  tpu_hv outs[2] = {TPU_HV_NONE, TPU_HV_NONE};
  tpu_hlo_sort(H, xs, 2, (int)dim, true, region, outs);
  *vals = tpu_hlo_convert(H, outs[0], dt);
  *idx = outs[1];
}

/* sort.values_stable(self, *, stable, dim=-1, descending=False) -> (values, indices) */
void tpu_emit_sort(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int64_t d = t->rank ? tpu_lower_dim(L, L->args[2].i, t->rank) : 0;
  tpu_hv v, i;
  tpu_sort_with_indices(L, x, d, tpu_arg_bool(L, 3), &v, &i);
  tpu_lower_out(L, v);
  tpu_lower_out(L, i);
}

/* Slice [start, start + len) of x along dim. */
static tpu_hv tpu_slice_dim(tpu_lower *L, tpu_hv x, int64_t dim, int64_t start, int64_t len) {
  const tpu_hlo_type *t = T(L, x);
  int64_t s[TPU_MAX_RANK] = {0}, l[TPU_MAX_RANK], st[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) {
    l[i] = t->dims[i];
    st[i] = 1;
  }
  s[dim] = start;
  l[dim] = start + len;
  return tpu_hlo_slice(H, x, s, l, st);
}

/* topk.values(self, k, dim=-1, largest=True, sorted=True) -> (values, indices) */
void tpu_emit_topk(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t k = L->args[1].i;
  int64_t d = t->rank ? tpu_lower_dim(L, L->args[2].i, t->rank) : 0;
  int64_t n = t->rank ? t->sizes[d] : 1;
  if (k < 0 || k > n) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "selected index k out of range");
    return;
  }
  tpu_hv x = tpu_lower_tensor(L, 0, -1), v, i;
  if (t->rank == 0) {
    tpu_lower_out(L, x);
    tpu_lower_out(L, tpu_hlo_constant_int(H, TPU_S64, 0));
    return;
  }
  tpu_sort_with_indices(L, x, d, L->args[3].kind != TPU_ARG_BOOL || L->args[3].i, &v, &i);
  tpu_lower_out(L, tpu_slice_dim(L, v, d, 0, k));
  tpu_lower_out(L, tpu_slice_dim(L, i, d, 0, k));
}

/* Pick, along dim of sorted values/indices, the position pos (s64, the
 * reduced shape); keepdim as asked. */
static void tpu_pick_sorted(tpu_lower *L, tpu_hv v, tpu_hv i, int64_t dim, tpu_hv pos, bool keep, tpu_hv *ov,
                            tpu_hv *oi) {
  tpu_hlo_type vt = *T(L, v);
  tpu_hv iota = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, vt.rank, vt.dims), (int)dim);
  int64_t bd[TPU_MAX_RANK];
  int nb = 0;
  for (int k = 0; k < vt.rank; k++)
    if (k != dim) bd[nb++] = k;
  tpu_hv posb = tpu_hlo_broadcast_in_dim(H, pos, vt.rank, vt.dims, bd);
  tpu_hv hit = tpu_hlo_compare(H, TPU_HLO_EQ, iota, posb);
  tpu_dtype dt = vt.dtype;
  tpu_hv vz = tpu_hlo_select(H, hit, tpu_hlo_convert(H, v, dt == TPU_PRED ? TPU_U8 : dt),
                             tpu_k(L, tpu_hlo_convert(H, v, dt == TPU_PRED ? TPU_U8 : dt), 0));
  tpu_hv iz = tpu_hlo_select(H, hit, i, tpu_k(L, i, 0));
  bool mask[TPU_MAX_RANK] = {0};
  mask[dim] = true;
  *ov = tpu_keepdim(L, tpu_hlo_convert(H, tpu_reduce_sum(L, vz, &dim, 1), dt), &vt, mask, keep);
  *oi = tpu_keepdim(L, tpu_reduce_sum(L, iz, &dim, 1), &vt, mask, keep);
}

/* kthvalue.values(self, k, dim=-1, keepdim=False) -> (values, indices) */
void tpu_emit_kthvalue(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t k = L->args[1].i;
  int64_t d = t->rank ? tpu_lower_dim(L, L->args[2].i, t->rank) : 0;
  int64_t n = t->rank ? t->sizes[d] : 1;
  if (k < 1 || k > n) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "kthvalue(): selected number k out of range for dimension %lld", (long long)d);
    return;
  }
  tpu_hv x = tpu_lower_tensor(L, 0, -1), v, i;
  if (t->rank == 0) {
    tpu_lower_out(L, x);
    tpu_lower_out(L, tpu_hlo_constant_int(H, TPU_S64, 0));
    return;
  }
  tpu_sort_with_indices(L, x, d, false, &v, &i);
  tpu_hlo_type vt = *T(L, v);
  tpu_hlo_type pt = vt;
  pt.rank = 0;
  for (int q = 0; q < vt.rank; q++)
    if (q != d) pt.dims[pt.rank++] = vt.dims[q];
  pt.dtype = TPU_S64;
  tpu_hv ov, oi;
  tpu_pick_sorted(L, v, i, d, tpu_lower_full(L, pt, (double)(k - 1)), tpu_arg_bool(L, 3), &ov, &oi);
  tpu_lower_out(L, ov);
  tpu_lower_out(L, oi);
}

/* median / nanmedian along dim (or of all elements when all is set):
 * the lower median; median gives NaN (and the first NaN's index) when a
 * NaN is present, nanmedian ignores NaNs. */
static void tpu_median_impl(tpu_lower *L, bool all, bool ignore_nan) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int64_t d = 0;
  if (all || t->rank == 0) {
    int64_t n = 1;
    for (int k = 0; k < t->rank; k++) n *= t->sizes[k];
    if (n == 0 && all) {
      tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(t->dtype, 0, NULL), NAN));
      return;
    }
    x = tpu_hlo_reshape(H, x, 1, &n);
  } else {
    d = tpu_lower_dim(L, L->args[1].i, t->rank);
    if (t->sizes[d] == 0) {
      tpu_lower_fail(L, TPU_ERR_INDEX,
                     "median() cannot compute median for a dimension of size 0 because the "
                     "operation does not have an identity");
      return;
    }
  }
  tpu_hlo_type xt = *T(L, x);
  int64_t n = xt.dims[d];
  tpu_hv v, i;
  tpu_sort_with_indices(L, x, d, false, &v, &i);
  tpu_hv pos;
  tpu_hlo_type rt = xt;
  rt.rank = 0;
  for (int k = 0; k < xt.rank; k++)
    if (k != d) rt.dims[rt.rank++] = xt.dims[k];
  tpu_hlo_type pt = tpu_hlo_type_make(TPU_S64, rt.rank, rt.dims);
  if (tpu_dtype_is_float(xt.dtype)) {
    tpu_hv nn = tpu_reduce_sum(L, tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_EQ, x, x), TPU_S64), &d, 1);
    if (ignore_nan) {
      tpu_hv m = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_sub(L, nn, tpu_lower_full(L, pt, 1)), tpu_lower_full(L, pt, 2));
      pos =
          tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, nn, tpu_lower_full(L, pt, 0)), tpu_lower_full(L, pt, 0), m);
    } else {
      tpu_hv has_nan = tpu_hlo_compare(H, TPU_HLO_LT, nn, tpu_lower_full(L, pt, (double)n));
      pos = tpu_hlo_select(H, has_nan, nn, tpu_lower_full(L, pt, (double)((n - 1) / 2)));
    }
  } else {
    pos = tpu_lower_full(L, pt, (double)((n - 1) / 2));
  }
  tpu_hv ov, oi;
  bool keep = !all && t->rank > 0 && tpu_arg_bool(L, 2);
  tpu_pick_sorted(L, v, i, d, pos, keep, &ov, &oi);
  if (all || t->rank == 0) {
    ov = tpu_hlo_reshape(H, ov, 0, NULL);
    oi = tpu_hlo_reshape(H, oi, 0, NULL);
  }
  tpu_lower_out(L, ov);
  if (!all) tpu_lower_out(L, oi);
}
void tpu_emit_median_all(tpu_lower *L) { tpu_median_impl(L, true, false); }
void tpu_emit_nanmedian_all(tpu_lower *L) { tpu_median_impl(L, true, true); }
void tpu_emit_median_dim(tpu_lower *L) { tpu_median_impl(L, false, false); }
void tpu_emit_nanmedian_dim(tpu_lower *L) { tpu_median_impl(L, false, true); }

/* ---- searching ----------------------------------------------------------------------------------- */

/* searchsorted.Tensor(sorted_sequence, self, *, out_int32, right, side, sorter):
 * the count of boundaries below (or not above, for right) each value. */
static void tpu_searchsorted_impl(tpu_lower *L, int seq_i, int val_i, int sorter_i, bool out32, bool right) {
  tpu_tref *s = &L->args[seq_i].t;
  int idx[2] = {seq_i, val_i};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv seq = tpu_lower_input(L, seq_i, dt), val = tpu_lower_input(L, val_i, dt);
  tpu_hlo_type st = *T(L, seq), vt = *T(L, val);
  if (sorter_i >= 0) { /* seq[..., j] = seq[..., sorter[..., j]]: a one-hot contraction */
    tpu_hv so = tpu_lower_input(L, sorter_i, TPU_S64);
    int r = st.rank;
    int64_t m = st.dims[r - 1], dims[TPU_MAX_RANK + 1], bd[TPU_MAX_RANK + 1];
    memcpy(dims, st.dims, sizeof(int64_t) * (size_t)r);
    dims[r] = m; /* [..., j, k] */
    for (int k = 0; k < r; k++) bd[k] = k;
    tpu_hv sob = tpu_hlo_broadcast_in_dim(H, so, r + 1, dims, bd);
    tpu_hv kk = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r + 1, dims), r);
    for (int k = 0; k < r - 1; k++) bd[k] = k;
    bd[r - 1] = r;
    tpu_hv seqb = tpu_hlo_broadcast_in_dim(H, seq, r + 1, dims, bd);
    tpu_hv pick = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, sob, kk), seqb, tpu_k(L, seqb, 0));
    int64_t rd = r;
    seq = tpu_hlo_reduce(H, pick, tpu_lower_full(L, tpu_hlo_type_make(dt, 0, NULL), 0), &rd, 1,
                         dt == TPU_PRED ? TPU_HLO_OR : TPU_HLO_ADD);
  }
  if (vt.rank == 0) {
    int64_t one = 1;
    val = tpu_hlo_reshape(H, val, 1, &one);
    vt = *T(L, val);
  }
  int64_t m = st.dims[st.rank - 1], nv = vt.dims[vt.rank - 1];
  if (st.rank > 1 && (st.rank != vt.rank || memcmp(st.dims, vt.dims, sizeof(int64_t) * (size_t)(st.rank - 1)))) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                   "dimensions of boundaries tensor and input value tensor must match");
    return;
  }
  /* [..., nv, m] comparisons */
  int r = vt.rank;
  int64_t dims[TPU_MAX_RANK + 1];
  memcpy(dims, vt.dims, sizeof(int64_t) * (size_t)r);
  dims[r] = m;
  int64_t bv[TPU_MAX_RANK], bs[TPU_MAX_RANK];
  for (int k = 0; k < r; k++) bv[k] = k;
  tpu_hv vb = tpu_hlo_broadcast_in_dim(H, val, r + 1, dims, bv);
  tpu_hv sb;
  if (st.rank == 1) {
    bs[0] = r;
    sb = tpu_hlo_broadcast_in_dim(H, seq, r + 1, dims, bs);
  } else {
    for (int k = 0; k < st.rank - 1; k++) bs[k] = k;
    bs[st.rank - 1] = r;
    sb = tpu_hlo_broadcast_in_dim(H, seq, r + 1, dims, bs);
  }
  (void)nv;
  (void)s;
  /* the CPU's binary search steps right while !(b >= v) (right: !(b > v)): a nan value goes
   * past every boundary */
  tpu_hv below = tpu_hlo_unary(H, TPU_HLO_NOT, tpu_hlo_compare(H, right ? TPU_HLO_GT : TPU_HLO_GE, sb, vb));
  int64_t rd = r;
  tpu_hv cnt = tpu_reduce_sum(L, tpu_hlo_convert(H, below, TPU_S64), &rd, 1);
  if (L->args[val_i].t.rank == 0) cnt = tpu_hlo_reshape(H, cnt, 0, NULL);
  tpu_lower_out(L, out32 ? tpu_hlo_convert(H, cnt, TPU_S32) : cnt);
}

void tpu_emit_searchsorted(tpu_lower *L) {
  bool right = tpu_arg_bool(L, 3);
  if (tpu_arg_is(L, 4, TPU_ARG_STR)) right = strcmp(L->args[4].str, "right") == 0;
  tpu_searchsorted_impl(L, 0, 1, tpu_arg_is(L, 5, TPU_ARG_TENSOR) ? 5 : -1, tpu_arg_bool(L, 2), right);
}

/* bucketize.Tensor(self, boundaries, *, out_int32, right) */
void tpu_emit_bucketize(tpu_lower *L) { tpu_searchsorted_impl(L, 1, 0, -1, tpu_arg_bool(L, 2), tpu_arg_bool(L, 3)); }

/* ---- renorm, histc, mode --------------------------------------------------------------------------- */

/* renorm.out(self, p, dim, maxnorm): each slice along dim whose p-norm (over
 * the other dims) exceeds maxnorm is scaled by maxnorm / (norm + 1e-7). p and
 * maxnorm are attributes (p shapes the program). The factor is rounded to
 * the input's type before the product, as torch's kernel does. */
void tpu_emit_renorm(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double p = tpu_arg_number(&L->args[1], 2.0), maxnorm = tpu_arg_number(&L->args[3], 0.0);
  if (!tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "renorm: expected a floating point input, got %s", tpu_dtype_name(t->dtype));
    return;
  }
  if (t->rank <= 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "renorm: input needs at least 2 dimensions, got %d dimensions", t->rank);
    return;
  }
  if (!(p > 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "renorm: non-positive-norm not supported");
    return;
  }
  if (!(maxnorm >= 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "renorm: expected maxnorm to be >= 0 but got %g", maxnorm);
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[2].i, t->rank);
  tpu_dtype dt = t->dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_input(L, 0, acc);
  tpu_hlo_type xt = *T(L, x);
  int64_t dims[TPU_MAX_RANK];
  int n = 0;
  for (int k = 0; k < xt.rank; k++)
    if (k != d) dims[n++] = k;
  tpu_hv norm = tpu_pnorm(L, tpu_hlo_unary(H, TPU_HLO_ABS, x), p, dims, n);
  tpu_hv mx = tpu_k(L, norm, maxnorm);
  tpu_hv f =
      tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GT, norm, mx),
                     tpu_hlo_binary(H, TPU_HLO_DIV, mx, tpu_add(L, norm, tpu_k(L, norm, 1e-7))), tpu_k(L, norm, 1));
  f = tpu_hlo_convert(H, tpu_hlo_convert(H, f, dt), acc);
  tpu_hv fb = tpu_hlo_broadcast_in_dim(H, f, xt.rank, xt.dims, &d);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, x, fb), dt));
}

/* histc(self, bins=100, min=0, max=0): counts of the elements in [min, max]
 * over bins equal bins; min == max takes the data's range (widened by 1
 * each way when that is a single point). The bin of an element is
 * trunc((x - lo) * bins / (hi - lo)), the last edge going to the last bin,
 * in the input's type as torch's kernel computes it. Counted with a one-hot
 * compare against the bin numbers and a sum (min/max are attributes). */
void tpu_emit_histc(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t bins = L->args[1].i;
  double lo = tpu_arg_number(&L->args[2], 0.0), hi = tpu_arg_number(&L->args[3], 0.0);
  if (!tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"histogram_cpu\" not implemented for '%s'", tpu_dtype_name(t->dtype));
    return;
  }
  if (bins <= 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histc(): bins must be > 0, but got %lld for dim 0", (long long)bins);
    return;
  }
  if (lo > hi) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histc: max must be larger than min");
    return;
  }
  if (!isfinite(lo) || !isfinite(hi)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histc: range of [%g, %g] is not finite", lo, hi);
    return;
  }
  tpu_dtype dt = t->dtype;
  int64_t N = 1;
  for (int k = 0; k < t->rank; k++) N *= t->sizes[k];
  tpu_hlo_type ht = tpu_hlo_type_make(dt, 1, &bins);
  if (N == 0) {
    tpu_lower_out(L, tpu_lower_full(L, ht, 0));
    return;
  }
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &N);
  tpu_hlo_type st = tpu_hlo_type_make(dt, 0, NULL);
  tpu_hv vlo, vhi;
  if (lo == hi) {
    int64_t d0 = 0;
    vlo = tpu_reduce_extreme(L, x, &d0, 1, false);
    vhi = tpu_reduce_extreme(L, x, &d0, 1, true);
    tpu_hv same = tpu_hlo_compare(H, TPU_HLO_EQ, vlo, vhi);
    vlo = tpu_hlo_select(H, same, tpu_sub(L, vlo, tpu_lower_full(L, st, 1)), vlo);
    vhi = tpu_hlo_select(H, same, tpu_add(L, vhi, tpu_lower_full(L, st, 1)), vhi);
  } else {
    vlo = tpu_lower_full(L, st, lo);
    vhi = tpu_lower_full(L, st, hi);
  }
  int64_t b0 = 0;
  tpu_hv blo = tpu_hlo_broadcast_in_dim(H, vlo, 1, &N, &b0), bhi = tpu_hlo_broadcast_in_dim(H, vhi, 1, &N, &b0);
  tpu_hv in =
      tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GE, x, blo), tpu_hlo_compare(H, TPU_HLO_LE, x, bhi));
  tpu_hv q =
      tpu_hlo_binary(H, TPU_HLO_DIV, tpu_mul(L, tpu_sub(L, x, blo), tpu_k(L, x, (double)bins)), tpu_sub(L, bhi, blo));
  tpu_hv pos = tpu_hlo_convert(H, tpu_hlo_select(H, in, q, tpu_k(L, x, -1)), TPU_S64);
  pos = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, pos, tpu_k(L, pos, (double)bins)),
                       tpu_k(L, pos, (double)(bins - 1)), pos);
  int64_t nb[2] = {N, bins};
  tpu_hv posb = tpu_hlo_broadcast_in_dim(H, pos, 2, nb, &b0);
  tpu_hv hit = tpu_hlo_compare(H, TPU_HLO_EQ, posb, tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nb), 1));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, tpu_hlo_convert(H, hit, TPU_S64), &b0, 1), dt));
}

/* mode(self, dim=-1, keepdim=False) -> (values, indices): the most frequent
 * value along dim (the smallest among equally frequent ones, as torch's
 * sorted scan finds) and the last index holding it. Frequencies come from an
 * n x n equality table along dim, which suits the short dims mode is used on. */
void tpu_emit_mode(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (t->rank == 0) {
    tpu_lower_out(L, x);
    tpu_lower_out(L, tpu_hlo_constant_int(H, TPU_S64, 0));
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  if (t->sizes[d] == 0) {
    tpu_lower_fail(L, TPU_ERR_INDEX, "mode(): Expected reduction dim %lld to have non-zero size.", (long long)d);
    return;
  }
  tpu_dtype dt = t->dtype, cdt = dt == TPU_PRED ? TPU_U8 : dt;
  x = tpu_hlo_convert(H, x, cdt);
  tpu_hlo_type xt = *T(L, x);
  /* the table: dims of x with a second copy of dim d inserted after it */
  int64_t td[TPU_MAX_RANK + 1], bi[TPU_MAX_RANK], bj[TPU_MAX_RANK];
  int r = xt.rank;
  for (int k = 0, o = 0; k < r; k++) {
    td[o] = xt.dims[k];
    bi[k] = o;
    bj[k] = k == d ? o + 1 : o;
    o++;
    if (k == d) td[o++] = xt.dims[k];
  }
  for (int k = (int)d + 1; k < r; k++) bj[k] = bi[k];
  tpu_hv xi = tpu_hlo_broadcast_in_dim(H, x, r + 1, td, bi);
  tpu_hv xj = tpu_hlo_broadcast_in_dim(H, x, r + 1, td, bj);
  int64_t jd = d + 1;
  tpu_hv cnt = tpu_reduce_sum(L, tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_EQ, xi, xj), TPU_S64), &jd, 1);
  tpu_hv maxc = tpu_reduce_extreme(L, cnt, &d, 1, true);
  int64_t bd[TPU_MAX_RANK];
  int nb = 0;
  for (int k = 0; k < r; k++)
    if (k != d) bd[nb++] = k;
  tpu_hv cand = tpu_hlo_compare(H, TPU_HLO_EQ, cnt, tpu_hlo_broadcast_in_dim(H, maxc, r, xt.dims, bd));
  tpu_hv big = tpu_hlo_broadcast_in_dim(H, tpu_init_value(L, cdt, false), r, xt.dims, NULL);
  tpu_hv val = tpu_reduce_extreme(L, tpu_hlo_select(H, cand, x, big), &d, 1, false);
  tpu_hv hit = tpu_hlo_compare(H, TPU_HLO_EQ, x, tpu_hlo_broadcast_in_dim(H, val, r, xt.dims, bd));
  tpu_hv iota = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, xt.dims), (int)d);
  tpu_hv idx = tpu_reduce_extreme(L, tpu_hlo_select(H, hit, iota, tpu_k(L, iota, -1)), &d, 1, true);
  bool mask[TPU_MAX_RANK] = {0};
  mask[d] = true;
  bool keep = tpu_arg_bool(L, 2);
  tpu_lower_out(L, tpu_keepdim(L, tpu_hlo_convert(H, val, dt), &xt, mask, keep));
  tpu_lower_out(L, tpu_keepdim(L, idx, &xt, mask, keep));
}

/* The histogram of x ([N], type dt) over the ascending edges ([bins + 1]):
 * an element's bin is the number of edges <= it, less one (the last edge
 * belongs to the last bin); elements outside the edges count nowhere.
 * Weighted by argument w_arg when has_w; density divides by the total and
 * the bin widths. */
static tpu_hv tpu_hist_count(tpu_lower *L, tpu_hv x, int64_t N, tpu_hv edges, int64_t bins, bool has_w, int w_arg,
                             bool density) {
  tpu_dtype dt = T(L, x)->dtype;
  int64_t b0 = 0, ne = bins + 1;
  tpu_hlo_type ht = tpu_hlo_type_make(dt, 1, &bins);
  tpu_hv hist;
  if (N == 0) {
    hist = tpu_lower_full(L, ht, 0);
  } else {
    int64_t b1 = 1, nn[2] = {N, ne};
    tpu_hv xb = tpu_hlo_broadcast_in_dim(H, x, 2, nn, &b0), eb = tpu_hlo_broadcast_in_dim(H, edges, 2, nn, &b1);
    tpu_hv pos =
        tpu_sub(L, tpu_reduce_sum(L, tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_GE, xb, eb), TPU_S64), &b1, 1),
                tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, 1), 1, &N, NULL));
    int64_t zero = 0, last = bins;
    tpu_hv e0 = tpu_hlo_reshape(H, tpu_hlo_slice(H, edges, &zero, (int64_t[]){1}, (int64_t[]){1}), 0, NULL);
    tpu_hv eN = tpu_hlo_reshape(H, tpu_hlo_slice(H, edges, &last, &ne, (int64_t[]){1}), 0, NULL);
    tpu_hv in =
        tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GE, x, tpu_hlo_broadcast_in_dim(H, e0, 1, &N, NULL)),
                       tpu_hlo_compare(H, TPU_HLO_LE, x, tpu_hlo_broadcast_in_dim(H, eN, 1, &N, NULL)));
    pos = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GE, pos, tpu_k(L, pos, (double)bins)),
                         tpu_k(L, pos, (double)(bins - 1)), pos);
    pos = tpu_hlo_select(H, in, pos, tpu_k(L, pos, -1));
    int64_t nb[2] = {N, bins};
    tpu_hv hit = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_broadcast_in_dim(H, pos, 2, nb, &b0),
                                 tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nb), 1));
    tpu_dtype acc = tpu_acc_type(dt);
    tpu_hv w = has_w ? tpu_hlo_convert(H, tpu_hlo_reshape(H, tpu_lower_tensor(L, w_arg, -1), 1, &N), acc)
                     : tpu_lower_full(L, tpu_hlo_type_make(acc, 1, &N), 1);
    tpu_hv wb = tpu_hlo_broadcast_in_dim(H, w, 2, nb, &b0);
    hist = tpu_hlo_convert(H, tpu_reduce_sum(L, tpu_hlo_select(H, hit, wb, tpu_k(L, wb, 0)), &b0, 1), dt);
  }
  if (density) {
    tpu_hv s = tpu_reduce_sum(L, hist, &b0, 1);
    hist = tpu_hlo_binary(H, TPU_HLO_DIV, hist, tpu_hlo_broadcast_in_dim(H, s, 1, &bins, NULL));
    int64_t one = 1, z = 0, s1 = 1;
    tpu_hv width = tpu_sub(L, tpu_hlo_slice(H, edges, &one, &ne, &s1), tpu_hlo_slice(H, edges, &z, &bins, &s1));
    hist = tpu_hlo_binary(H, TPU_HLO_DIV, hist, width);
  }
  return hist;
}

/* The bins + 1 edges from the 0-d lo to the 0-d hi (one dtype), a single
 * point (lo == hi) widened by half a unit each way (histc widens by one):
 * torch's linspace, built from both ends as its kernel does, lo + step * i
 * for the first half and hi - step * (bins - i) after. */
static tpu_hv tpu_hist_edges(tpu_lower *L, tpu_hv lo, tpu_hv hi, int64_t bins) {
  tpu_hlo_type st = *T(L, lo);
  tpu_dtype dt = st.dtype;
  tpu_hv same = tpu_hlo_compare(H, TPU_HLO_EQ, lo, hi);
  lo = tpu_hlo_select(H, same, tpu_sub(L, lo, tpu_lower_full(L, st, 0.5)), lo);
  hi = tpu_hlo_select(H, same, tpu_add(L, hi, tpu_lower_full(L, st, 0.5)), hi);
  int64_t ne = bins + 1;
  tpu_hv step = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_sub(L, hi, lo), tpu_lower_full(L, st, (double)bins));
  tpu_hv ii = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 1, &ne), 0);
  tpu_hv fi = tpu_hlo_convert(H, ii, dt), fr = tpu_hlo_convert(H, tpu_sub(L, tpu_k(L, ii, (double)bins), ii), dt);
  tpu_hv stepb = tpu_hlo_broadcast_in_dim(H, step, 1, &ne, NULL);
  tpu_hv first = tpu_add(L, tpu_hlo_broadcast_in_dim(H, lo, 1, &ne, NULL), tpu_mul(L, stepb, fi));
  tpu_hv second = tpu_sub(L, tpu_hlo_broadcast_in_dim(H, hi, 1, &ne, NULL), tpu_mul(L, stepb, fr));
  return tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_LT, ii, tpu_k(L, ii, (double)(ne / 2))), first, second);
}

/* histogram.bin_ct(self, bins=100, *, range=None, weight=None, density=False)
 * -> (hist, bin_edges). The edges are torch's linspace of the range (the
 * data's when none is given), built from both ends as torch's kernel does;
 * an element's bin is the number of edges <= it, less one (the last edge
 * belongs to the last bin), elements outside the edges count nowhere. */
void tpu_emit_histogram_bin_ct(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t bins = L->args[1].i;
  bool has_range = tpu_arg_is(L, 2, TPU_ARG_FLOATS), has_w = tpu_arg_is(L, 3, TPU_ARG_TENSOR),
       density = tpu_arg_bool(L, 4);
  tpu_dtype dt = t->dtype;
  if (!tpu_dtype_is_float(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"histogram_cpu\" not implemented for '%s'", tpu_dtype_name(dt));
    return;
  }
  if (bins <= 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histogram(): bins must be > 0, but got %lld for dim 0", (long long)bins);
    return;
  }
  if (has_range && (L->args[2].nints != 2 || !(L->args[2].floats[0] <= L->args[2].floats[1]))) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histogram(): min should not exceed max, or range has the wrong length");
    return;
  }
  int64_t N = 1;
  for (int k = 0; k < t->rank; k++) N *= t->sizes[k];
  if (has_w) {
    tpu_tref *w = &L->args[3].t;
    bool same = w->rank == t->rank && w->dtype == dt;
    for (int k = 0; same && k < t->rank; k++) same = w->sizes[k] == t->sizes[k];
    if (!same) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "torch.histogram: if weight tensor is provided, it should have the same shape "
                     "and dtype as the input tensor");
      return;
    }
  }
  tpu_hlo_type st = tpu_hlo_type_make(dt, 0, NULL);
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &N);
  tpu_hv lo, hi;
  int64_t b0 = 0;
  if (has_range) {
    lo = tpu_lower_full(L, st, L->args[2].floats[0]);
    hi = tpu_lower_full(L, st, L->args[2].floats[1]);
  } else if (N == 0) {
    lo = tpu_lower_full(L, st, 0);
    hi = tpu_lower_full(L, st, 1);
  } else {
    lo = tpu_reduce_extreme(L, x, &b0, 1, false);
    hi = tpu_reduce_extreme(L, x, &b0, 1, true);
  }
  tpu_hv edges = tpu_hist_edges(L, lo, hi, bins);
  tpu_lower_out(L, tpu_hist_count(L, x, N, edges, bins, has_w, 3, density));
  tpu_lower_out(L, edges);
}

/* histogram.bins_tensor(self, bins, *, weight=None, density=False) -> (hist, bin_edges) */
void tpu_emit_histogram_bins_tensor(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t, *e = &L->args[1].t;
  tpu_dtype dt = t->dtype;
  if (!tpu_dtype_is_float(dt) || e->dtype != dt || e->rank != 1 || e->sizes[0] < 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.histogram(): bins tensor should have one dimension and the same dtype "
                   "as the floating point input, got %s bins for %s input",
                   tpu_dtype_name(e->dtype), tpu_dtype_name(dt));
    return;
  }
  bool has_w = tpu_arg_is(L, 2, TPU_ARG_TENSOR);
  if (has_w && L->args[2].t.dtype != dt) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.histogram: if weight tensor is provided, it should have the same shape "
                   "and dtype as the input tensor");
    return;
  }
  int64_t N = 1, bins = e->sizes[0] - 1;
  for (int k = 0; k < t->rank; k++) N *= t->sizes[k];
  tpu_hv edges = tpu_lower_tensor(L, 1, -1);
  if (bins == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &bins), 0));
  } else { /* no elements: zeros, or 0/0 with density, as the CPU */
    tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &N);
    tpu_lower_out(L, tpu_hist_count(L, x, N, edges, bins, has_w, 2, tpu_arg_bool(L, 3)));
  }
  tpu_lower_out(L, edges);
}

/* hash_tensor(self, dim=[], *, keepdim=False, mode=0): the xor of the
 * elements' 64-bit patterns over dim (uint64). Floats are widened to double,
 * signed integers to int64 (sign-extended), bool and unsigned integers
 * zero-extended, as the CPU does before it xors. */
void tpu_emit_hash_tensor(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (L->args[3].i != 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Unknown hash_tensor mode: %lld", (long long)L->args[3].i);
    return;
  }
  if (tpu_dtype_is_complex(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"xor_sum_cpu\" not implemented for '%s'", tpu_dtype_c10_name(t->dtype));
    return;
  }
  int64_t dims[TPU_MAX_RANK], numel = 1;
  bool mask[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) numel *= t->sizes[i];
  bool all = L->args[1].kind != TPU_ARG_INTS || L->args[1].nints == 0;
  if (all && numel == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "hash_tensor: Expected reduction dim to be specified for input.numel() == 0. "
                   "Specify the reduction dim with the 'dim' argument.");
    return;
  }
  int n = tpu_red_dims(L, 1, t->rank, dims, mask);
  for (int i = 0; i < n; i++)
    if (t->sizes[dims[i]] == 0) {
      tpu_lower_fail(L, TPU_ERR_INDEX, "hash_tensor: Expected reduction dim %lld to have non-zero size.",
                     (long long)dims[i]);
      return;
    }
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hlo_type in = *T(L, x);
  if (tpu_dtype_is_float(t->dtype))
    x = tpu_hlo_bitcast_convert(H, tpu_hlo_convert(H, x, TPU_F64), TPU_U64);
  else if (tpu_dtype_is_signed_int(t->dtype))
    x = tpu_hlo_bitcast_convert(H, tpu_hlo_convert(H, x, TPU_S64), TPU_U64);
  else
    x = tpu_hlo_convert(H, x, TPU_U64);
  tpu_hv r = tpu_hlo_reduce(H, x, tpu_hlo_constant_int(H, TPU_U64, 0), dims, n, TPU_HLO_XOR);
  tpu_lower_out(L, tpu_keepdim(L, r, &in, mask, tpu_arg_bool(L, 2)));
}

/* histogramdd's input is [..., D]: at least 2 dims, as torch checks it. */
static bool tpu_histogramdd_rank_ok(tpu_lower *L, const tpu_tref *t) {
  if (t->rank >= 2) return true;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histogramdd: input tensor should have at least 2 dimensions, but got %d",
                 t->rank);
  return false;
}

/* _histogramdd_from_bin_tensors(self [..., D], bins (D edge tensors), *, weight=None, density=False).
 * An element counts when every coordinate lies within its dim's first and
 * last edge; its bin along a dim is found as the CPU's binary search
 * (std::upper_bound over the edges, step by step, so edges that are not
 * sorted land where they land on the CPU), the last edge belonging to the
 * last bin. density divides by the total and by each dim's bin widths. */
void tpu_emit_histogramdd_from_bin_tensors(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = t->dtype;
  if (!tpu_histogramdd_rank_ok(L, t)) return;
  int64_t D = t->sizes[t->rank - 1], N = 1;
  for (int i = 0; i < t->rank - 1; i++) N *= t->sizes[i];
  if (!tpu_dtype_is_float(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"histogramdd\" not implemented for '%s'", tpu_dtype_c10_name(dt));
    return;
  }
  if (L->args[1].kind != TPU_ARG_TENSORS || L->args[1].nlist != D || D > TPU_MAX_RANK) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.histogramdd: expected %lld sequences of bin edges for each of the %lld dimensions of the "
                   "input, but got %d",
                   (long long)D, (long long)D, L->args[1].kind == TPU_ARG_TENSORS ? L->args[1].nlist : 0);
    return;
  }
  int64_t nb[TPU_MAX_RANK], total = 1;
  for (int d = 0; d < D; d++) {
    tpu_tref *e = &L->args[1].list[d];
    if (e->dtype != dt || e->rank != 1 || e->sizes[0] < 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "torch.histogramdd: bins tensor should have one dimension and the same dtype as the input "
                     "tensor, with at least one element, for dim %d",
                     d);
      return;
    }
    nb[d] = e->sizes[0] - 1;
    total *= nb[d];
  }
  bool has_w = L->args[2].kind == TPU_ARG_TENSOR, density = tpu_arg_bool(L, 3);
  if (has_w) {
    tpu_tref *w = &L->args[2].t;
    bool same = w->rank == t->rank - 1 && w->dtype == dt;
    for (int i = 0; same && i < w->rank; i++) same = w->sizes[i] == t->sizes[i];
    if (!same) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "torch.histogramdd: if weight tensor is provided it should have the same shape as the input "
                     "tensor excluding its innermost dimension, and the same dtype");
      return;
    }
  }
  tpu_hlo_type ht = tpu_hlo_type_make(dt, (int)D, nb);
  if (total == 0) {
    tpu_lower_out(L, tpu_lower_full(L, ht, 0));
    return;
  }
  tpu_hv hist;
  if (N == 0) {
    hist = tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &total), 0);
  } else {
    int64_t nd[2] = {N, D}, b0 = 0;
    tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 2, nd);
    tpu_hv in = TPU_HV_NONE, flat = TPU_HV_NONE;
    int64_t stride = total;
    for (int d = 0; d < D; d++) {
      int64_t m = nb[d] + 1, lo[2] = {0, d}, hi[2] = {N, d + 1}, one[2] = {1, 1}, nm[2] = {N, m}, b1 = 1;
      tpu_hv v = tpu_hlo_reshape(H, tpu_hlo_slice(H, x, lo, hi, one), 1, &N);
      tpu_hv e = tpu_lower_tensor(L, 1, d);
      int64_t z = 0, l1 = 1, s1 = 1, lm = m - 1;
      tpu_hv e0 =
          tpu_hlo_broadcast_in_dim(H, tpu_hlo_reshape(H, tpu_hlo_slice(H, e, &z, &l1, &s1), 0, NULL), 1, &N, NULL);
      tpu_hv eN =
          tpu_hlo_broadcast_in_dim(H, tpu_hlo_reshape(H, tpu_hlo_slice(H, e, &lm, &m, &s1), 0, NULL), 1, &N, NULL);
      tpu_hv ok =
          tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GE, v, e0), tpu_hlo_compare(H, TPU_HLO_LE, v, eN));
      in = d == 0 ? ok : tpu_hlo_binary(H, TPU_HLO_AND, in, ok);
      /* upper_bound: first, len per element */
      tpu_hv eb = tpu_hlo_broadcast_in_dim(H, e, 2, nm, &b1);
      tpu_hv io = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nm), 1);
      tpu_hv first = tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &N), 0);
      tpu_hv len = tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &N), (double)m);
      for (int64_t step = m; step > 0; step >>= 1) { /* at most floor(log2 m) + 1 halvings */
        tpu_hv half = tpu_hlo_binary(H, TPU_HLO_SHR_A, len, tpu_k(L, len, 1));
        tpu_hv mid = tpu_add(L, first, half);
        tpu_hv em = tpu_hlo_reduce(
            H,
            tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, io, tpu_hlo_broadcast_in_dim(H, mid, 2, nm, &b0)), eb,
                           tpu_k(L, eb, 0)),
            tpu_hlo_constant(H, dt, 0), &b1, 1, TPU_HLO_ADD);
        tpu_hv lt = tpu_hlo_compare(H, TPU_HLO_LT, v, em);
        tpu_hv live = tpu_hlo_compare(H, TPU_HLO_GT, len, tpu_k(L, len, 0));
        tpu_hv nfirst = tpu_hlo_select(H, lt, first, tpu_add(L, mid, tpu_k(L, mid, 1)));
        tpu_hv nlen = tpu_hlo_select(H, lt, half, tpu_sub(L, tpu_sub(L, len, half), tpu_k(L, len, 1)));
        first = tpu_hlo_select(H, live, nfirst, first);
        len = tpu_hlo_select(H, live, nlen, len);
      }
      tpu_hv pos = tpu_sub(L, first, tpu_k(L, first, 1));
      pos = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, pos, tpu_k(L, pos, (double)(m - 1))),
                           tpu_k(L, pos, (double)(m - 2)), pos);
      stride /= nb[d];
      tpu_hv c = tpu_mul(L, pos, tpu_k(L, pos, (double)stride));
      flat = d == 0 ? c : tpu_add(L, flat, c);
    }
    flat = tpu_hlo_select(H, in, flat, tpu_k(L, flat, -1));
    int64_t nt[2] = {N, total};
    tpu_hv hit = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_broadcast_in_dim(H, flat, 2, nt, &b0),
                                 tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nt), 1));
    tpu_dtype acc = tpu_acc_type(dt);
    tpu_hv w = has_w ? tpu_hlo_convert(H, tpu_hlo_reshape(H, tpu_lower_tensor(L, 2, -1), 1, &N), acc)
                     : tpu_lower_full(L, tpu_hlo_type_make(acc, 1, &N), 1);
    tpu_hv wb = tpu_hlo_broadcast_in_dim(H, w, 2, nt, &b0);
    hist = tpu_hlo_convert(H, tpu_reduce_sum(L, tpu_hlo_select(H, hit, wb, tpu_k(L, wb, 0)), &b0, 1), dt);
  }
  hist = tpu_hlo_reshape(H, hist, (int)D, nb);
  if (density) {
    int64_t all[TPU_MAX_RANK];
    for (int d = 0; d < D; d++) all[d] = d;
    tpu_hv s = tpu_reduce_sum(L, hist, all, (int)D);
    hist = tpu_hlo_binary(H, TPU_HLO_DIV, hist, tpu_hlo_broadcast_in_dim(H, s, (int)D, nb, NULL));
    for (int d = 0; d < D; d++) {
      int64_t m = nb[d] + 1, one = 1, z = 0, s1 = 1, bdd = d;
      tpu_hv e = tpu_lower_tensor(L, 1, d);
      tpu_hv width = tpu_sub(L, tpu_hlo_slice(H, e, &one, &m, &s1), tpu_hlo_slice(H, e, &z, &nb[d], &s1));
      hist = tpu_hlo_binary(H, TPU_HLO_DIV, hist, tpu_hlo_broadcast_in_dim(H, width, (int)D, nb, &bdd));
    }
  }
  tpu_lower_out(L, hist);
}

/* tpu::histogramdd_edges(self [..., D], bins (D ints), range (2D floats) or
 * None) -> D edge tensors: the edges of _histogramdd_bin_edges (whose Python
 * kernel, and _histogramdd_from_bin_cts', call this row). Each dim's edges
 * are a linspace over its given range, or the data's min and max, or [0, 1]
 * with no data; a single point widens by half a unit each way. A given
 * range is checked here, as the CPU checks it (widened in double, as it
 * is); the data's range (a NaN or an infinity), known only when the
 * program runs, by a value check. */
void tpu_emit_histogramdd_edges(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = t->dtype;
  if (!tpu_histogramdd_rank_ok(L, t)) return;
  if (!tpu_dtype_is_float(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"histogramdd\" not implemented for '%s'", tpu_dtype_c10_name(dt));
    return;
  }
  const tpu_arg *bins = &L->args[1], *range = &L->args[2];
  bool has_range = range->kind == TPU_ARG_FLOATS;
  int64_t D = t->sizes[t->rank - 1], N = tpu_numel(t->rank - 1, t->sizes);
  if (bins->nints != D) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.histogramdd: expected %lld sequences of bin edges for each of the %lld dimensions of the "
                   "input, but got %d",
                   (long long)D, (long long)D, bins->nints);
    return;
  }
  if (has_range && range->nints != 2 * D) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.histogramdd: for a %lld-dimensional histogram, range should have %lld elements, but got %d",
                   (long long)D, (long long)(2 * D), range->nints);
    return;
  }
  if (D > TPU_MAX_RANK) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histogramdd: at most %d dimensions are supported on tpu", TPU_MAX_RANK);
    return;
  }
  tpu_hlo_type st = tpu_hlo_type_make(dt, 0, NULL);
  tpu_hv lo[TPU_MAX_RANK], hi[TPU_MAX_RANK], bad = TPU_HV_NONE;
  int64_t nd[2] = {N, D}, b0 = 0;
  tpu_hv x = N > 0 && !has_range ? tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 2, nd) : TPU_HV_NONE;
  for (int d = 0; d < D; d++) {
    if (bins->ints[d] <= 0) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histogramdd(): bins must be > 0, but got %lld for dim %d",
                     (long long)bins->ints[d], d);
      return;
    }
    if (has_range) {
      double l = range->floats[2 * d], h = range->floats[2 * d + 1];
      if (!isfinite(l) || !isfinite(h)) {
        tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.histogramdd: dimension %d's range [%g, %g] is not finite", d, l, h);
        return;
      }
      if (l > h) {
        tpu_lower_fail(L, TPU_ERR_RUNTIME,
                       "torch.histogramdd: min should not exceed max, but got min %g max %g for dimension %d", l, h, d);
        return;
      }
      if (l == h) {
        l -= 0.5;
        h += 0.5;
      }
      lo[d] = tpu_lower_full(L, st, l);
      hi[d] = tpu_lower_full(L, st, h);
    } else if (N == 0) {
      lo[d] = tpu_lower_full(L, st, 0);
      hi[d] = tpu_lower_full(L, st, 1);
    } else {
      int64_t a[2] = {0, d}, e[2] = {N, d + 1}, one[2] = {1, 1};
      tpu_hv v = tpu_hlo_reshape(H, tpu_hlo_slice(H, x, a, e, one), 1, &N);
      lo[d] = tpu_reduce_extreme(L, v, &b0, 1, false);
      hi[d] = tpu_reduce_extreme(L, v, &b0, 1, true);
      tpu_hv fin = tpu_and(L, tpu_un(L, TPU_HLO_IS_FINITE, lo[d]), tpu_un(L, TPU_HLO_IS_FINITE, hi[d]));
      bad = bad == TPU_HV_NONE ? tpu_not(L, fin) : tpu_or(L, bad, tpu_not(L, fin));
    }
  }
  tpu_lower_check(L, bad, TPU_ERR_RUNTIME,
                  "torch.histogramdd: the range of the input's values along a dimension is not finite");
  for (int d = 0; d < D; d++) tpu_lower_out(L, tpu_hist_edges(L, lo[d], hi[d], bins->ints[d]));
}

/* emit_nn.c: reductions, matmuls, concatenation, softmax, losses, norms,
 * embeddings, factories and random numbers. */
#include <math.h>
#include <string.h>

#include "emit.h"

/* ---- reductions ---------------------------------------------------------------------- */

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

bool tpu_arg_bool(tpu_lower *L, int i) { return i < L->nargs && L->args[i].kind == TPU_ARG_BOOL && L->args[i].i; }

tpu_hv tpu_reduce_sum(tpu_lower *L, tpu_hv x, const int64_t *dims, int n) {
  tpu_dtype dt = T(L, x)->dtype;
  tpu_hlo_op op = dt == TPU_PRED ? TPU_HLO_OR : TPU_HLO_ADD;
  return tpu_hlo_reduce(H, x, tpu_lower_full(L, tpu_hlo_type_make(dt, 0, NULL), 0), dims, n, op);
}

/* Sum over dims keeping them (size 1). */
static tpu_hv tpu_sum_keep(tpu_lower *L, tpu_hv x, const int64_t *dims, int n) {
  const tpu_hlo_type in = *T(L, x);
  bool mask[TPU_MAX_RANK] = {0};
  for (int i = 0; i < n; i++) mask[dims[i]] = true;
  return tpu_keepdim(L, tpu_reduce_sum(L, x, dims, n), &in, mask, true);
}

static double tpu_lowest(tpu_dtype dt) {
  switch (dt) {
    case TPU_PRED: return 0;
    case TPU_S8: return -128;
    case TPU_S16: return -32768;
    case TPU_S32: return -2147483648.0;
    case TPU_S64: return -9223372036854775808.0;
    default: return tpu_dtype_is_unsigned_int(dt) ? 0 : -INFINITY;
  }
}
static double tpu_highest(tpu_dtype dt) {
  switch (dt) {
    case TPU_PRED: return 1;
    case TPU_S8: return 127;
    case TPU_U8: return 255;
    case TPU_S16: return 32767;
    case TPU_U16: return 65535;
    case TPU_S32: return 2147483647.0;
    case TPU_U32: return 4294967295.0;
    default: return tpu_dtype_is_int(dt) ? 9223372036854775807.0 : INFINITY;
  }
}

tpu_hv tpu_init_value(tpu_lower *L, tpu_dtype dt, bool is_max) {
  tpu_hlo_type s = tpu_hlo_type_make(dt, 0, NULL);
  if (dt == TPU_S64) return tpu_hlo_constant_int(H, dt, is_max ? INT64_MIN : INT64_MAX);
  if (dt == TPU_U64) return tpu_hlo_constant_int(H, dt, is_max ? 0 : -1);
  return tpu_lower_full(L, s, is_max ? tpu_lowest(dt) : tpu_highest(dt));
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

static void tpu_emit_amaxmin(tpu_lower *L, bool is_max) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int64_t dims[TPU_MAX_RANK];
  bool mask[TPU_MAX_RANK];
  int n = tpu_red_dims(L, 1, t->rank, dims, mask);
  bool all =
      L->nargs < 2 || L->args[1].kind == TPU_ARG_NONE || (L->args[1].kind == TPU_ARG_INTS && L->args[1].nints == 0);
  int64_t numel = 1;
  for (int i = 0; i < t->rank; i++) numel *= t->sizes[i];
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
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s(): does not support bool input", is_max ? "argmax" : "argmin");
    return;
  }
  if (tpu_lower_is_none(L, 1)) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->sizes[i];
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

/* ---- matmuls -------------------------------------------------------------------------- */

/* The C++ type name torch's mm/addmm dtype message prints (caffe2's TypeMeta). */
static const char *tpu_cxx_type_name(tpu_dtype t) {
  switch (t) {
    case TPU_PRED: return "bool";
    case TPU_S8: return "signed char";
    case TPU_U8: return "unsigned char";
    case TPU_S16: return "short int";
    case TPU_S32: return "int";
    case TPU_S64: return "long int";
    case TPU_F16: return "c10::Half";
    case TPU_BF16: return "c10::BFloat16";
    case TPU_F32: return "float";
    case TPU_F64: return "double";
    case TPU_C64: return "c10::complex<float>";
    case TPU_C128: return "c10::complex<double>";
    default: return tpu_dtype_name(t);
  }
}

static void tpu_check_mm_dtypes(tpu_lower *L, int a, int b) {
  if (L->args[a].t.dtype != L->args[b].t.dtype)
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected m1 and m2 to have the same dtype, but got: %s != %s",
                   tpu_cxx_type_name(L->args[a].t.dtype), tpu_cxx_type_name(L->args[b].t.dtype));
}

/* torch's CPU matmul kernels have no bool instance: they refuse bool inputs
 * only where they would compute, not for an empty result or an empty sum
 * (those return before the kernel's dtype dispatch). */
static bool tpu_mm_bool_refused(tpu_lower *L, int a, int64_t out_numel, int64_t inner, const char *kernel) {
  if (L->args[a].t.dtype != TPU_PRED || out_numel == 0 || inner == 0) return false;
  tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"%s\" not implemented for 'Bool'", kernel);
  return true;
}

static tpu_hv tpu_matmul2(tpu_lower *L, tpu_hv a, tpu_hv b) {
  const tpu_hlo_type *at = T(L, a), *bt = T(L, b);
  if (at->rank != 2 || bt->rank != 2 || at->dims[1] != bt->dims[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                   (long long)at->dims[0], (long long)(at->rank > 1 ? at->dims[1] : 0), (long long)bt->dims[0],
                   (long long)(bt->rank > 1 ? bt->dims[1] : 0));
    return TPU_HV_NONE;
  }
  tpu_dtype dt = at->dtype, acc = tpu_acc_type(dt);
  int64_t lc = 1, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(H, a, b, 0, NULL, NULL, 1, &lc, &rc, L->precision, acc);
  return tpu_hlo_convert(H, r, dt);
}

void tpu_emit_mm(tpu_lower *L) {
  tpu_check_mm_dtypes(L, 0, 1);
  tpu_tref *x = &L->args[0].t, *y = &L->args[1].t;
  if (x->rank == 2 && y->rank == 2 &&
      tpu_mm_bool_refused(L, 0, x->sizes[0] * y->sizes[1], x->sizes[1], "addmm_impl_cpu_"))
    return;
  tpu_lower_out(L, tpu_matmul2(L, tpu_lower_tensor(L, 0, -1), tpu_lower_tensor(L, 1, -1)));
}

/* addmm(self, mat1, mat2, *, beta=1, alpha=1) = beta*self + alpha*(mat1@mat2),
 * accumulated in f32 for half types and rounded once, as torch's CPU kernel */
void tpu_emit_addmm(tpu_lower *L) {
  const char *what[2] = {"self", "mat1"};
  for (int i = 0; i < 2; i++)
    if (L->args[i].t.dtype != L->args[2].t.dtype) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s and mat2 must have the same dtype, but got %s and %s", what[i],
                     tpu_dtype_c10_name(L->args[i].t.dtype), tpu_dtype_c10_name(L->args[2].t.dtype));
      return;
    }
  tpu_tref *x = &L->args[1].t, *y = &L->args[2].t;
  if (x->rank == 2 && y->rank == 2 &&
      tpu_mm_bool_refused(L, 1, x->sizes[0] * y->sizes[1], x->sizes[1], "addmm_impl_cpu_"))
    return;
  tpu_dtype dt = L->args[1].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv a = tpu_lower_tensor(L, 1, -1), b = tpu_lower_tensor(L, 2, -1);
  if (T(L, a)->rank != 2 || T(L, b)->rank != 2 || T(L, a)->dims[1] != T(L, b)->dims[0]) {
    tpu_matmul2(L, a, b); /* reports the shape error */
    return;
  }
  int64_t lc = 1, rc = 0;
  tpu_hv p = tpu_hlo_dot_general(H, a, b, 0, NULL, NULL, 1, &lc, &rc, L->precision, acc);
  if (!L->args[4].is_default) p = tpu_lower_binary(L, TPU_HLO_MUL, p, tpu_lower_scalar(L, 4, acc));
  tpu_hv s = tpu_lower_input(L, 0, acc);
  if (!L->args[3].is_default) {
    tpu_hv beta = tpu_lower_scalar(L, 3, acc);
    s = tpu_lower_binary(L, TPU_HLO_MUL, s, beta); /* beta == 0 ignores self, NaNs included */
    s = tpu_hlo_select(
        H,
        tpu_hlo_compare(H, TPU_HLO_EQ, tpu_lower_broadcast_to(L, beta, T(L, s)->rank, T(L, s)->dims), tpu_k(L, s, 0)),
        tpu_k(L, s, 0), s);
  }
  const tpu_hlo_type *pt = T(L, p);
  tpu_hv r = tpu_hlo_binary(H, TPU_HLO_ADD, tpu_lower_broadcast_to(L, s, pt->rank, pt->dims), p);
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* bmm(self, mat2): the result takes mat2's dtype (torch's meta kernel
 * allocates it from mat2), and an empty result or an empty sum (zeros)
 * returns before any dtype check, whatever the two dtypes; otherwise bool is
 * refused and the dtypes must agree. */
void tpu_emit_bmm(tpu_lower *L) {
  tpu_tref *x = &L->args[0].t, *y = &L->args[1].t;
  if (x->rank != 3 || y->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s must be a 3D tensor", x->rank != 3 ? "batch1" : "batch2");
    return;
  }
  if (x->sizes[0] != y->sizes[0] || x->sizes[2] != y->sizes[1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected size for first two dimensions of batch2 tensor to be: [%lld, %lld] but got: [%lld, %lld].",
                   (long long)x->sizes[0], (long long)x->sizes[2], (long long)y->sizes[0], (long long)y->sizes[1]);
    return;
  }
  int64_t rd[3] = {x->sizes[0], x->sizes[1], y->sizes[2]};
  if (rd[0] * rd[1] * rd[2] == 0 || x->sizes[2] == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(y->dtype, 3, rd), 0));
    return;
  }
  if (tpu_mm_bool_refused(L, 0, 1, 1, "bmm")) return;
  if (x->dtype != y->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected scalar type %s but found %s", tpu_dtype_c10_name(x->dtype),
                   tpu_dtype_c10_name(y->dtype));
    return;
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  tpu_dtype dt = x->dtype;
  int64_t z = 0, lc = 2, rc = 1;
  tpu_hv r = tpu_hlo_dot_general(H, a, b, 1, &z, &z, 1, &lc, &rc, L->precision, tpu_acc_type(dt));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* dot(self, tensor), mv(self, vec) */
void tpu_emit_dot(tpu_lower *L) {
  tpu_tref *x = &L->args[0].t, *y = &L->args[1].t;
  if (!strncmp(L->opname, "mv", 2) &&
      (L->opname[2] == 0 || L->opname[2] == '.')) { /* torch's addmv: (result = vec's dtype, mat, vec) */
    if (x->dtype != y->dtype) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "addmv input tensors must have the same dtype, but got %s, %s, and %s",
                     tpu_dtype_c10_name(y->dtype), tpu_dtype_c10_name(x->dtype), tpu_dtype_c10_name(y->dtype));
      return;
    }
    if (x->rank == 2 && tpu_mm_bool_refused(L, 0, x->sizes[0], x->sizes[1], "addmv_impl_cpu")) return;
  } else {
    if (x->dtype != y->dtype) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "dot : expected both vectors to have same dtype, but found %s and %s",
                     tpu_dtype_c10_name(x->dtype), tpu_dtype_c10_name(y->dtype));
      return;
    }
    if (x->dtype == TPU_PRED) { /* refused even when empty */
      tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"dot\" not implemented for 'Bool'");
      return;
    }
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  tpu_dtype dt = T(L, a)->dtype;
  int64_t lc = T(L, a)->rank - 1, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(H, a, b, 0, NULL, NULL, 1, &lc, &rc, L->precision, tpu_acc_type(dt));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* ---- cat, tril/triu ---------------------------------------------------------------------- */

void tpu_emit_cat(tpu_lower *L) {
  tpu_arg *a = &L->args[0];
  int idx[1] = {0};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 1);
  tpu_hv vs[TPU_MAX_LIST];
  int n = 0, rank = -1;
  for (int j = 0; j < a->nlist; j++) {
    tpu_tref *t = &a->list[j];
    if (t->rank == 1 && t->sizes[0] == 0) continue; /* legacy: empty 1-d tensors are skipped */
    if (rank < 0) rank = t->rank;
    vs[n++] = tpu_hlo_convert(H, tpu_lower_tensor(L, 0, j), dt);
  }
  if (n == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, (int64_t[]){0}), 0));
    return;
  }
  if (rank == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "zero-dimensional tensor (at position 0) cannot be concatenated");
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, rank);
  for (int j = 1; j < n; j++) {
    const tpu_hlo_type *u = T(L, vs[j]), *v = T(L, vs[0]);
    for (int k = 0; k < rank && u->rank == rank; k++)
      if (k != d && u->dims[k] != v->dims[k]) {
        tpu_lower_fail(L, TPU_ERR_RUNTIME,
                       "Sizes of tensors must match except in dimension %lld. Expected size %lld "
                       "but got size %lld for tensor number %d in the list.",
                       (long long)d, (long long)v->dims[k], (long long)u->dims[k], j);
        return;
      }
  }
  tpu_lower_out(L, tpu_hlo_concat(H, vs, n, (int)d));
}

static void tpu_emit_tri(tpu_lower *L, bool lower) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  const tpu_hlo_type xt = *T(L, x);
  if (xt.rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: input tensor must have at least 2 dimensions", lower ? "tril" : "triu");
    return;
  }
  int64_t k = L->args[1].i;
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, xt.rank, xt.dims);
  tpu_hv row = tpu_hlo_iota(H, it, xt.rank - 2), col = tpu_hlo_iota(H, it, xt.rank - 1);
  tpu_hv diff = tpu_hlo_binary(H, TPU_HLO_SUB, col, row);
  tpu_hv kk = tpu_lower_full(L, it, (double)k);
  tpu_hv keep = tpu_hlo_compare(H, lower ? TPU_HLO_LE : TPU_HLO_GE, diff, kk);
  tpu_lower_out(L, tpu_hlo_select(H, keep, x, tpu_k(L, x, 0)));
}
void tpu_emit_tril(tpu_lower *L) { tpu_emit_tri(L, true); }
void tpu_emit_triu(tpu_lower *L) { tpu_emit_tri(L, false); }

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
  /* A row of -inf has max -inf; shift by 0 instead so the result is NaN-free as on CPU. */
  tpu_hv finite = tpu_hlo_unary(H, TPU_HLO_IS_FINITE, m);
  m = tpu_hlo_select(H, finite, m, tpu_k(L, m, 0));
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

/* ---- nll_loss ----------------------------------------------------------------------------- */

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
  /* 1/sqrt, rounded once (XLA's f32 rsqrt is approximate): torch's CPU kernel
   * divides, and the weight gradient of a one-element norm depends on rstd's
   * last bit */
  tpu_hv ve = tpu_add(L, var, tpu_k(L, var, L->args[4].f));
  tpu_hv sd = tpu_hlo_unary(H, TPU_HLO_SQRT, tpu_hlo_convert(H, ve, TPU_F64));
  tpu_hv rstd = tpu_hlo_convert(H, tpu_hlo_binary(H, TPU_HLO_DIV, tpu_k(L, sd, 1), sd), acc);
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
  if (acc == TPU_F32) {
    tpu_hv b = tpu_hlo_unary(H, TPU_HLO_NEG, tpu_mul(L, mean, rstd));
    tpu_hv p64 = tpu_lower_binary(L, TPU_HLO_MUL, tpu_hlo_convert(H, x, TPU_F64), tpu_hlo_convert(H, rstd, TPU_F64));
    xw = tpu_hlo_convert(H, tpu_lower_binary(L, TPU_HLO_ADD, p64, tpu_hlo_convert(H, b, TPU_F64)), TPU_F32);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, tpu_mul(L, g, xw), bdims, axis), wdt));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_reduce_sum(L, g, bdims, axis), bdt));
}

/* ---- embedding --------------------------------------------------------------------------- */

/* embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) */
void tpu_emit_embedding(tpu_lower *L) {
  tpu_tref *w = &L->args[0].t, *ix = &L->args[1].t;
  if (w->rank != 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "'weight' must be 2-D");
    return;
  }
  if (tpu_dtype_is_float(ix->dtype) || ix->dtype == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected tensor for argument #1 'indices' to have one of the following scalar "
                   "types: Long, Int; but got %s instead",
                   tpu_dtype_name(ix->dtype));
    return;
  }
  int64_t n = 1, D = w->sizes[1];
  for (int i = 0; i < ix->rank; i++) n *= ix->sizes[i];
  tpu_hv idx = tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, 1, -1), TPU_S64), 2, (int64_t[]){n, 1});
  tpu_lower_check_range(L, idx, w->sizes[0], false, TPU_ERR_INDEX, "index out of range in self");
  tpu_hv r = tpu_lower_gather_rows(L, tpu_lower_tensor(L, 0, -1), idx);
  int64_t od[TPU_MAX_RANK + 1];
  for (int i = 0; i < ix->rank; i++) od[i] = ix->sizes[i];
  od[ix->rank] = D;
  tpu_lower_out(L, tpu_hlo_reshape(H, r, ix->rank + 1, od));
}

/* embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) */
void tpu_emit_embedding_dense_backward(tpu_lower *L) {
  tpu_tref *g = &L->args[0].t, *ix = &L->args[1].t;
  if (tpu_arg_bool(L, 4)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "embedding backward with scale_grad_by_freq=True is not lowered yet");
    return;
  }
  int64_t n = 1, D = g->sizes[g->rank - 1], V = L->args[2].i;
  for (int i = 0; i < ix->rank; i++) n *= ix->sizes[i];
  tpu_dtype dt = g->dtype, acc = tpu_acc_type(dt);
  tpu_hv idx = tpu_hlo_convert(H, tpu_hlo_reshape(H, tpu_lower_tensor(L, 1, -1), 1, &n), TPU_S64);
  tpu_hv upd = tpu_hlo_reshape(H, tpu_lower_input(L, 0, acc), 2, (int64_t[]){n, D});
  if (L->args[3].i >= 0) {
    tpu_hv keep =
        tpu_hlo_compare(H, TPU_HLO_NE, idx, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), (double)L->args[3].i));
    keep = tpu_hlo_broadcast_in_dim(H, keep, 2, (int64_t[]){n, D}, (int64_t[]){0});
    upd = tpu_hlo_select(H, keep, upd, tpu_k(L, upd, 0));
  }
  idx = tpu_hlo_reshape(H, idx, 2, (int64_t[]){n, 1});
  tpu_hlo_type st = tpu_hlo_type_make(acc, 0, NULL), sts[2] = {st, st};
  tpu_hv a[2];
  tpu_hlo_region_begin(H, sts, 2, a);
  tpu_hv s = tpu_add(L, a[0], a[1]);
  int region = tpu_hlo_region_end(H, &s, 1);
  tpu_hv zeros = tpu_lower_full(L, tpu_hlo_type_make(acc, 2, (int64_t[]){V, D}), 0);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_lower_scatter_rows(L, zeros, idx, upd, region), dt));
}

/* ---- factories and fills --------------------------------------------------------------------- */

/* fill_.Scalar(self, value), fill_.Tensor(self, value) */
void tpu_emit_fill(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv v = L->args[1].kind == TPU_ARG_SCALAR ? tpu_lower_scalar(L, 1, t->dtype)
                                               : tpu_hlo_reshape(H, tpu_lower_input(L, 1, t->dtype), 0, NULL);
  tpu_lower_write(L, 0, -1, v);
  tpu_lower_return_arg(L, 0, -1);
}

void tpu_emit_zero(tpu_lower *L) {
  tpu_lower_write(L, 0, -1, tpu_lower_full(L, tpu_hlo_type_make(L->args[0].t.dtype, 0, NULL), 0));
  tpu_lower_return_arg(L, 0, -1);
}

void tpu_emit_clone(tpu_lower *L) { tpu_lower_out(L, tpu_lower_tensor(L, 0, -1)); }

/* arange.start_step(start, end, step=1, *, dtype, layout, device, pin_memory):
 * the values fix the shape, so they are read here, not passed as inputs. */
void tpu_emit_arange(tpu_lower *L) {
  /* arange(end), arange.start(start, end), arange.start_step(start, end, step) */
  int ns = 0;
  while (ns < 3 && ns < L->nargs && L->args[ns].kind == TPU_ARG_SCALAR) ns++;
  tpu_arg zero = {.kind = TPU_ARG_SCALAR, .skind = TPU_SCALAR_INT, .i = 0, .f = 0};
  tpu_arg one = {.kind = TPU_ARG_SCALAR, .skind = TPU_SCALAR_INT, .i = 1, .f = 1};
  tpu_arg *s = ns == 1 ? &zero : &L->args[0], *e = ns == 1 ? &L->args[0] : &L->args[1];
  tpu_arg *st = ns == 3 ? &L->args[2] : &one;
  bool is_float = s->skind == TPU_SCALAR_FLOAT || e->skind == TPU_SCALAR_FLOAT || st->skind == TPU_SCALAR_FLOAT;
  tpu_dtype dt =
      (ns < L->nargs && L->args[ns].kind == TPU_ARG_DTYPE) ? L->args[ns].dtype : (is_float ? TPU_F32 : TPU_S64);
  double a = s->f, b = e->f, c = st->f;
  if ((L->flags & TPU_OP_OUT) && L->args[L->nargs - 1].kind == TPU_ARG_TENSOR &&
      tpu_dtype_is_int(L->args[L->nargs - 1].t.dtype) && (int64_t)c == 0) {
    /* an integer out= takes the step as an integer, as torch does */
    tpu_lower_fail(L, TPU_ERR_VALUE, "step must be nonzero");
    return;
  }
  if (c == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "step must be nonzero");
    return;
  }
  if ((c > 0 && b < a) || (c < 0 && b > a)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "upper bound and larger bound inconsistent with step sign");
    return;
  }
  int64_t n;
  if (is_float) {
    n = (int64_t)ceil((b - a) / c);
  } else {
    int64_t ia = s->i, ib = e->i, ic = st->i;
    n = ic > 0 ? (ib - ia + ic - 1) / ic : (ia - ib + (-ic) - 1) / (-ic);
  }
  if (n < 0) n = 0;
  tpu_hlo_type it = tpu_hlo_type_make(tpu_dtype_is_float(dt) || is_float ? TPU_F64 : TPU_S64, 1, &n);
  tpu_hv io = tpu_hlo_iota(H, it, 0), r;
  if (it.dtype == TPU_S64) {
    /* integer bounds stay integers: a double holds them only below 2**53 */
    tpu_hv ic = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, st->i), 1, &n, NULL);
    tpu_hv ia = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, s->i), 1, &n, NULL);
    r = tpu_add(L, tpu_mul(L, io, ic), ia);
  } else {
    r = tpu_add(L, tpu_mul(L, io, tpu_lower_full(L, it, c)), tpu_lower_full(L, it, a));
  }
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* x rounded to dt and back (f32 working values of a half type). */
static tpu_hv tpu_round_to(tpu_lower *L, tpu_hv x, tpu_dtype dt) {
  return tpu_hlo_convert(H, tpu_hlo_convert(H, x, dt), T(L, x)->dtype);
}

/* base + step * j (f64 values, j integers below 2^26) as one fused
 * multiply-add rounds it: step splits into halves whose products with j are
 * exact, summed with the rounding error of the first sum kept. */
static tpu_hv tpu_fma_f64(tpu_lower *L, tpu_hv base, double step, tpu_hv j) {
  double c = step * 134217729.0, hi = c - (c - step), lo = step - hi;
  tpu_hv ph = tpu_mul(L, tpu_k(L, j, hi), j), pl = tpu_mul(L, tpu_k(L, j, lo), j);
  tpu_hv sum = tpu_add(L, base, ph), bb = tpu_sub(L, sum, base);
  tpu_hv err = tpu_add(L, tpu_sub(L, base, tpu_sub(L, sum, bb)), tpu_sub(L, ph, bb));
  return tpu_add(L, sum, tpu_add(L, err, pl));
}

/* linspace.out(start, end, steps, *, out) / logspace.out(start, end, steps, base, *, out):
 * as torch's CPU kernel: start and end in the output type (integers
 * truncate), the step in that type (f64 for integers), the first half
 * counting up from start and the second down from end (both ends exact).
 * torch's build contracts start + step * i into one fused multiply-add
 * (emulated: in f64 for f32, split products for f64 and integers); half
 * types round after every operation, as c10::Half arithmetic does. */
static void tpu_emit_space(tpu_lower *L, bool log) {
  const tpu_arg *s = &L->args[0], *e = &L->args[1];
  int64_t n = L->args[2].i;
  if (n < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "number of steps must be non-negative");
    return;
  }
  double base = log ? L->args[3].f : 0;
  tpu_dtype dt = L->args[L->nargs - 1].t.dtype; /* the out tensor's */
  if (tpu_dtype_is_complex(dt)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s into a complex tensor is not supported yet",
                   log ? "logspace" : "linspace");
    return;
  }
  bool flt = tpu_dtype_is_float(dt), half = dt == TPU_F16 || dt == TPU_BF16;
  double a = s->skind == TPU_SCALAR_INT ? (double)s->i : s->f, b = e->skind == TPU_SCALAR_INT ? (double)e->i : e->f;
  if (!flt && !log)
    a = trunc(a), b = trunc(b);
  else if (dt == TPU_F32)
    a = (float)a, b = (float)b;
  /* f32 working values for half types (rounded to them after every
   * operation), f64 otherwise */
  tpu_hlo_type t = tpu_hlo_type_make(half ? TPU_F32 : TPU_F64, 1, &n);
  tpu_hv v = tpu_lower_full(L, t, a);
  if (half) v = tpu_round_to(L, v, dt);
  if (n > 1) {
    tpu_hv i = tpu_hlo_iota(H, t, 0), j = tpu_sub(L, tpu_lower_full(L, t, (double)(n - 1)), i);
    tpu_hv first = tpu_hlo_compare(H, TPU_HLO_LT, i, tpu_lower_full(L, t, (double)(n / 2)));
    tpu_hv up, down;
    if (half) {
      tpu_hv ah = v, bh = tpu_round_to(L, tpu_lower_full(L, t, b), dt);
      tpu_hv st = tpu_round_to(L,
                               tpu_hlo_binary(H, TPU_HLO_DIV, tpu_round_to(L, tpu_sub(L, bh, ah), dt),
                                              tpu_round_to(L, tpu_lower_full(L, t, (double)(n - 1)), dt)),
                               dt);
      up = tpu_round_to(L, tpu_add(L, ah, tpu_round_to(L, tpu_mul(L, st, tpu_round_to(L, i, dt)), dt)), dt);
      down = tpu_round_to(L, tpu_sub(L, bh, tpu_round_to(L, tpu_mul(L, st, tpu_round_to(L, j, dt)), dt)), dt);
    } else if (dt == TPU_F32) { /* products of an f32 step and small integers are exact in f64 */
      tpu_hv st = tpu_lower_full(L, t, (double)(((float)b - (float)a) / (float)(n - 1)));
      up = tpu_add(L, v, tpu_mul(L, st, i));
      down = tpu_sub(L, tpu_lower_full(L, t, b), tpu_mul(L, st, j));
    } else {
      double step = (b - a) / (double)(n - 1);
      up = tpu_fma_f64(L, v, step, i);
      down = tpu_fma_f64(L, tpu_lower_full(L, t, b), -step, j);
    }
    v = tpu_hlo_select(H, first, up, down);
  }
  if (dt == TPU_F32) v = tpu_hlo_convert(H, v, TPU_F32);
  if (log) v = tpu_hlo_binary(H, TPU_HLO_POW, tpu_lower_full(L, *T(L, v), base), v);
  tpu_lower_out(L, tpu_hlo_convert(H, v, dt));
}
void tpu_emit_linspace(tpu_lower *L) { tpu_emit_space(L, false); }
void tpu_emit_logspace(tpu_lower *L) { tpu_emit_space(L, true); }

/* ---- random --------------------------------------------------------------------------------- */

static tpu_hv tpu_normal_values(tpu_lower *L, tpu_dtype dt, int rank, const int64_t *dims) {
  /* Box-Muller in f32 (f64 for f64 tensors): sqrt(-2 log(1 - u1)) cos(2 pi u2) */
  tpu_dtype w = dt == TPU_F64 ? TPU_F64 : TPU_F32;
  tpu_hv u1 = tpu_lower_uniform(L, w, rank, dims), u2 = tpu_lower_uniform(L, w, rank, dims);
  tpu_hv r = tpu_hlo_unary(
      H, TPU_HLO_SQRT, tpu_mul(L, tpu_k(L, u1, -2), tpu_hlo_unary(H, TPU_HLO_LOG, tpu_sub(L, tpu_k(L, u1, 1), u1))));
  tpu_hv z = tpu_mul(L, r, tpu_hlo_unary(H, TPU_HLO_COS, tpu_mul(L, u2, tpu_k(L, u2, 6.283185307179586))));
  return z;
}

static void tpu_need_float(tpu_lower *L, const char *op) {
  if (!tpu_dtype_is_float(L->args[0].t.dtype))
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"%s\" not implemented for '%s'", op, tpu_dtype_name(L->args[0].t.dtype));
}

/* normal_(self, mean=0, std=1, *, generator) */
void tpu_emit_normal(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_need_float(L, "normal_kernel_cpu");
  if (L->args[2].f < 0) tpu_lower_fail(L, TPU_ERR_RUNTIME, "normal expects std >= 0.0, but found std %g", L->args[2].f);
  tpu_hv z = tpu_normal_values(L, t->dtype, t->rank, t->sizes);
  z = tpu_add(L, tpu_mul(L, z, tpu_k(L, z, L->args[2].f)), tpu_k(L, z, L->args[1].f));
  tpu_lower_write(L, 0, -1, z);
  tpu_lower_return_arg(L, 0, -1);
}

/* uniform_(self, from=0, to=1, *, generator) */
void tpu_emit_uniform(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_need_float(L, "uniform_kernel_cpu");
  tpu_dtype w = t->dtype == TPU_F64 ? TPU_F64 : TPU_F32;
  tpu_hv u = tpu_lower_uniform(L, w, t->rank, t->sizes);
  double lo = L->args[1].f, hi = L->args[2].f;
  u = tpu_add(L, tpu_mul(L, u, tpu_k(L, u, hi - lo)), tpu_k(L, u, lo));
  tpu_lower_write(L, 0, -1, u);
  tpu_lower_return_arg(L, 0, -1);
}

/* bernoulli_.float(self, p=0.5, *, generator) */
void tpu_emit_bernoulli(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv u = tpu_lower_uniform(L, TPU_F32, t->rank, t->sizes);
  tpu_lower_write(L, 0, -1, tpu_hlo_compare(H, TPU_HLO_LT, u, tpu_k(L, u, L->args[1].f)));
  tpu_lower_return_arg(L, 0, -1);
}

/* native_dropout(input, p, train) -> (output, mask) */
void tpu_emit_native_dropout(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double p = L->args[1].f;
  bool train = L->args[2].kind != TPU_ARG_BOOL || L->args[2].i;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (!train || p == 0) {
    tpu_lower_out(L, x);
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_PRED, t->rank, t->sizes), 1));
    return;
  }
  tpu_hv u = tpu_lower_uniform(L, TPU_F32, t->rank, t->sizes);
  tpu_hv keep = tpu_hlo_compare(H, TPU_HLO_LT, u, tpu_k(L, u, 1.0 - p));
  tpu_hv scale = tpu_k(L, x, p >= 1 ? 0.0 : 1.0 / (1.0 - p));
  tpu_lower_out(L, tpu_hlo_select(H, keep, tpu_mul(L, x, scale), tpu_k(L, x, 0)));
  tpu_lower_out(L, keep);
}

/* native_dropout_backward(grad_output, mask, scale) */
void tpu_emit_native_dropout_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[0].t.dtype;
  tpu_hv g = tpu_lower_tensor(L, 0, -1);
  tpu_hv m = tpu_hlo_convert(H, tpu_lower_input(L, 1, TPU_PRED), dt);
  tpu_lower_out(L, tpu_mul(L, tpu_lower_binary(L, TPU_HLO_MUL, g, m), tpu_k(L, g, L->args[2].f)));
}

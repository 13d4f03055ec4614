/* emit_linalg.c: the linalg family beyond the first matmuls.
 *
 * Products (baddbmm, addbmm, addmv, vdot, cross) are dot_general with f32
 * accumulation for half types, as torch's CPU kernels compute them.
 * Factorizations work on batches of matrices [..., m, n]: Cholesky and
 * triangular solves are the StableHLO ops of the same names; LU is a
 * partial-pivoting elimination written as a stablehlo.while over columns that
 * picks the pivot LAPACK picks (largest magnitude, first on ties), so LU,
 * pivots, solutions, inverses and determinants agree with PyTorch's CPU
 * results, not only up to rounding of a different factorization. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emit.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static bool tpu_has(tpu_lower *L, int i, tpu_argkind k) { return i < L->nargs && L->args[i].kind == k; }

static bool tpu_bool_arg(tpu_lower *L, int i, bool dflt) {
  if (tpu_has(L, i, TPU_ARG_BOOL)) return L->args[i].i != 0;
  return dflt;
}

/* Elements [i, i+1) of x along dim, that dim dropped. */
static tpu_hv tpu_take1(tpu_lower *L, tpu_hv x, int dim, int64_t i) {
  const tpu_hlo_type *t = T(L, x);
  int64_t st[TPU_MAX_RANK], lim[TPU_MAX_RANK], one[TPU_MAX_RANK], dims[TPU_MAX_RANK];
  int r = t->rank, k = 0;
  for (int d = 0; d < r; d++) {
    st[d] = d == dim ? i : 0;
    lim[d] = d == dim ? i + 1 : t->dims[d];
    one[d] = 1;
    if (d != dim) dims[k++] = t->dims[d];
  }
  return tpu_hlo_reshape(H, tpu_hlo_slice(H, x, st, lim, one), k, dims);
}

/* beta * self + alpha * prod with torch's rule that beta == 0 ignores self
 * (NaN in self does not propagate). Scalars are program inputs. */
static tpu_hv tpu_scaled_sum(tpu_lower *L, int self_arg, tpu_hv prod, int beta_arg, int alpha_arg, tpu_dtype dt) {
  const tpu_hlo_type *pt = T(L, prod);
  int rank = pt->rank;
  int64_t dims[TPU_MAX_RANK];
  memcpy(dims, pt->dims, sizeof(int64_t) * (size_t)rank);
  tpu_hv p = prod;
  if (tpu_has(L, alpha_arg, TPU_ARG_SCALAR) && !L->args[alpha_arg].is_default)
    p = tpu_lower_binary(L, TPU_HLO_MUL, p, tpu_lower_scalar(L, alpha_arg, dt));
  tpu_hv s = tpu_lower_broadcast_to(L, tpu_lower_input(L, self_arg, dt), rank, dims);
  if (tpu_has(L, beta_arg, TPU_ARG_SCALAR) && !L->args[beta_arg].is_default) {
    tpu_hv b = tpu_lower_scalar(L, beta_arg, dt);
    tpu_hv bs = tpu_lower_binary(L, TPU_HLO_MUL, s, b);
    tpu_hv z = tpu_hlo_compare(H, TPU_HLO_EQ, b, tpu_hlo_constant(H, dt, 0));
    s = tpu_hlo_select(H, tpu_lower_broadcast_to(L, z, rank, dims), tpu_k(L, bs, 0), bs);
  }
  return tpu_hlo_binary(H, TPU_HLO_ADD, s, p);
}

static bool tpu_same_dtype(tpu_lower *L, int a, int b, const char *what) {
  if (L->args[a].t.dtype != L->args[b].t.dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: expected %s to have the same dtype, but got: %s != %s", L->opname, what,
                   tpu_dtype_name(L->args[a].t.dtype), tpu_dtype_name(L->args[b].t.dtype));
    return false;
  }
  return true;
}

/* ---- products ---------------------------------------------------------------------------- */

/* baddbmm(self, batch1, batch2, *, beta, alpha) and addbmm (sum over the batch). */
static void tpu_emit_bmm_add(tpu_lower *L, bool reduce_batch) {
  if (!tpu_same_dtype(L, 1, 2, "batch1 and batch2")) return;
  tpu_tref *a = &L->args[1].t, *b = &L->args[2].t;
  if (a->rank != 3 || b->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "batch1 must be a 3D tensor");
    return;
  }
  if (a->sizes[0] != b->sizes[0] || a->sizes[2] != b->sizes[1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected size for first two dimensions of batch2 tensor to be: [%lld, %lld] but got: [%lld, %lld].",
                   (long long)a->sizes[0], (long long)a->sizes[2], (long long)b->sizes[0], (long long)b->sizes[1]);
    return;
  }
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_tensor(L, 1, -1), y = tpu_lower_tensor(L, 2, -1);
  tpu_hv p;
  if (reduce_batch) {
    int64_t lc[2] = {0, 2}, rc[2] = {0, 1};
    p = tpu_hlo_dot_general(H, x, y, 0, NULL, NULL, 2, lc, rc, TPU_HLO_PREC_HIGHEST, acc);
  } else {
    int64_t z = 0, lc = 2, rc = 1;
    p = tpu_hlo_dot_general(H, x, y, 1, &z, &z, 1, &lc, &rc, TPU_HLO_PREC_HIGHEST, acc);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_scaled_sum(L, 0, p, 3, 4, acc), dt));
}
void tpu_emit_baddbmm(tpu_lower *L) { tpu_emit_bmm_add(L, false); }
void tpu_emit_addbmm(tpu_lower *L) { tpu_emit_bmm_add(L, true); }

/* addmv(self, mat, vec, *, beta, alpha) */
void tpu_emit_addmv(tpu_lower *L) {
  if (!tpu_same_dtype(L, 1, 2, "mat and vec")) return;
  tpu_tref *m = &L->args[1].t, *v = &L->args[2].t;
  if (m->rank != 2 || v->rank != 1 || m->sizes[1] != v->sizes[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "size mismatch, got input (%lld), mat (%lldx%lld), vec (%lld)",
                   (long long)(L->args[0].t.rank ? L->args[0].t.sizes[0] : 1), (long long)(m->rank > 0 ? m->sizes[0] : 0),
                   (long long)(m->rank > 1 ? m->sizes[1] : 0), (long long)(v->rank > 0 ? v->sizes[0] : 0));
    return;
  }
  tpu_dtype dt = m->dtype, acc = tpu_acc_type(dt);
  int64_t lc = 1, rc = 0;
  tpu_hv p = tpu_hlo_dot_general(H, tpu_lower_tensor(L, 1, -1), tpu_lower_tensor(L, 2, -1), 0, NULL, NULL, 1, &lc, &rc,
                                 TPU_HLO_PREC_HIGHEST, acc);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_scaled_sum(L, 0, p, 3, 4, acc), dt));
}

/* vdot(self, other): dot of 1-d tensors (real dtypes: no conjugation to do). */
void tpu_emit_vdot(tpu_lower *L) {
  tpu_tref *a = &L->args[0].t, *b = &L->args[1].t;
  if (a->rank != 1 || b->rank != 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "1D tensors expected, but got %dD and %dD tensors", a->rank, b->rank);
    return;
  }
  if (a->dtype != b->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected both vectors to have same dtype, but found %s and %s",
                   tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype));
    return;
  }
  if (a->sizes[0] != b->sizes[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "inconsistent tensor size, expected tensor [%lld] and src [%lld] to have the same number of elements, but got %lld and %lld elements respectively",
                   (long long)a->sizes[0], (long long)b->sizes[0], (long long)a->sizes[0], (long long)b->sizes[0]);
    return;
  }
  if (tpu_dtype_is_complex(a->dtype)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "vdot: complex tensors are not supported on tpu yet");
    return;
  }
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  int64_t lc = 0, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(H, tpu_lower_tensor(L, 0, -1), tpu_lower_tensor(L, 1, -1), 0, NULL, NULL, 1, &lc, &rc,
                                 TPU_HLO_PREC_HIGHEST, acc);
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* linalg_cross(self, other, *, dim=-1): broadcast, then the 3-vector cross product along dim. */
void tpu_emit_linalg_cross(tpu_lower *L) {
  tpu_tref *a = &L->args[0].t, *b = &L->args[1].t;
  if (a->rank != b->rank) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.cross: inputs must have the same number of dimensions.");
    return;
  }
  if (a->dtype != b->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.cross: expected input and other to have the same dtype, but got %s and %s",
                   tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype));
    return;
  }
  int64_t dim = tpu_lower_dim(L, tpu_has(L, 2, TPU_ARG_INT) ? L->args[2].i : -1, a->rank);
  if (!tpu_hlo_ok(H)) return;
  if (a->sizes[dim] != 3 || b->sizes[dim] != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.cross: inputs dimension %lld must have length 3. Got %lld and %lld",
                   (long long)dim, (long long)a->sizes[dim], (long long)b->sizes[dim]);
    return;
  }
  tpu_dtype dt = a->dtype;
  tpu_hv v[2] = {tpu_lower_tensor(L, 0, -1), tpu_lower_tensor(L, 1, -1)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv x[3], y[3], z[3];
  for (int i = 0; i < 3; i++) {
    x[i] = tpu_take1(L, v[0], (int)dim, i);
    y[i] = tpu_take1(L, v[1], (int)dim, i);
  }
  for (int i = 0; i < 3; i++) {
    int j = (i + 1) % 3, k = (i + 2) % 3;
    z[i] = tpu_sub(L, tpu_mul(L, x[j], y[k]), tpu_mul(L, x[k], y[j]));
  }
  /* put dim back: stack the three components along it */
  const tpu_hlo_type *ct = T(L, z[0]);
  int64_t dims[TPU_MAX_RANK];
  int r = ct->rank + 1;
  for (int d = 0, k = 0; d < r; d++) dims[d] = d == dim ? 1 : ct->dims[k++];
  for (int i = 0; i < 3; i++) z[i] = tpu_hlo_reshape(H, z[i], r, dims);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_concat(H, z, 3, (int)dim), dt));
}

/* eye.out(n, *, out), eye.m_out(n, m, *, out): the identity in out's dtype. */
void tpu_emit_eye_out(tpu_lower *L) {
  int64_t n = L->args[0].i, m = tpu_has(L, 1, TPU_ARG_INT) ? L->args[1].i : n;
  if (n < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "n must be greater or equal to 0, got %lld", (long long)n);
    return;
  }
  if (m < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "m must be greater or equal to 0, got %lld", (long long)m);
    return;
  }
  tpu_dtype dt = L->args[L->nargs - 1].t.dtype;
  int64_t dims[2] = {n, m};
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, 2, dims);
  tpu_hv eq = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, it, 0), tpu_hlo_iota(H, it, 1));
  tpu_lower_out(L, tpu_hlo_convert(H, eq, dt));
}

/* ---- matrix helpers ------------------------------------------------------------------------ */

/* x with its last two dims swapped. */
static tpu_hv tpu_mT(tpu_lower *L, tpu_hv x) {
  const tpu_hlo_type *t = T(L, x);
  int64_t perm[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) perm[i] = i;
  if (t->rank < 2) return x;
  perm[t->rank - 2] = t->rank - 1;
  perm[t->rank - 1] = t->rank - 2;
  return tpu_hlo_transpose(H, x, perm);
}

/* [..., m, k] @ [..., k, n] with equal batch dims. */
static tpu_hv tpu_bmatmul(tpu_lower *L, tpu_hv a, tpu_hv b) {
  const tpu_hlo_type *t = T(L, a);
  int r = t->rank;
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < r - 2; i++) bd[i] = i;
  int64_t lc = r - 1, rc = r - 2;
  tpu_dtype dt = t->dtype;
  tpu_hv p = tpu_hlo_dot_general(H, a, b, r - 2, bd, bd, 1, &lc, &rc, TPU_HLO_PREC_HIGHEST, tpu_acc_type(dt));
  return tpu_hlo_convert(H, p, dt);
}

/* Mask of the lower (row >= col + k) or upper (row <= col - k... i.e. col >= row + k)
 * triangle of shape t's last two dims, broadcast to t. */
static tpu_hv tpu_tri_mask(tpu_lower *L, const tpu_hlo_type *t, bool lower, int64_t k) {
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, t->rank, t->dims);
  tpu_hv row = tpu_hlo_iota(H, it, t->rank - 2), col = tpu_hlo_iota(H, it, t->rank - 1);
  tpu_hv kk = tpu_lower_full(L, it, (double)k);
  return lower ? tpu_hlo_compare(H, TPU_HLO_GE, row, tpu_add(L, col, kk))
               : tpu_hlo_compare(H, TPU_HLO_GE, col, tpu_add(L, row, kk));
}

/* x with everything outside the triangle set to zero (diag included). */
static tpu_hv tpu_tri(tpu_lower *L, tpu_hv x, bool lower) {
  return tpu_hlo_select(H, tpu_tri_mask(L, T(L, x), lower, 0), x, tpu_k(L, x, 0));
}

/* The identity of x's type (last two dims), broadcast over its batch. */
static tpu_hv tpu_eye_like(tpu_lower *L, const tpu_hlo_type *t) {
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, t->rank, t->dims);
  tpu_hv eq = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, it, t->rank - 2), tpu_hlo_iota(H, it, t->rank - 1));
  return tpu_hlo_convert(H, eq, t->dtype);
}

static int64_t tpu_numel_t(const tpu_hlo_type *t) { return tpu_hlo_type_numel(t); }

/* Broadcast the batch dims (all but the last two) of a and b to their common shape. */
static bool tpu_batch_bcast(tpu_lower *L, tpu_hv *a, tpu_hv *b) {
  const tpu_hlo_type *at = T(L, *a), *bt = T(L, *b);
  if (at->dtype == TPU_INVALID || bt->dtype == TPU_INVALID) return false;
  int na = at->rank - 2, nb = bt->rank - 2, n = na > nb ? na : nb;
  int64_t d[TPU_MAX_RANK];
  for (int i = 0; i < n; i++) {
    int ia = i - (n - na), ib = i - (n - nb);
    int64_t x = ia >= 0 ? at->dims[ia] : 1, y = ib >= 0 ? bt->dims[ib] : 1;
    if (x != y && x != 1 && y != 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: the batch dimensions of the inputs are not broadcastable", L->opname);
      return false;
    }
    d[i] = x == 1 ? y : x;
  }
  int64_t da[TPU_MAX_RANK], db[TPU_MAX_RANK];
  memcpy(da, d, sizeof(int64_t) * (size_t)n);
  memcpy(db, d, sizeof(int64_t) * (size_t)n);
  da[n] = at->dims[na];
  da[n + 1] = at->dims[na + 1];
  db[n] = bt->dims[nb];
  db[n + 1] = bt->dims[nb + 1];
  *a = tpu_lower_broadcast_to(L, *a, n + 2, da);
  *b = tpu_lower_broadcast_to(L, *b, n + 2, db);
  return tpu_hlo_ok(H);
}

/* stablehlo.triangular_solve: op(a) x = b (left) or x op(a) = b, with
 * op = transpose when trans; a and b share batch dims. */
static tpu_hv tpu_trisolve(tpu_lower *L, tpu_hv a, tpu_hv b, bool left, bool lower, bool unit, bool trans) {
  const tpu_hlo_type *bt = T(L, b);
  if (bt->dtype == TPU_INVALID) return TPU_HV_NONE;
  tpu_hlo_type rt = *bt;
  if (tpu_numel_t(&rt) == 0 || tpu_numel_t(T(L, a)) == 0) return tpu_lower_full(L, rt, 0);
  char attrs[256];
  snprintf(attrs, sizeof attrs,
           "left_side = %s, lower = %s, unit_diagonal = %s, transpose_a = #stablehlo<transpose %s>",
           left ? "true" : "false", lower ? "true" : "false", unit ? "true" : "false", trans ? "TRANSPOSE" : "NO_TRANSPOSE");
  tpu_hv ops[2] = {a, b};
  return tpu_hlo_emit1(H, "stablehlo.triangular_solve", ops, 2, attrs, rt);
}

/* Lower Cholesky factor of the (lower triangle of) a; NaNs where a is not positive definite. */
static tpu_hv tpu_chol_lower(tpu_lower *L, tpu_hv a) {
  const tpu_hlo_type *t = T(L, a);
  if (t->dtype == TPU_INVALID) return TPU_HV_NONE;
  if (tpu_numel_t(t) == 0) return a;
  tpu_hv c = tpu_hlo_emit1(H, "stablehlo.cholesky", &a, 1, "lower = true", *t);
  return tpu_tri(L, c, true);
}

/* A float matrix stack argument (rank >= 2, square when asked). */
static bool tpu_check_matrix(tpu_lower *L, int i, bool square, const char *fn) {
  tpu_tref *t = &L->args[i].t;
  if (t->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: The input tensor %s must have at least 2 dimensions.", fn, i == 0 ? "A" : "B");
    return false;
  }
  if (square && t->sizes[t->rank - 1] != t->sizes[t->rank - 2]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: A must be batches of square matrices, but they are %lld by %lld matrices", fn,
                   (long long)t->sizes[t->rank - 2], (long long)t->sizes[t->rank - 1]);
    return false;
  }
  if (t->dtype != TPU_F32 && t->dtype != TPU_F64) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: Expected a floating point or complex tensor as input. Got %s", fn,
                   tpu_dtype_name(t->dtype));
    return false;
  }
  return true;
}

/* ---- Cholesky and triangular solves ----------------------------------------------------------- */

/* info: 0, or the 1-based order of the first leading minor that is not
 * positive definite (the first NaN or non-positive diagonal entry of the
 * factor: XLA's factor turns NaN from there on). Int32 of the batch shape. */
static tpu_hv tpu_chol_info(tpu_lower *L, tpu_hv c) {
  const tpu_hlo_type *t = T(L, c);
  if (t->dtype == TPU_INVALID) return TPU_HV_NONE;
  int r = t->rank;
  int64_t n = t->dims[r - 1];
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, r, t->dims);
  tpu_hv row = tpu_hlo_iota(H, it, r - 2), col = tpu_hlo_iota(H, it, r - 1);
  tpu_hv diag = tpu_hlo_compare(H, TPU_HLO_EQ, row, col);
  tpu_hv notpos = tpu_hlo_unary(H, TPU_HLO_NOT, tpu_hlo_compare(H, TPU_HLO_GT, c, tpu_k(L, c, 0)));
  tpu_hv bad = tpu_hlo_binary(H, TPU_HLO_AND, diag, notpos);
  tpu_hv big = tpu_lower_full(L, it, (double)(n + 1));
  tpu_hv idx = tpu_hlo_select(H, bad, tpu_add(L, col, tpu_lower_full(L, it, 1)), big);
  int64_t rd[2] = {r - 2, r - 1};
  tpu_hv m = tpu_hlo_reduce(H, idx, tpu_hlo_constant_int(H, TPU_S64, n + 1), rd, 2, TPU_HLO_MIN);
  tpu_hv none = tpu_hlo_compare(H, TPU_HLO_EQ, m, tpu_k(L, m, (double)(n + 1)));
  m = tpu_hlo_select(H, none, tpu_k(L, m, 0), m);
  return tpu_hlo_convert(H, m, TPU_S32);
}

/* linalg_cholesky_ex.L(self, *, upper, check_errors, L, info) */
void tpu_emit_linalg_cholesky_ex(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.cholesky")) return;
  bool upper = tpu_bool_arg(L, 1, false);
  tpu_hv a = tpu_lower_tensor(L, 0, -1);
  tpu_hv c = tpu_chol_lower(L, a);
  tpu_hv info = tpu_chol_info(L, c);
  tpu_lower_out(L, upper ? tpu_mT(L, c) : c);
  tpu_lower_out(L, info);
}

/* cholesky(self, upper=False): the factor (upper: U with A = U^T U) */
void tpu_emit_cholesky(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "cholesky")) return;
  bool upper = tpu_bool_arg(L, 1, false);
  tpu_hv c = tpu_chol_lower(L, tpu_lower_tensor(L, 0, -1));
  tpu_lower_out(L, upper ? tpu_mT(L, c) : c);
}

/* _cholesky_solve_helper(self=B, A=factor, upper): solve (F F^T) X = B with F
 * lower (or F^T F with F upper). Batch dims are broadcast by the caller. */
void tpu_emit_cholesky_solve_helper(tpu_lower *L) {
  bool upper = tpu_bool_arg(L, 2, false);
  tpu_hv b = tpu_lower_tensor(L, 0, -1), f = tpu_lower_tensor(L, 1, -1);
  if (!tpu_batch_bcast(L, &f, &b)) return;
  tpu_hv y, x;
  if (!upper) {
    y = tpu_trisolve(L, f, b, true, true, false, false);
    x = tpu_trisolve(L, f, y, true, true, false, true);
  } else {
    y = tpu_trisolve(L, f, b, true, false, false, true);
    x = tpu_trisolve(L, f, y, true, false, false, false);
  }
  tpu_lower_out(L, x);
}

/* cholesky_inverse(self=factor, upper): (F F^T)^-1 */
void tpu_emit_cholesky_inverse(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "cholesky_inverse")) return;
  bool upper = tpu_bool_arg(L, 1, false);
  tpu_hv f = tpu_lower_tensor(L, 0, -1);
  tpu_hv id = tpu_eye_like(L, T(L, f));
  tpu_hv fi = tpu_trisolve(L, f, id, true, !upper, false, false); /* F^-1 */
  /* lower: (F F^T)^-1 = F^-T F^-1; upper: (F^T F)^-1 = F^-1 F^-T */
  tpu_lower_out(L, upper ? tpu_bmatmul(L, fi, tpu_mT(L, fi)) : tpu_bmatmul(L, tpu_mT(L, fi), fi));
}

/* triangular_solve.X(self=B, A, upper, transpose, unitriangular, *, X, M) */
void tpu_emit_triangular_solve(tpu_lower *L) {
  tpu_tref *bt = &L->args[0].t, *at = &L->args[1].t;
  if (bt->rank < 2 || at->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.triangular_solve: Expected b to have at least 2 dimensions, but it has %d dimensions instead", bt->rank);
    return;
  }
  if (!tpu_check_matrix(L, 1, true, "torch.triangular_solve")) return;
  if (bt->dtype != at->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected b and A to have the same dtype, but found b of type %s and A of type %s instead.",
                   tpu_dtype_name(bt->dtype), tpu_dtype_name(at->dtype));
    return;
  }
  if (bt->sizes[bt->rank - 2] != at->sizes[at->rank - 1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Incompatible matrix sizes for triangular_solve: each A matrix is %lld by %lld but each b matrix is %lld by %lld",
                   (long long)at->sizes[at->rank - 2], (long long)at->sizes[at->rank - 1],
                   (long long)bt->sizes[bt->rank - 2], (long long)bt->sizes[bt->rank - 1]);
    return;
  }
  bool upper = tpu_bool_arg(L, 2, true), trans = tpu_bool_arg(L, 3, false), unit = tpu_bool_arg(L, 4, false);
  tpu_hv b = tpu_lower_tensor(L, 0, -1), a = tpu_lower_tensor(L, 1, -1);
  if (!tpu_batch_bcast(L, &a, &b)) return;
  tpu_lower_out(L, tpu_trisolve(L, a, b, true, !upper, unit, trans));
  tpu_lower_out(L, a);
}

/* linalg_solve_triangular(self=A, B, *, upper, left=True, unitriangular=False) */
void tpu_emit_linalg_solve_triangular(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.solve_triangular")) return;
  tpu_tref *at = &L->args[0].t, *bt = &L->args[1].t;
  if (bt->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.solve_triangular: The input tensor B must have at least 2 dimensions.");
    return;
  }
  if (bt->dtype != at->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.solve_triangular: Expected A and B to have the same dtype, but found A of type %s and B of type %s instead",
                   tpu_dtype_name(at->dtype), tpu_dtype_name(bt->dtype));
    return;
  }
  bool upper = tpu_bool_arg(L, 2, false), left = tpu_bool_arg(L, 3, true), unit = tpu_bool_arg(L, 4, false);
  int64_t n = at->sizes[at->rank - 1], k = left ? bt->sizes[bt->rank - 2] : bt->sizes[bt->rank - 1];
  if (n != k) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.solve_triangular: Incompatible shapes of A and B for the equation %s (%lldx%lld and %lldx%lld)",
                   left ? "AX = B" : "XA = B", (long long)at->sizes[at->rank - 2], (long long)n,
                   (long long)bt->sizes[bt->rank - 2], (long long)bt->sizes[bt->rank - 1]);
    return;
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  if (!tpu_batch_bcast(L, &a, &b)) return;
  tpu_lower_out(L, tpu_trisolve(L, a, b, left, !upper, unit, false));
}

/* emit_linalg.c: the linalg family: factorizations and solvers (Cholesky,
 * triangular solves, LU, determinants, QR, eigh, least squares, LDL^T),
 * matrix_exp and cross; emit_eig.c and emit_svd.c hold eig and the SVD.
 *
 * Factorizations work on batches of matrices [..., m, n]: Cholesky and
 * triangular solves are the StableHLO ops of the same names; LU is a
 * partial-pivoting elimination written as a stablehlo.while over columns that
 * picks the pivot LAPACK picks (largest magnitude, first on ties), so LU,
 * pivots, solutions, inverses and determinants agree with PyTorch's CPU
 * results, not only up to rounding of a different factorization. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "linalg.h"

/* ---- helpers ------------------------------------------------------------------------------ */

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

/* ---- cross product -------------------------------------------------------------------------- */

/* linalg_cross(self, other, *, dim=-1): broadcast, then the 3-vector cross product along dim. */
void tpu_emit_linalg_cross(tpu_lower *L) {
  tpu_tref *a = &L->args[0].t, *b = &L->args[1].t;
  if (a->rank != b->rank) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.cross: inputs must have the same number of dimensions.");
    return;
  }
  if (a->dtype != b->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "linalg.cross: expected input and other to have the same dtype, but got %s and %s",
                   tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype));
    return;
  }
  int64_t dim = tpu_lower_dim(L, tpu_arg_is(L, 2, TPU_ARG_INT) ? L->args[2].i : -1, a->rank);
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

/* ---- matrix helpers ------------------------------------------------------------------------ */

/* x with its last two dims swapped. */
tpu_hv tpu_mT(tpu_lower *L, tpu_hv x) {
  const tpu_hlo_type *t = T(L, x);
  int64_t perm[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) perm[i] = i;
  if (t->rank < 2) return x;
  perm[t->rank - 2] = t->rank - 1;
  perm[t->rank - 1] = t->rank - 2;
  return tpu_hlo_transpose(H, x, perm);
}

/* [..., m, k] @ [..., k, n] with equal batch dims. */
tpu_hv tpu_bmatmul(tpu_lower *L, tpu_hv a, tpu_hv b) {
  const tpu_hlo_type *t = T(L, a);
  int r = t->rank;
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < r - 2; i++) bd[i] = i;
  int64_t lc = r - 1, rc = r - 2;
  tpu_dtype dt = t->dtype;
  tpu_hv p = tpu_hlo_dot_general(H, a, b, r - 2, bd, bd, 1, &lc, &rc, L->precision, tpu_acc_type(dt));
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
tpu_hv tpu_eye_like(tpu_lower *L, const tpu_hlo_type *t) {
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, t->rank, t->dims);
  tpu_hv eq = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, it, t->rank - 2), tpu_hlo_iota(H, it, t->rank - 1));
  return tpu_hlo_convert(H, eq, t->dtype);
}

/* Broadcast the batch dims (all but the last two) of a and b to their common shape. */
bool tpu_batch_bcast(tpu_lower *L, tpu_hv *a, tpu_hv *b) {
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
  if (tpu_hlo_type_numel(&rt) == 0 || tpu_hlo_type_numel(T(L, a)) == 0) return tpu_lower_full(L, rt, 0);
  char attrs[256];
  snprintf(
      attrs, sizeof attrs, "left_side = %s, lower = %s, unit_diagonal = %s, transpose_a = #stablehlo<transpose %s>",
      left ? "true" : "false", lower ? "true" : "false", unit ? "true" : "false", trans ? "TRANSPOSE" : "NO_TRANSPOSE");
  tpu_hv ops[2] = {a, b};
  return tpu_hlo_emit1(H, "stablehlo.triangular_solve", ops, 2, attrs, rt);
}

/* Lower Cholesky factor of the (lower triangle of) a; NaNs where a is not positive definite. */
static tpu_hv tpu_chol_lower(tpu_lower *L, tpu_hv a) {
  const tpu_hlo_type *t = T(L, a);
  if (t->dtype == TPU_INVALID) return TPU_HV_NONE;
  if (tpu_hlo_type_numel(t) == 0) return a;
  tpu_hv c = tpu_hlo_emit1(H, "stablehlo.cholesky", &a, 1, "lower = true", *t);
  return tpu_tri(L, c, true);
}

/* A float matrix stack argument (rank >= 2, square when asked); half types
 * too where halves (matrix_exp, which torch's CPU kernel takes in every
 * floating type). */
static bool tpu_check_matrix_of(tpu_lower *L, int i, bool square, const char *fn, bool halves) {
  tpu_tref *t = &L->args[i].t;
  if (t->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: The input tensor %s must have at least 2 dimensions.", fn,
                   i == 0 ? "A" : "B");
    return false;
  }
  if (square && t->sizes[t->rank - 1] != t->sizes[t->rank - 2]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: A must be batches of square matrices, but they are %lld by %lld matrices",
                   fn, (long long)t->sizes[t->rank - 2], (long long)t->sizes[t->rank - 1]);
    return false;
  }
  if (halves && (t->dtype == TPU_BF16 || t->dtype == TPU_F16)) return true;
  if (t->dtype != TPU_F32 && t->dtype != TPU_F64 && !(tpu_dtype_is_complex(t->dtype) && !strcmp(fn, "linalg.solve"))) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: Expected a floating point or complex tensor as input. Got %s", fn,
                   tpu_dtype_c10_name(t->dtype));
    return false;
  }
  return true;
}

bool tpu_check_matrix(tpu_lower *L, int i, bool square, const char *fn) {
  return tpu_check_matrix_of(L, i, square, fn, false);
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
  bool upper = tpu_arg_bool_or(L, 1, false);
  tpu_hv a = tpu_lower_tensor(L, 0, -1);
  tpu_hv c = tpu_chol_lower(L, a);
  tpu_hv info = tpu_chol_info(L, c);
  tpu_lower_out(L, upper ? tpu_mT(L, c) : c);
  tpu_lower_out(L, info);
}

/* cholesky(self, upper=False): the factor (upper: U with A = U^T U) */
void tpu_emit_cholesky(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "cholesky")) return;
  bool upper = tpu_arg_bool_or(L, 1, false);
  tpu_hv c = tpu_chol_lower(L, tpu_lower_tensor(L, 0, -1));
  tpu_lower_out(L, upper ? tpu_mT(L, c) : c);
}

/* _cholesky_solve_helper(self=B, A=factor, upper): solve (F F^T) X = B with F
 * lower (or F^T F with F upper). Batch dims are broadcast by the caller. */
void tpu_emit_cholesky_solve_helper(tpu_lower *L) {
  bool upper = tpu_arg_bool_or(L, 2, false);
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
  bool upper = tpu_arg_bool_or(L, 1, false);
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
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.triangular_solve: Expected b to have at least 2 dimensions, but it has %d dimensions instead",
                   bt->rank);
    return;
  }
  if (!tpu_check_matrix(L, 1, true, "torch.triangular_solve")) return;
  if (bt->dtype != at->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected b and A to have the same dtype, but found b of type %s and A of type %s instead.",
                   tpu_dtype_name(bt->dtype), tpu_dtype_name(at->dtype));
    return;
  }
  if (bt->sizes[bt->rank - 2] != at->sizes[at->rank - 1]) {
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "Incompatible matrix sizes for triangular_solve: each A matrix is %lld by %lld but each b matrix is %lld by %lld",
        (long long)at->sizes[at->rank - 2], (long long)at->sizes[at->rank - 1], (long long)bt->sizes[bt->rank - 2],
        (long long)bt->sizes[bt->rank - 1]);
    return;
  }
  bool upper = tpu_arg_bool_or(L, 2, true), trans = tpu_arg_bool_or(L, 3, false), unit = tpu_arg_bool_or(L, 4, false);
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
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "linalg.solve_triangular: Expected A and B to have the same dtype, but found A of type %s and B of type %s instead",
        tpu_dtype_name(at->dtype), tpu_dtype_name(bt->dtype));
    return;
  }
  bool upper = tpu_arg_bool_or(L, 2, false), left = tpu_arg_bool_or(L, 3, true), unit = tpu_arg_bool_or(L, 4, false);
  int64_t n = at->sizes[at->rank - 1], k = left ? bt->sizes[bt->rank - 2] : bt->sizes[bt->rank - 1];
  if (n != k) {
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "linalg.solve_triangular: Incompatible shapes of A and B for the equation %s (%lldx%lld and %lldx%lld)",
        left ? "AX = B" : "XA = B", (long long)at->sizes[at->rank - 2], (long long)n,
        (long long)bt->sizes[bt->rank - 2], (long long)bt->sizes[bt->rank - 1]);
    return;
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  if (!tpu_batch_bcast(L, &a, &b)) return;
  tpu_lower_out(L, tpu_trisolve(L, a, b, left, !upper, unit, false));
}

/* ---- LU with partial pivoting ------------------------------------------------------------------ */

/* stablehlo.while over n carried values; cond and body regions take the
 * carried types (cond returns tensor<i1>, body the carried values). */
static bool tpu_while(tpu_lower *L, const tpu_hv *init, int n, int cond, int body, tpu_hv *outs) {
  tpu_hlo_type ts[16];
  for (int i = 0; i < n; i++) ts[i] = *T(L, init[i]);
  int regions[2] = {cond, body};
  return tpu_hlo_emit(H, "stablehlo.while", init, n, regions, 2, NULL, ts, n, outs);
}

/* A cond region for loops whose carried value 0 is a 0-d s64 counter: counter < limit. */
static int tpu_count_cond(tpu_lower *L, const tpu_hlo_type *ts, int n, int64_t limit) {
  tpu_hv a[16];
  tpu_hlo_region_begin(H, ts, n, a);
  tpu_hv c = tpu_hlo_compare(H, TPU_HLO_LT, a[0], tpu_hlo_constant_int(H, TPU_S64, limit));
  return tpu_hlo_region_end(H, &c, 1);
}

/* 0-d s64 iota-compatible broadcast of a 0-d value to type t's shape (as s64). */
static tpu_hv tpu_bcast0(tpu_lower *L, tpu_hv s, int rank, const int64_t *dims) {
  int64_t none[1] = {0};
  return tpu_hlo_broadcast_in_dim(H, s, rank, dims, none);
}

/* Sum over dim `d` of select(mask, x, 0): picks the masked element exactly. */
static tpu_hv tpu_pick_masked(tpu_lower *L, tpu_hv mask, tpu_hv x, int64_t d) {
  tpu_hv z = tpu_hlo_select(H, mask, x, tpu_k(L, x, 0));
  return tpu_hlo_reduce(H, z, tpu_hlo_constant(H, T(L, x)->dtype, 0), &d, 1, TPU_HLO_ADD);
}

/* x [..., a] -> [..., 1, a] (at = rank-1) or [..., a, 1] (at = rank). */
static tpu_hv tpu_unsq(tpu_lower *L, tpu_hv x, int at) {
  const tpu_hlo_type *t = T(L, x);
  int64_t d[TPU_MAX_RANK];
  int r = t->rank + 1;
  for (int i = 0, k = 0; i < r; i++) d[i] = i == at ? 1 : t->dims[k++];
  return tpu_hlo_reshape(H, x, r, d);
}

typedef struct {
  tpu_hv lu;   /* [..., m, n] */
  tpu_hv piv;  /* s32 [..., k], 1-based as LAPACK */
  tpu_hv perm; /* s32 [..., m]: row i of LU is row perm[i] of A */
  tpu_hv info; /* s32 [...] */
} tpu_lu_res;

/* Gaussian elimination with partial pivoting (pivot: largest |a_ik| over
 * i >= k, the first on ties, as LAPACK's i?amax) of a [..., m, n]; without
 * pivoting when !pivot. info is the first zero pivot (1-based), else 0. */
static tpu_lu_res tpu_lu(tpu_lower *L, tpu_hv a, bool pivot) {
  tpu_lu_res res = {TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE};
  const tpu_hlo_type at = *T(L, a);
  if (at.dtype == TPU_INVALID) return res;
  int r = at.rank, nb = r - 2;
  int64_t m = at.dims[r - 2], n = at.dims[r - 1], kmax = m < n ? m : n;
  tpu_dtype dt = at.dtype;
  int64_t pd[TPU_MAX_RANK], qd[TPU_MAX_RANK];
  memcpy(pd, at.dims, sizeof(int64_t) * (size_t)nb);
  memcpy(qd, at.dims, sizeof(int64_t) * (size_t)nb);
  pd[nb] = kmax;
  qd[nb] = m;
  tpu_hlo_type pt = tpu_hlo_type_make(TPU_S32, nb + 1, pd), qt = tpu_hlo_type_make(TPU_S32, nb + 1, qd);
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S32, nb, at.dims);
  tpu_hv init[5] = {tpu_hlo_constant_int(H, TPU_S64, 0), a, tpu_lower_full(L, pt, 0), tpu_hlo_iota(H, qt, nb),
                    tpu_lower_full(L, it, 0)};
  if (kmax == 0 || tpu_hlo_type_numel(&at) == 0) {
    res.lu = a;
    res.piv = tpu_hlo_convert(H, tpu_add(L, tpu_hlo_iota(H, pt, nb), tpu_lower_full(L, pt, 1)), TPU_S32);
    res.perm = init[3];
    res.info = init[4];
    return res;
  }
  tpu_hlo_type ts[5];
  for (int i = 0; i < 5; i++) ts[i] = *T(L, init[i]);
  int cond = tpu_count_cond(L, ts, 5, kmax);

  tpu_hv v[5];
  tpu_hlo_region_begin(H, ts, 5, v);
  {
    tpu_hv k = v[0], A = v[1], piv = v[2], perm = v[3], info = v[4];
    tpu_hlo_type i64 = tpu_hlo_type_make(TPU_S64, r, at.dims);
    tpu_hv row = tpu_hlo_iota(H, i64, r - 2), col = tpu_hlo_iota(H, i64, r - 1);
    tpu_hv kA = tpu_bcast0(L, k, r, at.dims);
    /* column k: [..., m] */
    tpu_hv colk = tpu_pick_masked(L, tpu_hlo_compare(H, TPU_HLO_EQ, col, kA), A, r - 1);
    tpu_hlo_type rt = tpu_hlo_type_make(TPU_S64, nb + 1, qd);
    tpu_hv rows = tpu_hlo_iota(H, rt, nb);
    tpu_hv kR = tpu_bcast0(L, k, nb + 1, qd);
    int64_t bd0[TPU_MAX_RANK];
    for (int i = 0; i < TPU_MAX_RANK; i++) bd0[i] = i;
    tpu_hv p; /* pivot row, s64 [...] */
    if (pivot) {
      tpu_hv mag =
          tpu_hlo_unary(H, TPU_HLO_ABS, tpu_dtype_is_complex(dt) ? tpu_hlo_unary(H, TPU_HLO_REAL, colk) : colk);
      tpu_hv below = tpu_hlo_compare(H, TPU_HLO_GE, rows, kR);
      if (tpu_dtype_is_complex(dt))
        mag = tpu_add(L, mag,
                      tpu_hlo_unary(H, TPU_HLO_ABS, tpu_hlo_unary(H, TPU_HLO_IMAG, colk))); /* LAPACK's |re|+|im| */
      mag = tpu_hlo_select(H, below, mag, tpu_k(L, mag, -1));
      int64_t d = nb;
      tpu_hv mx = tpu_hlo_reduce(H, mag, tpu_hlo_constant(H, T(L, mag)->dtype, -INFINITY), &d, 1, TPU_HLO_MAX);
      tpu_hv ismx = tpu_hlo_binary(
          H, TPU_HLO_AND, below, tpu_hlo_compare(H, TPU_HLO_EQ, mag, tpu_hlo_broadcast_in_dim(H, mx, nb + 1, qd, bd0)));
      tpu_hv cand = tpu_hlo_select(H, ismx, rows, tpu_lower_full(L, rt, (double)m));
      p = tpu_hlo_reduce(H, cand, tpu_hlo_constant_int(H, TPU_S64, m), &d, 1, TPU_HLO_MIN);
      /* all-NaN column below k: keep row k (LAPACK's amax picks the first) */
      p = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, p, tpu_k(L, p, (double)m)), tpu_bcast0(L, k, nb, at.dims),
                         p);
    } else {
      p = tpu_bcast0(L, k, nb, at.dims);
    }
    int64_t bd[TPU_MAX_RANK]; /* swap rows k and p */
    for (int i = 0; i < nb; i++) bd[i] = i;
    tpu_hv pA = tpu_hlo_broadcast_in_dim(H, p, r, at.dims, bd);
    tpu_hv isk = tpu_hlo_compare(H, TPU_HLO_EQ, row, kA), isp = tpu_hlo_compare(H, TPU_HLO_EQ, row, pA);
    tpu_hv rowk = tpu_pick_masked(L, isk, A, r - 2), rowp = tpu_pick_masked(L, isp, A, r - 2); /* [..., n] */
    for (int i = 0; i <= nb; i++) bd[i] = i == nb ? r - 1 : i;
    tpu_hv rowkA = tpu_hlo_broadcast_in_dim(H, rowk, r, at.dims, bd),
           rowpA = tpu_hlo_broadcast_in_dim(H, rowp, r, at.dims, bd);
    A = tpu_hlo_select(H, isk, rowpA, tpu_hlo_select(H, isp, rowkA, A));
    /* the same swap in perm */
    tpu_hv pR = tpu_hlo_broadcast_in_dim(H, p, nb + 1, qd, bd);
    tpu_hv iskR = tpu_hlo_compare(H, TPU_HLO_EQ, rows, kR), ispR = tpu_hlo_compare(H, TPU_HLO_EQ, rows, pR);
    int64_t dn = nb;
    tpu_hv permk = tpu_pick_masked(L, iskR, perm, dn), permp = tpu_pick_masked(L, ispR, perm, dn);
    tpu_hv permkR = tpu_hlo_broadcast_in_dim(H, permk, nb + 1, qd, bd),
           permpR = tpu_hlo_broadcast_in_dim(H, permp, nb + 1, qd, bd);
    perm = tpu_hlo_select(H, iskR, permpR, tpu_hlo_select(H, ispR, permkR, perm));
    /* pivots[k] = p + 1 */
    tpu_hlo_type kt = tpu_hlo_type_make(TPU_S64, nb + 1, pd);
    tpu_hv pk = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, kt, nb), tpu_bcast0(L, k, nb + 1, pd));
    tpu_hv p1 = tpu_hlo_convert(H, tpu_add(L, p, tpu_k(L, p, 1)), TPU_S32);
    piv = tpu_hlo_select(H, pk, tpu_hlo_broadcast_in_dim(H, p1, nb + 1, pd, bd), piv);
    /* eliminate below the pivot */
    tpu_hv newrowk = rowp; /* the row now at k */
    int64_t cd[TPU_MAX_RANK];
    memcpy(cd, at.dims, sizeof(int64_t) * (size_t)nb);
    cd[nb] = n;
    tpu_hv colsN = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, nb + 1, cd), nb);
    tpu_hv kN = tpu_bcast0(L, k, nb + 1, cd);
    tpu_hv piv_v = tpu_pick_masked(L, tpu_hlo_compare(H, TPU_HLO_EQ, colsN, kN), newrowk, nb); /* [...] */
    tpu_hv zero = tpu_hlo_compare(H, TPU_HLO_EQ, piv_v, tpu_k(L, piv_v, 0));
    tpu_hv infoz = tpu_hlo_compare(H, TPU_HLO_EQ, info, tpu_k(L, info, 0));
    tpu_hv k1 = tpu_hlo_convert(H, tpu_add(L, k, tpu_hlo_constant_int(H, TPU_S64, 1)), TPU_S32);
    info = tpu_hlo_select(H, tpu_hlo_binary(H, TPU_HLO_AND, zero, infoz), tpu_bcast0(L, k1, nb, at.dims), info);
    /* column k after the swap, scaled by 1/pivot below the diagonal (unscaled
     * when the pivot is zero: the column is zero there, as LAPACK leaves it) */
    tpu_hv colk2 = tpu_pick_masked(L, tpu_hlo_compare(H, TPU_HLO_EQ, col, kA), A, r - 1); /* [..., m] */
    tpu_hv safe = tpu_hlo_select(H, zero, tpu_k(L, piv_v, 1), piv_v);
    tpu_hv lcol = tpu_hlo_binary(H, TPU_HLO_DIV, colk2, tpu_hlo_broadcast_in_dim(H, safe, nb + 1, qd, bd));
    tpu_hv belowR = tpu_hlo_compare(H, TPU_HLO_GT, rows, kR);
    lcol = tpu_hlo_select(H, belowR, lcol, tpu_k(L, lcol, 0));
    tpu_hv rightN = tpu_hlo_compare(H, TPU_HLO_GT, colsN, kN);
    tpu_hv urow = tpu_hlo_select(H, rightN, newrowk, tpu_k(L, newrowk, 0));
    for (int i = 0; i <= nb; i++) bd[i] = i;
    tpu_hv lA = tpu_hlo_broadcast_in_dim(H, lcol, r, at.dims, bd);
    for (int i = 0; i <= nb; i++) bd[i] = i == nb ? r - 1 : i;
    tpu_hv uA = tpu_hlo_broadcast_in_dim(H, urow, r, at.dims, bd);
    A = tpu_sub(L, A, tpu_mul(L, lA, uA));
    tpu_hv setl = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_EQ, col, kA),
                                 tpu_hlo_compare(H, TPU_HLO_GT, row, kA));
    A = tpu_hlo_select(H, setl, lA, A);
    tpu_hv outs[5] = {tpu_add(L, k, tpu_hlo_constant_int(H, TPU_S64, 1)), A, piv, perm, info};
    int body = tpu_hlo_region_end(H, outs, 5);
    tpu_hv fin[5];
    if (!tpu_while(L, init, 5, cond, body, fin)) return res;
    res.lu = fin[1];
    res.piv = fin[2];
    res.perm = fin[3];
    res.info = fin[4];
  }
  return res;
}

/* P [..., m, m] of dtype dt with A = P L U: P[i, j] = (perm[j] == i). */
static tpu_hv tpu_perm_matrix(tpu_lower *L, tpu_hv perm, tpu_dtype dt) {
  const tpu_hlo_type *t = T(L, perm);
  if (t->dtype == TPU_INVALID) return TPU_HV_NONE;
  int nb = t->rank - 1;
  int64_t m = t->dims[nb], d[TPU_MAX_RANK], bd[TPU_MAX_RANK];
  memcpy(d, t->dims, sizeof(int64_t) * (size_t)nb);
  d[nb] = m;
  d[nb + 1] = m;
  for (int i = 0; i < nb; i++) bd[i] = i;
  bd[nb] = nb + 1;
  tpu_hv pj = tpu_hlo_broadcast_in_dim(H, perm, nb + 2, d, bd);
  tpu_hv ri = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S32, nb + 2, d), nb);
  return tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_EQ, pj, ri), dt);
}

/* The row permutation perm [..., m] from LAPACK pivots [..., k] (1-based
 * sequential swaps), by a while loop over the k swaps. */
static tpu_hv tpu_perm_from_piv(tpu_lower *L, tpu_hv piv, int64_t m) {
  tpu_hlo_type pt = *T(L, piv);
  if (pt.dtype == TPU_INVALID) return TPU_HV_NONE;
  int nb = pt.rank - 1;
  int64_t k = pt.dims[nb], qd[TPU_MAX_RANK], bd[TPU_MAX_RANK];
  memcpy(qd, pt.dims, sizeof(int64_t) * (size_t)nb);
  qd[nb] = m;
  for (int i = 0; i < nb; i++) bd[i] = i;
  tpu_hlo_type qt = tpu_hlo_type_make(TPU_S32, nb + 1, qd);
  piv = tpu_hlo_convert(H, piv, TPU_S32);
  tpu_hv init[3] = {tpu_hlo_constant_int(H, TPU_S64, 0), tpu_hlo_iota(H, qt, nb), piv};
  if (k == 0 || m == 0 || tpu_hlo_type_numel(&qt) == 0) return init[1];
  tpu_hlo_type ts[3] = {*T(L, init[0]), *T(L, init[1]), *T(L, init[2])};
  int cond = tpu_count_cond(L, ts, 3, k);
  tpu_hv v[3];
  tpu_hlo_region_begin(H, ts, 3, v);
  tpu_hv i0 = v[0], perm = v[1];
  int64_t dn = nb;
  tpu_hlo_type kt = tpu_hlo_type_make(TPU_S64, nb + 1, pt.dims);
  tpu_hv pk = tpu_pick_masked(
      L, tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, kt, nb), tpu_bcast0(L, i0, nb + 1, pt.dims)), v[2], dn);
  tpu_hv p = tpu_hlo_convert(H, tpu_sub(L, pk, tpu_k(L, pk, 1)), TPU_S64); /* [...] 0-based */
  tpu_hlo_type rt = tpu_hlo_type_make(TPU_S64, nb + 1, qd);
  tpu_hv rows = tpu_hlo_iota(H, rt, nb);
  tpu_hv isk = tpu_hlo_compare(H, TPU_HLO_EQ, rows, tpu_bcast0(L, i0, nb + 1, qd));
  tpu_hv isp = tpu_hlo_compare(H, TPU_HLO_EQ, rows, tpu_hlo_broadcast_in_dim(H, p, nb + 1, qd, bd));
  tpu_hv a = tpu_pick_masked(L, isk, perm, dn), b = tpu_pick_masked(L, isp, perm, dn);
  perm = tpu_hlo_select(H, isk, tpu_hlo_broadcast_in_dim(H, b, nb + 1, qd, bd),
                        tpu_hlo_select(H, isp, tpu_hlo_broadcast_in_dim(H, a, nb + 1, qd, bd), perm));
  tpu_hv outs[3] = {tpu_add(L, i0, tpu_hlo_constant_int(H, TPU_S64, 1)), perm, v[2]};
  int body = tpu_hlo_region_end(H, outs, 3);
  tpu_hv fin[3];
  if (!tpu_while(L, init, 3, cond, body, fin)) return TPU_HV_NONE;
  return fin[1];
}

/* Unit lower L [..., m, k] and upper U [..., k, n] of a packed LU [..., m, n]. */
static void tpu_lu_split(tpu_lower *L, tpu_hv lu, tpu_hv *lo, tpu_hv *up) {
  const tpu_hlo_type t = *T(L, lu);
  if (t.dtype == TPU_INVALID) return;
  int r = t.rank;
  int64_t m = t.dims[r - 2], n = t.dims[r - 1], k = m < n ? m : n;
  int64_t st[TPU_MAX_RANK] = {0}, lim[TPU_MAX_RANK], one[TPU_MAX_RANK];
  for (int i = 0; i < r; i++) {
    lim[i] = t.dims[i];
    one[i] = 1;
  }
  lim[r - 1] = k;
  tpu_hv l = tpu_hlo_slice(H, lu, st, lim, one);
  l = tpu_hlo_select(H, tpu_tri_mask(L, T(L, l), true, 1), l, tpu_k(L, l, 0));
  *lo = tpu_add(L, l, tpu_eye_like(L, T(L, l)));
  lim[r - 1] = n;
  lim[r - 2] = k;
  *up = tpu_tri(L, tpu_hlo_slice(H, lu, st, lim, one), false);
}

/* Solve A X = B (left) or X A = B given A's LU and perm; adjoint solves with A^T. */
static tpu_hv tpu_lu_solve_impl(tpu_lower *L, tpu_hv lu, tpu_hv perm, tpu_hv b, bool left, bool adjoint) {
  tpu_hv P = tpu_perm_matrix(L, perm, T(L, lu)->dtype);
  bool tr = adjoint;
  if (left && !tr) { /* L U X = P^T B */
    tpu_hv y = tpu_bmatmul(L, tpu_mT(L, P), b);
    y = tpu_trisolve(L, lu, y, true, true, true, false);
    return tpu_trisolve(L, lu, y, true, false, false, false);
  }
  if (left) { /* U^T L^T P^T X = B: X = P L^-T U^-T B */
    tpu_hv y = tpu_trisolve(L, lu, b, true, false, false, true);
    y = tpu_trisolve(L, lu, y, true, true, true, true);
    return tpu_bmatmul(L, P, y);
  }
  if (!tr) { /* X P L U = B: X = B U^-1 L^-1 P^T */
    tpu_hv y = tpu_trisolve(L, lu, b, false, false, false, false);
    y = tpu_trisolve(L, lu, y, false, true, true, false);
    return tpu_bmatmul(L, y, tpu_mT(L, P));
  }
  /* X U^T L^T P^T = B: X = B P L^-T U^-T */
  tpu_hv y = tpu_bmatmul(L, b, P);
  y = tpu_trisolve(L, lu, y, false, true, true, true);
  return tpu_trisolve(L, lu, y, false, false, false, true);
}

/* linalg_lu_factor_ex.out(A, *, pivot, check_errors, LU, pivots, info) */
void tpu_emit_linalg_lu_factor_ex(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "torch.linalg.lu_factor_ex")) return;
  if (!tpu_arg_bool_or(L, 1, true)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
    return;
  }
  tpu_lu_res f = tpu_lu(L, tpu_lower_tensor(L, 0, -1), true);
  tpu_lower_out(L, f.lu);
  tpu_lower_out(L, f.piv);
  tpu_lower_out(L, f.info);
}

/* linalg_lu.out(A, *, pivot, P, L, U) */
void tpu_emit_linalg_lu(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "linalg.lu")) return;
  if (!tpu_arg_bool_or(L, 1, true)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
    return;
  }
  tpu_lu_res f = tpu_lu(L, tpu_lower_tensor(L, 0, -1), true);
  tpu_hv lo = TPU_HV_NONE, up = TPU_HV_NONE;
  tpu_lu_split(L, f.lu, &lo, &up);
  tpu_lower_out(L, tpu_perm_matrix(L, f.perm, L->args[0].t.dtype));
  tpu_lower_out(L, lo);
  tpu_lower_out(L, up);
}

/* lu_unpack.out(LU_data, LU_pivots, unpack_data, unpack_pivots, *, P, L, U) */
void tpu_emit_lu_unpack(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t, *pt = &L->args[1].t;
  if (t->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.lu_unpack: Expected tensor with 2 or more dimensions. Got size: [%lld] instead",
                   (long long)(t->rank ? t->sizes[0] : 0));
    return;
  }
  if (pt->dtype != TPU_S32) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype.\n"
                   "Note: this function is intended to be used with the output produced by torch.linalg.lu_factor");
    return;
  }
  bool data = tpu_arg_bool_or(L, 2, true), pivs = tpu_arg_bool_or(L, 3, true);
  int64_t m = t->sizes[t->rank - 2];
  int64_t z = 0;
  tpu_hv empty = tpu_lower_full(L, tpu_hlo_type_make(t->dtype, 1, &z), 0);
  if (pivs) {
    tpu_hv perm = tpu_perm_from_piv(L, tpu_lower_tensor(L, 1, -1), m);
    tpu_lower_out(L, tpu_perm_matrix(L, perm, t->dtype));
  } else {
    tpu_lower_out(L, empty);
  }
  if (data) {
    tpu_hv lo = TPU_HV_NONE, up = TPU_HV_NONE;
    tpu_lu_split(L, tpu_lower_tensor(L, 0, -1), &lo, &up);
    tpu_lower_out(L, lo);
    tpu_lower_out(L, up);
  } else {
    tpu_lower_out(L, empty);
    tpu_lower_out(L, empty);
  }
}

/* linalg_lu_solve.out(LU, pivots, B, *, left, adjoint, out) */
void tpu_emit_linalg_lu_solve(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.lu_solve")) return;
  tpu_tref *bt = &L->args[2].t, *at = &L->args[0].t;
  bool left = tpu_arg_bool_or(L, 3, true), adjoint = tpu_arg_bool_or(L, 4, false);
  if (bt->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.lu_solve: The input tensor B must have at least 2 dimensions.");
    return;
  }
  int64_t n = at->sizes[at->rank - 1];
  if ((left ? bt->sizes[bt->rank - 2] : bt->sizes[bt->rank - 1]) != n) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "linalg.lu_solve: Incompatible shapes of A and B for the equation %s (%lldx%lld and %lldx%lld)",
                   left ? "AX = B" : "XA = B", (long long)n, (long long)n, (long long)bt->sizes[bt->rank - 2],
                   (long long)bt->sizes[bt->rank - 1]);
    return;
  }
  if (bt->dtype != at->dtype) {
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "linalg.lu_solve: Expected LU and B to have the same dtype, but found LU of type %s and B of type %s instead",
        tpu_dtype_name(at->dtype), tpu_dtype_name(bt->dtype));
    return;
  }
  tpu_hv lu = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 2, -1);
  tpu_hv perm = tpu_perm_from_piv(L, tpu_lower_tensor(L, 1, -1), n);
  /* broadcast the batch of LU (and perm with it) against B's */
  if (!tpu_batch_bcast(L, &lu, &b)) return;
  const tpu_hlo_type *lt = T(L, lu);
  int64_t qd[TPU_MAX_RANK];
  memcpy(qd, lt->dims, sizeof(int64_t) * (size_t)(lt->rank - 1));
  perm = tpu_lower_broadcast_to(L, perm, lt->rank - 1, qd);
  tpu_lower_out(L, tpu_lu_solve_impl(L, lu, perm, b, left, adjoint));
}

/* linalg_inv_ex.inverse(A, *, check_errors, inverse, info) */
void tpu_emit_linalg_inv_ex(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.inv")) return;
  tpu_hv a = tpu_lower_tensor(L, 0, -1);
  tpu_lu_res f = tpu_lu(L, a, true);
  tpu_lower_out(L, tpu_lu_solve_impl(L, f.lu, f.perm, tpu_eye_like(L, T(L, a)), true, false));
  tpu_lower_out(L, f.info);
}

/* _linalg_solve_ex.result(A, B, *, left, check_errors, result, LU, pivots, info) */
void tpu_emit_linalg_solve_ex(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.solve")) return;
  tpu_tref *at = &L->args[0].t, *bt = &L->args[1].t;
  bool left = tpu_arg_bool_or(L, 2, true);
  if (at->dtype != bt->dtype) {
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "linalg.solve: Expected A and B to have the same dtype, but found A of type %s and B of type %s instead",
        tpu_dtype_name(at->dtype), tpu_dtype_name(bt->dtype));
    return;
  }
  /* B is a (batch of) vector(s) when 1-d, or when its shape is A's without the last dim */
  bool vec = bt->rank == 1;
  if (left && bt->rank == at->rank - 1) {
    vec = true;
    for (int i = 0; i < bt->rank; i++) vec = vec && bt->sizes[i] == at->sizes[i];
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  if (vec) b = tpu_unsq(L, b, bt->rank);
  const tpu_hlo_type *b2 = T(L, b);
  int64_t n = at->sizes[at->rank - 1];
  if (b2->rank < 2 || (left ? b2->dims[b2->rank - 2] : b2->dims[b2->rank - 1]) != n) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.solve: Incompatible shapes of A and B for the equation %s",
                   left ? "AX = B" : "XA = B");
    return;
  }
  tpu_lu_res f = tpu_lu(L, a, true);
  tpu_hv lu = f.lu, perm = f.perm;
  if (!tpu_batch_bcast(L, &lu, &b)) return;
  const tpu_hlo_type *lt = T(L, lu);
  int64_t qd[TPU_MAX_RANK];
  memcpy(qd, lt->dims, sizeof(int64_t) * (size_t)(lt->rank - 1));
  perm = tpu_lower_broadcast_to(L, perm, lt->rank - 1, qd);
  tpu_hv x = tpu_lu_solve_impl(L, lu, perm, b, left, false);
  if (vec) {
    const tpu_hlo_type *xt = T(L, x);
    x = tpu_hlo_reshape(H, x, xt->rank - 1, xt->dims);
  }
  tpu_lower_out(L, x);
  tpu_lower_out(L, f.lu);
  tpu_lower_out(L, f.piv);
  tpu_lower_out(L, f.info);
}

/* Diagonal [..., n] of a square stack. */
static tpu_hv tpu_diag(tpu_lower *L, tpu_hv x) {
  const tpu_hlo_type *t = T(L, x);
  int r = t->rank;
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, r, t->dims);
  tpu_hv eq = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, it, r - 2), tpu_hlo_iota(H, it, r - 1));
  return tpu_pick_masked(L, eq, x, r - 1);
}

/* (-1)^(number of actual swaps) of the pivots, in dt, shape [...]. */
static tpu_hv tpu_piv_sign(tpu_lower *L, tpu_hv piv, tpu_dtype dt) {
  const tpu_hlo_type *t = T(L, piv);
  int nb = t->rank - 1;
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S32, t->rank, t->dims);
  tpu_hv ones = tpu_add(L, tpu_hlo_iota(H, it, nb), tpu_lower_full(L, it, 1));
  tpu_hv sw = tpu_hlo_compare(H, TPU_HLO_NE, piv, ones);
  tpu_hv s = tpu_hlo_select(H, sw, tpu_lower_full(L, tpu_hlo_type_make(dt, t->rank, t->dims), -1),
                            tpu_lower_full(L, tpu_hlo_type_make(dt, t->rank, t->dims), 1));
  int64_t d = nb;
  return tpu_hlo_reduce(H, s, tpu_hlo_constant(H, dt, 1), &d, 1, TPU_HLO_MUL);
}

/* torch's is_contiguous (row-major; size-1 dims ignored). */
static bool tpu_is_contig(const tpu_tref *t) {
  int64_t want = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    if (t->sizes[i] == 1) continue;
    if (t->strides[i] != want) return false;
    want *= t->sizes[i];
  }
  return true;
}

/* The LU that torch's det/slogdet save for their backward: of A^T when A
 * is contiguous (torch factors the transpose to skip a copy; the backward
 * formula relies on it), else of A. */
static tpu_lu_res tpu_det_lu(tpu_lower *L) {
  tpu_hv a = tpu_lower_tensor(L, 0, -1);
  if (tpu_is_contig(&L->args[0].t)) a = tpu_mT(L, a);
  return tpu_lu(L, a, true);
}

/* _linalg_det.result(A, *, result, LU, pivots) */
void tpu_emit_linalg_det(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.det")) return;
  tpu_tref *at = &L->args[0].t;
  tpu_lu_res f = tpu_det_lu(L);
  tpu_hv d = tpu_diag(L, f.lu);
  int64_t dd = at->rank - 2;
  tpu_hv p = tpu_hlo_reduce(H, d, tpu_hlo_constant(H, at->dtype, 1), &dd, 1, TPU_HLO_MUL);
  tpu_lower_out(L, tpu_mul(L, p, tpu_piv_sign(L, f.piv, at->dtype)));
  tpu_lower_out(L, f.lu);
  tpu_lower_out(L, f.piv);
}

/* _linalg_slogdet.sign(A, *, sign, logabsdet, LU, pivots) */
void tpu_emit_linalg_slogdet(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.slogdet")) return;
  tpu_tref *at = &L->args[0].t;
  tpu_lu_res f = tpu_det_lu(L);
  tpu_hv d = tpu_diag(L, f.lu);
  int64_t dd = at->rank - 2;
  tpu_hv sg =
      tpu_hlo_reduce(H, tpu_hlo_unary(H, TPU_HLO_SIGN, d), tpu_hlo_constant(H, at->dtype, 1), &dd, 1, TPU_HLO_MUL);
  sg = tpu_mul(L, sg, tpu_piv_sign(L, f.piv, at->dtype));
  tpu_hv la = tpu_hlo_reduce(H, tpu_hlo_unary(H, TPU_HLO_LOG, tpu_hlo_unary(H, TPU_HLO_ABS, d)),
                             tpu_hlo_constant(H, at->dtype, 0), &dd, 1, TPU_HLO_ADD);
  tpu_lower_out(L, sg);
  tpu_lower_out(L, la);
  tpu_lower_out(L, f.lu);
  tpu_lower_out(L, f.piv);
}

/* ---- SVD: one-sided (Hestenes) Jacobi ---------------------------------------------------------- */

/* Column j of x [..., m, n] (j a 0-d s64 value): [..., m]. */
static tpu_hv tpu_col(tpu_lower *L, tpu_hv x, tpu_hv j) {
  const tpu_hlo_type *t = T(L, x);
  int r = t->rank;
  tpu_hv col = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, t->dims), r - 1);
  return tpu_pick_masked(L, tpu_hlo_compare(H, TPU_HLO_EQ, col, tpu_bcast0(L, j, r, t->dims)), x, r - 1);
}

/* x with columns p and q replaced by cp and cq ([..., m]). */
static tpu_hv tpu_set_cols(tpu_lower *L, tpu_hv x, tpu_hv p, tpu_hv q, tpu_hv cp, tpu_hv cq) {
  const tpu_hlo_type *t = T(L, x);
  int r = t->rank;
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < r - 1; i++) bd[i] = i;
  tpu_hv col = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, t->dims), r - 1);
  tpu_hv isp = tpu_hlo_compare(H, TPU_HLO_EQ, col, tpu_bcast0(L, p, r, t->dims));
  tpu_hv isq = tpu_hlo_compare(H, TPU_HLO_EQ, col, tpu_bcast0(L, q, r, t->dims));
  tpu_hv bp = tpu_hlo_broadcast_in_dim(H, cp, r, t->dims, bd), bq = tpu_hlo_broadcast_in_dim(H, cq, r, t->dims, bd);
  return tpu_hlo_select(H, isp, bp, tpu_hlo_select(H, isq, bq, x));
}

/* Sum over the last dim of a*b: [..., m] -> [...]. */
static tpu_hv tpu_vdot_last(tpu_lower *L, tpu_hv a, tpu_hv b) {
  int64_t d = T(L, a)->rank - 1;
  return tpu_hlo_reduce(H, tpu_mul(L, a, b), tpu_hlo_constant(H, T(L, a)->dtype, 0), &d, 1, TPU_HLO_ADD);
}

/* The (p, q) index tables of the cyclic Jacobi order, n(n-1)/2 pairs. */
static int64_t tpu_pairs(int64_t n, int64_t *ps, int64_t *qs) {
  int64_t k = 0;
  for (int64_t p = 0; p < n; p++)
    for (int64_t q = p + 1; q < n; q++) {
      ps[k] = p;
      qs[k++] = q;
    }
  return k;
}

/* Entry (t mod npairs) of a constant s64 table, as a 0-d value. */
static tpu_hv tpu_table_at(tpu_lower *L, const int64_t *tab, int64_t np, tpu_hv t) {
  tpu_hv c = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 1, &np), tab);
  tpu_hv i = tpu_hlo_binary(H, TPU_HLO_REM, t, tpu_hlo_constant_int(H, TPU_S64, np));
  int64_t one = 1;
  tpu_hv s = tpu_hlo_dynamic_slice(H, c, &i, &one);
  return tpu_hlo_reshape(H, s, 0, NULL);
}

/* Jacobi rotation (c, s) that makes columns with squared norms alpha, beta
 * and inner product gamma orthogonal; identity when gamma == 0. */
static void tpu_jacobi_cs(tpu_lower *L, tpu_hv alpha, tpu_hv beta, tpu_hv gamma, tpu_hv *c, tpu_hv *s) {
  tpu_hv zero = tpu_hlo_compare(H, TPU_HLO_EQ, gamma, tpu_k(L, gamma, 0));
  tpu_hv g = tpu_hlo_select(H, zero, tpu_k(L, gamma, 1), gamma);
  tpu_hv zeta = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_sub(L, beta, alpha), tpu_mul(L, tpu_k(L, g, 2), g));
  tpu_hv sg =
      tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_LT, zeta, tpu_k(L, zeta, 0)), tpu_k(L, zeta, -1), tpu_k(L, zeta, 1));
  tpu_hv az = tpu_hlo_unary(H, TPU_HLO_ABS, zeta);
  tpu_hv t = tpu_hlo_binary(
      H, TPU_HLO_DIV, sg,
      tpu_add(L, az, tpu_hlo_unary(H, TPU_HLO_SQRT, tpu_add(L, tpu_k(L, zeta, 1), tpu_mul(L, zeta, zeta)))));
  /* huge zeta: zeta^2 overflows to inf and t becomes 0, as wanted */
  t = tpu_hlo_select(H, zero, tpu_k(L, t, 0), t);
  tpu_hv cc = tpu_hlo_unary(H, TPU_HLO_RSQRT, tpu_add(L, tpu_k(L, t, 1), tpu_mul(L, t, t)));
  *c = cc;
  *s = tpu_mul(L, cc, t);
}

/* Entry (p, q) of x [..., n, n]: [...]. */
static tpu_hv tpu_entry(tpu_lower *L, tpu_hv x, tpu_hv p, tpu_hv q) {
  tpu_hv c = tpu_col(L, x, q); /* [..., n] */
  const tpu_hlo_type *t = T(L, c);
  int r = t->rank;
  tpu_hv row = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, t->dims), r - 1);
  return tpu_pick_masked(L, tpu_hlo_compare(H, TPU_HLO_EQ, row, tpu_bcast0(L, p, r, t->dims)), c, r - 1);
}

/* x J for the rotation J in the (p, q) plane: column update. */
static tpu_hv tpu_rot_cols(tpu_lower *L, tpu_hv x, tpu_hv p, tpu_hv q, tpu_hv c, tpu_hv s) {
  tpu_hv xp = tpu_col(L, x, p), xq = tpu_col(L, x, q);
  const tpu_hlo_type *t = T(L, xp);
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < t->rank - 1; i++) bd[i] = i;
  tpu_hv cb = tpu_hlo_broadcast_in_dim(H, c, t->rank, t->dims, bd),
         sb = tpu_hlo_broadcast_in_dim(H, s, t->rank, t->dims, bd);
  return tpu_set_cols(L, x, p, q, tpu_sub(L, tpu_mul(L, cb, xp), tpu_mul(L, sb, xq)),
                      tpu_add(L, tpu_mul(L, sb, xp), tpu_mul(L, cb, xq)));
}

/* `sweeps` cyclic Jacobi sweeps over the column pairs of *a [..., m, n],
 * accumulating the rotations into *v [..., k, n]. Two-sided (symmetric *a,
 * eigh): each rotation zeroes a[p, q] and is applied to rows and columns.
 * One-sided (SVD): each rotation makes columns p and q orthogonal. An empty
 * or 1-column *a is left as it is. */
bool tpu_jacobi_sweeps(tpu_lower *L, bool two_sided, int sweeps, tpu_hv *a, tpu_hv *v) {
  const tpu_hlo_type at = *T(L, *a);
  int64_t n = at.dims[at.rank - 1], np = n * (n - 1) / 2;
  if (np == 0 || tpu_hlo_type_numel(&at) == 0) return true;
  int64_t *ps = malloc(sizeof(int64_t) * (size_t)np * 2);
  if (!ps) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: out of memory", L->opname);
    return false;
  }
  int64_t *qs = ps + np;
  tpu_pairs(n, ps, qs);
  tpu_hv init[3] = {tpu_hlo_constant_int(H, TPU_S64, 0), *a, *v};
  tpu_hlo_type ts[3] = {*T(L, init[0]), at, *T(L, *v)};
  int cond = tpu_count_cond(L, ts, 3, np * sweeps);
  tpu_hv x[3];
  tpu_hlo_region_begin(H, ts, 3, x);
  tpu_hv p = tpu_table_at(L, ps, np, x[0]), q = tpu_table_at(L, qs, np, x[0]), c, s, A;
  if (two_sided) {
    tpu_jacobi_cs(L, tpu_entry(L, x[1], p, p), tpu_entry(L, x[1], q, q), tpu_entry(L, x[1], p, q), &c, &s);
    A = tpu_mT(L, tpu_rot_cols(L, tpu_mT(L, tpu_rot_cols(L, x[1], p, q, c, s)), p, q, c, s));
  } else {
    tpu_hv ap = tpu_col(L, x[1], p), aq = tpu_col(L, x[1], q);
    tpu_jacobi_cs(L, tpu_vdot_last(L, ap, ap), tpu_vdot_last(L, aq, aq), tpu_vdot_last(L, ap, aq), &c, &s);
    A = tpu_rot_cols(L, x[1], p, q, c, s);
  }
  tpu_hv outs[3] = {tpu_add(L, x[0], tpu_hlo_constant_int(H, TPU_S64, 1)), A, tpu_rot_cols(L, x[2], p, q, c, s)};
  int body = tpu_hlo_region_end(H, outs, 3);
  free(ps);
  tpu_hv fin[3];
  if (!tpu_while(L, init, 3, cond, body, fin)) return false;
  *a = fin[1];
  *v = fin[2];
  return true;
}

/* Permutation sorting s [..., k] descending (stable): returns the sorted
 * values and the one-hot matrix M [..., k, k] with X M = X's columns in that order. */
tpu_hv tpu_sort_desc(tpu_lower *L, tpu_hv s, tpu_hv *mat) {
  const tpu_hlo_type st = *T(L, s);
  int r = st.rank;
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S32, r, st.dims);
  tpu_hlo_type sc[4] = {tpu_hlo_type_make(st.dtype, 0, NULL), tpu_hlo_type_make(st.dtype, 0, NULL),
                        tpu_hlo_type_make(TPU_S32, 0, NULL), tpu_hlo_type_make(TPU_S32, 0, NULL)};
  tpu_hv a[4];
  tpu_hlo_region_begin(H, sc, 4, a);
  tpu_hv gt = tpu_hlo_compare(H, TPU_HLO_GT, a[0], a[1]);
  int region = tpu_hlo_region_end(H, &gt, 1);
  tpu_hv xs[2] = {s, tpu_hlo_iota(H, it, r - 1)}, outs[2] = {TPU_HV_NONE, TPU_HV_NONE};
  tpu_hlo_sort(H, xs, 2, r - 1, true, region, outs);
  int64_t md[TPU_MAX_RANK], bd[TPU_MAX_RANK];
  memcpy(md, st.dims, sizeof(int64_t) * (size_t)r);
  md[r] = st.dims[r - 1];
  for (int i = 0; i < r - 1; i++) bd[i] = i;
  bd[r - 1] = r; /* idx[..., j] -> M[..., :, j] */
  tpu_hv idx = tpu_hlo_broadcast_in_dim(H, outs[1], r + 1, md, bd);
  tpu_hv rows = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S32, r + 1, md), r - 1);
  *mat = tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_EQ, rows, idx), st.dtype);
  return outs[0];
}

/* ---- eigh: two-sided (cyclic) Jacobi ------------------------------------------------------------- */

/* _linalg_eigh.eigenvalues(A, UPLO, compute_v, *, eigenvalues, eigenvectors) */
void tpu_emit_linalg_eigh(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "linalg.eigh")) return;
  tpu_tref *tr = &L->args[0].t;
  bool upper = tpu_arg_is(L, 1, TPU_ARG_STR) && (L->args[1].str[0] == 'U' || L->args[1].str[0] == 'u');
  bool cv = tpu_arg_bool_or(L, 2, true);
  tpu_hv a = tpu_lower_tensor(L, 0, -1);
  /* the symmetric matrix the chosen triangle describes */
  tpu_hv tri = tpu_tri(L, a, !upper);
  tpu_hv strict = tpu_hlo_select(H, tpu_tri_mask(L, T(L, a), !upper, 1), a, tpu_k(L, a, 0));
  a = tpu_add(L, tri, tpu_mT(L, strict));
  const tpu_hlo_type at = *T(L, a);
  tpu_hv V = tpu_eye_like(L, &at);
  if (!tpu_jacobi_sweeps(L, true, 12, &a, &V)) return;
  tpu_hv w = tpu_diag(L, a), M = TPU_HV_NONE;
  /* ascending: sort the negated values descending */
  w = tpu_hlo_unary(H, TPU_HLO_NEG, tpu_sort_desc(L, tpu_hlo_unary(H, TPU_HLO_NEG, w), &M));
  tpu_lower_out(L, w);
  int64_t z = 0;
  tpu_lower_out(L, cv ? tpu_bmatmul(L, V, M) : tpu_lower_full(L, tpu_hlo_type_make(tr->dtype, 1, &z), 0));
}

/* ---- QR: Householder reflections as LAPACK's geqrf makes them ---------------------------------- */

/* The Householder vector of column k of a packed [..., m, n]: 1 at row k,
 * the stored entries below it, 0 above. [..., m] */
static tpu_hv tpu_hh_vec(tpu_lower *L, tpu_hv packed, tpu_hv k) {
  tpu_hv c = tpu_col(L, packed, k);
  const tpu_hlo_type *t = T(L, c);
  int r = t->rank;
  tpu_hv rows = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, t->dims), r - 1);
  tpu_hv kb = tpu_bcast0(L, k, r, t->dims);
  tpu_hv v = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GT, rows, kb), c, tpu_k(L, c, 0));
  return tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, rows, kb), tpu_k(L, c, 1), v);
}

/* Entry k of x [..., K] (k 0-d s64): [...]. */
static tpu_hv tpu_at_last(tpu_lower *L, tpu_hv x, tpu_hv k) {
  const tpu_hlo_type *t = T(L, x);
  int r = t->rank;
  tpu_hv i = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, t->dims), r - 1);
  return tpu_pick_masked(L, tpu_hlo_compare(H, TPU_HLO_EQ, i, tpu_bcast0(L, k, r, t->dims)), x, r - 1);
}

/* x - tau v (v^T x) restricted to columns selected by colmask (or all when
 * NONE): applies H = I - tau v v^T from the left. x [..., m, n], v [..., m], tau [...]. */
static tpu_hv tpu_hh_left(tpu_lower *L, tpu_hv x, tpu_hv v, tpu_hv tau, tpu_hv colmask) {
  const tpu_hlo_type *t = T(L, x);
  int r = t->rank;
  int64_t bd[TPU_MAX_RANK], d = r - 2;
  for (int i = 0; i < r - 1; i++) bd[i] = i;
  tpu_hv vb = tpu_hlo_broadcast_in_dim(H, v, r, t->dims, bd); /* v along rows */
  tpu_hv w = tpu_hlo_reduce(H, tpu_mul(L, vb, x), tpu_hlo_constant(H, t->dtype, 0), &d, 1, TPU_HLO_ADD); /* [..., n] */
  for (int i = 0; i < r - 2; i++) bd[i] = i;
  bd[r - 2] = r - 1;
  tpu_hv wb = tpu_hlo_broadcast_in_dim(H, w, r, t->dims, bd);
  tpu_hv tb = tpu_hlo_broadcast_in_dim(H, tau, r, t->dims, bd);
  tpu_hv nx = tpu_sub(L, x, tpu_mul(L, tb, tpu_mul(L, vb, wb)));
  return colmask == TPU_HV_NONE ? nx : tpu_hlo_select(H, colmask, nx, x);
}

/* geqrf of a [..., m, n]: packed reflectors and R, and taus [..., min(m, n)]. */
void tpu_geqrf(tpu_lower *L, tpu_hv a, tpu_hv *packed, tpu_hv *taus) {
  const tpu_hlo_type at = *T(L, a);
  int r = at.rank, nb = r - 2;
  int64_t m = at.dims[r - 2], n = at.dims[r - 1], kmax = m < n ? m : n;
  int64_t td[TPU_MAX_RANK];
  memcpy(td, at.dims, sizeof(int64_t) * (size_t)nb);
  td[nb] = kmax;
  tpu_hlo_type tt = tpu_hlo_type_make(at.dtype, nb + 1, td);
  tpu_hv init[3] = {tpu_hlo_constant_int(H, TPU_S64, 0), a, tpu_lower_full(L, tt, 0)};
  if (kmax == 0 || tpu_hlo_type_numel(&at) == 0) {
    *packed = a;
    *taus = init[2];
    return;
  }
  tpu_hlo_type ts[3] = {*T(L, init[0]), at, tt};
  int cond = tpu_count_cond(L, ts, 3, kmax);
  tpu_hv v[3];
  tpu_hlo_region_begin(H, ts, 3, v);
  tpu_hv k = v[0], A = v[1];
  tpu_hv c = tpu_col(L, A, k); /* [..., m] */
  const tpu_hlo_type *ct = T(L, c);
  tpu_hv rows = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, nb + 1, ct->dims), nb);
  tpu_hv kb = tpu_bcast0(L, k, nb + 1, ct->dims);
  tpu_hv below = tpu_hlo_compare(H, TPU_HLO_GT, rows, kb);
  tpu_hv x = tpu_hlo_select(H, below, c, tpu_k(L, c, 0));
  tpu_hv alpha = tpu_at_last(L, c, k);
  int64_t dn = nb;
  tpu_hv xn2 = tpu_hlo_reduce(H, tpu_mul(L, x, x), tpu_hlo_constant(H, at.dtype, 0), &dn, 1, TPU_HLO_ADD);
  tpu_hv nz = tpu_hlo_compare(H, TPU_HLO_EQ, xn2, tpu_k(L, xn2, 0));
  tpu_hv nrm = tpu_hlo_unary(H, TPU_HLO_SQRT, tpu_add(L, tpu_mul(L, alpha, alpha), xn2));
  /* beta = -sign(alpha) * norm, with sign(0) = + as Fortran's SIGN */
  tpu_hv neg = tpu_hlo_compare(H, TPU_HLO_LT, alpha, tpu_k(L, alpha, 0));
  tpu_hv beta = tpu_hlo_select(H, neg, nrm, tpu_hlo_unary(H, TPU_HLO_NEG, nrm));
  beta = tpu_hlo_select(H, nz, alpha, beta);
  tpu_hv safe = tpu_hlo_select(H, nz, tpu_k(L, beta, 1), beta);
  tpu_hv tau = tpu_hlo_select(H, nz, tpu_k(L, beta, 0), tpu_hlo_binary(H, TPU_HLO_DIV, tpu_sub(L, beta, alpha), safe));
  tpu_hv den = tpu_hlo_select(H, nz, tpu_k(L, alpha, 1), tpu_sub(L, alpha, beta));
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < nb; i++) bd[i] = i;
  tpu_hv vv = tpu_hlo_binary(H, TPU_HLO_DIV, x, tpu_hlo_broadcast_in_dim(H, den, nb + 1, ct->dims, bd));
  tpu_hv hv = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, rows, kb), tpu_k(L, vv, 1), vv);
  /* apply H to the columns right of k */
  tpu_hv cols = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, at.dims), r - 1);
  tpu_hv right = tpu_hlo_compare(H, TPU_HLO_GT, cols, tpu_bcast0(L, k, r, at.dims));
  A = tpu_hh_left(L, A, hv, tau, right);
  /* column k: beta on the diagonal, v below, the rows above unchanged */
  tpu_hv newc = tpu_hlo_select(H, below, vv, c);
  newc = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, rows, kb),
                        tpu_hlo_broadcast_in_dim(H, beta, nb + 1, ct->dims, bd), newc);
  A = tpu_set_cols(L, A, k, k, newc, newc);
  tpu_hv tix = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, nb + 1, td), nb);
  tpu_hv T2 = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, tix, tpu_bcast0(L, k, nb + 1, td)),
                             tpu_hlo_broadcast_in_dim(H, tau, nb + 1, td, bd), v[2]);
  tpu_hv outs[3] = {tpu_add(L, k, tpu_hlo_constant_int(H, TPU_S64, 1)), A, T2};
  int body = tpu_hlo_region_end(H, outs, 3);
  tpu_hv fin[3];
  if (!tpu_while(L, init, 3, cond, body, fin)) return;
  *packed = fin[1];
  *taus = fin[2];
}

/* Q c or Q^T c (transpose) for Q = H_0 H_1 ... H_{k-1}, from packed
 * reflectors [..., m, n] and taus [..., k]; c [..., m, N]. Q c applies the
 * reflectors from the last (as LAPACK's orgqr/ormqr), Q^T c from the first. */
static tpu_hv tpu_hh_apply(tpu_lower *L, tpu_hv packed, tpu_hv taus, tpu_hv c, bool transpose) {
  const tpu_hlo_type pt = *T(L, packed), qt = *T(L, c);
  if (pt.dtype == TPU_INVALID || qt.dtype == TPU_INVALID) return TPU_HV_NONE;
  int r = pt.rank, nb = r - 2;
  int64_t m = pt.dims[r - 2], k = T(L, taus)->dims[nb];
  if (k == 0 || tpu_hlo_type_numel(&qt) == 0 || m == 0) return c;
  tpu_hv init[4] = {tpu_hlo_constant_int(H, TPU_S64, 0), c, packed, taus};
  tpu_hlo_type ts[4] = {*T(L, init[0]), qt, pt, *T(L, taus)};
  int cond = tpu_count_cond(L, ts, 4, k);
  tpu_hv v[4];
  tpu_hlo_region_begin(H, ts, 4, v);
  tpu_hv j = transpose ? v[0] : tpu_sub(L, tpu_hlo_constant_int(H, TPU_S64, k - 1), v[0]);
  tpu_hv hv = tpu_hh_vec(L, v[2], j);
  tpu_hv Q = tpu_hh_left(L, v[1], hv, tpu_at_last(L, v[3], j), TPU_HV_NONE);
  tpu_hv outs[4] = {tpu_add(L, v[0], tpu_hlo_constant_int(H, TPU_S64, 1)), Q, v[2], v[3]};
  int body = tpu_hlo_region_end(H, outs, 4);
  tpu_hv fin[4];
  if (!tpu_while(L, init, 4, cond, body, fin)) return TPU_HV_NONE;
  return fin[1];
}

/* The first `ncols` columns of Q = H_0 ... H_{k-1}. */
tpu_hv tpu_hh_product(tpu_lower *L, tpu_hv packed, tpu_hv taus, int64_t ncols) {
  const tpu_hlo_type pt = *T(L, packed);
  if (pt.dtype == TPU_INVALID) return TPU_HV_NONE;
  int64_t qd[TPU_MAX_RANK];
  memcpy(qd, pt.dims, sizeof(int64_t) * (size_t)pt.rank);
  qd[pt.rank - 1] = ncols;
  tpu_hlo_type qt = tpu_hlo_type_make(pt.dtype, pt.rank, qd);
  return tpu_hh_apply(L, packed, taus, tpu_eye_like(L, &qt), false);
}

/* ormqr(self=packed, input2=tau, input3=C, left=True, transpose=False):
 * op(Q) C (left) or C op(Q). */
void tpu_emit_ormqr(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "torch.ormqr")) return;
  tpu_tref *a = &L->args[0].t, *tt = &L->args[1].t, *ct = &L->args[2].t;
  bool left = tpu_arg_bool_or(L, 3, true), tr = tpu_arg_bool_or(L, 4, false);
  int64_t m = a->sizes[a->rank - 2];
  if (ct->rank != a->rank || tt->rank != a->rank - 1 ||
      (left ? ct->sizes[ct->rank - 2] : ct->sizes[ct->rank - 1]) != m) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.ormqr: input.shape[-2] must be equal to other.shape[%d]", left ? -2 : -1);
    return;
  }
  if (tt->dtype != a->dtype || ct->dtype != a->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.ormqr: expected input, tau and other to have the same dtype");
    return;
  }
  tpu_hv p = tpu_lower_tensor(L, 0, -1), t = tpu_lower_tensor(L, 1, -1), c = tpu_lower_tensor(L, 2, -1);
  /* C Q = (Q^T C^T)^T and C Q^T = (Q C^T)^T */
  if (left)
    tpu_lower_out(L, tpu_hh_apply(L, p, t, c, tr));
  else
    tpu_lower_out(L, tpu_mT(L, tpu_hh_apply(L, p, t, tpu_mT(L, c), !tr)));
}

/* geqrf.a(self, *, a, tau) */
void tpu_emit_geqrf(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "geqrf")) return;
  tpu_hv p = TPU_HV_NONE, t = TPU_HV_NONE;
  tpu_geqrf(L, tpu_lower_tensor(L, 0, -1), &p, &t);
  tpu_lower_out(L, p);
  tpu_lower_out(L, t);
}

/* linalg_qr.out(A, mode="reduced", *, Q, R) */
void tpu_emit_linalg_qr(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "linalg.qr")) return;
  tpu_tref *t = &L->args[0].t;
  const char *mode = tpu_arg_is(L, 1, TPU_ARG_STR) ? L->args[1].str : "reduced";
  bool complete = strcmp(mode, "complete") == 0, ronly = strcmp(mode, "r") == 0;
  if (!complete && !ronly && strcmp(mode, "reduced") != 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "qr received unrecognized mode '%s' but expected one of 'reduced' (default), 'r', or 'complete'",
                   mode);
    return;
  }
  int r = t->rank;
  int64_t m = t->sizes[r - 2], n = t->sizes[r - 1], k = m < n ? m : n;
  tpu_hv p = TPU_HV_NONE, taus = TPU_HV_NONE;
  tpu_geqrf(L, tpu_lower_tensor(L, 0, -1), &p, &taus);
  if (!tpu_hlo_ok(H)) return;
  int64_t rows = complete ? m : k;
  int64_t st[TPU_MAX_RANK] = {0}, lim[TPU_MAX_RANK], one[TPU_MAX_RANK];
  for (int i = 0; i < r; i++) {
    lim[i] = t->sizes[i];
    one[i] = 1;
  }
  lim[r - 2] = rows;
  tpu_hv R = tpu_tri(L, tpu_hlo_slice(H, p, st, lim, one), false);
  int64_t z = 0;
  if (ronly) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(t->dtype, 1, &z), 0));
  } else {
    tpu_lower_out(L, tpu_hh_product(L, p, taus, complete ? m : k));
  }
  tpu_lower_out(L, R);
}

/* linalg_householder_product(input [..., m, n], tau [..., k]): the first n
 * columns of H_0 ... H_{k-1}. */
void tpu_emit_householder_product(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "torch.linalg.householder_product")) return;
  tpu_tref *t = &L->args[0].t, *tt = &L->args[1].t;
  int64_t m = t->sizes[t->rank - 2], n = t->sizes[t->rank - 1];
  if (m < n) {
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "torch.linalg.householder_product: input.shape[-2] must be greater than or equal to input.shape[-1]");
    return;
  }
  if (tt->rank != t->rank - 1 || tt->sizes[tt->rank - 1] > n) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.linalg.householder_product: input.shape[-1] must be greater than or equal to tau.shape[-1]");
    return;
  }
  if (tt->dtype != t->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.linalg.householder_product: tau dtype %s does not match input dtype %s",
                   tpu_dtype_name(tt->dtype), tpu_dtype_name(t->dtype));
    return;
  }
  tpu_lower_out(L, tpu_hh_product(L, tpu_lower_tensor(L, 0, -1), tpu_lower_tensor(L, 1, -1), n));
}

/* ---- matrix_exp: scaling and squaring --------------------------------------------------------------- */

/* linalg_matrix_exp(self): A / 2^s has 1-norm <= theta_18 = 3.01 (s per
 * matrix, at run time: the same count of squarings as torch, whose rounding
 * errors they amplify), a degree-22 Taylor polynomial (Horner) approximates
 * its exponential below float32 rounding, and s squarings (a while loop over the largest
 * s; each matrix squares only while its own count lasts) undo the scaling.
 * Half types in float32, the result rounded once (torch's CPU kernel runs
 * them in their own precision, and its results are not usable: exp(I) is
 * -1.3e30 in bfloat16 there). */
void tpu_emit_matrix_exp(tpu_lower *L) {
  if (!tpu_check_matrix_of(L, 0, true, "linalg.matrix_exp", true)) return;
  tpu_dtype in = L->args[0].t.dtype;
  tpu_hv a = tpu_lower_input(L, 0, tpu_acc_type(in));
  const tpu_hlo_type at = *T(L, a);
  int r = at.rank, nb = r - 2;
  tpu_dtype dt = at.dtype;
  if (tpu_hlo_type_numel(&at) == 0) {
    tpu_lower_out(L, tpu_hlo_convert(H, a, in));
    return;
  }
  /* 1-norm: max column sum of |a| */
  int64_t d = r - 2, dl = nb;
  tpu_hv cs = tpu_hlo_reduce(H, tpu_hlo_unary(H, TPU_HLO_ABS, a), tpu_hlo_constant(H, dt, 0), &d, 1, TPU_HLO_ADD);
  tpu_hv nrm = tpu_hlo_reduce(H, cs, tpu_hlo_constant(H, dt, 0), &dl, 1, TPU_HLO_MAX); /* [...] */
  /* s = max(0, ceil(log2(norm / theta))) as s64 [...]; NaN/inf norms: s = 0 (the result is NaN anyway) */
  tpu_hv lg = tpu_hlo_unary(
      H, TPU_HLO_CEIL,
      tpu_hlo_binary(H, TPU_HLO_DIV,
                     tpu_hlo_unary(H, TPU_HLO_LOG, tpu_mul(L, nrm, tpu_k(L, nrm, 1.0 / 3.010066362817634))),
                     tpu_k(L, nrm, log(2.0))));
  tpu_hv fin = tpu_hlo_unary(H, TPU_HLO_IS_FINITE, lg);
  lg = tpu_hlo_select(H, fin, lg, tpu_k(L, lg, 0));
  lg = tpu_hlo_binary(H, TPU_HLO_MAX, lg, tpu_k(L, lg, 0));
  lg = tpu_hlo_binary(H, TPU_HLO_MIN, lg, tpu_k(L, lg, 1000));
  tpu_hv s = tpu_hlo_convert(H, lg, TPU_S64);
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < nb; i++) bd[i] = i;
  tpu_hv scale = tpu_hlo_binary(H, TPU_HLO_POW, tpu_k(L, lg, 2), lg);
  tpu_hv as = tpu_hlo_binary(H, TPU_HLO_DIV, a, tpu_hlo_broadcast_in_dim(H, scale, r, at.dims, bd));
  tpu_hv id = tpu_eye_like(L, &at);
  /* Horner: I + A/1 (I + A/2 (I + ... (I + A/22))) */
  tpu_hv p = id;
  for (int k = 22; k >= 1; k--) p = tpu_add(L, id, tpu_mul(L, tpu_bmatmul(L, as, p), tpu_k(L, p, 1.0 / k)));
  /* squarings */
  int64_t sd = nb;
  tpu_hv smax = nb ? tpu_hlo_reduce(H, s, tpu_hlo_constant_int(H, TPU_S64, 0), bd, nb, TPU_HLO_MAX) : s;
  (void)sd;
  tpu_hv init[4] = {tpu_hlo_constant_int(H, TPU_S64, 0), p, s, smax};
  tpu_hlo_type ts[4] = {*T(L, init[0]), at, *T(L, s), *T(L, smax)};
  tpu_hv cv[4];
  tpu_hlo_region_begin(H, ts, 4, cv);
  tpu_hv c = tpu_hlo_compare(H, TPU_HLO_LT, cv[0], cv[3]);
  int cond = tpu_hlo_region_end(H, &c, 1);
  tpu_hv v[4];
  tpu_hlo_region_begin(H, ts, 4, v);
  tpu_hv sq = tpu_bmatmul(L, v[1], v[1]);
  tpu_hv go = tpu_hlo_compare(H, TPU_HLO_LT, tpu_bcast0(L, v[0], nb, at.dims), v[2]);
  tpu_hv P = tpu_hlo_select(H, tpu_hlo_broadcast_in_dim(H, go, r, at.dims, bd), sq, v[1]);
  tpu_hv outs[4] = {tpu_add(L, v[0], tpu_hlo_constant_int(H, TPU_S64, 1)), P, v[2], v[3]};
  int body = tpu_hlo_region_end(H, outs, 4);
  tpu_hv res[4];
  if (!tpu_while(L, init, 4, cond, body, res)) return;
  tpu_lower_out(L, tpu_hlo_convert(H, res[1], in));
}

/* ---- least squares ------------------------------------------------------------------------------- */

/* linalg_lstsq.out(self=A, b, rcond, *, driver, solution, residuals, rank, singular_values):
 * the minimum-norm least-squares solution through the SVD (what every
 * LAPACK driver returns for the ranks it detects), with the side outputs
 * each driver fills: residuals (m > n, not gelsy), rank (not gels),
 * singular values (gelsd, gelss); the others are empty. */
void tpu_emit_linalg_lstsq(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "torch.linalg.lstsq")) return;
  tpu_tref *at = &L->args[0].t, *bt = &L->args[1].t;
  const char *driver = tpu_arg_is(L, 3, TPU_ARG_STR) ? L->args[3].str : "gelsy";
  bool gels = strcmp(driver, "gels") == 0, gelsy = strcmp(driver, "gelsy") == 0;
  bool with_sv = strcmp(driver, "gelsd") == 0 || strcmp(driver, "gelss") == 0;
  if (!gels && !gelsy && !with_sv) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
    return;
  }
  if (bt->dtype != at->dtype) {
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's dtype %s and other's dtype %s",
        tpu_dtype_name(at->dtype), tpu_dtype_name(bt->dtype));
    return;
  }
  int r = at->rank;
  int64_t m = at->sizes[r - 2], n = at->sizes[r - 1], k = m < n ? m : n;
  bool vec = bt->rank == 1;
  if (bt->rank == r - 1) {
    vec = true;
    for (int i = 0; i < bt->rank; i++) vec = vec && bt->sizes[i] == at->sizes[i];
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  if (vec) b = tpu_unsq(L, b, bt->rank);
  const tpu_hlo_type *b2 = T(L, b);
  if (b2->rank < 2 || b2->dims[b2->rank - 2] != m) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.linalg.lstsq: input.size(-2) should match other.size(-2)");
    return;
  }
  if (!tpu_batch_bcast(L, &a, &b)) return;
  tpu_dtype dt = at->dtype;
  tpu_hv U = TPU_HV_NONE, S = TPU_HV_NONE, V = TPU_HV_NONE;
  tpu_svd(L, a, false, &U, &S, &V);
  if (!tpu_hlo_ok(H)) return;
  const tpu_hlo_type st = *T(L, S);
  int sr = st.rank;
  double eps = dt == TPU_F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
  double rc = tpu_arg_is(L, 2, TPU_ARG_FLOAT) ? L->args[2].f : eps * (double)(m > n ? m : n);
  if (gels) rc = 0;
  /* sigma_max (the first, values are sorted) times rcond */
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < sr - 1; i++) bd[i] = i;
  tpu_hv smax;
  if (k > 0) {
    int64_t st0[TPU_MAX_RANK] = {0}, lim[TPU_MAX_RANK], one[TPU_MAX_RANK];
    for (int i = 0; i < sr; i++) {
      lim[i] = st.dims[i];
      one[i] = 1;
    }
    lim[sr - 1] = 1;
    smax = tpu_hlo_reshape(H, tpu_hlo_slice(H, S, st0, lim, one), sr - 1, st.dims);
  } else {
    smax = tpu_lower_full(L, tpu_hlo_type_make(dt, sr - 1, st.dims), 0);
  }
  tpu_hv thr = tpu_hlo_broadcast_in_dim(H, tpu_mul(L, smax, tpu_k(L, smax, rc)), sr, st.dims, bd);
  tpu_hv keep = tpu_hlo_compare(H, TPU_HLO_GT, S, thr);
  tpu_hv sinv = tpu_hlo_select(
      H, keep, tpu_hlo_binary(H, TPU_HLO_DIV, tpu_k(L, S, 1), tpu_hlo_select(H, keep, S, tpu_k(L, S, 1))),
      tpu_k(L, S, 0));
  /* x = V diag(sinv) U^T b */
  tpu_hv y = tpu_bmatmul(L, tpu_mT(L, U), b); /* [..., k, nrhs] */
  const tpu_hlo_type *yt = T(L, y);
  for (int i = 0; i < sr; i++) bd[i] = i;
  y = tpu_mul(L, y, tpu_hlo_broadcast_in_dim(H, sinv, yt->rank, yt->dims, bd));
  tpu_hv x = tpu_bmatmul(L, V, y);
  tpu_hv res;
  int64_t z = 0;
  tpu_hv empty = tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &z), 0);
  if (m > n && !gelsy) {
    tpu_hv e = tpu_sub(L, b, tpu_bmatmul(L, a, x));
    int64_t d = T(L, e)->rank - 2;
    res = tpu_hlo_reduce(H, tpu_mul(L, e, e), tpu_hlo_constant(H, dt, 0), &d, 1, TPU_HLO_ADD);
    if (vec) {
      const tpu_hlo_type *rt = T(L, res);
      res = tpu_hlo_reshape(H, res, rt->rank - 1, rt->dims);
    }
  } else {
    res = empty;
  }
  if (vec) {
    const tpu_hlo_type *xt = T(L, x);
    x = tpu_hlo_reshape(H, x, xt->rank - 1, xt->dims);
  }
  tpu_lower_out(L, x);
  tpu_lower_out(L, res);
  if (gels) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &z), 0));
  } else {
    int64_t d = sr - 1;
    tpu_lower_out(L, tpu_hlo_reduce(H, tpu_hlo_convert(H, keep, TPU_S64), tpu_hlo_constant_int(H, TPU_S64, 0), &d, 1,
                                    TPU_HLO_ADD));
  }
  tpu_lower_out(L, with_sv ? S : empty);
}

/* ---- LDL^T: Bunch-Kaufman, as LAPACK's sytrf/sytrs (lower) ------------------------------------ */

/* Shapes: the batch is flattened, a is [B, n, n]; per-matrix scalars are [B]. */
typedef struct {
  int64_t B, n;
  int64_t d3[3], d2[2];
} tpu_ldl_sh;

static tpu_hv ldl_b2(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv x) { /* [B] -> [B, n] */
  int64_t b0 = 0;
  return tpu_hlo_broadcast_in_dim(H, x, 2, s->d2, &b0);
}
static tpu_hv ldl_b3(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv x) { /* [B] -> [B, n, n] */
  int64_t b0 = 0;
  return tpu_hlo_broadcast_in_dim(H, x, 3, s->d3, &b0);
}
static tpu_hv ldl_asrow(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv v) { /* [B, n] -> [B, i, j] = v[b, j] */
  int64_t bd[2] = {0, 2};
  return tpu_hlo_broadcast_in_dim(H, v, 3, s->d3, bd);
}
static tpu_hv ldl_ascol(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv v) { /* [B, n] -> [B, i, j] = v[b, i] */
  int64_t bd[2] = {0, 1};
  return tpu_hlo_broadcast_in_dim(H, v, 3, s->d3, bd);
}
static tpu_hv ldl_iota3(tpu_lower *L, const tpu_ldl_sh *s, int d) {
  return tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 3, s->d3), d);
}
static tpu_hv ldl_iota2(tpu_lower *L, const tpu_ldl_sh *s) {
  return tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, s->d2), 1);
}
static tpu_hv ldl_eq(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_compare(H, TPU_HLO_EQ, a, b); }
/* row i ([B]) of a [B, n, n]: [B, n] */
static tpu_hv ldl_row(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv a, tpu_hv i) {
  return tpu_pick_masked(L, ldl_eq(L, ldl_iota3(L, s, 1), ldl_b3(L, s, i)), a, 1);
}
/* column j ([B]) of a [B, n, n]: [B, n] */
static tpu_hv ldl_col(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv a, tpu_hv j) {
  return tpu_pick_masked(L, ldl_eq(L, ldl_iota3(L, s, 2), ldl_b3(L, s, j)), a, 2);
}
/* v[b, i_b] of v [B, n] */
static tpu_hv ldl_at(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv v, tpu_hv i) {
  return tpu_pick_masked(L, ldl_eq(L, ldl_iota2(L, s), ldl_b2(L, s, i)), v, 1);
}
/* a [B, n, m] with rows i and j ([B]) swapped */
static tpu_hv ldl_swap_rows(tpu_lower *L, tpu_hv a, tpu_hv i, tpu_hv j) {
  const tpu_hlo_type t = *T(L, a);
  int64_t b0 = 0, bd[2] = {0, 2}, rd[2] = {t.dims[0], t.dims[2]};
  tpu_hv row = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 3, t.dims), 1);
  tpu_hv isi = ldl_eq(L, row, tpu_hlo_broadcast_in_dim(H, i, 3, t.dims, &b0));
  tpu_hv isj = ldl_eq(L, row, tpu_hlo_broadcast_in_dim(H, j, 3, t.dims, &b0));
  tpu_hv ri = tpu_pick_masked(L, isi, a, 1), rj = tpu_pick_masked(L, isj, a, 1);
  (void)rd;
  tpu_hv rib = tpu_hlo_broadcast_in_dim(H, ri, 3, t.dims, bd), rjb = tpu_hlo_broadcast_in_dim(H, rj, 3, t.dims, bd);
  return tpu_sel(L, isi, rjb, tpu_sel(L, isj, rib, a));
}

#define TPU_BK_ALPHA 0.64038820320220756872 /* (1 + sqrt(17)) / 8 */

/* One step of the factorization at each matrix's own k; the trailing block
 * a[k:, k:] is kept symmetric (both triangles), the finished columns of L
 * below the diagonal. Returns the new state through the pointers. */
static void ldl_factor_step(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv *pa, tpu_hv *pk, tpu_hv *ppiv, tpu_hv *pinfo) {
  tpu_hv A = *pa, k = *pk, piv = *ppiv, info = *pinfo;
  tpu_dtype dt = T(L, A)->dtype;
  int64_t n = s->n, d1 = 1;
  tpu_hv active = tpu_hlo_compare(H, TPU_HLO_LT, k, tpu_k(L, k, (double)n));
  tpu_hv rows2 = ldl_iota2(L, s);
  tpu_hv row3 = ldl_iota3(L, s, 1), col3 = ldl_iota3(L, s, 2);
  tpu_hv one = tpu_k(L, k, 1);
  /* column k: the pivot candidate and the largest entry below it */
  tpu_hv ck = ldl_col(L, s, A, k);
  tpu_hv akk = ldl_at(L, s, ck, k), absakk = tpu_hlo_unary(H, TPU_HLO_ABS, akk);
  tpu_hv below = tpu_hlo_compare(H, TPU_HLO_GT, rows2, ldl_b2(L, s, k));
  tpu_hv mag = tpu_sel(L, below, tpu_hlo_unary(H, TPU_HLO_ABS, ck), tpu_k(L, ck, -1));
  tpu_hv colmax = tpu_hlo_reduce(H, mag, tpu_hlo_constant(H, dt, -INFINITY), &d1, 1, TPU_HLO_MAX);
  tpu_hv ismax = tpu_and(L, below, ldl_eq(L, mag, ldl_b2(L, s, colmax)));
  tpu_hv imax = tpu_hlo_reduce(H, tpu_sel(L, ismax, rows2, tpu_k(L, rows2, (double)n)),
                               tpu_hlo_constant_int(H, TPU_S64, n), &d1, 1, TPU_HLO_MIN);
  imax = tpu_sel(L, tpu_hlo_compare(H, TPU_HLO_GE, imax, tpu_k(L, imax, (double)n)), k, imax);
  colmax = tpu_hlo_binary(H, TPU_HLO_MAX, colmax, tpu_k(L, colmax, 0));
  tpu_hv zero = tpu_or(L, ldl_eq(L, tpu_hlo_binary(H, TPU_HLO_MAX, absakk, colmax), tpu_k(L, colmax, 0)),
                       tpu_hlo_compare(H, TPU_HLO_NE, absakk, absakk));
  /* the largest off-diagonal entry of row imax in the trailing block */
  tpu_hv ri = ldl_row(L, s, A, imax);
  tpu_hv inr = tpu_and(L, tpu_hlo_compare(H, TPU_HLO_GE, rows2, ldl_b2(L, s, k)),
                       tpu_hlo_compare(H, TPU_HLO_NE, rows2, ldl_b2(L, s, imax)));
  tpu_hv rowmax = tpu_hlo_reduce(H, tpu_sel(L, inr, tpu_hlo_unary(H, TPU_HLO_ABS, ri), tpu_k(L, ri, 0)),
                                 tpu_hlo_constant(H, dt, 0), &d1, 1, TPU_HLO_MAX);
  tpu_hv aimax = tpu_hlo_unary(H, TPU_HLO_ABS, ldl_at(L, s, ri, imax));
  tpu_hv acol = tpu_mul(L, colmax, tpu_k(L, colmax, TPU_BK_ALPHA));
  tpu_hv c1 = tpu_hlo_compare(H, TPU_HLO_GE, absakk, acol);
  tpu_hv c2 = tpu_hlo_compare(H, TPU_HLO_GE, absakk, tpu_mul(L, acol, tpu_div(L, colmax, rowmax)));
  tpu_hv c3 = tpu_hlo_compare(H, TPU_HLO_GE, aimax, tpu_mul(L, rowmax, tpu_k(L, rowmax, TPU_BK_ALPHA)));
  tpu_hv nopiv = tpu_or(L, zero, tpu_or(L, c1, c2));
  tpu_hv two = tpu_and(L, tpu_not(L, nopiv), tpu_not(L, c3));
  tpu_hv kp = tpu_sel(L, nopiv, k, imax);
  tpu_hv kk = tpu_sel(L, two, tpu_add(L, k, one), k);
  /* swap kk and kp in the trailing block (rows and columns) */
  tpu_hv trail = tpu_and(L, tpu_hlo_compare(H, TPU_HLO_GE, row3, ldl_b3(L, s, k)),
                         tpu_hlo_compare(H, TPU_HLO_GE, col3, ldl_b3(L, s, k)));
  tpu_hv As = ldl_swap_rows(L, A, kk, kp);
  As = tpu_mT(L, ldl_swap_rows(L, tpu_mT(L, As), kk, kp));
  As = tpu_sel(L, trail, As, A);
  /* 1x1 pivot: A(i, j) += x_i (-x_j / d) for i, j > k; column k scaled by 1/d */
  tpu_hv x = ldl_col(L, s, As, k);
  tpu_hv d11 = tpu_div(L, tpu_k(L, akk, 1), ldl_at(L, s, x, k));
  x = tpu_sel(L, below, x, tpu_k(L, x, 0));
  tpu_hv tmp = tpu_mul(L, ldl_b2(L, s, tpu_hlo_unary(H, TPU_HLO_NEG, d11)), x);
  tpu_hv rest1 = tpu_and(L, tpu_hlo_compare(H, TPU_HLO_GT, row3, ldl_b3(L, s, k)),
                         tpu_hlo_compare(H, TPU_HLO_GT, col3, ldl_b3(L, s, k)));
  tpu_hv A1 = tpu_sel(L, rest1, tpu_add(L, As, tpu_mul(L, ldl_ascol(L, s, x), ldl_asrow(L, s, tmp))), As);
  tpu_hv colk3 = tpu_and(L, ldl_eq(L, col3, ldl_b3(L, s, k)), tpu_hlo_compare(H, TPU_HLO_GT, row3, ldl_b3(L, s, k)));
  A1 = tpu_sel(L, colk3, ldl_ascol(L, s, tpu_mul(L, x, ldl_b2(L, s, d11))), A1);
  /* 2x2 pivot on (k, k+1): for i >= j >= k+2, A(i, j) -= A(i,k) wk_j + A(i,k+1) wkp1_j */
  tpu_hv k1 = tpu_add(L, k, one);
  tpu_hv c0 = ldl_col(L, s, As, k), c1v = ldl_col(L, s, As, k1);
  tpu_hv d21 = ldl_at(L, s, c0, k1);
  tpu_hv e11 = tpu_div(L, ldl_at(L, s, c1v, k1), d21), e22 = tpu_div(L, ldl_at(L, s, c0, k), d21);
  tpu_hv t = tpu_div(L, tpu_k(L, e11, 1), tpu_sub(L, tpu_mul(L, e11, e22), tpu_k(L, e11, 1)));
  tpu_hv f21 = tpu_div(L, t, d21);
  tpu_hv below2 = tpu_hlo_compare(H, TPU_HLO_GT, rows2, ldl_b2(L, s, k1));
  c0 = tpu_sel(L, below2, c0, tpu_k(L, c0, 0));
  c1v = tpu_sel(L, below2, c1v, tpu_k(L, c1v, 0));
  tpu_hv wk = tpu_mul(L, ldl_b2(L, s, f21), tpu_sub(L, tpu_mul(L, ldl_b2(L, s, e11), c0), c1v));
  tpu_hv wkp1 = tpu_mul(L, ldl_b2(L, s, f21), tpu_sub(L, tpu_mul(L, ldl_b2(L, s, e22), c1v), c0));
  tpu_hv rest2 = tpu_and(L, tpu_hlo_compare(H, TPU_HLO_GT, row3, ldl_b3(L, s, k1)),
                         tpu_hlo_compare(H, TPU_HLO_GT, col3, ldl_b3(L, s, k1)));
  tpu_hv up = tpu_sub(L, tpu_sub(L, As, tpu_mul(L, ldl_ascol(L, s, c0), ldl_asrow(L, s, wk))),
                      tpu_mul(L, ldl_ascol(L, s, c1v), ldl_asrow(L, s, wkp1)));
  tpu_hv A2 = tpu_sel(L, rest2, up, As);
  tpu_hv b2r = tpu_hlo_compare(H, TPU_HLO_GT, row3, ldl_b3(L, s, k1));
  A2 = tpu_sel(L, tpu_and(L, ldl_eq(L, col3, ldl_b3(L, s, k)), b2r), ldl_ascol(L, s, wk), A2);
  A2 = tpu_sel(L, tpu_and(L, ldl_eq(L, col3, ldl_b3(L, s, k1)), b2r), ldl_ascol(L, s, wkp1), A2);
  /* the chosen update; the lower triangle is what LAPACK computes, mirrored up */
  tpu_hv An = tpu_sel(L, ldl_b3(L, s, zero), As, tpu_sel(L, ldl_b3(L, s, two), A2, A1));
  An = tpu_sel(L, tpu_hlo_compare(H, TPU_HLO_GE, row3, col3), An, tpu_mT(L, An));
  An = tpu_sel(L, ldl_b3(L, s, active), An, A);
  /* pivots (1-based; a 2x2 block marks both rows with -(kp + 1)) and info */
  tpu_hv kp1 = tpu_hlo_convert(H, tpu_add(L, kp, one), TPU_S32);
  tpu_hv pv = tpu_sel(L, two, tpu_hlo_unary(H, TPU_HLO_NEG, kp1), kp1);
  tpu_hv atk = ldl_eq(L, rows2, ldl_b2(L, s, k));
  tpu_hv atk1 = tpu_and(L, ldl_b2(L, s, two), ldl_eq(L, rows2, ldl_b2(L, s, k1)));
  tpu_hv pn = tpu_sel(L, tpu_or(L, atk, atk1), ldl_b2(L, s, pv), piv);
  piv = tpu_sel(L, ldl_b2(L, s, active), pn, piv);
  tpu_hv setinfo = tpu_and(L, tpu_and(L, active, zero), ldl_eq(L, info, tpu_k(L, info, 0)));
  info = tpu_sel(L, setinfo, tpu_hlo_convert(H, tpu_add(L, k, one), TPU_S32), info);
  *pa = An;
  *pk = tpu_sel(L, active, tpu_add(L, k, tpu_sel(L, two, tpu_k(L, k, 2), one)), k);
  *ppiv = piv;
  *pinfo = info;
}

/* linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False) -> (LD, pivots, info) */
void tpu_emit_linalg_ldl_factor_ex(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "torch.linalg.ldl_factor_ex")) return;
  tpu_tref *t = &L->args[0].t;
  int r = t->rank, nb = r - 2;
  int64_t n = t->sizes[r - 1], B = 1;
  for (int i = 0; i < nb; i++) B *= t->sizes[i];
  int64_t pd[TPU_MAX_RANK];
  memcpy(pd, t->sizes, sizeof(int64_t) * (size_t)(r - 1));
  tpu_dtype dt = t->dtype;
  if (B == 0 || n == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, r, t->sizes), 0));
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S32, r - 1, pd), 0));
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S32, nb, t->sizes), 0));
    return;
  }
  tpu_ldl_sh s = {B, n, {B, n, n}, {B, n}};
  tpu_hv a = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 3, s.d3);
  /* the symmetric matrix of the lower triangle */
  tpu_hv r3 = ldl_iota3(L, &s, 1), c3 = ldl_iota3(L, &s, 2);
  a = tpu_sel(L, tpu_hlo_compare(H, TPU_HLO_GE, r3, c3), a, tpu_mT(L, a));
  tpu_hv init[5] = {tpu_hlo_constant_int(H, TPU_S64, 0), a, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &B), 0),
                    tpu_lower_full(L, tpu_hlo_type_make(TPU_S32, 2, s.d2), 0),
                    tpu_lower_full(L, tpu_hlo_type_make(TPU_S32, 1, &B), 0)};
  tpu_hlo_type ts[5];
  for (int i = 0; i < 5; i++) ts[i] = *T(L, init[i]);
  int cond = tpu_count_cond(L, ts, 5, n);
  tpu_hv v[5];
  tpu_hlo_region_begin(H, ts, 5, v);
  ldl_factor_step(L, &s, &v[1], &v[2], &v[3], &v[4]);
  v[0] = tpu_add(L, v[0], tpu_hlo_constant_int(H, TPU_S64, 1));
  int body = tpu_hlo_region_end(H, v, 5);
  tpu_hv fin[5];
  if (!tpu_while(L, init, 5, cond, body, fin)) return;
  tpu_hv ld = tpu_sel(L, tpu_hlo_compare(H, TPU_HLO_GE, r3, c3), fin[1], tpu_k(L, fin[1], 0));
  tpu_lower_out(L, tpu_hlo_reshape(H, ld, r, t->sizes));
  tpu_lower_out(L, tpu_hlo_reshape(H, fin[3], r - 1, pd));
  tpu_lower_out(L, tpu_hlo_reshape(H, fin[4], nb, t->sizes));
}

/* Rows of b [B, n, m] at i ([B]): [B, m] */
static tpu_hv ldl_brow(tpu_lower *L, tpu_hv b, tpu_hv i) {
  const tpu_hlo_type t = *T(L, b);
  int64_t b0 = 0;
  tpu_hv row = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 3, t.dims), 1);
  return tpu_pick_masked(L, ldl_eq(L, row, tpu_hlo_broadcast_in_dim(H, i, 3, t.dims, &b0)), b, 1);
}

/* One step of sytrs's solve with L D (forward) or L^T (backward) at each
 * matrix's own k (backward: k is the last row of its block). */
static void ldl_solve_step(tpu_lower *L, const tpu_ldl_sh *s, tpu_hv ld, tpu_hv piv, bool fwd, tpu_hv *pb, tpu_hv *pk) {
  tpu_hv Bm = *pb, k = *pk;
  const tpu_hlo_type bt = *T(L, Bm);
  int64_t n = s->n, b0 = 0, bdr[2] = {0, 2}, bdc[2] = {0, 1};
  tpu_hv one = tpu_k(L, k, 1);
  tpu_hv active = fwd ? tpu_hlo_compare(H, TPU_HLO_LT, k, tpu_k(L, k, (double)n))
                      : tpu_hlo_compare(H, TPU_HLO_GE, k, tpu_k(L, k, 0));
  tpu_hv kc = tpu_hlo_clamp(H, tpu_k(L, k, 0), k, tpu_k(L, k, (double)(n - 1)));
  tpu_hv rows2 = ldl_iota2(L, s);
  tpu_hv pk_ = tpu_hlo_convert(H, ldl_at(L, s, tpu_hlo_convert(H, piv, TPU_S64), kc), TPU_S64);
  tpu_hv two = tpu_hlo_compare(H, TPU_HLO_LT, pk_, tpu_k(L, pk_, 0));
  tpu_hv kp = tpu_sel(L, two, tpu_sub(L, tpu_hlo_unary(H, TPU_HLO_NEG, pk_), one), tpu_sub(L, pk_, one));
  tpu_hv rowb = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 3, bt.dims), 1);
  tpu_hv Bn;
  if (fwd) {
    tpu_hv k1 = tpu_add(L, k, one);
    tpu_hv kc1 = tpu_hlo_clamp(H, tpu_k(L, k, 0), k1, tpu_k(L, k, (double)(n - 1)));
    /* 1x1: swap k, kp; B[i] -= LD[i, k] B[k] (i > k); B[k] /= LD[k, k] */
    tpu_hv B1 = ldl_swap_rows(L, Bm, kc, kp);
    tpu_hv lk = ldl_col(L, s, ld, kc);
    tpu_hv lkb = tpu_sel(L, tpu_hlo_compare(H, TPU_HLO_GT, rows2, ldl_b2(L, s, kc)), lk, tpu_k(L, lk, 0));
    tpu_hv bk = ldl_brow(L, B1, kc);
    /* products only where they apply: 0 * inf would make NaN elsewhere */
    tpu_hv gt1 = tpu_hlo_compare(H, TPU_HLO_GT, rowb, tpu_hlo_broadcast_in_dim(H, kc, 3, bt.dims, &b0));
    B1 = tpu_sel(L, gt1,
                 tpu_sub(L, B1,
                         tpu_mul(L, tpu_hlo_broadcast_in_dim(H, lkb, 3, bt.dims, bdc),
                                 tpu_hlo_broadcast_in_dim(H, bk, 3, bt.dims, bdr))),
                 B1);
    tpu_hv dk = tpu_div(L, tpu_k(L, ldl_at(L, s, lk, kc), 1), ldl_at(L, s, lk, kc));
    tpu_hv isk = ldl_eq(L, rowb, tpu_hlo_broadcast_in_dim(H, kc, 3, bt.dims, &b0));
    B1 = tpu_sel(L, isk, tpu_mul(L, B1, tpu_hlo_broadcast_in_dim(H, dk, 3, bt.dims, &b0)), B1);
    /* 2x2 on (k, k+1): swap k+1, kp; eliminate below with both columns; solve the block */
    tpu_hv B2 = ldl_swap_rows(L, Bm, kc1, kp);
    tpu_hv l1 = ldl_col(L, s, ld, kc1);
    tpu_hv below2 = tpu_hlo_compare(H, TPU_HLO_GT, rows2, ldl_b2(L, s, kc1));
    tpu_hv lkz = tpu_sel(L, below2, lk, tpu_k(L, lk, 0)), l1z = tpu_sel(L, below2, l1, tpu_k(L, l1, 0));
    tpu_hv b1 = ldl_brow(L, B2, kc), b2 = ldl_brow(L, B2, kc1);
    tpu_hv gt2 = tpu_hlo_compare(H, TPU_HLO_GT, rowb, tpu_hlo_broadcast_in_dim(H, kc1, 3, bt.dims, &b0));
    tpu_hv u2 = tpu_sub(L, B2,
                        tpu_mul(L, tpu_hlo_broadcast_in_dim(H, lkz, 3, bt.dims, bdc),
                                tpu_hlo_broadcast_in_dim(H, b1, 3, bt.dims, bdr)));
    u2 = tpu_sub(L, u2,
                 tpu_mul(L, tpu_hlo_broadcast_in_dim(H, l1z, 3, bt.dims, bdc),
                         tpu_hlo_broadcast_in_dim(H, b2, 3, bt.dims, bdr)));
    B2 = tpu_sel(L, gt2, u2, B2);
    tpu_hv akm1k = ldl_at(L, s, lk, kc1);
    tpu_hv akm1 = tpu_div(L, ldl_at(L, s, lk, kc), akm1k), ak = tpu_div(L, ldl_at(L, s, l1, kc1), akm1k);
    tpu_hv denom = tpu_sub(L, tpu_mul(L, akm1, ak), tpu_k(L, ak, 1));
    int64_t m = bt.dims[2], bm[2] = {s->B, m};
    tpu_hv akm1kb = tpu_hlo_broadcast_in_dim(H, akm1k, 2, bm, &b0),
           denb = tpu_hlo_broadcast_in_dim(H, denom, 2, bm, &b0);
    tpu_hv bkm1 = tpu_div(L, b1, akm1kb), bkk = tpu_div(L, b2, akm1kb);
    tpu_hv n1 = tpu_div(L, tpu_sub(L, tpu_mul(L, tpu_hlo_broadcast_in_dim(H, ak, 2, bm, &b0), bkm1), bkk), denb);
    tpu_hv n2 = tpu_div(L, tpu_sub(L, tpu_mul(L, tpu_hlo_broadcast_in_dim(H, akm1, 2, bm, &b0), bkk), bkm1), denb);
    tpu_hv isk1 = ldl_eq(L, rowb, tpu_hlo_broadcast_in_dim(H, kc1, 3, bt.dims, &b0));
    B2 = tpu_sel(L, isk, tpu_hlo_broadcast_in_dim(H, n1, 3, bt.dims, bdr),
                 tpu_sel(L, isk1, tpu_hlo_broadcast_in_dim(H, n2, 3, bt.dims, bdr), B2));
    Bn = tpu_sel(L, tpu_hlo_broadcast_in_dim(H, two, 3, bt.dims, &b0), B2, B1);
    *pk = tpu_sel(L, active, tpu_add(L, k, tpu_sel(L, two, tpu_k(L, k, 2), one)), k);
  } else {
    tpu_hv km1 = tpu_hlo_clamp(H, tpu_k(L, k, 0), tpu_sub(L, k, one), tpu_k(L, k, (double)(n - 1)));
    tpu_hv below = tpu_hlo_compare(H, TPU_HLO_GT, rows2, ldl_b2(L, s, kc));
    tpu_hv lk = ldl_col(L, s, ld, kc);
    lk = tpu_sel(L, below, lk, tpu_k(L, lk, 0));
    int64_t d1 = 1;
    /* B[k] -= sum_{i > k} LD[i, k] B[i] */
    tpu_hv below3 = tpu_hlo_broadcast_in_dim(H, below, 3, bt.dims, bdc);
    tpu_hv zb = tpu_k(L, Bm, 0);
    tpu_hv sk =
        tpu_hlo_reduce(H, tpu_sel(L, below3, tpu_mul(L, tpu_hlo_broadcast_in_dim(H, lk, 3, bt.dims, bdc), Bm), zb),
                       tpu_hlo_constant(H, bt.dtype, 0), &d1, 1, TPU_HLO_ADD);
    tpu_hv isk = ldl_eq(L, rowb, tpu_hlo_broadcast_in_dim(H, kc, 3, bt.dims, &b0));
    tpu_hv B1 = tpu_sel(L, isk, tpu_sub(L, Bm, tpu_hlo_broadcast_in_dim(H, sk, 3, bt.dims, bdr)), Bm);
    /* 2x2 (rows k-1, k): also B[k-1] -= sum_{i > k} LD[i, k-1] B[i] */
    tpu_hv lm = ldl_col(L, s, ld, km1);
    lm = tpu_sel(L, below, lm, tpu_k(L, lm, 0));
    tpu_hv sm =
        tpu_hlo_reduce(H, tpu_sel(L, below3, tpu_mul(L, tpu_hlo_broadcast_in_dim(H, lm, 3, bt.dims, bdc), Bm), zb),
                       tpu_hlo_constant(H, bt.dtype, 0), &d1, 1, TPU_HLO_ADD);
    tpu_hv ism = ldl_eq(L, rowb, tpu_hlo_broadcast_in_dim(H, km1, 3, bt.dims, &b0));
    tpu_hv B2 = tpu_sel(L, tpu_and(L, ism, tpu_hlo_broadcast_in_dim(H, two, 3, bt.dims, &b0)),
                        tpu_sub(L, B1, tpu_hlo_broadcast_in_dim(H, sm, 3, bt.dims, bdr)), B1);
    Bn = ldl_swap_rows(L, B2, kc, kp);
    *pk = tpu_sel(L, active, tpu_sub(L, k, tpu_sel(L, two, tpu_k(L, k, 2), one)), k);
  }
  *pb = tpu_sel(L, tpu_hlo_broadcast_in_dim(H, active, 3, bt.dims, &b0), Bn, Bm);
}

/* linalg_ldl_solve(LD, pivots, B, *, hermitian=False) */
void tpu_emit_linalg_ldl_solve(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, true, "torch.linalg.ldl_solve")) return;
  tpu_tref *ld = &L->args[0].t, *pv = &L->args[1].t, *b = &L->args[2].t;
  if (b->rank < 2) { /* as the CPU, which first looks at B's dim -2 */
    int rk = b->rank > 0 ? b->rank : 1;
    tpu_lower_fail(L, TPU_ERR_INDEX, "Dimension out of range (expected to be in range of [%d, %d], but got -2)", -rk,
                   rk - 1);
    return;
  }
  int64_t n = ld->sizes[ld->rank - 1];
  if (pv->dtype != TPU_S32) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.linalg.ldl_solve: Expected pivots to be integers. Got %s",
                   tpu_dtype_name(pv->dtype));
    return;
  }
  if (b->dtype != ld->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.linalg.ldl_solve: LD dtype %s does not match b dtype %s",
                   tpu_dtype_c10_name(ld->dtype), tpu_dtype_c10_name(b->dtype));
    return;
  }
  if (pv->rank != ld->rank - 1 || pv->sizes[pv->rank - 1] != n || b->sizes[b->rank - 2] != n) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.linalg.ldl_solve: Incompatible shapes of LD, pivots and B");
    return;
  }
  /* the common batch shape */
  int nb = ld->rank - 2 > b->rank - 2 ? ld->rank - 2 : b->rank - 2;
  int64_t bs[TPU_MAX_RANK];
  for (int i = 0; i < nb; i++) {
    int il = i - (nb - (ld->rank - 2)), ib = i - (nb - (b->rank - 2));
    int64_t sl = il >= 0 ? ld->sizes[il] : 1, sb = ib >= 0 ? b->sizes[ib] : 1;
    if (sl != sb && sl != 1 && sb != 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.linalg.ldl_solve: the batch dimensions of LD and B do not broadcast");
      return;
    }
    bs[i] = sl == 1 ? sb : sl;
  }
  int64_t m = b->sizes[b->rank - 1], B = 1;
  for (int i = 0; i < nb; i++) B *= bs[i];
  int64_t od[TPU_MAX_RANK], lshape[TPU_MAX_RANK], pshape[TPU_MAX_RANK];
  memcpy(od, bs, sizeof(int64_t) * (size_t)nb);
  memcpy(lshape, bs, sizeof(int64_t) * (size_t)nb);
  memcpy(pshape, bs, sizeof(int64_t) * (size_t)nb);
  od[nb] = n;
  od[nb + 1] = m;
  lshape[nb] = n;
  lshape[nb + 1] = n;
  pshape[nb] = n;
  if (B == 0 || n == 0 || m == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(b->dtype, nb + 2, od), 0));
    return;
  }
  tpu_ldl_sh s = {B, n, {B, n, n}, {B, n}};
  int64_t b3[3] = {B, n, m};
  tpu_hv LDv = tpu_hlo_reshape(H, tpu_lower_broadcast_to(L, tpu_lower_tensor(L, 0, -1), nb + 2, lshape), 3, s.d3);
  tpu_hv P = tpu_hlo_reshape(H, tpu_lower_broadcast_to(L, tpu_lower_tensor(L, 1, -1), nb + 1, pshape), 2, s.d2);
  tpu_hv Bm = tpu_hlo_reshape(H, tpu_lower_broadcast_to(L, tpu_lower_tensor(L, 2, -1), nb + 2, od), 3, b3);
  for (int pass = 0; pass < 2; pass++) {
    bool fwd = pass == 0;
    tpu_hv init[5] = {tpu_hlo_constant_int(H, TPU_S64, 0), Bm,
                      tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &B), fwd ? 0 : (double)(n - 1)), LDv, P};
    tpu_hlo_type ts[5];
    for (int i = 0; i < 5; i++) ts[i] = *T(L, init[i]);
    int cond = tpu_count_cond(L, ts, 5, n);
    tpu_hv v[5];
    tpu_hlo_region_begin(H, ts, 5, v);
    ldl_solve_step(L, &s, v[3], v[4], fwd, &v[1], &v[2]);
    v[0] = tpu_add(L, v[0], tpu_hlo_constant_int(H, TPU_S64, 1));
    int body = tpu_hlo_region_end(H, v, 5);
    tpu_hv fin[5];
    if (!tpu_while(L, init, 5, cond, body, fin)) return;
    Bm = fin[1];
  }
  tpu_lower_out(L, tpu_hlo_reshape(H, Bm, nb + 2, od));
}

/* emit_linalg.c: matrix products beyond mm/bmm, cross products, eye, and the
 * triangular family (Cholesky factorisation and triangular solves), which
 * StableHLO has as ops (stablehlo.cholesky, stablehlo.triangular_solve).
 * Products accumulate in f32 for half types, at the highest precision. */
#include <stdio.h>
#include <string.h>

#include "emit.h"

static tpu_hv tpu_dot(tpu_lower *L, tpu_hv a, tpu_hv b, int nb, const int64_t *lb, const int64_t *rb, int nc,
                      const int64_t *lc, const int64_t *rc) {
  tpu_dtype dt = T(L, a)->dtype;
  tpu_hv r = tpu_hlo_dot_general(H, a, b, nb, lb, rb, nc, lc, rc, TPU_HLO_PREC_HIGHEST, tpu_acc_type(dt));
  return tpu_hlo_convert(H, r, dt);
}

/* beta * self + alpha * p with torch's rule that beta == 0 ignores self
 * (NaNs in it included); beta and alpha are program inputs. */
static tpu_hv tpu_beta_alpha(tpu_lower *L, int self_i, int beta_i, int alpha_i, tpu_hv p) {
  const tpu_hlo_type pt = *T(L, p);
  tpu_dtype dt = pt.dtype;
  if (!L->args[alpha_i].is_default) p = tpu_mul(L, p, tpu_lower_broadcast_to(L, tpu_lower_scalar(L, alpha_i, dt), pt.rank, pt.dims));
  tpu_hv s = tpu_lower_broadcast_to(L, tpu_lower_input(L, self_i, dt), pt.rank, pt.dims);
  if (!L->args[beta_i].is_default) {
    tpu_hv beta = tpu_lower_broadcast_to(L, tpu_lower_scalar(L, beta_i, dt), pt.rank, pt.dims);
    tpu_hv zero = tpu_k(L, s, 0);
    s = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, beta, zero), zero, tpu_mul(L, s, beta));
  }
  return tpu_add(L, s, p);
}

static bool tpu_same_dtype(tpu_lower *L, int a, int b) {
  if (L->args[a].t.dtype == L->args[b].t.dtype) return true;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected m1 and m2 to have the same dtype, but got: %s != %s",
                 tpu_dtype_name(L->args[a].t.dtype), tpu_dtype_name(L->args[b].t.dtype));
  return false;
}

/* baddbmm(self, batch1, batch2, *, beta=1, alpha=1) */
void tpu_emit_baddbmm(tpu_lower *L) {
  if (!tpu_same_dtype(L, 1, 2)) return;
  tpu_hv a = tpu_lower_tensor(L, 1, -1), b = tpu_lower_tensor(L, 2, -1);
  const tpu_hlo_type *at = T(L, a), *bt = T(L, b);
  if (at->rank != 3 || bt->rank != 3 || at->dims[0] != bt->dims[0] || at->dims[2] != bt->dims[1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "baddbmm: batch1 and batch2 shapes cannot be multiplied");
    return;
  }
  int64_t z = 0, lc = 2, rc = 1;
  tpu_lower_out(L, tpu_beta_alpha(L, 0, 3, 4, tpu_dot(L, a, b, 1, &z, &z, 1, &lc, &rc)));
}

/* addbmm(self, batch1, batch2, *, beta=1, alpha=1): the batch is summed */
void tpu_emit_addbmm(tpu_lower *L) {
  if (!tpu_same_dtype(L, 1, 2)) return;
  tpu_hv a = tpu_lower_tensor(L, 1, -1), b = tpu_lower_tensor(L, 2, -1);
  const tpu_hlo_type *at = T(L, a), *bt = T(L, b);
  if (at->rank != 3 || bt->rank != 3 || at->dims[0] != bt->dims[0] || at->dims[2] != bt->dims[1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "addbmm: batch1 and batch2 shapes cannot be multiplied");
    return;
  }
  int64_t lc[2] = {0, 2}, rc[2] = {0, 1};
  tpu_lower_out(L, tpu_beta_alpha(L, 0, 3, 4, tpu_dot(L, a, b, 0, NULL, NULL, 2, lc, rc)));
}

/* addmv(self, mat, vec, *, beta=1, alpha=1) */
void tpu_emit_addmv(tpu_lower *L) {
  if (!tpu_same_dtype(L, 1, 2)) return;
  tpu_hv a = tpu_lower_tensor(L, 1, -1), v = tpu_lower_tensor(L, 2, -1);
  if (T(L, a)->rank != 2 || T(L, v)->rank != 1 || T(L, a)->dims[1] != T(L, v)->dims[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "size mismatch, got input, mat, vec");
    return;
  }
  int64_t lc = 1, rc = 0;
  tpu_lower_out(L, tpu_beta_alpha(L, 0, 3, 4, tpu_dot(L, a, v, 0, NULL, NULL, 1, &lc, &rc)));
}

/* vdot(self, other): conj(self) . other for 1-D tensors */
void tpu_emit_vdot(tpu_lower *L) {
  if (!tpu_same_dtype(L, 0, 1)) return;
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  if (T(L, a)->rank != 1 || T(L, b)->rank != 1 || T(L, a)->dims[0] != T(L, b)->dims[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "1D tensors expected, but got %dD and %dD tensors", T(L, a)->rank, T(L, b)->rank);
    return;
  }
  if (tpu_dtype_is_complex(T(L, a)->dtype)) {
    tpu_hv re = tpu_hlo_unary(H, TPU_HLO_REAL, a), im = tpu_hlo_unary(H, TPU_HLO_IMAG, a);
    a = tpu_hlo_binary(H, TPU_HLO_COMPLEX, re, tpu_hlo_unary(H, TPU_HLO_NEG, im));
  }
  int64_t c = 0;
  tpu_lower_out(L, tpu_dot(L, a, b, 0, NULL, NULL, 1, &c, &c));
}

static tpu_hv tpu_take1(tpu_lower *L, tpu_hv x, int64_t dim, int64_t i) {
  const tpu_hlo_type *t = T(L, x);
  int64_t s[TPU_MAX_RANK] = {0}, l[TPU_MAX_RANK], st[TPU_MAX_RANK];
  for (int k = 0; k < t->rank; k++) {
    l[k] = t->dims[k];
    st[k] = 1;
  }
  s[dim] = i;
  l[dim] = i + 1;
  return tpu_hlo_slice(H, x, s, l, st);
}

/* linalg_cross(self, other, *, dim=-1) */
void tpu_emit_linalg_cross(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  const tpu_hlo_type t = *T(L, v[0]);
  if (t.dtype == TPU_INVALID) return;
  int64_t d = tpu_lower_dim(L, L->args[2].i, t.rank);
  if (t.dims[d] != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "linalg.cross: inputs dimension %lld must have length 3. Got %lld and %lld",
                   (long long)d, (long long)L->args[0].t.sizes[d], (long long)L->args[1].t.sizes[d]);
    return;
  }
  tpu_hv a[3], b[3], c[3];
  for (int i = 0; i < 3; i++) {
    a[i] = tpu_take1(L, v[0], d, i);
    b[i] = tpu_take1(L, v[1], d, i);
  }
  for (int i = 0; i < 3; i++) {
    int j = (i + 1) % 3, k = (i + 2) % 3;
    c[i] = tpu_sub(L, tpu_mul(L, a[j], b[k]), tpu_mul(L, a[k], b[j]));
  }
  tpu_lower_out(L, tpu_hlo_concat(H, c, 3, (int)d));
}

/* eye.out(n) / eye.m_out(n, m): the out= tensor gives the dtype */
void tpu_emit_eye(tpu_lower *L) {
  int64_t n = L->args[0].i, m = L->args[1].kind == TPU_ARG_INT ? L->args[1].i : n;
  if (n < 0 || m < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "n must be greater or equal to 0, got %lld", (long long)(n < 0 ? n : m));
    return;
  }
  int64_t d[2] = {n, m};
  tpu_hlo_type t = tpu_hlo_type_make(TPU_S64, 2, d);
  tpu_lower_out(L, tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, t, 0), tpu_hlo_iota(H, t, 1)));
}

/* ---- triangular family ------------------------------------------------------------------- */

/* The lower (or upper) triangle of the trailing matrices of x. */
static tpu_hv tpu_tri_mask(tpu_lower *L, tpu_hv x, bool lower) {
  const tpu_hlo_type t = *T(L, x);
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, t.rank, t.dims);
  tpu_hv r = tpu_hlo_iota(H, it, t.rank - 2), c = tpu_hlo_iota(H, it, t.rank - 1);
  tpu_hv keep = tpu_hlo_compare(H, lower ? TPU_HLO_GE : TPU_HLO_LE, r, c);
  return tpu_hlo_select(H, keep, x, tpu_k(L, x, 0));
}

/* Swap the last two dims (conjugating complex values: the adjoint). */
static tpu_hv tpu_mT(tpu_lower *L, tpu_hv x) {
  const tpu_hlo_type *t = T(L, x);
  int64_t p[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) p[i] = i;
  p[t->rank - 2] = t->rank - 1;
  p[t->rank - 1] = t->rank - 2;
  return tpu_hlo_transpose(H, x, p);
}

static tpu_hv tpu_cholesky_lower(tpu_lower *L, tpu_hv a) {
  tpu_hlo_type t = *T(L, a);
  tpu_dtype dt = t.dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_hlo_convert(H, a, acc);
  tpu_hlo_type at = *T(L, x);
  tpu_hv r = tpu_hlo_emit1(H, "stablehlo.cholesky", &x, 1, "lower = true", at);
  return tpu_hlo_convert(H, tpu_tri_mask(L, r, true), dt);
}

static bool tpu_check_square(tpu_lower *L, const tpu_tref *t, const char *op) {
  if (t->rank >= 2 && t->sizes[t->rank - 1] == t->sizes[t->rank - 2]) return true;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: A must be batches of square matrices, but they are %lld by %lld matrices", op,
                 (long long)(t->rank >= 2 ? t->sizes[t->rank - 2] : 0), (long long)(t->rank >= 1 ? t->sizes[t->rank - 1] : 0));
  return false;
}

static bool tpu_check_float(tpu_lower *L, const tpu_tref *t, const char *op) {
  if (t->dtype == TPU_F32 || t->dtype == TPU_F64 || tpu_dtype_is_complex(t->dtype)) return true;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: Expected a floating point or complex tensor as input. Got %s", op,
                 tpu_dtype_name(t->dtype));
  return false;
}

/* cholesky(self, upper=False) */
void tpu_emit_cholesky(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_square(L, t, "linalg.cholesky") || !tpu_check_float(L, t, "linalg.cholesky")) return;
  tpu_hv r = tpu_cholesky_lower(L, tpu_lower_tensor(L, 0, -1));
  tpu_lower_out(L, tpu_arg_bool(L, 1) ? tpu_mT(L, r) : r);
}

/* linalg_cholesky_ex(self, *, upper=False, check_errors=False) -> (L, info):
 * info is nonzero where the factorisation failed (NaNs appeared). */
void tpu_emit_cholesky_ex(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_square(L, t, "linalg.cholesky") || !tpu_check_float(L, t, "linalg.cholesky")) return;
  tpu_hv r = tpu_cholesky_lower(L, tpu_lower_tensor(L, 0, -1));
  tpu_hlo_type rt = *T(L, r);
  int64_t dims[2] = {rt.rank - 2, rt.rank - 1};
  tpu_hv bad = tpu_hlo_reduce(H, tpu_hlo_compare(H, TPU_HLO_NE, r, r), tpu_hlo_constant_int(H, TPU_PRED, 0), dims, 2,
                              TPU_HLO_OR);
  tpu_lower_out(L, tpu_arg_bool(L, 1) ? tpu_mT(L, r) : r);
  tpu_lower_out(L, tpu_hlo_convert(H, bad, TPU_S32));
}

/* Solve op(A) X = B (left) with A triangular; batch dims broadcast. */
static tpu_hv tpu_trsm(tpu_lower *L, tpu_hv a, tpu_hv b, bool left, bool lower, bool unit, bool transpose) {
  tpu_hlo_type at = *T(L, a), bt = *T(L, b);
  /* broadcast batch dims */
  int rank = at.rank > bt.rank ? at.rank : bt.rank;
  int64_t batch[TPU_MAX_RANK];
  for (int i = 0; i < rank - 2; i++) {
    int ia = i - (rank - at.rank), ib = i - (rank - bt.rank);
    int64_t da = ia >= 0 ? at.dims[ia] : 1, db = ib >= 0 ? bt.dims[ib] : 1;
    batch[i] = da == 1 ? db : da;
  }
  int64_t ad[TPU_MAX_RANK], bd[TPU_MAX_RANK];
  memcpy(ad, batch, sizeof(int64_t) * (size_t)(rank - 2));
  memcpy(bd, batch, sizeof(int64_t) * (size_t)(rank - 2));
  ad[rank - 2] = at.dims[at.rank - 2];
  ad[rank - 1] = at.dims[at.rank - 1];
  bd[rank - 2] = bt.dims[bt.rank - 2];
  bd[rank - 1] = bt.dims[bt.rank - 1];
  a = tpu_lower_broadcast_to(L, a, rank, ad);
  b = tpu_lower_broadcast_to(L, b, rank, bd);
  tpu_dtype dt = bt.dtype, acc = tpu_acc_type(dt);
  a = tpu_hlo_convert(H, a, acc);
  b = tpu_hlo_convert(H, b, acc);
  char attrs[160];
  snprintf(attrs, sizeof attrs, "left_side = %s, lower = %s, transpose_a = #stablehlo<transpose %s>, unit_diagonal = %s",
           left ? "true" : "false", lower ? "true" : "false", transpose ? "TRANSPOSE" : "NO_TRANSPOSE",
           unit ? "true" : "false");
  tpu_hv ops[2] = {a, b};
  tpu_hv x = tpu_hlo_emit1(H, "stablehlo.triangular_solve", ops, 2, attrs, *T(L, b));
  return tpu_hlo_convert(H, x, dt);
}

/* triangular_solve(self=B, A, upper=True, transpose=False, unitriangular=False) -> (X, A) */
void tpu_emit_triangular_solve(tpu_lower *L) {
  tpu_hv b = tpu_lower_tensor(L, 0, -1), a = tpu_lower_tensor(L, 1, -1);
  if (!tpu_check_square(L, &L->args[1].t, "triangular_solve")) return;
  bool upper = L->args[2].kind != TPU_ARG_BOOL || L->args[2].i;
  tpu_hv x = tpu_trsm(L, a, b, true, !upper, tpu_arg_bool(L, 4), tpu_arg_bool(L, 3));
  tpu_lower_out(L, x);
  const tpu_hlo_type xt = *T(L, x);
  int64_t ad[TPU_MAX_RANK];
  memcpy(ad, xt.dims, sizeof(int64_t) * (size_t)xt.rank);
  ad[xt.rank - 1] = ad[xt.rank - 2];
  tpu_lower_out(L, tpu_lower_broadcast_to(L, a, xt.rank, ad));
}

/* linalg_solve_triangular(self=A, B, *, upper, left=True, unitriangular=False) */
void tpu_emit_solve_triangular(tpu_lower *L) {
  if (!tpu_check_square(L, &L->args[0].t, "linalg.solve_triangular")) return;
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  bool left = L->args[3].kind != TPU_ARG_BOOL || L->args[3].i;
  tpu_lower_out(L, tpu_trsm(L, a, b, left, !tpu_arg_bool(L, 2), tpu_arg_bool(L, 4), false));
}

/* _cholesky_solve_helper(self=B, A=factor, upper): A A^H X = B */
void tpu_emit_cholesky_solve(tpu_lower *L) {
  tpu_hv b = tpu_lower_tensor(L, 0, -1), f = tpu_lower_tensor(L, 1, -1);
  bool upper = tpu_arg_bool(L, 2);
  tpu_hv lo = upper ? tpu_mT(L, f) : f;
  tpu_hv y = tpu_trsm(L, lo, b, true, true, false, false);
  tpu_lower_out(L, tpu_trsm(L, lo, y, true, true, false, true));
}

/* cholesky_inverse(self=factor, upper=False): (L L^H)^-1 */
void tpu_emit_cholesky_inverse(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_square(L, t, "cholesky_inverse")) return;
  tpu_hv f = tpu_lower_tensor(L, 0, -1);
  tpu_hv lo = tpu_arg_bool(L, 1) ? tpu_mT(L, f) : f;
  tpu_hlo_type ft = *T(L, f);
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, ft.rank, ft.dims);
  tpu_hv eye = tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, it, ft.rank - 2),
                                                  tpu_hlo_iota(H, it, ft.rank - 1)), ft.dtype);
  tpu_hv y = tpu_trsm(L, lo, eye, true, true, false, false);
  tpu_lower_out(L, tpu_trsm(L, lo, y, true, true, false, true));
}

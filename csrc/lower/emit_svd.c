/* emit_svd.c: the singular value decomposition, by one-sided (Hestenes)
 * Jacobi (the sweeps are emit_linalg.c's, shared with eigh).
 *
 * The Jacobi rotations orthogonalise the columns of the tall one of A and
 * A^T: W = A V with orthogonal columns, S their norms, V the accumulated
 * rotations. The columns W / S are the other factor's first k vectors; a
 * zero (or, for a matrix of lower rank, a tiny, noisy) column carries no
 * direction, and full_matrices asks for more columns than there are. Both
 * are settled by one Householder QR of those columns, in descending order of
 * S: Q's columns, each turned to the sign of R's diagonal, are the columns
 * of W / S where S is not small (up to rounding), an orthonormal completion
 * elsewhere, and Q's trailing columns complete the basis (what LAPACK's
 * gesdd returns in U for full_matrices, up to the choice of basis of that
 * complement, which the decomposition leaves open). */
#include <string.h>

#include "linalg.h"

/* Thin SVD of a [..., m, n] with m >= n by one-sided Jacobi: returns the
 * rotated columns W = U diag(S) and V, after `sweeps` cyclic sweeps. */
static void tpu_jacobi_svd(tpu_lower *L, tpu_hv a, int sweeps, tpu_hv *w_out, tpu_hv *v_out) {
  const tpu_hlo_type at = *T(L, a);
  int r = at.rank;
  int64_t vd[TPU_MAX_RANK];
  memcpy(vd, at.dims, sizeof(int64_t) * (size_t)r);
  vd[r - 2] = at.dims[r - 1];
  tpu_hlo_type vt = tpu_hlo_type_make(at.dtype, r, vd);
  tpu_hv v = tpu_eye_like(L, &vt);
  if (!tpu_jacobi_sweeps(L, false, sweeps, &a, &v)) return;
  *w_out = a;
  *v_out = v;
}

/* An orthonormal basis [..., m, ncols] (k <= ncols <= m) whose first k
 * columns are those of u [..., m, k] (unit columns, mutually orthogonal up
 * to rounding, ordered so that any zero or tiny ones come last): Q of u's
 * Householder QR, column j times the sign of R[j, j] (+ where R[j, j] is 0
 * and past k). */
static tpu_hv tpu_svd_basis(tpu_lower *L, tpu_hv u, int64_t ncols) {
  tpu_hv packed = TPU_HV_NONE, taus = TPU_HV_NONE;
  tpu_geqrf(L, u, &packed, &taus);
  if (!tpu_hlo_ok(H)) return TPU_HV_NONE;
  tpu_hv q = tpu_hh_product(L, packed, taus, ncols);
  const tpu_hlo_type pt = *T(L, packed);
  int r = pt.rank;
  int64_t k = pt.dims[r - 1];
  if (k == 0 || tpu_hlo_type_numel(T(L, q)) == 0) return q;
  /* R's diagonal: the packed entries (j, j), j < k */
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, r, pt.dims);
  tpu_hv on = tpu_hlo_compare(H, TPU_HLO_EQ, tpu_hlo_iota(H, it, r - 2), tpu_hlo_iota(H, it, r - 1));
  int64_t rows = r - 2;
  tpu_hv d = tpu_hlo_reduce(H, tpu_hlo_select(H, on, packed, tpu_k(L, packed, 0)), tpu_hlo_constant(H, pt.dtype, 0),
                            &rows, 1, TPU_HLO_ADD); /* [..., k] */
  tpu_hv sg = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_LT, d, tpu_k(L, d, 0)), tpu_k(L, d, -1), tpu_k(L, d, 1));
  if (ncols > k) {
    int64_t lo[TPU_MAX_RANK] = {0}, hi[TPU_MAX_RANK] = {0}, in[TPU_MAX_RANK] = {0};
    hi[r - 2] = ncols - k;
    sg = tpu_hlo_pad(H, sg, tpu_hlo_constant(H, pt.dtype, 1), lo, hi, in);
  }
  const tpu_hlo_type *qt = T(L, q);
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < r - 2; i++) bd[i] = i;
  bd[r - 2] = r - 1;
  return tpu_mul(L, q, tpu_hlo_broadcast_in_dim(H, sg, r, qt->dims, bd));
}

void tpu_svd(tpu_lower *L, tpu_hv a, bool full, tpu_hv *U, tpu_hv *S, tpu_hv *V) {
  const tpu_hlo_type at = *T(L, a);
  int r = at.rank;
  bool wide = at.dims[r - 2] < at.dims[r - 1];
  int64_t big = wide ? at.dims[r - 1] : at.dims[r - 2], k = wide ? at.dims[r - 2] : at.dims[r - 1];
  tpu_hv w = TPU_HV_NONE, v = TPU_HV_NONE;
  tpu_jacobi_svd(L, wide ? tpu_mT(L, a) : a, 12, &w, &v);
  if (!tpu_hlo_ok(H)) return;
  /* singular values: column norms; normalised columns (0 for a zero column) */
  tpu_hv wt = tpu_mT(L, w);
  int64_t d = r - 1;
  tpu_hv s2 = tpu_hlo_reduce(H, tpu_mul(L, wt, wt), tpu_hlo_constant(H, at.dtype, 0), &d, 1, TPU_HLO_ADD);
  tpu_hv s = tpu_hlo_unary(H, TPU_HLO_SQRT, s2);
  const tpu_hlo_type *wty = T(L, w);
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < r - 2; i++) bd[i] = i;
  bd[r - 2] = r - 1;
  tpu_hv sb = tpu_hlo_broadcast_in_dim(H, s, r, wty->dims, bd);
  tpu_hv z = tpu_hlo_compare(H, TPU_HLO_EQ, sb, tpu_k(L, sb, 0));
  tpu_hv u = tpu_hlo_select(H, z, tpu_k(L, w, 0),
                            tpu_hlo_binary(H, TPU_HLO_DIV, w, tpu_hlo_select(H, z, tpu_k(L, sb, 1), sb)));
  tpu_hv M = TPU_HV_NONE;
  s = tpu_sort_desc(L, s, &M);
  u = tpu_svd_basis(L, tpu_bmatmul(L, u, M), full ? big : k);
  v = tpu_bmatmul(L, v, M);
  *S = s;
  *U = wide ? v : u;
  *V = wide ? u : v;
}

/* _linalg_svd.U(A, full_matrices, compute_uv, *, driver, U, S, Vh) */
void tpu_emit_linalg_svd(tpu_lower *L) {
  if (!tpu_check_matrix(L, 0, false, "linalg.svd")) return;
  tpu_tref *t = &L->args[0].t;
  bool full = tpu_arg_bool_or(L, 1, false), uv = tpu_arg_bool_or(L, 2, true);
  tpu_hv U = TPU_HV_NONE, S = TPU_HV_NONE, V = TPU_HV_NONE;
  tpu_svd(L, tpu_lower_tensor(L, 0, -1), uv && full, &U, &S, &V);
  int64_t z = 0;
  tpu_hv empty = tpu_lower_full(L, tpu_hlo_type_make(t->dtype, 1, &z), 0);
  tpu_lower_out(L, uv ? U : empty);
  tpu_lower_out(L, S);
  tpu_lower_out(L, uv ? tpu_mT(L, V) : empty);
}

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

__attribute__((unused)) static bool tpu_bool_arg(tpu_lower *L, int i, bool dflt) {
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

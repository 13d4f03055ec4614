/* emit_distance.c: pairwise distances (torch.cdist, torch.pdist) and their
 * gradients: p-norms of the differences of row pairs.
 */
#include "linalg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Pairwise differences x1[..., P, 1, M] - x2[..., 1, R, M]: [..., P, R, M]. */
static tpu_hv tpu_pair_diff(tpu_lower *L, tpu_hv x1, tpu_hv x2) {
  const tpu_hlo_type *a = T(L, x1), *b = T(L, x2);
  int r = a->rank;
  int64_t d[TPU_MAX_RANK], b1[TPU_MAX_RANK], b2[TPU_MAX_RANK];
  for (int i = 0; i < r - 2; i++) {
    d[i] = a->dims[i];
    b1[i] = b2[i] = i;
  }
  d[r - 2] = a->dims[r - 2];
  d[r - 1] = b->dims[r - 2];
  d[r] = a->dims[r - 1];
  b1[r - 2] = r - 2;
  b1[r - 1] = r;
  b2[r - 2] = r - 1;
  b2[r - 1] = r;
  return tpu_sub(L, tpu_hlo_broadcast_in_dim(H, x1, r + 1, d, b1), tpu_hlo_broadcast_in_dim(H, x2, r + 1, d, b2));
}

/* p-norm over the last dim of diff, torch's special cases for p = 0, 1, 2, inf. */
static tpu_hv tpu_pnorm_last(tpu_lower *L, tpu_hv diff, double p) {
  const tpu_hlo_type *t = T(L, diff);
  int64_t d = t->rank - 1;
  tpu_dtype dt = t->dtype;
  tpu_hv a = tpu_hlo_unary(H, TPU_HLO_ABS, diff);
  tpu_hv zero = tpu_hlo_constant(H, dt, 0);
  if (p == 0) {
    tpu_hv nz = tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_NE, diff, tpu_k(L, diff, 0)), dt);
    return tpu_hlo_reduce(H, nz, zero, &d, 1, TPU_HLO_ADD);
  }
  if (isinf(p)) return tpu_hlo_reduce(H, a, zero, &d, 1, TPU_HLO_MAX);
  if (p == 1) return tpu_hlo_reduce(H, a, zero, &d, 1, TPU_HLO_ADD);
  if (p == 2)
    return tpu_hlo_unary(H, TPU_HLO_SQRT, tpu_hlo_reduce(H, tpu_mul(L, diff, diff), zero, &d, 1, TPU_HLO_ADD));
  tpu_hv s = tpu_hlo_reduce(H, tpu_hlo_binary(H, TPU_HLO_POW, a, tpu_k(L, a, p)), zero, &d, 1, TPU_HLO_ADD);
  return tpu_hlo_binary(H, TPU_HLO_POW, s, tpu_k(L, s, 1.0 / p));
}

/* d dist / d x1 contracted with g: sum_R g * f(diff, dist), [..., P, M]. */
static tpu_hv tpu_pnorm_grad(tpu_lower *L, tpu_hv g, tpu_hv diff, tpu_hv dist, double p) {
  const tpu_hlo_type *t = T(L, diff);
  int r = t->rank;
  int64_t bd[TPU_MAX_RANK];
  for (int i = 0; i < r - 1; i++) bd[i] = i;
  tpu_hv gb = tpu_hlo_broadcast_in_dim(H, g, r, t->dims, bd);
  tpu_hv db = tpu_hlo_broadcast_in_dim(H, dist, r, t->dims, bd);
  tpu_hv zero = tpu_k(L, diff, 0);
  tpu_hv sg = tpu_hlo_unary(H, TPU_HLO_SIGN, diff);
  tpu_hv a = tpu_hlo_unary(H, TPU_HLO_ABS, diff);
  tpu_hv dz = tpu_hlo_compare(H, TPU_HLO_EQ, db, zero);
  tpu_hv f;
  if (p == 0) {
    f = zero;
  } else if (p == 1) {
    f = sg;
  } else if (isinf(p)) {
    f = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, a, db), sg, zero);
  } else if (p == 2) {
    f = tpu_hlo_select(H, dz, zero, tpu_hlo_binary(H, TPU_HLO_DIV, diff, tpu_hlo_select(H, dz, tpu_k(L, db, 1), db)));
  } else {
    tpu_hv num = tpu_mul(L, sg, tpu_hlo_binary(H, TPU_HLO_POW, a, tpu_k(L, a, p - 1)));
    tpu_hv den = tpu_hlo_binary(H, TPU_HLO_POW, tpu_hlo_select(H, dz, tpu_k(L, db, 1), db), tpu_k(L, db, p - 1));
    tpu_hv bad = dz;
    if (p < 1) bad = tpu_hlo_binary(H, TPU_HLO_OR, bad, tpu_hlo_compare(H, TPU_HLO_EQ, diff, zero));
    f = tpu_hlo_select(H, bad, zero, tpu_hlo_binary(H, TPU_HLO_DIV, num, den));
  }
  int64_t d = r - 2;
  return tpu_hlo_reduce(H, tpu_mul(L, gb, f), tpu_hlo_constant(H, t->dtype, 0), &d, 1, TPU_HLO_ADD);
}

static bool tpu_check_p(tpu_lower *L, double p, const char *fn) {
  if (!(p >= 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s only supports non-negative p values", fn);
    return false;
  }
  return true;
}

/* _cdist_forward(x1, x2, p, compute_mode) */
void tpu_emit_cdist_forward(tpu_lower *L) {
  tpu_tref *a = &L->args[0].t, *b = &L->args[1].t;
  double p = L->args[2].f;
  if (!tpu_check_p(L, p, "cdist")) return;
  if (a->rank < 2 || b->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "cdist only supports at least 2D tensors, X%d got: %dD", a->rank < 2 ? 1 : 2,
                   a->rank < 2 ? a->rank : b->rank);
    return;
  }
  if (a->sizes[a->rank - 1] != b->sizes[b->rank - 1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "X1 and X2 must have the same number of columns. X1: %lld X2: %lld",
                   (long long)a->sizes[a->rank - 1], (long long)b->sizes[b->rank - 1]);
    return;
  }
  if (!tpu_dtype_is_float(a->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "cdist only supports floating-point dtypes, X1 got: %s",
                   tpu_dtype_name(a->dtype));
    return;
  }
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  tpu_hv x1 = tpu_lower_input(L, 0, acc), x2 = tpu_lower_input(L, 1, acc);
  if (!tpu_batch_bcast(L, &x1, &x2)) return;
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_pnorm_last(L, tpu_pair_diff(L, x1, x2), p), dt));
}

/* _cdist_backward(grad, x1, x2, p, cdist): the gradient for x1 (summed back
 * to x1's batch shape when it was broadcast). */
void tpu_emit_cdist_backward(tpu_lower *L) {
  double p = L->args[3].f;
  tpu_tref *a = &L->args[1].t;
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  tpu_hv x1 = tpu_lower_input(L, 1, acc), x2 = tpu_lower_input(L, 2, acc);
  if (!tpu_batch_bcast(L, &x1, &x2)) return;
  const tpu_hlo_type *bt = T(L, x1);
  int r = bt->rank;
  int64_t gd[TPU_MAX_RANK];
  memcpy(gd, bt->dims, sizeof(int64_t) * (size_t)r);
  gd[r - 1] = T(L, x2)->dims[r - 2];
  tpu_hv g = tpu_lower_broadcast_to(L, tpu_lower_input(L, 0, acc), r, gd);
  tpu_hv d = tpu_lower_broadcast_to(L, tpu_lower_input(L, 4, acc), r, gd);
  tpu_hv gx = tpu_pnorm_grad(L, g, tpu_pair_diff(L, x1, x2), d, p);
  /* sum the broadcast batch dims back */
  const tpu_hlo_type *gt = T(L, gx);
  int extra = gt->rank - a->rank;
  int64_t red[TPU_MAX_RANK];
  int nr = 0;
  for (int i = 0; i < gt->rank - 2; i++)
    if (i < extra || (a->sizes[i - extra] == 1 && gt->dims[i] != 1)) red[nr++] = i;
  if (nr) {
    gx = tpu_hlo_reduce(H, gx, tpu_hlo_constant(H, acc, 0), red, nr, TPU_HLO_ADD);
    gx = tpu_hlo_reshape(H, gx, a->rank, a->sizes);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, gx, dt));
}

/* Flat indices i * n + j of the pairs i < j, row-major: s64 [n(n-1)/2, 1]. */
static tpu_hv tpu_upper_pairs(tpu_lower *L, int64_t n, int64_t *count) {
  int64_t np = n * (n - 1) / 2;
  *count = np;
  int64_t *ix = malloc(sizeof(int64_t) * (size_t)(np ? np : 1));
  if (!ix) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: out of memory", L->opname);
    return TPU_HV_NONE;
  }
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = i + 1; j < n; j++) ix[k++] = i * n + j;
  int64_t d[2] = {np, 1};
  tpu_hv v = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, d), ix);
  free(ix);
  return v;
}

/* _pdist_forward(self [N, M], p): distances of the pairs i < j. */
void tpu_emit_pdist_forward(tpu_lower *L) {
  tpu_tref *a = &L->args[0].t;
  double p = L->args[1].f;
  if (!tpu_check_p(L, p, "pdist")) return;
  if (a->rank != 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "pdist only supports 2D tensors, got: %dD", a->rank);
    return;
  }
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  int64_t n = a->sizes[0], np;
  tpu_hv x = tpu_lower_input(L, 0, acc);
  if (n < 2) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &(int64_t){0}), 0));
    return;
  }
  tpu_hv idx = tpu_upper_pairs(L, n, &np);
  tpu_hv D = tpu_pnorm_last(L, tpu_pair_diff(L, x, x), p);
  int64_t nn = n * n;
  tpu_hv flat = tpu_hlo_reshape(H, D, 1, &nn);
  tpu_hv r = tpu_lower_gather_rows(L, flat, idx);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, r, 1, &np), dt));
}

/* _pdist_backward(grad, self, p, pdist) */
void tpu_emit_pdist_backward(tpu_lower *L) {
  tpu_tref *a = &L->args[1].t;
  double p = L->args[2].f;
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  int64_t n = a->sizes[0], np;
  tpu_hv x = tpu_lower_input(L, 1, acc);
  if (n < 2) {
    tpu_lower_out(L, tpu_hlo_convert(H, tpu_k(L, x, 0), dt));
    return;
  }
  tpu_hv idx = tpu_upper_pairs(L, n, &np);
  int64_t nn = n * n, sq[2] = {n, n};
  tpu_hlo_type ft = tpu_hlo_type_make(acc, 1, &nn);
  /* the pair values spread into symmetric n x n matrices */
  tpu_hv g = tpu_hlo_reshape(
      H, tpu_lower_scatter_rows(L, tpu_lower_full(L, ft, 0), idx, tpu_lower_input(L, 0, acc), -1), 2, sq);
  tpu_hv d = tpu_hlo_reshape(
      H, tpu_lower_scatter_rows(L, tpu_lower_full(L, ft, 0), idx, tpu_lower_input(L, 3, acc), -1), 2, sq);
  g = tpu_add(L, g, tpu_mT(L, g));
  d = tpu_add(L, d, tpu_mT(L, d));
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_pnorm_grad(L, g, tpu_pair_diff(L, x, x), d, p), dt));
}

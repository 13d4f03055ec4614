/* emit_index.c: gather/scatter along a dim, advanced indexing, flips and
 * rolls. Element-wise gathers and scatters ("point" form) address every
 * element with its full coordinates, built from the index tensor along the
 * indexed dim and iotas along the others; advanced indexing moves the
 * indexed dims to the front and gathers slices with one stablehlo.gather
 * (or scatter, for index_put). Negative indices wrap where torch allows. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "emit.h"

/* ---- helpers --------------------------------------------------------------------------- */

static const char *tpu_arg_str(tpu_lower *L, int i) {
  return i < L->nargs && L->args[i].kind == TPU_ARG_STR ? L->args[i].str : NULL;
}

/* idx (integer, shape S) wrapped into [0, n) where negative. */
static tpu_hv tpu_wrap_index(tpu_lower *L, tpu_hv idx, int64_t n) {
  idx = tpu_hlo_convert(H, idx, TPU_S64);
  tpu_hv neg = tpu_hlo_compare(H, TPU_HLO_LT, idx, tpu_k(L, idx, 0));
  return tpu_hlo_select(H, neg, tpu_add(L, idx, tpu_k(L, idx, (double)n)), idx);
}

/* Coordinates [N, rank] of the elements of shape(idx): along dim the index
 * value, elsewhere the element's own position. */
static tpu_hv tpu_coords_along(tpu_lower *L, tpu_hv idx, int64_t dim) {
  tpu_hlo_type it = *T(L, idx);
  int r = it.rank;
  int64_t n = tpu_hlo_type_numel(&it), n1[2] = {n, 1};
  tpu_hv cols[TPU_MAX_RANK];
  for (int k = 0; k < r; k++) {
    tpu_hv c = k == dim ? tpu_hlo_convert(H, idx, TPU_S64) : tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, it.dims), k);
    cols[k] = tpu_hlo_reshape(H, c, 2, n1);
  }
  return tpu_hlo_concat(H, cols, r, 1);
}

/* operand elements at coords [N, rank] -> [N] */
static tpu_hv tpu_point_gather(tpu_lower *L, tpu_hv operand, tpu_hv coords) {
  tpu_hlo_type ot = *T(L, operand);
  int r = ot.rank;
  tpu_hlo_gather_dims g;
  memset(&g, 0, sizeof g);
  int64_t slice[TPU_MAX_RANK];
  for (int k = 0; k < r; k++) {
    g.collapsed_slice_dims[g.n_collapsed++] = k;
    g.start_index_map[g.n_start_index_map++] = k;
    slice[k] = 1;
  }
  g.index_vector_dim = 1;
  int64_t n = T(L, coords)->dims[0];
  return tpu_hlo_gather(H, operand, coords, &g, slice, tpu_hlo_type_make(ot.dtype, 1, &n));
}

/* operand with updates [N] combined into the elements at coords [N, rank]
 * by region ((old, new) -> value), or replacing them (region -1). */
static tpu_hv tpu_point_scatter(tpu_lower *L, tpu_hv operand, tpu_hv coords, tpu_hv updates, int region) {
  int r = T(L, operand)->rank;
  tpu_hlo_scatter_dims d;
  memset(&d, 0, sizeof d);
  for (int k = 0; k < r; k++) {
    d.inserted_window_dims[d.n_inserted++] = k;
    d.scatter_dims_to_operand_dims[d.n_scatter_to_operand++] = k;
  }
  d.index_vector_dim = 1;
  return tpu_hlo_scatter(H, operand, coords, updates, &d, region);
}

/* A region (old, new) -> op(old, new) on scalars of dt. */
static int tpu_combine_region(tpu_lower *L, tpu_dtype dt, tpu_hlo_op op) {
  tpu_hlo_type st[2] = {tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(dt, 0, NULL)};
  tpu_hv a[2];
  tpu_hlo_region_begin(H, st, 2, a);
  if (dt == TPU_PRED) op = op == TPU_HLO_MUL ? TPU_HLO_AND : TPU_HLO_OR;
  tpu_hv v = tpu_hlo_binary(H, op, a[0], a[1]);
  return tpu_hlo_region_end(H, &v, 1);
}

/* x with dim moved to the front (perm returned for moving it back). */
static tpu_hv tpu_dim_to_front(tpu_lower *L, tpu_hv x, int64_t dim, int64_t *perm, int64_t *inv) {
  int r = T(L, x)->rank;
  int k = 0;
  perm[k++] = dim;
  for (int i = 0; i < r; i++)
    if (i != dim) perm[k++] = i;
  for (int i = 0; i < r; i++) inv[perm[i]] = i;
  return tpu_hlo_transpose(H, x, perm);
}

static bool tpu_check_index_dtype(tpu_lower *L, int i, const char *op) {
  tpu_dtype dt = L->args[i].t.dtype;
  if (tpu_dtype_is_int(dt) || tpu_dtype_is_unsigned_int(dt)) return true;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s(): Expected dtype int64 for index", op);
  return false;
}

/* ---- gather / scatter along a dim -------------------------------------------------------------- */

/* gather(self, dim, index, *, sparse_grad=False) */
void tpu_emit_gather(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t, *it = &L->args[2].t;
  if (!tpu_check_index_dtype(L, 2, "gather")) return;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (it->zero_size || t->rank == 0) {
    tpu_hv idx0 = tpu_lower_tensor(L, 2, -1);
    tpu_hlo_type rt = *T(L, idx0);
    rt.dtype = t->dtype;
    tpu_lower_out(L, it->zero_size ? tpu_lower_full(L, rt, 0) : tpu_hlo_reshape(H, x, rt.rank, rt.dims));
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  if (it->rank != t->rank) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Index tensor must have the same number of dimensions as input tensor");
    return;
  }
  for (int i = 0; i < t->rank; i++) {
    if (i == d || it->sizes[i] <= t->sizes[i]) continue;
    char a[256], b[256];
    size_t na = 0, nb = 0;
    a[0] = b[0] = 0;
    for (int k = 0; k < t->rank; k++) {
      na += (size_t)snprintf(a + na, sizeof a - na, "%s%lld", k ? ", " : "", (long long)it->sizes[k]);
      nb += (size_t)snprintf(b + nb, sizeof b - nb, "%s%lld", k ? ", " : "", (long long)t->sizes[k]);
    }
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Size does not match at dimension %d expected index [%s] to be no larger than "
                   "self [%s] apart from dimension %lld",
                   i, a, b, (long long)d);
    return;
  }
  tpu_hv idx = tpu_lower_tensor(L, 2, -1);
  tpu_lower_check_range(L, idx, t->sizes[d], false, TPU_ERR_RUNTIME,
                        "index out of bounds: gather's indices must be in [0, size) of the dimension");
  tpu_hlo_type st = *T(L, idx);
  tpu_hv coords = tpu_coords_along(L, idx, d);
  tpu_hv v = tpu_point_gather(L, x, coords);
  tpu_lower_out(L, tpu_hlo_reshape(H, v, st.rank, st.dims));
}

/* src (a tensor at least as large as index in every dim) cut to index's shape */
static tpu_hv tpu_cut_to(tpu_lower *L, tpu_hv src, const tpu_hlo_type *shape) {
  const tpu_hlo_type *s = T(L, src);
  int64_t st[TPU_MAX_RANK] = {0}, lim[TPU_MAX_RANK], one[TPU_MAX_RANK];
  bool same = true;
  for (int i = 0; i < s->rank; i++) {
    lim[i] = shape->dims[i];
    one[i] = 1;
    same = same && lim[i] == s->dims[i];
  }
  return same ? src : tpu_hlo_slice(H, src, st, lim, one);
}

/* scatter family: (self, dim, index, src|value[, reduce]) and scatter_add */
static void tpu_emit_scatter_impl(tpu_lower *L, int mode /* 0 replace, 1 add, 2 mul */, bool from_str) {
  tpu_tref *t = &L->args[0].t, *it = &L->args[2].t;
  if (!tpu_check_index_dtype(L, 2, "scatter")) return;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (from_str) {
    const char *r = tpu_arg_str(L, 4);
    if (r && strcmp(r, "add") == 0)
      mode = 1;
    else if (r && strcmp(r, "multiply") == 0)
      mode = 2;
    else {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "reduce argument must be either add or multiply.");
      return;
    }
  }
  if (it->zero_size) {
    tpu_lower_out(L, x);
    return;
  }
  tpu_dtype dt = t->dtype;
  int64_t d = t->rank ? tpu_lower_dim(L, L->args[1].i, t->rank) : 0;
  tpu_hv idx = tpu_lower_tensor(L, 2, -1);
  tpu_lower_check_range(L, idx, t->rank ? t->sizes[d] : 1, false, TPU_ERR_RUNTIME,
                        "index out of bounds: scatter's indices must be in [0, size) of the dimension");
  tpu_hlo_type ishape = *T(L, idx);
  tpu_hv upd;
  if (L->args[3].kind == TPU_ARG_TENSOR) {
    upd = tpu_cut_to(L, tpu_hlo_convert(H, tpu_lower_tensor(L, 3, -1), dt), &ishape);
  } else {
    tpu_hlo_type ut = ishape;
    ut.dtype = dt;
    upd = tpu_lower_broadcast_to(L, tpu_lower_scalar(L, 3, dt), ut.rank, ut.dims);
  }
  if (t->rank == 0) { /* a 0-d self: the index can only be 0 */
    tpu_hv u = tpu_hlo_reshape(H, upd, 0, NULL);
    tpu_lower_out(L, mode == 0 ? u : tpu_hlo_binary(H, mode == 1 ? TPU_HLO_ADD : TPU_HLO_MUL, x, u));
    return;
  }
  int64_t n = tpu_hlo_type_numel(&ishape);
  tpu_hv coords = tpu_coords_along(L, idx, d);
  int region = mode == 0 ? -1 : tpu_combine_region(L, dt, mode == 1 ? TPU_HLO_ADD : TPU_HLO_MUL);
  tpu_lower_out(L, tpu_point_scatter(L, x, coords, tpu_hlo_reshape(H, upd, 1, &n), region));
}
void tpu_emit_scatter(tpu_lower *L) { tpu_emit_scatter_impl(L, 0, false); }
void tpu_emit_scatter_reduce_str(tpu_lower *L) { tpu_emit_scatter_impl(L, 0, true); }
void tpu_emit_scatter_add(tpu_lower *L) { tpu_emit_scatter_impl(L, 1, false); }

/* ---- along-a-dim selections ------------------------------------------------------------------ */

/* index_select(self, dim, index) */
void tpu_emit_index_select(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_index_dtype(L, 2, "index_select")) return;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv idx = tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), TPU_S64);
  int64_t n = tpu_hlo_type_numel(T(L, idx)), n1[2] = {n, 1};
  int64_t d = t->rank ? tpu_lower_dim(L, L->args[1].i, t->rank) : 0;
  tpu_lower_check_range(L, idx, t->rank ? t->sizes[d] : 1, false, TPU_ERR_INDEX, "index out of range in self");
  if (t->rank == 0) {
    tpu_lower_out(L, x);
    return;
  }
  int64_t perm[TPU_MAX_RANK], inv[TPU_MAX_RANK];
  tpu_hv xf = tpu_dim_to_front(L, x, d, perm, inv);
  tpu_hv g = tpu_lower_gather_rows(L, xf, tpu_hlo_reshape(H, idx, 2, n1));
  tpu_lower_out(L, tpu_hlo_transpose(H, g, inv));
}

/* index_add(self, dim, index, source, *, alpha=1) / index_copy(self, dim, index, source) */
static void tpu_emit_index_combine(tpu_lower *L, bool add) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_index_dtype(L, 2, add ? "index_add" : "index_copy")) return;
  tpu_dtype dt = t->dtype;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv src = tpu_hlo_convert(H, tpu_lower_tensor(L, 3, -1), dt);
  tpu_hv idx = tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), TPU_S64);
  int64_t n = tpu_hlo_type_numel(T(L, idx)), n1[2] = {n, 1};
  tpu_lower_check_range(
      L, idx, t->rank ? t->sizes[tpu_lower_dim(L, L->args[1].i, t->rank)] : 1, false, TPU_ERR_INDEX,
      add ? "index out of range in self" : "index_copy_(): an index is out of bounds for the dimension");
  if (add && L->nargs > 4 && L->args[4].kind == TPU_ARG_SCALAR && !L->args[4].is_default)
    src = tpu_mul(L, src, tpu_lower_broadcast_to(L, tpu_lower_scalar(L, 4, dt), T(L, src)->rank, T(L, src)->dims));
  if (t->rank == 0) {
    tpu_hv s0 = tpu_hlo_reshape(H, src, 0, NULL);
    tpu_lower_out(L, add ? tpu_add(L, x, s0) : s0);
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  if (T(L, src)->rank == 0) src = tpu_hlo_reshape(H, src, t->rank, (int64_t[TPU_MAX_RANK]){1});
  int64_t perm[TPU_MAX_RANK], inv[TPU_MAX_RANK];
  tpu_hv xf = tpu_dim_to_front(L, x, d, perm, inv);
  tpu_hv sf = tpu_hlo_transpose(H, src, perm);
  int region = add ? tpu_combine_region(L, dt, TPU_HLO_ADD) : -1;
  tpu_hv r = tpu_lower_scatter_rows(L, xf, tpu_hlo_reshape(H, idx, 2, n1), sf, region);
  tpu_lower_out(L, tpu_hlo_transpose(H, r, inv));
}
void tpu_emit_index_add(tpu_lower *L) { tpu_emit_index_combine(L, true); }
void tpu_emit_index_copy(tpu_lower *L) { tpu_emit_index_combine(L, false); }

/* index_fill(self, dim, index, value): value in every slice named by index */
void tpu_emit_index_fill(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_index_dtype(L, 2, "index_fill")) return;
  tpu_dtype dt = t->dtype;
  /* the CPU's refusal of a complex value for a real tensor (a number or a 0-d tensor), in
   * both forms; tpu wrote the real part */
  bool cvalue = L->args[3].kind == TPU_ARG_TENSOR ? tpu_dtype_is_complex(L->args[3].t.dtype)
                                                  : L->args[3].skind == TPU_SCALAR_COMPLEX;
  if (cvalue && !tpu_dtype_is_complex(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "index_fill_(): Converting complex Scalar to non-complex type is not supported");
    return;
  }
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv val = L->args[3].kind == TPU_ARG_TENSOR ? tpu_hlo_reshape(H, tpu_lower_input(L, 3, dt), 0, NULL)
                                                 : tpu_lower_scalar(L, 3, dt);
  if (t->rank == 0) {
    tpu_lower_out(L, val);
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[1].i, t->rank);
  int64_t sz = t->sizes[d];
  tpu_hv raw = tpu_lower_tensor(L, 2, -1);
  tpu_lower_check_range(L, raw, sz, true, TPU_ERR_INDEX, "index out of bounds: an index is not in [-size, size)");
  tpu_hv idx = tpu_wrap_index(L, raw, sz);
  int64_t n = tpu_hlo_type_numel(T(L, idx));
  idx = tpu_hlo_reshape(H, idx, 1, &n);
  int64_t md[2] = {sz, n}, b1[1] = {1};
  tpu_hv pos = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, md), 0);
  tpu_hv hit = tpu_hlo_compare(H, TPU_HLO_EQ, pos, tpu_hlo_broadcast_in_dim(H, idx, 2, md, b1));
  int64_t one = 1;
  tpu_hv m = tpu_hlo_reduce(H, hit, tpu_hlo_constant_int(H, TPU_PRED, 0), &one, 1, TPU_HLO_OR); /* [sz] */
  tpu_hv mb = tpu_hlo_broadcast_in_dim(H, m, t->rank, t->sizes, &d);
  tpu_lower_out(L, tpu_hlo_select(H, mb, tpu_lower_broadcast_to(L, val, t->rank, t->sizes), x));
}

/* ---- concatenation and triangles --------------------------------------------------------------- */

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

/* ---- flips and rolls ------------------------------------------------------------------------- */

/* flip(self, dims) */
void tpu_emit_flip(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int64_t dims[TPU_MAX_RANK];
  int n = 0;
  bool seen[TPU_MAX_RANK] = {0};
  for (int i = 0; i < L->args[1].nints; i++) {
    int64_t d = tpu_lower_dim(L, L->args[1].ints[i], t->rank);
    if (t->rank == 0) continue;
    if (seen[d]) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "dim %lld appears multiple times in the list of dims", (long long)d);
      return;
    }
    seen[d] = true;
    dims[n++] = d;
  }
  tpu_lower_out(L, n ? tpu_hlo_reverse(H, x, dims, n) : x);
}

static tpu_hv tpu_roll1(tpu_lower *L, tpu_hv x, int64_t dim, int64_t shift) {
  const tpu_hlo_type t = *T(L, x);
  int64_t n = t.dims[dim];
  if (n == 0) return x;
  int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  int64_t st[TPU_MAX_RANK] = {0}, lim[TPU_MAX_RANK], one[TPU_MAX_RANK], st2[TPU_MAX_RANK] = {0}, lim2[TPU_MAX_RANK];
  for (int i = 0; i < t.rank; i++) {
    lim[i] = lim2[i] = t.dims[i];
    one[i] = 1;
  }
  st[dim] = n - s; /* the tail comes first */
  lim2[dim] = n - s;
  tpu_hv parts[2] = {tpu_hlo_slice(H, x, st, lim, one), tpu_hlo_slice(H, x, st2, lim2, one)};
  return tpu_hlo_concat(H, parts, 2, (int)dim);
}

/* roll(self, shifts, dims=[]) */
void tpu_emit_roll(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int ns = L->args[1].nints, nd = L->args[2].nints;
  if (nd > 0 && t->rank == 0) {
    tpu_lower_fail(L, TPU_ERR_INDEX, "Dimension specified as %lld but tensor has no dimensions",
                   (long long)L->args[2].ints[0]);
    return;
  }
  if (nd == 0) {
    if (ns != 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "shifts and dimensions must align. shifts: %d, dims:0", ns);
      return;
    }
    int64_t n = tpu_hlo_type_numel(T(L, x));
    tpu_hv f = tpu_roll1(L, tpu_hlo_reshape(H, x, 1, &n), 0, L->args[1].ints[0]);
    tpu_lower_out(L, tpu_hlo_reshape(H, f, t->rank, t->sizes));
    return;
  }
  if (ns != nd) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "shifts and dimensions must align. shifts: %d, dims:%d", ns, nd);
    return;
  }
  for (int i = 0; i < nd; i++) x = tpu_roll1(L, x, tpu_lower_dim(L, L->args[2].ints[i], t->rank), L->args[1].ints[i]);
  tpu_lower_out(L, x);
}

/* ---- advanced indexing ---------------------------------------------------------------------------- */

typedef struct {
  int k;                 /* indexed dims */
  int pos[TPU_MAX_RANK]; /* which dims, in order */
  bool adjacent;         /* the indexed dims are consecutive */
  int brank;             /* rank of the broadcast index shape */
  int64_t bdims[TPU_MAX_RANK];
  tpu_hv stacked;             /* [B..., k] s64 */
  int64_t perm[TPU_MAX_RANK]; /* indexed dims first, then the rest */
  int rest;                   /* count of the other dims */
} tpu_adv;

/* Parse indices (argument ii, a Tensor?[] list) against self of rank r. */
static bool tpu_adv_parse(tpu_lower *L, int ii, const tpu_tref *t, tpu_adv *a) {
  memset(a, 0, sizeof *a);
  tpu_arg *li = &L->args[ii];
  if (li->nlist > t->rank) {
    tpu_lower_fail(L, TPU_ERR_INDEX, "too many indices for tensor of dimension %d (got %d)", t->rank, li->nlist);
    return false;
  }
  tpu_hv vals[TPU_MAX_RANK];
  for (int j = 0; j < li->nlist; j++) {
    tpu_tref *e = &li->list[j];
    if (!e->rec && !e->host && !e->zero_size) continue; /* None */
    if (e->dtype == TPU_PRED || e->dtype == TPU_U8) {
      tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED,
                     "%s: boolean mask indices have a data-dependent shape; index with mask.nonzero() instead",
                     L->opname);
      return false;
    }
    if (!tpu_dtype_is_int(e->dtype)) {
      tpu_lower_fail(L, TPU_ERR_INDEX, "tensors used as indices must be long, int, byte or bool tensors");
      return false;
    }
    if (t->sizes[j] == 0 && !e->zero_size) {
      tpu_lower_fail(L, TPU_ERR_INDEX, "index is out of bounds for dimension with size 0");
      return false;
    }
    tpu_hv raw = tpu_lower_tensor(L, ii, j);
    tpu_lower_check_range(L, raw, t->sizes[j], true, TPU_ERR_INDEX,
                          "index out of bounds: an index is not in [-size, size) of its dimension");
    vals[a->k] = tpu_wrap_index(L, raw, t->sizes[j]);
    a->pos[a->k++] = j;
  }
  if (a->k == 0) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s: indexing with only None indices", L->opname);
    return false;
  }
  a->adjacent = a->pos[a->k - 1] - a->pos[0] == a->k - 1;
  tpu_lower_broadcast_all(L, vals, a->k);
  const tpu_hlo_type *bt = T(L, vals[0]);
  if (bt->dtype == TPU_INVALID) return false;
  a->brank = bt->rank;
  memcpy(a->bdims, bt->dims, sizeof(int64_t) * (size_t)bt->rank);
  int64_t sd[TPU_MAX_RANK + 1];
  memcpy(sd, a->bdims, sizeof(int64_t) * (size_t)a->brank);
  sd[a->brank] = 1;
  for (int q = 0; q < a->k; q++) vals[q] = tpu_hlo_reshape(H, vals[q], a->brank + 1, sd);
  a->stacked = tpu_hlo_concat(H, vals, a->k, a->brank);
  int np = 0;
  bool used[TPU_MAX_RANK] = {0};
  for (int q = 0; q < a->k; q++) {
    a->perm[np++] = a->pos[q];
    used[a->pos[q]] = true;
  }
  for (int d = 0; d < t->rank; d++)
    if (!used[d]) a->perm[np++] = d;
  a->rest = t->rank - a->k;
  return true;
}

/* Result-layout permutation: the gather gives [B..., rest...]; torch puts B
 * where the (adjacent) indexed dims were. out_perm maps result dims. */
static void tpu_adv_result_perm(const tpu_adv *a, int64_t *out_perm, int *rank) {
  int nb = a->brank, r = nb + a->rest, p = 0;
  int before = a->adjacent ? a->pos[0] : 0;
  for (int i = 0; i < before; i++) out_perm[p++] = nb + i;       /* rest dims before */
  for (int i = 0; i < nb; i++) out_perm[p++] = i;                /* the broadcast dims */
  for (int i = before; i < a->rest; i++) out_perm[p++] = nb + i; /* rest dims after */
  *rank = r;
}

/* index.Tensor(self, indices) */
void tpu_emit_index(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_adv a;
  if (!tpu_adv_parse(L, 1, t, &a)) return;
  tpu_hv x = tpu_hlo_transpose(H, tpu_lower_tensor(L, 0, -1), a.perm);
  const tpu_hlo_type xt = *T(L, x);
  tpu_hlo_gather_dims g;
  memset(&g, 0, sizeof g);
  int64_t slice[TPU_MAX_RANK];
  tpu_hlo_type rt;
  rt.dtype = xt.dtype;
  rt.rank = a.brank + a.rest;
  memcpy(rt.dims, a.bdims, sizeof(int64_t) * (size_t)a.brank);
  for (int q = 0; q < xt.rank; q++) {
    if (q < a.k) {
      g.collapsed_slice_dims[g.n_collapsed++] = q;
      g.start_index_map[g.n_start_index_map++] = q;
      slice[q] = 1;
    } else {
      g.offset_dims[g.n_offset++] = a.brank + (q - a.k);
      slice[q] = xt.dims[q];
      rt.dims[a.brank + (q - a.k)] = xt.dims[q];
    }
  }
  g.index_vector_dim = a.brank;
  /* nothing to gather (an empty index or an empty kept dim): zeros of the shape */
  tpu_hv r = tpu_hlo_type_numel(&rt) == 0 ? tpu_lower_full(L, rt, 0) : tpu_hlo_gather(H, x, a.stacked, &g, slice, rt);
  int64_t op[TPU_MAX_RANK];
  int rr;
  tpu_adv_result_perm(&a, op, &rr);
  tpu_lower_out(L, tpu_hlo_transpose(H, r, op));
}

/* _index_put_impl_(self, indices, values, accumulate=False, unsafe=False) */
void tpu_emit_index_put(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (L->args[2].kind == TPU_ARG_TENSOR && L->args[2].t.dtype != t->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Index put requires the source and destination dtypes match, got %s for the "
                   "destination and %s for the source.",
                   tpu_dtype_c10_name(t->dtype), tpu_dtype_c10_name(L->args[2].t.dtype));
    return;
  }
  tpu_adv a;
  if (!tpu_adv_parse(L, 1, t, &a)) return;
  tpu_dtype dt = t->dtype;
  tpu_hv x = tpu_hlo_transpose(H, tpu_lower_tensor(L, 0, -1), a.perm);
  const tpu_hlo_type xt = *T(L, x);
  /* updates in the result layout of index(), then in the gather layout */
  int64_t op[TPU_MAX_RANK], rdims[TPU_MAX_RANK], inv[TPU_MAX_RANK];
  int rr;
  tpu_adv_result_perm(&a, op, &rr);
  int64_t gdims[TPU_MAX_RANK];
  memcpy(gdims, a.bdims, sizeof(int64_t) * (size_t)a.brank);
  for (int q = a.k; q < xt.rank; q++) gdims[a.brank + (q - a.k)] = xt.dims[q];
  for (int i = 0; i < rr; i++) rdims[i] = gdims[op[i]];
  tpu_hv v = tpu_lower_broadcast_to(L, tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), dt), rr, rdims);
  for (int i = 0; i < rr; i++) inv[op[i]] = i;
  v = tpu_hlo_transpose(H, v, inv);
  tpu_hlo_scatter_dims d;
  memset(&d, 0, sizeof d);
  for (int q = 0; q < xt.rank; q++) {
    if (q < a.k) {
      d.inserted_window_dims[d.n_inserted++] = q;
      d.scatter_dims_to_operand_dims[d.n_scatter_to_operand++] = q;
    } else {
      d.update_window_dims[d.n_update_window++] = a.brank + (q - a.k);
    }
  }
  d.index_vector_dim = a.brank;
  /* nothing to write (no index, or empty slices): self unchanged */
  bool empty = tpu_hlo_type_numel(T(L, v)) == 0 || tpu_hlo_type_numel(&xt) == 0;
  int region = !empty && tpu_arg_bool(L, 3) ? tpu_combine_region(L, dt, TPU_HLO_ADD) : -1;
  tpu_hv r = empty ? x : tpu_hlo_scatter(H, x, a.stacked, v, &d, region);
  int64_t back[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) back[a.perm[i]] = i;
  tpu_lower_out(L, tpu_hlo_transpose(H, r, back));
}

/* ---- data-dependent shapes ------------------------------------------------------------------ */

/* nonzero_static(self, *, size, fill_value=-1) -> [size, rank] int64: the
 * coordinates of the nonzero elements in order, padded with fill_value
 * (the caller reads the count first for nonzero). Each nonzero element's
 * row is its running count minus one; the others go out of bounds, which
 * scatter skips. */
void tpu_emit_nonzero_static(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t size = L->args[1].i, fill = L->nargs > 2 && L->args[2].kind == TPU_ARG_INT ? L->args[2].i : -1;
  int r = t->rank;
  int64_t od[2] = {size, r};
  tpu_hv out = tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 2, od), (double)fill);
  int64_t n = 1;
  for (int i = 0; i < r; i++) n *= t->sizes[i];
  if (r == 0 || n == 0 || size == 0) {
    tpu_lower_out(L, out);
    return;
  }
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv m = tpu_hlo_compare(H, TPU_HLO_NE, x, tpu_k(L, x, 0));
  m = tpu_hlo_convert(H, tpu_hlo_reshape(H, m, 1, &n), TPU_S64);
  tpu_hv pos = m;
  if (n > 1) { /* running count: a prefix sum */
    int region = tpu_combine_region(L, TPU_S64, TPU_HLO_ADD);
    tpu_hv zero = tpu_hlo_constant_int(H, TPU_S64, 0);
    int64_t win = n, pad[2] = {n - 1, 0};
    tpu_hlo_reduce_window(H, &m, &zero, 1, &win, NULL, NULL, NULL, pad, region, &pos);
  }
  tpu_hv target = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, m, tpu_k(L, m, 0)),
                                 tpu_sub(L, pos, tpu_k(L, pos, 1)), tpu_k(L, pos, (double)size));
  int64_t n1[2] = {n, 1};
  tpu_hv cols[TPU_MAX_RANK];
  for (int k = 0; k < r; k++)
    cols[k] = tpu_hlo_reshape(H, tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, r, t->sizes), k), 2, n1);
  tpu_hv coords = tpu_hlo_concat(H, cols, r, 1);
  tpu_lower_out(L, tpu_lower_scatter_rows(L, out, tpu_hlo_reshape(H, target, 2, n1), coords, -1));
}

/* masked_scatter_(self, mask, source): the elements of self where mask is
 * true take source's elements in order (the k-th true element gets
 * source.flatten()[k]); no data-dependent shape, a running count does it. */
void tpu_emit_masked_scatter(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = t->dtype;
  if (L->args[1].kind == TPU_ARG_TENSOR && L->args[1].t.dtype != TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "masked_scatter_ only supports boolean masks, but got mask with dtype %s",
                   tpu_dtype_c10_name(L->args[1].t.dtype));
    return;
  }
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv m = tpu_lower_broadcast_to(L, tpu_lower_input(L, 1, TPU_PRED), t->rank, t->sizes);
  int64_t n = tpu_numel(t->rank, t->sizes);
  tpu_hv src = tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), dt);
  int64_t ns = tpu_hlo_type_numel(T(L, src));
  if (n == 0 || ns == 0) {
    tpu_lower_out(L, x);
    return;
  }
  tpu_hv mf = tpu_hlo_convert(H, tpu_hlo_reshape(H, m, 1, &n), TPU_S64), pos = mf;
  if (n > 1) {
    int region = tpu_combine_region(L, TPU_S64, TPU_HLO_ADD);
    tpu_hv zero = tpu_hlo_constant_int(H, TPU_S64, 0);
    int64_t win = n, pad[2] = {n - 1, 0};
    tpu_hlo_reduce_window(H, &mf, &zero, 1, &win, NULL, NULL, NULL, pad, region, &pos);
  }
  /* the last running count is the mask's number of ones: the source must hold that many */
  int64_t last = n - 1, one = 1;
  tpu_hv ones = tpu_hlo_slice(H, pos, &last, &n, &one);
  tpu_lower_check(L, tpu_hlo_compare(H, TPU_HLO_GT, ones, tpu_k(L, ones, (double)ns)), TPU_ERR_RUNTIME,
                  "Number of elements of source < number of ones in mask");
  tpu_hv at = tpu_hlo_clamp(H, tpu_hlo_constant_int(H, TPU_S64, 0), tpu_sub(L, pos, tpu_k(L, pos, 1)),
                            tpu_hlo_constant_int(H, TPU_S64, ns - 1));
  int64_t n1[2] = {n, 1};
  tpu_hv g = tpu_lower_gather_rows(L, tpu_hlo_reshape(H, src, 1, &ns), tpu_hlo_reshape(H, at, 2, n1));
  g = tpu_hlo_reshape(H, g, t->rank, t->sizes);
  tpu_lower_out(L, tpu_hlo_select(H, m, g, x));
}

/* ---- reductions into indexed positions ------------------------------------------------------- */

enum { TPU_RED_SUM, TPU_RED_PROD, TPU_RED_MEAN, TPU_RED_AMAX, TPU_RED_AMIN };

static int tpu_reduce_kind(tpu_lower *L, int i, bool allow_sum) {
  const char *r = tpu_arg_str(L, i);
  static const char *names[] = {"sum", "prod", "mean", "amax", "amin"};
  for (int k = allow_sum ? 0 : 1; r && k < 5; k++)
    if (strcmp(r, names[k]) == 0) return k;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: reduce argument must be one of %s prod, mean, amax or amin, got %s",
                 L->opname, allow_sum ? "sum," : "", r ? r : "None");
  return -1;
}

/* A region (old, new) -> reduce(old, new); max/min propagate NaN as torch does. */
static int tpu_reduce_region(tpu_lower *L, tpu_dtype dt, int kind) {
  tpu_hlo_type st[2] = {tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(dt, 0, NULL)};
  tpu_hv a[2], v;
  tpu_hlo_region_begin(H, st, 2, a);
  bool is_max = kind == TPU_RED_AMAX, ext = is_max || kind == TPU_RED_AMIN;
  if (dt == TPU_PRED) {
    v = tpu_hlo_binary(H, kind == TPU_RED_PROD || kind == TPU_RED_AMIN ? TPU_HLO_AND : TPU_HLO_OR, a[0], a[1]);
  } else if (ext) {
    v = tpu_hlo_binary(H, is_max ? TPU_HLO_MAX : TPU_HLO_MIN, a[0], a[1]);
    if (tpu_dtype_is_float(dt)) {
      v = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, a[1], a[1]), a[1], v);
      v = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, a[0], a[0]), a[0], v);
    }
  } else {
    v = tpu_hlo_binary(H, kind == TPU_RED_PROD ? TPU_HLO_MUL : TPU_HLO_ADD, a[0], a[1]);
  }
  return tpu_hlo_region_end(H, &v, 1);
}

/* The identity of a reduction (what include_self=False starts from). */
static tpu_hv tpu_reduce_identity(tpu_lower *L, tpu_dtype dt, int kind) {
  if (kind == TPU_RED_AMAX || kind == TPU_RED_AMIN) return tpu_init_value(L, dt, kind == TPU_RED_AMAX);
  return tpu_lower_full(L, tpu_hlo_type_make(dt, 0, NULL), kind == TPU_RED_PROD ? 1 : 0);
}

/* sum / count with count 0 read as 1; integers divide with floor as torch. */
static tpu_hv tpu_mean_div(tpu_lower *L, tpu_hv sum, tpu_hv cnt) {
  cnt = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, cnt, tpu_k(L, cnt, 0)), tpu_k(L, cnt, 1), cnt);
  tpu_dtype dt = T(L, sum)->dtype;
  if (tpu_dtype_is_float(dt)) {
    tpu_dtype at = tpu_acc_type(dt);
    return tpu_hlo_convert(H, tpu_hlo_binary(H, TPU_HLO_DIV, tpu_hlo_convert(H, sum, at), tpu_hlo_convert(H, cnt, at)),
                           dt);
  }
  tpu_hv q = tpu_hlo_binary(H, TPU_HLO_DIV, sum, cnt), rem = tpu_hlo_binary(H, TPU_HLO_REM, sum, cnt);
  tpu_hv adj = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_NE, rem, tpu_k(L, rem, 0)),
                              tpu_hlo_compare(H, TPU_HLO_LT, sum, tpu_k(L, sum, 0)));
  return tpu_hlo_select(H, adj, tpu_sub(L, q, tpu_k(L, q, 1)), q);
}

/* scatter_reduce.two(self, dim, index, src, reduce, *, include_self=True) */
void tpu_emit_scatter_reduce_two(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t, *it = &L->args[2].t;
  if (!tpu_check_index_dtype(L, 2, "scatter_reduce")) return;
  int kind = tpu_reduce_kind(L, 4, true);
  if (kind < 0) return;
  bool incl = L->args[5].kind != TPU_ARG_BOOL || L->args[5].i;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (it->zero_size) {
    tpu_lower_out(L, x);
    return;
  }
  tpu_dtype dt = t->dtype;
  int64_t one = 1;
  bool r0 = t->rank == 0;
  if (r0) x = tpu_hlo_reshape(H, x, 1, &one);
  int64_t d = r0 ? 0 : tpu_lower_dim(L, L->args[1].i, t->rank);
  tpu_hv idx = tpu_lower_tensor(L, 2, -1);
  if (r0) idx = tpu_hlo_reshape(H, idx, 1, &one);
  tpu_lower_check_range(L, idx, r0 ? 1 : t->sizes[d], false, TPU_ERR_RUNTIME,
                        "index out of bounds: scatter_reduce's indices must be in [0, size) of the dimension");
  tpu_hlo_type ishape = *T(L, idx);
  tpu_hv src = tpu_hlo_convert(H, tpu_lower_tensor(L, 3, -1), dt);
  if (r0 || T(L, src)->rank == 0) src = tpu_hlo_reshape(H, src, ishape.rank, (int64_t[TPU_MAX_RANK]){1});
  int64_t n = tpu_hlo_type_numel(&ishape);
  tpu_hv upd = tpu_hlo_reshape(H, tpu_cut_to(L, src, &ishape), 1, &n);
  tpu_hv coords = tpu_coords_along(L, idx, d);
  if (!incl)
    x = tpu_point_scatter(L, x, coords, tpu_lower_broadcast_to(L, tpu_reduce_identity(L, dt, kind), 1, &n), -1);
  tpu_hv r = tpu_point_scatter(L, x, coords, upd, tpu_reduce_region(L, dt, kind));
  if (kind == TPU_RED_MEAN) {
    tpu_hv cnt = tpu_lower_full(L, *T(L, x), incl ? 1 : 0);
    cnt = tpu_point_scatter(L, cnt, coords, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &n), 1),
                            tpu_reduce_region(L, dt, TPU_RED_SUM));
    r = tpu_mean_div(L, r, cnt);
  }
  tpu_lower_out(L, r0 ? tpu_hlo_reshape(H, r, 0, NULL) : r);
}

/* index_reduce(self, dim, index, source, reduce, *, include_self=True):
 * slices of source combined into the slices of self named by index. */
void tpu_emit_index_reduce(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_index_dtype(L, 2, "index_reduce")) return;
  int kind = tpu_reduce_kind(L, 4, false);
  if (kind < 0) return;
  bool incl = L->args[5].kind != TPU_ARG_BOOL || L->args[5].i;
  tpu_dtype dt = t->dtype;
  int64_t one = 1;
  bool r0 = t->rank == 0;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (r0) x = tpu_hlo_reshape(H, x, 1, &one);
  int rank = r0 ? 1 : t->rank;
  tpu_hv src = tpu_hlo_convert(H, tpu_lower_tensor(L, 3, -1), dt);
  if (T(L, src)->rank == 0) src = tpu_hlo_reshape(H, src, rank, (int64_t[TPU_MAX_RANK]){1});
  tpu_hv idx = tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), TPU_S64);
  int64_t n = tpu_hlo_type_numel(T(L, idx)), n1[2] = {n, 1};
  int64_t d = r0 ? 0 : tpu_lower_dim(L, L->args[1].i, t->rank);
  if (n == 0) {
    tpu_lower_out(L, r0 ? tpu_hlo_reshape(H, x, 0, NULL) : x);
    return;
  }
  int64_t perm[TPU_MAX_RANK], inv[TPU_MAX_RANK];
  tpu_hv xf = tpu_dim_to_front(L, x, d, perm, inv);
  tpu_hv sf = tpu_hlo_transpose(H, src, perm);
  idx = tpu_hlo_reshape(H, idx, 2, n1);
  if (!incl) {
    tpu_hlo_type ut = *T(L, sf);
    xf = tpu_lower_scatter_rows(L, xf, idx,
                                tpu_lower_broadcast_to(L, tpu_reduce_identity(L, dt, kind), ut.rank, ut.dims), -1);
  }
  tpu_hv r = tpu_lower_scatter_rows(L, xf, idx, sf, tpu_reduce_region(L, dt, kind));
  if (kind == TPU_RED_MEAN) {
    tpu_hlo_type rt = *T(L, r);
    tpu_hv cnt = tpu_lower_full(L, tpu_hlo_type_make(dt, 1, rt.dims), incl ? 1 : 0);
    cnt = tpu_lower_scatter_rows(L, cnt, idx, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &n), 1),
                                 tpu_reduce_region(L, dt, TPU_RED_SUM));
    int64_t z = 0;
    r = tpu_mean_div(L, r, tpu_hlo_broadcast_in_dim(H, cnt, rt.rank, rt.dims, &z));
  }
  r = tpu_hlo_transpose(H, r, inv);
  tpu_lower_out(L, r0 ? tpu_hlo_reshape(H, r, 0, NULL) : r);
}

/* ---- flat indexing ------------------------------------------------------------------------------ */

/* take(self, index): self.flatten()[index], negative indices wrap */
void tpu_emit_take(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_index_dtype(L, 1, "take")) return;
  int64_t n = tpu_numel(t->rank, t->sizes);
  tpu_hv idx = tpu_lower_tensor(L, 1, -1);
  tpu_hlo_type it = *T(L, idx);
  int64_t m = tpu_hlo_type_numel(&it), m1[2] = {m, 1};
  it.dtype = t->dtype;
  if (m == 0 || n == 0) {
    if (m != 0) tpu_lower_fail(L, TPU_ERR_INDEX, "take(): tried to take from an empty tensor");
    tpu_lower_out(L, tpu_lower_full(L, it, 0));
    return;
  }
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &n);
  tpu_lower_check_range(L, idx, n, true, TPU_ERR_INDEX,
                        "out of range: take's indices must be in [-numel, numel) of the tensor");
  tpu_hv w = tpu_hlo_reshape(H, tpu_wrap_index(L, idx, n), 2, m1);
  tpu_lower_out(L, tpu_hlo_reshape(H, tpu_lower_gather_rows(L, x, w), it.rank, it.dims));
}

/* put_(self, index, source, accumulate=False): self.flatten()[index] = source */
void tpu_emit_put(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_check_index_dtype(L, 1, "put_")) return;
  tpu_dtype dt = t->dtype;
  int64_t n = tpu_numel(t->rank, t->sizes);
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv idx = tpu_lower_tensor(L, 1, -1);
  tpu_hv src = tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), dt);
  int64_t m = tpu_hlo_type_numel(T(L, idx)), m1[2] = {m, 1};
  if (tpu_hlo_type_numel(T(L, src)) != m) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "put_(): Expected source and index to have the same number of elements");
    return;
  }
  if (m == 0 || n == 0) {
    tpu_lower_out(L, x);
    return;
  }
  tpu_hv xf = tpu_hlo_reshape(H, x, 1, &n);
  tpu_lower_check_range(L, idx, n, true, TPU_ERR_INDEX, "out of range: put_'s indices must be in [-numel, numel)");
  tpu_hv w = tpu_hlo_reshape(H, tpu_wrap_index(L, idx, n), 2, m1);
  int region = tpu_arg_bool(L, 3) ? tpu_reduce_region(L, dt, TPU_RED_SUM) : -1;
  tpu_hv r = tpu_lower_scatter_rows(L, xf, w, tpu_hlo_reshape(H, src, 1, &m), region);
  tpu_lower_out(L, tpu_hlo_reshape(H, r, t->rank, t->sizes));
}

/* ---- membership ----------------------------------------------------------------------------------- */

/* isin(elements, test_elements, *, assume_unique=False, invert=False); either
 * side may be a Scalar. Every element is compared with every test element. */
void tpu_emit_isin(tpu_lower *L) {
  int idx2[2] = {0, 1};
  tpu_dtype ct = tpu_lower_result_type(L, idx2, 2);
  tpu_hv e = tpu_lower_input(L, 0, ct), s = tpu_lower_input(L, 1, ct);
  tpu_hlo_type et = *T(L, e);
  int64_t ne = tpu_hlo_type_numel(&et), ns = tpu_hlo_type_numel(T(L, s));
  bool inv = tpu_arg_bool(L, 3);
  tpu_hlo_type rt = et;
  rt.dtype = TPU_PRED;
  if (ne == 0 || ns == 0) {
    tpu_lower_out(L, tpu_lower_full(L, rt, inv ? 1 : 0));
    return;
  }
  int64_t md[2] = {ne, ns}, b0 = 0, b1 = 1;
  tpu_hv eb = tpu_hlo_broadcast_in_dim(H, tpu_hlo_reshape(H, e, 1, &ne), 2, md, &b0);
  tpu_hv sb = tpu_hlo_broadcast_in_dim(H, tpu_hlo_reshape(H, s, 1, &ns), 2, md, &b1);
  tpu_hv hit = tpu_hlo_reduce(H, tpu_hlo_compare(H, TPU_HLO_EQ, eb, sb), tpu_hlo_constant_int(H, TPU_PRED, 0), &b1, 1,
                              TPU_HLO_OR);
  if (inv) hit = tpu_hlo_unary(H, TPU_HLO_NOT, hit);
  tpu_lower_out(L, tpu_hlo_reshape(H, hit, rt.rank, rt.dims));
}

/* ---- unfold's gradient ------------------------------------------------------------------------------- */

/* unfold_backward(grad_in, input_sizes, dim, size, step): grad_in [..., n, ..., size]
 * summed back into the windows' positions (i*step + k along dim). */
void tpu_emit_unfold_backward(tpu_lower *L) {
  /* the CPU's checks, in its order and with its exception types */
  if (L->args[4].i <= 0) {
    tpu_lower_fail(L, TPU_ERR_VALUE, "step is %lld but must be > 0", (long long)L->args[4].i);
    return;
  }
  if (L->args[3].i < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "size is %lld but must be >= 0", (long long)L->args[3].i);
    return;
  }
  tpu_hv g = tpu_lower_tensor(L, 0, -1);
  tpu_hlo_type gt = *T(L, g);
  int r = L->args[1].nints;
  int64_t sizes[TPU_MAX_RANK];
  for (int i = 0; i < r; i++) sizes[i] = L->args[1].ints[i];
  tpu_hlo_type ot = tpu_hlo_type_make(gt.dtype, r, sizes);
  tpu_hv out = tpu_lower_full(L, ot, 0);
  int64_t n = tpu_hlo_type_numel(&gt), n1[2] = {n, 1};
  if (n == 0 || r == 0) {
    tpu_lower_out(L, r == 0 ? tpu_hlo_reshape(H, g, 0, NULL) : out);
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[2].i, r), step = L->args[4].i;
  tpu_hlo_type ct = gt;
  ct.dtype = TPU_S64;
  tpu_hv cols[TPU_MAX_RANK];
  for (int k = 0; k < r; k++) {
    tpu_hv c = tpu_hlo_iota(H, ct, k);
    if (k == d) c = tpu_add(L, tpu_mul(L, c, tpu_k(L, c, (double)step)), tpu_hlo_iota(H, ct, r));
    cols[k] = tpu_hlo_reshape(H, c, 2, n1);
  }
  tpu_hv coords = tpu_hlo_concat(H, cols, r, 1);
  tpu_lower_out(
      L, tpu_point_scatter(L, out, coords, tpu_hlo_reshape(H, g, 1, &n), tpu_reduce_region(L, gt.dtype, TPU_RED_SUM)));
}

/* ---- reflection and replication padding ---------------------------------------------------------- */

/* x's positions along dim picked by the static map [m] (a gather of rows). */
static tpu_hv tpu_take_map(tpu_lower *L, tpu_hv x, int64_t dim, const int64_t *map, int64_t m) {
  int64_t perm[TPU_MAX_RANK], inv[TPU_MAX_RANK], m1[2] = {m, 1};
  tpu_hv xf = tpu_dim_to_front(L, x, dim, perm, inv);
  tpu_hv idx = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, m1), map);
  return tpu_hlo_transpose(H, tpu_lower_gather_rows(L, xf, idx), inv);
}

/* The transpose of tpu_take_map: g's positions along dim summed into n slots. */
static tpu_hv tpu_add_map(tpu_lower *L, tpu_hv g, int64_t dim, const int64_t *map, int64_t m, int64_t n) {
  int64_t perm[TPU_MAX_RANK], inv[TPU_MAX_RANK], m1[2] = {m, 1};
  tpu_hv gf = tpu_dim_to_front(L, g, dim, perm, inv);
  tpu_hlo_type zt = *T(L, gf);
  zt.dims[0] = n;
  tpu_hv idx = tpu_hlo_constant_ints(H, tpu_hlo_type_make(TPU_S64, 2, m1), map);
  tpu_hv r = tpu_lower_scatter_rows(L, tpu_lower_full(L, zt, 0), idx, gf, tpu_reduce_region(L, zt.dtype, TPU_RED_SUM));
  return tpu_hlo_transpose(H, r, inv);
}

/* reflection/replication pad{1,2,3}d and their backwards: every padded
 * dim is a static gather of the input's positions (its backward the
 * matching scatter-add), one dim at a time. */
static void tpu_emit_pad_impl(tpu_lower *L, int k, bool reflect, bool backward) {
  int xi = backward ? 1 : 0;
  tpu_tref *t = &L->args[xi].t;
  const char *name = reflect ? "reflection_pad" : "replication_pad";
  if (t->rank != k + 1 && t->rank != k + 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "%s%dd: Expected %dD or %dD (batch mode) tensor with possibly 0 batch size "
                   "and other non-zero dimensions for input",
                   name, k, k + 1, k + 2);
    return;
  }
  tpu_arg *pa = &L->args[xi + 1];
  if (pa->nints != 2 * k) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "padding size is expected to be %d", 2 * k);
    return;
  }
  int64_t outd[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) outd[i] = t->sizes[i];
  for (int q = 0; q < k; q++) {
    int64_t d = t->rank - 1 - q, n = t->sizes[d], lo = pa->ints[2 * q], hi = pa->ints[2 * q + 1];
    if (reflect && (lo >= n || hi >= n)) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "Argument #4: Padding size should be less than the corresponding input "
                     "dimension, but got: padding (%lld, %lld) at dimension %lld of input %d",
                     (long long)lo, (long long)hi, (long long)d, t->rank);
      return;
    }
    outd[d] = n + lo + hi;
    if (outd[d] < 1 || n < 1) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s%dd: input (%lld) or output (%lld) size along dim %lld is too small", name,
                     k, (long long)n, (long long)outd[d], (long long)d);
      return;
    }
  }
  tpu_hv v = tpu_lower_tensor(L, 0, -1);
  for (int q = 0; q < k; q++) {
    int64_t d = t->rank - 1 - q, n = t->sizes[d], lo = pa->ints[2 * q], m = outd[d];
    int64_t *map = malloc(sizeof(int64_t) * (size_t)m);
    if (!map) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "out of memory");
      return;
    }
    for (int64_t j = 0; j < m; j++) {
      int64_t i = j - lo;
      if (reflect) {
        if (i < 0) i = -i;
        if (i >= n) i = 2 * (n - 1) - i;
      }
      map[j] = i < 0 ? 0 : i >= n ? n - 1 : i;
    }
    v = backward ? tpu_add_map(L, v, d, map, m, n) : tpu_take_map(L, v, d, map, m);
    free(map);
  }
  tpu_lower_out(L, v);
}
void tpu_emit_reflection_pad1d(tpu_lower *L) { tpu_emit_pad_impl(L, 1, true, false); }
void tpu_emit_reflection_pad2d(tpu_lower *L) { tpu_emit_pad_impl(L, 2, true, false); }
void tpu_emit_reflection_pad3d(tpu_lower *L) { tpu_emit_pad_impl(L, 3, true, false); }
void tpu_emit_replication_pad1d(tpu_lower *L) { tpu_emit_pad_impl(L, 1, false, false); }
void tpu_emit_replication_pad2d(tpu_lower *L) { tpu_emit_pad_impl(L, 2, false, false); }
void tpu_emit_replication_pad3d(tpu_lower *L) { tpu_emit_pad_impl(L, 3, false, false); }
void tpu_emit_reflection_pad1d_backward(tpu_lower *L) { tpu_emit_pad_impl(L, 1, true, true); }
void tpu_emit_reflection_pad2d_backward(tpu_lower *L) { tpu_emit_pad_impl(L, 2, true, true); }
void tpu_emit_reflection_pad3d_backward(tpu_lower *L) { tpu_emit_pad_impl(L, 3, true, true); }
void tpu_emit_replication_pad1d_backward(tpu_lower *L) { tpu_emit_pad_impl(L, 1, false, true); }
void tpu_emit_replication_pad2d_backward(tpu_lower *L) { tpu_emit_pad_impl(L, 2, false, true); }
void tpu_emit_replication_pad3d_backward(tpu_lower *L) { tpu_emit_pad_impl(L, 3, false, true); }

/* ---- data-dependent shapes, static part ------------------------------------------------------------- */

/* Inclusive prefix sum of a 1-D s64 value. */
static tpu_hv tpu_prefix_sum(tpu_lower *L, tpu_hv v) {
  int64_t n = T(L, v)->dims[0];
  if (n <= 1) return v;
  tpu_hv out = v, zero = tpu_hlo_constant_int(H, TPU_S64, 0);
  int64_t win = n, pad[2] = {n - 1, 0};
  tpu_hlo_reduce_window(H, &v, &zero, 1, &win, NULL, NULL, NULL, pad, tpu_reduce_region(L, TPU_S64, TPU_RED_SUM), &out);
  return out;
}

/* Stable ascending sort of the 1-D x with its positions; NaNs last as torch. */
static void tpu_sort_with_pos(tpu_lower *L, tpu_hv x, tpu_hv *sorted, tpu_hv *pos) {
  tpu_hlo_type xt = *T(L, x);
  tpu_hv key = xt.dtype == TPU_PRED ? tpu_hlo_convert(H, x, TPU_S32) : x;
  tpu_dtype kt = T(L, key)->dtype;
  tpu_hlo_type st[4] = {tpu_hlo_type_make(kt, 0, NULL), tpu_hlo_type_make(kt, 0, NULL),
                        tpu_hlo_type_make(TPU_S64, 0, NULL), tpu_hlo_type_make(TPU_S64, 0, NULL)};
  tpu_hv a[4];
  tpu_hlo_region_begin(H, st, 4, a);
  tpu_hv lt = tpu_hlo_compare(H, TPU_HLO_LT, a[0], a[1]);
  if (tpu_dtype_is_float(kt)) {
    tpu_hv an = tpu_hlo_compare(H, TPU_HLO_NE, a[0], a[0]), bn = tpu_hlo_compare(H, TPU_HLO_NE, a[1], a[1]);
    lt = tpu_hlo_binary(H, TPU_HLO_OR, lt, tpu_hlo_binary(H, TPU_HLO_AND, bn, tpu_hlo_unary(H, TPU_HLO_NOT, an)));
  }
  int region = tpu_hlo_region_end(H, &lt, 1);
  tpu_hv ins[2] = {key, tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 1, xt.dims), 0)}, outs[2];
  if (!tpu_hlo_sort(H, ins, 2, 0, true, region, outs)) {
    *sorted = *pos = TPU_HV_NONE;
    return;
  }
  *sorted = tpu_hlo_convert(H, outs[0], xt.dtype);
  *pos = outs[1];
}

/* _unique2.out(self, sorted, return_inverse, return_counts, *, out0, out1, out2),
 * unique_consecutive.out(self, return_inverse, return_counts, dim, *, out0..2)
 * and _unique.out(self, sorted, return_inverse, *, out0, out1). The number of
 * unique values is the size of out0, read on the host beforehand (the
 * caller counts them); group ids are running counts of value changes. */
static void tpu_emit_unique_impl(tpu_lower *L, bool consecutive, int inv_arg, int cnt_arg, int out0) {
  tpu_tref *t = &L->args[0].t;
  bool want_inv = tpu_arg_bool(L, inv_arg), want_cnt = cnt_arg >= 0 && tpu_arg_bool(L, cnt_arg);
  int64_t u = L->args[out0].t.rank == 1 ? L->args[out0].t.sizes[0] : 0, z = 0;
  int64_t n = tpu_numel(t->rank, t->sizes);
  tpu_dtype dt = t->dtype;
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, want_inv ? t->rank : 1, want_inv ? t->sizes : &z);
  if (n == 0 || u == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &u), 0));
    tpu_lower_out(L, tpu_lower_full(L, it, 0));
    if (cnt_arg >= 0) tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, want_cnt ? &u : &z), 0));
    return;
  }
  tpu_hv x = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &n), s, pos;
  if (consecutive) {
    s = x;
    pos = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 1, &n), 0);
  } else {
    tpu_sort_with_pos(L, x, &s, &pos);
  }
  /* start[i]: s[i] differs from s[i-1] (the first element starts a group) */
  tpu_hv start;
  if (n > 1) {
    int64_t a0 = 0, a1 = 1, e0 = n - 1, e1 = n, one = 1;
    tpu_hv ne =
        tpu_hlo_compare(H, TPU_HLO_NE, tpu_hlo_slice(H, s, &a1, &e1, &one), tpu_hlo_slice(H, s, &a0, &e0, &one));
    tpu_hv first = tpu_hlo_reshape(H, tpu_hlo_constant_int(H, TPU_PRED, 1), 1, &one);
    tpu_hv parts[2] = {first, ne};
    start = tpu_hlo_concat(H, parts, 2, 0);
  } else {
    start = tpu_lower_full(L, tpu_hlo_type_make(TPU_PRED, 1, &n), 1);
  }
  tpu_hv grp = tpu_prefix_sum(L, tpu_hlo_convert(H, start, TPU_S64));
  grp = tpu_sub(L, grp, tpu_k(L, grp, 1));
  int64_t n1[2] = {n, 1};
  tpu_hv g1 = tpu_hlo_reshape(H, grp, 2, n1);
  tpu_lower_out(L, tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &u), 0), g1, s, -1));
  if (want_inv) {
    tpu_hv inv = tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 0),
                                        tpu_hlo_reshape(H, pos, 2, n1), grp, -1);
    tpu_lower_out(L, tpu_hlo_reshape(H, inv, it.rank, it.dims));
  } else {
    tpu_lower_out(L, tpu_lower_full(L, it, 0));
  }
  if (cnt_arg < 0) return;
  if (want_cnt)
    tpu_lower_out(L, tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &u), 0), g1,
                                            tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 1),
                                            tpu_reduce_region(L, TPU_S64, TPU_RED_SUM)));
  else
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &z), 0));
}
void tpu_emit_unique2(tpu_lower *L) { tpu_emit_unique_impl(L, false, 2, 3, 4); }
void tpu_emit_unique_consecutive_dim(tpu_lower *L);
void tpu_emit_unique_consecutive(tpu_lower *L) {
  if (L->args[3].kind != TPU_ARG_NONE)
    tpu_emit_unique_consecutive_dim(L);
  else
    tpu_emit_unique_impl(L, true, 1, 2, 4);
}
void tpu_emit_unique1(tpu_lower *L) { tpu_emit_unique_impl(L, false, 2, -1, 3); }

/* tpu::unique_count(self, consecutive) -> 0-d long: the number of distinct
 * values of self (of runs of equal values when consecutive), the size the
 * Python kernels of unique read back and give the rows above: the values
 * sorted (unless consecutive), the neighbours that differ counted, plus one.
 * A NaN differs from every value, itself included, so each counts. */
void tpu_emit_unique_count(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t n = tpu_numel(t->rank, t->sizes);
  if (n <= 1) {
    tpu_lower_out(L, tpu_hlo_constant_int(H, TPU_S64, n));
    return;
  }
  tpu_hv s = tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &n), pos;
  if (!tpu_arg_bool(L, 1)) tpu_sort_with_pos(L, s, &s, &pos);
  if (s == TPU_HV_NONE) return;
  int64_t a0 = 0, a1 = 1, e0 = n - 1, e1 = n, one = 1, z = 0;
  tpu_hv ne = tpu_hlo_compare(H, TPU_HLO_NE, tpu_hlo_slice(H, s, &a1, &e1, &one), tpu_hlo_slice(H, s, &a0, &e0, &one));
  tpu_hv c = tpu_reduce_sum(L, tpu_hlo_convert(H, ne, TPU_S64), &z, 1);
  tpu_lower_out(L, tpu_add(L, c, tpu_hlo_constant_int(H, TPU_S64, 1)));
}

/* repeat_interleave.Tensor(repeats, *, output_size): i repeated repeats[i]
 * times. output_size is required here (the caller reads repeats.sum()):
 * a 1 is added at each cumulative end, and a running count of them is the
 * source position of every output element. */
void tpu_emit_repeat_interleave(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (t->rank > 1 || !(tpu_dtype_is_int(t->dtype))) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "repeat_interleave: repeats must be 0-dim or 1-dim tensor of integers");
    return;
  }
  if (L->args[1].kind != TPU_ARG_INT) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "repeat_interleave: output_size is required on the tpu device");
    return;
  }
  int64_t m = L->args[1].i, n = t->rank ? t->sizes[0] : 1, m1[2] = {m, 1}, n1[2] = {n, 1};
  tpu_hlo_type ot = tpu_hlo_type_make(TPU_S64, 1, &m);
  tpu_hv r = n ? tpu_hlo_reshape(H, tpu_hlo_convert(H, tpu_lower_tensor(L, 0, -1), TPU_S64), 1, &n) : TPU_HV_NONE;
  if (n)
    tpu_lower_check(L, tpu_hlo_compare(H, TPU_HLO_LT, r, tpu_k(L, r, 0)), TPU_ERR_RUNTIME,
                    "repeats can not be negative");
  if (m == 0 || n == 0) {
    ot.dtype = t->dtype;
    tpu_lower_out(L, tpu_lower_full(L, ot, 0));
    return;
  }
  tpu_hv ends = tpu_hlo_reshape(H, tpu_prefix_sum(L, r), 2, n1);
  tpu_hv marks =
      tpu_lower_scatter_rows(L, tpu_lower_full(L, ot, 0), ends, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 1),
                             tpu_reduce_region(L, TPU_S64, TPU_RED_SUM));
  (void)m1;
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_prefix_sum(L, marks), t->dtype));
}

/* ---- embeddings -------------------------------------------------------------------------------- */

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

/* ---- embedding bags -------------------------------------------------------------------------------- */

/* Bag of every index element [N] s64: the count of bag starts at or before
 * it, minus one; elements after the closing offset (include_last_offset)
 * get bag B, out of bounds, which scatters skip. */
static tpu_hv tpu_bag_ids(tpu_lower *L, tpu_hv offsets, int64_t n, int64_t nb, bool last, bool into_last) {
  int64_t md[2] = {n, nb + (last ? 1 : 0)}, b1 = 1, b0 = 0;
  tpu_hv off = tpu_hlo_convert(H, offsets, TPU_S64);
  tpu_hv pos = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, md), 0);
  tpu_hv le =
      tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_LE, tpu_hlo_broadcast_in_dim(H, off, 2, md, &b1), pos), TPU_S64);
  tpu_hv cnt = tpu_hlo_reduce(H, le, tpu_hlo_constant_int(H, TPU_S64, 0), &b1, 1, TPU_HLO_ADD);
  (void)b0;
  cnt = tpu_sub(L, cnt, tpu_k(L, cnt, 1));
  /* torch's max mode keeps the elements after the closing offset in the last bag */
  double cap = into_last ? (double)(nb - 1) : (double)nb;
  return last ? tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GE, cnt, tpu_k(L, cnt, cap)), tpu_k(L, cnt, cap), cnt)
              : cnt;
}

/* _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
 * per_sample_weights, include_last_offset, padding_idx) -> (out [B, D],
 * offset2bag [N], bag_size [B], max_indices [B, D] or [B]); mode 0 sum,
 * 1 mean, 2 max. Rows of weight are gathered and scattered into their bags. */
void tpu_emit_embedding_bag(tpu_lower *L) {
  tpu_tref *w = &L->args[0].t, *it = &L->args[1].t, *ot = &L->args[2].t;
  int64_t mode = L->args[4].i, pad = L->args[8].kind == TPU_ARG_INT ? L->args[8].i : -1;
  bool last = tpu_arg_bool(L, 7), psw = L->args[6].kind == TPU_ARG_TENSOR;
  if (w->rank != 2 || it->rank != 1 || ot->rank != 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "embedding_bag: expected 2-D weight, 1-D indices and 1-D offsets");
    return;
  }
  if (psw && mode != 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                   "supported for mode='sum' (got mode='%s'). Please open a feature request on GitHub.",
                   mode == 1 ? "mean" : "max");
    return;
  }
  if (!tpu_check_index_dtype(L, 1, "embedding_bag")) return;
  tpu_dtype dt = w->dtype;
  int64_t n = it->sizes[0], nb = ot->sizes[0] - (last ? 1 : 0), dd = w->sizes[1], nw = w->sizes[0];
  if (nb < 0) nb = 0;
  int64_t od[2] = {nb, dd}, n1[2] = {n, 1}, nd[2] = {n, dd};
  tpu_hlo_type out_t = tpu_hlo_type_make(dt, 2, od), bt = tpu_hlo_type_make(TPU_S64, 1, &nb);
  tpu_hlo_type mt = mode == 2 ? tpu_hlo_type_make(TPU_S64, 2, od) : bt;
  if (n == 0 || nb == 0) {
    tpu_lower_out(L, tpu_lower_full(L, out_t, 0));
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 0));
    tpu_lower_out(L, tpu_lower_full(L, bt, 0));
    tpu_lower_out(L, tpu_lower_full(L, mt, 0));
    return;
  }
  tpu_hv idx = tpu_hlo_convert(H, tpu_lower_tensor(L, 1, -1), TPU_S64);
  tpu_lower_check_range(L, idx, nw, false, TPU_ERR_RUNTIME, "embedding_bag: an index is not in [0, num_embeddings)");
  /* As torch's CPU kernel: with include_last_offset, elements after the
   * closing offset belong to the last bag in offset2bag and bag_size (so
   * gradients reach them) in mean and max modes, and to the max, but sums
   * leave them out. */
  tpu_hv off = tpu_lower_tensor(L, 2, -1);
  tpu_hv bag = tpu_bag_ids(L, off, n, nb, last, mode != 0);
  tpu_hv keep = tpu_hlo_compare(H, TPU_HLO_NE, idx, tpu_k(L, idx, (double)pad));
  tpu_hv tb = tpu_hlo_select(H, keep, bag, tpu_k(L, bag, (double)nb)); /* bags that take the element */
  tpu_hv tb1 = tpu_hlo_reshape(H, tb, 2, n1);
  tpu_hv sb1 = tb1;
  if (last && mode != 2)
    sb1 = tpu_hlo_reshape(
        H, tpu_hlo_select(H, keep, tpu_bag_ids(L, off, n, nb, true, false), tpu_k(L, bag, (double)nb)), 2, n1);
  tpu_hv rows = tpu_lower_gather_rows(L, tpu_lower_tensor(L, 0, -1), tpu_hlo_reshape(H, idx, 2, n1)); /* [N, D] */
  tpu_dtype at = tpu_acc_type(dt);
  rows = tpu_hlo_convert(H, rows, at);
  if (psw) {
    int64_t z = 0;
    tpu_hv p = tpu_hlo_convert(H, tpu_lower_tensor(L, 6, -1), at);
    rows = tpu_mul(L, rows, tpu_hlo_broadcast_in_dim(H, p, 2, nd, &z));
  }
  tpu_hv size =
      tpu_lower_scatter_rows(L, tpu_lower_full(L, bt, 0), tb1, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 1),
                             tpu_reduce_region(L, TPU_S64, TPU_RED_SUM));
  tpu_hv out, maxi;
  int64_t z = 0;
  tpu_hv sizeb = tpu_hlo_broadcast_in_dim(H, size, 2, od, &z);
  tpu_hv empty = tpu_hlo_compare(H, TPU_HLO_EQ, sizeb, tpu_k(L, sizeb, 0));
  tpu_hlo_type oat = out_t;
  oat.dtype = at;
  if (mode == 2) {
    out = tpu_lower_scatter_rows(L, tpu_lower_broadcast_to(L, tpu_init_value(L, at, true), 2, od), tb1, rows,
                                 tpu_reduce_region(L, at, TPU_RED_AMAX));
    out = tpu_hlo_select(H, empty, tpu_lower_full(L, oat, 0), out);
    /* the first element reaching each column's maximum */
    tpu_hv best = tpu_lower_gather_rows(
        L, out,
        tpu_hlo_reshape(
            H, tpu_hlo_clamp(H, tpu_hlo_constant_int(H, TPU_S64, 0), tb, tpu_hlo_constant_int(H, TPU_S64, nb - 1)), 2,
            n1));
    tpu_hv posn = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nd), 0);
    tpu_hv cand = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, rows, best), posn, tpu_k(L, posn, (double)n));
    tpu_hv first = tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 2, od), (double)n), tb1, cand,
                                          tpu_reduce_region(L, TPU_S64, TPU_RED_AMIN));
    int64_t nod = nb * dd, nod1[2] = {nod, 1};
    tpu_hv fi = tpu_hlo_clamp(H, tpu_hlo_constant_int(H, TPU_S64, 0), tpu_hlo_reshape(H, first, 2, nod1),
                              tpu_hlo_constant_int(H, TPU_S64, n - 1));
    maxi = tpu_hlo_reshape(H, tpu_lower_gather_rows(L, idx, fi), 2, od);
    maxi = tpu_hlo_select(H, empty, tpu_k(L, maxi, 0), maxi);
  } else {
    out = tpu_lower_scatter_rows(L, tpu_lower_full(L, oat, 0), sb1, rows, tpu_reduce_region(L, at, TPU_RED_SUM));
    if (mode == 1) out = tpu_mean_div(L, out, tpu_hlo_convert(H, sizeb, at));
    maxi = size;
  }
  (void)nw;
  tpu_lower_out(L, tpu_hlo_convert(H, out, dt));
  tpu_lower_out(L, bag);
  tpu_lower_out(L, size);
  tpu_lower_out(L, maxi);
}

/* _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size,
 * maximum_indices, num_weights, scale_grad_by_freq, mode, sparse,
 * per_sample_weights, padding_idx) -> grad_weight [num_weights, D] */
void tpu_emit_embedding_bag_backward(tpu_lower *L) {
  if (tpu_arg_bool(L, 9)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "embedding_bag: sparse gradients are not supported on the tpu device");
    return;
  }
  tpu_hv g = tpu_lower_tensor(L, 0, -1);
  tpu_hlo_type gt = *T(L, g);
  int64_t nw = L->args[6].i, mode = L->args[8].i, pad = L->args[11].kind == TPU_ARG_INT ? L->args[11].i : -1;
  int64_t nb = gt.dims[0], dd = gt.dims[1], n = L->args[1].t.rank ? L->args[1].t.sizes[0] : 0;
  int64_t wd[2] = {nw, dd}, z = 0;
  tpu_dtype dt = gt.dtype, at = tpu_acc_type(dt);
  tpu_hlo_type wt = tpu_hlo_type_make(at, 2, wd);
  if (n == 0 || nb == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 2, wd), 0));
    return;
  }
  g = tpu_hlo_convert(H, g, at);
  tpu_hv size = tpu_lower_tensor(L, 4, -1);
  if (mode == 2) {
    int64_t nod = nb * dd, od[2] = {nb, dd};
    tpu_hv mi = tpu_lower_tensor(L, 5, -1);
    tpu_hv sizeb = tpu_hlo_broadcast_in_dim(H, size, 2, od, &z);
    mi = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, sizeb, tpu_k(L, sizeb, 0)), tpu_k(L, mi, (double)nw), mi);
    tpu_hv cols[2] = {
        tpu_hlo_reshape(H, mi, 2, (int64_t[2]){nod, 1}),
        tpu_hlo_reshape(H, tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, od), 1), 2, (int64_t[2]){nod, 1})};
    tpu_hv r = tpu_point_scatter(L, tpu_lower_full(L, wt, 0), tpu_hlo_concat(H, cols, 2, 1),
                                 tpu_hlo_reshape(H, g, 1, &nod), tpu_reduce_region(L, at, TPU_RED_SUM));
    tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
    return;
  }
  int64_t n1[2] = {n, 1}, nd[2] = {n, dd};
  tpu_hv idx = tpu_hlo_convert(H, tpu_lower_tensor(L, 1, -1), TPU_S64);
  tpu_hv bag = tpu_lower_tensor(L, 3, -1);
  tpu_hv keep = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_NE, idx, tpu_k(L, idx, (double)pad)),
                               tpu_hlo_compare(H, TPU_HLO_LT, bag, tpu_k(L, bag, (double)nb)));
  tpu_hv bc = tpu_hlo_reshape(
      H, tpu_hlo_clamp(H, tpu_hlo_constant_int(H, TPU_S64, 0), bag, tpu_hlo_constant_int(H, TPU_S64, nb - 1)), 2, n1);
  tpu_hv rows = tpu_lower_gather_rows(L, g, bc); /* [N, D] */
  tpu_hv scale = tpu_hlo_convert(H, keep, at);
  if (L->args[10].kind == TPU_ARG_TENSOR)
    scale = tpu_mul(L, scale, tpu_hlo_convert(H, tpu_lower_tensor(L, 10, -1), at));
  if (mode == 1) {
    tpu_hv s = tpu_hlo_convert(H, tpu_hlo_reshape(H, tpu_lower_gather_rows(L, size, bc), 1, &n), at);
    s = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, s, tpu_k(L, s, 0)), tpu_k(L, s, 1), s);
    scale = tpu_hlo_binary(H, TPU_HLO_DIV, scale, s);
  }
  tpu_hv i1 = tpu_hlo_reshape(H, idx, 2, n1);
  if (tpu_arg_bool(L, 7)) { /* scale_grad_by_freq: by each index's count in the batch */
    tpu_hv f = tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(at, 1, &nw), 0), i1,
                                      tpu_lower_full(L, tpu_hlo_type_make(at, 1, &n), 1),
                                      tpu_reduce_region(L, at, TPU_RED_SUM));
    f = tpu_hlo_reshape(H, tpu_lower_gather_rows(L, f, i1), 1, &n);
    scale = tpu_hlo_binary(H, TPU_HLO_DIV, scale, f);
  }
  rows = tpu_mul(L, rows, tpu_hlo_broadcast_in_dim(H, scale, 2, nd, &z));
  tpu_hv r = tpu_lower_scatter_rows(L, tpu_lower_full(L, wt, 0), i1, rows, tpu_reduce_region(L, at, TPU_RED_SUM));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets,
 * offset2bag, mode, padding_idx) -> [N]: grad[bag] . weight[index] */
void tpu_emit_embedding_bag_psw_backward(tpu_lower *L) {
  tpu_hv g = tpu_lower_tensor(L, 0, -1);
  tpu_dtype dt = T(L, g)->dtype, at = tpu_acc_type(dt);
  int64_t nb = T(L, g)->dims[0], n = L->args[2].t.rank ? L->args[2].t.sizes[0] : 0, n1[2] = {n, 1};
  int64_t pad = L->args[6].kind == TPU_ARG_INT ? L->args[6].i : -1, one = 1;
  if (n == 0 || nb == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &n), 0));
    return;
  }
  tpu_hv idx = tpu_hlo_convert(H, tpu_lower_tensor(L, 2, -1), TPU_S64);
  tpu_hv bag = tpu_lower_tensor(L, 4, -1);
  tpu_hv keep = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_NE, idx, tpu_k(L, idx, (double)pad)),
                               tpu_hlo_compare(H, TPU_HLO_LT, bag, tpu_k(L, bag, (double)nb)));
  tpu_hv bc = tpu_hlo_reshape(
      H, tpu_hlo_clamp(H, tpu_hlo_constant_int(H, TPU_S64, 0), bag, tpu_hlo_constant_int(H, TPU_S64, nb - 1)), 2, n1);
  tpu_hv gr = tpu_hlo_convert(H, tpu_lower_gather_rows(L, g, bc), at);
  tpu_hv wr =
      tpu_hlo_convert(H, tpu_lower_gather_rows(L, tpu_lower_tensor(L, 1, -1), tpu_hlo_reshape(H, idx, 2, n1)), at);
  tpu_hv dot = tpu_hlo_reduce(H, tpu_mul(L, gr, wr), tpu_hlo_constant(H, at, 0), &one, 1, TPU_HLO_ADD);
  dot = tpu_hlo_select(H, keep, dot, tpu_k(L, dot, 0));
  tpu_lower_out(L, tpu_hlo_convert(H, dot, dt));
}

/* embedding_renorm_(self, indices, max_norm, norm_type): the rows named by
 * indices whose norm exceeds max_norm are scaled to max_norm / (norm + 1e-7). */
void tpu_emit_embedding_renorm(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (t->rank != 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "embedding_renorm_: self must be 2-D");
    return;
  }
  tpu_dtype dt = t->dtype, at = tpu_acc_type(dt);
  double maxn = L->args[2].f, p = L->args[3].f;
  int64_t nw = t->sizes[0], one = 1, z = 0;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  tpu_hv idx = tpu_hlo_convert(H, tpu_lower_tensor(L, 1, -1), TPU_S64);
  int64_t n = tpu_hlo_type_numel(T(L, idx)), n1[2] = {n, 1};
  if (n == 0 || nw == 0) {
    tpu_lower_out(L, x);
    return;
  }
  tpu_hv a = tpu_hlo_unary(H, TPU_HLO_ABS, tpu_hlo_convert(H, x, at)), norm;
  if (p == INFINITY) {
    norm = tpu_hlo_reduce(H, a, tpu_hlo_constant(H, at, 0), &one, 1, TPU_HLO_MAX);
  } else if (p == 1) {
    norm = tpu_hlo_reduce(H, a, tpu_hlo_constant(H, at, 0), &one, 1, TPU_HLO_ADD);
  } else if (p == 2) {
    norm = tpu_hlo_unary(H, TPU_HLO_SQRT,
                         tpu_hlo_reduce(H, tpu_mul(L, a, a), tpu_hlo_constant(H, at, 0), &one, 1, TPU_HLO_ADD));
  } else {
    tpu_hv s = tpu_hlo_reduce(H, tpu_hlo_binary(H, TPU_HLO_POW, a, tpu_k(L, a, p)), tpu_hlo_constant(H, at, 0), &one, 1,
                              TPU_HLO_ADD);
    norm = tpu_hlo_binary(H, TPU_HLO_POW, s, tpu_k(L, s, 1.0 / p));
  }
  tpu_hv hit = tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_PRED, 1, &nw), 0),
                                      tpu_hlo_reshape(H, idx, 2, n1),
                                      tpu_lower_full(L, tpu_hlo_type_make(TPU_PRED, 1, &n), 1), -1);
  tpu_hv big = tpu_hlo_binary(H, TPU_HLO_AND, hit, tpu_hlo_compare(H, TPU_HLO_GT, norm, tpu_k(L, norm, maxn)));
  tpu_hv scale = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_k(L, norm, maxn), tpu_add(L, norm, tpu_k(L, norm, 1e-7)));
  scale = tpu_hlo_select(H, big, scale, tpu_k(L, scale, 1));
  tpu_hv r = tpu_mul(L, tpu_hlo_convert(H, x, at), tpu_hlo_broadcast_in_dim(H, scale, 2, t->sizes, &z));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* unique_dim.out(self, dim, sorted, return_inverse, return_counts, *, out0..2)
 * and unique_consecutive.out with a dim: unique slices along dim. The slices
 * are rows [n, k]; they are sorted lexicographically (k stable sorts, the
 * last column first). out0 has room for all n slices: the caller reads
 * the count (the largest inverse + 1) and narrows the results. */
static void tpu_emit_unique_dim_impl(tpu_lower *L, bool consecutive, int dim_arg, int inv_arg, int cnt_arg) {
  tpu_tref *t = &L->args[0].t;
  if (t->rank == 0) {
    tpu_lower_fail(L, TPU_ERR_INDEX, "%s: dim out of range for a 0-d tensor", L->opname);
    return;
  }
  int64_t d = tpu_lower_dim(L, L->args[dim_arg].i, t->rank), n = t->sizes[d], k = 1, z = 0;
  for (int i = 0; i < t->rank; i++)
    if (i != d) k *= t->sizes[i];
  if (k > 256 || (k == 0 && n > 0)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s: slices of %lld elements are not supported on the tpu device",
                   L->opname, (long long)k);
    return;
  }
  bool want_inv = tpu_arg_bool(L, inv_arg), want_cnt = tpu_arg_bool(L, cnt_arg);
  tpu_dtype dt = t->dtype;
  int64_t perm[TPU_MAX_RANK], inv[TPU_MAX_RANK], fd[TPU_MAX_RANK];
  tpu_hv x = tpu_dim_to_front(L, tpu_lower_tensor(L, 0, -1), d, perm, inv);
  for (int i = 0; i < t->rank; i++) fd[i] = t->sizes[perm[i]];
  if (n == 0) {
    tpu_lower_out(L, tpu_hlo_transpose(H, x, inv));
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, want_inv ? &n : &z), 0));
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, want_cnt ? &n : &z), 0));
    return;
  }
  int64_t nk[2] = {n, k}, n1[2] = {n, 1};
  tpu_hv rows = tpu_hlo_reshape(H, x, 2, nk), s, pos;
  if (consecutive) {
    s = rows;
    pos = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 1, &n), 0);
  } else {
    /* least significant column first: stable sorts of the positions */
    pos = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 1, &n), 0);
    for (int64_t q = k - 1; q >= 0; q--) {
      int64_t a0[2] = {0, q}, e0[2] = {n, q + 1}, one[2] = {1, 1};
      tpu_hv col = tpu_hlo_slice(H, rows, a0, e0, one); /* [n, 1] */
      tpu_hv key = tpu_hlo_reshape(H, tpu_lower_gather_rows(L, col, tpu_hlo_reshape(H, pos, 2, n1)), 1, &n);
      tpu_hv ks, kp;
      tpu_sort_with_pos(L, key, &ks, &kp);
      pos = tpu_hlo_reshape(H, tpu_lower_gather_rows(L, pos, tpu_hlo_reshape(H, kp, 2, n1)), 1, &n);
    }
    s = tpu_lower_gather_rows(L, rows, tpu_hlo_reshape(H, pos, 2, n1));
  }
  tpu_hv start;
  if (n > 1) {
    int64_t a0[2] = {0, 0}, a1[2] = {1, 0}, e0[2] = {n - 1, k}, e1[2] = {n, k}, one[2] = {1, 1}, o1 = 1, b1 = 1;
    tpu_hv ne = tpu_hlo_compare(H, TPU_HLO_NE, tpu_hlo_slice(H, s, a1, e1, one), tpu_hlo_slice(H, s, a0, e0, one));
    ne = tpu_hlo_reduce(H, ne, tpu_hlo_constant_int(H, TPU_PRED, 0), &b1, 1, TPU_HLO_OR);
    tpu_hv parts[2] = {tpu_hlo_reshape(H, tpu_hlo_constant_int(H, TPU_PRED, 1), 1, &o1), ne};
    start = tpu_hlo_concat(H, parts, 2, 0);
  } else {
    start = tpu_lower_full(L, tpu_hlo_type_make(TPU_PRED, 1, &n), 1);
  }
  tpu_hv grp = tpu_prefix_sum(L, tpu_hlo_convert(H, start, TPU_S64));
  grp = tpu_sub(L, grp, tpu_k(L, grp, 1));
  tpu_hv g1 = tpu_hlo_reshape(H, grp, 2, n1);
  tpu_hv vals = tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(dt, 2, nk), 0), g1, s, -1);
  tpu_lower_out(L, tpu_hlo_transpose(H, tpu_hlo_reshape(H, vals, t->rank, fd), inv));
  /* the inverse always comes back: the caller reads the count from it */
  tpu_lower_out(L, tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 0),
                                          tpu_hlo_reshape(H, pos, 2, n1), grp, -1));
  tpu_lower_out(L, tpu_lower_scatter_rows(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 0), g1,
                                          tpu_lower_full(L, tpu_hlo_type_make(TPU_S64, 1, &n), 1),
                                          tpu_reduce_region(L, TPU_S64, TPU_RED_SUM)));
  (void)want_cnt;
}
void tpu_emit_unique_dim(tpu_lower *L) { tpu_emit_unique_dim_impl(L, false, 1, 3, 4); }
void tpu_emit_unique_consecutive_dim(tpu_lower *L) { tpu_emit_unique_dim_impl(L, true, 3, 1, 2); }

/* ---- segment reductions ------------------------------------------------------------------------------- */

/* Inclusive prefix sum along the last dim. */
static tpu_hv tpu_prefix_sum_last(tpu_lower *L, tpu_hv v) {
  tpu_hlo_type t = *T(L, v);
  int64_t n = t.dims[t.rank - 1];
  if (n <= 1) return v;
  int64_t win[TPU_MAX_RANK], pad[2 * TPU_MAX_RANK] = {0};
  for (int i = 0; i < t.rank; i++) win[i] = 1;
  win[t.rank - 1] = n;
  pad[2 * (t.rank - 1)] = n - 1;
  tpu_hv out = v, zero = tpu_lower_full(L, tpu_hlo_type_make(t.dtype, 0, NULL), 0);
  tpu_hlo_reduce_window(H, &v, &zero, 1, win, NULL, NULL, NULL, pad, tpu_reduce_region(L, t.dtype, TPU_RED_SUM), &out);
  return out;
}

typedef struct {
  int64_t a, S;             /* the axis, the segment count */
  int64_t od[TPU_MAX_RANK]; /* output dims [lead..., S, rest...] */
  int64_t sm[TPU_MAX_RANK]; /* 0..a: how [lead..., S] values broadcast to od */
  tpu_hv coords;            /* [numel, rank]: each data element's output position */
  tpu_hv valid;             /* data-shaped: the element lies in a segment */
  tpu_hv len;               /* [lead..., S] s64 segment lengths */
} tpu_segs;

static int tpu_seg_kind(tpu_lower *L, int i) {
  const char *rs = tpu_arg_str(L, i);
  int kind = !rs                       ? -1
             : strcmp(rs, "sum") == 0  ? TPU_RED_SUM
             : strcmp(rs, "prod") == 0 ? TPU_RED_PROD
             : strcmp(rs, "mean") == 0 ? TPU_RED_MEAN
             : strcmp(rs, "max") == 0  ? TPU_RED_AMAX
             : strcmp(rs, "min") == 0  ? TPU_RED_AMIN
                                       : -1;
  if (kind < 0) tpu_lower_fail(L, TPU_ERR_RUNTIME, "segment_reduce: unsupported reduction %s", rs ? rs : "None");
  return kind;
}

/* Segments of data (argument di) along axis (argument ai), from lengths
 * (argument li) or offsets (oi): every position is compared with the
 * segment bounds to find its segment (S when none). */
static bool tpu_segments(tpu_lower *L, int di, int li, int oi, int ai, tpu_segs *g) {
  tpu_tref *t = &L->args[di].t;
  bool by_len = L->args[li].kind == TPU_ARG_TENSOR;
  if (!by_len && L->args[oi].kind != TPU_ARG_TENSOR) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "segment_reduce(): Either lengths or offsets must be defined");
    return false;
  }
  if (t->rank == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "segment_reduce(): data must have at least one dimension");
    return false;
  }
  int r = t->rank;
  int64_t a = tpu_lower_dim(L, L->args[ai].i, r), n = t->sizes[a];
  tpu_tref *st = &L->args[by_len ? li : oi].t;
  if (st->rank != a + 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "segment_reduce(): Expected %s to have %lld dims",
                   by_len ? "lengths" : "offsets", (long long)(a + 1));
    return false;
  }
  int64_t S = st->sizes[a] - (by_len ? 0 : 1);
  tpu_hv bounds = tpu_hlo_convert(H, tpu_lower_tensor(L, by_len ? li : oi, -1), TPU_S64), starts, ends;
  int64_t lo[TPU_MAX_RANK] = {0}, hi[TPU_MAX_RANK], one[TPU_MAX_RANK];
  for (int i = 0; i <= a; i++) {
    hi[i] = st->sizes[i];
    one[i] = 1;
  }
  if (by_len) {
    ends = tpu_prefix_sum_last(L, bounds);
    starts = tpu_sub(L, ends, bounds);
  } else {
    hi[a] = S;
    starts = tpu_hlo_slice(H, bounds, lo, hi, one);
    lo[a] = 1;
    hi[a] = S + 1;
    ends = tpu_hlo_slice(H, bounds, lo, hi, one);
  }
  int64_t cd[TPU_MAX_RANK], bmap[TPU_MAX_RANK];
  for (int i = 0; i < a; i++) {
    cd[i] = t->sizes[i];
    bmap[i] = i;
  }
  cd[a] = n;
  cd[a + 1] = S;
  bmap[a] = a + 1;
  tpu_hlo_type ct = tpu_hlo_type_make(TPU_S64, (int)a + 2, cd);
  tpu_hv pos = tpu_hlo_iota(H, ct, (int)a), sid = tpu_hlo_iota(H, ct, (int)a + 1);
  tpu_hv sb = tpu_hlo_broadcast_in_dim(H, starts, (int)a + 2, cd, bmap),
         eb = tpu_hlo_broadcast_in_dim(H, ends, (int)a + 2, cd, bmap);
  tpu_hv hit =
      tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_LE, sb, pos), tpu_hlo_compare(H, TPU_HLO_LT, pos, eb));
  int64_t last = a + 1;
  tpu_hv seg = tpu_hlo_reduce(H, tpu_hlo_select(H, hit, sid, tpu_k(L, sid, 0)), tpu_hlo_constant_int(H, TPU_S64, 0),
                              &last, 1, TPU_HLO_ADD);
  tpu_hv any = tpu_hlo_reduce(H, hit, tpu_hlo_constant_int(H, TPU_PRED, 0), &last, 1, TPU_HLO_OR);
  seg = tpu_hlo_select(H, any, seg, tpu_k(L, seg, (double)S));
  int64_t numel = 1, n1[2];
  for (int i = 0; i < r; i++) {
    numel *= t->sizes[i];
    g->od[i] = i == a ? S : t->sizes[i];
  }
  n1[0] = numel;
  n1[1] = 1;
  for (int i = 0; i <= a; i++) g->sm[i] = i;
  tpu_hlo_type xt = tpu_hlo_type_make(TPU_S64, r, t->sizes);
  tpu_hv cols[TPU_MAX_RANK];
  for (int i = 0; i < r; i++) {
    tpu_hv c = i == a ? tpu_hlo_broadcast_in_dim(H, seg, r, t->sizes, g->sm) : tpu_hlo_iota(H, xt, i);
    cols[i] = tpu_hlo_reshape(H, c, 2, n1);
  }
  g->coords = tpu_hlo_concat(H, cols, r, 1);
  g->valid = tpu_hlo_broadcast_in_dim(H, any, r, t->sizes, g->sm);
  g->len = tpu_sub(L, ends, starts);
  g->a = a;
  g->S = S;
  return true;
}

/* segment_reduce(data, reduce, *, lengths, indices, offsets, axis=0,
 * unsafe=False, initial=None): segments along axis, given per leading
 * batch by lengths [..., S] or offsets [..., S+1]; every element is
 * scattered into its segment, reductions starting from initial (or the
 * identity). */
void tpu_emit_segment_reduce(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int kind = tpu_seg_kind(L, 1);
  tpu_segs g;
  if (kind < 0 || !tpu_segments(L, 0, 2, 4, 5, &g)) return;
  int r = t->rank;
  tpu_dtype dt = t->dtype;
  int64_t numel = 1;
  for (int i = 0; i < r; i++) numel *= t->sizes[i];
  tpu_hlo_type ot = tpu_hlo_type_make(dt, r, g.od);
  bool has_init = L->args[7].kind == TPU_ARG_SCALAR;
  tpu_hv init = has_init ? tpu_lower_scalar(L, 7, dt) : tpu_reduce_identity(L, dt, kind);
  tpu_hv out = tpu_lower_broadcast_to(L, init, r, g.od);
  if (numel > 0)
    out = tpu_point_scatter(L, out, g.coords, tpu_hlo_reshape(H, tpu_lower_tensor(L, 0, -1), 1, &numel),
                            tpu_reduce_region(L, dt, kind));
  if (kind == TPU_RED_MEAN) {
    tpu_hv cnt = tpu_hlo_convert(H, tpu_hlo_broadcast_in_dim(H, g.len, r, g.od, g.sm), dt);
    tpu_hv empty = tpu_hlo_compare(H, TPU_HLO_EQ, cnt, tpu_k(L, cnt, 0));
    tpu_hv m = tpu_hlo_binary(H, TPU_HLO_DIV, out, tpu_hlo_select(H, empty, tpu_k(L, cnt, 1), cnt));
    tpu_hv fill = has_init ? tpu_lower_broadcast_to(L, init, r, g.od) : tpu_lower_full(L, ot, NAN);
    out = tpu_hlo_select(H, empty, fill, m);
  }
  tpu_lower_out(L, out);
}

/* _segment_reduce_backward(grad, output, data, reduce, *, lengths, offsets,
 * axis, initial): each element gets its segment's gradient: divided by the
 * length (mean), shared among the elements equal to the extreme (max/min),
 * times the product of the others (prod). */
void tpu_emit_segment_reduce_backward(tpu_lower *L) {
  tpu_tref *t = &L->args[2].t;
  int kind = tpu_seg_kind(L, 3);
  tpu_segs g;
  if (kind < 0 || !tpu_segments(L, 2, 4, 5, 6, &g)) return;
  int r = t->rank;
  tpu_dtype dt = t->dtype;
  int64_t numel = 1;
  for (int i = 0; i < r; i++) numel *= t->sizes[i];
  tpu_hlo_type xt = tpu_hlo_type_make(dt, r, t->sizes);
  if (numel == 0) {
    tpu_lower_out(L, tpu_lower_full(L, xt, 0));
    return;
  }
  tpu_hv x = tpu_lower_tensor(L, 2, -1);
  /* output-space values at each element (clamped where out of every segment) */
#define AT(v) tpu_hlo_reshape(H, tpu_point_gather(L, (v), g.coords), r, t->sizes)
  tpu_hv gr = AT(tpu_lower_tensor(L, 0, -1)), res;
  tpu_hv ones = tpu_lower_full(L, tpu_hlo_type_make(dt, 1, &numel), 1);
  tpu_hv zo = tpu_lower_full(L, tpu_hlo_type_make(dt, r, g.od), 0);
  if (kind == TPU_RED_SUM) {
    res = gr;
  } else if (kind == TPU_RED_MEAN) {
    tpu_hv cnt = tpu_hlo_convert(H, tpu_hlo_broadcast_in_dim(H, g.len, r, g.od, g.sm), dt);
    cnt = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, cnt, tpu_k(L, cnt, 0)), tpu_k(L, cnt, 1), cnt);
    res = tpu_hlo_binary(H, TPU_HLO_DIV, gr, AT(cnt));
  } else if (kind == TPU_RED_AMAX || kind == TPU_RED_AMIN) {
    tpu_hv hit = tpu_hlo_compare(H, TPU_HLO_EQ, x, AT(tpu_lower_tensor(L, 1, -1)));
    tpu_hv hf = tpu_hlo_convert(H, hit, dt);
    tpu_hv ties =
        tpu_point_scatter(L, zo, g.coords, tpu_hlo_reshape(H, hf, 1, &numel), tpu_reduce_region(L, dt, TPU_RED_SUM));
    ties = AT(ties);
    ties = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, ties, tpu_k(L, ties, 0)), tpu_k(L, ties, 1), ties);
    res = tpu_hlo_select(H, hit, tpu_hlo_binary(H, TPU_HLO_DIV, gr, ties), tpu_k(L, gr, 0));
  } else { /* prod */
    tpu_hv zero = tpu_hlo_compare(H, TPU_HLO_EQ, x, tpu_k(L, x, 0));
    tpu_hv nz = tpu_hlo_select(H, zero, tpu_k(L, x, 1), x);
    tpu_hv init = L->args[7].kind == TPU_ARG_SCALAR ? tpu_lower_scalar(L, 7, dt) : tpu_hlo_constant(H, dt, 1);
    tpu_hv pnz = tpu_point_scatter(L, tpu_lower_broadcast_to(L, init, r, g.od), g.coords,
                                   tpu_hlo_reshape(H, nz, 1, &numel), tpu_reduce_region(L, dt, TPU_RED_PROD));
    tpu_hv nzc = tpu_point_scatter(L, zo, g.coords, tpu_hlo_reshape(H, tpu_hlo_convert(H, zero, dt), 1, &numel),
                                   tpu_reduce_region(L, dt, TPU_RED_SUM));
    tpu_hv p = AT(pnz), zc = AT(nzc);
    /* a zero element: the product of the others if it is the only zero; others: all / self */
    tpu_hv at_zero = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, zc, tpu_k(L, zc, 1)), p, tpu_k(L, p, 0));
    tpu_hv other = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_EQ, zc, tpu_k(L, zc, 0)),
                                  tpu_hlo_binary(H, TPU_HLO_DIV, p, nz), tpu_k(L, p, 0));
    res = tpu_mul(L, gr, tpu_hlo_select(H, zero, at_zero, other));
  }
#undef AT
  (void)ones;
  tpu_lower_out(L, tpu_hlo_select(H, g.valid, res, tpu_k(L, res, 0)));
}

/* ---- repeat ---------------------------------------------------------------------------------- */

/* x repeated rep times along dim d: a broadcast puts the copies in a new dim
 * before d and a reshape merges the two, so no value has more dims than x
 * plus one; at the most dims, concatenations double the copies instead. */
static tpu_hv tpu_repeat1(tpu_lower *L, tpu_hv x, int d, int64_t rep) {
  const tpu_hlo_type t = *T(L, x);
  int64_t out[TPU_MAX_RANK];
  for (int k = 0; k < t.rank; k++) out[k] = t.dims[k];
  out[d] *= rep;
  if (t.rank < TPU_MAX_RANK) {
    int64_t wide[TPU_MAX_RANK], bdims[TPU_MAX_RANK];
    for (int k = 0, j = 0; k < t.rank; k++, j++) {
      if (k == d) wide[j++] = rep;
      wide[j] = t.dims[k];
      bdims[k] = j;
    }
    return tpu_hlo_reshape(H, tpu_hlo_broadcast_in_dim(H, x, t.rank + 1, wide, bdims), t.rank, out);
  }
  tpu_hv acc = TPU_HV_NONE, part = x;
  for (int64_t left = rep; left > 0; left >>= 1) {
    if (left & 1) acc = acc == TPU_HV_NONE ? part : tpu_hlo_concat(H, (tpu_hv[]){acc, part}, 2, d);
    if (left > 1) part = tpu_hlo_concat(H, (tpu_hv[]){part, part}, 2, d);
  }
  return acc;
}

/* repeat(self, repeats): self tiled repeats[i] times along dim i; a longer
 * repeats list first gives self leading dims of size 1. torch's own kernel
 * copies into a view of twice the result's dims, past the 8 a tpu tensor has
 * from 5 dims on. */
void tpu_emit_repeat(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  const tpu_arg *r = &L->args[1];
  int n = r->nints;
  if (n < t->rank) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor");
    return;
  }
  int64_t dims[TPU_MAX_LIST];
  int negative = -1;
  for (int i = 0; i < n; i++) {
    int64_t s = i < n - t->rank ? 1 : t->sizes[i - (n - t->rank)];
    dims[i] = s * r->ints[i];
    if (r->ints[i] < 0 && negative < 0) negative = i;
  }
  if (negative >= 0) { /* CPU's message: the first negative size, then the shape */
    char shape[512];
    size_t k = (size_t)snprintf(shape, sizeof shape, "[");
    for (int i = 0; i < n && k < sizeof shape; i++)
      k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, "]");
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Trying to create tensor with negative dimension %lld: %s",
                   (long long)dims[negative], shape);
    return;
  }
  if (n > TPU_MAX_RANK) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "only tensors with up to %d dims are supported on tpu (repeat's result has %d)",
                   TPU_MAX_RANK, n);
    return;
  }
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  int64_t lead[TPU_MAX_RANK];
  for (int i = 0; i < n; i++) lead[i] = i < n - t->rank ? 1 : t->sizes[i - (n - t->rank)];
  x = tpu_hlo_reshape(H, x, n, lead);
  bool empty = false;
  for (int i = 0; i < n; i++) empty |= dims[i] == 0;
  if (empty) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(T(L, x)->dtype, n, dims), 0));
    return;
  }
  for (int i = 0; i < n; i++)
    if (r->ints[i] != 1) x = tpu_repeat1(L, x, i, r->ints[i]);
  tpu_lower_out(L, x);
}

/* lower.c: the lowering context, shared helpers, and the op table.
 *
 * Inputs are created lazily: a tensor argument becomes a program parameter
 * (its record's flat buffer, plus a dynamic offset for partial views) only
 * when the emitter first asks for it, so an op that overwrites a whole tensor
 * (fill_, copy_, normal_) never reads the old buffer. Parameter order is the
 * order of first use, which is fixed for a given signature.
 *
 * Views are read from the flat buffer by the cheapest exact route: the whole
 * buffer (reshape), a contiguous range (dynamic_slice), a permutation or
 * broadcast of a contiguous block (slice, reshape, transpose,
 * broadcast_in_dim), or, for anything else, a gather of computed flat
 * indices. Writes mirror reads: replace, dynamic_update_slice, or scatter.
 */
#include "emitters.h"

#include <stdio.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

const tpu_op_row tpu_op_table[TPU_NUM_OPS] = {
#define TPU_OP(id, name, emit, flags) {name, emit, flags},
#include "ops.def"
#undef TPU_OP
};

static atomic_uint tpu_compat;
void tpu_lower_set_compat(unsigned flags) { atomic_store(&tpu_compat, flags); }
bool tpu_lower_compat(unsigned flag) { return (atomic_load(&tpu_compat) & flag) != 0; }
tpu_code tpu_lower_check_code(unsigned flag) {
  return tpu_lower_compat(flag) ? TPU_ERR_UNIMPLEMENTED : TPU_ERR_RUNTIME;
}

void tpu_lower_fail(tpu_lower *L, tpu_code code, const char *fmt, ...) {
  if (!tpu_hlo_ok(L->hlo)) return;
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tpu_hlo_fail(L->hlo, code, "%s", msg);
}

bool tpu_lower_is_none(const tpu_lower *L, int i) { return i >= L->nargs || L->args[i].kind == TPU_ARG_NONE; }

int64_t tpu_lower_dim(tpu_lower *L, int64_t d, int rank) {
  int64_t r = rank ? rank : 1;
  if (d < -r || d >= r) {
    tpu_lower_fail(L, TPU_ERR_INDEX, "Dimension out of range (expected to be in range of [%lld, %lld], but got %lld)",
                   (long long)-r, (long long)(r - 1), (long long)d);
    return 0;
  }
  return d < 0 ? d + r : d;
}

/* ---- views ------------------------------------------------------------------------ */


/* Flat indices of every element of the view: offset + sum(i_d * stride_d),
 * as an s64 tensor of the view's shape. */
static tpu_hv tpu_view_indices(tpu_lower *L, const tpu_tref *t, tpu_hv offset) {
  tpu_hlo *H = L->hlo;
  tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, t->rank, t->sizes);
  tpu_hv idx = tpu_hlo_convert(H, tpu_hlo_reshape(H, offset, 0, NULL), TPU_S64);
  idx = tpu_lower_broadcast_to(L, idx, t->rank, t->sizes);
  for (int d = 0; d < t->rank; d++) {
    if (t->sizes[d] == 1 || t->strides[d] == 0) continue;
    tpu_hv io = tpu_hlo_iota(H, it, d);
    tpu_hv st = tpu_lower_full(L, it, (double)t->strides[d]);
    idx = tpu_hlo_binary(H, TPU_HLO_ADD, idx, tpu_hlo_binary(H, TPU_HLO_MUL, io, st));
  }
  return idx;
}

tpu_hv tpu_lower_gather_rows(tpu_lower *L, tpu_hv operand, tpu_hv idx) {
  const tpu_hlo_type ot = *tpu_hlo_typeof(L->hlo, operand);
  if (ot.dtype == TPU_INVALID) return TPU_HV_NONE;
  tpu_hlo_gather_dims g;
  memset(&g, 0, sizeof g);
  int64_t slice[TPU_MAX_RANK];
  tpu_hlo_type rt = ot;
  rt.dims[0] = tpu_hlo_typeof(L->hlo, idx)->dims[0];
  slice[0] = 1;
  for (int i = 1; i < ot.rank; i++) {
    g.offset_dims[g.n_offset++] = i;
    slice[i] = ot.dims[i];
  }
  g.n_collapsed = 1;
  g.n_start_index_map = 1;
  g.index_vector_dim = 1;
  return tpu_hlo_gather(L->hlo, operand, idx, &g, slice, rt);
}

tpu_hv tpu_lower_scatter_rows(tpu_lower *L, tpu_hv operand, tpu_hv idx, tpu_hv updates, int region) {
  int rank = tpu_hlo_typeof(L->hlo, operand)->rank;
  tpu_hlo_scatter_dims d;
  memset(&d, 0, sizeof d);
  for (int i = 1; i < rank; i++) d.update_window_dims[d.n_update_window++] = i;
  d.n_inserted = 1;
  d.n_scatter_to_operand = 1;
  d.index_vector_dim = 1;
  return tpu_hlo_scatter(L->hlo, operand, idx, updates, &d, region);
}

/* v holds the view's non-unit dims in order (v's dim i is view dim
 * order[i]); broadcast_in_dim places them, which also transposes when order
 * is not increasing. */
static tpu_hv tpu_view_place(tpu_hlo *H, const tpu_tref *t, tpu_hv v, const int *order, int k) {
  int64_t sorted[TPU_MAX_RANK], p64[TPU_MAX_RANK];
  int perm[TPU_MAX_RANK];
  for (int i = 0; i < k; i++) perm[i] = i;
  for (int i = 1; i < k; i++)
    for (int j = i; j > 0 && order[perm[j]] < order[perm[j - 1]]; j--) {
      int x = perm[j];
      perm[j] = perm[j - 1];
      perm[j - 1] = x;
    }
  for (int i = 0; i < k; i++) {
    p64[i] = perm[i];
    sorted[i] = order[perm[i]];
  }
  v = tpu_hlo_transpose(H, v, p64);
  return tpu_hlo_broadcast_in_dim(H, v, t->rank, t->sizes, sorted);
}

tpu_hv tpu_lower_view_read(tpu_lower *L, tpu_tref *t, tpu_hv base, tpu_hv offset) {
  tpu_hlo *H = L->hlo;
  int64_t n = tpu_numel(t->rank, t->sizes);
  switch (t->view) {
    case TPU_VIEW_WHOLE: return tpu_hlo_reshape(H, base, t->rank, t->sizes);
    case TPU_VIEW_RANGE: {
      tpu_hv v = tpu_hlo_dynamic_slice(H, base, &offset, &n);
      return tpu_hlo_reshape(H, v, t->rank, t->sizes);
    }
    case TPU_VIEW_PERMUTED: {
      int order[TPU_MAX_RANK], k = 0;
      tpu_tref_permuted_order(t, order, &k);
      int64_t block = 1, bdims[TPU_MAX_RANK];
      for (int i = 0; i < k; i++) {
        bdims[i] = t->sizes[order[i]];
        block *= bdims[i];
      }
      /* a block as large as the record starts at 0: no slice */
      tpu_hv v = block == t->rec_numel ? base : tpu_hlo_dynamic_slice(H, base, &offset, &block);
      v = tpu_hlo_reshape(H, v, k, bdims);
      return tpu_view_place(H, t, v, order, k);
    }
    case TPU_VIEW_STRIDED: {
      int order[TPU_MAX_RANK], k = 0;
      tpu_tref_strided_order(t, order, &k);
      int64_t dense[TPU_MAX_RANK], size[TPU_MAX_RANK], bdims[TPU_MAX_RANK];
      tpu_hv starts[TPU_MAX_RANK];
      /* the offset's coordinates in 32 bits where the record's elements fit: TPUs emulate 64-bit
       * integers, and a view's 64-bit divisions took libtpu seconds to compile (docs/tpu_aot.md) */
      tpu_dtype it = t->rec_numel <= INT32_MAX ? TPU_S32 : TPU_S64;
      tpu_hlo_type ity = tpu_hlo_type_make(it, 0, NULL);
      tpu_hv off = tpu_hlo_convert(H, tpu_hlo_reshape(H, offset, 0, NULL), it);
      int kd = 0;
      for (int i = 0; i < k; i++) {
        int64_t st = t->strides[order[i]];
        dense[kd] = i == 0 ? t->rec_numel / st : t->strides[order[i - 1]] / st;
        /* coordinate i of the offset: (offset / stride_i) % dense_i */
        tpu_hv c = tpu_hlo_binary(H, TPU_HLO_DIV, off, tpu_lower_full(L, ity, (double)st));
        if (i > 0) c = tpu_hlo_binary(H, TPU_HLO_REM, c, tpu_lower_full(L, ity, (double)dense[kd]));
        starts[kd] = c;
        size[kd] = bdims[i] = t->sizes[order[i]];
        kd++;
      }
      int64_t inner = t->strides[order[k - 1]];
      if (inner > 1) {
        dense[kd] = inner;
        starts[kd] = tpu_hlo_binary(H, TPU_HLO_REM, off, tpu_lower_full(L, ity, (double)inner));
        size[kd++] = 1;
      }
      tpu_hv v = tpu_hlo_reshape(H, base, kd, dense);
      v = tpu_hlo_dynamic_slice(H, v, starts, size);
      v = tpu_hlo_reshape(H, v, k, bdims);
      return tpu_view_place(H, t, v, order, k);
    }
    default: {
      int64_t nn[2] = {n, 1};
      tpu_hv idx = tpu_hlo_reshape(H, tpu_view_indices(L, t, offset), 2, nn);
      return tpu_hlo_reshape(H, tpu_lower_gather_rows(L, base, idx), t->rank, t->sizes);
    }
  }
}

tpu_hv tpu_lower_view_write(tpu_lower *L, tpu_tref *t, tpu_hv base, tpu_hv offset, tpu_hv v) {
  tpu_hlo *H = L->hlo;
  int64_t n = tpu_numel(t->rank, t->sizes);
  int64_t rn = t->rec_numel;
  if (t->view == TPU_VIEW_WHOLE) return tpu_hlo_reshape(H, v, 1, &rn);
  if (t->view == TPU_VIEW_PERMUTED && !tpu_tref_internal_overlap(t)) {
    /* a permutation of a contiguous block (a transposed copy's destination,
     * as autocast's weight casts make): the values transposed into the
     * block's order, written whole or as one range. No index vectors: a
     * scatter of 64-bit indices is emulated on a TPU. */
    int order[TPU_MAX_RANK], pos[TPU_MAX_RANK], k = 0, j = 0;
    int64_t vd[TPU_MAX_RANK], perm[TPU_MAX_RANK];
    tpu_tref_permuted_order(t, order, &k);
    for (int i = 0; i < t->rank; i++)
      if (t->sizes[i] != 1) {
        pos[i] = j;
        vd[j++] = t->sizes[i];
      }
    for (int i = 0; i < k; i++) perm[i] = pos[order[i]];
    v = tpu_hlo_reshape(H, tpu_hlo_transpose(H, tpu_hlo_reshape(H, v, k, vd), perm), 1, &n);
    return n == rn ? v : tpu_hlo_dynamic_update_slice(H, base, v, &offset);
  }
  v = tpu_hlo_reshape(H, v, 1, &n);
  if (t->view == TPU_VIEW_RANGE) return tpu_hlo_dynamic_update_slice(H, base, v, &offset);
  int64_t nn[2] = {n, 1};
  tpu_hv idx = tpu_hlo_reshape(H, tpu_view_indices(L, t, offset), 2, nn);
  if (!tpu_tref_internal_overlap(t)) return tpu_lower_scatter_rows(L, base, idx, v, -1);
  /* Elements that alias each other (an expanded view: only fills get here):
   * as on CPU, only the elements the op changed are written, so an alias
   * left as it was cannot overwrite one that changed. The others are sent
   * to a spare slot past the end. */
  tpu_hv old = tpu_hlo_reshape(H, tpu_lower_gather_rows(L, base, idx), 1, &n);
  tpu_hv changed = tpu_hlo_compare(H, TPU_HLO_NE, v, old);
  int64_t one = 1, zero = 0;
  tpu_hv spare = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, rn), 2, nn, NULL);
  idx = tpu_hlo_select(H, tpu_hlo_reshape(H, changed, 2, nn), idx, spare);
  tpu_hv parts[2] = {base, tpu_lower_full(L, tpu_hlo_type_make(tpu_hlo_typeof(H, base)->dtype, 1, &one), 0)};
  tpu_hv ext = tpu_lower_scatter_rows(L, tpu_hlo_concat(H, parts, 2, 0), idx, v, -1);
  return tpu_hlo_slice(H, ext, &zero, &rn, &one);
}

/* ---- inputs --------------------------------------------------------------------------- */

static tpu_tref *tpu_lower_tref(tpu_lower *L, int i, int j) {
  if (i >= L->nargs) return NULL;
  tpu_arg *a = &L->args[i];
  if (a->kind == TPU_ARG_TENSOR && j < 0) return &a->t;
  if (a->kind == TPU_ARG_TENSORS && j >= 0 && j < a->nlist) return &a->list[j];
  return NULL;
}

static void tpu_lower_add_input(tpu_lower *L, tpu_in_kind k, int arg, int item) {
  if (L->nin >= TPU_MAX_INS) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s: more than %d program inputs", L->opname, TPU_MAX_INS);
    return;
  }
  L->in[L->nin++] = (tpu_in_plan){k, arg, item};
  if (L->fuse_input) L->fuse_input(L, k, arg, item);
}

static tpu_dtype tpu_real_of(tpu_dtype dt) { return dt == TPU_C128 ? TPU_F64 : TPU_F32; }

/* A flat buffer x of dtype `from` seen as dtype `to` with the same bytes
 * (complex values are (real, imag) pairs in memory, bool one byte). */
static tpu_hv tpu_lower_reinterpret(tpu_lower *L, tpu_hv x, tpu_dtype from, tpu_dtype to) {
  tpu_hlo *H = L->hlo;
  const tpu_hlo_type *xt = tpu_hlo_typeof(H, x);
  if (from == to || xt->dtype == TPU_INVALID) return x;
  int64_t n = xt->dims[0];
  if (tpu_dtype_is_complex(from)) {
    int64_t n1[2] = {n, 1}, n2 = 2 * n;
    tpu_hv parts[2] = {tpu_hlo_reshape(H, tpu_hlo_unary(H, TPU_HLO_REAL, x), 2, n1),
                       tpu_hlo_reshape(H, tpu_hlo_unary(H, TPU_HLO_IMAG, x), 2, n1)};
    tpu_hv flat = tpu_hlo_reshape(H, tpu_hlo_concat(H, parts, 2, 1), 1, &n2);
    return tpu_lower_reinterpret(L, flat, tpu_real_of(from), to);
  }
  if (tpu_dtype_is_complex(to)) {
    tpu_dtype rt = tpu_real_of(to);
    tpu_hv r = tpu_lower_reinterpret(L, x, from, rt);
    int64_t m = tpu_hlo_typeof(H, r)->dims[0] / 2, m2[2] = {m, 2};
    r = tpu_hlo_reshape(H, r, 2, m2);
    int64_t s0[2] = {0, 0}, s1[2] = {0, 1}, l0[2] = {m, 1}, l1[2] = {m, 2}, st[2] = {1, 1};
    tpu_hv re = tpu_hlo_reshape(H, tpu_hlo_slice(H, r, s0, l0, st), 1, &m);
    tpu_hv im = tpu_hlo_reshape(H, tpu_hlo_slice(H, r, s1, l1, st), 1, &m);
    return tpu_hlo_binary(H, TPU_HLO_COMPLEX, re, im);
  }
  if (from == TPU_PRED) return tpu_lower_reinterpret(L, tpu_hlo_convert(H, x, TPU_U8), TPU_U8, to);
  if (to == TPU_PRED) return tpu_hlo_convert(H, tpu_lower_reinterpret(L, x, from, TPU_U8), TPU_PRED);
  size_t sf = tpu_dtype_size(from), st = tpu_dtype_size(to);
  if (sf == st) return tpu_hlo_bitcast_convert(H, x, to);
  if (sf > st) { /* each element becomes k smaller ones */
    int64_t k = (int64_t)(sf / st), d[2] = {n, k}, nk = n * k;
    tpu_hv y = tpu_hlo_emit1(H, "stablehlo.bitcast_convert", &x, 1, NULL, tpu_hlo_type_make(to, 2, d));
    return tpu_hlo_reshape(H, y, 1, &nk);
  }
  int64_t k = (int64_t)(st / sf), d[2] = {n / k, k}, m = n / k;
  tpu_hv y = tpu_hlo_reshape(H, x, 2, d);
  return tpu_hlo_emit1(H, "stablehlo.bitcast_convert", &y, 1, NULL, tpu_hlo_type_make(to, 1, &m));
}

static tpu_hv tpu_lower_base(tpu_lower *L, tpu_tref *t, int i, int j) {
  if (t->base != TPU_HV_NONE || !t->rec) return t->base;
  int64_t n = t->rec_numel;
  bool reint = t->rec_dtype != TPU_INVALID && t->rec_dtype != t->dtype;
  tpu_hv raw;
  if (L->fuse_record) {
    raw = L->fuse_record(L, t->rec); /* the record's current value in the fused program */
  } else {
    tpu_lower_add_input(L, TPU_IN_RECORD, i, j);
    int64_t rn = reint ? (int64_t)((size_t)n * tpu_dtype_size(t->dtype) / tpu_dtype_size(t->rec_dtype)) : n;
    /* the parameter has the shape of the record's buffer, read flat */
    tpu_hlo_type pt = tpu_hlo_type_make(reint ? t->rec_dtype : t->dtype, 1, &rn);
    if (L->record_type) pt = L->record_type(t->rec);
    raw = tpu_hlo_param(L->hlo, pt);
    if (pt.rank != 1) raw = tpu_hlo_reshape(L->hlo, raw, 1, &rn);
  }
  t->base = reint ? tpu_lower_reinterpret(L, raw, t->rec_dtype, t->dtype) : raw;
  if (t->view != TPU_VIEW_WHOLE && L->static_offsets) {
    t->offv = tpu_hlo_constant_int(L->hlo, TPU_S64, t->offset);
  } else if (t->view != TPU_VIEW_WHOLE) {
    bool narrow = L->tpu_like && t->rec_numel <= INT32_MAX;
    tpu_lower_add_input(L, narrow ? TPU_IN_OFFSET32 : TPU_IN_OFFSET, i, j);
    t->offv = tpu_hlo_param(L->hlo, tpu_hlo_type_make(narrow ? TPU_S32 : TPU_S64, 0, NULL));
  }
  return t->base;
}

tpu_hv tpu_lower_tensor(tpu_lower *L, int i, int j) {
  tpu_tref *t = tpu_lower_tref(L, i, j);
  if (t && t->zero_size) {
    if (t->value == TPU_HV_NONE) t->value = tpu_lower_full(L, tpu_hlo_type_make(t->dtype, t->rank, t->sizes), 0);
    return t->value;
  }
  if (!t || (!t->rec && !t->host)) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: argument %d is not a tensor", L->opname, i);
    return TPU_HV_NONE;
  }
  if (t->value != TPU_HV_NONE) return t->value;
  if (t->host) {
    tpu_lower_add_input(L, TPU_IN_HOST_TENSOR, i, j);
    t->value = tpu_hlo_param(L->hlo, tpu_hlo_type_make(t->dtype, 0, NULL));
    return t->value;
  }
  tpu_hv base = tpu_lower_base(L, t, i, j);
  t->value = tpu_lower_view_read(L, t, base, t->offv);
  return t->value;
}

tpu_hv tpu_lower_scalar(tpu_lower *L, int i, tpu_dtype dt) {
  if (i >= L->nargs || L->args[i].kind != TPU_ARG_SCALAR) {
    if (i < L->nargs && L->args[i].kind == TPU_ARG_TENSOR)
      return tpu_hlo_convert(L->hlo, tpu_hlo_reshape(L->hlo, tpu_lower_tensor(L, i, -1), 0, NULL), dt);
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: argument %d is not a number", L->opname, i);
    return TPU_HV_NONE;
  }
  tpu_arg *a = &L->args[i];
  if (L->tpu_like && dt == TPU_F32 && (a->skind == TPU_SCALAR_INT || a->skind == TPU_SCALAR_FLOAT)) {
    if (a->value32 == TPU_HV_NONE) {
      tpu_lower_add_input(L, TPU_IN_SCALAR32, i, -1);
      a->value32 = tpu_hlo_param(L->hlo, tpu_hlo_type_make(TPU_F32, 0, NULL));
    }
    return a->value32;
  }
  if (a->value == TPU_HV_NONE) {
    static const tpu_dtype kinds[] = {TPU_PRED, TPU_S64, TPU_F64, TPU_C128};
    tpu_lower_add_input(L, TPU_IN_SCALAR, i, -1);
    a->value = tpu_hlo_param(L->hlo, tpu_hlo_type_make(kinds[a->skind], 0, NULL));
  }
  tpu_dtype from = tpu_hlo_typeof(L->hlo, a->value)->dtype;
  if (from == TPU_C128 && !tpu_dtype_is_complex(dt) && dt != TPU_PRED) /* a bool: either part nonzero */
    return tpu_hlo_convert(L->hlo, tpu_hlo_unary(L->hlo, TPU_HLO_REAL, a->value), dt);
  return tpu_hlo_convert(L->hlo, a->value, dt);
}

tpu_hv tpu_lower_input(tpu_lower *L, int i, tpu_dtype dt) {
  if (i < L->nargs && L->args[i].kind == TPU_ARG_SCALAR) return tpu_lower_scalar(L, i, dt);
  return tpu_hlo_convert(L->hlo, tpu_lower_tensor(L, i, -1), dt);
}

/* ---- type promotion ------------------------------------------------------------------ */

/* torch's combine_categories: a lower-priority class only matters when it is
 * of a higher category than the result so far. */
static tpu_dtype tpu_combine(tpu_dtype higher, tpu_dtype lower) {
  if (higher == TPU_INVALID) return lower;
  if (lower == TPU_INVALID) return higher;
  if (tpu_dtype_is_complex(higher)) return higher;
  if (tpu_dtype_is_complex(lower)) {
    if (tpu_dtype_is_float(higher)) return higher == TPU_F64 ? TPU_C128 : TPU_C64;
    return lower;
  }
  if (tpu_dtype_is_float(higher)) return higher;
  if (higher == TPU_PRED || tpu_dtype_is_float(lower)) return tpu_dtype_promote(higher, lower);
  return higher;
}

tpu_dtype tpu_lower_result_type(tpu_lower *L, const int *idx, int n) {
  tpu_dtype dimr = TPU_INVALID, zeror = TPU_INVALID, wrapr = TPU_INVALID;
  for (int k = 0; k < n; k++) {
    if (idx[k] >= L->nargs) continue;
    tpu_arg *a = &L->args[idx[k]];
    if (a->kind == TPU_ARG_TENSOR) {
      tpu_dtype *slot = (a->t.rank == 0) ? &zeror : &dimr;
      *slot = *slot == TPU_INVALID ? a->t.dtype : tpu_dtype_promote(*slot, a->t.dtype);
    } else if (a->kind == TPU_ARG_SCALAR) {
      static const tpu_dtype wrapped[] = {TPU_PRED, TPU_S64, TPU_F32, TPU_C64};
      tpu_dtype w = wrapped[a->skind];
      wrapr = wrapr == TPU_INVALID ? w : tpu_dtype_promote(wrapr, w);
    } else if (a->kind == TPU_ARG_TENSORS) {
      for (int j = 0; j < a->nlist; j++) {
        if (!a->list[j].rec && !a->list[j].host && !a->list[j].zero_size) continue;
        tpu_dtype *slot = (a->list[j].rank == 0) ? &zeror : &dimr;
        *slot = *slot == TPU_INVALID ? a->list[j].dtype : tpu_dtype_promote(*slot, a->list[j].dtype);
      }
    }
  }
  tpu_dtype r = tpu_combine(dimr, tpu_combine(zeror, wrapr));
  return r == TPU_INVALID ? TPU_F32 : r;
}

tpu_dtype tpu_lower_float_type(tpu_dtype dt) {
  return (tpu_dtype_is_float(dt) || tpu_dtype_is_complex(dt)) ? dt : TPU_F32;
}

/* ---- shapes ----------------------------------------------------------------------------- */

/* Fails L with torch's message unless a value of type t broadcasts to exactly
 * dims: "The size of tensor a ... must match ..." when the two shapes do not
 * broadcast at all, "output with shape [..] doesn't match the broadcast shape
 * [..]" when they broadcast to a larger shape (an in-place or out= write;
 * tpu_broadcast_check's message). */
static bool tpu_lower_fits(tpu_lower *L, const tpu_hlo_type *t, int rank, const int64_t *dims) {
  tpu_status *s = tpu_broadcast_check(rank, dims, t->rank, t->dims);
  if (!s) return true;
  tpu_lower_fail(L, tpu_status_code(s), "%s", tpu_status_message(s));
  tpu_status_free(s);
  return false;
}

tpu_hv tpu_lower_broadcast_to(tpu_lower *L, tpu_hv v, int rank, const int64_t *dims) {
  const tpu_hlo_type *t = tpu_hlo_typeof(L->hlo, v);
  if (t->dtype == TPU_INVALID) return TPU_HV_NONE;
  if (t->rank == rank && memcmp(t->dims, dims, sizeof(int64_t) * (size_t)rank) == 0) return v;
  if (!tpu_lower_fits(L, t, rank, dims)) return TPU_HV_NONE;
  int64_t bd[TPU_MAX_RANK], keep[TPU_MAX_RANK];
  int nk = 0, off = rank - t->rank;
  for (int i = 0; i < t->rank; i++) {
    if (t->dims[i] == dims[off + i]) {
      bd[nk] = off + i;
      keep[nk++] = t->dims[i];
    }
  }
  /* Size-1 dims that are expanded are dropped first. */
  v = tpu_hlo_reshape(L->hlo, v, nk, keep);
  return tpu_hlo_broadcast_in_dim(L->hlo, v, rank, dims, bd);
}

void tpu_lower_broadcast_all(tpu_lower *L, tpu_hv *vs, int n) {
  int rank = 0;
  int64_t dims[TPU_MAX_RANK];
  for (int k = 0; k < n; k++) {
    const tpu_hlo_type *t = tpu_hlo_typeof(L->hlo, vs[k]);
    if (t->dtype == TPU_INVALID) return;
    if (t->rank > rank) {
      /* shift existing dims right, then pad with leading 1s */
      int grow = t->rank - rank;
      for (int i = rank - 1; i >= 0; i--) dims[i + grow] = dims[i];
      for (int i = 0; i < grow; i++) dims[i] = 1;
      rank = t->rank;
    }
    int off = rank - t->rank;
    for (int i = 0; i < t->rank; i++) {
      int64_t a = dims[off + i], b = t->dims[i];
      if (a == b || b == 1) continue;
      if (a == 1) {
        dims[off + i] = b;
        continue;
      }
      tpu_lower_fail(L, TPU_ERR_RUNTIME,
                     "The size of tensor a (%lld) must match the size of tensor b (%lld) at non-singleton dimension %d",
                     (long long)a, (long long)b, off + i);
      return;
    }
  }
  for (int k = 0; k < n; k++) vs[k] = tpu_lower_broadcast_to(L, vs[k], rank, dims);
}

tpu_hv tpu_lower_binary(tpu_lower *L, tpu_hlo_op op, tpu_hv a, tpu_hv b) {
  tpu_hv v[2] = {a, b};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hlo *H = L->hlo;
  tpu_hv r = tpu_hlo_binary(H, op, v[0], v[1]);
  if ((op == TPU_HLO_MAX || op == TPU_HLO_MIN) && r != TPU_HV_NONE && tpu_dtype_is_float(tpu_hlo_typeof(H, r)->dtype)) {
    /* torch's maximum, minimum and clamp propagate a NaN of either operand;
     * XLA's CPU max and min drop one in the second */
    for (int k = 1; k >= 0; k--) r = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_NE, v[k], v[k]), v[k], r);
  }
  return r;
}

tpu_hv tpu_lower_full(tpu_lower *L, tpu_hlo_type t, double value) {
  tpu_hv c = (tpu_dtype_is_float(t.dtype) || tpu_dtype_is_complex(t.dtype))
                 ? tpu_hlo_constant(L->hlo, t.dtype, value)
                 : tpu_hlo_constant_int(L->hlo, t.dtype, (int64_t)value);
  if (t.rank == 0) return c;
  return tpu_hlo_broadcast_in_dim(L->hlo, c, t.rank, t.dims, NULL);
}

tpu_hv tpu_lower_full_like(tpu_lower *L, tpu_hv like, double value) {
  return tpu_lower_full(L, *tpu_hlo_typeof(L->hlo, like), value);
}

/* ---- outputs ------------------------------------------------------------------------------ */

int tpu_lower_out(tpu_lower *L, tpu_hv v) {
  if (L->nout >= TPU_MAX_OUTS) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s: too many outputs", L->opname);
    return -1;
  }
  const tpu_hlo_type *t = tpu_hlo_typeof(L->hlo, v);
  int newidx = 0;
  for (int k = 0; k < L->nout; k++) newidx += L->out[k].kind == TPU_OUT_NEW;
  L->out[L->nout] = (tpu_out_plan){TPU_OUT_NEW, -1, -1, *t, NULL};
  int64_t n = tpu_hlo_type_numel(t);
  L->outv[L->nout++] = tpu_hlo_reshape(L->hlo, v, 1, &n);
  return newidx;
}


void tpu_lower_check(tpu_lower *L, tpu_hv bad, tpu_code code, const char *msg) {
  if (!L->value_checks || bad == TPU_HV_NONE) return;
  tpu_hlo *H = L->hlo;
  const tpu_hlo_type *bt = tpu_hlo_typeof(H, bad);
  if (bt->dtype != TPU_PRED) return;
  if (bt->rank > 0) {
    int64_t dims[TPU_MAX_RANK];
    for (int d = 0; d < bt->rank; d++) dims[d] = d;
    bad = tpu_hlo_reduce(H, bad, tpu_hlo_constant_int(H, TPU_PRED, 0), dims, bt->rank, TPU_HLO_OR);
  }
  if (L->check == TPU_HV_NONE) {
    L->check = bad;
    L->check_code = code;
    L->check_msg = msg;
  } else {
    L->check = tpu_hlo_binary(H, TPU_HLO_OR, L->check, bad); /* the first check's error names the call */
  }
}

void tpu_lower_check_range(tpu_lower *L, tpu_hv idx, int64_t n, bool negative, tpu_code code, const char *msg) {
  if (!L->value_checks || idx == TPU_HV_NONE) return;
  tpu_hlo *H = L->hlo;
  idx = tpu_hlo_convert(H, idx, TPU_S64);
  tpu_hlo_type t = *tpu_hlo_typeof(H, idx);
  tpu_hv lo = tpu_hlo_compare(H, TPU_HLO_LT, idx, tpu_lower_full(L, t, negative ? -(double)n : 0));
  tpu_hv hi = tpu_hlo_compare(H, TPU_HLO_GE, idx, tpu_lower_full(L, t, (double)n));
  tpu_lower_check(L, tpu_hlo_binary(H, TPU_HLO_OR, lo, hi), code, msg);
}

void tpu_lower_check_targets(tpu_lower *L, tpu_hv tg, int64_t C, int64_t ignore_index) {
  if (!L->value_checks || tg == TPU_HV_NONE) return;
  tpu_hlo *H = L->hlo;
  tpu_hlo_type t = *tpu_hlo_typeof(H, tg);
  tpu_hv lo = tpu_hlo_compare(H, TPU_HLO_LT, tg, tpu_lower_full(L, t, 0));
  tpu_hv hi = tpu_hlo_compare(H, TPU_HLO_GE, tg, tpu_lower_full(L, t, (double)C));
  tpu_hv kept = tpu_hlo_compare(H, TPU_HLO_NE, tg, tpu_lower_full(L, t, (double)ignore_index));
  tpu_lower_check(L, tpu_hlo_binary(H, TPU_HLO_AND, kept, tpu_hlo_binary(H, TPU_HLO_OR, lo, hi)), TPU_ERR_INDEX,
                  "Target is out of bounds: a class index not in [0, number of classes) and not ignore_index");
}

void tpu_lower_check_divisor(tpu_lower *L, tpu_hv b) {
  if (!L->value_checks || b == TPU_HV_NONE) return;
  tpu_hlo_type t = *tpu_hlo_typeof(L->hlo, b);
  if (!tpu_dtype_is_int(t.dtype)) return;
  tpu_lower_check(L, tpu_hlo_compare(L->hlo, TPU_HLO_EQ, b, tpu_lower_full(L, t, 0)), TPU_ERR_RUNTIME,
                  "ZeroDivisionError (integer division by zero)");
}

/* The message of tpu_lower_check_fits (static: checks keep their message). */
static const char *tpu_fits_msg(tpu_dtype dt) {
  switch (dt) {
    case TPU_S8: return "value cannot be converted to type int8_t without overflow";
    case TPU_S16: return "value cannot be converted to type int16_t without overflow";
    case TPU_S32: return "value cannot be converted to type int without overflow";
    case TPU_S64: return "value cannot be converted to type int64_t without overflow";
    case TPU_U8: return "value cannot be converted to type uint8_t without overflow";
    case TPU_U16: return "value cannot be converted to type uint16_t without overflow";
    case TPU_U32: return "value cannot be converted to type uint32_t without overflow";
    case TPU_U64: return "value cannot be converted to type uint64_t without overflow";
    case TPU_F16: return "value cannot be converted to type c10::Half without overflow";
    case TPU_BF16: return "value cannot be converted to type c10::BFloat16 without overflow";
    case TPU_F32: return "value cannot be converted to type float without overflow";
    case TPU_F64: return "value cannot be converted to type double without overflow";
    case TPU_C64: return "value cannot be converted to type c10::complex<float> without overflow";
    case TPU_C128: return "value cannot be converted to type c10::complex<double> without overflow";
    default: return NULL;
  }
}

void tpu_lower_check_fits(tpu_lower *L, tpu_hv v, tpu_dtype dt) {
  const char *msg = tpu_fits_msg(dt);
  if (!L->value_checks || v == TPU_HV_NONE || !msg) return;
  tpu_hlo *H = L->hlo;
  tpu_hlo_type vt = *tpu_hlo_typeof(H, v);
  if (vt.dtype == TPU_PRED || vt.dtype == TPU_INVALID) return; /* a bool always converts */
  tpu_hv bad = TPU_HV_NONE;
  if (tpu_dtype_is_complex(vt.dtype)) {
    if (!tpu_dtype_is_complex(dt)) {
      tpu_hv im = tpu_hlo_unary(H, TPU_HLO_IMAG, v);
      bad = tpu_hlo_compare(H, TPU_HLO_NE, im, tpu_lower_full_like(L, im, 0));
    }
    v = tpu_hlo_unary(H, TPU_HLO_REAL, v);
    vt = *tpu_hlo_typeof(H, v);
  }
  double lo, hi; /* compared in f64, as tpu_scalar_check compares */
  tpu_dtype_bounds(dt, &lo, &hi);
  tpu_hv f = tpu_hlo_convert(H, v, TPU_F64);
  tpu_hv over;
  if (tpu_dtype_is_int(vt.dtype)) {
    if (tpu_dtype_is_unsigned_int(dt)) /* c10 lets a negative wrap when its magnitude fits */
      over = tpu_hlo_compare(H, TPU_HLO_GT, tpu_hlo_unary(H, TPU_HLO_ABS, f), tpu_lower_full_like(L, f, hi));
    else if (dt == TPU_S64 || dt == TPU_U64)
      over = TPU_HV_NONE;
    else
      over = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_compare(H, TPU_HLO_LT, f, tpu_lower_full_like(L, f, lo)),
                            tpu_hlo_compare(H, TPU_HLO_GT, f, tpu_lower_full_like(L, f, hi)));
  } else {
    tpu_hv out = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_compare(H, TPU_HLO_LT, f, tpu_lower_full_like(L, f, lo)),
                                tpu_hlo_compare(H, TPU_HLO_GT, f, tpu_lower_full_like(L, f, hi)));
    if (tpu_dtype_is_int(dt)) { /* NaN never converts; 2**63 is past int64 */
      over = tpu_hlo_binary(H, TPU_HLO_OR, out, tpu_hlo_compare(H, TPU_HLO_NE, f, f));
      if (dt == TPU_S64)
        over = tpu_hlo_binary(H, TPU_HLO_OR, over,
                              tpu_hlo_compare(H, TPU_HLO_GE, f, tpu_lower_full_like(L, f, 9223372036854775808.0)));
    } else { /* inf and NaN convert to a float */
      over = tpu_hlo_binary(H, TPU_HLO_AND, out, tpu_hlo_unary(H, TPU_HLO_IS_FINITE, f));
    }
  }
  if (over != TPU_HV_NONE) bad = bad == TPU_HV_NONE ? over : tpu_hlo_binary(H, TPU_HLO_OR, bad, over);
  if (bad != TPU_HV_NONE) tpu_lower_check(L, tpu_hlo_reshape(H, bad, 0, NULL), TPU_ERR_RUNTIME, msg);
}

void tpu_lower_write(tpu_lower *L, int i, int item, tpu_hv v) {
  tpu_tref *t = tpu_lower_tref(L, i, item);
  if (t && t->zero_size) { /* nothing to write, but the shapes must still fit */
    const tpu_hlo_type *vt = tpu_hlo_typeof(L->hlo, v);
    if (vt->dtype != TPU_INVALID) tpu_lower_fits(L, vt, t->rank, t->sizes);
    return;
  }
  if (!t || !t->rec) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "%s: argument %d is not a tpu tensor to write into", L->opname, i);
    return;
  }
  if (L->nout >= TPU_MAX_OUTS) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s: too many outputs", L->opname);
    return;
  }
  const tpu_hlo_type *vt = tpu_hlo_typeof(L->hlo, v);
  if (vt->dtype == TPU_INVALID) return;
  /* complex into real: the real part; into bool: either part nonzero (tpu_hlo_convert) */
  if (tpu_dtype_is_complex(vt->dtype) && !tpu_dtype_is_complex(t->dtype) && t->dtype != TPU_PRED)
    v = tpu_hlo_unary(L->hlo, TPU_HLO_REAL, v);
  v = tpu_hlo_convert(L->hlo, v, t->dtype);
  v = tpu_lower_broadcast_to(L, v, t->rank, t->sizes);
  bool guard = L->check != TPU_HV_NONE;
  tpu_hv base = t->view == TPU_VIEW_WHOLE && !guard ? TPU_HV_NONE : tpu_lower_base(L, t, i, item);
  tpu_hv nb = tpu_lower_view_write(L, t, base, t->offv, v);
  if (guard) /* an invalid input leaves the tensor as it was */
    nb = tpu_hlo_select(L->hlo, tpu_lower_broadcast_to(L, L->check, 1, tpu_hlo_typeof(L->hlo, nb)->dims), base, nb);
  if (t->rec_dtype != TPU_INVALID && t->rec_dtype != t->dtype)
    nb = tpu_lower_reinterpret(L, nb, t->dtype, t->rec_dtype);
  L->out[L->nout] = (tpu_out_plan){TPU_OUT_WRITE, i, item, *tpu_hlo_typeof(L->hlo, nb), NULL};
  L->outv[L->nout++] = nb;
  /* Later reads in the same program see the new contents. */
  t->value = v;
}

void tpu_lower_return_arg(tpu_lower *L, int i, int item) {
  if (L->nret >= TPU_MAX_OUTS) return;
  L->ret[L->nret++] = (tpu_ret_plan){.is_arg = true, .index = i, .item = item};
}

/* ---- random numbers ------------------------------------------------------------------------ */

tpu_hv tpu_lower_random_bits(tpu_lower *L, int rank, const int64_t *dims) {
  if (!L->uses_rng) {
    int64_t two = 2;
    tpu_lower_add_input(L, TPU_IN_RNG, -1, -1);
    L->rng_state = tpu_hlo_param(L->hlo, tpu_hlo_type_make(TPU_U64, 1, &two));
    L->uses_rng = true;
  }
  tpu_hv next = TPU_HV_NONE;
  tpu_hv bits = tpu_hlo_rng_bit_generator(L->hlo, L->rng_state, tpu_hlo_type_make(TPU_U32, rank, dims), &next);
  L->rng_state = next;
  L->rng_words += tpu_numel(rank, dims) + 1;
  return bits;
}

tpu_hv tpu_lower_uniform(tpu_lower *L, tpu_dtype dt, int rank, const int64_t *dims) {
  /* 24 (f32) random mantissa bits scaled into [0, 1); f64 uses two words. */
  tpu_hlo *H = L->hlo;
  tpu_hlo_type ft = tpu_hlo_type_make(TPU_F32, rank, dims);
  tpu_hlo_type ut = tpu_hlo_type_make(TPU_U32, rank, dims);
  tpu_hv bits = tpu_lower_random_bits(L, rank, dims);
  tpu_hv shifted = tpu_hlo_binary(H, TPU_HLO_SHR_L, bits, tpu_lower_full(L, ut, 8));
  tpu_hv f = tpu_hlo_convert(H, shifted, TPU_F32);
  f = tpu_hlo_binary(H, TPU_HLO_MUL, f, tpu_lower_full(L, ft, 1.0 / 16777216.0));
  if (dt == TPU_F64) {
    tpu_hlo_type dt64 = tpu_hlo_type_make(TPU_F64, rank, dims);
    tpu_hv lo = tpu_hlo_convert(H, tpu_lower_random_bits(L, rank, dims), TPU_F64);
    tpu_hv hi = tpu_hlo_convert(H, f, TPU_F64);
    return tpu_hlo_binary(H, TPU_HLO_ADD, hi,
                          tpu_hlo_binary(H, TPU_HLO_MUL, lo, tpu_lower_full(L, dt64, 1.0 / 16777216.0 / 4294967296.0)));
  }
  tpu_hv r = tpu_hlo_convert(H, f, dt);
  if (dt != TPU_F32) {
    /* Rounding to a narrower type can reach 1.0: keep the range half-open. */
    tpu_hlo_type t = tpu_hlo_type_make(dt, rank, dims);
    tpu_hv one = tpu_lower_full(L, t, 1.0);
    tpu_hv ge = tpu_hlo_compare(H, TPU_HLO_GE, r, one);
    r = tpu_hlo_select(H, ge, tpu_lower_full(L, t, 0.0), r);
  }
  return r;
}

/* ---- running a row -------------------------------------------------------------------------- */


/* Whether result v may be written into a tensor of dtype to (exact: only of
 * its own dtype); fails L with torch's message when not. */
static bool tpu_lower_castable(tpu_lower *L, tpu_hv v, tpu_dtype to, bool exact) {
  tpu_dtype from = tpu_hlo_typeof(L->hlo, v)->dtype;
  if (from == to) return true;
  if (exact) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: Expected out tensor to have dtype %s, but got %s instead", L->opname,
                   tpu_dtype_name(from), tpu_dtype_name(to));
    return false;
  }
  if (tpu_dtype_can_cast(from, to)) return true;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "result type %s can't be cast to the desired output type %s",
                 tpu_dtype_c10_name(from), tpu_dtype_c10_name(to));
  return false;
}

/* The call's value check becomes an output (after every other). */
static void tpu_lower_check_out(tpu_lower *L) {
  if (L->check == TPU_HV_NONE || !tpu_hlo_ok(L->hlo)) return;
  if (L->nout >= TPU_MAX_OUTS) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s: too many outputs", L->opname);
    return;
  }
  L->out[L->nout] =
      (tpu_out_plan){TPU_OUT_CHECK, (int)L->check_code, -1, *tpu_hlo_typeof(L->hlo, L->check), L->check_msg};
  L->outv[L->nout++] = L->check;
}

void tpu_lower_run(tpu_lower *L, const tpu_op_row *row) {
  L->check = TPU_HV_NONE;
  for (int i = 0; i < L->nargs; i++) {
    tpu_arg *a = &L->args[i];
    a->value = L->shared && a->kind == TPU_ARG_SCALAR ? L->shared[i] : TPU_HV_NONE;
    a->value32 = L->shared32 && a->kind == TPU_ARG_SCALAR ? L->shared32[i] : TPU_HV_NONE;
    a->t.base = a->t.offv = a->t.value = TPU_HV_NONE;
    for (int j = 0; j < a->nlist && a->kind == TPU_ARG_TENSORS; j++)
      a->list[j].base = a->list[j].offv = a->list[j].value = TPU_HV_NONE;
  }
  row->emit(L);
  if (!tpu_hlo_ok(L->hlo)) return;
  if (row->flags & (TPU_OP_INPLACE | TPU_OP_OUT)) {
    /* Move the functional results into their destinations. */
    int nres = 0;
    tpu_hv res[TPU_MAX_OUTS];
    for (int k = 0; k < L->nout; k++)
      if (L->out[k].kind == TPU_OUT_NEW) {
        const tpu_hlo_type *t = &L->out[k].type;
        res[nres++] = tpu_hlo_reshape(L->hlo, L->outv[k], t->rank, t->dims);
      }
    int w = 0;
    for (int k = 0; k < L->nout; k++)
      if (L->out[k].kind != TPU_OUT_NEW) {
        L->out[w] = L->out[k];
        L->outv[w++] = L->outv[k];
      }
    L->nout = w;
    L->nret = 0;
    if (row->flags & TPU_OP_INPLACE) {
      if (nres < 1) return;
      if (!tpu_lower_castable(L, res[0], L->args[0].t.dtype, false)) return;
      tpu_lower_write(L, 0, -1, res[0]);
      tpu_lower_return_arg(L, 0, -1);
    } else {
      /* out= tensors are the trailing tensor arguments. */
      int first = L->nargs;
      for (int k = 0; k < nres; k++) {
        first--;
        while (first >= 0 && L->args[first].kind != TPU_ARG_TENSOR) first--;
      }
      if (first < 0) {
        tpu_lower_fail(L, TPU_ERR_TYPE, "%s: missing out= tensor", L->opname);
        return;
      }
      for (int k = 0, i = first; k < nres; k++, i++) {
        while (L->args[i].kind != TPU_ARG_TENSOR) i++;
        const tpu_hlo_type *rt = tpu_hlo_typeof(L->hlo, res[k]);
        tpu_tref *t = &L->args[i].t;
        if (!tpu_lower_castable(L, res[k], t->dtype, row->flags & TPU_OP_OUT_EXACT)) return;
        if (rt->rank != t->rank || memcmp(rt->dims, t->sizes, sizeof(int64_t) * (size_t)t->rank)) {
          /* torch resizes an out= tensor of the wrong shape: the result is a
           * new buffer that the binding sets into the out= tensor. */
          int idx = tpu_lower_out(L, tpu_hlo_convert(L->hlo, res[k], t->dtype));
          L->ret[L->nret++] = (tpu_ret_plan){.index = idx, .item = -1, .resize = true, .arg = i};
          continue;
        }
        tpu_lower_write(L, i, -1, res[k]);
        tpu_lower_return_arg(L, i, -1);
      }
    }
    tpu_lower_check_out(L);
    return;
  }
  tpu_lower_check_out(L);
  if (L->nret == 0) {
    int newidx = 0;
    for (int k = 0; k < L->nout; k++)
      if (L->out[k].kind == TPU_OUT_NEW) L->ret[L->nret++] = (tpu_ret_plan){.index = newidx++, .item = -1};
  }
}

const char *tpu_typemeta_name(tpu_dtype t) {
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

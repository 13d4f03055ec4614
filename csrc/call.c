/* call.c: the geometry of a call's tensor views: how a view is read from
 * its record, and torch's overlap and broadcast rules for writes.
 */
#include "call.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int64_t tpu_numel(int rank, const int64_t *sizes) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= sizes[i];
  return n;
}

bool tpu_tref_contiguous(const tpu_tref *t) {
  int64_t expect = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    if (t->sizes[i] == 1) continue;
    if (t->strides[i] != expect) return false;
    expect *= t->sizes[i];
  }
  return true;
}

/* Dims with size > 1 and stride > 0, ordered by decreasing stride, must tile
 * a contiguous block: then the view is a permutation plus broadcast of it. */
/* The view's dims of size > 1 and nonzero stride, outer to inner by stride,
 * into order; their count, or -1 when a stride is negative. */
static int tpu_stride_order(const tpu_tref *t, int *order) {
  int k = 0;
  for (int i = 0; i < t->rank; i++)
    if (t->sizes[i] > 1 && t->strides[i] != 0) {
      if (t->strides[i] < 0) return -1;
      order[k++] = i;
    }
  for (int i = 1; i < k; i++)
    for (int j = i; j > 0 && t->strides[order[j]] > t->strides[order[j - 1]]; j--) {
      int x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  return k;
}

bool tpu_tref_permuted_order(const tpu_tref *t, int *order, int *n) {
  int k = tpu_stride_order(t, order);
  if (k < 0) return false;
  int64_t expect = 1;
  for (int i = k - 1; i >= 0; i--) {
    if (t->strides[order[i]] != expect) return false;
    expect *= t->sizes[order[i]];
  }
  *n = k;
  return true;
}

/* The dims of a view, outer to inner by stride, when each steps by a
 * multiple of the inner dims' extent and the record is whole rows of the
 * outermost stride: the view is then a block of the record seen as a dense
 * array (rows, row / next stride, ..., innermost stride), at the block
 * coordinates of its offset (q, k and v split from one projection, every
 * other column). The offset's coordinates must not carry (the kind is in
 * the program's key, so every offset the program meets satisfies it).
 * Strides must be distinct and positive. */
bool tpu_tref_strided_order(const tpu_tref *t, int *order, int *n) {
  int k = tpu_stride_order(t, order);
  if (k <= 0 || (k >= TPU_MAX_RANK && t->strides[order[k - 1]] > 1)) return false;
  if (t->rec_numel % t->strides[order[0]]) return false;
  int64_t rest = t->offset % t->strides[order[0]];
  for (int i = 0; i + 1 < k; i++) {
    int64_t so = t->strides[order[i]], si = t->strides[order[i + 1]];
    if (so == si || so % si || so < t->sizes[order[i + 1]] * si) return false;
    /* the coordinate along i + 1 plus the size must stay inside so / si */
    if ((rest / si) + t->sizes[order[i + 1]] > so / si) return false;
    rest %= si;
  }
  *n = k;
  return true;
}

int tpu_tref_view_kind(const tpu_tref *t) {
  if (t->zero_size) return TPU_VIEW_WHOLE;
  int64_t n = tpu_numel(t->rank, t->sizes);
  bool contig = tpu_tref_contiguous(t);
  if (contig && t->offset == 0 && n == t->rec_numel) return TPU_VIEW_WHOLE;
  if (contig) return TPU_VIEW_RANGE;
  int order[TPU_MAX_RANK], k;
  if (tpu_tref_permuted_order(t, order, &k)) return TPU_VIEW_PERMUTED;
  if (tpu_tref_strided_order(t, order, &k)) return TPU_VIEW_STRIDED;
  return TPU_VIEW_GATHER;
}

static int64_t tpu_tref_numel(const tpu_tref *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->sizes[i];
  return n;
}

bool tpu_dense(int rank, const int64_t *sizes, const int64_t *strides) {
  int order[TPU_MAX_RANK], n = 0;
  for (int i = 0; i < rank; i++)
    if (sizes[i] != 1) {
      int j = n++;
      while (j > 0 && strides[order[j - 1]] > strides[i]) {
        order[j] = order[j - 1];
        j--;
      }
      order[j] = i;
    }
  int64_t expect = 1;
  for (int k = 0; k < n; k++) {
    if (strides[order[k]] != expect) return false;
    expect *= sizes[order[k]];
  }
  return true;
}

int tpu_storage_dims(int rank, const int64_t *sizes, const int64_t *strides, int64_t *dims) {
  if (!tpu_dense(rank, sizes, strides)) return 0;
  int order[TPU_MAX_RANK], n = 0;
  tpu_stride_order_desc(rank, strides, order); /* fills order even when it is the plain one */
  for (int k = 0; k < rank; k++)
    if (sizes[order[k]] != 1) dims[n++] = sizes[order[k]];
  return n;
}

static bool tpu_tref_dense(const tpu_tref *t) { return tpu_dense(t->rank, t->sizes, t->strides); }

void tpu_contiguous_strides(int rank, const int64_t *sizes, int channels_last, int64_t *strides) {
  int order[TPU_MAX_RANK];
  for (int i = 0; i < rank; i++) order[i] = i;
  if (channels_last > 1 && rank == channels_last) { /* (0, 2, 3, 1) or (0, 2, 3, 4, 1): the channels innermost */
    for (int i = 1; i < rank - 1; i++) order[i] = i + 1;
    order[rank - 1] = 1;
  }
  int64_t acc = 1;
  for (int k = rank - 1; k >= 0; k--) {
    strides[order[k]] = acc;
    acc *= sizes[order[k]] > 1 ? sizes[order[k]] : 1;
  }
}

int tpu_stride_order_desc(int rank, const int64_t *strides, int *order) {
  bool plain = true;
  for (int i = 0; i < rank; i++) {
    int j = i;
    while (j > 0 && strides[order[j - 1]] < strides[i]) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = i;
    plain = plain && j == i;
  }
  return plain ? 0 : rank;
}

int64_t tpu_span_bytes(int rank, const int64_t *sizes, const int64_t *strides, int64_t itemsize) {
  int64_t last = 0;
  for (int i = 0; i < rank; i++) last += (sizes[i] - 1) * strides[i];
  return itemsize * (1 + last);
}

bool tpu_tref_internal_overlap(const tpu_tref *t) {
  if (t->host || t->zero_size) return false;
  for (int i = 0; i < t->rank; i++)
    if (t->sizes[i] > 1 && t->strides[i] == 0) return true;
  return false;
}

int tpu_tref_overlap(const tpu_tref *a, const tpu_tref *b) {
  if (!a->rec || a->rec != b->rec || a->host || b->host || a->zero_size || b->zero_size) return TPU_OVERLAP_NO;
  int64_t na = tpu_tref_numel(a), nb = tpu_tref_numel(b);
  if (na == 0 || nb == 0 || !tpu_tref_dense(a) || !tpu_tref_dense(b)) return TPU_OVERLAP_NO;
  int64_t sa = (int64_t)tpu_dtype_size(a->dtype), sb = (int64_t)tpu_dtype_size(b->dtype);
  int64_t a0 = a->offset * sa, a1 = a0 + na * sa, b0 = b->offset * sb, b1 = b0 + nb * sb;
  if (a0 == b0 && a1 == b1) {
    bool same = a->rank == b->rank && !memcmp(a->strides, b->strides, sizeof(int64_t) * (size_t)a->rank);
    return same ? TPU_OVERLAP_FULL : TPU_OVERLAP_PARTIAL;
  }
  return a0 < b1 && b0 < a1 ? TPU_OVERLAP_PARTIAL : TPU_OVERLAP_NO;
}

tpu_status *tpu_broadcast_check(int rank, const int64_t *dims, int vrank, const int64_t *vdims) {
  int br = vrank > rank ? vrank : rank;
  int64_t b[TPU_MAX_RANK];
  bool grows = vrank > rank;
  for (int i = 0; i < br; i++) {
    int ia = i - (br - rank), ib = i - (br - vrank);
    int64_t a = ia >= 0 ? dims[ia] : 1, v = ib >= 0 ? vdims[ib] : 1;
    if (a == v || v == 1) {
      b[i] = a;
    } else if (a == 1) {
      b[i] = v;
      grows = true;
    } else {
      return tpu_status_new(TPU_ERR_RUNTIME,
                            "The size of tensor a (%lld) must match the size of tensor b (%lld) at non-singleton "
                            "dimension %d",
                            (long long)a, (long long)v, i);
    }
  }
  if (!grows) return NULL;
  char want[640], got[640];
  size_t nw = 0, ng = 0;
  want[0] = got[0] = 0;
  for (int i = 0; i < rank && nw < sizeof want - 32; i++)
    nw += (size_t)snprintf(want + nw, sizeof want - nw, "%s%lld", i ? ", " : "", (long long)dims[i]);
  for (int i = 0; i < br && ng < sizeof got - 32; i++)
    ng += (size_t)snprintf(got + ng, sizeof got - ng, "%s%lld", i ? ", " : "", (long long)b[i]);
  return tpu_status_new(TPU_ERR_RUNTIME, "output with shape [%s] doesn't match the broadcast shape [%s]", want, got);
}

/* ---- per-call argument checks ------------------------------------------- */

/* c10's names of the C++ types in "value cannot be converted to type ..." */
static const char *tpu_cxx_type_name(tpu_dtype dt) {
  switch (dt) {
    case TPU_S8: return "int8_t";
    case TPU_S16: return "int16_t";
    case TPU_S32: return "int";
    case TPU_S64: return "int64_t";
    case TPU_U8: return "uint8_t";
    case TPU_U16: return "uint16_t";
    case TPU_U32: return "uint32_t";
    case TPU_U64: return "uint64_t";
    case TPU_F16: return "c10::Half";
    case TPU_BF16: return "c10::BFloat16";
    case TPU_F32: return "float";
    case TPU_F64: return "double";
    case TPU_C64: return "c10::complex<float>";
    case TPU_C128: return "c10::complex<double>";
    default: return "bool";
  }
}

void tpu_dtype_bounds(tpu_dtype dt, double *lo_out, double *hi_out) {
  double lo = 0, hi = 0;
  switch (dt) {
    case TPU_S8: lo = -128, hi = 127; break;
    case TPU_S16: lo = -32768, hi = 32767; break;
    case TPU_S32: lo = -2147483648.0, hi = 2147483647.0; break;
    case TPU_S64: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;
    case TPU_U8: hi = 255; break;
    case TPU_U16: hi = 65535; break;
    case TPU_U32: hi = 4294967295.0; break;
    case TPU_U64: hi = 18446744073709551615.0; break;
    case TPU_F16: hi = 65504; break;
    case TPU_BF16: hi = 3.3895313892515355e38; break;
    case TPU_F32:
    case TPU_C64: hi = 3.4028234663852886e38; break;
    default: hi = INFINITY; break;
  }
  if (tpu_dtype_is_float(dt) || tpu_dtype_is_complex(dt)) lo = -hi;
  *lo_out = lo;
  *hi_out = hi;
}

tpu_status *tpu_scalar_check(const tpu_arg *a, tpu_dtype dt) {
  if (a->kind != TPU_ARG_SCALAR || a->skind == TPU_SCALAR_BOOL || dt == TPU_PRED) return NULL;
  bool over = false;
  double lo, hi;
  tpu_dtype_bounds(dt, &lo, &hi);
  if (a->skind == TPU_SCALAR_COMPLEX && !tpu_dtype_is_complex(dt) && a->f_imag != 0) over = true;
  if (a->skind == TPU_SCALAR_INT) {
    if (tpu_dtype_is_unsigned_int(dt)) /* c10 lets a negative wrap when its magnitude fits */
      over = (double)a->i > hi || (a->i < 0 && -(double)a->i > hi);
    else if (dt == TPU_S64 || dt == TPU_U64)
      over = false;
    else
      over = (double)a->i < lo || (double)a->i > hi;
  } else if (!over) {
    double f = a->f;
    if (tpu_dtype_is_int(dt))
      over = f != f || f < lo || f > hi || (dt == TPU_S64 && f >= 9223372036854775808.0);
    else
      over = !isinf(f) && f == f && (f < lo || f > hi);
  }
  if (!over) return NULL;
  return tpu_status_new(TPU_ERR_RUNTIME, "value cannot be converted to type %s without overflow",
                        tpu_cxx_type_name(dt));
}

static double tpu_scalar_value(const tpu_arg *args, int nargs, int i, double dflt) {
  if (i >= nargs) return dflt;
  if (args[i].kind == TPU_ARG_FLOAT) return args[i].f;
  if (args[i].kind == TPU_ARG_INT) return (double)args[i].i;
  if (args[i].kind != TPU_ARG_SCALAR) return dflt;
  return args[i].skind == TPU_SCALAR_INT ? (double)args[i].i : args[i].f;
}

tpu_status *tpu_check_args(const char *op, const tpu_arg *args, int nargs) {
  if (strcmp(op, "uniform_") == 0) {
    double from = tpu_scalar_value(args, nargs, 1, 0), to = tpu_scalar_value(args, nargs, 2, 1);
    if (from > to)
      return tpu_status_new(TPU_ERR_RUNTIME, "uniform_ expects to return a [from, to) range, but found from=%g > to=%g",
                            from, to);
  } else if (strcmp(op, "cauchy_") == 0) {
    double sigma = tpu_scalar_value(args, nargs, 2, 1);
    if (!(sigma > 0)) return tpu_status_new(TPU_ERR_RUNTIME, "cauchy_ expects sigma > 0.0, but found sigma=%g", sigma);
  }
  return NULL;
}

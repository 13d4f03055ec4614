/* emit_fft.c: torch's FFT primitives (_fft_r2c, _fft_c2c, _fft_c2r) as
 * stablehlo.fft. An n-dimensional transform is a sequence of 1-D ones, each
 * on one dim moved to the end (XLA transforms the innermost dims). XLA's
 * inverse transforms scale by 1/n; torch's primitives take the scaling as an
 * argument (0: none, 1: 1/sqrt(n), 2: 1/n), so the inverse scaling is undone
 * and torch's applied once at the end. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emit.h"

static tpu_dtype tpu_complex_of(tpu_dtype dt) { return dt == TPU_F64 || dt == TPU_C128 ? TPU_C128 : TPU_C64; }
static tpu_dtype tpu_real_of_c(tpu_dtype dt) { return dt == TPU_C128 || dt == TPU_F64 ? TPU_F64 : TPU_F32; }

/* Permutation moving dim d of a rank-r tensor to the end, and back. */
static tpu_hv tpu_move_last(tpu_lower *L, tpu_hv x, int64_t d, bool back) {
  int r = T(L, x)->rank;
  if (d == r - 1) return x;
  int64_t p[TPU_MAX_RANK], k = 0;
  if (!back) {
    for (int i = 0; i < r; i++)
      if (i != d) p[k++] = i;
    p[k] = d;
  } else {
    for (int i = 0; i < r; i++) p[i] = i < d ? i : i == d ? r - 1 : i - 1;
  }
  return tpu_hlo_transpose(H, x, p);
}

/* One 1-D transform along dim d: type FFT, IFFT, RFFT or IRFFT; n is the
 * signal length (the output length for IRFFT). */
static tpu_hv tpu_fft1(tpu_lower *L, tpu_hv x, int64_t d, const char *type, int64_t n) {
  x = tpu_move_last(L, x, d, false);
  tpu_hlo_type t = *T(L, x);
  if (strcmp(type, "RFFT") == 0) {
    t.dtype = tpu_complex_of(t.dtype);
    t.dims[t.rank - 1] = n / 2 + 1;
  } else if (strcmp(type, "IRFFT") == 0) {
    t.dtype = tpu_real_of_c(t.dtype);
    t.dims[t.rank - 1] = n;
  }
  char attrs[96];
  snprintf(attrs, sizeof attrs, "fft_type = #stablehlo<fft_type %s>, fft_length = array<i64: %lld>", type, (long long)n);
  tpu_hv y = tpu_hlo_emit1(H, "stablehlo.fft", &x, 1, attrs, t);
  return tpu_move_last(L, y, d, true);
}

static tpu_hv tpu_fft_scale(tpu_lower *L, tpu_hv y, int64_t norm, double n, bool undo_xla_inverse) {
  double s = undo_xla_inverse ? n : 1.0;
  if (norm == 1) s /= sqrt(n);
  else if (norm == 2) s /= n;
  if (s == 1.0) return y;
  tpu_dtype rt = tpu_real_of_c(T(L, y)->dtype);
  tpu_hv k = tpu_hlo_constant(H, rt, s);
  if (tpu_dtype_is_complex(T(L, y)->dtype)) k = tpu_hlo_binary(H, TPU_HLO_COMPLEX, k, tpu_hlo_constant(H, rt, 0));
  const tpu_hlo_type *t = T(L, y);
  return tpu_mul(L, y, tpu_lower_broadcast_to(L, k, t->rank, t->dims));
}

static int tpu_fft_dims(tpu_lower *L, int arg, int rank, int64_t *dims) {
  int n = L->args[arg].nints;
  for (int i = 0; i < n; i++) dims[i] = tpu_lower_dim(L, L->args[arg].ints[i], rank);
  return n;
}

/* _fft_r2c(self, dim, normalization, onesided) */
void tpu_emit_fft_r2c(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype rt = t->dtype == TPU_F64 ? TPU_F64 : TPU_F32;
  tpu_hv x = tpu_lower_input(L, 0, rt);
  int64_t dims[TPU_MAX_RANK];
  int nd = tpu_fft_dims(L, 1, t->rank, dims);
  if (nd == 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "_fft_r2c: no dims to transform");
    return;
  }
  double n = 1;
  for (int i = 0; i < nd; i++) n *= (double)t->sizes[dims[i]];
  tpu_hv y;
  if (tpu_arg_bool(L, 3)) { /* onesided: halve the last listed dim */
    y = tpu_fft1(L, x, dims[nd - 1], "RFFT", t->sizes[dims[nd - 1]]);
    for (int i = 0; i < nd - 1; i++) y = tpu_fft1(L, y, dims[i], "FFT", t->sizes[dims[i]]);
  } else {
    y = tpu_hlo_binary(H, TPU_HLO_COMPLEX, x, tpu_k(L, x, 0));
    for (int i = 0; i < nd; i++) y = tpu_fft1(L, y, dims[i], "FFT", t->sizes[dims[i]]);
  }
  tpu_lower_out(L, tpu_fft_scale(L, y, L->args[2].i, n, false));
}

/* _fft_c2c(self, dim, normalization, forward) */
void tpu_emit_fft_c2c(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_dtype_is_complex(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "_fft_c2c: expected a complex tensor, got %s", tpu_dtype_name(t->dtype));
    return;
  }
  tpu_hv y = tpu_lower_tensor(L, 0, -1);
  int64_t dims[TPU_MAX_RANK];
  int nd = tpu_fft_dims(L, 1, t->rank, dims);
  bool fwd = tpu_arg_bool(L, 3);
  double n = 1;
  for (int i = 0; i < nd; i++) {
    n *= (double)t->sizes[dims[i]];
    y = tpu_fft1(L, y, dims[i], fwd ? "FFT" : "IFFT", t->sizes[dims[i]]);
  }
  tpu_lower_out(L, tpu_fft_scale(L, y, L->args[2].i, n, !fwd));
}

/* _fft_c2r(self, dim, normalization, last_dim_size) */
void tpu_emit_fft_c2r(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_dtype_is_complex(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "_fft_c2r: expected a complex tensor, got %s", tpu_dtype_name(t->dtype));
    return;
  }
  tpu_hv y = tpu_lower_tensor(L, 0, -1);
  int64_t dims[TPU_MAX_RANK];
  int nd = tpu_fft_dims(L, 1, t->rank, dims);
  int64_t last = L->args[3].i;
  double n = (double)last;
  for (int i = 0; i < nd - 1; i++) {
    n *= (double)t->sizes[dims[i]];
    y = tpu_fft1(L, y, dims[i], "IFFT", t->sizes[dims[i]]);
  }
  /* IRFFT reads last/2 + 1 inputs along the last dim */
  int64_t d = dims[nd - 1], need = last / 2 + 1;
  const tpu_hlo_type yt = *T(L, y);
  if (yt.dims[d] != need) {
    int64_t s[TPU_MAX_RANK] = {0}, lim[TPU_MAX_RANK], st[TPU_MAX_RANK], lo[TPU_MAX_RANK] = {0}, hi[TPU_MAX_RANK] = {0},
            in[TPU_MAX_RANK] = {0};
    for (int i = 0; i < yt.rank; i++) {
      lim[i] = yt.dims[i];
      st[i] = 1;
    }
    if (yt.dims[d] > need) {
      lim[d] = need;
      y = tpu_hlo_slice(H, y, s, lim, st);
    } else {
      hi[d] = need - yt.dims[d];
      tpu_dtype rt = tpu_real_of_c(yt.dtype);
      tpu_hv z = tpu_hlo_binary(H, TPU_HLO_COMPLEX, tpu_hlo_constant(H, rt, 0), tpu_hlo_constant(H, rt, 0));
      y = tpu_hlo_pad(H, y, z, lo, hi, in);
    }
  }
  y = tpu_fft1(L, y, d, "IRFFT", last);
  tpu_lower_out(L, tpu_fft_scale(L, y, L->args[2].i, n, true));
}

/* emit_fft.c: the discrete Fourier transforms torch.fft builds on (_fft_c2c,
 * _fft_r2c, _fft_c2r).
 *
 * stablehlo.fft transforms the trailing 1-3 dims, so the transformed dims
 * are moved last (in the order given) and back afterwards. A real-to-complex
 * transform is an RFFT over the last listed dim, then complex FFTs over the
 * others; complex-to-real is the reverse. XLA's inverse transforms divide by
 * n; torch's normalization (0 none, 1 1/sqrt(n), 2 1/n) is applied on top of
 * the unnormalized result. */
#include <math.h>
#include <stdio.h>

#include "emit.h"

enum { FFT_FWD, FFT_INV, FFT_R2C, FFT_C2R };

/* x with its dims dims[0..n) moved to the end; perm receives the permutation. */
static tpu_hv tpu_fft_move_last(tpu_lower *L, tpu_hv x, const int64_t *dims, int n, int64_t *perm) {
  const tpu_hlo_type *t = T(L, x);
  bool used[TPU_MAX_RANK] = {0};
  int k = 0;
  for (int i = 0; i < n; i++) used[dims[i]] = true;
  for (int i = 0; i < t->rank; i++)
    if (!used[i]) perm[k++] = i;
  for (int i = 0; i < n; i++) perm[k++] = dims[i];
  return tpu_hlo_transpose(H, x, perm);
}

static tpu_hv tpu_fft_restore(tpu_lower *L, tpu_hv x, const int64_t *perm) {
  const tpu_hlo_type *t = T(L, x);
  int64_t inv[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) inv[perm[i]] = i;
  return tpu_hlo_transpose(H, x, inv);
}

/* One stablehlo.fft over the trailing n (1..3) dims with the given lengths. */
static tpu_hv tpu_fft_op(tpu_lower *L, tpu_hv x, int kind, int n, const int64_t *len) {
  static const char *names[] = {"FFT", "IFFT", "RFFT", "IRFFT"};
  const tpu_hlo_type *t = T(L, x);
  tpu_hlo_type rt = *t;
  tpu_dtype real = (t->dtype == TPU_C128 || t->dtype == TPU_F64) ? TPU_F64 : TPU_F32;
  tpu_dtype cplx = real == TPU_F64 ? TPU_C128 : TPU_C64;
  if (kind == FFT_R2C) {
    rt.dtype = cplx;
    rt.dims[rt.rank - 1] = len[n - 1] / 2 + 1;
  } else if (kind == FFT_C2R) {
    rt.dtype = real;
    rt.dims[rt.rank - 1] = len[n - 1];
  }
  char attrs[160];
  int o = snprintf(attrs, sizeof attrs, "fft_type = #stablehlo<fft_type %s>, fft_length = array<i64: ", names[kind]);
  for (int i = 0; i < n; i++)
    o += snprintf(attrs + o, sizeof attrs - (size_t)o, "%s%lld", i ? ", " : "", (long long)len[i]);
  snprintf(attrs + o, sizeof attrs - (size_t)o, ">");
  return tpu_hlo_emit1(H, "stablehlo.fft", &x, 1, attrs, rt);
}

/* Complex FFTs (forward or unnormalized inverse) over the trailing n dims, in groups of at most 3. */
static tpu_hv tpu_fft_c2c_trailing(tpu_lower *L, tpu_hv x, int n, bool forward) {
  int done = 0;
  while (done < n) {
    int k = n - done > 3 ? 3 : n - done;
    const tpu_hlo_type t = *T(L, x);
    /* the group occupies dims [rank - n + done, +k): rotate it to the end */
    int64_t perm[TPU_MAX_RANK], p = 0, first = t.rank - n + done;
    for (int i = 0; i < t.rank; i++)
      if (i < first || i >= first + k) perm[p++] = i;
    for (int i = 0; i < k; i++) perm[p++] = first + i;
    tpu_hv y = tpu_hlo_transpose(H, x, perm);
    int64_t len[3], m = 1;
    for (int i = 0; i < k; i++) {
      len[i] = t.dims[first + i];
      m *= len[i];
    }
    y = tpu_fft_op(L, y, forward ? FFT_FWD : FFT_INV, k, len);
    if (!forward) y = tpu_mul(L, y, tpu_k(L, y, (double)m)); /* undo XLA's 1/n */
    int64_t inv[TPU_MAX_RANK];
    for (int i = 0; i < t.rank; i++) inv[perm[i]] = i;
    x = tpu_hlo_transpose(H, y, inv);
    done += k;
  }
  return x;
}

static tpu_hv tpu_fft_normalize(tpu_lower *L, tpu_hv x, int64_t mode, double n) {
  if (mode == 1) return tpu_mul(L, x, tpu_k(L, x, 1.0 / sqrt(n)));
  if (mode == 2) return tpu_mul(L, x, tpu_k(L, x, 1.0 / n));
  return x;
}

/* dims of arg 1, wrapped; false on an error */
static int tpu_fft_dims(tpu_lower *L, int rank, int64_t *dims) {
  tpu_arg *a = &L->args[1];
  int n = a->nints;
  if (n < 1 || n > rank) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "fft: invalid number of dims (%d) for a tensor of rank %d", n, rank);
    return 0;
  }
  bool seen[TPU_MAX_RANK] = {0};
  for (int i = 0; i < n; i++) {
    dims[i] = tpu_lower_dim(L, a->ints[i], rank);
    if (!tpu_hlo_ok(H)) return 0;
    if (seen[dims[i]]) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "dims must be unique");
      return 0;
    }
    seen[dims[i]] = true;
  }
  return n;
}

/* _fft_c2c(self, dim, normalization, forward) */
void tpu_emit_fft_c2c(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_dtype_is_complex(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "_fft_c2c expects a complex input tensor, but got %s", tpu_dtype_name(t->dtype));
    return;
  }
  int64_t dims[TPU_MAX_RANK], perm[TPU_MAX_RANK];
  int n = tpu_fft_dims(L, t->rank, dims);
  if (!n) return;
  double count = 1;
  for (int i = 0; i < n; i++) count *= (double)t->sizes[dims[i]];
  tpu_hv x = tpu_fft_move_last(L, tpu_lower_tensor(L, 0, -1), dims, n, perm);
  x = tpu_fft_c2c_trailing(L, x, n, tpu_arg_bool(L, 3));
  x = tpu_fft_normalize(L, x, L->args[2].i, count);
  tpu_lower_out(L, tpu_fft_restore(L, x, perm));
}

/* _fft_r2c(self, dim, normalization, onesided) */
void tpu_emit_fft_r2c(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (t->dtype != TPU_F32 && t->dtype != TPU_F64) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Unsupported dtype %s", tpu_dtype_name(t->dtype));
    return;
  }
  int64_t dims[TPU_MAX_RANK], perm[TPU_MAX_RANK];
  int n = tpu_fft_dims(L, t->rank, dims);
  if (!n) return;
  double count = 1;
  for (int i = 0; i < n; i++) count *= (double)t->sizes[dims[i]];
  tpu_hv x = tpu_fft_move_last(L, tpu_lower_tensor(L, 0, -1), dims, n, perm);
  if (tpu_arg_bool(L, 3)) {
    int64_t last = t->sizes[dims[n - 1]];
    x = tpu_fft_op(L, x, FFT_R2C, 1, &last);
    /* the other dims: complex FFTs over trailing dims [.., n-1) with the last kept aside */
    if (n > 1) {
      const tpu_hlo_type xt = *T(L, x);
      int64_t rot[TPU_MAX_RANK], p = 0;
      rot[p++] = xt.rank - 1;
      for (int i = 0; i < xt.rank - 1; i++) rot[p++] = i;
      /* move the halved dim to the front, transform, and move it back */
      tpu_hv y = tpu_hlo_transpose(H, x, rot);
      y = tpu_fft_c2c_trailing(L, y, n - 1, true);
      int64_t inv[TPU_MAX_RANK];
      for (int i = 0; i < xt.rank; i++) inv[rot[i]] = i;
      x = tpu_hlo_transpose(H, y, inv);
    }
  } else {
    tpu_dtype c = t->dtype == TPU_F64 ? TPU_C128 : TPU_C64;
    x = tpu_fft_c2c_trailing(L, tpu_hlo_convert(H, x, c), n, true);
  }
  x = tpu_fft_normalize(L, x, L->args[2].i, count);
  tpu_lower_out(L, tpu_fft_restore(L, x, perm));
}

/* _fft_c2r(self, dim, normalization, last_dim_size) */
void tpu_emit_fft_c2r(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_dtype_is_complex(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "_fft_c2r expects a complex input tensor, but got %s", tpu_dtype_name(t->dtype));
    return;
  }
  int64_t dims[TPU_MAX_RANK], perm[TPU_MAX_RANK];
  int n = tpu_fft_dims(L, t->rank, dims);
  if (!n) return;
  int64_t last = L->args[3].i;
  if (last < 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Invalid number of data points (%lld) specified", (long long)last);
    return;
  }
  double count = (double)last;
  for (int i = 0; i < n - 1; i++) count *= (double)t->sizes[dims[i]];
  tpu_hv x = tpu_fft_move_last(L, tpu_lower_tensor(L, 0, -1), dims, n, perm);
  if (n > 1) {
    const tpu_hlo_type xt = *T(L, x);
    int64_t rot[TPU_MAX_RANK], p = 0, inv[TPU_MAX_RANK];
    rot[p++] = xt.rank - 1;
    for (int i = 0; i < xt.rank - 1; i++) rot[p++] = i;
    tpu_hv y = tpu_fft_c2c_trailing(L, tpu_hlo_transpose(H, x, rot), n - 1, false);
    for (int i = 0; i < xt.rank; i++) inv[rot[i]] = i;
    x = tpu_hlo_transpose(H, y, inv);
  }
  /* IRFFT reads last/2 + 1 bins: crop or zero-pad the input to that */
  const tpu_hlo_type xt = *T(L, x);
  int64_t want = last / 2 + 1, have = xt.dims[xt.rank - 1];
  if (have != want) {
    int64_t lo[TPU_MAX_RANK] = {0}, hi[TPU_MAX_RANK] = {0}, in[TPU_MAX_RANK] = {0};
    hi[xt.rank - 1] = want - have;
    x = tpu_hlo_pad(H, x, tpu_hlo_constant(H, xt.dtype, 0), lo, hi, in);
  }
  x = tpu_fft_op(L, x, FFT_C2R, 1, &last);
  x = tpu_mul(L, x, tpu_k(L, x, (double)last)); /* undo XLA's 1/n */
  x = tpu_fft_normalize(L, x, L->args[2].i, count);
  tpu_lower_out(L, tpu_fft_restore(L, x, perm));
}

/* emit_factory.c: tensors made from nothing or from a copy: the core's copies
 * (tpu::copy, tpu::materialize), clone, fills (fill_, zero_) and factories
 * (arange, linspace, logspace, eye). Factories whose values fix the shape
 * (arange's bounds) read them as attributes (TPU_OP_SCALAR_ATTRS rows). */
#include <math.h>

#include "emit.h"

/* tpu::copy(dst, src): dst's view takes src's values, converted to dst's
 * dtype and broadcast to its shape (copy_ semantics). */
void tpu_emit_copy(tpu_lower *L) {
  tpu_lower_write(L, 0, -1, tpu_lower_tensor(L, 1, -1));
  tpu_lower_return_arg(L, 0, -1);
}

/* clone(self, *, memory_format) and tpu::materialize(src): a contiguous copy
 * (of a view). */
void tpu_emit_clone(tpu_lower *L) { tpu_lower_out(L, tpu_lower_tensor(L, 0, -1)); }

/* ---- fills and factories -------------------------------------------------------------------- */

/* fill_.Scalar(self, value), fill_.Tensor(self, value) */
void tpu_emit_fill(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv v = L->args[1].kind == TPU_ARG_SCALAR ? tpu_lower_scalar(L, 1, t->dtype)
                                               : tpu_hlo_reshape(H, tpu_lower_input(L, 1, t->dtype), 0, NULL);
  tpu_lower_write(L, 0, -1, v);
  tpu_lower_return_arg(L, 0, -1);
}

void tpu_emit_zero(tpu_lower *L) {
  tpu_lower_write(L, 0, -1, tpu_lower_full(L, tpu_hlo_type_make(L->args[0].t.dtype, 0, NULL), 0));
  tpu_lower_return_arg(L, 0, -1);
}

/* torch's checks of arange's step (its error of the type zero_code) and of
 * its bounds against the step's sign: false, after the error, when one fails. */
static bool tpu_arange_checks(tpu_lower *L, bool zero_step, bool inconsistent, tpu_code zero_code) {
  if (zero_step)
    tpu_lower_fail(L, zero_code, "step must be nonzero");
  else if (inconsistent)
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "upper bound and larger bound inconsistent with step sign");
  return !zero_step && !inconsistent;
}

/* The values from ia to ib (excluded) by a nonzero integer step ic. */
static int64_t tpu_arange_count(int64_t ia, int64_t ib, int64_t ic) {
  return ic > 0 ? (ib - ia + ic - 1) / ic : (ia - ib + (-ic) - 1) / (-ic);
}

/* ia + j * ic for j in [0, n), in dt. */
static void tpu_arange_ints(tpu_lower *L, int64_t n, int64_t ia, int64_t ic, tpu_dtype dt) {
  tpu_hv io = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 1, &n), 0);
  tpu_hv vc = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, ic), 1, &n, NULL);
  tpu_hv va = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, ia), 1, &n, NULL);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_add(L, tpu_mul(L, io, vc), va), dt));
}

static void tpu_emit_arange_int(tpu_lower *L, double a, double b, double c, tpu_dtype dt) {
  const double lim = 9223372036854775807.0; /* 2^63: a double past it has no int64 */
  if (!(fabs(a) < lim && fabs(b) < lim && fabs(c) < lim)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "unsupported range: %g -> %g", a, b);
    return;
  }
  int64_t ia = (int64_t)a, ib = (int64_t)b, ic = (int64_t)c, n;
  if (dt != TPU_S64 || tpu_lower_compat(TPU_COMPAT_ARANGE_COUNT)) {
    if (!tpu_arange_checks(L, c == 0, (c > 0 && b < a) || (c < 0 && b > a), TPU_ERR_RUNTIME)) return;
    n = (int64_t)ceil((b - a) / c);
  } else {
    if (!tpu_arange_checks(L, ic == 0, (ic > 0 && ib < ia) || (ic < 0 && ib > ia), TPU_ERR_VALUE)) return;
    n = tpu_arange_count(ia, ib, ic);
  }
  tpu_arange_ints(L, n < 0 ? 0 : n, ia, ic, dt);
}

/* arange.start_step(start, end, step=1, *, dtype, layout, device, pin_memory):
 * the values fix the shape, so they are read here, not passed as inputs. */
void tpu_emit_arange(tpu_lower *L) {
  /* arange(end), arange.start(start, end), arange.start_step(start, end, step) */
  int ns = 0;
  while (ns < 3 && ns < L->nargs && L->args[ns].kind == TPU_ARG_SCALAR) ns++;
  tpu_arg zero = {.kind = TPU_ARG_SCALAR, .skind = TPU_SCALAR_INT, .i = 0, .f = 0};
  tpu_arg one = {.kind = TPU_ARG_SCALAR, .skind = TPU_SCALAR_INT, .i = 1, .f = 1};
  tpu_arg *s = ns == 1 ? &zero : &L->args[0], *e = ns == 1 ? &L->args[0] : &L->args[1];
  tpu_arg *st = ns == 3 ? &L->args[2] : &one;
  bool is_float = s->skind == TPU_SCALAR_FLOAT || e->skind == TPU_SCALAR_FLOAT || st->skind == TPU_SCALAR_FLOAT;
  tpu_dtype dt =
      (ns < L->nargs && L->args[ns].kind == TPU_ARG_DTYPE) ? L->args[ns].dtype : (is_float ? TPU_F32 : TPU_S64);
  double a = s->f, b = e->f, c = st->f;
  bool out = (L->flags & TPU_OP_OUT) && L->args[L->nargs - 1].kind == TPU_ARG_TENSOR;
  tpu_dtype rdt = out ? L->args[L->nargs - 1].t.dtype : dt;
  if (is_float && tpu_dtype_is_int(rdt)) {
    /* An integer result of float bounds: torch takes the start and the step
     * as integers (truncated); it counts the values from the float bounds,
     * but for int64 from the truncated ones up to torch 2.13
     * (TPU_COMPAT_ARANGE_COUNT). */
    tpu_emit_arange_int(L, a, b, c, rdt);
    return;
  }
  if (!tpu_arange_checks(L, c == 0, (c > 0 && b < a) || (c < 0 && b > a), TPU_ERR_RUNTIME)) return;
  int64_t n;
  if (is_float) {
    n = (int64_t)ceil((b - a) / c);
  } else {
    n = tpu_arange_count(s->i, e->i, st->i);
  }
  if (n < 0) n = 0;
  tpu_hlo_type it = tpu_hlo_type_make(tpu_dtype_is_float(dt) || is_float ? TPU_F64 : TPU_S64, 1, &n);
  tpu_hv io = tpu_hlo_iota(H, it, 0), r;
  if (it.dtype == TPU_S64) {
    /* integer bounds stay integers: a double holds them only below 2**53 */
    tpu_hv ic = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, st->i), 1, &n, NULL);
    tpu_hv ia = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, s->i), 1, &n, NULL);
    r = tpu_add(L, tpu_mul(L, io, ic), ia);
  } else {
    r = tpu_add(L, tpu_mul(L, io, tpu_lower_full(L, it, c)), tpu_lower_full(L, it, a));
  }
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* x rounded to dt and back (f32 working values of a half type). */
static tpu_hv tpu_round_to(tpu_lower *L, tpu_hv x, tpu_dtype dt) {
  return tpu_hlo_convert(H, tpu_hlo_convert(H, x, dt), T(L, x)->dtype);
}

/* base + step * j (f64 values, j integers below 2^26) as one fused
 * multiply-add rounds it: step splits into halves whose products with j are
 * exact, summed with the rounding error of the first sum kept. */
static tpu_hv tpu_fma_f64(tpu_lower *L, tpu_hv base, double step, tpu_hv j) {
  double c = step * 134217729.0, hi = c - (c - step), lo = step - hi;
  tpu_hv ph = tpu_mul(L, tpu_k(L, j, hi), j), pl = tpu_mul(L, tpu_k(L, j, lo), j);
  tpu_hv sum = tpu_add(L, base, ph), bb = tpu_sub(L, sum, base);
  tpu_hv err = tpu_add(L, tpu_sub(L, base, tpu_sub(L, sum, bb)), tpu_sub(L, ph, bb));
  return tpu_add(L, sum, tpu_add(L, err, pl));
}

/* linspace.out(start, end, steps, *, out) / logspace.out(start, end, steps, base, *, out):
 * as torch's CPU kernel: start and end in the output type (integers
 * truncate), the step in that type (f64 for integers), the first half
 * counting up from start and the second down from end (both ends exact).
 * torch's build contracts start + step * i into one fused multiply-add
 * (emulated: in f64 for f32, split products for f64 and integers); half
 * types round after every operation, as c10::Half arithmetic does. */
static void tpu_emit_space(tpu_lower *L, bool log) {
  const tpu_arg *s = &L->args[0], *e = &L->args[1];
  int64_t n = L->args[2].i;
  if (n < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "number of steps must be non-negative");
    return;
  }
  double base = log ? L->args[3].f : 0;
  tpu_dtype dt = L->args[L->nargs - 1].t.dtype; /* the out tensor's */
  if (tpu_dtype_is_complex(dt)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "%s into a complex tensor is not supported yet",
                   log ? "logspace" : "linspace");
    return;
  }
  bool flt = tpu_dtype_is_float(dt), half = dt == TPU_F16 || dt == TPU_BF16;
  double a = s->skind == TPU_SCALAR_INT ? (double)s->i : s->f, b = e->skind == TPU_SCALAR_INT ? (double)e->i : e->f;
  if (!flt && !log)
    a = trunc(a), b = trunc(b);
  else if (dt == TPU_F32)
    a = (float)a, b = (float)b;
  /* f32 working values for half types (rounded to them after every
   * operation), f64 otherwise */
  tpu_hlo_type t = tpu_hlo_type_make(half ? TPU_F32 : TPU_F64, 1, &n);
  tpu_hv v = tpu_lower_full(L, t, a);
  if (half) v = tpu_round_to(L, v, dt);
  if (n > 1) {
    tpu_hv i = tpu_hlo_iota(H, t, 0), j = tpu_sub(L, tpu_lower_full(L, t, (double)(n - 1)), i);
    tpu_hv first = tpu_hlo_compare(H, TPU_HLO_LT, i, tpu_lower_full(L, t, (double)(n / 2)));
    tpu_hv up, down;
    if (half) {
      tpu_hv ah = v, bh = tpu_round_to(L, tpu_lower_full(L, t, b), dt);
      tpu_hv st = tpu_round_to(L,
                               tpu_hlo_binary(H, TPU_HLO_DIV, tpu_round_to(L, tpu_sub(L, bh, ah), dt),
                                              tpu_round_to(L, tpu_lower_full(L, t, (double)(n - 1)), dt)),
                               dt);
      up = tpu_round_to(L, tpu_add(L, ah, tpu_round_to(L, tpu_mul(L, st, tpu_round_to(L, i, dt)), dt)), dt);
      down = tpu_round_to(L, tpu_sub(L, bh, tpu_round_to(L, tpu_mul(L, st, tpu_round_to(L, j, dt)), dt)), dt);
    } else if (dt == TPU_F32) { /* products of an f32 step and small integers are exact in f64 */
      tpu_hv st = tpu_lower_full(L, t, (double)(((float)b - (float)a) / (float)(n - 1)));
      up = tpu_add(L, v, tpu_mul(L, st, i));
      down = tpu_sub(L, tpu_lower_full(L, t, b), tpu_mul(L, st, j));
    } else {
      double step = (b - a) / (double)(n - 1);
      up = tpu_fma_f64(L, v, step, i);
      down = tpu_fma_f64(L, tpu_lower_full(L, t, b), -step, j);
    }
    v = tpu_hlo_select(H, first, up, down);
  }
  if (dt == TPU_F32) v = tpu_hlo_convert(H, v, TPU_F32);
  if (log) v = tpu_hlo_binary(H, TPU_HLO_POW, tpu_lower_full(L, *T(L, v), base), v);
  tpu_lower_out(L, tpu_hlo_convert(H, v, dt));
}
void tpu_emit_linspace(tpu_lower *L) { tpu_emit_space(L, false); }
void tpu_emit_logspace(tpu_lower *L) { tpu_emit_space(L, true); }

/* eye.out(n, *, out), eye.m_out(n, m, *, out): the identity in out's dtype. */
void tpu_emit_eye_out(tpu_lower *L) {
  int64_t n = L->args[0].i, m = tpu_arg_is(L, 1, TPU_ARG_INT) ? L->args[1].i : n;
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

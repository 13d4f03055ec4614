/* emit_random.c: random numbers on the device generator: the in-place
 * samplers (normal_, uniform_, bernoulli_, exponential_, geometric_,
 * log_normal_, cauchy_, random_), the sampling factories (bernoulli,
 * normal, randperm, multinomial) and the ops that draw as they compute
 * (native_dropout, rrelu_with_noise).
 *
 * All draw from the device generator (tpu_lower_random_bits / _uniform), so
 * a manual_seed makes them reproducible and successive calls differ. Float
 * distribution parameters are attributes; values are computed in f32 (f64
 * for f64 tensors) and written in the tensor's dtype. */
#include <math.h>
#include <string.h>

#include "emit.h"

/* normal_'s standard normal values. tpu_std_normal below computes the same
 * values with its ops in another order: one of them for both would change
 * the programs of normal_ or of the other samplers. */
static tpu_hv tpu_normal_values(tpu_lower *L, tpu_dtype dt, int rank, const int64_t *dims) {
  /* Box-Muller in f32 (f64 for f64 tensors): sqrt(-2 log(1 - u1)) cos(2 pi u2) */
  tpu_dtype w = dt == TPU_F64 ? TPU_F64 : TPU_F32;
  tpu_hv u1 = tpu_lower_uniform(L, w, rank, dims), u2 = tpu_lower_uniform(L, w, rank, dims);
  tpu_hv r = tpu_hlo_unary(
      H, TPU_HLO_SQRT, tpu_mul(L, tpu_k(L, u1, -2), tpu_hlo_unary(H, TPU_HLO_LOG, tpu_sub(L, tpu_k(L, u1, 1), u1))));
  tpu_hv z = tpu_mul(L, r, tpu_hlo_unary(H, TPU_HLO_COS, tpu_mul(L, u2, tpu_k(L, u2, 6.283185307179586))));
  return z;
}

/* The real dtype a complex tensor's parts are drawn in (TPU_F32 for
 * complex64, TPU_F64 for complex128); TPU_PRED when t is not complex. torch
 * samples a complex tensor as view_as_real(self): its real and imaginary
 * parts are two independent draws of the real distribution. */
static tpu_dtype tpu_complex_part(const tpu_tref *t) {
  return t->dtype == TPU_C64 ? TPU_F32 : t->dtype == TPU_C128 ? TPU_F64 : TPU_PRED;
}

/* normal_(self, mean=0, std=1, *, generator); on a complex self each part is
 * a normal of the same mean and std / sqrt(2), as torch draws it. */
void tpu_emit_normal(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype part = tpu_complex_part(t);
  if (part == TPU_PRED && !tpu_need_float(L, 0, "normal_kernel_cpu")) return;
  if (L->args[2].f < 0) tpu_lower_fail(L, TPU_ERR_RUNTIME, "normal expects std >= 0.0, but found std %g", L->args[2].f);
  double mean = L->args[1].f, std = part == TPU_PRED ? L->args[2].f : L->args[2].f / sqrt(2.0);
  tpu_hv v[2];
  for (int k = 0; k < (part == TPU_PRED ? 1 : 2); k++) {
    tpu_hv z = tpu_normal_values(L, part == TPU_PRED ? t->dtype : part, t->rank, t->sizes);
    v[k] = tpu_add(L, tpu_mul(L, z, tpu_k(L, z, std)), tpu_k(L, z, mean));
  }
  tpu_lower_write(L, 0, -1, part == TPU_PRED ? v[0] : tpu_hlo_binary(H, TPU_HLO_COMPLEX, v[0], v[1]));
  tpu_lower_return_arg(L, 0, -1);
}

/* uniform_(self, from=0, to=1, *, generator) */
void tpu_emit_uniform(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype part = tpu_complex_part(t);
  if (part == TPU_PRED && !tpu_need_float(L, 0, "uniform_kernel_cpu")) return;
  tpu_dtype w = t->dtype == TPU_F64 || part == TPU_F64 ? TPU_F64 : TPU_F32;
  double lo = L->args[1].f, hi = L->args[2].f;
  tpu_hv v[2];
  for (int k = 0; k < (part == TPU_PRED ? 1 : 2); k++) {
    tpu_hv u = tpu_lower_uniform(L, w, t->rank, t->sizes);
    v[k] = tpu_add(L, tpu_mul(L, u, tpu_k(L, u, hi - lo)), tpu_k(L, u, lo));
  }
  tpu_lower_write(L, 0, -1, part == TPU_PRED ? v[0] : tpu_hlo_binary(H, TPU_HLO_COMPLEX, v[0], v[1]));
  tpu_lower_return_arg(L, 0, -1);
}

/* bernoulli_.float(self, p=0.5, *, generator) */
void tpu_emit_bernoulli(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv u = tpu_lower_uniform(L, TPU_F32, t->rank, t->sizes);
  tpu_lower_write(L, 0, -1, tpu_hlo_compare(H, TPU_HLO_LT, u, tpu_k(L, u, L->args[1].f)));
  tpu_lower_return_arg(L, 0, -1);
}

/* native_dropout(input, p, train) -> (output, mask) */
void tpu_emit_native_dropout(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double p = L->args[1].f;
  bool train = L->args[2].kind != TPU_ARG_BOOL || L->args[2].i;
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  if (!train || p == 0) {
    tpu_lower_out(L, x);
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(TPU_PRED, t->rank, t->sizes), 1));
    return;
  }
  tpu_hv u = tpu_lower_uniform(L, TPU_F32, t->rank, t->sizes);
  tpu_hv keep = tpu_hlo_compare(H, TPU_HLO_LT, u, tpu_k(L, u, 1.0 - p));
  tpu_hv scale = tpu_k(L, x, p >= 1 ? 0.0 : 1.0 / (1.0 - p));
  tpu_lower_out(L, tpu_hlo_select(H, keep, tpu_mul(L, x, scale), tpu_k(L, x, 0)));
  tpu_lower_out(L, keep);
}

/* native_dropout_backward(grad_output, mask, scale) */
void tpu_emit_native_dropout_backward(tpu_lower *L) {
  tpu_dtype dt = L->args[0].t.dtype;
  tpu_hv g = tpu_lower_tensor(L, 0, -1);
  tpu_hv m = tpu_hlo_convert(H, tpu_lower_input(L, 1, TPU_PRED), dt);
  tpu_lower_out(L, tpu_mul(L, tpu_lower_binary(L, TPU_HLO_MUL, g, m), tpu_k(L, g, L->args[2].f)));
}

static tpu_dtype tpu_rand_work(tpu_dtype dt) { return dt == TPU_F64 ? TPU_F64 : TPU_F32; }

/* Uniform in (0, 1]: 1 - u, never 0 (safe under log). */
static tpu_hv tpu_uniform_open0(tpu_lower *L, tpu_dtype w, int rank, const int64_t *dims) {
  tpu_hv u = tpu_lower_uniform(L, w, rank, dims);
  return tpu_sub(L, tpu_k(L, u, 1), u);
}

/* Standard normal values (Box-Muller on two uniforms). */
static tpu_hv tpu_std_normal(tpu_lower *L, tpu_dtype w, int rank, const int64_t *dims) {
  tpu_hv u1 = tpu_uniform_open0(L, w, rank, dims), u2 = tpu_lower_uniform(L, w, rank, dims);
  tpu_hv r = tpu_hlo_unary(H, TPU_HLO_SQRT, tpu_mul(L, tpu_k(L, u1, -2), tpu_hlo_unary(H, TPU_HLO_LOG, u1)));
  return tpu_mul(L, r, tpu_hlo_unary(H, TPU_HLO_COS, tpu_mul(L, u2, tpu_k(L, u2, 6.283185307179586))));
}

static void tpu_rand_write_self(tpu_lower *L, tpu_hv v) {
  tpu_lower_write(L, 0, -1, v);
  tpu_lower_return_arg(L, 0, -1);
}

/* A value check: every probability in [0, 1] (NaN is not), as bernoulli's. */
static void tpu_check_probability(tpu_lower *L, tpu_hv p) {
  tpu_hv ok = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GE, p, tpu_k(L, p, 0)),
                             tpu_hlo_compare(H, TPU_HLO_LE, p, tpu_k(L, p, 1)));
  tpu_lower_check(L, tpu_hlo_unary(H, TPU_HLO_NOT, ok), TPU_ERR_RUNTIME,
                  "Expected p_in >= 0 && p_in <= 1 to be true, but got false (a probability outside [0, 1])");
}

/* bernoulli_.Tensor(self, p, *, generator): self[i] = u < p[i] (p broadcast) */
void tpu_emit_bernoulli_tensor(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  tpu_hv p = tpu_lower_input(L, 1, TPU_F64);
  tpu_check_probability(L, p);
  p = tpu_lower_broadcast_to(L, p, t->rank, t->sizes);
  tpu_hv u = tpu_hlo_convert(H, tpu_lower_uniform(L, TPU_F32, t->rank, t->sizes), TPU_F64);
  tpu_rand_write_self(L, tpu_hlo_compare(H, TPU_HLO_LT, u, p));
}

/* bernoulli(self, *, generator): a new tensor of draws with probabilities self */
void tpu_emit_bernoulli_self(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_need_float(L, 0, "bernoulli_tensor_cpu_self_")) return;
  tpu_hv p = tpu_lower_input(L, 0, TPU_F64);
  tpu_check_probability(L, p);
  tpu_hv u = tpu_hlo_convert(H, tpu_lower_uniform(L, TPU_F32, t->rank, t->sizes), TPU_F64);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_LT, u, p), t->dtype));
}

/* bernoulli.p(self, p, *, generator): a new tensor like self of draws with probability p */
void tpu_emit_bernoulli_p(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double p = L->args[1].f;
  if (!(p >= 0 && p <= 1)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "bernoulli_ expects p to be in [0, 1], but got p=%g", p);
    return;
  }
  tpu_hv u = tpu_lower_uniform(L, TPU_F32, t->rank, t->sizes);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_compare(H, TPU_HLO_LT, u, tpu_k(L, u, p)), t->dtype));
}

/* normal.Tensor_Tensor(mean, std), normal.Tensor_float(mean, std), normal.float_Tensor(mean, std):
 * mean + std * z over the broadcast shape, in the tensor argument's dtype */
void tpu_emit_normal_tensor(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (L->args[0].kind == TPU_ARG_FLOAT) dt = L->args[1].t.dtype;
  if (L->args[1].kind == TPU_ARG_FLOAT) dt = L->args[0].t.dtype;
  if (L->args[1].kind == TPU_ARG_TENSOR && tpu_dtype_is_complex(L->args[1].t.dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "normal expects standard deviation to be non-complex");
    return;
  }
  /* a complex mean: each part of the noise is a normal of std / sqrt(2), as normal_ draws it */
  bool cx = dt == TPU_C64 || dt == TPU_C128;
  tpu_dtype part = dt == TPU_C64 ? TPU_F32 : dt == TPU_C128 ? TPU_F64 : dt;
  if (!tpu_dtype_is_float(part)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"normal_kernel_cpu\" not implemented for '%s'", tpu_dtype_name(dt));
    return;
  }
  if (L->args[1].kind == TPU_ARG_FLOAT && L->args[1].f < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "normal expects std >= 0.0, but found std %g", L->args[1].f);
    return;
  }
  tpu_dtype w = tpu_rand_work(part);
  tpu_hv v[2];
  for (int i = 0; i < 2; i++) {
    tpu_dtype as = cx && i == 0 ? dt : w;
    v[i] = L->args[i].kind == TPU_ARG_FLOAT ? tpu_hlo_constant(H, as, L->args[i].f) : tpu_lower_input(L, i, as);
  }
  tpu_lower_broadcast_all(L, v, 2);
  const tpu_hlo_type st = *T(L, v[1]);
  tpu_hv noise = tpu_mul(L, v[1], tpu_std_normal(L, w, st.rank, st.dims));
  if (cx) {
    tpu_hv im = tpu_mul(L, v[1], tpu_std_normal(L, w, st.rank, st.dims));
    tpu_hv r2 = tpu_k(L, noise, 1.0 / sqrt(2.0));
    noise = tpu_hlo_binary(H, TPU_HLO_COMPLEX, tpu_mul(L, noise, r2), tpu_mul(L, im, r2));
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_add(L, v[0], noise), dt));
}

/* exponential_(self, lambd=1): -log(1 - u) / lambd */
void tpu_emit_exponential(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double lambd = L->args[1].f;
  if (!tpu_need_float(L, 0, "exponential_cpu")) return;
  if (!(lambd > 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "exponential_ expects lambda > 0.0, but found lambda=%g", lambd);
    return;
  }
  tpu_hv u = tpu_uniform_open0(L, tpu_rand_work(t->dtype), t->rank, t->sizes);
  tpu_hv r = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_hlo_unary(H, TPU_HLO_NEG, tpu_hlo_unary(H, TPU_HLO_LOG, u)),
                            tpu_k(L, u, lambd));
  tpu_rand_write_self(L, r);
}

/* geometric_(self, p): ceil(log(u) / log(1 - p)), u in (0, 1]; at least 1 */
void tpu_emit_geometric(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double p = L->args[1].f;
  if (!(p > 0 && p < 1)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "geometric_ expects p to be in (0, 1), but got p=%g", p);
    return;
  }
  tpu_dtype w = tpu_rand_work(t->dtype);
  tpu_hv u = tpu_uniform_open0(L, w, t->rank, t->sizes);
  tpu_hv r = tpu_hlo_unary(H, TPU_HLO_CEIL,
                           tpu_hlo_binary(H, TPU_HLO_DIV, tpu_hlo_unary(H, TPU_HLO_LOG, u), tpu_k(L, u, log1p(-p))));
  tpu_rand_write_self(L, tpu_hlo_binary(H, TPU_HLO_MAX, r, tpu_k(L, r, 1)));
}

/* log_normal_(self, mean=1, std=2): exp(mean + std z) */
void tpu_emit_log_normal(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  double mean = L->args[1].f, sd = L->args[2].f;
  if (!tpu_need_float(L, 0, "log_normal_cpu")) return;
  if (!(sd > 0)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "log_normal_ expects std > 0.0, but found std=%g", sd);
    return;
  }
  tpu_hv z = tpu_std_normal(L, tpu_rand_work(t->dtype), t->rank, t->sizes);
  tpu_rand_write_self(L, tpu_hlo_unary(H, TPU_HLO_EXP, tpu_add(L, tpu_mul(L, z, tpu_k(L, z, sd)), tpu_k(L, z, mean))));
}

/* cauchy_(self, median=0, sigma=1): median + sigma tan(pi (u - 1/2)) */
void tpu_emit_cauchy(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_need_float(L, 0, "cauchy_cpu")) return;
  tpu_hv u = tpu_lower_uniform(L, tpu_rand_work(t->dtype), t->rank, t->sizes);
  tpu_hv a = tpu_mul(L, tpu_sub(L, u, tpu_k(L, u, 0.5)), tpu_k(L, u, 3.141592653589793));
  tpu_hv r = tpu_hlo_binary(H, TPU_HLO_DIV, tpu_hlo_unary(H, TPU_HLO_SIN, a), tpu_hlo_unary(H, TPU_HLO_COS, a));
  tpu_rand_write_self(L, tpu_add(L, tpu_mul(L, r, tpu_k(L, r, L->args[2].f)), tpu_k(L, r, L->args[1].f)));
}

/* Integers lo + (bits mod range) as s64, for 0 < range <= 2^63 (a power
 * of two takes the low bits; larger ranges draw two words). */
static tpu_hv tpu_random_ints(tpu_lower *L, int rank, const int64_t *dims, int64_t lo, uint64_t range) {
  tpu_hlo_type ut = tpu_hlo_type_make(TPU_U64, rank, dims);
  tpu_hv b = tpu_hlo_convert(H, tpu_lower_random_bits(L, rank, dims), TPU_U64);
  if (range > ((uint64_t)1 << 32)) {
    tpu_hv hi = tpu_hlo_convert(H, tpu_lower_random_bits(L, rank, dims), TPU_U64);
    tpu_hv sh = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_U64, 32), rank, dims, NULL);
    b = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_binary(H, TPU_HLO_SHL, hi, sh), b);
  }
  (void)ut;
  tpu_hv r;
  if ((range & (range - 1)) == 0) {
    tpu_hv m = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_U64, (int64_t)(range - 1)), rank, dims, NULL);
    r = tpu_hlo_binary(H, TPU_HLO_AND, b, m);
  } else {
    tpu_hv m = tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_U64, (int64_t)range), rank, dims, NULL);
    r = tpu_hlo_binary(H, TPU_HLO_REM, b, m);
  }
  r = tpu_hlo_convert(H, r, TPU_S64);
  if (lo == 0) return r;
  return tpu_add(L, r, tpu_hlo_broadcast_in_dim(H, tpu_hlo_constant_int(H, TPU_S64, lo), rank, dims, NULL));
}

/* The largest value random_() draws for dt (inclusive): 2^digits for
 * floats, the type's max for integers. */
static int64_t tpu_random_max(tpu_dtype dt) {
  return tpu_dtype_is_float(dt) ? (int64_t)1 << tpu_dtype_float_digits(dt) : tpu_dtype_int_max(dt);
}

/* random_(self), random_.to(self, to), random_.from(self, from, to=None) */
void tpu_emit_random(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t lo = 0, hi; /* [lo, hi) or [lo, max] when open */
  bool inclusive = false;
  bool from = strstr(L->opname, ".from") != NULL, to = strstr(L->opname, ".to") != NULL;
  if (from) {
    lo = L->args[1].i;
    if (L->args[2].kind == TPU_ARG_INT) {
      hi = L->args[2].i;
    } else {
      hi = tpu_random_max(t->dtype);
      inclusive = true;
    }
  } else if (to) {
    hi = L->args[1].i;
  } else {
    hi = tpu_random_max(t->dtype);
    inclusive = true;
  }
  if (!inclusive && lo >= hi) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                   (long long)lo, (long long)hi);
    return;
  }
  if (inclusive && lo > hi) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "random_ expects 'from' casted to dtype to be less than or equal to 'to' casted "
                   "to dtype, but got from=%lld > to=%lld",
                   (long long)lo, (long long)hi);
    return;
  }
  uint64_t range = (uint64_t)hi - (uint64_t)lo + (inclusive ? 1 : 0);
  if (range == 0 || range > ((uint64_t)1 << 63)) range = (uint64_t)1 << 63; /* the full int64 span */
  tpu_hv r = tpu_random_ints(L, t->rank, t->sizes, lo, range);
  tpu_rand_write_self(
      L, t->dtype == TPU_PRED ? tpu_hlo_compare(H, TPU_HLO_NE, r, tpu_k(L, r, 0)) : tpu_hlo_convert(H, r, t->dtype));
}

/* Sort keys ascending carrying a second array; returns the carried one. */
static tpu_hv tpu_sort_by_keys(tpu_lower *L, tpu_hv keys, tpu_hv carry, int64_t dim, bool descending) {
  tpu_hlo_type kt = tpu_hlo_type_make(T(L, keys)->dtype, 0, NULL), ct = tpu_hlo_type_make(T(L, carry)->dtype, 0, NULL);
  tpu_hlo_type rs[4] = {kt, kt, ct, ct};
  tpu_hv a[4];
  tpu_hlo_region_begin(H, rs, 4, a);
  tpu_hv lt = tpu_hlo_compare(H, descending ? TPU_HLO_GT : TPU_HLO_LT, a[0], a[1]);
  int region = tpu_hlo_region_end(H, &lt, 1);
  tpu_hv xs[2] = {keys, carry}, outs[2] = {TPU_HV_NONE, TPU_HV_NONE};
  tpu_hlo_sort(H, xs, 2, (int)dim, true, region, outs);
  return outs[1];
}

/* randperm(n, *, dtype), randperm.generator_out(n, *, generator, out):
 * iota sorted by random keys */
void tpu_emit_randperm(tpu_lower *L) {
  int64_t n = L->args[0].i;
  if (n < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "n must be non-negative, got%lld", (long long)n);
    return;
  }
  tpu_dtype dt = TPU_S64;
  for (int i = 1; i < L->nargs; i++)
    if (L->args[i].kind == TPU_ARG_DTYPE) dt = L->args[i].dtype;
  if (L->flags & TPU_OP_OUT) dt = L->args[L->nargs - 1].t.dtype;
  tpu_hv keys = tpu_lower_random_bits(L, 1, &n);
  tpu_hv io = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 1, &n), 0);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_sort_by_keys(L, keys, io, 0, false), dt));
}

/* multinomial(self, num_samples, replacement=False, *, generator):
 * Gumbel keys log p - log(-log u); with replacement each draw is the argmax
 * over its own keys, without it the first num_samples of one sort. */
void tpu_emit_multinomial(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  int64_t S = L->args[1].i;
  bool repl = tpu_arg_bool(L, 2);
  if (t->rank < 1 || t->rank > 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "prob_dist must be 1 or 2 dim");
    return;
  }
  if (!tpu_dtype_is_float(t->dtype)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "multinomial only supports floating-point dtypes for input, got: %s",
                   tpu_dtype_name(t->dtype));
    return;
  }
  if (S <= 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "cannot sample n_sample <= 0 samples");
    return;
  }
  int64_t C = t->sizes[t->rank - 1], N = t->rank == 2 ? t->sizes[0] : 1;
  if (C > (1 << 24)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "number of categories cannot exceed 2^24");
    return;
  }
  if (!repl && S > C) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
    return;
  }
  int64_t nc[2] = {N, C};
  tpu_hv pr = tpu_hlo_reshape(H, tpu_lower_input(L, 0, TPU_F32), 2, nc);
  {
    /* probabilities finite and >= 0, and each row's sum above 0 */
    tpu_hv okv = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_compare(H, TPU_HLO_GE, pr, tpu_k(L, pr, 0)),
                                tpu_hlo_compare(H, TPU_HLO_LT, pr, tpu_k(L, pr, INFINITY)));
    tpu_lower_check(L, tpu_hlo_unary(H, TPU_HLO_NOT, okv), TPU_ERR_RUNTIME,
                    "probability tensor contains either `inf`, `nan` or element < 0");
    int64_t one = 1;
    tpu_hv sum = tpu_hlo_reduce(H, pr, tpu_hlo_constant(H, TPU_F32, 0), &one, 1, TPU_HLO_ADD);
    tpu_lower_check(L, tpu_hlo_compare(H, TPU_HLO_LE, sum, tpu_k(L, sum, 0)), TPU_ERR_RUNTIME,
                    "invalid multinomial distribution (sum of probabilities <= 0)");
  }
  tpu_hv lp = tpu_hlo_unary(H, TPU_HLO_LOG, pr);
  tpu_hv r;
  if (repl) {
    int64_t nsc[3] = {N, S, C};
    tpu_hv u = tpu_uniform_open0(L, TPU_F32, 3, nsc);
    tpu_hv g = tpu_hlo_unary(
        H, TPU_HLO_NEG, tpu_hlo_unary(H, TPU_HLO_LOG, tpu_hlo_unary(H, TPU_HLO_NEG, tpu_hlo_unary(H, TPU_HLO_LOG, u))));
    /* log(1) = 0 for u = 1 gives -log(0) = inf: keep it finite */
    g = tpu_hlo_clamp(H, tpu_hlo_constant(H, TPU_F32, -1e30), g, tpu_hlo_constant(H, TPU_F32, 1e30));
    tpu_hv keys = tpu_add(L, tpu_hlo_broadcast_in_dim(H, lp, 3, nsc, (int64_t[]){0, 2}), g);
    tpu_hv v;
    tpu_arg_extreme(L, keys, 2, true, &v, &r);
  } else {
    tpu_hv u = tpu_uniform_open0(L, TPU_F32, 2, nc);
    tpu_hv g = tpu_hlo_unary(
        H, TPU_HLO_NEG, tpu_hlo_unary(H, TPU_HLO_LOG, tpu_hlo_unary(H, TPU_HLO_NEG, tpu_hlo_unary(H, TPU_HLO_LOG, u))));
    g = tpu_hlo_clamp(H, tpu_hlo_constant(H, TPU_F32, -1e30), g, tpu_hlo_constant(H, TPU_F32, 1e30));
    tpu_hv io = tpu_hlo_iota(H, tpu_hlo_type_make(TPU_S64, 2, nc), 1);
    tpu_hv sorted = tpu_sort_by_keys(L, tpu_add(L, lp, g), io, 1, true);
    r = tpu_hlo_slice(H, sorted, (int64_t[]){0, 0}, (int64_t[]){N, S}, (int64_t[]){1, 1});
  }
  if (t->rank == 1) r = tpu_hlo_reshape(H, r, 1, &S);
  tpu_lower_out(L, r);
}

/* rrelu_with_noise(self, noise, lower, upper, training, generator): in
 * training negative inputs are scaled by a uniform slope in [lower, upper)
 * recorded in noise (1 elsewhere); in eval by the mean slope. */
void tpu_emit_rrelu_with_noise(tpu_lower *L) {
  tpu_tref *t = &L->args[0].t;
  if (!tpu_need_float(L, 0, "rrelu_with_noise_out_cpu")) return;
  tpu_dtype dt = t->dtype, w = tpu_rand_work(dt);
  tpu_hv x = tpu_lower_input(L, 0, w);
  tpu_hv lo = tpu_lower_broadcast_to(L, tpu_lower_scalar(L, 2, w), t->rank, t->sizes);
  tpu_hv hi = tpu_lower_broadcast_to(L, tpu_lower_scalar(L, 3, w), t->rank, t->sizes);
  tpu_hv neg = tpu_hlo_compare(H, TPU_HLO_LT, x, tpu_k(L, x, 0));
  if (tpu_arg_bool(L, 4)) {
    tpu_hv u = tpu_lower_uniform(L, w, t->rank, t->sizes);
    tpu_hv slope = tpu_add(L, lo, tpu_mul(L, u, tpu_sub(L, hi, lo)));
    slope = tpu_hlo_select(H, neg, slope, tpu_k(L, slope, 1));
    tpu_lower_write(L, 1, -1, tpu_hlo_convert(H, slope, L->args[1].t.dtype));
    tpu_lower_out(L, tpu_hlo_convert(H, tpu_mul(L, x, slope), dt));
  } else {
    tpu_hv slope = tpu_mul(L, tpu_add(L, lo, hi), tpu_k(L, lo, 0.5));
    tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_select(H, neg, tpu_mul(L, x, slope), x), dt));
  }
}

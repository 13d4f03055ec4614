/* emit_special.c: special functions (torch.special and friends).
 *
 * Where CHLO has the function (polygamma, zeta, bessel_i1e) XLA's own
 * expansion is used. The rest are built here from a few primitives with
 * textbook methods chosen to stay accurate in f32 without table lookups:
 * convergent power series where all terms are positive (I0, I1), asymptotic
 * expansions for large arguments, continued fractions (erfcx, incomplete
 * gamma), and Newton refinement in log space (ndtri). Series are unrolled to
 * a fixed depth, enough for f32 over the whole range they are selected for.
 * Inputs are promoted to a float type; half types compute in f32 and round
 * once, as torch's CPU kernels do. */
#include <math.h>
#include <string.h>

#include "emit.h"

#define SP_PI 3.14159265358979323846
#define SP_SQRT2 1.41421356237309504880
#define SP_SQRTPI 1.77245385090551602730

/* ---- helpers --------------------------------------------------------------------------- */

static tpu_hv sp_cmpk(tpu_lower *L, tpu_hlo_cmp d, tpu_hv a, double k) { return tpu_cmp(L, d, a, tpu_k(L, a, k)); }
static tpu_hv sp_mulk(tpu_lower *L, tpu_hv x, double k) { return tpu_mul(L, x, tpu_k(L, x, k)); }
static tpu_hv sp_addk(tpu_lower *L, tpu_hv x, double k) { return tpu_add(L, x, tpu_k(L, x, k)); }

/* Binary float op: arguments 0 and 1 promoted together, broadcast, computed
 * in the accumulation type. */
typedef tpu_hv (*sp_bfn)(tpu_lower *L, tpu_hv a, tpu_hv b);

static void sp_binary(tpu_lower *L, sp_bfn f) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_float_type(tpu_lower_result_type(L, idx, 2));
  tpu_dtype acc = tpu_acc_type(dt);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv r = f(L, tpu_hlo_convert(H, v[0], acc), tpu_hlo_convert(H, v[1], acc));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* Polynomial c[0] + c[1] t + ... + c[n-1] t^(n-1) by Horner's rule. */
static tpu_hv sp_poly(tpu_lower *L, tpu_hv t, const double *c, int n) {
  tpu_hv r = tpu_k(L, t, c[n - 1]);
  for (int i = n - 2; i >= 0; i--) r = sp_addk(L, tpu_mul(L, r, t), c[i]);
  return r;
}

/* ---- gamma family ---------------------------------------------------------------------- */

/* digamma with torch's poles: -inf at +0, +inf at -0, NaN at negative
 * integers (CHLO's expansion gives NaN at zero). */
static tpu_hv sp_digamma(tpu_lower *L, tpu_hv x) {
  tpu_hv r = tpu_named_op(L, "chlo.digamma", &x, 1);
  tpu_hv zero = sp_cmpk(L, TPU_HLO_EQ, x, 0);
  tpu_dtype it = tpu_dtype_size(T(L, x)->dtype) == 8 ? TPU_S64 : TPU_S32;
  tpu_hv bits = tpu_hlo_bitcast_convert(H, x, it);
  tpu_hv neg = tpu_cmp(L, TPU_HLO_LT, bits, tpu_k(L, bits, 0));
  tpu_hv pole = tpu_sel(L, neg, tpu_k(L, x, INFINITY), tpu_k(L, x, -INFINITY));
  tpu_hv negint = tpu_and(L, sp_cmpk(L, TPU_HLO_LT, x, 0), tpu_cmp(L, TPU_HLO_EQ, x, tpu_un(L, TPU_HLO_FLOOR, x)));
  r = tpu_sel(L, negint, tpu_k(L, x, NAN), r);
  return tpu_sel(L, zero, pole, r);
}
void tpu_emit_digamma(tpu_lower *L) { tpu_float_unary(L, sp_digamma); }

/* t^e for an integer e >= 1, by squaring */
static tpu_hv sp_ipow(tpu_lower *L, tpu_hv t, int64_t e) {
  tpu_hv r = TPU_HV_NONE, b = t;
  while (e > 0) {
    if (e & 1) r = (r == TPU_HV_NONE) ? b : tpu_mul(L, r, b);
    e >>= 1;
    if (e) b = tpu_mul(L, b, b);
  }
  return r;
}

/* polygamma(n >= 1, x) by CHLO's expansion, which wants x > 0: negative x
 * is first shifted up by m = ceil(-x) (up to 32) with the recurrence
 * psi_n(x) = psi_n(x + 1) - (-1)^n n! / x^(n+1). */
#define SP_PG_SHIFT 32
static tpu_hv sp_polygamma_pos(tpu_lower *L, int64_t n, tpu_hv x) {
  tpu_hv m =
      tpu_hlo_clamp(H, tpu_k(L, x, 0), tpu_un(L, TPU_HLO_CEIL, tpu_un(L, TPU_HLO_NEG, x)), tpu_k(L, x, SP_PG_SHIFT));
  m = tpu_sel(L, tpu_isnan(L, m), tpu_k(L, x, 0), m);
  tpu_hv xs[2] = {tpu_k(L, x, (double)n), tpu_add(L, x, m)};
  tpu_hv r = tpu_named_op(L, "chlo.polygamma", xs, 2);
  double fact = 1.0;
  for (int64_t i = 2; i <= n; i++) fact *= (double)i;
  tpu_hv acc = tpu_k(L, x, 0);
  for (int j = 0; j < SP_PG_SHIFT; j++) {
    tpu_hv t = tpu_div(L, tpu_k(L, x, 1), sp_addk(L, x, j));
    tpu_hv term = sp_ipow(L, t, n + 1);
    acc = tpu_add(L, acc, tpu_sel(L, sp_cmpk(L, TPU_HLO_GT, m, j), term, tpu_k(L, x, 0)));
  }
  return tpu_sub(L, r, sp_mulk(L, acc, (n % 2 ? -1.0 : 1.0) * fact));
}

/* polygamma(n, self): digamma for n == 0, CHLO's zeta-based expansion above */
void tpu_emit_polygamma(tpu_lower *L) {
  int64_t n = L->args[0].i;
  if (n < 0) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "polygamma(n, x) does not support negative n.");
    return;
  }
  tpu_dtype dt = tpu_lower_float_type(tpu_arg_dtype(L, 1));
  tpu_hv x = tpu_hlo_convert(H, tpu_lower_input(L, 1, dt), tpu_acc_type(dt));
  tpu_hv r;
  if (n == 0) {
    r = sp_digamma(L, x);
  } else {
    r = sp_polygamma_pos(L, n, x);
    /* poles (zeta(n + 1, q) at q = 0, -1, ...) are infinite with the sign of
     * (-1)^(n+1) n!, and so is -inf for n >= 2, as in torch */
    double sgn = (n % 2) ? 1.0 : -1.0;
    tpu_hv pole = tpu_and(L, sp_cmpk(L, TPU_HLO_LE, x, 0), tpu_cmp(L, TPU_HLO_EQ, x, tpu_un(L, TPU_HLO_FLOOR, x)));
    if (n == 1) pole = tpu_and(L, pole, sp_cmpk(L, TPU_HLO_NE, x, -INFINITY));
    r = tpu_sel(L, pole, tpu_k(L, x, sgn * INFINITY), r);
    tpu_hv pinf = sp_cmpk(L, TPU_HLO_EQ, x, INFINITY);
    r = tpu_sel(L, pinf, tpu_k(L, x, n == 1 ? 0.0 : NAN), r);
    if (n == 1) r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, -INFINITY), tpu_k(L, x, NAN), r);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* zeta(x, q): Hurwitz zeta, CHLO's expansion */
static tpu_hv sp_zeta(tpu_lower *L, tpu_hv x, tpu_hv q) {
  tpu_hv xs[2] = {x, q};
  tpu_hv r = tpu_named_op(L, "chlo.zeta", xs, 2);
  /* poles at q = 0, -1, ... are +inf for every x > 1, and x = 1 is +inf for
   * every q, as in torch */
  tpu_hv pole = tpu_and(L, sp_cmpk(L, TPU_HLO_LE, q, 0), tpu_cmp(L, TPU_HLO_EQ, q, tpu_un(L, TPU_HLO_FLOOR, q)));
  pole = tpu_and(L, pole, sp_cmpk(L, TPU_HLO_GT, x, 1));
  pole = tpu_or(L, pole, sp_cmpk(L, TPU_HLO_EQ, x, 1));
  r = tpu_sel(L, pole, tpu_k(L, x, INFINITY), r);
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, x, 1), tpu_k(L, x, NAN), r);
}
void tpu_emit_special_zeta(tpu_lower *L) { sp_binary(L, sp_zeta); }

/* ---- elementary compositions ------------------------------------------------------------- */

/* sinc(x) = sin(pi x) / (pi x), 1 at 0 */
static tpu_hv sp_sinc(tpu_lower *L, tpu_hv x) {
  tpu_hv p = sp_mulk(L, x, SP_PI);
  tpu_hv r = tpu_div(L, tpu_un(L, TPU_HLO_SIN, p), p);
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), tpu_k(L, x, 1), r);
}
void tpu_emit_sinc(tpu_lower *L) { tpu_float_unary(L, sp_sinc); }

/* spherical_bessel_j0(x) = sin(x) / x, by its series near 0 */
static tpu_hv sp_sph_j0(tpu_lower *L, tpu_hv x) {
  tpu_hv r = tpu_div(L, tpu_un(L, TPU_HLO_SIN, x), x);
  tpu_hv x2 = tpu_mul(L, x, x);
  static const double c[] = {1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800};
  tpu_hv s = sp_poly(L, x2, c, 6);
  tpu_hv small = sp_cmpk(L, TPU_HLO_LT, tpu_un(L, TPU_HLO_ABS, x), 0.5);
  r = tpu_sel(L, small, s, r);
  /* sin(x)/x -> 0 at infinity */
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, tpu_un(L, TPU_HLO_ABS, x), INFINITY), tpu_k(L, x, 0), r);
}
void tpu_emit_special_spherical_bessel_j0(tpu_lower *L) { tpu_float_unary(L, sp_sph_j0); }

/* entr(x) = -x log x; 0 at 0, -inf below */
static tpu_hv sp_entr(tpu_lower *L, tpu_hv x) {
  tpu_hv r = tpu_mul(L, tpu_un(L, TPU_HLO_NEG, x), tpu_un(L, TPU_HLO_LOG, x));
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), tpu_k(L, x, 0), r);
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, x, 0), tpu_k(L, x, -INFINITY), r);
  return tpu_sel(L, tpu_isnan(L, x), x, r);
}
void tpu_emit_special_entr(tpu_lower *L) { tpu_float_unary(L, sp_entr); }

/* xlog1py(x, y) = x log1p(y), 0 where x == 0 unless y is NaN */
static tpu_hv sp_xlog1py(tpu_lower *L, tpu_hv x, tpu_hv y) {
  tpu_hv r = tpu_mul(L, x, tpu_un(L, TPU_HLO_LOG1P, y));
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), tpu_k(L, x, 0), r);
  return tpu_sel(L, tpu_isnan(L, y), y, r);
}
void tpu_emit_special_xlog1py(tpu_lower *L) { sp_binary(L, sp_xlog1py); }

/* heaviside(x, values): values where x == 0, else x > 0; same dtypes only */
void tpu_emit_heaviside(tpu_lower *L) {
  tpu_dtype a = tpu_arg_dtype(L, 0), b = tpu_arg_dtype(L, 1);
  if (a != b) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "heaviside is not yet implemented for tensors with different dtypes");
    return;
  }
  tpu_hv v[2] = {tpu_lower_tensor(L, 0, -1), tpu_lower_tensor(L, 1, -1)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv x = v[0];
  tpu_hv pos = tpu_hlo_convert(H, tpu_cmp(L, TPU_HLO_GT, x, tpu_k(L, x, 0)), a);
  tpu_lower_out(L, tpu_sel(L, tpu_cmp(L, TPU_HLO_EQ, x, tpu_k(L, x, 0)), v[1], pos));
}

/* ---- modified Bessel functions of the first kind ----------------------------------------- */

/* e^-|x| I_nu(|x|) for nu = 0, 1. Small |x|: the power series
 * sum (x/2)^(2k+nu) / (k! (k+nu)!), all terms positive. Large |x|: the
 * asymptotic expansion 1/sqrt(2 pi x) sum (-1)^k a_k(nu) / x^k with
 * a_k = prod_{j<=k} (4nu^2 - (2j-1)^2) / (k! 8^k). */
#define SP_I_SWITCH 15.0
static tpu_hv sp_ie(tpu_lower *L, tpu_hv x, int nu) {
  tpu_hv ax = tpu_un(L, TPU_HLO_ABS, x);
  /* series, on |x| clamped into its range */
  tpu_hv xs = tpu_hlo_binary(H, TPU_HLO_MIN, ax, tpu_k(L, ax, SP_I_SWITCH));
  tpu_hv h = sp_mulk(L, xs, 0.5), q = tpu_mul(L, h, h);
  /* nested (Horner) form: a running product of terms would overflow
   * before its factorials catch up if the compiler reassociated it */
  tpu_hv sum = tpu_k(L, x, 1);
  for (int k = 40; k >= 1; k--)
    sum = sp_addk(L, tpu_mul(L, sum, sp_mulk(L, q, 1.0 / ((double)k * (double)(k + nu)))), 1.0);
  if (nu) sum = tpu_mul(L, sum, h);
  tpu_hv ser = tpu_mul(L, sum, tpu_un(L, TPU_HLO_EXP, tpu_un(L, TPU_HLO_NEG, xs)));
  /* asymptotic, on |x| clamped from below */
  tpu_hv xl = tpu_hlo_binary(H, TPU_HLO_MAX, ax, tpu_k(L, ax, SP_I_SWITCH));
  tpu_hv inv = tpu_div(L, tpu_k(L, xl, 1), xl);
  double mu = 4.0 * nu * nu, a = 1.0;
  double c[16];
  c[0] = 1.0;
  for (int k = 1; k < 16; k++) {
    double f = 2.0 * k - 1.0;
    a *= -(mu - f * f) / (8.0 * k);
    c[k] = a;
  }
  tpu_hv asy = sp_poly(L, inv, c, 16);
  asy = tpu_mul(L, asy, tpu_un(L, TPU_HLO_RSQRT, sp_mulk(L, xl, 2 * SP_PI)));
  tpu_hv r = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, ax, SP_I_SWITCH), ser, asy);
  if (nu) r = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, x, 0), tpu_un(L, TPU_HLO_NEG, r), r);
  return r;
}

static tpu_hv sp_i0e(tpu_lower *L, tpu_hv x) { return sp_ie(L, x, 0); }
static tpu_hv sp_i1e(tpu_lower *L, tpu_hv x) { return sp_ie(L, x, 1); }
static tpu_hv sp_i0(tpu_lower *L, tpu_hv x) {
  return tpu_mul(L, sp_ie(L, x, 0), tpu_un(L, TPU_HLO_EXP, tpu_un(L, TPU_HLO_ABS, x)));
}
static tpu_hv sp_i1(tpu_lower *L, tpu_hv x) {
  return tpu_mul(L, sp_ie(L, x, 1), tpu_un(L, TPU_HLO_EXP, tpu_un(L, TPU_HLO_ABS, x)));
}
void tpu_emit_i0(tpu_lower *L) { tpu_float_unary(L, sp_i0); }
void tpu_emit_special_i0e(tpu_lower *L) { tpu_float_unary(L, sp_i0e); }
void tpu_emit_special_i1(tpu_lower *L) { tpu_float_unary(L, sp_i1); }
void tpu_emit_special_i1e(tpu_lower *L) { tpu_float_unary(L, sp_i1e); }

/* ---- error-function family ------------------------------------------------------------- */

/* erfcx(x) = exp(x^2) erfc(x). For x < 2 directly (erfc is accurate and
 * exp(x^2) only overflows where the result does); for x >= 2 Laplace's
 * continued fraction 1/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))),
 * evaluated bottom-up. */
static tpu_hv sp_erfcx(tpu_lower *L, tpu_hv x) {
  tpu_hv direct = tpu_mul(L, tpu_un(L, TPU_HLO_EXP, tpu_mul(L, x, x)), tpu_named_op(L, "chlo.erfc", &x, 1));
  tpu_hv xl = tpu_hlo_binary(H, TPU_HLO_MAX, x, tpu_k(L, x, 2.0));
  tpu_hv d = xl;
  for (int k = 60; k >= 1; k--) d = tpu_add(L, xl, tpu_div(L, tpu_k(L, xl, 0.5 * k), d));
  tpu_hv cf = tpu_div(L, tpu_k(L, xl, 1.0 / SP_SQRTPI), d);
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, x, 2.0), direct, cf);
}
void tpu_emit_special_erfcx(tpu_lower *L) { tpu_float_unary(L, sp_erfcx); }

/* log_ndtr(x) = log(Phi(x)): log1p(-erfc(x/sqrt2)/2) above 0, below
 * log(erfcx(-x/sqrt2)/2) - x^2/2, which stays finite far into the tail. */
static tpu_hv sp_log_ndtr(tpu_lower *L, tpu_hv x) {
  tpu_hv t = sp_mulk(L, x, 1.0 / SP_SQRT2);
  tpu_hv up = tpu_un(L, TPU_HLO_LOG1P, sp_mulk(L, tpu_named_op(L, "chlo.erfc", &t, 1), -0.5));
  tpu_hv xn = tpu_hlo_binary(H, TPU_HLO_MIN, x, tpu_k(L, x, 0));
  tpu_hv lo = tpu_un(L, TPU_HLO_LOG, sp_mulk(L, sp_erfcx(L, sp_mulk(L, xn, -1.0 / SP_SQRT2)), 0.5));
  lo = tpu_sub(L, lo, sp_mulk(L, tpu_mul(L, xn, xn), 0.5));
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_GT, x, 0), up, lo);
}
void tpu_emit_special_log_ndtr(tpu_lower *L) { tpu_float_unary(L, sp_log_ndtr); }

/* ndtri(p): the inverse of Phi. Above 1/2, sqrt2 erfinv(2p - 1) (2p - 1 is
 * exact there). Below, by symmetry from a first guess refined with Newton
 * steps on log_ndtr(x) = log p, whose slope sqrt(2/pi) / erfcx(-x/sqrt2)
 * keeps the steps well scaled deep in the tail. */
static tpu_hv sp_ndtri(tpu_lower *L, tpu_hv p) {
  tpu_hv two_p_1 = sp_addk(L, sp_mulk(L, p, 2.0), -1.0);
  tpu_hv central = sp_mulk(L, tpu_named_op(L, "chlo.erf_inv", &two_p_1, 1), SP_SQRT2);
  /* lower half: p clamped into (0, 1/2] */
  tpu_hv pl = tpu_hlo_clamp(H, tpu_k(L, p, 1e-300), p, tpu_k(L, p, 0.5));
  if (T(L, p)->dtype == TPU_F32) pl = tpu_hlo_clamp(H, tpu_k(L, p, 1e-37), p, tpu_k(L, p, 0.5));
  tpu_hv lp = tpu_un(L, TPU_HLO_LOG, pl);
  /* tail guess: x = -sqrt(-2 log p - log(-2 log p) - log(2 pi)) */
  tpu_hv m2l = sp_mulk(L, lp, -2.0);
  tpu_hv g = tpu_sub(L, m2l, tpu_un(L, TPU_HLO_LOG, m2l));
  g = sp_addk(L, g, -log(2 * SP_PI));
  g = tpu_un(L, TPU_HLO_NEG, tpu_un(L, TPU_HLO_SQRT, tpu_hlo_binary(H, TPU_HLO_MAX, g, tpu_k(L, g, 0))));
  tpu_hv pl21 = sp_addk(L, sp_mulk(L, pl, 2.0), -1.0);
  tpu_hv gc = sp_mulk(L, tpu_named_op(L, "chlo.erf_inv", &pl21, 1), SP_SQRT2);
  tpu_hv x = tpu_sel(L, sp_cmpk(L, TPU_HLO_GT, pl, 1e-3), gc, g);
  for (int i = 0; i < 4; i++) {
    tpu_hv f = tpu_sub(L, sp_log_ndtr(L, x), lp);
    tpu_hv slope_inv = sp_mulk(L, sp_erfcx(L, sp_mulk(L, x, -1.0 / SP_SQRT2)), 1.0 / sqrt(2.0 / SP_PI));
    x = tpu_sub(L, x, tpu_mul(L, f, slope_inv));
  }
  tpu_hv r = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, p, 0.5), x, central);
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, p, 0), tpu_k(L, p, -INFINITY), r);
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, p, 1), tpu_k(L, p, INFINITY), r);
  tpu_hv bad = tpu_or(L, sp_cmpk(L, TPU_HLO_LT, p, 0), sp_cmpk(L, TPU_HLO_GT, p, 1));
  return tpu_sel(L, tpu_or(L, bad, tpu_isnan(L, p)), tpu_k(L, p, NAN), r);
}
void tpu_emit_special_ndtri(tpu_lower *L) { tpu_float_unary(L, sp_ndtri); }

/* ---- orthogonal polynomials ------------------------------------------------------------ */

/* p_n(x) for a tensor of degrees n (truncated to integers, as torch casts
 * them). Every family is a three-term recurrence q_k = f(k, x, q_{k-1},
 * q_{k-2}), run by one stablehlo.while up to the largest degree, each element
 * keeping its own result once k passes its n. Closed forms and torch's
 * special cases (n < 0, |x| = 1, large n inside (-1, 1)) are selected after. */
typedef enum {
  SP_CHEB_T,
  SP_CHEB_U,
  SP_CHEB_V,
  SP_CHEB_W,
  SP_HERM_H,
  SP_HERM_HE,
  SP_LAGUERRE,
  SP_LEGENDRE
} sp_poly_kind;

/* q_k from (k, x, q_{k-1} = q, q_{k-2} = p) */
static tpu_hv sp_poly_step(tpu_lower *L, sp_poly_kind kind, tpu_hv k, tpu_hv x, tpu_hv p, tpu_hv q) {
  tpu_hv km1 = sp_addk(L, k, -1);
  switch (kind) {
    case SP_HERM_H: /* 2x q - 2(k-1) p */
      return tpu_sub(L, tpu_mul(L, tpu_add(L, x, x), q), tpu_mul(L, tpu_add(L, km1, km1), p));
    case SP_HERM_HE: /* x q - (k-1) p */ return tpu_sub(L, tpu_mul(L, x, q), tpu_mul(L, km1, p));
    case SP_LAGUERRE: /* ((2(k-1) + 1 - x) q - (k-1) p) / k */
      return tpu_div(
          L, tpu_sub(L, tpu_mul(L, tpu_sub(L, sp_addk(L, tpu_add(L, km1, km1), 1), x), q), tpu_mul(L, km1, p)), k);
    case SP_LEGENDRE: /* ((2(k-1) + 1) x q - (k-1) p) / k */
      return tpu_div(
          L, tpu_sub(L, tpu_mul(L, tpu_mul(L, sp_addk(L, tpu_add(L, km1, km1), 1), x), q), tpu_mul(L, km1, p)), k);
    default: /* Chebyshev: 2x q - p */ return tpu_sub(L, tpu_mul(L, tpu_add(L, x, x), q), p);
  }
}

/* q_1 of each family */
static tpu_hv sp_poly_first(tpu_lower *L, sp_poly_kind kind, tpu_hv x) {
  switch (kind) {
    case SP_CHEB_U:
    case SP_HERM_H: return tpu_add(L, x, x);
    case SP_CHEB_V: return sp_addk(L, tpu_add(L, x, x), -1);
    case SP_CHEB_W: return sp_addk(L, tpu_add(L, x, x), 1);
    case SP_LAGUERRE: return tpu_sub(L, tpu_k(L, x, 1), x);
    default: return x;
  }
}

static tpu_hv sp_poly_run(tpu_lower *L, sp_poly_kind kind, tpu_hv x, tpu_hv n) {
  const tpu_hlo_type *xt = T(L, x);
  tpu_hlo_type st = tpu_hlo_type_make(xt->dtype, 0, NULL);
  int64_t all[TPU_MAX_RANK];
  for (int i = 0; i < xt->rank; i++) all[i] = i;
  tpu_hv nmax = tpu_hlo_reduce(H, n, tpu_hlo_constant(H, xt->dtype, -INFINITY), all, xt->rank, TPU_HLO_MAX);
  tpu_hlo_type types[6] = {st, st, *xt, *xt, *xt, *xt};
  tpu_hv init[6] = {tpu_hlo_constant(H, xt->dtype, 2.0), nmax, x, n, tpu_k(L, x, 1), sp_poly_first(L, kind, x)};
  tpu_hv a[6];
  tpu_hlo_region_begin(H, types, 6, a); /* (k, nmax, x, n, q_{k-2}, q_{k-1}) */
  tpu_hv c = tpu_cmp(L, TPU_HLO_LE, a[0], a[1]);
  int cond = tpu_hlo_region_end(H, &c, 1);
  tpu_hlo_region_begin(H, types, 6, a);
  tpu_hv kb = tpu_lower_broadcast_to(L, a[0], xt->rank, xt->dims);
  tpu_hv r = sp_poly_step(L, kind, kb, a[2], a[4], a[5]);
  tpu_hv live = tpu_cmp(L, TPU_HLO_LE, kb, a[3]);
  tpu_hv next[6] = {sp_addk(L, a[0], 1), a[1], a[2], a[3], tpu_sel(L, live, a[5], a[4]), tpu_sel(L, live, r, a[5])};
  int body = tpu_hlo_region_end(H, next, 6);
  tpu_hv outs[6];
  int regions[2] = {cond, body};
  if (!tpu_hlo_emit(H, "stablehlo.while", init, 6, regions, 2, NULL, types, 6, outs)) return TPU_HV_NONE;
  tpu_hv q = outs[5];
  q = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, n, 0), tpu_k(L, x, 1), q);
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, n, 0), tpu_k(L, x, 0), q);
}

/* (-1)^n as a value: 1 for even n, -1 for odd */
static tpu_hv sp_parity(tpu_lower *L, tpu_hv n) {
  tpu_hv half = sp_mulk(L, n, 0.5);
  tpu_hv even = tpu_cmp(L, TPU_HLO_EQ, half, tpu_un(L, TPU_HLO_FLOOR, half));
  return tpu_sel(L, even, tpu_k(L, n, 1), tpu_k(L, n, -1));
}

static tpu_hv sp_polynomial(tpu_lower *L, sp_poly_kind kind, tpu_hv x, tpu_hv n) {
  tpu_hv r = sp_poly_run(L, kind, x, n);
  tpu_hv one = tpu_k(L, x, 1), ax = tpu_un(L, TPU_HLO_ABS, x), sg = sp_parity(L, n);
  tpu_hv pos = sp_cmpk(L, TPU_HLO_GT, x, 0);
  tpu_hv edge = sp_cmpk(L, TPU_HLO_EQ, ax, 1);
  tpu_hv inside = sp_cmpk(L, TPU_HLO_LT, ax, 1);
  tpu_hv np1 = sp_addk(L, n, 1), n2p1 = sp_addk(L, tpu_add(L, n, n), 1);
  tpu_hv th = tpu_named_op(L, "chlo.acos", &x, 1);
  switch (kind) {
    case SP_CHEB_T: {
      tpu_hv cf = tpu_un(L, TPU_HLO_COS, tpu_mul(L, n, th));
      r = tpu_sel(L, tpu_and(L, inside, sp_cmpk(L, TPU_HLO_GT, n, 6)), cf, r);
      r = tpu_sel(L, edge, tpu_sel(L, pos, one, sg), r);
      break;
    }
    case SP_CHEB_U: {
      tpu_hv s = tpu_un(L, TPU_HLO_SIN, th);
      tpu_hv cf = tpu_div(L, tpu_un(L, TPU_HLO_SIN, tpu_mul(L, np1, th)), s);
      tpu_hv cf0 = tpu_mul(L, tpu_mul(L, np1, tpu_un(L, TPU_HLO_COS, tpu_mul(L, np1, th))), x);
      cf = tpu_sel(L, sp_cmpk(L, TPU_HLO_NE, s, 0), cf, cf0);
      r = tpu_sel(L, tpu_and(L, inside, sp_cmpk(L, TPU_HLO_GT, n, 8)), cf, r);
      r = tpu_sel(L, edge, tpu_sel(L, pos, np1, tpu_mul(L, sg, np1)), r);
      break;
    }
    case SP_CHEB_V: {
      tpu_hv h = sp_mulk(L, th, 0.5);
      tpu_hv cf = tpu_div(L, tpu_un(L, TPU_HLO_COS, tpu_mul(L, sp_addk(L, n, 0.5), th)), tpu_un(L, TPU_HLO_COS, h));
      cf = tpu_sel(L, sp_cmpk(L, TPU_HLO_NE, tpu_un(L, TPU_HLO_SIN, h), 1), cf, tpu_mul(L, sg, n2p1));
      r = tpu_sel(L, tpu_and(L, inside, sp_cmpk(L, TPU_HLO_GT, n, 8)), cf, r);
      r = tpu_sel(L, edge, tpu_sel(L, pos, one, tpu_mul(L, sg, n2p1)), r);
      break;
    }
    case SP_CHEB_W: {
      tpu_hv h = sp_mulk(L, th, 0.5);
      tpu_hv cf = tpu_div(L, tpu_un(L, TPU_HLO_SIN, tpu_mul(L, sp_addk(L, n, 0.5), th)), tpu_un(L, TPU_HLO_SIN, h));
      cf = tpu_sel(L, sp_cmpk(L, TPU_HLO_NE, tpu_un(L, TPU_HLO_COS, h), 1), cf, tpu_sel(L, pos, n2p1, sg));
      r = tpu_sel(L, tpu_and(L, inside, sp_cmpk(L, TPU_HLO_GT, n, 8)), cf, r);
      r = tpu_sel(L, edge, tpu_sel(L, pos, n2p1, sg), r);
      break;
    }
    case SP_LEGENDRE: r = tpu_sel(L, edge, tpu_sel(L, pos, one, sg), r); break;
    case SP_LAGUERRE: r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), one, r); break;
    default: break;
  }
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, n, 0), tpu_k(L, x, 0), r);
}

/* (x, n) promoted to a float type, n truncated, both broadcast */
static void sp_emit_polynomial(tpu_lower *L, sp_poly_kind kind, bool shifted) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_float_type(tpu_lower_result_type(L, idx, 2)), acc = tpu_acc_type(dt);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv x = tpu_hlo_convert(H, v[0], acc), n = tpu_hlo_convert(H, v[1], acc);
  n = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, n, 0), tpu_un(L, TPU_HLO_CEIL, n), tpu_un(L, TPU_HLO_FLOOR, n));
  if (shifted) x = sp_addk(L, tpu_add(L, x, x), -1);
  tpu_lower_out(L, tpu_hlo_convert(H, sp_polynomial(L, kind, x, n), dt));
}

void tpu_emit_special_chebyshev_polynomial_t(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_T, false); }
void tpu_emit_special_chebyshev_polynomial_u(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_U, false); }
void tpu_emit_special_chebyshev_polynomial_v(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_V, false); }
void tpu_emit_special_chebyshev_polynomial_w(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_W, false); }
void tpu_emit_special_shifted_chebyshev_polynomial_t(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_T, true); }
void tpu_emit_special_shifted_chebyshev_polynomial_u(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_U, true); }
void tpu_emit_special_shifted_chebyshev_polynomial_v(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_V, true); }
void tpu_emit_special_shifted_chebyshev_polynomial_w(tpu_lower *L) { sp_emit_polynomial(L, SP_CHEB_W, true); }
void tpu_emit_special_hermite_polynomial_h(tpu_lower *L) { sp_emit_polynomial(L, SP_HERM_H, false); }
void tpu_emit_special_hermite_polynomial_he(tpu_lower *L) { sp_emit_polynomial(L, SP_HERM_HE, false); }
void tpu_emit_special_laguerre_polynomial_l(tpu_lower *L) { sp_emit_polynomial(L, SP_LAGUERRE, false); }
void tpu_emit_special_legendre_polynomial_p(tpu_lower *L) { sp_emit_polynomial(L, SP_LEGENDRE, false); }

/* ---- integer and bit-level ops --------------------------------------------------------- */

/* gcd of |a| and |b| by Euclid's algorithm, in one while loop that runs
 * until every remainder is zero. */
static tpu_hv sp_gcd(tpu_lower *L, tpu_hv a, tpu_hv b) {
  const tpu_hlo_type *t = T(L, a);
  tpu_hlo_type types[2] = {*t, *t};
  int64_t all[TPU_MAX_RANK];
  for (int i = 0; i < t->rank; i++) all[i] = i;
  tpu_hv init[2] = {tpu_un(L, TPU_HLO_ABS, a), tpu_un(L, TPU_HLO_ABS, b)};
  tpu_hv s[2];
  tpu_hlo_region_begin(H, types, 2, s);
  tpu_hv nz = tpu_hlo_convert(H, sp_cmpk(L, TPU_HLO_NE, s[1], 0), TPU_S32);
  tpu_hv any = tpu_hlo_reduce(H, nz, tpu_hlo_constant_int(H, TPU_S32, 0), all, t->rank, TPU_HLO_MAX);
  tpu_hv c = tpu_cmp(L, TPU_HLO_GT, any, tpu_hlo_constant_int(H, TPU_S32, 0));
  int cond = tpu_hlo_region_end(H, &c, 1);
  tpu_hlo_region_begin(H, types, 2, s);
  tpu_hv live = sp_cmpk(L, TPU_HLO_NE, s[1], 0);
  tpu_hv safe = tpu_sel(L, live, s[1], tpu_k(L, s[1], 1));
  tpu_hv rem = tpu_hlo_binary(H, TPU_HLO_REM, s[0], safe);
  tpu_hv next[2] = {tpu_sel(L, live, s[1], s[0]), tpu_sel(L, live, rem, s[1])};
  int body = tpu_hlo_region_end(H, next, 2);
  tpu_hv outs[2];
  int regions[2] = {cond, body};
  if (!tpu_hlo_emit(H, "stablehlo.while", init, 2, regions, 2, NULL, types, 2, outs)) return TPU_HV_NONE;
  return outs[0];
}

static bool sp_int_binary(tpu_lower *L, const char *name, tpu_hv *v) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  if (!tpu_dtype_is_int(dt) || dt == TPU_PRED) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"%s_cpu\" not implemented for '%s'", name, tpu_dtype_name(dt));
    return false;
  }
  v[0] = tpu_lower_input(L, 0, dt);
  v[1] = tpu_lower_input(L, 1, dt);
  tpu_lower_broadcast_all(L, v, 2);
  return true;
}

void tpu_emit_gcd(tpu_lower *L) {
  tpu_hv v[2];
  if (sp_int_binary(L, "gcd", v)) tpu_lower_out(L, sp_gcd(L, v[0], v[1]));
}

/* lcm = |a / gcd * b|, 0 when gcd is 0 */
void tpu_emit_lcm(tpu_lower *L) {
  tpu_hv v[2];
  if (!sp_int_binary(L, "lcm", v)) return;
  tpu_hv g = sp_gcd(L, v[0], v[1]);
  tpu_hv z = sp_cmpk(L, TPU_HLO_EQ, g, 0);
  tpu_hv q = tpu_hlo_binary(H, TPU_HLO_DIV, v[0], tpu_sel(L, z, tpu_k(L, g, 1), g));
  tpu_hv r = tpu_un(L, TPU_HLO_ABS, tpu_mul(L, q, v[1]));
  tpu_lower_out(L, tpu_sel(L, z, tpu_k(L, g, 0), r));
}

/* frexp(x) = (mantissa in [0.5, 1) with x's sign, int32 exponent), read
 * from the bits with integer ops only (the CPU compiler flushes subnormal
 * floats to zero in arithmetic); subnormals are normalised with clz; 0, inf
 * and NaN give (x, 0). */
void tpu_emit_frexp(tpu_lower *L) {
  tpu_dtype dt = tpu_arg_dtype(L, 0);
  if (!tpu_dtype_is_float(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "torch.frexp() only supports floating-point dtypes");
    return;
  }
  bool wide = dt == TPU_F64;
  tpu_dtype ft = wide ? TPU_F64 : TPU_F32, it = wide ? TPU_S64 : TPU_S32;
  int nbits = wide ? 64 : 32, mbits = wide ? 52 : 23;
  int64_t emask = wide ? 0x7ff : 0xff, half = wide ? 1022 : 126;
  tpu_hv x = tpu_hlo_convert(H, tpu_lower_tensor(L, 0, -1), ft);
  tpu_hv bits = tpu_hlo_bitcast_convert(H, x, it);
  const tpu_hlo_type *bt = T(L, bits);
  tpu_hv sh = tpu_k(L, bits, mbits);
  tpu_hv mfield_mask =
      tpu_lower_broadcast_to(L, tpu_hlo_constant_int(H, it, ((int64_t)1 << mbits) - 1), bt->rank, bt->dims);
  tpu_hv sign_mask =
      tpu_lower_broadcast_to(L, tpu_hlo_constant_int(H, it, (int64_t)((uint64_t)1 << (nbits - 1))), bt->rank, bt->dims);
  tpu_hv bexp =
      tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_binary(H, TPU_HLO_SHR_L, bits, sh), tpu_k(L, bits, (double)emask));
  tpu_hv frac = tpu_hlo_binary(H, TPU_HLO_AND, bits, mfield_mask);
  tpu_hv sign = tpu_hlo_binary(H, TPU_HLO_AND, bits, sign_mask);
  /* subnormal: leading bit at p = nbits - 1 - clz(frac); value 2^(p - bias - mbits + 1) */
  tpu_hv p = tpu_sub(L, tpu_k(L, bits, nbits - 1), tpu_un(L, TPU_HLO_CLZ, frac));
  tpu_hv sub_e = sp_addk(L, p, -(double)(half + mbits - 1));
  tpu_hv shift = tpu_sub(L, tpu_k(L, bits, mbits), p);
  tpu_hv sub_frac = tpu_hlo_binary(H, TPU_HLO_AND, tpu_hlo_binary(H, TPU_HLO_SHL, frac, shift), mfield_mask);
  tpu_hv is_sub = sp_cmpk(L, TPU_HLO_EQ, bexp, 0);
  tpu_hv e = tpu_sel(L, is_sub, sub_e, tpu_sub(L, bexp, tpu_k(L, bits, (double)half)));
  frac = tpu_sel(L, is_sub, sub_frac, frac);
  tpu_hv mb = tpu_hlo_binary(H, TPU_HLO_OR, tpu_hlo_binary(H, TPU_HLO_OR, sign, frac),
                             tpu_hlo_binary(H, TPU_HLO_SHL, tpu_k(L, bits, (double)half), sh));
  tpu_hv m = tpu_hlo_bitcast_convert(H, mb, ft);
  /* zero from the fields: a masked-bits compare can be turned back into a
   * float compare, which would count subnormals as zero */
  tpu_hv zero = tpu_and(L, is_sub, sp_cmpk(L, TPU_HLO_EQ, tpu_hlo_binary(H, TPU_HLO_AND, bits, mfield_mask), 0));
  tpu_hv special = tpu_or(L, zero, sp_cmpk(L, TPU_HLO_EQ, bexp, (double)emask));
  m = tpu_sel(L, special, x, m);
  e = tpu_sel(L, special, tpu_k(L, e, 0), e);
  tpu_lower_out(L, tpu_hlo_convert(H, m, dt));
  tpu_lower_out(L, tpu_hlo_convert(H, e, TPU_S32));
}

/* ---- regularized incomplete gamma ------------------------------------------------------ */

/* P(a, x) (lower, upper = false) or Q(a, x). Below x < a + 1 the series
 * P = x^a e^-x / Gamma(a + 1) * sum_k x^k / ((a+1)...(a+k)); above, the
 * continued fraction for Q by the modified Lentz method. Both run in one
 * stablehlo.while of SP_IG_ITERS steps (enough for f32 for a up to about
 * 1e3), each element taking the branch it needs; Q = 1 - P or P = 1 - Q for
 * the other half. torch's edge cases (a or x negative, zero or infinite)
 * are selected after. */
#define SP_IG_ITERS 200
static tpu_hv sp_igamma(tpu_lower *L, tpu_hv a, tpu_hv x, bool upper) {
  const tpu_hlo_type *t = T(L, a);
  tpu_hlo_type st = tpu_hlo_type_make(t->dtype, 0, NULL);
  double tiny = t->dtype == TPU_F64 ? 1e-300 : 1e-30;
  tpu_hv b0 = tpu_sub(L, sp_addk(L, x, 1), a);
  /* state: i, a, x, sum, term, b, c, d, h */
  tpu_hlo_type types[9] = {st, *t, *t, *t, *t, *t, *t, *t, *t};
  tpu_hv d0 = tpu_div(L, tpu_k(L, x, 1), b0);
  tpu_hv init[9] = {
      tpu_hlo_constant(H, t->dtype, 1.0), a, x, tpu_k(L, x, 1), tpu_k(L, x, 1), b0, tpu_k(L, x, 1.0 / tiny), d0, d0};
  tpu_hv s[9];
  tpu_hlo_region_begin(H, types, 9, s);
  tpu_hv c = sp_cmpk(L, TPU_HLO_LE, s[0], SP_IG_ITERS);
  int cond = tpu_hlo_region_end(H, &c, 1);
  tpu_hlo_region_begin(H, types, 9, s);
  tpu_hv i = tpu_lower_broadcast_to(L, s[0], t->rank, t->dims);
  tpu_hv sa = s[1], sx = s[2];
  tpu_hv term = tpu_mul(L, s[4], tpu_div(L, sx, tpu_add(L, sa, i)));
  tpu_hv sum = tpu_add(L, s[3], term);
  tpu_hv an = tpu_mul(L, tpu_un(L, TPU_HLO_NEG, i), tpu_sub(L, i, sa));
  tpu_hv b = sp_addk(L, s[5], 2);
  tpu_hv d = tpu_add(L, tpu_mul(L, an, s[7]), b);
  d = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, tpu_un(L, TPU_HLO_ABS, d), tiny), tpu_k(L, d, tiny), d);
  tpu_hv cc = tpu_add(L, b, tpu_div(L, an, s[6]));
  cc = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, tpu_un(L, TPU_HLO_ABS, cc), tiny), tpu_k(L, cc, tiny), cc);
  d = tpu_div(L, tpu_k(L, d, 1), d);
  tpu_hv h = tpu_mul(L, s[8], tpu_mul(L, d, cc));
  tpu_hv next[9] = {tpu_add(L, s[0], tpu_hlo_constant(H, t->dtype, 1.0)), sa, sx, sum, term, b, cc, d, h};
  int body = tpu_hlo_region_end(H, next, 9);
  tpu_hv outs[9];
  int regions[2] = {cond, body};
  if (!tpu_hlo_emit(H, "stablehlo.while", init, 9, regions, 2, NULL, types, 9, outs)) return TPU_HV_NONE;
  tpu_hv alogx_x = tpu_sub(L, tpu_mul(L, a, tpu_un(L, TPU_HLO_LOG, x)), x);
  tpu_hv lga = tpu_named_op(L, "chlo.lgamma", &a, 1);
  tpu_hv a1 = sp_addk(L, a, 1);
  tpu_hv lga1 = tpu_named_op(L, "chlo.lgamma", &a1, 1);
  tpu_hv p_ser = tpu_mul(L, tpu_un(L, TPU_HLO_EXP, tpu_sub(L, alogx_x, lga1)), outs[3]);
  tpu_hv q_cf = tpu_mul(L, tpu_un(L, TPU_HLO_EXP, tpu_sub(L, alogx_x, lga)), outs[8]);
  tpu_hv use_ser = tpu_cmp(L, TPU_HLO_LT, x, a1);
  tpu_hv one = tpu_k(L, x, 1), zero = tpu_k(L, x, 0), nan = tpu_k(L, x, NAN);
  tpu_hv r =
      upper ? tpu_sel(L, use_ser, tpu_sub(L, one, p_ser), q_cf) : tpu_sel(L, use_ser, p_ser, tpu_sub(L, one, q_cf));
  /* edge cases, lowest priority first */
  tpu_hv x_inf = sp_cmpk(L, TPU_HLO_EQ, x, INFINITY), a_inf = sp_cmpk(L, TPU_HLO_EQ, a, INFINITY);
  tpu_hv x0 = sp_cmpk(L, TPU_HLO_EQ, x, 0), a0 = sp_cmpk(L, TPU_HLO_EQ, a, 0);
  r = tpu_sel(L, x_inf, upper ? zero : one, r);
  r = tpu_sel(L, a_inf, tpu_sel(L, x_inf, nan, upper ? one : zero), r);
  r = tpu_sel(L, x0, upper ? one : zero, r);
  r = tpu_sel(L, a0, tpu_sel(L, sp_cmpk(L, TPU_HLO_GT, x, 0), upper ? zero : one, nan), r);
  tpu_hv bad = tpu_or(L, sp_cmpk(L, TPU_HLO_LT, a, 0), sp_cmpk(L, TPU_HLO_LT, x, 0));
  bad = tpu_or(L, bad, tpu_or(L, tpu_isnan(L, a), tpu_isnan(L, x)));
  return tpu_sel(L, bad, nan, r);
}
static tpu_hv sp_igamma_lower(tpu_lower *L, tpu_hv a, tpu_hv x) { return sp_igamma(L, a, x, false); }
static tpu_hv sp_igamma_upper(tpu_lower *L, tpu_hv a, tpu_hv x) { return sp_igamma(L, a, x, true); }
void tpu_emit_igamma(tpu_lower *L) { sp_binary(L, sp_igamma_lower); }
void tpu_emit_igammac(tpu_lower *L) { sp_binary(L, sp_igamma_upper); }

/* ---- modified Bessel functions of the second kind ---------------------------------------- */

/* e^x K_nu(x), nu = 0, 1, x > 0. Up to x = 2 the series (A&S 9.6.13, 9.6.11)
 *   K0 = -(log(x/2) + gamma) I0(x) + sum H_k (x^2/4)^k / (k!)^2
 *   K1 = 1/x + log(x/2) I1(x) - x/4 sum (psi(k+1) + psi(k+2)) (x^2/4)^k / (k! (k+1)!)
 * lose at most a digit to cancellation. Above, the trapezoid rule on
 * e^x K_nu(x) = int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt, which converges
 * geometrically for this analytic, doubly-exponentially decaying integrand:
 * a sum of exponentials with constant rates. */
#define SP_EULER 0.57721566490153286061
static tpu_hv sp_ke(tpu_lower *L, tpu_hv x, int nu) {
  /* series on x clamped into (0, 2] */
  tpu_hv xs = tpu_hlo_clamp(H, tpu_k(L, x, 1e-30), x, tpu_k(L, x, 2.0));
  tpu_hv q = sp_mulk(L, tpu_mul(L, xs, xs), 0.25);
  tpu_hv lg = tpu_un(L, TPU_HLO_LOG, sp_mulk(L, xs, 0.5));
  double c[20];
  double fk = 1.0, hk = 0.0; /* k!, H_k */
  for (int k = 0; k < 20; k++) {
    if (k) {
      fk *= k;
      hk += 1.0 / k;
    }
    if (nu == 0) {
      c[k] = (hk - SP_EULER) / (fk * fk);
    } else {
      double psi1 = hk - SP_EULER, psi2 = hk + 1.0 / (k + 1) - SP_EULER;
      c[k] = (psi1 + psi2) / (fk * fk * (k + 1));
    }
  }
  tpu_hv sum = sp_poly(L, q, c, 20);
  tpu_hv ser;
  tpu_hv ix = tpu_mul(L, sp_ie(L, xs, nu), tpu_un(L, TPU_HLO_EXP, xs));
  if (nu == 0) {
    ser = tpu_add(L, tpu_mul(L, tpu_un(L, TPU_HLO_NEG, lg), ix), sum);
  } else {
    ser = tpu_add(L, tpu_div(L, tpu_k(L, xs, 1), xs), tpu_mul(L, lg, ix));
    ser = tpu_sub(L, ser, tpu_mul(L, sp_mulk(L, xs, 0.25), sum));
  }
  ser = tpu_mul(L, ser, tpu_un(L, TPU_HLO_EXP, xs));
  /* quadrature on x clamped from below */
  tpu_hv xl = tpu_hlo_binary(H, TPU_HLO_MAX, x, tpu_k(L, x, 2.0));
  tpu_hv nxl = tpu_un(L, TPU_HLO_NEG, xl);
  const double h = 0.125;
  tpu_hv acc = tpu_k(L, x, 0);
  for (int j = 0; j <= 56; j++) {
    double t = j * h, s = sinh(t / 2);
    double rate = 2 * s * s, w = h * (j ? 1.0 : 0.5) * (nu ? cosh(t) : 1.0);
    acc = tpu_add(L, acc, sp_mulk(L, tpu_un(L, TPU_HLO_EXP, sp_mulk(L, nxl, rate)), w));
  }
  tpu_hv r = tpu_sel(L, sp_cmpk(L, TPU_HLO_LE, x, 2.0), ser, acc);
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), tpu_k(L, x, INFINITY), r);
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, INFINITY), tpu_k(L, x, 0), r);
  return tpu_sel(L, tpu_or(L, sp_cmpk(L, TPU_HLO_LT, x, 0), tpu_isnan(L, x)), tpu_k(L, x, NAN), r);
}
static tpu_hv sp_k0e(tpu_lower *L, tpu_hv x) { return sp_ke(L, x, 0); }
static tpu_hv sp_k1e(tpu_lower *L, tpu_hv x) { return sp_ke(L, x, 1); }
static tpu_hv sp_k0(tpu_lower *L, tpu_hv x) {
  tpu_hv r = tpu_mul(L, sp_ke(L, x, 0), tpu_un(L, TPU_HLO_EXP, tpu_un(L, TPU_HLO_NEG, x)));
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), tpu_k(L, x, INFINITY), r);
}
static tpu_hv sp_k1(tpu_lower *L, tpu_hv x) {
  tpu_hv r = tpu_mul(L, sp_ke(L, x, 1), tpu_un(L, TPU_HLO_EXP, tpu_un(L, TPU_HLO_NEG, x)));
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), tpu_k(L, x, INFINITY), r);
}
void tpu_emit_special_modified_bessel_k0(tpu_lower *L) { tpu_float_unary(L, sp_k0); }
void tpu_emit_special_modified_bessel_k1(tpu_lower *L) { tpu_float_unary(L, sp_k1); }
void tpu_emit_special_scaled_modified_bessel_k0(tpu_lower *L) { tpu_float_unary(L, sp_k0e); }
void tpu_emit_special_scaled_modified_bessel_k1(tpu_lower *L) { tpu_float_unary(L, sp_k1e); }

/* ---- Bessel functions of the first kind ----------------------------------------------- */

/* J_n(x), n = 0, 1. Up to |x| = 40 Bessel's integral
 * J_n(x) = 1/(2 pi) int_0^{2 pi} cos(n t - x sin t) dt by the trapezoid rule
 * on 64 nodes: the integrand is periodic and entire, so the error is of the
 * order of J_64(x), below f32 rounding there. Above, Hankel's asymptotic
 * expansion J_n ~ sqrt(2/(pi x)) (P cos chi - Q sin chi), chi = x - (n/2 + 1/4) pi. */
#define SP_J_SWITCH 40.0
#define SP_J_NODES 64

/* Hankel's asymptotic expansion of J_nu (y: Y_nu) at xl (large, positive):
 * sqrt(2 / (pi xl)) (P cos chi - Q sin chi), or (P sin chi + Q cos chi) for
 * Y, with chi = xl - (nu / 2 + 1 / 4) pi and three terms of P and Q. */
static tpu_hv sp_hankel(tpu_lower *L, tpu_hv xl, int nu, bool y) {
  tpu_hv inv = tpu_div(L, tpu_k(L, xl, 1), xl), inv2 = tpu_mul(L, inv, inv);
  double mu = 4.0 * nu * nu;
  double p[3] = {1.0, -(mu - 1) * (mu - 9) / (2.0 * 64), (mu - 1) * (mu - 9) * (mu - 25) * (mu - 49) / (24.0 * 4096)};
  double q[3] = {(mu - 1) / 8.0, -(mu - 1) * (mu - 9) * (mu - 25) / (6.0 * 512),
                 (mu - 1) * (mu - 9) * (mu - 25) * (mu - 49) * (mu - 81) / (120.0 * 32768)};
  tpu_hv P = sp_poly(L, inv2, p, 3), Q = tpu_mul(L, sp_poly(L, inv2, q, 3), inv);
  tpu_hv chi = sp_addk(L, xl, -(nu * 0.5 + 0.25) * SP_PI);
  tpu_hv c = tpu_un(L, TPU_HLO_COS, chi), sn = tpu_un(L, TPU_HLO_SIN, chi);
  tpu_hv a = y ? tpu_add(L, tpu_mul(L, P, sn), tpu_mul(L, Q, c)) : tpu_sub(L, tpu_mul(L, P, c), tpu_mul(L, Q, sn));
  return tpu_mul(L, a, tpu_un(L, TPU_HLO_SQRT, sp_mulk(L, inv, 2.0 / SP_PI)));
}
static tpu_hv sp_jn(tpu_lower *L, tpu_hv x, int nu) {
  tpu_hv xs = tpu_hlo_clamp(H, tpu_k(L, x, -SP_J_SWITCH), x, tpu_k(L, x, SP_J_SWITCH));
  tpu_hv acc = tpu_k(L, x, 0);
  for (int j = 0; j < SP_J_NODES; j++) {
    double t = 2 * SP_PI * j / SP_J_NODES;
    tpu_hv arg = sp_addk(L, sp_mulk(L, xs, -sin(t)), nu * t);
    acc = tpu_add(L, acc, tpu_un(L, TPU_HLO_COS, arg));
  }
  tpu_hv quad = sp_mulk(L, acc, 1.0 / SP_J_NODES);
  /* asymptotic on |x| clamped from below; J_1 is odd */
  tpu_hv ax = tpu_un(L, TPU_HLO_ABS, x);
  tpu_hv xl = tpu_hlo_binary(H, TPU_HLO_MAX, ax, tpu_k(L, ax, SP_J_SWITCH));
  tpu_hv asy = sp_hankel(L, xl, nu, false);
  if (nu) asy = tpu_sel(L, sp_cmpk(L, TPU_HLO_LT, x, 0), tpu_un(L, TPU_HLO_NEG, asy), asy);
  /* +-inf: NaN from cos(inf), as torch */
  return tpu_sel(L, sp_cmpk(L, TPU_HLO_LE, ax, SP_J_SWITCH), quad, asy);
}
static tpu_hv sp_j0(tpu_lower *L, tpu_hv x) { return sp_jn(L, x, 0); }
static tpu_hv sp_j1(tpu_lower *L, tpu_hv x) { return sp_jn(L, x, 1); }
void tpu_emit_special_bessel_j0(tpu_lower *L) { tpu_float_unary(L, sp_j0); }
void tpu_emit_special_bessel_j1(tpu_lower *L) { tpu_float_unary(L, sp_j1); }

/* ---- Bessel functions of the second kind ---------------------------------------------- */

/* Y_n(x), n = 0, 1, x > 0. Up to x = 25 Neumann's series
 *   Y0 = (2/pi) (log(x/2) + gamma) J0 - (4/pi) sum_k (-1)^k J_2k / k
 *   Y1 = -Y0' = (2/pi) ((log(x/2) + gamma) J1 - J0 / x)
 *              + (2/pi) sum_k (-1)^k (J_{2k-1} - J_{2k+1}) / k,
 * whose terms fall with J_2k (no cancellation), truncated at k = 25. Every
 * J_m comes from Bessel's integral J_m = 1/N sum_j cos(m t_j - x sin t_j) on
 * N = 128 nodes, so a fixed combination sum_m a_m J_m is
 * 1/N sum_j (C_j cos(x sin t_j) + S_j sin(x sin t_j)) with C_j, S_j
 * constants; nodes with equal |sin t_j| are folded, leaving 33 cos/sin pairs.
 * Above 25 Hankel's expansion Y_n ~ sqrt(2/(pi x)) (P sin chi + Q cos chi).
 * torch: -inf at 0, NaN below 0 and at +-inf. */
#define SP_Y_SWITCH 25.0
#define SP_Y_NODES 128
#define SP_Y_TERMS 25
static tpu_hv sp_yn(tpu_lower *L, tpu_hv x, int nu) {
  enum { M = SP_Y_NODES / 4 + 1 };
  /* folded constants: for the sum over the Neumann terms (cs, ss), for J0
   * (c0), and for J1 (c1, s1) */
  double cs[M] = {0}, ss[M] = {0}, c0[M] = {0}, c1[M] = {0}, s1[M] = {0};
  for (int j = 0; j < SP_Y_NODES; j++) {
    double t = 2 * SP_PI * j / SP_Y_NODES, st = sin(t);
    int m = j % (SP_Y_NODES / 2);
    if (m > SP_Y_NODES / 4) m = SP_Y_NODES / 2 - m;
    double sg = st < -1e-12 ? -1.0 : 1.0; /* sin(x sin t) is odd in sin t */
    double a = 0, b = 0;
    for (int k = 1; k <= SP_Y_TERMS; k++) {
      double w = (k % 2 ? -1.0 : 1.0) / k;
      if (nu == 0) {
        a += w * cos(2 * k * t);
        b += w * sin(2 * k * t);
      } else {
        a += w * (cos((2 * k - 1) * t) - cos((2 * k + 1) * t));
        b += w * (sin((2 * k - 1) * t) - sin((2 * k + 1) * t));
      }
    }
    cs[m] += a;
    ss[m] += sg * b;
    c0[m] += 1.0;
    c1[m] += cos(t);
    s1[m] += sg * sin(t);
  }
  tpu_hv xs = tpu_hlo_clamp(H, tpu_k(L, x, 1e-30), x, tpu_k(L, x, SP_Y_SWITCH));
  tpu_hv sum = tpu_k(L, x, 0), j0 = tpu_k(L, x, 0), j1 = tpu_k(L, x, 0);
  for (int m = 0; m < M; m++) {
    double st = sin(2 * SP_PI * m / SP_Y_NODES);
    tpu_hv s = sp_mulk(L, xs, st);
    tpu_hv c = tpu_un(L, TPU_HLO_COS, s), d = tpu_un(L, TPU_HLO_SIN, s);
    sum = tpu_add(L, sum, tpu_add(L, sp_mulk(L, c, cs[m]), sp_mulk(L, d, ss[m])));
    j0 = tpu_add(L, j0, sp_mulk(L, c, c0[m]));
    if (nu) j1 = tpu_add(L, j1, tpu_add(L, sp_mulk(L, c, c1[m]), sp_mulk(L, d, s1[m])));
  }
  const double inv_n = 1.0 / SP_Y_NODES;
  sum = sp_mulk(L, sum, inv_n);
  j0 = sp_mulk(L, j0, inv_n);
  tpu_hv lg = sp_addk(L, tpu_un(L, TPU_HLO_LOG, sp_mulk(L, xs, 0.5)), SP_EULER);
  tpu_hv ser;
  if (nu == 0) {
    ser = tpu_sub(L, sp_mulk(L, tpu_mul(L, lg, j0), 2 / SP_PI), sp_mulk(L, sum, 4 / SP_PI));
  } else {
    j1 = sp_mulk(L, j1, inv_n);
    tpu_hv t = tpu_sub(L, tpu_mul(L, lg, j1), tpu_div(L, j0, xs));
    ser = sp_mulk(L, tpu_add(L, t, sum), 2 / SP_PI);
  }
  /* Hankel's expansion on x clamped from below */
  tpu_hv xl = tpu_hlo_binary(H, TPU_HLO_MAX, x, tpu_k(L, x, SP_Y_SWITCH));
  tpu_hv asy = sp_hankel(L, xl, nu, true);
  tpu_hv r = tpu_sel(L, sp_cmpk(L, TPU_HLO_LE, x, SP_Y_SWITCH), ser, asy);
  r = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, x, 0), tpu_k(L, x, -INFINITY), r);
  tpu_hv bad = tpu_or(L, tpu_or(L, sp_cmpk(L, TPU_HLO_LT, x, 0), tpu_isnan(L, x)), sp_cmpk(L, TPU_HLO_EQ, x, INFINITY));
  return tpu_sel(L, bad, tpu_k(L, x, NAN), r);
}
static tpu_hv sp_y0(tpu_lower *L, tpu_hv x) { return sp_yn(L, x, 0); }
static tpu_hv sp_y1(tpu_lower *L, tpu_hv x) { return sp_yn(L, x, 1); }
void tpu_emit_special_bessel_y0(tpu_lower *L) { tpu_float_unary(L, sp_y0); }
void tpu_emit_special_bessel_y1(tpu_lower *L) { tpu_float_unary(L, sp_y1); }

/* ---- Airy function -------------------------------------------------------------------- */

/* Ai(x). Three ranges, each well conditioned in f32:
 * - x >= 1: Ai = 1/pi sqrt(x/3) K_{1/3}(zeta), zeta = 2/3 x^{3/2}, with
 *   e^zeta K_nu(zeta) = int_0^inf exp(-zeta (cosh t - 1)) cosh(nu t) dt by the
 *   trapezoid rule (as for K0, K1 above);
 * - -10 <= x < 1: Taylor polynomials of degree 18 on unit pieces centred at
 *   -9.5, ..., 0.5. Their coefficients come from Ai'' = x Ai:
 *   a_{n+2} = (c a_n + a_{n-1}) / ((n+1)(n+2)); the values at the centres by
 *   Taylor steps in double from Ai(0), Ai'(0) (stable towards negative x,
 *   where Ai oscillates);
 * - x < -10: the asymptotic expansion
 *   Ai(-z) ~ z^{-1/4}/sqrt(pi) (sin(zeta + pi/4) P - cos(zeta + pi/4) Q)
 *   with P, Q the even and odd terms of sum (-1)^.. u_k zeta^-k.
 * torch: NaN at +-inf and NaN. */
#define SP_AI0 0.355028053887817239260
#define SP_AIP0 (-0.258819403792806798405)
#define SP_AI_DEG 19
#define SP_AI_PIECES 11
/* Taylor coefficients a[0..n) of Ai at c from its value y and slope yp there */
static void sp_ai_taylor(double c, double y, double yp, double *a, int n) {
  a[0] = y;
  a[1] = yp;
  for (int k = 0; k + 2 < n; k++) a[k + 2] = (c * a[k] + (k ? a[k - 1] : 0.0)) / ((k + 1.0) * (k + 2.0));
}
/* one Taylor step of h from c: (y, yp) at c + h */
static void sp_ai_step(double c, double h, double *y, double *yp) {
  double a[48];
  sp_ai_taylor(c, *y, *yp, a, 48);
  double v = 0, d = 0;
  for (int k = 47; k >= 0; k--) v = v * h + a[k];
  for (int k = 47; k >= 1; k--) d = d * h + k * a[k];
  *y = v;
  *yp = d;
}
static tpu_hv sp_airy_ai(tpu_lower *L, tpu_hv x) {
  /* x >= 1 */
  tpu_hv xq = tpu_hlo_binary(H, TPU_HLO_MAX, x, tpu_k(L, x, 1.0));
  tpu_hv sq = tpu_un(L, TPU_HLO_SQRT, xq);
  tpu_hv zeta = sp_mulk(L, tpu_mul(L, xq, sq), 2.0 / 3.0);
  tpu_hv nz = tpu_un(L, TPU_HLO_NEG, zeta);
  const double h = 0.125;
  tpu_hv acc = tpu_k(L, x, 0);
  for (int j = 0; j <= 48; j++) {
    double t = j * h, s = sinh(t / 2);
    double rate = 2 * s * s, w = h * (j ? 1.0 : 0.5) * cosh(t / 3);
    acc = tpu_add(L, acc, sp_mulk(L, tpu_un(L, TPU_HLO_EXP, sp_mulk(L, nz, rate)), w));
  }
  tpu_hv big = tpu_mul(L, tpu_mul(L, acc, tpu_un(L, TPU_HLO_EXP, nz)), sp_mulk(L, sq, 1.0 / (SP_PI * sqrt(3.0))));
  /* -10 <= x < 1: the pieces */
  double y = SP_AI0, yp = SP_AIP0, c = 0.0;
  double cy[SP_AI_PIECES], cyp[SP_AI_PIECES];
  sp_ai_step(0.0, 0.5, &y, &yp); /* the last piece, centred at 0.5 */
  cy[SP_AI_PIECES - 1] = y;
  cyp[SP_AI_PIECES - 1] = yp;
  y = SP_AI0;
  yp = SP_AIP0;
  for (int i = SP_AI_PIECES - 2; i >= 0; i--) {
    double h2 = (i == SP_AI_PIECES - 2) ? -0.5 : -1.0;
    sp_ai_step(c, h2, &y, &yp);
    c += h2;
    cy[i] = y;
    cyp[i] = yp;
  }
  tpu_hv mid = tpu_k(L, x, 0);
  /* floor first: x + 10 can round up to the next integer */
  tpu_hv piece =
      tpu_hlo_clamp(H, tpu_k(L, x, 0), sp_addk(L, tpu_un(L, TPU_HLO_FLOOR, x), 10.0), tpu_k(L, x, SP_AI_PIECES - 1));
  for (int i = 0; i < SP_AI_PIECES; i++) {
    double ci = -9.5 + i, a[SP_AI_DEG];
    sp_ai_taylor(ci, cy[i], cyp[i], a, SP_AI_DEG);
    tpu_hv p = sp_poly(L, sp_addk(L, x, -ci), a, SP_AI_DEG);
    mid = tpu_sel(L, sp_cmpk(L, TPU_HLO_EQ, piece, i), p, mid);
  }
  /* x < -10: on z = -x clamped from below */
  tpu_hv z = tpu_hlo_binary(H, TPU_HLO_MAX, tpu_un(L, TPU_HLO_NEG, x), tpu_k(L, x, 10.0));
  tpu_hv sz = tpu_un(L, TPU_HLO_SQRT, z);
  tpu_hv ze = sp_mulk(L, tpu_mul(L, z, sz), 2.0 / 3.0);
  tpu_hv iz = tpu_div(L, tpu_k(L, ze, 1), ze), iz2 = tpu_mul(L, iz, iz);
  double u[8], pc[4], qc[4];
  u[0] = 1.0;
  for (int k = 1; k < 8; k++)
    u[k] = u[k - 1] * (6.0 * k - 5) * (6.0 * k - 3) * (6.0 * k - 1) / ((2.0 * k - 1) * 216.0 * k);
  for (int k = 0; k < 4; k++) {
    pc[k] = (k % 2 ? -1.0 : 1.0) * u[2 * k];
    qc[k] = (k % 2 ? -1.0 : 1.0) * u[2 * k + 1];
  }
  tpu_hv P = sp_poly(L, iz2, pc, 4), Q = tpu_mul(L, sp_poly(L, iz2, qc, 4), iz);
  tpu_hv ph = sp_addk(L, ze, SP_PI / 4);
  tpu_hv asy = tpu_sub(L, tpu_mul(L, tpu_un(L, TPU_HLO_SIN, ph), P), tpu_mul(L, tpu_un(L, TPU_HLO_COS, ph), Q));
  asy = tpu_div(L, sp_mulk(L, asy, 1.0 / SP_SQRTPI), tpu_un(L, TPU_HLO_SQRT, sz));
  tpu_hv r = tpu_sel(L, sp_cmpk(L, TPU_HLO_GE, x, 1.0), big, tpu_sel(L, sp_cmpk(L, TPU_HLO_GE, x, -10.0), mid, asy));
  tpu_hv bad = tpu_or(L, tpu_isnan(L, x), sp_cmpk(L, TPU_HLO_EQ, tpu_un(L, TPU_HLO_ABS, x), INFINITY));
  return tpu_sel(L, bad, tpu_k(L, x, NAN), r);
}
void tpu_emit_special_airy_ai(tpu_lower *L) { tpu_float_unary(L, sp_airy_ai); }

/* emit_eig.c: the general (non-symmetric) eigenproblem, linalg.eig and linalg.eigvals.
 *
 * XLA has no general eigendecomposition, so it is built here from HLO, in
 * complex arithmetic for every input dtype (results are complex, as on the CPU):
 *
 *   1. Householder reduction to upper Hessenberg form H = Q^H A Q;
 *   2. single-shift QR iteration on H (implicit, one Givens bulge chase per
 *      step, Wilkinson shifts with an exceptional shift every 10 steps without
 *      deflation, deflation from the bottom), a bounded stablehlo.while, giving
 *      the Schur form T = Z^H A Z (Z accumulates Q and every rotation);
 *   3. eigenvalues: diag(T); eigenvectors: those of T by back substitution,
 *      multiplied by Z, then normalised as LAPACK's geev does (unit Euclidean
 *      norm, the largest-magnitude component real; here also positive).
 *
 * Every batch element runs in the same loops; an element that has converged
 * takes identity rotations. Eigenvalue order is the order of diag(T), which
 * need not be LAPACK's: eigenvalues are a multiset and eigenvectors are defined
 * up to a phase. A matrix that does not converge within LAPACK's iteration
 * bound (30 per row, at least 300) raises torch's error at the next sync. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "emit.h"

/* ---- small helpers on [B, n, n] matrices, [B, n] vectors and [B] scalars ------------------ */

typedef struct {
  tpu_lower *L;
  tpu_dtype R, C; /* real and complex working dtypes */
  int64_t B, n;
  double ulp, smlnum;
} eg_ctx;

#define EL (c->L)

static tpu_hlo_type eg_t(tpu_dtype dt, int rank, int64_t B, int64_t n) {
  int64_t d[3] = {B, n, n};
  return tpu_hlo_type_make(dt, rank, d);
}
static tpu_hv eg_sel(eg_ctx *c, tpu_hv p, tpu_hv a, tpu_hv b) { return tpu_hlo_select(EL->hlo, p, a, b); }
static tpu_hv eg_cmp(eg_ctx *c, tpu_hlo_cmp d, tpu_hv a, tpu_hv b) { return tpu_hlo_compare(EL->hlo, d, a, b); }
static tpu_hv eg_and(eg_ctx *c, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(EL->hlo, TPU_HLO_AND, a, b); }
static tpu_hv eg_or(eg_ctx *c, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(EL->hlo, TPU_HLO_OR, a, b); }
static tpu_hv eg_not(eg_ctx *c, tpu_hv a) { return tpu_hlo_unary(EL->hlo, TPU_HLO_NOT, a); }
static tpu_hv eg_div(eg_ctx *c, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(EL->hlo, TPU_HLO_DIV, a, b); }
static tpu_hv eg_max(eg_ctx *c, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(EL->hlo, TPU_HLO_MAX, a, b); }
static tpu_hv eg_abs(eg_ctx *c, tpu_hv a) { return tpu_hlo_unary(EL->hlo, TPU_HLO_ABS, a); }
static tpu_hv eg_sqrt(eg_ctx *c, tpu_hv a) { return tpu_hlo_unary(EL->hlo, TPU_HLO_SQRT, a); }
static tpu_hv eg_re(eg_ctx *c, tpu_hv a) { return tpu_hlo_unary(EL->hlo, TPU_HLO_REAL, a); }
static tpu_hv eg_im(eg_ctx *c, tpu_hv a) { return tpu_hlo_unary(EL->hlo, TPU_HLO_IMAG, a); }
static tpu_hv eg_cx(eg_ctx *c, tpu_hv re, tpu_hv im) { return tpu_hlo_binary(EL->hlo, TPU_HLO_COMPLEX, re, im); }
static tpu_hv eg_conj(eg_ctx *c, tpu_hv a) {
  return eg_cx(c, eg_re(c, a), tpu_hlo_unary(EL->hlo, TPU_HLO_NEG, eg_im(c, a)));
}
static tpu_hv eg_tocx(eg_ctx *c, tpu_hv a) { return tpu_hlo_convert(EL->hlo, a, c->C); }
static tpu_hv eg_i(eg_ctx *c, int64_t v) { return tpu_hlo_constant_int(EL->hlo, TPU_S64, v); }
static tpu_hv eg_k(eg_ctx *c, tpu_hv like, double v) { return tpu_lower_full_like(EL, like, v); }
static tpu_hv eg_mul(eg_ctx *c, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(EL->hlo, TPU_HLO_MUL, a, b); }
static tpu_hv eg_add(eg_ctx *c, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(EL->hlo, TPU_HLO_ADD, a, b); }
static tpu_hv eg_sub(eg_ctx *c, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(EL->hlo, TPU_HLO_SUB, a, b); }

/* [B] -> [B, n] (along rows) or [B, n] -> [B, n, n] with v in dim `at` (1: v[b, i] at
 * (b, i, :); 2: at (b, :, j)). */
static tpu_hv eg_b2(eg_ctx *c, tpu_hv s) {
  int64_t d[2] = {c->B, c->n}, bd[1] = {0};
  return tpu_hlo_broadcast_in_dim(EL->hlo, s, 2, d, bd);
}
static tpu_hv eg_b3(eg_ctx *c, tpu_hv v, int at) {
  int64_t d[3] = {c->B, c->n, c->n}, bd[2] = {0, at};
  return tpu_hlo_broadcast_in_dim(EL->hlo, v, 3, d, bd);
}
static tpu_hv eg_b3s(eg_ctx *c, tpu_hv s) { /* [B] -> [B, n, n] */
  int64_t d[3] = {c->B, c->n, c->n}, bd[1] = {0};
  return tpu_hlo_broadcast_in_dim(EL->hlo, s, 3, d, bd);
}
static tpu_hv eg_iota(eg_ctx *c, int rank, int dim) {
  return tpu_hlo_iota(EL->hlo, eg_t(TPU_S64, rank, c->B, c->n), dim);
}
/* A 0-d s64 broadcast to [B, n] or [B, n, n]. */
static tpu_hv eg_bk(eg_ctx *c, tpu_hv k, int rank) {
  tpu_hlo_type t = eg_t(TPU_S64, rank, c->B, c->n);
  return tpu_hlo_broadcast_in_dim(EL->hlo, k, rank, t.dims, NULL);
}
/* Sum of x over dim d (a complex or real zero init). */
static tpu_hv eg_sum(eg_ctx *c, tpu_hv x, int64_t d) {
  return tpu_hlo_reduce(EL->hlo, x, tpu_hlo_constant(EL->hlo, T(EL, x)->dtype, 0), &d, 1, TPU_HLO_ADD);
}
static tpu_hv eg_rmax(eg_ctx *c, tpu_hv x, int64_t d) {
  tpu_dtype dt = T(EL, x)->dtype;
  tpu_hv init = dt == TPU_S64 ? tpu_hlo_constant_int(EL->hlo, dt, INT64_MIN) : tpu_hlo_constant(EL->hlo, dt, 0);
  return tpu_hlo_reduce(EL->hlo, x, init, &d, 1, TPU_HLO_MAX);
}
static tpu_hv eg_rmin(eg_ctx *c, tpu_hv x, int64_t d) {
  return tpu_hlo_reduce(EL->hlo, x, tpu_hlo_constant_int(EL->hlo, TPU_S64, INT64_MAX), &d, 1, TPU_HLO_MIN);
}
/* The element of x [B, n, n] at (i[b], j[b]) for each b: [B]. */
static tpu_hv eg_at(eg_ctx *c, tpu_hv x, tpu_hv i, tpu_hv j) {
  tpu_hv m = eg_and(c, eg_cmp(c, TPU_HLO_EQ, eg_iota(c, 3, 1), eg_b3s(c, i)),
                    eg_cmp(c, TPU_HLO_EQ, eg_iota(c, 3, 2), eg_b3s(c, j)));
  tpu_hv z = eg_sel(c, m, x, eg_k(c, x, 0));
  int64_t d[2] = {1, 2};
  return tpu_hlo_reduce(EL->hlo, z, tpu_hlo_constant(EL->hlo, T(EL, x)->dtype, 0), d, 2, TPU_HLO_ADD);
}
/* Diagonal offset `off` (0: diagonal, -1: subdiagonal, entry i is x[i, i-1], 0 for i = 0). */
static tpu_hv eg_diag(eg_ctx *c, tpu_hv x, int64_t off) {
  tpu_hv m = eg_cmp(c, TPU_HLO_EQ, eg_iota(c, 3, 2),
                    eg_add(c, eg_iota(c, 3, 1), tpu_lower_full(EL, eg_t(TPU_S64, 3, c->B, c->n), (double)off)));
  return eg_sum(c, eg_sel(c, m, x, eg_k(c, x, 0)), 2);
}
/* Batched products: a [B, n, n] @ b [B, n, n], a [B, n, n] @ v [B, n], v [B, n] @ a [B, n, n]. */
static tpu_hv eg_dot(eg_ctx *c, tpu_hv a, tpu_hv b, int64_t ca, int64_t cb) {
  int64_t bd = 0;
  return tpu_hlo_dot_general(EL->hlo, a, b, 1, &bd, &bd, 1, &ca, &cb, TPU_HLO_PREC_HIGHEST, TPU_INVALID);
}
/* rows (b, k..k+rows) x cols (b, j..j+cols) of x [B, n, n] at 0-d k, j: [B, rows, cols]. */
static tpu_hv eg_block(eg_ctx *c, tpu_hv x, tpu_hv k, tpu_hv j, int64_t rows, int64_t cols) {
  tpu_hv st[3] = {eg_i(c, 0), k, j};
  int64_t sz[3] = {c->B, rows, cols};
  return tpu_hlo_dynamic_slice(EL->hlo, x, st, sz);
}
static tpu_hv eg_put(eg_ctx *c, tpu_hv x, tpu_hv u, tpu_hv k, tpu_hv j) {
  tpu_hv st[3] = {eg_i(c, 0), k, j};
  return tpu_hlo_dynamic_update_slice(EL->hlo, x, u, st);
}
/* Index `i` of dim 1 or 2 of a [B, r, s] block, that dim dropped. */
static tpu_hv eg_take(eg_ctx *c, tpu_hv x, int dim, int64_t i) {
  const tpu_hlo_type t = *T(EL, x);
  int64_t st[3] = {0, 0, 0}, lim[3] = {t.dims[0], t.dims[1], t.dims[2]}, one[3] = {1, 1, 1}, d[2];
  st[dim] = i;
  lim[dim] = i + 1;
  for (int a = 0, k = 0; a < 3; a++)
    if (a != dim) d[k++] = t.dims[a];
  return tpu_hlo_reshape(EL->hlo, tpu_hlo_slice(EL->hlo, x, st, lim, one), 2, d);
}
/* Entry i of x [B, m]: [B]. */
static tpu_hv eg_el(eg_ctx *c, tpu_hv x, int64_t i) {
  const tpu_hlo_type *t = T(EL, x);
  int64_t st[2] = {0, i}, lim[2] = {t->dims[0], i + 1}, one[2] = {1, 1};
  return tpu_hlo_reshape(EL->hlo, tpu_hlo_slice(EL->hlo, x, st, lim, one), 1, t->dims);
}
/* Two [B, m] vectors stacked along `dim` (1 or 2) into [B, 2, m] or [B, m, 2]. */
static tpu_hv eg_stack2(eg_ctx *c, tpu_hv a, tpu_hv b, int dim) {
  const tpu_hlo_type *t = T(EL, a);
  int64_t d[3] = {t->dims[0], dim == 1 ? 1 : t->dims[1], dim == 1 ? t->dims[1] : 1};
  tpu_hv xs[2] = {tpu_hlo_reshape(EL->hlo, a, 3, d), tpu_hlo_reshape(EL->hlo, b, 3, d)};
  return tpu_hlo_concat(EL->hlo, xs, 2, dim);
}

static bool eg_while(eg_ctx *c, const tpu_hv *init, int n, int cond, int body, tpu_hv *outs) {
  tpu_hlo_type ts[16];
  for (int i = 0; i < n; i++) ts[i] = *T(EL, init[i]);
  int regions[2] = {cond, body};
  return tpu_hlo_emit(EL->hlo, "stablehlo.while", init, n, regions, 2, NULL, ts, n, outs);
}
static void eg_types(eg_ctx *c, const tpu_hv *v, int n, tpu_hlo_type *ts) {
  for (int i = 0; i < n; i++) ts[i] = *T(EL, v[i]);
}
/* cond region: carried value 0 (0-d s64) < carried value `lim` (0-d s64), or < limit when lim < 0. */
static int eg_count_cond(eg_ctx *c, const tpu_hlo_type *ts, int n, int lim, int64_t limit) {
  tpu_hv a[16];
  tpu_hlo_region_begin(EL->hlo, ts, n, a);
  tpu_hv r = eg_cmp(c, TPU_HLO_LT, a[0], lim >= 0 ? a[lim] : eg_i(c, limit));
  return tpu_hlo_region_end(EL->hlo, &r, 1);
}

/* ---- 1. Hessenberg reduction ------------------------------------------------------------- */

/* One Householder step at 0-d k: zero column k below row k+1; A <- P A P, Q <- Q P. */
static void eg_hess_step(eg_ctx *c, tpu_hv k, tpu_hv *A, tpu_hv *Q) {
  tpu_hlo *h = EL->hlo;
  int64_t d2[2] = {c->B, c->n};
  tpu_hv col = tpu_hlo_reshape(h, eg_block(c, *A, eg_i(c, 0), k, c->n, 1), 2, d2);
  tpu_hv rows = eg_iota(c, 2, 1), kb = eg_bk(c, k, 2);
  tpu_hv k1 = eg_add(c, kb, tpu_lower_full(EL, eg_t(TPU_S64, 2, c->B, c->n), 1));
  tpu_hv x = eg_sel(c, eg_cmp(c, TPU_HLO_GT, rows, kb), col, eg_k(c, col, 0));
  tpu_hv top = eg_cmp(c, TPU_HLO_EQ, rows, k1);
  tpu_hv alpha = eg_sum(c, eg_sel(c, top, x, eg_k(c, x, 0)), 1); /* [B] */
  /* the norm of x, scaled by its largest magnitude */
  tpu_hv ax = eg_abs(c, x);
  tpu_hv mx = eg_rmax(c, ax, 1);
  tpu_hv zero = eg_cmp(c, TPU_HLO_EQ, mx, eg_k(c, mx, 0));
  tpu_hv mxs = eg_sel(c, zero, eg_k(c, mx, 1), mx);
  tpu_hv xs = eg_div(c, ax, eg_b2(c, mxs));
  tpu_hv nrm = eg_mul(c, mxs, eg_sqrt(c, eg_sum(c, eg_mul(c, xs, xs), 1)));
  tpu_hv aa = eg_abs(c, alpha);
  tpu_hv az = eg_cmp(c, TPU_HLO_EQ, aa, eg_k(c, aa, 0));
  tpu_hv phase = eg_sel(c, az, eg_k(c, alpha, 1), eg_div(c, alpha, eg_tocx(c, eg_sel(c, az, eg_k(c, aa, 1), aa))));
  /* v = (x - beta e_{k+1}) / (alpha - beta) with beta = -phase |x|, so v_{k+1} = 1
   * and alpha - beta = phase (|alpha| + |x|); then v^H v = 2 |x| / (|x| + |alpha|)
   * and the reflector I - tau v v^H has tau = 2 / v^H v = (|x| + |alpha|) / |x|. */
  tpu_hv apn = eg_add(c, aa, nrm);
  tpu_hv apns = eg_sel(c, zero, eg_k(c, apn, 1), apn);
  tpu_hv scl = eg_div(c, eg_conj(c, phase), eg_tocx(c, apns));
  tpu_hv v = eg_sel(c, top, eg_k(c, x, 1), eg_mul(c, x, eg_b2(c, scl)));
  tpu_hv nrms = eg_sel(c, zero, eg_k(c, nrm, 1), nrm);
  tpu_hv tau = eg_sel(c, zero, eg_k(c, nrm, 0), eg_div(c, apn, nrms));
  tpu_hv tb = eg_b3s(c, eg_tocx(c, tau));
  tpu_hv vc = eg_conj(c, v);
  /* A <- A - tau v (v^H A); A <- A - tau (A v) v^H; Q <- Q - tau (Q v) v^H */
  tpu_hv w = eg_dot(c, vc, *A, 1, 1); /* [B, n] */
  tpu_hv a1 = eg_sub(c, *A, eg_mul(c, tb, eg_mul(c, eg_b3(c, v, 1), eg_b3(c, w, 2))));
  tpu_hv u = eg_dot(c, a1, v, 2, 1);
  *A = eg_sub(c, a1, eg_mul(c, tb, eg_mul(c, eg_b3(c, u, 1), eg_b3(c, vc, 2))));
  tpu_hv q = eg_dot(c, *Q, v, 2, 1);
  *Q = eg_sub(c, *Q, eg_mul(c, tb, eg_mul(c, eg_b3(c, q, 1), eg_b3(c, vc, 2))));
}

static bool eg_hessenberg(eg_ctx *c, tpu_hv *A, tpu_hv *Q) {
  if (c->n < 3) return true;
  tpu_hv init[3] = {eg_i(c, 0), *A, *Q};
  tpu_hlo_type ts[3];
  eg_types(c, init, 3, ts);
  int cond = eg_count_cond(c, ts, 3, -1, c->n - 2);
  tpu_hv v[3];
  tpu_hlo_region_begin(EL->hlo, ts, 3, v);
  tpu_hv a = v[1], q = v[2];
  eg_hess_step(c, v[0], &a, &q);
  tpu_hv outs[3] = {eg_add(c, v[0], eg_i(c, 1)), a, q};
  int body = tpu_hlo_region_end(EL->hlo, outs, 3);
  tpu_hv fin[3];
  if (!eg_while(c, init, 3, cond, body, fin)) return false;
  /* exact zeros below the subdiagonal */
  tpu_hv below = eg_cmp(c, TPU_HLO_GT, eg_iota(c, 3, 1),
                        eg_add(c, eg_iota(c, 3, 2), tpu_lower_full(EL, eg_t(TPU_S64, 3, c->B, c->n), 1)));
  *A = eg_sel(c, below, eg_k(c, fin[1], 0), fin[1]);
  *Q = fin[2];
  return true;
}

/* ---- 2. shifted QR iteration ------------------------------------------------------------- */

/* Givens rotation G = [[cs, sn], [-conj(sn), cs]] (cs real) with G [x; y] = [r; 0]. */
static void eg_givens(eg_ctx *c, tpu_hv x, tpu_hv y, tpu_hv *cs, tpu_hv *sn) {
  tpu_hv ax = eg_abs(c, x), ay = eg_abs(c, y);
  tpu_hv m = eg_max(c, ax, ay);
  tpu_hv mz = eg_cmp(c, TPU_HLO_EQ, m, eg_k(c, m, 0));
  tpu_hv ms = eg_sel(c, mz, eg_k(c, m, 1), m);
  tpu_hv sx = eg_div(c, ax, ms), sy = eg_div(c, ay, ms);
  tpu_hv nrm = eg_mul(c, ms, eg_sqrt(c, eg_add(c, eg_mul(c, sx, sx), eg_mul(c, sy, sy))));
  tpu_hv nrms = eg_sel(c, mz, eg_k(c, nrm, 1), nrm);
  tpu_hv xz = eg_cmp(c, TPU_HLO_EQ, ax, eg_k(c, ax, 0));
  tpu_hv phase = eg_sel(c, xz, eg_k(c, x, 1), eg_div(c, x, eg_tocx(c, eg_sel(c, xz, eg_k(c, ax, 1), ax))));
  tpu_hv co = eg_sel(c, mz, eg_k(c, ax, 1), eg_div(c, ax, nrms));
  tpu_hv si = eg_div(c, eg_mul(c, phase, eg_conj(c, y)), eg_tocx(c, nrms));
  *cs = co;
  *sn = eg_sel(c, mz, eg_k(c, si, 0), si);
}

/* One bulge-chasing rotation at row k (0-d) of H, for the batch elements whose
 * window [lo, hi] holds k (act): the first uses the shift mu. Applied to rows
 * k, k+1 and columns k, k+1 of H (whole rows and columns: deflated entries are
 * exact zeros and stay so) and to columns k, k+1 of Z. */
static void eg_qr_rot(eg_ctx *c, tpu_hv k, tpu_hv lo, tpu_hv hi, tpu_hv mu, tpu_hv act, tpu_hv *Hm, tpu_hv *Z) {
  tpu_hlo *h = EL->hlo;
  int64_t B = c->B;
  tpu_hv kb = tpu_hlo_broadcast_in_dim(h, k, 1, &B, NULL);
  tpu_hv on = eg_and(c, act, eg_and(c, eg_cmp(c, TPU_HLO_LE, lo, kb), eg_cmp(c, TPU_HLO_LT, kb, hi)));
  tpu_hv first = eg_cmp(c, TPU_HLO_EQ, kb, lo);
  tpu_hv k0 = eg_cmp(c, TPU_HLO_EQ, k, eg_i(c, 0));
  tpu_hv km1 = eg_max(c, eg_sub(c, k, eg_i(c, 1)), eg_i(c, 0));
  tpu_hv blk = eg_block(c, *Hm, k, km1, 2, 2);                   /* rows k, k+1; columns km1, km1+1 */
  tpu_hv c0 = eg_take(c, blk, 2, 0), c1 = eg_take(c, blk, 2, 1); /* [B, 2] */
  tpu_hv colk = eg_sel(c, tpu_hlo_broadcast_in_dim(h, k0, 2, T(EL, c0)->dims, NULL), c0, c1);
  tpu_hv xk = eg_el(c, colk, 0), yk = eg_el(c, colk, 1), xm = eg_el(c, c0, 0), ym = eg_el(c, c0, 1);
  tpu_hv x = eg_sel(c, first, eg_sub(c, xk, mu), xm), y = eg_sel(c, first, yk, ym);
  tpu_hv cs, sn;
  eg_givens(c, x, y, &cs, &sn);
  cs = eg_sel(c, on, cs, eg_k(c, cs, 1));
  sn = eg_sel(c, on, sn, eg_k(c, sn, 0));
  tpu_hv ccx = eg_b2(c, eg_tocx(c, cs)), sb = eg_b2(c, sn), sc = eg_b2(c, eg_conj(c, sn));
  /* rows: r1 <- cs r1 + sn r2, r2 <- -conj(sn) r1 + cs r2; the chased bulge becomes an exact 0 */
  tpu_hv R = eg_block(c, *Hm, k, eg_i(c, 0), 2, c->n);
  tpu_hv r1 = eg_take(c, R, 1, 0), r2 = eg_take(c, R, 1, 1);
  tpu_hv n1 = eg_add(c, eg_mul(c, ccx, r1), eg_mul(c, sb, r2));
  tpu_hv n2 = eg_sub(c, eg_mul(c, ccx, r2), eg_mul(c, sc, r1));
  tpu_hv bulge =
      eg_and(c, eg_cmp(c, TPU_HLO_EQ, eg_iota(c, 2, 1), eg_bk(c, km1, 2)),
             tpu_hlo_broadcast_in_dim(h, eg_and(c, on, eg_not(c, first)), 2, T(EL, n2)->dims, (int64_t[]){0}));
  n2 = eg_sel(c, bulge, eg_k(c, n2, 0), n2);
  *Hm = eg_put(c, *Hm, eg_stack2(c, n1, n2, 1), k, eg_i(c, 0));
  /* columns: h1 <- cs h1 + conj(sn) h2, h2 <- -sn h1 + cs h2 */
  tpu_hv *mats[2] = {Hm, Z};
  for (int i = 0; i < 2; i++) {
    tpu_hv Cc = eg_block(c, *mats[i], eg_i(c, 0), k, c->n, 2);
    tpu_hv h1 = eg_take(c, Cc, 2, 0), h2 = eg_take(c, Cc, 2, 1);
    tpu_hv m1 = eg_add(c, eg_mul(c, ccx, h1), eg_mul(c, sc, h2));
    tpu_hv m2 = eg_sub(c, eg_mul(c, ccx, h2), eg_mul(c, sb, h1));
    *mats[i] = eg_put(c, *mats[i], eg_stack2(c, m1, m2, 2), eg_i(c, 0), k);
  }
}

/* The shift of each window: Wilkinson's (the eigenvalue of the trailing 2x2
 * nearer its last diagonal entry), or an exceptional one after 10 and 20 steps
 * without deflation (as LAPACK's zlahqr: a diagonal entry plus 3/4 of the
 * magnitude of the subdiagonal beside it, at the bottom or at the top). */
static tpu_hv eg_shift(eg_ctx *c, tpu_hv Hm, tpu_hv lo, tpu_hv hi, tpu_hv its) {
  tpu_hv one = eg_k(c, hi, 1), him = eg_max(c, eg_sub(c, hi, one), eg_k(c, hi, 0));
  tpu_hv a = eg_at(c, Hm, him, him), b = eg_at(c, Hm, him, hi), cc = eg_at(c, Hm, hi, him), d = eg_at(c, Hm, hi, hi);
  /* scaled, so that the squares cannot overflow */
  tpu_hv s = eg_add(c, eg_add(c, eg_abs(c, a), eg_abs(c, b)), eg_add(c, eg_abs(c, cc), eg_abs(c, d)));
  tpu_hv sz = eg_cmp(c, TPU_HLO_EQ, s, eg_k(c, s, 0));
  tpu_hv sc = eg_tocx(c, eg_sel(c, sz, eg_k(c, s, 1), s));
  a = eg_div(c, a, sc), b = eg_div(c, b, sc), cc = eg_div(c, cc, sc);
  tpu_hv ds = eg_div(c, d, sc);
  tpu_hv p = eg_mul(c, eg_sub(c, a, ds), eg_k(c, a, 0.5));
  tpu_hv bc = eg_mul(c, b, cc);
  tpu_hv q = eg_sqrt(c, eg_add(c, eg_mul(c, p, p), bc));
  tpu_hv pp = eg_add(c, p, q), pm = eg_sub(c, p, q);
  tpu_hv den = eg_sel(c, eg_cmp(c, TPU_HLO_GE, eg_abs(c, pp), eg_abs(c, pm)), pp, pm);
  tpu_hv dz = eg_cmp(c, TPU_HLO_EQ, eg_abs(c, den), eg_k(c, s, 0));
  tpu_hv corr = eg_sel(c, dz, eg_k(c, den, 0), eg_div(c, bc, eg_sel(c, dz, eg_k(c, den, 1), den)));
  tpu_hv mu = eg_mul(c, eg_sub(c, ds, corr), sc);
  /* exceptional shifts */
  tpu_hv lo1 = eg_add(c, lo, one);
  tpu_hv top =
      eg_add(c, eg_at(c, Hm, lo, lo), eg_tocx(c, eg_mul(c, eg_k(c, s, 0.75), eg_abs(c, eg_at(c, Hm, lo1, lo)))));
  tpu_hv bot = eg_add(c, d, eg_tocx(c, eg_mul(c, eg_k(c, s, 0.75), eg_abs(c, eg_at(c, Hm, hi, him)))));
  tpu_hv r20 = tpu_hlo_binary(EL->hlo, TPU_HLO_REM, its, eg_k(c, its, 20));
  tpu_hv ex10 = eg_cmp(c, TPU_HLO_EQ, r20, eg_k(c, its, 10));
  tpu_hv ex20 = eg_and(c, eg_cmp(c, TPU_HLO_EQ, r20, eg_k(c, its, 0)), eg_cmp(c, TPU_HLO_GT, its, eg_k(c, its, 0)));
  return eg_sel(c, ex10, bot, eg_sel(c, ex20, top, mu));
}

/* One QR step of every unconverged window: deflation, shift, bulge chase. */
static void eg_qr_step(eg_ctx *c, tpu_hv *Hm, tpu_hv *Z, tpu_hv *hi, tpu_hv *its) {
  tpu_hlo *h = EL->hlo;
  int64_t B = c->B, n = c->n;
  tpu_hlo_type vt = eg_t(TPU_S64, 2, B, n);
  /* negligible subdiagonal entries (LAPACK's test) become exact zeros */
  tpu_hv d = eg_abs(c, eg_diag(c, *Hm, 0)), sub = eg_abs(c, eg_diag(c, *Hm, -1));
  int64_t lo0[2] = {0, 1}, hi0[2] = {0, -1}, in0[2] = {0, 0};
  tpu_hv dprev = tpu_hlo_pad(h, d, tpu_hlo_constant(h, c->R, 0), lo0, hi0, in0);
  tpu_hv tst = eg_add(c, d, dprev);
  tpu_hv negl = eg_or(c, eg_cmp(c, TPU_HLO_LE, sub, eg_mul(c, eg_k(c, tst, c->ulp), tst)),
                      eg_cmp(c, TPU_HLO_LE, sub, eg_k(c, sub, c->smlnum)));
  tpu_hv subpos = eg_cmp(c, TPU_HLO_EQ, eg_iota(c, 3, 2),
                         eg_sub(c, eg_iota(c, 3, 1), tpu_lower_full(EL, eg_t(TPU_S64, 3, B, n), 1)));
  tpu_hv kill = eg_and(c, subpos, eg_b3(c, negl, 1));
  *Hm = eg_sel(c, kill, eg_k(c, *Hm, 0), *Hm);
  /* hi: the last row at or above the old hi whose subdiagonal is not negligible (0: done) */
  tpu_hv idx = eg_iota(c, 2, 1), zi = tpu_lower_full(EL, vt, 0);
  tpu_hv le_hi = eg_cmp(c, TPU_HLO_LE, idx, eg_b2(c, *hi));
  tpu_hv nhi = eg_rmax(c, eg_sel(c, eg_and(c, le_hi, eg_not(c, negl)), idx, zi), 1);
  tpu_hv nits = eg_sel(c, eg_cmp(c, TPU_HLO_LT, nhi, *hi), eg_k(c, *its, 0), *its);
  tpu_hv lo = eg_rmax(c, eg_sel(c, eg_and(c, eg_cmp(c, TPU_HLO_LE, idx, eg_b2(c, nhi)), negl), idx, zi), 1);
  tpu_hv act = eg_cmp(c, TPU_HLO_GT, nhi, eg_k(c, nhi, 0));
  tpu_hv hs = eg_max(c, nhi, eg_k(c, nhi, 1)); /* a valid row for the shift of a finished element */
  tpu_hv mu = eg_shift(c, *Hm, eg_sel(c, act, lo, eg_k(c, lo, 0)), hs, nits);
  /* the rows the chase visits: from the lowest lo to the highest hi of the active windows */
  tpu_hv k0 = eg_rmin(c, eg_sel(c, act, lo, eg_k(c, lo, (double)n)), 0);
  tpu_hv k1 = eg_rmax(c, eg_sel(c, act, nhi, eg_k(c, nhi, 0)), 0);
  tpu_hv init[8] = {k0, k1, *Hm, *Z, lo, nhi, mu, act};
  tpu_hlo_type ts[8];
  eg_types(c, init, 8, ts);
  int cond = eg_count_cond(c, ts, 8, 1, 0);
  tpu_hv v[8];
  tpu_hlo_region_begin(h, ts, 8, v);
  tpu_hv hm = v[2], z = v[3];
  eg_qr_rot(c, v[0], v[4], v[5], v[6], v[7], &hm, &z);
  tpu_hv outs[8] = {eg_add(c, v[0], eg_i(c, 1)), v[1], hm, z, v[4], v[5], v[6], v[7]};
  int body = tpu_hlo_region_end(h, outs, 8);
  tpu_hv fin[8];
  if (!eg_while(c, init, 8, cond, body, fin)) return;
  *Hm = fin[2];
  *Z = fin[3];
  *hi = nhi;
  *its = eg_add(c, nits, tpu_hlo_convert(h, act, TPU_S64));
}

/* The Schur form of Hessenberg *Hm, rotations accumulated into *Z; *done: [B]
 * pred, whether each element converged within the iteration bound. */
static bool eg_schur(eg_ctx *c, tpu_hv *Hm, tpu_hv *Z, tpu_hv *done) {
  tpu_hlo *h = EL->hlo;
  int64_t B = c->B, n = c->n;
  tpu_hlo_type bt = tpu_hlo_type_make(TPU_S64, 1, &B);
  int64_t maxit = 30 * (n > 10 ? n : 10);
  tpu_hv init[5] = {eg_i(c, 0), *Hm, *Z, tpu_lower_full(EL, bt, (double)(n - 1)), tpu_lower_full(EL, bt, 0)};
  tpu_hlo_type ts[5];
  eg_types(c, init, 5, ts);
  tpu_hv a[5];
  int64_t d0 = 0;
  tpu_hlo_region_begin(h, ts, 5, a);
  tpu_hv pos = eg_cmp(c, TPU_HLO_GT, a[3], eg_k(c, a[3], 0));
  tpu_hv any = tpu_hlo_reduce(h, pos, tpu_hlo_constant_int(h, TPU_PRED, 0), &d0, 1, TPU_HLO_OR);
  tpu_hv r = eg_and(c, eg_cmp(c, TPU_HLO_LT, a[0], eg_i(c, maxit)), any);
  int cond = tpu_hlo_region_end(h, &r, 1);
  tpu_hv v[5];
  tpu_hlo_region_begin(h, ts, 5, v);
  tpu_hv hm = v[1], z = v[2], hi = v[3], its = v[4];
  eg_qr_step(c, &hm, &z, &hi, &its);
  tpu_hv outs[5] = {eg_add(c, v[0], eg_i(c, 1)), hm, z, hi, its};
  int body = tpu_hlo_region_end(h, outs, 5);
  tpu_hv fin[5];
  if (!eg_while(c, init, 5, cond, body, fin)) return false;
  /* the final deflation test may have zeroed the last subdiagonal without a step:
   * an element is done when no subdiagonal entry above its hi is left */
  tpu_hv t = fin[1], hz = fin[3];
  tpu_hv d = eg_abs(c, eg_diag(c, t, 0)), sub = eg_abs(c, eg_diag(c, t, -1));
  int64_t lo0[2] = {0, 1}, hi0[2] = {0, -1}, in0[2] = {0, 0};
  tpu_hv tst = eg_add(c, d, tpu_hlo_pad(h, d, tpu_hlo_constant(h, c->R, 0), lo0, hi0, in0));
  tpu_hv negl = eg_or(c, eg_cmp(c, TPU_HLO_LE, sub, eg_mul(c, eg_k(c, tst, c->ulp), tst)),
                      eg_cmp(c, TPU_HLO_LE, sub, eg_k(c, sub, c->smlnum)));
  tpu_hv idx = eg_iota(c, 2, 1);
  tpu_hv left = eg_and(c, eg_cmp(c, TPU_HLO_LE, idx, eg_b2(c, hz)), eg_not(c, negl));
  int64_t d1 = 1;
  *done = eg_not(c, tpu_hlo_reduce(h, left, tpu_hlo_constant_int(h, TPU_PRED, 0), &d1, 1, TPU_HLO_OR));
  /* T: upper triangular (what is left below the diagonal is negligible) */
  tpu_hv low = eg_cmp(c, TPU_HLO_GT, eg_iota(c, 3, 1), eg_iota(c, 3, 2));
  *Hm = eg_sel(c, low, eg_k(c, t, 0), t);
  *Z = fin[2];
  return true;
}

/* ---- 3. eigenvectors ----------------------------------------------------------------- */

/* Y [B, n, n], upper triangular with unit diagonal: column j solves
 * (T - lambda_j I) y = 0, by back substitution over the rows, bottom up (a
 * near-zero pivot is replaced by max(ulp |lambda_j|, smlnum), as LAPACK's
 * trevc does); each column is rescaled when it grows past 1. */
static tpu_hv eg_tri_vectors(eg_ctx *c, tpu_hv Tm, tpu_hv lam) {
  tpu_hlo *h = EL->hlo;
  int64_t n = c->n, d2[2] = {c->B, n};
  tpu_hv eye = eg_tocx(c, tpu_hlo_convert(h, eg_cmp(c, TPU_HLO_EQ, eg_iota(c, 3, 1), eg_iota(c, 3, 2)), c->R));
  if (n < 2) return eye;
  tpu_hv init[4] = {eg_i(c, 0), eye, Tm, lam};
  tpu_hlo_type ts[4];
  eg_types(c, init, 4, ts);
  int cond = eg_count_cond(c, ts, 4, -1, n - 1);
  tpu_hv v[4];
  tpu_hlo_region_begin(h, ts, 4, v);
  tpu_hv i = eg_sub(c, eg_i(c, n - 2), v[0]);
  tpu_hv Y = v[1], Tt = v[2], lm = v[3];
  tpu_hv row = tpu_hlo_reshape(h, eg_block(c, Tt, i, eg_i(c, 0), 1, n), 2, d2);
  tpu_hv idx = eg_iota(c, 2, 1), ib = eg_bk(c, i, 2);
  tpu_hv right = eg_cmp(c, TPU_HLO_GT, idx, ib);
  tpu_hv tii = eg_sum(c, eg_sel(c, eg_cmp(c, TPU_HLO_EQ, idx, ib), row, eg_k(c, row, 0)), 1);
  tpu_hv s = eg_dot(c, eg_sel(c, right, row, eg_k(c, row, 0)), Y, 1, 1); /* [B, n] */
  tpu_hv den = eg_sub(c, eg_b2(c, tii), lm);
  tpu_hv smin = eg_max(c, eg_mul(c, eg_abs(c, lm), eg_k(c, eg_abs(c, lm), c->ulp)), eg_k(c, eg_abs(c, lm), c->smlnum));
  den = eg_sel(c, eg_cmp(c, TPU_HLO_LT, eg_abs(c, den), smin), eg_tocx(c, smin), den);
  tpu_hv yi = eg_div(c, tpu_hlo_unary(h, TPU_HLO_NEG, s), den);
  tpu_hv old = tpu_hlo_reshape(h, eg_block(c, Y, i, eg_i(c, 0), 1, n), 2, d2);
  yi = eg_sel(c, right, yi, old);
  int64_t d3[3] = {c->B, 1, n};
  Y = eg_put(c, Y, tpu_hlo_reshape(h, yi, 3, d3), i, eg_i(c, 0));
  tpu_hv cm = eg_rmax(c, eg_abs(c, Y), 1); /* [B, n] */
  tpu_hv big = eg_cmp(c, TPU_HLO_GT, cm, eg_k(c, cm, 1));
  tpu_hv scale = eg_sel(c, big, eg_div(c, eg_k(c, cm, 1), eg_sel(c, big, cm, eg_k(c, cm, 1))), eg_k(c, cm, 1));
  Y = eg_mul(c, Y, eg_b3(c, eg_tocx(c, scale), 2));
  tpu_hv outs[4] = {eg_add(c, v[0], eg_i(c, 1)), Y, Tt, lm};
  int body = tpu_hlo_region_end(h, outs, 4);
  tpu_hv fin[4];
  if (!eg_while(c, init, 4, cond, body, fin)) return TPU_HV_NONE;
  return fin[1];
}

/* Columns of V scaled to unit norm, then by the phase that makes their
 * largest-magnitude component (the first of equals) real and positive. */
static tpu_hv eg_normalize(eg_ctx *c, tpu_hv V) {
  tpu_hv av = eg_abs(c, V);
  tpu_hv mx = eg_rmax(c, av, 1); /* [B, n] */
  tpu_hv mz = eg_cmp(c, TPU_HLO_EQ, mx, eg_k(c, mx, 0));
  tpu_hv mxs = eg_sel(c, mz, eg_k(c, mx, 1), mx);
  tpu_hv sv = eg_div(c, av, eg_b3(c, mxs, 2));
  tpu_hv nrm = eg_mul(c, mxs, eg_sqrt(c, eg_sum(c, eg_mul(c, sv, sv), 1)));
  V = eg_div(c, V, eg_b3(c, eg_tocx(c, eg_sel(c, mz, eg_k(c, nrm, 1), nrm)), 2));
  av = eg_abs(c, V);
  mx = eg_rmax(c, av, 1);
  tpu_hv rows = eg_iota(c, 3, 1);
  tpu_hv at = eg_cmp(c, TPU_HLO_EQ, av, eg_b3(c, mx, 2));
  tpu_hv kmax = eg_rmin(c, eg_sel(c, at, rows, eg_k(c, rows, (double)c->n)), 1); /* [B, n] */
  tpu_hv pick = eg_cmp(c, TPU_HLO_EQ, rows, eg_b3(c, kmax, 2));
  tpu_hv vk = eg_sum(c, eg_sel(c, pick, V, eg_k(c, V, 0)), 1);
  tpu_hv ak = eg_abs(c, vk);
  tpu_hv kz = eg_cmp(c, TPU_HLO_EQ, ak, eg_k(c, ak, 0));
  tpu_hv ph = eg_sel(c, kz, eg_k(c, vk, 1), eg_div(c, eg_conj(c, vk), eg_tocx(c, eg_sel(c, kz, eg_k(c, ak, 1), ak))));
  V = eg_mul(c, V, eg_b3(c, ph, 2));
  /* the component made real is exactly real */
  tpu_hv re = eg_tocx(c, eg_re(c, V));
  return eg_sel(c, pick, re, V);
}

/* ---- the emitters ---------------------------------------------------------------------- */

/* torch's checks, in its order; returns the complex result dtype or TPU_INVALID. */
static tpu_dtype eg_check(tpu_lower *L, const char *fn) {
  tpu_tref *t = &L->args[0].t;
  tpu_dtype dt = t->dtype;
  if (!tpu_dtype_is_float(dt) && !tpu_dtype_is_complex(dt)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Unknown Complex ScalarType for %s", tpu_dtype_name(dt));
    return TPU_INVALID;
  }
  if (t->rank < 2) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: The input tensor A must have at least 2 dimensions.", fn);
    return TPU_INVALID;
  }
  if (t->sizes[t->rank - 1] != t->sizes[t->rank - 2]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: A must be batches of square matrices, but they are %lld by %lld matrices",
                   fn, (long long)t->sizes[t->rank - 2], (long long)t->sizes[t->rank - 1]);
    return TPU_INVALID;
  }
  if (dt != TPU_F32 && dt != TPU_F64 && dt != TPU_C64 && dt != TPU_C128) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"linalg_eig_out_cpu\" not implemented for '%s'", tpu_dtype_name(dt));
    return TPU_INVALID;
  }
  return (dt == TPU_F64 || dt == TPU_C128) ? TPU_C128 : TPU_C64;
}

/* Eigenvalues [..., n] and (vectors) eigenvectors [..., n, n] of argument 0. */
static void eg_run(tpu_lower *L, const char *fn, bool vectors) {
  tpu_dtype C = eg_check(L, fn);
  if (C == TPU_INVALID) return;
  tpu_tref *tr = &L->args[0].t;
  int r = tr->rank;
  int64_t n = tr->sizes[r - 1], B = 1;
  for (int i = 0; i < r - 2; i++) B *= tr->sizes[i];
  int64_t wd[TPU_MAX_RANK];
  memcpy(wd, tr->sizes, sizeof(int64_t) * (size_t)r);
  tpu_hlo_type wt = tpu_hlo_type_make(C, r - 1, wd), vt = tpu_hlo_type_make(C, r, wd);
  tpu_hv a = tpu_lower_tensor(L, 0, -1);
  if (B == 0 || n == 0) {
    tpu_lower_out(L, tpu_lower_full(L, wt, 0));
    if (vectors) tpu_lower_out(L, tpu_lower_full(L, vt, 0));
    return;
  }
  if (vectors) { /* as torch's CPU kernel: eig refuses non-finite input (eigvals does not) */
    tpu_hv fin = tpu_hlo_unary(L->hlo, TPU_HLO_IS_FINITE, tpu_hlo_unary(L->hlo, TPU_HLO_ABS, a));
    tpu_lower_check(L, tpu_hlo_unary(L->hlo, TPU_HLO_NOT, fin), TPU_ERR_RUNTIME,
                    "torch.linalg.eig: input tensor should not contain infs or NaNs.");
  }
  eg_ctx cx = {L, C == TPU_C128 ? TPU_F64 : TPU_F32, C, B, n, 0, 0};
  eg_ctx *c = &cx;
  cx.ulp = C == TPU_C128 ? DBL_EPSILON : FLT_EPSILON;
  cx.smlnum = (C == TPU_C128 ? DBL_MIN : FLT_MIN) * ((double)n / cx.ulp);
  int64_t d3[3] = {B, n, n};
  tpu_hv A = tpu_hlo_reshape(L->hlo, tpu_hlo_convert(L->hlo, a, C), 3, d3), a3 = A;
  tpu_hv Z = eg_tocx(c, tpu_hlo_convert(L->hlo, eg_cmp(c, TPU_HLO_EQ, eg_iota(c, 3, 1), eg_iota(c, 3, 2)), cx.R));
  /* as LAPACK's geev: a matrix whose largest entry is outside [sqrt(safmin) / ulp,
   * its inverse] is scaled by that entry, and the eigenvalues back */
  int64_t d12[2] = {1, 2};
  tpu_hv anrm = tpu_hlo_reduce(L->hlo, eg_abs(c, A), tpu_hlo_constant(L->hlo, cx.R, 0), d12, 2, TPU_HLO_MAX);
  double lo_t = sqrt(C == TPU_C128 ? DBL_MIN : FLT_MIN) / cx.ulp;
  tpu_hv outside = eg_and(
      c, eg_cmp(c, TPU_HLO_GT, anrm, eg_k(c, anrm, 0)),
      eg_or(c, eg_cmp(c, TPU_HLO_LT, anrm, eg_k(c, anrm, lo_t)), eg_cmp(c, TPU_HLO_GT, anrm, eg_k(c, anrm, 1 / lo_t))));
  tpu_hv scale = eg_tocx(c, eg_sel(c, outside, anrm, eg_k(c, anrm, 1)));
  A = eg_div(c, A, eg_b3s(c, scale));
  tpu_hv done = TPU_HV_NONE;
  if (!eg_hessenberg(c, &A, &Z)) return;
  if (n > 1 && !eg_schur(c, &A, &Z, &done)) return;
  if (done != TPU_HV_NONE) {
    /* non-finite input gives NaN results, not this error (eig refuses it above;
     * the CPU's eigvals has undefined behaviour there) */
    int64_t d12b[2] = {1, 2};
    tpu_hv fin = tpu_hlo_unary(L->hlo, TPU_HLO_IS_FINITE, eg_abs(c, a3));
    done =
        eg_or(c, done,
              eg_not(c, tpu_hlo_reduce(L->hlo, fin, tpu_hlo_constant_int(L->hlo, TPU_PRED, 1), d12b, 2, TPU_HLO_AND)));
    tpu_lower_check(
        L, eg_not(c, done), TPU_ERR_RUNTIME,
        vectors ? "torch.linalg.eig: The algorithm failed to converge because the input matrix is ill-conditioned "
                  "or has too many repeated eigenvalues."
                : "torch.linalg.eigvals: The algorithm failed to converge because the input matrix is "
                  "ill-conditioned or has too many repeated eigenvalues.");
  }
  tpu_hv lam = eg_diag(c, A, 0);
  tpu_lower_out(L, tpu_hlo_reshape(L->hlo, eg_mul(c, lam, eg_b2(c, scale)), wt.rank, wt.dims));
  if (!vectors) return;
  tpu_hv Y = eg_tri_vectors(c, A, lam);
  tpu_hv V = eg_normalize(c, eg_dot(c, Z, Y, 2, 1));
  tpu_lower_out(L, tpu_hlo_reshape(L->hlo, V, vt.rank, vt.dims));
}

/* linalg_eig(self) and linalg_eig.out(self, *, eigenvalues, eigenvectors) */
void tpu_emit_linalg_eig(tpu_lower *L) { eg_run(L, "linalg.eig", true); }

/* _linalg_eigvals(self) and linalg_eigvals.out(self, *, out) */
void tpu_emit_linalg_eigvals(tpu_lower *L) { eg_run(L, "linalg.eigvals", false); }

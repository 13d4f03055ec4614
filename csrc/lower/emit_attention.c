/* emit_attention.c: scaled dot-product attention as one op and its backward.
 *
 * torch's scaled_dot_product_attention has no kernel choice for a device
 * registered from Python: it falls back to its math composition, about 15
 * ops forward (a causal mask built from ones and tril, two matmuls, a safe
 * softmax with its isneginf and all checks) and as many backward, each
 * dispatched and recorded. Here the whole attention is one op (the
 * binding routes it through aten's overrideable fused-attention pair, whose
 * autograd formula calls the backward below): scores = scale * q k^T plus
 * the mask, a softmax over the keys that gives 0 for a row with no key to
 * attend to (as the math composition's safe softmax does), and its
 * log-sum-exp, kept for the backward, which recomputes the probabilities
 * from it instead of saving them (renormalised: see the backward).
 *
 * Shapes: q [B..., L, E], k [B..., S, E], v [B..., S, Ev], the same batch
 * dims (the binding sends anything else to the math composition); a mask
 * broadcasts to [B..., L, S], bool (True attends) or additive.
 *
 * Half inputs: every product takes its operands in the input dtype with an
 * f32 result, the probabilities (and the score gradient) rounded to the
 * input dtype first, as torch's CPU flash kernel does and as a TPU's matrix
 * unit takes them; the softmax itself is f32. */
#include <math.h>

#include "emit.h"

/* What both directions share: the batch dims, dtypes, scale and the masked,
 * scaled scores s [B..., L, S] (acc dtype). q, k are arguments iq, iq + 1,
 * the mask im (may be None), is_causal ic, scale is (None: 1/sqrt(E)). */
typedef struct {
  int r, nb;
  int64_t bd[TPU_MAX_RANK]; /* 0 .. nb-1 */
  tpu_dtype dt, acc;
  double scale;
  tpu_hv s;
} tpu_attn;

static void tpu_attn_begin(tpu_lower *L, int iq, int im, int ic, int is, tpu_attn *A) {
  tpu_tref *q = &L->args[iq].t, *k = &L->args[iq + 1].t;
  int r = A->r = q->rank, nb = A->nb = r - 2;
  A->dt = q->dtype;
  A->acc = tpu_acc_type(q->dtype);
  int64_t sd[TPU_MAX_RANK];
  for (int i = 0; i < nb; i++) {
    A->bd[i] = i;
    sd[i] = q->sizes[i];
  }
  sd[r - 2] = q->sizes[r - 2];
  sd[r - 1] = k->sizes[r - 2];
  A->scale = tpu_lower_is_none(L, is) ? 1.0 / sqrt((double)q->sizes[r - 1]) : L->args[is].f;
  int64_t c = r - 1;
  tpu_hv s = tpu_hlo_dot_general(H, tpu_lower_input(L, iq, A->dt), tpu_lower_input(L, iq + 1, A->dt), nb, A->bd, A->bd,
                                 1, &c, &c, L->precision, A->acc);
  s = tpu_mul(L, s, tpu_k(L, s, A->scale));
  tpu_hv ninf = tpu_k(L, s, -INFINITY);
  if (!tpu_lower_is_none(L, im)) {
    if (L->args[im].t.dtype == TPU_PRED)
      s = tpu_hlo_select(H, tpu_lower_broadcast_to(L, tpu_lower_tensor(L, im, -1), r, sd), s, ninf);
    else
      s = tpu_add(L, s, tpu_lower_broadcast_to(L, tpu_lower_input(L, im, A->acc), r, sd));
  }
  if (tpu_arg_bool(L, ic)) { /* key j attends to query i when j <= i (top-left aligned, as torch) */
    tpu_hlo_type it = tpu_hlo_type_make(TPU_S64, r, sd);
    tpu_hv keep = tpu_hlo_compare(H, TPU_HLO_LE, tpu_hlo_iota(H, it, r - 1), tpu_hlo_iota(H, it, r - 2));
    s = tpu_hlo_select(H, keep, s, ninf);
  }
  A->s = s;
}

/* Output v in the dim order of int-list argument i (empty: as it is): the
 * binding returns it permuted back, a tensor with the strides torch's meta
 * kernels give (the layout of the input it follows), which compiled graphs
 * rely on when they view it. */
static int tpu_attn_out(tpu_lower *L, tpu_hv v, int i, tpu_dtype dt) {
  v = tpu_hlo_convert(H, v, dt);
  if (L->args[i].nints == T(L, v)->rank) v = tpu_hlo_transpose(H, v, L->args[i].ints);
  return tpu_lower_out(L, v);
}

/* x [B..., L] broadcast along the last dim to the shape of s [B..., L, S]. */
static tpu_hv tpu_attn_rows(tpu_lower *L, tpu_hv x, tpu_hv s) {
  const tpu_hlo_type *st = T(L, s);
  int64_t keep[TPU_MAX_RANK];
  for (int i = 0; i < st->rank - 1; i++) keep[i] = i;
  return tpu_hlo_broadcast_in_dim(H, x, st->rank, st->dims, keep);
}

/* tpu::sdpa(query, key, value, attn_mask, is_causal, scale, out_order) -> (out, logsumexp) */
void tpu_emit_sdpa(tpu_lower *L) {
  tpu_attn A;
  tpu_attn_begin(L, 0, 3, 4, 5, &A);
  tpu_hv s = A.s;
  int64_t last = A.r - 1;
  tpu_hv mx = tpu_reduce_extreme(L, s, &last, 1, true);
  mx = tpu_hlo_select(H, tpu_hlo_unary(H, TPU_HLO_IS_FINITE, mx), mx, tpu_k(L, mx, 0)); /* a row of -inf */
  tpu_hv e = tpu_hlo_unary(H, TPU_HLO_EXP, tpu_sub(L, s, tpu_attn_rows(L, mx, s)));
  tpu_hv sum = tpu_reduce_sum(L, e, &last, 1);
  /* a row with nothing to attend to: probabilities 0 (not 0/0), lse -inf */
  tpu_hv inv = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GT, sum, tpu_k(L, sum, 0)),
                              tpu_hlo_binary(H, TPU_HLO_DIV, tpu_k(L, sum, 1), sum), tpu_k(L, sum, 0));
  tpu_hv p = tpu_mul(L, e, tpu_attn_rows(L, inv, s));
  int64_t pc = A.r - 1, vc = A.r - 2;
  tpu_hv out = tpu_hlo_dot_general(H, tpu_hlo_convert(H, p, A.dt), tpu_lower_input(L, 2, A.dt), A.nb, A.bd, A.bd, 1,
                                   &pc, &vc, L->precision, A.acc);
  tpu_attn_out(L, out, 6, A.dt);
  tpu_lower_out(L, tpu_add(L, tpu_hlo_unary(H, TPU_HLO_LOG, sum), mx));
}

/* tpu::sdpa_backward(grad_out, query, key, value, attn_mask, out, logsumexp,
 * is_causal, scale, grad_mask, query_order, key_order, value_order)
 * -> (grad_query, grad_key, grad_value[, grad_mask]) */
void tpu_emit_sdpa_backward(tpu_lower *L) {
  tpu_attn A;
  tpu_attn_begin(L, 1, 4, 7, 8, &A);
  int r = A.r, nb = A.nb;
  tpu_dtype dt = A.dt, acc = A.acc;
  double scale = A.scale;
  const int64_t *bd = A.bd;
  tpu_hv s = A.s;
  int64_t rows = r - 2, cols = r - 1;
  /* P from the saved log-sum-exp, then scaled to sum to 1 again: lse is
   * rounded at its own magnitude (a row's largest score, tens here), so
   * exp(s - lse) sums to 1 only within some 100 eps; the backward's
   * cancellation below needs probabilities that sum to 1 to within
   * rounding, as the saved softmax of the math composition does. */
  tpu_hv lse = tpu_attn_rows(L, tpu_lower_input(L, 6, acc), s);
  tpu_hv p = tpu_hlo_unary(H, TPU_HLO_EXP, tpu_sub(L, s, lse));
  p = tpu_hlo_select(H, tpu_hlo_unary(H, TPU_HLO_IS_FINITE, lse), p, tpu_k(L, p, 0));
  tpu_hv ps = tpu_reduce_sum(L, p, &cols, 1);
  ps = tpu_hlo_select(H, tpu_hlo_compare(H, TPU_HLO_GT, ps, tpu_k(L, ps, 0)), ps, tpu_k(L, ps, 1));
  p = tpu_hlo_binary(H, TPU_HLO_DIV, p, tpu_attn_rows(L, ps, p));
  tpu_hv g = tpu_lower_input(L, 0, dt), pn = tpu_hlo_convert(H, p, dt);
  /* dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(P dP)); dQ = scale dS K; dK = scale dS^T Q.
   * The row term is summed from the same P and dP it is subtracted from
   * (as the softmax backward does), not as rowsum(dO out) from the saved
   * output, equal in exact arithmetic: where the softmax saturates (one
   * probability near 1) dP - rowsum cancels, and terms rounded apart (the
   * output in the input dtype, from the forward's own sums) leave their
   * rounding in a difference that should be near 0. */
  tpu_hv dv = tpu_hlo_dot_general(H, pn, g, nb, bd, bd, 1, &rows, &rows, L->precision, acc);
  tpu_hv dp = tpu_hlo_dot_general(H, g, tpu_lower_input(L, 3, dt), nb, bd, bd, 1, &cols, &cols, L->precision, acc);
  tpu_hv d = tpu_reduce_sum(L, tpu_mul(L, p, dp), &cols, 1);
  tpu_hv ds = tpu_mul(L, p, tpu_sub(L, dp, tpu_attn_rows(L, d, dp)));
  tpu_hv dsn = tpu_hlo_convert(H, ds, dt);
  tpu_hv dq = tpu_hlo_dot_general(H, dsn, tpu_lower_input(L, 2, dt), nb, bd, bd, 1, &cols, &rows, L->precision, acc);
  tpu_hv dk = tpu_hlo_dot_general(H, dsn, tpu_lower_input(L, 1, dt), nb, bd, bd, 1, &rows, &rows, L->precision, acc);
  tpu_attn_out(L, tpu_mul(L, dq, tpu_k(L, dq, scale)), 10, dt);
  tpu_attn_out(L, tpu_mul(L, dk, tpu_k(L, dk, scale)), 11, dt);
  tpu_attn_out(L, dv, 12, dt);
  if (!tpu_arg_bool(L, 9) || tpu_lower_is_none(L, 4)) return;
  /* the mask's gradient: dS summed over the dims the mask was broadcast along */
  tpu_tref *m = &L->args[4].t;
  int64_t red[TPU_MAX_RANK];
  int nred = 0, lead = r - m->rank;
  for (int i = 0; i < r; i++)
    if (i < lead || (m->sizes[i - lead] == 1 && T(L, ds)->dims[i] != 1)) red[nred++] = i;
  tpu_hv gb = nred ? tpu_reduce_sum(L, ds, red, nred) : ds;
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_hlo_reshape(H, gb, m->rank, m->sizes), m->dtype));
}

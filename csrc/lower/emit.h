/* emit.h: what the emitter files share: small inline helpers, and the
 * helpers one family defines for the others (declared here, defined in the
 * file named). */
#ifndef TPU_EMIT_H
#define TPU_EMIT_H

#include "emitters.h"

/* ---- shared shapes of emitters ------------------------------------------------------ */

static inline tpu_hlo *H_(tpu_lower *L) { return L->hlo; }
#define H H_(L)

static inline const tpu_hlo_type *T(tpu_lower *L, tpu_hv v) { return tpu_hlo_typeof(L->hlo, v); }

/* ---- one StableHLO op ----------------------------------------------------------------- */

static inline tpu_hv tpu_k(tpu_lower *L, tpu_hv like, double v) { return tpu_lower_full_like(L, like, v); }
static inline tpu_hv tpu_mul(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_MUL, a, b); }
static inline tpu_hv tpu_add(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_ADD, a, b); }
static inline tpu_hv tpu_sub(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_SUB, a, b); }
static inline tpu_hv tpu_div(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_DIV, a, b); }
static inline tpu_hv tpu_un(tpu_lower *L, tpu_hlo_op op, tpu_hv x) { return tpu_hlo_unary(H, op, x); }
static inline tpu_hv tpu_sel(tpu_lower *L, tpu_hv p, tpu_hv a, tpu_hv b) { return tpu_hlo_select(H, p, a, b); }
static inline tpu_hv tpu_cmp(tpu_lower *L, tpu_hlo_cmp d, tpu_hv a, tpu_hv b) { return tpu_hlo_compare(H, d, a, b); }
static inline tpu_hv tpu_and(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_AND, a, b); }
static inline tpu_hv tpu_or(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_OR, a, b); }
static inline tpu_hv tpu_not(tpu_lower *L, tpu_hv a) { return tpu_hlo_unary(H, TPU_HLO_NOT, a); }
/* x != x: true where x is NaN (false for integers). */
static inline tpu_hv tpu_isnan(tpu_lower *L, tpu_hv x) { return tpu_hlo_compare(H, TPU_HLO_NE, x, x); }

/* Half types compute in f32, as torch's CPU kernels do. */
static inline tpu_dtype tpu_acc_type(tpu_dtype dt) { return (dt == TPU_F16 || dt == TPU_BF16) ? TPU_F32 : dt; }

/* The op `name` over xs, its result typed as xs[0] (CHLO's functions, which
 * XLA expands when it compiles the module). */
static inline tpu_hv tpu_named_op(tpu_lower *L, const char *name, const tpu_hv *xs, int n) {
  tpu_hlo_type t = *T(L, xs[0]);
  return tpu_hlo_emit1(H, name, xs, n, NULL, t);
}

/* ---- arguments ------------------------------------------------------------------------ */

/* Whether argument i is present and of kind k. */
static inline bool tpu_arg_is(tpu_lower *L, int i, tpu_argkind k) { return i < L->nargs && L->args[i].kind == k; }
/* A bool argument's value: false when absent or None. */
static inline bool tpu_arg_bool(tpu_lower *L, int i) { return tpu_arg_is(L, i, TPU_ARG_BOOL) && L->args[i].i; }
/* A bool argument's value: dflt when absent or None. */
static inline bool tpu_arg_bool_or(tpu_lower *L, int i, bool dflt) {
  return tpu_arg_is(L, i, TPU_ARG_BOOL) ? L->args[i].i != 0 : dflt;
}
/* Whether tensor argument i is of a floating type; if not, L fails with
 * torch's "\"kernel\" not implemented for 'dtype'". */
static inline bool tpu_need_float(tpu_lower *L, int i, const char *kernel) {
  tpu_dtype dt = L->args[i].t.dtype;
  if (tpu_dtype_is_float(dt)) return true;
  tpu_lower_fail(L, TPU_ERR_RUNTIME, "\"%s\" not implemented for '%s'", kernel, tpu_dtype_name(dt));
  return false;
}
/* Argument i's dtype for type promotion: a tensor's own, f32 for a Python number. */
static inline tpu_dtype tpu_arg_dtype(tpu_lower *L, int i) {
  return L->args[i].kind == TPU_ARG_TENSOR ? L->args[i].t.dtype : TPU_F32;
}
/* Scalar argument i as a value broadcast like `like` (in like's dtype). */
static inline tpu_hv tpu_scalar_like(tpu_lower *L, int i, tpu_hv like) {
  const tpu_hlo_type *t = T(L, like);
  return tpu_lower_broadcast_to(L, tpu_lower_scalar(L, i, t->dtype), t->rank, t->dims);
}

/* A float unary op on argument 0 (integers promoted to the default float
 * type): f computed in the accumulation type, the result rounded once. */
typedef tpu_hv (*tpu_ufn)(tpu_lower *L, tpu_hv x);
static inline void tpu_float_unary(tpu_lower *L, tpu_ufn f) {
  tpu_dtype dt = tpu_lower_float_type(tpu_arg_dtype(L, 0));
  tpu_hv x = tpu_lower_input(L, 0, dt);
  tpu_lower_out(L, tpu_hlo_convert(H, f(L, tpu_hlo_convert(H, x, tpu_acc_type(dt))), dt));
}

/* ---- elementwise (emit_elementwise.c) --------------------------------------------------- */

/* erf of a float value, through f32 (a rational approximation). */
tpu_hv tpu_erf(tpu_lower *L, tpu_hv x);

/* ---- reductions (emit_reduce.c) ------------------------------------------------------- */

/* Dims to reduce from an optional int list argument (None or [] = all):
 * returns their count, fills dims and mask. */
int tpu_red_dims(tpu_lower *L, int arg, int rank, int64_t *dims, bool *mask);
/* r with the reduced dims of `in` (mask) put back as size 1 when keep. */
tpu_hv tpu_keepdim(tpu_lower *L, tpu_hv r, const tpu_hlo_type *in, const bool *mask, bool keep);
tpu_hv tpu_reduce_sum(tpu_lower *L, tpu_hv x, const int64_t *dims, int n);
/* The identity of max (is_max) or min for dt. */
tpu_hv tpu_init_value(tpu_lower *L, tpu_dtype dt, bool is_max);
/* max/min over dims, NaN-propagating like torch. */
tpu_hv tpu_reduce_extreme(tpu_lower *L, tpu_hv x, const int64_t *dims, int n, bool is_max);
/* (values, first indices) of the max/min along dim; NaN counts as extreme. */
void tpu_arg_extreme(tpu_lower *L, tpu_hv x, int64_t dim, bool is_max, tpu_hv *vals, tpu_hv *idx);

#endif

/* emit.h: small helpers shared by the emitter files (static inline). */
#ifndef TPU_EMIT_H
#define TPU_EMIT_H

#include "emitters.h"

/* ---- shared shapes of emitters ------------------------------------------------------ */

static inline tpu_hlo *H_(tpu_lower *L) { return L->hlo; }
#define H H_(L)

static inline const tpu_hlo_type *T(tpu_lower *L, tpu_hv v) { return tpu_hlo_typeof(L->hlo, v); }

static inline tpu_hv tpu_k(tpu_lower *L, tpu_hv like, double v) { return tpu_lower_full_like(L, like, v); }
static inline tpu_hv tpu_mul(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_MUL, a, b); }
static inline tpu_hv tpu_add(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_ADD, a, b); }
static inline tpu_hv tpu_sub(tpu_lower *L, tpu_hv a, tpu_hv b) { return tpu_hlo_binary(H, TPU_HLO_SUB, a, b); }

/* div of arguments 0 and 1 with rounding mode NULL, "trunc" or "floor" (emit_core.c). */
void tpu_emit_div_rounding(tpu_lower *L, const char *mode);

/* Reduction helpers (emit_nn.c). Dims to reduce from an optional int list
 * argument (None or [] = all): returns their count, fills dims and mask. */
int tpu_red_dims(tpu_lower *L, int arg, int rank, int64_t *dims, bool *mask);
/* r with the reduced dims of `in` (mask) put back as size 1 when keep. */
tpu_hv tpu_keepdim(tpu_lower *L, tpu_hv r, const tpu_hlo_type *in, const bool *mask, bool keep);
bool tpu_arg_bool(tpu_lower *L, int i);
tpu_hv tpu_reduce_sum(tpu_lower *L, tpu_hv x, const int64_t *dims, int n);
/* The identity of max (is_max) or min for dt. */
tpu_hv tpu_init_value(tpu_lower *L, tpu_dtype dt, bool is_max);
/* sign as torch's CPU kernel computes it: NaN gives 0. */
tpu_hv tpu_sign_v(tpu_lower *L, tpu_hv x);
/* max/min over dims, NaN-propagating like torch. */
tpu_hv tpu_reduce_extreme(tpu_lower *L, tpu_hv x, const int64_t *dims, int n, bool is_max);
/* (values, first indices) of the max/min along dim; NaN counts as extreme. */
void tpu_arg_extreme(tpu_lower *L, tpu_hv x, int64_t dim, bool is_max, tpu_hv *vals, tpu_hv *idx);

/* Half types compute in f32, as torch's CPU kernels do. */
static inline tpu_dtype tpu_acc_type(tpu_dtype dt) { return (dt == TPU_F16 || dt == TPU_BF16) ? TPU_F32 : dt; }


#endif

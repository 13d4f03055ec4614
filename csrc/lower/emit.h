/* emit.h: small helpers shared by the emitter files (static inline). */
#ifndef TPU_EMIT_H
#define TPU_EMIT_H

#include "lower.h"

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

/* Half types compute in f32, as torch's CPU kernels do. */
static inline tpu_dtype tpu_acc_type(tpu_dtype dt) { return (dt == TPU_F16 || dt == TPU_BF16) ? TPU_F32 : dt; }


#endif

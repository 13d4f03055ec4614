/* emit_math.c: further elementwise math. hypot is the worked example of
 * notes/adding_an_op.md: one table row per overload plus this emitter. */
#include "emit.h"

/* hypot(self, other) = sqrt(self^2 + other^2), floats only */
void tpu_emit_hypot(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_float_type(tpu_lower_result_type(L, idx, 2));
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  tpu_lower_broadcast_all(L, v, 2);
  tpu_hv s = tpu_add(L, tpu_mul(L, v[0], v[0]), tpu_mul(L, v[1], v[1]));
  tpu_lower_out(L, tpu_hlo_unary(L->hlo, TPU_HLO_SQRT, s));
}

/* Arguments 0 and 1 of complex/polar: two f32 (or two f64) tensors,
 * broadcast together (half types are refused, as by torch's CPU kernel). */
static bool tpu_complex_parts(tpu_lower *L, tpu_hv *v) {
  tpu_dtype a = L->args[0].t.dtype, b = L->args[1].t.dtype;
  if (a != b || (a != TPU_F32 && a != TPU_F64)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "Expected both inputs to be Float or Double tensors but got %s and %s",
                   tpu_dtype_name(a), tpu_dtype_name(b));
    return false;
  }
  v[0] = tpu_lower_tensor(L, 0, -1);
  v[1] = tpu_lower_tensor(L, 1, -1);
  tpu_lower_broadcast_all(L, v, 2);
  return true;
}

/* complex(real, imag): f32 -> c64, f64 -> c128 */
void tpu_emit_complex(tpu_lower *L) {
  tpu_hv v[2];
  if (tpu_complex_parts(L, v)) tpu_lower_out(L, tpu_hlo_binary(L->hlo, TPU_HLO_COMPLEX, v[0], v[1]));
}

/* polar(abs, angle) = abs * (cos(angle) + i sin(angle)) */
void tpu_emit_polar(tpu_lower *L) {
  tpu_hv v[2];
  if (!tpu_complex_parts(L, v)) return;
  tpu_hv re = tpu_mul(L, v[0], tpu_hlo_unary(L->hlo, TPU_HLO_COS, v[1]));
  tpu_hv im = tpu_mul(L, v[0], tpu_hlo_unary(L->hlo, TPU_HLO_SIN, v[1]));
  tpu_lower_out(L, tpu_hlo_binary(L->hlo, TPU_HLO_COMPLEX, re, im));
}

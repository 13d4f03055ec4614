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

/* emit_core.c: emitters the core itself relies on (copies) and the first
 * elementwise ops. */
#include "lower.h"

/* tpu::copy(dst, src): dst's view takes src's values, converted to dst's
 * dtype and broadcast to its shape (copy_ semantics). */
void tpu_emit_copy(tpu_lower *L) {
  tpu_lower_write(L, 0, -1, tpu_lower_tensor(L, 1, -1));
  tpu_lower_return_arg(L, 0, -1);
}

/* tpu::materialize(src): a contiguous copy of a view. */
void tpu_emit_materialize(tpu_lower *L) { tpu_lower_out(L, tpu_lower_tensor(L, 0, -1)); }

/* add(self, other, *, alpha=1) */
void tpu_emit_add(tpu_lower *L) {
  int idx[2] = {0, 1};
  tpu_dtype dt = tpu_lower_result_type(L, idx, 2);
  tpu_hv v[2] = {tpu_lower_input(L, 0, dt), tpu_lower_input(L, 1, dt)};
  if (L->nargs > 2 && !L->args[2].is_default && !tpu_lower_is_none(L, 2))
    v[1] = tpu_lower_binary(L, TPU_HLO_MUL, v[1], tpu_lower_scalar(L, 2, dt));
  tpu_lower_out(L, tpu_lower_binary(L, dt == TPU_PRED ? TPU_HLO_OR : TPU_HLO_ADD, v[0], v[1]));
}

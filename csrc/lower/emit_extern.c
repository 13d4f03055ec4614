/* emit_extern.c: a call of a function from StableHLO text (hlo.h's
 * tpu_hlo_fn, registered by id with the engine: torchtpu.stablehlo_op,
 * torchtpu.jax_op). The call's tensors are checked against the function's
 * @main (count, dtype, shape), as torch checks a kernel's arguments; the
 * function's definitions follow @main in the program, and XLA inlines the
 * call. The same emitter serves eager calls, fused programs and graphs. */
#include <stdio.h>

#include "emit.h"

static void tpu_dims_str(const int64_t *d, int rank, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)d[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* tpu::stablehlo_call(Tensor[] args, int fn) -> Tensor[] */
void tpu_emit_stablehlo_call(tpu_lower *L) {
  const tpu_arg *a = &L->args[0];
  int64_t id = L->args[1].i;
  const tpu_hlo_fn *f = L->fn_lookup ? L->fn_lookup(L->fn_ctx, id) : NULL;
  if (!f) {
    tpu_lower_fail(L, TPU_ERR_VALUE, "stablehlo_op: no function was registered with id %lld", (long long)id);
    return;
  }
  int n = tpu_hlo_fn_nargs(f), nres = tpu_hlo_fn_nresults(f);
  if (a->nlist != n) {
    tpu_lower_fail(L, TPU_ERR_TYPE, "stablehlo_op: the function takes %d tensors (the arguments of its @main), got %d",
                   n, a->nlist);
    return;
  }
  if (nres > TPU_MAX_OUTS) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "stablehlo_op: functions of more than %d results are not supported",
                   TPU_MAX_OUTS);
    return;
  }
  tpu_hv v[TPU_MAX_LIST], outs[TPU_MAX_OUTS];
  for (int j = 0; j < n; j++) {
    const tpu_tref *t = &a->list[j];
    const tpu_hlo_type *want = tpu_hlo_fn_arg(f, j);
    if (!t->rec && !t->host && !t->zero_size) {
      tpu_lower_fail(L, TPU_ERR_TYPE, "stablehlo_op: argument %d is None, the function takes a tensor", j);
      return;
    }
    if (t->dtype != want->dtype) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "stablehlo_op: argument %d has dtype %s, the function takes %s", j,
                     tpu_dtype_name(t->dtype), tpu_dtype_name(want->dtype));
      return;
    }
    int rank = t->host ? 0 : t->rank;
    bool same = rank == want->rank;
    for (int i = 0; same && i < rank; i++) same = t->sizes[i] == want->dims[i];
    if (!same) {
      char got[160], exp[160];
      tpu_dims_str(t->sizes, rank, got, sizeof got);
      tpu_dims_str(want->dims, want->rank, exp, sizeof exp);
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "stablehlo_op: argument %d has shape %s, the function takes %s", j, got, exp);
      return;
    }
    v[j] = tpu_lower_tensor(L, 0, j);
  }
  if (!tpu_hlo_call(H, f, v, n, outs)) return;
  for (int k = 0; k < nres; k++) tpu_lower_out(L, outs[k]);
}

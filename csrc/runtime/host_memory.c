/* host_memory.c: a buffer's memory seen from the host, where the plugin's
 * device memory is host memory (XLA's CPU plugin). What a transfer to the
 * host would copy can then be read where it lies, and written there: the
 * c10d backend stages collectives through it (torchtpu/_distributed.py).
 *
 * The plugin says whether a buffer is on the CPU (Buffer_IsOnCpu) and where
 * it lies (Buffer_UnsafePointer); both answers are the plugin's, asked per
 * buffer. Its value is ready once the buffer's ready event fires. A buffer
 * the plugin made on the CPU is dense row-major: the CPU plugin's only
 * layout for the buffers it makes and the programs it compiles (checked
 * against a transfer in tests/c/test_runtime.c).
 */
#include <stdint.h>

#include "rt_shared.h"

/* A plugin that cannot answer (UNIMPLEMENTED) lends nothing: its buffers are
 * copied, as elsewhere. Other errors stay errors. */
static tpu_status *tpu_unanswered_is_none(tpu_status *s) {
  if (s && tpu_status_code(s) == TPU_ERR_UNIMPLEMENTED) {
    tpu_status_free(s);
    return NULL;
  }
  return s;
}

tpu_status *tpu_rt_buffer_host_memory(tpu_rt *rt, tpu_rt_buffer *b, void **addr) {
  *addr = NULL;
  const tpu_pjrt_api *api = rt->api;
  if (!b->nbytes || !TPU_HAS(api, Buffer_IsOnCpu) || !TPU_HAS(api, Buffer_ReadyEvent) ||
      !TPU_HAS(api, Buffer_UnsafePointer))
    return NULL;
  tpu_pjrt_is_on_cpu_args c = {TPU_PJRT_SIZE(tpu_pjrt_is_on_cpu_args, is_on_cpu), NULL, b->buf, false};
  tpu_status *s = TPU_CALL(api, Buffer_IsOnCpu, &c);
  if (s || !c.is_on_cpu) return tpu_unanswered_is_none(s);
  tpu_pjrt_ready_event_args r = {TPU_PJRT_SIZE(tpu_pjrt_ready_event_args, event), NULL, b->buf, NULL};
  s = TPU_CALL(api, Buffer_ReadyEvent, &r);
  if (!s) s = tpu_rt_event_finish(api, r.event, "computing the buffer's value");
  if (s) return s;
  tpu_pjrt_unsafe_pointer_args p = {TPU_PJRT_SIZE(tpu_pjrt_unsafe_pointer_args, buffer_pointer), NULL, b->buf, 0};
  s = TPU_CALL(api, Buffer_UnsafePointer, &p);
  if (s) return tpu_unanswered_is_none(s);
  *addr = (void *)p.buffer_pointer;
  return NULL;
}

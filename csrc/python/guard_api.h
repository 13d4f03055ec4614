/* guard_api.h: what torchtpu._C hands torch's device guard for the tpu
 * (csrc/guard/device_guard.cpp, built as torchtpu._device_guard): plain C
 * functions that need neither the GIL nor a started runtime (torch calls
 * them from any thread, the autograd engine's included), in a capsule of
 * _C named TPU_GUARD_API_NAME. */
#ifndef TPU_GUARD_API_H
#define TPU_GUARD_API_H

#include <stdint.h>

#define TPU_GUARD_API_NAME "torchtpu._C.guard_api"
#define TPU_GUARD_API_VERSION 2

typedef struct {
  int version;                   /* TPU_GUARD_API_VERSION */
  int (*device_count)(void);     /* torch.tpu.device_count(), without starting the runtime */
  int (*current_device)(void);   /* the calling thread's (torch.tpu.current_device()) */
  void (*set_device)(int index); /* the calling thread's, unchecked: a bad index is raised at its use */
  /* The default tpu generator's key and offset (torch.tpu.default_generators:
   * the devices share it), read and set with the GIL held; before _C.init the
   * reads give CUDA's default seed and the writes do nothing. */
  void (*rng_state)(uint64_t *seed, uint64_t *offset);
  void (*set_rng_state)(uint64_t seed, uint64_t offset);
} tpu_guard_api;

#endif

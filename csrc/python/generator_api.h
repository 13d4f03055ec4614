/* generator_api.h: what torchtpu._device_guard (C++, csrc/guard/generator.cpp)
 * hands torchtpu._C for the random ops' generator= argument: the state of a
 * tpu torch.Generator, which the op then draws from and moves on. A capsule
 * named TPU_GENERATOR_API_NAME, attribute generator_api of the module. */
#ifndef TPU_GENERATOR_API_H
#define TPU_GENERATOR_API_H

#include <stdint.h>

#define TPU_GENERATOR_API_NAME "torchtpu._device_guard.generator_api"
#define TPU_GENERATOR_API_VERSION 1

/* A tpu generator's own state: the key of its draws and the offset of the
 * next (call.h's tpu_rng has the same layout). */
typedef struct {
  uint64_t seed, offset;
} tpu_generator_state;

typedef struct {
  int version; /* TPU_GENERATOR_API_VERSION */
  /* gen: a Python object, the GIL held. 0 with *state the generator's own
   * state (valid while gen lives), or NULL for a default tpu generator (the
   * engine's); -1 with a Python exception set: not a torch.Generator
   * (TypeError), or one of another device (RuntimeError, CUDA's message). */
  int (*state)(void *gen, tpu_generator_state **state);
} tpu_generator_api;

#endif

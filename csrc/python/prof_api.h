/* prof_api.h: what torchtpu._C hands torch's profiler session for the tpu
 * (csrc/guard/profiler.cpp, built in torchtpu._device_guard): the engine's
 * record of its work (csrc/engine/prof.h) through plain C functions that need
 * neither the GIL nor a started runtime (Kineto calls the session from the
 * thread that starts and stops the profiler, and pushes each op's correlation
 * id from the thread that runs it), in a capsule of _C named
 * TPU_PROF_API_NAME. Plain C that C++ includes too. */
#ifndef TPU_PROF_API_H
#define TPU_PROF_API_H

#include "../engine/prof.h"

#define TPU_PROF_API_NAME "torchtpu._C.prof_api"
#define TPU_PROF_API_VERSION 1

typedef struct {
  int version;                  /* TPU_PROF_API_VERSION */
  void (*start)(unsigned what); /* TPU_PROF_HOST | TPU_PROF_DEVICE */
  void (*stop)(void);           /* waits briefly for programs still running */
  size_t (*snapshot)(tpu_prof_record *out, size_t cap, uint64_t *dropped);
  void (*set_correlation)(uint64_t id); /* the calling thread's torch op; 0: none */
} tpu_prof_api;

#endif

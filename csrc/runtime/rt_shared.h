/* rt_shared.h: what runtime.c lends the other files of csrc/runtime/ (aot.c,
 * host_memory.c): the client and buffer structs, the PJRT error to status
 * conversion, events, and the CompileOptionsProto encoder.
 */
#ifndef TPU_RT_SHARED_H
#define TPU_RT_SHARED_H

#include <stdatomic.h>
#include <stdbool.h>

#include "pjrt_api.h"
#include "runtime.h"

#define TPU_HAS(api, name) \
  ((api)->struct_size >= offsetof(tpu_pjrt_api, name) + sizeof(tpu_pjrt_fn) && (api)->name != NULL)

/* A PJRT error (owned; destroyed here) as a status "<what>: <the plugin's
 * message>", its code mapped (UNIMPLEMENTED, RESOURCE_EXHAUSTED kept, the rest
 * TPU_ERR_RUNTIME). NULL stays NULL. */
tpu_status *tpu_rt_pjrt_status(const tpu_pjrt_api *api, tpu_pjrt_error *err, const char *what);

#define TPU_CALL(rt_api, name, args) tpu_rt_pjrt_status((rt_api), (rt_api)->name(args), "PJRT_" #name)

/* Awaits ev and destroys it (NULL: nothing); its error as a status naming what. */
tpu_status *tpu_rt_event_finish(const tpu_pjrt_api *api, tpu_pjrt_event *ev, const char *what);

struct tpu_rt {
  const tpu_pjrt_api *api;         /* lifetime of the process */
  tpu_pjrt_client *client;         /* owned */
  tpu_pjrt_device *const *devices; /* owned by the client */
  int ndevices;
  char *path, *platform, *version; /* owned */
  char **kinds;                    /* owned, ndevices entries */
  atomic_llong live_buffers, live_execs;
  atomic_llong live_bytes, peak_bytes; /* dense sizes of live buffers */
  atomic_llong *dev_bytes, *dev_peak;  /* the same per device (ndevices entries, owned) */
  bool portable;                       /* several devices: one-device programs run on any of them */
  int opt_level;                       /* xla_backend_optimization_level of every compile, 1 to 3; else XLA's */
};

/* The shape is tracked here (from the upload's arguments, or asked of the
 * plugin once for an execution's outputs), so accessors never call PJRT. */
struct tpu_rt_buffer {
  tpu_rt *rt;           /* borrowed; outlives the buffer */
  tpu_pjrt_buffer *buf; /* owned */
  int device;           /* index in the client's addressable devices */
  tpu_dtype dtype;
  int rank;
  int64_t dims[TPU_MAX_RANK];
  size_t nbytes; /* dense row-major size */
};

/* CompileOptionsProto bytes for o (NULL: one replica, one partition) into out
 * (tpu_rt_options_cap(o) bytes); portable and opt_level as tpu_rt_compile
 * uses them (opt_level 0: XLA's own). Returns the length. */
enum { TPU_RT_OPTS_MAX = 128 };
size_t tpu_rt_options_cap(const tpu_rt_compile_opts *o);
size_t tpu_rt_encode_options(const tpu_rt_compile_opts *o, bool portable, int opt_level, uint8_t *out);

/* The optimized program of executable x (runtime.h's tpu_rt_module). */
tpu_status *tpu_rt_optimized_program(const tpu_pjrt_api *api, tpu_pjrt_exec *x, tpu_rt_module *out);

#endif

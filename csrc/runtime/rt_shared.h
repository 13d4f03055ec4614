/* rt_shared.h: what runtime.c lends aot.c (internal to csrc/runtime/): the
 * PJRT error to status conversion and the CompileOptionsProto encoder.
 */
#ifndef TPU_RT_SHARED_H
#define TPU_RT_SHARED_H

#include "pjrt_api.h"
#include "runtime.h"

#define TPU_HAS(api, name) \
  ((api)->struct_size >= offsetof(tpu_pjrt_api, name) + sizeof(tpu_pjrt_fn) && (api)->name != NULL)

/* A PJRT error (owned; destroyed here) as a status "<what>: <the plugin's
 * message>", its code mapped (UNIMPLEMENTED, RESOURCE_EXHAUSTED kept, the rest
 * TPU_ERR_RUNTIME). NULL stays NULL. */
tpu_status *tpu_rt_pjrt_status(const tpu_pjrt_api *api, tpu_pjrt_error *err, const char *what);

/* CompileOptionsProto bytes for o (NULL: one replica, one partition) into out
 * (tpu_rt_options_cap(o) bytes); portable and opt_level as tpu_rt_compile
 * uses them (opt_level 0: XLA's own). Returns the length. */
enum { TPU_RT_OPTS_MAX = 128 };
size_t tpu_rt_options_cap(const tpu_rt_compile_opts *o);
size_t tpu_rt_encode_options(const tpu_rt_compile_opts *o, bool portable, int opt_level, uint8_t *out);

/* The optimized program of executable x (runtime.h's tpu_rt_module). */
tpu_status *tpu_rt_optimized_program(const tpu_pjrt_api *api, tpu_pjrt_exec *x, tpu_rt_module *out);

#endif

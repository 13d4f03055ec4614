/* runtime.h: the PJRT runtime layer. One tpu_rt per process: the loaded plugin,
 * its client and its addressable devices. Everything above this layer speaks
 * tpu_rt_* and never sees a PJRT type.
 *
 * Ownership: every tpu_rt_buffer / tpu_rt_exec returned through an out
 * parameter is owned by the caller and freed with its *_free function (which
 * accepts NULL). Strings returned by accessors live as long as the tpu_rt.
 * All buffers and executables must be freed before tpu_rt_close.
 *
 * Errors: a failing PJRT call gives a status whose message is the PJRT
 * function's name, ": ", then the plugin's own message. The plugin's
 * UNIMPLEMENTED becomes TPU_ERR_UNIMPLEMENTED, RESOURCE_EXHAUSTED becomes
 * TPU_ERR_MEMORY, and every other code TPU_ERR_RUNTIME.
 */
#ifndef TPU_RUNTIME_H
#define TPU_RUNTIME_H

#include "../core.h"

typedef struct tpu_rt tpu_rt;
typedef struct tpu_rt_buffer tpu_rt_buffer;
typedef struct tpu_rt_exec tpu_rt_exec;

typedef struct {
  const char *plugin_path; /* shared library exporting GetPjrtApi; required */
  const char *platform;    /* "cpu", "tpu" or "cuda": picks create options */
  int num_devices;         /* CPU plugin: cpu_device_count; <= 0 means 1 */
  double memory_fraction;  /* CUDA plugin: > 0 reserves this fraction of the GPU's memory at
                              start; <= 0 takes memory as it is needed (torch.cuda's way) */
  int opt_level;           /* CPU plugin: XLA's backend (LLVM) optimization level, 1 to 3, for
                              every program; 0 (or another value) leaves XLA's own (or XLA_FLAGS's) */
} tpu_rt_options;

/* Oldest PJRT C API minor version we accept (major must be 0). */
#define TPU_RT_MIN_API_MINOR 57

/* dlopen the plugin, check its API version, initialise it, create the client.
 * A missing file, a library without GetPjrtApi or an incompatible version
 * yields TPU_ERR_PLUGIN with a message naming the path and both versions. */
tpu_status *tpu_rt_open(const tpu_rt_options *opts, tpu_rt **out);
void tpu_rt_close(tpu_rt *rt);

const char *tpu_rt_platform_name(const tpu_rt *rt); /* e.g. "cpu", "cuda", "tpu" */
const char *tpu_rt_platform_version(const tpu_rt *rt);
const char *tpu_rt_plugin_path(const tpu_rt *rt);
void tpu_rt_api_version(const tpu_rt *rt, int *major, int *minor);
int tpu_rt_device_count(const tpu_rt *rt);               /* addressable devices */
const char *tpu_rt_device_kind(const tpu_rt *rt, int i); /* e.g. "cpu", "NVIDIA H100" */

/* What a compiled program depends on besides its text, for the disk cache's
 * key: platform, platform version, PJRT API version, the compile options,
 * the plugin file (path, size, mtime: a reinstalled plugin invalidates) and
 * the compiler's flags from the environment (XLA_FLAGS, LIBTPU_INIT_ARGS),
 * whole. Returns an owned string (free), NULL when out of memory. */
char *tpu_rt_cache_salt(const tpu_rt *rt);

/* Compile StableHLO text (or MLIR bytecode) for one device, one replica.
 * With several addressable devices the program is portable: it runs on the
 * device its arguments are on (tpu_rt_execute_on names it). */
tpu_status *tpu_rt_compile(tpu_rt *rt, const char *mlir, size_t len, tpu_rt_exec **out);
/* A program over several devices: replicas x partitions argument lists, on
 * the plugin's default assignment (devices 0 .. n-1 in order). spmd: XLA
 * partitions a program written for the whole (global) shapes, following its
 * sharding annotations; shardy: with the Shardy partitioner (else GSPMD).
 * NULL: tpu_rt_compile's options. The text's mhlo.num_replicas and
 * mhlo.num_partitions should match. */
typedef struct {
  int replicas, partitions; /* <= 0: 1 */
  bool spmd, shardy;
  /* propagate[k] (k < npropagate): XLA's partitioner chooses output k's
   * sharding (the text declares none for it); the others hold as declared.
   * Read the choices back with tpu_rt_exec_optimized. */
  const bool *propagate;
  int npropagate;
} tpu_rt_compile_opts;
tpu_status *tpu_rt_compile_with(tpu_rt *rt, const char *mlir, size_t len, const tpu_rt_compile_opts *o,
                                tpu_rt_exec **out);
int tpu_rt_exec_num_outputs(const tpu_rt_exec *e);
/* Argument lists a launch takes (replicas x partitions; 1 for one device),
 * and the device index row r runs on (0 for one-row programs). */
int tpu_rt_exec_rows(const tpu_rt_exec *e);
int tpu_rt_exec_row_device(const tpu_rt_exec *e, int row);
void tpu_rt_exec_free(tpu_rt_exec *e);
/* A program as XLA optimized it: a serialized HloModuleProto (format "hlo"),
 * or an HloModuleProtoWithConfig holding one as its field 1 (format
 * "hlo_with_config": with_config set), as the plugin gives it. bytes owned
 * (free()). */
typedef struct {
  uint8_t *bytes;
  size_t len;
  bool with_config;
} tpu_rt_module;
/* e's optimized program into *out (zeroed on error); TPU_ERR_UNIMPLEMENTED
 * where the plugin gives none or another format. */
tpu_status *tpu_rt_exec_optimized(tpu_rt_exec *e, tpu_rt_module *out);

/* Serialized executable bytes (owned by the caller, free()), for the disk
 * cache; TPU_ERR_UNIMPLEMENTED where the plugin cannot serialize. */
tpu_status *tpu_rt_exec_serialize(tpu_rt *rt, tpu_rt_exec *e, void **bytes, size_t *len);
tpu_status *tpu_rt_exec_deserialize(tpu_rt *rt, const void *bytes, size_t len, tpu_rt_exec **out);

/* Run a one-row program on the device of its arguments (all on one device;
 * device 0 when there are none). args: borrowed for the call (none donated). outs: a
 * caller array of tpu_rt_exec_num_outputs(e) slots, filled with owned
 * buffers. Returns when the outputs are ready (errors of the computation
 * itself are reported here). */
tpu_status *tpu_rt_execute(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs, tpu_rt_buffer **outs);

/* The same, without waiting for the computation: *done (owned, may be NULL
 * when the plugin finished inline) completes when it has; its error, if any,
 * is the computation's. Errors found before the launch return at once. */
typedef struct tpu_rt_event tpu_rt_event;
tpu_status *tpu_rt_execute_async(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs,
                                 tpu_rt_buffer **outs, tpu_rt_event **done);
/* The same, donating no argument even where the program aliases an input
 * to an output (the plugin then writes a new buffer). */
tpu_status *tpu_rt_execute_keep(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs, tpu_rt_buffer **outs,
                                tpu_rt_event **done);
/* The same on a named device (programs without arguments), keep as in
 * tpu_rt_execute_keep. */
tpu_status *tpu_rt_execute_on(tpu_rt *rt, tpu_rt_exec *e, int device, tpu_rt_buffer *const *args, int nargs,
                              tpu_rt_buffer **outs, tpu_rt_event **done, bool keep);
/* A program of several rows: args[r * nargs + i] is argument i of row r
 * (each on tpu_rt_exec_row_device(e, r)); outs receives rows x outputs
 * buffers, row-major. Waits for every row. */
tpu_status *tpu_rt_execute_rows(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs,
                                tpu_rt_buffer **outs);
/* Non-blocking: has ev completed (NULL: yes)? */
bool tpu_rt_event_ready(tpu_rt *rt, tpu_rt_event *ev);
/* Waits for ev, frees it, returns its error. NULL ev: nothing. */
tpu_status *tpu_rt_event_wait(tpu_rt *rt, tpu_rt_event *ev);
/* Calls fn(user) once ev has completed (failed or not): on a thread of the
 * plugin, or in the caller's before this returns when ev already has. fn
 * must not block nor call into the runtime. ev stays the caller's (waited
 * for and freed as before; fn may run after that). An error: fn is never
 * called (a plugin without PJRT_Event_OnReady). */
typedef void (*tpu_rt_ready_fn)(void *user);
tpu_status *tpu_rt_event_on_ready(tpu_rt *rt, tpu_rt_event *ev, tpu_rt_ready_fn fn, void *user);

/* Host -> device. data: dense row-major, borrowed for the call (copied before
 * return). rank 0 is a scalar; dims may be NULL when rank is 0. */
tpu_status *tpu_rt_buffer_from_host(tpu_rt *rt, const void *data, tpu_dtype dtype, const int64_t *dims, int rank,
                                    tpu_rt_buffer **out);
/* The same onto addressable device `device` (0 .. tpu_rt_device_count - 1). */
tpu_status *tpu_rt_buffer_from_host_on(tpu_rt *rt, int device, const void *data, tpu_dtype dtype, const int64_t *dims,
                                       int rank, tpu_rt_buffer **out);
/* A copy of b on another device (or the same one). */
tpu_status *tpu_rt_buffer_copy(tpu_rt *rt, tpu_rt_buffer *b, int device, tpu_rt_buffer **out);
int tpu_rt_buffer_device(const tpu_rt_buffer *b);
/* Device -> host, dense row-major into dst (nbytes must equal
 * tpu_rt_buffer_nbytes, else TPU_ERR_VALUE). Waits for completion. */
tpu_status *tpu_rt_buffer_to_host(tpu_rt *rt, tpu_rt_buffer *b, void *dst, size_t nbytes);
/* Where the plugin's device memory is the host's (XLA's CPU plugin): once
 * the buffer's value is ready, *addr is its memory, tpu_rt_buffer_nbytes
 * bytes, dense row-major (host_memory.c). The caller may read it, and write
 * it when no computation uses the buffer; valid while the buffer lives. A
 * plugin whose buffers are elsewhere (a TPU, a GPU), an empty buffer: *addr
 * is NULL and the status NULL (the caller copies). */
tpu_status *tpu_rt_buffer_host_memory(tpu_rt *rt, tpu_rt_buffer *b, void **addr);
/* The buffer's shape, recorded at upload or asked of the plugin once for an
 * execution's outputs; these never call into the plugin. nbytes is the dense
 * row-major size. dims: rank entries, lifetime of b. */
size_t tpu_rt_buffer_nbytes(const tpu_rt_buffer *b);
tpu_dtype tpu_rt_buffer_dtype(const tpu_rt_buffer *b);
int tpu_rt_buffer_rank(const tpu_rt_buffer *b);
const int64_t *tpu_rt_buffer_dims(const tpu_rt_buffer *b);
void tpu_rt_buffer_free(tpu_rt_buffer *b);

/* Live buffer and executable counts (for leak tests and metrics). */
int64_t tpu_rt_live_buffers(const tpu_rt *rt);
int64_t tpu_rt_live_execs(const tpu_rt *rt);
/* How many unwind-table registrations of the plugin's compiled code were
 * ignored (see runtime.c); > 0 shows the plugin bound to the core's stubs. */
int64_t tpu_rt_unwind_tables_ignored(void);

/* Device memory in use, where the plugin reports it; TPU_ERR_UNIMPLEMENTED
 * otherwise (the CPU plugin does not). */
tpu_status *tpu_rt_memory_in_use(tpu_rt *rt, int64_t *bytes);
/* The plugin's statistics of a device: bytes in use, and the peak and the
 * limit where it reports them (-1 where not). */
tpu_status *tpu_rt_device_memory(tpu_rt *rt, int device, int64_t *in_use, int64_t *peak, int64_t *limit);
/* Bytes held by this runtime's live buffers (dense sizes), counted here for
 * every plugin, and their peak since start or the last reset. */
int64_t tpu_rt_live_bytes(const tpu_rt *rt);
int64_t tpu_rt_peak_bytes(const tpu_rt *rt);
void tpu_rt_reset_peak_bytes(tpu_rt *rt); /* every device's too */
/* The same for the buffers on one device. */
int64_t tpu_rt_device_live_bytes(const tpu_rt *rt, int device);
int64_t tpu_rt_device_peak_bytes(const tpu_rt *rt, int device);

#endif

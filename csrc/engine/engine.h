/* engine.h: storage records, the per-op program cache, and op execution.
 *
 * A storage record is the device side of one torch storage: a mutable cell
 * holding the storage's current device buffer as a flat 1-D array. A tensor
 * is (record, sizes, strides, offset); every view of a storage shares its
 * record, and an in-place write swaps the record's buffer so that all views
 * see it. A record is referenced by its torch storage (through the DLPack
 * deleter) and, briefly, by calls in flight.
 *
 * The engine owns the runtime, the record registry (so that a pointer coming
 * back from Python is checked before use), the compiled-program cache, the
 * device generator state and the metrics. It is the only mutable state of the
 * core; the Python module holds one.
 */
#ifndef TPU_ENGINE_H
#define TPU_ENGINE_H

#include <stdatomic.h>

#include "../call.h"
#include "../mesh.h"
#include "../runtime/aot.h"
#include "../runtime/runtime.h"
#include "prof.h"

typedef struct tpu_engine tpu_engine;
/* The caller's place in its program (the bindings: the Python stack, most
 * recent call last, one line per frame), malloc'd, or NULL. The engine asks
 * for it when an op with value checks is called outside debug mode, so that
 * a check that fails at a later sync point names where the op was called. */
typedef char *(*tpu_where_fn)(void);

#define TPU_RECORD_MAGIC 0x74707572u /* "tpur" */

typedef struct tpu_record {
  uint32_t magic;
  atomic_long refs;
  tpu_dtype dtype;
  int64_t numel;
  tpu_rt_buffer *buf; /* owned; NULL until first written (reads as zeros) */
  int device;         /* the local device its buffer lives on (tpu:<device>) */
  /* On a mesh (spmd.c): the sharding and one buffer per mesh device (owned;
   * buf is then NULL); NULL on one device. grank/gdims: the shape of its
   * buffer, set when it is made and never changed (the tensor's shape it was
   * made for, flat when unknown: tpu_record_shape), the global shape of a
   * mesh record. Every buffer of the record has it, and every program takes
   * and gives the record in it: on a TPU a flat array and the tensor's shape
   * are laid out differently in memory, and a change between them is a copy. */
  tpu_sharding *sh;
  tpu_rt_buffer **shards;
  int grank;
  int64_t gdims[TPU_MAX_RANK];
  bool freed;      /* its memory was freed (tpu_engine_storage_free): no call may use it */
  tpu_engine *eng; /* borrowed; outlives the record */
  /* Fused mode: references held by recorded ops (a record with no others is
   * dead: its pending value is not computed), and the flush's scratch. */
  atomic_long graph_refs;
  uint64_t fuse_epoch; /* the flush that set the fields below */
  int fuse_id;         /* index in the flush's record table */
  tpu_hv fuse_val;     /* current flat value in the fused program, or NONE */
  tpu_hv fuse_param;   /* the program input holding its buffer, or NONE */
  bool fuse_def;       /* fuse_val was computed by a recorded op */
  bool fuse_new;       /* made by a recorded op of the flush */
  bool fuse_has_sh;    /* made by a sharding constraint: fuse_sh is its layout */
  tpu_sharding fuse_sh;
  uint64_t need_epoch; /* the flush that found its value needed (live, or read by a needed op) */
  uint64_t birth;      /* records created before it (graph capture tells new from old) */
} tpu_record;

/* Why recorded ops ran (fused mode): the enum, and the names of the
 * torchtpu.metrics() counters ("flushes_<name>"). */
#define TPU_FLUSH_REASONS(X) \
  X(DOWNLOAD, "download")    \
  X(UPLOAD, "upload")        \
  X(SYNC, "sync")            \
  X(MODE, "mode")            \
  X(CAP, "size_cap")         \
  X(STEP, "optimizer_step")  \
  X(BACKWARD, "backward")    \
  X(FREE, "storage_free")    \
  X(DEVICE, "device")        \
  X(SPMD, "spmd_op")         \
  X(MEMORY, "memory_query")
typedef enum {
#define X(id, name) TPU_FLUSH_##id,
  TPU_FLUSH_REASONS(X)
#undef X
      TPU_FLUSH_COUNT
} tpu_flush_reason;
extern const char *const tpu_flush_names[TPU_FLUSH_COUNT];

/* The engine's counters: field, the name torchtpu.metrics() gives it, and
 * whether it counts nanoseconds (shown in seconds). */
#define TPU_METRICS(X)                                                                                    \
  X(ops_dispatched, "ops_dispatched", 0)                                                                  \
  X(programs_compiled, "programs_compiled", 0)                                                            \
  X(cache_hits, "cache_hits", 0)                                                                          \
  X(cache_misses, "cache_misses", 0)                                                                      \
  X(compile_ns, "compile_seconds", 1)                                                                     \
  X(execute_ns, "execute_seconds", 1)                                                                     \
  X(h2d_bytes, "h2d_bytes", 0)                                                                            \
  X(d2h_bytes, "d2h_bytes", 0)                                                                            \
  X(d2d_bytes, "d2d_bytes", 0)          /* copies between local devices */                                \
  X(host_views, "host_memory_views", 0) /* buffers lent to the host in place (tpu_engine_host_memory) */  \
  X(records_live, "live_records", 0)                                                                      \
  X(fallback_ops, "fallback_ops", 0)                                                                      \
  X(cache_evictions, "cache_evictions", 0) /* times the program cache was emptied */                      \
  X(disk_hits, "disk_cache_hits", 0)       /* programs loaded from the disk cache */                      \
  X(disk_misses, "disk_cache_misses", 0)   /* not found there (compiled, then written) */                 \
  X(disk_writes, "disk_cache_writes", 0)                                                                  \
  X(disk_corrupt, "disk_cache_corrupt", 0) /* damaged entries found (removed, recompiled) */              \
  X(disk_refused, "disk_cache_refused", 0) /* untrusted entries (not ours, bad MAC, ...) */               \
  X(disk_load_ns, "disk_load_seconds", 1)  /* reading and deserializing entries */                        \
  X(fused_programs, "fused_programs_run", 0)                                                              \
  X(fused_ops, "fused_ops", 0)                         /* recorded ops the fused programs ran */          \
  X(backward_passes, "backward_passes", 0)             /* fused mode: tpu_engine_backward_begins */       \
  X(graph_replays, "graph_replays", 0)                 /* captured graphs run straight from their plan */ \
  X(ops_pruned, "fused_ops_pruned", 0)                 /* recorded ops dropped at a flush (not needed) */ \
  X(spmd_programs, "spmd_programs_run", 0)             /* programs over a mesh of devices */              \
  X(spmd_unrun, "spmd_programs_compile_only", 0)       /* over a compile-only mesh: compiled, not run */  \
  X(spmd_layouts, "spmd_layouts_chosen", 0)            /* values whose layout XLA's partitioner chose */  \
  X(spmd_layout_fallbacks, "spmd_layout_fallbacks", 0) /* programs recompiled with rule layouts */        \
  X(replica_colls, "replica_collectives", 0)           /* tpu_engine_replica_collective */                \
  X(aot_compiled, "aot_programs_compiled", 0)          /* compiled for the AOT topology (aot_target.c) */ \
  X(aot_failed, "aot_programs_failed", 0)              /* refused by its compiler (too big included) */   \
  X(aot_oom, "aot_programs_too_big", 0)                /* refused as larger than a chip's memory */       \
  X(aot_disk_hits, "aot_disk_cache_hits", 0)           /* found compiled in the disk cache */             \
  X(aot_ns, "aot_compile_seconds", 1)
typedef struct {
#define X(field, name, ns) atomic_llong field;
  TPU_METRICS(X)
#undef X
  atomic_llong flushes[TPU_FLUSH_COUNT]; /* by reason */
} tpu_metrics;

/* Eager modes. DEBUG: every op runs to completion before it returns, so an
 * error names the op at once. STRICT: ops return once launched (the plugin
 * orders dependent work); a failure of the computation itself is reported
 * at the next sync point (a download, tpu_engine_sync), naming the op.
 * FUSED: ops are recorded, not run; their outputs are records without
 * buffers. A sync point (a download, an upload into a record the recorded
 * ops use, tpu_engine_sync, a mode switch, the size cap) compiles every
 * recorded op into one program (cached by the ops' signatures and how
 * their values flow) and runs it; it computes the final value of each
 * record something outside the recording still holds. */
#define TPU_MODES(X) X(DEBUG, "debug") X(STRICT, "strict") X(FUSED, "fused")
typedef enum {
#define X(id, name) TPU_MODE_##id,
  TPU_MODES(X)
#undef X
      TPU_MODE_COUNT
} tpu_mode;
extern const char *const tpu_mode_names[TPU_MODE_COUNT];

/* Fused mode: where a training step's program ends. BACKWARD: the first op
 * of a backward pass launches what was recorded before it (the rest of the
 * last step and this forward pass), so the forward pass runs while the host
 * records the backward pass and the optimizer step (the saved activations are
 * that program's outputs). OPTIMIZER: the first op after the optimizer steps
 * launches the whole step (forward, backward and optimizer) as one program,
 * so saved activations never leave it. AUTO: OPTIMIZER once a tensor has
 * been laid over a mesh (a pod cannot afford activations written out and
 * read back), else BACKWARD. */
typedef enum { TPU_STEP_AUTO, TPU_STEP_BACKWARD, TPU_STEP_OPTIMIZER } tpu_step_boundary;

/* The engine's settings, given once when it is made (the Python package
 * reads them from the TORCHTPU_* variables and checks their bounds). */
typedef struct {
  tpu_rt_options rt;       /* the plugin to open at the first use (strings copied) */
  const char *rt_error;    /* why that plugin cannot be used (copied; raised at the first use), or NULL */
  tpu_mode mode;           /* the eager mode to start in */
  int fuse_cap;            /* fused mode: recorded ops that make a flush (TORCHTPU_FUSED_MAX_OPS) */
  long program_cache_size; /* programs kept in memory (TORCHTPU_PROGRAM_CACHE_SIZE) */
  bool donate;             /* fused programs take the buffers of records they rewrite */
  bool value_checks;       /* programs make the checks that need tensor values */
  bool explain;            /* explain recompiles of fused programs */
  bool debug;              /* print the program of a failed compilation */
  bool dump_hlo;           /* print every program compiled */
  tpu_step_boundary step;  /* fused mode: where a training step's program ends */
} tpu_engine_options;
/* The defaults (no plugin). */
void tpu_engine_options_init(tpu_engine_options *o);

/* A new engine with these settings; the runtime is not opened yet. */
tpu_status *tpu_engine_new(const tpu_engine_options *o, tpu_engine **out);
/* Opens the runtime (the plugin, its client) unless it is open: at the
 * device's first use, as CUDA makes its context, so that a process that never
 * uses the device never loads the plugin. A failure is returned again by
 * every later start. */
tpu_status *tpu_engine_start(tpu_engine *e);
bool tpu_engine_started(const tpu_engine *e);
void tpu_engine_free(tpu_engine *e);
/* The runtime; NULL before the start. */
tpu_rt *tpu_engine_rt(tpu_engine *e);
tpu_metrics *tpu_engine_metrics(tpu_engine *e);
/* The generator's seed until one is set (CUDA's default seed). */
#define TPU_DEFAULT_SEED 67280421310721ull
/* Precision of f32 matmuls and convolutions (torch.set_float32_matmul_precision:
 * highest -> HIGHEST, high -> HIGH, medium -> DEFAULT); HIGHEST at start. */
void tpu_engine_set_precision(tpu_engine *e, tpu_hlo_precision p);

/* Functions from StableHLO text (fns.c): register text (and, if variant is
 * not NULL, its form for target, "tpu" if NULL) and get its id for
 * tpu::stablehlo_call; the same text gets the same id. A program of one
 * call of function id, its text retargeted to target (NULL: as compiled
 * here); any finished program's text retargeted (hlo.h's tpu_hlo_retarget
 * over every registered function). Texts are owned by the caller. */
tpu_status *tpu_engine_fn_register(tpu_engine *e, const char *text, size_t len, const char *target, const char *variant,
                                   size_t vlen, int64_t *id);
/* The function of id (borrowed: it lives as long as the engine), or NULL. */
const tpu_hlo_fn *tpu_engine_fn(tpu_engine *e, int64_t id);
tpu_status *tpu_engine_fn_program(tpu_engine *e, int64_t id, const char *target, char **text, size_t *len);
tpu_status *tpu_engine_retarget(tpu_engine *e, const char *text, size_t len, const char *target, char **out,
                                size_t *outlen);
tpu_hlo_precision tpu_engine_precision(tpu_engine *e);
/* Whether new programs make value checks (part of every program's key). */
void tpu_engine_set_value_checks(tpu_engine *e, bool on);
bool tpu_engine_value_checks(const tpu_engine *e);
void tpu_engine_rng_state(tpu_engine *e, uint64_t *seed, uint64_t *offset);
void tpu_engine_set_rng_state(tpu_engine *e, uint64_t seed, uint64_t offset);
void tpu_engine_set_mode(tpu_engine *e, tpu_mode mode);
void tpu_engine_set_where(tpu_engine *e, tpu_where_fn where);
/* The ops recorded between begin and end are the items of one
 * torch._foreach_* call: in fused mode a Python number that they take with
 * the same value (a learning rate, a beta) is one program input, not one per
 * tensor of the list. */
void tpu_engine_foreach(tpu_engine *e, bool begin);
tpu_mode tpu_engine_mode(tpu_engine *e);
/* Waits for every launched computation (running the recorded ops first);
 * the first error of one (once). */
tpu_status *tpu_engine_sync(tpu_engine *e);
/* Runs the ops recorded in fused mode as one program. */
tpu_status *tpu_engine_flush(tpu_engine *e, tpu_flush_reason reason);
/* Flushes when recorded ops read or write rec (its value is then still to
 * come), else nothing: what reading, replacing or moving rec needs first. */
tpu_status *tpu_engine_settle(tpu_engine *e, const tpu_record *rec, tpu_flush_reason reason);
/* The end of a training step (an optimizer stepped): flushes without waiting
 * for the program, but lets at most TPU_STEPS_AHEAD launched programs be in
 * flight (the host waits for older ones), so that a fast host does not pile
 * up steps, each holding its own buffers. */
#define TPU_STEPS_AHEAD 2
tpu_status *tpu_engine_flush_step(tpu_engine *e);
/* Fused mode: a backward pass begins. What is recorded (the end of the last
 * training step, then this step's forward pass) is launched as one program
 * without waiting, as at the end of a step, so that it runs while the host
 * records the backward pass and the optimizer step: in a loop that reads
 * the loss every step, the program and the host overlap instead of taking
 * turns. The loop still runs one program per step: the optimizer step's
 * flush is skipped by the binding when backward passes launch the steps.
 * Counts the pass (tpu_metrics.backward_passes) in every case. */
tpu_status *tpu_engine_backward_begins(tpu_engine *e);
/* Whether the optimizer steps end a training step's program (see
 * tpu_step_boundary): then the caller launches the step (tpu_engine_flush_step)
 * at the first op after them, and tpu_engine_backward_begins launches
 * nothing. */
bool tpu_engine_step_at_optimizer(const tpu_engine *e);
/* Whether everything launched has finished and nothing is recorded (does
 * not block; finished computations are reaped). */
bool tpu_engine_idle(tpu_engine *e);

/* The disk tier of the program cache in folder dir (NULL or "": off),
 * bounded to max_bytes (0: no bound); its keys are salted with the
 * runtime's salt and extra. Before the start the folder is only noted and
 * the start opens it, warning (tpu_engine_take_warning) if it cannot be
 * used; after the start an unusable folder is returned as an error (the
 * tier is then off). */
tpu_status *tpu_engine_set_disk_cache(tpu_engine *e, const char *dir, int64_t max_bytes, const char *extra);
/* Warnings of the disk tier (a corrupt entry, an unwritable folder), oldest
 * first; owned by the caller, NULL when none. The binding turns them into
 * Python warnings after each call. */
char *tpu_engine_take_warning(tpu_engine *e);
/* TORCHTPU_EXPLAIN_RECOMPILES: a fused program compiled for the same ops as
 * one in the cache leaves a note saying what differs, taken (owned by the
 * caller, oldest first, NULL when none) by the binding, which prints it. */
char *tpu_engine_take_note(tpu_engine *e);
/* A line for each program compiled (not loaded from the disk tier): what it
 * was, its seconds and the tiers that missed, as "<seconds>\t<text>"; owned
 * by the caller, oldest first, NULL when none. The binding logs them through
 * Python's logging (the "torchtpu" logger); the queue keeps the last 16. */
char *tpu_engine_take_log(tpu_engine *e);
/* Number of entries in the in-memory program cache. */
int64_t tpu_engine_cache_size(tpu_engine *e);

/* A new record (refs = 1, no buffer), registered. NULL when out of memory. */
tpu_record *tpu_record_new(tpu_engine *e, tpu_dtype dt, int64_t numel); /* on the current call's device */
tpu_record *tpu_record_new_on(tpu_engine *e, int device, tpu_dtype dt, int64_t numel);
/* The type of the buffer of a record made for a tensor of shape dims (see
 * tpu_record.grank): that shape, or flat when rank is 0 or 1 or the shape
 * holds no element. */
tpu_hlo_type tpu_buffer_type(tpu_dtype dt, int rank, const int64_t *dims);
/* A new record whose buffer has tpu_buffer_type(dt, rank, dims). */
tpu_record *tpu_record_new_shaped(tpu_engine *e, int device, tpu_dtype dt, int rank, const int64_t *dims);
/* The type of a record's buffer: its dtype and shape. */
tpu_hlo_type tpu_record_type(const tpu_record *r);
/* Local devices: how many (the runtime starts if it has not), and the
 * device a call without tensor arguments runs on (torch.tpu.set_device). A
 * bad index is an error naming it. */
tpu_status *tpu_engine_device_count(tpu_engine *e, int *n);
tpu_status *tpu_engine_set_device(tpu_engine *e, int device);
int tpu_engine_current_device(const tpu_engine *e);
/* A new mesh record holding src's value laid out by sh over the first
 * N local devices (gdims: its global shape, numel as src's); through the
 * host. Errors name a dimension that does not divide, a mesh too large. */
tpu_status *tpu_engine_shard(tpu_engine *e, tpu_record *src, const tpu_sharding *sh, const int64_t *gdims,
                             tpu_record **out);
/* A new record of host data (global shape gdims, dtype dt) laid over the mesh
 * as sh: each device is sent its own block, nothing passes through another
 * device. */
tpu_status *tpu_engine_shard_host(tpu_engine *e, const void *host, tpu_dtype dt, const tpu_sharding *sh,
                                  const int64_t *gdims, tpu_record **out);
/* A new mesh record laid out as src (a mesh record), of dtype dt, zeros. */
tpu_status *tpu_engine_mesh_like(tpu_engine *e, tpu_record *src, tpu_dtype dt, tpu_record **out);
/* The SPMD partitioner: Shardy (true, the default) or GSPMD. */
void tpu_engine_set_shardy(tpu_engine *e, bool shardy);
/* The calling thread's current device, read and set without the engine or the
 * GIL and set unchecked (torch's device guard; a bad index is raised by the
 * next call that runs on it). Each thread has its own (0 until set). */
int tpu_engine_thread_device(void);
void tpu_engine_select_device(int device);
/* A new record on `device` holding src's value (src's pending ops run first). */
tpu_status *tpu_engine_transfer(tpu_engine *e, tpu_record *src, int device, tpu_record **out);
void tpu_record_ref(tpu_record *r);
/* Thread-safe (torch may free storages without the GIL). */
void tpu_record_unref(tpu_record *r);
/* The live record at this address, or NULL. */
tpu_record *tpu_engine_find_record(tpu_engine *e, const void *addr);

/* Results of one call. New outputs are owned references the caller mints or
 * releases; ret says what to return (see lower.h). */
typedef struct {
  tpu_record *outs[TPU_MAX_OUTS];
  tpu_hlo_type types[TPU_MAX_OUTS];
  int nout;
  tpu_ret_plan ret[TPU_MAX_OUTS];
  int nret;
} tpu_engine_result;

/* Lower (or find in the cache), compile and run one op on parsed arguments. */
tpu_status *tpu_engine_call(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                            tpu_engine_result *res);
void tpu_engine_result_release(tpu_engine_result *res);

/* Host data (dense row-major, dtype dt, shape dims) becomes the record's
 * whole new buffer. Requires numel(dims) == rec->numel. */
tpu_status *tpu_engine_upload(tpu_engine *e, tpu_record *rec, const void *data, tpu_dtype dt, int rank,
                              const int64_t *dims);
/* Copy the whole record buffer to dst (nbytes = numel * itemsize). */
tpu_status *tpu_engine_download(tpu_engine *e, tpu_record *rec, void *dst, size_t nbytes);
/* The record's buffer lent to the host in place, where the plugin's device
 * memory is the host's (XLA's CPU plugin; runtime.h's
 * tpu_rt_buffer_host_memory): a sync point as a download (the recorded ops
 * that read or write it run, and every launched computation finishes), then
 * *addr is its whole buffer, *nbytes bytes, dense row-major. Reading it is a
 * download that copies nothing; writing it writes the record (every view of
 * it sees the write) and is allowed until the next op on the engine, which
 * may read the buffer. Nothing to lend (another plugin, a record over a mesh,
 * one never written, a freed one, inside a capture): *addr NULL, status NULL. */
tpu_status *tpu_engine_host_memory(tpu_engine *e, tpu_record *rec, void **addr, size_t *nbytes);

/* The memory of a storage that FSDP2 frees between uses (its free_storage
 * and alloc_storage: torch's storage.resize_(0) and back, which a device
 * registered from Python cannot provide). Free runs the recorded ops that
 * read or write the record (fused mode), drops its buffer and marks it
 * freed: the bindings then refuse every call on a tensor of it, and a graph
 * that holds it refuses to replay, until alloc gives it memory again,
 * unwritten (it reads as zeros; torch's re-grown storage holds whatever it
 * holds). Free is refused inside a capture, which could not replay it. The
 * torch storage keeps its size: only the device memory comes and goes. */
tpu_status *tpu_engine_storage_free(tpu_engine *e, tpu_record *rec);
void tpu_engine_storage_alloc(tpu_engine *e, tpu_record *rec);

/* ---- compiling for a TPU topology as well (aot_target.c) -------------------------------------
 *
 * With a target set (TORCHTPU_AOT_TOPOLOGY), every program the engine
 * compiles for its plugin is also compiled for the topology's chips by the
 * compile-only target of csrc/runtime/aot.h: once per distinct program.
 * strict: a program the TPU compiler refuses fails the call (too big for a
 * chip's memory: TPU_ERR_MEMORY), naming it; else it is only recorded.
 * mesh_only (TORCHTPU_SPMD_COMPILE_ONLY): programs over a mesh are compiled
 * for the target only and never run (spmd.c): a mesh may have as many
 * devices as the topology has chips, and tensors over it hold no values. */
tpu_status *tpu_engine_set_aot(tpu_engine *e, const char *plugin_path, const char *topology, bool strict,
                               bool mesh_only);
/* One program compiled for the target (or refused by its compiler). */
typedef struct {
  char *name;     /* "aten::add", "a fused program of 12 ops" ... (owned by the engine) */
  char *error;    /* NULL when it compiled (owned by the engine) */
  tpu_code code;  /* the error's */
  double seconds; /* compiling it (when it was compiled, for a cached one) */
  bool cached;    /* found in the disk cache */
  tpu_rt_aot_stats st;
  uint64_t hash;     /* of the options and the text */
  tpu_rt_module opt; /* a compile-only mesh's program as libtpu optimized it (owned; else empty) */
  int64_t runs;      /* launches of the plugin's program (or of a compile-only mesh's) */
} tpu_aot_prog;
/* The target (NULL strings when none: not set, or the runtime not started). */
typedef struct {
  const char *topology, *kind, *platform_version; /* lifetime of the engine */
  int devices;
  int64_t hbm_bytes;
  bool strict;
  bool mesh_only; /* programs over a mesh only compiled for the target (TORCHTPU_SPMD_COMPILE_ONLY) */
  int nprogs;
  const tpu_aot_prog *progs; /* lifetime: until the next compile */
} tpu_aot_info;
void tpu_engine_aot_info(tpu_engine *e, tpu_aot_info *out);

/* ---- replica-mode collectives (replica.c) --------------------------------------------
 *
 * One collective over n local devices as one program of n replicas: record i
 * of the list is on device i (tpu:i) and its result is a new record on
 * device i. The transport of a multi-process backend in one process. */
/* The collectives and reduce ops: the rows of collectives.def. */
typedef enum {
#define TPU_COLLECTIVE(id, name, doc) TPU_COLL_##id,
#include "collectives.def"
  TPU_COLL_COUNT
} tpu_coll_kind;
typedef enum {
#define TPU_REDUCE_OP(id, name, doc) TPU_RED_##id,
#include "collectives.def"
  TPU_RED_COUNT
} tpu_red_op;
extern const char *const tpu_coll_names[TPU_COLL_COUNT]; /* "all_reduce", ... (replica.c) */
extern const char *const tpu_red_names[TPU_RED_COUNT];   /* "sum", ... */
#define TPU_MAX_REPLICAS 64
typedef struct {
  tpu_coll_kind kind;
  tpu_red_op op; /* ALL_REDUCE, REDUCE_SCATTER; AVG: sum, then divided by n (floating and complex dtypes) */
  tpu_dtype dtype;
  int rank;
  int64_t dims[TPU_MAX_RANK]; /* every input's shape */
  int npairs;                 /* PERMUTE */
  int pairs[TPU_MAX_REPLICAS][2];
  int src; /* BROADCAST */
} tpu_collective;
/* Checks c for n replicas (kind, op against the dtype, shapes, pairs,
 * source) and gives the shape of every output. */
tpu_status *tpu_collective_check(const tpu_collective *c, int n, int *rank, int64_t *dims);
/* Runs c over ins[0..n) (ins[i] on device i, c's dtype and shape's numel);
 * outs[i] receives an owned new record on device i. Recorded ops that write
 * an input run first; programs are compiled once per (c, n) and kept by the
 * engine. */
tpu_status *tpu_engine_replica_collective(tpu_engine *e, const tpu_collective *c, tpu_record *const *ins, int n,
                                          tpu_record **outs);

/* ---- graph plans (torch.compile) ----------------------------------------------------
 *
 * A compiled FX graph is captured once: its ops are recorded in fused mode
 * and lowered into one program, as any flush. The plan keeps that program
 * and where each of its inputs and outputs comes from (a graph input's
 * record, a record the graph holds, a constant, the generator), so that a
 * later call with inputs of the same layout runs the program directly: no
 * op is dispatched, recorded or keyed again. */
typedef struct tpu_plan tpu_plan;

/* Runs what is recorded, then records in fused mode; *prev is the mode to
 * restore. */
tpu_status *tpu_engine_capture_begin(tpu_engine *e, int *prev);
/* Ends a capture: ins are the graph's tpu tensor inputs, outs its tpu tensor
 * outputs (as read after the graph ran). Runs the recorded ops (launched, not
 * waited for), restores the mode, and builds a plan for them in *plan (when
 * plan is not NULL), or leaves it NULL with *why saying what it could not
 * replay. */
tpu_status *tpu_engine_capture_end(tpu_engine *e, int prev, const tpu_tref *ins, int nin, const tpu_tref *outs,
                                   int nout, tpu_plan **plan, const char **why);
/* True when ins have the layout (views, dtypes, record sharing) the plan was
 * captured with. */
bool tpu_plan_matches(const tpu_plan *p, const tpu_tref *ins, int nin);
/* Runs the plan on ins (which match it). outs[j] receives an owned
 * reference to the record of output j; the caller views it as the output's
 * tref (tpu_plan_output). */
tpu_status *tpu_plan_run(tpu_engine *e, tpu_plan *p, const tpu_tref *ins, int nin, tpu_record **outs);
int tpu_plan_nout(const tpu_plan *p);
/* Output j's view at capture, and the graph input it is (-1 when not one). */
const tpu_tref *tpu_plan_output(const tpu_plan *p, int j, int *input);
/* torch.tpu.graph: a whole-step capture (CUDA graph semantics). Begin records
 * every op in fused mode; nothing may run until the end (a sync point is an
 * error naming it). End (keep) compiles the recording into a plan whose
 * inputs and outputs are the records it read and wrote, tensors made during
 * the capture included, and runs nothing: tensors keep their values until
 * the first replay; without keep it drops the recording. Graph plans of
 * torch.compile inside the capture join its recording. Replay runs the
 * program again on the records' current buffers. */
tpu_status *tpu_engine_graph_begin(tpu_engine *e, int *prev);
tpu_status *tpu_engine_graph_end(tpu_engine *e, int prev, bool keep, tpu_plan **plan);
tpu_status *tpu_engine_graph_replay(tpu_engine *e, tpu_plan *p);
bool tpu_engine_graph_capturing(const tpu_engine *e);
/* Releases the plan (its program, constants, held records). Safe after the
 * engine is gone. */
void tpu_plan_free(tpu_plan *p);

#endif

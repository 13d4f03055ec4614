/* bind.h: what the files of the CPython bindings (torchtpu._C) share.
 *
 * The bindings are split by concern:
 *   module.c   the module: its method table and life, settings, metrics
 *   state.c    module state, errors as Python exceptions, the engine's start
 *   tensor.c   DLPack: minting tpu tensors from records, reading them back
 *   kernel.c   Kernel objects (one per ATen overload): parsing, running, results
 *   fast.c     Kernel calls from torch's dispatcher through C++ (fast_api.h)
 *   explain.c  explaining per-op recompiles (TORCHTPU_EXPLAIN_RECOMPILES)
 *   foreach.c  Foreach objects (torch._foreach_* over lists)
 *   copy.c     empty, copies between the host and the device, the memory
 *              of a storage (FSDP2 frees it between uses)
 *   graph.c    graph plans (torch.compile) and torch.tpu.graph
 *   replica.c  replica-mode collectives over the local devices
 *   spmd.c     tensors laid over a mesh of local devices (torchtpu.spmd)
 *   stablehlo.c functions from StableHLO text (stablehlo_op, jax_op)
 *   guard.c    what torch's device guard for the tpu reads (guard_api.h)
 *   prof.c     what torch's profiler session for the tpu reads (prof_api.h)
 * They see the core only through the engine (engine.h) and the call
 * structs it takes (call.h).
 */
#ifndef TPU_BIND_H
#define TPU_BIND_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <stdbool.h>

#include "../engine/engine.h"
#include "generator_api.h"
#include "tensor_api.h"

typedef struct {
  tpu_engine *eng;                  /* owned; made by init(), its runtime started at the first use */
  PyObject *from_dlpack;            /* torch._C._from_dlpack */
  PyObject *torch_empty;            /* torch.empty */
  PyObject *dtypes[TPU_NUM_DTYPES]; /* torch.dtype objects by tpu_dtype */
  PyObject *kernel_type;
  PyObject *foreach_type;
  struct tpu_call_frame *spare_frame; /* owned or NULL: a Kernel call's, kept between calls */
  PyObject *s_data_ptr, *s_storage_offset, *s_shape, *s_stride, *s_dtype, *s_is_cpu, *s_contiguous, *s_copy_,
      *s_is_contiguous, *s_is_conj, *s_is_neg;
  PyObject *tensor_type; /* torch.Tensor, looked up on first use */
  /* torch's C++ tensor read directly (tensor_api.h; NULL: through Python) */
  const tpu_tensor_api *tapi;
  const tpu_generator_api *gapi;            /* torchtpu._device_guard's, NULL without it */
  PyObject *gapi_capsule;                   /* strong */
  PyObject *tapi_capsule, *tensor_base;     /* strong: its capsule, torch._C.TensorBase */
  tpu_dtype scalar_types[TPU_SCALAR_TYPES]; /* c10::ScalarType -> dtype */
  int explain;                              /* TORCHTPU_EXPLAIN_RECOMPILES */
  bool in_backward;                         /* the last op ran on an autograd engine thread (fused mode) */
  bool in_optimizer;                        /* inside an optimizer's step() (its pre and post hooks) */
  bool step_pending;                        /* an optimizer step ended the step: the next op launches it */
  char **explained[TPU_NUM_OPS];            /* owned: the last compiled call's argument descriptions */
  int nexplained[TPU_NUM_OPS];
} tpu_mod_state;

typedef struct {
  PyObject_HEAD PyObject *module; /* strong */
  int op_id;
  int nparams;
  int nreturns;
  char kinds[TPU_MAX_ARGS];
  PyObject *names[TPU_MAX_ARGS];    /* strong, interned */
  PyObject *defaults[TPU_MAX_ARGS]; /* strong or NULL (required) */
  /* Ops PyTorch hands lazily conjugated or negated tensors (its Conjugate and
   * Negative fallbacks let them through): resolve (strong or NULL) gives a
   * tensor's plain values. Conjugation exists on complex tensors only; a
   * negated real tensor reaches only ops with resolve_real. */
  PyObject *resolve;
  int resolve_real;
} tpu_kernel;

/* The argument-kind alphabet (argkinds.def), indexed by letter: a spec's
 * one character per schema argument type. name is NULL for a letter that is
 * not a kind. */
typedef struct {
  const char *name; /* "optional tensor" */
  tpu_argkind parsed;
  bool optional; /* None is accepted */
} tpu_argkind_row;
extern const tpu_argkind_row tpu_argkinds[128]; /* kernel.c */
static inline const tpu_argkind_row *tpu_kind_row(char kind) {
  static const tpu_argkind_row unknown = {NULL, TPU_ARG_NONE, false};
  return (unsigned char)kind < 128 && tpu_argkinds[(unsigned char)kind].name ? &tpu_argkinds[(unsigned char)kind]
                                                                             : &unknown;
}
/* Whether an argument of this kind may be None. */
static inline bool tpu_kind_optional(char kind) { return tpu_kind_row(kind)->optional; }

static inline tpu_mod_state *tpu_state(PyObject *m) { return (tpu_mod_state *)PyModule_GetState(m); }

extern PyType_Spec tpu_kernel_spec, tpu_foreach_spec;
/* Set in a child forked after the runtime started (a pthread_atfork handler). */
extern volatile sig_atomic_t tpu_forked_after_start;

/* state.c: module state, errors, the engine's start, warnings */
int tpu_mode_from_py(PyObject *name, tpu_mode *out);
PyObject *tpu_raise(tpu_status *s);
tpu_engine *tpu_eng(tpu_mod_state *st);
tpu_engine *tpu_need_engine(tpu_mod_state *st);
tpu_dtype tpu_dtype_from_py(tpu_mod_state *st, PyObject *d);
int tpu_stderr_line(const char *msg);
int tpu_flush_warnings(tpu_mod_state *st);
int tpu_dtype_arg(tpu_mod_state *st, PyObject *d, tpu_dtype *out);

/* tensor.c: DLPack, minting tensors, reading them */
int tpu_storage_check(int rank, const int64_t *sizes, const int64_t *strides, tpu_dtype dt, int64_t *numel);
PyObject *tpu_mint(tpu_mod_state *st, tpu_record *rec, int rank, const int64_t *sizes, const int64_t *strides);
void *tpu_dl_make(tpu_record *rec, int rank, const int64_t *sizes, const int64_t *strides);
void tpu_dl_release(void *dlm);
int tpu_tref_from_meta_struct(tpu_mod_state *st, const tpu_tensor_meta *m, tpu_tref *t, const char *opname, int *rc);
int tpu_int64_seq(PyObject *seq, int64_t *out, int max, const char *what);
int64_t tpu_call_int(PyObject *o, PyObject *name);
int tpu_tref_from_py(tpu_mod_state *st, PyObject *o, tpu_tref *t, const char *opname);
PyObject *tpu_py_set_tensor_api(PyObject *m, PyObject *args);

/* generator.c: generator= arguments */
int tpu_parse_generator(tpu_mod_state *st, PyObject *o, tpu_arg *a);
PyObject *tpu_py_set_generator_api(PyObject *m, PyObject *cap);
PyObject *tpu_py_to_tref_args(tpu_mod_state *st, PyObject *o, tpu_arg *a, const char *op);

/* kernel.c: Kernel objects: parsing arguments, running an op, building results */
/* Runs one op through the engine, its warnings and error turned into Python's:
 * 0, or -1 with an exception set (nothing left to release). */
int tpu_call_op(tpu_mod_state *st, int op_id, tpu_arg *args, int nargs, tpu_engine_result *res);
/* torch's warning for an out= tensor with elements that was resized: 0, or -1 raised. */
int tpu_warn_resized(void);
PyObject *tpu_py_warn_resized(PyObject *m, PyObject *unused);
/* The same, the first op of a backward pass told to the engine first. */
int tpu_run_engine(tpu_mod_state *st, int op_id, tpu_arg *args, int nargs, tpu_engine_result *res);
PyObject *tpu_run_op(tpu_mod_state *st, int op_id, tpu_arg *args, int nargs, PyObject **params, int nreturns);
PyObject *tpu_py_kernel(PyObject *m, PyObject *args);
PyObject *tpu_py_arg_kinds(PyObject *m, PyObject *noargs); /* {letter: name} of argkinds.def */
/* A call's argument frame: taken (NULL with an exception set), its args, given back with
 * the number of arguments parsed (their tensor lists freed). */
typedef struct tpu_call_frame tpu_call_frame;
tpu_call_frame *tpu_frame_take(tpu_mod_state *st);
tpu_arg *tpu_frame_args(tpu_call_frame *f);
void tpu_frame_give(tpu_mod_state *st, tpu_call_frame *f, int n);

/* fast.c: Kernel calls from torch's dispatcher through C++ (fast_api.h) */
PyObject *tpu_fast_capsule(void); /* a new reference: _C.fast_api */

/* explain.c: explaining recompiles */
int tpu_explain(tpu_mod_state *st, tpu_kernel *k, const tpu_arg *args);

/* foreach.c: Foreach objects (torch._foreach_*) */
PyObject *tpu_py_foreach(PyObject *m, PyObject *args);

/* copy.c: empty, copies between host and device, storage memory */
/* A host tensor's dtype, shape and the address of its values (*c: its
 * contiguous form, a new reference the caller drops once the values are
 * sent). False: an error set (a dtype tpu lacks: TypeError "<what>: ..."). */
bool tpu_host_values(tpu_mod_state *st, PyObject *t, const char *what, PyObject **c, tpu_dtype *dt, int64_t *sizes,
                     int *rank, const void **data);
PyObject *tpu_py_empty(PyObject *m, PyObject *args);
PyObject *tpu_py_copy_from(PyObject *m, PyObject *args);
PyObject *tpu_py_to_cpu(PyObject *m, PyObject *t);
PyObject *tpu_py_storage_free(PyObject *m, PyObject *t);
PyObject *tpu_py_storage_alloc(PyObject *m, PyObject *t);
PyObject *tpu_py_storage_freed(PyObject *m, PyObject *t);
PyObject *tpu_py_host_memory(PyObject *m, PyObject *t);
PyObject *tpu_py_storage_shape(PyObject *m, PyObject *t);
PyObject *tpu_py_buffer_shape(PyObject *m, PyObject *sizes);
PyObject *tpu_py_dense(PyObject *m, PyObject *t);
PyObject *tpu_py_contiguous_strides(PyObject *m, PyObject *args);
PyObject *tpu_py_stride_order(PyObject *m, PyObject *t);
PyObject *tpu_py_check_out_overlap(PyObject *m, PyObject *args);

/* stablehlo.c: functions from StableHLO text (their methods, added at exec) */
extern PyMethodDef tpu_stablehlo_methods[];

/* spmd.c: tensors laid over a mesh of local devices */
PyObject *tpu_py_shard(PyObject *m, PyObject *args);
/* aot.c */
PyObject *tpu_py_set_aot(PyObject *m, PyObject *args);
PyObject *tpu_py_aot_report(PyObject *m, PyObject *noargs);
PyObject *tpu_py_sharding(PyObject *m, PyObject *args);
PyObject *tpu_py_mesh_like(PyObject *m, PyObject *args);
PyObject *tpu_py_spmd_partitioner(PyObject *m, PyObject *name);

/* graph.c: graph plans (torch.compile) and torch.tpu.graph */
PyObject *tpu_py_graph_capture_begin(PyObject *m, PyObject *args);
PyObject *tpu_py_graph_capture_end(PyObject *m, PyObject *args);
PyObject *tpu_py_graph_replay(PyObject *m, PyObject *args);
PyObject *tpu_py_whole_end(PyObject *m, PyObject *args);
PyObject *tpu_py_whole_replay(PyObject *m, PyObject *cap);
PyObject *tpu_py_whole_capturing(PyObject *m, PyObject *noargs);

/* replica.c: replica-mode collectives (torchtpu.replicas) */
PyObject *tpu_py_replica_collective(PyObject *m, PyObject *args);
PyObject *tpu_py_collective_kinds(PyObject *m, PyObject *noargs); /* {name: tpu_coll_kind} */
PyObject *tpu_py_reduce_ops(PyObject *m, PyObject *noargs);       /* {name: tpu_red_op} */

/* guard.c: the device count and current device torch's device guard reads */
void tpu_guard_set_count(int n);
void tpu_guard_set_engine(tpu_engine *e); /* whose generator the default tpu generator is */
PyObject *tpu_guard_capsule(void);        /* a new reference: _C.guard_api */

/* prof.c: the engine's record for torch's profiler */
PyObject *tpu_prof_capsule(void); /* a new reference: _C.prof_api */

/* site.c: the calling Python stack, for errors raised at a later sync point */
char *tpu_site_where(void);

#endif

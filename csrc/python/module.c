/* module.c: torchtpu._C, the CPython bindings (C API only, no C++).
 *
 * Tensors cross the boundary as ordinary torch tensors. A device tensor is
 * minted from a DLPack capsule whose device is kDLExtDev (torch maps it to
 * PrivateUse1) and whose data pointer is the address of our storage record;
 * the capsule's deleter drops the record when torch frees the storage. Coming
 * back, a tensor's record address is data_ptr - storage_offset * itemsize,
 * checked against the engine's registry before use.
 *
 * Each registered ATen overload is a Kernel object: the torch dispatcher
 * calls it with the schema's arguments (trailing defaults dropped, kwarg-only
 * ones in kwargs); it normalises them against the schema spec given at
 * registration, parses them into tpu_arg values and runs the op.
 */
#define _GNU_SOURCE /* pthread_getname_np */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "../engine/engine.h"

/* ---- DLPack (our own declarations of the stable v0 ABI) ---------------------- */

typedef struct {
  int32_t device_type;
  int32_t device_id;
} tpu_dl_device;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} tpu_dl_dtype;

typedef struct {
  void *data;
  tpu_dl_device device;
  int32_t ndim;
  tpu_dl_dtype dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} tpu_dl_tensor;

typedef struct tpu_dl_managed {
  tpu_dl_tensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct tpu_dl_managed *self);
} tpu_dl_managed;

enum { TPU_DL_INT = 0, TPU_DL_UINT = 1, TPU_DL_FLOAT = 2, TPU_DL_BFLOAT = 4, TPU_DL_COMPLEX = 5, TPU_DL_BOOL = 6 };
#define TPU_DL_EXT_DEV 12

typedef struct {
  tpu_dl_managed m;
  int64_t shape[TPU_MAX_RANK];
  int64_t strides[TPU_MAX_RANK];
} tpu_dl_holder;

/* ---- module state ------------------------------------------------------------ */

typedef struct {
  tpu_engine *eng;                 /* owned; made by init(), its runtime started at the first use */
  PyObject *from_dlpack;           /* torch._C._from_dlpack */
  PyObject *torch_empty;           /* torch.empty */
  PyObject *dtypes[TPU_NUM_DTYPES]; /* torch.dtype objects by tpu_dtype */
  PyObject *kernel_type;
  PyObject *foreach_type;
  struct tpu_call_frame *spare_frame; /* owned or NULL: tpu_kernel_call's, kept between calls */
  PyObject *s_data_ptr, *s_storage_offset, *s_shape, *s_stride, *s_dtype, *s_is_cpu,
      *s_contiguous, *s_copy_, *s_is_contiguous, *s_is_conj, *s_is_neg;
  PyObject *tensor_type;           /* torch.Tensor, looked up on first use */
  int explain;                     /* TORCHTPU_EXPLAIN_RECOMPILES */
  bool in_backward;                /* the last op ran on an autograd engine thread (fused mode) */
  char **explained[TPU_NUM_OPS];   /* owned: the last compiled call's argument descriptions */
  int nexplained[TPU_NUM_OPS];
} tpu_mod_state;

static PyModuleDef tpu_module_def;

static tpu_mod_state *tpu_state(PyObject *m) { return (tpu_mod_state *)PyModule_GetState(m); }

/* torchtpu.OutOfMemoryError (torch.OutOfMemoryError, as CUDA raises, and a
 * MemoryError), or MemoryError before the package has defined it. */
static PyObject *tpu_oom_type(void) {
  PyObject *mods = PyImport_GetModuleDict();
  PyObject *m = mods ? PyDict_GetItemString(mods, "torchtpu") : NULL; /* borrowed */
  PyObject *t = m ? PyObject_GetAttrString(m, "OutOfMemoryError") : NULL;
  if (!t) PyErr_Clear();
  if (t && PyExceptionClass_Check(t)) {
    Py_DECREF(t); /* the module keeps it */
    return t;
  }
  Py_XDECREF(t);
  return PyExc_MemoryError;
}

/* The eager mode named by a str; -1 with ValueError for another name. */
static int tpu_mode_from_py(PyObject *name, tpu_mode *out) {
  const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  for (int i = 0; s && i < TPU_MODE_COUNT; i++)
    if (strcmp(s, tpu_mode_names[i]) == 0) {
      *out = (tpu_mode)i;
      return 0;
    }
  if (PyErr_Occurred()) return -1;
  PyErr_Format(PyExc_ValueError, "torchtpu.eager_mode: expected 'debug', 'strict' or 'fused', got %R", name);
  return -1;
}

static PyObject *tpu_raise(tpu_status *s) {
  PyObject *exc = PyExc_RuntimeError;
  switch (tpu_status_code(s)) {
    case TPU_ERR_VALUE: exc = PyExc_ValueError; break;
    case TPU_ERR_TYPE: exc = PyExc_TypeError; break;
    case TPU_ERR_INDEX: exc = PyExc_IndexError; break;
    case TPU_ERR_UNIMPLEMENTED: exc = PyExc_NotImplementedError; break;
    case TPU_ERR_MEMORY: exc = tpu_oom_type(); break;
    default: break;
  }
  PyErr_SetString(exc, tpu_status_message(s));
  tpu_status_free(s);
  return NULL;
}

/* Set in a child forked after the runtime started (a pthread_atfork handler:
 * no system call on the path of every op). */
static volatile sig_atomic_t tpu_forked_after_start;
static void tpu_atfork_child(void) { tpu_forked_after_start = 1; }

static int tpu_flush_warnings(tpu_mod_state *st);

/* The engine, made by init(); NULL with an exception set before. */
static tpu_engine *tpu_eng(tpu_mod_state *st) {
  if (!st->eng) PyErr_SetString(PyExc_RuntimeError, "torchtpu runtime is not initialised (import torchtpu first)");
  return st->eng;
}

/* The engine with its runtime started (at the device's first use, as CUDA's
 * context is made: `import torch` with torchtpu installed loads no plugin,
 * and a process that never touches the device, a CPU-only script, a
 * data-loader or compile worker, never opens it; a TPU admits one process).
 * NULL with an exception set when the plugin cannot be used (each use then
 * raises the same error). */
static tpu_engine *tpu_need_engine(tpu_mod_state *st) {
  tpu_engine *e = tpu_eng(st);
  if (!e) return NULL;
  if (tpu_engine_started(e)) {
    if (!tpu_forked_after_start) return e;
    /* the plugin's threads did not survive fork(): its client cannot be used */
    PyErr_SetString(PyExc_RuntimeError,
                    "the tpu runtime was started before this process was forked and cannot be used in the child; "
                    "start the subprocess with the 'spawn' method (multiprocessing.set_start_method('spawn')) or "
                    "use the tpu only after forking");
    return NULL;
  }
  tpu_status *s = tpu_engine_start(e);
  if (s) return tpu_raise(s), NULL;
  pthread_atfork(NULL, NULL, tpu_atfork_child);
  /* the start's warnings (a cache folder that cannot be used); raised as
   * errors by a warnings filter, the engine is up and the next call goes on */
  if (tpu_flush_warnings(st) < 0) return NULL;
  return e;
}

static tpu_dtype tpu_dtype_from_py(tpu_mod_state *st, PyObject *d) {
  for (int i = 1; i < TPU_NUM_DTYPES; i++)
    if (st->dtypes[i] == d) return (tpu_dtype)i;
  return TPU_INVALID;
}

/* ---- minting -------------------------------------------------------------------- */

static void tpu_dl_deleter(tpu_dl_managed *m) {
  tpu_record_unref((tpu_record *)m->manager_ctx);
  free(m);
}

static void tpu_capsule_destructor(PyObject *cap) {
  /* torch renames a consumed capsule; an unconsumed one still owns its data. */
  if (PyCapsule_IsValid(cap, "dltensor")) {
    tpu_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
  }
}

static tpu_dl_dtype tpu_dl_dtype_of(tpu_dtype t) {
  tpu_dl_dtype d = {TPU_DL_FLOAT, (uint8_t)(tpu_dtype_size(t) * 8), 1};
  if (t == TPU_PRED) d.code = TPU_DL_BOOL;
  else if (tpu_dtype_is_signed_int(t)) d.code = TPU_DL_INT;
  else if (tpu_dtype_is_unsigned_int(t)) d.code = TPU_DL_UINT;
  else if (t == TPU_BF16) d.code = TPU_DL_BFLOAT;
  else if (tpu_dtype_is_complex(t)) d.code = TPU_DL_COMPLEX;
  return d;
}

static void tpu_ints_format(char *buf, size_t cap, int n, const int64_t *v) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ", %lld" : "%lld", (long long)v[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* The elements a tensor of these sizes and strides (NULL: contiguous) spans,
 * into *numel; -1 with torch's RuntimeError when its bytes overflow. Every
 * tensor handed to torch passes this first: torch's DLPack import throws a
 * C++ exception for such sizes, which would end the process. */
static int tpu_storage_check(int rank, const int64_t *sizes, const int64_t *strides, tpu_dtype dt, int64_t *numel) {
  if (tpu_storage_numel(rank, sizes, strides, tpu_dtype_size(dt), numel)) return 0;
  char sz[TPU_MAX_RANK * 22 + 4], st[TPU_MAX_RANK * 22 + 4];
  tpu_ints_format(sz, sizeof sz, rank, sizes);
  if (!strides) {
    PyErr_Format(PyExc_RuntimeError, "Storage size calculation overflowed with sizes=%s", sz);
    return -1;
  }
  tpu_ints_format(st, sizeof st, rank, strides);
  PyErr_Format(PyExc_RuntimeError, "Storage size calculation overflowed with sizes=%s and strides=%s", sz, st);
  return -1;
}

/* Steals the record reference. strides NULL: contiguous. */
static PyObject *tpu_mint(tpu_mod_state *st, tpu_record *rec, int rank, const int64_t *sizes,
                          const int64_t *strides) {
  tpu_dl_holder *h = calloc(1, sizeof *h);
  if (!h) {
    tpu_record_unref(rec);
    return PyErr_NoMemory();
  }
  int64_t span;
  if (tpu_storage_check(rank, sizes, strides, rec->dtype, &span) < 0) {
    free(h);
    tpu_record_unref(rec);
    return NULL;
  }
  int64_t acc = 1;
  for (int i = rank - 1; i >= 0; i--) {
    h->shape[i] = sizes[i];
    h->strides[i] = strides ? strides[i] : acc;
    if (!strides && __builtin_mul_overflow(acc, sizes[i] > 0 ? sizes[i] : 1, &acc)) {
      /* only a zero-size tensor gets here (its span is 0) */
      free(h);
      tpu_record_unref(rec);
      PyErr_SetString(PyExc_RuntimeError, "Stride calculation overflowed");
      return NULL;
    }
  }
  h->m.dl_tensor.data = rec;
  h->m.dl_tensor.device = (tpu_dl_device){TPU_DL_EXT_DEV, 0};
  h->m.dl_tensor.ndim = rank;
  h->m.dl_tensor.dtype = tpu_dl_dtype_of(rec->dtype);
  h->m.dl_tensor.shape = h->shape;
  h->m.dl_tensor.strides = h->strides;
  h->m.manager_ctx = rec;
  h->m.deleter = tpu_dl_deleter;
  PyObject *cap = PyCapsule_New(&h->m, "dltensor", tpu_capsule_destructor);
  if (!cap) {
    tpu_dl_deleter(&h->m);
    return NULL;
  }
  PyObject *t = PyObject_CallOneArg(st->from_dlpack, cap);
  Py_DECREF(cap);
  return t;
}

/* ---- reading tensors -------------------------------------------------------------- */

static int tpu_int64_seq(PyObject *seq, int64_t *out, int max, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > max) {
    Py_DECREF(fast);
    if (max != TPU_MAX_RANK)
      PyErr_Format(PyExc_ValueError, "%s: at most %d entries supported, got %zd", what, max, n);
    else if (n > 64) /* torch's own limit */
      PyErr_SetString(PyExc_RuntimeError, "only tensors with up to 64 dims are supported");
    else
      PyErr_Format(PyExc_RuntimeError, "tpu supports tensors of up to %d dims (%s of %zd dims)", TPU_MAX_RANK, what, n);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
  }
  Py_DECREF(fast);
  return (int)n;
}

static int64_t tpu_call_int(PyObject *o, PyObject *name) {
  PyObject *r = PyObject_CallMethodNoArgs(o, name);
  if (!r) return -1;
  int64_t v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return v;
}

/* Fill t from a torch tensor. Returns 0, or -1 with an exception set. */
static int tpu_tref_from_py(tpu_mod_state *st, PyObject *o, tpu_tref *t, const char *opname) {
  memset(t, 0, sizeof *t);
  PyObject *d = PyObject_GetAttr(o, st->s_dtype);
  if (!d) return -1;
  t->dtype = tpu_dtype_from_py(st, d);
  Py_DECREF(d);
  if (t->dtype == TPU_INVALID) {
    PyErr_Format(PyExc_TypeError, "aten::%s: dtype of this tensor is not supported on tpu", opname);
    return -1;
  }
  PyObject *shape = PyObject_GetAttr(o, st->s_shape);
  if (!shape) return -1;
  int r = tpu_int64_seq(shape, t->sizes, TPU_MAX_RANK, "tensor shape");
  Py_DECREF(shape);
  if (r < 0) return -1;
  t->rank = r;
  PyObject *iscpu = PyObject_GetAttr(o, st->s_is_cpu);
  if (!iscpu) return -1;
  int cpu = PyObject_IsTrue(iscpu);
  Py_DECREF(iscpu);
  if (cpu) {
    if (t->rank != 0) {
      PyErr_Format(PyExc_RuntimeError,
                   "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu! "
                   "(in aten::%s; move the CPU tensor with .to(\"tpu\"))", opname);
      return -1;
    }
    int64_t p = tpu_call_int(o, st->s_data_ptr);
    if (p == -1 && PyErr_Occurred()) return -1;
    memcpy(t->host_bytes, (const void *)(uintptr_t)p, tpu_dtype_size(t->dtype));
    t->host = true;
    return 0;
  }
  PyObject *strides = PyObject_CallMethodNoArgs(o, st->s_stride);
  if (!strides) return -1;
  r = tpu_int64_seq(strides, t->strides, TPU_MAX_RANK, "tensor strides");
  Py_DECREF(strides);
  if (r < 0) return -1;
  int64_t numel = 1;
  for (int i = 0; i < t->rank; i++) numel *= t->sizes[i];
  if (numel == 0) {
    /* torch may not keep the data pointer of an empty tensor; none is needed. */
    t->zero_size = true;
    return 0;
  }
  int64_t ptr = tpu_call_int(o, st->s_data_ptr);
  if (ptr == -1 && PyErr_Occurred()) return -1;
  t->offset = tpu_call_int(o, st->s_storage_offset);
  if (t->offset == -1 && PyErr_Occurred()) return -1;
  uintptr_t addr = (uintptr_t)ptr - (uintptr_t)t->offset * tpu_dtype_size(t->dtype);
  t->rec = tpu_engine_find_record(st->eng, (const void *)addr);
  if (!t->rec) {
    PyErr_Format(PyExc_RuntimeError,
                 "aten::%s: got a tensor that torchtpu does not own (not a tpu tensor, or its storage was "
                 "reinterpreted with view(dtype), which is not supported yet)", opname);
    return -1;
  }
  t->rec_numel = t->rec->numel;
  if (t->rec->dtype != t->dtype) {
    /* a view that reinterprets the storage's bytes (view_as_real, view(dtype)) */
    size_t rb = (size_t)t->rec->numel * tpu_dtype_size(t->rec->dtype), ts = tpu_dtype_size(t->dtype);
    if (rb % ts) {
      PyErr_Format(PyExc_RuntimeError, "aten::%s: a %s view of a %s storage of %zu bytes does not cover it whole",
                   opname, tpu_dtype_name(t->dtype), tpu_dtype_name(t->rec->dtype), rb);
      return -1;
    }
    t->rec_dtype = t->rec->dtype;
    t->rec_numel = (int64_t)(rb / ts);
  }
  return 0;
}

/* ---- kernels --------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  PyObject *module;  /* strong */
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

static void tpu_kernel_dealloc(tpu_kernel *k) {
  Py_XDECREF(k->module);
  Py_XDECREF(k->resolve);
  for (int i = 0; i < k->nparams; i++) {
    Py_XDECREF(k->names[i]);
    Py_XDECREF(k->defaults[i]);
  }
  PyTypeObject *tp = Py_TYPE(k);
  tp->tp_free(k);
  Py_DECREF(tp);
}

static int tpu_parse_scalar(PyObject *o, tpu_arg *a) {
  a->kind = TPU_ARG_SCALAR;
  if (PyBool_Check(o)) {
    a->skind = TPU_SCALAR_BOOL;
    a->i = o == Py_True;
    a->f = (double)a->i;
  } else if (PyLong_Check(o)) {
    a->skind = TPU_SCALAR_INT;
    a->i = PyLong_AsLongLong(o);
    if (a->i == -1 && PyErr_Occurred()) return -1;
    a->f = (double)a->i;
  } else if (PyFloat_Check(o)) {
    a->skind = TPU_SCALAR_FLOAT;
    a->f = PyFloat_AS_DOUBLE(o);
    a->i = (int64_t)a->f;
  } else if (PyComplex_Check(o)) {
    a->skind = TPU_SCALAR_COMPLEX;
    a->f = PyComplex_RealAsDouble(o);
    a->f_imag = PyComplex_ImagAsDouble(o);
  } else {
    PyErr_Format(PyExc_TypeError, "expected a number, got %s", Py_TYPE(o)->tp_name);
    return -1;
  }
  return 0;
}

/* Parse one argument. A TENSORS argument gets an owned item array in
 * a->list (freed by tpu_args_free). */
static int tpu_parse_arg(tpu_mod_state *st, char kind, PyObject *o, tpu_arg *a, const char *opname) {
  bool optional = kind == 't' || kind == 's' || kind == 'j' || kind == 'J' || kind == 'g' ||
                  kind == 'F' || kind == 'c' || kind == 'd' || kind == 'y' || kind == 'l' || kind == '_';
  if (kind == '_') {
    a->kind = TPU_ARG_IGNORED;
    return 0;
  }
  if (o == Py_None) {
    if (!optional && kind != 'L') {
      PyErr_Format(PyExc_TypeError, "aten::%s: unexpected None", opname);
      return -1;
    }
    a->kind = TPU_ARG_NONE;
    return 0;
  }
  switch (kind) {
    case 'T':
    case 't':
      /* The dispatcher hands wrapped numbers (x + 1) back as Python numbers. */
      if (PyLong_Check(o) || PyFloat_Check(o) || PyComplex_Check(o)) return tpu_parse_scalar(o, a);
      a->kind = TPU_ARG_TENSOR;
      return tpu_tref_from_py(st, o, &a->t, opname);
    case 'L':
    case 'l': {
      PyObject *fast = PySequence_Fast(o, "expected a list of tensors");
      if (!fast) return -1;
      Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
      if (n > TPU_MAX_LIST) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_NotImplementedError, "aten::%s: lists of more than %d tensors are not supported yet",
                     opname, TPU_MAX_LIST);
        return -1;
      }
      tpu_tref *lists = calloc((size_t)(n ? n : 1), sizeof *lists);
      if (!lists) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
      }
      a->kind = TPU_ARG_TENSORS;
      a->list = lists;
      a->nlist = (int)n;
      for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *it = PySequence_Fast_GET_ITEM(fast, j);
        if (it == Py_None) {
          memset(&lists[j], 0, sizeof lists[j]);
          continue;
        }
        if (tpu_tref_from_py(st, it, &lists[j], opname) < 0) {
          Py_DECREF(fast);
          return -1;
        }
      }
      Py_DECREF(fast);
      return 0;
    }
    case 'S':
    case 's': return tpu_parse_scalar(o, a);
    case 'i':
    case 'j':
      a->kind = TPU_ARG_INT;
      a->i = PyLong_AsLongLong(o);
      return (a->i == -1 && PyErr_Occurred()) ? -1 : 0;
    case 'b':
    case 'c':
      a->kind = TPU_ARG_BOOL;
      a->i = PyObject_IsTrue(o);
      return a->i < 0 ? -1 : 0;
    case 'I':
    case 'J': {
      a->kind = TPU_ARG_INTS;
      if (PyLong_Check(o)) {
        a->nints = 1;
        a->ints[0] = PyLong_AsLongLong(o);
        return 0;
      }
      int n = tpu_int64_seq(o, a->ints, TPU_MAX_LIST, "int list argument");
      if (n < 0) return -1;
      a->nints = n;
      return 0;
    }
    case 'f':
    case 'g':
      a->kind = TPU_ARG_FLOAT;
      a->f = PyFloat_AsDouble(o);
      return (a->f == -1.0 && PyErr_Occurred()) ? -1 : 0;
    case 'F': {
      a->kind = TPU_ARG_FLOATS;
      PyObject *fast = PySequence_Fast(o, "expected a list of floats");
      if (!fast) return -1;
      Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
      if (n > TPU_MAX_LIST) n = TPU_MAX_LIST;
      for (Py_ssize_t j = 0; j < n; j++) a->floats[j] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, j));
      a->nints = (int)n;
      Py_DECREF(fast);
      return PyErr_Occurred() ? -1 : 0;
    }
    case 'd':
      a->kind = TPU_ARG_DTYPE;
      a->dtype = tpu_dtype_from_py(st, o);
      if (a->dtype == TPU_INVALID) {
        PyErr_Format(PyExc_TypeError, "aten::%s: dtype %R is not supported on tpu", opname, o);
        return -1;
      }
      return 0;
    case 'x':
    case 'y': {
      a->kind = TPU_ARG_STR;
      const char *s = PyUnicode_AsUTF8(o);
      if (!s) return -1;
      snprintf(a->str, sizeof a->str, "%s", s);
      return 0;
    }
    default:
      PyErr_Format(PyExc_SystemError, "aten::%s: unknown argument kind '%c'", opname, kind);
      return -1;
  }
}

/* Turn an engine result into the Python return value. Consumes res. */
static PyObject *tpu_build_result(tpu_mod_state *st, tpu_engine_result *res, PyObject **params,
                                  int nreturns) {
  PyObject *vals[TPU_MAX_OUTS] = {0};
  int n = res->nret;
  for (int k = 0; k < n; k++) {
    tpu_ret_plan *p = &res->ret[k];
    if (p->resize) {
      tpu_record *r = res->outs[p->index];
      res->outs[p->index] = NULL;
      PyObject *nt = r ? tpu_mint(st, r, res->types[p->index].rank, res->types[p->index].dims, NULL) : NULL;
      PyObject *oldn = nt ? PyObject_CallMethod(params[p->arg], "numel", NULL) : NULL;
      long long had = oldn ? PyLong_AsLongLong(oldn) : 0;
      Py_XDECREF(oldn);
      /* as torch does: resizing an out= tensor that held elements is deprecated */
      if (nt && had > 0 &&
          PyErr_WarnEx(PyExc_UserWarning,
                       "An output with one or more elements was resized since it had the wrong shape. "
                       "This behavior is deprecated; reuse out= tensors only when they have the right shape, "
                       "or call resize_(0) on them first.", 1) < 0)
        Py_CLEAR(nt);
      PyObject *done = nt ? PyObject_CallMethod(params[p->arg], "set_", "O", nt) : NULL;
      Py_XDECREF(nt);
      if (done) {
        Py_DECREF(done);
        vals[k] = Py_NewRef(params[p->arg]);
      } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_SystemError, "torchtpu: an output was returned twice");
      }
    } else if (p->is_arg) {
      if (p->item >= 0) vals[k] = PySequence_GetItem(params[p->index], p->item);
      else vals[k] = Py_NewRef(params[p->index]);
    } else {
      tpu_record *r = res->outs[p->index];
      res->outs[p->index] = NULL;
      vals[k] = r ? tpu_mint(st, r, res->types[p->index].rank, res->types[p->index].dims, NULL) : NULL;
      if (!r && !PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "torchtpu: an output was returned twice");
    }
    if (!vals[k]) {
      for (int j = 0; j < k; j++) Py_DECREF(vals[j]);
      tpu_engine_result_release(res);
      return NULL;
    }
  }
  tpu_engine_result_release(res);
  if (nreturns == 1 && n == 1) return vals[0];
  if (nreturns == 0 && n == 0) Py_RETURN_NONE;
  PyObject *tup = PyTuple_New(n);
  if (!tup) {
    for (int j = 0; j < n; j++) Py_DECREF(vals[j]);
    return NULL;
  }
  for (int j = 0; j < n; j++) PyTuple_SET_ITEM(tup, j, vals[j]);
  return tup;
}

typedef struct tpu_call_frame {
  tpu_arg args[TPU_MAX_ARGS];
} tpu_call_frame;

static void tpu_args_free(tpu_arg *args, int n) {
  for (int i = 0; i < n; i++)
    if (args[i].kind == TPU_ARG_TENSORS) free(args[i].list);
}

/* Writes msg and a newline to sys.stderr (where the recompile explainer
 * speaks); -1 with an exception set when the write failed. */
static int tpu_stderr_line(const char *msg) {
  PyObject *err = PySys_GetObject("stderr"); /* borrowed */
  if (!err || err == Py_None) return 0;
  PyObject *line = PyUnicode_FromFormat("%s\n", msg);
  PyObject *r = line ? PyObject_CallMethod(err, "write", "O", line) : NULL;
  Py_XDECREF(line);
  if (!r) return -1;
  Py_DECREF(r);
  return 0;
}

/* The engine's pending warnings become Python warnings; -1 when one was
 * turned into an exception (warnings configured as errors). */
static int tpu_flush_warnings(tpu_mod_state *st) {
  int rc = 0;
  char *w;
  while ((w = tpu_engine_take_warning(st->eng))) {
    if (rc == 0 && PyErr_WarnEx(PyExc_UserWarning, w, 1) < 0) rc = -1;
    free(w);
  }
  while ((w = tpu_engine_take_note(st->eng))) { /* explained recompiles, as the per-op ones */
    if (rc == 0 && tpu_stderr_line(w) < 0) rc = -1;
    free(w);
  }
  return rc;
}

/* Whether the calling thread is one of the autograd engine's device threads
 * (torch names them pt_autograd_<device>): a backward pass for a non-CPU
 * device runs its kernels there while the thread that called backward()
 * waits. Read once per thread. */
static _Thread_local signed char tpu_autograd_thread = -1;

static bool tpu_on_autograd_thread(void) {
  if (tpu_autograd_thread < 0) {
    char name[16] = "";
#ifdef __GLIBC__
    if (pthread_getname_np(pthread_self(), name, sizeof name) != 0) name[0] = 0;
#endif
    tpu_autograd_thread = strncmp(name, "pt_autograd_", 12) == 0;
  }
  return tpu_autograd_thread;
}

static PyObject *tpu_run_op(tpu_mod_state *st, int op_id, tpu_arg *args, int nargs, PyObject **params,
                            int nreturns) {
  /* Fused mode: the first op of a backward pass launches what the forward
   * pass recorded (tpu_engine_backward_begins). Ops hold the GIL, so the
   * flag has one writer at a time. */
  if (tpu_engine_mode(st->eng) == TPU_MODE_FUSED) {
    bool bw = tpu_on_autograd_thread();
    if (bw && !st->in_backward) {
      tpu_status *b = tpu_engine_backward_begins(st->eng);
      if (b) return tpu_raise(b);
    }
    st->in_backward = bw;
  }
  tpu_engine_result res;
  tpu_status *s = tpu_engine_call(st->eng, &tpu_op_table[op_id], op_id, args, nargs, &res);
  if (tpu_flush_warnings(st) < 0) {
    if (s) tpu_status_free(s);
    else tpu_engine_result_release(&res);
    return NULL;
  }
  if (s) return tpu_raise(s);
  return tpu_build_result(st, &res, params, nreturns);
}

/* ---- explaining recompiles (TORCHTPU_EXPLAIN_RECOMPILES=1) -------------------------------- */

static void tpu_put_dims(char *buf, size_t n, const int64_t *d, int rank) {
  size_t o = strlen(buf);
  o += (size_t)snprintf(buf + o, o < n ? n - o : 0, "[");
  for (int i = 0; i < rank && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)d[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

static void tpu_describe_tensor(const tpu_tref *t, char *buf, size_t n) {
  if (t->host) {
    snprintf(buf, n, "CPU scalar %s", tpu_dtype_name(t->dtype));
    return;
  }
  if (!t->rec && !t->zero_size) {
    snprintf(buf, n, "None");
    return;
  }
  snprintf(buf, n, "%s", tpu_dtype_name(t->dtype));
  tpu_put_dims(buf, n, t->sizes, t->rank);
  int64_t expect = 1;
  bool contiguous = true;
  for (int i = t->rank - 1; i >= 0; i--) {
    if (t->sizes[i] != 1 && t->strides[i] != expect) contiguous = false;
    expect *= t->sizes[i];
  }
  size_t o = strlen(buf);
  if (!contiguous && o < n) {
    snprintf(buf + o, n - o, " strides ");
    tpu_put_dims(buf, n, t->strides, t->rank);
  }
  o = strlen(buf);
  if (t->view != TPU_VIEW_WHOLE && o < n)
    snprintf(buf + o, n - o, " (a view of %lld elements)", (long long)t->rec_numel);
}

/* What the program key holds of one argument, as text (owned). */
static char *tpu_describe_arg(const tpu_arg *a, int op_id) {
  char buf[512];
  buf[0] = 0;
  switch (a->kind) {
    case TPU_ARG_NONE: snprintf(buf, sizeof buf, "None"); break;
    case TPU_ARG_TENSOR: tpu_describe_tensor(&a->t, buf, sizeof buf); break;
    case TPU_ARG_TENSORS: {
      size_t o = (size_t)snprintf(buf, sizeof buf, "%d tensors: ", a->nlist);
      for (int j = 0; j < a->nlist && o < sizeof buf - 64; j++) {
        char one[160];
        tpu_describe_tensor(&a->list[j], one, sizeof one);
        o += (size_t)snprintf(buf + o, sizeof buf - o, j ? ", %s" : "%s", one);
      }
      break;
    }
    case TPU_ARG_SCALAR: {
      static const char *kinds[] = {"bool", "int", "float", "complex"};
      if (tpu_op_table[op_id].flags & TPU_OP_SCALAR_ATTRS)
        snprintf(buf, sizeof buf, "%s %g", kinds[a->skind], a->f);
      else
        snprintf(buf, sizeof buf, "a Python %s", kinds[a->skind]);
      break;
    }
    case TPU_ARG_INT: snprintf(buf, sizeof buf, "%lld", (long long)a->i); break;
    case TPU_ARG_BOOL: snprintf(buf, sizeof buf, "%s", a->i ? "True" : "False"); break;
    case TPU_ARG_INTS: tpu_put_dims(buf, sizeof buf, a->ints, a->nints); break;
    case TPU_ARG_FLOAT: snprintf(buf, sizeof buf, "%g", a->f); break;
    case TPU_ARG_FLOATS: {
      size_t o = (size_t)snprintf(buf, sizeof buf, "[");
      for (int j = 0; j < a->nints && o < sizeof buf; j++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, j ? ", %g" : "%g", a->floats[j]);
      if (o < sizeof buf) snprintf(buf + o, sizeof buf - o, "]");
      break;
    }
    case TPU_ARG_DTYPE: snprintf(buf, sizeof buf, "%s", tpu_dtype_name(a->dtype)); break;
    case TPU_ARG_STR: snprintf(buf, sizeof buf, "'%s'", a->str); break;
    default: break;
  }
  if (a->is_default && a->kind != TPU_ARG_TENSOR) {
    size_t o = strlen(buf);
    snprintf(buf + o, sizeof buf - o, " (default)");
  }
  return strdup(buf);
}

/* A call compiled a new program: say what differs from the last program
 * compiled for the same op, and remember this call's arguments. */
static int tpu_explain(tpu_mod_state *st, tpu_kernel *k, const tpu_arg *args) {
  int n = k->nparams, op = k->op_id;
  char **now = calloc((size_t)(n ? n : 1), sizeof *now);
  if (!now) return 0;
  for (int i = 0; i < n; i++) now[i] = tpu_describe_arg(&args[i], op);
  char **old = st->explained[op];
  int rc = 0;
  if (old) {
    char msg[4096];
    size_t o = (size_t)snprintf(msg, sizeof msg, "torchtpu: recompiling aten::%s (compiled before for other inputs):",
                                tpu_op_table[op].name);
    int diffs = 0;
    for (int i = 0; i < n && i < st->nexplained[op] && o < sizeof msg; i++) {
      if (!now[i] || !old[i] || strcmp(now[i], old[i]) == 0) continue;
      const char *name = PyUnicode_AsUTF8(k->names[i]);
      o += (size_t)snprintf(msg + o, sizeof msg - o, "%s %s: %s -> %s", diffs++ ? ";" : "", name ? name : "?", old[i],
                            now[i]);
    }
    if (!diffs && o < sizeof msg)
      snprintf(msg + o, sizeof msg - o, " the same inputs (the program cache was emptied, or the matmul precision changed)");
    rc = tpu_stderr_line(msg);
    for (int i = 0; i < st->nexplained[op]; i++) free(old[i]);
    free(old);
  }
  st->explained[op] = now;
  st->nexplained[op] = n;
  return rc;
}

static PyObject *tpu_kernel_call(tpu_kernel *k, PyObject *args, PyObject *kwargs) {
  tpu_mod_state *st = tpu_state(k->module);
  if (!tpu_need_engine(st)) return NULL;
  const char *opname = tpu_op_table[k->op_id].name;
  Py_ssize_t npos = PyTuple_GET_SIZE(args);
  if (npos > k->nparams) {
    PyErr_Format(PyExc_TypeError, "aten::%s: too many arguments", opname);
    return NULL;
  }
  PyObject *params[TPU_MAX_ARGS];
  PyObject *resolved[TPU_MAX_ARGS] = {0}; /* strong: inputs replaced by their plain values */
  /* One frame is kept for the next call (a call made while one runs, from a
   * resolve callback, gets its own). */
  tpu_call_frame *f = st->spare_frame ? st->spare_frame : malloc(sizeof *f);
  st->spare_frame = NULL;
  if (!f) return PyErr_NoMemory();
  PyObject *result = NULL;
  int nparsed = 0;
  for (int i = 0; i < k->nparams; i++) {
    PyObject *o = NULL;
    if (i < npos) o = PyTuple_GET_ITEM(args, i);
    else if (kwargs) o = PyDict_GetItemWithError(kwargs, k->names[i]);
    if (!o && PyErr_Occurred()) goto done;
    if (!o) o = k->defaults[i];
    if (!o) {
      PyErr_Format(PyExc_TypeError, "aten::%s: missing argument '%U'", opname, k->names[i]);
      goto done;
    }
    params[i] = o;
    tpu_arg *a = &f->args[i];
    memset(a, 0, offsetof(tpu_arg, ints));
    a->is_default = k->defaults[i] && (o == k->defaults[i]);
    nparsed = i + 1;
    if (tpu_parse_arg(st, k->kinds[i], o, a, opname) < 0) goto done;
    if (k->resolve && a->kind == TPU_ARG_TENSOR && !a->t.host &&
        (k->resolve_real || tpu_dtype_is_complex(a->t.dtype)) &&
        !(i == 0 && (tpu_op_table[k->op_id].flags & TPU_OP_INPLACE))) { /* an in-place self is written */
      int64_t bit = tpu_call_int(o, st->s_is_conj); /* a bool: 0 or 1 */
      if (bit == 0) bit = tpu_call_int(o, st->s_is_neg);
      if (bit == -1 && PyErr_Occurred()) goto done;
      if (bit) {
        if (!(resolved[i] = PyObject_CallOneArg(k->resolve, o))) goto done;
        params[i] = o = resolved[i];
        memset(a, 0, offsetof(tpu_arg, ints));
        a->is_default = false;
        if (tpu_parse_arg(st, k->kinds[i], o, a, opname) < 0) goto done;
      }
    }
    if (!a->is_default && k->defaults[i] && a->kind == TPU_ARG_SCALAR && k->defaults[i] != Py_None) {
      int eq = PyObject_RichCompareBool(o, k->defaults[i], Py_EQ);
      if (eq < 0) goto done;
      a->is_default = eq;
    }
  }
  long long misses = st->explain ? tpu_engine_metrics(st->eng)->cache_misses : 0;
  result = tpu_run_op(st, k->op_id, f->args, k->nparams, params, k->nreturns);
  if (result && st->explain && tpu_engine_metrics(st->eng)->cache_misses != misses && tpu_explain(st, k, f->args) < 0)
    Py_CLEAR(result);
done:
  tpu_args_free(f->args, nparsed);
  if (st->spare_frame) free(f);
  else st->spare_frame = f;
  for (int i = 0; i < k->nparams; i++) Py_XDECREF(resolved[i]);
  return result;
}

static PyType_Slot tpu_kernel_slots[] = {
    {Py_tp_dealloc, tpu_kernel_dealloc},
    {Py_tp_call, tpu_kernel_call},
    {Py_tp_doc, "A torchtpu kernel for one ATen overload."},
    {0, NULL},
};

static PyType_Spec tpu_kernel_spec = {
    "torchtpu._C.Kernel", sizeof(tpu_kernel), 0, Py_TPFLAGS_DEFAULT, tpu_kernel_slots,
};

/* ---- foreach ops (torch._foreach_*) ------------------------------------------------
 *
 * A foreach overload applies its element op to each item of its lists.
 * torch's own kernel for a new device loops in C++ and dispatches every item
 * again (through the dispatcher and the Python kernel call); this object
 * loops here and calls the element op's kernel directly: one call from torch
 * per list. The element op is an in-place, functional or out= overload of
 * the same op; for an out= one, each item of the first list is also the out
 * argument (as torch's in-place kernels of such ops do). */

typedef struct {
  PyObject_HEAD
  PyObject *base;                   /* the element op's kernel */
  PyObject *module;                 /* strong: torchtpu._C (its engine hears where the call begins and ends) */
  int npos;                         /* positional parameters of the foreach op */
  unsigned lists;                   /* bit i: positional parameter i is a list */
  PyObject *kwname[TPU_MAX_ARGS];   /* strong or NULL: the element op takes positional i by this keyword */
  PyObject *s_out;                  /* strong "out" when items of list 0 are the out argument, else NULL */
  int returns;                      /* 1: a list of the element results; 0: None */
  char name[64];                    /* "_foreach_add_.List", for messages */
} tpu_foreach;

static void tpu_foreach_dealloc(tpu_foreach *f) {
  Py_XDECREF(f->base);
  Py_XDECREF(f->module);
  Py_XDECREF(f->s_out);
  for (int i = 0; i < TPU_MAX_ARGS; i++) Py_XDECREF(f->kwname[i]);
  PyTypeObject *tp = Py_TYPE(f);
  tp->tp_free(f);
  Py_DECREF(tp);
}

static PyObject *tpu_foreach_call(tpu_foreach *f, PyObject *args, PyObject *kwargs) {
  Py_ssize_t npos = PyTuple_GET_SIZE(args);
  if (npos > f->npos || npos < 1) return PyErr_Format(PyExc_TypeError, "aten::%s: expected at most %d positional "
                                                      "arguments, got %zd", f->name, f->npos, npos);
  PyObject *fast[TPU_MAX_ARGS] = {0};
  PyObject *res = NULL, *kw = NULL, *pos = NULL;
  tpu_engine *eng = NULL; /* told of the call's items once they are recorded */
  Py_ssize_t n = -1, nbase = 0;
  bool need_kw = f->s_out != NULL;
  for (Py_ssize_t i = 0; i < npos; i++) {
    if (f->kwname[i]) need_kw = true;
    else nbase++;
    if (!(f->lists & (1u << i))) continue;
    if (!(fast[i] = PySequence_Fast(PyTuple_GET_ITEM(args, i), "a foreach list"))) goto done;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast[i]);
    if (n < 0) {
      n = len;
    } else if (len != n) {
      PyErr_Format(PyExc_RuntimeError, "aten::%s: all lists must have the same length, got %zd and %zd", f->name, n,
                   len);
      goto done;
    }
  }
  if (n <= 0) {
    PyErr_Format(PyExc_RuntimeError, "aten::%s: Tensor list must have at least one tensor.", f->name);
    goto done;
  }
  if (need_kw) kw = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
  else if (kwargs) kw = Py_NewRef(kwargs);
  if ((need_kw && !kw) || (f->returns && !(res = PyList_New(n)))) goto done;
  eng = tpu_state(f->module)->eng;
  if (eng) tpu_engine_foreach(eng, true);
  for (Py_ssize_t j = 0; j < n; j++) {
    if (!(pos = PyTuple_New(nbase))) goto fail;
    for (Py_ssize_t i = 0, b = 0; i < npos; i++) {
      PyObject *o = fast[i] ? PySequence_Fast_GET_ITEM(fast[i], j) : PyTuple_GET_ITEM(args, i);
      if (!f->kwname[i]) PyTuple_SET_ITEM(pos, b++, Py_NewRef(o));
      else if (PyDict_SetItem(kw, f->kwname[i], o) < 0) goto fail;
    }
    if (f->s_out && PyDict_SetItem(kw, f->s_out, PySequence_Fast_GET_ITEM(fast[0], j)) < 0) goto fail;
    PyObject *r = PyObject_Call(f->base, pos, kw);
    Py_CLEAR(pos);
    if (!r) goto fail;
    if (f->returns) PyList_SET_ITEM(res, j, r);
    else Py_DECREF(r);
  }
  if (!res) res = Py_NewRef(Py_None);
  goto done;
fail:
  Py_CLEAR(res);
  Py_CLEAR(pos);
done:
  if (eng) tpu_engine_foreach(eng, false);
  for (int i = 0; i < TPU_MAX_ARGS; i++) Py_XDECREF(fast[i]);
  Py_XDECREF(kw);
  return res;
}

static PyType_Slot tpu_foreach_slots[] = {
    {Py_tp_dealloc, tpu_foreach_dealloc},
    {Py_tp_call, tpu_foreach_call},
    {Py_tp_doc, "A torchtpu kernel for one torch._foreach_* overload: its element op's kernel, item by item."},
    {0, NULL},
};

static PyType_Spec tpu_foreach_spec = {
    "torchtpu._C.Foreach", sizeof(tpu_foreach), 0, Py_TPFLAGS_DEFAULT, tpu_foreach_slots,
};

/* foreach(name, base, lists, kwnames, out_self, returns_list): lists is a bit
 * mask of the list parameters among the positional ones; kwnames gives, for
 * each positional parameter, None or the keyword the element op takes it by. */
static PyObject *tpu_py_foreach(PyObject *m, PyObject *args) {
  const char *name;
  PyObject *base, *kwnames;
  int out_self, returns;
  unsigned lists;
  if (!PyArg_ParseTuple(args, "sOIO!pp", &name, &base, &lists, &PyTuple_Type, &kwnames, &out_self, &returns))
    return NULL;
  Py_ssize_t npos = PyTuple_GET_SIZE(kwnames);
  if (npos < 1 || npos > TPU_MAX_ARGS || !(lists & 1u))
    return PyErr_Format(PyExc_ValueError, "foreach %s: bad parameters", name);
  tpu_foreach *f = PyObject_New(tpu_foreach, (PyTypeObject *)tpu_state(m)->foreach_type);
  if (!f) return NULL;
  for (Py_ssize_t i = 0; i < TPU_MAX_ARGS; i++) {
    PyObject *k = i < npos ? PyTuple_GET_ITEM(kwnames, i) : Py_None;
    f->kwname[i] = k == Py_None ? NULL : Py_NewRef(k);
  }
  f->base = Py_NewRef(base);
  f->module = Py_NewRef(m);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->npos = (int)npos;
  f->lists = lists;
  f->returns = returns;
  f->s_out = out_self ? PyUnicode_InternFromString("out") : NULL;
  if (out_self && !f->s_out) Py_CLEAR(f);
  return (PyObject *)f;
}

/* kernel(op_id, spec, nreturns): spec is a sequence of (name, kind, default)
 * where kind is one character (see tpu_parse_arg) and default is a value or
 * a missing-marker (the module's REQUIRED object). */
static PyObject *tpu_py_kernel(PyObject *m, PyObject *args) {
  int op_id, nreturns;
  PyObject *spec, *required, *resolve = Py_None;
  int resolve_real = 0;
  if (!PyArg_ParseTuple(args, "iOiO|Op", &op_id, &spec, &nreturns, &required, &resolve, &resolve_real)) return NULL;
  if (op_id < 0 || op_id >= TPU_NUM_OPS) return PyErr_Format(PyExc_ValueError, "bad op id %d", op_id);
  tpu_mod_state *st = tpu_state(m);
  PyObject *fast = PySequence_Fast(spec, "spec must be a sequence");
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > TPU_MAX_ARGS) {
    Py_DECREF(fast);
    return PyErr_Format(PyExc_ValueError, "aten::%s has %zd arguments (max %d)", tpu_op_table[op_id].name, n,
                        TPU_MAX_ARGS);
  }
  tpu_kernel *k = PyObject_New(tpu_kernel, (PyTypeObject *)st->kernel_type);
  if (!k) {
    Py_DECREF(fast);
    return NULL;
  }
  k->module = Py_NewRef(m);
  k->resolve = resolve == Py_None ? NULL : Py_NewRef(resolve);
  k->resolve_real = resolve_real;
  k->op_id = op_id;
  k->nreturns = nreturns;
  k->nparams = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *name, *kind, *dflt;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "UUO", &name, &kind, &dflt)) {
      Py_DECREF(fast);
      Py_DECREF(k);
      return NULL;
    }
    const char *ks = PyUnicode_AsUTF8(kind);
    k->kinds[i] = ks ? ks[0] : '?';
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    k->names[i] = name;
    k->defaults[i] = dflt == required ? NULL : Py_NewRef(dflt);
    k->nparams = (int)i + 1;
  }
  Py_DECREF(fast);
  return (PyObject *)k;
}

/* ---- module functions ------------------------------------------------------------------ */

/* The engine's settings from init()'s dict (every key present; the package
 * reads them from the environment and bounds them). */
static int tpu_options_from_dict(PyObject *d, tpu_engine_options *o) {
  if (!PyDict_Check(d)) {
    PyErr_SetString(PyExc_TypeError, "init: settings must be a dict");
    return -1;
  }
  const char *ints[] = {"fused_max_ops", "program_cache_size"};
  long *ivals[] = {NULL, &o->program_cache_size};
  long fuse = 0;
  ivals[0] = &fuse;
  for (int i = 0; i < 2; i++) {
    PyObject *v = PyDict_GetItemString(d, ints[i]); /* borrowed */
    if (!v) return PyErr_Format(PyExc_KeyError, "init: settings lack %s", ints[i]), -1;
    *ivals[i] = PyLong_AsLong(v);
    if (*ivals[i] == -1 && PyErr_Occurred()) return -1;
    if (*ivals[i] < 1 || *ivals[i] > (1L << 20))
      return PyErr_Format(PyExc_ValueError, "init: %s=%ld is not from 1 to 2**20", ints[i], *ivals[i]), -1;
  }
  o->fuse_cap = (int)fuse;
  const char *flags[] = {"donate", "value_checks", "explain", "debug", "dump_hlo"};
  bool *fvals[] = {&o->donate, &o->value_checks, &o->explain, &o->debug, &o->dump_hlo};
  for (int i = 0; i < 5; i++) {
    PyObject *v = PyDict_GetItemString(d, flags[i]);
    if (!v) return PyErr_Format(PyExc_KeyError, "init: settings lack %s", flags[i]), -1;
    int on = PyObject_IsTrue(v);
    if (on < 0) return -1;
    *fvals[i] = on;
  }
  PyObject *mode = PyDict_GetItemString(d, "mode");
  if (!mode) return PyErr_Format(PyExc_KeyError, "init: settings lack mode"), -1;
  return tpu_mode_from_py(mode, &o->mode);
}

static PyObject *tpu_py_init(PyObject *m, PyObject *args) {
  const char *path, *platform;
  int ndev;
  const char *error = NULL;
  double fraction = 0;
  PyObject *dtypes, *from_dlpack, *empty, *settings;
  if (!PyArg_ParseTuple(args, "ssiOOOdzO", &path, &platform, &ndev, &dtypes, &from_dlpack, &empty, &fraction,
                        &error, &settings))
    return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (st->eng) Py_RETURN_NONE;
  tpu_engine_options o;
  tpu_engine_options_init(&o);
  if (tpu_options_from_dict(settings, &o) < 0) return NULL;
  o.rt = (tpu_rt_options){path, platform, ndev, fraction};
  o.rt_error = error;
  PyObject *fast = PySequence_Fast(dtypes, "dtypes must be a sequence");
  if (!fast) return NULL;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast) && i < TPU_NUM_DTYPES; i++) {
    PyObject *d = PySequence_Fast_GET_ITEM(fast, i);
    Py_XSETREF(st->dtypes[i], d == Py_None ? NULL : Py_NewRef(d));
  }
  Py_DECREF(fast);
  Py_XSETREF(st->from_dlpack, Py_NewRef(from_dlpack));
  Py_XSETREF(st->torch_empty, Py_NewRef(empty));
  tpu_status *s = tpu_engine_new(&o, &st->eng);
  if (s) return tpu_raise(s);
  st->explain = o.explain;
  Py_RETURN_NONE;
}

static PyObject *tpu_py_ops(PyObject *m, PyObject *noargs) {
  (void)m;
  (void)noargs;
  PyObject *l = PyList_New(0);
  if (!l) return NULL;
  for (int i = 0; i < TPU_NUM_OPS; i++) {
    PyObject *t = Py_BuildValue("(sii)", tpu_op_table[i].name, i, tpu_op_table[i].flags);
    if (!t || PyList_Append(l, t) < 0) {
      Py_XDECREF(t);
      Py_DECREF(l);
      return NULL;
    }
    Py_DECREF(t);
  }
  return l;
}

static int tpu_dtype_arg(tpu_mod_state *st, PyObject *d, tpu_dtype *out) {
  *out = tpu_dtype_from_py(st, d);
  if (*out == TPU_INVALID) {
    PyErr_Format(PyExc_TypeError, "dtype %R is not supported on tpu", d);
    return -1;
  }
  return 0;
}

/* empty(sizes, dtype, strides or None) -> a tpu tensor on a fresh record. */
static PyObject *tpu_py_empty(PyObject *m, PyObject *args) {
  PyObject *sizes_o, *dtype_o, *strides_o;
  if (!PyArg_ParseTuple(args, "OOO", &sizes_o, &dtype_o, &strides_o)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  int64_t sizes[TPU_MAX_RANK], strides[TPU_MAX_RANK];
  int rank = tpu_int64_seq(sizes_o, sizes, TPU_MAX_RANK, "size");
  if (rank < 0) return NULL;
  tpu_dtype dt;
  if (tpu_dtype_arg(st, dtype_o, &dt) < 0) return NULL;
  for (int i = 0; i < rank; i++)
    if (sizes[i] < 0)
      return PyErr_Format(PyExc_RuntimeError, "Trying to create tensor with negative dimension %lld: %R",
                          (long long)sizes[i], sizes_o);
  bool have_strides = strides_o != Py_None;
  if (have_strides && tpu_int64_seq(strides_o, strides, TPU_MAX_RANK, "stride") != rank)
    return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "size and stride lengths differ");
  int64_t numel;
  if (tpu_storage_check(rank, sizes, have_strides ? strides : NULL, dt, &numel) < 0) return NULL;
  tpu_record *r = tpu_record_new(st->eng, dt, numel);
  if (!r) return PyErr_NoMemory();
  return tpu_mint(st, r, rank, sizes, have_strides ? strides : NULL);
}

static PyObject *tpu_py_to_tref_args(tpu_mod_state *st, PyObject *o, tpu_arg *a, const char *op) {
  memset(a, 0, sizeof *a);
  a->kind = TPU_ARG_TENSOR;
  if (tpu_tref_from_py(st, o, &a->t, op) < 0) return NULL;
  return Py_None;
}

/* A new CPU tensor: empty(sizes, dtype=dt). */
static PyObject *tpu_host_empty(tpu_mod_state *st, PyObject *sizes, tpu_dtype dt) {
  PyObject *kw = Py_BuildValue("{sO}", "dtype", st->dtypes[dt]);
  PyObject *pargs = kw ? PyTuple_Pack(1, sizes) : NULL;
  PyObject *out = pargs ? PyObject_Call(st->torch_empty, pargs, kw) : NULL;
  Py_XDECREF(pargs);
  Py_XDECREF(kw);
  return out;
}

/* Copies rec's whole buffer into the CPU tensor out (of rec's size). */
static int tpu_download_into(tpu_mod_state *st, tpu_record *rec, PyObject *out) {
  int64_t p = tpu_call_int(out, st->s_data_ptr);
  if (p == -1 && PyErr_Occurred()) return -1;
  tpu_status *s = tpu_engine_download(st->eng, rec, (void *)(uintptr_t)p, (size_t)rec->numel * tpu_dtype_size(rec->dtype));
  if (s) {
    tpu_raise(s);
    return -1;
  }
  return 0;
}

/* A view read on the host: the record comes down whole and the view is cut
 * from it there, when the record is not much larger than the view. A
 * program that gathers the view on the device would be compiled for each
 * new view shape (padded outputs of compiled graphs, slices of growing
 * sequences). */
enum { TPU_HOST_VIEW_SLACK = 1 << 16 };

static PyObject *tpu_download_host_view(tpu_mod_state *st, PyObject *src_o, const tpu_tref *t) {
  tpu_record *rec = t->rec;
  int64_t numel = 1;
  for (int d = 0; d < t->rank; d++) numel *= t->sizes[d];
  if (t->rec_dtype != TPU_INVALID && t->rec_dtype != t->dtype) return Py_NewRef(Py_None);
  if (rec->numel > 2 * numel + TPU_HOST_VIEW_SLACK) return Py_NewRef(Py_None);
  PyObject *flat_size = Py_BuildValue("(L)", (long long)rec->numel);
  PyObject *flat = flat_size ? tpu_host_empty(st, flat_size, rec->dtype) : NULL;
  Py_XDECREF(flat_size);
  if (!flat || tpu_download_into(st, rec, flat) < 0) {
    Py_XDECREF(flat);
    return NULL;
  }
  PyObject *shape = PyObject_GetAttr(src_o, st->s_shape);
  PyObject *stride = shape ? PyTuple_New(t->rank) : NULL;
  for (int d = 0; stride && d < t->rank; d++) PyTuple_SET_ITEM(stride, d, PyLong_FromLongLong(t->strides[d]));
  PyObject *view = stride ? PyObject_CallMethod(flat, "as_strided", "OOL", shape, stride, (long long)t->offset) : NULL;
  PyObject *out = view ? PyObject_CallMethod(view, "contiguous", NULL) : NULL;
  Py_XDECREF(view);
  Py_XDECREF(stride);
  Py_XDECREF(shape);
  Py_DECREF(flat);
  return out;
}

/* Download the view t (a tpu tensor) as a contiguous host copy into a new
 * CPU tensor of the same dtype and shape. */
static PyObject *tpu_download_view(tpu_mod_state *st, PyObject *src_o, tpu_arg *src) {
  tpu_record *rec = src->t.rec;
  tpu_record *tmp = NULL;
  if (tpu_lower_view_kind(&src->t) != TPU_VIEW_WHOLE) {
    PyObject *host = tpu_download_host_view(st, src_o, &src->t);
    if (host != Py_None) return host;
    Py_DECREF(host);
    tpu_engine_result res;
    tpu_status *s = tpu_engine_call(st->eng, &tpu_op_table[TPU_OP_tpu_materialize], TPU_OP_tpu_materialize, src, 1,
                                    &res);
    if (tpu_flush_warnings(st) < 0) {
      if (s) tpu_status_free(s);
      else tpu_engine_result_release(&res);
      return NULL;
    }
    if (s) return tpu_raise(s);
    tmp = res.outs[0];
    res.outs[0] = NULL;
    tpu_engine_result_release(&res);
    rec = tmp;
  }
  PyObject *shape = PyObject_GetAttr(src_o, st->s_shape);
  PyObject *out = shape ? tpu_host_empty(st, shape, src->t.dtype) : NULL;
  Py_XDECREF(shape);
  if (out && tpu_download_into(st, rec, out) < 0) Py_CLEAR(out);
  tpu_record_unref(tmp);
  return out;
}

/* copy_from(src, dst): torch's _copy_from, all three directions. */
static PyObject *tpu_py_copy_from(PyObject *m, PyObject *args) {
  PyObject *src_o, *dst_o;
  if (!PyArg_ParseTuple(args, "OO", &src_o, &dst_o)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  PyObject *iscpu = PyObject_GetAttr(src_o, st->s_is_cpu);
  if (!iscpu) return NULL;
  int src_cpu = PyObject_IsTrue(iscpu);
  Py_DECREF(iscpu);
  iscpu = PyObject_GetAttr(dst_o, st->s_is_cpu);
  if (!iscpu) return NULL;
  int dst_cpu = PyObject_IsTrue(iscpu);
  Py_DECREF(iscpu);
  tpu_arg a[2];
  PyObject *params[2] = {dst_o, src_o};
  PyObject *n = PyObject_CallMethod(dst_o, "numel", NULL);
  if (!n) return NULL;
  long long dst_numel = PyLong_AsLongLong(n);
  Py_DECREF(n);
  if (dst_numel == 0) { /* nothing to copy, but the shapes must fit as torch's copy_ checks */
    int64_t ds[TPU_MAX_RANK], ss[TPU_MAX_RANK];
    PyObject *dsh = PyObject_GetAttr(dst_o, st->s_shape), *ssh = dsh ? PyObject_GetAttr(src_o, st->s_shape) : NULL;
    int dr = ssh ? tpu_int64_seq(dsh, ds, TPU_MAX_RANK, "shape") : -1;
    int sr = dr >= 0 ? tpu_int64_seq(ssh, ss, TPU_MAX_RANK, "shape") : -1;
    Py_XDECREF(dsh);
    Py_XDECREF(ssh);
    if (sr < 0) return NULL;
    tpu_status *s = tpu_broadcast_check(dr, ds, sr, ss);
    if (s) return tpu_raise(s);
    return Py_NewRef(dst_o);
  }

  if (!dst_cpu && !src_cpu) {
    if (!tpu_py_to_tref_args(st, dst_o, &a[0], "_copy_from") || !tpu_py_to_tref_args(st, src_o, &a[1], "_copy_from"))
      return NULL;
    PyObject *r = tpu_run_op(st, TPU_OP_tpu_copy, a, 2, params, 1);
    return r;
  }
  if (!dst_cpu) {
    /* host -> device: upload a contiguous copy, then write it into the view. */
    if (!tpu_py_to_tref_args(st, dst_o, &a[0], "_copy_from")) return NULL;
    PyObject *c = PyObject_CallMethodNoArgs(src_o, st->s_contiguous);
    if (!c) return NULL;
    PyObject *d = PyObject_GetAttr(c, st->s_dtype);
    tpu_dtype sdt = d ? tpu_dtype_from_py(st, d) : TPU_INVALID;
    Py_XDECREF(d);
    PyObject *shape = PyObject_GetAttr(c, st->s_shape);
    int64_t sizes[TPU_MAX_RANK];
    int rank = shape ? tpu_int64_seq(shape, sizes, TPU_MAX_RANK, "shape") : -1;
    Py_XDECREF(shape);
    int64_t ptr = rank >= 0 ? tpu_call_int(c, st->s_data_ptr) : -1;
    if (rank < 0 || (ptr == -1 && PyErr_Occurred()) || sdt == TPU_INVALID) {
      Py_DECREF(c);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "copy to tpu: unsupported source dtype");
      return NULL;
    }
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) numel *= sizes[i];
    tpu_tref *dt = &a[0].t;
    bool same_shape = rank == dt->rank && memcmp(sizes, dt->sizes, sizeof(int64_t) * (size_t)rank) == 0;
    tpu_status *s = NULL;
    if (same_shape && sdt == dt->dtype && sdt == dt->rec->dtype && tpu_lower_view_kind(dt) == TPU_VIEW_WHOLE) {
      s = tpu_engine_upload(st->eng, dt->rec, (const void *)(uintptr_t)ptr, sdt, rank, sizes);
      Py_DECREF(c);
      if (s) return tpu_raise(s);
      return Py_NewRef(dst_o);
    }
    tpu_record *tmp = tpu_record_new(st->eng, sdt, numel);
    if (!tmp) {
      Py_DECREF(c);
      return PyErr_NoMemory();
    }
    s = tpu_engine_upload(st->eng, tmp, (const void *)(uintptr_t)ptr, sdt, rank, sizes);
    Py_DECREF(c);
    if (s) {
      tpu_record_unref(tmp);
      return tpu_raise(s);
    }
    memset(&a[1], 0, sizeof a[1]);
    a[1].kind = TPU_ARG_TENSOR;
    a[1].t.rec = tmp;
    a[1].t.dtype = sdt;
    a[1].t.rank = rank;
    a[1].t.rec_numel = numel;
    memcpy(a[1].t.sizes, sizes, sizeof(int64_t) * (size_t)rank);
    int64_t acc = 1;
    for (int i = rank - 1; i >= 0; i--) {
      a[1].t.strides[i] = acc;
      acc *= sizes[i];
    }
    PyObject *r = tpu_run_op(st, TPU_OP_tpu_copy, a, 2, params, 1);
    tpu_record_unref(tmp);
    return r;
  }
  /* device -> host: download a contiguous copy, let CPU torch place it. */
  if (!tpu_py_to_tref_args(st, src_o, &a[1], "_copy_from")) return NULL;
  PyObject *host = tpu_download_view(st, src_o, &a[1]);
  if (!host) return NULL;
  PyObject *r = PyObject_CallMethodOneArg(dst_o, st->s_copy_, host);
  Py_DECREF(host);
  if (!r) return NULL;
  Py_DECREF(r);
  return Py_NewRef(dst_o);
}

/* to_cpu(t): a contiguous CPU copy of a tpu tensor (same dtype and shape). */
static PyObject *tpu_py_to_cpu(PyObject *m, PyObject *t) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_arg a;
  if (!tpu_py_to_tref_args(st, t, &a, "_to_cpu")) return NULL;
  PyObject *r = tpu_download_view(st, t, &a); /* a sync point: recorded ops may have been compiled */
  if (r && tpu_flush_warnings(st) < 0) Py_CLEAR(r);
  return r;
}

static PyObject *tpu_py_info(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_rt *rt = tpu_engine_rt(st->eng);
  int major, minor;
  tpu_rt_api_version(rt, &major, &minor);
  return Py_BuildValue("{sssssssisss(ii)}", "platform", tpu_rt_platform_name(rt), "platform_version",
                       tpu_rt_platform_version(rt), "plugin", tpu_rt_plugin_path(rt), "device_count",
                       tpu_rt_device_count(rt), "device_kind", tpu_rt_device_kind(rt, 0), "api_version", major,
                       minor);
}

/* Sets d[name] = v (a new reference, stolen); -1 on error. */
static int tpu_dict_put(PyObject *d, const char *name, PyObject *v) {
  int rc = v ? PyDict_SetItemString(d, name, v) : -1;
  Py_XDECREF(v);
  return rc;
}

static PyObject *tpu_py_metrics(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  static const tpu_metrics none; /* before init(): every counter 0 */
  const tpu_metrics *x = st->eng ? tpu_engine_metrics(st->eng) : &none;
  tpu_rt *rt = st->eng ? tpu_engine_rt(st->eng) : NULL;
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  int rc = 0;
#define X(field, name, ns)                                                                                  \
  if (!rc)                                                                                                  \
    rc = tpu_dict_put(d, name,                                                                              \
                      ns ? PyFloat_FromDouble((double)x->field * 1e-9) : PyLong_FromLongLong((long long)x->field));
  TPU_METRICS(X)
#undef X
  for (int i = 0; i < TPU_FLUSH_COUNT && !rc; i++) {
    char name[64];
    snprintf(name, sizeof name, "flushes_%s", tpu_flush_names[i]);
    rc = tpu_dict_put(d, name, PyLong_FromLongLong((long long)x->flushes[i]));
  }
  if (!rc) rc = tpu_dict_put(d, "live_buffers", PyLong_FromLongLong(rt ? (long long)tpu_rt_live_buffers(rt) : 0LL));
  if (!rc)
    rc = tpu_dict_put(d, "cache_entries", PyLong_FromLongLong(st->eng ? (long long)tpu_engine_cache_size(st->eng) : 0));
  if (!rc) rc = tpu_dict_put(d, "unwind_tables_ignored", PyLong_FromLongLong((long long)tpu_rt_unwind_tables_ignored()));
  if (rc) Py_CLEAR(d);
  return d;
}

/* memory(reset_peak=False) -> dict. allocated/peak: bytes of the live
 * device buffers as counted by the runtime (every plugin); device_in_use,
 * device_peak, device_limit: the plugin's own statistics, -1 where it
 * reports none (XLA's CPU plugin). */
static PyObject *tpu_py_memory(PyObject *m, PyObject *args) {
  int reset = 0;
  if (!PyArg_ParseTuple(args, "|p", &reset)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!st->eng || !tpu_engine_started(st->eng)) /* nothing allocated yet */
    return Py_BuildValue("{sisisisisi}", "allocated", 0, "peak", 0, "device_in_use", -1, "device_peak", -1,
                         "device_limit", -1);
  tpu_rt *rt = tpu_engine_rt(st->eng);
  if (reset) tpu_rt_reset_peak_bytes(rt);
  int64_t in_use = -1, peak = -1, limit = -1;
  tpu_status *s = tpu_rt_device_memory(rt, &in_use, &peak, &limit);
  if (s) {
    in_use = -1;
    tpu_status_free(s);
  }
  return Py_BuildValue("{sLsLsLsLsL}", "allocated", (long long)tpu_rt_live_bytes(rt), "peak",
                       (long long)tpu_rt_peak_bytes(rt), "device_in_use", (long long)in_use, "device_peak",
                       (long long)peak, "device_limit", (long long)limit);
}

/* matmul_precision() -> 0 (DEFAULT) | 1 (HIGH) | 2 (HIGHEST); matmul_precision(p) sets it. */
static PyObject *tpu_py_matmul_precision(PyObject *m, PyObject *args) {
  int p = -1;
  if (!PyArg_ParseTuple(args, "|i", &p)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (p > TPU_HLO_PREC_HIGHEST) return PyErr_Format(PyExc_ValueError, "matmul precision %d is not 0, 1 or 2", p);
  if (!tpu_eng(st)) return NULL;
  if (p >= 0) tpu_engine_set_precision(st->eng, (tpu_hlo_precision)p);
  return PyLong_FromLong((long)tpu_engine_precision(st->eng));
}

/* value_checks([on]) -> on: whether programs make value checks (read from
 * TORCHTPU_VALUE_CHECKS when the device starts; part of every program's key,
 * so both kinds can be cached at once, as the benchmark compares them). */
static PyObject *tpu_py_value_checks(PyObject *m, PyObject *args) {
  int on = -1;
  if (!PyArg_ParseTuple(args, "|p", &on)) return NULL;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  if (on >= 0) tpu_engine_set_value_checks(e, on);
  return PyBool_FromLong(tpu_engine_value_checks(e));
}

/* disk_cache(dir, max_bytes, extra_salt) -> None: turn the disk tier on
 * (dir None or "": off). The salt is the runtime's (platform, versions,
 * compile options, plugin file, compiler flags) plus extra_salt (torchtpu's
 * version). A folder that cannot be used raises OSError, and the caller
 * falls back; before the runtime starts the folder is only noted, and its
 * start warns instead. */
static PyObject *tpu_py_disk_cache(PyObject *m, PyObject *args) {
  const char *dir = NULL, *extra = "";
  long long max_bytes = 0;
  if (!PyArg_ParseTuple(args, "zLs", &dir, &max_bytes, &extra)) return NULL;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  tpu_status *s = tpu_engine_set_disk_cache(e, dir, (int64_t)max_bytes, extra);
  if (s && tpu_status_code(s) != TPU_ERR_MEMORY) {
    PyErr_SetString(PyExc_OSError, tpu_status_message(s));
    tpu_status_free(s);
    return NULL;
  }
  if (s) return tpu_raise(s);
  Py_RETURN_NONE;
}

/* eager_mode() -> "debug" | "strict" | "fused"; eager_mode(name) sets it
 * after running the recorded ops and, with sync (the default), waiting for
 * everything launched (so an earlier asynchronous failure is reported by the
 * switch). */
static PyObject *tpu_py_eager_mode(PyObject *m, PyObject *args) {
  PyObject *name = NULL;
  int sync = 1;
  if (!PyArg_ParseTuple(args, "|Op", &name, &sync)) return NULL;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  if (name) {
    tpu_mode mode;
    if (tpu_mode_from_py(name, &mode) < 0) return NULL;
    tpu_status *s = tpu_engine_flush(e, TPU_FLUSH_MODE);
    if (!s && sync) s = tpu_engine_sync(e);
    if (s) return tpu_raise(s);
    tpu_engine_set_mode(e, mode);
  }
  return PyUnicode_FromString(tpu_mode_names[tpu_engine_mode(e)]);
}

/* modes() -> the eager modes' names. */
static PyObject *tpu_py_modes(PyObject *m, PyObject *noargs) {
  (void)m;
  (void)noargs;
  PyObject *t = PyTuple_New(TPU_MODE_COUNT);
  for (int i = 0; t && i < TPU_MODE_COUNT; i++) {
    PyObject *s = PyUnicode_FromString(tpu_mode_names[i]);
    if (!s) {
      Py_CLEAR(t);
      break;
    }
    PyTuple_SET_ITEM(t, i, s);
  }
  return t;
}

/* flush(step=False): launches the recorded ops (fused mode) without
 * waiting: what an event recorded now stands behind. With step, the end of
 * a training step (an optimizer stepped): at most TPU_STEPS_AHEAD programs
 * stay in flight, so that a loop that never reads a value back still runs
 * one program per step while the host records the next. */
static PyObject *tpu_py_flush(PyObject *m, PyObject *args) {
  int step = 0;
  if (!PyArg_ParseTuple(args, "|p", &step)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!st->eng) Py_RETURN_NONE;
  tpu_status *s = step ? tpu_engine_flush_step(st->eng) : tpu_engine_flush(st->eng, TPU_FLUSH_SYNC);
  if (s) return tpu_raise(s);
  Py_RETURN_NONE;
}

/* backward_passes() -> backward passes begun in fused mode (the optimizer
 * step's hook skips its flush when one began since that optimizer's last
 * step: the backward pass launched the step's program). */
static PyObject *tpu_py_backward_passes(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  return PyLong_FromLongLong(st->eng ? (long long)tpu_engine_metrics(st->eng)->backward_passes : 0);
}

/* idle() -> True when every launched computation has finished (no wait). */
static PyObject *tpu_py_idle(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  if (!st->eng) Py_RETURN_TRUE;
  return PyBool_FromLong(tpu_engine_idle(st->eng));
}

static PyObject *tpu_py_synchronize(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  if (!st->eng) Py_RETURN_NONE; /* nothing was launched */
  tpu_status *s = tpu_engine_sync(st->eng);
  if (s) return tpu_raise(s);
  if (tpu_flush_warnings(st) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *tpu_py_count_fallback(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  if (st->eng) atomic_fetch_add(&tpu_engine_metrics(st->eng)->fallback_ops, 1);
  Py_RETURN_NONE;
}

/* torch.manual_seed seeds every device: the engine keeps it, so seeding
 * before the device's first use starts nothing (as torch.cuda queues it). */
static int tpu_rng_set(tpu_mod_state *st, uint64_t seed, uint64_t offset) {
  tpu_engine *e = tpu_eng(st);
  if (!e) return -1;
  tpu_engine_set_rng_state(e, seed, offset);
  return 0;
}

static PyObject *tpu_py_manual_seed(PyObject *m, PyObject *arg) {
  unsigned long long seed = PyLong_AsUnsignedLongLongMask(arg);
  if (PyErr_Occurred()) return NULL;
  if (tpu_rng_set(tpu_state(m), seed, 0) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *tpu_py_rng_state(PyObject *m, PyObject *args) {
  tpu_mod_state *st = tpu_state(m);
  unsigned long long seed, off;
  if (PyTuple_GET_SIZE(args) == 0) {
    uint64_t a = TPU_DEFAULT_SEED, b = 0;
    if (st->eng) tpu_engine_rng_state(st->eng, &a, &b);
    return Py_BuildValue("(KK)", (unsigned long long)a, (unsigned long long)b);
  }
  if (!PyArg_ParseTuple(args, "KK", &seed, &off)) return NULL;
  if (tpu_rng_set(st, seed, off) < 0) return NULL;
  Py_RETURN_NONE;
}


/* ---- graph plans (torch.compile) ----------------------------------------------------------
 *
 * graph_capture_begin() -> token; the graph runs (recorded in fused mode);
 * graph_capture_end(token, args, outs) -> (plan or None, why) runs it and
 * describes how to replay it; graph_replay(plans, args) runs the first plan
 * whose inputs match args, or returns None. */

enum { TPU_GA_OTHER = 0, TPU_GA_TENSOR = 1, TPU_GA_UNSUPPORTED = -1 };

typedef struct {
  tpu_plan *plan;        /* owned */
  int nargs;
  signed char *kinds;    /* TPU_GA_* by argument */
  PyObject *consts;      /* tuple: the non-tensor arguments (None where a tensor) */
  int nouts;
  int *out_slot;         /* by output: the plan's output index, -1 for a constant */
  int *out_same;         /* by output: the argument it is (the very object), -1 */
  PyObject *out_consts;  /* tuple: the non-tensor outputs (None where a tensor) */
  int as_list;
} tpu_pyplan;

static void tpu_pyplan_free(tpu_pyplan *pp) {
  if (!pp) return;
  tpu_plan_free(pp->plan);
  free(pp->kinds);
  free(pp->out_slot);
  free(pp->out_same);
  Py_XDECREF(pp->consts);
  Py_XDECREF(pp->out_consts);
  free(pp);
}

static void tpu_pyplan_destructor(PyObject *cap) { tpu_pyplan_free(PyCapsule_GetPointer(cap, "torchtpu.plan")); }

static PyObject *tpu_tensor_type(tpu_mod_state *st) {
  if (!st->tensor_type) {
    PyObject *torch = PyImport_ImportModule("torch");
    if (!torch) return NULL;
    st->tensor_type = PyObject_GetAttrString(torch, "Tensor");
    Py_DECREF(torch);
  }
  return st->tensor_type;
}

/* Reads a sequence of graph values: kinds[i] and, for tpu tensors, their
 * views in trefs (in order). Returns the count of tensors, or -1 with an
 * exception set. A CPU tensor, or one torchtpu cannot read, is UNSUPPORTED. */
static int tpu_graph_values(tpu_mod_state *st, PyObject *fast, signed char *kinds, tpu_tref *trefs) {
  PyObject *tt = tpu_tensor_type(st);
  if (!tt) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  int nt = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(fast, i);
    int ist = PyObject_IsInstance(o, tt);
    if (ist < 0) return -1;
    if (!ist) {
      kinds[i] = TPU_GA_OTHER;
      continue;
    }
    PyObject *iscpu = PyObject_GetAttr(o, st->s_is_cpu);
    if (!iscpu) return -1;
    int cpu = PyObject_IsTrue(iscpu);
    Py_DECREF(iscpu);
    if (cpu || tpu_tref_from_py(st, o, &trefs[nt], "graph") < 0) {
      PyErr_Clear();
      kinds[i] = TPU_GA_UNSUPPORTED;
      continue;
    }
    kinds[i] = TPU_GA_TENSOR;
    nt++;
  }
  return nt;
}

static PyObject *tpu_py_graph_capture_begin(PyObject *m, PyObject *args) {
  int whole = 0; /* torch.tpu.graph: a whole-step capture (whole_end ends it) */
  if (!PyArg_ParseTuple(args, "|p", &whole)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  int prev;
  tpu_status *s = whole ? tpu_engine_graph_begin(st->eng, &prev) : tpu_engine_capture_begin(st->eng, &prev);
  if (s) return tpu_raise(s);
  return PyLong_FromLong(prev);
}

static PyObject *tpu_py_graph_capture_end(PyObject *m, PyObject *args) {
  int prev;
  PyObject *args_o, *outs_o;
  if (!PyArg_ParseTuple(args, "iOO", &prev, &args_o, &outs_o)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  PyObject *fa = PySequence_Fast(args_o, "graph arguments"), *fo = fa ? PySequence_Fast(outs_o, "graph outputs") : NULL;
  Py_ssize_t na = fa ? PySequence_Fast_GET_SIZE(fa) : 0, no = fo ? PySequence_Fast_GET_SIZE(fo) : 0;
  tpu_pyplan *pp = fo ? calloc(1, sizeof *pp) : NULL;
  tpu_tref *ti = pp ? calloc((size_t)na + 1, sizeof *ti) : NULL, *to = ti ? calloc((size_t)no + 1, sizeof *to) : NULL;
  signed char *ko = to ? calloc((size_t)no + 1, 1) : NULL;
  if (pp) {
    pp->kinds = calloc((size_t)na + 1, 1);
    pp->out_slot = calloc((size_t)no + 1, sizeof *pp->out_slot);
    pp->out_same = calloc((size_t)no + 1, sizeof *pp->out_same);
  }
  const char *why = NULL;
  int nti = -1, nto = -1;
  if (fo && (!ko || !pp->kinds || !pp->out_slot || !pp->out_same)) PyErr_NoMemory();
  else if (fo) {
    nti = tpu_graph_values(st, fa, pp->kinds, ti);
    nto = nti < 0 ? -1 : tpu_graph_values(st, fo, ko, to);
    for (Py_ssize_t i = 0; i < na && nto >= 0; i++)
      if (pp->kinds[i] == TPU_GA_UNSUPPORTED) why = "an input is not a tpu tensor";
    for (Py_ssize_t j = 0; j < no && nto >= 0; j++)
      if (ko[j] == TPU_GA_UNSUPPORTED) why = "an output is not a tpu tensor";
  }
  /* The recorded ops run whatever happened above. */
  tpu_plan *plan = NULL;
  const char *why2 = NULL;
  bool want = nto >= 0 && !why;
  tpu_status *s = tpu_engine_capture_end(st->eng, prev, ti, want ? nti : 0, to, want ? nto : 0, want ? &plan : NULL,
                                         &why2);
  if (!why) why = why2;
  PyObject *result = NULL;
  if (s) {
    tpu_raise(s);
  } else if (nto >= 0 && tpu_flush_warnings(st) >= 0) {
    if (plan) {
      pp->plan = plan;
      plan = NULL;
      pp->nargs = (int)na;
      pp->nouts = (int)no;
      pp->as_list = PyList_Check(outs_o);
      pp->consts = PyTuple_New(na);
      pp->out_consts = pp->consts ? PyTuple_New(no) : NULL;
      for (Py_ssize_t i = 0; i < na && pp->out_consts; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fa, i);
        PyTuple_SET_ITEM(pp->consts, i, Py_NewRef(pp->kinds[i] == TPU_GA_TENSOR ? Py_None : o));
      }
      int slot = 0;
      for (Py_ssize_t j = 0; j < no && pp->out_consts; j++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fo, j);
        pp->out_same[j] = -1;
        pp->out_slot[j] = ko[j] == TPU_GA_TENSOR ? slot++ : -1;
        for (Py_ssize_t i = 0; i < na && ko[j] == TPU_GA_TENSOR; i++)
          if (PySequence_Fast_GET_ITEM(fa, i) == o) pp->out_same[j] = (int)i;
        PyTuple_SET_ITEM(pp->out_consts, j, Py_NewRef(ko[j] == TPU_GA_TENSOR ? Py_None : o));
      }
      PyObject *cap = pp->out_consts ? PyCapsule_New(pp, "torchtpu.plan", tpu_pyplan_destructor) : NULL;
      if (cap) {
        pp = NULL;
        result = Py_BuildValue("(Nz)", cap, (const char *)NULL);
      }
    } else {
      result = Py_BuildValue("(Oz)", Py_None, why ? why : "not captured");
    }
  }
  tpu_plan_free(plan);
  tpu_pyplan_free(pp);
  free(ti);
  free(to);
  free(ko);
  Py_XDECREF(fa);
  Py_XDECREF(fo);
  return result;
}

static bool tpu_view_plain(const tpu_tref *t, int64_t rec_numel) {
  int64_t expect = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    if (t->sizes[i] != 1 && t->strides[i] != expect) return false;
    expect *= t->sizes[i];
  }
  return t->offset == 0 && expect == rec_numel;
}

static PyObject *tpu_int_tuple(const int64_t *v, int n) {
  PyObject *t = PyTuple_New(n);
  for (int i = 0; t && i < n; i++) {
    PyObject *x = PyLong_FromLongLong(v[i]);
    if (!x) {
      Py_CLEAR(t);
      break;
    }
    PyTuple_SET_ITEM(t, i, x);
  }
  return t;
}

/* The tensors of a replayed plan: output j is its argument itself, a view
 * of a graph input, or a view of a record the program wrote; outputs
 * sharing a record share a storage, as they did when captured. */
static PyObject *tpu_plan_outputs(tpu_mod_state *st, tpu_pyplan *pp, PyObject *fa, tpu_record **recs) {
  int nt = tpu_plan_nout(pp->plan);
  PyObject **base = calloc((size_t)nt + 1, sizeof *base);
  PyObject *res = base ? (pp->as_list ? PyList_New(pp->nouts) : PyTuple_New(pp->nouts)) : NULL;
  bool ok = res != NULL;
  for (int j = 0; j < pp->nouts && ok; j++) {
    int k = pp->out_slot[j];
    PyObject *v = NULL;
    if (k < 0) {
      v = Py_NewRef(PyTuple_GET_ITEM(pp->out_consts, j));
    } else if (pp->out_same[j] >= 0) {
      v = Py_NewRef(PySequence_Fast_GET_ITEM(fa, pp->out_same[j]));
    } else {
      int input;
      const tpu_tref *t = tpu_plan_output(pp->plan, k, &input);
      tpu_record *r = recs[k];
      PyObject *b = NULL;
      for (int q = 0; q < k && !b; q++)
        if (recs[q] == r && base[q]) b = base[q];
      if (!b && input >= 0) {
        /* input counts tensor arguments only: find its place among all */
        for (int i = 0, seen = 0; i < pp->nargs && !b; i++)
          if (pp->kinds[i] == TPU_GA_TENSOR && seen++ == input) b = PySequence_Fast_GET_ITEM(fa, i);
      }
      if (!b && tpu_view_plain(t, r->numel)) {
        tpu_record_ref(r);
        v = tpu_mint(st, r, t->rank, t->sizes, NULL);
      } else {
        PyObject *flat = NULL;
        if (!b) {
          int64_t n = r->numel;
          tpu_record_ref(r);
          b = flat = tpu_mint(st, r, 1, &n, NULL);
        }
        PyObject *sz = b ? tpu_int_tuple(t->sizes, t->rank) : NULL, *sd = sz ? tpu_int_tuple(t->strides, t->rank) : NULL;
        v = sd ? PyObject_CallMethod(b, "as_strided", "(OOL)", sz, sd, (long long)t->offset) : NULL;
        Py_XDECREF(sz);
        Py_XDECREF(sd);
        Py_XDECREF(flat);
      }
      base[k] = v;
    }
    if (!v) {
      ok = false;
      break;
    }
    if (pp->as_list) PyList_SET_ITEM(res, j, v);
    else PyTuple_SET_ITEM(res, j, v);
  }
  free(base);
  for (int k = 0; k < nt; k++) tpu_record_unref(recs[k]);
  if (!ok) Py_CLEAR(res);
  return res;
}

static PyObject *tpu_py_graph_replay(PyObject *m, PyObject *args) {
  PyObject *plans, *args_o;
  if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &plans, &args_o)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  /* inside torch.tpu.graph the graph's ops join the capture's recording */
  if (PyList_GET_SIZE(plans) == 0 || tpu_engine_graph_capturing(st->eng)) Py_RETURN_NONE;
  PyObject *fa = PySequence_Fast(args_o, "graph arguments");
  if (!fa) return NULL;
  Py_ssize_t na = PySequence_Fast_GET_SIZE(fa);
  signed char *kinds = calloc((size_t)na + 1, 1);
  tpu_tref *ti = calloc((size_t)na + 1, sizeof *ti);
  PyObject *result = NULL;
  int nti = (kinds && ti) ? tpu_graph_values(st, fa, kinds, ti) : (PyErr_NoMemory(), -1);
  tpu_pyplan *hit = NULL;
  for (Py_ssize_t p = 0; nti >= 0 && !hit && p < PyList_GET_SIZE(plans); p++) {
    tpu_pyplan *pp = PyCapsule_GetPointer(PyList_GET_ITEM(plans, p), "torchtpu.plan");
    if (!pp) {
      nti = -1;
      break;
    }
    if (pp->nargs != na || memcmp(pp->kinds, kinds, (size_t)na)) continue;
    bool same = true;
    for (Py_ssize_t i = 0; i < na && same; i++) {
      if (kinds[i] != TPU_GA_OTHER) continue;
      PyObject *a = PySequence_Fast_GET_ITEM(fa, i), *c = PyTuple_GET_ITEM(pp->consts, i);
      int eq = Py_TYPE(a) == Py_TYPE(c) ? PyObject_RichCompareBool(a, c, Py_EQ) : 0;
      if (eq < 0) PyErr_Clear();
      same = eq > 0;
    }
    if (same && tpu_plan_matches(pp->plan, ti, nti)) hit = pp;
  }
  if (hit) {
    int nt = tpu_plan_nout(hit->plan);
    tpu_record **recs = calloc((size_t)nt + 1, sizeof *recs);
    tpu_status *s = recs ? tpu_plan_run(st->eng, hit->plan, ti, nti, recs) : tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    if (s) tpu_raise(s);
    else result = tpu_plan_outputs(st, hit, fa, recs);
    free(recs);
  } else if (nti >= 0) {
    result = Py_NewRef(Py_None);
  }
  free(kinds);
  free(ti);
  Py_DECREF(fa);
  return result;
}

/* ---- torch.tpu.graph ---------------------------------------------------------------------
 *
 * graph_capture_begin(True) -> token; the user's code is recorded; whole_end(token, keep)
 * -> plan capsule (None when nothing was recorded or keep is false);
 * whole_replay(plan). */

static void tpu_whole_destructor(PyObject *cap) {
  tpu_plan_free(PyCapsule_GetPointer(cap, "torchtpu.whole"));
}

static PyObject *tpu_py_whole_end(PyObject *m, PyObject *args) {
  int prev, keep;
  if (!PyArg_ParseTuple(args, "ip", &prev, &keep)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_plan *plan = NULL;
  tpu_status *s = tpu_engine_graph_end(st->eng, prev, keep, &plan);
  if (s) return tpu_raise(s);
  if (!plan) Py_RETURN_NONE;
  PyObject *cap = PyCapsule_New(plan, "torchtpu.whole", tpu_whole_destructor);
  if (!cap) tpu_plan_free(plan);
  return cap;
}

static PyObject *tpu_py_whole_replay(PyObject *m, PyObject *cap) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_plan *plan = PyCapsule_GetPointer(cap, "torchtpu.whole");
  if (!plan) return NULL;
  tpu_status *s = tpu_engine_graph_replay(st->eng, plan);
  if (s) return tpu_raise(s);
  Py_RETURN_NONE;
}

/* initialized() -> whether the runtime has started (the device was used). */
static PyObject *tpu_py_initialized(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  return PyBool_FromLong(st->eng && tpu_engine_started(st->eng));
}

/* in_bad_fork() -> whether the runtime was started by a parent of this
 * (forked) process, so that it cannot be used here. */
static PyObject *tpu_py_in_bad_fork(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  return PyBool_FromLong(st->eng && tpu_engine_started(st->eng) && tpu_forked_after_start);
}

static PyObject *tpu_py_whole_capturing(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  return PyBool_FromLong(st->eng && tpu_engine_graph_capturing(st->eng));
}

static PyMethodDef tpu_methods[] = {
    {"init", tpu_py_init, METH_VARARGS,
     "init(plugin, platform, num_devices, dtypes, from_dlpack, empty, gpu_memory_fraction, error, settings): "
     "makes the engine; its runtime starts at the device's first use (or raises error then)"},
    {"ops", tpu_py_ops, METH_NOARGS, "The op table: [(aten overload, id, flags)]."},
    {"foreach", tpu_py_foreach, METH_VARARGS,
     "foreach(name, element_kernel, lists, kwnames, out_self, returns_list) -> callable"},
    {"kernel", tpu_py_kernel, METH_VARARGS,
     "kernel(op_id, spec, nreturns, REQUIRED[, resolve, resolve_real]) -> callable"},
    {"empty", tpu_py_empty, METH_VARARGS, "empty(sizes, dtype, strides) -> tpu tensor"},
    {"copy_from", tpu_py_copy_from, METH_VARARGS, "copy_from(src, dst) -> dst"},
    {"to_cpu", tpu_py_to_cpu, METH_O, "to_cpu(t) -> contiguous CPU tensor"},
    {"info", tpu_py_info, METH_NOARGS, "Runtime facts: platform, versions, devices (starts the runtime)."},
    {"initialized", tpu_py_initialized, METH_NOARGS, "Whether the runtime has started."},
    {"in_bad_fork", tpu_py_in_bad_fork, METH_NOARGS, "Whether a parent of this forked process started it."},
    {"metrics", tpu_py_metrics, METH_NOARGS, "Counters."},
    {"memory", tpu_py_memory, METH_VARARGS, "memory(reset_peak=False) -> byte counts"},
    {"matmul_precision", tpu_py_matmul_precision, METH_VARARGS, "matmul_precision([p]) -> p"},
    {"value_checks", tpu_py_value_checks, METH_VARARGS, "value_checks([on]) -> on"},
    {"disk_cache", tpu_py_disk_cache, METH_VARARGS, "disk_cache(dir, max_bytes, extra_salt)"},
    {"eager_mode", tpu_py_eager_mode, METH_VARARGS, "eager_mode([name[, sync]]) -> the mode's name"},
    {"modes", tpu_py_modes, METH_NOARGS, "modes() -> the eager modes' names"},
    {"synchronize", tpu_py_synchronize, METH_NOARGS, "Wait for every launched computation."},
    {"flush", tpu_py_flush, METH_VARARGS, "flush(step=False): launch the recorded ops (fused mode) without waiting."},
    {"backward_passes", tpu_py_backward_passes, METH_NOARGS, "backward_passes() -> backward passes begun in fused mode."},
    {"idle", tpu_py_idle, METH_NOARGS, "Whether every launched computation has finished (no wait)."},
    {"count_fallback", tpu_py_count_fallback, METH_NOARGS, "Count one CPU-fallback op."},
    {"manual_seed", tpu_py_manual_seed, METH_O, "Seed the device generator."},
    {"rng_state", tpu_py_rng_state, METH_VARARGS, "rng_state() -> (seed, offset); rng_state(seed, offset)"},
    {"graph_capture_begin", tpu_py_graph_capture_begin, METH_VARARGS,
     "graph_capture_begin(whole=False): record a graph (whole: a torch.tpu.graph capture) -> token"},
    {"whole_end", tpu_py_whole_end, METH_VARARGS, "whole_end(token, keep) -> plan or None (nothing runs)"},
    {"whole_replay", tpu_py_whole_replay, METH_O, "whole_replay(plan): run the captured graph"},
    {"whole_capturing", tpu_py_whole_capturing, METH_NOARGS, "Whether a torch.tpu.graph capture is under way."},
    {"graph_capture_end", tpu_py_graph_capture_end, METH_VARARGS,
     "graph_capture_end(token, args, outs) -> (plan or None, why)"},
    {"graph_replay", tpu_py_graph_replay, METH_VARARGS, "graph_replay(plans, args) -> outputs, or None"},
    {NULL, NULL, 0, NULL},
};

static int tpu_mod_exec(PyObject *m) {
  tpu_mod_state *st = tpu_state(m);
  st->kernel_type = PyType_FromModuleAndSpec(m, &tpu_kernel_spec, NULL);
  if (!st->kernel_type) return -1;
  if (PyModule_AddObjectRef(m, "Kernel", st->kernel_type) < 0) return -1;
  st->foreach_type = PyType_FromModuleAndSpec(m, &tpu_foreach_spec, NULL);
  if (!st->foreach_type) return -1;
#define TPU_INTERN(f, s) \
  if (!(st->f = PyUnicode_InternFromString(s))) return -1;
  TPU_INTERN(s_data_ptr, "data_ptr")
  TPU_INTERN(s_storage_offset, "storage_offset")
  TPU_INTERN(s_shape, "shape")
  TPU_INTERN(s_stride, "stride")
  TPU_INTERN(s_dtype, "dtype")
  TPU_INTERN(s_is_cpu, "is_cpu")
  TPU_INTERN(s_contiguous, "contiguous")
  TPU_INTERN(s_copy_, "copy_")
  TPU_INTERN(s_is_contiguous, "is_contiguous")
  TPU_INTERN(s_is_conj, "is_conj")
  TPU_INTERN(s_is_neg, "is_neg")
#undef TPU_INTERN
  return 0;
}

static int tpu_mod_traverse(PyObject *m, visitproc visit, void *arg) {
  tpu_mod_state *st = tpu_state(m);
  Py_VISIT(st->kernel_type);
  Py_VISIT(st->foreach_type);
  Py_VISIT(st->from_dlpack);
  Py_VISIT(st->torch_empty);
  Py_VISIT(st->tensor_type);
  return 0;
}

static int tpu_mod_clear(PyObject *m) {
  tpu_mod_state *st = tpu_state(m);
  Py_CLEAR(st->kernel_type);
  Py_CLEAR(st->foreach_type);
  free(st->spare_frame);
  st->spare_frame = NULL;
  Py_CLEAR(st->from_dlpack);
  Py_CLEAR(st->torch_empty);
  for (int i = 0; i < TPU_NUM_DTYPES; i++) Py_CLEAR(st->dtypes[i]);
  Py_CLEAR(st->s_data_ptr);
  Py_CLEAR(st->s_storage_offset);
  Py_CLEAR(st->s_shape);
  Py_CLEAR(st->s_stride);
  Py_CLEAR(st->s_dtype);
  Py_CLEAR(st->s_is_cpu);
  Py_CLEAR(st->s_is_conj);
  Py_CLEAR(st->s_is_neg);
  Py_CLEAR(st->s_contiguous);
  Py_CLEAR(st->s_copy_);
  Py_CLEAR(st->s_is_contiguous);
  Py_CLEAR(st->tensor_type);
  for (int op = 0; op < TPU_NUM_OPS; op++) {
    for (int i = 0; i < st->nexplained[op]; i++) free(st->explained[op][i]);
    free(st->explained[op]);
    st->explained[op] = NULL;
    st->nexplained[op] = 0;
  }
  /* The engine is deliberately not freed here: tensors alive at interpreter
   * exit still point at its records, and torch frees them after modules are
   * torn down. The process exit reclaims it. */
  return 0;
}

static PyModuleDef_Slot tpu_mod_slots[] = {
    {Py_mod_exec, tpu_mod_exec},
    {0, NULL},
};

static PyModuleDef tpu_module_def = {
    PyModuleDef_HEAD_INIT, "torchtpu._C", "torchtpu core (C).", sizeof(tpu_mod_state), tpu_methods,
    tpu_mod_slots, tpu_mod_traverse, tpu_mod_clear, NULL,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&tpu_module_def); }

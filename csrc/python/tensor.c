/* tensor.c: tensors across the boundary.
 *
 * A device tensor is minted from a DLPack capsule whose device is kDLExtDev
 * (torch maps it to PrivateUse1) and whose data pointer is the address of our
 * storage record; the capsule's deleter drops the record when torch frees the
 * storage. Coming back, a tensor's record address is data_ptr -
 * storage_offset * itemsize, checked against the engine's registry before
 * use.
 */
#include "bind.h"

#include <string.h>

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
  if (t == TPU_PRED)
    d.code = TPU_DL_BOOL;
  else if (tpu_dtype_is_signed_int(t))
    d.code = TPU_DL_INT;
  else if (tpu_dtype_is_unsigned_int(t))
    d.code = TPU_DL_UINT;
  else if (t == TPU_BF16)
    d.code = TPU_DL_BFLOAT;
  else if (tpu_dtype_is_complex(t))
    d.code = TPU_DL_COMPLEX;
  return d;
}

static void tpu_ints_format(char *buf, size_t cap, int n, const int64_t *v) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, i ? ", %lld" : "%lld", (long long)v[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* The elements a tensor of these sizes and strides (NULL: contiguous) spans,
 * into *numel; -1 with torch's RuntimeError when its bytes overflow. Every
 * tensor handed to torch passes this first: torch's DLPack import throws a
 * C++ exception for such sizes, which would end the process. */
int tpu_storage_check(int rank, const int64_t *sizes, const int64_t *strides, tpu_dtype dt, int64_t *numel) {
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

/* A DLManagedTensor over rec (a tpu_dl_managed; its deleter drops the
 * record): steals the record reference. strides NULL: contiguous. NULL with
 * an exception set. */
void *tpu_dl_make(tpu_record *rec, int rank, const int64_t *sizes, const int64_t *strides) {
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
  h->m.dl_tensor.device = (tpu_dl_device){TPU_DL_EXT_DEV, rec->device};
  h->m.dl_tensor.ndim = rank;
  h->m.dl_tensor.dtype = tpu_dl_dtype_of(rec->dtype);
  h->m.dl_tensor.shape = h->shape;
  h->m.dl_tensor.strides = h->strides;
  h->m.manager_ctx = rec;
  h->m.deleter = tpu_dl_deleter;
  return &h->m;
}

void tpu_dl_release(void *dlm) {
  tpu_dl_managed *m = dlm;
  if (m && m->deleter) m->deleter(m);
}

/* Steals the record reference. strides NULL: contiguous. */
PyObject *tpu_mint(tpu_mod_state *st, tpu_record *rec, int rank, const int64_t *sizes, const int64_t *strides) {
  tpu_dl_managed *m = tpu_dl_make(rec, rank, sizes, strides);
  if (!m) return NULL;
  PyObject *cap = PyCapsule_New(m, "dltensor", tpu_capsule_destructor);
  if (!cap) {
    tpu_dl_deleter(m);
    return NULL;
  }
  PyObject *t = PyObject_CallOneArg(st->from_dlpack, cap);
  Py_DECREF(cap);
  return t;
}

/* ---- reading tensors -------------------------------------------------------------- */

int tpu_int64_seq(PyObject *seq, int64_t *out, int max, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n > max) {
    Py_DECREF(fast);
    if (max != TPU_MAX_RANK)
      PyErr_Format(PyExc_ValueError, "%s: at most %d entries supported, got %zd", what, max, n);
    else /* the words of torch's own limit on reductions' dims, which is this one */
      PyErr_Format(PyExc_RuntimeError, "only tensors with up to %d dims are supported on tpu (%s of %zd dims)",
                   TPU_MAX_RANK, what, n);
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

int64_t tpu_call_int(PyObject *o, PyObject *name) {
  PyObject *r = PyObject_CallMethodNoArgs(o, name);
  if (!r) return -1;
  int64_t v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return v;
}

/* A CPU tensor as an argument: a 0-d one is a number (its bytes at p). */
static int tpu_tref_host(tpu_tref *t, const void *p, const char *opname) {
  if (t->rank != 0) {
    PyErr_Format(PyExc_RuntimeError,
                 "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu! "
                 "(in aten::%s; move the CPU tensor with .to(\"tpu\"))",
                 opname);
    return -1;
  }
  if (p) memcpy(t->host_bytes, p, tpu_dtype_size(t->dtype));
  t->host = true;
  return 0;
}

/* A tpu tensor's record, from the start of its storage (t's dtype, sizes,
 * strides and offset filled). */
static int tpu_tref_record(tpu_mod_state *st, tpu_tref *t, uintptr_t addr, const char *opname) {
  t->rec = tpu_engine_find_record(st->eng, (const void *)addr);
  if (!t->rec) {
    PyErr_Format(PyExc_RuntimeError,
                 "aten::%s: got a tensor that torchtpu does not own (not a tpu tensor, or its storage was "
                 "reinterpreted with view(dtype), which is not supported yet)",
                 opname);
    return -1;
  }
  if (t->rec->freed) {
    PyErr_Format(PyExc_RuntimeError,
                 "aten::%s: the memory of this tensor's storage was freed (FSDP's free_storage) and not allocated "
                 "again",
                 opname);
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

static bool tpu_zero_size(const tpu_tref *t) {
  for (int i = 0; i < t->rank; i++)
    if (t->sizes[i] == 0) return true;
  return false;
}

/* A tensor argument from its metadata read in C++ (tensor_api.h): 1 when t
 * was filled (*rc: 0, or -1 with an exception set), 0 when it must be read
 * through Python. */
int tpu_tref_from_meta_struct(tpu_mod_state *st, const tpu_tensor_meta *m, tpu_tref *t, const char *opname, int *rc) {
  if ((m->device_type != 0 && m->device_type != TPU_TENSOR_PRIVATEUSE1) || m->rank > TPU_MAX_RANK ||
      m->scalar_type < 0 || m->scalar_type >= TPU_SCALAR_TYPES || st->scalar_types[m->scalar_type] == TPU_INVALID)
    return 0; /* Python's path raises the errors */
  t->dtype = st->scalar_types[m->scalar_type];
  t->rank = m->rank;
  memcpy(t->sizes, m->sizes, sizeof(int64_t) * (size_t)m->rank);
  if (m->device_type == 0) {
    if (!m->data && m->rank == 0) return 0;
    *rc = tpu_tref_host(t, m->data ? (const char *)m->data + m->offset * (int64_t)tpu_dtype_size(t->dtype) : NULL,
                        opname);
    return 1;
  }
  memcpy(t->strides, m->strides, sizeof(int64_t) * (size_t)m->rank);
  if (tpu_zero_size(t)) {
    t->zero_size = true; /* torch may not keep the data pointer of an empty tensor; none is needed */
    *rc = 0;
    return 1;
  }
  t->offset = m->offset;
  *rc = tpu_tref_record(st, t, (uintptr_t)m->data, opname);
  return 1;
}

/* The same, read through torch's C++ tensor behind a Python tensor. */
static int tpu_tref_from_meta(tpu_mod_state *st, PyObject *o, tpu_tref *t, const char *opname, int *rc) {
  tpu_tensor_meta m;
  if (!PyObject_TypeCheck(o, (PyTypeObject *)st->tensor_base) || st->tapi->meta(o, &m) != 0) return 0;
  return tpu_tref_from_meta_struct(st, &m, t, opname, rc);
}

/* Fill t from a torch tensor. Returns 0, or -1 with an exception set. */
int tpu_tref_from_py(tpu_mod_state *st, PyObject *o, tpu_tref *t, const char *opname) {
  tpu_tref_clear(t);
  int rc = 0;
  if (st->tapi && tpu_tref_from_meta(st, o, t, opname, &rc)) return rc;
  tpu_tref_clear(t);
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
    if (t->rank != 0) return tpu_tref_host(t, NULL, opname);
    int64_t p = tpu_call_int(o, st->s_data_ptr);
    if (p == -1 && PyErr_Occurred()) return -1;
    return tpu_tref_host(t, (const void *)(uintptr_t)p, opname);
  }
  PyObject *strides = PyObject_CallMethodNoArgs(o, st->s_stride);
  if (!strides) return -1;
  r = tpu_int64_seq(strides, t->strides, TPU_MAX_RANK, "tensor strides");
  Py_DECREF(strides);
  if (r < 0) return -1;
  if (tpu_zero_size(t)) {
    t->zero_size = true; /* torch may not keep the data pointer of an empty tensor; none is needed */
    return 0;
  }
  int64_t ptr = tpu_call_int(o, st->s_data_ptr);
  if (ptr == -1 && PyErr_Occurred()) return -1;
  t->offset = tpu_call_int(o, st->s_storage_offset);
  if (t->offset == -1 && PyErr_Occurred()) return -1;
  return tpu_tref_record(st, t, (uintptr_t)ptr - (uintptr_t)t->offset * tpu_dtype_size(t->dtype), opname);
}

PyObject *tpu_py_to_tref_args(tpu_mod_state *st, PyObject *o, tpu_arg *a, const char *op) {
  memset(a, 0, sizeof *a);
  a->kind = TPU_ARG_TENSOR;
  if (tpu_tref_from_py(st, o, &a->t, op) < 0) return NULL;
  return Py_None;
}

/* set_tensor_api(capsule, torch._C.TensorBase): read tensor arguments through
 * torchtpu._device_guard's tensor_api (tensor_api.h) from now on. */
PyObject *tpu_py_set_tensor_api(PyObject *m, PyObject *args) {
  tpu_mod_state *st = tpu_state(m);
  PyObject *cap, *base;
  if (!PyArg_ParseTuple(args, "OO!", &cap, &PyType_Type, &base)) return NULL;
  const tpu_tensor_api *api = PyCapsule_GetPointer(cap, TPU_TENSOR_API_NAME);
  if (!api) return NULL;
  if (api->version != TPU_TENSOR_API_VERSION) {
    PyErr_Format(PyExc_ImportError, "torchtpu: tensor_api version %d, expected %d", api->version,
                 TPU_TENSOR_API_VERSION);
    return NULL;
  }
  for (int k = 0; k < TPU_SCALAR_TYPES; k++) st->scalar_types[k] = TPU_INVALID;
  for (int i = 0; i < TPU_NUM_DTYPES; i++) {
    if (!st->dtypes[i]) continue;
    int code = api->scalar_type(st->dtypes[i]);
    if (code >= 0 && code < TPU_SCALAR_TYPES) st->scalar_types[code] = (tpu_dtype)i;
  }
  Py_XSETREF(st->tensor_base, Py_NewRef(base));
  Py_XSETREF(st->tapi_capsule, Py_NewRef(cap));
  st->tapi = api;
  Py_RETURN_NONE;
}

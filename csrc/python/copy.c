/* copy.c: empty tensors, copies between the host and the device, and the
 * memory behind a storage (freed and allocated again by FSDP2).
 */
#include "bind.h"

#include <string.h>

/* empty(sizes, dtype, strides or None, device=-1) -> a tpu tensor on a
 * fresh record, on local device `device` (-1: the current device). */
PyObject *tpu_py_empty(PyObject *m, PyObject *args) {
  PyObject *sizes_o, *dtype_o, *strides_o;
  int dev = -1;
  if (!PyArg_ParseTuple(args, "OOO|i", &sizes_o, &dtype_o, &strides_o, &dev)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  int ndev = 0;
  tpu_status *ds = tpu_engine_device_count(st->eng, &ndev);
  if (ds) return tpu_raise(ds);
  if (dev < 0) dev = tpu_engine_current_device(st->eng);
  if (dev >= ndev)
    return PyErr_Format(PyExc_RuntimeError, "tpu:%d: invalid device ordinal (%d local devices)", dev, ndev);
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
  /* The storage's device buffer is made in the tensor's shape when it is
   * contiguous, in the shape of its dims by decreasing stride when it is a
   * permutation of that (a transposed copy's destination: the values are
   * written transposed, lower.c); flat for any other layout. */
  int brank = rank;
  int64_t bdims[TPU_MAX_RANK];
  memcpy(bdims, sizes, sizeof(int64_t) * (size_t)rank);
  if (have_strides) {
    int64_t want[TPU_MAX_RANK];
    tpu_contiguous_strides(rank, sizes, 0, want);
    bool contiguous = true;
    for (int i = 0; i < rank; i++) contiguous = contiguous && (sizes[i] == 1 || strides[i] == want[i]);
    if (!contiguous) brank = tpu_storage_dims(rank, sizes, strides, bdims);
  }
  tpu_record *r =
      brank > 0 ? tpu_record_new_shaped(st->eng, dev, dt, brank, bdims) : tpu_record_new_on(st->eng, dev, dt, numel);
  if (!r) return PyErr_NoMemory();
  return tpu_mint(st, r, rank, sizes, have_strides ? strides : NULL);
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
  tpu_status *s =
      tpu_engine_download(st->eng, rec, (void *)(uintptr_t)p, (size_t)rec->numel * tpu_dtype_size(rec->dtype));
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
  if (tpu_tref_view_kind(&src->t) != TPU_VIEW_WHOLE) {
    PyObject *host = tpu_download_host_view(st, src_o, &src->t);
    if (host != Py_None) return host;
    Py_DECREF(host);
    tpu_engine_result res;
    if (tpu_call_op(st, TPU_OP_tpu_materialize, src, 1, &res) < 0) return NULL;
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

bool tpu_host_values(tpu_mod_state *st, PyObject *t, const char *what, PyObject **c, tpu_dtype *dt, int64_t *sizes,
                     int *rank, const void **data) {
  *c = PyObject_CallMethodNoArgs(t, st->s_contiguous);
  if (!*c) return false;
  PyObject *d = PyObject_GetAttr(*c, st->s_dtype);
  *dt = d ? tpu_dtype_from_py(st, d) : TPU_INVALID;
  Py_XDECREF(d);
  PyObject *shape = PyObject_GetAttr(*c, st->s_shape);
  *rank = shape ? tpu_int64_seq(shape, sizes, TPU_MAX_RANK, "shape") : -1;
  Py_XDECREF(shape);
  int64_t ptr = *rank >= 0 ? tpu_call_int(*c, st->s_data_ptr) : -1;
  if (*rank < 0 || (ptr == -1 && PyErr_Occurred()) || *dt == TPU_INVALID) {
    Py_CLEAR(*c);
    if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s: unsupported source dtype", what);
    return false;
  }
  *data = (const void *)(uintptr_t)ptr;
  return true;
}

/* copy_from(src, dst): torch's _copy_from, all three directions. */
PyObject *tpu_py_copy_from(PyObject *m, PyObject *args) {
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
    tpu_record *moved = NULL;
    if (a[0].t.rec && a[1].t.rec && a[0].t.rec->device != a[1].t.rec->device) {
      /* between local devices: the source's whole storage moves, then the
       * copy runs on the destination's device with the same view of it */
      tpu_status *s = tpu_engine_transfer(st->eng, a[1].t.rec, a[0].t.rec->device, &moved);
      if (s) return tpu_raise(s);
      a[1].t.rec = moved;
    }
    PyObject *r = tpu_run_op(st, TPU_OP_tpu_copy, a, 2, params, 1);
    tpu_record_unref(moved);
    return r;
  }
  if (!dst_cpu) {
    /* host -> device: upload a contiguous copy, then write it into the view. */
    if (!tpu_py_to_tref_args(st, dst_o, &a[0], "_copy_from")) return NULL;
    PyObject *c;
    tpu_dtype sdt;
    int64_t sizes[TPU_MAX_RANK];
    int rank;
    const void *ptr;
    if (!tpu_host_values(st, src_o, "copy to tpu", &c, &sdt, sizes, &rank, &ptr)) return NULL;
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) numel *= sizes[i];
    tpu_tref *dt = &a[0].t;
    bool same_shape = rank == dt->rank && memcmp(sizes, dt->sizes, sizeof(int64_t) * (size_t)rank) == 0;
    tpu_status *s = NULL;
    if (same_shape && sdt == dt->dtype && sdt == dt->rec->dtype && tpu_tref_view_kind(dt) == TPU_VIEW_WHOLE) {
      s = tpu_engine_upload(st->eng, dt->rec, ptr, sdt, rank, sizes);
      Py_DECREF(c);
      if (s) return tpu_raise(s);
      return Py_NewRef(dst_o);
    }
    tpu_record *tmp = tpu_record_new_shaped(st->eng, dt->rec->device, sdt, rank, sizes);
    if (!tmp) {
      Py_DECREF(c);
      return PyErr_NoMemory();
    }
    s = tpu_engine_upload(st->eng, tmp, ptr, sdt, rank, sizes);
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
PyObject *tpu_py_to_cpu(PyObject *m, PyObject *t) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_arg a;
  if (!tpu_py_to_tref_args(st, t, &a, "_to_cpu")) return NULL;
  PyObject *r = tpu_download_view(st, t, &a); /* a sync point: recorded ops may have been compiled */
  if (r && tpu_flush_warnings(st) < 0) Py_CLEAR(r);
  return r;
}

/* ---- the memory behind a storage (FSDP2's free_storage, alloc_storage) ---------- */

/* The record of tensor o's storage, freed or not (borrowed: o keeps it), or
 * NULL with an exception. */
static tpu_record *tpu_storage_record(tpu_mod_state *st, PyObject *o, const char *what) {
  PyObject *s = PyObject_CallMethod(o, "untyped_storage", NULL);
  if (!s) return NULL;
  int64_t p = tpu_call_int(s, st->s_data_ptr);
  Py_DECREF(s);
  if (p == -1 && PyErr_Occurred()) return NULL;
  tpu_record *r = tpu_engine_find_record(st->eng, (const void *)(uintptr_t)p);
  if (!r) PyErr_Format(PyExc_RuntimeError, "%s: the storage of this tensor is not a tpu storage", what);
  return r;
}

/* storage_free(t): frees the device memory of t's storage; its tensors may
 * not be used until storage_alloc(t) (see tpu_engine_storage_free). */
PyObject *tpu_py_storage_free(PyObject *m, PyObject *t) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_record *r = tpu_storage_record(st, t, "storage_free");
  if (!r) return NULL;
  tpu_status *s = tpu_engine_storage_free(st->eng, r);
  if (s) return tpu_raise(s);
  Py_RETURN_NONE;
}

/* storage_alloc(t): gives t's freed storage memory again (unwritten). */
PyObject *tpu_py_storage_alloc(PyObject *m, PyObject *t) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_record *r = tpu_storage_record(st, t, "storage_alloc");
  if (!r) return NULL;
  tpu_engine_storage_alloc(st->eng, r);
  Py_RETURN_NONE;
}

/* storage_freed(t) -> whether t's storage memory is freed. */
PyObject *tpu_py_storage_freed(PyObject *m, PyObject *t) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_record *r = tpu_storage_record(st, t, "storage_freed");
  return r ? PyBool_FromLong(r->freed) : NULL;
}

/* host_memory(t) -> a writable memoryview of the whole buffer of t's
 * storage, lent in place where the plugin's device memory is the host's
 * (tpu_engine_host_memory: a sync point), or None. It stays valid while the
 * storage keeps its buffer: until the next op on tpu. */
PyObject *tpu_py_host_memory(PyObject *m, PyObject *t) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_record *r = tpu_storage_record(st, t, "host_memory");
  if (!r) return NULL;
  void *addr;
  size_t n;
  tpu_status *s = tpu_engine_host_memory(st->eng, r, &addr, &n);
  if (s) return tpu_raise(s);
  if (!addr) Py_RETURN_NONE;
  return PyMemoryView_FromMemory(addr, (Py_ssize_t)n, PyBUF_WRITE);
}

static PyObject *tpu_shape_tuple(int rank, const int64_t *dims) {
  PyObject *o = PyTuple_New(rank);
  for (int i = 0; o && i < rank; i++) {
    PyObject *d = PyLong_FromLongLong((long long)dims[i]);
    if (!d) {
      Py_DECREF(o);
      return NULL;
    }
    PyTuple_SET_ITEM(o, i, d);
  }
  return o;
}

/* storage_shape(t) -> the shape of the device buffer behind t's storage (the
 * global shape over a mesh): the shape it was made for, or flat. */
PyObject *tpu_py_storage_shape(PyObject *m, PyObject *t) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_record *r = tpu_storage_record(st, t, "storage_shape");
  return r ? tpu_shape_tuple(r->grank, r->gdims) : NULL;
}

/* buffer_shape(sizes) -> the shape of the buffer of a storage made for a
 * contiguous tensor of these sizes. */
PyObject *tpu_py_buffer_shape(PyObject *m, PyObject *sizes_o) {
  (void)m;
  int64_t sizes[TPU_MAX_RANK];
  int rank = tpu_int64_seq(sizes_o, sizes, TPU_MAX_RANK, "size");
  if (rank < 0) return NULL;
  tpu_hlo_type t = tpu_buffer_type(TPU_F32, rank, sizes);
  return tpu_shape_tuple(t.rank, t.dims);
}

/* ---- the geometry of views, for the Python kernels ------------------------------ */

/* t's sizes and strides, read through Python: its rank, or -1 with an exception. */
static int tpu_view_geometry(tpu_mod_state *st, PyObject *t, int64_t *sizes, int64_t *strides) {
  PyObject *sh = PyObject_GetAttr(t, st->s_shape);
  int r = sh ? tpu_int64_seq(sh, sizes, TPU_MAX_RANK, "shape") : -1;
  Py_XDECREF(sh);
  if (r < 0) return -1;
  PyObject *so = PyObject_CallMethodNoArgs(t, st->s_stride);
  int rs = so ? tpu_int64_seq(so, strides, TPU_MAX_RANK, "stride") : -1;
  Py_XDECREF(so);
  return rs < 0 ? -1 : r;
}

/* dense(t) -> whether t is non-overlapping and dense (some order of its dims
 * is contiguous: a copy may keep its strides). */
PyObject *tpu_py_dense(PyObject *m, PyObject *t) {
  int64_t sizes[TPU_MAX_RANK], strides[TPU_MAX_RANK];
  int r = tpu_view_geometry(tpu_state(m), t, sizes, strides);
  return r < 0 ? NULL : PyBool_FromLong(tpu_dense(r, sizes, strides));
}

static PyObject *tpu_int64_list(const int64_t *v, int n) {
  PyObject *l = PyList_New(n);
  for (int i = 0; l && i < n; i++) {
    PyObject *x = PyLong_FromLongLong(v[i]);
    if (!x) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, i, x);
  }
  return l;
}

/* contiguous_strides(sizes, channels_last) -> the strides of a contiguous
 * tensor of these sizes (channels_last: 4 or 5 for torch's channels_last
 * formats, laid out so when the rank is that; 0: neither). */
PyObject *tpu_py_contiguous_strides(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *sizes_o;
  int cl;
  if (!PyArg_ParseTuple(args, "Oi", &sizes_o, &cl)) return NULL;
  int64_t sizes[TPU_MAX_RANK], strides[TPU_MAX_RANK];
  int r = tpu_int64_seq(sizes_o, sizes, TPU_MAX_RANK, "size");
  if (r < 0) return NULL;
  tpu_contiguous_strides(r, sizes, cl, strides);
  return tpu_int64_list(strides, r);
}

/* stride_order(t) -> t's dims from the largest stride to the smallest, []
 * when that is the plain order. */
PyObject *tpu_py_stride_order(PyObject *m, PyObject *t) {
  int64_t sizes[TPU_MAX_RANK], strides[TPU_MAX_RANK], order[TPU_MAX_RANK];
  int r = tpu_view_geometry(tpu_state(m), t, sizes, strides), o[TPU_MAX_RANK];
  if (r < 0) return NULL;
  int n = tpu_stride_order_desc(r, strides, o);
  for (int i = 0; i < n; i++) order[i] = o[i];
  return tpu_int64_list(order, n);
}

/* The bytes [*lo, *hi) tensor t spans (g: its geometry). */
static int tpu_view_span(tpu_mod_state *st, PyObject *t, const tpu_tref *g, int64_t *lo, int64_t *hi) {
  *lo = tpu_call_int(t, st->s_data_ptr);
  if (*lo == -1 && PyErr_Occurred()) return -1;
  PyObject *es = PyObject_CallMethod(t, "element_size", NULL);
  int64_t item = es ? PyLong_AsLongLong(es) : -1;
  Py_XDECREF(es);
  if (item == -1 && PyErr_Occurred()) return -1;
  *hi = *lo + tpu_span_bytes(g->rank, g->sizes, g->strides, item);
  return 0;
}

/* check_out_overlap(out, *inputs): torch's refusals of an out= tensor some
 * of whose elements share memory, or which shares memory with an input on
 * its device (the bytes each spans meet). */
PyObject *tpu_py_check_out_overlap(PyObject *m, PyObject *args) {
  tpu_mod_state *st = tpu_state(m);
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n < 1) {
    PyErr_SetString(PyExc_TypeError, "check_out_overlap(out, *inputs)");
    return NULL;
  }
  PyObject *out = PyTuple_GET_ITEM(args, 0);
  tpu_tref o, x;
  memset(&o, 0, sizeof o);
  memset(&x, 0, sizeof x);
  if ((o.rank = tpu_view_geometry(st, out, o.sizes, o.strides)) < 0) return NULL;
  if (tpu_tref_internal_overlap(&o)) {
    PyErr_SetString(PyExc_RuntimeError,
                    "unsupported operation: more than one element of the written-to tensor refers to a single "
                    "memory location. Please clone() the tensor before performing the operation.");
    return NULL;
  }
  int64_t o0, o1, x0, x1;
  if (tpu_numel(o.rank, o.sizes) == 0) Py_RETURN_NONE;
  if (tpu_view_span(st, out, &o, &o0, &o1) < 0) return NULL;
  PyObject *dev = PyObject_GetAttrString(out, "device");
  if (!dev) return NULL;
  for (Py_ssize_t k = 1; k < n; k++) {
    PyObject *t = PyTuple_GET_ITEM(args, k), *d = PyObject_GetAttrString(t, "device");
    int other = d ? PyObject_RichCompareBool(d, dev, Py_NE) : -1;
    Py_XDECREF(d);
    if (other == 0 && (x.rank = tpu_view_geometry(st, t, x.sizes, x.strides)) < 0) other = -1;
    if (other == 0 && tpu_numel(x.rank, x.sizes) == 0) continue;
    if (other == 0 && tpu_view_span(st, t, &x, &x0, &x1) < 0) other = -1;
    if (other < 0) {
      Py_DECREF(dev);
      return NULL;
    }
    if (other == 0 && x0 < o1 && o0 < x1) {
      Py_DECREF(dev);
      PyErr_SetString(PyExc_RuntimeError,
                      "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                      "single memory location. Please clone() the tensor before performing the operation.");
      return NULL;
    }
  }
  Py_DECREF(dev);
  Py_RETURN_NONE;
}

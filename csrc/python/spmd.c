/* spmd.c: tensors laid over a mesh of local devices (the engine's spmd.c);
 * torchtpu/spmd.py is the Python side.
 */
#include "bind.h"

#include <string.h>

#include "../mesh.h"

/* shard(t, mesh, dim_axis) -> a new tensor of t's shape laid over the first
 * prod(mesh) local devices: dimension i split over mesh axis dim_axis[i] (-1:
 * not split), replicated over the axes that split nothing. t: a host tensor
 * (each device is sent its own block of it), or a contiguous tpu tensor (its
 * whole storage; one already on a mesh is laid out again, through the
 * host). */
PyObject *tpu_py_shard(PyObject *m, PyObject *args) {
  PyObject *t, *mesh_o, *axes_o;
  if (!PyArg_ParseTuple(args, "OOO", &t, &mesh_o, &axes_o)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  PyObject *iscpu = PyObject_GetAttr(t, st->s_is_cpu);
  int host = iscpu ? PyObject_IsTrue(iscpu) : -1;
  Py_XDECREF(iscpu);
  if (host < 0) return NULL;
  tpu_arg a;
  PyObject *c = NULL;
  tpu_dtype hdt = TPU_INVALID;
  int64_t hsizes[TPU_MAX_RANK];
  int rank = 0;
  const void *data = NULL;
  if (host) {
    if (!tpu_host_values(st, t, "shard", &c, &hdt, hsizes, &rank, &data)) return NULL;
  } else {
    if (!tpu_py_to_tref_args(st, t, &a, "shard")) return NULL;
    if (!a.t.rec) return PyErr_Format(PyExc_ValueError, "shard: a tensor without storage");
    if (a.t.offset != 0 || tpu_tref_view_kind(&a.t) != TPU_VIEW_WHOLE)
      return PyErr_Format(PyExc_ValueError, "shard: the tensor must be contiguous and own its whole storage");
    rank = a.t.rank;
  }
  const int64_t *sizes = host ? hsizes : a.t.sizes;
  int64_t mesh[TPU_MAX_RANK], axes[TPU_MAX_RANK];
  int mr = tpu_int64_seq(mesh_o, mesh, TPU_MAX_RANK, "mesh");
  int ar = mr >= 0 ? tpu_int64_seq(axes_o, axes, TPU_MAX_RANK, "dim_axis") : -1;
  if (ar >= 0 && (ar != rank || mr > TPU_MESH_MAX_AXES))
    PyErr_Format(PyExc_ValueError, "shard: %d placements for a tensor of %d dimensions (a mesh of %d axes)", ar, rank,
                 mr);
  int8_t dim_axis[TPU_MAX_RANK];
  for (int i = 0; i < ar && !PyErr_Occurred(); i++) {
    if (axes[i] < -1 || axes[i] >= mr) PyErr_Format(PyExc_ValueError, "shard: mesh axis %lld", axes[i]);
    dim_axis[i] = (int8_t)axes[i];
  }
  if (PyErr_Occurred()) {
    Py_XDECREF(c);
    return NULL;
  }
  tpu_sharding sh = tpu_sharding_make(mr, mesh, ar, dim_axis);
  tpu_record *out = NULL;
  tpu_status *s = host ? tpu_engine_shard_host(st->eng, data, hdt, &sh, sizes, &out)
                       : tpu_engine_shard(st->eng, a.t.rec, &sh, sizes, &out);
  Py_XDECREF(c); /* the host values are sent: tpu_shards_from_host waits for each transfer */
  if (s) return tpu_raise(s);
  return tpu_mint(st, out, rank, sizes, NULL);
}

/* mesh_like(t, dtype) -> a tensor of t's shape laid out as t (a whole,
 * contiguous tensor on a mesh), of dtype, zeros: empty_like's result for a
 * tensor on a mesh. */
PyObject *tpu_py_mesh_like(PyObject *m, PyObject *args) {
  PyObject *t, *dtype_o;
  if (!PyArg_ParseTuple(args, "OO", &t, &dtype_o)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_arg a;
  if (!tpu_py_to_tref_args(st, t, &a, "empty_like")) return NULL;
  tpu_dtype dt;
  if (tpu_dtype_arg(st, dtype_o, &dt) < 0) return NULL;
  if (!a.t.rec || !a.t.rec->sh) return PyErr_Format(PyExc_ValueError, "mesh_like: the tensor is not on a mesh");
  tpu_record *out = NULL;
  tpu_status *s = tpu_engine_mesh_like(st->eng, a.t.rec, dt, &out);
  if (s) return tpu_raise(s);
  return tpu_mint(st, out, a.t.rank, a.t.sizes, NULL);
}

/* sharding(t) -> (mesh, dim_axis) of a tensor on a mesh, or None. */
PyObject *tpu_py_sharding(PyObject *m, PyObject *args) {
  tpu_mod_state *st = tpu_state(m);
  PyObject *t;
  int sync = 0;
  if (!PyArg_ParseTuple(args, "O|p", &t, &sync)) return NULL;
  if (!tpu_need_engine(st)) return NULL;
  tpu_arg a;
  if (!tpu_py_to_tref_args(st, t, &a, "sharding")) return NULL;
  /* sync: a value still recorded (fused mode) runs, as its layout is chosen then */
  tpu_status *f = sync && a.t.rec ? tpu_engine_settle(st->eng, a.t.rec, TPU_FLUSH_SYNC) : NULL;
  if (f) return tpu_raise(f);
  const tpu_sharding *sh = a.t.rec ? a.t.rec->sh : NULL;
  if (!sh) Py_RETURN_NONE;
  PyObject *mesh = PyTuple_New(sh->mesh_rank), *axes = PyTuple_New(sh->rank);
  for (int i = 0; mesh && i < sh->mesh_rank; i++) PyTuple_SET_ITEM(mesh, i, PyLong_FromLongLong(sh->mesh[i]));
  for (int i = 0; axes && i < sh->rank; i++) PyTuple_SET_ITEM(axes, i, PyLong_FromLong(sh->dim_axis[i]));
  if (!mesh || !axes) {
    Py_XDECREF(mesh);
    Py_XDECREF(axes);
    return NULL;
  }
  return Py_BuildValue("(NN)", mesh, axes);
}

/* spmd_partitioner("shardy" | "gspmd") */
PyObject *tpu_py_spmd_partitioner(PyObject *m, PyObject *name) {
  tpu_mod_state *st = tpu_state(m);
  const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  if (!s || (strcmp(s, "shardy") && strcmp(s, "gspmd")))
    return PyErr_Format(PyExc_ValueError, "the SPMD partitioner is \"shardy\" or \"gspmd\", not %R", name);
  if (!tpu_need_engine(st)) return NULL;
  tpu_engine_set_shardy(st->eng, strcmp(s, "shardy") == 0);
  Py_RETURN_NONE;
}

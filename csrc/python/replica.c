/* replica.c: replica-mode collectives over the local devices
 * (torchtpu.replicas): a list whose tensor i is on tpu:i in, a list whose
 * tensor i is on tpu:i out, one program of n replicas between.
 */
#include "bind.h"

#include <string.h>

/* replica_collective(tensors, kind, op, pairs, src) -> [tensors]: tensors are
 * whole contiguous tpu tensors (the Python side makes them so); kind and op
 * are tpu_coll_kind and tpu_red_op (by name: collective_kinds() and
 * reduce_ops()); pairs a sequence of (source, target). */
PyObject *tpu_py_replica_collective(PyObject *m, PyObject *args) {
  PyObject *list, *pairs;
  int kind, op, src;
  if (!PyArg_ParseTuple(args, "OiiOi", &list, &kind, &op, &pairs, &src)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  PyObject *seq = PySequence_Fast(list, "replica collectives take a list of tensors");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject *out = NULL;
  tpu_record *ins[TPU_MAX_REPLICAS], *outs[TPU_MAX_REPLICAS];
  tpu_collective c;
  memset(&c, 0, sizeof c);
  c.kind = (tpu_coll_kind)kind;
  c.op = (tpu_red_op)op;
  c.src = src;
  if (n < 1 || n > TPU_MAX_REPLICAS) {
    PyErr_Format(PyExc_ValueError, "replica collectives take 1 to %d tensors, got %zd", TPU_MAX_REPLICAS, n);
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    tpu_tref t;
    if (tpu_tref_from_py(st, PySequence_Fast_GET_ITEM(seq, i), &t, "replicas") < 0) goto done;
    if (t.host || t.zero_size) {
      PyErr_Format(PyExc_ValueError, "replicas: tensor %zd is %s", i,
                   t.host ? "a CPU tensor (tensor i must be on tpu:i)" : "empty (handled in Python)");
      goto done;
    }
    if (t.rec_dtype != TPU_INVALID || t.offset != 0 || tpu_tref_view_kind(&t) != TPU_VIEW_WHOLE) {
      PyErr_Format(PyExc_ValueError, "replicas: tensor %zd is not a whole contiguous tensor", i);
      goto done;
    }
    if (i == 0) {
      c.dtype = t.dtype;
      c.rank = t.rank;
      memcpy(c.dims, t.sizes, sizeof(int64_t) * (size_t)t.rank);
    } else if (t.dtype != c.dtype) {
      PyErr_Format(PyExc_TypeError, "replicas: tensor %zd has dtype %s, tensor 0 has %s", i, tpu_dtype_name(t.dtype),
                   tpu_dtype_name(c.dtype));
      goto done;
    } else if (t.rank != c.rank || memcmp(t.sizes, c.dims, sizeof(int64_t) * (size_t)t.rank) != 0) {
      PyErr_Format(PyExc_ValueError, "replicas: tensor %zd's shape differs from tensor 0's", i);
      goto done;
    }
    ins[i] = t.rec;
  }
  if (pairs != Py_None) {
    PyObject *ps = PySequence_Fast(pairs, "pairs must be a sequence of (source, target)");
    if (!ps) goto done;
    Py_ssize_t np = PySequence_Fast_GET_SIZE(ps);
    if (np > n) {
      Py_DECREF(ps);
      PyErr_Format(PyExc_ValueError, "permute: %zd pairs for %zd tensors", np, n);
      goto done;
    }
    c.npairs = (int)np;
    for (Py_ssize_t i = 0; i < np; i++)
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(ps, i), "ii", &c.pairs[i][0], &c.pairs[i][1])) {
        Py_DECREF(ps);
        goto done;
      }
    Py_DECREF(ps);
  }
  tpu_status *s = tpu_engine_replica_collective(st->eng, &c, ins, (int)n, outs);
  if (s) {
    tpu_raise(s);
    goto done;
  }
  int orank;
  int64_t odims[TPU_MAX_RANK];
  tpu_status_free(tpu_collective_check(&c, (int)n, &orank, odims)); /* passed above */
  out = PyList_New(n);
  if (!out)
    for (Py_ssize_t i = 0; i < n; i++) tpu_record_unref(outs[i]);
  for (Py_ssize_t i = 0; out && i < n; i++) {
    PyObject *t = tpu_mint(st, outs[i], orank, odims, NULL); /* steals outs[i] */
    if (!t) {
      for (Py_ssize_t j = i + 1; j < n; j++) tpu_record_unref(outs[j]);
      Py_CLEAR(out);
      break;
    }
    PyList_SET_ITEM(out, i, t);
  }
done:
  Py_DECREF(seq);
  return out;
}

/* {name: value} of n (name, value) pairs. */
static PyObject *tpu_name_dict(const char *const *names, const int *values, int n) {
  PyObject *d = PyDict_New();
  for (int i = 0; d && i < n; i++) {
    PyObject *v = PyLong_FromLong(values[i]);
    if (!v || PyDict_SetItemString(d, names[i], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

/* collective_kinds() -> {name: tpu_coll_kind}, the rows of collectives.def. */
PyObject *tpu_py_collective_kinds(PyObject *m, PyObject *noargs) {
  (void)m;
  (void)noargs;
  static const char *const names[] = {
#define TPU_COLLECTIVE(id, name, doc) name,
#include "../engine/collectives.def"
  };
  static const int values[] = {
#define TPU_COLLECTIVE(id, name, doc) TPU_COLL_##id,
#include "../engine/collectives.def"
  };
  return tpu_name_dict(names, values, TPU_COLL_COUNT);
}

/* reduce_ops() -> {name: tpu_red_op}, the reduce ops of collectives.def. */
PyObject *tpu_py_reduce_ops(PyObject *m, PyObject *noargs) {
  (void)m;
  (void)noargs;
  static const char *const names[] = {
#define TPU_REDUCE_OP(id, name, doc) name,
#include "../engine/collectives.def"
  };
  static const int values[] = {
#define TPU_REDUCE_OP(id, name, doc) TPU_RED_##id,
#include "../engine/collectives.def"
  };
  return tpu_name_dict(names, values, TPU_RED_COUNT);
}

/* stablehlo.c: functions from StableHLO text (the engine's fns.c), for
 * torchtpu.stablehlo_op and torchtpu.jax_op (torchtpu/_jax.py): registering
 * a text (an id for tpu::stablehlo_call), its @main's signature, and the
 * program texts a TPU compiler is given. None of it starts the runtime.
 */
#include "bind.h"

#include <string.h>

/* stablehlo_register(text, variant=None, target="tpu") -> id */
static PyObject *tpu_py_stablehlo_register(PyObject *m, PyObject *args) {
  const char *text, *variant = NULL, *target = "tpu";
  Py_ssize_t len, vlen = 0;
  if (!PyArg_ParseTuple(args, "s#|z#s", &text, &len, &variant, &vlen, &target)) return NULL;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  int64_t id = -1;
  tpu_status *s = tpu_engine_fn_register(e, text, (size_t)len, target, variant, (size_t)vlen, &id);
  if (s) return tpu_raise(s);
  return PyLong_FromLongLong(id);
}

static PyObject *tpu_types_py(tpu_mod_state *st, const tpu_hlo_fn *f, bool results) {
  int n = results ? tpu_hlo_fn_nresults(f) : tpu_hlo_fn_nargs(f);
  PyObject *list = PyList_New(n);
  for (int i = 0; list && i < n; i++) {
    const tpu_hlo_type *t = results ? tpu_hlo_fn_result(f, i) : tpu_hlo_fn_arg(f, i);
    PyObject *dims = PyTuple_New(t->rank);
    for (int d = 0; dims && d < t->rank; d++) {
      PyObject *v = PyLong_FromLongLong(t->dims[d]);
      if (!v)
        Py_CLEAR(dims);
      else
        PyTuple_SET_ITEM(dims, d, v);
    }
    PyObject *dt = st->dtypes[t->dtype] ? st->dtypes[t->dtype] : Py_None;
    PyObject *pair = dims ? Py_BuildValue("(NO)", dims, dt) : NULL;
    if (!pair)
      Py_CLEAR(list);
    else
      PyList_SET_ITEM(list, i, pair);
  }
  return list;
}

/* stablehlo_signature(id) -> ([(shape, dtype)] of the arguments, [...] of the results) */
static PyObject *tpu_py_stablehlo_signature(PyObject *m, PyObject *idobj) {
  tpu_mod_state *st = tpu_state(m);
  long long id = PyLong_AsLongLong(idobj);
  if (id == -1 && PyErr_Occurred()) return NULL;
  tpu_engine *e = tpu_eng(st);
  if (!e) return NULL;
  const tpu_hlo_fn *f = tpu_engine_fn(e, id);
  if (!f) return PyErr_Format(PyExc_ValueError, "stablehlo_op: no function was registered with id %lld", id);
  PyObject *a = tpu_types_py(st, f, false), *r = a ? tpu_types_py(st, f, true) : NULL;
  if (!r) {
    Py_XDECREF(a);
    return NULL;
  }
  return Py_BuildValue("(NN)", a, r);
}

static PyObject *tpu_text_result(tpu_status *s, char *text, size_t len) {
  if (s) return tpu_raise(s);
  PyObject *o = PyUnicode_FromStringAndSize(text, (Py_ssize_t)len);
  free(text);
  return o;
}

/* stablehlo_program(id, target=None) -> the text of a program of one call */
static PyObject *tpu_py_stablehlo_program(PyObject *m, PyObject *args) {
  long long id;
  const char *target = NULL;
  if (!PyArg_ParseTuple(args, "L|z", &id, &target)) return NULL;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  char *text = NULL;
  size_t len = 0;
  tpu_status *s = tpu_engine_fn_program(e, id, target, &text, &len);
  return tpu_text_result(s, text, len);
}

/* stablehlo_retarget(text, target) -> the program's text for target */
static PyObject *tpu_py_stablehlo_retarget(PyObject *m, PyObject *args) {
  const char *text, *target;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "s#s", &text, &len, &target)) return NULL;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  char *out = NULL;
  size_t olen = 0;
  tpu_status *s = tpu_engine_retarget(e, text, (size_t)len, target, &out, &olen);
  return tpu_text_result(s, out, olen);
}

PyMethodDef tpu_stablehlo_methods[] = {
    {"stablehlo_register", tpu_py_stablehlo_register, METH_VARARGS,
     "stablehlo_register(text, variant=None, target='tpu') -> id for tpu::stablehlo_call"},
    {"stablehlo_signature", tpu_py_stablehlo_signature, METH_O,
     "stablehlo_signature(id) -> ([(shape, dtype)] arguments, [(shape, dtype)] results)"},
    {"stablehlo_program", tpu_py_stablehlo_program, METH_VARARGS,
     "stablehlo_program(id, target=None) -> the text of a program of one call of function id"},
    {"stablehlo_retarget", tpu_py_stablehlo_retarget, METH_VARARGS,
     "stablehlo_retarget(text, target) -> the program's text with each function's variant for target"},
    {NULL, NULL, 0, NULL},
};

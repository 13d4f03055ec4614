/* foreach.c: Foreach objects, torch._foreach_* over lists of tensors.
 */
#include "bind.h"

#include <string.h>

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
  PyObject_HEAD PyObject *base;   /* the element op's kernel */
  PyObject *module;               /* strong: torchtpu._C (its engine hears where the call begins and ends) */
  int npos;                       /* positional parameters of the foreach op */
  unsigned lists;                 /* bit i: positional parameter i is a list */
  PyObject *kwname[TPU_MAX_ARGS]; /* strong or NULL: the element op takes positional i by this keyword */
  PyObject *s_out;                /* strong "out" when items of list 0 are the out argument, else NULL */
  int returns;                    /* 1: a list of the element results; 0: None */
  char name[64];                  /* "_foreach_add_.List", for messages */
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
  if (npos > f->npos || npos < 1)
    return PyErr_Format(PyExc_TypeError,
                        "aten::%s: expected at most %d positional "
                        "arguments, got %zd",
                        f->name, f->npos, npos);
  PyObject *fast[TPU_MAX_ARGS] = {0};
  PyObject *res = NULL, *kw = NULL, *pos = NULL;
  tpu_engine *eng = NULL; /* told of the call's items once they are recorded */
  Py_ssize_t n = -1, nbase = 0;
  bool need_kw = f->s_out != NULL;
  for (Py_ssize_t i = 0; i < npos; i++) {
    if (f->kwname[i])
      need_kw = true;
    else
      nbase++;
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
  if (need_kw)
    kw = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
  else if (kwargs)
    kw = Py_NewRef(kwargs);
  if ((need_kw && !kw) || (f->returns && !(res = PyList_New(n)))) goto done;
  eng = tpu_state(f->module)->eng;
  if (eng) tpu_engine_foreach(eng, true);
  for (Py_ssize_t j = 0; j < n; j++) {
    if (!(pos = PyTuple_New(nbase))) goto fail;
    for (Py_ssize_t i = 0, b = 0; i < npos; i++) {
      PyObject *o = fast[i] ? PySequence_Fast_GET_ITEM(fast[i], j) : PyTuple_GET_ITEM(args, i);
      if (!f->kwname[i])
        PyTuple_SET_ITEM(pos, b++, Py_NewRef(o));
      else if (PyDict_SetItem(kw, f->kwname[i], o) < 0)
        goto fail;
    }
    if (f->s_out && PyDict_SetItem(kw, f->s_out, PySequence_Fast_GET_ITEM(fast[0], j)) < 0) goto fail;
    PyObject *r = PyObject_Call(f->base, pos, kw);
    Py_CLEAR(pos);
    if (!r) goto fail;
    if (f->returns)
      PyList_SET_ITEM(res, j, r);
    else
      Py_DECREF(r);
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

PyType_Spec tpu_foreach_spec = {
    "torchtpu._C.Foreach", sizeof(tpu_foreach), 0, Py_TPFLAGS_DEFAULT, tpu_foreach_slots,
};

/* foreach(name, base, lists, kwnames, out_self, returns_list): lists is a bit
 * mask of the list parameters among the positional ones; kwnames gives, for
 * each positional parameter, None or the keyword the element op takes it by. */
PyObject *tpu_py_foreach(PyObject *m, PyObject *args) {
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

/* kernel.c: Kernel objects.
 *
 * Each registered ATen overload is a Kernel object: the torch dispatcher
 * calls it with the schema's arguments (trailing defaults dropped, kwarg-only
 * ones in kwargs); it normalises them against the schema spec given at
 * registration, parses them into tpu_arg values and runs the op.
 */
#define _GNU_SOURCE /* pthread_getname_np */
#include "bind.h"

#include <pthread.h>
#include <string.h>

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

const tpu_argkind_row tpu_argkinds[128] = {
#define TPU_ARG_KIND(letter, name, parsed, optional, what) \
  [(unsigned char)(letter)] = {name, TPU_ARG_##parsed, optional},
#include "argkinds.def"
};

/* arg_kinds() -> {letter: name}, the rows of argkinds.def. */
PyObject *tpu_py_arg_kinds(PyObject *m, PyObject *noargs) {
  (void)m;
  (void)noargs;
  PyObject *d = PyDict_New();
  for (int c = 0; d && c < 128; c++) {
    if (!tpu_argkinds[c].name) continue;
    char letter[2] = {(char)c, 0};
    PyObject *v = PyUnicode_FromString(tpu_argkinds[c].name);
    if (!v || PyDict_SetItemString(d, letter, v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

/* Parse one argument. A TENSORS argument gets an owned item array in
 * a->list (freed by tpu_args_free). */
static int tpu_parse_arg(tpu_mod_state *st, char kind, PyObject *o, tpu_arg *a, const char *opname) {
  bool optional = tpu_kind_optional(kind);
  if (kind == 'r') return tpu_parse_generator(st, o, a);
  if (kind == '_') {
    a->kind = TPU_ARG_IGNORED;
    a->i = 0;
    /* a factory's device=tpu:<i> says where its output goes (i + 1 here) */
    if (o != Py_None && strcmp(Py_TYPE(o)->tp_name, "torch.device") == 0) {
      PyObject *idx = PyObject_GetAttrString(o, "index");
      if (!idx) return -1;
      if (PyLong_Check(idx)) a->i = PyLong_AsLongLong(idx) + 1;
      Py_DECREF(idx);
      if (PyErr_Occurred()) return -1;
    }
    return 0;
  }
  if (o == Py_None) {
    if (!optional && kind != 'L') {
      PyErr_Format(PyExc_TypeError, "aten::%s: unexpected None for a %s argument", opname, tpu_kind_row(kind)->name);
      return -1;
    }
    a->kind = TPU_ARG_NONE;
    return 0;
  }
  switch (tpu_kind_row(kind)->parsed) {
    case TPU_ARG_TENSOR:
      /* The dispatcher hands wrapped numbers (x + 1) back as Python numbers. */
      if (PyLong_Check(o) || PyFloat_Check(o) || PyComplex_Check(o)) return tpu_parse_scalar(o, a);
      a->kind = TPU_ARG_TENSOR;
      return tpu_tref_from_py(st, o, &a->t, opname);
    case TPU_ARG_TENSORS: {
      PyObject *fast = PySequence_Fast(o, "expected a list of tensors");
      if (!fast) return -1;
      Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
      if (n > TPU_MAX_LIST) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_NotImplementedError, "aten::%s: lists of more than %d tensors are not supported yet", opname,
                     TPU_MAX_LIST);
        return -1;
      }
      tpu_tref *lists = malloc(sizeof *lists * (size_t)(n ? n : 1));
      if (!lists) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
      }
      for (Py_ssize_t j = 0; j < n; j++) tpu_tref_clear(&lists[j]);
      a->kind = TPU_ARG_TENSORS;
      a->list = lists;
      a->nlist = (int)n;
      for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *it = PySequence_Fast_GET_ITEM(fast, j);
        if (it == Py_None) continue;
        if (tpu_tref_from_py(st, it, &lists[j], opname) < 0) {
          Py_DECREF(fast);
          return -1;
        }
      }
      Py_DECREF(fast);
      return 0;
    }
    case TPU_ARG_SCALAR: return tpu_parse_scalar(o, a);
    case TPU_ARG_INT:
      a->kind = TPU_ARG_INT;
      a->i = PyLong_AsLongLong(o);
      return (a->i == -1 && PyErr_Occurred()) ? -1 : 0;
    case TPU_ARG_BOOL:
      a->kind = TPU_ARG_BOOL;
      a->i = PyObject_IsTrue(o);
      return a->i < 0 ? -1 : 0;
    case TPU_ARG_INTS: {
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
    case TPU_ARG_FLOAT:
      a->kind = TPU_ARG_FLOAT;
      a->f = PyFloat_AsDouble(o);
      return (a->f == -1.0 && PyErr_Occurred()) ? -1 : 0;
    case TPU_ARG_FLOATS: {
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
    case TPU_ARG_DTYPE:
      a->kind = TPU_ARG_DTYPE;
      a->dtype = tpu_dtype_from_py(st, o);
      if (a->dtype == TPU_INVALID) {
        PyErr_Format(PyExc_TypeError, "aten::%s: dtype %R is not supported on tpu", opname, o);
        return -1;
      }
      return 0;
    case TPU_ARG_STR: {
      a->kind = TPU_ARG_STR;
      const char *s = PyUnicode_AsUTF8(o);
      if (!s) return -1;
      snprintf(a->str, sizeof a->str, "%s", s);
      return 0;
    }
    default: PyErr_Format(PyExc_SystemError, "aten::%s: unknown argument kind '%c'", opname, kind); return -1;
  }
}

/* As torch does: resizing an out= tensor that held elements is deprecated.
 * 0, or -1 when the warning raised. */
int tpu_warn_resized(void) {
  return PyErr_WarnEx(PyExc_UserWarning,
                      "An output with one or more elements was resized since it had the wrong shape. "
                      "This behavior is deprecated; reuse out= tensors only when they have the right shape, "
                      "or call resize_(0) on them first.",
                      1);
}

/* warn_resized(): the warning above, for the Python kernels that resize an out= tensor. */
PyObject *tpu_py_warn_resized(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  if (tpu_warn_resized() < 0) return NULL;
  Py_RETURN_NONE;
}

/* Turn an engine result into the Python return value. Consumes res. */
static PyObject *tpu_build_result(tpu_mod_state *st, tpu_engine_result *res, PyObject **params, int nreturns) {
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
      if (nt && had > 0 && tpu_warn_resized() < 0) Py_CLEAR(nt);
      PyObject *done = nt ? PyObject_CallMethod(params[p->arg], "set_", "O", nt) : NULL;
      Py_XDECREF(nt);
      if (done) {
        Py_DECREF(done);
        vals[k] = Py_NewRef(params[p->arg]);
      } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_SystemError, "torchtpu: an output was returned twice");
      }
    } else if (p->is_arg) {
      if (p->item >= 0)
        vals[k] = PySequence_GetItem(params[p->index], p->item);
      else
        vals[k] = Py_NewRef(params[p->index]);
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

struct tpu_call_frame {
  tpu_arg args[TPU_MAX_ARGS];
};

/* One frame is kept for the next call (a call made while one runs, from a
 * resolve callback or a warning's handler, gets its own). */
tpu_call_frame *tpu_frame_take(tpu_mod_state *st) {
  tpu_call_frame *f = st->spare_frame ? st->spare_frame : malloc(sizeof *f);
  st->spare_frame = NULL;
  if (!f) PyErr_NoMemory();
  return f;
}

/* Frees the lists of the first n arguments and keeps or frees the frame. */
void tpu_frame_give(tpu_mod_state *st, tpu_call_frame *f, int n) {
  for (int i = 0; i < n; i++)
    if (f->args[i].kind == TPU_ARG_TENSORS) free(f->args[i].list);
  if (st->spare_frame)
    free(f);
  else
    st->spare_frame = f;
}

tpu_arg *tpu_frame_args(tpu_call_frame *f) { return f->args; }

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

int tpu_call_op(tpu_mod_state *st, int op_id, tpu_arg *args, int nargs, tpu_engine_result *res) {
  tpu_status *s = tpu_engine_call(st->eng, &tpu_op_table[op_id], op_id, args, nargs, res);
  if (tpu_flush_warnings(st) < 0) {
    if (s)
      tpu_status_free(s);
    else
      tpu_engine_result_release(res);
    return -1;
  }
  if (s) return tpu_raise(s), -1;
  return 0;
}

int tpu_run_engine(tpu_mod_state *st, int op_id, tpu_arg *args, int nargs, tpu_engine_result *res) {
  /* Fused mode: the first op of a backward pass launches what the forward
   * pass recorded (tpu_engine_backward_begins). Ops hold the GIL, so the
   * flag has one writer at a time. */
  if (tpu_engine_mode(st->eng) == TPU_MODE_FUSED) {
    bool bw = tpu_on_autograd_thread();
    if (bw && !st->in_backward) {
      tpu_status *b = tpu_engine_backward_begins(st->eng);
      if (b) return tpu_raise(b), -1;
    }
    st->in_backward = bw;
    /* the first op after the optimizer steps (tpu_py_optimizer_step) launches
     * the step they ended, as one program */
    if (st->step_pending && !st->in_optimizer && !bw) {
      st->step_pending = false;
      tpu_status *f = tpu_engine_flush_step(st->eng);
      if (f) return tpu_raise(f), -1;
    }
  }
  return tpu_call_op(st, op_id, args, nargs, res);
}

PyObject *tpu_run_op(tpu_mod_state *st, int op_id, tpu_arg *args, int nargs, PyObject **params, int nreturns) {
  tpu_engine_result res;
  if (tpu_run_engine(st, op_id, args, nargs, &res) < 0) return NULL;
  return tpu_build_result(st, &res, params, nreturns);
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
  tpu_call_frame *f = tpu_frame_take(st);
  if (!f) return NULL;
  PyObject *result = NULL;
  int nparsed = 0;
  for (int i = 0; i < k->nparams; i++) {
    PyObject *o = NULL;
    if (i < npos)
      o = PyTuple_GET_ITEM(args, i);
    else if (kwargs)
      o = PyDict_GetItemWithError(kwargs, k->names[i]);
    if (!o && PyErr_Occurred()) goto done;
    if (!o) o = k->defaults[i];
    if (!o) {
      PyErr_Format(PyExc_TypeError, "aten::%s: missing argument '%U'", opname, k->names[i]);
      goto done;
    }
    params[i] = o;
    tpu_arg *a = &f->args[i];
    tpu_arg_clear(a);
    a->is_default = k->defaults[i] && (o == k->defaults[i]);
    nparsed = i + 1;
    if (tpu_parse_arg(st, k->kinds[i], o, a, opname) < 0) goto done;
    if (k->resolve && a->kind == TPU_ARG_TENSOR && !a->t.host &&
        (k->resolve_real || tpu_dtype_is_complex(a->t.dtype)) &&
        !(i == 0 && (tpu_op_table[k->op_id].flags & TPU_OP_INPLACE))) { /* an in-place self is written */
      int64_t bit = tpu_call_int(o, st->s_is_conj);                     /* a bool: 0 or 1 */
      if (bit == 0) bit = tpu_call_int(o, st->s_is_neg);
      if (bit == -1 && PyErr_Occurred()) goto done;
      if (bit) {
        if (!(resolved[i] = PyObject_CallOneArg(k->resolve, o))) goto done;
        params[i] = o = resolved[i];
        tpu_arg_clear(a);
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
  tpu_frame_give(st, f, nparsed);
  for (int i = 0; i < k->nparams; i++) Py_XDECREF(resolved[i]);
  return result;
}

static PyType_Slot tpu_kernel_slots[] = {
    {Py_tp_dealloc, tpu_kernel_dealloc},
    {Py_tp_call, tpu_kernel_call},
    {Py_tp_doc, "A torchtpu kernel for one ATen overload."},
    {0, NULL},
};

PyType_Spec tpu_kernel_spec = {
    "torchtpu._C.Kernel", sizeof(tpu_kernel), 0, Py_TPFLAGS_DEFAULT, tpu_kernel_slots,
};

/* kernel(op_id, spec, nreturns): spec is a sequence of (name, kind, default)
 * where kind is one letter of argkinds.def and default is a value or
 * a missing-marker (the module's REQUIRED object). */
PyObject *tpu_py_kernel(PyObject *m, PyObject *args) {
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
    if (!ks || strlen(ks) != 1 || !tpu_kind_row(ks[0])->name) {
      if (ks)
        PyErr_Format(PyExc_ValueError, "aten::%s: argument %U has the unknown kind %R (csrc/python/argkinds.def)",
                     tpu_op_table[op_id].name, name, kind);
      Py_DECREF(fast);
      Py_DECREF(k);
      return NULL;
    }
    k->kinds[i] = ks[0];
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    k->names[i] = name;
    k->defaults[i] = dflt == required ? NULL : Py_NewRef(dflt);
    k->nparams = (int)i + 1;
  }
  Py_DECREF(fast);
  return (PyObject *)k;
}

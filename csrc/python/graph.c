/* graph.c: graph plans (torch.compile) and torch.tpu.graph.
 */
#include "bind.h"

#include <string.h>

/* ---- graph plans (torch.compile) ----------------------------------------------------------
 *
 * graph_capture_begin() -> token; the graph runs (recorded in fused mode);
 * graph_capture_end(token, args, outs) -> (plan or None, why) runs it and
 * describes how to replay it; graph_replay(plans, args) runs the first plan
 * whose inputs match args, or returns None. */

enum { TPU_GA_OTHER = 0, TPU_GA_TENSOR = 1, TPU_GA_UNSUPPORTED = -1 };

typedef struct {
  tpu_plan *plan; /* owned */
  int nargs;
  signed char *kinds; /* TPU_GA_* by argument */
  PyObject *consts;   /* tuple: the non-tensor arguments (None where a tensor) */
  int nouts;
  int *out_slot;        /* by output: the plan's output index, -1 for a constant */
  int *out_same;        /* by output: the argument it is (the very object), -1 */
  PyObject *out_consts; /* tuple: the non-tensor outputs (None where a tensor) */
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

PyObject *tpu_py_graph_capture_begin(PyObject *m, PyObject *args) {
  int whole = 0; /* torch.tpu.graph: a whole-step capture (whole_end ends it) */
  if (!PyArg_ParseTuple(args, "|p", &whole)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  int prev;
  tpu_status *s = whole ? tpu_engine_graph_begin(st->eng, &prev) : tpu_engine_capture_begin(st->eng, &prev);
  if (s) return tpu_raise(s);
  return PyLong_FromLong(prev);
}

PyObject *tpu_py_graph_capture_end(PyObject *m, PyObject *args) {
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
  if (fo && (!ko || !pp->kinds || !pp->out_slot || !pp->out_same))
    PyErr_NoMemory();
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
  tpu_status *s =
      tpu_engine_capture_end(st->eng, prev, ti, want ? nti : 0, to, want ? nto : 0, want ? &plan : NULL, &why2);
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
        PyObject *sz = b ? tpu_int_tuple(t->sizes, t->rank) : NULL,
                 *sd = sz ? tpu_int_tuple(t->strides, t->rank) : NULL;
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
    if (pp->as_list)
      PyList_SET_ITEM(res, j, v);
    else
      PyTuple_SET_ITEM(res, j, v);
  }
  free(base);
  for (int k = 0; k < nt; k++) tpu_record_unref(recs[k]);
  if (!ok) Py_CLEAR(res);
  return res;
}

PyObject *tpu_py_graph_replay(PyObject *m, PyObject *args) {
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
  tpu_tref *ti = malloc(sizeof *ti * ((size_t)na + 1)); /* a tref's sizes and strides are read up to its rank */
  if (ti)
    for (Py_ssize_t i = 0; i <= na; i++) tpu_tref_clear(&ti[i]);
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
    tpu_status *s =
        recs ? tpu_plan_run(st->eng, hit->plan, ti, nti, recs) : tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    if (s)
      tpu_raise(s);
    else
      result = tpu_plan_outputs(st, hit, fa, recs);
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

static void tpu_whole_destructor(PyObject *cap) { tpu_plan_free(PyCapsule_GetPointer(cap, "torchtpu.whole")); }

PyObject *tpu_py_whole_end(PyObject *m, PyObject *args) {
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

PyObject *tpu_py_whole_replay(PyObject *m, PyObject *cap) {
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_plan *plan = PyCapsule_GetPointer(cap, "torchtpu.whole");
  if (!plan) return NULL;
  tpu_status *s = tpu_engine_graph_replay(st->eng, plan);
  if (s) return tpu_raise(s);
  Py_RETURN_NONE;
}

PyObject *tpu_py_whole_capturing(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  return PyBool_FromLong(st->eng && tpu_engine_graph_capturing(st->eng));
}

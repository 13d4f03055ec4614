/* fast.c: Kernel calls from torch's dispatcher through C++ (fast_api.h).
 *
 * torchtpu._device_guard's boxed kernel reads torch's argument stack into
 * tpu_fast_arg values and calls tpu_fast_call with the GIL held: the values
 * become tpu_args as kernel.c's parser makes them from Python objects, the op
 * runs, and its new outputs go back as DLManagedTensors for the C++ side to
 * import. Anything the Python parser would refuse, and the calls that need
 * Python (explaining recompiles), answer TPU_FAST_PYTHON before anything runs:
 * the Kernel's Python call then gives what it always gave, errors included.
 */
#include "bind.h"
#include "fast_api.h"

#include <string.h>

static int tpu_fast_scalar(const tpu_fast_arg *in, tpu_arg *a) {
  a->kind = TPU_ARG_SCALAR;
  switch (in->tag) {
    case TPU_FA_BOOL:
      a->skind = TPU_SCALAR_BOOL;
      a->i = in->i != 0;
      a->f = (double)a->i;
      return 0;
    case TPU_FA_INT:
      a->skind = TPU_SCALAR_INT;
      a->i = in->i;
      a->f = (double)a->i;
      return 0;
    case TPU_FA_FLOAT:
      a->skind = TPU_SCALAR_FLOAT;
      a->f = in->f;
      a->i = (int64_t)a->f;
      return 0;
    case TPU_FA_COMPLEX:
      a->skind = TPU_SCALAR_COMPLEX;
      a->f = in->f;
      a->f_imag = in->f_imag;
      return 0;
    default: return 1;
  }
}

static bool tpu_fast_number(int tag) {
  return tag == TPU_FA_INT || tag == TPU_FA_FLOAT || tag == TPU_FA_BOOL || tag == TPU_FA_COMPLEX;
}

/* One argument as kernel.c's tpu_parse_arg makes it from a Python object: 0,
 * -1 with an exception set, or 1: leave it to the Python call. */
static int tpu_fast_parse(tpu_mod_state *st, char kind, const tpu_fast_arg *in, tpu_arg *a, const char *opname) {
  bool optional = tpu_kind_optional(kind);
  int rc = 0;
  if (kind == '_') {
    a->kind = TPU_ARG_IGNORED;
    a->i = in->tag == TPU_FA_DEVICE ? in->i : 0;
    return 0;
  }
  if (kind == 'r') { /* as tpu_parse_generator: one program with or without a generator */
    if (in->tag != TPU_FA_NONE && in->tag != TPU_FA_GENERATOR) return 1;
    a->kind = TPU_ARG_IGNORED;
    a->i = 0;
    a->gen = (tpu_rng *)in->gen;
    a->is_default = true;
    return 0;
  }
  if (in->tag == TPU_FA_NONE) {
    if (!optional && kind != 'L') return 1;
    a->kind = TPU_ARG_NONE;
    return 0;
  }
  switch (tpu_kind_row(kind)->parsed) {
    case TPU_ARG_TENSOR:
      if (tpu_fast_number(in->tag)) return tpu_fast_scalar(in, a); /* a wrapped number (x + 1) */
      if (in->tag != TPU_FA_TENSOR) return 1;
      a->kind = TPU_ARG_TENSOR;
      tpu_tref_clear(&a->t);
      return tpu_tref_from_meta_struct(st, in->t, &a->t, opname, &rc) ? rc : 1;
    case TPU_ARG_TENSORS: {
      if (in->tag != TPU_FA_TENSORS || in->n > TPU_MAX_LIST) return 1;
      tpu_tref *lists = malloc(sizeof *lists * (size_t)(in->n ? in->n : 1));
      if (!lists) return PyErr_NoMemory(), -1;
      for (int j = 0; j < in->n; j++) tpu_tref_clear(&lists[j]);
      a->kind = TPU_ARG_TENSORS;
      a->list = lists;
      a->nlist = in->n;
      for (int j = 0; j < in->n; j++) {
        if (in->t[j].rank < 0) continue; /* None */
        if (!tpu_tref_from_meta_struct(st, &in->t[j], &lists[j], opname, &rc)) return 1;
        if (rc < 0) return -1;
      }
      return 0;
    }
    case TPU_ARG_SCALAR: return tpu_fast_scalar(in, a);
    case TPU_ARG_INT:
      if (in->tag != TPU_FA_INT && in->tag != TPU_FA_BOOL) return 1;
      a->kind = TPU_ARG_INT;
      a->i = in->i;
      return 0;
    case TPU_ARG_BOOL:
      if (in->tag != TPU_FA_BOOL && in->tag != TPU_FA_INT) return 1;
      a->kind = TPU_ARG_BOOL;
      a->i = in->i != 0;
      return 0;
    case TPU_ARG_INTS:
      a->kind = TPU_ARG_INTS;
      if (in->tag == TPU_FA_INT) {
        a->nints = 1;
        a->ints[0] = in->i;
        return 0;
      }
      if (in->tag != TPU_FA_INTS || in->n > TPU_MAX_LIST) return 1;
      memcpy(a->ints, in->ints, sizeof(int64_t) * (size_t)in->n);
      a->nints = in->n;
      return 0;
    case TPU_ARG_FLOAT:
      if (in->tag != TPU_FA_FLOAT && in->tag != TPU_FA_INT) return 1;
      a->kind = TPU_ARG_FLOAT;
      a->f = in->tag == TPU_FA_INT ? (double)in->i : in->f;
      return 0;
    case TPU_ARG_FLOATS:
      if (in->tag != TPU_FA_FLOATS) return 1;
      a->kind = TPU_ARG_FLOATS;
      a->nints = in->n < TPU_MAX_LIST ? in->n : TPU_MAX_LIST;
      memcpy(a->floats, in->floats, sizeof(double) * (size_t)a->nints);
      return 0;
    case TPU_ARG_DTYPE: /* a c10::ScalarType */
      if (in->tag != TPU_FA_INT || in->i < 0 || in->i >= TPU_SCALAR_TYPES || st->scalar_types[in->i] == TPU_INVALID)
        return 1;
      a->kind = TPU_ARG_DTYPE;
      a->dtype = st->scalar_types[in->i];
      return 0;
    case TPU_ARG_STR:
      if (in->tag != TPU_FA_STR) return 1;
      a->kind = TPU_ARG_STR;
      snprintf(a->str, sizeof a->str, "%s", in->str);
      return 0;
    default: return 1;
  }
}

/* The engine's result as fast_api's values. Consumes res. */
static int tpu_fast_results(tpu_engine_result *res, const tpu_arg *args, tpu_fast_ret *rets, int maxrets) {
  int n = res->nret;
  if (n > maxrets) {
    tpu_engine_result_release(res);
    PyErr_SetString(PyExc_SystemError, "torchtpu: more results than the C++ kernel takes");
    return -1;
  }
  for (int k = 0; k < n; k++) {
    tpu_ret_plan *p = &res->ret[k];
    tpu_fast_ret *o = &rets[k];
    *o = (tpu_fast_ret){NULL, -1, -1, 0};
    if (p->is_arg) {
      o->arg = p->index;
      o->item = p->item;
      continue;
    }
    tpu_record *r = res->outs[p->index];
    res->outs[p->index] = NULL;
    if (!r) {
      PyErr_SetString(PyExc_SystemError, "torchtpu: an output was returned twice");
    } else if (p->resize && tpu_numel(args[p->arg].t.rank, args[p->arg].t.sizes) > 0 && tpu_warn_resized() < 0) {
      tpu_record_unref(r);
    } else {
      o->dlpack = tpu_dl_make(r, res->types[p->index].rank, res->types[p->index].dims, NULL);
      o->arg = p->resize ? p->arg : -1;
      o->resize = p->resize;
    }
    if (!o->dlpack) {
      for (int j = 0; j < k; j++) tpu_dl_release(rets[j].dlpack);
      tpu_engine_result_release(res);
      return -1;
    }
  }
  tpu_engine_result_release(res);
  return n;
}

static int tpu_fast_call(void *kernel, const tpu_fast_arg *in, int nargs, tpu_fast_ret *rets, int maxrets) {
  tpu_kernel *k = kernel;
  tpu_mod_state *st = tpu_state(k->module);
  if (nargs != k->nparams || st->explain || !st->tapi) return TPU_FAST_PYTHON;
  if (!tpu_need_engine(st)) return -1;
  const char *opname = tpu_op_table[k->op_id].name;
  tpu_call_frame *f = tpu_frame_take(st);
  if (!f) return -1;
  tpu_arg *args = tpu_frame_args(f);
  int nparsed = 0, rc = 0;
  for (int i = 0; i < nargs && rc == 0; i++) {
    tpu_arg *a = &args[i];
    tpu_arg_clear(a);
    a->is_default = in[i].is_default != 0;
    nparsed = i + 1;
    rc = tpu_fast_parse(st, k->kinds[i], &in[i], a, opname);
  }
  if (rc == 0) {
    tpu_engine_result res;
    rc = tpu_run_engine(st, k->op_id, args, nargs, &res) < 0 ? -1 : tpu_fast_results(&res, args, rets, maxrets);
  } else if (rc > 0) {
    rc = TPU_FAST_PYTHON;
  }
  tpu_frame_give(st, f, nparsed);
  return rc;
}

static const tpu_fast_api tpu_fast_table = {TPU_FAST_API_VERSION, tpu_fast_call, tpu_dl_release};

PyObject *tpu_fast_capsule(void) { return PyCapsule_New((void *)&tpu_fast_table, TPU_FAST_API_NAME, NULL); }

/* module.c: torchtpu._C, the CPython bindings (C API only, no C++): the
 * module's method table and life, the engine's settings, metrics. The other
 * files of this folder are listed in bind.h.
 */
#include "bind.h"
#include "../lower/lower.h"

#include <string.h>

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
  PyObject *step = PyDict_GetItemString(d, "step_boundary"); /* optional: auto */
  const char *sb = step ? PyUnicode_AsUTF8(step) : "auto";
  if (!sb) return -1;
  if (strcmp(sb, "auto") == 0)
    o->step = TPU_STEP_AUTO;
  else if (strcmp(sb, "backward") == 0)
    o->step = TPU_STEP_BACKWARD;
  else if (strcmp(sb, "optimizer") == 0)
    o->step = TPU_STEP_OPTIMIZER;
  else
    return PyErr_Format(PyExc_ValueError, "init: step_boundary=%s is not auto, backward or optimizer", sb), -1;
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
  if (!PyArg_ParseTuple(args, "ssiOOOdzO", &path, &platform, &ndev, &dtypes, &from_dlpack, &empty, &fraction, &error,
                        &settings))
    return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (st->eng) Py_RETURN_NONE;
  tpu_engine_options o;
  tpu_engine_options_init(&o);
  if (tpu_options_from_dict(settings, &o) < 0) return NULL;
  o.rt = (tpu_rt_options){path, platform, ndev, fraction, 0};
  PyObject *lvl = PyDict_GetItemString(settings, "cpu_opt_level"); /* borrowed */
  if (!lvl) return PyErr_Format(PyExc_KeyError, "init: settings lack cpu_opt_level");
  o.rt.opt_level = (int)PyLong_AsLong(lvl);
  if (o.rt.opt_level == -1 && PyErr_Occurred()) return NULL;
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
  tpu_engine_set_where(st->eng, tpu_site_where);
  tpu_guard_set_engine(st->eng);
  /* torch.tpu.device_count() before the runtime starts (torch's device guard) */
  tpu_guard_set_count(error ? 0 : strcmp(platform, "cpu") == 0 ? ndev : 1);
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

static PyObject *tpu_py_info(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  tpu_rt *rt = tpu_engine_rt(st->eng);
  int major, minor;
  tpu_rt_api_version(rt, &major, &minor);
  return Py_BuildValue("{sssssssisss(ii)}", "platform", tpu_rt_platform_name(rt), "platform_version",
                       tpu_rt_platform_version(rt), "plugin", tpu_rt_plugin_path(rt), "device_count",
                       tpu_rt_device_count(rt), "device_kind", tpu_rt_device_kind(rt, 0), "api_version", major, minor);
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
#define X(field, name, ns)     \
  if (!rc)                     \
    rc = tpu_dict_put(d, name, \
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
  if (!rc)
    rc = tpu_dict_put(d, "unwind_tables_ignored", PyLong_FromLongLong((long long)tpu_rt_unwind_tables_ignored()));
  if (!rc) rc = tpu_dict_put(d, "profiler_records", PyLong_FromUnsignedLongLong(tpu_prof_total()));
  if (rc) Py_CLEAR(d);
  return d;
}

/* memory(reset_peak=False, device=-1) -> dict. allocated/peak: bytes of the
 * live device buffers as counted by the runtime (every plugin), on every
 * device (-1) or on one; device_in_use, device_peak, device_limit: the
 * plugin's own statistics of that device (device 0 for -1), -1 where it
 * reports none (XLA's CPU plugin). */
static PyObject *tpu_py_memory(PyObject *m, PyObject *args) {
  int reset = 0, dev = -1;
  if (!PyArg_ParseTuple(args, "|pi", &reset, &dev)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!st->eng || !tpu_engine_started(st->eng)) /* nothing allocated yet */
    return Py_BuildValue("{sisisisisi}", "allocated", 0, "peak", 0, "device_in_use", -1, "device_peak", -1,
                         "device_limit", -1);
  tpu_rt *rt = tpu_engine_rt(st->eng);
  if (dev < -1 || dev >= tpu_rt_device_count(rt))
    return PyErr_Format(PyExc_RuntimeError, "Invalid device argument %d: did you call init?", dev);
  /* fused mode: the recorded ops run (without waiting), so that the count
   * holds every live tensor, as it does after the same ops in strict mode */
  tpu_status *f = tpu_engine_graph_capturing(st->eng) ? NULL : tpu_engine_flush(st->eng, TPU_FLUSH_MEMORY);
  if (f) return tpu_raise(f);
  if (reset) tpu_rt_reset_peak_bytes(rt);
  int64_t in_use = -1, peak = -1, limit = -1;
  tpu_status *s = tpu_rt_device_memory(rt, dev < 0 ? 0 : dev, &in_use, &peak, &limit);
  if (s) {
    in_use = -1;
    tpu_status_free(s);
  }
  long long alloc = dev < 0 ? tpu_rt_live_bytes(rt) : tpu_rt_device_live_bytes(rt, dev);
  long long top = dev < 0 ? tpu_rt_peak_bytes(rt) : tpu_rt_device_peak_bytes(rt, dev);
  return Py_BuildValue("{sLsLsLsLsL}", "allocated", alloc, "peak", top, "device_in_use", (long long)in_use,
                       "device_peak", (long long)peak, "device_limit", (long long)limit);
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

/* torch_compat(bool_sub, arg_bool, arange_count): where torch versions
 * differ, the running torch's way (found by the caller on the CPU; the
 * TPU_COMPAT_* flags of lower.h). */
static PyObject *tpu_py_torch_compat(PyObject *m, PyObject *args) {
  (void)m;
  int bool_sub = 0, arg_bool = 0, arange = 0;
  if (!PyArg_ParseTuple(args, "ppp", &bool_sub, &arg_bool, &arange)) return NULL;
  tpu_lower_set_compat((bool_sub ? TPU_COMPAT_BOOL_SUB : 0) | (arg_bool ? TPU_COMPAT_ARG_BOOL : 0) |
                       (arange ? TPU_COMPAT_ARANGE_COUNT : 0));
  Py_RETURN_NONE;
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

/* optimizer_step(begins) -> whether the optimizer steps end a training
 * step's program (tpu_engine_step_at_optimizer). Called by the optimizer's
 * pre hook (begins) and post hook: then the step's program is launched by the
 * first op after the last optimizer step (two optimizers stepped one after
 * the other end one program), not by the backward pass. */
static PyObject *tpu_py_optimizer_step(PyObject *m, PyObject *args) {
  int begins;
  if (!PyArg_ParseTuple(args, "p", &begins)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (!st->eng) Py_RETURN_FALSE;
  bool at = tpu_engine_mode(st->eng) == TPU_MODE_FUSED && tpu_engine_step_at_optimizer(st->eng);
  st->in_optimizer = begins && at;
  if (!begins && at) st->step_pending = true;
  return PyBool_FromLong(at);
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

/* device_count() -> the local devices (starts the runtime). */
static PyObject *tpu_py_device_count(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_mod_state *st = tpu_state(m);
  if (!tpu_need_engine(st)) return NULL;
  int n = 0;
  tpu_status *s = tpu_engine_device_count(st->eng, &n);
  if (s) return tpu_raise(s);
  return PyLong_FromLong(n);
}

/* current_device() -> index; current_device(i) selects local device i. */
static PyObject *tpu_py_current_device(PyObject *m, PyObject *args) {
  int dev = -1;
  if (!PyArg_ParseTuple(args, "|i", &dev)) return NULL;
  tpu_mod_state *st = tpu_state(m);
  if (dev < 0) return PyLong_FromLong(tpu_engine_thread_device());
  if (!tpu_need_engine(st)) return NULL;
  tpu_status *s = tpu_engine_set_device(st->eng, dev);
  if (s) return tpu_raise(s);
  return PyLong_FromLong(dev);
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

static PyMethodDef tpu_methods[] = {
    {"init", tpu_py_init, METH_VARARGS,
     "init(plugin, platform, num_devices, dtypes, from_dlpack, empty, gpu_memory_fraction, error, settings): "
     "makes the engine; its runtime starts at the device's first use (or raises error then)"},
    {"ops", tpu_py_ops, METH_NOARGS, "The op table: [(aten overload, id, flags)]."},
    {"foreach", tpu_py_foreach, METH_VARARGS,
     "foreach(name, element_kernel, lists, kwnames, out_self, returns_list) -> callable"},
    {"arg_kinds", tpu_py_arg_kinds, METH_NOARGS, "arg_kinds() -> {letter: name} of a kernel spec's argument kinds"},
    {"kernel", tpu_py_kernel, METH_VARARGS,
     "kernel(op_id, spec, nreturns, REQUIRED[, resolve, resolve_real]) -> callable"},
    {"empty", tpu_py_empty, METH_VARARGS, "empty(sizes, dtype, strides, device=-1) -> tpu tensor"},
    {"copy_from", tpu_py_copy_from, METH_VARARGS, "copy_from(src, dst) -> dst"},
    {"to_cpu", tpu_py_to_cpu, METH_O, "to_cpu(t) -> contiguous CPU tensor"},
    {"storage_free", tpu_py_storage_free, METH_O, "storage_free(t): free the memory of t's storage (FSDP2)"},
    {"storage_alloc", tpu_py_storage_alloc, METH_O, "storage_alloc(t): give t's freed storage memory again"},
    {"storage_freed", tpu_py_storage_freed, METH_O, "storage_freed(t) -> whether t's storage memory is freed"},
    {"host_memory", tpu_py_host_memory, METH_O,
     "host_memory(t) -> t's storage buffer as a writable memoryview, in place (CPU plugin), or None"},
    {"storage_shape", tpu_py_storage_shape, METH_O, "storage_shape(t) -> the shape of t's storage's device buffer"},
    {"buffer_shape", tpu_py_buffer_shape, METH_O, "buffer_shape(sizes) -> the buffer shape of a storage made for them"},
    {"dense", tpu_py_dense, METH_O, "dense(t) -> whether t is non-overlapping and dense"},
    {"contiguous_strides", tpu_py_contiguous_strides, METH_VARARGS,
     "contiguous_strides(sizes, channels_last) -> strides (channels_last: 4, 5 or 0)"},
    {"stride_order", tpu_py_stride_order, METH_O, "stride_order(t) -> dims by decreasing stride ([]: in order)"},
    {"warn_resized", tpu_py_warn_resized, METH_NOARGS,
     "warn_resized(): torch's deprecation warning for an out= tensor with elements that was resized"},
    {"check_out_overlap", tpu_py_check_out_overlap, METH_VARARGS,
     "check_out_overlap(out, *inputs): torch's refusals of an out= tensor sharing memory"},
    {"replica_collective", tpu_py_replica_collective, METH_VARARGS,
     "replica_collective(tensors, kind, op, pairs, src) -> [tensor i on tpu:i]"},
    {"collective_kinds", tpu_py_collective_kinds, METH_NOARGS,
     "collective_kinds() -> {name: kind} of replica_collective (csrc/engine/collectives.def)"},
    {"reduce_ops", tpu_py_reduce_ops, METH_NOARGS,
     "reduce_ops() -> {name: op} of replica_collective (csrc/engine/collectives.def)"},
    {"info", tpu_py_info, METH_NOARGS, "Runtime facts: platform, versions, devices (starts the runtime)."},
    {"initialized", tpu_py_initialized, METH_NOARGS, "Whether the runtime has started."},
    {"in_bad_fork", tpu_py_in_bad_fork, METH_NOARGS, "Whether a parent of this forked process started it."},
    {"metrics", tpu_py_metrics, METH_NOARGS, "Counters."},
    {"memory", tpu_py_memory, METH_VARARGS, "memory(reset_peak=False, device=-1) -> byte counts"},
    {"matmul_precision", tpu_py_matmul_precision, METH_VARARGS, "matmul_precision([p]) -> p"},
    {"value_checks", tpu_py_value_checks, METH_VARARGS, "value_checks([on]) -> on"},
    {"torch_compat", tpu_py_torch_compat, METH_VARARGS,
     "torch_compat(bool_sub, arg_bool, arange_count): the running torch's ways"},
    {"disk_cache", tpu_py_disk_cache, METH_VARARGS, "disk_cache(dir, max_bytes, extra_salt)"},
    {"set_aot", tpu_py_set_aot, METH_VARARGS,
     "set_aot(libtpu, topology, strict, mesh_only=False): compile for a TPU as well"},
    {"aot_report", tpu_py_aot_report, METH_NOARGS, "aot_report() -> the TPU target and its programs"},
    {"eager_mode", tpu_py_eager_mode, METH_VARARGS, "eager_mode([name[, sync]]) -> the mode's name"},
    {"modes", tpu_py_modes, METH_NOARGS, "modes() -> the eager modes' names"},
    {"synchronize", tpu_py_synchronize, METH_NOARGS, "Wait for every launched computation."},
    {"device_count", tpu_py_device_count, METH_NOARGS, "device_count() -> local devices"},
    {"shard", tpu_py_shard, METH_VARARGS, "shard(t, mesh, dim_axis) -> t laid over a mesh of devices"},
    {"sharding", tpu_py_sharding, METH_VARARGS,
     "sharding(t, sync=False) -> (mesh, dim_axis) or None (sync: a value still recorded runs first)"},
    {"mesh_like", tpu_py_mesh_like, METH_VARARGS, "mesh_like(t, dtype) -> zeros laid out as t"},
    {"spmd_partitioner", tpu_py_spmd_partitioner, METH_O, "spmd_partitioner('shardy' | 'gspmd')"},
    {"current_device", tpu_py_current_device, METH_VARARGS, "current_device([index]) -> the current device"},
    {"set_generator_api", tpu_py_set_generator_api, METH_O,
     "set_generator_api(torchtpu._device_guard.generator_api): read generator= arguments through it"},
    {"set_tensor_api", tpu_py_set_tensor_api, METH_VARARGS,
     "set_tensor_api(torchtpu._device_guard.tensor_api, torch._C.TensorBase): read tensor arguments through it"},
    {"flush", tpu_py_flush, METH_VARARGS, "flush(step=False): launch the recorded ops (fused mode) without waiting."},
    {"optimizer_step", tpu_py_optimizer_step, METH_VARARGS,
     "optimizer_step(begins) -> whether the optimizer steps end a step's program (fused mode)."},
    {"backward_passes", tpu_py_backward_passes, METH_NOARGS,
     "backward_passes() -> backward passes begun in fused mode."},
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
  PyObject *guard = tpu_guard_capsule();
  int rc = guard ? PyModule_AddObjectRef(m, "guard_api", guard) : -1;
  Py_XDECREF(guard);
  if (rc < 0) return -1;
  PyObject *prof = tpu_prof_capsule();
  rc = prof ? PyModule_AddObjectRef(m, "prof_api", prof) : -1;
  Py_XDECREF(prof);
  if (rc < 0) return -1;
  PyObject *fast = tpu_fast_capsule();
  rc = fast ? PyModule_AddObjectRef(m, "fast_api", fast) : -1;
  Py_XDECREF(fast);
  if (rc < 0) return -1;
  st->foreach_type = PyType_FromModuleAndSpec(m, &tpu_foreach_spec, NULL);
  if (!st->foreach_type) return -1;
  if (PyModule_AddFunctions(m, tpu_stablehlo_methods) < 0) return -1;
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
  Py_VISIT(st->tapi_capsule);
  Py_VISIT(st->gapi_capsule);
  Py_VISIT(st->tensor_base);
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
  st->tapi = NULL;
  Py_CLEAR(st->tapi_capsule);
  st->gapi = NULL;
  Py_CLEAR(st->gapi_capsule);
  Py_CLEAR(st->tensor_base);
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
    PyModuleDef_HEAD_INIT, "torchtpu._C", "torchtpu core (C).",
    sizeof(tpu_mod_state), tpu_methods,   tpu_mod_slots,
    tpu_mod_traverse,      tpu_mod_clear, NULL,
};

PyMODINIT_FUNC PyInit__C(void); /* the module's entry point, found by name */
PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&tpu_module_def); }

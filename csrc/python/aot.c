/* aot.c: compiling every program for a TPU topology as well (the engine's
 * aot.c): the setting, and the report torchtpu.aot_report() shapes.
 */
#include "bind.h"

/* set_aot(libtpu_path, topology, strict, mesh_only): before the device's first use. */
PyObject *tpu_py_set_aot(PyObject *m, PyObject *args) {
  const char *plugin = NULL, *topology = NULL;
  int strict = 1, mesh_only = 0;
  if (!PyArg_ParseTuple(args, "zzp|p", &plugin, &topology, &strict, &mesh_only)) return NULL;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  tpu_status *s = tpu_engine_set_aot(e, plugin, topology, strict, mesh_only);
  if (s) return tpu_raise(s);
  Py_RETURN_NONE;
}

static PyObject *tpu_py_opt_double(double v) { return v < 0 ? Py_NewRef(Py_None) : PyFloat_FromDouble(v); }
static PyObject *tpu_py_opt_int(int64_t v) { return v < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(v); }

static PyObject *tpu_py_aot_prog(const tpu_aot_prog *p) {
  const tpu_rt_aot_stats *s = &p->st;
  bool ok = p->error == NULL;
  /* N: the value's reference is stolen (None for what was not reported) */
  return Py_BuildValue(
      "{s:s,s:O,s:z,s:s,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:i,s:s,s:d,s:O,s:L}", "name", p->name, "ok",
      ok ? Py_True : Py_False, "error", p->error, "error_kind",
      ok                          ? ""
      : p->code == TPU_ERR_MEMORY ? "out of memory"
                                  : "compile error",
      "flops", tpu_py_opt_double(ok ? s->flops : -1), "bytes_accessed", tpu_py_opt_double(ok ? s->bytes_accessed : -1),
      "transcendentals", tpu_py_opt_double(ok ? s->transcendentals : -1), "optimal_seconds",
      tpu_py_opt_double(ok ? s->optimal_seconds : -1), "argument_bytes", tpu_py_opt_int(ok ? s->argument_bytes : -1),
      "output_bytes", tpu_py_opt_int(ok ? s->output_bytes : -1), "alias_bytes",
      tpu_py_opt_int(ok ? s->alias_bytes : -1), "temp_bytes", tpu_py_opt_int(ok ? s->temp_bytes : -1), "peak_bytes",
      tpu_py_opt_int(ok ? s->peak_bytes : -1), "code_bytes", tpu_py_opt_int(ok ? s->code_bytes : -1),
      "serialized_bytes", tpu_py_opt_int(ok ? s->serialized_bytes : -1), "partitions", ok ? s->partitions : 0,
      "fingerprint", ok ? s->fingerprint : "", "compile_seconds", p->seconds, "cached", p->cached ? Py_True : Py_False,
      "runs", (long long)p->runs);
}

/* aot_report() -> {topology, kind, platform_version, devices, hbm_bytes, strict, programs: [dict]} */
PyObject *tpu_py_aot_report(PyObject *m, PyObject *noargs) {
  (void)noargs;
  tpu_engine *e = tpu_eng(tpu_state(m));
  if (!e) return NULL;
  tpu_aot_info in;
  tpu_engine_aot_info(e, &in);
  PyObject *progs = PyList_New(in.nprogs);
  if (!progs) return NULL;
  for (int i = 0; i < in.nprogs; i++) {
    PyObject *d = tpu_py_aot_prog(&in.progs[i]);
    if (!d) {
      Py_DECREF(progs);
      return NULL;
    }
    PyList_SET_ITEM(progs, i, d);
  }
  return Py_BuildValue("{s:z,s:z,s:z,s:i,s:N,s:O,s:O,s:N}", "topology", in.topology, "kind", in.kind,
                       "platform_version", in.platform_version, "devices", in.devices, "hbm_bytes",
                       tpu_py_opt_int(in.hbm_bytes), "strict", in.strict ? Py_True : Py_False, "mesh_compile_only",
                       in.mesh_only ? Py_True : Py_False, "programs", progs);
}

/* state.c: module state, errors as Python exceptions, and the engine's start.
 */
#define _GNU_SOURCE /* pthread_getname_np */
#include "bind.h"

#include <pthread.h>
#include <string.h>

/* torchtpu.OutOfMemoryError (torch.OutOfMemoryError, as CUDA raises, and a
 * MemoryError), or MemoryError before the package has defined it. */
static PyObject *tpu_oom_type(void) {
  PyObject *mods = PyImport_GetModuleDict();
  PyObject *m = mods ? PyDict_GetItemString(mods, "torchtpu") : NULL; /* borrowed */
  PyObject *t = m ? PyObject_GetAttrString(m, "OutOfMemoryError") : NULL;
  if (!t) PyErr_Clear();
  if (t && PyExceptionClass_Check(t)) {
    Py_DECREF(t); /* the module keeps it */
    return t;
  }
  Py_XDECREF(t);
  return PyExc_MemoryError;
}

/* The eager mode named by a str; -1 with ValueError for another name. */
int tpu_mode_from_py(PyObject *name, tpu_mode *out) {
  const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  for (int i = 0; s && i < TPU_MODE_COUNT; i++)
    if (strcmp(s, tpu_mode_names[i]) == 0) {
      *out = (tpu_mode)i;
      return 0;
    }
  if (PyErr_Occurred()) return -1;
  PyErr_Format(PyExc_ValueError, "torchtpu.eager_mode: expected 'debug', 'strict' or 'fused', got %R", name);
  return -1;
}

PyObject *tpu_raise(tpu_status *s) {
  PyObject *exc = PyExc_RuntimeError;
  switch (tpu_status_code(s)) {
    case TPU_ERR_VALUE: exc = PyExc_ValueError; break;
    case TPU_ERR_TYPE: exc = PyExc_TypeError; break;
    case TPU_ERR_INDEX: exc = PyExc_IndexError; break;
    case TPU_ERR_UNIMPLEMENTED: exc = PyExc_NotImplementedError; break;
    case TPU_ERR_MEMORY: exc = tpu_oom_type(); break;
    default: break;
  }
  PyErr_SetString(exc, tpu_status_message(s));
  tpu_status_free(s);
  return NULL;
}

/* Set in a child forked after the runtime started (a pthread_atfork handler:
 * no system call on the path of every op). */
volatile sig_atomic_t tpu_forked_after_start;
static void tpu_atfork_child(void) { tpu_forked_after_start = 1; }

/* The engine, made by init(); NULL with an exception set before. */
tpu_engine *tpu_eng(tpu_mod_state *st) {
  if (!st->eng) PyErr_SetString(PyExc_RuntimeError, "torchtpu runtime is not initialised (import torchtpu first)");
  return st->eng;
}

/* The engine with its runtime started (at the device's first use, as CUDA's
 * context is made: `import torch` with torchtpu installed loads no plugin,
 * and a process that never touches the device, a CPU-only script, a
 * data-loader or compile worker, never opens it; a TPU admits one process).
 * NULL with an exception set when the plugin cannot be used (each use then
 * raises the same error). */
tpu_engine *tpu_need_engine(tpu_mod_state *st) {
  tpu_engine *e = tpu_eng(st);
  if (!e) return NULL;
  if (tpu_engine_started(e)) {
    if (!tpu_forked_after_start) return e;
    /* the plugin's threads did not survive fork(): its client cannot be used */
    PyErr_SetString(PyExc_RuntimeError,
                    "the tpu runtime was started before this process was forked and cannot be used in the child; "
                    "start the subprocess with the 'spawn' method (multiprocessing.set_start_method('spawn')) or "
                    "use the tpu only after forking");
    return NULL;
  }
  tpu_status *s = tpu_engine_start(e);
  if (s) return tpu_raise(s), NULL;
  pthread_atfork(NULL, NULL, tpu_atfork_child);
  tpu_guard_set_count(tpu_rt_device_count(tpu_engine_rt(e)));
  /* the start's warnings (a cache folder that cannot be used); raised as
   * errors by a warnings filter, the engine is up and the next call goes on */
  if (tpu_flush_warnings(st) < 0) return NULL;
  return e;
}

tpu_dtype tpu_dtype_from_py(tpu_mod_state *st, PyObject *d) {
  for (int i = 1; i < TPU_NUM_DTYPES; i++)
    if (st->dtypes[i] == d) return (tpu_dtype)i;
  return TPU_INVALID;
}

/* Writes msg and a newline to sys.stderr (where the recompile explainer
 * speaks); -1 with an exception set when the write failed. */
int tpu_stderr_line(const char *msg) {
  PyObject *err = PySys_GetObject("stderr"); /* borrowed */
  if (!err || err == Py_None) return 0;
  PyObject *line = PyUnicode_FromFormat("%s\n", msg);
  PyObject *r = line ? PyObject_CallMethod(err, "write", "O", line) : NULL;
  Py_XDECREF(line);
  if (!r) return -1;
  Py_DECREF(r);
  return 0;
}

/* One compile line ("<seconds>\t<recompile>\t<text>", programs.c) to the
 * "torchtpu" logger: INFO for a compile of a second or more (a long first
 * step says what it waits for) and for an op's recompile, DEBUG for the
 * others. Nothing is formatted unless the logger takes that level. */
static int tpu_log_compile(const char *line) {
  char *end = NULL;
  double secs = strtod(line, &end);
  long again = end && *end == '\t' ? strtol(end + 1, &end, 10) : 0;
  const char *text = end && *end == '\t' ? end + 1 : line;
  int level = secs >= 1.0 || again ? 20 : 10; /* logging.INFO, logging.DEBUG */
  PyObject *logging = PyImport_ImportModule("logging");
  PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "torchtpu") : NULL;
  PyObject *on = logger ? PyObject_CallMethod(logger, "isEnabledFor", "i", level) : NULL;
  int rc = on ? 0 : -1;
  if (on && PyObject_IsTrue(on)) {
    PyObject *r = PyObject_CallMethod(logger, "log", "is", level, text);
    if (!r) rc = -1;
    Py_XDECREF(r);
  }
  Py_XDECREF(on);
  Py_XDECREF(logger);
  Py_XDECREF(logging);
  return rc;
}

/* The engine's pending warnings become Python warnings; -1 when one was
 * turned into an exception (warnings configured as errors). Its compile
 * lines go to Python's logging. */
int tpu_flush_warnings(tpu_mod_state *st) {
  int rc = 0;
  char *w;
  while ((w = tpu_engine_take_log(st->eng))) {
    if (rc == 0 && tpu_log_compile(w) < 0) rc = -1;
    free(w);
  }
  while ((w = tpu_engine_take_warning(st->eng))) {
    if (rc == 0 && PyErr_WarnEx(PyExc_UserWarning, w, 1) < 0) rc = -1;
    free(w);
  }
  while ((w = tpu_engine_take_note(st->eng))) { /* explained recompiles, as the per-op ones */
    if (rc == 0 && tpu_stderr_line(w) < 0) rc = -1;
    free(w);
  }
  return rc;
}

int tpu_dtype_arg(tpu_mod_state *st, PyObject *d, tpu_dtype *out) {
  *out = tpu_dtype_from_py(st, d);
  if (*out == TPU_INVALID) {
    PyErr_Format(PyExc_TypeError, "dtype %R is not supported on tpu", d);
    return -1;
  }
  return 0;
}

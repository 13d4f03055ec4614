/* site.c: where Python called an op, for errors raised later. A value check
 * that fails is raised at the next sync point (strict and fused modes); the
 * engine asks for the calling Python stack when such an op is called, and the
 * error names it as a traceback does (most recent call last).
 */
#include "bind.h"

#include <frameobject.h>
#include <stdlib.h>
#include <string.h>

#define TPU_SITE_FRAMES 8

char *tpu_site_where(void) {
  if (!PyGILState_Check()) return NULL;
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc = PyErr_GetRaisedException();
#else
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
#endif
  PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
  Py_XINCREF(f);
  PyObject *lines[TPU_SITE_FRAMES];
  int n = 0;
  while (f && n < TPU_SITE_FRAMES) {
    PyCodeObject *code = PyFrame_GetCode(f);
    lines[n] = PyUnicode_FromFormat("  File \"%U\", line %d, in %U\n", code->co_filename, PyFrame_GetLineNumber(f),
                                    code->co_name);
    Py_DECREF(code);
    if (!lines[n]) break;
    n++;
    PyFrameObject *back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  size_t len = 0;
  for (int k = 0; k < n; k++) {
    Py_ssize_t m = 0;
    if (PyUnicode_AsUTF8AndSize(lines[k], &m)) len += (size_t)m;
  }
  char *out = n ? malloc(len + 1) : NULL;
  size_t at = 0;
  for (int k = n - 1; k >= 0; k--) { /* outermost first */
    Py_ssize_t m = 0;
    const char *u = PyUnicode_AsUTF8AndSize(lines[k], &m);
    if (out && u && at + (size_t)m <= len) {
      memcpy(out + at, u, (size_t)m);
      at += (size_t)m;
    }
    Py_DECREF(lines[k]);
  }
  if (out) {
    while (at && out[at - 1] == '\n') at--; /* the error's text closes the list */
    out[at] = 0;
  }
  PyErr_Clear();
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_Restore(et, ev, tb);
#endif
  return out;
}

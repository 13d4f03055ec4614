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
  PyObject *lines = PyList_New(0);
  PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
  Py_XINCREF(f);
  for (int n = 0; f && lines && n < TPU_SITE_FRAMES; n++) {
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *line = PyUnicode_FromFormat("  File \"%U\", line %d, in %U", code->co_filename, PyFrame_GetLineNumber(f),
                                          code->co_name);
    Py_DECREF(code);
    if (!line || PyList_Append(lines, line) < 0) Py_CLEAR(lines);
    Py_XDECREF(line);
    PyFrameObject *back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  /* outermost first, a line each, as a traceback */
  PyObject *nl = PyUnicode_FromString("\n");
  PyObject *text =
      lines && nl && PyList_GET_SIZE(lines) && PyList_Reverse(lines) == 0 ? PyUnicode_Join(nl, lines) : NULL;
  Py_XDECREF(nl);
  Py_XDECREF(lines);
  const char *u = text ? PyUnicode_AsUTF8(text) : NULL;
  char *out = u ? strdup(u) : NULL;
  Py_XDECREF(text);
  PyErr_Clear();
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_Restore(et, ev, tb);
#endif
  return out;
}

/* generator.c: the random ops' generator= argument (kind 'r'). A tpu
 * torch.Generator of its own is read through torchtpu._device_guard's
 * generator_api (generator_api.h) into the argument's gen, which the engine
 * draws from (tpu_engine_call); None and the default tpu generator leave gen
 * NULL: the engine's own generator. */
#include "bind.h"

_Static_assert(sizeof(tpu_generator_state) == sizeof(tpu_rng), "generator_api.h's state is call.h's tpu_rng");

/* A generator argument into a; 0, or -1 with an exception set. */
int tpu_parse_generator(tpu_mod_state *st, PyObject *o, tpu_arg *a) {
  a->kind = TPU_ARG_IGNORED;
  a->i = 0;
  a->gen = NULL;
  a->is_default = true; /* one program with or without a generator */
  if (o == Py_None) return 0;
  if (st->gapi) {
    tpu_generator_state *g = NULL;
    if (st->gapi->state(o, &g) < 0) return -1;
    a->gen = (tpu_rng *)g;
    return 0;
  }
  /* without torchtpu._device_guard no tpu generator can be made: say whose this is */
  PyObject *dev = PyObject_GetAttrString(o, "device");
  PyObject *type = dev ? PyObject_GetAttrString(dev, "type") : NULL;
  if (type)
    PyErr_Format(PyExc_RuntimeError, "Expected a 'tpu' device type for generator but found '%S'", type);
  else if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "generator must be a torch.Generator, not %s", Py_TYPE(o)->tp_name);
  }
  Py_XDECREF(dev);
  Py_XDECREF(type);
  return -1;
}

/* set_generator_api(capsule): read generator= arguments through it. */
PyObject *tpu_py_set_generator_api(PyObject *m, PyObject *cap) {
  tpu_mod_state *st = tpu_state(m);
  const tpu_generator_api *api = PyCapsule_GetPointer(cap, TPU_GENERATOR_API_NAME);
  if (!api) return NULL;
  if (api->version != TPU_GENERATOR_API_VERSION)
    return PyErr_Format(PyExc_ImportError, "torchtpu: generator_api version %d, expected %d", api->version,
                        TPU_GENERATOR_API_VERSION);
  Py_XSETREF(st->gapi_capsule, Py_NewRef(cap));
  st->gapi = api;
  Py_RETURN_NONE;
}

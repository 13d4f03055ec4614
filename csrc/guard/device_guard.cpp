// device_guard.cpp: torchtpu._device_guard, the project's only C++ (the core
// is C). It registers with PyTorch the tpu's device guard (c10's
// DeviceGuardImplInterface for PrivateUse1) in place of torch's guard for
// Python backends (torch/csrc/acc/Module.cpp), which says there is one
// device, always index 0, and ignores setDevice: the autograd engine sizes
// its per-device queues from deviceCount() and asserts on tpu:1 and above.
//
// All it knows comes from torchtpu._C through the C functions of
// csrc/python/guard_api.h: the device count (torch.tpu.device_count()) and
// the calling thread's current device (torch.tpu.current_device()/
// set_device()). Streams and events are those of torch's Python guard: the
// default stream, events that do nothing.
//
// No C++ exception leaves this file: nothing here throws, and register_guard
// catches whatever torch might. Built by setup.py against the installed
// torch's headers and libc10 (optional: without it torchtpu falls back to
// torch's Python guard, one device).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <limits>

#include "../python/guard_api.h"

PyObject* tpu_register_kernels(PyObject*, PyObject* args);      // boxed.cpp
PyObject* tpu_register_hooks(PyObject*, PyObject* capsule);     // hooks.cpp
PyObject* tpu_py_default_generator(PyObject*, PyObject* index); // generator.cpp
PyObject* tpu_generator_api_capsule();                          // generator.cpp
PyObject* tpu_register_profiler(PyObject*, PyObject* capsule);  // profiler.cpp

// The table in torchtpu._C's guard_api capsule; NULL with an exception set
// when it is not one, or of another version.
const tpu_guard_api* tpu_guard_api_of(PyObject* capsule) {
  auto* a = static_cast<const tpu_guard_api*>(PyCapsule_GetPointer(capsule, TPU_GUARD_API_NAME));
  if (a && a->version != TPU_GUARD_API_VERSION) {
    PyErr_Format(PyExc_ImportError, "torchtpu._device_guard: guard_api version %d, expected %d", a->version,
                 TPU_GUARD_API_VERSION);
    return nullptr;
  }
  return a;
}

namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

const tpu_guard_api* api = nullptr; // set once, before the guard is registered

struct TpuGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }

  c10::Device getDevice() const override {
    return c10::Device(kTpu, static_cast<c10::DeviceIndex>(api->current_device()));
  }
  void setDevice(c10::Device d) const override { api->set_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { api->set_device(d.index()); }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) api->set_device(d.index());
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    int n = api->device_count();
    int most = std::numeric_limits<c10::DeviceIndex>::max();
    return static_cast<c10::DeviceIndex>(n < 0 ? 0 : n > most ? most : n);
  }

  // One stream a device, the default one.
  c10::Device on(c10::Device d) const noexcept {
    return d.index() >= 0 ? d : c10::Device(kTpu, static_cast<c10::DeviceIndex>(api->current_device()));
  }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, on(d)); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    (void)priority;
    return c10::Stream(c10::Stream::DEFAULT, on(d));
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, on(s.device()));
  }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}

  // Events that do nothing (work runs in launch order on a device's one stream).
  void record(void** /*event*/, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*device_index*/) const noexcept override {}
};

// register_guard(capsule) -> True when the tpu's guard is now torch's, False
// when a guard for PrivateUse1 was registered before (it stays).
PyObject* register_guard(PyObject* /*module*/, PyObject* capsule) {
  const tpu_guard_api* a = tpu_guard_api_of(capsule);
  if (!a) return nullptr;
  try {
    if (c10::impl::hasDeviceGuardImpl(kTpu)) Py_RETURN_FALSE;
    Py_INCREF(capsule); // kept for the life of the process, as the guard is
    api = a;
    // leaked on purpose: torch reads the registry until the process ends
    c10::impl::registerDeviceGuard(kTpu, new TpuGuard());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._device_guard: torch refused the device guard");
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyMethodDef methods[] = {
    {"register_guard", register_guard, METH_O, "register_guard(torchtpu._C.guard_api) -> bool"},
    {"register_kernels", tpu_register_kernels, METH_VARARGS,
     "register_kernels(torchtpu._C.fast_api, [(name, kernel), ...]) -> the names registered"},
    {"register_hooks", tpu_register_hooks, METH_O,
     "register_hooks(torchtpu._C.guard_api) -> bool: the tpu's PrivateUse1 hooks (generators) are torch's"},
    {"register_profiler", tpu_register_profiler, METH_O,
     "register_profiler(torchtpu._C.prof_api) -> bool: torch's profiler records the tpu's work"},
    {"default_generator", tpu_py_default_generator, METH_O,
     "default_generator(index) -> tpu:index's default torch.Generator (the engine's generator)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "torchtpu._device_guard",
    "torch's device guard for the tpu (C++).",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

} // namespace

PyObject* tpu_tensor_api_capsule(); // tensor_meta.cpp

PyMODINIT_FUNC PyInit__device_guard(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  PyObject* api = tpu_tensor_api_capsule();
  if (!api || PyModule_AddObject(m, "tensor_api", api) < 0) {
    Py_XDECREF(api);
    Py_DECREF(m);
    return nullptr;
  }
  api = tpu_generator_api_capsule();
  if (!api || PyModule_AddObject(m, "generator_api", api) < 0) {
    Py_XDECREF(api);
    Py_DECREF(m);
    return nullptr;
  }
  // the torch whose headers and C++ ABI it was built with (setup.py)
  if (PyModule_AddStringConstant(m, "torch_version", TPU_TORCH_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

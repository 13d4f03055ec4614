// hooks.cpp: the tpu's PrivateUse1HooksInterface, registered in place of the
// one torch makes for a device set up from Python
// (torch.utils.backend_registration's, whose Python hooks object answers
// only isAvailable, hasPrimaryContext and isBuilt). torch asks these hooks
// for generators: torch.Generator(device="tpu") (getNewGenerator) and the
// device's default generator (generator.cpp). Availability answers as the
// Python object did (true: a plugin error is raised at the device's first
// use); the device count and current device are the device guard's.
// Part of torchtpu._device_guard; no C++ exception leaves register_hooks.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "../python/guard_api.h"
#include "generator.hpp"

const tpu_guard_api* tpu_guard_api_of(PyObject* capsule); // device_guard.cpp

namespace {

const tpu_guard_api* api = nullptr;

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(api->device_count()); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(api->current_device()); }
  void setCurrentDevice(c10::DeviceIndex device) const override { api->set_device(device); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex old = getCurrentDevice();
    if (device >= 0 && device != old) api->set_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return tpu_default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return tpu_new_generator(device_index);
  }
};

} // namespace

// register_hooks(torchtpu._C.guard_api) -> True when the tpu's hooks are now
// torch's, False when hooks for PrivateUse1 were registered before (they
// stay: then no tpu generator can be made).
PyObject* tpu_register_hooks(PyObject*, PyObject* capsule) {
  const tpu_guard_api* a = tpu_guard_api_of(capsule);
  if (!a) return nullptr;
  try {
    if (at::isPrivateUse1HooksRegistered()) Py_RETURN_FALSE;
    Py_INCREF(capsule); // kept for the life of the process, as the hooks are
    api = a;
    tpu_generators_use(a);
    // leaked on purpose: torch reads the hooks until the process ends
    at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._device_guard: torch refused the device hooks");
    return nullptr;
  }
  Py_RETURN_TRUE;
}

// generator.cpp: tpu generators, torch.Generator(device="tpu") and
// torch.tpu.default_generators. Part of torchtpu._device_guard.
//
// A generator made by the user holds its own state: the key of its draws
// (the seed) and the offset of the next draw, as the engine's generator does
// (a random op given it draws from that state and moves its offset on:
// tpu_engine_call). The default generators (one per device index, all the
// engine's one generator, as torch.tpu.manual_seed says) hold nothing: they
// read and set the engine's state through guard_api.h. States are 16 bytes,
// the seed then the offset, each a little-endian uint64: the layout of
// torch.tpu.get_rng_state.
//
// torch makes them through the tpu's PrivateUse1HooksInterface (hooks.cpp).
// No C++ exception leaves a function of this file that Python calls.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/ops/empty.h>
#include <c10/core/GeneratorImpl.h>
#include <torch/csrc/Generator.h>

#include <array>
#include <mutex>

#include "../python/guard_api.h"
#include "generator.hpp"

namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;
constexpr int64_t kStateBytes = 16;

const tpu_guard_api* api = nullptr; // the default generators' state and the current device: set first

struct TpuGenerator final : public c10::GeneratorImpl {
  TpuGenerator(c10::DeviceIndex index, bool is_default)
      : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        is_default_(is_default) {
    own_.seed = c10::detail::getNonDeterministicRandom();
    own_.offset = 0;
  }

  bool is_default() const { return is_default_; }
  tpu_generator_state* own() { return &own_; }

  tpu_generator_state state() const {
    tpu_generator_state s = own_;
    if (is_default_) api->rng_state(&s.seed, &s.offset);
    return s;
  }
  void put(const tpu_generator_state& s) {
    if (is_default_)
      api->set_rng_state(s.seed, s.offset);
    else
      own_ = s;
  }

  void set_current_seed(uint64_t seed) override { put({seed, 0}); }
  void set_offset(uint64_t offset) override { put({state().seed, offset}); }
  uint64_t get_offset() const override { return state().offset; }
  uint64_t current_seed() const override { return state().seed; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& t) override {
    at::detail::check_rng_state(t);
    TORCH_CHECK(t.numel() == kStateBytes, "a tpu generator's state is ", kStateBytes,
                " bytes (torch.tpu.get_rng_state()'s), got ", t.numel());
    const auto* b = static_cast<const uint8_t*>(t.data());
    tpu_generator_state s{};
    for (int i = 7; i >= 0; i--) {
      s.seed = s.seed << 8 | b[i];
      s.offset = s.offset << 8 | b[8 + i];
    }
    put(s);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor t = at::empty({kStateBytes}, at::TensorOptions().dtype(at::kByte));
    auto* b = static_cast<uint8_t*>(t.data_ptr());
    tpu_generator_state s = state();
    for (int i = 0; i < 8; i++) {
      b[i] = static_cast<uint8_t>(s.seed >> (8 * i));
      b[8 + i] = static_cast<uint8_t>(s.offset >> (8 * i));
    }
    return t.getIntrusivePtr();
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index(), false);
    g->own_ = state();
    return g;
  }

  bool is_default_;
  tpu_generator_state own_;
};

constexpr int kMaxDevices = 128;

// The default generators, made at their first use (any thread).
std::mutex defaults_lock;
std::array<at::Generator, kMaxDevices> defaults;
std::array<PyObject*, kMaxDevices> py_defaults{}; // strong: their Python objects

int state_of_py(void* obj, tpu_generator_state** out) {
  *out = nullptr;
  auto* o = static_cast<PyObject*>(obj);
  int is = PyObject_IsInstance(o, THPGeneratorClass);
  if (is < 0) return -1;
  if (!is) {
    PyErr_Format(PyExc_TypeError, "generator must be a torch.Generator, not %s", Py_TYPE(o)->tp_name);
    return -1;
  }
  const at::Generator& g = reinterpret_cast<THPGenerator*>(o)->cdata;
  bool tpu = false;
  *out = tpu_generator_state_of(g, &tpu);
  if (!tpu) {
    std::string found = g.defined() ? c10::DeviceTypeName(g.device().type(), true) : "none";
    PyErr_Format(PyExc_RuntimeError, "Expected a 'tpu' device type for generator but found '%s'", found.c_str());
    return -1;
  }
  return 0;
}

const tpu_generator_api table = {TPU_GENERATOR_API_VERSION, state_of_py};

} // namespace

tpu_generator_state* tpu_generator_state_of(const at::Generator& g, bool* tpu) noexcept {
  *tpu = false;
  if (!g.defined() || g.device().type() != kTpu) return nullptr;
  auto* impl = dynamic_cast<TpuGenerator*>(g.unsafeGetGeneratorImpl());
  if (!impl) return nullptr;
  *tpu = true;
  return impl->is_default() ? nullptr : impl->own();
}

void tpu_generators_use(const tpu_guard_api* a) { api = a; }

// torch.Generator(device="tpu:9") in a process of fewer devices: torch's RuntimeError, as CUDA's.
static void tpu_check_index(c10::DeviceIndex index) {
  int n = api->device_count();
  TORCH_CHECK(index < n, "tpu:", static_cast<int>(index), ": invalid device ordinal (", n, " local devices)");
}

at::Generator tpu_new_generator(c10::DeviceIndex index) {
  if (index < 0) index = static_cast<c10::DeviceIndex>(api->current_device());
  tpu_check_index(index);
  return at::make_generator<TpuGenerator>(index, false);
}

const at::Generator& tpu_default_generator(c10::DeviceIndex index) {
  if (index < 0) index = static_cast<c10::DeviceIndex>(api->current_device());
  TORCH_CHECK(index < kMaxDevices, "no tpu device ", static_cast<int>(index));
  std::lock_guard<std::mutex> hold(defaults_lock);
  at::Generator& g = defaults[static_cast<size_t>(index)];
  if (!g.defined()) g = at::make_generator<TpuGenerator>(index, true);
  return g;
}

// default_generator(index) -> the torch.Generator of tpu:index that is the
// engine's generator (the same object each time).
PyObject* tpu_py_default_generator(PyObject*, PyObject* arg) {
  long index = PyLong_AsLong(arg);
  if (index == -1 && PyErr_Occurred()) return nullptr;
  if (!api) return PyErr_Format(PyExc_RuntimeError, "torchtpu._device_guard: register_hooks was not called");
  if (index < 0 || index >= kMaxDevices) return PyErr_Format(PyExc_IndexError, "no tpu device %ld", index);
  try {
    PyObject*& slot = py_defaults[static_cast<size_t>(index)];
    if (!slot) slot = THPGenerator_initDefaultGenerator(tpu_default_generator(static_cast<c10::DeviceIndex>(index)));
    return slot ? Py_NewRef(slot) : nullptr;
  } catch (...) {
    return PyErr_Format(PyExc_RuntimeError, "torchtpu._device_guard: making the default generator of tpu:%ld failed",
                        index);
  }
}

// The capsule for the module's generator_api attribute (a new reference).
PyObject* tpu_generator_api_capsule() {
  return PyCapsule_New(const_cast<tpu_generator_api*>(&table), TPU_GENERATOR_API_NAME, nullptr);
}

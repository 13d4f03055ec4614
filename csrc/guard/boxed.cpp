// boxed.cpp: torch's dispatcher calls torchtpu's Kernels with no Python in
// between. One boxed kernel per ATen row reads the argument stack into
// fast_api.h's plain values, takes the GIL and calls the Kernel through
// torchtpu._C's fast_api table; the new outputs come back as DLPack tensors
// and are imported here. What the table leaves to Python (arguments it does
// not read, lazily conjugated or negated tensors, explained recompiles) goes
// through the Kernel's Python call, as torch.library's Python kernels do.
// Part of torchtpu._device_guard. Errors are Python's exceptions, carried
// through torch's python_error as for any Python kernel.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/DLConvertor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/DynamicTypes.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "../python/fast_api.h"
#include "generator.hpp"
#include "layout.hpp"
#include "meta.hpp"

namespace {

const tpu_fast_api* fast = nullptr;

// What one call's arguments point into.
struct Frame {
  std::array<tpu_fast_arg, TPU_FAST_MAX_ARGS> args;
  std::array<tpu_tensor_meta, TPU_FAST_MAX_ARGS> metas;
  std::vector<tpu_tensor_meta> lists[TPU_FAST_MAX_ARGS];
  std::vector<int64_t> ints[TPU_FAST_MAX_ARGS];
  std::vector<double> floats[TPU_FAST_MAX_ARGS];
};

bool number(const c10::IValue& v, tpu_fast_arg* a) {
  if (v.isBool()) {
    a->tag = TPU_FA_BOOL;
    a->i = v.toBool();
  } else if (v.isInt()) {
    a->tag = TPU_FA_INT;
    a->i = v.toInt();
  } else if (v.isDouble()) {
    a->tag = TPU_FA_FLOAT;
    a->f = v.toDouble();
  } else if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    a->tag = TPU_FA_COMPLEX;
    a->f = c.real();
    a->f_imag = c.imag();
  } else if (v.isSymInt()) {
    auto s = v.toSymInt().maybe_as_int();
    if (!s) return false;
    a->tag = TPU_FA_INT;
    a->i = *s;
  } else {
    return false;
  }
  return true;
}

// A tensor argument: false when it must go through Python.
bool tensor(const at::Tensor& t, tpu_tensor_meta* m) {
  if (!t.defined() || t.is_conj() || t.is_neg()) return false;
  return tpu_fill_meta(t, m) == 0;
}

// A wrapped number (the 1 of x + 1) as the number it was.
bool wrapped(const at::Tensor& t, tpu_fast_arg* a) {
  return t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number() && number(c10::IValue(t.item()), a);
}

// Whether v equals the schema's default d (numbers by value, as Python's ==).
bool same(const c10::IValue& v, const c10::IValue& d) {
  tpu_fast_arg x{}, y{};
  if (number(v, &x) && number(d, &y)) {
    auto integral = [](const tpu_fast_arg& n) { return n.tag == TPU_FA_INT || n.tag == TPU_FA_BOOL; };
    if (integral(x) && integral(y)) return x.i == y.i;
    auto real = [&](const tpu_fast_arg& n) { return integral(n) ? static_cast<double>(n.i) : n.f; };
    return real(x) == real(y) && x.f_imag == y.f_imag;
  }
  if (v.isNone() || d.isNone()) return v.isNone() && d.isNone();
  if (v.isString() && d.isString()) return v.toStringRef() == d.toStringRef();
  return false;
}

// One argument into f.args[i]: false when it must go through Python.
bool read(const c10::IValue& v, const c10::Argument& arg, Frame& f, size_t i) {
  tpu_fast_arg* a = &f.args[i];
  *a = tpu_fast_arg{};
  a->is_default = arg.default_value() && same(v, *arg.default_value());
  if (v.isNone()) {
    a->tag = TPU_FA_NONE;
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (wrapped(t, a)) return true;
    if (!tensor(t, &f.metas[i])) return false;
    a->tag = TPU_FA_TENSOR;
    a->t = &f.metas[i];
  } else if (number(v, a)) {
    // a dtype is an int here (c10::ScalarType); the Kernel's kinds say which
  } else if (v.isTensorList() || v.isOptionalTensorList() || v.isList()) {
    auto items = v.toListRef();
    bool tensors = false, ints = false, floats = false;
    for (const auto& it : items) {
      tensors = tensors || it.isTensor() || it.isNone();
      ints = ints || it.isInt() || it.isBool() || it.isSymInt();
      floats = floats || it.isDouble();
    }
    if (items.empty()) {
      // which kind of list the schema says it is
      auto t = arg.type();
      if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
      auto l = t->cast<c10::ListType>();
      if (!l) return false;
      auto e = l->getElementType();
      if (auto oe = e->cast<c10::OptionalType>()) e = oe->getElementType();
      tensors = e->kind() == c10::TypeKind::TensorType;
      floats = e->kind() == c10::TypeKind::FloatType;
      ints = !tensors && !floats;
    }
    if (tensors + ints + floats != 1) return false;
    a->n = static_cast<int>(items.size());
    if (tensors) {
      auto& m = f.lists[i];
      if (m.size() < items.size()) m.resize(items.size()); // filled below: no 1 KiB clear a tensor a call
      for (size_t j = 0; j < items.size(); j++) {
        if (items[j].isNone()) {
          m[j].rank = -1;
        } else if (!items[j].isTensor() || !tensor(items[j].toTensor(), &m[j]) ||
                   items[j].toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
          return false;
        }
      }
      a->tag = TPU_FA_TENSORS;
      a->t = m.data();
    } else if (ints) {
      auto& m = f.ints[i];
      m.clear();
      for (const auto& it : items) {
        tpu_fast_arg x{};
        if (!number(it, &x) || (x.tag != TPU_FA_INT && x.tag != TPU_FA_BOOL)) return false;
        m.push_back(x.i);
      }
      a->tag = TPU_FA_INTS;
      a->ints = m.data();
    } else {
      auto& m = f.floats[i];
      m.clear();
      for (const auto& it : items) m.push_back(it.toDouble());
      a->tag = TPU_FA_FLOATS;
      a->floats = m.data();
    }
  } else if (v.isString()) {
    a->tag = TPU_FA_STR;
    a->str = v.toStringRef().c_str();
  } else if (v.isDevice()) {
    a->tag = TPU_FA_DEVICE;
    a->i = v.toDevice().has_index() ? v.toDevice().index() + 1 : 0;
  } else if (v.isGenerator()) {
    bool tpu = false;
    a->gen = tpu_generator_state_of(v.toGenerator(), &tpu);
    if (!tpu) return false; // another device's generator: the Python call raises
    a->tag = a->gen ? TPU_FA_GENERATOR : TPU_FA_NONE;
  } else {
    a->tag = TPU_FA_OTHER;
  }
  return true;
}

// One call's Frame: the thread's spare one, given back at the end (a call
// made while one runs, through Python or set_, makes its own).
thread_local std::unique_ptr<Frame> spare;

struct Spare {
  std::unique_ptr<Frame> frame = spare ? std::move(spare) : std::make_unique<Frame>();
  ~Spare() {
    if (!spare) spare = std::move(frame);
  }
};

// A dtype argument (an int in the schema), as torchtpu's registry tells them.
bool is_dtype(const c10::Argument& arg) {
  auto t = arg.type();
  if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
  return t->kind() == c10::TypeKind::IntType && arg.name().find("dtype") != std::string::npos;
}

[[noreturn]] void raise() {
  python_error e;
  e.persist();
  throw std::move(e);
}

// t copied into a tensor of these strides (layout.hpp): the core computes
// results row-major, torch lays some out as their inputs.
at::Tensor relaid(const at::Tensor& t, const std::vector<int64_t>& strides) {
  at::Tensor r = at::empty_strided(t.sizes(), strides, t.options());
  r.copy_(t);
  return r;
}

struct Kernel final : c10::OperatorKernel {
  PyObject* kernel; // strong, for the life of the process
  TpuLayoutRule layout;
  Kernel(PyObject* k, TpuLayoutRule rule) : kernel(k), layout(rule) {}

  // The Kernel's Python call with every argument given (a dtype as a
  // torch.dtype), as torch.library's Python kernels are called.
  void python(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    size_t n = schema.arguments().size();
    auto arguments = torch::jit::pop(*stack, n);
    std::vector<c10::IValue> inputs;
    if (layout != TpuLayoutRule::None) inputs = arguments; // the layout rule reads them after the call
    python_call(schema, arguments, stack);
    if (inputs.empty()) return;
    size_t r = schema.returns().size();
    for (size_t j = stack->size() - r; j < stack->size(); j++) {
      c10::IValue& v = (*stack)[j];
      if (!v.isTensor() || !v.toTensor().defined()) continue;
      bool is_input = false; // an in-place or out= result is the caller's tensor, laid out as it is
      for (const auto& a : inputs) is_input = is_input || (a.isTensor() && a.toTensor().is_same(v.toTensor()));
      if (is_input) continue;
      auto strides = tpu_result_strides(layout, v.toTensor().sizes(), inputs);
      if (!strides.empty()) v = relaid(v.toTensor(), strides);
    }
  }

  void python_call(const c10::FunctionSchema& schema, std::vector<c10::IValue>& arguments, torch::jit::Stack* stack) {
    size_t n = arguments.size();
    pybind11::gil_scoped_acquire gil;
    pybind11::tuple args(n);
    for (size_t i = 0; i < n; i++) {
      if (arguments[i].isInt() && is_dtype(schema.arguments()[i]))
        args[i] = pybind11::reinterpret_borrow<pybind11::object>(
            reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(arguments[i].toInt()))));
      else
        args[i] = torch::jit::toPyObject(std::move(arguments[i]));
    }
    PyObject* res = PyObject_Call(kernel, args.ptr(), nullptr);
    if (!res) raise();
    auto out = pybind11::reinterpret_steal<pybind11::object>(res);
    size_t r = schema.returns().size();
    if (r == 1) {
      stack->push_back(torch::jit::toIValue(out, c10::TensorType::get()));
    } else if (r > 1) {
      auto items = out.cast<pybind11::tuple>();
      for (size_t j = 0; j < r; j++) stack->push_back(torch::jit::toIValue(items[j], c10::TensorType::get()));
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    size_t n = schema.arguments().size();
    Spare keep;
    Frame& f = *keep.frame;
    bool ok = n <= TPU_FAST_MAX_ARGS;
    auto in = torch::jit::last(*stack, n);
    for (size_t i = 0; ok && i < n; i++) ok = read(in[i], schema.arguments()[i], f, i);
    if (!ok) return python(op, stack);
    std::array<tpu_fast_ret, TPU_FAST_MAX_RETS> rets;
    int got;
    {
      pybind11::gil_scoped_acquire gil;
      got = fast->call(kernel, f.args.data(), static_cast<int>(n), rets.data(), TPU_FAST_MAX_RETS);
      if (got == -1) raise();
    }
    if (got == TPU_FAST_PYTHON) return python(op, stack);
    std::array<c10::IValue, TPU_FAST_MAX_RETS> outs;
    int done = 0;
    try {
      for (; done < got; done++) {
        const tpu_fast_ret& r = rets[done];
        if (!r.dlpack) {
          const c10::IValue& v = in[r.arg];
          outs[done] = r.item >= 0 ? c10::IValue(v.toListRef()[r.item]) : v;
          continue;
        }
        at::Tensor t = at::fromDLPack(static_cast<DLManagedTensor*>(r.dlpack));
        if (r.resize) {
          at::Tensor dst = in[r.arg].toTensor();
          dst.set_(t);
          outs[done] = dst;
        } else {
          auto strides =
              layout == TpuLayoutRule::None ? std::vector<int64_t>{} : tpu_result_strides(layout, t.sizes(), in);
          outs[done] = strides.empty() ? std::move(t) : relaid(t, strides);
        }
      }
    } catch (...) {
      for (int j = done + 1; j < got; j++) fast->release(rets[j].dlpack);
      throw;
    }
    torch::jit::drop(*stack, n);
    if (static_cast<size_t>(got) != schema.returns().size())
      TORCH_CHECK(false, "torchtpu: aten::", schema.name(), " returned ", got, " values, its schema ",
                  schema.returns().size());
    for (int j = 0; j < got; j++) stack->push_back(std::move(outs[j]));
  }
};

// Whether the C++ kernel can return what op returns: tensors only.
bool tensors_out(const c10::FunctionSchema& s) {
  if (s.returns().size() > TPU_FAST_MAX_RETS) return false;
  for (const auto& r : s.returns())
    if (r.type()->kind() != c10::TypeKind::TensorType) return false;
  return true;
}

std::vector<c10::RegistrationHandleRAII>* handles = nullptr;

} // namespace

// register_kernels(_C.fast_api, [(name, kernel), ...]) -> the names taken:
// the rows whose PrivateUse1 kernel is now the C++ one (the others are the
// caller's to register).
PyObject* tpu_register_kernels(PyObject*, PyObject* args) {
  PyObject *capsule, *rows;
  if (!PyArg_ParseTuple(args, "OO", &capsule, &rows)) return nullptr;
  auto* api = static_cast<const tpu_fast_api*>(PyCapsule_GetPointer(capsule, TPU_FAST_API_NAME));
  if (!api) return nullptr;
  if (api->version != TPU_FAST_API_VERSION) {
    PyErr_Format(PyExc_ImportError, "torchtpu._device_guard: fast_api version %d, expected %d", api->version,
                 TPU_FAST_API_VERSION);
    return nullptr;
  }
  PyObject* fastseq = PySequence_Fast(rows, "rows must be a sequence");
  if (!fastseq) return nullptr;
  PyObject* taken = PyList_New(0);
  if (!taken) {
    Py_DECREF(fastseq);
    return nullptr;
  }
  Py_INCREF(capsule); // kept for the life of the process, as the kernels are
  fast = api;
  try {
    if (!handles) handles = new std::vector<c10::RegistrationHandleRAII>(); // torch reads them until the process ends
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fastseq); i++) {
      PyObject *name, *kernel;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fastseq, i), "UO", &name, &kernel)) throw python_error();
      std::string full = PyUnicode_AsUTF8(name);
      auto dot = full.find('.');
      c10::OperatorName opname("aten::" + full.substr(0, dot), dot == std::string::npos ? "" : full.substr(dot + 1));
      auto handle = c10::Dispatcher::singleton().findOp(opname);
      if (!handle || !handle->hasSchema() || !tensors_out(handle->schema())) continue;
      Py_INCREF(kernel);
      handles->push_back(c10::Dispatcher::singleton().registerImpl(
          opname, c10::DispatchKey::PrivateUse1,
          c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(kernel, tpu_layout_rule(*handle))),
          std::nullopt, nullptr, "torchtpu (boxed.cpp)"));
      if (PyList_Append(taken, name) < 0) throw python_error();
    }
  } catch (const python_error&) {
    Py_DECREF(fastseq);
    Py_DECREF(taken);
    return nullptr;
  } catch (const std::exception& e) {
    Py_DECREF(fastseq);
    Py_DECREF(taken);
    PyErr_Format(PyExc_RuntimeError, "torchtpu._device_guard: registering a kernel failed: %s", e.what());
    return nullptr;
  }
  Py_DECREF(fastseq);
  return taken;
}

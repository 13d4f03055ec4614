// tensor_meta.cpp: a tensor's metadata read from torch's C++ tensor behind a
// Python tensor (csrc/python/tensor_api.h), for torchtpu._C's argument
// reading: one function call instead of six Python attribute calls per
// tensor argument. Part of torchtpu._device_guard. Nothing here throws out:
// any C++ exception means "read it through Python".
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include "../python/tensor_api.h"

#include "meta.hpp"

int tpu_fill_meta(const at::Tensor& t, tpu_tensor_meta* m) noexcept {
  try {
    if (!t.defined()) return -1;
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->is_python_dispatch() || impl->has_symbolic_sizes_strides() || impl->layout() != c10::kStrided ||
        !impl->has_storage())
      return -1;
    int64_t dim = impl->dim();
    if (dim < 0 || dim > 64) return -1;
    m->rank = static_cast<int>(dim);
    if (dim <= TPU_TENSOR_META_RANK) {
      c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
      for (int64_t i = 0; i < dim; i++) {
        m->sizes[i] = sizes[i];
        m->strides[i] = strides[i];
      }
    }
    m->offset = impl->storage_offset();
    m->scalar_type = static_cast<int>(impl->dtype().toScalarType());
    m->device_type = static_cast<int>(impl->device_type());
    m->data = impl->storage().data();
    return 0;
  } catch (...) {
    return -1;
  }
}

namespace {

int tensor_meta(void* obj, tpu_tensor_meta* m) noexcept {
  return tpu_fill_meta(THPVariable_Unpack(static_cast<PyObject*>(obj)), m);
}

int scalar_type(void* dtype) noexcept { return static_cast<int>(reinterpret_cast<THPDtype*>(dtype)->scalar_type); }

const tpu_tensor_api table = {TPU_TENSOR_API_VERSION, tensor_meta, scalar_type};

} // namespace

// The capsule for the module's tensor_api attribute (a new reference).
PyObject* tpu_tensor_api_capsule() {
  return PyCapsule_New(const_cast<tpu_tensor_api*>(&table), TPU_TENSOR_API_NAME, nullptr);
}

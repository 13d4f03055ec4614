// meta.hpp: a tensor's metadata as tensor_api.h describes it, read from torch's
// C++ tensor (tensor_meta.cpp); boxed.cpp reads its arguments with it.
#pragma once

#include <ATen/core/Tensor.h>

#include "../python/tensor_api.h"

// 0, or -1 when the tensor must be read through Python (no strides or
// storage, symbolic sizes, a Python dispatch subclass). Never throws.
int tpu_fill_meta(const at::Tensor& t, tpu_tensor_meta* m) noexcept;

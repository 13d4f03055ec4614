// layout.hpp: the strides CPU torch gives an op's new results, for the tpu's
// (layout.cpp). The core computes every result in row-major order; where
// torch would lay a result out otherwise (a pointwise op of channels_last or
// transposed inputs, a convolution or pool of channels_last input, a cat of
// channels_last tensors), boxed.cpp copies it into a tensor of those strides
// (cat, a Python wrapper, does the same in _kernels.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

enum class TpuLayoutRule {
  None,      // row-major, as computed
  Pointwise, // TensorIterator's: ordered by the inputs' strides
  FollowNd,  // the input's (or for a convolution, the weight's) channels_last(_3d) format
  Follow4d,  // the same, channels_last only
};

// The rule of an op, from its name and tags (once, at registration).
TpuLayoutRule tpu_layout_rule(const c10::OperatorHandle& op);

// Strides for a new result of shape `sizes` of an op under rule, given its
// inputs: empty when the result stays row-major.
std::vector<int64_t> tpu_result_strides(TpuLayoutRule rule, c10::IntArrayRef sizes, c10::ArrayRef<c10::IValue> inputs);

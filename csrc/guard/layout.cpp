// layout.cpp: the strides CPU torch gives an op's new results (layout.hpp).
// Part of torchtpu._device_guard; nothing here throws for a well-formed
// tensor (the callers run inside boxed.cpp's kernel, whose errors are
// torch's).
#include "layout.hpp"

#include <c10/core/MemoryFormat.h>

#include <array>
#include <string>

namespace {

// Ops whose result takes the channels_last format of their input (or, for a
// convolution, of its weight) on the CPU, and whether channels_last_3d too
// (the CPU's 3-d convolution and average pools give row-major results);
// tests/test_memory_format.py holds each one against the CPU.
struct Follow {
  const char* name;
  bool nd5;
};
constexpr std::array<Follow, 23> kFollow = {{
    {"aten::convolution_overrideable", false},
    {"aten::max_pool2d_with_indices", false},
    {"aten::max_pool3d_with_indices", true},
    {"aten::avg_pool2d", false},
    {"aten::_adaptive_avg_pool2d", false},
    {"aten::adaptive_max_pool2d", false},
    {"aten::max_unpool2d", false},
    {"aten::native_batch_norm", true},
    {"aten::_native_batch_norm_legit", true},
    {"aten::_batch_norm_with_update", true},
    {"aten::native_group_norm", false},
    {"aten::native_dropout", true},
    {"aten::reflection_pad2d", false},
    {"aten::replication_pad2d", false},
    {"aten::upsample_nearest2d", false},
    {"aten::_upsample_nearest_exact2d", false},
    {"aten::upsample_bilinear2d", false},
    {"aten::_upsample_bilinear2d_aa", false},
    {"aten::upsample_bicubic2d", false},
    {"aten::upsample_nearest3d", true},
    {"aten::_upsample_nearest_exact3d", true},
    {"aten::upsample_trilinear3d", true},
    {"aten::reflection_pad3d", true},
}};

bool dense_tensor(const c10::IValue& v) { return v.isTensor() && v.toTensor().defined(); }

// Row-major strides in the order perm gives (perm[0] the fastest dim).
std::vector<int64_t> strides_in_order(c10::IntArrayRef shape, const std::vector<int64_t>& perm) {
  std::vector<int64_t> st(shape.size());
  int64_t acc = 1;
  for (int64_t d : perm) {
    st[static_cast<size_t>(d)] = acc;
    acc *= shape[static_cast<size_t>(d)];
  }
  return st;
}

// TensorIterator's output strides: all inputs row-major gives row-major; all
// channels_last or all dense with the same strides (and the result's shape)
// gives theirs; otherwise the dims are ordered by the inputs' strides, the
// first input that orders two dims deciding (a broadcast dim decides
// nothing; equal strides put the smaller dim first), by insertion sort.
std::vector<int64_t> pointwise(c10::IntArrayRef shape, c10::ArrayRef<c10::IValue> inputs) {
  size_t nd = shape.size();
  bool contiguous = true;
  for (const auto& v : inputs)
    if (dense_tensor(v)) contiguous = contiguous && v.toTensor().is_contiguous();
  if (contiguous || nd < 2) return {}; // the common case ends here
  bool channels_last = true, same = true, same_shape = true;
  const at::Tensor* first = nullptr;
  for (const auto& v : inputs) {
    if (!dense_tensor(v)) continue;
    const at::Tensor& t = v.toTensor();
    if (!first) first = &t;
    channels_last = channels_last && t.is_contiguous(at::MemoryFormat::ChannelsLast);
    same_shape = same_shape && t.sizes().equals(shape);
    same = same && t.is_non_overlapping_and_dense() && t.strides().equals(first->strides());
  }
  if (same_shape && channels_last && nd == 4) return c10::get_channels_last_strides_2d(shape);
  if (same_shape && same && first) return first->strides().vec();
  std::vector<std::vector<int64_t>> st;
  for (const auto& v : inputs) {
    if (!dense_tensor(v) || v.toTensor().dim() == 0) continue;
    const at::Tensor& t = v.toTensor();
    size_t off = nd - static_cast<size_t>(t.dim());
    std::vector<int64_t> s(nd, 0);
    for (size_t i = 0; i < static_cast<size_t>(t.dim()); i++)
      s[off + i] = t.size(static_cast<int64_t>(i)) == 1 && shape[off + i] != 1 ? 0 : t.stride(static_cast<int64_t>(i));
    st.push_back(std::move(s));
  }
  auto should_swap = [&](int64_t d0, int64_t d1) {
    for (const auto& s : st) {
      int64_t s0 = s[static_cast<size_t>(d0)], s1 = s[static_cast<size_t>(d1)];
      if (s0 == 0 || s1 == 0) continue;
      if (s0 < s1) return -1;
      if (s0 > s1) return 1;
      if (shape[static_cast<size_t>(d0)] > shape[static_cast<size_t>(d1)]) return 1;
    }
    return 0;
  };
  std::vector<int64_t> perm(nd);
  for (size_t i = 0; i < nd; i++) perm[i] = static_cast<int64_t>(nd - 1 - i);
  for (size_t i = 1; i < nd; i++) {
    size_t d1 = i;
    for (size_t k = i; k-- > 0;) {
      int c = should_swap(perm[k], perm[d1]);
      if (c > 0) {
        std::swap(perm[k], perm[d1]);
        d1 = k;
      } else if (c < 0) {
        break;
      }
    }
  }
  bool row_major = true;
  for (size_t i = 0; i < nd; i++) row_major = row_major && perm[i] == static_cast<int64_t>(nd - 1 - i);
  return row_major ? std::vector<int64_t>{} : strides_in_order(shape, perm);
}

std::vector<int64_t> channels_last(c10::IntArrayRef shape, c10::MemoryFormat f) {
  if (f == at::MemoryFormat::ChannelsLast && shape.size() == 4) return c10::get_channels_last_strides_2d(shape);
  if (f == at::MemoryFormat::ChannelsLast3d && shape.size() == 5) return c10::get_channels_last_strides_3d(shape);
  return {};
}

std::vector<int64_t> follow(c10::IntArrayRef shape, c10::ArrayRef<c10::IValue> inputs, bool nd5) {
  if (inputs.empty() || !dense_tensor(inputs[0])) return {};
  const at::Tensor& x = inputs[0].toTensor();
  if (x.dim() != static_cast<int64_t>(shape.size()) || x.dim() < 4 || (x.dim() == 5 && !nd5)) return {};
  auto f = x.suggest_memory_format();
  if (f == at::MemoryFormat::Contiguous && inputs.size() > 1 && dense_tensor(inputs[1]) &&
      inputs[1].toTensor().dim() == x.dim())
    f = inputs[1].toTensor().suggest_memory_format(); // a convolution's weight
  return channels_last(shape, f);
}

} // namespace

TpuLayoutRule tpu_layout_rule(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  for (const Follow& f : kFollow)
    if (name == f.name && (overload.empty() || overload == "no_stats"))
      return f.nd5 ? TpuLayoutRule::FollowNd : TpuLayoutRule::Follow4d;
  if (op.hasTag(at::Tag::pointwise)) return TpuLayoutRule::Pointwise;
  return TpuLayoutRule::None;
}

std::vector<int64_t> tpu_result_strides(TpuLayoutRule rule, c10::IntArrayRef sizes, c10::ArrayRef<c10::IValue> inputs) {
  if (c10::multiply_integers(sizes) <= 1) return {};
  switch (rule) {
    case TpuLayoutRule::Pointwise: return pointwise(sizes, inputs);
    case TpuLayoutRule::FollowNd: return follow(sizes, inputs, true);
    case TpuLayoutRule::Follow4d: return follow(sizes, inputs, false);
    case TpuLayoutRule::None: break;
  }
  return {};
}

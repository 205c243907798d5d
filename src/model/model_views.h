// Views and allocations shared by the model's training forward/backward (llama.cpp) and its
// incremental decoder (llama_decode.cpp).
#pragma once
#include "lowbit/core.h"

namespace lowbit::model_detail {

// An activation tensor (counted under MemCategory::kActivations).
inline Tensor act(Shape s, DType t, Device dev) {
  return Tensor::empty(s, t, dev, MemCategory::kActivations);
}

// Rows [r0, r0 + n) of a contiguous 2-D view.
inline TensorView rows(const TensorView& t, int64_t r0, int64_t n) {
  const int64_t cols = t.shape[1];
  auto* p = static_cast<char*>(t.data) + dtype_storage_bytes(t.dtype, r0 * cols);
  return TensorView(p, t.dtype, Shape{n, cols}, t.device);
}

// A [B, T, heads, Dh] view of columns [col0, col0 + heads·Dh) of a [B·T, W] activation.
inline TensorView heads_view(const Tensor& t, int B, int T, int64_t col0, int heads, int dh) {
  const int64_t W = t.shape()[1];
  auto* p = static_cast<char*>(t.data()) + dtype_storage_bytes(t.dtype(), col0);
  return TensorView(p, t.dtype(), Shape{B, T, heads, dh}, Shape{T * W, W, dh, 1}, t.device());
}

}  // namespace lowbit::model_detail

// Byte-for-byte comparison of tensors and quantized tensors (either side may live on a GPU), and
// the priming of delayed-scaling states, for the tests of the fused quantizing ops
// (tests/ops/test_fused_quantize.cpp, tests/gpu/test_ops_fused_quantize.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "lowbit/core.h"
#include "lowbit/quant.h"

namespace lowbit::test {

// "" when want and got hold the same bytes (and shape and dtype), else the first difference.
inline std::string diff_bytes(const std::string& what, const TensorView& want,
                              const TensorView& got) {
  if (want.shape != got.shape || want.dtype != got.dtype) {
    return what + ": " + want.str() + " vs " + got.str();
  }
  const Tensor a = Tensor::copy_of(want, Device::cpu());
  const Tensor b = Tensor::copy_of(got, Device::cpu());
  const uint8_t* pa = a.ptr<const uint8_t>();
  const uint8_t* pb = b.ptr<const uint8_t>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < a.nbytes(); ++i) {
    if (pa[i] != pb[i]) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  const int64_t last = want.shape.ndim > 0 ? want.shape[want.shape.ndim - 1] : 1;
  const int64_t row_bytes = std::max<int64_t>(dtype_storage_bytes(want.dtype, last), 1);
  return fmt::format(
      "{}: {} of {} bytes differ; first at byte {} (row {}, byte {} of the row): "
      "want 0x{:02X} got 0x{:02X}",
      what, bad, a.nbytes(), first, first / row_bytes, first % row_bytes, pa[first], pb[first]);
}

inline ::testing::AssertionResult same_bytes(const std::string& what, const TensorView& want,
                                             const TensorView& got) {
  const std::string d = diff_bytes(what, want, got);
  if (d.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << d;
}

// Every field of two quantized tensors: mode, dtype, shape, which tensors are defined, bytes.
inline ::testing::AssertionResult same_quantized(const QuantizedTensor& want,
                                                 const QuantizedTensor& got) {
  if (want.mode != got.mode || want.dtype != got.dtype || want.shape != got.shape ||
      want.columnwise_hadamard != got.columnwise_hadamard) {
    return ::testing::AssertionFailure() << "want " << want.str() << ", got " << got.str();
  }
  const std::pair<const char*, const Tensor*> fields[][2] = {
      {{"rowwise_data", &want.rowwise_data}, {"", &got.rowwise_data}},
      {{"rowwise_scale_inv", &want.rowwise_scale_inv}, {"", &got.rowwise_scale_inv}},
      {{"columnwise_data", &want.columnwise_data}, {"", &got.columnwise_data}},
      {{"columnwise_scale_inv", &want.columnwise_scale_inv}, {"", &got.columnwise_scale_inv}},
      {{"amax", &want.amax}, {"", &got.amax}},
      {{"columnwise_amax", &want.columnwise_amax}, {"", &got.columnwise_amax}}};
  for (const auto& f : fields) {
    const Tensor& a = *f[0].second;
    const Tensor& b = *f[1].second;
    if (a.defined() != b.defined()) {
      return ::testing::AssertionFailure()
             << f[0].first << ": defined in " << (a.defined() ? "want" : "got") << " only";
    }
    if (!a.defined()) continue;
    const std::string d = diff_bytes(f[0].first, a.view(), b.view());
    if (!d.empty()) return ::testing::AssertionFailure() << d;
  }
  return ::testing::AssertionSuccess();
}

// Gives the state a non-trivial scale in `slot`: one recorded amax and one update (which the
// GPU state computes bit-identically to the CPU state), then a fresh current history row.
inline void prime_state(DelayedScalingState& st, int slot, float amax) {
  Context ctx(st.scale().device());
  st.record_amax(slot, amax, st.scale().device().is_cuda() ? &ctx : nullptr);
  st.update(st.scale().device().is_cuda() ? &ctx : nullptr);
  ctx.synchronize();
}

}  // namespace lowbit::test

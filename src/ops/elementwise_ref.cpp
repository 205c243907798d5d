// CPU twin of the elementwise ops: add and convert.
#include <cstring>

#include "lowbit/formats.h"
#include "ops/elementwise_impl.h"

namespace lowbit::ops_detail {

void add_cpu(const TensorView& out, const TensorView& a, const TensorView& b) {
  const int64_t n = out.numel();
  if (out.dtype == DType::kF32) {
    const float* pa = a.ptr<const float>();  // [n]
    const float* pb = b.ptr<const float>();  // [n]
    float* po = out.ptr<float>();            // [n]
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
  } else {
    const uint16_t* pa = a.ptr<const uint16_t>();  // [n]
    const uint16_t* pb = b.ptr<const uint16_t>();  // [n]
    uint16_t* po = out.ptr<uint16_t>();            // [n]
    for (int64_t i = 0; i < n; ++i) po[i] = f32_to_bf16_rn(bf16_to_f32(pa[i]) + bf16_to_f32(pb[i]));
  }
}

void convert_cpu(const TensorView& dst, const TensorView& src) {
  const int64_t n = dst.numel();
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data) std::memmove(dst.data, src.data, size_t(dst.nbytes()));
  } else if (dst.dtype == DType::kBF16) {
    const float* s = src.ptr<const float>();  // [n]
    uint16_t* d = dst.ptr<uint16_t>();        // [n]
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16_rn(s[i]);
  } else {
    const uint16_t* s = src.ptr<const uint16_t>();  // [n]
    float* d = dst.ptr<float>();                    // [n]
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  }
}

}  // namespace lowbit::ops_detail

// CPU twin of dequantize(): x ≈ decode(q) · scale_inv per tensor / block (formats.md §2.0), with
// the NVFP4 factor RN(RN(sd · A) · RN(1/2688)) (§2.6).
#include "lowbit/formats.h"
#include "lowbit/quant/layout.h"
#include "lowbit/quant/scale_math.h"
#include "quant/quant_ref.h"

namespace lowbit {

Tensor dequantize_ref(const QuantizedTensor& q, Usage usage) {
  const bool row = usage == Usage::kRowwise;
  const Tensor& data = row ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale = row ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  const int64_t r_count = data.shape()[0], c_count = data.shape()[1];          // stored orientation
  Tensor out = Tensor::empty({r_count, c_count}, DType::kF32, Device::cpu());  // f32
  const uint8_t* codes = data.ptr<const uint8_t>();
  float* o = out.ptr<float>();
  const DType t = q.dtype;
  for (int64_t r = 0; r < r_count; ++r) {
    for (int64_t c = 0; c < c_count; ++c) {
      const int64_t idx = r * c_count + c;
      const float v = decode(t, get_code(codes, t, idx));
      float f = 1.0f;  // dequantization factor of the element's block
      switch (q.mode) {
        case ScalingMode::kPerTensor: f = scale.ptr<const float>()[0]; break;
        case ScalingMode::kBlock1x128:
          // Rows of the stored copy are the VEC128 rows: [ceil(C/128), pad4(R)].
          f = scale.ptr<const float>()[vec128_scale_index(r, c / 128, r_count)];
          break;
        case ScalingMode::kBlock128x128:
          f = scale
                  .ptr<const float>()[blk128_scale_index(r / 128, c / 128, ceil_div(c_count, 128))];
          break;
        case ScalingMode::kMX1x32:  // [rows, cols / 32] of the stored copy (columnwise: [K, M/32])
          f = decode_e8m0(scale.ptr<const uint8_t>()[r * (c_count / 32) + c / 32]);
          break;
        case ScalingMode::kNVFP4_1x16:
        case ScalingMode::kNVFP4_16x16: {
          const float amax = (row ? q.amax : q.columnwise_amax).ptr<const float>()[0];
          f = nvfp4_dequant_factor(scale.ptr<const uint8_t>()[r * (c_count / 16) + c / 16], amax);
          break;
        }
      }
      o[idx] = mul_rn(v, f);
    }
  }
  return out;
}

}  // namespace lowbit

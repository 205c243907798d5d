// Saturation and underflow of one element of a quantized copy (shared by the CPU twin and the
// CUDA kernel of quant_clip_stats()). See include/lowbit/quant.h for the definitions.
#pragma once
#include <cmath>
#include <cstdint>

#include "lowbit/core/hd.h"
#include "lowbit/formats.h"
#include "lowbit/quant.h"
#include "lowbit/quant/layout.h"
#include "lowbit/quant/scale_math.h"

namespace lowbit {

// What the kernel and the twin need of a rowwise copy [M, K] (row-major codes; E2M1 packed two
// per byte, low nibble first).
struct ClipStatsView {
  ScalingMode mode;
  DType dtype;
  int64_t m, k;
  const uint8_t* codes;
  const void* scale;  // the copy's scale_inv tensor (f32 or one byte per block)
  const float* amax;  // NVFP4: the rowwise global amax [1]
};

// Largest finite code magnitude of an element type (sign bit clear).
LOWBIT_HD uint32_t max_code_magnitude(DType t) {
  switch (t) {
    case DType::kE4M3: return 0x7E;  // 448
    case DType::kE5M2: return 0x7B;  // 57344
    case DType::kE3M2: return 0x1F;  // 28
    case DType::kE2M3: return 0x1F;  // 7.5
    default: return 0x7;             // E2M1: 6
  }
}

// The magnitude beyond which round-to-nearest without saturation would leave the largest
// finite value (max + half its spacing): a source beyond it was clipped.
LOWBIT_HD float clip_threshold(DType t) {
  switch (t) {
    case DType::kE4M3: return 464.0f;    // 448 + 32/2
    case DType::kE5M2: return 61440.0f;  // 57344 + 8192/2
    case DType::kE3M2: return 30.0f;     // 28 + 4/2
    case DType::kE2M3: return 7.75f;     // 7.5 + 0.5/2
    default: return 7.0f;                // E2M1: 6 + 2/2
  }
}

LOWBIT_HD uint32_t sign_bit(DType t) {
  switch (t) {
    case DType::kE4M3:
    case DType::kE5M2: return 0x80;
    case DType::kE3M2:
    case DType::kE2M3: return 0x20;
    default: return 0x8;
  }
}

LOWBIT_HD uint32_t clip_stats_code(const ClipStatsView& v, int64_t idx) {
  if (v.dtype == DType::kE2M1) return (v.codes[idx >> 1] >> ((idx & 1) * 4)) & 0xFu;
  return v.codes[idx];
}

// The dequantization factor (scale_inv) of element (r, c), as dequantize() applies it.
LOWBIT_HD float clip_stats_factor(const ClipStatsView& v, int64_t r, int64_t c) {
  switch (v.mode) {
    case ScalingMode::kPerTensor: return static_cast<const float*>(v.scale)[0];
    case ScalingMode::kBlock1x128:  // VEC128 [ceil(K/128), pad4(M)]
      return static_cast<const float*>(v.scale)[vec128_scale_index(r, c / 128, v.m)];
    case ScalingMode::kBlock128x128:
      return static_cast<const float*>(
          v.scale)[blk128_scale_index(r / 128, c / 128, (v.k + 127) / 128)];
    case ScalingMode::kMX1x32:  // [M, K/32] E8M0
      return decode_e8m0(static_cast<const uint8_t*>(v.scale)[r * (v.k / 32) + c / 32]);
    case ScalingMode::kNVFP4_1x16:
    case ScalingMode::kNVFP4_16x16:  // [M, K/16] UE4M3 and the global amax
      return nvfp4_dequant_factor(static_cast<const uint8_t*>(v.scale)[r * (v.k / 16) + c / 16],
                                  v.amax[0]);
  }
  return 1.0f;
}

// Adds element (r, c) with source value x to {saturated, underflow}. A source element that is
// not finite is neither. Saturated: the code is the format's largest finite magnitude and |x|
// exceeds clip_threshold() in source units (the element was clipped, not merely rounded to the
// max). Underflow: x ≠ 0 quantized to ±0.
LOWBIT_HD void clip_stats_classify(const ClipStatsView& v, int64_t r, int64_t c, float x,
                                   uint32_t& saturated, uint32_t& underflow) {
  if (!(std::fabs(x) <= 3.4028235e38f)) return;  // inf or NaN
  const uint32_t mag = clip_stats_code(v, r * v.k + c) & ~sign_bit(v.dtype);
  if (mag == 0) {
    underflow += x != 0.0f ? 1u : 0u;
  } else if (mag == max_code_magnitude(v.dtype)) {
    const float limit = mul_rn(clip_threshold(v.dtype), clip_stats_factor(v, r, c));
    saturated += std::fabs(x) > limit ? 1u : 0u;
  }
}

}  // namespace lowbit

// Input sweeps for codec tests, shared by the CPU tests and the GPU hardware-conversion tests
// so both check exactly the same values.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "lowbit/formats.h"

namespace lowbit::test {

// Every bf16 bit pattern, widened to fp32 (exact): 65536 values incl. ±inf, NaNs, subnormals.
inline std::vector<float> all_bf16_as_f32() {
  std::vector<float> v(65536);
  for (uint32_t b = 0; b < 65536; ++b) v[b] = bf16_to_f32(static_cast<uint16_t>(b));
  return v;
}

// Non-negative finite values of a minifloat type, ascending, with their codes.
struct CodePoint {
  double value;
  uint32_t code;
};
inline std::vector<CodePoint> finite_magnitudes(DType t) {
  const MiniFloatSpec s = minifloat_spec(t);
  std::vector<CodePoint> out;
  for (uint32_t c = 0; c <= s.max_code; ++c) out.push_back({decode(t, c), c});
  return out;
}

inline float step_ulps(float x, int k) {
  float y = x;
  for (int i = 0; i < (k < 0 ? -k : k); ++i) y = std::nextafter(y, k < 0 ? -INFINITY : INFINITY);
  return y;
}

// Dense fp32 sweep around every rounding boundary of a minifloat type: each representable
// magnitude and each midpoint between neighbours (including the midpoint between max and the
// next value the format would have, i.e. the overflow threshold), ±4 fp32 ulps around each, both
// signs; plus ±0, ±inf, NaNs, fp32 subnormals and huge values.
inline std::vector<float> boundary_sweep(DType t) {
  const std::vector<CodePoint> mags = finite_magnitudes(t);
  const MiniFloatSpec s = minifloat_spec(t);
  std::vector<double> anchors;
  for (size_t i = 0; i < mags.size(); ++i) {
    anchors.push_back(mags[i].value);
    if (i + 1 < mags.size()) anchors.push_back(0.5 * (mags[i].value + mags[i + 1].value));
  }
  // The value after max in max's binade, and the overflow tie point halfway to it.
  const double max_v = mags.back().value;
  const double ulp_at_max = std::ldexp(1.0, std::ilogb(max_v) - s.mbits);
  anchors.push_back(max_v + ulp_at_max);
  anchors.push_back(max_v + 0.5 * ulp_at_max);
  // Half of the smallest subnormal (ties to zero) and a quarter of it.
  anchors.push_back(0.5 * mags[1].value);
  anchors.push_back(0.25 * mags[1].value);
  std::vector<float> out;
  for (double a : anchors) {
    const float f = static_cast<float>(a);  // all anchors are exact in fp32
    for (int k = -4; k <= 4; ++k) {
      const float y = step_ulps(f, k);
      out.push_back(y);
      out.push_back(-y);
    }
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            INFINITY,
                            -INFINITY,
                            f32_from_bits(0x7FC00000u),
                            f32_from_bits(0xFFC00000u),
                            f32_from_bits(0x7F800001u),
                            f32_from_bits(0x00000001u),
                            f32_from_bits(0x807FFFFFu),
                            f32_from_bits(0x00800000u),
                            1e30f,
                            -1e30f,
                            3.4028235e38f,
                            -3.4028235e38f,
                            65504.0f,
                            65520.0f,
                            1e-30f};
  for (float f : specials) out.push_back(f);
  return out;
}

}  // namespace lowbit::test

// The format facts the emulated MX / NVFP4 GEMM on Hopper (kEmulatedBf16) rests on: dequantizing
// to bf16 loses nothing, proved exhaustively over every pair of codes. (That the GEMM's kernels
// produce exactly these values is checked on the GPU: tests/gpu/test_gemm_gpu.cpp,
// DequantToBf16MatchesHostDecodeBitForBit, DequantBPermutedMatchesHostDecodeBitForBit and
// FusedDequantGemmConvertsCodesExactly.)
//  * MX (and power-of-two FP8 block scales): element · 2^k is exact in bf16 for every element code
//    and every k whose product lies in bf16's normal range (a power of two only shifts the
//    exponent; every element format has at most 4 significant bits, bf16 has 8).
//  * NVFP4: E2M1 · UE4M3 is exact in bf16 for every pair of codes (2 + 4 significant bits, range
//    2^-10 … 2688). The global factor amax/2688 is generally not a short binary fraction, so it
//    is kept out of the bf16 operands and applied in f32 (alpha).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "lowbit/formats.h"

namespace lowbit {
namespace {

bool bf16_exact(double v) {
  const float f = static_cast<float>(v);
  if (static_cast<double>(f) != v) return false;
  return static_cast<double>(bf16_to_f32(f32_to_bf16_rn(f))) == v;
}

// bf16's normal range: [2^-126, (2 - 2^-7) · 2^127].
bool in_bf16_normal_range(double v) {
  const double a = std::fabs(v);
  return a >= std::ldexp(1.0, -126) && a <= std::ldexp(2.0 - std::ldexp(1.0, -7), 127);
}

// Number of codes of an element type: FP4 4 bits, FP6 6 bits (in a byte), FP8 8 bits.
int codes_of(DType t) {
  if (t == DType::kE2M1) return 16;
  if (t == DType::kE3M2 || t == DType::kE2M3) return 64;
  return 256;
}

TEST(GemmExact, ElementTimesPowerOfTwoIsExactInBf16) {
  // Every MX element type, E4M3 first (MXFP8 and FP8 block with pow2 scales).
  for (DType t : {DType::kE4M3, DType::kE5M2, DType::kE3M2, DType::kE2M3, DType::kE2M1}) {
    int64_t checked = 0;
    for (int code = 0; code < codes_of(t); ++code) {
      const double v = decode(t, static_cast<uint32_t>(code));
      if (!std::isfinite(v) || v == 0) continue;
      // E8M0 scales are 2^-127 … 2^127; fp32 power-of-two scales lie inside that range too.
      for (int k = -127; k <= 127; ++k) {
        const double p = std::ldexp(v, k);
        if (!in_bf16_normal_range(p)) continue;
        ASSERT_TRUE(bf16_exact(p)) << dtype_name(t) << " code " << code << " (" << v << ") * 2^"
                                   << k << " = " << p << " is not exact in bf16";
        ++checked;
      }
    }
    EXPECT_GT(checked, 1000) << dtype_name(t);
  }
}

TEST(GemmExact, E2M1TimesUe4m3IsExactInBf16) {
  int64_t checked = 0;
  for (uint32_t e = 0; e < 16; ++e) {
    const double v = decode(DType::kE2M1, e);
    for (uint32_t s = 0; s < 128; ++s) {
      const double sd = decode(DType::kUE4M3, s);
      if (!std::isfinite(sd)) continue;  // 0x7F is NaN
      const double p = v * sd;
      ASSERT_TRUE(p == 0 || in_bf16_normal_range(p)) << p;
      ASSERT_TRUE(bf16_exact(p)) << "e2m1 " << v << " * ue4m3 " << sd << " = " << p;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16 * 127);
}

TEST(GemmExact, Nvfp4GlobalFactorIsNotExactInBf16) {
  // The NVFP4 global factor amax / 2688 (here amax = 10): folding it into the bf16 operands
  // would round, which is why the emulated GEMM applies it in f32.
  const double g = 10.0 / 2688.0;
  int64_t inexact = 0;
  for (uint32_t e = 1; e < 8; ++e) {
    for (uint32_t s = 1; s < 127; ++s) {
      const double p = static_cast<double>(
          static_cast<float>(decode(DType::kE2M1, e) * decode(DType::kUE4M3, s) * g));
      if (!bf16_exact(p)) ++inexact;
    }
  }
  EXPECT_GT(inexact, 0);
}

}  // namespace
}  // namespace lowbit

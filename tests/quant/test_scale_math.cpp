// Per-block scale math (quant/scale_math.h) against hand-computed values of formats.md §2.
#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <limits>

#include "lowbit/formats.h"
#include "lowbit/quant/scale_math.h"

namespace lowbit {
namespace {

constexpr float kFltMax = std::numeric_limits<float>::max();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(QuantScaleMath, AmaxSkipsNanKeepsInf) {
  float a = 0.0f;
  a = amax_combine(a, -3.0f);
  a = amax_combine(a, kNaN);
  EXPECT_EQ(a, 3.0f);
  a = amax_combine(a, -kInf);
  EXPECT_EQ(a, kInf);
  EXPECT_EQ(amax_combine(0.0f, -0.0f), 0.0f);
}

TEST(QuantScaleMath, ComputeScaleFromAmax) {
  // §2.0: amax ∈ {0, inf, NaN} → 1.
  EXPECT_EQ(compute_scale_from_amax(0.0f, 448, false, 0, kFltMax), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(kInf, 448, false, 0, kFltMax), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(kNaN, 448, false, 0, kFltMax), 1.0f);
  // s = RN(fmax / amax).
  EXPECT_EQ(compute_scale_from_amax(1.0f, 448, false, 0, kFltMax), 448.0f);
  EXPECT_EQ(compute_scale_from_amax(3.0f, 448, false, 0, kFltMax), 448.0f / 3.0f);
  EXPECT_EQ(f32_bits(compute_scale_from_amax(3.0f, 448, false, 0, kFltMax)), 0x43155555u);
  EXPECT_EQ(compute_scale_from_amax(1.0f, 57344, false, 0, kFltMax), 57344.0f);
  // pow2 masks the mantissa: 149.33 → 128, 448 → 256, 1 stays 1.
  EXPECT_EQ(compute_scale_from_amax(3.0f, 448, true, 0, kFltMax), 128.0f);
  EXPECT_EQ(compute_scale_from_amax(1.0f, 448, true, 0, kFltMax), 256.0f);
  EXPECT_EQ(compute_scale_from_amax(448.0f, 448, true, 0, kFltMax), 1.0f);
  // epsilon: an amax below eps (0 included) is raised to eps before the zero test.
  EXPECT_EQ(compute_scale_from_amax(0.0f, 448, false, 0.5f, kFltMax), 896.0f);
  EXPECT_EQ(compute_scale_from_amax(0.25f, 448, false, 0.5f, kFltMax), 896.0f);
  EXPECT_EQ(compute_scale_from_amax(kNaN, 448, false, 0.5f, kFltMax), 1.0f);
  // Overflow: a tiny amax gives +inf → value_for_inf (FLT_MAX or the input dtype's max).
  const float tiny = pow2f(-130);  // fp32 subnormal
  EXPECT_EQ(compute_scale_from_amax(tiny, 448, false, 0, kFltMax), kFltMax);
  const float bf16_max = f32_from_bits(0x7F7F0000u);
  EXPECT_EQ(compute_scale_from_amax(tiny, 448, false, 0, bf16_max), bf16_max);
  EXPECT_EQ(compute_scale_from_amax(tiny, 448, true, 0, bf16_max), pow2f(127));
  EXPECT_EQ(scale_inv_from_scale(pow2f(127)), pow2f(-127));  // an fp32 subnormal, exact
  EXPECT_EQ(scale_inv_from_scale(448.0f / 3.0f), 1.0f / (448.0f / 3.0f));
}

TEST(QuantScaleMath, DelayedScaleFormula) {
  EXPECT_EQ(delayed_scaled_max(448, 0), 448.0f);
  EXPECT_EQ(delayed_scaled_max(448, 2), 112.0f);
  EXPECT_EQ(delayed_scale_from_amax(2.0f, 448, 7.0f), 224.0f);
  EXPECT_EQ(delayed_scale_from_amax(0.0f, 448, 7.0f), 7.0f);       // keep previous
  EXPECT_EQ(delayed_scale_from_amax(kInf, 448, 7.0f), 7.0f);       // keep previous
  EXPECT_EQ(delayed_scale_from_amax(kNaN, 448, 7.0f), 7.0f);       // keep previous
  EXPECT_EQ(delayed_scale_from_amax(1e-38f, 448, 7.0f), kFltMax);  // overflow → FLT_MAX
}

TEST(QuantScaleMath, MxMultiplier) {
  EXPECT_EQ(mx_multiplier(127), 1.0f);
  EXPECT_EQ(mx_multiplier(0), pow2f(127));
  EXPECT_EQ(mx_multiplier(253), pow2f(-126));
  EXPECT_EQ(f32_bits(mx_multiplier(254)), 0x00400000u);  // 2^-127, an fp32 subnormal
  EXPECT_TRUE(std::isnan(mx_multiplier(255)));
  for (int e = 0; e < 255; ++e) {
    EXPECT_EQ(mx_multiplier(static_cast<uint8_t>(e)), pow2f(127 - e)) << e;
    EXPECT_EQ(mx_multiplier(static_cast<uint8_t>(e)) * decode_e8m0(static_cast<uint8_t>(e)), 1.0f);
  }
}

TEST(QuantScaleMath, MxScaleCeilAndFloorSpecialCases) {
  // Zero block → 0x00 under both rules; inf → 0xFE (ceil) / NaN (floor); NaN → 0xFF.
  EXPECT_EQ(mx_scale(0.0f, DType::kE4M3, MxScaleRounding::kCeil), 0x00);
  EXPECT_EQ(mx_scale(0.0f, DType::kE4M3, MxScaleRounding::kFloor), 0x00);
  EXPECT_EQ(mx_scale(kInf, DType::kE4M3, MxScaleRounding::kCeil), 0xFE);
  EXPECT_EQ(mx_scale(kInf, DType::kE4M3, MxScaleRounding::kFloor), 0xFF);
  EXPECT_EQ(mx_scale(kNaN, DType::kE4M3, MxScaleRounding::kCeil), 0xFF);
  // amax = fmax → 2^0; just above → 2^1 (ceil); 1 → ceil(log2(1/448)) = -8.
  EXPECT_EQ(mx_scale(448.0f, DType::kE4M3, MxScaleRounding::kCeil), 127);
  EXPECT_EQ(mx_scale(449.0f, DType::kE4M3, MxScaleRounding::kCeil), 128);
  EXPECT_EQ(mx_scale(1.0f, DType::kE4M3, MxScaleRounding::kCeil), 127 - 8);
  EXPECT_EQ(mx_scale(57344.0f, DType::kE5M2, MxScaleRounding::kCeil), 127);
  // §2.5: the rules differ when the amax significand exceeds the element's max significand
  // (1.75 for E4M3): 15 = 1.875 · 2^3. Ceil: 2^ceil(log2(15/448)) = 2^-4; floor: 2^(3-8) = 2^-5.
  EXPECT_EQ(mx_scale(15.0f, DType::kE4M3, MxScaleRounding::kCeil), 127 - 4);
  EXPECT_EQ(mx_scale(15.0f, DType::kE4M3, MxScaleRounding::kFloor), 127 - 5);
  // ... and agree below it: 12 = 1.5 · 2^3 → 2^-5 both.
  EXPECT_EQ(mx_scale(12.0f, DType::kE4M3, MxScaleRounding::kCeil), 127 - 5);
  EXPECT_EQ(mx_scale(12.0f, DType::kE4M3, MxScaleRounding::kFloor), 127 - 5);
  // Floor clamps the shared exponent at -127: amax 2^-125 with E5M2 (emax 15) → -140 → -127.
  EXPECT_EQ(mx_scale(pow2f(-125), DType::kE5M2, MxScaleRounding::kFloor), 0x00);
  // Element emax of each MX type.
  EXPECT_EQ(mx_element_emax(DType::kE4M3), 8);
  EXPECT_EQ(mx_element_emax(DType::kE5M2), 15);
  EXPECT_EQ(mx_element_emax(DType::kE3M2), 4);
  EXPECT_EQ(mx_element_emax(DType::kE2M3), 2);
  EXPECT_EQ(mx_element_emax(DType::kE2M1), 2);
}

// Exact ceil(log2(amax / fmax)) clamped to [-127, 127], in double (exact for these operands).
int exact_ceil_exponent(float amax, float fmax) {
  int k = -200;
  while (static_cast<double>(amax) > std::ldexp(static_cast<double>(fmax), k)) ++k;
  return std::max(-127, std::min(127, k));
}

TEST(QuantScaleMath, MxCeilShortcutIsExactOverAllBf16) {
  // TE computes the ceil scale as ceil_e8m0(RN(amax · RN(1/fmax))); formats.md §2.5 states this
  // equals ceil(log2(amax/fmax)) for every positive finite bf16 amax (E4M3, E5M2). The same
  // holds for the FP6/FP4 maxima (28, 7.5, 6), and no element ever clips.
  const DType types[] = {DType::kE4M3, DType::kE5M2, DType::kE3M2, DType::kE2M3, DType::kE2M1};
  for (DType t : types) {
    const float fmax = dtype_max_finite(t);
    int mismatches = 0;
    for (uint32_t b = 1; b < 0x7F80u; ++b) {
      const float amax = bf16_to_f32(static_cast<uint16_t>(b));
      const int k = static_cast<int>(mx_scale_ceil(amax, fmax)) - 127;
      if (k != exact_ceil_exponent(amax, fmax)) ++mismatches;
      // No clipping: amax · 2^-k ≤ fmax (exact in double).
      ASSERT_LE(std::ldexp(static_cast<double>(amax), -k), fmax) << dtype_name(t) << " " << amax;
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(t);
  }
}

TEST(QuantScaleMath, Nvfp4GlobalScale) {
  // A = 2688 = 448 · 6: S_enc = 1, S_dec = 1, k = RN(1/6).
  Nvfp4GlobalScale g = nvfp4_global_scale(2688.0f);
  EXPECT_EQ(g.s_enc, 1.0f);
  EXPECT_EQ(g.s_dec, 1.0f);
  EXPECT_EQ(f32_bits(g.k), 0x3E2AAAABu);  // RN(1/6) = 0.16666667163372040
  // A = 10 (hand-computed in the order of §2.6, one fp32 rounding per step):
  //   S_enc = RN(2688/10) = 268.8 (0x43866666), S_dec = RN(1/S_enc) (0x3B73CF3E),
  //   k = RN(S_enc · RN(1/6)) = 44.8 (0x42333333).
  g = nvfp4_global_scale(10.0f);
  EXPECT_EQ(f32_bits(g.s_enc), 0x43866666u);
  EXPECT_EQ(f32_bits(g.s_dec), 0x3B73CF3Eu);
  EXPECT_EQ(f32_bits(g.k), 0x42333333u);
  // A = 0 and A = inf → S_enc = 1; NaN → FLT_MAX (fminf drops the NaN).
  EXPECT_EQ(nvfp4_global_scale(0.0f).s_enc, 1.0f);
  EXPECT_EQ(nvfp4_global_scale(kInf).s_enc, 1.0f);
  EXPECT_EQ(nvfp4_global_scale(kNaN).s_enc, kFltMax);
  // A tiny amax overflows 2688/A → FLT_MAX.
  EXPECT_EQ(nvfp4_global_scale(pow2f(-140)).s_enc, kFltMax);
}

TEST(QuantScaleMath, Nvfp4BlockScaleWorkedExample) {
  // A = 10, blocks with amax 10, 2 and 0.75 (formats.md §2.6 order):
  const Nvfp4GlobalScale g = nvfp4_global_scale(10.0f);
  // b = 10: RN(10 · 44.8) = 448 → sd = 0x7E (448); m = RN(1/RN(448 · S_dec)) = 0x3F199999.
  EXPECT_EQ(nvfp4_block_scale(10.0f, g.k), 0x7E);
  EXPECT_EQ(f32_bits(nvfp4_block_multiplier(0x7E, g.s_dec)), 0x3F199999u);
  EXPECT_EQ(f32_bits(nvfp4_dequant_factor(0x7E, 10.0f)), 0x3FD55556u);
  // b = 2: RN(2 · 44.8) = 89.6 → e4m3 88 (0x6B); m = 0x40437DAB.
  EXPECT_EQ(nvfp4_block_scale(2.0f, g.k), 0x6B);
  EXPECT_EQ(f32_bits(nvfp4_block_multiplier(0x6B, g.s_dec)), 0x40437DABu);
  EXPECT_EQ(f32_bits(nvfp4_dequant_factor(0x6B, 10.0f)), 0x3EA79E7Au);
  // b = 0.75: 33.6 → 32 (0x60); m = 8.4 (0x41066666).
  EXPECT_EQ(nvfp4_block_scale(0.75f, g.k), 0x60);
  EXPECT_EQ(f32_bits(nvfp4_block_multiplier(0x60, g.s_dec)), 0x41066666u);
  // sd = 0 → multiplier +inf clamped to FLT_MAX; dequant factor 0.
  EXPECT_EQ(nvfp4_block_multiplier(0x00, g.s_dec), kFltMax);
  EXPECT_EQ(nvfp4_dequant_factor(0x00, 10.0f), 0.0f);
  // Block scales saturate at 448: RN(inf · k) → FLT_MAX → 448.
  EXPECT_EQ(nvfp4_block_scale(kInf, g.k), 0x7E);
}

TEST(QuantScaleMath, QuantizeElementRoundsOnceThenCasts) {
  // q = cvt_sat(RN(x · scale)): 464 is the E4M3 tie at the top → 448; 465 overflows → 448.
  EXPECT_EQ(quantize_element(DType::kE4M3, 464.0f, 1.0f, false, 0), 0x7Eu);
  EXPECT_EQ(quantize_element(DType::kE4M3, -465.0f, 1.0f, false, 0), 0xFEu);
  EXPECT_EQ(quantize_element(DType::kE4M3, kNaN, 1.0f, false, 0), 0x7Fu);
  EXPECT_EQ(quantize_element(DType::kE5M2, 61440.0f, 1.0f, false, 0), 0x7Bu);
  EXPECT_EQ(quantize_element(DType::kE2M1, 7.0f, 1.0f, false, 0), 0x7u);
  // The product is rounded to fp32 first, then cast: x · m below is 1.18749994785… exactly, just
  // under the E4M3 midpoint 1.1875 between 1.125 and 1.25, so one rounding of the exact product
  // gives 1.125; RN(x · m) in fp32 is 1.1875 itself, whose tie goes to the even code, 1.25.
  const float x = std::bit_cast<float>(0x3F97FFFCu), m = std::bit_cast<float>(0x3F800003u);
  ASSERT_LT(double(x) * double(m), 1.1875);  // exact in double (24 × 24 bits)
  ASSERT_EQ(x * m, 1.1875f);
  EXPECT_EQ(quantize_element(DType::kE4M3, x, m, false, 0), encode_rn(DType::kE4M3, 1.25f));
  EXPECT_NE(encode_rn(DType::kE4M3, 1.25f), encode_rn(DType::kE4M3, 1.125f));
}

}  // namespace
}  // namespace lowbit

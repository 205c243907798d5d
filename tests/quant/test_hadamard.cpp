// 16-point random Hadamard transform (quant/hadamard16.h, formats.md §5.2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "lowbit/formats.h"
#include "lowbit/quant/hadamard16.h"
#include "lowbit/quant/scale_math.h"

namespace lowbit {
namespace {

uint16_t bf(float x) { return f32_to_bf16_rn(x); }

// An exact double rounded once to bf16 (round to nearest even), normal range.
uint16_t bf16_from_double(double d) {
  if (d == 0) return 0;
  const int lsb = std::max(std::ilogb(d) - 7, -133);
  const double q = std::nearbyint(std::ldexp(d, -lsb));           // ties to even
  return f32_to_bf16_rn(static_cast<float>(std::ldexp(q, lsb)));  // ≤ 9 bits: exact
}

TEST(QuantHadamard, OrthonormalAndSigned) {
  // H · H^T = I, entries ±0.25.
  for (int a = 0; a < 16; ++a) {
    for (int b = 0; b < 16; ++b) {
      double dot = 0;
      for (int j = 0; j < 16; ++j) dot += double(rht16_entry(a, j)) * rht16_entry(b, j);
      EXPECT_EQ(dot, a == b ? 1.0 : 0.0) << a << "," << b;
    }
  }
  // s = [+1,+1,+1,-1,+1,-1,-1,-1,-1,-1,-1,+1,-1,+1,-1,-1] multiplies the rows of H16; H16's
  // first column is all ones, so column 0 of H is s / 4.
  const int s[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(rht16_entry(i, 0), 0.25f * s[i]) << i;
  // H16[1][1] = -1 (popcount(1 & 1) odd), row 1 has s = +1.
  EXPECT_EQ(rht16_entry(1, 1), -0.25f);
  EXPECT_EQ(rht16_entry(3, 3), -0.25f);  // H16[3][3] = +1 (popcount 2), s_3 = -1
}

TEST(QuantHadamard, KnownVectors) {
  uint16_t x[16] = {}, y[16];
  // e_0 → row 0 of H: all +0.25 (s_0 = +1, H16 row 0 all ones).
  x[0] = bf(1.0f);
  rht16_apply(x, y);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(y[j], bf(0.25f)) << j;
  // All ones → y_j = Σ_i H[i][j]; y_0 = Σ s_i / 4 = (6 - 10) / 4 = -1.
  for (auto& v : x) v = bf(1.0f);
  rht16_apply(x, y);
  EXPECT_EQ(bf16_to_f32(y[0]), -1.0f);
  for (int j = 0; j < 16; ++j) {
    float ref = 0;
    for (int i = 0; i < 16; ++i) ref += rht16_entry(i, j);
    EXPECT_EQ(bf16_to_f32(y[j]), ref) << j;
  }
  // e_3 → row 3 of H: s_3 = -1, so every entry of the row has the opposite sign of H16[3][j].
  for (auto& v : x) v = 0;
  x[3] = bf(-8.0f);
  rht16_apply(x, y);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(bf16_to_f32(y[j]), -8.0f * rht16_entry(3, j)) << j;
}

TEST(QuantHadamard, ExactReferenceRoundsTheExactSumOnce) {
  // y_0 = (4 + 2^-6 + 2^-68) / 4 = 1 + 2^-8 + 2^-70 (signs s_0..s_2 = +1). The exact value lies
  // just above the bf16 tie 1 + 2^-8 and rounds up to 1 + 2^-7 (0x3F81); summing in double
  // gives exactly the tie and then rounds to even, 1.0 (0x3F80).
  uint16_t x[16] = {}, y[16];
  x[0] = bf(4.0f);
  x[1] = bf(std::ldexp(1.0f, -6));
  x[2] = bf(std::ldexp(1.0f, -68));
  rht16_apply_exact(x, y);
  EXPECT_EQ(y[0], 0x3F81);
  const double dsum = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -70);
  EXPECT_EQ(f32_to_bf16_rn(static_cast<float>(dsum)), 0x3F80);  // the double-rounding result
  // Cancellation: 2^100 - 2^100 + tiny leaves the tiny term exactly.
  uint16_t z[16] = {};
  z[0] = bf(std::ldexp(1.0f, 100));  // s_0 = +1
  z[3] = bf(std::ldexp(1.0f, 100));  // s_3 = -1 → cancels in column 0
  z[1] = bf(std::ldexp(1.0f, -120));
  rht16_apply_exact(z, y);
  EXPECT_EQ(bf16_to_f32(y[0]), std::ldexp(1.0f, -122));
}

TEST(QuantHadamard, FastTransformLosesTermsBelowFp32Precision) {
  // The same chunk through the fp32 butterfly: 2^-68 / 4 is lost against 1 in fp32, the partial
  // sum lands on the bf16 tie 1 + 2^-8 and rounds to even — one bf16 ulp below the exact result.
  uint16_t x[16] = {}, y[16];
  x[0] = bf(4.0f);
  x[1] = bf(std::ldexp(1.0f, -6));
  x[2] = bf(std::ldexp(1.0f, -68));
  rht16_apply(x, y);
  EXPECT_EQ(y[0], 0x3F80);
}

TEST(QuantHadamard, SubnormalsSpecialsAndOverflow) {
  uint16_t x[16] = {}, y[16];
  // 4 · (smallest bf16 subnormal) / 4 = smallest subnormal; the smallest subnormal / 4 → +0.
  x[0] = 0x0004;
  rht16_apply(x, y);
  EXPECT_EQ(y[0], 0x0001);
  x[0] = 0x0001;
  rht16_apply(x, y);
  EXPECT_EQ(y[0], 0x0000);
  // Zero input → +0 everywhere, also for -0 inputs.
  for (auto& v : x) v = 0x8000;
  rht16_apply(x, y);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(y[j], 0x0000);
  // NaN anywhere → NaN everywhere.
  for (auto& v : x) v = 0;
  x[5] = 0x7FC0;
  rht16_apply(x, y);
  for (int j = 0; j < 16; ++j) EXPECT_TRUE(std::isnan(bf16_to_f32(y[j])));
  // +inf at index 0 → +inf in every column (s_0 = +1, H16 row 0 all +1).
  x[5] = 0;
  x[0] = 0x7F80;
  rht16_apply(x, y);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(y[j], 0x7F80);
  // +inf at 0 and +inf at 3: column 0 sees +inf and -inf → NaN.
  x[3] = 0x7F80;
  rht16_apply(x, y);
  EXPECT_TRUE(std::isnan(bf16_to_f32(y[0])));
  // Finite overflow: indices 0, 1, 2, 4 (s = +1) at bf16 max → 4 · max / 4 = max exactly in
  // column 0; adding index 11 (s = +1) gives 1.25 · max → +inf.
  for (auto& v : x) v = 0;
  x[0] = x[1] = x[2] = x[4] = 0x7F7F;
  rht16_apply(x, y);
  EXPECT_EQ(y[0], 0x7F7F);
  x[11] = 0x7F7F;
  rht16_apply(x, y);
  EXPECT_EQ(y[0], 0x7F80);
}

TEST(QuantHadamard, MatchesDoubleWhenDoubleIsExact) {
  // For values within a few binades the double sum is exact (the terms span far fewer than 53
  // bits), so rounding it once to bf16 must agree bit for bit.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    uint16_t x[16], y[16];
    for (auto& v : x) v = bf(nd(rng));
    rht16_apply_exact(x, y);
    for (int j = 0; j < 16; ++j) {
      double s = 0;
      for (int i = 0; i < 16; ++i) s += double(bf16_to_f32(x[i])) * rht16_entry(i, j);
      ASSERT_EQ(y[j], bf16_from_double(s)) << trial << " " << j;
    }
    float v[16];
    for (int i = 0; i < 16; ++i) v[i] = bf16_to_f32(x[i]);
    rht16_apply_f32(v);
    for (int j = 0; j < 16; ++j) ASSERT_EQ(v[j], bf16_to_f32(y[j]));
  }
}

TEST(QuantHadamard, FastTransformEqualsExactSumOnRealisticData) {
  // Gaussian chunks span few binades: every fp32 partial sum is exact, so the fast transform
  // must agree everywhere. Heavy-tailed chunks (log-normal magnitudes over ~40 binades) may
  // differ, by at most one bf16 ulp and rarely.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t total = 0, differ = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const bool heavy = trial % 2 == 1;
    uint16_t x[16], fast[16], exact[16];
    for (auto& v : x) {
      const float g = nd(rng);
      v = bf(heavy ? g * std::exp(6.0f * nd(rng)) : 3.0f * g);
    }
    rht16_apply(x, fast);
    rht16_apply_exact(x, exact);
    for (int j = 0; j < 16; ++j) {
      ++total;
      if (fast[j] == exact[j]) continue;
      ASSERT_TRUE(heavy) << "Gaussian chunk differs at trial " << trial << " column " << j;
      ++differ;
      const int ulps = std::abs(int(fast[j] & 0x7FFF) - int(exact[j] & 0x7FFF));
      EXPECT_EQ(ulps, 1) << std::hex << fast[j] << " vs " << exact[j];
    }
  }
  EXPECT_LT(differ, total / 1000) << differ << " of " << total << " results differ";
}

TEST(QuantHadamard, AmaxBeforeRoundingEqualsAmaxOfRoundedResults) {
  // The NVFP4 amax pass rounds max |butterfly| once instead of rounding every result
  // (rht16_butterfly_f32): equal because RNE to bf16 is monotonic and symmetric. Checked on
  // Gaussian, heavy-tailed, huge (overflowing) chunks and chunks with ±inf and NaN.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    float v[16], y[16];
    for (int i = 0; i < 16; ++i) {
      const float g = nd(rng);
      float x = trial % 4 == 0 ? g : trial % 4 == 1 ? g * std::exp(6.0f * nd(rng)) : g * 1e38f;
      if (trial % 4 == 3 && i == trial % 16)
        x = (trial / 4) % 3 == 0 ? NAN : (g < 0 ? -INFINITY : INFINITY);
      v[i] = y[i] = bf16_to_f32(bf(x));
    }
    rht16_apply_f32(y);
    rht16_butterfly_f32(v);
    float want = 0.0f, ymax = 0.0f;
    for (int i = 0; i < 16; ++i) {
      want = amax_combine(want, y[i]);
      ymax = amax_combine(ymax, v[i]);
    }
    const float got = bf16_to_f32(bf(ymax));
    ASSERT_EQ(f32_bits(got), f32_bits(want)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace lowbit

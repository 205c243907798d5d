// Exhaustive checks of the scalar codecs against an independent oracle: a brute-force nearest
// search over the decoded values of all codes (ties to the even code), with the overflow, NaN
// and signed-zero rules of formats.md §1 written out separately from the codec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "formats/sweeps.h"
#include "lowbit/core/philox.h"
#include "lowbit/formats.h"

namespace lowbit {
namespace {

using test::all_bf16_as_f32;
using test::boundary_sweep;
using test::CodePoint;
using test::finite_magnitudes;
using test::step_ulps;

// Independent description of each format (from formats.md §1.1), not from minifloat_spec().
struct FormatFacts {
  DType t;
  int bits;  // code width
  int ebits, mbits, bias;
  double max_finite;
  bool has_inf;  // E5M2, F16
  bool has_nan;  // E4M3, UE4M3, E5M2, F16
  bool is_signed;
};
const FormatFacts kFacts[] = {
    {DType::kE4M3, 8, 4, 3, 7, 448.0, false, true, true},
    {DType::kE5M2, 8, 5, 2, 15, 57344.0, true, true, true},
    {DType::kE3M2, 6, 3, 2, 3, 28.0, false, false, true},
    {DType::kE2M3, 6, 2, 3, 1, 7.5, false, false, true},
    {DType::kE2M1, 4, 2, 1, 1, 6.0, false, false, true},
    {DType::kUE4M3, 8, 4, 3, 7, 448.0, false, true, false},
    {DType::kF16, 16, 5, 10, 15, 65504.0, true, true, true},
};

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%X", v);
  return buf;
}

// Decoding from first principles: value of a code per the field layout and special rules.
double decode_reference(const FormatFacts& f, uint32_t code, bool* is_nan, bool* is_inf) {
  *is_nan = *is_inf = false;
  if (!f.is_signed && (code >> (f.bits - 1))) {  // UE4M3: a set sign bit is not a valid code
    *is_nan = true;
    return NAN;
  }
  const int mag_bits = f.bits - 1;
  const uint32_t mag = code & ((1u << mag_bits) - 1);
  const bool neg = f.is_signed && (code >> (f.bits - 1));
  const uint32_t e = mag >> f.mbits;
  const uint32_t m = mag & ((1u << f.mbits) - 1);
  const uint32_t e_top = (1u << f.ebits) - 1;
  if (f.has_inf && e == e_top) {  // IEEE-like top exponent
    if (m == 0) {
      *is_inf = true;
      return neg ? -INFINITY : INFINITY;
    }
    *is_nan = true;
    return NAN;
  }
  if (!f.has_inf && f.has_nan && e == e_top && m == (1u << f.mbits) - 1) {  // S.1111.111
    *is_nan = true;
    return NAN;
  }
  const double v = e == 0 ? std::ldexp(static_cast<double>(m), 1 - f.bias - f.mbits)
                          : std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mbits),
                                       static_cast<int>(e) - f.bias);
  return neg ? -v : v;
}

TEST(CodecDecode, EveryCodeOfEveryMinifloat) {
  for (const FormatFacts& f : kFacts) {
    int nan_count = 0;
    double max_seen = 0;
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      bool is_nan, is_inf;
      const double want = decode_reference(f, c, &is_nan, &is_inf);
      const float got = decode(f.t, c);
      SCOPED_TRACE(std::string(dtype_name(f.t)) + " code " + hex(c));
      if (is_nan) {
        ++nan_count;
        EXPECT_TRUE(std::isnan(got));
      } else {
        EXPECT_EQ(static_cast<double>(got), want);
        if (!is_inf) max_seen = std::max(max_seen, std::fabs(want));
      }
    }
    EXPECT_EQ(max_seen, f.max_finite) << dtype_name(f.t);
    // UE4M3: 0x7F plus the 128 codes with the sign bit set.
    const int expected_nans = !f.has_nan    ? 0
                              : f.has_inf   ? 2 * ((1 << f.mbits) - 1)
                              : f.is_signed ? 2
                                            : 1 + 128;
    EXPECT_EQ(nan_count, expected_nans) << dtype_name(f.t);
  }
}

TEST(CodecDecode, SpotValuesFromTheSpecTable) {
  EXPECT_EQ(decode(DType::kE4M3, 0x7E), 448.0f);
  EXPECT_EQ(decode(DType::kE4M3, 0xFE), -448.0f);
  EXPECT_EQ(decode(DType::kE4M3, 0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(decode(DType::kE4M3, 0x08), 0.015625f);     // 2^-6
  EXPECT_EQ(decode(DType::kE4M3, 0x78), 256.0f);        // top exponent is normal
  EXPECT_TRUE(std::isnan(decode(DType::kE4M3, 0x7F)));
  EXPECT_EQ(decode(DType::kE5M2, 0x7B), 57344.0f);
  EXPECT_EQ(decode(DType::kE5M2, 0x7C), INFINITY);
  EXPECT_EQ(decode(DType::kE5M2, 0xFC), -INFINITY);
  EXPECT_EQ(decode(DType::kE5M2, 0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(decode(DType::kE3M2, 0x1F), 28.0f);
  EXPECT_EQ(decode(DType::kE3M2, 0x01), 0.0625f);
  EXPECT_EQ(decode(DType::kE2M3, 0x1F), 7.5f);
  EXPECT_EQ(decode(DType::kE2M3, 0x01), 0.125f);
  const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint32_t c = 0; c < 8; ++c) {
    EXPECT_EQ(decode(DType::kE2M1, c), e2m1[c]);
    EXPECT_EQ(decode(DType::kE2M1, c | 8), -e2m1[c]);
  }
  EXPECT_TRUE(std::signbit(decode(DType::kE2M1, 0x8)));  // -0
  EXPECT_EQ(decode(DType::kUE4M3, 0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(decode(DType::kUE4M3, 0x7F)));
}

TEST(CodecDecode, E8M0EveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float got = decode_e8m0(static_cast<uint8_t>(c));
    if (c == 0xFF) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      EXPECT_EQ(static_cast<double>(got), std::ldexp(1.0, static_cast<int>(c) - 127)) << c;
    }
  }
  EXPECT_EQ(f32_bits(decode_e8m0(0x00)), 0x00400000u);  // 2^-127 is an fp32 subnormal
  EXPECT_EQ(f32_bits(decode_e8m0(0xFE)), 0x7F000000u);  // 2^127
}

// Oracle for round-to-nearest-even encoding into a minifloat.
uint32_t encode_reference(const FormatFacts& f, const std::vector<CodePoint>& mags, float x,
                          Overflow ov) {
  const uint32_t sign = (f.is_signed && std::signbit(x)) ? 1u << (f.bits - 1) : 0u;
  const uint32_t max_code = mags.back().code;
  auto overflow = [&]() -> uint32_t {
    if (ov == Overflow::kSatFinite || !f.has_nan) return sign | max_code;
    if (f.has_inf) return sign | (((1u << f.ebits) - 1) << f.mbits);  // ±inf
    return sign | ((1u << (f.bits - 1)) - 1);                         // E4M3: S.1111.111
  };
  if (std::isnan(x)) {
    if (!f.has_nan) return max_code;  // CUDA: NaN → +max for FP6/FP4
    return f.bits == 16 ? 0x7FFFu : 0x7Fu;
  }
  if (!f.is_signed && std::signbit(x)) return 0;
  if (std::isinf(x)) return overflow();
  const double a = std::fabs(static_cast<double>(x));
  // Candidates: every finite magnitude plus the value after max in max's binade (odd/even
  // parity continues), found by binary search.
  const double max_v = mags.back().value;
  const double next_v = max_v + std::ldexp(1.0, std::ilogb(max_v) - f.mbits);
  if (a >= next_v) return overflow();
  auto it = std::upper_bound(mags.begin(), mags.end(), a,
                             [](double v, const CodePoint& p) { return v < p.value; });
  const CodePoint lo = *(it - 1);  // largest magnitude <= a
  const double hi_v = it == mags.end() ? next_v : it->value;
  const uint32_t hi_code = it == mags.end() ? max_code + 1 : it->code;
  if (a == lo.value) return sign | lo.code;
  const double dlo = a - lo.value, dhi = hi_v - a;
  uint32_t pick;
  if (dlo < dhi) {
    pick = lo.code;
  } else if (dhi < dlo) {
    pick = hi_code;
  } else {
    pick = (lo.code & 1u) == 0 ? lo.code : hi_code;  // tie: the even code
  }
  if (pick > max_code) return overflow();
  return sign | pick;
}

void check_encode(const FormatFacts& f, const std::vector<float>& inputs, Overflow ov,
                  const char* what) {
  const std::vector<CodePoint> mags = finite_magnitudes(f.t);
  int64_t mismatches = 0;
  std::string first;
  for (float x : inputs) {
    const uint32_t want = encode_reference(f, mags, x, ov);
    const uint32_t got = encode_rn(f.t, x, ov);
    if (want != got) {
      if (mismatches++ == 0) {
        first = "x=" + std::to_string(x) + " (bits " + hex(f32_bits(x)) + ") want " + hex(want) +
                " got " + hex(got);
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << dtype_name(f.t) << " " << what << " over " << inputs.size()
                           << " inputs; first: " << first;
}

TEST(CodecEncode, EveryBf16ValueSaturating) {
  const std::vector<float> in = all_bf16_as_f32();
  for (const FormatFacts& f : kFacts) check_encode(f, in, Overflow::kSatFinite, "all bf16, sat");
}

TEST(CodecEncode, EveryBf16ValueNonSaturating) {
  const std::vector<float> in = all_bf16_as_f32();
  for (const FormatFacts& f : kFacts) check_encode(f, in, Overflow::kNonSat, "all bf16, nonsat");
}

TEST(CodecEncode, DenseFp32SweepAroundEveryBoundary) {
  for (const FormatFacts& f : kFacts) {
    const std::vector<float> in = boundary_sweep(f.t);
    check_encode(f, in, Overflow::kSatFinite, "boundary sweep, sat");
    check_encode(f, in, Overflow::kNonSat, "boundary sweep, nonsat");
  }
}

// The thresholds formats.md §1.3–1.4 spells out, as literal cases.
TEST(CodecEncode, DocumentedThresholds) {
  // E4M3: |x| <= 2^-10 → 0; [448, 464] → 448; above 464 overflows.
  EXPECT_EQ(encode_rn(DType::kE4M3, std::ldexp(1.0f, -10)), 0x00u);
  EXPECT_EQ(encode_rn(DType::kE4M3, step_ulps(std::ldexp(1.0f, -10), 1)), 0x01u);
  EXPECT_EQ(encode_rn(DType::kE4M3, 464.0f), 0x7Eu);
  EXPECT_EQ(encode_rn(DType::kE4M3, 464.0f, Overflow::kNonSat), 0x7Eu);
  EXPECT_EQ(encode_rn(DType::kE4M3, 464.01f, Overflow::kNonSat), 0x7Fu);
  EXPECT_EQ(encode_rn(DType::kE4M3, -1e6f, Overflow::kNonSat), 0xFFu);
  EXPECT_EQ(encode_rn(DType::kE4M3, 1e6f), 0x7Eu);
  EXPECT_EQ(encode_rn(DType::kE4M3, -INFINITY), 0xFEu);
  EXPECT_EQ(encode_rn(DType::kE4M3, -NAN), 0x7Fu);
  EXPECT_EQ(encode_rn(DType::kE4M3, -0.0f), 0x80u);
  // E5M2: 61440 ties to the odd code → overflow.
  EXPECT_EQ(encode_rn(DType::kE5M2, step_ulps(61440.0f, -1)), 0x7Bu);
  EXPECT_EQ(encode_rn(DType::kE5M2, 61440.0f), 0x7Bu);
  EXPECT_EQ(encode_rn(DType::kE5M2, 61440.0f, Overflow::kNonSat), 0x7Cu);
  EXPECT_EQ(encode_rn(DType::kE5M2, -INFINITY, Overflow::kNonSat), 0xFCu);
  EXPECT_EQ(encode_rn(DType::kE5M2, NAN), 0x7Fu);
  EXPECT_EQ(encode_rn(DType::kE5M2, std::ldexp(1.0f, -17)), 0x00u);
  // E2M1 decision points.
  const struct {
    float x;
    uint32_t code;
  } e2m1[] = {{0.25f, 0}, {0.26f, 1}, {0.75f, 2}, {1.25f, 2}, {1.26f, 3}, {1.75f, 4},
              {2.5f, 4},  {2.6f, 5},  {3.5f, 6},  {5.0f, 6},  {5.01f, 7}, {1e9f, 7}};
  for (auto c : e2m1) {
    EXPECT_EQ(encode_rn(DType::kE2M1, c.x), c.code) << c.x;
    EXPECT_EQ(encode_rn(DType::kE2M1, -c.x), c.code | 8u) << -c.x;
  }
  EXPECT_EQ(encode_rn(DType::kE2M1, NAN), 0x7u);
  EXPECT_EQ(encode_rn(DType::kE2M1, -0.1f), 0x8u);  // tiny negatives keep the sign (−0)
  EXPECT_EQ(encode_rn(DType::kE3M2, NAN), 0x1Fu);
  EXPECT_EQ(encode_rn(DType::kE2M3, -INFINITY, Overflow::kNonSat), 0x3Fu);
  EXPECT_EQ(encode_rn(DType::kUE4M3, -3.0f), 0x00u);
}

// --- E8M0 -------------------------------------------------------------------------------------

uint8_t e8m0_reference(float x, E8M0Rounding r, Overflow ov) {
  if (std::isnan(x)) return 0xFF;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return ov == Overflow::kSatFinite ? 0xFE : 0xFF;
  if (a == 0) return 0x00;
  int k;
  if (r == E8M0Rounding::kFloor) {
    k = static_cast<int>(std::floor(std::log2(a)));
  } else if (r == E8M0Rounding::kCeil) {
    k = static_cast<int>(std::ceil(std::log2(a)));
  } else {
    const int e = static_cast<int>(std::floor(std::log2(a)));
    k = a >= 1.5 * std::ldexp(1.0, e) ? e + 1 : e;
  }
  // log2 of a double is exact for powers of two; guard the floor/ceil against rounding.
  while (std::ldexp(1.0, k) > a && r == E8M0Rounding::kFloor) --k;
  while (std::ldexp(1.0, k) < a && r == E8M0Rounding::kCeil) ++k;
  if (k < -127) k = -127;
  if (k > 127) return ov == Overflow::kSatFinite ? 0xFE : 0xFF;
  return static_cast<uint8_t>(k + 127);
}

TEST(CodecE8M0, EveryBf16AndSweepAllRoundings) {
  std::vector<float> in = all_bf16_as_f32();
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    for (int u = -3; u <= 3; ++u) in.push_back(step_ulps(p, u));
    in.push_back(1.5f * p);
    in.push_back(step_ulps(1.5f * p, -1));
  }
  for (E8M0Rounding r : {E8M0Rounding::kCeil, E8M0Rounding::kFloor, E8M0Rounding::kNearest}) {
    for (Overflow ov : {Overflow::kSatFinite, Overflow::kNonSat}) {
      int64_t bad = 0;
      for (float x : in) {
        const uint8_t want = e8m0_reference(x, r, ov);
        const uint8_t got = encode_e8m0(x, r, ov);
        if (want != got && bad++ < 5) {
          ADD_FAILURE() << "x bits " << hex(f32_bits(x)) << " rounding " << static_cast<int>(r)
                        << " want " << hex(want) << " got " << hex(got);
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(CodecE8M0, DocumentedCases) {
  EXPECT_EQ(encode_e8m0(1.4f, E8M0Rounding::kNearest), 127);
  EXPECT_EQ(encode_e8m0(1.5f, E8M0Rounding::kNearest), 128);
  EXPECT_EQ(encode_e8m0(0.75f, E8M0Rounding::kNearest), 127);
  EXPECT_EQ(encode_e8m0(3.0f, E8M0Rounding::kNearest), 129);
  EXPECT_EQ(encode_e8m0(5.0f, E8M0Rounding::kNearest), 129);
  EXPECT_EQ(encode_e8m0(5.0f, E8M0Rounding::kCeil), 130);
  EXPECT_EQ(encode_e8m0(5.0f, E8M0Rounding::kFloor), 129);
  EXPECT_EQ(encode_e8m0(0.0f), 0x00);
  EXPECT_EQ(encode_e8m0(-2.0f), 128);
  EXPECT_EQ(encode_e8m0(INFINITY), 0xFE);
  EXPECT_EQ(encode_e8m0(INFINITY, E8M0Rounding::kCeil, Overflow::kNonSat), 0xFF);
  EXPECT_EQ(encode_e8m0(NAN), 0xFF);
  EXPECT_EQ(encode_e8m0(3.4e38f), 0xFE);                     // ceil overflows 2^127 → saturate
  EXPECT_EQ(encode_e8m0(f32_from_bits(0x00400000u)), 0x00);  // exactly 2^-127
  EXPECT_EQ(encode_e8m0(f32_from_bits(0x00400001u)), 0x01);  // just above → 2^-126
  EXPECT_EQ(encode_e8m0(f32_from_bits(0x00000001u)), 0x00);  // clipped up to 2^-127
}

// --- bf16 and stochastic rounding ------------------------------------------------------------

TEST(CodecBf16, RoundToNearestEvenMatchesDoubleRounding) {
  // Sweep fp32 patterns with a stride that visits every low-16-bit class.
  for (uint64_t u = 0; u < 0x100000000ull; u += 0x10001ull * 7 + 1) {
    const float x = f32_from_bits(static_cast<uint32_t>(u));
    const uint16_t b = f32_to_bf16_rn(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(b)));
      continue;
    }
    // Reference: the two bf16 neighbours by truncation, pick nearest, tie → even.
    const uint16_t lo = static_cast<uint16_t>(static_cast<uint32_t>(u) >> 16);
    const uint32_t rest = static_cast<uint32_t>(u) & 0xFFFFu;
    uint16_t want = lo;
    if (rest > 0x8000u || (rest == 0x8000u && (lo & 1u))) want = lo + 1;
    ASSERT_EQ(b, want) << hex(static_cast<uint32_t>(u));
  }
}

TEST(CodecSR, ResultIsOneOfTheTwoNeighbours) {
  for (const FormatFacts& f : kFacts) {
    if (f.t == DType::kF16) continue;
    const std::vector<CodePoint> mags = finite_magnitudes(f.t);
    for (float x : boundary_sweep(f.t)) {
      if (!std::isfinite(x)) continue;
      const uint32_t down = encode_sr(f.t, x, 0xFFFFFFFFu);  // never rounds up
      const uint32_t up = encode_sr(f.t, x, 0u);             // rounds up on any fraction
      const uint32_t rn = encode_rn(f.t, x);
      EXPECT_TRUE(rn == down || rn == up) << dtype_name(f.t) << " x=" << x;
      const double a = std::fabs(static_cast<double>(x));
      const double vd = std::fabs(static_cast<double>(decode(f.t, down)));
      const double vu = std::fabs(static_cast<double>(decode(f.t, up)));
      EXPECT_LE(vd, a) << dtype_name(f.t) << " x=" << x;
      // Below 2^-32 of a quantum the fraction truncates to 0 (documented bias < 2^-32 ulp);
      // UE4M3 maps negatives to +0.
      const bool resolvable = a >= std::ldexp(mags[1].value, -31);
      const bool negative_unsigned = !f.is_signed && std::signbit(x);
      if (a <= f.max_finite && resolvable && !negative_unsigned) {
        EXPECT_GE(vu, a) << dtype_name(f.t) << " x=" << x;
      }
      if (vd == a) EXPECT_EQ(up, down);  // representable values never move
    }
  }
}

TEST(CodecSR, UnbiasedOnAverage) {
  // x between neighbours lo < x < hi: E[SR(x)] = x, Var = (hi - x)(x - lo).
  const struct {
    float x, lo, hi;
  } cases[] = {{2.6f, 2, 3}, {0.3f, 0, 0.5f}, {5.5f, 4, 6}, {-1.2f, -1.5f, -1}, {0.1f, 0, 0.5f}};
  const int n = 200000;
  for (const auto& c : cases) {
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      sum += decode(DType::kE2M1, encode_sr(DType::kE2M1, c.x, philox_uint32(1234, 7, i)));
    }
    const double mean = sum / n;
    const double sd = std::sqrt((c.hi - c.x) * (c.x - c.lo) / n);
    EXPECT_NEAR(mean, c.x, 5 * sd) << "x=" << c.x;
  }
}

}  // namespace
}  // namespace lowbit

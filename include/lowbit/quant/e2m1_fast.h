// Fast E2M1 encoders for the NVFP4 kernels, host and device: the same codes as the portable codec
// (formats.h encode_rn / encode_sr with DType::kE2M1) for every input that is not NaN, in a
// handful of instructions. The CPU tests compare them with the codec over every fp32 pattern of
// the decision range (and a sparse sweep of the rest); the CUDA kernels call them unchanged.
//
// Split of the work: the magnitude code (3 bits) is computed per element, the sign bits are
// moved into place eight at a time (e2m1_sign_bits8) and OR-ed in once per packed word. A NaN
// input would get its sign bit where the codec writes +6 (0x7), so the kernels take these
// encoders only for blocks without NaN (their block amax propagates NaN) and the codec otherwise.
#pragma once

#include <cstdint>

#include "lowbit/core/hd.h"
#include "lowbit/formats.h"
#include "lowbit/quant/rn_ops.h"

namespace lowbit {

// --- round to nearest even ---------------------------------------------------------------------
//
// The E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} is mapped onto the integers 0..7 (= the magnitude
// codes) by the concave piecewise-linear F(t) = min(2t, t + 2, t/2 + 4): slope 2 on [0, 2]
// (quantum 0.5), 1 on [2, 4] (quantum 1), 1/2 on [4, 8] (quantum 2). On each piece F is an exact
// affine map with a power-of-two slope, so rounding t to the grid with ties to the even code is
// rounding F(t) to an integer with ties to even, and since RNE is monotonic,
// RNE(min_i F_i(t)) = min_i RNE(F_i(t)). Each RNE(F_i(t)) is ONE fp32 operation: the exact line
// value plus C = 1.5·2^23 (whose ulp is 1) rounded once, by an FMA for the lines with a factor
// (t·2 and t·0.5 are exact inside the FMA, even for subnormal t) and an add for t + 2. The sum
// stays in C's binade (t ≤ 6), so bits(sum) - bits(C) is the code. t = min(|x|, 6) saturates
// (6 maps to code 7; inf too) and turns NaN into 6 (fminf drops NaN). Six fp32 instructions in
// all, against about a dozen for e2m1_rn_fast.
inline constexpr float kE2m1Magic = 12582912.0f;  // 1.5 · 2^23
inline constexpr uint32_t kE2m1MagicBits = 0x4B400000u;

// bits(C) + magnitude code of x (RNE, saturating); see above.
LOWBIT_HD uint32_t e2m1_rn_mag_biased(float x) {
  const float t = fmin_num(abs_f32(x), 6.0f);
  const float l1 = fma_rn(t, 2.0f, kE2m1Magic);         // C + RNE(2t)
  const float l2 = add_rn(t, kE2m1Magic + 2.0f);        // C + RNE(t + 2)
  const float l3 = fma_rn(t, 0.5f, kE2m1Magic + 4.0f);  // C + RNE(t/2 + 4)
  return f32_bits(fmin_num(fmin_num(l1, l2), l3));
}

// Magnitude code (0..7) of x, round to nearest even with saturation; x not NaN.
LOWBIT_HD uint32_t e2m1_rn_mag(float x) { return e2m1_rn_mag_biased(x) - kE2m1MagicBits; }

// --- stochastic rounding -----------------------------------------------------------------------
//
// encode_sr for E2M1, |x| = a with fp32 bits u, e = floor(log2 a), r = the 32 random bits:
// t = a / q with the quantum q = 2^(max(e, 0) - 1), fl = floor(t), frac = t - fl,
// n = fl + [r < trunc(frac · 2^32)], code = min(2·max(e, 0) + n, 7); fp32 subnormals and zero
// give 0 (the codec returns before rounding). In integers, by region:
//  * a ≥ 1: t ∈ [2, 4) is 1.m with the binary point after significand bit 22, so
//    trunc(frac · 2^32) = (m & 0x3FFFFF) << 10 and "r < that" is "(m & 0x3FFFFF) > r >> 10"
//    (the low 10 bits of the threshold are 0). Adding 0x3FFFFF - (r >> 10) < 2^22 to u carries
//    into bit 22 exactly then, and the carry runs on into the exponent like a rounding up:
//    (u + 0x3FFFFF - (r >> 10)) >> 22 = 2·(e + 127) + n - 2, i.e. the code plus 252. inf and
//    every a ≥ 8 land above 7 and saturate.
//  * 0.5 ≤ a < 1: t = 2a ∈ [1, 2), fl = 1, threshold m << 9: code = 1 + [m > r >> 9].
//  * a < 0.5: fl = 0, threshold trunc(a · 2^33) = (significand << 8) >> (-2 - e) (a right shift
//    by 32 or more gives 0, which also covers zero and fp32 subnormals: their exponent field 0
//    asks for a shift by 125); code = [r < threshold].
LOWBIT_HD uint32_t shr_clamped(uint32_t x, uint32_t n) {  // x >> n, 0 for n ≥ 32
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("shr.b32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(n));  // PTX clamps the shift to 32
  return r;
#else
  return n >= 32 ? 0u : x >> n;
#endif
}

// Magnitude code (0..7) of encode_sr(DType::kE2M1, x, r); x not NaN.
LOWBIT_HD uint32_t e2m1_sr_mag(float x, uint32_t r) {
  const uint32_t u = f32_bits(x) & 0x7FFFFFFFu;
  uint32_t hi = ((u + 0x3FFFFFu - (r >> 10)) >> 22) - 252u;  // a ≥ 1 (≥ 2 there)
  hi = hi < 7u ? hi : 7u;
  const uint32_t mid = 1u + ((u & 0x7FFFFFu) > (r >> 9) ? 1u : 0u);  // [0.5, 1)
  const uint32_t lo = r < shr_clamped((u << 8) | 0x80000000u, 125u - (u >> 23)) ? 1u : 0u;  // < 0.5
  return u >= 0x3F800000u ? hi : (u >= 0x3F000000u ? mid : lo);
}

// --- packing -------------------------------------------------------------------------------------

// prmt.b32 without sign replication: byte i of the result is byte (sel >> 4i) & 7 of {b, a}
// (a = bytes 0-3, b = bytes 4-7).
LOWBIT_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    r |= static_cast<uint32_t>((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  }
  return r;
#endif
}

// The sign bits of 8 fp32 values at bit 4i + 3 (the sign of nibble i), other bits 0. Three byte
// permutes gather the top bytes of four values: the even elements 0, 2, 4, 6 then have their
// sign at bit 8j + 7 and need bit 8j + 3 (one shift), the odd ones 1, 3, 5, 7 are in place.
// 9 instructions for 8 values instead of a shift and a mask each.
LOWBIT_HD uint32_t e2m1_sign_bits8(const uint32_t (&b)[8]) {
  const uint32_t even =
      byte_perm(byte_perm(b[0], b[2], 0x7373u), byte_perm(b[4], b[6], 0x7373u), 0x5410u);
  const uint32_t odd =
      byte_perm(byte_perm(b[1], b[3], 0x7373u), byte_perm(b[5], b[7], 0x7373u), 0x5410u);
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
}

// Σ_i (kE2m1MagicBits << 4i) mod 2^32: the biased codes of 8 nibbles are summed at their shifts
// (the bias shifts out of the word or cancels modulo 2^32), then this is subtracted once.
LOWBIT_HD constexpr uint32_t e2m1_pack_bias8() {
  uint32_t s = 0;
  for (int i = 0; i < 8; ++i) s += kE2m1MagicBits << (4 * i);
  return s;
}

// 8 E2M1 codes of x[0..7] (none NaN), round to nearest even, packed with element 0 in the low
// nibble (formats.md §1.2): equal to Σ encode_rn(kE2M1, x[i]) << 4i.
LOWBIT_HD uint32_t e2m1_pack8_rn(const float (&x)[8]) {
  uint32_t bits[8];
  uint32_t mags = 0u - e2m1_pack_bias8();
  for (int i = 0; i < 8; ++i) {
    bits[i] = f32_bits(x[i]);
    mags += e2m1_rn_mag_biased(x[i]) << (4 * i);
  }
  return mags | e2m1_sign_bits8(bits);
}

// The same with stochastic rounding by the random words r[0..7]: Σ encode_sr(kE2M1, x[i], r[i]).
LOWBIT_HD uint32_t e2m1_pack8_sr(const float (&x)[8], const uint32_t (&r)[8]) {
  uint32_t bits[8];
  uint32_t mags = 0;
  for (int i = 0; i < 8; ++i) {
    bits[i] = f32_bits(x[i]);
    mags |= e2m1_sr_mag(x[i], r[i]) << (4 * i);
  }
  return mags | e2m1_sign_bits8(bits);
}

}  // namespace lowbit

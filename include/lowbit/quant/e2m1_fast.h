// Fast E2M1 encoders for the NVFP4 kernels, host and device: the same codes as the portable codec
// (formats.h encode_rn / encode_sr with DType::kE2M1) for every input that is not NaN, in a
// handful of instructions. The CPU tests compare them with the codec over every fp32 pattern of
// the decision range (and a sparse sweep of the rest); the CUDA kernels call them unchanged.
//
// Split of the work: the magnitude code (3 bits) is computed per element, the sign bits are
// moved into place eight at a time and OR-ed in once per packed word. The NVFP4 v11 kernel uses
// the two-line round to nearest (e2m1_rn_mag2_biased, below) with e2m1_pack8_rn2* and
// e2m1_or_signs8*; the three-line encoders (e2m1_rn_mag_biased, e2m1_pack8_rn) stay as the
// CPU tests' reference for them. A NaN
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

// The same rounding with two lines (four fp32 instructions per code instead of six). E2M1 is a
// float format (codes 4..7 = 2, 3, 4, 6: quantum 1 in [2, 4), 2 from 4 on), and so is fp32 around
// 2^24: the ulp is 1 in [2^23, 2^24) and 2 in [2^24, 2^25). With D = 2^24 - 6:
//  * t in [0, 2]: RN(2t + D) = D + RNE(2t) (the sum stays in [D, 2^24 - 2], ulp 1, and D is even,
//    so the tie goes to the even integer): codes 0..4, as line l1 above (with D in place of C);
//  * t in [2, 6]: RN(t + D + 2) = RN(t + 2^24 - 4) rounds t to an integer below 4 (ulp 1; a tie
//    at 2.5 goes to the even 2^24 - 2, at 3.5 to 2^24) and to an even integer from 4 on, where
//    the sum crosses 2^24 and the ulp becomes 2 (a tie at 5 goes to 2^24, whose significand is
//    even): exactly the E2M1 grid 2, 3, 4, 6 with ties to the even code. The bit patterns of
//    D + 2 + {2, 3} and of 2^24 + {0, 2} are consecutive integers (one ulp apart each), so
//    bits(sum) - bits(D) is the code 4, 5, 6, 7.
// min(2t, t + 2) is the line of the right piece (2t ≤ t + 2 ⇔ t ≤ 2), and RNE commutes with the
// min (monotonic), so bits(min(l1, l2)) - bits(D) is the code for every t in [0, 6]; t = min(|x|,
// 6) saturates (inf too) as above. Equal to encode_rn for every non-NaN fp32 pattern (a host
// sweep of all 2^32; tests/quant/test_nvfp4.cpp, TwoLineE2m1EncoderEqualsCodec, sweeps the
// decision range densely and the rest sparsely).
inline constexpr float kE2m1Magic2 = 16777210.0f;  // 2^24 - 6
inline constexpr uint32_t kE2m1Magic2Bits = 0x4B7FFFFAu;

// bits(D) + magnitude code of x (RNE, saturating), two lines; x not NaN.
LOWBIT_HD uint32_t e2m1_rn_mag2_biased(float x) {
  const float t = fmin_num(abs_f32(x), 6.0f);
  const float l1 = fma_rn(t, 2.0f, kE2m1Magic2);   // D + RNE(2t)          (t ≤ 2)
  const float l2 = add_rn(t, kE2m1Magic2 + 2.0f);  // D + code of t        (t ≥ 2)
  return f32_bits(fmin_num(l1, l2));
}

// Magnitude code (0..7) of x by the two lines; equal to e2m1_rn_mag for every x but NaN.
LOWBIT_HD uint32_t e2m1_rn_mag2(float x) { return e2m1_rn_mag2_biased(x) - kE2m1Magic2Bits; }

// The same without the clamp, for |x| < 7 only (not NaN): for t = |x| in [6, 7), t + 2^24 - 4
// lies in [2^24 + 2, 2^24 + 3) and rounds to 2^24 + 2 (code 7), as the clamped t = 6 does, and
// 2t + D > t + D + 2 there. Kernels use it for blocks whose largest |RN(v·m)| = RN(amax·m) is
// below 7 (RN is monotonic), which saves one instruction per code; on the device the |.| is an
// operand modifier of the FMA and the add.
LOWBIT_HD uint32_t e2m1_rn_mag2_biased_below7(float x) {
  const float t = abs_f32(x);
  return f32_bits(fmin_num(fma_rn(t, 2.0f, kE2m1Magic2), add_rn(t, kE2m1Magic2 + 2.0f)));
}

// --- stochastic rounding -----------------------------------------------------------------------
//
// E2M1 stochastic rounding as lowbit defines it (formats.md §5.1 asks for rounding up with
// probability frac, not for one algorithm). With n = 0x3FFFFF - (r >> 10), 22 of the random bits
// (r = sr_bits_of_byte(b) in the quantizers: n = 0x3FFFFF - (b << 14 | 0x2000)), |x| = a:
//  * a ≥ 1: code = ((bits(a) + n) >> 22) - 252, at most 7. bits(a) >> 22 is 2·(e + 127) + the
//    mantissa's top bit, i.e. the code of a rounded down plus 252 (E2M1 keeps one mantissa bit
//    from 1 up), and adding n carries into bit 22 exactly when the 22 bits below it exceed
//    0x3FFFFF - n: rounding up with probability frac (to 2^-22). The carry runs on into the
//    exponent like any rounding up; inf and every a ≥ 8 land above 7 and saturate.
//  * a < 1: the same on t = RN(a + 1) ∈ [1, 2], whose quantum 0.5 is E2M1's below 2:
//    code = ((bits(t) + n) >> 22) - 254 (t → 1, 1.5, 2 give 0, 1, 2). Zero and fp32 subnormals
//    give t = 1: code 0.
// For a ≥ 1 this is encode_sr(kE2M1, x, r) bit for bit; below 1 the two differ only through the
// rounding of a + 1 (a's bits under 2^-23 or 2^-24, finer than the 22 random bits resolve), and
// it costs half the instructions of the codec's three regions.
// Both cases in one line, without a branch or a select: g = max(a, RN(0.5·a + 0.5)). From a = 1
// up, (a + 1) / 2 ≤ a, so RN of it is ≤ a (a is a float) and g = a; below 1, (a + 1) / 2 > a and
// RN is monotone, so g = RN(0.5·a + 0.5) = t / 2 exactly (scaling by 2^-1 commutes with RN: t / 2
// ∈ [0.5, 1] is normal), whose bits are bits(t) - 2^23 — the "- 254" of the second case is the
// "- 252" of the first after that exponent step. 252 << 22 = 0x3F000000 ≤ bits(g) (g ≥ 0.5), so
// the subtraction folds into the constant before the shift: five instructions (fma and max with
// |x| as an operand modifier, one three-input add, the shift, the clamp) instead of nine.
LOWBIT_HD uint32_t e2m1_sr_mag(float x, uint32_t r) {
  const float a = abs_f32(x);
  const float g = fmax_num(a, fma_rn(a, 0.5f, 0.5f));  // a ≥ 1: a; a < 1: RN(a + 1) / 2
  const uint32_t code = (f32_bits(g) + (0x3FFFFFu - 0x3F000000u) - (r >> 10)) >> 22;
  return code < 7u ? code : 7u;
}

// The E2M1 code of x by stochastic rounding (e2m1_sr_mag) with x's sign bit for every non-NaN x
// (-0 and negatives rounded to 0 give 0x8, as encode_sr); NaN gives 0x7 (+max, as encode_sr).
LOWBIT_HD uint32_t e2m1_encode_sr(float x, uint32_t r) {
  const uint32_t xb = f32_bits(x);
  if ((xb & 0x7FFFFFFFu) > 0x7F800000u) return 0x7u;
  return e2m1_sr_mag(x, r) | ((xb >> 28) & 0x8u);
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

// prmt.b32 in its default mode, sign replication included: byte i of the result is byte
// (sel >> 4i) & 7 of {b, a} (a = bytes 0-3), or, when bit 3 of that selector nibble is set, bit 7
// of that byte copied into all 8 bits. (CUDA's __byte_perm masks the selector to 3 bits per
// nibble, so the device side is inline PTX.)
LOWBIT_HD uint32_t byte_perm_sx(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>((v >> (8 * (s & 7u))) & 0xFFu);
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0x00u;
    r |= byte << (8 * i);
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

// mags (8 magnitude codes, bit 3 of every nibble clear) with the sign bits of 8 values at bit
// 4i + 3, from their top bytes: `even` holds those of elements 0, 2, 4, 6 with the sign replicated
// over each byte (byte j is 0xFF or 0, so bit 8j + 3 is the sign of element 2j once masked), `odd`
// those of 1, 3, 5, 7 as they are (sign at bit 8j + 7 = 4(2j + 1) + 3). No shift is needed, and
// each half is one LOP3 (a | (b & mask)) with mags.
LOWBIT_HD uint32_t e2m1_or_sign_bytes(uint32_t mags, uint32_t even, uint32_t odd) {
  return (mags | (even & 0x08080808u)) | (odd & 0x80808080u);
}

// mags with the sign bits of 8 fp32 values (bit patterns b[0..7]) at bit 4i + 3: 6 permutes and
// two LOP3s; the same word as mags | e2m1_sign_bits8(b) (which also needs a shift and a mask).
// Selector 3 picks byte 3 (the top byte) of the first word, 7 that of the second.
LOWBIT_HD uint32_t e2m1_or_signs8(uint32_t mags, const uint32_t (&b)[8]) {
  const uint32_t even =
      byte_perm_sx(byte_perm(b[0], b[2], 0x0073u), byte_perm(b[4], b[6], 0x0073u), 0xDC98u);
  const uint32_t odd =
      byte_perm(byte_perm(b[1], b[3], 0x0073u), byte_perm(b[5], b[7], 0x0073u), 0x5410u);
  return e2m1_or_sign_bytes(mags, even, odd);
}

// mags with the sign bits of 8 bf16 values packed in pairs (element 2i in the low half of w[i],
// 2i + 1 in the high half; their top bytes are bytes 1 and 3 of w[i]): 4 permutes, two LOP3s.
LOWBIT_HD uint32_t e2m1_or_signs8_bf16(uint32_t mags, const uint32_t (&w)[4]) {
  const uint32_t x = byte_perm(w[0], w[1], 0x7351u);  // top bytes of elements 0, 2, 1, 3
  const uint32_t y = byte_perm(w[2], w[3], 0x7351u);  // 4, 6, 5, 7
  return e2m1_or_sign_bytes(mags, byte_perm_sx(x, y, 0xDC98u), byte_perm(x, y, 0x7632u));
}

// Σ_i (bias << 4i) mod 2^32: the term to subtract from 8 biased codes summed at their nibbles.
LOWBIT_HD constexpr uint32_t e2m1_pack_bias8_of(uint32_t bias) {
  uint32_t s = 0;
  for (int i = 0; i < 8; ++i) s += bias << (4 * i);
  return s;
}

// Two-line biased magnitude, clamped (any x but NaN) or, with kBelow7, for |x| < 7 only.
template <bool kBelow7>
LOWBIT_HD uint32_t e2m1_rn_mag2_biased_t(float x) {
  if constexpr (kBelow7) {
    return e2m1_rn_mag2_biased_below7(x);
  } else {
    return e2m1_rn_mag2_biased(x);
  }
}

// e2m1_pack8_rn by the two-line magnitudes and e2m1_or_signs8: the same word for every input
// without NaN (kBelow7: every input with |x| < 7), 5 + 1 instructions per code (kBelow7: 4 + 1)
// instead of 7 + 9/8.
template <bool kBelow7 = false>
LOWBIT_HD uint32_t e2m1_pack8_rn2(const float (&x)[8]) {
  uint32_t bits[8];
  uint32_t mags = 0u - e2m1_pack_bias8_of(kE2m1Magic2Bits);
  for (int i = 0; i < 8; ++i) {
    bits[i] = f32_bits(x[i]);
    mags += e2m1_rn_mag2_biased_t<kBelow7>(x[i]) << (4 * i);
  }
  return e2m1_or_signs8(mags, bits);
}

// The same for x[i] = RN(v_i · m) with m > 0 and the bf16 values v_i packed in w as above (not
// NaN): the sign bit of x[i] is the sign bit of v_i (multiplication by a positive number keeps
// it, for zeros, underflows and infinities too), so the signs come from the 4 words of bf16 bits
// (4 permutes) instead of the 8 products (6).
template <bool kBelow7 = false>
LOWBIT_HD uint32_t e2m1_pack8_rn2_bf16(const float (&x)[8], const uint32_t (&w)[4]) {
  uint32_t mags = 0u - e2m1_pack_bias8_of(kE2m1Magic2Bits);
  for (int i = 0; i < 8; ++i) mags += e2m1_rn_mag2_biased_t<kBelow7>(x[i]) << (4 * i);
  return e2m1_or_signs8_bf16(mags, w);
}

// The same with stochastic rounding by the random words r[0..7]: Σ e2m1_encode_sr(x[i], r[i]).
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

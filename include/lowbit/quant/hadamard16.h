// 16-point random Hadamard transform of NVFP4 columnwise copies (formats.md §5.2).
//
//   H = 0.25 · diag(s) · H16,  H16 the Sylvester Hadamard matrix, s the fixed sign vector
//   (bit i of kRhtSignMask set ⇔ s_i = -1). Every entry is ±0.25, exact in bf16.
//   A 16-element chunk x (bf16, a row of the transposed tensor along M) maps to y = x · H:
//       y_j = Σ_i x_i · H[i][j] = Σ_i ±x_i / 4.
//
// Rounding: lowbit's transform (rht16_apply_f32 / rht16_apply) runs the butterfly in fp32 in a
// fixed order and rounds each result once to bf16 — see the comment there. TE sums on tensor
// cores in fp32 and rounds to bf16 as well; neither order is bit-reproducible against the other
// in every case (formats.md §5.2), so the fixed order is part of lowbit's definition, identical
// on the CPU and the GPU.
//
// rht16_apply_exact is the mathematical reference: the exact sum of the 16 products rounded once
// to bf16. It does not sum in double (with an exponent spread of more than ~41 binades the
// double sum is inexact and can land on a bf16 tie); the products are added as integers into a
// 320-bit two's-complement fixed-point accumulator whose LSB is 2^-135 (the smallest bf16
// subnormal / 4), which holds every possible sum exactly. The tests bound how often and by how
// much the fast transform differs from it.
//
// Specials (both): any NaN input → NaN (0x7FC0); inputs contributing both +inf and -inf → NaN;
// otherwise ±inf wins. An exact zero sum gives +0. A finite sum above the bf16 range rounds to
// ±inf (IEEE round to nearest).
#pragma once

#include <cstdint>

#include "lowbit/core/hd.h"
#include "lowbit/formats.h"
#include "lowbit/quant/rn_ops.h"

namespace lowbit {

// s = [+1,+1,+1,-1,+1,-1,-1,-1,-1,-1,-1,+1,-1,+1,-1,-1] as a bitmask (bit i set ⇔ s_i = -1).
inline constexpr uint16_t kRhtSignMask = 0xD7E8;

// H[i][j] as a sign: true ⇔ the entry is -0.25. H16[i][j] = (-1)^popcount(i & j), row i of
// H16 multiplied by s_i.
LOWBIT_HD bool rht16_negative(int i, int j, uint16_t sign_mask = kRhtSignMask) {
  int p = i & j;
  p ^= p >> 2;
  p ^= p >> 1;
  const bool h_neg = (p & 1) != 0;
  const bool s_neg = ((sign_mask >> i) & 1u) != 0;
  return h_neg != s_neg;
}

// H[i][j] as a float (±0.25).
LOWBIT_HD float rht16_entry(int i, int j, uint16_t sign_mask = kRhtSignMask) {
  return rht16_negative(i, j, sign_mask) ? -0.25f : 0.25f;
}

// Exact accumulator of terms ±b/4 for bf16 b: 320-bit two's complement, bit 0 = 2^-135.
struct Bf16QuarterSum {
  uint64_t limb[5];  // little-endian limbs
  bool pos_inf;
  bool neg_inf;
  bool nan;
};

LOWBIT_HD void bf16_quarter_sum_init(Bf16QuarterSum& acc) {
  for (int l = 0; l < 5; ++l) acc.limb[l] = 0;
  acc.pos_inf = acc.neg_inf = acc.nan = false;
}

// acc += (negate ? -1 : 1) · bf16(bits) / 4, exactly.
LOWBIT_HD void bf16_quarter_sum_add(Bf16QuarterSum& acc, uint16_t bits, bool negate) {
  const bool neg = (((bits >> 15) & 1u) != 0) != negate;
  const uint32_t e = (bits >> 7) & 0xFFu;
  const uint32_t mant = bits & 0x7Fu;
  if (e == 0xFFu) {
    if (mant != 0) {
      acc.nan = true;
    } else if (neg) {
      acc.neg_inf = true;
    } else {
      acc.pos_inf = true;
    }
    return;
  }
  // bf16 = sig · 2^(e-134) for e ≥ 1 (sig = 128 + mant), mant · 2^-133 for e = 0; divided by 4
  // and expressed in units of 2^-135 that is sig << (e-1), or mant << 0.
  const uint64_t sig = e == 0 ? mant : (128u | mant);
  if (sig == 0) return;
  const int shift = e == 0 ? 0 : static_cast<int>(e) - 1;  // ≤ 253; sig < 2^8
  uint64_t v[5] = {0, 0, 0, 0, 0};
  const int li = shift >> 6;
  const int off = shift & 63;
  v[li] = sig << off;
  if (off > 56 && li + 1 < 5) v[li + 1] = sig >> (64 - off);
  if (neg) {  // two's complement negation of v
    uint64_t carry = 1;
    for (int l = 0; l < 5; ++l) {
      const uint64_t inv = ~v[l];
      v[l] = inv + carry;
      carry = (carry && v[l] == 0) ? 1 : 0;
    }
  }
  uint64_t carry = 0;
  for (int l = 0; l < 5; ++l) {
    const uint64_t s = acc.limb[l] + v[l];
    const uint64_t c1 = s < acc.limb[l] ? 1 : 0;
    const uint64_t t = s + carry;
    const uint64_t c2 = t < s ? 1 : 0;
    acc.limb[l] = t;
    carry = c1 | c2;
  }
}

LOWBIT_HD uint64_t bf16_quarter_sum_bit(const uint64_t mag[5], int pos) {
  return (mag[pos >> 6] >> (pos & 63)) & 1u;
}

// The accumulated exact value rounded once to bf16 (round to nearest even).
LOWBIT_HD uint16_t bf16_quarter_sum_round(const Bf16QuarterSum& acc) {
  if (acc.nan || (acc.pos_inf && acc.neg_inf)) return 0x7FC0;
  if (acc.pos_inf) return 0x7F80;
  if (acc.neg_inf) return 0xFF80;
  uint64_t mag[5];
  const bool neg = (acc.limb[4] >> 63) != 0;
  for (int l = 0; l < 5; ++l) mag[l] = acc.limb[l];
  if (neg) {
    uint64_t carry = 1;
    for (int l = 0; l < 5; ++l) {
      mag[l] = ~mag[l] + carry;
      carry = (carry && mag[l] == 0) ? 1 : 0;
    }
  }
  int top = -1;  // position of the most significant set bit
  for (int l = 4; l >= 0 && top < 0; --l) {
    if (mag[l] != 0) {
      int b = 63;
      while (!((mag[l] >> b) & 1u)) --b;
      top = l * 64 + b;
    }
  }
  if (top < 0) return 0x0000;  // exact zero → +0
  // Keep 8 significant bits; the smallest bf16 quantum 2^-133 is bit 2 of the accumulator.
  int lsb = top - 7;
  if (lsb < 2) lsb = 2;
  uint64_t q = 0;  // the kept bits, at most 8
  for (int pos = top; pos >= lsb; --pos) q = (q << 1) | bf16_quarter_sum_bit(mag, pos);
  const uint64_t round_bit = bf16_quarter_sum_bit(mag, lsb - 1);
  bool sticky = false;
  for (int pos = lsb - 2; pos >= 0 && !sticky; --pos) sticky = bf16_quarter_sum_bit(mag, pos) != 0;
  if (round_bit && (sticky || (q & 1u))) ++q;
  if (q == 256) {  // carried into the next binade
    q = 128;
    ++lsb;
  }
  // value = q · 2^(lsb-135). With q in [128, 256) the bf16 exponent field is lsb - 1; at
  // lsb == 2 a q below 128 is a subnormal and the same formula gives the field 0.
  uint32_t out;
  if (q < 128) {
    out = static_cast<uint32_t>(q);
  } else {
    const uint32_t e = static_cast<uint32_t>(lsb - 1);
    out = e >= 0xFFu ? 0x7F80u : ((e << 7) | static_cast<uint32_t>(q - 128));
  }
  return static_cast<uint16_t>(out | (neg ? 0x8000u : 0u));
}

// Exact y = x · H for one 16-element bf16 chunk (bits in, bits out): the reference the fast
// transform below is tested against.
LOWBIT_HD void rht16_apply_exact(const uint16_t x[16], uint16_t y[16],
                                 uint16_t sign_mask = kRhtSignMask) {
  for (int j = 0; j < 16; ++j) {
    Bf16QuarterSum acc;
    bf16_quarter_sum_init(acc);
    for (int i = 0; i < 16; ++i) bf16_quarter_sum_add(acc, x[i], rht16_negative(i, j, sign_mask));
    y[j] = bf16_quarter_sum_round(acc);
  }
}

// The transform lowbit quantizes with (CPU twin and CUDA kernels alike): in place on fp32 values
// that are exact bf16 values; results are bf16 values widened to fp32.
//   1. v_i · s_i / 4 — exact (sign flip, power of two; bf16 values stay ≥ 2^-135, normal or
//      subnormal fp32, so nothing underflows);
//   2. the Sylvester butterfly H16 in fp32, stages h = 1, 2, 4, 8: (a, b) → (a + b, a − b),
//      each sum one RN fp32 operation in this fixed order (no FMA can form: no products);
//   3. round each result once to bf16 (RNE); an exact zero is +0.
// The 16 terms have 8-bit significands, so every fp32 partial sum is exact unless the chunk's
// values span more than about 16 binades; only then can the result differ from the exact sum
// rounded once (rht16_apply_exact), and it then differs by at most one bf16 ulp. The 64 fp32
// additions per 16 values keep the transform far below the memory time of the cast kernels.
// Steps 1 and 2 (the fp32 values before the rounding to bf16). Split out so that kernels that
// need only max |y| can round once, after the max: RNE to bf16 is monotonic and symmetric, so
// max_j |bf16(y_j)| = bf16(max_j |y_j|) (NaN results are skipped either way).
LOWBIT_HD void rht16_butterfly_f32(float (&v)[16], uint16_t sign_mask = kRhtSignMask) {
  for (int i = 0; i < 16; ++i) v[i] = ((sign_mask >> i) & 1u) ? -0.25f * v[i] : 0.25f * v[i];
  for (int h = 1; h < 16; h <<= 1) {
    for (int i = 0; i < 16; ++i) {
      if (i & h) continue;
      const float a = v[i], b = v[i + h];
      v[i] = a + b;
      v[i + h] = a - b;
    }
  }
}

// rht16_butterfly_f32 with step 1 folded into the first butterfly stage, bit for bit the same
// values: for the pair (i, i + 1), b = RN(s_{i+1} · v_{i+1} / 4) is exact as before, and
// a ± b = RN(s_i · v_i / 4 ± b) is one FMA whose product s_i/4 · v_i is exact inside it, so its
// single rounding is the rounding of the stage-1 sum (signed zeros, inf and NaN included: the
// product is the exact a of step 1, and the sum is the same IEEE addition). 8 multiplies and 16
// FMAs instead of 16 multiplies and 16 adds; stages 2-4 are unchanged.
LOWBIT_HD void rht16_butterfly_f32_fused(float (&v)[16], uint16_t sign_mask = kRhtSignMask) {
  for (int i = 0; i < 16; i += 2) {
    const float sa = ((sign_mask >> i) & 1u) ? -0.25f : 0.25f;
    const float b = mul_rn(v[i + 1], ((sign_mask >> (i + 1)) & 1u) ? -0.25f : 0.25f);
    const float x = v[i];
    v[i] = fma_rn(x, sa, b);
    v[i + 1] = fma_rn(x, sa, -b);
  }
  for (int h = 2; h < 16; h <<= 1) {
    for (int i = 0; i < 16; ++i) {
      if (i & h) continue;
      const float a = v[i], b = v[i + h];
      v[i] = add_rn(a, b);
      v[i + h] = add_rn(a, -b);
    }
  }
}

LOWBIT_HD void rht16_apply_f32(float (&v)[16], uint16_t sign_mask = kRhtSignMask) {
  rht16_butterfly_f32(v, sign_mask);
  for (int i = 0; i < 16; ++i) {
    uint16_t b = f32_to_bf16_rn(v[i]);
    if ((b & 0x7FFFu) == 0) b = 0;            // +0 for a zero result
    if ((b & 0x7FFFu) > 0x7F80u) b = 0x7FC0;  // one NaN code
    v[i] = bf16_to_f32(b);
  }
}

// The same transform on bf16 bits.
LOWBIT_HD void rht16_apply(const uint16_t x[16], uint16_t y[16],
                           uint16_t sign_mask = kRhtSignMask) {
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = bf16_to_f32(x[i]);
  rht16_apply_f32(v, sign_mask);
  for (int i = 0; i < 16; ++i) y[i] = static_cast<uint16_t>(f32_bits(v[i]) >> 16);
}

}  // namespace lowbit

// Scalar codecs for every element and scale format (formats.md §1).
//
// One source for host and device: every function here is LOWBIT_HD and uses
// only exact fp32 operations (multiplication by powers of two, floor,
// subtraction of values with the same exponent), so the CPU twin and CUDA
// kernels produce the same codes bit for bit without relying on the FP
// environment or on fast-math.
//
// Semantics follow CUDA / PTX `cvt.rn.satfinite` (what TransformerEngine uses):
//   * round to nearest, ties to the even code;
//   * kSatFinite (default): finite overflow and ±inf go to ±max finite;
//   * kNonSat: overflow goes to ±inf (E5M2, F16) or to NaN with the sign kept
//     (E4M3, which has no inf); FP6/FP4 have neither, so they always saturate;
//   * NaN input: E4M3 / UE4M3 / E5M2 → 0x7F (sign dropped), F16 → 0x7FFF,
//     FP6/FP4 → +max (CUDA's rule; ml_dtypes differs, see tests/formats).
//   * UE4M3 is unsigned: negative inputs (and -0) encode to +0.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "lowbit/core/dtype.h"
#include "lowbit/core/hd.h"

namespace lowbit {

enum class Overflow : uint8_t { kSatFinite, kNonSat };
enum class E8M0Rounding : uint8_t { kCeil, kFloor, kNearest };

// --- fp32 bit helpers ---------------------------------------------------------------------

LOWBIT_HD uint32_t f32_bits(float x) {
#if LOWBIT_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

LOWBIT_HD float f32_from_bits(uint32_t u) {
#if LOWBIT_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

LOWBIT_HD bool f32_is_nan(float x) { return (f32_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
LOWBIT_HD bool f32_is_inf(float x) { return (f32_bits(x) & 0x7FFFFFFFu) == 0x7F800000u; }
LOWBIT_HD bool f32_is_finite(float x) { return (f32_bits(x) & 0x7F800000u) != 0x7F800000u; }

// 2^k as an exact fp32 for k in [-149, 127] (subnormal results built from their bit).
LOWBIT_HD float pow2f(int k) {
  if (k >= -126) return f32_from_bits(static_cast<uint32_t>(k + 127) << 23);
  return f32_from_bits(1u << (k + 149));
}

// --- bf16 ----------------------------------------------------------------------------------

LOWBIT_HD float bf16_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// fp32 → bf16, round to nearest even; NaN stays NaN (quiet bit set), overflow → inf.
LOWBIT_HD uint16_t f32_to_bf16_rn(float x) {
  uint32_t u = f32_bits(x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // cvt.rn.bf16.f32: the same rounding in one instruction (GPU tests compare every bf16 value and
  // boundary sweeps); only NaN payloads may differ, so NaN keeps the portable path.
  if ((u & 0x7FFFFFFFu) <= 0x7F800000u) {
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
  }
#endif
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// fp32 → bf16, stochastic rounding: rounds away from zero with probability equal to the
// dropped fraction, using the low 16 bits of `rbits`. Inf/NaN are kept.
LOWBIT_HD uint16_t f32_to_bf16_sr(float x, uint32_t rbits) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u) return f32_to_bf16_rn(x);
  u += rbits & 0xFFFFu;
  return static_cast<uint16_t>(u >> 16);
}

// --- generic minifloat description ---------------------------------------------------------

struct MiniFloatSpec {
  int ebits;          // exponent field width
  int mbits;          // mantissa field width
  int bias;           // exponent bias
  bool is_signed;     // false for UE4M3
  bool has_inf;       // IEEE-style inf at the top exponent (E5M2, F16)
  uint32_t max_code;  // magnitude code of the largest finite value
  uint32_t nan_code;  // code written for NaN input (for types without NaN: +max)
  int total_bits;     // width of the code (sign included)
};

// Returns the spec of a minifloat element type; for other types ebits == 0.
LOWBIT_HD MiniFloatSpec minifloat_spec(DType t) {
  switch (t) {
    case DType::kE4M3: return {4, 3, 7, true, false, 0x7E, 0x7F, 8};
    case DType::kUE4M3: return {4, 3, 7, false, false, 0x7E, 0x7F, 8};
    case DType::kE5M2: return {5, 2, 15, true, true, 0x7B, 0x7F, 8};
    case DType::kE3M2: return {3, 2, 3, true, false, 0x1F, 0x1F, 6};
    case DType::kE2M3: return {2, 3, 1, true, false, 0x1F, 0x1F, 6};
    case DType::kE2M1: return {2, 1, 1, true, false, 0x7, 0x7, 4};
    case DType::kF16: return {5, 10, 15, true, true, 0x7BFF, 0x7FFF, 16};
    default: return {0, 0, 0, false, false, 0, 0, 0};
  }
}

LOWBIT_HD bool minifloat_has_nan(const MiniFloatSpec& s) {
  return s.has_inf || s.nan_code != s.max_code;  // E4M3-style NaN or IEEE NaN
}

// Code written on overflow (|x| rounds above max, or |x| is inf).
LOWBIT_HD uint32_t minifloat_overflow_code(const MiniFloatSpec& s, uint32_t sign_bit, Overflow ov) {
  if (ov == Overflow::kSatFinite || !minifloat_has_nan(s)) return sign_bit | s.max_code;
  if (s.has_inf) return sign_bit | ((s.max_code | ((1u << s.mbits) - 1)) + 1);  // ±inf
  return sign_bit | s.nan_code;  // E4M3: NaN, sign kept
}

// Shared core of RN and SR encoding. `rbits` == nullptr selects round-to-nearest-even.
// Works on |x| split into an integer count `n` of quanta plus the dropped fraction.
LOWBIT_HD uint32_t minifloat_encode_impl(const MiniFloatSpec& s, float x, Overflow ov,
                                         bool stochastic, uint32_t rbits) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign_bit = s.is_signed ? ((u >> 31) << (s.total_bits - 1)) : 0u;
  if (f32_is_nan(x)) return s.nan_code;
  if (!s.is_signed && (u >> 31)) return 0u;  // unsigned: negatives and -0 → +0
  if (f32_is_inf(x)) return minifloat_overflow_code(s, sign_bit, ov);
  const uint32_t a_bits = u & 0x7FFFFFFFu;
  const int emin = 1 - s.bias;  // exponent of the smallest normal
  // fp32 subnormals (< 2^-126) are far below half the smallest subnormal of every
  // type handled here (F16's is 2^-24), so they round to zero (also under SR: the
  // dropped fraction is below 2^-32).
  if (a_bits < 0x00800000u) return sign_bit;
  const int e = static_cast<int>(a_bits >> 23) - 127;  // floor(log2 |x|)
  // Quantum (value of one mantissa step) in the binade of |x|, or the subnormal quantum.
  const int q_exp = (e > emin ? e : emin) - s.mbits;
  if (q_exp > 126) return minifloat_overflow_code(s, sign_bit, ov);
  // t = |x| / quantum, exact (power-of-two scaling, result < 2^(mbits+1)).
  const float a = f32_from_bits(a_bits);
  const float t = a * pow2f(-q_exp);
  const float fl = floorf(t);
  const float frac = t - fl;  // exact: t and fl share the exponent range
  uint32_t n = static_cast<uint32_t>(fl);
  if (stochastic) {
    // Round up iff rbits/2^32 < frac (frac truncated to 32 fractional bits).
    const uint64_t thresh = static_cast<uint64_t>(frac * 4294967296.0f);
    if (static_cast<uint64_t>(rbits) < thresh) ++n;
  } else if (frac > 0.5f || (frac == 0.5f && (n & 1u))) {
    ++n;
  }
  if (n == 0) return sign_bit;
  uint32_t exp_field;
  uint32_t mant;
  const uint32_t mant_mask = (1u << s.mbits) - 1u;
  if (e < emin) {  // subnormal quantum: n <= 2^mbits; n == 2^mbits is the smallest normal
    exp_field = n >> s.mbits;
    mant = n & mant_mask;
  } else {  // n in [2^mbits, 2^(mbits+1)]; the top value carries into the next binade
    exp_field = static_cast<uint32_t>(e + s.bias) + (n >> (s.mbits + 1));
    mant = n & mant_mask;
  }
  if (exp_field >= (1u << s.ebits)) return minifloat_overflow_code(s, sign_bit, ov);
  const uint32_t mag = (exp_field << s.mbits) | mant;
  if (mag > s.max_code) return minifloat_overflow_code(s, sign_bit, ov);
  return sign_bit | mag;
}

// fp32 → code, round to nearest even. Codes of FP6 sit in the low 6 bits, E2M1 in the low 4.
LOWBIT_HD uint32_t encode_rn(DType t, float x, Overflow ov = Overflow::kSatFinite) {
  return minifloat_encode_impl(minifloat_spec(t), x, ov, false, 0u);
}

// fp32 → code, stochastic rounding: |x| rounds up to the next representable magnitude with
// probability (|x| - lo) / (hi - lo), decided by `rbits` (32 uniform random bits). Unbiased
// up to the 2^-32 truncation of the fraction.
LOWBIT_HD uint32_t encode_sr(DType t, float x, uint32_t rbits, Overflow ov = Overflow::kSatFinite) {
  return minifloat_encode_impl(minifloat_spec(t), x, ov, true, rbits);
}

// code → fp32 for the minifloat types (E4M3, UE4M3, E5M2, E3M2, E2M3, E2M1, F16).
LOWBIT_HD float decode(DType t, uint32_t code) {
  const MiniFloatSpec s = minifloat_spec(t);
  const uint32_t mag_mask = (1u << (s.total_bits - (s.is_signed ? 1 : 0))) - 1u;
  const uint32_t mag = code & mag_mask;
  const bool neg = s.is_signed && ((code >> (s.total_bits - 1)) & 1u);
  const uint32_t exp_field = mag >> s.mbits;
  const uint32_t mant = mag & ((1u << s.mbits) - 1u);
  float v;
  if (s.has_inf && exp_field == (1u << s.ebits) - 1u) {
    v = mant == 0 ? f32_from_bits(0x7F800000u) : f32_from_bits(0x7FC00000u);
  } else if (mag > s.max_code) {
    v = f32_from_bits(0x7FC00000u);  // E4M3 / UE4M3: S.1111.111 is the only code above max
  } else if (exp_field == 0) {
    v = static_cast<float>(mant) * pow2f(1 - s.bias - s.mbits);
  } else {
    v = static_cast<float>((1u << s.mbits) | mant) *
        pow2f(static_cast<int>(exp_field) - s.bias - s.mbits);
  }
  return neg ? -v : v;
}

// --- E8M0 (MX block scale) -----------------------------------------------------------------

// fp32 → E8M0. Uses |x|. 0 and values at or below 2^-127 give 0x00 (E8M0 has no zero).
//   kCeil    : smallest power of two ≥ |x| (PTX cvt.rp.satfinite.ue8m0x2; TE's MXFP8 rule)
//   kFloor   : largest power of two ≤ |x|  (PTX cvt.rz)
//   kNearest : nearest in the linear domain, 1.5·2^e rounds up (ml_dtypes / PyTorch)
// Overflow (> 2^127 after rounding) and inf: 0xFE when saturating, 0xFF (NaN) otherwise.
LOWBIT_HD uint8_t encode_e8m0(float x, E8M0Rounding r = E8M0Rounding::kCeil,
                              Overflow ov = Overflow::kSatFinite) {
  if (f32_is_nan(x)) return 0xFF;
  const uint32_t a = f32_bits(x) & 0x7FFFFFFFu;
  if (a == 0x7F800000u) return ov == Overflow::kSatFinite ? 0xFE : 0xFF;
  if (a == 0) return 0x00;
  int e;       // floor(log2 |x|)
  bool exact;  // |x| is a power of two
  bool upper;  // |x| >= 1.5 · 2^e
  if (a >= 0x00800000u) {
    e = static_cast<int>(a >> 23) - 127;
    const uint32_t m = a & 0x7FFFFFu;
    exact = m == 0;
    upper = m >= 0x400000u;
  } else {  // fp32 subnormal: |x| = a · 2^-149
    int msb = 31;
    while (!((a >> msb) & 1u)) --msb;
    e = msb - 149;
    const uint32_t rest = a & ((1u << msb) - 1u);
    exact = rest == 0;
    upper = msb > 0 && ((a >> (msb - 1)) & 1u);
  }
  int k = e;
  if (r == E8M0Rounding::kCeil) k = e + (exact ? 0 : 1);
  if (r == E8M0Rounding::kNearest) k = e + (upper ? 1 : 0);
  if (k < -127) k = -127;
  if (k > 127) return ov == Overflow::kSatFinite ? 0xFE : 0xFF;
  return static_cast<uint8_t>(k + 127);
}

// E8M0 → fp32: 2^(e-127); 0x00 is 2^-127 (an fp32 subnormal), 0xFF is NaN.
LOWBIT_HD float decode_e8m0(uint8_t e) {
  if (e == 0xFF) return f32_from_bits(0x7FC00000u);
  if (e == 0) return f32_from_bits(0x00400000u);
  return f32_from_bits(static_cast<uint32_t>(e) << 23);
}

// --- FP4 packing (formats.md §1.2: the even element in the low nibble) ----------------------

LOWBIT_HD uint8_t e2m1_pack2(uint32_t even, uint32_t odd) {
  return static_cast<uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4));
}
LOWBIT_HD uint32_t e2m1_unpack(uint8_t byte, int index_parity) {
  return index_parity ? (byte >> 4) & 0xFu : byte & 0xFu;
}

// Largest finite value of a float element type (fp32 for F32; 0 for integer types).
LOWBIT_HD float dtype_max_finite(DType t) {
  switch (t) {
    case DType::kF32: return f32_from_bits(0x7F7FFFFFu);
    case DType::kBF16: return f32_from_bits(0x7F7F0000u);
    case DType::kE8M0: return pow2f(127);
    default: break;
  }
  const MiniFloatSpec s = minifloat_spec(t);
  if (s.ebits == 0) return 0.0f;
  return decode(t, s.max_code);
}

}  // namespace lowbit

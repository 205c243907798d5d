// Per-tensor and per-block scale math of every recipe (formats.md §2), for host and device.
//
// Each formula is written as the exact sequence of fp32 roundings of the reference kernels:
// every mul_rn / div_rn / rcp_rn is one RN operation (rn_ops.h). A CUDA kernel reproduces the
// CPU twin bit for bit by calling these same functions.
//
// Naming (formats.md §2.0): `scale` multiplies before the cast (q = cvt(x · scale)); `scale_inv`
// is stored beside the payload and multiplies after decoding (x ≈ decode(q) · scale_inv).
#pragma once

#include <cstdint>

#include "lowbit/core/dtype.h"
#include "lowbit/core/hd.h"
#include "lowbit/core/philox.h"
#include "lowbit/formats.h"
#include "lowbit/quant/e2m1_fast.h"
#include "lowbit/quant/rn_ops.h"

namespace lowbit {

// --- amax ------------------------------------------------------------------------------------

// One step of an amax reduction: max(acc, |x|) with fmaxf semantics, so NaN inputs are skipped
// (formats.md §2.0: TE's amax kernels ignore NaN; ±inf counts as inf). Start from acc = 0.
LOWBIT_HD float amax_combine(float acc, float x) { return fmax_num(acc, abs_f32(x)); }

// --- FP8 per-tensor current scaling and block scaling (formats.md §2.0, §2.3, §2.4) ----------

// TE's compute_scale_from_amax, line for line (recipe_common.cuh):
//   amax < eps        → amax = eps (a NaN amax compares false and stays NaN)
//   amax ∈ {0,inf,NaN} → 1
//   s = RN(fmax / amax); s == +inf → value_for_inf; pow2 → keep sign and exponent bits only.
// value_for_inf is FLT_MAX for current scaling and the max finite of the *input* dtype for
// block scaling (bf16: 0x7F7F0000).
LOWBIT_HD float compute_scale_from_amax(float amax, float fmax, bool pow2, float eps,
                                        float value_for_inf) {
  if (amax < eps) amax = eps;
  if (f32_is_inf(amax) || amax == 0.0f || f32_is_nan(amax)) return 1.0f;
  float s = div_rn(fmax, amax);
  if (f32_is_inf(s) && s > 0.0f) s = value_for_inf;
  // Dropping the mantissa rounds down to a power of two, so amax · s ≤ fmax still holds.
  if (pow2) s = f32_from_bits(f32_bits(s) & 0xFF800000u);
  return s;
}

// scale_inv = RN(1 / scale) (__frcp_rn; the block kernels' double division rounds to the same).
LOWBIT_HD float scale_inv_from_scale(float scale) { return rcp_rn(scale); }

// --- FP8 delayed scaling (formats.md §2.2) ----------------------------------------------------

// fp8_max · 2^-margin, one fp32 rounding (exact for the margins accepted by the state).
LOWBIT_HD float delayed_scaled_max(float fmax, int margin) { return mul_rn(fmax, pow2f(-margin)); }

// New scale from the reduced amax `a` (max of the history or the most recent amax):
// a finite and > 0 → RN(scaled_max / a), else the previous scale; +inf → FLT_MAX.
LOWBIT_HD float delayed_scale_from_amax(float a, float scaled_max, float prev_scale) {
  float s = (f32_is_finite(a) && a > 0.0f) ? div_rn(scaled_max, a) : prev_scale;
  if (f32_is_inf(s)) s = f32_max_finite();
  return s;
}

// One slot's history roll and scale update (formats.md §2.2, bulk-kernel semantics), shared by
// the CPU loop and the CUDA kernel. h: history [L, n] f32 row-major, slot column s; row 0 holds
// the (already reduced) amax of the step.
//   last != 0: a_max = max(H[1..L-1], last) with fmaxf (NaN skipped); roll left:
//              H'[i] = H[i+1] (1 ≤ i ≤ L-2), H'[L-1] = last, H'[0] = 0.
//   last == 0: (slot unused this step on every rank) nothing rotates, a_max = 0, scale kept.
// NaN != 0, so a NaN amax rotates (and `most_recent` then keeps the previous scale).
LOWBIT_HD void delayed_update_slot(float* h, int64_t len, int64_t n, int64_t s, bool algo_max,
                                   float scaled_max, float* scale, float* scale_inv) {
  const float last = h[s];
  float a_max = 0.0f;
  if (last != 0.0f) {
    for (int64_t i = 0; i < len; ++i) {
      const float a = i < len - 1 ? h[(i + 1) * n + s] : last;
      a_max = fmax_num(a_max, a);
      h[i * n + s] = i > 0 ? a : 0.0f;
    }
  }
  const float a = algo_max ? a_max : last;
  const float sc = delayed_scale_from_amax(a, scaled_max, scale[s]);
  scale[s] = sc;
  scale_inv[s] = scale_inv_from_scale(sc);
}

// --- MX (E8M0 block scales, formats.md §2.5) --------------------------------------------------

// How the shared exponent of an MX block is chosen.
enum class MxScaleRounding : uint8_t {
  kCeil,   // TE / cuBLAS "RCEIL": 2^ceil(log2(amax / fmax)); no element ever clips (default)
  kFloor,  // OCP MX v1.0: 2^(floor(log2 amax) - emax_elem); the largest elements may saturate
};

// Exponent of the largest normal of an MX element type (formats.md §2.5 "emax_elem").
LOWBIT_HD int mx_element_emax(DType t) {
  switch (t) {
    case DType::kE4M3: return 8;
    case DType::kE5M2: return 15;
    case DType::kE3M2: return 4;
    case DType::kE2M3: return 2;
    case DType::kE2M1: return 2;
    default: return 0;
  }
}

// floor(log2 |x|) of a finite non-zero fp32, subnormals included.
LOWBIT_HD int f32_floor_log2(float x) {
  const uint32_t a = f32_bits(x) & 0x7FFFFFFFu;
  if (a >= 0x00800000u) return static_cast<int>(a >> 23) - 127;
  int msb = 22;
  while (msb > 0 && !((a >> msb) & 1u)) --msb;
  return msb - 149;
}

// TE's MXFP8 scale: e = float_to_e8m0(RN(amax · RN(1/fmax))) with ceil rounding (cvt.rp).
// amax = 0 → 0x00 (2^-127), inf → 0xFE, NaN → 0xFF. For every MX element type this equals
// ceil(log2(amax/fmax)) for every bf16 amax (formats.md §2.5; exhaustive check in the tests).
LOWBIT_HD uint8_t mx_scale_ceil(float amax, float fmax) {
  return encode_e8m0(mul_rn(amax, rcp_rn(fmax)), E8M0Rounding::kCeil);
}

// OCP MX v1.0 scale: shared exponent floor(log2 amax) - emax_elem, clamped below at -127;
// amax = 0 → 0x00; inf/NaN amax → 0xFF (NaN scale, as the OCP reference emulator does).
LOWBIT_HD uint8_t mx_scale_floor(float amax, int emax_elem) {
  if (!f32_is_finite(amax)) return 0xFF;
  if (amax == 0.0f) return 0x00;
  int shared = f32_floor_log2(amax) - emax_elem;
  if (shared < -127) shared = -127;
  if (shared > 127) return 0xFF;  // unreachable for finite fp32 amax; kept for the spec
  return static_cast<uint8_t>(shared + 127);
}

LOWBIT_HD uint8_t mx_scale(float amax, DType elem, MxScaleRounding r) {
  return r == MxScaleRounding::kCeil ? mx_scale_ceil(amax, dtype_max_finite(elem))
                                     : mx_scale_floor(amax, mx_element_emax(elem));
}

// Exact quantization multiplier 2^(127-e) of an E8M0 scale (formats.md §2.5): bits
// ((254-e) << 23) for e ≤ 253; e = 254 gives the fp32 subnormal 2^-127 (0x00400000), which a
// plain shift would get wrong; e = 255 (NaN scale) gives NaN.
LOWBIT_HD float mx_multiplier(uint8_t e) {
  if (e == 0xFF) return f32_from_bits(0x7FC00000u);
  if (e == 0xFE) return f32_from_bits(0x00400000u);
  return f32_from_bits(static_cast<uint32_t>(254u - e) << 23);
}

// --- NVFP4 (formats.md §2.6) ------------------------------------------------------------------

struct Nvfp4GlobalScale {
  float s_enc;  // RN(2688 / A), 1 for A ∈ {0, inf}
  float s_dec;  // RN(1 / s_enc)
  float k;      // RN(s_enc · RN(1/6)): block amax → block scale
};

// Global encode scale from the tensor amax A, in the kernels' order. A NaN amax gives
// s_enc = FLT_MAX as in the plain cast kernels (fminf drops NaN); the RHT-fused kernels would
// propagate NaN instead — amaxes computed here never are NaN (amax_combine skips NaN).
LOWBIT_HD Nvfp4GlobalScale nvfp4_global_scale(float amax) {
  Nvfp4GlobalScale g;
  g.s_enc = fmin_num(div_rn(2688.0f, amax), f32_max_finite());  // 2688 = 448 · 6, exact
  if (amax == 0.0f || g.s_enc == 0.0f) g.s_enc = 1.0f;
  g.s_dec = rcp_rn(g.s_enc);
  g.k = mul_rn(g.s_enc, rcp_rn(6.0f));  // RN(1/6) = 0.16666667163372040
  return g;
}

// Stored block scale sd = ue4m3_satfinite(RN(block_amax · k)); the transpose kernels clamp to
// FLT_MAX first, which gives the same code (inf saturates to 448 anyway).
LOWBIT_HD uint8_t nvfp4_block_scale(float block_amax, float k) {
  const float v = fmin_num(mul_rn(block_amax, k), f32_max_finite());
  return static_cast<uint8_t>(encode_rn(DType::kUE4M3, v));
}

// Quantization multiplier of a block: fminf(RN(1 / RN(float(sd) · s_dec)), FLT_MAX);
// sd = 0 gives +inf → FLT_MAX (every element of such a block dequantizes to 0).
LOWBIT_HD float nvfp4_block_multiplier(uint8_t sd, float s_dec) {
  return fmin_num(rcp_rn(mul_rn(decode(DType::kUE4M3, sd), s_dec)), f32_max_finite());
}

// Dequantization factor of a block: RN(RN(float(sd) · A) · RN(1/2688)) — uses the stored amax,
// not s_dec (TE's dequantize kernel; the two can differ by an ulp).
LOWBIT_HD float nvfp4_dequant_factor(uint8_t sd, float amax) {
  return mul_rn(mul_rn(decode(DType::kUE4M3, sd), amax), rcp_rn(2688.0f));
}

// --- elements ---------------------------------------------------------------------------------

// --- stochastic-rounding bits (formats.md §5.1) -------------------------------------------------

// Whether element type t rounds stochastically with 8 random bits per value instead of 32: E2M1,
// as sm_100's cvt.rs.satfinite.e2m1x4 does (8 bits per value) and TE's emulation of it.
LOWBIT_HD constexpr bool sr_takes_a_byte(DType t) { return t == DType::kE2M1; }

// The 32-bit `rbits` for random byte b: b in the top 8 bits and the midpoint of the remaining 24
// (0x800000). The SR encoders (e2m1_encode_sr, encode_sr) round up when the fraction's bits
// exceed rbits' top bits, which then holds for round(256 · frac) of the 256 bytes (ties aside):
// P(up) is frac to within 1/512 of a quantum; without the midpoint it would be
// ceil(256 · frac) / 256, up to 1/256 high every time.
LOWBIT_HD uint32_t sr_bits_of_byte(uint32_t b) { return (b << 24) | 0x800000u; }

// The SR bits of byte j (0..15) of a Philox block: byte j % 4 of word j / 4.
LOWBIT_HD uint32_t sr_bits_in_block(const Philox4& b, uint32_t j) {
  return sr_bits_of_byte((b.v[(j >> 2) & 3u] >> (8u * (j & 3u))) & 0xFFu);
}

// The SR bits of logical element `idx` of stream (seed, offset) for element type t. E2M1: byte
// idx % 4 of word (idx / 4) % 4 of Philox block idx / 16 (one block serves 16 consecutive
// elements, 4× fewer blocks than a word per element); other types: philox_uint32(idx).
LOWBIT_HD uint32_t sr_bits(DType t, uint64_t seed, uint64_t offset, uint64_t idx) {
  if (sr_takes_a_byte(t)) {
    return sr_bits_in_block(philox_block(seed, offset, idx >> 4), uint32_t(idx & 15u));
  }
  return philox_uint32(seed, offset, idx);
}

// One element: code = cvt_sat(t, RN(x · mult)), round to nearest even, or stochastic rounding
// with `rbits` = sr_bits(t, …) of the element when `stochastic`: E2M1 by e2m1_encode_sr
// (e2m1_fast.h), the other types by formats.h encode_sr.
LOWBIT_HD uint32_t quantize_element(DType t, float x, float mult, bool stochastic, uint32_t rbits) {
  const float v = mul_rn(x, mult);
  if (!stochastic) return encode_rn(t, v);
  return t == DType::kE2M1 ? e2m1_encode_sr(v, rbits) : encode_sr(t, v, rbits);
}

// E2M1 code of x, round to nearest even with saturation: equal to encode_rn(DType::kE2M1, x)
// for every fp32 input (checked exhaustively over all 2^32 patterns), in about a dozen integer
// and fp32 instructions instead of the generic codec. The quantum of |x| on the E2M1 grid is
// q = 0.5 · 2^k with k = clamp(exponent(|x|), 0, 2) (0.5 below 2, 1 in [2, 4), 2 above);
// one fp32 add of C = 1.5 · 2^23 · q rounds |x| to a multiple n·q, ties to even (C's binade has
// ulp q, its mantissa LSB is 0, so the LSB of the sum is the parity of n), and n = bits(sum) -
// bits(C). The code is n + 2k (code n·q for k = 0; 2 + n, 4 + n above), saturated at 7 (6.0),
// which also covers inf and NaN (their sums compare above every C). The sign bit is kept for
// every non-NaN input (-0 and tiny negatives give 0x8); NaN gives 0x7.
LOWBIT_HD uint32_t e2m1_rn_fast(float x) {
  const uint32_t xb = f32_bits(x);
  const uint32_t u = xb & 0x7FFFFFFFu;
  int k = int(u >> 23) - 127;
  k = k < 0 ? 0 : (k > 2 ? 2 : k);
  const uint32_t cb = (uint32_t(149 + k) << 23) | 0x400000u;  // 1.5 · 2^(22 + k)
  const uint32_t n = f32_bits(add_rn(f32_from_bits(u), f32_from_bits(cb))) - cb;
  uint32_t code = n + 2u * uint32_t(k);
  code = code < 7u ? code : 7u;
  const uint32_t sign = u > 0x7F800000u ? 0u : (xb >> 28) & 0x8u;
  return code | sign;
}

}  // namespace lowbit

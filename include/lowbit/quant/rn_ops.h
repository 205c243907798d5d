// Single fp32 operations, each rounded to nearest even exactly once (formats.md §0: "RN").
//
// The scale formulas of formats.md §2 are sequences of separate fp32 roundings; a fused
// multiply-add or a wider intermediate changes the last bit of a scale. On the device these
// helpers are the `_rn` intrinsics, which nvcc never contracts into FMAs and fast-math never
// approximates. On the host they are plain fp32 operations (SSE/NEON, IEEE binary32); the quant
// sources and tests are compiled with -ffp-contract=off (CMakeLists.txt), and clang also honours
// the pragma below, so no caller expression such as `mul_rn(a, b) + c` becomes an FMA.
#pragma once

#include <cmath>
#include <cstdint>

#include "lowbit/core/hd.h"
#include "lowbit/formats.h"

#if defined(__clang__) && !defined(__CUDA_ARCH__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace lowbit {

LOWBIT_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

LOWBIT_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

LOWBIT_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

LOWBIT_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// RN(a · b + c) with ONE rounding of the exact value (a fused multiply-add; std::fma on the
// host is correctly rounded too). Never a stand-in for mul_rn + add_rn: each caller states why
// the single rounding is the operation it needs (an exact product, or a rounding to a grid).
LOWBIT_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The correctly rounded square root (IEEE binary32 on both sides).
LOWBIT_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// RN(1 / a), as __frcp_rn.
LOWBIT_HD float rcp_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(a);
#else
  return 1.0f / a;
#endif
}

// fmaxf / fminf semantics (IEEE maxNum / minNum): a NaN operand is dropped when the other is a
// number. On the device these are the single-instruction fmaxf / fminf, which have exactly
// these semantics; on the host they are written out so as not to depend on <cmath> overloads.
LOWBIT_HD float fmax_num(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  if (f32_is_nan(a)) return b;
  if (f32_is_nan(b)) return a;
  return a > b ? a : b;
#endif
}

LOWBIT_HD float fmin_num(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fminf(a, b);
#else
  if (f32_is_nan(a)) return b;
  if (f32_is_nan(b)) return a;
  return a < b ? a : b;
#endif
}

LOWBIT_HD float abs_f32(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);  // clears the sign bit, as below (a free operand modifier on the device)
#else
  return f32_from_bits(f32_bits(x) & 0x7FFFFFFFu);
#endif
}

// Largest finite fp32 (FLT_MAX).
LOWBIT_HD float f32_max_finite() { return f32_from_bits(0x7F7FFFFFu); }

}  // namespace lowbit

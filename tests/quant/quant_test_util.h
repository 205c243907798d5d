// Helpers shared by the quant tests: building bf16/f32 inputs, fills, reading payload codes, and
// the per-element error bounds derived from the element formats.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/formats.h"
#include "lowbit/quant.h"

namespace lowbit::quant_test {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// quantize() on the CPU, then validate() the result.
inline QuantizedTensor run(const TensorView& x, const QuantConfig& cfg) {
  Context ctx(Device::cpu());
  QuantizedTensor q;
  quantize(ctx, x, cfg, q);
  q.validate();
  return q;
}

inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16_rn(x)); }

// [M, K] bf16 with x[i][j] = bf16(f(i, j)).
inline Tensor make_bf16(int64_t m, int64_t k, const std::function<float(int64_t, int64_t)>& f) {
  Tensor t = Tensor::empty({m, k}, DType::kBF16, Device::cpu());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) t.ptr<uint16_t>()[i * k + j] = f32_to_bf16_rn(f(i, j));
  }
  return t;
}

// [M, K] f32 with x[i][j] = f(i, j).
inline Tensor make_f32(int64_t m, int64_t k, const std::function<float(int64_t, int64_t)>& f) {
  Tensor t = Tensor::empty({m, k}, DType::kF32, Device::cpu());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) t.ptr<float>()[i * k + j] = f(i, j);
  }
  return t;
}

// Row-major bf16 [M, K] from a list of values.
inline Tensor bf16_from(int64_t m, int64_t k, const std::vector<float>& v) {
  return make_bf16(m, k, [&](int64_t i, int64_t j) { return v[static_cast<size_t>(i * k + j)]; });
}

inline float value_at(const TensorView& x, int64_t i, int64_t j) {
  const int64_t off = i * x.strides[0] + j * x.strides[1];
  return x.dtype == DType::kBF16 ? bf16_to_f32(x.ptr<const uint16_t>()[off])
                                 : x.ptr<const float>()[off];
}

// Payload code of element idx (E2M1 nibbles unpacked).
inline uint32_t code_at(const Tensor& data, int64_t idx) {
  const uint8_t* p = data.ptr<const uint8_t>();
  if (data.dtype() == DType::kE2M1) return e2m1_unpack(p[idx >> 1], static_cast<int>(idx & 1));
  return p[idx];
}

// Deterministic fills.
enum class Fill { kGaussian, kHeavyTailed, kZeros, kSubnormal, kNearMax, kSpecials };

// bf16-representable values of a fill (`fmax` = element max, used by kNearMax).
inline std::function<float(int64_t, int64_t)> fill_fn(Fill fill, uint64_t seed, float fmax = 448) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  auto normal = std::make_shared<std::normal_distribution<double>>(0.0, 1.0);
  auto uni = std::make_shared<std::uniform_real_distribution<double>>(0.0, 1.0);
  switch (fill) {
    case Fill::kGaussian:
      return [=](int64_t, int64_t) { return static_cast<float>((*normal)(*rng)); };
    case Fill::kHeavyTailed:  // Student t with 2 degrees of freedom: tails ~ |x|^-3
      return [=](int64_t, int64_t) {
        const double z = (*normal)(*rng);
        double c = 0;
        for (int t = 0; t < 2; ++t) c += std::pow((*normal)(*rng), 2);
        return static_cast<float>(z / std::sqrt(c / 2 + 1e-30));
      };
    case Fill::kZeros: return [](int64_t, int64_t) { return 0.0f; };
    case Fill::kSubnormal:  // bf16 subnormals (below 2^-126), both signs
      return [=](int64_t, int64_t) {
        const float mag = static_cast<float>((*uni)(*rng)) * std::ldexp(1.0f, -126);
        return ((*rng)() & 1) ? -mag : mag;
      };
    case Fill::kNearMax:  // around and above the element max
      return [=](int64_t, int64_t) {
        const float v = fmax * static_cast<float>(0.9 + 0.3 * (*uni)(*rng));
        return ((*rng)() & 1) ? -v : v;
      };
    case Fill::kSpecials:  // Gaussian with ±inf and NaN sprinkled in
      return [=](int64_t, int64_t) {
        const uint64_t r = (*rng)() % 16;
        if (r == 0) return std::numeric_limits<float>::infinity();
        if (r == 1) return -std::numeric_limits<float>::infinity();
        if (r == 2) return std::numeric_limits<float>::quiet_NaN();
        return static_cast<float>((*normal)(*rng));
      };
  }
  return {};
}

// Rounding error of one RN cast of a scaled value v to `t`: half a quantum of v's binade (at
// most |v| · 2^-(mbits+1) in the normal range), half the subnormal quantum below it.
inline double element_rn_error(DType t, double v) {
  const MiniFloatSpec s = minifloat_spec(t);
  const int emin = 1 - s.bias;
  const double a = std::fabs(v);
  const int e = a > 0 ? std::max(static_cast<int>(std::floor(std::log2(a))), emin) : emin;
  return std::ldexp(1.0, e - s.mbits - 1);
}

}  // namespace lowbit::quant_test

namespace lowbit::quant_test {

// Dequantization factor of element (r, c) of a stored copy (rows r of the stored orientation),
// read from the scale layouts of quant_layout() (docs/quantization.md).
inline float dequant_factor_at(const QuantizedTensor& q, Usage u, int64_t r, int64_t c) {
  const bool row = u == Usage::kRowwise;
  const Tensor& data = row ? q.rowwise_data : q.columnwise_data;
  const Tensor& s = row ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  const int64_t rows = data.shape()[0], cols = data.shape()[1];
  switch (q.mode) {
    case ScalingMode::kPerTensor: return s.ptr<const float>()[0];
    case ScalingMode::kBlock1x128:
      return s.ptr<const float>()[(c / 128) * ((rows + 3) / 4 * 4) + r];
    case ScalingMode::kBlock128x128: {
      const int64_t kb = (cols + 127) / 128;
      return s.ptr<const float>()[(r / 128) * ((kb + 3) / 4 * 4) + c / 128];
    }
    case ScalingMode::kMX1x32:  // [rows, cols / 32] of either stored copy
      return decode_e8m0(s.ptr<const uint8_t>()[r * (cols / 32) + c / 32]);
    case ScalingMode::kNVFP4_1x16:
    case ScalingMode::kNVFP4_16x16: {
      const float amax = (row ? q.amax : q.columnwise_amax).ptr<const float>()[0];
      const float sd = decode(DType::kUE4M3, s.ptr<const uint8_t>()[r * (cols / 16) + c / 16]);
      return static_cast<float>(static_cast<double>(sd) * amax / 2688.0);
    }
  }
  return 0;
}

struct RoundTripStats {
  int64_t checked = 0;           // finite elements compared
  int64_t normal = 0;            // of which scaled into the element's normal range
  double max_rel_normal = 0;     // max |deq - x| / |x| over those
  int64_t nonfinite_factor = 0;  // elements skipped: their block's factor is inf/NaN
};

// Checks every finite element of a stored copy against the reference `ref` (same orientation,
// row-major f32): |deq - x| ≤ f · (half quantum of the element format at |x/f| + overflow
// beyond fmax) + a few fp32 roundings; for elements scaled into the normal range also the
// relative bound |deq - x| ≤ |x| · 2^-(mbits+1). Stochastic rounding may move a value by a
// whole quantum, so `stochastic` doubles both bounds. Returns statistics; failures are gtest
// errors.
inline RoundTripStats check_round_trip(const QuantizedTensor& q, Usage u,
                                       const std::vector<float>& ref, bool stochastic = false) {
  const Tensor deq = dequantize(q, u);
  const int64_t rows = deq.shape()[0], cols = deq.shape()[1];
  const MiniFloatSpec spec = minifloat_spec(q.dtype);
  const double fmax = dtype_max_finite(q.dtype);
  const double min_normal = std::ldexp(1.0, 1 - spec.bias);
  const double sr_factor = stochastic ? 2.0 : 1.0;
  const double rel = std::ldexp(1.0, -(spec.mbits + 1)) * sr_factor;
  const double slack = std::ldexp(1.0, -18);  // a few fp32 roundings of scales and products
  RoundTripStats st;
  int failures = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double x = ref[static_cast<size_t>(r * cols + c)];
      if (!std::isfinite(x)) continue;
      const double d = deq.ptr<const float>()[r * cols + c];
      const double f = dequant_factor_at(q, u, r, c);
      // A non-finite factor (OCP-floor NaN scale of a block holding inf, NVFP4 tensor amax inf)
      // makes the whole block non-finite by definition: nothing to bound.
      if (!std::isfinite(f)) {
        ++st.nonfinite_factor;
        continue;
      }
      const double err = std::fabs(d - x);
      ++st.checked;
      double bound;
      if (f == 0) {  // NVFP4 block scale flushed to zero: everything dequantizes to 0
        bound = std::fabs(x);
      } else {
        const double v = std::fabs(x) / f * (1 + slack);
        bound = f * (sr_factor * element_rn_error(q.dtype, v) + std::max(0.0, v - fmax)) +
                std::fabs(x) * slack;
        if (v >= min_normal * (1 + slack) && v <= fmax) {
          ++st.normal;
          st.max_rel_normal = std::max(st.max_rel_normal, x != 0 ? err / std::fabs(x) : 0);
          bound = std::min(bound, std::fabs(x) * rel * (1 + slack));
        }
      }
      if (!(err <= bound) && failures++ < 5) {
        ADD_FAILURE() << q.str() << (u == Usage::kRowwise ? " rowwise" : " columnwise") << " (" << r
                      << ", " << c << "): x = " << x << ", dequantized " << d << ", error " << err
                      << " > bound " << bound << " (factor " << f << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0);
  return st;
}

// The source as f32, [M, K] or transposed [K, M].
inline std::vector<float> source_f32(const TensorView& x, bool transposed) {
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<float> v(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      v[static_cast<size_t>(transposed ? j * m + i : i * k + j)] = value_at(x, i, j);
    }
  }
  return v;
}

}  // namespace lowbit::quant_test

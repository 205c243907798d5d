// Helpers shared by the gemm tests (CPU and GPU): operands per role and recipe, and the error
// bounds of a backend's result against gemm_reference_f64, derived from the output format.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gemm/gemm_internal.h"
#include "lowbit/gemm.h"
#include "quant/quant_test_util.h"

namespace lowbit::gemm_test {

// --- tolerances ---------------------------------------------------------------------------------
//
// A backend result against the f64 reference over the same dequantized operands (exact in f32):
//   accumulation: |acc - ref| ≤ (Kc + 3) · accum_unit · (|alpha| Σ_j |a_j b_j| + |beta · C| +
//                 |bias|)   (Kc products and sums plus the alpha, beta and bias steps, each one
//                 rounding of unit accum_unit; the standard γ_n bound of a dot product);
//   output:       one RN rounding to the output format: |out - acc| ≤ out_unit · |acc| + tiny;
//   NMSE:         Σ (out - ref)² ≤ nmse · Σ ref² over the finite entries.
struct GemmTolerance {
  double accum_unit;  // unit roundoff of the accumulation
  double out_unit;    // unit roundoff of the output cast (0: no cast)
  double nmse;
};

// Keyed by (backend × output dtype); a key missing from the table is a test failure.
inline const GemmTolerance* find_tolerance(GemmBackend backend, DType out) {
  struct Row {
    GemmBackend backend;
    DType out;
    GemmTolerance tol;
  };
  static const Row kTable[] = {
      // f32 sgemm: u = 2^-24, no output cast.
      {GemmBackend::kCpuReference, DType::kF32, {std::ldexp(1.0, -24), 0.0, 1e-10}},
      // The same accumulation, then one bf16 RNE rounding (u = 2^-8): every element's relative
      // error is at most u (plus the f32 part), so NMSE ≤ u² = 2^-16 even for a single element.
      {GemmBackend::kCpuReference,
       DType::kBF16,
       {std::ldexp(1.0, -24), std::ldexp(1.0, -8), std::ldexp(1.0, -16) * 1.001}},
  };
  for (const Row& r : kTable) {
    if (r.backend == backend && r.out == out) return &r.tol;
  }
  return nullptr;
}

// Σ_j |A'[r, j]| · |B'[c, j]| of the canonical problem, [R, C] row-major.
inline std::vector<double> abs_products(const GemmOperand& a, const GemmOperand& b,
                                        const GemmOptions& opt) {
  const CanonGemm g = canonicalize_operands(a, b, opt);
  const std::vector<float> am = canon_operand_f32(g.a), bm = canon_operand_f32(g.b);
  std::vector<double> s(static_cast<size_t>(g.R * g.C));
  for (int64_t r = 0; r < g.R; ++r) {
    for (int64_t c = 0; c < g.C; ++c) {
      double t = 0;
      for (int64_t j = 0; j < g.Kc; ++j) {
        t += std::fabs(static_cast<double>(am[static_cast<size_t>(r * g.Kc + j)]) *
                       bm[static_cast<size_t>(c * g.Kc + j)]);
      }
      s[static_cast<size_t>(r * g.C + c)] = t;
    }
  }
  return s;
}

// Host values of a 2-D bf16 or f32 tensor (copied from the GPU when needed), row-major.
inline std::vector<double> values_f64(const TensorView& t) {
  Tensor host;
  TensorView v = t;
  if (!t.device.is_cpu()) {
    host = Tensor::copy_of(t, Device::cpu());
    v = host.view();
  }
  std::vector<double> r(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.size(0); ++i) {
    for (int64_t j = 0; j < v.size(1); ++j) {
      r[static_cast<size_t>(i * v.size(1) + j)] = quant_test::value_at(v, i, j);
    }
  }
  return r;
}

struct CheckStats {
  double nmse = 0;
  double max_err = 0;
  int64_t nonfinite = 0;
};

// Checks `out` (the backend's result) against the f64 reference with the tolerance of
// (backend, out dtype). `before` holds out's values before the call (beta ≠ 0).
inline CheckStats check_against_reference(const GemmOperand& a, const GemmOperand& b,
                                          const GemmOptions& opt, GemmBackend backend,
                                          const TensorView& out, const TensorView* before = nullptr,
                                          const std::string& what = "") {
  CheckStats st;
  const GemmTolerance* tol = find_tolerance(backend, out.dtype);
  if (tol == nullptr) {
    ADD_FAILURE() << what << ": no tolerance for backend " << gemm_backend_name(backend) << " with "
                  << dtype_name(out.dtype) << " out";
    return st;
  }
  const std::vector<double> ref = gemm_reference_f64(a, b, opt, before);
  const std::vector<double> absp = abs_products(a, b, opt);
  const std::vector<double> got = values_f64(out);
  std::vector<double> prev, bias;
  if (before != nullptr && opt.beta != 0.0f) prev = values_f64(*before);
  if (opt.bias != nullptr) bias = values_f64(opt.bias->reshape({1, opt.bias->numel()}));
  const CanonGemm g = canonicalize_operands(a, b, opt);
  double se = 0, sr = 0;
  int failures = 0;
  for (int64_t r = 0; r < g.R; ++r) {
    for (int64_t c = 0; c < g.C; ++c) {
      const size_t i = static_cast<size_t>(r * g.C + c);
      const double x = ref[i], y = got[i];
      if (!std::isfinite(x)) {
        ++st.nonfinite;
        const bool ok = std::isnan(x) ? std::isnan(y) : y == x;
        if (!ok && failures++ < 5) {
          ADD_FAILURE() << what << " (" << r << ", " << c << "): reference " << x << ", got " << y;
        }
        continue;
      }
      double mag = std::fabs(opt.alpha) * absp[i];
      if (!prev.empty()) mag += std::fabs(opt.beta * prev[i]);
      if (!bias.empty()) mag += std::fabs(bias[static_cast<size_t>(c)]);
      const double acc_err = static_cast<double>(g.Kc + 3) * tol->accum_unit * mag;
      const double bound = acc_err + tol->out_unit * (std::fabs(x) + acc_err) + 1e-40;
      const double err = std::fabs(y - x);
      st.max_err = std::max(st.max_err, err);
      se += err * err;
      sr += x * x;
      if (!(err <= bound) && failures++ < 5) {
        ADD_FAILURE() << what << " (" << r << ", " << c << "): reference " << x << ", got " << y
                      << ", error " << err << " > bound " << bound;
      }
    }
  }
  st.nmse = sr > 0 ? se / sr : 0;
  if (sr > 0) {
    EXPECT_LE(st.nmse, tol->nmse) << what;
  } else {
    EXPECT_EQ(se, 0.0) << what;
  }
  EXPECT_EQ(failures, 0) << what;
  return st;
}

// --- operands ---------------------------------------------------------------------------------

// The natural shapes of a role's operands for a layer with M tokens, K inputs, N outputs.
inline Shape natural_a(GemmRole role, int64_t m, int64_t n, int64_t k) {
  return role == GemmRole::kFprop ? Shape{m, k} : Shape{m, n};  // X or dY
}
inline Shape natural_b(GemmRole role, int64_t m, int64_t n, int64_t k) {
  return role == GemmRole::kWgrad ? Shape{m, k} : Shape{n, k};  // X or W
}
// The output shape [R, C].
inline Shape out_shape(GemmRole role, int64_t m, int64_t n, int64_t k) {
  switch (role) {
    case GemmRole::kFprop: return {m, n};
    case GemmRole::kDgrad: return {m, k};
    case GemmRole::kWgrad: return {n, k};
  }
  return {};
}

// The role's result computed straight from the natural matrices (row-major doubles): an
// orientation check independent of the canonical form.
inline std::vector<double> natural_product(GemmRole role, const std::vector<double>& a,
                                           const Shape& as, const std::vector<double>& b,
                                           const Shape& bs) {
  std::vector<double> out;
  if (role == GemmRole::kFprop) {  // X [M, K] · W [N, K]ᵀ
    const int64_t m = as[0], k = as[1], n = bs[0];
    out.assign(static_cast<size_t>(m * n), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t o = 0; o < n; ++o)
        for (int64_t j = 0; j < k; ++j) out[i * n + o] += a[i * k + j] * b[o * k + j];
  } else if (role == GemmRole::kDgrad) {  // dY [M, N] · W [N, K]
    const int64_t m = as[0], n = as[1], k = bs[1];
    out.assign(static_cast<size_t>(m * k), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t o = 0; o < n; ++o)
        for (int64_t j = 0; j < k; ++j) out[i * k + j] += a[i * n + o] * b[o * k + j];
  } else {  // dY [M, N]ᵀ · X [M, K]
    const int64_t m = as[0], n = as[1], k = bs[1];
    out.assign(static_cast<size_t>(n * k), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t o = 0; o < n; ++o)
        for (int64_t j = 0; j < k; ++j) out[o * k + j] += a[i * n + o] * b[i * k + j];
  }
  return out;
}

// Quantization configs of a recipe for X, W and dY.
struct Recipe {
  std::string name;
  QuantConfig x, w, dy;
  int64_t multiple = 1;  // every dim of the test shapes is a multiple of this
};

inline std::vector<Recipe> all_recipes() {
  std::vector<Recipe> r;
  r.push_back({"fp8_current_e4m3", QuantConfig::fp8_current(DType::kE4M3),
               QuantConfig::fp8_current(DType::kE4M3), QuantConfig::fp8_current(DType::kE4M3)});
  r.push_back({"fp8_current_hybrid", QuantConfig::fp8_current(DType::kE4M3),
               QuantConfig::fp8_current(DType::kE4M3), QuantConfig::fp8_current(DType::kE5M2)});
  r.push_back({"fp8_block", QuantConfig::fp8_block_1x128(DType::kE4M3),
               QuantConfig::fp8_block_128x128(DType::kE4M3),
               QuantConfig::fp8_block_1x128(DType::kE4M3)});
  r.push_back({"fp8_block_hybrid", QuantConfig::fp8_block_1x128(DType::kE4M3),
               QuantConfig::fp8_block_128x128(DType::kE4M3),
               QuantConfig::fp8_block_1x128(DType::kE5M2)});
  r.push_back({"mxfp8", QuantConfig::mx(DType::kE4M3), QuantConfig::mx(DType::kE4M3),
               QuantConfig::mx(DType::kE4M3), 32});
  r.push_back({"mxfp8_hybrid", QuantConfig::mx(DType::kE4M3), QuantConfig::mx(DType::kE4M3),
               QuantConfig::mx(DType::kE5M2), 32});
  r.push_back({"mxfp4", QuantConfig::mx(DType::kE2M1), QuantConfig::mx(DType::kE2M1),
               QuantConfig::mx(DType::kE2M1), 32});
  r.push_back({"nvfp4", QuantConfig::nvfp4_activation(), QuantConfig::nvfp4_weight(),
               QuantConfig::nvfp4_gradient(), 16});
  return r;
}

// Which config quantizes operand A / B of a role.
inline const QuantConfig& config_a(const Recipe& r, GemmRole role) {
  return role == GemmRole::kFprop ? r.x : r.dy;
}
inline const QuantConfig& config_b(const Recipe& r, GemmRole role) {
  return role == GemmRole::kWgrad ? r.x : r.w;
}

inline constexpr GemmRole kAllRoles[] = {GemmRole::kFprop, GemmRole::kDgrad, GemmRole::kWgrad};

}  // namespace lowbit::gemm_test

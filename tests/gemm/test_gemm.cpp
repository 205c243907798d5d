// The CPU gemm backend against the f64 reference: every role with bf16 operands and with every
// recipe's quantized operands, adversarial data, non-finite propagation, alpha/beta/bias, the
// backend and fast-accumulation policy, and every user-error path (formats.md §3–§4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "gemm/gemm_test_util.h"
#include "user_error.h"

namespace lowbit {
namespace {

using test_util::user_error;

using namespace gemm_test;
using quant_test::Fill;

using FillFn = std::function<float(int64_t, int64_t)>;

// Adversarial and ordinary data, bf16-representable.
enum class Data { kGaussian, kHeavyTailed, kOutliers, kEqualRows, kZeros };

const char* data_name(Data d) {
  switch (d) {
    case Data::kGaussian: return "gaussian";
    case Data::kHeavyTailed: return "heavy_tailed";
    case Data::kOutliers: return "outliers";
    case Data::kEqualRows: return "equal_rows";
    case Data::kZeros: return "zeros";
  }
  return "?";
}

FillFn data_fn(Data d, uint64_t seed) {
  switch (d) {
    case Data::kGaussian: return quant_test::fill_fn(Fill::kGaussian, seed);
    case Data::kHeavyTailed: return quant_test::fill_fn(Fill::kHeavyTailed, seed);
    case Data::kOutliers: {
      auto g = quant_test::fill_fn(Fill::kGaussian, seed);
      return [g](int64_t i, int64_t j) {
        const float v = g(i, j);
        return (i * 31 + j * 17) % 97 == 5 ? v * 3000.0f : v;
      };
    }
    case Data::kEqualRows:  // every row constant, rows differ (and one row is zero)
      return [](int64_t i, int64_t) { return static_cast<float>((i % 7) - 3) * 0.375f; };
    case Data::kZeros: return quant_test::fill_fn(Fill::kZeros, seed);
  }
  return {};
}

Tensor make(const Shape& s, const FillFn& f) { return quant_test::make_bf16(s[0], s[1], f); }

QuantizedTensor quantize_cpu(const TensorView& x, const QuantConfig& cfg) {
  return quant_test::run(x, cfg);
}

// Runs gemm on the CPU into a fresh `out_dtype` output and checks it against the reference.
Tensor run_checked(const GemmOperand& a, const GemmOperand& b, const GemmOptions& opt,
                   DType out_dtype, const std::string& what) {
  Context ctx(Device::cpu());
  const CanonGemm g = canonicalize_operands(a, b, opt);
  Tensor out = Tensor::empty({g.R, g.C}, out_dtype, Device::cpu());
  fill_bytes(out, 0xFF);  // NaN garbage: beta = 0 must not read it
  EXPECT_EQ(gemm_backend_for(ctx, a, b), GemmBackend::kCpuReference);
  gemm(ctx, a, b, out, opt);
  check_against_reference(a, b, opt, GemmBackend::kCpuReference, out, nullptr, what);
  return out;
}

struct Dims {
  int64_t m, n, k;
};

std::string dims_str(const Dims& d) { return fmt::format("M={} N={} K={}", d.m, d.n, d.k); }

// --- bf16 operands ----------------------------------------------------------------------------

TEST(GemmCpu, Bf16EveryRoleShapeAndData) {
  const Dims dims[] = {{1, 1, 1}, {37, 53, 71}, {130, 20, 257}, {64, 64, 64}};
  const Data datas[] = {Data::kGaussian, Data::kHeavyTailed, Data::kOutliers, Data::kEqualRows,
                        Data::kZeros};
  uint64_t seed = 1;
  for (GemmRole role : kAllRoles) {
    for (const Dims& d : dims) {
      for (Data data : datas) {
        const Shape as = natural_a(role, d.m, d.n, d.k), bs = natural_b(role, d.m, d.n, d.k);
        const Tensor a = make(as, data_fn(data, seed++));
        const Tensor b = make(bs, data_fn(Data::kGaussian, seed++));
        GemmOptions opt;
        opt.role = role;
        const std::string what =
            fmt::format("bf16 {} {} {}", gemm_role_name(role), dims_str(d), data_name(data));
        for (DType od : {DType::kF32, DType::kBF16}) {
          const Tensor out = run_checked(GemmOperand::of(a), GemmOperand::of(b), opt, od, what);
          // Orientation, independently of the canonical form.
          const std::vector<double> nat =
              natural_product(role, values_f64(a), as, values_f64(b), bs);
          const std::vector<double> ref =
              gemm_reference_f64(GemmOperand::of(a), GemmOperand::of(b), opt);
          ASSERT_EQ(nat.size(), ref.size());
          for (size_t i = 0; i < nat.size(); ++i) {
            ASSERT_NEAR(nat[i], ref[i], 1e-9 * (1 + std::fabs(nat[i]))) << what << " at " << i;
          }
          EXPECT_EQ(out.shape(), out_shape(role, d.m, d.n, d.k));
        }
      }
    }
  }
}

TEST(GemmCpu, F32AndStridedDenseOperands) {
  // f32 operands (CPU only) and a transposed (non-contiguous) bf16 view.
  const Tensor x = quant_test::make_f32(19, 33, quant_test::fill_fn(Fill::kGaussian, 3));
  const Tensor w_t = make({33, 24}, quant_test::fill_fn(Fill::kGaussian, 4));  // Wᵀ storage
  const TensorView w(w_t.data(), DType::kBF16, {24, 33}, {1, 24}, Device::cpu());
  GemmOptions opt;
  for (DType od : {DType::kF32, DType::kBF16}) {
    run_checked(GemmOperand::of(x), GemmOperand::of(w), opt, od, "f32 x strided bf16");
  }
  const std::vector<double> ref = gemm_reference_f64(GemmOperand::of(x), GemmOperand::of(w), opt);
  double e = 0;
  for (int64_t i = 0; i < 19; ++i) {
    for (int64_t o = 0; o < 24; ++o) {
      double s = 0;
      for (int64_t j = 0; j < 33; ++j) {
        s += static_cast<double>(x.ptr<float>()[i * 33 + j]) * quant_test::value_at(w, o, j);
      }
      e = std::max(e, std::fabs(s - ref[static_cast<size_t>(i * 24 + o)]));
    }
  }
  EXPECT_LT(e, 1e-9);
}

// --- quantized operands -----------------------------------------------------------------------

std::vector<Dims> recipe_dims(const Recipe& r) {
  if (r.multiple == 32) return {{32, 32, 32}, {64, 96, 160}};
  if (r.multiple == 16) return {{16, 16, 16}, {48, 32, 80}};
  return {{1, 1, 1}, {37, 53, 71}, {130, 20, 257}};
}

TEST(GemmCpu, QuantizedEveryRecipeRoleShapeAndData) {
  const Data datas[] = {Data::kGaussian, Data::kOutliers, Data::kEqualRows, Data::kZeros};
  uint64_t seed = 100;
  for (const Recipe& rc : all_recipes()) {
    for (GemmRole role : kAllRoles) {
      for (const Dims& d : recipe_dims(rc)) {
        for (Data data : datas) {
          const Shape as = natural_a(role, d.m, d.n, d.k), bs = natural_b(role, d.m, d.n, d.k);
          const Tensor a = make(as, data_fn(data, seed++));
          const Tensor b = make(bs, data_fn(Data::kHeavyTailed, seed++));
          const QuantizedTensor qa = quantize_cpu(a, config_a(rc, role));
          const QuantizedTensor qb = quantize_cpu(b, config_b(rc, role));
          GemmOptions opt;
          opt.role = role;
          const std::string what = fmt::format("{} {} {} {}", rc.name, gemm_role_name(role),
                                               dims_str(d), data_name(data));
          for (DType od : {DType::kF32, DType::kBF16}) {
            run_checked(GemmOperand::of(qa), GemmOperand::of(qb), opt, od, what);
          }
        }
      }
    }
  }
}

// Per-tensor FP8 and FP8 128×128 columnwise copies are exact transposes of the rowwise codes, so
// the reference over the role's copies equals the natural product of the rowwise dequantized
// tensors: checks that each role picks and orients the right copy.
TEST(GemmCpu, QuantizedOrientationMatchesNaturalProduct) {
  const Dims d{48, 80, 144};
  uint64_t seed = 900;
  for (const Recipe& rc : all_recipes()) {
    if (rc.x.mode != ScalingMode::kPerTensor) continue;
    for (GemmRole role : kAllRoles) {
      const Shape as = natural_a(role, d.m, d.n, d.k), bs = natural_b(role, d.m, d.n, d.k);
      const Tensor a = make(as, quant_test::fill_fn(Fill::kGaussian, seed++));
      const Tensor b = make(bs, quant_test::fill_fn(Fill::kGaussian, seed++));
      const QuantizedTensor qa = quantize_cpu(a, config_a(rc, role));
      const QuantizedTensor qb = quantize_cpu(b, config_b(rc, role));
      GemmOptions opt;
      opt.role = role;
      const std::vector<double> nat =
          natural_product(role, values_f64(dequantize(qa, Usage::kRowwise)), as,
                          values_f64(dequantize(qb, Usage::kRowwise)), bs);
      const std::vector<double> ref =
          gemm_reference_f64(GemmOperand::of(qa), GemmOperand::of(qb), opt);
      for (size_t i = 0; i < nat.size(); ++i) {
        ASSERT_NEAR(nat[i], ref[i], 1e-9 * (1 + std::fabs(nat[i])))
            << rc.name << " " << gemm_role_name(role) << " at " << i;
      }
    }
  }
}

// Which stored copy each role multiplies, written out independently of canonicalize_operands:
// fprop X_row [M, K] · W_row [N, K]ᵀ; dgrad dY_row [M, N] · W_col [K, N]ᵀ; wgrad dY_col [N, M] ·
// X_col [K, M]ᵀ (a columnwise copy is stored transposed, RHT'd where the recipe asks). For every
// recipe the reference must equal that product of the dequantized copies; a wrong copy, a wrong
// orientation or a missing transform is off by the size of the product itself. (NVFP4's alpha is
// folded in f32, hence the tolerance of a few fp32 roundings of the product's magnitude.)
TEST(GemmCpu, QuantizedReferenceMultipliesTheRolesCopies) {
  const Dims d{64, 96, 160};
  uint64_t seed = 1300;
  for (const Recipe& rc : all_recipes()) {
    for (GemmRole role : kAllRoles) {
      SCOPED_TRACE(fmt::format("{} {}", rc.name, gemm_role_name(role)));
      const Shape as = natural_a(role, d.m, d.n, d.k), bs = natural_b(role, d.m, d.n, d.k);
      const QuantizedTensor qa =
          quantize_cpu(make(as, quant_test::fill_fn(Fill::kGaussian, seed++)), config_a(rc, role));
      const QuantizedTensor qb =
          quantize_cpu(make(bs, quant_test::fill_fn(Fill::kGaussian, seed++)), config_b(rc, role));
      const Usage ua = role == GemmRole::kWgrad ? Usage::kColumnwise : Usage::kRowwise;
      const Usage ub = role == GemmRole::kFprop ? Usage::kRowwise : Usage::kColumnwise;
      const Tensor da = dequantize(qa, ua), db = dequantize(qb, ub);
      ASSERT_EQ(da.shape()[1], db.shape()[1]);  // the contraction is the copies' rows
      const int64_t R = da.shape()[0], C = db.shape()[0], K = da.shape()[1];
      const std::vector<double> va = values_f64(da), vb = values_f64(db);
      GemmOptions opt;
      opt.role = role;
      const std::vector<double> ref =
          gemm_reference_f64(GemmOperand::of(qa), GemmOperand::of(qb), opt);
      ASSERT_EQ(int64_t(ref.size()), R * C);
      int bad = 0;
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = 0; c < C; ++c) {
          double want = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            want += va[r * K + k] * vb[c * K + k];
            mag += std::fabs(va[r * K + k] * vb[c * K + k]);
          }
          const double got = ref[static_cast<size_t>(r * C + c)];
          if (!(std::fabs(got - want) <= 1e-6 * mag) && bad++ < 3) {
            ADD_FAILURE() << "(" << r << ", " << c << "): reference " << got << ", copies' product "
                          << want << " (magnitude " << mag << ")";
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

// The reference over every recipe's copies tracks the exact product of the bf16 sources up to
// quantization noise: each operand's elements carry a relative error ≤ r = 2^-(mbits+1) (a whole
// quantum, 2r, with stochastic rounding), so for independent Gaussian data the NMSE is about
// (r_a² + r_b²)/3; the bound takes 6× that (capped at 1/4). A wrong copy or orientation (say the
// MX columnwise copy read as transposed) is uncorrelated with the exact product: NMSE ≈ 2.
TEST(GemmCpu, QuantizedReferenceTracksBf16Product) {
  const Dims d{64, 96, 160};
  uint64_t seed = 700;
  for (const Recipe& rc : all_recipes()) {
    for (GemmRole role : kAllRoles) {
      const Shape as = natural_a(role, d.m, d.n, d.k), bs = natural_b(role, d.m, d.n, d.k);
      const Tensor a = make(as, quant_test::fill_fn(Fill::kGaussian, seed++));
      const Tensor b = make(bs, quant_test::fill_fn(Fill::kGaussian, seed++));
      const QuantConfig& ca = config_a(rc, role);
      const QuantConfig& cb = config_b(rc, role);
      const QuantizedTensor qa = quantize_cpu(a, ca);
      const QuantizedTensor qb = quantize_cpu(b, cb);
      GemmOptions opt;
      opt.role = role;
      const std::vector<double> ref =
          gemm_reference_f64(GemmOperand::of(qa), GemmOperand::of(qb), opt);
      const std::vector<double> exact = natural_product(role, values_f64(a), as, values_f64(b), bs);
      double se = 0, sr = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        se += (ref[i] - exact[i]) * (ref[i] - exact[i]);
        sr += exact[i] * exact[i];
      }
      auto rel = [](const QuantConfig& c) {
        return std::ldexp(c.stochastic_rounding ? 2.0 : 1.0, -(minifloat_spec(c.dtype).mbits + 1));
      };
      const double bound = std::min(0.25, 2.0 * (rel(ca) * rel(ca) + rel(cb) * rel(cb)));
      EXPECT_LT(se / sr, bound) << rc.name << " " << gemm_role_name(role);
    }
  }
}

// NVFP4 wgrad with the RHT on both columnwise copies: (dYᵀH)(XᵀH)ᵀ = dYᵀX because H·Hᵀ = I, so
// the product of the transformed copies approximates the untransformed dYᵀX up to FP4 noise
// (a missing or one-sided transform would be off by O(1)).
TEST(GemmCpu, Nvfp4WgradHadamardCancels) {
  const Dims d{64, 32, 48};
  const Tensor dy = make({d.m, d.n}, quant_test::fill_fn(Fill::kGaussian, 11));
  const Tensor x = make({d.m, d.k}, quant_test::fill_fn(Fill::kGaussian, 12));
  const QuantizedTensor qdy = quantize_cpu(dy, QuantConfig::nvfp4_gradient());
  const QuantizedTensor qx = quantize_cpu(x, QuantConfig::nvfp4_activation());
  ASSERT_TRUE(qdy.columnwise_hadamard);
  ASSERT_TRUE(qx.columnwise_hadamard);
  GemmOptions opt;
  opt.role = GemmRole::kWgrad;
  const std::vector<double> ref =
      gemm_reference_f64(GemmOperand::of(qdy), GemmOperand::of(qx), opt);
  const std::vector<double> exact =
      natural_product(GemmRole::kWgrad, values_f64(dy), {d.m, d.n}, values_f64(x), {d.m, d.k});
  double se = 0, sr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    se += (ref[i] - exact[i]) * (ref[i] - exact[i]);
    sr += exact[i] * exact[i];
  }
  // E2M1 RN relative error ≤ 2^-2 (doubled by SR on dY): per-operand noise variance ≲ 1/12 of
  // that squared, two noisy operands: NMSE well below 0.1.
  EXPECT_LT(se / sr, 0.1);
  // The CPU backend over the same copies.
  run_checked(GemmOperand::of(qdy), GemmOperand::of(qx), opt, DType::kF32, "nvfp4 wgrad rht");
}

// --- non-finite values ------------------------------------------------------------------------

TEST(GemmCpu, NanAndInfPropagate) {
  const int64_t m = 8, n = 12, k = 40;
  Tensor x = make({m, k}, quant_test::fill_fn(Fill::kGaussian, 21));
  const Tensor w = make({n, k}, quant_test::fill_fn(Fill::kGaussian, 22));
  x.ptr<uint16_t>()[3 * k + 7] = f32_to_bf16_rn(std::numeric_limits<float>::quiet_NaN());
  x.ptr<uint16_t>()[5 * k + 2] = f32_to_bf16_rn(std::numeric_limits<float>::infinity());
  GemmOptions opt;
  for (DType od : {DType::kF32, DType::kBF16}) {
    const Tensor out = run_checked(GemmOperand::of(x), GemmOperand::of(w), opt, od, "nan/inf");
    const std::vector<double> v = values_f64(out);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        const double y = v[static_cast<size_t>(r * n + c)];
        if (r == 3) {
          EXPECT_TRUE(std::isnan(y)) << "row 3 col " << c;
        } else if (r == 5) {
          EXPECT_TRUE(std::isinf(y)) << "row 5 col " << c;  // W has no zeros
        } else {
          EXPECT_TRUE(std::isfinite(y)) << "row " << r << " col " << c;
        }
      }
    }
  }
  // wgrad: a NaN in X[i, j] poisons column j of dW.
  const Tensor dy = make({m, n}, quant_test::fill_fn(Fill::kGaussian, 23));
  opt.role = GemmRole::kWgrad;
  const Tensor dw = run_checked(GemmOperand::of(dy), GemmOperand::of(x), opt, DType::kF32, "nan");
  for (int64_t r = 0; r < n; ++r) EXPECT_TRUE(std::isnan(dw.ptr<float>()[r * k + 7]));
  // FP8: the NaN code survives per-tensor quantization and poisons the row too.
  const QuantizedTensor qx = quantize_cpu(x, QuantConfig::fp8_current());
  const QuantizedTensor qw = quantize_cpu(w, QuantConfig::fp8_current());
  opt.role = GemmRole::kFprop;
  const Tensor y = run_checked(GemmOperand::of(qx), GemmOperand::of(qw), opt, DType::kBF16, "fp8");
  for (int64_t c = 0; c < n; ++c)
    EXPECT_TRUE(std::isnan(bf16_to_f32(y.ptr<uint16_t>()[3 * n + c])));
}

// --- alpha, beta, bias ------------------------------------------------------------------------

TEST(GemmCpu, AlphaBetaBiasAccumulateIntoF32) {
  const int64_t m = 40, n = 24, k = 64;
  const Tensor dy = make({m, n}, quant_test::fill_fn(Fill::kGaussian, 31));
  const Tensor x = make({m, k}, quant_test::fill_fn(Fill::kGaussian, 32));
  const QuantizedTensor qdy = quantize_cpu(dy, QuantConfig::fp8_current(DType::kE5M2));
  const QuantizedTensor qx = quantize_cpu(x, QuantConfig::fp8_current(DType::kE4M3));
  const Tensor bias_f32 = quant_test::make_f32(1, k, quant_test::fill_fn(Fill::kGaussian, 33));
  const Tensor bias_bf16 = make({1, k}, quant_test::fill_fn(Fill::kGaussian, 34));
  const TensorView bias32 = bias_f32.view().reshape({k});
  const TensorView bias16 = bias_bf16.view().reshape({k});
  struct Case {
    float alpha, beta;
    const TensorView* bias;
  };
  const Case cases[] = {{1.0f, 0.0f, nullptr},
                        {-1.5f, 1.0f, nullptr},
                        {0.25f, 0.5f, &bias32},
                        {2.0f, 0.0f, &bias16},
                        {0.0f, 1.0f, &bias32}};
  Context ctx(Device::cpu());
  for (bool quantized : {false, true}) {
    const GemmOperand a = quantized ? GemmOperand::of(qdy) : GemmOperand::of(dy);
    const GemmOperand b = quantized ? GemmOperand::of(qx) : GemmOperand::of(x);
    for (const Case& cs : cases) {
      GemmOptions opt;
      opt.role = GemmRole::kWgrad;
      opt.alpha = cs.alpha;
      opt.beta = cs.beta;
      opt.bias = cs.bias;
      const Tensor before = quant_test::make_f32(n, k, quant_test::fill_fn(Fill::kGaussian, 35));
      const Tensor out = Tensor::copy_of(before, Device::cpu());
      // Two micro-batches: out += alpha · dYᵀX twice (beta = 1 the second time).
      gemm(ctx, a, b, out, opt);
      const std::string what =
          fmt::format("{} alpha={} beta={} bias={}", quantized ? "fp8" : "bf16", cs.alpha, cs.beta,
                      cs.bias ? dtype_name(cs.bias->dtype) : "none");
      check_against_reference(a, b, opt, GemmBackend::kCpuReference, out, &before.view(), what);
      if (cs.beta == 1.0f && cs.bias == nullptr) {
        const Tensor mid = Tensor::copy_of(out, Device::cpu());
        gemm(ctx, a, b, out, opt);
        check_against_reference(a, b, opt, GemmBackend::kCpuReference, out, &mid.view(),
                                what + " second");
      }
    }
  }
}

// A separate c for the beta term: out (bf16 or f32) = acc + c, one rounding; c may alias out;
// c must be shaped and typed like out.
TEST(GemmCpu, SeparateCAddsAResidualWithOneRounding) {
  const int64_t m = 24, n = 40, k = 64;
  const Tensor x = make({m, k}, quant_test::fill_fn(Fill::kGaussian, 41));
  const Tensor w = make({n, k}, quant_test::fill_fn(Fill::kGaussian, 42));
  const Tensor res = make({m, n}, quant_test::fill_fn(Fill::kGaussian, 43));  // bf16
  Context ctx(Device::cpu());
  GemmOptions opt;
  opt.beta = 1.0f;
  const TensorView rv = res.view();
  opt.c = &rv;
  Tensor out = Tensor::empty({m, n}, DType::kBF16, Device::cpu());
  gemm(ctx, GemmOperand::of(x), GemmOperand::of(w), out, opt);
  const std::vector<double> ref = gemm_reference_f64(GemmOperand::of(x), GemmOperand::of(w), opt);
  // The same sum rounded once: compare with the f32 product plus c, rounded to bf16.
  GemmOptions plain;
  Tensor acc = Tensor::empty({m, n}, DType::kF32, Device::cpu());
  gemm(ctx, GemmOperand::of(x), GemmOperand::of(w), acc, plain);
  for (int64_t i = 0; i < m * n; ++i) {
    const float want = acc.ptr<float>()[i] + bf16_to_f32(res.ptr<uint16_t>()[i]);
    ASSERT_EQ(out.ptr<uint16_t>()[i], f32_to_bf16_rn(want)) << i;
    ASSERT_NEAR(bf16_to_f32(out.ptr<uint16_t>()[i]), ref[size_t(i)],
                0x1p-7 * std::fabs(ref[size_t(i)]) + 1e-3);
  }
  // c aliasing out: out += x · wᵀ in place.
  Tensor inplace = Tensor::copy_of(res, Device::cpu());
  const TensorView iv = inplace.view();
  opt.c = &iv;
  gemm(ctx, GemmOperand::of(x), GemmOperand::of(w), inplace, opt);
  EXPECT_EQ(std::memcmp(inplace.data(), out.data(), size_t(out.nbytes())), 0);
  // Shape and dtype of c.
  const Tensor wrong = Tensor::zeros({m, n + 1}, DType::kBF16, Device::cpu());
  const Tensor wrong_t = Tensor::zeros({m, n}, DType::kF32, Device::cpu());
  for (const Tensor* bad : {&wrong, &wrong_t}) {
    const TensorView bv = bad->view();
    opt.c = &bv;
    EXPECT_THROW(gemm(ctx, GemmOperand::of(x), GemmOperand::of(w), out, opt), UserError);
  }
  // Without c a bf16 out still refuses beta ≠ 0.
  opt.c = nullptr;
  EXPECT_THROW(gemm(ctx, GemmOperand::of(x), GemmOperand::of(w), out, opt), UserError);
}

// --- backend and accumulation policy ------------------------------------------------------------

TEST(GemmPolicy, NamesAndCpuBackend) {
  EXPECT_EQ(gemm_role_name(GemmRole::kFprop), "fprop");
  EXPECT_EQ(gemm_role_name(GemmRole::kDgrad), "dgrad");
  EXPECT_EQ(gemm_role_name(GemmRole::kWgrad), "wgrad");
  EXPECT_EQ(gemm_backend_name(GemmBackend::kCpuReference), "cpu_reference");
  EXPECT_EQ(gemm_backend_name(GemmBackend::kCublasLtBf16), "cublaslt_bf16");
  EXPECT_EQ(gemm_backend_name(GemmBackend::kCublasLtFp8), "cublaslt_fp8");
  EXPECT_EQ(gemm_backend_name(GemmBackend::kCublasLtFp8Block), "cublaslt_fp8_block");
  EXPECT_EQ(gemm_backend_name(GemmBackend::kEmulatedBf16), "emulated_bf16");
  EXPECT_EQ(gemm_backend_name(GemmBackend::kCublasLtBlockScaled), "cublaslt_block_scaled");
}

// LOWBIT_GEMM_AUTOTUNE: "0", "off", "false", "no" (any case) turn algorithm selection by
// timing off, "1", "on", "true", "yes" or no variable leave it on, anything else is an error
// that names the variable and its values. The setter overrides it.
TEST(GemmPolicy, AutotuneSetting) {
  EXPECT_TRUE(gemm_autotune_from_env(nullptr));
  EXPECT_TRUE(gemm_autotune_from_env(""));
  EXPECT_TRUE(gemm_autotune_from_env("1"));
  EXPECT_TRUE(gemm_autotune_from_env("on"));
  EXPECT_TRUE(gemm_autotune_from_env("TRUE"));
  for (const char* v : {"0", "off", "OFF", "false", "False", "no"}) {
    EXPECT_FALSE(gemm_autotune_from_env(v)) << v;
  }
  for (const char* v : {"of", "2", "auto", " on"}) {
    const std::string why = user_error([&] { gemm_autotune_from_env(v); });
    EXPECT_NE(why.find("LOWBIT_GEMM_AUTOTUNE"), std::string::npos) << why;
    EXPECT_NE(why.find("on / off"), std::string::npos) << why;
  }
  const bool before = gemm_autotune();
  set_gemm_autotune(!before);
  EXPECT_EQ(gemm_autotune(), !before);
  set_gemm_autotune(before);
  EXPECT_EQ(gemm_autotune(), before);
}

// LOWBIT_GEMM_FUSED: unset, empty or "auto" → kAuto; the on / off words → kOn / kOff; anything
// else (a typo) is an error naming the values. The setter overrides it.
TEST(GemmPolicy, FusedDequantSetting) {
  EXPECT_EQ(gemm_fused_from_env(nullptr), FusedDequant::kAuto);
  EXPECT_EQ(gemm_fused_from_env(""), FusedDequant::kAuto);
  EXPECT_EQ(gemm_fused_from_env("AUTO"), FusedDequant::kAuto);
  for (const char* v : {"1", "on", "yes"})
    EXPECT_EQ(gemm_fused_from_env(v), FusedDequant::kOn) << v;
  for (const char* v : {"0", "off", "No"})
    EXPECT_EQ(gemm_fused_from_env(v), FusedDequant::kOff) << v;
  for (const char* v : {"atuo", "fused", "2"}) {
    const std::string why = user_error([&] { gemm_fused_from_env(v); });
    EXPECT_NE(why.find("LOWBIT_GEMM_FUSED"), std::string::npos) << why;
    EXPECT_NE(why.find("auto"), std::string::npos) << why;
  }
  const FusedDequant before = gemm_fused_dequant();
  set_gemm_fused_dequant(FusedDequant::kOff);
  EXPECT_EQ(gemm_fused_dequant(), FusedDequant::kOff);
  set_gemm_fused_dequant(before);
  EXPECT_EQ(gemm_fused_dequant(), before);
}

TEST(GemmPolicy, FastAccumulationFollowsTe) {
  Context ctx(Device::cpu());
  const int64_t m = 32, n = 32, k = 32;
  const Tensor t = make({m, k}, quant_test::fill_fn(Fill::kGaussian, 41));
  const Tensor out = Tensor::empty({m, m}, DType::kF32, Device::cpu());
  for (const Recipe& rc : all_recipes()) {
    const bool per_tensor = rc.x.mode == ScalingMode::kPerTensor;
    for (GemmRole role : kAllRoles) {
      const QuantizedTensor qa = quantize_cpu(t, config_a(rc, role));
      const QuantizedTensor qb = quantize_cpu(t, config_b(rc, role));
      GemmOptions opt;
      opt.role = role;
      // Square operands: every role's output is [32, 32].
      const CanonGemm g = canonicalize(ctx, GemmOperand::of(qa), GemmOperand::of(qb), out, opt);
      EXPECT_EQ(g.fast_accum, per_tensor && role == GemmRole::kFprop) << rc.name;
      EXPECT_EQ(g.backend, GemmBackend::kCpuReference);
      EXPECT_EQ(g.R, m);
      EXPECT_EQ(g.Kc, k);
      opt.accumulation = Fp8Accumulation::kSplit;
      EXPECT_FALSE(
          canonicalize(ctx, GemmOperand::of(qa), GemmOperand::of(qb), out, opt).fast_accum);
      opt.accumulation = Fp8Accumulation::kFast;
      if (per_tensor) {
        EXPECT_TRUE(
            canonicalize(ctx, GemmOperand::of(qa), GemmOperand::of(qb), out, opt).fast_accum);
      } else {
        EXPECT_THROW(canonicalize(ctx, GemmOperand::of(qa), GemmOperand::of(qb), out, opt),
                     UserError)
            << rc.name;
      }
    }
  }
  // Dense operands never use fast accumulation.
  GemmOptions opt;
  opt.accumulation = Fp8Accumulation::kFast;
  EXPECT_FALSE(canonicalize(ctx, GemmOperand::of(t), GemmOperand::of(t), out, opt).fast_accum);
}

TEST(GemmPolicy, CanonicalCopiesPerRole) {
  Context ctx(Device::cpu());
  const Tensor dy = make({32, 48}, quant_test::fill_fn(Fill::kGaussian, 51));
  const Tensor w = make({48, 64}, quant_test::fill_fn(Fill::kGaussian, 52));
  const Tensor x = make({32, 64}, quant_test::fill_fn(Fill::kGaussian, 53));
  GemmOptions opt;
  opt.role = GemmRole::kDgrad;
  CanonGemm g = canonicalize(ctx, GemmOperand::of(dy), GemmOperand::of(w),
                             Tensor::empty({32, 64}, DType::kBF16, Device::cpu()), opt);
  EXPECT_EQ(g.R, 32);
  EXPECT_EQ(g.C, 64);
  EXPECT_EQ(g.Kc, 48);
  EXPECT_FALSE(g.a.transposed);
  EXPECT_TRUE(g.b.transposed);
  opt.role = GemmRole::kWgrad;
  const QuantizedTensor qdy = quantize_cpu(dy, QuantConfig::fp8_current(DType::kE5M2));
  const QuantizedTensor qx = quantize_cpu(x, QuantConfig::fp8_current());
  g = canonicalize(ctx, GemmOperand::of(qdy), GemmOperand::of(qx),
                   Tensor::empty({48, 64}, DType::kF32, Device::cpu()), opt);
  EXPECT_EQ(g.a.usage, Usage::kColumnwise);
  EXPECT_EQ(g.b.usage, Usage::kColumnwise);
  EXPECT_EQ(g.R, 48);
  EXPECT_EQ(g.C, 64);
  EXPECT_EQ(g.Kc, 32);
}

// --- user errors ------------------------------------------------------------------------------

// Runs gemm on the CPU and expects a UserError whose message contains every fragment.
void expect_user_error(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                       const GemmOptions& opt, std::initializer_list<const char*> fragments) {
  Context ctx(Device::cpu());
  try {
    gemm(ctx, a, b, out, opt);
    ADD_FAILURE() << "no UserError; expected one mentioning " << *fragments.begin();
  } catch (const UserError& e) {
    const std::string msg = e.what();
    for (const char* f : fragments) {
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    }
  }
}

TEST(GemmErrors, ShapesAndDtypes) {
  const Tensor x = make({16, 32}, quant_test::fill_fn(Fill::kGaussian, 61));
  const Tensor w = make({24, 32}, quant_test::fill_fn(Fill::kGaussian, 62));
  const Tensor w_bad = make({24, 16}, quant_test::fill_fn(Fill::kGaussian, 63));
  const Tensor y = Tensor::empty({16, 24}, DType::kBF16, Device::cpu());
  const Tensor y32 = Tensor::empty({16, 24}, DType::kF32, Device::cpu());
  GemmOptions opt;
  // Contracted dims disagree.
  expect_user_error(GemmOperand::of(x), GemmOperand::of(w_bad), y, opt,
                    {"fprop", "X", "W", "contracted dim K", "32 vs 16"});
  // dgrad: dY [M, N] with W [N, K]: N disagrees.
  GemmOptions dg;
  dg.role = GemmRole::kDgrad;
  expect_user_error(GemmOperand::of(x), GemmOperand::of(w),
                    Tensor::empty({16, 32}, DType::kF32, Device::cpu()), dg,
                    {"dgrad", "dY", "contracted dim N"});
  // Wrong out shape and dtype.
  expect_user_error(GemmOperand::of(x), GemmOperand::of(w),
                    Tensor::empty({24, 16}, DType::kF32, Device::cpu()), opt,
                    {"out must be Y [M, N] = [16, 24]"});
  expect_user_error(GemmOperand::of(x), GemmOperand::of(w),
                    Tensor::empty({16, 24}, DType::kF16, Device::cpu()), opt, {"bf16 or f32"});
  // 3-D operand, integer operand.
  const Tensor x3 = Tensor::zeros({2, 8, 32}, DType::kBF16, Device::cpu());
  expect_user_error(GemmOperand::of(x3), GemmOperand::of(w), y, opt, {"X", "2-D"});
  const Tensor xi = Tensor::zeros({16, 32}, DType::kI32, Device::cpu());
  expect_user_error(GemmOperand::of(xi), GemmOperand::of(w), y, opt, {"X", "bf16 or f32"});
  // beta with a bf16 out.
  GemmOptions acc;
  acc.beta = 1.0f;
  expect_user_error(GemmOperand::of(x), GemmOperand::of(w), y, acc, {"beta", "f32 out"});
  // Bias of the wrong length / dtype.
  const Tensor bias_bad = Tensor::zeros({16}, DType::kF32, Device::cpu());
  GemmOptions bo;
  bo.bias = &bias_bad.view();
  expect_user_error(GemmOperand::of(x), GemmOperand::of(w), y32, bo, {"bias must be [24]"});
  const Tensor bias_i = Tensor::zeros({24}, DType::kI32, Device::cpu());
  bo.bias = &bias_i.view();
  expect_user_error(GemmOperand::of(x), GemmOperand::of(w), y32, bo, {"bias must be bf16"});
  // An empty operand.
  expect_user_error(GemmOperand::of(TensorView()), GemmOperand::of(w), y, opt, {"X", "empty"});
}

TEST(GemmErrors, QuantizedOperands) {
  const Tensor x = make({32, 64}, quant_test::fill_fn(Fill::kGaussian, 71));
  const Tensor w = make({48, 64}, quant_test::fill_fn(Fill::kGaussian, 72));
  const Tensor dy = make({32, 48}, quant_test::fill_fn(Fill::kGaussian, 73));
  QuantConfig row_only = QuantConfig::fp8_current();
  row_only.columnwise = false;
  const QuantizedTensor qw_row = quantize_cpu(w, row_only);
  const QuantizedTensor qdy = quantize_cpu(dy, QuantConfig::fp8_current(DType::kE5M2));
  const QuantizedTensor qx = quantize_cpu(x, QuantConfig::fp8_current());
  const Tensor dx = Tensor::empty({32, 64}, DType::kBF16, Device::cpu());
  GemmOptions dg;
  dg.role = GemmRole::kDgrad;
  // dgrad needs W's columnwise copy.
  expect_user_error(GemmOperand::of(qdy), GemmOperand::of(qw_row), dx, dg,
                    {"dgrad", "columnwise copy of W", "columnwise = true"});
  // E5M2 × E5M2.
  const QuantizedTensor qw_e5 = quantize_cpu(w, QuantConfig::fp8_current(DType::kE5M2));
  expect_user_error(GemmOperand::of(qdy), GemmOperand::of(qw_e5), dx, dg,
                    {"dY and W are both E5M2", "E4M3"});
  // Mixed quantized / dense.
  expect_user_error(GemmOperand::of(qdy), GemmOperand::of(w), dx, dg,
                    {"dY is quantized", "W is dense", "quantize both operands or neither"});
  Context ctx(Device::cpu());
  EXPECT_THROW(gemm_backend_for(ctx, GemmOperand::of(dy), GemmOperand::of(qw_row)), UserError);
  // Different recipes.
  const QuantizedTensor qw_blk = quantize_cpu(w, QuantConfig::fp8_block_128x128());
  expect_user_error(GemmOperand::of(qdy), GemmOperand::of(qw_blk), dx, dg, {"same recipe"});
  // kFast with a block mode.
  const QuantizedTensor qdy_blk = quantize_cpu(dy, QuantConfig::fp8_block_1x128());
  GemmOptions fast = dg;
  fast.accumulation = Fp8Accumulation::kFast;
  expect_user_error(GemmOperand::of(qdy_blk), GemmOperand::of(qw_blk), dx, fast,
                    {"fast accumulation", "block1x128"});
  // wgrad: the Hadamard transform on one operand only.
  QuantConfig no_rht = QuantConfig::nvfp4_activation();
  no_rht.hadamard_columnwise = false;
  const QuantizedTensor qdy4 = quantize_cpu(dy, QuantConfig::nvfp4_gradient());
  const QuantizedTensor qx4 = quantize_cpu(x, no_rht);
  GemmOptions wg;
  wg.role = GemmRole::kWgrad;
  expect_user_error(GemmOperand::of(qdy4), GemmOperand::of(qx4),
                    Tensor::empty({48, 64}, DType::kF32, Device::cpu()), wg,
                    {"wgrad", "Hadamard", "dY", "X"});
  // wgrad with a quantized X that has no columnwise copy.
  QuantConfig x_row = QuantConfig::fp8_current();
  x_row.columnwise = false;
  const QuantizedTensor qx_row = quantize_cpu(x, x_row);
  expect_user_error(GemmOperand::of(qdy), GemmOperand::of(qx_row),
                    Tensor::empty({48, 64}, DType::kF32, Device::cpu()), wg,
                    {"wgrad", "columnwise copy of X"});
  // fprop with a quantized X that has no rowwise copy.
  QuantConfig x_col = QuantConfig::fp8_current();
  x_col.rowwise = false;
  const QuantizedTensor qx_col = quantize_cpu(x, x_col);
  const QuantizedTensor qw = quantize_cpu(w, QuantConfig::fp8_current());
  expect_user_error(GemmOperand::of(qx_col), GemmOperand::of(qw),
                    Tensor::empty({32, 48}, DType::kBF16, Device::cpu()), GemmOptions{},
                    {"fprop", "rowwise copy of X"});
}

TEST(GemmTolerance, UnknownKeyHasNoEntry) {
  EXPECT_NE(find_tolerance(GemmBackend::kCpuReference, DType::kF32), nullptr);
  EXPECT_NE(find_tolerance(GemmBackend::kCpuReference, DType::kBF16), nullptr);
  EXPECT_EQ(find_tolerance(GemmBackend::kCpuReference, DType::kF16), nullptr);
}

}  // namespace
}  // namespace lowbit

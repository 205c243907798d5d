// RMSNorm, CPU twin: forward and backward against the fp64 formulas, finite differences of the
// backward (f32 path), edge rows (zeros, NaN, width 1) and argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

constexpr float kEps = 1e-5f;

OpCase fwd_case(int64_t n, int64_t d, Fill xfill = Fill::gaussian()) {
  OpCase c;
  c.name = fmt::format("rmsnorm_fwd {}x{}", n, d);
  c.args = {in("x", DType::kBF16, {n, d}, xfill),
            in("w", DType::kBF16, {d}, Fill::gaussian(0.5, 1.0)), out("out", DType::kBF16, {n, d}),
            out("rstd", DType::kF32, {n})};
  c.run = [](Context& ctx, const Args& a) {
    rmsnorm_fwd(ctx, a["out"], a["rstd"], a["x"], a["w"], kEps);
  };
  return c;
}

// out and rstd of the fp64 formula.
void fwd_formula(const std::vector<double>& x, const std::vector<double>& w, int64_t n, int64_t d,
                 std::vector<double>& out, std::vector<double>& rstd) {
  out.assign(n * d, 0);
  rstd.assign(n, 0);
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += x[r * d + i] * x[r * d + i];
    rstd[r] = 1.0 / std::sqrt(ss / double(d) + double(kEps));
    for (int64_t i = 0; i < d; ++i) out[r * d + i] = x[r * d + i] * rstd[r] * w[i];
  }
}

TEST(RmsNorm, ForwardMatchesFp64Formula) {
  for (auto [n, d] : {std::pair<int64_t, int64_t>{1, 16}, {65, 80}, {7, 513}}) {
    OpRun r = run_op(fwd_case(n, d), Device::cpu());
    ASSERT_TRUE(r.intact());
    std::vector<double> out, rstd;
    fwd_formula(r.values("x"), r.values("w"), n, d, out, rstd);
    for (double& v : out) v = round_to(DType::kBF16, v);
    // rstd: the fp64 sum rounded to fp32, + eps, sqrt, reciprocal: 4 roundings; out: 2 more.
    EXPECT_TRUE(expect_close("rstd", {n}, r.values("rstd"), rstd, tol_rounded(DType::kF32, 4)));
    EXPECT_TRUE(expect_close("out", {n, d}, r.values("out"), out, tol_rounded(DType::kBF16, 6)));
  }
}

TEST(RmsNorm, BackwardMatchesFp64Formula) {
  const int64_t n = 33, d = 80;
  OpCase c;
  c.name = "rmsnorm_bwd";
  c.args = {in("x", DType::kBF16, {n, d}),
            in("w", DType::kBF16, {d}, Fill::gaussian(0.5, 1.0)),
            in("rstd", DType::kF32, {n}, Fill::uniform(0.5, 2.0)),
            in("dout", DType::kBF16, {n, d}),
            out("dx", DType::kBF16, {n, d}),
            inout("dw", DType::kF32, {d}, Fill::gaussian())};
  c.run = [](Context& ctx, const Args& a) {
    rmsnorm_bwd(ctx, a["dx"], a["dw"], a["dout"], a["x"], a["w"], a["rstd"]);
  };
  OpRun r = run_op(c, Device::cpu());
  ASSERT_TRUE(r.intact());
  const auto x = r.values("x"), w = r.values("w"), rs = r.values("rstd"), dy = r.values("dout");
  std::vector<double> dx(n * d), dw = r.initial("dw");
  for (int64_t row = 0; row < n; ++row) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += dy[row * d + i] * w[i] * x[row * d + i];
    const double rr = rs[row];
    for (int64_t i = 0; i < d; ++i) {
      dx[row * d + i] = round_to(
          DType::kBF16, rr * (dy[row * d + i] * w[i] - x[row * d + i] * rr * rr * dot / double(d)));
      dw[i] += x[row * d + i] * rr * dy[row * d + i];
    }
  }
  // dx subtracts two terms of similar size: the fp32 error is bounded relative to the row scale.
  EXPECT_TRUE(expect_close("dx", {n, d}, r.values("dx"), dx, tol_reduction(DType::kBF16, d)));
  EXPECT_TRUE(expect_close("dw", {d}, r.values("dw"), dw, tol_reduction(DType::kF32, n)));
}

// With a residual (aliasing dx, as in the model's backward) dx = residual + the norm's input
// gradient, summed in fp32 and rounded once: the f32 gradient of the same inputs plus the
// residual, rounded to bf16; dw as without it.
TEST(RmsNorm, BackwardAddsTheResidualBeforeRounding) {
  const int64_t n = 9, d = 40;
  Context ctx(Device::cpu());
  Tensor x = Tensor::empty({n, d}, DType::kBF16, Device::cpu());
  Tensor dy = Tensor::empty({n, d}, DType::kBF16, Device::cpu());
  Tensor res = Tensor::empty({n, d}, DType::kBF16, Device::cpu());
  Tensor w = Tensor::empty({d}, DType::kBF16, Device::cpu());
  Tensor rstd = Tensor::empty({n}, DType::kF32, Device::cpu());
  for (int64_t i = 0; i < n * d; ++i) {
    x.ptr<uint16_t>()[i] = f32_to_bf16_rn(std::sin(0.37f * float(i)));
    dy.ptr<uint16_t>()[i] = f32_to_bf16_rn(std::cos(0.11f * float(i)));
    res.ptr<uint16_t>()[i] = f32_to_bf16_rn(3.0f * std::sin(0.05f * float(i) + 1.0f));
  }
  for (int64_t i = 0; i < d; ++i) w.ptr<uint16_t>()[i] = f32_to_bf16_rn(0.5f + 0.01f * float(i));
  for (int64_t r = 0; r < n; ++r) rstd.ptr<float>()[r] = 0.8f + 0.1f * float(r);
  // The f32 path: the unrounded norm gradient, and dw.
  Tensor xf = Tensor::empty({n, d}, DType::kF32, Device::cpu());
  Tensor dyf = Tensor::empty({n, d}, DType::kF32, Device::cpu());
  Tensor wf = Tensor::empty({d}, DType::kF32, Device::cpu());
  for (int64_t i = 0; i < n * d; ++i) {
    xf.ptr<float>()[i] = bf16_to_f32(x.ptr<uint16_t>()[i]);
    dyf.ptr<float>()[i] = bf16_to_f32(dy.ptr<uint16_t>()[i]);
  }
  for (int64_t i = 0; i < d; ++i) wf.ptr<float>()[i] = bf16_to_f32(w.ptr<uint16_t>()[i]);
  Tensor g = Tensor::empty({n, d}, DType::kF32, Device::cpu());
  Tensor dw_ref = Tensor::zeros({d}, DType::kF32, Device::cpu());
  rmsnorm_bwd(ctx, g, dw_ref, dyf, xf, wf, rstd);
  Tensor dx = Tensor::copy_of(res, Device::cpu());  // the residual, updated in place
  Tensor dw = Tensor::zeros({d}, DType::kF32, Device::cpu());
  rmsnorm_bwd(ctx, dx, dw, dy, x, w, rstd, dx);
  for (int64_t i = 0; i < n * d; ++i) {
    const float want = bf16_to_f32(res.ptr<uint16_t>()[i]) + g.ptr<float>()[i];
    ASSERT_EQ(dx.ptr<uint16_t>()[i], f32_to_bf16_rn(want)) << i;
  }
  for (int64_t i = 0; i < d; ++i) ASSERT_EQ(dw.ptr<float>()[i], dw_ref.ptr<float>()[i]) << i;
  // The residual must be shaped like x.
  Tensor bad = Tensor::zeros({n, d + 1}, DType::kBF16, Device::cpu());
  EXPECT_THROW(rmsnorm_bwd(ctx, dx, dw, dy, x, w, rstd, bad), UserError);
}

// accumulate_dw = false writes dw outright: the bits of adding to a zeroed dw, whatever dw held
// (NaN here), also over zero rows.
TEST(RmsNorm, BackwardWritesDwWhenNotAccumulating) {
  Context ctx(Device::cpu());
  for (const int64_t n : {int64_t(7), int64_t(0)}) {
    const int64_t d = 24;
    Tensor x = Tensor::empty({n, d}, DType::kBF16, Device::cpu());
    Tensor dy = Tensor::empty({n, d}, DType::kBF16, Device::cpu());
    Tensor w = Tensor::empty({d}, DType::kBF16, Device::cpu());
    Tensor rstd = Tensor::empty({n}, DType::kF32, Device::cpu());
    for (int64_t i = 0; i < n * d; ++i) {
      x.ptr<uint16_t>()[i] = f32_to_bf16_rn(std::sin(0.29f * float(i)));
      dy.ptr<uint16_t>()[i] = f32_to_bf16_rn(std::cos(0.13f * float(i)));
    }
    for (int64_t i = 0; i < d; ++i) w.ptr<uint16_t>()[i] = f32_to_bf16_rn(1.0f - 0.02f * float(i));
    for (int64_t r = 0; r < n; ++r) rstd.ptr<float>()[r] = 1.1f - 0.05f * float(r);
    Tensor dx1 = Tensor::empty({n, d}, DType::kBF16, Device::cpu());
    Tensor dx2 = Tensor::empty({n, d}, DType::kBF16, Device::cpu());
    Tensor dw_zeroed = Tensor::zeros({d}, DType::kF32, Device::cpu());
    Tensor dw_written = Tensor::empty({d}, DType::kF32, Device::cpu());
    fill_bytes(dw_written, 0xFF);  // NaN
    rmsnorm_bwd(ctx, dx1, dw_zeroed, dy, x, w, rstd);
    rmsnorm_bwd(ctx, dx2, dw_written, dy, x, w, rstd, TensorView(), /*accumulate_dw=*/false);
    for (int64_t i = 0; i < d; ++i) {
      ASSERT_EQ(f32_bits(dw_written.ptr<float>()[i]), f32_bits(dw_zeroed.ptr<float>()[i])) << i;
    }
  }
}

TEST(RmsNorm, GradientMatchesFiniteDifferences) {
  const int64_t n = 3, d = 12;
  GradCase g;
  g.name = "rmsnorm";
  g.args = {in("x", DType::kF32, {n, d}),    in("w", DType::kF32, {d}, Fill::gaussian(0.5, 1.0)),
            out("out", DType::kF32, {n, d}), out("rstd", DType::kF32, {n}),
            in("dout", DType::kF32, {n, d}), out("dx", DType::kF32, {n, d}),
            out("dw", DType::kF32, {d})};
  g.forward = [](Context& ctx, const Args& a) {
    rmsnorm_fwd(ctx, a["out"], a["rstd"], a["x"], a["w"], kEps);
  };
  g.backward = [](Context& ctx, const Args& a) {
    rmsnorm_bwd(ctx, a["dx"], a["dw"], a["dout"], a["x"], a["w"], a["rstd"]);
  };
  g.loss = {{"out", "dout"}};
  g.grads = {{"x", "dx"}, {"w", "dw"}};
  EXPECT_TRUE(check_gradients(g));
}

TEST(RmsNorm, EdgeRows) {
  // A zero row gives rstd = 1/sqrt(eps) and zeros; a row with a NaN gives NaNs in that row only.
  OpCase c = fwd_case(4, 8, Fill::custom("zeros+nan", [](int64_t i) {
                        if (i < 8) return 0.0;
                        if (i == 17) return double(NAN);
                        return 0.25 * double(i % 5) - 0.5;
                      }));
  OpRun r = run_op(c, Device::cpu());
  const auto out = r.values("out"), rstd = r.values("rstd");
  EXPECT_FLOAT_EQ(rstd[0], 1.0f / std::sqrt(kEps));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], 0.0);
  EXPECT_TRUE(std::isnan(rstd[2]));
  for (int i = 16; i < 24; ++i) EXPECT_TRUE(std::isnan(out[i]));
  for (int i = 24; i < 32; ++i) EXPECT_TRUE(std::isfinite(out[i]));
  // Width 1: out = x / sqrt(x² + eps) · w.
  OpRun r1 = run_op(fwd_case(5, 1), Device::cpu());
  const auto x1 = r1.values("x"), w1 = r1.values("w"), o1 = r1.values("out");
  for (int i = 0; i < 5; ++i) {
    const double want = round_to(DType::kBF16, x1[i] / std::sqrt(x1[i] * x1[i] + kEps) * w1[0]);
    EXPECT_NEAR(o1[i], want, 2 * unit_roundoff(DType::kBF16) * std::fabs(want));
  }
}

TEST(RmsNorm, BadArgumentsAreUserErrors) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  Tensor x = Tensor::zeros({4, 8}, DType::kBF16, cpu),
         out = Tensor::zeros({4, 8}, DType::kBF16, cpu);
  Tensor w = Tensor::zeros({8}, DType::kBF16, cpu), rstd = Tensor::zeros({4}, DType::kF32, cpu);
  Tensor dw = Tensor::zeros({8}, DType::kF32, cpu);
  Tensor w9 = Tensor::zeros({9}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd(ctx, out, rstd, x, w9, kEps); },
                                {"rmsnorm_fwd", "w [D] has 9 elements", "D = 8"}));
  Tensor rstd_bf = Tensor::zeros({4}, DType::kBF16, cpu);
  EXPECT_TRUE(
      throws_user_error([&] { rmsnorm_fwd(ctx, out, rstd_bf, x, w, kEps); }, {"rstd must be f32"}));
  Tensor rstd3 = Tensor::zeros({3}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd(ctx, out, rstd3, x, w, kEps); },
                                {"rstd [N] has 3 entries", "N = 4"}));
  Tensor out_t = Tensor::zeros({8, 4}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd(ctx, out_t, rstd, x, w, kEps); },
                                {"out has shape [8, 4]", "x has [4, 8]"}));
  Tensor x16 = Tensor::zeros({4, 8}, DType::kF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd(ctx, out, rstd, x16, w, kEps); },
                                {"x must be bf16", "f16[4, 8]"}));
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd(ctx, out, rstd, x, w, -1.0f); }, {"eps"}));
  Tensor dw_bf = Tensor::zeros({8}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_bwd(ctx, out, dw_bf, out, x, w, rstd); },
                                {"rmsnorm_bwd", "dw must be f32"}));
  TensorView x_strided(x.data(), DType::kBF16, {4, 4}, {8, 1}, cpu);
  TensorView out_44(out.data(), DType::kBF16, {4, 4}, cpu);
  Tensor w4 = Tensor::zeros({4}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rmsnorm_fwd(ctx, out_44, rstd, x_strided, w4, kEps); },
                                {"x must be contiguous"}));
}

}  // namespace
}  // namespace lowbit::test

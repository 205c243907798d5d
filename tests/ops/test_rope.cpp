// Rotary position embedding, CPU twin: the (cos, sin) table (plain and LLaMA-3 scaled) against
// fp64 formulas, the rotation against fp64, strided and in-place views, the backward as the
// inverse rotation and by finite differences, and argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

Tensor make_table(int64_t positions, int64_t dh, const RopeConfig& cfg = {}) {
  Context ctx(Device::cpu());
  Tensor t = Tensor::empty({positions, dh / 2, 2}, DType::kF32, Device::cpu());
  rope_table(ctx, t, cfg);
  return t;
}

// HF transformers' _compute_llama3_parameters, written out per frequency.
double llama3_inv_freq(double f, const RopeConfig& c) {
  const double wavelen = kTwoPi / f;
  const double low_wavelen = c.original_max_positions / double(c.low_freq_factor);
  const double high_wavelen = c.original_max_positions / double(c.high_freq_factor);
  const double scaled = wavelen > low_wavelen ? f / c.factor : f;
  const double smooth = (c.original_max_positions / wavelen - c.low_freq_factor) /
                        (c.high_freq_factor - c.low_freq_factor);
  const double smoothed = (1 - smooth) * scaled / c.factor + smooth * scaled;
  const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
  return medium ? smoothed : scaled;
}

TEST(Rope, TableMatchesFp64Angles) {
  const int64_t positions = 300, dh = 64;
  const RopeConfig plain;
  RopeConfig llama31;  // Llama 3.1's rope_scaling
  llama31.theta = 500000.0f;
  llama31.factor = 8.0f;
  llama31.low_freq_factor = 1.0f;
  llama31.high_freq_factor = 4.0f;
  llama31.original_max_positions = 8192;
  for (const RopeConfig& cfg : {plain, llama31}) {
    Tensor t = make_table(positions, dh, cfg);
    std::vector<double> got(t.numel()), want(t.numel());
    int slowed = 0, kept = 0, smoothed = 0;
    for (int64_t i = 0; i < dh / 2; ++i) {
      const double f0 = std::pow(double(cfg.theta), -double(2 * i) / double(dh));
      const double f = cfg.factor > 1 ? llama3_inv_freq(f0, cfg) : f0;
      kept += f == f0;
      slowed += std::fabs(f - f0 / cfg.factor) < 1e-12 * f0 && cfg.factor > 1;
      smoothed += f < f0 && f > f0 / cfg.factor;
      for (int64_t p = 0; p < positions; ++p) {
        const int64_t k = (p * dh / 2 + i) * 2;
        want[k] = std::cos(double(p) * f);
        want[k + 1] = std::sin(double(p) * f);
        got[k] = t.ptr<float>()[k];
        got[k + 1] = t.ptr<float>()[k + 1];
      }
    }
    // One fp32 rounding of an fp64 value; the angle's own fp64 error is ~1e-16 · angle.
    Tol tol = tol_rounded(DType::kF32, 0);
    tol.abs = 1e-12;
    EXPECT_TRUE(expect_close("table", t.shape(), got, want, tol));
    if (cfg.factor > 1) {  // all three regimes of the scaling occur for Dh = 64
      EXPECT_GT(kept, 0);
      EXPECT_GT(slowed, 0);
      EXPECT_GT(smoothed, 0);
    }
  }
}

// y [B, T, nH, Dh] of the fp64 rotation with the table's (cos, sin).
std::vector<double> rotate_formula(const std::vector<double>& x, const Tensor& table, int64_t nb,
                                   int64_t nt, int64_t nh, int64_t dh, double sign) {
  std::vector<double> y(x.size());
  const int64_t half = dh / 2;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < nt; ++t) {
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t o = ((b * nt + t) * nh + h) * dh;
        for (int64_t i = 0; i < half; ++i) {
          const double c = table.ptr<float>()[(t * half + i) * 2];
          const double s = sign * table.ptr<float>()[(t * half + i) * 2 + 1];
          y[o + i] = x[o + i] * c - x[o + i + half] * s;
          y[o + i + half] = x[o + i + half] * c + x[o + i] * s;
        }
      }
    }
  }
  return y;
}

OpCase rope_case(const Tensor& table, int64_t nb, int64_t nt, int64_t nh, int64_t dh, bool bwd) {
  OpCase c;
  c.name = bwd ? "rope_bwd" : "rope_fwd";
  c.args = {in("x", DType::kBF16, {nb, nt, nh, dh}), out("y", DType::kBF16, {nb, nt, nh, dh})};
  const TensorView tv = table.view();
  c.run = [tv, bwd](Context& ctx, const Args& a) {
    if (bwd) {
      rope_bwd(ctx, a["y"], a["x"], tv);
    } else {
      rope_fwd(ctx, a["y"], a["x"], tv);
    }
  };
  return c;
}

TEST(Rope, RotationMatchesFp64BothDirections) {
  const int64_t nb = 2, nt = 9, nh = 3, dh = 16;
  Tensor table = make_table(nt + 4, dh);  // longer than T: only the first T rows are used
  for (bool bwd : {false, true}) {
    OpRun r = run_op(rope_case(table, nb, nt, nh, dh, bwd), Device::cpu());
    ASSERT_TRUE(r.intact());
    std::vector<double> want = rotate_formula(r.values("x"), table, nb, nt, nh, dh, bwd ? -1 : 1);
    for (double& v : want) v = round_to(DType::kBF16, v);
    // Two products and a sum in fp32: cancellation bounded by the tensor's scale.
    EXPECT_TRUE(
        expect_close("y", {nb, nt, nh, dh}, r.values("y"), want, tol_reduction(DType::kBF16, 2)));
  }
}

TEST(Rope, StridedAndInPlaceViewsGiveTheSameBits) {
  // q and k as views of a fused qkv activation [B, T, H + 2·Hkv, Dh]: q = heads [0, H),
  // k = heads [H, H + Hkv). Rotating them in place must equal rotating contiguous copies.
  const int64_t nb = 2, nt = 5, h = 4, hkv = 2, dh = 32, w = h + 2 * hkv;
  Tensor table = make_table(nt, dh);
  const TensorView tv = table.view();
  OpCase c;
  c.name = "rope_fwd strided in place";
  c.args = {inout("qkv", DType::kBF16, {nb, nt, w, dh}, Fill::gaussian()),
            in("q", DType::kBF16, {nb, nt, h, dh}), out("q_out", DType::kBF16, {nb, nt, h, dh})};
  c.run = [&](Context& ctx, const Args& a) {
    const TensorView& qkv = a["qkv"];
    const Shape st{nt * w * dh, w * dh, dh, 1};
    TensorView q(qkv.data, DType::kBF16, {nb, nt, h, dh}, st, qkv.device);
    TensorView k(static_cast<uint16_t*>(qkv.data) + h * dh, DType::kBF16, {nb, nt, hkv, dh}, st,
                 qkv.device);
    rope_fwd(ctx, q, q, tv);
    rope_fwd(ctx, k, k, tv);
    rope_fwd(ctx, a["q_out"], a["q"], tv);
  };
  OpRun r = run_op(c, Device::cpu());
  ASSERT_TRUE(r.intact());
  const auto before = r.initial("qkv"), after = r.values("qkv");
  // Reference: contiguous copies through the same op.
  const Device cpu = Device::cpu();
  Context ctx(cpu);
  Tensor q = Tensor::empty({nb, nt, h, dh}, DType::kBF16, cpu);
  Tensor k = Tensor::empty({nb, nt, hkv, dh}, DType::kBF16, cpu);
  for (int64_t bt = 0; bt < nb * nt; ++bt) {
    for (int64_t j = 0; j < w * dh; ++j) {
      const uint16_t v = f32_to_bf16_rn(float(before[bt * w * dh + j]));
      if (j < h * dh) q.ptr<uint16_t>()[bt * h * dh + j] = v;
      if (j >= h * dh && j < (h + hkv) * dh) k.ptr<uint16_t>()[bt * hkv * dh + j - h * dh] = v;
    }
  }
  rope_fwd(ctx, q, q, tv);
  rope_fwd(ctx, k, k, tv);
  for (int64_t bt = 0; bt < nb * nt; ++bt) {
    for (int64_t j = 0; j < w * dh; ++j) {
      double want = before[bt * w * dh + j];  // v untouched
      if (j < h * dh) want = bf16_to_f32(q.ptr<uint16_t>()[bt * h * dh + j]);
      if (j >= h * dh && j < (h + hkv) * dh) {
        want = bf16_to_f32(k.ptr<uint16_t>()[bt * hkv * dh + j - h * dh]);
      }
      ASSERT_EQ(after[bt * w * dh + j], want) << "qkv flat " << bt * w * dh + j;
    }
  }
}

TEST(Rope, BackwardUndoesForward) {
  const int64_t nb = 1, nt = 17, nh = 2, dh = 8;
  Tensor table = make_table(nt, dh);
  const TensorView tv = table.view();
  OpCase c;
  c.name = "rope round trip";
  c.args = {in("x", DType::kF32, {nb, nt, nh, dh}), out("y", DType::kF32, {nb, nt, nh, dh}),
            out("back", DType::kF32, {nb, nt, nh, dh})};
  c.run = [tv](Context& ctx, const Args& a) {
    rope_fwd(ctx, a["y"], a["x"], tv);
    rope_bwd(ctx, a["back"], a["y"], tv);
  };
  OpRun r = run_op(c, Device::cpu());
  // cos² + sin² = 1 up to the table's fp32 rounding, plus the fp32 rotations.
  EXPECT_TRUE(expect_close("back", {nb, nt, nh, dh}, r.values("back"), r.values("x"),
                           tol_reduction(DType::kF32, 4)));
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  const int64_t nb = 1, nt = 3, nh = 2, dh = 6;
  Tensor table = make_table(nt, dh);
  const TensorView tv = table.view();
  GradCase g;
  g.name = "rope";
  g.args = {in("x", DType::kF32, {nb, nt, nh, dh}), out("y", DType::kF32, {nb, nt, nh, dh}),
            in("dy", DType::kF32, {nb, nt, nh, dh}), out("dx", DType::kF32, {nb, nt, nh, dh})};
  g.forward = [tv](Context& ctx, const Args& a) { rope_fwd(ctx, a["y"], a["x"], tv); };
  g.backward = [tv](Context& ctx, const Args& a) { rope_bwd(ctx, a["dx"], a["dy"], tv); };
  g.loss = {{"y", "dy"}};
  g.grads = {{"x", "dx"}};
  EXPECT_TRUE(check_gradients(g));
}

TEST(Rope, BadArgumentsAreUserErrors) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  Tensor table = make_table(4, 8);
  Tensor x = Tensor::zeros({1, 4, 2, 8}, DType::kBF16, cpu),
         y = Tensor::zeros({1, 4, 2, 8}, DType::kBF16, cpu);
  Tensor x5 = Tensor::zeros({1, 5, 2, 8}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_fwd(ctx, x5, x5, table); },
                                {"rope_fwd", "table has 4 positions", "T = 5"}));
  Tensor odd = Tensor::zeros({1, 4, 2, 7}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_fwd(ctx, odd, odd, table); }, {"Dh = 7", "even"}));
  Tensor x16 = Tensor::zeros({1, 4, 2, 16}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_bwd(ctx, x16, x16, table); },
                                {"rope_bwd", "[4, 4, 2]", "[T, 8, 2]"}));
  TensorView strided_last(x.data(), DType::kBF16, {1, 4, 2, 4}, {64, 16, 8, 2}, cpu);
  TensorView y4(y.data(), DType::kBF16, {1, 4, 2, 4}, cpu);
  Tensor table4 = make_table(4, 4);
  EXPECT_TRUE(throws_user_error([&] { rope_fwd(ctx, y4, strided_last, table4); },
                                {"last dim (Dh) of x must be contiguous"}));
  TensorView shifted(static_cast<uint16_t*>(x.data()) + 8, DType::kBF16, {1, 4, 2, 8}, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_fwd(ctx, shifted, x, table); },
                                {"overlap without being the same view"}));
  Tensor table_bf = Tensor::zeros({4, 4, 2}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_fwd(ctx, y, x, table_bf); }, {"table must be f32"}));
  RopeConfig bad;
  bad.factor = 8.0f;
  bad.low_freq_factor = 4.0f;
  bad.high_freq_factor = 1.0f;
  Tensor t = Tensor::empty({4, 4, 2}, DType::kF32, cpu);
  EXPECT_TRUE(throws_user_error([&] { rope_table(ctx, t, bad); },
                                {"rope_table", "low_freq_factor < high_freq_factor"}));
}

}  // namespace
}  // namespace lowbit::test

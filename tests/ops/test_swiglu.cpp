// SwiGLU, CPU twin: forward and backward against the fp64 formulas (incl. ±inf/NaN inputs),
// finite differences of the backward (f32 path), and argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

// fp64 formulas, written the way the op defines them so that ±inf and NaN propagate alike.
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
double silu(double g) { return g * sigmoid(g); }
double dsilu(double g) {
  const double s = sigmoid(g);
  return s * (1.0 + g * (1.0 - s));
}

OpCase fwd_case(int64_t n, int64_t f, Fill fill) {
  OpCase c;
  c.name = "swiglu_fwd";
  c.args = {in("gate_up", DType::kBF16, {n, 2 * f}, fill), out("out", DType::kBF16, {n, f})};
  c.run = [](Context& ctx, const Args& a) { swiglu_fwd(ctx, a["out"], a["gate_up"]); };
  return c;
}

TEST(Swiglu, ForwardMatchesFp64Formula) {
  for (const Fill& fill : {Fill::gaussian(3.0), Fill::specials(3.0)}) {
    const int64_t n = 13, f = 40;
    OpRun r = run_op(fwd_case(n, f, fill), Device::cpu());
    ASSERT_TRUE(r.intact());
    const auto gu = r.values("gate_up");
    std::vector<double> want(n * f);
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t i = 0; i < f; ++i) {
        want[row * f + i] =
            round_to(DType::kBF16, silu(gu[row * 2 * f + i]) * gu[row * 2 * f + f + i]);
      }
    }
    // exp, 1 + e, reciprocal, two products: a few fp32 roundings before the bf16 one.
    EXPECT_TRUE(expect_close("out " + fill.name(), {n, f}, r.values("out"), want,
                             tol_rounded(DType::kBF16, 6)));
  }
}

TEST(Swiglu, BackwardMatchesFp64Formula) {
  for (const Fill& fill : {Fill::gaussian(3.0), Fill::specials(3.0)}) {
    const int64_t n = 11, f = 24;
    OpCase c;
    c.name = "swiglu_bwd";
    c.args = {in("gate_up", DType::kBF16, {n, 2 * f}, fill), in("dout", DType::kBF16, {n, f}),
              out("dgate_up", DType::kBF16, {n, 2 * f})};
    c.run = [](Context& ctx, const Args& a) {
      swiglu_bwd(ctx, a["dgate_up"], a["dout"], a["gate_up"]);
    };
    OpRun r = run_op(c, Device::cpu());
    ASSERT_TRUE(r.intact());
    const auto gu = r.values("gate_up"), dy = r.values("dout");
    std::vector<double> want(n * 2 * f);
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t i = 0; i < f; ++i) {
        const double g = gu[row * 2 * f + i], u = gu[row * 2 * f + f + i], d = dy[row * f + i];
        want[row * 2 * f + i] = round_to(DType::kBF16, d * u * dsilu(g));
        want[row * 2 * f + f + i] = round_to(DType::kBF16, d * silu(g));
      }
    }
    // dsilu's 1 + g·(1 − s) cancels near g ≈ −1.28: a 2-term sum bounded by the tensor's scale.
    EXPECT_TRUE(expect_close("dgate_up " + fill.name(), {n, 2 * f}, r.values("dgate_up"), want,
                             tol_reduction(DType::kBF16, 2, 8)));
  }
}

TEST(Swiglu, GradientMatchesFiniteDifferences) {
  const int64_t n = 3, f = 5;
  GradCase g;
  g.name = "swiglu";
  g.args = {in("gate_up", DType::kF32, {n, 2 * f}, Fill::gaussian(2.0)),
            out("out", DType::kF32, {n, f}), in("dout", DType::kF32, {n, f}),
            out("dgate_up", DType::kF32, {n, 2 * f})};
  g.forward = [](Context& ctx, const Args& a) { swiglu_fwd(ctx, a["out"], a["gate_up"]); };
  g.backward = [](Context& ctx, const Args& a) {
    swiglu_bwd(ctx, a["dgate_up"], a["dout"], a["gate_up"]);
  };
  g.loss = {{"out", "dout"}};
  g.grads = {{"gate_up", "dgate_up"}};
  EXPECT_TRUE(check_gradients(g));
}

TEST(Swiglu, BadArgumentsAreUserErrors) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  Tensor gu = Tensor::zeros({4, 10}, DType::kBF16, cpu),
         out = Tensor::zeros({4, 5}, DType::kBF16, cpu);
  Tensor out6 = Tensor::zeros({4, 6}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_fwd(ctx, out6, gu); },
                                {"swiglu_fwd", "gate_up must be [N, 2F] = [4, 12]", "[4, 10]"}));
  Tensor dgu = Tensor::zeros({4, 12}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_bwd(ctx, dgu, out, gu); },
                                {"swiglu_bwd", "dgate_up has shape [4, 12]"}));
  Tensor gu16 = Tensor::zeros({4, 10}, DType::kF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { swiglu_fwd(ctx, out, gu16); }, {"gate_up must be bf16"}));
  Tensor gu3 = Tensor::zeros({4, 10, 1}, DType::kBF16, cpu);
  EXPECT_TRUE(
      throws_user_error([&] { swiglu_fwd(ctx, out, gu3); }, {"gate_up [N, 2F] must be 2-D"}));
}

}  // namespace
}  // namespace lowbit::test

// Fused softmax cross-entropy, CPU twin: losses and gradients against a long-double formula,
// the gradient against finite differences of the loss, ignore_index rows, large logits (no
// overflow, shift invariance), specials, chunked and in-place calls giving the same bits as one
// call, and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

using test::Args;
using test::Fill;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Reference of one row: loss and gradient (grad_scale · (softmax − onehot)) in long double.
struct RowRef {
  double loss;
  std::vector<double> grad;
};

RowRef reference_row(const double* x, int64_t V, int64_t t, double grad_scale) {
  long double m = -kInf;
  for (int64_t j = 0; j < V; ++j) m = std::max<long double>(m, x[j]);
  long double s = 0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<long double>(x[j]) - m);
  const long double lse = m + std::log(s);
  RowRef r;
  r.loss = static_cast<double>(lse - x[t]);
  r.grad.resize(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) {
    const long double p = std::exp(static_cast<long double>(x[j]) - lse);
    r.grad[j] = static_cast<double>(grad_scale * (p - (j == t ? 1.0L : 0.0L)));
  }
  return r;
}

// A case of the op: logits [n, V] (dtype), targets [n] i32, losses [n] f32, dlogits [n, V].
test::OpCase ce_case(int64_t n, int64_t V, DType dt, Fill logits, Fill targets, int ignore_index,
                     float grad_scale) {
  test::OpCase c;
  c.name = fmt::format("cross_entropy {}x{} {} {}", n, V, dtype_name(dt), logits.name());
  c.args = {test::in("logits", dt, {n, V}, std::move(logits)),
            test::in("targets", DType::kI32, {n}, std::move(targets)),
            test::out("losses", DType::kF32, {n}), test::out("dlogits", dt, {n, V})};
  c.run = [ignore_index, grad_scale](Context& ctx, const Args& a) {
    const TensorView dl = a["dlogits"];
    cross_entropy_fwd_bwd(ctx, a["losses"], &dl, a["logits"], a["targets"], ignore_index,
                          grad_scale);
  };
  return c;
}

// Checks a CPU run of `c` against reference_row for every row (ignored rows: 0 and zeros).
void expect_matches_reference(const test::OpCase& c, int ignore_index, float grad_scale) {
  SCOPED_TRACE(c.name);
  const test::OpRun r = test::run_op(c, Device::cpu());
  ASSERT_TRUE(r.intact());
  const Shape& s = r.shape("logits");
  const int64_t n = s[0], V = s[1];
  const std::vector<double> x = r.initial("logits"), tg = r.initial("targets");
  const std::vector<double> loss = r.values("losses"), dx = r.values("dlogits");
  const DType dt = r.buf("dlogits").spec.dtype;
  const double u = test::unit_roundoff(dt);
  int64_t checked = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(tg[i]);
    if (t == ignore_index) {
      EXPECT_EQ(loss[i], 0.0) << "row " << i;
      for (int64_t j = 0; j < V; ++j) ASSERT_EQ(dx[i * V + j], 0.0) << "row " << i << " col " << j;
      continue;
    }
    const RowRef ref = reference_row(&x[i * V], V, t, grad_scale);
    // The twin works in fp64 and rounds once: within an fp32 ulp of the loss (plus the fp64
    // error of the sum, far below it), within a rounding of the gradient's dtype.
    const double lb = 0x1p-23 * std::fabs(ref.loss) + 1e-12;
    EXPECT_LE(std::fabs(loss[i] - ref.loss), lb)
        << "row " << i << ": loss " << loss[i] << ", want " << ref.loss;
    for (int64_t j = 0; j < V; ++j) {
      const double want = ref.grad[j], got = dx[i * V + j];
      const double b = 2.01 * u * std::fabs(want) + test::subnormal_step(dt);
      ASSERT_LE(std::fabs(got - want), b)
          << "row " << i << " col " << j << ": got " << got << ", want " << want;
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(CrossEntropy, MatchesLongDoubleFormula) {
  struct Shape2 {
    int64_t n, V;
  };
  for (const Shape2 sh : {Shape2{1, 1}, Shape2{5, 17}, Shape2{4, 1000}, Shape2{2, 50257}}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      // Targets in [-1, V): -1 is ignore_index, so a few rows are ignored.
      expect_matches_reference(ce_case(sh.n, sh.V, dt, Fill::gaussian(2.0),
                                       Fill::ints(sh.V > 1 ? -1 : 0, sh.V), -1, 0.125f),
                               -1, 0.125f);
    }
  }
  // Peaked rows (logits of stddev 20): losses near 0 and near 100.
  expect_matches_reference(
      ce_case(6, 300, DType::kBF16, Fill::gaussian(20.0), Fill::ints(0, 300), -100, 1.0f), -100,
      1.0f);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  for (const float gs : {1.0f, 0.25f}) {
    test::GradCase g;
    g.name = fmt::format("cross_entropy 4x11 grad_scale {}", gs);
    // Row 2 is ignored (target -1): its loss is constant, its gradient zero.
    g.args = {test::in("logits", DType::kF32, {4, 11}, Fill::gaussian(1.5)),
              test::in("targets", DType::kI32, {4},
                       Fill::custom("3, 0, -1, 10",
                                    [](int64_t i) {
                                      static const int kTargets[4] = {3, 0, -1, 10};
                                      return double(kTargets[i]);
                                    })),
              // L = Σ w · loss with w = grad_scale, so dL/dlogits is what the op writes.
              test::in("w", DType::kF32, {4}, Fill::constant(gs)),
              test::out("losses", DType::kF32, {4}), test::out("dlogits", DType::kF32, {4, 11})};
    g.forward = [](Context& ctx, const Args& a) {
      cross_entropy_fwd_bwd(ctx, a["losses"], nullptr, a["logits"], a["targets"], -1, 1.0f);
    };
    g.backward = [gs](Context& ctx, const Args& a) {
      const TensorView dl = a["dlogits"];
      cross_entropy_fwd_bwd(ctx, a["losses"], &dl, a["logits"], a["targets"], -1, gs);
    };
    g.loss = {{"losses", "w"}};
    g.grads = {{"logits", "dlogits"}};
    EXPECT_TRUE(test::check_gradients(g));
  }
}

TEST(CrossEntropy, IgnoreIndexInsideTheVocabulary) {
  // ignore_index = 3 is also a valid token id: rows targeting 3 are ignored, others are not.
  const int64_t n = 8, V = 9;
  test::OpCase c = ce_case(n, V, DType::kBF16, Fill::gaussian(),
                           Fill::custom("t", [](int64_t i) { return double(i % 5); }), 3, 0.5f);
  expect_matches_reference(c, 3, 0.5f);
  const test::OpRun r = test::run_op(c, Device::cpu());
  EXPECT_EQ(r.values("losses")[3], 0.0);
  EXPECT_GT(r.values("losses")[2], 0.0);
}

TEST(CrossEntropy, LargeLogitsDoNotOverflow) {
  // Logits near the bf16 maximum (±3e38): log-sum-exp must not overflow; a loss is +inf only
  // where the true value exceeds the fp32 maximum (m − x_t > 3.4e38).
  test::OpCase c = ce_case(16, 33, DType::kBF16, Fill::large(), Fill::ints(0, 33), -1, 1.0f);
  const test::OpRun r = test::run_op(c, Device::cpu());
  const std::vector<double> x = r.initial("logits"), tg = r.initial("targets");
  const std::vector<double> loss = r.values("losses"), dx = r.values("dlogits");
  int finite = 0;
  for (int64_t i = 0; i < 16; ++i) {
    double m = -kInf;
    for (int64_t j = 0; j < 33; ++j) m = std::max(m, x[i * 33 + j]);
    const double want = m - x[i * 33 + int64_t(tg[i])];  // exp of the rest underflows to 0
    const double want32 = double(static_cast<float>(want));
    EXPECT_EQ(loss[i], want32) << "row " << i;
    finite += std::isfinite(loss[i]);
    for (int64_t j = 0; j < 33; ++j) ASSERT_TRUE(std::isfinite(dx[i * 33 + j])) << i << "," << j;
  }
  EXPECT_GT(finite, 0);

  // Shift invariance: logits d and d + 30000 (f32, where both are exact) give the same loss and
  // gradient.
  auto shifted = [](double c0) {
    return Fill::custom("d + c", [c0](int64_t i) {
      return c0 + std::ldexp(std::round(64.0 * std::sin(0.7 * double(i)) * 3.0), -6);
    });
  };
  const test::OpRun a = test::run_op(
      ce_case(3, 40, DType::kF32, shifted(0.0), Fill::ints(0, 40), -1, 1.0f), Device::cpu());
  const test::OpRun b = test::run_op(
      ce_case(3, 40, DType::kF32, shifted(30000.0), Fill::ints(0, 40), -1, 1.0f), Device::cpu());
  EXPECT_TRUE(test::expect_close("losses", {3}, b.values("losses"), a.values("losses"),
                                 test::tol_rounded(DType::kF32, 2)));
  EXPECT_TRUE(test::expect_close("dlogits", {3, 40}, b.values("dlogits"), a.values("dlogits"),
                                 test::tol_rounded(DType::kF32, 2)));
}

TEST(CrossEntropy, SpecialValuesFollowTheFormulas) {
  const int64_t V = 6;
  const double inf = kInf, nan = std::numeric_limits<double>::quiet_NaN();
  // Row 0: a NaN logit; row 1: a +inf logit; row 2: the target's logit is −inf; row 3: all −inf;
  // row 4: −inf elsewhere (the softmax puts all mass on the target: loss 0, gradient 0).
  const double rows[5][6] = {{1, 2, nan, 0, 1, 2},
                             {1, inf, 0, 0, 1, 2},
                             {-inf, 1, 2, 3, 0, 1},
                             {-inf, -inf, -inf, -inf, -inf, -inf},
                             {-inf, -inf, 5, -inf, -inf, -inf}};
  const int targets[5] = {1, 0, 0, 2, 2};
  test::OpCase c = ce_case(
      5, V, DType::kBF16, Fill::custom("specials", [&](int64_t i) { return rows[i / V][i % V]; }),
      Fill::custom("t", [&](int64_t i) { return double(targets[i]); }), -1, 1.0f);
  const test::OpRun r = test::run_op(c, Device::cpu());
  const std::vector<double> loss = r.values("losses"), dx = r.values("dlogits");
  EXPECT_TRUE(std::isnan(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_EQ(loss[2], inf);
  EXPECT_TRUE(std::isnan(loss[3]));
  EXPECT_EQ(loss[4], 0.0);
  for (int64_t j = 0; j < V; ++j) {
    EXPECT_TRUE(std::isnan(dx[0 * V + j]));
    EXPECT_TRUE(std::isnan(dx[1 * V + j]));
    EXPECT_TRUE(std::isfinite(dx[2 * V + j]));
    EXPECT_TRUE(std::isnan(dx[3 * V + j]));
    EXPECT_EQ(dx[4 * V + j], 0.0);
  }
  EXPECT_EQ(dx[2 * V + 0], -1.0);  // softmax 0 at the −inf target: gradient −grad_scale
}

// Bytes of a host tensor.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

TEST(CrossEntropy, ChunkedAndInPlaceCallsGiveTheSameBits) {
  const int64_t n = 12, V = 101;
  const test::OpRun one =
      test::run_op(ce_case(n, V, DType::kBF16, Fill::gaussian(3.0), Fill::ints(-1, V), -1, 0.01f),
                   Device::cpu());
  // The same logits, processed in chunks of 5, 5 and 2 rows, in place.
  Context ctx(Device::cpu());
  Tensor logits = Tensor::empty({n, V}, DType::kBF16, Device::cpu());
  Tensor targets = Tensor::empty({n}, DType::kI32, Device::cpu());
  Tensor losses = Tensor::empty({n}, DType::kF32, Device::cpu());
  const std::vector<double> x = one.initial("logits"), tg = one.initial("targets");
  for (int64_t i = 0; i < n * V; ++i) logits.ptr<uint16_t>()[i] = f32_to_bf16_rn(float(x[i]));
  for (int64_t i = 0; i < n; ++i) targets.ptr<int32_t>()[i] = int32_t(tg[i]);
  for (int64_t r0 = 0; r0 < n; r0 += 5) {
    const int64_t rows = std::min<int64_t>(5, n - r0);
    const TensorView lg(logits.ptr<uint16_t>() + r0 * V, DType::kBF16, {rows, V}, Device::cpu());
    const TensorView t(targets.ptr<int32_t>() + r0, DType::kI32, {rows}, Device::cpu());
    const TensorView l(losses.ptr<float>() + r0, DType::kF32, {rows}, Device::cpu());
    cross_entropy_fwd_bwd(ctx, l, &lg, lg, t, -1, 0.01f);
  }
  const std::vector<double> want_loss = one.values("losses"), want_dx = one.values("dlogits");
  for (int64_t i = 0; i < n; ++i) {
    const float w = static_cast<float>(want_loss[i]);
    EXPECT_EQ(std::memcmp(&losses.ptr<float>()[i], &w, 4), 0) << "row " << i;
  }
  for (int64_t i = 0; i < n * V; ++i) {
    ASSERT_EQ(logits.ptr<uint16_t>()[i], f32_to_bf16_rn(float(want_dx[i]))) << "element " << i;
  }
  // Without dlogits: the same losses, logits untouched.
  Tensor fresh = Tensor::empty({n, V}, DType::kBF16, Device::cpu());
  for (int64_t i = 0; i < n * V; ++i) fresh.ptr<uint16_t>()[i] = f32_to_bf16_rn(float(x[i]));
  const std::vector<uint8_t> before = bytes_of(fresh);
  Tensor losses2 = Tensor::empty({n}, DType::kF32, Device::cpu());
  cross_entropy_fwd_bwd(ctx, losses2, nullptr, fresh, targets, -1, 0.01f);
  EXPECT_EQ(bytes_of(fresh), before);
  EXPECT_EQ(bytes_of(losses2), bytes_of(losses));
}

// The UserError message of `fn`, or "" when it does not throw one.
template <typename Fn>
std::string user_error(Fn fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(CrossEntropy, BadInputsAreUserErrors) {
  Context ctx(Device::cpu());
  Tensor logits = Tensor::zeros({3, 17}, DType::kBF16, Device::cpu());
  Tensor dl = Tensor::zeros({3, 17}, DType::kBF16, Device::cpu());
  Tensor targets = Tensor::zeros({3}, DType::kI32, Device::cpu());
  Tensor losses = Tensor::zeros({3}, DType::kF32, Device::cpu());
  const TensorView dlv = dl.view();

  // A target outside [0, V): nothing is written.
  targets.ptr<int32_t>()[2] = 17;
  losses.ptr<float>()[0] = 42.0f;
  std::string msg =
      user_error([&] { cross_entropy_fwd_bwd(ctx, losses, &dlv, logits, targets, -1, 1); });
  EXPECT_NE(msg.find("targets[2] = 17"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ignore_index"), std::string::npos) << msg;
  EXPECT_EQ(losses.ptr<float>()[0], 42.0f);
  targets.ptr<int32_t>()[2] = -5;
  msg = user_error([&] { cross_entropy_fwd_bwd(ctx, losses, nullptr, logits, targets, -1, 1); });
  EXPECT_NE(msg.find("targets[2] = -5"), std::string::npos) << msg;
  targets.ptr<int32_t>()[2] = -100;  // ... unless it is the ignore_index
  EXPECT_EQ(
      user_error([&] { cross_entropy_fwd_bwd(ctx, losses, nullptr, logits, targets, -100, 1); }),
      "");

  Tensor l4 = Tensor::zeros({4}, DType::kF32, Device::cpu());
  msg = user_error([&] { cross_entropy_fwd_bwd(ctx, l4, nullptr, logits, targets, -100, 1); });
  EXPECT_NE(msg.find("losses [n] has 4 entries"), std::string::npos) << msg;
  Tensor t_i64 = Tensor::zeros({3}, DType::kI64, Device::cpu());
  msg = user_error([&] { cross_entropy_fwd_bwd(ctx, losses, nullptr, logits, t_i64, -100, 1); });
  EXPECT_NE(msg.find("targets must be i32"), std::string::npos) << msg;
  Tensor l16 = Tensor::zeros({3, 17}, DType::kF16, Device::cpu());
  msg = user_error([&] { cross_entropy_fwd_bwd(ctx, losses, nullptr, l16, targets, -100, 1); });
  EXPECT_NE(msg.find("logits must be bf16"), std::string::npos) << msg;
  Tensor dl_wrong = Tensor::zeros({3, 16}, DType::kBF16, Device::cpu());
  const TensorView dlw = dl_wrong.view();
  msg = user_error([&] { cross_entropy_fwd_bwd(ctx, losses, &dlw, logits, targets, -100, 1); });
  EXPECT_NE(msg.find("dlogits has shape [3, 16]"), std::string::npos) << msg;
  // dlogits overlapping logits by one row: neither in place nor separate.
  Tensor big = Tensor::zeros({4, 17}, DType::kBF16, Device::cpu());
  const TensorView a(big.ptr<uint16_t>(), DType::kBF16, {3, 17}, Device::cpu());
  const TensorView b(big.ptr<uint16_t>() + 17, DType::kBF16, {3, 17}, Device::cpu());
  msg = user_error([&] { cross_entropy_fwd_bwd(ctx, losses, &b, a, targets, -100, 1); });
  EXPECT_NE(msg.find("partly overlaps"), std::string::npos) << msg;
  msg = user_error(
      [&] { cross_entropy_fwd_bwd(ctx, losses, nullptr, logits, targets, -100, std::nanf("")); });
  EXPECT_NE(msg.find("grad_scale must be finite"), std::string::npos) << msg;
  Tensor empty_rows = Tensor::zeros({3, 0}, DType::kBF16, Device::cpu());
  msg = user_error(
      [&] { cross_entropy_fwd_bwd(ctx, losses, nullptr, empty_rows, targets, -100, 1); });
  EXPECT_NE(msg.find("rows of width 0"), std::string::npos) << msg;
  // Zero rows is fine (nothing to do).
  Tensor none = Tensor::zeros({0, 17}, DType::kBF16, Device::cpu());
  Tensor t0 = Tensor::zeros({0}, DType::kI32, Device::cpu());
  Tensor l0 = Tensor::zeros({0}, DType::kF32, Device::cpu());
  EXPECT_EQ(user_error([&] { cross_entropy_fwd_bwd(ctx, l0, nullptr, none, t0, -100, 1); }), "");
}

}  // namespace
}  // namespace lowbit

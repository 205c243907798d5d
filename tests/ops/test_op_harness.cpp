// The op harness itself: fills, guards, comparisons and the finite-difference check, on toy ops
// written here (so that a broken harness cannot hide a broken op).
#include <gtest/gtest.h>

#include <cmath>

#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

// y [n] f32 = x², written through the view (honours strides).
void square_op(const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = x.ptr<float>()[i * x.strides[0]];
    y.ptr<float>()[i * y.strides[0]] = v * v;
  }
}

TEST(OpHarness, FillsAreDeterministicAndHaveTheirRanges) {
  OpCase c;
  c.args = {
      in("g", DType::kBF16, {1000}, Fill::gaussian()), in("l", DType::kBF16, {1000}, Fill::large()),
      in("s", DType::kBF16, {1000}, Fill::small()), in("x", DType::kF32, {1000}, Fill::specials()),
      in("t", DType::kI32, {1000}, Fill::ints(3, 7))};
  c.run = [](Context&, const Args&) {};
  OpRun a = run_op(c, Device::cpu(), 5), b = run_op(c, Device::cpu(), 5);
  for (const char* n : {"g", "l", "s", "t"}) EXPECT_EQ(a.values(n), b.values(n)) << n;
  int nan = 0, pinf = 0, ninf = 0;
  for (double v : a.values("x"))
    nan += std::isnan(v), pinf += v == INFINITY, ninf += v == -INFINITY;
  EXPECT_GT(nan, 0);
  EXPECT_GT(pinf, 0);
  EXPECT_GT(ninf, 0);
  for (double v : a.values("l")) EXPECT_TRUE(std::fabs(v) >= 7e37 && std::isfinite(v)) << v;
  int subnormal = 0;
  for (double v : a.values("s")) {
    EXPECT_LT(std::fabs(v), 0x1p-118);
    subnormal += std::fabs(v) < 0x1p-126;
  }
  EXPECT_GT(subnormal, 100);
  for (double v : a.values("t")) EXPECT_TRUE(v >= 3 && v < 7) << v;
  EXPECT_TRUE(a.intact());
}

TEST(OpHarness, GuardsCatchWritesOutsideTheViewAndIntoInputs) {
  OpCase c;
  c.args = {in("x", DType::kF32, {16}), out("y", DType::kF32, {16})};
  c.run = [](Context&, const Args& a) {
    square_op(a["y"], a["x"]);
    a["y"].ptr<float>()[16] = 0;  // one past the end
  };
  OpRun r = run_op(c, Device::cpu());
  EXPECT_FALSE(r.intact());
  EXPECT_NE(r.integrity.find("guard byte"), std::string::npos) << r.integrity;

  c.run = [](Context&, const Args& a) { a["x"].ptr<float>()[3] = 1.0f; };
  r = run_op(c, Device::cpu());
  EXPECT_NE(r.integrity.find("input 'x' was modified"), std::string::npos) << r.integrity;

  // A strided view: writing into the gap between elements is caught.
  c.args = {in("x", DType::kF32, {8}), strided(out("y", DType::kF32, {8}), {3})};
  c.run = [](Context&, const Args& a) { square_op(a["y"], a["x"]); };
  EXPECT_TRUE(run_op(c, Device::cpu()).intact());
  c.run = [](Context&, const Args& a) { a["y"].ptr<float>()[1] = 0; };
  r = run_op(c, Device::cpu());
  EXPECT_NE(r.integrity.find("gap"), std::string::npos) << r.integrity;
}

TEST(OpHarness, CompareReportsFirstMismatchAndNanRules) {
  const Shape s{2, 3};
  const Tol t = tol_rounded(DType::kBF16, 0);
  EXPECT_TRUE(expect_close("o", s, {1, 2, 3, NAN, INFINITY, 0}, {1, 2, 3, NAN, INFINITY, 0}, t));
  // One bf16 ulp at 1.0 (2^-7) passes, two do not.
  EXPECT_TRUE(expect_close("o", s, {1 + 0x1p-7, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}, t));
  auto r = expect_close("o", s, {1, 2, 3, 4, 5 + 0x1p-4, 6}, {1, 2, 3, 4, 5, 6}, t);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("o[1, 1]"), std::string::npos) << r.message();
  EXPECT_FALSE(expect_close("o", s, {1, 2, 3, 4, 5, NAN}, {1, 2, 3, 4, 5, 6}, t));
  EXPECT_FALSE(expect_close("o", s, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, NAN}, t));
  EXPECT_FALSE(expect_close("o", s, {1, 2, 3, 4, 5, -INFINITY}, {1, 2, 3, 4, 5, INFINITY}, t));
  EXPECT_FALSE(expect_close("o", s, {1, 2, 3, 4, 5, 1e30}, {1, 2, 3, 4, 5, INFINITY}, t));
  EXPECT_FALSE(expect_close("o", s, {0, 2, 3, 4, 5, 6}, {-0.0, 2, 3, 4, 5, 6}, Tol::exact()));
  EXPECT_EQ(round_to(DType::kBF16, 1.0 + 0x1p-9), 1.0);
}

TEST(OpHarness, GradientCheckAcceptsTheRightBackwardAndRejectsAWrongOne) {
  GradCase g;
  g.name = "square";
  g.args = {in("x", DType::kF32, {7}), out("y", DType::kF32, {7}), in("dy", DType::kF32, {7}),
            out("dx", DType::kF32, {7})};
  g.forward = [](Context&, const Args& a) { square_op(a["y"], a["x"]); };
  g.loss = {{"y", "dy"}};
  g.grads = {{"x", "dx"}};
  g.backward = [](Context&, const Args& a) {
    for (int i = 0; i < 7; ++i) {
      a["dx"].ptr<float>()[i] += 2.0f * a["x"].ptr<float>()[i] * a["dy"].ptr<float>()[i];
    }
  };
  EXPECT_TRUE(check_gradients(g));
  g.backward = [](Context&, const Args& a) {
    for (int i = 0; i < 7; ++i) {
      a["dx"].ptr<float>()[i] += 2.01f * a["x"].ptr<float>()[i] * a["dy"].ptr<float>()[i];
    }
  };
  EXPECT_FALSE(check_gradients(g));
}

}  // namespace
}  // namespace lowbit::test

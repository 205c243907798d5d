// add and convert, CPU twin: add against fp64 sums rounded once, in place, with specials;
// convert against an independent round-to-nearest-even and over every bf16 value; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

OpCase add_case(DType t, Shape s, Fill fill) {
  OpCase c;
  c.name = "add";
  c.args = {in("a", t, s, fill), in("b", t, s, fill), out("out", t, s)};
  c.run = [](Context& ctx, const Args& a) { add(ctx, a["out"], a["a"], a["b"]); };
  return c;
}

TEST(Add, MatchesOneRoundingOfTheSum) {
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (const Fill& fill : standard_fills()) {
      OpRun r = run_op(add_case(t, {7, 33}, fill), Device::cpu());
      ASSERT_TRUE(r.intact());
      const auto a = r.values("a"), b = r.values("b");
      std::vector<double> fp32_sum(a.size()), exact(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        fp32_sum[i] = round_to(t, double(float(a[i]) + float(b[i])));  // the definition
        exact[i] = round_to(t, a[i] + b[i]);                           // fp64 sum, one rounding
      }
      EXPECT_TRUE(
          expect_close("out " + fill.name(), {7, 33}, r.values("out"), fp32_sum, Tol::exact()));
      // The fp32 sum of two bf16 values is exact unless their exponents are far apart, so the
      // result is at most one ulp from the exactly rounded sum.
      EXPECT_TRUE(
          expect_close("out " + fill.name(), {7, 33}, r.values("out"), exact, tol_rounded(t, 0)));
    }
  }
}

TEST(Add, InPlace) {
  OpCase c;
  c.name = "add in place";
  c.args = {inout("a", DType::kBF16, {5, 9}, Fill::gaussian()), in("b", DType::kBF16, {5, 9})};
  c.run = [](Context& ctx, const Args& a) { add(ctx, a["a"], a["a"], a["b"]); };
  OpRun r = run_op(c, Device::cpu());
  const auto a0 = r.initial("a"), b = r.values("b");
  std::vector<double> want(a0.size());
  for (size_t i = 0; i < a0.size(); ++i)
    want[i] = round_to(DType::kBF16, float(a0[i]) + float(b[i]));
  EXPECT_TRUE(expect_close("a", {5, 9}, r.values("a"), want, Tol::exact()));
}

// Independent f32 → bf16 rounding: the nearer of the two neighbouring bf16 values (compared in
// fp64), ties to the even code; NaN stays NaN.
double bf16_nearest(float x) {
  if (std::isnan(x)) return NAN;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);  // may be ±inf: the value past the largest finite bf16
  const double dlo = std::fabs(double(x) - flo), dhi = std::fabs(double(fhi) - x);
  if (std::isinf(fhi) && !std::isinf(x)) {
    // Past max: RN overflows to inf when |x| ≥ max + half an ulp (the midpoint to 2^128).
    const double mid = double(flo) + std::ldexp(1.0, 127 - 8);
    return std::fabs(double(x)) >= mid ? double(fhi) : double(flo);
  }
  if (dlo < dhi) return flo;
  if (dhi < dlo) return fhi;
  return ((lo >> 16) & 1u) ? fhi : flo;
}

TEST(Convert, F32ToBf16IsRoundToNearestEven) {
  // Gaussians, values near every bf16 rounding boundary of a few binades, max and overflow.
  std::vector<float> xs;
  for (int i = 0; i < 4000; ++i)
    xs.push_back(float(std::sin(i * 0.7) * std::ldexp(1.0, i % 60 - 30)));
  for (uint32_t top : {0x3F80u, 0x3F81u, 0x4049u, 0x0001u, 0x7F7Fu, 0xBF80u}) {
    for (int32_t d = -3; d <= 3; ++d) {
      const uint32_t u = (top << 16) + 0x8000u + uint32_t(d);  // around the midpoint
      float x;
      std::memcpy(&x, &u, 4);
      xs.push_back(x);
    }
  }
  xs.push_back(INFINITY);
  xs.push_back(-INFINITY);
  xs.push_back(NAN);
  const int64_t n = int64_t(xs.size());
  OpCase c;
  c.name = "convert f32->bf16";
  c.args = {in("src", DType::kF32, {n}, Fill::custom("sweep", [&](int64_t i) { return xs[i]; })),
            out("dst", DType::kBF16, {n})};
  c.run = [](Context& ctx, const Args& a) { convert(ctx, a["dst"], a["src"]); };
  OpRun r = run_op(c, Device::cpu());
  ASSERT_TRUE(r.intact());
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = bf16_nearest(xs[i]);
  EXPECT_TRUE(expect_close("dst", {n}, r.values("dst"), want, Tol::exact()));
}

TEST(Convert, EveryBf16ValueWidensExactlyAndRoundTrips) {
  const int64_t n = 65536;
  const Device cpu = Device::cpu();
  Context ctx(cpu);
  Tensor src = Tensor::empty({n}, DType::kBF16, cpu);  // every code
  Tensor wide = Tensor::empty({n}, DType::kF32, cpu);
  Tensor back = Tensor::empty({n}, DType::kBF16, cpu);
  for (int64_t i = 0; i < n; ++i) src.ptr<uint16_t>()[i] = uint16_t(i);
  convert(ctx, wide, src);
  convert(ctx, back, wide);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t wbits = f32_bits(wide.ptr<float>()[i]);
    const uint16_t bbits = back.ptr<uint16_t>()[i];
    if ((i & 0x7FFF) > 0x7F80) {  // NaN codes stay NaN
      ASSERT_TRUE(f32_is_nan(wide.ptr<float>()[i])) << i;
      ASSERT_GT(bbits & 0x7FFF, 0x7F80) << i;
    } else {
      ASSERT_EQ(wbits, uint32_t(i) << 16) << i;
      ASSERT_EQ(bbits, uint16_t(i)) << i;
    }
  }
}

TEST(Elementwise, BadArgumentsAreUserErrors) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  Tensor a = Tensor::zeros({4, 8}, DType::kBF16, cpu), b = Tensor::zeros({4, 8}, DType::kBF16, cpu);
  Tensor f = Tensor::zeros({4, 8}, DType::kF32, cpu), h = Tensor::zeros({4, 8}, DType::kF16, cpu);
  Tensor a2 = Tensor::zeros({8, 4}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { add(ctx, a, a, f); }, {"add", "one dtype", "b f32"}));
  EXPECT_TRUE(throws_user_error([&] { add(ctx, a, a, a2); }, {"b has shape [8, 4]"}));
  EXPECT_TRUE(throws_user_error([&] { add(ctx, h, h, h); }, {"out must be bf16 or f32"}));
  EXPECT_TRUE(
      throws_user_error([&] { convert(ctx, a, h); }, {"convert", "src must be bf16 or f32"}));
  EXPECT_TRUE(throws_user_error([&] { convert(ctx, f, a2); }, {"dst has shape [4, 8]"}));
  TensorView alias(a.data(), DType::kF32, {4, 4}, cpu);
  TensorView a44(a.data(), DType::kBF16, {4, 4}, cpu);
  EXPECT_TRUE(throws_user_error([&] { convert(ctx, alias, a44); }, {"share storage"}));
  TensorView strided(a.data(), DType::kBF16, {4, 4}, {8, 1}, cpu);
  TensorView b44(b.data(), DType::kBF16, {4, 4}, cpu);
  EXPECT_TRUE(throws_user_error([&] { add(ctx, b44, strided, b44); }, {"a must be contiguous"}));
}

}  // namespace
}  // namespace lowbit::test

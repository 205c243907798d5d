// add and convert on the GPU against the CPU twin, bit for bit: every shape and fill, both
// dtypes, in place, unaligned views (scalar path), and bandwidth.
#include <gtest/gtest.h>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

const Shape kShapes[] = {{1, 16}, {65, 80}, {993, 512}, {16384, 768}, {3, 5}};

OpCase add_case(DType t, Shape s, const Fill& fill, bool in_place) {
  OpCase c;
  c.name = fmt::format("add {}{} {}{}", dtype_name(t), s.str(), fill.name(),
                       in_place ? " in place" : "");
  if (in_place) {
    c.args = {inout("a", t, s, fill), in("b", t, s, fill)};
  } else {
    c.args = {in("a", t, s, fill), in("b", t, s, Fill::gaussian()), out("out", t, s)};
  }
  c.run = [in_place](Context& ctx, const Args& a) {
    add(ctx, in_place ? a["a"] : a["out"], a["a"], a["b"]);
  };
  return c;
}

OpCase convert_case(DType to, DType from, Shape s, const Fill& fill) {
  OpCase c;
  c.name =
      fmt::format("convert {} <- {} {} {}", dtype_name(to), dtype_name(from), s.str(), fill.name());
  c.args = {in("src", from, s, fill), out("dst", to, s)};
  c.run = [](Context& ctx, const Args& a) { convert(ctx, a["dst"], a["src"]); };
  return c;
}

TEST(GpuAdd, MatchesCpuBitForBit) {
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (const Shape& s : kShapes) {
      for (const Fill& fill : standard_fills()) {
        EXPECT_TRUE(compare_cpu_gpu(add_case(t, s, fill, false)));
      }
      EXPECT_TRUE(compare_cpu_gpu(add_case(t, s, Fill::gaussian(), true)));
    }
  }
}

TEST(GpuConvert, MatchesCpuBitForBit) {
  for (const Shape& s : kShapes) {
    for (const Fill& fill : standard_fills()) {
      EXPECT_TRUE(compare_cpu_gpu(convert_case(DType::kBF16, DType::kF32, s, fill)));
      EXPECT_TRUE(compare_cpu_gpu(convert_case(DType::kF32, DType::kBF16, s, fill)));
      EXPECT_TRUE(compare_cpu_gpu(convert_case(DType::kBF16, DType::kBF16, s, fill)));
    }
  }
}

// Views starting one element into their buffers: not 16-byte aligned, so the scalar path runs
// (the harness checks the element before the view is untouched as part of the buffer).
TEST(GpuElementwise, UnalignedViews) {
  for (int64_t n : {int64_t(1), int64_t(31), int64_t(4099)}) {
    OpCase c;
    c.name = fmt::format("unaligned n={}", n);
    c.args = {in("a", DType::kBF16, {n + 1}), in("b", DType::kBF16, {n + 1}),
              inout("out", DType::kBF16, {n + 1}, Fill::zeros()),
              inout("wide", DType::kF32, {n + 1}, Fill::zeros())};
    c.run = [n](Context& ctx, const Args& a) {
      auto sub = [n](const TensorView& t) {
        return TensorView(static_cast<char*>(t.data) + dtype_bits(t.dtype) / 8, t.dtype, {n},
                          t.device);
      };
      add(ctx, sub(a["out"]), sub(a["a"]), sub(a["b"]));
      convert(ctx, sub(a["wide"]), sub(a["out"]));
    };
    EXPECT_TRUE(compare_cpu_gpu(c));
  }
}

TEST(GpuElementwisePerf, Bandwidth) {
  Context ctx(Device::cuda(0));
  for (int64_t d : {768, 2048}) {
    const int64_t n = 16384;
    const double copy = copy_gbps(ctx, n * d * 2);
    const Perf a =
        time_op(ctx, add_case(DType::kBF16, {n, d}, Fill::gaussian(), false), 3.0 * n * d * 2);
    const Perf c = time_op(ctx, convert_case(DType::kBF16, DType::kF32, {n, d}, Fill::gaussian()),
                           6.0 * n * d);
    std::printf(
        "elementwise N=%ld D=%ld: copy %.0f GB/s | add bf16 %s (%.0f%%) | convert "
        "f32->bf16 %s (%.0f%%)\n",
        long(n), long(d), copy, a.str().c_str(), 100 * a.gb_per_s / copy, c.str().c_str(),
        100 * c.gb_per_s / copy);
  }
}

}  // namespace
}  // namespace lowbit::test

// SwiGLU on the GPU against the CPU twin over shapes and fills (tolerance: expf vs exp, then one
// bf16 rounding), with guards, and bandwidth.
#include <gtest/gtest.h>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

struct Shape2 {
  int64_t n, f;
};
const Shape2 kShapes[] = {{1, 16}, {65, 80}, {993, 512}, {16384, 768}, {33, 17}};

OpCase fwd_case(Shape2 s, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("swiglu_fwd {}x{} {}", s.n, s.f, fill.name());
  c.args = {in("gate_up", DType::kBF16, {s.n, 2 * s.f}, fill),
            out("out", DType::kBF16, {s.n, s.f}, tol_rounded(DType::kBF16, 8))};
  c.run = [](Context& ctx, const Args& a) { swiglu_fwd(ctx, a["out"], a["gate_up"]); };
  return c;
}

OpCase bwd_case(Shape2 s, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("swiglu_bwd {}x{} {}", s.n, s.f, fill.name());
  // dsilu's 1 + g·(1 − s) cancels near g ≈ −1.28: a 2-term sum, bounded by the tensor's scale.
  c.args = {in("gate_up", DType::kBF16, {s.n, 2 * s.f}, fill),
            in("dout", DType::kBF16, {s.n, s.f}, Fill::gaussian()),
            out("dgate_up", DType::kBF16, {s.n, 2 * s.f}, tol_reduction(DType::kBF16, 2, 8))};
  c.run = [](Context& ctx, const Args& a) {
    swiglu_bwd(ctx, a["dgate_up"], a["dout"], a["gate_up"]);
  };
  return c;
}

std::vector<Fill> fills() {
  std::vector<Fill> f = standard_fills();
  f.push_back(Fill::gaussian(4.0));  // deep into both tails of the sigmoid
  return f;
}

TEST(GpuSwiglu, ForwardMatchesCpu) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : fills()) EXPECT_TRUE(compare_cpu_gpu(fwd_case(s, fill)));
  }
}

TEST(GpuSwiglu, BackwardMatchesCpu) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : fills()) EXPECT_TRUE(compare_cpu_gpu(bwd_case(s, fill)));
  }
}

TEST(GpuSwigluPerf, Bandwidth) {
  Context ctx(Device::cuda(0));
  for (int64_t f : {768, 2048}) {
    const int64_t n = 16384;
    const double copy = copy_gbps(ctx, n * f * 2);
    const Perf fw = time_op(ctx, fwd_case({n, f}, Fill::gaussian()), 3.0 * n * f * 2);
    const Perf bw = time_op(ctx, bwd_case({n, f}, Fill::gaussian()), 5.0 * n * f * 2);
    std::printf("swiglu N=%ld F=%ld: copy %.0f GB/s | fwd %s (%.0f%%) | bwd %s (%.0f%%)\n", long(n),
                long(f), copy, fw.str().c_str(), 100 * fw.gb_per_s / copy, bw.str().c_str(),
                100 * bw.gb_per_s / copy);
  }
}

}  // namespace
}  // namespace lowbit::test

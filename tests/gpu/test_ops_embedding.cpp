// Token embedding on the GPU against the CPU twin: the gather bit for bit, the scatter-add bit for
// bit (same summation order, so also run-to-run deterministic), out-of-range tokens, guards.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

struct Shape2 {
  int64_t n, d;
};
const Shape2 kShapes[] = {{1, 16}, {65, 80}, {993, 512}, {16384, 768}, {33, 17}};

OpCase fwd_case(Shape2 s, int64_t vocab, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("embedding_fwd {}x{} V={} {}", s.n, s.d, vocab, fill.name());
  c.args = {in("tokens", DType::kI32, {s.n}, Fill::ints(0, vocab)),
            in("table", DType::kBF16, {vocab, s.d}, fill), out("out", DType::kBF16, {s.n, s.d})};
  c.run = [](Context& ctx, const Args& a) {
    embedding_fwd(ctx, a["out"], a["tokens"], a["table"]);
  };
  return c;
}

OpCase bwd_case(Shape2 s, int64_t vocab, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("embedding_bwd {}x{} V={} {}", s.n, s.d, vocab, fill.name());
  c.args = {in("tokens", DType::kI32, {s.n}, Fill::ints(0, vocab)),
            in("dout", DType::kBF16, {s.n, s.d}, fill),
            inout("dtable", DType::kF32, {vocab, s.d}, Fill::gaussian(), Tol::exact())};
  c.run = [](Context& ctx, const Args& a) {
    embedding_bwd(ctx, a["dtable"], a["tokens"], a["dout"]);
  };
  return c;
}

TEST(GpuEmbedding, ForwardMatchesCpuBitForBit) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : standard_fills()) {
      EXPECT_TRUE(compare_cpu_gpu(fwd_case(s, 1000, fill)));
    }
  }
}

TEST(GpuEmbedding, BackwardMatchesCpuBitForBit) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : standard_fills()) {
      // Few distinct tokens (long runs of repeats) and a LLaMA-sized vocabulary.
      EXPECT_TRUE(compare_cpu_gpu(bwd_case(s, 7, fill)));
      if (s.n * s.d <= 993 * 512) EXPECT_TRUE(compare_cpu_gpu(bwd_case(s, 128256, fill)));
    }
  }
}

TEST(GpuEmbedding, OutOfRangeTokensGiveNanRows) {
  const int64_t n = 40, d = 24, vocab = 10;
  OpCase c = fwd_case({n, d}, vocab, Fill::gaussian());
  c.args[0].fill = Fill::custom("some invalid", [](int64_t i) {
    return i % 7 == 3 ? (i % 2 ? -1.0 : 10.0) : double(i % 10);
  });
  OpRun r = run_op(c, Device::cuda(0));
  ASSERT_TRUE(r.intact());
  const auto tok = r.values("tokens"), table = r.values("table"), out = r.values("out");
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      if (i % 7 == 3) {
        ASSERT_TRUE(std::isnan(out[i * d + j])) << i;
      } else {
        ASSERT_EQ(out[i * d + j], table[tok[i] * d + j]) << i;
      }
    }
  }
  // The backward skips them: only valid rows are added.
  OpCase b = bwd_case({n, d}, vocab, Fill::gaussian());
  b.args[0].fill = c.args[0].fill;
  OpRun rb = run_op(b, Device::cuda(0));
  ASSERT_TRUE(rb.intact());
  std::vector<double> want = rb.initial("dtable");
  std::vector<std::vector<float>> acc(vocab, std::vector<float>(d, 0.0f));
  const auto dy = rb.values("dout");
  for (int64_t i = 0; i < n; ++i) {
    if (i % 7 == 3) continue;
    for (int64_t j = 0; j < d; ++j) acc[i % 10][j] += float(dy[i * d + j]);
  }
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t j = 0; j < d; ++j) want[v * d + j] = float(want[v * d + j]) + acc[v][j];
  }
  EXPECT_TRUE(expect_close("dtable", {vocab, d}, rb.values("dtable"), want, Tol::exact()));
}

TEST(GpuEmbeddingPerf, Bandwidth) {
  Context ctx(Device::cuda(0));
  for (int64_t d : {768, 2048}) {
    const int64_t n = 16384, vocab = 32000;
    const double copy = copy_gbps(ctx, n * d * 2);
    const Perf f = time_op(ctx, fwd_case({n, d}, vocab, Fill::gaussian()), 2.0 * n * d * 2 + 4 * n);
    // Backward: dout read once, each distinct token's dtable row read and written once.
    const OpCase bc = bwd_case({n, d}, vocab, Fill::gaussian());
    OpRun tok = run_op({"tokens", {bc.args[0]}, [](Context&, const Args&) {}}, Device::cpu());
    std::set<double> distinct;
    for (double t : tok.values("tokens")) distinct.insert(t);
    const Perf b = time_op(ctx, bc, 2.0 * n * d + 8.0 * double(distinct.size()) * d);
    std::printf(
        "embedding N=%ld D=%ld: copy %.0f GB/s | fwd %s (%.0f%%) | bwd %s (%.0f%%, %zu distinct "
        "tokens)\n",
        long(n), long(d), copy, f.str().c_str(), 100 * f.gb_per_s / copy, b.str().c_str(),
        100 * b.gb_per_s / copy, distinct.size());
  }
}

}  // namespace
}  // namespace lowbit::test

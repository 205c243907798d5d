// The kernel-trace summary: per-name totals, and the busy time as the union of the kernels'
// intervals (overlaps counted once, gaps not at all).
#include <gtest/gtest.h>

#include "bench/kernel_trace.h"

namespace lowbit::bench {
namespace {

TEST(KernelTraceSummary, UnionOfIntervalsAndTotalsPerName) {
  // ns: a [0, 100), b [50, 120) overlapping a, gap, a [200, 260), c [210, 220) inside it.
  const std::vector<KernelRecord> recs = {
      {"a", 0, 100}, {"b", 50, 120}, {"a", 200, 260}, {"c", 210, 220}};
  const KernelSummary s = summarize_kernels(recs);
  EXPECT_EQ(s.kernels, 4);
  EXPECT_DOUBLE_EQ(s.kernel_ms, (100 + 70 + 60 + 10) * 1e-6);
  EXPECT_DOUBLE_EQ(s.busy_ms, (120 + 60) * 1e-6);
  EXPECT_DOUBLE_EQ(s.span_ms, 260 * 1e-6);
  ASSERT_EQ(s.rows.size(), 3u);
  EXPECT_EQ(s.rows[0].name, "a");  // largest total first
  EXPECT_EQ(s.rows[0].launches, 2);
  EXPECT_DOUBLE_EQ(s.rows[0].total_ms, 160 * 1e-6);
  EXPECT_EQ(s.rows[1].name, "b");
  EXPECT_EQ(s.rows[2].name, "c");
}

TEST(KernelTraceSummary, IdleGapsByLengthAndTheLongestWithTheirKernels) {
  // ns: a [0, 100), gap 1 µs, b [1100, 1200), c [1150, 5000) overlapping b, gap 50 µs,
  // d [55000, 56000), gap 200 µs, e [256000, 256500).
  const std::vector<KernelRecord> recs = {{"a", 0, 100},
                                          {"b", 1100, 1200},
                                          {"c", 1150, 5000},
                                          {"d", 55000, 56000},
                                          {"e", 256000, 256500}};
  const KernelSummary s = summarize_kernels(recs);
  ASSERT_EQ(s.idle.size(), 4u);
  EXPECT_EQ(s.idle[0].gaps, 1);  // 1 µs
  EXPECT_DOUBLE_EQ(s.idle[0].total_ms, 1e-3);
  EXPECT_EQ(s.idle[1].gaps, 0);
  EXPECT_EQ(s.idle[2].gaps, 1);  // 50 µs
  EXPECT_EQ(s.idle[3].gaps, 1);  // 200 µs
  EXPECT_NEAR(s.idle[0].total_ms + s.idle[2].total_ms + s.idle[3].total_ms, s.span_ms - s.busy_ms,
              1e-12);
  ASSERT_EQ(s.longest_gaps.size(), 3u);
  EXPECT_DOUBLE_EQ(s.longest_gaps[0].us, 200.0);
  EXPECT_EQ(s.longest_gaps[0].before, "d");
  EXPECT_EQ(s.longest_gaps[0].after, "e");
  EXPECT_EQ(s.longest_gaps[1].before, "c");  // c ends last of the overlapping pair
  EXPECT_EQ(s.longest_gaps[1].after, "d");
  const std::string text = format_kernel_summary(s, 1, "t");
  EXPECT_NE(text.find("> 100 us 1.0 gaps 0.200 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("# gap     200.0 us after d | before e"), std::string::npos) << text;
}

// The runtime calls overlapping a long gap are summed by name, largest overlap first; calls
// outside every gap are not listed.
TEST(KernelTraceSummary, HostCallsInTheLongestGaps) {
  // ns: a [0, 1000), gap of 200 µs, b [201000, 202000).
  const std::vector<KernelRecord> recs = {{"a", 0, 1000}, {"b", 201000, 202000}};
  const std::vector<ApiRecord> api = {{"cudaLaunchKernel", 500, 800},        // before the gap
                                      {"cudaMemcpy", 900, 151000},           // 150 µs inside
                                      {"cudaLaunchKernel", 160000, 163000},  // 3 µs
                                      {"cudaLaunchKernel", 170000, 171000},  // 1 µs
                                      {"cudaMalloc", 200500, 202500}};       // 0.5 µs inside
  const KernelSummary s = summarize_kernels(recs, api);
  ASSERT_EQ(s.longest_gaps.size(), 1u);
  const IdleGap& g = s.longest_gaps[0];
  ASSERT_EQ(g.host.size(), 3u);
  EXPECT_EQ(g.host[0], "cudaMemcpy 150.0 us ×1");
  EXPECT_EQ(g.host[1], "cudaLaunchKernel 4.0 us ×2");
  EXPECT_EQ(g.host[2], "cudaMalloc 0.5 us ×1");
  const std::string text = format_kernel_summary(s, 1, "t");
  EXPECT_NE(text.find("#   host in the gap: cudaMemcpy 150.0 us ×1, cudaLaunchKernel 4.0 us ×2"),
            std::string::npos)
      << text;
}

TEST(KernelTraceSummary, EmptyTraceAndPerStepText) {
  const KernelSummary none = summarize_kernels({});
  EXPECT_EQ(none.kernels, 0);
  EXPECT_EQ(none.busy_ms, 0.0);
  // Two steps of 1 ms each: per-step figures are halves of the totals.
  const KernelSummary s = summarize_kernels({{"k", 0, 1000000}, {"k", 1000000, 2000000}});
  const std::string text = format_kernel_summary(s, 2, "title");
  EXPECT_NE(text.find("# title"), std::string::npos);
  EXPECT_NE(text.find("per step: 1 kernels, kernel time 1.000 ms, GPU busy 1.000 ms of a 1.000 ms "
                      "span (100.0% busy)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("       1.000       1.0  100.0%  k"), std::string::npos) << text;
}

}  // namespace
}  // namespace lowbit::bench

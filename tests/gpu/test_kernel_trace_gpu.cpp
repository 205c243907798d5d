// The CUPTI kernel trace on a real GPU: the kernels launched between start() and stop() come
// back by name, with positive durations, in start order.
#include <gtest/gtest.h>

#include "bench/kernel_trace.h"
#include "lowbit/core.h"
#include "lowbit/ops.h"

namespace lowbit::bench {
namespace {

TEST(KernelTraceGpu, RecordsTheKernelsOfTheTracedSpan) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Context ctx(Device::cuda(0));
  // [4096, 2·1024] bf16 gate_up → [4096, 1024] SwiGLU output.
  Tensor gate_up = Tensor::zeros({4096, 2048}, DType::kBF16, Device::cuda(0));
  Tensor out = Tensor::empty({4096, 1024}, DType::kBF16, Device::cuda(0));
  swiglu_fwd(ctx, out, gate_up);  // loaded and warm before the trace
  ctx.synchronize();
  std::unique_ptr<KernelTrace> trace = KernelTrace::start();
  for (int i = 0; i < 3; ++i) swiglu_fwd(ctx, out, gate_up);
  ctx.synchronize();
  const std::vector<KernelRecord> recs = trace->stop();
  int swiglu = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_GT(recs[i].end_ns, recs[i].start_ns) << recs[i].name;
    if (i > 0) EXPECT_GE(recs[i].start_ns, recs[i - 1].start_ns);
    if (recs[i].name.find("swiglu_fwd_kernel") != std::string::npos) ++swiglu;
  }
  EXPECT_EQ(swiglu, 3);
  const KernelSummary s = summarize_kernels(recs);
  EXPECT_GT(s.busy_ms, 0.0);
  EXPECT_LE(s.busy_ms, s.span_ms + 1e-9);
  // One trace at a time; a second one after stop() works.
  std::unique_ptr<KernelTrace> again = KernelTrace::start();
  EXPECT_TRUE(again->stop().empty());
}

}  // namespace
}  // namespace lowbit::bench

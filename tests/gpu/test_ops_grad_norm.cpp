// Gradient norm on the GPU against the CPU twin, through the op harness: segment_norms sums
// squares in fp64 on both sides, in different orders, then rounds the square root to fp32, so
// segment norms agree within one fp32 ulp (tol_rounded(f32, 2)); clip_coefficient: skip exact,
// norm and coef within a few ulps. Segments: >48 (several launches), odd offsets and lengths
// (scalar head and tail around the float4 body), empty ones, a misaligned gradient buffer (scalar
// path); fills incl. ±inf/NaN, squares beyond the fp32 range with finite norms (1e20, 1e30:
// clipped) and norms beyond it (3e38: skipped). Also: repeated runs give the same bits, and a
// timing.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

using test::Args;
using test::Fill;

// `count` segments of pseudo-random lengths (0 to ~max_len) at odd offsets with gaps between
// them; *p receives the arena size.
std::vector<ParamSegment> make_segments(int count, int64_t max_len, int64_t* p) {
  std::vector<ParamSegment> segs;
  int64_t at = 3;
  for (int i = 0; i < count; ++i) {
    const uint32_t r = philox_uint32(13, 0, uint64_t(i));
    int64_t len = i % 7 == 5 ? 0 : int64_t(r % uint32_t(max_len)) + 1;
    if (i == 1) len = max_len * 3 + 5;  // several chunks
    segs.push_back({at, len, true});
    at += len + int64_t((r >> 20) % 5);
  }
  *p = at + 2;
  return segs;
}

test::OpCase norms_case(const std::string& name, const std::vector<ParamSegment>& segs, int64_t p,
                        const Fill& f, int misalign) {
  test::OpCase c;
  c.name = name;
  const int64_t s = int64_t(segs.size());
  c.args = {test::in("grad", DType::kF32, {p + 1}, f),
            test::out("seg_norms", DType::kF32, {s}, test::tol_rounded(DType::kF32, 2)),
            test::out("norm", DType::kF32, {1}, test::tol_rounded(DType::kF32, 2)),
            test::out("coef", DType::kF32, {1}, test::tol_rounded(DType::kF32, 4)),
            test::out("skip", DType::kI32, {1}, test::Tol::exact())};
  c.run = [segs, p, misalign](Context& ctx, const Args& a) {
    const TensorView g(a["grad"].ptr<float>() + misalign, DType::kF32, {p}, a["grad"].device);
    segment_norms(ctx, a["seg_norms"], g, segs);
    clip_coefficient(ctx, a["norm"], a["coef"], a["skip"], a["seg_norms"], 1.0f);
  };
  return c;
}

TEST(GradNormGpu, MatchesCpuTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  int64_t p = 0;
  const std::vector<ParamSegment> segs = make_segments(150, 20000, &p);
  for (const Fill& f : {Fill::gaussian(), Fill::zeros(), Fill::large(1e20), Fill::large(1e30),
                        Fill::large(), Fill::small(), Fill::specials()}) {
    for (int misalign : {0, 1}) {
      EXPECT_TRUE(test::compare_cpu_gpu(norms_case(
          fmt::format("seg_norms {} misalign {}", f.name(), misalign), segs, p, f, misalign)));
    }
  }
  const std::vector<ParamSegment> one = {{0, 3 << 20, true}};
  EXPECT_TRUE(test::compare_cpu_gpu(
      norms_case("seg_norms one segment", one, 3 << 20, Fill::gaussian(), 0)));
}

TEST(GradNormGpu, RepeatedRunsGiveTheSameBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  int64_t p = 0;
  const std::vector<ParamSegment> segs = make_segments(80, 50000, &p);
  const test::OpCase c = norms_case("seg_norms", segs, p, Fill::gaussian(), 0);
  const test::OpRun a = test::run_op(c, Device::cuda(0)), b = test::run_op(c, Device::cuda(0));
  for (const char* name : {"seg_norms", "norm", "coef", "skip"}) {
    EXPECT_TRUE(test::expect_close(name, a.shape(name), a.values(name), b.values(name),
                                   test::Tol::exact()));
  }
}

TEST(GradNormGpu, Perf) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Context ctx(Device::cuda(0));
  const int64_t p = int64_t(1) << 27;
  std::vector<ParamSegment> segs;
  for (int64_t at = 0; at < p; at += p / 256) segs.push_back({at, p / 256, true});
  Tensor grad = Tensor::zeros({p}, DType::kF32, ctx.device());
  Tensor seg_norms = Tensor::zeros({int64_t(segs.size())}, DType::kF32, ctx.device());
  Tensor norm = Tensor::zeros({1}, DType::kF32, ctx.device());
  Tensor coef = Tensor::zeros({1}, DType::kF32, ctx.device());
  Tensor skip = Tensor::zeros({1}, DType::kI32, ctx.device());
  const test::Perf ps = test::time_gpu(
      ctx,
      [&] {
        segment_norms(ctx, seg_norms, grad, segs);
        clip_coefficient(ctx, norm, coef, skip, seg_norms, 1.0f);
      },
      4.0 * double(p));
  const double copy = test::copy_gbps(ctx, 4 * p);
  std::printf(
      "segment_norms + clip_coefficient, %lld elements, %zu segments: %s (reads 4 bytes an "
      "element); device copy %.0f GB/s\n",
      static_cast<long long>(p), segs.size(), ps.str().c_str(), copy);
}

}  // namespace
}  // namespace lowbit

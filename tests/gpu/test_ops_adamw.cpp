// Multi-tensor AdamW on the GPU against the CPU twin, through the op harness (guard bytes around
// every buffer; compute starts as poison, so elements outside every segment must stay poison on
// both sides).
//
// AdamW is bit-exact (Tol::exact: same bits, NaN for NaN): the kernel runs the twin's
// adamw_update with `_rn` intrinsics. Covered: >48 segments (several launches), segments at odd
// offsets and of odd lengths (scalar head and tail around the float4 body), empty segments,
// weight-decay exemptions, a NaN/inf gradient fill, buffers not 16-byte aligned (scalar path),
// three consecutive steps, and skip = 1. Also a timing against the device's copy bandwidth.
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

// Segments over an arena of `p` elements: `count` segments of pseudo-random lengths (0 to
// ~max_len) at odd offsets with gaps between them; every third is exempt from weight decay.
std::vector<ParamSegment> make_segments(int count, int64_t max_len, int64_t* p) {
  std::vector<ParamSegment> segs;
  int64_t at = 3;
  for (int i = 0; i < count; ++i) {
    const uint32_t r = philox_uint32(11, 0, uint64_t(i));
    int64_t len = i % 7 == 5 ? 0 : int64_t(r % uint32_t(max_len)) + 1;
    if (i == 1) len = max_len * 3 + 5;  // several chunks
    segs.push_back({at, len, i % 3 != 2});
    at += len + int64_t((r >> 20) % 5);
  }
  *p = at + 2;
  return segs;
}

test::OpCase adamw_case(const std::string& name, const std::vector<ParamSegment>& segs, int64_t p,
                        const Fill& grad_fill, int skip, int misalign, int steps) {
  test::OpCase c;
  c.name = name;
  // Buffers one element longer than P: `misalign` = 1 shifts every view by one element (4 bytes
  // for f32, 2 for bf16), so no buffer is 16-byte aligned.
  const int64_t n = p + 1;
  c.args = {test::inout("master", DType::kF32, {n}, Fill::gaussian(), test::Tol::exact()),
            test::in("grad", DType::kF32, {n}, grad_fill),
            test::inout("m", DType::kF32, {n}, Fill::gaussian(0.1), test::Tol::exact()),
            test::inout("v", DType::kF32, {n}, Fill::uniform(0.0, 0.01), test::Tol::exact()),
            test::out("compute", DType::kBF16, {n}, test::Tol::exact()),
            test::in("grad_scale", DType::kF32, {1}, Fill::constant(0.75)),
            test::in("skip", DType::kI32, {1}, Fill::constant(skip))};
  c.run = [segs, p, misalign, steps](Context& ctx, const Args& a) {
    auto view = [&](const char* name) {
      const TensorView& t = a[name];
      const int64_t esize = dtype_bits(t.dtype) / 8;
      return TensorView(static_cast<uint8_t*>(t.data) + misalign * esize, t.dtype, {p}, t.device);
    };
    const TensorView master = view("master"), grad = view("grad"), m = view("m"), v = view("v"),
                     compute = view("compute");
    AdamWConfig cfg;
    cfg.lr = 1e-3f;
    cfg.weight_decay = 0.1f;
    for (int s = 1; s <= steps; ++s) {
      cfg.step = s;
      adamw_step(ctx, master, grad, m, v, &compute, segs, cfg, a["grad_scale"], a["skip"]);
    }
  };
  return c;
}

// The segments' bf16 copies packed from `start` (ParamSegment::compute_offset), every fourth
// segment without one. aligned: each copy shifted by a multiple of 4 elements from its master
// (the float4 path); else the shift of the first is not (the scalar path).
std::vector<ParamSegment> compact_copies(std::vector<ParamSegment> segs, bool aligned) {
  int64_t at = 1;
  for (size_t i = 0; i < segs.size(); ++i) {
    if (i % 4 == 1) {
      segs[i].compute_offset = ParamSegment::kNoCompute;
      continue;
    }
    if (aligned) at += ((segs[i].offset - at) % 4 + 4) % 4;
    segs[i].compute_offset = at;
    at += segs[i].numel;
  }
  return segs;
}

TEST(AdamWGpu, BitExactAgainstCpuTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  int64_t p = 0;
  const std::vector<ParamSegment> segs = make_segments(120, 3000, &p);
  EXPECT_TRUE(
      test::compare_cpu_gpu(adamw_case("adamw 120 segments", segs, p, Fill::gaussian(), 0, 0, 1)));
  EXPECT_TRUE(
      test::compare_cpu_gpu(adamw_case("adamw 3 steps", segs, p, Fill::gaussian(1e-3), 0, 0, 3)));
  EXPECT_TRUE(
      test::compare_cpu_gpu(adamw_case("adamw specials", segs, p, Fill::specials(), 0, 0, 1)));
  EXPECT_TRUE(
      test::compare_cpu_gpu(adamw_case("adamw misaligned", segs, p, Fill::gaussian(), 0, 1, 2)));
  EXPECT_TRUE(
      test::compare_cpu_gpu(adamw_case("adamw tiny grads", segs, p, Fill::small(), 0, 0, 1)));
  EXPECT_TRUE(test::compare_cpu_gpu(adamw_case(
      "adamw compact copies, float4", compact_copies(segs, true), p, Fill::gaussian(), 0, 0, 2)));
  EXPECT_TRUE(test::compare_cpu_gpu(adamw_case(
      "adamw compact copies, scalar", compact_copies(segs, false), p, Fill::gaussian(), 0, 0, 1)));
  // One big segment at offset 0 (the arena's usual layout: 256-byte aligned segments).
  const std::vector<ParamSegment> one = {{0, 1 << 20, true}};
  EXPECT_TRUE(test::compare_cpu_gpu(
      adamw_case("adamw one segment", one, 1 << 20, Fill::gaussian(), 0, 0, 2)));
}

TEST(AdamWGpu, SkipLeavesEverythingUntouched) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  int64_t p = 0;
  const std::vector<ParamSegment> segs = make_segments(60, 2000, &p);
  const test::OpCase c = adamw_case("adamw skip", segs, p, Fill::specials(), 1, 0, 1);
  const test::OpRun r = test::run_op(c, Device::cuda(0));
  EXPECT_TRUE(r.intact());
  for (const char* name : {"master", "m", "v"}) {
    EXPECT_TRUE(test::expect_close(name, r.shape(name), r.values(name), r.initial(name),
                                   test::Tol::exact()));
  }
  for (double x : r.values("compute")) ASSERT_TRUE(std::isnan(x));  // still poison
}

// A LLaMA-like arena layout at 1/8 scale: 32 layers of 9 tensors (2 small norms, 7 matrices),
// 2^27 elements in all, segments 64-element aligned as in ParamArena.
std::vector<ParamSegment> llama_like_segments() {
  std::vector<ParamSegment> segs;
  int64_t at = 0;
  for (int l = 0; l < 32; ++l) {
    for (int k = 0; k < 9; ++k) {
      const int64_t len = k < 2 ? 2048 : (int64_t(1) << 27) / (32 * 7);
      segs.push_back({at, len, k >= 2});
      at += (len + 63) / 64 * 64;
    }
  }
  return segs;
}

TEST(AdamWGpu, Perf) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Context ctx(Device::cuda(0));
  const std::vector<ParamSegment> segs = llama_like_segments();
  const int64_t p = segs.back().offset + segs.back().numel;
  Tensor master = Tensor::zeros({p}, DType::kF32, ctx.device());
  Tensor grad = Tensor::zeros({p}, DType::kF32, ctx.device());
  Tensor m = Tensor::zeros({p}, DType::kF32, ctx.device());
  Tensor v = Tensor::zeros({p}, DType::kF32, ctx.device());
  Tensor compute = Tensor::zeros({p}, DType::kBF16, ctx.device());
  Tensor scale = Tensor::zeros({1}, DType::kF32, ctx.device());
  Tensor skip = Tensor::zeros({1}, DType::kI32, ctx.device());
  const TensorView cv = compute.view();
  AdamWConfig cfg;
  const test::Perf pa = test::time_gpu(
      ctx, [&] { adamw_step(ctx, master, grad, m, v, &cv, segs, cfg, scale, skip); },
      30.0 * double(p));
  const double copy = test::copy_gbps(ctx, 4 * p);
  std::printf(
      "adamw_step %lld elements, %zu segments (30 bytes an element): %s; device copy %.0f GB/s\n",
      static_cast<long long>(p), segs.size(), pa.str().c_str(), copy);
}

}  // namespace
}  // namespace lowbit

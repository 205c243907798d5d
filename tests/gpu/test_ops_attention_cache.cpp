// Attention against a KV cache on the GPU against the CPU twin, through the op harness (poison
// outputs, guard bytes around every buffer and in the gaps of strided views, cache rows past the
// last position holding NaN). Bounds from the float64 error model (tests/ops/attention_ref64.h):
// the cache kernel rounds nothing to bf16 before the output, so its model is the twin's with
// fp32 accumulation at 2^-23 (FMA contraction, expf); the prefill path (t0 = 0, Tq ≥
// kFlashMinQueries) runs the flash kernel and takes attention's GPU model (P rounded to bf16).
// Also: the kernel called directly at t0 = 0 with many queries, run-to-run identical bits, and
// kv_cache_write byte for byte.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "lowbit/ops.h"
#include "ops/attention_cache_case.h"
#include "ops/attention_cache_impl.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

using test::AttnErrorModel;
using test::CacheCase;

// The cache kernel against the twin: both fp32 throughout, bf16 output each.
AttnErrorModel kernel_vs_twin() { return {0x1p-23 + 0x1p-24, 0x1p-8 + 0x1p-8, false, false}; }

bool flash_path(const CacheCase& c) { return c.t0 == 0 && c.Tq >= attn::kFlashMinQueries; }

std::vector<CacheCase> gpu_cases() {
  std::vector<CacheCase> cases;
  for (int64_t Dh : {64, 128}) {
    for (int64_t ratio : {1, 4}) {
      const int64_t H = 8, Hkv = H / ratio;
      cases.push_back({2, 0, 1, 8, H, Hkv, Dh});                                // the first token
      cases.push_back({2, 31, 1, 40, H, Hkv, Dh});                              // one chunk of keys
      cases.push_back({3, 127, 1, 200, H, Hkv, Dh, DType::kBF16, false, 3.0});  // 4 chunks
      cases.push_back({1, 1000, 1, 1024, H, Hkv, Dh});                    // many chunks per warp
      cases.push_back({2, 70, 5, 90, H, Hkv, Dh, DType::kBF16, true});    // a re-prefill
      cases.push_back({2, 0, 7, 16, H, Hkv, Dh, DType::kBF16, true});     // short prefill: kernel
      cases.push_back({2, 0, 100, 128, H, Hkv, Dh, DType::kBF16, true});  // prefill: flash
    }
  }
  return cases;
}

TEST(AttentionCacheGpu, MatchesCpuTwinAndIsDeterministic) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (const CacheCase& c : gpu_cases()) {
    SCOPED_TRACE(c.str());
    std::printf("  %s%s\n", c.str().c_str(), flash_path(c) ? " (flash)" : "");
    const test::CacheData d = test::make_cache_data(c, 50 + c.t0 + c.Dh + c.Hkv);
    const test::OpCase oc = test::cache_op_case(c, d);
    const test::OpRun cpu = test::run_op(oc, Device::cpu());
    const test::OpRun gpu = test::run_op(oc, Device::cuda(0), 1, &cpu);
    ASSERT_TRUE(cpu.intact());
    ASSERT_TRUE(gpu.intact());
    const test::CacheRef ref = test::cache_oracle(
        c, d, flash_path(c) ? AttnErrorModel::gpu_vs_cpu_twin() : kernel_vs_twin());
    EXPECT_TRUE(
        test::within_bounds("out", c.q_shape(), gpu.values("out"), cpu.values("out"), ref.bound));
    const test::OpRun gpu2 = test::run_op(oc, Device::cuda(0), 1, &cpu);
    EXPECT_EQ(gpu.values("out"), gpu2.values("out"));
  }
}

// The cache kernel itself on prefills (the dispatcher sends them to the flash kernel).
TEST(AttentionCacheGpu, KernelOnPrefillsMatchesCpuTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (int64_t Dh : {64, 128}) {
    const CacheCase c{2, 0, 150, 160, 4, 2, Dh, DType::kBF16, true};
    SCOPED_TRACE(c.str());
    const test::CacheData d = test::make_cache_data(c, 8);
    const float scale = static_cast<float>(d.dims.scale);
    const test::OpCase oc = test::cache_op_case(c, d, [scale](Context& ctx, const test::Args& a) {
      if (ctx.on_gpu()) {
        attn::attention_cache_fwd_cuda(ctx, a["out"], a["q"], a["k_cache"], a["v_cache"], 0, scale);
      } else {
        attention_cache_fwd(ctx, a["out"], a["q"], a["k_cache"], a["v_cache"], 0, scale);
      }
    });
    const test::OpRun cpu = test::run_op(oc, Device::cpu());
    const test::OpRun gpu = test::run_op(oc, Device::cuda(0), 1, &cpu);
    ASSERT_TRUE(gpu.intact());
    const test::CacheRef ref = test::cache_oracle(c, d, kernel_vs_twin());
    EXPECT_TRUE(
        test::within_bounds("out", c.q_shape(), gpu.values("out"), cpu.values("out"), ref.bound));
  }
}

TEST(AttentionCacheGpu, KvCacheWriteMatchesCpuTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (int64_t Dh : {64, 128}) {
    const int64_t B = 3, Tmax = 50, Hkv = 2, Tq = 7, t0 = 41, W = 3 * Hkv * Dh;
    test::OpCase oc;
    oc.name = fmt::format("kv_cache_write Dh{}", Dh);
    oc.args = {test::strided(test::in("src", DType::kBF16, {B, Tq, Hkv, Dh}), {Tq * W, W, Dh, 1}),
               test::inout("cache", DType::kBF16, {B, Tmax, Hkv, Dh}, test::Fill::gaussian())};
    oc.run = [](Context& ctx, const test::Args& a) {
      kv_cache_write(ctx, a["cache"], a["src"], t0);
    };
    const test::OpRun cpu = test::run_op(oc, Device::cpu());
    const test::OpRun gpu = test::run_op(oc, Device::cuda(0), 1, &cpu);
    ASSERT_TRUE(gpu.intact());
    EXPECT_EQ(gpu.values("cache"), cpu.values("cache"));
  }
}

}  // namespace
}  // namespace lowbit

// FP8 delayed scaling with the state on the GPU: step by step, the quantized payloads, amax
// histories and scales equal those of the same state on the CPU, byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/formats.h"
#include "lowbit/quant.h"

namespace lowbit {
namespace {

Tensor scaled_source(int64_t m, int64_t k, float scale, uint64_t seed, bool specials) {
  Tensor t = Tensor::empty({m, k}, DType::kBF16, Device::cpu());
  for (int64_t i = 0; i < m * k; ++i) {
    float v = (philox_uniform(seed, 0, i) * 2.0f - 1.0f) * scale;
    if (specials && i == 3) v = NAN;
    if (specials && i == 5) v = INFINITY;
    t.ptr<uint16_t>()[i] = f32_to_bf16_rn(v);
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ah = Tensor::copy_of(a.view(), Device::cpu());
  const Tensor bh = Tensor::copy_of(b.view(), Device::cpu());
  return ah.nbytes() == bh.nbytes() && std::memcmp(ah.data(), bh.data(), ah.nbytes()) == 0;
}

TEST(GpuDelayedScaling, DeviceStateMatchesCpuStateStepByStep) {
  ASSERT_GT(cuda_device_count(), 0) << "the GPU tests need a CUDA GPU (run them on a GPU host)";
  for (AmaxComputeAlgo algo : {AmaxComputeAlgo::kMax, AmaxComputeAlgo::kMostRecent}) {
    DelayedScalingConfig cfg;
    cfg.history_len = 4;
    cfg.algo = algo;
    cfg.margin = 1;
    DelayedScalingState cpu(cfg, ScalingPass::kForward, 3, Device::cpu());
    DelayedScalingState gpu(cfg, ScalingPass::kForward, 3, Device::cuda(0));
    Context cpu_ctx(Device::cpu());
    Context gpu_ctx(Device::cuda(0));
    // Per step: the magnitude of slot 0's tensor (0 = slot unused), extra host amaxes recorded
    // into slot 2 (0, inf, NaN, tiny), and NaN/inf inside the tensor on some steps.
    const float magnitudes[] = {1.0f, 300.0f, 0.0f, 5000.0f, 1e-3f, 2.0f, 900.0f};
    const float recorded[] = {0.0f, INFINITY, NAN, 1e-30f, 7.0f, 0.0f, 3.0f};
    for (int step = 0; step < 7; ++step) {
      SCOPED_TRACE(::testing::Message() << "algo " << int(algo) << " step " << step);
      if (magnitudes[step] != 0.0f) {
        const Tensor src = scaled_source(64, 96, magnitudes[step], 100 + step, step == 3);
        const Tensor src_gpu = Tensor::copy_of(src.view(), Device::cuda(0));
        QuantizedTensor qc, qg;
        quantize(cpu_ctx, src.view(), QuantConfig::fp8_delayed(cpu, 0), qc);
        quantize(gpu_ctx, src_gpu.view(), QuantConfig::fp8_delayed(gpu, 0), qg);
        EXPECT_TRUE(same_bytes(qc.rowwise_data, qg.rowwise_data));
        EXPECT_TRUE(same_bytes(qc.columnwise_data, qg.columnwise_data));
        EXPECT_TRUE(same_bytes(qc.rowwise_scale_inv, qg.rowwise_scale_inv));
        EXPECT_TRUE(same_bytes(qc.amax, qg.amax));
      }
      cpu.record_amax(2, recorded[step]);
      gpu.record_amax(2, recorded[step], &gpu_ctx);
      cpu.update();
      gpu.update(&gpu_ctx);
      gpu_ctx.synchronize();
      EXPECT_TRUE(same_bytes(cpu.amax_history(), gpu.amax_history()));
      EXPECT_TRUE(same_bytes(cpu.scale(), gpu.scale()));
      EXPECT_TRUE(same_bytes(cpu.scale_inv(), gpu.scale_inv()));
      for (int s = 0; s < 3; ++s) {
        const float a = cpu.scale_at(s), b = gpu.scale_at(s);
        EXPECT_EQ(f32_bits(a), f32_bits(b)) << "slot " << s;
      }
    }
  }
}

TEST(GpuDelayedScaling, DefaultLengthUpdateWithoutContext) {
  ASSERT_GT(cuda_device_count(), 0);
  DelayedScalingConfig cfg;  // L = 1024, max
  DelayedScalingState cpu(cfg, ScalingPass::kBackward, 200, Device::cpu());
  DelayedScalingState gpu(cfg, ScalingPass::kBackward, 200, Device::cuda(0));
  for (int step = 0; step < 5; ++step) {
    for (int s = 0; s < 200; ++s) {
      const float amax = (s % 7 == 0) ? 0.0f : float(s * (step + 1)) * 0.37f;
      cpu.record_amax(s, amax);
      gpu.record_amax(s, amax);
    }
    cpu.update();
    gpu.update();
    EXPECT_TRUE(same_bytes(cpu.amax_history(), gpu.amax_history())) << "step " << step;
    EXPECT_TRUE(same_bytes(cpu.scale(), gpu.scale())) << "step " << step;
  }
  EXPECT_EQ(gpu.dtype(), DType::kE5M2);
}

// The roll is a block per slot up to 12000 rows (the column staged in shared memory) and a
// thread walking the column beyond: both lengths equal the CPU state step by step.
TEST(GpuDelayedScaling, LongHistoriesAroundTheSharedMemoryLimit) {
  ASSERT_GT(cuda_device_count(), 0);
  for (int64_t len : {12000, 12001}) {
    DelayedScalingConfig cfg;
    cfg.history_len = len;
    DelayedScalingState cpu(cfg, ScalingPass::kForward, 5, Device::cpu());
    DelayedScalingState gpu(cfg, ScalingPass::kForward, 5, Device::cuda(0));
    for (int step = 0; step < 4; ++step) {
      for (int s = 0; s < 5; ++s) {
        const float amax = s == 1 ? 0.0f : float((s + 2) * (5 - step)) * 1.5f;
        cpu.record_amax(s, amax);
        gpu.record_amax(s, amax);
      }
      cpu.update();
      gpu.update();
      EXPECT_TRUE(same_bytes(cpu.amax_history(), gpu.amax_history()))
          << "L " << len << " step " << step;
      EXPECT_TRUE(same_bytes(cpu.scale(), gpu.scale())) << "L " << len << " step " << step;
    }
  }
}

}  // namespace
}  // namespace lowbit

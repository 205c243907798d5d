// Incremental decoding with a KV cache on the GPU: a prefill followed by one token per step
// against last_logits() over the window (BF16 recipe), and against the same decoding on the CPU.
//
// Tolerances: the GPU full forward runs the flash attention kernel (P rounded to bf16 before
// P·V) while a decode step runs the cache kernel (fp32 P); with cuBLASLt choosing algorithms by
// row count, bf16 activations differ by an ulp (2^-8) here and there, and four blocks of that
// move the logits by a small relative amount. The bound (3 % of the logits' L2 norm) is loose
// enough for that and far below what a wrong position, head or cache row would give (≈ 100 %).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "lowbit/model.h"

namespace lowbit {
namespace {

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

Tensor columns(const Tensor& t, int c0, int n) {
  const int64_t B = t.shape()[0], T = t.shape()[1];
  Tensor out = Tensor::empty({B, n}, DType::kI32, Device::cpu());
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(t.ptr<int32_t>() + b * T + c0, n, out.ptr<int32_t>() + b * n);
  }
  return out;
}

TEST(ModelDecodeGpu, PrefillThenStepsMatchLastLogitsAndTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  ModelConfig c = model_preset("tiny");
  c.vocab_size = 512;
  c.n_layers = 4;
  const PrecisionPlan plan = resolve_precision(Recipe::kBF16, c);
  Context cpu(Device::cpu()), gpu(Device::cuda(0));
  LlamaModel mc(c, plan, cpu), mg(c, plan, gpu);
  mc.init_weights(3);
  mg.init_weights(3);
  const int B = 3, T = 96, P = 40;  // P ≥ 16: the prefill takes the flash kernel
  Tensor tokens = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  std::mt19937 rng(17);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.ptr<int32_t>()[i] = int32_t(rng() % 512);
  KvCache cache_g(gpu, c, B, 128), cache_c(cpu, c, B, 128);
  double worst_full = 0, worst_cpu = 0;
  for (int t = P; t <= T; t += (t < P + 8 ? 1 : 7)) {
    SCOPED_TRACE(fmt::format("position {}", t - 1));
    // Advance both caches to t positions (the step size above skips some comparisons only).
    std::vector<float> g, cc;
    while (cache_g.length() < t) {
      const int t0 = cache_g.length(), n = t0 == 0 ? P : 1;
      g = mg.decode(columns(tokens, t0, n), B, n, cache_g);
      cc = mc.decode(columns(tokens, t0, n), B, n, cache_c);
    }
    const std::vector<float> full = mg.last_logits(columns(tokens, 0, t), B, t);
    const double e_full = rel_l2(g, full), e_cpu = rel_l2(g, cc);
    worst_full = std::max(worst_full, e_full);
    worst_cpu = std::max(worst_cpu, e_cpu);
    EXPECT_LE(e_full, 0.03);
    EXPECT_LE(e_cpu, 0.03);
  }
  std::printf("  rel L2 of the logits: decode vs last_logits %.3g, GPU vs CPU decode %.3g\n",
              worst_full, worst_cpu);
}

}  // namespace
}  // namespace lowbit

// The tiny model on the GPU against its CPU twin: forward, backward and the first optimizer
// steps, in BF16 and in the quantized recipes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lowbit/formats.h"
#include "lowbit/model.h"
#include "lowbit/train/step.h"

namespace lowbit {
namespace {

ModelConfig tiny() {
  ModelConfig c = model_preset("tiny");
  c.vocab_size = 512;
  c.n_layers = 2;
  return c;
}

// Relative L2 distance of two arrays.
double rel_l2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// [B, T] host token ids, uniform below the tiny vocabulary (512), from std::mt19937(seed).
Tensor random_tokens(int B, int T, uint32_t seed) {
  Tensor tokens = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.ptr<int32_t>()[i] = static_cast<int32_t>(rng() % 512);
  }
  return tokens;
}

class GpuModel : public ::testing::TestWithParam<Recipe> {};

TEST_P(GpuModel, ForwardBackwardAndFirstStepsMatchTheCpuTwin) {
  const Recipe r = GetParam();
  const ModelConfig c = tiny();
  const PrecisionPlan plan = resolve_precision(r, c);
  const int B = 4, T = 128;
  Tensor tokens = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  Tensor targets = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  std::mt19937 rng(5);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.ptr<int32_t>()[i] = static_cast<int32_t>(rng() % 512);
    targets.ptr<int32_t>()[i] = i % 11 == 0 ? -1 : static_cast<int32_t>(rng() % 512);
  }
  int64_t valid = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) valid += targets.ptr<int32_t>()[i] >= 0;
  Context cpu(Device::cpu());
  Context gpu(Device::cuda(0));
  LlamaModel mc(c, plan, cpu), mg(c, plan, gpu);
  mc.init_weights(3);
  mg.init_weights(3);
  StepRunner rc(mc, cpu), rg(mg, gpu);
  const std::vector<MicroBatch> micro{{tokens, targets, valid}};
  AdamWConfig ac;
  ac.lr = 1e-3f;
  for (int step = 0; step < 3; ++step) {
    ac.step = step + 1;
    const StepOutcome oc = rc.step(micro, B, T, ac, 1.0f, {});
    const StepOutcome og = rg.step(micro, B, T, ac, 1.0f, {});
    // The loss agrees to bf16 activation rounding, accumulated over the layers.
    EXPECT_NEAR(og.loss, oc.loss, 2e-2) << recipe_name(r) << " step " << step;
    EXPECT_NEAR(og.grad_norm, oc.grad_norm, 0.05 * oc.grad_norm) << recipe_name(r);
    if (step == 0) {
      // Gradients of the first step (read before the next step zeroes them): the GPU and the
      // CPU differ by reduction order and bf16 re-rounding only.
      const Tensor gg = Tensor::copy_of(mg.params().grad_all, Device::cpu());
      const double d =
          rel_l2(gg.ptr<float>(), mc.params().grad_all.ptr<float>(), mc.params().size());
      EXPECT_LT(d, r == Recipe::kBF16 ? 0.02 : 0.1) << recipe_name(r);
    }
  }
  // The updates (master − init) of the two devices. AdamW divides by sqrt(v): where a gradient
  // is tiny, reduction-order and re-rounding differences change its update by O(lr) rather
  // than proportionally, so the updates agree to ~10 % (quantized recipes: also different
  // quantization decisions at rounding ties), not to the gradients' 2 %.
  const Tensor wg = Tensor::copy_of(mg.params().master_all, Device::cpu());
  LlamaModel init(c, plan, cpu);
  init.init_weights(3);
  const int64_t P = mc.params().size();
  std::vector<float> dg(P), dc(P);
  for (int64_t i = 0; i < P; ++i) {
    dg[i] = wg.ptr<float>()[i] - init.params().master_all.ptr<float>()[i];
    dc[i] = mc.params().master_all.ptr<float>()[i] - init.params().master_all.ptr<float>()[i];
  }
  EXPECT_LT(rel_l2(dg.data(), dc.data(), P), r == Recipe::kBF16 ? 0.1 : 0.25) << recipe_name(r);
}

// On the device too, recomputing the linears' wgrad inputs in the backward gives the gradients
// of keeping them from the forward, bit for bit (the quantize kernels are deterministic).
TEST_P(GpuModel, RecomputedQuantizedInputsGiveIdenticalGradients) {
  const Recipe r = GetParam();
  if (r == Recipe::kBF16) GTEST_SKIP() << "bf16 keeps its inputs";
  const ModelConfig c = tiny();
  const int B = 4, T = 128;
  const Tensor tokens = random_tokens(B, T, 8);
  // 0: recompute inputs and quantized weights (default); 1: keep the inputs; 2: keep the
  // quantized weights.
  std::vector<float> grads[3];
  for (int variant = 0; variant < 3; ++variant) {
    Context gpu(Device::cuda(0));
    LlamaModel m(c, resolve_precision(r, c), gpu);
    m.init_weights(6);
    ForwardOptions o;
    o.recompute_quantized_inputs = variant != 1;
    o.recompute_quantized_weights = variant != 2;
    for (int mb = 0; mb < 2; ++mb) {
      m.forward_backward(tokens, tokens, B, T, 1.0f / float(tokens.numel()), o);
    }
    const Tensor g = Tensor::copy_of(m.params().grad_all, Device::cpu());
    grads[variant].assign(g.ptr<float>(), g.ptr<float>() + g.numel());
  }
  EXPECT_EQ(grads[0], grads[1]) << recipe_name(r);
  EXPECT_EQ(grads[0], grads[2]) << recipe_name(r);
}

// Token ids and targets already on the GPU (as `lowbit bench train` keeps them) are copied on the
// model's stream and give the bits of host ids: the same losses and gradients.
TEST_P(GpuModel, DeviceResidentTokensGiveTheHostTokensBits) {
  const Recipe r = GetParam();
  const ModelConfig c = tiny();
  const int B = 2, T = 64;
  const Tensor tokens = random_tokens(B, T, 12);
  const Tensor dev_tokens = Tensor::copy_of(tokens.view(), Device::cuda(0));
  std::vector<float> grads[2];
  double losses[2] = {0, 0};
  for (int on_device = 0; on_device < 2; ++on_device) {
    Context gpu(Device::cuda(0));
    LlamaModel m(c, resolve_precision(r, c), gpu);
    m.init_weights(3);
    const Tensor& t = on_device ? dev_tokens : tokens;
    for (int mb = 0; mb < 2; ++mb) {
      losses[on_device] += m.forward_backward(t, t, B, T, 1.0f / float(tokens.numel())).loss_sum;
    }
    const Tensor g = Tensor::copy_of(m.params().grad_all, Device::cpu());
    grads[on_device].assign(g.ptr<float>(), g.ptr<float>() + g.numel());
  }
  EXPECT_EQ(losses[0], losses[1]) << recipe_name(r);
  EXPECT_EQ(grads[0], grads[1]) << recipe_name(r);
}

// On the device too, a step's first micro-batch writing the linears' and norms' gradients
// outright (zero_grads(true) + overwrite_linear_grads, what StepRunner does) gives the bits of
// zeroing every gradient and adding, over stale NaN gradients, with a second micro-batch added.
TEST_P(GpuModel, OverwrittenGradsEqualZeroedAndAccumulated) {
  const Recipe r = GetParam();
  const ModelConfig c = tiny();
  const int B = 4, T = 128;
  const Tensor tokens = random_tokens(B, T, 10);
  std::vector<float> grads[2];
  for (int overwrite = 0; overwrite < 2; ++overwrite) {
    Context gpu(Device::cuda(0));
    LlamaModel m(c, resolve_precision(r, c), gpu);
    m.init_weights(11);
    fill_bytes(m.params().grad_all, 0xFF);  // NaN: stale values must not leak through
    m.zero_grads(overwrite == 1);
    ForwardOptions o;
    for (int mb = 0; mb < 2; ++mb) {
      o.overwrite_linear_grads = overwrite == 1 && mb == 0;
      m.forward_backward(tokens, tokens, B, T, 1.0f / float(tokens.numel()), o);
    }
    const Tensor g = Tensor::copy_of(m.params().grad_all, Device::cpu());
    for (const ParamInfo& p : m.params().params()) {
      grads[overwrite].insert(grads[overwrite].end(), g.ptr<float>() + p.offset,
                              g.ptr<float>() + p.offset + p.shape.numel());
    }
  }
  size_t nonfinite = 0;
  for (const float v : grads[1]) nonfinite += std::isfinite(v) ? 0 : 1;
  EXPECT_EQ(nonfinite, 0u) << recipe_name(r);
  EXPECT_EQ(grads[0], grads[1]) << recipe_name(r);
}

// On the device too, recomputing the blocks' qkv and gate_up outputs in the backward gives the
// gradients of keeping them, bit for bit, in every recipe.
TEST_P(GpuModel, RecomputedBlockOutputsGiveIdenticalGradients) {
  const Recipe r = GetParam();
  const ModelConfig c = tiny();
  const int B = 4, T = 128;
  const Tensor tokens = random_tokens(B, T, 9);
  std::vector<float> grads[2];
  for (int variant = 0; variant < 2; ++variant) {
    Context gpu(Device::cuda(0));
    LlamaModel m(c, resolve_precision(r, c), gpu);
    m.init_weights(7);
    ForwardOptions o;
    o.recompute_block_outputs =
        variant == 0 ? ForwardOptions::Recompute::kOff : ForwardOptions::Recompute::kOn;
    for (int mb = 0; mb < 2; ++mb) {
      m.forward_backward(tokens, tokens, B, T, 1.0f / float(tokens.numel()), o);
    }
    const Tensor g = Tensor::copy_of(m.params().grad_all, Device::cpu());
    grads[variant].assign(g.ptr<float>(), g.ptr<float>() + g.numel());
  }
  EXPECT_EQ(grads[0], grads[1]) << recipe_name(r);
}

// The model quantizes a weight's rowwise copy once per step and its columnwise copy in the
// backward: on the device too each equals the copy quantize() makes of both at once.
TEST_P(GpuModel, WeightCopiesQuantizedSeparatelyEqualBothAtOnce) {
  const Recipe r = GetParam();
  if (r == Recipe::kBF16) GTEST_SKIP() << "bf16 weights are not quantized";
  const ModelConfig c = tiny();
  Context gpu(Device::cuda(0));
  Tensor host = Tensor::empty({768, 256}, DType::kBF16, Device::cpu());  // [N, K]
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int64_t i = 0; i < host.numel(); ++i) {
    host.ptr<uint16_t>()[i] = f32_to_bf16_rn(i % 997 == 3 ? 40.0f * nd(rng) : nd(rng));
  }
  const Tensor w = Tensor::copy_of(host, gpu.device());
  QuantConfig cfg = resolve_precision(r, c).linears[0].w;
  DelayedScalingState state(DelayedScalingConfig{}, ScalingPass::kForward, 1, gpu.device());
  if (r == Recipe::kFP8) {
    cfg.delayed = &state;
    cfg.delayed_slot = 0;
  }
  auto q = [&](bool row, bool col) {
    QuantConfig k = cfg;
    k.rowwise = row;
    k.columnwise = col;
    QuantizedTensor out;
    quantize(gpu, w, k, out);
    return out;
  };
  auto bytes = [](const Tensor& t) {
    std::vector<uint8_t> b;
    if (!t.defined()) return b;
    const Tensor h = Tensor::copy_of(t, Device::cpu());
    b.assign(h.ptr<uint8_t>(), h.ptr<uint8_t>() + h.nbytes());
    return b;
  };
  const QuantizedTensor both = q(true, true), row = q(true, false), col = q(false, true);
  EXPECT_EQ(bytes(both.rowwise_data), bytes(row.rowwise_data)) << recipe_name(r);
  EXPECT_EQ(bytes(both.rowwise_scale_inv), bytes(row.rowwise_scale_inv)) << recipe_name(r);
  EXPECT_EQ(bytes(both.columnwise_data), bytes(col.columnwise_data)) << recipe_name(r);
  EXPECT_EQ(bytes(both.columnwise_scale_inv), bytes(col.columnwise_scale_inv)) << recipe_name(r);
  EXPECT_EQ(bytes(both.amax), bytes(row.amax)) << recipe_name(r);
  // The dgrad's global scale (NVFP4) comes with the columnwise copy.
  EXPECT_EQ(bytes(both.columnwise_amax), bytes(col.columnwise_amax)) << recipe_name(r);
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuModel, ::testing::ValuesIn(kAllRecipes), [](const auto& info) {
  std::string n = recipe_name(info.param);
  for (char& ch : n) ch = ch == '-' ? '_' : ch;
  return n;
});

}  // namespace
}  // namespace lowbit

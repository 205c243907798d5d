// The model layer on the CPU: configs, precision plans, and the decoder's gradients against
// finite differences of its own loss.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "lowbit/formats.h"
#include "lowbit/model.h"

namespace lowbit {
namespace {

ModelConfig small_config() {
  ModelConfig c = model_preset("tiny");
  c.vocab_size = 64;
  c.n_layers = 2;
  c.ffn_hidden = 256;
  c.max_seq_len = 16;
  return c;
}

struct Batch {
  Tensor tokens, targets;  // [B, T] i32, host
  int64_t valid = 0;
};

Batch make_batch(int B, int T, int64_t vocab, uint32_t seed) {
  Batch b;
  b.tokens = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  b.targets = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < int64_t(B) * T; ++i) {
    b.tokens.ptr<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    // Every 7th target is masked (SFT-style ignore index).
    const bool masked = i % 7 == 3;
    b.targets.ptr<int32_t>()[i] = masked ? -1 : static_cast<int32_t>(rng() % vocab);
    b.valid += masked ? 0 : 1;
  }
  return b;
}

TEST(ModelConfigTest, PresetsValidateAndCountParameters) {
  for (const std::string& name : model_preset_names()) {
    ModelConfig c = model_preset(name);
    if (c.vocab_size == 0) c.vocab_size = 32000;
    EXPECT_NO_THROW(c.validate()) << name;
  }
  ModelConfig c = model_preset("124m");
  c.vocab_size = 32000;
  // 12 blocks · (4·768² + 3·768·2048 + 2·768) + 32000·768 + 768.
  EXPECT_EQ(c.num_params(), 12 * (4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768) + 32000 * 768 + 768);
  ModelConfig l8 = model_preset("8b");
  EXPECT_NEAR(double(l8.num_params()), 8.03e9, 0.01e9);  // LLaMA-3 8B
  EXPECT_THROW(model_preset("13b"), UserError);
}

TEST(ModelConfigTest, RejectsBadShapesWithClearErrors) {
  ModelConfig c = small_config();
  c.n_kv_heads = 3;
  try {
    c.validate();
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("n_kv_heads"), std::string::npos) << e.what();
  }
  c = small_config();
  c.d_model = 96;  // head dim 48
  EXPECT_THROW(c.validate(), UserError);
  c = small_config();
  c.vocab_size = 0;
  EXPECT_THROW(c.validate(), UserError);
}

// Integer fields take integers in range (a whole-number float too), nothing truncated or
// wrapped; TOML's NaN and inf are refused rather than read as "not given".
TEST(ModelConfigTest, IntegersInRangeAndFiniteNumbersOnly) {
  for (const char* bad : {R"({"d_model": 128.9})", R"({"d_model": 4294967424})",
                          R"({"n_layers": 18446744073709551615})", R"({"n_heads": "4"})"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(model_config_from_json(bad, small_config(), "c.json"), UserError);
  }
  EXPECT_EQ(model_config_from_json(R"({"n_layers": 3.0})", small_config(), "c.json").n_layers, 3);
  const std::string hf_head = R"({"hidden_size": 256, "num_attention_heads": 4,
    "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 320, "head_dim": 64.9})";
  EXPECT_THROW(model_config_from_json(hf_head, small_config(), "config.json"), UserError);
  for (const char* bad : {"norm_eps = nan\n", "rope_factor = inf\n", "d_model = 1e99\n"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(model_config_from_toml(bad, small_config(), "c.toml"), UserError);
  }
}

TEST(ModelConfigTest, ReadsHuggingFaceConfigAndOurJson) {
  const std::string hf = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
    "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 16, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
    "hidden_act": "silu", "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
    "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";
  const ModelConfig c = model_config_from_json(hf, ModelConfig(), "config.json");
  EXPECT_EQ(c.d_model, 2048);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.ffn_hidden, 8192);
  EXPECT_FLOAT_EQ(c.rope.factor, 32.0f);
  EXPECT_EQ(c.rope.original_max_positions, 8192);
  EXPECT_NO_THROW(c.validate());
  // Our JSON round-trips and overrides only what it names.
  const ModelConfig back = model_config_from_json(c.to_json(), small_config(), "ours.json");
  EXPECT_EQ(back.to_json(), c.to_json());
  const ModelConfig part =
      model_config_from_json(R"({"n_layers": 3})", small_config(), "part.json");
  EXPECT_EQ(part.n_layers, 3);
  EXPECT_EQ(part.d_model, small_config().d_model);
  EXPECT_THROW(model_config_from_json(R"({"n_layerz": 3})", small_config(), "typo.json"),
               UserError);
  EXPECT_THROW(model_config_from_json("{not json", small_config(), "bad.json"), UserError);
  EXPECT_THROW(model_config_from_file("/nonexistent/config.json", small_config()), UserError);
  try {  // a directory is named as such, not reported as invalid JSON
    model_config_from_file(std::filesystem::temp_directory_path().string(), small_config());
    ADD_FAILURE() << "a directory was read as a model config";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  // TOML with the same keys, top level or under [model].
  const ModelConfig t1 =
      model_config_from_toml("n_layers = 3\nrope_theta = 500000.0\n", small_config(), "a.toml");
  EXPECT_EQ(t1.n_layers, 3);
  EXPECT_FLOAT_EQ(t1.rope.theta, 500000.0f);
  const ModelConfig t2 = model_config_from_toml(
      "[model]\nd_model = 256\nn_heads = 4\ntie_embeddings = false\n", small_config(), "b.toml");
  EXPECT_EQ(t2.d_model, 256);
  EXPECT_FALSE(t2.tie_embeddings);
  EXPECT_THROW(model_config_from_toml("n_layers = [1, 2]\n", small_config(), "c.toml"), UserError);
  EXPECT_THROW(model_config_from_toml("n_layers = \n", small_config(), "d.toml"), UserError);
  EXPECT_THROW(model_config_from_toml("n_layerz = 3\n", small_config(), "e.toml"), UserError);
}

TEST(PrecisionPlanTest, RecipesResolvePerLayer) {
  ModelConfig c = model_preset("124m");
  c.vocab_size = 32000;
  const PrecisionPlan fp8 = resolve_precision(Recipe::kFP8, c);
  EXPECT_EQ(fp8.at(0, LinearKind::kQKV).x.dtype, DType::kE4M3);
  EXPECT_EQ(fp8.at(0, LinearKind::kQKV).dy.dtype, DType::kE5M2);  // HYBRID
  EXPECT_EQ(fp8.head.recipe, Recipe::kBF16);
  PrecisionOverrides e4m3;
  e4m3.fp8_format = Fp8Format::kE4M3;
  EXPECT_EQ(resolve_precision(Recipe::kFP8, c, e4m3).at(3, LinearKind::kDown).dy.dtype,
            DType::kE4M3);
  // NVFP4 keeps the last ceil(0.15 · 12) = 2 blocks in BF16.
  const PrecisionPlan nv = resolve_precision(Recipe::kNVFP4, c);
  EXPECT_EQ(nv.at(9, LinearKind::kQKV).recipe, Recipe::kNVFP4);
  EXPECT_EQ(nv.at(10, LinearKind::kQKV).recipe, Recipe::kBF16);
  EXPECT_EQ(nv.at(11, LinearKind::kDown).recipe, Recipe::kBF16);
  EXPECT_TRUE(nv.at(0, LinearKind::kGateUp).dy.stochastic_rounding);
  EXPECT_TRUE(nv.at(0, LinearKind::kGateUp).x.hadamard_columnwise);
  EXPECT_EQ(nv.at(0, LinearKind::kGateUp).w.mode, ScalingMode::kNVFP4_16x16);
  PrecisionOverrides keep;
  keep.bf16_layers = {0};
  EXPECT_EQ(resolve_precision(Recipe::kMXFP8, c, keep).at(0, LinearKind::kProj).recipe,
            Recipe::kBF16);
  keep.bf16_layers = {12};
  EXPECT_THROW(resolve_precision(Recipe::kMXFP8, c, keep), UserError);
  EXPECT_NE(nv.describe().find("blocks 10-11"), std::string::npos) << nv.describe();
  EXPECT_NE(nv.to_json().find("\"nvfp4\""), std::string::npos);
}

TEST(ParamArenaTest, HuggingFaceNamesFusedViewsAndAlignment) {
  const ModelConfig c = small_config();
  ParamArena a(c, Device::cpu());
  EXPECT_EQ(a.params().front().name, "model.embed_tokens.weight");
  EXPECT_GE(a.find("model.layers.1.mlp.down_proj.weight"), 0);
  EXPECT_EQ(a.find("lm_head.weight"), -1);  // tied
  int64_t total = 0;
  for (const ParamInfo& p : a.params()) {
    EXPECT_EQ(p.offset % 128, 0) << p.name;
    total += p.shape.numel();
  }
  EXPECT_EQ(total, c.num_params());
  const int q = a.find("model.layers.0.self_attn.q_proj.weight");
  const TensorView qkv = a.compute_fused(q, q + 2);
  EXPECT_EQ(qkv.shape, (Shape{(2 + 2 * 1) * 64, 128}));
  EXPECT_ANY_THROW(a.compute_fused(q, q + 4));  // a 1-D norm weight follows o_proj
}

// Loss per valid token of the f32 reference model.
double mean_loss(LlamaModel& m, const Batch& b, int B, int T) {
  const StepStats s = m.forward_loss(b.tokens, b.targets, B, T);
  return s.loss_sum / double(s.valid_tokens);
}

TEST(ModelGradientTest, BackwardMatchesFiniteDifferences) {
  const ModelConfig c = small_config();
  Context ctx(Device::cpu());
  LlamaModel m(c, resolve_precision(Recipe::kBF16, c), ctx, DType::kF32);
  m.init_weights(7);
  // Larger weights than the default init so that every path carries a visible gradient.
  ParamArena& a = m.params();
  float* w = a.master_all.ptr<float>();
  for (int64_t i = 0; i < a.size(); ++i) w[i] *= 5.0f;
  const int B = 2, T = 8;
  const Batch b = make_batch(B, T, c.vocab_size, 3);
  fill_bytes(a.grad_all, 0);
  m.forward_backward(b.tokens, b.targets, B, T, 1.0f / float(b.valid));
  const float* g = a.grad_all.ptr<float>();
  std::mt19937 rng(11);
  int checked = 0;
  for (const ParamInfo& p : a.params()) {
    for (int rep = 0; rep < 3; ++rep) {
      const int64_t i = p.offset + int64_t(rng() % uint64_t(p.shape.numel()));
      const float keep = w[i];
      // Fourth-order central differences: (−f(2h) + 8f(h) − 8f(−h) + f(−2h)) / 12h.
      const float eps = 4e-3f * std::max(1.0f, std::fabs(keep));
      double f[4];
      const float at[4] = {keep + 2 * eps, keep + eps, keep - eps, keep - 2 * eps};
      for (int j = 0; j < 4; ++j) {
        w[i] = at[j];
        f[j] = mean_loss(m, b, B, T);
      }
      w[i] = keep;
      const double h = double(at[1]) - double(keep);
      const double fd = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12.0 * h);
      EXPECT_NEAR(g[i], fd, 3e-2 * std::fabs(fd) + 2e-4) << p.name << " element " << (i - p.offset);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * static_cast<int>(a.params().size()));
}

TEST(ModelGradientTest, ActivationCheckpointingGivesIdenticalGradients) {
  const ModelConfig c = small_config();
  Context ctx(Device::cpu());
  const int B = 2, T = 16;
  const Batch b = make_batch(B, T, c.vocab_size, 5);
  std::vector<float> grads[2];
  for (int ck = 0; ck < 2; ++ck) {
    LlamaModel m(c, resolve_precision(Recipe::kFP8, c), ctx);
    m.init_weights(3);
    ForwardOptions o;
    o.activation_checkpointing = ck == 1;
    m.forward_backward(b.tokens, b.targets, B, T, 1.0f / float(b.valid), o);
    const float* g = m.params().grad_all.ptr<float>();
    grads[ck].assign(g, g + m.params().size());
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// A step's first micro-batch may write the linears' weight gradients outright (beta 0) instead
// of adding them to zeroed buffers: the same gradients, whatever the buffers held before (NaN
// here), with one or two micro-batches, tied or untied head, in a bf16 and a quantized recipe.
TEST(ModelGradientTest, OverwrittenLinearGradsEqualZeroedAndAccumulated) {
  Context ctx(Device::cpu());
  const int B = 2, T = 16;
  const Batch b1 = make_batch(B, T, 64, 8), b2 = make_batch(B, T, 64, 9);
  for (const bool tied : {false, true}) {
    for (const Recipe r : {Recipe::kBF16, Recipe::kFP8}) {
      for (const int micro : {1, 2}) {
        ModelConfig c = small_config();
        c.tie_embeddings = tied;
        std::vector<float> grads[2];
        for (int overwrite = 0; overwrite < 2; ++overwrite) {
          LlamaModel m(c, resolve_precision(r, c), ctx);
          m.init_weights(4);
          ParamArena& a = m.params();
          fill_bytes(a.grad_all, 0xFF);  // NaN everywhere: stale values must not leak through
          m.zero_grads(overwrite == 1);
          ForwardOptions o;
          o.overwrite_linear_grads = overwrite == 1;
          m.forward_backward(b1.tokens, b1.targets, B, T, 0.01f, o);
          o.overwrite_linear_grads = false;
          if (micro == 2) m.forward_backward(b2.tokens, b2.targets, B, T, 0.01f, o);
          const float* g = a.grad_all.ptr<float>();
          for (const ParamInfo& p : a.params())
            grads[overwrite].insert(grads[overwrite].end(), g + p.offset,
                                    g + p.offset + p.shape.numel());
        }
        const std::string what = fmt::format("{} head, {}, {} micro-batches",
                                             tied ? "tied" : "untied", recipe_name(r), micro);
        ASSERT_EQ(grads[0].size(), grads[1].size()) << what;
        size_t nonfinite = 0;
        for (const float v : grads[0]) nonfinite += std::isfinite(v) ? 0 : 1;
        EXPECT_EQ(nonfinite, 0u) << what;
        EXPECT_EQ(grads[0], grads[1]) << what;
      }
    }
  }
}

// Recomputing the columnwise copies of the linears' inputs and weights in the backward (the
// default) gives the gradients of keeping them, bit for bit, in every quantized recipe.
TEST(ModelGradientTest, RecomputedQuantizedInputsGiveIdenticalGradients) {
  const ModelConfig c = small_config();
  const int B = 2, T = 16;
  const Batch b = make_batch(B, T, c.vocab_size, 6);
  for (Recipe r : kAllRecipes) {
    if (r == Recipe::kBF16) continue;
    // 0: recompute both (default); 1: keep the inputs; 2: keep the quantized weights.
    std::vector<float> grads[3];
    for (int variant = 0; variant < 3; ++variant) {
      Context ctx(Device::cpu());  // fresh stochastic-rounding offsets (nvfp4 gradients)
      LlamaModel m(c, resolve_precision(r, c), ctx);
      m.init_weights(4);
      ForwardOptions o;
      o.recompute_quantized_inputs = variant != 1;
      o.recompute_quantized_weights = variant != 2;
      // Two micro-batches: the second recomputes under the amaxes the first recorded.
      for (int mb = 0; mb < 2; ++mb) {
        m.forward_backward(b.tokens, b.targets, B, T, 1.0f / float(b.valid), o);
      }
      const float* g = m.params().grad_all.ptr<float>();
      grads[variant].assign(g, g + m.params().size());
    }
    EXPECT_EQ(grads[0], grads[1]) << recipe_name(r);
    EXPECT_EQ(grads[0], grads[2]) << recipe_name(r);
  }
}

// Dropping each block's qkv and gate_up outputs after the forward and recomputing them in the
// backward gives the same loss and gradients, bit for bit, in every recipe (also under
// activation checkpointing, whose block recompute keeps what it makes), and NVFP4 plans do it by
// default: their activation peak is lower than with it off.
TEST(ModelGradientTest, RecomputedBlockOutputsGiveIdenticalGradients) {
  const ModelConfig c = small_config();
  const int B = 2, T = 16;
  const Batch b = make_batch(B, T, c.vocab_size, 7);
  using R = ForwardOptions::Recompute;
  for (Recipe r : kAllRecipes) {
    // 0: off; 1: on; 2: on with activation checkpointing; 3: auto; 4: the first block.
    std::vector<float> grads[5];
    double loss[5];
    int64_t act_peak[5];
    for (int variant = 0; variant < 5; ++variant) {
      Context ctx(Device::cpu());
      LlamaModel m(c, resolve_precision(r, c), ctx);
      m.init_weights(5);
      ForwardOptions o;
      o.recompute_block_outputs = variant == 0   ? R::kOff
                                  : variant == 3 ? R::kAuto
                                  : variant == 4 ? R::kFirst
                                                 : R::kOn;
      o.recompute_first_blocks = 1;
      o.activation_checkpointing = variant == 2;
      mem_reset_peaks(Device::cpu());
      loss[variant] = 0;
      for (int mb = 0; mb < 2; ++mb) {
        loss[variant] +=
            m.forward_backward(b.tokens, b.targets, B, T, 1.0f / float(b.valid), o).loss_sum;
      }
      act_peak[variant] =
          mem_stats(Device::cpu()).by_category[int(MemCategory::kActivations)].peak_bytes;
      const float* g = m.params().grad_all.ptr<float>();
      grads[variant].assign(g, g + m.params().size());
    }
    for (int variant = 1; variant < 5; ++variant) {
      EXPECT_EQ(grads[0], grads[variant]) << recipe_name(r) << " variant " << variant;
      EXPECT_EQ(loss[0], loss[variant]) << recipe_name(r) << " variant " << variant;
    }
    EXPECT_LT(act_peak[1], act_peak[0]) << recipe_name(r);
    // One block of two: between none and all.
    EXPECT_LT(act_peak[4], act_peak[0]) << recipe_name(r);
    EXPECT_GT(act_peak[4], act_peak[1]) << recipe_name(r);
    if (r == Recipe::kNVFP4) {
      EXPECT_EQ(act_peak[3], act_peak[1]) << "auto recomputes every block for nvfp4";
    } else if (r == Recipe::kBF16) {
      EXPECT_EQ(act_peak[3], act_peak[0]) << "auto keeps the outputs for bf16";
    } else {
      EXPECT_EQ(act_peak[3], act_peak[4])
          << "auto recomputes the first block for " << recipe_name(r);
    }
  }
}

TEST(ModelGradientTest, RecomputeSettingNames) {
  using R = ForwardOptions::Recompute;
  auto parse = [](const char* name) {
    ForwardOptions o;
    o.set_recompute_from_name(name);
    return o;
  };
  EXPECT_EQ(parse("auto").recompute_block_outputs, R::kAuto);
  EXPECT_EQ(parse("on").recompute_block_outputs, R::kOn);
  EXPECT_EQ(parse("off").recompute_block_outputs, R::kOff);
  EXPECT_EQ(parse("3").recompute_block_outputs, R::kFirst);
  EXPECT_EQ(parse("3").recompute_first_blocks, 3);
  // Resolved block counts: auto by recipe (⌈L/16⌉ for the quantized ones but NVFP4), a count
  // clamped to the model.
  EXPECT_EQ(parse("auto").recomputed_blocks(Recipe::kBF16, 16), 0);
  EXPECT_EQ(parse("auto").recomputed_blocks(Recipe::kFP8, 16), 1);
  EXPECT_EQ(parse("auto").recomputed_blocks(Recipe::kFP8, 32), 2);
  EXPECT_EQ(parse("auto").recomputed_blocks(Recipe::kMXFP8, 12), 1);
  EXPECT_EQ(parse("auto").recomputed_blocks(Recipe::kNVFP4, 16), 16);
  EXPECT_EQ(parse("on").recomputed_blocks(Recipe::kBF16, 16), 16);
  EXPECT_EQ(parse("off").recomputed_blocks(Recipe::kNVFP4, 16), 0);
  EXPECT_EQ(parse("40").recomputed_blocks(Recipe::kFP8, 16), 16);
  for (const char* bad : {"sometimes", "-1", "", "1.5"}) {
    try {
      parse(bad);
      FAIL() << "expected a UserError for '" << bad << "'";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("unknown recompute setting"), std::string::npos)
          << e.what();
    }
  }
}

// The model quantizes a weight's rowwise copy once per step and its columnwise copy in the
// backward, separately: for every recipe's weight configuration each copy equals the one
// quantize() makes of both at once (payloads, scales and amaxes, byte for byte).
TEST(ModelGradientTest, WeightCopiesQuantizedSeparatelyEqualBothAtOnce) {
  const ModelConfig c = small_config();
  Context ctx(Device::cpu());
  Tensor w = Tensor::empty({256, 128}, DType::kBF16, Device::cpu());  // [N, K]
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int64_t i = 0; i < w.numel(); ++i) {
    // Gaussian weights with a few outliers (scales saturate differently per block).
    const float v = i % 997 == 3 ? 40.0f * nd(rng) : nd(rng);
    w.ptr<uint16_t>()[i] = f32_to_bf16_rn(v);
  }
  auto same = [](const Tensor& a, const Tensor& b) {
    if (a.defined() != b.defined()) return false;
    if (!a.defined()) return true;
    return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  };
  for (Recipe r : kAllRecipes) {
    if (r == Recipe::kBF16) continue;
    QuantConfig cfg = resolve_precision(r, c).linears[0].w;
    DelayedScalingState state(DelayedScalingConfig{}, ScalingPass::kForward, 1);
    if (r == Recipe::kFP8) {
      cfg.delayed = &state;
      cfg.delayed_slot = 0;
    }
    auto q = [&](bool row, bool col) {
      QuantConfig k = cfg;
      k.rowwise = row;
      k.columnwise = col;
      QuantizedTensor out;
      quantize(ctx, w, k, out);
      return out;
    };
    const QuantizedTensor both = q(true, true), row = q(true, false), col = q(false, true);
    EXPECT_TRUE(same(both.rowwise_data, row.rowwise_data)) << recipe_name(r);
    EXPECT_TRUE(same(both.rowwise_scale_inv, row.rowwise_scale_inv)) << recipe_name(r);
    EXPECT_TRUE(same(both.columnwise_data, col.columnwise_data)) << recipe_name(r);
    EXPECT_TRUE(same(both.columnwise_scale_inv, col.columnwise_scale_inv)) << recipe_name(r);
    EXPECT_TRUE(same(both.amax, row.amax)) << recipe_name(r);
    // The dgrad's global scale (NVFP4) comes with the columnwise copy.
    EXPECT_TRUE(same(both.columnwise_amax, col.columnwise_amax)) << recipe_name(r);
    EXPECT_FALSE(row.has_columnwise());
    EXPECT_FALSE(col.has_rowwise());
  }
}

// Quantized block linears keep no bf16 compute copy of their weights; bf16 ones, the norms and
// the embedding do. bf16_weight() gives RN_bf16(master) either way.
TEST(ModelConfigTest, QuantizedLinearsKeepNoComputeCopy) {
  const ModelConfig c = small_config();
  Context ctx(Device::cpu());
  PrecisionOverrides ov;
  ov.bf16_layers = {1};  // block 1 stays bf16
  LlamaModel m(c, resolve_precision(Recipe::kFP8, c, ov), ctx);
  m.init_weights(3);
  const ParamArena& a = m.params();
  EXPECT_FALSE(a.has_compute(a.find("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_FALSE(a.has_compute(a.find("model.layers.0.mlp.down_proj.weight")));
  EXPECT_TRUE(a.has_compute(a.find("model.layers.0.input_layernorm.weight")));
  EXPECT_TRUE(a.has_compute(a.find("model.layers.1.self_attn.q_proj.weight")));
  EXPECT_TRUE(a.has_compute(a.find("model.embed_tokens.weight")));
  EXPECT_ANY_THROW(a.compute(a.find("model.layers.0.mlp.up_proj.weight")));
  // The compact copy lacks exactly block 0's four linear weights.
  int64_t linear0 = 0;
  for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    linear0 +=
        a.params()[a.find(fmt::format("model.layers.0.self_attn.{}.weight", n))].shape.numel();
  }
  for (const char* n : {"gate_proj", "up_proj", "down_proj"}) {
    linear0 += a.params()[a.find(fmt::format("model.layers.0.mlp.{}.weight", n))].shape.numel();
  }
  EXPECT_EQ(a.compute_all.numel(), a.size() - linear0);
  // bf16_weight of a quantized linear: RN_bf16 of its master weight, rows of q, k, v fused.
  const TensorView w0 = m.bf16_weight(0);
  const int q = a.find("model.layers.0.self_attn.q_proj.weight");
  const float* master = a.master(q).ptr<const float>();
  ASSERT_EQ(w0.shape[1], c.d_model);
  for (int64_t i = 0; i < w0.numel(); ++i) {
    ASSERT_EQ(w0.ptr<const uint16_t>()[i], f32_to_bf16_rn(master[i])) << i;
  }
}

TEST(ModelGradientTest, EveryRecipeRunsAndStaysCloseToBf16) {
  ModelConfig c = small_config();
  Context ctx(Device::cpu());
  const int B = 2, T = 16;
  const Batch b = make_batch(B, T, c.vocab_size, 9);
  double bf16_loss = 0;
  for (Recipe r : kAllRecipes) {
    LlamaModel m(c, resolve_precision(r, c), ctx);
    m.init_weights(1);
    const StepStats s = m.forward_backward(b.tokens, b.targets, B, T, 1.0f / float(b.valid));
    const double loss = s.loss_sum / double(s.valid_tokens);
    EXPECT_EQ(s.valid_tokens, b.valid);
    EXPECT_TRUE(std::isfinite(loss)) << recipe_name(r);
    if (r == Recipe::kBF16) bf16_loss = loss;
    // At init the loss is ≈ ln(V); quantization moves it by far less than that.
    EXPECT_NEAR(loss, std::log(double(c.vocab_size)), 0.3) << recipe_name(r);
    EXPECT_NEAR(loss, bf16_loss, 0.05) << recipe_name(r);
    double gsum = 0;
    const float* g = m.params().grad_all.ptr<float>();
    for (int64_t i = 0; i < m.params().size(); ++i) gsum += double(g[i]) * g[i];
    EXPECT_TRUE(std::isfinite(gsum) && gsum > 0) << recipe_name(r);
  }
}

}  // namespace
}  // namespace lowbit

// The precision policy: named recipes resolved to a per-layer, per-operand plan.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "lowbit/model.h"

namespace lowbit {

std::string_view linear_kind_name(LinearKind k) {
  switch (k) {
    case LinearKind::kQKV: return "qkv";
    case LinearKind::kProj: return "proj";
    case LinearKind::kGateUp: return "gate_up";
    case LinearKind::kDown: return "down";
  }
  return "?";
}

namespace {

// The operand configurations of one quantized recipe (formats.md §2). Each operand produces
// the copies its GEMMs need: X rowwise (fprop) and columnwise (wgrad), W rowwise (fprop) and
// columnwise (dgrad), dY rowwise (dgrad) and columnwise (wgrad).
LinearPrecision recipe_linear(Recipe r, const PrecisionOverrides& ov) {
  LinearPrecision p;
  p.recipe = r;
  switch (r) {
    case Recipe::kBF16: break;
    case Recipe::kFP8:  // delayed scaling; the model binds the state and slots
    case Recipe::kFP8Current: {
      const DType fwd = fp8_format_dtype(ov.fp8_format, ScalingPass::kForward);
      const DType bwd = fp8_format_dtype(ov.fp8_format, ScalingPass::kBackward);
      p.x = QuantConfig::fp8_current(fwd);
      p.w = QuantConfig::fp8_current(fwd);
      p.dy = QuantConfig::fp8_current(bwd);
      break;
    }
    case Recipe::kFP8Block:
      p.x = QuantConfig::fp8_block_1x128(DType::kE4M3);
      p.w = QuantConfig::fp8_block_128x128(DType::kE4M3);
      p.dy = QuantConfig::fp8_block_1x128(DType::kE4M3);
      break;
    case Recipe::kMXFP8:
      p.x = QuantConfig::mx(DType::kE4M3);
      p.w = QuantConfig::mx(DType::kE4M3);
      p.dy = QuantConfig::mx(DType::kE4M3);
      break;
    case Recipe::kNVFP4:
      p.x = QuantConfig::nvfp4_activation();
      p.w = QuantConfig::nvfp4_weight();
      p.dy = QuantConfig::nvfp4_gradient();
      break;
  }
  for (QuantConfig* q : {&p.x, &p.w, &p.dy}) {
    q->rowwise = true;
    q->columnwise = true;
  }
  return p;
}

std::string describe_operand(const QuantConfig& q, bool delayed) {
  std::string s = fmt::format("{} {}", dtype_name(q.dtype), scaling_mode_name(q.mode));
  if (q.mode == ScalingMode::kPerTensor) s += delayed ? " delayed" : " current";
  if (q.hadamard_columnwise) s += " +rht";
  if (q.stochastic_rounding) s += " +sr";
  return s;
}

nlohmann::json linear_json(const LinearPrecision& p) {
  nlohmann::json j;
  j["recipe"] = recipe_name(p.recipe);
  if (p.recipe != Recipe::kBF16) {
    const bool delayed = p.recipe == Recipe::kFP8;
    j["x"] = describe_operand(p.x, delayed);
    j["w"] = describe_operand(p.w, delayed);
    j["dy"] = describe_operand(p.dy, delayed);
  }
  return j;
}

}  // namespace

PrecisionPlan resolve_precision(Recipe recipe, const ModelConfig& cfg,
                                const PrecisionOverrides& ov) {
  cfg.validate();  // the plan is sized by n_layers
  if (ov.fp8_format == Fp8Format::kE5M2) {
    throw UserError(
        "fp8_format e5m2 is not supported (E5M2 forward tensors lose too much "
        "precision); use hybrid or e4m3");
  }
  if (ov.amax_history_len < 1) {
    throw UserError(fmt::format("amax_history_len must be ≥ 1, got {}", ov.amax_history_len));
  }
  PrecisionPlan plan;
  plan.recipe = recipe;
  plan.overrides = ov;
  const int L = cfg.n_layers;
  std::vector<bool> keep_bf16(L, false);
  for (int l : ov.bf16_layers) {
    if (l < 0 || l >= L) {
      throw UserError(
          fmt::format("bf16 layer {} is out of range: the model has blocks 0..{}", l, L - 1));
    }
    keep_bf16[l] = true;
  }
  if (recipe == Recipe::kNVFP4) {
    // NVFP4 training keeps the last ~15% of blocks in BF16 (the NVIDIA NVFP4 recipe's advice:
    // the final layers are the most sensitive to 4-bit rounding).
    LOWBIT_USER_CHECK(ov.nvfp4_bf16_tail_fraction < 0 || ov.nvfp4_bf16_tail_fraction <= 1,
                      "the NVFP4 BF16 tail fraction must be in [0, 1] (got {})",
                      ov.nvfp4_bf16_tail_fraction);  // NaN fails both: refused too
    const double frac = ov.nvfp4_bf16_tail_fraction < 0 ? 0.15 : ov.nvfp4_bf16_tail_fraction;
    const int tail = std::min(L, static_cast<int>(std::ceil(frac * L - 1e-9)));
    for (int l = L - tail; l < L; ++l) keep_bf16[l] = true;
  }
  plan.linears.reserve(static_cast<size_t>(L) * kLinearsPerBlock);
  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < kLinearsPerBlock; ++k) {
      plan.linears.push_back(recipe_linear(keep_bf16[l] ? Recipe::kBF16 : recipe, ov));
    }
  }
  plan.head = recipe_linear(ov.quantize_head ? recipe : Recipe::kBF16, ov);
  return plan;
}

std::string PrecisionPlan::describe() const {
  std::string out =
      fmt::format("precision plan: recipe {} ({})\n", recipe_name(recipe), recipe_summary(recipe));
  const int L = static_cast<int>(linears.size() / kLinearsPerBlock);
  // Consecutive blocks with the same plan are printed as one range.
  int start = 0;
  auto block_line = [&](int l) {
    std::string s;
    for (int k = 0; k < kLinearsPerBlock; ++k) {
      const LinearPrecision& p = at(l, static_cast<LinearKind>(k));
      s += fmt::format("{}{} {}", k ? ", " : "", linear_kind_name(static_cast<LinearKind>(k)),
                       recipe_name(p.recipe));
    }
    const LinearPrecision& q = at(l, LinearKind::kQKV);
    if (q.recipe != Recipe::kBF16) {
      const bool delayed = q.recipe == Recipe::kFP8;
      s += fmt::format(" [x {}; w {}; dy {}]", describe_operand(q.x, delayed),
                       describe_operand(q.w, delayed), describe_operand(q.dy, delayed));
    }
    return s;
  };
  for (int l = 1; l <= L; ++l) {
    if (l < L && block_line(l) == block_line(start)) continue;
    out += fmt::format("  blocks {}-{}: {}\n", start, l - 1, block_line(start));
    start = l;
  }
  out += fmt::format("  lm head: {}; embeddings, norms, attention: bf16", recipe_name(head.recipe));
  if (recipe == Recipe::kFP8) {
    out += fmt::format("\n  delayed scaling: format {}, amax history {}, algo {}, margin {}",
                       overrides.fp8_format == Fp8Format::kHybrid ? "hybrid" : "e4m3",
                       overrides.amax_history_len,
                       overrides.amax_compute_algo == AmaxComputeAlgo::kMax ? "max" : "most_recent",
                       overrides.fp8_margin);
  }
  return out;
}

bool PrecisionPlan::any_quantized() const {
  if (head.recipe != Recipe::kBF16) return true;
  for (const LinearPrecision& p : linears) {
    if (p.recipe != Recipe::kBF16) return true;
  }
  return false;
}

std::string PrecisionPlan::to_json() const {
  nlohmann::json j;
  j["recipe"] = recipe_name(recipe);
  nlohmann::json blocks = nlohmann::json::array();
  const int L = static_cast<int>(linears.size() / kLinearsPerBlock);
  for (int l = 0; l < L; ++l) {
    nlohmann::json b;
    for (int k = 0; k < kLinearsPerBlock; ++k) {
      b[std::string(linear_kind_name(static_cast<LinearKind>(k)))] =
          linear_json(at(l, static_cast<LinearKind>(k)));
    }
    blocks.push_back(b);
  }
  j["blocks"] = blocks;
  j["lm_head"] = linear_json(head);
  j["fp8_format"] = overrides.fp8_format == Fp8Format::kHybrid ? "hybrid" : "e4m3";
  j["amax_history_len"] = overrides.amax_history_len;
  j["amax_compute_algo"] =
      overrides.amax_compute_algo == AmaxComputeAlgo::kMax ? "max" : "most_recent";
  j["fp8_margin"] = overrides.fp8_margin;
  return j.dump();
}

}  // namespace lowbit

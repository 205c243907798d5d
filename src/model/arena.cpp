// The parameter arena: every parameter tensor is a segment of flat [P] buffers.
#include <fmt/format.h>

#include "lowbit/model.h"

namespace lowbit {

namespace {
// Segment offsets are rounded up to 128 elements so that every parameter's bf16 and f32 views
// are 256-byte aligned (vector loads, cuBLASLt alignment).
constexpr int64_t kSegmentAlign = 128;
int64_t align_up(int64_t x) { return (x + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign; }
}  // namespace

ParamArena::ParamArena(const ModelConfig& cfg, Device dev,
                       const std::function<bool(const std::string&)>& keeps_compute) {
  cfg.validate();
  const int64_t V = cfg.vocab_size, D = cfg.d_model, Dh = cfg.head_dim(), F = cfg.ffn_hidden;
  const int64_t H = cfg.n_heads, Hkv = cfg.n_kv_heads;
  int64_t at = 0;
  auto add = [&](std::string name, Shape shape, bool decay) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = shape;
    p.offset = align_up(at);
    p.weight_decay = decay;
    at = p.offset + shape.numel();
    segments_.push_back({p.offset, shape.numel(), decay});
    params_.push_back(std::move(p));
  };
  // Hugging Face LLaMA names. q, k, v (and gate, up) are adjacent so that each group is one
  // fused [rows, D] weight (their sizes are multiples of 128 elements: no padding between).
  add("model.embed_tokens.weight", {V, D}, true);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {D}, false);
    add(p + "self_attn.q_proj.weight", {H * Dh, D}, true);
    add(p + "self_attn.k_proj.weight", {Hkv * Dh, D}, true);
    add(p + "self_attn.v_proj.weight", {Hkv * Dh, D}, true);
    add(p + "self_attn.o_proj.weight", {D, H * Dh}, true);
    add(p + "post_attention_layernorm.weight", {D}, false);
    add(p + "mlp.gate_proj.weight", {F, D}, true);
    add(p + "mlp.up_proj.weight", {F, D}, true);
    add(p + "mlp.down_proj.weight", {D, F}, true);
  }
  add("model.norm.weight", {D}, false);
  if (!cfg.tie_embeddings) add("lm_head.weight", {V, D}, true);
  size_ = align_up(at);
  // The compact compute buffer: the parameters that keep a bf16 copy, in arena order, with the
  // same alignment (so fused groups stay adjacent rows there too).
  int64_t compute_at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamInfo& p = params_[i];
    if (keeps_compute && !keeps_compute(p.name)) {
      segments_[i].compute_offset = ParamSegment::kNoCompute;
      continue;
    }
    p.compute_offset = align_up(compute_at);
    compute_at = p.compute_offset + p.shape.numel();
    segments_[i].compute_offset = p.compute_offset;
  }

  master_all = Tensor::zeros({size_}, DType::kF32, dev, MemCategory::kWeights);
  compute_all = Tensor::zeros({align_up(compute_at)}, DType::kBF16, dev, MemCategory::kWeights);
  grad_all = Tensor::zeros({size_}, DType::kF32, dev, MemCategory::kGradients);
  m_all = Tensor::zeros({size_}, DType::kF32, dev, MemCategory::kOptimizer);
  v_all = Tensor::zeros({size_}, DType::kF32, dev, MemCategory::kOptimizer);
}

int ParamArena::find(std::string_view name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {
TensorView segment_view(const Tensor& all, DType t, int64_t offset, Shape shape) {
  auto* base = static_cast<char*>(all.data());
  return TensorView(base + dtype_storage_bytes(t, offset), t, shape, all.device());
}
}  // namespace

TensorView ParamArena::master(int i) const {
  return segment_view(master_all, DType::kF32, params_[i].offset, params_[i].shape);
}
TensorView ParamArena::grad(int i) const {
  return segment_view(grad_all, DType::kF32, params_[i].offset, params_[i].shape);
}
TensorView ParamArena::compute(int i) const {
  LOWBIT_CHECK(params_[i].has_compute(),
               "{} has no bf16 compute copy (it reaches the GEMMs only quantized)",
               params_[i].name);
  return segment_view(compute_all, DType::kBF16, params_[i].compute_offset, params_[i].shape);
}

void ParamArena::sync_compute(Context& ctx) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].has_compute()) continue;
    const int64_t n = params_[i].shape.numel();
    convert(ctx, segment_view(compute_all, DType::kBF16, params_[i].compute_offset, Shape{n}),
            segment_view(master_all, DType::kF32, params_[i].offset, Shape{n}));
  }
}

namespace {
Shape fused_shape(const std::vector<ParamInfo>& ps, int first, int last) {
  LOWBIT_CHECK(first >= 0 && last < static_cast<int>(ps.size()) && first <= last,
               "fused params [{}, {}]", first, last);
  int64_t rows = 0;
  const int64_t cols = ps[first].shape[1];
  int64_t expect = ps[first].offset;
  for (int i = first; i <= last; ++i) {
    LOWBIT_CHECK(ps[i].shape.ndim == 2 && ps[i].shape[1] == cols && ps[i].offset == expect,
                 "params {}..{} are not adjacent rows of one matrix", ps[first].name,
                 ps[last].name);
    rows += ps[i].shape[0];
    expect += ps[i].shape.numel();
  }
  return Shape{rows, cols};
}
}  // namespace

TensorView ParamArena::compute_fused(int first, int last) const {
  const Shape shape = fused_shape(params_, first, last);
  for (int i = first; i <= last; ++i) {
    LOWBIT_CHECK(
        params_[i].has_compute() && params_[i].compute_offset - params_[first].compute_offset ==
                                        params_[i].offset - params_[first].offset,
        "{} has no bf16 compute copy adjacent to {}'s", params_[i].name, params_[first].name);
  }
  return segment_view(compute_all, DType::kBF16, params_[first].compute_offset, shape);
}
TensorView ParamArena::grad_fused(int first, int last) const {
  return segment_view(grad_all, DType::kF32, params_[first].offset,
                      fused_shape(params_, first, last));
}

TensorView ParamArena::master_fused(int first, int last) const {
  return segment_view(master_all, DType::kF32, params_[first].offset,
                      fused_shape(params_, first, last));
}

}  // namespace lowbit

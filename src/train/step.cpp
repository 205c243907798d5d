// One optimizer step (see step.h).
#include "lowbit/train/step.h"

#include <cmath>
#include <limits>

#include "lowbit/core/nvtx.h"

namespace lowbit {

StepRunner::StepRunner(LlamaModel& model, Context& ctx) : model_(model), ctx_(ctx) {
  const Device dev = ctx.device();
  const int64_t S = static_cast<int64_t>(model.params().segments().size());
  seg_norms_ = Tensor::zeros({S}, DType::kF32, dev, MemCategory::kWorkspace);
  norm_ = Tensor::zeros({1}, DType::kF32, dev, MemCategory::kWorkspace);
  coef_ = Tensor::zeros({1}, DType::kF32, dev, MemCategory::kWorkspace);
  skip_ = Tensor::zeros({1}, DType::kI32, dev, MemCategory::kWorkspace);
}

StepOutcome StepRunner::step(const std::vector<MicroBatch>& micro, int B, int T,
                             const AdamWConfig& adam, float grad_clip, const ForwardOptions& fwd) {
  const NvtxRange step_range("train step");
  ParamArena& arena = model_.params();
  StepOutcome out;
  for (const MicroBatch& m : micro) out.valid += m.valid;
  if (out.valid == 0) {
    out.no_targets = true;
    out.skipped = true;
    out.loss = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  // Every token's loss gradient is scaled by 1 / (valid targets of the whole step), so the
  // micro-batches add up to the gradient of the step's mean loss (valid > 0: a step without
  // targets returned above).
  const float grad_scale = 1.0f / float(out.valid);
  // The first micro-batch's wgrad GEMMs write the linears' gradients outright (beta 0): only
  // the others (embedding, norms) are zeroed here.
  model_.zero_grads(/*except_overwritten=*/!micro.empty());
  // The per-token losses stay on the device until the one wait at the end of the step.
  std::vector<StepStats> stats;
  stats.reserve(micro.size());
  for (size_t i = 0; i < micro.size(); ++i) {
    const NvtxRange mb_range("micro-batch forward+backward");
    ForwardOptions o = fwd;
    o.overwrite_linear_grads = i == 0;
    o.defer_loss_read = true;
    const MicroBatch& m = micro[i];
    stats.push_back(model_.forward_backward(m.tokens, m.targets, B, T, grad_scale, o));
  }
  const std::vector<ParamSegment>& segs = arena.segments();
  const NvtxRange opt_range("clip + AdamW + scaling update");
  segment_norms(ctx_, seg_norms_, arena.grad_all, segs);
  clip_coefficient(ctx_, norm_, coef_, skip_, seg_norms_, grad_clip);
  const TensorView compute = arena.compute_all.view();
  adamw_step(ctx_, arena.master_all, arena.grad_all, arena.m_all, arena.v_all, &compute, segs, adam,
             coef_, skip_);
  model_.weights_changed();
  if (DelayedScalingState* s = model_.fp8_forward_state()) s->update(&ctx_);
  if (DelayedScalingState* s = model_.fp8_backward_state()) s->update(&ctx_);
  float norm = 0;
  int32_t skip = 0;
  std::vector<Context::HostCopy> reads = {{norm_.view(), &norm}, {skip_.view(), &skip}};
  std::vector<std::vector<float>> losses(stats.size());
  std::vector<std::vector<int32_t>> targets(stats.size());
  std::vector<const int32_t*> target_ids(stats.size());
  for (size_t i = 0; i < stats.size(); ++i) {
    losses[i].resize(static_cast<size_t>(stats[i].losses.numel()));
    reads.push_back({stats[i].losses.view(), losses[i].data()});
    if (micro[i].targets.device.is_cpu()) {
      // The caller's host targets (contiguous, checked by the model): nothing to read back.
      target_ids[i] = micro[i].targets.ptr<const int32_t>();
    } else {
      targets[i].resize(static_cast<size_t>(stats[i].targets.numel()));
      reads.push_back({stats[i].targets.view(), targets[i].data()});
      target_ids[i] = targets[i].data();
    }
  }
  ctx_.read_back(reads);
  double loss_sum = 0;
  for (size_t i = 0; i < stats.size(); ++i) {
    stats[i].add_losses(losses[i].data(), target_ids[i], stats[i].losses.numel());
    loss_sum += stats[i].loss_sum;
  }
  out.loss = loss_sum / double(out.valid);
  out.grad_norm = norm;
  // Skipped is what the guard did (AdamW's step count must follow the updates applied).
  out.skipped = skip != 0;
  if (out.skipped) {
    const Tensor sh = Tensor::copy_of(seg_norms_, Device::cpu());
    for (size_t i = 0; i < segs.size(); ++i) {
      if (!std::isfinite(sh.ptr<float>()[i])) {
        out.non_finite = arena.params()[i].name;
        break;
      }
    }
  }
  return out;
}

}  // namespace lowbit

// One optimizer step: micro-batches → gradients → global norm and clip → AdamW → delayed
// scaling update. Shared by the trainer and `lowbit bench train`.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lowbit/model.h"
#include "lowbit/ops.h"

namespace lowbit {

struct MicroBatch {
  TensorView tokens;   // [B, T] i32 (host or device)
  TensorView targets;  // [B, T] i32, -1 = no loss
  int64_t valid = 0;   // targets ≥ 0
};

struct StepOutcome {
  double loss = 0;         // mean loss over the valid targets of the step
  int64_t valid = 0;       // valid targets of the step
  double grad_norm = 0;    // global norm before clipping
  bool skipped = false;    // no update applied: a non-finite gradient, or no_targets
  std::string non_finite;  // the first parameter whose gradient is not finite ("" if none)
  // No target of the step carries loss (every one masked, e.g. SFT records without an answer in
  // reach): nothing ran, no update (weight decay and the moments' decay included), loss NaN;
  // skipped is set too.
  bool no_targets = false;

  // The loss is not finite although the gradients are (e.g. a cross-entropy over logits at the
  // float limit): the update was applied, and is counted as such.
  bool loss_non_finite() const { return !skipped && !std::isfinite(loss); }
};

class StepRunner {
 public:
  StepRunner(LlamaModel& model, Context& ctx);
  // Runs one optimizer step. `adam.step` is the 1-based count of applied updates (the bias
  // correction); grad_clip ≤ 0 disables clipping. Reads the norm and the guard's verdict back
  // (one synchronisation per step).
  StepOutcome step(const std::vector<MicroBatch>& micro, int batch, int seq_len,
                   const AdamWConfig& adam, float grad_clip, const ForwardOptions& fwd);

 private:
  LlamaModel& model_;
  Context& ctx_;
  Tensor seg_norms_;  // [segments] f32
  Tensor norm_;       // [1] f32
  Tensor coef_;       // [1] f32
  Tensor skip_;       // [1] i32
};

}  // namespace lowbit

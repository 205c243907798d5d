// Learning-rate schedules: linear warmup, then cosine, linear or no decay to min_lr. A schedule
// is a pure function of the step, so a resumed run continues on the same curve.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lowbit {

enum class LrDecay : uint8_t {
  kCosine,    // min_lr + (peak_lr − min_lr) · (1 + cos(π·p)) / 2
  kLinear,    // min_lr + (peak_lr − min_lr) · (1 − p)
  kConstant,  // peak_lr after the warmup
};

const char* lr_decay_name(LrDecay d);  // "cosine", "linear", "constant"
// Inverse of lr_decay_name; an unknown name throws UserError listing the valid ones.
LrDecay lr_decay_from_name(std::string_view name);

// Steps are 0-based: lr_at(s) is the rate of the update that step s applies.
//  * warmup: s < warmup_steps → peak_lr · (s + 1) / warmup_steps (step warmup_steps − 1 reaches
//    peak_lr; no step trains at rate 0);
//  * decay: p = (s − warmup_steps) / (total_steps − warmup_steps), clamped to [0, 1], shaped by
//    `decay`; s ≥ total_steps gives min_lr (kConstant: peak_lr).
struct LrSchedule {
  double peak_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  LrDecay decay = LrDecay::kCosine;

  // Throws UserError naming the field out of range (negative steps, peak_lr ≤ 0, min_lr < 0
  // or > peak_lr, non-finite rates).
  void validate() const;
  double lr_at(int64_t step) const;
  // "cosine: warmup 100 steps to 0.001, decay to 0.0001 at step 3000".
  std::string describe() const;
};

}  // namespace lowbit

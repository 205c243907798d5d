// Learning-rate schedules (include/lowbit/train/schedule.h).
#include "lowbit/train/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "lowbit/core/error.h"

namespace lowbit {

const char* lr_decay_name(LrDecay d) {
  switch (d) {
    case LrDecay::kCosine: return "cosine";
    case LrDecay::kLinear: return "linear";
    case LrDecay::kConstant: return "constant";
  }
  return "?";
}

LrDecay lr_decay_from_name(std::string_view name) {
  for (LrDecay d : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    if (name == lr_decay_name(d)) return d;
  }
  throw UserError(fmt::format(
      "unknown learning-rate schedule '{}'; choose one of: cosine, linear, constant", name));
}

void LrSchedule::validate() const {
  LOWBIT_USER_CHECK(std::isfinite(peak_lr) && peak_lr > 0,
                    "learning-rate schedule: the peak learning rate must be a positive number "
                    "(got {})",
                    peak_lr);
  LOWBIT_USER_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= peak_lr,
                    "learning-rate schedule: the minimum learning rate must be in [0, peak {}] "
                    "(got {})",
                    peak_lr, min_lr);
  LOWBIT_USER_CHECK(warmup_steps >= 0, "learning-rate schedule: warmup steps must be ≥ 0 (got {})",
                    warmup_steps);
  LOWBIT_USER_CHECK(total_steps >= 0, "learning-rate schedule: total steps must be ≥ 0 (got {})",
                    total_steps);
}

double LrSchedule::lr_at(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  if (step < warmup_steps) {
    return peak_lr * double(step + 1) / double(warmup_steps);
  }
  if (decay == LrDecay::kConstant) return peak_lr;
  const int64_t span = total_steps - warmup_steps;
  const double p =
      span <= 0 ? 1.0 : std::clamp(double(step - warmup_steps) / double(span), 0.0, 1.0);
  if (decay == LrDecay::kLinear) return min_lr + (peak_lr - min_lr) * (1.0 - p);
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

std::string LrSchedule::describe() const {
  std::string s =
      fmt::format("{}: warmup {} steps to {}", lr_decay_name(decay), warmup_steps, peak_lr);
  if (decay != LrDecay::kConstant) {
    s += fmt::format(", decay to {} at step {}", min_lr, total_steps);
  }
  return s;
}

}  // namespace lowbit

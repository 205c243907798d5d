// FP8 delayed scaling: amax histories and scale updates (formats.md §2.2), CPU twin.
#include "lowbit/quant.h"
#include "lowbit/quant/scale_math.h"

namespace lowbit {

DType fp8_format_dtype(Fp8Format f, ScalingPass pass) {
  LOWBIT_USER_CHECK(f != Fp8Format::kE5M2,
                    "pure E5M2 training is not supported; use the E4M3 or HYBRID format");
  // HYBRID: forward tensors (inputs, weights, outputs) E4M3; backward tensors E5M2 (§2.1).
  if (f == Fp8Format::kHybrid && pass == ScalingPass::kBackward) return DType::kE5M2;
  return DType::kE4M3;
}

namespace {

void require_cpu(const Tensor& t, const char* what) {
  if (t.device().is_cuda()) {
    throw_internal(__FILE__, __LINE__,
                   fmt::format("DelayedScalingState::{}: updating a state that lives on the GPU "
                               "is not implemented yet; keep the state on the CPU",
                               what));
  }
}

}  // namespace

DelayedScalingState::DelayedScalingState(const DelayedScalingConfig& cfg, ScalingPass pass,
                                         int num_slots, Device dev)
    : cfg_(cfg), pass_(pass), dtype_(fp8_format_dtype(cfg.format, pass)), num_slots_(num_slots) {
  LOWBIT_USER_CHECK(num_slots >= 1, "delayed scaling: need at least one slot, got {}", num_slots);
  LOWBIT_USER_CHECK(cfg.history_len >= 1,
                    "delayed scaling: amax history length must be >= 1, got {}", cfg.history_len);
  LOWBIT_USER_CHECK(cfg.margin >= 0 && cfg.margin <= 126,
                    "delayed scaling: margin must be in [0, 126], got {}", cfg.margin);
  LOWBIT_USER_CHECK(cfg.update_interval >= 1,
                    "delayed scaling: update interval must be >= 1, got {}", cfg.update_interval);
  // Initial state (§2.2): history zeros, scale 1 (so scale_inv 1).
  Tensor history = Tensor::zeros({cfg.history_len, num_slots}, DType::kF32, Device::cpu());
  Tensor scale = Tensor::empty({num_slots}, DType::kF32, Device::cpu());
  for (int s = 0; s < num_slots; ++s) scale.ptr<float>()[s] = 1.0f;
  if (dev.is_cpu()) {
    history_ = history;
    scale_ = scale;
    scale_inv_ = Tensor::copy_of(scale, dev);
  } else {
    history_ = Tensor::copy_of(history, dev);
    scale_ = Tensor::copy_of(scale, dev);
    scale_inv_ = Tensor::copy_of(scale, dev);
  }
}

float DelayedScalingState::fmax() const { return dtype_max_finite(dtype_); }

float DelayedScalingState::scale_at(int slot) const {
  require_cpu(scale_, "scale_at");
  LOWBIT_CHECK(slot >= 0 && slot < num_slots_, "slot {} of {}", slot, num_slots_);
  return scale_.ptr<const float>()[slot];
}

float DelayedScalingState::history_at(int64_t row, int slot) const {
  require_cpu(history_, "history_at");
  LOWBIT_CHECK(row >= 0 && row < cfg_.history_len && slot >= 0 && slot < num_slots_,
               "history entry ({}, {}) of [{}, {}]", row, slot, cfg_.history_len, num_slots_);
  return history_.ptr<const float>()[row * num_slots_ + slot];
}

void DelayedScalingState::record_amax(int slot, float amax) {
  require_cpu(history_, "record_amax");
  LOWBIT_CHECK(slot >= 0 && slot < num_slots_, "slot {} of {}", slot, num_slots_);
  float& h0 = history_.ptr<float>()[slot];  // row 0: max over this step's quantizations
  h0 = fmax_num(h0, amax);
}

void DelayedScalingState::reduce_amax(const ReduceFn& fn) {
  if (!fn) return;  // one rank: nothing to reduce
  // Row 0 of the row-major [L, n] history is contiguous: the concatenated amax buffer.
  fn(TensorView(history_.data(), DType::kF32, {num_slots_}, history_.device()));
}

void DelayedScalingState::update() {
  require_cpu(history_, "update");
  ++update_calls_;
  // Between updates the current amaxes keep accumulating in row 0.
  if (update_calls_ % cfg_.update_interval != 0) return;
  const int64_t len = cfg_.history_len;
  const int n = num_slots_;
  const float scaled_max = delayed_scaled_max(fmax(), cfg_.margin);
  float* h = history_.ptr<float>();  // [L, n] f32
  float* sc = scale_.ptr<float>();
  float* sc_inv = scale_inv_.ptr<float>();
  for (int s = 0; s < n; ++s) {
    // The row-0 amax is already reduced in place (reduce_amax), so `last` is the reduced amax.
    const float last = h[s];
    float a_max = 0.0f;
    // Bulk-kernel semantics: a slot whose amax is 0 (not used this step on any rank) is not
    // rotated, and a_max stays 0 so its scale is kept. NaN != 0, so a NaN amax rotates.
    if (last != 0.0f) {
      // Roll left: H'[i] = H[i+1] (1 ≤ i ≤ L-2), H'[L-1] = last, H'[0] = 0; the max runs over
      // the window including `last`, before the roll, with fmaxf (NaN entries skipped).
      for (int64_t i = 0; i < len; ++i) {
        const float a = i < len - 1 ? h[(i + 1) * n + s] : last;
        a_max = fmax_num(a_max, a);
        h[i * n + s] = i > 0 ? a : 0.0f;
      }
    }
    const float a = cfg_.algo == AmaxComputeAlgo::kMax ? a_max : last;
    const float scale = delayed_scale_from_amax(a, scaled_max, sc[s]);
    sc[s] = scale;
    sc_inv[s] = scale_inv_from_scale(scale);
  }
}

}  // namespace lowbit

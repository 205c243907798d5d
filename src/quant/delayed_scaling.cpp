// FP8 delayed scaling: amax histories and scale updates (formats.md §2.2), CPU twin.
#include "lowbit/quant.h"
#include "lowbit/quant/scale_math.h"
#include "quant/quant_cuda.h"

namespace lowbit {

DType fp8_format_dtype(Fp8Format f, ScalingPass pass) {
  LOWBIT_USER_CHECK(f != Fp8Format::kE5M2,
                    "pure E5M2 training is not supported; use the E4M3 or HYBRID format");
  // HYBRID: forward tensors (inputs, weights, outputs) E4M3; backward tensors E5M2 (§2.1).
  if (f == Fp8Format::kHybrid && pass == ScalingPass::kBackward) return DType::kE5M2;
  return DType::kE4M3;
}

namespace {

// One f32 element of a CPU or GPU tensor (a GPU read synchronises; for inspection and tests).
float read_f32(const Tensor& t, int64_t idx) {
  if (t.device().is_cpu()) return t.ptr<const float>()[idx];
  float v = 0.0f;
  copy_tensor(TensorView(&v, DType::kF32, {1}, Device::cpu()),
              TensorView(t.ptr<float>() + idx, DType::kF32, {1}, t.device()));
  return v;
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
  LOWBIT_CHECK(slot >= 0 && slot < num_slots_, "slot {} of {}", slot, num_slots_);
  return read_f32(scale_, slot);
}

float DelayedScalingState::history_at(int64_t row, int slot) const {
  LOWBIT_CHECK(row >= 0 && row < cfg_.history_len && slot >= 0 && slot < num_slots_,
               "history entry ({}, {}) of [{}, {}]", row, slot, cfg_.history_len, num_slots_);
  return read_f32(history_, row * num_slots_ + slot);
}

void DelayedScalingState::record_amax(int slot, float amax, Context* ctx) {
  LOWBIT_CHECK(slot >= 0 && slot < num_slots_, "slot {} of {}", slot, num_slots_);
  if (history_.device().is_cuda()) {
    quant_cuda::delayed_record_amax(history_.ptr<float>() + slot, amax,
                                    ctx != nullptr ? ctx->stream() : nullptr);
    if (ctx == nullptr) quant_cuda::device_synchronize();
    return;
  }
  float& h0 = history_.ptr<float>()[slot];  // row 0: max over this step's quantizations
  h0 = fmax_num(h0, amax);
}

void DelayedScalingState::reduce_amax(const ReduceFn& fn) {
  if (!fn) return;  // one rank: nothing to reduce
  // Row 0 of the row-major [L, n] history is contiguous: the concatenated amax buffer.
  fn(TensorView(history_.data(), DType::kF32, {num_slots_}, history_.device()));
}

void DelayedScalingState::update(Context* ctx) {
  ++update_calls_;
  // Between updates the current amaxes keep accumulating in row 0.
  if (update_calls_ % cfg_.update_interval != 0) return;
  const float scaled_max = delayed_scaled_max(fmax(), cfg_.margin);
  const bool algo_max = cfg_.algo == AmaxComputeAlgo::kMax;
  if (history_.device().is_cuda()) {
    // The row-0 amaxes are already reduced in place (reduce_amax).
    if (ctx == nullptr) quant_cuda::device_synchronize();
    quant_cuda::delayed_update(history_.ptr<float>(), cfg_.history_len, num_slots_, algo_max,
                               scaled_max, scale_.ptr<float>(), scale_inv_.ptr<float>(),
                               ctx != nullptr ? ctx->stream() : nullptr);
    if (ctx == nullptr) quant_cuda::device_synchronize();
    return;
  }
  for (int s = 0; s < num_slots_; ++s) {
    delayed_update_slot(history_.ptr<float>(), cfg_.history_len, num_slots_, s, algo_max,
                        scaled_max, scale_.ptr<float>(), scale_inv_.ptr<float>());
  }
}

}  // namespace lowbit

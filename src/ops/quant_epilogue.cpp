// Host side of the fused FP8 epilogues (quant_epilogue.h).
#include "ops/quant_epilogue.h"

namespace lowbit::ops_detail {

bool fp8_delayed_fusable(const QuantConfig& cfg, Device dev) {
  if (cfg.mode != ScalingMode::kPerTensor || cfg.delayed == nullptr) return false;
  if (cfg.dtype != DType::kE4M3 && cfg.dtype != DType::kE5M2) return false;
  if (!cfg.rowwise && !cfg.columnwise) return false;
  // The GPU quantize() has no stochastic rounding for per-tensor FP8: let it say so.
  if (cfg.stochastic_rounding || cfg.effective_pow2() || cfg.amax_epsilon != 0.0f) return false;
  const DelayedScalingState& st = *cfg.delayed;
  if (cfg.delayed_slot < 0 || cfg.delayed_slot >= st.num_slots()) return false;
  if (st.dtype() != cfg.dtype) return false;
  return st.scale().device() == dev && st.amax_history().device() == dev;
}

Fp8Epilogue fp8_epilogue_outputs(Context& ctx, const QuantConfig& cfg, int64_t m, int64_t k,
                                 QuantizedTensor& out) {
  const Device dev = ctx.device();
  out = QuantizedTensor{};
  out.mode = cfg.mode;
  out.dtype = cfg.dtype;
  out.shape = Shape{m, k};
  Fp8Epilogue ep;
  ep.scale = cfg.delayed->scale().ptr<const float>() + cfg.delayed_slot;
  ep.e5m2 = cfg.dtype == DType::kE5M2;
  // Row 0 of the [L, num_slots] history is the current step's amax of every slot.
  ep.history_amax = cfg.delayed->amax_history().ptr<float>() + cfg.delayed_slot;
  out.amax = Tensor::empty({1}, DType::kF32, dev, MemCategory::kWorkspace);  // [1]
  fill_bytes_on(out.amax, 0, ctx.stream());  // the blocks' atomic max starts from 0
  ep.amax = out.amax.ptr<float>();
  if (cfg.rowwise) {
    const QuantLayout l = quant_layout(cfg.mode, cfg.dtype, m, k, Usage::kRowwise);
    out.rowwise_data = Tensor::empty(l.data_shape, l.data_dtype, dev, MemCategory::kActivations);
    out.rowwise_scale_inv =
        Tensor::empty(l.scale_shape, l.scale_dtype, dev, MemCategory::kWorkspace);  // [1]
    ep.q = out.rowwise_data.ptr<uint8_t>();
    ep.q_scale_inv = out.rowwise_scale_inv.ptr<float>();
  }
  if (cfg.columnwise) {
    const QuantLayout l = quant_layout(cfg.mode, cfg.dtype, m, k, Usage::kColumnwise);  // [K, M]
    out.columnwise_data = Tensor::empty(l.data_shape, l.data_dtype, dev, MemCategory::kActivations);
    out.columnwise_scale_inv =
        Tensor::empty(l.scale_shape, l.scale_dtype, dev, MemCategory::kWorkspace);  // [1]
    ep.qt = out.columnwise_data.ptr<uint8_t>();
    ep.qt_scale_inv = out.columnwise_scale_inv.ptr<float>();
  }
  return ep;
}

}  // namespace lowbit::ops_detail

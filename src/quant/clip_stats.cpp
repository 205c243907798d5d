// quant_clip_stats(): validation and dispatch to the CPU twin or the CUDA kernel.
#include "lowbit/quant.h"
#include "quant/clip_stats_impl.h"

namespace lowbit {

void quant_clip_stats_ref(const TensorView& x, const ClipStatsView& v, int64_t counts[2]);
void quant_clip_stats_cuda(Context& ctx, const TensorView& x, const ClipStatsView& v,
                           const TensorView& counts);

void quant_clip_stats(Context& ctx, const TensorView& x, const QuantizedTensor& q,
                      const TensorView& counts) {
  LOWBIT_USER_CHECK(q.has_rowwise(), "quant_clip_stats needs the rowwise copy of {}", q.str());
  LOWBIT_USER_CHECK(x.ndim() == 2 && x.shape[0] == q.shape[0] && x.shape[1] == q.shape[1],
                    "quant_clip_stats: source {} does not match the quantized tensor {}", x.str(),
                    q.str());
  LOWBIT_USER_CHECK(x.dtype == DType::kBF16 || x.dtype == DType::kF32,
                    "quant_clip_stats: source must be bf16 or f32, got {}", x.str());
  LOWBIT_USER_CHECK(x.is_contiguous(), "quant_clip_stats: source must be contiguous ({})", x.str());
  LOWBIT_USER_CHECK(counts.dtype == DType::kI64 && counts.numel() == 2 && counts.is_contiguous(),
                    "quant_clip_stats: counts must be a contiguous [2] int64 tensor, got {}",
                    counts.str());
  LOWBIT_USER_CHECK(x.device == q.rowwise_data.device() && counts.device == x.device,
                    "quant_clip_stats: source, quantized tensor and counts must share a device");
  const bool nvfp4 = q.mode == ScalingMode::kNVFP4_1x16 || q.mode == ScalingMode::kNVFP4_16x16;
  LOWBIT_USER_CHECK(!nvfp4 || q.amax.defined(), "quant_clip_stats: {} has no global amax", q.str());
  ClipStatsView v;
  v.mode = q.mode;
  v.dtype = q.dtype;
  v.m = q.shape[0];
  v.k = q.shape[1];
  v.codes = q.rowwise_data.ptr<const uint8_t>();
  v.scale = q.rowwise_scale_inv.data();
  v.amax = nvfp4 ? q.amax.ptr<const float>() : nullptr;
  if (x.device.is_cuda()) {
    quant_clip_stats_cuda(ctx, x, v, counts);
  } else {
    quant_clip_stats_ref(x, v, static_cast<int64_t*>(counts.data));
  }
}

}  // namespace lowbit

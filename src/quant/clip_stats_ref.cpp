// CPU twin of quant_clip_stats().
#include "lowbit/core.h"
#include "quant/clip_stats_impl.h"

namespace lowbit {

void quant_clip_stats_ref(const TensorView& x, const ClipStatsView& v, int64_t counts[2]) {
  const bool bf16 = x.dtype == DType::kBF16;
  for (int64_t r = 0; r < v.m; ++r) {
    uint32_t saturated = 0, underflow = 0;  // per row: at most K each
    for (int64_t c = 0; c < v.k; ++c) {
      const int64_t i = r * v.k + c;
      const float xv = bf16 ? bf16_to_f32(static_cast<const uint16_t*>(x.data)[i])
                            : static_cast<const float*>(x.data)[i];
      clip_stats_classify(v, r, c, xv, saturated, underflow);
    }
    counts[0] += saturated;
    counts[1] += underflow;
  }
}

}  // namespace lowbit

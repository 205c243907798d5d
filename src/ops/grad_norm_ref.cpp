// CPU twin of segment_norms and clip_coefficient: the definition of the two ops. Sums are fp64
// in index order (exact squares of fp32 values, one rounding per addition); a square root in fp64
// (correctly rounded) is rounded once to fp32.
#include <cmath>
#include <cstdint>

#include "lowbit/formats.h"
#include "ops/grad_norm_impl.h"

namespace lowbit::ops_detail {

void segment_norms_cpu(const TensorView& seg_norms, const TensorView& grad,
                       const std::vector<ParamSegment>& segments) {
  const float* g = grad.ptr<const float>();  // [P]
  float* out = seg_norms.ptr<float>();       // [S]
  for (size_t s = 0; s < segments.size(); ++s) {
    double acc = 0.0;
    const int64_t end = segments[s].offset + segments[s].numel;
    for (int64_t i = segments[s].offset; i < end; ++i) {
      const double x = g[i];
      acc += x * x;  // exact: the square of an fp32 value fits in fp64
    }
    out[s] = static_cast<float>(std::sqrt(acc));
  }
}

void clip_coefficient_cpu(const TensorView& norm, const TensorView& coef, const TensorView& skip,
                          const TensorView& seg_norms, float max_norm) {
  const float* ss = seg_norms.ptr<const float>();  // [S]
  double total = 0.0;
  for (int64_t s = 0; s < seg_norms.numel(); ++s) total += double(ss[s]) * ss[s];  // exact squares
  const float n = static_cast<float>(std::sqrt(total));
  const bool bad = !f32_is_finite(n);
  norm.ptr<float>()[0] = n;
  skip.ptr<int32_t>()[0] = bad ? 1 : 0;
  coef.ptr<float>()[0] = clip_coef_of(n, max_norm, bad);
}

}  // namespace lowbit::ops_detail

// CPU twin of adamw_step: the definition of the op. A plain loop over every segment applying
// adamw_update (adamw_impl.h) element by element. This file is compiled with -ffp-contract=off
// (CMakeLists.txt) so that no multiply-add is fused and the CUDA kernel matches bit for bit.
#include <cstdint>

#include "lowbit/formats.h"
#include "ops/adamw_impl.h"

namespace lowbit::ops_detail {

void adamw_step_cpu(const TensorView& master, const TensorView& grad, const TensorView& m,
                    const TensorView& v, const TensorView* compute,
                    const std::vector<ParamSegment>& segments, const AdamWScalars& s,
                    const TensorView& grad_scale, const TensorView& skip) {
  if (skip.ptr<const int32_t>()[0] != 0) return;  // NaN guard: the step leaves everything as is
  const float scale = grad_scale.ptr<const float>()[0];
  float* p = master.ptr<float>();                              // [P]
  const float* g = grad.ptr<const float>();                    // [P]
  float* mm = m.ptr<float>();                                  // [P]
  float* vv = v.ptr<float>();                                  // [P]
  uint16_t* c = compute ? compute->ptr<uint16_t>() : nullptr;  // [Pc] bf16
  for (const ParamSegment& seg : segments) {
    const int64_t end = seg.offset + seg.numel;
    uint16_t* cs = c && seg.has_compute() ? c + (seg.compute_begin() - seg.offset) : nullptr;
    for (int64_t i = seg.offset; i < end; ++i) {
      adamw_update(p[i], mm[i], vv[i], g[i], scale, seg.weight_decay, s);
      if (cs) cs[i] = f32_to_bf16_rn(p[i]);
    }
  }
}

}  // namespace lowbit::ops_detail

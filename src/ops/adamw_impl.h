// Private to the ops layer: the two implementations behind adamw_step (include/lowbit/ops.h) and
// the per-element update they share. Arguments have been validated by the dispatcher
// (adamw.cpp).
//
// The update follows torch.optim.AdamW (decoupled weight decay, the single-tensor
// implementation, amsgrad off), step t:
//   param.mul_(1 − lr·wd)                                     (only when wd ≠ 0)
//   exp_avg.lerp_(grad, 1 − β1)
//   exp_avg_sq.mul_(β2).addcmul_(grad, grad, value = 1 − β2)
//   denom = (exp_avg_sq.sqrt() / sqrt(1 − β2ᵗ)).add_(eps)
//   param.addcdiv_(exp_avg, denom, value = −lr / (1 − β1ᵗ))
// The scalars are computed in fp64 on the host and rounded once to fp32 (PyTorch computes them
// as Python floats and its fp32 kernels round them once). Per element, in this order, each step
// one fp32 RN operation (fma: one rounding of the exact a·b + c):
//   g  = grad · grad_scale
//   p  = p · decay                        decay = RN(1 − lr·wd), 1 for exempt segments
//   m  = fma(w1, g − m, m)                w1 = RN(1 − β1) (torch.lerp for a weight < 0.5;
//        fma(w1 − 1, g − m, g)            for a weight ≥ 0.5)
//   v  = fma(w2 · g, g, v · β2)           w2 = RN(1 − β2)
//   d  = (sqrt(v) / c2) + eps             c2 = RN(sqrt(1 − β2ᵗ))
//   p  = p + ((s1 · m) / d)               s1 = RN(−lr / (1 − β1ᵗ))
//   compute = bf16_rn(p)
// This is what PyTorch's vectorised CPU kernels compute (lerp is an fmadd; addcmul's
// `self + value · t1 · t2` is contracted into one; addcdiv is `self + value · t1 / t2`): over
// 1.5M elements × 5 steps, torch 2.11's AdamW(foreach=False) on an x86 CPU gave the same bits
// for m and v everywhere and for p except in 34 elements of its scalar tail loop. (Its CUDA
// kernels, contracted differently by their compiler, differ from this by an ulp in v for most
// elements and in p for ~0.1% of them.) Both twins evaluate the sequence exactly: the CPU
// twin with std::fma and -ffp-contract=off, the kernel with `__f*_rn` intrinsics, so they agree
// bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/core/hd.h"
#include "lowbit/ops.h"
#include "lowbit/quant/rn_ops.h"

namespace lowbit::ops_detail {

// The step's fp32 scalars (see above).
struct AdamWScalars {
  float decay = 1.0f;       // RN(1 − lr·wd), for segments with weight decay
  float w1 = 0.1f;          // RN(1 − β1), the lerp weight
  float beta2 = 0.95f;      // β2
  float w2 = 0.05f;         // RN(1 − β2)
  float c2 = 1.0f;          // RN(sqrt(1 − β2ᵗ))
  float neg_step = -3e-4f;  // RN(−lr / (1 − β1ᵗ))
  float eps = 1e-8f;        // eps
};

inline AdamWScalars adamw_scalars(const AdamWConfig& cfg) {
  const double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, wd = cfg.weight_decay;
  const double t = static_cast<double>(cfg.step);
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - lr * wd);
  s.w1 = static_cast<float>(1.0 - b1);
  s.beta2 = cfg.beta2;
  s.w2 = static_cast<float>(1.0 - b2);
  s.c2 = static_cast<float>(std::sqrt(1.0 - std::pow(b2, t)));
  s.neg_step = static_cast<float>(-(lr / (1.0 - std::pow(b1, t))));
  s.eps = cfg.eps;
  return s;
}

// One element of the step: p, m, v updated in place from the raw gradient `grad` and the grad
// scale; `decay` selects the weight decay of the element's segment.
LOWBIT_HD void adamw_update(float& p, float& m, float& v, float grad, float grad_scale, bool decay,
                            const AdamWScalars& s) {
  const float g = mul_rn(grad, grad_scale);
  if (decay) p = mul_rn(p, s.decay);
  if (abs_f32(s.w1) < 0.5f) {  // torch.lerp: interpolate from the nearer end
    m = fma_rn(s.w1, sub_rn(g, m), m);
  } else {
    m = fma_rn(sub_rn(s.w1, 1.0f), sub_rn(g, m), g);
  }
  v = fma_rn(mul_rn(s.w2, g), g, mul_rn(v, s.beta2));
  const float d = add_rn(div_rn(sqrt_rn(v), s.c2), s.eps);
  p = add_rn(p, div_rn(mul_rn(s.neg_step, m), d));
}

// ---- CPU twin (adamw_ref.cpp) ---------------------------------------------------------------
// master, grad, m, v [P] f32; compute [P] bf16 or null; grad_scale [1] f32; skip [1] i32 (host).
void adamw_step_cpu(const TensorView& master, const TensorView& grad, const TensorView& m,
                    const TensorView& v, const TensorView* compute,
                    const std::vector<ParamSegment>& segments, const AdamWScalars& s,
                    const TensorView& grad_scale, const TensorView& skip);

// ---- CUDA (adamw.cu) ------------------------------------------------------------------------
// One launch per SegmentBlocks group (grad_norm_impl.h): blocks mapped to (segment, chunk),
// float4 accesses when every buffer is 16-byte aligned (compute 8-byte), on ctx.stream();
// grad_scale and skip are read on the device.
void adamw_step_cuda(Context& ctx, const TensorView& master, const TensorView& grad,
                     const TensorView& m, const TensorView& v, const TensorView* compute,
                     const std::vector<ParamSegment>& segments, const AdamWScalars& s,
                     const TensorView& grad_scale, const TensorView& skip);

}  // namespace lowbit::ops_detail

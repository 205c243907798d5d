// Private to the ops layer: the two implementations behind swiglu_fwd / swiglu_bwd
// (include/lowbit/ops.h) and the per-element math both use. Arguments have been validated by the
// dispatcher (swiglu.cpp).
#pragma once

#include <cmath>

#include "lowbit/core.h"
#include "lowbit/core/hd.h"
#include "lowbit/quant.h"

namespace lowbit::ops_detail {

// Per element, in fp32 with every operation rounded separately (RN, no FMA). Only exp differs
// between the twins, so CPU and GPU agree to a few fp32 ulps before the final rounding to bf16.
// The GPU's exp(−g) is the hardware 2^x of −g·log2(e) (relative error ≤ 2^-22 plus the rounding
// of the product, |g|·2^-24: under 2^-17 for |g| ≤ 88, where exp(−g) is finite and normal —
// some 2^9 times below a bf16 ulp), and 1 / (1 + e) a correctly rounded reciprocal: the op is
// bound by instruction issue, and these are 3 instructions where expf and an IEEE division are
// some 20.
//   s = 1 / (1 + exp(−g)),  silu = g · s,  out = silu · u;
//   backward: dsilu = s · (1 + g · (1 − s)),  dg = (dout · u) · dsilu,  du = dout · silu.
struct SwigluGrad {
  float dg, du;
};

LOWBIT_HD float swiglu_sigmoid(float g) {
#if defined(__CUDA_ARCH__)
  // exp(−g) = 2^(−g·log2 e); ±inf and NaN behave as expf's: 2^+inf = inf (s = 0), 2^−inf = 0.
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(-g, 1.4426950408889634f)));
  return __frcp_rn(__fadd_rn(1.0f, e));
#else
  return 1.0f / (1.0f + std::exp(-g));
#endif
}

// The two ops from a sigmoid s = swiglu_sigmoid(g) computed once (the fused backward that also
// remakes h): the same operations, so the same bits, as swiglu_out and swiglu_grad.
LOWBIT_HD float swiglu_out_from_sigmoid(float g, float u, float s) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__fmul_rn(g, s), u);
#else
  const float silu = g * s;
  return silu * u;
#endif
}

LOWBIT_HD SwigluGrad swiglu_grad_from_sigmoid(float g, float u, float dout, float s) {
#if defined(__CUDA_ARCH__)
  const float silu = __fmul_rn(g, s);
  const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
  return {__fmul_rn(__fmul_rn(dout, u), dsilu), __fmul_rn(dout, silu)};
#else
  const float silu = g * s;
  const float one_minus_s = 1.0f - s;
  const float g_oms = g * one_minus_s;
  const float dsilu = s * (1.0f + g_oms);
  const float dout_u = dout * u;
  return {dout_u * dsilu, dout * silu};
#endif
}

LOWBIT_HD float swiglu_out(float g, float u) {
  return swiglu_out_from_sigmoid(g, u, swiglu_sigmoid(g));
}

LOWBIT_HD SwigluGrad swiglu_grad(float g, float u, float dout) {
  return swiglu_grad_from_sigmoid(g, u, dout, swiglu_sigmoid(g));
}

// CPU twin (swiglu_ref.cpp): gate_up [N, 2F], out/dout [N, F], dgate_up [N, 2F], bf16|f32.
void swiglu_fwd_cpu(const TensorView& out, const TensorView& gate_up);
void swiglu_bwd_cpu(const TensorView& dgate_up, const TensorView& dout, const TensorView& gate_up);
// swiglu_fwd_quantize by definition, on any device: swiglu_fwd into h (a scratch when h is
// absent), then quantize(h) (swiglu_ref.cpp).
void swiglu_fwd_quantize_composed(Context& ctx, const TensorView& h, const TensorView& gate_up,
                                  const QuantConfig& cfg, QuantizedTensor& out);
// CUDA (swiglu.cu), bf16, on ctx.stream().
void swiglu_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& gate_up);
// Fused forward + per-tensor FP8 with delayed scaling (cfg passed fp8_delayed_fusable; h may be
// absent): the bytes of the composition on the GPU. Returns false, having done nothing, when
// F % 8 != 0 or the rows are not 16-byte aligned.
bool swiglu_fwd_quantize_cuda(Context& ctx, const TensorView& h, const TensorView& gate_up,
                              const QuantConfig& cfg, QuantizedTensor& out);
void swiglu_bwd_cuda(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                     const TensorView& gate_up);
// swiglu_bwd_quantize by definition, on any device: swiglu_bwd into dgate_up (a scratch when
// absent), then quantize(dgate_up) (swiglu_ref.cpp).
void swiglu_bwd_quantize_composed(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                                  const TensorView& gate_up, const QuantConfig& cfg,
                                  QuantizedTensor& out);
// Fused backward + per-tensor FP8 with delayed scaling (cfg passed fp8_delayed_fusable;
// dgate_up may be absent): the bytes of the composition on the GPU. With h_cfg (which passed
// fp8_delayed_fusable too) the kernel also writes swiglu_fwd_quantize's bytes for h into h_out.
// Returns false, having done nothing, when F % 8 != 0, the rows are not 16-byte aligned, or
// h_cfg asks for no columnwise copy.
bool swiglu_bwd_quantize_cuda(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                              const TensorView& gate_up, const QuantConfig& cfg,
                              QuantizedTensor& out, const QuantConfig* h_cfg = nullptr,
                              QuantizedTensor* h_out = nullptr);

}  // namespace lowbit::ops_detail

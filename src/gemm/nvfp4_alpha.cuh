// The NVFP4 alpha fold on the device (formats.md §2.6), shared by the emulated GEMM's
// dequantization launches (dequant_bf16.cu, fused_dequant_gemm.cu).
#pragma once

#include "gemm/gemm_cuda_kernels.h"
#include "lowbit/quant/rn_ops.h"

namespace lowbit::gemm_kernels {

// al.out[0] = alpha' = RN(...RN(RN(alpha · amax_a) · amax_b) · RN(1 / 2688^n)) over the NVFP4
// operands present (n non-null amax pointers), al.out[1] = beta.
__device__ inline void write_nvfp4_alpha(const Nvfp4Alpha& al) {
  float a = al.alpha;
  float inv = 1.0f;
  if (al.amax_a != nullptr) a = mul_rn(a, *al.amax_a);
  if (al.amax_b != nullptr) a = mul_rn(a, *al.amax_b);
  if (al.amax_a != nullptr && al.amax_b != nullptr) {
    inv = __frcp_rn(7225344.0f);  // RN(1 / (6·6·448·448))
  } else if (al.amax_a != nullptr || al.amax_b != nullptr) {
    inv = __frcp_rn(2688.0f);  // RN(1 / (6·448))
  }
  al.out[0] = (al.amax_a != nullptr || al.amax_b != nullptr) ? mul_rn(a, inv) : a;
  al.out[1] = al.beta;
}

}  // namespace lowbit::gemm_kernels

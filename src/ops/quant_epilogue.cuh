// Device side of the fused FP8 epilogues (rmsnorm_fwd_quantize, swiglu_fwd_quantize): the
// per-tensor cast, the transposed store of a tile of codes staged in shared memory, and the amax
// fold. The conversions are those of the quantize kernels (src/quant/fp8_kernels.cu,
// quant/cuda_common.cuh), so the bytes are the ones quantize() writes for the same source.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops_cuda.cuh"
#include "ops/quant_epilogue.h"
#include "quant/cuda_common.cuh"

namespace lowbit::ops_cuda {

// Eight values (fp32 images of bf16 values) → eight FP8 codes cvt_sat(v · scale), element i in
// byte i (little-endian): quantize_element(t, v, scale) without stochastic rounding.
__device__ __forceinline__ uint2 fp8_codes8(const float v[8], float scale, bool e5m2) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = quant_cuda::cvt_fp8x2(mul_rn(v[2 * i], scale), mul_rn(v[2 * i + 1], scale), e5m2);
  }
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

// One 8-element chunk of a fused epilogue. `v` are the op's fp32 results; each is rounded to
// bf16 exactly as the unfused op stores it, and quantize() reads that bf16 value: it goes into
// `amax`, to `out` (16-byte aligned, or null when the bf16 output is not asked for), and its
// codes to `q` (8-byte aligned, or null) and, when kCol, to the staged tile at `tile_at` (4-byte
// aligned: tile rows are padded to a pitch ≡ 4 mod 8).
template <bool kCol>
__device__ __forceinline__ void fp8_epilogue_chunk8(const float (&v)[8], float scale, bool e5m2,
                                                    uint16_t* out, uint8_t* q, uint8_t* tile_at,
                                                    float& amax) {
  uint32_t packed[4];  // the bf16 pairs, element 2i in the low half
  float image[8];      // the fp32 value of each rounded element
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    packed[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
    image[2 * i] = __uint_as_float(packed[i] << 16);
    image[2 * i + 1] = __uint_as_float(packed[i] & 0xFFFF0000u);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = amax_combine(amax, image[i]);
  if (out != nullptr) {
    *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  const uint2 codes = fp8_codes8(image, scale, e5m2);
  if (q != nullptr) *reinterpret_cast<uint2*>(q) = codes;
  if constexpr (kCol) {
    reinterpret_cast<uint32_t*>(tile_at)[0] = codes.x;
    reinterpret_cast<uint32_t*>(tile_at)[1] = codes.y;
  }
}

// store_transposed (the columnwise store of a staged tile of codes) lives with the quantize
// kernels in quant/cuda_common.cuh, which write their transposed copies the same way.
using quant_cuda::store_transposed;

// The block's amax folded into ep.amax and into the state's history entry (max is associative,
// so per-block atomics give max(history, amax of the tensor) exactly as quantize() records it),
// and scale_inv written once by block 0. Every thread of the block must call it.
__device__ __forceinline__ void fp8_epilogue_finish(float local_amax, float scale,
                                                    const ops_detail::Fp8Epilogue& ep) {
  __shared__ float warp_amax[32];
  local_amax = quant_cuda::warp_max(local_amax);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the tile / scratch of the caller may still be in use
  if (lane == 0) warp_amax[warp] = local_amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.0f;
    for (int i = 0; i < int((blockDim.x + 31) / 32); ++i) a = fmax_num(a, warp_amax[i]);
    // Amaxes are non-negative and never NaN (amax_combine skips NaN): bit order = value order.
    quant_cuda::atomic_max_nonneg(ep.amax, a);
    quant_cuda::atomic_max_nonneg(ep.history_amax, a);
    if (blockIdx.x == 0 && blockIdx.y == 0) {
      const float si = scale_inv_from_scale(scale);
      if (ep.q_scale_inv != nullptr) *ep.q_scale_inv = si;
      if (ep.qt_scale_inv != nullptr) *ep.qt_scale_inv = si;
    }
  }
}

}  // namespace lowbit::ops_cuda

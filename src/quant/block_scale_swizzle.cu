// The Blackwell block-scale swizzle on the device (formats.md §4.6): compact one-byte scales
// [R, C] (r = operand row, c = K-block) → [pad128(R), pad4(C)] in the 128×4-tile order of
// swizzled_scale_offset(), padding zero. The CPU twin is swizzle_block_scales' host loop
// (quantized_tensor.cpp); cuBLASLt's VEC32_UE8M0 / VEC16_UE4M3 modes read this layout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "lowbit/core/cuda_check.h"
#include "lowbit/quant/layout.h"
#include "quant/quant_cuda.h"

namespace lowbit::quant_cuda {
namespace {

// One thread per element of the padded grid (reads coalesced along c; the writes scatter in
// 16-byte rows of 512-byte tiles, which is cheap at one byte per 16 or 32 payload elements).
__global__ void swizzle_scales_kernel(const uint8_t* __restrict__ src, int64_t R, int64_t C,
                                      uint8_t* __restrict__ dst, int64_t r_pad, int64_t c_pad) {
  const int64_t n = r_pad * c_pad;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / c_pad, c = i % c_pad;
    dst[swizzled_scale_offset(r, c, c_pad)] = (r < R && c < C) ? src[r * C + c] : uint8_t{0};
  }
}

}  // namespace

void swizzle_block_scales(const uint8_t* compact, int64_t R, int64_t C, uint8_t* out,
                          cudaStream_t stream) {
  if (R <= 0 || C <= 0) return;
  const int64_t r_pad = pad128(R), c_pad = pad4(C);
  const int64_t blocks = std::clamp<int64_t>((r_pad * c_pad + 255) / 256, 1, 8192);
  swizzle_scales_kernel<<<unsigned(blocks), 256, 0, stream>>>(compact, R, C, out, r_pad, c_pad);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::quant_cuda

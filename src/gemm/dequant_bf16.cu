// CUDA kernels of the gemm layer: exact MX / NVFP4 → bf16 dequantization for the emulated
// BF16 path on Hopper, the NVFP4 alpha fold (formats.md §2.6), the bias add and the wait that
// precedes the timed calls of algorithm selection.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gemm/gemm_cuda_kernels.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/formats.h"
#include "lowbit/quant/rn_ops.h"

namespace lowbit::gemm_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements per thread and step (one 16-byte bf16 store)

__device__ __forceinline__ float scale_value(const uint8_t* scales, DequantScales layout, int64_t r,
                                             int64_t c, int64_t cols) {
  switch (layout) {
    case DequantScales::kMxRowwise: return decode_e8m0(scales[r * (cols / 32) + c / 32]);
    case DequantScales::kMxColumnwise: return decode_e8m0(scales[(r / 32) * cols + c]);
    case DequantScales::kNvfp4: return decode(DType::kUE4M3, scales[r * (cols / 16) + c / 16]);
  }
  return 0.0f;
}

__global__ void dequant_kernel(const uint8_t* __restrict__ codes, DType t, int64_t rows,
                               int64_t cols, const uint8_t* __restrict__ scales,
                               DequantScales layout, uint16_t* __restrict__ out) {
  __shared__ float lut[256];
  const bool fp4 = t == DType::kE2M1;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    lut[i] = (!fp4 || i < 16) ? decode(t, static_cast<uint32_t>(i)) : 0.0f;
  }
  __syncthreads();
  const int64_t groups = rows * cols / kVec;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t idx = g * kVec;  // first element; the 8 share a row (cols % 8 == 0)
    const int64_t r = idx / cols, c0 = idx % cols;
    uint32_t code[kVec];
    if (fp4) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(codes + idx / 2);  // 4-byte aligned
#pragma unroll
      for (int i = 0; i < kVec; ++i) code[i] = (w >> (4 * i)) & 0xFu;  // even element low
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(codes + idx);  // 8-byte aligned
#pragma unroll
      for (int i = 0; i < kVec; ++i) code[i] = ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xFFu;
    }
    // A group of 8 lies inside one 16/32-block along the row; the column-wise MX layout has a
    // scale per column, so look each one up.
    uint32_t packed[kVec / 2];
    const float f_row =
        layout == DequantScales::kMxColumnwise ? 0.0f : scale_value(scales, layout, r, c0, cols);
#pragma unroll
    for (int i = 0; i < kVec; i += 2) {
      float f0 = f_row, f1 = f_row;
      if (layout == DequantScales::kMxColumnwise) {
        f0 = scale_value(scales, layout, r, c0 + i, cols);
        f1 = scale_value(scales, layout, r, c0 + i + 1, cols);
      }
      const float v0 = mul_rn(lut[code[i]], f0);
      const float v1 = mul_rn(lut[code[i + 1]], f1);
      const uint32_t b0 = __bfloat16_as_ushort(__float2bfloat16_rn(v0));
      const uint32_t b1 = __bfloat16_as_ushort(__float2bfloat16_rn(v1));
      packed[i / 2] = b0 | (b1 << 16);
    }
    *reinterpret_cast<uint4*>(out + idx) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// The same function over chunks of 16 elements of a row (cols % 16 == 0, fewer than 2^31
// chunks): chunk i holds elements 16i .. 16i + 15 of the row-major array, so its codes, its
// output and (rowwise layouts) its scale follow from i alone — no division except the row of the
// column-wise MX layout. Codes 8 (E2M1) or 16 (FP8) bytes per chunk, output 32 bytes.
template <DequantScales kLayout, bool kFp4>
__global__ void __launch_bounds__(kThreads)
    dequant16_kernel(const uint8_t* __restrict__ codes, DType t, uint32_t chunks,
                     uint32_t chunks_per_row, uint32_t cols, const uint8_t* __restrict__ scales,
                     uint16_t* __restrict__ out) {
  __shared__ float lut[256];
  for (int i = threadIdx.x; i < (kFp4 ? 16 : 256); i += blockDim.x) {
    lut[i] = decode(t, static_cast<uint32_t>(i));
  }
  __syncthreads();
  for (uint32_t ch = blockIdx.x * blockDim.x + threadIdx.x; ch < chunks;
       ch += gridDim.x * blockDim.x) {
    uint32_t code[16];
    if constexpr (kFp4) {
      const uint2 w = *reinterpret_cast<const uint2*>(codes + size_t(ch) * 8);  // even low
#pragma unroll
      for (int i = 0; i < 16; ++i) code[i] = ((i < 8 ? w.x : w.y) >> (4 * (i & 7))) & 0xFu;
    } else {
      const uint4 w = *reinterpret_cast<const uint4*>(codes + size_t(ch) * 16);
      const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 16; ++i) code[i] = (ws[i >> 2] >> (8 * (i & 3))) & 0xFFu;
    }
    float f[16];
    if constexpr (kLayout == DequantScales::kMxColumnwise) {
      // [rows/32, cols]: the 16 columns' scales of this chunk's 32-row group, one 16-byte load.
      const uint32_t r = ch / chunks_per_row, c0 = (ch - r * chunks_per_row) * 16;
      const uint4 sv = *reinterpret_cast<const uint4*>(scales + size_t(r / 32) * cols + c0);
      const uint32_t ss[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = decode_e8m0((ss[i >> 2] >> (8 * (i & 3))) & 0xFFu);
    } else {
      // kNvfp4 [rows, cols/16]: scale index = chunk; kMxRowwise [rows, cols/32]: chunk / 2.
      const float fs = kLayout == DequantScales::kNvfp4 ? decode(DType::kUE4M3, scales[ch])
                                                        : decode_e8m0(scales[ch >> 1]);
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = fs;
    }
    uint32_t packed[8];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      // Exact products (formats.md: a code times its block scale fits bf16), rounded as
      // dequant_kernel rounds them.
      const uint32_t b0 = __bfloat16_as_ushort(__float2bfloat16_rn(mul_rn(lut[code[i]], f[i])));
      const uint32_t b1 =
          __bfloat16_as_ushort(__float2bfloat16_rn(mul_rn(lut[code[i + 1]], f[i + 1])));
      packed[i / 2] = b0 | (b1 << 16);
    }
    uint4* o = reinterpret_cast<uint4*>(out + size_t(ch) * 16);
    o[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    o[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
}

template <DequantScales kLayout>
void launch_dequant16(bool fp4, int grid, cudaStream_t stream, const uint8_t* codes, DType t,
                      uint32_t chunks, uint32_t chunks_per_row, uint32_t cols,
                      const uint8_t* scales, uint16_t* out) {
  auto kernel = fp4 ? dequant16_kernel<kLayout, true> : dequant16_kernel<kLayout, false>;
  kernel<<<grid, kThreads, 0, stream>>>(codes, t, chunks, chunks_per_row, cols, scales, out);
}

__global__ void nvfp4_alpha_kernel(float alpha, float beta, const float* amax_a,
                                   const float* amax_b, float* out) {
  float a = alpha;
  float inv = 1.0f;
  if (amax_a != nullptr) a = mul_rn(a, *amax_a);
  if (amax_b != nullptr) a = mul_rn(a, *amax_b);
  if (amax_a != nullptr && amax_b != nullptr) {
    inv = __frcp_rn(7225344.0f);  // RN(1 / (6·6·448·448))
  } else if (amax_a != nullptr || amax_b != nullptr) {
    inv = __frcp_rn(2688.0f);  // RN(1 / (6·448))
  }
  out[0] = (amax_a != nullptr || amax_b != nullptr) ? mul_rn(a, inv) : a;
  out[1] = beta;
}

template <typename TO, typename TB>
__global__ void add_bias_kernel(TO* out, int64_t rows, int64_t cols, int64_t ld, const TB* bias) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    TO* p = out + r * ld + c;
    float b;
    if constexpr (sizeof(TB) == 2) {
      b = __bfloat162float(bias[c]);
    } else {
      b = bias[c];
    }
    if constexpr (sizeof(TO) == 2) {
      *p = __float2bfloat16_rn(__fadd_rn(__bfloat162float(*p), b));
    } else {
      *p = __fadd_rn(*p, b);
    }
  }
}

__global__ void spin_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 * 4 ? 65535 * 4 : blocks));
}

}  // namespace

void dequant_to_bf16(const uint8_t* codes, DType t, int64_t rows, int64_t cols,
                     const uint8_t* scales, DequantScales layout, uint16_t* out,
                     cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  LOWBIT_CHECK(cols % kVec == 0, "dequant_to_bf16: cols {} is not a multiple of 8", cols);
  const int64_t chunks = rows * cols / 16;
  const bool aligned =
      reinterpret_cast<uintptr_t>(codes) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
      (layout != DequantScales::kMxColumnwise || reinterpret_cast<uintptr_t>(scales) % 16 == 0);
  const bool fp4 = t == DType::kE2M1;
  if (cols % 16 == 0 && chunks < (int64_t{1} << 31) && aligned &&
      (layout != DequantScales::kMxRowwise || cols % 32 == 0)) {
    // Enough blocks to fill the GPU several times over; each grid-strides over its chunks.
    const int grid = static_cast<int>(std::min<int64_t>((chunks + kThreads - 1) / kThreads, 8192));
    const auto n = static_cast<uint32_t>(chunks), cpr = static_cast<uint32_t>(cols / 16),
               c = static_cast<uint32_t>(cols);
    switch (layout) {
      case DequantScales::kNvfp4:
        launch_dequant16<DequantScales::kNvfp4>(fp4, grid, stream, codes, t, n, cpr, c, scales,
                                                out);
        break;
      case DequantScales::kMxRowwise:
        launch_dequant16<DequantScales::kMxRowwise>(fp4, grid, stream, codes, t, n, cpr, c, scales,
                                                    out);
        break;
      case DequantScales::kMxColumnwise:
        launch_dequant16<DequantScales::kMxColumnwise>(fp4, grid, stream, codes, t, n, cpr, c,
                                                       scales, out);
        break;
    }
    LOWBIT_CUDA_CHECK_LAUNCH();
    return;
  }
  dequant_kernel<<<grid_for(rows * cols / kVec), kThreads, 0, stream>>>(codes, t, rows, cols,
                                                                        scales, layout, out);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void nvfp4_alpha(float alpha, float beta, const float* amax_a, const float* amax_b, float* out,
                 cudaStream_t stream) {
  nvfp4_alpha_kernel<<<1, 1, 0, stream>>>(alpha, beta, amax_a, amax_b, out);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void add_bias(void* out, bool out_bf16, int64_t rows, int64_t cols, int64_t ld_out,
              const void* bias, bool bias_bf16, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int grid = grid_for(rows * cols);
  if (out_bf16) {
    auto* o = static_cast<__nv_bfloat16*>(out);
    if (bias_bf16) {
      add_bias_kernel<<<grid, kThreads, 0, stream>>>(o, rows, cols, ld_out,
                                                     static_cast<const __nv_bfloat16*>(bias));
    } else {
      add_bias_kernel<<<grid, kThreads, 0, stream>>>(o, rows, cols, ld_out,
                                                     static_cast<const float*>(bias));
    }
  } else {
    auto* o = static_cast<float*>(out);
    if (bias_bf16) {
      add_bias_kernel<<<grid, kThreads, 0, stream>>>(o, rows, cols, ld_out,
                                                     static_cast<const __nv_bfloat16*>(bias));
    } else {
      add_bias_kernel<<<grid, kThreads, 0, stream>>>(o, rows, cols, ld_out,
                                                     static_cast<const float*>(bias));
    }
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void gpu_spin(uint64_t ns, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::gemm_kernels

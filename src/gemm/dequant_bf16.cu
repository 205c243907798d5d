// CUDA kernels of the gemm layer: exact MX / NVFP4 → bf16 dequantization for the emulated
// BF16 path on Hopper, the NVFP4 alpha fold (formats.md §2.6), the bias add and the wait that
// precedes the timed calls of algorithm selection.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/pdl.cuh"
#include "gemm/gemm_cuda_kernels.h"
#include "gemm/nvfp4_alpha.cuh"
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
    // A group of 8 lies inside one 16/32-block along the row: one scale.
    uint32_t packed[kVec / 2];
    const float f0 = scale_value(scales, layout, r, c0, cols), f1 = f0;
#pragma unroll
    for (int i = 0; i < kVec; i += 2) {
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
// output and its scale follow from i alone — no division. Codes 8 (E2M1) or 16 (FP8) bytes per
// chunk, output 32 bytes.
struct Chunks16 {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  uint16_t* out = nullptr;
  uint32_t chunks = 0;
  DType t = DType::kE2M1;
  DequantScales layout = DequantScales::kNvfp4;
};

// Chunks first, first + stride, … of job j; lut holds the decoded codes of j.t.
template <DequantScales kLayout, bool kFp4>
__device__ __forceinline__ void dequant16_run(const Chunks16& j, const float* lut, uint32_t first,
                                              uint32_t stride) {
  const uint8_t* __restrict__ codes = j.codes;
  const uint8_t* __restrict__ scales = j.scales;
  uint16_t* __restrict__ out = j.out;
  for (uint32_t ch = first; ch < j.chunks; ch += stride) {
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
    // kNvfp4 [rows, cols/16]: scale index = chunk; kMxRowwise [rows, cols/32]: chunk / 2.
    const float fs = kLayout == DequantScales::kNvfp4 ? decode(DType::kUE4M3, scales[ch])
                                                      : decode_e8m0(scales[ch >> 1]);
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = fs;
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

// Both operands of an emulated GEMM and its NVFP4 alpha in one launch (separate launches cost
// ~2–3 µs each beside a 124m GEMM's ~90): blocks [0, blocks0) take job j0, the rest j1 (without
// a second job blocks0 = gridDim.x), and block 0's thread 0 writes the alpha when al.out is set.
// Layout and element type are uniform per block: the dispatch below does not diverge.
__global__ void __launch_bounds__(kThreads)
    dequant16_kernel(Chunks16 j0, Chunks16 j1, unsigned blocks0, Nvfp4Alpha al) {
  pdl::grid_sync();
  if (al.out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) write_nvfp4_alpha(al);
  const bool second = blockIdx.x >= blocks0;
  const Chunks16 j = second ? j1 : j0;
  const unsigned b = second ? blockIdx.x - blocks0 : blockIdx.x;
  const unsigned nb = second ? gridDim.x - blocks0 : blocks0;
  const bool fp4 = j.t == DType::kE2M1;
  __shared__ float lut[256];
  for (int i = threadIdx.x; i < (fp4 ? 16 : 256); i += blockDim.x) {
    lut[i] = decode(j.t, static_cast<uint32_t>(i));
  }
  __syncthreads();
  const uint32_t first = b * kThreads + threadIdx.x, stride = nb * kThreads;
  switch (j.layout) {
    case DequantScales::kNvfp4:
      fp4 ? dequant16_run<DequantScales::kNvfp4, true>(j, lut, first, stride)
          : dequant16_run<DequantScales::kNvfp4, false>(j, lut, first, stride);
      break;
    case DequantScales::kMxRowwise:
      fp4 ? dequant16_run<DequantScales::kMxRowwise, true>(j, lut, first, stride)
          : dequant16_run<DequantScales::kMxRowwise, false>(j, lut, first, stride);
      break;
  }
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

// The fast path's preconditions (dequant16_kernel); other jobs run dequant_kernel.
bool chunks16_ok(const DequantJob& d) {
  const bool aligned = reinterpret_cast<uintptr_t>(d.codes) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(d.out) % 16 == 0;
  return d.cols % 16 == 0 && d.rows * d.cols / 16 < (int64_t{1} << 31) && aligned &&
         (d.layout != DequantScales::kMxRowwise || d.cols % 32 == 0);
}

Chunks16 chunks16_of(const DequantJob& d) {
  Chunks16 c;
  c.codes = d.codes;
  c.scales = d.scales;
  c.out = d.out;
  c.chunks = static_cast<uint32_t>(d.rows * d.cols / 16);
  c.t = d.t;
  c.layout = d.layout;
  return c;
}

}  // namespace

void dequant_pair_to_bf16(const DequantJob& a, const DequantJob& b, const Nvfp4Alpha* alpha,
                          cudaStream_t stream) {
  Chunks16 fast[2];
  int n = 0;
  for (const DequantJob* d : {&a, &b}) {
    if (d->rows == 0 || d->cols == 0) continue;
    LOWBIT_CHECK(d->cols % kVec == 0, "dequant_pair_to_bf16: cols {} is not a multiple of 8",
                 d->cols);
    if (chunks16_ok(*d)) {
      fast[n++] = chunks16_of(*d);
    } else {
      dequant_kernel<<<grid_for(d->rows * d->cols / kVec), kThreads, 0, stream>>>(
          d->codes, d->t, d->rows, d->cols, d->scales, d->layout, d->out);
      LOWBIT_CUDA_CHECK_LAUNCH();
    }
  }
  if (n == 0 && alpha == nullptr) return;
  const Nvfp4Alpha al = alpha != nullptr ? *alpha : Nvfp4Alpha{};  // out == null: no alpha
  // Enough blocks to fill the GPU several times over, split between the jobs by their sizes;
  // each block grid-strides over its job's chunks.
  const int64_t total = int64_t(fast[0].chunks) + fast[1].chunks;
  int grid = static_cast<int>(std::clamp<int64_t>((total + kThreads - 1) / kThreads, 1, 8192));
  unsigned blocks0 = unsigned(grid);
  if (n == 2) {
    grid = std::max(grid, 2);
    blocks0 = unsigned(std::clamp<int64_t>((int64_t(grid) * fast[0].chunks + total / 2) / total, 1,
                                           int64_t(grid) - 1));
  }
  pdl::launch(dequant16_kernel, unsigned(grid), kThreads, 0, stream, fast[0], fast[1], blocks0, al);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void dequant_to_bf16(const uint8_t* codes, DType t, int64_t rows, int64_t cols,
                     const uint8_t* scales, DequantScales layout, uint16_t* out,
                     cudaStream_t stream) {
  dequant_pair_to_bf16(DequantJob{codes, t, rows, cols, scales, layout, out}, DequantJob{}, nullptr,
                       stream);
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

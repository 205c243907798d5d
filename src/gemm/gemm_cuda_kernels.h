// Launchers of the gemm layer's CUDA kernels (src/gemm/dequant_bf16.cu). Raw device pointers;
// every launcher is asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/core/dtype.h"

namespace lowbit::gemm_kernels {

// How the block scales of a copy are laid out (compact layouts of quant_layout()).
enum class DequantScales : uint8_t {
  kMxRowwise,  // E8M0 [rows, cols/32]: one scale per 32 along a stored row (every MX copy)
  kNvfp4,      // UE4M3 [rows, cols/16]: one scale per 16 along a stored row
};

// One copy to dequantize: out [rows, cols] bf16 (row-major, contiguous) = decode(code) ·
// decode(block scale), in the copy's stored orientation. The product is exact in fp32 and
// representable in bf16 (at most 4 + 4 significant bits) unless it leaves bf16's range, so the
// conversion is exact for every finite product at or above 2^-133 in magnitude. The NVFP4 global
// factor is NOT applied (the GEMM folds it into alpha). NaN codes and NaN scales (E8M0 0xFF,
// UE4M3 0x7F) give NaN. `cols` must be a multiple of 8 (it is a multiple of the block size, 16
// or 32). rows == 0: no copy.
struct DequantJob {
  const uint8_t* codes = nullptr;
  DType t = DType::kE2M1;
  int64_t rows = 0, cols = 0;
  const uint8_t* scales = nullptr;
  DequantScales layout = DequantScales::kNvfp4;
  uint16_t* out = nullptr;
};

// out[0] = alpha' = RN(...RN(RN(alpha · amax_a) · amax_b) · RN(1 / 2688^n)) over the NVFP4
// operands present (n = number of non-null amax pointers; TE's rule for n = 2), out[1] = beta.
// For the BF16 GEMM run with CUBLASLT_POINTER_MODE_DEVICE.
struct Nvfp4Alpha {
  float alpha = 1.0f, beta = 0.0f;
  const float* amax_a = nullptr;
  const float* amax_b = nullptr;
  float* out = nullptr;
};

// Both operands of an emulated GEMM (either may be empty) and, when `alpha` is given, its NVFP4
// alpha: one launch (PDL) for every job on the fast path (16-byte aligned, cols % 16 == 0), a
// separate one for any other job.
void dequant_pair_to_bf16(const DequantJob& a, const DequantJob& b, const Nvfp4Alpha* alpha,
                          cudaStream_t stream);

// One copy alone (dequant_pair_to_bf16 with one job).
void dequant_to_bf16(const uint8_t* codes, DType t, int64_t rows, int64_t cols,
                     const uint8_t* scales, DequantScales layout, uint16_t* out,
                     cudaStream_t stream);

// out[r, c] += bias[c] for a row-major out [rows, cols] with row stride ld_out (bf16 or f32;
// bias bf16 or f32); fp32 add, one rounding to the output type.
void add_bias(void* out, bool out_bf16, int64_t rows, int64_t cols, int64_t ld_out,
              const void* bias, bool bias_bf16, cudaStream_t stream);

// One thread that waits `ns` nanoseconds of GPU time: queued before timed calls, it lets the
// host enqueue them all before the first one starts, so that their events measure the GPU.
void gpu_spin(uint64_t ns, cudaStream_t stream);

}  // namespace lowbit::gemm_kernels

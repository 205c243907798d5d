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

// Columnwise store of a tile of codes: tile [ROWS][pitch] bytes (ROWS a multiple of 32) holds
// the codes of source rows m0 .. m0 + ROWS and columns k0 .. k0 + cols; writes
// qt [K, M][k][m] = tile[m − m0][k − k0] for m < M. Task c → 4-column group cg, 16-row segment
// seg: the thread reads the 16 rows' 4-byte words of columns 4cg .. 4cg + 3 (pitch ≡ 4 mod 8
// keeps the reads 4-byte aligned and puts the two halves of a pair, 16 rows apart, on different
// banks), transposes each 4×4 block of bytes with byte permutes, and writes 16 bytes to each of
// its 4 output rows. Lanes 2j and 2j+1 take the two halves of one 32-byte sector of an output
// row, so each store instruction of a warp writes 16 whole sectors. Bytes of columns ≥ cols are
// read (the pitch leaves room) but not written. vec: M % 16 == 0 and qt 16-byte aligned (then
// k·M + m is a multiple of 16). Every thread of the block must call it (after a barrier that
// makes the tile visible).
template <int ROWS>
__device__ __forceinline__ void store_transposed(uint8_t* __restrict__ qt,
                                                 const uint8_t* __restrict__ tile, int pitch,
                                                 int64_t m0, int64_t M, int64_t k0, int cols,
                                                 bool vec) {
  static_assert(ROWS % 32 == 0, "tiles hold whole 32-byte sectors of the transposed rows");
  const int groups = (cols + 3) / 4;
  for (int c = threadIdx.x; c < groups * (ROWS / 16); c += blockDim.x) {
    const int pair = c >> 1;
    const int cg = pair % groups, seg = (pair / groups) * 32 + (c & 1) * 16;
    const int64_t m = m0 + seg;
    if (m >= M) continue;
    // out[j][b]: rows seg + 4b .. seg + 4b + 3 of column 4cg + j, one byte per row.
    uint32_t out[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint8_t* t = tile + (seg + 4 * b) * pitch + 4 * cg;
      const uint32_t r0 = *reinterpret_cast<const uint32_t*>(t);
      const uint32_t r1 = *reinterpret_cast<const uint32_t*>(t + pitch);
      const uint32_t r2 = *reinterpret_cast<const uint32_t*>(t + 2 * pitch);
      const uint32_t r3 = *reinterpret_cast<const uint32_t*>(t + 3 * pitch);
      const uint32_t t0 = __byte_perm(r0, r1, 0x5140);  // r0.0 r1.0 r0.1 r1.1
      const uint32_t t1 = __byte_perm(r0, r1, 0x7362);  // r0.2 r1.2 r0.3 r1.3
      const uint32_t t2 = __byte_perm(r2, r3, 0x5140);
      const uint32_t t3 = __byte_perm(r2, r3, 0x7362);
      out[0][b] = __byte_perm(t0, t2, 0x5410);  // column 0: r0.0 r1.0 r2.0 r3.0
      out[1][b] = __byte_perm(t0, t2, 0x7632);
      out[2][b] = __byte_perm(t1, t3, 0x5410);
      out[3][b] = __byte_perm(t1, t3, 0x7632);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (4 * cg + j >= cols) break;
      uint8_t* dst = qt + (k0 + 4 * cg + j) * M + m;
      if (vec && m + 16 <= M) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(out[j][0], out[j][1], out[j][2], out[j][3]);
      } else {
        // The last, partial segment of the tensor: rows m .. M − 1 only (the tile rows beyond M
        // were never written).
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          if (m + i < M) dst[i] = (out[j][i / 4] >> (8 * (i % 4))) & 0xFF;
        }
      }
    }
  }
}

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

// Shared pieces of the tile kernels of block_fp4_mx_kernels.cu (MX) and nvfp4_kernels.cu (NVFP4):
// one thread block quantizes a 64×64 tile staged in shared memory as fp32 (rowwise blocks along
// K, columnwise blocks along M); codes are staged in shared memory and written out as packed rows.
#pragma once

#include "lowbit/core/cuda_check.h"
#include "lowbit/core/philox.h"
#include "lowbit/quant.h"
#include "quant/cuda_common.cuh"

namespace lowbit::quant_cuda {

constexpr int kThreads = 256;
constexpr int kT = 64;  // tile edge

struct TileSmem {
  float x[kT][kT + 1];       // source values, [m][k]
  uint8_t rc[kT][kT];        // MX FP4/FP6: rowwise codes, [m][k]
  uint8_t cc[kT][kT];        // MX FP4/FP6: columnwise codes, [k][m] (the transposed copy)
  float part[kT][kT / 16];   // NVFP4 16×16: amax of each 1×16 row block
  uint64_t rp[kT][kT / 16];  // NVFP4: packed rowwise codes, [m][K-block] (16 nibbles)
  uint64_t cp[kT][kT / 16];  // NVFP4: packed columnwise codes, [k][M-block]
  Nvfp4GlobalScale g[2];     // NVFP4 global scales of the rowwise and columnwise copies
};

// 16 E2M1 codes → 8 bytes, element 0 in the low nibble of byte 0 (formats.md §1.2).
__device__ __forceinline__ uint64_t pack_e2m1x16(const uint8_t (&c)[16]) {
  uint64_t out = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) out |= uint64_t(c[i] & 0xFu) << (4 * i);
  return out;
}

// Element conversion after scaling, resolved at compile time per element type: FP8 by hardware
// cvt (two at a time), E2M1 by comparisons, FP6 by the codec; stochastic rounding by the codec
// with the element's Philox bits. One instantiation per (type, rounding) keeps each kernel's
// code small.
template <DType kType, bool kSR>
__device__ __forceinline__ uint32_t convert(float v, uint32_t rbits) {
  if constexpr (kSR) {
    if constexpr (kType == DType::kE2M1) return e2m1_encode_sr(v, rbits);
    return encode_sr(kType, v, rbits);
  }
  if constexpr (kType == DType::kE4M3 || kType == DType::kE5M2) {
    return cvt_fp8(v, kType == DType::kE5M2);
  }
  if constexpr (kType == DType::kE2M1) return cvt_e2m1_rn(v);
  return encode_rn(kType, v);
}

// Quantizes the N values `v` of one block with multiplier `mult` into `codes`; the element with
// in-block position i has logical index idx0 + i·stride_idx in its copy (its Philox index; E2M1
// takes a byte per element, FP8 / FP6 a word: sr_bits).
template <int N, DType kType, bool kSR>
__device__ __forceinline__ void quantize_block(const float (&v)[N], float mult, RngKey key,
                                               int64_t idx0, int64_t stride_idx,
                                               uint8_t (&codes)[N]) {
  if constexpr (!kSR) {
    if constexpr (kType == DType::kE4M3 || kType == DType::kE5M2) {
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        const uint32_t pair =
            cvt_fp8x2(mul_rn(v[i], mult), mul_rn(v[i + 1], mult), kType == DType::kE5M2);
        codes[i] = pair & 0xFFu;
        codes[i + 1] = pair >> 8;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) codes[i] = convert<kType, false>(mul_rn(v[i], mult), 0u);
    }
  } else if constexpr (sr_takes_a_byte(kType)) {
    if (N % 16 == 0 && stride_idx == 1 && (idx0 & 15) == 0) {
      // Sixteen consecutive indices share one Philox block, a byte each (sr_bits).
#pragma unroll
      for (int g = 0; g < N / 16; ++g) {
        const Philox4 r = philox_block(key.seed, key.offset, uint64_t(idx0 + 16 * g) >> 4);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          codes[16 * g + j] =
              convert<kType, true>(mul_rn(v[16 * g + j], mult), sr_bits_in_block(r, j));
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const uint32_t rb = sr_bits(kType, key.seed, key.offset, uint64_t(idx0 + i * stride_idx));
        codes[i] = convert<kType, true>(mul_rn(v[i], mult), rb);
      }
    }
  } else if (stride_idx == 1 && (idx0 & 3) == 0) {
    // Four consecutive indices share one Philox block.
#pragma unroll
    for (int g = 0; g < N / 4; ++g) {
      const Philox4 r = philox_block(key.seed, key.offset, uint64_t(idx0 + 4 * g) >> 2);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        codes[4 * g + j] = convert<kType, true>(mul_rn(v[4 * g + j], mult), r.v[j]);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const uint32_t rb = philox_uint32(key.seed, key.offset, uint64_t(idx0 + i * stride_idx));
      codes[i] = convert<kType, true>(mul_rn(v[i], mult), rb);
    }
  }
}

// Loads the tile at (m0, k0) of x [M, K] into s.x (zeros outside).
template <typename T>
__device__ __forceinline__ void load_tile(TileSmem& s, const T* x, int64_t M, int64_t K, int64_t m0,
                                          int64_t k0) {
  constexpr int kChunks = kT * kT / 8 / kThreads;  // 8-element chunks per thread
  const bool vec_ok = (K % 8) == 0;
  float v[kChunks][8];
  // All loads first, so that every thread has its 16-byte requests in flight together.
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kT / 8), cc = (c % (kT / 8)) * 8;
    const int64_t m = m0 + r, k = k0 + cc;
    if (m < M && k < K) {
      const int valid = int(K - k < 8 ? K - k : 8);
      load8(x + m * K + k, vec_ok && valid == 8, valid, v[j]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[j][i] = 0.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kT / 8), cc = (c % (kT / 8)) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) s.x[r][cc + i] = v[j][i];
  }
}

// Writes a [rows][64] code tile as packed rows of `out` ([R, C] row-major, C = row length in
// elements) at (r0, c0); E2M1 packs two codes per byte, even element in the low nibble.
__device__ __forceinline__ void store_codes(const uint8_t (&codes)[kT][kT], DType t, uint8_t* out,
                                            int64_t R, int64_t C, int64_t r0, int64_t c0) {
  if (t == DType::kE2M1) {
    // 32 bytes per row: thread → (row, 4-byte word).
    for (int c = threadIdx.x; c < kT * 8; c += kThreads) {
      const int r = c / 8, w = c % 8;
      const int64_t row = r0 + r, col = c0 + 8 * w;
      if (row >= R || col >= C) continue;
      uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) word |= uint32_t(codes[r][8 * w + i] & 0xF) << (4 * i);
      *reinterpret_cast<uint32_t*>(out + (row * C + col) / 2) = word;  // C % 16 == 0
    }
  } else {
    // 64 bytes per row: thread → (row, 8-byte word).
    for (int c = threadIdx.x; c < kT * 8; c += kThreads) {
      const int r = c / 8, w = c % 8;
      const int64_t row = r0 + r, col = c0 + 8 * w;
      if (row >= R || col >= C) continue;
      *reinterpret_cast<uint2*>(out + row * C + col) =
          *reinterpret_cast<const uint2*>(&codes[r][8 * w]);  // C % 32 == 0 for MX
    }
  }
}

template <typename K>
void set_smem(K kern) {
  LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(sizeof(TileSmem))));
}

}  // namespace lowbit::quant_cuda

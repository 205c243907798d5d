// FP8 quantization kernels: per-tensor (current and delayed scaling) and block scaling
// (1×128 and 128×128), each a single pass over the source that writes the rowwise payload, the
// transposed columnwise payload, the scales and the amax. The CPU twin (src/quant/*_ref.cpp)
// defines the results; these kernels reproduce them bit for bit by calling the same scale math
// (quant/scale_math.h) and conversions proven identical to the codec (cuda_common.cuh).
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "core/env_switch.h"
#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "lowbit/quant/layout.h"
#include "quant/cuda_common.cuh"
#include "quant/quant_cuda.h"

namespace lowbit::quant_cuda {

namespace {

constexpr int kThreads = 256;

// ---- amax ------------------------------------------------------------------------------------

// amax over a contiguous tensor of n elements, folded into *amax (which the caller zeroes).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* __restrict__ x, int64_t n, float* amax) {
  pdl::grid_sync();
  constexpr int V = 8;
  float local = 0.0f;
  const int64_t n_vec = n / V;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) % 32) == 0;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n_vec;
       i += int64_t(gridDim.x) * kThreads) {
    float v[8];
    if (aligned) {
      load8(x + i * V, true, V, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = load1(x + i * V + j);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) local = amax_combine(local, v[j]);
  }
  for (int64_t i = n_vec * V + blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    local = amax_combine(local, load1(x + i));
  }
  block_amax_to_global(local, amax);
}

// scale = compute_scale_from_amax(*amax), scale_inv = RN(1/scale): one thread.
__global__ void current_scale_kernel(const float* amax, float fmax, bool pow2, float eps,
                                     float* scale, float* scale_inv) {
  pdl::grid_sync();
  const float s = compute_scale_from_amax(*amax, fmax, pow2, eps, f32_max_finite());
  *scale = s;
  *scale_inv = scale_inv_from_scale(s);
}

// ---- per-tensor cast + transpose ----------------------------------------------------------------

// Tile of kTM rows × kTK columns; the codes of the tile are staged in shared memory so the
// transposed copy can be written with 16-byte stores along M.
constexpr int kTM = 64, kTK = 128;
constexpr int kTileChunks = kTM * kTK / 8 / kThreads;  // 8-element chunks per thread and tile

// The thread's chunks of the tile at (m0, k0), xt = &x[m0][k0]: chunk j is c = threadIdx.x +
// j·kThreads, row c / 16, columns 8·(c % 16) .. +8; all loads issued before any use. Outside x
// (partial tiles, !kFull) the missing elements load as zeros.
template <typename T, bool kFull>
__device__ __forceinline__ void load_tile(const T* xt, int64_t M, int64_t K, int64_t m0, int64_t k0,
                                          Raw8<T> (&raw)[kTileChunks]) {
  // 16-byte loads need every row's chunks aligned: K % 8 == 0 and an aligned tile start.
  const bool vec_ok = kFull || ((K % 8) == 0 && reinterpret_cast<uintptr_t>(xt) % 16 == 0);
#pragma unroll
  for (int j = 0; j < kTileChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kTK / 8), cc = (c % (kTK / 8)) * 8;
    if constexpr (kFull) {
      load_raw8(xt + r * K + cc, true, 8, raw[j]);
    } else {
      const int64_t m = m0 + r, k = k0 + cc;
      const int valid = (m < M && k < K) ? int(K - k < 8 ? K - k : 8) : 0;
      load_raw8(xt + r * K + cc, vec_ok && valid == 8, valid, raw[j]);
    }
  }
}

// ---- current scaling's first pass: amax and scale in one kernel ---------------------------------

// Current scaling needs max |x| before the cast, so the source is read twice; this pass is the
// first read, and the cast (fp8_cast_transpose) the second. Two things make it cheaper than an
// amax kernel followed by a one-thread scale kernel (and a memset of the amax before both):
//  * The last block to finish computes scale = compute_scale_from_amax(amax) and
//    scale_inv = RN(1 / scale) and writes them with the amax, so no zeroing and no scale launch.
//    The running max and the count of finished blocks live in the Context's reduction words
//    (acc [2]: zero on entry, set back to zero by that last block).
//  * Blocks walk the cast's 64×128 tiles in the reverse of the cast's order (the cast's block
//    order is M-tile fastest): the tiles read last here, still in the L2, are the first ones the
//    cast reads.
// kFull: M % 64 == 0, K % 128 == 0 and x 16-byte aligned (no bounds or alignment checks).
template <typename T, bool kFull>
__global__ void __launch_bounds__(kThreads)
    amax_scale_kernel(const T* __restrict__ x,  // [M, K]
                      int64_t M, int64_t K, float fmax, bool pow2, float eps,
                      uint32_t* acc,           // [2] running max bits, finished blocks
                      float* amax_out,         // [1] max |x| (NaN skipped)
                      float* scale_out,        // [1]
                      float* scale_inv_out) {  // [1]
  pdl::grid_sync();
  const int64_t m_tiles = (M + kTM - 1) / kTM;
  const int64_t n_tiles = m_tiles * ((K + kTK - 1) / kTK);
  float local = 0.0f;
  for (int64_t t = n_tiles - 1 - blockIdx.x; t >= 0; t -= gridDim.x) {
    const int64_t m0 = (t % m_tiles) * kTM, k0 = (t / m_tiles) * kTK;
    const T* xt = x + m0 * K + k0;
    Raw8<T> raw[kTileChunks];
    load_tile<T, kFull>(xt, M, K, m0, k0, raw);
#pragma unroll
    for (int j = 0; j < kTileChunks; ++j) {
#pragma unroll
      for (int i = 0; i < 8; ++i) local = amax_combine(local, raw[j].get(i));
    }
  }
  float amax[1];
  if (grid_max_last_block<1>({local}, acc, amax)) {
    const float s = compute_scale_from_amax(amax[0], fmax, pow2, eps, f32_max_finite());
    *amax_out = amax[0];
    *scale_out = s;
    *scale_inv_out = scale_inv_from_scale(s);
  }
}

// kFull: every tile of the grid is complete and rows are 16-byte aligned (M % 64 == 0,
// K % 128 == 0) — the common case, compiled without bounds or alignment checks.
template <typename T, bool kFull>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_transpose_kernel(const T* __restrict__ x,  // [M, K]
                              int64_t M, int64_t K, const float* scale_ptr, bool e5m2,
                              uint8_t* __restrict__ q,   // [M, K] or null
                              uint8_t* __restrict__ qt,  // [K, M] or null
                              float* scale_inv_out,      // [1] or null
                              float* amax_out,           // [1], max-accumulated, or null
                              float* amax_fold) {        // [1], max-accumulated, or null
  pdl::grid_sync();
  // Codes of the tile; rows padded to a pitch ≡ 4 (mod 8) bytes, as store_transposed wants.
  __shared__ __align__(16) uint8_t tile[kTM][kTK + 4];
  const float scale = *scale_ptr;
  // blockIdx.x walks M: consecutive blocks write adjacent halves of the same transposed rows.
  const int64_t m0 = int64_t(blockIdx.x) * kTM, k0 = int64_t(blockIdx.y) * kTK;
  const T* xt = x + m0 * K + k0;  // this tile's first element
  const bool vec_ok = kFull || (K % 8) == 0;
  float local_amax = 0.0f;
  // Rowwise: each thread converts kTileChunks chunks of 8 elements; all loads are issued first so
  // that each thread has its 16-byte requests in flight together.
  Raw8<T> raw[kTileChunks];
  load_tile<T, kFull>(xt, M, K, m0, k0, raw);
#pragma unroll
  for (int j = 0; j < kTileChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kTK / 8), cc = (c % (kTK / 8)) * 8;
    const int64_t m = m0 + r, k = k0 + cc;
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = raw[j].get(2 * i), hi = raw[j].get(2 * i + 1);
      local_amax = amax_combine(local_amax, lo);
      local_amax = amax_combine(local_amax, hi);
      w[i] = cvt_fp8x2(mul_rn(lo, scale), mul_rn(hi, scale), e5m2);
    }
    const uint2 codes = make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
    if (q != nullptr && kFull) {
      *reinterpret_cast<uint2*>(q + m * K + k) = codes;
    } else if (q != nullptr && m < M && k < K) {
      const int valid = int(K - k < 8 ? K - k : 8);
      if (vec_ok && valid == 8) {
        *reinterpret_cast<uint2*>(q + m * K + k) = codes;
      } else {
        for (int i = 0; i < valid; ++i) {
          q[m * K + k + i] = (i < 4 ? codes.x >> (8 * i) : codes.y >> (8 * (i - 4))) & 0xFF;
        }
      }
    }
    reinterpret_cast<uint32_t*>(&tile[r][cc])[0] = codes.x;  // rows are 4-byte aligned
    reinterpret_cast<uint32_t*>(&tile[r][cc])[1] = codes.y;
  }
  if (qt != nullptr) {
    __syncthreads();  // the whole tile is staged
    // Columnwise: 4-byte shared reads and 4×4 byte transposes, whole 32-byte sectors per store.
    const int cols = kFull ? kTK : int(K - k0 < kTK ? K - k0 : kTK);
    const bool vec_t = (M % 16) == 0 && reinterpret_cast<uintptr_t>(qt) % 16 == 0;
    store_transposed<kTM>(qt, &tile[0][0], kTK + 4, m0, M, k0, cols, vec_t);
  }
  block_amax_to_global(local_amax, amax_out);
  block_amax_to_global(local_amax, amax_fold);
  if (scale_inv_out != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    *scale_inv_out = scale_inv_from_scale(scale);
  }
}

// ---- FP8 block scaling -------------------------------------------------------------------------

// One 128×128 tile per thread block, staged in shared memory as fp32.
//  * 1×128 rowwise: each row of the tile is one block (scale per (row, K-block)).
//  * 1×128 columnwise: each column of the tile is one block along M of the transposed copy.
//  * 128×128: one scale for the whole tile; the transposed copy is the exact transpose.
constexpr int kB = 128;

// Exact round trips between the source type and fp32 (the values came from T).
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ uint16_t from_f32<uint16_t>(float v) {
  return static_cast<uint16_t>(__float_as_uint(v) >> 16);
}
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ float to_f32(float v) { return v; }

template <typename T, bool k2D>
__global__ void __launch_bounds__(kThreads)
    fp8_block_kernel(const T* __restrict__ x,  // [M, K]
                     int64_t M, int64_t K, bool e5m2, float fmax, bool pow2, float eps,
                     float value_for_inf,
                     uint8_t* __restrict__ q,       // [M, K] or null
                     float* __restrict__ q_scale,   // rowwise scale_inv (layout per mode)
                     uint8_t* __restrict__ qt,      // [K, M] or null
                     float* __restrict__ qt_scale,  // columnwise scale_inv
                     float* amax_out) {
  pdl::grid_sync();
  // The tile is kept in the source type (bf16 stays 2 bytes: 33 KB instead of 66 KB, twice the
  // resident blocks); the row pitch of kB + 2 elements keeps column reads conflict-free.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T(*tile)[kB + 2] = reinterpret_cast<T(*)[kB + 2]>(smem_raw);                       // [128][130]
  float* col_part = reinterpret_cast<float*>(smem_raw + sizeof(T) * kB * (kB + 2));  // [2][128]
  __shared__ float warp_red[kThreads / 32];
  // blockIdx.x walks M (consecutive blocks write adjacent parts of the same transposed rows).
  const unsigned mb_idx = blockIdx.x, kb_idx = blockIdx.y;
  const int64_t m0 = int64_t(mb_idx) * kB, k0 = int64_t(kb_idx) * kB;
  const int64_t k_blocks = ceil_div(K, kB), m_blocks = ceil_div(M, kB);
  const bool vec_ok = (K % 8) == 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Load: chunk c → row c/16, columns 8·(c%16); a half-warp covers one row.
  float tile_amax = 0.0f;
  for (int c = threadIdx.x; c < kB * kB / 8; c += kThreads) {
    const int r = c / 16, cc = (c % 16) * 8;
    const int64_t m = m0 + r, k = k0 + cc;
    float v[8];
    if (m < M && k < K) {
      const int valid = int(K - k < 8 ? K - k : 8);
      load8(x + m * K + k, vec_ok && valid == 8, valid, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) tile[r][cc + i] = from_f32<T>(v[i]);
    if constexpr (!k2D) {
      // Rowwise 1×128: amax over the half-warp holding this row, then quantize the chunk.
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) a = amax_combine(a, v[i]);
      tile_amax = amax_combine(tile_amax, a);
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) a = fmax_num(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
      if (q != nullptr && m < M && k < K) {
        const float s = compute_scale_from_amax(a, fmax, pow2, eps, value_for_inf);
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          w[i] = cvt_fp8x2(mul_rn(v[2 * i], s), mul_rn(v[2 * i + 1], s), e5m2);
        }
        const int valid = int(K - k < 8 ? K - k : 8);
        if (vec_ok && valid == 8) {
          *reinterpret_cast<uint2*>(q + m * K + k) =
              make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
        } else {
          for (int i = 0; i < valid; ++i) q[m * K + k + i] = (w[i / 2] >> (8 * (i % 2))) & 0xFF;
        }
        if ((c % 16) == 0) q_scale[vec128_scale_index(m, kb_idx, M)] = scale_inv_from_scale(s);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) tile_amax = amax_combine(tile_amax, v[i]);
    }
  }
  // Out-of-range rows and columns hold 0, which never raises an amax.
  float s_tile = 1.0f;
  if constexpr (k2D) {
    float a = warp_max(tile_amax);
    if (lane == 0) warp_red[warp] = a;
    __syncthreads();
    a = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) a = fmax_num(a, warp_red[w]);
    s_tile = compute_scale_from_amax(a, fmax, pow2, eps, value_for_inf);
    if (threadIdx.x == 0) {
      if (q_scale != nullptr)
        q_scale[blk128_scale_index(mb_idx, kb_idx, k_blocks)] = scale_inv_from_scale(s_tile);
      if (qt_scale != nullptr)
        qt_scale[blk128_scale_index(kb_idx, mb_idx, m_blocks)] = scale_inv_from_scale(s_tile);
    }
    // Rowwise 128×128 codes.
    if (q != nullptr) {
      for (int c = threadIdx.x; c < kB * kB / 8; c += kThreads) {
        const int r = c / 16, cc = (c % 16) * 8;
        const int64_t m = m0 + r, k = k0 + cc;
        if (m >= M || k >= K) continue;
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          w[i] = cvt_fp8x2(mul_rn(to_f32(tile[r][cc + 2 * i]), s_tile),
                           mul_rn(to_f32(tile[r][cc + 2 * i + 1]), s_tile), e5m2);
        }
        const int valid = int(K - k < 8 ? K - k : 8);
        if (vec_ok && valid == 8) {
          *reinterpret_cast<uint2*>(q + m * K + k) =
              make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
        } else {
          for (int i = 0; i < valid; ++i) q[m * K + k + i] = (w[i / 2] >> (8 * (i % 2))) & 0xFF;
        }
      }
    }
  } else {
    __syncthreads();
  }

  if (qt != nullptr) {
    // Columnwise: thread → column kk = t % 128 and half h = t / 128 (64 rows each).
    const int kk = threadIdx.x % kB, h = threadIdx.x / kB;
    const int64_t k = k0 + kk;
    float s = s_tile;
    if constexpr (!k2D) {
      float a = 0.0f;
      for (int r = h * 64; r < h * 64 + 64; ++r) a = amax_combine(a, to_f32(tile[r][kk]));
      col_part[h * kB + kk] = a;
      __syncthreads();
      a = fmax_num(col_part[kk], col_part[kB + kk]);
      s = compute_scale_from_amax(a, fmax, pow2, eps, value_for_inf);
      if (h == 0 && k < K) qt_scale[vec128_scale_index(k, mb_idx, K)] = scale_inv_from_scale(s);
    }
    if (k < K) {
      const bool vec_t = (M % 16) == 0;
      for (int seg = h * 64; seg < h * 64 + 64; seg += 16) {
        const int64_t m = m0 + seg;
        if (m >= M) break;
        uint32_t w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          w[i] = cvt_fp8x2(mul_rn(to_f32(tile[seg + 2 * i][kk]), s),
                           mul_rn(to_f32(tile[seg + 2 * i + 1][kk]), s), e5m2);
        }
        const uint4 out = make_uint4(w[0] | (w[1] << 16), w[2] | (w[3] << 16), w[4] | (w[5] << 16),
                                     w[6] | (w[7] << 16));
        if (vec_t && m + 16 <= M) {
          *reinterpret_cast<uint4*>(qt + k * M + m) = out;
        } else {
          for (int i = 0; i < 16 && m + i < M; ++i)
            qt[k * M + m + i] = (w[i / 2] >> (8 * (i % 2))) & 0xFF;
        }
      }
    }
  }
  if (amax_out != nullptr) block_amax_to_global(tile_amax, amax_out);
}

// ---- FP8 block scaling, v9: bf16 source, full 128×128 tiles ------------------------------------
//
// Same tile and numerics as fp8_block_kernel; what changes is how the data moves:
//  * all eight 16-byte loads of a thread are issued before any is used (8 × 256 threads × 16 B
//    = 32 KB in flight per block; v8 had one load per loop iteration in flight);
//  * the tile is staged in shared memory as whole 16-byte granules (one STS.128 per 8 elements
//    instead of eight 2-byte stores) and read back as 4-byte column pairs (one LDS per two
//    elements instead of two 2-byte loads per element, amax and quantize);
//  * the transposed copy is written as whole 32-byte sectors: lanes 2u and 2u+1 store the two
//    16-byte halves of one sector (a warp: 16 rows of the transposed copy × 32 bytes).
// Shared-memory layout: tile row r (128 bf16 = 256 bytes = 16 granules) keeps granule g at
// g ^ (((r >> 4) & 1) << 2). The column reads of one instruction touch rows r and r + 16, four
// granules each; the swizzle puts them in the two different 64-byte halves of the banks.
__device__ __forceinline__ int fp8_block_swizzle(int r, int g) { return g ^ (((r >> 4) & 1) << 2); }

// Eight bf16 values of a 16-byte granule → eight FP8 codes (cvt_sat(RN(x · s)), x exact in fp32).
__device__ __forceinline__ uint2 fp8_codes8(const uint4& u, float s, bool e5m2) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  uint32_t c[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    c[i] = cvt_fp8x2(mul_rn(__uint_as_float(w[i] << 16), s),
                     mul_rn(__uint_as_float(w[i] & 0xFFFF0000u), s), e5m2);
  }
  return make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
}

__device__ __forceinline__ float amax8_bf16(const uint4& u) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  float a = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a = amax_combine(a, __uint_as_float(w[i] << 16));
    a = amax_combine(a, __uint_as_float(w[i] & 0xFFFF0000u));
  }
  return a;
}

// The max |x| of a granule's eight bf16 values by three packed maxima (NaN skipped as
// amax_combine does: a granule holding NaN takes amax8_bf16).
__device__ __forceinline__ float amax8_bf16_packed(const uint4& u) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  const uint32_t m = bf16x2_absmax_tree(w);
  if (bf16x2_any_nan(m)) return amax8_bf16(u);
  return __uint_as_float(max(m & 0xFFFFu, m >> 16) << 16);  // non-negative: bits order as values
}

// Preconditions (checked by the launcher): M % 128 == 0, K % 128 == 0, x and qt 16-byte
// aligned, q 8-byte aligned. No bounds checks.
// kLean (v14, 1×128 only): the same values with fewer instructions per element — block amaxes
// by packed bf16x2 maxima (amax8_bf16_packed; the columns' 32 words by a tree, NaN through
// amax_combine), and each lane divides once instead of eight times: lane g computes the scale of
// its half-warp's chunk g % 8 (lanes g and g + 8 both, 2 divisions per row block instead of 16)
// and the half-warp shuffles the eight scales.
template <bool k2D, bool kLean = false>
__global__ void __launch_bounds__(kThreads, 3)
    fp8_block_v9_kernel(const uint16_t* __restrict__ x,  // [M, K] bf16
                        int64_t M, int64_t K, bool e5m2, float fmax, bool pow2, float eps,
                        float value_for_inf,
                        uint8_t* __restrict__ q,       // [M, K] or null
                        float* __restrict__ q_scale,   // rowwise scale_inv (layout per mode)
                        uint8_t* __restrict__ qt,      // [K, M] or null
                        float* __restrict__ qt_scale,  // columnwise scale_inv
                        float* amax_out) {
  pdl::grid_sync();
  __shared__ __align__(16) uint4 tile[kB][kB / 8];  // [128 rows][16 granules], swizzled, 32 KB
  __shared__ float col_part[2][kB];                 // 1×128 columnwise: amax of each half column
  __shared__ float warp_red[kThreads / 32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  // blockIdx.x walks M (consecutive blocks write adjacent parts of the same transposed rows).
  const unsigned mb_idx = blockIdx.x, kb_idx = blockIdx.y;
  const int64_t m0 = int64_t(mb_idx) * kB, k0 = int64_t(kb_idx) * kB;

  // Rowwise: chunk j of a thread is row 16j + 2·warp + lane/16, granule lane%16 — a half-warp
  // holds one 1×128 block (one full row of the tile).
  const int g = lane & 15;
  uint4 raw[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = 16 * j + 2 * warp + (lane >> 4);
    raw[j] = *reinterpret_cast<const uint4*>(x + (m0 + r) * K + k0 + 8 * g);
  }
  float tile_amax = 0.0f;
  if constexpr (kLean && !k2D) {
    // Row amaxes of the thread's eight chunks, each over its half-warp.
    float a[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int r = 16 * j + 2 * warp + (lane >> 4);
      tile[r][fp8_block_swizzle(r, g)] = raw[j];
      a[j] = amax8_bf16_packed(raw[j]);
      tile_amax = fmax_num(tile_amax, a[j]);
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) a[j] = fmax_num(a[j], __shfl_xor_sync(0xFFFFFFFFu, a[j], o));
    }
    // Lane g divides for chunk g % 8 (lanes 8..15 repeat 0..7) and writes that row's scale_inv.
    float aj = a[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) aj = (g & 7) == j ? a[j] : aj;
    const float s_own = compute_scale_from_amax(aj, fmax, pow2, eps, value_for_inf);
    if (q != nullptr) {
      if (g < 8) {
        const int r = 16 * g + 2 * warp + (lane >> 4);
        q_scale[vec128_scale_index(m0 + r, kb_idx, M)] = scale_inv_from_scale(s_own);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float sj = __shfl_sync(0xFFFFFFFFu, s_own, (lane & 16) | j);
        const int r = 16 * j + 2 * warp + (lane >> 4);
        *reinterpret_cast<uint2*>(q + (m0 + r) * K + k0 + 8 * g) = fp8_codes8(raw[j], sj, e5m2);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int r = 16 * j + 2 * warp + (lane >> 4);
      tile[r][fp8_block_swizzle(r, g)] = raw[j];
      float a = amax8_bf16(raw[j]);
      tile_amax = fmax_num(tile_amax, a);
      if constexpr (!k2D) {
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) a = fmax_num(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
        if (q != nullptr) {
          const float s = compute_scale_from_amax(a, fmax, pow2, eps, value_for_inf);
          *reinterpret_cast<uint2*>(q + (m0 + r) * K + k0 + 8 * g) = fp8_codes8(raw[j], s, e5m2);
          if (g == 0) q_scale[vec128_scale_index(m0 + r, kb_idx, M)] = scale_inv_from_scale(s);
        }
      }
    }
  }
  float s_tile = 1.0f;
  if constexpr (k2D) {
    float a = warp_max(tile_amax);
    if (lane == 0) warp_red[warp] = a;
    __syncthreads();  // also publishes the tile for the columnwise pass
    a = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) a = fmax_num(a, warp_red[w]);
    s_tile = compute_scale_from_amax(a, fmax, pow2, eps, value_for_inf);
    if (t == 0) {
      const int64_t k_blocks = K / kB, m_blocks = M / kB;
      if (q_scale != nullptr)
        q_scale[blk128_scale_index(mb_idx, kb_idx, k_blocks)] = scale_inv_from_scale(s_tile);
      if (qt_scale != nullptr)
        qt_scale[blk128_scale_index(kb_idx, mb_idx, m_blocks)] = scale_inv_from_scale(s_tile);
    }
    if (q != nullptr) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int r = 16 * j + 2 * warp + (lane >> 4);
        *reinterpret_cast<uint2*>(q + (m0 + r) * K + k0 + 8 * g) = fp8_codes8(raw[j], s_tile, e5m2);
      }
    }
  } else {
    __syncthreads();
  }

  if (qt != nullptr) {
    // Columnwise: lane pair (u = lane/2, p = lane%2) of warp w owns columns 2cp and 2cp + 1,
    // cp = 16·(w%4) + u, rows h·64 + seg·32 + p·16 + i (h = w/4, seg < 2, i < 16): p picks the
    // 16-byte half of each 32-byte output sector.
    const int u = lane >> 1, p = lane & 1, h = warp >> 2;
    const int cp = 16 * (warp & 3) + u;
    const int gq = cp >> 2, wq = cp & 3;  // granule and 4-byte word of the column pair
    uint32_t col[2][16];                  // [seg][i]: bf16 of column 2cp (low), 2cp + 1 (high)
#pragma unroll
    for (int seg = 0; seg < 2; ++seg) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int r = h * 64 + seg * 32 + p * 16 + i;  // (r >> 4) & 1 == p
        col[seg][i] = reinterpret_cast<const uint32_t*>(&tile[r][gq ^ (p << 2)])[wq];
      }
    }
    float s[2] = {s_tile, s_tile};
    if constexpr (!k2D) {
      float a[2] = {0.0f, 0.0f};
      bool slow = !kLean;
      if constexpr (kLean) {  // both columns' 32 values by 31 packed maxima, NaN as below
        uint32_t w[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) w[i] = col[i / 16][i % 16];
        const uint32_t m = bf16x2_absmax_tree(w);
        slow = bf16x2_any_nan(m);
        a[0] = __uint_as_float(m << 16);
        a[1] = __uint_as_float(m & 0xFFFF0000u);
      }
      if (slow) {
        a[0] = 0.0f;
        a[1] = 0.0f;
#pragma unroll
        for (int seg = 0; seg < 2; ++seg) {
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            a[0] = amax_combine(a[0], __uint_as_float(col[seg][i] << 16));
            a[1] = amax_combine(a[1], __uint_as_float(col[seg][i] & 0xFFFF0000u));
          }
        }
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        a[c] = fmax_num(a[c], __shfl_xor_sync(0xFFFFFFFFu, a[c], 1));  // the lane pair: 64 rows
        if (p == 0) col_part[h][2 * cp + c] = a[c];
      }
      __syncthreads();
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int kk = 2 * cp + c;
        s[c] = compute_scale_from_amax(fmax_num(col_part[0][kk], col_part[1][kk]), fmax, pow2, eps,
                                       value_for_inf);
        if (h == 0 && p == 0) {
          qt_scale[vec128_scale_index(k0 + kk, mb_idx, K)] = scale_inv_from_scale(s[c]);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      uint8_t* out = qt + (k0 + 2 * cp + c) * M + m0 + h * 64 + p * 16;
#pragma unroll
      for (int seg = 0; seg < 2; ++seg) {
        uint32_t w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t lo = col[seg][2 * i], hi = col[seg][2 * i + 1];
          const float vlo = __uint_as_float(c == 0 ? lo << 16 : lo & 0xFFFF0000u);
          const float vhi = __uint_as_float(c == 0 ? hi << 16 : hi & 0xFFFF0000u);
          w[i] = cvt_fp8x2(mul_rn(vlo, s[c]), mul_rn(vhi, s[c]), e5m2);
        }
        *reinterpret_cast<uint4*>(out + seg * 32) = make_uint4(
            w[0] | (w[1] << 16), w[2] | (w[3] << 16), w[4] | (w[5] << 16), w[6] | (w[7] << 16));
      }
    }
  }
  if (amax_out != nullptr) block_amax_to_global(tile_amax, amax_out);
}

int grid_for(int64_t n) {
  int64_t blocks = (n / 8 + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > 132 * 16) blocks = 132 * 16;
  return int(blocks);
}

}  // namespace

int quant_kernels_version() {
  static const int version = [] {
    return parse_quant_kernels(std::getenv("LOWBIT_QUANT_KERNELS"));
  }();
  return version;
}

bool legacy_kernels() { return quant_kernels_version() == 8; }

template <typename T>
void amax(const T* x, int64_t n, float* amax_out, cudaStream_t stream) {
  pdl::launch(amax_kernel<T>, grid_for(n), kThreads, 0, stream, x, n, amax_out);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void amax_scale(const T* x, int64_t M, int64_t K, float fmax, bool pow2, float eps, uint32_t* acc,
                float* amax_out, float* scale, float* scale_inv, cudaStream_t stream) {
  LOWBIT_CHECK(M > 0 && K > 0, "amax_scale: empty source {}x{}", M, K);
  const int64_t n_tiles = ceil_div(M, kTM) * ceil_div(K, kTK);
  // A block per tile, as the cast's grid (only the resident blocks, each walking ~1.5 tiles,
  // measured the same within 2 % on an H100); past 2^30 tiles the blocks walk several.
  const int64_t grid = std::min<int64_t>(n_tiles, int64_t(1) << 30);
  const bool full = M % kTM == 0 && K % kTK == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  auto kern = full ? amax_scale_kernel<T, true> : amax_scale_kernel<T, false>;
  pdl::launch(kern, unsigned(grid), kThreads, 0, stream, x, M, K, fmax, pow2, eps, acc, amax_out,
              scale, scale_inv);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void current_scale(const float* amax_in, float fmax, bool pow2, float eps, float* scale,
                   float* scale_inv, cudaStream_t stream) {
  pdl::launch(current_scale_kernel, 1, 1, 0, stream, amax_in, fmax, pow2, eps, scale, scale_inv);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void fp8_cast_transpose(const T* x, int64_t M, int64_t K, const float* scale, bool e5m2, uint8_t* q,
                        uint8_t* qt, float* scale_inv, float* amax_out, float* amax_fold,
                        cudaStream_t stream) {
  if (M == 0 || K == 0) return;
  const dim3 grid(unsigned(ceil_div(M, kTM)), unsigned(ceil_div(K, kTK)));
  // Full tiles: M % 64 == 0, K % 128 == 0 and 16-byte aligned base pointers.
  const bool full = M % kTM == 0 && K % kTK == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(qt) % 16 == 0;
  auto kern = full ? fp8_cast_transpose_kernel<T, true> : fp8_cast_transpose_kernel<T, false>;
  pdl::launch(kern, grid, kThreads, 0, stream, x, M, K, scale, e5m2, q, qt, scale_inv, amax_out,
              amax_fold);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void fp8_block(const T* x, int64_t M, int64_t K, bool two_d, bool e5m2, float fmax, bool pow2,
               float eps, float value_for_inf, uint8_t* q, float* q_scale, uint8_t* qt,
               float* qt_scale, float* amax_out, cudaStream_t stream) {
  if (M == 0 || K == 0) return;
  const dim3 grid(unsigned(ceil_div(M, kB)), unsigned(ceil_div(K, kB)));
  if constexpr (std::is_same_v<T, uint16_t>) {
    // v9 (default): bf16 source, full tiles, aligned rows; v8 is kept for every other case and
    // for A/B runs (LOWBIT_QUANT_KERNELS=v8).
    const bool full = M % kB == 0 && K % kB == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(q) % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(qt) % 16 == 0;
    if (full && !legacy_kernels()) {
      // v14: the lean 1×128 kernel (LOWBIT_QUANT_KERNELS=v13 keeps v9's).
      auto kern = two_d                           ? fp8_block_v9_kernel<true>
                  : quant_kernels_version() >= 14 ? fp8_block_v9_kernel<false, true>
                                                  : fp8_block_v9_kernel<false>;
      pdl::launch(kern, grid, kThreads, 0, stream, x, M, K, e5m2, fmax, pow2, eps, value_for_inf, q,
                  q_scale, qt, qt_scale, amax_out);
      LOWBIT_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const size_t smem = sizeof(T) * kB * (kB + 2) + 2 * kB * sizeof(float);
  if (two_d) {
    auto kern = fp8_block_kernel<T, true>;
    LOWBIT_CUDA_CHECK(
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    pdl::launch(kern, grid, kThreads, smem, stream, x, M, K, e5m2, fmax, pow2, eps, value_for_inf,
                q, q_scale, qt, qt_scale, amax_out);
  } else {
    auto kern = fp8_block_kernel<T, false>;
    LOWBIT_CUDA_CHECK(
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    pdl::launch(kern, grid, kThreads, smem, stream, x, M, K, e5m2, fmax, pow2, eps, value_for_inf,
                q, q_scale, qt, qt_scale, amax_out);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

#define LOWBIT_INSTANTIATE(T)                                                                    \
  template void amax<T>(const T*, int64_t, float*, cudaStream_t);                                \
  template void amax_scale<T>(const T*, int64_t, int64_t, float, bool, float, uint32_t*, float*, \
                              float*, float*, cudaStream_t);                                     \
  template void fp8_cast_transpose<T>(const T*, int64_t, int64_t, const float*, bool, uint8_t*,  \
                                      uint8_t*, float*, float*, float*, cudaStream_t);           \
  template void fp8_block<T>(const T*, int64_t, int64_t, bool, bool, float, bool, float, float,  \
                             uint8_t*, float*, uint8_t*, float*, float*, cudaStream_t);
LOWBIT_INSTANTIATE(uint16_t)
LOWBIT_INSTANTIATE(float)
#undef LOWBIT_INSTANTIATE
// The per-tensor cast reads an f32 master as its bf16 rounding (QuantConfig::round_source_to_bf16).
template void amax<Bf16RoundedF32>(const Bf16RoundedF32*, int64_t, float*, cudaStream_t);
template void amax_scale<Bf16RoundedF32>(const Bf16RoundedF32*, int64_t, int64_t, float, bool,
                                         float, uint32_t*, float*, float*, float*, cudaStream_t);
template void fp8_cast_transpose<Bf16RoundedF32>(const Bf16RoundedF32*, int64_t, int64_t,
                                                 const float*, bool, uint8_t*, uint8_t*, float*,
                                                 float*, float*, cudaStream_t);

namespace {
// y [n] = RN_bf16(x [n]), the convert kernel's rounding (for the modes that read bf16 only).
__global__ void round_to_bf16_kernel(const float* __restrict__ x, int64_t n,
                                     uint16_t* __restrict__ y) {
  pdl::grid_sync();
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    y[i] = f32_to_bf16_rn(x[i]);
}
}  // namespace

void round_to_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (n == 0) return;
  pdl::launch(round_to_bf16_kernel, grid_for(n), kThreads, 0, stream, x, n, y);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::quant_cuda

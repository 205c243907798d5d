// MX quantization kernels (E8M0 scale per 32 elements; formats.md §2.5).
//
// mx_kernel: one thread block quantizes a 64×64 tile staged in shared memory as fp32
// (block_tile.cuh): rowwise 1×32 blocks along K, columnwise 32×1 blocks along M, stored
// transposed ([K, M]: the rowwise blocks of x^T).
// Every number comes from the shared scale math (quant/scale_math.h), so the results equal the CPU
// twin bit for bit. v10 adds an MXFP8 kernel for bf16 full tiles that stages bf16 granules instead
// of fp32 scalars (see the comment at mx8_v10_kernel). The NVFP4 kernels live in nvfp4_kernels.cu.
#include <type_traits>

#include "lowbit/core/cuda_check.h"
#include "lowbit/quant/layout.h"
#include "quant/block_tile.cuh"
#include "quant/cuda_common.cuh"
#include "quant/quant_cuda.h"

namespace lowbit::quant_cuda {

namespace {

// ---- MX
// ------------------------------------------------------------------------------------------

struct MxArgs {
  int64_t M, K;
  DType t;
  MxScaleRounding rounding;
  bool rowwise, columnwise, sr;
  RngKey row_key, col_key;
  uint8_t* q;         // [M, K] codes (E2M1 packed)
  uint8_t* q_scale;   // [M, K/32] e8m0
  uint8_t* qc;        // [K, M] columnwise codes (transposed; E2M1 packed along M)
  uint8_t* qc_scale;  // [K, M/32] e8m0
};

template <typename T, DType kType, bool kSR>
__global__ void __launch_bounds__(kThreads) mx_kernel(const T* __restrict__ x, MxArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  TileSmem& s = *reinterpret_cast<TileSmem*>(smem_raw);
  // blockIdx.x walks M (consecutive blocks write adjacent parts of the same transposed rows).
  const int64_t m0 = int64_t(blockIdx.x) * kT, k0 = int64_t(blockIdx.y) * kT;
  load_tile(s, x, a.M, a.K, m0, k0);
  __syncthreads();
  // Threads 0..127: rowwise task (row t/2, K-block t%2); 128..255: columnwise task
  // (column t%64, M-block (t-128)/64).
  const int t = threadIdx.x;
  if (t < 128) {
    const int r = t / 2, b = t % 2;
    if (a.rowwise) {
      float v[32];
      uint8_t codes[32];
      float am = 0.0f;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        v[i] = s.x[r][b * 32 + i];
        am = amax_combine(am, v[i]);
      }
      const uint8_t e = mx_scale(am, kType, a.rounding);
      quantize_block<32, kType, kSR>(v, mx_multiplier(e), a.row_key, (m0 + r) * a.K + k0 + b * 32,
                                     1, codes);
#pragma unroll
      for (int i = 0; i < 32; ++i) s.rc[r][b * 32 + i] = codes[i];
      if (m0 + r < a.M && k0 + b * 32 < a.K) a.q_scale[(m0 + r) * (a.K / 32) + k0 / 32 + b] = e;
    }
  } else if (a.columnwise) {
    const int kk = (t - 128) % kT, b = (t - 128) / kT;
    float v[32];
    uint8_t codes[32];
    float am = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      v[i] = s.x[b * 32 + i][kk];
      am = amax_combine(am, v[i]);
    }
    const uint8_t e = mx_scale(am, kType, a.rounding);
    // Element m of row k of the transposed copy: logical index k·M + m.
    quantize_block<32, kType, kSR>(v, mx_multiplier(e), a.col_key, (k0 + kk) * a.M + m0 + b * 32, 1,
                                   codes);
#pragma unroll
    for (int i = 0; i < 32; ++i) s.cc[kk][b * 32 + i] = codes[i];  // [k][m]: transposed
    if (k0 + kk < a.K && m0 + b * 32 < a.M) a.qc_scale[(k0 + kk) * (a.M / 32) + m0 / 32 + b] = e;
  }
  __syncthreads();
  if (a.rowwise) store_codes(s.rc, kType, a.q, a.M, a.K, m0, k0);
  if (a.columnwise) store_codes(s.cc, kType, a.qc, a.K, a.M, k0, m0);
}

// MXFP8 v10: E4M3/E5M2, round to nearest, bf16 source, full 64×64 tiles. Thread t loads row
// t/4, granules 2·(t%4) and +1 (32 contiguous bytes, all loads in flight before any use); a
// rowwise 1×32 block is held by lanes t, t^1 (amax combined by one shuffle), each quantizes its
// 16 elements from registers and stores 16 bytes (4 lanes: a row's 64 bytes).
// Columnwise 32×1 blocks: the tile is staged as bf16 granules, row r keeping granule g at
// g ^ (r & 1) ^ 2·((r / 8) % 4); thread task = column pair p (one 4-byte word per row),
// M-block mb, rows 8·qq .. +8 of the block (lane = qq + 4·(p % 8), so the 4 quarters of a
// block are lanes of one warp: amax by two shuffles; the 4 rows a warp reads per instruction
// then lie on different banks). The column codes go to the transposed copy: the thread's 8 codes
// of column 2p (2p + 1) are 8 contiguous bytes of row 2p (2p + 1) of the [K, M] tile, staged as
// 8-byte units (rows padded to 80 bytes) and written as 16 bytes per thread. Every
// value is the same operation on the same operands as in mx_kernel (v8).
// kKFast (v15): blockIdx.x walks K and blockIdx.y M, so the blocks resident together read (and
// write) long runs of the same rows instead of 64-row bands spread over every row of a tall
// tensor. With the transposed columnwise copy this order still wins (H100, same-call A/B,
// bench/results/h100-2026-11-27/mx-transposed-1030/mx_order.txt: 78–79.5 % of copy against
// 69–73.5 % M fastest and 74–77 % in groups of 8 or 16 M-tiles; the untransposed copy had run at
// 89–95 %: the transposed rows cost ≈ 12 points).
template <bool kE5M2, bool kKFast = false>
__global__ void __launch_bounds__(kThreads)
    mx8_v10_kernel(const uint16_t* __restrict__ x, MxArgs a) {
  constexpr DType kType = kE5M2 ? DType::kE5M2 : DType::kE4M3;
  __shared__ uint4 tile[kT][kT / 8];  // bf16 granules, swizzled (8 KB)
  // Columnwise codes [k][m] as 8-byte units, rows padded to 80 bytes: the 16 lanes of a store
  // phase (rows 2p, 4 consecutive p; units 4·mb + qq) then hit 16 distinct bank pairs (without
  // the padding every row starts on bank 0: 4-way conflicts), and a row's 64 bytes stay 16-byte
  // aligned for the read-back.
  __shared__ __align__(16) uint2 cc[kT][kT / 8 + 2];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t m0 = int64_t(kKFast ? blockIdx.y : blockIdx.x) * kT;
  const int64_t k0 = int64_t(kKFast ? blockIdx.x : blockIdx.y) * kT;
  const int r = t >> 2, c4 = t & 3;  // row, 16-element piece of the row
  const uint16_t* src = x + (m0 + r) * a.K + k0 + 16 * c4;
  const uint4 raw0 = *reinterpret_cast<const uint4*>(src);
  const uint4 raw1 = *reinterpret_cast<const uint4*>(src + 8);
  if (a.columnwise) {
    const int sw = (r & 1) ^ (((r >> 3) & 3) << 1);
    tile[r][(2 * c4) ^ sw] = raw0;
    tile[r][(2 * c4 + 1) ^ sw] = raw1;
  }
  if (a.rowwise) {
    const uint32_t w[8] = {raw0.x, raw0.y, raw0.z, raw0.w, raw1.x, raw1.y, raw1.z, raw1.w};
    float v[16];
    float am = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      am = amax_combine(am, v[2 * i]);
      am = amax_combine(am, v[2 * i + 1]);
    }
    am = fmax_num(am, __shfl_xor_sync(0xFFFFFFFFu, am, 1));
    const uint8_t e = mx_scale(am, kType, a.rounding);
    const float mult = mx_multiplier(e);
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t p0 = cvt_fp8x2(mul_rn(v[4 * i], mult), mul_rn(v[4 * i + 1], mult), kE5M2);
      const uint32_t p1 = cvt_fp8x2(mul_rn(v[4 * i + 2], mult), mul_rn(v[4 * i + 3], mult), kE5M2);
      o[i] = p0 | (p1 << 16);
    }
    *reinterpret_cast<uint4*>(a.q + (m0 + r) * a.K + k0 + 16 * c4) =
        make_uint4(o[0], o[1], o[2], o[3]);
    if ((t & 1) == 0) a.q_scale[(m0 + r) * (a.K / 32) + k0 / 32 + (c4 >> 1)] = e;
  }
  if (!a.columnwise) return;
  __syncthreads();
  const int qq = lane & 3, p = 8 * (warp & 3) + (lane >> 2), mb = warp >> 2;
  float va[8], vb[8];
  float ama = 0.0f, amb = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int rr = 32 * mb + 8 * qq + i;
    const int sw = (rr & 1) ^ (((rr >> 3) & 3) << 1);
    const uint32_t w = reinterpret_cast<const uint32_t*>(&tile[rr][(p >> 2) ^ sw])[p & 3];
    va[i] = __uint_as_float(w << 16);
    vb[i] = __uint_as_float(w & 0xFFFF0000u);
    ama = amax_combine(ama, va[i]);
    amb = amax_combine(amb, vb[i]);
  }
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    ama = fmax_num(ama, __shfl_xor_sync(0xFFFFFFFFu, ama, o));
    amb = fmax_num(amb, __shfl_xor_sync(0xFFFFFFFFu, amb, o));
  }
  const uint8_t ea = mx_scale(ama, kType, a.rounding), eb = mx_scale(amb, kType, a.rounding);
  const float ma = mx_multiplier(ea), mbm = mx_multiplier(eb);
  uint32_t ca[2] = {0u, 0u}, cb[2] = {0u, 0u};  // codes of columns 2p, 2p + 1, m = 8·qq + i
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t pair = cvt_fp8x2(mul_rn(va[i], ma), mul_rn(vb[i], mbm), kE5M2);
    ca[i >> 2] |= (pair & 0xFFu) << (8 * (i & 3));
    cb[i >> 2] |= ((pair >> 8) & 0xFFu) << (8 * (i & 3));
  }
  const int u = 4 * mb + qq;  // unit (8 codes along m) of rows 2p and 2p + 1
  cc[2 * p][u] = make_uint2(ca[0], ca[1]);
  cc[2 * p + 1][u] = make_uint2(cb[0], cb[1]);
  if (qq == 0) {  // rows k0 + 2p, + 1 of the [K, M/32] scales, M-block m0 / 32 + mb
    a.qc_scale[(k0 + 2 * p) * (a.M / 32) + m0 / 32 + mb] = ea;
    a.qc_scale[(k0 + 2 * p + 1) * (a.M / 32) + m0 / 32 + mb] = eb;
  }
  __syncthreads();
  // Row r (= k0 + r of the copy), m = 16·c4 … +15: units 2·c4 and 2·c4 + 1, one 16-byte load.
  *reinterpret_cast<uint4*>(a.qc + (k0 + r) * a.M + m0 + 16 * c4) =
      *reinterpret_cast<const uint4*>(&cc[r][2 * c4]);
}

}  // namespace

namespace {

template <typename T, DType kType>
void launch_mx(const T* x, const MxArgs& a, dim3 grid, cudaStream_t stream) {
  auto kern = a.sr ? mx_kernel<T, kType, true> : mx_kernel<T, kType, false>;
  set_smem(kern);
  kern<<<grid, kThreads, sizeof(TileSmem), stream>>>(x, a);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void mx(const T* x, int64_t M, int64_t K, DType t, MxScaleRounding rounding, bool rowwise,
        bool columnwise, bool sr, RngKey row_key, RngKey col_key, uint8_t* q, uint8_t* q_scale,
        uint8_t* qc, uint8_t* qc_scale, cudaStream_t stream) {
  if (M == 0 || K == 0) return;
  const dim3 grid(unsigned(ceil_div(M, kT)), unsigned(ceil_div(K, kT)));
  MxArgs a{M, K, t, rounding, rowwise, columnwise, sr, row_key, col_key, q, q_scale, qc, qc_scale};
  // v10+: MXFP8 with round to nearest, bf16, full 64×64 tiles, 16-byte aligned source (block
  // order below).
  if (quant_kernels_version() >= 10 && std::is_same_v<T, uint16_t> && !sr &&
      (t == DType::kE4M3 || t == DType::kE5M2) && M % kT == 0 && K % kT == 0 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const auto* xb = reinterpret_cast<const uint16_t*>(x);
    // v15: K-fastest block order where M / 64 fits the grid's y extent (LOWBIT_QUANT_KERNELS=v14
    // keeps M fastest).
    if (quant_kernels_version() >= 15 && M / kT <= 65535) {
      const dim3 grid_k(unsigned(K / kT), unsigned(M / kT));
      if (t == DType::kE5M2) {
        mx8_v10_kernel<true, true><<<grid_k, kThreads, 0, stream>>>(xb, a);
      } else {
        mx8_v10_kernel<false, true><<<grid_k, kThreads, 0, stream>>>(xb, a);
      }
    } else if (t == DType::kE5M2) {
      mx8_v10_kernel<true><<<grid, kThreads, 0, stream>>>(xb, a);
    } else {
      mx8_v10_kernel<false><<<grid, kThreads, 0, stream>>>(xb, a);
    }
    LOWBIT_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (t) {
    case DType::kE4M3: launch_mx<T, DType::kE4M3>(x, a, grid, stream); break;
    case DType::kE5M2: launch_mx<T, DType::kE5M2>(x, a, grid, stream); break;
    case DType::kE3M2: launch_mx<T, DType::kE3M2>(x, a, grid, stream); break;
    case DType::kE2M3: launch_mx<T, DType::kE2M3>(x, a, grid, stream); break;
    case DType::kE2M1: launch_mx<T, DType::kE2M1>(x, a, grid, stream); break;
    default:
      LOWBIT_CHECK(false, "MX payload type {} is not e4m3/e5m2/e3m2/e2m3/e2m1", dtype_name(t));
  }
}

#define LOWBIT_INSTANTIATE(T)                                                               \
  template void mx<T>(const T*, int64_t, int64_t, DType, MxScaleRounding, bool, bool, bool, \
                      RngKey, RngKey, uint8_t*, uint8_t*, uint8_t*, uint8_t*, cudaStream_t);
LOWBIT_INSTANTIATE(uint16_t)
LOWBIT_INSTANTIATE(float)
#undef LOWBIT_INSTANTIATE

}  // namespace lowbit::quant_cuda

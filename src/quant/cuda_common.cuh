// Device helpers shared by the quantization kernels: vector loads of bf16/f32 rows, fast
// element conversions that are bit-identical to the portable codec (formats.h), and amax
// reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/core/context.h"
#include "lowbit/formats.h"
#include "lowbit/quant/rn_ops.h"
#include "lowbit/quant/scale_math.h"

namespace lowbit::quant_cuda {

// --- loads ------------------------------------------------------------------------------------

// Eight consecutive source elements as fp32. `full` means all 8 are in range and the address is
// 16-byte aligned (bf16) / 32-byte aligned (f32); otherwise only the first `valid` are read and
// the rest are 0.
__device__ __forceinline__ void load8(const uint16_t* p, bool full, int valid, float v[8]) {
  if (full) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i < valid ? __uint_as_float(uint32_t(p[i]) << 16) : 0.0f;
  }
}

__device__ __forceinline__ void load8(const float* p, bool full, int valid, float v[8]) {
  if (full) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i < valid ? p[i] : 0.0f;
  }
}

// Eight source elements kept as raw bits until used (bf16: one 16-byte register quad instead of
// eight fp32 registers), so that a thread can hold several chunks in flight cheaply.
template <typename T>
struct Raw8;
template <>
struct Raw8<uint16_t> {
  uint4 u;
  __device__ __forceinline__ float get(int i) const {  // i must be a compile-time constant
    const uint32_t w = i < 2 ? u.x : i < 4 ? u.y : i < 6 ? u.z : u.w;
    return __uint_as_float((i & 1) ? (w & 0xFFFF0000u) : (w << 16));
  }
};
template <>
struct Raw8<float> {
  float4 a, b;
  __device__ __forceinline__ float get(int i) const {
    const float4& h = i < 4 ? a : b;
    const int j = i & 3;
    return j == 0 ? h.x : j == 1 ? h.y : j == 2 ? h.z : h.w;
  }
};

__device__ __forceinline__ void load_raw8(const uint16_t* p, bool full, int valid,
                                          Raw8<uint16_t>& r) {
  if (full) {
    r.u = *reinterpret_cast<const uint4*>(p);
  } else {
    uint32_t w[4] = {0, 0, 0, 0};
    for (int i = 0; i < valid; ++i) w[i / 2] |= uint32_t(p[i]) << (16 * (i & 1));
    r.u = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__device__ __forceinline__ void load_raw8(const float* p, bool full, int valid, Raw8<float>& r) {
  if (full) {
    r.a = *reinterpret_cast<const float4*>(p);
    r.b = *reinterpret_cast<const float4*>(p + 4);
  } else {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i < valid ? p[i] : 0.0f;
    r.a = make_float4(v[0], v[1], v[2], v[3]);
    r.b = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// An f32 source read as RN_bf16(x) (formats.h f32_to_bf16_rn, the rounding of the bf16 convert
// kernel): a weight quantized straight from its f32 master holds the values its bf16 compute
// copy would, without that copy being written and read back (QuantConfig::round_source_to_bf16).
struct Bf16RoundedF32 {
  float f;
};
__device__ __forceinline__ float round_bf16(float x) { return bf16_to_f32(f32_to_bf16_rn(x)); }

template <>
struct Raw8<Bf16RoundedF32> {
  float4 a, b;  // raw f32; rounded where used, so that the loads stay back to back
  __device__ __forceinline__ float get(int i) const {
    const float4& h = i < 4 ? a : b;
    const int j = i & 3;
    return round_bf16(j == 0 ? h.x : j == 1 ? h.y : j == 2 ? h.z : h.w);
  }
};

__device__ __forceinline__ void load_raw8(const Bf16RoundedF32* p, bool full, int valid,
                                          Raw8<Bf16RoundedF32>& r) {
  Raw8<float> f;
  load_raw8(reinterpret_cast<const float*>(p), full, valid, f);
  r.a = f.a;
  r.b = f.b;
}

__device__ __forceinline__ void load8(const Bf16RoundedF32* p, bool full, int valid, float v[8]) {
  load8(reinterpret_cast<const float*>(p), full, valid, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = round_bf16(v[i]);
}

template <typename T>
__device__ __forceinline__ float load1(const T* p);
template <>
__device__ __forceinline__ float load1<uint16_t>(const uint16_t* p) {
  return __uint_as_float(uint32_t(*p) << 16);
}
template <>
__device__ __forceinline__ float load1<float>(const float* p) {
  return *p;
}
template <>
__device__ __forceinline__ float load1<Bf16RoundedF32>(const Bf16RoundedF32* p) {
  return round_bf16(p->f);
}

// Elements per 16-byte vector of the source type.
template <typename T>
constexpr int kVecElems = 16 / sizeof(T);

// --- element conversions ------------------------------------------------------------------------

// fp32 → FP8 with cvt.rn.satfinite (sm_89+). Bit-identical to encode_rn(t, x, kSatFinite) for
// every input — checked by the GPU tests over all bf16 values and boundary sweeps.
__device__ __forceinline__ uint32_t cvt_fp8x2(float lo, float hi, bool e5m2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short pair;
  if (e5m2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  }
  return pair;
#else
  const DType t = e5m2 ? DType::kE5M2 : DType::kE4M3;
  return encode_rn(t, lo) | (encode_rn(t, hi) << 8);
#endif
}

__device__ __forceinline__ uint32_t cvt_fp8(float x, bool e5m2) {
  return cvt_fp8x2(x, 0.0f, e5m2) & 0xFFu;
}

// fp32 → E2M1 nibble, round to nearest even with saturation: the decision points of
// formats.md §1.4 as comparisons (ties: strict '>' where the lower code is even, '>=' where the
// upper one is). NaN → +6 (0x7), the sign of -0 and of tiny negatives is kept.
__device__ __forceinline__ uint32_t cvt_e2m1_rn(float x) {
  const float a = fabsf(x);
  if (a != a) return 0x7u;
  const uint32_t code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                        (a >= 3.5f) + (a > 5.0f);
  return code | ((__float_as_uint(x) >> 28) & 0x8u);
}

// --- reductions
// -----------------------------------------------------------------------------------

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax_num(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// max into a non-negative (or NaN-free) float in global memory: non-negative floats order like
// their bit patterns.
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}

// Block-wide amax folded into *out with ONE atomic per thread block: every block of a grid
// targets the same address, and same-address atomics serialise in L2, so per-warp atomics
// would cost more than the kernel's memory traffic. Must be reached by every thread of the
// block (it synchronises); `out` must be the same for all of them.
__device__ __forceinline__ void block_amax_to_global(float local, float* out) {
  if (out == nullptr) return;
  __shared__ float warp_amax[32];
  local = warp_max(local);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // warp_amax may still be read by an earlier call in this block
  if (lane == 0) warp_amax[warp] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.0f;
    for (int w = 0; w < int((blockDim.x + 31) / 32); ++w) a = fmax_num(a, warp_amax[w]);
    atomic_max_nonneg(out, a);
  }
}

// ---- packed bf16 block amaxes (the NVFP4 and FP8 block kernels) ----

// Half by half max(|a|, |b|) of two bf16 pairs, NaN in either operand giving NaN. The sign bits of
// the result are the XOR of the operands' (the .xorsign.abs form) and mean nothing: callers mask
// them. |.| of bf16 values is exact, so the max is one of the |values|, as amax_combine's.
__device__ __forceinline__ uint32_t bf16x2_absmax_nan(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// bf16x2_absmax_nan over N words (N a power of two) as a tree; the result's sign bits cleared.
template <int N>
__device__ __forceinline__ uint32_t bf16x2_absmax_tree(const uint32_t (&w)[N]) {
  if constexpr (N == 1) {
    return w[0] & 0x7FFF7FFFu;
  } else {
    uint32_t m[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) m[i] = bf16x2_absmax_nan(w[i], w[i + N / 2]);
    return bf16x2_absmax_tree<N / 2>(m);
  }
}

// Either half of a masked absmax word is NaN (above 0x7F80): adding 0x7F carries into bit 15 of
// that half exactly then (no carry crosses halves: 0x7FFF + 0x7F < 0x10000).
__device__ __forceinline__ bool bf16x2_any_nan(uint32_t masked) {
  return ((masked + 0x007F007Fu) & 0x80008000u) != 0;
}

// Grid-wide max of N non-negative values per thread (amaxes: NaN already skipped, +inf kept)
// without zeroed outputs: each block folds its maxima into acc[0 .. N) and counts itself in
// acc[N]; in the last block to finish, thread 0 gets the grid's maxima in `out`, sets the words
// back to zero and returns true (every other thread returns false). `acc`: N + 1 words that are
// zero on entry — a Context's reduction_words(). Every thread of the block must call it, once
// per kernel (the words count one arrival per block).
template <int N>
__device__ __forceinline__ bool grid_max_last_block(const float (&local)[N], uint32_t* acc,
                                                    float (&out)[N]) {
  static_assert(N + 1 <= Context::kReductionWords, "more words than a Context holds");
  __shared__ float warp_amax[N][32];
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the block's shared memory may still be read by earlier code
#pragma unroll
  for (int v = 0; v < N; ++v) {
    const float w = warp_max(local[v]);
    if (lane == 0) warp_amax[v][warp] = w;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int v = 0; v < N; ++v) {
      float a = 0.0f;
      for (int w = 0; w < int((blockDim.x + 31) / 32); ++w) a = fmax_num(a, warp_amax[v][w]);
      // Non-negative floats order as their bit patterns.
      atomicMax(&acc[v], __float_as_uint(a));
    }
    __threadfence();  // the maxima are visible before this block counts as finished
    last = atomicAdd(&acc[N], 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return false;
  __threadfence();
  // Every other block's atomicMax precedes its count: the words hold the grid's maxima.
#pragma unroll
  for (int v = 0; v < N; ++v) out[v] = __uint_as_float(atomicExch(&acc[v], 0u));
  acc[N] = 0u;
  return true;
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
// makes the tile visible). `first`: the thread's first task (threadIdx.x in the overload below;
// a caller storing several tiles may rotate it, by an even amount, to spread their tasks over
// the block — the bytes written are the same).
template <int ROWS>
__device__ __forceinline__ void store_transposed(uint8_t* __restrict__ qt,
                                                 const uint8_t* __restrict__ tile, int pitch,
                                                 int64_t m0, int64_t M, int64_t k0, int cols,
                                                 bool vec, int first) {
  static_assert(ROWS % 32 == 0, "tiles hold whole 32-byte sectors of the transposed rows");
  const int groups = (cols + 3) / 4;
  for (int c = first; c < groups * (ROWS / 16); c += blockDim.x) {
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

// qt [K, M] ← tile [ROWS][pitch] (above), the tasks taken from threadIdx.x.
template <int ROWS>
__device__ __forceinline__ void store_transposed(uint8_t* __restrict__ qt,
                                                 const uint8_t* __restrict__ tile, int pitch,
                                                 int64_t m0, int64_t M, int64_t k0, int cols,
                                                 bool vec) {
  store_transposed<ROWS>(qt, tile, pitch, m0, M, k0, cols, vec, int(threadIdx.x));
}

}  // namespace lowbit::quant_cuda

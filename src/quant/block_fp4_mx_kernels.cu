// MX (E8M0 per 32) and NVFP4 (UE4M3 per 16, fp32 global amax) quantization kernels.
//
// One thread block quantizes a 64×64 tile staged in shared memory as fp32: rowwise blocks run
// along K, columnwise blocks along M (NVFP4: written transposed, with the 16-point Hadamard
// transform when asked; MX: not transposed). Codes are staged in shared memory and written out
// as packed rows. NVFP4 needs the global amax first, so it runs twice over the tile grid: an
// amax pass (plain amax and, for RHT copies, the amax after the transform), then the quantize
// pass. Every number comes from the shared scale math (quant/scale_math.h, quant/hadamard16.h),
// so the results equal the CPU twin bit for bit. v10 adds, for bf16 full tiles, an NVFP4 1×16
// quantize pass and an MXFP8 kernel that stage bf16 granules instead of fp32 scalars (see the
// comments at nvfp4_quant_v10_kernel and mx8_v10_kernel).
#include <type_traits>

#include "lowbit/core/cuda_check.h"
#include "lowbit/core/philox.h"
#include "lowbit/quant/hadamard16.h"
#include "lowbit/quant/layout.h"
#include "quant/cuda_common.cuh"
#include "quant/quant_cuda.h"

namespace lowbit::quant_cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kT = 64;  // tile edge

enum class Pass { kAmax, kQuantize };

struct TileSmem {
  float x[kT][kT + 1];       // source values, [m][k]
  uint8_t rc[kT][kT];        // rowwise codes, [m][k]
  uint8_t cc[kT][kT];        // columnwise codes: NVFP4 [k][m] (transposed), MX [m][k]
  float part[kT][kT / 16];   // NVFP4 16×16: amax of each 1×16 row block
  uint64_t rp[kT][kT / 16];  // NVFP4 1×16: packed rowwise codes, [m][K-block] (16 nibbles)
  uint64_t cp[kT][kT / 16];  // NVFP4 1×16: packed columnwise codes, [k][M-block]
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
  if constexpr (kSR) return encode_sr(kType, v, rbits);
  if constexpr (kType == DType::kE4M3 || kType == DType::kE5M2) {
    return cvt_fp8(v, kType == DType::kE5M2);
  }
  if constexpr (kType == DType::kE2M1) return cvt_e2m1_rn(v);
  return encode_rn(kType, v);
}

// Quantizes the N values `v` of one block with multiplier `mult` into `codes`; the element with
// in-block position i has logical index idx0 + i·stride_idx in its copy (its Philox index).
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

// Column chunk of 16 values s.x[mb·16 .. +16][kk], optionally through the Hadamard transform
// (formats.md §5.2; the input is bf16, so the fp32 values are exact bf16 values).
//
// kFastRound (v9): step 3 of rht16_apply_f32 (the rounding to bf16) by cvt.rn.bf16x2.f32, two
// results per instruction, instead of f32_to_bf16_rn's per-element NaN test, cvt and fix-ups
// (the GPU tests prove cvt.rn.bf16 equal to the codec for every non-NaN value). A NaN result
// keeps a different payload (0x7FFF instead of 0x7FC0), which nothing can observe: the value
// only meets amax_combine (skips NaN) and RN(y · m) (NaN in, canonical NaN out, E2M1 0x7).
// A zero result becomes +0 by RN(y + 0), as the definition asks.
template <bool kFastRound>
__device__ __forceinline__ void column_chunk(const TileSmem& s, int kk, int mb, bool rht,
                                             float (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = s.x[mb * 16 + i][kk];
  if (!rht) return;
  if constexpr (kFastRound) {
    rht16_butterfly_f32(v);
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      uint32_t pair;  // v[i + 1] in the high half, v[i] in the low half
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(v[i + 1]), "f"(v[i]));
      v[i] = __fadd_rn(__uint_as_float(pair << 16), 0.0f);
      v[i + 1] = __fadd_rn(__uint_as_float(pair & 0xFFFF0000u), 0.0f);
    }
  } else {
    rht16_apply_f32(v);
  }
}

// ---- NVFP4
// ---------------------------------------------------------------------------------------

// nvfp4_block_scale() with the UE4M3 cast done by cvt.rn.satfinite.e4m3: the scaled block amax
// is never negative (or NaN: amaxes skip NaN), and for such values the E4M3 code is the UE4M3
// code (the GPU codec tests prove cvt identical to encode_rn).
__device__ __forceinline__ uint8_t block_scale_fast(float block_amax, float k) {
  return static_cast<uint8_t>(cvt_fp8(fmin_num(mul_rn(block_amax, k), f32_max_finite()), false));
}

struct Nvfp4Args {
  int64_t M, K;
  bool rowwise, columnwise, rht, sr, two_d;
  RngKey row_key, col_key;
  uint8_t* q;         // [M, K/2]
  uint8_t* q_scale;   // [M, K/16]
  uint8_t* qt;        // [K, M/2]
  uint8_t* qt_scale;  // [K, M/16]
  float* amax_row;    // [1] global amax of x (pass 1 accumulates)
  float* amax_col;    // [1] global amax of the columnwise copy (after RHT)
};

// kV9: the columnwise RHT rounds with column_chunk<true>; otherwise the v8 kernel unchanged.
template <typename T, Pass kPass, bool kSR, bool kV9>
__global__ void __launch_bounds__(kThreads, 2) nvfp4_kernel(const T* __restrict__ x, Nvfp4Args a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  TileSmem& s = *reinterpret_cast<TileSmem*>(smem_raw);
  // blockIdx.x walks M (consecutive blocks write adjacent parts of the same transposed rows).
  const int64_t m0 = int64_t(blockIdx.x) * kT, k0 = int64_t(blockIdx.y) * kT;
  load_tile(s, x, a.M, a.K, m0, k0);
  __syncthreads();
  const int t = threadIdx.x;
  // Rowwise task: row t/4, K-block t%4 of the tile. Columnwise task: column t%64, M-block t/64.
  const int r = t / 4, rb = t % 4;
  const int kk = t % kT, mb = t / kT;
  const bool row_in = m0 + r < a.M && k0 + rb * 16 < a.K;
  const bool col_in = k0 + kk < a.K && m0 + mb * 16 < a.M;
  const bool col_uses_own = a.columnwise && !a.two_d;  // 2D: columnwise = transposed rowwise

  if constexpr (kPass == Pass::kAmax) {
    float ra = 0.0f, ca = 0.0f;
    if ((a.rowwise || a.two_d) && row_in) {
#pragma unroll
      for (int i = 0; i < 16; ++i) ra = amax_combine(ra, s.x[r][rb * 16 + i]);
    }
    if (col_uses_own && col_in) {
      float v[16];
      column_chunk<kV9>(s, kk, mb, a.rht, v);
#pragma unroll
      for (int i = 0; i < 16; ++i) ca = amax_combine(ca, v[i]);
    }
    block_amax_to_global(ra, a.amax_row);
    block_amax_to_global(ca, a.amax_col);
    return;
  } else {
    if (threadIdx.x == 0) {
      s.g[0] = nvfp4_global_scale(*a.amax_row);
      if (a.columnwise && !a.two_d) s.g[1] = nvfp4_global_scale(*a.amax_col);
    }
    __syncthreads();
    const Nvfp4GlobalScale g_row = s.g[0];
    if (a.two_d) {
      // One scale per 16×16 tile: amax of each 1×16 row block, then of the 16 rows.
      float ra = 0.0f;
      if (row_in) {
#pragma unroll
        for (int i = 0; i < 16; ++i) ra = amax_combine(ra, s.x[r][rb * 16 + i]);
      }
      s.part[r][rb] = ra;
      __syncthreads();
      float ta = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) ta = amax_combine(ta, s.part[(r / 16) * 16 + i][rb]);
      const uint8_t sd = block_scale_fast(ta, g_row.k);
      const float mult = nvfp4_block_multiplier(sd, g_row.s_dec);
      float v[16];
      uint8_t codes[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = s.x[r][rb * 16 + i];
      quantize_block<16, DType::kE2M1, kSR>(v, mult, a.row_key, (m0 + r) * a.K + k0 + rb * 16, 1,
                                            codes);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        s.rc[r][rb * 16 + i] = codes[i];
        s.cc[rb * 16 + i][r] = codes[i];  // exact transpose
      }
      if (row_in) {
        if (a.q_scale) a.q_scale[(m0 + r) * (a.K / 16) + (k0 / 16 + rb)] = sd;
        // Column copy: row k of the transposed tile carries the tile's scale for M-block r/16.
        if (a.qt_scale && (r % 16) < 16) {
          const int64_t kb_row = k0 + rb * 16 + (r % 16);
          a.qt_scale[kb_row * (a.M / 16) + (m0 / 16 + r / 16)] = sd;
        }
      }
    } else {
      if (a.rowwise) {
        float v[16];
        uint8_t codes[16];
        float ra = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          v[i] = s.x[r][rb * 16 + i];
          ra = amax_combine(ra, v[i]);
        }
        const uint8_t sd = block_scale_fast(ra, g_row.k);
        const float mult = nvfp4_block_multiplier(sd, g_row.s_dec);
        quantize_block<16, DType::kE2M1, kSR>(v, mult, a.row_key, (m0 + r) * a.K + k0 + rb * 16, 1,
                                              codes);
        s.rp[r][rb] = pack_e2m1x16(codes);
        if (row_in) a.q_scale[(m0 + r) * (a.K / 16) + (k0 / 16 + rb)] = sd;
      }
      if (a.columnwise) {
        const Nvfp4GlobalScale g_col = s.g[1];
        float v[16];
        uint8_t codes[16];
        column_chunk<kV9>(s, kk, mb, a.rht, v);
        float ca = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) ca = amax_combine(ca, v[i]);
        const uint8_t sd = block_scale_fast(ca, g_col.k);
        const float mult = nvfp4_block_multiplier(sd, g_col.s_dec);
        quantize_block<16, DType::kE2M1, kSR>(v, mult, a.col_key, (k0 + kk) * a.M + m0 + mb * 16, 1,
                                              codes);
        s.cp[kk][mb] = pack_e2m1x16(codes);
        if (col_in) a.qt_scale[(k0 + kk) * (a.M / 16) + (m0 / 16 + mb)] = sd;
      }
    }
    __syncthreads();
    if (a.two_d) {
      if (a.rowwise) store_codes(s.rc, DType::kE2M1, a.q, a.M, a.K, m0, k0);
      if (a.columnwise) store_codes(s.cc, DType::kE2M1, a.qt, a.K, a.M, k0, m0);
    } else {
      // Packed rows: thread → (row, 16-element block), 8 bytes each; 4 threads write a row's
      // 32 contiguous bytes. Rows are 8-byte aligned (both dims are multiples of 16).
      const int pr = t / 4, pw = t % 4;
      if (a.rowwise && m0 + pr < a.M && k0 + pw * 16 < a.K) {
        *reinterpret_cast<uint64_t*>(a.q + ((m0 + pr) * a.K + k0 + pw * 16) / 2) = s.rp[pr][pw];
      }
      if (a.columnwise && k0 + pr < a.K && m0 + pw * 16 < a.M) {
        *reinterpret_cast<uint64_t*>(a.qt + ((k0 + pr) * a.M + m0 + pw * 16) / 2) = s.cp[pr][pw];
      }
    }
  }
}

// NVFP4 global amaxes, v9: one read of x at full width, no shared memory. Thread task: a 16×8
// block (rows 16·mb .. +16, columns 8·c8 .. +8), loaded as 16 independent 16-byte loads (a
// warp reads 512 contiguous bytes of each row). The 8 columns of the task are 8 complete
// 16-element RHT chunks of the columnwise copy (chunks run along M), so the post-RHT amax needs
// no staging: the butterfly of rht16_apply_f32 (steps 1-2, same fp32 operations in the same
// order) runs on each, max |y| is taken before the rounding to bf16 and rounded once at the end
// (equal to the max over rounded values: see rht16_butterfly_f32). One atomic per block and
// amax; the max is order-independent, so the result is deterministic.
// Preconditions (checked by the launcher): bf16, M % 16 == 0, K % 8 == 0, x 16-byte aligned.
__global__ void __launch_bounds__(kThreads)
    nvfp4_amax_v9_kernel(const uint16_t* __restrict__ x,  // [M, K] bf16
                         int64_t M, int64_t K, bool want_row, bool want_col, bool rht,
                         float* amax_row, float* amax_col) {
  const int64_t k8 = K / 8, n_tasks = (M / 16) * k8;
  const int64_t task = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  float ra = 0.0f, ca = 0.0f;
  if (task < n_tasks) {
    const int64_t mb = task / k8, c8 = task - mb * k8;
    const uint16_t* p = x + mb * 16 * K + c8 * 8;
    uint32_t w[16][4];  // [row][word]: word j holds columns 2j (low) and 2j + 1 (high)
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint4 u = *reinterpret_cast<const uint4*>(p + i * K);
      w[i][0] = u.x, w[i][1] = u.y, w[i][2] = u.z, w[i][3] = u.w;
    }
    float plain = 0.0f;
    if (want_row || (want_col && !rht)) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          plain = amax_combine(plain, __uint_as_float(w[i][j] << 16));
          plain = amax_combine(plain, __uint_as_float(w[i][j] & 0xFFFF0000u));
        }
      }
    }
    ra = want_row ? plain : 0.0f;
    if (want_col && rht) {
      float ymax = 0.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const uint32_t u = w[i][c / 2];
          v[i] = __uint_as_float((c & 1) ? (u & 0xFFFF0000u) : (u << 16));
        }
        rht16_butterfly_f32(v);
#pragma unroll
        for (int i = 0; i < 16; ++i) ymax = amax_combine(ymax, v[i]);
      }
      ca = bf16_to_f32(f32_to_bf16_rn(ymax));  // ymax is never NaN (amax_combine skips NaN)
    } else if (want_col) {
      ca = plain;
    }
  }
  block_amax_to_global(ra, amax_row);
  block_amax_to_global(ca, amax_col);
}

// ---- NVFP4 quantize pass, v10: 1×16 blocks, bf16 source, full 128×64 tiles ----------------------
//
// Thread block: a 128 (M) × 64 (K) tile, 256 threads.
//  * Loads: thread t owns the rowwise blocks (row t/4 + 64j, K-block t%4), j = 0, 1: two
//    16-byte loads each, all four in flight before any use. The rowwise copy is quantized
//    straight from these registers and stored as 8 bytes per block (4 lanes write a row's 32
//    contiguous bytes).
//  * The tile is staged in shared memory as bf16 16-byte granules (16 KB, one STS.128 per 8
//    elements): row r keeps granule g at g ^ (r & 1), so that the two rows of a quarter-warp
//    store land on different banks; a row read as 32 words still touches every bank once.
//  * Columnwise: thread (pair p = lane, M-block mb = warp) reads the 16 words of its rows that
//    hold columns 2p and 2p + 1 (one LDS.32 per two elements, conflict-free), transforms and
//    quantizes both 16-element chunks, and stages the two packed code words (one STS.128) and
//    scales; then thread (k = t/4, q = t%4) writes 16 bytes of transposed row k (4 lanes: 64
//    contiguous bytes) and two scale bytes.
//  * RN elements by e2m1_rn_fast (one fp32 add instead of seven compares); the RHT rounding by
//    cvt.rn.bf16x2, two columns per instruction, with the "+0 for a zero result" of the
//    definition folded into the scaling as RN(y · m + 0) (equal to RN(y · m) except that a zero
//    product is +0, and a zero y gives a zero product: m is finite and positive).
// Every value is computed by the same operations as in nvfp4_kernel (v9), element by element,
// and the stochastic-rounding streams use the same indices (quantize_block).
constexpr int kV10M = 128;  // tile rows (M)
constexpr int kV10K = 64;   // tile columns (K): 8 granules of 8 bf16

struct Nvfp4V10Smem {
  uint4 tile[kV10M][kV10K / 8];        // bf16 granules, swizzled: [r][g ^ (r & 1)]
  uint64_t cp[kV10M / 16][kV10K];      // packed column codes [mb][k ^ 4·(mb / 2)]
  uint16_t cs[kV10M / 16][kV10K / 2];  // column scales [mb][k / 2], two per word (k even low)
  Nvfp4GlobalScale g[2];
};

__device__ __forceinline__ float fma_rn_zero(float a, float b) {  // RN(a · b + 0), never fused away
  float r;
  asm("fma.rn.f32 %0, %1, %2, 0f00000000;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// 16 values → 16 packed E2M1 codes (element i in nibble i) of RN(v·mult) (kZeroFix: RN(v·mult+0)),
// or with stochastic rounding from the Philox stream at indices idx0 + i.
template <bool kSR, bool kZeroFix>
__device__ __forceinline__ uint64_t nvfp4_codes16(float (&v)[16], float mult, RngKey key,
                                                  int64_t idx0) {
  if constexpr (kSR) {
    if constexpr (kZeroFix) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = __fadd_rn(v[i], 0.0f);
    }
    uint8_t codes[16];
    quantize_block<16, DType::kE2M1, true>(v, mult, key, idx0, 1, codes);
    return pack_e2m1x16(codes);
  } else {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float p = kZeroFix ? fma_rn_zero(v[i], mult) : mul_rn(v[i], mult);
      const uint32_t c = e2m1_rn_fast(p);
      if (i < 8) {
        lo |= c << (4 * i);
      } else {
        hi |= c << (4 * (i - 8));
      }
    }
    return (uint64_t(hi) << 32) | lo;
  }
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// Preconditions (checked by the launcher): !two_d, M % 128 == 0, K % 64 == 0, x 16-byte aligned;
// rowwise and columnwise outputs as in nvfp4_kernel.
template <bool kSR>
__global__ void __launch_bounds__(kThreads, 3)
    nvfp4_quant_v10_kernel(const uint16_t* __restrict__ x, Nvfp4Args a) {
  __shared__ Nvfp4V10Smem s;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t m0 = int64_t(blockIdx.x) * kV10M, k0 = int64_t(blockIdx.y) * kV10K;
  const int rb = t & 3;  // rowwise K-block of this thread
  uint4 raw[2][2];       // [j][half]: row t/4 + 64j, granules 2·rb + half
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint16_t* p = x + (m0 + (t >> 2) + 64 * j) * a.K + k0 + 16 * rb;
    raw[j][0] = *reinterpret_cast<const uint4*>(p);
    raw[j][1] = *reinterpret_cast<const uint4*>(p + 8);
  }
  if (t == 0) {
    s.g[0] = nvfp4_global_scale(*a.amax_row);
    if (a.columnwise) s.g[1] = nvfp4_global_scale(*a.amax_col);
  }
  if (a.columnwise) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = (t >> 2) + 64 * j;
#pragma unroll
      for (int h = 0; h < 2; ++h) s.tile[r][(2 * rb + h) ^ (r & 1)] = raw[j][h];
    }
  }
  __syncthreads();

  if (a.rowwise) {
    const Nvfp4GlobalScale g = s.g[0];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t m = m0 + (t >> 2) + 64 * j;
      const uint32_t w[8] = {raw[j][0].x, raw[j][0].y, raw[j][0].z, raw[j][0].w,
                             raw[j][1].x, raw[j][1].y, raw[j][1].z, raw[j][1].w};
      float v[16];
      float am = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[2 * i] = bf16_lo(w[i]);
        v[2 * i + 1] = bf16_hi(w[i]);
        am = amax_combine(am, v[2 * i]);
        am = amax_combine(am, v[2 * i + 1]);
      }
      const uint8_t sd = block_scale_fast(am, g.k);
      const float mult = nvfp4_block_multiplier(sd, g.s_dec);
      const int64_t idx0 = m * a.K + k0 + 16 * rb;
      const uint64_t packed = nvfp4_codes16<kSR, false>(v, mult, a.row_key, idx0);
      *reinterpret_cast<uint64_t*>(a.q + idx0 / 2) = packed;
      a.q_scale[m * (a.K / 16) + k0 / 16 + rb] = sd;
    }
  }

  if (a.columnwise) {
    const Nvfp4GlobalScale g = s.g[1];
    const int p = lane, mb = warp;  // columns 2p, 2p + 1; rows 16·mb .. +16
    float va[16], vb[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int r = mb * 16 + i;
      const uint32_t w = reinterpret_cast<const uint32_t*>(&s.tile[r][(p >> 2) ^ (r & 1)])[p & 3];
      va[i] = bf16_lo(w);
      vb[i] = bf16_hi(w);
    }
    uint64_t ca, cb;
    uint8_t sda, sdb;
    if (a.rht) {
      rht16_butterfly_f32(va);
      rht16_butterfly_f32(vb);
      float ama = 0.0f, amb = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        uint32_t pair;  // vb[i] in the high half, va[i] in the low half, each RN to bf16
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(vb[i]), "f"(va[i]));
        va[i] = bf16_lo(pair);
        vb[i] = bf16_hi(pair);
        ama = amax_combine(ama, va[i]);
        amb = amax_combine(amb, vb[i]);
      }
      sda = block_scale_fast(ama, g.k);
      sdb = block_scale_fast(amb, g.k);
      const int64_t idx_a = (k0 + 2 * p) * a.M + m0 + 16 * mb;
      ca = nvfp4_codes16<kSR, true>(va, nvfp4_block_multiplier(sda, g.s_dec), a.col_key, idx_a);
      cb = nvfp4_codes16<kSR, true>(vb, nvfp4_block_multiplier(sdb, g.s_dec), a.col_key,
                                    idx_a + a.M);
    } else {
      float ama = 0.0f, amb = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        ama = amax_combine(ama, va[i]);
        amb = amax_combine(amb, vb[i]);
      }
      sda = block_scale_fast(ama, g.k);
      sdb = block_scale_fast(amb, g.k);
      const int64_t idx_a = (k0 + 2 * p) * a.M + m0 + 16 * mb;
      ca = nvfp4_codes16<kSR, false>(va, nvfp4_block_multiplier(sda, g.s_dec), a.col_key, idx_a);
      cb = nvfp4_codes16<kSR, false>(vb, nvfp4_block_multiplier(sdb, g.s_dec), a.col_key,
                                     idx_a + a.M);
    }
    const int ks = (2 * p) ^ ((mb >> 1) << 2);  // even: bit 0 is never swizzled
    *reinterpret_cast<ulonglong2*>(&s.cp[mb][ks]) = make_ulonglong2(ca, cb);
    s.cs[mb][p] = uint16_t(sda | (uint32_t(sdb) << 8));
    __syncthreads();
    // Transposed row k of the tile: 64 bytes of codes (M-blocks 0..7) and 8 scale bytes.
    const int k = t >> 2, q = t & 3;
    const int kz = k ^ (q << 2);  // the swizzle of M-blocks 2q and 2q + 1
    const uint64_t lo = s.cp[2 * q][kz], hi = s.cp[2 * q + 1][kz];
    const uint16_t* cs16 = &s.cs[0][0];
    const uint32_t sc_lo =
        uint32_t(cs16[(2 * q) * (kV10K / 2) + (k >> 1)] >> (8 * (k & 1))) & 0xFFu;
    const uint32_t sc_hi =
        uint32_t(cs16[(2 * q + 1) * (kV10K / 2) + (k >> 1)] >> (8 * (k & 1))) & 0xFFu;
    *reinterpret_cast<ulonglong2*>(a.qt + (k0 + k) * (a.M / 2) + m0 / 2 + 16 * q) =
        make_ulonglong2(lo, hi);
    *reinterpret_cast<uint16_t*>(a.qt_scale + (k0 + k) * (a.M / 16) + m0 / 16 + 2 * q) =
        uint16_t(sc_lo | (sc_hi << 8));
  }
}

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
  uint8_t* qc;        // [M, K] columnwise codes, not transposed
  uint8_t* qc_scale;  // [M/32, K] e8m0
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
    quantize_block<32, kType, kSR>(v, mx_multiplier(e), a.col_key, (m0 + b * 32) * a.K + k0 + kk,
                                   a.K, codes);
#pragma unroll
    for (int i = 0; i < 32; ++i) s.cc[b * 32 + i][kk] = codes[i];
    if (k0 + kk < a.K && m0 + b * 32 < a.M) a.qc_scale[(m0 / 32 + b) * a.K + k0 + kk] = e;
  }
  __syncthreads();
  if (a.rowwise) store_codes(s.rc, kType, a.q, a.M, a.K, m0, k0);
  if (a.columnwise) store_codes(s.cc, kType, a.qc, a.M, a.K, m0, k0);
}

// MXFP8 v10: E4M3/E5M2, round to nearest, bf16 source, full 64×64 tiles. Thread t loads row
// t/4, granules 2·(t%4) and +1 (32 contiguous bytes, all loads in flight before any use); a
// rowwise 1×32 block is held by lanes t, t^1 (amax combined by one shuffle), each quantizes its
// 16 elements from registers and stores 16 bytes (4 lanes: a row's 64 bytes).
// Columnwise 32×1 blocks: the tile is staged as bf16 granules, row r keeping granule g at
// g ^ (r & 1) ^ 2·((r / 8) % 4); thread task = column pair p (one 4-byte word per row),
// M-block mb, rows 8·qq .. +8 of the block (lane = qq + 4·(p % 8), so the 4 quarters of a
// block are lanes of one warp: amax by two shuffles; the 4 rows a warp reads per instruction
// then lie on different banks). Column codes are staged per row (16-byte chunk c of row r at
// c ^ ((r / 8) % 4)) and written as 16 bytes per thread. Every value is the same operation on
// the same operands as in mx_kernel (v8).
template <bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    mx8_v10_kernel(const uint16_t* __restrict__ x, MxArgs a) {
  constexpr DType kType = kE5M2 ? DType::kE5M2 : DType::kE4M3;
  __shared__ uint4 tile[kT][kT / 8];  // bf16 granules, swizzled (8 KB)
  __shared__ uint4 cc[kT][kT / 16];   // columnwise codes, 16-byte chunks, swizzled (4 KB)
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t m0 = int64_t(blockIdx.x) * kT, k0 = int64_t(blockIdx.y) * kT;
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
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int rr = 32 * mb + 8 * qq + i;
    const uint32_t pair = cvt_fp8x2(mul_rn(va[i], ma), mul_rn(vb[i], mbm), kE5M2);
    // Byte 2p of row rr: chunk p / 8, offset 2·(p % 8) in it.
    uint8_t* row = reinterpret_cast<uint8_t*>(&cc[rr][0]);
    *reinterpret_cast<uint16_t*>(row + 16 * ((p >> 3) ^ ((rr >> 3) & 3)) + 2 * (p & 7)) =
        uint16_t(pair);
  }
  if (qq == 0) {
    *reinterpret_cast<uint16_t*>(a.qc_scale + (m0 / 32 + mb) * a.K + k0 + 2 * p) =
        uint16_t(ea | (uint32_t(eb) << 8));
  }
  __syncthreads();
  *reinterpret_cast<uint4*>(a.qc + (m0 + r) * a.K + k0 + 16 * c4) = cc[r][c4 ^ ((r >> 3) & 3)];
}

template <typename K>
void set_smem(K kern) {
  LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(sizeof(TileSmem))));
}

}  // namespace

template <typename T>
void nvfp4(const T* x, int64_t M, int64_t K, bool rowwise, bool columnwise, bool rht, bool sr,
           bool two_d, RngKey row_key, RngKey col_key, uint8_t* q, uint8_t* q_scale, uint8_t* qt,
           uint8_t* qt_scale, float* amax_row, float* amax_col, bool amax_ready,
           cudaStream_t stream) {
  if (M == 0 || K == 0) return;
  const dim3 grid(unsigned(ceil_div(M, kT)), unsigned(ceil_div(K, kT)));
  Nvfp4Args a{M,       K, rowwise, columnwise, rht,      sr,       two_d,   row_key,
              col_key, q, q_scale, qt,         qt_scale, amax_row, amax_col};
  const bool v9 = !legacy_kernels();
  auto amax_pass = nvfp4_kernel<T, Pass::kAmax, false, false>;
  auto quant_pass = v9 ? (sr ? nvfp4_kernel<T, Pass::kQuantize, true, true>
                             : nvfp4_kernel<T, Pass::kQuantize, false, true>)
                       : (sr ? nvfp4_kernel<T, Pass::kQuantize, true, false>
                             : nvfp4_kernel<T, Pass::kQuantize, false, false>);
  // v10 (default): bf16, 1×16 blocks, full 128×64 tiles, 16-byte aligned source; v9/v8 for every
  // other case and under LOWBIT_QUANT_KERNELS=v9 / v8.
  const bool v10 = quant_kernels_version() >= 10 && std::is_same_v<T, uint16_t> && !two_d &&
                   M % kV10M == 0 && K % kV10K == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (!v10) set_smem(quant_pass);
  if (!amax_ready) {
    const bool v9_amax = v9 && std::is_same_v<T, uint16_t> && M % 16 == 0 && K % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (v9_amax) {
      const int64_t n_tasks = (M / 16) * (K / 8);
      nvfp4_amax_v9_kernel<<<unsigned(ceil_div(n_tasks, int64_t(kThreads))), kThreads, 0, stream>>>(
          reinterpret_cast<const uint16_t*>(x), M, K, rowwise || two_d, columnwise && !two_d, rht,
          amax_row, amax_col);
    } else {
      set_smem(amax_pass);
      amax_pass<<<grid, kThreads, sizeof(TileSmem), stream>>>(x, a);
    }
    LOWBIT_CUDA_CHECK_LAUNCH();
  }
  if (v10) {
    const dim3 grid10(unsigned(M / kV10M), unsigned(K / kV10K));
    const auto* xb = reinterpret_cast<const uint16_t*>(x);
    if (sr) {
      nvfp4_quant_v10_kernel<true><<<grid10, kThreads, 0, stream>>>(xb, a);
    } else {
      nvfp4_quant_v10_kernel<false><<<grid10, kThreads, 0, stream>>>(xb, a);
    }
  } else {
    quant_pass<<<grid, kThreads, sizeof(TileSmem), stream>>>(x, a);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

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
  // v10 (default): MXFP8 with round to nearest, bf16, full 64×64 tiles, 16-byte aligned source.
  if (quant_kernels_version() >= 10 && std::is_same_v<T, uint16_t> && !sr &&
      (t == DType::kE4M3 || t == DType::kE5M2) && M % kT == 0 && K % kT == 0 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const auto* xb = reinterpret_cast<const uint16_t*>(x);
    if (t == DType::kE5M2) {
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

#define LOWBIT_INSTANTIATE(T)                                                                      \
  template void nvfp4<T>(const T*, int64_t, int64_t, bool, bool, bool, bool, bool, RngKey, RngKey, \
                         uint8_t*, uint8_t*, uint8_t*, uint8_t*, float*, float*, bool,             \
                         cudaStream_t);                                                            \
  template void mx<T>(const T*, int64_t, int64_t, DType, MxScaleRounding, bool, bool, bool,        \
                      RngKey, RngKey, uint8_t*, uint8_t*, uint8_t*, uint8_t*, cudaStream_t);
LOWBIT_INSTANTIATE(uint16_t)
LOWBIT_INSTANTIATE(float)
#undef LOWBIT_INSTANTIATE

}  // namespace lowbit::quant_cuda

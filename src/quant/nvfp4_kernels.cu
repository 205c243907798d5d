// NVFP4 quantization kernels (E2M1 data, UE4M3 scale per 16 elements, fp32 global amax;
// formats.md §2.6, §5).
//
// NVFP4 needs the global amax first, so it runs twice over the source: an amax pass (plain amax
// and, for RHT copies, the amax after the 16-point Hadamard transform), then the quantize pass,
// which writes the rowwise copy and the columnwise copy transposed (RHT'd when asked). Every
// number comes from the shared scale math (quant/scale_math.h, quant/hadamard16.h,
// quant/e2m1_fast.h), so the results equal the CPU twin bit for bit.
//
// Kernel generations (LOWBIT_QUANT_KERNELS selects an older one for A/B runs, quant_cuda.h):
//  * nvfp4_kernel (v8, v9): the generic tile kernel, 64×64 fp32 tiles in shared memory; every
//    shape, fp32 sources, 16×16 blocks off full bf16 tiles or with stochastic rounding.
//  * nvfp4_amax_v9_kernel: the amax pass for bf16 sources, no shared memory.
//  * nvfp4_quant_v11_kernel (default): the 1×16 quantize pass for bf16 full 128×64 tiles, with a
//    persistent grid that prefetches the next tile, the block multipliers from a table, and the
//    E2M1 encoders of e2m1_fast.h; since v13 also 16×16 blocks (weights) without stochastic
//    rounding (kTwoD). (v10, the same tiles one per block with the generic encoders, is gone:
//    LOWBIT_QUANT_KERNELS=v10 runs v9's kernels for NVFP4.)
#include <type_traits>

#include "core/device_attr.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/core/philox.h"
#include "lowbit/quant/e2m1_fast.h"
#include "lowbit/quant/hadamard16.h"
#include "lowbit/quant/layout.h"
#include "quant/block_tile.cuh"
#include "quant/cuda_common.cuh"
#include "quant/quant_cuda.h"

namespace lowbit::quant_cuda {

namespace {

enum class Pass { kAmax, kQuantize };

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
  int group_m = 0;    // v11: tiles walked in groups of group_m M-tiles (0: M fastest)
};

__device__ __forceinline__ float fma_rn_zero(float a, float b) {  // RN(a · b + 0), never fused away
  float r;
  asm("fma.rn.f32 %0, %1, %2, 0f00000000;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// 16 values → 16 packed E2M1 codes (element i in nibble i) of RN(v·mult) (kZeroFix: RN(v·mult+0)),
// or with stochastic rounding from the Philox stream at indices idx0 + i·stride.
template <bool kSR, bool kZeroFix>
__device__ __forceinline__ uint64_t nvfp4_codes16(float (&v)[16], float mult, RngKey key,
                                                  int64_t idx0, int64_t stride = 1) {
  if constexpr (kSR) {
    if constexpr (kZeroFix) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = __fadd_rn(v[i], 0.0f);
    }
    uint8_t codes[16];
    quantize_block<16, DType::kE2M1, true>(v, mult, key, idx0, stride, codes);
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
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = s.x[r][rb * 16 + i];
      s.rp[r][rb] = nvfp4_codes16<kSR, false>(v, mult, a.row_key, (m0 + r) * a.K + k0 + rb * 16, 1);
      if (a.columnwise) {
        // Column task (kk, mb): the 16 values of tile (mb, kk / 16) in column kk, with the
        // tile's scale recomputed from the same 16 row-block amaxes (a max: the same bits as the
        // row task's), so every code equals its rowwise twin — the exact transpose, written
        // packed like the 1×16 columnwise copy (with SR, the rowwise stream's bits at stride K).
        float tc = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) tc = amax_combine(tc, s.part[mb * 16 + i][kk / 16]);
        const float mc = nvfp4_block_multiplier(block_scale_fast(tc, g_row.k), g_row.s_dec);
        float w[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) w[i] = s.x[mb * 16 + i][kk];
        s.cp[kk][mb] =
            nvfp4_codes16<kSR, false>(w, mc, a.row_key, (m0 + mb * 16) * a.K + k0 + kk, a.K);
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
    {
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
// amax; the max is order-independent, so the result is deterministic. With `acc` (the
// Context's reduction words, acc [3]: row max bits, column max bits, finished blocks; zero on
// entry and left zero) the blocks fold into acc and the last one writes *amax_row and *amax_col
// (grid_max_last_block), so the outputs need no zeroing; without it they fold into the (zeroed)
// outputs directly.
// Preconditions (checked by the launcher): bf16, M % 16 == 0, K % 8 == 0, x 16-byte aligned.
// 2 blocks per SM (128 registers, no spills; 1 block per SM compiled to 120-146 registers): the
// 8192² two-pass quantization 0.182 → 0.170 ms on the H100 together with the quantize pass at 3
// blocks per SM, which accounts for ~0.006 ms of it (same-call A/B).
__global__ void __launch_bounds__(kThreads, 2)
    nvfp4_amax_v9_kernel(const uint16_t* __restrict__ x,  // [M, K] bf16
                         int64_t M, int64_t K, bool want_row, bool want_col, bool rht,
                         uint32_t* acc, float* amax_row, float* amax_col) {
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
  if (acc == nullptr) {
    block_amax_to_global(ra, amax_row);
    block_amax_to_global(ca, amax_col);
    return;
  }
  float amax[2];
  if (grid_max_last_block<2>({ra, ca}, acc, amax)) {
    if (amax_row != nullptr) *amax_row = amax[0];
    if (amax_col != nullptr) *amax_col = amax[1];
  }
}

// ---- NVFP4 quantize pass: 1×16 blocks, bf16 source, full 128×64 tiles ----------------------
//
// The tile and its thread tasks (nvfp4_quant_v11_kernel, below, adds persistence, prefetch and
// faster encoders to this layout). Thread block: a 128 (M) × 64 (K) tile, 256 threads.
//  * Loads: thread t owns the rowwise blocks (row t/4 + 64j, K-block t%4), j = 0, 1: two
//    16-byte loads each, all four in flight before any use. The rowwise copy of these blocks is
//    quantized by the same thread (v11 reads its granules back from shared memory, see there)
//    and stored as 8 bytes per block (4 lanes write a row's 32 contiguous bytes).
//  * The tile is staged in shared memory as bf16 16-byte granules (16 KB, one STS.128 per 8
//    elements): row r keeps granule g at g ^ (r & 1), so that the two rows of a quarter-warp
//    store land on different banks; a row read as 32 words still touches every bank once.
//  * Columnwise: thread (pair p = lane, M-block mb = warp) reads the 16 words of its rows that
//    hold columns 2p and 2p + 1 (one LDS.32 per two elements, conflict-free), transforms and
//    quantizes both 16-element chunks, and stages the two packed code words (one STS.128) and
//    scales; then thread (k = t/4, q = t%4) writes 16 bytes of transposed row k (4 lanes: 64
//    contiguous bytes) and two scale bytes.
//  * The RHT rounding by cvt.rn.bf16x2, two columns per instruction, with the "+0 for a zero
//    result" of the definition folded into the scaling as RN(y · m + 0) (equal to RN(y · m)
//    except that a zero product is +0, and a zero y gives a zero product: m is finite and
//    positive).
// Every value is computed by the same operations as in nvfp4_kernel (v9), element by element,
// and the stochastic-rounding streams use the same indices (quantize_block).

// Transposed row k = t / 4 of a 128×64 tile's columnwise copy:
// 64 bytes of codes for M-blocks 0..7, from the swizzled cp, and 8 scale bytes, from cs; thread
// t writes M-blocks 2q and 2q + 1 (q = t % 4).
template <typename Smem>
__device__ __forceinline__ void store_col_tile_row(const Smem& s, const Nvfp4Args& a, int64_t m0,
                                                   int64_t k0, int t) {
  constexpr int kHalfK = int(sizeof(s.cs[0]) / sizeof(uint16_t));  // scale words per M-block
  const int k = t >> 2, q = t & 3;
  const int kz = k ^ (q << 2);  // the swizzle of M-blocks 2q and 2q + 1
  const uint64_t lo = s.cp[2 * q][kz], hi = s.cp[2 * q + 1][kz];
  const uint16_t* cs16 = &s.cs[0][0];
  const uint32_t sc_lo = uint32_t(cs16[(2 * q) * kHalfK + (k >> 1)] >> (8 * (k & 1))) & 0xFFu;
  const uint32_t sc_hi = uint32_t(cs16[(2 * q + 1) * kHalfK + (k >> 1)] >> (8 * (k & 1))) & 0xFFu;
  *reinterpret_cast<ulonglong2*>(a.qt + (k0 + k) * (a.M / 2) + m0 / 2 + 16 * q) =
      make_ulonglong2(lo, hi);
  *reinterpret_cast<uint16_t*>(a.qt_scale + (k0 + k) * (a.M / 16) + m0 / 16 + 2 * q) =
      uint16_t(sc_lo | (sc_hi << 8));
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// ---- NVFP4 quantize pass, v11 (default): 1×16 (and, v13, 16×16) blocks, bf16, full 128×64 tiles
//
// The tile, thread tasks and staging layout above, with the work per element cut down against
// the first kernel of that layout (v10: one tile per block, since removed) and the loads kept in
// flight:
//  * Persistent grid: a block walks the tiles b, b + gridDim.x, ... (M fastest, as every grid
//    here, for the locality of the transposed writes; in groups of M-tiles from 64 M elements
//    without SR, see the kernel) and issues the four 16-byte loads of its
//    next tile before it quantizes the current one, so a tile's 16 KB are in flight while the
//    previous one is computed (one tile per block: load, wait, compute, exit; nothing in flight
//    while a block computes, which is most of its life).
//  * Block multipliers from a table: m = nvfp4_block_multiplier(sd, s_dec) depends only on the
//    7-bit scale code and the copy's s_dec, so a block computes the 2 × 128 values once into
//    shared memory; a 1×16 block then costs one LDS instead of a decode and an RN reciprocal.
//  * Codes by e2m1_fast.h: round to nearest in 4 fp32 instructions per code (3 where no block of
//    the warp needs the clamp; the trim below), stochastic rounding
//    from integer operations on the product's bits (before: e2m1_rn_fast, ~13, and the generic
//    codec for SR), nibbles summed in place and the 8 sign bits of a word gathered by byte
//    permutes. The encoders are exact for every input but NaN, so:
//  * Block amaxes on packed bf16 pairs, NaN propagating: max.NaN.xorsign.abs.bf16x2 takes
//    max |.| of two pairs per instruction (rowwise: the loaded words; columnwise: the words of
//    cvt.rn.bf16x2, both chunks at once). A block whose amax comes out NaN holds a NaN; it takes
//    the generic path (amax_combine, which skips NaN, and the codec, which writes NaN as +6).
//  * RHT stage 1 fused with the ±1/4 step (rht16_butterfly_f32_fused, the same values).
// Per source element (both copies, RHT on) that was ~37 instructions (28 after the trim below)
// against the one-tile kernel's 45-50; every value is the same operation on the same operands as
// in nvfp4_kernel (v9), the Philox indices included.
//
// Instruction trim of the round-to-nearest path (same codes, scales and indices; SASS of one loop
// iteration of the hot path, 32 source elements per thread, RHT on, no NaN: 1198 → 897; 961
// when a warp holds a block that needs the clamp):
//  * E2M1 magnitudes by two lines instead of three (e2m1_rn_mag2_biased: the binade change of
//    fp32 at 2^24 is the quantum change of E2M1 at 4), 4 fp32 instructions per code instead of 6;
//    none saturates when every |RN(v·m)| of the warp's blocks is below 7, i.e. RN(amax·m) < 7
//    (e2m1_rn_mag2_biased_below7, 3 per code; a warp vote picks the variant).
//  * Signs without shifts: byte permutes with sign replication (e2m1_or_sign_bytes), rowwise
//    from the bf16 words themselves (RN(v·m) with m > 0 has the sign bit of v): 6 (rowwise) or 8
//    instructions per 8 codes instead of 9.
//  * Loop: the tile coordinates and offsets advance by additions (no 64-bit division per tile),
//    the next tile's registers go to shared memory at the end of the iteration and the rowwise
//    blocks read the thread's own granules back (4 LDS.128 instead of 16 register moves).
constexpr int kV11M = 128;  // tile rows (M)
constexpr int kV11K = 64;   // tile columns (K): 8 granules of 8 bf16

struct Nvfp4V11Smem {
  uint4 tile[kV11M][kV11K / 8];        // bf16 granules, swizzled: [r][g ^ (r & 1)]
  uint64_t cp[kV11M / 16][kV11K];      // packed column codes [mb][k ^ 4·(mb / 2)]
  uint16_t cs[kV11M / 16][kV11K / 2];  // column scales [mb][k / 2], two per word (k even low)
  float mult[2][128];  // block multiplier by scale code: [0] rowwise, [1] columnwise
  uint8_t ts[kV11M / 16][kV11K / 16];  // 16×16 blocks (kTwoD): scale code of block [mb][kb]
};

// Two scale codes at once (lo, hi): block_scale_fast of both with one cvt.
__device__ __forceinline__ uint32_t block_scale_pair(float amax_lo, float amax_hi, float k) {
  return cvt_fp8x2(fmin_num(mul_rn(amax_lo, k), f32_max_finite()),
                   fmin_num(mul_rn(amax_hi, k), f32_max_finite()), false);
}

// 16 values (no NaN) → 16 packed E2M1 codes of RN(v·mult) (kZeroFix: RN(v·mult + 0), see the tile
// comment), or with stochastic rounding by the Philox stream at indices idx0 + i (idx0 % 16 == 0:
// one Philox block for the sixteen codes, a byte each, as quantize_block and sr_bits). kBelow7
// (round to nearest only): every |RN(v·mult)| is below 7, so the encoder needs no clamp
// (e2m1_rn_mag2_biased_below7).
template <bool kSR, bool kZeroFix, bool kBelow7 = false>
__device__ __forceinline__ uint64_t nvfp4_codes16_fast(const float (&v)[16], float mult, RngKey key,
                                                       int64_t idx0) {
  Philox4 rnd{};
  if constexpr (kSR) rnd = philox_block(key.seed, key.offset, uint64_t(idx0) >> 4);
  uint32_t word[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float p[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      p[i] = kZeroFix ? fma_rn_zero(v[8 * h + i], mult) : mul_rn(v[8 * h + i], mult);
    }
    if constexpr (kSR) {
      // Bytes 8h .. 8h + 7 of the block's Philox draw (words 2h and 2h + 1), as sr_bits.
      uint32_t r[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] = sr_bits_in_block(rnd, 8 * h + j);
      word[h] = e2m1_pack8_sr(p, r);
    } else {
      word[h] = e2m1_pack8_rn2<kBelow7>(p);  // = e2m1_pack8_rn(p), two-line magnitudes
    }
  }
  return (uint64_t(word[1]) << 32) | word[0];
}

// The 16 bf16 values of words w[0..7] (element 2i low, 2i + 1 high) as fp32.
__device__ __forceinline__ void unpack16(const uint32_t (&w)[8], float (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = bf16_lo(w[i]);
    v[2 * i + 1] = bf16_hi(w[i]);
  }
}

// Rowwise block (16 values in w) with scale code sd: packed codes, fast unless the block holds
// NaN (then the generic codec path). kBelow7 as in nvfp4_codes16_fast.
template <bool kSR, bool kBelow7 = false>
__device__ __forceinline__ uint64_t nvfp4_row_codes_v11(const uint32_t (&w)[8], bool has_nan,
                                                        float mult, RngKey key, int64_t idx0) {
  float v[16];
  unpack16(w, v);
  if (has_nan) return nvfp4_codes16<kSR, false>(v, mult, key, idx0);
  if constexpr (!kSR) {
    // RN(v·mult) with mult > 0 (a table value: positive and finite, see nvfp4_block_multiplier)
    // has the sign bit of v, so the signs are gathered from the bf16 words themselves.
    uint32_t word[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float p[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) p[i] = mul_rn(v[8 * h + i], mult);
      const uint32_t wh[4] = {w[4 * h], w[4 * h + 1], w[4 * h + 2], w[4 * h + 3]};
      word[h] = e2m1_pack8_rn2_bf16<kBelow7>(p, wh);
    }
    return (uint64_t(word[1]) << 32) | word[0];
  } else {
    return nvfp4_codes16_fast<kSR, false>(v, mult, key, idx0);
  }
}

// Columnwise pair of chunks (a: low halves of w, b: high halves), scale codes sda, sdb: packed
// codes of both. kZeroFix with RHT (the "+0 for a zero result" of the transform); kBelow7 as in
// nvfp4_codes16_fast.
template <bool kSR, bool kZeroFix, bool kBelow7 = false>
__device__ __forceinline__ void nvfp4_col_codes_v11(const uint32_t (&w)[16], bool has_nan, float ma,
                                                    float mb, RngKey key, int64_t idx_a,
                                                    int64_t idx_b, uint64_t& ca, uint64_t& cb) {
  float va[16], vb[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    va[i] = bf16_lo(w[i]);
    vb[i] = bf16_hi(w[i]);
  }
  if (has_nan) {
    ca = nvfp4_codes16<kSR, kZeroFix>(va, ma, key, idx_a);
    cb = nvfp4_codes16<kSR, kZeroFix>(vb, mb, key, idx_b);
  } else {
    ca = nvfp4_codes16_fast<kSR, kZeroFix, kBelow7>(va, ma, key, idx_a);
    cb = nvfp4_codes16_fast<kSR, kZeroFix, kBelow7>(vb, mb, key, idx_b);
  }
}

// Thread t's part of the tile whose first element is x[T] (T = m0·K + k0): rows t/4 and t/4 + 64,
// granules 2·(t % 4) and +1, from xt = x + (t/4)·K + 16·(t % 4).
__device__ __forceinline__ void nvfp4_v11_load(const uint16_t* __restrict__ xt, int64_t K,
                                               uint64_t T, uint4 (&raw)[2][2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint16_t* p = xt + T + 64 * j * K;
    raw[j][0] = *reinterpret_cast<const uint4*>(p);
    raw[j][1] = *reinterpret_cast<const uint4*>(p + 8);
  }
}

// Preconditions (checked by the launcher): two_d == kTwoD, M % 128 == 0, K % 64 == 0, x 16-byte
// aligned; the grid is at most the number of tiles. Outputs as in nvfp4_kernel.
// Blocks per SM: 3 without stochastic rounding (80 registers, no spills; at 2 blocks the 16 warps
// per SM issued 0.70 instructions per scheduler-cycle under ncu, and 3 blocks cut the 8192²
// pass 0.1216 → 0.1154 ms on the H100; 4 blocks at 64 registers ran the same as 3), 2 with it
// (3 spill 320 bytes and run slower).
// Loop structure (per tile, no division and no register copies): the tile is in s.tile when the
// iteration starts (barrier A); the next tile's loads go out into registers; the rowwise blocks
// read the thread's own granules back from s.tile (4 LDS.128 instead of carrying the loaded
// registers across the loop: 16 moves); after barrier B (codes staged, every read of s.tile
// done) the columnwise copy is stored and the next tile's registers are written into s.tile.
//
// kTwoD (v13): 16×16 blocks (weights), round to nearest. The column task runs first: the two
// chunk amaxes of a thread and the 8 lanes that share a 16×16 block (lanes 8kb .. 8kb + 7 hold
// its 16 columns) give the block amax by three shuffles, hence its scale, which both copies use
// (block_scale_fast of the global amax_row, as nvfp4_kernel); the codes of a column are then
// exactly the transposed rowwise codes. The rowwise task runs after barrier B, reading the scale
// from s.ts (its own granules are still in s.tile: only their owner writes them).
template <bool kSR, bool kTwoD = false>
__global__ void __launch_bounds__(kThreads, kSR ? 2 : 3)
    nvfp4_quant_v11_kernel(const uint16_t* __restrict__ x, Nvfp4Args a) {
  static_assert(!(kSR && kTwoD), "16x16 blocks with stochastic rounding take nvfp4_kernel");
  __shared__ Nvfp4V11Smem s;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int rb = t & 3;   // rowwise K-block of this thread
  const int rr = t >> 2;  // rowwise rows rr and rr + 64 of the tile
  const int rs = rr & 1;  // their granule swizzle ((rr + 64) & 1 == rr & 1)
  const int64_t K = a.K, M = a.M;
  // Tile (mi, ki): rows 128·mi.., columns 64·ki..; tile index mi + mt·ki (M fastest). The block
  // walks the tiles b, b + G, b + 2G, ... (G = gridDim.x), i.e. (mi, ki) += (G % mt, G / mt) with
  // a carry: no division in the loop. int is enough: a tile is 16 KB of bf16, so the tile counts
  // (and G ≤ their product) are far below 2^31 for any tensor that fits in device memory.
  const int mt = int(M / kV11M), kt = int(K / kV11K);
  const int G = int(gridDim.x), dmi = G % mt, dki = G / mt;
  int mi = int(blockIdx.x) % mt, ki = int(blockIdx.x) / mt;
  // Grouped walk (a.group_m = gm > 0): tile t → group g = t / (gm·kt) of gm M-tiles (the last
  // group may be narrower), M fastest within the group, then K. The resident tiles then span
  // gm·128 rows of x instead of all M rows: at 128 M elements the M-fastest walk's warps stall
  // longer on memory (16384 × 8192: 0.60 warps issued per scheduler-cycle against 0.67 at 64 M
  // elements, same DRAM and L2 rates), and groups of 16 took the pass 0.244 → 0.208 ms there
  // (59 → 69 % of copy) and 0.1034 → 0.1002 ms at 8192², while below 64 M elements (x within a
  // few L2 sizes) M fastest stays faster (bench/results/h100-2026-11-26/nvfp4-tile-groups-1045).
  // The coordinates cost two integer divisions per 8192-element tile.
  const int gm = a.group_m;
  int t_cur = int(blockIdx.x);
  const int n_tiles = mt * kt;
  auto coords = [&](int t, int& m_i, int& k_i) {
    const int full = mt / gm, gsize = gm * kt, g = t / gsize;
    if (g < full) {
      const int r = t - g * gsize;
      m_i = g * gm + r % gm;
      k_i = r / gm;
    } else {
      const int r = t - full * gsize, gw = mt - full * gm;
      m_i = full * gm + r % gw;
      k_i = r / gw;
    }
  };
  if (gm > 0) {
    if (t_cur < n_tiles) {
      coords(t_cur, mi, ki);
    } else {
      ki = kt;
    }
  }
  // T = m0·K + k0 (the tile's first element in x, [M, K]) and Tt = k0·M + m0 (its place in the
  // transposed [K, M] copy) move with (mi, ki): + (dmi·128·K + dki·64, dki·64·M + dmi·128), and
  // a carry (mi wraps: mi - mt, ki + 1) adds (64 - M·K, 64·M - M) more. Unsigned (both are
  // non-negative), so T / 2 and T / 16 are plain shifts.
  const uint64_t dT = uint64_t(dmi) * (kV11M * K) + uint64_t(kV11K) * dki;
  const uint64_t dTt = uint64_t(dki) * (kV11K * M) + uint64_t(kV11M) * dmi;
  const uint64_t cT = uint64_t(kV11K) - uint64_t(M) * uint64_t(K);  // mod 2^64
  const uint64_t cTt = uint64_t(kV11K - 1) * uint64_t(M);
  uint64_t T = ki < kt ? uint64_t(mi) * (kV11M * K) + uint64_t(kV11K) * ki : 0;
  uint64_t Tt = ki < kt ? uint64_t(ki) * (kV11K * M) + uint64_t(kV11M) * mi : 0;
  // Per-thread offsets, fixed over the loop (a tile adds T to the [M, K] ones, T / 2 for packed
  // codes, T / 16 for scales, and Tt, Tt / 2, Tt / 16 to the [K, M] ones: M and K are multiples
  // of 128 and 64, so every division is exact).
  const uint16_t* const xt = x + int64_t(rr) * K + 16 * rb;
  const uint64_t q_off = uint64_t(rr) * (K / 2) + 8 * rb;  // a.q, row rr (row rr + 64: + 32·K)
  const uint64_t qs_off = uint64_t(rr) * (K / 16) + rb;    // a.q_scale (row rr + 64: + 4·K)
  const uint64_t qt_off = uint64_t(t >> 2) * (M / 2) + 16 * (t & 3);   // a.qt (column store)
  const uint64_t qts_off = uint64_t(t >> 2) * (M / 16) + 2 * (t & 3);  // a.qt_scale
  // Every thread derives the global scales (the amaxes are final when the kernel starts); the
  // multiplier tables are published by the first __syncthreads of the loop.
  const Nvfp4GlobalScale g_row = nvfp4_global_scale(*a.amax_row);
  // 16×16 blocks: both copies from amax_row (the columnwise copy is the transposed rowwise one).
  const Nvfp4GlobalScale g_col = a.columnwise && !kTwoD ? nvfp4_global_scale(*a.amax_col) : g_row;
  if (t < 128) {
    s.mult[0][t] = nvfp4_block_multiplier(uint8_t(t), g_row.s_dec);
  } else {
    s.mult[1][t - 128] = nvfp4_block_multiplier(uint8_t(t - 128), g_col.s_dec);
  }

  // The thread's two rows of a tile in s.tile: granules 2·rb + h, swizzled by the row parity.
  uint4* const own[2][2] = {{&s.tile[rr][(2 * rb) ^ rs], &s.tile[rr][(2 * rb + 1) ^ rs]},
                            {&s.tile[rr + 64][(2 * rb) ^ rs], &s.tile[rr + 64][(2 * rb + 1) ^ rs]}};
  if (ki < kt) {
    uint4 raw[2][2];  // [j][half]: row rr + 64j, granules 2·rb + half
    nvfp4_v11_load(xt, K, T, raw);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) *own[j][h] = raw[j][h];
    }
  }
  while (ki < kt) {
    int mi_next = mi + dmi, ki_next = ki + dki;
    uint64_t T_next = T + dT, Tt_next = Tt + dTt;
    if (mi_next >= mt) {
      mi_next -= mt;
      ++ki_next;
      T_next += cT;
      Tt_next += cTt;
    }
    if (gm > 0) {  // the grouped walk replaces the step above
      t_cur += G;
      if (t_cur < n_tiles) {
        coords(t_cur, mi_next, ki_next);
        T_next = uint64_t(mi_next) * (kV11M * K) + uint64_t(kV11K) * ki_next;
        Tt_next = uint64_t(ki_next) * (kV11K * M) + uint64_t(kV11M) * mi_next;
      } else {
        ki_next = kt;
      }
    }
    const bool has_next = ki_next < kt;
    __syncthreads();  // A: s.tile holds the tile; s.cp and s.cs are free again
    // The next tile's loads go out now and land while this tile is quantized.
    uint4 next[2][2];
    if (has_next) nvfp4_v11_load(xt, K, T_next, next);

    // Rowwise task: rows rr and rr + 64, K-block rb (1×16: before barrier B; 16×16: after it).
    auto quantize_rows = [&]() {
      uint32_t w[2][8];
      uint32_t am16[2];
      bool nan[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4 lo = *own[j][0], hi = *own[j][1];  // the thread's own granules (its loads)
        const uint32_t ww[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) w[j][i] = ww[i];
        const uint32_t m = bf16x2_absmax_tree(w[j]);
        nan[j] = bf16x2_any_nan(m);
        am16[j] = max(m & 0xFFFFu, m >> 16);
      }
      float am[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        am[j] = __uint_as_float(am16[j] << 16);
        if (nan[j]) {  // rare: the amax that skips NaN
          float v[16];
          unpack16(w[j], v);
          am[j] = 0.0f;
#pragma unroll
          for (int i = 0; i < 16; ++i) am[j] = amax_combine(am[j], v[i]);
        }
      }
      uint32_t sd[2];
      if constexpr (kTwoD) {  // the 16×16 blocks' scales, from the column task
        sd[0] = s.ts[rr >> 4][rb];
        sd[1] = s.ts[(rr >> 4) + 4][rb];
      } else {
        const uint32_t sd2 = block_scale_pair(am[0], am[1], g_row.k);
        sd[0] = sd2 & 0xFFu;
        sd[1] = (sd2 >> 8) & 0xFFu;
      }
      uint64_t packed[2];
      if constexpr (kSR) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int64_t idx0 = int64_t(T) + (rr + 64 * j) * K + 16 * rb;  // m·K + k0 + 16·rb
          packed[j] = nvfp4_row_codes_v11<true>(w[j], nan[j], s.mult[0][sd[j]], a.row_key, idx0);
        }
      } else {
        const float mult[2] = {s.mult[0][sd[0]], s.mult[0][sd[1]]};
        // The encoder needs no clamp when every |RN(v·mult)| is below 7, i.e. when
        // RN(amax·mult) < 7 (RN is monotonic and |v| ≤ amax), for both blocks of every lane of
        // the warp: a warp-uniform choice (a NaN block takes the codec either way; | and &
        // evaluate both sides without branches).
        const bool ok0 = nan[0] | (mul_rn(am[0], mult[0]) < 7.0f);
        const bool ok1 = nan[1] | (mul_rn(am[1], mult[1]) < 7.0f);
        if (__all_sync(0xFFFFFFFFu, ok0 & ok1)) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            packed[j] = nvfp4_row_codes_v11<false, true>(w[j], nan[j], mult[j], a.row_key, 0);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            packed[j] = nvfp4_row_codes_v11<false>(w[j], nan[j], mult[j], a.row_key, 0);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // rows rr + 64j: 8 bytes of codes, one scale byte
        *reinterpret_cast<uint64_t*>(a.q + ((T >> 1) + q_off + uint64_t(j) * 32 * K)) = packed[j];
        a.q_scale[(T >> 4) + qs_off + uint64_t(j) * 4 * K] = uint8_t(sd[j]);
      }
    };
    if constexpr (!kTwoD) {
      if (a.rowwise) quantize_rows();
    }

    if (a.columnwise || kTwoD) {
      const int p = lane, mb = warp;  // columns 2p, 2p + 1; rows 16·mb .. +16
      uint32_t w[16];                 // row i: column 2p low, 2p + 1 high
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int r = mb * 16 + i;
        w[i] = reinterpret_cast<const uint32_t*>(&s.tile[r][(p >> 2) ^ (r & 1)])[p & 3];
      }
      if (!kTwoD && a.rht) {
        float va[16], vb[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          va[i] = bf16_lo(w[i]);
          vb[i] = bf16_hi(w[i]);
        }
        rht16_butterfly_f32_fused(va);
        rht16_butterfly_f32_fused(vb);
#pragma unroll
        for (int i = 0; i < 16; ++i) {  // RN to bf16, both chunks per instruction
          asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(vb[i]), "f"(va[i]));
        }
      }
      const uint32_t m = bf16x2_absmax_tree(w);
      const bool nan = bf16x2_any_nan(m);
      float ama = __uint_as_float(m << 16), amb = __uint_as_float(m & 0xFFFF0000u);
      if (nan) {  // rare: the amaxes that skip NaN
        ama = 0.0f;
        amb = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          ama = amax_combine(ama, bf16_lo(w[i]));
          amb = amax_combine(amb, bf16_hi(w[i]));
        }
      }
      uint32_t sd2;
      if constexpr (kTwoD) {
        // Block amax over the 8 lanes of the 16×16 block (non-negative, NaN-free: fmaxf is the
        // max of amax_combine), then the block's scale for both chunks and both copies.
        float am = fmaxf(ama, amb);
#pragma unroll
        for (int d = 1; d < 8; d *= 2) am = fmaxf(am, __shfl_xor_sync(0xFFFFFFFFu, am, d));
        const uint32_t sd = block_scale_fast(am, g_row.k);
        if ((lane & 7) == 0) s.ts[mb][lane >> 3] = uint8_t(sd);
        sd2 = sd | (sd << 8);
      } else {
        sd2 = block_scale_pair(ama, amb, g_col.k);
      }
      const float ma = s.mult[1][sd2 & 0xFFu], mbm = s.mult[1][sd2 >> 8];
      if (!kTwoD || a.columnwise) {  // (16×16 rowwise only: the scales were all it had to give)
        // As for the rows: |RN(y·m + 0)| = RN(|y|·m) ≤ RN(amax·m) (the amaxes are the exact max |y|
        // of the NaN-free chunks).
        bool below7 = false;
        if constexpr (!kSR) {
          below7 =
              __all_sync(0xFFFFFFFFu, nan | ((mul_rn(ama, ma) < 7.0f) & (mul_rn(amb, mbm) < 7.0f)));
        }
        // Philox index of chunk a (stochastic rounding only): (k0 + 2p)·M + m0 + 16·mb.
        const int64_t idx_a = kSR ? int64_t(Tt) + 2 * p * M + 16 * mb : 0;
        uint64_t ca, cb;
        if (!kTwoD && a.rht) {
          if (below7) {
            nvfp4_col_codes_v11<kSR, true, true>(w, nan, ma, mbm, a.col_key, idx_a, idx_a + M, ca,
                                                 cb);
          } else {
            nvfp4_col_codes_v11<kSR, true>(w, nan, ma, mbm, a.col_key, idx_a, idx_a + M, ca, cb);
          }
        } else {
          if (below7) {
            nvfp4_col_codes_v11<kSR, false, true>(w, nan, ma, mbm, a.col_key, idx_a, idx_a + M, ca,
                                                  cb);
          } else {
            nvfp4_col_codes_v11<kSR, false>(w, nan, ma, mbm, a.col_key, idx_a, idx_a + M, ca, cb);
          }
        }
        const int ks = (2 * p) ^ ((mb >> 1) << 2);  // even: bit 0 is never swizzled
        *reinterpret_cast<ulonglong2*>(&s.cp[mb][ks]) = make_ulonglong2(ca, cb);
        s.cs[mb][p] = uint16_t(sd2);
      }
    }
    __syncthreads();  // B: codes and scales staged; every read of s.tile is done
    if constexpr (kTwoD) {
      if (a.rowwise) quantize_rows();  // reads only the thread's own granules of s.tile
    }
    if (a.columnwise) {
      // Transposed row k0 + t/4, M-blocks 2q and 2q + 1 (q = t % 4): 16 bytes of codes and two
      // scale bytes (the bytes of store_col_tile_row; s.cs read bytewise: byte k of row mb is
      // the scale of column k, little-endian halves of the words written above).
      const int k = t >> 2, q = t & 3;
      const int kz = k ^ (q << 2);  // the swizzle of M-blocks 2q and 2q + 1
      const uint64_t lo = s.cp[2 * q][kz], hi = s.cp[2 * q + 1][kz];
      const uint8_t* cs8 = reinterpret_cast<const uint8_t*>(&s.cs[0][0]);
      const uint32_t sc_lo = cs8[(2 * q) * int(sizeof(s.cs[0])) + k];
      const uint32_t sc_hi = cs8[(2 * q + 1) * int(sizeof(s.cs[0])) + k];
      *reinterpret_cast<ulonglong2*>(a.qt + ((Tt >> 1) + qt_off)) = make_ulonglong2(lo, hi);
      *reinterpret_cast<uint16_t*>(a.qt_scale + ((Tt >> 4) + qts_off)) =
          uint16_t(sc_lo | (sc_hi << 8));
    }
    if (has_next) {  // s.tile is free: stage the next tile (its loads have long landed)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) *own[j][h] = next[j][h];
      }
    }
    mi = mi_next;
    ki = ki_next;
    T = T_next;
    Tt = Tt_next;
  }
}

// Blocks of v11's persistent grid: as many as are resident on the device at once, at most one
// per tile. The occupancy is asked once per kernel, the SM count once per device.
template <bool kSR, bool kTwoD>
unsigned nvfp4_v11_blocks(int64_t n_tiles) {
  static const int blocks_per_sm = [] {
    int b = 0;
    LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &b, nvfp4_quant_v11_kernel<kSR, kTwoD>, kThreads, 0));
    return b > 0 ? b : 1;
  }();
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  const int64_t resident = int64_t(sm_count(dev)) * blocks_per_sm;
  return unsigned(n_tiles < resident ? n_tiles : resident);
}

}  // namespace

template <typename T>
void nvfp4(const T* x, int64_t M, int64_t K, bool rowwise, bool columnwise, bool rht, bool sr,
           bool two_d, RngKey row_key, RngKey col_key, uint8_t* q, uint8_t* q_scale, uint8_t* qt,
           uint8_t* qt_scale, float* amax_row, float* amax_col, bool amax_ready, uint32_t* acc,
           cudaStream_t stream) {
  if (M == 0 || K == 0) {
    // The amax of no elements is 0.
    if (!amax_ready && amax_row != nullptr) {
      LOWBIT_CUDA_CHECK(cudaMemsetAsync(amax_row, 0, 4, stream));
    }
    if (!amax_ready && amax_col != nullptr) {
      LOWBIT_CUDA_CHECK(cudaMemsetAsync(amax_col, 0, 4, stream));
    }
    return;
  }
  const dim3 grid(unsigned(ceil_div(M, kT)), unsigned(ceil_div(K, kT)));
  Nvfp4Args a{M,       K, rowwise, columnwise, rht,      sr,       two_d,   row_key,
              col_key, q, q_scale, qt,         qt_scale, amax_row, amax_col};
  const bool v9 = !legacy_kernels();
  auto amax_pass = nvfp4_kernel<T, Pass::kAmax, false, false>;
  auto quant_pass = v9 ? (sr ? nvfp4_kernel<T, Pass::kQuantize, true, true>
                             : nvfp4_kernel<T, Pass::kQuantize, false, true>)
                       : (sr ? nvfp4_kernel<T, Pass::kQuantize, true, false>
                             : nvfp4_kernel<T, Pass::kQuantize, false, false>);
  // v11 (default): bf16, 1×16 blocks, full 128×64 tiles, 16-byte aligned source; v9/v8 for
  // every other case and under LOWBIT_QUANT_KERNELS=v10 / v9 / v8.
  // v13: 16×16 blocks without stochastic rounding on v11's kernel too (=v12 keeps nvfp4_kernel).
  const bool bf16_tiles = std::is_same_v<T, uint16_t> && M % kV11M == 0 && K % kV11K == 0 &&
                          reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const bool full_tiles = bf16_tiles && !two_d;
  const int version = quant_kernels_version();
  const bool v13_2d = bf16_tiles && two_d && !sr && version >= 13;
  const bool v11 = (full_tiles && version >= 11) || v13_2d;
  if (!v11) set_smem(quant_pass);
  if (!amax_ready) {
    const bool v9_amax = v9 && std::is_same_v<T, uint16_t> && M % 16 == 0 && K % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(x) % 16 == 0;
    // v12 folds the blocks' maxima into the reduction words (LOWBIT_QUANT_KERNELS=v11: into the
    // outputs). Without reduction words, or off the v9 path, the outputs are zeroed first.
    if (version < 12) acc = nullptr;
    if (!v9_amax || acc == nullptr) {
      if (amax_row != nullptr) LOWBIT_CUDA_CHECK(cudaMemsetAsync(amax_row, 0, 4, stream));
      if (amax_col != nullptr) LOWBIT_CUDA_CHECK(cudaMemsetAsync(amax_col, 0, 4, stream));
    }
    if (v9_amax) {
      const int64_t n_tasks = (M / 16) * (K / 8);
      nvfp4_amax_v9_kernel<<<unsigned(ceil_div(n_tasks, int64_t(kThreads))), kThreads, 0, stream>>>(
          reinterpret_cast<const uint16_t*>(x), M, K, rowwise || two_d, columnwise && !two_d, rht,
          acc, amax_row, amax_col);
    } else {
      set_smem(amax_pass);
      amax_pass<<<grid, kThreads, sizeof(TileSmem), stream>>>(x, a);
    }
    LOWBIT_CUDA_CHECK_LAUNCH();
  }
  if (v11) {
    // The kernel indexes tiles with int (16 KB of source each: far below 2^31 for any tensor).
    LOWBIT_CHECK((M / kV11M) * (K / kV11K) < (int64_t(1) << 30),
                 "nvfp4: {}x{} has too many 128x64 tiles for the tile walk", M, K);
    // Tile groups of 16 M-tiles from 64 M elements up (see the kernel), without stochastic
    // rounding: in one call on an H100 (bench/results/h100-2026-11-27/nvfp4-tile-groups-0004)
    // groups of 8 ran the same as 16, 4 and 32 slower, and the SR pass 3-5 % slower grouped
    // (8192² amax given 0.1836 → 0.1941 ms), so it keeps the M-fastest walk.
    a.group_m = !sr && M * K >= (int64_t(1) << 26) ? 16 : 0;
    const int64_t n_tiles = (M / kV11M) * (K / kV11K);
    const auto* xb = reinterpret_cast<const uint16_t*>(x);
    if (v13_2d) {
      nvfp4_quant_v11_kernel<false, true>
          <<<nvfp4_v11_blocks<false, true>(n_tiles), kThreads, 0, stream>>>(xb, a);
    } else if (sr) {
      nvfp4_quant_v11_kernel<true>
          <<<nvfp4_v11_blocks<true, false>(n_tiles), kThreads, 0, stream>>>(xb, a);
    } else {
      nvfp4_quant_v11_kernel<false>
          <<<nvfp4_v11_blocks<false, false>(n_tiles), kThreads, 0, stream>>>(xb, a);
    }
  } else {
    quant_pass<<<grid, kThreads, sizeof(TileSmem), stream>>>(x, a);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

#define LOWBIT_INSTANTIATE(T)                                                                      \
  template void nvfp4<T>(const T*, int64_t, int64_t, bool, bool, bool, bool, bool, RngKey, RngKey, \
                         uint8_t*, uint8_t*, uint8_t*, uint8_t*, float*, float*, bool, uint32_t*,  \
                         cudaStream_t);
LOWBIT_INSTANTIATE(uint16_t)
LOWBIT_INSTANTIATE(float)
#undef LOWBIT_INSTANTIATE

}  // namespace lowbit::quant_cuda

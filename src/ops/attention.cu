// Causal grouped-query attention on the GPU: FlashAttention-2 style kernels (bf16 tensor-core
// MMA, fp32 accumulation, online softmax, no T×T matrix in memory) for sm_90a.
//
// Kernels (one (batch, head) pair and one tile of rows per block, 16 rows per warp; by default
// the forward and both backward passes run attn_fwd_wgmma_tma_kernel, attn_bwd_dkv_wgmma_kernel
// and attn_bwd_dq_wgmma_kernel, warpgroup-MMA versions of the kernels below with 64-row tiles,
// for Dh 64 and 128 — each with its tiles loaded by the TMA unit (attn_fwd_wgmma_tma_kernel,
// attn_bwd_dkv_wgmma_kernel<Dh, true>, attn_bwd_dq_wgmma_tma_kernel), or by cp.async where no
// tensor map can describe the inputs; the mma.sync kernels remain as tile variants):
//  * attn_fwd_kernel       a tile of 16·W queries; streams key/value tiles of Bc keys up to the
//                          diagonal: S = Q·Kᵀ, online softmax, O += P·V; writes out and lse.
//  * attn_bwd_prep_kernel  D = rowsum(dO ∘ O) and lse·log2(e) per query, into the workspace.
//  * attn_bwd_dkv_kernel   a tile of 16·W keys of one kv head; streams query tiles of Br queries
//                          of every query head of its group: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ and dSᵀ,
//                          dV += Pᵀ·dO, dK += dSᵀ·Q in registers; each key's dK, dV is owned by
//                          one thread and summed over the group in a fixed order.
//  * attn_bwd_dq_kernel    a tile of 16·W queries; streams key/value tiles up to the diagonal:
//                          S, dP = dO·Vᵀ, P, dS, dQ += dS·K in registers. A separate pass
//                          instead of fp32 atomics keeps dQ deterministic.
//  * for Dh 128 the default backward instead lets the dK/dV pass (64×64 tiles) write its bf16
//    dSᵀ tiles to the workspace and attn_bwd_dq_from_ds_kernel computes dQ = dS·K from them:
//    5 products in all instead of 7, still deterministic; the batch runs in chunks whose tiles
//    fit 512 MiB (see default_tiles for when it pays).
//
// Matrix products are mma.sync.m16n8k16 (bf16 × bf16 → f32). Fragment layouts (PTX ISA,
// "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and c = lane % 4:
//   A 16×16 (row-major): a0 = A[g][2c..2c+1], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 =
//   A[g+8][2c+8..] B 16×8 (k × n):      b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g] C 16×8 (f32):
//   c0,c1 = C[g][2c..2c+1], c2,c3 = C[g+8][2c..2c+1]
// so the accumulator of S over two consecutive 8-key blocks is, repacked to bf16, the A operand
// of the following product over those 16 keys (no shared-memory round trip for P or dS).
//
// Shared-memory tiles are [rows, Dh] bf16, rows Dh·2 bytes apart, with 16-byte chunk c of row r
// stored at chunk position c ^ (r & 7): the 8 row addresses of one ldmatrix 8×8 matrix then hit
// 8 different bank groups (conflict-free), for both the plain and the transposing loads.
// Tiles move global → shared with cp.async (16 bytes per thread, rows past T zero-filled), two
// stages deep: the copy of tile j+1 runs while tile j is multiplied.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/device_attr.h"
#include "core/pdl.cuh"
#include "core/tma.cuh"
#include "core/tma.h"
#include "core/wgmma.cuh"
#include "lowbit/core/cuda_check.h"
#include "ops/attention_impl.h"
#include "ops/quant_epilogue.cuh"

namespace lowbit::attn {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---- PTX wrappers ------------------------------------------------------------------------------

using ops_cuda::smem_addr;

// 16 bytes global → shared; when !valid nothing is read and the destination is zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8×8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i holds
// row lane/4, elements 2·(lane%4) and +1 of matrix i.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, each matrix transposed: register i holds rows 2·(lane%4), +1 of column lane/4.
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d [16×8 f32] += a [16×16 bf16] · b [16×8 bf16].
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 → a bf16 pair (RN), `lo` in the low half (the lower column index of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// An m64n64 wgmma accumulator (the thread layout of wgmma::mma_m64n64k16) rounded to bf16 pairs
// as the register A operand of wgmma::issue_rs_nmajor_64: k-step kp takes columns 16kp ..
// 16kp + 15, which are accumulator elements 8kp .. 8kp + 7 of the thread.
__device__ __forceinline__ void acc_to_a_bf16(const float (&acc)[32], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kp = 0; kp < 4; ++kp) {
#pragma unroll
    for (int w = 0; w < 4; ++w) a[kp][w] = pack_bf16(acc[8 * kp + 2 * w], acc[8 * kp + 2 * w + 1]);
  }
}

// Row r of the thread's two rows of an m64n64 wgmma accumulator (r = 1: 8 rows below), times
// `scale`, as bf16 at `row` (the output row already offset to the thread's first column c2):
// columns 8jb + c2 and + 1 for jb < 8.
__device__ __forceinline__ void store_acc_row_bf16(uint16_t* row, const float (&acc)[32], int r,
                                                   float scale) {
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    *reinterpret_cast<uint32_t*>(row + jb * 8) =
        pack_bf16(acc[4 * jb + 2 * r] * scale, acc[4 * jb + 2 * r + 1] * scale);
  }
}

// Stores a [64, kPanels·64] fp32 accumulator of a warpgroup (thread layout of
// wgmma::mma_m64n64k16, panel by panel) times `scale` as bf16 rows at g + r·row_stride (rows
// r < valid), staged through `tile` in shared memory (64 rows of kPanels·128 + 16 bytes): each
// row leaves as whole 16-byte chunks, 16 threads to a 256-byte row, instead of the
// accumulator's scattered 4-byte pairs — into rows of a wide fused gradient buffer those cost
// ~6 % of the backward at T 4096 (partial sectors). The caller's shared memory at `tile` must
// be free (a block barrier after its last products); ends with a block barrier.
template <int kPanels>
__device__ __forceinline__ void store_acc_tile_bf16(uint8_t* tile, const float (&acc)[kPanels][32],
                                                    float scale, uint16_t* g, int64_t row_stride,
                                                    int valid) {
  constexpr int kPitch = kPanels * 128 + 16;  // ≡ 16 (mod 128): rows on distinct bank groups
  const int tid = threadIdx.x, lane = tid & 31;
  const int lr = (tid >> 5) * 16 + (lane >> 2), c2 = 2 * (lane & 3);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
#pragma unroll
      for (int jb = 0; jb < 8; ++jb) {
        *reinterpret_cast<uint32_t*>(tile + (lr + 8 * r) * kPitch + (64 * pn + 8 * jb + c2) * 2) =
            pack_bf16(acc[pn][4 * jb + 2 * r] * scale, acc[pn][4 * jb + 2 * r + 1] * scale);
      }
    }
  }
  __syncthreads();
  constexpr int kChunks = kPanels * 8;  // 16-byte chunks per row
  for (int i = tid; i < 64 * kChunks; i += 128) {
    const int row = i / kChunks, c = i % kChunks;
    if (row < valid) {
      *reinterpret_cast<uint4*>(g + row * row_stride + 8 * c) =
          *reinterpret_cast<const uint4*>(tile + row * kPitch + 16 * c);
    }
  }
  __syncthreads();
}

// 2^x (ex2.approx: relative error ~2^-22; 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}

// ---- swizzled [rows, kDh] bf16 tiles ------------------------------------------------------------

// Shared address of element (row, col) of a tile at `base`; col is a multiple of 8.
template <int kDh>
__device__ __forceinline__ uint32_t tile_addr(uint32_t base, int row, int col) {
  return base + row * (kDh * 2) + ((((col >> 3) ^ (row & 7))) << 4);
}

// Address a lane passes to ldmatrix for the A operand (16 rows × 16 cols at row0, col0).
// Matrices: 0 = rows 0-7 / cols 0-7, 1 = rows 8-15 / cols 0-7, 2 = rows 0-7 / cols 8-15,
// 3 = rows 8-15 / cols 8-15, i.e. a0..a3.
template <int kDh>
__device__ __forceinline__ uint32_t a_frag_addr(uint32_t base, int row0, int col0, int lane) {
  return tile_addr<kDh>(base, row0 + (lane & 15), col0 + ((lane >> 4) << 3));
}

// For the B operand stored as [n, k] (n = tile rows): 16 n-rows × 16 k-cols at (row0, col0).
// Matrices: 0 = n 0-7 / k 0-7, 1 = n 0-7 / k 8-15, 2 = n 8-15 / k 0-7, 3 = n 8-15 / k 8-15, so
// r0, r1 are (b0, b1) of the n-block row0..row0+7 and r2, r3 those of row0+8..row0+15.
template <int kDh>
__device__ __forceinline__ uint32_t bn_frag_addr(uint32_t base, int row0, int col0, int lane) {
  return tile_addr<kDh>(base, row0 + (lane & 7) + ((lane >> 4) << 3),
                        col0 + (((lane >> 3) & 1) << 3));
}

// For the B operand stored as [k, n] (k = tile rows), loaded with ldmatrix.trans: 16 k-rows at
// row0 × 16 n-cols at col0. Matrices: 0 = k 0-7 / n 0-7, 1 = k 8-15 / n 0-7, 2 = k 0-7 / n 8-15,
// 3 = k 8-15 / n 8-15, so r0, r1 are (b0, b1) of n-block col0..col0+7 and r2, r3 of col0+8...
template <int kDh>
__device__ __forceinline__ uint32_t bk_frag_addr(uint32_t base, int row0, int col0, int lane) {
  return tile_addr<kDh>(base, row0 + (lane & 7) + (((lane >> 3) & 1) << 3),
                        col0 + ((lane >> 4) << 3));
}

// Starts the copy of a [kRows, kDh] tile whose row r is at g + r·row_stride; rows ≥ valid_rows
// are zero-filled (g itself must point at a readable row).
template <int kRows, int kDh, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t base, const uint16_t* g, int64_t row_stride,
                                          int valid_rows, int tid) {
  constexpr int kChunksPerRow = kDh / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
    const int chunk = tid + i * kThreads;
    if (kChunks % kThreads == 0 || chunk < kChunks) {
      const int r = chunk / kChunksPerRow, c = chunk % kChunksPerRow;
      const bool valid = r < valid_rows;
      const uint16_t* src = g + (valid ? r * row_stride : 0) + c * 8;
      cp_async_16(tile_addr<kDh>(base, r, c * 8), src, valid);
    }
  }
}

// The tile layout of the wgmma kernels: a [kRows, kDh] bf16 tile stored as kDh / 64 panels of
// [kRows, 64] one after another (panel c / 64 holds columns c .. c + 63), each panel in the 128B
// swizzle (rows of 128 bytes, 16-byte chunk j of row r at chunk position j ^ (r & 7)): the
// layout a wgmma descriptor describes. For Dh 64 it is tile_addr<64>'s.
template <int kRows>
__device__ __forceinline__ uint32_t panel_addr(uint32_t base, int row, int col) {
  return base + (col >> 6) * (kRows * 128) + row * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4);
}

// Copies [kRows, kDh] tiles global → shared in the panel layout (cp.async, 16 bytes per chunk).
// Each thread's chunks are fixed (chunk i: row r0 + kRowsPerPass·i, 16-byte column c), so their
// shared and source offsets are computed once and a copy costs one 64-bit add, one compare and
// the cp.async per chunk.
template <int kRows, int kDh, int kThreads>
struct TileCopy {
  static constexpr int kChunksPerRow = kDh / 8;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  // Row r0 + kRowsPerPass·i has the swizzle phase of row r0, so one shared offset serves all.
  static_assert(kThreads % kChunksPerRow == 0 && kRowsPerPass % 8 == 0 && kRows % kRowsPerPass == 0,
                "TileCopy: whole rows per pass, a multiple of 8 rows");
  int r0;
  int64_t src0;      // elements from a tile's first row to this thread's first chunk
  int64_t src_pass;  // elements between its chunks (kRowsPerPass rows)
  uint32_t dst0;     // bytes from the tile base to its first chunk

  __device__ __forceinline__ TileCopy(int tid, int64_t row_stride) {
    r0 = tid / kChunksPerRow;
    const int c = tid % kChunksPerRow;
    src0 = r0 * row_stride + 8 * c;
    src_pass = kRowsPerPass * row_stride;
    dst0 = panel_addr<kRows>(0, r0, 8 * c);
  }

  // Starts the copy of the tile whose row 0 is at g into `base`; rows ≥ valid_rows zero-filled.
  __device__ __forceinline__ void start(uint32_t base, const uint16_t* g, int valid_rows) const {
    const uint16_t* src = g + src0;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = r0 + i * kRowsPerPass < valid_rows;
      cp_async_16(base + dst0 + i * (kRowsPerPass * 128), valid ? src : g, valid);
      src += src_pass;
    }
  }
};

// Starts the copy of kRows floats g[0..kRows) (entries ≥ valid zero-filled).
template <int kRows>
__device__ __forceinline__ void load_vec(uint32_t base, const float* g, int valid, int tid) {
  if (tid < kRows) cp_async_4(base + tid * 4, g + (tid < valid ? tid : 0), tid < valid);
}

// Starts the copy of key/value tile kt (keys kt·kRows ..) of one kv head (kg, vg) into stage
// `stage` of the double-buffered K and V tiles (each stage kRows·kDh bf16).
template <int kRows, int kDh, int kThreads, typename Params>
__device__ __forceinline__ void load_kv_tile(const Params& p, uint32_t sK, uint32_t sV, int stage,
                                             const uint16_t* kg, const uint16_t* vg, int kt,
                                             int tid) {
  constexpr int kTileBytes = kRows * kDh * 2;
  const int k1 = kt * kRows;
  load_tile<kRows, kDh, kThreads>(sK + stage * kTileBytes, kg + k1 * p.k_st, p.k_st, p.T - k1, tid);
  load_tile<kRows, kDh, kThreads>(sV + stage * kTileBytes, vg + k1 * p.v_st, p.v_st, p.T - k1, tid);
}

// The order of the blocks of the linear grids (heavy_first_grid): the (batch, head) rows come in
// chunks of `chunk` rows, and within a chunk tile by tile from the one with the most causal work,
// each tile over the chunk's rows. One row per chunk is BlockOrder::kHeadByHead, all rows in one
// chunk kAllHeads (attention_impl.h). Returns block blockIdx.x's tile, counted from the heaviest,
// and its row.
struct TileRow {
  int tile, row;
};

__device__ __forceinline__ TileRow heavy_first(int n_tiles, int chunk) {
  const int rows = static_cast<int>(gridDim.x) / n_tiles;
  const int per_chunk = chunk * n_tiles;
  const int c = static_cast<int>(blockIdx.x) / per_chunk;
  const int j = static_cast<int>(blockIdx.x) % per_chunk;
  const int rc = min(chunk, rows - c * chunk);  // rows of this chunk (the last may be short)
  return {j / rc, c * chunk + j % rc};
}

// The block's query tile: tile qt of kRows queries from q0, (batch, head) = bh, the key tiles of
// kKeys up to the last valid query (n_kt), and the head's K and V rows (grid: heavy_first).
struct QueryTile {
  int qt, bh, b, h, q0, n_kt;
  const uint16_t* kg;  // K of kv head h / group: [T, Dh] rows, k_st apart
  const uint16_t* vg;  // V likewise
};

template <int kRows, int kKeys, typename Params>
__device__ __forceinline__ QueryTile query_tile(const Params& p) {
  QueryTile t;
  const int n_tiles = (p.T + kRows - 1) / kRows;
  const TileRow tr = heavy_first(n_tiles, p.chunk_q);
  t.qt = n_tiles - 1 - tr.tile;
  t.bh = tr.row;
  t.b = t.bh / p.H;
  t.h = t.bh % p.H;
  const int hkv = t.h / p.group;
  t.q0 = t.qt * kRows;
  t.n_kt = (min(t.q0 + kRows, p.T) - 1) / kKeys + 1;
  t.kg = p.k + t.b * p.k_sb + hkv * p.k_sh;
  t.vg = p.v + t.b * p.v_sb + hkv * p.v_sh;
  return t;
}

// ---- forward
// -------------------------------------------------------------------------------------

struct FwdParams {
  const uint16_t* q;  // [B, T, H, Dh] bf16 (strided)
  const uint16_t* k;  // [B, T, Hkv, Dh] bf16 (strided)
  const uint16_t* v;  // [B, T, Hkv, Dh] bf16 (strided)
  uint16_t* out;      // [B, T, H, Dh] bf16 (strided)
  float* lse;         // [B, H, T] f32
  int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, o_sb, o_st, o_sh;
  int T, H, group;   // group = H / Hkv
  int chunk_q;       // rows per chunk of the grid (heavy_first)
  float scale;       // softmax scale (> 0)
  float scale_log2;  // scale · log2(e): scores in base-2 exponent units
};

// Grid: (query tiles, B·H), the query tile index reversed so the longest rows start first.
// Each warp owns kMt consecutive 16-row m-tiles (16·kMt queries), so every K / V fragment read
// from shared memory feeds kMt products. Q fragments stay in registers when they are few
// (kMt·Dh ≤ 128), else they are re-read from shared memory per 16-column step.
// Shared: Q [Br, Dh] | K [2][Bc, Dh] | V [2][Bc, Dh], bf16, swizzled.
template <int kDh, int kWarps, int kBc, int kMt>
__global__ void __launch_bounds__(kWarps * 32) attn_fwd_kernel(const FwdParams p) {
  pdl::grid_sync();
  constexpr int kThreads = kWarps * 32;
  constexpr int kRowsW = 16 * kMt;  // queries per warp
  constexpr int kBr = kRowsW * kWarps;
  constexpr bool kQInRegs = kMt * kDh <= 128;
  constexpr int kTileBytes = kBc * kDh * 2;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sK = sQ + kBr * kDh * 2;
  const uint32_t sV = sK + 2 * kTileBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const QueryTile qtile = query_tile<kBr, kBc>(p);
  const int bh = qtile.bh, b = qtile.b, h = qtile.h, q0 = qtile.q0, n_kt = qtile.n_kt, T = p.T;
  const uint16_t *kg = qtile.kg, *vg = qtile.vg;
  const uint16_t* qg = p.q + b * p.q_sb + h * p.q_sh + q0 * p.q_st;

  load_tile<kBr, kDh, kThreads>(sQ, qg, p.q_st, T - q0, tid);
  load_kv_tile<kBc, kDh, kThreads>(p, sK, sV, 0, kg, vg, 0, tid);
  cp_async_commit();

  const int wq0 = q0 + warp * kRowsW;  // first query of this warp
  const int r_lo = wq0 + (lane >> 2);  // rows of m-tile mt: r_lo + 16·mt and r_lo + 16·mt + 8
  const int c2 = 2 * (lane & 3);       // this thread's first column within an 8-column block

  uint32_t qf[kQInRegs ? kMt : 1][kQInRegs ? kDh / 16 : 1][4];  // Q A-fragments, [16·kMt, Dh]
  float o[kMt][kDh / 8][4];                                     // O accumulator, [16·kMt, Dh]
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int i = 0; i < kDh / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  }
  // Per m-tile and row half: running max of the raw scores q·k, and this thread's part of the
  // running Σ exp2(scale_log2·(s − m)).
  float m[kMt][2], l[kMt][2];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  for (int j = 0; j < n_kt; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kt) {
      // Stage `stage ^ 1` was last read in iteration j − 1, which every thread has left
      // (barrier at the end of the loop body).
      load_kv_tile<kBc, kDh, kThreads>(p, sK, sV, stage ^ 1, kg, vg, j + 1, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();  // everything but the group just committed has landed: tile j (and Q)
    __syncthreads();
    if (kQInRegs && j == 0) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int kk = 0; kk < kDh / 16; ++kk) {
          ldsm_x4(a_frag_addr<kDh>(sQ, warp * kRowsW + mt * 16, kk * 16, lane),
                  qf[kQInRegs ? mt : 0][kQInRegs ? kk : 0]);
        }
      }
    }
    const int k0 = j * kBc;
    if (k0 <= wq0 + kRowsW - 1) {  // else every key of the tile is after every warp row
      const uint32_t sKs = sK + stage * kTileBytes, sVs = sV + stage * kTileBytes;
      float s[kMt][kBc / 8][4];  // raw scores q·k, [16·kMt queries, Bc keys]
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i)
          s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kDh / 16; ++kk) {
        uint32_t qa[kQInRegs ? 1 : kMt][4];
        if (!kQInRegs) {
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            ldsm_x4(a_frag_addr<kDh>(sQ, warp * kRowsW + mt * 16, kk * 16, lane),
                    qa[kQInRegs ? 0 : mt]);
          }
        }
#pragma unroll
        for (int np = 0; np < kBc / 16; ++np) {
          uint32_t kb[4];
          ldsm_x4(bn_frag_addr<kDh>(sKs, np * 16, kk * 16, lane), kb);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            const uint32_t(&a)[4] =
                kQInRegs ? qf[kQInRegs ? mt : 0][kQInRegs ? kk : 0] : qa[kQInRegs ? 0 : mt];
            mma_bf16(s[mt][2 * np], a, kb[0], kb[1]);
            mma_bf16(s[mt][2 * np + 1], a, kb[2], kb[3]);
          }
        }
      }
      if (k0 + kBc - 1 > wq0) {
        // The tile reaches past the first row's diagonal: mask keys after the query (this also
        // masks the zero-filled keys ≥ T for every valid query).
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
          for (int nb = 0; nb < kBc / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = k0 + nb * 8 + c2 + (e & 1);
              const int row = r_lo + 16 * mt + ((e >> 1) << 3);
              if (key > row) s[mt][nb][e] = -INFINITY;
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        // Online softmax: new row max, rescale the running sum and O by 2^(scale_log2·(m_old −
        // m_new)). Every row sees key 0 in tile 0, so m is finite from the first tile on; the
        // guard only keeps a fully masked row (none today) from producing NaN.
        float alpha[2], neg_ms[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = m[mt][r];
#pragma unroll
          for (int nb = 0; nb < kBc / 8; ++nb) {
            mx = fmaxf(mx, fmaxf(s[mt][nb][2 * r], s[mt][nb][2 * r + 1]));
          }
          mx = quad_max(mx);
          const float ms = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
          alpha[r] = fast_exp2(m[mt][r] * p.scale_log2 - ms);  // 0 while m is -inf
          m[mt][r] = mx;
          neg_ms[r] = -ms;
        }
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nb = 0; nb < kBc / 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][nb][e] = fast_exp2(fmaf(s[mt][nb][e], p.scale_log2, neg_ms[e >> 1]));
            rs[e >> 1] += s[mt][nb][e];
          }
        }
        l[mt][0] = l[mt][0] * alpha[0] + rs[0];
        l[mt][1] = l[mt][1] * alpha[1] + rs[1];
#pragma unroll
        for (int i = 0; i < kDh / 8; ++i) {
          o[mt][i][0] *= alpha[0];
          o[mt][i][1] *= alpha[0];
          o[mt][i][2] *= alpha[1];
          o[mt][i][3] *= alpha[1];
        }
      }
      // O += P·V, P rounded to bf16 (the sum l keeps the fp32 values).
#pragma unroll
      for (int kp = 0; kp < kBc / 16; ++kp) {
        uint32_t pa[kMt][4];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          pa[mt][0] = pack_bf16(s[mt][2 * kp][0], s[mt][2 * kp][1]);
          pa[mt][1] = pack_bf16(s[mt][2 * kp][2], s[mt][2 * kp][3]);
          pa[mt][2] = pack_bf16(s[mt][2 * kp + 1][0], s[mt][2 * kp + 1][1]);
          pa[mt][3] = pack_bf16(s[mt][2 * kp + 1][2], s[mt][2 * kp + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDh / 16; ++dp) {
          uint32_t vb[4];
          ldsm_x4_t(bk_frag_addr<kDh>(sVs, kp * 16, dp * 16, lane), vb);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
            mma_bf16(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // stage `stage` is overwritten by the copy issued in iteration j + 1
  }

#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lsum = quad_sum(l[mt][r]);
      const int row = r_lo + 16 * mt + 8 * r;
      if (row >= T) continue;
      const float inv = 1.0f / lsum;
      uint16_t* orow = p.out + b * p.o_sb + row * p.o_st + h * p.o_sh + c2;
#pragma unroll
      for (int i = 0; i < kDh / 8; ++i) {
        *reinterpret_cast<uint32_t*>(orow + i * 8) =
            pack_bf16(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
      }
      // lse = ln Σ exp(scale·s) = scale·m + ln Σ exp(scale·(s − m)).
      if ((lane & 3) == 0) {
        p.lse[static_cast<int64_t>(bh) * T + row] = m[mt][r] * p.scale + logf(lsum);
      }
    }
  }
}

// Zeroes a [64, kPanels·64] wgmma accumulator.
template <int kPanels>
__device__ __forceinline__ void zero_acc(float (&acc)[kPanels][32]) {
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn) {
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[pn][i] = 0.0f;
  }
}

// O *= alpha by rows (the thread's two rows of a [64, kPanels·64] accumulator), skipped where
// both factors are 1 (the rows' maxima did not move; multiplying by 1 changes nothing).
template <int kPanels>
__device__ __forceinline__ void rescale_acc(float (&o)[kPanels][32], const float (&alpha)[2]) {
  if (alpha[0] == 1.0f && alpha[1] == 1.0f) return;
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[pn][i] *= alpha[(i >> 1) & 1];
  }
}

// Online softmax of one S tile in place (attn_fwd_kernel's arithmetic): s becomes the
// fp32 P = 2^(scale_log2·(s − m_new)), m the new row maxima of the thread's two rows, l the
// rescaled sums plus this tile's, and alpha the factor that rescales the old O.
__device__ __forceinline__ void online_softmax_tile(float (&s)[32], float (&m)[2], float (&l)[2],
                                                    float (&alpha)[2], float scale_log2) {
  float neg_ms[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) mx = fmaxf(mx, fmaxf(s[4 * jb + 2 * r], s[4 * jb + 2 * r + 1]));
    mx = quad_max(mx);
    const float ms = mx == -INFINITY ? 0.0f : mx * scale_log2;
    alpha[r] = fast_exp2(m[r] * scale_log2 - ms);
    m[r] = mx;
    neg_ms[r] = -ms;
  }
  float rs[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int r = (i >> 1) & 1;
    s[i] = fast_exp2(fmaf(s[i], scale_log2, neg_ms[r]));
    rs[r] += s[i];
  }
  l[0] = l[0] * alpha[0] + rs[0];
  l[1] = l[1] * alpha[1] + rs[1];
}

// Keys after the query get −inf (a [64 queries, 64 keys] accumulator tile from key k0; rows
// r_lo, r_lo + 8 of the thread, its first column c2).
__device__ __forceinline__ void mask_causal_tile(float (&s)[32], int k0, int r_lo, int c2) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int key = k0 + 8 * (i >> 2) + c2 + (i & 1);
    const int row = r_lo + ((i >> 1) & 1) * 8;
    if (key > row) s[i] = -INFINITY;
  }
}

// The forward's epilogue: O / l as bf16 into out and lse = m·scale + ln(l), for the thread's
// rows r_lo, r_lo + 8 (< T) of (batch b, head h), columns c2 (+1) of every 8-column block.
template <int kPanels>
__device__ __forceinline__ void store_out_and_lse(const FwdParams& p, const float (&o)[kPanels][32],
                                                  const float (&m)[2], const float (&l)[2], int bh,
                                                  int b, int h, int r_lo, int c2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float lsum = quad_sum(l[r]);
    const int row = r_lo + 8 * r;
    if (row >= p.T) continue;
    const float inv = 1.0f / lsum;
    uint16_t* orow = p.out + b * p.o_sb + row * p.o_st + h * p.o_sh + c2;
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) store_acc_row_bf16(orow + 64 * pn, o[pn], r, inv);
    if (c2 == 0) p.lse[static_cast<int64_t>(bh) * p.T + row] = m[r] * p.scale + logf(lsum);
  }
}

// The forward on warpgroup MMAs (Dh 64 and 128): one warpgroup per block owns 64 queries and
// streams 64-key tiles. S = Q·Kᵀ reads Q and K straight from the swizzled shared tiles (no
// ldmatrix; Dh 128 sums the products of the two 64-column panels);
// the online softmax runs on the accumulator as in attn_fwd_kernel (warp w holds rows 16w..,
// the same fragment layout), and O += P·V takes P from registers (packed to bf16 as the
// mma.sync kernel packs it) and V as an N-major shared operand. Same arithmetic per element as
// attn_fwd_kernel; only the order of the fp32 sums inside each product may differ.
// Shared: Q [64, Dh] | K [2][64, Dh] | V [2][64, Dh] bf16 in the panel layout, 1024-byte aligned.
template <int kDh>
__global__ void __launch_bounds__(128) attn_fwd_wgmma_kernel(const FwdParams p) {
  pdl::grid_sync();
  constexpr int kB = 64, kThreads = 128, kPanels = kDh / 64;
  constexpr int kTile = kB * kDh * 2, kPanel = kB * 128;  // bytes
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + kTile, sV = base + 3 * kTile;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const QueryTile qtile = query_tile<kB, kB>(p);
  const int bh = qtile.bh, b = qtile.b, h = qtile.h, q0 = qtile.q0, n_kt = qtile.n_kt, T = p.T;
  const uint16_t *kg = qtile.kg, *vg = qtile.vg;
  TileCopy<kB, kDh, kThreads>(tid, p.q_st)
      .start(sQ, p.q + b * p.q_sb + h * p.q_sh + q0 * p.q_st, T - q0);
  const TileCopy<kB, kDh, kThreads> k_copy(tid, p.k_st), v_copy(tid, p.v_st);
  k_copy.start(sK, kg, T);
  v_copy.start(sV, vg, T);
  cp_async_commit();

  const int r_lo = q0 + warp * 16 + (lane >> 2);  // rows r_lo and r_lo + 8
  const int c2 = 2 * (lane & 3);
  // O [64, Dh], panel pn: columns 64pn + 8j + c2 (+1) of rows r_lo (o[pn][4j], o[pn][4j+1]) and
  // r_lo + 8 (o[pn][4j+2], o[pn][4j+3]).
  float o[kPanels][32];
  zero_acc(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int j = 0; j < n_kt; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kt) {
      const int k1 = (j + 1) * kB;
      k_copy.start(sK + (stage ^ 1) * kTile, kg + k1 * p.k_st, T - k1);
      v_copy.start(sV + (stage ^ 1) * kTile, vg + k1 * p.v_st, T - k1);
    }
    cp_async_commit();
    cp_async_wait<1>();
    wgmma::fence_proxy_async();  // this thread's cp.async data, visible to the async proxy
    __syncthreads();
    const uint32_t sKs = sK + stage * kTile, sVs = sV + stage * kTile;
    float s[32];
    wgmma::fence();
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      wgmma::issue_kmajor_64(s, sQ + pn * kPanel, sKs + pn * kPanel, /*overwrite=*/pn == 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    const int k0 = j * kB;
    // The diagonal tile: keys after the query (and ≥ T) masked.
    if (k0 + kB - 1 > q0) mask_causal_tile(s, k0, r_lo, c2);
    float alpha[2];
    online_softmax_tile(s, m, l, alpha, p.scale_log2);
    rescale_acc(o, alpha);
    // O += P·V, P rounded to bf16 (the sum l keeps the fp32 values).
    uint32_t pa[4][4];
    acc_to_a_bf16(s, pa);
    wgmma::fence();
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) wgmma::issue_rs_nmajor_64(o[pn], pa, sVs + pn * kPanel);
    wgmma::commit();
    wgmma::wait<0>();
    __syncthreads();  // stage `stage` is overwritten by the copy issued in iteration j + 1
  }

  store_out_and_lse(p, o, m, l, bh, b, h, r_lo, c2);
}

// Issues d = Σ over the kPanels 64-column panels of A·Bᵀ ([64, 64·kPanels] K-major tiles whose
// low descriptor words are a_lo, b_lo; panels kPanel bytes apart).
template <int kPanels>
__device__ __forceinline__ void issue_panels_kmajor(float (&d)[32], uint32_t a_lo, uint32_t b_lo) {
  constexpr uint32_t kPanelLo = (64 * 128) >> 4;
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn) {
    wgmma::issue_kmajor_64_lo(d, a_lo + pn * kPanelLo, b_lo + pn * kPanelLo, /*overwrite=*/pn == 0);
  }
}

// Issues acc[pn] += A·B[:, panel pn] for a [64, 64] A from registers and an N-major [64,
// 64·kPanels] B (low word b_lo of desc_lo(B, 8192)).
template <int kPanels>
__device__ __forceinline__ void issue_panels_rs(float (&acc)[kPanels][32],
                                                const uint32_t (&a)[4][4], uint32_t b_lo) {
  constexpr uint32_t kPanelLo = (64 * 128) >> 4;
#pragma unroll
  for (int pn = 0; pn < kPanels; ++pn)
    wgmma::issue_rs_nmajor_64_lo(acc[pn], a, b_lo + pn * kPanelLo);
}

// The TMA side of a kernel that streams [64, Dh] tiles of [B, T, heads, Dh] tensors: `count`
// mbarriers at `bar` (8 bytes apart), initialised by thread 0 (then __syncthreads; none for
// count 0), and the copy of one tile (kDh / 64 panels) of batch b, counted on one of them.
template <int kDh>
struct TmaTiles {
  uint32_t bar;
  int b;
  __device__ __forceinline__ TmaTiles(uint32_t bar_, int count, int b_) : bar(bar_), b(b_) {
    if (count == 0) return;  // a kernel variant without TMA
    if (threadIdx.x == 0) {
      for (int i = 0; i < count; ++i) tma::mbar_init(bar + 8 * i, 1);
      tma::fence_mbar_init();
    }
    __syncthreads();
  }
  // Thread 0: announce `bytes` more on barrier i for its current phase.
  __device__ __forceinline__ void expect(int i, uint32_t bytes) const {
    tma::mbar_arrive_expect_tx(bar + 8 * i, bytes);
  }
  // Thread 0: the tile of `map` at (head, position) into dst, counted on barrier i.
  __device__ __forceinline__ void load(uint32_t dst, const CUtensorMap* map, int i, int head,
                                       int pos) const {
#pragma unroll
    for (int pn = 0; pn < kDh / 64; ++pn) {
      tma::load_4d(dst + pn * (64 * 128), map, bar + 8 * i, 64 * pn, head, pos, b);
    }
  }
  __device__ __forceinline__ void wait(int i, uint32_t parity) const {
    tma::mbar_wait(bar + 8 * i, parity);
  }
  // Once every warp is done with the tile at dst (a block barrier; their wgmmas waited for),
  // thread 0 loads the next one there when `more`, counted on barrier i.
  __device__ __forceinline__ void refill(bool more, uint32_t dst, const CUtensorMap* map, int i,
                                         int head, int pos) const {
    __syncthreads();
    if (threadIdx.x == 0 && more) {
      expect(i, (kDh / 64) * 64 * 128);
      load(dst, map, i, head, pos);
    }
  }
};

// The tensor maps of the TMA forward (tma::make_bthd_map): boxes of 64 positions × 64 channels.
struct FwdMaps {
  CUtensorMap q;  // over q [B, T, H, Dh]
  CUtensorMap k;  // over k [B, T, Hkv, Dh]
  CUtensorMap v;  // over v [B, T, Hkv, Dh]
};

// attn_fwd_wgmma_kernel with its tiles brought in by the TMA unit: thread 0 issues one bulk
// tensor copy per 64-column panel (the copy writes the 128-byte swizzle itself and zero-fills
// rows ≥ T), and every thread waits on the tile's mbarrier, instead of 128 threads issuing
// 16-byte cp.async chunks with their own address arithmetic (a fifth of the loop's
// instructions). K and V have one stage each, with a barrier each: K_{j+1} loads while the
// softmax and P_j·V_j run, V_{j+1} while S_{j+1} runs. The kernel is latency-bound (a chain of
// products and softmax per warpgroup), and the single stages halve its shared memory, so twice
// as many blocks share an SM (3 or 4 instead of 2; registers cap Dh 128 at 3) and hide each
// other's latencies.
// Same arithmetic.
// Shared: Q | K | V ([64, Dh] each, panel layout, 1024-aligned) | 2 mbarriers (K, V).
template <int kDh>
__global__ void __launch_bounds__(128, kDh == 64 ? 4 : 3)
    attn_fwd_wgmma_tma_kernel(const FwdParams p, const __grid_constant__ FwdMaps maps) {
  pdl::grid_sync();
  constexpr int kB = 64, kPanels = kDh / 64;
  constexpr int kTile = kB * kDh * 2;  // bytes
  constexpr int kBarK = 0, kBarV = 1;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + kTile, sV = base + 2 * kTile;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const QueryTile qtile = query_tile<kB, kB>(p);
  const int bh = qtile.bh, b = qtile.b, h = qtile.h, q0 = qtile.q0, n_kt = qtile.n_kt;
  const int hkv = h / p.group;
  const TmaTiles<kDh> tiles(base + 3 * kTile, 2, b);
  if (tid == 0) {
    tiles.expect(kBarK, 2 * kTile);  // Q and K_0
    tiles.load(sQ, &maps.q, kBarK, h, q0);
    tiles.load(sK, &maps.k, kBarK, hkv, 0);
    tiles.expect(kBarV, kTile);
    tiles.load(sV, &maps.v, kBarV, hkv, 0);
  }

  const int r_lo = q0 + warp * 16 + (lane >> 2);  // rows r_lo and r_lo + 8
  const int c2 = 2 * (lane & 3);
  // O [64, Dh], panel pn: columns 64pn + 8j + c2 (+1) of rows r_lo (o[pn][4j], o[pn][4j+1]) and
  // r_lo + 8 (o[pn][4j+2], o[pn][4j+3]).
  float o[kPanels][32];
  zero_acc(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // Low descriptor words of the tiles (wgmma::desc_lo).
  const uint32_t q_lo = wgmma::desc_lo(sQ, 16), k_lo = wgmma::desc_lo(sK, 16);
  const uint32_t v_lo = wgmma::desc_lo(sV, 8192);

  for (int j = 0; j < n_kt; ++j) {
    const bool more = j + 1 < n_kt;
    tiles.wait(kBarK, j & 1);  // K_j (and Q)
    float s[32];
    wgmma::fence();
    issue_panels_kmajor<kPanels>(s, q_lo, k_lo);
    wgmma::commit();
    wgmma::wait<0>();
    // Every warp is done with K_j: its stage takes K_{j+1}.
    tiles.refill(more, sK, &maps.k, kBarK, hkv, (j + 1) * kB);
    const int k0 = j * kB;
    if (k0 + kB - 1 > q0) mask_causal_tile(s, k0, r_lo, c2);
    float alpha[2];
    online_softmax_tile(s, m, l, alpha, p.scale_log2);
    rescale_acc(o, alpha);
    // O += P·V, P rounded to bf16 (the sum l keeps the fp32 values).
    uint32_t pa[4][4];
    acc_to_a_bf16(s, pa);
    tiles.wait(kBarV, j & 1);  // V_j
    wgmma::fence();
    issue_panels_rs<kPanels>(o, pa, v_lo);
    wgmma::commit();
    wgmma::wait<0>();
    // Every warp is done with V_j: its stage takes V_{j+1}.
    tiles.refill(more, sV, &maps.v, kBarV, hkv, (j + 1) * kB);
  }
  store_out_and_lse(p, o, m, l, bh, b, h, r_lo, c2);
}

// ---- backward
// ------------------------------------------------------------------------------------

struct PrepParams {
  const uint16_t* out;   // [B, T, H, Dh] bf16 (strided)
  const uint16_t* dout;  // [B, T, H, Dh] bf16 (strided)
  const float* lse;      // [B, H, T] f32
  float* delta;          // [B, H, T] f32: Σ_d dout·out
  float* lse2;           // [B, H, T] f32: lse · log2(e)
  int64_t o_sb, o_st, o_sh, do_sb, do_st, do_sh;
  int64_t rows;  // B·H·T
  int T, H;
};

// Dh/8 threads per query row (16 bytes each), rows enumerated in [B, H, T] order.
template <int kDh>
__global__ void __launch_bounds__(256) attn_bwd_prep_kernel(const PrepParams p) {
  pdl::grid_sync();
  constexpr int kLanes = kDh / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = idx / kLanes;
  const int part = static_cast<int>(idx % kLanes);
  float acc = 0.0f;
  if (row < p.rows) {
    const int64_t t = row % p.T, bh = row / p.T, b = bh / p.H, h = bh % p.H;
    const uint4 ov =
        *reinterpret_cast<const uint4*>(p.out + b * p.o_sb + t * p.o_st + h * p.o_sh + part * 8);
    const uint4 dv = *reinterpret_cast<const uint4*>(p.dout + b * p.do_sb + t * p.do_st +
                                                     h * p.do_sh + part * 8);
    const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc += __uint_as_float(ow[i] << 16) * __uint_as_float(dw[i] << 16);
      acc += __uint_as_float(ow[i] & 0xFFFF0000u) * __uint_as_float(dw[i] & 0xFFFF0000u);
    }
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (row < p.rows && part == 0) {
    p.delta[row] = acc;
    p.lse2[row] = p.lse[row] * kLog2e;
  }
}

// attn_bwd_prep_kernel fused with the per-tensor FP8 quantization (delayed scaling) of out,
// contiguous [B·T, H·Dh] (T % 32 == 0): one block per 32 query rows of one (b, h) — the same
// rows, per-thread sums and shuffles as attn_bwd_prep_kernel, so delta is its bits — whose
// 32 × Dh values of out are quantized as quantize() would (they are bf16 already): rowwise codes
// to ep.q when set, and the tile staged in shared memory and written transposed to ep.qt
// (rows h·Dh .. h·Dh + Dh − 1, columns b·T + t0 .. + 32). vec_t: B·T % 16 == 0 and qt 16-byte
// aligned.
template <int kDh>
__global__ void __launch_bounds__(kDh * 4)
    attn_bwd_prep_fp8_kernel(const PrepParams p, bool vec_t, ops_detail::Fp8Epilogue ep) {
  pdl::grid_sync();
  constexpr int kLanes = kDh / 8, kRows = 32, kPitch = kDh + 4;  // ≡ 4 (mod 8): store_transposed
  __shared__ __align__(16) uint8_t tile[kRows * kPitch];         // [32][Dh + 4] codes
  const int r = static_cast<int>(threadIdx.x) / kLanes,
            part = static_cast<int>(threadIdx.x) % kLanes;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + r;  // < rows: rows % 32 == 0
  const int64_t t = row % p.T, bh = row / p.T, b = bh / p.H, h = bh % p.H;
  const uint4 ov =
      *reinterpret_cast<const uint4*>(p.out + b * p.o_sb + t * p.o_st + h * p.o_sh + part * 8);
  const uint4 dv =
      *reinterpret_cast<const uint4*>(p.dout + b * p.do_sb + t * p.do_st + h * p.do_sh + part * 8);
  const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
  float acc = 0.0f;
  float o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = __uint_as_float(ow[i] << 16);
    o[2 * i + 1] = __uint_as_float(ow[i] & 0xFFFF0000u);
    acc += o[2 * i] * __uint_as_float(dw[i] << 16);
    acc += o[2 * i + 1] * __uint_as_float(dw[i] & 0xFFFF0000u);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
  if (part == 0) {
    p.delta[row] = acc;
    p.lse2[row] = p.lse[row] * kLog2e;
  }
  const float scale = *ep.scale;
  const int64_t n = b * p.T + t;  // the row of out as [B·T, H·Dh]
  const int64_t width = int64_t(p.H) * kDh;
  float amax = 0.0f;
  ops_cuda::fp8_epilogue_chunk8<true>(
      o, scale, ep.e5m2, nullptr, ep.q != nullptr ? ep.q + n * width + h * kDh + part * 8 : nullptr,
      tile + r * kPitch + part * 8, amax);
  if (ep.qt != nullptr) {
    __syncthreads();                       // the tile is staged
    const int64_t n0 = b * p.T + (t - r);  // the block's first row
    ops_cuda::store_transposed<kRows>(ep.qt, tile, kPitch, n0, int64_t(p.rows / p.H), h * kDh, kDh,
                                      vec_t);
  }
  ops_cuda::fp8_epilogue_finish(amax, scale, ep);
}

struct BwdParams {
  const uint16_t* q;     // [B, T, H, Dh] bf16 (strided)
  const uint16_t* k;     // [B, T, Hkv, Dh] bf16 (strided)
  const uint16_t* v;     // [B, T, Hkv, Dh] bf16 (strided)
  const uint16_t* dout;  // [B, T, H, Dh] bf16 (strided)
  uint16_t* dq;          // [B, T, H, Dh] bf16 (strided)
  uint16_t* dk;          // [B, T, Hkv, Dh] bf16 (strided)
  uint16_t* dv;          // [B, T, Hkv, Dh] bf16 (strided)
  // kStoreDs: dSᵀ tiles [B·H][tiles][64 keys][64 queries] bf16 of the lower triangle, tile
  // (key tile kt, query tile qt ≥ kt) at index qt·(qt + 1)/2 + kt (see ds_tile).
  uint16_t* ds;
  const float* lse2;   // [B, H, T] f32: lse · log2(e)
  const float* delta;  // [B, H, T] f32: rowsum(dout ∘ out)
  int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, do_sb, do_st, do_sh;
  int64_t dq_sb, dq_st, dq_sh, dk_sb, dk_st, dk_sh, dv_sb, dv_st, dv_sh;
  int T, H, Hkv, group;
  int chunk_q;   // (batch, head) rows per chunk of the query-tile grids (heavy_first)
  int chunk_kv;  // (batch, kv head) rows per chunk of the wgmma dK/dV pass's grid
  float scale, scale_log2;
};

// lse2 and delta of query row `row` of head bh (0 for rows ≥ T, whose Q and dO are zero-filled:
// their P is finite and their dS exactly 0).
__device__ __forceinline__ void row_stats(const BwdParams& p, int bh, int row, float& lq,
                                          float& dlt) {
  const int64_t idx = static_cast<int64_t>(bh) * p.T + row;
  lq = row < p.T ? p.lse2[idx] : 0.0f;
  dlt = row < p.T ? p.delta[idx] : 0.0f;
}

// The stored dSᵀ tile of (b·H + h, key tile kt, query tile qt), qt ≥ kt, 64×64 bf16.
__device__ __forceinline__ uint16_t* ds_tile(uint16_t* ds, int64_t bh, int n_tiles, int kt,
                                             int qt) {
  const int64_t tiles_per_bh = int64_t(n_tiles) * (n_tiles + 1) / 2;
  return ds + (bh * tiles_per_bh + int64_t(qt) * (qt + 1) / 2 + kt) * (64 * 64);
}

// Grid: (key tiles, B·Hkv), key tile 0 (the most queries) first. Every query head of the kv
// head's group is processed by this block in turn, so dK and dV sum the group in a fixed order.
// Each warp owns kMt consecutive 16-key m-tiles.
// Shared: K [Bc, Dh] | V [Bc, Dh] | Q [2][Br, Dh] | dO [2][Br, Dh] bf16, swizzled |
//         lse2 [2][Br] | delta [2][Br] f32.
// kStoreDs (Bc = Br = 64): the bf16 dSᵀ of every tile is also written to p.ds for the dQ pass
// attn_bwd_dq_from_ds_kernel (rows of keys past T are written as zeros).
template <int kDh, int kWarps, int kBr, int kMt, bool kStoreDs = false>
__global__ void __launch_bounds__(kWarps * 32) attn_bwd_dkv_kernel(const BwdParams p) {
  pdl::grid_sync();
  constexpr int kThreads = kWarps * 32;
  constexpr int kKeysW = 16 * kMt;  // keys per warp
  constexpr int kBc = kKeysW * kWarps;
  constexpr int kTileQ = kBr * kDh * 2;
  static_assert(!kStoreDs || (kBc == 64 && kBr == 64), "stored dS tiles are 64×64");
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sK = smem_addr(smem);
  const uint32_t sV = sK + kBc * kDh * 2;
  const uint32_t sQ = sV + kBc * kDh * 2;
  const uint32_t sdO = sQ + 2 * kTileQ;
  const uint32_t sL = sdO + 2 * kTileQ;
  const uint32_t sD = sL + 2 * kBr * 4;
  const float* sL_ptr = reinterpret_cast<const float*>(smem + (sL - sK));
  const float* sD_ptr = reinterpret_cast<const float*>(smem + (sD - sK));

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bg = blockIdx.y, b = bg / p.Hkv, hkv = bg % p.Hkv;
  const int T = p.T;
  const int k0 = blockIdx.x * kBc;
  // Query tiles that see a key of this tile: from the one holding query k0 to the last.
  const int qi0 = k0 / kBr;
  const int nq = (T + kBr - 1) / kBr - qi0;
  const int n_it = p.group * nq;  // iteration it: head hkv·group + it / nq, tile qi0 + it % nq

  load_tile<kBc, kDh, kThreads>(sK, p.k + b * p.k_sb + hkv * p.k_sh + k0 * p.k_st, p.k_st, T - k0,
                                tid);
  load_tile<kBc, kDh, kThreads>(sV, p.v + b * p.v_sb + hkv * p.v_sh + k0 * p.v_st, p.v_st, T - k0,
                                tid);
  auto issue = [&](int it, int stage) {
    const int h = hkv * p.group + it / nq;
    const int q0 = (qi0 + it % nq) * kBr;
    load_tile<kBr, kDh, kThreads>(sQ + stage * kTileQ, p.q + b * p.q_sb + h * p.q_sh + q0 * p.q_st,
                                  p.q_st, T - q0, tid);
    load_tile<kBr, kDh, kThreads>(sdO + stage * kTileQ,
                                  p.dout + b * p.do_sb + h * p.do_sh + q0 * p.do_st, p.do_st,
                                  T - q0, tid);
    const int64_t row0 = (static_cast<int64_t>(b) * p.H + h) * T + q0;
    load_vec<kBr>(sL + stage * kBr * 4, p.lse2 + row0, T - q0, tid);
    load_vec<kBr>(sD + stage * kBr * 4, p.delta + row0, T - q0, tid);
  };
  issue(0, 0);
  cp_async_commit();  // group 0: K, V and the first query tile

  const int wk0 = k0 + warp * kKeysW;    // first key of this warp
  const int key_lo = wk0 + (lane >> 2);  // keys of m-tile mt: key_lo + 16·mt and + 8
  const int c2 = 2 * (lane & 3);

  float dk[kMt][kDh / 8][4], dv[kMt][kDh / 8][4];  // [16·kMt keys, Dh] each
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int i = 0; i < kDh / 8; ++i) {
      dk[mt][i][0] = dk[mt][i][1] = dk[mt][i][2] = dk[mt][i][3] = 0.0f;
      dv[mt][i][0] = dv[mt][i][1] = dv[mt][i][2] = dv[mt][i][3] = 0.0f;
    }
  }

  for (int it = 0; it < n_it; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_it) issue(it + 1, stage ^ 1);  // stage ^ 1 was released by the last barrier
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int q0 = (qi0 + it % nq) * kBr;
    // kStoreDs: this (head, key tile, query tile)'s dSᵀ tile [64 keys, 64 queries].
    uint16_t* ds_t = nullptr;
    if constexpr (kStoreDs) {
      ds_t = ds_tile(p.ds, int64_t(b) * p.H + hkv * p.group + it / nq, (T + 63) / 64, blockIdx.x,
                     q0 / 64);
    }
    // Skip when every query of the tile precedes every key of the warp, or the warp's keys are
    // all past T.
    if (q0 + kBr - 1 >= wk0 && wk0 < T) {
      const uint32_t sQs = sQ + stage * kTileQ, sdOs = sdO + stage * kTileQ;
      const float* lrow = sL_ptr + stage * kBr;         // [Br]
      const float* drow = sD_ptr + stage * kBr;         // [Br]
      float st[kMt][kBr / 8][4], dpt[kMt][kBr / 8][4];  // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: [16·kMt, Br]
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int i = 0; i < kBr / 8; ++i) {
          st[mt][i][0] = st[mt][i][1] = st[mt][i][2] = st[mt][i][3] = 0.0f;
          dpt[mt][i][0] = dpt[mt][i][1] = dpt[mt][i][2] = dpt[mt][i][3] = 0.0f;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kDh / 16; ++kk) {
        uint32_t ka[kMt][4], va[kMt][4];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          ldsm_x4(a_frag_addr<kDh>(sK, warp * kKeysW + mt * 16, kk * 16, lane), ka[mt]);
          ldsm_x4(a_frag_addr<kDh>(sV, warp * kKeysW + mt * 16, kk * 16, lane), va[mt]);
        }
#pragma unroll
        for (int np = 0; np < kBr / 16; ++np) {
          uint32_t qb[4], ob[4];
          ldsm_x4(bn_frag_addr<kDh>(sQs, np * 16, kk * 16, lane), qb);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(st[mt][2 * np], ka[mt], qb[0], qb[1]);
            mma_bf16(st[mt][2 * np + 1], ka[mt], qb[2], qb[3]);
          }
          ldsm_x4(bn_frag_addr<kDh>(sdOs, np * 16, kk * 16, lane), ob);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(dpt[mt][2 * np], va[mt], ob[0], ob[1]);
            mma_bf16(dpt[mt][2 * np + 1], va[mt], ob[2], ob[3]);
          }
        }
      }
      // Pᵀ = 2^(scale_log2·s − lse2) and dSᵀ = Pᵀ ∘ (dPᵀ − delta); element e of block nb of
      // m-tile mt is key key_lo + 16·mt + 8·(e/2), query q0 + 8·nb + c2 + e%2. Masked: queries
      // before the key and the zero-filled queries ≥ T.
      const bool need_mask = q0 < wk0 + kKeysW - 1 || q0 + kBr > T;
#pragma unroll
      for (int nb = 0; nb < kBr / 8; ++nb) {
        const float2 lq = *reinterpret_cast<const float2*>(lrow + nb * 8 + c2);
        const float2 dd = *reinterpret_cast<const float2*>(drow + nb * 8 + c2);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qq = q0 + nb * 8 + c2 + (e & 1);
            const int key = key_lo + 16 * mt + ((e >> 1) << 3);
            float pv = fast_exp2(fmaf(st[mt][nb][e], p.scale_log2, -((e & 1) ? lq.y : lq.x)));
            if (need_mask && (qq < key || qq >= T)) pv = 0.0f;
            st[mt][nb][e] = pv;
            dpt[mt][nb][e] = pv * (dpt[mt][nb][e] - ((e & 1) ? dd.y : dd.x));
          }
        }
      }
      // dV += Pᵀ·dO and dK += dSᵀ·Q over the tile's queries (Pᵀ, dSᵀ rounded to bf16).
#pragma unroll
      for (int kp = 0; kp < kBr / 16; ++kp) {
        uint32_t pa[kMt][4], da[kMt][4];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          pa[mt][0] = pack_bf16(st[mt][2 * kp][0], st[mt][2 * kp][1]);
          pa[mt][1] = pack_bf16(st[mt][2 * kp][2], st[mt][2 * kp][3]);
          pa[mt][2] = pack_bf16(st[mt][2 * kp + 1][0], st[mt][2 * kp + 1][1]);
          pa[mt][3] = pack_bf16(st[mt][2 * kp + 1][2], st[mt][2 * kp + 1][3]);
          da[mt][0] = pack_bf16(dpt[mt][2 * kp][0], dpt[mt][2 * kp][1]);
          da[mt][1] = pack_bf16(dpt[mt][2 * kp][2], dpt[mt][2 * kp][3]);
          da[mt][2] = pack_bf16(dpt[mt][2 * kp + 1][0], dpt[mt][2 * kp + 1][1]);
          da[mt][3] = pack_bf16(dpt[mt][2 * kp + 1][2], dpt[mt][2 * kp + 1][3]);
          if constexpr (kStoreDs) {
            // Rows key_lo (+8) of the tile, query columns 16·kp + c2 (+8): the same bf16 dSᵀ.
            uint16_t* row0 = ds_t + (key_lo - k0 + 16 * mt) * 64 + 16 * kp + c2;
            *reinterpret_cast<uint32_t*>(row0) = da[mt][0];
            *reinterpret_cast<uint32_t*>(row0 + 8 * 64) = da[mt][1];
            *reinterpret_cast<uint32_t*>(row0 + 8) = da[mt][2];
            *reinterpret_cast<uint32_t*>(row0 + 8 * 64 + 8) = da[mt][3];
          }
        }
#pragma unroll
        for (int dp = 0; dp < kDh / 16; ++dp) {
          uint32_t ob[4], qb[4];
          ldsm_x4_t(bk_frag_addr<kDh>(sdOs, kp * 16, dp * 16, lane), ob);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(dv[mt][2 * dp], pa[mt], ob[0], ob[1]);
            mma_bf16(dv[mt][2 * dp + 1], pa[mt], ob[2], ob[3]);
          }
          ldsm_x4_t(bk_frag_addr<kDh>(sQs, kp * 16, dp * 16, lane), qb);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(dk[mt][2 * dp], da[mt], qb[0], qb[1]);
            mma_bf16(dk[mt][2 * dp + 1], da[mt], qb[2], qb[3]);
          }
        }
      }
    } else if constexpr (kStoreDs) {
      // Keys past T (the only skipped warps of a 64×64 tiling): their dSᵀ rows are 0.
      for (int i = lane; i < kKeysW * 8; i += 32) {
        *reinterpret_cast<uint4*>(ds_t + (warp * kKeysW + i / 8) * 64 + (i % 8) * 8) =
            make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();  // stage `stage` is overwritten by the copy issued in iteration it + 1
  }

#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key_lo + 16 * mt + 8 * r;
      if (key >= T) continue;
      uint16_t* dkrow = p.dk + b * p.dk_sb + key * p.dk_st + hkv * p.dk_sh + c2;
      uint16_t* dvrow = p.dv + b * p.dv_sb + key * p.dv_st + hkv * p.dv_sh + c2;
#pragma unroll
      for (int i = 0; i < kDh / 8; ++i) {
        *reinterpret_cast<uint32_t*>(dkrow + i * 8) =
            pack_bf16(dk[mt][i][2 * r] * p.scale, dk[mt][i][2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dvrow + i * 8) =
            pack_bf16(dv[mt][i][2 * r], dv[mt][i][2 * r + 1]);
      }
    }
  }
}

// The elementwise part of the wgmma dK/dV pass on one [64 keys, 64 queries] tile, in place:
// Pᵀ = 2^(scale_log2·s − lse2) into st and dSᵀ = Pᵀ ∘ (dPᵀ − delta) into dpt (lrow, drow: the
// tile's lse2 and delta). kMask: zero the queries before the key and the zero-filled ones ≥ T
// (keys ≥ T are after every valid query).
template <bool kMask>
__device__ __forceinline__ void dkv_probs_and_grads(float (&st)[32], float (&dpt)[32],
                                                    const float* lrow, const float* drow, int q0,
                                                    int key_lo, int c2, int T, float scale_log2) {
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    const float2 lq = *reinterpret_cast<const float2*>(lrow + jb * 8 + c2);
    const float2 dd = *reinterpret_cast<const float2*>(drow + jb * 8 + c2);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * jb + e;
      float pv = fast_exp2(fmaf(st[i], scale_log2, -((e & 1) ? lq.y : lq.x)));
      if (kMask) {
        const int qq = q0 + jb * 8 + c2 + (e & 1);
        const int key = key_lo + ((e >> 1) << 3);
        if (qq < key || qq >= T) pv = 0.0f;
      }
      st[i] = pv;
      dpt[i] = pv * (dpt[i] - ((e & 1) ? dd.y : dd.x));
    }
  }
}

// The tensor maps of the TMA backward passes (tma::make_bthd_map): boxes of 64 positions × 64
// channels.
struct BwdMaps {
  CUtensorMap q;     // over q [B, T, H, Dh]
  CUtensorMap dout;  // over dout [B, T, H, Dh]
  CUtensorMap k;     // over k [B, T, Hkv, Dh]
  CUtensorMap v;     // over v [B, T, Hkv, Dh]
};

// The dK/dV pass on warpgroup MMAs (Dh 64 and 128): one warpgroup owns 64 keys (warp w: keys
// 16w..) and streams 64-query tiles of every query head of its group, as attn_bwd_dkv_kernel<Dh,
// 4, 64, 1> does. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ read K, V, Q and dO straight from the swizzled shared
// tiles (all K-major); dV += Pᵀ·dO and dK += dSᵀ·Q take Pᵀ, dSᵀ from registers and dO, Q as
// N-major shared operands (Dh 128: products over Dh sum the two 64-column panels, products
// into Dh run per panel). The per-element softmax math is attn_bwd_dkv_kernel's.
// kTma: K, V, Q and dO come through the TMA unit (one thread issues the copies; Q/dO stage s
// completes on mbarrier s, K and V on a third), instead of 128 threads' cp.async chunks;
// lse2 and delta stay cp.async (rows past T must read as zeros, not as the next head's).
// Shared: K | V | Q [2] | dO [2] ([64, Dh] bf16 each, panel layout, 1024-byte aligned) |
//         lse2 [2][64] | delta [2][64] f32 | (kTma) 3 mbarriers.
template <int kDh, bool kTma>
__global__ void __launch_bounds__(128)
    attn_bwd_dkv_wgmma_kernel(const BwdParams p, const __grid_constant__ BwdMaps maps) {
  pdl::grid_sync();
  constexpr int kB = 64, kThreads = 128, kPanels = kDh / 64;
  constexpr int kTile = kB * kDh * 2, kPanel = kB * 128;  // bytes
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t raw = smem_addr(smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t sK = base, sV = base + kTile, sQ = base + 2 * kTile, sdO = base + 4 * kTile;
  const uint32_t sL = base + 6 * kTile, sD = sL + 2 * kB * 4;
  const float* sL_ptr = reinterpret_cast<const float*>(smem + (sL - raw));
  const float* sD_ptr = reinterpret_cast<const float*>(smem + (sD - raw));

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Grid: heavy_first over (key tiles, B·Hkv), key tile 0 (the most queries) the heaviest.
  const int T = p.T;
  const TileRow tr = heavy_first((T + kB - 1) / kB, p.chunk_kv);
  const int bg = tr.row, b = bg / p.Hkv, hkv = bg % p.Hkv;
  const int k0 = tr.tile * kB;
  const int qi0 = k0 / kB;
  const int nq = (T + kB - 1) / kB - qi0;
  const int n_it = p.group * nq;

  // Barriers (kTma): Q/dO stage 0 and 1, then K and V.
  constexpr int kBarKv = 2;
  const TmaTiles<kDh> tiles(sD + 2 * kB * 4, kTma ? 3 : 0, b);
  const TileCopy<kB, kDh, kThreads> q_copy(tid, p.q_st), do_copy(tid, p.do_st);
  if constexpr (kTma) {
    if (tid == 0) {
      tiles.expect(kBarKv, 2 * kTile);
      tiles.load(sK, &maps.k, kBarKv, hkv, k0);
      tiles.load(sV, &maps.v, kBarKv, hkv, k0);
    }
  } else {
    TileCopy<kB, kDh, kThreads>(tid, p.k_st)
        .start(sK, p.k + b * p.k_sb + hkv * p.k_sh + k0 * p.k_st, T - k0);
    TileCopy<kB, kDh, kThreads>(tid, p.v_st)
        .start(sV, p.v + b * p.v_sb + hkv * p.v_sh + k0 * p.v_st, T - k0);
  }
  auto issue = [&](int it, int stage) {
    const int h = hkv * p.group + it / nq;
    const int q0 = (qi0 + it % nq) * kB;
    if constexpr (kTma) {
      if (tid == 0) {
        tiles.expect(stage, 2 * kTile);
        tiles.load(sQ + stage * kTile, &maps.q, stage, h, q0);
        tiles.load(sdO + stage * kTile, &maps.dout, stage, h, q0);
      }
    } else {
      q_copy.start(sQ + stage * kTile, p.q + b * p.q_sb + h * p.q_sh + q0 * p.q_st, T - q0);
      do_copy.start(sdO + stage * kTile, p.dout + b * p.do_sb + h * p.do_sh + q0 * p.do_st, T - q0);
    }
    const int64_t row0 = (static_cast<int64_t>(b) * p.H + h) * T + q0;
    load_vec<kB>(sL + stage * kB * 4, p.lse2 + row0, T - q0, tid);
    load_vec<kB>(sD + stage * kB * 4, p.delta + row0, T - q0, tid);
  };
  issue(0, 0);
  cp_async_commit();

  const int key_lo = k0 + warp * 16 + (lane >> 2);  // keys key_lo and key_lo + 8
  const int c2 = 2 * (lane & 3);
  // dK, dV [64 keys, Dh]: element i of panel pn at key key_lo + 8·((i>>1)&1), column 64pn +
  // 8·(i>>2) + c2 + (i&1).
  float dk[kPanels][32], dv[kPanels][32];
  zero_acc(dk);
  zero_acc(dv);

  for (int it = 0; it < n_it; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_it) issue(it + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    if constexpr (!kTma) wgmma::fence_proxy_async();
    __syncthreads();
    if constexpr (kTma) {
      if (it == 0) tiles.wait(kBarKv, 0);
      tiles.wait(stage, (it >> 1) & 1);
    }
    const int q0 = (qi0 + it % nq) * kB;
    const uint32_t sQs = sQ + stage * kTile, sdOs = sdO + stage * kTile;
    const float* lrow = sL_ptr + stage * kB;
    const float* drow = sD_ptr + stage * kB;
    float st[32], dpt[32];  // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: [64 keys, 64 queries]
    wgmma::fence();
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      wgmma::issue_kmajor_64(st, sK + pn * kPanel, sQs + pn * kPanel, /*overwrite=*/pn == 0);
    }
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      wgmma::issue_kmajor_64(dpt, sV + pn * kPanel, sdOs + pn * kPanel, /*overwrite=*/pn == 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    // Only tiles that reach the diagonal or T need the mask (a separate unrolled body).
    if (q0 < k0 + kB - 1 || q0 + kB > T) {
      dkv_probs_and_grads<true>(st, dpt, lrow, drow, q0, key_lo, c2, T, p.scale_log2);
    } else {
      dkv_probs_and_grads<false>(st, dpt, lrow, drow, q0, key_lo, c2, T, p.scale_log2);
    }
    // dV += Pᵀ·dO and dK += dSᵀ·Q over the tile's queries (Pᵀ, dSᵀ rounded to bf16).
    uint32_t pa[4][4], da[4][4];
    acc_to_a_bf16(st, pa);
    acc_to_a_bf16(dpt, da);
    wgmma::fence();
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      wgmma::issue_rs_nmajor_64(dv[pn], pa, sdOs + pn * kPanel);
      wgmma::issue_rs_nmajor_64(dk[pn], da, sQs + pn * kPanel);
    }
    wgmma::commit();
    wgmma::wait<0>();
    __syncthreads();  // stage `stage` is overwritten by the copy issued in iteration it + 1
  }

  // dK · scale and dV as bf16, staged through the shared memory of the Q/dO stages (free now).
  uint8_t* stage_tile = smem + (sQ - raw);
  store_acc_tile_bf16<kPanels>(stage_tile, dk, p.scale,
                               p.dk + b * p.dk_sb + k0 * p.dk_st + hkv * p.dk_sh, p.dk_st, T - k0);
  store_acc_tile_bf16<kPanels>(stage_tile, dv, 1.0f,
                               p.dv + b * p.dv_sb + k0 * p.dv_st + hkv * p.dv_sh, p.dv_st, T - k0);
}

// The elementwise part of the wgmma dQ pass on one [64 queries, 64 keys] tile, in place:
// dS = P ∘ (dP − delta) into sv, P = 2^(scale_log2·s − lse2) (lq, dlt: lse2 and delta of the
// thread's rows r_lo, r_lo + 8). kMask: zero the keys after the query.
template <bool kMask>
__device__ __forceinline__ void dq_score_grads(float (&sv)[32], const float (&dpv)[32],
                                               const float (&lq)[2], const float (&dlt)[2], int k0,
                                               int r_lo, int c2, float scale_log2) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int r = (i >> 1) & 1;
    float pv = fast_exp2(fmaf(sv[i], scale_log2, -lq[r]));
    if (kMask && k0 + 8 * (i >> 2) + c2 + (i & 1) > r_lo + 8 * r) pv = 0.0f;
    sv[i] = pv * (dpv[i] - dlt[r]);
  }
}

// dS of one [64 queries, 64 keys] tile of the wgmma dQ pass from key k0 (only the tile on the
// diagonal runs the masked body), rounded to bf16 as the register A operand of dS·K.
__device__ __forceinline__ void dq_tile_ds(float (&sv)[32], const float (&dpv)[32],
                                           const float (&lq)[2], const float (&dlt)[2], int k0,
                                           int q0, int r_lo, int c2, float scale_log2,
                                           uint32_t (&da)[4][4]) {
  if (k0 + 63 > q0) {
    dq_score_grads<true>(sv, dpv, lq, dlt, k0, r_lo, c2, scale_log2);
  } else {
    dq_score_grads<false>(sv, dpv, lq, dlt, k0, r_lo, c2, scale_log2);
  }
  acc_to_a_bf16(sv, da);
}

// The dQ pass's epilogue: dQ · scale as bf16 into the block's 64 query rows from q0 (< T) of
// (batch b, head h), staged through the shared memory at `tile` (free by now).
template <int kPanels>
__device__ __forceinline__ void store_dq(const BwdParams& p, uint8_t* tile,
                                         const float (&dqa)[kPanels][32], int b, int h, int q0) {
  store_acc_tile_bf16<kPanels>(tile, dqa, p.scale, p.dq + b * p.dq_sb + q0 * p.dq_st + h * p.dq_sh,
                               p.dq_st, p.T - q0);
}

// The dQ pass on warpgroup MMAs (Dh 64 and 128): one warpgroup owns 64 queries and streams
// 64-key tiles up to the diagonal, as attn_bwd_dq_kernel does. S = Q·Kᵀ and dP = dO·Vᵀ read Q,
// dO, K, V straight from the swizzled shared tiles (all K-major; Dh 128 sums the two panels);
// dQ += dS·K takes dS from registers and K as an N-major shared operand (per panel).
// Per-element math as attn_bwd_dq_kernel's.
// Shared: Q | dO | K [2] | V [2] ([64, Dh] bf16 each, panel layout, 1024-byte aligned).
template <int kDh>
__global__ void __launch_bounds__(128) attn_bwd_dq_wgmma_kernel(const BwdParams p) {
  pdl::grid_sync();
  constexpr int kB = 64, kThreads = 128, kPanels = kDh / 64;
  constexpr int kTile = kB * kDh * 2, kPanel = kB * 128;  // bytes
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sQ = base, sdO = base + kTile, sK = base + 2 * kTile, sV = base + 4 * kTile;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const QueryTile qtile = query_tile<kB, kB>(p);
  const int bh = qtile.bh, b = qtile.b, h = qtile.h, q0 = qtile.q0, n_kt = qtile.n_kt, T = p.T;
  const uint16_t *kg = qtile.kg, *vg = qtile.vg;
  TileCopy<kB, kDh, kThreads>(tid, p.q_st)
      .start(sQ, p.q + b * p.q_sb + h * p.q_sh + q0 * p.q_st, T - q0);
  TileCopy<kB, kDh, kThreads>(tid, p.do_st)
      .start(sdO, p.dout + b * p.do_sb + h * p.do_sh + q0 * p.do_st, T - q0);
  const TileCopy<kB, kDh, kThreads> k_copy(tid, p.k_st), v_copy(tid, p.v_st);
  k_copy.start(sK, kg, T);
  v_copy.start(sV, vg, T);
  cp_async_commit();

  const int r_lo = q0 + warp * 16 + (lane >> 2);  // rows r_lo and r_lo + 8
  const int c2 = 2 * (lane & 3);
  float lq[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) row_stats(p, bh, r_lo + 8 * r, lq[r], dlt[r]);
  // dQ [64 queries, Dh]: element i of panel pn at row r_lo + 8·((i>>1)&1), column 64pn +
  // 8·(i>>2) + c2 + (i&1).
  float dqa[kPanels][32];
  zero_acc(dqa);

  for (int j = 0; j < n_kt; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kt) {
      const int k1 = (j + 1) * kB;
      k_copy.start(sK + (stage ^ 1) * kTile, kg + k1 * p.k_st, T - k1);
      v_copy.start(sV + (stage ^ 1) * kTile, vg + k1 * p.v_st, T - k1);
    }
    cp_async_commit();
    cp_async_wait<1>();
    wgmma::fence_proxy_async();
    __syncthreads();
    const uint32_t sKs = sK + stage * kTile, sVs = sV + stage * kTile;
    float sv[32], dpv[32];  // S = Q·Kᵀ, dP = dO·Vᵀ: [64 queries, 64 keys]
    wgmma::fence();
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      wgmma::issue_kmajor_64(sv, sQ + pn * kPanel, sKs + pn * kPanel, /*overwrite=*/pn == 0);
    }
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      wgmma::issue_kmajor_64(dpv, sdO + pn * kPanel, sVs + pn * kPanel, /*overwrite=*/pn == 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    // dQ += dS·K (dS rounded to bf16).
    uint32_t da[4][4];
    dq_tile_ds(sv, dpv, lq, dlt, j * kB, q0, r_lo, c2, p.scale_log2, da);
    wgmma::fence();
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) wgmma::issue_rs_nmajor_64(dqa[pn], da, sKs + pn * kPanel);
    wgmma::commit();
    wgmma::wait<0>();
    __syncthreads();  // stage `stage` is overwritten by the copy issued in iteration j + 1
  }

  store_dq(p, smem + (base - smem_addr(smem)), dqa, b, h, q0);
}

// attn_bwd_dq_wgmma_kernel with its tiles brought in by the TMA unit (as the TMA forward): K and
// V have one stage each with a barrier each, V_{j+1} loading while dS_j and dQ += dS_j·K_j run,
// K_{j+1} once that product is done. Four [64, Dh] tiles instead of six let three Dh 128 blocks
// share an SM instead of two (the pass is latency-bound like the forward). Same arithmetic.
// Shared: Q | dO | K | V ([64, Dh] each, panel layout, 1024-aligned) | 2 mbarriers (K, V).
template <int kDh>
__global__ void __launch_bounds__(128)
    attn_bwd_dq_wgmma_tma_kernel(const BwdParams p, const __grid_constant__ BwdMaps maps) {
  pdl::grid_sync();
  constexpr int kB = 64, kPanels = kDh / 64;
  constexpr int kTile = kB * kDh * 2;  // bytes
  constexpr int kBarK = 0, kBarV = 1;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sQ = base, sdO = base + kTile, sK = base + 2 * kTile, sV = base + 3 * kTile;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const QueryTile qtile = query_tile<kB, kB>(p);
  const int bh = qtile.bh, b = qtile.b, h = qtile.h, q0 = qtile.q0, n_kt = qtile.n_kt;
  const int hkv = h / p.group;
  const TmaTiles<kDh> tiles(base + 4 * kTile, 2, b);
  if (tid == 0) {
    tiles.expect(kBarK, 3 * kTile);  // Q, dO and K_0
    tiles.load(sQ, &maps.q, kBarK, h, q0);
    tiles.load(sdO, &maps.dout, kBarK, h, q0);
    tiles.load(sK, &maps.k, kBarK, hkv, 0);
    tiles.expect(kBarV, kTile);
    tiles.load(sV, &maps.v, kBarV, hkv, 0);
  }

  const int r_lo = q0 + warp * 16 + (lane >> 2);  // rows r_lo and r_lo + 8
  const int c2 = 2 * (lane & 3);
  float lq[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) row_stats(p, bh, r_lo + 8 * r, lq[r], dlt[r]);
  // dQ [64 queries, Dh]: element i of panel pn at row r_lo + 8·((i>>1)&1), column 64pn +
  // 8·(i>>2) + c2 + (i&1).
  float dqa[kPanels][32];
  zero_acc(dqa);
  // Low descriptor words of the tiles (wgmma::desc_lo).
  const uint32_t q_lo = wgmma::desc_lo(sQ, 16), do_lo = wgmma::desc_lo(sdO, 16);
  const uint32_t k_lo = wgmma::desc_lo(sK, 16), v_lo = wgmma::desc_lo(sV, 16);
  const uint32_t kn_lo = wgmma::desc_lo(sK, 8192);  // K as the N-major operand of dS·K

  for (int j = 0; j < n_kt; ++j) {
    const bool more = j + 1 < n_kt;
    tiles.wait(kBarK, j & 1);  // K_j (and Q, dO)
    tiles.wait(kBarV, j & 1);  // V_j
    float sv[32], dpv[32];     // S = Q·Kᵀ, dP = dO·Vᵀ: [64 queries, 64 keys]
    wgmma::fence();
    issue_panels_kmajor<kPanels>(sv, q_lo, k_lo);
    issue_panels_kmajor<kPanels>(dpv, do_lo, v_lo);
    wgmma::commit();
    wgmma::wait<0>();
    // Every warp is done with V_j: its stage takes V_{j+1}.
    tiles.refill(more, sV, &maps.v, kBarV, hkv, (j + 1) * kB);
    // dQ += dS·K (dS rounded to bf16).
    uint32_t da[4][4];
    dq_tile_ds(sv, dpv, lq, dlt, j * kB, q0, r_lo, c2, p.scale_log2, da);
    wgmma::fence();
    issue_panels_rs<kPanels>(dqa, da, kn_lo);
    wgmma::commit();
    wgmma::wait<0>();
    // Every warp is done with K_j: its stage takes K_{j+1}.
    tiles.refill(more, sK, &maps.k, kBarK, hkv, (j + 1) * kB);
  }
  store_dq(p, smem + (base - smem_addr(smem)), dqa, b, h, q0);
}

// Grid: (query tiles, B·H), reversed like the forward. Each warp owns kMt 16-query m-tiles.
// Shared: Q [Br, Dh] | dO [Br, Dh] | K [2][Bc, Dh] | V [2][Bc, Dh], bf16, swizzled.
template <int kDh, int kWarps, int kBc, int kMt>
__global__ void __launch_bounds__(kWarps * 32) attn_bwd_dq_kernel(const BwdParams p) {
  pdl::grid_sync();
  constexpr int kThreads = kWarps * 32;
  constexpr int kRowsW = 16 * kMt;
  constexpr int kBr = kRowsW * kWarps;
  constexpr int kTileBytes = kBc * kDh * 2;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sdO = sQ + kBr * kDh * 2;
  const uint32_t sK = sdO + kBr * kDh * 2;
  const uint32_t sV = sK + 2 * kTileBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const QueryTile qtile = query_tile<kBr, kBc>(p);
  const int bh = qtile.bh, b = qtile.b, h = qtile.h, q0 = qtile.q0, n_kt = qtile.n_kt, T = p.T;
  const uint16_t *kg = qtile.kg, *vg = qtile.vg;

  load_tile<kBr, kDh, kThreads>(sQ, p.q + b * p.q_sb + h * p.q_sh + q0 * p.q_st, p.q_st, T - q0,
                                tid);
  load_tile<kBr, kDh, kThreads>(sdO, p.dout + b * p.do_sb + h * p.do_sh + q0 * p.do_st, p.do_st,
                                T - q0, tid);
  load_kv_tile<kBc, kDh, kThreads>(p, sK, sV, 0, kg, vg, 0, tid);
  cp_async_commit();

  const int wq0 = q0 + warp * kRowsW;
  const int r_lo = wq0 + (lane >> 2);  // rows of m-tile mt: r_lo + 16·mt and + 8
  const int c2 = 2 * (lane & 3);
  float lq[kMt][2], dlt[kMt][2];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) row_stats(p, bh, r_lo + 16 * mt + 8 * r, lq[mt][r], dlt[mt][r]);
  }

  float dqa[kMt][kDh / 8][4];  // dQ accumulator, [16·kMt queries, Dh]
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int i = 0; i < kDh / 8; ++i) {
      dqa[mt][i][0] = dqa[mt][i][1] = dqa[mt][i][2] = dqa[mt][i][3] = 0.0f;
    }
  }

  for (int j = 0; j < n_kt; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_kt) {
      load_kv_tile<kBc, kDh, kThreads>(p, sK, sV, stage ^ 1, kg, vg, j + 1, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int k0 = j * kBc;
    if (k0 <= wq0 + kRowsW - 1) {
      const uint32_t sKs = sK + stage * kTileBytes, sVs = sV + stage * kTileBytes;
      // S = Q·Kᵀ and dP = dO·Vᵀ, [16·kMt queries, Bc keys]
      float s[kMt][kBc / 8][4], dpv[kMt][kBc / 8][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i) {
          s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
          dpv[mt][i][0] = dpv[mt][i][1] = dpv[mt][i][2] = dpv[mt][i][3] = 0.0f;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kDh / 16; ++kk) {
        uint32_t qa[kMt][4], oa[kMt][4];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          ldsm_x4(a_frag_addr<kDh>(sQ, warp * kRowsW + mt * 16, kk * 16, lane), qa[mt]);
          ldsm_x4(a_frag_addr<kDh>(sdO, warp * kRowsW + mt * 16, kk * 16, lane), oa[mt]);
        }
#pragma unroll
        for (int np = 0; np < kBc / 16; ++np) {
          uint32_t kb[4], vb[4];
          ldsm_x4(bn_frag_addr<kDh>(sKs, np * 16, kk * 16, lane), kb);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(s[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma_bf16(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
          ldsm_x4(bn_frag_addr<kDh>(sVs, np * 16, kk * 16, lane), vb);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(dpv[mt][2 * np], oa[mt], vb[0], vb[1]);
            mma_bf16(dpv[mt][2 * np + 1], oa[mt], vb[2], vb[3]);
          }
        }
      }
      const bool need_mask = k0 + kBc - 1 > wq0;
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int nb = 0; nb < kBc / 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + nb * 8 + c2 + (e & 1);
            const int row = r_lo + 16 * mt + ((e >> 1) << 3);
            float pv = fast_exp2(fmaf(s[mt][nb][e], p.scale_log2, -lq[mt][e >> 1]));
            if (need_mask && key > row) pv = 0.0f;
            s[mt][nb][e] = pv * (dpv[mt][nb][e] - dlt[mt][e >> 1]);  // dS
          }
        }
      }
      // dQ += dS·K (dS rounded to bf16).
#pragma unroll
      for (int kp = 0; kp < kBc / 16; ++kp) {
        uint32_t da[kMt][4];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          da[mt][0] = pack_bf16(s[mt][2 * kp][0], s[mt][2 * kp][1]);
          da[mt][1] = pack_bf16(s[mt][2 * kp][2], s[mt][2 * kp][3]);
          da[mt][2] = pack_bf16(s[mt][2 * kp + 1][0], s[mt][2 * kp + 1][1]);
          da[mt][3] = pack_bf16(s[mt][2 * kp + 1][2], s[mt][2 * kp + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDh / 16; ++dp) {
          uint32_t kb[4];
          ldsm_x4_t(bk_frag_addr<kDh>(sKs, kp * 16, dp * 16, lane), kb);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(dqa[mt][2 * dp], da[mt], kb[0], kb[1]);
            mma_bf16(dqa[mt][2 * dp + 1], da[mt], kb[2], kb[3]);
          }
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r_lo + 16 * mt + 8 * r;
      if (row >= T) continue;
      uint16_t* dqrow = p.dq + b * p.dq_sb + row * p.dq_st + h * p.dq_sh + c2;
#pragma unroll
      for (int i = 0; i < kDh / 8; ++i) {
        *reinterpret_cast<uint32_t*>(dqrow + i * 8) =
            pack_bf16(dqa[mt][i][2 * r] * p.scale, dqa[mt][i][2 * r + 1] * p.scale);
      }
    }
  }
}

// dQ from the stored dSᵀ tiles (kStoreDs pass): one product, dQ = dS·K. Grid: (query tiles of
// 64, B·H), reversed like the forward; warp w owns queries 16w .. 16w + 15 of the tile and
// streams key tiles 0 .. qt: dSᵀ [64 keys, 64 queries] and K [64, Dh], two stages of cp.async.
// A (dS, 16 queries × 16 keys) comes from the dSᵀ tile by transposing loads: bn_frag_addr's
// matrices (rows +0/+8 × columns +0/+8 in the order 0, 1 = column +8, 2 = row +8, 3) are a0..a3
// of the transpose. Same arithmetic as attn_bwd_dq_kernel from there on (fp32 sum, one scale).
// Shared: dSᵀ [2][64, 64] | K [2][64, Dh] bf16, swizzled.
template <int kDh>
__global__ void __launch_bounds__(128) attn_bwd_dq_from_ds_kernel(const BwdParams p) {
  pdl::grid_sync();
  constexpr int kThreads = 128;
  constexpr int kTileS = 64 * 64 * 2, kTileK = 64 * kDh * 2;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sS = smem_addr(smem);
  const uint32_t sK = sS + 2 * kTileS;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const QueryTile qtile = query_tile<64, 64>(p);
  const int qt = qtile.qt, bh = qtile.bh, b = qtile.b, h = qtile.h, q0 = qtile.q0, T = p.T;
  const int n_tiles = (T + 63) / 64;
  const uint16_t* kg = qtile.kg;
  auto issue = [&](int kt, int stage) {
    load_tile<64, 64, kThreads>(sS + stage * kTileS, ds_tile(p.ds, bh, n_tiles, kt, qt), 64, 64,
                                tid);
    load_tile<64, kDh, kThreads>(sK + stage * kTileK, kg + int64_t(kt) * 64 * p.k_st, p.k_st,
                                 T - kt * 64, tid);
  };
  issue(0, 0);
  cp_async_commit();

  const int mq = warp * 16;  // the warp's first query row in the tile
  const int c2 = 2 * (lane & 3);
  float acc[kDh / 8][4];
#pragma unroll
  for (int i = 0; i < kDh / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int stage = kt & 1;
    if (kt < qt) issue(kt + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t sSs = sS + stage * kTileS, sKs = sK + stage * kTileK;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {  // 16 keys at a time
      uint32_t a[4];
      ldsm_x4_t(bn_frag_addr<64>(sSs, ks * 16, mq, lane), a);
#pragma unroll
      for (int dp = 0; dp < kDh / 16; ++dp) {
        uint32_t kb[4];
        ldsm_x4_t(bk_frag_addr<kDh>(sKs, ks * 16, dp * 16, lane), kb);
        mma_bf16(acc[2 * dp], a, kb[0], kb[1]);
        mma_bf16(acc[2 * dp + 1], a, kb[2], kb[3]);
      }
    }
    __syncthreads();  // stage `stage` is overwritten by the copy issued in iteration kt + 1
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + mq + (lane >> 2) + 8 * r;
    if (row >= T) continue;
    uint16_t* dqrow = p.dq + b * p.dq_sb + row * p.dq_st + h * p.dq_sh + c2;
#pragma unroll
    for (int i = 0; i < kDh / 8; ++i) {
      *reinterpret_cast<uint32_t*>(dqrow + i * 8) =
          pack_bf16(acc[i][2 * r] * p.scale, acc[i][2 * r + 1] * p.scale);
    }
  }
}

// ---- launchers
// -----------------------------------------------------------------------------------

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
}

int tiles_of(int T, int rows) { return (T + rows - 1) / rows; }

// The linear grid of the kernels whose blocks take their tile with heavy_first: tiles of
// tile_rows positions × `rows` (batch, head) pairs (check_grid bounds the product).
dim3 heavy_first_grid(int T, int tile_rows, int64_t rows) {
  return dim3(static_cast<unsigned>(tiles_of(T, tile_rows) * rows));
}

// Rows per chunk of a heavy_first grid of `rows` (batch, head) rows: one for kHeadByHead, all of
// them for kAllHeads.
int chunk_rows(int64_t rows, BlockOrder order) {
  return order == BlockOrder::kAllHeads ? static_cast<int>(std::max<int64_t>(rows, 1)) : 1;
}

// BlockOrder::kAuto for the wgmma dK/dV pass: its blocks each run group × (key tiles from theirs
// to the end) query tiles, so the heaviest block runs 2·slots / (rows·(n + 1)) of what each of
// the `slots` resident blocks runs on average (n key tiles, rows = B·Hkv). Over a fifth, a heavy
// block started late leaves a tail and the heaviest tiles of all heads go first. H100,
// 2026-11-26: T 4096 with 4 kv heads (ratio 0.51) −12 %; B8 T2048 H16 Dh128 (0.125) +8 % with
// all heads first.
BlockOrder dkv_order(Context& ctx, BlockOrder order, int64_t rows, int64_t T, int dh) {
  if (order != BlockOrder::kAuto) return order;
  const int64_t slots = int64_t(ops_cuda::sm_count(ctx.device().index)) *
                        (dh == 128 ? 2 : 3);  // registers: 232 / 168 per thread
  const int64_t n = (T + 63) / 64;
  return 10 * slots > rows * (n + 1) ? BlockOrder::kAllHeads : BlockOrder::kHeadByHead;
}

// BlockOrder::kAuto for the query-tile passes (forward, dQ): all heads first when both
//   (a) the sequence is long: n = ⌈T / 64⌉ ≥ 32 (T > 1984) for the forward, n ≥ 64 (T > 4032)
//       for the dQ pass. Heavy blocks (the query tiles at the end of the sequence run ~n 64-key
//       steps, the average one half that) then go first, over every head, instead of head after
//       head, which leaves the last head's heaviest tiles for the end of the pass; and
//   (b) the K and V of all (batch, kv head) rows fit in the L2 cache: all heads first touches
//       them at once, whereas head by head keeps one head's K/V hot while its query tiles run.
// H100, 2026-11-26 (AttentionGpu.PerfQueryBlockOrders, median of 5 interleaved rounds, all
// heads against head by head): forward T 1024 +6 to +11 % (so never), T 2048 −1 to −9 %,
// T 4096 −6 to −12 %; K/V over the L2 (B8 T2048 H16 Dh128, 134 MB) +30 %. The dQ pass gains
// only at T 4096 (−1 to −5 %; T 2048: −1 to +2 %).
BlockOrder query_order(Context& ctx, BlockOrder order, int64_t B, int64_t Hkv, int64_t T, int dh,
                       bool dq_pass) {
  if (order != BlockOrder::kAuto) return order;
  const int l2_bytes = ops_cuda::cached_device_attr(ctx.device().index, cudaDevAttrL2CacheSize);
  const int64_t n = (T + 63) / 64;
  const int64_t kv_bytes = 2 * B * Hkv * T * int64_t(dh) * 2;  // K and V, bf16
  const bool long_seq = n >= (dq_pass ? 64 : 32);
  return long_seq && kv_bytes <= int64_t(l2_bytes) ? BlockOrder::kAllHeads
                                                   : BlockOrder::kHeadByHead;
}

template <int kDh, int kWarps, int kBc, int kMt>
void launch_fwd(const FwdParams& p, int B, cudaStream_t stream) {
  constexpr int kBr = 16 * kMt * kWarps;
  const size_t smem = static_cast<size_t>(kBr + 4 * kBc) * kDh * 2;
  auto kernel = attn_fwd_kernel<kDh, kWarps, kBc, kMt>;
  set_smem(kernel, smem);
  pdl::launch(kernel, heavy_first_grid(p.T, kBr, B * p.H), kWarps * 32, smem, stream, p);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

// Launches a 128-thread wgmma kernel on the linear grid of (64-row tiles of T) × `rows` blocks with
// `smem` bytes of dynamic shared memory (its tiles plus 1024 bytes of room for their alignment).
template <typename... Params, typename... Args>
void launch_wgmma(void (*kernel)(Params...), size_t smem, int T, int rows, cudaStream_t stream,
                  const Args&... args) {
  set_smem(kernel, smem);
  pdl::launch(kernel, heavy_first_grid(T, 64, rows), 128, smem, stream, args...);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

constexpr size_t tiles_bytes(int n, int dh) { return size_t(n) * 64 * dh * 2 + 1024; }

template <int kDh>
void launch_dkv_wgmma(const BwdParams& p, const BwdMaps& maps, bool tma, int B,
                      cudaStream_t stream) {
  // K, V, Q [2], dO [2]; lse2 [2][64], delta [2][64]; (tma) 3 mbarriers.
  const size_t smem = tiles_bytes(6, kDh) + 4 * 64 * 4 + (tma ? 24 : 0);
  if (tma) {
    launch_wgmma(attn_bwd_dkv_wgmma_kernel<kDh, true>, smem, p.T, B * p.Hkv, stream, p, maps);
  } else {
    launch_wgmma(attn_bwd_dkv_wgmma_kernel<kDh, false>, smem, p.T, B * p.Hkv, stream, p, maps);
  }
}

template <int kDh>
void launch_dq_wgmma_tma(const BwdParams& p, const BwdMaps& maps, int B, cudaStream_t stream) {
  // Q, dO, K, V and two mbarriers.
  launch_wgmma(attn_bwd_dq_wgmma_tma_kernel<kDh>, tiles_bytes(4, kDh) + 16, p.T, B * p.H, stream, p,
               maps);
}

template <int kDh>
void launch_dq_wgmma(const BwdParams& p, int B, cudaStream_t stream) {
  // Q, dO, K [2], V [2].
  launch_wgmma(attn_bwd_dq_wgmma_kernel<kDh>, tiles_bytes(6, kDh), p.T, B * p.H, stream, p);
}

template <int kDh>
void launch_fwd_wgmma(const FwdParams& p, int B, cudaStream_t stream) {
  // Q, K [2], V [2].
  launch_wgmma(attn_fwd_wgmma_kernel<kDh>, tiles_bytes(5, kDh), p.T, B * p.H, stream, p);
}

template <int kDh>
void launch_fwd_wgmma_tma(const FwdParams& p, const FwdMaps& maps, int B, cudaStream_t stream) {
  // Q, K, V and two mbarriers.
  launch_wgmma(attn_fwd_wgmma_tma_kernel<kDh>, tiles_bytes(3, kDh) + 16, p.T, B * p.H, stream, p,
               maps);
}

template <int kDh, int kWarps, int kBr, int kMt, bool kStoreDs = false>
void launch_dkv(const BwdParams& p, int B, cudaStream_t stream) {
  constexpr int kBc = 16 * kMt * kWarps;
  const size_t smem = static_cast<size_t>(2 * kBc + 4 * kBr) * kDh * 2 + 4 * kBr * 4;
  auto kernel = attn_bwd_dkv_kernel<kDh, kWarps, kBr, kMt, kStoreDs>;
  set_smem(kernel, smem);
  const dim3 grid(tiles_of(p.T, kBc), B * p.Hkv);
  pdl::launch(kernel, grid, kWarps * 32, smem, stream, p);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <int kDh, int kWarps, int kBc, int kMt>
void launch_dq(const BwdParams& p, int B, cudaStream_t stream) {
  constexpr int kBr = 16 * kMt * kWarps;
  const size_t smem = static_cast<size_t>(2 * kBr + 4 * kBc) * kDh * 2;
  auto kernel = attn_bwd_dq_kernel<kDh, kWarps, kBc, kMt>;
  set_smem(kernel, smem);
  pdl::launch(kernel, heavy_first_grid(p.T, kBr, B * p.H), kWarps * 32, smem, stream, p);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <int kDh>
void launch_dq_from_ds(const BwdParams& p, int B, cudaStream_t stream) {
  const size_t smem = 2 * (64 * 64 * 2) + 2 * (64 * kDh * 2);
  auto kernel = attn_bwd_dq_from_ds_kernel<kDh>;
  set_smem(kernel, smem);
  pdl::launch(kernel, heavy_first_grid(p.T, 64, B * p.H), 128, smem, stream, p);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

// The compiled (warps, tile, m-tiles per warp) triples of each kernel family, by head dim; the
// dispatchers below name the same combinations.
struct Variant {
  int warps, tile, mt;
};

const std::vector<Variant>& fwd_variants(int dh) {
  static const std::vector<Variant> v64 = {{4, 64, 1}, {4, 128, 1}, {4, 64, 2}, {4, 32, 2}};
  static const std::vector<Variant> v128 = {{4, 64, 1}, {4, 64, 2}, {4, 32, 2}};
  return dh == 64 ? v64 : v128;
}

const std::vector<Variant>& dkv_variants(int dh) {
  static const std::vector<Variant> v64 = {{4, 64, 1}, {8, 64, 1}, {4, 32, 2}};
  static const std::vector<Variant> v128 = {{4, 64, 1}, {4, 32, 1}, {8, 32, 1}};
  return dh == 64 ? v64 : v128;
}

const std::vector<Variant>& dq_variants(int dh) {
  static const std::vector<Variant> v64 = {{4, 64, 1}, {4, 128, 1}, {4, 32, 2}, {4, 64, 2}};
  static const std::vector<Variant> v128 = {{4, 64, 1}, {4, 32, 2}, {4, 16, 2}};
  return dh == 64 ? v64 : v128;
}

void run_fwd(int dh, Variant t, const FwdParams& p, int B, cudaStream_t s) {
  if (dh == 64) {
    if (t.warps == 4 && t.tile == 64 && t.mt == 1) return launch_fwd<64, 4, 64, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 128 && t.mt == 1) return launch_fwd<64, 4, 128, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 64 && t.mt == 2) return launch_fwd<64, 4, 64, 2>(p, B, s);
    if (t.warps == 4 && t.tile == 32 && t.mt == 2) return launch_fwd<64, 4, 32, 2>(p, B, s);
  }
  if (dh == 128) {
    if (t.warps == 4 && t.tile == 64 && t.mt == 1) return launch_fwd<128, 4, 64, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 64 && t.mt == 2) return launch_fwd<128, 4, 64, 2>(p, B, s);
    if (t.warps == 4 && t.tile == 32 && t.mt == 2) return launch_fwd<128, 4, 32, 2>(p, B, s);
  }
  LOWBIT_CHECK(
      false,
      "attention_fwd: no kernel for Dh {} with {} warps, {}-key tiles and {} m-tiles per warp", dh,
      t.warps, t.tile, t.mt);
}

void run_dkv(int dh, Variant t, const BwdParams& p, int B, cudaStream_t s) {
  if (dh == 64) {
    if (t.warps == 4 && t.tile == 64 && t.mt == 1) return launch_dkv<64, 4, 64, 1>(p, B, s);
    if (t.warps == 8 && t.tile == 64 && t.mt == 1) return launch_dkv<64, 8, 64, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 32 && t.mt == 2) return launch_dkv<64, 4, 32, 2>(p, B, s);
  }
  if (dh == 128) {
    if (t.warps == 4 && t.tile == 64 && t.mt == 1) return launch_dkv<128, 4, 64, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 32 && t.mt == 1) return launch_dkv<128, 4, 32, 1>(p, B, s);
    if (t.warps == 8 && t.tile == 32 && t.mt == 1) return launch_dkv<128, 8, 32, 1>(p, B, s);
  }
  LOWBIT_CHECK(false,
               "attention_bwd: no dK/dV kernel for Dh {} with {} warps, {}-query tiles and {} "
               "m-tiles per warp",
               dh, t.warps, t.tile, t.mt);
}

// The dK/dV pass that stores dSᵀ, then the dQ pass from it (64×64 tiles: Variant {4, 64, 1}).
void run_dkv_ds_dq(int dh, const BwdParams& p, int B, cudaStream_t s) {
  if (dh == 64) {
    launch_dkv<64, 4, 64, 1, true>(p, B, s);
    return launch_dq_from_ds<64>(p, B, s);
  }
  launch_dkv<128, 4, 64, 1, true>(p, B, s);
  launch_dq_from_ds<128>(p, B, s);
}

void run_dq(int dh, Variant t, const BwdParams& p, int B, cudaStream_t s) {
  if (dh == 64) {
    if (t.warps == 4 && t.tile == 64 && t.mt == 1) return launch_dq<64, 4, 64, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 128 && t.mt == 1) return launch_dq<64, 4, 128, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 32 && t.mt == 2) return launch_dq<64, 4, 32, 2>(p, B, s);
    if (t.warps == 4 && t.tile == 64 && t.mt == 2) return launch_dq<64, 4, 64, 2>(p, B, s);
  }
  if (dh == 128) {
    if (t.warps == 4 && t.tile == 64 && t.mt == 1) return launch_dq<128, 4, 64, 1>(p, B, s);
    if (t.warps == 4 && t.tile == 32 && t.mt == 2) return launch_dq<128, 4, 32, 2>(p, B, s);
    if (t.warps == 4 && t.tile == 16 && t.mt == 2) return launch_dq<128, 4, 16, 2>(p, B, s);
  }
  LOWBIT_CHECK(
      false,
      "attention_bwd: no dQ kernel for Dh {} with {} warps, {}-key tiles and {} m-tiles per warp",
      dh, t.warps, t.tile, t.mt);
}

const uint16_t* bf16_in(const TensorView& t) { return t.ptr<const uint16_t>(); }
uint16_t* bf16_out(const TensorView& t) { return t.ptr<uint16_t>(); }

void check_grid(const char* op, int64_t B, int64_t heads, int64_t T) {
  LOWBIT_USER_CHECK(B * heads <= 65535,
                    "{}: B·heads = {} is above the GPU kernels' limit of 65535; split the batch",
                    op, B * heads);
  LOWBIT_USER_CHECK(T <= (int64_t{1} << 24),
                    "{}: T = {} is above the GPU kernels' limit of 2^24 positions", op, T);
  // The linear grids (heavy_first_grid) of 64-position tiles.
  LOWBIT_USER_CHECK(B * heads * ((T + 63) / 64) < (int64_t{1} << 31),
                    "{}: B·heads·⌈T/64⌉ = {} blocks is above the GPU kernels' limit of 2^31; "
                    "split the batch",
                    op, B * heads * ((T + 63) / 64));
}

}  // namespace

CudaTiles default_tiles(int dh) {
  // The fastest variants of the benchmark sweep (AttentionGpu.PerfSdpaShapes) on an H100: the
  // warpgroup-MMA (wgmma) kernels for both head dims, all three passes with TMA tile loads
  // (H200, 2026-11-26: Dh 128 T 2048 forward 0.378 → 0.303 ms, dQ+dK/dV 1.203 → 1.151; H100:
  // the dK/dV pass's TMA loads −4.4 % on the backward at T 4096, −3.5 % for Dh 64 GQA). The
  // mma.sync variants below stay as candidates (and the dQ pass from stored dS, which was the Dh
  // 128 default before the wgmma kernels covered Dh 128).
  CudaTiles t;
  t.dq_from_ds = false;
  t.fwd_wgmma = true;
  t.fwd_tma = true;
  t.dkv_wgmma = true;
  t.dkv_tma = true;
  t.dq_wgmma = true;
  t.dq_tma = true;
  if (dh == 64) {
    t.fwd_warps = 4, t.fwd_bc = 64, t.fwd_mt = 2;
    t.dkv_warps = 4, t.dkv_br = 64, t.dkv_mt = 1;
    t.dq_warps = 4, t.dq_bc = 64, t.dq_mt = 2;
  } else {
    t.fwd_warps = 4, t.fwd_bc = 32, t.fwd_mt = 2;
    t.dkv_warps = 4, t.dkv_br = 64, t.dkv_mt = 1;
    t.dq_warps = 4, t.dq_bc = 32, t.dq_mt = 2;
  }
  return t;
}

namespace {
// The defaults for the current GPU: the wgmma kernels are sm_90a code (core/wgmma.cuh), so other
// GPUs (Blackwell, in a build that targets it) run the mma.sync kernels of the same tiles, which
// every default names (fwd_variants, dkv_variants, dq_variants).
bool wgmma_here() {
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  return is_sm90(dev);
}

CudaTiles default_tiles_here(int dh) {
  CudaTiles t = default_tiles(dh);
  if (!wgmma_here()) {
    t.fwd_wgmma = t.fwd_tma = t.dkv_wgmma = t.dkv_tma = t.dq_wgmma = t.dq_tma = false;
  }
  return t;
}
}  // namespace

std::vector<CudaTiles> candidate_fwd_tiles(int dh) {
  std::vector<CudaTiles> out = {default_tiles_here(dh)};
  if (wgmma_here()) {  // the wgmma forward with cp.async loads
    CudaTiles t = default_tiles(dh);
    t.fwd_tma = false;
    out.push_back(t);
  }
  for (const Variant& f : fwd_variants(dh)) {
    CudaTiles t = default_tiles(dh);
    t.fwd_wgmma = false;
    t.fwd_tma = false;
    t.fwd_warps = f.warps, t.fwd_bc = f.tile, t.fwd_mt = f.mt;
    out.push_back(t);
  }
  return out;
}

std::vector<CudaTiles> candidate_bwd_tiles(int dh) {
  std::vector<CudaTiles> out;
  // The cp.async wgmma dK/dV pass with the mma.sync dQ pass, the cp.async wgmma one and the TMA
  // one; then the default (both wgmma passes on TMA).
  for (int dq : {0, 1, 2}) {
    if (!wgmma_here()) break;
    CudaTiles t = default_tiles(dh);
    t.dkv_wgmma = true;
    t.dkv_tma = false;
    t.dq_wgmma = dq > 0;
    t.dq_tma = dq == 2;
    t.dq_from_ds = false;
    out.push_back(t);
  }
  out.push_back(default_tiles_here(dh));  // both wgmma passes with TMA loads (sm_90a)
  {
    CudaTiles t = default_tiles(dh);
    t.dq_from_ds = true;
    t.dkv_wgmma = false;
    t.dq_wgmma = false;
    t.dkv_warps = 4, t.dkv_br = 64, t.dkv_mt = 1;
    out.push_back(t);
  }
  for (const Variant& a : dkv_variants(dh)) {
    for (const Variant& q : dq_variants(dh)) {
      CudaTiles t = default_tiles(dh);
      t.dq_from_ds = false;
      t.dkv_wgmma = false;
      t.dq_wgmma = false;
      t.dkv_warps = a.warps, t.dkv_br = a.tile, t.dkv_mt = a.mt;
      t.dq_warps = q.warps, t.dq_bc = q.tile, t.dq_mt = q.mt;
      out.push_back(t);
    }
  }
  return out;
}

void attention_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& lse,
                        const TensorView& q, const TensorView& k, const TensorView& v, float scale,
                        const CudaTiles* tiles) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Hkv = k.size(2);
  const int dh = static_cast<int>(q.size(3));
  check_grid("attention_fwd", B, H, T);
  const CudaTiles t = tiles != nullptr ? *tiles : default_tiles_here(dh);
  FwdParams p{};
  p.q = bf16_in(q), p.k = bf16_in(k), p.v = bf16_in(v);
  p.out = bf16_out(out), p.lse = lse.ptr<float>();
  p.q_sb = q.strides[0], p.q_st = q.strides[1], p.q_sh = q.strides[2];
  p.k_sb = k.strides[0], p.k_st = k.strides[1], p.k_sh = k.strides[2];
  p.v_sb = v.strides[0], p.v_st = v.strides[1], p.v_sh = v.strides[2];
  p.o_sb = out.strides[0], p.o_st = out.strides[1], p.o_sh = out.strides[2];
  p.T = static_cast<int>(T), p.H = static_cast<int>(H), p.group = static_cast<int>(H / Hkv);
  p.chunk_q = chunk_rows(B * H, query_order(ctx, t.q_order, B, Hkv, T, dh, false));
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  if (t.fwd_wgmma && t.fwd_tma) {
    FwdMaps maps;
    if (tma::make_bthd_map(&maps.q, p.q, B, T, H, dh, p.q_sb, p.q_st, p.q_sh) &&
        tma::make_bthd_map(&maps.k, p.k, B, T, Hkv, dh, p.k_sb, p.k_st, p.k_sh) &&
        tma::make_bthd_map(&maps.v, p.v, B, T, Hkv, dh, p.v_sb, p.v_st, p.v_sh)) {
      if (dh == 64) return launch_fwd_wgmma_tma<64>(p, maps, static_cast<int>(B), ctx.stream());
      return launch_fwd_wgmma_tma<128>(p, maps, static_cast<int>(B), ctx.stream());
    }
    // No TMA for these tensors: the cp.async kernel below.
  }
  if (t.fwd_wgmma) {
    if (dh == 64) return launch_fwd_wgmma<64>(p, static_cast<int>(B), ctx.stream());
    return launch_fwd_wgmma<128>(p, static_cast<int>(B), ctx.stream());
  }
  run_fwd(dh, Variant{t.fwd_warps, t.fwd_bc, t.fwd_mt}, p, static_cast<int>(B), ctx.stream());
}

namespace {

// attention_bwd_cuda; with `out_ep` the first pass also quantizes out (attn_bwd_prep_fp8_kernel).
void attention_bwd_run(Context& ctx, const TensorView& dq, const TensorView& dk,
                       const TensorView& dv, const TensorView& dout, const TensorView& q,
                       const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, float scale, const CudaTiles* tiles,
                       const ops_detail::Fp8Epilogue* out_ep) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Hkv = k.size(2);
  const int dh = static_cast<int>(q.size(3));
  check_grid("attention_bwd", B, H, T);
  const CudaTiles t = tiles != nullptr ? *tiles : default_tiles_here(dh);
  cudaStream_t stream = ctx.stream();

  // dq_from_ds: the batch runs in chunks whose dSᵀ tiles fit the budget (a chunk that would not
  // fit even one sequence uses the separate dQ pass instead).
  const int64_t kDsBudget = t.ds_budget_bytes > 0 ? t.ds_budget_bytes : int64_t{512} << 20;
  const int64_t n_tiles = (T + 63) / 64;
  const int64_t ds_per_b = H * (n_tiles * (n_tiles + 1) / 2) * 64 * 64 * 2;
  LOWBIT_CHECK(!t.dq_from_ds || (t.dkv_warps == 4 && t.dkv_br == 64 && t.dkv_mt == 1),
               "attention_bwd: the dQ pass from stored dS needs the 4-warp 64×64 dK/dV kernel");
  const int64_t fit = std::min<int64_t>(B, kDsBudget / ds_per_b);  // sequences per chunk
  // A chunk also needs enough dK/dV blocks to balance the causal triangle over the GPU (see
  // CudaTiles::ds_min_chunk_blocks).
  const bool from_ds = t.dq_from_ds && fit >= 1 && fit * Hkv * n_tiles >= t.ds_min_chunk_blocks;
  const int64_t b_chunk = from_ds ? fit : B;

  // Workspace: delta [B, H, T] f32 | lse2 [B, H, T] f32 | (from_ds) dSᵀ tiles of b_chunk
  // sequences.
  const int64_t rows = B * H * T;
  const size_t ws_bytes =
      static_cast<size_t>(2 * rows) * sizeof(float) + (from_ds ? size_t(b_chunk * ds_per_b) : 0);
  float* ws = static_cast<float*>(ctx.workspace(ws_bytes));
  float* delta = ws;
  float* lse2 = ws + rows;

  PrepParams pp{};
  pp.out = bf16_in(out), pp.dout = bf16_in(dout), pp.lse = lse.ptr<const float>();
  pp.delta = delta, pp.lse2 = lse2;
  pp.o_sb = out.strides[0], pp.o_st = out.strides[1], pp.o_sh = out.strides[2];
  pp.do_sb = dout.strides[0], pp.do_st = dout.strides[1], pp.do_sh = dout.strides[2];
  pp.rows = rows, pp.T = static_cast<int>(T), pp.H = static_cast<int>(H);
  const int64_t prep_threads = rows * (dh / 8);
  const unsigned prep_blocks = static_cast<unsigned>((prep_threads + 255) / 256);
  if (out_ep != nullptr) {
    const unsigned blocks = static_cast<unsigned>(rows / 32);
    const bool vec_t =
        (B * T) % 16 == 0 && (out_ep->qt == nullptr || ops_cuda::aligned16(out_ep->qt));
    if (dh == 64) {
      pdl::launch(attn_bwd_prep_fp8_kernel<64>, blocks, 256, 0, stream, pp, vec_t, *out_ep);
    } else {
      pdl::launch(attn_bwd_prep_fp8_kernel<128>, blocks, 512, 0, stream, pp, vec_t, *out_ep);
    }
  } else if (dh == 64) {
    pdl::launch(attn_bwd_prep_kernel<64>, prep_blocks, 256, 0, stream, pp);
  } else {
    pdl::launch(attn_bwd_prep_kernel<128>, prep_blocks, 256, 0, stream, pp);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();

  BwdParams p{};
  p.q = bf16_in(q), p.k = bf16_in(k), p.v = bf16_in(v), p.dout = bf16_in(dout);
  p.dq = bf16_out(dq), p.dk = bf16_out(dk), p.dv = bf16_out(dv);
  p.lse2 = lse2, p.delta = delta;
  p.q_sb = q.strides[0], p.q_st = q.strides[1], p.q_sh = q.strides[2];
  p.k_sb = k.strides[0], p.k_st = k.strides[1], p.k_sh = k.strides[2];
  p.v_sb = v.strides[0], p.v_st = v.strides[1], p.v_sh = v.strides[2];
  p.do_sb = dout.strides[0], p.do_st = dout.strides[1], p.do_sh = dout.strides[2];
  p.dq_sb = dq.strides[0], p.dq_st = dq.strides[1], p.dq_sh = dq.strides[2];
  p.dk_sb = dk.strides[0], p.dk_st = dk.strides[1], p.dk_sh = dk.strides[2];
  p.dv_sb = dv.strides[0], p.dv_st = dv.strides[1], p.dv_sh = dv.strides[2];
  p.T = static_cast<int>(T), p.H = static_cast<int>(H), p.Hkv = static_cast<int>(Hkv);
  p.group = static_cast<int>(H / Hkv);
  p.chunk_q = chunk_rows(B * H, query_order(ctx, t.q_order, B, Hkv, T, dh, true));
  p.chunk_kv = chunk_rows(B * Hkv, dkv_order(ctx, t.kv_order, B * Hkv, T, dh));
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  if (!from_ds) {
    // Tensor maps for the TMA passes (none where the views do not allow them).
    BwdMaps maps;
    const bool have_maps =
        ((t.dkv_wgmma && t.dkv_tma) || (t.dq_wgmma && t.dq_tma)) &&
        tma::make_bthd_map(&maps.q, p.q, B, T, H, dh, p.q_sb, p.q_st, p.q_sh) &&
        tma::make_bthd_map(&maps.dout, p.dout, B, T, H, dh, p.do_sb, p.do_st, p.do_sh) &&
        tma::make_bthd_map(&maps.k, p.k, B, T, Hkv, dh, p.k_sb, p.k_st, p.k_sh) &&
        tma::make_bthd_map(&maps.v, p.v, B, T, Hkv, dh, p.v_sb, p.v_st, p.v_sh);
    if (t.dkv_wgmma) {
      const bool tma = t.dkv_tma && have_maps;
      if (dh == 64) {
        launch_dkv_wgmma<64>(p, maps, tma, static_cast<int>(B), stream);
      } else {
        launch_dkv_wgmma<128>(p, maps, tma, static_cast<int>(B), stream);
      }
    } else {
      run_dkv(dh, Variant{t.dkv_warps, t.dkv_br, t.dkv_mt}, p, static_cast<int>(B), stream);
    }
    if (t.dq_wgmma && t.dq_tma && have_maps) {
      if (dh == 64) {
        launch_dq_wgmma_tma<64>(p, maps, static_cast<int>(B), stream);
      } else {
        launch_dq_wgmma_tma<128>(p, maps, static_cast<int>(B), stream);
      }
    } else if (t.dq_wgmma) {  // also where no tensor map describes the inputs
      if (dh == 64) {
        launch_dq_wgmma<64>(p, static_cast<int>(B), stream);
      } else {
        launch_dq_wgmma<128>(p, static_cast<int>(B), stream);
      }
    } else {
      run_dq(dh, Variant{t.dq_warps, t.dq_bc, t.dq_mt}, p, static_cast<int>(B), stream);
    }
    return;
  }
  for (int64_t b0 = 0; b0 < B; b0 += b_chunk) {
    const int64_t bc = std::min(b_chunk, B - b0);
    BwdParams c = p;
    c.q += b0 * p.q_sb, c.k += b0 * p.k_sb, c.v += b0 * p.v_sb, c.dout += b0 * p.do_sb;
    c.dq += b0 * p.dq_sb, c.dk += b0 * p.dk_sb, c.dv += b0 * p.dv_sb;
    c.lse2 += b0 * H * T, c.delta += b0 * H * T;
    c.ds = reinterpret_cast<uint16_t*>(ws + 2 * rows);
    run_dkv_ds_dq(dh, c, static_cast<int>(bc), stream);
  }
}

}  // namespace

void attention_bwd_cuda(Context& ctx, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const TensorView& dout, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, float scale, const CudaTiles* tiles) {
  attention_bwd_run(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale, tiles, nullptr);
}

bool attention_bwd_quantize_out_cuda(Context& ctx, const TensorView& dq, const TensorView& dk,
                                     const TensorView& dv, const TensorView& dout,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse, float scale,
                                     const QuantConfig& cfg, QuantizedTensor& out_q) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dh = q.size(3);
  if (T % 32 != 0 || (dh != 64 && dh != 128) || !out.is_contiguous()) return false;
  const ops_detail::Fp8Epilogue ep =
      ops_detail::fp8_epilogue_outputs(ctx, cfg, B * T, H * dh, out_q);
  attention_bwd_run(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale, nullptr, &ep);
  return true;
}

}  // namespace lowbit::attn

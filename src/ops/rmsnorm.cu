// CUDA RMSNorm. Memory-bound: rows are read with 16-byte vectors (8 bf16) when D % 8 == 0 and
// the rows are aligned (one element per thread otherwise), sums are fp32 warp shuffles.
//
// Forward: one block per row; each thread holds VPT chunks of VEC elements of x and w.
// Backward: a block handles `rows_per_block` consecutive rows with `groups` thread groups, each
// group one row at a time (group g takes rows base + g). Every thread keeps the dw partial sums of
// its columns in registers; a group's row sum needs only a barrier of its own warps, and x and
// dout of its next row are loaded while the current one is finished. At the end the groups
// fold their dw sums in order 0, 1, … through shared memory and the block writes one partial
// row to the workspace. A second kernel adds the partial rows in block order to dw. Every order is
// fixed by the shapes alone, so results are deterministic (and identical on any GPU).
//
// Fused with per-tensor FP8 quantization (rmsnorm_fwd_quantize, rmsnorm_bwd_quantize): the same
// per-row arithmetic and orders, so the bytes of the composition. The register kernels keep a
// group's next row(s) in registers; the ring kernels stream rows through shared memory with bulk
// copies; the forward's warp kernel has one warp play all of rmsnorm_fwd's warps of a row.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "core/pdl.cuh"
#include "core/tma.cuh"
#include "lowbit/core/cuda_check.h"
#include "ops/ops_cuda.cuh"
#include "ops/quant_epilogue.cuh"
#include "ops/rmsnorm_impl.h"

namespace lowbit::ops_detail {

using namespace ops_cuda;

namespace {

// VEC consecutive bf16 values kept as raw bits (4 registers for 8 values).
template <int VEC>
struct Raw;
template <>
struct Raw<8> {
  uint4 u;
  __device__ __forceinline__ void load(const uint16_t* p) {
    u = __ldg(reinterpret_cast<const uint4*>(p));
  }
  __device__ __forceinline__ void zero() { u = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ float get(int i) const {  // i must be a compile-time constant
    const uint32_t w = i < 2 ? u.x : i < 4 ? u.y : i < 6 ? u.z : u.w;
    return __uint_as_float((i & 1) ? (w & 0xFFFF0000u) : (w << 16));
  }
};
template <>
struct Raw<1> {
  uint16_t u;
  __device__ __forceinline__ void load(const uint16_t* p) { u = __ldg(p); }
  __device__ __forceinline__ void zero() { u = 0; }
  __device__ __forceinline__ float get(int) const { return bf16_to_f32(u); }
};

template <int VEC>
__device__ __forceinline__ void store_vec(uint16_t* p, const float* v) {
  if constexpr (VEC == 8) {
    store8(p, v);
  } else {
    store1(p, v[0]);
  }
}

// Σ x² of this thread's VPT chunks, chunk by chunk, element by element, each step one fused
// multiply-add (explicit, so that the plain and the fused-quantize forward kernels, which both
// call this, cannot be contracted differently: their rstd and y must be bit-identical).
template <int VEC, int VPT>
__device__ __forceinline__ float sumsq_chunks(const Raw<VEC>* xv) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss = __fmaf_rn(xv[k].get(i), xv[k].get(i), ss);
  }
  return ss;
}

// Σ (dout·w)·x of this thread's chunks, in order, each step one explicit fused multiply-add (so
// that the plain and the fused-quantize backward kernels, which both call this, agree bit for bit).
template <int VEC, int VPT>
__device__ __forceinline__ float dot_chunks(const Raw<VEC>* dyv, const Raw<VEC>* wv,
                                            const Raw<VEC>* xv) {
  float dot = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      dot = __fmaf_rn(__fmul_rn(dyv[k].get(i), wv[k].get(i)), xv[k].get(i), dot);
    }
  }
  return dot;
}

// dx = rstd · (dout·w − x·c_row) (+ residual) and the dw terms (x·rstd)·dout of one chunk, every
// step one RN fp32 operation (as the CPU twin); shared by both backward kernels.
template <int VEC>
__device__ __forceinline__ void dx_chunk(const Raw<VEC>& xv, const Raw<VEC>& dyv,
                                         const Raw<VEC>& wv, const Raw<VEC>& res, bool has_res,
                                         float r, float c_row, float (&o)[VEC],
                                         float (&dw_acc)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const float xi = xv.get(i), dyi = dyv.get(i);
    const float gi = __fmul_rn(dyi, wv.get(i));
    o[i] = __fmul_rn(r, __fsub_rn(gi, __fmul_rn(xi, c_row)));
    if (has_res) o[i] = __fadd_rn(res.get(i), o[i]);
    dw_acc[i] = __fadd_rn(dw_acc[i], __fmul_rn(__fmul_rn(xi, r), dyi));
  }
}

// The group-level chunks of w a thread owns (zeros past the row), and the zeroed dw sums.
template <int VEC, int VPT>
__device__ __forceinline__ void load_w(Raw<VEC>* wv, const uint16_t* w, int t, int group_threads,
                                       int d) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = (t + k * group_threads) * VEC;
    if (c < d) {
      wv[k].load(w + c);
    } else {
      wv[k].zero();
    }
  }
}

// The backward's end: the groups' dw sums folded in order (fold = g0, then += g1, g2, …) in
// `fold` [D] (shared memory), and the block's partial row written to partial [gridDim.x, D].
template <int VEC, int VPT>
__device__ __forceinline__ void fold_dw_partials(float* fold, float* partial,
                                                 const float (&dw_acc)[VPT][VEC], int g, int groups,
                                                 int t, int group_threads, int d) {
  for (int gg = 0; gg < groups; ++gg) {
    if (g == gg) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (t + k * group_threads) * VEC;
        if (c >= d) continue;
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          fold[c + i] = gg == 0 ? dw_acc[k][i] : fold[c + i] + dw_acc[k][i];
      }
    }
    __syncthreads();
  }
  float* prow = partial + int64_t(blockIdx.x) * d;  // [D]
  for (int c = threadIdx.x; c < d; c += blockDim.x) prow[c] = fold[c];
}

// rstd = 1 / sqrt(ss / D + eps), each step one RN fp32 operation (as the CPU twin).
__device__ __forceinline__ float rstd_of(float ss, int d, float eps) {
  return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(d)), eps)));
}

// out [N, D] bf16, rstd [N] f32 from x [N, D] bf16, w [D] bf16. Grid: one block per row.
template <int VEC, int VPT>
__global__ void __launch_bounds__(512)
    rmsnorm_fwd_kernel(uint16_t* __restrict__ out, float* __restrict__ rstd,
                       const uint16_t* __restrict__ x, const uint16_t* __restrict__ w, int d,
                       float eps) {
  pdl::grid_sync();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint16_t* xr = x + row * d;  // [D]
  Raw<VEC> xv[VPT], wv[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = (threadIdx.x + k * blockDim.x) * VEC;
    if (c < d) {
      xv[k].load(xr + c);
      wv[k].load(w + c);
    } else {
      xv[k].zero();
      wv[k].zero();
    }
  }
  const float ss = block_sum(sumsq_chunks<VEC, VPT>(xv), scratch);
  const float r = rstd_of(ss, d, eps);
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = (threadIdx.x + k * blockDim.x) * VEC;
    if (c >= d) continue;
    float y[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) y[i] = __fmul_rn(__fmul_rn(xv[k].get(i), r), wv[k].get(i));
    store_vec<VEC>(out + row * d + c, y);
  }
}

// ---- forward fused with per-tensor FP8 quantization (delayed scaling) --------------------------
//
// One block per tile of kQRows rows. The block is `groups` groups of group_threads threads, where
// group_threads, VEC = 8 and VPT are the RowPlan rmsnorm_fwd_kernel runs with for this D; group g
// takes rows g, g + groups, … of the tile and handles each one exactly as a block of
// rmsnorm_fwd_kernel does (same chunks per thread, same per-thread sum sumsq_chunks, same
// cross-warp order in group_sum), so rstd and the bf16 y are bit-identical to rmsnorm_fwd's. The
// bf16 value of y is what gets quantized (quantize(y) reads y back as bf16). Rowwise codes go
// straight to q; for the columnwise copy they are staged in shared memory and the tile is written
// transposed at the end (store_transposed: whole 32-byte sectors of qt's rows). x of a group's next
// row is loaded while the current one is reduced.
constexpr int kQRows = 32;

// block_sum of ops_cuda.cuh over the wpg warps of group g only (named barrier g + 1): the same
// operations in the same order as block_sum over a block of wpg warps.
__device__ __forceinline__ float group_sum(float v, float* scratch, int g, int wpg,
                                           int group_threads) {
  v = warp_sum(v);
  if (wpg == 1) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The first barrier keeps scratch until the group's previous row has read it.
  asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
  if (lane == 0) scratch[warp] = v;
  asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
  const float s = lane < wpg ? scratch[g * wpg + lane] : 0.0f;
  return warp_sum(s);
}

// y [N, D] bf16 (or null), rstd [N] f32 (or null), ep's q [N, D] / qt [D, N] FP8, scale_inv and
// amax from x [N, D] bf16, w [D] bf16. D % 8 == 0, rows 16-byte aligned. Dynamic shared memory
// (kCol): kQRows · (D + 4) bytes of codes. vec_t: N % 16 == 0 and qt 16-byte aligned.
template <int VPT, bool kCol>
__global__ void __launch_bounds__(512)
    rmsnorm_fwd_fp8_kernel(uint16_t* __restrict__ y, float* __restrict__ rstd,
                           const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                           int64_t n_rows, int d, float eps, int group_threads, int groups,
                           bool vec_t, ops_detail::Fp8Epilogue ep) {
  pdl::grid_sync();
  extern __shared__ __align__(16) uint8_t tile[];  // [kQRows][d + 4] codes (kCol only)
  __shared__ float scratch[16];                    // one partial sum per warp (≤ 512 threads)
  const int pitch = d + 4;                         // ≡ 4 (mod 8): see store_transposed
  const int g = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int wpg = group_threads / kWarp;
  const int64_t n0 = int64_t(blockIdx.x) * kQRows;
  const float scale = *ep.scale;
  Raw<8> wv[VPT];
  load_w<8, VPT>(wv, w, t, group_threads, d);
  // Row r of the tile (zeros past the tile, the tensor or the row: they add nothing to Σ x²).
  auto load_x = [&](int r, Raw<8>* xr) {
    const int64_t row = n0 + r;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (t + k * group_threads) * 8;
      if (r < kQRows && row < n_rows && c < d) {
        xr[k].load(x + row * d + c);
      } else {
        xr[k].zero();
      }
    }
  };
  Raw<8> xv[VPT];
  load_x(g, xv);
  float local_amax = 0.0f;
  // Every group runs kQRows / groups iterations (groups divides kQRows), so the group barriers
  // in group_sum are reached by all of its threads.
  for (int r = g; r < kQRows; r += groups) {
    Raw<8> xn[VPT];
    load_x(r + groups, xn);
    const float ss = group_sum(sumsq_chunks<8, VPT>(xv), scratch, g, wpg, group_threads);
    const int64_t row = n0 + r;
    if (row < n_rows) {
      const float rs = rstd_of(ss, d, eps);
      if (rstd != nullptr && t == 0) rstd[row] = rs;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (t + k * group_threads) * 8;
        if (c >= d) continue;
        // y as rmsnorm_fwd computes it, before its rounding to bf16.
        float yf[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) yf[i] = __fmul_rn(__fmul_rn(xv[k].get(i), rs), wv[k].get(i));
        fp8_epilogue_chunk8<kCol>(yf, scale, ep.e5m2, y != nullptr ? y + row * d + c : nullptr,
                                  ep.q != nullptr ? ep.q + row * d + c : nullptr,
                                  tile + r * pitch + c, local_amax);
      }
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) xv[k] = xn[k];
  }
  if constexpr (kCol) {
    __syncthreads();  // the whole tile is staged
    store_transposed<kQRows>(ep.qt, tile, pitch, n0, n_rows, 0, d, vec_t);
  }
  fp8_epilogue_finish(local_amax, scale, ep);
}

// dx [N, D] bf16 and partial [gridDim.x, D] f32 (this block's Σ (x·rstd)·dout per column) from
// dout, x [N, D] bf16, w [D] bf16, rstd [N] f32; residual [N, D] bf16 (or null, may alias dx) is
// added to dx in fp32 before its one rounding. blockDim = group_threads · groups.
// Dynamic shared memory: D floats (the fold of the groups' partial sums).
template <int VEC, int VPT>
__global__ void __launch_bounds__(1024)
    rmsnorm_bwd_kernel(uint16_t* dx, float* __restrict__ partial, const uint16_t* __restrict__ dout,
                       const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                       const float* __restrict__ rstd, const uint16_t* residual, int64_t n_rows,
                       int d, int group_threads, int groups, int64_t rows_per_block) {
  pdl::grid_sync();
  extern __shared__ float fold[];  // [D]
  __shared__ float scratch[32];    // one sum per warp
  const int g = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int warps_per_group = group_threads / kWarp, warp = threadIdx.x / kWarp;
  Raw<VEC> wv[VPT];
  load_w<VEC, VPT>(wv, w, t, group_threads, d);
  float dw_acc[VPT][VEC] = {};
  const int64_t row0 = blockIdx.x * rows_per_block;
  const int64_t row_end = min(n_rows, row0 + rows_per_block);
  // x and dout of this group's next row are loaded one iteration ahead, so that the loads of
  // row i + groups are in flight while row i is reduced and written.
  Raw<VEC> xv[VPT], dyv[VPT];
  auto load_row = [&](int64_t row, Raw<VEC>* xr, Raw<VEC>* dyr) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (t + k * group_threads) * VEC;
      if (row < row_end && c < d) {
        xr[k].load(x + row * d + c);
        dyr[k].load(dout + row * d + c);
      } else {
        xr[k].zero();
        dyr[k].zero();
      }
    }
  };
  load_row(row0 + g, xv, dyv);
  for (int64_t base = row0; base < row_end; base += groups) {
    const int64_t row = base + g;
    const bool valid = row < row_end;
    Raw<VEC> xn[VPT], dyn[VPT];
    load_row(row + groups, xn, dyn);
    float dot = dot_chunks<VEC, VPT>(dyv, wv, xv);
    // Sum over the group's warps (in warp order). One-warp groups need no block barrier, so
    // their warps run through their rows independently.
    dot = warp_sum(dot);
    if (warps_per_group > 1) {
      // A barrier of this group's warps only (id g + 1; id 0 is __syncthreads), so that groups
      // do not wait for each other: the first keeps scratch until the previous row has read it.
      asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
      if ((threadIdx.x & 31) == 0) scratch[warp] = dot;
      asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
      dot = 0.0f;
      for (int j = 0; j < warps_per_group; ++j) dot += scratch[g * warps_per_group + j];
    }
    if (valid) {
      const float r = rstd[row];
      const float c_row = __fmul_rn(__fmul_rn(__fdiv_rn(dot, float(d)), r), r);
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (t + k * group_threads) * VEC;
        if (c >= d) continue;
        float o[VEC];
        Raw<VEC> res;
        if (residual != nullptr) {
          res.load(residual + row * d + c);  // before this thread writes the same elements
        } else {
          res.zero();
        }
        dx_chunk<VEC>(xv[k], dyv[k], wv[k], res, residual != nullptr, r, c_row, o, dw_acc[k]);
        store_vec<VEC>(dx + row * d + c, o);
      }
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      xv[k] = xn[k];
      dyv[k] = dyn[k];
    }
  }
  fold_dw_partials<VEC, VPT>(fold, partial, dw_acc, g, groups, t, group_threads, d);
}

// ---- backward fused with per-tensor FP8 quantization (delayed scaling) -------------------------
//
// rmsnorm_bwd_kernel<8, VPT> with two optional epilogues: dx's codes (kDx: rowwise straight to
// dxe.q, columnwise staged) and the forward's output y remade from x (kY: rstd recomputed as
// rmsnorm_fwd_fp8_kernel does it — the same RowPlan chunks, per-thread sums and group_sum order —
// and y = (x·rstd)·w rounded to bf16, quantized under ye). A block's rows, its groups and the
// order of each group's rows are rmsnorm_bwd_kernel's (BwdPlan), so dx and the dw partial rows
// are its bits. Every kQRows rows (rows_per_block is a multiple of kQRows) the staged tiles are
// written transposed (store_transposed); at the end the tile memory holds the dw fold.
// Dynamic shared memory: max(tiles · kQRows · (D + 4), 4·D) bytes.
template <int VPT, bool kDx, bool kY>
__global__ void __launch_bounds__(512)
    rmsnorm_bwd_fp8_kernel(uint16_t* dx, float* __restrict__ partial,
                           const uint16_t* __restrict__ dout, const uint16_t* __restrict__ x,
                           const uint16_t* __restrict__ w, const float* __restrict__ rstd,
                           const uint16_t* residual, int64_t n_rows, int d, float eps,
                           int group_threads, int groups, int64_t rows_per_block, bool vec_t,
                           ops_detail::Fp8Epilogue dxe, ops_detail::Fp8Epilogue ye) {
  pdl::grid_sync();
  extern __shared__ __align__(16) uint8_t smem[];    // [tiles][kQRows][d + 4] codes, then [D] f32
  __shared__ float scratch_dot[16], scratch_ss[16];  // one partial sum per warp (≤ 512 threads)
  const int pitch = d + 4;                           // ≡ 4 (mod 8): see store_transposed
  uint8_t* const dx_tile = smem;
  uint8_t* const y_tile = smem + (kDx ? kQRows * pitch : 0);
  const int g = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int wpg = group_threads / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x & 31;
  const float dx_scale = kDx ? *dxe.scale : 0.0f;
  const float y_scale = kY ? *ye.scale : 0.0f;
  Raw<8> wv[VPT];
  load_w<8, VPT>(wv, w, t, group_threads, d);
  float dw_acc[VPT][8] = {};
  const int64_t row0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t row_end = min(n_rows, row0 + rows_per_block);
  const int64_t span = (row_end - row0 + kQRows - 1) / kQRows * kQRows;  // whole tiles
  // x, dout, the residual and rstd of a row, loaded two of the group's rows ahead (rows row +
  // groups and row + 2·groups are in flight while row is reduced and written: with one block per
  // SM, two rows ahead keep enough reads in flight). The residual may alias dx, but only this
  // thread writes those elements of this group's rows, after it has read them.
  Raw<8> xv[VPT], dyv[VPT], rv[VPT], x1[VPT], dy1[VPT], r1[VPT];
  float rs0 = 0.0f, rs1 = 0.0f;
  auto load_row = [&](int64_t row, Raw<8>* xr, Raw<8>* dyr, Raw<8>* rr, float& rs) {
    rs = row < row_end ? __ldg(rstd + row) : 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (t + k * group_threads) * 8;
      if (row < row_end && c < d) {
        xr[k].load(x + row * d + c);
        dyr[k].load(dout + row * d + c);
        if (residual != nullptr) {
          rr[k].load(residual + row * d + c);
        } else {
          rr[k].zero();
        }
      } else {
        xr[k].zero();
        dyr[k].zero();
        rr[k].zero();
      }
    }
  };
  load_row(row0 + g, xv, dyv, rv, rs0);
  load_row(row0 + g + groups, x1, dy1, r1, rs1);
  float dx_amax = 0.0f, y_amax = 0.0f;
  // Every group runs span / groups iterations (groups divides kQRows), so all threads reach the
  // group and block barriers.
  for (int64_t off = 0; off < span; off += groups) {
    const int64_t row = row0 + off + g;
    const bool valid = row < row_end;
    Raw<8> x2[VPT], dy2[VPT], r2[VPT];
    float rs2;
    load_row(row + 2 * groups, x2, dy2, r2, rs2);
    float dot = warp_sum(dot_chunks<8, VPT>(dyv, wv, xv));
    float ss = kY ? warp_sum(sumsq_chunks<8, VPT>(xv)) : 0.0f;
    if (wpg > 1) {
      // rmsnorm_bwd_kernel's order for dot (warps in turn), group_sum's for ss.
      asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
      if (lane == 0) {
        scratch_dot[warp] = dot;
        scratch_ss[warp] = ss;
      }
      asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
      dot = 0.0f;
      for (int j = 0; j < wpg; ++j) dot += scratch_dot[g * wpg + j];
      if (kY) ss = warp_sum(lane < wpg ? scratch_ss[g * wpg + lane] : 0.0f);
    }
    const int tr = int((off + g) % kQRows);  // the row's place in the staged tiles
    if (valid) {
      const float r = rs0;
      const float c_row = __fmul_rn(__fmul_rn(__fdiv_rn(dot, float(d)), r), r);
      const float ry = kY ? rstd_of(ss, d, eps) : 0.0f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (t + k * group_threads) * 8;
        if (c >= d) continue;
        float o[8];
        dx_chunk<8>(xv[k], dyv[k], wv[k], rv[k], residual != nullptr, r, c_row, o, dw_acc[k]);
        if constexpr (kDx) {
          fp8_epilogue_chunk8<true>(o, dx_scale, dxe.e5m2, dx + row * d + c,
                                    dxe.q != nullptr ? dxe.q + row * d + c : nullptr,
                                    dx_tile + tr * pitch + c, dx_amax);
        } else {
          store_vec<8>(dx + row * d + c, o);
        }
        if constexpr (kY) {
          float yf[8];  // y as rmsnorm_fwd computes it, before its rounding to bf16
#pragma unroll
          for (int i = 0; i < 8; ++i) yf[i] = __fmul_rn(__fmul_rn(xv[k].get(i), ry), wv[k].get(i));
          fp8_epilogue_chunk8<true>(yf, y_scale, ye.e5m2, nullptr,
                                    ye.q != nullptr ? ye.q + row * d + c : nullptr,
                                    y_tile + tr * pitch + c, y_amax);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      xv[k] = x1[k];
      dyv[k] = dy1[k];
      rv[k] = r1[k];
      x1[k] = x2[k];
      dy1[k] = dy2[k];
      r1[k] = r2[k];
    }
    rs0 = rs1;
    rs1 = rs2;
    if ((off + groups) % kQRows == 0) {  // a whole tile staged: write its columnwise copies
      __syncthreads();
      const int64_t n0 = row0 + off + groups - kQRows;
      if (kDx && dxe.qt != nullptr) {
        store_transposed<kQRows>(dxe.qt, dx_tile, pitch, n0, n_rows, 0, d, vec_t);
      }
      if (kY && ye.qt != nullptr) {
        store_transposed<kQRows>(ye.qt, y_tile, pitch, n0, n_rows, 0, d, vec_t);
      }
      __syncthreads();
    }
  }
  // The dw fold as rmsnorm_bwd_kernel's, in the tile memory.
  fold_dw_partials<8, VPT>(reinterpret_cast<float*>(smem), partial, dw_acc, g, groups, t,
                           group_threads, d);
  if constexpr (kDx) fp8_epilogue_finish(dx_amax, dx_scale, dxe);
  if constexpr (kY) fp8_epilogue_finish(y_amax, y_scale, ye);
}

// ---- the fused kernels with rows streamed through shared memory ---------------------------------
//
// rmsnorm_fwd_fp8_kernel and rmsnorm_bwd_fp8_kernel hold a group's next rows in registers, so the
// bytes in flight per SM are bounded by registers (hence blocks per SM), and the forward's grid of
// one tile per block leaves a partial last wave. The ring kernels copy each group's next `stages`
// rows into a ring of shared-memory slots with bulk copies (cp.async.bulk: one per row and
// tensor, issued by the group's thread 0, completing on one mbarrier per slot). A group waits
// only for rows it asked for `stages` rows earlier, and the loads need no registers. A slot is
// refilled with the group's row `stages` rows later once all its threads have read it (shown by
// the group's reduction barriers, or a __syncwarp). The arithmetic of every row is the register
// kernels' own, step for step (same chunks per thread, same sums in the same order), so every
// output keeps its bits.
constexpr int kMaxRingGroups = 8, kMaxStages = 4;

// `bytes` (a multiple of 16) from global `src` to shared address `dst`, both 16-byte aligned, as
// one bulk copy whose completion counts against the transaction bytes of the mbarrier at `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      :
      : "r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// The position of a group in its ring: the slot of its current row and the parity of the phase
// that slot's mbarrier completes when the row has landed (row j of the group: slot j mod stages,
// parity (j / stages) mod 2).
struct RingPos {
  int slot = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void advance(int stages) {
    if (++slot == stages) {
      slot = 0;
      parity ^= 1u;
    }
  }
};

// Eight values rounded to bf16 pairs (element 2i in the low half of packed[i]) as
// f32_to_bf16_rn rounds them, two per instruction: cvt.rn.bf16x2 is f32_to_bf16_rn's rounding for
// every number, and maps a NaN (only a NaN) to a bf16 NaN, but to the canonical one, while
// f32_to_bf16_rn keeps the payload; so a chunk with a NaN is rounded again by f32_to_bf16_rn.
__device__ __forceinline__ void pack_bf16x8(const float (&v)[8], uint32_t (&packed)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed[i]) : "f"(v[2 * i + 1]), "f"(v[2 * i]));
  }
  uint32_t nan;  // 1 when a value is a NaN (setp.nan: either operand unordered)
  asm("{\n"
      ".reg .pred p;\n"
      "setp.nan.f32 p, %1, %2;\n"
      "setp.nan.or.f32 p, %3, %4, p;\n"
      "setp.nan.or.f32 p, %5, %6, p;\n"
      "setp.nan.or.f32 p, %7, %8, p;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}"
      : "=r"(nan)
      : "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "f"(v[4]), "f"(v[5]), "f"(v[6]), "f"(v[7]));
  if (nan) {
#pragma unroll
    for (int i = 0; i < 4; ++i) packed[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
  }
}

// fp8_epilogue_chunk8 (quant_epilogue.cuh) with the roundings of pack_bf16x8 and the optional
// outputs chosen by flags (not by testing the computed addresses): the same bytes and amax, in
// fewer instructions.
template <bool kCol>
__device__ __forceinline__ void fp8_chunk8(const float (&v)[8], float scale, bool e5m2,
                                           bool want_out, uint16_t* out, bool want_q, uint8_t* q,
                                           uint8_t* tile_at, float& amax) {
  uint32_t packed[4];
  pack_bf16x8(v, packed);
  float image[8];  // the fp32 value of each rounded element
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    image[2 * i] = __uint_as_float(packed[i] << 16);
    image[2 * i + 1] = __uint_as_float(packed[i] & 0xFFFF0000u);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = amax_combine(amax, image[i]);
  if (want_out) {
    *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  const uint2 codes = fp8_codes8(image, scale, e5m2);
  if (want_q) *reinterpret_cast<uint2*>(q) = codes;
  if constexpr (kCol) {
    reinterpret_cast<uint32_t*>(tile_at)[0] = codes.x;
    reinterpret_cast<uint32_t*>(tile_at)[1] = codes.y;
  }
}

// The rows of x that one of a block's `streams` row streams (a group of threads, or a warp)
// takes, fed through its ring of `stages` slots — shared by the two forward ring kernels:
// - rowwise only (!kCol): a persistent grid; stream q = blockIdx.x · streams + id of Q =
//   gridDim.x · streams takes rows q, q + Q, q + 2Q, …, so every stream has ⌈N / Q⌉ or ⌊N / Q⌋
//   rows and there is no partial last wave of blocks;
// - with the columnwise copy (kCol): block b takes tiles b, b + gridDim.x, … of kQRows rows and
//   stream `id` rows id, id + streams, … of each (stages ≤ kQRows / streams, so the row `stages`
//   ahead is at most one tile ahead).
template <bool kCol>
struct RowStream {
  const uint16_t* x;
  int64_t n_rows;
  int d;
  uint32_t ring;  // shared address of the stream's [stages][D] bf16 slots
  uint32_t bars;  // shared address of its [stages] mbarriers
  int stages, streams, id;

  __device__ __forceinline__ uint32_t row_bytes() const { return 2u * uint32_t(d); }
  // Rows between two of the stream's rows (!kCol).
  __device__ __forceinline__ int64_t step() const { return int64_t(gridDim.x) * streams; }
  // One thread of the stream: row `row` of x into `slot` (nothing past the last row).
  __device__ __forceinline__ void fill(int slot, int64_t row) const {
    if (row >= n_rows) return;
    const uint32_t bar = bars + 8u * uint32_t(slot);
    tma::mbar_arrive_expect_tx(bar, row_bytes());
    bulk_copy_g2s(ring + uint32_t(slot) * row_bytes(), x + row * d, row_bytes(), bar);
  }
  // The stream's row `stages` rows after `row` (row r of its tile when kCol).
  __device__ __forceinline__ int64_t row_after(int64_t row, int r) const {
    if constexpr (kCol) {
      const int next = r + stages * streams;
      return next < kQRows ? row + stages * streams
                           : row - r + int64_t(gridDim.x) * kQRows + (next - kQRows);
    } else {
      return row + stages * step();
    }
  }
  // One thread of the stream: its first `stages` rows into the slots.
  __device__ __forceinline__ void prefill() const {
    const int64_t first =
        kCol ? int64_t(blockIdx.x) * kQRows + id : int64_t(blockIdx.x) * streams + id;
    for (int s = 0; s < stages; ++s) fill(s, first + s * (kCol ? streams : step()));
  }
  // do_row(row, r) over the stream's rows in order (r: the row's place in its tile when kCol;
  // then after each tile the whole block meets and store(n0) writes the tile transposed).
  template <typename DoRow, typename StoreTile>
  __device__ __forceinline__ void for_each_row(DoRow&& do_row, StoreTile&& store) const {
    if constexpr (kCol) {
      const int64_t n_tiles = (n_rows + kQRows - 1) / kQRows;
      for (int64_t tile_no = blockIdx.x; tile_no < n_tiles; tile_no += gridDim.x) {
        const int64_t n0 = tile_no * kQRows;
        for (int r = id; r < kQRows && n0 + r < n_rows; r += streams) do_row(n0 + r, r);
        __syncthreads();  // the whole tile is staged
        store(n0);
        __syncthreads();  // before the next tile is staged over it
      }
    } else {
      for (int64_t row = int64_t(blockIdx.x) * streams + id; row < n_rows; row += step()) {
        do_row(row, 0);
      }
    }
  }
};

// Forward + FP8 with the rows of x streamed through shared memory, a RowStream per group of
// group_threads threads (rowwise only: a persistent grid of as many blocks as are resident; with
// the columnwise copy, whole tiles per block, group g taking rows g, g + groups, … of each as in
// rmsnorm_fwd_fp8_kernel, the tile's codes staged and written transposed before the next tile).
// Every row is computed exactly as rmsnorm_fwd_fp8_kernel computes it (which is rmsnorm_fwd's
// arithmetic), so rstd, y and the codes are the same bits whichever group has the row.
// Dynamic shared memory: groups · stages · 2·D bytes of x slots, then (kCol) kQRows · (D + 4) bytes
// of codes. x and w 16-byte aligned, D % 8 == 0.
template <int VPT, bool kCol>
__global__ void __launch_bounds__(512, VPT <= 2 ? 2 : 1)
    rmsnorm_fwd_fp8_ring_kernel(uint16_t* __restrict__ y, float* __restrict__ rstd,
                                const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                                int64_t n_rows, int d, float eps, int group_threads, int groups,
                                int stages, bool vec_t, ops_detail::Fp8Epilogue ep) {
  pdl::grid_sync();
  extern __shared__ __align__(128) uint8_t smem[];  // [groups][stages][D] bf16, [kQRows][D + 4]
  __shared__ __align__(8) uint64_t full[kMaxRingGroups * kMaxStages];  // [groups][stages]
  __shared__ float scratch[16];  // one partial sum per warp (≤ 512 threads)
  const int g = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int wpg = group_threads / kWarp;
  const int pitch = d + 4;  // ≡ 4 (mod 8): see store_transposed
  const uint32_t row_bytes = 2u * uint32_t(d);
  uint8_t* const ring = smem + size_t(g) * stages * row_bytes;       // [stages][D] bf16 of group g
  uint8_t* const tile = smem + size_t(groups) * stages * row_bytes;  // [kQRows][D + 4] (kCol)
  const uint32_t bars = smem_addr(full + g * stages);                // group g's [stages] mbarriers
  if (threadIdx.x < groups * stages) tma::mbar_init(smem_addr(full + threadIdx.x), 1);
  tma::fence_mbar_init();
  __syncthreads();
  const RowStream<kCol> rows{x, n_rows, d, smem_addr(ring), bars, stages, groups, g};
  if (t == 0) rows.prefill();
  const float scale = *ep.scale;
  Raw<8> wv[VPT];
  load_w<8, VPT>(wv, w, t, group_threads, d);
  float local_amax = 0.0f;
  const bool want_y = y != nullptr, want_q = ep.q != nullptr;
  RingPos pos;
  // Row `row` of x, the group's next one, at row r of the staged tile (kCol).
  auto do_row = [&](int64_t row, int r) {
    tma::mbar_wait(bars + 8u * uint32_t(pos.slot), pos.parity);
    const uint8_t* xs = ring + size_t(pos.slot) * row_bytes;  // [D] bf16
    Raw<8> xv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (t + k * group_threads) * 8;
      if (c < d) {
        xv[k].u = *reinterpret_cast<const uint4*>(xs + 2 * c);
      } else {
        xv[k].zero();
      }
    }
    const float ss = group_sum(sumsq_chunks<8, VPT>(xv), scratch, g, wpg, group_threads);
    // Every thread of the group has read the slot (group_sum's barriers; a one-warp group has
    // exchanged its sums): it takes the group's row `stages` rows later.
    if (wpg == 1) __syncwarp();
    if (t == 0) rows.fill(pos.slot, rows.row_after(row, r));
    pos.advance(stages);
    const float rs = rstd_of(ss, d, eps);
    if (rstd != nullptr && t == 0) rstd[row] = rs;
    const int64_t at = row * d;  // the row's first element
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (t + k * group_threads) * 8;
      if (c >= d) continue;
      // y as rmsnorm_fwd computes it, before its rounding to bf16.
      float yf[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) yf[i] = __fmul_rn(__fmul_rn(xv[k].get(i), rs), wv[k].get(i));
      fp8_chunk8<kCol>(yf, scale, ep.e5m2, want_y, y + at + c, want_q, ep.q + at + c,
                       tile + r * pitch + c, local_amax);
    }
  };
  rows.for_each_row(do_row, [&](int64_t n0) {
    store_transposed<kQRows>(ep.qt, tile, pitch, n0, n_rows, 0, d, vec_t);
  });
  fp8_epilogue_finish(local_amax, scale, ep);
}

// Forward + FP8 with one warp per row (the rows of x streamed through shared memory as above).
// rmsnorm_fwd's block for this D has wpg = group_threads / 32 warps, thread t of warp v holding
// chunks (32v + t) + k·group_threads, k < VPT. Lane t of the one warp here plays thread t of every
// one of those warps in turn: for v = 0, 1, … it forms that thread's Σ x² (the same chunks, the
// same fused multiply-adds in the same order) and the same butterfly warp_sum, which leaves
// warp v's sum S_v in every lane (IEEE addition is commutative: lanes i and i ^ o compute
// bit-identical sums); lane v keeps S_v, and the closing warp_sum over (S_0, …, S_{wpg−1}, 0, …)
// is group_sum's second step. So rstd, y and the codes are rmsnorm_fwd_fp8_kernel's bits, while
// a row costs one warp's bookkeeping (wait, reduction, rstd, loop) instead of wpg warps'.
// Rows → warps: as rmsnorm_fwd_fp8_ring_kernel with one-warp groups (warp q of the grid takes
// rows q, q + Q, … when !kCol; a block takes whole tiles when kCol). w is kept in shared memory
// as fp32 (exact images of its bf16 values), elements 0–3 and 4–7 of each chunk in separate
// planes so that a warp's 16-byte reads of consecutive chunks hit distinct banks.
// Dynamic shared memory: 4·D bytes of w, warps · stages · 2·D bytes of x slots, then (kCol)
// kQRows · (D + 4) bytes of codes.
constexpr int kRowWarps = 8;                    // warps (row streams) per block
constexpr int kRowThreads = kRowWarps * kWarp;  // threads per block

// At most 64 registers (4 blocks, 32 warps per SM); the rowwise instantiations take 40, so that
// at D 768 with two slots per warp 6 blocks (48 warps) are resident (the columnwise ones ~64).
template <int VPT, bool kCol>
__global__ void __launch_bounds__(kRowThreads, 4)
    rmsnorm_fwd_fp8_warp_kernel(uint16_t* __restrict__ y, float* __restrict__ rstd,
                                const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                                int64_t n_rows, int d, float eps, int group_threads, int stages,
                                bool vec_t, ops_detail::Fp8Epilogue ep) {
  pdl::grid_sync();
  extern __shared__ __align__(128) uint8_t smem[];  // w planes, [warps][stages][D] bf16, codes
  __shared__ __align__(8) uint64_t full[kRowWarps * kMaxStages];  // [warps][stages]
  const int lane = threadIdx.x & 31, wid = threadIdx.x / kWarp;
  const int wpg = group_threads / kWarp;  // warps of rmsnorm_fwd's block
  const int chunks = d / 8;
  const int pitch = d + 4;  // ≡ 4 (mod 8): see store_transposed
  const uint32_t row_bytes = 2u * uint32_t(d);
  const float4* const w_lo = reinterpret_cast<const float4*>(smem);  // [chunks] elements 0–3
  const float4* const w_hi = w_lo + chunks;                          // [chunks] elements 4–7
  uint8_t* const ring = smem + size_t(4) * d + size_t(wid) * stages * row_bytes;  // [stages][D]
  uint8_t* const tile = smem + size_t(4) * d + size_t(kRowWarps) * stages * row_bytes;
  const uint32_t bars = smem_addr(full + wid * stages);
  if (threadIdx.x < kRowWarps * stages) tma::mbar_init(smem_addr(full + threadIdx.x), 1);
  tma::fence_mbar_init();
  __syncthreads();
  const RowStream<kCol> rows{x, n_rows, d, smem_addr(ring), bars, stages, kRowWarps, wid};
  if (lane == 0) rows.prefill();
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
    Raw<8> wr;
    wr.load(w + 8 * i);
    float4* const lo = reinterpret_cast<float4*>(smem);
    lo[i] = make_float4(wr.get(0), wr.get(1), wr.get(2), wr.get(3));
    lo[chunks + i] = make_float4(wr.get(4), wr.get(5), wr.get(6), wr.get(7));
  }
  const float scale = *ep.scale;
  const bool want_y = y != nullptr, want_q = ep.q != nullptr;
  float local_amax = 0.0f;
  RingPos pos;
  __syncthreads();  // w staged
  auto do_row = [&](int64_t row, int r) {
    tma::mbar_wait(bars + 8u * uint32_t(pos.slot), pos.parity);
    const uint8_t* xs = ring + size_t(pos.slot) * row_bytes;  // [D] bf16
    // Σ x² as rmsnorm_fwd's block forms it (group_sum over its wpg warps).
    float sel = 0.0f, sum = 0.0f;
    for (int v = 0; v < wpg; ++v) {
      Raw<8> xv[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (lane + kWarp * (v + k * wpg)) * 8;  // chunk (32v + lane) + k·group_threads
        if (c < d) {
          xv[k].u = *reinterpret_cast<const uint4*>(xs + 2 * c);
        } else {
          xv[k].zero();
        }
      }
      sum = warp_sum(sumsq_chunks<8, VPT>(xv));  // S_v, in every lane
      if (lane == v) sel = sum;
    }
    if (wpg > 1) sum = warp_sum(sel);
    const float rs = rstd_of(sum, d, eps);
    const int64_t at = row * d;                   // the row's first element
    for (int m = lane; m < chunks; m += kWarp) {  // every chunk of the row, in any order
      const int c = m * 8;
      Raw<8> xv;
      xv.u = *reinterpret_cast<const uint4*>(xs + 2 * c);
      const float4 wl = w_lo[m], wh = w_hi[m];
      const float wf[8] = {wl.x, wl.y, wl.z, wl.w, wh.x, wh.y, wh.z, wh.w};
      // y as rmsnorm_fwd computes it, before its rounding to bf16.
      float yf[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) yf[i] = __fmul_rn(__fmul_rn(xv.get(i), rs), wf[i]);
      fp8_chunk8<kCol>(yf, scale, ep.e5m2, want_y, y + at + c, want_q, ep.q + at + c,
                       tile + r * pitch + c, local_amax);
    }
    // Every lane has read the slot: it takes the warp's row `stages` rows later.
    __syncwarp();
    if (lane == 0) {
      rows.fill(pos.slot, rows.row_after(row, r));
      if (rstd != nullptr) rstd[row] = rs;
    }
    pos.advance(stages);
  };
  rows.for_each_row(do_row, [&](int64_t n0) {
    store_transposed<kQRows>(ep.qt, tile, pitch, n0, n_rows, 0, d, vec_t);
  });
  fp8_epilogue_finish(local_amax, scale, ep);
}

// Backward + FP8 with x, dout and the residual streamed through shared memory: the rows, groups,
// row order and arithmetic of rmsnorm_bwd_fp8_kernel (so dx, the codes and the dw partial rows
// keep their bits), with rstd of the block's rows read into shared memory first. The residual
// may alias dx: a row's residual has landed in its slot before the group writes that row of dx,
// and no other group or block writes it.
// Dynamic shared memory: tiles · kQRows · (D + 4) bytes of codes (16-byte multiple), 4 ·
// rows_per_block bytes of rstd (16-byte multiple), groups · stages · streams · 2·D bytes of
// slots (streams: x, dout and, when given, the residual).
template <int VPT, bool kDx, bool kY>
__global__ void __maxnreg__(VPT == 1 ? 80 : 128)
    rmsnorm_bwd_fp8_ring_kernel(uint16_t* dx, float* __restrict__ partial,
                                const uint16_t* __restrict__ dout, const uint16_t* __restrict__ x,
                                const uint16_t* __restrict__ w, const float* __restrict__ rstd,
                                const uint16_t* residual, int64_t n_rows, int d, float eps,
                                int group_threads, int groups, int64_t rows_per_block, int stages,
                                bool vec_t, ops_detail::Fp8Epilogue dxe,
                                ops_detail::Fp8Epilogue ye) {
  pdl::grid_sync();
  extern __shared__ __align__(128) uint8_t smem[];  // codes, rstd, slots (see above)
  __shared__ __align__(8) uint64_t full[kMaxRingGroups * kMaxStages];  // [groups][stages]
  __shared__ float scratch_dot[16], scratch_ss[16];  // one partial sum per warp (≤ 512 threads)
  constexpr int kTiles = int(kDx) + int(kY);
  const int pitch = d + 4;  // ≡ 4 (mod 8): see store_transposed
  const size_t tile_bytes = size_t(kTiles) * kQRows * pitch;
  uint8_t* const dx_tile = smem;                              // [kQRows][D + 4] (kDx)
  uint8_t* const y_tile = smem + (kDx ? kQRows * pitch : 0);  // [kQRows][D + 4] (kY)
  float* const rstd_s = reinterpret_cast<float*>(smem + (tile_bytes + 15) / 16 * 16);
  const int g = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int wpg = group_threads / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x & 31;
  const bool has_res = residual != nullptr;
  const uint32_t row_bytes = 2u * uint32_t(d), slot_bytes = (has_res ? 3u : 2u) * row_bytes;
  uint8_t* const ring = reinterpret_cast<uint8_t*>(rstd_s) + (4 * rows_per_block + 15) / 16 * 16 +
                        size_t(g) * stages * slot_bytes;  // [stages][x, dout, res][D] bf16
  const uint32_t bars = smem_addr(full + g * stages);
  const int64_t row0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t row_end = min(n_rows, row0 + rows_per_block);
  const int64_t span = (row_end - row0 + kQRows - 1) / kQRows * kQRows;  // whole tiles
  if (threadIdx.x < groups * stages) tma::mbar_init(smem_addr(full + threadIdx.x), 1);
  tma::fence_mbar_init();
  __syncthreads();
  // Thread 0 of the group: the group's j-th row (row0 + g + j·groups) into `slot`.
  auto fill = [&](int slot, int64_t j) {
    const int64_t row = row0 + g + j * groups;
    if (row >= row_end) return;
    const uint32_t bar = bars + 8u * uint32_t(slot);
    const uint32_t dst = smem_addr(ring) + uint32_t(slot) * slot_bytes;
    tma::mbar_arrive_expect_tx(bar, slot_bytes);
    bulk_copy_g2s(dst, x + row * d, row_bytes, bar);
    bulk_copy_g2s(dst + row_bytes, dout + row * d, row_bytes, bar);
    if (has_res) bulk_copy_g2s(dst + 2 * row_bytes, residual + row * d, row_bytes, bar);
  };
  if (t == 0) {
    for (int s = 0; s < stages; ++s) fill(s, s);
  }
  for (int64_t i = threadIdx.x; i < row_end - row0; i += blockDim.x)
    rstd_s[i] = __ldg(rstd + row0 + i);
  const float dx_scale = kDx ? *dxe.scale : 0.0f;
  const float y_scale = kY ? *ye.scale : 0.0f;
  Raw<8> wv[VPT];
  load_w<8, VPT>(wv, w, t, group_threads, d);
  float dw_acc[VPT][8] = {};
  float dx_amax = 0.0f, y_amax = 0.0f;
  const bool want_dxq = kDx && dxe.q != nullptr, want_yq = kY && ye.q != nullptr;
  __syncthreads();  // rstd_s
  RingPos pos;
  int64_t j = 0;  // the group's rows so far
  // Every group runs span / groups iterations (groups divides kQRows), so all threads reach the
  // block barriers; a group skips the rows past row_end (all its threads alike) but not the two
  // phases of its group barrier.
  for (int64_t off = 0; off < span; off += groups) {
    const int64_t row = row0 + off + g;
    if (row < row_end) {
      tma::mbar_wait(bars + 8u * uint32_t(pos.slot), pos.parity);
      const uint8_t* xs = ring + size_t(pos.slot) * slot_bytes;  // x, dout, residual [D] bf16
      Raw<8> xv[VPT], dyv[VPT], rv[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (t + k * group_threads) * 8;
        if (c < d) {
          xv[k].u = *reinterpret_cast<const uint4*>(xs + 2 * c);
          dyv[k].u = *reinterpret_cast<const uint4*>(xs + row_bytes + 2 * c);
          if (has_res) {
            rv[k].u = *reinterpret_cast<const uint4*>(xs + 2 * row_bytes + 2 * c);
          } else {
            rv[k].zero();
          }
        } else {
          xv[k].zero();
          dyv[k].zero();
          rv[k].zero();
        }
      }
      float dot = warp_sum(dot_chunks<8, VPT>(dyv, wv, xv));
      float ss = kY ? warp_sum(sumsq_chunks<8, VPT>(xv)) : 0.0f;
      if (wpg > 1) {
        // rmsnorm_bwd_kernel's order for dot (warps in turn), group_sum's for ss.
        asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
        if (lane == 0) {
          scratch_dot[warp] = dot;
          scratch_ss[warp] = ss;
        }
        asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
        dot = 0.0f;
        for (int i = 0; i < wpg; ++i) dot += scratch_dot[g * wpg + i];
        if (kY) ss = warp_sum(lane < wpg ? scratch_ss[g * wpg + lane] : 0.0f);
      } else {
        __syncwarp();
      }
      // Every thread of the group has read the slot: it takes the group's row j + stages.
      if (t == 0) fill(pos.slot, j + stages);
      pos.advance(stages);
      ++j;
      const int tr = int((off + g) % kQRows);  // the row's place in the staged tiles
      const float r = rstd_s[row - row0];
      const float c_row = __fmul_rn(__fmul_rn(__fdiv_rn(dot, float(d)), r), r);
      const float ry = kY ? rstd_of(ss, d, eps) : 0.0f;
      const int64_t at = row * d;  // the row's first element
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = (t + k * group_threads) * 8;
        if (c >= d) continue;
        float o[8];
        dx_chunk<8>(xv[k], dyv[k], wv[k], rv[k], has_res, r, c_row, o, dw_acc[k]);
        if constexpr (kDx) {
          fp8_chunk8<true>(o, dx_scale, dxe.e5m2, true, dx + at + c, want_dxq, dxe.q + at + c,
                           dx_tile + tr * pitch + c, dx_amax);
        } else {
          uint32_t packed[4];  // dx rounded as store8 rounds it
          pack_bf16x8(o, packed);
          *reinterpret_cast<uint4*>(dx + at + c) =
              make_uint4(packed[0], packed[1], packed[2], packed[3]);
        }
        if constexpr (kY) {
          float yf[8];  // y as rmsnorm_fwd computes it, before its rounding to bf16
#pragma unroll
          for (int i = 0; i < 8; ++i) yf[i] = __fmul_rn(__fmul_rn(xv[k].get(i), ry), wv[k].get(i));
          fp8_chunk8<true>(yf, y_scale, ye.e5m2, false, nullptr, want_yq, ye.q + at + c,
                           y_tile + tr * pitch + c, y_amax);
        }
      }
    } else if (wpg > 1) {
      // No row (past row_end: the last block's last tile only). The group still takes the two
      // phases of its barrier that a row takes, as rmsnorm_bwd_fp8_kernel's groups do, so that
      // all groups have passed equally many barrier phases at every block barrier that follows.
      asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
      asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(group_threads) : "memory");
    }
    if ((off + groups) % kQRows == 0) {  // a whole tile staged: write its columnwise copies
      __syncthreads();
      const int64_t n0 = row0 + off + groups - kQRows;
      if (kDx && dxe.qt != nullptr) {
        store_transposed<kQRows>(dxe.qt, dx_tile, pitch, n0, n_rows, 0, d, vec_t);
      }
      if (kY && ye.qt != nullptr) {
        store_transposed<kQRows>(ye.qt, y_tile, pitch, n0, n_rows, 0, d, vec_t);
      }
      __syncthreads();
    }
  }
  // The dw fold as rmsnorm_bwd_kernel's, in the tile memory.
  fold_dw_partials<8, VPT>(reinterpret_cast<float*>(smem), partial, dw_acc, g, groups, t,
                           group_threads, d);
  if constexpr (kDx) fp8_epilogue_finish(dx_amax, dx_scale, dxe);
  if constexpr (kY) fp8_epilogue_finish(y_amax, y_scale, ye);
}

// dw [D] += (or = when !accumulate) Σ_b partial [B, D] rows in order b = 0, 1, …: thread (tx, ty)
// sums rows b ≡ ty (mod 32) of column blockIdx.x·32 + tx, then ty = 0 adds the 32 sums in order.
// The sum starts at +0, so writing it equals adding it to a zeroed dw (never −0).
__global__ void rmsnorm_dw_reduce_kernel(float* __restrict__ dw, const float* __restrict__ partial,
                                         int64_t blocks, int d, bool accumulate) {
  pdl::grid_sync();
  __shared__ float s[32][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < d) {
    for (int64_t b = threadIdx.y; b < blocks; b += 32) acc += partial[b * d + col];
  }
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < d) {
    float total = 0.0f;
    for (int j = 0; j < 32; ++j) total += s[j][threadIdx.x];
    dw[col] = accumulate ? dw[col] + total : total;
  }
}

// Launch shape shared by both directions: VEC (8 or 1), VPT (chunks per thread) and the threads
// covering one row.
struct RowPlan {
  int vec = 1, vpt = 1, threads = 32;
};

RowPlan plan_row(int64_t d, bool vec_ok, const char* op) {
  RowPlan p;
  p.vec = vec_ok ? 8 : 1;
  const int64_t chunks = d / p.vec;
  while (p.vpt < 8 && ceil_div(chunks, p.vpt) > 512) p.vpt *= 2;
  LOWBIT_USER_CHECK(ceil_div(chunks, p.vpt) <= 512,
                    "{}: D = {} is too wide for the GPU kernel (at most 32768 when D % 8 == 0, "
                    "else 4096)",
                    op, d);
  p.threads = int(ceil_div(ceil_div(chunks, p.vpt), kWarp) * kWarp);
  return p;
}

// The backward's partition, shared by rmsnorm_bwd and rmsnorm_bwd_quantize (whose dw must be the
// same bits): groups of p.threads threads, a power of two of them (≤ 8, ≤ 512 threads, so they
// divide kQRows); rows per block a multiple of kQRows, so that at most ~256 partial rows are
// written (a few percent of the traffic; on H100 fewer, longer blocks measured faster than more,
// shorter ones).
struct BwdPlan {
  int groups = 1, threads = 32;
  int64_t rows_per_block = kQRows, blocks = 1;
};

BwdPlan plan_bwd(const RowPlan& p, int64_t n) {
  BwdPlan b;
  while (b.groups < 8 && b.groups * 2 * p.threads <= 512) b.groups *= 2;
  b.threads = b.groups * p.threads;
  b.rows_per_block = ceil_div(std::max<int64_t>(ceil_div(n, 256), 1), kQRows) * kQRows;
  b.blocks = ceil_div(n, b.rows_per_block);
  return b;
}

// The backward's bf16 operands (residual null when absent).
struct BwdPointers {
  uint16_t* dx;
  const uint16_t *dout, *x, *w, *res;
  BwdPointers(const TensorView& dx_, const TensorView& dout_, const TensorView& x_,
              const TensorView& w_, const TensorView& res_)
      : dx(dx_.ptr<uint16_t>()),
        dout(dout_.ptr<const uint16_t>()),
        x(x_.ptr<const uint16_t>()),
        w(w_.ptr<const uint16_t>()),
        res(res_.data != nullptr ? res_.ptr<const uint16_t>() : nullptr) {}
  // Every row 16-byte aligned (with D % 8 == 0): the 8-element vector path.
  bool aligned() const {
    return aligned16(dx) && aligned16(dout) && aligned16(x) && aligned16(w) &&
           (res == nullptr || aligned16(res));
  }
};

// dw [D] += (or =) the block partial rows [blocks, D], in block order.
void reduce_dw(cudaStream_t s, const TensorView& dw, const float* partial, int64_t blocks,
               int64_t d, bool accumulate) {
  pdl::launch(rmsnorm_dw_reduce_kernel, static_cast<unsigned>(ceil_div(d, 32)), dim3(32, 32), 0, s,
              dw.ptr<float>(), partial, blocks, int(d), accumulate);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

// Blocks of `kernel` (threads per block, dynamic shared memory) resident on one SM of the
// current device. Cached per kernel, device and launch shape (the occupancy query would cost
// host time on every call).
template <typename Kernel>
int blocks_per_sm(Kernel* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, size_t>, int> cache;
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, threads, smem);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  cache.emplace(key, per_sm);
  return per_sm;
}

template <int VEC>
void launch_fwd(const RowPlan& p, dim3 grid, cudaStream_t s, uint16_t* out, float* rstd,
                const uint16_t* x, const uint16_t* w, int d, float eps) {
  switch (p.vpt) {
    case 1:
      pdl::launch(rmsnorm_fwd_kernel<VEC, 1>, grid, p.threads, 0, s, out, rstd, x, w, d, eps);
      break;
    case 2:
      pdl::launch(rmsnorm_fwd_kernel<VEC, 2>, grid, p.threads, 0, s, out, rstd, x, w, d, eps);
      break;
    case 4:
      pdl::launch(rmsnorm_fwd_kernel<VEC, 4>, grid, p.threads, 0, s, out, rstd, x, w, d, eps);
      break;
    default:
      pdl::launch(rmsnorm_fwd_kernel<VEC, 8>, grid, p.threads, 0, s, out, rstd, x, w, d, eps);
  }
}

template <int VEC, int VPT>
void launch_bwd_vpt(dim3 grid, int threads, size_t smem, cudaStream_t s, uint16_t* dx,
                    float* partial, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                    const float* rstd, const uint16_t* res, int64_t n, int d, int group_threads,
                    int groups, int64_t rows_per_block) {
  auto kernel = rmsnorm_bwd_kernel<VEC, VPT>;
  allow_dynamic_smem(kernel, smem);
  pdl::launch(kernel, grid, threads, smem, s, dx, partial, dy, x, w, rstd, res, n, d, group_threads,
              groups, rows_per_block);
}

template <int VEC>
void launch_bwd(const RowPlan& p, dim3 grid, int threads, size_t smem, cudaStream_t s, uint16_t* dx,
                float* partial, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                const float* rstd, const uint16_t* res, int64_t n, int d, int groups,
                int64_t rows_per_block) {
  switch (p.vpt) {
    case 1:
      launch_bwd_vpt<VEC, 1>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, res, n, d,
                             p.threads, groups, rows_per_block);
      break;
    case 2:
      launch_bwd_vpt<VEC, 2>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, res, n, d,
                             p.threads, groups, rows_per_block);
      break;
    case 3:
      launch_bwd_vpt<VEC, 3>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, res, n, d,
                             p.threads, groups, rows_per_block);
      break;
    case 4:
      launch_bwd_vpt<VEC, 4>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, res, n, d,
                             p.threads, groups, rows_per_block);
      break;
    default:
      launch_bwd_vpt<VEC, 8>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, res, n, d,
                             p.threads, groups, rows_per_block);
  }
}

}  // namespace

void rmsnorm_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& rstd,
                      const TensorView& x, const TensorView& w, float eps) {
  const int64_t n = x.size(0), d = x.size(1);
  uint16_t* o = out.ptr<uint16_t>();
  const uint16_t* xp = x.ptr<const uint16_t>();
  const uint16_t* wp = w.ptr<const uint16_t>();
  const bool vec = d % 8 == 0 && aligned16(o) && aligned16(xp) && aligned16(wp);
  const RowPlan p = plan_row(d, vec, "rmsnorm_fwd");
  LOWBIT_USER_CHECK(n < (int64_t(1) << 31), "rmsnorm_fwd: {} rows exceed the GPU grid", n);
  const dim3 grid(static_cast<unsigned>(n));
  if (vec) {
    launch_fwd<8>(p, grid, ctx.stream(), o, rstd.ptr<float>(), xp, wp, int(d), eps);
  } else {
    launch_fwd<1>(p, grid, ctx.stream(), o, rstd.ptr<float>(), xp, wp, int(d), eps);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

bool rmsnorm_fwd_quantize_cuda(Context& ctx, const TensorView& y, const TensorView& rstd,
                               const TensorView& x, const TensorView& w, float eps,
                               const QuantConfig& cfg, QuantizedTensor& out,
                               const RmsNormFp8Config* config) {
  using K = RmsNormFp8Kernel;
  const RmsNormFp8Config kc = config != nullptr ? *config : RmsNormFp8Config{};
  const int64_t n = x.size(0), d = x.size(1);
  uint16_t* yp = absent(y) ? nullptr : y.ptr<uint16_t>();
  float* rp = absent(rstd) ? nullptr : rstd.ptr<float>();
  const uint16_t* xp = x.ptr<const uint16_t>();
  const uint16_t* wp = w.ptr<const uint16_t>();
  // Preconditions of the fused kernel (else the caller runs the composition): the 16-byte
  // vector path of rmsnorm_fwd (whose row sums it reproduces), at most 4 chunks per thread
  // (D ≤ 16384; registers), and the columnwise tile within the shared memory of a block.
  if (n == 0 || d % 8 != 0 || d > 16384 || !aligned16(xp) || !aligned16(wp)) return false;
  if (yp != nullptr && !aligned16(yp)) return false;
  const RowPlan p = plan_row(d, true, "rmsnorm_fwd_quantize");
  const bool col = cfg.columnwise;
  const size_t tile_smem = col ? size_t(kQRows) * size_t(d + 4) : 0;
  // 1 KiB: the static shared arrays.
  const int dev = ctx.device().index;
  if (!dynamic_smem_fits(dev, tile_smem, 1024)) return false;

  const Fp8Epilogue ep = fp8_epilogue_outputs(ctx, cfg, n, d, out);
  // Groups of p.threads threads, a power of two of them (so that they divide kQRows) in at most
  // 512 threads: D 768 → 4 × 96, D 2048 → 2 × 256.
  int groups = 1;
  while (groups < 8 && groups * 2 * p.threads <= 512) groups *= 2;
  const int threads = groups * p.threads;
  const bool vec_t = n % 16 == 0 && aligned16(ep.qt);
  const int64_t n_tiles = ceil_div(n, kQRows);
  const int sms = sm_count(dev);
  cudaStream_t s = ctx.stream();
  const int forced_stages = kc.stages > 0 ? std::min(kc.stages, kMaxStages) : 0;
  K chosen = K::kRegisters;

  // One warp per row: its shared memory (w as fp32, the x slots, the tile) for s stages. Stages
  // picked for the most warps (rows) resident per SM, then the most rows in flight among those:
  // at D 768 rowwise, 48 warps × 2 slots ran 14 % faster than 32 warps × 4 slots on an H100
  // (more rows in compute at once; the slots were never the limit). Chosen by default only with
  // at least 16 warps per SM (wide rows or the tile leave fewer: then the per-group kernel keeps
  // more rows going).
  auto warp_smem = [&](int st) {
    return size_t(4 * d) + size_t(kRowWarps) * st * size_t(2 * d) + tile_smem;
  };
  auto try_warp = [&](auto kernel) {
    int best = 0, best_warps = 0;
    const int st_hi = forced_stages > 0 ? forced_stages : kMaxStages;
    const int st_lo = forced_stages > 0 ? forced_stages : 2;
    for (int st = st_hi; st >= st_lo; --st) {
      if (!dynamic_smem_fits(dev, warp_smem(st), 1024)) continue;
      allow_dynamic_smem(kernel, warp_smem(st));
      const int warps = blocks_per_sm(kernel, kRowThreads, warp_smem(st)) * kRowWarps;
      if (warps > best_warps) best = st, best_warps = warps;
    }
    if (best == 0 || (kc.kernel == K::kAuto && best_warps < 16)) return false;
    const size_t smem = warp_smem(best);
    const int64_t units = col ? n_tiles : ceil_div(n, kRowWarps);
    const int64_t blocks = std::min<int64_t>(
        units, std::max(blocks_per_sm(kernel, kRowThreads, smem), 1) * int64_t(sms));
    pdl::launch(kernel, dim3(static_cast<unsigned>(blocks)), kRowThreads, smem, s, yp, rp, xp, wp,
                n, int(d), eps, p.threads, best, vec_t, ep);
    chosen = K::kWarpRing;
    return true;
  };
  // A ring per group: up to 4 rows of x per group (at least 2, 64 KiB per group at most where D
  // allows), fewer where the block's shared memory would not hold them.
  auto try_groups = [&](auto kernel) {
    const size_t slot_bytes = size_t(groups) * size_t(2 * d);  // one row of x per group
    int st = forced_stages > 0 ? forced_stages
                               : int(std::clamp<int64_t>(65536 / (2 * d), 2, kMaxStages));
    while (st > 0 && !dynamic_smem_fits(dev, st * slot_bytes + tile_smem, 1024)) --st;
    if (st == 0) return false;
    const size_t smem = st * slot_bytes + tile_smem;
    allow_dynamic_smem(kernel, smem);
    const int64_t units = col ? n_tiles : ceil_div(n, groups);
    const int64_t blocks =
        std::min<int64_t>(units, std::max(blocks_per_sm(kernel, threads, smem), 1) * int64_t(sms));
    pdl::launch(kernel, dim3(static_cast<unsigned>(blocks)), threads, smem, s, yp, rp, xp, wp, n,
                int(d), eps, p.threads, groups, st, vec_t, ep);
    chosen = K::kGroupRing;
    return true;
  };
  auto run_registers = [&](auto kernel) {
    allow_dynamic_smem(kernel, tile_smem);
    pdl::launch(kernel, dim3(static_cast<unsigned>(n_tiles)), threads, tile_smem, s, yp, rp, xp, wp,
                n, int(d), eps, p.threads, groups, vec_t, ep);
  };
  auto run = [&](auto warp_kernel, auto group_kernel, auto register_kernel) {
    if ((kc.kernel == K::kAuto || kc.kernel == K::kWarpRing) && try_warp(warp_kernel)) return;
    if (kc.kernel != K::kRegisters && try_groups(group_kernel)) return;
    run_registers(register_kernel);
  };
  switch (p.vpt * 2 + (col ? 1 : 0)) {
    case 2:
      run(rmsnorm_fwd_fp8_warp_kernel<1, false>, rmsnorm_fwd_fp8_ring_kernel<1, false>,
          rmsnorm_fwd_fp8_kernel<1, false>);
      break;
    case 3:
      run(rmsnorm_fwd_fp8_warp_kernel<1, true>, rmsnorm_fwd_fp8_ring_kernel<1, true>,
          rmsnorm_fwd_fp8_kernel<1, true>);
      break;
    case 4:
      run(rmsnorm_fwd_fp8_warp_kernel<2, false>, rmsnorm_fwd_fp8_ring_kernel<2, false>,
          rmsnorm_fwd_fp8_kernel<2, false>);
      break;
    case 5:
      run(rmsnorm_fwd_fp8_warp_kernel<2, true>, rmsnorm_fwd_fp8_ring_kernel<2, true>,
          rmsnorm_fwd_fp8_kernel<2, true>);
      break;
    case 8:
      run(rmsnorm_fwd_fp8_warp_kernel<4, false>, rmsnorm_fwd_fp8_ring_kernel<4, false>,
          rmsnorm_fwd_fp8_kernel<4, false>);
      break;
    default:
      run(rmsnorm_fwd_fp8_warp_kernel<4, true>, rmsnorm_fwd_fp8_ring_kernel<4, true>,
          rmsnorm_fwd_fp8_kernel<4, true>);
      break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  if (kc.ran != nullptr) *kc.ran = chosen;
  return true;
}

void rmsnorm_bwd_cuda(Context& ctx, const TensorView& dx, const TensorView& dw,
                      const TensorView& dout, const TensorView& x, const TensorView& w,
                      const TensorView& rstd, const TensorView& residual, bool accumulate) {
  const int64_t n = x.size(0), d = x.size(1);
  const BwdPointers ptr(dx, dout, x, w, residual);
  uint16_t* dxp = ptr.dx;
  const uint16_t *rp = ptr.res, *dyp = ptr.dout, *xp = ptr.x, *wp = ptr.w;
  const bool vec = d % 8 == 0 && ptr.aligned();
  const RowPlan p = plan_row(d, vec, "rmsnorm_bwd");
  const BwdPlan b = plan_bwd(p, n);
  float* partial = static_cast<float*>(ctx.workspace(size_t(b.blocks) * size_t(d) * sizeof(float)));
  const size_t smem = size_t(d) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(b.blocks));
  cudaStream_t s = ctx.stream();
  if (vec) {
    launch_bwd<8>(p, grid, b.threads, smem, s, dxp, partial, dyp, xp, wp, rstd.ptr<const float>(),
                  rp, n, int(d), b.groups, b.rows_per_block);
  } else {
    launch_bwd<1>(p, grid, b.threads, smem, s, dxp, partial, dyp, xp, wp, rstd.ptr<const float>(),
                  rp, n, int(d), b.groups, b.rows_per_block);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  reduce_dw(s, dw, partial, b.blocks, d, accumulate);
}

bool rmsnorm_bwd_quantize_cuda(Context& ctx, const TensorView& dx, const TensorView& dw,
                               const TensorView& dout, const TensorView& x, const TensorView& w,
                               const TensorView& rstd, const TensorView& residual, float eps,
                               const QuantConfig* dx_cfg, QuantizedTensor* dx_out,
                               const QuantConfig* y_cfg, QuantizedTensor* y_out, bool accumulate,
                               const RmsNormFp8Config* config) {
  using K = RmsNormFp8Kernel;
  const RmsNormFp8Config kc = config != nullptr ? *config : RmsNormFp8Config{};
  const int64_t n = x.size(0), d = x.size(1);
  const BwdPointers ptr(dx, dout, x, w, residual);
  uint16_t* dxp = ptr.dx;
  const uint16_t *rp = ptr.res, *dyp = ptr.dout, *xp = ptr.x, *wp = ptr.w;
  // Preconditions (else the caller runs the composition): rmsnorm_bwd's 16-byte vector path
  // (whose bits it reproduces), at most 2 chunks per thread (D ≤ 8192; registers), the staged
  // tiles within a block's shared memory.
  if (n == 0 || d % 8 != 0 || d > 8192 || !ptr.aligned()) return false;
  const bool want_dx = dx_cfg != nullptr, want_y = y_cfg != nullptr;
  const RowPlan p = plan_row(d, true, "rmsnorm_bwd_quantize");
  const size_t tiles = size_t(want_dx) + size_t(want_y);
  const size_t tile_smem = tiles * size_t(kQRows) * size_t(d + 4);
  const size_t smem_legacy = std::max(tile_smem, size_t(d) * sizeof(float));
  // 1 KiB: the static shared arrays.
  const int dev = ctx.device().index;
  if (!dynamic_smem_fits(dev, smem_legacy, 1024)) return false;

  Fp8Epilogue dxe, ye;
  if (want_dx) dxe = fp8_epilogue_outputs(ctx, *dx_cfg, n, d, *dx_out);
  if (want_y) ye = fp8_epilogue_outputs(ctx, *y_cfg, n, d, *y_out);
  const BwdPlan b = plan_bwd(p, n);
  float* partial = static_cast<float*>(ctx.workspace(size_t(b.blocks) * size_t(d) * sizeof(float)));
  // The transposed copies as 16-byte stores: N % 16 == 0 and both payloads 16-byte aligned.
  const bool vec_t = n % 16 == 0 && (dxe.qt == nullptr || aligned16(dxe.qt)) &&
                     (ye.qt == nullptr || aligned16(ye.qt));
  // The ring kernel: 3 rows of x, dout (and the residual) per group by default, fewer where the
  // block's shared memory (tiles, the block's rstd, the slots) would not hold them; the register
  // kernel where not even one fits, or the block's rstd would take over 4 KiB (N > 262144).
  const size_t rstd_smem = size_t(b.rows_per_block) * sizeof(float);  // a multiple of 128 bytes
  const size_t slot_bytes = size_t(b.groups) * (rp != nullptr ? 3 : 2) * size_t(2 * d);
  int stages = kc.stages > 0 ? std::min(kc.stages, kMaxStages) : 3;
  auto ring_smem = [&](int st) { return (tile_smem + 15) / 16 * 16 + rstd_smem + st * slot_bytes; };
  while (stages > 0 && !dynamic_smem_fits(dev, ring_smem(stages), 1024)) --stages;
  const bool ring = kc.kernel != K::kRegisters && stages > 0 && rstd_smem <= 4096;
  const size_t smem = ring ? ring_smem(stages) : smem_legacy;
  const dim3 grid(static_cast<unsigned>(b.blocks));
  cudaStream_t s = ctx.stream();
  auto launch = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem);
    pdl::launch(kernel, grid, b.threads, smem, s, dxp, partial, dyp, xp, wp,
                rstd.ptr<const float>(), rp, n, int(d), eps, p.threads, b.groups, b.rows_per_block,
                vec_t, dxe, ye);
  };
  auto launch_ring = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem);
    pdl::launch(kernel, grid, b.threads, smem, s, dxp, partial, dyp, xp, wp,
                rstd.ptr<const float>(), rp, n, int(d), eps, p.threads, b.groups, b.rows_per_block,
                stages, vec_t, dxe, ye);
  };
  const int which = (ring ? 6 : 0) + (p.vpt == 1 ? 0 : 3) +
                    (want_dx && want_y ? 2
                     : want_y          ? 1
                                       : 0);
  switch (which) {
    case 0: launch(rmsnorm_bwd_fp8_kernel<1, true, false>); break;
    case 1: launch(rmsnorm_bwd_fp8_kernel<1, false, true>); break;
    case 2: launch(rmsnorm_bwd_fp8_kernel<1, true, true>); break;
    case 3: launch(rmsnorm_bwd_fp8_kernel<2, true, false>); break;
    case 4: launch(rmsnorm_bwd_fp8_kernel<2, false, true>); break;
    case 5: launch(rmsnorm_bwd_fp8_kernel<2, true, true>); break;
    case 6: launch_ring(rmsnorm_bwd_fp8_ring_kernel<1, true, false>); break;
    case 7: launch_ring(rmsnorm_bwd_fp8_ring_kernel<1, false, true>); break;
    case 8: launch_ring(rmsnorm_bwd_fp8_ring_kernel<1, true, true>); break;
    case 9: launch_ring(rmsnorm_bwd_fp8_ring_kernel<2, true, false>); break;
    case 10: launch_ring(rmsnorm_bwd_fp8_ring_kernel<2, false, true>); break;
    default: launch_ring(rmsnorm_bwd_fp8_ring_kernel<2, true, true>); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  if (kc.ran != nullptr) *kc.ran = ring ? K::kGroupRing : K::kRegisters;
  reduce_dw(s, dw, partial, b.blocks, d, accumulate);
  return true;
}

}  // namespace lowbit::ops_detail

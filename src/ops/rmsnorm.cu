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
#include <algorithm>

#include "core/pdl.cuh"
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
                               const QuantConfig& cfg, QuantizedTensor& out) {
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
  const size_t smem = col ? size_t(kQRows) * size_t(d + 4) : 0;
  // 1 KiB: the static shared arrays.
  if (!dynamic_smem_fits(ctx.device().index, smem, 1024)) return false;

  const Fp8Epilogue ep = fp8_epilogue_outputs(ctx, cfg, n, d, out);
  // Groups of p.threads threads, a power of two of them (so that they divide kQRows) in at most
  // 512 threads: D 768 → 4 × 96, D 2048 → 2 × 256.
  int groups = 1;
  while (groups < 8 && groups * 2 * p.threads <= 512) groups *= 2;
  const int threads = groups * p.threads;
  const bool vec_t = n % 16 == 0 && aligned16(ep.qt);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kQRows)));
  cudaStream_t s = ctx.stream();
  auto launch = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem);
    pdl::launch(kernel, grid, threads, smem, s, yp, rp, xp, wp, n, int(d), eps, p.threads, groups,
                vec_t, ep);
  };
  switch (p.vpt * 2 + (col ? 1 : 0)) {
    case 2: launch(rmsnorm_fwd_fp8_kernel<1, false>); break;
    case 3: launch(rmsnorm_fwd_fp8_kernel<1, true>); break;
    case 4: launch(rmsnorm_fwd_fp8_kernel<2, false>); break;
    case 5: launch(rmsnorm_fwd_fp8_kernel<2, true>); break;
    case 8: launch(rmsnorm_fwd_fp8_kernel<4, false>); break;
    default: launch(rmsnorm_fwd_fp8_kernel<4, true>); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
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
                               const QuantConfig* y_cfg, QuantizedTensor* y_out, bool accumulate) {
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
  const size_t smem = std::max(tiles * size_t(kQRows) * size_t(d + 4), size_t(d) * sizeof(float));
  // 1 KiB: the static shared arrays.
  if (!dynamic_smem_fits(ctx.device().index, smem, 1024)) return false;

  Fp8Epilogue dxe, ye;
  if (want_dx) dxe = fp8_epilogue_outputs(ctx, *dx_cfg, n, d, *dx_out);
  if (want_y) ye = fp8_epilogue_outputs(ctx, *y_cfg, n, d, *y_out);
  const BwdPlan b = plan_bwd(p, n);
  float* partial = static_cast<float*>(ctx.workspace(size_t(b.blocks) * size_t(d) * sizeof(float)));
  // The transposed copies as 16-byte stores: N % 16 == 0 and both payloads 16-byte aligned.
  const bool vec_t = n % 16 == 0 && (dxe.qt == nullptr || aligned16(dxe.qt)) &&
                     (ye.qt == nullptr || aligned16(ye.qt));
  const dim3 grid(static_cast<unsigned>(b.blocks));
  cudaStream_t s = ctx.stream();
  auto launch = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem);
    pdl::launch(kernel, grid, b.threads, smem, s, dxp, partial, dyp, xp, wp,
                rstd.ptr<const float>(), rp, n, int(d), eps, p.threads, b.groups, b.rows_per_block,
                vec_t, dxe, ye);
  };
  const int which = (p.vpt == 1 ? 0 : 3) + (want_dx && want_y ? 2 : want_y ? 1 : 0);
  switch (which) {
    case 0: launch(rmsnorm_bwd_fp8_kernel<1, true, false>); break;
    case 1: launch(rmsnorm_bwd_fp8_kernel<1, false, true>); break;
    case 2: launch(rmsnorm_bwd_fp8_kernel<1, true, true>); break;
    case 3: launch(rmsnorm_bwd_fp8_kernel<2, true, false>); break;
    case 4: launch(rmsnorm_bwd_fp8_kernel<2, false, true>); break;
    default: launch(rmsnorm_bwd_fp8_kernel<2, true, true>); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  reduce_dw(s, dw, partial, b.blocks, d, accumulate);
  return true;
}

}  // namespace lowbit::ops_detail

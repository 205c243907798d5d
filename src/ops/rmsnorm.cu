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

#include "lowbit/core/cuda_check.h"
#include "ops/ops_cuda.cuh"
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
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const uint16_t* xr = x + row * d;  // [D]
  Raw<VEC> xv[VPT], wv[VPT];
  float ss = 0.0f;
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
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss += xv[k].get(i) * xv[k].get(i);
  }
  ss = block_sum(ss, scratch);
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

// dx [N, D] bf16 and partial [gridDim.x, D] f32 (this block's Σ (x·rstd)·dout per column) from
// dout, x [N, D] bf16, w [D] bf16, rstd [N] f32. blockDim = group_threads · groups.
// Dynamic shared memory: D floats (the fold of the groups' partial sums).
template <int VEC, int VPT>
__global__ void __launch_bounds__(1024)
    rmsnorm_bwd_kernel(uint16_t* __restrict__ dx, float* __restrict__ partial,
                       const uint16_t* __restrict__ dout, const uint16_t* __restrict__ x,
                       const uint16_t* __restrict__ w, const float* __restrict__ rstd,
                       int64_t n_rows, int d, int group_threads, int groups,
                       int64_t rows_per_block) {
  extern __shared__ float fold[];  // [D]
  __shared__ float scratch[32];    // one sum per warp
  const int g = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int warps_per_group = group_threads / kWarp, warp = threadIdx.x / kWarp;
  Raw<VEC> wv[VPT];
  float dw_acc[VPT][VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = (t + k * group_threads) * VEC;
    if (c < d) {
      wv[k].load(w + c);
    } else {
      wv[k].zero();
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) dw_acc[k][i] = 0.0f;
  }
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
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) dot += __fmul_rn(dyv[k].get(i), wv[k].get(i)) * xv[k].get(i);
    }
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
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float xi = xv[k].get(i), dyi = dyv[k].get(i);
          const float gi = __fmul_rn(dyi, wv[k].get(i));
          o[i] = __fmul_rn(r, __fsub_rn(gi, __fmul_rn(xi, c_row)));
          dw_acc[k][i] = __fadd_rn(dw_acc[k][i], __fmul_rn(__fmul_rn(xi, r), dyi));
        }
        store_vec<VEC>(dx + row * d + c, o);
      }
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      xv[k] = xn[k];
      dyv[k] = dyn[k];
    }
  }
  // Fold the groups' partial sums: fold = g0, then fold += g1, g2, … in order.
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

// dw [D] += Σ_b partial [B, D] rows in order b = 0, 1, …: thread (tx, ty) sums rows b ≡ ty
// (mod 32) of column blockIdx.x·32 + tx, then ty = 0 adds the 32 sums in order.
__global__ void rmsnorm_dw_reduce_kernel(float* __restrict__ dw, const float* __restrict__ partial,
                                         int64_t blocks, int d) {
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
    dw[col] += total;
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

template <int VEC>
void launch_fwd(const RowPlan& p, dim3 grid, cudaStream_t s, uint16_t* out, float* rstd,
                const uint16_t* x, const uint16_t* w, int d, float eps) {
  switch (p.vpt) {
    case 1: rmsnorm_fwd_kernel<VEC, 1><<<grid, p.threads, 0, s>>>(out, rstd, x, w, d, eps); break;
    case 2: rmsnorm_fwd_kernel<VEC, 2><<<grid, p.threads, 0, s>>>(out, rstd, x, w, d, eps); break;
    case 4: rmsnorm_fwd_kernel<VEC, 4><<<grid, p.threads, 0, s>>>(out, rstd, x, w, d, eps); break;
    default: rmsnorm_fwd_kernel<VEC, 8><<<grid, p.threads, 0, s>>>(out, rstd, x, w, d, eps);
  }
}

template <int VEC, int VPT>
void launch_bwd_vpt(dim3 grid, int threads, size_t smem, cudaStream_t s, uint16_t* dx,
                    float* partial, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                    const float* rstd, int64_t n, int d, int group_threads, int groups,
                    int64_t rows_per_block) {
  auto kernel = rmsnorm_bwd_kernel<VEC, VPT>;
  if (smem > 48 * 1024) {
    LOWBIT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  kernel<<<grid, threads, smem, s>>>(dx, partial, dy, x, w, rstd, n, d, group_threads, groups,
                                     rows_per_block);
}

template <int VEC>
void launch_bwd(const RowPlan& p, dim3 grid, int threads, size_t smem, cudaStream_t s, uint16_t* dx,
                float* partial, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                const float* rstd, int64_t n, int d, int groups, int64_t rows_per_block) {
  switch (p.vpt) {
    case 1:
      launch_bwd_vpt<VEC, 1>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, n, d, p.threads,
                             groups, rows_per_block);
      break;
    case 2:
      launch_bwd_vpt<VEC, 2>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, n, d, p.threads,
                             groups, rows_per_block);
      break;
    case 3:
      launch_bwd_vpt<VEC, 3>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, n, d, p.threads,
                             groups, rows_per_block);
      break;
    case 4:
      launch_bwd_vpt<VEC, 4>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, n, d, p.threads,
                             groups, rows_per_block);
      break;
    default:
      launch_bwd_vpt<VEC, 8>(grid, threads, smem, s, dx, partial, dy, x, w, rstd, n, d, p.threads,
                             groups, rows_per_block);
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

void rmsnorm_bwd_cuda(Context& ctx, const TensorView& dx, const TensorView& dw,
                      const TensorView& dout, const TensorView& x, const TensorView& w,
                      const TensorView& rstd) {
  const int64_t n = x.size(0), d = x.size(1);
  uint16_t* dxp = dx.ptr<uint16_t>();
  const uint16_t* dyp = dout.ptr<const uint16_t>();
  const uint16_t* xp = x.ptr<const uint16_t>();
  const uint16_t* wp = w.ptr<const uint16_t>();
  const bool vec = d % 8 == 0 && aligned16(dxp) && aligned16(dyp) && aligned16(xp) && aligned16(wp);
  const RowPlan p = plan_row(d, vec, "rmsnorm_bwd");
  // Up to 8 groups of p.threads in a block of at most 512 threads; rows per block a multiple of
  // the group count, so that at most 256 partial rows are written (a few percent of the traffic;
  // on H100 fewer, longer blocks measured faster than more, shorter ones).
  const int groups = std::clamp(512 / p.threads, 1, 8);
  const int64_t rows_per_block = ceil_div(std::max<int64_t>(ceil_div(n, 256), 1), groups) * groups;
  const int64_t blocks = ceil_div(n, rows_per_block);
  float* partial = static_cast<float*>(ctx.workspace(size_t(blocks) * size_t(d) * sizeof(float)));
  const size_t smem = size_t(d) * sizeof(float);
  const int threads = p.threads * groups;
  const dim3 grid(static_cast<unsigned>(blocks));
  cudaStream_t s = ctx.stream();
  if (vec) {
    launch_bwd<8>(p, grid, threads, smem, s, dxp, partial, dyp, xp, wp, rstd.ptr<const float>(), n,
                  int(d), groups, rows_per_block);
  } else {
    launch_bwd<1>(p, grid, threads, smem, s, dxp, partial, dyp, xp, wp, rstd.ptr<const float>(), n,
                  int(d), groups, rows_per_block);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  rmsnorm_dw_reduce_kernel<<<static_cast<unsigned>(ceil_div(d, 32)), dim3(32, 32), 0, s>>>(
      dw.ptr<float>(), partial, blocks, int(d));
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

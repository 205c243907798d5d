// CUDA segment_norms and clip_coefficient. Memory-bound on the gradient read (4 bytes an
// element); squares are accumulated in fp64 (exact products, fp64 additions), which costs
// nothing next to the memory time and keeps the result within fp64 rounding of the CPU twin.
//
// segment_norms, pass 1: one block per (segment, chunk) of kChunk elements (float4 loads where
// the buffer is 16-byte aligned), each thread sums its elements in a fixed order, the block adds
// the threads' sums in a fixed tree and writes one fp64 partial to the workspace. Pass 2: one
// block per segment adds its partials in block order and takes the square root. No atomics: the
// same input gives the same bits on every run and every GPU.
#include <cstdint>
#include <vector>

#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "ops/grad_norm_impl.h"
#include "ops/ops_cuda.cuh"

namespace lowbit::ops_detail {

namespace {

constexpr int kThreads = 256;
constexpr int kIters = 8;  // float4 loads per thread and chunk
constexpr int64_t kChunkVec = int64_t(kThreads) * kIters * 4;
constexpr int64_t kChunkScalar = int64_t(kThreads) * kIters;

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Sum over the block (blockDim.x == kThreads) in a fixed tree; the result is valid in thread 0.
__device__ __forceinline__ double block_sum_f64(double v) {
  __shared__ double warp_part[kThreads / 32];
  v = warp_sum_f64(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  double s = 0.0;
  if (warp == 0) {
    s = lane < kThreads / 32 ? warp_part[lane] : 0.0;
    s = warp_sum_f64(s);
  }
  return s;
}

__device__ __forceinline__ double sq(float x) {
  const double d = x;
  return d * d;
}

// partial [blocks] f64 = Σ g² over each block's chunk; g [P] f32. UNIT 4: float4 body plus
// scalar head/tail; UNIT 1: scalar only.
template <int UNIT>
__global__ void __launch_bounds__(kThreads)
    norms_partial_kernel(double* __restrict__ partial, const float* __restrict__ g,
                         const SegmentBlocks tab) {
  pdl::grid_sync();
  const int32_t b = blockIdx.x;
  const int i = tab.find(b);
  const int64_t c = b - tab.first_block[i];
  const int64_t vb = tab.vbegin[i], ve = tab.vend[i];
  double acc = 0.0;
  const int64_t first = vb + c * kThreads * kIters * UNIT;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int64_t e = first + (int64_t(it) * kThreads + threadIdx.x) * UNIT;
    if (e < ve) {
      if constexpr (UNIT == 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(g + e));
        acc += sq(v.x) + sq(v.y) + sq(v.z) + sq(v.w);
      } else {
        acc += sq(__ldg(g + e));
      }
    }
  }
  if (c == 0) {  // the head [begin, vbegin) and tail [vend, end), fewer than UNIT each
    const int t = threadIdx.x;
    if (t < UNIT && tab.begin[i] + t < vb) acc += sq(g[tab.begin[i] + t]);
    if (t >= UNIT && t < 2 * UNIT && ve + (t - UNIT) < tab.end[i]) acc += sq(g[ve + (t - UNIT)]);
  }
  const double s = block_sum_f64(acc);
  if (threadIdx.x == 0) partial[b] = s;
}

// seg_norms[index[i]] = RN(sqrt(Σ partial[first_block[i] .. first_block[i + 1]))), one block per
// segment (fp64 sqrt is correctly rounded, as on the CPU).
__global__ void __launch_bounds__(kThreads)
    norms_final_kernel(float* __restrict__ seg_norms, const double* __restrict__ partial,
                       const SegmentBlocks tab) {
  pdl::grid_sync();
  const int i = blockIdx.x;
  double acc = 0.0;
  for (int32_t p = tab.first_block[i] + threadIdx.x; p < tab.first_block[i + 1]; p += kThreads) {
    acc += partial[p];
  }
  const double s = block_sum_f64(acc);
  if (threadIdx.x == 0) seg_norms[tab.index[i]] = __double2float_rn(sqrt(s));
}

// norm, coef, skip [1] from seg_norms [S] f32; one block.
__global__ void __launch_bounds__(kThreads)
    clip_coefficient_kernel(float* __restrict__ norm, float* __restrict__ coef,
                            int32_t* __restrict__ skip, const float* __restrict__ seg_norms,
                            int64_t s, float max_norm) {
  pdl::grid_sync();
  double acc = 0.0;
  for (int64_t k = threadIdx.x; k < s; k += kThreads) acc += sq(seg_norms[k]);
  const double total = block_sum_f64(acc);
  if (threadIdx.x == 0) {
    const float n = __double2float_rn(sqrt(total));
    const bool bad = !f32_is_finite(n);
    norm[0] = n;
    skip[0] = bad ? 1 : 0;
    coef[0] = clip_coef_of(n, max_norm, bad);
  }
}

}  // namespace

void segment_norms_cuda(Context& ctx, const TensorView& seg_norms, const TensorView& grad,
                        const std::vector<ParamSegment>& segments) {
  const bool vec = ops_cuda::aligned16(grad.data);
  const std::vector<SegmentBlocks> plan =
      vec ? plan_segment_blocks(segments, 4, kChunkVec, true)
          : plan_segment_blocks(segments, 1, kChunkScalar, true);
  int64_t total_blocks = 0;
  for (const SegmentBlocks& t : plan) total_blocks += t.blocks();
  double* partial = static_cast<double*>(
      ctx.workspace(static_cast<size_t>(std::max<int64_t>(total_blocks, 1)) * sizeof(double)));
  cudaStream_t st = ctx.stream();
  const float* g = grad.ptr<const float>();
  int64_t base = 0;
  for (const SegmentBlocks& t : plan) {
    if (t.blocks() > 0) {
      if (vec) {
        pdl::launch(norms_partial_kernel<4>, t.blocks(), kThreads, 0, st, partial + base, g, t);
      } else {
        pdl::launch(norms_partial_kernel<1>, t.blocks(), kThreads, 0, st, partial + base, g, t);
      }
      LOWBIT_CUDA_CHECK_LAUNCH();
    }
    pdl::launch(norms_final_kernel, t.count, kThreads, 0, st, seg_norms.ptr<float>(),
                partial + base, t);
    LOWBIT_CUDA_CHECK_LAUNCH();
    base += t.blocks();
  }
}

void clip_coefficient_cuda(Context& ctx, const TensorView& norm, const TensorView& coef,
                           const TensorView& skip, const TensorView& seg_norms, float max_norm) {
  pdl::launch(clip_coefficient_kernel, 1, kThreads, 0, ctx.stream(), norm.ptr<float>(),
              coef.ptr<float>(), skip.ptr<int32_t>(), seg_norms.ptr<const float>(),
              seg_norms.numel(), max_norm);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

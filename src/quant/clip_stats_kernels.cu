// CUDA kernel of quant_clip_stats(): a grid-stride pass over the source and the rowwise codes,
// per-thread counts reduced in the warp and added to the two device counters with integer
// atomics (exact and order-independent).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/pdl.cuh"
#include "lowbit/core.h"
#include "lowbit/core/cuda_check.h"
#include "quant/clip_stats_impl.h"

namespace lowbit {

namespace {

template <typename T>
__device__ __forceinline__ float load_source(const T* x, int64_t i);
template <>
__device__ __forceinline__ float load_source<uint16_t>(const uint16_t* x, int64_t i) {
  return __uint_as_float(uint32_t(x[i]) << 16);
}
template <>
__device__ __forceinline__ float load_source<float>(const float* x, int64_t i) {
  return x[i];
}

template <typename T>
__global__ void clip_stats_kernel(const T* __restrict__ x, ClipStatsView v,
                                  unsigned long long* __restrict__ counts) {
  pdl::grid_sync();
  const int64_t n = v.m * v.k;
  uint32_t saturated = 0, underflow = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    clip_stats_classify(v, i / v.k, i % v.k, load_source(x, i), saturated, underflow);
  }
  for (int off = 16; off > 0; off >>= 1) {
    saturated += __shfl_down_sync(0xFFFFFFFFu, saturated, off);
    underflow += __shfl_down_sync(0xFFFFFFFFu, underflow, off);
  }
  if ((threadIdx.x & 31) == 0 && (saturated | underflow) != 0) {
    atomicAdd(&counts[0], static_cast<unsigned long long>(saturated));
    atomicAdd(&counts[1], static_cast<unsigned long long>(underflow));
  }
}

}  // namespace

void quant_clip_stats_cuda(Context& ctx, const TensorView& x, const ClipStatsView& v,
                           const TensorView& counts) {
  const int64_t n = v.m * v.k;
  if (n == 0) return;
  constexpr int kThreads = 256;
  // Enough blocks to fill the GPU several times over; each thread then loops.
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  auto* c = static_cast<unsigned long long*>(counts.data);
  if (x.dtype == DType::kBF16) {
    pdl::launch(clip_stats_kernel<uint16_t>, blocks, kThreads, 0, ctx.stream(),
                static_cast<const uint16_t*>(x.data), v, c);
  } else {
    pdl::launch(clip_stats_kernel<float>, blocks, kThreads, 0, ctx.stream(),
                static_cast<const float*>(x.data), v, c);
  }
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit

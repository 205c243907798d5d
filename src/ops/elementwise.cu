// CUDA elementwise ops: grid-stride loops over chunks of 8 elements (16-byte bf16 or 2×16-byte
// f32 accesses) when every pointer is 16-byte aligned, then a scalar tail. `add` may run in place
// (out = a or b), so its loads do not use the read-only cache and its pointers are not
// __restrict__.
#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "ops/elementwise_impl.h"
#include "ops/ops_cuda.cuh"

namespace lowbit::ops_detail {

using namespace ops_cuda;

namespace {

constexpr int kThreads = 256;

// out [n] = a + b (fp32 add, one rounding for bf16); the first n8 · 8 elements as vectors.
template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n, int64_t n8) {
  pdl::grid_sync();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = tid; i < n8; i += stride) {
    float x[8], y[8];
    load8_rw(a + 8 * i, x);
    load8_rw(b + 8 * i, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = __fadd_rn(x[k], y[k]);
    store8(out + 8 * i, x);
  }
  for (int64_t i = 8 * n8 + tid; i < n; i += stride) {
    store1(out + i, __fadd_rn(load1(a + i), load1(b + i)));
  }
}

// dst [n] = src converted (TO and TI differ: bf16 ← f32 RN, f32 ← bf16 exact).
template <typename TO, typename TI>
__global__ void convert_kernel(TO* __restrict__ dst, const TI* __restrict__ src, int64_t n,
                               int64_t n8) {
  pdl::grid_sync();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = tid; i < n8; i += stride) {
    float v[8];
    load8(src + 8 * i, v);
    store8(dst + 8 * i, v);
  }
  for (int64_t i = 8 * n8 + tid; i < n; i += stride) store1(dst + i, load1(src + i));
}

int grid_for(int64_t items) {
  return int(std::min<int64_t>(std::max<int64_t>(ceil_div(items, kThreads), 1), int64_t(1) << 20));
}

}  // namespace

void add_cuda(Context& ctx, const TensorView& out, const TensorView& a, const TensorView& b) {
  const int64_t n = out.numel();
  const bool vec = aligned16(out.data) && aligned16(a.data) && aligned16(b.data);
  const int64_t n8 = vec ? n / 8 : 0;
  const int grid = grid_for(n8 > 0 ? n8 : n);
  if (out.dtype == DType::kF32) {
    pdl::launch(add_kernel<float>, grid, kThreads, 0, ctx.stream(), out.ptr<float>(),
                a.ptr<const float>(), b.ptr<const float>(), n, n8);
  } else {
    pdl::launch(add_kernel<uint16_t>, grid, kThreads, 0, ctx.stream(), out.ptr<uint16_t>(),
                a.ptr<const uint16_t>(), b.ptr<const uint16_t>(), n, n8);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void convert_cuda(Context& ctx, const TensorView& dst, const TensorView& src) {
  const int64_t n = dst.numel();
  cudaStream_t s = ctx.stream();
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data) {
      LOWBIT_CUDA_CHECK(
          cudaMemcpyAsync(dst.data, src.data, size_t(dst.nbytes()), cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  const bool vec = aligned16(dst.data) && aligned16(src.data);
  const int64_t n8 = vec ? n / 8 : 0;
  const int grid = grid_for(n8 > 0 ? n8 : n);
  if (dst.dtype == DType::kBF16) {
    pdl::launch(convert_kernel<uint16_t, float>, grid, kThreads, 0, s, dst.ptr<uint16_t>(),
                src.ptr<const float>(), n, n8);
  } else {
    pdl::launch(convert_kernel<float, uint16_t>, grid, kThreads, 0, s, dst.ptr<float>(),
                src.ptr<const uint16_t>(), n, n8);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

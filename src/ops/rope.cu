// CUDA rotary position embedding: one thread per VEC pairs (x[i], x[i + Dh/2]) of one head
// vector, VEC = 8 (16-byte loads of both halves, 64 bytes of the (cos, sin) table) when Dh/2 and
// the strides are multiples of 8 and the views 16-byte aligned, else 1. Each thread reads its
// elements before writing them, so y may be x itself (no __restrict__ on them).
#include "lowbit/core/cuda_check.h"
#include "ops/ops_cuda.cuh"
#include "ops/rope_impl.h"

namespace lowbit::ops_detail {

using namespace ops_cuda;

namespace {

constexpr int kThreads = 256;

struct HeadStrides {
  int64_t b, t, h;  // elements
};

// y, x [B, T, nH, Dh] bf16 (strided), table [T', Dh/2, 2] f32; sign +1 rotates, −1 rotates back.
template <int VEC>
__global__ void rope_kernel(uint16_t* y, const uint16_t* x, const float* __restrict__ table,
                            int64_t nt, int64_t nh, int64_t half, HeadStrides ys, HeadStrides xs,
                            int64_t total, float sign) {
  const int64_t chunks = half / VEC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = (i % chunks) * VEC;  // first pair of this thread
    const int64_t hv = i / chunks;         // head vector: (b·T + t)·nH + h
    const int64_t h = hv % nh, bt = hv / nh, t = bt % nt, b = bt / nt;
    const uint16_t* xp = x + b * xs.b + t * xs.t + h * xs.h + j;
    uint16_t* yp = y + b * ys.b + t * ys.t + h * ys.h + j;
    const float* cs = table + (t * half + j) * 2;  // [VEC, 2]
    float lo[VEC], hi[VEC], c[2 * VEC], ylo[VEC], yhi[VEC];
    if constexpr (VEC == 8) {
      load8_rw(xp, lo);
      load8_rw(xp + half, hi);
      load8(cs, c);
      load8(cs + 8, c + 8);
    } else {
      lo[0] = load1(xp);
      hi[0] = load1(xp + half);
      c[0] = __ldg(cs);
      c[1] = __ldg(cs + 1);
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      rope_rotate(lo[k], hi[k], c[2 * k], sign * c[2 * k + 1], ylo[k], yhi[k]);
    if constexpr (VEC == 8) {
      store8(yp, ylo);
      store8(yp + half, yhi);
    } else {
      store1(yp, ylo[0]);
      store1(yp + half, yhi[0]);
    }
  }
}

}  // namespace

void rope_apply_cuda(Context& ctx, const TensorView& y, const TensorView& x,
                     const TensorView& table, float sign) {
  const int64_t nb = x.size(0), nt = x.size(1), nh = x.size(2), half = x.size(3) / 2;
  const HeadStrides xs{x.strides[0], x.strides[1], x.strides[2]};
  const HeadStrides ys{y.strides[0], y.strides[1], y.strides[2]};
  uint16_t* yp = y.ptr<uint16_t>();
  const uint16_t* xp = x.ptr<const uint16_t>();
  const float* tab = table.ptr<const float>();
  bool vec = half % 8 == 0 && aligned16(yp) && aligned16(xp) && aligned16(tab);
  for (int64_t s : {xs.b, xs.t, xs.h, ys.b, ys.t, ys.h}) vec = vec && s % 8 == 0;
  const int64_t heads = nb * nt * nh;
  cudaStream_t st = ctx.stream();
  if (vec) {
    const int64_t total = heads * (half / 8);
    const int grid = int(std::min<int64_t>(ceil_div(total, kThreads), int64_t(1) << 20));
    rope_kernel<8><<<grid, kThreads, 0, st>>>(yp, xp, tab, nt, nh, half, ys, xs, total, sign);
  } else {
    const int64_t total = heads * half;
    const int grid = int(std::min<int64_t>(ceil_div(total, kThreads), int64_t(1) << 20));
    rope_kernel<1><<<grid, kThreads, 0, st>>>(yp, xp, tab, nt, nh, half, ys, xs, total, sign);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

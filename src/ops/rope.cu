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
// Idx: the type of the thread-index arithmetic — uint32_t when the whole index space fits (the
// 64-bit divisions otherwise dominate this memory-bound kernel's instruction count).
template <int VEC, typename Idx>
__global__ void rope_kernel(uint16_t* y, const uint16_t* x, const float* __restrict__ table, Idx nt,
                            Idx nh, Idx half, HeadStrides ys, HeadStrides xs, Idx total,
                            float sign) {
  const Idx chunks = half / VEC;
  for (Idx i = blockIdx.x * Idx(blockDim.x) + threadIdx.x; i < total;
       i += Idx(gridDim.x) * blockDim.x) {
    const Idx j = (i % chunks) * VEC;  // first pair of this thread
    const Idx hv = i / chunks;         // head vector: (b·T + t)·nH + h
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
  const int v = vec ? 8 : 1;
  const int64_t total = heads * (half / v);
  const int grid = int(std::min<int64_t>(ceil_div(total, kThreads), int64_t(1) << 20));
  // 32-bit index math while the index space (plus one grid stride) fits.
  const bool narrow = total + int64_t(grid) * kThreads < (int64_t(1) << 32);
  if (vec && narrow) {
    rope_kernel<8, uint32_t><<<grid, kThreads, 0, st>>>(
        yp, xp, tab, uint32_t(nt), uint32_t(nh), uint32_t(half), ys, xs, uint32_t(total), sign);
  } else if (vec) {
    rope_kernel<8, int64_t>
        <<<grid, kThreads, 0, st>>>(yp, xp, tab, nt, nh, half, ys, xs, total, sign);
  } else if (narrow) {
    rope_kernel<1, uint32_t><<<grid, kThreads, 0, st>>>(
        yp, xp, tab, uint32_t(nt), uint32_t(nh), uint32_t(half), ys, xs, uint32_t(total), sign);
  } else {
    rope_kernel<1, int64_t>
        <<<grid, kThreads, 0, st>>>(yp, xp, tab, nt, nh, half, ys, xs, total, sign);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

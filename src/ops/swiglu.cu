// CUDA SwiGLU: one thread per 8 columns of a row (16-byte loads of gate, up and dout, 16-byte
// stores) when F % 8 == 0 and the rows are aligned, else one thread per column. The per-element
// math is swiglu_impl.h, shared with the CPU twin.
#include "lowbit/core/cuda_check.h"
#include "ops/ops_cuda.cuh"
#include "ops/swiglu_impl.h"

namespace lowbit::ops_detail {

using namespace ops_cuda;

namespace {

constexpr int kThreads = 256;

// out [N, F] = silu(gate_up[:, :F]) · gate_up[:, F:].
template <int VEC>
__global__ void swiglu_fwd_kernel(uint16_t* __restrict__ out, const uint16_t* __restrict__ gate_up,
                                  int64_t f, int64_t total) {
  const int64_t per_row = f / VEC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_row, c = (i - n * per_row) * VEC;
    const uint16_t* gp = gate_up + n * 2 * f + c;
    if constexpr (VEC == 8) {
      float g[8], u[8], o[8];
      load8(gp, g);
      load8(gp + f, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = swiglu_out(g[k], u[k]);
      store8(out + n * f + c, o);
    } else {
      store1(out + n * f + c, swiglu_out(load1(gp), load1(gp + f)));
    }
  }
}

// dgate_up [N, 2F] from dout [N, F] and gate_up [N, 2F].
template <int VEC>
__global__ void swiglu_bwd_kernel(uint16_t* __restrict__ dgate_up,
                                  const uint16_t* __restrict__ dout,
                                  const uint16_t* __restrict__ gate_up, int64_t f, int64_t total) {
  const int64_t per_row = f / VEC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_row, c = (i - n * per_row) * VEC;
    const uint16_t* gp = gate_up + n * 2 * f + c;
    uint16_t* dp = dgate_up + n * 2 * f + c;
    if constexpr (VEC == 8) {
      float g[8], u[8], dy[8], dg[8], du[8];
      load8(gp, g);
      load8(gp + f, u);
      load8(dout + n * f + c, dy);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const SwigluGrad r = swiglu_grad(g[k], u[k], dy[k]);
        dg[k] = r.dg;
        du[k] = r.du;
      }
      store8(dp, dg);
      store8(dp + f, du);
    } else {
      const SwigluGrad r = swiglu_grad(load1(gp), load1(gp + f), load1(dout + n * f + c));
      store1(dp, r.dg);
      store1(dp + f, r.du);
    }
  }
}

int grid_for(int64_t items) {
  return int(std::min<int64_t>(ceil_div(items, kThreads), int64_t(1) << 20));
}

}  // namespace

void swiglu_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& gate_up) {
  const int64_t n = out.size(0), f = out.size(1);
  uint16_t* o = out.ptr<uint16_t>();
  const uint16_t* gu = gate_up.ptr<const uint16_t>();
  const bool vec = f % 8 == 0 && aligned16(o) && aligned16(gu);
  if (vec) {
    const int64_t total = n * f / 8;
    swiglu_fwd_kernel<8><<<grid_for(total), kThreads, 0, ctx.stream()>>>(o, gu, f, total);
  } else {
    swiglu_fwd_kernel<1><<<grid_for(n * f), kThreads, 0, ctx.stream()>>>(o, gu, f, n * f);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void swiglu_bwd_cuda(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                     const TensorView& gate_up) {
  const int64_t n = dout.size(0), f = dout.size(1);
  uint16_t* dgu = dgate_up.ptr<uint16_t>();
  const uint16_t* dy = dout.ptr<const uint16_t>();
  const uint16_t* gu = gate_up.ptr<const uint16_t>();
  const bool vec = f % 8 == 0 && aligned16(dgu) && aligned16(dy) && aligned16(gu);
  if (vec) {
    const int64_t total = n * f / 8;
    swiglu_bwd_kernel<8><<<grid_for(total), kThreads, 0, ctx.stream()>>>(dgu, dy, gu, f, total);
  } else {
    swiglu_bwd_kernel<1><<<grid_for(n * f), kThreads, 0, ctx.stream()>>>(dgu, dy, gu, f, n * f);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

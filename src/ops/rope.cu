// CUDA rotary position embedding: one thread per VEC pairs (x[i], x[i + Dh/2]) of one head
// vector, VEC = 8 (16-byte loads of both halves, 64 bytes of the (cos, sin) table) when Dh/2 and
// the strides are multiples of 8 and the views 16-byte aligned, else 1. Each thread reads its
// elements before writing them, so y may be x itself (no __restrict__ on them).
#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "ops/ops_cuda.cuh"
#include "ops/quant_epilogue.cuh"
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
  pdl::grid_sync();
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

// ---- backward fused with per-tensor FP8 quantization (delayed scaling) -------------------------
//
// One block per tile of kRopeRows rows (tokens) × kRopeHeads consecutive heads of dy [N, nH·Dh]
// (N = B·T): thread (r, j) takes row r and the pairs j·8 … j·8 + 7 of each of the block's heads,
// rotates them back where the head is one of the first n_rot (rope_kernel's arithmetic, sign −1),
// and hands both halves to the FP8 epilogue: bf16 rounding (stored to dx when asked), amax,
// rowwise codes to q, columnwise codes staged in shared memory and written transposed
// (store_transposed) at the end. A group of heads per block: the row's cos/sin (16 floats per
// thread, twice the bytes of its dy) are read once for all of them, the dy of every head is in
// flight at once, and the epilogue's barriers and amax atomics are paid once per group. (One head
// per block: 77–78 % of copy on an H100 at the 124m/1b shapes, 18–25k blocks.)
constexpr int kRopeRows = 32;
constexpr int kRopeHeads = 4;

template <bool kCol>
__global__ void __launch_bounds__(512)
    rope_bwd_fp8_kernel(uint16_t* dx, const uint16_t* dy, const float* __restrict__ table,
                        int64_t n_rows, int64_t t_len, int nh, int n_rot, int dh, bool vec_t,
                        ops_detail::Fp8Epilogue ep) {
  pdl::grid_sync();
  extern __shared__ __align__(16) uint8_t tile[];  // [kRopeHeads][kRopeRows][dh + 4] codes (kCol)
  const int pitch = dh + 4;                        // ≡ 4 (mod 8): see store_transposed
  const int half = dh / 2, chunks = half / 8;
  const int r = threadIdx.x / chunks, j = (threadIdx.x % chunks) * 8;
  const int h0 = blockIdx.y * kRopeHeads, heads = min(kRopeHeads, nh - h0);
  const int64_t n0 = int64_t(blockIdx.x) * kRopeRows, n = n0 + r;
  const int64_t width = int64_t(nh) * dh;
  const float scale = *ep.scale;
  float local_amax = 0.0f;
  if (n < n_rows) {
    const int64_t at0 = n * width + int64_t(h0) * dh + j;  // element (n, h0, j)
    // Every head's two 16-byte halves loaded before any is used (raw bf16 pairs: 4 registers
    // per 8 elements). dy may alias dx: each element is read and written by this thread only.
    uint4 raw_lo[kRopeHeads], raw_hi[kRopeHeads];
#pragma unroll
    for (int u = 0; u < kRopeHeads; ++u) {
      if (u < heads) {
        raw_lo[u] = *reinterpret_cast<const uint4*>(dy + at0 + u * dh);
        raw_hi[u] = *reinterpret_cast<const uint4*>(dy + at0 + u * dh + half);
      }
    }
    float c[16];  // [8, 2] (cos, sin) of the row's pairs j … j + 7, when a head is rotated
    if (h0 < n_rot) {
      const float* cs = table + ((n % t_len) * half + j) * 2;
      load8(cs, c);
      load8(cs + 8, c + 8);
    }
#pragma unroll
    for (int u = 0; u < kRopeHeads; ++u) {
      if (u >= heads) continue;
      const int64_t at = at0 + u * dh;
      float lo[8], hi[8];
      const uint32_t wl[4] = {raw_lo[u].x, raw_lo[u].y, raw_lo[u].z, raw_lo[u].w};
      const uint32_t wh[4] = {raw_hi[u].x, raw_hi[u].y, raw_hi[u].z, raw_hi[u].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[2 * i] = __uint_as_float(wl[i] << 16);
        lo[2 * i + 1] = __uint_as_float(wl[i] & 0xFFFF0000u);
        hi[2 * i] = __uint_as_float(wh[i] << 16);
        hi[2 * i + 1] = __uint_as_float(wh[i] & 0xFFFF0000u);
      }
      if (h0 + u < n_rot) {
        float ylo[8], yhi[8];
#pragma unroll
        for (int k = 0; k < 8; ++k)
          rope_rotate(lo[k], hi[k], c[2 * k], -c[2 * k + 1], ylo[k], yhi[k]);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          lo[k] = ylo[k];
          hi[k] = yhi[k];
        }
      }
      uint8_t* const tu = tile + (u * kRopeRows + r) * pitch + j;
      fp8_epilogue_chunk8<kCol>(lo, scale, ep.e5m2, dx != nullptr ? dx + at : nullptr,
                                ep.q != nullptr ? ep.q + at : nullptr, tu, local_amax);
      fp8_epilogue_chunk8<kCol>(hi, scale, ep.e5m2, dx != nullptr ? dx + at + half : nullptr,
                                ep.q != nullptr ? ep.q + at + half : nullptr, tu + half,
                                local_amax);
    }
  }
  if constexpr (kCol) {
    __syncthreads();  // every head's tile is staged
    for (int u = 0; u < heads; ++u) {
      store_transposed<kRopeRows>(ep.qt, tile + u * kRopeRows * pitch, pitch, n0, n_rows,
                                  int64_t(h0 + u) * dh, dh, vec_t);
    }
  }
  fp8_epilogue_finish(local_amax, scale, ep);
}

}  // namespace

bool rope_bwd_quantize_cuda(Context& ctx, const TensorView& dx, const TensorView& dy, int64_t n_rot,
                            const TensorView& table, const QuantConfig& cfg, QuantizedTensor& out) {
  const int64_t nb = dy.size(0), nt = dy.size(1), nh = dy.size(2), dh = dy.size(3);
  const int64_t n = nb * nt;
  uint16_t* dxp = absent(dx) ? nullptr : dx.ptr<uint16_t>();
  const uint16_t* dyp = dy.ptr<const uint16_t>();
  const float* tab = table.ptr<const float>();
  // Preconditions (else the caller runs the composition): 16-byte vectors of 8 pairs, at most
  // 512 threads per block, the grid's head dimension.
  if (dh % 16 != 0 || dh > 256 || ceil_div(nh, kRopeHeads) > 65535 || !aligned16(dyp) ||
      !aligned16(tab) || (dxp != nullptr && !aligned16(dxp))) {
    return false;
  }
  const Fp8Epilogue ep = fp8_epilogue_outputs(ctx, cfg, n, nh * dh, out);
  const bool col = cfg.columnwise;
  const size_t smem = col ? size_t(kRopeHeads) * kRopeRows * size_t(dh + 4) : 0;
  const bool vec_t = n % 16 == 0 && aligned16(ep.qt);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kRopeRows)),
                  static_cast<unsigned>(ceil_div(nh, kRopeHeads)));
  const int threads = int(kRopeRows * (dh / 16));
  cudaStream_t s = ctx.stream();
  if (col) {
    pdl::launch(rope_bwd_fp8_kernel<true>, grid, threads, smem, s, dxp, dyp, tab, n, nt, int(nh),
                int(n_rot), int(dh), vec_t, ep);
  } else {
    pdl::launch(rope_bwd_fp8_kernel<false>, grid, threads, smem, s, dxp, dyp, tab, n, nt, int(nh),
                int(n_rot), int(dh), vec_t, ep);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  return true;
}

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
    pdl::launch(rope_kernel<8, uint32_t>, grid, kThreads, 0, st, yp, xp, tab, uint32_t(nt),
                uint32_t(nh), uint32_t(half), ys, xs, uint32_t(total), sign);
  } else if (vec) {
    pdl::launch(rope_kernel<8, int64_t>, grid, kThreads, 0, st, yp, xp, tab, nt, nh, half, ys, xs,
                total, sign);
  } else if (narrow) {
    pdl::launch(rope_kernel<1, uint32_t>, grid, kThreads, 0, st, yp, xp, tab, uint32_t(nt),
                uint32_t(nh), uint32_t(half), ys, xs, uint32_t(total), sign);
  } else {
    pdl::launch(rope_kernel<1, int64_t>, grid, kThreads, 0, st, yp, xp, tab, nt, nh, half, ys, xs,
                total, sign);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

// CUDA SwiGLU: one thread per 8 columns of a row (16-byte loads of gate, up and dout, 16-byte
// stores) when F % 8 == 0 and the rows are aligned, else one thread per column. The per-element
// math is swiglu_impl.h, shared with the CPU twin.
#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "ops/ops_cuda.cuh"
#include "ops/quant_epilogue.cuh"
#include "ops/swiglu_impl.h"

namespace lowbit::ops_detail {

using namespace ops_cuda;

namespace {

constexpr int kThreads = 256;

// out [N, F] = silu(gate_up[:, :F]) · gate_up[:, F:].
template <int VEC>
__global__ void swiglu_fwd_kernel(uint16_t* __restrict__ out, const uint16_t* __restrict__ gate_up,
                                  int64_t f, int64_t total) {
  pdl::grid_sync();
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
  pdl::grid_sync();
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

// ---- forward fused with per-tensor FP8 quantization (delayed scaling) --------------------------
//
// One block per tile of kTM rows × kTK columns of h, as the per-tensor cast of
// src/quant/fp8_kernels.cu: each thread computes kChunks chunks of 8 columns (all loads of gate
// and up issued first), rounds h to bf16 exactly as swiglu_fwd_kernel stores it, quantizes that
// bf16 value, writes the rowwise codes (and h when asked) and stages the codes in shared memory;
// the tile is then written transposed (store_transposed). blockIdx.x walks the rows, so
// consecutive blocks write adjacent sectors of the same transposed rows.
constexpr int kTM = 64, kTK = 128;

// h [N, F] bf16 (or null) and ep's q [N, F] / qt [F, N] FP8, scale_inv and amax from
// gate_up [N, 2F] bf16. F % 8 == 0 and rows 16-byte aligned. vec_t: N % 16 == 0 and qt 16-byte
// aligned.
template <bool kCol>
__global__ void __launch_bounds__(kThreads)
    swiglu_fwd_fp8_kernel(uint16_t* __restrict__ h, const uint16_t* __restrict__ gate_up,
                          int64_t n_rows, int64_t f, bool vec_t, ops_detail::Fp8Epilogue ep) {
  pdl::grid_sync();
  constexpr int kPitch = kTK + 4;                       // ≡ 4 (mod 8): see store_transposed
  __shared__ __align__(16) uint8_t tile[kTM * kPitch];  // [kTM][kTK + 4] codes (kCol only)
  constexpr int kChunks = kTM * kTK / 8 / kThreads;
  const int64_t m0 = int64_t(blockIdx.x) * kTM, k0 = int64_t(blockIdx.y) * kTK;
  const float scale = *ep.scale;
  uint4 graw[kChunks], uraw[kChunks];  // 8 bf16 of gate and of up per chunk
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kTK / 8), cc = (c % (kTK / 8)) * 8;
    const int64_t m = m0 + r, k = k0 + cc;
    if (m < n_rows && k < f) {  // F % 8 == 0: a chunk is entirely inside or outside the row
      const uint16_t* gp = gate_up + m * 2 * f + k;
      graw[j] = __ldg(reinterpret_cast<const uint4*>(gp));
      uraw[j] = __ldg(reinterpret_cast<const uint4*>(gp + f));
    } else {
      graw[j] = make_uint4(0, 0, 0, 0);
      uraw[j] = make_uint4(0, 0, 0, 0);
    }
  }
  float local_amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kTK / 8), cc = (c % (kTK / 8)) * 8;
    const int64_t m = m0 + r, k = k0 + cc;
    if (m >= n_rows || k >= f) continue;
    const uint32_t gw[4] = {graw[j].x, graw[j].y, graw[j].z, graw[j].w};
    const uint32_t uw[4] = {uraw[j].x, uraw[j].y, uraw[j].z, uraw[j].w};
    float hf[8];  // h as swiglu_fwd computes it, before its rounding to bf16
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      hf[2 * i] = swiglu_out(__uint_as_float(gw[i] << 16), __uint_as_float(uw[i] << 16));
      hf[2 * i + 1] =
          swiglu_out(__uint_as_float(gw[i] & 0xFFFF0000u), __uint_as_float(uw[i] & 0xFFFF0000u));
    }
    fp8_epilogue_chunk8<kCol>(hf, scale, ep.e5m2, h != nullptr ? h + m * f + k : nullptr,
                              ep.q != nullptr ? ep.q + m * f + k : nullptr, tile + r * kPitch + cc,
                              local_amax);
  }
  if constexpr (kCol) {
    __syncthreads();  // the whole tile is staged
    const int cols = int(f - k0 < kTK ? f - k0 : kTK);
    store_transposed<kTM>(ep.qt, tile, kPitch, m0, n_rows, k0, cols, vec_t);
  }
  fp8_epilogue_finish(local_amax, scale, ep);
}

// ---- backward fused with per-tensor FP8 quantization (delayed scaling) -------------------------
//
// One block per tile of kBwdRows rows × kTK columns of F: it produces the matching tiles of dgate
// (output columns k0 .. k0 + kTK) and of dup (columns F + k0 ..), each value rounded to bf16
// exactly as swiglu_bwd_kernel stores it and quantized from that bf16 value. Rowwise codes (and
// dgate_up when asked) are written directly; the two code tiles are staged and written
// transposed (rows k and F + k of qt [2F, N]).
//
// kH: the block also remakes the forward's h = silu(gate)·up from the gate and up it has loaded
// (one sigmoid serves both) and quantizes it under its own state (hep: the down linear's input),
// the bytes swiglu_fwd_fp8_kernel writes: its columnwise copy [F, N] (and rowwise codes when
// hep.q is set). The down linear's wgrad then needs no separate pass over gate_up.
//
// dgate_up [N, 2F] bf16 (or null) and ep's q [N, 2F] / qt [2F, N] FP8, scale_inv and amax from
// dout [N, F] and gate_up [N, 2F] bf16; with kH also hep's qt [F, N] (and q [N, F]). F % 8 == 0
// and rows 16-byte aligned. vec_t: N % 16 == 0 and qt (and hep.qt) 16-byte aligned.
//
// Tiles of 32 rows (a 32-byte sector per transposed row and tile): 52-64 registers, 4 blocks
// (32 warps) per SM for the issue-bound math, and a short last wave. With 64-row tiles the kernel
// held 96-102 registers at 2 blocks per SM (at 3 per SM the kH kernel spilled): at N 16384 it
// ran 0.160 ms
// against 0.1445 (F 2048) and 0.614 against 0.563 ms (F 8192) on the H100 (same-call A/B,
// bench/results/h100-2026-11-26/).
constexpr int kBwdRows = 32;
constexpr int kBwdMinBlocks = 4;

// The loads of one tile: 8 bf16 of gate, up and dout per chunk, kChunks chunks per thread.
template <int kRows>
struct BwdRaw {
  static_assert(kRows * kTK / 8 % kThreads == 0, "whole 8-column chunks per thread");
  static constexpr int kChunks = kRows * kTK / 8 / kThreads;
  uint4 g[kChunks], u[kChunks], d[kChunks];
};

// Issues the loads of the tile at rows m0.., columns k0.. of dout [N, F] and gate_up [N, 2F]
// (chunks outside the tensor are zeros).
template <int kRows>
__device__ __forceinline__ void bwd_load(BwdRaw<kRows>& raw, const uint16_t* __restrict__ dout,
                                         const uint16_t* __restrict__ gate_up, int64_t n_rows,
                                         int64_t f, int64_t m0, int64_t k0) {
#pragma unroll
  for (int j = 0; j < BwdRaw<kRows>::kChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kTK / 8), cc = (c % (kTK / 8)) * 8;
    const int64_t m = m0 + r, k = k0 + cc;
    if (m < n_rows && k < f) {  // F % 8 == 0: a chunk is entirely inside or outside the row
      const uint16_t* gp = gate_up + m * 2 * f + k;
      raw.g[j] = __ldg(reinterpret_cast<const uint4*>(gp));
      raw.u[j] = __ldg(reinterpret_cast<const uint4*>(gp + f));
      raw.d[j] = __ldg(reinterpret_cast<const uint4*>(dout + m * f + k));
    } else {
      raw.g[j] = raw.u[j] = raw.d[j] = make_uint4(0, 0, 0, 0);
    }
  }
}

// The tile's math, each value as swiglu_bwd_kernel (and, for h, swiglu_fwd_fp8_kernel) computes
// it: dgate_up [N, 2F] (or null) and the rowwise codes
// written, the codes staged in tiles [dgate, dup, h][kRows][kTK + 4], the amaxes folded into
// amax and h_amax.
template <bool kCol, bool kH, int kRows>
__device__ __forceinline__ void bwd_math(const BwdRaw<kRows>& raw,
                                         uint8_t (*tiles)[kRows * (kTK + 4)],
                                         uint16_t* __restrict__ dgate_up, int64_t n_rows, int64_t f,
                                         int64_t m0, int64_t k0, const Fp8Epilogue& ep,
                                         const Fp8Epilogue& hep, float scale, float h_scale,
                                         float& amax, float& h_amax) {
  constexpr int kPitch = kTK + 4;
  constexpr int kTiles = kH ? 3 : 2;
#pragma unroll
  for (int j = 0; j < BwdRaw<kRows>::kChunks; ++j) {
    const int c = threadIdx.x + j * kThreads;
    const int r = c / (kTK / 8), cc = (c % (kTK / 8)) * 8;
    const int64_t m = m0 + r, k = k0 + cc;
    if (m >= n_rows || k >= f) continue;
    const uint32_t gw[4] = {raw.g[j].x, raw.g[j].y, raw.g[j].z, raw.g[j].w};
    const uint32_t uw[4] = {raw.u[j].x, raw.u[j].y, raw.u[j].z, raw.u[j].w};
    const uint32_t dw[4] = {raw.d[j].x, raw.d[j].y, raw.d[j].z, raw.d[j].w};
    float gf[8], uf[8], hf[8];  // dgate, dup and h as the unfused ops compute them, unrounded
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const auto bf = [half](uint32_t w) {
          return __uint_as_float(half == 0 ? w << 16 : w & 0xFFFF0000u);
        };
        const float g = bf(gw[i]), u = bf(uw[i]);
        const float s = swiglu_sigmoid(g);
        const SwigluGrad d = swiglu_grad_from_sigmoid(g, u, bf(dw[i]), s);
        gf[2 * i + half] = d.dg;
        uf[2 * i + half] = d.du;
        if constexpr (kH) hf[2 * i + half] = swiglu_out_from_sigmoid(g, u, s);
      }
    }
    uint16_t* dp = dgate_up != nullptr ? dgate_up + m * 2 * f + k : nullptr;
    uint8_t* qp = ep.q != nullptr ? ep.q + m * 2 * f + k : nullptr;
    fp8_epilogue_chunk8<kCol>(gf, scale, ep.e5m2, dp, qp, tiles[0] + r * kPitch + cc, amax);
    fp8_epilogue_chunk8<kCol>(uf, scale, ep.e5m2, dp != nullptr ? dp + f : nullptr,
                              qp != nullptr ? qp + f : nullptr, tiles[1] + r * kPitch + cc, amax);
    if constexpr (kH) {
      fp8_epilogue_chunk8<true>(hf, h_scale, hep.e5m2, nullptr,
                                hep.q != nullptr ? hep.q + m * f + k : nullptr,
                                tiles[kTiles - 1] + r * kPitch + cc, h_amax);
    }
  }
}

// The staged tiles [dgate, dup, h][kRows][kTK + 4] written transposed: dgate and dup to rows
// k0.. and F + k0.. of ep.qt [2F, N] (kCol), h to rows k0.. of hep.qt [F, N] (kH). The stored
// tiles' tasks are spread over the block (each starts `tasks` threads after the previous one,
// mod kThreads), so no thread takes more than ceil(stored · tasks / kThreads). Call after a
// barrier.
template <bool kCol, bool kH, int kRows>
__device__ __forceinline__ void bwd_store_tiles(const uint8_t (*tiles)[kRows * (kTK + 4)],
                                                int64_t n_rows, int64_t f, int64_t m0, int64_t k0,
                                                bool vec_t, const Fp8Epilogue& ep,
                                                const Fp8Epilogue& hep) {
  constexpr int kPitch = kTK + 4;
  constexpr int kTiles = kH ? 3 : 2;
  const int cols = int(f - k0 < kTK ? f - k0 : kTK);
  const int shift = ((cols + 3) / 4) * (kRows / 16) % kThreads;  // even: keeps the lane pairs
  int first = int(threadIdx.x);
  const auto next = [&] { first = first >= shift ? first - shift : first - shift + kThreads; };
  if constexpr (kCol) {
    store_transposed<kRows>(ep.qt, tiles[0], kPitch, m0, n_rows, k0, cols, vec_t, first);
    next();
    store_transposed<kRows>(ep.qt, tiles[1], kPitch, m0, n_rows, f + k0, cols, vec_t, first);
    next();
  }
  if constexpr (kH) {
    store_transposed<kRows>(hep.qt, tiles[kTiles - 1], kPitch, m0, n_rows, k0, cols, vec_t, first);
  }
}

// One block per tile (blockIdx.x the row tile, blockIdx.y the column tile). Arguments: see the
// section comment above.
template <bool kCol, bool kH>
__global__ void __launch_bounds__(kThreads, kBwdMinBlocks)
    swiglu_bwd_fp8_kernel(uint16_t* __restrict__ dgate_up, const uint16_t* __restrict__ dout,
                          const uint16_t* __restrict__ gate_up, int64_t n_rows, int64_t f,
                          bool vec_t, ops_detail::Fp8Epilogue ep, ops_detail::Fp8Epilogue hep) {
  pdl::grid_sync();
  // [dgate, dup, h][kBwdRows][kTK + 4] codes (dgate and dup when kCol, h when kH).
  __shared__ __align__(16) uint8_t tiles[kH ? 3 : 2][kBwdRows * (kTK + 4)];
  const float scale = *ep.scale;
  const float h_scale = kH ? *hep.scale : 0.0f;
  float amax = 0.0f, h_amax = 0.0f;
  const int64_t m0 = int64_t(blockIdx.x) * kBwdRows, k0 = int64_t(blockIdx.y) * kTK;
  BwdRaw<kBwdRows> raw;
  bwd_load(raw, dout, gate_up, n_rows, f, m0, k0);
  bwd_math<kCol, kH>(raw, tiles, dgate_up, n_rows, f, m0, k0, ep, hep, scale, h_scale, amax,
                     h_amax);
  if constexpr (kCol || kH) {
    __syncthreads();  // the tiles are staged
    bwd_store_tiles<kCol, kH, kBwdRows>(tiles, n_rows, f, m0, k0, vec_t, ep, hep);
  }
  fp8_epilogue_finish(amax, scale, ep);
  if constexpr (kH) fp8_epilogue_finish(h_amax, h_scale, hep);
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
    pdl::launch(swiglu_fwd_kernel<8>, grid_for(total), kThreads, 0, ctx.stream(), o, gu, f, total);
  } else {
    pdl::launch(swiglu_fwd_kernel<1>, grid_for(n * f), kThreads, 0, ctx.stream(), o, gu, f, n * f);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

bool swiglu_fwd_quantize_cuda(Context& ctx, const TensorView& h, const TensorView& gate_up,
                              const QuantConfig& cfg, QuantizedTensor& out) {
  const int64_t n = gate_up.size(0), f = gate_up.size(1) / 2;
  uint16_t* hp = absent(h) ? nullptr : h.ptr<uint16_t>();
  const uint16_t* gu = gate_up.ptr<const uint16_t>();
  // Preconditions of the fused kernel (else the caller runs the composition): whole 8-column
  // chunks with 16-byte aligned rows, and a grid that fits (F ≤ 65535 · 128).
  if (n == 0 || f % 8 != 0 || !aligned16(gu) || (hp != nullptr && !aligned16(hp))) return false;
  if (ceil_div(f, kTK) > 65535 || ceil_div(n, kTM) >= (int64_t(1) << 31)) return false;
  const Fp8Epilogue ep = fp8_epilogue_outputs(ctx, cfg, n, f, out);
  const bool vec_t = n % 16 == 0 && aligned16(ep.qt);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kTM)), static_cast<unsigned>(ceil_div(f, kTK)));
  if (cfg.columnwise) {
    pdl::launch(swiglu_fwd_fp8_kernel<true>, grid, kThreads, 0, ctx.stream(), hp, gu, n, f, vec_t,
                ep);
  } else {
    pdl::launch(swiglu_fwd_fp8_kernel<false>, grid, kThreads, 0, ctx.stream(), hp, gu, n, f, vec_t,
                ep);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  return true;
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
    pdl::launch(swiglu_bwd_kernel<8>, grid_for(total), kThreads, 0, ctx.stream(), dgu, dy, gu, f,
                total);
  } else {
    pdl::launch(swiglu_bwd_kernel<1>, grid_for(n * f), kThreads, 0, ctx.stream(), dgu, dy, gu, f,
                n * f);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

bool swiglu_bwd_quantize_cuda(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                              const TensorView& gate_up, const QuantConfig& cfg,
                              QuantizedTensor& out, const QuantConfig* h_cfg,
                              QuantizedTensor* h_out) {
  const int64_t n = dout.size(0), f = dout.size(1);
  uint16_t* dgu = absent(dgate_up) ? nullptr : dgate_up.ptr<uint16_t>();
  const uint16_t* dy = dout.ptr<const uint16_t>();
  const uint16_t* gu = gate_up.ptr<const uint16_t>();
  // Preconditions of the fused kernel (else the caller runs the composition): whole 8-column
  // chunks with 16-byte aligned rows, and a grid that fits; h only with its columnwise copy.
  if (n == 0 || f % 8 != 0 || !aligned16(gu) || !aligned16(dy) ||
      (dgu != nullptr && !aligned16(dgu))) {
    return false;
  }
  if (ceil_div(f, kTK) > 65535 || ceil_div(n, kBwdRows) >= (int64_t(1) << 31)) return false;
  const bool with_h = h_cfg != nullptr;
  if (with_h && !h_cfg->columnwise) return false;
  const Fp8Epilogue ep = fp8_epilogue_outputs(ctx, cfg, n, 2 * f, out);
  const Fp8Epilogue hep = with_h ? fp8_epilogue_outputs(ctx, *h_cfg, n, f, *h_out) : Fp8Epilogue{};
  const bool vec_t = n % 16 == 0 && (ep.qt == nullptr || aligned16(ep.qt)) &&
                     (hep.qt == nullptr || aligned16(hep.qt));
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kBwdRows)),
                  static_cast<unsigned>(ceil_div(f, kTK)));
  auto launch = [&](auto kernel) {
    pdl::launch(kernel, grid, kThreads, 0, ctx.stream(), dgu, dy, gu, n, f, vec_t, ep, hep);
  };
  switch ((cfg.columnwise ? 2 : 0) + (with_h ? 1 : 0)) {
    case 0: launch(swiglu_bwd_fp8_kernel<false, false>); break;
    case 1: launch(swiglu_bwd_fp8_kernel<false, true>); break;
    case 2: launch(swiglu_bwd_fp8_kernel<true, false>); break;
    default: launch(swiglu_bwd_fp8_kernel<true, true>); break;
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace lowbit::ops_detail

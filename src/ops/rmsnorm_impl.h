// Private to the ops layer: the two implementations behind rmsnorm_fwd / rmsnorm_bwd
// (include/lowbit/ops.h). Arguments have been validated by the dispatcher (rmsnorm.cpp).
#pragma once

#include "lowbit/core.h"
#include "lowbit/quant.h"

namespace lowbit::ops_detail {

// CPU twin (rmsnorm_ref.cpp); x, w, out, dout, dx bf16 or f32 (each independently).
// Forward, per row n: ms = Σ x² / D (sum in fp64, rounded to fp32), rstd = 1 / sqrt(ms + eps)
// (fp32), out = (x · rstd) · w (fp32, rounded once to out's dtype).
void rmsnorm_fwd_cpu(const TensorView& out, const TensorView& rstd, const TensorView& x,
                     const TensorView& w, float eps);
// Backward, per row: g = dout · w, mean = Σ g·x / D (fp64 sum), c = (mean · rstd) · rstd,
// dx = rstd · (g − x · c); dw += Σ_n (x · rstd) · dout (fp64 over rows, added once; written
// instead when !accumulate). residual: absent (TensorView()) or [N, D] added to dx (may alias it).
void rmsnorm_bwd_cpu(const TensorView& dx, const TensorView& dw, const TensorView& dout,
                     const TensorView& x, const TensorView& w, const TensorView& rstd,
                     const TensorView& residual, bool accumulate);

// rmsnorm_fwd_quantize by definition, on any device: rmsnorm_fwd into y (a scratch when y is
// absent), then quantize(y). The CPU path, and the GPU path wherever the fused kernel does not
// apply (rmsnorm_ref.cpp).
void rmsnorm_fwd_quantize_composed(Context& ctx, const TensorView& y, const TensorView& rstd,
                                   const TensorView& x, const TensorView& w, float eps,
                                   const QuantConfig& cfg, QuantizedTensor& out);

// Kernel choice of the fused RMSNorm + FP8 ops (rmsnorm_fwd_quantize_cuda,
// rmsnorm_bwd_quantize_cuda), for tests and A/B timing; the public ops run kAuto. Every choice
// gives the same bytes.
enum class RmsNormFp8Kernel {
  kAuto,       // what the public ops run: forward, the warp ring where a block of it keeps 16
               // or more warps per SM resident, else the group ring; backward, the group ring
               // (each where its shared memory fits, else the register kernel)
  kRegisters,  // a group's next row(s) prefetched in registers (forward: one row ahead, one
               // tile of kQRows rows per block; backward: two rows ahead)
  kGroupRing,  // rows streamed through a shared-memory ring per group of warps, as many
               // blocks as are resident (forward) / the backward's row partition
  kWarpRing,   // forward only: one warp per row, rows streamed through a ring per warp
};
struct RmsNormFp8Config {
  RmsNormFp8Kernel kernel = RmsNormFp8Kernel::kAuto;
  // Ring kernels: rows in flight per group or warp (slots of its ring), 1–4; 0 picks them. The
  // group ring takes fewer where its block's shared memory would not hold them.
  int stages = 0;
  // When not null, receives the kernel that ran (a forced ring kernel whose shared memory does
  // not fit falls back to the next one: kWarpRing → kGroupRing → kRegisters).
  RmsNormFp8Kernel* ran = nullptr;
};

// CUDA (rmsnorm.cu), bf16 tensors, on ctx.stream(); the same formulas with fp32 sums.
void rmsnorm_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& rstd,
                      const TensorView& x, const TensorView& w, float eps);
// Fused forward + per-tensor FP8 with delayed scaling (cfg passed fp8_delayed_fusable; y and
// rstd may be absent): the bytes of the composition. Returns false, having done nothing, when the
// kernel's preconditions (D % 8 == 0, aligned rows, D ≤ 16384, the columnwise tile in shared
// memory) do not hold.
bool rmsnorm_fwd_quantize_cuda(Context& ctx, const TensorView& y, const TensorView& rstd,
                               const TensorView& x, const TensorView& w, float eps,
                               const QuantConfig& cfg, QuantizedTensor& out,
                               const RmsNormFp8Config* config = nullptr);
void rmsnorm_bwd_cuda(Context& ctx, const TensorView& dx, const TensorView& dw,
                      const TensorView& dout, const TensorView& x, const TensorView& w,
                      const TensorView& rstd, const TensorView& residual, bool accumulate);
// Fused backward + the quantizations of rmsnorm_bwd_quantize, each config (when given) per-tensor
// FP8 with delayed scaling: the bytes of the composition, dw included (the same row partition and
// summation order as rmsnorm_bwd_cuda). Returns false, having done nothing, when the kernel's
// preconditions (D % 8 == 0, aligned rows, at most 2 chunks per thread, the staged tiles in
// shared memory) do not hold.
bool rmsnorm_bwd_quantize_cuda(Context& ctx, const TensorView& dx, const TensorView& dw,
                               const TensorView& dout, const TensorView& x, const TensorView& w,
                               const TensorView& rstd, const TensorView& residual, float eps,
                               const QuantConfig* dx_cfg, QuantizedTensor* dx_out,
                               const QuantConfig* y_cfg, QuantizedTensor* y_out, bool accumulate,
                               const RmsNormFp8Config* config = nullptr);

}  // namespace lowbit::ops_detail

// Private to the ops layer: the two implementations behind rope_table / rope_fwd / rope_bwd
// (include/lowbit/ops.h), and the rotation both use. Arguments have been validated by the
// dispatcher (rope.cpp).
#pragma once

#include <vector>

#include "lowbit/core/hd.h"
#include "lowbit/ops.h"
#include "lowbit/quant.h"

namespace lowbit::ops_detail {

// (a, b) = (x[i], x[i + Dh/2]) rotated by the angle with cosine c and sine s:
//   ya = a·c − b·s,  yb = b·c + a·s,
// every product and sum one RN fp32 operation (no FMA), so the CPU twin and the kernel agree bit
// for bit. The backward passes −s. (Host code: the x86-64 baseline has no FMA instruction, so
// the compiler cannot contract these expressions.)
LOWBIT_HD void rope_rotate(float a, float b, float c, float s, float& ya, float& yb) {
#if defined(__CUDA_ARCH__)
  ya = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  yb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
#else
  const float ac = a * c, bs = b * s, bc = b * c, as = a * s;
  ya = ac - bs;
  yb = bc + as;
#endif
}

// inv_freq [Dh/2] in f64: theta^(−2i/Dh), with LLaMA-3 scaling when cfg.factor > 1 (the formula
// of HF transformers' _compute_llama3_parameters).
std::vector<double> rope_inv_freq(int64_t head_dim, const RopeConfig& cfg);
// table [T, Dh/2, 2] f32 on the host: (cos, sin) of t · inv_freq[i] computed in f64, rounded once.
void rope_table_host(float* table, int64_t positions, int64_t head_dim, const RopeConfig& cfg);

// CPU twin (rope_ref.cpp): y = x rotated by +angle (sign = +1) or −angle (sign = −1); x, y
// [B, T, nH, Dh] bf16|f32, strided (last dim contiguous), possibly the same storage.
void rope_apply_cpu(const TensorView& y, const TensorView& x, const TensorView& table, float sign);
// CUDA (rope.cu), bf16, on ctx.stream().
void rope_apply_cuda(Context& ctx, const TensorView& y, const TensorView& x,
                     const TensorView& table, float sign);

// Fused rope_bwd_quantize for per-tensor FP8 with delayed scaling (cfg passed
// fp8_delayed_fusable; dx absent, dy itself, or a separate contiguous tensor): the bytes of the
// composition. Returns false, having done nothing, when the kernel's preconditions (Dh/2 % 8 == 0,
// Dh ≤ 256, 16-byte aligned rows) do not hold.
bool rope_bwd_quantize_cuda(Context& ctx, const TensorView& dx, const TensorView& dy, int64_t n_rot,
                            const TensorView& table, const QuantConfig& cfg, QuantizedTensor& out);

}  // namespace lowbit::ops_detail

// lowbit ops layer: the transformer's non-GEMM ops, each a forward and a backward.
//
// Every op has two implementations behind one declaration: a CPU twin (plain loops over host
// memory, the definition of the op, src/ops/<op>_ref.cpp) and a CUDA kernel
// (src/ops/<op>.cu). The dispatcher picks by the tensors' device; all tensors of one call live
// on the same device as ctx. Shapes below use N = tokens (B·T), D = model width, V = vocab,
// F = MLP hidden width, H/Hkv = query/key-value heads, Dh = head dim.
//
// Numerics shared by both twins:
// - bf16 tensors are read into fp32, computed in fp32 and rounded once (RN) when stored;
// - reductions over a row (RMSNorm, softmax, cross-entropy) accumulate in fp32 in an order the
//   CPU twin and the kernel need not share, so results agree to a tolerance, not bit for bit;
// - gradients of parameters (embedding table, norm weights) are fp32 and *accumulated* (+=),
//   so micro-batches add up without a separate buffer; the caller zeroes them once per step;
// - results are deterministic: the same inputs give the same bits on every run (no
//   floating-point atomics whose order varies).
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/quant.h"

namespace lowbit {

// ---- token embedding ------------------------------------------------------------------------
// out [N, D] bf16 = table [V, D] (bf16) rows selected by tokens [N] i32. A token outside
// [0, V) is a UserError on the CPU; on the GPU it sets out's row to NaN (checked later).
// sort_plan, optional: [2, N] i32 on the tokens' device, filled with the order the backward
// sums in — which depends on the tokens only. On the GPU its sort runs beside the gather (a
// latency-bound sort on a few SMs under the gather's memory traffic) instead of at the head of
// the backward.
void embedding_fwd(Context& ctx, const TensorView& out, const TensorView& tokens,
                   const TensorView& table, const TensorView& sort_plan = TensorView());
// dtable [V, D] f32 += scatter of dout [N, D] bf16 by tokens [N] i32 (deterministic order).
// sort_plan, optional: the plan embedding_fwd filled from these same tokens (the GPU then does
// not sort; the CPU checks that it matches them). On the GPU a plan from other tokens is not
// detected and gives undefined results.
void embedding_bwd(Context& ctx, const TensorView& dtable, const TensorView& tokens,
                   const TensorView& dout, const TensorView& sort_plan = TensorView());

// ---- RMSNorm --------------------------------------------------------------------------------
// out [N, D] bf16 = x · rstd · w, rstd [N] f32 = 1 / sqrt(mean(x²) + eps); x [N, D] bf16,
// w [D] bf16.
void rmsnorm_fwd(Context& ctx, const TensorView& out, const TensorView& rstd, const TensorView& x,
                 const TensorView& w, float eps);
// dx [N, D] bf16 (overwritten), dw [D] f32 (+=, or = when !accumulate_dw: the same bits as
// zeroing it first), from dout [N, D] bf16 and the forward's x, w, rstd. With `residual` [N, D]
// bf16 (may alias dx; a pre-norm block's residual-stream gradient) dx = residual + the norm's
// input gradient, summed in fp32 and rounded once.
void rmsnorm_bwd(Context& ctx, const TensorView& dx, const TensorView& dw, const TensorView& dout,
                 const TensorView& x, const TensorView& w, const TensorView& rstd,
                 const TensorView& residual = TensorView(), bool accumulate_dw = true);

// RMSNorm fused with the quantization of its output for the next GEMM. The result is defined as
// rmsnorm_fwd(ctx, y, rstd, x, w, eps) followed by quantize(ctx, y, cfg, out): `out` (and y,
// rstd when given, and the delayed-scaling history) hold exactly those bytes, whatever path runs.
// y [N, D] bf16 and rstd [N] f32 may each be an empty TensorView() (not written; a scratch is used
// where the path needs one). On the GPU, per-tensor FP8 with delayed scaling (the scale is known
// before the pass; the default training recipe) runs as one kernel that reads x and w and writes
// the rowwise [N, D] and/or transposed columnwise [D, N] payloads, scale_inv and the amax (folded
// into the state's current history row), without a bf16 round trip through memory; every other
// configuration (current scaling, block, MX, NVFP4, D % 8 != 0, very wide rows) runs the two
// steps one after the other.
void rmsnorm_fwd_quantize(Context& ctx, const TensorView& y, const TensorView& rstd,
                          const TensorView& x, const TensorView& w, float eps,
                          const QuantConfig& cfg, QuantizedTensor& out);
// The backward with the two quantizations a pre-norm block's backward needs around it, each
// optional (a null config skips it; at least one is asked for):
//  * y_cfg: the forward's output remade, quantized (the following linear's input, whose
//    columnwise copy its wgrad reads): exactly rmsnorm_fwd_quantize(ctx, {}, {}, x, w, eps,
//    *y_cfg, *y_out);
//  * then rmsnorm_bwd(ctx, dx, dw, dout, x, w, rstd, residual, accumulate_dw), dx always written;
//  * dx_cfg: quantize(ctx, dx, *dx_cfg, *dx_out) (the preceding linear's dY).
// rstd must be the one rmsnorm_fwd wrote for x (dx reads it; y recomputes it from x, the same
// bits). On the GPU, one pass when every config given is per-tensor FP8 with delayed scaling
// (D % 8 == 0, the staged tiles within a block's shared memory); otherwise the steps in turn.
void rmsnorm_bwd_quantize(Context& ctx, const TensorView& dx, const TensorView& dw,
                          const TensorView& dout, const TensorView& x, const TensorView& w,
                          const TensorView& rstd, const TensorView& residual, float eps,
                          const QuantConfig* dx_cfg, QuantizedTensor* dx_out,
                          const QuantConfig* y_cfg, QuantizedTensor* y_out,
                          bool accumulate_dw = true);

// ---- rotary position embedding -----------------------------------------------------------
struct RopeConfig {
  float theta = 10000.0f;
  // LLaMA-3 frequency scaling (applied when factor > 1): wavelengths longer than
  // original_max_positions / low_freq_factor are divided by `factor`, shorter than
  // original_max_positions / high_freq_factor kept, smoothly interpolated between.
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_positions = 8192;
};
// table [T, Dh/2, 2] f32 = (cos, sin) of position t · inv_freq[i], computed in f64 and rounded
// once, identical on the CPU and the GPU (filled on the host, copied to table's device).
void rope_table(Context& ctx, const TensorView& table, const RopeConfig& cfg);
// y [B, T, nH, Dh] bf16 = x rotated by the angle of position t, pairing element i with
// i + Dh/2 (HF LLaMA's rotate_half convention, so HF checkpoints load unpermuted):
//   y[i] = x[i]·cos − x[i+Dh/2]·sin,  y[i+Dh/2] = x[i+Dh/2]·cos + x[i]·sin.
// x and y may be the same storage and may be strided views (e.g. the q or k part of a fused
// qkv activation; the last dim must be contiguous). bwd rotates by −angle.
void rope_fwd(Context& ctx, const TensorView& y, const TensorView& x, const TensorView& table);
void rope_bwd(Context& ctx, const TensorView& dx, const TensorView& dy, const TensorView& table);
// The backward of a fused qkv activation's rotation with the quantization of the whole gradient
// (the qkv linear's dY): dy [B, T, nH, Dh] bf16, contiguous, holds the gradients of all nH
// heads, of which the first n_rot (q and k) were rotated in the forward. dx (the same shape, or
// dy itself, or an empty TensorView() when no bf16 result is needed) = dy with heads [0, n_rot)
// rotated back and the rest copied, and out = quantize(dx viewed as [B·T, nH·Dh], cfg): exactly
// rope_bwd on those heads followed by quantize(). On the GPU one pass over dy for per-tensor FP8
// with delayed scaling (Dh/2 % 8 == 0, Dh ≤ 256); otherwise the steps in turn.
void rope_bwd_quantize(Context& ctx, const TensorView& dx, const TensorView& dy, int64_t n_rot,
                       const TensorView& table, const QuantConfig& cfg, QuantizedTensor& out);

// ---- causal attention with grouped-query heads ---------------------------------------------
// q [B, T, H, Dh], k and v [B, T, Hkv, Dh] bf16 (strided views allowed, last dim contiguous;
// H a multiple of Hkv; query head h reads kv head h / (H / Hkv)); Dh ∈ {64, 128}.
// out [B, T, H, Dh] bf16 (contiguous), lse [B, H, T] f32 = log Σ exp(scale · q·k) per query
// (natural log), saved for the backward. Causal: query t sees keys 0..t.
void attention_fwd(Context& ctx, const TensorView& out, const TensorView& lse, const TensorView& q,
                   const TensorView& k, const TensorView& v, float scale);
// dq [B, T, H, Dh], dk and dv [B, T, Hkv, Dh] bf16 (overwritten; strided views allowed) from
// dout [B, T, H, Dh] bf16 and the forward's q, k, v, out, lse.
void attention_bwd(Context& ctx, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const TensorView& dout, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const TensorView& lse, float scale);
// attention_bwd, and the forward's output (out, contiguous) quantized as [B·T, H·Dh] under
// out_cfg into out_q (the attention projection's wgrad input): exactly attention_bwd followed by
// quantize(out viewed as [B·T, H·Dh], out_cfg). On the GPU the codes come from the backward's
// first pass, which reads out anyway (D = rowsum(dO ∘ O)), for per-tensor FP8 with delayed
// scaling and T % 32 == 0; otherwise the steps in turn.
void attention_bwd_quantize_out(Context& ctx, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const TensorView& dout, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView& lse, float scale, const QuantConfig& out_cfg,
                                QuantizedTensor& out_q);

// ---- attention against a KV cache (incremental decoding) -----------------------------------
// k_cache and v_cache [B, Tmax, Hkv, Dh] hold the (rotated) keys and values of positions
// [0, Tmax) of each sequence; a generation step appends its new positions and attends to all of
// them. Views with a contiguous last dim (bf16, or f32 on the CPU).
//
// cache rows [t0, t0 + Tq) = src [B, Tq, Hkv, Dh] (a strided view allowed, e.g. the k or v part
// of a fused qkv activation); t0 + Tq ≤ Tmax. Other rows are left untouched.
void kv_cache_write(Context& ctx, const TensorView& cache, const TensorView& src, int64_t t0);
// out [B, Tq, H, Dh] = attention of the queries q [B, Tq, H, Dh] of positions t0 .. t0 + Tq − 1
// against the keys and values of positions [0, t0 + Tq) of the caches: query i sees keys
// 0 .. t0 + i (causal), query head h reads kv head h / (H / Hkv). Softmax and accumulation in
// fp32, out rounded once. Dh ≤ 256 on the CPU, Dh ∈ {64, 128} on the GPU (where a prefill,
// t0 = 0 with many queries, runs the flash kernel of attention_fwd). With t0 = 0 and Tq = T it
// is attention_fwd's output (without lse).
void attention_cache_fwd(Context& ctx, const TensorView& out, const TensorView& q,
                         const TensorView& k_cache, const TensorView& v_cache, int64_t t0,
                         float scale);

// ---- SwiGLU -----------------------------------------------------------------------------------
// gate_up [N, 2F] bf16 holds the gate projection in columns [0, F) and the up projection in
// [F, 2F). out [N, F] bf16 = silu(gate) · up.
void swiglu_fwd(Context& ctx, const TensorView& out, const TensorView& gate_up);
// SwiGLU fused with the quantization of its output: exactly swiglu_fwd(ctx, h, gate_up) followed
// by quantize(ctx, h, cfg, out). h [N, F] bf16 may be an empty TensorView() (not written). Fused
// on the GPU for per-tensor FP8 with delayed scaling (F % 8 == 0); otherwise the two steps.
void swiglu_fwd_quantize(Context& ctx, const TensorView& h, const TensorView& gate_up,
                         const QuantConfig& cfg, QuantizedTensor& out);
// dgate_up [N, 2F] bf16 (overwritten) from dout [N, F] bf16 and the forward's gate_up.
void swiglu_bwd(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                const TensorView& gate_up);
// The backward fused with the quantization of its result (the gate_up linear's dY): exactly
// swiglu_bwd(ctx, dgate_up, dout, gate_up) followed by quantize(ctx, dgate_up, cfg, out).
// dgate_up [N, 2F] bf16 may be an empty TensorView() (not written). Fused on the GPU for
// per-tensor FP8 with delayed scaling (F % 8 == 0); otherwise the two steps.
void swiglu_bwd_quantize(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                         const TensorView& gate_up, const QuantConfig& cfg, QuantizedTensor& out);
// The same, also remaking the forward's h = silu(gate)·up quantized under h_cfg (the down
// linear's input, whose columnwise copy its wgrad reads): exactly
// swiglu_fwd_quantize(ctx, TensorView(), gate_up, h_cfg, h_out) followed by the call above. One
// pass over gate_up on the GPU when both configs are per-tensor FP8 with delayed scaling and
// h_cfg asks for the columnwise copy; otherwise the two steps.
void swiglu_bwd_quantize_with_h(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                                const TensorView& gate_up, const QuantConfig& cfg,
                                QuantizedTensor& out, const QuantConfig& h_cfg,
                                QuantizedTensor& h_out);

// ---- elementwise pieces -------------------------------------------------------------------
// out = a + b, same shape; bf16 or f32 (all three the same dtype). out may alias a or b.
void add(Context& ctx, const TensorView& out, const TensorView& a, const TensorView& b);
// dst = src converted (f32 ↔ bf16, RN), same shape, contiguous.
void convert(Context& ctx, const TensorView& dst, const TensorView& src);

// ---- cross-entropy over the vocabulary -----------------------------------------------------
// One chunk of rows of the LM head's output. logits [n, V] bf16 (this chunk's rows only, so
// full fp32 logits are never materialised); targets [n] i32 (ignore_index marks masked tokens,
// e.g. prompts in SFT). losses [n] f32 = logsumexp(logits) − logits[target] (0 for ignored
// rows). When dlogits is non-null it receives [n, V] bf16 = grad_scale · (softmax − onehot)
// (zero rows for ignored tokens) and may alias logits (computed in place).
// grad_scale is typically 1 / (valid targets of the whole optimizer step, all micro-batches).
void cross_entropy_fwd_bwd(Context& ctx, const TensorView& losses, const TensorView* dlogits,
                           const TensorView& logits, const TensorView& targets, int ignore_index,
                           float grad_scale);

// ---- optimizer: multi-tensor AdamW over the parameter arena --------------------------------
// One segment per parameter tensor of the arena (offsets and lengths in elements).
struct ParamSegment {
  int64_t offset = 0;
  int64_t numel = 0;
  bool weight_decay = true;  // false for norms (and anything else the policy exempts)
  // Where adamw_step writes the segment's bf16 copy in `compute`: kSameOffset (at `offset`, a
  // compute buffer indexed like master), kNoCompute (no copy: e.g. weights that only reach the
  // GEMMs quantized), or an element offset into a compact compute buffer.
  static constexpr int64_t kSameOffset = -1;
  static constexpr int64_t kNoCompute = -2;
  int64_t compute_offset = kSameOffset;
  bool has_compute() const { return compute_offset != kNoCompute; }
  int64_t compute_begin() const { return compute_offset == kSameOffset ? offset : compute_offset; }
};
struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  int64_t step = 1;  // 1-based, for the bias corrections 1 − βᵗ
};
// In one pass over every segment: g = grad · (*grad_scale) (grad_scale is a device-side f32
// scalar from clip_coefficient(), so clipping needs no host sync); m, v updated; master -= lr ·
// (m̂ / (sqrt(v̂) + eps) + wd · master) (decoupled decay, PyTorch's AdamW order); and, when
// `compute` is non-null, compute [Pc] bf16 = RN(master) for every segment with a copy, at its
// compute_begin(). If *skip (device i32) is non-zero the step leaves everything untouched (NaN
// guard). master, grad, m, v [P] f32.
void adamw_step(Context& ctx, const TensorView& master, const TensorView& grad, const TensorView& m,
                const TensorView& v, const TensorView* compute,
                const std::vector<ParamSegment>& segments, const AdamWConfig& cfg,
                const TensorView& grad_scale, const TensorView& skip);

// ---- gradient norm and clipping ------------------------------------------------------------
// seg_norms [S] f32 = sqrt(Σ grad²) over each segment (an fp64 sum in a deterministic order,
// rounded once), from grad [P] f32. Norms, not sums of squares: a segment's sum of squares
// leaves the fp32 range from a norm of ~1.8e19, its norm only from ~3.4e38.
void segment_norms(Context& ctx, const TensorView& seg_norms, const TensorView& grad,
                   const std::vector<ParamSegment>& segments);
// From seg_norms [S] f32, on the device: norm [1] f32 = sqrt(Σ seg_norms²) (squares and sum in
// fp64); coef [1] f32 = min(1, max_norm / (norm + 1e-6)) (1 when max_norm ≤ 0); skip [1] i32 = 1
// when the norm is not finite, else 0.
void clip_coefficient(Context& ctx, const TensorView& norm, const TensorView& coef,
                      const TensorView& skip, const TensorView& seg_norms, float max_norm);

}  // namespace lowbit

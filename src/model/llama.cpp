// The LLaMA decoder: explicit forward and backward call sequences per block (no autograd).
//
// Block l (x [N, D] bf16 is the residual stream):
//   ln1 = rmsnorm(x)                       rstd1 [N]
//   qkv = ln1 · Wqkvᵀ                      [N, (H + 2·Hkv)·Dh], q and k rotated in place
//   att = attention(q, k, v)               [N, H·Dh], lse [B, H, T]
//   x'  = x + att · Woᵀ                    (the add in the GEMM's epilogue: one rounding)
//   ln2 = rmsnorm(x')                      rstd2 [N]
//   gu  = ln2 · Wguᵀ                       [N, 2F] (gate | up)
//   h   = silu(gate) · up                  [N, F]
//   out = x' + h · Wdownᵀ                  (likewise)
// Each of the four linears runs in its plan's recipe: quantized recipes quantize X (rowwise
// for fprop), W (once per step) and dY (in the backward). The columnwise copy of X that wgrad
// needs is by default not kept: the backward recomputes it from what the block keeps anyway
// (ln1 from x_in, att, ln2 from x_mid, h from gu) — same kernels, same inputs and, within a
// step, the same scales, so its bytes equal the forward's (ForwardOptions::
// recompute_quantized_inputs; tests/model checks the equality). h comes from the SwiGLU
// backward itself when both MLP linears are quantized (swiglu_bwd_quantize_with_h: one pass
// over gu), so the down linear's wgrad runs after it, its dgrad before. Likewise ln1 and ln2 come
// from the norms' backwards (rmsnorm_bwd_quantize: one pass over x_in / x_mid, which they read
// anyway), so the qkv and gate_up wgrads run after the norm, their dgrads before; the same pass
// quantizes dx as the dY of the linear before the norm (the attention projection, or the
// previous block's down linear: handed over in pending_dy).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "lowbit/core/nvtx.h"
#include "lowbit/gemm.h"
#include "lowbit/model.h"
#include "model/host_upload.h"
#include "model/model_views.h"

namespace lowbit {

using model_detail::act;
using model_detail::heads_view;
using model_detail::rows;

// What the backward of one linear needs from its forward.
struct LinearSaved {
  TensorView x;        // bf16 input (bf16 recipe): a view of an activation kept by the block
  Tensor x_keep;       // owns x when nothing else does
  QuantizedTensor xq;  // quantized recipes: the columnwise copy of X (wgrad), kept or recomputed
};

struct BlockSaved {
  Tensor x_in;          // [N, D] bf16 block input
  Tensor rstd1, rstd2;  // [N] f32
  Tensor qkv;           // [N, (H + 2Hkv)·Dh] bf16, q and k rotated
  Tensor att;           // [N, H·Dh] bf16 attention output
  Tensor lse;           // [B, H, T] f32
  Tensor x_mid;         // [N, D] bf16 residual after attention
  Tensor gu;            // [N, 2F] bf16
  LinearSaved lin[kLinearsPerBlock];
  bool complete = false;  // false: only x_in (activation checkpointing)
};

struct LlamaModel::Impl {
  Context& ctx;
  HostUpload uploads;  // token ids and targets, host → device without a host stall
  const ModelConfig& cfg;
  const PrecisionPlan& plan;
  ParamArena& arena;
  Device dev;
  DType adt = DType::kBF16;  // activations and compute weights: bf16, or f32 (CPU reference)
  Tensor rope;               // [max_seq_len, Dh/2, 2] f32
  std::unique_ptr<DelayedScalingState> fwd_state, bwd_state;
  // [L·4 + 1] quantized weights (head last): the rowwise copy (fprop) and the columnwise copy
  // (dgrad). By default each is made where it is used — the rowwise one in the forward, the
  // columnwise one in the backward, layer by layer — from the same bf16 values and scales
  // (bit-identical to making both at once) and dropped after its GEMM; they are kept here for
  // the rest of the step (until weights_changed()) when
  // ForwardOptions::recompute_quantized_weights is off.
  std::vector<QuantizedTensor> wq, wq_col;
  // [L·4 + 1] bf16 weights converted from the master for the decoder (linears that keep no
  // compute copy), until the weights change.
  std::vector<Tensor> dense;
  bool recompute_inputs = true;    // ForwardOptions::recompute_quantized_inputs of this pass
  bool recompute_weights = true;   // ForwardOptions::recompute_quantized_weights of this pass
  int recompute_upto = 0;          // blocks l < this drop their outputs (recompute_block_outputs)
  bool collect_stats = false;      // ForwardOptions::collect_quant_stats of this pass
  bool overwrite_grads = false;    // ForwardOptions::overwrite_linear_grads of this pass
  std::vector<char> grad_written;  // [L·4 + 1] the linear's gradient was written this pass
  std::vector<char> norm_written;  // [params] the norm weight's gradient was written this pass
  Tensor stats_counts;  // [L·4 + 1, 3, 2] i64: {saturated, underflow} per linear and operand
  std::vector<int64_t> stats_numel;  // [L·4 + 1, 3] elements counted (host)
  bool w_stats_done = false;         // weights are counted once per reset
  // The dY of linear pending_dy_lin (a down linear), quantized by the norm backward that made it
  // (the next block's first norm, or the final norm) and consumed by that linear's backward.
  QuantizedTensor pending_dy;
  int pending_dy_lin = -1;

  // Adds the clip statistics of operand `which` (0 x, 1 w, 2 dy) of linear `lin`.
  void record_clip_stats(int lin, int which, const TensorView& src, const QuantizedTensor& q) {
    if (!collect_stats || !q.has_rowwise()) return;
    if (!stats_counts.defined()) {
      stats_counts = Tensor::zeros({num_linears() + 1, 3, 2}, DType::kI64, dev);
      stats_numel.assign(static_cast<size_t>(num_linears() + 1) * 3, 0);
    }
    const int64_t slot = int64_t(lin) * 3 + which;
    auto* base = static_cast<int64_t*>(stats_counts.data()) + slot * 2;
    quant_clip_stats(ctx, src, q, TensorView(base, DType::kI64, Shape{2}, dev));
    stats_numel[static_cast<size_t>(slot)] += src.numel();
  }
  // Parameter indices.
  int p_embed = 0, p_norm = 0, p_head = 0;
  int num_linears() const { return cfg.n_layers * kLinearsPerBlock; }
  int head_index() const { return num_linears(); }

  Impl(Context& c, const ModelConfig& m, const PrecisionPlan& p, ParamArena& a)
      : ctx(c), cfg(m), plan(p), arena(a), dev(c.device()) {}

  int p_layer(int l, int k) const { return 1 + l * 9 + k; }  // see ParamArena's order
  // The compute copy of a parameter: bf16, or the f32 master in the f32 reference mode.
  TensorView param(int i) const { return adt == DType::kF32 ? arena.master(i) : arena.compute(i); }
  TensorView param_fused(int first, int last) const {
    return adt == DType::kF32 ? arena.master_fused(first, last) : arena.compute_fused(first, last);
  }
  // The arena parameters [first, last] that make up linear `lin`'s weight (q, k, v and gate, up
  // are fused).
  std::pair<int, int> weight_params(int lin) const {
    if (lin == head_index()) return {p_head, p_head};
    const int l = lin / kLinearsPerBlock;
    switch (static_cast<LinearKind>(lin % kLinearsPerBlock)) {
      case LinearKind::kQKV: return {p_layer(l, 1), p_layer(l, 3)};
      case LinearKind::kProj: return {p_layer(l, 4), p_layer(l, 4)};
      case LinearKind::kGateUp: return {p_layer(l, 6), p_layer(l, 7)};
      case LinearKind::kDown: return {p_layer(l, 8), p_layer(l, 8)};
    }
    return {0, 0};
  }
  // The compute weight [rows, cols] (bf16, or the f32 master in the f32 reference mode); only
  // for linears that keep a compute copy (has_compute_weight).
  TensorView weight(int lin) const {
    const auto [first, last] = weight_params(lin);
    return first == last ? param(first) : param_fused(first, last);
  }
  bool has_compute_weight(int lin) const {
    return adt == DType::kF32 || arena.has_compute(weight_params(lin).first);
  }
  // beta of linear `lin`'s next wgrad GEMM: 0 for its first one in a pass with
  // overwrite_linear_grads (the gradient holds last step's values, or anything), else 1
  // (micro-batches and head chunks add). A head tied to the embedding is overwritten too: its
  // backward runs before the embedding's scatter-add, which then adds to it.
  float wgrad_beta(int lin) {
    const bool overwrite = overwrite_grads && grad_written[lin] == 0;
    grad_written[lin] = 1;
    return overwrite ? 0.0f : 1.0f;
  }
  // Whether norm weight p_w's backward adds to its gradient (false: the first write of a pass
  // with overwrite_grads, which then needs no zeroing beforehand).
  bool norm_accumulate(int p_w) {
    const bool overwrite = overwrite_grads && norm_written[static_cast<size_t>(p_w)] == 0;
    norm_written[static_cast<size_t>(p_w)] = 1;
    return !overwrite;
  }
  TensorView weight_grad(int lin) const {
    const auto [first, last] = weight_params(lin);
    return first == last ? arena.grad(first) : arena.grad_fused(first, last);
  }
  // The weight in bf16 for quantizing: the compute copy, or a transient conversion of the master
  // (the same RN_bf16 values the optimizer would have written) held in `keep`.
  TensorView weight_source(int lin, Tensor& keep) const {
    if (has_compute_weight(lin)) return weight(lin);
    const auto [first, last] = weight_params(lin);
    const TensorView m = first == last ? arena.master(first) : arena.master_fused(first, last);
    keep = Tensor::empty(m.shape, DType::kBF16, dev, MemCategory::kWorkspace);
    convert(ctx, keep, m);
    return keep.view();
  }
  std::string linear_name(int lin) const {
    if (lin == head_index()) return "lm_head";
    return std::string(linear_kind_name(static_cast<LinearKind>(lin % kLinearsPerBlock)));
  }
  const LinearPrecision& precision(int lin) const {
    if (lin == head_index()) return plan.head;
    return plan.linears[lin];
  }
  // The operand's config with the delayed-scaling state bound (recipe fp8).
  QuantConfig bind(const QuantConfig& base, int lin, int which /*0 x, 1 w, 2 dy*/, bool rowwise,
                   bool columnwise) const {
    QuantConfig q = base;
    q.rowwise = rowwise;
    q.columnwise = columnwise;
    if (precision(lin).recipe == Recipe::kFP8) {
      if (which == 2) {
        q.delayed = bwd_state.get();
        q.delayed_slot = lin;
      } else {
        q.delayed = fwd_state.get();
        q.delayed_slot = 2 * lin + which;
      }
    }
    return q;
  }

  // One copy of linear `lin`'s quantized weight: rowwise (fprop) or columnwise (dgrad). The kept
  // copy when there is one; else it is made, into the kept ones when `keep`, else into `tmp`.
  const QuantizedTensor& weight_copy(int lin, bool rowwise, QuantizedTensor& tmp, bool keep) {
    if (wq.empty()) {
      wq.resize(num_linears() + 1);
      wq_col.resize(num_linears() + 1);
    }
    QuantizedTensor& kept = rowwise ? wq[lin] : wq_col[lin];
    if (rowwise ? kept.has_rowwise() : kept.has_columnwise()) return kept;
    const NvtxRange range(linear_name(lin) + (rowwise ? " weight rowwise" : " weight columnwise"));
    QuantizedTensor& out = keep ? kept : tmp;
    QuantConfig qc = bind(precision(lin).w, lin, 1, rowwise, !rowwise);
    if (has_compute_weight(lin)) {
      quantize(ctx, weight(lin), qc, out);
    } else {
      // From the f32 master, rounded to bf16 as it is read: the codes of quantizing the bf16
      // copy weight_source() would make, without writing and reading that copy.
      const auto [first, last] = weight_params(lin);
      qc.round_source_to_bf16 = true;
      quantize(ctx, first == last ? arena.master(first) : arena.master_fused(first, last), qc, out);
    }
    return out;
  }

  void weights_changed() {
    wq.clear();
    wq_col.clear();
    dense.clear();
  }

  TensorView bf16_weight(int lin) {
    LOWBIT_CHECK(lin >= 0 && lin <= num_linears(), "linear {} out of range", lin);
    if (has_compute_weight(lin)) return weight(lin);
    dense.resize(num_linears() + 1);
    if (!dense[lin].defined()) weight_source(lin, dense[lin]);
    return dense[lin].view();
  }

  // Quantizes a linear's input inside the op that produces it (RMSNorm, SwiGLU): the same bytes
  // as producing it in bf16 and calling quantize(), without the bf16 round trip.
  using Producer = std::function<void(const QuantConfig&, QuantizedTensor&)>;

  // y [M, Nout] bf16 = x [M, K] · Wᵀ. `saved` (training) receives what the backward needs;
  // `x_owner` is an activation that holds x and that the caller keeps anyway, or null. With
  // `produce` (quantized recipes), X is quantized by it and x may be empty (it is read only for
  // the clip statistics). With `residual` ([M, Nout], may alias y) the GEMM's epilogue adds it:
  // y = x · Wᵀ + residual, summed in fp32 and rounded once.
  void linear_fwd(int lin, const TensorView& x, const Tensor* x_owner, const TensorView& y,
                  LinearSaved* saved, const Producer* produce = nullptr,
                  const TensorView* residual = nullptr) {
    const NvtxRange range(linear_name(lin));
    const LinearPrecision& p = precision(lin);
    GemmOptions o;
    o.role = GemmRole::kFprop;
    if (residual != nullptr) {
      o.c = residual;
      o.beta = 1.0f;
    }
    if (p.recipe == Recipe::kBF16) {
      gemm(ctx, GemmOperand::of(x), GemmOperand::of(weight(lin)), y, o);
      if (saved) {
        saved->x = x;
        if (x_owner) saved->x_keep = *x_owner;
      }
      return;
    }
    QuantizedTensor xq;
    // The head's input is used by its backward right away; block linears recompute theirs.
    const bool keep_columnwise = saved != nullptr && (lin == head_index() || !recompute_inputs);
    const QuantConfig qc = bind(p.x, lin, 0, true, keep_columnwise);
    if (produce != nullptr) {
      (*produce)(qc, xq);
    } else {
      quantize(ctx, x, qc, xq);
    }
    record_clip_stats(lin, 0, x, xq);
    QuantizedTensor w_tmp;
    const QuantizedTensor& wr = weight_copy(lin, true, w_tmp, !recompute_weights);
    if (collect_stats && !w_stats_done) {
      Tensor src;
      record_clip_stats(lin, 1, weight_source(lin, src), wr);
    }
    gemm(ctx, GemmOperand::of(xq), GemmOperand::of(wr), y, o);
    if (keep_columnwise) {
      xq.rowwise_data = Tensor();  // only the columnwise copy is needed (wgrad)
      xq.rowwise_scale_inv = Tensor();
      saved->xq = std::move(xq);
    }
  }

  // dx [M, K] bf16 = dy · W (skipped when dx is null); dW [Nout, K] f32 += dyᵀ · x. Quantized
  // recipes quantize dy here unless its producer did (`dyq_in`; dy is then read only for the
  // clip statistics and may be empty).
  void linear_bwd(int lin, const TensorView& dy, const LinearSaved& saved, const TensorView* dx,
                  QuantizedTensor* dyq_in = nullptr) {
    const NvtxRange range(linear_name(lin) + " backward");
    const LinearPrecision& p = precision(lin);
    if (p.recipe == Recipe::kBF16) {
      GemmOptions dg;
      dg.role = GemmRole::kDgrad;
      GemmOptions wg;
      wg.role = GemmRole::kWgrad;
      wg.beta = wgrad_beta(lin);  // accumulate into the fp32 gradient, or the step's first write
      if (dx) gemm(ctx, GemmOperand::of(dy), GemmOperand::of(weight(lin)), *dx, dg);
      gemm(ctx, GemmOperand::of(dy), GemmOperand::of(saved.x), weight_grad(lin), wg);
      return;
    }
    QuantizedTensor dyq_own;
    if (dyq_in == nullptr) dyq_own = take_dy(lin, dy, dx != nullptr);
    const QuantizedTensor& dyq = dyq_in != nullptr ? *dyq_in : dyq_own;
    if (dyq_in != nullptr) record_clip_stats(lin, 2, dy, dyq);
    if (dx) linear_dgrad_quantized(lin, dyq, *dx);
    linear_wgrad_quantized(lin, dyq, saved);
  }

  // A quantized linear's dY: the columnwise copy (wgrad) and, for dgrad, the rowwise one; its
  // clip statistics recorded.
  QuantizedTensor quantize_dy(int lin, const TensorView& dy, bool rowwise) {
    QuantizedTensor dyq;
    quantize(ctx, dy, bind(precision(lin).dy, lin, 2, rowwise, true), dyq);
    record_clip_stats(lin, 2, dy, dyq);
    return dyq;
  }

  // The two halves of a quantized linear_bwd, for a caller that runs other work between them:
  // dx [M, K] bf16 = dyq · W, and dW [Nout, K] f32 (+)= dyqᵀ · saved.xq.
  void linear_dgrad_quantized(int lin, const QuantizedTensor& dyq, const TensorView& dx) {
    GemmOptions dg;
    dg.role = GemmRole::kDgrad;
    QuantizedTensor tmp;
    const QuantizedTensor& wc = weight_copy(lin, false, tmp, !recompute_weights);
    gemm(ctx, GemmOperand::of(dyq), GemmOperand::of(wc), dx, dg);
  }

  void linear_wgrad_quantized(int lin, const QuantizedTensor& dyq, const LinearSaved& saved) {
    GemmOptions wg;
    wg.role = GemmRole::kWgrad;
    wg.beta = wgrad_beta(lin);  // accumulate into the fp32 gradient, or the step's first write
    gemm(ctx, GemmOperand::of(dyq), GemmOperand::of(saved.xq), weight_grad(lin), wg);
  }

  // The halves of a quantized linear_bwd for a linear whose wgrad waits for its input's
  // columnwise copy (remade by a later op of the backward): the dgrad now, after which dyq keeps
  // only its columnwise copy; the wgrad later, after which dyq and the saved input are dropped.
  void linear_dgrad_first(int lin, QuantizedTensor& dyq, const TensorView& dx) {
    const NvtxRange range(linear_name(lin) + " backward (dgrad)");
    linear_dgrad_quantized(lin, dyq, dx);
    dyq.rowwise_data = Tensor();
    dyq.rowwise_scale_inv = Tensor();
  }
  void linear_wgrad_after(int lin, QuantizedTensor& dyq, LinearSaved& saved) {
    const NvtxRange range(linear_name(lin) + " backward (wgrad)");
    linear_wgrad_quantized(lin, dyq, saved);
    saved = {};
    dyq = QuantizedTensor();
  }

  // linear `lin`'s dY [N, ·]: the norm backward's quantized output when it made it (`pending`),
  // else quantized here (rowwise too when a dgrad reads it).
  QuantizedTensor take_dy(int lin, const TensorView& dy, bool rowwise) {
    if (pending_dy_lin == lin) {
      pending_dy_lin = -1;
      return std::move(pending_dy);
    }
    return quantize_dy(lin, dy, rowwise);
  }

  // A pre-norm backward: dx [N, D] = rmsnorm_bwd(dout), plus dx's old value when `accumulate` (the
  // residual stream), one rounding; dw into parameter p_w's gradient. When
  // linear dy_lin (−1: none) is quantized, dx is also quantized as its dY (both copies) into
  // pending_dy; when linear y_lin (−1: none) is quantized and has no columnwise input, the norm's
  // output is remade as its wgrad input (s_y->xq) — one pass over the rows where the recipe allows
  // (rmsnorm_bwd_quantize).
  void norm_bwd(int p_w, const Tensor& x, const Tensor& rstd, const TensorView& dout, Tensor& dx,
                bool accumulate, int dy_lin, int y_lin, LinearSaved* s_y) {
    const TensorView residual = accumulate ? dx.view() : TensorView();
    const bool add_dw = norm_accumulate(p_w);
    const bool want_dx = dy_lin >= 0 && precision(dy_lin).recipe != Recipe::kBF16;
    const bool want_y =
        y_lin >= 0 && precision(y_lin).recipe != Recipe::kBF16 && !s_y->xq.has_columnwise();
    if (!want_dx && !want_y) {
      rmsnorm_bwd(ctx, dx, arena.grad(p_w), dout, x, param(p_w), rstd, residual, add_dw);
      return;
    }
    QuantConfig dx_cfg, y_cfg;
    if (want_dx) dx_cfg = bind(precision(dy_lin).dy, dy_lin, 2, true, true);
    if (want_y) y_cfg = bind(precision(y_lin).x, y_lin, 0, false, true);
    QuantizedTensor dxq;
    rmsnorm_bwd_quantize(ctx, dx, arena.grad(p_w), dout, x, param(p_w), rstd, residual,
                         cfg.norm_eps, want_dx ? &dx_cfg : nullptr, want_dx ? &dxq : nullptr,
                         want_y ? &y_cfg : nullptr, want_y ? &s_y->xq : nullptr, add_dw);
    if (want_dx) {
      record_clip_stats(dy_lin, 2, dx, dxq);
      pending_dy = std::move(dxq);
      pending_dy_lin = dy_lin;
    }
  }

  // The columnwise copy of block l's linear k input, recomputed for wgrad (see the top of the
  // file) when the forward did not keep it.
  void recompute_wgrad_input(int l, int k, BlockSaved& s) {
    const int lin = l * kLinearsPerBlock + k;
    const LinearPrecision& p = precision(lin);
    if (p.recipe == Recipe::kBF16 || s.lin[k].xq.has_columnwise()) return;
    const NvtxRange range(linear_name(lin) + " input recompute");
    const QuantConfig qc = bind(p.x, lin, 0, false, true);
    QuantizedTensor& xq = s.lin[k].xq;
    switch (static_cast<LinearKind>(k)) {
      case LinearKind::kQKV:
      case LinearKind::kGateUp: {
        const bool first = static_cast<LinearKind>(k) == LinearKind::kQKV;
        // rmsnorm(x_in or x_mid) quantized straight from the norm (no bf16 copy, no rstd).
        rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), first ? s.x_in : s.x_mid,
                             param(p_layer(l, first ? 0 : 5)), cfg.norm_eps, qc, xq);
        break;
      }
      case LinearKind::kProj: quantize(ctx, s.att, qc, xq); break;
      case LinearKind::kDown: {
        swiglu_fwd_quantize(ctx, TensorView(), s.gu, qc, xq);  // silu(gate)·up, quantized
        break;
      }
    }
  }

  // Block l's qkv (k = kQKV, RoPE applied) or gate_up (k = kGateUp) output, recomputed for the
  // backward exactly as block_fwd made it: the norm of the saved block input / x_mid, quantized
  // from the norm (or the bf16 norm output the linear kept for wgrad), and the same GEMM.
  Tensor recompute_output(int l, LinearKind kind, const BlockSaved& s, int B, int T) {
    const int k = static_cast<int>(kind);
    const int lin = l * kLinearsPerBlock + k;
    const NvtxRange range(linear_name(lin) + " output recompute");
    const int64_t N = int64_t(B) * T;
    const int H = cfg.n_heads, Hkv = cfg.n_kv_heads, Dh = cfg.head_dim();
    const bool qkv = kind == LinearKind::kQKV;
    const int64_t width = qkv ? int64_t(H + 2 * Hkv) * Dh : 2 * cfg.ffn_hidden;
    Tensor y = act({N, width}, adt, dev);
    const bool collecting = collect_stats;  // the forward already counted these operands
    collect_stats = false;
    if (precision(lin).recipe == Recipe::kBF16) {
      linear_fwd(lin, s.lin[k].x, nullptr, y, nullptr);
    } else {
      const Tensor& src = qkv ? s.x_in : s.x_mid;
      const Producer make = [&](const QuantConfig& qc, QuantizedTensor& xq) {
        rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), src, param(p_layer(l, qkv ? 0 : 5)),
                             cfg.norm_eps, qc, xq);
      };
      linear_fwd(lin, TensorView(), nullptr, y, nullptr, &make);
    }
    collect_stats = collecting;
    if (qkv) {
      const TensorView qk = heads_view(y, B, T, 0, H + Hkv, Dh);
      rope_fwd(ctx, qk, qk, rope_rows(T));
    }
    return y;
  }

  TensorView rope_rows(int T) const {
    return TensorView(rope.data(), DType::kF32, Shape{T, cfg.head_dim() / 2, 2}, dev);
  }

  // y = rmsnorm(x)·w (rstd [N] written) followed by linear `lin`: quantized linears take the norm
  // output quantized from the norm itself; bf16 ones get it in bf16 (kept for wgrad).
  void norm_linear_fwd(int lin, const Tensor& x, int p_norm_w, const Tensor& rstd,
                       const TensorView& y, LinearSaved* saved) {
    const int64_t N = x.shape()[0], D = cfg.d_model;
    const bool fused = precision(lin).recipe != Recipe::kBF16;
    Tensor ln;  // [N, D] bf16 norm output, when something reads it in bf16
    if (!fused || collect_stats) ln = act({N, D}, adt, dev);
    const TensorView lnv = ln.defined() ? ln.view() : TensorView();
    if (fused) {
      const Producer make = [&](const QuantConfig& qc, QuantizedTensor& xq) {
        rmsnorm_fwd_quantize(ctx, lnv, rstd, x, param(p_norm_w), cfg.norm_eps, qc, xq);
      };
      linear_fwd(lin, lnv, nullptr, y, saved, &make);
    } else {
      rmsnorm_fwd(ctx, ln, rstd, x, param(p_norm_w), cfg.norm_eps);
      linear_fwd(lin, ln, &ln, y, saved);
    }
  }

  // One block forward: returns the block output; fills `s` when training.
  Tensor block_fwd(int l, const Tensor& x, int B, int T, BlockSaved* s) {
    const NvtxRange range(fmt::format("block {} forward", l));
    const int64_t N = int64_t(B) * T, D = cfg.d_model, F = cfg.ffn_hidden;
    const int H = cfg.n_heads, Hkv = cfg.n_kv_heads, Dh = cfg.head_dim();
    const int64_t Wqkv = int64_t(H + 2 * Hkv) * Dh;
    const int lin0 = l * kLinearsPerBlock;
    Tensor rstd1 = act({N}, DType::kF32, dev);
    Tensor qkv = act({N, Wqkv}, adt, dev);
    norm_linear_fwd(lin0 + 0, x, p_layer(l, 0), rstd1, qkv, s ? &s->lin[0] : nullptr);
    const TensorView q = heads_view(qkv, B, T, 0, H, Dh);
    const TensorView k = heads_view(qkv, B, T, int64_t(H) * Dh, Hkv, Dh);
    const TensorView v = heads_view(qkv, B, T, int64_t(H + Hkv) * Dh, Hkv, Dh);
    // q and k are adjacent column ranges of qkv: one rotation over their H + Hkv heads.
    const TensorView qk = heads_view(qkv, B, T, 0, H + Hkv, Dh);
    rope_fwd(ctx, qk, qk, rope_rows(T));
    Tensor att = act({N, int64_t(H) * Dh}, adt, dev);
    Tensor lse = act({B, H, T}, DType::kF32, dev);
    const NvtxRange attn_range("attention");
    attention_fwd(ctx, att.view().reshape({B, T, H, Dh}), lse, q, k, v,
                  1.0f / std::sqrt(static_cast<float>(Dh)));
    Tensor x_mid = act({N, D}, adt, dev);  // x + att · Woᵀ (the residual add in the epilogue)
    const TensorView xv = x.view();
    linear_fwd(lin0 + 1, att, &att, x_mid, s ? &s->lin[1] : nullptr, nullptr, &xv);
    Tensor rstd2 = act({N}, DType::kF32, dev);
    Tensor gu = act({N, 2 * F}, adt, dev);
    norm_linear_fwd(lin0 + 2, x_mid, p_layer(l, 5), rstd2, gu, s ? &s->lin[2] : nullptr);
    Tensor out = act({N, D}, adt, dev);  // x_mid + h · Wdownᵀ
    const TensorView x_mid_v = x_mid.view();
    {
      // h = silu(gate)·up: [N, F] bf16 for a bf16 linear (or the clip statistics); quantized
      // linears take it quantized from the SwiGLU itself.
      const bool fused = precision(lin0 + 3).recipe != Recipe::kBF16;
      Tensor h;
      if (!fused || collect_stats) h = act({N, F}, adt, dev);
      const TensorView hv = h.defined() ? h.view() : TensorView();
      if (fused) {
        const Producer make = [&](const QuantConfig& qc, QuantizedTensor& xq) {
          swiglu_fwd_quantize(ctx, hv, gu, qc, xq);
        };
        linear_fwd(lin0 + 3, hv, nullptr, out, s ? &s->lin[3] : nullptr, &make, &x_mid_v);
      } else {
        swiglu_fwd(ctx, h, gu);
        linear_fwd(lin0 + 3, h, &h, out, s ? &s->lin[3] : nullptr, nullptr, &x_mid_v);
      }
    }
    if (s) {
      s->x_in = x;
      s->rstd1 = std::move(rstd1);
      s->rstd2 = std::move(rstd2);
      // Blocks before recompute_upto: the backward remakes qkv and gu (recompute_output).
      const bool keep_outputs = l >= recompute_upto;
      if (keep_outputs) s->qkv = std::move(qkv);
      s->att = std::move(att);
      s->lse = std::move(lse);
      s->x_mid = std::move(x_mid);
      if (keep_outputs) s->gu = std::move(gu);
      s->complete = true;
    }
    return out;
  }

  // One block backward: dx [N, D] bf16 holds d(out) on entry and d(x_in) on return.
  void block_bwd(int l, BlockSaved& s, Tensor& dx, int B, int T) {
    const NvtxRange range(fmt::format("block {} backward", l));
    const int64_t N = int64_t(B) * T, D = cfg.d_model, F = cfg.ffn_hidden;
    const int H = cfg.n_heads, Hkv = cfg.n_kv_heads, Dh = cfg.head_dim();
    const int64_t Wqkv = int64_t(H + 2 * Hkv) * Dh;
    const int lin0 = l * kLinearsPerBlock;
    // MLP.
    if (!s.gu.defined()) s.gu = recompute_output(l, LinearKind::kGateUp, s, B, T);
    Tensor dh = act({N, F}, adt, dev);
    const LinearPrecision& pgu = precision(lin0 + 2);
    const LinearPrecision& pdown = precision(lin0 + 3);
    const bool fused = pgu.recipe != Recipe::kBF16;
    // When both MLP linears are quantized and the forward did not keep h's columnwise copy, the
    // SwiGLU backward remakes it from the gate_up it reads anyway (instead of a recompute pass
    // over gate_up): the down linear's dgrad runs first, its wgrad after the SwiGLU.
    const bool h_from_bwd = fused && pdown.recipe != Recipe::kBF16 && !s.lin[3].xq.has_columnwise();
    QuantizedTensor dy_down;  // the down linear's dY: its columnwise copy waits for the wgrad
    if (h_from_bwd) {
      dy_down = take_dy(lin0 + 3, dx, true);
      linear_dgrad_first(lin0 + 3, dy_down, dh.view());
    } else {
      recompute_wgrad_input(l, 3, s);
      linear_bwd(lin0 + 3, dx, s.lin[3], &dh.view());
      s.lin[3] = {};
    }
    // d(gate_up) [N, 2F]: quantized linears take it quantized from the SwiGLU backward itself
    // (no bf16 copy unless the clip statistics read it).
    Tensor dgu;
    if (!fused || collect_stats) dgu = act({N, 2 * F}, adt, dev);
    const TensorView dguv = dgu.defined() ? dgu.view() : TensorView();
    QuantizedTensor dguq;
    if (h_from_bwd) {
      swiglu_bwd_quantize_with_h(ctx, dguv, dh, s.gu, bind(pgu.dy, lin0 + 2, 2, true, true), dguq,
                                 bind(pdown.x, lin0 + 3, 0, false, true), s.lin[3].xq);
    } else if (fused) {
      swiglu_bwd_quantize(ctx, dguv, dh, s.gu, bind(pgu.dy, lin0 + 2, 2, true, true), dguq);
    } else {
      swiglu_bwd(ctx, dgu, dh, s.gu);
    }
    dh = Tensor();
    s.gu = Tensor();
    if (h_from_bwd) linear_wgrad_after(lin0 + 3, dy_down, s.lin[3]);
    Tensor dln = act({N, D}, adt, dev);
    // When gate_up is quantized and its input's columnwise copy was not kept, the norm backward
    // remakes it (rmsnorm_bwd_quantize) and the wgrad runs after the norm.
    const bool gu_input_from_norm = fused && !s.lin[2].xq.has_columnwise();
    if (gu_input_from_norm) {
      record_clip_stats(lin0 + 2, 2, dguv, dguq);
      linear_dgrad_first(lin0 + 2, dguq, dln.view());
    } else {
      recompute_wgrad_input(l, 2, s);
      linear_bwd(lin0 + 2, dguv, s.lin[2], &dln.view(), fused ? &dguq : nullptr);
      s.lin[2] = {};
      dguq = QuantizedTensor();
    }
    dgu = Tensor();
    // dx += the norm's input gradient (in the kernel, one rounding): dx now d(x_mid), quantized
    // as the attention projection's dY when that linear is.
    norm_bwd(p_layer(l, 5), s.x_mid, s.rstd2, dln, dx, true, lin0 + 1, lin0 + 2, &s.lin[2]);
    s.x_mid = Tensor();
    if (gu_input_from_norm) linear_wgrad_after(lin0 + 2, dguq, s.lin[2]);
    // Attention. A quantized projection without its input's columnwise copy gets it from the
    // attention backward, which reads that input (the attention output) anyway: its dgrad runs
    // first, its wgrad after.
    Tensor datt = act({N, int64_t(H) * Dh}, adt, dev);
    const bool proj_input_from_attention =
        precision(lin0 + 1).recipe != Recipe::kBF16 && !s.lin[1].xq.has_columnwise();
    QuantizedTensor dprojq;
    if (proj_input_from_attention) {
      dprojq = take_dy(lin0 + 1, dx, true);
      linear_dgrad_first(lin0 + 1, dprojq, datt.view());
    } else {
      recompute_wgrad_input(l, 1, s);
      linear_bwd(lin0 + 1, dx, s.lin[1], &datt.view());
      s.lin[1] = {};
    }
    if (!s.qkv.defined()) s.qkv = recompute_output(l, LinearKind::kQKV, s, B, T);
    Tensor dqkv = act({N, Wqkv}, adt, dev);
    const TensorView q = heads_view(s.qkv, B, T, 0, H, Dh);
    const TensorView k = heads_view(s.qkv, B, T, int64_t(H) * Dh, Hkv, Dh);
    const TensorView v = heads_view(s.qkv, B, T, int64_t(H + Hkv) * Dh, Hkv, Dh);
    const TensorView dq = heads_view(dqkv, B, T, 0, H, Dh);
    const TensorView dk = heads_view(dqkv, B, T, int64_t(H) * Dh, Hkv, Dh);
    const TensorView dv = heads_view(dqkv, B, T, int64_t(H + Hkv) * Dh, Hkv, Dh);
    const TensorView att4 = s.att.view().reshape({B, T, H, Dh});
    const float att_scale = 1.0f / std::sqrt(static_cast<float>(Dh));
    if (proj_input_from_attention) {
      attention_bwd_quantize_out(
          ctx, dq, dk, dv, datt.view().reshape({B, T, H, Dh}), q, k, v, att4, s.lse, att_scale,
          bind(precision(lin0 + 1).x, lin0 + 1, 0, false, true), s.lin[1].xq);
      datt = Tensor();
      linear_wgrad_after(lin0 + 1, dprojq, s.lin[1]);
    } else {
      attention_bwd(ctx, dq, dk, dv, datt.view().reshape({B, T, H, Dh}), q, k, v, att4, s.lse,
                    att_scale);
    }
    datt = Tensor();
    s.att = Tensor();
    s.qkv = Tensor();
    s.lse = Tensor();
    // dq and dk rotated back. A quantized qkv linear takes its dY from the same pass
    // (rope_bwd_quantize; dqkv is rewritten in bf16 only for the clip statistics).
    const bool qkv_quantized = precision(lin0).recipe != Recipe::kBF16;
    QuantizedTensor dqkvq;
    if (qkv_quantized) {
      const TensorView d4 = dqkv.view().reshape({B, T, H + 2 * Hkv, Dh});
      rope_bwd_quantize(ctx, collect_stats ? d4 : TensorView(), d4, H + Hkv, rope_rows(T),
                        bind(precision(lin0).dy, lin0, 2, true, true), dqkvq);
    } else {
      const TensorView dqk = heads_view(dqkv, B, T, 0, H + Hkv, Dh);  // dq and dk, adjacent
      rope_bwd(ctx, dqk, dqk, rope_rows(T));
    }
    // As for gate_up: a quantized qkv linear without its input's columnwise copy gets it from the
    // norm backward, which also quantizes dx as the previous block's down-linear dY.
    const bool qkv_input_from_norm = qkv_quantized && !s.lin[0].xq.has_columnwise();
    if (qkv_input_from_norm) {
      record_clip_stats(lin0, 2, dqkv, dqkvq);
      linear_dgrad_first(lin0, dqkvq, dln.view());
    } else {
      recompute_wgrad_input(l, 0, s);
      linear_bwd(lin0 + 0, dqkv, s.lin[0], &dln.view(), qkv_quantized ? &dqkvq : nullptr);
      s.lin[0] = {};
    }
    dqkv = Tensor();
    // dx now d(x_in).
    norm_bwd(p_layer(l, 0), s.x_in, s.rstd1, dln, dx, true, l > 0 ? lin0 - 1 : -1, lin0, &s.lin[0]);
    if (qkv_input_from_norm) linear_wgrad_after(lin0, dqkvq, s.lin[0]);
    s = BlockSaved();
  }

  Tensor upload_i32(const TensorView& t, int64_t n) {
    LOWBIT_USER_CHECK(t.dtype == DType::kI32 && t.numel() == n && t.is_contiguous(),
                      "expected {} contiguous int32 token ids, got {}", n, t.str());
    if (dev.is_cuda() && (t.device.is_cpu() || t.device == dev)) {
      // Queued on the stream (host ids through pinned staging): the host goes on launching.
      Tensor out = Tensor::empty(t.shape, DType::kI32, dev, MemCategory::kActivations);
      uploads.copy(ctx, t, out.view());
      return out;
    }
    return Tensor::copy_of(t, dev, MemCategory::kActivations);
  }

  // The whole forward (and backward when grad_scale > 0) of one micro-batch.
  StepStats run(const TensorView& tokens_in, const TensorView* targets_in, int B, int T,
                float grad_scale, const ForwardOptions& opt) {
    LOWBIT_USER_CHECK(B > 0 && T > 0, "batch and sequence length must be positive (got {}×{})", B,
                      T);
    LOWBIT_USER_CHECK(T <= cfg.max_seq_len, "sequence length {} exceeds the model's max_seq_len {}",
                      T, cfg.max_seq_len);
    const int64_t N = int64_t(B) * T, D = cfg.d_model, V = cfg.vocab_size;
    const bool backward = grad_scale > 0;
    recompute_inputs = opt.recompute_quantized_inputs;
    recompute_weights = opt.recompute_quantized_weights;
    recompute_upto = opt.recomputed_blocks(plan.recipe, cfg.n_layers);
    collect_stats = opt.collect_quant_stats;
    overwrite_grads = backward && opt.overwrite_linear_grads;
    grad_written.assign(static_cast<size_t>(num_linears() + 1), 0);
    norm_written.assign(arena.params().size(), 0);
    pending_dy = QuantizedTensor();  // nothing carries over from an interrupted pass
    pending_dy_lin = -1;
    Tensor tokens = upload_i32(tokens_in, N);
    Tensor x = act({N, D}, adt, dev);
    // With a backward to come, the forward also sorts the tokens for it ([2, N] i32): on the GPU
    // the sort hides under the gather instead of heading the backward.
    Tensor sort_plan = backward ? act({2, N}, DType::kI32, dev) : Tensor();
    embedding_fwd(ctx, x, tokens.view().reshape({N}), param(p_embed), sort_plan.view());
    std::vector<BlockSaved> saved(backward ? cfg.n_layers : 0);
    for (int l = 0; l < cfg.n_layers; ++l) {
      BlockSaved* s = backward ? &saved[l] : nullptr;
      Tensor out = block_fwd(l, x, B, T, s);
      if (s && opt.activation_checkpointing) {
        BlockSaved keep;
        keep.x_in = x;
        *s = std::move(keep);
      }
      x = std::move(out);
    }
    // Final norm and the chunked head + cross-entropy.
    const NvtxRange head_range("head + loss");
    Tensor rstdf = act({N}, DType::kF32, dev);
    Tensor lnf = act({N, D}, adt, dev);
    rmsnorm_fwd(ctx, lnf, rstdf, x, param(p_norm), cfg.norm_eps);
    StepStats st;
    if (targets_in == nullptr) return st;
    Tensor targets = upload_i32(*targets_in, N);
    Tensor losses = act({N}, DType::kF32, dev);
    Tensor dlnf;
    if (backward) dlnf = act({N, D}, adt, dev);
    const int64_t chunk = std::max<int64_t>(16, std::min<int64_t>(N, opt.loss_chunk_rows));
    Tensor logits = act({chunk, V}, adt, dev);
    const int head = head_index();
    LinearSaved head_saved;
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
      const int64_t n = std::min(chunk, N - r0);
      const TensorView lg = rows(logits, 0, n);
      const TensorView x_rows = rows(lnf, r0, n);
      linear_fwd(head, x_rows, nullptr, lg, backward ? &head_saved : nullptr);
      const TensorView tg(static_cast<int32_t*>(targets.data()) + r0, DType::kI32, Shape{n}, dev);
      const TensorView ls = rows(losses.view().reshape({N, 1}), r0, n).reshape({n});
      cross_entropy_fwd_bwd(ctx, ls, backward ? &lg : nullptr, lg, tg, -1, grad_scale);
      if (backward) {
        const TensorView dx_rows = rows(dlnf, r0, n);
        linear_bwd(head, lg, head_saved, &dx_rows);
        head_saved = {};
      }
    }
    logits = Tensor();
    // Loss: per-token losses summed in f64 on the host over the valid targets, now or (deferred)
    // by the caller after its end-of-step wait.
    if (opt.defer_loss_read) {
      st.losses = losses;
      st.targets = targets;
    } else {
      std::vector<float> lh(static_cast<size_t>(N));
      std::vector<int32_t> th(static_cast<size_t>(N));
      ctx.read_back({{losses.view(), lh.data()}, {targets.view(), th.data()}});
      st.add_losses(lh.data(), th.data(), N);
    }
    if (!backward) return st;
    Tensor dx = act({N, D}, adt, dev);
    // dx = the final norm's input gradient, quantized as the last down linear's dY when that
    // linear is.
    norm_bwd(p_norm, x, rstdf, dlnf, dx, false, num_linears() - 1, -1, nullptr);
    dlnf = Tensor();
    lnf = Tensor();
    x = Tensor();
    for (int l = cfg.n_layers - 1; l >= 0; --l) {
      BlockSaved& s = saved[l];
      if (!s.complete) {  // activation checkpointing: recompute the block's forward
        Tensor x_in = s.x_in;
        const bool collecting = collect_stats;  // the forward already counted this block
        const int dropping = recompute_upto;    // keep what this recompute makes
        collect_stats = false;
        recompute_upto = 0;
        block_fwd(l, x_in, B, T, &s);
        collect_stats = collecting;
        recompute_upto = dropping;
      }
      block_bwd(l, s, dx, B, T);
    }
    embedding_bwd(ctx, arena.grad(p_embed), tokens.view().reshape({N}), dx, sort_plan.view());
    if (collect_stats) w_stats_done = true;
    return st;
  }
};

LlamaModel::LlamaModel(const ModelConfig& cfg, const PrecisionPlan& plan, Context& ctx,
                       DType activation_dtype)
    : cfg_(cfg), plan_(plan), ctx_(ctx) {
  LOWBIT_USER_CHECK(
      activation_dtype == DType::kBF16 ||
          (activation_dtype == DType::kF32 && !ctx.on_gpu() && plan.recipe == Recipe::kBF16),
      "f32 activations are the CPU reference mode of the bf16 recipe");
  cfg_.validate();
  LOWBIT_USER_CHECK(static_cast<int>(plan_.linears.size()) == cfg_.n_layers * kLinearsPerBlock,
                    "precision plan has {} linears, the model {}", plan_.linears.size(),
                    cfg_.n_layers * kLinearsPerBlock);
  // A linear's weight keeps a bf16 compute copy only when some GEMM reads it in bf16: bf16
  // linears, and the embedding / head (the embedding lookup and generation read them in bf16).
  // Quantized block linears are quantized from the f32 master, rounded to bf16 on load.
  const std::function<bool(const std::string&)> keeps_compute = [this](const std::string& name) {
    static const std::pair<const char*, LinearKind> kinds[] = {
        {".self_attn.q_proj.", LinearKind::kQKV}, {".self_attn.k_proj.", LinearKind::kQKV},
        {".self_attn.v_proj.", LinearKind::kQKV}, {".self_attn.o_proj.", LinearKind::kProj},
        {".mlp.gate_proj.", LinearKind::kGateUp}, {".mlp.up_proj.", LinearKind::kGateUp},
        {".mlp.down_proj.", LinearKind::kDown}};
    int layer = -1;
    if (std::sscanf(name.c_str(), "model.layers.%d.", &layer) != 1) return true;
    for (const auto& [part, kind] : kinds) {
      if (name.find(part) == std::string::npos) continue;
      const int lin = layer * kLinearsPerBlock + static_cast<int>(kind);
      return plan_.linears[static_cast<size_t>(lin)].recipe == Recipe::kBF16;
    }
    return true;  // norms
  };
  arena_ = std::make_unique<ParamArena>(cfg_, ctx.device(), keeps_compute);
  impl_ = std::make_unique<Impl>(ctx_, cfg_, plan_, *arena_);
  Impl& m = *impl_;
  m.adt = activation_dtype;
  m.p_embed = arena_->find("model.embed_tokens.weight");
  m.p_norm = arena_->find("model.norm.weight");
  m.p_head = cfg_.tie_embeddings ? m.p_embed : arena_->find("lm_head.weight");
  m.rope = Tensor::empty({cfg_.max_seq_len, cfg_.head_dim() / 2, 2}, DType::kF32, ctx.device(),
                         MemCategory::kOther);
  rope_table(ctx, m.rope, cfg_.rope);
  bool any_fp8 = plan_.head.recipe == Recipe::kFP8;
  for (const LinearPrecision& p : plan_.linears) any_fp8 |= p.recipe == Recipe::kFP8;
  if (any_fp8) {
    DelayedScalingConfig dc;
    dc.format = plan_.overrides.fp8_format;
    dc.history_len = plan_.overrides.amax_history_len;
    dc.algo = plan_.overrides.amax_compute_algo;
    dc.margin = plan_.overrides.fp8_margin;
    const int nlin = m.num_linears() + 1;
    m.fwd_state =
        std::make_unique<DelayedScalingState>(dc, ScalingPass::kForward, 2 * nlin, ctx.device());
    m.bwd_state =
        std::make_unique<DelayedScalingState>(dc, ScalingPass::kBackward, nlin, ctx.device());
  }
}

LlamaModel::~LlamaModel() = default;

DelayedScalingState* LlamaModel::fp8_forward_state() const { return impl_->fwd_state.get(); }
DelayedScalingState* LlamaModel::fp8_backward_state() const { return impl_->bwd_state.get(); }

void LlamaModel::init_weights(uint64_t seed) {
  const ParamArena& a = *arena_;
  Tensor host = Tensor::zeros({a.size()}, DType::kF32, Device::cpu());
  float* p = host.ptr<float>();
  const float std_out = 0.02f / std::sqrt(2.0f * cfg_.n_layers);
  // Each element depends only on (seed, its arena index): the work splits over threads freely.
  auto fill = [&](const ParamInfo& info, int64_t begin, int64_t end) {
    if (info.shape.ndim == 1) {  // norm weights
      for (int64_t i = begin; i < end; ++i) p[info.offset + i] = 1.0f;
      return;
    }
    const bool out_proj = info.name.find("o_proj") != std::string::npos ||
                          info.name.find("down_proj") != std::string::npos;
    const float sd = out_proj ? std_out : 0.02f;
    // Box-Muller over Philox words keyed by the element's arena index.
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t idx = static_cast<uint64_t>(info.offset + i);
      const uint32_t u1 = philox_uint32(seed, 0x1417, 2 * idx);
      const uint32_t u2 = philox_uint32(seed, 0x1417, 2 * idx + 1);
      const double a1 = (u1 + 0.5) * (1.0 / 4294967296.0);
      const double a2 = (u2 + 0.5) * (1.0 / 4294967296.0);
      const double z = std::sqrt(-2.0 * std::log(a1)) * std::cos(6.283185307179586 * a2);
      p[info.offset + i] = static_cast<float>(z * sd);
    }
  };
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 32u));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (const ParamInfo& info : a.params()) {
        const int64_t n = info.shape.numel();
        fill(info, n * t / threads, n * (t + 1) / threads);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  copy_tensor(a.master_all, host);
  fill_bytes(a.grad_all, 0);
  fill_bytes(a.m_all, 0);
  fill_bytes(a.v_all, 0);
  sync_compute_weights();
}

void LlamaModel::sync_compute_weights() {
  arena_->sync_compute(ctx_);
  impl_->weights_changed();
}

void LlamaModel::weights_changed() { impl_->weights_changed(); }

TensorView LlamaModel::bf16_weight(int lin) { return impl_->bf16_weight(lin); }

std::vector<std::array<LlamaModel::QuantStats, 3>> LlamaModel::quant_stats() const {
  const Impl& m = *impl_;
  std::vector<std::array<QuantStats, 3>> out(static_cast<size_t>(m.num_linears() + 1));
  if (!m.stats_counts.defined()) return out;
  const Tensor host = Tensor::copy_of(m.stats_counts, Device::cpu());
  const int64_t* c = host.ptr<int64_t>();
  for (size_t lin = 0; lin < out.size(); ++lin) {
    for (size_t w = 0; w < 3; ++w) {
      const size_t slot = lin * 3 + w;
      out[lin][w] = {c[2 * slot], c[2 * slot + 1], m.stats_numel[slot]};
    }
  }
  return out;
}

void LlamaModel::reset_quant_stats() {
  Impl& m = *impl_;
  if (m.stats_counts.defined()) {
    fill_bytes(m.stats_counts, 0);
    std::fill(m.stats_numel.begin(), m.stats_numel.end(), 0);
  }
  m.w_stats_done = false;
}

void StepStats::add_losses(const float* loss, const int32_t* target, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (target[i] < 0) continue;
    loss_sum += loss[i];
    ++valid_tokens;
  }
}

StepStats LlamaModel::forward_backward(const TensorView& tokens, const TensorView& targets,
                                       int batch, int seq_len, float grad_scale,
                                       const ForwardOptions& opt) {
  LOWBIT_USER_CHECK(grad_scale > 0, "forward_backward needs a positive grad_scale");
  return impl_->run(tokens, &targets, batch, seq_len, grad_scale, opt);
}

void LlamaModel::zero_grads(bool except_overwritten) {
  ParamArena& a = *arena_;
  if (!except_overwritten) {
    fill_bytes(a.grad_all, 0);
    return;
  }
  const Impl& m = *impl_;
  std::vector<char> overwritten(a.params().size(), 0);
  for (int lin = 0; lin <= m.num_linears(); ++lin) {
    const auto [first, last] = m.weight_params(lin);
    for (int i = first; i <= last; ++i) overwritten[static_cast<size_t>(i)] = 1;
  }
  // The norms' backwards write their gradients outright as well.
  for (int l = 0; l < cfg_.n_layers; ++l) {
    overwritten[static_cast<size_t>(m.p_layer(l, 0))] = 1;
    overwritten[static_cast<size_t>(m.p_layer(l, 5))] = 1;
  }
  overwritten[static_cast<size_t>(m.p_norm)] = 1;
  // Runs of adjacent parameters (a block's norm and the alignment gaps around it) in one fill.
  const std::vector<ParamInfo>& ps = a.params();
  for (size_t i = 0; i < ps.size();) {
    if (overwritten[i]) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < ps.size() && !overwritten[j]) ++j;
    const int64_t begin = ps[i].offset, end = ps[j - 1].offset + ps[j - 1].shape.numel();
    fill_bytes(TensorView(a.grad_all.ptr<float>() + begin, DType::kF32, Shape{end - begin},
                          a.grad_all.device()),
               0);
    i = j;
  }
}

StepStats LlamaModel::forward_loss(const TensorView& tokens, const TensorView& targets, int batch,
                                   int seq_len) {
  ForwardOptions opt;
  opt.training = false;
  return impl_->run(tokens, &targets, batch, seq_len, 0.0f, opt);
}

std::vector<float> LlamaModel::last_logits(const TensorView& tokens, int batch, int seq_len) {
  // The forward up to the final norm, then the head on the last row of each sequence.
  Impl& m = *impl_;
  const int64_t N = int64_t(batch) * seq_len, D = cfg_.d_model, V = cfg_.vocab_size;
  Tensor tok = m.upload_i32(tokens, N);
  Tensor x = act({N, D}, m.adt, ctx_.device());
  embedding_fwd(ctx_, x, tok.view().reshape({N}), m.param(m.p_embed));
  for (int l = 0; l < cfg_.n_layers; ++l) x = m.block_fwd(l, x, batch, seq_len, nullptr);
  Tensor rstd = act({N}, DType::kF32, ctx_.device());
  Tensor lnf = act({N, D}, m.adt, ctx_.device());
  rmsnorm_fwd(ctx_, lnf, rstd, x, m.param(m.p_norm), cfg_.norm_eps);
  // Gather the last rows: [B, D].
  Tensor last = act({batch, D}, m.adt, ctx_.device());
  for (int b = 0; b < batch; ++b) {
    const TensorView src = rows(lnf, int64_t(b) * seq_len + seq_len - 1, 1);
    const TensorView dst = rows(last, b, 1);
    if (ctx_.on_gpu()) {
      copy_tensor(dst, src);
    } else {
      std::memcpy(dst.data, src.data, static_cast<size_t>(src.nbytes()));
    }
  }
  // The head in bf16 (V may not suit the quantized GEMMs' alignment for one row).
  Tensor logits = act({batch, V}, DType::kF32, ctx_.device());
  gemm(ctx_, GemmOperand::of(last), GemmOperand::of(m.param(m.p_head)), logits, {});
  Tensor host = Tensor::copy_of(logits, Device::cpu());
  return std::vector<float>(host.ptr<float>(), host.ptr<float>() + batch * V);
}

void ForwardOptions::set_recompute_from_name(const std::string& name) {
  if (name == "auto" || name == "on" || name == "off") {
    recompute_block_outputs = name == "auto" ? Recompute::kAuto
                              : name == "on" ? Recompute::kOn
                                             : Recompute::kOff;
    recompute_first_blocks = 0;
    return;
  }
  const bool digits =
      !name.empty() && name.size() <= 6 &&
      std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    throw UserError(fmt::format(
        "unknown recompute setting '{}': use auto (every block for nvfp4, the first ⌈L/16⌉ for "
        "the other quantized recipes), on, off, or a number of leading blocks",
        name));
  }
  recompute_block_outputs = Recompute::kFirst;
  recompute_first_blocks = std::stoi(name);
}

int ForwardOptions::recomputed_blocks(Recipe plan_recipe, int n_layers) const {
  switch (recompute_block_outputs) {
    case Recompute::kOn: return n_layers;
    case Recompute::kOff: return 0;
    case Recompute::kFirst: return std::clamp(recompute_first_blocks, 0, n_layers);
    case Recompute::kAuto: break;
  }
  if (plan_recipe == Recipe::kNVFP4) return n_layers;
  if (plan_recipe == Recipe::kBF16) return 0;
  return std::min(n_layers, (n_layers + 15) / 16);
}

}  // namespace lowbit

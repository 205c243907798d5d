// swiglu_fwd / swiglu_bwd: argument checks and dispatch by device.
#include "lowbit/ops.h"
#include "ops/ops_check.h"
#include "ops/quant_epilogue.h"
#include "ops/swiglu_impl.h"

namespace lowbit {

using namespace ops_detail;

namespace {

// rows [N, F] (out or dout) against gate_up [N, 2F].
void check_rows(const char* op, const char* name, const TensorView& rows,
                const TensorView& gate_up) {
  check_rank(op, name, "[N, F]", rows, 2);
  check_rank(op, "gate_up", "[N, 2F]", gate_up, 2);
  check_float(op, name, rows, DType::kBF16);
  check_float(op, "gate_up", gate_up, DType::kBF16);
  LOWBIT_USER_CHECK(gate_up.size(0) == rows.size(0) && gate_up.size(1) == 2 * rows.size(1),
                    "{}: gate_up must be [N, 2F] = [{}, {}] for {} [N, F] = {}, got {}", op,
                    rows.size(0), 2 * rows.size(1), name, rows.shape.str(), gate_up.shape.str());
  check_contiguous(op, name, rows);
  check_contiguous(op, "gate_up", gate_up);
}

// The arguments of the quantizing backwards: dout [N, F] and gate_up [N, 2F] bf16, dgate_up
// like gate_up or absent.
void check_bwd_quantize(const char* op, Context& ctx, const TensorView& dgate_up,
                        const TensorView& dout, const TensorView& gate_up) {
  check_devices(op, ctx, {{"dout", &dout}, {"gate_up", &gate_up}});
  check_rows(op, "dout", dout, gate_up);
  // bf16 only (no f32 on the CPU): what is quantized is dgate_up rounded to bf16.
  check_dtype(op, "gate_up", gate_up, DType::kBF16);
  check_dtype(op, "dout", dout, DType::kBF16);
  if (!absent(dgate_up)) {
    check_devices(op, ctx, {{"dgate_up", &dgate_up}});
    check_dtype(op, "dgate_up", dgate_up, DType::kBF16);
    check_same_shape(op, "dgate_up", dgate_up, "gate_up", gate_up);
    check_contiguous(op, "dgate_up", dgate_up);
  }
}

}  // namespace

void swiglu_fwd(Context& ctx, const TensorView& out, const TensorView& gate_up) {
  const char* op = "swiglu_fwd";
  check_devices(op, ctx, {{"out", &out}, {"gate_up", &gate_up}});
  check_rows(op, "out", out, gate_up);
  if (out.numel() == 0) return;
  if (ctx.on_gpu()) {
    swiglu_fwd_cuda(ctx, out, gate_up);
  } else {
    swiglu_fwd_cpu(out, gate_up);
  }
}

void swiglu_fwd_quantize(Context& ctx, const TensorView& h, const TensorView& gate_up,
                         const QuantConfig& cfg, QuantizedTensor& out) {
  const char* op = "swiglu_fwd_quantize";
  check_devices(op, ctx, {{"gate_up", &gate_up}});
  check_rank(op, "gate_up", "[N, 2F]", gate_up, 2);
  // bf16 only (no f32 on the CPU): what is quantized is h rounded to bf16.
  check_dtype(op, "gate_up", gate_up, DType::kBF16);
  check_contiguous(op, "gate_up", gate_up);
  LOWBIT_USER_CHECK(gate_up.size(1) % 2 == 0,
                    "{}: gate_up [N, 2F] must have an even number of columns, got {}", op,
                    gate_up.str());
  if (!absent(h)) {
    check_devices(op, ctx, {{"h", &h}});
    check_rows(op, "h", h, gate_up);
    check_dtype(op, "h", h, DType::kBF16);
  }
  if (ctx.on_gpu() && fp8_delayed_fusable(cfg, ctx.device()) &&
      swiglu_fwd_quantize_cuda(ctx, h, gate_up, cfg, out)) {
    return;
  }
  // Everything else (and the CPU): the definition, step by step. quantize() validates cfg.
  swiglu_fwd_quantize_composed(ctx, h, gate_up, cfg, out);
}

void swiglu_bwd_quantize(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                         const TensorView& gate_up, const QuantConfig& cfg, QuantizedTensor& out) {
  check_bwd_quantize("swiglu_bwd_quantize", ctx, dgate_up, dout, gate_up);
  if (ctx.on_gpu() && fp8_delayed_fusable(cfg, ctx.device()) &&
      swiglu_bwd_quantize_cuda(ctx, dgate_up, dout, gate_up, cfg, out)) {
    return;
  }
  // Everything else (and the CPU): the definition, step by step. quantize() validates cfg.
  swiglu_bwd_quantize_composed(ctx, dgate_up, dout, gate_up, cfg, out);
}

void swiglu_bwd_quantize_with_h(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                                const TensorView& gate_up, const QuantConfig& cfg,
                                QuantizedTensor& out, const QuantConfig& h_cfg,
                                QuantizedTensor& h_out) {
  const char* op = "swiglu_bwd_quantize_with_h";
  check_bwd_quantize(op, ctx, dgate_up, dout, gate_up);
  LOWBIT_USER_CHECK(&out != &h_out, "{}: out and h_out must be different tensors", op);
  if (ctx.on_gpu() && fp8_delayed_fusable(cfg, ctx.device()) &&
      fp8_delayed_fusable(h_cfg, ctx.device()) &&
      swiglu_bwd_quantize_cuda(ctx, dgate_up, dout, gate_up, cfg, out, &h_cfg, &h_out)) {
    return;
  }
  // Everything else (and the CPU): the definition, the two ops one after the other.
  swiglu_fwd_quantize(ctx, TensorView(), gate_up, h_cfg, h_out);
  swiglu_bwd_quantize(ctx, dgate_up, dout, gate_up, cfg, out);
}

void swiglu_bwd(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                const TensorView& gate_up) {
  const char* op = "swiglu_bwd";
  check_devices(op, ctx, {{"dgate_up", &dgate_up}, {"dout", &dout}, {"gate_up", &gate_up}});
  check_rows(op, "dout", dout, gate_up);
  check_float(op, "dgate_up", dgate_up, DType::kBF16);
  check_same_shape(op, "dgate_up", dgate_up, "gate_up", gate_up);
  check_contiguous(op, "dgate_up", dgate_up);
  if (dout.numel() == 0) return;
  if (ctx.on_gpu()) {
    swiglu_bwd_cuda(ctx, dgate_up, dout, gate_up);
  } else {
    swiglu_bwd_cpu(dgate_up, dout, gate_up);
  }
}

}  // namespace lowbit

// rmsnorm_fwd / rmsnorm_bwd: argument checks and dispatch by device.
#include <cmath>

#include "lowbit/ops.h"
#include "ops/ops_check.h"
#include "ops/quant_epilogue.h"
#include "ops/rmsnorm_impl.h"

namespace lowbit {

using namespace ops_detail;

namespace {

// x [N, D] and w [D], shared by both directions.
void check_x_w(const char* op, const TensorView& x, const TensorView& w) {
  check_rank(op, "x", "[N, D]", x, 2);
  check_rank(op, "w", "[D]", w, 1);
  check_float(op, "x", x, DType::kBF16);
  check_float(op, "w", w, DType::kBF16);
  LOWBIT_USER_CHECK(w.size(0) == x.size(1), "{}: w [D] has {} elements but x [N, D] has D = {}", op,
                    w.size(0), x.size(1));
  check_contiguous(op, "x", x);
  check_contiguous(op, "w", w);
}

void check_rstd(const char* op, const TensorView& rstd, const TensorView& x) {
  check_rank(op, "rstd", "[N]", rstd, 1);
  check_dtype(op, "rstd", rstd, DType::kF32);
  LOWBIT_USER_CHECK(rstd.size(0) == x.size(0),
                    "{}: rstd [N] has {} entries but x [N, D] has N = {} rows", op, rstd.size(0),
                    x.size(0));
  check_contiguous(op, "rstd", rstd);
}

}  // namespace

void rmsnorm_fwd(Context& ctx, const TensorView& out, const TensorView& rstd, const TensorView& x,
                 const TensorView& w, float eps) {
  const char* op = "rmsnorm_fwd";
  check_devices(op, ctx, {{"out", &out}, {"rstd", &rstd}, {"x", &x}, {"w", &w}});
  check_x_w(op, x, w);
  check_float(op, "out", out, DType::kBF16);
  check_same_shape(op, "out", out, "x", x);
  check_contiguous(op, "out", out);
  check_rstd(op, rstd, x);
  LOWBIT_USER_CHECK(std::isfinite(eps) && eps >= 0.0f,
                    "{}: eps must be finite and non-negative, got {}", op, eps);
  LOWBIT_USER_CHECK(x.size(1) > 0 || x.size(0) == 0, "{}: x {} has rows of width 0", op, x.str());
  if (x.numel() == 0) return;
  if (ctx.on_gpu()) {
    rmsnorm_fwd_cuda(ctx, out, rstd, x, w, eps);
  } else {
    rmsnorm_fwd_cpu(out, rstd, x, w, eps);
  }
}

void rmsnorm_fwd_quantize(Context& ctx, const TensorView& y, const TensorView& rstd,
                          const TensorView& x, const TensorView& w, float eps,
                          const QuantConfig& cfg, QuantizedTensor& out) {
  const char* op = "rmsnorm_fwd_quantize";
  const bool has_y = !absent(y), has_rstd = !absent(rstd);
  check_devices(op, ctx, {{"x", &x}, {"w", &w}});
  if (has_y) check_devices(op, ctx, {{"y", &y}});
  if (has_rstd) check_devices(op, ctx, {{"rstd", &rstd}});
  check_x_w(op, x, w);
  // bf16 only (no f32 on the CPU): what is quantized is y rounded to bf16.
  check_dtype(op, "x", x, DType::kBF16);
  check_dtype(op, "w", w, DType::kBF16);
  if (has_y) {
    check_dtype(op, "y", y, DType::kBF16);
    check_same_shape(op, "y", y, "x", x);
    check_contiguous(op, "y", y);
  }
  if (has_rstd) check_rstd(op, rstd, x);
  LOWBIT_USER_CHECK(std::isfinite(eps) && eps >= 0.0f,
                    "{}: eps must be finite and non-negative, got {}", op, eps);
  LOWBIT_USER_CHECK(x.size(1) > 0 || x.size(0) == 0, "{}: x {} has rows of width 0", op, x.str());
  if (ctx.on_gpu() && fp8_delayed_fusable(cfg, ctx.device()) &&
      rmsnorm_fwd_quantize_cuda(ctx, y, rstd, x, w, eps, cfg, out)) {
    return;
  }
  // Everything else (and the CPU): the definition, step by step. quantize() validates cfg.
  rmsnorm_fwd_quantize_composed(ctx, y, rstd, x, w, eps, cfg, out);
}

namespace {

// The arguments of both backwards.
void check_bwd(const char* op, Context& ctx, const TensorView& dx, const TensorView& dw,
               const TensorView& dout, const TensorView& x, const TensorView& w,
               const TensorView& rstd, const TensorView& residual) {
  check_devices(op, ctx,
                {{"dx", &dx}, {"dw", &dw}, {"dout", &dout}, {"x", &x}, {"w", &w}, {"rstd", &rstd}});
  check_x_w(op, x, w);
  check_float(op, "dx", dx, DType::kBF16);
  check_float(op, "dout", dout, DType::kBF16);
  check_same_shape(op, "dx", dx, "x", x);
  check_same_shape(op, "dout", dout, "x", x);
  check_contiguous(op, "dx", dx);
  check_contiguous(op, "dout", dout);
  check_rank(op, "dw", "[D]", dw, 1);
  check_dtype(op, "dw", dw, DType::kF32);
  check_same_shape(op, "dw", dw, "w", w);
  check_contiguous(op, "dw", dw);
  check_rstd(op, rstd, x);
  if (!absent(residual)) {
    check_devices(op, ctx, {{"residual", &residual}});
    check_float(op, "residual", residual, DType::kBF16);
    check_same_shape(op, "residual", residual, "x", x);
    check_contiguous(op, "residual", residual);
  }
}

}  // namespace

void rmsnorm_bwd(Context& ctx, const TensorView& dx, const TensorView& dw, const TensorView& dout,
                 const TensorView& x, const TensorView& w, const TensorView& rstd,
                 const TensorView& residual, bool accumulate_dw) {
  check_bwd("rmsnorm_bwd", ctx, dx, dw, dout, x, w, rstd, residual);
  if (x.numel() == 0) {
    if (!accumulate_dw) fill_bytes(dw, 0);  // the sum over no rows
    return;
  }
  if (ctx.on_gpu()) {
    rmsnorm_bwd_cuda(ctx, dx, dw, dout, x, w, rstd, residual, accumulate_dw);
  } else {
    rmsnorm_bwd_cpu(dx, dw, dout, x, w, rstd, residual, accumulate_dw);
  }
}

void rmsnorm_bwd_quantize(Context& ctx, const TensorView& dx, const TensorView& dw,
                          const TensorView& dout, const TensorView& x, const TensorView& w,
                          const TensorView& rstd, const TensorView& residual, float eps,
                          const QuantConfig* dx_cfg, QuantizedTensor* dx_out,
                          const QuantConfig* y_cfg, QuantizedTensor* y_out, bool accumulate_dw) {
  const char* op = "rmsnorm_bwd_quantize";
  check_bwd(op, ctx, dx, dw, dout, x, w, rstd, residual);
  // bf16 only (no f32 on the CPU): what is quantized is dx (and y) rounded to bf16.
  check_dtype(op, "x", x, DType::kBF16);
  check_dtype(op, "dx", dx, DType::kBF16);
  LOWBIT_USER_CHECK((dx_cfg == nullptr) == (dx_out == nullptr),
                    "{}: dx_cfg and dx_out go together (both given or both null)", op);
  LOWBIT_USER_CHECK((y_cfg == nullptr) == (y_out == nullptr),
                    "{}: y_cfg and y_out go together (both given or both null)", op);
  LOWBIT_USER_CHECK(dx_cfg != nullptr || y_cfg != nullptr,
                    "{}: asks for no quantized output; call rmsnorm_bwd", op);
  LOWBIT_USER_CHECK(dx_out == nullptr || dx_out != y_out,
                    "{}: dx_out and y_out must be different tensors", op);
  LOWBIT_USER_CHECK(std::isfinite(eps) && eps >= 0.0f,
                    "{}: eps must be finite and non-negative, got {}", op, eps);
  const Device dev = ctx.device();
  if (ctx.on_gpu() && x.numel() > 0 && (dx_cfg == nullptr || fp8_delayed_fusable(*dx_cfg, dev)) &&
      (y_cfg == nullptr || fp8_delayed_fusable(*y_cfg, dev)) &&
      rmsnorm_bwd_quantize_cuda(ctx, dx, dw, dout, x, w, rstd, residual, eps, dx_cfg, dx_out, y_cfg,
                                y_out, accumulate_dw)) {
    return;
  }
  // Everything else (and the CPU): the definition, the steps in turn.
  if (y_cfg != nullptr)
    rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x, w, eps, *y_cfg, *y_out);
  rmsnorm_bwd(ctx, dx, dw, dout, x, w, rstd, residual, accumulate_dw);
  if (dx_cfg != nullptr) quantize(ctx, dx, *dx_cfg, *dx_out);
}

}  // namespace lowbit

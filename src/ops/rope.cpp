// rope_table / rope_fwd / rope_bwd: argument checks and dispatch by device.
#include <cmath>
#include <vector>

#include "lowbit/ops.h"
#include "ops/ops_check.h"
#include "ops/quant_epilogue.h"
#include "ops/rope_impl.h"

namespace lowbit {

using namespace ops_detail;

namespace {

// Bytes [first, last) spanned by a strided view with non-negative strides.
std::pair<const char*, const char*> byte_span(const TensorView& t) {
  int64_t last = 0;
  for (int i = 0; i < t.ndim(); ++i) last += (t.shape[i] - 1) * t.strides[i];
  const int64_t es = dtype_bits(t.dtype) / 8;
  const char* p = static_cast<const char*>(t.data);
  return {p, p + (last + 1) * es};
}

void check_head_view(const char* op, const char* name, const TensorView& t) {
  check_rank(op, name, "[B, T, nH, Dh]", t, 4);
  check_float(op, name, t, DType::kBF16);
  LOWBIT_USER_CHECK(t.strides[3] == 1 || t.shape[3] <= 1,
                    "{}: the last dim (Dh) of {} must be contiguous, got strides {}", op, name,
                    t.strides.str());
  for (int i = 0; i < 3; ++i) {
    LOWBIT_USER_CHECK(t.strides[i] >= 0, "{}: {} has a negative stride ({})", op, name,
                      t.strides.str());
  }
}

// The checks of rope_apply: views, table, aliasing.
void rope_apply_checks(const char* op, const char* yname, const char* xname, Context& ctx,
                       const TensorView& y, const TensorView& x, const TensorView& table) {
  check_devices(op, ctx, {{yname, &y}, {xname, &x}, {"table", &table}});
  check_head_view(op, xname, x);
  check_head_view(op, yname, y);
  check_same_shape(op, yname, y, xname, x);
  const int64_t dh = x.size(3);
  LOWBIT_USER_CHECK(dh % 2 == 0, "{}: the head dim Dh = {} of {} must be even", op, dh, xname);
  check_rank(op, "table", "[T, Dh/2, 2]", table, 3);
  check_dtype(op, "table", table, DType::kF32);
  check_contiguous(op, "table", table);
  LOWBIT_USER_CHECK(table.size(1) == dh / 2 && table.size(2) == 2,
                    "{}: table {} does not match Dh = {} of {}; it must be [T, {}, 2]", op,
                    table.shape.str(), dh, xname, dh / 2);
  LOWBIT_USER_CHECK(table.size(0) >= x.size(1),
                    "{}: table has {} positions but {} has T = {}; build it with rope_table for "
                    "at least T positions",
                    op, table.size(0), xname, x.size(1));
  if (x.numel() == 0) return;
  if (y.data == x.data) {
    LOWBIT_USER_CHECK(y.strides == x.strides && y.dtype == x.dtype,
                      "{}: {} and {} share storage but are different views; in place they must "
                      "be the same view",
                      op, yname, xname);
  } else {
    const auto [y0, y1] = byte_span(y);
    const auto [x0, x1] = byte_span(x);
    LOWBIT_USER_CHECK(y1 <= x0 || x1 <= y0,
                      "{}: {} and {} overlap without being the same view; write to separate "
                      "storage or in place",
                      op, yname, xname);
  }
}

// y = x rotated (sign = +1) or rotated back (sign = −1).
void rope_apply(const char* op, const char* yname, const char* xname, Context& ctx,
                const TensorView& y, const TensorView& x, const TensorView& table, float sign) {
  rope_apply_checks(op, yname, xname, ctx, y, x, table);
  if (x.numel() == 0) return;
  if (ctx.on_gpu()) {
    rope_apply_cuda(ctx, y, x, table, sign);
  } else {
    rope_apply_cpu(y, x, table, sign);
  }
}

}  // namespace

void rope_table(Context& ctx, const TensorView& table, const RopeConfig& cfg) {
  const char* op = "rope_table";
  check_devices(op, ctx, {{"table", &table}});
  check_rank(op, "table", "[T, Dh/2, 2]", table, 3);
  check_dtype(op, "table", table, DType::kF32);
  check_contiguous(op, "table", table);
  LOWBIT_USER_CHECK(table.size(2) == 2 && table.size(1) > 0,
                    "{}: table must be [T, Dh/2, 2] with Dh/2 > 0, got {}", op, table.shape.str());
  LOWBIT_USER_CHECK(std::isfinite(cfg.theta) && cfg.theta > 1.0f,
                    "{}: theta must be finite and > 1, got {}", op, cfg.theta);
  if (cfg.factor > 1.0f) {
    LOWBIT_USER_CHECK(
        std::isfinite(cfg.factor) && cfg.low_freq_factor > 0.0f &&
            cfg.high_freq_factor > cfg.low_freq_factor && cfg.original_max_positions > 0,
        "{}: LLaMA-3 scaling needs 0 < low_freq_factor < high_freq_factor and "
        "original_max_positions > 0, got factor {}, low_freq_factor {}, "
        "high_freq_factor {}, original_max_positions {}",
        op, cfg.factor, cfg.low_freq_factor, cfg.high_freq_factor, cfg.original_max_positions);
  }
  const int64_t positions = table.size(0), head_dim = 2 * table.size(1);
  if (table.device.is_cpu()) {
    rope_table_host(table.ptr<float>(), positions, head_dim, cfg);
    return;
  }
  // Filled on the host (f64 math, one rounding), then copied: identical on every device.
  std::vector<float> host(size_t(table.numel()));
  rope_table_host(host.data(), positions, head_dim, cfg);
  copy_tensor(table, TensorView(host.data(), DType::kF32, table.shape, Device::cpu()));
}

void rope_fwd(Context& ctx, const TensorView& y, const TensorView& x, const TensorView& table) {
  rope_apply("rope_fwd", "y", "x", ctx, y, x, table, 1.0f);
}

void rope_bwd(Context& ctx, const TensorView& dx, const TensorView& dy, const TensorView& table) {
  rope_apply("rope_bwd", "dx", "dy", ctx, dx, dy, table, -1.0f);
}

void rope_bwd_quantize(Context& ctx, const TensorView& dx, const TensorView& dy, int64_t n_rot,
                       const TensorView& table, const QuantConfig& cfg, QuantizedTensor& out) {
  const char* op = "rope_bwd_quantize";
  const bool has_dx = !absent(dx);
  // rope_bwd's checks (devices, head views, table, dx against dy and their aliasing), whichever
  // path runs; then what the quantization adds: bf16 (no f32 on the CPU: what is quantized is
  // dx rounded to bf16) and whole contiguous tensors.
  rope_apply_checks(op, "dx", "dy", ctx, has_dx ? dx : dy, dy, table);
  check_dtype(op, "dy", dy, DType::kBF16);
  check_contiguous(op, "dy", dy);
  if (has_dx) {
    check_dtype(op, "dx", dx, DType::kBF16);
    check_contiguous(op, "dx", dx);
  }
  const int64_t nh = dy.size(2);
  LOWBIT_USER_CHECK(n_rot >= 0 && n_rot <= nh,
                    "{}: n_rot = {} rotated heads, but dy has nH = {} heads", op, n_rot, nh);
  const int64_t B = dy.size(0), T = dy.size(1), dh = dy.size(3);
  if (ctx.on_gpu() && dy.numel() > 0 && fp8_delayed_fusable(cfg, ctx.device()) &&
      rope_bwd_quantize_cuda(ctx, dx, dy, n_rot, table, cfg, out)) {
    return;
  }
  // Everything else (and the CPU): the definition, the steps in turn (into a scratch copy of dy
  // when dx is absent).
  Tensor scratch;
  TensorView d = dx;
  if (!has_dx) {
    scratch = Tensor::empty(dy.shape, DType::kBF16, dy.device, MemCategory::kWorkspace);
    d = scratch.view();  // [B, T, nH, Dh]
  }
  if (d.data != dy.data) copy_tensor(d, dy);
  if (n_rot > 0) {
    const TensorView rot(d.data, DType::kBF16, Shape{B, T, n_rot, dh}, d.strides,
                         d.device);  // [B, T, n_rot, Dh], strided
    rope_bwd(ctx, rot, rot, table);
  }
  quantize(ctx, d.reshape({B * T, nh * dh}), cfg, out);
}

}  // namespace lowbit

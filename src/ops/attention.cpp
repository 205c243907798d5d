// attention_fwd / attention_bwd (include/lowbit/ops.h): argument checks, then the CPU twin
// (attention_ref.cpp) or the CUDA kernels (attention.cu) by the context's device.
#include <cmath>
#include <cstdint>
#include <string>

#include "lowbit/ops.h"
#include "ops/attention_impl.h"
#include "ops/ops_check.h"
#include "ops/quant_epilogue.h"

namespace lowbit {

namespace {

// Sizes of one call, taken from q.
struct AttnShape {
  int64_t B = 0, T = 0, H = 0, Hkv = 0, Dh = 0;
};

std::string shape_str(int64_t a, int64_t b, int64_t c, int64_t d) {
  return fmt::format("[{}, {}, {}, {}]", a, b, c, d);
}

// Checks shared by every tensor of a call: device and dtype.
void check_tensor(const Context& ctx, const char* op, const char* name, const TensorView& t,
                  bool data_tensor) {
  LOWBIT_USER_CHECK(t.data != nullptr || t.numel() == 0, "{}: {} is an empty view", op, name);
  LOWBIT_USER_CHECK(t.device == ctx.device(),
                    "{}: {} is on {}, but the context runs on {}; move it to {}", op, name,
                    t.device.str(), ctx.device().str(), ctx.device().str());
  if (!data_tensor) return;
  if (ctx.on_gpu()) {
    LOWBIT_USER_CHECK(t.dtype == DType::kBF16,
                      "{}: {} is {}; attention on the GPU takes bf16 tensors (convert it)", op,
                      name, dtype_name(t.dtype));
  } else {
    LOWBIT_USER_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF32,
                      "{}: {} is {}; attention takes bf16 tensors (or f32 on the CPU)", op, name,
                      dtype_name(t.dtype));
  }
}

// A [B, T, heads, Dh] activation: shape, last dim contiguous and, on the GPU, 16-byte aligned
// rows (the kernels move rows in 16-byte pieces).
void check_heads(const Context& ctx, const char* op, const char* name, const TensorView& t,
                 const AttnShape& s, int64_t heads) {
  check_tensor(ctx, op, name, t, true);
  const bool ok = t.ndim() == 4 && t.size(0) == s.B && t.size(1) == s.T && t.size(2) == heads &&
                  t.size(3) == s.Dh;
  LOWBIT_USER_CHECK(ok, "{}: {} must be {} (B, T, {}, Dh), got {}", op, name,
                    shape_str(s.B, s.T, heads, s.Dh), heads == s.H ? "H" : "Hkv", t.str());
  ops_detail::check_heads_layout(ctx, op, name, t);
}

void check_lse(const Context& ctx, const char* op, const TensorView& lse, const AttnShape& s) {
  check_tensor(ctx, op, "lse", lse, false);
  LOWBIT_USER_CHECK(lse.dtype == DType::kF32, "{}: lse must be f32, got {}", op,
                    dtype_name(lse.dtype));
  const bool ok = lse.ndim() == 3 && lse.size(0) == s.B && lse.size(1) == s.H && lse.size(2) == s.T;
  LOWBIT_USER_CHECK(ok, "{}: lse must be [{}, {}, {}] (B, H, T), got {}", op, s.B, s.H, s.T,
                    lse.str());
  LOWBIT_USER_CHECK(lse.is_contiguous(), "{}: lse must be contiguous", op);
}

// Shapes from q and k, checked against each other; scale checked too.
AttnShape check_common(const Context& ctx, const char* op, const TensorView& q, const TensorView& k,
                       float scale) {
  LOWBIT_USER_CHECK(q.ndim() == 4, "{}: q must be 4-D [B, T, H, Dh], got {}", op, q.str());
  LOWBIT_USER_CHECK(k.ndim() == 4, "{}: k must be 4-D [B, T, Hkv, Dh], got {}", op, k.str());
  AttnShape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  LOWBIT_USER_CHECK(s.Dh == 64 || s.Dh == 128,
                    "{}: head dim Dh = {} (q {}) is not supported; attention takes Dh = 64 or 128",
                    op, s.Dh, q.str());
  LOWBIT_USER_CHECK(s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0,
                    "{}: the query heads H = {} must be a positive multiple of the kv heads Hkv = "
                    "{} (q {}, k {})",
                    op, s.H, s.Hkv, q.str(), k.str());
  LOWBIT_USER_CHECK(std::isfinite(scale) && scale > 0.0f,
                    "{}: scale must be finite and positive (typically 1/sqrt(Dh)), got {}", op,
                    scale);
  check_heads(ctx, op, "q", q, s, s.H);
  check_heads(ctx, op, "k", k, s, s.Hkv);
  return s;
}

}  // namespace

void attention_fwd(Context& ctx, const TensorView& out, const TensorView& lse, const TensorView& q,
                   const TensorView& k, const TensorView& v, float scale) {
  const char* op = "attention_fwd";
  const AttnShape s = check_common(ctx, op, q, k, scale);
  check_heads(ctx, op, "v", v, s, s.Hkv);
  check_heads(ctx, op, "out", out, s, s.H);
  check_lse(ctx, op, lse, s);
  if (s.B * s.T * s.H == 0) return;
  if (ctx.on_gpu()) {
    attn::attention_fwd_cuda(ctx, out, lse, q, k, v, scale);
  } else {
    attn::attention_fwd_ref(out, lse, q, k, v, scale);
  }
}

namespace {

// The checks of attention_bwd's arguments.
AttnShape check_bwd(const Context& ctx, const char* op, const TensorView& dq, const TensorView& dk,
                    const TensorView& dv, const TensorView& dout, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView& lse, float scale) {
  const AttnShape s = check_common(ctx, op, q, k, scale);
  check_heads(ctx, op, "v", v, s, s.Hkv);
  check_heads(ctx, op, "out", out, s, s.H);
  check_heads(ctx, op, "dout", dout, s, s.H);
  check_heads(ctx, op, "dq", dq, s, s.H);
  check_heads(ctx, op, "dk", dk, s, s.Hkv);
  check_heads(ctx, op, "dv", dv, s, s.Hkv);
  check_lse(ctx, op, lse, s);
  return s;
}

}  // namespace

void attention_bwd(Context& ctx, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const TensorView& dout, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const TensorView& lse, float scale) {
  const AttnShape s = check_bwd(ctx, "attention_bwd", dq, dk, dv, dout, q, k, v, out, lse, scale);
  if (s.B * s.T * s.H == 0) return;
  if (ctx.on_gpu()) {
    attn::attention_bwd_cuda(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale);
  } else {
    attn::attention_bwd_ref(dq, dk, dv, dout, q, k, v, out, lse, scale);
  }
}

void attention_bwd_quantize_out(Context& ctx, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const TensorView& dout, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView& lse, float scale, const QuantConfig& out_cfg,
                                QuantizedTensor& out_q) {
  const char* op = "attention_bwd_quantize_out";
  const AttnShape s = check_bwd(ctx, op, dq, dk, dv, dout, q, k, v, out, lse, scale);
  ops_detail::check_contiguous(op, "out", out);
  if (ctx.on_gpu() && s.B * s.T * s.H > 0 &&
      ops_detail::fp8_delayed_fusable(out_cfg, ctx.device()) &&
      attn::attention_bwd_quantize_out_cuda(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale,
                                            out_cfg, out_q)) {
    return;
  }
  // Everything else (and the CPU): the definition, the steps in turn.
  attention_bwd(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale);
  quantize(ctx, out.reshape({s.B * s.T, s.H * s.Dh}), out_cfg, out_q);
}

}  // namespace lowbit

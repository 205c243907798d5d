// add / convert: argument checks and dispatch by device.
#include "lowbit/ops.h"
#include "ops/elementwise_impl.h"
#include "ops/ops_check.h"

namespace lowbit {

using namespace ops_detail;

namespace {

void check_bf16_or_f32(const char* op, const char* name, const TensorView& t) {
  LOWBIT_USER_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF32,
                    "{}: {} must be bf16 or f32, got {}", op, name, t.str());
}

}  // namespace

void add(Context& ctx, const TensorView& out, const TensorView& a, const TensorView& b) {
  const char* op = "add";
  check_devices(op, ctx, {{"out", &out}, {"a", &a}, {"b", &b}});
  check_bf16_or_f32(op, "out", out);
  LOWBIT_USER_CHECK(a.dtype == out.dtype && b.dtype == out.dtype,
                    "add: out, a and b must share one dtype, got out {}, a {}, b {}",
                    dtype_name(out.dtype), dtype_name(a.dtype), dtype_name(b.dtype));
  check_same_shape(op, "a", a, "out", out);
  check_same_shape(op, "b", b, "out", out);
  check_contiguous(op, "out", out);
  check_contiguous(op, "a", a);
  check_contiguous(op, "b", b);
  if (out.numel() == 0) return;
  if (ctx.on_gpu()) {
    add_cuda(ctx, out, a, b);
  } else {
    add_cpu(out, a, b);
  }
}

void convert(Context& ctx, const TensorView& dst, const TensorView& src) {
  const char* op = "convert";
  check_devices(op, ctx, {{"dst", &dst}, {"src", &src}});
  check_bf16_or_f32(op, "dst", dst);
  check_bf16_or_f32(op, "src", src);
  check_same_shape(op, "dst", dst, "src", src);
  check_contiguous(op, "dst", dst);
  check_contiguous(op, "src", src);
  LOWBIT_USER_CHECK(dst.data != src.data || dst.dtype == src.dtype,
                    "convert: dst and src share storage but differ in dtype ({} <- {}); convert "
                    "into a separate buffer",
                    dtype_name(dst.dtype), dtype_name(src.dtype));
  if (dst.numel() == 0) return;
  if (ctx.on_gpu()) {
    convert_cuda(ctx, dst, src);
  } else {
    convert_cpu(dst, src);
  }
}

}  // namespace lowbit

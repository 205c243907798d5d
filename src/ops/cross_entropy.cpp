// cross_entropy_fwd_bwd: argument checks and dispatch by device.
#include <cmath>
#include <cstdint>

#include "lowbit/ops.h"
#include "ops/cross_entropy_impl.h"
#include "ops/ops_check.h"

namespace lowbit {

using namespace ops_detail;

void cross_entropy_fwd_bwd(Context& ctx, const TensorView& losses, const TensorView* dlogits,
                           const TensorView& logits, const TensorView& targets, int ignore_index,
                           float grad_scale) {
  const char* op = "cross_entropy_fwd_bwd";
  check_devices(op, ctx, {{"losses", &losses}, {"logits", &logits}, {"targets", &targets}});
  if (dlogits) check_devices(op, ctx, {{"dlogits", dlogits}});
  check_rank(op, "logits", "[n, V]", logits, 2);
  check_float(op, "logits", logits, DType::kBF16);
  check_contiguous(op, "logits", logits);
  const int64_t n = logits.size(0), V = logits.size(1);
  LOWBIT_USER_CHECK(V > 0 || n == 0, "{}: logits {} has rows of width 0 (V must be at least 1)", op,
                    logits.str());
  LOWBIT_USER_CHECK(V <= INT32_MAX, "{}: V = {} does not fit the i32 targets", op, V);
  check_rank(op, "targets", "[n]", targets, 1);
  check_dtype(op, "targets", targets, DType::kI32);
  check_contiguous(op, "targets", targets);
  LOWBIT_USER_CHECK(targets.size(0) == n,
                    "{}: targets [n] has {} entries but logits [n, V] has n = {} rows", op,
                    targets.size(0), n);
  check_rank(op, "losses", "[n]", losses, 1);
  check_dtype(op, "losses", losses, DType::kF32);
  check_contiguous(op, "losses", losses);
  LOWBIT_USER_CHECK(losses.size(0) == n,
                    "{}: losses [n] has {} entries but logits [n, V] has n = {} rows", op,
                    losses.size(0), n);
  if (dlogits) {
    check_float(op, "dlogits", *dlogits, DType::kBF16);
    check_same_shape(op, "dlogits", *dlogits, "logits", logits);
    check_contiguous(op, "dlogits", *dlogits);
    // In place (the same storage) is allowed; a partial overlap is not.
    const auto* a = static_cast<const uint8_t*>(logits.data);
    const auto* b = static_cast<const uint8_t*>(dlogits->data);
    const bool same = a == b && logits.dtype == dlogits->dtype;
    const bool apart = a + logits.nbytes() <= b || b + dlogits->nbytes() <= a;
    LOWBIT_USER_CHECK(same || apart,
                      "{}: dlogits {} partly overlaps logits {}; pass the logits themselves (in "
                      "place) or a separate buffer",
                      op, dlogits->str(), logits.str());
  }
  LOWBIT_USER_CHECK(std::isfinite(grad_scale), "{}: grad_scale must be finite, got {}", op,
                    grad_scale);
  if (n == 0) return;
  if (ctx.on_gpu()) {
    cross_entropy_cuda(ctx, losses, dlogits, logits, targets, ignore_index, grad_scale);
  } else {
    cross_entropy_cpu(losses, dlogits, logits, targets, ignore_index, grad_scale);
  }
}

}  // namespace lowbit

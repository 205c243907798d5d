// CPU twin of cross_entropy_fwd_bwd: the definition of the op (formulas in
// cross_entropy_impl.h). Plain loops, one row at a time, in fp64 from the fp32 values of the row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "lowbit/quant/rn_ops.h"
#include "ops/cross_entropy_impl.h"
#include "ops/ops_check.h"

namespace lowbit::ops_detail {

void cross_entropy_cpu(const TensorView& losses, const TensorView* dlogits,
                       const TensorView& logits, const TensorView& targets, int ignore_index,
                       float grad_scale) {
  const int64_t n = logits.size(0), V = logits.size(1);
  const int32_t* tg = targets.ptr<const int32_t>();  // [n]
  float* loss = losses.ptr<float>();                 // [n]
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = tg[r];
    LOWBIT_USER_CHECK(t == ignore_index || (t >= 0 && t < V),
                      "cross_entropy_fwd_bwd: targets[{}] = {} is outside [0, V = {}) and is not "
                      "ignore_index ({}); fix the targets or mark the token with ignore_index",
                      r, t, V, ignore_index);
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> x(static_cast<size_t>(V));  // one row of logits
  std::vector<float> d(static_cast<size_t>(V));  // its gradient
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = tg[r];
    if (t == ignore_index) {
      loss[r] = 0.0f;
      if (dlogits) {
        std::fill(d.begin(), d.end(), 0.0f);
        store_row(*dlogits, r * V, V, d.data());
      }
      continue;
    }
    load_row(logits, r * V, V, x.data());
    float m = kNegInf;
    for (int64_t j = 0; j < V; ++j) m = fmax_num(m, x[j]);
    // e_j = exp(x_j − m), 0 for x_j = −inf (so that a row of −inf gives s = 0, not NaN).
    auto e = [&](float xj) { return xj == kNegInf ? 0.0 : std::exp(double(xj) - double(m)); };
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += e(x[j]);
    loss[r] = static_cast<float>((double(m) - double(x[t])) + std::log(s));
    if (!dlogits) continue;
    for (int64_t j = 0; j < V; ++j) {
      const double p = e(x[j]) / s;
      d[j] = static_cast<float>(double(grad_scale) * (j == t ? p - 1.0 : p));
    }
    store_row(*dlogits, r * V, V, d.data());
  }
}

}  // namespace lowbit::ops_detail

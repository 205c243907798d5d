// CPU twin of RMSNorm: the definition of the op (formulas in rmsnorm_impl.h).
#include <cmath>
#include <vector>

#include "lowbit/ops.h"
#include "ops/ops_check.h"
#include "ops/quant_epilogue.h"
#include "ops/rmsnorm_impl.h"

namespace lowbit::ops_detail {

void rmsnorm_fwd_cpu(const TensorView& out, const TensorView& rstd, const TensorView& x,
                     const TensorView& w, float eps) {
  const int64_t n_rows = x.size(0), d = x.size(1);
  std::vector<float> xr(d), wr(d), yr(d);  // [D] each
  load_row(w, 0, d, wr.data());
  float* rs = rstd.ptr<float>();  // [N]
  for (int64_t n = 0; n < n_rows; ++n) {
    load_row(x, n * d, d, xr.data());
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * double(xr[i]);
    const float ms = static_cast<float>(ss / double(d));
    const float r = 1.0f / std::sqrt(ms + eps);
    rs[n] = r;
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * r) * wr[i];
    store_row(out, n * d, d, yr.data());
  }
}

void rmsnorm_bwd_cpu(const TensorView& dx, const TensorView& dw, const TensorView& dout,
                     const TensorView& x, const TensorView& w, const TensorView& rstd,
                     const TensorView& residual, bool accumulate) {
  const int64_t n_rows = x.size(0), d = x.size(1);
  const bool add_residual = residual.data != nullptr;
  std::vector<float> xr(d), wr(d), gr(d), dxr(d), rr(d);  // [D] each
  std::vector<double> dw_acc(d, 0.0);                     // [D]
  load_row(w, 0, d, wr.data());
  const float* rs = rstd.ptr<const float>();  // [N]
  for (int64_t n = 0; n < n_rows; ++n) {
    load_row(x, n * d, d, xr.data());
    load_row(dout, n * d, d, gr.data());  // dout for now
    const float r = rs[n];
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) {
      dw_acc[i] += double((xr[i] * r) * gr[i]);
      gr[i] = gr[i] * wr[i];  // g = dout · w
      dot += double(gr[i]) * double(xr[i]);
    }
    const float mean = static_cast<float>(dot / double(d));
    const float c = (mean * r) * r;
    for (int64_t i = 0; i < d; ++i) dxr[i] = r * (gr[i] - xr[i] * c);
    if (add_residual) {  // read before dx's row is written (residual may alias dx)
      load_row(residual, n * d, d, rr.data());
      for (int64_t i = 0; i < d; ++i) dxr[i] = rr[i] + dxr[i];
    }
    store_row(dx, n * d, d, dxr.data());
  }
  float* dwp = dw.ptr<float>();  // [D]
  // Written outright: the sum starts at +0, so it equals 0 + the sum (never −0).
  for (int64_t i = 0; i < d; ++i)
    dwp[i] = static_cast<float>((accumulate ? double(dwp[i]) : 0.0) + dw_acc[i]);
}

void rmsnorm_fwd_quantize_composed(Context& ctx, const TensorView& y, const TensorView& rstd,
                                   const TensorView& x, const TensorView& w, float eps,
                                   const QuantConfig& cfg, QuantizedTensor& out) {
  const int64_t n = x.size(0), d = x.size(1);
  Tensor y_scratch, rstd_scratch;
  TensorView yv = y, rv = rstd;
  if (absent(y)) {
    y_scratch = Tensor::empty({n, d}, DType::kBF16, x.device, MemCategory::kWorkspace);  // [N, D]
    yv = y_scratch.view();
  }
  if (absent(rstd)) {
    rstd_scratch = Tensor::empty({n}, DType::kF32, x.device, MemCategory::kWorkspace);  // [N]
    rv = rstd_scratch.view();
  }
  rmsnorm_fwd(ctx, yv, rv, x, w, eps);
  quantize(ctx, yv, cfg, out);
}

}  // namespace lowbit::ops_detail

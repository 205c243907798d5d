// CPU twin of SwiGLU: the definition of the op (formulas in swiglu_impl.h).
#include <vector>

#include "lowbit/ops.h"
#include "ops/ops_check.h"
#include "ops/quant_epilogue.h"
#include "ops/swiglu_impl.h"

namespace lowbit::ops_detail {

void swiglu_fwd_cpu(const TensorView& out, const TensorView& gate_up) {
  const int64_t n_rows = out.size(0), f = out.size(1);
  std::vector<float> gu(2 * f), o(f);  // [2F], [F]
  for (int64_t n = 0; n < n_rows; ++n) {
    load_row(gate_up, n * 2 * f, 2 * f, gu.data());
    for (int64_t i = 0; i < f; ++i) o[i] = swiglu_out(gu[i], gu[f + i]);
    store_row(out, n * f, f, o.data());
  }
}

void swiglu_bwd_cpu(const TensorView& dgate_up, const TensorView& dout, const TensorView& gate_up) {
  const int64_t n_rows = dout.size(0), f = dout.size(1);
  std::vector<float> gu(2 * f), dy(f), dgu(2 * f);  // [2F], [F], [2F]
  for (int64_t n = 0; n < n_rows; ++n) {
    load_row(gate_up, n * 2 * f, 2 * f, gu.data());
    load_row(dout, n * f, f, dy.data());
    for (int64_t i = 0; i < f; ++i) {
      const SwigluGrad gr = swiglu_grad(gu[i], gu[f + i], dy[i]);
      dgu[i] = gr.dg;
      dgu[f + i] = gr.du;
    }
    store_row(dgate_up, n * 2 * f, 2 * f, dgu.data());
  }
}

void swiglu_fwd_quantize_composed(Context& ctx, const TensorView& h, const TensorView& gate_up,
                                  const QuantConfig& cfg, QuantizedTensor& out) {
  Tensor h_scratch;
  TensorView hv = h;
  if (absent(h)) {
    h_scratch = Tensor::empty({gate_up.size(0), gate_up.size(1) / 2}, DType::kBF16, gate_up.device,
                              MemCategory::kWorkspace);  // [N, F]
    hv = h_scratch.view();
  }
  swiglu_fwd(ctx, hv, gate_up);
  quantize(ctx, hv, cfg, out);
}

void swiglu_bwd_quantize_composed(Context& ctx, const TensorView& dgate_up, const TensorView& dout,
                                  const TensorView& gate_up, const QuantConfig& cfg,
                                  QuantizedTensor& out) {
  Tensor scratch;
  TensorView dv = dgate_up;
  if (absent(dgate_up)) {
    scratch = Tensor::empty(gate_up.shape, DType::kBF16, gate_up.device,
                            MemCategory::kWorkspace);  // [N, 2F]
    dv = scratch.view();
  }
  swiglu_bwd(ctx, dv, dout, gate_up);
  quantize(ctx, dv, cfg, out);
}

}  // namespace lowbit::ops_detail

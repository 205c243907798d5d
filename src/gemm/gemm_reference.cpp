// Float64 reference of the canonical product over the dequantized operands: the oracle of the
// CPU and GPU gemm tests.
#include "gemm/gemm_internal.h"
#include "lowbit/formats.h"

namespace lowbit {

namespace {

// A bf16 or f32 tensor as doubles in row-major order (copied to the host when needed).
std::vector<double> host_f64(const TensorView& v) {
  Tensor host;
  TensorView t = v;
  if (!v.device.is_cpu()) {
    host = Tensor::copy_of(v, Device::cpu());
    t = host.view();
  }
  LOWBIT_CHECK(t.ndim() == 1 || t.ndim() == 2, "host_f64: {}", t.str());
  const int64_t rows = t.ndim() == 2 ? t.shape[0] : 1;
  const int64_t cols = t.ndim() == 2 ? t.shape[1] : t.shape[0];
  const int64_t rs = t.ndim() == 2 ? t.strides[0] : 0;
  const int64_t cs = t.ndim() == 2 ? t.strides[1] : t.strides[0];
  std::vector<double> r(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t off = i * rs + j * cs;
      r[static_cast<size_t>(i * cols + j)] = t.dtype == DType::kBF16
                                                 ? bf16_to_f32(t.ptr<const uint16_t>()[off])
                                                 : t.ptr<const float>()[off];
    }
  }
  return r;
}

}  // namespace

std::vector<double> gemm_reference_f64(const GemmOperand& a, const GemmOperand& b,
                                       const GemmOptions& opt, const TensorView* out_before) {
  const CanonGemm g = canonicalize_operands(a, b, opt);
  const std::vector<float> am = canon_operand_f32(g.a);
  const std::vector<float> bm = canon_operand_f32(g.b);
  std::vector<double> before, bias;
  if (opt.beta != 0.0f && opt.c != nullptr) out_before = opt.c;  // the beta term reads c
  if (opt.beta != 0.0f) {
    LOWBIT_USER_CHECK(out_before != nullptr,
                      "gemm_reference_f64: beta = {} needs the output's previous values", opt.beta);
    LOWBIT_USER_CHECK(out_before->ndim() == 2 && out_before->shape == (Shape{g.R, g.C}),
                      "gemm_reference_f64: out_before must be [{}, {}], got {}", g.R, g.C,
                      out_before->str());
    before = host_f64(*out_before);
  }
  if (opt.bias != nullptr) {
    LOWBIT_USER_CHECK(opt.bias->ndim() == 1 && opt.bias->shape[0] == g.C,
                      "gemm_reference_f64: bias must be [{}], got {}", g.C, opt.bias->str());
    bias = host_f64(*opt.bias);
  }
  std::vector<double> out(static_cast<size_t>(g.R * g.C));
  for (int64_t r = 0; r < g.R; ++r) {
    const float* ar = am.data() + r * g.Kc;
    for (int64_t c = 0; c < g.C; ++c) {
      const float* bc = bm.data() + c * g.Kc;
      double s = 0;
      for (int64_t j = 0; j < g.Kc; ++j) s += static_cast<double>(ar[j]) * bc[j];
      double v = static_cast<double>(opt.alpha) * s;
      if (!before.empty())
        v += static_cast<double>(opt.beta) * before[static_cast<size_t>(r * g.C + c)];
      if (!bias.empty()) v += bias[static_cast<size_t>(c)];
      out[static_cast<size_t>(r * g.C + c)] = v;
    }
  }
  return out;
}

}  // namespace lowbit

// CPU backend: the canonical TN product in f32 (OpenBLAS sgemm) over the dequantized operands.
#include <cblas.h>

#include <cstring>

#include "gemm/gemm_internal.h"
#include "lowbit/formats.h"

namespace lowbit {

namespace {

// Element (i, j) of a 2-D bf16 or f32 host view, any strides.
float dense_at(const TensorView& t, int64_t i, int64_t j) {
  const int64_t off = i * t.strides[0] + j * t.strides[1];
  return t.dtype == DType::kBF16 ? bf16_to_f32(t.ptr<const uint16_t>()[off])
                                 : t.ptr<const float>()[off];
}

// A 1-D bf16 or f32 vector as f32 on the host.
std::vector<float> vector_f32(const TensorView& v) {
  Tensor host;
  const TensorView* t = &v;
  if (!v.device.is_cpu()) {
    host = Tensor::copy_of(v, Device::cpu());
    t = &host.view();
  }
  std::vector<float> r(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) {
    const int64_t off = i * t->strides[0];
    r[static_cast<size_t>(i)] = t->dtype == DType::kBF16
                                    ? bf16_to_f32(t->ptr<const uint16_t>()[off])
                                    : t->ptr<const float>()[off];
  }
  return r;
}

}  // namespace

std::vector<float> canon_operand_f32(const CanonOperand& op) {
  std::vector<float> m(static_cast<size_t>(op.rows * op.kc));
  if (op.q != nullptr) {
    const Tensor d = dequantize(*op.q, op.usage);
    const float* p = d.ptr<const float>();
    // Every copy is stored [rows, kc] (columnwise copies transposed).
    LOWBIT_CHECK(d.shape() == (Shape{op.rows, op.kc}),
                 "dequantized copy {} does not match the canonical operand [{}, {}]",
                 d.shape().str(), op.rows, op.kc);
    std::memcpy(m.data(), p, m.size() * sizeof(float));
    return m;
  }
  Tensor host;
  TensorView t = op.dense;
  if (!t.device.is_cpu()) {
    host = Tensor::copy_of(op.dense, Device::cpu());
    t = host.view();
  }
  for (int64_t r = 0; r < op.rows; ++r) {
    for (int64_t j = 0; j < op.kc; ++j) {
      m[static_cast<size_t>(r * op.kc + j)] = op.transposed ? dense_at(t, j, r) : dense_at(t, r, j);
    }
  }
  return m;
}

void gemm_cpu(const CanonGemm& g, const TensorView& out, const GemmOptions& opt) {
  LOWBIT_CHECK(out.device.is_cpu() && out.is_contiguous(), "gemm_cpu: out {}", out.str());
  const std::vector<float> a = canon_operand_f32(g.a);
  const std::vector<float> b = canon_operand_f32(g.b);
  std::vector<float> acc(static_cast<size_t>(g.R * g.C));
  // Row-major acc[R, C] = A'[R, Kc] · B'[C, Kc]ᵀ.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(g.R),
              static_cast<blasint>(g.C), static_cast<blasint>(g.Kc), 1.0f, a.data(),
              static_cast<blasint>(g.Kc), b.data(), static_cast<blasint>(g.Kc), 0.0f, acc.data(),
              static_cast<blasint>(g.C));
  std::vector<float> bias;
  if (opt.bias != nullptr) bias = vector_f32(*opt.bias);
  // out = alpha · acc + beta · C + bias, in f32, C = opt.c or out; C is read only when beta ≠ 0
  // (as cuBLAS), element i before out[i] is written (c may alias out).
  const bool f32_out = out.dtype == DType::kF32;
  const TensorView& cin = opt.c != nullptr ? *opt.c : out;
  auto c_at = [&](int64_t i) {
    return cin.dtype == DType::kF32 ? cin.ptr<const float>()[i]
                                    : bf16_to_f32(cin.ptr<const uint16_t>()[i]);
  };
  for (int64_t r = 0; r < g.R; ++r) {
    for (int64_t c = 0; c < g.C; ++c) {
      const int64_t i = r * g.C + c;
      float v = opt.alpha * acc[static_cast<size_t>(i)];
      if (opt.beta != 0.0f) v += opt.beta * c_at(i);
      if (!bias.empty()) v += bias[static_cast<size_t>(c)];
      if (f32_out) {
        out.ptr<float>()[i] = v;
      } else {
        out.ptr<uint16_t>()[i] = f32_to_bf16_rn(v);
      }
    }
  }
}

}  // namespace lowbit

// Causal grouped-query attention, CPU twin: against a float64 softmax(Q·Kᵀ·scale + mask)·V and
// its analytic backward (bounds from tests/ops/attention_ref64.h), against finite differences
// of its own forward (f32 tensors), GQA against MHA with repeated kv heads, strided views
// against contiguous copies, and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "ops/attention_ref64.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

using test::AttnDims;
using test::AttnErrorModel;

// A contiguous host tensor of gaussian values (stddev `sd`), stored in `t` (bf16: RN).
Tensor random_tensor(const Shape& s, DType t, uint64_t seed, double sd = 1.0) {
  Tensor x = Tensor::empty(s, t, Device::cpu());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u1 = philox_uniform(seed, 7, 2 * uint64_t(i)) + 0x1p-25;
    const double u2 = philox_uniform(seed, 7, 2 * uint64_t(i) + 1);
    const double g = sd * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    if (t == DType::kBF16) {
      x.ptr<uint16_t>()[i] = f32_to_bf16_rn(static_cast<float>(g));
    } else {
      x.ptr<float>()[i] = static_cast<float>(g);
    }
  }
  return x;
}

// Values of a view (any strides), row-major over its shape.
std::vector<double> values_of(const TensorView& t) {
  const std::vector<int64_t> off = test::detail::element_offsets(t.shape, t.strides);
  const int64_t esize = dtype_bits(t.dtype) / 8;
  std::vector<double> v(off.size());
  for (size_t i = 0; i < off.size(); ++i) {
    v[i] = test::detail::load_value(t.dtype, static_cast<const uint8_t*>(t.data) + off[i] * esize);
  }
  return v;
}

// |got − want| ≤ bound element by element (NaN/inf anywhere fails), with the first mismatch's
// coordinates. (The harness's Tol is one formula per tensor; attention's bounds are per element.)
::testing::AssertionResult within_bounds(const std::string& what, const Shape& shape,
                                         const std::vector<double>& got,
                                         const std::vector<double>& want,
                                         const std::vector<double>& bound) {
  int64_t bad = 0;
  std::string first;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    const bool ok = std::isfinite(got[i]) && std::isfinite(want[i]) && d <= bound[i];
    if (std::isfinite(d) && bound[i] > 0) worst_ratio = std::max(worst_ratio, d / bound[i]);
    if (ok) continue;
    if (bad++ == 0) {
      first = fmt::format("{}{}: got {:.9g}, want {:.9g}, |diff| {:.3g} > bound {:.3g}", what,
                          test::detail::coords(shape, int64_t(i)), got[i], want[i], d, bound[i]);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess() << "max |diff| / bound " << worst_ratio;
  return ::testing::AssertionFailure()
         << first << " (" << bad << " of " << got.size() << " elements outside their bounds)";
}

struct Case {
  int64_t B, T, H, Hkv, Dh;
  DType dtype;
  double q_sd;  // 3 makes the softmax peaked (the online max moves more in the kernels)
  std::string str() const {
    return fmt::format("B{} T{} H{} Hkv{} Dh{} {} q_sd {}", B, T, H, Hkv, Dh, dtype_name(dtype),
                       q_sd);
  }
};

const Case kCases[] = {
    {2, 17, 4, 2, 64, DType::kF32, 1.0},  {1, 40, 2, 1, 128, DType::kF32, 1.0},
    {2, 23, 4, 4, 64, DType::kBF16, 1.0}, {1, 33, 4, 1, 64, DType::kBF16, 3.0},
    {1, 1, 2, 2, 128, DType::kBF16, 1.0},
};

struct Inputs {
  AttnDims dims;
  Tensor q, k, v, dout;  // [B, T, H | Hkv, Dh]
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.dims = {c.B, c.T, c.H, c.Hkv, c.Dh, 1.0 / std::sqrt(double(c.Dh))};
  in.q = random_tensor({c.B, c.T, c.H, c.Dh}, c.dtype, seed, c.q_sd);
  in.k = random_tensor({c.B, c.T, c.Hkv, c.Dh}, c.dtype, seed + 1);
  in.v = random_tensor({c.B, c.T, c.Hkv, c.Dh}, c.dtype, seed + 2);
  in.dout = random_tensor({c.B, c.T, c.H, c.Dh}, c.dtype, seed + 3);
  return in;
}

float scale_of(const AttnDims& d) { return static_cast<float>(d.scale); }

TEST(Attention, TwinForwardMatchesFloat64) {
  Context ctx(Device::cpu());
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.str());
    Inputs in = make_inputs(c, 11);
    Tensor out = Tensor::empty({c.B, c.T, c.H, c.Dh}, c.dtype, Device::cpu());
    Tensor lse = Tensor::empty({c.B, c.H, c.T}, DType::kF32, Device::cpu());
    attention_fwd(ctx, out, lse, in.q, in.k, in.v, scale_of(in.dims));
    const auto ref =
        test::attention_fwd_f64(in.dims, values_of(in.q), values_of(in.k), values_of(in.v),
                                AttnErrorModel::cpu_twin(c.dtype == DType::kBF16));
    EXPECT_TRUE(within_bounds("out", out.shape(), values_of(out), ref.out, ref.out_bound));
    EXPECT_TRUE(within_bounds("lse", lse.shape(), values_of(lse), ref.lse, ref.lse_bound));
  }
}

TEST(Attention, TwinBackwardMatchesFloat64) {
  Context ctx(Device::cpu());
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.str());
    Inputs in = make_inputs(c, 23);
    Tensor out = Tensor::empty({c.B, c.T, c.H, c.Dh}, c.dtype, Device::cpu());
    Tensor lse = Tensor::empty({c.B, c.H, c.T}, DType::kF32, Device::cpu());
    attention_fwd(ctx, out, lse, in.q, in.k, in.v, scale_of(in.dims));
    Tensor dq = Tensor::empty(in.q.shape(), c.dtype, Device::cpu());
    Tensor dk = Tensor::empty(in.k.shape(), c.dtype, Device::cpu());
    Tensor dv = Tensor::empty(in.v.shape(), c.dtype, Device::cpu());
    attention_bwd(ctx, dq, dk, dv, in.dout, in.q, in.k, in.v, out, lse, scale_of(in.dims));
    const auto ref = test::attention_bwd_f64(
        in.dims, values_of(in.q), values_of(in.k), values_of(in.v), values_of(out), values_of(lse),
        values_of(in.dout), AttnErrorModel::cpu_twin(c.dtype == DType::kBF16));
    EXPECT_TRUE(within_bounds("dq", dq.shape(), values_of(dq), ref.dq, ref.dq_bound));
    EXPECT_TRUE(within_bounds("dk", dk.shape(), values_of(dk), ref.dk, ref.dk_bound));
    EXPECT_TRUE(within_bounds("dv", dv.shape(), values_of(dv), ref.dv, ref.dv_bound));
  }
}

// The bounds are not vacuous: a wrong mask (query t also seeing key t + 1) or a dropped scale
// breaks them.
TEST(Attention, Float64BoundsCatchSmallMistakes) {
  const Case c{1, 9, 2, 1, 64, DType::kF32, 1.0};
  Inputs in = make_inputs(c, 5);
  Context ctx(Device::cpu());
  Tensor out = Tensor::empty({c.B, c.T, c.H, c.Dh}, c.dtype, Device::cpu());
  Tensor lse = Tensor::empty({c.B, c.H, c.T}, DType::kF32, Device::cpu());
  attention_fwd(ctx, out, lse, in.q, in.k, in.v, scale_of(in.dims));
  const auto em = AttnErrorModel::cpu_twin(false);
  AttnDims off = in.dims;
  off.scale *= 1.001;  // a 0.1% error in the scale
  const auto ref =
      test::attention_fwd_f64(off, values_of(in.q), values_of(in.k), values_of(in.v), em);
  EXPECT_FALSE(within_bounds("out", out.shape(), values_of(out), ref.out, ref.out_bound));
  EXPECT_FALSE(within_bounds("lse", lse.shape(), values_of(lse), ref.lse, ref.lse_bound));

  // A mask one key too wide: query t sees keys 0 .. t + 1. Its outputs are those of the right
  // kernel at position t + 1 for a query sequence shifted by one (q'[t + 1] = q[t]); the last
  // query (no key T) is left as it is.
  const auto good =
      test::attention_fwd_f64(in.dims, values_of(in.q), values_of(in.k), values_of(in.v), em);
  ASSERT_TRUE(within_bounds("out", out.shape(), values_of(out), good.out, good.out_bound));
  Tensor qs = Tensor::copy_of(in.q.view(), Device::cpu());
  const int64_t row = c.H * c.Dh;  // one position of q [B = 1, T, H, Dh]
  for (int64_t t = c.T - 1; t >= 1; --t) {
    std::memcpy(qs.ptr<float>() + t * row, in.q.ptr<float>() + (t - 1) * row, row * sizeof(float));
  }
  Tensor out_s = Tensor::empty({c.B, c.T, c.H, c.Dh}, c.dtype, Device::cpu());
  Tensor lse_s = Tensor::empty({c.B, c.H, c.T}, DType::kF32, Device::cpu());
  attention_fwd(ctx, out_s, lse_s, qs, in.k, in.v, scale_of(in.dims));
  Tensor wide = Tensor::copy_of(out.view(), Device::cpu());
  Tensor wide_lse = Tensor::copy_of(lse.view(), Device::cpu());
  for (int64_t t = 0; t + 1 < c.T; ++t) {
    std::memcpy(wide.ptr<float>() + t * row, out_s.ptr<float>() + (t + 1) * row,
                row * sizeof(float));
    for (int64_t h = 0; h < c.H; ++h) {
      wide_lse.ptr<float>()[h * c.T + t] = lse_s.ptr<float>()[h * c.T + t + 1];
    }
  }
  EXPECT_FALSE(within_bounds("out", wide.shape(), values_of(wide), good.out, good.out_bound));
  EXPECT_FALSE(
      within_bounds("lse", wide_lse.shape(), values_of(wide_lse), good.lse, good.lse_bound));
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  // B1 T5 H4 Hkv2 Dh64, f32 tensors: the forward rounds only in fp32.
  const int64_t B = 1, T = 5, H = 4, Hkv = 2, Dh = 64;
  const float scale = 0.125f;
  test::GradCase g;
  g.name = "attention B1 T5 H4 Hkv2 Dh64";
  g.args = {
      test::in("q", DType::kF32, {B, T, H, Dh}),    test::in("k", DType::kF32, {B, T, Hkv, Dh}),
      test::in("v", DType::kF32, {B, T, Hkv, Dh}),  test::in("dout", DType::kF32, {B, T, H, Dh}),
      test::out("out", DType::kF32, {B, T, H, Dh}), test::out("lse", DType::kF32, {B, H, T}),
      test::out("dq", DType::kF32, {B, T, H, Dh}),  test::out("dk", DType::kF32, {B, T, Hkv, Dh}),
      test::out("dv", DType::kF32, {B, T, Hkv, Dh})};
  g.forward = [scale](Context& ctx, const test::Args& a) {
    attention_fwd(ctx, a["out"], a["lse"], a["q"], a["k"], a["v"], scale);
  };
  g.backward = [scale](Context& ctx, const test::Args& a) {
    attention_bwd(ctx, a["dq"], a["dk"], a["dv"], a["dout"], a["q"], a["k"], a["v"], a["out"],
                  a["lse"], scale);
  };
  g.loss = {{"out", "dout"}};
  g.grads = {{"q", "dq"}, {"k", "dk"}, {"v", "dv"}};
  EXPECT_TRUE(test::check_gradients(g, 3));
}

// GQA is MHA with each kv head repeated H / Hkv times: the same forward bits, the same dq bits,
// and dk / dv equal to the sums of the repeated heads' gradients (up to fp32 summation order).
TEST(Attention, GqaEqualsRepeatedKvHeads) {
  const Case c{2, 13, 6, 2, 64, DType::kF32, 1.0};
  Inputs in = make_inputs(c, 41);
  const int64_t G = c.H / c.Hkv;
  Tensor k_rep = Tensor::empty({c.B, c.T, c.H, c.Dh}, DType::kF32, Device::cpu());
  Tensor v_rep = Tensor::empty({c.B, c.T, c.H, c.Dh}, DType::kF32, Device::cpu());
  for (int64_t bt = 0; bt < c.B * c.T; ++bt) {
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t src = (bt * c.Hkv + h / G) * c.Dh, dst = (bt * c.H + h) * c.Dh;
      std::memcpy(k_rep.ptr<float>() + dst, in.k.ptr<float>() + src, c.Dh * sizeof(float));
      std::memcpy(v_rep.ptr<float>() + dst, in.v.ptr<float>() + src, c.Dh * sizeof(float));
    }
  }
  Context ctx(Device::cpu());
  const float scale = scale_of(in.dims);
  auto run = [&](const Tensor& k, const Tensor& v, std::vector<Tensor>& res) {
    Tensor out = Tensor::empty(in.q.shape(), DType::kF32, Device::cpu());
    Tensor lse = Tensor::empty({c.B, c.H, c.T}, DType::kF32, Device::cpu());
    attention_fwd(ctx, out, lse, in.q, k, v, scale);
    Tensor dq = Tensor::empty(in.q.shape(), DType::kF32, Device::cpu());
    Tensor dk = Tensor::empty(k.shape(), DType::kF32, Device::cpu());
    Tensor dv = Tensor::empty(v.shape(), DType::kF32, Device::cpu());
    attention_bwd(ctx, dq, dk, dv, in.dout, in.q, k, v, out, lse, scale);
    res = {out, lse, dq, dk, dv};
  };
  std::vector<Tensor> gqa, mha;
  run(in.k, in.v, gqa);
  run(k_rep, v_rep, mha);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(0, std::memcmp(gqa[i].data(), mha[i].data(), gqa[i].nbytes())) << "tensor " << i;
  }
  for (int i = 3; i < 5; ++i) {
    const float* m = mha[i].ptr<float>();
    std::vector<double> want;  // [B, T, Hkv, Dh]: the repeated heads' gradients summed
    for (int64_t bt = 0; bt < c.B * c.T; ++bt) {
      for (int64_t hk = 0; hk < c.Hkv; ++hk) {
        for (int64_t d = 0; d < c.Dh; ++d) {
          double sum = 0;
          for (int64_t r = 0; r < G; ++r) sum += m[(bt * c.H + hk * G + r) * c.Dh + d];
          want.push_back(sum);
        }
      }
    }
    // Both sum the same fp32 terms (T per head, G heads) in different orders.
    EXPECT_TRUE(test::expect_close(i == 3 ? "dk" : "dv", gqa[i].shape(), values_of(gqa[i]), want,
                                   test::tol_reduction(DType::kF32, c.T * G)));
  }
}

// q, k, v as views into one fused [B, T, (H + 2·Hkv)·Dh] activation and dq, dk, dv into a fused
// gradient buffer give the same bits as contiguous tensors.
TEST(Attention, StridedViewsMatchContiguous) {
  const Case c{2, 11, 4, 2, 64, DType::kBF16, 1.0};
  Inputs in = make_inputs(c, 77);
  const int64_t W = (c.H + 2 * c.Hkv) * c.Dh;
  const Shape qs{c.B, c.T, c.H, c.Dh}, ks{c.B, c.T, c.Hkv, c.Dh};
  const Shape fused_strides{c.T * W, W, c.Dh, 1};
  Tensor qkv = random_tensor({c.B, c.T, W}, DType::kBF16, 3);  // gaps hold noise
  Tensor dqkv = Tensor::zeros({c.B, c.T, W}, DType::kBF16, Device::cpu());
  auto view = [&](const Tensor& buf, int64_t col, const Shape& s) {
    return TensorView(buf.ptr<uint16_t>() + col, DType::kBF16, s, fused_strides, Device::cpu());
  };
  const TensorView qv = view(qkv, 0, qs), kv = view(qkv, c.H * c.Dh, ks),
                   vv = view(qkv, (c.H + c.Hkv) * c.Dh, ks);
  const TensorView dqv = view(dqkv, 0, qs), dkv = view(dqkv, c.H * c.Dh, ks),
                   dvv = view(dqkv, (c.H + c.Hkv) * c.Dh, ks);
  // Contiguous copies of the strided inputs.
  Tensor q = Tensor::empty(qs, DType::kBF16, Device::cpu());
  Tensor k = Tensor::empty(ks, DType::kBF16, Device::cpu());
  Tensor v = Tensor::empty(ks, DType::kBF16, Device::cpu());
  auto copy_in = [](const TensorView& src, const Tensor& dst) {
    const std::vector<int64_t> off = test::detail::element_offsets(src.shape, src.strides);
    for (size_t i = 0; i < off.size(); ++i)
      dst.ptr<uint16_t>()[i] = src.ptr<const uint16_t>()[off[i]];
  };
  copy_in(qv, q);
  copy_in(kv, k);
  copy_in(vv, v);

  Context ctx(Device::cpu());
  const float scale = scale_of(in.dims);
  Tensor out_s = Tensor::empty(qs, DType::kBF16, Device::cpu());
  Tensor out_c = Tensor::empty(qs, DType::kBF16, Device::cpu());
  Tensor lse_s = Tensor::empty({c.B, c.H, c.T}, DType::kF32, Device::cpu());
  Tensor lse_c = Tensor::empty({c.B, c.H, c.T}, DType::kF32, Device::cpu());
  attention_fwd(ctx, out_s, lse_s, qv, kv, vv, scale);
  attention_fwd(ctx, out_c, lse_c, q, k, v, scale);
  EXPECT_EQ(values_of(out_s), values_of(out_c));
  EXPECT_EQ(values_of(lse_s), values_of(lse_c));

  Tensor dq = Tensor::empty(qs, DType::kBF16, Device::cpu());
  Tensor dk = Tensor::empty(ks, DType::kBF16, Device::cpu());
  Tensor dv = Tensor::empty(ks, DType::kBF16, Device::cpu());
  attention_bwd(ctx, dqv, dkv, dvv, in.dout, qv, kv, vv, out_s, lse_s, scale);
  attention_bwd(ctx, dq, dk, dv, in.dout, q, k, v, out_c, lse_c, scale);
  EXPECT_EQ(values_of(dqv), values_of(dq));
  EXPECT_EQ(values_of(dkv), values_of(dk));
  EXPECT_EQ(values_of(dvv), values_of(dv));
}

// `fn` throws a UserError whose message contains `needle`.
template <typename Fn>
void expect_user_error(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Attention, RejectsBadInputs) {
  Context ctx(Device::cpu());
  const int64_t B = 1, T = 4, H = 4, Hkv = 2, Dh = 64;
  Tensor q = random_tensor({B, T, H, Dh}, DType::kBF16, 1);
  Tensor k = random_tensor({B, T, Hkv, Dh}, DType::kBF16, 2);
  Tensor v = random_tensor({B, T, Hkv, Dh}, DType::kBF16, 3);
  Tensor out = Tensor::empty({B, T, H, Dh}, DType::kBF16, Device::cpu());
  Tensor lse = Tensor::empty({B, H, T}, DType::kF32, Device::cpu());
  const float s = 0.125f;
  auto fwd = [&](const TensorView& o, const TensorView& l, const TensorView& qq,
                 const TensorView& kk, const TensorView& vv, float sc) {
    return [&ctx, o, l, qq, kk, vv, sc] { attention_fwd(ctx, o, l, qq, kk, vv, sc); };
  };
  // Head dim 32.
  Tensor q32 = random_tensor({B, T, H, 32}, DType::kBF16, 1);
  Tensor k32 = random_tensor({B, T, Hkv, 32}, DType::kBF16, 1);
  expect_user_error(fwd(out, lse, q32, k32, k32, s), "Dh = 32");
  // H not a multiple of Hkv.
  Tensor k3 = random_tensor({B, T, 3, Dh}, DType::kBF16, 1);
  expect_user_error(fwd(out, lse, q, k3, k3, s), "multiple of the kv heads");
  // Mismatched shapes.
  Tensor k_short = random_tensor({B, T - 1, Hkv, Dh}, DType::kBF16, 1);
  expect_user_error(fwd(out, lse, q, k_short, v, s), "k must be");
  expect_user_error(fwd(out, lse, q, k, k_short, s), "v must be");
  Tensor out_bad = Tensor::empty({B, T, Hkv, Dh}, DType::kBF16, Device::cpu());
  expect_user_error(fwd(out_bad, lse, q, k, v, s), "out must be");
  Tensor lse_bad = Tensor::empty({B, H, T + 1}, DType::kF32, Device::cpu());
  expect_user_error(fwd(out, lse_bad, q, k, v, s), "lse must be [1, 4, 4]");
  // Dtypes.
  Tensor q_i32 = Tensor::empty({B, T, H, Dh}, DType::kI32, Device::cpu());
  expect_user_error(fwd(out, lse, q_i32, k, v, s), "q is i32");
  Tensor lse_bf16 = Tensor::empty({B, H, T}, DType::kBF16, Device::cpu());
  expect_user_error(fwd(out, lse_bf16, q, k, v, s), "lse must be f32");
  // Last dim not contiguous: every other element of a wider buffer.
  Tensor wide = random_tensor({B, T, H, 2 * Dh}, DType::kBF16, 1);
  const TensorView q_gappy(wide.data(), DType::kBF16, {B, T, H, Dh},
                           {T * H * 2 * Dh, H * 2 * Dh, 2 * Dh, 2}, Device::cpu());
  expect_user_error(fwd(out, lse, q_gappy, k, v, s), "contiguous along its last dim");
  // Scale.
  expect_user_error(fwd(out, lse, q, k, v, 0.0f), "scale must be finite and positive");
  expect_user_error(fwd(out, lse, q, k, v, NAN), "scale must be finite and positive");
  // A tensor on another device than the context (never dereferenced).
  const TensorView q_gpu(q.data(), DType::kBF16, {B, T, H, Dh}, Device::cuda(0));
  expect_user_error(fwd(out, lse, q_gpu, k, v, s), "q is on cuda:0");
  // Backward: gradient shapes.
  Tensor dq = Tensor::empty({B, T, H, Dh}, DType::kBF16, Device::cpu());
  Tensor dk = Tensor::empty({B, T, Hkv, Dh}, DType::kBF16, Device::cpu());
  expect_user_error([&] { attention_bwd(ctx, dq, dq, dk, out, q, k, v, out, lse, s); },
                    "dk must be");
  expect_user_error([&] { attention_bwd(ctx, dq, dk, dk, out_bad, q, k, v, out, lse, s); },
                    "dout must be");
}

}  // namespace
}  // namespace lowbit

// Attention against a KV cache, CPU twin: against the float64 oracle (t0 > 0, grouped-query
// heads, Dh from 8 to 256, cache rows past the last position holding NaN), against attention_fwd
// at t0 = 0 (bit for bit: the twin performs the same operations), a prefill followed by
// one-query steps against one prefill, kv_cache_write, and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "ops/attention_cache_case.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

using test::AttnErrorModel;
using test::CacheCase;

const CacheCase kCases[] = {
    {1, 0, 1, 4, 2, 1, 64, DType::kBF16},
    {2, 5, 1, 9, 4, 2, 64, DType::kBF16},
    {2, 7, 3, 12, 4, 1, 128, DType::kBF16, true},
    {1, 40, 1, 64, 8, 2, 128, DType::kBF16, false, 3.0},
    {3, 0, 17, 20, 2, 2, 64, DType::kF32},
    {1, 13, 6, 19, 6, 3, 80, DType::kF32, true},
    {2, 3, 2, 8, 2, 1, 256, DType::kBF16},
    {1, 2, 5, 7, 4, 4, 8, DType::kF32},
};

TEST(AttentionCache, TwinMatchesFloat64) {
  for (const CacheCase& c : kCases) {
    SCOPED_TRACE(c.str());
    const test::CacheData d = test::make_cache_data(c, 21 + c.t0);
    const test::OpRun r = test::run_op(test::cache_op_case(c, d), Device::cpu());
    ASSERT_TRUE(r.intact());  // inputs and guards untouched
    const test::CacheRef ref =
        test::cache_oracle(c, d, AttnErrorModel::cpu_twin(c.dtype == DType::kBF16));
    EXPECT_TRUE(test::within_bounds("out", c.q_shape(), r.values("out"), ref.out, ref.bound));
  }
}

// t0 = 0 and Tq = T: the causal attention of attention_fwd, bit for bit on the CPU.
TEST(AttentionCache, PrefillEqualsAttentionFwd) {
  Context ctx(Device::cpu());
  for (const CacheCase& c : {CacheCase{2, 0, 23, 23, 4, 2, 64}, CacheCase{1, 0, 31, 40, 4, 1, 128},
                             CacheCase{2, 0, 9, 9, 2, 2, 64, DType::kF32}}) {
    SCOPED_TRACE(c.str());
    const test::CacheData d = test::make_cache_data(c, 7);
    const test::OpRun r = test::run_op(test::cache_op_case(c, d), Device::cpu());
    const std::vector<double> got = r.values("out");
    // attention_fwd over q and the cache rows [0, Tq) (a view of the cache).
    Tensor q = Tensor::empty(c.q_shape(), c.dtype, Device::cpu());
    Tensor kc = Tensor::empty(c.cache_shape(), c.dtype, Device::cpu());
    Tensor vc = Tensor::empty(c.cache_shape(), c.dtype, Device::cpu());
    const int64_t es = dtype_bits(c.dtype) / 8;
    for (int64_t i = 0; i < q.numel(); ++i) {
      test::detail::store_value(c.dtype, static_cast<uint8_t*>(q.data()) + i * es, d.q[i]);
    }
    for (int64_t i = 0; i < kc.numel(); ++i) {
      test::detail::store_value(c.dtype, static_cast<uint8_t*>(kc.data()) + i * es, d.kc[i]);
      test::detail::store_value(c.dtype, static_cast<uint8_t*>(vc.data()) + i * es, d.vc[i]);
    }
    const Shape rows{c.B, c.Tq, c.Hkv, c.Dh};
    const Shape cs = contiguous_strides(c.cache_shape());
    const TensorView k(kc.data(), c.dtype, rows, cs, Device::cpu());
    const TensorView v(vc.data(), c.dtype, rows, cs, Device::cpu());
    Tensor out = Tensor::empty(c.q_shape(), c.dtype, Device::cpu());
    Tensor lse = Tensor::empty({c.B, c.H, c.Tq}, DType::kF32, Device::cpu());
    attention_fwd(ctx, out, lse, q, k, v, static_cast<float>(d.dims.scale));
    std::vector<double> want(static_cast<size_t>(out.numel()));
    for (int64_t i = 0; i < out.numel(); ++i) {
      want[i] = test::detail::load_value(c.dtype, static_cast<const uint8_t*>(out.data()) + i * es);
    }
    EXPECT_EQ(got, want);
  }
}

// A prefill of P positions, then one query per call at t0 = P, P + 1, ...: the same outputs as
// one call over all positions (each query performs the same operations either way).
TEST(AttentionCache, StepByStepEqualsOneCall) {
  Context ctx(Device::cpu());
  const CacheCase c{2, 0, 12, 16, 4, 2, 64};
  const test::CacheData d = test::make_cache_data(c, 3);
  const test::OpRun all = test::run_op(test::cache_op_case(c, d), Device::cpu());
  const std::vector<double> want = all.values("out");
  const int64_t P = 5, row = c.H * c.Dh;
  std::vector<double> got;
  for (int64_t t0 = 0; t0 < c.Tq;) {
    const int64_t tq = t0 == 0 ? P : 1;
    CacheCase s = c;
    s.t0 = t0;
    s.Tq = tq;
    test::CacheData ds = d;
    ds.dims.T = t0 + tq;
    ds.q.clear();
    for (int64_t b = 0; b < c.B; ++b) {
      const auto first = d.q.begin() + (b * c.Tq + t0) * row;
      ds.q.insert(ds.q.end(), first, first + tq * row);
    }
    const test::OpRun r = test::run_op(test::cache_op_case(s, ds), Device::cpu());
    const std::vector<double> o = r.values("out");  // [B, tq, H, Dh]
    got.resize(want.size());
    for (int64_t b = 0; b < c.B; ++b) {
      std::copy(o.begin() + b * tq * row, o.begin() + (b + 1) * tq * row,
                got.begin() + (b * c.Tq + t0) * row);
    }
    t0 += tq;
  }
  EXPECT_EQ(got, want);
}

TEST(AttentionCache, KvCacheWriteFillsOnlyItsRows) {
  for (bool fused : {false, true}) {
    const int64_t B = 2, Tmax = 10, Hkv = 2, Dh = 64, t0 = 4, Tq = 3;
    SCOPED_TRACE(fused ? "fused src" : "contiguous src");
    test::OpCase oc;
    oc.name = "kv_cache_write";
    test::ArgSpec src = test::in("src", DType::kBF16, {B, Tq, Hkv, Dh});
    if (fused) src = test::strided(src, {Tq * 3 * Hkv * Dh, 3 * Hkv * Dh, Dh, 1});
    oc.args = {src, test::inout("cache", DType::kBF16, {B, Tmax, Hkv, Dh}, test::Fill::gaussian())};
    oc.run = [](Context& ctx, const test::Args& a) {
      kv_cache_write(ctx, a["cache"], a["src"], t0);
    };
    const test::OpRun r = test::run_op(oc, Device::cpu());
    ASSERT_TRUE(r.intact());
    std::vector<double> want = r.initial("cache");
    const std::vector<double> s = r.initial("src");
    const int64_t row = Hkv * Dh;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < Tq; ++i) {
        std::copy(s.begin() + (b * Tq + i) * row, s.begin() + (b * Tq + i + 1) * row,
                  want.begin() + (b * Tmax + t0 + i) * row);
      }
    }
    EXPECT_EQ(r.values("cache"), want);
  }
}

TEST(AttentionCache, ArgumentChecksNameTheProblem) {
  Context ctx(Device::cpu());
  auto t = [](Shape s) { return Tensor::zeros(s, DType::kBF16, Device::cpu()); };
  Tensor q = t({1, 2, 4, 64}), out = t({1, 2, 4, 64});
  Tensor kc = t({1, 8, 2, 64}), vc = t({1, 8, 2, 64});
  const float sc = 0.125f;
  EXPECT_TRUE(test::throws_user_error([&] { attention_cache_fwd(ctx, out, q, kc, vc, 7, sc); },
                                      {"attention_cache_fwd", "[7, 9)", "holds 8 positions"}));
  EXPECT_TRUE(test::throws_user_error([&] { attention_cache_fwd(ctx, out, q, kc, vc, -1, sc); },
                                      {"t0 = -1"}));
  Tensor kc3 = t({1, 8, 3, 64}), vc3 = t({1, 8, 3, 64});
  EXPECT_TRUE(test::throws_user_error([&] { attention_cache_fwd(ctx, out, q, kc3, vc3, 0, sc); },
                                      {"multiple of the kv heads"}));
  Tensor vc_short = t({1, 6, 2, 64});
  EXPECT_TRUE(test::throws_user_error(
      [&] { attention_cache_fwd(ctx, out, q, kc, vc_short, 0, sc); }, {"same shape"}));
  Tensor q300 = t({1, 1, 2, 300}), o300 = t({1, 1, 2, 300}), c300 = t({1, 4, 2, 300});
  EXPECT_TRUE(test::throws_user_error(
      [&] { attention_cache_fwd(ctx, o300, q300, c300, c300, 0, sc); }, {"Dh = 300"}));
  Tensor out_bad = t({1, 3, 4, 64});
  EXPECT_TRUE(test::throws_user_error([&] { attention_cache_fwd(ctx, out_bad, q, kc, vc, 0, sc); },
                                      {"out", "must match"}));
  EXPECT_TRUE(test::throws_user_error([&] { attention_cache_fwd(ctx, out, q, kc, vc, 0, 0.0f); },
                                      {"scale"}));
  Tensor src = t({1, 3, 2, 64});
  EXPECT_TRUE(test::throws_user_error([&] { kv_cache_write(ctx, kc, src, 6); },
                                      {"kv_cache_write", "[6, 9)"}));
  Tensor src_f32 = Tensor::zeros({1, 3, 2, 64}, DType::kF32, Device::cpu());
  EXPECT_TRUE(
      test::throws_user_error([&] { kv_cache_write(ctx, kc, src_f32, 0); }, {"must match"}));
}

}  // namespace
}  // namespace lowbit

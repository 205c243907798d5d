// Token embedding, CPU twin: the gather against the table, the scatter-add against an fp64 sum and
// against its documented fp32 order (the one the GPU reproduces bit for bit), finite
// differences, and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "lowbit/ops.h"
#include "ops/embedding_impl.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

constexpr int64_t kV = 37, kD = 24, kN = 65;

OpCase fwd_case(DType table_dtype, DType out_dtype) {
  OpCase c;
  c.name = "embedding_fwd";
  c.args = {in("tokens", DType::kI32, {kN}, Fill::ints(0, kV)),
            in("table", table_dtype, {kV, kD}, Fill::gaussian()), out("out", out_dtype, {kN, kD})};
  c.run = [](Context& ctx, const Args& a) {
    embedding_fwd(ctx, a["out"], a["tokens"], a["table"]);
  };
  return c;
}

TEST(Embedding, ForwardCopiesTheTokensRows) {
  for (DType tt : {DType::kBF16, DType::kF32}) {
    for (DType ot : {DType::kBF16, DType::kF32}) {
      OpRun r = run_op(fwd_case(tt, ot), Device::cpu());
      ASSERT_TRUE(r.intact());
      const std::vector<double> tok = r.values("tokens"), table = r.values("table");
      std::vector<double> want(kN * kD);
      for (int64_t n = 0; n < kN; ++n) {
        for (int64_t i = 0; i < kD; ++i) want[n * kD + i] = round_to(ot, table[tok[n] * kD + i]);
      }
      EXPECT_TRUE(expect_close("out", {kN, kD}, r.values("out"), want, Tol::exact()));
    }
  }
}

TEST(Embedding, BackwardSumsInTheDocumentedOrder) {
  // Few distinct tokens (runs crossing chunk boundaries) and a single token (one run over five
  // chunks); dtable starts nonzero (it accumulates).
  for (const Fill& tokens : {Fill::ints(0, 5), Fill::constant(3)}) {
    OpCase c;
    c.name = "embedding_bwd";
    c.args = {in("tokens", DType::kI32, {kN}, tokens),
              in("dout", DType::kBF16, {kN, kD}, Fill::gaussian()),
              inout("dtable", DType::kF32, {kV, kD}, Fill::gaussian())};
    c.run = [](Context& ctx, const Args& a) {
      embedding_bwd(ctx, a["dtable"], a["tokens"], a["dout"]);
    };
    OpRun r = run_op(c, Device::cpu());
    ASSERT_TRUE(r.intact());
    const std::vector<double> tok = r.values("tokens"), dy = r.values("dout");
    const std::vector<double> dt0 = r.initial("dtable");
    // fp64 sums.
    std::vector<double> exact(dt0);
    for (int64_t n = 0; n < kN; ++n) {
      for (int64_t i = 0; i < kD; ++i) exact[tok[n] * kD + i] += dy[n * kD + i];
    }
    // The documented fp32 order (embedding_impl.h): (token, position) sorted, cut into chunks of
    // kEmbeddingBwdChunk entries; per run, pieces summed from zero, pieces added in order, the
    // total added to dtable once.
    std::vector<std::pair<int64_t, int64_t>> sorted;
    for (int64_t n = 0; n < kN; ++n) sorted.emplace_back(int64_t(tok[n]), n);
    std::sort(sorted.begin(), sorted.end());
    std::vector<double> ordered(dt0);
    const int64_t chunk = ops_detail::kEmbeddingBwdChunk;
    for (int64_t s = 0; s < kN;) {
      int64_t e = s;
      while (e < kN && sorted[e].first == sorted[s].first) ++e;
      const int64_t v = sorted[s].first;
      for (int64_t i = 0; i < kD; ++i) {
        float total = 0.0f, piece = 0.0f;
        for (int64_t k = s; k < e; ++k) {
          piece += float(dy[sorted[k].second * kD + i]);
          if (k + 1 == e || (k + 1) % chunk == 0) {
            total = k / chunk == s / chunk ? piece : total + piece;
            piece = 0.0f;
          }
        }
        ordered[v * kD + i] = float(dt0[v * kD + i]) + total;
      }
      s = e;
    }
    const std::vector<double> got = r.values("dtable");
    EXPECT_TRUE(expect_close("dtable " + tokens.name(), {kV, kD}, got, ordered, Tol::exact()));
    EXPECT_TRUE(expect_close("dtable " + tokens.name(), {kV, kD}, got, exact,
                             tol_reduction(DType::kF32, kN)));
  }
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  GradCase g;
  g.name = "embedding";
  g.args = {in("tokens", DType::kI32, {9}, Fill::ints(0, 6)), in("table", DType::kF32, {6, 5}),
            out("out", DType::kF32, {9, 5}), in("dout", DType::kF32, {9, 5}),
            out("dtable", DType::kF32, {6, 5})};
  g.forward = [](Context& ctx, const Args& a) {
    embedding_fwd(ctx, a["out"], a["tokens"], a["table"]);
  };
  g.backward = [](Context& ctx, const Args& a) {
    embedding_bwd(ctx, a["dtable"], a["tokens"], a["dout"]);
  };
  g.loss = {{"out", "dout"}};
  g.grads = {{"table", "dtable"}};
  EXPECT_TRUE(check_gradients(g));
}

TEST(Embedding, SpecialValuesAndEmptyBatchPassThrough) {
  OpCase c = fwd_case(DType::kBF16, DType::kBF16);
  c.args[1].fill = Fill::specials();
  OpRun r = run_op(c, Device::cpu());
  const std::vector<double> tok = r.values("tokens"), table = r.values("table");
  std::vector<double> want(kN * kD);
  for (int64_t n = 0; n < kN; ++n) {
    for (int64_t i = 0; i < kD; ++i) want[n * kD + i] = table[tok[n] * kD + i];
  }
  EXPECT_TRUE(expect_close("out", {kN, kD}, r.values("out"), want, Tol::exact()));

  Context ctx(Device::cpu());
  Tensor table0 = Tensor::zeros({kV, kD}, DType::kBF16, Device::cpu());
  Tensor tokens0 = Tensor::zeros({0}, DType::kI32, Device::cpu());
  Tensor out0 = Tensor::zeros({0, kD}, DType::kBF16, Device::cpu());
  EXPECT_NO_THROW(embedding_fwd(ctx, out0, tokens0, table0));
}

// The sort plan: the forward writes the stable (token, position) order, the backward given it
// sums exactly as without it, and a plan from other tokens is refused.
TEST(Embedding, SortPlanFromTheForwardServesTheBackward) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  Tensor tokens = Tensor::zeros({kN}, DType::kI32, cpu);
  for (int64_t n = 0; n < kN; ++n) tokens.ptr<int32_t>()[n] = int32_t((n * 7) % 5 + (n % 3));
  Tensor table = Tensor::zeros({kV, kD}, DType::kBF16, cpu);
  Tensor out = Tensor::zeros({kN, kD}, DType::kBF16, cpu);
  Tensor plan = Tensor::zeros({2, kN}, DType::kI32, cpu);
  embedding_fwd(ctx, out, tokens, table, plan);
  // Expected: positions sorted stably by token.
  std::vector<std::pair<int32_t, int32_t>> want;
  for (int64_t n = 0; n < kN; ++n) want.push_back({tokens.ptr<int32_t>()[n], int32_t(n)});
  std::stable_sort(want.begin(), want.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (int64_t k = 0; k < kN; ++k) {
    ASSERT_EQ(plan.ptr<int32_t>()[k], want[k].first) << k;
    ASSERT_EQ(plan.ptr<int32_t>()[kN + k], want[k].second) << k;
  }
  Tensor dout = Tensor::zeros({kN, kD}, DType::kBF16, cpu);
  for (int64_t i = 0; i < kN * kD; ++i)
    dout.ptr<uint16_t>()[i] = f32_to_bf16_rn(0.37f * float(i % 11) - 1.5f);
  Tensor dt1 = Tensor::zeros({kV, kD}, DType::kF32, cpu);
  Tensor dt2 = Tensor::zeros({kV, kD}, DType::kF32, cpu);
  embedding_bwd(ctx, dt1, tokens, dout);
  embedding_bwd(ctx, dt2, tokens, dout, plan);
  EXPECT_EQ(0, std::memcmp(dt1.data(), dt2.data(), dt1.view().nbytes()));

  // A plan of other tokens, and malformed plans.
  std::swap(plan.ptr<int32_t>()[kN], plan.ptr<int32_t>()[kN + 1]);
  EXPECT_TRUE(throws_user_error([&] { embedding_bwd(ctx, dt2, tokens, dout, plan); },
                                {"embedding_bwd", "sort_plan entry 0", "same tokens"}));
  Tensor plan_short = Tensor::zeros({2, kN - 1}, DType::kI32, cpu);
  EXPECT_TRUE(throws_user_error([&] { embedding_fwd(ctx, out, tokens, table, plan_short); },
                                {"embedding_fwd", "sort_plan must be [2, N] = [2, 65]"}));
  Tensor plan64 = Tensor::zeros({2, kN}, DType::kI64, cpu);
  EXPECT_TRUE(throws_user_error([&] { embedding_bwd(ctx, dt2, tokens, dout, plan64); },
                                {"sort_plan", "must be i32"}));
}

TEST(Embedding, BadArgumentsAreUserErrors) {
  Context ctx(Device::cpu());
  const Device cpu = Device::cpu();
  Tensor table = Tensor::zeros({kV, kD}, DType::kBF16, cpu);
  Tensor dtable = Tensor::zeros({kV, kD}, DType::kF32, cpu);
  Tensor tokens = Tensor::zeros({4}, DType::kI32, cpu);
  Tensor out = Tensor::zeros({4, kD}, DType::kBF16, cpu);
  tokens.ptr<int32_t>()[2] = kV;
  EXPECT_TRUE(throws_user_error([&] { embedding_fwd(ctx, out, tokens, table); },
                                {"embedding_fwd", "tokens[2] = 37", "[0, 37)"}));
  tokens.ptr<int32_t>()[2] = -1;
  EXPECT_TRUE(throws_user_error([&] { embedding_bwd(ctx, dtable, tokens, out); },
                                {"embedding_bwd", "tokens[2] = -1"}));
  tokens.ptr<int32_t>()[2] = 0;
  Tensor tokens64 = Tensor::zeros({4}, DType::kI64, cpu);
  EXPECT_TRUE(throws_user_error([&] { embedding_fwd(ctx, out, tokens64, table); },
                                {"tokens", "must be i32"}));
  Tensor out_short = Tensor::zeros({3, kD}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { embedding_fwd(ctx, out_short, tokens, table); },
                                {"N = 3", "tokens [N] has 4"}));
  Tensor out_wide = Tensor::zeros({4, kD + 1}, DType::kBF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { embedding_fwd(ctx, out_wide, tokens, table); },
                                {"D = 25", "table [V, D] has D = 24"}));
  EXPECT_TRUE(throws_user_error([&] { embedding_bwd(ctx, table, tokens, out); },
                                {"dtable", "must be f32"}));
  Tensor out16 = Tensor::zeros({4, kD}, DType::kF16, cpu);
  EXPECT_TRUE(throws_user_error([&] { embedding_fwd(ctx, out16, tokens, table); },
                                {"out", "must be bf16 (or f32 on the CPU)", "f16"}));
  // A tensor that claims to live on a GPU, with a CPU context (never dereferenced).
  TensorView gpu_table(table.data(), DType::kBF16, {kV, kD}, Device::cuda(0));
  EXPECT_TRUE(throws_user_error([&] { embedding_fwd(ctx, out, tokens, gpu_table); },
                                {"table is on cuda:0", "context runs on cpu"}));
}

}  // namespace
}  // namespace lowbit::test

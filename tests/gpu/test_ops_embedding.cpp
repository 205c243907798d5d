// Token embedding on the GPU against the CPU twin: the gather bit for bit, the scatter-add bit for
// bit (same summation order, so also run-to-run deterministic), out-of-range tokens, guards. The
// backward's two sorts (merge-rank, radix) against each other, byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>

#include "lowbit/ops.h"
#include "ops/embedding_impl.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

struct Shape2 {
  int64_t n, d;
};
const Shape2 kShapes[] = {{1, 16}, {65, 80}, {993, 512}, {16384, 768}, {33, 17}};

OpCase fwd_case(Shape2 s, int64_t vocab, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("embedding_fwd {}x{} V={} {}", s.n, s.d, vocab, fill.name());
  c.args = {in("tokens", DType::kI32, {s.n}, Fill::ints(0, vocab)),
            in("table", DType::kBF16, {vocab, s.d}, fill), out("out", DType::kBF16, {s.n, s.d})};
  c.run = [](Context& ctx, const Args& a) {
    embedding_fwd(ctx, a["out"], a["tokens"], a["table"]);
  };
  return c;
}

OpCase bwd_case(Shape2 s, int64_t vocab, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("embedding_bwd {}x{} V={} {}", s.n, s.d, vocab, fill.name());
  c.args = {in("tokens", DType::kI32, {s.n}, Fill::ints(0, vocab)),
            in("dout", DType::kBF16, {s.n, s.d}, fill),
            inout("dtable", DType::kF32, {vocab, s.d}, Fill::gaussian(), Tol::exact())};
  c.run = [](Context& ctx, const Args& a) {
    embedding_bwd(ctx, a["dtable"], a["tokens"], a["dout"]);
  };
  return c;
}

using ops_detail::EmbeddingSort;

const char* sort_name(EmbeddingSort sort) {
  switch (sort) {
    case EmbeddingSort::kMergeRank: return "merge-rank";
    case EmbeddingSort::kRadix: return "radix";
    default: return "auto";
  }
}

// A backward whose GPU run sorts by `sort`; its CPU run is the twin (valid tokens only).
OpCase bwd_sort_case(Shape2 s, int64_t vocab, const Fill& tokens, EmbeddingSort sort,
                     const Fill& dout = Fill::gaussian()) {
  OpCase c;
  c.name = fmt::format("embedding_bwd {}x{} V={} tokens {} dout {} sort {}", s.n, s.d, vocab,
                       tokens.name(), dout.name(), sort_name(sort));
  c.args = {in("tokens", DType::kI32, {s.n}, tokens), in("dout", DType::kBF16, {s.n, s.d}, dout),
            inout("dtable", DType::kF32, {vocab, s.d}, Fill::gaussian(), Tol::exact())};
  c.run = [sort](Context& ctx, const Args& a) {
    if (ctx.on_gpu()) {
      ops_detail::embedding_bwd_cuda(ctx, a["dtable"], a["tokens"], a["dout"], sort);
    } else {
      embedding_bwd(ctx, a["dtable"], a["tokens"], a["dout"]);
    }
  };
  return c;
}

// Runs the backward on the GPU once with each sort from the same inputs: dtable's bytes must be
// identical (the sorts give the same (token, position) order). Also fails when dtable did not
// change although some token is valid (both runs skipping everything would agree vacuously), or
// changed although none is.
::testing::AssertionResult sorts_agree(Shape2 s, int64_t vocab, const Fill& tokens,
                                       const Fill& dout = Fill::gaussian()) {
  const std::string what = fmt::format("embedding_bwd {}x{} V={} tokens {} dout {}", s.n, s.d,
                                       vocab, tokens.name(), dout.name());
  const OpRun merge =
      run_op(bwd_sort_case(s, vocab, tokens, EmbeddingSort::kMergeRank, dout), Device::cuda(0));
  const OpRun radix = run_op(bwd_sort_case(s, vocab, tokens, EmbeddingSort::kRadix, dout),
                             Device::cuda(0), 1, &merge);
  if (!merge.integrity.empty())
    return ::testing::AssertionFailure() << what << ": " << merge.integrity;
  if (!radix.integrity.empty())
    return ::testing::AssertionFailure() << what << ": " << radix.integrity;
  const detail::Buffer& a = merge.buf("dtable");
  const detail::Buffer& b = radix.buf("dtable");
  const uint8_t* pa = static_cast<const uint8_t*>(a.host.data());  // [guard | V·D f32 | guard]
  const uint8_t* pb = static_cast<const uint8_t*>(b.host.data());
  const size_t bytes = a.initial.size();
  if (std::memcmp(pa, pb, bytes) != 0) {
    size_t i = 0;
    while (pa[i] == pb[i]) ++i;
    // The guards are intact (checked above), so the byte lies in an element.
    const int64_t e = (int64_t(i) - detail::kGuardBytes) / 4;
    const std::vector<double> va = a.values(), vb = b.values();
    return ::testing::AssertionFailure()
           << what << ": dtable differs first at byte " << i << ", element "
           << detail::coords(a.spec.shape, e) << ": merge-rank " << va[e] << ", radix " << vb[e];
  }
  bool any_valid = false;
  for (double t : merge.values("tokens")) any_valid |= t >= 0 && t < double(vocab);
  const bool updated = std::memcmp(pa, a.initial.data(), bytes) != 0;
  if (updated != any_valid) {
    return ::testing::AssertionFailure()
           << what
           << (any_valid ? ": dtable was not updated" : ": no valid token, yet dtable changed");
  }
  return ::testing::AssertionSuccess();
}

// Token patterns for the sorts (vocab V): out-of-range and negative tokens mixed with valid ones
// (the int32 extremes included), and runs of one token over `len` consecutive positions.
Fill invalid_mix(int64_t vocab) {
  return Fill::custom("invalid mix", [vocab](int64_t i) {
    if (i % 97 == 0) return i % 2 ? -2147483648.0 : 2147483647.0;
    if (i % 3 == 0) return -1.0 - double(i % 5);
    if (i % 3 == 1) return double(vocab + i % 4);
    return double((i * 7919) % vocab);
  });
}
Fill runs_of(int64_t len, int64_t vocab) {
  return Fill::custom(fmt::format("runs of {}", len),
                      [len, vocab](int64_t i) { return double((i / len) % vocab); });
}

TEST(GpuEmbedding, ForwardMatchesCpuBitForBit) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : standard_fills()) {
      EXPECT_TRUE(compare_cpu_gpu(fwd_case(s, 1000, fill)));
    }
  }
}

// The forward with a sort plan through the harness (guards around both outputs): the rows and
// the plan equal the CPU twin's, for few and many distinct tokens.
TEST(GpuEmbedding, ForwardWithSortPlanMatchesCpuBitForBit) {
  for (const Shape2& s : kShapes) {
    for (int64_t vocab : {7, 1000, 128256}) {
      if (vocab == 128256 && s.n * s.d > 993 * 512) continue;  // a 200 MB table on the CPU
      OpCase c = fwd_case(s, vocab, Fill::gaussian());
      c.name += " with sort plan";
      c.args.push_back(out("sort_plan", DType::kI32, {2, s.n}, Tol::exact()));
      c.run = [](Context& ctx, const Args& a) {
        embedding_fwd(ctx, a["out"], a["tokens"], a["table"], a["sort_plan"]);
      };
      EXPECT_TRUE(compare_cpu_gpu(c));
    }
  }
}

TEST(GpuEmbedding, BackwardMatchesCpuBitForBit) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : standard_fills()) {
      // Few distinct tokens (long runs of repeats) and a LLaMA-sized vocabulary.
      EXPECT_TRUE(compare_cpu_gpu(bwd_case(s, 7, fill)));
      if (s.n * s.d <= 993 * 512) EXPECT_TRUE(compare_cpu_gpu(bwd_case(s, 128256, fill)));
    }
  }
}

// Random tokens: the merge-rank sort (the default up to kEmbeddingBwdMergeRankMaxRows tokens)
// and the radix sort give the same bytes, across segment sizes (1024 positions) and chunk
// sizes, for vectorised (D % 8 == 0) and scalar rows.
TEST(GpuEmbedding, BackwardSortsAgreeBitForBit) {
  for (int64_t n : {1, 2, 255, 256, 257, 1000, 16384, 20000}) {
    for (int64_t d : {768, 5, 72}) {
      EXPECT_TRUE(sorts_agree({n, d}, 1000, Fill::ints(0, 1000)));
      // A LLaMA-sized vocabulary (most tokens distinct); dtable kept small.
      if (d < 768) {
        EXPECT_TRUE(sorts_agree({n, d}, 128256, Fill::ints(0, 128256)));
      }
    }
  }
  // NaN and infinities in dout propagate identically.
  EXPECT_TRUE(sorts_agree({5000, 72}, 50, Fill::ints(0, 50), Fill::specials()));
  // The largest batch the merge-rank sort takes.
  EXPECT_TRUE(
      sorts_agree({ops_detail::kEmbeddingBwdMergeRankMaxRows, 8}, 1000, Fill::ints(0, 1000)));
}

// Token patterns that stress the sort's ties and the carry across chunks: one token N times (a
// run crossing every chunk and segment), out-of-range and negative tokens (key V, sorted last and
// skipped), V = 1, three tokens (every token in every segment: ties across segments decided by
// position), and runs of consecutive positions crossing segment boundaries.
TEST(GpuEmbedding, BackwardSortsAgreeOnRepeatsAndInvalidTokens) {
  for (int64_t n : {1000, 16384, 20000}) {
    for (int64_t d : {768, 5}) {
      EXPECT_TRUE(sorts_agree({n, d}, 1000, Fill::constant(7)));
      EXPECT_TRUE(sorts_agree({n, d}, 1000, invalid_mix(1000)));
      EXPECT_TRUE(sorts_agree({n, d}, 1, Fill::zeros()));
      EXPECT_TRUE(sorts_agree({n, d}, 1, invalid_mix(1)));
      EXPECT_TRUE(sorts_agree({n, d}, 3, Fill::ints(0, 3)));
      EXPECT_TRUE(sorts_agree({n, d}, 50, runs_of(700, 50)));
      EXPECT_TRUE(sorts_agree({n, d}, 1000, runs_of(3, 1000)));
    }
  }
  // Nothing valid: dtable stays as it was (checked by sorts_agree).
  EXPECT_TRUE(sorts_agree({3000, 24}, 10, Fill::constant(-1)));
}

// Each sort, forced, against the CPU twin (the default path is covered by
// BackwardMatchesCpuBitForBit), and the default beyond the merge-rank sort's limit.
TEST(GpuEmbedding, BackwardEachSortMatchesCpuBitForBit) {
  for (EmbeddingSort sort : {EmbeddingSort::kMergeRank, EmbeddingSort::kRadix}) {
    for (int64_t n : {257, 20000}) {
      for (int64_t d : {72, 5}) {
        EXPECT_TRUE(compare_cpu_gpu(bwd_sort_case({n, d}, 1000, Fill::ints(0, 1000), sort)));
        EXPECT_TRUE(compare_cpu_gpu(bwd_sort_case({n, d}, 1000, Fill::constant(7), sort)));
        EXPECT_TRUE(compare_cpu_gpu(bwd_sort_case({n, d}, 3, Fill::ints(0, 3), sort)));
        EXPECT_TRUE(compare_cpu_gpu(bwd_sort_case({n, d}, 50, runs_of(700, 50), sort)));
      }
    }
    // Runs over 1 to 6 chunks, from every offset within a chunk: a run that crosses chunk
    // boundaries goes through the slots and the carry kernel's warp for its first boundary.
    for (int64_t len : {5, 17, 33, 49, 64, 65, 90}) {
      for (int64_t d : {72, 5}) {
        EXPECT_TRUE(compare_cpu_gpu(bwd_sort_case({2000, d}, 1000, runs_of(len, 1000), sort)));
      }
    }
  }
  const int64_t above = ops_detail::kEmbeddingBwdMergeRankMaxRows + 1;
  EXPECT_TRUE(compare_cpu_gpu(bwd_case({above, 8}, 1000, Fill::gaussian())));
  EXPECT_TRUE(compare_cpu_gpu(bwd_case({above, 8}, 7, Fill::gaussian())));
}

std::vector<uint8_t> host_bytes(const TensorView& t) {
  Tensor h = Tensor::copy_of(t, Device::cpu());
  const uint8_t* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.view().nbytes());
}

// The forward with a sort plan: the same rows as without, the plan the CPU twin writes (keys V
// for out-of-range tokens), and a backward given the plan writes the bits of one that sorts.
TEST(GpuEmbedding, SortPlanMatchesCpuAndServesTheBackward) {
  Context ctx(Device::cuda(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  struct Case {
    int64_t n, d, vocab;
    bool invalid;
  };
  const Case cases[] = {{1, 16, 10, false},         {257, 72, 1000, false},  {5000, 5, 50, true},
                        {16384, 768, 32000, false}, {20000, 72, 1000, true}, {3000, 24, 7, false}};
  for (const Case& cs : cases) {
    for (EmbeddingSort sort : {EmbeddingSort::kMergeRank, EmbeddingSort::kRadix}) {
      SCOPED_TRACE(fmt::format("{}x{} V={}{} {}", cs.n, cs.d, cs.vocab,
                               cs.invalid ? " with invalid tokens" : "", sort_name(sort)));
      Tensor tok_h = Tensor::zeros({cs.n}, DType::kI32, cpu);
      const Fill mix = invalid_mix(cs.vocab);
      for (int64_t i = 0; i < cs.n; ++i) {
        tok_h.ptr<int32_t>()[i] =
            cs.invalid ? int32_t(mix.fn(i)) : int32_t((i * 7919 + i / 3) % cs.vocab);
      }
      Tensor want = Tensor::zeros({2, cs.n}, DType::kI32, cpu);
      ops_detail::embedding_sort_plan_cpu(want, tok_h, cs.vocab);
      Tensor tokens = Tensor::copy_of(tok_h.view(), gpu);
      Tensor table_h = Tensor::zeros({cs.vocab, cs.d}, DType::kBF16, cpu);
      for (int64_t i = 0; i < table_h.view().numel(); ++i)
        table_h.ptr<uint16_t>()[i] = f32_to_bf16_rn(float(i % 97) * 0.25f - 3.0f);
      Tensor table = Tensor::copy_of(table_h.view(), gpu);
      Tensor out1 = Tensor::zeros({cs.n, cs.d}, DType::kBF16, gpu);
      Tensor out2 = Tensor::zeros({cs.n, cs.d}, DType::kBF16, gpu);
      Tensor plan = Tensor::zeros({2, cs.n}, DType::kI32, gpu);
      ops_detail::embedding_fwd_cuda(ctx, out1, tokens, table);
      ops_detail::embedding_fwd_cuda(ctx, out2, tokens, table, plan, sort);
      ctx.synchronize();
      EXPECT_EQ(host_bytes(out1), host_bytes(out2));
      EXPECT_EQ(host_bytes(plan), host_bytes(want));
      // dout = the forward's rows; the second pair accumulates onto the first.
      Tensor dt1f = Tensor::zeros({cs.vocab, cs.d}, DType::kF32, gpu);
      Tensor dt2f = Tensor::zeros({cs.vocab, cs.d}, DType::kF32, gpu);
      ops_detail::embedding_bwd_cuda(ctx, dt1f, tokens, out1, sort);
      ops_detail::embedding_bwd_cuda(ctx, dt2f, tokens, out1, sort, plan);
      ops_detail::embedding_bwd_cuda(ctx, dt1f, tokens, out1, sort);
      ops_detail::embedding_bwd_cuda(ctx, dt2f, tokens, out1, sort, plan);
      ctx.synchronize();
      EXPECT_EQ(host_bytes(dt1f), host_bytes(dt2f));
      // No host synchronisation between a forward that writes a fresh plan and the backwards
      // that use it (the main stream waits for the side stream by itself), with a sorting
      // backward in between reusing the workspace.
      Tensor plan3 = Tensor::zeros({2, cs.n}, DType::kI32, gpu);
      Tensor dt3f = Tensor::zeros({cs.vocab, cs.d}, DType::kF32, gpu);
      Tensor dt4f = Tensor::zeros({cs.vocab, cs.d}, DType::kF32, gpu);
      ops_detail::embedding_fwd_cuda(ctx, out2, tokens, table, plan3, sort);
      ops_detail::embedding_bwd_cuda(ctx, dt3f, tokens, out2, sort, plan3);
      ops_detail::embedding_bwd_cuda(ctx, dt4f, tokens, out2, sort);
      ops_detail::embedding_fwd_cuda(ctx, out2, tokens, table, plan3, sort);
      ops_detail::embedding_bwd_cuda(ctx, dt3f, tokens, out2, sort, plan3);
      ops_detail::embedding_bwd_cuda(ctx, dt4f, tokens, out2, sort);
      EXPECT_EQ(host_bytes(dt3f), host_bytes(dt4f));
      EXPECT_EQ(host_bytes(dt3f), host_bytes(dt1f));
    }
  }
}

// Forcing the merge-rank sort past its token limit is refused before anything runs, with a
// message that names the limit.
TEST(GpuEmbedding, ForcedMergeRankSortPastItsLimitIsAnError) {
  Context ctx(Device::cuda(0));
  const int64_t n = ops_detail::kEmbeddingBwdMergeRankMaxRows + 1, d = 8, vocab = 16;
  Tensor tokens = Tensor::zeros({n}, DType::kI32, ctx.device());
  Tensor dout = Tensor::zeros({n, d}, DType::kBF16, ctx.device());
  Tensor dtable = Tensor::zeros({vocab, d}, DType::kF32, ctx.device());
  try {
    ops_detail::embedding_bwd_cuda(ctx, dtable, tokens, dout, EmbeddingSort::kMergeRank);
    ADD_FAILURE() << "no error for " << n << " tokens";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("merge-rank sort takes at most"), std::string::npos)
        << e.what();
  }
}

TEST(GpuEmbedding, OutOfRangeTokensGiveNanRows) {
  const int64_t n = 40, d = 24, vocab = 10;
  OpCase c = fwd_case({n, d}, vocab, Fill::gaussian());
  c.args[0].fill = Fill::custom("some invalid", [](int64_t i) {
    return i % 7 == 3 ? (i % 2 ? -1.0 : 10.0) : double(i % 10);
  });
  OpRun r = run_op(c, Device::cuda(0));
  ASSERT_TRUE(r.intact());
  const auto tok = r.values("tokens"), table = r.values("table"), out = r.values("out");
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      if (i % 7 == 3) {
        ASSERT_TRUE(std::isnan(out[i * d + j])) << i;
      } else {
        ASSERT_EQ(out[i * d + j], table[tok[i] * d + j]) << i;
      }
    }
  }
  // The backward skips them: only valid rows are added.
  OpCase b = bwd_case({n, d}, vocab, Fill::gaussian());
  b.args[0].fill = c.args[0].fill;
  OpRun rb = run_op(b, Device::cuda(0));
  ASSERT_TRUE(rb.intact());
  std::vector<double> want = rb.initial("dtable");
  std::vector<std::vector<float>> acc(vocab, std::vector<float>(d, 0.0f));
  const auto dy = rb.values("dout");
  for (int64_t i = 0; i < n; ++i) {
    if (i % 7 == 3) continue;
    for (int64_t j = 0; j < d; ++j) acc[i % 10][j] += float(dy[i * d + j]);
  }
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t j = 0; j < d; ++j) want[v * d + j] = float(want[v * d + j]) + acc[v][j];
  }
  EXPECT_TRUE(expect_close("dtable", {vocab, d}, rb.values("dtable"), want, Tol::exact()));
}

TEST(GpuEmbeddingPerf, Bandwidth) {
  Context ctx(Device::cuda(0));
  for (int64_t d : {768, 2048}) {
    const int64_t n = 16384, vocab = 32000;
    const double copy = copy_gbps(ctx, n * d * 2);
    const Perf f = time_op(ctx, fwd_case({n, d}, vocab, Fill::gaussian()), 2.0 * n * d * 2 + 4 * n);
    // Backward: dout read once, each distinct token's dtable row read and written once.
    const OpCase bc = bwd_case({n, d}, vocab, Fill::gaussian());
    OpRun tok = run_op({"tokens", {bc.args[0]}, [](Context&, const Args&) {}}, Device::cpu());
    std::set<double> distinct;
    for (double t : tok.values("tokens")) distinct.insert(t);
    const double bwd_bytes = 2.0 * n * d + 8.0 * double(distinct.size()) * d;
    const Perf b = time_op(ctx, bc, bwd_bytes);
    // The radix sort on the same case, for reference (the default here is the merge-rank sort).
    const Perf br = time_op(
        ctx, bwd_sort_case({n, d}, vocab, Fill::ints(0, vocab), EmbeddingSort::kRadix), bwd_bytes);
    std::printf(
        "embedding N=%ld D=%ld: copy %.0f GB/s | fwd %s (%.0f%%) | bwd %s (%.0f%%, %zu distinct "
        "tokens) | bwd radix sort %s (%.0f%%)\n",
        long(n), long(d), copy, f.str().c_str(), 100 * f.gb_per_s / copy, b.str().c_str(),
        100 * b.gb_per_s / copy, distinct.size(), br.str().c_str(), 100 * br.gb_per_s / copy);
  }
}

}  // namespace
}  // namespace lowbit::test

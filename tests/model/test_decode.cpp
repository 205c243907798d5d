// Incremental decoding with a KV cache on the CPU: a prefill followed by one token per step
// gives the logits of last_logits() over the whole window (the BF16 recipe), the cache refuses
// positions past its capacity with a clear error, and reset() starts over.
//
// Why the logits agree so closely: per row, decode performs the operations of the full forward
// (the attention twin even in the same order, bit for bit); only the GEMMs run with other row
// counts (B·Tq instead of B·T), and OpenBLAS may block or sum a dot product differently for
// them. Such a difference moves an fp32 result by a few ulps, which can flip a bf16 rounding of
// an activation (2^-8 relative) now and then; the bound allows for a few such flips. (With
// the OpenBLAS of the CI image the logits are identical, max |diff| 0.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "lowbit/model.h"

namespace lowbit {
namespace {

ModelConfig decode_config() {
  ModelConfig c = model_preset("tiny");
  c.vocab_size = 96;
  c.n_layers = 2;
  c.max_seq_len = 32;
  return c;
}

Tensor random_tokens(int B, int T, int64_t vocab, uint32_t seed) {
  Tensor t = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<int32_t>()[i] = int32_t(rng() % vocab);
  return t;
}

// Columns [c0, c0 + n) of a [B, T] token matrix, contiguous.
Tensor columns(const Tensor& t, int c0, int n) {
  const int64_t B = t.shape()[0], T = t.shape()[1];
  Tensor out = Tensor::empty({B, n}, DType::kI32, Device::cpu());
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(t.ptr<int32_t>() + b * T + c0, n, out.ptr<int32_t>() + b * n);
  }
  return out;
}

struct Diff {
  double max_abs = 0, max_ref = 0;
};

Diff diff(const std::vector<float>& got, const std::vector<float>& want) {
  Diff d;
  for (size_t i = 0; i < got.size(); ++i) {
    d.max_abs = std::max(d.max_abs, std::fabs(double(got[i]) - want[i]));
    d.max_ref = std::max(d.max_ref, std::fabs(double(want[i])));
  }
  return d;
}

TEST(ModelDecode, PrefillThenStepsMatchLastLogits) {
  const ModelConfig c = decode_config();
  Context ctx(Device::cpu());
  LlamaModel m(c, resolve_precision(Recipe::kBF16, c), ctx);
  m.init_weights(7);
  const int B = 2, T = 20, P = 6;
  const Tensor tokens = random_tokens(B, T, c.vocab_size, 3);
  KvCache cache(ctx, c, B, 24);
  double worst = 0;
  for (int t = P; t <= T; ++t) {
    SCOPED_TRACE(fmt::format("position {}", t - 1));
    const std::vector<float> got = t == P ? m.decode(columns(tokens, 0, P), B, P, cache)
                                          : m.decode(columns(tokens, t - 1, 1), B, 1, cache);
    ASSERT_EQ(cache.length(), t);
    const std::vector<float> want = m.last_logits(columns(tokens, 0, t), B, t);
    ASSERT_EQ(got.size(), want.size());
    const Diff d = diff(got, want);
    worst = std::max(worst, d.max_abs / d.max_ref);
    for (float g : got) ASSERT_TRUE(std::isfinite(g));
    // A few bf16 roundings (2^-8) flipped by GEMM summation order, relative to the logits' scale.
    EXPECT_LE(d.max_abs, 0x1p-6 * d.max_ref)
        << "max |diff| " << d.max_abs << ", max |logit| " << d.max_ref;
  }
  std::printf("  max |decode − last_logits| / max |logit| = %.3g\n", worst);
}

// Generation evaluates the trained weights in BF16 whatever the recipe: a quantized-recipe model
// (whose block linears keep no bf16 compute copy) decodes exactly like the BF16 model with the
// same master weights, also after the weights change.
TEST(ModelDecode, QuantizedRecipesDecodeTheirWeightsInBf16) {
  const ModelConfig c = decode_config();
  Context ctx(Device::cpu());
  const int B = 2, P = 5;
  const Tensor tokens = random_tokens(B, P, c.vocab_size, 5);
  LlamaModel ref(c, resolve_precision(Recipe::kBF16, c), ctx);
  LlamaModel q(c, resolve_precision(Recipe::kFP8, c), ctx);
  EXPECT_LT(q.params().compute_all.numel(), ref.params().compute_all.numel());
  for (uint64_t seed : {11u, 12u}) {
    ref.init_weights(seed);
    // The same master weights (init_weights → sync_compute_weights → weights_changed()).
    q.init_weights(seed);
    KvCache ca(ctx, c, B, 8), cb(ctx, c, B, 8);
    EXPECT_EQ(ref.decode(tokens, B, P, ca), q.decode(tokens, B, P, cb)) << "seed " << seed;
  }
}

TEST(ModelDecode, CacheOverflowIsAClearErrorAndResetStartsOver) {
  const ModelConfig c = decode_config();
  Context ctx(Device::cpu());
  LlamaModel m(c, resolve_precision(Recipe::kBF16, c), ctx);
  m.init_weights(9);
  const int B = 1;
  const Tensor tokens = random_tokens(B, 12, c.vocab_size, 4);
  KvCache cache(ctx, c, B, 8);
  const std::vector<float> first = m.decode(columns(tokens, 0, 6), B, 6, cache);
  m.decode(columns(tokens, 6, 1), B, 1, cache);
  m.decode(columns(tokens, 7, 1), B, 1, cache);
  EXPECT_EQ(cache.length(), 8);
  try {
    m.decode(columns(tokens, 8, 1), B, 1, cache);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("do not fit the KV cache (8 of 8 used)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reset()"), std::string::npos) << msg;
  }
  EXPECT_EQ(cache.length(), 8);  // a refused call leaves the cache as it was
  cache.reset();
  EXPECT_EQ(m.decode(columns(tokens, 0, 6), B, 6, cache), first);
  // Capacity beyond max_seq_len, a wrong batch, bad tokens.
  try {
    KvCache too_long(ctx, c, 1, c.max_seq_len + 1);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("max_seq_len = 32"), std::string::npos) << e.what();
  }
  KvCache two(ctx, c, 2, 8);
  EXPECT_THROW(m.decode(columns(tokens, 0, 2), B, 2, two), UserError);
  Tensor f32 = Tensor::zeros({1, 2}, DType::kF32, Device::cpu());
  EXPECT_THROW(m.decode(f32, 1, 2, cache), UserError);
}

// Two sequences decode independently: each equals its own batch-of-one run (tiny tolerance:
// GEMM row blocking).
TEST(ModelDecode, SequencesOfABatchAreIndependent) {
  const ModelConfig c = decode_config();
  Context ctx(Device::cpu());
  LlamaModel m(c, resolve_precision(Recipe::kBF16, c), ctx);
  m.init_weights(11);
  const Tensor tokens = random_tokens(2, 9, c.vocab_size, 5);
  KvCache both(ctx, c, 2, 16);
  std::vector<float> got = m.decode(columns(tokens, 0, 5), 2, 5, both);
  for (int t = 5; t < 9; ++t) got = m.decode(columns(tokens, t, 1), 2, 1, both);
  const int64_t V = c.vocab_size;
  for (int b = 0; b < 2; ++b) {
    Tensor row = Tensor::empty({1, 9}, DType::kI32, Device::cpu());
    std::copy_n(tokens.ptr<int32_t>() + b * 9, 9, row.ptr<int32_t>());
    KvCache one(ctx, c, 1, 16);
    std::vector<float> want = m.decode(columns(row, 0, 5), 1, 5, one);
    for (int t = 5; t < 9; ++t) want = m.decode(columns(row, t, 1), 1, 1, one);
    const std::vector<float> mine(got.begin() + b * V, got.begin() + (b + 1) * V);
    const Diff d = diff(mine, want);
    EXPECT_LE(d.max_abs, 0x1p-6 * d.max_ref) << "sequence " << b;
  }
}

}  // namespace
}  // namespace lowbit

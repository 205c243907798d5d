// Synthetic Markov source: the entropy rate against a hand-computed chain and against long samples
// (within their statistical error), the stationary distribution, determinism, and shards.
#include <gtest/gtest.h>

#include <cmath>

#include "data/data_test_util.h"
#include "lowbit/data/loader.h"
#include "lowbit/data/synthetic.h"

namespace lowbit::data {
namespace {

using testing::user_error;

double h2(double p) { return -p * std::log(p) - (1 - p) * std::log(1 - p); }

// The mean of -log p(x_t | context) over a sample and its standard error (batch means, so that
// correlation between neighbouring tokens does not shrink the error).
std::pair<double, double> sample_log_loss(const MarkovSource& m, const std::vector<int32_t>& x) {
  const int64_t k = m.order(), n = static_cast<int64_t>(x.size()) - k;
  const int64_t batches = 100, per = n / batches;
  int64_t c = m.context_of(std::span(x).first(k));
  std::vector<double> means(batches, 0.0);
  for (int64_t i = 0; i < batches * per; ++i) {
    const int32_t y = x[k + i];
    means[i / per] -= std::log(m.prob(c, y));
    c = m.next_context(c, y);
  }
  double mean = 0.0, var = 0.0;
  for (double& v : means) mean += (v /= per);
  mean /= batches;
  for (double v : means) var += (v - mean) * (v - mean);
  return {mean, std::sqrt(var / (batches - 1) / batches)};
}

TEST(Markov, TwoStateChainByHand) {
  // p(1 | 0) = a, p(0 | 1) = b: π = (b, a) / (a + b), H = π0·h(a) + π1·h(b).
  const double a = 0.1, b = 0.4;
  const MarkovSource m = MarkovSource::from_table(2, 1, {1 - a, a, b, 1 - b});
  EXPECT_NEAR(m.stationary()[0], 0.8, 1e-12);
  EXPECT_NEAR(m.stationary()[1], 0.2, 1e-12);
  EXPECT_NEAR(m.entropy_rate(), 0.8 * h2(a) + 0.2 * h2(b), 1e-12);
  // A long sample: empirical state frequency and log loss.
  const std::vector<int32_t> x = m.generate(400000, 3);
  double ones = 0;
  for (int32_t v : x) ones += v;
  EXPECT_NEAR(ones / x.size(), 0.2, 0.01);
  const auto [mean, se] = sample_log_loss(m, x);
  EXPECT_NEAR(mean, m.entropy_rate(), 5 * se);
}

TEST(Markov, PeriodicChainStillHasItsStationaryDistribution) {
  // Deterministic alternation 0 1 0 1 ...: period 2, π = (1/2, 1/2), entropy rate 0.
  const MarkovSource m = MarkovSource::from_table(2, 1, {0, 1, 1, 0});
  EXPECT_NEAR(m.stationary()[0], 0.5, 1e-12);
  EXPECT_NEAR(m.entropy_rate(), 0.0, 1e-15);
  const std::vector<int32_t> x = m.generate(10, 1);
  for (size_t i = 1; i < x.size(); ++i) EXPECT_NE(x[i], x[i - 1]);
}

TEST(Markov, IidSourceIsItsOwnEntropy) {
  // Order 0, support = n, no mixing: the entropy of the one distribution.
  MarkovOptions o;
  o.vocab_size = 16;
  o.order = 0;
  o.support = 16;
  o.uniform_mix = 0.0;
  o.seed = 4;
  const MarkovSource m(o);
  double h = 0.0;
  for (int y = 0; y < 16; ++y) h -= m.prob(0, y) * std::log(m.prob(0, y));
  EXPECT_NEAR(m.entropy_rate(), h, 1e-12);
}

TEST(Markov, DefaultSourceMatchesALongSample) {
  const MarkovSource m{MarkovOptions{}};  // n = 256, k = 2, support 8, mix 0.01
  EXPECT_EQ(m.num_contexts(), 65536);
  double total = 0.0;
  for (double p : m.stationary()) total += p;
  EXPECT_NEAR(total, 1.0, 1e-9);
  // Sparse transitions: well below the uniform log(256) = 5.55 nats, well above 0.
  EXPECT_GT(m.entropy_rate(), 1.0);
  EXPECT_LT(m.entropy_rate(), 2.5);
  const std::vector<int32_t> x = m.generate(2000000, 17);
  const auto [mean, se] = sample_log_loss(m, x);
  EXPECT_LT(se, 0.005);
  EXPECT_NEAR(mean, m.entropy_rate(), 5 * se) << "standard error " << se;
  std::printf("Markov n=256 k=2: entropy rate %.6f nats/token, sample %.6f ± %.6f\n",
              m.entropy_rate(), mean, se);
}

TEST(Markov, SmallChainPlugInEstimate) {
  // n = 3, k = 1 with all transitions possible: counts of a long sample estimate π and p(y | c).
  MarkovOptions o;
  o.vocab_size = 3;
  o.order = 1;
  o.support = 3;
  o.uniform_mix = 0.0;
  o.seed = 9;
  const MarkovSource m(o);
  const std::vector<int32_t> x = m.generate(600000, 2);
  double counts[3][3] = {};
  for (size_t i = 1; i < x.size(); ++i) counts[x[i - 1]][x[i]] += 1;
  double h = 0.0, n = static_cast<double>(x.size() - 1);
  for (int c = 0; c < 3; ++c) {
    const double row = counts[c][0] + counts[c][1] + counts[c][2];
    EXPECT_NEAR(row / n, m.stationary()[c], 0.01);
    for (int y = 0; y < 3; ++y) {
      if (counts[c][y] > 0) h -= counts[c][y] / n * std::log(counts[c][y] / row);
    }
  }
  EXPECT_NEAR(h, m.entropy_rate(), 0.01);
}

TEST(Markov, DeterministicPieceIndependentAndSeeded) {
  MarkovOptions o;
  o.vocab_size = 50;
  o.order = 2;
  o.support = 5;
  const MarkovSource a(o), b(o);
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  EXPECT_EQ(a.generate(5000, 1), b.generate(5000, 1));
  EXPECT_NE(a.generate(5000, 1), a.generate(5000, 2));
  o.seed = 1;
  EXPECT_NE(MarkovSource(o).fingerprint(), a.fingerprint());
  // Generating in pieces gives the same sequence.
  const std::vector<int32_t> whole = a.generate(3000, 8);
  std::vector<int32_t> pieces(whole.begin(), whole.begin() + 1000);
  int64_t c = a.context_of(pieces);
  std::vector<int32_t> rest(2000);
  a.generate_range(1000, c, 8, 0, rest);
  pieces.insert(pieces.end(), rest.begin(), rest.end());
  EXPECT_EQ(pieces, whole);
}

TEST(Markov, RejectsBadOptions) {
  MarkovOptions o;
  o.support = 300;
  EXPECT_NE(user_error([&] { MarkovSource m(o); }).find("support"), std::string::npos);
  o = MarkovOptions{};
  o.order = 4;
  EXPECT_NE(user_error([&] { MarkovSource m(o); }).find("too large"), std::string::npos);
  EXPECT_NE(user_error([] {
              MarkovSource::from_table(2, 1, {0.5, 0.4, 0.5, 0.5});
            }).find("sum to"),
            std::string::npos);
}

class MarkovShards : public testing::ScratchDirTest {};

TEST_F(MarkovShards, WrittenShardsFeedTheLoader) {
  MarkovOptions o;
  o.vocab_size = 64;
  o.order = 1;
  o.support = 4;
  const MarkovSource m(o);
  const auto files = write_markov_shards(m, path("syn"), "train", 50000, 5, 0, 20000);
  ASSERT_EQ(files.size(), 3u);
  const std::vector<std::string> dir = {path("syn")};
  const auto shards = open_shards(dir, m.fingerprint());
  std::vector<int32_t> all;
  for (const auto& s : shards) {
    EXPECT_EQ(s->vocab_size(), 64);
    std::vector<int32_t> part(s->size());
    s->copy_tokens(0, s->size(), part.data());
    all.insert(all.end(), part.begin(), part.end());
  }
  EXPECT_EQ(all, m.generate(50000, 5));
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.seq_len = 64;
  DataLoader dl(shards, {}, lo);
  EXPECT_EQ(dl.next_train_batch().target_count, 256);
}

}  // namespace
}  // namespace lowbit::data

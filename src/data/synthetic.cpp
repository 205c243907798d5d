// Random order-k Markov source with an exactly computed entropy rate
// (include/lowbit/data/synthetic.h).
#include "lowbit/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>

#include <fmt/format.h>

#include "data/data_util.h"
#include "lowbit/core/error.h"
#include "lowbit/core/philox.h"

namespace lowbit::data {

namespace {

// Philox streams (offsets) of the construction draws; the context index is added to them.
constexpr uint64_t kSupportStream = uint64_t{1} << 40;
constexpr uint64_t kLogitStream = uint64_t{2} << 40;
// Stream tag of the initial context of a generated sequence.
constexpr uint64_t kStartTag = uint64_t{0x5354415254} << 20;  // "START"

constexpr int64_t kMaxEntries = int64_t{1} << 26;
constexpr int kMaxPowerIterations = 100000;
constexpr double kPowerTolerance = 1e-13;

// A uniform double in [0, 1) with 53 random bits from Philox (seed, stream, index).
double uniform53(uint64_t seed, uint64_t stream, uint64_t index) {
  const Philox4 r = philox_block(seed, stream, index);
  const uint64_t bits = (static_cast<uint64_t>(r.v[1]) << 32) | r.v[0];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace

MarkovSource::MarkovSource(const MarkovOptions& o) {
  LOWBIT_USER_CHECK(o.vocab_size >= 2, "Markov source: vocabulary size must be at least 2 (got {})",
                    o.vocab_size);
  LOWBIT_USER_CHECK(o.order >= 0, "Markov source: order must be at least 0 (got {})", o.order);
  LOWBIT_USER_CHECK(o.support >= 1 && o.support <= o.vocab_size,
                    "Markov source: support must be in [1, vocabulary size {}] (got {})",
                    o.vocab_size, o.support);
  LOWBIT_USER_CHECK(o.temperature > 0.0 && std::isfinite(o.temperature),
                    "Markov source: temperature must be positive (got {})", o.temperature);
  LOWBIT_USER_CHECK(o.uniform_mix >= 0.0 && o.uniform_mix <= 1.0,
                    "Markov source: uniform_mix must be in [0, 1] (got {})", o.uniform_mix);
  int64_t contexts = 1;
  for (int i = 0; i < o.order; ++i) {
    contexts *= o.vocab_size;
    LOWBIT_USER_CHECK(contexts * o.support <= kMaxEntries,
                      "Markov source: {}^{} contexts × support {} is too large (at most 2^26 "
                      "entries): lower the order, the vocabulary size or the support",
                      o.vocab_size, o.order, o.support);
  }
  n_ = o.vocab_size;
  k_ = o.order;
  support_ = o.support;
  contexts_ = contexts;
  mix_ = o.uniform_mix;
  next_.resize(contexts * support_);
  q_.resize(contexts * support_);
  std::vector<int32_t> picked;
  std::vector<double> g(support_);
  for (int64_t c = 0; c < contexts; ++c) {
    // `support` distinct tokens by rejection (support is usually far below n).
    picked.clear();
    for (uint64_t draw = 0; static_cast<int32_t>(picked.size()) < support_; ++draw) {
      int32_t y;
      if (support_ == n_) {
        y = static_cast<int32_t>(picked.size());
      } else {
        y = std::min<int32_t>(
            n_ - 1, static_cast<int32_t>(uniform53(o.seed, kSupportStream + c, draw) * n_));
      }
      if (std::find(picked.begin(), picked.end(), y) == picked.end()) picked.push_back(y);
    }
    std::sort(picked.begin(), picked.end());
    // Gaussian logits by Box-Muller, softmax with the temperature.
    double gmax = -INFINITY;
    for (int32_t j = 0; j < support_; ++j) {
      const double u1 = 1.0 - uniform53(o.seed, kLogitStream + c, 2 * j);  // (0, 1]
      const double u2 = uniform53(o.seed, kLogitStream + c, 2 * j + 1);
      g[j] = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2) / o.temperature;
      gmax = std::max(gmax, g[j]);
    }
    double sum = 0.0;
    for (int32_t j = 0; j < support_; ++j) sum += (g[j] = std::exp(g[j] - gmax));
    for (int32_t j = 0; j < support_; ++j) {
      next_[c * support_ + j] = picked[j];
      q_[c * support_ + j] = g[j] / sum;
    }
  }
  finish_construction();
}

MarkovSource MarkovSource::from_table(int32_t vocab_size, int32_t order,
                                      std::vector<double> probs) {
  LOWBIT_USER_CHECK(vocab_size >= 2 && order >= 0,
                    "Markov table: vocabulary size {} / order {} (need n >= 2, k >= 0)", vocab_size,
                    order);
  int64_t contexts = 1;
  for (int i = 0; i < order; ++i) {
    contexts *= vocab_size;
    LOWBIT_USER_CHECK(contexts * vocab_size <= kMaxEntries, "Markov table: too many contexts");
  }
  LOWBIT_USER_CHECK(static_cast<int64_t>(probs.size()) == contexts * vocab_size,
                    "Markov table: {} probabilities given, {}^{} contexts × {} tokens = {} needed",
                    probs.size(), vocab_size, order, vocab_size, contexts * vocab_size);
  for (int64_t c = 0; c < contexts; ++c) {
    double sum = 0.0;
    for (int32_t y = 0; y < vocab_size; ++y) {
      const double p = probs[c * vocab_size + y];
      LOWBIT_USER_CHECK(p >= 0.0 && std::isfinite(p),
                        "Markov table: p({} | context {}) = {} is not a probability", y, c, p);
      sum += p;
    }
    LOWBIT_USER_CHECK(std::abs(sum - 1.0) <= 1e-9,
                      "Markov table: the probabilities of context {} sum to {}, not 1", c, sum);
  }
  MarkovSource s;
  s.n_ = vocab_size;
  s.k_ = order;
  s.support_ = vocab_size;
  s.contexts_ = contexts;
  s.mix_ = 0.0;
  s.next_.resize(probs.size());
  for (int64_t c = 0; c < contexts; ++c) {
    for (int32_t y = 0; y < vocab_size; ++y) s.next_[c * vocab_size + y] = y;
  }
  s.q_ = std::move(probs);
  s.finish_construction();
  return s;
}

void MarkovSource::finish_construction() {
  const int64_t C = contexts_, S = support_;
  const double u = mix_ / n_;  // the uniform part of every transition
  // Stationary distribution: π ← (π + πP) / 2 from the uniform distribution. The lazy step has
  // the same fixed points as P and is aperiodic, so it converges whenever π is unique.
  std::vector<double> pi(C, 1.0 / static_cast<double>(C)), next(C), suffix;
  const int64_t suffixes = C / n_;  // contexts that share the last k-1 tokens: C / n (k >= 1)
  int iter = 0;
  for (; iter < kMaxPowerIterations && C > 1; ++iter) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t c = 0; c < C; ++c) {
      const double w = pi[c] * (1.0 - mix_);
      if (w == 0.0) continue;
      const int64_t base = (c % suffixes) * n_;  // next_context(c, y) = base + y
      for (int64_t j = 0; j < S; ++j) next[base + next_[c * S + j]] += w * q_[c * S + j];
    }
    if (mix_ > 0.0) {
      suffix.assign(suffixes, 0.0);
      for (int64_t c = 0; c < C; ++c) suffix[c % suffixes] += pi[c];
      for (int64_t c = 0; c < C; ++c) next[c] += u * suffix[c / n_];
    }
    double diff = 0.0, total = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double v = 0.5 * (pi[c] + next[c]);
      diff += std::abs(v - pi[c]);
      total += v;
      pi[c] = v;
    }
    for (double& v : pi) v /= total;
    if (diff < kPowerTolerance) break;
  }
  LOWBIT_USER_CHECK(iter < kMaxPowerIterations,
                    "Markov source: the stationary distribution did not converge in {} iterations "
                    "(a chain that mixes very slowly): raise uniform_mix",
                    kMaxPowerIterations);
  stationary_ = std::move(pi);

  // Entropy of each context's next-token distribution, weighted by π.
  const double uniform_only = u > 0.0 ? -u * std::log(u) : 0.0;  // a token outside the support
  double h = 0.0;
  for (int64_t c = 0; c < C; ++c) {
    double hc = static_cast<double>(n_ - S) * uniform_only;
    for (int64_t j = 0; j < S; ++j) {
      const double p = (1.0 - mix_) * q_[c * S + j] + u;
      if (p > 0.0) hc -= p * std::log(p);
    }
    h += stationary_[c] * hc;
  }
  entropy_rate_ = h;

  std::string canon = "lowbit-markov-v1";
  detail::put_u32(canon, static_cast<uint32_t>(n_));
  detail::put_u32(canon, static_cast<uint32_t>(k_));
  detail::put_u32(canon, static_cast<uint32_t>(S));
  uint64_t mix_bits;
  std::memcpy(&mix_bits, &mix_, 8);
  detail::put_u64(canon, mix_bits);
  canon.append(reinterpret_cast<const char*>(next_.data()), next_.size() * sizeof(int32_t));
  canon.append(reinterpret_cast<const char*>(q_.data()), q_.size() * sizeof(double));
  fingerprint_ = detail::hash64(canon);
}

double MarkovSource::prob(int64_t context, int32_t y) const {
  LOWBIT_USER_CHECK(context >= 0 && context < contexts_ && y >= 0 && y < n_,
                    "Markov source: p({} | {}) is outside {} tokens × {} contexts", y, context, n_,
                    contexts_);
  const int32_t* nx = next_.data() + context * support_;
  const int32_t* it = std::lower_bound(nx, nx + support_, y);
  const double q = (it != nx + support_ && *it == y) ? q_[context * support_ + (it - nx)] : 0.0;
  return (1.0 - mix_) * q + mix_ / n_;
}

int64_t MarkovSource::context_of(std::span<const int32_t> history) const {
  LOWBIT_USER_CHECK(static_cast<int64_t>(history.size()) >= k_,
                    "Markov source: a context needs the last {} tokens, got {}", k_,
                    history.size());
  int64_t c = 0;
  for (size_t i = history.size() - k_; i < history.size(); ++i) c = c * n_ + history[i];
  return c;
}

void MarkovSource::generate_range(int64_t begin, int64_t context, uint64_t seed, uint64_t stream,
                                  std::span<int32_t> out) const {
  const int64_t S = support_;
  for (size_t i = 0; i < out.size(); ++i) {
    double r = uniform53(seed, stream, static_cast<uint64_t>(begin) + i);
    int32_t y;
    if (r < mix_) {
      y = std::min<int32_t>(n_ - 1, static_cast<int32_t>(r / mix_ * n_));
    } else {
      r = (r - mix_) / (1.0 - mix_);
      const double* q = q_.data() + context * S;
      int64_t j = 0;
      for (double acc = q[0]; j + 1 < S && r >= acc; acc += q[++j]) {
      }
      y = next_[context * S + j];
    }
    out[i] = y;
    context = next_context(context, y);
  }
}

std::vector<int32_t> MarkovSource::generate(int64_t count, uint64_t seed, uint64_t stream) const {
  LOWBIT_USER_CHECK(count >= 0, "Markov source: cannot generate {} tokens", count);
  std::vector<int32_t> out(count);
  // The first context from π.
  const double r = uniform53(seed, stream ^ kStartTag, 0);
  int64_t c0 = 0;
  for (double acc = stationary_[0]; c0 + 1 < contexts_ && r >= acc; acc += stationary_[++c0]) {
  }
  int64_t c = c0;
  for (int i = k_ - 1; i >= 0; --i) {  // its tokens, most significant digit first
    if (i < count) out[i] = static_cast<int32_t>(c % n_);
    c /= n_;
  }
  if (count > k_) generate_range(k_, c0, seed, stream, std::span<int32_t>(out).subspan(k_));
  return out;
}

std::vector<std::string> write_markov_shards(const MarkovSource& source, const std::string& dir,
                                             const std::string& prefix, int64_t count,
                                             uint64_t seed, uint64_t stream, int64_t shard_tokens) {
  LOWBIT_USER_CHECK(count > source.order(),
                    "Markov shards: {} tokens is too few (more than the order {} are needed)",
                    count, source.order());
  ShardWriter writer(dir, prefix, source.fingerprint(), source.vocab_size(), shard_tokens);
  // The first piece from generate() (its initial context), the rest piece by piece.
  const int64_t piece = std::min<int64_t>(count, int64_t{1} << 22);
  std::vector<int32_t> buf = source.generate(piece, seed, stream);
  writer.add(buf);
  int64_t context = source.context_of(buf);
  for (int64_t pos = piece; pos < count;) {
    const int64_t n = std::min<int64_t>(count - pos, int64_t{1} << 22);
    buf.resize(n);
    source.generate_range(pos, context, seed, stream, buf);
    writer.add(buf);
    for (int32_t y : buf) context = source.next_context(context, y);
    pos += n;
  }
  std::vector<std::string> paths;
  for (const ShardInfo& s : writer.finish()) {
    paths.push_back((std::filesystem::path(dir) / s.file).string());
  }
  return paths;
}

}  // namespace lowbit::data

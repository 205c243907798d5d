// A synthetic corpus with a known entropy rate: a random order-k Markov source over n tokens.
//
// Context c is the last k tokens read as a base-n number (c = x[t-k]·n^(k-1) + … + x[t-1]),
// C = n^k contexts. Each context has `support` distinct possible next tokens with probabilities
// q_c = softmax(g / temperature), g ~ N(0, 1) i.i.d., mixed with the uniform distribution:
//     p(y | c) = (1 − uniform_mix) · q_c(y) + uniform_mix / n.
// With uniform_mix > 0 every transition is possible, so the chain is irreducible and aperiodic:
// its stationary distribution π over contexts is unique, and the entropy rate
//     H = Σ_c π(c) · H(p(· | c))        (nats per token)
// is the expected loss of a model that knows the source: the floor of the training loss.
// Everything is drawn from Philox keyed by the seed, so a source is the same on every machine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lowbit/data/shards.h"

namespace lowbit::data {

struct MarkovOptions {
  int32_t vocab_size = 256;   // n
  int32_t order = 2;          // k (0 = independent tokens)
  int32_t support = 8;        // next tokens with weight per context (at most n)
  double temperature = 1.0;   // of the softmax over the Gaussian logits (lower = more peaked)
  double uniform_mix = 0.01;  // weight of the uniform distribution in every context
  uint64_t seed = 0;
};

class MarkovSource {
 public:
  // A random source. UserError for bad options (n < 2, k < 0, support outside [1, n],
  // temperature <= 0, uniform_mix outside [0, 1], or more than 2^26 context × support entries).
  explicit MarkovSource(const MarkovOptions& options);
  // A source given by its full table: probs[c · n + y] = p(y | c) for the n^k contexts; each row
  // sums to 1 (within 1e-9). UserError otherwise.
  static MarkovSource from_table(int32_t vocab_size, int32_t order, std::vector<double> probs);

  int32_t vocab_size() const { return n_; }
  int32_t order() const { return k_; }
  int64_t num_contexts() const { return contexts_; }
  // p(y | c).
  double prob(int64_t context, int32_t next) const;
  // The context after the last k tokens of `history` (history.size() >= k).
  int64_t context_of(std::span<const int32_t> history) const;
  int64_t next_context(int64_t context, int32_t token) const {
    return contexts_ == 1 ? 0 : (context * n_ + token) % contexts_;
  }

  // The stationary distribution over contexts (lazy power iteration to an L1 change below 1e-13).
  const std::vector<double>& stationary() const { return stationary_; }
  // The entropy rate in nats per token.
  double entropy_rate() const { return entropy_rate_; }
  // A 64-bit hash of the whole transition table: shards of this source record it in place of a
  // tokenizer's fingerprint.
  uint64_t fingerprint() const { return fingerprint_; }

  // Tokens 0 .. count-1 of the sequence (seed, stream): the first k tokens are a context drawn
  // from π, each later token is drawn given its context, token t from Philox index t — so the
  // sequence is stationary from its start and does not depend on how it is cut into pieces.
  std::vector<int32_t> generate(int64_t count, uint64_t seed, uint64_t stream = 0) const;
  // Tokens [begin, begin + out.size()) of the same sequence, given the context before `begin`
  // (for begin >= k) — generation piece by piece.
  void generate_range(int64_t begin, int64_t context, uint64_t seed, uint64_t stream,
                      std::span<int32_t> out) const;

 private:
  MarkovSource() = default;
  void finish_construction();  // stationary distribution, entropy rate, fingerprint
  int32_t n_ = 0, k_ = 0, support_ = 0;
  int64_t contexts_ = 0;
  double mix_ = 0.0;
  std::vector<int32_t> next_;  // (contexts, support): the tokens with weight, ascending
  std::vector<double> q_;      // (contexts, support): their probabilities (each row sums to 1)
  std::vector<double> stationary_;
  double entropy_rate_ = 0.0;
  uint64_t fingerprint_ = 0;
};

// Writes `count` tokens of the sequence (seed, stream) as shards `<dir>/<prefix>_NNNNNN.lbt` plus
// manifest.json (ShardWriter), with the source's fingerprint. Returns the shard files' paths.
std::vector<std::string> write_markov_shards(const MarkovSource& source, const std::string& dir,
                                             const std::string& prefix, int64_t count,
                                             uint64_t seed, uint64_t stream = 0,
                                             int64_t shard_tokens = int64_t{1} << 24);

}  // namespace lowbit::data

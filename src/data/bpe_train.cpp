// BPE training (include/lowbit/data/tokenizer.h): pre-token counting, then merges chosen from a
// max-heap of pair counts with lazy invalidation.
//
// Invariant of the heap: every pair with a positive count has at least one entry whose count is at
// least its current count (an entry is pushed whenever a count grows). A popped entry whose count
// differs from the pair's current count is stale: it is pushed again with the current count. The
// first entry popped with a current count is therefore the most frequent pair, and among equal
// counts the one with the smallest (left, right) ids.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "data/data_util.h"
#include "data/pretokenize.h"
#include "lowbit/core/error.h"
#include "lowbit/data/tokenizer.h"

namespace lowbit::data {

namespace {

using detail::key_left;
using detail::key_right;
using detail::pair_key;
using detail::StringEq;
using detail::StringHash;

struct HeapEntry {
  int64_t count;
  uint64_t key;
  // std::priority_queue pops the largest: the higher count, then the smaller key.
  bool operator<(const HeapEntry& o) const {
    return count != o.count ? count < o.count : key > o.key;
  }
};

struct Word {
  std::vector<int32_t> sym;
  int64_t freq;
};

}  // namespace

struct BpeTrainer::State {
  BpeTrainOptions options;
  std::unordered_map<std::string, int64_t, StringHash, StringEq> counts;
  int64_t text_bytes = 0;
  int64_t pretokens = 0;
  bool trained = false;
};

BpeTrainer::BpeTrainer(BpeTrainOptions options) : state_(std::make_unique<State>()) {
  const auto n_special = static_cast<int64_t>(options.special_tokens.size());
  LOWBIT_USER_CHECK(options.vocab_size >= 256 + n_special,
                    "BPE training: vocabulary size {} is too small: it must hold the 256 bytes and "
                    "the {} special tokens (at least {})",
                    options.vocab_size, n_special, 256 + n_special);
  std::unordered_set<std::string> seen;
  for (const std::string& s : options.special_tokens) {
    LOWBIT_USER_CHECK(!s.empty(), "BPE training: a special token is empty");
    LOWBIT_USER_CHECK(s.size() > 1,
                      "BPE training: special token '{}' is a single byte, which is already an "
                      "ordinary token",
                      s);
    LOWBIT_USER_CHECK(seen.insert(s).second, "BPE training: special token '{}' is given twice", s);
  }
  LOWBIT_USER_CHECK(options.min_pair_count >= 1,
                    "BPE training: min_pair_count must be at least 1 (got {})",
                    options.min_pair_count);
  state_->options = std::move(options);
}

BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::add_text(std::string_view text) {
  State& st = *state_;
  LOWBIT_CHECK(!st.trained, "add_text after train");
  st.text_bytes += static_cast<int64_t>(text.size());
  detail::for_each_pretoken(text, st.options.pretokenizer, [&](std::string_view w) {
    ++st.pretokens;
    const auto it = st.counts.find(w);
    if (it != st.counts.end()) {
      ++it->second;
    } else {
      st.counts.emplace(std::string(w), 1);
    }
  });
}

Tokenizer BpeTrainer::train(BpeTrainStats* stats) {
  State& st = *state_;
  LOWBIT_CHECK(!st.trained, "train called twice");
  st.trained = true;
  const BpeTrainOptions& opt = st.options;
  const int32_t target = opt.vocab_size - static_cast<int32_t>(opt.special_tokens.size());

  // The vocabulary: the 256 bytes first, then each new merged token.
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t, StringHash, StringEq> bytes_to_id;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    bytes_to_id.emplace(tokens.back(), b);
  }

  // Words sorted by their bytes, so that the work order does not depend on hashing.
  std::vector<std::pair<std::string, int64_t>> sorted(st.counts.begin(), st.counts.end());
  st.counts.clear();
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [w, c] : sorted) {
    Word word{{}, c};
    word.sym.reserve(w.size());
    for (unsigned char b : w) word.sym.push_back(b);
    words.push_back(std::move(word));
  }

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // pair -> words that may hold it
  for (size_t wi = 0; wi < words.size(); ++wi) {
    const Word& w = words[wi];
    for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
      const uint64_t k = pair_key(w.sym[i], w.sym[i + 1]);
      pair_count[k] += w.freq;
      auto& list = where[k];
      if (list.empty() || list.back() != static_cast<int32_t>(wi)) {
        list.push_back(static_cast<int32_t>(wi));
      }
    }
  }
  std::priority_queue<HeapEntry> heap;
  for (const auto& [k, c] : pair_count) heap.push({c, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_map<uint64_t, int64_t> delta;
  while (static_cast<int32_t>(tokens.size()) < target && !heap.empty()) {
    const HeapEntry top = heap.top();
    heap.pop();
    const auto pc = pair_count.find(top.key);
    const int64_t current = pc == pair_count.end() ? 0 : pc->second;
    if (current != top.count) {
      if (current > 0) heap.push({current, top.key});
      continue;
    }
    if (current < opt.min_pair_count) break;
    const int32_t left = key_left(top.key), right = key_right(top.key);
    std::string joined = tokens[left] + tokens[right];
    int32_t merged;
    const auto existing = bytes_to_id.find(joined);
    if (existing != bytes_to_id.end()) {
      merged = existing->second;  // another merge already made these bytes
    } else {
      merged = static_cast<int32_t>(tokens.size());
      bytes_to_id.emplace(joined, merged);
      tokens.push_back(std::move(joined));
    }
    merges.emplace_back(left, right);

    // Rewrite every word holding the pair: remove its old pairs, merge left to right, add its new
    // pairs; the counts change by the difference.
    std::vector<int32_t> holders = std::move(where[top.key]);
    where.erase(top.key);
    delta.clear();
    std::vector<int32_t> out;
    for (int32_t wi : holders) {
      Word& w = words[wi];
      bool found = false;
      for (size_t i = 0; i + 1 < w.sym.size() && !found; ++i) {
        found = w.sym[i] == left && w.sym[i + 1] == right;
      }
      if (!found) continue;  // a stale index entry: merged away already
      for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
        delta[pair_key(w.sym[i], w.sym[i + 1])] -= w.freq;
      }
      out.clear();
      for (size_t i = 0; i < w.sym.size();) {
        if (i + 1 < w.sym.size() && w.sym[i] == left && w.sym[i + 1] == right) {
          out.push_back(merged);
          i += 2;
        } else {
          out.push_back(w.sym[i]);
          ++i;
        }
      }
      w.sym.assign(out.begin(), out.end());
      for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
        const uint64_t k = pair_key(w.sym[i], w.sym[i + 1]);
        delta[k] += w.freq;
        if (w.sym[i] == merged || w.sym[i + 1] == merged) {
          auto& list = where[k];
          if (list.empty() || list.back() != wi) list.push_back(wi);
        }
      }
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count[k];
      c += d;
      if (d > 0) heap.push({c, k});
      if (c == 0) pair_count.erase(k);
    }
    pair_count.erase(top.key);
  }

  std::vector<SpecialToken> specials;
  for (const std::string& s : opt.special_tokens) {
    specials.push_back({static_cast<int32_t>(tokens.size()), s});
    tokens.push_back(s);
  }
  if (stats != nullptr) {
    stats->text_bytes = st.text_bytes;
    stats->pretokens = st.pretokens;
    stats->unique_pretokens = static_cast<int64_t>(words.size());
    stats->merges = static_cast<int64_t>(merges.size());
    stats->corpus_tokens = 0;
    for (const Word& w : words) stats->corpus_tokens += w.freq * static_cast<int64_t>(w.sym.size());
  }
  return Tokenizer::from_parts(std::move(tokens), std::move(merges), std::move(specials),
                               opt.pretokenizer);
}

Tokenizer train_bpe(std::string_view text, const BpeTrainOptions& options, BpeTrainStats* stats) {
  BpeTrainer trainer(options);
  trainer.add_text(text);
  return trainer.train(stats);
}

}  // namespace lowbit::data

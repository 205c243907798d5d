// Random-window training loader and fixed-window validation (include/lowbit/data/loader.h).
#include "lowbit/data/loader.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/core/philox.h"

namespace lowbit::data {

namespace {

using nlohmann::json;

// Philox stream (offset) of the training windows.
constexpr uint64_t kTrainWindowStream = 0x4C4F4144;  // "LOAD"
constexpr std::string_view kStateFormat = "lowbit-loader";
constexpr int kStateVersion = 1;

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

void DataLoader::Stream::append(const ShardPtr& s, int64_t begin, int64_t end) {
  if (end <= begin) return;
  pieces.push_back({s, begin, end, size});
  size += end - begin;
}

void DataLoader::Stream::copy(int64_t pos, int64_t n, int32_t* tokens, uint8_t* mask) const {
  LOWBIT_CHECK(pos >= 0 && n >= 0 && pos + n <= size, "range [{}, {}) of a {}-token stream", pos,
               pos + n, size);
  // The piece holding `pos`: the last one whose offset is <= pos.
  auto it = std::upper_bound(pieces.begin(), pieces.end(), pos,
                             [](int64_t p, const Piece& x) { return p < x.offset; });
  --it;
  while (n > 0) {
    const int64_t in_piece = pos - it->offset;
    const int64_t k = std::min(n, it->end - it->begin - in_piece);
    it->shard->copy_tokens(it->begin + in_piece, k, tokens);
    it->shard->copy_mask(it->begin + in_piece, k, mask);
    tokens += k;
    mask += k;
    pos += k;
    n -= k;
    ++it;
  }
}

DataLoader::DataLoader(std::vector<ShardPtr> train, std::vector<ShardPtr> val,
                       const LoaderOptions& options)
    : options_(options) {
  const int64_t T = options.seq_len, B = options.batch_size;
  LOWBIT_USER_CHECK(B >= 1, "batch size must be at least 1 (got {})", B);
  LOWBIT_USER_CHECK(T >= 1, "sequence length must be at least 1 (got {})", T);
  LOWBIT_USER_CHECK(
      options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size,
      "rank {} is not in [0, world size {})", options.rank, options.world_size);
  LOWBIT_USER_CHECK(options.val_fraction >= 0.0 && options.val_fraction < 1.0,
                    "validation fraction must be in [0, 1) (got {})", options.val_fraction);
  LOWBIT_USER_CHECK(!train.empty(), "the data loader got no training shards");
  fingerprint_ = train.front()->fingerprint();
  vocab_size_ = train.front()->vocab_size();
  auto same_source = [&](const ShardPtr& s) {
    LOWBIT_USER_CHECK(s->fingerprint() == fingerprint_ && s->vocab_size() == vocab_size_,
                      "{}: written with a different tokenizer (fingerprint {}, vocabulary {}) than "
                      "{} (fingerprint {}, vocabulary {}): tokenize all data with one tokenizer",
                      s->path(), hex64(s->fingerprint()), s->vocab_size(), train.front()->path(),
                      hex64(fingerprint_), vocab_size_);
  };
  int64_t total = 0;
  for (const ShardPtr& s : train) {
    same_source(s);
    total += s->size();
  }
  for (const ShardPtr& s : val) same_source(s);

  if (!val.empty()) {
    for (const ShardPtr& s : train) train_.append(s, 0, s->size());
    for (const ShardPtr& s : val) val_.append(s, 0, s->size());
  } else {
    int64_t n_val = 0;
    if (options.val_fraction > 0.0) {
      n_val =
          std::max<int64_t>(static_cast<int64_t>(std::floor(total * options.val_fraction)), T + 1);
    }
    const int64_t n_train = total - n_val;
    int64_t pos = 0;
    for (const ShardPtr& s : train) {
      const int64_t a = pos, b = pos + s->size();  // the shard's range in the stream
      train_.append(s, 0, std::clamp<int64_t>(n_train - a, 0, s->size()));
      val_.append(s, std::clamp<int64_t>(n_train - a, 0, s->size()), s->size());
      pos = b;
    }
  }
  LOWBIT_USER_CHECK(train_.size >= T + 1,
                    "the training data has {} tokens{}, fewer than one window of seq_len + 1 = {}: "
                    "add data, lower the sequence length{}",
                    train_.size,
                    val.empty() && val_.size > 0
                        ? fmt::format(" after {} validation tokens were set aside", val_.size)
                        : "",
                    T + 1, val.empty() ? " or lower the validation fraction" : "");
  LOWBIT_USER_CHECK(val_.size == 0 || val_.size >= T + 1,
                    "the validation data has {} tokens, fewer than one window of seq_len + 1 = {}: "
                    "add validation data or lower the sequence length",
                    val_.size, T + 1);
}

int64_t DataLoader::train_window_start(uint64_t sample) const {
  const uint64_t windows = static_cast<uint64_t>(train_.size - options_.seq_len);  // starts
  const Philox4 r = philox_block(options_.seed, kTrainWindowStream, sample);
  const uint64_t bits = (static_cast<uint64_t>(r.v[1]) << 32) | r.v[0];
  // A uniform draw in [0, windows): the high word of a 64×64-bit product (bias < windows / 2^64).
  return static_cast<int64_t>((static_cast<unsigned __int128>(bits) * windows) >> 64);
}

void DataLoader::fill_row(const Stream& s, int64_t pos, int32_t* inputs, int32_t* targets,
                          int64_t& count) const {
  const int64_t T = options_.seq_len;
  std::vector<int32_t> tokens(T + 1);
  std::vector<uint8_t> mask(T + 1);
  s.copy(pos, T + 1, tokens.data(), mask.data());
  for (int64_t t = 0; t < T; ++t) {
    inputs[t] = tokens[t];
    const bool keep = mask[t + 1] != 0;
    targets[t] = keep ? tokens[t + 1] : kIgnoreIndex;
    count += keep;
  }
}

void DataLoader::next_train_batch(Batch& out) {
  const int64_t B = options_.batch_size, T = options_.seq_len;
  out.batch_size = B;
  out.seq_len = T;
  out.inputs.resize(B * T);
  out.targets.resize(B * T);
  out.target_count = 0;
  const uint64_t first = samples_ + static_cast<uint64_t>(options_.rank) * B;
  for (int64_t b = 0; b < B; ++b) {
    fill_row(train_, train_window_start(first + b), out.inputs.data() + b * T,
             out.targets.data() + b * T, out.target_count);
  }
  samples_ += static_cast<uint64_t>(B) * options_.world_size;
}

Batch DataLoader::next_train_batch() {
  Batch b;
  next_train_batch(b);
  return b;
}

int64_t DataLoader::val_windows() const {
  return val_.size == 0 ? 0 : (val_.size - 1) / options_.seq_len;
}

int64_t DataLoader::val_batch_count() const {
  const int64_t per_batch = options_.batch_size * options_.world_size;
  return (val_windows() + per_batch - 1) / per_batch;
}

Batch DataLoader::val_batch(int64_t index) const {
  LOWBIT_USER_CHECK(index >= 0 && index < val_batch_count(),
                    "validation batch {} does not exist (there are {})", index, val_batch_count());
  const int64_t B = options_.batch_size, T = options_.seq_len;
  Batch out;
  out.batch_size = B;
  out.seq_len = T;
  out.inputs.assign(B * T, 0);
  out.targets.assign(B * T, kIgnoreIndex);
  const int64_t first = (index * options_.world_size + options_.rank) * B;
  for (int64_t b = 0; b < B && first + b < val_windows(); ++b) {
    fill_row(val_, (first + b) * T, out.inputs.data() + b * T, out.targets.data() + b * T,
             out.target_count);
  }
  return out;
}

std::string DataLoader::state_json() const {
  json j = {{"format", kStateFormat},
            {"version", kStateVersion},
            {"seed", options_.seed},
            {"samples", samples_},
            {"train_tokens", train_.size},
            {"val_tokens", val_.size},
            {"fingerprint", hex64(fingerprint_)}};
  return j.dump();
}

void DataLoader::restore_state(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("data loader state: not valid JSON ({})", e.what()));
  }
  try {
    LOWBIT_USER_CHECK(j.is_object() && j.value("format", "") == kStateFormat,
                      "data loader state: not a lowbit loader state (\"format\": \"{}\" expected)",
                      kStateFormat);
    LOWBIT_USER_CHECK(j.value("version", 0) == kStateVersion,
                      "data loader state: version {} is not supported (expected {})",
                      j.value("version", 0), kStateVersion);
    const uint64_t seed = j.at("seed").get<uint64_t>();
    const uint64_t samples = j.at("samples").get<uint64_t>();
    const int64_t train_tokens = j.at("train_tokens").get<int64_t>();
    const int64_t val_tokens = j.at("val_tokens").get<int64_t>();
    const std::string fp = j.at("fingerprint").get<std::string>();
    LOWBIT_USER_CHECK(fp == hex64(fingerprint_),
                      "data loader state: saved for data of tokenizer fingerprint {}, but the data "
                      "now has {}: resume with the data and tokenizer of the checkpoint",
                      fp, hex64(fingerprint_));
    LOWBIT_USER_CHECK(train_tokens == train_.size && val_tokens == val_.size,
                      "data loader state: saved for {} training and {} validation tokens, but the "
                      "data now has {} and {}: the corpus or its split changed since the "
                      "checkpoint; resume with the same data and validation settings",
                      train_tokens, val_tokens, train_.size, val_.size);
    options_.seed = seed;
    samples_ = samples;
  } catch (const json::exception& e) {
    throw UserError(
        fmt::format("data loader state: a field is missing or has the wrong type ({})", e.what()));
  }
}

}  // namespace lowbit::data

// The training data loader: random windows over token shards, a train / validation split, and a
// sampler state that a checkpoint can store and restore.
//
// The shards are read as one stream (their concatenation, in order). The validation part is
// either separate shards or the last val_fraction of the stream; training windows lie entirely
// in the training part and validation windows in the validation part, so the two never share a
// token.
//
// Training sample s (counting from 0 over the whole run) is the window of T + 1 tokens starting
// at a position drawn from Philox keyed by (seed, s): the sampler's whole state is (seed, s), and
// a restored loader continues with exactly the windows the original would have drawn. Batch b of
// rank r (of W ranks) holds samples (b·W + r)·B … (b·W + r)·B + B − 1.
//
// Validation uses fixed windows: window j covers tokens [j·T, j·T + T + 1) of the validation part,
// so every validation token but the first is a target exactly once; the same every time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/data/shards.h"

namespace lowbit::data {

inline constexpr int32_t kIgnoreIndex = -1;  // a target that carries no loss

struct LoaderOptions {
  int64_t batch_size = 8;      // B: rows per batch on this rank
  int64_t seq_len = 256;       // T: tokens per row
  uint64_t seed = 0;           // of the training windows
  double val_fraction = 0.05;  // the last fraction of the stream (when no validation shards)
  int rank = 0;
  int world_size = 1;
};

struct Batch {
  int64_t batch_size = 0;        // B
  int64_t seq_len = 0;           // T
  std::vector<int32_t> inputs;   // (B, T): tokens t .. t+T-1 of each window
  std::vector<int32_t> targets;  // (B, T): tokens t+1 .. t+T, or kIgnoreIndex where the mask is 0
  int64_t target_count = 0;      // targets that are not kIgnoreIndex
};

class DataLoader {
 public:
  // `train` are the shards of the stream (split by val_fraction); `val`, when not empty, are the
  // validation shards (and `train` is all training data). UserError when a part is too short for
  // one window of T + 1 tokens (saying how many tokens there are and what to change), for
  // shards of different tokenizers, or for bad options.
  DataLoader(std::vector<ShardPtr> train, std::vector<ShardPtr> val, const LoaderOptions& options);

  // The next training batch (advances the sampler by B·W samples).
  Batch next_train_batch();
  void next_train_batch(Batch& out);  // reuses out's buffers

  // Validation: val_batch_count() batches of B rows per rank; rows past the last window have
  // inputs 0 and no targets.
  int64_t val_windows() const;
  int64_t val_batch_count() const;
  Batch val_batch(int64_t index) const;

  int64_t train_tokens() const { return train_.size; }
  int64_t val_tokens() const { return val_.size; }
  uint64_t fingerprint() const { return fingerprint_; }
  int32_t vocab_size() const { return vocab_size_; }
  const LoaderOptions& options() const { return options_; }
  uint64_t samples_drawn() const { return samples_; }
  // The start (in the training part) of training sample s: a pure function of (seed, s).
  int64_t train_window_start(uint64_t sample) const;

  // The sampler state as a JSON object (text): {"format": "lowbit-loader", "version": 1, "seed",
  // "samples", "train_tokens", "val_tokens", "fingerprint"}.
  std::string state_json() const;
  // Continues from a state_json(). UserError for malformed JSON, or a state of other data (the
  // sizes or fingerprint differ: the corpus or its split changed since the state was saved).
  void restore_state(std::string_view json);

 private:
  // A run of tokens over consecutive shards: the concatenation of [begin, end) of each piece.
  struct Stream {
    struct Piece {
      ShardPtr shard;
      int64_t begin, end;  // tokens of the shard
      int64_t offset;      // position of `begin` in the stream
    };
    std::vector<Piece> pieces;
    int64_t size = 0;
    void append(const ShardPtr& s, int64_t begin, int64_t end);
    // Tokens and masks [pos, pos + n) of the stream.
    void copy(int64_t pos, int64_t n, int32_t* tokens, uint8_t* mask) const;
  };
  void fill_row(const Stream& s, int64_t pos, int32_t* inputs, int32_t* targets,
                int64_t& count) const;

  LoaderOptions options_;
  Stream train_, val_;
  uint64_t fingerprint_ = 0;
  int32_t vocab_size_ = 0;
  uint64_t samples_ = 0;
};

}  // namespace lowbit::data

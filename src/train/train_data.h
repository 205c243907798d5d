// The trainer's view of its data: a tokenizer (absent for the synthetic source), a loader over
// token shards with its train / validation split, and batches as host tensors.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/data/loader.h"
#include "lowbit/data/tokenizer.h"
#include "lowbit/train.h"

namespace lowbit::train_detail {

struct Batch {
  Tensor tokens;   // [B, T] i32, host
  Tensor targets;  // [B, T] i32, host; -1 where no loss is taken
  int64_t valid = 0;
};

class TrainData {
 public:
  TrainData(std::optional<data::Tokenizer> tok, std::unique_ptr<data::DataLoader> loader,
            std::string description, double entropy_floor);
  int64_t vocab_size() const;
  std::string describe() const { return description_; }
  // The synthetic source's entropy rate (nats/token), < 0 for real text.
  double entropy_floor() const { return entropy_floor_; }

  void next_train(int B, int T, Batch& out);
  void reset_validation() { val_next_ = 0; }
  // False when the validation windows are exhausted.
  bool next_validation(int B, int T, Batch& out);
  std::string state_json() const { return loader_->state_json(); }
  void restore(const std::string& state) { loader_->restore_state(state); }

  // Text ↔ ids (the synthetic source has no text: ids are written as numbers).
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  bool is_end_of_text(int32_t id) const;

 private:
  void to_tensors(const data::Batch& b, Batch& out) const;
  std::optional<data::Tokenizer> tok_;
  std::unique_ptr<data::DataLoader> loader_;
  std::string description_;
  double entropy_floor_ = -1;
  int64_t val_next_ = 0;
};

// Creates the run directory (--out) and its parents; an empty path, a file in the way or an
// unwritable parent is a UserError naming the flag.
void make_run_dir(const std::string& dir);

// The checks of open_train_data that need no work: --data exists (a file, or a directory with a
// manifest), --tokenizer exists; UserError otherwise. The trainer runs them before it clears a
// previous run (--overwrite_output_dir), so that a mistyped path loses nothing.
void check_train_data_inputs(const TrainOptions& opt);

// Opens the data of a run (opt.data, opt.tokenizer, opt.vocab_size, opt.val_fraction): trains
// and saves a tokenizer in out_dir when none is given (or reuses out_dir/tokenizer.json), and
// tokenizes a text corpus into out_dir/tokens/ once (reused while the tokenizer matches).
TrainData open_train_data(const TrainOptions& opt);

}  // namespace lowbit::train_detail

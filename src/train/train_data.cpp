// Data for the trainer: corpus → tokenizer → shards → loader.
#include "train/train_data.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/json_read.h"
#include "lowbit/data/corpus.h"
#include "lowbit/data/shards.h"
#include "lowbit/data/synthetic.h"

namespace lowbit::train_detail {

namespace fs = std::filesystem;

TrainData::TrainData(std::optional<data::Tokenizer> tok, std::unique_ptr<data::DataLoader> loader,
                     std::string description, double entropy_floor)
    : tok_(std::move(tok)),
      loader_(std::move(loader)),
      description_(std::move(description)),
      entropy_floor_(entropy_floor) {}

int64_t TrainData::vocab_size() const { return loader_->vocab_size(); }

void TrainData::to_tensors(const data::Batch& b, Batch& out) const {
  const int64_t B = b.batch_size, T = b.seq_len;
  out.tokens = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  out.targets = Tensor::empty({B, T}, DType::kI32, Device::cpu());
  std::copy(b.inputs.begin(), b.inputs.end(), out.tokens.ptr<int32_t>());
  std::copy(b.targets.begin(), b.targets.end(), out.targets.ptr<int32_t>());
  out.valid = b.target_count;
}

void TrainData::next_train(int B, int T, Batch& out) {
  LOWBIT_CHECK(B == loader_->options().batch_size && T == loader_->options().seq_len,
               "loader opened for {}×{}, asked for {}×{}", loader_->options().batch_size,
               loader_->options().seq_len, B, T);
  to_tensors(loader_->next_train_batch(), out);
}

bool TrainData::next_validation(int B, int T, Batch& out) {
  if (val_next_ >= loader_->val_batch_count()) return false;
  to_tensors(loader_->val_batch(val_next_++), out);
  return true;
}

std::vector<int32_t> TrainData::encode(const std::string& text) const {
  if (tok_) return tok_->encode(text);
  return {0};  // the synthetic source starts from token 0
}

std::string TrainData::decode(const std::vector<int32_t>& ids) const {
  if (tok_) return tok_->decode(ids);
  std::string s;
  for (int32_t id : ids) s += fmt::format(" {}", id);
  return s;
}

bool TrainData::is_end_of_text(int32_t id) const {
  if (!tok_) return false;
  const auto eot = tok_->find_special(data::kEndOfText);
  return eot && *eot == id;
}

void make_run_dir(const std::string& dir) {
  LOWBIT_USER_CHECK(!dir.empty(), "--out is empty: give the run directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOWBIT_USER_CHECK(!ec && fs::is_directory(dir),
                    "--out {}: cannot create the run directory: {} (is a file in the way, or is "
                    "the parent not writable?)",
                    dir, ec ? ec.message() : std::string("not a directory"));
}

namespace {

bool is_shard_input(const std::string& path) {
  return (fs::is_directory(path) && fs::exists(fs::path(path) / "manifest.json")) ||
         fs::path(path).extension() == ".lbt";
}

data::LoaderOptions loader_options(const TrainOptions& opt) {
  data::LoaderOptions lo;
  lo.batch_size = opt.batch_size;
  lo.seq_len = opt.seq_len;
  lo.seed = opt.seed;
  lo.val_fraction = opt.val_fraction;
  return lo;
}

// The fingerprint recorded in a shard directory's manifest, if it has one.
std::optional<uint64_t> manifest_fingerprint(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = parse_json_limited(in, (dir / "manifest.json").string());
    return std::stoull(j.at("tokenizer_fingerprint").get<std::string>(), nullptr, 16);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

void check_train_data_inputs(const TrainOptions& opt) {
  if (opt.data == "synthetic") return;
  if (!opt.tokenizer.empty()) {
    LOWBIT_USER_CHECK(fs::is_regular_file(opt.tokenizer),
                      "--tokenizer {}: no such file (give a tokenizer.json, or leave the flag out "
                      "to train one on --data)",
                      opt.tokenizer);
  }
  const std::string input = opt.data == "bundled" ? data::default_corpus_path() : opt.data;
  if (!fs::exists(input)) {
    throw UserError(
        fmt::format("--data {}: no such file or directory (use bundled, synthetic, "
                    "a .txt/.jsonl corpus or a shard directory)",
                    input));
  }
  LOWBIT_USER_CHECK(!fs::is_directory(input) || is_shard_input(input),
                    "--data {}: a directory without manifest.json; give a shard directory "
                    "written by the tokenize step, or a .txt / .jsonl corpus file",
                    input);
}

TrainData open_train_data(const TrainOptions& opt) {
  check_train_data_inputs(opt);
  const data::LoaderOptions lo = loader_options(opt);
  if (opt.data == "synthetic") {
    // An order-2 Markov source over 256 tokens: its entropy rate is the loss floor.
    data::MarkovOptions mo;
    mo.seed = opt.seed;
    data::MarkovSource src(mo);
    const int64_t count = std::max<int64_t>(int64_t(1) << 22, 64 * int64_t(opt.seq_len + 1));
    auto shard = data::TokenShard::from_memory(src.generate(count, opt.seed), {}, src.fingerprint(),
                                               src.vocab_size());
    auto loader = std::make_unique<data::DataLoader>(std::vector<data::ShardPtr>{shard},
                                                     std::vector<data::ShardPtr>{}, lo);
    const std::string desc = fmt::format(
        "data: synthetic order-{} Markov source over {} tokens, {} tokens, entropy rate {:.4f} "
        "nats/token (the loss floor)",
        src.order(), src.vocab_size(), count, src.entropy_rate());
    return TrainData(std::nullopt, std::move(loader), desc, src.entropy_rate());
  }

  const std::string input = opt.data == "bundled" ? data::default_corpus_path() : opt.data;
  make_run_dir(opt.out_dir);
  const std::string run_tok = (fs::path(opt.out_dir) / "tokenizer.json").string();
  std::optional<data::Tokenizer> tok;
  std::string tok_desc;
  if (!opt.tokenizer.empty()) {
    tok = data::Tokenizer::load(opt.tokenizer);
    tok_desc = fmt::format("tokenizer {} ({} tokens)", opt.tokenizer, tok->vocab_size());
  } else if (fs::exists(run_tok)) {
    tok = data::Tokenizer::load(run_tok);
    tok_desc =
        fmt::format("tokenizer {} ({} tokens, from an earlier run)", run_tok, tok->vocab_size());
  } else if (is_shard_input(input)) {
    throw UserError(
        fmt::format("--data {} holds token shards: give the tokenizer they were "
                    "written with (--tokenizer FILE)",
                    input));
  } else {
    data::BpeTrainOptions bo;
    bo.vocab_size = opt.vocab_size;
    data::BpeTrainer trainer(bo);
    const std::vector<std::string> files{input};
    data::add_files_to_trainer(trainer, files);
    data::BpeTrainStats st;
    tok = trainer.train(&st);
    tok->save(run_tok);
    tok_desc = fmt::format("tokenizer trained on the corpus: {} tokens, {} merges, saved to {}",
                           tok->vocab_size(), st.merges, run_tok);
  }

  std::vector<data::ShardPtr> shards;
  std::string shard_desc;
  if (is_shard_input(input)) {
    const std::vector<std::string> paths{input};
    shards = data::open_shards(paths, tok->fingerprint());
    shard_desc = input;
  } else {
    // Tokenize once per (corpus, tokenizer): the shards live in the run directory.
    // The shards are reused while the tokenizer and the input file (path, size, modification
    // time, recorded in source.json) are unchanged.
    const fs::path dir = fs::path(opt.out_dir) / "tokens";
    nlohmann::json source;
    source["input"] = fs::absolute(input).string();
    source["size"] = static_cast<int64_t>(fs::file_size(input));
    source["mtime"] = static_cast<int64_t>(fs::last_write_time(input).time_since_epoch().count());
    source["fingerprint"] = tok->fingerprint_hex();
    std::string recorded;
    {
      std::ifstream in(dir / "source.json");
      if (in) std::getline(in, recorded);
    }
    if (manifest_fingerprint(dir) != tok->fingerprint() || recorded != source.dump()) {
      data::CorpusOptions co;
      co.inputs = {input};
      co.output_dir = dir.string();
      data::tokenize_corpus(*tok, co);
      std::ofstream out(dir / "source.json");
      out << source.dump() << "\n";
    }
    const std::vector<std::string> paths{dir.string()};
    shards = data::open_shards(paths, tok->fingerprint());
    shard_desc = fmt::format("{} → {}", input, dir.string());
  }
  auto loader = std::make_unique<data::DataLoader>(shards, std::vector<data::ShardPtr>{}, lo);
  const std::string desc =
      fmt::format("data: {}; {}; {} training and {} validation tokens", shard_desc, tok_desc,
                  loader->train_tokens(), loader->val_tokens());
  return TrainData(std::move(tok), std::move(loader), desc, -1.0);
}

}  // namespace lowbit::train_detail

// `lowbit eval CKPT --data FILE` (loss and perplexity of a checkpoint on a corpus) and
// `lowbit generate CKPT --prompt TEXT` (sampling with temperature, top-k and top-p).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "lowbit/core.h"
#include "lowbit/data/corpus.h"
#include "lowbit/data/loader.h"
#include "lowbit/data/tokenizer.h"
#include "lowbit/model.h"
#include "lowbit/train/checkpoint.h"

namespace lowbit::cli {

namespace {

namespace fs = std::filesystem;

struct LoadedModel {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<LlamaModel> model;
  data::Tokenizer tok;
};

// The tokenizer of a checkpoint: --tokenizer, else tokenizer.json of the run directory that
// holds the checkpoint (where `lowbit train` writes it).
std::string find_tokenizer(const std::string& ckpt, const std::string& given) {
  if (!given.empty()) return given;
  for (const fs::path& p :
       {fs::path(ckpt) / "tokenizer.json", fs::path(ckpt).parent_path() / "tokenizer.json"}) {
    if (fs::exists(p)) return p.string();
  }
  throw UserError(
      fmt::format("no tokenizer found for checkpoint {} (looked for tokenizer.json in "
                  "it and beside it); give --tokenizer FILE",
                  ckpt));
}

LoadedModel load(const std::string& ckpt, const std::string& tokenizer,
                 const std::string& precision, bool cpu) {
  if (!is_checkpoint_dir(ckpt)) {
    throw UserError(fmt::format("{} is not a lowbit checkpoint directory (no trainer.json)", ckpt));
  }
  LoadedModel m{nullptr, nullptr, data::Tokenizer::load(find_tokenizer(ckpt, tokenizer))};
  m.ctx = std::make_unique<Context>(cpu ? Context(Device::cpu()) : Context::create_default());
  const CheckpointInfo info = read_checkpoint(ckpt);
  const ModelConfig& cfg = info.model_config;
  if (cfg.vocab_size < m.tok.vocab_size()) {
    throw UserError(
        fmt::format("the tokenizer has {} tokens but the checkpoint's model only {}: "
                    "it was trained with another tokenizer",
                    m.tok.vocab_size(), cfg.vocab_size));
  }
  const Recipe r = recipe_from_name(precision.empty() ? info.state.recipe : precision);
  m.model = std::make_unique<LlamaModel>(cfg, resolve_precision(r, cfg), *m.ctx);
  load_checkpoint(info, *m.model, /*load_optimizer=*/false);
  return m;
}

// The token stream of a corpus file and its loss mask (1: scored), as training tokenizes it.
struct EvalTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};
EvalTokens eval_tokens(const data::Tokenizer& tok, const std::string& path) {
  EvalTokens out;
  data::tokenize_documents(
      tok, path,
      [&](std::span<const int32_t> ids, std::span<const uint8_t> mask, int, bool, int64_t) {
        out.ids.insert(out.ids.end(), ids.begin(), ids.end());
        if (mask.empty()) {
          out.mask.resize(out.ids.size(), 1);
        } else {
          out.mask.insert(out.mask.end(), mask.begin(), mask.end());
        }
      });
  return out;
}

}  // namespace

void add_eval_command(CLI::App& app, CommandAction& action) {
  struct Opts {
    std::string ckpt, data = "bundled", tokenizer, precision;
    int batch = 8, seq_len = 256;
    int64_t max_tokens = 1 << 20;
    bool cpu = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("eval", "Loss and perplexity of a checkpoint on a corpus");
  cmd->add_option("checkpoint", o->ckpt, "Checkpoint directory")->required();
  cmd->add_option("--data", o->data,
                  "Text or JSONL corpus, tokenized as for training (bundled: the King James Bible)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer (default: the run's tokenizer.json)");
  cmd->add_option("--precision", o->precision, "Recipe of the forward (default: the checkpoint's)");
  cmd->add_option("--batch_size", o->batch, "Windows per batch")
      ->capture_default_str()
      ->check(integer_at_least(o->batch, 1));
  cmd->add_option("--seq_len", o->seq_len, "Tokens per window")
      ->capture_default_str()
      ->check(integer_at_least(o->seq_len, 2));
  cmd->add_option("--max_tokens", o->max_tokens, "Evaluate at most this many tokens")
      ->capture_default_str()
      ->check(integer_at_least(o->max_tokens, 2));
  cmd->add_flag("--cpu", o->cpu, "Run on the CPU even when a GPU is present");
  cmd->callback([o, &action] {
    action = [o] {
      LoadedModel m = load(o->ckpt, o->tokenizer, o->precision, o->cpu);
      const std::string path = o->data == "bundled" ? data::default_corpus_path() : o->data;
      // The corpus tokenized as training tokenizes it (data/corpus.h): plain-text documents end
      // with <|endoftext|>; a JSONL file's SFT records are scored on their assistant tokens only.
      const EvalTokens et = eval_tokens(m.tok, path);
      std::vector<int32_t> ids = et.ids;
      std::vector<uint8_t> mask = et.mask;
      if (static_cast<int64_t>(ids.size()) > o->max_tokens + 1) {
        ids.resize(o->max_tokens + 1);
        mask.resize(o->max_tokens + 1);
      }
      const int T = std::min(o->seq_len, m.model->config().max_seq_len);
      const int64_t windows = (static_cast<int64_t>(ids.size()) - 1) / T;
      LOWBIT_USER_CHECK(windows > 0, "{}: {} tokens are fewer than one window of {}", path,
                        ids.size(), T + 1);
      double loss = 0;
      int64_t n = 0;
      for (int64_t w0 = 0; w0 < windows; w0 += o->batch) {
        const int B = static_cast<int>(std::min<int64_t>(o->batch, windows - w0));
        Tensor tok = Tensor::empty({B, T}, DType::kI32, Device::cpu());
        Tensor tgt = Tensor::empty({B, T}, DType::kI32, Device::cpu());
        for (int b = 0; b < B; ++b) {
          const int64_t s = (w0 + b) * T;
          std::copy(ids.begin() + s, ids.begin() + s + T, tok.ptr<int32_t>() + int64_t(b) * T);
          for (int t = 0; t < T; ++t) {
            tgt.ptr<int32_t>()[int64_t(b) * T + t] =
                mask[s + t + 1] != 0 ? ids[s + t + 1] : data::kIgnoreIndex;
          }
        }
        const StepStats st = m.model->forward_loss(tok, tgt, B, T);
        loss += st.loss_sum;
        n += st.valid_tokens;
      }
      LOWBIT_USER_CHECK(n > 0,
                        "{}: no scored tokens in the first {} (SFT records score their "
                        "assistant replies only): give records with replies, or a larger "
                        "--max_tokens if they come later",
                        path, ids.size());
      const double mean = loss / double(n);
      std::printf("%s on %s: %lld tokens, loss %.4f nats/token, perplexity %.2f\n", o->ckpt.c_str(),
                  path.c_str(), static_cast<long long>(n), mean, std::exp(mean));
      return 0;
    };
  });
}

namespace {

// One token from the last position's logits [V]: greedy when temperature is 0, else sampled
// from softmax(logits / temperature) restricted to the k most likely tokens and then to the
// smallest prefix of them whose probability reaches top_p.
int sample_token(const std::vector<float>& logits, int64_t V, double temperature, int top_k,
                 double top_p, std::mt19937_64& rng) {
  std::vector<int> order(V);
  for (int64_t v = 0; v < V; ++v) order[v] = static_cast<int>(v);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  if (temperature <= 0) return order[0];
  const int k = top_k > 0 ? std::min<int>(top_k, int(V)) : int(V);
  std::vector<double> p(k);
  double z = 0;
  for (int j = 0; j < k; ++j) {
    z += p[j] = std::exp((logits[order[j]] - logits[order[0]]) / temperature);
  }
  int keep = k;  // top-p: the smallest prefix with mass ≥ top_p
  double acc = 0;
  for (int j = 0; j < k; ++j) {
    acc += p[j] / z;
    if (acc >= top_p) {
      keep = j + 1;
      break;
    }
  }
  double total = 0;
  for (int j = 0; j < keep; ++j) total += p[j];
  double u = std::uniform_real_distribution<double>(0, total)(rng);
  for (int j = 0; j < keep; ++j) {
    if ((u -= p[j]) <= 0) return order[j];
  }
  return order[keep - 1];
}

Tensor token_row(const std::vector<int32_t>& ids, size_t first, size_t n) {
  Tensor tok = Tensor::empty({1, static_cast<int64_t>(n)}, DType::kI32, Device::cpu());
  std::copy(ids.begin() + first, ids.begin() + first + n, tok.ptr<int32_t>());
  return tok;
}

}  // namespace

void add_generate_command(CLI::App& app, CommandAction& action) {
  struct Opts {
    std::string ckpt, prompt = "And God said", tokenizer, precision;
    int max_tokens = 200, top_k = 40;
    double temperature = 0.8, top_p = 0.95;
    uint64_t seed = 1;
    bool cpu = false, no_kv_cache = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
  cmd->add_option("checkpoint", o->ckpt, "Checkpoint directory")->required();
  cmd->add_option("--prompt", o->prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--max_tokens", o->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(integer_at_least(o->max_tokens, 0));
  cmd->add_option("--temperature", o->temperature, "Softmax temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top_k", o->top_k, "Keep the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(integer_at_least(o->top_k, 0));
  cmd->add_option("--top_p", o->top_p, "Keep the smallest set with this total probability")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer (default: the run's tokenizer.json)");
  cmd->add_option("--precision", o->precision,
                  "Recipe of the forward with --no_kv_cache (default: the checkpoint's); the KV "
                  "cache decoder always runs BF16");
  cmd->add_flag("--no_kv_cache", o->no_kv_cache,
                "Recompute the whole window for every token (the training forward, slow)");
  cmd->add_flag("--cpu", o->cpu, "Run on the CPU even when a GPU is present");
  cmd->callback([o, &action] {
    action = [o] {
      LOWBIT_USER_CHECK(o->temperature >= 0, "--temperature must be ≥ 0");
      LOWBIT_USER_CHECK(o->top_p > 0 && o->top_p <= 1, "--top_p must be in (0, 1]");
      LOWBIT_USER_CHECK(o->max_tokens >= 0, "--max_tokens must be ≥ 0");
      LoadedModel m = load(o->ckpt, o->tokenizer, o->precision, o->cpu);
      std::vector<int32_t> ids = m.tok.encode(o->prompt);
      if (ids.empty()) ids.push_back(m.tok.eot_id());
      const int64_t V = m.tok.vocab_size();
      const int maxT = m.model->config().max_seq_len;
      // When the sequence fills the cache (max_seq_len positions), the cache is rebuilt by a
      // prefill of the last `keep` tokens: the context drops to 3/4 of the window and grows
      // again, one prefill per max_seq_len / 4 tokens.
      const size_t keep = static_cast<size_t>(std::max(1, maxT - maxT / 4));
      std::unique_ptr<KvCache> cache;
      if (!o->no_kv_cache) cache = std::make_unique<KvCache>(*m.ctx, m.model->config(), 1);
      // Logits of the last position of ids, through the cache (a prefill when it is empty or
      // full, else the one new token) or, with --no_kv_cache, the full window.
      int64_t prefills = 0;
      double prefill_s = 0;
      size_t cached_end = 0;  // ids[.. cached_end) end with the positions the cache holds
      auto next_logits = [&]() -> std::vector<float> {
        if (!cache) {
          const size_t n = std::min<size_t>(ids.size(), size_t(maxT));
          return m.model->last_logits(token_row(ids, ids.size() - n, n), 1, static_cast<int>(n));
        }
        if (cache->length() > 0 && cached_end + 1 == ids.size() &&
            cache->length() < cache->capacity()) {
          cached_end = ids.size();
          return m.model->decode(token_row(ids, ids.size() - 1, 1), 1, 1, *cache);
        }
        // The prompt (its last max_seq_len tokens), or the last `keep` tokens of a full cache.
        const auto t0 = std::chrono::steady_clock::now();
        const size_t n = std::min(ids.size(), cache->length() == 0 ? size_t(maxT) : keep);
        cache->reset();
        std::vector<float> l =
            m.model->decode(token_row(ids, ids.size() - n, n), 1, static_cast<int>(n), *cache);
        cached_end = ids.size();
        prefill_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++prefills;
        return l;
      };
      std::mt19937_64 rng(o->seed);
      std::printf("%s", o->prompt.c_str());
      std::fflush(stdout);
      const auto start = std::chrono::steady_clock::now();
      int generated = 0;
      for (int i = 0; i < o->max_tokens; ++i) {
        const std::vector<float> logits = next_logits();
        const int pick = sample_token(logits, V, o->temperature, o->top_k, o->top_p, rng);
        ids.push_back(pick);
        ++generated;
        if (m.tok.is_special(pick)) break;
        std::printf("%s", m.tok.decode(std::vector<int32_t>{pick}).c_str());
        std::fflush(stdout);
      }
      const double total_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("\n");
      // Speed on stderr, so that stdout stays the text. Tokens/s counts every sampled token over
      // the whole loop (prefills included); the prefills are also reported on their own.
      std::fprintf(stderr,
                   "generated %d tokens in %.2f s: %.1f tokens/s (%s on %s; %lld prefill%s, "
                   "%.1f ms)\n",
                   generated, total_s, total_s > 0 ? generated / total_s : 0.0,
                   cache ? "KV cache, bf16" : "full window per token",
                   m.ctx->device().str().c_str(), static_cast<long long>(prefills),
                   prefills == 1 ? "" : "s", prefill_s * 1e3);
      return 0;
    };
  });
}

}  // namespace lowbit::cli

// lowbit train layer: the training loop (`lowbit train`), evaluation and generation.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lowbit/model.h"
#include "lowbit/recipe.h"

namespace lowbit {

struct TrainOptions {
  // Model: a preset, optionally a config file (ours or HF config.json), then single overrides
  // (0 keeps the preset's value).
  std::string preset;  // empty: "124m" on a GPU, "tiny" on the CPU
  std::string model_config;
  int d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, ffn_hidden = 0;

  // Precision.
  std::optional<Recipe> recipe;  // unset: fp8 where the device has FP8 (emulated on the CPU)
  PrecisionOverrides precision;

  // Data: "bundled" (the King James Bible shipped with lowbit), "synthetic" (a Markov source
  // with a known entropy rate), or a path to a .txt / .jsonl / .txt.xz corpus or a shard
  // directory. JSONL chat records (prompt/response or messages) are trained on
  // their responses only: the loss mask comes with the data.
  std::string data = "bundled";
  std::string tokenizer;       // a tokenizer file; empty: train one on the corpus (vocab_size)
  int vocab_size = 4096;       // for a tokenizer trained on the corpus
  double val_fraction = 0.02;  // tokens held out for validation

  // Optimisation.
  int batch_size = -1;  // < 0: 16 on a GPU, 8 on the CPU
  int seq_len = -1;     // < 0: 1024 on a GPU, 128 on the CPU
  int grad_accum_steps = 1;
  int64_t total_steps = -1;   // < 0: 1000 on a GPU, 300 on the CPU
  int64_t warmup_steps = -1;  // < 0: 5% of total_steps
  float lr = 1e-3f;
  float min_lr_ratio = 0.1f;  // cosine decays to lr · min_lr_ratio
  float weight_decay = 0.1f;
  float beta1 = 0.9f, beta2 = 0.95f, adam_eps = 1e-8f;
  float grad_clip = 1.0f;  // ≤ 0: no clipping
  // The optimizer settings given explicitly, by the names trainer.json's train_config stores
  // them under ("grad_accum_steps", "lr", "min_lr_ratio", "weight_decay", "grad_clip", "beta1",
  // "beta2", "adam_eps"). A resume keeps these and takes the others from the checkpoint, whatever
  // their values (an explicit --lr equal to the default still wins). `lowbit train` names the
  // flags given on its command line.
  std::set<std::string> explicit_settings;
  bool activation_checkpointing = false;
  // Quantized linears keep the columnwise copy of their inputs from the forward instead of
  // recomputing it in the backward (more memory, one RMSNorm/SwiGLU pass less per block).
  bool keep_quantized_inputs = false;
  // Quantized linears keep their quantized weights (both copies) for the whole step instead of
  // quantizing each where it is used (more memory; fewer conversions with several
  // micro-batches).
  bool keep_quantized_weights = false;
  // See ForwardOptions::recompute_block_outputs (auto: every block for NVFP4, the first
  // ⌈L/16⌉ for the other quantized recipes).
  ForwardOptions::Recompute recompute_block_outputs = ForwardOptions::Recompute::kAuto;
  int recompute_first_blocks = 0;  // with Recompute::kFirst
  int loss_chunk_rows = 4096;

  // Run control.
  uint64_t seed = 1234;
  std::string out_dir = "runs/default";
  std::string resume;     // checkpoint directory: continue exactly where it stopped
  std::string init_from;  // checkpoint or HF model directory: weights only, step 0
  // A fresh run (no resume) into an out_dir that already holds a run (its checkpoint/ or
  // metrics.jsonl) is refused unless this is set: the new run would replace them.
  bool overwrite_output_dir = false;
  int64_t eval_every = 100;
  int eval_batches = 8;
  int64_t log_every = 10;
  int64_t stats_every = 50;      // per-layer FP8 amax / scale records in metrics.jsonl
  int64_t checkpoint_every = 0;  // 0: only at the end
  // > 0: stop (and checkpoint) after this step, to resume later on the same schedule.
  int64_t stop_at_step = 0;
  double time_limit_minutes = 0;  // > 0: stop (and checkpoint) after this wall time
  int sample_tokens = 200;        // printed after training (0: none)
  std::string sample_prompt = "And God said";
  bool force_cpu = false;
};

struct TrainResult {
  int64_t steps_done = 0;
  double first_loss = 0, last_loss = 0;  // train loss of the first and last steps
  double val_loss = -1;                  // last evaluation, < 0 if none
  int64_t skipped_steps = 0;             // non-finite steps skipped by the guard
  std::string checkpoint_dir;
};

// Runs the whole training job described by `opt`, printing progress to stdout and writing
// metrics.jsonl, the tokenizer and checkpoints under opt.out_dir.
TrainResult train(const TrainOptions& opt);

}  // namespace lowbit

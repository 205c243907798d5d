// `lowbit train`: the flags users of LLaMA training scripts already type, mapped onto
// TrainOptions. The recipe comes from --precision, the PRECISION environment variable, or the
// aliases --use_fp8 / --use_nvfp4 (NVFP4 wins, with a warning, when both are given).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "lowbit/core.h"
#include "lowbit/train.h"

namespace lowbit::cli {

namespace {

struct TrainFlags {
  TrainOptions opt;
  std::string precision;
  bool use_fp8 = false, use_nvfp4 = false;
  std::string fp8_format = "hybrid";
  std::string amax_compute_algo = "max";
  std::string bf16_layers;
  double nvfp4_bf16_tail = -1;
  int64_t amax_history_len = 1024;
};

std::vector<int> parse_int_list(const std::string& s, const char* flag) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') {
      throw UserError(
          fmt::format("{}: '{}' is not a comma-separated list of block indices", flag, s));
    }
    out.push_back(static_cast<int>(v));
    i = j + 1;
  }
  return out;
}

// Resolves the recipe flags into opt.recipe (unset: the trainer's device default).
void resolve_recipe_flags(TrainFlags& f) {
  std::string name = f.precision;
  if (name.empty()) {
    if (const char* env = std::getenv("PRECISION"); env != nullptr && *env != '\0') name = env;
  }
  if (f.use_fp8 && f.use_nvfp4) {
    std::fprintf(stderr, "warning: both --use_fp8 and --use_nvfp4 given; using NVFP4\n");
  }
  std::string alias;
  if (f.use_nvfp4) {
    alias = "nvfp4";
  } else if (f.use_fp8) {
    alias = "fp8";
  }
  if (!alias.empty() && !name.empty() && name != alias) {
    std::fprintf(stderr, "warning: --use_%s overrides the precision '%s'\n", alias.c_str(),
                 name.c_str());
  }
  if (!alias.empty()) name = alias;
  if (!name.empty()) f.opt.recipe = recipe_from_name(name);
  PrecisionOverrides& p = f.opt.precision;
  if (f.fp8_format == "hybrid") {
    p.fp8_format = Fp8Format::kHybrid;
  } else if (f.fp8_format == "e4m3") {
    p.fp8_format = Fp8Format::kE4M3;
  } else {
    throw UserError(fmt::format("--fp8_format must be hybrid or e4m3 (got '{}')", f.fp8_format));
  }
  if (f.amax_compute_algo == "max") {
    p.amax_compute_algo = AmaxComputeAlgo::kMax;
  } else if (f.amax_compute_algo == "most_recent") {
    p.amax_compute_algo = AmaxComputeAlgo::kMostRecent;
  } else {
    throw UserError(fmt::format("--amax_compute_algo must be max or most_recent (got '{}')",
                                f.amax_compute_algo));
  }
  p.amax_history_len = f.amax_history_len;
  p.nvfp4_bf16_tail_fraction = f.nvfp4_bf16_tail;
  if (!f.bf16_layers.empty()) p.bf16_layers = parse_int_list(f.bf16_layers, "--bf16_layers");
}

}  // namespace

CLI::Validator recompute_setting_validator() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          ForwardOptions o;
          o.set_recompute_from_name(v);
          return "";
        } catch (const UserError& e) {
          return e.what();
        }
      },
      "auto|on|off|N");
}

void add_train_command(CLI::App& app, CommandAction& action) {
  auto flags = std::make_shared<TrainFlags>();
  TrainOptions& o = flags->opt;
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a LLaMA-family model (default: the tiny preset on the bundled corpus)");
  // Model.
  cmd->add_option("--preset,--model", o.preset,
                  "Model preset: tiny, 124m, 350m, 1b, 8b, 70b (default: 124m on a GPU, tiny on "
                  "the CPU)");
  cmd->add_option("--config", o.model_config,
                  "Model config file: lowbit JSON, TOML (.toml) or a Hugging Face config.json");
  cmd->add_option("--d_model", o.d_model, "Override the model width")
      ->check(integer_at_least(o.d_model, 1));
  cmd->add_option("--n_layers", o.n_layers, "Override the number of blocks")
      ->check(integer_at_least(o.n_layers, 1));
  cmd->add_option("--n_heads", o.n_heads, "Override the number of attention heads")
      ->check(integer_at_least(o.n_heads, 1));
  cmd->add_option("--n_kv_heads", o.n_kv_heads, "Override the number of key/value heads")
      ->check(integer_at_least(o.n_kv_heads, 1));
  cmd->add_option("--ffn_hidden", o.ffn_hidden, "Override the SwiGLU hidden width")
      ->check(integer_at_least(o.ffn_hidden, 1));
  // Precision.
  cmd->add_option("--precision", flags->precision,
                  "Recipe: bf16, fp8, fp8-current, fp8-block, mxfp8, nvfp4 (default: $PRECISION, "
                  "else fp8 where the device has FP8 or emulates it)");
  cmd->add_flag("--use_fp8", flags->use_fp8, "Alias of --precision fp8");
  cmd->add_flag("--use_nvfp4", flags->use_nvfp4, "Alias of --precision nvfp4 (wins over fp8)");
  cmd->add_option("--fp8_format", flags->fp8_format, "hybrid (E4M3 fwd, E5M2 bwd) or e4m3")
      ->capture_default_str();
  cmd->add_option("--amax_history_len", flags->amax_history_len,
                  "Delayed scaling: amax history length")
      ->capture_default_str();
  cmd->add_option("--amax_compute_algo", flags->amax_compute_algo,
                  "Delayed scaling: max or most_recent")
      ->capture_default_str();
  cmd->add_option("--fp8_margin", o.precision.fp8_margin, "Delayed scaling margin (powers of 2)")
      ->capture_default_str();
  cmd->add_option("--bf16_layers", flags->bf16_layers,
                  "Comma-separated block indices kept in BF16 whatever the recipe");
  cmd->add_option("--nvfp4_bf16_tail", flags->nvfp4_bf16_tail,
                  "NVFP4: fraction of the last blocks kept in BF16 (default 0.15)")
      ->check(finite_in(0.0, 1.0));
  cmd->add_flag("--quantize_head", o.precision.quantize_head,
                "Run the LM head in the recipe too (default BF16)");
  // Data.
  cmd->add_option("--data", o.data,
                  "bundled, synthetic, or a .txt/.jsonl/.xz corpus or shard directory")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o.tokenizer,
                  "Tokenizer file (lowbit JSON or HF tokenizer.json); default: train one");
  cmd->add_option("--vocab_size", o.vocab_size, "Vocabulary of a tokenizer trained on the data")
      ->capture_default_str();
  cmd->add_option("--val_fraction", o.val_fraction, "Fraction of tokens held out")
      ->capture_default_str();
  // Optimisation.
  cmd->add_option(
         "--batch_size", o.batch_size,
         "Sequences per micro-batch (default 16 on a GPU, 8 on the CPU; --resume: the run's)")
      ->check(integer_at_least(o.batch_size, 1));
  cmd->add_option(
         "--seq_len", o.seq_len,
         "Tokens per sequence (default 1024 on a GPU, 128 on the CPU; --resume: the run's)")
      ->check(integer_at_least(o.seq_len, 2));
  // The optimizer flags a resume takes from the checkpoint unless they are given (by name in
  // TrainOptions::explicit_settings, filled in once the command line is parsed).
  std::vector<std::pair<CLI::Option*, const char*>> optimizer_flags;
  optimizer_flags.emplace_back(
      cmd->add_option("--grad_accum_steps", o.grad_accum_steps, "Micro-batches per optimizer step")
          ->capture_default_str(),
      "grad_accum_steps");
  cmd->add_option("--total_steps", o.total_steps,
                  "Optimizer steps (default 1000 on a GPU, 300 on the CPU; --resume: the run's)")
      ->check(integer_at_least(o.total_steps, 0));
  cmd->add_option("--warmup_steps", o.warmup_steps,
                  "Linear warm-up steps (default 5%; --resume: the run's)")
      ->check(integer_at_least(o.warmup_steps, 0));
  optimizer_flags.emplace_back(
      cmd->add_option("--lr", o.lr, "Peak learning rate")->capture_default_str(), "lr");
  optimizer_flags.emplace_back(
      cmd->add_option("--min_lr_ratio", o.min_lr_ratio, "Cosine floor as a fraction of --lr")
          ->capture_default_str(),
      "min_lr_ratio");
  optimizer_flags.emplace_back(
      cmd->add_option("--weight_decay", o.weight_decay, "AdamW decoupled weight decay")
          ->capture_default_str(),
      "weight_decay");
  optimizer_flags.emplace_back(
      cmd->add_option("--grad_clip", o.grad_clip, "Global gradient-norm clip (≤ 0: off)")
          ->capture_default_str(),
      "grad_clip");
  cmd->add_flag("--activation_checkpointing", o.activation_checkpointing,
                "Keep only block inputs; recompute in the backward");
  cmd->add_flag("--keep_quantized_inputs", o.keep_quantized_inputs,
                "Quantized linears keep their inputs' columnwise copies from the forward "
                "(default: recompute them in the backward, bit-identical, less memory)");
  cmd->add_flag("--keep_quantized_weights", o.keep_quantized_weights,
                "Quantized linears keep their quantized weights for the whole step (default: "
                "quantize each where it is used, layer by layer, bit-identical, less memory)");
  cmd->add_option_function<std::string>(
         "--recompute_block_outputs",
         [&o](const std::string& v) {
           ForwardOptions fo;
           fo.set_recompute_from_name(v);
           o.recompute_block_outputs = fo.recompute_block_outputs;
           o.recompute_first_blocks = fo.recompute_first_blocks;
         },
         "auto|on|off|N: drop the qkv and gate_up outputs of every block, none, or the first "
         "N after the forward and recompute them in the backward (bit-identical, less memory, "
         "two more GEMMs per block); auto = every block for nvfp4, the first ceil(L/16) for "
         "the other quantized recipes, none for bf16")
      ->check(recompute_setting_validator());
  // Run control.
  cmd->add_option("--seed", o.seed, "Seed of initialisation, data order and rounding")
      ->capture_default_str();
  cmd->add_option("--out", o.out_dir, "Run directory (metrics.jsonl, tokenizer, checkpoints)")
      ->capture_default_str();
  cmd->add_option("--resume", o.resume, "Checkpoint directory to continue from");
  cmd->add_flag("--overwrite_output_dir", o.overwrite_output_dir,
                "Start a fresh run in an --out that holds a previous run (its checkpoint, metrics "
                "and tokenizer.json are removed first; the tokenizer stays when --tokenizer names "
                "it)");
  cmd->add_option("--init-from,--init_from", o.init_from,
                  "Checkpoint or Hugging Face model directory: weights only, step 0");
  cmd->add_option("--eval_every", o.eval_every, "Validation every N steps (0: off)")
      ->capture_default_str()
      ->check(integer_at_least(o.eval_every, 0));
  cmd->add_option("--eval_batches", o.eval_batches, "Validation micro-batches")
      ->capture_default_str();
  cmd->add_option("--log_every", o.log_every, "Progress line every N steps")
      ->capture_default_str()
      ->check(integer_at_least(o.log_every, 0));
  cmd->add_option("--stats_every", o.stats_every,
                  "Per-layer amax/scale and saturation/underflow counts every N steps")
      ->capture_default_str()
      ->check(integer_at_least(o.stats_every, 0));
  cmd->add_option("--checkpoint_every", o.checkpoint_every, "Checkpoint every N steps (0: end)")
      ->capture_default_str()
      ->check(integer_at_least(o.checkpoint_every, 0));
  cmd->add_option("--stop_at_step", o.stop_at_step,
                  "Stop and checkpoint after this step (resume later on the same schedule)")
      ->check(integer_at_least(o.stop_at_step, 0));
  cmd->add_option("--time_limit_minutes", o.time_limit_minutes,
                  "Stop and checkpoint after this many minutes (0: no limit)")
      ->check(finite_in(0.0, 1e9));
  cmd->add_option("--sample_tokens", o.sample_tokens, "Tokens sampled after training (0: none)")
      ->capture_default_str()
      ->check(integer_at_least(o.sample_tokens, 0));
  cmd->add_option("--sample_prompt", o.sample_prompt, "Prompt of the sample")
      ->capture_default_str();
  cmd->add_flag("--cpu", o.force_cpu, "Train on the CPU even when a GPU is present");
  cmd->footer(
      "--resume continues a run exactly: the flags not given on its command line (batch shape,\n"
      "schedule, --grad_accum_steps, --lr, --min_lr_ratio, --weight_decay, --grad_clip) take the\n"
      "run's values from its checkpoint, and those given win even when equal to the defaults;\n"
      "docs/training.md.");
  cmd->callback([flags, optimizer_flags, &action]() {
    for (const auto& [option, key] : optimizer_flags) {
      if (option->count() > 0) flags->opt.explicit_settings.insert(key);
    }
    action = [flags]() {
      resolve_recipe_flags(*flags);
      const TrainResult r = train(flags->opt);
      return r.steps_done > 0 || flags->opt.total_steps == 0 ? 0 : 1;
    };
  });
}

}  // namespace lowbit::cli

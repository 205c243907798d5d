// The training loop: data → micro-batches → forward/backward → clip → AdamW → delayed-scaling
// update, with evaluation, metrics, checkpoints and a sample at the end.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "lowbit/core/sysinfo.h"
#include "lowbit/train.h"
#include "lowbit/train/checkpoint.h"
#include "lowbit/train/metrics.h"
#include "lowbit/train/schedule.h"
#include "lowbit/train/step.h"
#include "train/checkpoint_parsed.h"
#include "train/train_data.h"

namespace lowbit {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Dense BF16 tensor-core peak of the GPUs whose MFU we report (FLOP/s); 0 when unknown.
double bf16_peak_flops(const GpuInfo& g) {
  const std::string& n = g.name;
  if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos ||
      n.find("H800") != std::string::npos || n.find("GH200") != std::string::npos) {
    return n.find("PCIe") != std::string::npos ? 756e12 : 989.4e12;
  }
  if (n.find("B200") != std::string::npos) return 2250e12;
  if (n.find("A100") != std::string::npos) return 312e12;
  return 0;
}

Recipe default_recipe(const GpuInfo* gpu) {
  // FP8 with delayed scaling where it runs natively, and on the CPU (emulated, the same
  // numbers); BF16 on GPUs without FP8 tensor cores.
  if (gpu == nullptr) return Recipe::kFP8;
  return recipe_support(Recipe::kFP8, gpu).level == SupportLevel::kNative ? Recipe::kFP8
                                                                          : Recipe::kBF16;
}

void check_recipe_runs(Recipe r, const GpuInfo* gpu) {
  const RecipeSupport s = recipe_support(r, gpu);
  if (s.level != SupportLevel::kUnavailable) return;
  std::string ok;
  for (Recipe o : kAllRecipes) {
    if (recipe_support(o, gpu).level != SupportLevel::kUnavailable) {
      ok += fmt::format("{}{}", ok.empty() ? "" : ", ", recipe_name(o));
    }
  }
  throw UserError(fmt::format("recipe {} cannot run on {}: {}. Recipes that can: {}",
                              recipe_name(r), gpu ? gpu->name : "the CPU", s.reason, ok));
}

void check_options(const TrainOptions& o) {
  auto bad = [](const std::string& what) { throw UserError(what); };
  if (o.batch_size < 1) bad(fmt::format("--batch_size must be ≥ 1 (got {})", o.batch_size));
  if (o.seq_len < 2) bad(fmt::format("--seq_len must be ≥ 2 (got {})", o.seq_len));
  if (o.grad_accum_steps < 1) {
    bad(fmt::format("--grad_accum_steps must be ≥ 1 (got {})", o.grad_accum_steps));
  }
  if (o.total_steps < 0) bad(fmt::format("--total_steps must be ≥ 0 (got {})", o.total_steps));
  if (!(o.lr > 0) || !std::isfinite(o.lr)) bad(fmt::format("--lr must be > 0 (got {})", o.lr));
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) {
    bad(fmt::format("--min_lr_ratio must be in [0, 1] (got {})", o.min_lr_ratio));
  }
  if (!(o.weight_decay >= 0)) bad("--weight_decay must be ≥ 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)) {
    bad("AdamW betas must be in [0, 1)");
  }
  if (!(o.val_fraction >= 0 && o.val_fraction < 0.5)) {
    bad(fmt::format("--val_fraction must be in [0, 0.5) (got {})", o.val_fraction));
  }
  if (o.eval_batches < 1) bad("--eval_batches must be ≥ 1");
}

void check_exclusive_starts(const TrainOptions& o) {
  LOWBIT_USER_CHECK(o.resume.empty() || o.init_from.empty(),
                    "--resume and --init-from exclude each other: --resume continues a run "
                    "(optimizer and data position included), --init-from starts a new run from "
                    "its weights");
}

ModelConfig build_model_config(const TrainOptions& o, int64_t vocab, bool on_gpu) {
  ModelConfig c = model_preset(o.preset.empty() ? (on_gpu ? "124m" : "tiny") : o.preset);
  if (!o.model_config.empty()) c = model_config_from_file(o.model_config, c);
  if (o.d_model > 0) c.d_model = o.d_model;
  if (o.n_layers > 0) c.n_layers = o.n_layers;
  if (o.n_heads > 0) c.n_heads = o.n_heads;
  if (o.n_kv_heads > 0) c.n_kv_heads = o.n_kv_heads;
  if (o.ffn_hidden > 0) c.ffn_hidden = o.ffn_hidden;
  if (o.d_model > 0 && o.n_heads == 0 && c.d_model % c.n_heads != 0) {
    throw UserError(
        fmt::format("--d_model {} is not a multiple of the preset's {} heads; give "
                    "--n_heads too",
                    c.d_model, c.n_heads));
  }
  if (c.n_kv_heads > c.n_heads) c.n_kv_heads = c.n_heads;
  // The embedding table rounds the tokenizer's vocabulary up to a multiple of 64 (aligned
  // GEMMs); the extra rows are never a target and learn to stay unlikely.
  const int64_t padded = (vocab + 63) / 64 * 64;
  if (c.vocab_size == 0) {
    c.vocab_size = padded;
  } else if (c.vocab_size < vocab) {
    throw UserError(fmt::format("the model's vocab_size {} is smaller than the tokenizer's {}",
                                c.vocab_size, vocab));
  }
  c.max_seq_len = std::max(c.max_seq_len, o.seq_len);
  c.validate();
  return c;
}

// Per-linear delayed-scaling records (recipe fp8): the amax of the last finished step (history
// row 1 after the update) and the scale now in use, for x, w (forward) and dy (backward).
std::string fp8_stats_json(const LlamaModel& model) {
  nlohmann::json out = nlohmann::json::object();
  const DelayedScalingState* f = model.fp8_forward_state();
  const DelayedScalingState* b = model.fp8_backward_state();
  if (f == nullptr || b == nullptr) return out.dump();
  const Tensor fh = Tensor::copy_of(f->amax_history(), Device::cpu());
  const Tensor fs = Tensor::copy_of(f->scale(), Device::cpu());
  const Tensor bh = Tensor::copy_of(b->amax_history(), Device::cpu());
  const Tensor bs = Tensor::copy_of(b->scale(), Device::cpu());
  const int L = model.config().n_layers;
  const int64_t row = f->history_len() > 1 ? 1 : 0;
  for (int lin = 0; lin <= L * kLinearsPerBlock; ++lin) {
    const LinearPrecision& p =
        lin == L * kLinearsPerBlock ? model.plan().head : model.plan().linears[lin];
    if (p.recipe != Recipe::kFP8) continue;
    const std::string name =
        lin == L * kLinearsPerBlock
            ? std::string("lm_head")
            : fmt::format("{}.{}", lin / kLinearsPerBlock,
                          linear_kind_name(static_cast<LinearKind>(lin % kLinearsPerBlock)));
    auto rec = [&](const Tensor& h, const Tensor& s, int slots, int slot) {
      nlohmann::json r;
      r["amax"] = h.ptr<float>()[row * slots + slot];
      r["scale"] = s.ptr<float>()[slot];
      return r;
    };
    nlohmann::json e;
    e["x"] = rec(fh, fs, f->num_slots(), 2 * lin);
    e["w"] = rec(fh, fs, f->num_slots(), 2 * lin + 1);
    e["dy"] = rec(bh, bs, b->num_slots(), lin);
    out[name] = e;
  }
  return out.dump();
}

// Per-linear saturation and underflow counts of the quantized operands gathered during the
// step (ForwardOptions::collect_quant_stats).
nlohmann::json quant_stats_json(const LlamaModel& model) {
  nlohmann::json out = nlohmann::json::object();
  const auto stats = model.quant_stats();
  const int L = model.config().n_layers;
  static const char* kOperands[3] = {"x", "w", "dy"};
  for (int lin = 0; lin <= L * kLinearsPerBlock; ++lin) {
    const bool head = lin == L * kLinearsPerBlock;
    const LinearPrecision& p = head ? model.plan().head : model.plan().linears[lin];
    if (p.recipe == Recipe::kBF16) continue;
    nlohmann::json e;
    for (int w = 0; w < 3; ++w) {
      const LlamaModel::QuantStats& s = stats[static_cast<size_t>(lin)][static_cast<size_t>(w)];
      if (s.numel == 0) continue;
      e[kOperands[w]] = {
          {"saturated", s.saturated}, {"underflow", s.underflow}, {"numel", s.numel}};
    }
    const std::string name =
        head ? std::string("lm_head")
             : fmt::format("{}.{}", lin / kLinearsPerBlock,
                           linear_kind_name(static_cast<LinearKind>(lin % kLinearsPerBlock)));
    out[name] = e;
  }
  return out;
}

struct Sampler {
  uint64_t state;
  double next() {  // uniform [0, 1)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return double(state >> 11) * (1.0 / 9007199254740992.0);
  }
};

// The optimizer settings a checkpoint records and a resume takes back unless they are given
// explicitly (train_config in trainer.json; the keys name the options), with the range a stored
// value must lie in (check_options' range of the flag).
struct OptimizerSetting {
  const char* key;
  float TrainOptions::*member;
  bool (*in_range)(double);
  const char* range;  // in_range in words: "the value is not <range>"
};
constexpr OptimizerSetting kOptimizerSettings[] = {
    {"lr", &TrainOptions::lr, [](double v) { return v > 0; }, "> 0"},
    {"min_lr_ratio", &TrainOptions::min_lr_ratio, [](double v) { return v >= 0 && v <= 1; },
     "in [0, 1]"},
    {"weight_decay", &TrainOptions::weight_decay, [](double v) { return v >= 0; }, "≥ 0"},
    {"grad_clip", &TrainOptions::grad_clip, [](double) { return true; }, "any"},
    {"beta1", &TrainOptions::beta1, [](double v) { return v >= 0 && v < 1; }, "in [0, 1)"},
    {"beta2", &TrainOptions::beta2, [](double v) { return v >= 0 && v < 1; }, "in [0, 1)"},
    {"adam_eps", &TrainOptions::adam_eps, [](double v) { return v >= 0; }, "≥ 0"}};
constexpr size_t kNumOptimizerSettings = std::size(kOptimizerSettings);

// What a checkpoint's train_config records of its run, every value checked against its range:
// a damaged trainer.json is reported with the file and field, not as a flag the user never gave
// (a value cast to int unchecked would be). Fields it lacks stay unset.
struct StoredRun {
  std::optional<int64_t> batch_size, seq_len, grad_accum_steps, total_steps, warmup_steps;
  int64_t skipped_steps = 0;
  std::array<std::optional<float>, kNumOptimizerSettings> optimizer;
};

StoredRun read_stored_run(const CheckpointInfo& ck) {
  const nlohmann::ordered_json& t = ck.parsed->trainer;
  StoredRun r;
  if (!t.contains("train_config") || t["train_config"].is_null()) return r;
  const nlohmann::ordered_json& tc = t["train_config"];
  auto damaged = [&](const std::string& field, const std::string& what) {
    return UserError(fmt::format(
        "{}: {} {}; the checkpoint is damaged: resume from another checkpoint, or repair the "
        "value",
        ck.trainer_path, field, what));
  };
  if (!tc.is_object()) throw damaged("train_config", "is not an object");
  auto integer = [&](const char* key, int64_t lo, int64_t hi) -> std::optional<int64_t> {
    const auto it = tc.find(key);
    if (it == tc.end()) return std::nullopt;
    const std::string field = fmt::format("train_config.{}", key);
    if (!it->is_number_integer()) {
      throw damaged(field, fmt::format("is {}, not an integer", it->dump()));
    }
    const bool fits = !it->is_number_unsigned() ||
                      it->get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max());
    const int64_t v = fits ? it->get<int64_t>() : std::numeric_limits<int64_t>::max();
    if (!fits || v < lo || v > hi) {
      throw damaged(field, fmt::format("is {}, outside [{}, {}]", it->dump(), lo, hi));
    }
    return v;
  };
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  r.batch_size = integer("batch_size", 1, kIntMax);
  r.seq_len = integer("seq_len", 2, kIntMax);
  r.grad_accum_steps = integer("grad_accum_steps", 1, kIntMax);
  r.total_steps = integer("total_steps", 0, kInt64Max);
  r.warmup_steps = integer("warmup_steps", 0, kInt64Max);
  r.skipped_steps = integer("skipped_steps", 0, kInt64Max).value_or(0);
  for (size_t i = 0; i < kNumOptimizerSettings; ++i) {
    const OptimizerSetting& s = kOptimizerSettings[i];
    const auto it = tc.find(s.key);
    if (it == tc.end()) continue;
    const std::string field = fmt::format("train_config.{}", s.key);
    if (!it->is_number()) throw damaged(field, fmt::format("is {}, not a number", it->dump()));
    const double v = it->get<double>();
    if (!(std::abs(v) <= std::numeric_limits<float>::max())) {
      throw damaged(field, fmt::format("is {}, beyond the range of a float", it->dump()));
    }
    if (!s.in_range(v)) throw damaged(field, fmt::format("is {}, not {}", it->dump(), s.range));
    r.optimizer[i] = static_cast<float>(v);
  }
  return r;
}

// A resume must have a step left to train: --stop_at_step after the checkpoint's step, and the
// checkpoint short of --total_steps.
void check_steps_left(const TrainOptions& opt, int64_t ckpt_step) {
  LOWBIT_USER_CHECK(opt.stop_at_step == 0 || opt.stop_at_step > ckpt_step,
                    "{}: --stop_at_step {} is not after the checkpoint's step {}: nothing to "
                    "train",
                    opt.resume, opt.stop_at_step, ckpt_step);
  LOWBIT_USER_CHECK(opt.total_steps == 0 || ckpt_step < opt.total_steps,
                    "{}: the checkpoint is at step {}, which already reaches --total_steps {}: "
                    "nothing to train; give a larger --total_steps to continue the run",
                    opt.resume, ckpt_step, opt.total_steps);
}

// Takes the run's settings from its checkpoint where the options leave them to it: the batch
// shape and schedule when unset (not the device defaults, which may differ from the run's), the
// optimizer settings unless given explicitly (both values are printed when they differ).
void apply_stored_run(TrainOptions& opt, const StoredRun& run) {
  if (opt.batch_size < 0 && run.batch_size) opt.batch_size = static_cast<int>(*run.batch_size);
  if (opt.seq_len < 0 && run.seq_len) opt.seq_len = static_cast<int>(*run.seq_len);
  if (opt.total_steps < 0 && run.total_steps) opt.total_steps = *run.total_steps;
  if (opt.warmup_steps < 0 && run.warmup_steps) opt.warmup_steps = *run.warmup_steps;
  auto take = [&](auto& field, auto stored, const char* key) {
    if (field == stored) return;
    if (opt.explicit_settings.count(key) > 0) {
      std::printf("resume: %s %g (the checkpoint's run used %g)\n", key, double(field),
                  double(stored));
    } else {
      field = stored;
      std::printf("resume: %s %g from the checkpoint\n", key, double(stored));
    }
  };
  if (run.grad_accum_steps) {
    take(opt.grad_accum_steps, static_cast<int>(*run.grad_accum_steps), "grad_accum_steps");
  }
  for (size_t i = 0; i < kNumOptimizerSettings; ++i) {
    const OptimizerSetting& s = kOptimizerSettings[i];
    if (run.optimizer[i]) take(opt.*s.member, *run.optimizer[i], s.key);
  }
}
}  // namespace

TrainResult train(const TrainOptions& options) {
  const auto t_start = Clock::now();
  Context ctx = options.force_cpu ? Context(Device::cpu()) : Context::create_default();
  TrainOptions opt = options;
  check_exclusive_starts(opt);
  // The checkpoint of a resume is read once, first: its settings fill in the options, and a
  // resume with nothing to train fails before anything in --out is touched.
  std::optional<CheckpointInfo> ckpt;
  StoredRun stored;
  if (!opt.resume.empty()) {
    ckpt = read_checkpoint(opt.resume);
    stored = read_stored_run(*ckpt);
    apply_stored_run(opt, stored);
  }
  if (opt.batch_size < 0) opt.batch_size = ctx.on_gpu() ? 16 : 8;
  if (opt.seq_len < 0) opt.seq_len = ctx.on_gpu() ? 1024 : 128;
  if (opt.total_steps < 0) opt.total_steps = ctx.on_gpu() ? 1000 : 300;
  check_options(opt);
  if (ckpt) check_steps_left(opt, ckpt->state.step);
  ctx.set_seed(opt.seed);
  std::vector<GpuInfo> gpus = ctx.on_gpu() ? list_gpus() : std::vector<GpuInfo>();
  const GpuInfo* gpu = ctx.on_gpu() && !gpus.empty() ? &gpus[ctx.device().index] : nullptr;
  const Recipe recipe = opt.recipe ? *opt.recipe : default_recipe(gpu);
  check_recipe_runs(recipe, gpu);
  train_detail::make_run_dir(opt.out_dir);
  const std::string ckpt_dir = fmt::format("{}/checkpoint", opt.out_dir);
  check_checkpoint_target(ckpt_dir);  // fail now, not after the run at its first save
  {
    // A run into a directory that holds another run (any but the one it resumes) would replace
    // that run's checkpoint and truncate its metrics: only with --overwrite_output_dir, which
    // then clears them before anything else, and the run's tokenizer (which this run would
    // otherwise reuse instead of training one on its own data) unless --tokenizer names that
    // very file: the new run needs it then.
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool resumes_here = !opt.resume.empty() && fs::equivalent(opt.resume, ckpt_dir, ec);
    const std::string metrics_path = opt.out_dir + "/metrics.jsonl";
    const bool had_ckpt = fs::exists(ckpt_dir, ec);
    const bool had_metrics = fs::exists(metrics_path, ec) && fs::file_size(metrics_path, ec) > 0;
    if (!resumes_here && (had_ckpt || had_metrics)) {
      LOWBIT_USER_CHECK(
          opt.overwrite_output_dir,
          "--out {} already holds {}: {}start over in it with "
          "--overwrite_output_dir, or choose another --out",
          opt.out_dir,
          had_ckpt ? "a run's checkpoint" : "the metrics of a run that left no checkpoint",
          had_ckpt ? fmt::format("continue that run with --resume {}, ", ckpt_dir) : "");
      // The new run's inputs first: a mistyped --data or --tokenizer must not cost the old run.
      train_detail::check_train_data_inputs(opt);
      const std::string run_tok = opt.out_dir + "/tokenizer.json";
      const auto remove = [&](const std::string& path, bool tree) {
        std::error_code rec;
        if (tree) {
          fs::remove_all(path, rec);
        } else {
          fs::remove(path, rec);
        }
        LOWBIT_USER_CHECK(!rec, "--overwrite_output_dir: cannot remove {}: {}", path,
                          rec.message());
      };
      remove(ckpt_dir, true);
      remove(metrics_path, false);
      const bool keep_tok = !opt.tokenizer.empty() && fs::equivalent(opt.tokenizer, run_tok, ec);
      if (!keep_tok) remove(run_tok, false);
      std::printf("--overwrite_output_dir: the previous run's %s in %s are removed%s\n",
                  keep_tok ? "checkpoint and metrics" : "checkpoint, metrics and tokenizer",
                  opt.out_dir.c_str(),
                  keep_tok ? "; its tokenizer is kept (--tokenizer names it)" : "");
    }
  }

  // ---- data ----
  train_detail::TrainData data = train_detail::open_train_data(opt);
  // A resumed run continues the checkpoint's model (its shape flags need not be repeated).
  const ModelConfig mcfg =
      ckpt ? ckpt->model_config : build_model_config(opt, data.vocab_size(), ctx.on_gpu());
  if (mcfg.vocab_size < data.vocab_size()) {
    throw UserError(
        fmt::format("the model's vocabulary ({}) is smaller than the data's ({}): the "
                    "checkpoint was trained with another tokenizer",
                    mcfg.vocab_size, data.vocab_size()));
  }
  const PrecisionPlan plan = resolve_precision(recipe, mcfg, opt.precision);
  std::printf("lowbit train: %s model (%.1fM parameters), %s, on %s\n", mcfg.preset.c_str(),
              mcfg.num_params() / 1e6, recipe_name(recipe), gpu ? gpu->name.c_str() : "the CPU");
  std::printf("%s\n", data.describe().c_str());
  std::printf("%s\n", plan.describe().c_str());
  {
    ForwardOptions fo;
    fo.recompute_block_outputs = opt.recompute_block_outputs;
    fo.recompute_first_blocks = opt.recompute_first_blocks;
    const int n = fo.recomputed_blocks(plan.recipe, mcfg.n_layers);
    if (n == mcfg.n_layers) {
      std::printf(
          "memory: each block's qkv and gate_up outputs are recomputed in the backward "
          "(--recompute_block_outputs off keeps them)\n");
    } else if (n > 0) {
      std::printf(
          "memory: the qkv and gate_up outputs of the first %d of %d blocks are recomputed in "
          "the backward (--recompute_block_outputs off keeps them, on drops every block's)\n",
          n, mcfg.n_layers);
    }
  }

  LlamaModel model(mcfg, plan, ctx);
  TrainResult result;
  int64_t start_step = 0;
  int64_t tokens_seen = 0;
  int64_t skipped = 0;  // non-finite steps skipped so far (AdamW counts applied updates only)
  if (ckpt) {
    const std::string& prev = ckpt->state.recipe;
    const CheckpointState st = load_checkpoint(*ckpt, model, /*load_optimizer=*/true);
    start_step = st.step;
    tokens_seen = st.tokens;
    data.restore(st.data_state_json);
    skipped = stored.skipped_steps;
    ctx.set_seed(st.rng_seed);
    ctx.set_rng_offset(st.rng_offset);
    for (const std::string& note : st.notes) std::printf("resume: %s\n", note.c_str());
    std::printf(
        "resumed from %s at step %lld%s\n", opt.resume.c_str(), static_cast<long long>(start_step),
        prev == recipe_name(recipe)
            ? ""
            : fmt::format(" (checkpoint recipe {}, continuing in {})", prev, recipe_name(recipe))
                  .c_str());
  } else if (!opt.init_from.empty()) {
    init_weights_from(opt.init_from, model);
    std::printf("initialised weights from %s\n", opt.init_from.c_str());
  } else {
    model.init_weights(opt.seed);
  }
  mem_reset_peaks(ctx.device());

  const Device dev = ctx.device();
  StepRunner runner(model, ctx);

  LrSchedule sched;
  sched.peak_lr = opt.lr;
  sched.min_lr = opt.lr * opt.min_lr_ratio;
  sched.total_steps = opt.total_steps;
  sched.warmup_steps = opt.warmup_steps >= 0 ? opt.warmup_steps : opt.total_steps / 20;

  MetricsWriter metrics(opt.out_dir + "/metrics.jsonl", start_step);
  const int B = opt.batch_size, T = opt.seq_len;
  const double flops_per_token = mcfg.train_flops_per_token(T);
  const double peak = gpu ? bf16_peak_flops(*gpu) : 0.0;
  ProgressBar progress(opt.total_steps, start_step);

  auto evaluate = [&]() {
    double loss = 0;
    int64_t n = 0;
    data.reset_validation();
    for (int i = 0; i < opt.eval_batches; ++i) {
      train_detail::Batch b;
      if (!data.next_validation(B, T, b)) break;
      const StepStats s = model.forward_loss(b.tokens, b.targets, B, T);
      loss += s.loss_sum;
      n += s.valid_tokens;
    }
    return n > 0 ? loss / double(n) : -1.0;
  };

  auto save = [&](int64_t step) {
    const std::string& dir = ckpt_dir;
    CheckpointState st;
    st.step = step;
    st.tokens = tokens_seen;
    st.data_state_json = data.state_json();
    nlohmann::json tc;
    tc["skipped_steps"] = skipped;
    tc["batch_size"] = opt.batch_size;
    tc["seq_len"] = opt.seq_len;
    tc["grad_accum_steps"] = opt.grad_accum_steps;
    tc["total_steps"] = opt.total_steps;
    tc["warmup_steps"] = sched.warmup_steps;
    for (const OptimizerSetting& s : kOptimizerSettings) tc[s.key] = opt.*s.member;
    tc["seed"] = opt.seed;
    st.train_config_json = tc.dump();
    st.rng_seed = ctx.seed();
    st.rng_offset = ctx.rng_offset();
    save_checkpoint(dir, model, st);
    result.checkpoint_dir = dir;
  };

  const int64_t skipped_before = skipped;
  int64_t step = start_step;
  bool first = true;
  for (; step < opt.total_steps; ++step) {
    if (opt.stop_at_step > 0 && step >= opt.stop_at_step) {
      std::printf("stopping at step %lld as asked (--stop_at_step)\n",
                  static_cast<long long>(step));
      break;
    }
    if (opt.time_limit_minutes > 0 && seconds_since(t_start) > opt.time_limit_minutes * 60) {
      std::printf("time limit of %.1f minutes reached at step %lld\n", opt.time_limit_minutes,
                  static_cast<long long>(step));
      break;
    }
    const auto t0 = Clock::now();
    const float lr = static_cast<float>(sched.lr_at(step));
    std::vector<train_detail::Batch> batches(opt.grad_accum_steps);
    std::vector<MicroBatch> micro;
    for (auto& b : batches) {
      data.next_train(B, T, b);
      micro.push_back({b.tokens, b.targets, b.valid});
    }
    AdamWConfig ac;
    ac.lr = lr;
    ac.beta1 = opt.beta1;
    ac.beta2 = opt.beta2;
    ac.eps = opt.adam_eps;
    ac.weight_decay = opt.weight_decay;
    ac.step = step + 1 - skipped;
    ForwardOptions fo;
    fo.activation_checkpointing = opt.activation_checkpointing;
    fo.recompute_quantized_inputs = !opt.keep_quantized_inputs;
    fo.recompute_quantized_weights = !opt.keep_quantized_weights;
    fo.recompute_block_outputs = opt.recompute_block_outputs;
    fo.recompute_first_blocks = opt.recompute_first_blocks;
    const bool stats_step = opt.stats_every > 0 && (step + 1) % opt.stats_every == 0;
    fo.collect_quant_stats = stats_step && model.plan().any_quantized();
    fo.loss_chunk_rows = opt.loss_chunk_rows;
    const StepOutcome so = runner.step(micro, B, T, ac, opt.grad_clip, fo);
    tokens_seen += int64_t(B) * T * opt.grad_accum_steps;
    const double gnorm = so.grad_norm;
    const double loss = so.loss;
    const bool skipped_now = so.skipped;
    if (skipped_now) ++skipped;  // no update: AdamW's count of applied updates stays
    if (so.no_targets) {
      std::printf("step %lld: no target of the step carries loss (all masked): no update\n",
                  static_cast<long long>(step + 1));
    } else if (skipped_now) {
      std::printf(
          "step %lld: non-finite gradient, update skipped (first non-finite gradient: %s; %lld "
          "skipped so far)\n",
          static_cast<long long>(step + 1),
          so.non_finite.empty() ? "the global norm overflowed" : so.non_finite.c_str(),
          static_cast<long long>(skipped));
    } else if (so.loss_non_finite()) {
      std::printf(
          "step %lld: the loss is not finite but the gradients are: the update was applied\n",
          static_cast<long long>(step + 1));
    }
    const double dt = seconds_since(t0);
    const double tok_s = double(B) * T * opt.grad_accum_steps / dt;
    const double mfu = peak > 0 ? flops_per_token * tok_s / peak : -1.0;
    if (first) result.first_loss = loss;
    first = false;
    result.last_loss = loss;

    nlohmann::json m;
    m["step"] = step + 1;
    m["loss"] = loss;
    m["lr"] = lr;
    m["grad_norm"] = gnorm;
    m["tokens_per_s"] = tok_s;
    m["step_time_ms"] = dt * 1e3;
    if (mfu >= 0) m["mfu"] = mfu;
    m["tokens"] = tokens_seen;
    m["skipped"] = skipped_now;
    const MemStats ms = mem_stats(dev);
    nlohmann::json mem;
    for (int c = 0; c < kNumMemCategories; ++c) {
      mem[std::string(mem_category_name(static_cast<MemCategory>(c)))] =
          ms.by_category[c].peak_bytes;
    }
    mem["total"] = ms.total.peak_bytes;
    m["peak_mem_bytes"] = mem;
    if (opt.stats_every > 0 && (step + 1) % opt.stats_every == 0) {
      m["fp8"] = nlohmann::json::parse(fp8_stats_json(model));
      if (fo.collect_quant_stats) {
        m["quant_stats"] = quant_stats_json(model);
        model.reset_quant_stats();
      }
    }
    if (opt.eval_every > 0 && ((step + 1) % opt.eval_every == 0 || step + 1 == opt.total_steps)) {
      result.val_loss = evaluate();
      if (result.val_loss >= 0) {
        m["val_loss"] = result.val_loss;
        m["val_ppl"] = std::exp(result.val_loss);
      }
    }
    metrics.write(m.dump());
    ProgressBar::Line line;
    line.step = step + 1;
    line.loss = loss;
    line.lr = lr;
    line.grad_norm = gnorm;
    line.tokens_per_s = tok_s;
    line.mfu = mfu;
    line.val_loss = m.contains("val_loss") ? result.val_loss : -1.0;
    const bool log_now = opt.log_every > 0 && ((step + 1) % opt.log_every == 0 ||
                                               step + 1 == opt.total_steps || step == start_step);
    progress.update(line, log_now || line.val_loss >= 0);
    if (opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0 &&
        step + 1 < opt.total_steps) {
      save(step + 1);
    }
  }
  progress.finish();
  result.steps_done = step - start_step;
  result.skipped_steps = skipped - skipped_before;
  if (result.steps_done > 0) save(step);
  const MemStats ms = mem_stats(dev);
  std::printf("peak memory: %s\n", format_mem_stats(ms).c_str());
  std::printf("trained %lld steps in %.1f s; %s%s\n", static_cast<long long>(result.steps_done),
              seconds_since(t_start),
              result.checkpoint_dir.empty() ? "no checkpoint written"
                                            : ("checkpoint: " + result.checkpoint_dir).c_str(),
              result.skipped_steps
                  ? fmt::format("; {} steps skipped (non-finite)", result.skipped_steps).c_str()
                  : "");

  std::vector<int32_t> ids = data.encode(opt.sample_prompt);
  if (opt.sample_tokens > 0 && !ids.empty()) {
    // Temperature 0.8, top-k 40 sample from the prompt, decoded with a KV cache (BF16 compute
    // weights): the prompt once, then one token per step; a full cache restarts from the last
    // 3/4 of the window.
    const size_t prompt_len = ids.size();
    Sampler rng{opt.seed ^ 0x9E3779B97F4A7C15ULL};
    const int64_t V = data.vocab_size();
    KvCache cache(ctx, mcfg, 1);
    auto feed = [&](size_t n) {  // runs the last n ids through the cache
      Tensor tok = Tensor::empty({1, int64_t(n)}, DType::kI32, Device::cpu());
      std::copy(ids.end() - int64_t(n), ids.end(), tok.ptr<int32_t>());
      return model.decode(tok, 1, static_cast<int>(n), cache);
    };
    std::vector<float> logits = feed(std::min<size_t>(ids.size(), size_t(cache.capacity())));
    for (int i = 0; i < opt.sample_tokens; ++i) {
      if (i > 0) {
        if (cache.length() >= cache.capacity()) {
          cache.reset();
          logits = feed(std::max<size_t>(1, size_t(cache.capacity()) * 3 / 4));
        } else {
          logits = feed(1);
        }
      }
      std::vector<int> order(V);
      for (int64_t v = 0; v < V; ++v) order[v] = static_cast<int>(v);
      const int k = static_cast<int>(std::min<int64_t>(40, V));
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b]; });
      std::vector<double> p(k);
      double z = 0;
      for (int j = 0; j < k; ++j) z += p[j] = std::exp((logits[order[j]] - logits[order[0]]) / 0.8);
      double u = rng.next() * z;
      int pick = order[k - 1];
      for (int j = 0; j < k; ++j) {
        if ((u -= p[j]) <= 0) {
          pick = order[j];
          break;
        }
      }
      ids.push_back(pick);
      if (data.is_end_of_text(pick)) break;
    }
    std::printf("\nsample:\n%s%s\n", opt.sample_prompt.c_str(),
                data.decode(std::vector<int32_t>(ids.begin() + prompt_len, ids.end())).c_str());
  }
  return result;
}

}  // namespace lowbit

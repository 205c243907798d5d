// `lowbit bench <what>`: performance measurements on the GPU (never part of the tests).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "bench/gemm_bench.h"
#include "bench/ops_bench.h"
#include "bench/quant_bench.h"
#include "bench/train_bench.h"
#include "cli/commands.h"
#include "data/data_util.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sysinfo.h"
#include "lowbit/recipe.h"

namespace lowbit::cli {

namespace {

std::vector<std::pair<int64_t, int64_t>> parse_shapes(const std::string& spec) {
  std::vector<std::pair<int64_t, int64_t>> out;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const size_t x = item.find('x');
    int64_t m = 0, k = 0;
    try {
      LOWBIT_USER_CHECK(x != std::string::npos, "");
      m = std::stoll(item.substr(0, x));
      k = std::stoll(item.substr(x + 1));
    } catch (const std::exception&) {
      throw UserError(fmt::format("--shapes: '{}' is not MxK (e.g. 8192x8192)", item));
    }
    LOWBIT_USER_CHECK(m > 0 && k > 0, "--shapes: '{}' needs positive sizes", item);
    out.emplace_back(m, k);
    pos = end + 1;
  }
  LOWBIT_USER_CHECK(!out.empty(), "--shapes: no shape given");
  return out;
}

std::vector<std::string> split_list(const std::string& spec) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    if (end > pos) out.push_back(spec.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// `--shapes` of bench gemm: preset names (124m, 1b, 8b, square) and MxNxK layers.
std::vector<bench::GemmBenchShape> parse_gemm_shapes(const std::string& spec) {
  std::vector<bench::GemmBenchShape> out;
  for (const std::string& item : split_list(spec)) {
    std::vector<bench::GemmBenchShape> preset = bench::gemm_bench_preset(item);
    if (!preset.empty()) {
      out.insert(out.end(), preset.begin(), preset.end());
      continue;
    }
    const size_t x1 = item.find('x');
    const size_t x2 = x1 == std::string::npos ? x1 : item.find('x', x1 + 1);
    int64_t m = 0, n = 0, k = 0;
    try {
      LOWBIT_USER_CHECK(x2 != std::string::npos, "");
      size_t used = 0;
      const std::string sm = item.substr(0, x1), sn = item.substr(x1 + 1, x2 - x1 - 1),
                        sk = item.substr(x2 + 1);
      m = std::stoll(sm, &used);
      LOWBIT_USER_CHECK(used == sm.size(), "");
      n = std::stoll(sn, &used);
      LOWBIT_USER_CHECK(used == sn.size(), "");
      k = std::stoll(sk, &used);
      LOWBIT_USER_CHECK(used == sk.size(), "");
    } catch (const std::exception&) {
      throw UserError(fmt::format(
          "--shapes: '{}' is neither MxNxK (e.g. 8192x8192x8192) nor a preset (124m, 1b, 8b, "
          "square)",
          item));
    }
    LOWBIT_USER_CHECK(m > 0 && n > 0 && k > 0, "--shapes: '{}' needs positive sizes", item);
    out.push_back({item, m, n, k});
  }
  LOWBIT_USER_CHECK(!out.empty(), "--shapes: no shape given");
  return out;
}

std::vector<std::string> parse_gemm_modes(const std::string& spec) {
  const std::vector<std::string>& all = bench::gemm_bench_modes();
  const std::vector<std::string> given = split_list(spec);
  for (const std::string& m : given) {
    LOWBIT_USER_CHECK(std::find(all.begin(), all.end(), m) != all.end(),
                      "--modes: unknown mode '{}' (choose from bf16, fp8, fp8-block, mxfp8, nvfp4)",
                      m);
  }
  // The order of gemm_bench_modes() (each mode times its bf16 peer itself, interleaved).
  std::vector<std::string> out;
  for (const std::string& m : all) {
    if (std::find(given.begin(), given.end(), m) != given.end()) out.push_back(m);
  }
  LOWBIT_USER_CHECK(!out.empty(), "--modes: no mode given");
  return out;
}

std::vector<GemmRole> parse_gemm_roles(const std::string& spec) {
  std::vector<GemmRole> out;
  for (const std::string& r : split_list(spec)) {
    if (r == "fprop") {
      out.push_back(GemmRole::kFprop);
    } else if (r == "dgrad") {
      out.push_back(GemmRole::kDgrad);
    } else if (r == "wgrad") {
      out.push_back(GemmRole::kWgrad);
    } else {
      throw UserError(
          fmt::format("--roles: unknown role '{}' (choose from fprop, dgrad, wgrad)", r));
    }
  }
  LOWBIT_USER_CHECK(!out.empty(), "--roles: no role given");
  return out;
}

double not_measured() { return std::nan(""); }

// The --json-out file of a bench command: one JSON object per row and line. The constructor
// checks the path before the measurements, so that a mistyped directory fails at once rather
// than after minutes of timing; write() replaces the file atomically (a temporary file renamed
// onto it), so a reader never finds half a file. An empty path writes nothing.
class JsonLinesOut {
 public:
  explicit JsonLinesOut(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir =
        fs::path(path_).parent_path().empty() ? fs::path(".") : fs::path(path_).parent_path();
    LOWBIT_USER_CHECK(!fs::is_directory(path_, ec), "--json-out {}: is a directory; give a file",
                      path_);
    LOWBIT_USER_CHECK(fs::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) == 0,
                      "--json-out {}: {} is not a writable directory (does it exist?)", path_,
                      dir.string());
  }
  void add(const nlohmann::json& row) { text_ += row.dump() + "\n"; }
  void write() const {
    if (!path_.empty()) data::detail::write_file_atomic(path_, text_);
  }

 private:
  std::string path_;
  std::string text_;
};

// NaN (not measured) as JSON null.
nlohmann::json num(double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); }

}  // namespace

void add_bench_command(CLI::App& app, CommandAction& action) {
  CLI::App* bench = app.add_subcommand("bench", "Measure throughput on the GPU (not a test)");
  bench->require_subcommand(1);

  struct QuantOpts {
    std::string shapes = "8192x8192,16384x768,16384x2048,16384x4096,16384x8192";
    int iters = 20;
    std::string json_out;
  };
  auto q = std::make_shared<QuantOpts>();
  CLI::App* quant = bench->add_subcommand(
      "quant", "GB/s of every quantization recipe against the device's copy bandwidth");
  quant->add_option("--shapes", q->shapes, "Comma-separated MxK source shapes")
      ->capture_default_str();
  quant
      ->add_option("--iters", q->iters,
                   "Timed samples per measurement, each a burst of calls (median reported)")
      ->check(integer_in(1, 10000))
      ->capture_default_str();
  quant->add_option("--json-out", q->json_out, "Also write one JSON object per row to this file");
  quant->callback([q, &action] {
    action = [q] {
      bench::QuantBenchOptions opt;
      opt.shapes = parse_shapes(q->shapes);
      opt.iters = q->iters;
      const std::vector<GpuInfo> gpus = list_gpus();
      LOWBIT_USER_CHECK(!gpus.empty(), "bench quant needs a CUDA GPU; none was found");
      JsonLinesOut json_out(q->json_out);
      std::printf("lowbit bench quant on %s\n", gpus[0].name.c_str());
      for (const auto& r : bench::run_quant_bench(opt)) {
        json_out.add({{"impl", "lowbit"},
                      {"device", gpus[0].name},
                      {"shape", r.shape},
                      {"recipe", r.recipe},
                      {"ms", r.ms},
                      {"bytes", r.bytes},
                      {"gbps", r.gbps},
                      {"frac_of_copy", r.frac_of_copy}});
      }
      json_out.write();
      return 0;
    };
  });

  struct TrainOpts {
    std::string presets = "124m,1b";
    std::string recipes = "bf16,fp8,fp8-current,fp8-block,mxfp8,nvfp4";
    int steps = 10;
    int warmup = 3;
    bool activation_checkpointing = false;
    bool keep_quantized_inputs = false;
    bool keep_quantized_weights = false;
    std::string recompute_block_outputs = "auto";
    std::string json_out;
    std::string kernel_trace;
  };
  auto t = std::make_shared<TrainOpts>();
  CLI::App* train_cmd = bench->add_subcommand(
      "train", "Tokens/s, MFU and peak memory of whole training steps per recipe");
  train_cmd->add_option("--presets", t->presets, "Comma-separated: tiny, 124m, 350m, 1b")
      ->capture_default_str();
  train_cmd->add_option("--recipes", t->recipes, "Comma-separated recipes (bf16 first)")
      ->capture_default_str();
  train_cmd->add_option("--steps", t->steps, "Timed optimizer steps")
      ->check(integer_in(1, 10000))
      ->capture_default_str();
  train_cmd->add_option("--warmup", t->warmup, "Untimed steps first")
      ->check(integer_in(1, 10000))
      ->capture_default_str();
  train_cmd->add_flag("--activation_checkpointing", t->activation_checkpointing,
                      "Recompute each block in the backward");
  train_cmd->add_flag("--keep_quantized_inputs", t->keep_quantized_inputs,
                      "Keep the quantized linears' wgrad inputs instead of recomputing them");
  train_cmd->add_flag("--keep_quantized_weights", t->keep_quantized_weights,
                      "Keep the quantized weights for the whole step instead of per layer");
  train_cmd
      ->add_option("--recompute_block_outputs", t->recompute_block_outputs,
                   "auto|on|off|N: recompute the qkv and gate_up outputs of every block, none, "
                   "or the first N in the backward (auto: every block for nvfp4, the first "
                   "ceil(L/16) for the other quantized recipes)")
      ->check(recompute_setting_validator())
      ->capture_default_str();
  train_cmd->add_option("--json-out", t->json_out, "Also write one JSON object per row");
  train_cmd->add_option("--kernel-trace", t->kernel_trace,
                        "Trace the timed steps' kernels (CUPTI) and write a per-kernel table, "
                        "with the GPU's busy share of the wall time, to this file");
  train_cmd->callback([t, &action] {
    action = [t] {
      bench::TrainBenchOptions opt;
      opt.cases = bench::train_bench_cases(t->presets);
      size_t i = 0;
      while (i <= t->recipes.size()) {
        size_t j = t->recipes.find(',', i);
        if (j == std::string::npos) j = t->recipes.size();
        if (j > i) {
          const std::string r = t->recipes.substr(i, j - i);
          recipe_from_name(r);  // validates the name
          opt.recipes.push_back(r);
        }
        i = j + 1;
      }
      opt.steps = t->steps;
      opt.warmup_steps = t->warmup;
      opt.activation_checkpointing = t->activation_checkpointing;
      opt.keep_quantized_inputs = t->keep_quantized_inputs;
      opt.keep_quantized_weights = t->keep_quantized_weights;
      opt.recompute_block_outputs = t->recompute_block_outputs;
      opt.kernel_trace_path = t->kernel_trace;
      JsonLinesOut json_out(t->json_out);
      const std::vector<GpuInfo> gpus = list_gpus();
      std::printf("lowbit bench train on %s\n", gpus.empty() ? "the CPU" : gpus[0].name.c_str());
      std::printf("%-6s %-12s %9s %10s %12s %7s %11s %8s %8s\n", "preset", "recipe", "batch",
                  "step ms", "tokens/s", "MFU", "peak mem", "vs bf16", "mem/bf16");
      for (const auto& r : bench::run_train_bench(opt)) {
        if (!r.error.empty()) {
          std::printf("%-6s %-12s error: %s\n", r.preset.c_str(), r.recipe.c_str(),
                      r.error.c_str());
        } else {
          // Unknown values (no peak FLOP/s for this device, no bf16 row to compare with): "-".
          auto known = [](double v, const char* f) {
            return v >= 0 ? fmt::format(fmt::runtime(f), v) : std::string("-");
          };
          std::printf("%-6s %-12s %4dx%-4d %10.1f %12.0f %7s %8.2f GiB %8s %8s\n", r.preset.c_str(),
                      r.recipe.c_str(), r.batch, r.seq_len, r.step_ms, r.tokens_per_s,
                      known(r.mfu * 100, "{:.1f}%").c_str(), r.peak_mem_bytes / 1073741824.0,
                      known(r.speed_vs_bf16, "{:.2f}x").c_str(),
                      known(r.mem_vs_bf16, "{:.2f}x").c_str());
          if (r.gpu_busy >= 0) {
            std::printf("       GPU busy %.1f%% of the timed wall time (kernel table: %s)\n",
                        r.gpu_busy * 100, t->kernel_trace.c_str());
          }
        }
        std::fflush(stdout);
        nlohmann::json j = {{"bench", "train"},
                            {"impl", "lowbit"},
                            {"device", gpus.empty() ? "cpu" : gpus[0].name},
                            {"preset", r.preset},
                            {"recipe", r.recipe},
                            {"batch", r.batch},
                            {"seq_len", r.seq_len},
                            {"step_ms", r.step_ms},
                            {"tokens_per_s", r.tokens_per_s},
                            {"mfu", r.mfu},
                            {"loss_first", r.loss_first},
                            {"loss_last", r.loss_last},
                            {"peak_mem_bytes", r.peak_mem_bytes},
                            {"speed_vs_bf16", r.speed_vs_bf16},
                            {"mem_vs_bf16", r.mem_vs_bf16},
                            {"error", r.error}};
        if (r.gpu_busy >= 0) j["gpu_busy"] = r.gpu_busy;
        nlohmann::json cats;
        for (const auto& [k, v] : r.peak_by_category) cats[k] = v;
        j["peak_by_category"] = cats;
        json_out.add(j);
        // Rewritten after every row: an interrupted bench keeps the rows measured so far.
        json_out.write();
      }
      return 0;
    };
  });

  struct GemmOpts {
    std::string shapes = "square,124m,1b,8b";
    std::string modes = "bf16,fp8,fp8-block,mxfp8,nvfp4";
    std::string roles = "fprop,dgrad,wgrad";
    int iters = 30;
    int warmup = 5;
    int fused_parts = 0;
    std::string json_out;
  };
  auto g = std::make_shared<GemmOpts>();
  CLI::App* gemm_cmd = bench->add_subcommand(
      "gemm",
      "TFLOP/s of gemm() per mode on square shapes and the fprop/dgrad/wgrad GEMMs of layer "
      "sets, with raw cuBLASLt measured alongside");
  gemm_cmd
      ->add_option("--shapes", g->shapes,
                   "Comma-separated MxNxK layers (M tokens, N out, K in) or layer sets: 124m, 1b "
                   "(GPT-style layers, not the train presets), 8b (Llama-3-8B), square (4096^3, "
                   "8192^3)")
      ->capture_default_str();
  gemm_cmd
      ->add_option("--modes", g->modes, "Comma-separated modes: bf16, fp8, fp8-block, mxfp8, nvfp4")
      ->capture_default_str();
  gemm_cmd->add_option("--roles", g->roles, "Comma-separated GEMMs per layer: fprop, dgrad, wgrad")
      ->capture_default_str();
  gemm_cmd->add_option("--iters", g->iters, "Timed samples per measurement (median reported)")
      ->check(integer_in(1, 10000))
      ->capture_default_str();
  gemm_cmd->add_option("--warmup", g->warmup, "Warm-up calls before timing")
      ->check(integer_in(0, 10000))
      ->capture_default_str();
  gemm_cmd->add_option("--json-out", g->json_out,
                       "Also write one JSON object per row to this file");
  gemm_cmd
      ->add_option("--fused-parts", g->fused_parts,
                   "Developer: k-partition of the fused MX / NVFP4 kernel for every shape (0: its "
                   "model's choice, 1: whole tiles, N: about N parts, a multiple of the output's "
                   "256-wide column "
                   "tiles)")
      ->check(integer_in(0, 100000))
      ->capture_default_str();
  gemm_cmd->callback([g, &action] {
    action = [g] {
      bench::GemmBenchOptions opt;
      opt.shapes = parse_gemm_shapes(g->shapes);
      opt.modes = parse_gemm_modes(g->modes);
      opt.roles = parse_gemm_roles(g->roles);
      opt.iters = g->iters;
      opt.warmup = g->warmup;
      opt.fused_parts = g->fused_parts;
      const std::vector<GpuInfo> gpus = list_gpus();
      LOWBIT_USER_CHECK(!gpus.empty(), "bench gemm needs a CUDA GPU; none was found");
      JsonLinesOut json_out(g->json_out);
      std::printf("lowbit bench gemm on %s\n", gpus[0].name.c_str());
      const auto rows = bench::run_gemm_bench(opt);
      for (const auto& r : rows) {
        json_out.add({{"impl", r.impl},
                      {"device", gpus[0].name},
                      {"bench", "gemm"},
                      {"shape", r.shape},
                      {"M", r.m},
                      {"N", r.n},
                      {"K", r.k},
                      {"role", r.role},
                      {"mode", r.mode},
                      {"backend", r.backend},
                      {"gemm", r.r > 0 ? nlohmann::json(fmt::format("{}x{}x{}", r.r, r.c, r.kc))
                                       : nlohmann::json()},
                      {"ms", num(r.ms)},
                      {"flops", r.flops},
                      {"tflops", num(r.tflops)},
                      {"bf16_ms", num(r.bf16_ms)},
                      {"ratio_bf16", num(r.ratio_bf16)},
                      {"overhead_pct", num(r.overhead_pct)},
                      {"iters", opt.iters},
                      {"error", r.error.empty() ? nlohmann::json() : nlohmann::json(r.error)}});
      }
      json_out.write();
      // The targets, over the rows that measure them.
      double worst_overhead = not_measured(), fp8_8192 = not_measured(),
             worst_emulated = not_measured();
      for (const auto& r : rows) {
        if (r.impl != "lowbit" || !r.error.empty()) continue;
        if (!std::isnan(r.overhead_pct) && !(r.overhead_pct <= worst_overhead)) {
          worst_overhead = r.overhead_pct;
        }
        if (r.mode == "fp8" && r.m == 8192 && r.n == 8192 && r.k == 8192 && r.role == "fprop") {
          fp8_8192 = r.ratio_bf16;
        }
        if ((r.mode == "mxfp8" || r.mode == "nvfp4") && !std::isnan(r.ratio_bf16) &&
            !(r.ratio_bf16 >= worst_emulated)) {
          worst_emulated = r.ratio_bf16;
        }
      }
      auto verdict = [](double v, bool ok) {
        return std::isnan(v) ? "not measured" : (ok ? "met" : "MISSED");
      };
      std::printf("\ntargets:\n");
      std::printf("  gemm() overhead vs raw cuBLASLt <= 3%%: worst %+.1f%% (%s)\n", worst_overhead,
                  verdict(worst_overhead, worst_overhead <= 3.0));
      std::printf("  FP8 >= 1.7x BF16 at 8192^3 fprop: %.2fx (%s)\n", fp8_8192,
                  verdict(fp8_8192, fp8_8192 >= 1.7));
      std::printf("  emulated MXFP8/NVFP4 time <= 1.25x BF16 (ratio >= 0.80): worst %.2fx (%s)\n",
                  worst_emulated, verdict(worst_emulated, worst_emulated >= 0.8));
      return 0;
    };
  });

  struct OpsOpts {
    std::string presets = "124m,1b";
    int iters = 20;
    std::string ops;
    std::string json_out;
  };
  auto o = std::make_shared<OpsOpts>();
  CLI::App* ops_cmd = bench->add_subcommand(
      "ops",
      "Time of every transformer op (embedding, rmsnorm, rope, swiglu, add, cross-entropy, "
      "adamw, grad norm, attention) at the presets' shapes, GB/s against the copy bandwidth");
  ops_cmd
      ->add_option("--presets", o->presets,
                   "Comma-separated: 124m, 1b; none: the copy and attention rows only")
      ->capture_default_str();
  ops_cmd->add_option("--iters", o->iters, "Timed samples per row (median reported)")
      ->check(integer_in(1, 10000))
      ->capture_default_str();
  ops_cmd->add_option("--ops", o->ops,
                      "Comma-separated substrings: only rows whose op name contains one of them "
                      "(e.g. \"swiglu bwd,embedding\"); default every row");
  ops_cmd->add_option("--json-out", o->json_out, "Also write one JSON object per row to this file");
  ops_cmd->callback([o, &action] {
    action = [o] {
      bench::OpsBenchOptions opt;
      opt.presets = bench::ops_bench_presets(o->presets);
      opt.iters = o->iters;
      opt.ops = split_list(o->ops);
      const std::vector<GpuInfo> gpus = list_gpus();
      LOWBIT_USER_CHECK(!gpus.empty(), "bench ops needs a CUDA GPU; none was found");
      JsonLinesOut json_out(o->json_out);
      std::printf("lowbit bench ops on %s\n", gpus[0].name.c_str());
      std::printf("%-6s %-26s %-30s %12s %27s\n", "preset", "op", "shape", "time",
                  "GB/s, % of copy | TFLOP/s");
      const auto rows = bench::run_ops_bench(opt);
      LOWBIT_USER_CHECK(opt.ops.empty() || std::any_of(rows.begin(), rows.end(),
                                                       [](const bench::OpsBenchRow& r) {
                                                         return r.preset != "device";
                                                       }),
                        "--ops '{}': no op name contains any of these; see the op column of a "
                        "run without --ops (e.g. \"rmsnorm fwd\", \"swiglu bwd\", \"attention\")",
                        o->ops);
      auto pos = [](double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(); };
      for (const auto& r : rows) {
        json_out.add({{"bench", "ops"},
                      {"impl", "lowbit"},
                      {"op", r.op},
                      {"preset", r.preset},
                      {"shape", r.shape},
                      {"ms", r.error.empty() ? nlohmann::json(r.ms) : nlohmann::json()},
                      {"bytes", r.bytes > 0 ? nlohmann::json(r.bytes) : nlohmann::json()},
                      {"gbps", pos(r.gbps)},
                      {"frac_of_copy", pos(r.frac_of_copy)},
                      {"copy_gbps", pos(r.copy_gbps)},
                      {"flops", r.flops > 0 ? nlohmann::json(r.flops) : nlohmann::json()},
                      {"tflops", pos(r.tflops)},
                      {"iters", opt.iters},
                      {"device", gpus[0].name},
                      {"error", r.error.empty() ? nlohmann::json() : nlohmann::json(r.error)}});
      }
      json_out.write();
      return 0;
    };
  });
}

}  // namespace lowbit::cli

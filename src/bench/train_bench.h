// Training throughput and memory benchmark (`lowbit bench train`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lowbit::bench {

struct TrainBenchCase {
  std::string preset;  // "124m", "1b", ...
  int batch = 0, seq_len = 0;
  int64_t vocab = 0;
};

// The reference cases: 124m at 16×1024 (vocab 32000) and 1b at 8×2048 (vocab 128256).
std::vector<TrainBenchCase> train_bench_cases(const std::string& presets_csv);

struct TrainBenchOptions {
  std::vector<TrainBenchCase> cases;
  std::vector<std::string> recipes;  // recipe names; bf16 first gives the ratios
  int warmup_steps = 3;
  int steps = 10;
  bool activation_checkpointing = false;
  bool keep_quantized_inputs = false;            // see TrainOptions::keep_quantized_inputs
  bool keep_quantized_weights = false;           // see TrainOptions::keep_quantized_weights
  std::string recompute_block_outputs = "auto";  // see ForwardOptions::recompute_block_outputs
  // Non-empty: the timed steps of every row are traced kernel by kernel (kernel_trace.h) and the
  // summaries written to this file, one section per row.
  std::string kernel_trace_path;
};

struct TrainBenchRow {
  std::string preset, recipe;
  int batch = 0, seq_len = 0;
  double step_ms = 0, tokens_per_s = 0, mfu = -1;
  double loss_first = 0, loss_last = 0;
  int64_t peak_mem_bytes = 0;
  std::vector<std::pair<std::string, int64_t>> peak_by_category;
  double speed_vs_bf16 = -1, mem_vs_bf16 = -1;
  double gpu_busy = -1;  // with a kernel trace: the share of the timed span the GPU ran kernels
  std::string error;
};

std::vector<TrainBenchRow> run_train_bench(const TrainBenchOptions& opt);

}  // namespace lowbit::bench

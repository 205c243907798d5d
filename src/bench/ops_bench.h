// Transformer-ops benchmark (`lowbit bench ops`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lowbit::bench {

// A model preset's op shapes: N = batch · seq_len tokens, the dims of model_preset(name) and
// the vocabulary of the reference cases (124m: 16×1024, V 32000; 1b: 8×2048, V 128256).
struct OpsBenchPreset {
  std::string name;
  int batch = 0, seq_len = 0;
  int64_t vocab = 0;
};

// Comma-separated "124m", "1b"; an unknown name throws UserError.
std::vector<OpsBenchPreset> ops_bench_presets(const std::string& csv);

struct OpsBenchOptions {
  std::vector<OpsBenchPreset> presets;
  int iters = 20;  // timed samples per row (median reported), each a burst of ≈ 1 ms of calls
  // Only rows whose op name contains one of these (empty: every row); the device copy always runs.
  std::vector<std::string> ops;
};

struct OpsBenchRow {
  std::string op;            // "rmsnorm fwd", "attention fwd+bwd", ...
  std::string preset;        // "124m", "1b", "attn" (attention sweep), "device" (copy)
  std::string shape;         // "N16384 D768", ...
  double ms = 0;             // median time of one call
  double bytes = 0;          // bytes counted for memory-bound ops (0 for attention)
  double gbps = -1;          // bytes / time (-1 where not counted)
  double frac_of_copy = -1;  // gbps / copy_gbps
  double copy_gbps = -1;     // device-to-device copy of the same bytes, measured in the run
  double flops = 0;          // attention only
  double tflops = -1;        // flops / time (-1 where not counted)
  std::string error;         // non-empty when the case failed (the run goes on)
};

std::vector<OpsBenchRow> run_ops_bench(const OpsBenchOptions& opt);

}  // namespace lowbit::bench

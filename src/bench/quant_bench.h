// Quantization throughput benchmark (`lowbit bench quant`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lowbit::bench {

struct QuantBenchOptions {
  std::vector<std::pair<int64_t, int64_t>> shapes;  // (M tokens, K hidden)
  int warmup = 3;
  int iters = 20;
};

struct QuantBenchRow {
  std::string shape;    // "8192x8192"
  std::string recipe;   // "fp8 delayed cast+T", ...
  double ms;            // median time
  double bytes;         // bytes counted (see quant_bench.cu)
  double gbps;          // bytes / time
  double frac_of_copy;  // gbps / measured device-to-device copy GB/s of the same shape
};

std::vector<QuantBenchRow> run_quant_bench(const QuantBenchOptions& opt);

}  // namespace lowbit::bench

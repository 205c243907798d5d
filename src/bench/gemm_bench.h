// GEMM throughput benchmark (`lowbit bench gemm`).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lowbit/gemm.h"

namespace lowbit::bench {

// One linear layer Y [M, N] = X [M, K] · W [N, K]ᵀ: M tokens, N out features, K in features.
// Its fprop, dgrad and wgrad GEMMs all cost 2·M·N·K FLOPs.
struct GemmBenchShape {
  std::string name;  // "124m.qkv", "8192x8192x8192"
  int64_t m = 0, n = 0, k = 0;
};

// Layers of a preset: "124m", "1b", "8b" or "square" (4096³ and 8192³). Empty if unknown.
std::vector<GemmBenchShape> gemm_bench_preset(const std::string& name);

// Modes: "bf16", "fp8" (per-tensor current scaling, HYBRID: E4M3 X/W, E5M2 dY; TE accumulation
// policy), "fp8-block" (1×128 X/dY, 128×128 W), "mxfp8" and "nvfp4" (emulated on Hopper).
const std::vector<std::string>& gemm_bench_modes();

struct GemmBenchOptions {
  std::vector<GemmBenchShape> shapes;
  std::vector<std::string> modes;  // subset of gemm_bench_modes(), in that order
  std::vector<GemmRole> roles = {GemmRole::kFprop, GemmRole::kDgrad, GemmRole::kWgrad};
  int warmup = 5;
  int iters = 30;
  // Developer: the fused MX / NVFP4 kernel's k-partition for every shape (0: its model's choice;
  // 1: whole tiles; n > 1: about n parts, k_partition.h valid_parts), to compare partitions in
  // one run.
  int fused_parts = 0;
};

struct GemmBenchRow {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  std::string shape;            // GemmBenchShape::name
  int64_t m = 0, n = 0, k = 0;  // the layer's M, N, K
  std::string role;             // "fprop", "dgrad", "wgrad"
  std::string mode;             // gemm_bench_modes() entry
  // "lowbit" (gemm()) or "cublaslt" (raw cublasLtMatmul of the same problem)
  std::string impl = "lowbit";
  std::string backend;           // gemm_backend_name() of the problem
  int64_t r = 0, c = 0, kc = 0;  // the canonical GEMM: out [r, c], contraction kc (0: unknown)
  double ms = kNone;             // median time of one call (NaN on error)
  double flops = 0;              // 2·M·N·K
  double tflops = kNone;         // flops / time
  // Median time of lowbit's bf16 GEMM of the same shape and role, timed interleaved with this
  // row's calls (bf16 rows: their own time); ratio_bf16 = bf16_ms / ms (NaN: none).
  double bf16_ms = kNone;
  double ratio_bf16 = kNone;
  double overhead_pct = kNone;  // lowbit rows: 100·(ms / raw ms − 1) (NaN: no raw row)
  std::string error;            // empty, or why this case did not run
};

std::vector<GemmBenchRow> run_gemm_bench(const GemmBenchOptions& opt);

}  // namespace lowbit::bench

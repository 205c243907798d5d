// Internal interface of the gemm layer: the canonical TN problem (see include/lowbit/gemm.h)
// that every backend receives, built and checked in exactly one place (canonicalize()).
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/gemm.h"

namespace lowbit {

// A' or B' of the canonical problem: logically [rows, kc], contiguous along kc.
struct CanonOperand {
  // Quantized operand: the copy to use (its data is [rows, kc] in the payload's packing, every
  // columnwise copy being stored transposed; its scales are in the layouts of quant_layout()).
  const QuantizedTensor* q = nullptr;
  Usage usage = Usage::kRowwise;
  // Dense operand (bf16 or f32): the tensor in its natural layout; A'/B' is `dense` itself
  // ([rows, kc]) or, when `transposed`, its transpose (`dense` is then [kc, rows]).
  TensorView dense;
  bool transposed = false;
  int64_t rows = 0, kc = 0;
};

struct CanonGemm {
  CanonOperand a, b;  // A' [R, Kc], B' [C, Kc]
  int64_t R = 0, C = 0, Kc = 0;
  GemmRole role = GemmRole::kFprop;
  GemmBackend backend = GemmBackend::kCpuReference;
  bool fast_accum = false;  // resolved from GemmOptions::accumulation and the TE policy
};

// Validates the operands for the role and builds the canonical problem; every user error
// (shape, dtype, missing copy, alignment: "pad K to a multiple of 16") is thrown from here.
CanonGemm canonicalize(const Context& ctx, const GemmOperand& a, const GemmOperand& b,
                       const TensorView& out, const GemmOptions& opt);

// The operand part of canonicalize() for the float64 reference (gemm_reference_f64): the same
// role, shape, copy and pairing checks, on any device, no output and no backend alignment rules;
// backend = kCpuReference.
CanonGemm canonicalize_operands(const GemmOperand& a, const GemmOperand& b, const GemmOptions& opt);

// CUDA backends (src/gemm/*.cu, gemm_cublaslt.cpp): runs `g` into `out` on ctx's stream.
void gemm_cuda(Context& ctx, const CanonGemm& g, const TensorView& out, const GemmOptions& opt);

// What the last cuBLASLt GEMM of gemm_cuda() on the calling thread ran (the benchmark reports
// it and hands the algorithm to its raw cuBLASLt twin; the tests check the bias path with it).
struct GemmCudaLastCall {
  bool valid = false;          // a cuBLASLt GEMM ran on this thread
  int candidates = 0;          // heuristic algorithms of the plan (in cuBLASLt's order)
  int algo_index = 0;          // which one ran: 0 = cuBLASLt's first choice
  bool autotuned = false;      // chosen by timing (false: the first choice, untimed)
  bool bias_epilogue = false;  // the bias was added in cuBLASLt's epilogue (one rounding)
  uint64_t algo[8] = {};       // the cublasLtMatmulAlgo_t that ran
  // The emulated MX / NVFP4 GEMM ran as the fused-dequantization kernel (fused_dequant_gemm.cu)
  // instead of dequantization + cuBLASLt (then candidates = 1, algo_index = 0, algo unset, and
  // bias_epilogue tells whether a bias was added in its epilogue).
  bool fused_dequant = false;
  // The fused kernel ran the transposed problem (A' and B' swapped, the reduction writing out
  // transposed): see try_fused_emulated.
  bool fused_transposed = false;
  // The fused kernel loaded A''s first stages before it waited for B''s copy (kAFirst).
  bool fused_a_first = false;
};
GemmCudaLastCall gemm_cuda_last_call();

// The autotuning default that an LOWBIT_GEMM_AUTOTUNE value gives: true when unset or empty,
// else on / off as 1 / 0, true / false, yes / no (any case); any other value is a UserError.
bool gemm_autotune_from_env(const char* value);

// When the emulated MX / NVFP4 path runs the fused-dequantization kernel (fused_dequant_gemm.cu)
// instead of dequantization + cuBLASLt. It can run an FP8 (MX) or NVFP4 pair with R % 128,
// C % 256 and K % 64 (MX: 128), cut along k where the tiles are fewer than the SMs
// (gemm/k_partition.h). kAuto (the default) takes it where it measured faster (NVFP4: C ≤ 2048,
// or C ≤ 4096 with K ≥ 4096 and a full GPU of tiles; MX: C ≤ 2048 with K ≥ C; see
// try_fused_emulated and bench/results/h100-2026-11-27/); kOn wherever it can run
// (tests, A/B timing); kOff never. LOWBIT_GEMM_FUSED=0 / off, 1 / on, auto;
// set_gemm_fused_dequant() overrides the environment for the whole process.
enum class FusedDequant : uint8_t { kOff, kAuto, kOn };
void set_gemm_fused_dequant(FusedDequant mode);
// The mode an LOWBIT_GEMM_FUSED value gives: kAuto when unset, empty or "auto", else kOn / kOff
// as LOWBIT_GEMM_AUTOTUNE reads on / off (any case); any other value is a UserError.
FusedDequant gemm_fused_from_env(const char* value);
FusedDequant gemm_fused_dequant();
// Caps the fused kernel's persistent grid at n CTAs (0: one per SM), so that tests reach several
// tiles per CTA at small shapes.
void set_gemm_fused_max_ctas(int n);
// Forces the fused kernel's k-partition (0: its model's choice, fused_gemm_parts; 1: whole tiles;
// n > 1: n parts rounded down to a multiple of the output's 256-wide column tiles, at least one
// and at most one per k-step per column: k_partition.h valid_parts).
void set_gemm_fused_parts(int n);

// CPU backend: f32 sgemm over the dequantized operands.
void gemm_cpu(const CanonGemm& g, const TensorView& out, const GemmOptions& opt);

// A' or B' as a row-major f32 [rows, kc] matrix on the host: the dequantized copy (exact in f32;
// NVFP4 values include the global factor) or the dense operand, transposed as needed. Operands
// on the GPU are copied to the host first.
std::vector<float> canon_operand_f32(const CanonOperand& op);

}  // namespace lowbit

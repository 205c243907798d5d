// lowbit gemm layer: one entry point for every precision (formats.md §3–§4).
//
// The three GEMMs of a linear layer, in row-major framework shapes (X [M, K] tokens × in,
// W [N, K] out × in, dY [M, N]):
//   fprop  Y [M, N]  = X · Wᵀ      contracts K
//   dgrad  dX [M, K] = dY · W      contracts N
//   wgrad  dW [N, K] = dYᵀ · X     contracts M
// Every one is computed in the canonical "TN" form  out[r, c] = Σ_j A'[r, j] · B'[c, j]  with
// both operands contiguous along the contraction (the only form Hopper FP8 tensor cores take):
//   fprop  A' = X [M, K]     (rowwise copy)     B' = W [N, K]      (rowwise copy)
//   dgrad  A' = dY [M, N]    (rowwise copy)     B' = Wᵀ [K, N]     (columnwise copy)
//   wgrad  A' = dYᵀ [N, M]   (columnwise copy)  B' = Xᵀ [K, M]     (columnwise copy)
// so out is [M, N], [M, K] or [N, K]. A QuantizedTensor operand supplies the copy its role
// needs (the columnwise copies are stored transposed, formats.md §3); a bf16 operand is given in
// its natural layout (X, W, dY as above) and transposed by the backend as needed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/quant.h"

namespace lowbit {

enum class GemmRole : uint8_t { kFprop, kDgrad, kWgrad };
std::string_view gemm_role_name(GemmRole r);  // "fprop", "dgrad", "wgrad"

// One operand: either a bf16 (or f32, CPU only) tensor in its natural layout, or a quantized
// tensor holding the copy the role needs.
struct GemmOperand {
  TensorView dense;                    // set when the operand is not quantized
  const QuantizedTensor* q = nullptr;  // set when it is

  static GemmOperand of(const TensorView& t) { return {t, nullptr}; }
  static GemmOperand of(const QuantizedTensor& t) { return {TensorView(), &t}; }
  bool quantized() const { return q != nullptr; }
};

// Which accumulation the tensor cores use for FP8 operands (formats.md §4.4).
enum class Fp8Accumulation : uint8_t {
  kDefault,  // TE policy: fast accumulation in fprop for per-tensor FP8, split elsewhere
  kFast,     // CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1 (rejected by the block-scaled modes)
  kSplit,    // periodic promotion to fp32
};

struct GemmOptions {
  GemmRole role = GemmRole::kFprop;
  // out = alpha · A'·B'ᵀ + beta · out (+ bias). beta ≠ 0 needs an f32 `out` (wgrad accumulation
  // into an fp32 gradient buffer across micro-batches) or a separate `c`.
  float alpha = 1.0f;
  float beta = 0.0f;
  // The beta term's input when it is not out itself: out = alpha · A'·B'ᵀ + beta · c (+ bias),
  // with c [R, C] of out's dtype, contiguous like out, read before out is written (it may alias
  // out). With c, beta ≠ 0 is allowed for a bf16 out: e.g. a residual added in the GEMM's
  // epilogue (beta = 1), summed in fp32 and rounded once.
  const TensorView* c = nullptr;
  // [C] bf16 or f32, added to every row of out; optional. On the GPU the add is fused into
  // cuBLASLt's epilogue (alpha·acc + beta·out + bias in fp32, one rounding to out's type) where
  // cuBLASLt takes the combination: a bias of out's dtype with bf16 operands (and the emulated
  // MX / NVFP4 path), a bf16 bias with FP8 operands; otherwise a separate kernel adds it after
  // the GEMM (a second rounding for a bf16 out). The emulated path's fused kernel adds either
  // dtype in its own epilogue (one rounding).
  const TensorView* bias = nullptr;
  Fp8Accumulation accumulation = Fp8Accumulation::kDefault;
};

// How a gemm() call is (or would be) executed, for `lowbit info`, logs and tests.
enum class GemmBackend : uint8_t {
  kCpuReference,         // f32 (OpenBLAS sgemm) over the dequantized operands
  kCublasLtBf16,         // BF16 tensor cores, fp32 accumulation
  kCublasLtFp8,          // per-tensor FP8 (SCALAR_32F scales)
  kCublasLtFp8Block,     // FP8 block scaling (VEC128_32F / BLK128x128_32F)
  kEmulatedBf16,         // MX / NVFP4 on Hopper: exact dequantization to 16-bit values, then a
                         // 16-bit GEMM (cuBLASLt BF16, or A' converted in a fused kernel)
  kCublasLtBlockScaled,  // sm_100+: VEC32_UE8M0 / VEC16_UE4M3 (not yet run on hardware)
};
std::string_view gemm_backend_name(GemmBackend b);

// out [R, C] (bf16 or f32; same device as the operands) = alpha · A'·B'ᵀ + beta · out (+ bias).
// Shapes, dtypes, the copies a role needs and alignment are checked first; a violation is a
// UserError that says what to change (e.g. "pad K to a multiple of 16").
//
// On the GPU every distinct problem (shapes, dtypes, layouts, pointer alignments, bias
// epilogue) gets a cuBLASLt plan on its first call, cached for the process. With autotuning on
// (the default) that first call times up to 8 of cuBLASLt's heuristic candidates on ctx's
// stream (two single calls, then one untimed and 7 timed bursts of ≈ 1 ms each, interleaved;
// ≈ 50–500 ms in all) into a scratch output the size of out, allocated for the timing and freed
// after it (`out` itself is written only by the real call; without memory for the scratch the
// first heuristic choice is kept), and keeps the fastest: the first call of a new shape
// therefore synchronises ctx's stream. Inside a CUDA graph capture the timing is put off to a
// later call outside one. Later calls reuse the plan, so they are bit-identical to each other;
// which candidate wins can differ from one process to the next, so runs that must reproduce
// bit for bit turn autotuning off.
void gemm(Context& ctx, const GemmOperand& a, const GemmOperand& b, const TensorView& out,
          const GemmOptions& opt = {});

// Algorithm selection of the CUDA backends: on (time the heuristic candidates once per plan,
// keep the fastest) or off (cuBLASLt's first heuristic choice). The default is on unless the
// environment sets LOWBIT_GEMM_AUTOTUNE to 0, off, false or no when it is first read;
// set_gemm_autotune() overrides the environment for the whole process (every thread and
// Context). Turning it off after plans were timed goes back to the first heuristic choice.
void set_gemm_autotune(bool on);
bool gemm_autotune();

// The backend gemm() picks for these operands on ctx's device.
GemmBackend gemm_backend_for(const Context& ctx, const GemmOperand& a, const GemmOperand& b);

// Float64 reference of the same product over the dequantized operands (tests only): [R, C]
// row-major on the CPU; `out_before` is the beta term's input (opt.c when given). NaN/inf
// propagate as IEEE arithmetic does.
std::vector<double> gemm_reference_f64(const GemmOperand& a, const GemmOperand& b,
                                       const GemmOptions& opt,
                                       const TensorView* out_before = nullptr);

}  // namespace lowbit

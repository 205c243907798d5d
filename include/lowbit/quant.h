// lowbit quant layer: quantized tensors and quantize / dequantize for every scaling mode, the
// delayed-scaling state and the block-scale layouts handed to GEMMs.
//
// The per-element and per-block numerics live in LOWBIT_HD headers (quant/scale_math.h,
// quant/hadamard16.h, quant/layout.h) shared by the CPU twin (src/quant/*_ref.cpp) and the
// CUDA kernels. docs/quantization.md describes every layout and rule implemented here;
// formats.md (the reference) gives the sources.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "lowbit/core.h"
#include "lowbit/quant/scale_math.h"

namespace lowbit {

// How a tensor is scaled. The element dtype is chosen separately (QuantConfig::dtype).
enum class ScalingMode : uint8_t {
  kPerTensor,     // FP8 (E4M3/E5M2), one fp32 scale per tensor: delayed or current scaling
  kBlock1x128,    // FP8, fp32 scale per 1×128 block (activations, gradients), VEC128 layout
  kBlock128x128,  // FP8, fp32 scale per 128×128 tile (weights), BLK128x128 layout
  kMX1x32,        // MX: E8M0 scale per 32 (MXFP8 E4M3/E5M2, MXFP6 E3M2/E2M3, MXFP4 E2M1)
  kNVFP4_1x16,    // NVFP4: E2M1, UE4M3 scale per 16, fp32 tensor amax
  kNVFP4_16x16,   // NVFP4 weights: one UE4M3 per 16×16 tile, replicated in its 16 rows
};
std::string_view scaling_mode_name(ScalingMode m);  // "per_tensor", "block1x128", ...

// Which copy of a quantized tensor: blocks along the rows (the contiguous dim K) or along the
// columns (the first dim M). Columnwise copies are stored transposed ([K, M]) for every mode
// (docs/quantization.md "Orientation").
enum class Usage : uint8_t { kRowwise, kColumnwise };

// Philox stream of stochastic rounding: element i of a copy draws philox_uint32(seed, offset, i).
struct RngKey {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

class DelayedScalingState;

struct QuantConfig {
  DType dtype = DType::kE4M3;  // element type: e4m3 e5m2 (FP8), e3m2 e2m3 (FP6), e2m1 (FP4)
  ScalingMode mode = ScalingMode::kPerTensor;
  bool rowwise = true;      // produce the rowwise copy
  bool columnwise = false;  // produce the columnwise copy
  // FP8 current and block scaling (formats.md §2.0): round scales down to powers of two.
  // Unset: the mode's default (off for per-tensor, on for both block modes).
  std::optional<bool> pow2_scales;
  float amax_epsilon = 0.0f;  // amax below this is raised to it (current and block scaling)
  MxScaleRounding mx_rounding = MxScaleRounding::kCeil;  // kMX1x32: TE ceil or OCP floor
  bool hadamard_columnwise = false;  // kNVFP4_1x16: 16-point RHT on the columnwise copy
  bool stochastic_rounding = false;  // elements rounded stochastically (NVFP4 gradients)
  // Stochastic-rounding stream. Unset: seed = ctx.seed() and two offsets taken from the
  // context (rowwise first, then columnwise). Set: rowwise uses `offset`, columnwise
  // `offset + 1`.
  std::optional<RngKey> sr_key;
  // Delayed scaling (kPerTensor only): quantize with state->scale[slot] and record the amax
  // into the state's current history row. Null: current scaling.
  DelayedScalingState* delayed = nullptr;
  int delayed_slot = 0;
  // An f32 source is quantized as RN_bf16(x), the values of its bf16 copy, without that copy
  // being materialised (a weight quantized from its f32 master: the same codes as quantizing the
  // bf16 compute copy). Ignored for bf16 sources.
  bool round_source_to_bf16 = false;

  bool effective_pow2() const;

  // Presets of formats.md §2 (both copies requested; clear the one not needed).
  static QuantConfig fp8_current(DType t = DType::kE4M3, bool pow2 = false);
  static QuantConfig fp8_delayed(DelayedScalingState& state, int slot);
  static QuantConfig fp8_block_1x128(DType t = DType::kE4M3);
  static QuantConfig fp8_block_128x128(DType t = DType::kE4M3);
  static QuantConfig mx(DType t = DType::kE4M3, MxScaleRounding r = MxScaleRounding::kCeil);
  static QuantConfig nvfp4_activation();  // 1×16, RHT on the columnwise copy, RNE
  static QuantConfig nvfp4_weight();      // 16×16 tiles, RNE
  static QuantConfig nvfp4_gradient();    // 1×16, RHT on the columnwise copy, SR on both
};

// A tensor in a low-precision format with its scaling metadata. `shape` is the logical
// [M, K] of the source; every payload and scale tensor has the layout quant_layout() gives
// (GEMM-ready for the FP8 modes; compact [rows, blocks] for MX/NVFP4 — swizzle with
// gemm_block_scales()). Scale padding entries are zero.
struct QuantizedTensor {
  ScalingMode mode = ScalingMode::kPerTensor;
  DType dtype = DType::kE4M3;  // element type of both payloads
  Shape shape;                 // [M, K]
  Tensor rowwise_data;
  Tensor rowwise_scale_inv;
  Tensor columnwise_data;
  Tensor columnwise_scale_inv;
  Tensor amax;             // [1] f32: amax of the source (per-tensor; NVFP4 rowwise global amax)
  Tensor columnwise_amax;  // [1] f32: NVFP4 columnwise global amax (after the RHT if any)
  bool columnwise_hadamard = false;  // the columnwise copy holds RHT(x^T)

  bool has_rowwise() const { return rowwise_data.defined(); }
  bool has_columnwise() const { return columnwise_data.defined(); }
  // Throws InternalError naming the first field that does not match the mode's layout.
  void validate() const;
  std::string str() const;  // "nvfp4_1x16 e2m1[64, 32] rowwise+columnwise"
};

// Payload and scale layout of one copy.
struct QuantLayout {
  DType data_dtype;
  Shape data_shape;  // [M, K], or [K, M] for transposed columnwise copies
  DType scale_dtype;
  Shape scale_shape;
  const char* scale_desc;  // e.g. "[ceil(K/128), pad4(M)] (VEC128)"
};
QuantLayout quant_layout(ScalingMode mode, DType dtype, int64_t m, int64_t k, Usage usage);

// Quantizes a 2-D [M, K] bf16 or f32 tensor (any strides) into `out` (whose tensors are
// replaced). CPU tensors run the reference implementation (src/quant/*_ref.cpp); CUDA tensors
// (contiguous) run the kernels of src/quant/*.cu, which produce the same bytes.
void quantize(Context& ctx, const TensorView& x, const QuantConfig& cfg, QuantizedTensor& out);

// Saturation and underflow of the rowwise copy of `q` against its source x [M, K] (bf16 or f32,
// contiguous, on q's device): adds {saturated, underflow} to `counts` [2] i64 (same device; no
// host synchronisation). Saturated: a finite element whose code is the format's largest finite
// magnitude while |x| exceeds, in source units, that max plus half its spacing (464 for E4M3,
// 61440 E5M2, 7 E2M1…: it was clipped, not merely rounded to the max); underflow: a finite
// nonzero element quantized to ±0. Non-finite elements count as neither.
void quant_clip_stats(Context& ctx, const TensorView& x, const QuantizedTensor& q,
                      const TensorView& counts);

// Dequantizes one copy to f32, in its stored orientation ([K, M] for transposed columnwise
// copies); a Hadamard-transformed copy is returned as RHT(x^T), not transformed back.
Tensor dequantize(const QuantizedTensor& q, Usage usage);

// Blackwell block-scale swizzle (formats.md §4.6) of compact scales [R, C] (r = operand row,
// c = K-block; one byte each): returns [pad128(R), pad4(C)] of the same dtype, stored in the
// 128×4-tile order of swizzled_scale_offset(), padding zero.
Tensor swizzle_block_scales(const TensorView& compact);
// The swizzled scales of one copy of an MX or NVFP4 tensor (compact [rows, blocks] of the copy's
// stored orientation; for a columnwise copy r = K index, c = M-block).
Tensor gemm_block_scales(const QuantizedTensor& q, Usage usage);

// --- FP8 delayed scaling (formats.md §2.1, §2.2) ----------------------------------------------

enum class Fp8Format : uint8_t {
  kE4M3,    // every tensor E4M3
  kHybrid,  // forward-pass tensors E4M3, backward-pass tensors (gradients) E5M2
  kE5M2,    // rejected: pure E5M2 training is not supported
};
enum class ScalingPass : uint8_t { kForward, kBackward };
enum class AmaxComputeAlgo : uint8_t { kMax, kMostRecent };

// Element type of a pass under a format (the HYBRID rule).
DType fp8_format_dtype(Fp8Format f, ScalingPass pass);

struct DelayedScalingConfig {
  Fp8Format format = Fp8Format::kHybrid;
  int64_t history_len = 1024;  // L
  AmaxComputeAlgo algo = AmaxComputeAlgo::kMax;
  int margin = 0;           // new scale = (fmax / amax) / 2^margin; 0 ≤ margin ≤ 126
  int update_interval = 1;  // update() acts on every n-th call; amaxes accumulate in between
};

// Scales and amax histories of the per-tensor slots of one pass (the forward tensors of a
// model — inputs, weights, outputs — or its backward tensors), as in TE's recipe state.
// All state lives in tensors so that it can move to the device.
class DelayedScalingState {
 public:
  // Allocates the state on `dev`: history zeros, scales 1.
  DelayedScalingState(const DelayedScalingConfig& cfg, ScalingPass pass, int num_slots,
                      Device dev = Device::cpu());

  const DelayedScalingConfig& config() const { return cfg_; }
  ScalingPass pass() const { return pass_; }
  DType dtype() const { return dtype_; }  // element type of every slot
  float fmax() const;                     // 448 or 57344
  int num_slots() const { return num_slots_; }
  int64_t history_len() const { return cfg_.history_len; }

  // [L, num_slots] f32. Row 0 is the current step's amax (max over the step's quantizations);
  // rows 1..L-1 the finished steps, oldest first.
  const Tensor& amax_history() const { return history_; }
  const Tensor& scale() const { return scale_; }          // [num_slots] f32, initially 1
  const Tensor& scale_inv() const { return scale_inv_; }  // [num_slots] f32, RN(1/scale)
  // Host reads of the CPU state.
  float scale_at(int slot) const;
  float history_at(int64_t row, int slot) const;

  // history[0][slot] = fmaxf(history[0][slot], amax).
  // A state on the GPU does this on the device, in stream order with `ctx` when given.
  void record_amax(int slot, float amax, Context* ctx = nullptr);
  // Hook for the cross-rank MAX all-reduce of the current amaxes: `fn` receives history row 0
  // ([num_slots] f32, contiguous) and reduces it in place. An empty function (one rank) is a
  // no-op.
  using ReduceFn = std::function<void(const TensorView& amax_row)>;
  void reduce_amax(const ReduceFn& fn);
  // Roll the histories and compute new scales (formats.md §2.2, bulk-kernel semantics).
  // A state on the GPU updates on the device: on ctx->stream() when a context is given (no
  // host synchronisation; the quantize kernels of the step run on the same stream), otherwise
  // on the default stream with the device synchronised around it.
  void update(Context* ctx = nullptr);
  int64_t update_calls() const { return update_calls_; }

 private:
  DelayedScalingConfig cfg_;
  ScalingPass pass_;
  DType dtype_;
  int num_slots_;
  int64_t update_calls_ = 0;
  Tensor history_;    // [L, num_slots] f32
  Tensor scale_;      // [num_slots] f32
  Tensor scale_inv_;  // [num_slots] f32
};

}  // namespace lowbit

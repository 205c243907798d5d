// Private to the ops layer: the host side of the fused FP8 epilogues of rmsnorm_fwd_quantize and
// swiglu_fwd_quantize. A fused kernel produces exactly what quantize() (src/quant/) produces for
// per-tensor FP8 with delayed scaling; these helpers decide when that path applies and allocate
// the output tensors with the layouts quantize() uses (quant_layout()).
#pragma once

#include <cstdint>

#include "lowbit/core.h"
#include "lowbit/quant.h"

namespace lowbit::ops_detail {

// Raw device pointers handed to a fused kernel. Null pointers are copies not asked for.
struct Fp8Epilogue {
  const float* scale = nullptr;   // [1] the delayed-scaling state's scale of the slot
  bool e5m2 = false;              // element type: E5M2, else E4M3
  uint8_t* q = nullptr;           // [M, K] rowwise payload
  uint8_t* qt = nullptr;          // [K, M] columnwise payload (stored transposed)
  float* q_scale_inv = nullptr;   // [1] rowwise scale_inv = RN(1 / scale)
  float* qt_scale_inv = nullptr;  // [1] columnwise scale_inv
  float* amax = nullptr;          // [1] zeroed; receives max |value| (NaN skipped)
  float* history_amax = nullptr;  // the slot's entry in the state's current history row (max)
};

// True when `cfg` is per-tensor FP8 (E4M3/E5M2) with delayed scaling, round to nearest, at least
// one copy asked for, and a state on `dev` that quantize() would accept (slot in range, the
// state's element type, no pow2 / amax epsilon). Anything else runs the unfused composition, where
// quantize() reports what is wrong with the configuration.
bool fp8_delayed_fusable(const QuantConfig& cfg, Device dev);

// Replaces `out` with the tensors quantize() allocates for an [m, k] source under `cfg` (which
// passed fp8_delayed_fusable) on ctx's device and returns their pointers. The amax is zeroed on
// ctx's stream; payloads and scale_inv are left for the kernel to write (fp8_epilogue_finish
// writes scale_inv from block 0).
Fp8Epilogue fp8_epilogue_outputs(Context& ctx, const QuantConfig& cfg, int64_t m, int64_t k,
                                 QuantizedTensor& out);

// True for a default-constructed TensorView(): an optional output that was not asked for.
inline bool absent(const TensorView& t) { return t.data == nullptr && t.ndim() == 0; }

}  // namespace lowbit::ops_detail

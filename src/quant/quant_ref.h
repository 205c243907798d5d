// CPU twin of the quant layer (the specification the CUDA kernels are compared against).
#pragma once

#include <cstdint>

#include "lowbit/quant.h"

namespace lowbit {

struct QuantStreams {
  bool stochastic = false;
  RngKey rowwise;     // stream of the rowwise copy (and of transposed-copy modes)
  RngKey columnwise;  // stream of an independently quantized columnwise copy
};

// `cfg` has been checked against `x` (check_quant_config) and x is a CPU tensor.
void quantize_ref(const TensorView& x, const QuantConfig& cfg, const QuantStreams& streams,
                  QuantizedTensor& out);
Tensor dequantize_ref(const QuantizedTensor& q, Usage usage);

// Throws UserError when `cfg` cannot quantize `x`.
void check_quant_config(const TensorView& x, const QuantConfig& cfg);

// Element `idx` of a payload of dtype `t` (E2M1: two per byte, even index in the low nibble).
inline void put_code(uint8_t* data, DType t, int64_t idx, uint32_t code) {
  if (t == DType::kE2M1) {
    uint8_t& b = data[idx >> 1];
    b = (idx & 1) ? static_cast<uint8_t>((b & 0x0Fu) | ((code & 0xFu) << 4))
                  : static_cast<uint8_t>((b & 0xF0u) | (code & 0xFu));
  } else {
    data[idx] = static_cast<uint8_t>(code);
  }
}

inline uint32_t get_code(const uint8_t* data, DType t, int64_t idx) {
  if (t == DType::kE2M1) return (data[idx >> 1] >> ((idx & 1) * 4)) & 0xFu;
  return data[idx];
}

}  // namespace lowbit

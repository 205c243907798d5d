#include "lowbit/core/dtype.h"

namespace lowbit {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kE4M3: return "e4m3";
    case DType::kE5M2: return "e5m2";
    case DType::kE3M2: return "e3m2";
    case DType::kE2M3: return "e2m3";
    case DType::kE2M1: return "e2m1";
    case DType::kE8M0: return "e8m0";
    case DType::kUE4M3: return "ue4m3";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

}  // namespace lowbit

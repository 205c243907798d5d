// Element types. Sizes are in bits because E2M1 packs two elements per byte
// (the element with the even index in the low nibble, formats.md §1.2).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace lowbit {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kE4M3,   // FP8, OCP e4m3fn: no inf, NaN = S.1111.111
  kE5M2,   // FP8, IEEE-like: inf and NaN
  kE3M2,   // FP6 (OCP MX), one byte per element, two MSBs zero
  kE2M3,   // FP6 (OCP MX), one byte per element, two MSBs zero
  kE2M1,   // FP4 (OCP MX / NVFP4 element), packed two per byte
  kE8M0,   // MX block scale: unsigned power of two, no zero, 0xFF = NaN
  kUE4M3,  // NVFP4 block scale: E4M3 bit pattern with sign 0
  kI32,
  kI64,
  kU8,
};

inline constexpr DType kAllDTypes[] = {DType::kF32,  DType::kBF16,  DType::kF16,  DType::kE4M3,
                                       DType::kE5M2, DType::kE3M2,  DType::kE2M3, DType::kE2M1,
                                       DType::kE8M0, DType::kUE4M3, DType::kI32,  DType::kI64,
                                       DType::kU8};

constexpr int dtype_bits(DType t) {
  switch (t) {
    case DType::kF32: return 32;
    case DType::kBF16: return 16;
    case DType::kF16: return 16;
    case DType::kE4M3: return 8;
    case DType::kE5M2: return 8;
    case DType::kE3M2: return 8;  // stored in a byte
    case DType::kE2M3: return 8;  // stored in a byte
    case DType::kE2M1: return 4;
    case DType::kE8M0: return 8;
    case DType::kUE4M3: return 8;
    case DType::kI32: return 32;
    case DType::kI64: return 64;
    case DType::kU8: return 8;
  }
  return 0;
}

// Bytes needed to store `elems` consecutive elements (packed types round up).
constexpr int64_t dtype_storage_bytes(DType t, int64_t elems) {
  return (elems * dtype_bits(t) + 7) / 8;
}

constexpr bool dtype_is_float(DType t) {
  return t != DType::kI32 && t != DType::kI64 && t != DType::kU8;
}

// Short lowercase names used in files, JSON and the CLI: "f32", "bf16", "e4m3", ...
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace lowbit

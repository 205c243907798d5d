// Named precision recipes and where each one can run.
//
// A recipe names a preset of the precision policy (formats.md §2): the element formats and the
// scaling of every GEMM operand. Whether a recipe runs natively, as exact emulation or not at
// all depends on the device; recipe_support() holds those rules in one place.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lowbit/core/sysinfo.h"

namespace lowbit {

enum class Recipe : uint8_t {
  kBF16,        // "bf16": BF16 operands, FP32 accumulation
  kFP8,         // "fp8": per-tensor FP8, delayed scaling, HYBRID (E4M3 fwd, E5M2 bwd)
  kFP8Current,  // "fp8-current": per-tensor FP8, current scaling, HYBRID
  kFP8Block,    // "fp8-block": E4M3, 1x128 activation/gradient and 128x128 weight blocks
  kMXFP8,       // "mxfp8": E4M3, 1x32 blocks, E8M0 scales
  kNVFP4,       // "nvfp4": E2M1, 16-element E4M3 block scales, FP32 tensor scale
};

inline constexpr std::array<Recipe, 6> kAllRecipes = {Recipe::kBF16,       Recipe::kFP8,
                                                      Recipe::kFP8Current, Recipe::kFP8Block,
                                                      Recipe::kMXFP8,      Recipe::kNVFP4};

// "bf16", "fp8", "fp8-current", "fp8-block", "mxfp8", "nvfp4".
const char* recipe_name(Recipe r);
// One line saying what the recipe quantizes and how.
const char* recipe_summary(Recipe r);
// Inverse of recipe_name; an unknown name throws UserError listing the valid ones.
Recipe recipe_from_name(std::string_view name);

enum class SupportLevel : uint8_t {
  kNative,       // the device's own tensor cores / library modes compute it
  kEmulated,     // the same quantized numbers, computed through a wider path
  kUnavailable,  // cannot run here
};

const char* support_level_name(SupportLevel s);  // "native", "emulated", "unavailable"

struct RecipeSupport {
  SupportLevel level = SupportLevel::kUnavailable;
  std::string reason;
};

// Where `r` can run: gpu == nullptr means the CPU path. The FP8 block recipe on Hopper also
// depends on the cuBLASLt version (major*10000 + minor*100 + patch); the two-argument form
// uses the one loaded in this process.
RecipeSupport recipe_support(Recipe r, const GpuInfo* gpu);
RecipeSupport recipe_support(Recipe r, const GpuInfo* gpu, int64_t cublaslt_version);

// cuBLASLt 12.9 introduced the VEC128_32F / BLK128x128_32F scale modes.
inline constexpr int64_t kCublasLtBlockScaledVersion = 120900;

}  // namespace lowbit

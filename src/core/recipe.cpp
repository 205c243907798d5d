#include "lowbit/recipe.h"

#include <cctype>

#include <fmt/format.h>

#include "lowbit/core/error.h"

namespace lowbit {

const char* recipe_name(Recipe r) {
  switch (r) {
    case Recipe::kBF16: return "bf16";
    case Recipe::kFP8: return "fp8";
    case Recipe::kFP8Current: return "fp8-current";
    case Recipe::kFP8Block: return "fp8-block";
    case Recipe::kMXFP8: return "mxfp8";
    case Recipe::kNVFP4: return "nvfp4";
  }
  LOWBIT_CHECK(false, "unknown Recipe value {}", static_cast<int>(r));
}

const char* recipe_summary(Recipe r) {
  switch (r) {
    case Recipe::kBF16: return "BF16 operands, FP32 accumulation";
    case Recipe::kFP8: return "FP8 per-tensor, delayed scaling, E4M3 forward / E5M2 backward";
    case Recipe::kFP8Current:
      return "FP8 per-tensor, current scaling, E4M3 forward / E5M2 backward";
    case Recipe::kFP8Block: return "FP8 E4M3, 1x128 and 128x128 blocks, power-of-two FP32 scales";
    case Recipe::kMXFP8: return "MXFP8 E4M3, 1x32 blocks, E8M0 scales";
    case Recipe::kNVFP4: return "NVFP4 E2M1, 16-element E4M3 block scales, FP32 tensor scale";
  }
  LOWBIT_CHECK(false, "unknown Recipe value {}", static_cast<int>(r));
}

Recipe recipe_from_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string valid;
  for (Recipe r : kAllRecipes) {
    if (lower == recipe_name(r)) return r;
    valid += valid.empty() ? "" : ", ";
    valid += recipe_name(r);
  }
  throw UserError(fmt::format("unknown recipe '{}'; valid recipes: {}", name, valid));
}

const char* support_level_name(SupportLevel s) {
  switch (s) {
    case SupportLevel::kNative: return "native";
    case SupportLevel::kEmulated: return "emulated";
    case SupportLevel::kUnavailable: return "unavailable";
  }
  LOWBIT_CHECK(false, "unknown SupportLevel value {}", static_cast<int>(s));
}

namespace {

constexpr const char* kNotRun = "; not yet run on hardware";

std::string cublaslt_version_str(int64_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

RecipeSupport native(std::string reason) { return {SupportLevel::kNative, std::move(reason)}; }
RecipeSupport emulated(std::string reason) { return {SupportLevel::kEmulated, std::move(reason)}; }
RecipeSupport unavailable(std::string reason) {
  return {SupportLevel::kUnavailable, std::move(reason)};
}

bool is_per_tensor_fp8(Recipe r) { return r == Recipe::kFP8 || r == Recipe::kFP8Current; }
bool is_microscaled(Recipe r) { return r == Recipe::kMXFP8 || r == Recipe::kNVFP4; }

RecipeSupport mx_emulated_before_sm100() {
  return emulated(
      "no MX/NVFP4 tensor cores before sm_100: exact emulation on 16-bit tensor cores "
      "(operands dequantized exactly, inside a fused GEMM where faster)");
}

// Blackwell: every recipe has a tensor-core path; `suffix` says how sure we are of it.
RecipeSupport blackwell(Recipe r, const std::string& suffix) {
  if (r == Recipe::kBF16) return native("BF16 tensor cores (cuBLASLt)" + suffix);
  if (is_per_tensor_fp8(r)) return native("FP8 tensor cores (cuBLASLt per-tensor scales)" + suffix);
  if (r == Recipe::kFP8Block) {
    return native(
        "native via cuBLASLt block-scaled modes (runs through MXFP8 with the same power-of-two "
        "scales)" +
        suffix);
  }
  return native("native via cuBLASLt block-scaled modes" + suffix);
}

}  // namespace

RecipeSupport recipe_support(Recipe r, const GpuInfo* gpu, int64_t cublaslt_version) {
  if (gpu == nullptr) {
    return emulated("CPU path: the CPU twin computes the same numbers in fp32");
  }
  const int sm = gpu->sm();
  if (sm < 80) {
    return unavailable(fmt::format("BF16 tensor cores need sm_80+; this GPU is sm_{}", sm));
  }
  if (r == Recipe::kBF16 && sm < 100) return native("BF16 tensor cores (cuBLASLt)");

  if (gpu->sm_major == 8 && sm != 89) {  // Ampere: sm_80, sm_86, sm_87
    if (is_microscaled(r)) return mx_emulated_before_sm100();
    return emulated("no FP8 tensor cores before sm_89: FP8 payloads dequantized to BF16");
  }
  if (sm == 89) {  // Ada
    if (is_per_tensor_fp8(r)) return native("FP8 tensor cores (cuBLASLt per-tensor scales)");
    if (r == Recipe::kFP8Block) {
      return unavailable("block-scaled FP8 GEMM needs sm_90+");
    }
    return mx_emulated_before_sm100();
  }
  if (gpu->sm_major == 9) {  // Hopper
    if (is_per_tensor_fp8(r)) return native("FP8 tensor cores (cuBLASLt per-tensor scales)");
    if (r == Recipe::kFP8Block) {
      if (cublaslt_version >= kCublasLtBlockScaledVersion) {
        return native(fmt::format("cuBLASLt {} VEC128_32F / BLK128x128_32F block-scaled modes",
                                  cublaslt_version_str(cublaslt_version)));
      }
      return unavailable(fmt::format(
          "needs cuBLASLt >= {} for the VEC128_32F / BLK128x128_32F block-scaled modes; found {}",
          cublaslt_version_str(kCublasLtBlockScaledVersion),
          cublaslt_version_str(cublaslt_version)));
    }
    return mx_emulated_before_sm100();
  }
  // MXFP8 / NVFP4 take cuBLASLt's block-scaled modes from 12.9 on, as gemm_backend_for decides;
  // an older (or unknown) library means the exact emulation.
  if (is_microscaled(r) && cublaslt_version < kCublasLtBlockScaledVersion) {
    return emulated(fmt::format(
        "cuBLASLt {} predates the VEC32_UE8M0 / VEC16_UE4M3 block-scaled modes (>= {}): exact "
        "emulation on 16-bit tensor cores",
        cublaslt_version_str(cublaslt_version), cublaslt_version_str(kCublasLtBlockScaledVersion)));
  }
  if (gpu->sm_major <= 12) return blackwell(r, kNotRun);  // sm_100, sm_103, sm_110, sm_120
  return blackwell(r, fmt::format("; sm_{} is newer than the GPUs these rules know, assumed to "
                                  "match sm_120{}",
                                  sm, kNotRun));
}

RecipeSupport recipe_support(Recipe r, const GpuInfo* gpu) {
  // Only Hopper's and Blackwell's answers depend on the library, so only then is it queried.
  const int64_t cublaslt =
      (gpu != nullptr && gpu->sm_major >= 9) ? library_versions().cublaslt.version_code : 0;
  return recipe_support(r, gpu, cublaslt);
}

}  // namespace lowbit

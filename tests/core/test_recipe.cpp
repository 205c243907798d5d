// Recipe names and the rules that say where each recipe runs.
#include "lowbit/recipe.h"

#include <string>

#include <gtest/gtest.h>

#include "lowbit/core/error.h"

namespace lowbit {
namespace {

GpuInfo gpu_sm(int major, int minor) {
  GpuInfo g;
  g.name = "test GPU";
  g.sm_major = major;
  g.sm_minor = minor;
  return g;
}

constexpr int64_t kCublasLt131 = 130100;
constexpr int64_t kCublasLt128 = 120800;

SupportLevel level(Recipe r, int major, int minor, int64_t cublaslt = kCublasLt131) {
  const GpuInfo g = gpu_sm(major, minor);
  return recipe_support(r, &g, cublaslt).level;
}

std::string reason(Recipe r, int major, int minor, int64_t cublaslt = kCublasLt131) {
  const GpuInfo g = gpu_sm(major, minor);
  return recipe_support(r, &g, cublaslt).reason;
}

constexpr SupportLevel N = SupportLevel::kNative;
constexpr SupportLevel E = SupportLevel::kEmulated;
constexpr SupportLevel U = SupportLevel::kUnavailable;

TEST(Recipe, NamesRoundTrip) {
  const char* expected[] = {"bf16", "fp8", "fp8-current", "fp8-block", "mxfp8", "nvfp4"};
  ASSERT_EQ(kAllRecipes.size(), 6u);
  for (size_t i = 0; i < kAllRecipes.size(); ++i) {
    EXPECT_STREQ(recipe_name(kAllRecipes[i]), expected[i]);
    EXPECT_EQ(recipe_from_name(expected[i]), kAllRecipes[i]);
    EXPECT_STRNE(recipe_summary(kAllRecipes[i]), "");
  }
  EXPECT_EQ(recipe_from_name("FP8-Block"), Recipe::kFP8Block);
}

TEST(Recipe, UnknownNameListsValidOnes) {
  try {
    recipe_from_name("fp6");
    FAIL() << "no UserError for an unknown recipe";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'fp6'"), std::string::npos) << msg;
    for (Recipe r : kAllRecipes) EXPECT_NE(msg.find(recipe_name(r)), std::string::npos) << msg;
  }
  EXPECT_THROW(recipe_from_name(""), UserError);
}

TEST(Recipe, SupportLevelNames) {
  EXPECT_STREQ(support_level_name(N), "native");
  EXPECT_STREQ(support_level_name(E), "emulated");
  EXPECT_STREQ(support_level_name(U), "unavailable");
}

TEST(Recipe, CpuEmulatesEverything) {
  for (Recipe r : kAllRecipes) {
    const RecipeSupport s = recipe_support(r, nullptr);
    EXPECT_EQ(s.level, E) << recipe_name(r);
    EXPECT_NE(s.reason.find("CPU"), std::string::npos) << s.reason;
  }
}

TEST(Recipe, HopperSm90) {
  EXPECT_EQ(level(Recipe::kBF16, 9, 0), N);
  EXPECT_EQ(level(Recipe::kFP8, 9, 0), N);
  EXPECT_EQ(level(Recipe::kFP8Current, 9, 0), N);
  EXPECT_EQ(level(Recipe::kFP8Block, 9, 0), N);
  EXPECT_NE(reason(Recipe::kFP8Block, 9, 0).find("VEC128_32F"), std::string::npos);
  for (Recipe r : {Recipe::kMXFP8, Recipe::kNVFP4}) {
    EXPECT_EQ(level(r, 9, 0), E) << recipe_name(r);
    EXPECT_NE(reason(r, 9, 0).find("no MX/NVFP4 tensor cores before sm_100"), std::string::npos);
    EXPECT_NE(reason(r, 9, 0).find("exact emulation on 16-bit tensor cores"), std::string::npos);
  }
}

TEST(Recipe, HopperFp8BlockNeedsCublasLt129) {
  EXPECT_EQ(level(Recipe::kFP8Block, 9, 0, kCublasLtBlockScaledVersion), N);
  EXPECT_EQ(level(Recipe::kFP8Block, 9, 0, kCublasLtBlockScaledVersion - 1), U);
  const std::string why = reason(Recipe::kFP8Block, 9, 0, kCublasLt128);
  EXPECT_NE(why.find("12.9.0"), std::string::npos) << why;
  EXPECT_NE(why.find("12.8.0"), std::string::npos) << why;  // the version found
  // The per-tensor recipes do not depend on the cuBLASLt version.
  EXPECT_EQ(level(Recipe::kFP8, 9, 0, kCublasLt128), N);
}

TEST(Recipe, BlackwellSm100AndSm103) {
  for (int minor : {0, 3}) {
    for (Recipe r : kAllRecipes) EXPECT_EQ(level(r, 10, minor), N) << recipe_name(r);
    for (Recipe r : {Recipe::kMXFP8, Recipe::kNVFP4, Recipe::kFP8Block}) {
      const std::string why = reason(r, 10, minor);
      EXPECT_NE(why.find("native via cuBLASLt block-scaled modes"), std::string::npos) << why;
      EXPECT_NE(why.find("not yet run on hardware"), std::string::npos) << why;
    }
    EXPECT_NE(reason(Recipe::kFP8Block, 10, minor).find("MXFP8"), std::string::npos);
  }
}

// MXFP8 / NVFP4 on Blackwell need cuBLASLt's block-scaled modes (12.9+); with an older library
// they fall back to the emulation, and the other recipes do not depend on it.
TEST(Recipe, BlackwellMicroscaledNeedsCublasLt129) {
  for (Recipe r : {Recipe::kMXFP8, Recipe::kNVFP4}) {
    EXPECT_EQ(level(r, 10, 0, kCublasLtBlockScaledVersion), N) << recipe_name(r);
    EXPECT_EQ(level(r, 10, 0, kCublasLt128), E) << recipe_name(r);
    const std::string why = reason(r, 10, 0, kCublasLt128);
    EXPECT_NE(why.find("12.8.0"), std::string::npos) << why;
    EXPECT_NE(why.find("12.9.0"), std::string::npos) << why;
  }
  EXPECT_EQ(level(Recipe::kFP8, 10, 0, kCublasLt128), N);
}

TEST(Recipe, BlackwellSm120) {
  for (Recipe r : {Recipe::kFP8, Recipe::kMXFP8, Recipe::kNVFP4}) {
    EXPECT_EQ(level(r, 12, 0), N) << recipe_name(r);
    EXPECT_NE(reason(r, 12, 0).find("not yet run on hardware"), std::string::npos);
  }
  EXPECT_EQ(level(Recipe::kBF16, 12, 0), N);
}

TEST(Recipe, AdaSm89) {
  EXPECT_EQ(level(Recipe::kBF16, 8, 9), N);
  EXPECT_EQ(level(Recipe::kFP8, 8, 9), N);
  EXPECT_EQ(level(Recipe::kFP8Current, 8, 9), N);
  EXPECT_EQ(level(Recipe::kFP8Block, 8, 9), U);
  EXPECT_NE(reason(Recipe::kFP8Block, 8, 9).find("sm_90+"), std::string::npos);
  EXPECT_EQ(level(Recipe::kMXFP8, 8, 9), E);
  EXPECT_EQ(level(Recipe::kNVFP4, 8, 9), E);
}

TEST(Recipe, AmpereSm80AndSm86) {
  for (int minor : {0, 6}) {
    EXPECT_EQ(level(Recipe::kBF16, 8, minor), N);
    for (Recipe r : {Recipe::kFP8, Recipe::kFP8Current, Recipe::kFP8Block}) {
      EXPECT_EQ(level(r, 8, minor), E) << recipe_name(r);
      EXPECT_NE(reason(r, 8, minor).find("no FP8 tensor cores"), std::string::npos);
      EXPECT_NE(reason(r, 8, minor).find("BF16"), std::string::npos);
    }
    EXPECT_EQ(level(Recipe::kMXFP8, 8, minor), E);
    EXPECT_EQ(level(Recipe::kNVFP4, 8, minor), E);
  }
}

TEST(Recipe, BelowSm80Unavailable) {
  for (auto [major, minor] : {std::pair{7, 5}, std::pair{7, 0}, std::pair{6, 1}}) {
    for (Recipe r : kAllRecipes) {
      EXPECT_EQ(level(r, major, minor), U) << recipe_name(r);
      EXPECT_NE(reason(r, major, minor).find("BF16 tensor cores need sm_80+"), std::string::npos);
    }
  }
}

TEST(Recipe, EveryAnswerHasAReason) {
  for (auto [major, minor] :
       {std::pair{7, 5}, std::pair{8, 0}, std::pair{8, 6}, std::pair{8, 9}, std::pair{9, 0},
        std::pair{10, 0}, std::pair{10, 3}, std::pair{12, 0}, std::pair{13, 0}}) {
    for (Recipe r : kAllRecipes) EXPECT_FALSE(reason(r, major, minor).empty());
  }
}

}  // namespace
}  // namespace lowbit

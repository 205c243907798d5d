#include "core/env_switch.h"

#include <gtest/gtest.h>

#include <string>

#include "user_error.h"

namespace lowbit {
namespace {

using test_util::user_error;

TEST(EnvSwitch, OnOffWordsInAnyCase) {
  for (const char* v : {"1", "on", "ON", "true", "True", "yes"}) {
    EXPECT_EQ(parse_env_switch("LOWBIT_X", v), 1) << v;
  }
  for (const char* v : {"0", "off", "Off", "false", "NO"}) {
    EXPECT_EQ(parse_env_switch("LOWBIT_X", v), 0) << v;
  }
  EXPECT_EQ(parse_env_switch("LOWBIT_X", nullptr), -1);
  EXPECT_EQ(parse_env_switch("LOWBIT_X", ""), -1);
  EXPECT_EQ(parse_env_switch("LOWBIT_X", "Auto", "auto"), 2);
}

TEST(EnvSwitch, ATypoIsAnErrorNamingTheVariableAndItsValues) {
  for (const char* v : {"2", "of", " on", "auto", "enabled"}) {
    const std::string why = user_error([&] { parse_env_switch("LOWBIT_PDL", v); });
    EXPECT_NE(why.find("LOWBIT_PDL=" + std::string(v)), std::string::npos) << why;
    EXPECT_NE(why.find("on / off"), std::string::npos) << why;
  }
  const std::string why = user_error([] { parse_env_switch("LOWBIT_GEMM_FUSED", "atuo", "auto"); });
  EXPECT_NE(why.find("or auto"), std::string::npos) << why;
}

TEST(EnvSwitch, Choices) {
  EXPECT_EQ(parse_env_choice("LOWBIT_Q", nullptr, {"v8", "v9"}, "v9"), "v9");
  EXPECT_EQ(parse_env_choice("LOWBIT_Q", "", {"v8", "v9"}, "v9"), "v9");
  EXPECT_EQ(parse_env_choice("LOWBIT_Q", "V8", {"v8", "v9"}, "v9"), "v8");
  const std::string why = user_error([] {
    parse_env_choice("LOWBIT_Q", "v7", {"v8", "v9"}, "v9");
  });
  EXPECT_NE(why.find("LOWBIT_Q=v7"), std::string::npos) << why;
  EXPECT_NE(why.find("v8, v9"), std::string::npos) << why;
}

}  // namespace
}  // namespace lowbit

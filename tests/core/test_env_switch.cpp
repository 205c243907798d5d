#include "core/env_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "lowbit/core/context.h"
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

// Sets an environment variable for a scope, then restores it.
class EnvScope {
 public:
  EnvScope(const char* var, const char* value) : var_(var) {
    if (const char* old = std::getenv(var)) old_ = old;
    setenv(var, value, 1);
  }
  ~EnvScope() {
    if (old_.has_value()) {
      setenv(var_, old_->c_str(), 1);
    } else {
      unsetenv(var_);
    }
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  const char* var_;
  std::optional<std::string> old_;
};

TEST(EnvSwitch, AContextRefusesAMistypedSwitch) {
  for (const char* var : {"LOWBIT_PDL", "LOWBIT_POISON_ALLOC", "LOWBIT_GEMM_AUTOTUNE",
                          "LOWBIT_GEMM_FUSED", "LOWBIT_QUANT_KERNELS"}) {
    EnvScope scope(var, "maybe");
    const std::string why = user_error([] { Context ctx(Device::cpu()); });
    EXPECT_NE(why.find(std::string(var) + "=maybe"), std::string::npos) << why;
  }
  EnvScope fine("LOWBIT_GEMM_FUSED", "AUTO");
  Context ctx(Device::cpu());  // accepted
}

}  // namespace
}  // namespace lowbit

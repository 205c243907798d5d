#include "core/env_switch.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>

#include "lowbit/core/error.h"

namespace lowbit {
namespace {

std::string lower(const char* value) {
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v;
}

}  // namespace

int parse_env_switch(const char* var, const char* value, const char* also) {
  if (value == nullptr || *value == '\0') return -1;
  const std::string v = lower(value);
  if (v == "1" || v == "on" || v == "true" || v == "yes") return 1;
  if (v == "0" || v == "off" || v == "false" || v == "no") return 0;
  if (also != nullptr && v == lower(also)) return 2;
  throw UserError(fmt::format("{}={}: expected on / off (1 / 0, true / false, yes / no){}", var,
                              value, also != nullptr ? fmt::format(" or {}", also) : ""));
}

std::string parse_env_choice(const char* var, const char* value,
                             std::initializer_list<const char*> choices, const char* fallback) {
  if (value == nullptr || *value == '\0') return fallback;
  const std::string v = lower(value);
  std::string listed;
  for (const char* c : choices) {
    if (v == lower(c)) return lower(c);
    listed += listed.empty() ? c : fmt::format(", {}", c);
  }
  throw UserError(
      fmt::format("{}={}: expected one of {} (or unset: {})", var, value, listed, fallback));
}

int parse_gemm_fused(const char* value) {
  return parse_env_switch("LOWBIT_GEMM_FUSED", value, "auto");
}

int parse_quant_kernels(const char* value) {
  const std::string v = parse_env_choice(
      "LOWBIT_QUANT_KERNELS", value, {"v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15"}, "v15");
  return std::stoi(v.substr(1));
}

void validate_env_switches() {
  for (const char* var : {"LOWBIT_GEMM_AUTOTUNE", "LOWBIT_POISON_ALLOC", "LOWBIT_PDL"}) {
    parse_env_switch(var, std::getenv(var));
  }
  parse_gemm_fused(std::getenv("LOWBIT_GEMM_FUSED"));
  parse_quant_kernels(std::getenv("LOWBIT_QUANT_KERNELS"));
}

}  // namespace lowbit

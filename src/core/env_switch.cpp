#include "core/env_switch.h"

#include <fmt/format.h>

#include <cctype>

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

}  // namespace lowbit

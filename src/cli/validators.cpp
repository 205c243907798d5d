// Numeric range validators of the command line (commands.h).
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cli/commands.h"

namespace lowbit::cli {

CLI::Validator integer_at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        // Base 0, as CLI11 converts the value it stores (0x10 is 16, 010 is 8).
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 0);
        if (s.empty() || end == s.c_str() || *end != '\0') {
          return fmt::format("'{}' is not an integer", s);
        }
        if (errno == ERANGE) return fmt::format("{} is out of range", s);
        if (v < lo) return fmt::format("{} is below the smallest allowed value, {}", v, lo);
        return std::string();
      },
      fmt::format("INT ≥ {}", lo));
}

CLI::Validator finite_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end == s.c_str() || *end != '\0') {
          return fmt::format("'{}' is not a number", s);
        }
        if (!std::isfinite(v) || v < lo || v > hi) {
          return fmt::format("{} is outside [{}, {}]", s, lo, hi);
        }
        return std::string();
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

}  // namespace lowbit::cli

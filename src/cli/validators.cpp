// Numeric range validators of the command line (commands.h).
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cli/commands.h"

namespace lowbit::cli {

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string description = hi == std::numeric_limits<int64_t>::max()
                                      ? fmt::format("INT >= {}", lo)
                                      : fmt::format("INT in [{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        // Base 0, as CLI11 converts the value it stores (0x10 is 16, 010 is 8).
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 0);
        if (s.empty() || end == s.c_str() || *end != '\0') {
          return fmt::format("'{}' is not an integer", s);
        }
        // Past the 64-bit range strtoll saturates (ERANGE): the sign says which bound it passes.
        const bool too_low = errno == ERANGE ? v < 0 : v < lo;
        const bool too_high = errno == ERANGE ? v > 0 : v > hi;
        if (too_low) return fmt::format("{} is below the smallest allowed value, {}", s, lo);
        if (too_high) return fmt::format("{} is above the largest allowed value, {}", s, hi);
        return std::string();
      },
      description);
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

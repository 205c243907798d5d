// Errors. Two kinds:
//  * lowbit::UserError — bad input (flag, file, shape, GPU). The CLI prints its
//    message alone, without a trace, and exits with status 2.
//  * lowbit::InternalError — a broken invariant or a failed library call; the
//    message carries file:line.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace lowbit {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

class InternalError : public std::runtime_error {
 public:
  explicit InternalError(const std::string& msg) : std::runtime_error(msg) {}
};

[[noreturn]] void throw_internal(const char* file, int line, const std::string& msg);

}  // namespace lowbit

// LOWBIT_CHECK(cond, "fmt {}", args...) — internal invariant; throws InternalError with file:line.
#define LOWBIT_CHECK(cond, ...)                                                   \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::lowbit::throw_internal(                                                   \
          __FILE__, __LINE__,                                                     \
          std::string("check failed: " #cond ": ") + ::fmt::format(__VA_ARGS__)); \
    }                                                                             \
  } while (0)

// LOWBIT_USER_CHECK(cond, "what was wrong and what to do", args...) — bad user input.
#define LOWBIT_USER_CHECK(cond, ...)                                    \
  do {                                                                  \
    if (!(cond)) throw ::lowbit::UserError(::fmt::format(__VA_ARGS__)); \
  } while (0)

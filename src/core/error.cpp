#include "lowbit/core/error.h"

namespace lowbit {

void throw_internal(const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("{}:{}: {}", file, line, msg));
}

}  // namespace lowbit

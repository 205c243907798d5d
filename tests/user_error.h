// The message of the UserError a callable throws, for tests that check what an error says.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "lowbit/core/error.h"

namespace lowbit::test_util {

// The message of the UserError that f() throws; "" (and a test failure) when it throws none.
template <class F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

}  // namespace lowbit::test_util

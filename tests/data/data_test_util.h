// Helpers of the data-layer tests: a scratch directory per test, the bundled corpus, random bytes,
// and the message of an expected UserError.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/data/corpus.h"
#include "user_error.h"

namespace lowbit::data::testing {

namespace fs = std::filesystem;

// A fresh directory for the running test, removed afterwards.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("lowbit_data_" + std::to_string(::getpid()) + "_" +
                                        info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    f << content;
    return p;
  }
  fs::path dir_;
};

inline std::string kjv_path() {
  return std::string(LOWBIT_TEST_DATA_DIR) + "/../../data/kjv.txt.xz";
}

// The bundled corpus, decompressed once.
inline const std::string& kjv_text() {
  static const std::string text = read_text_file(kjv_path());
  return text;
}

inline std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

using lowbit::test_util::user_error;

}  // namespace lowbit::data::testing

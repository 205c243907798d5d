// safetensors reader and writer: round trip, every malformed input rejected with a UserError
// that says what is wrong, and the atomic write.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/data/safetensors.h"

namespace lowbit::data {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lowbit_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes an 8-byte length, `header` and `data` (the length is header.size() unless given).
  std::string write_raw(const std::string& header, const std::string& data,
                        int64_t len = -1) const {
    const std::string p = path("raw.safetensors");
    std::ofstream f(p, std::ios::binary);
    uint64_t n = len < 0 ? header.size() : static_cast<uint64_t>(len);
    for (int i = 0; i < 8; ++i, n >>= 8) f.put(static_cast<char>(n & 0xFF));
    f << header << data;
    return p;
  }

  fs::path dir_;
};

// The message of the UserError that reading `p` throws ("" when none is thrown).
std::string read_error(const std::string& p) {
  try {
    read_safetensors(p);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_READ_ERROR(p, word)                                      \
  do {                                                                  \
    const std::string msg = read_error(p);                              \
    EXPECT_NE(msg.find(word), std::string::npos) << "message: " << msg; \
    EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;    \
  } while (0)

SafeTensorsFile sample() {
  SafeTensorsFile f;
  SafeTensor w{"BF16", {2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  SafeTensor b{"F32", {2}, {0, 0, 128, 63, 0, 0, 0, 64}};
  SafeTensor i{"I64", {1}, {7, 0, 0, 0, 0, 0, 0, 0}};
  SafeTensor e{"F8_E4M3", {0, 4}, {}};
  f.tensors = {{"z.weight", w}, {"a.bias", b}, {"step", i}, {"empty", e}};
  f.metadata = {{"format", "pt"}, {"note", "x"}};
  return f;
}

TEST_F(SafetensorsTest, RoundTrip) {
  const SafeTensorsFile f = sample();
  const std::string p = path("rt.safetensors");
  write_safetensors(p, f);
  const SafeTensorsFile g = read_safetensors(p);
  EXPECT_EQ(g.metadata, f.metadata);
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    const SafeTensor& u = g.tensors.at(name);
    EXPECT_EQ(u.dtype, t.dtype) << name;
    EXPECT_EQ(u.shape, t.shape) << name;
    EXPECT_EQ(u.data, t.data) << name;
  }
  EXPECT_EQ(g.tensors.at("z.weight").lowbit_dtype(), DType::kBF16);
  EXPECT_EQ(g.tensors.at("step").lowbit_dtype(), DType::kI64);

  // Header padded with spaces to a multiple of 8; data in sorted-name order.
  std::ifstream in(p, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  EXPECT_LT(header.find("\"a.bias\""), header.find("\"z.weight\""));
  std::string rest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rest.size(), 8u + 8u + 12u);
  EXPECT_EQ(static_cast<uint8_t>(rest[0]), 0);   // a.bias first
  EXPECT_EQ(static_cast<uint8_t>(rest[16]), 1);  // z.weight last
  EXPECT_FALSE(fs::exists(p + ".tmp-" + std::to_string(::getpid())));
}

TEST_F(SafetensorsTest, EmptyFileOfNoTensors) {
  const std::string p = path("none.safetensors");
  write_safetensors(p, SafeTensorsFile{});
  const SafeTensorsFile g = read_safetensors(p);
  EXPECT_TRUE(g.tensors.empty());
  EXPECT_TRUE(g.metadata.empty());
}

TEST_F(SafetensorsTest, MissingFile) { EXPECT_READ_ERROR(path("nope.safetensors"), "missing"); }

TEST_F(SafetensorsTest, ShorterThanEightBytes) {
  const std::string p = path("short.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_READ_ERROR(p, "shorter than the 8-byte");
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  EXPECT_READ_ERROR(write_raw("{}", "", 1000), "beyond the file");
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  EXPECT_READ_ERROR(write_raw("{not json", ""), "not valid JSON");
}

TEST_F(SafetensorsTest, HeaderNotObject) {
  EXPECT_READ_ERROR(write_raw("[1, 2]  ", ""), "not a JSON object");
}

// A header nested far deeper than any real one (its shape 200k lists deep) is a clear error,
// not a stack overflow in the message that would show the shape (core/json_read.h); 128 levels
// still parse (the shape is then rejected for what it is).
TEST_F(SafetensorsTest, DeeplyNestedHeaderIsAClearError) {
  const auto nested = [](int depth) {
    return R"({"w":{"dtype":"F32","shape":)" + std::string(depth, '[') + std::string(depth, ']') +
           R"(,"data_offsets":[0,4]}})";
  };
  EXPECT_READ_ERROR(write_raw(nested(200000), "abcd"), "nested deeper than 128");
  EXPECT_READ_ERROR(write_raw(nested(126), "abcd"), "not a non-negative integer");
}

// The buffer is indexed whole and a name appears once (the format's rules): holes, trailing
// bytes and a repeated key (JSON would keep the last entry silently) are errors.
TEST_F(SafetensorsTest, HolesTrailingBytesAndRepeatedNamesAreErrors) {
  EXPECT_READ_ERROR(write_raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                              "abcde"),
                    "belong to no tensor (before 'b')");
  EXPECT_READ_ERROR(write_raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "abcd"),
                    "2 bytes after the last tensor");
  EXPECT_READ_ERROR(write_raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                              R"("a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                              "abcd"),
                    "the key 'a' appears twice");
}

// The JSON parser stops at a NUL byte: what follows one would be accepted unread. Only the
// padding spaces may follow the JSON text.
TEST_F(SafetensorsTest, BytesAfterTheJsonTextAreErrors) {
  const std::string entry = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  EXPECT_READ_ERROR(write_raw(entry + std::string("\0garbage", 8), "ab"), "NUL byte at offset 53");
  EXPECT_READ_ERROR(write_raw(entry + std::string("\0      ", 8), "ab"), "only spaces may follow");
  EXPECT_READ_ERROR(write_raw(entry + "  x", "ab"), "not valid JSON");
  EXPECT_EQ(read_safetensors(write_raw(entry + "      ", "ab")).tensors.at("a").data.size(), 2u);
}

TEST_F(SafetensorsTest, UnknownDtype) {
  EXPECT_READ_ERROR(write_raw(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "x"),
                    "unknown dtype 'Q7'");
}

TEST_F(SafetensorsTest, ShapeInconsistentWithOffsets) {
  EXPECT_READ_ERROR(write_raw(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
                              std::string(16, 'x')),
                    "inconsistent");
}

TEST_F(SafetensorsTest, OffsetsReversed) {
  EXPECT_READ_ERROR(
      write_raw(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", std::string(4, 'x')),
      "out of range");
}

TEST_F(SafetensorsTest, OffsetsBeyondBufferAreTruncatedData) {
  const std::string p =
      write_raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(10, 'x'));
  EXPECT_READ_ERROR(p, "out of range");
  EXPECT_READ_ERROR(p, "truncated");
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  EXPECT_READ_ERROR(write_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                              std::string(12, 'x')),
                    "overlapping");
}

TEST_F(SafetensorsTest, NegativeDimension) {
  EXPECT_READ_ERROR(
      write_raw(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", std::string(1, 'x')),
      "non-negative");
}

TEST_F(SafetensorsTest, BadMetadata) {
  EXPECT_READ_ERROR(write_raw(R"({"__metadata__":{"a":1}})", ""), "__metadata__");
}

TEST_F(SafetensorsTest, AtomicWriteIntoMissingDirectory) {
  const std::string p = path("no/such/dir/out.safetensors");
  EXPECT_THROW(write_safetensors(p, sample()), UserError);
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(SafetensorsTest, FailedRenameRemovesTemporaryFile) {
  // OUT is a non-empty directory: the rename fails (even for root), nothing is left behind.
  const fs::path out = dir_ / "out.safetensors";
  fs::create_directories(out / "x");
  try {
    write_safetensors(out.string(), sample());
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("renaming"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(out));
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST_F(SafetensorsTest, FailedWriteKeepsPreviousFile) {
  const std::string p = path("keep.safetensors");
  write_safetensors(p, sample());
  SafeTensorsFile bad;
  bad.tensors["w"] = SafeTensor{"F32", {2}, {1, 2, 3}};  // 3 bytes for 8
  EXPECT_THROW(write_safetensors(p, bad), UserError);
  EXPECT_EQ(read_safetensors(p).tensors.size(), sample().tensors.size());
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace lowbit::data

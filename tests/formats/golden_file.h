// Loader for the golden files in tests/data/golden (written by tools/gen_format_golden.py; the
// layout is described there and in tests/data/golden/README.md).
//
// Every header field is checked against what the caller expects, and the file size against
// the count, so a missing, truncated or regenerated-with-other-settings file fails with a
// message that names the file and the field instead of comparing garbage.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace lowbit::golden {

inline constexpr char kGoldenMagic[8] = {'L', 'B', 'G', 'O', 'L', 'D', '0', '1'};
inline constexpr uint32_t kGoldenVersion = 1;
inline constexpr uint32_t kGoldenHeaderBytes = 96;
inline constexpr uint64_t kGoldenMaxCount = uint64_t{1} << 24;  // sanity cap on allocation

// One golden file with its inputs made explicit: for "decode" inputs[i] = i (the code), for
// "encode_bf16" inputs[i] = i << 16 (fp32 bits of bf16 pattern i), for "encode_f32" the
// listed fp32 bits. outputs hold codes (encode) or fp32 bits (decode).
struct GoldenFile {
  std::string path;
  std::string dtype;   // our short name, e.g. "e4m3"
  std::string kind;    // "decode" | "encode_bf16" | "encode_f32"
  std::string oracle;  // e.g. "ml_dtypes-0.6.0:float8_e4m3fn"
  uint64_t count = 0;
  std::vector<uint32_t> inputs;   // (count)
  std::vector<uint32_t> outputs;  // (count)
};

inline std::string golden_path(std::string_view dtype, std::string_view kind) {
  return std::string(LOWBIT_TEST_DATA_DIR) + "/golden/" + std::string(dtype) + "_" +
         std::string(kind) + ".bin";
}

namespace detail {

inline uint32_t read_u32_le(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

inline uint64_t read_u64_le(const unsigned char* p) {
  return uint64_t{read_u32_le(p)} | uint64_t{read_u32_le(p + 4)} << 32;
}

// A NUL-padded ASCII field; the padding must be NULs only.
inline bool read_text(const unsigned char* p, size_t size, std::string* out) {
  size_t n = 0;
  while (n < size && p[n] != 0) ++n;
  if (n == size) return false;  // no terminating NUL
  for (size_t i = n; i < size; ++i)
    if (p[i] != 0) return false;
  out->assign(reinterpret_cast<const char*>(p), n);
  return true;
}

}  // namespace detail

// Reads the golden file at `path`, which must hold `dtype` and `kind`; `expected_count` = 0
// accepts any count. Returns an empty string on success, otherwise what is wrong (the file is
// then unusable).
inline std::string golden_load_file(const std::string& path, std::string_view dtype,
                                    std::string_view kind, uint64_t expected_count,
                                    GoldenFile* out) {
  using namespace detail;
  *out = GoldenFile{};
  out->path = path;
  const std::string where = out->path + ": ";
  const std::string regen = " (regenerate with: python3 tools/gen_format_golden.py)";
  std::ifstream f(out->path, std::ios::binary);
  if (!f) return where + "cannot open the golden file" + regen;
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)),
                                         std::istreambuf_iterator<char>());
  if (bytes.size() < kGoldenHeaderBytes)
    return where + "truncated header: " + std::to_string(bytes.size()) + " bytes, need " +
           std::to_string(kGoldenHeaderBytes) + regen;
  const unsigned char* h = bytes.data();
  if (std::memcmp(h, kGoldenMagic, 8) != 0) return where + "bad magic, not an LBGOLD01 file";
  const uint32_t version = read_u32_le(h + 8);
  if (version != kGoldenVersion)
    return where + "format version " + std::to_string(version) + ", this loader reads " +
           std::to_string(kGoldenVersion) + regen;
  const uint32_t header_bytes = read_u32_le(h + 12);
  if (header_bytes != kGoldenHeaderBytes)
    return where + "header_bytes " + std::to_string(header_bytes) + ", expected " +
           std::to_string(kGoldenHeaderBytes);
  if (!read_text(h + 16, 16, &out->dtype) || !read_text(h + 32, 16, &out->kind) ||
      !read_text(h + 48, 32, &out->oracle))
    return where + "malformed text field in the header (must be NUL-padded ASCII)";
  if (out->dtype != dtype)
    return where + "dtype '" + out->dtype + "', expected '" + std::string(dtype) + "'";
  if (out->kind != kind)
    return where + "kind '" + out->kind + "', expected '" + std::string(kind) + "'";
  out->count = read_u64_le(h + 80);
  const uint32_t in_bytes = read_u32_le(h + 88);
  const uint32_t out_bytes = read_u32_le(h + 92);

  // What each kind must carry.
  uint32_t want_in = 0, want_out = 1;
  uint64_t want_count = expected_count;
  if (kind == "decode") {
    want_out = 4;
  } else if (kind == "encode_bf16") {
    want_count = uint64_t{1} << 16;
  } else if (kind == "encode_f32") {
    want_in = 4;
  } else {
    return where + "unknown kind '" + std::string(kind) + "'";
  }
  if (in_bytes != want_in || out_bytes != want_out)
    return where + "element sizes in/out " + std::to_string(in_bytes) + "/" +
           std::to_string(out_bytes) + ", expected " + std::to_string(want_in) + "/" +
           std::to_string(want_out) + " for kind '" + out->kind + "'";
  if (out->count == 0 || out->count > kGoldenMaxCount)
    return where + "implausible count " + std::to_string(out->count);
  if (want_count != 0 && out->count != want_count)
    return where + "count " + std::to_string(out->count) + ", expected " +
           std::to_string(want_count);
  const uint64_t want_size = kGoldenHeaderBytes + out->count * (in_bytes + out_bytes);
  if (bytes.size() != want_size)
    return where + "file is " + std::to_string(bytes.size()) + " bytes, header says " +
           std::to_string(want_size) + (bytes.size() < want_size ? " (truncated)" : "") + regen;

  const unsigned char* in_p = h + kGoldenHeaderBytes;
  const unsigned char* out_p = in_p + out->count * in_bytes;
  out->inputs.resize(out->count);
  out->outputs.resize(out->count);
  for (uint64_t i = 0; i < out->count; ++i) {
    if (kind == "decode") {
      out->inputs[i] = static_cast<uint32_t>(i);
    } else if (kind == "encode_bf16") {
      out->inputs[i] = static_cast<uint32_t>(i) << 16;
    } else {
      out->inputs[i] = read_u32_le(in_p + 4 * i);
    }
    out->outputs[i] = out_bytes == 4 ? read_u32_le(out_p + 4 * i) : out_p[i];
  }
  return {};
}

// Reads `dtype`_`kind`.bin from tests/data/golden (see golden_load_file).
inline std::string golden_load(std::string_view dtype, std::string_view kind,
                               uint64_t expected_count, GoldenFile* out) {
  return golden_load_file(golden_path(dtype, kind), dtype, kind, expected_count, out);
}

}  // namespace lowbit::golden

// safetensors reader and atomic writer (include/lowbit/data/safetensors.h).
#include "lowbit/data/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_read.h"
#include "data/data_util.h"
#include "lowbit/core/error.h"

namespace lowbit::data {

namespace {

// Largest header accepted (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::string errno_text() { return std::strerror(errno); }

}  // namespace

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int safetensors_dtype_size(std::string_view name) {
  if (name == "F64" || name == "I64") return 8;
  if (name == "F32" || name == "I32") return 4;
  if (name == "F16" || name == "BF16") return 2;
  if (name == "F8_E4M3" || name == "F8_E5M2" || name == "U8" || name == "I8") return 1;
  return 0;
}

std::optional<DType> SafeTensor::lowbit_dtype() const {
  if (dtype == "F32") return DType::kF32;
  if (dtype == "F16") return DType::kF16;
  if (dtype == "BF16") return DType::kBF16;
  if (dtype == "F8_E4M3") return DType::kE4M3;
  if (dtype == "F8_E5M2") return DType::kE5M2;
  if (dtype == "U8") return DType::kU8;
  if (dtype == "I32") return DType::kI32;
  if (dtype == "I64") return DType::kI64;
  return std::nullopt;
}

std::string safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kE4M3: return "F8_E4M3";
    case DType::kUE4M3: return "F8_E4M3";
    case DType::kE5M2: return "F8_E5M2";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kE3M2:
    case DType::kE2M3:
    case DType::kE2M1:
    case DType::kE8M0:
    case DType::kU8: return "U8";
  }
  return "U8";
}

void check_safetensors_header_text(std::string_view header, const std::string& path) {
  // nlohmann's parser takes a NUL byte for the end of its input, so whatever follows one would
  // pass unread. JSON text has no raw NUL (not even inside strings): the header is damaged.
  // (Other trailing bytes are the parser's own error; it accepts JSON whitespace, as the
  // reference implementation's serde_json does.)
  const size_t nul = header.find('\0');
  LOWBIT_USER_CHECK(nul == std::string_view::npos,
                    "{}: the header holds a NUL byte at offset {}: only spaces may follow its "
                    "JSON text; the file is damaged or not a safetensors file",
                    path, nul);
}

void check_safetensors_spans(std::vector<SafeTensorsSpan>& spans, uint64_t buffer_size,
                             const std::string& path) {
  std::sort(spans.begin(), spans.end(), [](const SafeTensorsSpan& a, const SafeTensorsSpan& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const SafeTensorsSpan& s = spans[i];
    // (covered is 0 for the first span, so only a later one can fail this.)
    LOWBIT_USER_CHECK(s.begin >= covered, "{}: tensors '{}' and '{}' have overlapping data_offsets",
                      path, spans[i - 1].name, s.name);
    LOWBIT_USER_CHECK(s.begin == covered,
                      "{}: bytes {} to {} of the data buffer belong to no tensor (before '{}'); "
                      "the file is damaged",
                      path, covered, s.begin, s.name);
    covered = s.end;
  }
  LOWBIT_USER_CHECK(covered == buffer_size,
                    "{}: {} bytes after the last tensor belong to no tensor; the file is damaged",
                    path, buffer_size - covered);
}

SafeTensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  LOWBIT_USER_CHECK(!std::filesystem::is_directory(path, ec),
                    "{}: is a directory, not a safetensors file", path);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  LOWBIT_USER_CHECK(in.good(), "{}: cannot open the file: missing or unreadable ({})", path,
                    errno_text());
  const std::streamoff end = in.tellg();
  LOWBIT_USER_CHECK(end >= 0, "{}: cannot read the file (not a regular file?)", path);
  const uint64_t file_size = static_cast<uint64_t>(end);
  LOWBIT_USER_CHECK(file_size >= 8,
                    "{}: not a safetensors file: {} bytes is shorter than the 8-byte header "
                    "length (truncated?)",
                    path, file_size);
  in.seekg(0);
  uint8_t len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  LOWBIT_USER_CHECK(in.good(), "{}: cannot read the header length", path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  LOWBIT_USER_CHECK(header_len <= file_size - 8,
                    "{}: header length {} is beyond the file size of {} bytes (truncated or not "
                    "a safetensors file)",
                    path, header_len, file_size);
  LOWBIT_USER_CHECK(header_len <= kMaxHeaderBytes,
                    "{}: header length {} is beyond the limit of {} bytes", path, header_len,
                    kMaxHeaderBytes);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  LOWBIT_USER_CHECK(in.good(), "{}: cannot read the {}-byte header", path, header_len);

  check_safetensors_header_text(header, path);
  nlohmann::json j;
  try {
    j = parse_json_limited(header, path, /*unique_top_level_keys=*/true);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: the header is not valid JSON: {}", path, e.what()));
  }
  LOWBIT_USER_CHECK(j.is_object(), "{}: the header is not a JSON object", path);

  const uint64_t buffer_size = file_size - 8 - header_len;
  SafeTensorsFile f;
  std::vector<SafeTensorsSpan> spans;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      LOWBIT_USER_CHECK(v.is_object(), "{}: __metadata__ is not a JSON object", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        LOWBIT_USER_CHECK(m.value().is_string(), "{}: __metadata__ entry '{}' is not a string",
                          path, m.key());
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    LOWBIT_USER_CHECK(v.is_object(), "{}: tensor '{}': the entry is not a JSON object", path, name);
    LOWBIT_USER_CHECK(v.contains("dtype") && v["dtype"].is_string(),
                      "{}: tensor '{}': missing or non-string dtype", path, name);
    SafeTensor t;
    t.dtype = v["dtype"].get<std::string>();
    const int esize = safetensors_dtype_size(t.dtype);
    LOWBIT_USER_CHECK(esize > 0,
                      "{}: tensor '{}': unknown dtype '{}' (supported: F32 F16 BF16 F8_E4M3 "
                      "F8_E5M2 U8 I8 I32 I64 F64)",
                      path, name, t.dtype);
    LOWBIT_USER_CHECK(v.contains("shape") && v["shape"].is_array(),
                      "{}: tensor '{}': missing or non-array shape", path, name);
    // Element count with overflow checks (every dimension a non-negative integer).
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      LOWBIT_USER_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                        "{}: tensor '{}': shape {} has a dimension that is not a non-negative "
                        "integer",
                        path, name, v["shape"].dump());
      const uint64_t dim = d.get<uint64_t>();
      LOWBIT_USER_CHECK(dim == 0 || numel <= std::numeric_limits<int64_t>::max() / 8 / dim,
                        "{}: tensor '{}': shape {} is too large", path, name, v["shape"].dump());
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    LOWBIT_USER_CHECK(
        v.contains("data_offsets") && v["data_offsets"].is_array() &&
            v["data_offsets"].size() == 2 && v["data_offsets"][0].is_number_unsigned() &&
            v["data_offsets"][1].is_number_unsigned(),
        "{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    const uint64_t b = v["data_offsets"][0].get<uint64_t>();
    const uint64_t e = v["data_offsets"][1].get<uint64_t>();
    LOWBIT_USER_CHECK(b <= e,
                      "{}: tensor '{}': data_offsets [{}, {}] are out of range (begin > end)", path,
                      name, b, e);
    LOWBIT_USER_CHECK(e - b == numel * static_cast<uint64_t>(esize),
                      "{}: tensor '{}': data_offsets [{}, {}] span {} bytes, but shape {} of {} "
                      "needs {} bytes (shape and offsets are inconsistent)",
                      path, name, b, e, e - b, v["shape"].dump(), t.dtype,
                      numel * static_cast<uint64_t>(esize));
    LOWBIT_USER_CHECK(e <= buffer_size,
                      "{}: tensor '{}': data_offsets [{}, {}] are out of range: the data buffer "
                      "holds {} bytes (file truncated?)",
                      path, name, b, e, buffer_size);
    spans.push_back({b, e, name});
    f.tensors.emplace(name, std::move(t));
  }
  check_safetensors_spans(spans, buffer_size, path);
  for (const SafeTensorsSpan& s : spans) {
    SafeTensor& t = f.tensors.at(s.name);
    t.data.resize(s.end - s.begin);
    in.seekg(static_cast<std::streamoff>(8 + header_len + s.begin));
    in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    LOWBIT_USER_CHECK(in.good() || t.data.empty(),
                      "{}: tensor '{}': truncated data (read failed at byte {})", path, s.name,
                      8 + header_len + s.begin);
  }
  return f;
}

void write_safetensors(const std::string& path, const SafeTensorsFile& f) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!f.metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : f.metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : f.tensors) {
    const int esize = safetensors_dtype_size(t.dtype);
    LOWBIT_USER_CHECK(esize > 0, "{}: tensor '{}': unknown dtype '{}'", path, name, t.dtype);
    LOWBIT_USER_CHECK(static_cast<uint64_t>(t.numel()) * esize == t.data.size(),
                      "{}: tensor '{}': {} bytes of data do not match shape and dtype {}", path,
                      name, t.data.size(), t.dtype);
    header[name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  uint8_t len_bytes[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) len_bytes[i] = static_cast<uint8_t>(n & 0xFF);
  std::vector<detail::Piece> pieces;  // length, header, then every tensor's bytes
  pieces.reserve(2 + f.tensors.size());
  pieces.push_back({len_bytes, 8});
  pieces.push_back({text.data(), text.size()});
  for (const auto& [name, t] : f.tensors) pieces.push_back({t.data.data(), t.data.size()});
  detail::write_file_atomic(path, pieces.data(), pieces.size());
}

}  // namespace lowbit::data

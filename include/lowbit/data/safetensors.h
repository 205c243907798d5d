// safetensors files (https://github.com/huggingface/safetensors): read with full validation,
// write atomically.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON (an object mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end)} plus an optional
// "__metadata__" string map), then the byte buffer the offsets point into (little-endian,
// row-major).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/dtype.h"

namespace lowbit::data {

// One tensor: its safetensors dtype name ("F32", "BF16", "F8_E4M3", ...), shape and raw bytes.
struct SafeTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t numel() const;
  // The lowbit dtype of `dtype` where one exists (I8 and F64 have none).
  std::optional<DType> lowbit_dtype() const;
};

struct SafeTensorsFile {
  std::map<std::string, SafeTensor> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

// Bytes per element of a safetensors dtype name; 0 for a name that is not supported.
// Supported: F32, F16, BF16, F8_E4M3, F8_E5M2, U8, I8, I32, I64, F64.
int safetensors_dtype_size(std::string_view name);
// The safetensors name of a lowbit dtype stored as itself ("F8_E4M3" for e4m3, "U8" for the
// byte-sized formats without a safetensors name: e3m2, e2m3, e2m1 pairs, e8m0).
std::string safetensors_dtype_name(DType t);

// Reads and validates `path`. Every problem (missing or unreadable file, short file, header
// length beyond the file, header not a JSON object, unknown dtype, shape or offsets not
// matching the dtype size, offsets out of range or overlapping, truncated data) throws
// UserError naming the file and what is wrong.
SafeTensorsFile read_safetensors(const std::string& path);

// The header's JSON text may be followed only by the spaces that pad it; a NUL byte (where
// the JSON parser would stop reading) is a UserError naming `path`. (read_safetensors and the
// checkpoint reader both check their headers with it, before parsing.)
void check_safetensors_header_text(std::string_view header, const std::string& path);

// The data_offsets [begin, end) of a file's tensors: the format indexes its whole buffer, so they
// must tile [0, buffer_size) — no overlap, no bytes between tensors, none after the last one (a
// file with holes is damaged, or something else wearing a safetensors header). Sorts `spans`;
// a UserError naming `path` and the tensors otherwise. (read_safetensors and the checkpoint
// reader both check their headers with it.)
struct SafeTensorsSpan {
  uint64_t begin = 0, end = 0;
  std::string name;
};
void check_safetensors_spans(std::vector<SafeTensorsSpan>& spans, uint64_t buffer_size,
                             const std::string& path);

// Writes `f` to `path`: tensors in sorted-name order, header padded with spaces to a multiple
// of 8 bytes. The bytes go to a new temporary file `path.tmp-<pid>` (another name when that one
// exists), which is fsynced and renamed onto `path` (a replaced `path` keeps its permissions); on
// any failure the temporary file is removed and `path` is left as it was. Throws UserError.
void write_safetensors(const std::string& path, const SafeTensorsFile& f);

}  // namespace lowbit::data

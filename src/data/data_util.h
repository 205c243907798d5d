// Helpers shared by the data layer's sources: a 64-bit hash, little-endian byte packing, whole-file
// reads and atomic writes (temporary file + fsync + rename, like write_safetensors()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

namespace lowbit::data::detail {

// The finaliser of MurmurHash3 (a bijection of 64-bit words with full avalanche).
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

// A 64-bit hash of `n` bytes: each 8-byte little-endian word (the tail zero-padded) is folded in
// with mix64, then the length. Not cryptographic: it detects damage and mismatches.
uint64_t hash64(const void* data, size_t n, uint64_t seed = 0);
inline uint64_t hash64(std::string_view s, uint64_t seed = 0) {
  return hash64(s.data(), s.size(), seed);
}

inline void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
inline void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The message of the current errno.
std::string errno_text();

// The whole content of `path` (not decompressed). UserError naming the file when it cannot be read.
std::string read_file(const std::string& path);

// A byte range to write.
struct Piece {
  const void* data;
  size_t size;
};

// Writes the pieces, in order, to a new file `path.tmp-<pid>` (`path.tmp-<pid>-<n>` when that name
// is taken: an existing file or link there is never opened), fsyncs it and renames it onto `path`
// (then fsyncs the directory, best effort). A replaced `path` keeps its permission bits; a new one
// gets 0666 less the umask. On failure the temporary file is removed, `path` is left as it was,
// and UserError says what failed.
void write_file_atomic(const std::string& path, const Piece* pieces, size_t n_pieces);
inline void write_file_atomic(const std::string& path, std::string_view content) {
  const Piece p{content.data(), content.size()};
  write_file_atomic(path, &p, 1);
}

// Hash and equality that let an unordered_map<std::string, V> be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

// A pair of token ids (a BPE merge candidate) as one 64-bit key: left in the high half.
inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
inline int32_t key_left(uint64_t k) { return static_cast<int32_t>(k >> 32); }
inline int32_t key_right(uint64_t k) { return static_cast<int32_t>(k & 0xFFFFFFFFu); }

}  // namespace lowbit::data::detail

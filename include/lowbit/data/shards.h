// Token shards: a small binary file of token ids (plus an optional loss-mask stream), and the
// writer that cuts a token stream into shards with a manifest.
//
// Layout (little-endian, version 1):
//   offset size field
//        0    8 magic "LBTOKSHD"
//        8    4 u32 version = 1
//       12    4 u32 bytes per token: 2 (u16, vocabularies up to 65536) or 4 (u32)
//       16    8 u64 tokenizer fingerprint (Tokenizer::fingerprint(), or a synthetic source's)
//       24    4 u32 vocabulary size (every token is below it)
//       28    4 u32 flags: bit 0 = a mask stream follows the tokens; other bits zero
//       32    8 u64 token count N
//       40    8 u64 document count
//       48    8 u64 checksum of the token bytes (hash64)
//       56    8 u64 checksum of the mask bytes (0 without a mask)
//       64    8 u64 checksum of header bytes 0..63
//       72      tokens: N × (2 or 4) bytes; then, with a mask, N bytes of 0 / 1
// The file size must be exactly 72 + N·(bytes per token) + (mask ? N : 0).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace lowbit::data {

inline constexpr char kShardMagic[8] = {'L', 'B', 'T', 'O', 'K', 'S', 'H', 'D'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 72;

// Writes one shard atomically (temporary file + rename). `mask` is empty (no mask stream) or has
// one 0/1 byte per token. UserError for a token outside [0, vocab_size), a mask of the wrong
// length or with values other than 0 and 1, or a failed write.
void write_token_shard(const std::string& path, uint64_t fingerprint, int32_t vocab_size,
                       std::span<const int32_t> tokens, std::span<const uint8_t> mask = {},
                       int64_t documents = 0);

struct ShardOpenOptions {
  // Recompute the checksums and check every token against the vocabulary size (one pass over
  // the file).
  bool verify = true;
  // When set, a shard with another fingerprint is a UserError (written with another tokenizer).
  std::optional<uint64_t> expected_fingerprint;
};

// A read-only shard: memory-mapped from a file, or held in memory.
class TokenShard {
 public:
  // Opens and validates a shard. Every problem is a UserError naming the file and what is wrong:
  // missing file, shorter than the header, bad magic (not a token shard), unsupported version or
  // token size, unknown flags, header checksum mismatch (damaged header), size not matching the
  // header (truncated, or trailing bytes), payload checksum mismatch (damaged data), a token
  // beyond the vocabulary, a fingerprint other than the expected one.
  static std::shared_ptr<const TokenShard> open(const std::string& path,
                                                const ShardOpenOptions& options = {});
  // A shard held in memory (tests, synthetic data). `mask` empty or one 0/1 per token.
  static std::shared_ptr<const TokenShard> from_memory(std::vector<int32_t> tokens,
                                                       std::vector<uint8_t> mask,
                                                       uint64_t fingerprint, int32_t vocab_size,
                                                       int64_t documents = 0);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  int64_t size() const { return count_; }  // tokens
  uint64_t fingerprint() const { return fingerprint_; }
  int32_t vocab_size() const { return vocab_size_; }
  int64_t documents() const { return documents_; }
  bool has_mask() const { return mask_ != nullptr; }
  const std::string& path() const { return path_; }  // "<memory>" for an in-memory shard

  int32_t token(int64_t i) const;
  uint8_t mask(int64_t i) const { return mask_ ? mask_[i] : 1; }
  // Tokens [begin, begin + n) into out (as int32); the mask likewise (1s without a mask stream).
  void copy_tokens(int64_t begin, int64_t n, int32_t* out) const;
  void copy_mask(int64_t begin, int64_t n, uint8_t* out) const;

 private:
  TokenShard() = default;
  std::string path_;
  uint64_t fingerprint_ = 0;
  int32_t vocab_size_ = 0;
  int64_t count_ = 0;
  int64_t documents_ = 0;
  int token_bytes_ = 4;
  const uint8_t* tokens_ = nullptr;  // count_ × token_bytes_
  const uint8_t* mask_ = nullptr;    // count_ or null
  void* map_ = nullptr;              // the mapping of a file shard
  size_t map_bytes_ = 0;
  std::vector<int32_t> owned_tokens_;  // an in-memory shard's data
  std::vector<uint8_t> owned_mask_;
};

using ShardPtr = std::shared_ptr<const TokenShard>;

struct ShardInfo {
  std::string file;  // name inside the output directory
  int64_t tokens = 0;
  int64_t documents = 0;
  bool has_mask = false;
};

// Cuts a stream of tokens (and masks) into shards `<dir>/<prefix>_000000.lbt`, ... of at most
// shard_tokens tokens each. A shard gets a mask stream only when some token in it has mask 0.
// finish() writes the last shard and `<dir>/manifest.json`:
//   {"format": "lowbit-shards", "version": 1, "tokenizer_fingerprint": "<16 hex>",
//    "vocab_size": V, "total_tokens": N, "shards": [{"file", "tokens", "documents", "mask"}]}
class ShardWriter {
 public:
  // Creates `dir` if needed. UserError when it cannot, or for shard_tokens < 1.
  ShardWriter(std::string dir, std::string prefix, uint64_t fingerprint, int32_t vocab_size,
              int64_t shard_tokens);
  // Appends tokens; `mask` empty (all 1) or one per token. `documents` ended within them.
  void add(std::span<const int32_t> tokens, std::span<const uint8_t> mask = {},
           int64_t documents = 0);
  // Writes the pending shard and the manifest; returns the shards written.
  const std::vector<ShardInfo>& finish();
  const std::string& dir() const { return dir_; }

 private:
  void flush();
  std::string dir_, prefix_;
  uint64_t fingerprint_;
  int32_t vocab_size_;
  int64_t shard_tokens_;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> mask_;
  int64_t documents_ = 0;
  bool finished_ = false;
  std::vector<ShardInfo> shards_;
};

// Opens shards: each argument is a shard file or a directory with a manifest.json (its shards in
// manifest order). All shards must share a fingerprint and vocabulary size, and match
// `expected_fingerprint` when given: otherwise UserError saying which file differs (written with
// another tokenizer: re-tokenize the corpus, or load the tokenizer it was written with).
std::vector<ShardPtr> open_shards(std::span<const std::string> paths,
                                  std::optional<uint64_t> expected_fingerprint = std::nullopt,
                                  bool verify = true);

}  // namespace lowbit::data

// Token shards: writer, memory-mapped reader with validation, shard writer with manifest
// (include/lowbit/data/shards.h).
#include "lowbit/data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_read.h"
#include "data/data_util.h"
#include "lowbit/core/error.h"

namespace lowbit::data {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint32_t kFlagMask = 1u;
constexpr std::string_view kManifestName = "manifest.json";
constexpr std::string_view kManifestFormat = "lowbit-shards";

int token_bytes_for(int32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

std::string fingerprint_hex(uint64_t fp) { return fmt::format("{:016x}", fp); }

}  // namespace

void write_token_shard(const std::string& path, uint64_t fingerprint, int32_t vocab_size,
                       std::span<const int32_t> tokens, std::span<const uint8_t> mask,
                       int64_t documents) {
  LOWBIT_USER_CHECK(vocab_size > 0, "{}: cannot write a shard for a vocabulary of size {}", path,
                    vocab_size);
  LOWBIT_USER_CHECK(mask.empty() || mask.size() == tokens.size(),
                    "{}: the mask has {} entries for {} tokens (one per token, or none)", path,
                    mask.size(), tokens.size());
  const int tb = token_bytes_for(vocab_size);
  std::string payload;
  payload.resize(tokens.size() * tb);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    LOWBIT_USER_CHECK(t >= 0 && t < vocab_size,
                      "{}: token {} at position {} is outside the vocabulary [0, {})", path, t, i,
                      vocab_size);
    for (int b = 0; b < tb; ++b) {
      payload[i * tb + b] = static_cast<char>((static_cast<uint32_t>(t) >> (8 * b)) & 0xFF);
    }
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    LOWBIT_USER_CHECK(mask[i] <= 1, "{}: mask value {} at position {} is not 0 or 1", path, mask[i],
                      i);
  }
  std::string header;
  header.append(kShardMagic, 8);
  detail::put_u32(header, kShardVersion);
  detail::put_u32(header, static_cast<uint32_t>(tb));
  detail::put_u64(header, fingerprint);
  detail::put_u32(header, static_cast<uint32_t>(vocab_size));
  detail::put_u32(header, mask.empty() ? 0 : kFlagMask);
  detail::put_u64(header, tokens.size());
  detail::put_u64(header, static_cast<uint64_t>(std::max<int64_t>(documents, 0)));
  detail::put_u64(header, detail::hash64(payload));
  detail::put_u64(header, mask.empty() ? 0 : detail::hash64(mask.data(), mask.size()));
  detail::put_u64(header, detail::hash64(header));
  LOWBIT_CHECK(header.size() == kShardHeaderBytes, "header is {} bytes", header.size());
  const detail::Piece pieces[3] = {
      {header.data(), header.size()}, {payload.data(), payload.size()}, {mask.data(), mask.size()}};
  detail::write_file_atomic(path, pieces, 3);
}

// --- reading ---

std::shared_ptr<const TokenShard> TokenShard::open(const std::string& path,
                                                   const ShardOpenOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOWBIT_USER_CHECK(fd >= 0, "{}: cannot open the token shard: {}", path, detail::errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(fmt::format("{}: not a regular file", path));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kShardHeaderBytes) {
    ::close(fd);
    throw UserError(fmt::format(
        "{}: not a token shard, or truncated: {} bytes is shorter than the {}-byte header", path,
        file_size, kShardHeaderBytes));
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_err = detail::errno_text();
  ::close(fd);
  LOWBIT_USER_CHECK(map != MAP_FAILED, "{}: cannot map the file: {}", path, map_err);

  std::shared_ptr<TokenShard> s(new TokenShard());
  s->path_ = path;
  s->map_ = map;
  s->map_bytes_ = file_size;  // unmapped by the destructor from here on
  const auto* p = static_cast<const uint8_t*>(map);

  LOWBIT_USER_CHECK(std::memcmp(p, kShardMagic, 8) == 0,
                    "{}: not a lowbit token shard (bad magic: expected \"LBTOKSHD\"); pass the "
                    "shards written by the tokenize step, or their directory",
                    path);
  const uint32_t version = detail::get_u32(p + 8);
  LOWBIT_USER_CHECK(version == kShardVersion,
                    "{}: token shard version {} is not supported (this lowbit reads version {}); "
                    "re-tokenize the corpus",
                    path, version, kShardVersion);
  const uint64_t header_sum = detail::get_u64(p + 64);
  LOWBIT_USER_CHECK(detail::hash64(p, 64) == header_sum,
                    "{}: corrupt token shard: the header checksum does not match (damaged file); "
                    "re-tokenize the corpus",
                    path);
  const uint32_t tb = detail::get_u32(p + 12);
  LOWBIT_USER_CHECK(tb == 2 || tb == 4, "{}: corrupt token shard: {} bytes per token (2 or 4)",
                    path, tb);
  s->fingerprint_ = detail::get_u64(p + 16);
  const uint32_t vocab = detail::get_u32(p + 24);
  const uint32_t flags = detail::get_u32(p + 28);
  LOWBIT_USER_CHECK((flags & ~kFlagMask) == 0,
                    "{}: token shard has unknown flags 0x{:x} (written by a newer lowbit?)", path,
                    flags);
  LOWBIT_USER_CHECK(
      vocab > 0 && vocab <= static_cast<uint32_t>(INT32_MAX) && (tb == 4 || vocab <= 65536),
      "{}: corrupt token shard: vocabulary size {} with {}-byte tokens", path, vocab, tb);
  const uint64_t count = detail::get_u64(p + 32);
  const bool has_mask = flags & kFlagMask;
  const uint64_t per_token = tb + (has_mask ? 1 : 0);
  LOWBIT_USER_CHECK(count <= (file_size - kShardHeaderBytes) / per_token &&
                        kShardHeaderBytes + count * per_token == file_size,
                    "{}: truncated or damaged token shard: the header announces {} tokens{} ({} "
                    "bytes in all) but the file has {} bytes; re-tokenize the corpus",
                    path, count, has_mask ? " with a mask" : "",
                    count <= file_size ? kShardHeaderBytes + count * per_token : 0, file_size);
  s->vocab_size_ = static_cast<int32_t>(vocab);
  s->count_ = static_cast<int64_t>(count);
  s->documents_ = static_cast<int64_t>(detail::get_u64(p + 40));
  s->token_bytes_ = static_cast<int>(tb);
  s->tokens_ = p + kShardHeaderBytes;
  s->mask_ = has_mask ? s->tokens_ + count * tb : nullptr;

  if (options.expected_fingerprint && *options.expected_fingerprint != s->fingerprint_) {
    throw UserError(fmt::format(
        "{}: written with a different tokenizer (shard fingerprint {}, the loaded tokenizer's is "
        "{}): re-tokenize the corpus with this tokenizer, or load the tokenizer it was written "
        "with",
        path, fingerprint_hex(s->fingerprint_), fingerprint_hex(*options.expected_fingerprint)));
  }
  if (options.verify) {
    LOWBIT_USER_CHECK(detail::hash64(s->tokens_, count * tb) == detail::get_u64(p + 48),
                      "{}: corrupt token shard: the token checksum does not match (damaged file); "
                      "re-tokenize the corpus",
                      path);
    if (has_mask) {
      LOWBIT_USER_CHECK(detail::hash64(s->mask_, count) == detail::get_u64(p + 56),
                        "{}: corrupt token shard: the mask checksum does not match (damaged "
                        "file); re-tokenize the corpus",
                        path);
    }
    uint32_t max_token = 0;
    for (uint64_t i = 0; i < count; ++i) {
      max_token = std::max(max_token, static_cast<uint32_t>(s->token(static_cast<int64_t>(i))));
    }
    LOWBIT_USER_CHECK(count == 0 || max_token < vocab,
                      "{}: corrupt token shard: token {} is outside the vocabulary of {}", path,
                      max_token, vocab);
  }
  return s;
}

std::shared_ptr<const TokenShard> TokenShard::from_memory(std::vector<int32_t> tokens,
                                                          std::vector<uint8_t> mask,
                                                          uint64_t fingerprint, int32_t vocab_size,
                                                          int64_t documents) {
  LOWBIT_USER_CHECK(mask.empty() || mask.size() == tokens.size(),
                    "in-memory shard: the mask has {} entries for {} tokens", mask.size(),
                    tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    LOWBIT_USER_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size,
                      "in-memory shard: token {} at position {} is outside the vocabulary [0, {})",
                      tokens[i], i, vocab_size);
  }
  std::shared_ptr<TokenShard> s(new TokenShard());
  s->path_ = "<memory>";
  s->fingerprint_ = fingerprint;
  s->vocab_size_ = vocab_size;
  s->count_ = static_cast<int64_t>(tokens.size());
  s->documents_ = documents;
  s->token_bytes_ = 4;
  s->owned_tokens_ = std::move(tokens);
  s->owned_mask_ = std::move(mask);
  s->tokens_ = reinterpret_cast<const uint8_t*>(s->owned_tokens_.data());
  s->mask_ = s->owned_mask_.empty() ? nullptr : s->owned_mask_.data();
  return s;
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

int32_t TokenShard::token(int64_t i) const {
  if (token_bytes_ == 2) {
    const uint8_t* q = tokens_ + 2 * i;
    return static_cast<int32_t>(q[0] | (q[1] << 8));
  }
  if (!owned_tokens_.empty()) return owned_tokens_[i];
  return static_cast<int32_t>(detail::get_u32(tokens_ + 4 * i));
}

void TokenShard::copy_tokens(int64_t begin, int64_t n, int32_t* out) const {
  LOWBIT_CHECK(begin >= 0 && n >= 0 && begin + n <= count_, "range [{}, {}) of {} tokens", begin,
               begin + n, count_);
  if (!owned_tokens_.empty()) {
    std::memcpy(out, owned_tokens_.data() + begin, n * sizeof(int32_t));
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = token(begin + i);
}

void TokenShard::copy_mask(int64_t begin, int64_t n, uint8_t* out) const {
  LOWBIT_CHECK(begin >= 0 && n >= 0 && begin + n <= count_, "range [{}, {}) of {} tokens", begin,
               begin + n, count_);
  if (mask_ == nullptr) {
    std::memset(out, 1, n);
  } else {
    std::memcpy(out, mask_ + begin, n);
  }
}

// --- writer ---

ShardWriter::ShardWriter(std::string dir, std::string prefix, uint64_t fingerprint,
                         int32_t vocab_size, int64_t shard_tokens)
    : dir_(std::move(dir)),
      prefix_(std::move(prefix)),
      fingerprint_(fingerprint),
      vocab_size_(vocab_size),
      shard_tokens_(shard_tokens) {
  LOWBIT_USER_CHECK(shard_tokens >= 1, "tokens per shard must be at least 1 (got {})",
                    shard_tokens);
  LOWBIT_USER_CHECK(!dir_.empty(), "the output directory for token shards is empty");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  LOWBIT_USER_CHECK(!ec && fs::is_directory(dir_), "{}: cannot create the directory: {}", dir_,
                    ec ? ec.message() : "a file of that name exists");
}

void ShardWriter::add(std::span<const int32_t> tokens, std::span<const uint8_t> mask,
                      int64_t documents) {
  LOWBIT_CHECK(!finished_, "add after finish");
  LOWBIT_USER_CHECK(mask.empty() || mask.size() == tokens.size(),
                    "{}: the mask has {} entries for {} tokens", dir_, mask.size(), tokens.size());
  size_t pos = 0;
  while (pos < tokens.size()) {
    const size_t room = static_cast<size_t>(shard_tokens_) - tokens_.size();
    const size_t n = std::min(room, tokens.size() - pos);
    tokens_.insert(tokens_.end(), tokens.begin() + pos, tokens.begin() + pos + n);
    if (mask.empty()) {
      mask_.insert(mask_.end(), n, 1);
    } else {
      mask_.insert(mask_.end(), mask.begin() + pos, mask.begin() + pos + n);
    }
    pos += n;
    if (static_cast<int64_t>(tokens_.size()) == shard_tokens_) {
      if (pos == tokens.size()) documents_ += documents;  // they end in this shard
      flush();
      if (pos == tokens.size()) return;
    }
  }
  documents_ += documents;
}

void ShardWriter::flush() {
  if (tokens_.empty()) return;
  ShardInfo info;
  info.file = fmt::format("{}_{:06d}.lbt", prefix_, shards_.size());
  info.tokens = static_cast<int64_t>(tokens_.size());
  info.documents = documents_;
  info.has_mask = std::find(mask_.begin(), mask_.end(), 0) != mask_.end();
  write_token_shard((fs::path(dir_) / info.file).string(), fingerprint_, vocab_size_, tokens_,
                    info.has_mask ? std::span<const uint8_t>(mask_) : std::span<const uint8_t>(),
                    documents_);
  shards_.push_back(info);
  tokens_.clear();
  mask_.clear();
  documents_ = 0;
}

const std::vector<ShardInfo>& ShardWriter::finish() {
  if (finished_) return shards_;
  flush();
  finished_ = true;
  json manifest = json::object();
  manifest["format"] = kManifestFormat;
  manifest["version"] = kShardVersion;
  manifest["tokenizer_fingerprint"] = fingerprint_hex(fingerprint_);
  manifest["vocab_size"] = vocab_size_;
  int64_t total = 0;
  json list = json::array();
  for (const ShardInfo& s : shards_) {
    total += s.tokens;
    list.push_back(
        {{"file", s.file}, {"tokens", s.tokens}, {"documents", s.documents}, {"mask", s.has_mask}});
  }
  manifest["total_tokens"] = total;
  manifest["shards"] = list;
  detail::write_file_atomic((fs::path(dir_) / kManifestName).string(), manifest.dump(1) + "\n");
  return shards_;
}

// --- opening many ---

namespace {

std::vector<std::string> manifest_shards(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / kManifestName).string();
  LOWBIT_USER_CHECK(fs::exists(mpath),
                    "{}: a directory without {}: pass a directory written by the tokenize step, or "
                    "the shard files themselves",
                    dir, kManifestName);
  json j;
  try {
    j = parse_json_limited(detail::read_file(mpath), mpath);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: not valid JSON: {}", mpath, e.what()));
  }
  LOWBIT_USER_CHECK(json_string_or(j, "format", "") == kManifestFormat,
                    "{}: not a lowbit shard manifest (\"format\": \"{}\" expected)", mpath,
                    kManifestFormat);
  LOWBIT_USER_CHECK(j.contains("shards") && j["shards"].is_array(),
                    "{}: \"shards\" is missing or not an array", mpath);
  std::vector<std::string> out;
  for (const json& s : j["shards"]) {
    LOWBIT_USER_CHECK(s.is_object() && s.contains("file") && s["file"].is_string(),
                      "{}: shard entry {} has no \"file\"", mpath, s.dump());
    const std::string file = s["file"].get<std::string>();
    LOWBIT_USER_CHECK(file.find('/') == std::string::npos,
                      "{}: shard file '{}' must be a plain name inside the directory", mpath, file);
    out.push_back((fs::path(dir) / file).string());
  }
  LOWBIT_USER_CHECK(!out.empty(), "{}: the manifest lists no shards (empty corpus?)", mpath);
  return out;
}

}  // namespace

std::vector<ShardPtr> open_shards(std::span<const std::string> paths,
                                  std::optional<uint64_t> expected_fingerprint, bool verify) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      for (std::string& f : manifest_shards(p)) files.push_back(std::move(f));
    } else {
      files.push_back(p);
    }
  }
  LOWBIT_USER_CHECK(!files.empty(), "no token shards given");
  std::vector<ShardPtr> out;
  for (const std::string& f : files) {
    ShardOpenOptions o;
    o.verify = verify;
    o.expected_fingerprint = expected_fingerprint;
    out.push_back(TokenShard::open(f, o));
    const TokenShard& first = *out.front();
    const TokenShard& s = *out.back();
    LOWBIT_USER_CHECK(
        s.fingerprint() == first.fingerprint() && s.vocab_size() == first.vocab_size(),
        "{}: written with a different tokenizer than {} (fingerprint {} vocabulary "
        "{} vs {} vocabulary {}): tokenize all shards with one tokenizer",
        s.path(), first.path(), fingerprint_hex(s.fingerprint()), s.vocab_size(),
        fingerprint_hex(first.fingerprint()), first.vocab_size());
  }
  return out;
}

}  // namespace lowbit::data

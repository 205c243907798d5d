// Byte-level BPE tokenizer: validation, encoding, decoding, fingerprint, and the lowbit and Hugging
// Face JSON formats (include/lowbit/data/tokenizer.h).
#include "lowbit/data/tokenizer.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_read.h"
#include "data/data_util.h"
#include "data/pretokenize.h"
#include "lowbit/core/error.h"

namespace lowbit::data {

namespace {

using detail::pair_key;
using detail::StringEq;
using detail::StringHash;
using nlohmann::json;

// The regexes of the two pre-tokenizers, as Hugging Face tokenizer.json files spell them.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Entries of the pre-token cache beyond which new pre-tokens are encoded but not remembered.
constexpr size_t kMaxCacheEntries = 1 << 20;

// --- GPT-2's byte-to-character map ---

struct ByteLevelMap {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelMap() {
    bool printable[256] = {};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      byte_to_cp[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelMap& byte_level_map() {
  static const ByteLevelMap m;
  return m;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  const ByteLevelMap& m = byte_level_map();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, m.byte_to_cp[b]);
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  const ByteLevelMap& m = byte_level_map();
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = p[i];
    size_t len = 1;
    if (p[i] >= 0xC0 && p[i] < 0xE0 && i + 1 < text.size()) {
      cp = ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
      len = 2;
    } else if (p[i] >= 0x80) {
      return std::nullopt;  // the map only reaches U+0143: two bytes at most
    }
    const auto it = m.cp_to_byte.find(cp);
    if (it == m.cp_to_byte.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return out;
}

// --- the model ---

struct Tokenizer::Model {
  PreTokenizer pretokenizer = PreTokenizer::kGpt2;
  bool ignore_merges = false;
  std::vector<std::string> tokens;     // id -> bytes (special tokens: their content)
  std::vector<uint8_t> special;        // id -> 1 for special tokens
  std::vector<SpecialToken> specials;  // sorted by id
  std::vector<std::pair<int32_t, int32_t>> merges;
  int32_t byte_id[256] = {};
  // pair_key(left, right) -> (rank << 32) | result id
  std::unordered_map<uint64_t, uint64_t> merge_table;
  // bytes -> id of the non-special tokens
  std::unordered_map<std::string, int32_t, StringHash, StringEq> bytes_to_id;
  uint64_t fingerprint = 0;

  // The ids of one pre-token (appended to out).
  void encode_word(std::string_view w, std::vector<int32_t>& out) const;
};

struct Tokenizer::Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, StringEq> map;
};

void Tokenizer::Model::encode_word(std::string_view w, std::vector<int32_t>& out) const {
  if (w.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(w[0])]);
    return;
  }
  if (ignore_merges) {
    const auto it = bytes_to_id.find(w);
    if (it != bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols in a linked list over byte positions; a min-heap of candidate merges ordered by
  // (rank, position). A popped candidate is used only if its two symbols are still adjacent and
  // unchanged, so stale entries need no removal.
  const int n = static_cast<int>(w.size());
  std::vector<int32_t> sym(n), next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    sym[i] = byte_id[static_cast<unsigned char>(w[i])];
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    uint32_t rank;
    int32_t pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    const auto it = merge_table.find(pair_key(sym[pos], sym[next[pos]]));
    if (it != merge_table.end()) {
      heap.push({static_cast<uint32_t>(it->second >> 32), pos, sym[pos], sym[next[pos]]});
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int q = next[c.pos];
    if (sym[c.pos] != c.left || q < 0 || sym[q] != c.right) continue;
    sym[c.pos] = static_cast<int32_t>(merge_table.at(pair_key(c.left, c.right)) & 0xFFFFFFFFu);
    sym[q] = -1;
    next[c.pos] = next[q];
    if (next[q] >= 0) prev[next[q]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

Tokenizer Tokenizer::from_parts(std::vector<std::string> tokens,
                                std::vector<std::pair<int32_t, int32_t>> merges,
                                std::vector<SpecialToken> specials, PreTokenizer pretokenizer,
                                bool ignore_merges) {
  auto m = std::make_shared<Model>();
  m->pretokenizer = pretokenizer;
  m->ignore_merges = ignore_merges;
  const int64_t vocab = static_cast<int64_t>(tokens.size());
  LOWBIT_USER_CHECK(vocab >= 256 && vocab <= INT32_MAX,
                    "tokenizer: a vocabulary of {} tokens is invalid: a byte-level BPE vocabulary "
                    "has at least the 256 bytes",
                    vocab);
  m->special.assign(tokens.size(), 0);
  std::sort(specials.begin(), specials.end(),
            [](const SpecialToken& a, const SpecialToken& b) { return a.id < b.id; });
  for (const SpecialToken& s : specials) {
    LOWBIT_USER_CHECK(s.id >= 0 && s.id < vocab,
                      "tokenizer: special token '{}' has id {}, outside the vocabulary [0, {})",
                      s.content, s.id, vocab);
    LOWBIT_USER_CHECK(!s.content.empty(), "tokenizer: special token {} has empty content", s.id);
    LOWBIT_USER_CHECK(!m->special[s.id], "tokenizer: id {} is given to two special tokens", s.id);
    LOWBIT_USER_CHECK(tokens[s.id] == s.content,
                      "tokenizer: special token {} is '{}' but the vocabulary holds '{}' there",
                      s.id, s.content, tokens[s.id]);
    m->special[s.id] = 1;
  }
  for (size_t a = 0; a < specials.size(); ++a) {
    for (size_t b = a + 1; b < specials.size(); ++b) {
      LOWBIT_USER_CHECK(specials[a].content != specials[b].content,
                        "tokenizer: special token '{}' appears twice (ids {} and {})",
                        specials[a].content, specials[a].id, specials[b].id);
    }
  }
  m->specials = std::move(specials);
  m->bytes_to_id.reserve(tokens.size());
  for (int32_t id = 0; id < vocab; ++id) {
    if (m->special[id]) continue;
    LOWBIT_USER_CHECK(!tokens[id].empty(), "tokenizer: token {} is empty", id);
    const auto [it, inserted] = m->bytes_to_id.emplace(tokens[id], id);
    LOWBIT_USER_CHECK(inserted, "tokenizer: tokens {} and {} have the same bytes '{}'", it->second,
                      id, bytes_to_byte_level(tokens[id]));
  }
  for (const SpecialToken& s : m->specials) {
    const auto it = m->bytes_to_id.find(s.content);
    LOWBIT_USER_CHECK(it == m->bytes_to_id.end(),
                      "tokenizer: special token '{}' ({}) has the bytes of ordinary token {}",
                      s.content, s.id, it == m->bytes_to_id.end() ? -1 : it->second);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = m->bytes_to_id.find(std::string(1, static_cast<char>(b)));
    LOWBIT_USER_CHECK(it != m->bytes_to_id.end(),
                      "tokenizer: byte 0x{:02X} is not a token: a byte-level vocabulary needs all "
                      "256 bytes so that any text can be encoded",
                      b);
    m->byte_id[b] = it->second;
  }
  m->merge_table.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [l, rt] = merges[r];
    LOWBIT_USER_CHECK(l >= 0 && l < vocab && rt >= 0 && rt < vocab,
                      "tokenizer: merge {} ({}, {}) names an id outside the vocabulary [0, {})", r,
                      l, rt, vocab);
    LOWBIT_USER_CHECK(!m->special[l] && !m->special[rt],
                      "tokenizer: merge {} ({}, {}) involves a special token", r, l, rt);
    const std::string joined = tokens[l] + tokens[rt];
    const auto it = m->bytes_to_id.find(joined);
    LOWBIT_USER_CHECK(it != m->bytes_to_id.end(),
                      "tokenizer: merge {} ('{}', '{}') makes '{}', which is not in the vocabulary",
                      r, bytes_to_byte_level(tokens[l]), bytes_to_byte_level(tokens[rt]),
                      bytes_to_byte_level(joined));
    // The first (lowest-rank) merge of a pair wins, as in Hugging Face's BPE.
    m->merge_table.emplace(pair_key(l, rt),
                           (static_cast<uint64_t>(r) << 32) | static_cast<uint32_t>(it->second));
  }
  m->tokens = std::move(tokens);
  m->merges = std::move(merges);

  // Fingerprint: a hash of a canonical serialisation of everything that decides the output.
  std::string canon = "lowbit-bpe-fingerprint-v1";
  canon.push_back('\0');
  canon += pretokenizer_name(pretokenizer);
  canon.push_back('\0');
  canon.push_back(ignore_merges ? 1 : 0);
  detail::put_u32(canon, static_cast<uint32_t>(vocab));
  for (int32_t id = 0; id < vocab; ++id) {
    canon.push_back(static_cast<char>(m->special[id]));
    detail::put_u32(canon, static_cast<uint32_t>(m->tokens[id].size()));
    canon += m->tokens[id];
  }
  detail::put_u32(canon, static_cast<uint32_t>(m->merges.size()));
  for (const auto& [l, r] : m->merges) {
    detail::put_u32(canon, static_cast<uint32_t>(l));
    detail::put_u32(canon, static_cast<uint32_t>(r));
  }
  m->fingerprint = detail::hash64(canon);

  Tokenizer t;
  t.model_ = std::move(m);
  t.cache_ = std::make_shared<Cache>();
  return t;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(model_->tokens.size()); }
uint64_t Tokenizer::fingerprint() const { return model_->fingerprint; }
std::string Tokenizer::fingerprint_hex() const { return fmt::format("{:016x}", fingerprint()); }
PreTokenizer Tokenizer::pretokenizer() const { return model_->pretokenizer; }
bool Tokenizer::ignore_merges() const { return model_->ignore_merges; }
const std::vector<SpecialToken>& Tokenizer::special_tokens() const { return model_->specials; }
const std::vector<std::pair<int32_t, int32_t>>& Tokenizer::merges() const { return model_->merges; }

const std::string& Tokenizer::token_bytes(int32_t id) const {
  LOWBIT_USER_CHECK(id >= 0 && id < vocab_size(),
                    "token id {} is outside the tokenizer's vocabulary [0, {})", id, vocab_size());
  return model_->tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && model_->special[id];
}

std::optional<int32_t> Tokenizer::find_special(std::string_view content) const {
  for (const SpecialToken& s : model_->specials) {
    if (s.content == content) return s.id;
  }
  return std::nullopt;
}

int32_t Tokenizer::special_id(std::string_view content) const {
  if (auto id = find_special(content)) return *id;
  std::string have;
  for (const SpecialToken& s : model_->specials) have += (have.empty() ? "" : " ") + s.content;
  throw UserError(fmt::format(
      "the tokenizer has no special token {} (it has: {}); a tokenizer trained by lowbit "
      "reserves {} {} {} {}",
      content, have.empty() ? "none" : have, kEndOfText, kUserToken, kAssistantToken,
      kSystemToken));
}

int32_t Tokenizer::eot_id() const {
  for (std::string_view c :
       {kEndOfText, std::string_view("<|end_of_text|>"), std::string_view("</s>")}) {
    if (auto id = find_special(c)) return *id;
  }
  return special_id(kEndOfText);  // throws, listing what the tokenizer has
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out,
                              bool allow_special) const {
  const Model& m = *model_;
  auto encode_plain = [&](std::string_view piece) {
    if (piece.empty()) return;
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto& cache = cache_->map;
    detail::for_each_pretoken(piece, m.pretokenizer, [&](std::string_view w) {
      const auto it = cache.find(w);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
      const size_t before = out.size();
      m.encode_word(w, out);
      if (cache.size() < kMaxCacheEntries) {
        cache.emplace(std::string(w), std::vector<int32_t>(out.begin() + before, out.end()));
      }
    });
  };
  if (!allow_special || m.specials.empty()) {
    encode_plain(text);
    return;
  }
  // Split at the special tokens' contents: the earliest occurrence, the longest at a tie.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string_view::npos;
    const SpecialToken* best_tok = nullptr;
    for (const SpecialToken& s : m.specials) {
      const size_t f = text.find(s.content, pos);
      if (f == std::string_view::npos) continue;
      if (f < best || (f == best && s.content.size() > best_tok->content.size())) {
        best = f;
        best_tok = &s;
      }
    }
    if (best_tok == nullptr) {
      encode_plain(text.substr(pos));
      break;
    }
    encode_plain(text.substr(pos, best - pos));
    out.push_back(best_tok->id);
    pos = best + best_tok->content.size();
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_append(text, out, allow_special);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  const Model& m = *model_;
  const int32_t vocab = vocab_size();
  size_t n = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    LOWBIT_USER_CHECK(ids[i] >= 0 && ids[i] < vocab,
                      "decode: token {} (at position {}) is outside the tokenizer's vocabulary "
                      "[0, {}): the ids do not come from this tokenizer",
                      ids[i], i, vocab);
    n += m.tokens[ids[i]].size();
  }
  std::string out;
  out.reserve(n);
  for (int32_t id : ids) out += m.tokens[id];
  return out;
}

// --- lowbit's JSON format ---

namespace {

constexpr std::string_view kFormatName = "lowbit-bpe";
constexpr int kFormatVersion = 1;

std::string json_string(std::string_view s) { return json(std::string(s)).dump(); }

}  // namespace

void Tokenizer::save(const std::string& path) const {
  const Model& m = *model_;
  // One token and one merge per line: large but readable and diff-friendly.
  std::string out = "{\n";
  out += fmt::format("  \"format\": {},\n", json_string(kFormatName));
  out += fmt::format("  \"version\": {},\n", kFormatVersion);
  out += fmt::format("  \"pretokenizer\": {},\n", json_string(pretokenizer_name(m.pretokenizer)));
  out += fmt::format("  \"ignore_merges\": {},\n", m.ignore_merges ? "true" : "false");
  out += fmt::format("  \"vocab_size\": {},\n", vocab_size());
  out += fmt::format("  \"fingerprint\": \"{}\",\n", fingerprint_hex());
  out += "  \"special_tokens\": [";
  for (size_t i = 0; i < m.specials.size(); ++i) {
    out += fmt::format("{}\n    {{\"id\": {}, \"content\": {}}}", i ? "," : "", m.specials[i].id,
                       json_string(m.specials[i].content));
  }
  out += "\n  ],\n  \"tokens\": [";
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    out += id ? ",\n    " : "\n    ";
    out += m.special[id] ? "null" : json_string(bytes_to_byte_level(m.tokens[id]));
  }
  out += "\n  ],\n  \"merges\": [";
  for (size_t r = 0; r < m.merges.size(); ++r) {
    out +=
        fmt::format("{}[{}, {}]", r ? ",\n    " : "\n    ", m.merges[r].first, m.merges[r].second);
  }
  out += "\n  ]\n}\n";
  detail::write_file_atomic(path, out);
}

namespace {

Tokenizer load_lowbit(const std::string& path, const json& j) {
  LOWBIT_USER_CHECK(j.contains("version") && j["version"].is_number_integer(),
                    "{}: missing or non-integer \"version\"", path);
  const int version = j["version"].get<int>();
  LOWBIT_USER_CHECK(version == kFormatVersion,
                    "{}: tokenizer format version {} is not supported (this lowbit reads version "
                    "{}); re-create the tokenizer with this lowbit",
                    path, version, kFormatVersion);
  for (const char* key : {"pretokenizer", "tokens", "merges"}) {
    LOWBIT_USER_CHECK(j.contains(key), "{}: missing \"{}\"", path, key);
  }
  LOWBIT_USER_CHECK(j["pretokenizer"].is_string(), "{}: \"pretokenizer\" is not a string", path);
  PreTokenizer pre;
  try {
    pre = pretokenizer_from_name(j["pretokenizer"].get<std::string>());
  } catch (const UserError& e) {
    throw UserError(fmt::format("{}: {}", path, e.what()));
  }
  const bool ignore_merges = j.value("ignore_merges", false);
  LOWBIT_USER_CHECK(j["tokens"].is_array(), "{}: \"tokens\" is not an array", path);
  const json& jt = j["tokens"];
  std::vector<std::string> tokens(jt.size());
  std::vector<SpecialToken> specials;
  if (j.contains("special_tokens")) {
    LOWBIT_USER_CHECK(j["special_tokens"].is_array(), "{}: \"special_tokens\" is not an array",
                      path);
    for (const json& s : j["special_tokens"]) {
      LOWBIT_USER_CHECK(s.is_object() && s.contains("id") && s["id"].is_number_integer() &&
                            s.contains("content") && s["content"].is_string(),
                        "{}: special token {} needs an integer \"id\" and a string \"content\"",
                        path, s.dump());
      const int64_t id = s["id"].get<int64_t>();
      LOWBIT_USER_CHECK(id >= 0 && id < static_cast<int64_t>(tokens.size()),
                        "{}: special token {} has an id outside the {} tokens", path, s.dump(),
                        tokens.size());
      LOWBIT_USER_CHECK(jt[id].is_null(), "{}: special token {} must have null in \"tokens\"", path,
                        s.dump());
      specials.push_back({static_cast<int32_t>(id), s["content"].get<std::string>()});
      tokens[id] = specials.back().content;
    }
  }
  for (size_t id = 0; id < jt.size(); ++id) {
    if (jt[id].is_null()) {
      LOWBIT_USER_CHECK(
          std::any_of(specials.begin(), specials.end(),
                      [&](const SpecialToken& s) { return s.id == static_cast<int32_t>(id); }),
          "{}: token {} is null but is not a special token", path, id);
      continue;
    }
    LOWBIT_USER_CHECK(jt[id].is_string(), "{}: token {} is not a string", path, id);
    auto bytes = byte_level_to_bytes(jt[id].get<std::string>());
    LOWBIT_USER_CHECK(bytes.has_value(),
                      "{}: token {} ({}) is not a byte-level string (GPT-2's byte-to-character "
                      "map)",
                      path, id, jt[id].dump());
    tokens[id] = std::move(*bytes);
  }
  if (j.contains("vocab_size")) {
    LOWBIT_USER_CHECK(j["vocab_size"].is_number_integer() &&
                          j["vocab_size"].get<int64_t>() == static_cast<int64_t>(tokens.size()),
                      "{}: \"vocab_size\" {} does not match the {} tokens listed", path,
                      j["vocab_size"].dump(), tokens.size());
  }
  LOWBIT_USER_CHECK(j["merges"].is_array(), "{}: \"merges\" is not an array", path);
  std::vector<std::pair<int32_t, int32_t>> merges;
  merges.reserve(j["merges"].size());
  for (const json& mj : j["merges"]) {
    LOWBIT_USER_CHECK(
        mj.is_array() && mj.size() == 2 && mj[0].is_number_integer() && mj[1].is_number_integer(),
        "{}: merge {} is not a pair of token ids", path, mj.dump());
    merges.emplace_back(mj[0].get<int32_t>(), mj[1].get<int32_t>());
  }
  std::optional<Tokenizer> t;
  try {
    t = Tokenizer::from_parts(std::move(tokens), std::move(merges), std::move(specials), pre,
                              ignore_merges);
  } catch (const UserError& e) {
    throw UserError(fmt::format("{}: {}", path, e.what()));
  }
  if (j.contains("fingerprint")) {
    const std::string fp = j["fingerprint"].is_string() ? j["fingerprint"].get<std::string>() : "";
    LOWBIT_USER_CHECK(fp == t->fingerprint_hex(),
                      "{}: the recorded fingerprint {} does not match the content (computed {}): "
                      "the file was edited or damaged; re-create it, or delete the \"fingerprint\" "
                      "line to accept the content as it is",
                      path, j["fingerprint"].dump(), t->fingerprint_hex());
  }
  return *t;
}

// The pre-tokenizer of a Hugging Face tokenizer.json, or UserError.
PreTokenizer hf_pretokenizer(const std::string& path, const json& pt) {
  auto unsupported = [&](const std::string& why) {
    return UserError(fmt::format(
        "{}: pre_tokenizer {} is not supported ({}); lowbit reads byte-level BPE with the GPT-2 "
        "or LLaMA-3 split",
        path, pt.dump().substr(0, 300), why));
  };
  if (!pt.is_object() || !pt.contains("type")) throw unsupported("no type");
  const std::string type = pt["type"].get<std::string>();
  auto check_byte_level = [&](const json& b, bool regex_expected) {
    if (b.value("add_prefix_space", false)) throw unsupported("add_prefix_space is true");
    if (b.value("use_regex", true) != regex_expected) {
      throw unsupported(regex_expected ? "use_regex is false" : "use_regex is true after a Split");
    }
  };
  if (type == "ByteLevel") {
    check_byte_level(pt, true);
    return PreTokenizer::kGpt2;
  }
  if (type != "Sequence" || !pt.contains("pretokenizers") || !pt["pretokenizers"].is_array() ||
      pt["pretokenizers"].size() != 2) {
    throw unsupported("expected ByteLevel, or a Sequence of a Split and a ByteLevel");
  }
  const json& split = pt["pretokenizers"][0];
  const json& bl = pt["pretokenizers"][1];
  if (split.value("type", "") != "Split" || bl.value("type", "") != "ByteLevel") {
    throw unsupported("expected a Sequence of a Split and a ByteLevel");
  }
  check_byte_level(bl, false);
  if (split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
    throw unsupported("the Split must be Isolated and not inverted");
  }
  const json pat = split.value("pattern", json::object());
  const std::string regex = pat.is_object() ? pat.value("Regex", "") : "";
  if (regex == kGpt2Regex) return PreTokenizer::kGpt2;
  if (regex == kLlama3Regex) return PreTokenizer::kLlama3;
  throw unsupported("the Split regex is neither GPT-2's nor LLaMA-3's");
}

Tokenizer load_hf(const std::string& path, const json& j) {
  const json& model = j["model"];
  LOWBIT_USER_CHECK(model.is_object(), "{}: \"model\" is not an object", path);
  const std::string type = model.value("type", "BPE");
  LOWBIT_USER_CHECK(type == "BPE",
                    "{}: model type {} is not supported: lowbit reads byte-level BPE tokenizers",
                    path, type);
  LOWBIT_USER_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(),
                    "{}: normalizer {} is not supported (lowbit reads byte-level BPE without "
                    "normalization)",
                    path, j["normalizer"].dump().substr(0, 200));
  LOWBIT_USER_CHECK(!model.value("byte_fallback", false),
                    "{}: byte_fallback BPE (SentencePiece style) is not supported", path);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    LOWBIT_USER_CHECK(
        !model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(),
        "{}: model.{} is not supported in byte-level BPE", path, key);
  }
  LOWBIT_USER_CHECK(!model.contains("dropout") || model["dropout"].is_null() ||
                        model["dropout"].get<double>() == 0.0,
                    "{}: BPE dropout is not supported", path);
  LOWBIT_USER_CHECK(j.contains("pre_tokenizer"), "{}: missing \"pre_tokenizer\"", path);
  const PreTokenizer pre = hf_pretokenizer(path, j["pre_tokenizer"]);
  const bool ignore_merges = model.value("ignore_merges", false);

  LOWBIT_USER_CHECK(model.contains("vocab") && model["vocab"].is_object(),
                    "{}: model.vocab is missing or not an object", path);
  std::map<int64_t, std::string> by_id;  // id -> byte-level string or special content
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    LOWBIT_USER_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0,
                      "{}: vocab entry {} has no non-negative integer id", path, it.key());
    const auto [pos, inserted] = by_id.emplace(it.value().get<int64_t>(), it.key());
    LOWBIT_USER_CHECK(inserted, "{}: vocab entries {} and {} share id {}", path, pos->second,
                      it.key(), pos->first);
  }
  std::vector<SpecialToken> specials;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      LOWBIT_USER_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
                            a.contains("content") && a["content"].is_string(),
                        "{}: added token {} needs an integer \"id\" and a string \"content\"", path,
                        a.dump());
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      LOWBIT_USER_CHECK(id >= 0 && id < INT32_MAX, "{}: added token {} has a bad id", path,
                        a.dump());
      const auto it = by_id.find(id);
      LOWBIT_USER_CHECK(it == by_id.end() || it->second == content,
                        "{}: added token '{}' has id {}, which the vocabulary gives to '{}'", path,
                        content, id, it == by_id.end() ? "" : it->second);
      by_id[id] = content;
      specials.push_back({static_cast<int32_t>(id), content});
    }
  }
  LOWBIT_USER_CHECK(!by_id.empty(), "{}: the vocabulary is empty", path);
  const int64_t vocab = by_id.rbegin()->first + 1;
  LOWBIT_USER_CHECK(static_cast<int64_t>(by_id.size()) == vocab,
                    "{}: token ids are not contiguous: {} tokens with ids up to {} (lowbit needs "
                    "ids 0..N-1)",
                    path, by_id.size(), vocab - 1);
  std::vector<std::string> tokens(static_cast<size_t>(vocab));
  std::vector<uint8_t> is_special(static_cast<size_t>(vocab), 0);
  for (const SpecialToken& s : specials) is_special[s.id] = 1;
  std::unordered_map<std::string, int32_t> level_to_id;  // byte-level string -> id (non-special)
  for (const auto& [id, s] : by_id) {
    if (is_special[id]) {
      tokens[id] = s;
      continue;
    }
    auto bytes = byte_level_to_bytes(s);
    LOWBIT_USER_CHECK(bytes.has_value(),
                      "{}: vocab entry '{}' ({}) is not a byte-level string; only byte-level BPE "
                      "vocabularies are supported",
                      path, s, id);
    tokens[id] = std::move(*bytes);
    level_to_id[s] = static_cast<int32_t>(id);
  }
  LOWBIT_USER_CHECK(model.contains("merges") && model["merges"].is_array(),
                    "{}: model.merges is missing or not an array", path);
  std::vector<std::pair<int32_t, int32_t>> merges;
  merges.reserve(model["merges"].size());
  auto lookup = [&](const std::string& s, const json& entry) {
    const auto it = level_to_id.find(s);
    LOWBIT_USER_CHECK(it != level_to_id.end(), "{}: merge {} names '{}', which is not a token",
                      path, entry.dump(), s);
    return it->second;
  };
  for (const json& mj : model["merges"]) {
    std::string a, b;
    if (mj.is_string()) {
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      LOWBIT_USER_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                        "{}: merge {} is not two tokens separated by one space", path, mj.dump());
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      LOWBIT_USER_CHECK(mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string(),
                        "{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", path, mj.dump());
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    }
    merges.emplace_back(lookup(a, mj), lookup(b, mj));
  }
  try {
    return Tokenizer::from_parts(std::move(tokens), std::move(merges), std::move(specials), pre,
                                 ignore_merges);
  } catch (const UserError& e) {
    throw UserError(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  const std::string text = detail::read_file(path);
  json j;
  try {
    j = parse_json_limited(text, path);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: not a tokenizer file: the content is not valid JSON ({})",
                                path, e.what()));
  }
  LOWBIT_USER_CHECK(j.is_object(), "{}: not a tokenizer file: the JSON is not an object", path);
  try {
    if (j.contains("format") && j["format"] == kFormatName) return load_lowbit(path, j);
    if (j.contains("model")) return load_hf(path, j);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: malformed tokenizer file: {}", path, e.what()));
  }
  throw UserError(fmt::format(
      "{}: not a tokenizer file: expected lowbit's format (\"format\": \"lowbit-bpe\") or a "
      "Hugging Face tokenizer.json (with a \"model\")",
      path));
}

void Tokenizer::save_hf(const std::string& path) const {
  const Model& m = *model_;
  json added = json::array();
  for (const SpecialToken& s : m.specials) {
    added.push_back(json{{"id", s.id},
                         {"content", s.content},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
  }
  json pre;
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  if (m.pretokenizer == PreTokenizer::kGpt2) {
    pre = byte_level;
  } else {
    byte_level["use_regex"] = false;
    pre = {{"type", "Sequence"},
           {"pretokenizers", json::array({json{{"type", "Split"},
                                               {"pattern", {{"Regex", std::string(kLlama3Regex)}}},
                                               {"behavior", "Isolated"},
                                               {"invert", false}},
                                          byte_level})}};
  }
  json vocab = json::object();
  std::vector<std::string> level(m.tokens.size());
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    level[id] = m.special[id] ? m.tokens[id] : bytes_to_byte_level(m.tokens[id]);
    vocab[level[id]] = id;
  }
  json merges = json::array();
  for (const auto& [l, r] : m.merges) merges.push_back(level[l] + " " + level[r]);
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", m.ignore_merges},
                {"vocab", vocab},
                {"merges", merges}};
  json root = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", added},
               {"normalizer", nullptr},
               {"pre_tokenizer", pre},
               {"post_processor", nullptr},
               {"decoder",
                {{"type", "ByteLevel"},
                 {"add_prefix_space", true},
                 {"trim_offsets", true},
                 {"use_regex", true}}},
               {"model", model}};
  detail::write_file_atomic(path, root.dump(2) + "\n");
}

}  // namespace lowbit::data

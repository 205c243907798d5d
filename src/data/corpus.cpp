// Corpora: compressed reading (liblzma, zlib), documents of text and JSONL files, the SFT chat
// template, and corpus → shards (include/lowbit/data/corpus.h).
#include "lowbit/data/corpus.h"

#include <lzma.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

constexpr size_t kInBufBytes = 1 << 16;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

// --- ByteReader ---

struct ByteReader::Impl {
  std::string path;
  std::FILE* f = nullptr;
  Compression comp = Compression::kNone;
  std::vector<uint8_t> in;
  lzma_stream xz = LZMA_STREAM_INIT;
  z_stream gz{};
  bool gz_inited = false;
  bool input_eof = false;
  bool done = false;

  ~Impl() {
    if (comp == Compression::kXz) lzma_end(&xz);
    if (gz_inited) inflateEnd(&gz);
    if (f != nullptr) std::fclose(f);
  }

  // Refills `in` when empty; returns the bytes available.
  size_t fill(const uint8_t*& next, size_t& avail) {
    if (avail == 0 && !input_eof) {
      const size_t r = std::fread(in.data(), 1, in.size(), f);
      if (r < in.size()) {
        LOWBIT_USER_CHECK(!std::ferror(f), "{}: reading the file failed: {}", path,
                          detail::errno_text());
        input_eof = true;
      }
      next = in.data();
      avail = r;
    }
    return avail;
  }

  size_t read(char* buf, size_t n) {
    if (done || n == 0) return 0;
    if (comp == Compression::kNone) {
      const size_t r = std::fread(buf, 1, n, f);
      if (r < n) {
        LOWBIT_USER_CHECK(!std::ferror(f), "{}: reading the file failed: {}", path,
                          detail::errno_text());
        if (r == 0) done = true;
      }
      return r;
    }
    if (comp == Compression::kXz) {
      xz.next_out = reinterpret_cast<uint8_t*>(buf);
      xz.avail_out = n;
      while (xz.avail_out == n) {
        fill(xz.next_in, xz.avail_in);
        const lzma_ret ret = lzma_code(&xz, input_eof ? LZMA_FINISH : LZMA_RUN);
        if (ret == LZMA_STREAM_END) {
          done = true;
          break;
        }
        if (ret == LZMA_OK) continue;
        if (ret == LZMA_BUF_ERROR) {
          throw UserError(fmt::format(
              "{}: truncated xz data: the file ends inside the compressed stream", path));
        }
        throw UserError(fmt::format("{}: corrupt xz data (liblzma error {}: {})", path,
                                    static_cast<int>(ret),
                                    ret == LZMA_DATA_ERROR     ? "data error"
                                    : ret == LZMA_FORMAT_ERROR ? "not xz"
                                    : ret == LZMA_MEM_ERROR    ? "out of memory"
                                                               : "decoder error"));
      }
      return n - xz.avail_out;
    }
    // gzip (possibly several members, as `cat a.gz b.gz` makes)
    gz.next_out = reinterpret_cast<Bytef*>(buf);
    gz.avail_out = static_cast<uInt>(std::min<size_t>(n, UINT32_MAX));
    const uInt want = gz.avail_out;
    while (gz.avail_out == want) {
      const uint8_t* next = gz.next_in;
      size_t avail = gz.avail_in;
      fill(next, avail);
      gz.next_in = const_cast<Bytef*>(next);
      gz.avail_in = static_cast<uInt>(avail);
      if (gz.avail_in == 0 && input_eof && gz_between_members) {
        done = true;
        break;
      }
      const int ret = inflate(&gz, Z_NO_FLUSH);
      if (ret == Z_STREAM_END) {
        gz_between_members = true;
        inflateReset(&gz);
      } else if (ret == Z_OK) {
        gz_between_members = false;
      } else if (ret == Z_BUF_ERROR && gz.avail_in == 0 && input_eof) {
        throw UserError(fmt::format(
            "{}: truncated gzip data: the file ends inside the compressed stream", path));
      } else if (ret != Z_BUF_ERROR) {
        throw UserError(fmt::format("{}: corrupt gzip data (zlib: {})", path,
                                    gz.msg != nullptr ? gz.msg : "error"));
      }
    }
    return want - gz.avail_out;
  }
  bool gz_between_members = false;
};

Compression detect_compression(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  LOWBIT_USER_CHECK(f != nullptr, "{}: cannot open the file: {}", path, detail::errno_text());
  uint8_t head[6] = {};
  const size_t r = std::fread(head, 1, 6, f);
  std::fclose(f);
  static constexpr uint8_t kXz[6] = {0xFD, '7', 'z', 'X', 'Z', 0x00};
  if (r == 6 && std::memcmp(head, kXz, 6) == 0) return Compression::kXz;
  if (r >= 2 && head[0] == 0x1F && head[1] == 0x8B) return Compression::kGzip;
  return Compression::kNone;
}

ByteReader::ByteReader(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  Impl& m = *impl_;
  m.path = path;
  LOWBIT_USER_CHECK(!fs::is_directory(path), "{}: is a directory, not a file", path);
  m.comp = detect_compression(path);
  m.f = std::fopen(path.c_str(), "rb");
  LOWBIT_USER_CHECK(m.f != nullptr, "{}: cannot open the file: {}", path, detail::errno_text());
  if (m.comp == Compression::kNone) return;
  m.in.resize(kInBufBytes);
  if (m.comp == Compression::kXz) {
    const lzma_ret ret = lzma_stream_decoder(&m.xz, UINT64_MAX, LZMA_CONCATENATED);
    LOWBIT_USER_CHECK(ret == LZMA_OK, "{}: cannot start the xz decoder (liblzma error {})", path,
                      static_cast<int>(ret));
  } else {
    // 15 + 32: the largest window, with automatic gzip / zlib header detection.
    LOWBIT_USER_CHECK(inflateInit2(&m.gz, 15 + 32) == Z_OK, "{}: cannot start the gzip decoder",
                      path);
    m.gz_inited = true;
  }
}

ByteReader::~ByteReader() = default;

Compression ByteReader::compression() const { return impl_->comp; }

size_t ByteReader::read(char* buf, size_t n) {
  if (pending_pos_ < pending_.size()) {
    const size_t k = std::min(n, pending_.size() - pending_pos_);
    std::memcpy(buf, pending_.data() + pending_pos_, k);
    pending_pos_ += k;
    return k;
  }
  return impl_->read(buf, n);
}

bool ByteReader::read_line(std::string& line) {
  line.clear();
  bool any = false;
  for (;;) {
    if (pending_pos_ >= pending_.size()) {
      pending_.resize(kInBufBytes);
      const size_t r = impl_->read(pending_.data(), pending_.size());
      pending_.resize(r);
      pending_pos_ = 0;
      if (r == 0) return any;
    }
    any = true;
    const char* start = pending_.data() + pending_pos_;
    const size_t avail = pending_.size() - pending_pos_;
    const void* nl = std::memchr(start, '\n', avail);
    if (nl != nullptr) {
      const size_t k = static_cast<const char*>(nl) - start;
      line.append(start, k);
      pending_pos_ += k + 1;
      return true;
    }
    line.append(start, avail);
    pending_pos_ = pending_.size();
  }
}

std::string read_text_file(const std::string& path) {
  ByteReader r(path);
  std::string out;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const size_t n = r.read(buf.data(), buf.size());
    if (n == 0) break;
    out.append(buf.data(), n);
  }
  return out;
}

std::string default_corpus_path() {
  const std::string name = "kjv.txt.xz";
  std::vector<fs::path> tried;
  if (const char* env = std::getenv("LOWBIT_DATA_DIR"); env != nullptr && *env != '\0') {
    tried.push_back(fs::path(env) / name);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // data/ beside the binary, or in a directory above it (build-*/lowbit → repo/data).
    for (fs::path d = exe.parent_path(); !d.empty(); d = d.parent_path()) {
      tried.push_back(d / "data" / name);
      if (d == d.root_path()) break;
    }
  }
  tried.push_back(fs::path("data") / name);
  for (const fs::path& p : tried) {
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  std::string list;
  for (const fs::path& p : tried) list += "\n  " + p.string();
  throw UserError(fmt::format(
      "the bundled corpus {} was not found; looked in:{}\nset LOWBIT_DATA_DIR to the repository's "
      "data/ directory (tools/make_kjv_corpus.sh re-creates the file)",
      name, list));
}

// --- documents ---

namespace {

bool is_jsonl(const std::string& path) {
  return ends_with(path, ".jsonl") || ends_with(path, ".jsonl.xz") || ends_with(path, ".jsonl.gz");
}

std::vector<ChatMessage> parse_record_chat(const std::string& where, const json& rec) {
  std::vector<ChatMessage> msgs;
  if (rec.contains("messages")) {
    const json& m = rec["messages"];
    LOWBIT_USER_CHECK(m.is_array() && !m.empty(), "{}: \"messages\" must be a non-empty array",
                      where);
    for (const json& x : m) {
      LOWBIT_USER_CHECK(x.is_object() && x.contains("role") && x["role"].is_string() &&
                            x.contains("content") && x["content"].is_string(),
                        "{}: each message needs a string \"role\" and a string \"content\" (got "
                        "{})",
                        where, x.dump().substr(0, 200));
      msgs.push_back({x["role"].get<std::string>(), x["content"].get<std::string>()});
    }
    return msgs;
  }
  LOWBIT_USER_CHECK(
      rec["prompt"].is_string() && rec.contains("response") && rec["response"].is_string(),
      "{}: an SFT record needs string \"prompt\" and \"response\" fields", where);
  msgs.push_back({"user", rec["prompt"].get<std::string>()});
  msgs.push_back({"assistant", rec["response"].get<std::string>()});
  return msgs;
}

void read_plain(const std::string& path, DocumentSink& sink, size_t piece_bytes) {
  ByteReader r(path);
  std::string buf;
  std::vector<char> chunk(std::max<size_t>(piece_bytes, 1 << 12));
  bool eof = false;
  while (!eof || !buf.empty()) {
    while (!eof && buf.size() < piece_bytes * 2) {
      const size_t n = r.read(chunk.data(), chunk.size());
      if (n == 0) eof = true;
      buf.append(chunk.data(), n);
    }
    // Emit up to a safe cut at or after piece_bytes (everything once the file has ended).
    const size_t cut = eof ? buf.size() : pretoken_safe_split(buf, piece_bytes);
    if (cut == buf.size() && !eof) {
      // No safe point in twice the piece size (no letter followed by punctuation): read on.
      const size_t n = r.read(chunk.data(), chunk.size());
      if (n == 0) eof = true;
      buf.append(chunk.data(), n);
      continue;
    }
    sink.text(std::string_view(buf).substr(0, cut));
    buf.erase(0, cut);
  }
  sink.end_document();
}

void read_jsonl(const std::string& path, DocumentSink& sink) {
  ByteReader r(path);
  std::string line;
  int64_t line_no = 0;
  while (r.read_line(line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line_no);
    json rec;
    try {
      rec = parse_json_limited(line, where);
    } catch (const json::exception& e) {
      throw UserError(fmt::format("{}: not valid JSON ({})", where, e.what()));
    }
    LOWBIT_USER_CHECK(rec.is_object(), "{}: a JSONL record must be a JSON object", where);
    if (rec.contains("messages") || rec.contains("prompt")) {
      const std::vector<ChatMessage> msgs = parse_record_chat(where, rec);
      for (const ChatMessage& m : msgs) {
        LOWBIT_USER_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
                          "{}: unknown role '{}' (roles: system, user, assistant)", where, m.role);
      }
      sink.chat(msgs);
    } else {
      LOWBIT_USER_CHECK(rec.contains("text"),
                        "{}: the record has none of \"text\", \"prompt\"/\"response\", "
                        "\"messages\"",
                        where);
      LOWBIT_USER_CHECK(rec["text"].is_string(), "{}: \"text\" is not a string", where);
      sink.text(rec["text"].get_ref<const std::string&>());
    }
    sink.end_document();
  }
}

}  // namespace

void read_documents(const std::string& path, DocumentSink& sink, size_t piece_bytes) {
  if (is_jsonl(path)) {
    read_jsonl(path, sink);
  } else {
    read_plain(path, sink, std::max<size_t>(piece_bytes, 1));
  }
}

void add_files_to_trainer(BpeTrainer& trainer, std::span<const std::string> paths) {
  struct Sink : DocumentSink {
    BpeTrainer* t;
    void text(std::string_view piece) override { t->add_text(piece); }
    void chat(std::span<const ChatMessage> messages) override {
      for (const ChatMessage& m : messages) t->add_text(m.content);
    }
    void end_document() override {}
  } sink;
  sink.t = &trainer;
  for (const std::string& p : paths) read_documents(p, sink);
}

// --- tokenizing ---

TokensWithMask tokenize_chat(const Tokenizer& tok, std::span<const ChatMessage> messages,
                             bool add_generation_prompt) {
  LOWBIT_USER_CHECK(!messages.empty(), "an SFT conversation needs at least one message");
  const int32_t eot = tok.special_id(kEndOfText);
  TokensWithMask out;
  auto push = [&](int32_t id, uint8_t m) {
    out.tokens.push_back(id);
    out.mask.push_back(m);
  };
  for (const ChatMessage& msg : messages) {
    std::string_view role_token;
    if (msg.role == "system") {
      role_token = kSystemToken;
    } else if (msg.role == "user") {
      role_token = kUserToken;
    } else if (msg.role == "assistant") {
      role_token = kAssistantToken;
    } else {
      throw UserError(
          fmt::format("unknown chat role '{}' (roles: system, user, assistant)", msg.role));
    }
    push(tok.special_id(role_token), 0);
    tok.encode_append(msg.content, out.tokens);
    out.mask.resize(out.tokens.size(), msg.role == "assistant" ? 1 : 0);
    if (msg.role == "assistant") push(eot, 1);
  }
  if (add_generation_prompt) {
    push(tok.special_id(kAssistantToken), 0);
  } else if (messages.back().role != "assistant") {
    push(eot, 0);
  }
  return out;
}

void tokenize_documents(const Tokenizer& tok, const std::string& path, const TokenRunFn& emit) {
  struct Sink : DocumentSink {
    const Tokenizer* tok;
    const TokenRunFn* emit;
    std::vector<int32_t> ids;
    bool in_chat = false;
    void text(std::string_view piece) override {
      ids.clear();
      tok->encode_append(piece, ids);
      (*emit)(ids, {}, 0, false, static_cast<int64_t>(piece.size()));
    }
    void chat(std::span<const ChatMessage> messages) override {
      int64_t bytes = 0;
      for (const ChatMessage& m : messages) bytes += static_cast<int64_t>(m.content.size());
      const TokensWithMask tm = tokenize_chat(*tok, messages);
      (*emit)(tm.tokens, tm.mask, 1, true, bytes);
      in_chat = true;
    }
    void end_document() override {
      if (in_chat) {  // a chat record ends with its own <|endoftext|>
        in_chat = false;
        return;
      }
      const int32_t sep = tok->eot_id();
      (*emit)(std::span<const int32_t>(&sep, 1), {}, 1, false, 0);
    }
  } sink;
  sink.tok = &tok;
  sink.emit = &emit;
  read_documents(path, sink);
}

CorpusStats tokenize_corpus(const Tokenizer& tok, const CorpusOptions& options) {
  LOWBIT_USER_CHECK(!options.inputs.empty(), "no input files to tokenize");
  for (const std::string& p : options.inputs) {
    LOWBIT_USER_CHECK(fs::is_regular_file(p), "{}: input file not found (or not a regular file)",
                      p);
  }
  ShardWriter writer(options.output_dir, options.shard_prefix, tok.fingerprint(), tok.vocab_size(),
                     options.shard_tokens);
  CorpusStats stats;
  const TokenRunFn emit = [&](std::span<const int32_t> ids, std::span<const uint8_t> mask,
                              int documents_ended, bool chat, int64_t input_bytes) {
    writer.add(ids, mask, documents_ended);
    stats.input_bytes += input_bytes;
    stats.tokens += static_cast<int64_t>(ids.size());
    stats.masked_tokens += mask.empty() ? static_cast<int64_t>(ids.size())
                                        : std::count(mask.begin(), mask.end(), uint8_t{1});
    if (chat) {
      ++stats.chat_records;
    } else if (documents_ended > 0) {
      ++stats.documents;
    }
  };
  for (const std::string& p : options.inputs) tokenize_documents(tok, p, emit);
  stats.shards = writer.finish();
  return stats;
}

}  // namespace lowbit::data

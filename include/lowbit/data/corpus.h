// Corpora: reading text and JSONL files (plain, xz- or gzip-compressed), SFT chat records and
// their loss masks, and turning a corpus into token shards (shards.h).
//
// Input files:
//  * plain text (any name not ending in .jsonl / .jsonl.xz / .jsonl.gz): the whole file is one
//    document;
//  * JSONL: one JSON object per line (empty lines skipped), each a document:
//      {"text": "..."}                                          plain text
//      {"prompt": "...", "response": "..."}                     one SFT exchange
//      {"messages": [{"role": "user", "content": "..."}, ...]}  an SFT conversation
//    (roles: system, user, assistant).
// Compression is recognised by the file's first bytes (xz or gzip), not its name.
//
// Documents are separated by <|endoftext|>. SFT records are written with this template, where the
// mask marks the tokens the model is trained to predict (1) and the rest (0):
//    <|system|> content                       mask 0
//    <|user|> content                         mask 0
//    <|assistant|>                            mask 0
//    content <|endoftext|>                    mask 1  (the assistant's answer and its end)
// repeated per message, and a final <|endoftext|> (mask 0) when the last message is not the
// assistant's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/data/shards.h"
#include "lowbit/data/tokenizer.h"

namespace lowbit::data {

// --- reading files ------------------------------------------------------------------------------

enum class Compression { kNone, kXz, kGzip };

// The compression of a file, from its first bytes (xz: FD 37 7A 58 5A 00, gzip: 1F 8B).
// UserError when the file cannot be read.
Compression detect_compression(const std::string& path);

// A file's bytes, decompressed on the fly. Every failure (missing file, corrupt or truncated
// compressed data) is a UserError naming the file.
class ByteReader {
 public:
  explicit ByteReader(const std::string& path);
  ~ByteReader();
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  // Up to n bytes into buf; 0 at the end of the data.
  size_t read(char* buf, size_t n);
  // The next line without its '\n' (a final line without '\n' counts); false at the end.
  bool read_line(std::string& line);
  const std::string& path() const { return path_; }
  Compression compression() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::string pending_;  // bytes read ahead by read_line
  size_t pending_pos_ = 0;
};

// The whole decompressed content of a file.
std::string read_text_file(const std::string& path);

// The bundled corpus, data/kjv.txt.xz: found through $LOWBIT_DATA_DIR, then data/ beside or above
// the running binary (a build directory is inside the repository), then ./data. UserError listing
// the places tried when it is in none of them.
std::string default_corpus_path();

// --- documents ----------------------------------------------------------------------------------

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Receives the documents of a corpus file, in order.
class DocumentSink {
 public:
  virtual ~DocumentSink() = default;
  // A piece of the current plain-text document. A large document arrives in several pieces, cut
  // at pretoken_safe_split() points, so that pieces tokenize exactly as the whole.
  virtual void text(std::string_view piece) = 0;
  // A whole SFT record.
  virtual void chat(std::span<const ChatMessage> messages) = 0;
  // The end of the current document (after its pieces or its record).
  virtual void end_document() = 0;
};

// Reads the documents of one file (format by name: .jsonl, .jsonl.xz or .jsonl.gz is JSONL, any
// other is plain text). JSONL problems (a line that is not a JSON object, a record with none of
// the known fields, a message without a known role or string content) are UserErrors naming the
// file and line. `piece_bytes` is the size at which plain text is cut into pieces.
void read_documents(const std::string& path, DocumentSink& sink, size_t piece_bytes = 1 << 20);

// Adds every document of the files to a BPE trainer (SFT records: their contents).
void add_files_to_trainer(BpeTrainer& trainer, std::span<const std::string> paths);

// --- tokenizing
// -----------------------------------------------------------------------------------

struct TokensWithMask {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // one per token: 1 = trained on
};

// The tokens and mask of an SFT conversation (template above). With add_generation_prompt the
// sequence ends with <|assistant|> instead, ready for generation. UserError for an empty
// conversation, an unknown role, or a tokenizer without the special tokens.
TokensWithMask tokenize_chat(const Tokenizer& tok, std::span<const ChatMessage> messages,
                             bool add_generation_prompt = false);

// The tokens of one corpus file as training tokenizes it, in order: each plain-text piece
// (every token carries loss), each SFT record through tokenize_chat (its own mask, ending with
// its <|endoftext|>), and the <|endoftext|> that ends each plain-text document. `emit` receives
// every run with its mask (empty: all 1), the documents it ends (0 or 1), whether it is an SFT
// record, and the input bytes it came from. tokenize_corpus writes the runs into shards;
// `lowbit eval` scores them.
using TokenRunFn =
    std::function<void(std::span<const int32_t> tokens, std::span<const uint8_t> mask,
                       int documents_ended, bool chat, int64_t input_bytes)>;
void tokenize_documents(const Tokenizer& tok, const std::string& path, const TokenRunFn& emit);

struct CorpusOptions {
  std::vector<std::string> inputs;  // files (see above)
  std::string output_dir;           // created if missing
  std::string shard_prefix = "shard";
  int64_t shard_tokens = int64_t{1} << 24;  // tokens per shard at most (32 MB as u16)
};

struct CorpusStats {
  int64_t documents = 0;      // plain-text documents
  int64_t chat_records = 0;   // SFT records
  int64_t input_bytes = 0;    // decompressed bytes read
  int64_t tokens = 0;         // tokens written
  int64_t masked_tokens = 0;  // tokens with mask 1 (all tokens when there is no SFT data)
  std::vector<ShardInfo> shards;
};

// Tokenizes the input files in order into shards in output_dir, plus its manifest.json (see
// ShardWriter). A mask stream is written when the corpus has SFT records.
CorpusStats tokenize_corpus(const Tokenizer& tok, const CorpusOptions& options);

}  // namespace lowbit::data

// Byte-level BPE tokenizer: training, encoding, decoding, and two file formats (lowbit's own JSON
// and Hugging Face `tokenizer.json` of type BPE with a ByteLevel pre-tokenizer).
//
// Text is first split into pre-tokens by a hand-written equivalent of a GPT-2 (or LLaMA-3) split
// regex; each pre-token is a byte string that BPE turns into token ids by applying the merges in
// rank order (lowest rank first, leftmost first among equal ranks). Every one of the 256 bytes
// is a token, so any byte string — invalid UTF-8 included — encodes, and decode(encode(x)) == x.
//
// Special tokens (<|endoftext|>, <|user|>, <|assistant|>, <|system|> for a tokenizer trained by
// lowbit) have ids of their own. encode() never produces them from text unless asked to
// (allow_special), so user text cannot inject a document separator or a chat role.
//
// A tokenizer's fingerprint is a 64-bit hash of everything that decides its output (pre-tokenizer,
// every token's bytes, special flags, merges); token shards record it, so that data written with
// one tokenizer is never read with another.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lowbit::data {

// --- pre-tokenization -------------------------------------------------------------------------

// The split patterns lowbit implements (the regexes are written out in tokenizer.cpp):
//  kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Bytes that are not valid UTF-8 count as one character of the class "other" each (neither
// letter, number nor space). The case-insensitive contractions of kLlama3 fold ASCII only.
enum class PreTokenizer { kGpt2, kLlama3 };

std::string_view pretokenizer_name(PreTokenizer p);  // "gpt2", "llama3"
// Throws UserError for a name other than "gpt2" or "llama3".
PreTokenizer pretokenizer_from_name(std::string_view name);

// The pre-tokens of `text`, in order; their concatenation is `text`.
std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizer p);

// The first position q >= min_pos at which `text` can be cut into two pieces whose pre-tokens are
// exactly those of the whole (between an ASCII letter and ASCII punctuation other than '\'');
// text.size() when there is none. Lets a large text be tokenized (or counted for training) piece
// by piece.
size_t pretoken_safe_split(std::string_view text, size_t min_pos);

// --- special tokens ---------------------------------------------------------------------------

inline constexpr std::string_view kEndOfText = "<|endoftext|>";  // document separator
inline constexpr std::string_view kUserToken = "<|user|>";
inline constexpr std::string_view kAssistantToken = "<|assistant|>";
inline constexpr std::string_view kSystemToken = "<|system|>";

struct SpecialToken {
  int32_t id = 0;
  std::string content;
};

// --- the tokenizer ----------------------------------------------------------------------------

class Tokenizer {
 public:
  // Builds a tokenizer from its parts and validates them (UserError naming the problem):
  //  * tokens[id] is the byte string of token `id`; the ids named in `specials` hold their
  //    content there; every other token's bytes are distinct and every single byte is a token;
  //  * merges[r] = (left, right) is the merge of rank r: both are non-special ids and the
  //    concatenation of their bytes is itself a token (the merge's result);
  //  * ignore_merges: a pre-token that is a token as a whole is emitted as that token without
  //    running the merges (the Hugging Face option of that name, used by LLaMA-3).
  static Tokenizer from_parts(std::vector<std::string> tokens,
                              std::vector<std::pair<int32_t, int32_t>> merges,
                              std::vector<SpecialToken> specials, PreTokenizer pretokenizer,
                              bool ignore_merges = false);

  // Reads either format, told apart by content: lowbit's JSON ({"format": "lowbit-bpe", ...},
  // written by save()) or a Hugging Face tokenizer.json (model type BPE, ByteLevel pre-tokenizer
  // with the GPT-2 split or a Split with the GPT-2 or LLaMA-3 regex, no normalizer). Anything
  // else — unreadable file, bad JSON, unsupported model or pre-tokenizer, inconsistent vocabulary
  // or merges, a fingerprint that does not match the content — throws UserError naming the file.
  static Tokenizer load(const std::string& path);
  // lowbit's JSON: {"format": "lowbit-bpe", "version": 1, "pretokenizer", "ignore_merges",
  // "vocab_size", "fingerprint", "tokens": [byte-level strings, null at special ids],
  // "special_tokens": [{"id", "content"}], "merges": [[left, right], ...]}. Token bytes are
  // written with GPT-2's byte-to-character map (a space is "Ġ"). Atomic (temporary + rename).
  void save(const std::string& path) const;
  // A Hugging Face tokenizer.json for the same tokenizer (loadable by `tokenizers` and by load()).
  void save_hf(const std::string& path) const;

  int32_t vocab_size() const;
  uint64_t fingerprint() const;
  std::string fingerprint_hex() const;  // 16 lower-case hex digits
  PreTokenizer pretokenizer() const;
  bool ignore_merges() const;

  // Token ids of `text`. With allow_special, occurrences of special tokens' contents in the text
  // become those tokens; without, they are ordinary text. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // Appends the ids of `text` to `out` (same rules as encode()).
  void encode_append(std::string_view text, std::vector<int32_t>& out,
                     bool allow_special = false) const;
  // The bytes of the tokens (special tokens as their content). UserError on an id outside
  // [0, vocab_size).
  std::string decode(std::span<const int32_t> ids) const;

  const std::string& token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  const std::vector<SpecialToken>& special_tokens() const;
  const std::vector<std::pair<int32_t, int32_t>>& merges() const;
  // The id of a special token by content, if the tokenizer has it.
  std::optional<int32_t> find_special(std::string_view content) const;
  // The same, throwing UserError (that says which tokens the tokenizer has) when it is missing.
  int32_t special_id(std::string_view content) const;
  // The document separator: <|endoftext|>, else <|end_of_text|> or </s>; UserError when none.
  int32_t eot_id() const;

  struct Model;  // the immutable vocabulary and merge tables (tokenizer.cpp)
  struct Cache;  // pre-token → ids cache, shared by copies of one tokenizer

 private:
  Tokenizer() = default;  // made by from_parts(), load() or training only
  std::shared_ptr<const Model> model_;
  std::shared_ptr<Cache> cache_;
};

// GPT-2's byte-to-character map (bytes that print as themselves keep their code point, the others
// take U+0100 onwards): the spelling of token bytes in both JSON formats.
std::string bytes_to_byte_level(std::string_view bytes);
// The inverse; nullopt when `text` has a character outside the map.
std::optional<std::string> byte_level_to_bytes(std::string_view text);

// --- training ---------------------------------------------------------------------------------

struct BpeTrainOptions {
  // Total vocabulary: 256 bytes + merged tokens + special tokens.
  int32_t vocab_size = 4096;
  // Special tokens, given the last ids in this order.
  std::vector<std::string> special_tokens = {std::string(kEndOfText), std::string(kUserToken),
                                             std::string(kAssistantToken),
                                             std::string(kSystemToken)};
  PreTokenizer pretokenizer = PreTokenizer::kGpt2;
  // Training stops early (with a smaller vocabulary) when no pair occurs this often.
  int64_t min_pair_count = 2;
};

struct BpeTrainStats {
  int64_t text_bytes = 0;        // bytes of training text
  int64_t pretokens = 0;         // pre-tokens in it
  int64_t unique_pretokens = 0;  // distinct pre-tokens
  int64_t merges = 0;            // merges learned
  int64_t corpus_tokens = 0;     // tokens of the training text under the learned merges
};

// Counts the pre-tokens of text given in pieces, then learns merges: repeatedly the most frequent
// adjacent pair (ties: the smaller (left, right) id pair) becomes a token. Pair counts live in a
// max-heap with lazy invalidation and an index from pairs to the pre-tokens holding them, so each
// merge touches only the pre-tokens it changes. Deterministic for a given text.
class BpeTrainer {
 public:
  // UserError for a vocabulary too small for the bytes and special tokens, or duplicate or empty
  // special tokens.
  explicit BpeTrainer(BpeTrainOptions options);
  ~BpeTrainer();
  BpeTrainer(const BpeTrainer&) = delete;
  BpeTrainer& operator=(const BpeTrainer&) = delete;

  // Adds a piece of training text. Pieces are pre-tokenized on their own: cut a long text at
  // pretoken_safe_split() points (or at document boundaries) to count it exactly as a whole.
  void add_text(std::string_view text);
  // Learns the merges; the trainer may not be used afterwards.
  Tokenizer train(BpeTrainStats* stats = nullptr);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One-call training on one text.
Tokenizer train_bpe(std::string_view text, const BpeTrainOptions& options,
                    BpeTrainStats* stats = nullptr);

}  // namespace lowbit::data

// Byte-level BPE: pre-tokenization against the regex oracle, encoding against Hugging Face
// tokenizers, training (hand-checked merges, determinism, consistency with encoding), exact round
// trips, special tokens, both file formats, and the fingerprint.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "lowbit/data/tokenizer.h"

namespace lowbit::data {
namespace {

using nlohmann::json;
using testing::kjv_text;
using testing::random_bytes;
using testing::user_error;

const std::string kGolden = std::string(LOWBIT_TEST_DATA_DIR) + "/golden/tokenizer/";

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

// A tokenizer trained once on the first 400 kB of the corpus, per pre-tokenizer.
const Tokenizer& small_tokenizer(PreTokenizer p = PreTokenizer::kGpt2) {
  static const Tokenizer gpt2 = [] {
    BpeTrainOptions o;
    o.vocab_size = 2048;
    return train_bpe(std::string_view(kjv_text()).substr(0, 400000), o);
  }();
  static const Tokenizer llama3 = [] {
    BpeTrainOptions o;
    o.vocab_size = 2048;
    o.pretokenizer = PreTokenizer::kLlama3;
    return train_bpe(std::string_view(kjv_text()).substr(0, 400000), o);
  }();
  return p == PreTokenizer::kGpt2 ? gpt2 : llama3;
}

std::vector<std::string> as_strings(const std::vector<std::string_view>& v) {
  return {v.begin(), v.end()};
}

// --- pre-tokenization ---

TEST(Pretokenize, MatchesTheRegexOracle) {
  const json g = read_json(kGolden + "pretokenize.json");
  ASSERT_GT(g["cases"].size(), 400u);
  for (const json& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(as_strings(pretokenize(text, PreTokenizer::kGpt2)),
              c["gpt2"].get<std::vector<std::string>>())
        << "gpt2: " << json(text).dump();
    EXPECT_EQ(as_strings(pretokenize(text, PreTokenizer::kLlama3)),
              c["llama3"].get<std::vector<std::string>>())
        << "llama3: " << json(text).dump();
  }
}

TEST(Pretokenize, HandExamples) {
  using V = std::vector<std::string>;
  EXPECT_EQ(as_strings(pretokenize("Hello world's  end\n\nX", PreTokenizer::kGpt2)),
            (V{"Hello", " world", "'s", " ", " end", "\n", "\n", "X"}));
  EXPECT_EQ(as_strings(pretokenize("12345 abc", PreTokenizer::kLlama3)), (V{"123", "45", " abc"}));
  EXPECT_TRUE(pretokenize("", PreTokenizer::kGpt2).empty());
}

TEST(Pretokenize, PiecesConcatenateToTheInputForAnyBytes) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_bytes(rng, rng() % 64);
    for (PreTokenizer p : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
      std::string joined;
      for (std::string_view piece : pretokenize(s, p)) {
        EXPECT_FALSE(piece.empty());
        joined += piece;
      }
      EXPECT_EQ(joined, s);
    }
  }
}

TEST(Pretokenize, SafeSplitPointsKeepThePretokens) {
  // Text with varied line breaks and white space, including the corpus.
  std::mt19937_64 rng(3);
  const char* alphabet[] = {"a", "Z", " ", "  ",   "\n", "\n\n", "\t", "'s",
                            "7", ".", "é", "\r\n", ",",  "!(",   "'"};
  std::vector<std::string> texts = {std::string(kjv_text().substr(0, 20000))};
  for (int i = 0; i < 50; ++i) {
    std::string s;
    for (int k = 0; k < 200; ++k) s += alphabet[rng() % std::size(alphabet)];
    texts.push_back(s);
  }
  for (const std::string& s : texts) {
    for (PreTokenizer p : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
      const auto whole = as_strings(pretokenize(s, p));
      std::vector<std::string> pieces;
      for (size_t pos = 0; pos < s.size();) {
        const size_t cut = pretoken_safe_split(s, pos + 1 + rng() % 50);
        for (auto v : pretokenize(std::string_view(s).substr(pos, cut - pos), p)) {
          pieces.emplace_back(v);
        }
        pos = cut;
      }
      EXPECT_EQ(pieces, whole);
    }
  }
}

// --- encoding against Hugging Face tokenizers ---

void check_hf_golden(const std::string& name, PreTokenizer expected_pre) {
  const Tokenizer tok = Tokenizer::load(kGolden + "hf_" + name + "_tokenizer.json");
  EXPECT_EQ(tok.pretokenizer(), expected_pre);
  EXPECT_EQ(tok.eot_id(), 0);  // the Hugging Face trainer gives special tokens the first ids
  const json g = read_json(kGolden + "hf_" + name + "_encode.json");
  for (const json& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << name << ": " << json(text).dump();
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(TokenizerHf, Gpt2ByteLevelEncodesAsHuggingFace) {
  check_hf_golden("gpt2", PreTokenizer::kGpt2);
}

TEST(TokenizerHf, Llama3SplitEncodesAsHuggingFace) {
  check_hf_golden("llama3", PreTokenizer::kLlama3);
}

// --- round trips ---

TEST(Tokenizer, RoundTripRandomBytes) {
  std::mt19937_64 rng(11);
  for (PreTokenizer p : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
    const Tokenizer& tok = small_tokenizer(p);
    for (int i = 0; i < 500; ++i) {
      const std::string s = random_bytes(rng, rng() % 200);
      EXPECT_EQ(tok.decode(tok.encode(s)), s);
    }
    // Every byte value alone, and invalid UTF-8 inside text.
    for (int b = 0; b < 256; ++b) {
      const std::string s = "ab" + std::string(1, static_cast<char>(b)) + " the\xC3";
      EXPECT_EQ(tok.decode(tok.encode(s)), s);
    }
  }
}

TEST(Tokenizer, RoundTripCorpusSampleAndCompresses) {
  const std::string_view sample = std::string_view(kjv_text()).substr(2000000, 300000);
  for (PreTokenizer p : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
    const Tokenizer& tok = small_tokenizer(p);
    const std::vector<int32_t> ids = tok.encode(sample);
    EXPECT_EQ(tok.decode(ids), sample);
    // A 2048-token vocabulary on English prose: well over 3 bytes per token.
    EXPECT_GT(static_cast<double>(sample.size()) / ids.size(), 3.0);
    for (int32_t id : ids) EXPECT_FALSE(tok.is_special(id));
  }
}

// --- training ---

TEST(BpeTrain, HandCheckedMerges) {
  BpeTrainOptions o;
  o.vocab_size = 1000;
  o.special_tokens = {};
  {
    // One pre-token: pairs aa:4 ab:2 (others 1). (a,a) first; then (aa,a) and (a,b) both occur
    // twice and the smaller ids win: (a,b); then (aa,ab) twice; then nothing occurs twice.
    const Tokenizer t = train_bpe("aaabdaaabac", o);
    const std::vector<std::pair<int32_t, int32_t>> want = {{'a', 'a'}, {'a', 'b'}, {256, 257}};
    EXPECT_EQ(t.merges(), want);
    EXPECT_EQ(t.vocab_size(), 259);
    EXPECT_EQ(t.token_bytes(258), "aaab");
    EXPECT_EQ(t.encode("aaabdaaabac"), (std::vector<int32_t>{258, 'd', 258, 'a', 'c'}));
  }
  {
    // Pre-tokens "ab", " ab" ×2, " abc": (a,b) 4 times, then (" ", ab) 3 times.
    const Tokenizer t = train_bpe("ab ab ab abc", o);
    const std::vector<std::pair<int32_t, int32_t>> want = {{'a', 'b'}, {' ', 256}};
    EXPECT_EQ(t.merges(), want);
    EXPECT_EQ(t.encode(" ab abc"), (std::vector<int32_t>{257, 257, 'c'}));
  }
}

TEST(BpeTrain, SpecialTokensTakeTheLastIds) {
  BpeTrainOptions o;
  o.vocab_size = 300;
  const Tokenizer t = train_bpe(std::string_view(kjv_text()).substr(0, 50000), o);
  ASSERT_EQ(t.vocab_size(), 300);
  EXPECT_EQ(t.special_id(kEndOfText), 296);
  EXPECT_EQ(t.special_id(kUserToken), 297);
  EXPECT_EQ(t.special_id(kAssistantToken), 298);
  EXPECT_EQ(t.special_id(kSystemToken), 299);
  EXPECT_EQ(t.eot_id(), 296);
  // Text that spells a special token stays text unless asked.
  const std::string s = "a<|endoftext|>b<|user|>";
  const std::vector<int32_t> plain = t.encode(s);
  for (int32_t id : plain) EXPECT_FALSE(t.is_special(id));
  EXPECT_EQ(t.decode(plain), s);
  const std::vector<int32_t> with = t.encode(s, true);
  EXPECT_EQ(with, (std::vector<int32_t>{'a', 296, 'b', 297}));
  EXPECT_EQ(t.decode(with), s);
  EXPECT_NE(user_error([&] { t.special_id("<|tool|>"); }).find("no special token <|tool|>"),
            std::string::npos);
}

TEST(BpeTrain, DeterministicAndChunkIndependent) {
  const std::string_view text = std::string_view(kjv_text()).substr(0, 300000);
  BpeTrainOptions o;
  o.vocab_size = 1024;
  const Tokenizer a = train_bpe(text, o);
  const Tokenizer b = train_bpe(text, o);
  EXPECT_EQ(a.merges(), b.merges());
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  // The same text given in pieces cut at safe points trains the same tokenizer.
  BpeTrainer trainer(o);
  for (size_t pos = 0; pos < text.size();) {
    const size_t cut = pretoken_safe_split(text, pos + 7000);
    trainer.add_text(text.substr(pos, cut - pos));
    pos = cut;
  }
  EXPECT_EQ(trainer.train().fingerprint(), a.fingerprint());
  // A different size is a different tokenizer.
  o.vocab_size = 1023;
  EXPECT_NE(train_bpe(text, o).fingerprint(), a.fingerprint());
}

TEST(BpeTrain, EncodingReproducesTheTrainingSegmentation) {
  const std::string_view text = std::string_view(kjv_text()).substr(1000000, 300000);
  for (PreTokenizer p : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
    BpeTrainOptions o;
    o.vocab_size = 1500;
    o.pretokenizer = p;
    BpeTrainStats stats;
    const Tokenizer t = train_bpe(text, o, &stats);
    EXPECT_EQ(stats.text_bytes, static_cast<int64_t>(text.size()));
    EXPECT_EQ(stats.merges, 1500 - 256 - 4);
    EXPECT_EQ(static_cast<int64_t>(t.encode(text).size()), stats.corpus_tokens);
  }
}

TEST(BpeTrain, StopsWhenNoPairRepeats) {
  BpeTrainOptions o;
  o.vocab_size = 5000;
  const Tokenizer t = train_bpe("the cat sat on the mat", o);
  EXPECT_LT(t.vocab_size(), 5000);
  EXPECT_EQ(t.decode(t.encode("the cat")), "the cat");
}

TEST(BpeTrain, WholeCorpusTrainsInSeconds) {
  BpeTrainOptions o;
  o.vocab_size = 4096;
  const auto t0 = std::chrono::steady_clock::now();
  BpeTrainStats stats;
  const Tokenizer t = train_bpe(kjv_text(), o, &stats);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(t.vocab_size(), 4096);
  EXPECT_LT(s, 20.0);  // a few seconds on one slow core; minutes would mean a quadratic step
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(static_cast<int64_t>(t.encode(kjv_text()).size()), stats.corpus_tokens);
  const double e = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_LT(e, 10.0);
  std::printf("BPE on %zu bytes: trained to 4096 in %.2f s, encoded to %lld tokens in %.2f s\n",
              kjv_text().size(), s, static_cast<long long>(stats.corpus_tokens), e);
}

TEST(BpeTrain, RejectsBadOptions) {
  BpeTrainOptions o;
  o.vocab_size = 100;
  EXPECT_NE(user_error([&] { BpeTrainer t(o); }).find("too small"), std::string::npos);
  o.vocab_size = 1000;
  o.special_tokens = {"<|a|>", "<|a|>"};
  EXPECT_NE(user_error([&] { BpeTrainer t(o); }).find("twice"), std::string::npos);
}

// --- files and fingerprint ---

class TokenizerFiles : public testing::ScratchDirTest {};

TEST_F(TokenizerFiles, SaveLoadIdentity) {
  for (PreTokenizer p : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
    const Tokenizer& t = small_tokenizer(p);
    t.save(path("tok.json"));
    const Tokenizer u = Tokenizer::load(path("tok.json"));
    EXPECT_EQ(u.fingerprint(), t.fingerprint());
    EXPECT_EQ(u.vocab_size(), t.vocab_size());
    EXPECT_EQ(u.merges(), t.merges());
    EXPECT_EQ(u.pretokenizer(), p);
    for (int32_t id = 0; id < t.vocab_size(); ++id) {
      EXPECT_EQ(u.token_bytes(id), t.token_bytes(id));
      EXPECT_EQ(u.is_special(id), t.is_special(id));
    }
    const std::string_view sample = std::string_view(kjv_text()).substr(3000000, 20000);
    EXPECT_EQ(u.encode(sample), t.encode(sample));
    // The Hugging Face export loads back as the same tokenizer.
    t.save_hf(path("tokenizer.json"));
    const Tokenizer h = Tokenizer::load(path("tokenizer.json"));
    EXPECT_EQ(h.fingerprint(), t.fingerprint());
    EXPECT_EQ(h.encode(sample), t.encode(sample));
  }
}

TEST_F(TokenizerFiles, BadFilesAreClearErrors) {
  const Tokenizer& t = small_tokenizer();
  t.save(path("good.json"));
  std::ifstream in(path("good.json"));
  const json good = json::parse(in);

  EXPECT_NE(user_error([&] { Tokenizer::load(path("missing.json")); }).find("cannot open"),
            std::string::npos);
  write("bad.json", "{ not json");
  EXPECT_NE(user_error([&] { Tokenizer::load(path("bad.json")); }).find("not valid JSON"),
            std::string::npos);
  write("other.json", R"({"hello": 1})");
  EXPECT_NE(user_error([&] { Tokenizer::load(path("other.json")); }).find("not a tokenizer file"),
            std::string::npos);

  json j = good;
  j["fingerprint"] = "0123456789abcdef";
  write("fp.json", j.dump());
  EXPECT_NE(user_error([&] { Tokenizer::load(path("fp.json")); }).find("edited or damaged"),
            std::string::npos);

  j = good;
  j.erase("fingerprint");
  j["merges"].push_back({300, 5000});
  write("merge.json", j.dump());
  EXPECT_NE(user_error([&] { Tokenizer::load(path("merge.json")); }).find("outside the vocabulary"),
            std::string::npos);

  j = good;
  j.erase("fingerprint");
  j["tokens"][65] = "B";  // two tokens for "B", none for "A"
  write("dup.json", j.dump());
  EXPECT_NE(user_error([&] { Tokenizer::load(path("dup.json")); }).find("same bytes"),
            std::string::npos);

  j = good;
  j["version"] = 2;
  write("version.json", j.dump());
  EXPECT_NE(user_error([&] { Tokenizer::load(path("version.json")); }).find("version 2"),
            std::string::npos);

  json hf = read_json(kGolden + "hf_gpt2_tokenizer.json");
  hf["normalizer"] = {{"type", "NFC"}};
  write("nfc.json", hf.dump());
  EXPECT_NE(user_error([&] { Tokenizer::load(path("nfc.json")); }).find("normalizer"),
            std::string::npos);
  hf = read_json(kGolden + "hf_gpt2_tokenizer.json");
  hf["model"]["type"] = "WordPiece";
  write("wp.json", hf.dump());
  EXPECT_NE(user_error([&] { Tokenizer::load(path("wp.json")); }).find("WordPiece"),
            std::string::npos);
}

TEST(Tokenizer, FingerprintDependsOnEveryPart) {
  const Tokenizer& t = small_tokenizer();
  std::vector<std::string> tokens;
  std::vector<SpecialToken> specials = t.special_tokens();
  for (int32_t id = 0; id < t.vocab_size(); ++id) tokens.push_back(t.token_bytes(id));
  auto merges = t.merges();
  const Tokenizer same = Tokenizer::from_parts(tokens, merges, specials, t.pretokenizer());
  EXPECT_EQ(same.fingerprint(), t.fingerprint());
  const Tokenizer other_pre =
      Tokenizer::from_parts(tokens, merges, specials, PreTokenizer::kLlama3);
  EXPECT_NE(other_pre.fingerprint(), t.fingerprint());
  auto fewer = merges;
  fewer.pop_back();
  EXPECT_NE(Tokenizer::from_parts(tokens, fewer, specials, t.pretokenizer()).fingerprint(),
            t.fingerprint());
  std::swap(merges[10], merges[11]);
  EXPECT_NE(Tokenizer::from_parts(tokens, merges, specials, t.pretokenizer()).fingerprint(),
            t.fingerprint());
}

TEST(Tokenizer, ByteLevelMap) {
  EXPECT_EQ(bytes_to_byte_level(" the"), "\xC4\xA0the");  // "Ġthe"
  EXPECT_EQ(bytes_to_byte_level("\n"), "\xC4\x8A");       // "Ċ"
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level_to_bytes(bytes_to_byte_level(all)), all);
  EXPECT_FALSE(byte_level_to_bytes("a b").has_value());  // a space is not in the map
}

TEST(Tokenizer, DecodeRejectsForeignIds) {
  const Tokenizer& t = small_tokenizer();
  const std::vector<int32_t> ids = {1, t.vocab_size()};
  EXPECT_NE(user_error([&] { t.decode(ids); }).find("outside the tokenizer's vocabulary"),
            std::string::npos);
}

}  // namespace
}  // namespace lowbit::data

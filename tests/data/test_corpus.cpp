// Corpora: compressed reading (the bundled xz corpus, gzip members, damaged data), documents of
// text and JSONL files, the SFT template and its masks, and corpus → shards.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "data/data_test_util.h"
#include "lowbit/data/corpus.h"

namespace lowbit::data {
namespace {

using testing::kjv_path;
using testing::kjv_text;
using testing::user_error;

// `gzip -n -9` of "hello gzip\n" and of "second member\n".
const unsigned char kGzipHello[] = {
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0x57,
    0x48, 0xaf, 0xca, 0x2c, 0xe0, 0x02, 0x00, 0x39, 0x7c, 0x63, 0x56, 0x0b, 0x00, 0x00, 0x00};
const unsigned char kGzipSecond[] = {0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
                                     0x03, 0x2b, 0x4e, 0x4d, 0xce, 0xcf, 0x4b, 0x51, 0xc8,
                                     0x4d, 0xcd, 0x4d, 0x4a, 0x2d, 0xe2, 0x02, 0x00, 0x36,
                                     0x18, 0x4b, 0x0e, 0x0e, 0x00, 0x00, 0x00};

template <size_t N>
std::string bytes(const unsigned char (&b)[N]) {
  return std::string(reinterpret_cast<const char*>(b), N);
}

// The tokenizer of these tests: trained on the first 200 kB of the corpus.
const Tokenizer& tokenizer() {
  static const Tokenizer t = [] {
    BpeTrainOptions o;
    o.vocab_size = 1024;
    return train_bpe(std::string_view(kjv_text()).substr(0, 200000), o);
  }();
  return t;
}

// Collects what read_documents() delivers.
struct Collect : DocumentSink {
  std::vector<std::string> docs;  // text documents (pieces joined) and chats as "role:content|"
  std::vector<size_t> pieces;     // pieces per document
  std::string cur;
  size_t cur_pieces = 0;
  void text(std::string_view piece) override {
    cur += piece;
    ++cur_pieces;
  }
  void chat(std::span<const ChatMessage> messages) override {
    for (const ChatMessage& m : messages) cur += m.role + ":" + m.content + "|";
  }
  void end_document() override {
    docs.push_back(cur);
    pieces.push_back(cur_pieces);
    cur.clear();
    cur_pieces = 0;
  }
};

class Corpus : public testing::ScratchDirTest {};

TEST_F(Corpus, BundledCorpusIsTheKingJamesBible) {
  EXPECT_EQ(detect_compression(kjv_path()), Compression::kXz);
  const std::string& text = kjv_text();
  EXPECT_EQ(text.size(), 4298239u);
  const std::string first =
      "\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n";
  const std::string last = "  21 The grace of our Lord Jesus Christ be with you all. Amen.\n";
  EXPECT_EQ(text.substr(0, first.size()), first);
  EXPECT_EQ(text.substr(text.size() - last.size()), last);
}

TEST_F(Corpus, GzipMembersAndPlainText) {
  write("two.gz", bytes(kGzipHello) + bytes(kGzipSecond));
  EXPECT_EQ(detect_compression(path("two.gz")), Compression::kGzip);
  EXPECT_EQ(read_text_file(path("two.gz")), "hello gzip\nsecond member\n");
  write("plain.txt", "just text");
  EXPECT_EQ(detect_compression(path("plain.txt")), Compression::kNone);
  EXPECT_EQ(read_text_file(path("plain.txt")), "just text");
  write("empty.txt", "");
  EXPECT_EQ(read_text_file(path("empty.txt")), "");
  // read_line over a compressed file, final line without '\n'.
  write("lines.gz", bytes(kGzipHello));
  ByteReader r(path("lines.gz"));
  std::string line;
  ASSERT_TRUE(r.read_line(line));
  EXPECT_EQ(line, "hello gzip");
  EXPECT_FALSE(r.read_line(line));
}

TEST_F(Corpus, DamagedCompressedDataIsAClearError) {
  std::ifstream f(kjv_path(), std::ios::binary);
  const std::string full(std::istreambuf_iterator<char>(f), {});
  write("cut.txt.xz", full.substr(0, full.size() / 2));
  std::string msg = user_error([&] { read_text_file(path("cut.txt.xz")); });
  EXPECT_NE(msg.find("truncated xz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cut.txt.xz"), std::string::npos) << msg;
  std::string bad = full;
  bad[bad.size() / 2] ^= 0x55;
  write("bad.txt.xz", bad);
  msg = user_error([&] { read_text_file(path("bad.txt.xz")); });
  EXPECT_NE(msg.find("corrupt xz"), std::string::npos) << msg;
  const std::string gz = bytes(kGzipHello);
  write("cut.gz", gz.substr(0, gz.size() - 5));
  msg = user_error([&] { read_text_file(path("cut.gz")); });
  EXPECT_NE(msg.find("truncated gzip"), std::string::npos) << msg;
  std::string badgz = gz;
  badgz[12] ^= 0x7F;
  write("bad.gz", badgz);
  msg = user_error([&] { read_text_file(path("bad.gz")); });
  EXPECT_NE(msg.find("gzip"), std::string::npos) << msg;
  msg = user_error([&] { read_text_file(path("missing.txt")); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST_F(Corpus, PlainTextArrivesInSafePieces) {
  Collect c;
  read_documents(kjv_path(), c, 64 << 10);
  ASSERT_EQ(c.docs.size(), 1u);
  EXPECT_EQ(c.docs[0], kjv_text());
  EXPECT_GT(c.pieces[0], 40u);  // about 4.3 MB / 64 kB
}

TEST_F(Corpus, JsonlRecords) {
  write("d.jsonl",
        "{\"text\": \"first doc\"}\n"
        "\n"
        "{\"prompt\": \"hi\", \"response\": \"hello\"}\n"
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", "
        "\"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n"
        "{\"text\": \"last, no newline\"}");
  Collect c;
  read_documents(path("d.jsonl"), c);
  const std::vector<std::string> want = {"first doc", "user:hi|assistant:hello|",
                                         "system:be brief|user:q|assistant:a|", "last, no newline"};
  EXPECT_EQ(c.docs, want);
}

TEST_F(Corpus, JsonlErrorsNameFileAndLine) {
  Collect c;
  write("a.jsonl", "{\"text\": \"ok\"}\n{not json}\n");
  std::string msg = user_error([&] { read_documents(path("a.jsonl"), c); });
  EXPECT_NE(msg.find("a.jsonl:2: not valid JSON"), std::string::npos) << msg;
  write("b.jsonl", "{\"body\": \"x\"}\n");
  msg = user_error([&] { read_documents(path("b.jsonl"), c); });
  EXPECT_NE(msg.find("b.jsonl:1: the record has none of"), std::string::npos) << msg;
  write("c.jsonl", "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n");
  msg = user_error([&] { read_documents(path("c.jsonl"), c); });
  EXPECT_NE(msg.find("unknown role 'tool'"), std::string::npos) << msg;
  write("d.jsonl", "{\"prompt\": \"x\"}\n");
  msg = user_error([&] { read_documents(path("d.jsonl"), c); });
  EXPECT_NE(msg.find("\"prompt\" and \"response\""), std::string::npos) << msg;
  write("e.jsonl", "[1, 2]\n");
  msg = user_error([&] { read_documents(path("e.jsonl"), c); });
  EXPECT_NE(msg.find("must be a JSON object"), std::string::npos) << msg;
}

TEST(Chat, TemplateAndMask) {
  const Tokenizer& t = tokenizer();
  const int32_t eot = t.special_id(kEndOfText), user = t.special_id(kUserToken),
                asst = t.special_id(kAssistantToken), sys = t.special_id(kSystemToken);
  const std::vector<ChatMessage> msgs = {
      {"system", "Be kind."}, {"user", "Who?"}, {"assistant", "Moses."}, {"user", "Why"}};
  const TokensWithMask tm = tokenize_chat(t, msgs);
  std::vector<int32_t> want;
  std::vector<uint8_t> mask;
  auto add = [&](std::vector<int32_t> ids, uint8_t m) {
    want.insert(want.end(), ids.begin(), ids.end());
    mask.insert(mask.end(), ids.size(), m);
  };
  add({sys}, 0);
  add(t.encode("Be kind."), 0);
  add({user}, 0);
  add(t.encode("Who?"), 0);
  add({asst}, 0);
  add(t.encode("Moses."), 1);
  add({eot}, 1);
  add({user}, 0);
  add(t.encode("Why"), 0);
  add({eot}, 0);  // the conversation does not end with the assistant: a plain separator
  EXPECT_EQ(tm.tokens, want);
  EXPECT_EQ(tm.mask, mask);
  // Ready for generation: ends with the assistant's turn.
  const TokensWithMask gen = tokenize_chat(t, std::span(msgs).first(2), true);
  EXPECT_EQ(gen.tokens.back(), asst);
  EXPECT_EQ(std::count(gen.mask.begin(), gen.mask.end(), 1), 0);
  EXPECT_NE(user_error([&] { tokenize_chat(t, {}); }).find("at least one message"),
            std::string::npos);
}

TEST_F(Corpus, TokenizeCorpusWithSftMasks) {
  const Tokenizer& t = tokenizer();
  write("a.txt", "In the beginning.");
  write("b.jsonl",
        "{\"text\": \"And God said.\"}\n{\"prompt\": \"Who?\", \"response\": \"Adam.\"}\n");
  CorpusOptions o;
  o.inputs = {path("a.txt"), path("b.jsonl")};
  o.output_dir = path("shards");
  o.shard_tokens = 1000;
  const CorpusStats st = tokenize_corpus(t, o);
  EXPECT_EQ(st.documents, 2);
  EXPECT_EQ(st.chat_records, 1);
  ASSERT_EQ(st.shards.size(), 1u);
  EXPECT_TRUE(st.shards[0].has_mask);

  std::vector<int32_t> want;
  std::vector<uint8_t> mask;
  auto add = [&](std::vector<int32_t> ids, uint8_t m) {
    want.insert(want.end(), ids.begin(), ids.end());
    mask.insert(mask.end(), ids.size(), m);
  };
  add(t.encode("In the beginning."), 1);
  add({t.eot_id()}, 1);
  add(t.encode("And God said."), 1);
  add({t.eot_id()}, 1);
  const std::vector<ChatMessage> chat = {{"user", "Who?"}, {"assistant", "Adam."}};
  const TokensWithMask tm = tokenize_chat(t, chat);
  want.insert(want.end(), tm.tokens.begin(), tm.tokens.end());
  mask.insert(mask.end(), tm.mask.begin(), tm.mask.end());
  EXPECT_EQ(st.tokens, static_cast<int64_t>(want.size()));

  const std::vector<std::string> dir = {path("shards")};
  const auto shards = open_shards(dir, t.fingerprint());
  ASSERT_EQ(shards.size(), 1u);
  std::vector<int32_t> got(shards[0]->size());
  std::vector<uint8_t> got_mask(shards[0]->size());
  shards[0]->copy_tokens(0, shards[0]->size(), got.data());
  shards[0]->copy_mask(0, shards[0]->size(), got_mask.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_mask, mask);
  // Shards of this tokenizer are refused for another.
  BpeTrainOptions other;
  other.vocab_size = 600;
  const Tokenizer t2 = train_bpe(std::string_view(kjv_text()).substr(0, 100000), other);
  EXPECT_NE(user_error([&] { open_shards(dir, t2.fingerprint()); }).find("different tokenizer"),
            std::string::npos);
}

TEST_F(Corpus, TokenizedCorpusEqualsEncodingTheWhole) {
  const Tokenizer& t = tokenizer();
  CorpusOptions o;
  o.inputs = {kjv_path()};
  o.output_dir = path("kjv");
  o.shard_tokens = 300000;
  const CorpusStats st = tokenize_corpus(t, o);
  std::vector<int32_t> want = t.encode(kjv_text());
  want.push_back(t.eot_id());
  EXPECT_EQ(st.tokens, static_cast<int64_t>(want.size()));
  EXPECT_EQ(st.input_bytes, static_cast<int64_t>(kjv_text().size()));
  EXPECT_GT(st.shards.size(), 3u);
  const std::vector<std::string> dir = {path("kjv")};
  std::vector<int32_t> got;
  for (const auto& s : open_shards(dir, t.fingerprint())) {
    EXPECT_FALSE(s->has_mask());
    std::vector<int32_t> part(s->size());
    s->copy_tokens(0, s->size(), part.data());
    got.insert(got.end(), part.begin(), part.end());
  }
  EXPECT_EQ(got, want);
}

TEST_F(Corpus, DefaultCorpusPathFromEnvironment) {
  const std::string data_dir = std::string(LOWBIT_TEST_DATA_DIR) + "/../../data";
  ::setenv("LOWBIT_DATA_DIR", data_dir.c_str(), 1);
  EXPECT_EQ(default_corpus_path(), data_dir + "/kjv.txt.xz");
  ::unsetenv("LOWBIT_DATA_DIR");
}

TEST_F(Corpus, MissingInputIsAClearError) {
  CorpusOptions o;
  o.inputs = {path("nope.txt")};
  o.output_dir = path("out");
  const std::string msg = user_error([&] { tokenize_corpus(tokenizer(), o); });
  EXPECT_NE(msg.find("nope.txt: input file not found"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lowbit::data

// Token shards: round trip (u16 and u32, with and without a mask), every damaged file rejected with
// a UserError naming the file and the problem, tokenizer mismatch, the writer's cutting and its
// manifest.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "lowbit/data/shards.h"

namespace lowbit::data {
namespace {

using testing::user_error;

class Shards : public testing::ScratchDirTest {
 protected:
  std::string read_bytes(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // Writes a valid shard, lets `edit` change its bytes, and returns the error of opening it.
  template <class F>
  std::string damaged(F&& edit) {
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const std::vector<uint8_t> mask = {0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
    write_token_shard(path("s.lbt"), 42, 100, tokens, mask, 1);
    std::string bytes = read_bytes(path("s.lbt"));
    edit(bytes);
    write("s.lbt", bytes);
    return user_error([&] { TokenShard::open(path("s.lbt")); });
  }
};

TEST_F(Shards, RoundTripU16AndU32WithAndWithoutMask) {
  std::mt19937 rng(5);
  for (int32_t vocab : {300, 65536, 65537, 200000}) {
    for (bool with_mask : {false, true}) {
      std::vector<int32_t> tokens(1000);
      std::vector<uint8_t> mask;
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
      tokens[0] = vocab - 1;
      if (with_mask) {
        for (size_t i = 0; i < tokens.size(); ++i) mask.push_back(rng() % 2);
      }
      write_token_shard(path("a.lbt"), 0xABCDEF0123456789ull, vocab, tokens, mask, 3);
      const auto s = TokenShard::open(path("a.lbt"));
      EXPECT_EQ(s->size(), 1000);
      EXPECT_EQ(s->vocab_size(), vocab);
      EXPECT_EQ(s->fingerprint(), 0xABCDEF0123456789ull);
      EXPECT_EQ(s->documents(), 3);
      EXPECT_EQ(s->has_mask(), with_mask);
      std::vector<int32_t> back(1000);
      s->copy_tokens(0, 1000, back.data());
      EXPECT_EQ(back, tokens);
      std::vector<uint8_t> m(1000);
      s->copy_mask(0, 1000, m.data());
      EXPECT_EQ(m, with_mask ? mask : std::vector<uint8_t>(1000, 1));
      EXPECT_EQ(s->token(17), tokens[17]);
      const size_t expected =
          kShardHeaderBytes + 1000 * (vocab <= 65536 ? 2 : 4) + (with_mask ? 1000 : 0);
      EXPECT_EQ(std::filesystem::file_size(path("a.lbt")), expected);
    }
  }
}

TEST_F(Shards, EmptyShardIsValid) {
  write_token_shard(path("e.lbt"), 1, 10, {});
  EXPECT_EQ(TokenShard::open(path("e.lbt"))->size(), 0);
}

TEST_F(Shards, DamagedFilesAreClearErrors) {
  // Each message names the file and says what is wrong.
  const std::string name = path("s.lbt");
  auto expect = [&](const std::string& msg, const std::string& what) {
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  expect(damaged([](std::string& b) { b[0] = 'X'; }), "bad magic");
  expect(damaged([](std::string& b) { b.resize(b.size() - 1); }), "truncated");
  expect(damaged([](std::string& b) { b.resize(b.size() - 15); }), "truncated");
  expect(damaged([](std::string& b) { b.resize(40); }), "shorter than the 72-byte header");
  expect(damaged([](std::string& b) { b += "x"; }), "the file has");
  expect(damaged([](std::string& b) { b[8] = 9; }), "version 9");
  expect(damaged([](std::string& b) { b[33] ^= 1; }), "header checksum");
  expect(damaged([](std::string& b) { b[kShardHeaderBytes + 3] ^= 1; }), "token checksum");
  expect(damaged([](std::string& b) { b[b.size() - 2] ^= 1; }), "mask checksum");
  const std::string missing = user_error([&] { TokenShard::open(path("none.lbt")); });
  EXPECT_NE(missing.find("none.lbt: cannot open"), std::string::npos) << missing;
}

TEST_F(Shards, FingerprintMismatchIsDetected) {
  write_token_shard(path("a.lbt"), 111, 50, std::vector<int32_t>{1, 2, 3});
  ShardOpenOptions o;
  o.expected_fingerprint = 222;
  const std::string msg = user_error([&] { TokenShard::open(path("a.lbt"), o); });
  EXPECT_NE(msg.find("different tokenizer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("000000000000006f"), std::string::npos) << msg;  // 111 in hex
  o.expected_fingerprint = 111;
  EXPECT_EQ(TokenShard::open(path("a.lbt"), o)->size(), 3);
  // Two shards of different tokenizers in one set.
  write_token_shard(path("b.lbt"), 333, 50, std::vector<int32_t>{4});
  const std::vector<std::string> both = {path("a.lbt"), path("b.lbt")};
  EXPECT_NE(user_error([&] { open_shards(both); }).find("different tokenizer"), std::string::npos);
}

TEST_F(Shards, WriterRejectsBadTokensAndMasks) {
  EXPECT_NE(user_error([&] {
              write_token_shard(path("x.lbt"), 1, 10, std::vector<int32_t>{3, 10});
            }).find("outside the vocabulary"),
            std::string::npos);
  EXPECT_NE(user_error([&] {
              write_token_shard(path("x.lbt"), 1, 10, std::vector<int32_t>{3, 4},
                                std::vector<uint8_t>{1});
            }).find("mask"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path("x.lbt")));
}

TEST_F(Shards, ShardWriterCutsAndWritesAManifest) {
  ShardWriter w(path("out"), "train", 77, 1000, 25);
  std::vector<int32_t> all;
  for (int i = 0; i < 7; ++i) {
    std::vector<int32_t> doc(10 + i);
    for (size_t k = 0; k < doc.size(); ++k) doc[k] = static_cast<int32_t>(i * 100 + k);
    std::vector<uint8_t> mask(doc.size(), i == 3 ? 0 : 1);  // a masked document in one shard
    w.add(doc, mask, 1);
    all.insert(all.end(), doc.begin(), doc.end());
  }
  const std::vector<ShardInfo> infos = w.finish();
  ASSERT_EQ(infos.size(), (all.size() + 24) / 25);  // 91 tokens: 4 shards
  EXPECT_EQ(infos[0].file, "train_000000.lbt");
  int64_t docs = 0;
  for (const ShardInfo& s : infos) docs += s.documents;
  EXPECT_EQ(docs, 7);
  const std::vector<std::string> dir = {path("out")};
  const auto shards = open_shards(dir, 77);
  std::vector<int32_t> back;
  int masked_shards = 0;
  for (const auto& s : shards) {
    std::vector<int32_t> t(s->size());
    s->copy_tokens(0, s->size(), t.data());
    back.insert(back.end(), t.begin(), t.end());
    masked_shards += s->has_mask();
  }
  EXPECT_EQ(back, all);
  EXPECT_EQ(masked_shards, 1);  // document 3 (tokens 33..45) lies in the second shard only
  std::ifstream mf(path("out/manifest.json"));
  const nlohmann::json m = nlohmann::json::parse(mf);
  EXPECT_EQ(m["total_tokens"], 91);
  EXPECT_EQ(m["tokenizer_fingerprint"], "000000000000004d");
  // A directory without a manifest.
  std::filesystem::create_directories(path("empty"));
  const std::vector<std::string> empty = {path("empty")};
  EXPECT_NE(user_error([&] { open_shards(empty); }).find("manifest.json"), std::string::npos);
}

}  // namespace
}  // namespace lowbit::data

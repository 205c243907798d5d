// Data loader: batch layout (inputs and targets shifted by one, masks → ignore index), determinism,
// state save / restore, train / validation split disjointness, fixed validation windows, ranks,
// and the errors for data too short or from another tokenizer.
#include <gtest/gtest.h>

#include <set>

#include "data/data_test_util.h"
#include "lowbit/data/loader.h"

namespace lowbit::data {
namespace {

using testing::user_error;

// A shard whose token i is i % vocab (so a window's position can be read off its tokens).
ShardPtr counting_shard(int64_t n, int32_t vocab = 1 << 20, uint64_t fp = 7) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i % vocab);
  return TokenShard::from_memory(std::move(t), {}, fp, vocab);
}

LoaderOptions opts(int64_t B, int64_t T, uint64_t seed = 1, double val = 0.1) {
  LoaderOptions o;
  o.batch_size = B;
  o.seq_len = T;
  o.seed = seed;
  o.val_fraction = val;
  return o;
}

TEST(Loader, BatchesAreWindowsShiftedByOne) {
  DataLoader dl({counting_shard(10000)}, {}, opts(4, 16));
  EXPECT_EQ(dl.train_tokens(), 9000);
  EXPECT_EQ(dl.val_tokens(), 1000);
  for (int step = 0; step < 50; ++step) {
    const Batch b = dl.next_train_batch();
    ASSERT_EQ(b.inputs.size(), 64u);
    EXPECT_EQ(b.target_count, 64);
    for (int r = 0; r < 4; ++r) {
      const int32_t start = b.inputs[r * 16];
      EXPECT_GE(start, 0);
      EXPECT_LE(start + 16, 9000 - 1);  // the window's T + 1 tokens lie in the training part
      for (int t = 0; t < 16; ++t) {
        EXPECT_EQ(b.inputs[r * 16 + t], start + t);
        EXPECT_EQ(b.targets[r * 16 + t], start + t + 1);
      }
    }
  }
  EXPECT_EQ(dl.samples_drawn(), 200u);
}

TEST(Loader, DeterministicAndResumable) {
  const std::vector<ShardPtr> shards = {counting_shard(3000), counting_shard(5000)};
  DataLoader a(shards, {}, opts(8, 32, 42));
  DataLoader b(shards, {}, opts(8, 32, 42));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.next_train_batch().inputs, b.next_train_batch().inputs);
  // Save after k batches, continue; a fresh loader restored from the state draws the same.
  const std::string state = a.state_json();
  std::vector<Batch> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(a.next_train_batch());
  DataLoader c(shards, {}, opts(8, 32, 999));  // the seed comes from the state
  c.restore_state(state);
  for (int i = 0; i < 5; ++i) {
    const Batch got = c.next_train_batch();
    EXPECT_EQ(got.inputs, expected[i].inputs);
    EXPECT_EQ(got.targets, expected[i].targets);
  }
  // Another seed draws other windows.
  DataLoader d(shards, {}, opts(8, 32, 43));
  DataLoader e(shards, {}, opts(8, 32, 42));
  EXPECT_NE(d.next_train_batch().inputs, e.next_train_batch().inputs);
}

TEST(Loader, WindowsCoverTheTrainingPartUniformly) {
  // 200 possible starts, 20000 draws: each start about 100 times.
  DataLoader dl({counting_shard(250)}, {}, opts(100, 10, 5, 0.0));
  std::vector<int> hits(250, 0);
  for (int i = 0; i < 200; ++i) {
    const Batch b = dl.next_train_batch();
    for (int r = 0; r < 100; ++r) ++hits[b.inputs[r * 10]];
  }
  for (int s = 0; s < 240; ++s) {
    EXPECT_GT(hits[s], 50) << s;
    EXPECT_LT(hits[s], 160) << s;
  }
  for (int s = 240; s < 250; ++s) EXPECT_EQ(hits[s], 0) << s;
}

TEST(Loader, TrainAndValidationAreDisjoint) {
  // Shards whose tokens are distinct across the whole stream.
  std::vector<int32_t> t1(4000), t2(3000);
  for (int i = 0; i < 4000; ++i) t1[i] = i;
  for (int i = 0; i < 3000; ++i) t2[i] = 4000 + i;
  const std::vector<ShardPtr> shards = {TokenShard::from_memory(t1, {}, 1, 7000),
                                        TokenShard::from_memory(t2, {}, 1, 7000)};
  DataLoader dl(shards, {}, opts(16, 24, 3, 0.25));
  EXPECT_EQ(dl.val_tokens(), 1750);
  std::set<int32_t> train_seen, val_seen;
  for (int i = 0; i < 300; ++i) {
    const Batch b = dl.next_train_batch();
    for (int64_t k = 0; k < 16 * 24; ++k) {
      train_seen.insert(b.inputs[k]);
      train_seen.insert(b.targets[k]);
    }
  }
  for (int64_t i = 0; i < dl.val_batch_count(); ++i) {
    const Batch b = dl.val_batch(i);
    for (int64_t k = 0; k < 16 * 24; ++k) {
      if (b.targets[k] == kIgnoreIndex) continue;
      val_seen.insert(b.inputs[k]);
      val_seen.insert(b.targets[k]);
    }
  }
  EXPECT_LT(*train_seen.rbegin(), 5250);
  EXPECT_GE(*val_seen.begin(), 5250);
  // Every validation token but the first is a target exactly once, up to the last full window.
  EXPECT_EQ(dl.val_windows(), (1750 - 1) / 24);
  EXPECT_EQ(static_cast<int64_t>(val_seen.size()), dl.val_windows() * 24 + 1);
}

TEST(Loader, ValidationIsFixedAndPadded) {
  DataLoader dl({counting_shard(1000)}, {counting_shard(300)}, opts(4, 20, 1));
  EXPECT_EQ(dl.train_tokens(), 1000);
  EXPECT_EQ(dl.val_windows(), 14);     // (300 - 1) / 20
  EXPECT_EQ(dl.val_batch_count(), 4);  // 14 windows in batches of 4
  const Batch last = dl.val_batch(3);  // windows 12, 13 and two empty rows
  EXPECT_EQ(last.target_count, 40);
  EXPECT_EQ(last.inputs[0], 240);
  EXPECT_EQ(last.inputs[20], 260);
  EXPECT_EQ(last.targets[40], kIgnoreIndex);
  EXPECT_EQ(last.inputs[40], 0);
  const Batch again = dl.val_batch(3);
  EXPECT_EQ(again.inputs, last.inputs);
  dl.next_train_batch();  // training does not move validation
  EXPECT_EQ(dl.val_batch(3).targets, last.targets);
  EXPECT_NE(user_error([&] { dl.val_batch(4); }).find("does not exist"), std::string::npos);
}

TEST(Loader, MaskZeroTargetsAreIgnored) {
  std::vector<int32_t> t(100);
  std::vector<uint8_t> m(100);
  for (int i = 0; i < 100; ++i) {
    t[i] = i;
    m[i] = (i / 10) % 2;  // tokens 10..19, 30..39, ... are trained on
  }
  DataLoader dl({TokenShard::from_memory(t, m, 1, 100)}, {}, opts(2, 8, 9, 0.0));
  for (int step = 0; step < 20; ++step) {
    const Batch b = dl.next_train_batch();
    int64_t count = 0;
    for (int k = 0; k < 16; ++k) {
      const int32_t next = b.inputs[k] + 1;  // the token that follows the input
      if ((next / 10) % 2 == 1) {
        EXPECT_EQ(b.targets[k], next);
        ++count;
      } else {
        EXPECT_EQ(b.targets[k], kIgnoreIndex);
      }
    }
    EXPECT_EQ(b.target_count, count);
  }
}

TEST(Loader, RanksSplitTheGlobalBatch) {
  const std::vector<ShardPtr> shards = {counting_shard(5000)};
  LoaderOptions one = opts(8, 16, 11);
  DataLoader global(shards, {}, one);
  LoaderOptions o0 = opts(4, 16, 11), o1 = opts(4, 16, 11);
  o0.world_size = o1.world_size = 2;
  o1.rank = 1;
  DataLoader r0(shards, {}, o0), r1(shards, {}, o1);
  for (int step = 0; step < 3; ++step) {
    const Batch g = global.next_train_batch();
    std::vector<int32_t> joined = r0.next_train_batch().inputs;
    const std::vector<int32_t> second = r1.next_train_batch().inputs;
    joined.insert(joined.end(), second.begin(), second.end());
    EXPECT_EQ(joined, g.inputs);
  }
  EXPECT_EQ(r0.state_json(), r1.state_json());
}

TEST(Loader, ClearErrors) {
  std::string msg = user_error([] { DataLoader dl({counting_shard(100)}, {}, opts(2, 128)); });
  EXPECT_NE(msg.find("fewer than one window"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lower the sequence length"), std::string::npos) << msg;
  msg = user_error([] {
    DataLoader dl({counting_shard(1000, 1 << 20, 1), counting_shard(1000, 1 << 20, 2)}, {},
                  opts(2, 16));
  });
  EXPECT_NE(msg.find("different tokenizer"), std::string::npos) << msg;
  DataLoader dl({counting_shard(1000)}, {}, opts(2, 16));
  DataLoader other({counting_shard(2000)}, {}, opts(2, 16));
  msg = user_error([&] { dl.restore_state(other.state_json()); });
  EXPECT_NE(msg.find("the corpus or its split changed"), std::string::npos) << msg;
  msg = user_error([&] { dl.restore_state("{"); });
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  msg = user_error([&] { dl.restore_state(R"({"format": "lowbit-loader", "version": 1})"); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lowbit::data

// The fused GEMM's k-partition (src/gemm/k_partition.h): every (tile, k-step) in exactly one piece,
// partial-tile slots unique and inside the buffer, part_owner naming exactly the parts that hold a
// tile's pieces (what the reduction reads), and the launcher model's choices at the measured
// shapes.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "gemm/k_partition.h"

namespace lowbit::gemm_kernels {
namespace {

TEST(KPartition, EveryStepOnceSlotsUniqueOwnersExact) {
  for (int64_t tiles : {1, 2, 3, 7, 18, 37}) {
    for (int nk : {1, 2, 3, 5, 8, 256}) {
      const int64_t total = tiles * nk;
      std::set<int64_t> part_counts = {1, tiles, tiles + 1, 2 * tiles, 3 * tiles - 1, total};
      for (int64_t p : {2, 5, 7, 132}) part_counts.insert(p);
      for (int64_t p64 : part_counts) {
        if (p64 < 1 || p64 > total) continue;
        const int parts = static_cast<int>(p64);
        SCOPED_TRACE(testing::Message()
                     << tiles << " tiles, nk " << nk << ", " << parts << " parts");
        std::vector<int> covered(static_cast<size_t>(total), 0);
        std::vector<std::set<int>> holders(static_cast<size_t>(tiles));
        int last_slot = -1;
        for (int j = 0; j < parts; ++j) {
          int pieces = 0;
          for_each_piece(total, parts, nk, j, [&](int t, int kb0, int kb1, int slot) {
            ++pieces;
            ASSERT_TRUE(t >= 0 && t < tiles && kb0 >= 0 && kb0 < kb1 && kb1 <= nk);
            ASSERT_EQ(slot, t + j);
            ASSERT_GT(slot, last_slot) << "slots increase along the line";
            ASSERT_LE(slot, tiles + parts - 2) << "slot outside the tiles + parts - 1 partials";
            last_slot = slot;
            for (int k = kb0; k < kb1; ++k) ++covered[static_cast<size_t>(t * nk + k)];
            holders[static_cast<size_t>(t)].insert(j);
          });
          EXPECT_GE(pieces, 1) << "part " << j << " is empty";
        }
        for (int64_t i = 0; i < total; ++i) ASSERT_EQ(covered[static_cast<size_t>(i)], 1) << i;
        for (int64_t t = 0; t < tiles; ++t) {
          const int j0 = part_owner(total, parts, t * nk);
          const int j1 = part_owner(total, parts, t * nk + nk - 1);
          std::set<int> want;
          for (int j = j0; j <= j1; ++j) want.insert(j);
          EXPECT_EQ(holders[static_cast<size_t>(t)], want) << "tile " << t;
        }
      }
    }
  }
}

// Equal splits (parts = s · tiles) cut every tile into s pieces at the same k-steps.
TEST(KPartition, MultiplesOfTheTileCountAreEqualSplits) {
  const int64_t tiles = 18;
  const int nk = 256, s = 7, parts = s * 18;
  for (int j = 0; j < parts; ++j) {
    int count = 0;
    for_each_piece(tiles * nk, parts, nk, j, [&](int t, int kb0, int kb1, int) {
      ++count;
      EXPECT_EQ(t, j / s);
      EXPECT_EQ(kb0, nk * (j % s) / s);
      EXPECT_EQ(kb1, nk * (j % s + 1) / s);
    });
    EXPECT_EQ(count, 1);
  }
}

// The model's picks on 132 SMs at the 124m / 1b wgrads it was fitted to (tiles of 128 × 256, K =
// 16384 tokens: nk = 256): qkv (54 tiles) 132 parts, proj (18) 7 splits = 126, fc1 (72) 132; a
// problem with about one tile per SM (1b proj, 128) and one with more keep whole tiles.
TEST(KPartition, ModelPicksAtTheMeasuredShapes) {
  struct Pick {
    int64_t tiles, nk;
    int parts;
  };
  for (const Pick& c : {Pick{54, 256, 132}, Pick{18, 256, 126}, Pick{72, 256, 132},
                        Pick{128, 256, 0}, Pick{384, 12, 0}, Pick{0, 256, 0}}) {
    EXPECT_EQ(k_partition_for(c.tiles, c.nk, 132), c.parts) << c.tiles << " tiles, nk " << c.nk;
  }
  const int p = k_partition_for(4, 4, 132);  // tiny problems still get a valid partition
  EXPECT_TRUE(p == 0 || (p > 4 && p <= 16));
}

}  // namespace
}  // namespace lowbit::gemm_kernels

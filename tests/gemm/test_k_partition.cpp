// The fused GEMM's k-partition (src/gemm/k_partition.h): every (tile, k-step) in exactly one piece,
// partial-tile slots unique and inside the buffer, part_owner / tile_slots naming exactly the
// pieces of a tile (what the reduction reads), the column parts running side by side, and the
// launcher model's choices at the measured shapes.
#include <gtest/gtest.h>

#include <array>
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

// The column layout (for_each_column_piece, tile_slots, partial_tiles): every (row tile, column
// tile, k-step) in exactly one piece, slots unique and inside the partial buffer, tile_slots naming
// exactly the slots a tile's pieces wrote (in part order), and the parts that run side by side
// (same j / tiles_c) over the same row tiles and k-steps.
TEST(KPartition, ColumnPartsCoverOnceShareRowsAndSlotsAreExact) {
  for (int tiles_r : {1, 2, 6, 18}) {
    for (int tiles_c : {1, 2, 3}) {
      for (int nk : {1, 3, 8, 256}) {
        const int64_t line = int64_t(tiles_r) * nk;
        for (int64_t q64 : {int64_t{1}, int64_t{2}, int64_t{tiles_r}, int64_t{tiles_r} + 1,
                            int64_t{3} * tiles_r, int64_t{44}, line}) {
          if (q64 < 1 || q64 > line) continue;
          const int q = static_cast<int>(q64), parts = q * tiles_c;
          SCOPED_TRACE(testing::Message() << tiles_r << "x" << tiles_c << " tiles, nk " << nk
                                          << ", " << parts << " parts");
          const int64_t slots = partial_tiles(tiles_r, tiles_c, parts);
          std::vector<int> covered(static_cast<size_t>(line * tiles_c), 0);
          std::vector<int> written(static_cast<size_t>(slots), 0);
          std::vector<std::vector<int>> tile_writes(static_cast<size_t>(tiles_r * tiles_c));
          std::vector<std::vector<std::array<int, 3>>> col0(static_cast<size_t>(q));
          for (int j = 0; j < parts; ++j) {
            std::vector<std::array<int, 3>> seq;
            for_each_column_piece(
                tiles_r, tiles_c, nk, parts, j, [&](int r, int c, int kb0, int kb1, int slot) {
                  ASSERT_EQ(c, j % tiles_c);
                  ASSERT_TRUE(r >= 0 && r < tiles_r && kb0 >= 0 && kb0 < kb1 && kb1 <= nk);
                  ASSERT_TRUE(slot >= 0 && slot < slots) << slot;
                  ++written[static_cast<size_t>(slot)];
                  tile_writes[static_cast<size_t>(r * tiles_c + c)].push_back(slot);
                  for (int k = kb0; k < kb1; ++k) {
                    ++covered[static_cast<size_t>((c * tiles_r + r) * nk + k)];
                  }
                  seq.push_back({r, kb0, kb1});
                });
            if (j % tiles_c == 0) {
              col0[static_cast<size_t>(j / tiles_c)] = seq;
            } else {
              EXPECT_EQ(seq, col0[static_cast<size_t>(j / tiles_c)])
                  << "part " << j << " does not run beside part " << j - j % tiles_c;
            }
          }
          for (size_t i = 0; i < covered.size(); ++i) ASSERT_EQ(covered[i], 1) << i;
          for (size_t i = 0; i < written.size(); ++i) EXPECT_LE(written[i], 1) << "slot " << i;
          for (int r = 0; r < tiles_r; ++r) {
            for (int c = 0; c < tiles_c; ++c) {
              int slot0 = -1, count = 0;
              tile_slots(tiles_r, tiles_c, nk, parts, r, c, &slot0, &count);
              std::vector<int> want(static_cast<size_t>(count));
              for (int i = 0; i < count; ++i) want[static_cast<size_t>(i)] = slot0 + i;
              EXPECT_EQ(tile_writes[static_cast<size_t>(r * tiles_c + c)], want)
                  << "tile " << r << ", " << c;
            }
          }
        }
      }
    }
  }
}

// Forced counts (tests, --fused-parts) become counts the kernel accepts: a multiple of the
// column tiles with 1 ≤ parts / tiles_c ≤ tiles_r · nk, n itself when it already is one.
TEST(KPartition, ValidPartsAreAcceptedCounts) {
  for (int64_t tr : {1, 2, 3, 18}) {
    for (int64_t tc : {1, 2, 3}) {
      for (int64_t nk : {1, 10, 256}) {
        for (int64_t n = 2; n <= 400; ++n) {
          const int64_t p = valid_parts(n, tr, tc, nk);
          ASSERT_EQ(p % tc, 0) << n;
          ASSERT_TRUE(p / tc >= 1 && p / tc <= tr * nk) << n << " → " << p;
          if (n % tc == 0 && n / tc <= tr * nk) ASSERT_EQ(p, n);
          if (n >= tc && n / tc <= tr * nk) ASSERT_LE(p, n) << "rounded down";
        }
      }
    }
  }
}

// The model's picks on 132 SMs at the 124m / 1b wgrads it was fitted to (tiles of 128 × 256, K =
// 16384 tokens: nk = 256): qkv (18 × 3 tiles) 132 parts, proj (6 × 3) 7 splits = 126, fc1 (24 × 3)
// 132; a problem with about one tile per SM (1b proj, 16 × 8) and one with more keep whole
// tiles. Every pick is a multiple of the column tiles.
TEST(KPartition, ModelPicksAtTheMeasuredShapes) {
  struct Pick {
    int64_t tiles_r, tiles_c, nk;
    int parts;
  };
  for (const Pick& c : {Pick{18, 3, 256, 132}, Pick{6, 3, 256, 126}, Pick{24, 3, 256, 132},
                        Pick{16, 8, 256, 0}, Pick{128, 3, 12, 0}, Pick{0, 3, 256, 0}}) {
    EXPECT_EQ(k_partition_for(c.tiles_r, c.tiles_c, c.nk, 132), c.parts)
        << c.tiles_r << "x" << c.tiles_c << " tiles, nk " << c.nk;
  }
  for (int64_t tr = 1; tr <= 20; ++tr) {
    for (int64_t tc = 1; tc <= 6; ++tc) {
      const int p = k_partition_for(tr, tc, 40, 132);
      EXPECT_TRUE(p == 0 || (p % tc == 0 && p / tc <= tr * 40 && p <= 16 * tr * tc))
          << tr << "x" << tc << ": " << p;
    }
  }
}

}  // namespace
}  // namespace lowbit::gemm_kernels

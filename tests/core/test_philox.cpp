// Philox4x32-10 against the published known-answer vectors (Random123 kat_vectors), and the
// stream layout lowbit relies on (element i ↔ word i % 4 of block i / 4).
#include <gtest/gtest.h>

#include <cmath>

#include "lowbit/core/philox.h"

namespace lowbit {
namespace {

TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  } kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const Philox4 r =
        philox4x32_10(Philox4{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << "word " << i;
  }
}

TEST(Philox, ElementIndexAddressesWordsOfBlocks) {
  const uint64_t seed = 0x0123456789ABCDEFull, offset = 0xFEDCBA9876543210ull;
  for (uint64_t g : {0ull, 1ull, 12345ull, (1ull << 40) + 3}) {
    const Philox4 b = philox_block(seed, offset, g);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(philox_uint32(seed, offset, 4 * g + w), b.v[w]);
  }
  // Distinct offsets and seeds give distinct streams.
  EXPECT_NE(philox_uint32(1, 0, 0), philox_uint32(1, 1, 0));
  EXPECT_NE(philox_uint32(1, 0, 0), philox_uint32(2, 0, 0));
}

TEST(Philox, UniformMomentsAndRange) {
  double sum = 0, sum2 = 0;
  const int n = 1 << 18;
  for (int i = 0; i < n; ++i) {
    const float u = philox_uniform(42, 3, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sum2 += static_cast<double>(u) * u;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(var, 1.0 / 12, 0.002);
}

}  // namespace
}  // namespace lowbit

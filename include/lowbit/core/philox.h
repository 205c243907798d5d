// Philox4x32-10 counter-based RNG (Salmon et al., SC'11), identical on host and device.
//
// Every random number in lowbit is keyed by (seed, offset, logical element index) — never by
// thread or block id — so a CUDA kernel and its CPU twin draw the same bits for the same
// element. Element i uses word (i % 4) of the block with counter
//   {lo32(i / 4), hi32(i / 4), lo32(offset), hi32(offset)} and key {lo32(seed), hi32(seed)}.
// `offset` separates independent streams under one seed (one per quantization call, say).
#pragma once

#include <cstdint>

#include "lowbit/core/hd.h"

namespace lowbit {

struct Philox4 {
  uint32_t v[4];
};

LOWBIT_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// One Philox4x32 block with 10 rounds.
LOWBIT_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, ctr.v[0], hi0, lo0);
    philox_mulhilo(kM1, ctr.v[2], hi1, lo1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The four 32-bit words for elements 4·group … 4·group+3 of stream (seed, offset).
LOWBIT_HD Philox4 philox_block(uint64_t seed, uint64_t offset, uint64_t group) {
  Philox4 ctr{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
               static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// 32 random bits for logical element `index` of stream (seed, offset).
LOWBIT_HD uint32_t philox_uint32(uint64_t seed, uint64_t offset, uint64_t index) {
  return philox_block(seed, offset, index >> 2).v[index & 3];
}

// Uniform float in [0, 1) with 24 random bits.
LOWBIT_HD float philox_uniform(uint64_t seed, uint64_t offset, uint64_t index) {
  return static_cast<float>(philox_uint32(seed, offset, index) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace lowbit

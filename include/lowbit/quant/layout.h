// Index arithmetic of the GEMM-ready scale layouts (formats.md §2.4, §4.5, §4.6), for host and
// device. All sizes and offsets are in elements of the scale tensor.
#pragma once

#include <cstdint>

#include "lowbit/core/hd.h"

namespace lowbit {

LOWBIT_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
LOWBIT_HD int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
LOWBIT_HD int64_t pad4(int64_t a) { return round_up(a, 4); }
LOWBIT_HD int64_t pad128(int64_t a) { return round_up(a, 128); }

// FP8 1D blocks (cuBLASLt VEC128_32F): operand with `rows` non-contracted rows and
// ceil(K/128) K-blocks; scale (r, kb) at kb · pad4(rows) + r — K-block major, rows contiguous.
// Tensor shape [ceil(K/128), pad4(rows)] f32.
LOWBIT_HD int64_t vec128_scale_index(int64_t r, int64_t kb, int64_t rows) {
  return kb * pad4(rows) + r;
}

// FP8 2D blocks (cuBLASLt BLK128x128_32F): scale (rb, kb) at rb · pad4(k_blocks) + kb —
// row-block major, K-block index padded to a multiple of 4. Shape [ceil(R/128), pad4(KB)] f32.
LOWBIT_HD int64_t blk128_scale_index(int64_t rb, int64_t kb, int64_t k_blocks) {
  return rb * pad4(k_blocks) + kb;
}

// Blackwell block-scale swizzle (VEC32_UE8M0 and VEC16_UE4M3, formats.md §4.6): scales S[r][c]
// (r = operand row, c = K-block) padded to pad128(R) × pad4(C) and cut into 128×4 tiles of
// 512 bytes, tiles row-major over (r/128, c/4); inside a tile row r%32 holds 16 bytes: the four
// 32-row groups ((r%128)/32) side by side, 4 K-blocks each. Equivalent scalar loop:
//   for r, c: out[((r/128)·(C'/4) + c/4)·512 + (r%32)·16 + ((r%128)/32)·4 + c%4] = S[r][c]
LOWBIT_HD int64_t swizzled_scale_offset(int64_t r, int64_t c, int64_t padded_cols) {
  return ((r / 128) * (padded_cols / 4) + (c / 4)) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 +
         (c % 4);
}

}  // namespace lowbit

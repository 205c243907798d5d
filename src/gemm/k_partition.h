// The fused MX / NVFP4 GEMM's k-partition (fused_dequant_gemm.cu), shared by its kernels (device)
// and its launcher and tests (host).
//
// When there are fewer output tiles than SMs, the work is cut along k into `parts` parts, one per
// CTA, a multiple of the column tiles: part j works on column tile c = j % tiles_c, and the
// parts of one column cut that column's k-steps, laid in one line (row tile r's steps at r·nk …
// r·nk + nk - 1), into q = parts / tiles_c contiguous ranges of equal length ± 1. The tiles_c parts
// with the same j / tiles_c therefore read the same A' rows and k-steps at the same time, so that
// the columns' reads of an A' panel fall close together in L2 (one line over every tile spread
// them over the whole kernel: the 124m MXFP8 qkv wgrad read 230 MB from DRAM for 63 MB of
// operands, 171 MB with the columns side by side; bench/results/h100-2026-11-27/
// wgrad-dram-1145, wgrad-column-parts-1150). Equal lengths, where equal splits
// per tile can leave a second, partly idle wave (124m fc1 wgrad, 72 tiles × 3 splits on 132 SMs).
//
// In a column's line, part i starts at part_start(i); its piece of row tile r writes that
// column's partial slot r + i (slots increase along the line, so each is written once; a column
// has tiles_r + q - 1 of them, after those of the columns before it), and the reduction adds the
// pieces of a tile in the order of i (deterministic). With q = s · tiles_r every piece is a whole
// s-th of one tile (equal splits).
#pragma once

#include <cstdint>

#include "lowbit/core/hd.h"

namespace lowbit::gemm_kernels {

// First step of part j (0 ≤ j ≤ parts; part_start(parts) = total). Needs total · parts < 2^63.
LOWBIT_HD int64_t part_start(int64_t total, int parts, int64_t j) { return total * j / parts; }

// The part that holds step `pos` of the line: the largest j with part_start(j) ≤ pos.
LOWBIT_HD int part_owner(int64_t total, int parts, int64_t pos) {
  return static_cast<int>(((pos + 1) * parts - 1) / total);
}

// Calls f(t, kb_begin, kb_end, slot) for each piece of part j, in order: steps [kb_begin, kb_end)
// of tile t, written to partial tile `slot` = t + j.
template <typename F>
LOWBIT_HD void for_each_piece(int64_t total, int parts, int nk, int j, F&& f) {
  int64_t pos = part_start(total, parts, j);
  const int64_t end = part_start(total, parts, j + 1);
  while (pos < end) {
    const int t = static_cast<int>(pos / nk);
    const int kb0 = static_cast<int>(pos - int64_t(t) * nk);
    const int64_t rest = kb0 + (end - pos);
    const int kb1 = static_cast<int>(rest < nk ? rest : nk);
    f(t, kb0, kb1, t + j);
    pos += kb1 - kb0;
  }
}

// The partial tiles (128 × 256 f32) of a k-partition into `parts` parts: tiles_r + q - 1 per
// column.
LOWBIT_HD int64_t partial_tiles(int tiles_r, int tiles_c, int parts) {
  return parts > 0 ? int64_t(tiles_c) * (int64_t(tiles_r) + parts / tiles_c - 1) : 0;
}

// A part count the kernel accepts for a requested n > 1 (tests, the bench's --fused-parts): n
// rounded down to a multiple of tiles_c, but at least one part per column and at most one per
// k-step of a column (q = parts / tiles_c in [1, tiles_r · nk]).
inline int64_t valid_parts(int64_t n, int64_t tiles_r, int64_t tiles_c, int64_t nk) {
  const int64_t q = n / tiles_c, line = tiles_r * nk;
  return (q < 1 ? 1 : q > line ? line : q) * tiles_c;
}

// Calls f(r, c, kb_begin, kb_end, slot) for each piece of part j (0 ≤ j < parts, parts a multiple
// of tiles_c), in order: steps [kb_begin, kb_end) of the tile at row r, column c, written to
// partial tile `slot`.
template <typename F>
LOWBIT_HD void for_each_column_piece(int tiles_r, int tiles_c, int nk, int parts, int j, F&& f) {
  const int q = parts / tiles_c, c = j % tiles_c;
  const int64_t first = int64_t(c) * (int64_t(tiles_r) + q - 1);
  for_each_piece(int64_t(tiles_r) * nk, q, nk, j / tiles_c, [&](int r, int kb0, int kb1, int s) {
    f(r, c, kb0, kb1, static_cast<int>(first + s));
  });
}

// The partial tiles that hold the pieces of the tile at row r, column c: slots *slot0 … *slot0 +
// *count - 1, in the order of their parts.
LOWBIT_HD void tile_slots(int tiles_r, int tiles_c, int nk, int parts, int r, int c, int* slot0,
                          int* count) {
  const int q = parts / tiles_c;
  const int64_t total = int64_t(tiles_r) * nk;
  const int i0 = part_owner(total, q, int64_t(r) * nk);
  const int i1 = part_owner(total, q, int64_t(r) * nk + nk - 1);
  *slot0 = static_cast<int>(int64_t(c) * (int64_t(tiles_r) + q - 1) + r + i0);
  *count = i1 - i0 + 1;
}

// The part count the launcher picks for tiles_r × tiles_c output tiles of nk k-steps on `sms` SMs
// (0: whole tiles; else a multiple of tiles_c), by a model of its time in µs on an H100 (kernel
// + reduction), fitted to the 124m wgrads timed back to back with each partition forced
// (bench/results/h100-2026-11-27/wgrad-parts-1010): a k-step of one CTA ≈ 0.76; per part ≈ 3.6
// steps more when the parts are aligned to the tiles (q = s · tiles_r: one piece per part),
// ≈ 12.4 when they are not (a piece that ends mid-tile is followed by a second epilogue and
// pipeline fill on the same CTA); the reduction ≈ 0.045 per partial tile. Measured (µs per call,
// with the B' copy): qkv 108 unaligned against 116 aligned (2 splits), proj 47–48 aligned (7)
// against 49, fc1 135 unaligned against 148–152 (3 splits in two waves).
inline int k_partition_for(int64_t tiles_r, int64_t tiles_c, int64_t nk, int64_t sms) {
  const int64_t tiles = tiles_r * tiles_c;
  if (tiles_r <= 0 || tiles_c <= 0 || nk <= 0 || tiles >= sms) return 0;
  constexpr double kStep = 0.76, kAligned = 3.6, kUnaligned = 12.4, kPartial = 0.045;
  int best = 0;
  double best_t = (double(nk) + kAligned) * kStep;
  const auto consider = [&](int64_t p, double t) {
    if (t < best_t) {
      best = static_cast<int>(p);
      best_t = t;
    }
  };
  for (int64_t s = 2; s <= 16 && s <= nk; ++s) {
    const int64_t p = s * tiles, waves = (p + sms - 1) / sms;
    consider(p, double(waves) * (double(nk) / double(s) + kAligned) * kStep + double(p) * kPartial);
  }
  const int64_t line = tiles_r * nk;  // one column's steps
  for (int64_t q = tiles_r + 1; q * tiles_c <= sms && q <= line; ++q) {
    if (q % tiles_r == 0) continue;  // aligned: above
    const int64_t p = q * tiles_c;
    consider(p, (double((line + q - 1) / q) + kUnaligned) * kStep +
                    double(tiles_c * (tiles_r + q - 1)) * kPartial);
  }
  return best;
}

}  // namespace lowbit::gemm_kernels

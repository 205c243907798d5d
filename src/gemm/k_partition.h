// The fused MX / NVFP4 GEMM's k-partition (fused_dequant_gemm.cu), shared by its kernels (device)
// and its launcher and tests (host).
//
// When there are fewer output tiles than SMs, the tiles' k-steps are laid in one line (tile t's
// steps at t·nk … t·nk + nk - 1) and cut into `parts` contiguous ranges of equal length ± 1, one
// per CTA, so that every SM gets the same work (equal splits per tile can leave a second, partly
// idle wave: 124m fc1 wgrad, 72 tiles × 3 splits on 132 SMs). Part j starts at part_start(j); the
// piece of tile t in part j writes partial tile slot t + j (slots increase along the line, so
// each is written once; there are tiles + parts - 1 of them), and the reduction adds the pieces
// of tile t in the order of j (deterministic). With parts = s · tiles every piece is a whole
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

// The part count the launcher picks for `tiles` output tiles of nk k-steps on `sms` SMs (0: whole
// tiles), by a model of its time in µs on an H100 (kernel + reduction), fitted to the 124m wgrads
// timed back to back with each partition forced (bench/results/h100-2026-11-27/
// wgrad-parts-1010): a k-step of one CTA ≈ 0.76; per part ≈ 3.6 steps more when the parts are
// aligned to the tiles (P = s · tiles: one piece per part), ≈ 12.4 when they are not (a piece
// that ends mid-tile is followed by a second epilogue and pipeline fill on the same CTA); the
// reduction ≈ 0.045 per partial tile. Measured (µs per call, with the B' copy): qkv 108
// unaligned against 116 aligned (2 splits), proj 47–48 aligned (7) against 49, fc1 135
// unaligned against 148–152 (3 splits in two waves).
inline int k_partition_for(int64_t tiles, int64_t nk, int64_t sms) {
  if (tiles <= 0 || nk <= 0 || tiles >= sms) return 0;
  const int64_t total = tiles * nk;
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
  for (int64_t p = tiles + 1; p <= sms && p <= total; ++p) {
    if (p % tiles == 0) continue;  // aligned: above
    consider(p, (double((total + p - 1) / p) + kUnaligned) * kStep + double(p + tiles) * kPartial);
  }
  return best;
}

}  // namespace lowbit::gemm_kernels

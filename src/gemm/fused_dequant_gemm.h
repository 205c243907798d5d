// The emulated MX / NVFP4 GEMM of Hopper with the dequantization of A' in the GEMM's mainloop
// (src/gemm/fused_dequant_gemm.cu): A''s codes and block scales are read once, converted in
// registers into the wgmma A fragments, and never written back as a 16-bit copy; B' is
// dequantized beforehand (dequant_b_permuted) into a 16-bit copy whose k order inside every 64
// matches the fragments'. Raw device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm/gemm_cuda_kernels.h"

namespace lowbit::gemm_kernels {

// What A' holds, and the 16-bit type both operands are multiplied in.
enum class FusedKind : uint8_t {
  kNvfp4,  // E2M1 codes (two per byte, even k in the low nibble), UE4M3 scale per 16; f16
  kE4M3,   // MX: E4M3 codes, E8M0 scale per 32; bf16
  kE5M2,   // MX: E5M2 codes, E8M0 scale per 32; bf16
};

// Tile and alignment rules of the fused kernel: R % 128, C % 256, K % 64 (MX: K % 128, so that
// every row's scales are 4-byte aligned).
constexpr int64_t kFusedTileR = 128, kFusedTileC = 256;
bool fused_gemm_shape_ok(FusedKind kind, int64_t R, int64_t C, int64_t K);

// out [R, C] = alpha_eff · Σ_k A'[r, k] · B'[c, k] (+ beta · c) (+ bias[c]), fp32 accumulation,
// one rounding to out's type.
//   A' [R, K]: codes [R, K/2] (NVFP4) or [R, K] (MX), K-contiguous; scales [R, K/16] UE4M3 or
//     [R, K/32] E8M0 (the compact rowwise layouts of quant_layout()).
//   B' [C, K]: b_perm from dequant_b_permuted with the same kind (f16 values · 2^-14 for NVFP4,
//     bf16 for MX), k permuted within every 64.
//   alpha_eff: NVFP4: *alpha_dev · 2^28 (alpha_dev = the NVFP4 alpha' of Nvfp4Alpha; the 2^28
//     undoes the 2^-14 that each f16 operand carries); MX: alpha.
//   beta: 0, or the term beta · c read from `c` (out's dtype and layout; null = out itself).
//   bias: [C] bf16 or f32, or null.
// Preconditions: fused_gemm_shape_ok; pointers 16-byte aligned; ldd % 8 == 0; launched right
// after the dequant_b_permuted that writes its B' (same stream, nothing between): a short kernel
// with a small B' starts reading A' before it waits for that launch (A' is older than it).
struct FusedGemmArgs {
  FusedKind kind = FusedKind::kNvfp4;
  const uint8_t* a_codes = nullptr;
  const uint8_t* a_scales = nullptr;
  const uint16_t* b_perm = nullptr;
  int64_t R = 0, C = 0, K = 0;
  const float* alpha_dev = nullptr;
  float alpha = 1.0f, beta = 0.0f;
  const void* c = nullptr;
  void* out = nullptr;
  bool out_f32 = false;
  int64_t ldd = 0;
  const void* bias = nullptr;
  bool bias_bf16 = true;
  int max_ctas = 0;  // persistent grid size cap (0: one CTA per SM); tests use it
  // k-partition (gemm/k_partition.h): parts > 0, a multiple of the column tiles C / 256, gives
  // each column tile parts · 256 / C parts that cut its row tiles' k-steps, laid in one line,
  // into equal ranges, one per CTA (a range may end inside a tile and the next begin there: every
  // SM gets the same work when there are fewer tiles than SMs; the columns' parts run side by
  // side over the same A' rows). Each piece writes an f32 partial tile into `partial`
  // (workspace, fused_gemm_partial_tiles × 128 × 256 floats), then a reduction kernel adds the
  // pieces of each tile in a fixed order with beta · c and the bias (deterministic). 0: each CTA
  // computes whole tiles into out. parts · 256 / C ≤ R / 128 · K / 64.
  int parts = 0;
  float* partial = nullptr;
  // With parts > 0 only: out is [C, R] (ldd over R) and receives the transpose of the result
  // (c alike; the bias is indexed by r). The reduction writes it; the kernel is unchanged.
  bool out_transposed = false;
};
// How fused_gemm ran (tests): A''s first stages loaded before the wait for B''s copy (kAFirst).
struct FusedGemmRun {
  bool a_first = false;
};
FusedGemmRun fused_gemm(const FusedGemmArgs& a, cudaStream_t stream);

// SMs of the current device (the persistent grid's size).
int fused_gemm_sm_count();

// The k-partition fused_gemm should use for [R, C] over K (0 when the tiles fill the GPU or
// whole tiles are faster): the cheapest by a model of k-steps per CTA plus the partial tiles'
// traffic.
int fused_gemm_parts(int64_t R, int64_t C, int64_t K);
// Partial tiles (128 × 256 f32 each) that `parts` > 0 needs: R / 128 + parts · 256 / C - 1 per
// column tile.
int64_t fused_gemm_partial_tiles(int64_t R, int64_t C, int parts);

// B' [rows = C, cols = K] dequantized (the job's codes, scales and layout as in DequantJob,
// K-contiguous like every copy; MX B' holds FP8 codes) into out [C, K] 16-bit with the fused
// kernel's k order: element k = 64·kb + 16·c + 4·kk + j is stored at 64·kb + 16·kk + 2·c + (j & 1)
// + 8·(j >> 1). NVFP4 (f16): code · scale · 2^-14, exact; MX (bf16): code · 2^(e−127), as
// dequant_pair_to_bf16 rounds it. With `alpha`, block 0 also writes the NVFP4 alpha' (one
// launch, PDL).
void dequant_b_permuted(const DequantJob& b, FusedKind kind, const Nvfp4Alpha* alpha,
                        cudaStream_t stream);

}  // namespace lowbit::gemm_kernels

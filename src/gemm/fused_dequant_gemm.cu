// The emulated MX / NVFP4 GEMM with A''s dequantization in the mainloop (sm_90a).
//
// Why: dequantizing A' into a bf16 copy and running cuBLASLt's BF16 GEMM writes and re-reads
// 4 bytes per element of the large operand; at the 124m shapes that copy alone keeps the
// emulated GEMM at 0.6–0.7× of BF16 (bench/results/h100-2026-11-26/gemm-dequant-one-launch-1806).
// Here A''s codes (0.5 or 1 byte per element) and scales are read once by TMA and converted in
// registers into wgmma's A fragments; only B' (the weight in fprop / dgrad) is dequantized
// beforehand into a 16-bit copy.
//
// Structure: a persistent kernel, one CTA of three warpgroups per SM, tiles of 128 × 256 outputs
// in k-steps of 64, walked in bands of 16 row tiles (L2 reuse of B' panels); problems with fewer
// tiles than SMs are cut along k into one part per CTA (for_each_work, gemm/k_partition.h: per
// column tile, equal splits of every tile or equal ranges of its row tiles' steps, the columns'
// parts side by side over the same A' rows; f32 partial tiles, then an ordered reduction).
// Warpgroup 0 is the producer: one warp fills a 5-stage ring — A''s codes (TMA, 128 rows × 32 / 64
// bytes), B''s 16-bit panel (TMA, 256 rows × 64, 128-byte swizzle) and A''s scales (cp.async, 4
// bytes per row) — completing a `full` mbarrier per stage (in short kernels with a small B', A' of
// the first five stages goes out before the wait for B''s copy: kAFirst). Warpgroups 1 and 2 each
// own 64 rows × 256 columns (128 fp32 accumulators per thread): per stage they load their codes and
// scales from shared memory, convert them (16 codes of one row per thread and row, one scale),
// issue four wgmma m64n256k16 with A from registers, and release the stage on the `empty` mbarrier
// once the wgmma group reading it has completed (one group in flight, A fragments double-buffered).
// The producer runs ahead into the next tile while the consumers store the current one (through
// swizzled shared memory and TMA stores: direct 4-byte stores from the accumulator layout cost
// ~40 % of the 124m GEMMs' time).
//
// The k order. wgmma's A fragment gives thread (g = lane/4, c = lane%4) of a warp columns
// 2c, 2c+1, 2c+8, 2c+9 of every 16; the GEMM sums over k, so any permutation applied to both
// operands alike leaves the result as it is. Position p = 16·kk + 2c + (j & 1) + 8·(j >> 1) of a
// 64-step holds k = 16c + 4kk + j: each thread's 16 values of a row are then the contiguous
// codes 16c … 16c+15 (one 8- or 16-byte shared load) under one NVFP4 scale (MX: one scale per
// two threads), and B' is stored permuted the same way (dequant_b_permuted).
//
// Exactness (formats.md §3; tests/gpu/test_gemm_gpu.cpp, FusedDequantGemm*):
//  * NVFP4 in f16: an E2M1 code's bits placed at f16 bits 9–11 (magnitude) and 15 (sign) are the
//    code's value · 2^-14 (code 0.5 lands on the f16 subnormal 2^-15); times the UE4M3 scale
//    (exact in f16) the product has ≤ 6 significant bits and lies in [2^-24, 6·448·2^-14]: exact,
//    subnormals included (mul.rn.f16x2 keeps them). B' carries the same 2^-14, the epilogue's
//    alpha the 2^28: a power of two, so alpha'·acc rounds exactly as without it.
//  * MX in bf16: an E4M3 (E5M2) code's bits shifted into bf16 are its value · 2^-120 (2^-112);
//    two bf16 multiplies by powers of two (2^min(t, 127), then the rest) give value · 2^(e−127)
//    with one rounding, as the f32 product rounded to bf16 does. NaN / inf codes and NaN scales
//    take a per-element path through decode() (rare: the quantizers emit them only for NaN
//    input).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/device_attr.h"
#include "core/pdl.cuh"
#include "core/tma.cuh"
#include "core/tma.h"
#include "core/wgmma.cuh"
#include "gemm/fused_dequant_gemm.h"
#include "gemm/k_partition.h"
#include "gemm/nvfp4_alpha.cuh"
#include "lowbit/core/cuda_check.h"
#include "lowbit/core/dtype.h"
#include "lowbit/formats.h"
#include "lowbit/quant/rn_ops.h"

namespace lowbit::gemm_kernels {
namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64;
constexpr int kChunkBytes = 8192;       // one output chunk: 64 rows × 128 bytes
constexpr int kThreads = 384;           // producer warpgroup + two consumer warpgroups
constexpr int kBBytes = kBN * kBK * 2;  // B' panel per stage: 256 rows × 128 bytes
constexpr int kScaleBytes = kBM * 4;    // A' scales per stage: 4 bytes per row
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
// setmaxnreg.inc draws only on what the CTA's own setmaxnreg.dec released (an increase beyond it
// waits forever): 128 producer threads give up 168 − 40, 256 consumer threads take 232 − 168.
static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168),
              "setmaxnreg: the consumers' increase must fit what the producers release");

template <FusedKind K>
constexpr int code_row_bytes() {
  return K == FusedKind::kNvfp4 ? kBK / 2 : kBK;
}
template <FusedKind K>
constexpr int stage_bytes() {  // B' panel first (1024-byte aligned for the swizzle), codes, scales
  return (kBBytes + kBM * code_row_bytes<K>() + kScaleBytes + 1023) / 1024 * 1024;
}
// Ring depth 5 and output chunk buffers per consumer warpgroup, within 227 KiB: NVFP4 two
// (a chunk is written while the one before is stored), MX one (its stages hold 8 KiB of codes;
// 4 stages with two buffers measured the same).
constexpr int kStages = 5;
template <FusedKind K>
constexpr int epi_buffers() {
  return K == FusedKind::kNvfp4 ? 2 : 1;
}
template <FusedKind K>
constexpr int epi_bytes() {
  return 2 * epi_buffers<K>() * kChunkBytes;
}
template <FusedKind K>
constexpr int smem_bytes() {  // stages, output chunks, 2·stages mbarriers, slack to align to 1024
  return kStages * stage_bytes<K>() + epi_bytes<K>() + 2 * kStages * 8 + 1024;
}
static_assert(smem_bytes<FusedKind::kNvfp4>() <= 232448 && smem_bytes<FusedKind::kE4M3>() <= 232448,
              "shared memory per block on sm_90");

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Volatile so that they stay after the mbarrier wait that makes the stage's bytes visible.
__device__ __forceinline__ uint4 lds_v4(uint32_t a) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"(a));
  return r;
}
__device__ __forceinline__ uint2 lds_v2(uint32_t a) {
  uint2 r;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(a));
  return r;
}
__device__ __forceinline__ uint32_t lds_u8(uint32_t a) {
  uint32_t r;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(r) : "r"(a));
  return r;
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
// The barrier's arrival fires when this thread's earlier cp.async copies have landed; .noinc:
// the arrival counts against the barrier's expected count (33 per stage: see the kernel).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// d [64 × 256 f32] (+)= A [64 × 16] (registers, the m16n8k16 A fragment of each warp's 16 rows)
// · B [256 × 16] (shared, K-major, 128-byte swizzle). kF16: f16 operands, else bf16.
#define LOWBIT_F8(d, i)                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define LOWBIT_D128(d)                                                                            \
  LOWBIT_F8(d, 0), LOWBIT_F8(d, 8), LOWBIT_F8(d, 16), LOWBIT_F8(d, 24), LOWBIT_F8(d, 32),         \
      LOWBIT_F8(d, 40), LOWBIT_F8(d, 48), LOWBIT_F8(d, 56), LOWBIT_F8(d, 64), LOWBIT_F8(d, 72),   \
      LOWBIT_F8(d, 80), LOWBIT_F8(d, 88), LOWBIT_F8(d, 96), LOWBIT_F8(d, 104), LOWBIT_F8(d, 112), \
      LOWBIT_F8(d, 120)
#define LOWBIT_R128                                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
  "%127}"

template <bool kF16>
__device__ __forceinline__ void mma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                  uint64_t desc_b, int accumulate) {
#if !LOWBIT_SM90A
  __trap();
#else
  if constexpr (kF16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " LOWBIT_R128
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : LOWBIT_D128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " LOWBIT_R128
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : LOWBIT_D128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
#endif
}

// Keeps registers live and in place across an asynchronous wgmma (which reads the A fragment
// and writes the accumulators after the instruction that issued it has retired).
__device__ __forceinline__ void keep(uint32_t (&r)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
  }
}
__device__ __forceinline__ void keep(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; i += 4) {
    asm volatile("" : "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])::"memory");
  }
}

// ---- Code conversion (see the file comment for why each is exact) ---------------------------

// UE4M3 scale → f16x2 (both halves). Bits << 7 are the value · 2^-8 in f16 (subnormal scales
// included), times 256 exactly; codes ≥ 0x7F are NaN (decode(kUE4M3)).
__device__ __forceinline__ uint32_t ue4m3_f16x2(uint32_t b) {
  const uint32_t h = (b << 7) | (b << 23);
  return b >= 0x7Fu ? 0x7E007E00u : mul_f16x2(h, 0x5C005C00u);  // 0x5C00 = 256
}

// One row's 8 code bytes (16 E2M1 codes, k = 16c … 16c+15 of the step) → v[i] = the two codes of
// byte i as f16 · 2^-14 · scale.
__device__ __forceinline__ void nvfp4_row(uint2 w, uint32_t s2, uint32_t (&v)[8]) {
  const uint32_t ws[2] = {w.x, w.y};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t x = ws[h];
    // Per byte: even code → s·0mmm at bits 6, 0–2 of qe; odd code likewise in qo.
    const uint32_t qe = ((x & 0x08080808u) << 3) | (x & 0x07070707u);
    const uint32_t qo = ((x >> 4) & 0x07070707u) | ((x >> 1) & 0x40404040u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // [qe byte j, 0, qo byte j, 0] (selector 8 replicates bit 7 of qe byte 0, which is 0).
      const uint32_t r = prmt(qe, qo, 0x8480u + 0x0101u * j);
      v[4 * h + j] = mul_f16x2(r << 9, s2);
    }
  }
}

// One row's 16 MX code bytes (k = 16c … 16c+15) with E8M0 scale e → v[2·kk + h] = codes
// 4kk + 2h, 4kk + 2h + 1 as bf16 · 2^(e−127).
template <bool kE5M2>
__device__ __forceinline__ void mx_row(uint4 w, uint32_t e, DType t, uint32_t (&v)[8]) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  // Codes with an all-ones exponent (E4M3 NaN; E5M2 inf / NaN) or a NaN scale: exact slow path.
  const uint32_t mask = kE5M2 ? 0x7C7C7C7Cu : 0x7F7F7F7Fu;
  const uint32_t inc = kE5M2 ? 0x04040404u : 0x01010101u;
  uint32_t special = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) special |= ((ws[i] & mask) + inc) & 0x80808080u;
  if (special != 0 || e == 0xFFu) {
    const float f = decode_e8m0(static_cast<uint8_t>(e));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t wd = ws[i >> 1];
      const uint32_t b0 = (wd >> (16 * (i & 1))) & 0xFFu, b1 = (wd >> (16 * (i & 1) + 8)) & 0xFFu;
      const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(mul_rn(decode(t, b0), f)));
      const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(mul_rn(decode(t, b1), f)));
      v[i] = lo | (hi << 16);
    }
    return;
  }
  // value · 2^(e−127) = bits-value · 2^(e − 127 + 120) (E5M2: + 112) = · 2^t1 · 2^t2.
  const int t0 = static_cast<int>(e) - (kE5M2 ? 15 : 7);
  const int t1 = t0 < 127 ? t0 : 127, t2 = t0 - t1;  // t1 ∈ [-15, 127], t2 ∈ [0, 120]
  const uint32_t f1 = uint32_t(t1 + 127) << 7, f2 = uint32_t(t2 + 127) << 7;
  const uint32_t s1 = f1 | (f1 << 16), s2 = f2 | (f2 << 16);
  // Per pair of codes b0, b1 (bytes 2h, 2h+1 of a word): q's halves are b · 0x0101 with the
  // high byte replaced by b's sign replicated (prmt's sign mode), so q << 4 (E5M2: 5) holds the
  // sign at bit 15 (and the bits below it that the mask clears) and the magnitude at bits 4–10
  // (5–11): 3 instructions per pair where separate sign and magnitude masks took 5.
  constexpr int kShift = kE5M2 ? 5 : 4;
  constexpr uint32_t kMask = kE5M2 ? 0x8FE08FE0u : 0x87F087F0u;
  uint32_t x[8];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t q = prmt(ws[kk], 0u, h ? 0xB3A2u : 0x9180u);
      x[2 * kk + h] = (q << kShift) & kMask;
    }
  }
  if (t2 == 0) {  // scales up to 2^7 (E5M2: 2^15): one multiply
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = mul_bf16x2(x[i], s1);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = mul_bf16x2(mul_bf16x2(x[i], s1), s2);
  }
}

// Tile t's output origin. Tiles go in bands of kBand row tiles: down the band first, then
// across the columns, so that the CTAs resident at once share a few B' panels and a few A' row
// blocks in L2 (row-major order streams all of B' once per row tile: 124m's LM head, whose B'
// is 49 MB of f16, ran at 0.62× bf16 that way).
constexpr int kBand = 16;
__device__ __forceinline__ void tile_origin(int t, int tiles_r, int tiles_c, int* m0, int* n0) {
  const int band = t / (kBand * tiles_c);
  const int first = band * kBand;
  const int rows = min(kBand, tiles_r - first);
  const int i = t - band * kBand * tiles_c;
  *m0 = (first + i % rows) * kBM;
  *n0 = (i / rows) * kBN;
}

struct KernelArgs {
  const uint8_t* a_scales;
  int64_t R, C, K;
  const float* alpha_dev;
  float alpha, beta;
  const void* c;
  void* out;
  int64_t ldd;
  const void* bias;
  bool bias_bf16;
  int parts;  // 0: whole tiles, out is the result; > 0: k-partition (for_each_work), out holds
              // the f32 partial tiles
};

// Calls f(m0, n0, kb_begin, kb_end, slot) for every piece of work of this CTA, in order: whole
// tiles (parts == 0, slot -1), or the pieces of the CTA's parts (gemm/k_partition.h).
template <typename F>
__device__ __forceinline__ void for_each_work(int parts, int tiles_r, int tiles_c, int nk, F&& f) {
  const int tiles = tiles_r * tiles_c;
  if (parts == 0) {
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int m0, n0;
      tile_origin(t, tiles_r, tiles_c, &m0, &n0);
      f(m0, n0, 0, nk, -1);
    }
    return;
  }
  for (int j = blockIdx.x; j < parts; j += gridDim.x) {
    for_each_column_piece(
        tiles_r, tiles_c, nk, parts, j,
        [&](int r, int c, int kb0, int kb1, int slot) { f(r * kBM, c * kBN, kb0, kb1, slot); });
  }
}

// A''s scales of step kb for rows m0 … m0 + 127 into the stage at st, after its B' panel and codes:
// 4 bytes per row (NVFP4: the step's 4 scales; MX: those of steps kb & ~1 and kb | 1, so that
// the copy is 4-byte aligned), one cp.async per lane and row group, then one arrival per lane on
// the stage's `full` barrier.
template <FusedKind kKind>
__device__ __forceinline__ void load_a_scales(const uint8_t* a_scales, int64_t scale_row,
                                              uint32_t st, int m0, int kb, int lane,
                                              uint32_t full) {
  const int64_t soff = kKind == FusedKind::kNvfp4 ? int64_t(kb) * 4 : int64_t(kb & ~1) * 2;
  const uint32_t sdst = st + kBBytes + kBM * code_row_bytes<kKind>();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = lane + 32 * i;
    cp_async_4(sdst + 4 * row, a_scales + (m0 + row) * scale_row + soff);
  }
  cp_async_arrive_noinc(full);
}

// The producer loop of kAFirst kernels (whole tiles): stage q < kStages gets A''s codes and scales
// at once and its B' panel after griddepcontrol.wait, so that A''s first loads overlap B''s copy.
// A' and its scales were written by kernels that completed before that copy started: the copy's
// blocks wait for everything before them before they let this grid start (pdl.cuh). Stages and
// barriers as in the kernel: full[s] at bar0 + 8s, empty[s] at bar0 + 8 (kStages + s).
template <FusedKind kKind>
__device__ __forceinline__ void produce_a_first(const KernelArgs& p, uint32_t smem0, uint32_t bar0,
                                                const CUtensorMap* a_map, const CUtensorMap* b_map,
                                                int tiles_r, int tiles_c, int nk, int lane,
                                                int64_t scale_row) {
  constexpr int kRowBytes = code_row_bytes<kKind>();
  constexpr int kStage = stage_bytes<kKind>();
  auto full = [&](int s) { return bar0 + 8u * s; };
  auto empty = [&](int s) { return bar0 + 8u * (kStages + s); };
  int2 deferred[kStages];  // (kb, n0) of step q < kStages (lane 0's copy is the one used)
  int s = 0, q = 0;
  uint32_t ph = 0;
  auto release_b = [&](int n) {  // the wait, then the deferred B' panels of stages 0 .. n - 1
    pdl::grid_sync();
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kStages; ++i) {
        if (i < n) {
          tma::load_2d(smem0 + i * kStage, b_map, full(i), deferred[i].x * kBK, deferred[i].y);
        }
      }
    }
  };
  for_each_work(p.parts, tiles_r, tiles_c, nk, [&](int m0, int n0, int kb_begin, int kb_end, int) {
    for (int kb = kb_begin; kb < kb_end; ++kb, ++q) {
      tma::mbar_wait(empty(s), ph ^ 1u);
      const uint32_t st = smem0 + s * kStage;
      const bool defer = q < kStages;
      if (lane == 0) {
        tma::mbar_arrive_expect_tx(full(s), kBBytes + kBM * kRowBytes);
        if (!defer) tma::load_2d(st, b_map, full(s), kb * kBK, n0);
        tma::load_2d(st + kBBytes, a_map, full(s), kb * kRowBytes, m0);
      }
      load_a_scales<kKind>(p.a_scales, scale_row, st, m0, kb, lane, full(s));
      if (defer) {
#pragma unroll
        for (int i = 0; i < kStages; ++i) {
          if (i == q) deferred[i] = make_int2(kb, n0);
        }
        if (q == kStages - 1) release_b(kStages);
      }
      if (++s == kStages) {
        s = 0;
        ph ^= 1u;
      }
    }
  });
  if (q < kStages) release_b(q);  // fewer steps than stages
}

// kPlain: beta = 0 and no bias (the training GEMMs); otherwise the general epilogue.
// kAFirst: the producer sends A' of the first kStages steps before it waits for the launch before
// this one (B''s copy), and B''s panels of those steps after the wait. Only for whole tiles with
// a small B' (launch_fused), as an instantiation of its own: the same logic as a runtime switch
// slowed the other GEMMs' kernels by 2–4 % (bench/results/h100-2026-11-27/a-first-1353,
// a-first-b-first-order-1603).
template <FusedKind kKind, bool kOutF32, bool kPlain, bool kAFirst = false>
__global__ void __launch_bounds__(kThreads, 1)
    fused_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                      const __grid_constant__ CUtensorMap b_map,
                      const __grid_constant__ CUtensorMap o_map, const KernelArgs p) {
  constexpr bool kF16 = kKind == FusedKind::kNvfp4;
  constexpr int kRowBytes = code_row_bytes<kKind>();
  constexpr int kStage = stage_bytes<kKind>();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  constexpr int kBufs = epi_buffers<kKind>();
  const uint32_t epi0 = smem0 + kStages * kStage;   // output chunk buffers (epi_bytes)
  const uint32_t bar0 = epi0 + epi_bytes<kKind>();  // full[s] at bar0 + 8s, empty[s] after them
  auto full = [&](int s) { return bar0 + 8u * s; };
  auto empty = [&](int s) { return bar0 + 8u * (kStages + s); };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::mbar_init(full(s), 1 + 32);  // the TMA arrival + 32 cp.async arrivals (scales)
      tma::mbar_init(empty(s), 256);    // every consumer thread
    }
    tma::fence_mbar_init();
  }
  __syncthreads();
  // B' and alpha' come from the launch before this one (B''s copy); with kAFirst the producer warp
  // waits for it below, after sending out A''s first loads.
  if (!kAFirst || warp != 0) pdl::grid_sync();

  const int tiles_c = static_cast<int>(p.C / kBN), tiles_r = static_cast<int>(p.R / kBM);
  const int nk = static_cast<int>(p.K / kBK);

  if (warp < 4) {
    // ---- Producer warpgroup: warp 0 fills the ring; the other three idle. ----
#if LOWBIT_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
#endif
    if (warp != 0) return;
    const int64_t scale_row = kF16 ? p.K / 16 : p.K / 32;  // bytes per row of A''s scales
    if constexpr (kAFirst) {
      produce_a_first<kKind>(p, smem0, bar0, &a_map, &b_map, tiles_r, tiles_c, nk, lane, scale_row);
      return;
    }
    int s = 0;
    uint32_t ph = 0;
    for_each_work(p.parts, tiles_r, tiles_c, nk,
                  [&](int m0, int n0, int kb_begin, int kb_end, int) {
                    for (int kb = kb_begin; kb < kb_end; ++kb) {
                      tma::mbar_wait(empty(s), ph ^ 1u);
                      const uint32_t st = smem0 + s * kStage;
                      if (lane == 0) {
                        tma::mbar_arrive_expect_tx(full(s), kBBytes + kBM * kRowBytes);
                        tma::load_2d(st, &b_map, full(s), kb * kBK, n0);
                        tma::load_2d(st + kBBytes, &a_map, full(s), kb * kRowBytes, m0);
                      }
                      load_a_scales<kKind>(p.a_scales, scale_row, st, m0, kb, lane, full(s));
                      if (++s == kStages) {
                        s = 0;
                        ph ^= 1u;
                      }
                    }
                  });
    return;
  }

  // ---- Consumer warpgroups: rows 64·cw … 64·cw + 63 of each tile. ----
#if LOWBIT_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
#endif
  const int cw = warp / 4 - 1;
  const int g = lane / 4, c = lane % 4;
  const int row0 = cw * 64 + (warp % 4) * 16 + g;  // and row0 + 8
  const DType code_t = kKind == FusedKind::kE5M2 ? DType::kE5M2 : DType::kE4M3;
  const float alpha_eff =
      kF16 ? __fmul_rn(*p.alpha_dev, 268435456.0f) : p.alpha;  // 2^28: see the file comment

  float acc[128];
  uint32_t af[2][4][4];  // A fragments, double-buffered: [buffer][k16 step][register]
  int s = 0, prev = 0;
  uint32_t ph = 0;

  // One k-step: load and convert this thread's codes, issue the step's four wgmmas, then
  // release the stage of the step before (its group has completed after wait<1>).
  auto step = [&](auto buf_tag, int kb, bool first) {
    constexpr int kBuf = decltype(buf_tag)::value;
    tma::mbar_wait(full(s), ph);
    // Codes and scales by ld.shared: through a generic pointer they compiled to generic loads,
    // whose longer latency sits on each step's critical path (+2–10 % on the 124m / 1b GEMMs).
    const uint32_t codes = smem0 + s * kStage + kBBytes;
    const uint32_t sc = codes + kBM * kRowBytes;
    uint32_t v0[8], v1[8];
    if constexpr (kF16) {
      const uint2 w0 = lds_v2(codes + row0 * kRowBytes + 8 * c);
      const uint2 w1 = lds_v2(codes + (row0 + 8) * kRowBytes + 8 * c);
      nvfp4_row(w0, ue4m3_f16x2(lds_u8(sc + row0 * 4 + c)), v0);
      nvfp4_row(w1, ue4m3_f16x2(lds_u8(sc + (row0 + 8) * 4 + c)), v1);
    } else {
      const int so = (kb & 1) * 2 + (c >> 1);
      const uint4 w0 = lds_v4(codes + row0 * kRowBytes + 16 * c);
      const uint4 w1 = lds_v4(codes + (row0 + 8) * kRowBytes + 16 * c);
      mx_row<kKind == FusedKind::kE5M2>(w0, lds_u8(sc + row0 * 4 + so), code_t, v0);
      mx_row<kKind == FusedKind::kE5M2>(w1, lds_u8(sc + (row0 + 8) * 4 + so), code_t, v1);
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      af[kBuf][kk][0] = v0[2 * kk];
      af[kBuf][kk][1] = v1[2 * kk];
      af[kBuf][kk][2] = v0[2 * kk + 1];
      af[kBuf][kk][3] = v1[2 * kk + 1];
    }
    const uint32_t b_lo = wgmma::desc_lo(smem0 + s * kStage, 16);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      mma_m64n256k16_rs<kF16>(acc, af[kBuf][kk], wgmma::desc_of(b_lo + 2 * kk),
                              (!first || kk > 0) ? 1 : 0);
    }
    wgmma::commit();
    wgmma::wait<1>();
    keep(af[kBuf ^ 1]);
    if (!first) tma::mbar_arrive(empty(prev));
    prev = s;
    if (++s == kStages) {
      s = 0;
      ph ^= 1u;
    }
  };

  for_each_work(
      p.parts, tiles_r, tiles_c, nk, [&](int m0, int n0, int kb_begin, int kb_end, int slot) {
        int kb = kb_begin;
#pragma unroll 1
        for (; kb + 1 < kb_end; kb += 2) {
          step(std::integral_constant<int, 0>{}, kb, kb == kb_begin);
          step(std::integral_constant<int, 1>{}, kb + 1, false);
        }
        if (kb < kb_end) step(std::integral_constant<int, 0>{}, kb, kb == kb_begin);
        wgmma::wait<0>();
        keep(af[0]);
        keep(af[1]);
        keep(acc);
        tma::mbar_arrive(empty(prev));

        // Epilogue: thread (g, c) of warp w holds rows row0, row0 + 8 and, for jj < 32, columns
        // 8·jj + 2c, 8·jj + 2c + 1 (acc[4jj], acc[4jj+1] the first row, acc[4jj+2], acc[4jj+3] the
        // second). Each warpgroup writes its 64 rows in chunks of 128 bytes per row (64 bf16 / 32
        // f32 columns) into shared memory in the 128-byte swizzle (bf16: conflict-free, the 8 rows
        // of a warp's store land in 8 different 16-byte columns; f32 pairs: at most 2-way), and one
        // thread stores the chunk with TMA; with two chunk buffers (NVFP4) writing one overlaps the
        // store of the other, and the next tile's mainloop overlaps the last stores.
        constexpr int kChunkCols = kOutF32 ? 32 : 64;
        constexpr int kEsz = kOutF32 ? 4 : 2;
        const int wr = (warp % 4) * 16 + g;  // row within the warpgroup's 64
        const bool leader = threadIdx.x % 128 == 0;
        const int64_t r0 = m0 + row0;
#pragma unroll
        for (int q = 0; q < kBN / kChunkCols; ++q) {
          const uint32_t cb = epi0 + (cw * kBufs + q % kBufs) * kChunkBytes;
          if (leader)
            tma::bulk_wait_read<kBufs - 1>();  // the store that last read this buffer is done
          named_sync(1 + cw, 128);
#pragma unroll
          for (int jl = 0; jl < kChunkCols / 8; ++jl) {
            const int jj = q * (kChunkCols / 8) + jl;
            float x00 = alpha_eff * acc[4 * jj], x01 = alpha_eff * acc[4 * jj + 1];
            float x10 = alpha_eff * acc[4 * jj + 2], x11 = alpha_eff * acc[4 * jj + 3];
            if constexpr (!kPlain) {
              const int col = n0 + 8 * jj + 2 * c;
              if (p.beta != 0.0f) {
                float y00, y01, y10, y11;
                if constexpr (kOutF32) {
                  const float* c0 = (p.c != nullptr ? static_cast<const float*>(p.c)
                                                    : static_cast<const float*>(p.out)) +
                                    r0 * p.ldd + col;
                  const float2 a = *reinterpret_cast<const float2*>(c0);
                  const float2 b = *reinterpret_cast<const float2*>(c0 + 8 * p.ldd);
                  y00 = a.x, y01 = a.y, y10 = b.x, y11 = b.y;
                } else {
                  const __nv_bfloat16* c0 =
                      (p.c != nullptr ? static_cast<const __nv_bfloat16*>(p.c)
                                      : static_cast<const __nv_bfloat16*>(p.out)) +
                      r0 * p.ldd + col;
                  const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(c0);
                  const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(c0 + 8 * p.ldd);
                  y00 = __low2float(a), y01 = __high2float(a);
                  y10 = __low2float(b), y11 = __high2float(b);
                }
                x00 = fmaf(p.beta, y00, x00);
                x01 = fmaf(p.beta, y01, x01);
                x10 = fmaf(p.beta, y10, x10);
                x11 = fmaf(p.beta, y11, x11);
              }
              if (p.bias != nullptr) {
                float b0, b1;
                if (p.bias_bf16) {
                  b0 = __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[col]);
                  b1 = __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[col + 1]);
                } else {
                  b0 = static_cast<const float*>(p.bias)[col];
                  b1 = static_cast<const float*>(p.bias)[col + 1];
                }
                x00 += b0;
                x01 += b1;
                x10 += b0;
                x11 += b1;
              }
            }
            // Byte offset of (row, column 8·jl + 2c) in the chunk, 16-byte column j at j ^ (row %
            // 8).
            const int bo = (8 * jl + 2 * c) * kEsz;
            const uint32_t a0 = cb + wr * 128 + (((bo >> 4) ^ (wr & 7)) << 4) + (bo & 15);
            const uint32_t a1 = a0 + 8 * 128;  // row wr + 8: same swizzle phase
            if constexpr (kOutF32) {
              asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a0), "f"(x00), "f"(x01));
              asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a1), "f"(x10), "f"(x11));
            } else {
              const __nv_bfloat162 b0 = __floats2bfloat162_rn(x00, x01);
              const __nv_bfloat162 b1 = __floats2bfloat162_rn(x10, x11);
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0),
                           "r"(*reinterpret_cast<const uint32_t*>(&b0)));
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a1),
                           "r"(*reinterpret_cast<const uint32_t*>(&b1)));
            }
          }
          wgmma::fence_proxy_async();  // the chunk's writes visible to the TMA unit
          named_sync(1 + cw, 128);
          if (leader) {
            // A piece of a k-partition writes partial tile `slot` ([slots · 128, 256] f32).
            if (slot >= 0) {
              tma::store_2d(&o_map, cb, q * kChunkCols, slot * kBM + cw * 64);
            } else {
              tma::store_2d(&o_map, cb, n0 + q * kChunkCols, m0 + cw * 64);
            }
            tma::bulk_commit();
          }
        }
      });
  if (threadIdx.x % 128 == 0) tma::bulk_wait_all();  // the last stores have left shared memory
}

// ---- B' dequantization into the permuted k order ---------------------------------------------

struct PermJob {
  const uint8_t* codes;
  const uint8_t* scales;
  uint16_t* out;
  int64_t rows, cols;  // B' [rows = C, cols = K]
  DType t;
};

// K-contiguous copies (NVFP4, MX rowwise): one thread per 64 consecutive k of a row (one k-step
// of the GEMM: 32 / 64 code bytes and 4 / 2 scale bytes, consecutive threads along the row), its
// four 16-code chunks converted by the mainloop's own nvfp4_row / mx_row (so that B' carries
// exactly the bits A' gets in registers), and its 128 output bytes written through a swizzled
// per-thread slot in shared memory so that each warp store covers 512 contiguous bytes. The
// one-thread-per-16-codes version (a shared-memory table lookup and an fp32 multiply per code,
// eight 4-byte stores at 32-byte strides) moved 32 MB in 21 µs at the 124m wgrad shapes, half
// the copy rate.
//
// Chunk c's pair word v_c[i] holds codes 16c + 2i, 2i + 1; permuted position 16·kk + 2c + (j & 1)
// + 8·(j >> 1) holds code 16c + 4kk + j, so word w of the 16-element group kk is v_c[2kk] for
// w = c and v_c[2kk + 1] for w = 4 + c.
template <FusedKind kKind>
__global__ void __launch_bounds__(256) dequant_perm_kernel(PermJob j, Nvfp4Alpha al) {
  pdl::grid_sync();
  if (al.out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) write_nvfp4_alpha(al);
  __shared__ __align__(16) uint4 stage[256][8];  // [thread][16-byte piece ^ (thread % 8)]
  const int t = threadIdx.x;
  // 32-bit unit arithmetic (units < 2^31: dequant_b_permuted): the int64 division and remainder
  // per thread and store round cost more issue slots than the conversion itself.
  const uint32_t per_row = uint32_t(j.cols / 64);
  const uint32_t units = uint32_t(j.rows) * per_row;
  const uint32_t u = blockIdx.x * 256u + uint32_t(t);
  const uint32_t ur = u / per_row, ukb = u - ur * per_row;
  const int64_t out_off = int64_t(ur) * j.cols + 64 * int64_t(ukb);  // this unit's first output
  if (u < units) {
    const int64_t r = ur, kb = ukb;
    uint32_t v[4][8];
    if constexpr (kKind == FusedKind::kNvfp4) {
      const uint4* src = reinterpret_cast<const uint4*>(j.codes + r * (j.cols / 2) + 32 * kb);
      const uint4 w0 = src[0], w1 = src[1];
      const uint32_t sc = *reinterpret_cast<const uint32_t*>(j.scales + r * (j.cols / 16) + 4 * kb);
      const uint2 w[4] = {make_uint2(w0.x, w0.y), make_uint2(w0.z, w0.w), make_uint2(w1.x, w1.y),
                          make_uint2(w1.z, w1.w)};
#pragma unroll
      for (int c = 0; c < 4; ++c) nvfp4_row(w[c], ue4m3_f16x2((sc >> (8 * c)) & 0xFFu), v[c]);
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(j.codes + r * j.cols + 64 * kb);
      const uint32_t sc = *reinterpret_cast<const uint16_t*>(j.scales + r * (j.cols / 32) + 2 * kb);
      constexpr DType kT = kKind == FusedKind::kE5M2 ? DType::kE5M2 : DType::kE4M3;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        mx_row<kKind == FusedKind::kE5M2>(src[c], (sc >> (8 * (c >> 1))) & 0xFFu, kT, v[c]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      stage[t][(2 * kk) ^ (t & 7)] =
          make_uint4(v[0][2 * kk], v[1][2 * kk], v[2][2 * kk], v[3][2 * kk]);
      stage[t][(2 * kk + 1) ^ (t & 7)] =
          make_uint4(v[0][2 * kk + 1], v[1][2 * kk + 1], v[2][2 * kk + 1], v[3][2 * kk + 1]);
    }
  }
  __syncwarp();
  // Warp w's 32 slots go out as 8 rounds of 512 contiguous bytes: lane l of round i stores piece
  // l % 8 of slot 4i + l / 8 of the warp.
  const int lane = t % 32, base = t - lane;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int slot = base + 4 * i + lane / 8, piece = lane % 8;
    const int64_t off = __shfl_sync(0xFFFFFFFFu, out_off, 4 * i + lane / 8);  // slot's unit
    if (blockIdx.x * 256u + uint32_t(slot) < units) {
      *reinterpret_cast<uint4*>(j.out + off + 8 * piece) = stage[slot][piece ^ (slot & 7)];
    }
  }
}

// out = the sum of the partial tiles that hold pieces of each tile, in the order of their parts
// (deterministic: tile_slots) (+ beta · c) (+ bias), one rounding to out's type; the partials
// already carry alpha. Four columns per thread (C % 256 == 0).
struct PartsReduce {
  const float* partial;  // [slots · 128, 256]
  int parts, tiles_r, tiles_c, nk;
  int64_t R, C;
  float beta;
  const void* c;
  void* out;
  bool out_f32;
  int64_t ldd;
  const void* bias;
  bool bias_bf16;
};

// The partial tiles slot0 … slot0 + count - 1 that hold the pieces of result element (row, col)'s
// tile.
__device__ __forceinline__ void element_slots(const PartsReduce& r, int64_t row, int64_t col,
                                              int* slot0, int* count) {
  tile_slots(r.tiles_r, r.tiles_c, r.nk, r.parts, static_cast<int>(row / kBM),
             static_cast<int>(col / kBN), slot0, count);
}

// Four consecutive out elements from their sums x: + beta · c (c at the same place as out), +
// bias[bias0 + k], one rounding to out's type.
__device__ __forceinline__ void reduce_store4(const PartsReduce& r, float (&x)[4], int64_t o,
                                              int64_t bias0) {
  if (r.beta != 0.0f) {
    const void* cs = r.c != nullptr ? r.c : r.out;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float y = r.out_f32 ? static_cast<const float*>(cs)[o + k]
                                : __bfloat162float(static_cast<const __nv_bfloat16*>(cs)[o + k]);
      x[k] = fmaf(r.beta, y, x[k]);
    }
  }
  if (r.bias != nullptr) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[k] += r.bias_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(r.bias)[bias0 + k])
                          : static_cast<const float*>(r.bias)[bias0 + k];
    }
  }
  if (r.out_f32) {
    *reinterpret_cast<float4*>(static_cast<float*>(r.out) + o) =
        make_float4(x[0], x[1], x[2], x[3]);
  } else {
    const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]);
    const __nv_bfloat162 b = __floats2bfloat162_rn(x[2], x[3]);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&a);
    u.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(r.out) + o) = u;
  }
}

// Sums the float4s at p + slot · kBM · kBN for slots slot0 … slot0 + count - 1, in slot order
// (the order of the parts: deterministic). The loads of up to kBatch slots are issued before
// their sums, so that a thread waits for one L2 round trip per kBatch slots, not one per slot.
__device__ __forceinline__ float4 sum_slots(const float* p, int slot0, int count) {
  constexpr int kBatch = 8;
  float4 v = *reinterpret_cast<const float4*>(p + int64_t(slot0) * kBM * kBN);
  for (int j = 1; j < count; j += kBatch) {
    float4 w[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (j + b < count) {
        w[b] = *reinterpret_cast<const float4*>(p + int64_t(slot0 + j + b) * kBM * kBN);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (j + b < count) v.x += w[b].x, v.y += w[b].y, v.z += w[b].z, v.w += w[b].w;
    }
  }
  return v;
}

// One block per kReduceRows rows × 256 columns of one output tile (grid: tiles_c × R /
// kReduceRows), so that the tile's slots are found once per block; thread t adds columns
// 4 (t % 64) … + 3 of rows t / 64 and t / 64 + 4 of the block's rows.
constexpr int kReduceRows = 8;
__global__ void __launch_bounds__(256) parts_reduce_kernel(PartsReduce r) {
  pdl::grid_sync();
  const int tc = blockIdx.x, strip = blockIdx.y;
  const int tr = strip / (kBM / kReduceRows);
  const int lr0 = (strip % (kBM / kReduceRows)) * kReduceRows;
  int slot0, count;
  tile_slots(r.tiles_r, r.tiles_c, r.nk, r.parts, tr, tc, &slot0, &count);
  const int t = threadIdx.x, lc = 4 * (t % 64);
  float4 v[kReduceRows / 4];
#pragma unroll
  for (int i = 0; i < kReduceRows / 4; ++i) {
    v[i] = sum_slots(r.partial + (lr0 + t / 64 + 4 * i) * kBN + lc, slot0, count);
  }
#pragma unroll
  for (int i = 0; i < kReduceRows / 4; ++i) {
    const int64_t row = int64_t(tr) * kBM + lr0 + t / 64 + 4 * i, col = int64_t(tc) * kBN + lc;
    float x[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    reduce_store4(r, x, row * r.ldd + col, col);
  }
}

// The same sums written transposed: out [C, R] (ldd over R) = the kernel's [R, C] result (c read
// alike, the bias indexed by the kernel's row: out's column). One block per 64 × 64 of the kernel's
// result: the sums of 16 rows × 64 columns per pass into shared memory, then 64 out rows × 64
// contiguous columns from it, so that both the partial reads and the out writes are coalesced.
__global__ void __launch_bounds__(256) parts_reduce_transposed_kernel(PartsReduce r) {
  pdl::grid_sync();
  __shared__ float sum[64][65];  // [kernel row][kernel column], padded
  const int t = threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * 64, c0 = int64_t(blockIdx.x) * 64;
  int slot0, count;
  element_slots(r, r0, c0, &slot0, &count);
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int lr = 16 * pass + t / 16, lc = 4 * (t % 16);
    const float* p = r.partial + ((r0 + lr) % kBM) * kBN + (c0 + lc) % kBN;
    const float4 v = sum_slots(p, slot0, count);
    sum[lr][lc] = v.x;
    sum[lr][lc + 1] = v.y;
    sum[lr][lc + 2] = v.z;
    sum[lr][lc + 3] = v.w;
  }
  __syncthreads();
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int lc = 16 * pass + t / 16, lr = 4 * (t % 16);  // out row c0 + lc, columns r0 + lr..
    float x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = sum[lr + k][lc];
    reduce_store4(r, x, (c0 + lc) * r.ldd + r0 + lr, r0 + lr);
  }
}

int sm_count() {  // of the current device
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  return lowbit::sm_count(dev);
}

template <FusedKind kKind, bool kOutF32, bool kPlain, bool kAFirst = false>
void launch_fused(const FusedGemmArgs& a, const CUtensorMap& am, const CUtensorMap& bm,
                  const CUtensorMap& om, int grid, cudaStream_t stream) {
  auto* kernel = fused_gemm_kernel<kKind, kOutF32, kPlain, kAFirst>;
  constexpr int smem = smem_bytes<kKind>();
  allow_dynamic_smem(kernel, smem);  // per device
  const bool split = a.parts > 0;    // the kernel writes partial tiles, the reduction the rest
  const KernelArgs p{a.a_scales,
                     a.R,
                     a.C,
                     a.K,
                     a.alpha_dev,
                     a.alpha,
                     split ? 0.0f : a.beta,
                     a.c,
                     split ? static_cast<void*>(a.partial) : a.out,
                     split ? kBN : a.ldd,
                     split ? nullptr : a.bias,
                     a.bias_bf16,
                     a.parts};
  pdl::launch(kernel, unsigned(grid), kThreads, smem, stream, am, bm, om, p);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <FusedKind kKind>
void launch_kind(const FusedGemmArgs& a, const CUtensorMap& am, const CUtensorMap& bm,
                 const CUtensorMap& om, int grid, bool a_first, cudaStream_t stream) {
  const bool split = a.parts > 0;
  const bool plain = split || (a.beta == 0.0f && a.bias == nullptr);
  if (split || a.out_f32) {
    plain ? launch_fused<kKind, true, true>(a, am, bm, om, grid, stream)
          : launch_fused<kKind, true, false>(a, am, bm, om, grid, stream);
  } else {
    if (a_first) {
      launch_fused<kKind, false, true, true>(a, am, bm, om, grid, stream);
    } else {
      plain ? launch_fused<kKind, false, true>(a, am, bm, om, grid, stream)
            : launch_fused<kKind, false, false>(a, am, bm, om, grid, stream);
    }
  }
}

}  // namespace

bool fused_gemm_shape_ok(FusedKind kind, int64_t R, int64_t C, int64_t K) {
  const int64_t kq = kind == FusedKind::kNvfp4 ? 64 : 128;
  return R > 0 && C > 0 && K > 0 && R % kFusedTileR == 0 && C % kFusedTileC == 0 && K % kq == 0 &&
         R < (int64_t{1} << 31) && C < (int64_t{1} << 31) && K < (int64_t{1} << 31) &&
         (R / kFusedTileR) * (C / kFusedTileC) < (int64_t{1} << 31);
}

FusedGemmRun fused_gemm(const FusedGemmArgs& a, cudaStream_t stream) {
  LOWBIT_CHECK(fused_gemm_shape_ok(a.kind, a.R, a.C, a.K),
               "fused_gemm: R {} C {} K {} outside the kernel's tiles", a.R, a.C, a.K);
  LOWBIT_CHECK(a.ldd % 8 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0,
               "fused_gemm: out must be 16-byte aligned with ldd % 8 == 0 (ldd {})", a.ldd);
  const bool nv = a.kind == FusedKind::kNvfp4;
  LOWBIT_CHECK(!nv || a.alpha_dev != nullptr, "fused_gemm: NVFP4 needs the device alpha'");
  const int64_t row_bytes = nv ? a.K / 2 : a.K;
  CUtensorMap am, bm;
  LOWBIT_CHECK(tma::make_2d_map(&am, a.a_codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, row_bytes, a.R,
                                row_bytes, nv ? 32 : 64, kBM, CU_TENSOR_MAP_SWIZZLE_NONE),
               "fused_gemm: no TMA map for A' codes [{}, {}]", a.R, row_bytes);
  LOWBIT_CHECK(tma::make_2d_map(&bm, a.b_perm, CU_TENSOR_MAP_DATA_TYPE_UINT16, a.K, a.C, a.K * 2,
                                kBK, kBN, CU_TENSOR_MAP_SWIZZLE_128B),
               "fused_gemm: no TMA map for B' [{}, {}]", a.C, a.K);
  const bool split = a.parts > 0;
  const int64_t tiles_c = a.C / kBN, tiles = (a.R / kBM) * tiles_c;
  const int64_t line = (a.R / kBM) * (a.K / kBK);  // one column's tile k-steps
  // parts a multiple of the column tiles, at most one per step of a column; part_start /
  // part_owner multiply a position by the part count: keep it within int64.
  // The kernel addresses partial tiles by int rows (slot · 128).
  LOWBIT_CHECK(a.parts >= 0 && a.parts % tiles_c == 0 && a.parts / tiles_c <= line &&
                   (a.parts == 0 || line <= (int64_t{1} << 62) / a.parts) &&
                   fused_gemm_partial_tiles(a.R, a.C, a.parts) * kBM <= INT32_MAX &&
                   (!split || a.partial != nullptr),
               "fused_gemm: {} parts for {} column tiles of {} k-steps (a multiple of the column "
               "tiles, at most one part per k-step of a column)",
               a.parts, tiles_c, line);
  LOWBIT_CHECK(!a.out_transposed || split, "fused_gemm: a transposed out needs a k-partition");
  LOWBIT_CHECK(!split || a.R / kReduceRows <= 65535,
               "fused_gemm: R {} too large for a k-partition (at most {} rows)", a.R,
               65535 * kReduceRows);
  CUtensorMap om;
  const bool f32 = split || a.out_f32;
  const int64_t slots = split ? fused_gemm_partial_tiles(a.R, a.C, a.parts) : 0;
  LOWBIT_CHECK(
      tma::make_2d_map(&om, split ? static_cast<void*>(a.partial) : a.out,
                       f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                       split ? kBN : a.C, split ? slots * kBM : a.R,
                       (split ? kBN : a.ldd) * (f32 ? 4 : 2), f32 ? 32 : 64, 64,
                       CU_TENSOR_MAP_SWIZZLE_128B),
      "fused_gemm: no TMA map for out [{}, {}] (ldd {})", a.R, a.C, a.ldd);
  const int64_t units = split ? a.parts : tiles;
  const int cap = a.max_ctas > 0 ? std::min(a.max_ctas, sm_count()) : sm_count();
  const int grid = static_cast<int>(std::min<int64_t>(units, cap));
  // A' first (kAFirst) for whole tiles into a plain bf16 out where B''s copy is small (at most two
  // 64-element units per thread of the grid: a weight in fprop / dgrad, whose copy is a short
  // latency chain that A''s first loads hide) and the kernel short (at most three tiles per CTA,
  // where that chain is ≥ 10 % of the time: the 124m proj fprop / dgrad, NVFP4 −4 / −7 %, MX
  // −2.6 / −1.5 %); longer kernels ran 1–3.5 % slower with it (124m qkv / fc1,
  // bench/results/h100-2026-11-27/a-first-kernel-1628).
  const bool a_first = !split && !a.out_f32 && a.beta == 0.0f && a.bias == nullptr &&
                       a.C * (a.K / 64) <= int64_t{2} * grid * kThreads && tiles <= 3 * grid;
  switch (a.kind) {
    case FusedKind::kNvfp4:
      launch_kind<FusedKind::kNvfp4>(a, am, bm, om, grid, a_first, stream);
      break;
    case FusedKind::kE4M3:
      launch_kind<FusedKind::kE4M3>(a, am, bm, om, grid, a_first, stream);
      break;
    case FusedKind::kE5M2:
      launch_kind<FusedKind::kE5M2>(a, am, bm, om, grid, a_first, stream);
      break;
  }
  if (split) {
    const PartsReduce r{a.partial,
                        a.parts,
                        static_cast<int>(a.R / kBM),
                        static_cast<int>(a.C / kBN),
                        static_cast<int>(a.K / kBK),
                        a.R,
                        a.C,
                        a.beta,
                        a.c,
                        a.out,
                        a.out_f32,
                        a.ldd,
                        a.bias,
                        a.bias_bf16};
    if (a.out_transposed) {
      LOWBIT_CHECK(a.R / 64 <= 65535, "fused_gemm: R {} too large for a transposed out", a.R);
      pdl::launch(parts_reduce_transposed_kernel, dim3(unsigned(a.C / 64), unsigned(a.R / 64)), 256,
                  0, stream, r);
    } else {
      pdl::launch(parts_reduce_kernel, dim3(unsigned(a.C / kBN), unsigned(a.R / kReduceRows)), 256,
                  0, stream, r);
    }
    LOWBIT_CUDA_CHECK_LAUNCH();
  }
  return FusedGemmRun{a_first};
}

int fused_gemm_sm_count() { return sm_count(); }

int64_t fused_gemm_partial_tiles(int64_t R, int64_t C, int parts) {
  return partial_tiles(static_cast<int>(R / kBM), static_cast<int>(C / kBN), parts);
}

int fused_gemm_parts(int64_t R, int64_t C, int64_t K) {
  return k_partition_for(R / kBM, C / kBN, K / kBK, sm_count());
}

void dequant_b_permuted(const DequantJob& b, FusedKind kind, const Nvfp4Alpha* alpha,
                        cudaStream_t stream) {
  LOWBIT_CHECK(b.cols % 64 == 0 && b.rows > 0, "dequant_b_permuted: cols {} not a multiple of 64",
               b.cols);
  const bool nv = kind == FusedKind::kNvfp4;
  LOWBIT_CHECK(nv == (b.layout == DequantScales::kNvfp4),
               "dequant_b_permuted: operand kinds differ (A' {} B' layout {})", int(kind),
               int(b.layout));
  const PermJob j{b.codes, b.scales, b.out, b.rows, b.cols, b.t};
  const Nvfp4Alpha al = alpha != nullptr ? *alpha : Nvfp4Alpha{};
  const int64_t units = b.rows * (b.cols / 64);
  LOWBIT_CHECK(units + 255 < (int64_t{1} << 31), "dequant_b_permuted: {} x {} is too large", b.rows,
               b.cols);
  const unsigned grid = unsigned((units + 255) / 256);
  if (nv) {
    pdl::launch(dequant_perm_kernel<FusedKind::kNvfp4>, grid, 256, 0, stream, j, al);
  } else if (b.t == DType::kE5M2) {
    pdl::launch(dequant_perm_kernel<FusedKind::kE5M2>, grid, 256, 0, stream, j, al);
  } else {
    LOWBIT_CHECK(b.t == DType::kE4M3, "dequant_b_permuted: MX B' must hold FP8 codes, not {}",
                 dtype_name(b.t));
    pdl::launch(dequant_perm_kernel<FusedKind::kE4M3>, grid, 256, 0, stream, j, al);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::gemm_kernels

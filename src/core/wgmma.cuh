// Warpgroup MMA (wgmma, sm_90a) building blocks: shared-memory matrix descriptors for tiles in
// the 128-byte swizzle, and the fence / commit / wait protocol. One warpgroup is 4 consecutive
// warps (128 threads, the first warp's index a multiple of 4).
//
// A tile in the 128B swizzle: rows of 64 bf16 (128 bytes), 16-byte chunk c of row r stored at
// chunk position c ^ (r & 7), the tile base 1024-byte aligned — the layout the attention kernels'
// tile_addr<64> already produce. The descriptor (PTX ISA, "Matrix Descriptor Format"):
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4
//   bits 49-51  base offset (0 for 1024-byte aligned tiles)
//   bits 62-63  swizzle mode (1 = 128B)
// tests/gpu/test_wgmma.cu checks the offsets used below against a float64 product.
#pragma once

#include <cstdint>

// wgmma and setmaxnreg exist on sm_90a only. In a build that also targets Blackwell the
// instructions compile to a trap there, and the host launches the kernels that use them only on
// compute capability 9.0 (gemm_cuda.cpp try_fused_emulated, attention.cu default_tiles).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOWBIT_SM90A 1
#else
#define LOWBIT_SM90A 0
#endif

namespace lowbit::wgmma {

// The 32 fp32 accumulator registers of an m64n64 product: the PTX list and the asm operands.
#define LOWBIT_WGMMA_D32_REGS                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LOWBIT_WGMMA_D32(d)                                                                       \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                               uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

// The descriptor split in two 32-bit words. The high word (stride-dimension byte offset 1024,
// 128B swizzle) is the same for every tile of these kernels; the low word holds the start
// address >> 4 (bits 0-13) and the leading-dimension byte offset >> 4 (bits 16-29). Shared
// addresses are below 256 KiB, so the address field of a tile's descriptor plus (offset >> 4)
// is the field of the address plus offset: a kernel computes desc_lo once per tile base and
// reaches sub-tiles with one integer add, instead of a shift, mask and or per product.
constexpr uint32_t kDescHi = (1024u >> 4) | (1u << 30);

__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_addr, uint32_t lbo_bytes) {
  return ((smem_addr >> 4) & 0x3FFFu) | ((lbo_bytes >> 4) << 16);
}

__device__ __forceinline__ uint64_t desc_of(uint32_t lo) {
  return (static_cast<uint64_t>(kDescHi) << 32) | lo;
}

// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void fence() {
#if LOWBIT_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void commit() {
#if LOWBIT_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int N>
__device__ __forceinline__ void wait() {
#if LOWBIT_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

// d [64×64 f32] (+)= A [64×16] · B, A and B bf16 in shared memory. kTransB = 0: B given as
// [64 (n) × 16 (k)] K-major; 1: B given as [16 (k) × 64 (n)] N-major. accumulate = 0 overwrites d.
// Thread t of the warpgroup holds rows 16·(t/32) + (t%32)/4 (+8) and, for j < 8, columns
// 8j + 2·(t%4) (+1): d[4j], d[4j+1] the first row, d[4j+2], d[4j+3] the second.
template <int kTransB>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                              int accumulate) {
#if LOWBIT_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LOWBIT_WGMMA_D32_REGS
      ", "
      "%32, %33, p, 1, 1, 0, %35;\n"
      "}\n"
      : LOWBIT_WGMMA_D32(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransB));
#else
  __trap();
#endif
}

// The same with A [64×16] from registers: a[0..3] per thread as mma.m16n8k16's A fragment of
// its warp's 16 rows (a0 = rows g, cols 2c..2c+1; a1 = rows g+8; a2, a3 = cols + 8), which is the
// accumulator layout above packed to bf16 pairs. B from shared memory as above.
template <int kTransB>
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t desc_b, int accumulate) {
#if LOWBIT_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LOWBIT_WGMMA_D32_REGS
      ", "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"
      "}\n"
      : LOWBIT_WGMMA_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransB));
#else
  __trap();
#endif
}

// Issues d (+)= A·Bᵀ over k = 0 .. 63 for 64×64 bf16 tiles A [m][k] and B [n][k] (K-major, 128B
// swizzle) at shared addresses a and b: four m64n64k16 products (between fence() and commit()).
// overwrite: d = A·Bᵀ (the first product ignores d's old values, so d need not be zeroed).
// a_lo, b_lo: desc_lo(a, 16), desc_lo(b, 16).
__device__ __forceinline__ void issue_kmajor_64_lo(float (&d)[32], uint32_t a_lo, uint32_t b_lo,
                                                   bool overwrite = false) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {  // 16 elements = 32 bytes along each 128-byte row
    mma_m64n64k16<0>(d, desc_of(a_lo + 2 * kk), desc_of(b_lo + 2 * kk), kk > 0 || !overwrite);
  }
}

__device__ __forceinline__ void issue_kmajor_64(float (&d)[32], uint32_t a, uint32_t b,
                                                bool overwrite = false) {
  issue_kmajor_64_lo(d, desc_lo(a, 16), desc_lo(b, 16), overwrite);
}

// Issues d (+)= A·B over k = 0 .. 63 with A from registers (a[kp]: k = 16kp .., the layout of
// mma_m64n64k16_rs) and B [k][n] a 64×64 N-major tile at shared address b.
// b_lo: desc_lo(b, 8192).
__device__ __forceinline__ void issue_rs_nmajor_64_lo(float (&d)[32], const uint32_t (&a)[4][4],
                                                      uint32_t b_lo) {
#pragma unroll
  for (int kp = 0; kp < 4; ++kp) {  // 16 rows of 128 bytes (2048 bytes) down the tile
    mma_m64n64k16_rs<1>(d, a[kp], desc_of(b_lo + 128 * kp), 1);
  }
}

__device__ __forceinline__ void issue_rs_nmajor_64(float (&d)[32], const uint32_t (&a)[4][4],
                                                   uint32_t b) {
  issue_rs_nmajor_64_lo(d, a, desc_lo(b, 8192));
}

}  // namespace lowbit::wgmma

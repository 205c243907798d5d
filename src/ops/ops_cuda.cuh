// Device helpers shared by the op kernels (src/ops/*.cu): 16-byte vector loads and stores of
// eight bf16 or f32 values as fp32, single-rounding arithmetic, warp and block sums.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "core/device_attr.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/formats.h"

namespace lowbit::ops_cuda {

inline constexpr int kWarp = 32;

// Blocks needed to cover n items with `per` each.
inline int64_t ceil_div(int64_t n, int64_t per) { return (n + per - 1) / per; }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

using lowbit::cached_device_attr;  // core/device_attr.h
using lowbit::sm_count;

// Whether `bytes` of dynamic shared memory (plus `static_bytes` of the kernel's own arrays) fit
// one block of `device` once opted in.
inline bool dynamic_smem_fits(int device, size_t bytes, size_t static_bytes) {
  const int max_smem = cached_device_attr(device, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return bytes + static_bytes <= size_t(max_smem);
}

// The shared-memory address of a generic pointer into shared memory (for PTX operands).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Asks the L2 to fetch part `part` of `parts` equal slices of bytes [0, bytes) at p (16-byte
// aligned; a trailing partial 16-byte unit is left out). A hint with no completion to wait for:
// for data that a later kernel of the stream reads.
__device__ __forceinline__ void l2_prefetch_part(const void* p, int64_t bytes, int64_t part,
                                                 int64_t parts) {
  constexpr int64_t kMaxUnits = 1024;  // 16 KiB per instruction
  const int64_t units = bytes / 16, per = (units + parts - 1) / parts;
  const int64_t u0 = part * per, u1 = units < u0 + per ? units : u0 + per;
  for (int64_t u = u0; u < u1; u += kMaxUnits) {
    const int64_t n = u1 - u < kMaxUnits ? u1 - u : kMaxUnits;
    asm volatile(
        "cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(p) + 16 * u),
        "r"(uint32_t(16 * n))
        : "memory");
  }
}

// allow_dynamic_smem: core/device_attr.h (the gemm layer's kernels use it too).
using lowbit::allow_dynamic_smem;

// ---- eight consecutive elements <-> fp32 ----------------------------------------------------

__device__ __forceinline__ void load8(const uint16_t* p, float v[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void load8(const float* p, float v[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// Same as load8 but without the read-only cache path (for buffers this kernel also writes, e.g.
// an input that may alias the output).
__device__ __forceinline__ void load8_rw(const uint16_t* p, float v[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void load8_rw(const float* p, float v[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(f32_to_bf16_rn(lo)) | (uint32_t(f32_to_bf16_rn(hi)) << 16);
}

// Rounds eight fp32 values to bf16 (RN, formats.h) and stores them with one 16-byte write.
__device__ __forceinline__ void store8(uint16_t* p, const float v[8]) {
  uint4 u;
  u.x = pack_bf16x2(v[0], v[1]);
  u.y = pack_bf16x2(v[2], v[3]);
  u.z = pack_bf16x2(v[4], v[5]);
  u.w = pack_bf16x2(v[6], v[7]);
  *reinterpret_cast<uint4*>(p) = u;
}

__device__ __forceinline__ void store8(float* p, const float v[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ float load1(const uint16_t* p) { return bf16_to_f32(*p); }
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ void store1(uint16_t* p, float v) { *p = f32_to_bf16_rn(v); }
__device__ __forceinline__ void store1(float* p, float v) { *p = v; }

// ---- reductions ---------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call synchronises, and may be repeated.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  if (nwarps == 1) return v;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(s);
}

}  // namespace lowbit::ops_cuda

// CUDA cross_entropy_fwd_bwd: one block per row of logits, memory-bound.
//
// Pass 1 reads the row once with 16-byte vectors (8 bf16) and keeps, per thread, an online
// (max m, sum s of exp(x − m)) pair in fp32; the pairs are merged in a fixed tree (warp
// butterfly, then the warps in order), so the result is deterministic. The first part of the
// row (up to CeConfig::max_cache_bytes) is kept in shared memory as it is read, so that pass 2,
// which writes dx = grad_scale · (exp(x − m) / s − onehot), reads it from there instead of HBM; the
// rest of a longer row is read again (mostly from L2).
//
// cross_entropy_cluster_kernel, a candidate for rows longer than a block's shared memory (the
// 256 KB rows of a 128256-token vocabulary; not the default, see cross_entropy_default_config),
// runs a row on a cluster of blocks: each block holds its slice of the row from pass 1 to pass 2,
// the blocks' (m, s) pairs are merged through distributed shared memory, and the row is read from
// HBM exactly once.
//
// Rows of odd V are not 16-byte aligned: each row is split into a scalar head (up to the first
// 16-byte boundary), a vector body and a scalar tail. exp is ex2.approx of (x − m)·log2(e), a few
// fp32 ulps from exp, far below the bf16 output's rounding.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "lowbit/formats.h"
#include "ops/cross_entropy_impl.h"
#include "ops/ops_cuda.cuh"

namespace lowbit::ops_detail {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// exp(x − m) for x ≤ m; 0 for x = −inf (even when m = −inf, where x − m is NaN).
__device__ __forceinline__ float exp_shift(float x, float m) {
  return x == -INFINITY ? 0.0f : ex2((x - m) * kLog2e);
}

// s · exp(m_old − m_new); an empty sum (s = 0, m_old = −inf) stays 0, a NaN sum stays NaN.
__device__ __forceinline__ float rescale(float s, float m_old, float m_new) {
  return s == 0.0f ? 0.0f : s * ex2((m_old - m_new) * kLog2e);
}

struct MaxSum {
  float m;  // running max (fmaxf: NaN ignored; −inf while empty)
  float s;  // Σ exp(x − m) of the values seen
};

// Commutative (fmaxf and fp32 addition are), so both lanes of a butterfly get the same bits.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, rescale(a.s, a.m, m) + rescale(b.s, b.m, m)};
}

__device__ __forceinline__ void absorb1(MaxSum& st, float x) {
  const float m = fmaxf(st.m, x);
  st.s = rescale(st.s, st.m, m) + exp_shift(x, m);
  st.m = m;
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

__device__ __forceinline__ void unpack8(const uint4& u, float v[8]) {
  v[0] = bf16_lo(u.x), v[1] = bf16_hi(u.x), v[2] = bf16_lo(u.y), v[3] = bf16_hi(u.y);
  v[4] = bf16_lo(u.z), v[5] = bf16_hi(u.z), v[6] = bf16_lo(u.w), v[7] = bf16_hi(u.w);
}

// The largest of the 8 bf16 of a vector, NaN ignored as by fmaxf: three max.bf16x2 (exact: the
// max of bf16 values is one of them) and one fmaxf, where eight fmaxf would load the integer
// pipe that pass 1 is short of (the unpacking shares it).
__device__ __forceinline__ float max8(const uint4& u) {
  uint32_t a, b, c;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(a) : "r"(u.x), "r"(u.y));
  asm("max.bf16x2 %0, %1, %2;" : "=r"(b) : "r"(u.z), "r"(u.w));
  asm("max.bf16x2 %0, %1, %2;" : "=r"(c) : "r"(a), "r"(b));
  return fmaxf(bf16_lo(c), bf16_hi(c));
}

__device__ __forceinline__ void absorb8(MaxSum& st, const uint4& u) {
  float v[8];
  unpack8(u, v);
  const float m = fmaxf(st.m, max8(u));
  float s = st.s;
  if (m != st.m) s = rescale(s, st.m, m);  // the running max rarely moves after a few vectors
  if (m == -INFINITY) {
    // Everything so far is −inf or NaN: exp_shift's guard keeps −inf − (−inf) out of the sum.
#pragma unroll
    for (int i = 0; i < 8; ++i) s += exp_shift(v[i], m);
  } else {
    // m > −inf: x = −inf gives ex2(−inf) = 0 without the guard (and x = NaN a NaN, as with it).
#pragma unroll
    for (int i = 0; i < 8; ++i) s += ex2((v[i] - m) * kLog2e);
  }
  st = {m, s};
}

// Pass 1 over the row's body vectors xv[k0 .. k1) (THREADS threads, UNROLL 16-byte loads in
// flight per thread): absorbed into st, and those below cache_end kept at cache[k − k0].
template <int THREADS, int UNROLL>
__device__ __forceinline__ void absorb_vectors(MaxSum& st, const uint4* xv, int k0, int k1,
                                               uint4* cache, int cache_end) {
  for (int kb = k0 + static_cast<int>(threadIdx.x); kb < k1; kb += UNROLL * THREADS) {
    uint4 r[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int k = kb + u * THREADS;
      if (k < k1) r[u] = xv[k];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int k = kb + u * THREADS;
      if (k < k1) {
        if (k < cache_end) cache[k - k0] = r[u];
        absorb8(st, r[u]);
      }
    }
  }
}

// Elements before the first 16-byte boundary of a bf16 row starting at p (at most 7, at most v).
__device__ __forceinline__ int head_elems(const uint16_t* p, int64_t v) {
  const int h = static_cast<int>(((16u - (reinterpret_cast<uintptr_t>(p) & 15u)) & 15u) >> 1);
  return static_cast<int>(h < v ? h : v);
}

// The block's pairs merged in a fixed tree (butterfly within each warp, then warp 0 over the
// warps); the result is valid in warp 0 (every lane). Ends with warp 0 past a __syncthreads.
template <int kWarps>
__device__ __forceinline__ MaxSum block_merge(MaxSum st, float* red_m, float* red_s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xFFFFFFFFu, st.m, o),
                       __shfl_xor_sync(0xFFFFFFFFu, st.s, o)};
    st = merge(st, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red_m[warp] = st.m, red_s[warp] = st.s;
  __syncthreads();
  if (warp == 0) {
    st = lane < kWarps ? MaxSum{red_m[lane], red_s[lane]} : MaxSum{-INFINITY, 0.0f};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const MaxSum other{__shfl_xor_sync(0xFFFFFFFFu, st.m, o),
                         __shfl_xor_sync(0xFFFFFFFFu, st.s, o)};
      st = merge(st, other);
    }
  }
  return st;
}

// dx for the 8 logits of one 16-byte vector: grad_scale · (exp(x − m)·inv_s − [lane = hit]),
// hit = −1 for every vector but the target's. The per-lane test runs only in that one vector,
// and the rounding is cvt.rn.bf16x2 (f32_to_bf16_rn's rounding; a NaN becomes the canonical
// bf16 NaN rather than keeping its payload): the integer pipe is what pass 2 is short of.
__device__ __forceinline__ uint4 grad8(const uint4& u, float m, float inv_s, int hit,
                                       float grad_scale) {
  float v[8];
  unpack8(u, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = ex2((v[i] - m) * kLog2e) * inv_s;
  if (hit >= 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] -= i == hit ? 1.0f : 0.0f;
  }
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;"
        : "=r"(o[i])
        : "f"(v[2 * i + 1] * grad_scale), "f"(v[2 * i] * grad_scale));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// losses [n] f32, dlogits [n, V] bf16 or null (may alias logits), logits [n, V] bf16, targets
// [n] i32. Grid: one block of THREADS per row; dynamic shared memory: cache_vecs 16-byte vectors
// (0 without dlogits). UNROLL 16-byte loads are in flight per thread.
template <int THREADS, int MIN_BLOCKS, int UNROLL>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
    cross_entropy_kernel(float* __restrict__ losses, uint16_t* dlogits, const uint16_t* logits,
                         const int32_t* __restrict__ targets, int V, int ignore_index,
                         float grad_scale, int cache_vecs) {
  pdl::grid_sync();
  extern __shared__ uint4 cache[];  // [cache_vecs] the row's first body vectors
  constexpr int kWarps = THREADS / 32;
  __shared__ float red_m[kWarps], red_s[kWarps];
  __shared__ float row_m, row_inv_s;
  const int64_t row = blockIdx.x;
  const uint16_t* x = logits + row * V;                  // [V]
  uint16_t* dx = dlogits ? dlogits + row * V : nullptr;  // [V]
  const int tid = threadIdx.x;
  const int32_t t = targets[row];

  if (t == ignore_index || t < 0 || t >= V) {
    // Ignored row: loss 0, zero gradient. Bad target: NaN loss and gradient.
    const bool bad = t != ignore_index;
    if (tid == 0) losses[row] = bad ? __int_as_float(0x7FC00000) : 0.0f;
    if (!dx) return;
    const uint16_t fill = bad ? 0x7FC0u : 0u;
    const int h = head_elems(dx, V);
    const int nvec = (V - h) / 8;
    if (tid < h) dx[tid] = fill;
    for (int j = h + nvec * 8 + tid; j < V; j += THREADS) dx[j] = fill;
    const uint32_t w = fill | (uint32_t(fill) << 16);
    uint4* dv = reinterpret_cast<uint4*>(dx + h);
    for (int k = tid; k < nvec; k += THREADS) dv[k] = make_uint4(w, w, w, w);
    return;
  }

  // ---- pass 1: online max / sum over the row --------------------------------------------------
  const float xt = tid == 0 ? bf16_to_f32(x[t]) : 0.0f;  // read before pass 2 may overwrite it
  const int h = head_elems(x, V);
  const int nvec = (V - h) / 8;
  const int tail0 = h + nvec * 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x + h);  // [nvec] the row's body
  MaxSum st{-INFINITY, 0.0f};
  if (tid < h) absorb1(st, bf16_to_f32(x[tid]));
  if (tail0 + tid < V) absorb1(st, bf16_to_f32(x[tail0 + tid]));  // the tail: fewer than 8
  absorb_vectors<THREADS, UNROLL>(st, xv, 0, nvec, cache, cache_vecs);
  st = block_merge<kWarps>(st, red_m, red_s);
  if (tid == 0) {
    // loss = (m − x_t) + log s: no cancellation between a large logsumexp and x_t.
    losses[row] = __fadd_rn(__fsub_rn(st.m, xt), logf(st.s));
    row_m = st.m;
    row_inv_s = __frcp_rn(st.s);
  }
  if (!dx) return;
  __syncthreads();

  // ---- pass 2: dx = grad_scale · (exp(x − m) / s − [j = t]) ------------------------------------
  // exp(x − m) without the −inf guard of pass 1: it only matters when m = ±inf, where inv_s is
  // inf or NaN and the whole row is NaN either way.
  const float m = row_m, inv_s = row_inv_s;
  auto grad1 = [&](float xj, int j) {
    float p = ex2((xj - m) * kLog2e) * inv_s;
    if (j == t) p -= 1.0f;
    return f32_to_bf16_rn(p * grad_scale);
  };
  if (((reinterpret_cast<uintptr_t>(dx) ^ reinterpret_cast<uintptr_t>(x)) & 15u) == 0) {
    // dx has x's alignment (always so in place): vectors of dx and x coincide. Each element is
    // read and written by the same thread, so writing in place is safe.
    if (tid < h) dx[tid] = grad1(bf16_to_f32(x[tid]), tid);
    if (tail0 + tid < V) dx[tail0 + tid] = grad1(bf16_to_f32(x[tail0 + tid]), tail0 + tid);
    uint4* dv = reinterpret_cast<uint4*>(dx + h);          // [nvec]
    const int t_vec = (t - h) >> 3, t_lane = (t - h) & 7;  // the target's vector and lane
    for (int k0 = tid; k0 < nvec; k0 += UNROLL * THREADS) {
      uint4 r[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int k = k0 + u * THREADS;
        if (k < nvec) r[u] = k < cache_vecs ? cache[k] : xv[k];
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int k = k0 + u * THREADS;
        if (k < nvec) dv[k] = grad8(r[u], m, inv_s, k == t_vec && t >= h ? t_lane : -1, grad_scale);
      }
    }
  } else {
    // A separate dlogits buffer with another alignment: element by element.
    for (int j = tid; j < V; j += THREADS) dx[j] = grad1(bf16_to_f32(x[j]), j);
  }
}

// Fills dx[j] for j in [j0, j1) and the row's 16-byte vectors [k0, k1) (body starting at element
// h) with `fill`, THREADS threads.
template <int THREADS>
__device__ __forceinline__ void fill_row_part(uint16_t* dx, int h, int j0, int j1, int k0, int k1,
                                              uint16_t fill) {
  const int tid = threadIdx.x;
  for (int j = j0 + tid; j < j1; j += THREADS) dx[j] = fill;
  const uint32_t w = fill | (uint32_t(fill) << 16);
  uint4* dv = reinterpret_cast<uint4*>(dx + h);
  for (int k = k0 + tid; k < k1; k += THREADS) dv[k] = make_uint4(w, w, w, w);
}

// One row per cluster of C blocks (C = the launch's cluster size), for rows longer than a block's
// shared memory. dlogits [n, V] bf16 (may alias logits; 16-byte aligned like logits), the rest as
// in cross_entropy_kernel. Block r of a row's cluster owns the row's body vectors [r·per,
// min((r + 1)·per, nvec)) and keeps them in shared memory (dynamic: per 16-byte vectors) from
// pass 1 to pass 2; block 0 also takes the scalar head and tail. After pass 1 each block
// publishes its (m, s); every block merges the C pairs in rank order (the same bits in all of
// them), so no block depends on another's gradient pass. Grid: n·C blocks.
template <int THREADS, int MIN_BLOCKS, int UNROLL>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
    cross_entropy_cluster_kernel(float* __restrict__ losses, uint16_t* dlogits,
                                 const uint16_t* logits, const int32_t* __restrict__ targets, int V,
                                 int ignore_index, float grad_scale, int per) {
  pdl::grid_sync();
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  extern __shared__ uint4 cache[];  // [per] this block's slice of the row's body
  constexpr int kWarps = THREADS / 32;
  __shared__ float red_m[kWarps], red_s[kWarps];
  __shared__ float part[2];  // this block's (m, s), read by the cluster
  __shared__ float row_m, row_inv_s;
  const int64_t row = blockIdx.x / C;
  const uint16_t* x = logits + row * V;  // [V]
  uint16_t* dx = dlogits + row * V;      // [V]
  const int tid = threadIdx.x;
  const int32_t t = targets[row];
  const int h = head_elems(x, V);
  const int nvec = (V - h) / 8;
  const int tail0 = h + nvec * 8;
  const int v0 = min(nvec, rank * per), v1 = min(nvec, v0 + per);

  if (t == ignore_index || t < 0 || t >= V) {
    // Ignored row: loss 0, zero gradient. Bad target: NaN loss and gradient.
    const bool bad = t != ignore_index;
    if (rank == 0 && tid == 0) losses[row] = bad ? __int_as_float(0x7FC00000) : 0.0f;
    const uint16_t fill = bad ? 0x7FC0u : 0u;
    if (rank == 0) {
      fill_row_part<THREADS>(dx, h, 0, h, 0, 0, fill);
      fill_row_part<THREADS>(dx, h, tail0, V, 0, 0, fill);
    }
    fill_row_part<THREADS>(dx, h, 0, 0, v0, v1, fill);
    return;
  }

  // ---- pass 1: this block's slice, kept in shared memory ---------------------------------------
  // x_t is read before the cluster barrier, hence before any block of the row writes dx.
  const float xt = rank == 0 && tid == 0 ? bf16_to_f32(x[t]) : 0.0f;
  const uint4* xv = reinterpret_cast<const uint4*>(x + h);  // [nvec] the row's body
  MaxSum st{-INFINITY, 0.0f};
  if (rank == 0) {
    if (tid < h) absorb1(st, bf16_to_f32(x[tid]));
    if (tail0 + tid < V) absorb1(st, bf16_to_f32(x[tail0 + tid]));
  }
  absorb_vectors<THREADS, UNROLL>(st, xv, v0, v1, cache, v1);
  st = block_merge<kWarps>(st, red_m, red_s);
  if (tid == 0) part[0] = st.m, part[1] = st.s;
  cluster.sync();  // every block's pair is published
  if (tid == 0) {
    MaxSum tot{-INFINITY, 0.0f};
    for (int q = 0; q < C; ++q) {
      const float* pq = cluster.map_shared_rank(part, q);
      tot = merge(tot, MaxSum{pq[0], pq[1]});
    }
    if (rank == 0) losses[row] = __fadd_rn(__fsub_rn(tot.m, xt), logf(tot.s));
    row_m = tot.m;
    row_inv_s = __frcp_rn(tot.s);
  }
  // This block is done reading the others' shared memory (the matching wait is at the end: a
  // block's shared memory must outlive the reads of its pair).
  __syncwarp();
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  __syncthreads();

  // ---- pass 2: dx = grad_scale · (exp(x − m) / s − [j = t]) from the slice ----------------------
  const float m = row_m, inv_s = row_inv_s;
  if (rank == 0) {
    auto grad1 = [&](int j) {
      float p = ex2((bf16_to_f32(x[j]) - m) * kLog2e) * inv_s;
      if (j == t) p -= 1.0f;
      return f32_to_bf16_rn(p * grad_scale);
    };
    // Each head / tail element is read and written by the same thread (safe in place).
    if (tid < h) dx[tid] = grad1(tid);
    if (tail0 + tid < V) dx[tail0 + tid] = grad1(tail0 + tid);
  }
  uint4* dv = reinterpret_cast<uint4*>(dx + h);          // [nvec]
  const int t_vec = (t - h) >> 3, t_lane = (t - h) & 7;  // the target's vector and lane
  for (int k0 = v0 + tid; k0 < v1; k0 += UNROLL * THREADS) {
    uint4 r[UNROLL];  // UNROLL vectors read from shared memory before the first is written
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int k = k0 + u * THREADS;
      if (k < v1) r[u] = cache[k - v0];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int k = k0 + u * THREADS;
      if (k < v1) dv[k] = grad8(r[u], m, inv_s, k == t_vec && t >= h ? t_lane : -1, grad_scale);
    }
  }
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Every compiled (threads, min blocks, unroll) variant, with its kernel.
using CeKernel = void (*)(float*, uint16_t*, const uint16_t*, const int32_t*, int, int, float, int);
struct CeVariant {
  int threads, min_blocks, unroll;
  CeKernel fn;
};
const CeVariant kVariants[] = {
    {128, 8, 4, cross_entropy_kernel<128, 8, 4>},   {256, 4, 8, cross_entropy_kernel<256, 4, 8>},
    {256, 3, 8, cross_entropy_kernel<256, 3, 8>},   {512, 2, 4, cross_entropy_kernel<512, 2, 4>},
    {512, 3, 4, cross_entropy_kernel<512, 3, 4>},   {512, 2, 8, cross_entropy_kernel<512, 2, 8>},
    {1024, 2, 4, cross_entropy_kernel<1024, 2, 4>}, {1024, 1, 8, cross_entropy_kernel<1024, 1, 8>},
};

const CeVariant* find_variant(const CeConfig& c) {
  for (const CeVariant& v : kVariants) {
    if (v.threads == c.threads && v.min_blocks == c.min_blocks && v.unroll == c.unroll) return &v;
  }
  return nullptr;
}

// The cluster kernels, by (threads, unroll).
const CeVariant kClusterVariants[] = {
    {256, 3, 8, cross_entropy_cluster_kernel<256, 3, 8>},
    {512, 2, 4, cross_entropy_cluster_kernel<512, 2, 4>},
};

const CeVariant* find_cluster_variant(const CeConfig& c) {
  for (const CeVariant& v : kClusterVariants) {
    if (v.threads == c.threads && v.min_blocks == c.min_blocks && v.unroll == c.unroll) return &v;
  }
  return nullptr;
}

// Blocks per row such that a block's slice of a row of V bf16 fits 64 KiB (three blocks per SM),
// at least 2 and at most 8 (the portable cluster size); 0 where one block holds the whole row.
int cluster_blocks_for(int64_t V) {
  const int64_t blocks = (V * 2 + (64 << 10) - 1) / (64 << 10);
  if (blocks <= 1) return 0;
  return static_cast<int>(std::min<int64_t>(blocks, 8));
}

}  // namespace

// Chosen from the sweep of tests/gpu/test_ops_cross_entropy.cpp (CrossEntropyGpu.Perf), fwd +
// bwd in place: on an H100 16384 × 32000 0.804 ms (the next best 0.813 ms, 512 threads with 2
// blocks per SM 0.880 ms), 8192 × 50257 0.670 ms. At V 128256 (256 KiB rows) the share of the
// row kept in shared memory decides. CrossEntropyGpu.Perf (2026-11-22): 512 threads × 3 blocks
// with 64 KiB 1.00 ms, 1024 threads × 1 block with 0 / 64 / 100 KiB 0.995 / 0.927 / 0.901 ms.
// `lowbit bench ops` (bursts back to back, ~10 % slower than that test for the same kernel),
// 2026-11-26: 1024 threads with 224 KiB 0.938 ms (74 % of copy), 512 × 3 with 64 KiB 1.010 ms
// (69 %) in the call an hour before. The cluster
// kernel (4 blocks per row) reads the row once and measured 0.894 ms alone, but 1.13 ms per call
// inside the 1b training step against 1.03 ms for the one-block kernel (H100, 2026-11-22), so it
// is a candidate (cross_entropy_cluster_config), not the default.
CeConfig cross_entropy_default_config(int64_t V) {
  if (V <= 4096) return {128, 8, 4, 32 << 10};
  if (V <= 40000) return {512, 3, 4, 64 << 10};
  if (V <= 65536) return {512, 2, 8, 64 << 10};
  // Longer rows: one block of 1024 threads per SM caching 224 KiB of the row (less where the
  // device's shared memory is smaller), so that pass 2 reads only the last 26.5 KiB of a
  // 128256-token row again (on a 132-SM H100, 132 rows in flight, ~34 MB, keep that in L2).
  return {1024, 1, 8, 224 << 10};
}

CeConfig cross_entropy_cluster_config(int64_t V) {
  return {256, 3, 8, 64 << 10, std::max(2, cluster_blocks_for(V))};
}

std::vector<CeConfig> cross_entropy_candidates() {
  std::vector<CeConfig> out;
  for (const CeVariant& v : kVariants) {
    for (int cache_kb : {0, 64, 100, 160, 224})
      out.push_back({v.threads, v.min_blocks, v.unroll, cache_kb << 10});
  }
  for (const CeVariant& v : kClusterVariants) {
    for (int cluster : {2, 3, 4, 5, 6, 8}) {
      out.push_back({v.threads, v.min_blocks, v.unroll, 0, cluster});
    }
  }
  return out;
}

namespace {

// Body vectors per block of a cluster row (the body has at most V / 8 vectors, fewer when the row
// starts off a 16-byte boundary).
int cluster_slice_vectors(const CeConfig& c, int64_t V) {
  return static_cast<int>((V / 8 + c.cluster - 1) / c.cluster);
}

}  // namespace

bool cross_entropy_runs_on_clusters(const CeConfig& c, const TensorView& logits,
                                    const TensorView* dlogits) {
  if (c.cluster <= 1) return false;
  LOWBIT_CHECK(c.cluster <= 8 && find_cluster_variant(c) != nullptr,
               "cross_entropy: no cluster kernel for {} threads, {} blocks per SM, unroll {}, {} "
               "blocks per row",
               c.threads, c.min_blocks, c.unroll, c.cluster);
  const int64_t n = logits.size(0), V = logits.size(1);
  // Each block's slice within 200 KiB of shared memory, the grid within 2^31 − 1 blocks, and
  // dlogits with the alignment of logits (the same 16-byte vectors).
  return dlogits != nullptr && int64_t(cluster_slice_vectors(c, V)) * 16 <= (200 << 10) &&
         n * c.cluster <= INT32_MAX &&
         ((reinterpret_cast<uintptr_t>(dlogits->ptr<uint16_t>()) ^
           reinterpret_cast<uintptr_t>(logits.ptr<const uint16_t>())) &
          15u) == 0;
}

void cross_entropy_cuda(Context& ctx, const TensorView& losses, const TensorView* dlogits,
                        const TensorView& logits, const TensorView& targets, int ignore_index,
                        float grad_scale, const CeConfig* config) {
  const int64_t n = logits.size(0), V = logits.size(1);
  LOWBIT_CHECK(n <= INT32_MAX && V <= INT32_MAX, "cross_entropy: {} x {} logits exceed the grid", n,
               V);
  const CeConfig asked = config ? *config : cross_entropy_default_config(V);
  const uint16_t* x = logits.ptr<const uint16_t>();
  if (cross_entropy_runs_on_clusters(asked, logits, dlogits)) {
    const CeConfig& c = asked;
    const CeVariant* var = find_cluster_variant(c);
    const int per = cluster_slice_vectors(c, V);
    const size_t smem = static_cast<size_t>(per) * 16;
    ops_cuda::allow_dynamic_smem(var->fn, smem);
    pdl::launch_clustered(var->fn, static_cast<unsigned>(n * c.cluster), c.threads, smem,
                          ctx.stream(), static_cast<unsigned>(c.cluster), losses.ptr<float>(),
                          dlogits->ptr<uint16_t>(), x, targets.ptr<const int32_t>(),
                          static_cast<int>(V), ignore_index, grad_scale, per);
    LOWBIT_CUDA_CHECK_LAUNCH();
    return;
  }
  // The one-block kernel (cluster ≤ 1; or no dlogits, dlogits aligned otherwise, rows too long:
  // then the one-block kernel of the same threads).
  const CeConfig c =
      asked.cluster > 1 ? CeConfig{asked.threads, asked.min_blocks, asked.unroll, 64 << 10} : asked;
  const CeVariant* var = find_variant(c);
  LOWBIT_CHECK(var != nullptr, "cross_entropy: no kernel for {} threads, {} blocks, unroll {}",
               c.threads, c.min_blocks, c.unroll);
  // Without dlogits there is no second pass, so nothing to cache. The body of a row has at most
  // V / 8 vectors (the head, hence the body, depends on the row's alignment).
  // The cache also stays within the device's shared memory per block (227 KiB on sm_90 and
  // sm_100, 99 KiB on sm_120), 1 KiB left for the kernel's static arrays.
  const int smem_optin =
      ops_cuda::cached_device_attr(ctx.device().index, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const int64_t max_cache = std::min<int64_t>(c.max_cache_bytes, smem_optin - 1024);
  const int cache_vecs = dlogits ? static_cast<int>(std::min<int64_t>(V / 8, max_cache / 16)) : 0;
  const size_t smem = static_cast<size_t>(cache_vecs) * 16;
  ops_cuda::allow_dynamic_smem(var->fn, smem);
  pdl::launch(var->fn, static_cast<unsigned>(n), c.threads, smem, ctx.stream(), losses.ptr<float>(),
              dlogits ? dlogits->ptr<uint16_t>() : nullptr, logits.ptr<const uint16_t>(),
              targets.ptr<const int32_t>(), static_cast<int>(V), ignore_index, grad_scale,
              cache_vecs);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail

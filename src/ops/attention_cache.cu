// CUDA attention against a KV cache (decoding): one block per (query, head, batch), simple and
// exact in its fp32 arithmetic rather than fast; a decode step has Tq = 1, so the work is B·H
// rows of keys and values read once (memory bound), and prefills of a whole prompt go to the
// flash kernel instead (attention_cache.cpp).
//
// attn_cache_kernel<DH>: block (i, h, b) owns query i of head h, sequence b, at position
// t = t0 + i, and the keys j ∈ [0, t]. Its 4 warps take chunks of 32 keys round-robin (warp w:
// keys [32c, 32c + 32) for c = w, w + 4, ...). In a chunk, lane l scores key 32c + l
// (s = scale · q·k, the whole dot in one thread: q from shared memory, k by 16-byte loads), the
// warp takes the chunk max (shuffles), rescales its running state (online softmax)
//   m' = max(m, max_chunk s),  l' = l·e^(m − m') + Σ e^(s − m'),  acc' = acc·e^(m − m') + Σ p·v
// and then walks the chunk's keys one by one, each p broadcast by a shuffle, lane l adding
// p·v[j][l·E .. l·E + E) (E = DH / 32 dims per lane: a warp reads each v row contiguously).
// At the end the warps' (m, l, acc) are merged through shared memory, out = acc / l.
// Positions past t are never read, whatever the cache holds there.
//
// kv_cache_write_kernel: a grid-stride copy of 8-element (16-byte) pieces of rows.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lowbit/core/cuda_check.h"
#include "ops/attention_cache_impl.h"
#include "ops/ops_cuda.cuh"

namespace lowbit::attn {

using namespace ops_cuda;

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;

struct Strides {
  int64_t b, t, h;  // elements
};

struct CacheParams {
  const uint16_t* q;  // [B, Tq, H, Dh]
  const uint16_t* k;  // [B, Tmax, Hkv, Dh]
  const uint16_t* v;  // [B, Tmax, Hkv, Dh]
  uint16_t* out;      // [B, Tq, H, Dh]
  Strides qs, ks, vs, os;
  int64_t t0;
  int group;  // H / Hkv
  float scale;
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

template <int DH>
__global__ void __launch_bounds__(kThreads) attn_cache_kernel(CacheParams p) {
  constexpr int E = DH / kWarp;               // dims of the output per lane
  __shared__ float q_s[DH];                   // the query, fp32
  __shared__ float m_s[kWarps], l_s[kWarps];  // per-warp running max and sum
  __shared__ float acc_s[kWarps][DH];         // per-warp unnormalised output
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int hk = h / p.group;
  const int64_t nkeys = p.t0 + i + 1;  // keys 0 .. t0 + i

  const uint16_t* qp = p.q + b * p.qs.b + i * p.qs.t + h * p.qs.h;
  for (int d = threadIdx.x; d < DH; d += kThreads) q_s[d] = bf16_to_f32(qp[d]);
  __syncthreads();

  const uint16_t* kb = p.k + b * p.ks.b + hk * p.ks.h;  // key j: kb + j·ks.t
  const uint16_t* vb = p.v + b * p.vs.b + hk * p.vs.h;  // value j: vb + j·vs.t
  float m = -INFINITY, l = 0.0f;
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.0f;

  // c0 is uniform across the warp, so every lane runs the same iterations (full-mask shuffles).
  for (int64_t c0 = int64_t(warp) * kWarp; c0 < nkeys; c0 += int64_t(kWarps) * kWarp) {
    const int64_t j = c0 + lane;
    const bool valid = j < nkeys;
    float s = -INFINITY;
    if (valid) {
      const uint16_t* kp = kb + j * p.ks.t;
      float dot = 0.0f;
#pragma unroll
      for (int d = 0; d < DH; d += 8) {
        float kv[8];
        load8(kp + d, kv);
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += q_s[d + e] * kv[e];
      }
      s = p.scale * dot;
    }
    // Key c0 < nkeys is valid, so the chunk max is finite (for finite inputs).
    const float m_new = fmaxf(m, warp_max(s));
    const float corr = expf(m - m_new);  // 0 on the first chunk (m = −inf)
    const float pr = valid ? expf(s - m_new) : 0.0f;
    l = l * corr + warp_sum(pr);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= corr;
    const int n = static_cast<int>(nkeys - c0 < kWarp ? nkeys - c0 : kWarp);  // warp-uniform
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xFFFFFFFFu, pr, jj);
      const uint16_t* vp = vb + (c0 + jj) * p.vs.t + lane * E;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += pj * bf16_to_f32(vp[e]);
    }
    m = m_new;
  }

  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) acc_s[warp][lane * E + e] = acc[e];
  __syncthreads();
  // Merge: a warp that saw no key has m = −inf, l = 0, acc = 0 and weight e^(−inf) = 0; warp 0
  // always saw key 0, so M is finite.
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w]);
  uint16_t* op = p.out + b * p.os.b + i * p.os.t + h * p.os.h;
  for (int d = threadIdx.x; d < DH; d += kThreads) {
    float L = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = expf(m_s[w] - M);
      L += l_s[w] * f;
      o += acc_s[w][d] * f;
    }
    op[d] = f32_to_bf16_rn(o / L);
  }
}

// cache rows [t0, t0 + Tq) = src, 8 elements per thread and iteration.
__global__ void kv_cache_write_kernel(uint16_t* cache, const uint16_t* src, Strides cs, Strides ss,
                                      int64_t tq, int64_t hkv, int64_t dh, int64_t t0,
                                      int64_t total) {
  const int64_t chunks = dh / 8;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = (idx % chunks) * 8;
    const int64_t row = idx / chunks;  // (b·Tq + i)·Hkv + h
    const int64_t h = row % hkv, bi = row / hkv, i = bi % tq, b = bi / tq;
    const uint4 u = *reinterpret_cast<const uint4*>(src + b * ss.b + i * ss.t + h * ss.h + d);
    *reinterpret_cast<uint4*>(cache + b * cs.b + (t0 + i) * cs.t + h * cs.h + d) = u;
  }
}

Strides strides_of(const TensorView& t) { return {t.strides[0], t.strides[1], t.strides[2]}; }

}  // namespace

void kv_cache_write_cuda(Context& ctx, const TensorView& cache, const TensorView& src, int64_t t0) {
  const int64_t B = src.size(0), Tq = src.size(1), Hkv = src.size(2), Dh = src.size(3);
  const int64_t total = B * Tq * Hkv * (Dh / 8);
  const int64_t blocks = std::min<int64_t>(ceil_div(total, 256), 65535);
  kv_cache_write_kernel<<<static_cast<unsigned>(blocks), 256, 0, ctx.stream()>>>(
      cache.ptr<uint16_t>(), src.ptr<const uint16_t>(), strides_of(cache), strides_of(src), Tq, Hkv,
      Dh, t0, total);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void attention_cache_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& q,
                              const TensorView& k_cache, const TensorView& v_cache, int64_t t0,
                              float scale) {
  const int64_t B = q.size(0), Tq = q.size(1), H = q.size(2), Dh = q.size(3);
  LOWBIT_CHECK(Tq <= 0x7FFFFFFF && H <= 65535 && B <= 65535,
               "attention_cache_fwd: grid ({}, {}, {}) exceeds the launch limits", Tq, H, B);
  CacheParams p{};
  p.q = q.ptr<const uint16_t>();
  p.k = k_cache.ptr<const uint16_t>();
  p.v = v_cache.ptr<const uint16_t>();
  p.out = out.ptr<uint16_t>();
  p.qs = strides_of(q), p.ks = strides_of(k_cache), p.vs = strides_of(v_cache);
  p.os = strides_of(out);
  p.t0 = t0;
  p.group = static_cast<int>(H / k_cache.size(2));
  p.scale = scale;
  const dim3 grid(static_cast<unsigned>(Tq), static_cast<unsigned>(H), static_cast<unsigned>(B));
  if (Dh == 64) {
    attn_cache_kernel<64><<<grid, kThreads, 0, ctx.stream()>>>(p);
  } else {
    LOWBIT_CHECK(Dh == 128, "attention_cache_fwd_cuda: Dh = {} (64 or 128)", Dh);
    attn_cache_kernel<128><<<grid, kThreads, 0, ctx.stream()>>>(p);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::attn

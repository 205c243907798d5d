// CUDA adamw_step: one pass over the arena, memory-bound (reads master, grad, m, v: 16 bytes an
// element; writes master, m, v and the bf16 copy: 14 bytes). Blocks are mapped to (segment,
// chunk) through SegmentBlocks (grad_norm_impl.h), passed by value, so a step needs neither a
// device table nor a host synchronisation; grad_scale and skip are read on the device. Each
// element goes through adamw_update (adamw_impl.h), the same code as the CPU twin, with `_rn`
// intrinsics: the results are bit-identical to the twin.
#include <cstdint>
#include <vector>

#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "lowbit/formats.h"
#include "ops/adamw_impl.h"
#include "ops/grad_norm_impl.h"
#include "ops/ops_cuda.cuh"

namespace lowbit::ops_detail {

namespace {

constexpr int kThreads = 256;
constexpr int kIters = 4;  // vectors per thread and chunk, all loaded before any is updated

// Pointers of one step. master, grad, m, v [P] f32; compute [P] bf16 or null.
struct AdamWPtrs {
  float* master;
  const float* grad;
  float* m;
  float* v;
  uint16_t* compute;
  const float* grad_scale;  // [1]
  const int32_t* skip;      // [1]
};

// `compute`: the segment's bf16 copy shifted so that element e goes to compute[e] (or null).
__device__ __forceinline__ void update_one(const AdamWPtrs& a, uint16_t* compute, int64_t e,
                                           float scale, bool decay, const AdamWScalars& s) {
  float p = a.master[e], m = a.m[e], v = a.v[e];
  adamw_update(p, m, v, a.grad[e], scale, decay, s);
  a.master[e] = p;
  a.m[e] = m;
  a.v[e] = v;
  if (compute) compute[e] = f32_to_bf16_rn(p);
}

// UNIT 4: float4 body (every buffer aligned) plus scalar head/tail in chunk 0; UNIT 1: scalar.
template <int UNIT>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const AdamWPtrs a, const SegmentBlocks tab, const AdamWScalars s) {
  pdl::grid_sync();
  if (*a.skip != 0) return;  // NaN guard
  const float scale = *a.grad_scale;
  const int32_t b = blockIdx.x;
  const int i = tab.find(b);
  const bool decay = tab.weight_decay[i] != 0;
  uint16_t* const compute =
      a.compute != nullptr && tab.has_compute[i] ? a.compute + tab.compute_delta[i] : nullptr;
  const int64_t c = b - tab.first_block[i];
  const int64_t vb = tab.vbegin[i], ve = tab.vend[i];
  const int64_t first = vb + c * kThreads * kIters * UNIT;
  if constexpr (UNIT == 4) {
    float4 p[kIters], g[kIters], m[kIters], v[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t e = first + (int64_t(it) * kThreads + threadIdx.x) * 4;
      if (e < ve) {
        p[it] = *reinterpret_cast<const float4*>(a.master + e);
        g[it] = __ldg(reinterpret_cast<const float4*>(a.grad + e));
        m[it] = *reinterpret_cast<const float4*>(a.m + e);
        v[it] = *reinterpret_cast<const float4*>(a.v + e);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t e = first + (int64_t(it) * kThreads + threadIdx.x) * 4;
      if (e < ve) {
        adamw_update(p[it].x, m[it].x, v[it].x, g[it].x, scale, decay, s);
        adamw_update(p[it].y, m[it].y, v[it].y, g[it].y, scale, decay, s);
        adamw_update(p[it].z, m[it].z, v[it].z, g[it].z, scale, decay, s);
        adamw_update(p[it].w, m[it].w, v[it].w, g[it].w, scale, decay, s);
        *reinterpret_cast<float4*>(a.master + e) = p[it];
        *reinterpret_cast<float4*>(a.m + e) = m[it];
        *reinterpret_cast<float4*>(a.v + e) = v[it];
        if (compute) {
          // Four bf16 values in one 8-byte store.
          const uint2 w = make_uint2(ops_cuda::pack_bf16x2(p[it].x, p[it].y),
                                     ops_cuda::pack_bf16x2(p[it].z, p[it].w));
          *reinterpret_cast<uint2*>(compute + e) = w;
        }
      }
    }
    if (c == 0) {  // head [begin, vbegin) and tail [vend, end), fewer than 4 elements each
      const int t = threadIdx.x;
      if (t < 4 && tab.begin[i] + t < vb) update_one(a, compute, tab.begin[i] + t, scale, decay, s);
      if (t >= 4 && t < 8 && ve + (t - 4) < tab.end[i])
        update_one(a, compute, ve + (t - 4), scale, decay, s);
    }
  } else {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t e = first + int64_t(it) * kThreads + threadIdx.x;
      if (e < ve) update_one(a, compute, e, scale, decay, s);
    }
  }
}

}  // namespace

void adamw_step_cuda(Context& ctx, const TensorView& master, const TensorView& grad,
                     const TensorView& m, const TensorView& v, const TensorView* compute,
                     const std::vector<ParamSegment>& segments, const AdamWScalars& s,
                     const TensorView& grad_scale, const TensorView& skip) {
  using ops_cuda::aligned16;
  AdamWPtrs a{master.ptr<float>(),
              grad.ptr<const float>(),
              m.ptr<float>(),
              v.ptr<float>(),
              compute ? compute->ptr<uint16_t>() : nullptr,
              grad_scale.ptr<const float>(),
              skip.ptr<const int32_t>()};
  // Element e is 16-byte aligned in every buffer (8-byte in the bf16 copy) iff e % 4 == 0, the
  // buffers start aligned and every segment's copy is shifted by a multiple of 4 elements.
  bool vec = aligned16(a.master) && aligned16(a.grad) && aligned16(a.m) && aligned16(a.v) &&
             (reinterpret_cast<uintptr_t>(a.compute) & 7u) == 0;
  for (const ParamSegment& seg : segments) {
    if (compute && seg.has_compute() && (seg.compute_begin() - seg.offset) % 4 != 0) vec = false;
  }
  const std::vector<SegmentBlocks> plan =
      vec ? plan_segment_blocks(segments, 4, int64_t(kThreads) * kIters * 4, false)
          : plan_segment_blocks(segments, 1, int64_t(kThreads) * kIters, false);
  for (const SegmentBlocks& t : plan) {
    if (t.blocks() == 0) continue;
    if (vec) {
      pdl::launch(adamw_kernel<4>, t.blocks(), kThreads, 0, ctx.stream(), a, t, s);
    } else {
      pdl::launch(adamw_kernel<1>, t.blocks(), kThreads, 0, ctx.stream(), a, t, s);
    }
    LOWBIT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace lowbit::ops_detail

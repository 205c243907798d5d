// Private to the ops layer: the two implementations behind segment_norms / clip_coefficient
// (include/lowbit/ops.h), and the segment → thread-block table that the arena kernels
// (segment_norms, adamw_step) launch with. Arguments have been validated by the dispatchers
// (grad_norm.cpp, adamw.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/core/hd.h"
#include "lowbit/ops.h"

namespace lowbit::ops_detail {

// ---- CPU twin (grad_norm_ref.cpp) ----------------------------------------------------------
// seg_norms [S] f32: per segment RN(sqrt(Σ double(g)²)), the sum in index order.
void segment_norms_cpu(const TensorView& seg_norms, const TensorView& grad,
                       const std::vector<ParamSegment>& segments);
// norm [1] f32 = RN(sqrt(Σ_s double(seg_norms[s])²)) (exact squares, sum in fp64, index order);
// skip [1] i32 = norm is not finite;
// coef [1] f32 = 1 when max_norm ≤ 0, else 0 when skip, else min(1, max_norm / (norm + 1e-6))
// with the addition and the division each one fp32 RN operation.
void clip_coefficient_cpu(const TensorView& norm, const TensorView& coef, const TensorView& skip,
                          const TensorView& seg_norms, float max_norm);

// The fp32 tail of clip_coefficient, shared by both twins so they agree bit for bit once the
// norm is known.
LOWBIT_HD float clip_coef_of(float norm, float max_norm, bool skip) {
  if (!(max_norm > 0.0f)) return 1.0f;
  if (skip) return 0.0f;
#if defined(__CUDA_ARCH__)
  const float c = __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f));
#else
  const float c = max_norm / (norm + 1e-6f);
#endif
  return c < 1.0f ? c : 1.0f;
}

// ---- CUDA (grad_norm.cu) ------------------------------------------------------------------
// Deterministic: pass 1 writes one fp64 partial per (segment, chunk) block into ctx.workspace,
// pass 2 adds each segment's partials in block order. Sums are fp64 on the device too, so the
// GPU and the CPU differ only when fp64 rounding in another order flips the fp32 result.
void segment_norms_cuda(Context& ctx, const TensorView& seg_norms, const TensorView& grad,
                        const std::vector<ParamSegment>& segments);
// One block: the squares of seg_norms summed in fp64 (fixed tree order), then the fp32 tail above.
void clip_coefficient_cuda(Context& ctx, const TensorView& norm, const TensorView& coef,
                           const TensorView& skip, const TensorView& seg_norms, float max_norm);

// ---- segment → block table of the arena kernels --------------------------------------------
// A kernel launch over up to kMax segments, passed by value as a kernel parameter (no device
// table to upload, no host synchronisation). Segment i of the launch owns the grid's blocks
// [first_block[i], first_block[i + 1]); block c of them handles chunk c of the segment's
// vector body [vbegin, vend) (element indices into the arena, multiples of `unit`), and its
// chunk 0 also the scalar head [begin, vbegin) and tail [vend, end) of fewer than `unit`
// elements each.
struct SegmentBlocks {
  static constexpr int kMax = 48;
  int count = 0;
  int32_t index[kMax];  // the segment's position in the caller's list
  int64_t begin[kMax], end[kMax], vbegin[kMax], vend[kMax];
  int32_t first_block[kMax + 1];
  uint8_t weight_decay[kMax];
  // adamw_step's bf16 copy: element e of the segment goes to compute[e + compute_delta[i]];
  // has_compute[i] = 0 when the segment has none.
  int64_t compute_delta[kMax];
  uint8_t has_compute[kMax];

  // The launch-local segment of block b: the last i with first_block[i] <= b (segments that own
  // no block are skipped over).
  LOWBIT_HD int find(int32_t b) const {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (first_block[mid] <= b) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  int32_t blocks() const { return first_block[count]; }
};

// UserError unless every segment lies inside [0, p) of `buffer` and no two non-empty segments
// overlap.
void check_segments(const char* op, const std::vector<ParamSegment>& segments, int64_t p,
                    const char* buffer);

// Splits `segments` into launches. `unit` = elements per vector access (1 when the buffers are
// not aligned for vectors); `chunk` = elements per block (a multiple of unit). Segments of no
// elements get no block unless `keep_empty` (segment_norms writes 0 for them in pass 2).
std::vector<SegmentBlocks> plan_segment_blocks(const std::vector<ParamSegment>& segments,
                                               int64_t unit, int64_t chunk, bool keep_empty);

}  // namespace lowbit::ops_detail

// segment_norms / clip_coefficient: argument checks and dispatch by device; the segment → block
// planner shared by the arena kernels (grad_norm.cu, adamw.cu).
#include <algorithm>
#include <cmath>

#include "lowbit/ops.h"
#include "ops/grad_norm_impl.h"
#include "ops/ops_check.h"

namespace lowbit {

using namespace ops_detail;

namespace ops_detail {

std::vector<SegmentBlocks> plan_segment_blocks(const std::vector<ParamSegment>& segments,
                                               int64_t unit, int64_t chunk, bool keep_empty) {
  std::vector<SegmentBlocks> launches;
  SegmentBlocks cur;
  cur.first_block[0] = 0;
  auto flush = [&] {
    if (cur.count > 0) launches.push_back(cur);
    cur = SegmentBlocks();
    cur.first_block[0] = 0;
  };
  for (size_t s = 0; s < segments.size(); ++s) {
    const ParamSegment& seg = segments[s];
    if (seg.numel == 0 && !keep_empty) continue;
    const int64_t begin = seg.offset, end = seg.offset + seg.numel;
    // Vector body: whole `unit`-aligned groups of elements inside [begin, end).
    int64_t vbegin = std::min(end, (begin + unit - 1) / unit * unit);
    int64_t vend = std::max(vbegin, end / unit * unit);
    const int64_t body_blocks = (vend - vbegin + chunk - 1) / chunk;
    const int64_t nblocks = seg.numel == 0 ? 0 : std::max<int64_t>(1, body_blocks);
    LOWBIT_CHECK(nblocks < (int64_t(1) << 30), "segment {} of {} elements needs {} blocks", s,
                 seg.numel, nblocks);
    if (cur.count == SegmentBlocks::kMax ||
        int64_t(cur.first_block[cur.count]) + nblocks >= (int64_t(1) << 31) - 1) {
      flush();
    }
    const int i = cur.count++;
    cur.index[i] = static_cast<int32_t>(s);
    cur.begin[i] = begin;
    cur.end[i] = end;
    cur.vbegin[i] = vbegin;
    cur.vend[i] = vend;
    cur.weight_decay[i] = seg.weight_decay ? 1 : 0;
    cur.has_compute[i] = seg.has_compute() ? 1 : 0;
    cur.compute_delta[i] = seg.has_compute() ? seg.compute_begin() - seg.offset : 0;
    cur.first_block[i + 1] = cur.first_block[i] + static_cast<int32_t>(nblocks);
  }
  flush();
  return launches;
}

// Segments lie inside [0, P) and do not overlap (the arena kernels update each element once).
void check_segments(const char* op, const std::vector<ParamSegment>& segments, int64_t p,
                    const char* buffer) {
  std::vector<size_t> order(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const ParamSegment& s = segments[i];
    LOWBIT_USER_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset <= p && s.numel <= p - s.offset,
                      "{}: segment {} (offset {}, numel {}) does not lie inside {} of {} elements",
                      op, i, s.offset, s.numel, buffer, p);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return segments[a].offset < segments[b].offset; });
  // Each non-empty segment must start at or after the end of the previous non-empty one.
  size_t prev = segments.size();
  for (size_t k : order) {
    const ParamSegment& b = segments[k];
    if (b.numel == 0) continue;
    if (prev != segments.size()) {
      const ParamSegment& a = segments[prev];
      LOWBIT_USER_CHECK(a.offset + a.numel <= b.offset,
                        "{}: segments {} (offset {}, numel {}) and {} (offset {}, numel {}) "
                        "overlap; every element of {} may belong to one segment only",
                        op, prev, a.offset, a.numel, k, b.offset, b.numel, buffer);
    }
    prev = k;
  }
}

}  // namespace ops_detail

namespace {

void check_scalar(const char* op, const char* name, const TensorView& t, DType dt) {
  check_dtype(op, name, t, dt);
  LOWBIT_USER_CHECK(t.numel() == 1 && t.is_contiguous(),
                    "{}: {} must hold exactly one element ([1]), got {}", op, name, t.str());
}

}  // namespace

void segment_norms(Context& ctx, const TensorView& seg_norms, const TensorView& grad,
                   const std::vector<ParamSegment>& segments) {
  const char* op = "segment_norms";
  check_devices(op, ctx, {{"seg_norms", &seg_norms}, {"grad", &grad}});
  check_rank(op, "grad", "[P]", grad, 1);
  check_dtype(op, "grad", grad, DType::kF32);
  check_contiguous(op, "grad", grad);
  check_rank(op, "seg_norms", "[S]", seg_norms, 1);
  check_dtype(op, "seg_norms", seg_norms, DType::kF32);
  check_contiguous(op, "seg_norms", seg_norms);
  LOWBIT_USER_CHECK(seg_norms.size(0) == static_cast<int64_t>(segments.size()),
                    "{}: seg_norms [S] has {} entries but {} segments were given", op,
                    seg_norms.size(0), segments.size());
  check_segments(op, segments, grad.size(0), "grad");
  if (segments.empty()) return;
  if (ctx.on_gpu()) {
    segment_norms_cuda(ctx, seg_norms, grad, segments);
  } else {
    segment_norms_cpu(seg_norms, grad, segments);
  }
}

void clip_coefficient(Context& ctx, const TensorView& norm, const TensorView& coef,
                      const TensorView& skip, const TensorView& seg_norms, float max_norm) {
  const char* op = "clip_coefficient";
  check_devices(op, ctx,
                {{"norm", &norm}, {"coef", &coef}, {"skip", &skip}, {"seg_norms", &seg_norms}});
  check_scalar(op, "norm", norm, DType::kF32);
  check_scalar(op, "coef", coef, DType::kF32);
  check_scalar(op, "skip", skip, DType::kI32);
  check_rank(op, "seg_norms", "[S]", seg_norms, 1);
  check_dtype(op, "seg_norms", seg_norms, DType::kF32);
  check_contiguous(op, "seg_norms", seg_norms);
  LOWBIT_USER_CHECK(!std::isnan(max_norm),
                    "{}: max_norm is NaN; pass a positive norm, or 0 to disable clipping", op);
  if (ctx.on_gpu()) {
    clip_coefficient_cuda(ctx, norm, coef, skip, seg_norms, max_norm);
  } else {
    clip_coefficient_cpu(norm, coef, skip, seg_norms, max_norm);
  }
}

}  // namespace lowbit

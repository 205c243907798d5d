// adamw_step: argument checks and dispatch by device.
#include <cmath>
#include <cstdint>
#include <utility>

#include "lowbit/ops.h"
#include "ops/adamw_impl.h"
#include "ops/grad_norm_impl.h"
#include "ops/ops_check.h"

namespace lowbit {

using namespace ops_detail;

namespace {

void check_arena(const char* op, const char* name, const TensorView& t, DType dt,
                 const TensorView& master) {
  check_rank(op, name, "[P]", t, 1);
  check_dtype(op, name, t, dt);
  check_contiguous(op, name, t);
  check_same_shape(op, name, t, "master", master);
}

void check_scalar(const char* op, const char* name, const TensorView& t, DType dt) {
  check_dtype(op, name, t, dt);
  LOWBIT_USER_CHECK(t.numel() == 1 && t.is_contiguous(),
                    "{}: {} must hold exactly one element ([1]), got {}", op, name, t.str());
}

// The arena buffers are updated element by element: no two may share storage.
void check_disjoint(const char* op, const char* a_name, const TensorView& a, const char* b_name,
                    const TensorView& b) {
  const auto* a0 = static_cast<const uint8_t*>(a.data);
  const auto* b0 = static_cast<const uint8_t*>(b.data);
  const bool apart = a0 + a.nbytes() <= b0 || b0 + b.nbytes() <= a0;
  LOWBIT_USER_CHECK(apart || a.numel() == 0 || b.numel() == 0,
                    "{}: {} and {} share storage; they must be separate buffers", op, a_name,
                    b_name);
}

void check_config(const char* op, const AdamWConfig& c) {
  LOWBIT_USER_CHECK(std::isfinite(c.lr) && c.lr >= 0.0f,
                    "{}: lr must be finite and non-negative, got {}", op, c.lr);
  LOWBIT_USER_CHECK(c.beta1 >= 0.0f && c.beta1 < 1.0f, "{}: beta1 must be in [0, 1), got {}", op,
                    c.beta1);
  LOWBIT_USER_CHECK(c.beta2 >= 0.0f && c.beta2 < 1.0f, "{}: beta2 must be in [0, 1), got {}", op,
                    c.beta2);
  LOWBIT_USER_CHECK(std::isfinite(c.eps) && c.eps >= 0.0f,
                    "{}: eps must be finite and non-negative, got {}", op, c.eps);
  LOWBIT_USER_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0.0f,
                    "{}: weight_decay must be finite and non-negative, got {}", op, c.weight_decay);
  LOWBIT_USER_CHECK(c.step >= 1,
                    "{}: step must be at least 1 (it counts the updates made, this one "
                    "included), got {}",
                    op, c.step);
}

}  // namespace

void adamw_step(Context& ctx, const TensorView& master, const TensorView& grad, const TensorView& m,
                const TensorView& v, const TensorView* compute,
                const std::vector<ParamSegment>& segments, const AdamWConfig& cfg,
                const TensorView& grad_scale, const TensorView& skip) {
  const char* op = "adamw_step";
  check_devices(op, ctx,
                {{"master", &master},
                 {"grad", &grad},
                 {"m", &m},
                 {"v", &v},
                 {"grad_scale", &grad_scale},
                 {"skip", &skip}});
  if (compute) check_devices(op, ctx, {{"compute", compute}});
  check_arena(op, "master", master, DType::kF32, master);
  check_arena(op, "grad", grad, DType::kF32, master);
  check_arena(op, "m", m, DType::kF32, master);
  check_arena(op, "v", v, DType::kF32, master);
  if (compute) {
    check_rank(op, "compute", "[Pc]", *compute, 1);
    check_dtype(op, "compute", *compute, DType::kBF16);
    check_contiguous(op, "compute", *compute);
  }
  check_scalar(op, "grad_scale", grad_scale, DType::kF32);
  check_scalar(op, "skip", skip, DType::kI32);
  const std::pair<const char*, const TensorView*> bufs[] = {
      {"master", &master}, {"grad", &grad}, {"m", &m}, {"v", &v}, {"compute", compute}};
  for (int i = 0; i < 5; ++i) {
    for (int j = i + 1; j < 5; ++j) {
      if (bufs[i].second && bufs[j].second) {
        check_disjoint(op, bufs[i].first, *bufs[i].second, bufs[j].first, *bufs[j].second);
      }
    }
  }
  check_config(op, cfg);
  check_segments(op, segments, master.size(0), "master");
  if (compute) {
    // The bf16 copies: inside compute and disjoint (each is written by one segment only).
    std::vector<ParamSegment> copies;
    for (const ParamSegment& s : segments) {
      if (!s.has_compute()) continue;
      LOWBIT_USER_CHECK(s.compute_offset >= ParamSegment::kSameOffset,
                        "{}: compute_offset {} is neither an offset nor kSameOffset/kNoCompute", op,
                        s.compute_offset);
      copies.push_back({s.compute_begin(), s.numel, s.weight_decay});
    }
    check_segments(op, copies, compute->size(0), "compute");
  }
  if (master.numel() == 0 || segments.empty()) return;
  const AdamWScalars s = adamw_scalars(cfg);
  if (ctx.on_gpu()) {
    adamw_step_cuda(ctx, master, grad, m, v, compute, segments, s, grad_scale, skip);
  } else {
    adamw_step_cpu(master, grad, m, v, compute, segments, s, grad_scale, skip);
  }
}

}  // namespace lowbit
